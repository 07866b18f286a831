"""DP-S4S scalar core (dpsql.mechanisms.s4s): truncation LP, schedule, zero-noise goldens, utility,
R2T variant, validation."""

from __future__ import annotations

import functools
import math
import time
from fractions import Fraction

import numpy as np
import pytest
from _vectors import load_vectors
from scipy.optimize import linprog

from dpsql.errors import ConfigError
from dpsql.mechanisms.s4s import poisson_sample, truncated_value
from dpsql.mechanisms.s4s import r2t_scalar as _r2t_scalar
from dpsql.mechanisms.s4s import s4s_scalar as _s4s_scalar
from dpsql.testing import seeded_noise, zero_noise

# the numbers pinned here (and the spec's vectors) are the papers' variants: base 2 grids and
# Algorithm 2's ln(3L/beta) bias; the product default (base 5.5, ln(L/beta)) is pinned separately below
s4s_scalar = functools.partial(_s4s_scalar, tau_base=2.0, paper_bias=True)
r2t_scalar = functools.partial(_r2t_scalar, tau_base=2.0)


def load() -> dict:
    return load_vectors("dp_s4s.json")  # type: ignore[no-any-return]


def reference_lp(w, ti, ui, tau) -> float:
    """Independent route: the full LP (no reductions), dense constraint matrix, HiGHS dual simplex."""
    w = np.asarray(w, float)
    if len(ti) == 0:
        return float(w.sum())
    users = np.unique(ui)
    a = np.zeros((users.size, w.size))
    for t, u in zip(ti, ui):
        a[np.searchsorted(users, u), t] = 1.0
    res = linprog(
        -np.ones(w.size),
        A_ub=a,
        b_ub=np.full(users.size, float(tau)),
        bounds=list(zip(np.zeros(w.size), w)),
        method="highs-ds",
    )
    assert res.status == 0
    return float(-res.fun)


def random_instance(g: np.random.Generator, n: int, m: int, share: float = 0.3):
    w = np.round(g.uniform(0, 1, n), 3)
    w[g.uniform(size=n) < 0.2] = 1.0
    ti, ui = [], []
    for t in range(n):
        owners = {int(g.integers(0, m))}
        while g.uniform() < share:
            owners.add(int(g.integers(0, m)))
        for u in owners:
            ti.append(t)
            ui.append(u)
    return w, np.array(ti), np.array(ui)


def remove_user(w, ti, ui, u):
    """I − u: drop user u and every join tuple it contributes to (the neighbouring relation)."""
    gone = np.unique(ti[ui == u])
    keep_t = np.setdiff1d(np.arange(w.size), gone)
    new_id = np.full(w.size, -1)
    new_id[keep_t] = np.arange(keep_t.size)
    keep_p = new_id[ti] >= 0
    return w[keep_t], new_id[ti[keep_p]], ui[keep_p]


# ----------------------------------------------------------------------------- LP
def test_lp_one_user_owns_everything():
    w = np.array([0.5, 1.0, 0.25, 1.0])
    ti, ui = np.arange(4), np.zeros(4, int)
    for tau in (0.0, 0.3, 1.0, 2.0, 2.75, 3.0, 10.0):
        assert truncated_value(w, ti, ui, tau) == pytest.approx(min(tau, 2.75), abs=1e-9)


def test_lp_disjoint_users():
    # user 7: weights 1,1,1 (3.0); user 3: 0.5, 0.5 (1.0); user 9: 0.2; tuple 6 has no user (0.4)
    # (0.2 and 0.4 are rounded down to the public grid 2^-k, k = 30 - max(0, ceil(log2 tau)):
    # the documented rounding of _s4s_truncation loses < 2 * 2^-k here)
    w = np.array([1, 1, 1, 0.5, 0.5, 0.2, 0.4])
    ti = np.array([0, 1, 2, 3, 4, 5])
    ui = np.array([7, 7, 7, 3, 3, 9])
    for tau, want in [
        (0.0, 0.4),
        (0.5, 0.5 + 0.5 + 0.2 + 0.4),
        (1.0, 1 + 1 + 0.2 + 0.4),
        (2.0, 2 + 1 + 0.2 + 0.4),
        (3.0, 4.6),
        (100.0, 4.6),
    ]:
        k = 30 - max(0, math.ceil(math.log2(max(tau, 1.0))))
        assert want - 2 * 2.0**-k <= truncated_value(w, ti, ui, tau) <= want + 1e-12, tau


