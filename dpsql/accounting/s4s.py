r"""Privacy accounting for DP-S4S (Qiu, Xiao, Yang, SIGMOD 2026; ``docs/mechanisms.md`` §3) and R2T.

Section numbers § in this module refer to ``docs/mechanisms.md``.

Notation: Δ = ``max_tuples`` (public bound on one user's join tuples), q the Poisson sampling rate,
τ the truncation threshold (non-integer allowed; only ⌊τ⌋ enters the sums), K ∼ Bin(Δ, q),
p_k = P[K = k]. Log-sum-exp is written ⊕.

Lemma 3.1 (amplification by sampling + truncation, pure DP) via Lemma 3.2 (PGF form, O(1))
------------------------------------------------------------------------------------------
    ε′ = ln max{ Σ_{k≤⌊τ⌋} p_k e^{kε/τ} + P[K > τ] e^ε ,  1 / (Σ_{k≤⌊τ⌋} p_k e^{−kε/τ} + P[K > τ] e^{−ε}) }
       = max{ (logcdf(⌊τ⌋; Δ, q₁) + Δ ln A₁) ⊕ (logsf(⌊τ⌋; Δ, q) + ε),
              −[(logcdf(⌊τ⌋; Δ, q₂) + Δ ln A₂) ⊕ (logsf(⌊τ⌋; Δ, q) − ε)] },
    A₁ = 1 + q·expm1(ε/τ),  q₁ = q e^{ε/τ}/A₁,   A₂ = 1 + q·expm1(−ε/τ),  q₂ = q e^{−ε/τ}/A₂
(Σ_{k≤m} C(Δ,k) q^k(1−q)^{Δ−k} e^{kx} = A^Δ·P[Bin(Δ, q e^x/A) ≤ m] with A = 1 − q + q e^x.) The binomial
log-CDF/SF come from ``scipy.stats.binom`` (regularised incomplete beta, fine for Δ up to 1e9); where a
probability is above ½ its log is taken as log1p(−complement) for full relative accuracy, and where a tilted
rate q₁ or q₂ is above ½ the CDF is taken through its mirror P[Bin(Δ, 1 − q_x) ≥ Δ − ⌊τ⌋] with
1 − q_x = (1 − q)/A computed directly (for large ε/τ, q₁ rounds to 1 and the CDF to 0 otherwise); where
that probability still underflows (below e^−700, against a huge A^Δ) and ⌊τ⌋ ≤ 200 000, the terms
p_k e^{±kε/τ} are summed directly in log space (:func:`_log_tilted_sum`); the joint form likewise. ε′ ≤ ε
always (the unsampled mechanism is already ε-DP), so the result is clamped to [0, ε] to absorb rounding.

Lemma 3.5 (RDP amplification)
-----------------------------
    ρ′ = (1/(α−1)) ln( Σ_{k≤⌊τ⌋} p_k exp((α−1)k²ρ/τ²) + P[K > τ]·exp((α−1)ρ) ) ≤ ρ.
No PGF shortcut (k²). The p_k come from ``binom.pmf`` (``binom.logpmf`` subtracts log-gammas and
loses up to 1e-13 relative at Δ = 256, worse for larger Δ). Summed in log space over k ∈ [0, ⌊τ⌋] ∩ [Δq ± (40·sd + 50)]; the probability mass
of the k ≤ ⌊τ⌋ outside that window (below 1e-300 in practice) is added as an upper bound with the
largest factor it could carry, so the result remains a valid upper bound for Δ up to 1e9.

Algorithm 2 schedule (§3.5): grid τ_1 < … < τ_L; for i = L…1: ε_i = ε₀/i, Laplace scale τ_i/ε_i,
bias (τ_i/ε_i)·ln(kL/β), ε₀ ← ε₀ − ε′(ε_i, τ_i, Δ, q). Data independent; Σ ε′_i ≤ ε.
The paper has τ_i = 2^{i−1} ≤ Δ (L = ⌊log₂ Δ⌋ + 1) and k = 3 (``base=2, paper_bias=True``); the
default is the authors' code's b = 5.5 and k = 1 (:data:`DEFAULT_TAU_BASE`) with Δ itself on the grid:
{b^{i−1} : b^{i−1}·√b < Δ} ∪ {Δ} (:func:`s4s_tau_grid`, keyword ``top_at_delta``; ``docs/mechanisms.md``
§3.5 says why: a top below Δ truncates every person to it at any ε). Neither the grid nor the bias
enters the privacy accounting (ε_i, ε′_i depend on the grid only through τ_i and L, and Lemma 3.1
holds for any τ > 0 with the declared Δ, τ = Δ included).

Lemma 4.1 (smooth sensitivity under RDP, §3.8): A = e^{(α−1)ρ/d}; t₁ < 1 < t₂ the roots of
h(t) = t^α − αAt + (α−1)A, solved in the well-conditioned form α·ln t − ln(αt − α + 1) = (α−1)ρ/d
(for t₁ via s = t₁ − (α−1)/α > 0, so that c = 1 − α + α t₁ = α s keeps full relative precision when
it is tiny); γ = ½ ln min(1/t₁, t₂); G(I) = max_{k≥0} (k + B)e^{−γk} ≤ e^{γB−1}/γ;
η_paper = √(α/ρ)/(1 − α + αe^{−2γ}) (Algorithm 4 as published) and the proof's
η_proof = √(α/(ρ(1 − α + αe^{−2γ}))) (smaller; see the erratum remark in §3.8). σ(I) = G(I)·η.

Lemma 4.2 (vector query, Algorithm 5, ε/5 : 4ε/5 split): q′ = 1 − (1 − q)^Δ and
    ε′ = ln(1 + q′(e^{ε/5} − 1)) + [ln(1 + q′(e^{4(α−1)ε/5}δ − 1)) + ln(1/δ)]/(α − 1) ≤ ε,
evaluated with log1p/expm1/logaddexp (no overflow for large (α−1)ε).

Joint accounting of Algorithm 5 (what dpsql charges; :func:`s4s_vector_joint_epsilon`). Lemma 4.2's
proof amplifies the SVT and the release separately and adds the results, but both read **one** sample,
so basic composition (independent randomness) does not apply, and x ↦ f(x) = ln(1 + q′(e^x − 1)) is
superadditive: (1 + q′(e^a − 1))(1 + q′(e^b − 1)) = 1 + q′(e^{a+b} − 1) − q′(1 − q′)(e^a − 1)(e^b − 1).
Two stages that each move their output by e^a, e^b exactly when the person is in the sample lose
f(a + b) > f(a) + f(b) (``tests/test_s4s_vector_joint.py``). Sound instead: compose the un-amplified
stages on a fixed sample and amplify once. On neighbouring samples S, S ∪ T (T one person's sampled
tuples) the SVT is ε₁-DP and, for each stopping τ, the release is (α, ρ)-RDP, hence (ε₂, δ_A)-DP with
ε₂ = ρ + ln(1/δ_A)/(α − 1); by adaptive composition the pair is (ε₁ + ε₂, δ_A) = (ε, δ_A)-DP (and
the parts of a split SUM, on the same sample, compose to (Σε, Σδ_A)). With P the output law on D′ and
Q the law on D given that some of the person's ≤ Δ tuples are sampled (probability q′; otherwise the
sample, hence the output, is distributed as on D′), P_D = (1 − q′)P + q′Q and Q ≈_(ε,δ_A) P (joint
convexity of the hockey-stick divergence over the independent rest of the sample). For every set A,
with e^{ε*} = 1 + q′(e^ε − 1): P_D(A) − e^{ε*}P(A) = q′(Q(A) − e^ε P(A)) ≤ q′δ_A, and, using
Q(A) ≥ e^{−ε}(P(A) − δ_A) and (1 + q′(e^ε − 1))(1 − q′(1 − e^{−ε})) = 1 + q′(1 − q′)(e^ε − 1)²/e^ε ≥ 1,
P(A) − e^{ε*}P_D(A) ≤ e^{ε*−ε}q′δ_A ≤ q′δ_A. So Algorithm 5 is (ln(1 + q′(e^ε − 1)), q′δ_A)-DP.

R2T (Dong et al. 2022; §3.3): τ_j = b^j, j = 1…L, L = ⌈log_b GS⌉; Laplace scale L·τ_j/ε and bias
L·τ_j·ln(L/β)/ε (b = 2 in the paper, 5.5 by default as in the authors' code).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from scipy.special import logsumexp

from dpsql.accounting import _validate as v
from dpsql.errors import ConfigError

__all__ = [
    "s4s_epsilon_prime",
    "s4s_rdp_prime",
    "s4s_joint_epsilon",
    "s4s_joint_rdp",
    "DEFAULT_TAU_BASE",
    "S4SBudgetStep",
    "s4s_budget_schedule",
    "s4s_tau_grid",
    "s4s_grid_size",
    "s4s_rdp_ss_roots",
    "s4s_gamma",
    "s4s_eta",
    "s4s_gamma_eta",
    "s4s_smooth_sensitivity",
    "s4s_smooth_sensitivity_bound",
    "s4s_variance_divergence_term",
    "S4SVectorEpsilon",
    "s4s_vector_epsilon",
    "s4s_vector_epsilon_parts",
    "s4s_find_alpha",
    "s4s_vector_joint_epsilon",
    "R2TStep",
    "r2t_schedule",
]

#: the default base b of the threshold grids τ = b^i (the authors' code; the papers use 2)
DEFAULT_TAU_BASE = 5.5
#: the most thresholds a grid may have: log_b Δ runs, each accounted for (Δ up to 2^64 at b = 2)
MAX_TAU_GRID = 64
#: the largest Δ (one person's join tuples) the accounting takes: 2^63 (64-bit binomial counts)
MAX_TUPLES = 2**63

_RTOL = 4.0 * float(np.finfo(float).eps)
_LOG_HALF = math.log(0.5)


# ----------------------------------------------------------------------------- validation
def _tau(value: object) -> float:
    return v.positive(
        value, "tau", hint="tau is the truncation threshold (> 0; only floor(tau) enters the sums)"
    )


def _max_tuples(value: object) -> int:
    n = v.count(
        value,
        "max_tuples",
        minimum=1,
        hint="max_tuples (Delta) is the public bound on one user's join tuples, >= 1",
    )
    if n > MAX_TUPLES:
        # the binomial tails (scipy) take 64-bit counts, and base 2 reaches 2^63 in MAX_TAU_GRID thresholds
        raise ConfigError(f"max_tuples (Delta) must be at most 2^63 = {MAX_TUPLES}, got {n}",
                          hint="a bound on one person's join tuples above 2^63 bounds nothing; declare smaller degree bounds")
    return n


def _q(value: object) -> float:
    return v.probability(value, "q")


# ----------------------------------------------------------------------------- binomial logs
def _binom_logcdf(k: int, n: int, p: float) -> float:
    """log P[Bin(n, p) ≤ k], accurate also when the probability is close to 1."""
    from scipy.stats import binom  # lazy: scipy.stats takes a second to import

    if k >= n:
        return 0.0
    if k < 0:
        return -math.inf
    lc = float(binom.logcdf(k, n, p))
    if lc > _LOG_HALF:
        lc = math.log1p(-float(binom.sf(k, n, p)))
    return lc


def _binom_logsf(k: int, n: int, p: float) -> float:
    """log P[Bin(n, p) > k], accurate also when the probability is close to 1."""
    from scipy.stats import binom  # lazy: scipy.stats takes a second to import

    if k >= n:
        return -math.inf
    if k < 0:
        return 0.0
    ls = float(binom.logsf(k, n, p))
    if ls > _LOG_HALF:
        ls = math.log1p(-float(binom.cdf(k, n, p)))
    return ls


def _log_chernoff(k: float, n: int, p: float) -> float:
    """−n·KL(k/n ‖ p), the Chernoff bound on log P[Bin(n, p) ≥ k] (k ≥ np) or on log P[Bin(n, p) ≤ k]
    (k ≤ np); made larger by a relative 1e-12 (its own rounding, for n up to 2^63)."""
    x = min(1.0, max(0.0, k / n))
    kl = 0.0
    if x > 0.0:
        kl += x * (math.log(x) - math.log(p))
    if x < 1.0:
        kl += (1.0 - x) * (math.log1p(-x) - math.log1p(-p))
    return min(0.0, -n * max(0.0, kl) * (1.0 - 1e-12))


def _log_tail_bound(k: int, n: int, p: float, *, above: bool) -> float:
    """An upper bound on log P[Bin(n, p) > k] (``above``) or log P[Bin(n, p) ≤ k]: the tail itself
    where it is a positive double, else (a positive tail that underflowed to 0) its Chernoff bound,
    not −inf. For Lemma 3.5's upper bounds, where a tail is multiplied by up to e^{(α−1)ρ}: a tail
    of 1e-400 times e^2000 is not negligible, and reading it as 0 understated ρ′."""
    out = _binom_logsf(k, n, p) if above else _binom_logcdf(k, n, p)
    if out > -math.inf:
        return out
    if (above and not (k < n and p > 0.0)) or (not above and not (k >= 0 and p < 1.0)):
        return -math.inf  # the tail is empty
    return _log_chernoff(k + 1 if above else k, n, p)


#: segments of the Chernoff bound of an underflowed upper tail (:func:`_log_upper_terms`)
_TAIL_SEGMENTS = 256


def _log_upper_terms(lo: int, hi: int, n: int, p: float, factor: Callable[[np.ndarray], np.ndarray]) -> float:
    """An upper bound on log Σ_{lo < k ≤ hi} P[Bin(n, p) = k]·e^{factor(k)}, ``factor`` nondecreasing, lo
    above the mean: ln P[Bin > lo] + factor(hi) where that tail is a positive double (the bound Lemma
    3.5's sums always used), else, in :data:`_TAIL_SEGMENTS` equal segments [a, b], the sum of
    (b − a + 1)·P[Bin ≥ a]·e^{factor(b)} by the Chernoff bound (a single factor(hi) over an
    underflowed tail would be far too loose where it matters: factors in the thousands)."""
    if hi <= lo:
        return -math.inf
    tail = _binom_logsf(lo, n, p)
    if tail > -math.inf:
        return tail + float(factor(np.array([float(hi)]))[0])
    edges = np.unique(np.floor(np.linspace(lo + 1, hi + 1, _TAIL_SEGMENTS + 1)))
    a, b = edges[:-1], edges[1:] - 1.0
    chern = np.array([_log_chernoff(float(x), n, p) for x in a])
    return float(logsumexp(np.log(b - a + 1.0) + chern + factor(b)))


def _binom_logpmf(ks: np.ndarray, n: int, p: float) -> np.ndarray:
    """log P[Bin(n, p) = k]. ``binom.pmf`` (Boost, ~1e-15 relative) where it does not underflow;
    ``binom.logpmf`` (a difference of log-gammas, ~1e-13 relative at n = 256 and far worse for huge n)
    only for the underflowing, negligible terms."""
    from scipy.stats import binom  # lazy: scipy.stats takes a second to import

    pmf = binom.pmf(ks, n, p)
    with np.errstate(divide="ignore"):
        out = np.log(pmf)
    tiny = ~(pmf > 1e-280)
    if np.any(tiny):
        out[tiny] = binom.logpmf(ks[tiny], n, p)
    return out


def _log_a(q: float, x: float) -> float:
    """ln(1 − q + q e^x) = ln E[e^{xB}], B ∼ Bernoulli(q), without the log of 0 that log1p(q·expm1(x)) hits
    when q = 1 and e^x underflows (x below about −37), nor the overflow of e^x (x above about 709)."""
    if x > 30.0:
        return x + math.log(q + (1.0 - q) * math.exp(-x))
    t = q * math.expm1(x)
    if t > -0.5:
        return math.log1p(t)
    return float(np.logaddexp(math.log1p(-q) if q < 1.0 else -math.inf, math.log(q) + x))


def _tilted(q: float, x: float) -> tuple[float, float, float]:
    """(ln A, q_x, 1 − q_x) with A = 1 − q + q e^x and q_x = q e^x/A (the exponentially tilted Bernoulli rate
    of Lemma 3.2), the complement computed as (1 − q)/A rather than by subtraction: for large x, q_x
    rounds to 1 while the probabilities below need 1 − q_x to full relative precision."""
    la = _log_a(q, x)
    qx = min(1.0, q * math.exp(x - la))
    qc = math.exp(math.log1p(-q) - la) if q < 1.0 else 0.0
    return la, qx, min(1.0, qc)


#: the most terms a log-space direct sum takes where a binomial tail underflows (:func:`_log_tilted_sum`)
_DIRECT = 200_000


@functools.lru_cache(maxsize=8)
def _window_terms(w_lo: int, w_hi: int, n: int, p: float, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The α-independent part of Lemma 3.5's window [w_lo, w_hi] (read-only arrays; a schedule
    evaluates one window at dozens of Rényi orders): with ``bins`` = 0 its ks, log P[K = k] and
    zeros; else, in ``bins`` bins [lo, hi], (hi, log of the bin's largest pmf, log of its width)."""
    if not bins:
        ks = np.arange(w_lo, w_hi + 1, dtype=float)
        out = (ks, _binom_logpmf(ks, n, p), np.zeros(0))
    else:
        edges = np.unique(np.floor(np.linspace(w_lo, w_hi + 1, bins + 1)))
        lo_b, hi_b = edges[:-1], edges[1:] - 1.0
        mode = math.floor((n + 1) * p)
        at = np.clip(float(mode), lo_b, hi_b)
        out = (hi_b, _binom_logpmf(at, n, p), np.log(hi_b - lo_b + 1.0))
    for arr in out:
        arr.setflags(write=False)
    return out


def _log_tilted_sum(lo: int, hi: int, n: int, q: float, x: float) -> float:
    """ln Σ_{lo ≤ k ≤ hi} p_k e^{kx}, p_k = P[Bin(n, q) = k], summed term by term in log space (log-gamma
    binomial coefficients, ~1e-13 relative): the fallback where A^n·P[lo ≤ Bin(n, q_x) ≤ hi] underflows in
    its second factor (huge A^n, tiny probability; e.g. ε/τ = 40 at q = 0.001), which would drop the sum."""
    from scipy.special import gammaln

    if q >= 1.0:
        return x * n if lo <= n <= hi else -math.inf
    ks = np.arange(lo, hi + 1, dtype=float)
    terms = gammaln(n + 1.0) - gammaln(ks + 1.0) - gammaln(n - ks + 1.0) + ks * (math.log(q) + x) + (n - ks) * math.log1p(-q)
    return float(logsumexp(terms))


def _tilted_logcdf(k: int, n: int, qx: float, qc: float) -> float:
    """log P[Bin(n, q_x) ≤ k], through the mirror P[Bin(n, 1 − q_x) ≥ n − k] when q_x > ½."""
    if qx > 0.5:
        return _binom_logsf(n - k - 1, n, qc)
    return _binom_logcdf(k, n, qx)


def _lse(*xs: float) -> float:
    m = max(xs)
    if m == -math.inf:
        return -math.inf
    return m + math.log(sum(math.exp(x - m) for x in xs))


# ----------------------------------------------------------------------------- Lemma 3.1 / 3.2
def _eps_prime_branches(e: float, tau: float, n: int, q: float) -> tuple[float, float]:
    """The two arguments of the max in Lemma 3.2 (log of the upper ratio, minus log of the lower)."""
    k = math.floor(tau)
    x = e / tau
    log_sf = _binom_logsf(k, n, q)
    # upper: A1 = 1 − q + q e^x
    la1, q1, c1 = _tilted(q, x)
    lc1 = _tilted_logcdf(k, n, q1, c1)
    t1 = lc1 + n * la1 if lc1 > -700.0 or k > _DIRECT else _log_tilted_sum(0, min(k, n), n, q, x)
    # an underflowed P[K > k] times e^ε (ε in the hundreds) is bounded, not read as 0 (it only raises up)
    up = _lse(t1, _log_tail_bound(k, n, q, above=True) + e)
    la2, q2, c2 = _tilted(q, -x)
    lc2 = _tilted_logcdf(k, n, q2, c2)
    t2 = lc2 + n * la2 if lc2 > -700.0 or k > _DIRECT else _log_tilted_sum(0, min(k, n), n, q, -x)
    lo = -_lse(t2, log_sf - e)
    return up, lo


def s4s_epsilon_prime(epsilon: float, tau: float, max_tuples: int, q: float) -> float:
    """Amplified ε′ of Sample-and-Truncate (DP-S4S Lemma 3.1, via the O(1) PGF form of Lemma 3.2).

    ``epsilon`` ≥ 0 is the Laplace budget on the truncated sample (noise Lap(τ/ε)), ``tau`` > 0 the
    truncation threshold (⌊τ⌋ enters), ``max_tuples`` = Δ ≥ 1, ``q`` ∈ (0, 1] the sampling rate.
    Returns ε′ ∈ [0, ε].
    """
    e = v.epsilon_target(epsilon)
    t = _tau(tau)
    n = _max_tuples(max_tuples)
    qq = _q(q)
    if e == 0.0:
        return 0.0
    up, lo = _eps_prime_branches(e, t, n, qq)
    return min(e, max(0.0, up, lo))


# ----------------------------------------------------------------------------- joint Lemma 3.1
def _taus_item(value: float) -> float:
    return v.positive(value, "taus", hint="each tau is a truncation threshold (> 0; only floor(tau) enters the sums)")


def _floats(values: object, name: str) -> list[float]:
    try:
        arr = np.atleast_1d(np.asarray(values, dtype=float))
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a sequence of numbers, got {values!r}",
                          hint=f"pass {name} as a list of floats, one per run") from None
    if arr.ndim != 1:
        raise ConfigError(f"{name} must be one-dimensional, got shape {arr.shape}", hint=f"pass {name} as a flat list, one per run")
    return [float(x) for x in arr]


