"""Window functions over aggregates: post-processing of the released rows (dpsql.plan.windows).

At zero noise (and with one row per person, so that the bounding keeps every row) a window over the
query's keys and aggregates answers as DuckDB does over the same rows; on the sparse-histogram route
it sees the released groups only. Windows over raw rows, off the allow-list, or whose evaluation could
fail on a released value are refused before the charge."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlglot

import dpsql
from dpsql import errors
from dpsql.budget import Budget
from dpsql.plan.analyze import analyze
from dpsql.postprocess import post_ast
from dpsql.testing import use_noise, zero_noise

# groups a, b, c of 100 people, d of 75, and z of 3 (below the sparse histogram's threshold)
_DATA = ("SELECT k AS uid, CASE WHEN k >= 375 THEN 'z' ELSE ['a', 'b', 'c', 'd'][k % 4 + 1] END AS s, "
         "(k % 7)::DOUBLE AS x, DATE '2024-01-01' + (k % 5)::INTEGER AS day FROM range(0, 378) r(k) "
         "WHERE k % 4 <> 3 OR k < 300 OR k >= 375")


@pytest.fixture(scope="module")
def con() -> Any:
    """One connection holding the table for the whole file: every test only reads ``t`` (each through a session of
    its own, whose views are its own); a connection and the table made per test cost more than most tests' query."""
    c = duckdb.connect()
    c.execute(f"CREATE TABLE t AS {_DATA}")
    yield c
    c.close()


def session(con: Any, *, public: bool) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1000.0, 0.1), connection=con)
    use_noise(s, zero_noise())
    cols: dict[str, Any] = {"x": {"bounds": (0, 10)}}
    if public:
        cols["s"] = {"domain": ["a", "b", "c", "d", "z"]}
        cols["day"] = {"domain": [f"2024-01-0{i}" for i in range(1, 6)]}
    s.register("t", "t", privacy_unit="uid", columns=cols)
    return s


ANSWERED = [
    "SELECT s, COUNT(*) AS n, COUNT(*) * 1.0 / SUM(COUNT(*)) OVER () AS share FROM t GROUP BY s",
    "SELECT s, COUNT(*) AS n, RANK() OVER (ORDER BY COUNT(*) DESC) AS r FROM t GROUP BY s",
    "SELECT day, SUM(x) AS sx, SUM(SUM(x)) OVER (ORDER BY day) AS running FROM t GROUP BY day",
    "SELECT s, COUNT(*) AS n FROM t GROUP BY s QUALIFY RANK() OVER (ORDER BY COUNT(*) DESC) <= 3",
    "SELECT s, DENSE_RANK() OVER (ORDER BY COUNT(*)) AS d, PERCENT_RANK() OVER (ORDER BY COUNT(*)) AS p, "
    "CUME_DIST() OVER (ORDER BY COUNT(*)) AS c FROM t GROUP BY s",
    # a frame given to a ranking function changes nothing: peers keep one rank
    "SELECT s, RANK() OVER (ORDER BY COUNT(*) ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS r, "
    "CUME_DIST() OVER (ORDER BY COUNT(*) ROWS 1 PRECEDING) AS c FROM t GROUP BY s",
    "SELECT s, ROW_NUMBER() OVER (ORDER BY SUM(x) DESC) AS rn, NTILE(2) OVER (ORDER BY SUM(x)) AS half FROM t GROUP BY s",
    "SELECT day, LAG(SUM(x), 1, -1) OVER (ORDER BY day) AS prev, LEAD(SUM(x)) OVER (ORDER BY day) AS next, "
    "SUM(x) - LAG(SUM(x)) OVER (ORDER BY day) AS delta FROM t GROUP BY day",
    "SELECT day, FIRST_VALUE(COUNT(*)) OVER (ORDER BY day) AS f, LAST_VALUE(COUNT(*)) OVER (ORDER BY day ROWS BETWEEN "
    "UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS l FROM t GROUP BY day",
    "SELECT day, AVG(SUM(x)) OVER (ORDER BY day ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS smooth, "
    "MIN(SUM(x)) OVER () AS lo, MAX(SUM(x)) OVER () AS hi, COUNT(*) OVER () AS groups FROM t GROUP BY day",
    "SELECT s, COUNT(*) AS n, SUM(COUNT(*)) OVER (PARTITION BY s IN ('a', 'b')) AS per_part, "
    "RANK() OVER (PARTITION BY s IN ('a', 'b') ORDER BY s DESC) AS r FROM t GROUP BY s",
    "SELECT s, SUM(x) AS m FROM t GROUP BY s ORDER BY RANK() OVER (ORDER BY SUM(x) DESC), s LIMIT 3",
    "SELECT COUNT(*) AS n, ROW_NUMBER() OVER () AS rn FROM t",
    # an aggregate's own FILTER inside a window (the window itself has none)
    "SELECT s, COUNT(*) FILTER (WHERE x > 3) AS f, SUM(COUNT(*) FILTER (WHERE x > 3)) OVER () AS tot, "
    "RANK() OVER (ORDER BY AVG(x) FILTER (WHERE x < 5) DESC, s) AS r FROM t GROUP BY s",
    # a typed literal as LAG's default
    "SELECT day, COUNT(*) AS n, LAG(day, 1, DATE '2023-12-31') OVER (ORDER BY day) AS prev, "
    "LEAD(COUNT(*), 1, CAST(-1 AS BIGINT)) OVER (ORDER BY day) AS next FROM t GROUP BY day",
]


