"""COVAR_POP / COVAR_SAMP / CORR / REGR_SLOPE / REGR_INTERCEPT (``dpsql.mechanisms.covariance``): the stated sensitivities hold when one
person is removed, the calibration pinned by hand, the point and interval pinned, the interval's coverage
(with a negative control), zero-noise answers equal to DuckDB's own on the clamped pairs (scalar, public
keys, unknown keys), and the refusals (free, naming the fix)."""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from test_bounding import (
    assert_unbounded_caught,
    assert_within_sensitivity,
    gen_dataset,
    plan_for,
    spec_for,
)
from test_sql_coverage import SNAP, free

import dpsql
from dpsql import errors
from dpsql.mechanisms import covariance
from dpsql.rewrite.bound import Caps, released_columns
from dpsql.testing import seeded_noise, use_noise, zero_noise


@pytest.fixture(autouse=True, scope="module")
def _heap_frozen() -> Any:
    """Each neighbour observation collects earlier garbage before recording warnings; with the heap frozen once here,
    that collection examines only this module's objects (tests/_neighbour.py frozen_heap)."""
    from tests._neighbour import frozen_heap

    with frozen_heap():
        yield


SENS = [
    "SELECT g, COVAR_POP(amount, age), CORR(age * 2 - amount, amount) FROM t GROUP BY g",
    "SELECT COVAR_SAMP(amount, age), CORR(LEAST(GREATEST(amount, 0), 50), age) FROM t",
    "SELECT h, CORR(amount, age), COUNT(*) FROM t GROUP BY h",
    "SELECT g, REGR_SLOPE(amount, age), REGR_INTERCEPT(age, amount * 2) FROM t GROUP BY g",
]


def test_removing_one_user_stays_within_the_stated_sensitivity() -> None:
    assert_within_sensitivity(SENS, 2026_12_05, 30)


def test_sensitivity_check_fails_without_bounding() -> None:
    """Negative control: the same check catches the unbounded queries."""
    assert_unbounded_caught(SENS, 2026_12_05)


def test_released_columns_state_the_sensitivities() -> None:
    data = gen_dataset(np.random.default_rng(1))
    spec = spec_for("t", data, bounds={"amount": (-20.0, 100.0), "age": (0.0, 60.0)})
    plan = plan_for("SELECT COVAR_POP(amount, age), CORR(age, amount) FROM t", spec)
    cols = {c.name: c.sensitivity for c in released_columns(plan, Caps(1, 3))}
    # k = 3; amount: r = (100 - -20) / 2 = 60, age: r = 30; products 60 * 30 = 1800; CORR(age, amount) reads the
    # sums of the same pair, amount's as its second argument's (bound.pair_sources)
    assert cols == {"__users": 1.0,
                    "__a0_cnt": 3.0, "__a0_sum": 180.0, "__a0_sumb": 90.0, "__a0_ab": 5400.0,
                    "__a0_sq": 10800.0, "__a0_sqb": 2700.0}
    plan = plan_for("SELECT CORR(age, amount) FROM t", spec)
    cols = {c.name: c.sensitivity for c in released_columns(plan, Caps(1, 3))}
    assert cols == {"__users": 1.0, "__a0_cnt": 3.0, "__a0_sum": 90.0, "__a0_sumb": 180.0, "__a0_ab": 5400.0,
                    "__a0_sq": 2700.0, "__a0_sqb": 10800.0}


# -- calibration, pinned by hand ---------------------------------------------------------------------------


@pytest.fixture
def lap() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(sess, zero_noise())
    sess.register("t", pa.table({"uid": [1, 2, 3], "x": [1.0, 2.0, 3.0], "y": [0.0, 5.0, 9.0], "s": ["a", "b", "a"]}),
                  privacy_unit="uid", max_rows_per_unit=2, columns={"x": {"bounds": (0, 10)}, "y": {"bounds": (0, 4)}})
    yield sess
    sess.close()


