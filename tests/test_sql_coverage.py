"""SQL as analysts of other DP engines write it: schema-qualified names, GROUP BY with no aggregate
and SELECT DISTINCT, VARIANCE / STDDEV, SUM / AVG over expressions, COUNT(DISTINCT col), and the
refusals that name the real cause (TOP n, RAND(), GROUP BY the privacy unit, joins)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from _sessions import fresh_and_refusing
from conftest import make_events, run_cli
from test_bounding import (
    assert_unbounded_caught,
    assert_within_sensitivity,
    gen_dataset,
    plan_for,
    spec_for,
)

import dpsql
from dpsql import errors
from dpsql.mechanisms import variance
from dpsql.plan.intervals import NoInterval, clamp_bounds, interval
from dpsql.rewrite.bound import Caps, released_columns
from dpsql.testing import use_noise, zero_noise


def _session() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(sess, zero_noise())
    sess.register("events", make_events(), privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=1,
                  columns={"amount": {"bounds": (0, 100)}, "age": {"bounds": (0, 100)},
                           "country": {"domain": ["US", "FR", "DE", "XX"]}})
    sess.register("users", pa.table({"uid": list(range(1, 61)), "score": [float(i % 7) for i in range(60)]}),
                  privacy_unit="uid", columns={"score": {"bounds": (0, 10)}})
    return sess


s_fixture, s_refusing_fixture = fresh_and_refusing(_session, "s", "s_refusing")


def free(sess: Any, sql: str, cls: type = errors.UnsupportedQueryError) -> str:
    """The query is refused with ``cls`` by query and explain alike, and nothing is spent or recorded."""
    before, rows = sess.remaining(), sess.history().num_rows
    for run in (sess.query, sess.explain):
        with pytest.raises(cls) as ei:
            run(sql, epsilon=1.0, delta=1e-6)
    assert sess.remaining() == before and sess.history().num_rows == rows
    return str(ei.value)


# -- schema-qualified names -------------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM PUMS.events",
    "SELECT COUNT(*) FROM db.PUMS.events AS e WHERE e.age > 3",
    "SELECT COUNT(*) FROM main.events WHERE main.events.age > 3",
    'SELECT COUNT(*) FROM "PUMS"."events"',
])
def test_schema_qualified_names_resolve_to_the_registered_table(s: Any, sql: str) -> None:
    r = s.query(sql, epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == 1 and s.history().to_pylist()[-1]["tables"] == ["events"]


def test_system_schemas_and_one_table_under_two_schemas_are_refused(s_refusing: Any) -> None:
    assert "system schema 'information_schema'" in free(s_refusing, "SELECT COUNT(*) FROM information_schema.events")
    msg = free(s_refusing, "SELECT COUNT(*) FROM a.events x JOIN b.events y ON x.user_id = y.user_id")
    assert "'a.events' and 'b.events' both name the registered table 'events'" in msg and "ambiguous" in msg
    assert "not registered" in free(s_refusing, "SELECT COUNT(*) FROM PUMS.nosuch", errors.PolicyError)


# -- T-SQL TOP and RAND() ----------------------------------------------------------------------------


@pytest.mark.parametrize("sql,n", [("SELECT TOP 10 country, COUNT(*) FROM events GROUP BY country", "10"),
                                   ("select distinct top (5) age from events", "5")])
def test_top_is_refused_with_limit_as_the_fix(s_refusing: Any, sql: str, n: str) -> None:
    msg = free(s_refusing, sql)
    assert f"use LIMIT {n}" in msg and "syntax error" not in msg


@pytest.mark.parametrize("written", ["RAND", "rand", "RANDOM"])
def test_rand_is_named_as_written(s_refusing: Any, written: str) -> None:
    msg = free(s_refusing, f"SELECT COUNT(*) * {written}() AS x FROM events")
    assert f"function {written}()" in msg and f"remove {written}()" in msg
    if written != "RANDOM":
        assert "RANDOM()" not in msg


# -- GROUP BY with no aggregate, SELECT DISTINCT, GROUP BY the unit ------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT country FROM events GROUP BY country",
    "SELECT country AS c FROM PUMS.events GROUP BY c ORDER BY c",
    "SELECT DISTINCT country FROM events",
    "SELECT country FROM events GROUP BY 1 ORDER BY 1 DESC",
])
def test_keys_over_a_declared_domain_are_the_domain_for_free(s: Any, sql: str) -> None:
    plan = s.explain(sql, epsilon=1.0, delta=1e-6)
    assert plan.mechanism == "public_domain" and plan.cost == dpsql.Budget(0.0, 0.0)
    assert any("nothing is charged" in n for n in plan.notes) and plan.bounded_sql == ""
    before = s.remaining()
    r = s.query(sql, epsilon=1.0, delta=1e-6)
    assert sorted(r.table.column(0).to_pylist()) == ["DE", "FR", "US", "XX"]  # XX has no row: the domain
    assert s.remaining() == before
    row = s.history().to_pylist()[-1]
    assert row["mechanism"] == "public_domain" and row["epsilon"] == 0.0 and row["delta"] == 0.0
    assert row["status"] == "released"


def test_keys_not_declared_are_released_above_the_threshold_and_charged(s: Any) -> None:
    for sql in ("SELECT url FROM events GROUP BY url", "SELECT DISTINCT url AS u FROM events ORDER BY u"):
        before = s.remaining()
        r = s.query(sql, epsilon=1.0, delta=1e-6)
        assert r.mechanism == "sparse_histogram" and r.table.num_columns == 1  # the keys only, no count
        assert set(r.table.column(0).to_pylist()) <= set("abcdef")
        assert s.remaining().epsilon == pytest.approx(before.epsilon - 1.0)
    with pytest.raises(errors.PolicyError, match="needs delta > 0"):
        s.query("SELECT url FROM events GROUP BY url", epsilon=1.0)


def test_group_by_the_privacy_unit_is_refused_for_free(s_refusing: Any) -> None:
    msg = free(s_refusing, "SELECT user_id, COUNT(*) FROM events GROUP BY user_id")
    assert "GROUP BY the privacy unit 'user_id'" in msg and "threshold" in msg
    free(s_refusing, "SELECT DISTINCT user_id FROM events")


def test_unaliased_outputs_are_named_as_written(s: Any) -> None:
    r = s.query("SELECT VAR_SAMP(age), STDEV(age), count(*) FROM events", epsilon=1.0, delta=1e-6)
    assert r.table.column_names == ["VAR_SAMP(age)", "STDEV(age)", "COUNT(*)"]


def test_distinct_with_an_aggregate_is_still_refused(s_refusing: Any) -> None:
    assert "DISTINCT" in free(s_refusing, "SELECT DISTINCT country, COUNT(*) FROM events GROUP BY country")


# -- interval arithmetic and the clamp recogniser --------------------------------------------------------


BOUNDS = {"a": (0.0, 100.0), "b": (-20.0, 10.0)}


@pytest.mark.parametrize("expr,lo,hi", [
    ("a * 2 + b", -20.0, 210.0),          # [0, 200] + [-20, 10]
    ("a - b", -10.0, 120.0),              # [0, 100] - [-20, 10]
    ("a * b", -2000.0, 1000.0),           # corners: 0, 100 * -20, 100 * 10
    ("-b / 4", -2.5, 5.0),                # division by a literal constant
    ("ABS(b)", 0.0, 20.0),
    ("CASE WHEN a > 5 THEN 1 WHEN b < 0 THEN b ELSE 3 END", -20.0, 10.0),  # hull of 1, [-20, 10], 3
    ("CASE WHEN a > 5 THEN a END", 0.0, 100.0),  # no ELSE: NULL, which SUM skips
    ("LEAST(a, 50) + GREATEST(b, 0)", 0.0, 60.0),
    ("COALESCE(b, 0)", -20.0, 10.0),
    ("(a = 3)::INTEGER", 0.0, 1.0),
    ("CAST(b AS INTEGER) * 2", -40.0, 20.0),
    ("NULLIF(b, 0)", -20.0, 10.0),        # b or NULL (which SUM skips)
    ("NULLIF(a * 2, b) + 1", 1.0, 201.0),
    ("ROUND(b / 3)", -7.0, 4.0),          # [-6.67, 3.33], widened to whole numbers
    ("FLOOR(a / 7)", 0.0, 15.0),
    ("CEIL(b / 4)", -5.0, 3.0),
    ("TRUNC(b / 3)", -7.0, 4.0),
    ("ROUND(b / 3, 1)", -7.0, 4.0),       # k >= 0 digits: between floor and ceil too
])
def test_interval_arithmetic_pinned(expr: str, lo: float, hi: float) -> None:
    import sqlglot

    got = interval(sqlglot.parse_one(expr, read="duckdb"), lambda c: BOUNDS.get(c))
    assert got == pytest.approx((lo, hi))


@pytest.mark.parametrize("expr", ["a / b", "a / 0", "c + 1", "length('x')", "a // 2", "NULLIF(c, 0)", "ROUND(a, -1)",
                                  "ROUND(c)", "ROUND(a, b)", "ROUND(a, 1.5)"])
def test_interval_arithmetic_refuses_what_it_cannot_bound(expr: str) -> None:
    import sqlglot

    with pytest.raises(NoInterval):
        interval(sqlglot.parse_one(expr, read="duckdb"), lambda c: BOUNDS.get(c))


def test_clamp_recogniser_both_orders() -> None:
    import sqlglot

    a = clamp_bounds(sqlglot.parse_one("LEAST(GREATEST(x * 2, -1), 5)", read="duckdb"))
    b = clamp_bounds(sqlglot.parse_one("GREATEST(LEAST(x * 2, 5), -1)", read="duckdb"))
    assert a is not None and b is not None and a[1] == b[1] == (-1.0, 5.0) and a[0].sql() == b[0].sql() == "x * 2"
    assert clamp_bounds(sqlglot.parse_one("LEAST(GREATEST(x, y), 5)", read="duckdb")) is None


# -- sensitivity of the bounded SQL: remove one user ------------------------------------------------------


SENS = [
    "SELECT g, VARIANCE(amount), STDDEV_POP(age * 2 - amount) FROM t GROUP BY g",
    "SELECT VAR(amount), STD(age), COUNT(DISTINCT h) FROM t",
    "SELECT g, COUNT(DISTINCT h), SUM(CASE WHEN age > 30 THEN amount ELSE 0 END), "
    "AVG(LEAST(GREATEST(amount * 3, -50), 50)) FROM t GROUP BY g",
    "SELECT h, SUM(GREATEST(LEAST(age / 2, 10), 0)), COUNT(DISTINCT g), VAR_POP(amount) FROM t GROUP BY h",
    "SELECT g, SUM(NULLIF(amount, 0)), AVG(ROUND(amount / 3)), VARIANCE(FLOOR(age / 7)) FROM t GROUP BY g",
]


def test_removing_one_user_stays_within_the_stated_sensitivity() -> None:
    assert_within_sensitivity(SENS, 1313, 60)


def test_sensitivity_check_fails_without_bounding() -> None:
    """Negative control: the same check catches the unbounded queries."""
    assert_unbounded_caught(SENS, 1313)


def test_released_columns_state_the_sensitivities() -> None:
    data = gen_dataset(np.random.default_rng(1))
    spec = spec_for("t", data, bounds={"amount": (-20.0, 100.0), "age": (0.0, 60.0)})
    plan = plan_for("SELECT VAR(amount), COUNT(DISTINCT h), SUM(age * 2 - amount) FROM t", spec)
    cols = {c.name: c.sensitivity for c in released_columns(plan, Caps(1, 3))}
    # k = 3; VAR: r = (100 - -20) / 2 = 60 -> count 3, centred sum 3 * 60, sum of squares 3 * 3600
    # COUNT(DISTINCT h): 3 values; SUM: [2*0 - 100, 2*60 + 20] = [-100, 140] -> 3 * 140
    assert cols == {"__users": 1.0, "__a0_sum": 180.0, "__a0_cnt": 3.0, "__a0_sq": 10800.0, "__a1": 3.0, "__a2": 420.0}


# -- calibration, pinned by hand ---------------------------------------------------------------------------


@pytest.fixture
def lap() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(sess, zero_noise())
    sess.register("t", pa.table({"uid": [1, 2, 3], "x": [1.0, 2.0, 3.0], "y": [0.0, 5.0, 9.0], "s": ["a", "b", "a"]}),
                  privacy_unit="uid", max_rows_per_unit=2, columns={"x": {"bounds": (0, 10)}, "y": {"bounds": (0, 10)}})
    yield sess
    sess.close()


#: the snapping mechanism's floating-point margin raises lambda above Delta / eps by less than this
SNAP = 3e-3


def test_laplace_calibration_of_variance_pinned(lap: Any) -> None:
    p = lap.explain("SELECT VAR(x) FROM t", epsilon=3.0).parameters
    # m = 3 columns, C = 1: eps per column 3 / 3 = 1; L = 2 rows, r = 5:
    # Delta = 2 (count), 2 * 5 = 10 (centred sum), 2 * 25 = 50 (sum of squares)
    assert p["l1_sensitivity"] == 3
    lam = {k: v["lambda"] for k, v in p["snapping"].items()}
    assert lam["__a0_cnt"] == pytest.approx(2.0, rel=SNAP)
    assert lam["__a0_sum"] == pytest.approx(10.0, rel=SNAP)
    assert lam["__a0_sq"] == pytest.approx(50.0, rel=SNAP)


def test_laplace_calibration_of_expression_sum_and_distinct_count_pinned(lap: Any) -> None:
    p = lap.explain("SELECT SUM(x * 2 + y) FROM t", epsilon=1.0).parameters
    assert p["snapping"]["__a0"]["lambda"] == pytest.approx(60.0, rel=SNAP)  # [0, 30] -> 2 rows * 30
    p = lap.explain("SELECT SUM(LEAST(GREATEST(x - y, -4), 1)) FROM t", epsilon=1.0).parameters
    assert p["snapping"]["__a0"]["lambda"] == pytest.approx(8.0, rel=SNAP)  # 2 rows * max(|-4|, |1|)
    p = lap.explain("SELECT COUNT(DISTINCT s) FROM t", epsilon=0.5).parameters
    assert p["snapping"]["__a0"]["lambda"] == pytest.approx(4.0, rel=SNAP)  # 2 values / 0.5


def test_gaussian_calibration_of_variance_pinned(lap: Any) -> None:
    p = lap.explain("SELECT VAR(x) FROM t", epsilon=1.0, delta=1e-6).parameters
    sc = p["scales"]
    assert p["l2_sensitivity"] == pytest.approx(math.sqrt(3))  # three normalised columns, one group
    assert sc["__a0_sum"] / sc["__a0_cnt"] == pytest.approx(5.0)  # r = 5
    assert sc["__a0_sq"] / sc["__a0_cnt"] == pytest.approx(25.0)  # r^2 = 25


def test_variance_interval_pinned() -> None:
    one = np.array([100.0]), np.array([0.0]), np.array([2500.0])
    # exact: Q/n - (S/n)^2 = 25, sample 2500 / 99
    assert variance.point("var_pop", *one, 10.0)[0] == pytest.approx(25.0)
    assert variance.point("var_samp", *one, 10.0)[0] == pytest.approx(25.252525252525)
    assert variance.point("stddev_pop", *one, 10.0)[0] == pytest.approx(5.0)
    assert np.isnan(variance.point("var_samp", np.array([1.0]), np.array([0.0]), np.array([3.0]), 10.0)[0])
    # box n 90..110, S -10..10, Q 2400..2600: pop in [2400/110 - (10/90)^2, 2600/90]
    lo, hi = variance.interval("var_pop", *one, 10.0, 10.0, 100.0, 10.0)
    assert (lo[0], hi[0]) == pytest.approx((21.805836139, 28.888888889))
    lo, hi = variance.interval("var_samp", *one, 10.0, 10.0, 100.0, 10.0)
    assert (lo[0], hi[0]) == pytest.approx((21.805836139 * 110 / 109, 28.888888889 * 90 / 89))
    lo, hi = variance.interval("stddev_pop", *one, 10.0, 10.0, 100.0, 10.0)
    assert (lo[0], hi[0]) == pytest.approx((math.sqrt(21.805836139), math.sqrt(28.888888889)))
    assert variance.Z_THIRD == pytest.approx(2.39398, abs=1e-5)  # Phi^-1(1 - 0.05/6)


def test_variance_interval_covers_the_truth() -> None:
    """Coverage >= 95% by construction (union bound): 20000 draws, failure probability < 1e-9 at a
    threshold of 94%; negative control: quarter-width intervals must fall below it."""
    gen = np.random.default_rng(20261130)
    n, s, q, sd = 50.0, 20.0, 900.0, (3.0, 15.0, 150.0)
    truth = (q / n - (s / n) ** 2) * n / (n - 1)
    draws = 20000
    nn, ss, qq = (v + gen.normal(0, d, draws) for v, d in zip((n, s, q), sd))
    rates = []
    for f in (1.0, 0.25):
        lo, hi = variance.interval("var_samp", nn, ss, qq, *(f * variance.Z_THIRD * d for d in sd), 10.0)
        rates.append(float(np.mean((lo <= truth) & (truth <= hi))))
    assert rates[0] >= 0.94, rates
    assert rates[1] < 0.94, rates  # negative control


# -- end to end ---------------------------------------------------------------------------------------------


def test_variance_end_to_end_matches_the_bounded_truth(s: Any) -> None:
    """Zero noise, caps that drop nothing: the released VARIANCE / STDDEV are DuckDB's on the clamped
    values up to rounding, and within the stated interval."""
    data = make_events()
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(sess, zero_noise())
    sess.register("ev", data, privacy_unit="user_id", max_rows_per_unit=10, columns={"amount": {"bounds": (0, 100)}})
    con = duckdb.connect()
    con.register("d", data)
    want = con.execute("SELECT var_samp(least(greatest(amount, 0), 100)), stddev_pop(least(greatest(amount, 0), 100)), "
                       "var_samp(least(greatest(amount * 2 - age, -50), 150)) FROM d").fetchone()
    r = sess.query("SELECT VARIANCE(amount) AS v, STDDEV_POP(amount) AS sd, "
                   "VAR(LEAST(GREATEST(amount * 2 - age, -50), 150)) AS e FROM PUMS.ev", epsilon=10.0, delta=1e-6)
    row = r.table.to_pylist()[0]
    for name, w in zip(("v", "sd", "e"), want):
        hw = r.accuracy[name]["ci95_half_width"]
        assert abs(row[name] - w) <= hw, (name, row[name], w, hw)
        assert abs(row[name] - w) <= 0.01 * w  # zero noise: only the rounding grids move it
    assert "sum of squares" in r.accuracy["v"]["note"]
    text = str(sess.explain("SELECT STD(amount) AS sd FROM ev", epsilon=1.0, delta=1e-6))
    assert "expected accuracy of sd" in text and "l2_sensitivity: 1.73205" in text  # sqrt(3): three columns
    sess.close()


def test_grouped_variance_and_expression_sum_through_the_sparse_histogram(s: Any) -> None:
    r = s.query("SELECT url, STDDEV(amount) AS sd, SUM(CASE WHEN age > 50 THEN amount ELSE 0 END) AS s FROM events "
                "GROUP BY url", epsilon=5.0, delta=1e-6)
    assert r.mechanism == "sparse_histogram" and r.table.num_rows >= 1
    assert "per_row_ci95_half_width" in r.accuracy["sd"]
    assert all(0.0 <= v <= 50.0 for v in r.table.column("sd").to_pylist() if v is not None)  # <= r * sqrt(2)


def test_count_distinct_end_to_end(s: Any) -> None:
    r = s.query("SELECT country, COUNT(DISTINCT url) AS n FROM events GROUP BY country ORDER BY country",
                epsilon=1.0, delta=1e-6)
    got = dict(zip(r.table.column("country").to_pylist(), r.table.column("n").to_pylist()))
    assert got["XX"] == 0 and all(0 <= v <= 6 for v in got.values())
    assert r.accuracy["n"]["noise_std"] > 0


def test_unbounded_expression_names_the_fix(s_refusing: Any) -> None:
    msg = free(s_refusing, "SELECT SUM(amount / age) FROM events")
    assert "literal non-zero constant" in msg and "LEAST(GREATEST(expr, lo), hi)" in msg
    msg = free(s_refusing, "SELECT SUM(LEAST(GREATEST(amount, 5), 1)) FROM events")
    assert "lower bound 5 is above its upper bound 1" in msg
    assert "DISTINCT" in free(s_refusing, "SELECT SUM(DISTINCT amount) FROM events")


# -- joins: one true problem, one violation ------------------------------------------------------------------


@pytest.mark.parametrize("sql,words", [
    ("SELECT COUNT(*) FROM events a JOIN users b ON a.user_id = b.uid JOIN nosuch c ON c.x = b.uid "
     "WHERE c.y > 1 AND z = 2", "'nosuch' is not registered"),
    ("SELECT COUNT(*) FROM events a JOIN read_csv('x.csv') r ON r.x = a.user_id WHERE r.y > 1", "table functions"),
    ("SELECT e.country, COUNT(*) FROM events e JOIN users u ON e.user_id = u.uid GROUP BY e.country HAVING SUM(u.score) > 1",
     "released only when the SELECT list asks for it"),
    ("SELECT COUNT(*) FROM events a LEFT JOIN users b ON a.user_id = b.uid WHERE b.score > 2", "LEFT joins"),
])
def test_join_refusals_report_one_true_problem(s_refusing: Any, sql: str, words: str) -> None:
    msg = free(s_refusing, sql)
    assert words in msg and "problems" not in msg and "unknown" not in msg, msg


# -- CLI ---------------------------------------------------------------------------------------------------


def test_cli_variance_public_domain_and_top(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ["--config", "examples/dpsql.toml"]
    sql = "SELECT VAR(amount) AS v, STDDEV(amount) AS sd FROM PUMS.events"
    assert run_cli([*cfg, "query", sql, "--epsilon", "1", "--delta", "1e-6", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].replace('"', "") == "v,sd" and "v: 95% interval +/-" in err
    assert run_cli([*cfg, "explain", sql, "--epsilon", "1", "--delta", "1e-6"]) == 0
    out, _ = capsys.readouterr()
    assert "expected accuracy of v: from noisy count, centred sum and sum of squares" in out and "__a0_sq" in out
    assert run_cli([*cfg, "explain", "SELECT DISTINCT country FROM events", "--epsilon", "1"]) == 0
    out, err = capsys.readouterr()
    assert "public_domain" in out and "epsilon=0" in out
    assert run_cli([*cfg, "query", "SELECT TOP 5 country FROM events", "--epsilon", "1"]) == 2
    _, err = capsys.readouterr()
    assert "use LIMIT 5" in err


def test_variance_interval_never_warns_on_masked_branches() -> None:
    """A noisy count of at most 1 makes n/(n - 1) infinite in a branch np.where masks; computing it
    must not warn (a caller's warnings-as-errors would fail the query after its charge)."""
    import warnings

    from dpsql.plan import ir

    n, s, q = np.array([0.4, 1.0, 5.0]), np.array([0.0, 3.0, 10.0]), np.array([-9.0, -9.0, 30.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind in (ir.VAR_SAMP, ir.STDDEV_SAMP, ir.VAR_POP):
            lo, hi = variance.interval(kind, n, s, q, 2.0, 3.0, 4.0, 10.0)
            assert np.all(lo <= hi)


@pytest.mark.parametrize("sql", [
    "SELECT country, COUNT(*) FROM events GROUP BY 1.5",
    "SELECT country, COUNT(*) FROM events GROUP BY country, 1e0",
    "SELECT country, COUNT(*) FROM events GROUP BY ROLLUP (1.5)",
    "SELECT country, COUNT(*) FROM events GROUP BY CUBE (country, 2.0)",
])
def test_group_by_a_number_that_is_no_position(s_refusing: Any, sql: str) -> None:
    """GROUP BY 1.5 (a number, not a whole one): a clear refusal for free; it raised a raw ValueError."""
    msg = free(s_refusing, sql)
    assert "position" in msg and "whole number" in msg
