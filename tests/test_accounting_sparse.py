"""Gaussian sparse histogram accounting (Theorem 5.4, add-the-deltas, least τ*): vectors and properties."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest
from _vectors import load_vectors
from scipy.special import ndtr, ndtri

from dpsql.accounting import (
    DELTA_EVAL_MARGIN,
    add_the_deltas_delta,
    gaussian_delta,
    gaussian_sigma,
    round_tau_star_up,
    sparse_histogram_delta,
    sparse_histogram_delta_detail,
    sparse_histogram_min_tau_star,
    sparse_histogram_tau_star_lower_bound,
)
from dpsql.accounting.sparse_histogram import _exact_bruteforce, _least_feasible

C_URL = 51914  # URL-shares case study: max_groups


def load(name: str) -> dict:
    return load_vectors(name)  # type: ignore[no-any-return]


def sh(eps, sigma, tau, tau_star, c, mo=0.0):
    return sparse_histogram_delta(eps, sigma=sigma, tau=tau, tau_star=tau_star, max_groups=c, mu_other=mo)


def add(eps, sigma, tau, tau_star, c, mo=0.0):
    return add_the_deltas_delta(eps, sigma=sigma, tau=tau, tau_star=tau_star, max_groups=c, mu_other=mo)


def min_ts(eps, delta, sigma, c, tau=1, mo=0.0, method="exact"):
    return sparse_histogram_min_tau_star(
        eps, delta, sigma=sigma, tau=tau, max_groups=c, mu_other=mo, method=method
    )


def remove_term(eps, sigma, dtau, a_eq, a_plus, mo=0.0):
    """1 − P^a₌ + P^a₌ δ_G(ε − a₌ ln P; μ_{a₊}) written out from the spec, via gaussian_delta."""
    p = ndtr(dtau / sigma)
    mu = math.sqrt(a_plus * (1 / sigma**2 + mo**2))
    return 1 - p**a_eq + p**a_eq * gaussian_delta(eps - a_eq * math.log(p), mu)


def add_term(eps, sigma, dtau, a_eq, a_plus, mo=0.0):
    p = ndtr(dtau / sigma)
    mu = math.sqrt(a_plus * (1 / sigma**2 + mo**2))
    return gaussian_delta(eps + a_eq * math.log(p), mu)


# ----------------------------------------------------------------------------- vectors
S = "sparse_histogram.json"


def test_vector_grid():
    vec = load(S)
    rel = vec["tolerance"]["relative"]
    assert len(vec["grid"]) == 144
    for g in vec["grid"]:
        mo = math.sqrt(g["mu_o2"])
        args = (g["eps"], g["sigma"], g["tau"], g["tau_star"], g["C_u"], mo)
        r = sparse_histogram_delta_detail(
            g["eps"], sigma=g["sigma"], tau=g["tau"], tau_star=g["tau_star"], max_groups=g["C_u"], mu_other=mo
        )
        assert r.delta == pytest.approx(float(Decimal(g["delta_exact_str"])), rel=rel), g
        assert r.delta == pytest.approx(g["delta_exact"], rel=rel), g
        assert r.delta_infinite == pytest.approx(g["delta_infinite"], rel=rel), g
        assert r.delta_gaussian == pytest.approx(g["delta_gaussian"], rel=rel), g
        assert [r.branch, r.a_equal] == g["argmax"], g
        assert add(*args) == pytest.approx(g["delta_add_the_deltas"], rel=rel), g


def test_vector_independent_checks():
    checks = load(S)["independent_checks"]
    kinds = set()
    for c in checks:
        kind = c["kind"]
        kinds.add(kind.split(" ")[0])
        if kind.startswith("C_u=1 direct quadrature"):
            d = sh(c["eps"], c["sigma"], c["tau"], c["tau_star"], 1)
            assert d == pytest.approx(c["theorem"], rel=1e-9)
            assert d == pytest.approx(c["brute_force"], rel=1e-9)
        elif "(a_+=1,a_==1)" in kind:
            t = remove_term(c["eps"], c["sigma"], c["dtau"], 1, 1)
            assert t == pytest.approx(c["quadrature"], rel=1e-9)
        elif "(a_+=2)" in kind:
            d = gaussian_delta(c["eps"], math.sqrt(2) / c["sigma"])
            assert d == pytest.approx(c["quadrature"], rel=1e-9)
        elif kind.startswith("Monte Carlo"):
            tau, counts = c["tau"], c["counts_in_X"]
            a_eq = sum(1 for x in counts if x == tau)
            a_plus = sum(1 for x in counts if x > tau)
            dtau = c["tau_star"] - tau
            rem = remove_term(c["eps"], c["sigma"], dtau, a_eq, a_plus, c["mu_o"])
            addd = add_term(c["eps"], c["sigma"], dtau, a_eq, a_plus, c["mu_o"])
            assert rem == pytest.approx(c["formula_remove_direction"], rel=1e-9)
            assert addd == pytest.approx(c["formula_add_direction"], rel=1e-9)
            assert abs(rem - c["mc_delta_X_vs_Xminus"]) <= 5 * c["mc_se"]
            assert abs(addd - c["mc_delta_Xminus_vs_X"]) <= 5 * c["mc_se2"]
            # the worst case over all configurations bounds this configuration
            full = sh(c["eps"], c["sigma"], tau, c["tau_star"], len(counts), c["mu_o"])
            assert full >= max(rem, addd) * (1 - 1e-12)
        else:  # pragma: no cover - a new kind of check was added to the vectors
            pytest.fail(f"unknown check kind {kind!r}")
    assert {"C_u=1", "C_u=2", "Monte"} <= kinds


def test_vector_monotone_in_margin_on_the_stated_grid():
    claim = load(S)["monotonicity_check"]
    assert claim["largest_increase_seen"] == 0.0
    for c in (1, 5, 100):
        for sigma in (1.0, 5.0):
            for eps in (0.1, 1.0, 3.0):
                for mo_s2 in (0.0, 0.3):
                    mo = math.sqrt(mo_s2) / sigma
                    ds = [sh(eps, sigma, 1, 1 + k * 0.2 * sigma, c, mo) for k in range(51)]
                    assert all(b <= a for a, b in zip(ds, ds[1:], strict=False)), (c, sigma, eps, mo_s2)


def test_vector_minimal_threshold():
    mt = load(S)["minimal_threshold"]
    tol = mt["tolerance"]["absolute_dtau"]
    assert len(mt["cases"]) == 24
    for c in mt["cases"]:
        ex = min_ts(c["eps"], c["delta"], c["sigma"], c["C_u"]) - 1
        ad = min_ts(c["eps"], c["delta"], c["sigma"], c["C_u"], method="add_the_deltas") - 1
        assert ex == pytest.approx(c["min_dtau_exact"], abs=tol), c
        assert ad == pytest.approx(c["min_dtau_add_the_deltas"], abs=tol), c
        lb = (
            sparse_histogram_tau_star_lower_bound(c["delta"], sigma=c["sigma"], tau=1, max_groups=c["C_u"])
            - 1
        )
        assert lb == pytest.approx(c["closed_form_lower_bound_sigma*Phi^-1((1-delta)^(1/Cu))"], abs=tol)
        assert ad / ex == pytest.approx(c["ratio_add_over_exact"], rel=1e-6)
        assert gaussian_delta(c["eps"], math.sqrt(c["C_u"]) / c["sigma"]) == pytest.approx(
            c["delta_gaussian_at_sigma"], rel=1e-9
        )
        assert sh(c["eps"], c["sigma"], 1, 1 + ex, c["C_u"]) <= c["delta"]
        smin = gaussian_sigma(c["eps"], c["delta"], math.sqrt(c["C_u"]))
        assert smin == pytest.approx(c["sigma_min_gaussian_only"], rel=1e-9)
        assert c["sigma"] / smin == pytest.approx(c["sigma_over_sigma_min"], rel=1e-6)
        at_ref = sh(c["eps"], c["sigma"], 1, 1 + c["min_dtau_exact"], c["C_u"])
        assert at_ref == pytest.approx(c["recheck_exact_delta_at_min"], rel=1e-9)
        if c["C_u"] == 1:  # spec §1.7 closed forms
            assert ex == pytest.approx(c["C_u=1_closed_form_exact"], abs=tol)
            assert ad == pytest.approx(c["C_u=1_closed_form_add"], abs=tol)


def test_vector_case_study_table():
    cs = load(S)["case_study_facebook_urls"]
    inp = cs["inputs"]
    c, eps, delta, tau = inp["C_u"], inp["eps"], inp["delta"], inp["tau"]
    assert gaussian_sigma(eps, delta, math.sqrt(c)) == pytest.approx(cs["min_sigma_gaussian_only"], rel=1e-9)
    for row in cs["table_min_dtau_vs_sigma"]:
        s = row["sigma"]
        assert gaussian_delta(eps, math.sqrt(c) / s) == pytest.approx(row["delta_gaussian"], rel=1e-9)
        ex = min_ts(eps, delta, s, c, tau) - tau
        ad = min_ts(eps, delta, s, c, tau, method="add_the_deltas") - tau
        lb = sparse_histogram_tau_star_lower_bound(delta, sigma=s, tau=tau, max_groups=c) - tau
        assert lb == pytest.approx(row["closed_form_sigma*Phi^-1((1-delta)^(1/Cu))"], abs=1e-6)
        if row["min_dtau_exact"] == "inf":
            assert ex == math.inf and ad == math.inf
            continue
        assert ex == pytest.approx(float(row["min_dtau_exact"]), abs=1e-6)
        # the least margins are those of δ·(1 − DELTA_EVAL_MARGIN) (the evaluation-error allowance):
        # 3.8e-6 above the vector's add-the-deltas margin at σ = 2230, where δ − δ_Gaussian is 1% of δ
        assert ad == pytest.approx(float(row["min_dtau_add_the_deltas"]), abs=1e-5)
        assert ad / ex == pytest.approx(row["ratio_add_over_exact"], rel=1e-9)
    chk = cs["recheck_50_digits_sigma2300"]
    assert sh(eps, 2300.0, tau, tau + chk["dtau"], c) == pytest.approx(chk["delta_exact"], rel=1e-9)
    fb = cs["figureB_style"]
    for p in fb["points"]:
        ts = tau + fb["dtau_for_delta_inf_1e-8"]
        r = sparse_histogram_delta_detail(p["eps"], sigma=fb["sigma"], tau=tau, tau_star=ts, max_groups=c)
        assert r.delta_gaussian == pytest.approx(p["delta_gaussian"], rel=1e-9)
        assert r.delta == pytest.approx(p["delta_exact"], rel=1e-9)
        assert add(p["eps"], fb["sigma"], tau, ts, c) == pytest.approx(p["delta_add_the_deltas"], rel=1e-9)


# The §1.9 table, embedded so that it is checked even without the vector files.
CASE_STUDY = [  # sigma, exact Δτ, add-the-deltas Δτ
    (2230.0, 13959.549878680036, 15491.379057950098),
    (2250.0, 14084.747635439498, 14785.500074964375),
    (2300.0, 14397.742027338154, 14748.98671880237),
    (2400.0, 15023.730811135465, 15169.131230362837),
]


@pytest.mark.parametrize("sigma,dtau_exact,dtau_add", CASE_STUDY)
def test_case_study_table_embedded(sigma, dtau_exact, dtau_add):
    assert min_ts(0.349, 1e-5, sigma, C_URL) - 1 == pytest.approx(dtau_exact, abs=1e-6)
    # abs 1e-5: the margin of δ·(1 − DELTA_EVAL_MARGIN), 3.8e-6 above the vector's at σ = 2230
    assert min_ts(0.349, 1e-5, sigma, C_URL, method="add_the_deltas") - 1 == pytest.approx(dtau_add, abs=1e-5)


def test_case_study_infeasible_below_gaussian_floor():
    assert min_ts(0.349, 1e-5, 2228.0, C_URL) == math.inf
    assert min_ts(0.349, 1e-5, 2228.0, C_URL, method="add_the_deltas") == math.inf


# ----------------------------------------------------------------------------- independent checks
def _random_cases(n: int, seed: int, sizes):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        c = int(rng.choice(sizes))
        sigma = float(10 ** rng.uniform(-0.5, 2.5))
        eps = float(10 ** rng.uniform(-2, 0.7))
        dtau = float(sigma * rng.uniform(-1.0, 8.0))
        mo = float(rng.choice([0.0, rng.uniform(0, 2) / sigma]))
        tau = int(rng.integers(1, 20))
        yield c, sigma, eps, dtau, mo, tau


def test_matches_brute_force_maximum_over_all_terms():
    # the screened/blocked evaluation equals the plain maximum over all 2·C_u + 1 terms
    sizes = [1, 2, 3, 17, 400, 2048, 2049, 5003]
    for c, sigma, eps, dtau, mo, tau in _random_cases(50, 11, sizes):
        fast = sh(eps, sigma, tau, tau + dtau, c, mo)
        ref = _exact_bruteforce(eps, sigma, dtau, c, mo)
        assert fast == pytest.approx(ref, rel=1e-12, abs=1e-300), (c, sigma, eps, dtau, mo)


def test_matches_brute_force_case_study_size():
    for sigma, dtau in [(2230.0, 13959.55), (2300.0, 14000.0), (2300.0, 20000.0), (2250.0, 9000.0)]:
        fast = sh(0.349, sigma, 1, 1 + dtau, C_URL)
        assert fast == pytest.approx(_exact_bruteforce(0.349, sigma, dtau, C_URL, 0.0), rel=1e-12)


def test_corollary_bounds_on_random_grid():
    sizes = [1, 2, 5, 40, 300, 3000]
    for c, sigma, eps, dtau, mo, tau in _random_cases(200, 5, sizes):
        r = sparse_histogram_delta_detail(
            eps, sigma=sigma, tau=tau, tau_star=tau + dtau, max_groups=c, mu_other=mo
        )
        lower = max(r.delta_infinite, r.delta_gaussian)
        upper = add(eps, sigma, tau, tau + dtau, c, mo)
        assert lower <= r.delta * (1 + 1e-12)
        assert r.delta <= upper * (1 + 1e-12)
        # 1 − P^C from the upper tail Φ(−Δτ/σ), independently of the implementation's log_ndtr
        assert r.delta_infinite == pytest.approx(-math.expm1(c * math.log1p(-ndtr(-dtau / sigma))), rel=1e-9)
        assert r.delta_gaussian == pytest.approx(
            gaussian_delta(eps, math.sqrt(c * (1 / sigma**2 + mo**2))), rel=1e-12
        )


def test_single_group_closed_form():
    # C_u = 1: δ = max(1 − Φ(Δτ/σ), δ_G(ε; 1/σ)) (spec §1.7)
    for sigma in (0.7, 2.0, 9.0):
        for eps in (0.05, 0.5, 2.0):
            for dtau_s in (-0.5, 0.0, 1.0, 3.0, 6.0):
                ref = max(1 - ndtr(dtau_s), gaussian_delta(eps, 1 / sigma))
                assert sh(eps, sigma, 3, 3 + dtau_s * sigma, 1) == pytest.approx(ref, rel=1e-12)


def test_monotonicity_in_each_argument():
    base = dict(eps=0.5, sigma=4.0, tau=2, ts=2 + 14.0, c=20, mo=0.05)

    def f(**kw):
        p = {**base, **kw}
        return sh(p["eps"], p["sigma"], p["tau"], p["ts"], p["c"], p["mo"])

    d_ts = [f(ts=2 + x) for x in np.linspace(0, 40, 41)]
    assert all(b <= a for a, b in zip(d_ts, d_ts[1:], strict=False))
    assert d_ts[0] > d_ts[-1]
    d_c = [f(c=c) for c in (1, 2, 5, 20, 100, 1000)]
    assert all(b > a for a, b in zip(d_c, d_c[1:], strict=False))
    d_mo = [f(mo=m) for m in (0.0, 0.05, 0.2, 1.0)]
    assert all(b > a for a, b in zip(d_mo, d_mo[1:], strict=False))
    d_eps = [f(eps=e) for e in (0.01, 0.1, 0.5, 1.0, 3.0)]
    assert all(b <= a for a, b in zip(d_eps, d_eps[1:], strict=False))
    # only the margin τ* − τ matters
    assert f(tau=2, ts=16.0) == f(tau=7, ts=21.0)


def test_add_the_deltas_can_exceed_one_but_exact_cannot():
    assert add(0.1, 1.0, 1, 1.0, 100) > 1.0
    assert sh(0.1, 1.0, 1, 1.0, 100) <= 1.0


# ----------------------------------------------------------------------------- least τ*
ROUND_TRIP = [
    (eps, delta, c, r)
    for eps in (0.1, 1.0)
    for delta in (1e-9, 1e-5)
    for c in (1, 7, 300, 4000)
    for r in (1e-9, 1e-3, 0.2, 2.0)  # σ = σ_min (1 + r)
]


@pytest.mark.parametrize("eps,delta,c,r", ROUND_TRIP)
def test_min_tau_star_round_trip(eps, delta, c, r):
    sigma = gaussian_sigma(eps, delta, math.sqrt(c)) * (1 + r)
    for method, fn in (("exact", sh), ("add_the_deltas", add)):
        ts = min_ts(eps, delta, sigma, c, tau=3, method=method)
        assert math.isfinite(ts)
        assert fn(eps, sigma, 3, ts, c) <= delta * (1 - DELTA_EVAL_MARGIN)  # the exact δ is then <= delta
        assert fn(eps, sigma, 3, 3 + (ts - 3) * (1 - 1e-9), c) > delta * (1 - DELTA_EVAL_MARGIN)
    ex, ad = min_ts(eps, delta, sigma, c), min_ts(eps, delta, sigma, c, method="add_the_deltas")
    assert ex <= ad * (1 + 1e-14)  # exact ≤ add-the-deltas (up to the last-ulp search)
    lb = sparse_histogram_tau_star_lower_bound(delta, sigma=sigma, tau=1, max_groups=c)
    assert ex >= lb * (1 - 1e-12)


@pytest.mark.parametrize("c", [1, 9, 250])
def test_min_tau_star_with_extra_columns(c):
    eps, delta = 0.7, 1e-6
    mo_rel = 1.3  # μ_o σ
    sigma = gaussian_sigma(eps, delta, math.sqrt(c * (1 + mo_rel**2))) * 1.01
    mo = mo_rel / sigma
    ts = min_ts(eps, delta, sigma, c, mo=mo)
    assert sh(eps, sigma, 1, ts, c, mo) <= delta
    assert sh(eps, sigma, 1, 1 + (ts - 1) * (1 - 1e-9), c, mo) > delta
    # without the extra columns a smaller σ would do; with them this σ is close to the floor
    assert min_ts(eps, delta, sigma / 1.5, c, mo=mo) == math.inf


def test_single_group_minimal_margins_closed_forms():
    # spec §1.7: Δτ_exact = σΦ⁻¹(1 − δ), Δτ_add = σΦ⁻¹(1 − δ + δ_G)
    eps, delta = 1.0, 1e-6
    for factor in (1.001, 1.01, 1.5):
        sigma = gaussian_sigma(eps, delta) * factor
        dg = gaussian_delta(eps, 1 / sigma)
        assert min_ts(eps, delta, sigma, 1) - 1 == pytest.approx(-sigma * ndtri(delta), rel=1e-9)
        assert min_ts(eps, delta, sigma, 1, method="add_the_deltas") - 1 == pytest.approx(
            -sigma * ndtri(delta - dg), rel=1e-9
        )


def test_least_feasible_search_when_the_bound_is_not_attained():
    # the Brent search used when the closed-form bound is infeasible, on a known monotone profile
    def profile(x: float) -> float:
        return 0.5 * math.exp(-x) + 1e-3

    root = math.log(0.5 / 0.009)
    x = _least_feasible(profile, 0.0, 50.0, 0.01)
    assert x == pytest.approx(root, rel=1e-12)
    assert profile(x) <= 0.01 < profile(x * (1 - 1e-12))
    assert _least_feasible(profile, 6.0, 50.0, 0.01) == 6.0


def test_round_tau_star_up():
    assert round_tau_star_up(13959.2) == 13960.0
    assert round_tau_star_up(17.0) == 17.0
    assert round_tau_star_up(17.01, 0.5) == 17.5
    assert round_tau_star_up(-0.3) == 0.0
    x = 0.1 + 0.2  # 0.30000000000000004
    assert round_tau_star_up(x, 0.1) >= x


@pytest.mark.parametrize(
    "c,sigma,eps,dtau",
    [
        (3000, 60.0, 20.0, 3000.0),
        (5003, 60.0, 12.0, 180.0),
        (2500, 30.0, 60.0, 1e6),
        (4000, 50.0, 9.0, 250.0),
    ],
)
def test_matches_brute_force_in_the_far_tail(c, sigma, eps, dtau):
    # δ from ~1e-100 down to an underflowing 0: screening must neither drop the maximum nor stall
    fast = sh(eps, sigma, 1, 1 + dtau, c)
    ref = _exact_bruteforce(eps, sigma, dtau, c, 0.0)
    assert fast == pytest.approx(ref, rel=1e-12, abs=0.0)