def test_laplace_calibration_of_corr_pinned(lap: Any) -> None:
    p = lap.explain("SELECT CORR(x, y) FROM t", epsilon=6.0).parameters
    # m = 6 columns, C = 1: eps per column 6 / 6 = 1; L = 2 rows, rx = 5, ry = 2:
    # Delta = 2 (count), 10 (sum x), 4 (sum y), 2 * 10 = 20 (sum xy), 50 (sum x^2), 8 (sum y^2)
    assert p["l1_sensitivity"] == 6
    lam = {k: v["lambda"] for k, v in p["snapping"].items()}
    want = {"_cnt": 2.0, "_sum": 10.0, "_sumb": 4.0, "_ab": 20.0, "_sq": 50.0, "_sqb": 8.0}
    assert set(lam) == {"__a0" + c for c in want}
    for c, w in want.items():
        assert lam["__a0" + c] == pytest.approx(w, rel=SNAP), c


def test_laplace_calibration_of_regr_pinned(lap: Any) -> None:
    p = lap.explain("SELECT REGR_SLOPE(x, y) FROM t", epsilon=5.0).parameters
    # m = 5 columns (no sum of the dependent x's squares); eps per column 1; L = 2, rx = 5, ry = 2
    assert p["l1_sensitivity"] == 5
    lam = {k: v["lambda"] for k, v in p["snapping"].items()}
    want = {"_cnt": 2.0, "_sum": 10.0, "_sumb": 4.0, "_ab": 20.0, "_sqb": 8.0}
    assert set(lam) == {"__a0" + c for c in want}
    for c, w in want.items():
        assert lam["__a0" + c] == pytest.approx(w, rel=SNAP), c


def test_gaussian_calibration_of_covariance_pinned(lap: Any) -> None:
    p = lap.explain("SELECT COVAR_POP(x, y) FROM t", epsilon=1.0, delta=1e-6).parameters
    sc = p["scales"]
    assert p["l2_sensitivity"] == pytest.approx(2.0)  # four normalised columns, one group
    assert set(sc) == {"__a0_cnt", "__a0_sum", "__a0_sumb", "__a0_ab"}
    assert sc["__a0_sum"] / sc["__a0_cnt"] == pytest.approx(5.0)
    assert sc["__a0_sumb"] / sc["__a0_cnt"] == pytest.approx(2.0)
    assert sc["__a0_ab"] / sc["__a0_cnt"] == pytest.approx(10.0)


# -- post-processing, pinned ---------------------------------------------------------------------------------


def _a(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float64)


def test_point_pinned() -> None:
    n, sa, sb, sab, qa, qb = _a(100.0), _a(10.0), _a(-20.0), _a(300.0), _a(900.0), _a(1600.0)
    # cov_pop = 300/100 - (0.1)(-0.2) = 3.02; samp * 100/99; var_a = 9 - 0.01, var_b = 16 - 0.04
    assert covariance.point("covar_pop", n, sa, sb, sab, None, None, 5.0, 5.0)[0] == pytest.approx(3.02)
    assert covariance.point("covar_samp", n, sa, sb, sab, None, None, 5.0, 5.0)[0] == pytest.approx(3.02 * 100 / 99)
    assert covariance.point("corr", n, sa, sb, sab, qa, qb, 5.0, 5.0)[0] == pytest.approx(3.02 / math.sqrt(8.99 * 15.96))
    # clipped to the possible range: |cov_pop| <= ra * rb, corr in [-1, 1]
    assert covariance.point("covar_pop", n, sa, sb, _a(1e6), None, None, 2.0, 3.0)[0] == 6.0
    assert covariance.point("covar_samp", n, sa, sb, _a(-1e6), None, None, 2.0, 3.0)[0] == -12.0
    assert covariance.point("corr", n, sa, sb, _a(1e5), qa, qb, 5.0, 5.0)[0] == 1.0
    # NULL: count below 1 (pop), below 2 (samp, corr); a variance that is not positive (corr)
    assert np.isnan(covariance.point("covar_pop", _a(0.4), sa, sb, sab, None, None, 5.0, 5.0)[0])
    assert not np.isnan(covariance.point("covar_pop", _a(1.0), sa, sb, sab, None, None, 5.0, 5.0)[0])
    assert np.isnan(covariance.point("covar_samp", _a(1.0), sa, sb, sab, None, None, 5.0, 5.0)[0])
    assert np.isnan(covariance.point("corr", n, sa, sb, sab, _a(1.0), qb, 5.0, 5.0)[0])  # 0.01 - 0.01 = 0
    assert np.isnan(covariance.point("corr", n, sa, sb, sab, qa, _a(-50.0), 5.0, 5.0)[0])
    assert np.isnan(covariance.point("corr", _a(-3.0), sa, sb, sab, qa, qb, 5.0, 5.0)[0])