def _log_binom_interval(lo: int, hi: int, n: int, p: float) -> float:
    """log P[lo ≤ Bin(n, p) ≤ hi], 0 ≤ lo ≤ hi ≤ n, without cancellation: an interval below the
    mode is cdf(hi) − cdf(lo − 1) (the cdf below the mode is within a factor ~sd of its last pmf
    term), one above it sf(lo − 1) − sf(hi), one holding the mode 1 − cdf(lo − 1) − sf(hi)."""
    if p >= 1.0:
        return 0.0 if hi == n else -math.inf
    if p <= 0.0:
        return 0.0 if lo == 0 else -math.inf
    mode = math.floor((n + 1) * p)
    if hi < mode:
        a = _binom_logcdf(hi, n, p)
        b = _binom_logcdf(lo - 1, n, p)
    elif lo > mode:
        a = _binom_logsf(lo - 1, n, p)
        b = _binom_logsf(hi, n, p)
    else:
        out = _lse(_binom_logcdf(lo - 1, n, p), _binom_logsf(hi, n, p))
        return math.log1p(-math.exp(out)) if out < 0.0 else -math.inf
    if a == -math.inf:
        return -math.inf
    if b >= a:  # below rounding (~1e-16 of the tail): the tail itself bounds it
        return a
    return a + math.log1p(-math.exp(b - a))


