"""Settings of a caller's DuckDB connection (``Session(connection=...)``) that change what a query
means are pinned while dpsql reads private rows or post-processes a release, then given back.

Sort order: a caller's connection may set ``default_order = 'DESC'`` or another
``default_null_order``: an ORDER BY without a direction then sorted descending, so the analyst's
``ORDER BY k LIMIT 3`` released the last three keys, and the bounding's windows kept the largest
hashes (uniform still, but not the choices of Spark and the portable hash). The engine sets
ascending, NULLs last, for its private reads and post-processing, and gives the caller's settings
back."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

SETTINGS = [("DESC", "NULLS_FIRST"), ("ASC", "NULLS_FIRST_ON_ASC_LAST_ON_DESC"), (None, None)]


def _run(con: duckdb.DuckDBPyConnection | None, sql: str) -> list[dict[str, object]]:
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2), connection=con)
    use_noise(s, zero_noise())
    t = pa.table({"u": np.arange(11), "k": pa.array(list("aabbbccccd") + [None])})
    s.register("t", t, privacy_unit="u", columns={"k": {"domain": list("abcd")}})
    try:
        return s.query(sql, epsilon=5.0).table.to_pylist()
    finally:
        s.close()


@pytest.mark.parametrize("order,nulls", SETTINGS)
def test_order_by_means_ascending_whatever_the_callers_connection_sets(order: str | None, nulls: str | None) -> None:
    con = duckdb.connect()
    if order is not None:
        con.execute(f"SET default_order = '{order}'")
        con.execute(f"SET default_null_order = '{nulls}'")
    before = con.execute("SELECT current_setting('default_order'), current_setting('default_null_order')").fetchall()
    got = _run(con, "SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k LIMIT 3")
    assert [r["k"] for r in got] == ["a", "b", "c"]
    got = _run(con, "SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY n, k")
    assert [r["k"] for r in got] == ["d", "a", "b", "c"]
    # the caller's settings are theirs again
    after = con.execute("SELECT current_setting('default_order'), current_setting('default_null_order')").fetchall()
    short = {"ASCENDING": "ASC", "DESCENDING": "DESC"}  # DuckDB shows its default spelled out
    assert [(short.get(o, o), n) for o, n in after] == [(short.get(o, o), n) for o, n in before]
    if order == "DESC":  # negative control: the caller's own ORDER BY on that connection is descending
        assert con.execute("SELECT x FROM (VALUES (1), (2)) v(x) ORDER BY x").fetchall() == [(2,), (1,)]


@pytest.mark.parametrize("setting", ["SET ieee_floating_point_ops = false", "SET integer_division = true"])
@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM t WHERE ln(x) > -1",
    "SELECT COUNT(*) AS n FROM t WHERE 1 / x > 0",
    "SELECT COUNT(*) AS n FROM t WHERE sqrt(x - 1) >= 0",
])
def test_a_callers_arithmetic_settings_do_not_make_one_row_fail_the_query(setting: str, sql: str) -> None:
    """With ieee_floating_point_ops = false, ln(0), 1/0.0 and sqrt(-1) raise; with integer_division =
    true, 1 / x is an integer division that raises on 0: on such a caller's connection the query
    failed after its charge exactly when one person's row held x = 0 (D: answered, D + that person:
    ExecutionError). The engine reads private rows with DuckDB's defaults and restores the caller's."""
    outcomes = []
    for xs in ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 0.0]):
        con = duckdb.connect()
        con.execute(setting)
        s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2), connection=con)
        use_noise(s, zero_noise())
        s.register("t", pa.table({"u": np.arange(len(xs)), "x": xs}), privacy_unit="u")
        try:
            outcomes.append(s.query(sql, epsilon=5.0).table.num_rows)
        finally:
            s.close()
        name = setting.split()[1]
        want = "false" if "ieee" in name else "true"
        assert str(con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0]).lower() == want
        # negative control: the caller's own query on that connection still raises on the zero row
        con.register("z", pa.table({"x": [0.0]}))
        with pytest.raises(duckdb.Error):
            con.execute("SELECT ln(x) FROM z" if "ieee" in name else "SELECT CAST(1 AS BIGINT) / CAST(x AS BIGINT) FROM z").fetchall()
    assert outcomes == [1, 1]


def test_a_connection_that_logs_its_statements_to_a_file_is_refused_for_free(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """DuckDB's log_query_path writes every statement's text to a file; the bounded query's text holds
    the query's secret salt (bounding choices, the keyed spread, the S4S join sample). Such a caller's
    connection is refused before any charge; setting the log aside and back would truncate it."""
    import hashlib

    import dpsql.engine.duckdb as engine

    log = tmp_path / "q.log"
    table = pa.table({"uid": np.arange(50), "k": np.arange(50) % 5, "x": np.ones(50)})
    salt = hashlib.sha256(b"0:1").hexdigest()[:32]  # zero_noise(0)'s first salt

    def run(con: duckdb.DuckDBPyConnection) -> dpsql.Session:
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), connection=con)
        use_noise(s, zero_noise(0))
        s.register("ev", table, privacy_unit="uid", max_groups_per_unit=2, columns={"x": {"bounds": (0, 1)}})
        return s

    con = duckdb.connect()
    con.execute(f"SET log_query_path = '{log}'")
    with run(con) as s:
        with pytest.raises(dpsql.errors.ConfigError, match="log_query_path"):
            s.query("SELECT k, SUM(x) AS s FROM ev GROUP BY k", epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
    assert salt not in log.read_text()
    con.execute("SET log_query_path = ''")
    with run(con) as s:  # unset: the query runs
        s.query("SELECT k, SUM(x) AS s FROM ev GROUP BY k", epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 1
    # negative control: without the refusal the salt is written to the caller's file
    monkeypatch.setattr(engine, "_refuse_query_log", lambda path: None)
    con.execute(f"SET log_query_path = '{log}'")
    with run(con) as s:
        s.query("SELECT k, SUM(x) AS s FROM ev GROUP BY k", epsilon=1.0, delta=1e-6)
    assert salt in log.read_text()
    con.close()


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM t WHERE CAST(tz AS VARCHAR) LIKE '2%'",
    "SELECT COUNT(*) AS n FROM t WHERE CAST(tz AS VARCHAR) IS NOT NULL",
])
@pytest.mark.parametrize("calendar", ["chinese", "dangi"])
def test_a_callers_calendar_does_not_make_one_timestamptz_fail_the_query(calendar: str, sql: str) -> None:
    """A TIMESTAMPTZ's text is made by DuckDB's ICU under the connection's ``Calendar``: under 'chinese' or
    'dangi', the text of an instant from about the year 100 000 on (within the range sources keep) raised
    DuckDB's internal error, which also invalidated the caller's database. On such a caller's connection the
    query failed after its charge exactly when one person's row held such an instant (D: answered, D + that
    person: ExecutionError, and every later statement FatalException). Private reads use the Gregorian
    calendar, the caller's comes back afterwards."""
    outcomes = []
    for hostile in (False, True):
        con = duckdb.connect()
        con.execute("CREATE TABLE t (uid BIGINT, tz TIMESTAMPTZ)")
        con.execute("INSERT INTO t SELECT i, TIMESTAMPTZ '2020-01-01 00:00:00+00' + to_days(i::INT) FROM range(200) r(i)")
        if hostile:  # about the year 192 000
            con.execute("INSERT INTO t VALUES (999, MAKE_TIMESTAMPTZ(6000000000000000000))")
        con.execute(f"SET Calendar = '{calendar}'")
        with dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2), connection=con) as s:
            use_noise(s, zero_noise())
            s.register("t", "t", privacy_unit="uid")
            outcomes.append(s.query(sql, epsilon=5.0).table.num_rows)
        assert con.execute("SELECT current_setting('Calendar')").fetchall() == [(calendar,)]
        if hostile:  # negative control: the caller's own cast on that connection raises on the hostile row
            with pytest.raises(duckdb.Error):
                con.execute("SELECT CAST(tz AS VARCHAR) FROM t WHERE uid = 999").fetchall()
        con.close()
    assert outcomes == [1, 1]



