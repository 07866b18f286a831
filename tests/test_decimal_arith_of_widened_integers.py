"""DECIMAL arithmetic with an integer sum is exact, as in DuckDB: ``(bi - 0.5) - (ti + bi)`` is -3.5 for any BIGINT bi
and TINYINT ti = 3. The integer sum is computed in a type holding every result (HUGEINT), but its proven range has
20 digits, so the DECIMAL result type holds it (DECIMAL(22,1)); in DOUBLE, 2^53 + 1 loses its last digit. At zero
noise every count equals DuckDB's on the same rows."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from _as_duckdb import count_where

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("where", ["(bi - 0.5) - (ti + bi) = -3.5", "(ti + bi) * 0.1 = 900719925474099.6",
                                   "0.5 + (bi - ti) = 9007199254740990.5", "(bi * 2) - 0.5 > 18014398509481985"])
def test_decimal_with_a_widened_integer_answers_as_duckdb(where: str) -> None:
    t = pa.table({"pid": list(range(10)), "bi": pa.array([2**53 + 1] * 5 + [7] * 5, pa.int64()),
                  "ti": pa.array([3] * 10, pa.int8())})
    got, want = count_where(t, where)
    assert want > 0
    assert got == want


@pytest.mark.parametrize("where", ["CAST(CASE WHEN ii > 100 THEN NULL - 1 ELSE ii + 0.5 END AS TINYINT) = -5",
                                   "CAST(COALESCE(ii * NULL, dc) AS VARCHAR) = '2.50'",
                                   "CAST(CASE WHEN ii > 100 THEN dc * NULL ELSE ii END AS VARCHAR) = '-5'"])
def test_arithmetic_with_null_has_duckdbs_type(where: str) -> None:
    """``NULL - 1`` is an INTEGER NULL and ``dc * NULL`` a NULL of no type, as in DuckDB: a CASE of either with
    another branch takes that branch's type (-4.5 rounds to -5 as a DECIMAL; as a DOUBLE it would be -4)."""
    t = pa.table({"pid": list(range(4)), "ii": pa.array([-5] * 4, pa.int32()),
                  "dc": pa.array([2.5] * 4, pa.float64()).cast(pa.decimal128(10, 2))})
    con = duckdb.connect()
    con.register("t", t)
    sql = f"SELECT COUNT(*) AS n FROM t WHERE {where}"
    want = con.execute(sql).fetchone()[0]
    assert want == 4
    with dpsql.Session(budget=Budget(100.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        assert s.query(sql, epsilon=1.0).to_pylist()[0]["n"] == want
