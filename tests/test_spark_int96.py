"""A Parquet INT96 timestamp column (the legacy type Spark, Hive and Impala write; Spark's own default output
type) registers on Spark as DuckDB reads it, a TIMESTAMP without a time zone, and both engines answer the same
queries over it alike. Spark read it as TIMESTAMP_LTZ, which dpsql registered as TIMESTAMPTZ (IS NULL only):
every comparison, date part or grid over it was refused on Spark and answered on DuckDB."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import comparable_session, require_spark

import dpsql

require_spark()

N = 60
STAMPS = [dt.datetime(2024, 1, 2, 3, 4, 5, 6000), dt.datetime(1900, 12, 31, 23, 59, 59), dt.datetime(2024, 6, 30, 23, 0),
          dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None]
QUERIES = [
    "SELECT COUNT(*) AS n FROM t WHERE ts > TIMESTAMP '2000-01-01'",
    "SELECT year(ts) AS y, COUNT(*) AS n FROM t GROUP BY y",
    "SELECT date_trunc('day', ts) AS d, COUNT(*) AS n FROM t GROUP BY d",
    "SELECT COUNT(*) AS n FROM t WHERE ts IS NULL",
]


def _session(kind: str, path: str) -> dpsql.Session:
    s = comparable_session(kind, (1000.0, 0.5))
    s.register("t", path, privacy_unit="uid", max_groups_per_unit=1, max_rows_per_unit=1)
    return s


def test_an_int96_column_registers_and_answers_as_on_duckdb(tmp_path: Path) -> None:
    path = str(tmp_path / "legacy.parquet")
    stamps = [STAMPS[i % len(STAMPS)] for i in range(N)]
    pq.write_table(pa.table({"uid": list(range(N)), "ts": pa.array(stamps, pa.timestamp("us", tz="UTC")),
                             "plain": pa.array(stamps, pa.timestamp("us"))}), path, use_deprecated_int96_timestamps=True)
    assert "int96" in str(pq.ParquetFile(path).schema)
    assert {r[0]: r[1] for r in duckdb.sql(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()}["ts"] == "TIMESTAMP"
    got = []
    for kind in ("duckdb", "spark"):
        s = _session(kind, path)
        try:
            assert s.tables["t"].schema["ts"] == s.tables["t"].schema["plain"] == "TIMESTAMP", kind
            got.append([sorted(map(repr, s.query(q, epsilon=1.0, delta=1e-5).table.to_pylist())) for q in QUERIES])
        finally:
            s.close()
    assert got[0] == got[1]
    assert got[0][0] == [repr({"n": 36})]  # 2024 twice and 9999 in every five rows, as stored


@pytest.mark.parametrize("kw", [{}, {"coerce_timestamps": "us"}])
def test_a_timestamp_with_a_time_zone_stored_as_int64_stays_a_timestamptz(tmp_path: Path, kw: dict[str, Any]) -> None:
    """Negative control: an INT64 timestamp adjusted to UTC is TIMESTAMPTZ on both engines, as before."""
    path = str(tmp_path / "utc.parquet")
    pq.write_table(pa.table({"uid": [1, 2], "ts": pa.array(STAMPS[:2], pa.timestamp("us", tz="UTC"))}), path, **kw)
    for kind in ("duckdb", "spark"):
        s = _session(kind, path)
        try:
            assert s.tables["t"].schema["ts"] == "TIMESTAMP WITH TIME ZONE", kind
        finally:
            s.close()
