"""Adversarial probes of analyst-written expressions over private rows, on neighbouring datasets.

D holds one person (``uid = 7``) whose row carries a value chosen to break an expression; D' is D
without that person. For every query the analyst observes whether it fails, the exception class and
text, whether it was charged, the ledger entry's status and reason, and the released schema: they
must be identical on D and D'. The other adversarial files cover collations, the SQL surface,
source conversions and semantics; this one covers what DuckDB decides from an expression's
*literal arguments* rather than from its argument types (a result type chosen by a format string),
the size limits of every typed expression (joins included), and how column names reach the typer.

Findings kept here (each finding's tests failed before its fix; the controls pass either way):

1. ``strptime(text, fmt)`` was typed TIMESTAMP whatever ``fmt``; DuckDB gives a TIMESTAMP_NS
   when the format holds ``%n`` and a TIMESTAMP WITH TIME ZONE with ``%z``/``%Z``. A TIMESTAMP
   literal compared with it (``> '1500-01-01'``, and date_trunc's range guard) was then cast to
   TIMESTAMP_NS at run time, which fails for an instant outside 1677..2262 only when a row
   reaches the comparison: ``WHERE uid = 7 AND strptime(s, '%Y-%m-%d %n') > '1500-01-01'``
   failed after its charge exactly when user 7 exists. Now ``%n`` is read as TIMESTAMP and a
   time-zone specifier is refused (free).
2. The SUM of a join typed its value without the depth and rendered-size limits: six nested
   date_truncs (each guard repeats its operand three times) were accepted, charged and took 14 s
   (seven: 56 s); a guard's second test runs only for the rows failing the first, so one
   person's NULL or -infinity adds a copy of the operand per level. The typer also built the
   whole rendering before checking its size and typed each date function's argument twice
   (2^n calls, 3^n nodes; LIKE tests inside counted twice). Now every typed expression gets the
   limits, checked at every node as the rendering is built.
3. An Arrow or Parquet source with columns ``A`` (text) and ``a`` (integer) registered with the
   schema ``{a: VARCHAR, a_1: BLOB}``: DuckDB resolves names case-insensitively, so the typer
   typed the columns by the wrong source column and ``a_1`` exposed a text column's raw bytes,
   past the decoding and the ``max_text_bytes`` cap. Refused at registration now.
4. IN lists: the documented limit is 10,000 elements, but each typed literal counted against the
   5,000-node rendering limit, so ``i IN (<1,700 integers>)`` was refused as "too large once made
   total" (a message about guards). The constant elements of an IN list no longer count.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb
import pytest
from sqlglot import parse_one

import dpsql
from dpsql import errors
from dpsql.plan.typer import type_key
from dpsql.testing import use_noise, zero_noise

TARGET = 7


def _last(s: dpsql.Session) -> tuple[Any, ...] | None:
    h = s.history()
    if h.num_rows == 0:
        return None
    row = h.slice(h.num_rows - 1).to_pylist()[0]
    return row["entry_id"], row["status"], row["failure_reason"]


def observe(s: dpsql.Session, sql: str, delta: float) -> dict[str, Any]:
    """Everything the analyst sees of one query except the released values."""
    before = _last(s)
    try:
        r = s.query(sql, epsilon=1.0, delta=delta)
        out: dict[str, Any] = {"outcome": "ok", "schema": [(f.name, str(f.type)) for f in r.table.schema]}
    except errors.DPSQLError as e:
        out = {"outcome": type(e).__name__, "message": str(e)}
    after = _last(s)
    out["charged"] = after != before
    out["entry"] = after[1:] if out["charged"] and after is not None else None
    return out


def _pair(columns: str, target_rows: list[str], benign: str, **register: Any) -> list[dpsql.Session]:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE d_full ({columns})")
    for r in target_rows:
        con.execute(f"INSERT INTO d_full VALUES {r}")
    con.execute(f"INSERT INTO d_full {benign}")
    con.execute(f"CREATE TABLE d_minus AS SELECT * FROM d_full WHERE uid <> {TARGET}")
    out = []
    for name in ("d_full", "d_minus"):
        s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9), connection=con)
        use_noise(s, zero_noise())
        kw: dict[str, Any] = {"privacy_unit": "uid", "max_groups_per_unit": 2, "max_rows_per_unit": 4}
        kw.update(register)
        s.register("t", name, **kw)
        out.append(s)
    return out


def assert_same(sessions: list[dpsql.Session], sql: str, delta: float = 0.0) -> dict[str, Any]:
    a, b = (observe(s, sql, delta) for s in sessions)
    assert a == b, f"observable outcome depends on user {TARGET}: {sql}\n  D:  {a}\n  D': {b}"
    if a["outcome"] != "ok":
        assert not a["charged"], f"failed after the charge: {sql}: {a}"
    return a


# -- 1. strptime's result type depends on its format --------------------------------------------------

STRPTIME_COLUMNS = "uid BIGINT, s VARCHAR, i INTEGER"
STRPTIME_TARGET = [f"({TARGET}, '2024-01-01 123456789', 1)"]
STRPTIME_BENIGN = "SELECT 1000 + k AS uid, 'not a date' AS s, k % 50 AS i FROM range(0, 300) r(k)"


@pytest.fixture(scope="module")
def strptime_sessions() -> Any:
    ss = _pair(STRPTIME_COLUMNS, STRPTIME_TARGET, STRPTIME_BENIGN)
    yield ss
    for s in ss:
        s.close()


STRPTIME_NS = [
    f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND strptime(s, '%Y-%m-%d %n') > '1500-01-01'",
    f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND strptime(s, '%Y-%m-%d %n') BETWEEN DATE '1000-01-01' AND '3000-01-01'",
    f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND strptime(s, '%Y-%m-%d %n') IN ('1500-01-01', '2000-01-01')",
    f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND date_trunc('year', strptime(s, '%Y-%m-%d %n')) > '2000-01-01'",
    f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND try_strptime(s, '%Y-%m-%d %n') > TIMESTAMP '1000-01-01'",
]


@pytest.mark.parametrize("sql", STRPTIME_NS)
def test_strptime_with_nanoseconds_does_not_fail_on_one_persons_row(strptime_sessions: Any, sql: str) -> None:
    got = assert_same(strptime_sessions, sql)
    assert got["outcome"] == "ok", got


def test_strptime_with_nanoseconds_reads_as_timestamp() -> None:
    """The parse is kept: the person's text parses, its nanoseconds rounded to microseconds."""
    rendered, typ = type_key(parse_one("strptime(s, '%Y-%m-%d %n')", dialect="duckdb"), {"s": "VARCHAR"})
    assert typ.name == "TIMESTAMP"
    con = duckdb.connect()
    got = con.execute(f"SELECT {rendered.sql(dialect='duckdb')} AS k, typeof(k) FROM (SELECT '2024-01-01 123456789' AS s)")
    assert got.fetchall() == [(dt.datetime(2024, 1, 1, 0, 0, 0, 123457), "TIMESTAMP")]


