"""Declared bounds whose product leaves the DOUBLE range are named as too large, not as missing.

With ``degree_bounds`` of 10^200 on two hops, Delta = 10^400 overflowed to infinity and the join was refused with
"some input joins on a column with no declared bound (hint: declare degree_bounds ...)", although every column
has one; a product within the DOUBLE range above 2^63 is refused as "above 2^63" (the control)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget

SQL = "SELECT COUNT(*) FROM lineitem l JOIN orders o ON l.ok = o.ok"


def _session(deg: int) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("customer", pa.table({"ck": [1, 2, 3]}), privacy_unit="ck")
    s.register("orders", pa.table({"ok": [1, 2, 3], "ck": [1, 2, 2]}), references={"ck": "customer.ck"},
               degree_bounds={"ck": deg})
    s.register("lineitem", pa.table({"ok": [1, 1, 2]}), references={"ok": "orders.ok"}, degree_bounds={"ok": deg})
    return s


@pytest.mark.parametrize("deg", [10**200, 10**18])
def test_huge_declared_bounds_are_named_as_too_large(deg: int) -> None:
    s = _session(deg)
    try:
        with pytest.raises(dpsql.errors.DPSQLError, match=r"above 2\^63") as e:
            s.explain(SQL, epsilon=1.0)
        assert "no declared bound" not in str(e.value)
        assert s.history().num_rows == 0
    finally:
        s.close()
