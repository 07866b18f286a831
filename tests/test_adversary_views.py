"""Adversarial probes of CTEs and subqueries in FROM (dpsql/plan/views.py): each view is merged into the flat
query before analysis, so what the merge builds is what is typed, bounded and charged. These tests pin the
places where the merge built something else than the query written, or spent unbounded work before refusing.

Findings kept here: lateral aliases inside one view (``SELECT a AS x0, x0 + x0 AS x1, ...``) were copied
without being counted, so the merge did exponential work before the node limit refused it (fixed: counted
before each copy); a bare column of a view over a join that none of its tables holds escaped the view's
scope: it was read from a table of the outer query, or captured by a select-list alias of the outer query,
and a column two of its tables hold was not reported ambiguous (fixed: refused, as the flat SQL is); ``<col>_bin``
over a view was the bins of any table's ``col``, even one the view does not select (fixed: the view's ``col``);
in the outer HAVING / ORDER BY a view's column won over a select-list alias of its name, a charged answer to
another query (fixed: the alias, as in DuckDB); a chain of select-list aliases in the outer (or any flat) query
was written out exponentially before any refusal (fixed: refused past MAX_SPELLED nodes)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from sqlglot import exp

import dpsql
from dpsql import errors
from dpsql.plan.names import MAX_SPELLED
from dpsql.plan.views import MAX_NODES
from dpsql.testing import use_noise, zero_noise

pytestmark = pytest.mark.filterwarnings("ignore:epsilon=.* is unusually large")


@pytest.fixture
def shop():
    n = 600
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    s.register("products", pa.table({"product_id": pa.array(range(4), pa.int64()), "category": ["p", "q", "p", "q"]}),
               public=True)
    s.register("orders", pa.table({
        "customer_id": pa.array([i % 120 for i in range(n)], pa.int64()),
        "product_id": pa.array([i % 4 for i in range(n)], pa.int64()),
        "amount": pa.array([float(i % 37) for i in range(n)]),
        "status": pa.array(["done" if i % 3 else "open" for i in range(n)]),
    }), privacy_unit="customer_id", max_groups_per_unit=4, max_rows_per_group=10,
        references={"product_id": "products.product_id"},
        columns={"amount": {"bounds": (0, 100)}, "status": {"domain": ["done", "open", "void"]}})
    s.register("customers", pa.table({"customer_id": pa.array(range(120), pa.int64()), "segment": ["a", "b", "c"] * 40}),
               privacy_unit="customer_id", columns={"segment": {"domain": ["a", "b", "c"]}})
    yield s
    s.close()


def _refused(s: dpsql.Session, sql: str, exc: type[Exception], match: str) -> str:
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(exc, match=match) as info:
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == rows and s.remaining() == before  # refused before the charge
    with pytest.raises(exc, match=match):
        s.explain(sql, epsilon=1.0, delta=1e-6)
    return str(info.value)


def _answer(s: dpsql.Session, sql: str) -> list[tuple[object, ...]]:
    use_noise(s, zero_noise(5))
    r = s.query(sql, epsilon=5.0, delta=1e-6)
    return sorted((tuple(row.values()) for row in r.table.to_pylist()), key=repr)


# -- work before refusal --------------------------------------------------------------------------------------------

def _chain(k: int) -> str:
    cols = ["amount AS x0"] + [f"x{i - 1} + x{i - 1} AS x{i}" for i in range(1, k + 1)]
    return f"WITH v AS (SELECT {', '.join(cols)} FROM orders) SELECT COUNT(*) FROM v"


def _counting_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    copied = [0]
    real = exp.Expression.copy

    def counting(self: exp.Expression) -> exp.Expression:
        out = real(self)
        copied[0] += sum(1 for _ in out.walk())
        return out

    monkeypatch.setattr(exp.Expression, "copy", counting)
    return copied


def test_lateral_aliases_inside_one_view_are_counted_before_they_are_copied(shop, monkeypatch):
    # x_k names x_(k-1) twice: merged, 2^k copies of `amount`. The node limit must refuse it after about
    # MAX_NODES copied nodes, not after building the 2^k (k = 16: about 2^17 nodes were copied, k = 40 never ends)
    real = exp.Expression.copy
    copied = _counting_copies(monkeypatch)
    _refused(shop, _chain(16), errors.UnsupportedQueryError, f"more than {MAX_NODES} expression nodes")
    assert copied[0] < 20 * MAX_NODES, copied[0]
    monkeypatch.setattr(exp.Expression, "copy", real)
    _refused(shop, _chain(60), errors.UnsupportedQueryError, f"more than {MAX_NODES} expression nodes")
    # negative control: a short chain is answered as the flat query
    assert _answer(shop, _chain(3).replace("COUNT(*) FROM v", "COUNT(*) FROM v WHERE x3 > 40")) == \
        _answer(shop, "SELECT COUNT(*) FROM orders WHERE 8 * amount > 40")


# -- a view's scope ---------------------------------------------------------------------------------------------------

JOINED = "FROM orders o JOIN products p ON o.product_id = p.product_id"


def test_a_view_over_a_join_does_not_read_a_column_of_the_outer_query(shop):
    # `segment` is a column of none of the view's tables: DuckDB refuses it; merged, it was customers.segment
    _refused(shop, f"WITH v AS (SELECT o.customer_id AS cid, segment AS s {JOINED}) SELECT s, COUNT(*) FROM v "
                   "JOIN customers c ON v.cid = c.customer_id GROUP BY s", errors.UnsupportedQueryError,
             "unknown column 'segment'")
    # ... nor a select-list alias of the outer query (merged, `zz` in the view's WHERE was p2.category)
    _refused(shop, f"WITH v AS (SELECT o.customer_id AS c {JOINED} WHERE zz = 'p') SELECT p2.category AS zz, COUNT(*) "
                   "FROM v JOIN products p2 ON p2.product_id = v.c GROUP BY p2.category", errors.UnsupportedQueryError,
             "unknown column 'zz'")
    # negative control: a bare column one of its tables holds is that table's
    assert _answer(shop, f"WITH v AS (SELECT category, amount {JOINED} WHERE category = 'p') SELECT category, "
                         "SUM(amount) FROM v GROUP BY category") == \
        _answer(shop, f"SELECT p.category, SUM(o.amount) {JOINED} WHERE p.category = 'p' GROUP BY p.category")


def test_a_column_two_tables_of_a_view_hold_is_ambiguous_even_unused(shop):
    _refused(shop, f"WITH v AS (SELECT o.customer_id AS c, product_id AS pid {JOINED}) SELECT COUNT(*) FROM v",
             errors.UnsupportedQueryError, "ambiguous")
    _refused(shop, f"WITH v AS (SELECT o.amount {JOINED} WHERE product_id > 1) SELECT SUM(amount) FROM v",
             errors.UnsupportedQueryError, "ambiguous")


# -- <col>_bin through a view -------------------------------------------------------------------------------------------

@pytest.fixture
def ranged():
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    n = 600
    s.register("orders", pa.table({
        "customer_id": pa.array([i % 120 for i in range(n)], pa.int64()),
        "amount": pa.array([float(i % 37) for i in range(n)]),
        "status": pa.array(["done" if i % 3 else "open" for i in range(n)]),
    }), privacy_unit="customer_id", max_rows_per_unit=5, columns={"amount": {"bounds": (0, 40), "bins": 40}})
    yield s
    s.close()


def test_bins_through_a_view_are_those_of_the_view_s_column(ranged):
    # the view has no column `amount`: its bins are unknown (they were the bins of orders.amount)
    _refused(ranged, "WITH v AS (SELECT status FROM orders WHERE amount > 5) SELECT amount_bin, COUNT(*) FROM v "
                     "GROUP BY amount_bin", errors.UnsupportedQueryError, "unknown column 'amount_bin'")
    # the view's `amount` is the privacy unit: never the bins of orders.amount
    _refused(ranged, "WITH v AS (SELECT customer_id AS amount FROM orders) SELECT amount_bin, COUNT(*) FROM v "
                     "GROUP BY amount_bin", errors.UnsupportedQueryError, "customer_id_bin")
    _refused(ranged, "WITH v AS (SELECT amount + 0 AS amount FROM orders) SELECT amount_bin, COUNT(*) FROM v "
                     "GROUP BY amount_bin", errors.UnsupportedQueryError, "an expression")
    # negative controls: the view's column is orders.amount, under its name or another
    flat = _answer(ranged, "SELECT amount_bin, COUNT(*) FROM orders GROUP BY amount_bin")
    assert _answer(ranged, "WITH v AS (SELECT amount FROM orders) SELECT amount_bin, COUNT(*) FROM v "
                           "GROUP BY amount_bin") == flat
    assert _answer(ranged, "WITH v AS (SELECT amount AS a FROM orders) SELECT v.a_bin, COUNT(*) FROM v "
                           "GROUP BY a_bin") == flat


# -- the outer query's output names in HAVING and ORDER BY ------------------------------------------------------------

def test_having_and_order_by_name_the_outer_output_before_a_view_column(shop):
    # DuckDB and the flat query read `n` in ORDER BY / HAVING as the output COUNT(*) AS n; merged, it was the view's
    # column `n` (status): a charged answer to another query
    flat = _answer(shop, "SELECT status, COUNT(*) AS n FROM orders GROUP BY status ORDER BY n DESC LIMIT 1")
    assert flat and flat[0][0] == "done"
    assert _answer(shop, "WITH v AS (SELECT status AS n, status FROM orders) SELECT status, COUNT(*) AS n FROM v "
                         "GROUP BY status ORDER BY n DESC LIMIT 1") == flat
    assert _answer(shop, "WITH v AS (SELECT amount AS n, status FROM orders) SELECT status, COUNT(*) AS n FROM v "
                         "GROUP BY status HAVING n > 300") == \
        _answer(shop, "SELECT status, COUNT(*) AS n FROM orders GROUP BY status HAVING n > 300")
    # inside an aggregate the name is the view's column (an aggregate of an output is no aggregate)
    assert _answer(shop, "WITH v AS (SELECT amount AS n, status FROM orders) SELECT status, COUNT(*) AS n FROM v "
                         "GROUP BY status HAVING SUM(n) > 1 ORDER BY status") == \
        _answer(shop, "SELECT status, COUNT(*) AS n FROM orders GROUP BY status HAVING SUM(amount) > 1 ORDER BY status")


def test_a_chain_of_select_list_aliases_is_refused_before_it_is_written_out(shop, monkeypatch):
    # the same chain in the outer query (flat, or over a view): WHERE and later outputs read an alias written out,
    # 2^k nodes; refused after about MAX_SPELLED copied nodes (k = 16: about 2^19 nodes were copied, k = 40 never ends)
    def chain(k: int, source: str) -> str:
        cols = ["amount AS x0"] + [f"x{i - 1} + x{i - 1} AS x{i}" for i in range(1, k + 1)]
        return f"SELECT COUNT(*), {', '.join(cols)} FROM {source} WHERE x{k} > 0"

    real = exp.Expression.copy
    for source in ("orders", "(SELECT amount FROM orders) t"):
        copied = _counting_copies(monkeypatch)
        _refused(shop, chain(16, source), errors.UnsupportedQueryError, f"more than {MAX_SPELLED} expression nodes")
        assert copied[0] < 40 * MAX_SPELLED, copied[0]
        monkeypatch.setattr(exp.Expression, "copy", real)
        _refused(shop, chain(60, source), errors.UnsupportedQueryError, f"more than {MAX_SPELLED} expression nodes")
    # negative control: a short chain is read through (then refused for its raw outputs, as before)
    _refused(shop, chain(3, "orders"), errors.UnsupportedQueryError, "outside an aggregate")