def _rows(table: Any) -> list[tuple[Any, ...]]:
    return [tuple(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in r.values())
            for r in table.to_pylist()]


def _truth(con: Any, sql: str, where: str | None = None) -> list[tuple[Any, ...]]:
    rel = "t" if where is None else f"(SELECT * FROM t WHERE {where}) AS t"
    got = con.execute(sql.replace("FROM t ", f"FROM {rel} ")).fetchall()
    return [tuple(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in r) for r in got]


def _ordered(sql: str) -> bool:
    return sqlglot.parse_one(sql, read="duckdb").args.get("order") is not None


def _same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]], ordered: bool) -> bool:
    if not ordered:
        a, b = sorted(a, key=repr), sorted(b, key=repr)
    return len(a) == len(b) and all(x == pytest.approx(y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("sql", ANSWERED)
def test_windows_over_public_keys_answer_as_sql(con: Any, sql: str) -> None:
    s = session(con, public=True)
    got = _rows(s.query(sql, epsilon=1.0, delta=1e-6).table)
    assert _same(got, _truth(con, sql), _ordered(sql)), (got, _truth(con, sql))


@pytest.mark.parametrize("sql", [q for q in ANSWERED if "GROUP BY s" in q and "day" not in q])
def test_windows_on_the_sparse_histogram_see_the_released_groups_only(con: Any, sql: str) -> None:
    s = session(con, public=False)
    got = _rows(s.query(sql, epsilon=1.0, delta=1e-6).table)
    assert not any("z" in r for r in got)  # 3 people: below the threshold
    assert _same(got, _truth(con, sql, "s <> 'z'"), _ordered(sql))


def test_a_share_on_the_sparse_histogram_is_of_the_released_total(con: Any) -> None:
    s = session(con, public=False)
    sql = "SELECT s, COUNT(*) * 1.0 / SUM(COUNT(*)) OVER () AS share FROM t GROUP BY s"
    got = _rows(s.query(sql, epsilon=1.0, delta=1e-6).table)
    assert sum(r[1] for r in got) == pytest.approx(1.0) and len(got) == 4
    assert _same(got, _truth(con, sql, "s <> 'z'"), False)
    assert not _same(got, [r for r in _truth(con, sql) if r[0] != "z"], False)  # not the share of every row


def test_an_aggregate_only_inside_a_window_is_released_and_charged_as_an_output(con: Any) -> None:
    s = session(con, public=False)
    plan = analyze("SELECT s, RANK() OVER (ORDER BY SUM(x) DESC) AS r FROM t GROUP BY s", s._catalog)
    assert [a.kind for a in plan.aggregates] == ["sum"]
    alone = s.explain("SELECT s, SUM(x) FROM t GROUP BY s", epsilon=1.0, delta=1e-6)
    ranked = s.explain("SELECT s, RANK() OVER (ORDER BY SUM(x) DESC) AS r FROM t GROUP BY s", epsilon=1.0, delta=1e-6)
    assert ranked.cost == alone.cost and ranked.bounded_sql == alone.bounded_sql
    assert {**ranked.parameters, "expected_accuracy": None} == {**alone.parameters, "expected_accuracy": None}
    # explain shows what runs over the released rows
    assert any("window functions are evaluated over the released rows only" in n and "RANK() OVER (ORDER BY __a0 DESC"
               in n for n in ranked.notes), ranked.notes
    assert not any("window" in n for n in alone.notes)


def test_ties_are_broken_by_the_keys_whatever_the_order_of_the_released_rows(con: Any) -> None:
    s = session(con, public=True)
    plan = analyze("SELECT s, ROW_NUMBER() OVER (ORDER BY COUNT(*) DESC) AS rn, FIRST_VALUE(s) OVER () AS f, "
                   "SUM(COUNT(*)) OVER (ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS pair FROM t GROUP BY s", s._catalog)
    released = pa.table({"__k0": ["a", "b", "c", "d"], "__a0": [5, 5, 5, 5]})
    outs = set()
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1], [1, 3, 0, 2]):
        c = duckdb.connect()
        c.register("__released", released.take(order))
        outs.add(tuple(c.execute(post_ast(plan, sqlglot.exp.to_table("__released"), [], total=True)
                                 .sql(dialect="duckdb")).fetchall()))
        c.close()
    assert outs == {(("a", 1, "a", 10), ("b", 2, "a", 10), ("c", 3, "a", 10), ("d", 4, "a", 5))}, outs


