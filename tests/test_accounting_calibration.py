"""Sparse-histogram calibration: choosing σ and τ* (objective n_p = τ* + Φ⁻¹(p)·σ), fixed variants."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.special import ndtri

from dpsql.accounting import (
    SparseHistogramCalibration,
    add_the_deltas_delta,
    calibrate_sparse_histogram,
    calibrate_sparse_histogram_fixed,
    gaussian_sigma,
    sparse_histogram_delta,
    sparse_histogram_min_tau_star,
    sparse_histogram_tau_star_lower_bound,
)
from dpsql.accounting.calibration import _scan_and_refine
from dpsql.errors import ConfigError

C_URL = 51914


def objective(eps, delta, sigma, c, tau=1, z=float(ndtri(0.95)), method="exact", mo=0.0):
    ts = sparse_histogram_min_tau_star(
        eps, delta, sigma=sigma, tau=tau, max_groups=c, mu_other=mo, method=method
    )
    return ts + z * sigma


def test_case_study_exact_calibration():
    cal = calibrate_sparse_histogram(0.349, 1e-5, tau=1, max_groups=C_URL)
    assert isinstance(cal, SparseHistogramCalibration)
    smin = gaussian_sigma(0.349, 1e-5, math.sqrt(C_URL))
    # the exact accounting needs no extra noise: the Gaussian-only floor is optimal (module docstring)
    assert cal.sigma == pytest.approx(smin, rel=1e-12)
    assert cal.sigma_min == pytest.approx(smin, rel=1e-12)
    lb = sparse_histogram_tau_star_lower_bound(1e-5, sigma=cal.sigma, tau=1, max_groups=C_URL)
    assert cal.tau_star == pytest.approx(lb, abs=1e-6)
    assert cal.exact_delta <= 1e-5
    assert cal.exact_delta == sparse_histogram_delta(
        0.349, sigma=cal.sigma, tau=1, tau_star=cal.tau_star, max_groups=C_URL
    )
    assert cal.exact_delta == pytest.approx(1e-5, rel=1e-9)  # both parts use the whole δ
    assert cal.delta_gaussian <= 1e-5 and cal.delta_infinite <= 1e-5
    # add-the-deltas would need a much larger threshold at this σ (almost all δ is gone to the Gaussian part)
    assert cal.add_the_deltas_tau_star > 1.5 * cal.tau_star
    assert cal.add_the_deltas_ratio > 1.5
    assert cal.add_the_deltas_delta == pytest.approx(cal.delta_gaussian + cal.delta_infinite)
    assert cal.release_count == pytest.approx(cal.tau_star + ndtri(0.95) * cal.sigma)
    assert cal.delta_tau == cal.tau_star - 1
    assert cal.method == "exact" and cal.fixed == () and cal.extra_sigmas == () and cal.mu_other == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cal.sigma = 1.0  # type: ignore[misc]


def test_case_study_add_the_deltas_calibration_is_an_interior_optimum():
    cal = calibrate_sparse_histogram(0.349, 1e-5, tau=1, max_groups=C_URL, method="add_the_deltas")
    assert cal.method == "add_the_deltas"
    assert cal.sigma > cal.sigma_min * 1.001  # trades count noise for threshold room
    assert (
        add_the_deltas_delta(0.349, sigma=cal.sigma, tau=1, tau_star=cal.tau_star, max_groups=C_URL) <= 1e-5
    )
    assert cal.tau_star == cal.add_the_deltas_tau_star
    j = cal.release_count
    for f in (0.99, 0.999, 1.001, 1.01):
        assert objective(0.349, 1e-5, cal.sigma * f, C_URL, method="add_the_deltas") >= j - 1e-6
    # the exact accounting does better on the same objective
    ex = calibrate_sparse_histogram(0.349, 1e-5, tau=1, max_groups=C_URL)
    assert ex.release_count < cal.release_count


@pytest.mark.parametrize("method", ["exact", "add_the_deltas"])
@pytest.mark.parametrize(
    "eps,delta,c,tau", [(1.0, 1e-6, 1, 1), (0.5, 1e-5, 5, 3), (1.0, 1e-7, 100, 1), (0.2, 1e-9, 2500, 10)]
)
def test_calibration_beats_a_grid_of_alternatives(method, eps, delta, c, tau):
    # independent optimality check: no σ on a fine grid over (σ_min, 3σ_min] does better
    cal = calibrate_sparse_histogram(eps, delta, tau=tau, max_groups=c, method=method)
    smin = gaussian_sigma(eps, delta, math.sqrt(c))
    assert cal.sigma >= smin
    acc = sparse_histogram_delta if method == "exact" else add_the_deltas_delta
    assert acc(eps, sigma=cal.sigma, tau=tau, tau_star=cal.tau_star, max_groups=c) <= delta
    for r in np.concatenate([np.geomspace(1e-7, 2.0, 60)]):
        assert objective(eps, delta, smin * (1 + r), c, tau, method=method) >= cal.release_count * (1 - 1e-7)


def test_release_probability_only_matters_when_there_is_a_trade_off():
    a = calibrate_sparse_histogram(1.0, 1e-6, max_groups=50, release_probability=0.5)
    b = calibrate_sparse_histogram(1.0, 1e-6, max_groups=50, release_probability=0.99)
    assert a.sigma == b.sigma and a.tau_star == b.tau_star  # exact: σ_min is optimal for every p
    c = calibrate_sparse_histogram(1.0, 1e-6, max_groups=50, method="add_the_deltas", release_probability=0.5)
    d = calibrate_sparse_histogram(
        1.0, 1e-6, max_groups=50, method="add_the_deltas", release_probability=0.99
    )
    assert d.sigma < c.sigma  # a larger weight on σ buys less noise with a larger threshold
    assert d.tau_star > c.tau_star
    assert c.release_count == pytest.approx(c.tau_star, rel=1e-12)  # z(0.5) = 0


@pytest.mark.parametrize("w", [1.0, 2.0])
def test_extra_columns_convention(w):
    sens = (100.0, 2.5, 7.0)
    eps, delta, c = 1.0, 1e-6, 20
    cal = calibrate_sparse_histogram(
        eps, delta, max_groups=c, extra_sensitivities=sens, extra_noise_multiplier=w
    )
    j = len(sens)
    assert cal.extra_sensitivities == sens
    assert cal.extra_noise_multiplier == w
    assert cal.extra_sigmas == pytest.approx(tuple(w * s * cal.sigma for s in sens))
    assert cal.mu_other == pytest.approx(math.sqrt(j) / (w * cal.sigma))
    # the Gaussian floor is that of a count with L2 sensitivity sqrt(C (1 + J/w²))
    assert cal.sigma_min == pytest.approx(
        gaussian_sigma(eps, delta, math.sqrt(c * (1 + j / w**2))), rel=1e-12
    )
    assert (
        sparse_histogram_delta(
            eps,
            sigma=cal.sigma,
            tau=1,
            tau_star=cal.tau_star,
            max_groups=c,
            mu_other=math.sqrt(j) / (w * cal.sigma),
        )
        <= delta
    )
    plain = calibrate_sparse_histogram(eps, delta, max_groups=c)
    assert cal.sigma > plain.sigma


def test_fast_enough_for_large_max_groups_without_timing_assertions():
    # (no timing assertion; this just exercises the largest documented size once)
    cal = calibrate_sparse_histogram(0.5, 1e-6, max_groups=100_000)
    assert cal.exact_delta <= 1e-6


# ----------------------------------------------------------------------------- fixed parameters
def test_fixed_sigma_fills_in_the_least_threshold():
    s = 2300.0
    cal = calibrate_sparse_histogram_fixed(0.349, 1e-5, sigma=s, max_groups=C_URL)
    assert cal.sigma == s and cal.fixed == ("sigma",)
    assert cal.tau_star == sparse_histogram_min_tau_star(0.349, 1e-5, sigma=s, tau=1, max_groups=C_URL)
    assert cal.tau_star - 1 == pytest.approx(14397.742027338154, abs=1e-6)


def test_fixed_sigma_below_the_gaussian_floor_is_refused():
    with pytest.raises(ConfigError, match=r"sigma=2228\.0 is too small") as ei:
        calibrate_sparse_histogram_fixed(0.349, 1e-5, sigma=2228.0, max_groups=C_URL)
    assert "sigma >= 2228.49" in str(ei.value)  # the hint names the floor (2228.4826…), rounded up


def test_fixed_tau_star_gives_the_least_sigma():
    eps, delta, c = 1.0, 1e-6, 50
    free = calibrate_sparse_histogram(eps, delta, max_groups=c)
    ts = free.tau_star + 40.0  # more room than needed at the floor
    cal = calibrate_sparse_histogram_fixed(eps, delta, tau_star=ts, max_groups=c)
    assert cal.fixed == ("tau_star",) and cal.tau_star == ts
    assert cal.sigma == pytest.approx(free.sigma, rel=1e-12)  # the floor itself is feasible
    assert sparse_histogram_delta(eps, sigma=cal.sigma, tau=1, tau_star=ts, max_groups=c) <= delta
    assert sparse_histogram_delta(eps, sigma=cal.sigma * (1 - 1e-9), tau=1, tau_star=ts, max_groups=c) > delta


def test_fixed_tau_star_add_the_deltas_searches_sigma():
    eps, delta, c = 1.0, 1e-6, 50
    free = calibrate_sparse_histogram(eps, delta, max_groups=c, method="add_the_deltas")
    cal = calibrate_sparse_histogram_fixed(
        eps, delta, tau_star=free.tau_star, max_groups=c, method="add_the_deltas"
    )
    assert cal.sigma <= free.sigma * (1 + 1e-9)
    assert add_the_deltas_delta(eps, sigma=cal.sigma, tau=1, tau_star=cal.tau_star, max_groups=c) <= delta
    assert (
        add_the_deltas_delta(eps, sigma=cal.sigma * (1 - 1e-6), tau=1, tau_star=cal.tau_star, max_groups=c)
        > delta
    )
    # with room to spare the least σ moves towards the Gaussian floor
    roomy = calibrate_sparse_histogram_fixed(
        eps, delta, tau_star=free.tau_star + 30.0, max_groups=c, method="add_the_deltas"
    )
    assert free.sigma_min < roomy.sigma < cal.sigma
    kw = dict(tau=1, tau_star=roomy.tau_star, max_groups=c)
    assert add_the_deltas_delta(eps, sigma=roomy.sigma, **kw) <= delta
    assert add_the_deltas_delta(eps, sigma=roomy.sigma * (1 - 1e-9), **kw) > delta


def test_fixed_tau_star_too_small_is_refused_with_the_least_feasible_value():
    free = calibrate_sparse_histogram(0.349, 1e-5, max_groups=C_URL)
    with pytest.raises(ConfigError, match="least feasible tau_star is 13951"):
        calibrate_sparse_histogram_fixed(0.349, 1e-5, tau_star=free.tau_star - 5.0, max_groups=C_URL)


def test_both_fixed_ok_and_refused_with_the_implied_delta():
    cal = calibrate_sparse_histogram_fixed(0.349, 1e-5, sigma=2300.0, tau_star=14500.0, max_groups=C_URL)
    assert cal.fixed == ("sigma", "tau_star") and cal.exact_delta <= 1e-5
    implied = sparse_histogram_delta(0.349, sigma=2300.0, tau=1, tau_star=14000.0, max_groups=C_URL)
    assert implied > 1e-5
    with pytest.raises(ConfigError, match=f"gives delta={implied:.6g}") as ei:
        calibrate_sparse_histogram_fixed(0.349, 1e-5, sigma=2300.0, tau_star=14000.0, max_groups=C_URL)
    assert "raise tau_star to at least 14398.8" in str(ei.value)  # least 14398.742…, rounded up
    # add-the-deltas accounting refuses a pair that the exact accounting accepts
    with pytest.raises(ConfigError, match="add_the_deltas accounting"):
        calibrate_sparse_histogram_fixed(
            0.349, 1e-5, sigma=2300.0, tau_star=14500.0, max_groups=C_URL, method="add_the_deltas"
        )


def test_neither_fixed_equals_free_calibration():
    a = calibrate_sparse_histogram_fixed(0.5, 1e-6, max_groups=30, tau=2)
    b = calibrate_sparse_histogram(0.5, 1e-6, max_groups=30, tau=2)
    assert a == b


# ----------------------------------------------------------------------------- the search routine
def test_scan_and_refine_finds_an_interior_minimum():
    # a U-shaped objective with its minimum at σ = 1.37·σ_min, steep near σ_min
    smin = 10.0
    target = 1.37 * smin

    def obj(s: float) -> float:
        return (s - target) ** 2 + 1.0 / (s - smin)

    s = _scan_and_refine(obj, smin, lambda _s: False, upper_ratio=3.0)
    grid = np.linspace(smin * (1 + 1e-6), 4 * smin, 200001)
    best = grid[np.argmin([obj(g) for g in grid])]
    assert s == pytest.approx(best, rel=1e-4)
    assert obj(s) <= min(obj(g) for g in grid) + 1e-9


def test_scan_and_refine_stops_where_told():
    calls = []

    def obj(s: float) -> float:
        calls.append(s)
        return s

    s = _scan_and_refine(obj, 1.0, lambda x: x > 1.0 + 1e-6, upper_ratio=1.0)
    assert s == pytest.approx(1.0, rel=1e-8)
    assert max(calls) < 1.0 + 1e-4


def test_binding_regime_search_with_a_synthetic_threshold_curve(monkeypatch):
    # In every realistic setting the exact τ*(σ) attains its closed-form bound already at σ_min, so the
    # general search is exercised here with a synthetic curve that binds on (σ_min, 1.05 σ_min):
    # τ*(σ) = τ + Δτ_LB(σ) + A·(1.05 σ_min − σ)₊ / (σ − σ_min). The optimum is found by brute force.
    import dpsql.accounting.calibration as calmod

    real = calmod._min_tau_star
    eps, delta, c, tau = 1.0, 1e-6, 40, 1
    smin = gaussian_sigma(eps, delta, math.sqrt(c))
    amp = 0.05 * smin

    def fake(e, d, s, t, cc, mo, method):
        if method != "exact":
            return real(e, d, s, t, cc, mo, method)
        if s < smin:
            return math.inf
        lb = sparse_histogram_tau_star_lower_bound(d, sigma=s, tau=t, max_groups=cc)
        return lb + amp * max(0.0, 1.05 * smin - s) / max(s - smin, 1e-300)

    monkeypatch.setattr(calmod, "_min_tau_star", fake)
    z = float(ndtri(0.95))
    cal = calibrate_sparse_histogram(eps, delta, tau=tau, max_groups=c)
    grid = smin * (1 + np.geomspace(1e-6, 0.2, 20001))
    vals = [fake(eps, delta, s, tau, c, 0.0, "exact") + z * s for s in grid]
    best = grid[int(np.argmin(vals))]
    assert smin < cal.sigma < 1.05 * smin
    assert cal.sigma == pytest.approx(best, rel=1e-4)
    assert cal.release_count <= min(vals) + 1e-6 * min(vals)