def test_lp_shared_tuple():
    # tuple 0 (w=1) belongs to users 0 and 1; user 0 also owns tuple 1 (w=1), user 1 tuple 2 (w=1).
    w = np.ones(3)
    ti = np.array([0, 1, 0, 2])
    ui = np.array([0, 0, 1, 1])
    assert truncated_value(w, ti, ui, 1.0) == pytest.approx(2.0, abs=1e-9)  # x1 = x2 = 1, x0 = 0
    assert truncated_value(w, ti, ui, 1.5) == pytest.approx(2.5, abs=1e-9)  # x0 = 0.5
    assert truncated_value(w, ti, ui, 2.0) == pytest.approx(3.0, abs=1e-9)
    # a star: the shared tuple is the only one, owned by 3 users
    assert truncated_value([0.8], [0, 0, 0], [1, 2, 3], 0.5) == pytest.approx(0.5, abs=1e-9)
    # repeated pairs are one incidence
    assert truncated_value([0.8, 0.8], [0, 0, 1], [5, 5, 5], 1.0) == pytest.approx(1.0, abs=1e-9)


def test_lp_matches_full_reference_lp_and_fast_path():
    g = np.random.default_rng(20261129)
    for _ in range(25):
        w, ti, ui = random_instance(g, int(g.integers(1, 40)), int(g.integers(1, 8)))
        load = np.bincount(ui, weights=w[ti])
        for tau in (0.5, 1.0, 2.0, 3.7, float(load.max()), float(load.max()) + 1.0):
            got = truncated_value(w, ti, ui, tau)
            # weights and tau are rounded down to the grid 2^-k, k = 30 - max(0, ceil(log2 tau)):
            # each of the n weights loses < 2^-k and tau' >= tau - 2^-k costs each of the m users
            # at most 2^-k; the LP path is within G = tau * 2^-10 below the optimum
            k = 30 - max(0, math.ceil(math.log2(tau)))
            tol = (w.size + 8) * 2.0**-k + tau * 2.0**-10 + 1e-7
            ref = reference_lp(w, ti, ui, tau)
            assert ref - tol <= got <= ref + 1e-7
            if tau >= load.max():  # fast path: the plain sum
                assert got == pytest.approx(w.sum(), abs=w.size * 2.0**-k)


def test_lp_user_level_sensitivity_at_most_tau():
    """Removing one user with all its tuples lowers f̄ by at most τ (and never raises it)."""
    g = np.random.default_rng(7)
    worst_ratio = 0.0
    raw_violations = 0
    for _ in range(30):
        w, ti, ui = random_instance(g, int(g.integers(5, 30)), int(g.integers(2, 7)), share=0.4)
        for tau in (0.5, 1.0, 2.5):
            full = truncated_value(w, ti, ui, tau)
            for u in np.unique(ui):
                w2, ti2, ui2 = remove_user(w, ti, ui, u)
                d = full - truncated_value(w2, ti2, ui2, tau)
                assert -1e-7 <= d <= tau + 1e-7
                worst_ratio = max(worst_ratio, d / tau)
                raw_violations += (w.sum() - w2.sum()) > tau + 1e-7  # negative control
    assert worst_ratio > 0.99  # the bound is attained: the check is not vacuous
    assert raw_violations > 0  # the untruncated sum does violate it on these instances