@pytest.mark.parametrize("scope", ["SESSION", "GLOBAL+SESSION"])
def test_order_by_means_ascending_over_a_session_scoped_sort_order(scope: str) -> None:
    """SET SESSION default_order = 'DESC' on the caller's connection overrides a plain SET (which sets the global
    value): the analyst's ORDER BY k LIMIT 3 released the last three keys. The sort order is pinned for dpsql's
    session and the caller's session and global values are given back (a new cursor reads the global one)."""
    con = duckdb.connect()
    if scope == "GLOBAL+SESSION":
        con.execute("SET GLOBAL default_order = 'ASC'")
        con.execute("SET GLOBAL default_null_order = 'NULLS_FIRST_ON_ASC_LAST_ON_DESC'")
    con.execute("SET SESSION default_order = 'DESC'")
    con.execute("SET SESSION default_null_order = 'NULLS_FIRST'")
    read = "SELECT current_setting('default_order'), current_setting('default_null_order')"
    before, before_global = con.execute(read).fetchall(), con.cursor().execute(read).fetchall()
    got = _run(con, "SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k LIMIT 3")
    assert [r["k"] for r in got] == ["a", "b", "c"]
    assert con.execute(read).fetchall() == before
    assert con.cursor().execute(read).fetchall() == before_global