def _log_mgf_segments(rates: list[float], taus: list[float], n: int, q: float, sign: float) -> float:
    """ln E[exp(sign·h(K))], h(k) = Σ_i r_i·min(τ_i, k), K ∼ Bin(n, q): h is linear, a + b·k, between
    consecutive ⌊τ_i⌋, and Σ_{lo ≤ k ≤ hi} p_k e^{x k} = A^n·P[lo ≤ Bin(n, q e^x/A) ≤ hi] with
    A = 1 + q·expm1(x) (Lemma 3.2's generating-function step on each piece)."""
    cuts = sorted({min(math.floor(t), n) for t in taus})
    bounds = []
    lo = 0
    for c in cuts:
        if c >= lo:
            bounds.append((lo, c))
            lo = c + 1
    if lo <= n:
        bounds.append((lo, n))
    parts = []
    for lo, hi in bounds:
        a = math.fsum(r * t for r, t in zip(rates, taus) if math.floor(t) < lo)  # saturated: min = τ_i
        b = math.fsum(r for r, t in zip(rates, taus) if math.floor(t) >= hi)  # min = k on the piece
        x = sign * b
        la, qx, qc = _tilted(q, x)
        # an interval of Bin(n, q_x) is the mirrored interval of Bin(n, 1 − q_x), taken when q_x > ½
        lp = _log_binom_interval(n - hi, n - lo, n, qc) if qx > 0.5 else _log_binom_interval(lo, hi, n, qx)
        if lp <= -700.0 and hi - lo < _DIRECT:  # underflowing probability times a huge A^n: sum directly
            parts.append(sign * a + _log_tilted_sum(lo, hi, n, q, x))
            continue
        if lp > -math.inf:
            parts.append(sign * a + n * la + lp)
    return _lse(*parts)


