r"""DP-S4S for scalar select-join-aggregate queries under user-level pure DP (numpy core), and R2T.

Groundwork for join support: the caller supplies the join result as per-tuple weights and the
user–tuple incidence; there is no SQL here.

Input representation
--------------------
* ``weights``: float array (n,), w_t = f(t) ∈ [0, 1] (the caller normalises by a public bound W
  and rescales the released value by W — post-processing).
* ``tuple_idx``, ``user_idx``: equal-length integer arrays, one entry per pair u ⇝ t ("user u
  contributes join tuple t"). A tuple may belong to several users; a tuple with no user is allowed
  (it is constrained by no user and no user's removal affects it). Repeated pairs are merged.
  User ids are arbitrary non-negative integers (they are compacted internally).

Privacy claim
-------------
Neighbouring relation (spec ``mechanisms.md`` §3.1): I ∼ I′ iff they differ by adding or removing
**one user together with every join tuple it contributes to** (user-level, unbounded DP). Every
user contributes to at most Δ = ``max_tuples_per_user`` join tuples (public bound; the caller's
bounding enforces it, :func:`s4s_scalar` re-checks it, see below).

* Truncation LP (§3.2, Kasiviswanathan et al. 2013): f̄(S, τ) = max Σ_t x_t s.t.
  Σ_{t: u⇝t} x_t ≤ τ for every user u, 0 ≤ x_t ≤ w_t. Removing user u amounts to forcing x_t = 0
  on u's tuples (u's own constraint then holds trivially), so f̄(I′) ≤ f̄(I), and zeroing u's tuples
  in an optimum of I loses Σ_{t: u⇝t} x_t ≤ τ: the user-level sensitivity of f̄(·, τ) is ≤ τ
  (for τ ≥ the largest user contribution, f̄ = Σ w_t). The value comes from HiGHS; its feasibility
  tolerance (~1e-7 absolute per constraint) is the only slack on this bound.
* Algorithm 1 (Sample-and-Truncate, §3.4): Poisson-sample the join tuples with rate q → S; release
  f̄(S, τ) + Lap(τ/ε). By Lemma 3.1 (computed through the O(1) PGF form of Lemma 3.2 in
  :func:`dpsql.accounting.s4s_epsilon_prime`) this is ε′(ε, τ, Δ, q)-DP with ε′ ≤ ε. Lemma 3.1
  needs |S_u| to be dominated by Bin(Δ, q), hence the Δ bound is a precondition for q < 1.
* Algorithm 2 (DP-S4S scalar, §3.5): one sample S; L = ⌊log₂ Δ⌋ + 1; for i = L … 1: τ_i = 2^{i−1},
  ε_i = ε₀/i, f̂_i = f̄(S, τ_i) + Lap(τ_i/ε_i), f̃_i = f̂_i − (τ_i/ε_i)·ln(3L/β), ε₀ ← ε₀ − ε′_i.
  The schedule (τ_i, ε_i, ε′_i) is data independent (:func:`dpsql.accounting.s4s_budget_schedule`,
  checked against the spec vectors); basic composition over the L runs on the same sample gives
  Σ ε′_i ≤ ε — the candidates f̃_i/q are all covered, and the released
  max(0, max_i f̃_i/q) is post-processing of them. **We clamp at 0** (as the authors' code does;
  the true sum is ≥ 0, so this only reduces error); the unclamped value is kept in the result too.
  Utility (Lemma 3.3): w.p. 1 − β, |f̂ − f| = Õ(√(n/q) + 1/q + (τ* + √(τ*/q))/ε_{i*}).
* R2T (§3.3, Dong et al. 2022), the unsampled variant (q = 1, no amplification): τ_j = 2^j,
  j = 1 … L = ⌈log₂ GS⌉, each run with ε/L: Q̃_j = f̄(I, τ_j) + Lap(L τ_j/ε) − L τ_j ln(L/β)/ε,
  released max(max_j Q̃_j, f̄(I, 0)) (:func:`dpsql.accounting.r2t_schedule`). f̄(I, 0) is the weight
  of tuples no user contributes to: sensitivity 0, released exactly. Composition: ε. R2T's privacy
  does not depend on GS (only its grid does).

Floating point (``dpsql.noise`` section 2): every Laplace draw goes through Mironov's snapping
mechanism (clamp f̄ to a public B = 2^K Λ, add Lap(λ), round to the power-of-two grid Λ ≥ λ,
clamp). A snapped kernel satisfies K(y|v) ≤ exp(|v − v′|/λ + ξ) K(y|v′) with
ξ = 2⁻⁴⁵(B/λ + 2), so in Lemma 3.1's sum every term gains at most the factor e^ξ: the run on the
sample is (ε′(τ/λ, τ, Δ, q) + ξ)-DP. λ_i is calibrated so that ε′(τ_i/λ_i, τ_i, Δ, q) + ξ_i ≤ ε′_i
of the schedule (bisection on the monotone ε′; q = 1: τ_i/λ_i = ε′_i − ξ_i), keeping Σ ≤ ε.
R2T's runs use λ_j with τ_j/λ_j + ξ_j ≤ ε/L. The schedule's nominal scales τ/ε (and the biases)
are kept in the results; the scales actually used are ``snap_lambda`` / ``snap_lambdas``.

Deviations from the authors' code (spec §3.5 [IMPL]): we follow the paper — base 2 grid,
ln(3L/β) bias, L = ⌊log₂ Δ⌋ + 1 — not the code's base 5.5 and ln(num_taus/β).

Randomness: only through the :class:`dpsql.noise.NoiseSource` passed in (uniforms for the
sample, Laplace for the noise). The true LP values never leave this module.

Sources: Qiu, Xiao, Yang, "DP-S4S" (arXiv 2603.14994, SIGMOD 2026), Algorithms 1–2, Lemmas
3.1–3.3; Dong et al., "R2T" (SIGMOD 2022); Kasiviswanathan et al. (TCC 2013) for the LP;
spec ``mechanisms.md`` §3.1–3.5, vectors ``dp_s4s.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.accounting import r2t_schedule, s4s_budget_schedule, s4s_epsilon_prime
from dpsql.errors import ConfigError, ExecutionError
from dpsql.noise import NoiseSource, snapping_calibration, snapping_exponent, snapping_extra, snapping_grid

__all__ = [
    "JoinTuples",
    "S4SStep",
    "S4SResult",
    "R2TResult",
    "validate_join_tuples",
    "truncated_value",
    "poisson_sample",
    "s4s_scalar",
    "r2t_scalar",
]


# ----------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class JoinTuples:
    """Validated join tuples: weights (n,), deduplicated pairs, users compacted to 0..m−1."""

    weights: np.ndarray  #: float64 (n,), in [0, 1]
    tuple_idx: np.ndarray  #: int64 (p,), pairs u ⇝ t, unique
    user_idx: np.ndarray  #: int64 (p,), compacted user ids in [0, m)
    n_users: int  #: m

    def tuples_per_user(self) -> np.ndarray:
        return np.bincount(self.user_idx, minlength=self.n_users)


def _index_array(a: object, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise ConfigError(f"{name} must be a 1-D integer array, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.floor(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ConfigError(
                f"{name} must hold integers, got dtype {arr.dtype}",
                hint="pass the pairs u ~> t as integer arrays tuple_idx, user_idx",
            )
    if np.any(arr < 0):
        raise ConfigError(f"{name} must be >= 0")
    return arr.astype(np.int64, copy=False)


def validate_join_tuples(weights: object, tuple_idx: object, user_idx: object) -> JoinTuples:
    """Check the input representation; raise :class:`ConfigError` on any malformed input."""
    try:
        w = np.asarray(weights)
    except (TypeError, ValueError):
        raise ConfigError("weights must be a 1-D numeric array") from None
    if w.ndim != 1:
        raise ConfigError(f"weights must be a 1-D array, got shape {w.shape}")
    if w.dtype.kind not in "fiub":
        raise ConfigError(f"weights must be numeric, got dtype {w.dtype}")
    w = w.astype(np.float64, copy=False)
    if not (np.all(np.isfinite(w)) and np.all(w >= 0.0) and np.all(w <= 1.0)):
        raise ConfigError(
            "weights must lie in [0, 1]",
            hint="normalise each tuple's value f(t) by a public bound W and rescale the release by W",
        )
    ti = _index_array(tuple_idx, "tuple_idx")
    ui = _index_array(user_idx, "user_idx")
    if ti.shape != ui.shape:
        raise ConfigError(
            f"tuple_idx and user_idx must have the same length, got {ti.size} and {ui.size}",
            hint="one entry per pair u ~> t in both arrays",
        )
    n = w.size
    if ti.size and int(ti.max()) >= n:
        raise ConfigError(f"tuple_idx must be < len(weights) = {n}, got {int(ti.max())}")
    if ui.size == 0:
        return JoinTuples(w, ti, ui, 0)
    users, uc = np.unique(ui, return_inverse=True)
    uc = uc.astype(np.int64).reshape(-1)
    key = np.unique(uc * np.int64(n) + ti)  # merge repeated pairs (the incidence is a set)
    return JoinTuples(w, key % n, key // n, int(users.size))


def _positive(x: object, name: str, hint: str) -> float:
    try:
        val = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {x!r}", hint=hint) from None
    if isinstance(x, bool) or not (math.isfinite(val) and val > 0):
        raise ConfigError(f"{name} must be finite and > 0, got {x!r}", hint=hint)
    return val


def _rate(q: object) -> float:
    hint = "q is the Poisson sampling rate of the join tuples, in (0, 1], e.g. q=0.1"
    try:
        val = float(q)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"q must be a number, got {q!r}", hint=hint) from None
    if isinstance(q, bool) or not (0.0 < val <= 1.0):
        raise ConfigError(f"q must be in (0, 1], got {q!r}", hint=hint)
    return val


def _beta(beta: object) -> float:
    hint = "beta is the failure probability of the underestimate guarantee, in (0, 1), e.g. 0.1"
    try:
        val = float(beta)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"beta must be a number, got {beta!r}", hint=hint) from None
    if isinstance(beta, bool) or not (0.0 < val < 1.0):
        raise ConfigError(f"beta must be in (0, 1), got {beta!r}", hint=hint)
    return val


def _max_tuples(delta: object) -> int:
    hint = "max_tuples_per_user (Delta) is the public bound on one user's join tuples, an integer >= 1"
    if isinstance(delta, bool) or not isinstance(delta, (int, np.integer)):
        if isinstance(delta, float) and delta.is_integer():
            delta = int(delta)
        else:
            raise ConfigError(f"max_tuples_per_user must be an integer, got {delta!r}", hint=hint)
    if int(delta) < 1:
        raise ConfigError(f"max_tuples_per_user must be >= 1, got {delta!r}", hint=hint)
    return int(delta)


# ----------------------------------------------------------------------------- truncation LP
def _truncated(jt: JoinTuples, mask: np.ndarray | None, tau: float) -> float:
    """f̄ on the tuples selected by ``mask`` (all if None); ``jt`` already validated."""
    w = jt.weights if mask is None else np.where(mask, jt.weights, 0.0)
    ti, ui = jt.tuple_idx, jt.user_idx
    if mask is not None and ti.size:
        keep = mask[ti]
        ti, ui = ti[keep], ui[keep]
    total = math.fsum(w.tolist())
    if ti.size == 0:
        return total
    load = np.bincount(ui, weights=w[ti], minlength=jt.n_users)
    heavy = load > tau
    if not np.any(heavy):  # fast path: no constraint can bind
        return total
    # Exact reductions: (a) a user with total weight <= tau has a constraint implied by x <= w, so
    # it is dropped, and a tuple touching no remaining (heavy) user sits at x_t = w_t; (b) the
    # tuples whose only heavy user is u enter nothing but u's constraint, so they merge into one
    # variable y_u in [0, sum of their weights].
    hp = heavy[ui]
    ti_h, ui_h = ti[hp], ui[hp]
    lp_tuples, col = np.unique(ti_h, return_inverse=True)
    col = col.reshape(-1)
    heavy_users, row = np.unique(ui_h, return_inverse=True)
    row = row.reshape(-1)
    n_heavy = heavy_users.size
    fixed = total - math.fsum(w[lp_tuples].tolist())
    owners = np.bincount(col, minlength=lp_tuples.size)
    shared_t = owners >= 2
    private_pair = ~shared_t[col]
    merged = np.bincount(row[private_pair], weights=w[lp_tuples[col[private_pair]]], minlength=n_heavy)
    shared_ids = np.flatnonzero(shared_t)
    n_shared = shared_ids.size
    new_col = np.full(lp_tuples.size, -1, dtype=np.int64)
    new_col[shared_ids] = np.arange(n_shared)
    sp_pairs = ~private_pair
    has_merged = np.flatnonzero(merged > 0.0)
    rows = np.concatenate([row[sp_pairs], has_merged])
    cols = np.concatenate([new_col[col[sp_pairs]], n_shared + np.arange(has_merged.size)])
    upper = np.concatenate([w[lp_tuples[shared_ids]], merged[has_merged]])
    n_var = upper.size
    import scipy.sparse as sp  # lazy: only this mechanism solves a linear program
    from scipy.optimize import linprog

    a_ub = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n_heavy, n_var), dtype=np.float64)
    res = linprog(
        c=-np.ones(n_var),
        A_ub=a_ub,
        b_ub=np.full(n_heavy, float(tau)),
        bounds=np.column_stack([np.zeros(n_var), upper]),
        method="highs",
    )
    if res.status != 0:  # pragma: no cover - x = 0 is feasible and the LP is bounded
        raise ExecutionError(f"truncation LP failed: {res.message}")
    val = fixed + float(-res.fun)
    return min(max(val, fixed), total)


def truncated_value(weights: object, tuple_idx: object, user_idx: object, tau: float) -> float:
    """The truncation LP f̄(T, τ) = max Σ x_t s.t. Σ_{t: u⇝t} x_t ≤ τ ∀u, 0 ≤ x_t ≤ w_t (spec §3.2).

    Solved with HiGHS on a sparse constraint matrix, after exact reductions: users whose total
    weight is ≤ τ are dropped (their constraint is implied by x ≤ w), tuples touching no remaining
    user are fixed at w_t, and the tuples whose only remaining user is u are merged into one
    variable bounded by their total weight. If no user's total weight exceeds τ, returns Σ w_t
    without an LP. ``tau`` ≥ 0 (τ = 0 gives the weight of tuples contributed by no user). The result is a
    true (non-private) value: it must only leave through a DP mechanism.
    """
    jt = validate_join_tuples(weights, tuple_idx, user_idx)
    t = _tau_value(tau)
    return _truncated(jt, None, t)


def _tau_value(tau: object) -> float:
    hint = "tau is the truncation threshold, a finite value >= 0"
    try:
        t = float(tau)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"tau must be a number, got {tau!r}", hint=hint) from None
    if isinstance(tau, bool) or not (math.isfinite(t) and t >= 0):
        raise ConfigError(f"tau must be finite and >= 0, got {tau!r}", hint=hint)
    return t


# ----------------------------------------------------------------------------- sampling
def poisson_sample(n: int, q: float, rng: NoiseSource) -> np.ndarray:
    """Boolean mask (n,): each of n tuples kept independently with probability q ∈ (0, 1].

    Uses ``rng.bernoulli`` (U_t < q decided exactly on the sign/magnitude uniform, never 0 or 1).
    q = 1 keeps everything without drawing.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigError(f"n must be an integer >= 0, got {n!r}")
    qq = _rate(q)
    if qq == 1.0 or n == 0:
        return np.ones(int(n), dtype=bool)
    return np.asarray(rng.bernoulli(qq, int(n)), dtype=bool)


