"""An ON equality naming a view's column that is an expression is refused saying so, for free.

``WITH v AS (SELECT ck + 1 AS ck FROM orders) ... JOIN customer c ON v.ck = c.ck`` was refused with "only equalities
between columns ... are allowed in ON; move other conditions into WHERE", quoting ``v.ck = c.ck``: an equality
between columns as written, and moving it into WHERE left a cross join, refused in turn."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget


@pytest.fixture(scope="module")
def s():
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        s.register("customer", pa.table({"ck": [1, 2, 3]}), privacy_unit="ck")
        s.register("orders", pa.table({"ok": [1, 2, 3], "ck": [1, 2, 2]}), references={"ck": "customer.ck"},
                   degree_bounds={"ck": 3})
        yield s


@pytest.mark.parametrize("sql", [
    "WITH v AS (SELECT ck + 1 AS ck FROM orders) SELECT COUNT(*) FROM v JOIN customer c ON v.ck = c.ck",
    "SELECT COUNT(*) FROM customer c JOIN (SELECT ck + 1 AS k FROM orders) v ON c.ck = v.k",
])
def test_a_view_expression_in_on_is_named(s, sql: str) -> None:
    with pytest.raises(dpsql.errors.UnsupportedQueryError) as e:
        s.explain(sql, epsilon=1.0)
    msg = str(e.value)
    assert "is the view's expression ck + 1" in msg and "move other conditions into WHERE" not in msg
    assert s.history().num_rows == 0


def test_a_view_passing_the_column_through_is_joined(s) -> None:
    """Control: a view column that is the table's column joins as that column."""
    s.explain("WITH v AS (SELECT ck AS k FROM orders) SELECT COUNT(*) FROM v JOIN customer c ON v.k = c.ck", epsilon=1.0)
