"""REGR_COUNT, REGR_AVGX, REGR_AVGY, REGR_SXX, REGR_SYY, REGR_SXY and REGR_R2 (``dpsql.mechanisms.covariance``):
each charged for exactly the sums it reads (the aggregates of one (y, x) pair share them), the calibration
pinned by hand, the point, NULL rules and interval pinned, the interval's coverage (with a negative control),
zero-noise answers equal to DuckDB's own on the clamped pairs (scalar, public keys, unknown keys), the sensitivity
of one person, and the refusals (free, naming the fix)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import test_covariance
from test_bounding import assert_unbounded_caught, assert_within_sensitivity, gen_dataset, plan_for, spec_for
from test_sql_coverage import SNAP, free

import dpsql
from dpsql import errors
from dpsql.mechanisms import covariance
from dpsql.mechanisms.common import columns_words
from dpsql.rewrite.bound import Caps, released_columns
from dpsql.testing import seeded_noise, use_noise, zero_noise


@pytest.fixture(autouse=True, scope="module")
def _heap_frozen() -> Any:
    """Each neighbour observation collects earlier garbage before recording warnings; with the heap frozen once here,
    that collection examines only this module's objects (tests/_neighbour.py frozen_heap)."""
    from tests._neighbour import frozen_heap

    with frozen_heap():
        yield


FAMILY = ("regr_count", "regr_avgx", "regr_avgy", "regr_sxx", "regr_syy", "regr_sxy", "regr_r2")

#: the released columns each one reads: count, sums of y and x, of y * x, of y^2 and x^2 (y the first argument)
READS = {"regr_count": ("_cnt",), "regr_avgx": ("_cnt", "_sumb"), "regr_avgy": ("_cnt", "_sum"),
         "regr_sxx": ("_cnt", "_sumb", "_sqb"), "regr_syy": ("_cnt", "_sum", "_sq"),
         "regr_sxy": ("_cnt", "_sum", "_sumb", "_ab"), "regr_r2": ("_cnt", "_sum", "_sumb", "_ab", "_sq", "_sqb")}

SENS = [
    "SELECT g, REGR_COUNT(amount, age), REGR_SXY(amount, age), REGR_R2(amount, age) FROM t GROUP BY g",
    "SELECT REGR_AVGX(age * 2 - amount, amount), REGR_SYY(LEAST(GREATEST(amount, 0), 50), age) FROM t",
    "SELECT h, REGR_SXX(amount, age), REGR_AVGY(amount, age), COUNT(*) FROM t GROUP BY h",
]


def test_removing_one_user_stays_within_the_stated_sensitivity() -> None:
    assert_within_sensitivity(SENS, 2026_12_05, 30)


def test_sensitivity_check_fails_without_bounding() -> None:
    """Negative control: the same check catches the unbounded queries."""
    assert_unbounded_caught(SENS, 2026_12_05)


def _spec() -> Any:
    data = gen_dataset(np.random.default_rng(1))
    return spec_for("t", data, bounds={"amount": (-20.0, 100.0), "age": (0.0, 60.0)})


@pytest.mark.parametrize("kind", FAMILY)
def test_each_reads_exactly_its_sums(kind: str) -> None:
    plan = plan_for(f"SELECT {kind.upper()}(amount, age) FROM t", _spec())
    cols = {c.name: c.sensitivity for c in released_columns(plan, Caps(1, 3))}
    # k = 3; amount (y): r = 60, age (x): r = 30
    every = {"_cnt": 3.0, "_sum": 180.0, "_sumb": 90.0, "_ab": 5400.0, "_sq": 10800.0, "_sqb": 2700.0}
    assert cols == {"__users": 1.0, **{"__a0" + c: every[c] for c in READS[kind]}}