def test_lp_large_instance_is_fast():
    g = np.random.default_rng(3)
    n, m = 100_000, 5000
    w = g.uniform(0, 1, n)
    second = g.uniform(size=n) < 0.5
    ti = np.concatenate([np.arange(n), np.arange(n)[second]])
    ui = np.concatenate([g.integers(0, m, n), g.integers(0, m, int(second.sum()))])
    t0 = time.perf_counter()
    v = truncated_value(w, ti, ui, 4.0)
    elapsed = time.perf_counter() - t0
    assert elapsed < 10.0, elapsed
    assert v <= 4.0 * m + 1e-6 and v <= w.sum()
    # a feasible point gives a lower bound: x_t = w_t · min(1, τ / max owner load)
    load = np.bincount(ui, weights=w[ti], minlength=m)
    scale = np.ones(n)
    np.minimum.at(scale, ti, np.minimum(1.0, 4.0 / load[ui]))
    assert v >= float((w * scale).sum()) - 1e-6


# ----------------------------------------------------------------------------- sampling
def test_poisson_sample():
    assert poisson_sample(5, 1.0, seeded_noise(0)).all()
    m = poisson_sample(200_000, 0.25, seeded_noise(1))
    assert m.dtype == bool and m.shape == (200_000,)
    # |mean − q| ≤ 5.3 sd has probability ≥ 1 − 1.2e-7; sd = sqrt(q(1−q)/n) ≈ 9.7e-4
    sd = math.sqrt(0.25 * 0.75 / 200_000)
    assert abs(m.mean() - 0.25) <= 5.3 * sd
    assert abs(m.mean() - 0.26) > 5.3 * sd  # negative control: a 1-point-off rate is rejected
    with pytest.raises(ConfigError):
        poisson_sample(5, 0.0, seeded_noise(0))


# ----------------------------------------------------------------------------- schedule
def unit_instance(sizes):
    """Disjoint users, user u owns sizes[u] unit-weight tuples."""
    ui = np.repeat(np.arange(len(sizes)), sizes)
    return np.ones(ui.size), np.arange(ui.size), ui


def test_schedule_matches_vectors_and_spends_at_most_epsilon():
    sched = load()["algorithm_2_schedule"]
    tol = sched["tolerance"]["absolute"]
    for case in sched["cases"]:
        w, ti, ui = unit_instance([1, 2, 3])
        r = s4s_scalar(
            w,
            ti,
            ui,
            epsilon=case["eps"],
            max_tuples_per_user=case["Delta"],
            q=case["q"],
            rng=seeded_noise(0),
            beta=case["beta"],
        )
        assert len(r.steps) == case["L"] == len(case["iterations"])
        for st, it in zip(r.steps, case["iterations"]):
            assert st.i == it["i"] and st.tau == it["tau_i"]
            assert st.epsilon == pytest.approx(it["eps_i"], abs=tol)
            assert st.laplace_scale == pytest.approx(it["laplace_scale"], rel=1e-9)
            assert st.bias == pytest.approx(it["bias_subtracted"], rel=1e-9)
            assert st.epsilon_prime == pytest.approx(it["eps_prime_i"], abs=tol)
        assert r.epsilon_spent == pytest.approx(
            math.fsum(it["eps_prime_i"] for it in case["iterations"]), abs=tol
        )
        assert r.epsilon_spent <= case["eps"]
        assert r.q == case["q"] and r.tau in {s.tau for s in r.steps}


@pytest.mark.parametrize("eps,delta,q", [(1.0, 8, 1.0), (0.3, 1000, 1.0), (1.0, 1, 0.5), (2.0, 64, 0.1)])
def test_spent_at_most_epsilon(eps, delta, q):
    r = s4s_scalar(*unit_instance([1]), epsilon=eps, max_tuples_per_user=delta, q=q, rng=zero_noise())
    assert len(r.steps) == int(delta).bit_length()
    assert [s.tau for s in r.steps] == [2.0 ** (s.i - 1) for s in r.steps]
    assert r.epsilon_spent <= eps
    assert sum((Fraction(s.epsilon_prime) for s in r.steps), Fraction(0)) <= Fraction(eps)  # exactly
    if q == 1.0:  # no amplification: ε′_i = ε_i = ε/L and the whole budget is spent
        assert all(s.epsilon_prime == pytest.approx(eps / len(r.steps), rel=1e-12) for s in r.steps)
        assert r.epsilon_spent == pytest.approx(eps, rel=1e-12)


