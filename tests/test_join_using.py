"""``JOIN ... USING (col)`` is ``JOIN ... ON a.col = b.col``: the same plan (conditions, bounded SQL, cost, mechanism)
as the ON form, an unqualified USING column names the joined column, and the forms DuckDB reads differently or
not at all (a column missing on one side, one held by several earlier inputs) are refused for free."""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.plan.analyze import analyze
from dpsql.testing import use_noise, zero_noise


def data() -> dict[str, pa.Table]:
    g = np.random.default_rng(3)
    n = 200
    n_orders = g.integers(0, 5, n)
    ck = np.repeat(np.arange(n), n_orders)
    ok = np.arange(ck.size) + 1000
    n_items = g.integers(1, 4, ok.size)
    return {
        "customer": pa.table({"ck": np.arange(n), "seg": g.choice(["A", "B", "C"], n), "note": ["x"] * n}),
        "orders": pa.table({"ok": ok, "ck": ck, "total": np.round(g.uniform(0, 50, ok.size), 2), "note": ["y"] * ok.size}),
        "items": pa.table({"ok": np.repeat(ok, n_items), "qty": g.integers(1, 9, int(n_items.sum())),
                           "ck": np.repeat(ck, n_items)}),
    }


@pytest.fixture(scope="module")
def s() -> Any:
    d = data()
    sess = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("customer", d["customer"], privacy_unit="ck", columns={"seg": {"domain": ["A", "B", "C"]}})
    sess.register("orders", d["orders"], references={"ck": "customer.ck"}, degree_bounds={"ck": 4},
                  columns={"total": {"bounds": (0, 50)}})
    sess.register("items", d["items"], references={"ok": "orders.ok", "ck": "customer.ck"},
                  degree_bounds={"ok": 3, "ck": 12})
    yield sess
    sess.close()


PAIRS = [
    ("SELECT COUNT(*) FROM customer c JOIN orders o USING (ck)",
     "SELECT COUNT(*) FROM customer c JOIN orders o ON c.ck = o.ck"),
    ("SELECT SUM(o.total) AS t FROM orders o JOIN customer c USING (ck) WHERE ck > 10",
     "SELECT SUM(o.total) AS t FROM orders o JOIN customer c ON o.ck = c.ck WHERE o.ck > 10"),
    ("SELECT c.seg, COUNT(*) AS n FROM customer AS c JOIN orders AS o USING (ck) GROUP BY c.seg",
     "SELECT c.seg, COUNT(*) AS n FROM customer AS c JOIN orders AS o ON c.ck = o.ck GROUP BY c.seg"),
    ("SELECT COUNT(*) FROM customer c JOIN orders o USING (ck) JOIN items i USING (ok)",
     "SELECT COUNT(*) FROM customer c JOIN orders o ON c.ck = o.ck JOIN items i ON o.ok = i.ok"),
    ("SELECT COUNT(*) FROM customer JOIN orders USING (ck)",
     "SELECT COUNT(*) FROM customer JOIN orders ON customer.ck = orders.ck"),
]


@pytest.mark.parametrize("using,on", PAIRS)
def test_using_is_the_on_form(s: Any, using: str, on: str) -> None:
    pu, po = analyze(using, dict(s.tables)), analyze(on, dict(s.tables))
    assert pu.join is not None and po.join is not None
    assert pu.join.conditions == po.join.conditions
    a, b = s.explain(using, epsilon=1.0, delta=1e-6), s.explain(on, epsilon=1.0, delta=1e-6)
    assert (a.bounded_sql, a.cost, a.mechanism) == (b.bounded_sql, b.cost, b.mechanism)
    assert s.query(using, epsilon=1.0, delta=1e-6).table.num_rows >= 1


def test_the_joined_rows_are_duckdbs() -> None:
    """DuckDB's own USING join pairs the same rows as the ON form the plan states (the answer's shape)."""
    con = duckdb.connect()
    for name, t in data().items():
        con.register(name, t)
    using = con.execute("SELECT COUNT(*), SUM(total) FROM customer JOIN orders USING (ck) JOIN items USING (ok)").fetchall()
    on = con.execute("SELECT COUNT(*), SUM(total) FROM customer c JOIN orders o ON c.ck = o.ck "
                     "JOIN items i ON o.ok = i.ok").fetchall()
    assert using == on
    con.close()


def test_a_chain_of_using_on_one_column_names_the_first_input(s: Any) -> None:
    plan = analyze("SELECT COUNT(*) FROM customer c JOIN orders o USING (ck) JOIN items i USING (ck) WHERE ck < 50",
                   dict(s.tables))
    assert plan.join is not None
    assert set(plan.join.conditions) == {("c__ck", "o__ck"), ("c__ck", "i__ck")}


def free(sess: Any, sql: str) -> str:
    before, rows = sess.remaining(), sess.history().num_rows
    for run in (sess.query, sess.explain):
        with pytest.raises(errors.QueryError) as ei:
            run(sql, epsilon=1.0, delta=1e-6)
    assert sess.remaining() == before and sess.history().num_rows == rows
    return str(ei.value)


@pytest.mark.parametrize("sql,words", [
    ("SELECT COUNT(*) FROM customer c JOIN orders o USING (seg)", "column 'seg' is not in 'o'"),
    ("SELECT COUNT(*) FROM customer c JOIN orders o USING (total)", "not in any table joined before it"),
    ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.ck = o.ck JOIN items i USING (ck)", "ambiguous"),
    ("SELECT COUNT(*) FROM customer c JOIN orders o USING (ck) WHERE note = 'x'", "column 'note' is ambiguous"),
    ("SELECT COUNT(*) FROM customer c LEFT JOIN orders o USING (ck)", "LEFT joins are not supported"),
])
def test_using_that_is_not_one_equality_is_refused_for_free(s: Any, sql: str, words: str) -> None:
    assert words in free(s, sql)
