"""Unary minus and + - * of integers are computed in a type holding the operands and the result: ``-(abs(2147483648))`` is
-2147483648 (an INTEGER), but its operand 2147483648 is a BIGINT; cast into INTEGER first it was NULL, and every
comparison with it was false; likewise ``bi * 0`` of a BIGINT bi is 0, not NULL. At zero noise every count equals DuckDB's on the same rows."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("where", ["ti >= -(abs(2147483648))", "2 BETWEEN -(abs(2147483648)) AND ti",
                                   "-(CAST(ii AS BIGINT) + 1) = -2147483648", "-(CAST(ii AS BIGINT) + 1) < 0",
                                   "bi * 0 + ti = 5", "abs(2147483648) - abs(2147483648) + ti = 5",
                                   "(abs(2147483648) - 2147483648) = 0", "(ti + abs(bi)) - abs(bi) = 5"])
def test_negation_keeps_its_operand(where: str) -> None:
    t = pa.table({"pid": list(range(10)), "ti": pa.array([5] * 10, pa.int8()),
                  "ii": pa.array([2147483647] * 5 + [3] * 5, pa.int32()),
                  "bi": pa.array([2**40] * 10, pa.int64())})
    con = duckdb.connect()
    con.register("t", t)
    sql = f"SELECT COUNT(*) AS n FROM t WHERE {where}"
    want = con.execute(sql).fetchone()[0]
    assert want > 0
    with dpsql.Session(budget=Budget(100.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        assert s.query(sql, epsilon=1.0).to_pylist()[0]["n"] == want
