"""A REAL (FLOAT) with an integer or DECIMAL is computed and compared in REAL, as in DuckDB (its common type of the
two): ``r * i = 7`` holds for r = 0.7 (the REAL 0.699999988...) and i = 10, whose REAL product rounds to 7.0; with
a DOUBLE it stays a DOUBLE. At zero noise every count equals DuckDB's on the same rows."""

from __future__ import annotations

import pyarrow as pa
import pytest
from _as_duckdb import count_where

WHERE = ["r * i >= 7", "r * i = 7", "r * d >= 7", "r + i >= 10.7", "r * 10 >= 7", "r * CAST(i AS REAL) >= 7",
         "r * x >= 7", "r < i", "r * i - 7 = 0", "CAST(r * i AS VARCHAR) = '7.0'", "r * i IN (7, 8)",
         "GREATEST(r * i, 0) = 7", "r * big > 0",
         "r / 1e1 = 0.07", "r / x = 0.07", "r / 0 > 1e300",
         # a number cast to REAL is a REAL too, never a flexible number: 16777217 compared with it is the REAL 16777216
         "i + 16777207 = CAST(16777216 AS REAL)", "big - 1 = CAST(4611686018427387904 AS REAL)",
         "i + 16777207 IN (CAST(16777216 AS REAL), 3)"]


@pytest.mark.parametrize("where", WHERE)
def test_real_arithmetic_answers_as_duckdb(where: str) -> None:
    t = pa.table({"pid": list(range(20)), "r": pa.array([0.7] * 10 + [0.2] * 10, pa.float32()),
                  "i": pa.array([10] * 20, pa.int32()), "d": pa.array([10] * 20, pa.decimal128(5, 1)),
                  "x": [10.0] * 20, "big": pa.array([2**62] * 20, pa.int64())})
    got, want = count_where(t, where)
    assert got == want
