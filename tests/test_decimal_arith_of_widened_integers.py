"""DECIMAL arithmetic with an integer sum is exact, as in DuckDB: ``(bi - 0.5) - (ti + bi)`` is -3.5 for any BIGINT bi
and TINYINT ti = 3. The integer sum is computed in a type holding every result (HUGEINT), but its proven range has
20 digits, so the DECIMAL result type holds it (DECIMAL(22,1)); in DOUBLE, 2^53 + 1 loses its last digit. At zero
noise every count equals DuckDB's on the same rows."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("where", ["(bi - 0.5) - (ti + bi) = -3.5", "(ti + bi) * 0.1 = 900719925474099.6",
                                   "0.5 + (bi - ti) = 9007199254740990.5", "(bi * 2) - 0.5 > 18014398509481985"])
def test_decimal_with_a_widened_integer_answers_as_duckdb(where: str) -> None:
    t = pa.table({"pid": list(range(10)), "bi": pa.array([2**53 + 1] * 5 + [7] * 5, pa.int64()),
                  "ti": pa.array([3] * 10, pa.int8())})
    con = duckdb.connect()
    con.register("t", t)
    sql = f"SELECT COUNT(*) AS n FROM t WHERE {where}"
    want = con.execute(sql).fetchone()[0]
    assert want > 0
    with dpsql.Session(budget=Budget(100.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        assert s.query(sql, epsilon=1.0).to_pylist()[0]["n"] == want
