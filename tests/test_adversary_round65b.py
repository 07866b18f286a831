"""Neighbouring datasets, zero noise: joins (DP-S4S, its vector form, lookup joins) and what a query that releases
nothing costs.

* A query without GROUP BY releases one row (or none, after HAVING), on one table and over joins: with ``OFFSET 1``
  (or more) it released no row whatever the data, and was charged (``SELECT COUNT(*) FROM customer c JOIN orders o
  ... OFFSET 1``). The OFFSET that skips a release over public keys was refused for free, as LIMIT 0 is; now this one
  too, and an OFFSET of a UNION ALL at or beyond its SELECTs without GROUP BY (one row each).
"""

from __future__ import annotations

import pytest

import dpsql
from tests.test_tpch_queries import _COL, _data, _session


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM customer OFFSET 1",
    "SELECT SUM(c_acctbal) AS s FROM customer LIMIT 3 OFFSET 2",
    "SELECT COUNT(*) AS n FROM customer HAVING COUNT(*) > 1 OFFSET 1",
    "SELECT MEDIAN(c_acctbal) AS m FROM customer OFFSET 1",
    "WITH v AS (SELECT * FROM customer) SELECT COUNT(*) AS n FROM v OFFSET 1",
    f"SELECT COUNT(*) AS n {_COL}OFFSET 1",
    f"SELECT COUNT(*) AS n, SUM(l.l_quantity) AS q {_COL}OFFSET 5",
    "SELECT COUNT(*) AS n FROM lineitem l JOIN supplier s ON s.s_suppkey = l.l_suppkey OFFSET 1",
    "SELECT COUNT(*) AS n FROM customer UNION ALL SELECT COUNT(*) AS n FROM orders OFFSET 2",
])
def test_an_offset_past_the_one_row_of_a_query_without_group_by_is_refused_for_free(sql: str) -> None:
    for extra in (False, True):
        with _session(_data(extra)) as s:
            before = s.remaining()
            with pytest.raises(dpsql.errors.UnsupportedQueryError, match="charged for nothing"):
                s.query(sql, epsilon=1.0, delta=1e-6)
            assert s.remaining() == before and s.history().num_rows == 0


@pytest.mark.parametrize(("sql", "rows"), [
    ("SELECT COUNT(*) AS n FROM customer OFFSET 0", 1),
    (f"SELECT COUNT(*) AS n {_COL}LIMIT 1 OFFSET 0", 1),
    ("SELECT COUNT(*) AS n FROM customer UNION ALL SELECT COUNT(*) AS n FROM orders OFFSET 1", 1),
    ("SELECT c_mktsegment, COUNT(*) AS n FROM customer GROUP BY 1 ORDER BY 1 OFFSET 1", 1),
])
def test_negative_control_an_offset_that_leaves_a_row_is_answered(sql: str, rows: int) -> None:
    with _session(_data()) as s:
        r = s.query(sql, epsilon=1.0, delta=1e-6)
        assert r.table.num_rows == rows and s.history().num_rows >= 1