REFUSED = [
    ("SELECT COUNT(*) OVER () FROM t", "without GROUP BY or an aggregate would run over raw rows"),
    ("SELECT SUM(x) OVER () FROM t", "per-row values"),
    ("SELECT uid, ROW_NUMBER() OVER (PARTITION BY uid ORDER BY day) AS rn FROM t", "per-row values"),
    ("SELECT s, COUNT(*), ROW_NUMBER() OVER (PARTITION BY uid) FROM t GROUP BY s", "column 'uid' is neither a GROUP BY key"),
    ("SELECT s, SUM(x) OVER (ORDER BY s) FROM t GROUP BY s", "SUM(SUM(x)) OVER"),
    ("SELECT COUNT(*) FROM t WHERE ROW_NUMBER() OVER () < 3", "a window function in WHERE would run over raw rows"),
    ("SELECT DISTINCT s, ROW_NUMBER() OVER (ORDER BY s) AS rn FROM t", "or a SELECT DISTINCT, whose outputs are its keys"),
    ("SELECT s, COUNT(*) FROM t GROUP BY s HAVING RANK() OVER (ORDER BY COUNT(*)) < 3", "filter on a window with QUALIFY"),
    ("SELECT s, COUNT(*), RANK() OVER (ORDER BY COUNT(*)) AS r FROM t GROUP BY s HAVING r < 3", "with QUALIFY"),
    ("SELECT s, SUM(RANK() OVER (ORDER BY s)) FROM t GROUP BY s", "a window function in SUM would run over raw rows"),
    ("SELECT s, MEDIAN(COUNT(*)) OVER () FROM t GROUP BY s", "window function MEDIAN is not supported"),
    ("SELECT s, STRING_AGG(s, ',') OVER () FROM t GROUP BY s", "is not supported over the released rows"),
    ("SELECT s, RANK(COUNT(*)) OVER () FROM t GROUP BY s", "RANK() takes no argument"),
    ("SELECT s, NTILE(0) OVER () FROM t GROUP BY s", "NTILE takes a positive integer literal"),
    ("SELECT s, NTILE(COUNT(*)) OVER () FROM t GROUP BY s", "NTILE takes a positive integer literal"),
    ("SELECT s, LAG(COUNT(*), -1) OVER (ORDER BY s) FROM t GROUP BY s", "offset is a non-negative integer literal"),
    # a default converted to the argument's type outside any TRY: 'a' is no BIGINT (was charged, then failed)
    ("SELECT s, LAG(COUNT(*), 1, s) OVER (ORDER BY s) AS l FROM t GROUP BY s", "LAG's default is a literal"),
    ("SELECT s, LEAD(COUNT(*), 1, COUNT(*) + 1) OVER (ORDER BY s) AS l FROM t GROUP BY s", "COALESCE(LEAD(x) OVER"),
    ("SELECT s, SUM(COUNT(*)) OVER (ORDER BY s ROWS BETWEEN -1 PRECEDING AND CURRENT ROW) FROM t GROUP BY s",
     "offsets are non-negative integer literals"),
    ("SELECT s, SUM(COUNT(*)) OVER (ORDER BY COUNT(*) RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t GROUP BY s",
     "RANGE frame with an offset"),
    ("SELECT s, SUM(COUNT(*)) OVER (ORDER BY s GROUPS 1 PRECEDING) FROM t GROUP BY s", "GROUPS window frame"),
    ("SELECT s, COUNT(DISTINCT COUNT(*)) OVER () FROM t GROUP BY s", "DISTINCT"),
    ("SELECT s, COUNT(*) FILTER (WHERE x > 3) OVER () FROM t GROUP BY s", "COUNT(DISTINCT ...) or FILTER in a window"),
    ("SELECT s, SUM(COUNT(*)) FILTER (WHERE s > 'a') OVER () FROM t GROUP BY s", "SUM(DISTINCT ...) or FILTER in a window"),
    ("SELECT s, SUM(COUNT(*)) OVER w FROM t GROUP BY s", "named window"),
    ("SELECT s, COUNT(*) FROM t GROUP BY s QUALIFY COUNT(*) > 3", "filter the released rows with HAVING"),
    ("SELECT s, COUNT(*) AS n, RANK() OVER (ORDER BY n DESC) AS r, SUM(r) OVER () FROM t GROUP BY s", "cannot be nested"),
    ("SELECT s, COUNT(*), RANK() OVER (ORDER BY COUNT(*)) FROM t GROUP BY ROLLUP (s)", "with GROUP BY ROLLUP are not supported"),
    ("SELECT s, COUNT(*) FROM t GROUP BY CUBE (s) QUALIFY RANK() OVER (ORDER BY COUNT(*)) < 2", "QUALIFY with GROUP BY CUBE"),
]