def test_one_pair_shares_its_sums() -> None:
    """Every aggregate of the same (y, x) pair reads one set of released sums, the union of what they need, the
    pair written (x, y) too (its sums of x are the pair's second ones); another pair has its own."""
    plan = plan_for("SELECT REGR_COUNT(amount, age), REGR_AVGX(amount, age), REGR_SLOPE(amount, age), "
                    "REGR_SXX(amount, age), REGR_AVGY(age, amount) FROM t", _spec())
    cols = {c.name: c.sensitivity for c in released_columns(plan, Caps(1, 3))}
    assert cols == {"__users": 1.0, "__a0_cnt": 3.0, "__a0_sum": 180.0, "__a0_sumb": 90.0, "__a0_ab": 5400.0,
                    "__a0_sqb": 2700.0}
    plan = plan_for("SELECT REGR_AVGX(amount, age), REGR_AVGY(age, amount + 0) FROM t", _spec())
    assert {c.name for c in released_columns(plan, Caps(1, 3))} == {"__users", "__a0_cnt", "__a0_sumb", "__a1_cnt",
                                                                    "__a1_sum"}
    plan = plan_for("SELECT REGR_AVGX(amount, age), REGR_AVGY(amount, age) FROM t", _spec())
    assert {c.name for c in released_columns(plan, Caps(1, 3))} == {"__users", "__a0_cnt", "__a0_sum", "__a0_sumb"}
    # a message about a shared column names every aggregate that reads it
    words = columns_words(plan, ["__a0_sum"])["__a0_sum"]
    assert "REGR_AVGX" in words.upper() and "REGR_AVGY" in words.upper()


# -- calibration, pinned by hand ---------------------------------------------------------------------------


@pytest.fixture
def lap() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(sess, zero_noise())
    sess.register("t", pa.table({"uid": [1, 2, 3], "x": [1.0, 2.0, 3.0], "y": [0.0, 5.0, 9.0]}),
                  privacy_unit="uid", max_rows_per_unit=2, columns={"x": {"bounds": (0, 10)}, "y": {"bounds": (0, 4)}})
    yield sess
    sess.close()


def test_laplace_calibration_of_sxx_pinned(lap: Any) -> None:
    p = lap.explain("SELECT REGR_SXX(x, y) FROM t", epsilon=3.0).parameters
    # m = 3 columns (count, sum and sum of squares of the second argument y); eps per column 1; L = 2, ry = 2
    assert p["l1_sensitivity"] == 3
    lam = {k: v["lambda"] for k, v in p["snapping"].items()}
    want = {"_cnt": 2.0, "_sumb": 4.0, "_sqb": 8.0}
    assert set(lam) == {"__a0" + c for c in want}
    for c, w in want.items():
        assert lam["__a0" + c] == pytest.approx(w, rel=SNAP), c


def test_laplace_calibration_of_a_shared_pair_pinned(lap: Any) -> None:
    """R2, AVGY, AVGX and COUNT of one pair: CORR's six columns, charged once (eps per column 6 / 6 = 1)."""
    p = lap.explain("SELECT REGR_R2(x, y), REGR_AVGY(x, y), REGR_AVGX(x, y), REGR_COUNT(x, y) FROM t",
                    epsilon=6.0).parameters
    assert p["l1_sensitivity"] == 6
    lam = {k: v["lambda"] for k, v in p["snapping"].items()}
    # L = 2 rows, rx = 5, ry = 2: count 2, sums 10 and 4, product 20, squares 50 and 8
    want = {"_cnt": 2.0, "_sum": 10.0, "_sumb": 4.0, "_ab": 20.0, "_sq": 50.0, "_sqb": 8.0}
    assert set(lam) == {"__a0" + c for c in want}
    for c, w in want.items():
        assert lam["__a0" + c] == pytest.approx(w, rel=SNAP), c


def test_gaussian_calibration_of_regr_count_is_a_counts(lap: Any) -> None:
    p = lap.explain("SELECT REGR_COUNT(x, y) FROM t", epsilon=1.0, delta=1e-6).parameters
    q = lap.explain("SELECT COUNT(x) FROM t", epsilon=1.0, delta=1e-6).parameters
    assert set(p["scales"]) == {"__a0_cnt"}
    assert p["l2_sensitivity"] == pytest.approx(1.0)  # one normalised column
    assert p["scales"]["__a0_cnt"] == pytest.approx(q["scales"]["__a0"])


# -- post-processing, pinned ---------------------------------------------------------------------------------


