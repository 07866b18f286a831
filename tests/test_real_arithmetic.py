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
         # a REAL divided by a REAL, an integer or a DECIMAL is a REAL quotient (32 bits), as in DuckDB: 0.7 / 10 is then
         # the REAL 0.07, equal to 0.07 compared in REAL (a 64-bit quotient of the REAL 0.699999988 is not)
         "r / i = 0.07", "r / 10 = 0.07", "r / d = 0.07", "r / CAST(i AS REAL) = 0.07", "i / r > 14.2857141",
         "CAST(r / i AS VARCHAR) = '0.07'", "r / i * i = r", "r / 0.1 = 7", "r / big > 0", "r / 0 = CAST('inf' AS REAL)",
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


def test_a_real_quotient_as_a_key_and_a_distinct_value_is_duckdbs() -> None:
    """A REAL quotient released as a GROUP BY key (and counted as distinct values) is DuckDB's REAL, not the 64-bit
    quotient of the REALs (0.7 / 10 was released as 0.0699999988 where DuckDB's key is 0.0700000003)."""
    import duckdb

    import dpsql
    from dpsql.budget import Budget
    from dpsql.testing import use_noise, zero_noise

    t = pa.table({"pid": list(range(200)), "r": pa.array([0.7] * 100 + [0.2] * 100, pa.float32()),
                  "i": pa.array([10] * 100 + [3] * 100, pa.int32())})
    con = duckdb.connect()
    con.register("t", t)
    for sql in ("SELECT r / i AS k, COUNT(*) AS n FROM t GROUP BY r / i ORDER BY k",
                "SELECT i / r AS k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k"):
        want = [dict(zip(("k", "n"), row)) for row in con.execute(sql).fetchall()]
        with dpsql.Session(budget=Budget(100.0, 1e-3)) as s:
            use_noise(s, zero_noise())
            s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
            assert s.query(sql, epsilon=1.0, delta=1e-6).to_pylist() == want, sql
    # not vacuous: the key of 0.7 / 10 is the REAL quotient, not the 64-bit one
    first = con.execute("SELECT r / i AS k FROM t WHERE i = 10 LIMIT 1").fetchone()[0]  # type: ignore[index]
    assert first == float(pa.scalar(0.07, pa.float32()).as_py()) != float(pa.scalar(0.7, pa.float32()).as_py()) / 10


# a number literal met by a REAL is rounded to a REAL once, as DuckDB converts it: 2^60 + 2^36 + 1 is the REAL
# 2^60 + 2^37 (through the DOUBLE 2^60 + 2^36, a tie, it was 2^60), and so is the BIGINT column holding it; a negated
# DECIMAL zero is zero (DuckDB's DECIMAL has no -0), so x / -0.0 is +inf, not -inf
EXACT = ["r / 1152921573326323713 = r / big", "r * 1152921573326323713 = r * big", "r + 1152921573326323713 = r + big",
         "r / 1152921573326323713.0 = r / big", "r = 1152921573326323713", "r < 1152921573326323713",
         "r / -0.0 > 0", "x / -0.0 > 0", "i / -0.00 > 0", "r / CAST(-0.0 AS DOUBLE) > 0", "x / -(0.0) > 0"]


@pytest.mark.parametrize("where", EXACT)
def test_a_literal_converts_once_as_in_duckdb(where: str) -> None:
    t = pa.table({"pid": list(range(20)), "r": pa.array([1.0] * 10 + [1152921642045800448.0] * 10, pa.float32()),
                  "i": pa.array([10] * 20, pa.int32()), "x": [10.0] * 20,
                  "big": pa.array([2**60 + 2**36 + 1] * 20, pa.int64())})
    got, want = count_where(t, where)
    assert got == want