@pytest.mark.parametrize(("sql", "msg"), REFUSED)
def test_windows_that_read_raw_rows_or_could_fail_are_refused_for_free(con: Any, sql: str, msg: str) -> None:
    s = session(con, public=False)
    before = s.remaining()
    with pytest.raises(errors.UnsupportedQueryError) as ei:
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert msg in str(ei.value), str(ei.value)
    assert s.remaining() == before


def test_a_noisy_zero_divisor_in_a_window_gives_null_or_inf_not_an_error(con: Any) -> None:
    s = session(con, public=True)
    zero = "(SUM(COUNT(*)) OVER () - SUM(COUNT(*)) OVER ())"
    r = s.query(f"SELECT s, COUNT(*) / {zero} AS a, COUNT(*) // {zero} AS b, SUM(COUNT(*) % 0) OVER () AS c "
                "FROM t GROUP BY s", epsilon=1.0, delta=1e-6)
    assert {(row["a"], row["b"], row["c"]) for row in r.table.to_pylist()} == {(float("inf"), None, None)}


def test_a_window_in_each_select_of_a_union_all_sees_that_selects_rows(con: Any) -> None:
    s = session(con, public=False)
    sql = ("SELECT s, COUNT(*) * 1.0 / SUM(COUNT(*)) OVER () AS share FROM t WHERE x < 3 GROUP BY s UNION ALL "
           "SELECT s, COUNT(*) * 1.0 / SUM(COUNT(*)) OVER () FROM t WHERE x >= 3 GROUP BY s ORDER BY 1, 2")
    got = _rows(s.query(sql, epsilon=2.0, delta=1e-6).table)
    assert len(got) == 8 and _same(got, _truth(con, sql, "s <> 'z'"), True), (got, _truth(con, sql, "s <> 'z'"))