# ----------------------------------------------------------------------------- zero noise
def test_zero_noise_q1_returns_sum_minus_bias_of_chosen_step():
    # 100 disjoint users with 8 unit tuples each; Δ = 8 → L = 4, τ = 8, 4, 2, 1, ε_i = ε/4
    w, ti, ui = unit_instance([8] * 100)
    r = s4s_scalar(w, ti, ui, epsilon=1.0, max_tuples_per_user=8, q=1.0, rng=zero_noise())
    bias = lambda tau: tau * 4 / 1.0 * math.log(3 * 4 / 0.1)  # noqa: E731
    expected = [100 * min(tau, 8) - bias(tau) for tau in (8, 4, 2, 1)]
    assert r.candidates == pytest.approx(expected, rel=1e-12)
    assert r.tau == 8.0
    assert r.estimate == pytest.approx(800 - bias(8), rel=1e-12)
    assert r.estimate == r.unclamped


def test_zero_noise_general_formula_and_clamp():
    g = np.random.default_rng(11)
    w, ti, ui = random_instance(g, 60, 10, share=0.3)
    delta = int(np.bincount(ui).max())
    r = s4s_scalar(w, ti, ui, epsilon=2.0, max_tuples_per_user=delta, q=1.0, rng=zero_noise())
    want = [truncated_value(w, ti, ui, s.tau) - s.bias for s in r.steps]
    assert r.candidates == pytest.approx(want, abs=1e-9)
    assert r.unclamped == pytest.approx(max(want), abs=1e-9)
    assert r.estimate == pytest.approx(max(0.0, max(want)), abs=1e-9)
    # tiny truth: every candidate is negative, the release is clamped at 0 (documented)
    r0 = s4s_scalar([0.5], [0], [0], epsilon=1.0, max_tuples_per_user=4, q=1.0, rng=zero_noise())
    assert r0.unclamped < 0 and r0.estimate == 0.0


def test_zero_noise_sampled_is_rescaled_sample_value():
    w, ti, ui = unit_instance([4] * 50)
    q = 0.5
    mask = poisson_sample(w.size, q, zero_noise(5))  # the mechanism draws the same uniforms first
    r = s4s_scalar(w, ti, ui, epsilon=1.0, max_tuples_per_user=4, q=q, rng=zero_noise(5))
    keep = mask[ti]
    want = [
        (truncated_value(np.where(mask, w, 0.0), ti[keep], ui[keep], s.tau) - s.bias) / q for s in r.steps
    ]
    assert r.candidates == pytest.approx(want, abs=1e-9)
    assert r.steps[0].tau == 4.0 and r.candidates[0] == pytest.approx((mask.sum() - r.steps[0].bias) / q)


def test_laplace_noise_is_calibrated_to_the_schedule():
    """q = 1: every candidate minus its deterministic part (f̄ − bias) is Lap(τ_i/ε_i); normalised,
    |Z| ~ Exp(1) (mean 1, sd 1). Over N = 4200 draws the mean of |Z| lies within 5.3/sqrt(N) of 1
    except w.p. ~1e-7 (normal approximation; Exp(1) is sub-exponential and N is large)."""
    w, ti, ui = unit_instance([1, 1, 1])  # f̄ = 3 for every τ_i ≥ 1
    delta = 2**20  # L = 21 draws per run
    rng = seeded_noise(99)
    fbar = {t: truncated_value(w, ti, ui, t) for t in (2.0**k for k in range(21))}
    assert set(fbar.values()) == {3.0}
    z = []
    for _ in range(200):
        r = s4s_scalar(w, ti, ui, epsilon=0.7, max_tuples_per_user=delta, q=1.0, rng=rng)
        z += [(c - (fbar[s.tau] - s.bias)) / s.laplace_scale for c, s in zip(r.candidates, r.steps)]
    a = np.abs(np.array(z))
    assert a.size == 4200
    tol = 5.3 / math.sqrt(a.size)
    assert abs(a.mean() - 1.0) <= tol
    assert abs(np.median(np.array(z))) <= 0.1  # centred (sd of the median of Lap(1) ≈ 1/sqrt(N))
    # negative control: a schedule whose ε_i were 15% off would be rejected
    assert abs(a.mean() * 1.15 - 1.0) > tol and abs(a.mean() / 1.15 - 1.0) > tol


