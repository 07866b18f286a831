"""Regression (review finding): range endpoints written with a numeric CAST were read without
applying the cast, so DAWA (and a reused synopsis) answered another range than the SQL asks for.
DuckDB evaluates ``CAST(20.5 AS INTEGER)`` to 21, so ``age <= CAST(20.5 AS INTEGER)`` means
``age <= 21``. Such an endpoint is now read at the value the engine compares with (``plan.folding``: a
DECIMAL cast to an integer rounds half away from zero), in a workload and from a stored synopsis alike."""

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


def test_workload_with_a_cast_endpoint_reads_the_cast_value() -> None:
    s = session(table())
    r = s.query_many([LE20, LE21, CAST_SQL], epsilon=10.0)
    le20, le21, cast = r.table.column("count").to_pylist()
    assert cast == le21 != le20  # age <= 21, as DuckDB casts 20.5 (the synopsis tells 20 and 21 apart)


def test_cast_endpoint_is_answered_from_a_synopsis_at_its_cast_value(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    pq.write_table(table(), p)
    s = session(str(p))
    s.query("SELECT age, COUNT(*) FROM t GROUP BY age", epsilon=10.0)  # stores the synopsis
    before = s.remaining()
    le20, le21, cast = (s.query(q, epsilon=1.0, options={"reuse": "synopsis"}) for q in (LE20, LE21, CAST_SQL))
    assert le21.reused and cast.reused and s.remaining() == before
    assert cast.table.to_pylist() == le21.table.to_pylist() != le20.table.to_pylist()
    truth = sum(1 for i in range(N) if (i * 7) % 101 <= 21)
    assert abs(cast.table.column(0)[0].as_py() - truth) <= 1  # zero noise; the synopsis's rounding


def test_date_literals_are_still_range_endpoints() -> None:
    import datetime as dt

    days = [dt.date(2026, 1, 1) + dt.timedelta(days=i % 60) for i in range(N)]
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("d", pa.table({"uid": pa.array(range(N), pa.int64()), "day": days}), privacy_unit="uid",
               max_rows_per_unit=1, columns={"day": {"bounds": ("2026-01-01", "2026-03-02"), "bin_width": "1 day"}})
    r = s.query_many(["SELECT COUNT(*) FROM d WHERE day >= DATE '2026-01-10' AND day < CAST('2026-01-20' AS DATE)"],
                     epsilon=10.0)
    assert r.mechanism == "dawa" and r.table.column("count").to_pylist() == [sum(1 for x in days if
                                                                               dt.date(2026, 1, 10) <= x < dt.date(2026, 1, 20))]