def test_windows_over_a_join_are_answered_over_its_released_rows(con: Any) -> None:
    """They were refused as answered 'for a query of one table, not over a join's': a window over released rows is
    post-processing whatever released them (tests/test_analyst_queries.py compares such answers with DuckDB)."""
    con.execute("CREATE TABLE u AS SELECT k AS uid, k % 3 AS g FROM range(0, 378) r(k)")
    s = session(con, public=False)
    try:
        s.register("u", "u", privacy_unit="uid", columns={"g": {"domain": [0, 1, 2]}})
        r = s.query("SELECT u.g, COUNT(*) AS n, RANK() OVER (ORDER BY COUNT(*), u.g) AS r FROM t JOIN u ON t.uid = u.uid "
                    "GROUP BY u.g ORDER BY r", epsilon=1.0, delta=1e-6)
        assert r.table.column("r").to_pylist() == [1, 2, 3]
        n = r.table.column("n").to_pylist()
        assert n == sorted(n)
        q = s.query("SELECT u.g, COUNT(*) FROM t JOIN u ON t.uid = u.uid GROUP BY u.g QUALIFY RANK() OVER (ORDER BY u.g) "
                    "< 2", epsilon=1.0, delta=1e-6)
        assert q.table.column("g").to_pylist() == [0]
    finally:
        s.close()
        con.execute("DROP TABLE u")  # the file's other tests read t alone


def test_windows_read_the_released_rows_in_key_order_not_in_the_engines(con: Any) -> None:
    """A floating-point SUM over a partition depends on the order it adds in, which SQL leaves open: the rows a
    window reads are sorted by key, never in the order the mechanism's engine produced them."""
    from dpsql import postprocess
    from dpsql.mechanisms.base import Released

    s = session(con, public=False)
    seen: list[list[Any]] = []

    class Backend:
        def post_process(self, table: pa.Table, build: Any) -> pa.Table:
            seen.append(table.column("__k0").to_pylist())
            return pa.table({"s": table.column("__k0")})

    released = pa.table({"__k0": ["c", None, "a", "b"], "__a0": [0.1, 0.2, 0.3, 0.4]})
    for sql in ("SELECT s, SUM(x) / SUM(SUM(x)) OVER () AS share FROM t GROUP BY s", "SELECT s, SUM(x) FROM t GROUP BY s"):
        postprocess.apply(Backend(), analyze(sql, s._catalog), Released(table=released, accuracy={}))
    assert seen == [["a", "b", "c", None], ["c", None, "a", "b"]]  # (without a window: as released)


@pytest.mark.parametrize("public", [False, True])
@pytest.mark.parametrize("sql", [
    "SELECT s, SUM(CAST(COUNT(*) AS HUGEINT) * 10000000000000000000000000000000000) OVER () AS big FROM t GROUP BY s",
    "SELECT s, AVG(CAST(SUM(x) AS DECIMAL(38, 0)) * 1000000000000000000000000000000000000) OVER () AS big FROM t GROUP BY s",
])
def test_a_window_sum_that_could_overflow_on_a_released_value_is_refused_for_free(con: Any, sql: str, public: bool) -> None:
    # DuckDB raises on the overflow of a window's sum, and a window cannot be evaluated under TRY: charged, then
    # failed on these released values, had it run
    s = session(con, public=public)
    before = s.remaining()
    with pytest.raises(errors.QueryTypeError, match="whose sum can overflow on large released values"):
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.remaining() == before
    # narrower values add without overflow: answered
    ok = s.query("SELECT s, SUM(COUNT(*) * 1.0) OVER () AS a, AVG(SUM(x)) OVER () AS b FROM t GROUP BY s",
                 epsilon=1.0, delta=1e-6)
    assert ok.table.num_rows == (5 if public else 4)