# ----------------------------------------------------------------------------- utility
def test_utility_on_synthetic_instance():
    """2000 disjoint users with 1..8 unit tuples, ε = 1, q = 0.5, Δ = 8, fixed seed.

    Bound (fails w.p. ≤ 2e-7 over the seed): with S the sample, f(S) = Σ_{t∈S} w_t,
    * sampling (Hoeffding, n terms in [0,1]): |f(S) − q f(T)| ≤ h = sqrt(n ln(2/δ₁)/2), δ₁ = 1e-7;
    * noise: every |Z_i| ≤ b_i ln(L/δ₂), δ₂ = 1e-7 (union bound over the L Laplace draws).
    τ_L = Δ ≥ every user's sampled load, so f̄(S, τ_L) = f(S) and q·est ≥ f(S) − bias_L − |Z_L|;
    f̄ ≤ f(S) gives q·est ≤ f(S) + max_i(|Z_i| − bias_i). Hence
    |est − f(T)| ≤ (h + max_i b_i·(ln(3L/β) + ln(L/δ₂)))/q.
    """
    g = np.random.default_rng(2026)
    sizes = g.integers(1, 9, 2000)
    w, ti, ui = unit_instance(sizes)
    truth = float(w.sum())
    q, eps = 0.5, 1.0
    r = s4s_scalar(w, ti, ui, epsilon=eps, max_tuples_per_user=8, q=q, rng=seeded_noise(424242))
    big_l = len(r.steps)
    h = math.sqrt(truth * math.log(2 / 1e-7) / 2)
    noise = max(s.laplace_scale for s in r.steps) * (math.log(3 * big_l / 0.1) + math.log(big_l / 1e-7))
    bound = (h + noise) / q
    assert bound < 0.3 * truth  # the bound is informative
    assert abs(r.estimate - truth) <= bound
    # negative control: forgetting the 1/q rescaling is caught by the same bound
    assert abs(r.estimate * q - truth) > bound
    assert r.epsilon_spent <= eps


# ----------------------------------------------------------------------------- R2T
def test_r2t_schedule_vectors_and_zero_noise():
    vec = load()["r2t"]
    c = vec["cases"][0]
    w, ti, ui = unit_instance([3] * 40)
    r = r2t_scalar(w, ti, ui, epsilon=c["eps"], global_sensitivity=c["GS"], rng=zero_noise(), beta=c["beta"])
    assert r.taus == tuple(float(p["tau"]) for p in c["per_tau"])
    assert r.laplace_scales == pytest.approx([p["laplace_scale"] for p in c["per_tau"]], rel=1e-12)
    assert r.biases == pytest.approx([p["bias"] for p in c["per_tau"]], rel=1e-12)
    want = [40 * min(t, 3) - b for t, b in zip(r.taus, r.biases)]
    assert r.candidates == pytest.approx(want, rel=1e-12)
    # all candidates negative here (bias at τ=2 is 92 > 80): the exact f̄(I, 0) = 0 wins
    assert r.estimate == 0.0 and r.tau == 0.0
    big = unit_instance([3] * 400)
    r2 = r2t_scalar(*big, epsilon=1.0, global_sensitivity=1024, rng=zero_noise())
    assert r2.estimate == pytest.approx(400 * 3 - r2.biases[1], rel=1e-12) and r2.tau == 4.0


def test_r2t_unowned_tuples_released_exactly():
    # two tuples no user contributes to (weight 0.7 + 0.3): f̄(I, 0) = 1.0 is the floor
    r = r2t_scalar([0.7, 0.3, 1.0], [2], [0], epsilon=1.0, global_sensitivity=4, rng=zero_noise())
    assert r.estimate == pytest.approx(1.0)


