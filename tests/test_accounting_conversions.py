"""RDP/zCDP/pure-DP conversions, Laplace/Gaussian helpers and the discrete Gaussian: vectors and checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _vectors import load_vectors
from scipy.optimize import minimize_scalar

from dpsql.accounting import (
    Budget,
    compose,
    discrete_gaussian_delta,
    discrete_gaussian_normaliser,
    discrete_gaussian_pmf,
    discrete_gaussian_variance,
    discrete_laplace_pmf,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_rdp,
    gaussian_zcdp,
    laplace_scale,
    pure_to_rdp,
    pure_to_zcdp,
    rdp_delta,
    rdp_to_dp,
    zcdp_delta,
    zcdp_optimal_alpha,
    zcdp_to_dp,
)


def load(name: str) -> dict:
    return load_vectors(name)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- vectors
def test_vector_single_order_conversions():
    so = load("conversions.json")["single_order"]
    rel = so["tolerance"]["relative"]
    for c in so["cases"]:
        assert rdp_to_dp(c["alpha"], c["rho"], c["delta"], method="mironov") == pytest.approx(
            c["eps_mironov"], rel=rel
        )
        e = rdp_to_dp(c["alpha"], c["rho"], c["delta"], method="cks")
        assert e == pytest.approx(c["eps_cks_balle"], rel=rel)
        assert rdp_delta(c["alpha"], c["rho"], e) == pytest.approx(c["cks_delta_roundtrip"], rel=1e-12)
        assert e < c["eps_mironov"]


def test_vector_gaussian_comparison():
    g = load("conversions.json")["gaussian"]
    rel = g["tolerance"]["relative"]
    for c in g["cases"]:
        rho = gaussian_zcdp(c["sigma"], c["sensitivity"])
        assert rho == pytest.approx(c["rho_zcdp"], rel=1e-15)
        assert zcdp_to_dp(rho, c["delta"], method="classic") == pytest.approx(c["eps_zcdp_classic"], rel=rel)
        a_star = zcdp_optimal_alpha(rho, c["delta"], method="classic")
        assert a_star == pytest.approx(c["alpha_star_mironov"], rel=rel)
        assert rdp_to_dp(a_star, a_star * rho, c["delta"], method="mironov") == pytest.approx(
            c["eps_mironov_opt"], rel=rel
        )
        cks = zcdp_to_dp(rho, c["delta"], method="cks")
        assert cks == pytest.approx(c["eps_cks_opt"], rel=rel)
        assert cks == pytest.approx(c["eps_cks_via_cor13_50digits"], rel=rel)
        exact = gaussian_epsilon(c["delta"], c["sensitivity"] / c["sigma"])
        assert exact == pytest.approx(c["eps_exact_gaussian_profile"], rel=rel)
        assert exact <= cks <= c["eps_mironov_opt"]


def test_vector_opendp_crosscheck():
    o = load("conversions.json")["external_crosscheck_opendp"]
    assert zcdp_to_dp(o["rho"], o["delta"]) == pytest.approx(o["eps_opendp_test"], rel=1e-12)
    assert zcdp_delta(o["rho"], 0.0) == pytest.approx(o["delta_at_eps0_opendp_test"], rel=1e-12)


def test_vector_pure_to_zcdp():
    for c in load("conversions.json")["pure_to_zcdp"]["cases"]:
        assert pure_to_zcdp(c["eps"]) == pytest.approx(c["rho"], rel=1e-15)


# The OpenDP cross-check, embedded so that it runs without the vector files.
def test_opendp_crosscheck_embedded():
    assert zcdp_to_dp(1 / 32, 1e-3) == pytest.approx(0.6880024554878086, rel=1e-12)
    assert zcdp_delta(1 / 32, 0.0) == pytest.approx(0.1508457845622862, rel=1e-12)


# ----------------------------------------------------------------------------- independent checks
@pytest.mark.parametrize("rho", [1e-4, 0.005, 0.5, 3.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-3, 0.2])
def test_cks_is_the_minimum_over_alpha_and_inverts_zcdp_delta(rho, delta):
    eps = zcdp_to_dp(rho, delta)

    def eps_at(log_am1: float) -> float:
        a = 1 + math.exp(log_am1)
        return rdp_to_dp(a, a * rho, delta, method="cks")

    res = minimize_scalar(eps_at, bounds=(-20, 20), method="bounded", options={"xatol": 1e-12})
    assert eps <= float(res.fun) + 1e-12
    assert eps == pytest.approx(float(res.fun), rel=1e-7, abs=1e-12)
    if eps > 0:
        assert zcdp_delta(rho, eps) == pytest.approx(delta, rel=1e-8)
    assert eps <= zcdp_to_dp(rho, delta, method="classic")


def test_conversion_orderings_for_gaussians():
    for sigma in (0.5, 1.0, 3.0, 20.0):
        rho = gaussian_zcdp(sigma)
        for delta in (1e-9, 1e-5, 1e-2):
            exact = gaussian_epsilon(delta, 1 / sigma)
            cks = zcdp_to_dp(rho, delta)
            classic = zcdp_to_dp(rho, delta, method="classic")
            assert exact <= cks <= classic
        for eps in (0.1, 1.0, 4.0):
            assert gaussian_delta(eps, 1 / sigma) <= zcdp_delta(rho, eps)


def test_small_helpers():
    assert laplace_scale(0.5, 2.0) == 4.0
    assert laplace_scale(2.0) == 0.5
    assert gaussian_rdp(4.0, 2.0, 1.0) == pytest.approx(4 * 1 / 8)
    assert pure_to_rdp(3.0, 1.0) == pytest.approx(1.5)
    assert zcdp_to_dp(0.0, 1e-6) == 0.0
    assert rdp_to_dp(2.0, 0.0, 0.9, method="cks") == 0.0  # a negative bound is reported as 0
    assert rdp_delta(2.0, 5.0, 0.0) == 1.0  # capped


def test_budget_and_compose_are_reexported():
    total = compose([Budget(0.1, 1e-6)] * 10)
    assert total == Budget(1.0, 1e-5)


# ----------------------------------------------------------------------------- discrete Gaussian
def test_vector_discrete_gaussian_moments_and_pmf():
    dg = load("discrete_gaussian.json")
    for m in dg["moments"]:
        s = m["sigma"]
        assert discrete_gaussian_normaliser(s) == pytest.approx(m["normaliser"], rel=1e-12)
        assert discrete_gaussian_normaliser(s) / (math.sqrt(2 * math.pi) * s) == pytest.approx(
            m["normaliser_over_sqrt(2pi)sigma"], rel=1e-12
        )
        assert discrete_gaussian_variance(s) == pytest.approx(m["variance"], rel=1e-12)
        for x, p in m["pmf"].items():
            assert discrete_gaussian_pmf(int(x), s) == pytest.approx(p, rel=1e-12)
            assert discrete_gaussian_pmf(-int(x), s) == pytest.approx(p, rel=1e-12)


def test_vector_discrete_gaussian_profile():
    prof = load("discrete_gaussian.json")["privacy_profile"]
    rel = prof["tolerance"]["relative"]
    for c in prof["cases"]:
        d = discrete_gaussian_delta(c["eps"], c["sigma"], c["Delta"])
        assert d == pytest.approx(c["delta_discrete_direct_sum"], rel=rel)
        assert d == pytest.approx(c["delta_discrete_closed_form"], rel=rel)
        assert gaussian_delta(c["eps"], c["Delta"] / c["sigma"]) == pytest.approx(
            c["delta_continuous_gaussian_same_sigma"], rel=1e-12
        )
        assert gaussian_zcdp(c["sigma"], c["Delta"]) == pytest.approx(c["zcdp_rho"], rel=1e-15)
        assert d <= zcdp_delta(c["zcdp_rho"], c["eps"])  # the zCDP guarantee holds for the discrete noise


def test_vector_discrete_laplace():
    for c in load("discrete_gaussian.json")["discrete_laplace"]["cases"]:
        assert discrete_laplace_pmf(0, c["t"]) == pytest.approx(c["P(0)"], rel=1e-12)
        assert discrete_laplace_pmf(1, c["t"]) == pytest.approx(c["P(1)"], rel=1e-12)


def test_discrete_gaussian_against_plain_sums():
    for s in (0.7, 1.3, 4.0, 12.0):
        x = np.arange(-400, 401, dtype=float)
        w = np.exp(-x * x / (2 * s * s))
        assert discrete_gaussian_normaliser(s) == pytest.approx(w.sum(), rel=1e-13)
        assert discrete_gaussian_variance(s) == pytest.approx((x * x * w).sum() / w.sum(), rel=1e-12)
        for d_int in (1, 3):
            for eps in (0.0, 0.5, 2.0):
                p = w / w.sum()
                thr1 = eps * s * s / d_int - d_int / 2
                thr2 = eps * s * s / d_int + d_int / 2
                ref = p[x > thr1].sum() - math.exp(eps) * p[x > thr2].sum()
                assert discrete_gaussian_delta(eps, s, d_int) == pytest.approx(ref, rel=1e-10, abs=1e-15)


def test_discrete_laplace_sums_to_one():
    for t in (0.5, 1.0, 7.0):
        x = np.arange(-2000, 2001)
        assert discrete_laplace_pmf(x, t).sum() == pytest.approx(1.0, rel=1e-12)


def test_discrete_profile_differs_from_continuous():
    # spec §5: σ = 2, Δ = 1, ε = 1
    assert discrete_gaussian_delta(1.0, 2.0, 1) == pytest.approx(7.249e-3, rel=1e-3)
    assert gaussian_delta(1.0, 0.5) == pytest.approx(6.830e-3, rel=1e-3)
