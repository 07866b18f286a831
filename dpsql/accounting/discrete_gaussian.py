r"""Discrete Gaussian and discrete Laplace distributions: pmf, moments and the exact 1-D privacy profile.

Source: Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020);
``docs/mechanisms.md`` §5.5.

* N_ℤ(0, σ²): P[X = x] = e^{−x²/(2σ²)}/N(σ), N(σ) = Σ_{y∈ℤ} e^{−y²/(2σ²)}.
* Integer query with sensitivity Δ (integer): Δ²/(2σ²)-zCDP, and the exact profile
      δ(ε) = P[X > εσ²/Δ − Δ/2] − e^ε·P[X > εσ²/Δ + Δ/2].
  It is evaluated as the sum of its non-negative terms Σ_{y > εσ²/Δ − Δ/2} P[X = y]·(1 − e^{ε − (2yΔ + Δ²)/(2σ²)})
  (shift the second sum by Δ), each term in log space — no cancellation.
* Discrete Laplace with scale t: P[X = x] = tanh(1/(2t))·e^{−|x|/t}.

Numerics. For σ ≥ 10 the Poisson-summation corrections (relative size 2e^{−2π²σ²} < 1e-800) vanish in
double precision, so N(σ) = √(2π)σ and Var = σ² exactly; below that, N and Var are summed directly
over |x| ≤ 40σ + 10 (the rest is below e^{−800}). The profile is summed over the window
(εσ²/Δ − Δ/2, εσ²/Δ − Δ/2 + 40σ + 10]; σ is limited to 1e6 to bound that work.

Do not reuse the continuous δ_G for discrete noise: e.g. σ = 2, Δ = 1, ε = 1 gives 7.249e-3 here
versus 6.830e-3 for the continuous Gaussian.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import logsumexp

from dpsql.accounting import _validate as v
from dpsql.errors import ConfigError

__all__ = [
    "discrete_gaussian_normaliser",
    "discrete_gaussian_variance",
    "discrete_gaussian_pmf",
    "discrete_gaussian_delta",
    "discrete_laplace_pmf",
]

_SIGMA_MAX = 1e6
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def _sigma(value: object) -> float:
    s = v.positive(value, "sigma", hint="sigma is the discrete Gaussian's scale parameter: pass sigma > 0")
    if s > _SIGMA_MAX:
        raise ConfigError(
            f"sigma={value!r} is above the supported maximum {_SIGMA_MAX:g} for exact discrete sums",
            hint="for such sigma use the zCDP bound (gaussian_zcdp + zcdp_to_dp) instead",
        )
    return s


def _support(s: float) -> np.ndarray:
    m = math.ceil(40.0 * s + 10.0)
    return np.arange(-m, m + 1, dtype=float)


def _log_normaliser(s: float) -> float:
    if s >= 10.0:
        return math.log(_SQRT_2PI * s)
    x = _support(s)
    return float(logsumexp(-x * x / (2.0 * s * s)))


def discrete_gaussian_normaliser(sigma: float) -> float:
    """N(σ) = Σ_{y∈ℤ} e^{−y²/(2σ²)}."""
    return math.exp(_log_normaliser(_sigma(sigma)))


def discrete_gaussian_variance(sigma: float) -> float:
    """Var of N_ℤ(0, σ²) (slightly below σ² for small σ)."""
    s = _sigma(sigma)
    if s >= 10.0:
        return s * s
    x = _support(s)
    w = np.exp(-x * x / (2.0 * s * s) - _log_normaliser(s))
    return float(np.sum(x * x * w))


def discrete_gaussian_pmf(x: object, sigma: float) -> float | np.ndarray:
    """P[X = x] for X ∼ N_ℤ(0, σ²); ``x`` an integer or an array of integers."""
    s = _sigma(sigma)
    arr = v.real_array(x, "x")
    if np.any(arr != np.floor(arr)):
        raise ConfigError(
            f"x must be an integer (or integers), got {x!r}",
            hint="the discrete Gaussian lives on the integers",
        )
    out = np.exp(-arr * arr / (2.0 * s * s) - _log_normaliser(s))
    return float(out) if out.ndim == 0 else out


def discrete_gaussian_delta(epsilon: float, sigma: float, sensitivity: int = 1) -> float:
    """Exact δ(ε) of adding N_ℤ(0, σ²) to an integer query with sensitivity Δ (CKS 2020)."""
    e = v.epsilon_target(epsilon)
    s = _sigma(sigma)
    d = v.count(
        sensitivity,
        "sensitivity",
        minimum=1,
        hint="the sensitivity of an integer query is a whole number >= 1",
    )
    t1 = e * s * s / d - d / 2.0
    y0 = math.floor(t1) + 1
    y = np.arange(y0, y0 + math.ceil(40.0 * s + 10.0) + 1, dtype=float)
    with np.errstate(divide="ignore"):
        log_terms = (
            -y * y / (2.0 * s * s)
            - _log_normaliser(s)
            + np.log(-np.expm1(e - (2.0 * y * d + d * d) / (2.0 * s * s)))
        )
    return float(np.exp(logsumexp(log_terms)))


def discrete_laplace_pmf(x: object, t: float) -> float | np.ndarray:
    """P[X = x] = tanh(1/(2t))·e^{−|x|/t} for the discrete Laplace with scale t > 0."""
    tt = v.positive(t, "t", hint="t is the discrete Laplace scale: pass t > 0")
    arr = v.real_array(x, "x")
    if np.any(arr != np.floor(arr)):
        raise ConfigError(
            f"x must be an integer (or integers), got {x!r}",
            hint="the discrete Laplace lives on the integers",
        )
    out = math.tanh(0.5 / tt) * np.exp(-np.abs(arr) / tt)
    return float(out) if out.ndim == 0 else out
