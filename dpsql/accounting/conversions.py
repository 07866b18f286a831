r"""Conversions between pure DP, zCDP, Rényi DP and (ε, δ)-DP, plus Laplace/Gaussian helpers.

Formulas (``docs/mechanisms.md`` §4)
------------------------------------
* Pure → zCDP (Bun & Steinke 2016): ε-DP ⇒ (ε²/2)-zCDP ⇒ (α, αε²/2)-RDP for every α.
* Gaussian with L2 sensitivity Δ and std σ: (Δ²/(2σ²))-zCDP, i.e. (α, αΔ²/(2σ²))-RDP.
* RDP → DP, Mironov (2017): ε = ρ + ln(1/δ)/(α − 1).
* RDP → DP, Canonne–Kamath–Steinke 2020 / Balle et al. 2020 Thm 21 (same bound):
  ε = ρ + ln((α − 1)/α) − (ln δ + ln α)/(α − 1)  ⇔  δ = e^{(α−1)(ρ−ε)}·(1 − 1/α)^α/(α − 1).
  Never larger than Mironov's. A negative value is reported as 0 (δ(ε) is non-increasing, so
  (0, δ)-DP then holds).
* zCDP → DP, classic: ε = ρ + 2√(ρ ln(1/δ)) (= Mironov at its optimal α* = 1 + √(ln(1/δ)/ρ)).
* zCDP → DP, CKS Cor. 13: δ(ε) = inf_{α>1} e^{(α−1)(αρ−ε)}(1 − 1/α)^{α−1}/α, the minimiser being the
  unique root of (2α − 1)ρ − ε + ln(1 − 1/α) = 0. For a target δ we minimise the CKS RDP→DP ε over
  α (the same family of curves): ε(α) = αρ + ln(1 − 1/α) − (ln δ + ln α)/(α − 1), whose derivative
  is ρ + ln(αδ)/(α − 1)²; its unique root ρ(α − 1)² + ln α + ln δ = 0 is found by Brent's method.
  (Cross-check with OpenDP: ρ = 1/32, δ = 1e-3 → ε = 0.688002455487808…; δ(0) = 0.150845784562286….)
* Laplace mechanism: scale b = Δ₁/ε.

For a single Gaussian release always prefer the exact profile (:mod:`.gaussian`): exact ≤ CKS ≤ Mironov.
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.accounting import _validate as v

__all__ = [
    "pure_to_zcdp",
    "pure_to_rdp",
    "gaussian_zcdp",
    "gaussian_rdp",
    "laplace_scale",
    "rdp_to_dp",
    "rdp_delta",
    "zcdp_to_dp",
    "zcdp_delta",
    "zcdp_optimal_alpha",
]

_RTOL = 4.0 * float(np.finfo(float).eps)


def _rho(value: object) -> float:
    return v.nonneg(value, "rho", hint="rho is a zCDP/RDP budget: a finite value >= 0")


def pure_to_zcdp(epsilon: float) -> float:
    """ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016)."""
    e = v.epsilon_target(epsilon)
    return 0.5 * e * e


def pure_to_rdp(alpha: float, epsilon: float) -> float:
    """ε-DP ⇒ (α, αε²/2)-RDP."""
    a = v.alpha_order(alpha)
    return a * pure_to_zcdp(epsilon)


def gaussian_zcdp(sigma: float, sensitivity: float = 1.0) -> float:
    """ρ = Δ²/(2σ²) for Gaussian noise of std σ on a query of L2 sensitivity Δ."""
    s = v.positive(sigma, "sigma", hint="sigma is the noise std: pass sigma > 0")
    d = v.positive(sensitivity, "sensitivity", hint="sensitivity is the L2 sensitivity, e.g. 1.0")
    return d * d / (2.0 * s * s)


def gaussian_rdp(alpha: float, sigma: float, sensitivity: float = 1.0) -> float:
    """RDP of the Gaussian mechanism at order α: αΔ²/(2σ²)."""
    a = v.alpha_order(alpha)
    return a * gaussian_zcdp(sigma, sensitivity)


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """Laplace scale b = Δ₁/ε for an ε-DP release of a query with L1 sensitivity Δ₁ (ε > 0)."""
    e = v.positive(epsilon, "epsilon", hint="epsilon must be > 0 for a Laplace release, e.g. epsilon=1.0")
    d = v.positive(sensitivity, "sensitivity", hint="sensitivity is the L1 sensitivity, e.g. 1.0")
    return d / e


def rdp_to_dp(alpha: float, rho: float, delta: float, method: str = "cks") -> float:
    """ε such that (α, ρ)-RDP implies (ε, δ)-DP. ``method``: "cks" (tighter) or "mironov"."""
    a = v.alpha_order(alpha)
    r = _rho(rho)
    d = v.delta_target(delta)
    m = v.choice(method, "method", ("cks", "mironov"))
    if m == "mironov":
        return r + math.log(1.0 / d) / (a - 1.0)
    eps = r + math.log1p(-1.0 / a) - (math.log(d) + math.log(a)) / (a - 1.0)
    return max(0.0, eps)


def rdp_delta(alpha: float, rho: float, epsilon: float) -> float:
    """The CKS/Balle δ for (α, ρ)-RDP at ε: e^{(α−1)(ρ−ε)}·(1 − 1/α)^α/(α − 1), capped at 1."""
    a = v.alpha_order(alpha)
    r = _rho(rho)
    e = v.epsilon_target(epsilon)
    log_d = (a - 1.0) * (r - e) + a * math.log1p(-1.0 / a) - math.log(a - 1.0)
    return math.exp(min(0.0, log_d))


def zcdp_optimal_alpha(rho: float, delta: float, method: str = "cks") -> float:
    """The order α at which the zCDP → DP conversion for δ is tightest.

    "classic"/"mironov": α* = 1 + √(ln(1/δ)/ρ); "cks": the root of ρ(α − 1)² + ln(αδ) = 0.
    """
    r = v.positive(rho, "rho", hint="rho is a zCDP budget: a finite value > 0")
    d = v.delta_target(delta)
    m = v.choice(method, "method", ("cks", "classic", "mironov"))
    if m != "cks":
        return 1.0 + math.sqrt(math.log(1.0 / d) / r)
    log_d = math.log(d)

    def g(a: float) -> float:
        return r * (a - 1.0) ** 2 + math.log(a) + log_d  # increasing in a > 1; g(1) = ln δ < 0

    hi = 1.0 + math.sqrt(-log_d / r) + 1.0  # g(hi) > r(α−1)² + ln δ ≥ 0
    from scipy.optimize import brentq  # imported when used: slow to import

    return float(brentq(g, 1.0, hi, xtol=1e-15, rtol=_RTOL, maxiter=500))


def zcdp_to_dp(rho: float, delta: float, method: str = "cks") -> float:
    """ε such that ρ-zCDP implies (ε, δ)-DP. ``method``: "cks" (CKS Cor. 13, optimal α) or "classic"."""
    r = _rho(rho)
    d = v.delta_target(delta)
    m = v.choice(method, "method", ("cks", "classic"))
    if r == 0.0:
        return 0.0
    if m == "classic":
        return r + 2.0 * math.sqrt(r * math.log(1.0 / d))
    a = zcdp_optimal_alpha(r, d, "cks")
    eps = a * r + math.log1p(-1.0 / a) - (math.log(d) + math.log(a)) / (a - 1.0)
    return max(0.0, eps)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """δ(ε) of ρ-zCDP by CKS Cor. 13: inf over α of e^{(α−1)(αρ−ε)}(1 − 1/α)^{α−1}/α.

    The minimiser is the unique root of (2α − 1)ρ − ε + ln(1 − 1/α) = 0 on α > 1.
    """
    r = _rho(rho)
    e = v.epsilon_target(epsilon)
    if r == 0.0:
        return 0.0

    def k(a: float) -> float:  # increasing in α: derivative 2ρ + 1/(α(α−1)) > 0; → −∞ as α → 1
        return (2.0 * a - 1.0) * r - e + math.log1p(-1.0 / a)

    lo = 1.0 + 1e-12
    while k(lo) > 0:  # pragma: no cover - only for absurdly large rho
        lo = 1.0 + (lo - 1.0) / 1e3
    hi = max(2.0, (e + 1.0) / (2.0 * r) + 1.0)
    while k(hi) < 0:
        hi *= 2.0
    from scipy.optimize import brentq  # imported when used: slow to import

    a = float(brentq(k, lo, hi, xtol=1e-15, rtol=_RTOL, maxiter=500))
    log_d = (a - 1.0) * (a * r - e) + (a - 1.0) * math.log1p(-1.0 / a) - math.log(a)
    return math.exp(min(0.0, log_d))