@pytest.mark.parametrize("fmt", ["%Y %z", "%Y-%m-%d %H:%M:%S %Z", "%Y %n %z"])
def test_strptime_with_a_time_zone_is_refused_for_free(strptime_sessions: Any, fmt: str) -> None:
    sql = f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND date_trunc('year', strptime(s, '{fmt}')) > '2000-01-01'"
    got = assert_same(strptime_sessions, sql)
    assert got["outcome"] == "UnsupportedQueryError" and "time-zone specifier" in got["message"], got


def test_strptime_percent_escape_is_not_a_specifier(strptime_sessions: Any) -> None:
    """``%%z`` is a literal '%' followed by 'z': no time zone, accepted."""
    got = assert_same(strptime_sessions, "SELECT COUNT(*) AS n FROM t WHERE strptime(s, '%Y%%z') > '2000-01-01'")
    assert got["outcome"] == "ok", got


def test_control_duckdb_strptime_result_type_follows_the_format() -> None:
    """Without the typer: the same comparison fails in DuckDB only when a row reaches it."""
    con = duckdb.connect()
    assert con.execute("SELECT typeof(try_strptime('x', '%n')), typeof(try_strptime('x', '%z'))").fetchall() == [
        ("TIMESTAMP_NS", "TIMESTAMP WITH TIME ZONE")]
    con.execute("CREATE TABLE d_minus AS SELECT * FROM (VALUES (1000, 'x')) v(uid, s)")
    con.execute(f"CREATE TABLE d_full AS SELECT * FROM d_minus UNION ALL SELECT {TARGET}, '2024-01-01 123456789'")
    sql = (f"SELECT COUNT(*) FROM {{}} WHERE uid = {TARGET} AND try_strptime(s, '%Y-%m-%d %n') "
           "> CAST('1500-01-01 00:00:00' AS TIMESTAMP)")
    assert con.execute(sql.format("d_minus")).fetchall() == [(0,)]
    with pytest.raises(duckdb.Error):
        con.execute(sql.format("d_full")).fetchall()