# ----------------------------------------------------------------------------- Algorithm 2
@dataclass(frozen=True)
class S4SStep:
    """One run of Algorithm 2 (data independent, from the accounting schedule)."""

    i: int
    tau: float  #: τ_i = 2^{i−1}
    epsilon: float  #: ε_i = ε₀/i (Laplace budget of the run on the sample)
    epsilon_prime: float  #: ε′(ε_i, τ_i, Δ, q), what the run costs (Lemma 3.1)
    laplace_scale: float  #: τ_i/ε_i (the schedule's nominal scale)
    bias: float  #: (τ_i/ε_i)·ln(3L/β)
    snap_lambda: float = 0.0  #: λ_i actually used (snapping), τ_i/λ_i + ξ_i fits ε′_i
    snap_grid: float = 0.0  #: Λ_i, the power-of-two output grid
    snap_bound: float = 0.0  #: B_i, the public clamp


@dataclass(frozen=True)
class S4SResult:
    """Output of :func:`s4s_scalar`. Every field is DP (or public); no true value is kept."""

    estimate: float  #: released value: max(0, max_i f̃_i / q)
    unclamped: float  #: max_i f̃_i / q (also DP; the clamp is post-processing)
    candidates: tuple[float, ...]  #: f̃_i / q in schedule order (i = L … 1), all covered by Σ ε′_i
    steps: tuple[S4SStep, ...]  #: the schedule, i = L … 1
    epsilon: float  #: the budget asked for
    epsilon_spent: float  #: Σ ε′_i (≤ epsilon; the exact sum of the ε′_i floats is ≤ epsilon too)
    q: float
    max_tuples_per_user: int
    beta: float
    tau: float  #: τ of the step attaining the maximum (the chosen threshold)