def s4s_joint_epsilon(laplace_rates: object, taus: object, max_tuples: int, q: float) -> float:
    r"""Pure-DP cost of Algorithm 2's L Laplace runs **on one shared sample**, taken jointly.

    Run i releases f̄(S, τ_i) + Lap(1/r_i) (r_i = ``laplace_rates[i]`` = ε_i/τ_i). Lemma 3.1's
    argument applied to the vector of runs (a user whose sample holds k tuples moves run i by at
    most min(τ_i, k), so the output density moves by at most exp(h(k)), h(k) = Σ_i r_i·min(τ_i, k),
    h increasing) gives, with K ∼ Bin(Δ, q),

        ε_joint = ln max{ E[e^{h(K)}], 1/E[e^{−h(K)}] }.

    This is **not** Σ_i ε′_i: the runs share S, so basic composition (which needs independent
    randomness) does not apply, and since every e^{r_i min(τ_i, K)} increases in K, Harris's
    inequality gives E[Π_i e^{…}] ≥ Π_i E[e^{…}]: the upper branch is superadditive. The bound is
    attained on the instance where the user owns Δ unit tuples and no one else has any (outputs
    above every τ_i), so Σ ε′_i can understate the mechanism's ε (e.g. 1.0069 instead of 1 at
    Δ = 64, q = 1/16, base 2). The lower branch is subadditive (all e^{−…} decrease in K).
    Evaluated piecewise in O(L) binomial tails (:func:`_log_mgf_segments`); with one run it equals
    :func:`s4s_epsilon_prime`. Returns a value ≥ 0 (no clamp to Σ ε_i: that is implied).
    """
    rs = [v.nonneg(r, "laplace_rates", hint="each rate is a Laplace budget per unit of sensitivity, >= 0")
          for r in _floats(laplace_rates, "laplace_rates")]
    ts = [_taus_item(t) for t in _floats(taus, "taus")]
    if len(rs) != len(ts) or not rs:
        raise ConfigError("laplace_rates and taus must be non-empty and of the same length", hint="one entry per run in each")
    n = _max_tuples(max_tuples)
    qq = _q(q)
    up = _log_mgf_segments(rs, ts, n, qq, 1.0)
    lo = -_log_mgf_segments(rs, ts, n, qq, -1.0)
    return max(0.0, up, lo)


# ----------------------------------------------------------------------------- Lemma 3.5
#: the most terms of Lemma 3.5's sum evaluated one by one; a wider window is bounded in this many bins
_WINDOW = 200_001

#: a window sum is left out of a log-sum-exp when an upper bound on it is this many nats below the
#: terms it would be added to (e^-50 < 2^-72: the float of every partial sum stays as it is)
_NEGLIGIBLE_NATS = 50.0


def _negligible(bound: float, before: float | None, after: list[float]) -> bool:
    """Whether a term of log at most ``bound``, added to :func:`_lse`'s sum after the term
    ``before`` (None: it would come first) and before the terms ``after``, cannot change the
    sum's float: at least :data:`_NEGLIGIBLE_NATS` below ``before``, or, with no finite ``before``,
    below each finite term of ``after`` (a −inf term adds an exact 0)."""
    if before is not None and math.isfinite(before):
        return bound + _NEGLIGIBLE_NATS < before
    finite = [o for o in after if o > -math.inf]
    return bool(finite) and all(math.isfinite(o) for o in finite) and bound + _NEGLIGIBLE_NATS < min(finite)


