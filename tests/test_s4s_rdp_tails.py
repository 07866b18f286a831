"""Lemma 3.5's ρ′ (``s4s_rdp_prime``) where binomial tails underflow, and its fast path.

* A tail below the least double (e.g. P[K > 725] ≈ 1e-400 for K ~ Bin(1000, 1/4)) multiplied by a
  factor e^{(α−1)ρ} in the thousands is not negligible: reading it as 0 understated ρ′ by up to a
  third at large orders. ρ′ must stay at or above the exact sum (every term of the lemma summed in
  log space; n = 1000 makes that reference exact to ~1e-13), and close to it.
* Where ⌊τ⌋ lies deep below the bulk of Bin(Δ, q) (huge Δ), the window of up to 200 001 terms is not
  evaluated when it cannot change the result's float: the result is bit-identical to the full sum.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import gammaln

import dpsql.accounting.s4s as s4s
from dpsql.accounting import s4s_rdp_prime


def exact_rho_prime(alpha: float, rho: float, tau: float, n: int, q: float) -> float:
    """(1/(α−1))·ln Σ_k P[Bin(n, q) = k]·exp((α−1)ρ·(min(k, τ)/τ)²), every term in log space."""
    k = np.arange(n + 1, dtype=float)
    lp = gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0) + k * math.log(q) + (n - k) * math.log1p(-q)
    top = (alpha - 1.0) * rho
    x = lp + np.where(k <= math.floor(tau), top * (k / tau) ** 2, top)
    m = float(x.max())
    return min(rho, (m + math.log(float(np.exp(x - m).sum()))) / (alpha - 1.0))


# (α, ρ, τ, Δ, q): large (α − 1)ρ with τ far above the bulk of Bin(Δ, q)
UNDERFLOWING = [
    (2049.0, 5.0, 1000.0, 1000, 0.25),
    (2049.0, 1.0, 1000.0, 1000, 0.25),
    (1.0 + 2.0**9.5, 5.0, 1000.0, 1000, 0.25),
    (4097.0, 1.0, 7500.0, 10_000, 0.5),
    (4097.0, 1.0, 7050.0, 10_000, 0.5),
]


@pytest.mark.parametrize(("alpha", "rho", "tau", "n", "q"), UNDERFLOWING)
def test_underflowing_tails_are_bounded_not_dropped(alpha: float, rho: float, tau: float, n: int, q: float) -> None:
    got = s4s_rdp_prime(alpha, rho, tau, n, q)
    ref = exact_rho_prime(alpha, rho, tau, n, q)
    assert got >= ref * (1.0 - 1e-12)
    assert got <= ref * 1.01  # the Chernoff bounds cost little


def _tails_as_zero(k: int, n: int, p: float, *, above: bool) -> float:
    return s4s._binom_logsf(k, n, p) if above else s4s._binom_logcdf(k, n, p)


def _upper_as_zero(lo: int, hi: int, n: int, p: float, factor: object) -> float:
    return s4s._binom_logsf(lo, n, p) + float(factor(np.array([float(hi)]))[0]) if hi > lo else -math.inf  # type: ignore[operator]


def test_negative_control_tails_read_as_zero_understate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading an underflowed tail as 0 (the former evaluation) falls below the exact ρ′."""
    monkeypatch.setattr(s4s, "_log_tail_bound", _tails_as_zero)
    monkeypatch.setattr(s4s, "_log_upper_terms", _upper_as_zero)
    under = [s4s_rdp_prime(a, r, t, n, q) < exact_rho_prime(a, r, t, n, q) * (1.0 - 1e-6) for a, r, t, n, q in UNDERFLOWING]
    assert sum(under) >= 3


# ⌊τ⌋ deep below the bulk (the window is skipped) and at or above it (evaluated)
HUGE = [(a, r, t, n, q) for n, q in ((2**40, 0.0625), (2**30, 0.25), (10**6, 0.01), (1000, 0.5))
        for a in (1.5, 9.0, 65.0) for r in (0.01, 0.5)
        for t in (1.0, 30.25, 837_339.37890625, float(n) * q / 2, float(n))]


def test_skipped_windows_are_bit_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [s4s_rdp_prime(a, r, min(t, n), n, q) for a, r, t, n, q in HUGE]
    monkeypatch.setattr(s4s, "_negligible", lambda *args: False)
    full = [s4s_rdp_prime(a, r, min(t, n), n, q) for a, r, t, n, q in HUGE]
    assert fast == full


def test_negligible_needs_the_margin() -> None:
    assert s4s._negligible(-60.0, -5.0, [])
    assert not s4s._negligible(-50.0, -5.0, [])  # 45 nats below: could still round a partial sum
    assert not s4s._negligible(-100.0, None, [])  # nothing to be added to
    assert s4s._negligible(-100.0, None, [-math.inf, -40.0])  # a -inf term adds an exact 0
    assert not s4s._negligible(-100.0, None, [-40.0, -80.0])


def test_chernoff_bounds_the_tail() -> None:
    """The Chernoff bound is at or above the tail where scipy's tail is a positive double."""
    for n, p, k in ((1000, 0.25, 600), (1000, 0.25, 50), (10**6, 0.01, 11_000), (10**6, 0.01, 9_000)):
        above = k > n * p
        tail = s4s._binom_logsf(k - 1, n, p) if above else s4s._binom_logcdf(k, n, p)
        assert tail > -math.inf
        assert s4s._log_chernoff(float(k), n, p) >= tail
