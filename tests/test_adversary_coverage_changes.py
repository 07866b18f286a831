"""Adversarial checks of SUM / AVG of expressions over joins, windows and constants over joins, DATE +/- n,
x = ANY([...]) and epoch(x)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

import dpsql
from dpsql import Budget


def _one_table() -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", pa.table({"u": [1, 2, 3], "x": [1.0, 2.0, 3.0]}), privacy_unit="u", columns={"x": {"bounds": (0, 10)}})
    return s


@pytest.mark.parametrize("expr", ["x" + " + 1" * 22, "1 + (" * 22 + "x" + ")" * 22])
def test_a_long_sum_of_literals_is_typed_in_linear_time(expr: str) -> None:
    """``x + 1 + 1 + ...`` typed its left operand twice per level (once to see whether it is a DATE shifted by whole
    days, once as a number): time exponential in the depth, 80 s at 18 levels, so one query could hold the engine
    for hours. Each operand is now typed once."""
    s = _one_table()
    t0 = time.monotonic()
    s.explain(f"SELECT SUM({expr}) FROM t", epsilon=1.0)
    assert time.monotonic() - t0 < 5.0