def _a(v: float) -> np.ndarray:
    return np.array([v], dtype=np.float64)


#: n = 100 pairs; centred sums of y: 10, of x: -20, of y * x: 300, of y^2: 900, of x^2: 1600; centres 5 (y), 10 (x)
N, SY, SX, SXY, QY, QX = _a(100.0), _a(10.0), _a(-20.0), _a(300.0), _a(900.0), _a(1600.0)


def _point(kind: str, n: np.ndarray = N, sy: np.ndarray = SY, sx: np.ndarray = SX, sxy: np.ndarray = SXY,
           qy: np.ndarray = QY, qx: np.ndarray = QX, ry: float = 50.0, rx: float = 50.0) -> float:
    return float(covariance.point(kind, n, sy, sx, sxy, qy, qx, ry, rx, 5.0, 10.0)[0])


def test_point_pinned() -> None:
    assert _point("regr_count") == 100.0
    assert _point("regr_avgx") == pytest.approx(9.8)  # 10 + -20 / 100
    assert _point("regr_avgy") == pytest.approx(5.1)
    assert _point("regr_sxx") == pytest.approx(1596.0)  # 1600 - 20^2 / 100: n * var_pop(x)
    assert _point("regr_syy") == pytest.approx(899.0)
    assert _point("regr_sxy") == pytest.approx(302.0)  # 300 - 10 * -20 / 100: n * covar_pop
    assert _point("regr_r2") == pytest.approx(302.0 ** 2 / (1596.0 * 899.0))
    # the means are clipped to the bounds (y in [5 - 1, 5 + 1])
    assert _point("regr_avgy", sy=_a(500.0), ry=1.0) == 6.0
    # sums of squares are never negative
    assert _point("regr_sxx", qx=_a(1.0)) == 0.0 and _point("regr_syy", qy=_a(-50.0)) == 0.0


def test_null_rules_pinned() -> None:
    """Rules on released values only: the noisy analogues of SQL's."""
    nan = math.isnan
    # a noisy count below 1: no mean, no sum of squares or products (SQL: NULL over no pairs)
    for kind in ("regr_avgx", "regr_avgy", "regr_sxx", "regr_syy", "regr_sxy"):
        assert nan(_point(kind, n=_a(0.5))), kind
        assert not nan(_point(kind, n=_a(1.0))), kind
    # the count itself is released as it is, even below 1 (a count's noise)
    assert _point("regr_count", n=_a(-3.0)) == -3.0
    # R2: NULL below 2 pairs and where var_pop(x) is not positive; 1 where var_pop(y) is not positive
    assert nan(_point("regr_r2", n=_a(1.5)))
    assert nan(_point("regr_r2", qx=_a(4.0)))  # 4 / 100 - (20 / 100)^2 = 0
    assert nan(_point("regr_r2", qx=_a(4.0), qy=_a(1.0)))  # x's rule first, as in SQL
    assert _point("regr_r2", qy=_a(1.0)) == 1.0  # 1 / 100 - (10 / 100)^2 = 0
    assert _point("regr_r2", qy=_a(0.5)) == 1.0
    # and is a square of a correlation: in [0, 1]
    assert _point("regr_r2", sxy=_a(1e6)) == 1.0


def _h(**kw: float) -> dict[str, float]:
    return {"_cnt": 10.0, "_sum": 10.0, "_sumb": 20.0, "_ab": 30.0, "_sq": 90.0, "_sqb": 160.0, **kw}


def _interval(kind: str, h: dict[str, float], ry: float = 50.0, rx: float = 50.0) -> tuple[float, float]:
    lo, hi = covariance.interval(kind, N, SY, SX, SXY, QY, QX, h, ry, rx, 5.0, 10.0)
    return float(lo[0]), float(hi[0])


