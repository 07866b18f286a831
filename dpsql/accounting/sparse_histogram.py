r"""Exact privacy accounting of the Gaussian sparse histogram mechanism (GSHM).

Section numbers § in this module refer to ``docs/mechanisms.md``.

Mechanism (§1.1; Wilkins, Kifer, Zhang, Karrer, JPC 2024, Algorithm 1)
-----------------------------------------------------------------------
Every user touches at most C_u = ``max_groups`` groups, once each. A group with true count
C ≥ τ is released iff C + N(0, σ²) ≥ τ*; extra aggregate columns of a released group get
Gaussian noise whose per-group Mahalanobis sensitivity is μ_o (``mu_other``; 0 for a
count-only histogram). Only the margin Δτ = τ* − τ and σ enter the accounting.

Exact δ(ε) — Theorem 5.4 as derived in §1.5
--------------------------------------------
With P = Φ(Δτ/σ) (probability that a row sitting exactly at the threshold is suppressed),
μ_k = √(k·(1/σ² + μ_o²)) and δ_G the exact Gaussian profile (:mod:`.gaussian`):

    δ(ε) = max{ 1 − P^{C_u},                                             "infinite"
                max_{a=0}^{C_u−1} 1 − P^a + P^a·δ_G(ε − a·ln P; μ_{C_u−a}),  "remove-direction"
                max_{a=0}^{C_u−1} δ_G(ε + a·ln P; μ_{C_u−a}) }              "add-direction"

(a is the number a₌ of the user's rows that sit exactly at the deterministic threshold). The
a = 0 term is δ_Gaussian = δ_G(ε; μ_{C_u}); the first term is δ_infinite. Corollary (§1.6):
max(δ_infinite, δ_Gaussian) ≤ δ(ε) ≤ δ_infinite + δ_Gaussian = "add the deltas" (§1.3,
Wilson et al.), :func:`add_the_deltas_delta`. The theorem is stated for ε ≥ 0 (Lemma 5.2's
comparison of the two directions needs e^ε ≥ 1), so ε must be ≥ 0 here.

Numerics
--------
All powers of P are taken in log space: ln P = ``log_ndtr(Δτ/σ)`` (accurate also when P is
within 1e-16 of 1), P^a = exp(a·ln P), 1 − P^a(1 − g) = −expm1(a·ln P + log1p(−g)).

Speed (C_u = 51,914 evaluates in well under a millisecond): the a-terms are monotone in a on
each factor — P^a and δ_G(ε − a ln P; μ_{C_u−a}) decrease with a, and so does μ_{C_u−a}, while
the argument ε + a ln P of the add-direction terms decreases — so on a block [lo, hi] of a-values

    remove-direction term ≤ 1 − P^{hi}·(1 − δ_G(ε − lo·ln P; μ_{C_u−lo}))
    add-direction term    ≤ δ_G(ε + hi·ln P; μ_{C_u−lo}).

The evaluation is an exact branch and bound: the terms are computed at the ends of ~√C_u blocks,
blocks whose bound cannot exceed the best value found are discarded, and the surviving blocks are
evaluated in full. A cheap vectorised δ_G (direct erfcx difference, with a rigorous error bound)
is used for the screening, and every term that can still be the maximum (given that error bound)
is recomputed with the accurate :func:`.gaussian.log_gaussian_delta`. The result therefore equals
the brute-force maximum over all 2·C_u + 1 terms (tests compare the two), to ~1e-13 relative.

Minimal threshold (§1.8)
------------------------
δ(ε) is non-increasing in Δτ. The closed form Δτ_LB = σ·Φ⁻¹((1 − δ)^{1/C_u}) (computed as
−σ·Φ⁻¹(−expm1(log1p(−δ)/C_u))) is a lower bound, attained whenever the Gaussian part does not
bind (the usual case); otherwise the least Δτ is found by Brent's method between Δτ_LB and the
add-the-deltas margin Δτ_add = σ·Φ⁻¹((1 − δ + δ_Gaussian)^{1/C_u}) (an upper bound since the
exact δ is at most the add-the-deltas δ), to ~1e-15 relative, and then moved to the safe side.
The target is met with the evaluated δ at most δ·(1 − ``DELTA_EVAL_MARGIN``) (2⁻³³, from
:mod:`.gaussian`): the δ_G terms are evaluated to ~1e-12 relative, and the exact δ must not
exceed δ. (The least τ* is thus that of δ·(1 − 2⁻³³): e.g. 3.8e-6 above the add-the-deltas
margin 15 491.379058 of the case study at σ = 2230, where δ − δ_Gaussian is 1% of δ.)
If δ_Gaussian > δ no threshold can help and ``math.inf`` is returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.special import erf, erfcx, log_ndtr, ndtri

from dpsql.accounting import _validate as v
from dpsql.accounting.gaussian import DELTA_EVAL_MARGIN, _expm1_times_ndtr, _log_delta_core
from dpsql.errors import ConfigError

__all__ = [
    "SparseHistogramDelta",
    "sparse_histogram_delta",
    "sparse_histogram_delta_detail",
    "add_the_deltas_delta",
    "sparse_histogram_min_tau_star",
    "sparse_histogram_tau_star_lower_bound",
    "round_tau_star_up",
]

_SQRT2 = math.sqrt(2.0)
_RTOL = 4.0 * float(np.finfo(float).eps)
# Relative error allowance of the cheap screening evaluation (generous: erfcx/erf/exp are
# accurate to a few ulps; the a²/2 exponent contributes ~4e-16·a² on top).
_SCREEN_REL = 1e-13
_BRUTE_FORCE_MAX = 2048  # below this many groups, skip the blocking and screen every term


class SparseHistogramDelta(NamedTuple):
    """The exact δ(ε) with the term that attains it (see module docstring)."""

    delta: float
    branch: str  # "infinite" | "remove-direction" | "add-direction"
    a_equal: int  # a₌: rows at the threshold in the worst case (C_u for "infinite")
    delta_infinite: float
    delta_gaussian: float


# ----------------------------------------------------------------------------- validation
def _check_common(epsilon, sigma, tau, tau_star, max_groups, mu_other):
    e = v.epsilon_target(epsilon)
    s = v.positive(sigma, "sigma", hint="sigma is the std of the Gaussian noise on counts; pass sigma > 0")
    t = v.count(
        tau,
        "tau",
        minimum=1,
        hint="tau is the deterministic threshold on the true (integer) count: a whole number >= 1",
    )
    ts = v.real(tau_star, "tau_star", hint="tau_star is the noisy threshold, a finite number (usually > tau)")
    c = v.count(
        max_groups,
        "max_groups",
        minimum=1,
        hint="max_groups (C_u) is the per-user group bound: a whole number >= 1",
    )
    mo = v.nonneg(
        mu_other,
        "mu_other",
        hint="mu_other is the per-group Mahalanobis sensitivity of the extra columns (0 if none)",
    )
    return e, s, t, ts, c, mo


# ----------------------------------------------------------------------------- core
def _mu_row(sigma: float, mu_other: float) -> float:
    """μ₁ = √(1/σ² + μ_o²), one row's μ (μ_k = √k·μ₁), without squaring: 1/σ² underflows to 0 for σ above
    ~1.3e154 (ε and δ near 1e-160), where μ₁ ≈ 1/σ is still a normal double and δ_G(ε; μ) is not negligible."""
    return math.hypot(1.0 / sigma, mu_other)


def _cheap_delta_g(eps: np.ndarray, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """δ_G(ε; μ) for arrays (μ > 0) by the fast direct forms, with an absolute error bound."""
    has_neg = eps.min() < 0
    e_abs = np.abs(eps) if has_neg else eps
    a = 0.5 * mu - e_abs / mu
    if a.max() <= 0:  # common case: every ε ≥ μ²/2
        g, err = _cheap_lower(a, mu)
    elif a.min() > 0:
        g, err = _cheap_upper_branch(a, mu, e_abs)
    else:
        g = np.empty_like(eps)
        err = np.empty_like(eps)
        up = a > 0
        lo = ~up
        g[up], err[up] = _cheap_upper_branch(a[up], mu[up], e_abs[up])
        g[lo], err[lo] = _cheap_lower(a[lo], mu[lo])
    if has_neg:
        neg = eps < 0
        en = eps[neg]
        w = np.exp(en)
        g[neg] = -np.expm1(en) + w * g[neg]
        err[neg] = w * err[neg] + 1e-15 * g[neg]
    return g, err


def _cheap_upper_branch(a: np.ndarray, mu: np.ndarray, e_abs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """0 ≤ ε < μ²/2: ½[erf(a/√2) − erf(b/√2)] − expm1(ε)Φ(b) (no cancellation)."""
    b = a - mu
    val = 0.5 * (erf(a / _SQRT2) - erf(b / _SQRT2)) - _expm1_times_ndtr(e_abs, b)
    return np.maximum(val, 0.0), _SCREEN_REL * np.abs(val)


def _cheap_lower(a: np.ndarray, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ε ≥ μ²/2: ½e^{−a²/2}[erfcx(x₁) − erfcx(x₁ + μ/√2)] by direct difference (error bounded)."""
    x1 = a / -_SQRT2
    e1 = erfcx(x1)
    d = e1 - erfcx(x1 + mu / _SQRT2)
    scale = 0.5 * np.exp(-0.5 * a * a)
    g = scale * np.maximum(d, 0.0)
    err = scale * (_SCREEN_REL * e1) + g * (4e-16 * a * a)
    return g, err