# -- 2. rendered size of a SUM's value over joins; typing time -------------------------------------------


def _nest_trunc(n: int, col: str) -> str:
    e = col
    for _ in range(n):
        e = f"date_trunc('day', {e})"
    return e


@pytest.fixture(scope="module")
def join_sessions() -> Any:
    con = duckdb.connect()
    con.execute("CREATE TABLE cust AS SELECT k AS c_id FROM range(100) r(k)")
    con.execute("CREATE TABLE ord AS SELECT 1000 + k AS o_id, k % 100 AS o_cust, "
                "TIMESTAMP '2024-01-01' + to_hours(k) AS o_ts FROM range(300) r(k)")
    con.execute(f"INSERT INTO cust VALUES ({TARGET} + 1000)")
    con.execute(f"INSERT INTO ord VALUES (9999, {TARGET} + 1000, NULL), (9998, {TARGET} + 1000, '-infinity')")
    con.execute(f"CREATE TABLE cust_minus AS SELECT * FROM cust WHERE c_id <> {TARGET} + 1000")
    con.execute(f"CREATE TABLE ord_minus AS SELECT * FROM ord WHERE o_cust <> {TARGET} + 1000")
    out = []
    for suffix in ("", "_minus"):
        s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9), connection=con)
        use_noise(s, zero_noise())
        s.register("customer", "cust" + suffix, privacy_unit="c_id")
        s.register("orders", "ord" + suffix, references={"o_cust": "customer.c_id"}, degree_bounds={"o_cust": 8})
        out.append(s)
    yield out
    for s in out:
        s.close()


def test_a_sum_over_a_join_has_the_rendered_size_limit(join_sessions: Any) -> None:
    """Each date_trunc guard repeats its operand three times (``CASE WHEN e >= least OR e =
    -infinity THEN e END``), so six nested date_truncs render to about 5,000 nodes. A WHERE or
    a single-table SUM over it is refused for free; the SUM of a join was typed without the
    limit, accepted and charged, and took 14 s to render and run (seven levels: 56 s): the cost
    is exponential in the nesting, and a guard's second test (``e = -infinity``) runs only for
    the rows that fail the first (NULL, -infinity), so one person's row adds a copy of the
    operand at every level (3^n against 2^n evaluations per vector)."""
    sql = (f"SELECT SUM(LEAST(GREATEST(date_part('epoch', {_nest_trunc(6, 'o.o_ts')}) / 1e9, 0), 10)) AS v "
           "FROM customer c JOIN orders o ON c.c_id = o.o_cust")
    got = assert_same(join_sessions, sql, 1e-6)
    assert got["outcome"] == "UnsupportedQueryError" and "too large once made total" in got["message"], got
    full, _ = join_sessions
    with pytest.raises(errors.UnsupportedQueryError, match="too large once made total"):
        full.explain(sql, epsilon=1.0, delta=1e-6)
    small = sql.replace(_nest_trunc(6, "o.o_ts"), _nest_trunc(2, "o.o_ts"))
    assert assert_same(join_sessions, small, 1e-6)["outcome"] == "ok"