def test_a_window_avg_of_intervals_that_could_overflow_on_released_keys_is_refused_for_free() -> None:
    # DuckDB adds the intervals' days as 32-bit integers: 24 released keys near year 290000 overflowed after the
    # charge, and which keys are released (sparse histogram) depends on the data
    c = duckdb.connect()
    c.execute("CREATE TABLE t AS SELECT k AS uid, TIMESTAMP '290000-01-01' + INTERVAL (k % 24) DAY AS ts "
              "FROM range(0, 2400) r(k)")
    s = dpsql.Session(budget=Budget(1000.0, 0.1), connection=c)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid")
    before = s.remaining()
    with pytest.raises(errors.QueryTypeError, match="whose sum can overflow on large released values") as ei:
        s.query("SELECT ts, COUNT(*) AS n, AVG(ts - TIMESTAMP '0001-01-01') OVER () AS a FROM t GROUP BY ts",
                epsilon=1.0, delta=1e-6)
    # named by where it is, not by the internal released columns
    assert "the window AVG in output 'a' adds INTERVAL values" in str(ei.value) and "__" not in str(ei.value)
    assert s.remaining() == before
    ok = s.query("SELECT ts, AVG(date_part('epoch', ts - TIMESTAMP '0001-01-01')) OVER () AS a FROM t GROUP BY ts",
                 epsilon=1.0, delta=1e-6)
    assert ok.table.num_rows == 24


@pytest.mark.parametrize("frame", ["ROWS BETWEEN CURRENT ROW AND 2 PRECEDING", "ROWS BETWEEN 2 FOLLOWING AND 1 PRECEDING",
                                   "ROWS BETWEEN UNBOUNDED FOLLOWING AND CURRENT ROW", "ROWS 2 FOLLOWING",
                                   "RANGE BETWEEN CURRENT ROW AND UNBOUNDED PRECEDING"])
def test_a_frame_that_ends_before_it_starts_is_refused_naming_the_fix(con: Any, frame: str) -> None:
    s = session(con, public=False)
    before = s.remaining()
    with pytest.raises(errors.UnsupportedQueryError, match="a window frame ends before it starts"):
        s.query(f"SELECT s, SUM(COUNT(*)) OVER (ORDER BY s {frame}) AS a FROM t GROUP BY s", epsilon=1.0, delta=1e-6)
    assert s.remaining() == before
    # the bounds the other way round: answered
    s.query("SELECT s, SUM(COUNT(*)) OVER (ORDER BY s ROWS BETWEEN 1 PRECEDING AND 3 PRECEDING) AS a FROM t GROUP BY s",
            epsilon=1.0, delta=1e-6)


@pytest.mark.parametrize(("sql", "msg"), [
    ("SELECT s, NTILE(99999999999999999999) OVER (ORDER BY s) AS a FROM t GROUP BY s", "NTILE takes a positive integer"),
    ("SELECT s, LAG(COUNT(*), 99999999999999999999) OVER (ORDER BY s) AS a FROM t GROUP BY s", "LAG's offset is a"),
    ("SELECT s, SUM(COUNT(*)) OVER (ORDER BY s ROWS BETWEEN 99999999999999999999 PRECEDING AND CURRENT ROW) AS a "
     "FROM t GROUP BY s", "a ROWS frame's offsets are"),
])
def test_a_window_count_beyond_bigint_is_refused_naming_the_window(con: Any, sql: str, msg: str) -> None:
    # was refused as a type error of the table's columns or a failure on a released value of 0
    s = session(con, public=False)
    with pytest.raises(errors.UnsupportedQueryError, match=msg):
        s.query(sql, epsilon=1.0, delta=1e-6)
    s.query(sql.replace("99999999999999999999", "9223372036854775807"), epsilon=1.0, delta=1e-6)


