"""Neighbouring datasets (without and with one person's rows), the same query, the same observable outcome.

A relation of the caller's DuckDB connection that is an Arrow object registered with ``con.register`` (or a
view over one) is read through DuckDB's Arrow scan, which converts some types while reading and trusts the
text to be UTF-8: the total reading dpsql gives a ``pyarrow.Table`` passed to ``register`` (text decoded
with ``TRY(DECODE(...))``, durations and timestamps rebuilt from their integers) did not apply. One person's
text that is not valid UTF-8 (``pyarrow.parquet.read_table`` keeps such bytes as they are) made ``lower``,
``upper``, ``trim``, ``strpos`` or ``ILIKE`` raise DuckDB's internal error after the charge, which also
invalidated the whole database: every later query raised a ``duckdb.FatalException`` quoting DuckDB's
original message. One person's duration of 2^62 ms failed every query reading that column. A view over
DuckDB's own Parquet reader (``read_parquet``) failed the same way on such text. Such relations are now
refused at registration (free, from the plan DuckDB binds, no row read), with the fix: register the
``pyarrow.Table`` or the file itself, or materialise the relation as a DuckDB table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _hostile_value import neighbour_outcomes

import dpsql
from dpsql.errors import ConfigError, DPSQLError
from dpsql.testing import use_noise, zero_noise

N = 30  # people besides the hostile one
HOSTILE = 999


def _text(raw: list[bytes]) -> pa.Array:
    """A string array holding exactly these bytes (pyarrow's constructors would validate them)."""
    offsets = [0]
    for r in raw:
        offsets.append(offsets[-1] + len(r))
    return pa.Array.from_buffers(pa.string(), len(raw), [None, pa.array(offsets, pa.int32()).buffers()[1],
                                                         pa.py_buffer(b"".join(raw))])


def _table(hostile: bool, kind: str) -> pa.Table:
    uids = list(range(N)) + ([HOSTILE] if hostile else [])
    notes = [b"ok%d" % i for i in range(N)] + ([b"\xff\xfeab"] if hostile else [])
    waits = list(range(N)) + ([2**62] if hostile else [])
    cols: dict[str, Any] = {"uid": pa.array(uids, pa.int64())}
    if kind == "text":
        cols["note"] = _text(notes)
    else:
        cols["wait"] = pa.array(waits, pa.duration("ms"))
    return pa.table(cols)


QUERIES = {
    "text": ["SELECT COUNT(*) AS n FROM t WHERE lower(note) = 'ok1'", "SELECT COUNT(*) AS n FROM t WHERE trim(note) = 'ok2'",
             "SELECT COUNT(*) AS n FROM t WHERE uid < 5"],
    "duration": ["SELECT COUNT(*) AS n FROM t WHERE wait IS NOT NULL", "SELECT COUNT(*) AS n FROM t WHERE uid < 5"],
}


def _outcome(con: duckdb.DuckDBPyConnection, source: Any, kind: str) -> list[tuple[str, Any]]:
    """Registration and every query's outcome (an exception that is no DPSQLError is an outcome too)."""
    out: list[tuple[str, Any]] = []
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), connection=con)
    try:
        use_noise(s, zero_noise(39))
        try:
            s.register("t", source, privacy_unit="uid")
        except DPSQLError as e:
            return [("refused", (type(e).__name__, str(e)))]
        for sql in QUERIES[kind]:
            try:
                out.append(("ok", s.query(sql, epsilon=1.0).table.to_pylist()))
            except DPSQLError as e:
                out.append(("error", (type(e).__name__, str(e))))
            except Exception as e:  # noqa: BLE001 - e.g. duckdb.FatalException once the database is invalidated
                out.append(("raw", type(e).__name__))
    finally:
        try:
            s.close()
        except Exception:  # noqa: BLE001 - an invalidated database fails to close its views
            pass
    return out


@pytest.mark.parametrize("kind", ["text", "duration"])
def test_control_duckdb_fails_on_the_hostile_person_in_a_registered_arrow_object(kind: str) -> None:
    con = duckdb.connect()
    con.register("events", _table(False, kind))
    col = "lower(note)" if kind == "text" else "wait IS NULL"
    con.execute(f"SELECT {col} FROM events").fetchall()
    con = duckdb.connect()
    con.register("events", _table(True, kind))
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT {col} FROM events").fetchall()


