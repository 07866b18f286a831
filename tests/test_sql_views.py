"""CTEs (WITH v AS (...)) and subqueries in FROM: a plain projection and filter is merged into the flat
query and answered as that query is (same answer with the same noise, here zero); anything else is
refused for free, naming the construct and the fix. A view's column alias never borrows the bounds,
domain or privacy-unit role of a column of that name: the merged query reads the aliased expression."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from _sessions import fresh_and_refusing
from sqlglot import exp

import dpsql
from dpsql import errors
from dpsql.plan import ir
from dpsql.plan.analyze import analyze
from dpsql.plan.views import MAX_NODES
from dpsql.testing import use_noise, zero_noise

pytestmark = pytest.mark.filterwarnings("ignore:epsilon=.* is unusually large")


def _orders() -> pa.Table:
    n = 600
    return pa.table({
        "customer_id": pa.array([i % 120 for i in range(n)], pa.int64()),
        "product_id": pa.array([i % 4 for i in range(n)], pa.int64()),
        "amount": pa.array([float(i % 37) for i in range(n)]),
        "status": pa.array(["done" if i % 3 else "open" for i in range(n)]),
        "url": pa.array([f"/p{i % 5}" for i in range(n)]),
    })


def _shop() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    s.register("products", pa.table({"product_id": pa.array(range(4), pa.int64()), "category": ["p", "q", "p", "q"]}),
               public=True)
    s.register("orders", _orders(), privacy_unit="customer_id", max_groups_per_unit=4, max_rows_per_group=10,
               references={"product_id": "products.product_id"},
               columns={"amount": {"bounds": (0, 100)}, "status": {"domain": ["done", "open", "void"]}})
    s.register("customers", pa.table({"customer_id": pa.array(range(120), pa.int64()),
                                      "segment": ["a", "b", "c"] * 40}), privacy_unit="customer_id",
               columns={"segment": {"domain": ["a", "b", "c"]}})
    return s


shop_fixture, shop_refusing_fixture = fresh_and_refusing(_shop, "shop", "shop_refusing")


def _answer(s: dpsql.Session, sql: str) -> list[tuple[Any, ...]]:
    use_noise(s, zero_noise(5))
    r = s.query(sql, epsilon=5.0, delta=1e-6)
    return sorted((tuple(row.values()) for row in r.table.to_pylist()), key=repr)


def _refused(s: dpsql.Session, sql: str, exc: type[Exception], match: str) -> str:
    before = s.remaining()
    rows = s.history().num_rows
    with pytest.raises(exc, match=match) as info:
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == rows and s.remaining() == before  # nothing charged, nothing recorded
    with pytest.raises(exc, match=match):
        s.explain(sql, epsilon=1.0, delta=1e-6)
    return str(info.value)


# -- answered: the same as the flat query --------------------------------------------------------------------

SAME = [
    ("WITH big AS (SELECT * FROM orders WHERE amount > 10) SELECT COUNT(*) FROM big",
     "SELECT COUNT(*) FROM orders WHERE amount > 10"),
    ("SELECT COUNT(*) FROM (SELECT * FROM orders WHERE amount > 10) t",
     "SELECT COUNT(*) FROM orders WHERE amount > 10"),
    ("SELECT COUNT(*) FROM (SELECT * FROM orders WHERE amount > 10)",
     "SELECT COUNT(*) FROM orders WHERE amount > 10"),
    ("WITH v AS (SELECT amount AS a, status AS st FROM orders) SELECT st, SUM(a) FROM v GROUP BY st",
     "SELECT status AS st, SUM(amount) FROM orders GROUP BY status"),
    ("WITH v AS (SELECT amount AS a, status FROM orders WHERE status <> 'open') SELECT status, AVG(a), COUNT(*) FROM v "
     "WHERE a < 30 GROUP BY status",
     "SELECT status, AVG(amount), COUNT(*) FROM orders WHERE status <> 'open' AND amount < 30 GROUP BY status"),
    ("WITH v(a, st) AS (SELECT amount, status FROM orders) SELECT st, SUM(a) FROM v GROUP BY st",
     "SELECT status, SUM(amount) FROM orders GROUP BY status"),
    ("SELECT st, SUM(a) FROM (SELECT amount, status FROM orders) t(a, st) GROUP BY st",
     "SELECT status, SUM(amount) FROM orders GROUP BY status"),
    ("WITH v AS (SELECT LEAST(GREATEST(amount * 2, 0), 50) AS dbl, url FROM orders) SELECT url, SUM(dbl) FROM v GROUP BY url",
     "SELECT url, SUM(LEAST(GREATEST(amount * 2, 0), 50)) FROM orders GROUP BY url"),
    ("WITH v AS (SELECT amount + 1 AS a FROM orders) SELECT COUNT(*) FROM v WHERE a * 2 > 20",
     "SELECT COUNT(*) FROM orders WHERE (amount + 1) * 2 > 20"),
    ("WITH a AS (SELECT amount AS x, status FROM orders WHERE amount > 1), b AS (SELECT x + 1 AS y, * FROM a "
     "WHERE status = 'done') SELECT status, COUNT(*), SUM(LEAST(y, 40)) FROM b GROUP BY status",
     "SELECT status, COUNT(*), SUM(LEAST(amount + 1, 40)) FROM orders WHERE amount > 1 AND status = 'done' GROUP BY status"),
    ("SELECT COUNT(*) FROM (SELECT * FROM (SELECT amount AS x FROM orders WHERE amount > 1) WHERE x < 30) t WHERE x <> 3",
     "SELECT COUNT(*) FROM orders WHERE amount > 1 AND amount < 30 AND amount <> 3"),
    ("WITH orders AS (SELECT * FROM orders WHERE amount > 5) SELECT COUNT(*) FROM orders",
     "SELECT COUNT(*) FROM orders WHERE amount > 5"),
    ("WITH v AS (SELECT o.* FROM orders o WHERE o.status = 'done') SELECT url, COUNT(*) FROM v GROUP BY url",
     "SELECT url, COUNT(*) FROM orders WHERE status = 'done' GROUP BY url"),
    ("WITH v AS (SELECT amount AS a, a + 1 AS b FROM orders WHERE a > 3) SELECT SUM(LEAST(b, 50)) FROM v",
     "SELECT SUM(LEAST(amount + 1, 50)) FROM orders WHERE amount > 3"),
    ("WITH v AS (SELECT customer_id, amount FROM orders) SELECT COUNT(DISTINCT customer_id) FROM v WHERE amount > 2",
     "SELECT COUNT(DISTINCT customer_id) FROM orders WHERE amount > 2"),
    ("WITH v AS (SELECT status AS st, amount FROM orders) SELECT st, COUNT(*) AS n FROM v GROUP BY st HAVING n > 1 "
     "ORDER BY n DESC LIMIT 2",
     "SELECT status AS st, COUNT(*) AS n FROM orders GROUP BY status HAVING n > 1 ORDER BY n DESC LIMIT 2"),
    ("WITH v AS (SELECT status AS st FROM orders) SELECT DISTINCT st FROM v",
     "SELECT DISTINCT status FROM orders"),
    ("WITH v AS (SELECT amount AS a FROM orders) SELECT MEDIAN(a) FROM v",
     "SELECT MEDIAN(amount) FROM orders"),
    ("WITH v AS (WITH w AS (SELECT * FROM orders WHERE amount > 2) SELECT amount FROM w WHERE amount < 30) "
     "SELECT COUNT(*) FROM v",
     "SELECT COUNT(*) FROM orders WHERE amount > 2 AND amount < 30"),
    ("WITH v AS (SELECT url AS status FROM orders) SELECT status, COUNT(*) FROM v GROUP BY status",
     "SELECT url, COUNT(*) FROM orders GROUP BY url"),
    ("WITH v AS (SELECT \"status\" AS \"St\" FROM orders) SELECT \"St\", COUNT(*) FROM v GROUP BY 1",
     "SELECT status, COUNT(*) FROM orders GROUP BY 1"),
    # joins: a view in a join, a view over a join, a view named twice (a self-join of its body)
    ("WITH v AS (SELECT o.product_id AS pid, amount FROM orders o WHERE amount > 3) SELECT p.category, SUM(amount) "
     "FROM v JOIN products p ON v.pid = p.product_id GROUP BY p.category",
     "SELECT p.category, SUM(o.amount) FROM orders o JOIN products p ON o.product_id = p.product_id WHERE o.amount > 3 "
     "GROUP BY p.category"),
    ("WITH v AS (SELECT o.amount, p.category FROM orders o JOIN products p ON o.product_id = p.product_id "
     "WHERE p.category = 'p') SELECT category, SUM(amount) FROM v GROUP BY category",
     "SELECT p.category, SUM(o.amount) FROM orders o JOIN products p ON o.product_id = p.product_id "
     "WHERE p.category = 'p' GROUP BY p.category"),
    ("SELECT p.category, COUNT(*) FROM products p JOIN (SELECT product_id FROM orders WHERE amount > 3) o "
     "ON o.product_id = p.product_id GROUP BY p.category",
     "SELECT p.category, COUNT(*) FROM products p JOIN orders o ON o.product_id = p.product_id WHERE o.amount > 3 "
     "GROUP BY p.category"),
    ("WITH v AS (SELECT customer_id, product_id FROM orders WHERE status = 'done') SELECT COUNT(*) FROM v a "
     "JOIN v b ON a.customer_id = b.customer_id",
     "SELECT COUNT(*) FROM orders a JOIN orders b ON a.customer_id = b.customer_id "
     "WHERE a.status = 'done' AND b.status = 'done'"),
    ("WITH v AS (SELECT o.customer_id, p.category FROM orders o JOIN products p ON o.product_id = p.product_id) "
     "SELECT a.category, COUNT(*) FROM v a JOIN v b ON a.customer_id = b.customer_id GROUP BY a.category",
     "SELECT p.category, COUNT(*) FROM orders o JOIN products p ON o.product_id = p.product_id JOIN orders o2 "
     "ON o.customer_id = o2.customer_id JOIN products p2 ON o2.product_id = p2.product_id GROUP BY p.category"),
    ("WITH v AS (SELECT o.amount, c.segment FROM orders o JOIN customers c ON o.customer_id = c.customer_id) "
     "SELECT segment, COUNT(*) FROM v GROUP BY segment",
     "SELECT c.segment, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id GROUP BY c.segment"),
]


@pytest.mark.parametrize("cte,flat", SAME, ids=[c[:70] for c, _ in SAME])
def test_a_view_is_answered_as_the_flat_query(shop, cte, flat):
    got, want = _answer(shop, cte), _answer(shop, flat)
    assert got == want and got, (got, want)


def test_answers_are_charged_as_the_flat_query(shop):
    before = shop.remaining()
    _answer(shop, "WITH v AS (SELECT amount FROM orders WHERE amount > 3) SELECT SUM(amount) FROM v")
    mid = shop.remaining()
    _answer(shop, "SELECT SUM(amount) FROM orders WHERE amount > 3")
    assert before.epsilon - mid.epsilon == pytest.approx(mid.epsilon - shop.remaining().epsilon)


def test_output_names_are_the_outer_query_s(shop):
    use_noise(shop, zero_noise(1))
    r = shop.query("WITH v AS (SELECT customer_id AS c, status AS st, amount AS a FROM orders) "
                   "SELECT st, COUNT(*), SUM(a) AS total FROM v GROUP BY st", epsilon=1.0, delta=1e-6)
    assert r.table.column_names == ["st", "COUNT(*)", "total"]
    r = shop.query("SELECT SUM(a) FROM (SELECT amount AS a FROM orders) t", epsilon=1.0, delta=1e-6)
    assert r.table.column_names == ["SUM(a)"]


def test_explain_of_a_view_is_free_and_plans_the_flat_query(shop):
    before = shop.remaining()
    text = str(shop.explain("WITH v AS (SELECT amount FROM orders WHERE amount > 3) SELECT SUM(amount) FROM v",
                            epsilon=1.0, delta=1e-6))
    assert "amount" in text and shop.remaining() == before and shop.history().num_rows == 0


# -- a view's column alias never borrows a column's role --------------------------------------------------------

def test_an_alias_named_as_a_public_key_does_not_use_its_domain(shop):
    cat = shop._catalog
    plan = analyze("WITH v AS (SELECT url AS status FROM orders) SELECT status, COUNT(*) FROM v GROUP BY status", cat)
    assert [k.domain for k in plan.keys] == [None]  # url has no declared domain: released above the threshold
    flat = analyze("SELECT status, COUNT(*) FROM orders GROUP BY status", cat)
    assert flat.keys[0].domain is not None  # negative control: the declared domain of status
    keys = {row[0] for row in _answer(shop, "WITH v AS (SELECT url AS status FROM orders) SELECT status, COUNT(*) "
                                            "FROM v GROUP BY status")}
    assert keys and keys <= {f"/p{i}" for i in range(5)} and not keys & {"done", "open", "void"}


def test_the_privacy_unit_under_a_public_key_s_name_is_refused(shop):
    _refused(shop, "WITH v AS (SELECT customer_id AS status FROM orders) SELECT status, COUNT(*) FROM v GROUP BY status",
             errors.QueryError, "privacy unit")


def test_an_alias_named_as_the_unit_is_no_unit(shop):
    plan = analyze("WITH v AS (SELECT status AS customer_id FROM orders) SELECT COUNT(DISTINCT customer_id) FROM v",
                   shop._catalog)
    assert [(a.kind, a.column) for a in plan.aggregates] == [(ir.COUNT_DISTINCT, "status")]
    unit = analyze("WITH v AS (SELECT customer_id AS who FROM orders) SELECT COUNT(DISTINCT who) FROM v", shop._catalog)
    assert [a.kind for a in unit.aggregates] == [ir.COUNT_UNITS]


def test_an_alias_named_as_a_bounded_column_does_not_borrow_its_bounds(shop):
    _refused(shop, "WITH v AS (SELECT product_id AS amount FROM orders) SELECT SUM(amount) FROM v",
             errors.QueryError, "bounds")
    _refused(shop, "WITH v AS (SELECT customer_id AS amount, amount AS customer_id FROM orders) SELECT SUM(amount) FROM v",
             errors.QueryError, "bounds")
    plan = analyze("WITH v AS (SELECT amount AS product_id FROM orders) SELECT SUM(product_id) FROM v", shop._catalog)
    assert [(a.column, a.bounds) for a in plan.aggregates] == [("amount", (0.0, 100.0))]


def test_a_column_the_view_does_not_list_is_unknown(shop):
    msg = _refused(shop, "WITH v AS (SELECT amount FROM orders) SELECT COUNT(*) FROM v WHERE status = 'done'",
                   errors.UnsupportedQueryError, "unknown column 'status'")
    assert "line 1, col 68" in msg
    _refused(shop, "WITH v AS (SELECT amount FROM orders) SELECT status, COUNT(*) FROM v GROUP BY status",
             errors.UnsupportedQueryError, "unknown column 'status'")
    _refused(shop, "WITH v AS (SELECT amount FROM orders) SELECT COUNT(*) FROM v WHERE orders.status = 'done'",
             errors.UnsupportedQueryError, "unknown table or alias 'orders'")
    _refused(shop, "WITH v AS (SELECT amount FROM orders) SELECT COUNT(*) FROM v a WHERE v.amount > 1",
             errors.UnsupportedQueryError, "unknown table or alias 'v'")


def test_a_select_alias_the_merge_would_capture_is_refused(shop):
    _refused(shop, "WITH v AS (SELECT amount AS a FROM orders) SELECT a * 2 AS amount, COUNT(*) FROM v GROUP BY amount",
             errors.UnsupportedQueryError, "select-list alias 'amount' is also a column of table 'orders'")
    _refused(shop, "WITH v AS (SELECT url AS u FROM orders) SELECT u AS status, COUNT(*) FROM v WHERE status <> 'x' "
                   "GROUP BY 1", errors.UnsupportedQueryError, "select-list alias 'status'")


def test_an_unused_output_is_still_checked(shop):
    _refused(shop, "WITH v AS (SELECT getenv('HOME') AS h, amount FROM orders) SELECT SUM(amount) FROM v",
             errors.UnsupportedQueryError, r"getenv\(\) is not on the allow-list")
    _refused(shop, "WITH v AS (SELECT amont AS x, amount FROM orders) SELECT SUM(amount) FROM v",
             errors.UnsupportedQueryError, "did you mean 'amount'")


def test_a_function_off_the_allow_list_in_a_view_s_filter_is_refused(shop):
    _refused(shop, "WITH v AS (SELECT amount FROM orders WHERE random() < 0.5) SELECT SUM(amount) FROM v",
             errors.UnsupportedQueryError, r"random\(\)")


# -- refused, for free, naming the construct and the fix ----------------------------------------------------------

REFUSED = [
    ("WITH RECURSIVE v AS (SELECT * FROM orders) SELECT COUNT(*) FROM v", "WITH RECURSIVE"),
    ("WITH v AS (SELECT status, COUNT(*) AS n FROM orders GROUP BY status) SELECT SUM(n) FROM v", "GROUP BY in the CTE 'v'"),
    ("WITH v AS (SELECT SUM(amount) AS s FROM orders) SELECT COUNT(*) FROM v", "an aggregate in the CTE 'v'"),
    ("WITH v AS (SELECT DISTINCT customer_id FROM orders) SELECT COUNT(*) FROM v", "DISTINCT in the CTE 'v'"),
    ("WITH v AS (SELECT amount FROM orders LIMIT 5) SELECT SUM(amount) FROM v", "LIMIT in the CTE 'v'"),
    ("WITH v AS (SELECT amount FROM orders OFFSET 5) SELECT SUM(amount) FROM v", "OFFSET in the CTE 'v'"),
    ("WITH v AS (SELECT amount FROM orders ORDER BY amount) SELECT SUM(amount) FROM v", "ORDER BY in the CTE 'v'"),
    ("WITH v AS (SELECT row_number() OVER (ORDER BY amount) AS r FROM orders) SELECT COUNT(*) FROM v WHERE r < 3",
     "window function in the CTE 'v'"),
    ("WITH v AS (SELECT amount FROM orders UNION ALL SELECT amount FROM orders) SELECT SUM(amount) FROM v",
     "set operation .* in the CTE 'v'"),
    ("SELECT SUM(amount) FROM (SELECT amount FROM orders UNION SELECT amount FROM orders) t",
     "set operation .* in the subquery 't'"),
    ("SELECT COUNT(*) FROM (SELECT customer_id, COUNT(*) AS n FROM orders GROUP BY customer_id) t WHERE n > 2",
     "GROUP BY in the subquery 't' in FROM"),
    ("WITH v AS (SELECT amount FROM orders), w AS (SELECT amount FROM orders) SELECT SUM(amount) FROM v",
     "the CTE 'w' is defined but never used"),
    ("WITH v AS (SELECT amount FROM orders) SELECT SUM(amount) FROM orders", "the CTE 'v' is defined but never used"),
    ("WITH v AS (SELECT amount FROM orders), v AS (SELECT amount FROM orders) SELECT SUM(amount) FROM v",
     "defined twice"),
    ("WITH v AS (SELECT product_id FROM orders) SELECT COUNT(*) FROM v LEFT JOIN products p ON v.product_id = p.product_id",
     "LEFT JOIN with the CTE 'v'"),
    ("WITH v AS (SELECT product_id FROM products) SELECT COUNT(*) FROM orders o RIGHT JOIN v ON v.product_id = o.product_id",
     "RIGHT JOIN with the CTE 'v'"),
    ("WITH v AS (SELECT product_id FROM orders) SELECT COUNT(*) FROM v FULL JOIN products p ON v.product_id = p.product_id",
     "FULL JOIN with the CTE 'v'"),
    ("WITH v AS (SELECT product_id FROM orders) SELECT COUNT(*) FROM v JOIN products USING (product_id)",
     r"JOIN \.\.\. USING with the CTE 'v'"),
    ("WITH v AS (SELECT o.amount FROM orders o LEFT JOIN products p ON o.product_id = p.product_id) "
     "SELECT SUM(amount) FROM v", "LEFT JOIN with the CTE 'v'"),
    ("WITH v(a, b) AS (SELECT amount FROM orders) SELECT SUM(a) FROM v", "names 2 column"),
    ("SELECT COUNT(*) FROM orders o JOIN (SELECT product_id FROM products p WHERE p.product_id = o.product_id) q "
     "ON q.product_id = o.product_id", "correlated or lateral"),
    ("WITH v AS (SELECT * FROM read_csv('x.csv')) SELECT COUNT(*) FROM v", "table functions"),
    ("WITH v AS (SELECT product_id AS amount FROM orders) SELECT SUM(amount) FROM v JOIN orders o "
     "ON v.amount = o.product_id", "ambiguous"),
]


@pytest.mark.parametrize("sql,match", REFUSED, ids=[m for _, m in REFUSED])
def test_refused_for_free_with_the_fix(shop_refusing, sql, match):
    msg = _refused(shop_refusing, sql, errors.QueryError, match)
    assert "problems" not in msg, msg


def test_refusal_points_at_the_construct_in_the_user_s_query(shop):
    sql = "WITH v AS (SELECT amount FROM orders\nLIMIT 5) SELECT SUM(amount) FROM v"
    with pytest.raises(errors.UnsupportedQueryError) as info:
        shop.query(sql, epsilon=1.0, delta=1e-6)
    v = info.value.violations[0]
    assert (v.line, v.col) == (2, 1) and "write the query flat" in (info.value.hint or "")


def test_a_recursive_cte_is_refused_at_recursive(shop):
    with pytest.raises(errors.UnsupportedQueryError) as info:
        shop.query("WITH RECURSIVE v AS (SELECT * FROM orders) SELECT COUNT(*) FROM v", epsilon=1.0, delta=1e-6)
    assert (info.value.violations[0].line, info.value.violations[0].col) == (1, 6)


def test_an_unregistered_table_in_a_view_is_refused_as_such(shop):
    _refused(shop, "WITH v AS (SELECT * FROM ordrs) SELECT COUNT(*) FROM v", errors.PolicyError, "did you mean 'orders'")
    _refused(shop, "WITH v AS (SELECT amount FROM ghost) SELECT SUM(amount) FROM v", errors.QueryError, "not registered")


def test_a_merged_query_above_the_node_limit_is_refused_quickly(shop):
    # each CTE names the previous one's expression twice: merged, 2^40 copies; refused after ~MAX_NODES
    parts = ["v0 AS (SELECT amount + 1 AS x FROM orders)"]
    parts += [f"v{i} AS (SELECT x + x AS x FROM v{i - 1})" for i in range(1, 41)]
    sql = "WITH " + ", ".join(parts) + " SELECT SUM(LEAST(x, 1)) FROM v40"
    msg = _refused(shop, sql, errors.UnsupportedQueryError, f"more than {MAX_NODES} expression nodes")
    assert "write the query flat" in msg
    # negative control: a short chain is answered
    parts = ["v0 AS (SELECT amount + 1 AS x FROM orders)"] + [f"v{i} AS (SELECT x + x AS x FROM v{i - 1})" for i in range(1, 4)]
    assert _answer(shop, "WITH " + ", ".join(parts) + " SELECT COUNT(*) FROM v3 WHERE x > 10") == \
        _answer(shop, "SELECT COUNT(*) FROM orders WHERE 8 * (amount + 1) > 10")


def test_a_view_named_many_times_is_bounded_by_the_node_limit(shop):
    joins = " ".join(f"JOIN v v{i} ON v0.customer_id = v{i}.customer_id" for i in range(1, 6))
    body = " AND ".join(f"amount <> {i}" for i in range(1200))
    sql = f"WITH v AS (SELECT customer_id FROM orders WHERE {body}) SELECT COUNT(*) FROM v v0 {joins}"
    _refused(shop, sql, errors.UnsupportedQueryError, "expression nodes")


def test_more_forms(shop):
    assert _answer(shop, "WITH v AS (FROM orders WHERE amount > 4) SELECT COUNT(*) FROM v") == \
        _answer(shop, "SELECT COUNT(*) FROM orders WHERE amount > 4")
    _refused(shop, "WITH v AS (SELECT amount FROM orders) SELECT v.* FROM v", errors.UnsupportedQueryError, r"SELECT \*")
    _refused(shop, "WITH v AS (SELECT amount FROM orders) SELECT COUNT(*) FROM v UNION SELECT COUNT(*) FROM v",
             errors.UnsupportedQueryError, "UNION without ALL")
    # a CTE named only in a subquery of WHERE: the subquery is the one problem
    msg = _refused(shop, "WITH v AS (SELECT customer_id FROM orders) SELECT COUNT(*) FROM orders "
                         "WHERE customer_id IN (SELECT customer_id FROM v)", errors.UnsupportedQueryError,
                   "subqueries are not supported in WHERE")
    assert "never used" not in msg


def test_an_unknown_column_in_a_view_points_into_the_view(shop):
    with pytest.raises(errors.UnsupportedQueryError) as info:
        shop.query("WITH v AS (\n  SELECT amont AS a FROM orders)\nSELECT SUM(a) FROM v", epsilon=1.0, delta=1e-6)
    assert (info.value.violations[0].line, info.value.violations[0].col) == (2, 10)


def _quoted(s: dpsql.Session, sql: str, exc: type[Exception] = errors.QueryError) -> tuple[str, str, str]:
    """(fragment, the query's text from the refusal's position on, message) of a refusal (free, as every one)."""
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(exc) as info:
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == rows and s.remaining() == before
    v = info.value.violations[0]  # type: ignore[attr-defined]
    at = sum(len(line) + 1 for line in sql.split("\n")[: v.line - 1]) + v.col - 1
    return v.fragment, sql[at:], v.message


#: (query, the fragment quoted as written, where it stands in the query: the text that follows). A view is merged
#: into the query before the analysis; each refusal still quotes the query's own text at its own position.
QUOTED = [
    # raised inside a view
    ("WITH v AS (SELECT amount AS x, url FROM orders WHERE url > 3) SELECT SUM(x) FROM v", "url > 3",
     "url > 3) SELECT"),
    ("SELECT COUNT(*) FROM (SELECT amount AS x, url FROM orders WHERE url LIKE x) t", "url LIKE x", "url LIKE x) t"),
    ("WITH v AS (SELECT amount AS x, url FROM orders WHERE RAND() > 0.5) SELECT SUM(x) FROM v", "RAND()",
     "RAND() > 0.5) SELECT"),
    ("WITH v AS (\n  SELECT amount AS x FROM orders\n  WHERE url > 3)\nSELECT SUM(x) FROM v", "url > 3", "url > 3)\nSELECT"),
    # raised in the outer query, on a view's columns
    ("WITH v AS (SELECT amount AS x, url FROM orders) SELECT SUM(x) FROM v WHERE url > 3", "url > 3", "url > 3"),
    ("SELECT COUNT(*) FROM (SELECT amount AS x, url FROM orders) t WHERE t.url LIKE t.x", "t.url LIKE t.x", "t.url LIKE t.x"),
    ("WITH v AS (SELECT amount AS x, url AS u FROM orders) SELECT MEDIAN(u) FROM v", "MEDIAN(u)", "MEDIAN(u) FROM v"),
    ("WITH v AS (SELECT amount AS x, url AS u FROM orders) SELECT SUM(u) FROM v", "SUM(u)", "SUM(u) FROM v"),
    ("WITH v AS (SELECT amount AS x, url AS u FROM orders) SELECT COUNT(*) FROM v WHERE contains(u, x)", "x", "x)"),
    ("WITH v AS (SELECT product_id AS x FROM orders) SELECT SUM(x) FROM v", "SUM(x)", "SUM(x) FROM v"),
    ("WITH v AS (SELECT amount AS x, customer_id AS c FROM orders) SELECT c, COUNT(*) FROM v GROUP BY c", "c", "c"),
    ("WITH v AS (SELECT amount AS x, url FROM orders) SELECT COUNT(DISTINCT url) FILTER (WHERE x > 1) FROM v",
     "COUNT(DISTINCT url) FILTER(WHERE x > 1)", "COUNT(DISTINCT url) FILTER (WHERE x > 1) FROM v"),
    ("WITH v AS (SELECT amount AS x, url FROM orders) SELECT x, url, COUNT(*) FROM v GROUP BY url", "x", "x, url"),
    ("WITH v AS (SELECT amount FROM orders) SELECT v.* FROM v", "v.*", "v.* FROM v"),
    # through a CTE named twice (a self-join of its body), and over a flat join
    ("WITH v AS (SELECT amount AS x, customer_id FROM orders) SELECT COUNT(*) FROM v a JOIN v b "
     "ON a.customer_id = b.customer_id WHERE a.x > 'q'", "a.x > 'q'", "a.x > 'q'"),
    ("WITH v AS (SELECT amount AS x, customer_id, status FROM orders) SELECT COUNT(*) FROM v a JOIN v b "
     "ON a.status = b.customer_id", "a.status = b.customer_id", "a.status = b.customer_id"),
    ("WITH v AS (SELECT product_id AS x, customer_id FROM orders) SELECT SUM(b.x) FROM v a JOIN v b "
     "ON a.customer_id = b.customer_id", "SUM(b.x)", "SUM(b.x) FROM v a"),
    ("WITH v AS (SELECT customer_id, url FROM orders WHERE url > 3) SELECT COUNT(*) FROM v a JOIN v b "
     "ON a.customer_id = b.customer_id", "url > 3", "url > 3) SELECT"),
    ("WITH v AS (SELECT amount AS x, customer_id FROM orders) SELECT a.x, COUNT(*) FROM v a JOIN v b "
     "ON a.customer_id = b.customer_id", "a.x", "a.x, COUNT(*)"),
    ("WITH v AS (SELECT amount AS x, customer_id FROM orders) SELECT COUNT(*) FROM v a JOIN v b "
     "ON a.customer_id = b.customer_id ORDER BY SUM(a.x)", "SUM(a.x)", "SUM(a.x)"),
    ("WITH v AS (SELECT amount AS x, customer_id, url AS u FROM orders) SELECT COUNT(*) FROM v a JOIN v b "
     "ON a.customer_id = b.customer_id GROUP BY a.u", "a.u", "a.u"),
    ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id WHERE o.amount > 'q'",
     "o.amount > 'q'", "o.amount > 'q'"),
]


@pytest.mark.parametrize("sql,fragment,at", QUOTED, ids=[f"{i}" for i in range(len(QUOTED))])
def test_a_refusal_quotes_the_query_s_own_text_at_its_position(shop_refusing, sql, fragment, at):
    """Merged, a view's column is the view's expression (``v.url`` for ``url``, ``a__amount`` for ``a.x`` over a
    join): a refusal quoted that merged text, and placed it where the view's expression is written."""
    got, follows, message = _quoted(shop_refusing, sql)
    assert (got, follows[: len(at)]) == (fragment, at), message
    assert "__" not in message, message  # a join's flat column names (a__amount) are never quoted


