"""Adversarial: range endpoints written with a CAST are read by ``ranges._literal_value``
without applying the cast, so DAWA (and a reused synopsis) answers a different range than
the SQL asks for, silently (no ``snapped_to_bins`` note). DuckDB evaluates
``CAST(20.5 AS INTEGER)`` to 21, so ``age <= CAST(20.5 AS INTEGER)`` means ``age <= 21``."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise

N = 3000
CAST_SQL = "SELECT COUNT(*) FROM t WHERE age <= CAST(20.5 AS INTEGER)"
LE20 = "SELECT COUNT(*) FROM t WHERE age <= 20"
LE21 = "SELECT COUNT(*) FROM t WHERE age <= 21"


def table() -> pa.Table:
    return pa.table({"uid": pa.array(range(N), pa.int64()), "age": pa.array([(i * 7) % 101 for i in range(N)], pa.int64())})


def session(source: object) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", source, privacy_unit="uid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 100), "bins": 101}})
    return s


def test_duckdb_semantics_of_the_cast() -> None:
    assert duckdb.sql("SELECT CAST(20.5 AS INTEGER)").fetchall() == [(21,)]


def test_workload_answers_the_cast_range_as_written_by_duckdb() -> None:
    s = session(table())
    r = s.query_many([LE20, LE21, CAST_SQL], epsilon=10.0)
    le20, le21, cast = r.table.column("count").to_pylist()
    assert le20 != le21  # the synopsis tells the two ranges apart
    assert cast == le21 or 2 in (r.details.get("snapped_to_bins") or [])


def test_reused_synopsis_answers_the_cast_range_as_written_by_duckdb(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    pq.write_table(table(), p)
    s = session(str(p))
    s.query("SELECT age, COUNT(*) FROM t GROUP BY age", epsilon=10.0)  # stores the synopsis
    le20 = s.query(LE20, epsilon=1.0)
    le21 = s.query(LE21, epsilon=1.0)
    cast = s.query(CAST_SQL, epsilon=1.0)
    assert le20.reused and le21.reused and cast.reused
    assert le20.table.column(0)[0].as_py() != le21.table.column(0)[0].as_py()
    assert cast.table.column(0)[0].as_py() == le21.table.column(0)[0].as_py() or "snapped_to_bins" in cast.details
