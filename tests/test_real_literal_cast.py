"""A literal cast to REAL holds the number rounded to 32 bits, as in DuckDB: ``x < CAST(0.1 AS REAL)`` over a DOUBLE
column compares with 0.100000001490116..., so a row holding the DOUBLE 0.1 passes. At zero noise the count equals
DuckDB's; negative control: ``x < 0.1`` passes none of them."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from _as_duckdb import count_where

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize(("where", "want"), [("x < CAST(0.1 AS REAL)", 10), ("x < 0.1", 0),
                                             ("x = CAST(0.5 AS REAL)", 10), ("x <= CAST(0.7 AS FLOAT)", 20)])
def test_a_real_literal_compares_at_its_rounded_value(where: str, want: int) -> None:
    t = pa.table({"pid": list(range(20)), "x": [0.1] * 10 + [0.5] * 10})
    con = duckdb.connect()
    con.register("t", t)
    sql = f"SELECT COUNT(*) AS n FROM t WHERE {where}"
    assert con.execute(sql).fetchone()[0] == want
    with dpsql.Session(budget=Budget(100.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        assert s.query(sql, epsilon=1.0).to_pylist()[0]["n"] == want


#: a REAL column compared with DOUBLE literals (7e-1, CAST(0.7 AS DOUBLE): no flexible number) is compared in DOUBLE
#: by DuckDB, with a plain number (0.7, 1) in REAL; a DOUBLE column with a REAL literal at the REAL's value
REAL_COLUMN = ["r < 7e-1", "r IN (7e-1, 0.1)", "r IN (0.7, 0.1)", "r BETWEEN 0.1 AND 7e-1", "r < CAST(0.7 AS DOUBLE)",
               "r = 3e-1", "r = 0.3", "r <> 1e-1", "r > 1e-1", "COALESCE(r, 7e-1) < 0.7", "abs(r) < 7e-1",
               "CASE WHEN r > 0.5 THEN r ELSE 7e-1 END < 0.7", "NULLIF(r, 7e-1) < 1", "r + 1e0 > 1.7", "r * 10 > 7",
               "x < CAST(0.1 AS REAL) * 1", "x IN (CAST(0.1 AS REAL))", "x < CAST(0.7 AS REAL)"]


def test_real_and_double_literals_compare_as_in_duckdb() -> None:
    vals = [0.1, 0.7, 1.0, 2.0, 0.3]
    t = pa.table({"pid": list(range(60)), "r": pa.array([vals[i % 5] for i in range(60)], pa.float32()),
                  "x": [vals[i % 5] for i in range(60)]})
    con = duckdb.connect()
    con.register("t", t)
    with dpsql.Session(budget=Budget(1000.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        for w in REAL_COLUMN:
            sql = f"SELECT COUNT(*) AS n FROM t WHERE {w}"
            assert s.query(sql, epsilon=1.0).to_pylist()[0]["n"] == con.execute(sql).fetchone()[0], w


@pytest.mark.parametrize("where", ["bi <> ceil(CAST(2.5 AS DOUBLE) % -(dc))", "CAST(i + 1e0 AS VARCHAR) = '2.0'",
                                   "CAST(dc * CAST(2 AS DOUBLE) AS VARCHAR) = '5.0'", "i + 1e0 = 2", "dc < 3e0"])
def test_a_double_literal_makes_the_arithmetic_double(where: str) -> None:
    """A DOUBLE literal (scientific notation, or a number cast to DOUBLE) is computed with as a DOUBLE, as in DuckDB:
    ``CAST(2.5 AS DOUBLE) % dc`` is NaN where dc is 0 (not NULL), ``i + 1e0`` is spelled '2.0'."""
    import decimal

    t = pa.table({"pid": list(range(20)), "i": pa.array([1, 2] * 10, pa.int32()), "bi": pa.array([7] * 20, pa.int64()),
                  "dc": pa.array([decimal.Decimal("0.00"), decimal.Decimal("2.50")] * 10, pa.decimal128(10, 2))})
    got, want = count_where(t, where)
    assert want > 0
    assert got == want