# ----------------------------------------------------------------------------- validation
GOOD = dict(epsilon=1.0, max_tuples_per_user=4, q=0.5)


@pytest.mark.parametrize(
    "args,kw",
    [
        (([1.0], [0], [0]), dict(q=0.0)),
        (([1.0], [0], [0]), dict(q=1.5)),
        (([1.0], [0], [0]), dict(q=float("nan"))),
        (([1.0], [0], [0]), dict(epsilon=0.0)),
        (([1.0], [0], [0]), dict(epsilon=-1.0)),
        (([1.0], [0], [0]), dict(epsilon=float("inf"))),
        (([1.0], [0], [0]), dict(max_tuples_per_user=0)),
        (([1.0], [0], [0]), dict(max_tuples_per_user=2.5)),
        (([1.0], [0], [0]), dict(beta=1.0)),
        (([1.5], [0], [0]), {}),
        (([-0.1], [0], [0]), {}),
        (([float("nan")], [0], [0]), {}),
        (([1.0, 1.0], [0, 1], [0]), {}),  # mismatched index arrays
        (([1.0], [1], [0]), {}),  # tuple index out of range
        (([1.0], [-1], [0]), {}),
        (([1.0], [0.5], [0]), {}),
        (([[1.0]], [0], [0]), {}),
        ((["a"], [0], [0]), {}),
    ],
)
def test_validation(args, kw):
    with pytest.raises(ConfigError):
        s4s_scalar(*args, **{**GOOD, **kw}, rng=zero_noise())


def test_validation_lp_and_r2t():
    with pytest.raises(ConfigError):
        truncated_value([1.0], [0], [0], -1.0)
    with pytest.raises(ConfigError):
        truncated_value([2.0], [0], [0], 1.0)
    with pytest.raises(ConfigError):
        r2t_scalar([1.0], [0], [0], epsilon=1.0, global_sensitivity=1, rng=zero_noise())
    with pytest.raises(ConfigError):
        r2t_scalar([1.0], [0], [0], epsilon=0.0, global_sensitivity=8, rng=zero_noise())
    # sanity: the good call works, and an empty join releases only noise around −bias, clamped
    r = s4s_scalar(np.zeros(0), np.zeros(0, int), np.zeros(0, int), **GOOD, rng=zero_noise())
    assert r.estimate == 0.0


# ----------------------------------------------------------------------------- grid base
def test_tau_base_schedules_pinned():
    """The default (the authors' code's base 5.5 and bias ln(L/β), with Δ on the grid). Δ = 1024 → τ = 5.5^{i−1}
    with 5.5^{i−1}·√5.5 < 1024 (5.5⁴·√5.5 = 2146.02: 915.0625 gives way to Δ) and Δ = 1024 on top, L = 5;
    q = 1 → ε_i = ε/5 = 0.2; bias_i = 5τ_i·ln(5/0.1) = 5τ_i·3.9120230054 (τ = 5.5: 27.5·ln 50 = 107.580632649).
    The paper's variant (``paper_bias``: ln(3L/β), power grid τ_i ≤ Δ, L = 5) is unchanged: τ = 5.5 has bias
    27.5·ln(150) = 137.79247059.
    R2T, GS = 1024: τ_j = 5.5^j, L = 5 (least j with 5.5^j ≥ 1024); scale 5τ_j, bias 5τ_j·ln(50)."""
    from dpsql.accounting import r2t_schedule, s4s_budget_schedule

    s = s4s_budget_schedule(1.0, 1024, 1.0, 0.1)
    assert [st.tau for st in s] == [1024.0, 166.375, 30.25, 5.5, 1.0]
    assert [st.epsilon for st in s] == pytest.approx([0.2] * 5, rel=1e-12)
    assert s[3].bias == pytest.approx(107.580632649, rel=1e-9)
    assert s[0].bias == pytest.approx(5 * 1024 * 3.9120230054, rel=1e-9)
    # every power below Δ kept (keep_near_top): L = 6, ε_i = 1/6, τ = 5.5 bias 33·ln 60 = 135.1133705533
    from dpsql.accounting import s4s_tau_grid

    assert s4s_tau_grid(1024, keep_near_top=True) == (1.0, 5.5, 30.25, 166.375, 915.0625, 1024.0)
    paper = s4s_budget_schedule(1.0, 1024, 1.0, 0.1, paper_bias=True)
    assert [st.tau for st in paper] == [915.0625, 166.375, 30.25, 5.5, 1.0]
    assert paper[3].bias == pytest.approx(137.79247059, rel=1e-9)
    # the top is an explicit keyword: the power grid with the default bias (L = 5, ln(50) = 3.9120230054)
    power = s4s_budget_schedule(1.0, 1024, 1.0, 0.1, top_at_delta=False)
    assert [st.tau for st in power] == [915.0625, 166.375, 30.25, 5.5, 1.0]
    assert power[3].bias == pytest.approx(27.5 * 3.9120230054, rel=1e-9)
    r = r2t_schedule(1.0, 1024, 0.1)
    assert [st.tau for st in r] == [5.5, 30.25, 166.375, 915.0625, 5032.84375]
    assert r[0].laplace_scale == pytest.approx(27.5, rel=1e-12)
    assert r[0].bias == pytest.approx(27.5 * 3.9120230054, rel=1e-9)
    # base 2 is the paper's grid (vectors); 1024 is a power of 2, so Δ on top changes nothing there
    assert [st.tau for st in s4s_budget_schedule(1.0, 1024, 1.0, base=2.0)][:3] == [1024, 512, 256]
    assert [st.tau for st in r2t_schedule(1.0, 1024, 0.1, base=2.0)][:3] == [2, 4, 8]