def test_a_message_names_the_view_s_column_as_written(shop):
    """The message's own text names what the query wrote (the table's column it reads comes after)."""
    _, _, message = _quoted(shop, "WITH v AS (SELECT product_id AS x FROM orders) SELECT SUM(x) FROM v")
    assert message.startswith("SUM(x) needs value bounds; table 'orders' declares none for 'product_id'"), message
    _, _, message = _quoted(shop, "WITH v AS (SELECT product_id AS x, customer_id FROM orders) SELECT SUM(b.x) FROM v a "
                                  "JOIN v b ON a.customer_id = b.customer_id")
    assert message.startswith("SUM(b.x) needs value bounds: table 'orders' declares none for 'product_id'"), message
    _, _, message = _quoted(shop, "SELECT o.url, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
                                  "GROUP BY c.segment")
    assert "'o.url' in SELECT" in message, message
    # the flat query's messages are unchanged
    _, _, message = _quoted(shop, "SELECT SUM(product_id) FROM orders")
    assert message.startswith("SUM(product_id) needs value bounds"), message


#: a clause on a subquery in FROM changes which rows it gives: merged without it, the query would be answered as
#: another query (the PIVOT, UNPIVOT and TABLESAMPLE were dropped and the count of every row released)
CLAUSES = [
    ("SELECT COUNT(*) FROM (SELECT * FROM orders) PIVOT (COUNT(*) FOR url IN ('a'))", "PIVOT / UNPIVOT"),
    ("SELECT COUNT(*) FROM (SELECT * FROM orders) UNPIVOT (v FOR k IN (amount))", "PIVOT / UNPIVOT"),
    ("SELECT COUNT(*) FROM (SELECT * FROM orders) t TABLESAMPLE 10%", "TABLESAMPLE"),
    ("SELECT COUNT(*) FROM (SELECT * FROM orders) AS t TABLESAMPLE SYSTEM (10)", "TABLESAMPLE"),
    ("WITH v AS (SELECT * FROM orders) SELECT COUNT(*) FROM v PIVOT (COUNT(*) FOR url IN ('a'))", "PIVOT / UNPIVOT"),
]