def _remove_term(la: np.ndarray, g: np.ndarray) -> np.ndarray:
    """1 − P^a (1 − g) = −expm1(a ln P + log1p(−g)), exact in log space (1 when g = 1)."""
    with np.errstate(divide="ignore"):
        return -np.expm1(la + np.log1p(-np.minimum(g, 1.0)))


def _accurate_delta_g(eps: np.ndarray, mu: np.ndarray) -> np.ndarray:
    return np.exp(_log_delta_core(eps, mu))


def _t1_accurate(eps, lnp, m1, c, a):  # m1: the row's μ₁ (_mu_row)
    a = a.astype(float)
    la = a * lnp
    g1 = _accurate_delta_g(eps - la, np.sqrt(c - a) * m1)
    return _remove_term(la, g1)


def _t2_accurate(eps, lnp, m1, c, a):
    a = a.astype(float)
    return _accurate_delta_g(eps + a * lnp, np.sqrt(c - a) * m1)


def _screen(eps: float, lnp: float, m1: float, c: int, d_inf: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices a ≥ 1 of the remove- and add-direction terms that may attain the maximum.

    Term values come from the cheap δ_G with certified error bounds; a term is dropped only if
    its upper bound is below a certified lower bound on the maximum (which is seeded with
    δ_infinite and the a = 0 term δ_Gaussian, both handled by the caller).
    """
    empty = np.empty(0, dtype=np.int64)
    if c == 1:
        return empty, empty
    if c <= _BRUTE_FORCE_MAX:
        pts = np.arange(0, c)
        blocks = False
    else:
        bsize = int(math.isqrt(c - 1)) + 1
        pts = np.arange(0, c, bsize)
        if pts[-1] != c - 1:
            pts = np.append(pts, c - 1)
        blocks = True
    n = pts.size
    af = pts.astype(float)
    la = af * lnp
    mu = np.sqrt(c - af) * m1
    if blocks:
        lo, hi = pts[:-1], pts[1:]
        # one cheap call: remove-direction at pts, add-direction at pts, add-direction block bounds
        e_args = np.concatenate((eps - la, eps + la, eps + hi * lnp))
        m_args = np.concatenate((mu, mu, mu[:-1]))
    else:
        e_args = np.concatenate((eps - la, eps + la))
        m_args = np.concatenate((mu, mu))
    g, err = _cheap_delta_g(e_args, m_args)
    g1, eg1 = g[:n], err[:n]
    t1 = _remove_term(la, g1)
    e1 = eg1 + 1e-15 * t1  # |∂t1/∂g1| = P^a ≤ 1, plus rounding of expm1/log1p
    t2, e2 = g[n : 2 * n], err[n : 2 * n]
    best = max(d_inf, float(np.max(t1 - e1)), float(np.max(t2 - e2)))
    if blocks:
        # remove-direction terms on [lo, hi] are <= 1 − P^hi (1 − g1(lo)); add-direction terms
        # are <= δ_G(ε + hi ln P; μ_{C−lo}) (see module docstring)
        g1_up = np.minimum(g1[:-1] + eg1[:-1], 1.0)
        ub1 = _remove_term(hi * lnp, g1_up) * (1.0 + 1e-14)
        ub2 = g[2 * n :] + err[2 * n :]
        keep1 = np.nonzero((ub1 >= best) & (ub1 > 0))[0]
        keep2 = np.nonzero((ub2 >= best) & (ub2 > 0))[0]
        in1 = _block_interiors(lo, hi, keep1)
        in2 = _block_interiors(lo, hi, keep2)
        if in1.size or in2.size:
            f1, f2 = in1.astype(float), in2.astype(float)
            l1, l2 = f1 * lnp, f2 * lnp
            g, err = _cheap_delta_g(
                np.concatenate((eps - l1, eps + l2)),
                np.sqrt(np.concatenate((c - f1, c - f2))) * m1,
            )
            k = in1.size
            ti1 = _remove_term(l1, g[:k])
            ei1 = err[:k] + 1e-15 * ti1
            ti2, ei2 = g[k:], err[k:]
            if k:
                best = max(best, float(np.max(ti1 - ei1)))
            if in2.size:
                best = max(best, float(np.max(ti2 - ei2)))
            pts1 = np.concatenate((pts, in1))
            pts2 = np.concatenate((pts, in2))
            t1, e1 = np.concatenate((t1, ti1)), np.concatenate((e1, ei1))
            t2, e2 = np.concatenate((t2, ti2)), np.concatenate((e2, ei2))
        else:
            pts1 = pts2 = pts
    else:
        pts1 = pts2 = pts
    # (a term whose upper bound is 0 underflows in every evaluation: it cannot raise the maximum)
    c1 = pts1[(t1 + e1 >= best) & (t1 + e1 > 0) & (pts1 > 0)]
    c2 = pts2[(t2 + e2 >= best) & (t2 + e2 > 0) & (pts2 > 0)]
    return c1, c2


def _block_interiors(lo: np.ndarray, hi: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Concatenated open intervals (lo[j], hi[j]) for j in keep."""
    if keep.size == 0:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(lo[j] + 1, hi[j]) for j in keep])


