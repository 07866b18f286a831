"""Which relations of the caller's DuckDB connection dpsql reads: an allow-list of plan operators.

A table of the caller's connection is read through a view; a relation whose bound plan reads anything but
DuckDB's own stored tables, or values the plan makes itself (VALUES, ``range``, a CTE, ...), is refused at
registration and before every charge (free, from the plan; no row is read). A deny-list of reader names missed
extension scans (``POSTGRES_SCAN``, ``MYSQL_SCAN``, ``ST_READ``, ...), DuckDB's own table functions that are not
readers by name (``glob``, ``duckdb_settings``, ``test_all_types``), and any table function added later: such a
scan converts or makes values while reading, where one person's value can fail a query after its charge.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.engine._duckdb_sources import reading_scans
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

MODES = ["physical_only", "optimized_only", "all"]


def _count(con: duckdb.DuckDBPyConnection, source: str) -> Any:
    with dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), connection=con) as s:
        use_noise(s, zero_noise(7))
        s.register("t", source, privacy_unit="uid")
        return s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist()


def _refused(con: duckdb.DuckDBPyConnection, source: str, operator: str) -> None:
    with dpsql.Session(budget=dpsql.Budget(1.0), connection=con) as s:
        with pytest.raises(ConfigError, match=operator) as e:
            s.register("t", source, privacy_unit="uid")
        assert "t" not in s.tables
        assert "materialise the relation" in str(e.value)


# -- read ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_tables_temp_tables_and_tables_with_indexes_and_constraints_are_read(mode: str) -> None:
    con = duckdb.connect()
    con.execute(f"SET explain_output = '{mode}'")
    con.execute("CREATE TABLE plain AS SELECT i AS uid FROM range(20) r(i)")
    con.execute("CREATE TEMP TABLE tmp AS SELECT i AS uid FROM range(21) r(i)")
    con.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    con.execute("INSERT INTO parent VALUES (1)")
    con.execute("CREATE TABLE keyed (uid BIGINT PRIMARY KEY, note VARCHAR UNIQUE, x INTEGER DEFAULT 1 CHECK (x > 0), "
                "p INTEGER REFERENCES parent(id), g INTEGER GENERATED ALWAYS AS (x * 2) VIRTUAL)")
    con.execute("CREATE INDEX keyed_x ON keyed (x)")
    con.execute("INSERT INTO keyed (uid, note, x, p) SELECT i, 'n' || i, 1 + i % 3, 1 FROM range(22) r(i)")
    assert _count(con, "plain") == [{"n": 20}]
    assert _count(con, "tmp") == [{"n": 21}]
    assert _count(con, "keyed") == [{"n": 22}]


@pytest.mark.parametrize("mode", MODES)
def test_a_table_of_an_attached_duckdb_file_is_read(tmp_path: Path, mode: str) -> None:
    con = duckdb.connect()
    con.execute(f"SET explain_output = '{mode}'")
    con.execute(f"ATTACH '{tmp_path / 'other.duckdb'}' AS other")
    con.execute("CREATE TABLE other.main.people AS SELECT i AS uid FROM range(23) r(i)")
    assert _count(con, "other.main.people") == [{"n": 23}]
    con.execute("CREATE VIEW people_v AS SELECT * FROM other.main.people WHERE uid < 10")
    assert _count(con, "people_v") == [{"n": 10}]


@pytest.mark.parametrize("mode", MODES)
def test_views_over_tables_values_range_unnest_and_ctes_are_read(mode: str) -> None:
    con = duckdb.connect()
    con.execute(f"SET explain_output = '{mode}'")
    con.execute("CREATE TABLE raw AS SELECT i AS uid, [i, i + 1] AS l FROM range(10) r(i)")
    con.execute("""CREATE VIEW mixed AS
        WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 3), c AS MATERIALIZED (SELECT uid FROM raw)
        SELECT uid FROM c WHERE uid IN (SELECT uid FROM raw WHERE raw.uid = c.uid)
        UNION ALL SELECT * FROM (VALUES (100), (101)) v(uid)
        UNION ALL SELECT 200 + i FROM range(3) g(i)
        UNION ALL SELECT 300 + i FROM generate_series(1, 2) g(i)
        UNION ALL SELECT 400 + k FROM raw, unnest(raw.l) u(k) WHERE raw.uid = 0
        UNION ALL SELECT 500 + i FROM r
        UNION ALL SELECT 600 FROM raw WHERE false
        UNION ALL SELECT a.uid FROM raw a POSITIONAL JOIN raw b
        UNION ALL SELECT a.uid FROM (SELECT uid FROM raw LIMIT 1) a POSITIONAL JOIN (SELECT 1 AS z)""")
    con.execute("CREATE VIEW summed AS SELECT uid, COUNT(*) OVER () AS w FROM raw GROUP BY uid ORDER BY uid")
    assert _count(con, "mixed") == [{"n": 10 + 2 + 3 + 2 + 2 + 3}]  # people (uid), each counted once
    assert _count(con, "summed") == [{"n": 10}]


# -- refused ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rel,operator", [
    ("duckdb_settings()", "DUCKDB_SETTINGS"), ("pragma_table_info('raw')", "PRAGMA_TABLE_INFO"), ("glob('*')", "GLOB"),
    ("test_all_types()", "TEST_ALL_TYPES"), ("repeat(1, 3)", "REPEAT"),
])
def test_a_table_function_not_on_the_list_is_refused(rel: str, operator: str) -> None:
    # none of these reads a person's value, but dpsql reads only what it knows: a table function it does not know
    # (an extension's, a later DuckDB's) may convert values while reading, and is refused by name
    con = duckdb.connect()
    con.execute("CREATE TABLE raw (uid BIGINT)")
    con.execute(f"CREATE VIEW events AS SELECT uid FROM raw UNION ALL SELECT 1::BIGINT FROM {rel}")
    _refused(con, "events", operator)


@pytest.mark.parametrize("kind", ["arrow", "numpy", "pandas"])
def test_python_objects_registered_with_the_connection_are_refused(kind: str) -> None:
    con = duckdb.connect()
    if kind == "pandas":
        pd = pytest.importorskip("pandas")
        con.register("events", pd.DataFrame({"uid": [1, 2]}))
    elif kind == "numpy":
        con.register("events", {"uid": np.array([1, 2])})
    else:
        con.register("events", pa.table({"uid": [1, 2]}))
    _refused(con, "events", "PANDAS_SCAN" if kind != "arrow" else "PYTHON_ARROW_SCAN")


@pytest.mark.parametrize("how", ["query_table", "query", "macro", "positional", "subquery"])
def test_an_arrow_object_reached_indirectly_is_refused(how: str) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE raw AS SELECT i AS uid FROM range(5) r(i)")
    con.register("arr", pa.table({"uid": [1, 2]}))
    con.execute("CREATE MACRO below(n) AS TABLE SELECT * FROM arr WHERE uid < n")
    rel = {"query_table": "SELECT * FROM query_table('arr')", "query": "SELECT * FROM query('SELECT * FROM arr')",
           "macro": "SELECT * FROM below(5)", "positional": "SELECT raw.uid FROM raw POSITIONAL JOIN arr",
           "subquery": "SELECT uid FROM raw WHERE uid IN (SELECT uid FROM arr)"}[how]
    con.execute(f"CREATE VIEW events AS {rel}")
    _refused(con, "events", "PYTHON_ARROW_SCAN")


@pytest.mark.parametrize("reader,operator", [
    ("read_parquet('{d}/a.parquet')", "READ_PARQUET"), ("parquet_scan('{d}/a.parquet')", "PARQUET_SCAN"),
    ("'{d}/a.parquet'", "PARQUET_SCAN"), ("read_csv('{d}/a.csv')", "READ_CSV"), ("'{d}/a.csv'", "READ_CSV_AUTO"),
    ("read_json('{d}/a.json')", "READ_JSON"), ("read_json_auto('{d}/a.json')", "READ_JSON_AUTO"),
    ("read_ndjson_objects('{d}/a.json')", "READ_NDJSON_OBJECTS"),
    ("(SELECT 1 AS uid, content FROM read_text('{d}/a.csv'))", "READ_TEXT"),
    ("(SELECT 1 AS uid, content FROM read_blob('{d}/a.csv'))", "READ_BLOB"),
    ("(SELECT 1 AS uid, Delimiter FROM sniff_csv('{d}/a.csv'))", "SNIFF_CSV"),
    ("(SELECT 1 AS uid, file_name FROM parquet_metadata('{d}/a.parquet'))", "PARQUET_METADATA"),
])
def test_duckdbs_file_readers_are_refused(tmp_path: Path, reader: str, operator: str) -> None:
    pq.write_table(pa.table({"uid": [1, 2]}), tmp_path / "a.parquet")
    (tmp_path / "a.csv").write_text("uid\n1\n2\n")
    (tmp_path / "a.json").write_text('{"uid": 1}\n{"uid": 2}\n')
    con = duckdb.connect()
    con.execute(f"CREATE VIEW events AS SELECT * FROM {reader.format(d=tmp_path)}")
    _refused(con, "events", operator)


@pytest.mark.parametrize("hide", ["duckdb_settings()", "glob('*')"])
def test_a_registered_table_hidden_afterwards_by_an_unknown_table_function_is_refused_free(hide: str) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE base AS SELECT i AS uid FROM range(30) r(i)")
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), connection=con)
    use_noise(s, zero_noise(7))
    s.register("t", "base", privacy_unit="uid")
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 30}]
    spent = s.remaining()
    con.execute(f"CREATE OR REPLACE TEMP VIEW base AS SELECT 1::BIGINT AS uid FROM {hide}")
    with pytest.raises(ConfigError, match="now reads|now resolves"):
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    assert s.remaining() == spent
    s.close()


# -- the list itself ----------------------------------------------------------------------------------------------
def _node(name: str, *children: dict[str, Any], **info: str) -> dict[str, Any]:
    return {"name": name, "children": list(children), "extra_info": dict(info)}


def test_extension_scans_and_unknown_operators_are_named() -> None:
    plan = [_node("UNION",
                  _node("POSTGRES_SCAN", Function="POSTGRES_SCAN"), _node("MYSQL_SCAN"), _node("ST_READ", Function="ST_READ"),
                  _node("READ_XLSX", Function="READ_XLSX"), _node("DUCKLAKE_SCAN"), _node("ICEBERG_SCAN"),
                  _node("SEQ_SCAN", Function="SQLITE_SCAN"), _node("INOUT_FUNCTION", Name="json_each"),
                  _node("INOUT_FUNCTION"), _node("CUSTOM_OP"), _node("EXTENSION"), _node("HTTPFS_READ"))]
    assert sorted(reading_scans(json.dumps(plan))) == sorted([
        "POSTGRES_SCAN", "MYSQL_SCAN", "ST_READ", "READ_XLSX", "DUCKLAKE_SCAN", "ICEBERG_SCAN", "SQLITE_SCAN",
        "JSON_EACH", "INOUT_FUNCTION", "CUSTOM_OP", "EXTENSION", "HTTPFS_READ"])


def test_duckdbs_own_operators_are_allowed() -> None:
    plan = [_node("PROJECTION", _node("HASH_JOIN", _node("SEQ_SCAN", Table="memory.main.t", Type="Sequential Scan"),
                                      _node("INOUT_FUNCTION", _node("CTE_SCAN"), Name="unnest")),
                  _node("PERFECT_HASH_GROUP_BY", _node("RANGE", Function="RANGE")),
                  _node("COMPARISON_JOIN", _node("EXPRESSION_GET", _node("DUMMY_SCAN")), _node("DELIM_GET")),
                  _node("TABLE_SCAN", Function="SEQ_SCAN"), _node("EMPTY_RESULT"), _node("COLUMN_DATA_SCAN"))]
    assert reading_scans(json.dumps(plan)) == []
