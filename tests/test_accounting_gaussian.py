"""Exact Gaussian privacy profile and its inverses: spec vectors plus independent checks."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest
from _vectors import load_vectors
from scipy.integrate import quad
from scipy.special import erfcx, ndtr
from scipy.stats import norm

from dpsql.accounting import (
    DELTA_EVAL_MARGIN,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu,
    gaussian_sigma,
    log_gaussian_delta,
)
from dpsql.accounting.gaussian import _erfcx_diff


def load(name: str) -> dict:
    return load_vectors(name)  # type: ignore[no-any-return]


def log_of_decimal_string(s: str) -> float:
    return float(Decimal(s).ln())


# ----------------------------------------------------------------------------- vectors
G = "gaussian_mechanism.json"


def test_vector_grid_values_and_strings():
    vec = load(G)
    rel = vec["tolerance"]["relative"]
    assert len(vec["cases"]) == 35
    for c in vec["cases"]:
        d = gaussian_delta(c["eps"], c["mu"])
        if c["delta"] > 1e-300:
            assert d == pytest.approx(c["delta"], rel=rel, abs=vec["tolerance"]["absolute"]), c
        # every case, including those stored only as strings (2.6e-547), compared in log space
        lg = log_gaussian_delta(c["eps"], c["mu"])
        ref = log_of_decimal_string(c["delta_str"])
        assert abs(lg - ref) <= rel * max(1.0, abs(ref)), c


def test_vector_below_float_range_is_finite_in_log_space():
    vec = load(G)
    tiny = [c for c in vec["cases"] if c["delta"] == 0.0]
    assert tiny, "the vector file should contain a case below 1e-300"
    for c in tiny:
        assert gaussian_delta(c["eps"], c["mu"]) == 0.0
        assert math.isfinite(log_gaussian_delta(c["eps"], c["mu"]))


def test_vector_case_study_url_shares():
    cs = load(G)["case_study_facebook_urls"]
    inp = cs["inputs"]
    mu = math.sqrt(inp["C_u"]) / inp["sigma"]
    assert mu == pytest.approx(inp["mu"], rel=1e-15)
    assert gaussian_delta(inp["eps"], mu) == pytest.approx(cs["delta"], rel=1e-9)
    assert log_gaussian_delta(inp["eps"], mu) == pytest.approx(
        log_of_decimal_string(cs["delta_str"]), abs=1e-9
    )
    assert gaussian_epsilon(1e-5, mu) == pytest.approx(cs["eps_at_delta_1e-5"], rel=1e-9)
    assert gaussian_sigma(inp["eps"], 1e-5, sensitivity=math.sqrt(inp["C_u"])) == pytest.approx(
        cs["min_sigma_for_eps0.349_delta1e-5"], rel=1e-9
    )


def test_vector_inverse_problems():
    for c in load(G)["inverse"]:
        assert gaussian_mu(c["eps"], c["delta"]) == pytest.approx(c["max_mu"], rel=1e-9)
        sigma = gaussian_sigma(c["eps"], c["delta"])
        assert sigma == pytest.approx(c["min_sigma_for_sensitivity_1"], rel=1e-9)
        assert gaussian_delta(c["eps"], 1.0 / sigma) == pytest.approx(c["recheck_delta"], rel=1e-9)


# ----------------------------------------------------------------------------- independent checks
def _plrv_quadrature(eps: float, mu: float) -> float:
    """δ = E[(1 − e^{ε−L})₊], L ∼ N(μ²/2, μ²): a positive integrand, no cancellation."""

    def f(u: float) -> float:
        return -math.expm1(-u) * norm.pdf(eps + u, loc=0.5 * mu * mu, scale=mu)

    start = max(0.0, 0.5 * mu * mu - eps)  # where the density of L − ε peaks (or 0)
    edges = [0.0, start, start + 40.0 * mu] if start > 0 else [0.0, 40.0 * mu]
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        total += quad(f, lo, hi, epsabs=0.0, epsrel=1e-12, limit=400)[0]
    return total


@pytest.mark.parametrize(
    "mu,eps",
    [(1e-3, 0.0), (1e-3, 1e-3), (1e-3, 0.02), (1e-2, 0.2), (0.05, 1.0), (0.3, 0.5), (3.0, 0.1), (3.0, 6.0)],
)
def test_matches_plrv_quadrature_including_small_mu(mu, eps):
    # small μ is where the textbook Φ(a) − e^εΦ(b) loses digits; the reference integrates a positive function
    ref = _plrv_quadrature(eps, mu)
    assert gaussian_delta(eps, mu) == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("eps", [-3.0, -1.0, -0.2, -1e-3])
def test_negative_epsilon_matches_textbook_formula(mu, eps):
    # for ε < 0 the textbook difference has no cancellation (δ ≥ 1 − e^ε), so it is a fair reference
    a, b = mu / 2 - eps / mu, -mu / 2 - eps / mu
    ref = ndtr(a) - math.exp(eps) * ndtr(b)
    assert gaussian_delta(eps, mu) == pytest.approx(ref, rel=1e-12)
    assert gaussian_delta(eps, mu) >= -math.expm1(eps)


@pytest.mark.parametrize("mu", [1e-3, 0.1, 1.0, 4.0])
def test_continuous_across_internal_branch_boundaries(mu):
    # the evaluation switches form at ε = μ²/2 (a = 0) and at ε = 0 (reflection)
    for e0 in (0.5 * mu * mu, 0.0):
        lo = gaussian_delta(e0 - 1e-9 * max(e0, 1e-3), mu)
        hi = gaussian_delta(e0 + 1e-9 * max(e0, 1e-3), mu)
        assert lo >= hi
        assert hi == pytest.approx(lo, rel=1e-7)


def test_erfcx_difference_quadrature_agrees_with_direct_difference():
    # where the direct difference is well conditioned (h ≥ 0.3) the quadrature must agree with it
    x1 = np.array([0.0, 0.5, 2.0, 10.0, 25.0])
    for h in (0.3, 0.45, 0.49):
        hh = np.full_like(x1, h)
        direct = erfcx(x1) - erfcx(x1 + hh)
        refined = _erfcx_diff(x1, hh)
        np.testing.assert_allclose(refined, direct, rtol=1e-12)


def test_monotone_in_epsilon_and_mu():
    eps = np.linspace(-4, 8, 241)
    for mu in (0.01, 0.1, 0.7, 1.0, 3.0):
        d = gaussian_delta(eps, mu)
        assert np.all(np.diff(d) <= 0), mu
        ld = log_gaussian_delta(eps, mu)
        assert np.all(np.diff(ld) < 0), mu  # strictly decreasing in log space, even in the far tail
    mus = np.geomspace(1e-3, 20, 200)
    for e in (-1.0, 0.0, 0.3, 1.0, 5.0):
        ld = log_gaussian_delta(e, mus)
        assert np.all(np.diff(ld) >= 0), e
        live = ld[:-1] < -1e-9  # strictly increasing wherever δ is not 1 − e^ε or 1 to float precision
        if e >= 0:
            assert np.all(np.diff(ld)[live] > 0), e


def test_limits_and_bounds():
    assert gaussian_delta(0.5, 0.0) == 0.0
    assert gaussian_delta(-0.5, 0.0) == pytest.approx(-math.expm1(-0.5), rel=1e-15)
    assert gaussian_delta(0.0, 1e-9) == pytest.approx(1e-9 / math.sqrt(2 * math.pi), rel=1e-6)
    assert gaussian_delta(1.0, 60.0) == pytest.approx(1.0, abs=1e-12)
    # δ_G(ε) ≤ Φ(μ/2 − ε/μ) (drop the subtracted term)
    for e in (0.1, 1.0, 3.0):
        for mu in (0.2, 1.0, 2.5):
            assert gaussian_delta(e, mu) <= ndtr(mu / 2 - e / mu)


def test_vectorised_matches_scalar_and_broadcasts():
    eps = np.array([[-1.0, 0.0, 0.5], [1.0, 2.0, 7.0]])
    mu = np.array([0.2, 1.0, 3.0])
    out = gaussian_delta(eps, mu)
    assert out.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert out[i, j] == gaussian_delta(float(eps[i, j]), float(mu[j]))
    assert isinstance(gaussian_delta(1.0, 1.0), float)


# ----------------------------------------------------------------------------- inverses
GRID = [(e, d) for e in (0.0, 0.05, 0.349, 1.0, 3.0, 10.0) for d in (1e-300, 1e-12, 1e-7, 1e-5, 1e-3, 0.1)]


@pytest.mark.parametrize("eps,delta", GRID)
def test_gaussian_sigma_round_trip(eps, delta):
    for sens in (1.0, math.sqrt(51914)):
        s = gaussian_sigma(eps, delta, sensitivity=sens)
        assert gaussian_delta(eps, sens / s) <= delta
        assert gaussian_delta(eps, sens / (s * (1 - 1e-9))) > delta


@pytest.mark.parametrize("eps,delta", GRID)
def test_gaussian_mu_round_trip(eps, delta):
    m = gaussian_mu(eps, delta)
    assert gaussian_delta(eps, m) <= delta
    assert gaussian_delta(eps, m * (1 + 1e-9)) > delta


@pytest.mark.parametrize("eps,delta", GRID)
def test_gaussian_mu_is_at_the_crossing(eps, delta):
    """gaussian_mu solves to about the float resolution of log δ_G for the target δ·(1 − margin)
    (DELTA_EVAL_MARGIN covers the ~1e-12 evaluation error of δ_G): safe, and 1e-12 relative
    further is not (log δ_G is flat over a few ulps, so "the largest safe float" is not sharper
    than that); the margin costs less than 1e-9 relative in μ."""
    m = gaussian_mu(eps, delta)
    log_t = math.log(delta) + math.log1p(-DELTA_EVAL_MARGIN)
    assert log_gaussian_delta(eps, m) <= log_t and gaussian_delta(eps, m) <= delta * (1 - DELTA_EVAL_MARGIN)
    assert log_gaussian_delta(eps, m * (1 + 1e-12)) > log_t  # negative control: a little further is unsafe
    assert log_gaussian_delta(eps, m * (1 + 1e-9)) > math.log(delta)  # the margin is small


def test_bisect_floats_finds_the_crossing_float():
    from dpsql.accounting.gaussian import _bisect_floats

    # g(x) = x - 1/3 crosses 0 between two adjacent floats; the answer is the lower one
    x = _bisect_floats(lambda t: t - 1.0 / 3.0, 1e-3, 10.0)
    assert x == 1.0 / 3.0
    assert _bisect_floats(lambda t: t - 1.0 / 3.0 - 1e-17, 1e-3, 10.0) == 1.0 / 3.0
    y = _bisect_floats(lambda t: math.log(t) + 40.0, 1e-30, 1.0)  # root e^-40, far from both ends
    assert math.log(y) + 40.0 <= 0 < math.log(float(np.nextafter(y, 1.0))) + 40.0
    assert _bisect_floats(lambda t: -1.0, 1.0, 2.0) == 2.0  # g <= 0 on the whole bracket
    assert _bisect_floats(lambda t: 1.0, 1.0, 2.0) == 1.0  # g > 0 on the whole bracket


@pytest.mark.parametrize("mu", [0.01, 0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("delta", [1e-300, 1e-50, 1e-9, 1e-5, 1e-2])
def test_gaussian_epsilon_round_trip(mu, delta):
    e = gaussian_epsilon(delta, mu)
    assert gaussian_delta(e, mu) <= delta
    if e > 0:
        assert gaussian_delta(e * (1 - 1e-9), mu) > delta


def test_gaussian_epsilon_is_zero_when_delta_is_large():
    mu = 0.1
    assert gaussian_delta(0.0, mu) < 0.1
    assert gaussian_epsilon(0.1, mu) == 0.0
    assert gaussian_epsilon(0.5, 0.0) == 0.0


def test_a_calibration_asked_again_is_not_solved_again(monkeypatch):
    """Every query with the same budget and caps asks for the same σ: it is solved once (before:
    some twenty evaluations of δ_G per query), and a changed argument is solved anew."""
    import dpsql.accounting.gaussian as g
    from dpsql.errors import ConfigError

    calls = []
    real = g._ldg
    monkeypatch.setattr(g, "_ldg", lambda *a: calls.append(a) or real(*a))
    first = gaussian_sigma(0.7317, 3.1e-7, 2.5)
    assert calls
    calls.clear()
    assert gaussian_sigma(0.7317, 3.1e-7, 2.5) == first
    assert gaussian_sigma(np.float64(0.7317), 3.1e-7, 2.5) == first
    assert not calls
    other = gaussian_sigma(0.7317, 3.1e-7, 2.6)
    assert calls and other > first  # negative control: another sensitivity is solved
    with pytest.raises(ConfigError):
        gaussian_sigma(0.7317, 3.1e-7, -1.0)  # the checks still run on every call
