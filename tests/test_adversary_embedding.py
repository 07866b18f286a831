"""What one person's rows can change when dpsql is embedded in a Python program (Arrow tables, Parquet
written from Arrow, a caller's DuckDB connection): whether a query fails after its charge, and how a
released key is spelled, must not depend on any one person's values.

Arrow maps may hold a key twice (Arrow does not check), and DuckDB's Arrow scan raises on such a map
("Arrow map contains duplicate key"): a map column read as a map failed the query after its charge
exactly when one person's row held a duplicated key (``COUNT(m)``, ``m IS NOT NULL``), for an Arrow
table and for a Parquet file read through Arrow. Maps are now read as their entries (a list of
structs), which DuckDB does not check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

N = 30


def _outcome(source: Any, sql: str, **engine: Any) -> tuple[str, Any]:
    s = dpsql.Session(budget=Budget(100.0, 1e-3), engine=engine or None)
    use_noise(s, zero_noise())
    try:
        s.register("t", source, privacy_unit="uid")
        try:
            return "ok", s.query(sql, epsilon=1.0, delta=1e-6).table.to_pylist()
        except dpsql.errors.DPSQLError as e:
            return type(e).__name__, s.history().column("status").to_pylist()
    finally:
        s.close()


def _maps(last: list[tuple[int, int]] | None) -> pa.Table:
    """N people with the map {1: 1}; with ``last``, one more person holding ``last``."""
    rows = [[(1, 1)]] * N + ([last] if last is not None else [])
    return pa.table({"uid": list(range(len(rows))), "m": pa.array(rows, pa.map_(pa.int64(), pa.int64()))})


@pytest.mark.parametrize("sql", ["SELECT COUNT(m) AS n FROM t", "SELECT COUNT(*) AS n FROM t WHERE m IS NOT NULL"])
@pytest.mark.parametrize("as_parquet", [False, True], ids=["arrow", "parquet"])
def test_a_map_with_a_duplicated_key_does_not_fail_the_query(tmp_path: Path, sql: str, as_parquet: bool) -> None:
    """(Before: ExecutionError after the charge with the duplicated key, a release without it.)"""
    outcomes = []
    for last in (None, [(1, 1)], [(1, 1), (1, 2)]):
        source: Any = _maps(last)
        if as_parquet:
            pq.write_table(source, tmp_path / "m.parquet")
            source = str(tmp_path / "m.parquet")
        outcomes.append(_outcome(source, sql))
    assert outcomes == [("ok", [{"n": N}]), ("ok", [{"n": N + 1}]), ("ok", [{"n": N + 1}])]


@pytest.mark.parametrize("wrap", ["list", "struct"])
def test_a_map_inside_a_list_or_struct_with_a_duplicated_key_does_not_fail_the_query(wrap: str) -> None:
    m = pa.map_(pa.int64(), pa.int64())
    typ = pa.list_(m) if wrap == "list" else pa.struct([("m", m)])
    outcomes = []
    for last in ([(1, 1)], [(1, 1), (1, 2)]):
        rows: list[Any] = [[(1, 1)]] * N + [last]
        values = [[r] for r in rows] if wrap == "list" else [{"m": r} for r in rows]
        t = pa.table({"uid": list(range(N + 1)), "m": pa.array(values, typ)})
        outcomes.append(_outcome(t, "SELECT COUNT(m) AS n FROM t"))
    assert outcomes == [("ok", [{"n": N + 1}])] * 2


def test_maps_read_as_their_entries_keep_nulls_and_empty_maps() -> None:
    m = pa.array([[(1, 1), (1, 2)], None, [], [(2, 3)]], pa.map_(pa.int64(), pa.int64()))
    s = dpsql.Session(budget=Budget(1.0))
    try:
        s.register("t", pa.table({"uid": [1, 2, 3, 4], "m": m}), privacy_unit="uid")
        view = s.tables["t"].view
        rows = s._engine.connection.sql(f'SELECT uid, m IS NULL, len(m) FROM "{view}" ORDER BY uid').fetchall()
        assert rows == [(1, False, 2), (2, True, None), (3, False, 0), (4, False, 1)]
    finally:
        s.close()


@pytest.mark.parametrize("typ", [pa.list_(pa.string()), pa.large_list(pa.large_string())], ids=["list", "large_list"])
def test_count_of_a_list_of_text_binds(typ: pa.DataType) -> None:
    """COUNT(col) accepts any column; a VARCHAR[] column was taken for text and rendered ``COLLATE "binary"``,
    which DuckDB refuses on a list (a free QueryTypeError on every dataset)."""
    t = pa.table({"uid": [1, 2, 3], "c": pa.array([["a"], None, ["b"]], typ)})
    assert _outcome(t, "SELECT COUNT(c) AS n FROM t") == ("ok", [{"n": 2}])


# -- a caller's connection: DuckDB's own output while private rows are read -----------------------------------------

def _caller_session() -> tuple[Any, dpsql.Session]:
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS uid, CASE WHEN i = 7 THEN 'secret' ELSE 'x' END AS note "
                "FROM range(1234) r(i)")
    s = dpsql.Session(budget=Budget(10.0, 1e-3), connection=con)
    s.register("t", "t", privacy_unit="uid")
    return con, s


PROFILED = """
import sys, duckdb, dpsql
from dpsql.budget import Budget
con = duckdb.connect()
con.execute("CREATE TABLE t AS SELECT i AS uid, CASE WHEN i = 7 THEN 'secret' ELSE 'x' END AS note FROM range(1234) r(i)")
s = dpsql.Session(budget=Budget(10.0), connection=con)
s.register("t", "t", privacy_unit="uid")
con.execute("PRAGMA enable_profiling = 'query_tree'")
if sys.argv[1] == "dpsql":
    s.query("SELECT COUNT(*) FROM t WHERE note = 'secret'", epsilon=1.0)
