"""Goodness of fit of the noise the Session actually adds, against the scales pinned by hand in
``test_calibration_pinned.py`` (derivations there).

Each test releases a GROUP BY over thousands of groups whose bounded truth is known by
construction (every group holds the same units count and sum; checked against a zero-noise
golden), so one query gives thousands of i.i.d. draws of "released - truth". They are tested
against "truth + noise of the pinned scale, rounded to the release grid" (the integer grid of
counts, the declared rounding grid of sums, the power-of-two snapping grid Lambda >= lambda of
Laplace releases) by ``_calib.gof_pvalue``: chi-square over grid cells and continuity-aware KS,
combined by Bonferroni.

Failure probability: a correctly calibrated mechanism fails each test with probability <= 1e-6
(ALPHA; the seeds are fixed, so the outcome is reproducible). Negative controls, which must
fail: the same query with every Gaussian/Laplace sample multiplied by 0.7 (under-noised: e.g. an
L2 sensitivity of 1 instead of sqrt 2) and by 1.3 (over-noised). With these sample sizes the
chi-square non-centrality against 0.7x / 1.3x is >= 150, so a control passes with probability
< 1e-10.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _calib import ALPHA, ScaledNoise, gof_pvalue, key_domain, spread_table
from scipy import stats
from test_calibration_pinned import (
    GRID_C3_COUNT,
    GRID_C3_SUM,
    LAMBDA_C3_COUNT,
    LAMBDA_C3_SUM,
    SIGMA_1,
    SIGMA_2,
    SIGMA_SQRT6,
    SUM_SIGMA_S3,
    TAU_STAR_S3,
)

import dpsql
from dpsql.testing import use_noise, zero_noise

GROUPS = 3000
# Laplace, C_u = 2, one COUNT column, eps = 1: eps_c = 1/2, K = 33, lambda = 1 / (1/2 - 2^-11 - 2^-44),
# Lambda = 4 (>= lambda)
LAMBDA_C2 = 2.0019550342133265
GRID_C2 = 4.0
FACTORS = (1.0, 0.7, 1.3)


def _releases(
    table: Any, sql: str, *, c_u: int, eps: float, delta: float, seed: str, public: bool = True,
    tau: int = 1, bounds: bool = False,
) -> tuple[dict[str, Any], dict[float, dict[str, np.ndarray]]]:
    """Zero-noise golden (one row per group) and, per noise factor, the released columns."""
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    cols: dict[str, Any] = {}
    if public:
        cols["k"] = {"domain": key_domain(GROUPS)}
    if bounds:
        cols["v"] = {"bounds": (0, 10)}
    s.register("t", table, privacy_unit="uid", max_groups_per_unit=c_u, tau=tau, columns=cols or None)
    use_noise(s, zero_noise())
    golden = s.query(sql, epsilon=eps, delta=delta).table
    out: dict[float, dict[str, np.ndarray]] = {}
    for f in FACTORS:
        use_noise(s, ScaledNoise(f"{seed}-{f}", f))
        rel = s.query(sql, epsilon=eps, delta=delta).table
        out[f] = {c: np.asarray(rel.column(c).to_pylist(), dtype=np.float64) for c in rel.column_names if c != "k"}
    s.close()
    return {c: golden.column(c).to_pylist() for c in golden.column_names if c != "k"}, out


def _assert_fit(draws: dict[float, dict[str, np.ndarray]], col: str, truth: float, dist: Any, grid: float) -> None:
    """Released values of every factor tested against the pinned distribution ``dist``."""
    p = {f: gof_pvalue(draws[f][col], truth, dist, grid) for f in FACTORS}
    assert p[1.0] > ALPHA, f"{col}: the noise added does not fit the pinned scale (p = {p[1.0]:.3g})"
    assert p[0.7] < ALPHA, f"{col}: an under-noised (0.7x) release passed (p = {p[0.7]:.3g})"
    assert p[1.3] < ALPHA, f"{col}: an over-noised (1.3x) release passed (p = {p[1.3]:.3g})"


def test_gaussian_c1_count_fits_sigma() -> None:
    """C_u = 1, k = 1, COUNT over 3000 public keys of 2 units each: noise rint(N(0, SIGMA_1^2))."""
    golden, draws = _releases(spread_table(GROUPS, 2, 1), "SELECT k, COUNT(*) AS n FROM t GROUP BY k",
                              c_u=1, eps=1.0, delta=1e-5, seed="gof-gauss-c1")
    assert set(golden["n"]) == {2}
    assert draws[1.0]["n"].size == GROUPS
    _assert_fit(draws, "n", 2.0, stats.norm(scale=SIGMA_1), 1.0)


def test_gaussian_c3_count_and_sum_fit_sigma() -> None:
    """C_u = 3, COUNT + SUM(v in [0, 10]), eps = 0.5, delta = 1e-6: the count gets SIGMA_SQRT6,
    the sum 10 SIGMA_SQRT6, rounded to its grid 10 (a power of ten <= a tenth of the scale)."""
    golden, draws = _releases(
        spread_table(GROUPS, 3, 3, value=10.0), "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY k",
        c_u=3, eps=0.5, delta=1e-6, seed="gof-gauss-c3", bounds=True,
    )
    assert set(golden["n"]) == {3} and set(golden["total"]) == {30.0}  # 30: on the sum's grid 10
    _assert_fit(draws, "n", 3.0, stats.norm(scale=SIGMA_SQRT6), 1.0)
    _assert_fit(draws, "total", 30.0, stats.norm(scale=10 * SIGMA_SQRT6), 10.0)


def test_laplace_c2_count_fits_snapped_lambda() -> None:
    """C_u = 2, COUNT, eps = 1: every value on the grid Lambda = 4 >= lambda, cells distributed as
    Laplace(LAMBDA_C2) integrated over the grid cells."""
    golden, draws = _releases(spread_table(GROUPS, 4, 2), "SELECT k, COUNT(*) AS n FROM t GROUP BY k",
                              c_u=2, eps=1.0, delta=0.0, seed="gof-lap-c2")
    assert set(golden["n"]) == {4}
    assert GRID_C2 >= LAMBDA_C2
    _assert_fit(draws, "n", 4.0, stats.laplace(scale=LAMBDA_C2), GRID_C2)


def test_laplace_c3_count_and_sum_fit_snapped_lambda() -> None:
    golden, draws = _releases(
        spread_table(GROUPS, 3, 3, value=4.0), "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY k",
        c_u=3, eps=1.0, delta=0.0, seed="gof-lap-c3", bounds=True,
    )
    assert set(golden["n"]) == {3} and set(golden["total"]) == {12.0}
    assert GRID_C3_COUNT >= LAMBDA_C3_COUNT and GRID_C3_SUM >= LAMBDA_C3_SUM
    _assert_fit(draws, "n", 3.0, stats.laplace(scale=LAMBDA_C3_COUNT), GRID_C3_COUNT)
    _assert_fit(draws, "total", 12.0, stats.laplace(scale=LAMBDA_C3_SUM), GRID_C3_SUM)


def test_sparse_histogram_count_and_sum_fit_sigma() -> None:
    """Sparse histogram, eps = 1, delta = 1e-6, C_u = 2, tau = 2, COUNT + SUM: sigma = SIGMA_2,
    tau* = 44; 2000 groups of 120 units (9 sigma above tau*: all released, P(miss) < 1e-15 each)."""
    groups = 2000
    table = spread_table(groups, 120, 2, value=2.0)
    golden, draws = _releases(
        table, "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY k",
        c_u=2, eps=1.0, delta=1e-6, seed="gof-sparse-c2", public=False, tau=2, bounds=True,
    )
    assert set(golden["n"]) == {120} and set(golden["total"]) == {240.0}
    assert draws[1.0]["n"].size == groups and 120 - TAU_STAR_S3 > 8 * SIGMA_2
    _assert_fit(draws, "n", 120.0, stats.norm(scale=SIGMA_2), 1.0)
    _assert_fit(draws, "total", 240.0, stats.norm(scale=SUM_SIGMA_S3), 1.0)


@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_gof_rejects_a_wrong_scale_on_synthetic_draws(factor: float) -> None:
    """The test statistic itself: exact draws of the model pass, draws at a wrong scale fail."""
    gen = np.random.default_rng(7)
    ok = 5.0 + np.rint(gen.normal(0.0, SIGMA_1, GROUPS))
    bad = 5.0 + np.rint(gen.normal(0.0, factor * SIGMA_1, GROUPS))
    assert gof_pvalue(ok, 5.0, stats.norm(scale=SIGMA_1), 1.0) > ALPHA
    assert gof_pvalue(bad, 5.0, stats.norm(scale=SIGMA_1), 1.0) < ALPHA
    with pytest.raises(AssertionError, match="off its rounding grid"):
        gof_pvalue(ok + 0.5, 5.0, stats.norm(scale=SIGMA_1), 1.0)
