"""Parquet INT96 timestamps (the legacy type Spark, Hive and Impala write) are read as stored.

Finding: the Arrow view read an INT96 column as pyarrow's default ``timestamp[ns]``, which silently
wraps every instant outside 1677-09-22 .. 2262-04-11: the common "end of time" sentinel
9999-12-31 23:59:59.999999 was read as 1816-03-29, 0001-01-01 as 1754-08-30. A query answered a
silently different question (``WHERE ts > TIMESTAMP '2500-01-01'`` counted none of those rows; DuckDB's
own reader, Spark and the Parquet file say otherwise). INT96 is now read in microseconds, the unit
of DuckDB's TIMESTAMP, so every instant of the TIMESTAMP range is exact; the range test of the
view still makes an instant beyond it NULL.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

TS = [dt.datetime(2020, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1, 1, 1),
      dt.datetime(1500, 6, 1, 12, 0, 0, 123456), dt.datetime(2300, 1, 1), None]


def _file(tmp_path: Path, name: str = "t.parquet", ts: list[dt.datetime | None] = TS, first: int = 0) -> str:
    path = str(tmp_path / name)
    t = pa.table({"uid": list(range(first, first + len(ts))), "ts": pa.array(ts, pa.timestamp("us"))})
    pq.write_table(t, path, use_deprecated_int96_timestamps=True)
    assert "int96" in str(pq.ParquetFile(path).schema)  # the file really stores INT96
    return path


def _count(s: dpsql.Session, where: str) -> int:
    r = s.query(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1e3, delta=0)
    return int(r.table.column(0)[0].as_py())


@pytest.mark.parametrize("where", ["ts > TIMESTAMP '2500-01-01'", "ts < TIMESTAMP '1000-01-01'",
                                   "ts = TIMESTAMP '1500-06-01 12:00:00.123456'", "ts >= TIMESTAMP '2262-05-01'",
                                   "year(ts) = 9999", "ts IS NULL"])
def test_int96_instants_outside_the_nanosecond_range_are_read_as_stored(tmp_path: Path, where: str) -> None:
    path = _file(tmp_path)
    truth = duckdb.sql(f"SELECT COUNT(*) FROM read_parquet('{path}') WHERE {where}").fetchall()[0][0]
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", path, privacy_unit="uid", max_groups_per_unit=1)
    assert _count(s, where) == truth


def test_int96_and_nanosecond_files_of_one_column_are_refused(tmp_path: Path) -> None:
    """An INT96 file read in microseconds and a file of true nanoseconds store the column under different
    types: read as one, one of them would be off by a factor of 1000, so the source is refused (free)."""
    _file(tmp_path, "a.parquet", [dt.datetime(2020, 1, 1)])
    pq.write_table(pa.table({"uid": [9], "ts": pa.array([dt.datetime(2020, 1, 2)], pa.timestamp("ns"))}),
                   str(tmp_path / "b.parquet"))
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5))
    with pytest.raises(dpsql.errors.ConfigError, match="column 'ts'"):
        s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid")


def test_two_int96_files_read_together(tmp_path: Path) -> None:
    _file(tmp_path, "a.parquet", TS[:3])
    _file(tmp_path, "b.parquet", TS[3:], first=3)
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid", max_groups_per_unit=1)
    assert _count(s, "ts > TIMESTAMP '2262-05-01'") == 2
