"""A reference whose target column does not exist is named as such, for free.

``references={'ck': 'customer.zzz'}`` with ``customer`` registered without ``zzz`` was accepted, and every query
reading the table (alone or joined) was then refused as a type error ("check the types in WHERE / GROUP BY ...",
DuckDB's binder failing on the lookup SQL), which named nothing the owner or the analyst could fix. The owner's
registration is now refused, naming the column; a target registered later without that column makes the join
refuse with that reason (a PolicyError, nothing charged)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget


def test_registration_names_a_missing_target_column() -> None:
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        s.register("customer", pa.table({"ck": [1, 2, 3]}), privacy_unit="ck")
        with pytest.raises(dpsql.errors.ConfigError, match=r"'customer' has no column 'zzz'"):
            s.register("orders", pa.table({"ok": [1, 2, 3], "ck": [1, 2, 2]}), references={"ck": "customer.zzz"})
        assert "orders" not in s.tables
        # control: the existing column is accepted
        s.register("orders", pa.table({"ok": [1, 2, 3], "ck": [1, 2, 2]}), references={"ck": "customer.ck"})


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM orders", "SELECT COUNT(*) FROM orders o JOIN customer c ON o.ck = c.id",
                                 "SELECT COUNT(*) FROM lineitem l JOIN orders o ON l.ok = o.ok"])
def test_a_target_registered_later_without_the_column_is_named_when_queried(sql: str) -> None:
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        s.register("orders", pa.table({"ok": [1, 2, 3], "ck": [1, 2, 2]}), references={"ck": "customer.ck"},
                   degree_bounds={"ck": 3})
        s.register("lineitem", pa.table({"ok": [1, 1, 2]}), references={"ok": "orders.ok"}, degree_bounds={"ok": 4})
        s.register("customer", pa.table({"id": [1, 2, 3]}), privacy_unit="id")  # no column 'ck'
        for call in (s.explain, s.query):
            with pytest.raises(dpsql.errors.PolicyError, match=r"'customer' has no column 'ck'"):
                call(sql, epsilon=1.0)
        assert s.history().num_rows == 0
