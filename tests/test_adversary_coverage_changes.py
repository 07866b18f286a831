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


def test_one_persons_extreme_values_in_a_sum_of_an_expression_over_a_join_neither_raise_nor_escape_the_bounds() -> None:
    """SUM of an expression over a join of people: one person's BIGINT far beyond its declared bounds (its cube overflows
    INT64, where plain DuckDB raises) and a NaN are clamped to the derived bounds; the query answers, finite."""
    import math

    nc = 200
    cust = pa.table({"c_custkey": list(range(nc))})
    orders = pa.table({"o_orderkey": list(range(1000, 1000 + nc)), "o_custkey": list(range(nc))})
    qty = [i % 7 for i in range(nc)]
    qty[0] = 2**40
    price = [float(i % 90) for i in range(nc)]
    price[1] = float("nan")
    line = pa.table({"l_orderkey": list(range(1000, 1000 + nc)), "qty": pa.array(qty, pa.int64()), "price": price})
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("customer", cust, privacy_unit="c_custkey")
    s.register("orders", orders, references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 2})
    s.register("lineitem", line, references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 2},
               columns={"qty": {"bounds": (0, 10)}, "price": {"bounds": (0, 100)}})
    join = " FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey"
    for expr in ("l.qty * l.qty * l.qty", "l.price * 2 + l.qty"):
        r = s.query(f"SELECT SUM({expr}) AS s{join}", epsilon=1.0, delta=1e-6, options={"mechanism": "r2t"})
        assert math.isfinite(r.table.column("s")[0].as_py())
