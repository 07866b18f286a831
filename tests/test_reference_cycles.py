"""A cycle of declared references (``users.referrer_id -> users.id``, or ``customer.c_lastorder
-> orders`` with ``orders.o_custkey -> customer``) is refused: a row belongs to every person it
reaches, and to every person that person's row reaches, so through a cycle a row would belong to
a chain of people of unbounded length, which no cap bounds (design invariant 9). The join planner
used to cut such a chain after one turn of the cycle ("the same people again"), although the next
turn can reach a different person. Refused at registration (for free, nothing registered) and, for
a catalog built another way, before any charge when queried."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.catalog import reference_cycle
from dpsql.errors import ConfigError, PolicyError

N = 40


def customer() -> pa.Table:
    k = np.arange(N, dtype=np.int64)
    return pa.table({"c_custkey": k, "c_lastorder": (k + 1) % N})  # each customer's "last order" is another's


def orders() -> pa.Table:
    k = np.arange(N, dtype=np.int64)
    return pa.table({"o_orderkey": k, "o_custkey": k, "o_total": np.ones(N)})


def session() -> dpsql.Session:
    return dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))


def test_a_two_table_cycle_is_refused_at_registration_in_either_order() -> None:
    s = session()
    s.register("customer", customer(), privacy_unit="c_custkey", references={"c_lastorder": "orders.o_orderkey"})
    with pytest.raises(ConfigError) as ei:
        s.register("orders", orders(), references={"o_custkey": "customer.c_custkey"})
    msg = str(ei.value)
    assert "'orders.o_custkey' -> 'customer.c_custkey', 'customer.c_lastorder' -> 'orders.o_orderkey'" in msg
    assert "cycle back to 'orders'" in msg and "without its reference" in msg
    assert "orders" not in s.tables
    # the view of the refused registration is gone: the fix (customer without that reference) registers it
    s.register("customer", customer(), privacy_unit="c_custkey")
    s.register("orders", orders(), references={"o_custkey": "customer.c_custkey"})
    assert "orders" in s.tables

    s = session()
    s.register("orders", orders(), references={"o_custkey": "customer.c_custkey"})  # target not registered yet
    with pytest.raises(ConfigError, match="cycle back to 'customer'"):
        s.register("customer", customer(), privacy_unit="c_custkey", references={"c_lastorder": "orders.o_orderkey"})
    assert "customer" not in s.tables


def test_the_fix_named_by_the_hint_runs() -> None:
    s = session()
    s.register("customer", customer(), privacy_unit="c_custkey")  # c_lastorder a plain column
    s.register("orders", orders(), references={"o_custkey": "customer.c_custkey"})
    r = s.query("SELECT COUNT(*) AS n FROM orders", epsilon=1.0)
    assert r.table.num_rows == 1


def test_a_cycle_through_three_tables_and_a_self_reference_are_refused() -> None:
    s = session()
    s.register("a", pa.table({"id": [1, 2], "b_id": [1, 2]}), privacy_unit="id", references={"b_id": "b.id"})
    s.register("b", pa.table({"id": [1, 2], "c_id": [1, 2]}), references={"c_id": "c.id"})
    with pytest.raises(ConfigError, match=r"'c.a_id' -> 'a.id', 'a.b_id' -> 'b.id', 'b.c_id' -> 'c.id' form a cycle"):
        s.register("c", pa.table({"id": [1, 2], "a_id": [1, 2]}), references={"a_id": "a.id"})
    with pytest.raises(ConfigError, match="'u.boss' -> 'u.id' form a cycle back to 'u'"):
        s.register("u", pa.table({"id": [1, 2], "boss": [2, 1]}), privacy_unit="id", references={"boss": "u.id"})
    with pytest.raises(ConfigError, match="'u.id' -> 'u.id' names the column itself"):
        s.register("u", pa.table({"id": [1, 2]}), privacy_unit="id", references={"id": "u.id"})


def test_no_cycle_no_refusal() -> None:
    # a diamond (two paths to one table) and a chain are not cycles
    cat = {
        "p": dpsql.catalog.TableSpec(name="p", source=None, source_kind="arrow", privacy_unit="id"),
        "m": dpsql.catalog.TableSpec(name="m", source=None, source_kind="arrow", references={"s": "p.id", "r": "p.id"}),
        "x": dpsql.catalog.TableSpec(name="x", source=None, source_kind="arrow", references={"m1": "m.id", "m2": "m.id"}),
    }
    for t in cat.values():
        assert reference_cycle(t, cat) is None
    cyc = {**cat, "p": dataclasses.replace(cat["p"], references={"last": "x.id"})}
    assert reference_cycle(cyc["p"], cyc) == [("p.last", "x.id"), ("x.m1", "m.id"), ("m.s", "p.id")]
    # a public table is not followed: it reaches no person
    pub = {**cyc, "x": dataclasses.replace(cat["x"], public=True, references={})}
    assert reference_cycle(pub["p"], pub) is None


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM orders",
    "SELECT COUNT(*) FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey",
    "SELECT COUNT(*) FROM customer",
])
def test_a_catalog_built_another_way_is_refused_before_any_charge(sql: str) -> None:
    # the cycle closed behind registration's back (a catalog edited in place): every query that
    # reaches it is refused, for free, naming the cycle
    s = session()
    s.register("customer", customer(), privacy_unit="c_custkey")
    s.register("orders", orders(), references={"o_custkey": "customer.c_custkey"},
               degree_bounds={"o_custkey": 1})
    s._catalog["customer"] = dataclasses.replace(s._catalog["customer"], references={"c_lastorder": "orders.o_orderkey"})
    before = s.remaining()
    with pytest.raises(PolicyError, match="form a cycle back to"):
        s.query(sql, epsilon=1.0, delta=1e-6)
    with pytest.raises(PolicyError, match="form a cycle back to"):
        s.explain(sql, epsilon=1.0, delta=1e-6)
    assert s.remaining() == before
    assert s.history().num_rows == 0


def test_a_refused_registration_again_keeps_the_working_one() -> None:
    # registering a table again with a cycle (or any other problem) is refused and leaves the
    # table's previous registration answering as before: bad input loses nothing already set up
    s = session()
    s.register("customer", customer(), privacy_unit="c_custkey")
    s.register("orders", orders(), references={"o_custkey": "customer.c_custkey"})
    before = s.tables["customer"]
    with pytest.raises(ConfigError, match="cycle back to 'customer'"):
        s.register("customer", customer(), privacy_unit="c_custkey", references={"c_lastorder": "orders.o_orderkey"})
    with pytest.raises(ConfigError, match="does not exist"):
        s.register("customer", customer(), privacy_unit="nosuch")
    assert s.tables["customer"] is before
    for sql in ("SELECT COUNT(*) AS n FROM customer", "SELECT COUNT(*) AS n FROM orders"):
        assert s.query(sql, epsilon=1.0).table.num_rows == 1
    # registered again successfully (twice: the view names alternate), the new one answers
    for _ in range(2):
        s.register("customer", customer().slice(0, 10), privacy_unit="c_custkey")
        assert s.tables["customer"] is not before
        assert s.query("SELECT COUNT(*) AS n FROM customer", epsilon=1.0).table.num_rows == 1
    s.close()