def _exact(eps: float, sigma: float, dtau: float, c: int, mu_other: float) -> SparseHistogramDelta:
    lnp = float(log_ndtr(dtau / sigma))
    m1 = _mu_row(sigma, mu_other)
    d_inf = float(-np.expm1(c * lnp))
    mu_c = math.sqrt(c) * m1
    if d_inf >= 1.0:  # a configuration with an at-threshold row is released surely: δ = 1
        d_gauss = float(_accurate_delta_g(np.array([eps]), np.array([mu_c]))[0])
        return SparseHistogramDelta(1.0, "infinite", c, d_inf, d_gauss)
    idx1, idx2 = _screen(eps, lnp, m1, c, d_inf)
    # one accurate call: the a = 0 term, remove-direction candidates, add-direction candidates
    f1, f2 = idx1.astype(float), idx2.astype(float)
    l1, l2 = f1 * lnp, f2 * lnp
    g = _accurate_delta_g(
        np.concatenate(([eps], eps - l1, eps + l2)),
        np.sqrt(np.concatenate(([float(c)], c - f1, c - f2))) * m1,
    )
    d_gauss = float(g[0])
    k = idx1.size
    t1 = _remove_term(l1, g[1 : 1 + k])
    t2 = g[1 + k :]
    # ties go to the a = 0 term (remove-direction), then remove, add, infinite
    best, branch, arg = d_gauss, "remove-direction", 0
    if d_inf > best:
        best, branch, arg = d_inf, "infinite", c
    if t1.size:
        j = int(np.argmax(t1))
        if t1[j] > best:
            best, branch, arg = float(t1[j]), "remove-direction", int(idx1[j])
    if t2.size:
        j = int(np.argmax(t2))
        if t2[j] > best:
            best, branch, arg = float(t2[j]), "add-direction", int(idx2[j])
    return SparseHistogramDelta(best, branch, arg, d_inf, d_gauss)