@pytest.mark.parametrize("sql,what", CLAUSES, ids=[f"{i}" for i in range(len(CLAUSES))])
def test_a_clause_on_a_subquery_in_from_is_refused(shop, sql, what):
    msg = _refused(shop, sql, errors.UnsupportedQueryError, "is not supported")
    assert what in msg and "write the query flat" in msg, msg
    # negative control: without the clause, the subquery is merged and answered
    assert _answer(shop, "SELECT COUNT(*) FROM (SELECT * FROM orders) t") == _answer(shop, "SELECT COUNT(*) FROM orders")


#: parentheses in FROM that hold no SELECT: named as what they are (they were "a TABLE statement" or "a SUBQUERY
#: statement in a subquery in FROM"), with the fix
PARENTHESISED = [
    ("SELECT COUNT(*) FROM (orders)", "parentheses around a table or a join in FROM", "FROM orders"),
    ("SELECT COUNT(*) FROM (orders o JOIN customers c ON o.customer_id = c.customer_id)",
     "parentheses around a table or a join in FROM", "without the parentheses"),
    ("SELECT COUNT(*) FROM ((orders))", "parentheses around a table or a join in FROM", "without the parentheses"),
    ("SELECT COUNT(*) FROM ((SELECT * FROM orders)) t", "doubled parentheses around a subquery", "(SELECT ...) t"),
    ("SELECT COUNT(*) FROM (VALUES (1)) t(x)", "VALUES in FROM", "registered table"),
    ("SELECT COUNT(*) FROM orders o JOIN (VALUES (1)) t(x) ON o.amount = t.x", "VALUES in FROM", "registered table"),
]