def s4s_rdp_prime(alpha: float, rho: float, tau: float, max_tuples: int, q: float, gap: float = 0.0) -> float:
    """Amplified RDP ρ′ of Sample-and-Truncate with Gaussian noise (DP-S4S Lemma 3.5); ρ′ ≤ ρ.

    ``alpha`` > 1 the Rényi order, ``rho`` ≥ 0 the RDP of the unsampled Gaussian release (σ =
    (τ + gap)√(α/(2ρ))), other arguments as in :func:`s4s_epsilon_prime`. ``gap`` ≥ 0 is an
    additive slack on the truncated value (a certified solver gap): the release then moves by at
    most min(τ, k) + gap when the witness has k sampled tuples, and the k-th term of the lemma's
    sum becomes exp((α−1)ρ((k + gap)/(τ + gap))²) (gap = 0 is the lemma as published).
    """

    a = v.alpha_order(alpha)
    r = v.nonneg(rho, "rho", hint="rho is an RDP budget: a finite value >= 0")
    t = _tau(tau)
    n = _max_tuples(max_tuples)
    qq = _q(q)
    gp = v.nonneg(gap, "gap", hint="gap is a certified slack on the truncated value, >= 0")
    if r == 0.0:
        return 0.0
    kmax = min(math.floor(t), n)
    c = (a - 1.0) * r / ((t + gp) * (t + gp))  # exponent per (k + gap)²
    top = (a - 1.0) * r  # exponent of the tail term (sensitivity τ + gap)
    # Σ_k p_k e^{x_k} = 1 + Σ_k p_k·expm1(x_k) (Σ p_k = 1): the parts below bound the logs of the second sum's
    # terms, and ρ′ = log1p(that sum)/(α − 1). (A log-sum-exp of the p_k e^{x_k} themselves rounds the sum to
    # 1 + its tiny part: ρ′ came out up to 1e-5 too small for small exponents.)
    mean = n * qq
    sd = math.sqrt(n * qq * (1.0 - qq))
    w_lo = max(0, math.floor(mean - 40.0 * sd - 50.0))
    w_hi = min(kmax, math.ceil(mean + 40.0 * sd + 50.0))
    if w_hi < w_lo:  # ⌊τ⌋ lies below the bulk: the largest terms are the ones just below ⌊τ⌋
        w_hi = kmax
        w_lo = max(0, kmax - 200_000)
    parts = [_log_tail_bound(kmax, n, qq, above=True) + _log_expm1(top)] if kmax < n else []
    # upper bounds for the k ≤ ⌊τ⌋ outside the window
    outside = []
    if w_lo > 0:
        outside.append(_log_tail_bound(w_lo - 1, n, qq, above=False) + _log_expm1(c * (float(w_lo) + gp) ** 2))
    if w_hi < kmax:
        outside.append(_log_upper_terms(w_hi, kmax, n, qq, lambda k: _log_expm1(c * (k + gp) ** 2)))
    # the window's terms are at most P[K ≤ w_hi]·expm1(c (w_hi + gap)²) together: far below the other
    # terms (⌊τ⌋ deep below the bulk of Bin(Δ, q), the common case for a huge Δ), their sum cannot change
    # the result's float, so it is not evaluated (up to 200 001 binomial terms per call)
    bound = _log_tail_bound(w_hi, n, qq, above=False) + _log_expm1(c * (float(w_hi) + gp) ** 2)
    if not _negligible(bound, parts[0] if parts else None, outside):
        if w_hi - w_lo < _WINDOW:
            ks, lp, _ = _window_terms(w_lo, w_hi, n, qq, 0)
            parts.append(float(logsumexp(lp + _log_expm1(c * (ks + gp) ** 2))))
        else:
            # a huge Delta (the window spans 80 sd of Bin(Delta, q)): bound the window in _WINDOW bins
            # [lo, hi], each by (its width) x (its largest pmf: at the mode clamped into the bin, the pmf
            # being unimodal) x expm1(c (hi + gap)^2), an upper bound on its terms' sum (rho' only grows)
            hi_b, lp, width = _window_terms(w_lo, w_hi, n, qq, _WINDOW)
            parts.append(float(logsumexp(width + lp + _log_expm1(c * (hi_b + gp) ** 2))))
    parts += outside
    total = float(np.logaddexp(0.0, _lse(*parts)))  # ln(1 + Σ p_k expm1(x_k)), accurate for a tiny sum
    return min(r, max(0.0, total / (a - 1.0)))


def _log_expm1(x: float | np.ndarray) -> Any:
    """ln(e^x − 1) for x ≥ 0 (−inf at 0), without overflow for large x nor loss for tiny x."""
    xa = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        out = np.where(xa > 30.0, xa + np.log1p(-np.exp(-np.minimum(xa, 1e300))), np.log(np.expm1(np.minimum(xa, 30.0))))
    return float(out) if out.ndim == 0 else out


def s4s_joint_rdp(alpha: float, rhos: object, taus: object, max_tuples: int, q: float, gaps: object = None) -> float:
    r"""RDP (order α) of Algorithm 2's L Gaussian runs **on one shared sample**, taken jointly.

    Run i releases f̄(S, τ_i) + N(0, σ_i²), σ_i = (τ_i + G_i)√(α/(2ρ_i)) (ρ_i = ``rhos[i]``, G_i =
    ``gaps[i]``, default 0). Lemma 3.5's argument applied to the vector of runs (a user whose sample
    holds k tuples moves run i by at most min(τ_i, k) + G_i, and the Rényi divergence of independent
    Gaussians adds up over the coordinates) gives, with K ∼ Bin(Δ, q),

        ρ_joint = (1/(α−1))·ln E[exp((α−1)·h(K))],   h(k) = Σ_i ρ_i·((min(τ_i, k) + G_i)/(τ_i + G_i))².

    Like the pure-DP case (:func:`s4s_joint_epsilon`), ρ_joint ≥ Σ_i ρ′_i (Harris's inequality:
    every term increases in K), so summing the per-run ρ′_i of Lemma 3.5 can understate the cost.
    Evaluated as :func:`s4s_rdp_prime` does: exact terms over k ∈ [Δq ± (35·sd + 50)] (or, for a
    window wider than 200 001 terms, bins bounded by width × largest pmf × largest factor), the mass
    below the window with the factor at its lower end and above it with the largest factor h(Δ);
    an upper bound. With one run it equals :func:`s4s_rdp_prime`.
    """

    a = v.alpha_order(alpha)
    rs = [v.nonneg(r, "rhos", hint="each rho is an RDP budget, >= 0") for r in _floats(rhos, "rhos")]
    ts = [_taus_item(t) for t in _floats(taus, "taus")]
    gs = ([0.0] * len(ts) if gaps is None else
          [v.nonneg(g, "gaps", hint="gaps are certified slacks, >= 0") for g in _floats(gaps, "gaps")])
    if not (len(rs) == len(ts) == len(gs)) or not rs:
        raise ConfigError("rhos, taus and gaps must be non-empty and of the same length", hint="one entry per run in each")
    n = _max_tuples(max_tuples)
    qq = _q(q)

    def h(k: np.ndarray) -> np.ndarray:
        out = np.zeros_like(k, dtype=float)
        for r, t, g in zip(rs, ts, gs):
            out += (a - 1.0) * r * ((np.where(k <= math.floor(t), k, t) + g) / (t + g)) ** 2  # min(τ, k), k integer
        return out

    mean = n * qq
    sd = math.sqrt(n * qq * (1.0 - qq))
    # ±35 sd: the pmf stays above ~1e-266 there, where Boost's pmf is accurate even for Δ ~ 1e18 (the
    # log-gamma fallback of far-tail terms is not); the mass outside is bounded below
    w_lo = max(0, math.floor(mean - 35.0 * sd - 50.0))
    w_hi = min(n, math.ceil(mean + 35.0 * sd + 50.0))
    parts = []
    if w_hi - w_lo < _WINDOW:
        ks = np.arange(w_lo, w_hi + 1, dtype=float)
        parts.append(float(logsumexp(np.minimum(_binom_logpmf(ks, n, qq), 0.0) + _log_expm1(h(ks)))))
    else:
        edges = np.unique(np.floor(np.linspace(w_lo, w_hi + 1, _WINDOW + 1)))
        lo_b, hi_b = edges[:-1], edges[1:] - 1.0
        mode = math.floor((n + 1) * qq)
        at = np.clip(float(mode), lo_b, hi_b)
        parts.append(float(logsumexp(np.log(hi_b - lo_b + 1.0) + np.minimum(_binom_logpmf(at, n, qq), 0.0)
                                     + _log_expm1(h(hi_b)))))
    if w_lo > 0:
        parts.append(_log_tail_bound(w_lo - 1, n, qq, above=False) + _log_expm1(float(h(np.array([float(w_lo)]))[0])))
    if w_hi < n:
        parts.append(_log_upper_terms(w_hi, n, n, qq, lambda k: _log_expm1(h(k))))
    # parts bound ln of the terms of Σ p_k·expm1(h(k)) = E[e^{h(K)}] − 1 (as in s4s_rdp_prime): ln(1 + it)
    return max(0.0, float(np.logaddexp(0.0, _lse(*parts))) / (a - 1.0))