def _s4s_steps(e: float, delta: int, q: float, beta: float) -> tuple[S4SStep, ...]:
    """The accounting's schedule, with Σ ε′_i ≤ ε checked in exact rational arithmetic.

    Floating subtraction in the schedule can leave the exact sum of the ε′_i one ulp above ε
    (e.g. q = 1, where ε′_i = ε_i). Then the schedule is recomputed for a target a few ulps
    below ε (a change far below the spec vectors' 1e-9 tolerance).
    """
    target = e
    for _ in range(64):
        sched = s4s_budget_schedule(target, delta, q, beta)
        if sum((Fraction(s.epsilon_prime) for s in sched), Fraction(0)) <= Fraction(e):
            out = []
            for s in sched:
                lam, grid, bound = _snapped(float(s.tau), s.epsilon, s.epsilon_prime, delta, q)
                out.append(S4SStep(s.i, float(s.tau), s.epsilon, s.epsilon_prime, s.laplace_scale, s.bias,
                                   lam, grid, bound))
            return tuple(out)
        target = float(np.nextafter(target, 0.0)) * (1.0 - 4.0 * float(np.finfo(float).eps))
    raise ExecutionError(f"DP-S4S schedule overspends epsilon={e!r}")  # pragma: no cover


def _snapped(tau: float, eps_i: float, eps_prime: float, delta: int, q: float) -> tuple[float, float, float]:
    """(λ, Λ, B) of one run: the largest τ/λ with ε′(τ/λ, τ, Δ, q) + ξ ≤ ε′_i (module docstring)."""
    what = "a DP-S4S run"
    k = snapping_exponent(eps_prime / 1000.0, what=what)
    target = eps_prime - snapping_extra(2.0 ** (k + 1))
    if q == 1.0:
        eps_l = target
    else:
        lo, hi = 0.0, eps_i
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            if s4s_epsilon_prime(mid, tau, delta, q) <= target:
                lo = mid
            else:
                hi = mid
        eps_l = lo
    if not eps_l > 0:
        raise ConfigError("epsilon is too small for DP-S4S's floating-point noise", hint="use a larger epsilon")
    lam = tau / eps_l
    grid, bound = snapping_grid(lam, k, integer=False, what=what)
    return lam, grid, bound