@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize("kind", ["text", "duration"])
def test_a_registered_arrow_object_gives_the_same_outcome_on_neighbours(kind: str, view: bool) -> None:
    outcomes = []
    for hostile in (False, True):
        con = duckdb.connect()
        con.register("events", _table(hostile, kind))
        if view:
            con.execute("CREATE VIEW events_v AS SELECT * FROM events")
        outcomes.append(_outcome(con, "events_v" if view else "events", kind))
    assert outcomes[0] == outcomes[1], outcomes
    # refused for free, with the fix
    assert outcomes[0][0][0] == "refused", outcomes[0]
    assert "register the pyarrow.Table or the Parquet / CSV file itself" in outcomes[0][0][1][1], outcomes[0]


@pytest.mark.parametrize("reader", ["read_parquet", "parquet_scan", "path"])
def test_a_view_over_duckdbs_parquet_reader_gives_the_same_outcome_on_neighbours(tmp_path: Path, reader: str) -> None:
    outcomes = []
    for hostile in (False, True):
        path = tmp_path / f"events_{hostile}.parquet"
        pq.write_table(_table(hostile, "text"), path)
        con = duckdb.connect()
        rel = f"'{path}'" if reader == "path" else f"{reader}('{path}')"
        con.execute(f"CREATE VIEW events AS SELECT * FROM {rel}")
        outcomes.append(_outcome(con, "events", "text"))
    assert outcomes[0] == outcomes[1], outcomes
    assert outcomes[0][0][0] == "refused", outcomes[0]
    # control: the same file registered by its path is read totally (the hostile text is NULL)
    answered = [_outcome(duckdb.connect(), str(tmp_path / f"events_{hostile}.parquet"), "text") for hostile in (False, True)]
    assert answered[0] == answered[1] and answered[0][0] == ("ok", [{"n": 1}]), answered


def test_a_view_over_duckdbs_csv_reader_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.csv"
    path.write_text("uid,note\n1,a\n")
    con = duckdb.connect()
    con.execute(f"CREATE VIEW events AS SELECT * FROM read_csv('{path}')")
    with dpsql.Session(budget=dpsql.Budget(1.0), connection=con) as s:
        with pytest.raises(ConfigError, match="READ_CSV"):
            s.register("t", "events", privacy_unit="uid")


def test_control_views_over_tables_and_range_are_still_answered() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE raw AS SELECT i AS uid, 'ok' || i AS note FROM range(30) r(i)")
    con.execute("CREATE VIEW events AS SELECT uid, note FROM raw UNION ALL SELECT 100 + i, 'x' FROM range(5) r(i)")
    out = _outcome(con, "events", "text")
    assert out == [("ok", [{"n": 1}]), ("ok", [{"n": 1}]), ("ok", [{"n": 5}])], out


@pytest.mark.parametrize("kind", ["text", "duration"])
def test_control_the_same_arrow_table_passed_to_register_is_read_totally(kind: str) -> None:
    outcomes = [_outcome(duckdb.connect(), _table(hostile, kind), kind) for hostile in (False, True)]
    assert all(o[0] == "ok" for o in outcomes[0]), outcomes
    assert outcomes[0] == outcomes[1], outcomes  # zero noise: the hostile person's value reads as NULL


def test_control_a_materialised_table_is_still_answered() -> None:
    con = duckdb.connect()
    con.register("events", _table(False, "text"))
    con.execute("CREATE TABLE events_t AS SELECT * FROM events")
    con.unregister("events")
    out = _outcome(con, "events_t", "text")
    assert out == [("ok", [{"n": 1}]), ("ok", [{"n": 1}]), ("ok", [{"n": 5}])], out


@pytest.mark.parametrize("explain_output", ["all", "optimized_only", "physical_only"])
def test_the_refusal_reads_whichever_plans_the_connection_explains(explain_output: str) -> None:
    con = duckdb.connect()
    con.register("events", _table(False, "text"))
    con.execute(f"SET explain_output = '{explain_output}'")
    with dpsql.Session(budget=dpsql.Budget(1.0), connection=con) as s:
        with pytest.raises(ConfigError, match="PYTHON_ARROW_SCAN"):
            s.register("t", "events", privacy_unit="uid")
        assert "t" not in s.tables


def test_reading_scans_names_the_readers_and_nothing_else() -> None:
    from dpsql.engine._duckdb_sources import reading_scans

    def node(name: str, *children: dict[str, Any], function: str | None = None) -> dict[str, Any]:
        return {"name": name, "children": list(children), "extra_info": {"Function": function} if function else {}}

    plain = [node("PROJECTION", node("HASH_JOIN", node("SEQ_SCAN ", function="SEQ_SCAN"), node("RANGE", function="RANGE"),
                                     node("COLUMN_DATA_SCAN"), node("CTE_SCAN"), node("DELIM_SCAN")))]
    assert reading_scans(json.dumps(plain)) == []
    mixed = [node("UNION", node("TABLE_SCAN", function="SQLITE_SCAN"), node("READ_JSON", function="READ_JSON"),
                  node("PYTHON_ARROW_SCAN"), node("PANDAS_SCAN"))]
    assert sorted(reading_scans(json.dumps(mixed))) == ["PANDAS_SCAN", "PYTHON_ARROW_SCAN", "READ_JSON", "SQLITE_SCAN"]