# ----------------------------------------------------------------------------- Algorithm 2
class S4SBudgetStep(NamedTuple):
    """One iteration of DP-S4S Algorithm 2 (scalar, pure DP)."""

    i: int
    tau: float  #: τ_i of :func:`s4s_tau_grid` (2^{i−1} in the paper; an int for base 2)
    epsilon: float  #: ε_i = ε₀/i, the Laplace budget of this run
    laplace_scale: float  #: τ_i/ε_i
    bias: float  #: (τ_i/ε_i)·ln(kL/β) (k = 3 paper, 1 default), subtracted from the noisy value
    epsilon_prime: float  #: ε′(ε_i, τ_i, Δ, q), what this run really costs
    remaining: float  #: ε₀ after this run


def tau_grid_base(base: object) -> float:
    """Validate the base of the τ grid (2 in the paper; any constant > 1 keeps the analysis)."""
    b = v.real(base, "tau_base", hint="tau_base is the ratio of the threshold grid, e.g. 2 (paper) or 5.5")
    if not (1.0 < b <= 1024.0):
        raise ConfigError(f"tau_base must be in (1, 1024], got {base!r}", hint="use 2 (the paper's grid) or e.g. 5.5")
    return b



def s4s_tau_grid(
    max_tuples: int, base: float = DEFAULT_TAU_BASE, *, top_at_delta: bool = True, keep_near_top: bool = False
) -> tuple[float, ...]:
    """The thresholds τ_1 < … < τ_L of Algorithm 2 (§3.5), ascending; public (Δ and b only).

    ``top_at_delta=True`` (the default grid): the powers b^{i−1} with b^{i−1}·√b < Δ, then Δ itself, so Δ
    is always the top threshold and no person is truncated below Δ tuples by the grid alone. A power
    within a factor √b below Δ is left out (Δ takes its place: a run at nearly the same τ would only
    share ε), so consecutive thresholds differ by a factor between √b and b^{3/2}, and L = ⌈log_b Δ − ½⌉ + 1
    (1 for Δ ≤ √b): the power grid's L, or one more where Δ is at least √b times its top.
    ``keep_near_top=True`` keeps every power below Δ ({b^{i−1} : b^{i−1} < Δ} ∪ {Δ}).
    ``top_at_delta=False`` (the paper's Algorithm 2): τ_i = b^{i−1} ≤ Δ, L = ⌊log_b Δ⌋ + 1, whose top can be
    as low as Δ/b (just above). Every grid is data independent; Lemma 3.1 is evaluated with the
    declared Δ at every τ_i, including τ_L = Δ (where P[K > Δ] = 0).
    """
    n = _max_tuples(max_tuples)
    b = tau_grid_base(base)
    if n > 1 and math.log(n) / math.log(b) > MAX_TAU_GRID - 1:  # L <= log_b Δ + 1
        # a base near 1 made a grid of thousands of runs, each accounted for (minutes of a free explain)
        raise ConfigError(
            f"tau_base={b:.15g} makes about {math.log(n) / math.log(b) + 1:.0f} truncation thresholds for at most {n} "
            f"tuples per person; at most {MAX_TAU_GRID} are allowed",
            hint=f"use tau_base >= {v.shown(n ** (1.0 / (MAX_TAU_GRID - 1)) * (1 + 1e-12), 6, up=True)} (default {DEFAULT_TAU_BASE}, the paper's 2)")
    out: list[float] = []
    i = 0
    while True:
        t = float(1 << i) if b == 2.0 else b**i
        if t > n or (top_at_delta and t >= n):
            break
        if top_at_delta and not keep_near_top and t * t * b >= float(n) * n:  # t·√b ≥ Δ, without a root
            break
        out.append(t)
        i += 1
    if top_at_delta:
        out.append(float(n))
    return tuple(out)


def s4s_grid_size(max_tuples: int, base: float = DEFAULT_TAU_BASE, *, top_at_delta: bool = True) -> int:
    """L, the number of thresholds of :func:`s4s_tau_grid` (⌊log_b Δ⌋ + 1 for the paper's power grid,
    ``top_at_delta=False``; ⌈log_b Δ − ½⌉ + 1 with Δ on top, the default, 1 for Δ ≤ √b)."""
    return len(s4s_tau_grid(max_tuples, base, top_at_delta=top_at_delta))


def s4s_budget_schedule(
    epsilon: float, max_tuples: int, q: float, beta: float = 0.1, base: float = DEFAULT_TAU_BASE,
    *, paper_bias: bool = False, top_at_delta: bool | None = None,
) -> list[S4SBudgetStep]:
    """The data-independent budget schedule of DP-S4S Algorithm 2 (§3.5), i = L down to 1.

    Σ ε′_i ≤ ε: the last run (i = 1) gets the whole remainder. ``base`` b and ``top_at_delta``: the
    grid :func:`s4s_tau_grid` (τ_L = Δ on top of b^{i−1} < Δ by default; ``top_at_delta=False`` the
    paper's τ_i = b^{i−1} ≤ Δ); ``top_at_delta=None`` means ``not paper_bias``, so the paper's
    Algorithm 2 is ``base=2, paper_bias=True`` and the default (the authors' code's base 5.5 and bias,
    with Δ on the grid) is ``base=5.5``. Bias (τ_i/ε_i)·ln(L/β) (the authors' code: β/L per
    candidate), or the paper's ln(3L/β) with ``paper_bias=True``.
    """
    e = v.positive(epsilon, "epsilon", hint="epsilon is the total budget of the query, e.g. epsilon=1.0")
    n = _max_tuples(max_tuples)
    qq = _q(q)
    b = v.probability(beta, "beta", closed_high=False)
    top = (not paper_bias) if top_at_delta is None else bool(top_at_delta)
    grid = s4s_tau_grid(n, base, top_at_delta=top)
    big_l = len(grid)
    log_term = math.log((3.0 if paper_bias else 1.0) * big_l / b)
    eps0 = e
    steps = []
    for i in range(big_l, 0, -1):
        tau_i: float = grid[i - 1]
        if tau_grid_base(base) == 2.0:
            tau_i = int(tau_i)  # powers of 2 and Δ: ints, as in the spec's vectors
        eps_i = eps0 / i
        scale = tau_i / eps_i
        ep = s4s_epsilon_prime(eps_i, tau_i, n, qq)
        eps0 = max(0.0, eps0 - ep)
        steps.append(S4SBudgetStep(i, tau_i, eps_i, scale, scale * log_term, ep, eps0))
    return steps


# ----------------------------------------------------------------------------- Lemma 4.1
def _check_rdp_d(alpha: object, rho: object, d: object) -> tuple[float, float, int]:
    a = v.alpha_order(alpha)
    r = v.positive(rho, "rho", hint="rho is the RDP budget of the release: a finite value > 0")
    dd = v.count(d, "d", minimum=1, hint="d is the dimension of the vector query (a whole number >= 1)")
    return a, r, dd


