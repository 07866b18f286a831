"""The Gaussian calibrations hold against the floating-point evaluation error of δ_G.

dpsql evaluates δ_G(ε; μ) to about 1e-12 relative (``dpsql.accounting.gaussian``). A calibration
that stops where the *evaluated* δ_G crosses δ can leave the exact δ_G above δ; the inverses and
the sparse-histogram threshold search therefore meet δ·(1 − DELTA_EVAL_MARGIN) as evaluated
(``docs/mechanisms.md`` §1.2, §1.8).

Reference values, computed once offline with 60-digit arithmetic (mpmath bisection on
Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), and Theorem 5.4 summed term by term), independently of dpsql:

* the exact least σ with δ_G(ε; Δ/σ) ≤ δ:
  ε = 0.001, δ = 1e-3, Δ = 1: 276.1288755692027804 (before: dpsql chose 276.12887556918486, whose
  exact δ_G is 1e-3·(1 + 9.0e-14));
  ε = 0.1, δ = 1e-9, Δ = 1: 50.20981826301532799 (before: 50.209818263015194, 1e-9·(1 + 7.5e-14));
  ε = 0.1, δ = 1e-9, Δ = √3: 86.96595627034226262 (before: 86.96595627034203, 1e-9·(1 + 7.4e-14));
* Theorem 5.4 δ at ε = 0.1 of a COUNT per group with C_u = 3, τ = 1, τ* = 538: at the former
  σ = 86.96595627034203 it is 1.0000000000000739e-9, above the δ = 1e-9 the query was charged (plus
  its floating-point part); at σ = 86.96595627070366 it is 9.9999999988356e-10, and with τ* = 537
  it would be 1.0684539e-9 (so τ* = 538 is the least integer threshold).
"""

from __future__ import annotations

import math

import duckdb
import pytest

import dpsql
from dpsql.accounting import DELTA_EVAL_MARGIN, gaussian_mu, gaussian_sigma

# (epsilon, delta, L2 sensitivity, exact least sigma to 19 digits)
EXACT_LEAST_SIGMA = [
    (0.001, 1e-3, 1.0, 276.1288755692027804),
    (0.1, 1e-9, 1.0, 50.20981826301532799),
    (0.1, 1e-9, math.sqrt(3.0), 86.96595627034226262),
]


@pytest.mark.parametrize("eps,delta,sens,exact", EXACT_LEAST_SIGMA)
def test_gaussian_sigma_is_not_below_the_exact_least_sigma(eps, delta, sens, exact):
    s = gaussian_sigma(eps, delta, sens)
    assert s >= exact * (1 + 1e-15)  # above the exact least σ (1e-15: the decimal's float may round down)
    assert s <= exact * (1 + 1e-9)  # the allowance costs about 1e-10 relative
    assert gaussian_mu(eps, delta) <= sens / (exact * (1 + 1e-15))  # the largest μ = Δ/σ, likewise


def test_margin_is_small_and_positive():
    assert 0 < DELTA_EVAL_MARGIN <= 2.0**-30


def _session() -> dpsql.Session:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT (i % 50) AS uid, (i % 7) AS g FROM range(300) r(i)")
    s = dpsql.Session(None, budget=dpsql.Budget(10, 0.5), connection=con)
    s.register("t", "t", privacy_unit="uid", max_groups_per_unit=3)
    return s


def test_scalar_gaussian_count_sigma_covers_delta():
    with _session() as s:
        p = s.explain("SELECT COUNT(*) FROM t", epsilon=0.001, delta=1e-3)
        assert p.mechanism == "gaussian"
        assert p.parameters["sigma"] >= 276.1288755692027804 * (1 + 1e-15)
        assert p.parameters["sigma"] <= 276.1288755692027804 * (1 + 1e-9)


def test_sparse_histogram_sigma_and_threshold_cover_delta():
    with _session() as s:
        p = s.explain("SELECT g, COUNT(*) FROM t GROUP BY g", epsilon=0.1, delta=1e-9)
        assert p.mechanism == "sparse_histogram"
        sigma = p.parameters["sigma"]
        assert sigma >= 86.96595627034226262 * (1 + 1e-15)
        assert sigma <= 86.96595627034226262 * (1 + 1e-9)
        assert p.parameters["tau_star"] == 538.0
        assert p.parameters["exact_delta"] <= 1e-9 * (1 - DELTA_EVAL_MARGIN)