def test_regression_point_pinned() -> None:
    n, sy, sx, sxy, qx = _a(100.0), _a(10.0), _a(-20.0), _a(300.0), _a(1600.0)
    slope = 3.02 / (16.0 - 0.04)  # cov_pop / var_pop(x)
    assert covariance.point("regr_slope", n, sy, sx, sxy, None, qx, 50.0, 50.0)[0] == pytest.approx(slope)
    # midpoints 5 (y) and 10 (x): mean y = 5.1, mean x = 9.8
    assert covariance.point("regr_intercept", n, sy, sx, sxy, None, qx, 50.0, 50.0, 5.0, 10.0)[0] == pytest.approx(
        5.1 - slope * 9.8)
    # the means are clipped to the bounds: x in [10 - 5, 10 + 5] = [5, 15], its noisy mean 9.8 stays; y's 5.1 -> [4, 6]
    assert covariance.point("regr_intercept", n, sy, sx, sxy, None, qx, 1.0, 5.0, 5.0, 10.0)[0] == pytest.approx(
        5.1 - slope * 9.8)
    assert covariance.point("regr_intercept", n, _a(500.0), sx, sxy, None, qx, 1.0, 5.0, 5.0, 10.0)[0] == pytest.approx(
        6.0 - (3.0 - 5.0 * -0.2) / 15.96 * 9.8)
    # NULL: var_pop(x) not positive, or fewer than 2 rows
    assert np.isnan(covariance.point("regr_slope", n, sy, sx, sxy, None, _a(4.0), 50.0, 50.0)[0])
    assert np.isnan(covariance.point("regr_intercept", _a(1.0), sy, sx, sxy, None, qx, 50.0, 50.0)[0])


def test_interval_pinned() -> None:
    n, sa, sb, sab = _a(100.0), _a(0.0), _a(0.0), _a(300.0)
    h = {"_cnt": 10.0, "_sum": 10.0, "_sumb": 20.0, "_ab": 30.0}
    # Sab / n in [270 / 110, 330 / 90]; (Sa / n)(Sb / n) in [-(10/90)(20/90), +(10/90)(20/90)]
    p = (10 / 90) * (20 / 90)
    lo, hi = covariance.interval("covar_pop", n, sa, sb, sab, None, None, h, 5.0, 5.0)
    assert (lo[0], hi[0]) == pytest.approx((270 / 110 - p, 330 / 90 + p))
    lo, hi = covariance.interval("covar_samp", n, sa, sb, sab, None, None, h, 5.0, 5.0)
    assert (lo[0], hi[0]) == pytest.approx(((270 / 110 - p) * 110 / 109, (330 / 90 + p) * 90 / 89))
    # corr: var_a in [(900 - 90) / 110 - (10/90)^2, 990 / 90], var_b in [(1600 - 160) / 110 - (20/90)^2, 1760 / 90]
    h.update({"_sq": 90.0, "_sqb": 160.0})
    lo, hi = covariance.interval("corr", n, sa, sb, sab, _a(900.0), _a(1600.0), h, 5.0, 5.0)
    va_lo, va_hi = 810 / 110 - (10 / 90) ** 2, 990 / 90
    vb_lo, vb_hi = 1440 / 110 - (20 / 90) ** 2, 1760 / 90
    assert (lo[0], hi[0]) == pytest.approx(((270 / 110 - p) / math.sqrt(va_hi * vb_hi),
                                            (330 / 90 + p) / math.sqrt(va_lo * vb_lo)))
    # a variance whose box reaches 0: the whole range
    lo, hi = covariance.interval("corr", n, sa, sb, sab, _a(50.0), _a(1600.0), h, 5.0, 5.0)
    assert (lo[0], hi[0]) == (-1.0, 1.0)
    # REGR_SLOPE: the covariance's range over var_pop(x)'s, [(1600 - 160) / 110 - (20/90)^2, 1760 / 90]
    h = {"_cnt": 10.0, "_sum": 10.0, "_sumb": 20.0, "_ab": 30.0, "_sqb": 160.0}
    lo, hi = covariance.interval("regr_slope", n, sa, sb, sab, None, _a(1600.0), h, 5.0, 5.0)
    assert (lo[0], hi[0]) == pytest.approx(((270 / 110 - p) / vb_hi, (330 / 90 + p) / vb_lo))
    # intercept: mean y in [5 - 10/90, 5 + 10/90], mean x in [10 - 20/90, 10 + 20/90] (midpoints 5, 10)
    lo, hi = covariance.interval("regr_intercept", n, sa, sb, sab, None, _a(1600.0), h, 50.0, 50.0, 5.0, 10.0)
    s_lo, s_hi = (270 / 110 - p) / vb_hi, (330 / 90 + p) / vb_lo
    assert (lo[0], hi[0]) == pytest.approx((5 - 10 / 90 - s_hi * (10 + 20 / 90), 5 + 10 / 90 - s_lo * (10 - 20 / 90)))
    # a variance of x whose box reaches 0: no bound
    lo, hi = covariance.interval("regr_slope", n, sa, sb, sab, None, _a(100.0), h, 5.0, 5.0)
    assert (lo[0], hi[0]) == (-math.inf, math.inf)
    assert covariance.z_share(4) == pytest.approx(2.497705, abs=1e-5)  # Phi^-1(1 - 0.05/8)
    assert covariance.laplace_share(6) == pytest.approx(math.log(120.0))