def _roots(a: float, r: float, d: int) -> tuple[float, float, float]:
    """(s, u₂, κ): t₁ = (α−1)/α + s and t₂ = e^{u₂}, roots of h; κ = (α−1)ρ/d."""
    kappa = (a - 1.0) * r / d
    log_a = math.log(a)

    # t1 = (α−1)/α + s, s ∈ (0, 1/α): h(t1) = 0 ⇔ α·ln(t1) − ln(α s) − κ = 0 (decreasing in s)
    def f1(s: float) -> float:
        return a * math.log1p(s - 1.0 / a) - log_a - math.log(s) - kappa

    s_hi = 1.0 / a
    s_lo = s_hi * 0.5
    while f1(s_lo) <= 0.0:
        s_lo *= 0.5
        if s_lo < 1e-300:  # pragma: no cover - κ > 0 keeps the root away from 0
            break
    from scipy.optimize import brentq  # imported when used: slow to import

    s = float(brentq(f1, s_lo, s_hi, xtol=1e-300, rtol=_RTOL, maxiter=500))

    # t2 = e^u, u > 0: α u − log1p(α expm1(u)) = κ (increasing in u)
    def f2(u: float) -> float:
        return a * u - math.log1p(a * math.expm1(u)) - kappa

    u_hi = (log_a + kappa) / (a - 1.0)  # ln((αA)^{1/(α−1)}): h > 0 there
    u_lo = u_hi * 0.5
    while f2(u_lo) >= 0.0:
        u_lo *= 0.5
        if u_lo < 1e-300:  # pragma: no cover
            break
    u2 = float(brentq(f2, u_lo, u_hi, xtol=1e-300, rtol=_RTOL, maxiter=500))
    return s, u2, kappa


def s4s_rdp_ss_roots(alpha: float, rho: float, d: int) -> tuple[float, float]:
    """The roots t₁ < 1 < t₂ of h(t) = t^α − αAt + (α−1)A, A = e^{(α−1)ρ/d} (DP-S4S Lemma 4.1)."""
    a, r, dd = _check_rdp_d(alpha, rho, d)
    s, u2, _ = _roots(a, r, dd)
    return (a - 1.0) / a + s, math.exp(u2)


def _gamma_and_c(a: float, r: float, d: int) -> tuple[float, float]:
    """γ and c = 1 − α + α e^{−2γ} (> 0), both to full relative precision."""
    s, u2, _ = _roots(a, r, d)
    u1 = -math.log1p(s - 1.0 / a)  # −ln t₁
    if u1 <= u2:
        return 0.5 * u1, a * s
    return 0.5 * u2, 1.0 + a * math.expm1(-u2)


def s4s_gamma(alpha: float, rho: float, d: int) -> float:
    """γ = ½ ln min(1/t₁, t₂) of DP-S4S Lemma 4.1 (the smooth-sensitivity decay for (α, ρ)-RDP in d dims)."""
    a, r, dd = _check_rdp_d(alpha, rho, d)
    return _gamma_and_c(a, r, dd)[0]


def s4s_gamma_eta(alpha: float, rho: float, d: int, form: str = "paper") -> tuple[float, float]:
    """(``s4s_gamma``, ``s4s_eta``) of the same (α, ρ, d), from one solve of the roots of h (each alone solves
    them again): the same two floats, bit for bit, at half the cost (the calibration's scan over α calls both)."""
    a, r, dd = _check_rdp_d(alpha, rho, d)
    f = v.choice(form, "form", ("paper", "proof"))
    gamma, c = _gamma_and_c(a, r, dd)
    return gamma, _eta(a, r, c, f)


def _eta(a: float, r: float, c: float, form: str) -> float:
    if form == "paper":
        return math.sqrt(a / r) / c
    return math.sqrt(a / (r * c))


def s4s_eta(alpha: float, rho: float, d: int, form: str = "paper") -> float:
    """Noise multiplier η with σ(I) = G(I)·η (DP-S4S Lemma 4.1 / Algorithm 4).

    ``form="paper"``: √(α/ρ)/(1 − α + αe^{−2γ}) as published (valid, conservative);
    ``form="proof"``: √(α/(ρ(1 − α + αe^{−2γ}))), what the proof needs (§3.8 remark).
    """
    a, r, dd = _check_rdp_d(alpha, rho, d)
    f = v.choice(form, "form", ("paper", "proof"))
    _, c = _gamma_and_c(a, r, dd)
    return _eta(a, r, c, f)


def s4s_smooth_sensitivity(bound: float, gamma: float) -> tuple[float, int]:
    """G = max_{k≥0} (k + B)·e^{−γk} and the maximising k (DP-S4S Lemma 4.1; B = ``bound`` ≥ 0)."""
    b = v.nonneg(bound, "bound", hint="bound is B(I), an upper bound on the local sensitivity (>= 0)")
    g = v.positive(gamma, "gamma", hint="gamma is the smooth-sensitivity decay (> 0), see s4s_gamma")
    k_star = 1.0 / g - b
    cands = {0}
    if k_star > 0:
        cands.update({math.floor(k_star), math.floor(k_star) + 1})
    best_k = max(sorted(cands), key=lambda k: (k + b) * math.exp(-g * k))
    return (best_k + b) * math.exp(-g * best_k), best_k


def s4s_smooth_sensitivity_bound(bound: float, gamma: float) -> float:
    """The closed-form bound e^{γB−1}/γ ≥ G (valid when 1/γ > B)."""
    b = v.nonneg(bound, "bound")
    g = v.positive(gamma, "gamma")
    return math.exp(g * b - 1.0) / g


def s4s_variance_divergence_term(alpha: float, variance_ratio: float, d: int) -> float:
    """The variance part of D_α(N(μ₁,σ₁²I_d)‖N(μ₂,σ₂²I_d)) at σ₂²/σ₁² = ``variance_ratio`` (Gil et al.):

    d/(2(α−1))·ln(t^α / (1 − α + αt)),  t = σ₂²/σ₁²  (requires 1 − α + αt > 0).

    At t = e^{±2γ} (γ from :func:`s4s_gamma`) it is at most ρ/2, with equality at the binding end.
    """
    a = v.alpha_order(alpha)
    t = v.positive(variance_ratio, "variance_ratio")
    dd = v.count(d, "d", minimum=1)
    denom = 1.0 + a * (t - 1.0)
    if denom <= 0:
        raise ConfigError(
            f"variance_ratio={t!r} is too small for alpha={a!r}: 1 - alpha + alpha*ratio must be > 0",
            hint=f"use variance_ratio > {(a - 1.0) / a:.6g}",
        )
    return dd / (2.0 * (a - 1.0)) * (a * math.log(t) - math.log(denom))


# ----------------------------------------------------------------------------- Lemma 4.2
class S4SVectorEpsilon(NamedTuple):
    q_prime: float  #: 1 − (1 − q)^Δ
    epsilon1: float  #: amplified SVT part, ln(1 + q′(e^{ε/5} − 1))
    epsilon2: float  #: amplified RDP-smooth-sensitivity part
    epsilon_prime: float  #: epsilon1 + epsilon2


