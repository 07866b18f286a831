r"""Exact privacy profile of the Gaussian mechanism and its inverses.

Formula (``docs/mechanisms.md`` §1.2; Balle & Wang 2018, Thm 8; Wilkins et al. Thm 2.2)
------------------------------------------------------------------------------------------
For a mechanism that adds N(0, σ²) noise to a query of L2 sensitivity Δ, with μ = Δ/σ,

    δ_G(ε; μ) = Φ(−ε/μ + μ/2) − e^ε · Φ(−ε/μ − μ/2)

is the tight privacy profile. It is valid for every real ε, including ε < 0 (Wilkins et al.
Observation 2.3): the sparse-histogram accounting evaluates it at negative arguments. It is
decreasing in ε and increasing in μ; δ_G(ε; 0) = (1 − e^ε)₊.

Numerics
--------
Write a = μ/2 − ε/μ and b = a − μ. The textbook difference Φ(a) − e^εΦ(b) cancels badly in the
tails, so three cancellation-free forms are used:

* ε < 0 — reflection identity δ_G(ε) = (1 − e^ε) + e^ε·δ_G(−ε) (a sum of two non-negative
  terms; follows from Φ(x) = 1 − Φ(−x)).
* 0 ≤ ε < μ²/2 (a > 0 > b) — δ_G = ½[erf(a/√2) + erf(−b/√2)] − expm1(ε)·Φ(b); the first part
  is at least a constant fraction of the result.
* ε ≥ μ²/2 (a ≤ 0) — since e^ε·e^{−b²/2} = e^{−a²/2} exactly,
  δ_G = ½·e^{−a²/2}·[erfcx(x₁) − erfcx(x₁ + h)] with x₁ = −a/√2, h = μ/√2, so
  log δ_G = −a²/2 + log(½·D) stays finite far below 1e-300. The difference D is taken
  directly when h ≥ ½, and otherwise as D = ∫_{x₁}^{x₁+h} (2/√π − 2x·erfcx(x)) dx by
  Gauss–Legendre quadrature (the integrand is positive and smooth, so no digits are lost
  when μ is small); for x > 30 the integrand uses its asymptotic series.

The result is accurate to about 1e-13 relative for μ ≥ 1e-4 over the whole real ε line
(checked against 50-digit references in ``tests/vectors/gaussian_mechanism.json``), and to
1.1e-12 everywhere (the worst of 3 727 random points with μ in [1e-8, 50], ε in [1e-9, 500] and
δ above e^-690, against 80-digit arithmetic: near μ ≈ 1.5e-3).

Inverses (:func:`gaussian_epsilon`, :func:`gaussian_mu`, :func:`gaussian_sigma`) bracket the
root with closed-form bounds and solve with ``scipy.optimize.brentq`` on log δ to a few ulps,
then step to the safe side: the returned value satisfies the target with the evaluated δ_G at
most δ·(1 − :data:`DELTA_EVAL_MARGIN`), so that the *true* δ_G is at most δ despite the
evaluation error above (without the margin the least σ of ε = 0.001, δ = 1e-3 was
276.12887556918486, whose exact δ_G exceeds 1e-3 by 9.0e-14 relative; the exact least σ is
276.1288755692027804). :func:`gaussian_mu`
(every Gaussian calibration goes through it) solves down to two adjacent floats instead and keeps
the one on the safe side (regula falsi, then bisection on the floats themselves,
:func:`_bisect_floats`): no SciPy optimiser is imported to calibrate a query.
"""

from __future__ import annotations

import functools
import math
import struct
import sys
from collections.abc import Callable

import numpy as np
from scipy.special import erf, erfcx, log_ndtr, ndtri

from dpsql.accounting import _validate as v
from dpsql.errors import ConfigError

__all__ = [
    "gaussian_delta",
    "log_gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu",
    "gaussian_sigma",
]

_SQRT2 = math.sqrt(2.0)
_TWO_OVER_SQRTPI = 2.0 / math.sqrt(math.pi)
_LOG_HALF = math.log(0.5)
_RTOL = 4.0 * float(np.finfo(float).eps)  # the smallest rtol brentq accepts

#: relative allowance for the floating-point evaluation error of δ_G (at most 1.1e-12 measured,
#: module docstring): every inverse meets δ·(1 − margin) as evaluated, so the exact δ_G is ≤ δ.
#: The price is a σ larger by about 1e-10 relative.
DELTA_EVAL_MARGIN = 2.0**-33
_LOG1M_MARGIN = math.log1p(-DELTA_EVAL_MARGIN)

# Gauss-Legendre nodes on [-1, 1]
_GL8 = np.polynomial.legendre.leggauss(8)
_GL16 = np.polynomial.legendre.leggauss(16)