@pytest.mark.parametrize(("window", "expected"), [
    # a RANGE frame (the default with ORDER BY) ends at the current row's last peer: every peer sees one value
    ("LAST_VALUE(COUNT(*)) OVER (ORDER BY COUNT(*) > 0)", 4),
    ("LAST_VALUE(COUNT(*)) OVER (ORDER BY COUNT(*) > 0 RANGE BETWEEN CURRENT ROW AND CURRENT ROW)", 4),
    ("FIRST_VALUE(COUNT(*)) OVER (ORDER BY COUNT(*) > 0 RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)", 1),
    ("LAST_VALUE(COUNT(*) IGNORE NULLS) OVER (ORDER BY COUNT(*) > 0)", 4),
    # without ORDER BY every row is a peer: a RANGE frame is the whole partition
    ("LAST_VALUE(COUNT(*)) OVER (RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)", 4),
    ("FIRST_VALUE(COUNT(*)) OVER (RANGE BETWEEN CURRENT ROW AND CURRENT ROW)", 1),
])
def test_first_and_last_value_over_a_range_frame_keep_the_peers(con: Any, window: str, expected: int) -> None:
    """Ties broken by the keys in the window's ORDER BY split the peers of a RANGE frame: LAST_VALUE gave each row
    its own value, which no SQL engine gives (peers share a frame). The keys order the peers inside the function."""
    s = session(con, public=True)
    plan = analyze(f"SELECT s, {window} AS v FROM t GROUP BY s", s._catalog)
    released = pa.table({"__k0": ["a", "b", "c", "d"], "__a0": [1, 2, 3, 4]})
    outs = set()
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        c = duckdb.connect()
        c.register("__released", released.take(order))
        outs.add(tuple(c.execute(post_ast(plan, sqlglot.exp.to_table("__released"), [], total=True)
                                 .sql(dialect="duckdb")).fetchall()))
        c.close()
    assert outs == {tuple((k, expected) for k in "abcd")}, outs
    s.query(f"SELECT s, {window} AS v FROM t GROUP BY s", epsilon=1.0, delta=1e-6)  # runs end to end


@pytest.mark.parametrize("public", [False, True])
@pytest.mark.parametrize(("window", "default", "typ"), [
    ("LAG(AVG(x), 1, 'x')", "'x'", "DOUBLE"),
    ("LEAD(COUNT(*), 2, 1e300)", "1e300", "BIGINT"),
    ("LAG(SUM(x), 1, DATE '2024-01-01')", "CAST('2024-01-01' AS DATE)", "DOUBLE"),
    ("LAG(day, 1, 'yesterday')", "'yesterday'", "DATE"),
    ("LAG(COUNT(*) // 0, 1, 'x')", "'x'", "BIGINT"),  # (its input guarded as evaluated: // 0 is NULL)
])
def test_a_lag_default_of_another_type_is_refused_naming_the_default(con: Any, public: bool, window: str, default: str,
                                                                    typ: str) -> None:
    """LAG / LEAD convert the default to the argument's type: one that does not convert was refused for free, but as
    a generic failure 'on a released value of 0' (or 'on the declared key values'), naming neither the default nor
    the fix."""
    s = session(con, public=public)
    before = s.remaining()
    sql = f"SELECT day, COUNT(*) AS n, {window} OVER (ORDER BY day) AS l FROM t GROUP BY day"
    with pytest.raises(errors.QueryTypeError) as ei:
        s.query(sql, epsilon=1.0, delta=1e-6)
    msg = str(ei.value)
    name = window.split("(")[0]
    assert f"the default {default} of the window {name} in output 'l' does not convert to {typ}" in msg, msg
    assert "COALESCE" in msg and "__" not in msg and s.remaining() == before
    # negative control: without the default (or with one of the argument's type), answered
    s.query(sql.replace(window, window.rsplit(",", 1)[0] + ")"), epsilon=1.0, delta=1e-6)


def _dated(con: Any) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1000.0, 0.1), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid", columns={
        "x": {"bounds": (0, 10)}, "s": {"domain": ["a", "b", "c", "d", "z"]},
        "day": {"bounds": ("2024-01-01", "2024-02-01"), "bin_width": "1 day"}})
    return s


@pytest.mark.parametrize("agg", ["MEDIAN(day)", "MIN(day)", "QUANTILE_CONT(day, 0.25)"])
@pytest.mark.parametrize("fn", ["SUM"])  # (AVG of dates is answered: DuckDB averages dates)
def test_a_window_sum_of_dates_is_refused_naming_the_fix(con: Any, agg: str, fn: str) -> None:
    """SUM adds numbers: over a released DATE / TIMESTAMP quantile it does not bind, refused for free, but as a
    generic type-check failure 'against the table's columns'."""
    s = _dated(con)
    before = s.remaining()
    with pytest.raises(errors.QueryTypeError) as ei:
        s.query(f"SELECT s, {fn}({agg}) OVER () AS m FROM t GROUP BY s", epsilon=1.0, delta=1e-6)
    msg = str(ei.value)
    assert f"the window {fn} in output 'm' adds DATE values ({agg}): {fn} adds numbers only" in msg, msg
    assert f"{fn}({agg} - DATE '2000-01-01') OVER (...)" in msg and "__" not in msg and s.remaining() == before
    # negative control: the hint's form is answered
    s.query(f"SELECT s, {fn}({agg} - DATE '2000-01-01') OVER () AS m FROM t GROUP BY s", epsilon=1.0, delta=1e-6)