def s4s_scalar(
    weights: object,
    tuple_idx: object,
    user_idx: object,
    *,
    epsilon: float,
    max_tuples_per_user: int,
    q: float,
    rng: NoiseSource,
    beta: float = 0.1,
) -> S4SResult:
    """DP-S4S Algorithm 2 (scalar, pure DP): an ε-DP estimate of Σ_t w_t under user-level DP.

    See the module docstring for the privacy argument. ``q = 1`` runs without sampling (then
    ε′_i = ε_i and the schedule is plain basic composition). Raises :class:`ConfigError` on invalid
    parameters or inputs, including a user with more than ``max_tuples_per_user`` distinct tuples
    (a broken contract of the caller's bounding, under which Lemma 3.1 would not hold).
    """
    e = _positive(epsilon, "epsilon", "epsilon is the query's total budget, e.g. epsilon=1.0")
    qq = _rate(q)
    delta = _max_tuples(max_tuples_per_user)
    b = _beta(beta)
    jt = validate_join_tuples(weights, tuple_idx, user_idx)
    if jt.n_users and int(jt.tuples_per_user().max()) > delta:
        raise ConfigError(
            f"a user contributes to more than max_tuples_per_user={delta} join tuples",
            hint="the caller must bound each user's join tuples by the public Delta before DP-S4S",
        )

    steps = _s4s_steps(e, delta, qq, b)
    spent = math.fsum(s.epsilon_prime for s in steps)

    mask = None if qq == 1.0 else poisson_sample(jt.weights.size, qq, rng)
    fbars = np.array([_truncated(jt, mask, s.tau) for s in steps])
    snapped = rng.snap_laplace(
        fbars,
        np.array([s.snap_lambda for s in steps]),
        np.array([s.snap_grid for s in steps]),
        np.array([s.snap_bound for s in steps]),
    )
    cands = [(float(v) - s.bias) / qq for s, v in zip(steps, snapped)]
    best = int(np.argmax(cands))
    raw = float(cands[best])
    return S4SResult(
        estimate=max(0.0, raw),
        unclamped=raw,
        candidates=tuple(float(c) for c in cands),
        steps=steps,
        epsilon=e,
        epsilon_spent=spent,
        q=qq,
        max_tuples_per_user=delta,
        beta=b,
        tau=steps[best].tau,
    )