def test_interval_pinned() -> None:
    h = _h()
    assert _interval("regr_count", h) == (90.0, 110.0)
    assert _interval("regr_avgx", h) == pytest.approx((10 - 40 / 90, 10 - 0 / 110))  # x's sum in [-40, 0]
    assert _interval("regr_avgy", h) == pytest.approx((5 + 0 / 110, 5 + 20 / 90))  # y's sum in [0, 20]
    assert _interval("regr_avgy", h, ry=0.1) == pytest.approx((5.0, 5.1))  # within y's bounds
    # SXX = Qx - Sx^2 / n: Qx in [1440, 1760], Sx^2 in [0, 1600], n in [90, 110]
    assert _interval("regr_sxx", h) == pytest.approx((1440 - 1600 / 90, 1760 - 0.0))
    assert _interval("regr_syy", _h(_sq=1000.0)) == (0.0, pytest.approx(1900.0))  # never below 0
    # SXY = Sxy - Sy Sx / n: Sxy in [270, 330], Sy Sx in [-800, 0]
    assert _interval("regr_sxy", h) == pytest.approx((270.0, 330 + 800 / 90))
    # R2: CORR's interval, squared
    r_lo, r_hi = covariance.interval("corr", N, SY, SX, SXY, QY, QX, h, 50.0, 50.0)
    assert 0 < r_lo[0] < r_hi[0] < 1
    assert _interval("regr_r2", h) == pytest.approx((r_lo[0] ** 2, r_hi[0] ** 2))
    # a correlation interval across 0: its square from 0; one with a variance's box at 0: all of [0, 1]
    lo, hi = covariance.interval("regr_r2", N, SY, SX, _a(0.0), QY, QX, h, 50.0, 50.0, 5.0, 10.0)
    r_lo, r_hi = covariance.interval("corr", N, SY, SX, _a(0.0), QY, QX, h, 50.0, 50.0)
    assert r_lo[0] < 0 < r_hi[0]
    assert (lo[0], hi[0]) == (0.0, pytest.approx(max(r_lo[0] ** 2, r_hi[0] ** 2)))
    assert _interval("regr_r2", _h(_sqb=1600.0)) == (0.0, 1.0)