def test_default_variant_zero_noise_pinned():
    """The default call (base 5.5, ln(L/β), Δ = 1024 on top, L = 5): f̄(τ) = 100·min(τ, 3); candidates
    100·min(τ, 3) − 5τ·ln(50); the largest is at τ = 5.5: 300 − 107.580632649 = 192.419367351."""
    w, ti, ui = unit_instance([3] * 100)
    r = _s4s_scalar(w, ti, ui, epsilon=1.0, max_tuples_per_user=1024, q=1.0, rng=zero_noise())
    want = [100 * min(t, 3) - 5 * t * math.log(50) for t in (1024.0, 166.375, 30.25, 5.5, 1.0)]
    assert r.candidates == pytest.approx(want, rel=1e-9)
    assert r.tau == 5.5 and r.estimate == pytest.approx(192.419367351, rel=1e-9)
    r2 = _r2t_scalar(w, ti, ui, epsilon=1.0, global_sensitivity=1024, rng=zero_noise())
    assert r2.taus == (5.5, 30.25, 166.375, 915.0625, 5032.84375)
    # 300 − 27.5·ln(50) = 192.419367351 at τ = 5.5 (f̄ = 300 for every τ_j ≥ 3)
    assert r2.estimate == pytest.approx(192.419367351, rel=1e-9) and r2.tau == 5.5


def test_tau_base_zero_noise_and_validation():
    w, ti, ui = unit_instance([3] * 100)  # f̄(τ) = 100·min(τ, 3)
    r = s4s_scalar(w, ti, ui, epsilon=1.0, max_tuples_per_user=1024, q=1.0, rng=zero_noise(), tau_base=5.5)
    want = [100 * min(t, 3) - 5 * t * 5.0106352941 for t in (915.0625, 166.375, 30.25, 5.5, 1.0)]
    assert r.candidates == pytest.approx(want, rel=1e-9)
    r2 = r2t_scalar(w, ti, ui, epsilon=1.0, global_sensitivity=1024, rng=zero_noise(), tau_base=5.5)
    assert r2.taus == (5.5, 30.25, 166.375, 915.0625, 5032.84375)
    for bad in (1.0, 0.5, float("nan"), 2000.0, "x"):
        with pytest.raises(ConfigError):
            s4s_scalar(w, ti, ui, epsilon=1.0, max_tuples_per_user=8, q=1.0, rng=zero_noise(), tau_base=bad)