@pytest.mark.parametrize("kind", ["covar_samp", "corr", "regr_slope", "regr_intercept"])
def test_interval_covers_the_truth(kind: str) -> None:
    """Coverage >= 95% by construction (union bound): 20000 draws, failure probability < 1e-9 at a
    threshold of 94%; negative control: eighth-width intervals must fall below it."""
    gen = np.random.default_rng(20261205)
    true = {"_cnt": 40.0, "_sum": 30.0, "_sumb": -25.0, "_ab": 220.0, "_sq": 500.0, "_sqb": 400.0}
    sd = {"_cnt": 2.0, "_sum": 10.0, "_sumb": 10.0, "_ab": 50.0, "_sq": 50.0, "_sqb": 50.0}
    names = list(true) if kind == "corr" else [*list(true)[:4], "_sqb"] if kind.startswith("regr") else list(true)[:4]
    m = len(names)
    t = {c: _a(true[c]) for c in names}
    truth = covariance.point(kind, t["_cnt"], t["_sum"], t["_sumb"], t["_ab"], t.get("_sq"), t.get("_sqb"), 5.0, 5.0,
                             1.0, 2.0)[0]
    assert not np.isnan(truth)
    draws = 20000
    noisy = {c: true[c] + gen.normal(0, sd[c], draws) for c in names}
    rates = []
    for f in (1.0, 0.125):
        h = {c: f * covariance.z_share(m) * sd[c] for c in names}
        lo, hi = covariance.interval(kind, noisy["_cnt"], noisy["_sum"], noisy["_sumb"], noisy["_ab"],
                                     noisy.get("_sq"), noisy.get("_sqb"), h, 5.0, 5.0, 1.0, 2.0)
        rates.append(float(np.mean((lo <= truth) & (truth <= hi))))
    assert rates[0] >= 0.94, rates
    assert rates[1] < 0.94, rates  # negative control


# -- end to end ---------------------------------------------------------------------------------------------


def _pairs() -> pa.Table:
    gen = np.random.default_rng(77)
    n = 400
    x = gen.uniform(-10, 110, n)
    y = 0.5 * x + gen.normal(0, 15, n)
    xm, ym = gen.random(n) < 0.05, gen.random(n) < 0.05  # NULLs: a pair with one is skipped
    return pa.table({"uid": np.arange(n) // 2, "g": pa.array(gen.choice(["a", "b", "c"], n).tolist()),
                     "h": gen.integers(0, 4, n), "x": pa.array(x, mask=xm), "y": pa.array(y, mask=ym)})


@pytest.fixture
def pairs() -> Any:
    data = _pairs()
    sess = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("p", data, privacy_unit="uid", max_rows_per_unit=2, max_rows_per_group=2, max_groups_per_unit=2,
                  columns={"x": {"bounds": (0, 100)}, "y": {"bounds": (-20, 60)}, "g": {"domain": ["a", "b", "c"]}})
    con = duckdb.connect()
    con.register("d", data)
    yield sess, con
    sess.close()
    con.close()