else:  # the control: the caller's own query
    con.execute("SELECT COUNT(*) FROM t WHERE note = 'secret'").fetchall()
assert con.execute("SELECT current_setting('enable_profiling')").fetchall()[0][0] == "query_tree"
"""


def test_the_callers_profiler_never_shows_a_private_read() -> None:
    """With ``PRAGMA enable_profiling`` on the caller's connection DuckDB printed the plan of the bounded
    query with the exact rows through each operator ('Filters: ... = 'secret'', '1 row': the count before
    the noise). The profiler is off while private rows are read, and the caller's setting comes back."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(Path(dpsql.__file__).parents[1]),
                                                                    os.environ.get("PYTHONPATH", "")] if p)}
    outs = {}
    for who in ("dpsql", "caller"):
        r = subprocess.run([sys.executable, "-c", PROFILED, who], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        outs[who] = r.stdout + r.stderr
    assert "Table Scan" not in outs["dpsql"] and "Filters" not in outs["dpsql"]
    assert "Table Scan" in outs["caller"] and "Filters" in outs["caller"]  # the control


def test_the_callers_duckdb_log_never_records_a_private_read() -> None:
    """DuckDB's logger (``enable_logging``) recorded every statement run on the connection, and at finer
    levels events of the scan (the adaptive filter's order of predicates, which follows their selectivity on
    the rows). It is off while private rows are read, and the caller's setting comes back."""
    con, s = _caller_session()
    try:
        con.execute("SET enable_logging = true")
        con.execute("SET logging_level = 'TRACE'")
        s.query("SELECT COUNT(*) FROM t WHERE note = 'secret'", epsilon=1.0)
        assert str(con.execute("SELECT current_setting('enable_logging')").fetchall()[0][0]).lower() in ("true", "1")
        con.execute("SET enable_logging = false")
        logged = con.execute("SELECT type, message FROM duckdb_logs()").fetchall()
        reads = [m for typ, m in logged if typ == "QueryLog" and "__users" in m and not m.startswith("DESCRIBE")]
        assert reads == [] and not [m for typ, m in logged if typ == "AdaptiveFilter"]
        assert any(typ == "QueryLog" and m.startswith("DESCRIBE") for typ, m in logged)  # the free bind checks
    finally:
        s.close()


def test_the_callers_progress_bar_setting_is_left_as_it_was() -> None:
    """Opening a Session on a caller's connection used to turn its progress bar off for good."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = true")
    s = dpsql.Session(budget=Budget(10.0), connection=con)
    try:
        assert str(con.execute("SELECT current_setting('enable_progress_bar')").fetchall()[0][0]).lower() == "true"
    finally:
        s.close()


def test_the_callers_progress_bar_is_off_during_a_private_read_and_restored() -> None:
    con, s = _caller_session()
    try:
        con.execute("SET enable_progress_bar = true")
        s.query("SELECT COUNT(*) FROM t", epsilon=1.0)
        assert str(con.execute("SELECT current_setting('enable_progress_bar')").fetchall()[0][0]).lower() == "true"
    finally:
        s.close()


@pytest.mark.parametrize("setting", ["arrow_lossless_conversion = true", "produce_arrow_string_view = true",
                                     "arrow_output_list_view = true"])
def test_the_callers_arrow_export_settings_do_not_fail_a_release(setting: str) -> None:
    """Under ``arrow_lossless_conversion`` DuckDB exported AVG's HUGEINT count as opaque bytes, which the
    release could not read: every AVG failed after its charge on such a connection."""
    con, s = _caller_session()
    use_noise(s, zero_noise())
    name = setting.split(" = ")[0]
    try:
        con.execute(f"SET {setting}")
        s.register("u", "t", privacy_unit="uid", columns={"uid": {"bounds": (0, 2000)}})
        out = s.query("SELECT AVG(uid) AS a, COUNT(*) AS n FROM u", epsilon=1.0, delta=1e-6)
        row = out.table.to_pylist()[0]
        assert row["n"] == 1234 and abs(row["a"] - 616.5) < 1  # zero noise: the mean of 0..1233, on the grid
        assert str(con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0]).lower() in ("true", "1")
    finally:
        s.close()


@pytest.mark.parametrize("when", ["before", "after"])
def test_binary_as_string_on_the_callers_connection_keeps_blobs(tmp_path: Path, when: str) -> None:
    """DuckDB's Parquet reader reads BLOB as VARCHAR under the connection's ``binary_as_string``: with
    ``invalid_text = "replace"`` every query on a table registered with a BLOB failed after its charge once
    the caller set it. The readers are told ``binary_as_string = false``."""
    import duckdb

    t = pa.table({"uid": list(range(N + 1)), "b": pa.array([b"ok"] * N + [b"\xff\xfe"], pa.binary())})
    pq.write_table(t, tmp_path / "b.parquet")
    for mode in ("null", "replace"):
        con = duckdb.connect()
        if when == "before":
            con.execute("SET binary_as_string = true")
        s = dpsql.Session(budget=Budget(100.0, 1e-3), connection=con, engine={"invalid_text": mode})
        use_noise(s, zero_noise())
        try:
            s.register("t", str(tmp_path / "b.parquet"), privacy_unit="uid")
            assert s.tables["t"].schema["b"] == "BLOB"
            counts = []
            for i in range(4):  # the second read on is DuckDB's own reader for the default mode too
                if i == 1:
                    con.execute("SET binary_as_string = true")
                counts.append(s.query("SELECT COUNT(b) AS n FROM t", epsilon=1.0).table.column("n")[0].as_py())
            assert counts == [N + 1] * 4
        finally:
            s.close()


def test_a_timestamptz_key_is_spelled_in_utc_whatever_the_machines_time_zone(tmp_path: Path) -> None:
    """dpsql's own DuckDB connection took the machine's time zone, so a TIMESTAMPTZ key cast to text was
    spelled '2020-01-01 01:00:00+01' in Paris and '2020-01-01 00:00:00+00' in UTC (Spark: UTC)."""
    import os
    import subprocess
    import sys

    code = ("import datetime as dt, pyarrow as pa, dpsql\n"
            "from dpsql.testing import use_noise, zero_noise\n"
            "t = pa.table({'uid': list(range(50)), 'ts': pa.array([dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)] * 50,"
            " pa.timestamp('us', tz='UTC'))})\n"
            "s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-2))\n"
            "use_noise(s, zero_noise())\n"
            "s.register('t', t, privacy_unit='uid', max_groups_per_unit=1, max_rows_per_group=1)\n"
            "print(s.query('SELECT CAST(ts AS VARCHAR) AS k, COUNT(*) AS n FROM t GROUP BY CAST(ts AS VARCHAR)',"
            " epsilon=5, delta=1e-3).to_pylist()[0]['k'])\n")
    for tz in ("Europe/Paris", "America/New_York"):
        root = os.path.dirname(os.path.dirname(os.path.abspath(dpsql.__file__)))  # this tree's dpsql
        env = {**os.environ, "TZ": tz, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             cwd=tmp_path, check=True)
        assert out.stdout.strip() == "2020-01-01 00:00:00+00", (tz, out.stdout, out.stderr[-500:])


@pytest.mark.parametrize("setup", ["", "SET memory_limit = '1234567kB'", "SET memory_limit = '18.8GiB'",
                                   "SET memory_limit = '2GB'; SET max_temp_directory_size = '3333333kB'",
                                   "SET default_order = 'DESC'; SET threads = 1"],
                         ids=["defaults", "odd-kB", "GiB-text", "GB-and-temp", "order-threads"])
def test_the_callers_settings_read_the_same_after_queries(setup: str) -> None:
    """Finding (fixed): DuckDB shows a size rounded (``current_setting``, ``duckdb_settings()``; nothing gives its
    bytes) and dpsql gave a caller's connection back the text it showed: the default memory_limit of 18.8 GiB came
    back as 18.7 GiB (so did the 15th of it DuckDB shows as write_buffer_row_group_memory_limit), ``1234567kB``
    (shown 1.1 GiB) as 1.0 GiB, the default ``default_order`` (ASCENDING) as ASC. A setting DuckDB's default
    shows the same way is now reset to the default (exactly the bytes it had); another is set to the least
    number of bytes that reads the same. Every setting reads the same, to the character, after each query."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS uid FROM range(1000)")
    if setup:
        con.execute(setup)

    def settings() -> dict[str, Any]:
        return dict(con.execute("SELECT name, value FROM duckdb_settings()").fetchall())

    before = settings()
    s = dpsql.Session(None, Budget(100.0), connection=con)
    s.register("t", "t", privacy_unit="uid")
    for _ in range(3):
        assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.num_rows == 1
        after = settings()
        assert {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v} == {}
    s.close()