@pytest.mark.parametrize("sql,what,fix", PARENTHESISED, ids=[f"{i}" for i in range(len(PARENTHESISED))])
def test_parentheses_without_a_select_in_from_are_named(shop_refusing, sql, what, fix):
    msg = _refused(shop_refusing, sql, errors.UnsupportedQueryError, "not supported")
    assert what in msg and fix in msg and "statement" not in msg, msg


def test_every_subquery_in_from_is_merged_or_refused_before_the_analysis(shop):
    """The analysis never meets a subquery in FROM or JOIN (its own refusal of them was unreachable and removed):
    the merge answers or refuses each."""
    from dpsql.plan.parse import parse_statements
    from dpsql.plan.views import merge_views

    forms = [
        "SELECT COUNT(*) FROM (SELECT * FROM orders) t", "FROM (SELECT * FROM orders) SELECT COUNT(*)",
        "SELECT COUNT(*) FROM (SELECT * FROM (SELECT * FROM orders) a) b",
        "SELECT COUNT(*) FROM (SELECT * FROM orders) o JOIN (SELECT * FROM customers) c ON o.customer_id = c.customer_id",
        "WITH v AS (SELECT * FROM (SELECT * FROM orders) x) SELECT COUNT(*) FROM v",
        *(sql for sql, _ in CLAUSES), *(sql for sql, _, _ in PARENTHESISED),
    ]
    for sql in forms:
        try:
            merged = merge_views(parse_statements(sql)[0], sql, shop._catalog)
        except errors.QueryError:
            continue
        sources = [merged.args["from_"].this] + [j.this for j in merged.args.get("joins") or []]
        assert not any(isinstance(t, exp.Subquery) for t in sources), sql
