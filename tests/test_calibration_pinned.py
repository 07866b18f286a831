"""The Gaussian and Laplace calibrations of the basic mechanisms, pinned by numbers written here
and by the noise actually added to a zero-noise truth.

Numbers by hand (never by calling the code under test):

* Gaussian, eps = 1, delta = 1e-5, sensitivity 1: sigma_min = 3.730631634815942 (the inverse
  vector of ``gaussian_mechanism.json``, checked at 50 digits). A COUNT over declared keys with
  C_u = 2 groups per unit and one column has L2 sensitivity sqrt(2), so sigma = 3.730631634815942
  * sqrt(2) = 5.275909854174817.
* Laplace, eps = 1, C_u = 2, one column, Delta = 1: each coordinate gets eps_c = 1/2; the snapping
  exponent is K = 33 (2^-45 (2^34 + 2) <= 1/2000 < 2^-45 (2^35 + 2)), so
  lambda = 1 / (1/2 - 2^-11 - 2^-44) = 2.0019550342133265, the grid Lambda = 4 and B = 2^33 * 4.

The goodness-of-fit tests draw from a seeded source (failure probability <= 1e-6) and each has a
negative control: the same released values must fail against a noise scale 30% too small.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

import dpsql
from dpsql.testing import seeded_noise, use_noise

ALPHA = 1e-6
SIGMA_1 = 3.730631634815942  # tests/vectors/gaussian_mechanism.json, inverse[eps=1, delta=1e-5]
SIGMA = 5.275909854174817  # SIGMA_1 * sqrt(2)
LAMBDA = 2.0019550342133265  # 1 / (1/2 - 2^-11 - 2^-44)
KEYS = 3000


def _table(per_key: int) -> pa.Table:
    """KEYS declared keys, each with ``per_key`` units (unit u in key u // per_key), one row each."""
    n = KEYS * per_key
    return pa.table({"uid": pa.array(np.arange(n), pa.int64()),
                     "k": pa.array([f"k{i // per_key:04d}" for i in range(n)])})


def _release(per_key: int, delta: float, seed: str) -> tuple[dpsql.Release, dpsql.Plan, dpsql.Session]:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, seeded_noise(seed))
    s.register("t", _table(per_key), privacy_unit="uid", max_groups_per_unit=2,
               columns={"k": {"domain": [f"k{i:04d}" for i in range(KEYS)]}})
    sql = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
    plan = s.explain(sql, epsilon=1.0, delta=delta)
    return s.query(sql, epsilon=1.0, delta=delta), plan, s


def _chi2_p(diffs: np.ndarray, pmf: dict[int, float]) -> float:
    """Chi-square p-value of integer ``diffs`` against ``pmf`` (cells with expected count < 5 pooled)."""
    n = diffs.size
    support = sorted(pmf)
    obs, exp_ = [], []
    rest_p = 1.0
    for v in support:
        if pmf[v] * n >= 5:
            obs.append(int(np.sum(diffs == v)))
            exp_.append(pmf[v] * n)
            rest_p -= pmf[v]
    rest_obs = n - sum(obs)
    obs.append(rest_obs)
    exp_.append(max(rest_p, 0.0) * n)
    return float(stats.chisquare(obs, np.asarray(exp_) * n / sum(exp_)).pvalue)


def _rounded_normal_pmf(sigma: float) -> dict[int, float]:
    return {v: float(stats.norm.cdf((v + 0.5) / sigma) - stats.norm.cdf((v - 0.5) / sigma)) for v in range(-60, 61)}


def _snapped_laplace_pmf(lam: float, grid: float) -> dict[int, float]:
    # true count a multiple of the grid: released - true = grid * j with probability
    # F((j + 1/2) grid) - F((j - 1/2) grid), F the Laplace(lam) CDF
    f = stats.laplace(scale=lam).cdf
    return {int(grid * j): float(f((j + 0.5) * grid) - f((j - 0.5) * grid)) for j in range(-15, 16)}


def test_gaussian_sigma_is_pinned_and_recorded() -> None:
    rel, plan, s = _release(2, 1e-5, "pinned-gaussian")
    assert plan.parameters["sigma"] == pytest.approx(SIGMA, rel=1e-9)
    assert plan.parameters["l2_sensitivity"] == pytest.approx(math.sqrt(2), rel=1e-12)
    row = s.history().to_pylist()[-1]
    recorded = json.loads(row["params"])
    assert recorded["sigma"] == pytest.approx(SIGMA, rel=1e-9)
    assert rel.accuracy["n"]["noise_std"] == pytest.approx(SIGMA, rel=1e-9)
    s.close()


def test_gaussian_noise_added_fits_the_pinned_sigma() -> None:
    rel, _plan, s = _release(2, 1e-5, "pinned-gaussian-gof")
    diffs = np.asarray(rel.table.column("n").to_pylist(), dtype=np.int64) - 2  # every key holds 2 units
    assert diffs.size == KEYS
    assert _chi2_p(diffs, _rounded_normal_pmf(SIGMA)) > ALPHA
    # negative control: 30% less noise must be rejected
    assert _chi2_p(diffs, _rounded_normal_pmf(0.7 * SIGMA)) < ALPHA
    s.close()


def test_laplace_scale_is_pinned_and_recorded() -> None:
    rel, plan, s = _release(4, 0.0, "pinned-laplace")
    snap = next(iter(plan.parameters["snapping"].values()))
    assert snap["lambda"] == pytest.approx(LAMBDA, rel=1e-15)
    assert snap["grid"] == 4.0 and snap["bound"] == 2.0**33 * 4
    assert plan.parameters["l1_sensitivity"] == 2.0 and plan.cost == dpsql.Budget(1.0, 0.0)
    recorded = json.loads(s.history().to_pylist()[-1]["params"])
    assert next(iter(recorded["scales"].values())) == pytest.approx(LAMBDA, rel=1e-15)
    s.close()


def test_laplace_noise_added_fits_the_pinned_scale() -> None:
    rel, _plan, s = _release(4, 0.0, "pinned-laplace-gof")
    diffs = np.asarray(rel.table.column("n").to_pylist(), dtype=np.int64) - 4  # 4 units per key: on the grid
    assert diffs.size == KEYS and np.all(diffs % 4 == 0)
    assert _chi2_p(diffs, _snapped_laplace_pmf(LAMBDA, 4.0)) > ALPHA
    assert _chi2_p(diffs, _snapped_laplace_pmf(0.7 * LAMBDA, 4.0)) < ALPHA
    s.close()