def _exact_bruteforce(eps: float, sigma: float, dtau: float, c: int, mu_other: float) -> float:
    """Reference: every term evaluated with the accurate δ_G (O(C_u); used by the tests)."""
    lnp = float(log_ndtr(dtau / sigma))
    m1 = _mu_row(sigma, mu_other)
    a = np.arange(c)
    t1 = _t1_accurate(eps, lnp, m1, c, a)
    t2 = _t2_accurate(eps, lnp, m1, c, a)
    return max(float(-np.expm1(c * lnp)), float(t1.max()), float(t2.max()))


# ----------------------------------------------------------------------------- public
def sparse_histogram_delta_detail(
    epsilon: float, *, sigma: float, tau: int, tau_star: float, max_groups: int, mu_other: float = 0.0
) -> SparseHistogramDelta:
    """Exact δ(ε) of the GSHM (Theorem 5.4) together with the attaining term and both bounds."""
    e, s, t, ts, c, mo = _check_common(epsilon, sigma, tau, tau_star, max_groups, mu_other)
    return _exact(e, s, ts - t, c, mo)


def sparse_histogram_delta(
    epsilon: float, *, sigma: float, tau: int, tau_star: float, max_groups: int, mu_other: float = 0.0
) -> float:
    """Exact δ(ε) of the Gaussian sparse histogram mechanism (Wilkins et al. Theorem 5.4, §1.5).

    ``epsilon`` ≥ 0; ``sigma`` > 0 is the count noise std; ``tau`` (integer ≥ 1) the deterministic
    threshold on true counts; ``tau_star`` the noisy threshold; ``max_groups`` = C_u the per-user
    group bound; ``mu_other`` ≥ 0 the per-group sensitivity (Mahalanobis, in noise-std units) of
    any extra noisy columns.
    """
    return sparse_histogram_delta_detail(
        epsilon, sigma=sigma, tau=tau, tau_star=tau_star, max_groups=max_groups, mu_other=mu_other
    ).delta