def _neg_erfcx_prime(x: np.ndarray) -> np.ndarray:
    """g(x) = −d/dx erfcx(x) = 2/√π − 2x·erfcx(x) > 0 for x ≥ 0 (asymptotic series for x > 30)."""
    x = np.asarray(x, dtype=float)
    out = np.empty_like(x)
    small = x <= 30.0
    xs = x[small]
    out[small] = _TWO_OVER_SQRTPI - 2.0 * xs * erfcx(xs)
    xl = x[~small]
    if xl.size:
        # 2x·erfcx(x) ~ (2/√π)·Σ (−1)^n (2n−1)!! / (2x²)^n  ⇒  g ~ (2/√π)·Σ_{n≥1} (−1)^{n+1}(2n−1)!!/(2x²)^n
        with np.errstate(over="ignore"):  # x beyond 1e154: u = 0 (g ~ 1/(√π x²) there multiplies e^(−x²) = 0)
            u = 1.0 / (2.0 * xl * xl)
        term = np.ones_like(xl)
        acc = np.zeros_like(xl)
        for n in range(1, 12):
            term = term * (2 * n - 1) * u
            acc += term if n % 2 == 1 else -term
        out[~small] = _TWO_OVER_SQRTPI * acc
    return out


def _erfcx_diff(x1: np.ndarray, h: np.ndarray) -> np.ndarray:
    """erfcx(x1) − erfcx(x1 + h) for x1 ≥ 0, h > 0, without cancellation.

    The direct difference loses about log10(erfcx(x1)/D) digits; where that exceeds 3 digits
    (only possible for h < 0.5) the difference is recomputed by Gauss-Legendre quadrature of
    the positive integrand −erfcx'.
    """
    e1 = erfcx(x1)
    d = e1 - erfcx(x1 + h)
    refine = (h < 0.5) & ~(d > 1e-3 * e1)
    for mask, (nodes, weights) in ((refine & (h < 0.1), _GL8), (refine & (h >= 0.1), _GL16)):
        if np.any(mask):
            xs, hs = x1[mask], h[mask]
            pts = (xs + 0.5 * hs)[:, None] + (0.5 * hs)[:, None] * nodes[None, :]
            d[mask] = 0.5 * hs * (_neg_erfcx_prime(pts) @ weights)
    return d