def test_typing_is_refused_before_the_rendering_grows() -> None:
    """The typer checked the size of the final rendering only, after building it, and typed each
    date function's argument twice (once more for its kind): typing n nested date functions took
    2^n calls and built 3^n nodes before the refusal (seven levels: 6 s of analysis). Now every
    intermediate rendering is sized (cached per node) and refused as soon as it is too large."""
    from dpsql.plan import typer as typer_mod

    calls = 0
    original = typer_mod.Typer._t

    def counting(self: Any, node: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(self, node)

    node = parse_one(f"year({_nest_trunc(14, 'ts')}) > 2000", dialect="duckdb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer_mod.Typer, "_t", counting)
        with pytest.raises(typer_mod.TypeRefusal, match="too large once made total"):
            typer_mod.type_predicate(node, {"ts": "TIMESTAMP"})
    assert calls < 100, calls


def test_like_tests_inside_a_date_function_are_counted_once() -> None:
    """The second typing of a date function's argument counted its LIKE tests twice: five LIKEs
    under year() were refused as more than eight."""
    likes = " AND ".join(f"s LIKE '{c}%'" for c in "abcde")
    node = parse_one(f"year(CASE WHEN {likes} THEN d END) > 2000", dialect="duckdb")
    from dpsql.plan.typer import type_predicate

    type_predicate(node, {"s": "VARCHAR", "d": "DATE"})


# -- 3. column names that differ only in case -----------------------------------------------------------


def _case_table() -> Any:
    import pyarrow as pa

    return pa.table({"uid": pa.array(range(50), pa.int64()), "A": pa.array(["x"] * 50),
                     "a": pa.array(range(50), pa.int64())})


def test_an_arrow_source_with_columns_differing_only_in_case_is_refused() -> None:
    """DuckDB compares column names case-insensitively: the view's ``"a"`` bound the raw text
    column ``"A"`` (read as bytes) and the second column came out as ``a_1``; the catalog typed
    ``a`` as VARCHAR and ``a_1`` as BLOB (the undecoded bytes of the text, beyond the
    ``max_text_bytes`` cap), and the integer column was unreachable. Refused at registration."""
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6))
    try:
        with pytest.raises(errors.ConfigError, match="which SQL does not tell apart"):
            s.register("t", _case_table(), privacy_unit="uid")
    finally:
        s.close()


@pytest.mark.parametrize("invalid_text", ["null", "replace"])
def test_a_parquet_source_with_columns_differing_only_in_case_is_refused(tmp_path: Any, invalid_text: str) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "case.parquet"
    pq.write_table(_case_table(), path)
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6), engine={"invalid_text": invalid_text})
    try:
        with pytest.raises(errors.ConfigError, match="which SQL does not tell apart"):
            s.register("t", str(path), privacy_unit="uid")
    finally:
        s.close()


# -- 4. IN lists up to their documented length -----------------------------------------------------------


@pytest.mark.parametrize(("column", "typ", "literal"), [
    ("i", "INTEGER", lambda k: str(k)),
    ("d", "DATE", lambda k: f"'{2000 + k // 365:04d}-01-{1 + k % 28:02d}'"),
    ("i", "INTEGER", lambda k: f"-{k}"),
])
def test_an_in_list_of_constants_is_bounded_by_its_own_limit(column: str, typ: str, literal: Any) -> None:
    from dpsql.plan.typer import MAX_IN_LIST, TypeRefusal, type_predicate

    def sql(n: int) -> Any:
        return parse_one(f"{column} IN ({', '.join(literal(k) for k in range(n))})", dialect="duckdb")

    type_predicate(sql(MAX_IN_LIST), {column: typ})
    with pytest.raises(TypeRefusal, match="at most"):
        type_predicate(sql(MAX_IN_LIST + 1), {column: typ})


def test_an_in_list_of_expressions_still_counts_its_elements() -> None:
    from dpsql.plan.typer import TypeRefusal, type_predicate

    items = ", ".join(f"j // {k + 2}" for k in range(1200))
    with pytest.raises(TypeRefusal, match="too large once made total"):
        type_predicate(parse_one(f"i IN ({items})", dialect="duckdb"), {"i": "INTEGER", "j": "INTEGER"})


def test_an_in_list_of_typed_literals_is_answered_alike_on_neighbours(strptime_sessions: Any) -> None:
    dates = ", ".join(f"'{2000 + k // 365:04d}-01-{1 + k % 28:02d}'" for k in range(2500))
    sql = f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND strptime(s, '%Y-%m-%d %n') IN ({dates})"
    assert assert_same(strptime_sessions, sql)["outcome"] == "ok"