@pytest.mark.parametrize("sql", [
    "SELECT s, RANK() OVER (ORDER BY n DESC) AS r, COUNT(*) AS n FROM t GROUP BY s",
    "SELECT s, SUM(n) OVER () AS total, COUNT(*) AS n FROM t GROUP BY s",
    "SELECT s, n * 2 AS twice, COUNT(*) AS n FROM t GROUP BY s",
])
def test_an_alias_named_before_its_output_is_refused_naming_the_fix(con: Any, sql: str) -> None:
    """An output (a window too) names only the aliases of outputs before it, as in DuckDB: one named before its output
    was refused as an unknown column, without saying that it is a later output's alias nor how to fix it."""
    s = session(con, public=False)
    before = s.remaining()
    with pytest.raises(errors.UnsupportedQueryError) as ei:
        s.query(sql, epsilon=1.0, delta=1e-6)
    msg = str(ei.value)
    assert "'n' is the alias of a later output (COUNT(*) AS n)" in msg and "move it before" in msg, msg
    assert s.remaining() == before
    # negative control: the alias's output first, answered
    fixed = sql.replace("s, ", "s, COUNT(*) AS n, ", 1).replace(", COUNT(*) AS n FROM", " FROM")
    s.query(fixed, epsilon=1.0, delta=1e-6)


def test_an_outputs_own_alias_is_refused_naming_the_fix(con: Any) -> None:
    """The same refusal (shared with the join path) for an output naming its own alias."""
    s = session(con, public=False)
    before = s.remaining()
    with pytest.raises(errors.UnsupportedQueryError) as ei:
        s.query("SELECT s, COUNT(*) + n AS n FROM t GROUP BY s", epsilon=1.0, delta=1e-6)
    msg = str(ei.value)
    assert "'n' is this output's own alias (COUNT(*) + n AS n)" in msg and "write the expression" in msg, msg
    assert s.remaining() == before


@pytest.mark.parametrize("window", ["SUM(k * 4)", "AVG(k + k)", "SUM(CAST(k AS INTEGER))"])
def test_a_window_sum_of_numbers_failing_on_a_key_value_is_not_named_a_sum_of_its_type(window: str) -> None:
    """SUM / AVG add numbers: a window over numbers that fails on a declared key value (k * 4 overflows a BIGINT at
    2^62) was refused as 'adds BIGINT values: SUM adds numbers only', hinting SUM(length(k * 4)); it is refused as
    failing on the declared key values, for free."""
    big = 2**62
    s = dpsql.Session(budget=Budget(1000.0, 0.1))
    use_noise(s, zero_noise())
    s.register("p", pa.table({"uid": list(range(20)), "k": pa.array([1, big] * 10, pa.int64())}), privacy_unit="uid",
               columns={"k": {"domain": [1, big]}})
    before = s.remaining()
    with pytest.raises(errors.QueryTypeError) as ei:
        s.query(f"SELECT k, COUNT(*) AS n, {window} OVER () AS w FROM p GROUP BY k", epsilon=1.0, delta=1e-6)
    msg = str(ei.value)
    assert "cannot be evaluated on the declared key values" in msg and "adds numbers only" not in msg, msg
    assert s.remaining() == before
    # negative control: a window SUM of dates is still named so
    with pytest.raises(errors.QueryTypeError, match="adds DATE values"):
        s.query("SELECT k, COUNT(*) AS n, SUM(DATE '2024-01-01' + CAST(k % 2 AS INTEGER)) OVER () AS w FROM p GROUP BY k",
                epsilon=1.0, delta=1e-6)