def test_a_callers_connection_that_has_spilled_keeps_its_temp_directory(tmp_path: Path) -> None:
    """DuckDB cannot switch a connection's temp directory once something spilled there ("Cannot switch temporary
    directory after the current one has been used"): pinning the engine's own spill directory failed every query on
    such a caller's connection after its charge (and so did every query after one of dpsql's reads spilled into the
    engine's directory). The read spills into the directory the connection already uses."""
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '20MB'; SET temp_directory = '{tmp_path / 'caller'}'")
    con.execute("CREATE TABLE big AS SELECT range AS i, random() AS r FROM range(5000000)")  # 80 MB: it spills
    with pytest.raises(duckdb.Error, match="temporary directory"):  # the premise: DuckDB keeps the directory
        con.execute(f"SET temp_directory = '{tmp_path / 'other'}'")
    got = _run(con, "SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k")
    assert [r["n"] for r in got] == [2, 3, 4, 1]
    assert con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0] == str(tmp_path / "caller")


def test_a_read_that_spills_on_a_callers_connection_gives_the_other_settings_back_exactly() -> None:
    """One of dpsql's reads spilled into the engine's spill directory, which DuckDB then keeps: giving the caller's
    temp directory back failed, and with it the one statement that gives back every setting, whose one-by-one
    fallback gave back the text shown (default_order ASC for the default ASCENDING). Later queries still answer.
    The read spills at one thread under 60 MB with 1M rows (checked at the end: DuckDB then keeps the directory)."""
    con = duckdb.connect()
    n = 1_000_000
    t = pa.table({"uid": np.random.default_rng(1).permutation(n),
                  # f"k{i % 200000:07d}xxxxxxxxxxxxxxxxxxxxxx", built by Arrow (a Python list of 1M texts: 0.6 s)
                  "s": pc.binary_join_element_wise(
                      "k", pc.utf8_lpad(pc.cast(pa.array(np.arange(n) % 200000), pa.string()), 7, "0"),
                      "xxxxxxxxxxxxxxxxxxxxxx", "")})
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), connection=con,
                      engine={"memory_limit": "60MB", "max_text_bytes": 4096})  # texts up to 4 kB: 60 MB holds them
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", max_rows_per_unit=1)
    read = "SELECT current_setting('memory_limit'), current_setting('threads'), current_setting('default_order')"
    before = con.execute(read).fetchall()
    s.query("SELECT s, COUNT(*) AS n FROM t GROUP BY s", epsilon=1.0, delta=1e-6)
    assert con.execute(read).fetchall() == before
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0, delta=1e-6).table.num_rows == 1
    s.close()
    with pytest.raises(duckdb.NotImplementedException, match="temporary directory"):  # the read did spill
        con.execute("SET temp_directory = 'elsewhere'")
