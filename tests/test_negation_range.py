"""Unary minus and + - * of integers are computed in a type holding the operands and the result: ``-(abs(2147483648))`` is
-2147483648 (an INTEGER), but its operand 2147483648 is a BIGINT; cast into INTEGER first it was NULL, and every
comparison with it was false; likewise ``bi * 0`` of a BIGINT bi is 0, not NULL. At zero noise every count equals DuckDB's on the same rows."""

from __future__ import annotations

import pyarrow as pa
import pytest
from _as_duckdb import count_where


@pytest.mark.parametrize("where", ["ti >= -(abs(2147483648))", "2 BETWEEN -(abs(2147483648)) AND ti",
                                   "-(CAST(ii AS BIGINT) + 1) = -2147483648", "-(CAST(ii AS BIGINT) + 1) < 0",
                                   "bi * 0 + ti = 5", "abs(2147483648) - abs(2147483648) + ti = 5",
                                   "(abs(2147483648) - 2147483648) = 0", "(ti + abs(bi)) - abs(bi) = 5"])
def test_negation_keeps_its_operand(where: str) -> None:
    t = pa.table({"pid": list(range(10)), "ti": pa.array([5] * 10, pa.int8()),
                  "ii": pa.array([2147483647] * 5 + [3] * 5, pa.int32()),
                  "bi": pa.array([2**40] * 10, pa.int64())})
    got, want = count_where(t, where)
    assert want > 0
    assert got == want