@pytest.mark.parametrize("kind", FAMILY)
def test_interval_covers_the_truth(kind: str) -> None:
    """Coverage >= 95% by construction (union bound over the columns each one reads): 20000 draws, failure
    probability < 1e-9 at a threshold of 94%; negative control: eighth-width intervals must fall below it."""
    gen = np.random.default_rng(20261205)
    true = {"_cnt": 40.0, "_sum": 30.0, "_sumb": -25.0, "_ab": 220.0, "_sq": 500.0, "_sqb": 400.0}
    sd = {"_cnt": 2.0, "_sum": 10.0, "_sumb": 10.0, "_ab": 50.0, "_sq": 50.0, "_sqb": 50.0}
    names = READS[kind]
    m = len(names)

    def args(v: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(v.get(c, np.zeros_like(v["_cnt"])) for c in ("_cnt", "_sum", "_sumb", "_ab", "_sq", "_sqb"))

    truth = covariance.point(kind, *args({c: _a(true[c]) for c in true}), 5.0, 5.0, 1.0, 2.0)[0]
    assert not np.isnan(truth)
    draws = 20000
    noisy = {c: true[c] + gen.normal(0, sd[c], draws) for c in names}
    rates = []
    for f in (1.0, 0.125):
        h = {c: f * covariance.z_share(m) * sd[c] for c in names}
        lo, hi = covariance.interval(kind, *args(noisy), h, 5.0, 5.0, 1.0, 2.0)
        rates.append(float(np.mean((lo <= truth) & (truth <= hi))))
    assert rates[0] >= 0.94, rates
    assert rates[1] < 0.94, rates  # negative control


# -- end to end: zero noise is DuckDB's own answer on the clamped pairs ---------------------------------------


# the pairs, their zero-noise session and the clamped columns are the covariance tests' own
_pairs, pairs, _X, _Y = test_covariance._pairs, test_covariance.pairs, test_covariance._X, test_covariance._Y
ALL = ", ".join(f"{k}(y, x) AS {k[5:]}" for k in FAMILY)
CLAMPED = ", ".join(f"{k}({_Y}, {_X})" for k in FAMILY)


def _close(got: dict[str, Any], want: tuple[Any, ...], where: Any) -> None:
    for k, w in zip(FAMILY, want, strict=True):
        v = got[k[5:]]
        # zero noise: only the released sums' rounding grids (about 1e-3 of a sum), which the ratios amplify
        assert abs(v - w) <= 1e-2 * abs(w) + 1e-3, (where, k, v, w)


def test_scalar_zero_noise_is_duckdbs_own(pairs: Any) -> None:
    sess, con = pairs
    want = con.execute(f"SELECT {CLAMPED} FROM d").fetchone()
    r = sess.query(f"SELECT {ALL} FROM p", epsilon=10.0, delta=1e-6)
    row = r.table.to_pylist()[0]
    _close(row, want, "scalar")
    assert isinstance(row["count"], int) and r.table.schema.field("count").type == pa.int64()
    assert row["count"] == want[0]
    # REGR_COUNT's interval is the count's own, as COUNT(x)'s would be at this calibration
    acc = r.accuracy["count"]
    assert acc["ci95_half_width"] == pytest.approx(1.959964 * acc["noise_std"] + 0.5, rel=1e-6)
    assert "never" not in acc["note"] and "NULL where" not in acc["note"]
    plan = sess.explain(f"SELECT {ALL} FROM p", epsilon=10.0, delta=1e-6)
    assert plan.expected_accuracy["count"]["ci95_half_width"] == pytest.approx(acc["ci95_half_width"])
    for k in FAMILY:
        assert abs(row[k[5:]] - want[FAMILY.index(k)]) <= r.accuracy[k[5:]]["ci95_half_width"], k
    # the seven share one pair's six sums: charged as CORR alone is
    corr = sess.explain("SELECT CORR(y, x) FROM p", epsilon=10.0, delta=1e-6).parameters["scales"]
    mine = sess.explain(f"SELECT {ALL} FROM p", epsilon=10.0, delta=1e-6).parameters["scales"]
    assert sorted(mine.values()) == pytest.approx(sorted(corr.values()))


def test_public_keys_zero_noise_is_duckdbs_own(pairs: Any) -> None:
    sess, con = pairs
    want = {row[0]: row[1:] for row in con.execute(f"SELECT g, {CLAMPED} FROM d GROUP BY g").fetchall()}
    r = sess.query(f"SELECT g, {ALL} FROM p GROUP BY g", epsilon=10.0, delta=1e-6)
    assert r.mechanism == "gaussian" and r.table.num_rows == 3
    for row in r.table.to_pylist():
        _close(row, want[row["g"]], row["g"])


def test_unknown_keys_through_the_sparse_histogram(pairs: Any) -> None:
    sess, con = pairs
    want = {row[0]: row[1:] for row in con.execute(f"SELECT h, {CLAMPED} FROM d GROUP BY h").fetchall()}
    r = sess.query(f"SELECT h, {ALL} FROM p GROUP BY h", epsilon=10.0, delta=1e-6)
    assert r.mechanism == "sparse_histogram" and r.table.num_rows >= 1
    for row in r.table.to_pylist():
        _close(row, want[row["h"]], row["h"])
    assert "per_row_ci95_half_width" in r.accuracy["r2"]


def test_post_processing_of_released_values(pairs: Any) -> None:
    """REGR_SXX / REGR_COUNT is VAR_POP-like, computed from released values (no further charge)."""
    sess, con = pairs
    want = con.execute(f"SELECT regr_sxx({_Y}, {_X}) / regr_count({_Y}, {_X}) FROM d").fetchone()[0]
    r = sess.query("SELECT REGR_SXX(y, x) / REGR_COUNT(y, x) AS v FROM p", epsilon=10.0, delta=1e-6)
    assert r.table.column("v")[0].as_py() == pytest.approx(want, rel=1e-2)


def test_noisy_values_keep_their_ranges(pairs: Any) -> None:
    """Real noise at a small epsilon: never an error after the charge; R2 in [0, 1], SXX and SYY at least 0, the
    means within the bounds, the count an integer (or NULL where the rules say so)."""
    sess, _ = pairs
    use_noise(sess, seeded_noise(5))
    seen = 0
    for sql in (f"SELECT g, {ALL} FROM p GROUP BY g", f"SELECT {ALL} FROM p WHERE x > 1000",
                f"SELECT h, {ALL} FROM p GROUP BY h"):
        r = sess.query(sql, epsilon=0.05, delta=1e-6)
        for row in r.table.to_pylist():
            seen += 1
            assert isinstance(row["count"], int)
            assert row["r2"] is None or 0.0 <= row["r2"] <= 1.0
            assert all(row[k] is None or row[k] >= 0.0 for k in ("sxx", "syy"))
            assert row["avgx"] is None or 0.0 <= row["avgx"] <= 100.0
            assert row["avgy"] is None or -20.0 <= row["avgy"] <= 60.0
    assert seen >= 4


def test_in_having_and_order_by(pairs: Any) -> None:
    """A REGR aggregate in HAVING / ORDER BY only shares the select list's release of its pair."""
    sess, con = pairs
    sql = "SELECT g, REGR_SLOPE(y, x) AS s FROM p GROUP BY g HAVING REGR_COUNT(y, x) > 10 ORDER BY REGR_AVGX(y, x)"
    r = sess.query(sql, epsilon=10.0, delta=1e-6)
    assert r.table.num_rows == 3
    assert set(sess.explain(sql, epsilon=10.0, delta=1e-6).parameters["scales"]) == {
        f"__a0{c}" for c in ("_cnt", "_sum", "_sumb", "_ab", "_sqb")}


def test_regr_count_of_unbounded_columns_counts_the_pairs(pairs: Any) -> None:
    """Counting needs no bounds: REGR_COUNT over unbounded numeric arguments is the count of the rows where both
    are not NULL (one count column, sensitivity k, as COUNT's); a non-numeric argument is still refused."""
    sess, con = pairs
    sess.register("q", _pairs(), privacy_unit="uid", max_rows_per_unit=2)  # no bounds at all
    want = con.execute("SELECT regr_count(y, x), regr_count(y * 2, x) FROM d").fetchone()
    r = sess.query("SELECT REGR_COUNT(y, x) AS n, REGR_COUNT(y * 2, x) AS m FROM q", epsilon=10.0, delta=1e-6)
    assert (r.table.column("n")[0].as_py(), r.table.column("m")[0].as_py()) == want
    assert r.table.schema.field("n").type == pa.int64()
    cnt = sess.explain("SELECT COUNT(x) FROM q", epsilon=1.0, delta=1e-6).parameters["scales"]
    mine = sess.explain("SELECT REGR_COUNT(y, x) FROM q", epsilon=1.0, delta=1e-6).parameters["scales"]
    assert list(mine.values()) == pytest.approx(list(cnt.values()))
    assert "numeric" in free(sess, "SELECT REGR_COUNT(g, x) FROM q")
    assert "numeric" in free(sess, "SELECT REGR_COUNT(lower(g), x) FROM q")
    assert free(sess, "SELECT REGR_COUNT(y, zz) FROM q").count("zz") == 2  # one problem: 'zz' and its fragment
    # the rest of the family still needs the bounds
    assert "needs value bounds" in free(sess, "SELECT REGR_COUNT(y, x), REGR_SXX(y, x) FROM q", errors.PolicyError)


# -- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FAMILY)
def test_wrong_arity_is_refused_for_free(pairs: Any, kind: str) -> None:
    """Never answered for the two arguments sqlglot keeps."""
    sess, _ = pairs
    fn = kind.upper()
    msg = free(sess, f"SELECT {fn}(y) FROM p", errors.DPSQLError)  # by the analysis, or already by the parser
    assert f"{fn} takes two arguments, {fn}(y, x)" in msg or f"{fn} is missing an argument" in msg
    assert "arguments (3)" in free(sess, f"SELECT {fn}(y, x, x) FROM p", errors.DPSQLError)
    msg = free(sess, f"SELECT {fn}() FROM p", errors.SQLSyntaxError)
    assert f"{fn} is missing an argument" in msg and "sqlglot" not in msg  # never the parser's class name


def test_refusals_are_free_and_name_the_fix(pairs: Any) -> None:
    sess, _ = pairs
    sess.register("q", _pairs(), privacy_unit="uid", columns={"x": {"bounds": (0, 100)}})
    msg = free(sess, "SELECT REGR_R2(y, x) FROM q", errors.PolicyError)
    assert "needs value bounds" in msg and "'bounds'" in msg and "'y'" in msg
    assert "single point" in free(sess, "SELECT REGR_SXX(x, LEAST(GREATEST(y, 3), 3)) FROM p")
    assert "numeric" in free(sess, "SELECT REGR_AVGX(x, g) FROM p")
    assert "FILTER" in free(sess, "SELECT REGR_COUNT(x, y) FILTER (WHERE x > 3) FROM p")
    assert "aggregate REGR_SXY is not supported over joins" in free(
        sess, "SELECT REGR_SXY(a.x, b.y) FROM p a JOIN p b ON a.uid = b.uid")
    assert "REGR_R2" in free(sess, "SELECT MODE(x) FROM p")  # the list of answered aggregates names them


# -- one hostile person: everything the analyst sees (tests/_neighbour.py) ------------------------------------

REGR_QUERIES = [
    "SELECT REGR_COUNT(x, y) AS c, REGR_R2(x, y) AS r2, REGR_SLOPE(x, y) AS s FROM t",
    "SELECT g, REGR_SXX(y, n * 2) AS sxx, REGR_AVGX(y, n * 2) AS ax, REGR_SXY(amt, x) AS sxy FROM t GROUP BY g",
    "SELECT h, REGR_SYY(x, amt) AS syy, REGR_AVGY(x, amt) AS ay, REGR_R2(n, x) AS r2 FROM t GROUP BY h",
]


SEEDS = [20261200, 20261201, 20261202, 20261203, 20261204, 20261205, 7000, 7001, 7002]  # each query answered


@pytest.mark.parametrize("seed", SEEDS)
def test_one_hostile_person_changes_nothing_but_the_noisy_values(seed: int) -> None:
    """The neighbour fuzzer's random data and registrations (a person with NaN, +-inf, +-1e308, integer extremes,
    long text, many rows), these queries: outcome, messages, warnings, charge, key set and the bounded columns
    (within their sensitivity) the same on D and D minus that person."""
    import dataclasses

    from _neighbour import check_pair, run_one
    from _neighbour_gen import random_case

    case = random_case(seed, production=seed < 10000)
    case = dataclasses.replace(case, sql=REGR_QUERIES[seed % len(REGR_QUERIES)], options=None,
                               delta=case.delta or 1e-6)
    a = run_one(case.table, case.reg, case.sql, case.eps, case.delta, case.options, case.production)
    b = run_one(case.without_target(), case.reg, case.sql, case.eps, case.delta, case.options, case.production)
    problems = check_pair(a, b, what=case.describe())
    assert not problems, case.describe() + "\n" + "\n".join(problems)
    assert "release" in a, a.get("error")  # answered, not refused on both sides


# -- clip_negative: only what cannot be negative ------------------------------------------------------------


def test_clip_negative_keeps_statistics_that_can_be_negative() -> None:
    """``clip_negative`` releases max(0, v) for counts and for means of an argument declared >= 0: never for a
    covariance, a correlation, a slope or REGR_SXY (negative whatever the bounds), nor for REGR_AVGX(y, x) of an x
    that can be negative because y cannot; REGR_COUNT is a count whatever y's bounds."""
    from dpsql.postprocess import nonnegative_aggregates

    x = np.linspace(-40.0, 10.0, 200)
    data = pa.table({"uid": np.arange(200), "x": x, "y": 100.0 - 1.5 * x})  # y >= 0, falling as x rises
    sql = ("SELECT REGR_SXY(y, x) AS sxy, REGR_AVGX(y, x) AS ax, COVAR_POP(y, x) AS cov, CORR(y, x) AS r, "
           "REGR_SLOPE(y, x) AS b FROM p")
    with dpsql.Session(budget=dpsql.Budget(100.0, 1e-3)) as s:
        use_noise(s, zero_noise())
        s.register("p", data, privacy_unit="uid", max_rows_per_unit=1,
                   columns={"x": {"bounds": (-50, 10)}, "y": {"bounds": (0, 200)}})
        plain = s.query(sql, epsilon=10.0, delta=1e-6).to_pylist()[0]
        clipped = s.query(sql, epsilon=10.0, delta=1e-6, options={"clip_negative": True}).to_pylist()[0]
    assert all(v < 0 for v in plain.values()), plain  # each one negative: clipping would show
    assert clipped == plain
    plan = plan_for("SELECT REGR_COUNT(amount, age), REGR_AVGY(amount, age), REGR_AVGX(amount, age), "
                    "REGR_AVGY(age, amount), REGR_SXY(age, age * 2) FROM t", _spec())  # amount >= -20, age >= 0
    kept = {a.sql.split("(")[0].upper() + str(i) for i, a in enumerate(plan.aggregates)
            if a.name in nonnegative_aggregates(plan)}
    assert kept == {"REGR_COUNT0", "REGR_AVGX2", "REGR_AVGY3"}


def test_the_same_pair_written_in_either_order_shares_one_release(pairs: Any) -> None:
    """``REGR_COUNT(x, y)`` counts the pairs ``REGR_COUNT(y, x)`` counts, ``REGR_AVGY(x, y)`` is ``REGR_AVGX(y, x)``,
    ``COVAR_POP(x, y)`` is ``COVAR_POP(y, x)``: one release of the pair's sums, read with y and x exchanged, charged
    as CORR(y, x) alone; at zero noise each is DuckDB's own on the clamped pairs."""
    sess, con = pairs
    written = ["REGR_COUNT(y, x)", "REGR_COUNT(x, y)", "REGR_AVGX(y, x)", "REGR_AVGY(x, y)", "REGR_SXX(x, y)",
               "REGR_SLOPE(x, y)", "COVAR_POP(x, y)", "CORR(x, y)", "REGR_INTERCEPT(x, y)", "REGR_SYY(y, x)"]
    sql = "SELECT " + ", ".join(f"{w} AS c{i}" for i, w in enumerate(written)) + " FROM p"
    scales = sess.explain(sql, epsilon=10.0, delta=1e-6).parameters["scales"]
    corr = sess.explain("SELECT CORR(y, x) FROM p", epsilon=10.0, delta=1e-6).parameters["scales"]
    assert sorted(scales.values()) == pytest.approx(sorted(corr.values()))
    got = sess.query(sql, epsilon=10.0, delta=1e-6).table.to_pylist()[0]
    clamped = [w.replace("(y, x)", f"({_Y}, {_X})").replace("(x, y)", f"({_X}, {_Y})") for w in written]
    want = con.execute("SELECT " + ", ".join(clamped) + " FROM d").fetchone()
    for i, w in enumerate(want):
        assert got[f"c{i}"] == pytest.approx(w, rel=1e-2, abs=1e-3), written[i]


def test_regr_count_needs_no_usable_bounds(pairs: Any) -> None:
    """REGR_COUNT counts the pairs whatever its arguments' bounds: bounds too wide, too narrow or a single point
    are answered as the count of the rows where both are not NULL (as without bounds); the rest of the family is
    refused, its hint rescaling the argument as written."""
    sess, con = pairs
    sess.register("w", _pairs(), privacy_unit="uid", max_rows_per_unit=2,
                  columns={"x": {"bounds": (0, 100)}, "y": {"bounds": (-1e200, 1e200)}})
    for sql in ("SELECT REGR_COUNT(y, x) AS n FROM w", "SELECT REGR_COUNT(y * 1e-300, x) AS n FROM w",
                "SELECT REGR_COUNT(y, LEAST(GREATEST(x, 3), 3)) AS n FROM w"):  # the clamp of a NULL x is 3
        want = con.execute(sql.replace("FROM w", "FROM d")).fetchone()[0]
        assert sess.query(sql, epsilon=10.0, delta=1e-6).table.column("n")[0].as_py() == want, sql
    msg = free(sess, "SELECT REGR_SXY(y, x) FROM w")
    assert "too large" in msg and "REGR_SXY(y / 1e6, x)" in msg
    assert "REGR_AVGX(x, y / 1e6)" in free(sess, "SELECT REGR_AVGX(x, y) FROM w")
