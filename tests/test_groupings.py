"""GROUP BY ROLLUP / CUBE / GROUPING SETS and UNION ALL (``dpsql.groupings``): one query per grouping or SELECT, one
charge (the sum of theirs), SQL's result shape. At zero noise the release is DuckDB's own answer to the query,
GROUPING() and the combined column types included; refusals charge nothing; a failure after the charge fails the one
entry."""

from __future__ import annotations

import datetime
from fractions import Fraction

import duckdb
import pyarrow as pa
import pytest

import dpsql
import dpsql.engine as backends
from dpsql.budget import Budget, float_at_least
from dpsql.errors import ConfigError, ExecutionError, QueryError, UnsupportedQueryError
from dpsql.groupings import DIFFERS_BY_QUERY
from dpsql.testing import use_noise, zero_noise

A, B = ["x", "y", "z"], [1, 2]


def _public() -> pa.Table:
    # one row per person: no cap drops a row, so the bounded answer is the true one
    n = 600
    return pa.table({"uid": list(range(n)), "a": [A[i % 3] for i in range(n)], "b": [B[(i // 3) % 2] for i in range(n)],
                     "v": [float(i % 5) for i in range(n)]})


def _session(table: pa.Table, **columns: dict[str, object]) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("t", table, privacy_unit="uid", columns=columns or {"a": {"domain": A}, "b": {"domain": B},
                                                                   "v": {"bounds": [0, 4]}})
    use_noise(s, zero_noise())
    return s


def _duck(table: pa.Table, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect()
    con.register("t", table)
    return con.execute(sql).fetchall()


def _rows(r: dpsql.Release) -> list[tuple[object, ...]]:
    return [tuple(d.values()) for d in r.to_pylist()]


def _key(row: tuple[object, ...]) -> tuple[object, ...]:
    return tuple((x is None, str(x)) for x in row)


@pytest.mark.parametrize("sql", [
    "SELECT a, b, GROUPING(a, b) AS g, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY ROLLUP (a, b)",
    "SELECT a, b, COUNT(*) AS n FROM t GROUP BY CUBE (a, b)",
    "SELECT a, COUNT(*) AS n, grouping(a) FROM t GROUP BY GROUPING SETS ((a), ())",
    "SELECT b, a, SUM(v) AS s FROM t WHERE v > 0 GROUP BY b, ROLLUP (a)",
    "SELECT upper(a) AS ua, b, COUNT(*) AS n, GROUPING(ua) + 1 AS g FROM t GROUP BY ROLLUP (ua, 2)",
    "SELECT a, b, COUNT(*) AS n FROM t GROUP BY GROUPING SETS (ROLLUP (a), CUBE (b), (a, b), (a, b))",
    # a quoted name is the column, in any case (DuckDB's names are case-insensitive, quoted or not)
    'SELECT "a", "T"."B", COUNT(*) AS n, GROUPING("A", b) AS g FROM t GROUP BY ROLLUP (a, "b")',
])
def test_zero_noise_release_is_duckdbs_answer(sql: str) -> None:
    t = _public()
    s = _session(t)
    got = _rows(s.query(sql, epsilon=4, delta=1e-5))
    assert sorted(got, key=_key) == sorted(_duck(t, sql), key=_key)


@pytest.mark.parametrize("sql", [
    "SELECT 'x' AS metric, COUNT(*) AS n FROM t WHERE a = 'x' UNION ALL SELECT 'big', SUM(v) FROM t WHERE v > 2",
    "SELECT a, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'all', COUNT(*) FROM t",
    "SELECT a, COUNT(*) FROM t GROUP BY a UNION ALL SELECT b, COUNT(*) FROM t GROUP BY b",  # BIGINT keys as text
    "SELECT COUNT(*) FROM t UNION ALL SELECT AVG(v) FROM t UNION ALL (SELECT MEDIAN(v) FROM t)",
    "SELECT a, b, COUNT(*) FROM t GROUP BY ROLLUP (a, b) UNION ALL SELECT 'q', 7, SUM(v) FROM t",
    "WITH w AS (SELECT * FROM t WHERE v > 1) SELECT COUNT(*) FROM w UNION ALL SELECT COUNT(*) FROM t",
    "SELECT a, GROUPING(a) AS g, COUNT(*) AS n FROM t GROUP BY ROLLUP (a) UNION ALL SELECT 'avg', NULL, AVG(v) FROM t",
    "SELECT NULL AS x, COUNT(*) AS n FROM t UNION ALL SELECT NULL, SUM(v) FROM t",
])
def test_union_all_at_zero_noise_is_duckdbs_answer(sql: str) -> None:
    t = _public()
    s = _session(t)
    r = s.query(sql, epsilon=4, delta=1e-5)
    assert sorted(_rows(r), key=_key) == sorted(_duck(t, sql), key=_key)
    con = duckdb.connect()
    con.register("t", t)
    assert r.table.schema.types == con.sql(sql).to_arrow_table().schema.types
    assert r.mechanism.startswith("union_all(")


def test_union_all_order_by_limit_and_charge() -> None:
    t = _public()
    s = _session(t)
    sql = "SELECT a AS k, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'total', COUNT(*) FROM t ORDER BY n DESC, k LIMIT 2"
    plan = s.explain(sql, epsilon=2.0, delta=2e-6)
    r = s.query(sql, epsilon=2.0, delta=2e-6)
    assert _rows(r) == _duck(t, sql) == [("total", 600), ("x", 200)]
    assert [c["cost"]["epsilon"] for c in plan.parameters["components"]] == [1.0, 1.0]
    assert r.cost == plan.cost and s.history().num_rows == 1 and s.history().to_pylist()[0]["epsilon"] == 2.0


def test_order_by_and_limit_apply_to_the_whole_result() -> None:
    t = _public()
    s = _session(t)
    sql = "SELECT a, b, GROUPING(a, b) AS g, COUNT(*) AS n FROM t GROUP BY ROLLUP (a, b) ORDER BY g DESC, a, 2 LIMIT 5"
    r = s.query(sql, epsilon=3, delta=1e-5)
    assert _rows(r) == _duck(t, sql)
    assert r.table.column_names == ["a", "b", "g", "n"]


@pytest.mark.parametrize("sql", [
    "SELECT a AS b, b AS a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a, b) ORDER BY a, b",
    "SELECT a AS b, b AS a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a, b) ORDER BY t.a, t.b",
    "SELECT b AS a, COUNT(*) AS n FROM t GROUP BY b UNION ALL SELECT b, SUM(v) FROM t GROUP BY b ORDER BY n, a",
])
def test_order_by_a_name_is_the_output_of_that_name_before_a_column(sql: str) -> None:
    """As in DuckDB, ORDER BY a names the output called a (here the column b), not the output that is the column a;
    a qualified t.a is the column."""
    t = _public()
    assert _rows(_session(t).query(sql, epsilon=3, delta=1e-5)) == _duck(t, sql)


@pytest.mark.parametrize("sql", [
    "SELECT a AS c1, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT a AS c2, SUM(v) AS m FROM t GROUP BY a ORDER BY m, c2",
    # a later SELECT's name before an expression of the first (b AS a: ORDER BY a is that output), the first name wins
    "SELECT a AS x, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'q' AS p, COUNT(*) AS a FROM t ORDER BY a, x",
    "SELECT a AS x, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT a AS n, COUNT(*) AS x FROM t GROUP BY a ORDER BY n, x",
    "SELECT a AS x, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT b, COUNT(*) FROM t GROUP BY b ORDER BY n, b, x",
])
def test_union_all_order_by_reads_the_names_of_every_select(sql: str) -> None:
    """As in DuckDB: ORDER BY a name of any SELECT (the first SELECT's first, then the next's), then an expression
    of any SELECT (ORDER BY c2, a later SELECT's name, was refused as naming no output column)."""
    t = _public()
    assert _rows(_session(t).query(sql, epsilon=3, delta=1e-5)) == _duck(t, sql)


@pytest.mark.parametrize("sql", [
    "SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a) ORDER BY a FETCH FIRST 2 ROWS ONLY",
    "SELECT a, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'q', COUNT(*) FROM t ORDER BY a, n "
    "OFFSET 1 ROWS FETCH NEXT 3 ROWS ONLY",
])
def test_fetch_first_is_a_limit(sql: str) -> None:
    """FETCH FIRST n ROWS ONLY (answered for one query) was refused as 'LIMIT ... must be a whole number'."""
    t = _public()
    assert _rows(_session(t).query(sql, epsilon=3, delta=1e-5)) == _duck(t, sql)


@pytest.mark.parametrize("sql", [
    # the second SELECT's own CTE reads t, which is the WITH's t (v > 3), not the registered table (it read the table)
    "WITH t AS (SELECT * FROM t WHERE v > 3) SELECT COUNT(*) AS n FROM t UNION ALL "
    "(WITH z AS (SELECT * FROM t WHERE v > 2) SELECT COUNT(*) FROM z)",
    "WITH w AS (SELECT * FROM t WHERE v > 3) SELECT COUNT(*) AS n FROM w UNION ALL "
    "(WITH z AS (SELECT * FROM w WHERE v < 4) SELECT COUNT(*) FROM z)",
])
def test_a_select_with_its_own_with_reads_the_ctes_before_the_first_select(sql: str) -> None:
    t = _public()
    assert _rows(_session(t).query(sql, epsilon=2, delta=1e-5)) == _duck(t, sql)


@pytest.mark.parametrize(("weights", "match"), [
    ([10**400, 1], r"grouping_weights give query 2 of 2 .* a share of epsilon that rounds to 0"),
    ([1, 1e-17], r"query 2 of 2 of the GROUP BY ROLLUP \(SELECT COUNT\(\*\) FROM t\), at its share epsilon=1e-17, delta=0 .*: "
                 "epsilon is too small"),
])
def test_a_share_too_small_is_named_with_its_query(weights: list[float], match: str) -> None:
    """A share that rounds to 0 was refused as 'epsilon must be a finite number > 0, got 0.0' (the caller asked for 1),
    and one too small to calibrate said 'epsilon is too small' naming neither the query nor its share."""
    s = _session(_public())
    with pytest.raises(ConfigError, match=match):
        s.explain("SELECT a, COUNT(*) FROM t GROUP BY ROLLUP (a)", epsilon=1.0, options={"grouping_weights": weights})
    assert s.history().num_rows == 0


def test_grouping_tells_a_rolled_up_null_from_a_released_null_key() -> None:
    # keys not declared: the sparse histogram releases the groups above its threshold, a NULL key among them
    n = 900
    t = pa.table({"uid": list(range(n)), "a": [["x", "y", None][i % 3] for i in range(n)], "v": [1.0] * n})
    s = _session(t, v={"bounds": [0, 1]})
    sql = "SELECT a, GROUPING(a) AS g, COUNT(*) AS n FROM t GROUP BY ROLLUP (a)"
    r = s.query(sql, epsilon=3, delta=1e-5)
    assert sorted(_rows(r), key=_key) == sorted(_duck(t, sql), key=_key)
    assert sorted((row[1], row[2]) for row in _rows(r) if row[0] is None) == [(0, 300), (1, 900)]
    assert r.mechanism == "groupings(sparse_histogram, gaussian)"


def test_one_entry_charged_the_sum_of_the_components() -> None:
    s = _session(_public())
    sql = "SELECT a, b, COUNT(*) FROM t GROUP BY ROLLUP (a, b)"
    plan = s.explain(sql, epsilon=1.5, delta=3e-6)
    before = s.remaining()
    r = s.query(sql, epsilon=1.5, delta=3e-6)
    comps = plan.parameters["components"]
    assert [c["sql"] for c in comps] == ["SELECT a, b, COUNT(*) FROM t GROUP BY a, b",
                                         "SELECT a, COUNT(*) FROM t GROUP BY a", "SELECT COUNT(*) FROM t"]
    assert [c["cost"]["epsilon"] for c in comps] == [0.5, 0.5, 0.5]
    total = Budget(0.0, 0.0)
    for c in comps:
        total = total + Budget(c["cost"]["epsilon"], c["cost"]["delta"])
    assert r.cost == plan.cost == total and total.epsilon == 1.5 and 3e-6 < total.delta < 3e-6 * (1 + 1e-6)
    hist = s.history().to_pylist()
    assert len(hist) == 1 and hist[0]["status"] == "released" and hist[0]["epsilon"] == 1.5
    assert s.remaining() == before.minus(total)
    assert "-- query 3 of 3: SELECT COUNT(*) FROM t\n" in plan.bounded_sql and "3 queries" in plan.reason


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM t UNION ALL SELECT COUNT(*) FROM t",
    "SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a)",
    "SELECT a, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'all', COUNT(*) AS m FROM t",
])
def test_a_columns_accuracy_is_read_from_every_query_by_position(sql: str) -> None:
    """A later query's column is the column at its position, whatever its own name: COUNT(*) of the second SELECT
    (its own name count_star()) was not read, so n said the first query's accuracy, 3 times the second's noise."""
    s = _session(_public())
    r = s.query(sql, epsilon=1.0, options={"grouping_weights": [1, 3]})
    parts = [c["accuracy"] for c in r.details["components"]]
    assert parts[0]["n"]["noise_std"] == pytest.approx(3 * list(parts[1].values())[-1]["noise_std"], rel=1e-2)
    assert r.accuracy["n"] == {"note": DIFFERS_BY_QUERY}
    assert r.accuracy.get("a") != {"note": DIFFERS_BY_QUERY}  # a key column has none (it said 'differs by query')


def test_grouping_weights_split_the_budget() -> None:
    s = _session(_public())
    sql = "SELECT a, COUNT(*) FROM t GROUP BY GROUPING SETS ((a), ())"
    plan = s.explain(sql, epsilon=1.0, delta=0.0, options={"grouping_weights": [3, 1]})
    assert [c["cost"]["epsilon"] for c in plan.parameters["components"]] == [0.75, 0.25]
    assert plan.cost == Budget(1.0, 0.0)
    with pytest.raises(ConfigError, match="grouping_weights must be a list of 2 positive numbers"):
        s.explain(sql, epsilon=1.0, options={"grouping_weights": [1]})
    with pytest.raises(ConfigError, match="grouping_weights applies to a request of several queries only"):
        s.query("SELECT a, COUNT(*) FROM t GROUP BY a", epsilon=1.0, options={"grouping_weights": [1]})
    assert s.history().num_rows == 0


@pytest.mark.parametrize(("sql", "options", "error", "match"), [
    ("SELECT a || 'x' AS ax, COUNT(*) FROM t GROUP BY ROLLUP (a)", None, UnsupportedQueryError,
     "uses a grouping column inside an expression"),
    ("SELECT a, COUNT(*) FROM t GROUP BY ROLLUP (a) HAVING a <> 'x'", None, UnsupportedQueryError,
     "grouping column in HAVING"),
    ("SELECT a AS k, COUNT(*) FROM t GROUP BY ROLLUP (a) HAVING k <> 'x'", None, UnsupportedQueryError,
     "grouping column in HAVING"),  # by its output name: it was 'unknown column k' of the grand total's query
    ("SELECT a, b, COUNT(*) FROM t GROUP BY CUBE (a, b, v, uid, a, b, v)", None, UnsupportedQueryError,
     "more than 64 groupings"),
    ("SELECT a, COUNT(*) FROM t GROUP BY ROLLUP (a) ORDER BY COUNT(*) + 1", None, UnsupportedQueryError,
     "names no output column"),
    ("SELECT a, COUNT(*) FROM t GROUP BY ROLLUP (a)", {"mechanism": "nope"}, ConfigError, "unknown mechanism"),
    ("SELECT a, GROUPING(b), COUNT(*) FROM t GROUP BY ROLLUP (a)", None, UnsupportedQueryError,
     "the arguments of GROUPING are columns the query groups by"),
    # DuckDB refuses GROUPING inside an aggregate or in WHERE; the FILTER was answered (0 in the grand total), the SUM
    # refused as a sum of the constant 0, the WHERE as an aggregate
    ("SELECT a, COUNT(*) FILTER (WHERE GROUPING(a) = 0) FROM t GROUP BY ROLLUP (a)", None, UnsupportedQueryError,
     "GROUPING inside an aggregate or in WHERE"),
    ("SELECT a, SUM(GROUPING(a)) FROM t GROUP BY ROLLUP (a)", None, UnsupportedQueryError,
     "GROUPING inside an aggregate or in WHERE"),
    ("SELECT a, COUNT(*) FROM t WHERE GROUPING(a) = 0 GROUP BY ROLLUP (a)", None, UnsupportedQueryError,
     "GROUPING inside an aggregate or in WHERE"),
    ("SELECT a, COUNT(*) FROM t GROUP BY ROLLUP (a) LIMIT 0", None, UnsupportedQueryError, "LIMIT 0"),
    ("SELECT a, COUNT(*) FROM t GROUP BY ROLLUP (a) LIMIT '5'", None, UnsupportedQueryError, "must be a whole number"),
    # GROUPING of 64 arguments: its value would not fit a BIGINT (DuckDB refuses it); it failed after the charge
    ("SELECT a, GROUPING(" + ", ".join(["a"] * 64) + ") AS g, COUNT(*) FROM t GROUP BY ROLLUP (a)", None,
     UnsupportedQueryError, "at most 63 arguments"),
    ("SELECT a, GROUPING(" + ", ".join(["a"] * 64) + ") + 1 AS g, COUNT(*) FROM t GROUP BY ROLLUP (a)", None,
     UnsupportedQueryError, "at most 63 arguments"),
    ("SELECT a, COUNT(*) FROM t GROUP BY ROLLUP (a) LIMIT 50 PERCENT", None, UnsupportedQueryError, "PERCENT"),
    ("SELECT COUNT(*) FROM t UNION ALL SELECT COUNT(*) FROM t LIMIT 50%", None, UnsupportedQueryError, "PERCENT"),
    ("SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a) ORDER BY n LIMIT 1 WITH TIES", None, UnsupportedQueryError,
     "WITH TIES"),
    ("SELECT a FROM t GROUP BY ROLLUP (a)", None, UnsupportedQueryError, "releases no value"),
    # DuckDB's parser refuses it too; it was refused as 'GROUP BY CUBE is not supported', which it is
    ("SELECT a, COUNT(*) FROM t GROUP BY CUBE (a) WITH ROLLUP", None, UnsupportedQueryError,
     r"WITH ROLLUP follows a plain list of grouping columns, not CUBE \(a\)"),
    ("SELECT COUNT(*) FROM t UNION SELECT COUNT(*) FROM t", None, UnsupportedQueryError, "write UNION ALL"),
    ("SELECT COUNT(*) AS n FROM t UNION ALL BY NAME SELECT COUNT(*) AS n FROM t", None, UnsupportedQueryError,
     "BY NAME"),
    ("SELECT COUNT(*), 1 FROM t UNION ALL SELECT COUNT(*) FROM t", None, UnsupportedQueryError, "have 1 and 2 columns"),
    ("WITH w AS (SELECT * FROM t WHERE v > 3) SELECT COUNT(*) FROM w UNION ALL (WITH w AS (SELECT * FROM t) "
     "SELECT COUNT(*) FROM w)", None, UnsupportedQueryError, "has the name of a CTE of the WITH before the first SELECT"),
    ("SELECT DATE '2024-01-01' AS d, COUNT(*) FROM t UNION ALL SELECT COUNT(*), COUNT(*) FROM t", None,
     UnsupportedQueryError, r"column 1: DATE, BIGINT; combined as DATE"),
    ("SELECT COUNT(*) FROM t UNION ALL SELECT COUNT(*) FROM t ORDER BY nosuch", None, UnsupportedQueryError,
     "names no output column"),
    # DuckDB: 'Ambiguous reference to column'
    ("SELECT a AS x, b AS y, COUNT(*) FROM t GROUP BY a, b UNION ALL SELECT b AS p, a AS q, COUNT(*) FROM t GROUP BY a, b "
     "ORDER BY a", None,
     UnsupportedQueryError, "ORDER BY a is ambiguous: it is column 1 of one SELECT and column 2 of another"),
    ("SELECT COUNT(*) FROM t UNION ALL SELECT COUNT(*) FROM t WHERE nosuch = 1", None, UnsupportedQueryError,
     r"query 2 of 2 of the UNION ALL \(SELECT COUNT\(\*\) FROM t WHERE nosuch = 1\): .*nosuch"),
    ("SELECT v, COUNT(*) FROM t GROUP BY ROLLUP (v)", None, QueryError, "needs delta > 0"),  # a component refused
    # an empty ROLLUP or CUBE (DuckDB's parser refuses it): COUNT(*) alone was answered and charged as the total,
    # with an output column refused as 'outside an aggregate and not in GROUP BY' of 'query 1 of 1'
    ("SELECT COUNT(*) AS n FROM t GROUP BY ROLLUP ()", None, QueryError,
     r"(?s)ROLLUP \(\) names no column.*leave GROUP BY out"),
    ("SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP ()", None, QueryError, r"ROLLUP \(\) names no column"),
    ("SELECT COUNT(*) AS n FROM t GROUP BY CUBE()", None, QueryError, r"CUBE \(\) names no column"),
    ("SELECT a, COUNT(*) AS n FROM t GROUP BY a, ROLLUP ()", None, QueryError, r"ROLLUP \(\) names no column"),
    ("SELECT a, COUNT(*) AS n FROM t GROUP BY GROUPING SETS ((a), CUBE ())", None, QueryError,
     r"CUBE \(\) names no column"),
    ("SELECT COUNT(*) FROM t UNION ALL SELECT COUNT(*) FROM t GROUP BY ROLLUP ()", None, QueryError,
     r"ROLLUP \(\) names no column"),
    # it was 'SQL syntax error ... GROUPINGSETS is missing an argument'
    ("SELECT COUNT(*) AS n FROM t GROUP BY GROUPING SETS ()", None, QueryError,
     r"(?s)GROUPING SETS \(\) lists no grouping.*GROUPING SETS \(\(a, b\), \(a\), \(\)\)"),
])
def test_refusals_charge_nothing(sql: str, options: dict[str, object] | None, error: type, match: str) -> None:
    s = _session(_public())
    before = s.remaining()
    for call in (s.explain, s.query):
        with pytest.raises(error, match=match):
            call(sql, epsilon=1.0, delta=0.0, options=options)
    assert s.remaining() == before and s.history().num_rows == 0


def test_failure_after_the_charge_fails_the_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _session(_public())
    real, calls = backends.fetch_bounded, []

    def fetch(backend: object, ast: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(backend, ast)  # type: ignore[arg-type]

    monkeypatch.setattr(backends, "fetch_bounded", fetch)
    with pytest.raises(ExecutionError, match="failed after its budget was charged; the charge stands") as e:
        s.query("SELECT a, b, COUNT(*) FROM t GROUP BY ROLLUP (a, b)", epsilon=1.5, delta=3e-6)
    assert "disk" not in str(e.value)
    hist = s.history().to_pylist()
    assert [h["status"] for h in hist] == ["failed"] and hist[0]["epsilon"] == 1.5
    assert s.remaining().epsilon == 98.5


def _days() -> pa.Table:
    n = 400
    return pa.table({"uid": list(range(n)), "day": [datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 4) for i in range(n)],
                     "k": [["p", "q"][i % 2] for i in range(n)]})


@pytest.mark.parametrize("sql", [
    "SELECT day, COUNT(*) FROM t GROUP BY ROLLUP (day)",  # DAWA over the declared bins, whose keys are the bins
    "SELECT k, day, COUNT(*) FROM t GROUP BY GROUPING SETS ((k), (day))",
    "SELECT k, COUNT(*) FROM t GROUP BY k UNION ALL SELECT day, COUNT(*) FROM t GROUP BY day",
    "SELECT k FROM t GROUP BY k UNION ALL SELECT k FROM t GROUP BY k",  # declared keys only: read from the catalog
])
def test_keys_released_from_their_declared_domain(sql: str) -> None:
    t = _days()
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("t", t, privacy_unit="uid", max_rows_per_unit=1,
               columns={"day": {"bounds": ("2026-01-01", "2026-01-05"), "bin_width": "1 day"}, "k": {"domain": ["p", "q"]}})
    use_noise(s, zero_noise())
    r = s.query(sql, epsilon=4, delta=1e-5)
    assert sorted(_rows(r), key=_key) == sorted(_duck(t, sql), key=_key)
    con = duckdb.connect()
    con.register("t", t)
    assert r.table.schema.types == con.sql(sql).to_arrow_table().schema.types


@pytest.mark.parametrize(("eps", "weights"), [(1.0, None), (0.7, [1, 2, 3]), (1e-3, [0.1, 0.7, 0.2]), (3.3, [1, 1, 1e-3])])
def test_the_charge_is_the_exact_sum_rounded_up_and_at_most_the_budget_asked(eps: float, weights: list[float] | None) -> None:
    s = _session(_public())
    sql = "SELECT a, b, COUNT(*) FROM t GROUP BY ROLLUP (a, b)"
    plan = s.explain(sql, epsilon=eps, options=None if weights is None else {"grouping_weights": weights})
    parts = sum(Fraction(repr(c["cost"]["epsilon"])) for c in plan.parameters["components"])
    assert parts <= Fraction(repr(plan.cost.epsilon)) <= Fraction(repr(eps))
    assert plan.cost.epsilon == float_at_least(parts) and plan.cost.delta == 0.0
    assert plan.mechanism == "groupings(laplace)"


def test_each_query_is_calibrated_as_if_sent_alone_with_its_share() -> None:
    s = _session(_public())
    sql = "SELECT a, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY GROUPING SETS ((a), ()) UNION ALL SELECT 'v>2', COUNT(*), 0 FROM t WHERE v > 2"
    plan = s.explain(sql, epsilon=1.2, delta=3e-6, options={"grouping_weights": [1, 1, 2]})
    comps = plan.parameters["components"]
    assert [(c["cost"]["epsilon"], c["share"]) for c in comps] == [(0.3, 0.25), (0.3, 0.25), (0.6, 0.5)]
    for c, eps, delta in zip(comps, (0.3, 0.3, 0.6), (7.5e-7, 7.5e-7, 1.5e-6), strict=True):
        alone = s.explain(c["sql"], epsilon=eps, delta=delta)
        assert c["parameters"] == {k: v for k, v in alone.parameters.items() if k != "scales"}
        assert c["mechanism"] == alone.mechanism
        assert c["parameters"]["sigma"] > 0


@pytest.mark.parametrize("sql, expected", [
    ("SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a) ORDER BY a LIMIT 100000000000000000000000", 4),
    ("SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a) LIMIT 9223372036854775808", 4),
    ("SELECT COUNT(*) AS n FROM t UNION ALL SELECT COUNT(*) FROM t FETCH FIRST 99999999999999999999 ROWS ONLY", 2),
])
def test_a_count_beyond_64_bits_keeps_or_skips_every_row(sql: str, expected: int) -> None:
    """A LIMIT or OFFSET above the engine's BIGINT row counts is read as the largest one, as for one query: it failed
    after the charge (the post-processing's LIMIT did not bind), an answer lost for a clause known in advance."""
    s = _session(_public())
    r = s.query(sql, epsilon=2, delta=1e-5)
    assert r.table.num_rows == expected
    assert [h["status"] for h in s.history().to_pylist()] == ["released"]


@pytest.mark.parametrize("sql", [
    "SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a) OFFSET 100000000000000000000000",
    "SELECT a, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'q', COUNT(*) FROM t LIMIT 1 OFFSET 18446744073709551616",
])
def test_an_offset_beyond_64_bits_skips_every_row_and_is_refused_for_free(sql: str) -> None:
    """Read as the largest row count, such an OFFSET skips every row the request can release (their number is known
    before the charge here): refused for free, as LIMIT 0 is (it was charged and released no row)."""
    s = _session(_public())
    with pytest.raises(UnsupportedQueryError, match="charged for nothing"):
        s.query(sql, epsilon=2, delta=1e-5)
    assert s.history().num_rows == 0


@pytest.mark.parametrize("sql", [
    "SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a) ORDER BY a LIMIT ALL",
    "SELECT a, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'q', COUNT(*) FROM t ORDER BY a, n LIMIT ALL OFFSET 1",
])
def test_limit_all_is_no_limit(sql: str) -> None:
    """LIMIT ALL (answered for one query) was refused as 'LIMIT ... must be a whole number'."""
    t = _public()
    assert _rows(_session(t).query(sql, epsilon=3, delta=1e-5)) == _duck(t, sql)


def _lookup_session(orders: pa.Table, regions: pa.Table) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("regions", regions, public=True, columns={"region": {"domain": ["n", "s", "e"]}})
    s.register("orders", orders, privacy_unit="uid", references={"ck": "regions.ck"}, columns={"st": {"domain": A}})
    use_noise(s, zero_noise())
    return s


@pytest.mark.parametrize("sql", [
    "SELECT region, COUNT(*) AS n FROM orders o JOIN regions r ON o.ck = r.ck GROUP BY ROLLUP (r.region)",
    "SELECT r.region, COUNT(*) AS n FROM orders o JOIN regions r ON o.ck = r.ck GROUP BY ROLLUP (region)",
    "SELECT region, GROUPING(r.region) AS g, COUNT(*) AS n FROM orders o JOIN regions r ON o.ck = r.ck "
    "GROUP BY ROLLUP (region) ORDER BY r.region",
    "SELECT st, r.region, COUNT(*) AS n FROM orders o JOIN regions r ON o.ck = r.ck GROUP BY CUBE (o.st, region)",
])
def test_a_join_column_named_with_or_without_its_table(sql: str) -> None:
    """Over a join, a grouping column named with its table in one place and without it in another (``region`` and
    ``r.region``: one column, as DuckDB reads it) is that column; it was refused as an output that is no grouping
    column (over joins: 'every output must be an aggregate') or a GROUPING() of a column the query does not group by."""
    n = 600
    orders = pa.table({"uid": list(range(n)), "ck": [i % 7 for i in range(n)], "st": [A[(i // 7) % 3] for i in range(n)]})
    regions = pa.table({"ck": list(range(6)), "region": [["n", "s", "e"][i % 3] for i in range(6)]})
    con = duckdb.connect()
    con.register("orders", orders)
    con.register("regions", regions)
    expected = con.execute(sql).fetchall()
    got = _rows(_lookup_session(orders, regions).query(sql, epsilon=3, delta=1e-5))
    assert sorted(got, key=_key) == sorted(expected, key=_key)


@pytest.mark.parametrize("sql", [
    "SELECT f, COUNT(*) AS n FROM t GROUP BY f UNION ALL SELECT COUNT(*), COUNT(*) FROM t",
    "SELECT SUM(v) AS s, COUNT(*) AS n FROM t UNION ALL SELECT f, COUNT(*) FROM t GROUP BY f",
    "SELECT f, COUNT(*) AS n FROM t GROUP BY f UNION ALL SELECT CAST(b AS TINYINT), COUNT(*) FROM t GROUP BY b",
])
def test_a_boolean_combines_with_numbers(sql: str) -> None:
    """A BOOLEAN output combined with numbers is 1 or 0 in their type, as DuckDB's UNION ALL gives it (every BOOLEAN
    converts); it was refused as a type that does not always convert."""
    t = _public()
    t = t.append_column("f", pa.array([i % 2 == 0 for i in range(t.num_rows)]))
    s = _session(t, a={"domain": A}, b={"domain": B}, v={"bounds": [0, 4]}, f={"domain": [False, True]})
    assert sorted(_rows(s.query(sql, epsilon=3, delta=1e-5)), key=_key) == sorted(_duck(t, sql), key=_key)


def test_a_boolean_and_a_decimal_without_integer_digits_stay_refused() -> None:
    t = _public().append_column("f", pa.array([True] * 600))
    s = _session(t, a={"domain": A}, b={"domain": B}, v={"bounds": [0, 4]}, f={"domain": [False, True]})
    with pytest.raises(UnsupportedQueryError, match="do not combine into one column type"):
        s.query("SELECT f, COUNT(*) FROM t GROUP BY f UNION ALL SELECT CAST(0.5 AS DECIMAL(2, 2)), COUNT(*) FROM t",
                epsilon=1, delta=1e-5)
    assert s.history().num_rows == 0


@pytest.mark.parametrize("sql", [
    "SELECT a, b, COUNT(*) AS n FROM t GROUP BY ROLLUP (a, b) ORDER BY ALL",
    "SELECT a, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'q', COUNT(*) FROM t ORDER BY ALL DESC LIMIT 3",
])
def test_order_by_all(sql: str) -> None:
    """DuckDB's ORDER BY ALL (every output, left to right; answered for one query) was refused as naming no output."""
    t = _public()
    assert _rows(_session(t).query(sql, epsilon=3, delta=1e-5)) == _duck(t, sql)