#: the clamped pairs as the declared bounds read them (NULL stays NULL: DuckDB's GREATEST skips a NULL)
_X = "CASE WHEN x IS NOT NULL THEN least(greatest(x, 0), 100) END"
_Y = "CASE WHEN y IS NOT NULL THEN least(greatest(y, -20), 60) END"
CLAMPED = f"covar_pop({_X}, {_Y}), covar_samp({_X}, {_Y}), corr({_X}, {_Y})"
REGR = f"regr_slope({_Y}, {_X}), regr_intercept({_Y}, {_X})"


def test_scalar_zero_noise_is_duckdbs_own_on_the_clamped_pairs(pairs: Any) -> None:
    sess, con = pairs
    want = con.execute(f"SELECT {CLAMPED} FROM d").fetchone()
    r = sess.query("SELECT COVAR_POP(x, y) AS cp, COVAR_SAMP(x, y) AS cs, CORR(x, y) AS r FROM p",
                   epsilon=10.0, delta=1e-6)
    row = r.table.to_pylist()[0]
    for name, w in zip(("cp", "cs", "r"), want):
        assert abs(row[name] - w) <= r.accuracy[name]["ci95_half_width"], (name, row[name], w)
        assert abs(row[name] - w) <= 1e-3 * abs(w), (name, row[name], w)  # zero noise: only the rounding grids
    assert "centred sums" in r.accuracy["r"]["note"]
    want = con.execute(f"SELECT {REGR} FROM d").fetchone()
    r = sess.query("SELECT REGR_SLOPE(y, x) AS s, REGR_INTERCEPT(y, x) AS i FROM p", epsilon=10.0, delta=1e-6)
    row = r.table.to_pylist()[0]
    for name, w in zip(("s", "i"), want):
        assert abs(row[name] - w) <= r.accuracy[name]["ci95_half_width"], (name, row[name], w)
        assert abs(row[name] - w) <= 1e-2 * abs(w), (name, row[name], w)


def test_public_keys_zero_noise_is_duckdbs_own(pairs: Any) -> None:
    sess, con = pairs
    want = {row[0]: row[1:] for row in con.execute(f"SELECT g, {CLAMPED} FROM d GROUP BY g").fetchall()}
    r = sess.query("SELECT g, COVAR_POP(x, y) AS cp, COVAR_SAMP(x, y) AS cs, CORR(x, y) AS r FROM p GROUP BY g",
                   epsilon=10.0, delta=1e-6)
    assert r.mechanism == "gaussian"
    got = {row["g"]: (row["cp"], row["cs"], row["r"]) for row in r.table.to_pylist()}
    assert set(got) == set(want)
    for g, vals in got.items():
        for v, w in zip(vals, want[g]):
            assert abs(v - w) <= 1e-2 * abs(w), (g, v, w)  # zero noise: the rounding grids of the released sums
    want = {row[0]: row[1:] for row in con.execute(f"SELECT g, {REGR} FROM d GROUP BY g").fetchall()}
    r = sess.query("SELECT g, REGR_SLOPE(y, x) AS s, REGR_INTERCEPT(y, x) AS i FROM p GROUP BY g", epsilon=10.0,
                   delta=1e-6)
    for row in r.table.to_pylist():
        assert abs(row["s"] - want[row["g"]][0]) <= 1e-2 * abs(want[row["g"]][0])
        # the intercept, mean(y) - slope * mean(x) (about 25 - 0.5 * 50): the grids of the sums move it by about 0.1
        assert abs(row["i"] - want[row["g"]][1]) <= 0.2


def test_unknown_keys_through_the_sparse_histogram(pairs: Any) -> None:
    sess, con = pairs
    want = {row[0]: row[1:] for row in con.execute(f"SELECT h, {CLAMPED} FROM d GROUP BY h").fetchall()}
    r = sess.query("SELECT h, COVAR_POP(x, y) AS cp, CORR(x, y) AS r FROM p GROUP BY h", epsilon=10.0, delta=1e-6)
    assert r.mechanism == "sparse_histogram" and r.table.num_rows >= 1
    for row in r.table.to_pylist():
        cp, _, corr = want[row["h"]]
        assert abs(row["cp"] - cp) <= 1e-2 * abs(cp) and abs(row["r"] - corr) <= 1e-2 * abs(corr)
    assert "per_row_ci95_half_width" in r.accuracy["r"]


