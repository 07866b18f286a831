"""DP-S4S and R2T accounting: spec vectors plus independent direct sums and properties."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from _vectors import load_vectors
from scipy.special import logsumexp
from scipy.stats import binom

from dpsql.accounting import r2t_schedule as _r2t_schedule
from dpsql.accounting import s4s_budget_schedule as _s4s_budget_schedule
from dpsql.accounting import (
    s4s_epsilon_prime,
    s4s_eta,
    s4s_find_alpha,
    s4s_gamma,
    s4s_rdp_prime,
    s4s_rdp_ss_roots,
    s4s_smooth_sensitivity,
    s4s_smooth_sensitivity_bound,
    s4s_variance_divergence_term,
    s4s_vector_epsilon,
    s4s_vector_epsilon_parts,
)
from dpsql.accounting.s4s import _eps_prime_branches

# the spec's vectors pin the papers' variants: base 2 grids and Algorithm 2's ln(3L/beta) bias
# (the product default is base 5.5 and ln(L/beta), pinned in tests/test_s4s.py)
s4s_budget_schedule = functools.partial(_s4s_budget_schedule, base=2.0, paper_bias=True)
r2t_schedule = functools.partial(_r2t_schedule, base=2.0)


def load() -> dict:
    return load_vectors("dp_s4s.json")  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- vectors
def test_vector_lemma_3_1_table3_and_extra():
    lem = load()["lemma_3_1"]
    tol = lem["tolerance"]["absolute"]
    cases = lem["table3"] + lem["extra"]
    assert len(lem["table3"]) == 18
    for c in cases:
        e = s4s_epsilon_prime(c["eps"], c["tau"], c["Delta"], c["q"])
        assert e == pytest.approx(c["eps_prime_direct_50digits"], abs=tol), c
        if "paper_table3" in c:  # the paper truncates to 4 decimals
            assert math.floor(e * 1e4 + 1e-6) / 1e4 == pytest.approx(c["paper_table3"], abs=1e-12), c
        if "log_ratio_at_z_+inf_side" in c:  # both arguments of the max, on the tight instance
            up, lo = _eps_prime_branches(c["eps"], c["tau"], c["Delta"], c["q"])
            assert up == pytest.approx(c["log_ratio_at_z_+inf_side"], abs=tol)
            assert lo == pytest.approx(-c["log_ratio_at_z_-inf_side"], abs=tol)
            assert e == pytest.approx(c["worst_case_instance_sup_log_ratio"], abs=tol)


def test_vector_lemma_3_5():
    lem = load()["lemma_3_5"]
    rel = lem["tolerance"]["relative"]
    for c in lem["cases"]:
        r = s4s_rdp_prime(c["alpha"], c["rho"], c["tau"], c["Delta"], c["q"])
        assert r == pytest.approx(c["rho_prime"], rel=rel), c
        for k in ("worst_case_instance_D_alpha(M(T')||M(T))", "worst_case_instance_D_alpha(M(T)||M(T'))"):
            if k in c:  # Jensen upper bound: not tight, but must bound the true divergences
                assert r >= c[k]


def test_vector_algorithm_2_schedule():
    sched = load()["algorithm_2_schedule"]
    tol = sched["tolerance"]["absolute"]
    for c in sched["cases"]:
        steps = s4s_budget_schedule(c["eps"], c["Delta"], c["q"], beta=c["beta"])
        assert len(steps) == c["L"]
        for s, it in zip(steps, c["iterations"], strict=True):
            assert (s.i, s.tau) == (it["i"], it["tau_i"])
            assert s.epsilon == pytest.approx(it["eps_i"], abs=tol)
            assert s.laplace_scale == pytest.approx(it["laplace_scale"], rel=1e-9)
            assert s.bias == pytest.approx(it["bias_subtracted"], rel=1e-9)
            assert s.epsilon_prime == pytest.approx(it["eps_prime_i"], abs=tol)
            assert s.remaining == pytest.approx(it["remaining_after"], abs=tol)
        assert sum(s.epsilon_prime for s in steps) <= c["eps"] + 1e-12
        if c["q"] == 1.0:  # no sampling: R2T's even split
            assert all(s.epsilon == pytest.approx(c["eps"] / c["L"], rel=1e-12) for s in steps)


def test_vector_lemma_4_1():
    lem = load()["lemma_4_1"]
    rel = lem["tolerance"]["relative"]
    for c in lem["cases"]:
        a, r, d = c["alpha"], c["rho"], c["d"]
        t1, t2 = s4s_rdp_ss_roots(a, r, d)
        assert t1 == pytest.approx(c["t1"], rel=rel)
        assert t2 == pytest.approx(c["t2"], rel=rel)
        g = s4s_gamma(a, r, d)
        assert g == pytest.approx(c["gamma"], rel=rel)
        assert s4s_eta(a, r, d, "paper") == pytest.approx(
            c["eta_paper=sqrt(alpha/rho)/(1-alpha+alpha e^{-2gamma})"], rel=rel
        )
        assert s4s_eta(a, r, d, "proof") == pytest.approx(
            c["eta_from_proof=sqrt(alpha/(rho(1-alpha+alpha e^{-2gamma})))"], rel=rel
        )
        for ex in c["G_examples"]:
            big_g, k = s4s_smooth_sensitivity(ex["B"], g)
            assert big_g == pytest.approx(ex["G"], rel=rel)
            assert k == ex["k_at_max"]
            assert s4s_smooth_sensitivity_bound(ex["B"], g) == pytest.approx(
                ex["upper_bound_e^{gamma B -1}/gamma"], rel=rel
            )
        # at the extreme variance ratios e^{±2γ} the divergence's variance term is ≤ ρ/2, = at the binding end.
        # (evaluating it from a float ratio costs digits when 1 − α + α·ratio is tiny: tolerance 1e-6)
        terms = [s4s_variance_divergence_term(a, math.exp(sgn * 2 * g), d) for sgn in (1, -1)]
        assert max(terms) == pytest.approx(c["divergence_log_term_at_extreme_ratio"], rel=1e-6)
        assert max(terms) == pytest.approx(r / 2, rel=1e-6)


def test_vector_lemma_4_2():
    lem = load()["lemma_4_2"]
    rel = lem["tolerance"]["relative"]
    for c in lem["cases"]:
        p = s4s_vector_epsilon_parts(c["eps"], c["delta"], c["alpha"], c["q"], c["Delta"])
        assert p.q_prime == pytest.approx(c["q_prime"], rel=rel)
        assert p.epsilon1 == pytest.approx(c["eps1_part"], rel=rel)
        assert p.epsilon2 == pytest.approx(c["eps2_part"], rel=rel)
        assert p.epsilon_prime == pytest.approx(c["eps_prime"], rel=rel)
        assert s4s_vector_epsilon(c["eps"], c["delta"], c["alpha"], c["q"], c["Delta"]) == p.epsilon_prime
        assert c["alpha_valid(alpha>1+ln(1/delta)/eps2)"] is True
        assert p.epsilon_prime <= c["eps"] * (1 + 1e-12)


def test_vector_r2t():
    r2t = load()["r2t"]
    rel = r2t["tolerance"]["relative"]
    for c in r2t["cases"]:
        steps = r2t_schedule(c["eps"], c["GS"], beta=c["beta"])
        assert len(steps) == c["L=log2(GS)"]
        for s, p in zip(steps, c["per_tau"], strict=True):
            assert s.tau == p["tau"]
            assert s.laplace_scale == pytest.approx(p["laplace_scale"], rel=rel)
            assert s.bias == pytest.approx(p["bias"], rel=rel)


# ----------------------------------------------------------------------------- independent checks
def direct_eps_prime(eps, tau, n, q):
    """Lemma 3.1 summed term by term (log space): an independent route to the PGF form."""
    k = np.arange(0, min(math.floor(tau), n) + 1)
    lp = np.log(binom.pmf(k, n, q))
    sf = binom.sf(math.floor(tau), n, q)
    lsf = math.log(sf) if sf > 0 else -math.inf
    up = logsumexp(np.append(lp + k * eps / tau, lsf + eps))
    lo = logsumexp(np.append(lp - k * eps / tau, lsf - eps))
    return max(up, -lo)


@pytest.mark.parametrize(
    "eps,tau,n,q",
    [
        (1.0, 1, 1024, 0.001),
        (0.5, 5.5, 100, 0.05),
        (2.0, 7.9, 300, 0.3),
        (0.3, 50, 2000, 0.01),
        (1.0, 3, 3, 0.7),
    ],
)
def test_pgf_form_matches_direct_sum(eps, tau, n, q):
    assert s4s_epsilon_prime(eps, tau, n, q) == pytest.approx(direct_eps_prime(eps, tau, n, q), abs=1e-12)


def test_eps_prime_properties():
    rng = np.random.default_rng(3)
    for _ in range(200):
        eps = float(10 ** rng.uniform(-3, 1))
        n = int(10 ** rng.uniform(0, 6))
        tau = float(10 ** rng.uniform(-0.3, 4))
        q = float(10 ** rng.uniform(-4, 0))
        e = s4s_epsilon_prime(eps, tau, n, q)
        assert 0.0 <= e <= eps  # amplification never costs more than ε
    # no sampling: no amplification
    assert s4s_epsilon_prime(0.7, 4, 64, 1.0) == pytest.approx(0.7, abs=1e-12)
    # monotone: more sampling or more budget costs more
    qs = [s4s_epsilon_prime(1.0, 16, 1024, q) for q in (0.0001, 0.001, 0.005, 0.01)]
    assert all(b > a for a, b in zip(qs, qs[1:], strict=False))
    es = [s4s_epsilon_prime(e, 16, 1024, 0.01) for e in (0.1, 0.5, 1.0, 2.0)]
    assert all(b > a for a, b in zip(es, es[1:], strict=False))
    # non-integer τ: only ⌊τ⌋ enters the sums, but ε/τ uses τ itself
    assert s4s_epsilon_prime(1.0, 4.5, 100, 0.1) != s4s_epsilon_prime(1.0, 4.0, 100, 0.1)
    assert s4s_epsilon_prime(0.0, 4.5, 100, 0.1) == 0.0


def test_eps_prime_huge_max_tuples_is_stable():
    # Δ = 1e9 is O(1); small q·Δ gives strong amplification, then none as q·Δ ≫ τ
    tiny = s4s_epsilon_prime(1.0, 64, 10**9, 1e-10)
    assert 0 < tiny < 0.2
    big = s4s_epsilon_prime(1.0, 64, 10**9, 0.5)
    assert big == pytest.approx(1.0, abs=1e-12)
    # agrees with a smaller Δ at the same expected count (binomial → Poisson)
    assert s4s_epsilon_prime(1.0, 8, 10**9, 4e-9) == pytest.approx(
        s4s_epsilon_prime(1.0, 8, 10**7, 4e-7), rel=1e-3
    )


def direct_rho_prime(alpha, rho, tau, n, q):
    k = np.arange(0, min(math.floor(tau), n) + 1)
    lp = np.log(binom.pmf(k, n, q))
    sf = binom.sf(math.floor(tau), n, q)
    parts = list(lp + (alpha - 1) * k * k * rho / tau**2)
    if sf > 0:
        parts.append(math.log(sf) + (alpha - 1) * rho)
    return logsumexp(parts) / (alpha - 1)


@pytest.mark.parametrize(
    "alpha,rho,tau,n,q", [(8, 0.05, 4, 64, 0.05), (2.5, 1.0, 10.5, 500, 0.02), (40, 0.01, 3, 7, 0.5)]
)
def test_rdp_prime_matches_direct_sum_and_is_at_most_rho(alpha, rho, tau, n, q):
    r = s4s_rdp_prime(alpha, rho, tau, n, q)
    assert r == pytest.approx(direct_rho_prime(alpha, rho, tau, n, q), rel=1e-12)
    assert 0 < r <= rho


def test_rdp_prime_huge_max_tuples():
    r = s4s_rdp_prime(8, 0.5, 64, 10**9, 1e-7)
    assert 0 < r <= 0.5
    # the truncated window agrees with a moderate Δ at the same expected count (binomial → Poisson)
    r2 = s4s_rdp_prime(8, 0.5, 64, 10**7, 1e-5)
    assert r == pytest.approx(r2, rel=1e-2)
    assert s4s_rdp_prime(8, 0.5, 2**40, 10**9, 0.5) <= 0.5


def test_lemma_4_1_roots_solve_h():
    for a, r, d in [(20.0, 0.4, 10), (17.0, 1.0, 1), (3.0, 0.1, 100), (1.5, 2.0, 2)]:
        t1, t2 = s4s_rdp_ss_roots(a, r, d)
        big_a = math.exp((a - 1) * r / d)
        for t in (t1, t2):
            h = t**a - a * big_a * t + (a - 1) * big_a
            assert abs(h) <= 1e-12 * a * big_a * t
        assert (a - 1) / a < t1 < 1 < t2 < (a * big_a) ** (1 / (a - 1))
        g = s4s_gamma(a, r, d)
        assert g == pytest.approx(0.5 * math.log(min(1 / t1, t2)), rel=1e-12)
        assert s4s_eta(a, r, d, "paper") >= s4s_eta(a, r, d, "proof")


def test_smooth_sensitivity_against_brute_force():
    for b in (0.0, 1.0, 3.5, 20.0, 200.0):
        for g in (0.001, 0.02, 0.3, 2.0):
            ks = np.arange(0, 20000)
            vals = (ks + b) * np.exp(-g * ks)
            big_g, k = s4s_smooth_sensitivity(b, g)
            assert big_g == pytest.approx(vals.max(), rel=1e-12)
            assert vals[k] == pytest.approx(vals.max(), rel=1e-12)
            if 1 / g > b:
                assert big_g <= s4s_smooth_sensitivity_bound(b, g) * (1 + 1e-12)


def test_lemma_4_2_no_sampling_collapses_to_epsilon():
    p = s4s_vector_epsilon_parts(4.0, 1e-7, 20.0, 1.0, 100)
    assert p.epsilon1 == pytest.approx(0.8, rel=1e-12)
    assert p.epsilon2 == pytest.approx(3.2, rel=1e-12)
    # huge (α − 1)ε does not overflow
    assert s4s_vector_epsilon(4.0, 1e-7, 5000.0, 0.01, 10) <= 4.0


def test_find_alpha_is_a_local_minimum_of_the_noise_factor():
    e2, delta, d = 3.2, 1e-7, 10
    a = s4s_find_alpha(e2, delta, d)
    a0 = 1 + math.log(1 / delta) / e2
    assert a > a0

    def factor(x):
        return s4s_eta(x, e2 - math.log(1 / delta) / (x - 1), d, "paper")

    f = factor(a)
    for m in (0.9, 0.99, 1.01, 1.1, 2.0):
        x = a * m
        if x > a0:
            assert factor(x) >= f * (1 - 1e-9)


def test_r2t_non_power_of_two_rounds_levels_up():
    steps = r2t_schedule(1.0, 1000, beta=0.1)
    assert [s.tau for s in steps][-1] == 1024
    assert len(steps) == 10


@pytest.mark.parametrize("eps,tau,n,q", [(40.0, 1.0, 3, 0.5), (60.0, 2.0, 5, 0.25), (200.0, 3.0, 7, 0.9), (25.0, 1.0, 4, 0.01),
                                         (40.0, 1.0, 30, 0.001), (300.0, 2.5, 1024, 0.25)])
def test_lemma_3_1_at_large_epsilon_over_tau_by_direct_summation(eps: float, tau: float, n: int, q: float) -> None:
    """Lemma 3.1 summed term by term in log space (math.comb, exact binomial weights) where ε/τ is large: the
    tilted rate q e^{ε/τ}/A rounds to 1 there, and Lemma 3.2's binomial CDF must use its complement
    (1 − q)/A, and where even that probability underflows (Δ = 30, q = 0.001: P ≈ 30·((1 − q)/A)^29 < 1e-400
    against A^Δ > 1e400) the terms are summed directly (36.479 where the product form gave 32.241). Negative control: at ε = 40, τ = 1, Δ = 3, q = 1/2 the rounded rate gave 40 + ln(1/2) =
    39.3069, which drops the k = 1 term 3/8·e^40 (the truth is ln(1/8 + 7/8·e^40) = 39.8665)."""
    from dpsql.accounting import s4s_epsilon_prime, s4s_joint_epsilon

    k = math.floor(tau)
    logp = [math.log(math.comb(n, j)) + j * math.log(q) + (n - j) * math.log1p(-q) for j in range(n + 1)]
    tail = [lp for j, lp in enumerate(logp) if j > k]

    def lse(xs: list[float]) -> float:
        m = max(xs)
        return m + math.log(sum(math.exp(x - m) for x in xs))

    up = lse([logp[j] + j * eps / tau for j in range(k + 1)] + [t + eps for t in tail])
    lo = -lse([logp[j] - j * eps / tau for j in range(k + 1)] + [t - eps for t in tail])
    want = min(eps, max(0.0, up, lo))
    assert s4s_epsilon_prime(eps, tau, n, q) == pytest.approx(want, rel=1e-12)
    assert s4s_joint_epsilon([eps / tau], [tau], n, q) == pytest.approx(want, rel=1e-12)
    if (eps, tau, n, q) == (40.0, 1.0, 3, 0.5):
        assert want == pytest.approx(math.log(0.125 + 0.875 * math.exp(40.0)), rel=1e-15)
        assert want - (40.0 + math.log(0.5)) > 0.5  # the value the rounded rate gave is far below


def test_gamma_and_eta_from_one_solve_are_the_two_functions_bit_for_bit() -> None:
    """``s4s_gamma_eta`` (the calibration's scan over α calls it) returns exactly ``s4s_gamma`` and ``s4s_eta``."""
    from dpsql.accounting import s4s_eta, s4s_gamma, s4s_gamma_eta

    n_ok = 0
    for alpha in (1.01, 1.5, 2.0, 7.3, 40.0, 1e3):
        for rho in (1e-3, 0.3, 2.0, 50.0):
            for d in (1, 3, 2526, 10**6):
                for form in ("paper", "proof"):
                    try:
                        want: object = (s4s_gamma(alpha, rho, d), s4s_eta(alpha, rho, d, form))
                    except ValueError as e:  # outside the roots' numerical range: the same refusal
                        want = type(e)
                    try:
                        got: object = s4s_gamma_eta(alpha, rho, d, form)
                    except ValueError as e:
                        got = type(e)
                    assert got == want, (alpha, rho, d, form)
                    n_ok += isinstance(got, tuple)
    assert n_ok >= 150
    for bad in ((1.0, 0.3, 3, "proof"), (2.0, 0.0, 3, "proof"), (2.0, 0.3, 0, "proof"), (2.0, 0.3, 3, "other")):
        with pytest.raises(ValueError):
            s4s_gamma_eta(*bad)
        with pytest.raises(ValueError):
            s4s_eta(*bad)