def s4s_vector_epsilon_parts(
    epsilon: float, delta: float, alpha: float, q: float, max_tuples: int, svt_share: float = 0.2
) -> S4SVectorEpsilon:
    """DP-S4S Lemma 4.2 with its two parts: Algorithm 5 run with (ε, δ), order α, rate q, bound Δ.

    ``svt_share``: the SVT's part ε₁ = svt_share·ε (the paper: 1/5; its authors' code: 1/10), the release
    getting ε₂ = ε − ε₁. The lemma's proof composes an ε₁-DP SVT with an (α, ρ)-RDP release, ρ = ε₂ −
    ln(1/δ)/(α − 1), each amplified by the sampling at q′; it holds for any split in (0, 1)."""
    e = v.positive(
        epsilon, "epsilon", hint="epsilon is the total budget of the vector query, e.g. epsilon=4.0"
    )
    d = v.delta_target(delta)
    a = v.alpha_order(alpha)
    qq = _q(q)
    n = _max_tuples(max_tuples)
    if not 0.0 < svt_share < 1.0:
        raise ConfigError(f"svt_share must be in (0, 1), got {svt_share!r}", hint="use 0.2 (the paper) or 0.1")
    e2 = (1.0 - svt_share) * e
    a_min = 1.0 + math.log(1.0 / d) / e2
    if not a > a_min:
        raise ConfigError(
            f"alpha={a!r} is too small for epsilon={e!r}, delta={d!r}: Algorithm 5 needs "
            f"rho = (1 - svt_share)*epsilon - ln(1/delta)/(alpha-1) > 0",
            hint=f"use alpha > {a_min:.6g} (s4s_find_alpha picks a good one)",
        )
    log_1mq = n * math.log1p(-qq) if qq < 1.0 else -math.inf  # ln (1 − q′)
    qp = -math.expm1(log_1mq)
    eps1 = math.log1p(qp * math.expm1(svt_share * e))
    x = (a - 1.0) * e2 + math.log(d)  # ln(e^{(α−1)ε₂} δ)
    inner = x if qp >= 1.0 else float(np.logaddexp(log_1mq, math.log(qp) + x))
    eps2 = (inner + math.log(1.0 / d)) / (a - 1.0)
    return S4SVectorEpsilon(qp, eps1, eps2, eps1 + eps2)


def s4s_vector_epsilon(epsilon: float, delta: float, alpha: float, q: float, max_tuples: int) -> float:
    """ε′ of DP-S4S Lemma 4.2 (Algorithm 5 is (ε′, δ)-DP with ε′ ≤ ε)."""
    return s4s_vector_epsilon_parts(epsilon, delta, alpha, q, max_tuples).epsilon_prime


def s4s_vector_joint_epsilon(epsilon: float, q: float, max_tuples: int) -> float:
    """ε* = ln(1 + q′(e^ε − 1)), q′ = 1 − (1 − q)^Δ: Algorithm 5 (all its stages and parts on one sample),
    un-amplified (ε, δ_A)-DP, is (ε*, q′δ_A)-DP (module docstring, "Joint accounting"); ε* ≤ ε."""
    e = v.positive(epsilon, "epsilon", hint="epsilon is the total budget of the vector query, e.g. epsilon=4.0")
    qq = _q(q)
    n = _max_tuples(max_tuples)
    log_1mq = n * math.log1p(-qq) if qq < 1.0 else -math.inf
    qp = -math.expm1(log_1mq)
    if qp >= 1.0:
        return e
    # a charge: rounded up past the few ulps that the log1p/expm1/log evaluations can lose
    if e < 700.0:  # ln(1 + q′(e^ε − 1)) without the cancellation of ln((1 − q′) + q′e^ε) when ε* is small
        return min(e, math.log1p(qp * math.expm1(e)) * (1.0 + 2.0**-44))
    lq = math.log(qp) + e  # no overflow: ln(e^{ln(1 − q′)} + e^{ln q′ + ε}), its error a few ulps of the terms
    return min(e, float(np.logaddexp(log_1mq, lq)) + 2.0**-44 * (abs(log_1mq) + abs(lq)))


def s4s_find_alpha(epsilon2: float, delta: float, d: int) -> float:
    """Rényi order for Algorithm 5 stage 3: minimises the data-independent noise factor η_paper.

    ρ = ε₂ − ln(1/δ)/(α − 1) must be positive, i.e. α > α₀ = 1 + ln(1/δ)/ε₂. As in the paper, a
    doubling search over α − α₀ brackets the minimum of η_paper(α, ρ(α), d); bounded Brent then
    refines it inside the bracket (the paper's "finer scan in (α/2, 2α)").
    """
    e2 = v.positive(
        epsilon2, "epsilon2", hint="epsilon2 is the budget of stage 3 (4*epsilon/5 in Algorithm 5)"
    )
    dl = v.delta_target(delta)
    dd = v.count(d, "d", minimum=1)
    a0 = 1.0 + math.log(1.0 / dl) / e2

    def factor(a: float) -> float:
        r = e2 - math.log(1.0 / dl) / (a - 1.0)
        if r <= 0:
            return math.inf
        try:
            _, c = _gamma_and_c(a, r, dd)
        except ValueError:  # the roots of Lemma 4.1 leave double precision (a very large epsilon2)
            raise ConfigError("the Renyi accounting of the smooth-sensitivity noise cannot be solved in double "
                              f"precision at so large an epsilon (this stage's share: {e2:g})",
                              hint="use a smaller epsilon (below 10 usually fits)") from None
        return math.sqrt(a / r) / c

    x = 1.0
    prev_x, prev = x, factor(a0 + x)
    while True:
        nx = 2.0 * prev_x
        val = factor(a0 + nx)
        if not val < prev or nx > 1e12:
            break
        prev_x, prev = nx, val
    lo = a0 + prev_x / 2.0 if prev_x > 1.0 else a0 + 1e-9 * max(1.0, a0)
    hi = a0 + 2.0 * prev_x
    from scipy.optimize import minimize_scalar  # imported when used: slow to import

    res = minimize_scalar(factor, bounds=(lo, hi), method="bounded", options={"xatol": 1e-9 * hi})
    best = float(res.x)
    if factor(best) > prev:
        best = a0 + prev_x
    return best


# ----------------------------------------------------------------------------- R2T
class R2TStep(NamedTuple):
    tau: float  #: τ_j = b^j (2^j by default; an int then)
    laplace_scale: float  #: L·τ_j/ε
    bias: float  #: L·τ_j·ln(L/β)/ε


def r2t_schedule(
    epsilon: float, global_sensitivity: float, beta: float = 0.1, base: float = DEFAULT_TAU_BASE
) -> list[R2TStep]:
    """R2T's thresholds, Laplace scales and biases (Dong et al. 2022; §3.3): j = 1…L, L = ⌈log_b GS⌉.

    τ_j = b^j and L the least j with b^j ≥ GS; b = 2 is the paper (``base=2``), the default 5.5
    the authors' code.
    """
    e = v.positive(epsilon, "epsilon", hint="epsilon is the query's budget, e.g. epsilon=1.0")
    gs = v.real(global_sensitivity, "global_sensitivity")
    if not gs >= 2:
        raise ConfigError(
            f"global_sensitivity must be >= 2, got {global_sensitivity!r}",
            hint="R2T needs a public bound GS_Q >= 2 on the query's global sensitivity",
        )
    b = v.probability(beta, "beta", closed_high=False)
    bb = tau_grid_base(base)
    if math.log(gs) / math.log(bb) > MAX_TAU_GRID:  # L = ⌈log_b GS⌉ runs, each a truncation
        raise ConfigError(
            f"tau_base={bb:.15g} makes about {math.log(gs) / math.log(bb):.0f} R2T thresholds for a global sensitivity "
            f"of {gs:.6g}; at most {MAX_TAU_GRID} are allowed",
            hint=f"use tau_base >= {v.shown(gs ** (1.0 / MAX_TAU_GRID) * (1 + 1e-12), 6, up=True)} (default {DEFAULT_TAU_BASE}, the paper's 2)")
    if bb == 2.0:
        big_l = max(1, math.ceil(math.log2(gs) - 1e-12))
    else:
        big_l = 1
        while bb**big_l < gs:
            big_l += 1
    log_term = math.log(big_l / b)
    out = []
    for j in range(1, big_l + 1):
        tau_j: float = (1 << j) if bb == 2.0 else bb**j
        scale = big_l * tau_j / e
        out.append(R2TStep(tau_j, scale, scale * log_term))
    return out