def test_noisy_corr_is_a_correlation_or_null(pairs: Any) -> None:
    """Real noise at a small epsilon: CORR in [-1, 1] or NULL, never an error after the charge."""
    sess, con = pairs
    use_noise(sess, seeded_noise(5))
    r = sess.query("SELECT g, CORR(x, y) AS r FROM p GROUP BY g", epsilon=0.05, delta=1e-6)
    for v in r.table.column("r").to_pylist():
        assert v is None or -1.0 <= v <= 1.0


# -- refusals -----------------------------------------------------------------------------------------------


def test_refusals_are_free_and_name_the_fix(pairs: Any) -> None:
    sess, _ = pairs
    sess.register("q", _pairs(), privacy_unit="uid", columns={"x": {"bounds": (0, 100)}})
    msg = free(sess, "SELECT CORR(x, y) FROM q", errors.PolicyError)
    assert "needs value bounds" in msg and "'bounds'" in msg and "'y'" in msg
    assert "CORR(x, LEAST(GREATEST(y, lo), hi))" in msg  # the clamp, written in the argument that needs it
    msg = free(sess, "SELECT COVAR_POP(y, x) FROM q", errors.PolicyError)
    assert "'bounds'" in msg and "'y'" in msg
    assert "single point" in free(sess, "SELECT CORR(x, LEAST(GREATEST(y, 3), 3)) FROM p")
    assert "numeric" in free(sess, "SELECT CORR(x, g) FROM p")
    assert "FILTER" in free(sess, "SELECT CORR(x, y) FILTER (WHERE x > 3) FROM p")
    assert "CORR takes two arguments" in free(sess, "SELECT CORR(x, y, x) FROM p")  # never answered as CORR(x, y)
    assert "REGR_SLOPE takes two arguments, REGR_SLOPE(y, x)" in free(sess, "SELECT REGR_SLOPE(y) FROM p")
    assert "not supported over joins" in free(sess, "SELECT CORR(a.x, b.y) FROM p a JOIN p b ON a.uid = b.uid")
    # named as written (it was sqlglot's class name, REGRSLOPE)
    assert "aggregate REGR_SLOPE is not supported over joins" in free(
        sess, "SELECT REGR_SLOPE(a.x, b.y) FROM p a JOIN p b ON a.uid = b.uid")
    assert "aggregate VAR_POP is not supported over joins" in free(sess, "SELECT VAR_POP(a.x) FROM p a JOIN p b ON a.uid = b.uid")


# -- one hostile person: everything the analyst sees (tests/_neighbour.py) ------------------------------------

PAIR_QUERIES = [
    "SELECT COVAR_POP(x, y) AS c, CORR(n, x) AS r FROM t",
    "SELECT g, COVAR_SAMP(y, n * 2) AS c, REGR_SLOPE(x, y) AS s FROM t GROUP BY g",
    "SELECT h, CORR(x, amt) AS r, COUNT(DISTINCT lower(h) || g) AS n FROM t GROUP BY h",
    "SELECT COUNT(DISTINCT floor(y / 10)) AS n, REGR_INTERCEPT(amt, x) AS i FROM t WHERE x > 0",
    "SELECT b, CORR(n, amt) AS r, COUNT(DISTINCT date_trunc('month', ts)) AS m FROM t GROUP BY b",
]


@pytest.mark.parametrize("seed", [20261254, 20261218, 20261205, 20261267, 20261221, 7002, 7018])  # every query
def test_one_hostile_person_changes_nothing_but_the_noisy_values(seed: int) -> None:
    """The neighbour fuzzer's random data and registrations (a person with NaN, +-inf, +-1e308, integer extremes,
    long text, many rows), these queries: outcome, messages, warnings, charge, key set and the bounded columns
    (within their sensitivity) the same on D and D minus that person."""
    import dataclasses

    from _neighbour import check_pair, run_one
    from _neighbour_gen import random_case

    case = random_case(seed, production=seed < 10000)
    case = dataclasses.replace(case, sql=PAIR_QUERIES[seed % len(PAIR_QUERIES)], options=None,
                               delta=case.delta or 1e-6)
    a = run_one(case.table, case.reg, case.sql, case.eps, case.delta, case.options, case.production)
    b = run_one(case.without_target(), case.reg, case.sql, case.eps, case.delta, case.options, case.production)
    problems = check_pair(a, b, what=case.describe())
    assert not problems, case.describe() + "\n" + "\n".join(problems)
    assert "release" in a, a.get("error")  # answered, not refused on both sides
