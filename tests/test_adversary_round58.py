"""The Spark engine under its caller's settings and Spark's own SQL parsing: a query gives the release DuckDB gives
(zero noise, the portable keyed hash) whatever the caller's SparkSession was started with, and nothing outside the
registered data (the driver's environment, system properties, Spark settings) reaches a release.

One caller's SparkSession, started with options a data owner may have in ``spark-defaults.conf``, and one dpsql
Session on it (its ``newSession()`` inherits those options) are shared by the module. Skipped (with the reason)
without pyspark/Java.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from _spark import require_spark

import dpsql
from dpsql.testing import use_noise, zero_noise

require_spark()

#: options of the caller's session (inherited by ``newSession()``) that change how Spark reads SQL text
CALLER_OPTIONS = {"spark.sql.parser.escapedStringLiterals": "true", "spark.sql.parquet.binaryAsString": "true",
                  "spark.sql.parquet.int96AsTimestamp": "false"}
#: the texts the driver substitutes for the variables ('UTC', 'leak') are held by twice as many people
TEXTS = ["UTC", "UTC", "${spark.sql.session.timeZone}", "leak", "leak", "${system:dpsql.round58}", "a\\b", "a\\\\b",
         "o'x", "x"]
N = 30  # people per entry of TEXTS


def _table() -> pa.Table:
    txt = [TEXTS[i % len(TEXTS)] for i in range(N * len(TEXTS))]
    return pa.table({"uid": pa.array(range(len(txt)), pa.int64()), "txt": pa.array(txt, pa.string()),
                     "cat": pa.array(["p", "q"] * (len(txt) // 2), pa.string())})


def _register(s: dpsql.Session) -> None:
    s.register("t", _table(), privacy_unit="uid", max_groups_per_unit=1,
               columns={"cat": {"domain": ["p", "q", "${system:dpsql.round58}"]}})


@pytest.fixture(scope="module")
def sessions() -> Any:
    from pyspark.sql import SparkSession

    from dpsql.engine.spark import spark_session

    base = spark_session()
    jvm = base._jvm
    jvm.java.lang.System.setProperty("dpsql.round58", "leak")  # a value of the driver JVM, no data
    opts = jvm.java.util.HashMap()
    for k, v in CALLER_OPTIONS.items():
        opts.put(k, v)
    caller = SparkSession(base.sparkContext, jsparkSession=jvm.org.apache.spark.sql.classic.SparkSession(
        base._jsc.sc(), opts))
    duck = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), engine={"kind": "duckdb", "keyed_hash": "portable"})
    spark = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), engine="spark", spark=caller)
    for s in (duck, spark):
        _register(s)
    yield duck, spark, caller
    for s in (duck, spark):
        s.close()
    jvm.java.lang.System.clearProperty("dpsql.round58")


def _both(sessions: Any, sql: str, delta: float = 1e-5) -> tuple[list[Any], list[Any]]:
    out = []
    for s in sessions[:2]:
        use_noise(s, zero_noise(5))
        out.append(s.query(sql, epsilon=4.0, delta=delta).table.to_pylist())
    return out[0], out[1]


def test_text_literals_are_not_substituted_with_spark_variables(sessions: Any) -> None:
    """Spark substitutes ``${name}``, ``${system:name}`` and ``${env:name}`` in SQL text before parsing
    (``spark.sql.variable.substitute``, on by default): a literal of the analyst's query, or a declared key, became a
    Spark setting, a system property or an environment variable of the driver, so a count released whether the
    driver's secret environment held a guessed value (and Spark's release differed from DuckDB's)."""
    for sql in ["SELECT COUNT(*) FILTER (WHERE txt = '${spark.sql.session.timeZone}') AS a, "
                "COUNT(*) FILTER (WHERE txt = '${system:dpsql.round58}') AS b FROM t",
                "SELECT cat, COUNT(*) AS n FROM t GROUP BY cat"]:
        duck, spark = _both(sessions, sql)
        assert spark == duck, sql
        # the literal texts' people, and the declared keys (the third key is no variable either: no row holds it)
        assert duck in ([{"a": N, "b": N}], [{"cat": "${system:dpsql.round58}", "n": 0},
                                             {"cat": "p", "n": N * len(TEXTS) // 2},
                                             {"cat": "q", "n": N * len(TEXTS) // 2}]), duck
    # negative control: Spark's own SQL substitutes them
    caller = sessions[2]
    assert caller.sql("SELECT '${system:dpsql.round58}' AS v").collect()[0]["v"] == "leak"


def test_string_literals_keep_their_backslashes_under_the_callers_parser_options(sessions: Any) -> None:
    """A caller's session started with ``spark.sql.parser.escapedStringLiterals`` (Spark 1.6's literals, inherited
    by dpsql's ``newSession()``) read dpsql's rendered literals otherwise: ``'o\\'x'`` and ``'a\\\\b'`` were other
    texts, so counts and computed keys differed from DuckDB's."""
    for sql in ["SELECT COUNT(*) FILTER (WHERE txt = 'o''x') AS a, COUNT(*) FILTER (WHERE txt = 'a\\b') AS b, "
                "COUNT(*) FILTER (WHERE txt LIKE 'a\\%' ESCAPE '!') AS c FROM t",
                "SELECT concat(cat, '\\n') AS k, COUNT(*) AS n FROM t GROUP BY k"]:
        duck, spark = _both(sessions, sql)
        assert spark == duck, sql
        assert all(v not in (0, None) for r in duck for v in r.values())
    # negative control: the caller's session reads literals the legacy way
    assert sessions[2].sql("SELECT 'a\\\\b' AS v").collect()[0]["v"] == "a\\\\b"


def test_a_collated_text_column_is_read_as_duckdb_reads_it(sessions: Any, tmp_path: Any) -> None:
    """Spark 4 writes a column's collation into the Parquet file's Spark metadata (``__COLLATIONS``: a column
    ``STRING COLLATE UTF8_LCASE``), and reads it back so: the column was registered on Spark as
    ``STRING COLLATE UTF8_LCASE`` (compared with nothing, grouped by nothing: every query DuckDB answers over it
    was refused on Spark) where DuckDB reads the file's text. Now it is text compared byte by byte on both."""
    import json

    import pyarrow.parquet as pq

    k = ["a", "A", "b", "ß"] * 30
    meta = {"type": "struct", "fields": [
        {"name": "uid", "type": "long", "nullable": True, "metadata": {}},
        {"name": "k", "type": "string", "nullable": True, "metadata": {"__COLLATIONS": {"k": "spark.UTF8_LCASE"}}}]}
    t = pa.table({"uid": pa.array(range(len(k)), pa.int64()), "k": pa.array(k)}).replace_schema_metadata(
        {b"org.apache.spark.sql.parquet.row.metadata": json.dumps(meta).encode()})
    pq.write_table(t, tmp_path / "c.parquet")
    # negative control: Spark itself reads the column collated, and compares 'a' and 'A' as equal
    raw = sessions[2].read.parquet(str(tmp_path / "c.parquet"))
    assert "UTF8_LCASE" in raw.schema["k"].dataType.simpleString().upper()
    assert raw.where("k = 'a'").count() == 60
    for s in sessions[:2]:
        s.register("coll", str(tmp_path / "c.parquet"), privacy_unit="uid", max_groups_per_unit=1)
    for sql in ["SELECT k, COUNT(*) AS n FROM coll GROUP BY k ORDER BY k",
                "SELECT COUNT(*) FILTER (WHERE k = 'a') AS a, COUNT(*) FILTER (WHERE k < 'b') AS lt, "
                "COUNT(DISTINCT upper(k)) AS u FROM coll"]:
        duck, spark = _both(sessions, sql)
        assert spark == duck, sql
    assert duck == [{"a": 30, "lt": 60, "u": 3}]


def test_parquet_types_are_read_as_stored_whatever_the_callers_reader_options(sessions: Any, tmp_path: Any) -> None:
    """A caller's session started with ``spark.sql.parquet.binaryAsString`` read a BINARY column as text (DuckDB:
    BLOB), so a key DuckDB refuses to group by was grouped on Spark; with ``int96AsTimestamp`` off an INT96
    timestamp was bytes. dpsql's session reads both as the DuckDB engine does."""
    import datetime as dt

    import pyarrow.parquet as pq

    n = 60
    t = pa.table({"uid": pa.array(range(n), pa.int64()), "bin": pa.array([b"x", b"y"] * (n // 2), pa.binary()),
                  "ts": pa.array([dt.datetime(2024, 1, 1, i % 3) for i in range(n)], pa.timestamp("us"))})
    pq.write_table(t, tmp_path / "b.parquet", use_deprecated_int96_timestamps=True)
    # negative control: the caller's session reads the bytes as text, and cannot read the INT96 column
    pq.write_table(t.select(["bin"]), tmp_path / "control.parquet")
    assert sessions[2].read.parquet(str(tmp_path / "control.parquet")).schema["bin"].dataType.simpleString() == "string"
    with pytest.raises(Exception, match="int96AsTimestamp"):
        sessions[2].read.parquet(str(tmp_path / "b.parquet"))
    for s in sessions[:2]:
        s.register("bin", str(tmp_path / "b.parquet"), privacy_unit="uid", max_groups_per_unit=1)
    assert sessions[1].tables["bin"].schema == sessions[0].tables["bin"].schema == {
        "uid": "BIGINT", "bin": "BLOB", "ts": "TIMESTAMP"}
    duck, spark = _both(sessions, "SELECT COUNT(*) FILTER (WHERE ts > TIMESTAMP '2024-01-01 00:30:00') AS n FROM bin")
    assert spark == duck == [{"n": 40}]