#: digits of the hostile person's BIGNUM: one conversion to text takes 1.4 s of CPU (load average 13), more than
#: the time-out below on any machine, and COUNT(DISTINCT) converts it more than once
BIG_DIGITS = 1_000_000


def _bignum_outcomes(sql: str, digits: int = BIG_DIGITS) -> list[tuple[str, Any]]:
    return neighbour_outcomes("bn BIGNUM", "i::BIGNUM", f"INSERT INTO t VALUES ({HOSTILE}, CAST(repeat('9', {digits}) AS BIGNUM))",
                              sql, seed=39)


def test_count_distinct_of_a_bignum_is_refused_for_free_on_neighbours() -> None:
    """A BIGNUM has no size cap (max_text_bytes caps text and BLOB only), and COUNT(DISTINCT col) lists each value as
    its salted text: one person's 10^6-digit value took 1.4 s of CPU to convert, so that cell alone passed the owner's
    statement time-out (the hostile side failed after its charge, the other was answered)."""
    # the refusal is asked of both sides, so without it both are answered and the test fails whatever the value's
    # size: a 10^5-digit value (built in 0.06 s, against about 5 CPU s for 10^6 digits) proves the same
    assert _bignum_outcomes("SELECT COUNT(DISTINCT bn) AS n FROM t", 100_000) == [("error", "UnsupportedQueryError")] * 2


def test_control_a_huge_bignum_tested_for_null_is_answered_on_neighbours() -> None:
    assert _bignum_outcomes("SELECT COUNT(*) AS n FROM t WHERE bn IS NOT NULL", 100_000) == [("ok", None)] * 2


def test_count_of_a_huge_bignum_is_answered_alike_on_neighbours() -> None:
    """COUNT(col) needs only whether each value is NULL: the row choice (k = 1 on a caller's connection races over
    the person's distinct value combinations) and the count read ``col IS NULL``, never the value's text. It read the
    value as its salted text, and converting one person's 10^6-digit BIGNUM took 1.4 s of CPU: that cell alone
    decided whether the statement time-out fired (the hostile side failed after its charge)."""
    assert _bignum_outcomes("SELECT COUNT(bn) AS n FROM t") == [("ok", None)] * 2


@pytest.mark.parametrize("typ", ["BIGNUM", "VARIANT", "STRUCT(b BIGNUM)", "BIGNUM[]"])
def test_count_distinct_of_a_type_holding_a_bignum_is_refused(typ: str) -> None:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t (uid BIGINT, v {typ})")
    with dpsql.Session(budget=dpsql.Budget(1.0), connection=con) as s:
        s.register("t", "t", privacy_unit="uid")
        with pytest.raises(DPSQLError, match="no size cap"):
            s.explain("SELECT COUNT(DISTINCT v) AS n FROM t", epsilon=1.0)
        assert s.explain("SELECT COUNT(v) AS n FROM t", epsilon=1.0).cost.epsilon == 1.0


@pytest.mark.parametrize("how", ["register", "view"])
def test_an_arrow_relation_that_hides_a_registered_table_afterwards_is_refused_free(how: str) -> None:
    # the check at registration alone let the owner (or a library on the connection) hide the registered base
    # table afterwards behind a relation of the same name over an Arrow object: queries then read the Arrow
    # rows, and one person's text that is not UTF-8 failed them after their charge
    outcomes = []
    for hostile in (False, True):
        con = duckdb.connect()
        con.execute("CREATE TABLE base (uid BIGINT, note VARCHAR)")
        con.execute("INSERT INTO base SELECT i, 'ok' || i FROM range(30) t(i)")
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), connection=con)
        use_noise(s, zero_noise(39))
        s.register("t", "base", privacy_unit="uid")
        assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 30}]
        spent = s.remaining()
        arrow = _table(hostile, "text")
        if how == "register":
            con.register("base", arrow)
        else:
            con.register("arrow_src", arrow)
            con.execute("CREATE OR REPLACE TEMP VIEW base AS SELECT * FROM arrow_src")
        with pytest.raises(ConfigError, match="now reads|now resolves") as e:
            s.query("SELECT COUNT(*) AS n FROM t WHERE lower(note) = 'ok1'", epsilon=1.0)
        assert s.remaining() == spent  # nothing charged
        outcomes.append(str(e.value))
        s.close()
    assert outcomes[0] == outcomes[1]
