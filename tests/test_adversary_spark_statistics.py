"""The Spark engine reads Parquet without its row-group statistics, as the DuckDB engine does
(``tests/test_adversary_scan_statistics.py``): Spark pushes a filter such as ``x > 5000`` into its
Parquet reader, which skips each row group whose max is at most 5000, so one person's extreme value
switched a query from reading nothing to reading that person's row group. dpsql's own Spark session
turns the pushdown off (``spark.sql.parquet.filterPushdown``), whatever the caller's session sets.
Skipped (with the reason) without pyspark/Java."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _spark import require_spark

import dpsql
from dpsql.engine.spark import PLAN_CONF
from dpsql.testing import use_noise, zero_noise

require_spark()


def test_dpsql_spark_session_reads_parquet_without_row_group_filters(tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    assert PLAN_CONF["spark.sql.parquet.filterPushdown"] == "false"
    caller = SparkSession.builder.master("local[1]").getOrCreate()
    caller.conf.set("spark.sql.parquet.filterPushdown", "true")
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"uid": list(range(40)), "x": [i % 7 for i in range(39)] + [10**9]}), path,
                   row_group_size=8)
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine="spark", spark=caller)
    try:
        use_noise(s, zero_noise())
        s.register("t", str(path), privacy_unit="uid", columns={"x": {"bounds": (0, 10)}})
        engine_spark = s._engine.spark  # type: ignore[attr-defined]
        assert engine_spark.conf.get("spark.sql.parquet.filterPushdown") == "false"
        r = s.query("SELECT COUNT(*) AS n FROM t WHERE x > 5000", epsilon=1.0, delta=1e-6)
        assert r.table.to_pylist() == [{"n": 1}]
        assert caller.conf.get("spark.sql.parquet.filterPushdown") == "true"  # the caller's own stays
    finally:
        s.close()


def test_dpsql_spark_session_sets_its_sql_settings_back_before_every_read(tmp_path: Path) -> None:
    # the exact reading of a wide DECIMAL (its bytes times 10^-s) relies on allowPrecisionLoss off, and totality
    # on ANSI's settings: a change made on dpsql's own session after its start is set back before each read
    from decimal import Decimal

    from pyspark.sql import SparkSession

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"uid": list(range(3)), "d": pa.array([Decimal("1.2345678901")] * 3, pa.decimal128(38, 10))}),
                   path)
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine="spark", spark=SparkSession.builder.getOrCreate())
    try:
        use_noise(s, zero_noise())
        s.register("t", str(path), privacy_unit="uid")
        engine_spark = s._engine.spark  # type: ignore[attr-defined]
        for k, v in (("spark.sql.decimalOperations.allowPrecisionLoss", "true"), ("spark.sql.ansi.enabled", "false"),
                     ("spark.sql.session.timeZone", "America/New_York")):
            engine_spark.conf.set(k, v)
        r = s.query("SELECT COUNT(*) AS n FROM t WHERE d = 1.2345678901", epsilon=1.0, delta=1e-6)
        assert r.table.to_pylist() == [{"n": 3}]
        assert engine_spark.conf.get("spark.sql.decimalOperations.allowPrecisionLoss") == "false"
        assert engine_spark.conf.get("spark.sql.ansi.enabled") == "true"
        assert engine_spark.conf.get("spark.sql.session.timeZone") == "UTC"
    finally:
        s.close()