def add_the_deltas_delta(
    epsilon: float, *, sigma: float, tau: int, tau_star: float, max_groups: int, mu_other: float = 0.0
) -> float:
    """The "add the deltas" bound δ_G(ε; μ_{C_u}) + 1 − P^{C_u} (Wilson et al.; §1.3).

    An upper bound on :func:`sparse_histogram_delta` (the extra columns enter through μ_{C_u}).
    The plain sum is returned, so the value can exceed 1 (a vacuous bound) for tiny thresholds.
    """
    e, s, t, ts, c, mo = _check_common(epsilon, sigma, tau, tau_star, max_groups, mu_other)
    lnp = float(log_ndtr((ts - t) / s))
    mu_c = math.sqrt(c) * _mu_row(s, mo)
    d_g = float(_accurate_delta_g(np.array([e]), np.array([mu_c]))[0])
    return d_g + float(-np.expm1(c * lnp))


def _dtau_closed_form(sigma: float, delta_inf: float, c: int) -> float:
    """σ·Φ⁻¹((1 − δ_inf)^{1/C}): the margin at which 1 − P^C = δ_inf exactly."""
    if delta_inf <= 0.0:
        return math.inf
    if delta_inf >= 1.0:
        return -math.inf
    p = -math.expm1(math.log1p(-delta_inf) / c)  # 1 − (1 − δ_inf)^{1/C}
    return -sigma * float(ndtri(p))


def sparse_histogram_tau_star_lower_bound(delta: float, *, sigma: float, tau: int, max_groups: int) -> float:
    """Closed-form lower bound τ + σ·Φ⁻¹((1 − δ)^{1/C_u}) on the least τ* (§1.8)."""
    d = v.delta_target(delta)
    s = v.positive(sigma, "sigma")
    t = v.count(tau, "tau", minimum=1)
    c = v.count(max_groups, "max_groups", minimum=1)
    return t + _dtau_closed_form(s, d, c)


def _min_tau_star(e: float, d: float, s: float, t: int, c: int, mo: float, method: str) -> float:
    # the evaluated δ must meet δ·(1 − margin): its evaluation errs by up to ~1e-12 relative (the
    # δ_G terms, ``dpsql.accounting.gaussian``), and the exact δ must not exceed the target
    # (both accountings alike, so that the exact τ* stays below the add-the-deltas one)
    d = d * (1.0 - DELTA_EVAL_MARGIN)
    mu_c = math.sqrt(c) * _mu_row(s, mo)
    d_g = float(_accurate_delta_g(np.array([e]), np.array([mu_c]))[0])
    if d_g > d:
        return math.inf

    if method == "add_the_deltas":

        def delta_add(ts: float) -> float:
            return d_g + float(-np.expm1(c * float(log_ndtr((ts - t) / s))))

        dtau = _dtau_closed_form(s, d - d_g, c)
        if not math.isfinite(dtau):
            return math.inf
        return _nudge_up(t + dtau, delta_add, d)

    def delta_at(ts: float) -> float:
        return _exact(e, s, ts - t, c, mo).delta

    lb = _dtau_closed_form(s, d, c)
    # Usually the closed-form lower bound is attained: check it and the next few floats (the
    # bound itself can miss by an ulp of rounding) before searching.
    x = t + lb
    for _ in range(8):
        if delta_at(x) <= d:
            return x
        x = float(np.nextafter(x, math.inf))
    lb = x - t
    hi = _dtau_closed_form(s, d - d_g, c) if d_g < d else math.inf
    if not math.isfinite(hi) or delta_at(t + hi) > d:
        # Rare: no closed-form upper end (δ_Gaussian == δ, or rounding). Expand geometrically
        # until P = 1 in floating point (Δτ ≥ 40σ), where δ = δ_Gaussian ≤ δ.
        hi = max(lb, s)
        while delta_at(t + hi) > d:
            if hi >= 40.0 * s:
                return math.inf
            hi = min(2.0 * hi, 40.0 * s)
    return _least_feasible(delta_at, t + lb, t + hi, d)