def _expm1_times_ndtr(e_abs: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(e^ε − 1)·Φ(b) for ε ≥ 0, in log space so that a huge e^ε times a tiny Φ(b) stays finite."""
    with np.errstate(divide="ignore"):
        log_expm1 = e_abs + np.log(-np.expm1(-e_abs))  # log(e^ε − 1); −inf at ε = 0
    return np.exp(log_expm1 + log_ndtr(b))


def _log_upper(a: np.ndarray, mu: np.ndarray, e_abs: np.ndarray) -> np.ndarray:
    """log δ_G for 0 ≤ ε < μ²/2 (a > 0 > b): ½[erf(a/√2) + erf(−b/√2)] − expm1(ε)Φ(b)."""
    b = a - mu
    val = 0.5 * (erf(a / _SQRT2) - erf(b / _SQRT2)) - _expm1_times_ndtr(e_abs, b)
    with np.errstate(divide="ignore"):
        return np.log(np.maximum(val, 0.0))


def _log_lower(a: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """log δ_G for ε ≥ μ²/2 (a ≤ 0): −a²/2 + log(½[erfcx(x₁) − erfcx(x₁ + μ/√2)])."""
    d = _erfcx_diff(a / -_SQRT2, mu / _SQRT2)
    with np.errstate(divide="ignore", over="ignore"):  # a = −inf (ε/μ beyond the doubles): δ_G = 0, log −inf
        return _LOG_HALF + np.log(np.maximum(d, 0.0)) - 0.5 * a * a


def _log_delta_core(eps: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """log δ_G(ε; μ) elementwise for validated 1-D float arrays of equal length (μ ≥ 0)."""
    eps = np.asarray(eps, dtype=float)
    mu = np.asarray(mu, dtype=float)
    neg = eps < 0
    has_neg = bool(neg.any())
    e_abs = np.abs(eps) if has_neg else eps
    zero = mu == 0.0
    has_zero = bool(zero.any())
    mu_s = np.where(zero, 1.0, mu) if has_zero else mu
    with np.errstate(over="ignore"):  # ε/μ beyond the doubles: a = −inf, δ_G(|ε|) = 0 (_log_lower)
        a = 0.5 * mu_s - e_abs / mu_s
    up = a > 0
    if up.all():
        out = _log_upper(a, mu_s, e_abs)
    elif not up.any():
        out = _log_lower(a, mu_s)
    else:
        out = np.empty_like(a)
        lo = ~up
        out[up] = _log_upper(a[up], mu_s[up], e_abs[up])
        out[lo] = _log_lower(a[lo], mu_s[lo])
    if has_zero:
        out[zero] = -np.inf  # δ_G(|ε|; 0) = 0
    if has_neg:
        en = eps[neg]
        # δ(ε) = (1 − e^ε) + e^ε δ(−ε)
        out[neg] = np.logaddexp(np.log(-np.expm1(en)), en + out[neg])
    return out


def log_gaussian_delta(epsilon: object, mu: object) -> float | np.ndarray:
    """log δ_G(ε; μ), finite far below the float range of δ itself (−inf iff δ = 0).

    Vectorised: ``epsilon`` and ``mu`` broadcast against each other. ε may be any finite
    real; μ must be finite and ≥ 0.
    """
    e = v.real_array(epsilon, "epsilon", hint="epsilon may be any finite real number (negative allowed)")
    m = v.real_array(mu, "mu", minimum=0.0, hint="mu = sensitivity/sigma must be finite and >= 0")
    eb, mb = np.broadcast_arrays(e, m)
    res = _log_delta_core(eb.ravel(), mb.ravel()).reshape(eb.shape)
    if res.ndim == 0:
        return float(res)
    return res


def gaussian_delta(epsilon: object, mu: object) -> float | np.ndarray:
    """Exact Gaussian privacy profile δ_G(ε; μ) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).

    Vectorised over numpy arrays (broadcasting). Valid for every finite real ε (ε < 0 included);
    μ = L2-sensitivity / σ must be finite and ≥ 0. Values below ~1e-308 underflow to 0; use
    :func:`log_gaussian_delta` for those.
    """
    lg = log_gaussian_delta(epsilon, mu)
    if isinstance(lg, float):
        return math.exp(lg)
    return np.exp(lg)


def _ldg(eps: float, mu: float) -> float:
    """Scalar log δ_G for already-validated input."""
    return float(_log_delta_core(np.array([eps]), np.array([mu]))[0])


def _step_until(x: float, ok: Callable[[float], bool], toward: float) -> float:
    """Move x toward ``toward`` until ok(x): first ulp by ulp, then by doubling relative steps.

    (In the far tail δ_G is only resolved to ~|log δ|·1e-16 relative, so the float value can be
    flat over many ulps; the doubling steps get across such plateaus in a few evaluations.)
    """
    if ok(x):
        return x
    for _ in range(16):
        x = float(np.nextafter(x, toward))
        if ok(x):
            return x
    step = 1e-15
    sign = 1.0 if toward > x else -1.0
    base = x
    while step < 1e-6:
        x = base * (1.0 + sign * step) if base != 0 else sign * step
        if ok(x):
            return x
        step *= 2.0
    raise ConfigError(  # pragma: no cover - would need δ_G to be wrong by 1e-6 relative
        "could not certify the computed privacy parameter",
        hint="report this as a bug with the parameters used",
    )


def _meets(eps: float, mu: float, delta: float, log_delta: float) -> bool:
    """δ_G(ε; μ) ≤ δ·(1 − margin) both in log space and as the float :func:`gaussian_delta` returns
    (``log_delta`` is ln δ; :data:`DELTA_EVAL_MARGIN` covers the evaluation error, so the exact
    δ_G is ≤ δ)."""
    ld = _ldg(eps, mu)
    return ld <= log_delta + _LOG1M_MARGIN and math.exp(ld) <= delta * (1.0 - DELTA_EVAL_MARGIN)


def gaussian_epsilon(delta: object, mu: object) -> float:
    """Least ε ≥ 0 with δ_G(ε; μ) ≤ δ (the Gaussian mechanism with μ = Δ/σ is (ε, δ)-DP).

    Returns 0.0 when already δ_G(0; μ) ≤ δ. Correct to ~1e-15 relative; the returned ε always
    satisfies δ_G(ε; μ) ≤ δ.
    """
    d = v.delta_target(delta)
    m = v.nonneg(mu, "mu", hint="mu = sensitivity/sigma must be finite and >= 0")
    if m == 0.0:
        return 0.0
    log_d = math.log(d)
    if _meets(0.0, m, d, log_d):
        return 0.0
    # δ_G(ε) < Φ(μ/2 − ε/μ) ≤ δ as soon as ε ≥ μ²/2 − μΦ⁻¹(δ).
    hi = 0.5 * m * m - m * float(ndtri(d))
    while _ldg(hi, m) > log_d:  # pragma: no cover - the bound above is rigorous
        hi *= 2.0
    from scipy.optimize import brentq  # imported when used: SciPy's optimisers are slow to import

    log_t = log_d + _LOG1M_MARGIN  # the crossing solved for: δ·(1 − margin) (see _meets)
    while _ldg(hi, m) > log_t:  # pragma: no cover - the bound has room for the margin
        hi *= 2.0
    root = brentq(lambda e: _ldg(e, m) - log_t, 0.0, hi, xtol=1e-300, rtol=_RTOL, maxiter=500)
    return _step_until(float(root), lambda x: _meets(x, m, d, log_d), math.inf)


def gaussian_mu(epsilon: object, delta: object) -> float:
    """Largest μ = Δ/σ with δ_G(ε; μ) ≤ δ (ε ≥ 0, δ ∈ (0, 1))."""
    e = v.epsilon_target(epsilon)
    d = v.delta_target(delta)
    log_d = math.log(d)
    log_t = log_d + _LOG1M_MARGIN  # the crossing solved for: δ·(1 − margin) (see _meets)

    def f(t: float) -> float:
        return _ldg(e, math.exp(t)) - log_t

    # bracket the root in t = ln μ: δ_G(ε; μ) → 0 as μ → 0 (ε ≥ 0) and → 1 as μ → ∞
    if f(0.0) > 0:
        hi, lo = 0.0, -1.0
        while f(lo) > 0 and lo > -800.0:  # e^-800 underflows to μ = 0, where δ_G = 0
            hi, lo = lo, 2.0 * lo
    else:
        lo, hi = 0.0, 1.0
        while f(hi) <= 0:
            lo, hi = hi, 2.0 * hi
    while hi - lo > 0.5:  # narrow the bracket to a factor e^0.5 by bisection in ln μ
        mid = 0.5 * (lo + hi)
        if f(mid) > 0:
            hi = mid
        else:
            lo = mid
    # refine in μ itself (not ln μ) so that the tolerance is relative to μ
    m_lo, m_hi = math.exp(lo), math.exp(hi)
    m = _bisect_floats(lambda x: _ldg(e, x) - log_t, m_lo, m_hi)
    return _step_until(m, lambda x: _meets(e, x, d, log_d), 0.0)


def _bisect_floats(g: Callable[[float], float], lo: float, hi: float) -> float:
    """A float x in [lo, hi] with g(x) <= 0 < g(next float), for g increasing up to float
    rounding (0 < lo < hi; hi if g(hi) <= 0, lo if g(lo) > 0): regula falsi (the Illinois
    variant) narrows the bracket to about 1e-14 relative, then bisection on the floats' bit
    patterns (ordered like the positive floats themselves) reaches two adjacent floats."""
    def bits(x: float) -> int:
        return int(struct.unpack("<q", struct.pack("<d", x))[0])

    def value(i: int) -> float:
        return float(struct.unpack("<d", struct.pack("<q", i))[0])

    ga, gb = g(lo), g(hi)
    if gb <= 0:
        return hi
    if ga > 0:
        return lo
    a, b, side = lo, hi, 0
    for _ in range(100):
        if b - a <= 1e-14 * b or not math.isfinite(ga):
            break
        x = b - gb * (b - a) / (gb - ga)
        if not a < x < b:
            x = 0.5 * (a + b)
        gx = g(x)
        if gx <= 0:
            a, ga = x, gx
            if side == -1:
                gb *= 0.5
            side = -1
        else:
            b, gb = x, gx
            if side == 1:
                ga *= 0.5
            side = 1
    ia, ib = bits(a), bits(b)
    while ib - ia > 1:
        mid = (ia + ib) // 2
        if g(value(mid)) <= 0:
            ia = mid
        else:
            ib = mid
    return value(ia)


def gaussian_sigma(epsilon: object, delta: object, sensitivity: object = 1.0) -> float:
    """Least σ with δ_G(ε; sensitivity/σ) ≤ δ: the analytic-Gaussian calibration.

    ε ≥ 0 and δ ∈ (0, 1) are the target budget; ``sensitivity`` is the L2 sensitivity (> 0).
    The returned σ always satisfies the target (verified after solving).
    """
    e = v.epsilon_target(epsilon)
    d = v.delta_target(delta)
    s = v.positive(
        sensitivity, "sensitivity", hint="sensitivity is the L2 sensitivity of the query, e.g. 1.0"
    )
    return _sigma(e, d, s)


@functools.lru_cache(maxsize=256)
def _sigma(e: float, d: float, s: float) -> float:
    """:func:`gaussian_sigma` of checked floats, solved once per (ε, δ, sensitivity): a pure
    function, which every query with the same budget and caps asked again (a quarter of the
    time to analyse and route a query: some twenty evaluations of δ_G)."""
    m = gaussian_mu(e, d)
    log_d = math.log(d)
    if not s / m >= sys.float_info.min:  # the least sigma underflows (a huge epsilon, a tiny sensitivity): s / x divided by 0
        raise ConfigError(f"epsilon={e:g}, delta={d:g} and sensitivity={s:g} give a noise scale below the smallest "
                          "double that can be represented", hint="use a smaller epsilon or a larger sensitivity")
    return _step_until(s / m, lambda x: _meets(e, s / x, d, log_d), math.inf)