# ----------------------------------------------------------------------------- R2T
@dataclass(frozen=True)
class R2TResult:
    """Output of :func:`r2t_scalar` (all fields DP or public)."""

    estimate: float  #: max(max_j Q̃_j, f̄(I, 0))
    candidates: tuple[float, ...]  #: Q̃_j, j = 1 … L
    taus: tuple[float, ...]  #: τ_j = 2^j
    laplace_scales: tuple[float, ...]  #: L τ_j/ε (nominal)
    biases: tuple[float, ...]  #: L τ_j ln(L/β)/ε
    epsilon: float
    tau: float  #: τ of the maximising candidate (0.0 if f̄(I, 0) wins)
    snap_lambdas: tuple[float, ...] = ()  #: λ_j actually used: τ_j/λ_j + ξ_j ≤ ε/L


def r2t_scalar(
    weights: object,
    tuple_idx: object,
    user_idx: object,
    *,
    epsilon: float,
    global_sensitivity: float,
    rng: NoiseSource,
    beta: float = 0.1,
) -> R2TResult:
    """R2T (Dong et al. 2022; spec §3.3): the unsampled race over τ_j = 2^j, each run with ε/L.

    ``global_sensitivity`` ≥ 2 is the public bound GS_Q that sets the grid (L = ⌈log₂ GS⌉).
    """
    e = _positive(epsilon, "epsilon", "epsilon is the query's total budget, e.g. epsilon=1.0")
    b = _beta(beta)
    sched = r2t_schedule(e, global_sensitivity, b)  # validates global_sensitivity
    jt = validate_join_tuples(weights, tuple_idx, user_idx)
    share = e / len(sched)
    snaps = [snapping_calibration(float(s.tau), share, integer=False, what="an R2T run") for s in sched]
    fbars = np.array([_truncated(jt, None, float(s.tau)) for s in sched])
    snapped = rng.snap_laplace(
        fbars, np.array([p[0] for p in snaps]), np.array([p[1] for p in snaps]), np.array([p[2] for p in snaps])
    )
    cands = [float(v) - s.bias for s, v in zip(sched, snapped)]
    base = _truncated(jt, None, 0.0)  # sensitivity 0: released exactly
    best = int(np.argmax(cands))
    if cands[best] >= base:
        est, tau = float(cands[best]), float(sched[best].tau)
    else:
        est, tau = base, 0.0
    return R2TResult(
        estimate=est,
        candidates=tuple(float(c) for c in cands),
        taus=tuple(float(s.tau) for s in sched),
        laplace_scales=tuple(s.laplace_scale for s in sched),
        biases=tuple(s.bias for s in sched),
        epsilon=e,
        tau=tau,
        snap_lambdas=tuple(p[0] for p in snaps),
    )
