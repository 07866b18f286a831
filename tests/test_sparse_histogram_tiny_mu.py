"""Theorem 5.4's per-row μ = √(1/σ² + μ_o²) must not underflow: for σ above ~1.3e154 (ε and δ near 1e-160 and
below) 1/σ² is 0 in doubles while μ itself (about 1/σ) is a normal double, and δ_G(ε; μ) there is not negligible:
the calibration reported δ_Gaussian = 0 where it is the whole δ (with numpy's divide-by-zero warnings)."""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import pytest

from dpsql.accounting import calibrate_sparse_histogram, sparse_histogram_delta_detail


def _gaussian(eps: float, mu: mp.mpf) -> mp.mpf:
    e = mp.mpf(eps)
    return mp.ncdf(mu / 2 - e / mu) - mp.exp(e) * mp.ncdf(-mu / 2 - e / mu)


@pytest.mark.parametrize("eps, delta, c", [(1e-300, 1e-300, 2), (1e-200, 1e-200, 30), (1e-170, 1e-170, 1)])
def test_tiny_budgets_account_the_gaussian_part(eps: float, delta: float, c: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        cal = calibrate_sparse_histogram(eps, delta, max_groups=c)
        detail = sparse_histogram_delta_detail(eps, sigma=cal.sigma, tau=cal.tau, tau_star=cal.tau_star, max_groups=c)
    with mp.workdps(400):
        want = _gaussian(eps, mp.sqrt(c) / mp.mpf(cal.sigma))
        assert abs(cal.delta_gaussian / want - 1) < 1e-9, (cal.delta_gaussian, mp.nstr(want, 10))
        assert abs(detail.delta_gaussian / want - 1) < 1e-9
    assert math.isfinite(cal.tau_star) and cal.exact_delta <= delta


@pytest.mark.parametrize("eps, mu", [(1e300, 1.0), (1e300, 1e-300), (1e200, 1e-100), (700.0, 1e-300)])
def test_gaussian_profile_at_overflowing_arguments_is_zero_without_warnings(eps: float, mu: float) -> None:
    """ε/μ beyond the double range: δ_G is 0 (log −inf), computed without numpy overflow warnings reaching
    the analyst (an epsilon of 1e300 is refused later, but the warnings came first)."""
    from dpsql.accounting.gaussian import log_gaussian_delta

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert log_gaussian_delta(eps, mu) == -math.inf
        assert log_gaussian_delta(-eps, mu) == 0.0  # δ_G(ε < 0) → 1 − e^ε = 1