def _least_feasible(delta_at: Callable[[float], float], lo: float, hi: float, d: float) -> float:
    """Least x in [lo, hi] with delta_at(x) ≤ d, for a continuous non-increasing delta_at with
    delta_at(hi) ≤ d: Brent's method on log delta_at − log d to ~1e-13 relative, then the
    smallest float on the feasible side (:func:`_nudge_up`)."""
    if delta_at(lo) <= d:
        return lo
    log_d = math.log(d)

    def f(x: float) -> float:
        val = delta_at(x)
        return max(math.log(val), log_d - 700.0) - log_d if val > 0 else -700.0

    from scipy.optimize import brentq  # imported when used: slow to import

    root = float(brentq(f, lo, hi, xtol=1e-13 * max(1.0, abs(hi)), rtol=_RTOL, maxiter=200))
    return _nudge_up(root, delta_at, d)


def _nudge_up(ts: float, delta_at: Callable[[float], float], d: float) -> float:
    """Smallest float ≥ ts (searching upwards by ulps, then by relative steps) meeting δ ≤ d."""
    if delta_at(ts) <= d:
        return ts
    x = ts
    for _ in range(64):
        x = float(np.nextafter(x, math.inf))
        if delta_at(x) <= d:
            return x
    step = 1e-13 * max(1.0, abs(ts))
    for _ in range(200):
        x += step
        if delta_at(x) <= d:
            return x
        step *= 2.0
    raise ConfigError(  # pragma: no cover - δ is non-increasing in τ*; cannot happen
        "could not find a noisy threshold meeting the target delta",
        hint="report this as a bug with the parameters used",
    )


def sparse_histogram_min_tau_star(
    epsilon: float,
    delta: float,
    *,
    sigma: float,
    tau: int,
    max_groups: int,
    mu_other: float = 0.0,
    method: str = "exact",
) -> float:
    """Least noisy threshold τ* (a float, τ + Δτ) with δ(ε) ≤ δ at this σ; ``math.inf`` if none.

    ``method="exact"`` uses Theorem 5.4, ``method="add_the_deltas"`` the Wilson et al. bound.
    ``math.inf`` means the Gaussian part δ_G(ε; μ_{C_u}) alone already exceeds δ: increase σ.
    The returned τ* satisfies the target with the evaluated δ at most δ·(1 − ``DELTA_EVAL_MARGIN``)
    (so the exact δ is at most δ); τ*·(1 − 1e-9) does not meet δ·(1 − margin) (unless τ* is infinite).
    Rounding τ* up to a grid (e.g. integers) is the caller's job: see :func:`round_tau_star_up`.
    """
    e = v.epsilon_target(epsilon)
    d = v.delta_target(delta)
    s = v.positive(sigma, "sigma", hint="sigma is the std of the Gaussian noise on counts; pass sigma > 0")
    t = v.count(
        tau, "tau", minimum=1, hint="tau is the deterministic threshold on true counts: an integer >= 1"
    )
    c = v.count(max_groups, "max_groups", minimum=1, hint="max_groups (C_u) must be a whole number >= 1")
    mo = v.nonneg(
        mu_other, "mu_other", hint="mu_other is the per-group sensitivity of the extra columns (0 if none)"
    )
    m = v.choice(method, "method", ("exact", "add_the_deltas"))
    return _min_tau_star(e, d, s, t, c, mo, m)


def round_tau_star_up(tau_star: float, granularity: float = 1.0) -> float:
    """Smallest multiple of ``granularity`` that is ≥ ``tau_star`` (a larger τ* stays private)."""
    ts = v.real(tau_star, "tau_star")
    g = v.positive(granularity, "granularity", hint="granularity is the rounding step, e.g. 1.0 for integers")
    r = math.ceil(ts / g) * g
    while r < ts:  # guard against ts/g rounding down
        r += g
    return float(r)
