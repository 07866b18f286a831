"""floor() and ceil() of an integer are DOUBLE, as in DuckDB: ``CAST(floor(i) AS VARCHAR)`` is '1.0', an integer
beyond 2^53 is rounded to a DOUBLE, and ``floor(i) // 2`` (DuckDB divides DOUBLEs by ``//`` without flooring) is
refused for free like any ``//`` of DOUBLEs. At zero noise every count equals DuckDB's on the same rows (round() and trunc() of an integer stay integers in both)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from _as_duckdb import count_where

import dpsql
from dpsql.budget import Budget

WHERE = ["CAST(floor(i) AS VARCHAR) = '1.0'", "CAST(ceil(i) AS VARCHAR) = '1'", "floor(b) % 2 = 0",
         "ceil(b) = 9007199254740992", "CAST(round(i) AS VARCHAR) = '1'", "CAST(trunc(i) AS VARCHAR) = '1'",
         "floor(i) = 1", "ceil(i / 2) = 1", "CAST(floor(small) AS VARCHAR) = '2.0'"]


@pytest.mark.parametrize("where", WHERE)
def test_floor_and_ceil_of_integers_answer_as_duckdb(where: str) -> None:
    t = pa.table({"pid": list(range(20)), "i": pa.array([i % 4 for i in range(20)], pa.int32()),
                  "small": pa.array([i % 3 for i in range(20)], pa.int8()),
                  "b": pa.array([2**53 + 1] * 10 + [3] * 10, pa.int64())})
    got, want = count_where(t, where)
    assert got == want


def test_integer_division_of_a_floor_is_refused_for_free() -> None:
    t = pa.table({"pid": [1, 2], "i": pa.array([2, 3], pa.int32())})
    with dpsql.Session(budget=Budget(100.0)) as s:
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="// takes integers"):
            s.query("SELECT COUNT(*) FROM t WHERE floor(i) // 2 = 1", epsilon=1.0)
        assert s.remaining() == Budget(100.0)
