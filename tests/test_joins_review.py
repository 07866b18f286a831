"""Joins: who a join tuple belongs to when the data breaks what the catalog declares (duplicate or
dangling keys), references followed through person tables, typed user ids, public tables that
come to reference people, and the smaller rules of the join path (clamps, OFFSET, q, the owner's
permission to sample on an attested Delta, the schedule's last step).

Neighbouring datasets here are the join path's relation: remove one person together with every
row that reaches them through declared references (and so every join tuple they are in)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms import s4s as core
from dpsql.plan.analyze import analyze
from dpsql.plan.joins import bound_people
from dpsql.rewrite.joins import sampled_tuples, truncated_sums


def _i64(xs: list[int]) -> pa.Array:
    return pa.array(xs, pa.int64())


def _plan(s: Any, sql: str) -> Any:
    plan = analyze(sql, dict(s.tables))
    return plan.join, bound_people(plan.join, dict(s.tables))


def _fbar(s: Any, sql: str, taus: list[float]) -> tuple[list[float], pa.Table]:
    """f̄(I, τ) on the tuples and users the join SQL produces (q = 1), a tuple's users de-duplicated."""
    jp, pb = _plan(s, sql)
    t = s._engine.fetch_arrow(sampled_tuples(jp, dict(s.tables), salt="k", q=1.0, ops=s._engine.ops, caps=pb.caps))
    w = np.asarray(t.column("__w0").to_numpy(), dtype=float)
    pairs = set()
    for k in range(len(jp.slots)):
        for i, u in enumerate(t.column(f"__u{k}").to_pylist()):
            for x in u if isinstance(u, list) else [u]:
                if x is not None:
                    pairs.add((i, x))
    names = {u: j for j, u in enumerate(sorted({x for _, x in pairs}))}
    ti = [i for i, _ in sorted(pairs)]
    ui = [names[x] for _, x in sorted(pairs)]
    return [core.truncated_value(w, ti, ui, tau) for tau in taus], t


def _fast(s: Any, sql: str, taus: list[float]) -> list[int]:
    jp, pb = _plan(s, sql)
    assert pb.enforced
    row = s._engine.fetch_arrow(truncated_sums(jp, dict(s.tables), pb.owner, taus, salt="k", q=1.0, ops=s._engine.ops,
                                               caps=pb.caps)).to_pylist()[0]
    return [int(row[f"__f0_{i}"]) for i in range(len(taus))]


# -- F1: duplicate and dangling keys ---------------------------------------------------------------

B = 1000  # the removed customer: the largest id (a MIN look-up would attribute shared keys to the others)


def _dup_session(drop_b: bool, *, dangling: int = 0) -> Any:
    """Order keys 100+i are held by two orders rows, of customer A_i and of B (a duplicate in a
    declared key); 4 line items per key. Dropping B removes B, B's orders and every line item
    that reaches B (here all of them). ``dangling``: line items whose order key has no orders row."""
    m = 20
    cust = list(range(1, m + 1)) + ([] if drop_b else [B])
    orders = [(100 + i, i) for i in range(1, m + 1)] + ([] if drop_b else [(100 + i, B) for i in range(1, m + 1)])
    items = [] if drop_b else [100 + i for i in range(1, m + 1) for _ in range(4)]
    items += [999] * dangling
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("customer", pa.table({"c_custkey": _i64(cust)}), privacy_unit="c_custkey")
    s.register("orders", pa.table({"o_orderkey": _i64([k for k, _ in orders]), "o_custkey": _i64([c for _, c in orders])}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 64})
    s.register("lineitem", pa.table({"l_orderkey": _i64(items)}), references={"l_orderkey": "orders.o_orderkey"},
               degree_bounds={"l_orderkey": 7})
    return s


def test_a_lookup_attaches_every_person_of_a_duplicated_key() -> None:
    """A line item whose order key is held by A_i's and B's orders belongs to both: removing B
    moves f̄ by at most τ (a MIN look-up gave each tuple to A_i only: f̄ moved by 80 at τ = 4)."""
    taus = [1.0, 4.0, 8.0]
    s, s2 = _dup_session(False), _dup_session(True)
    try:
        full, t = _fbar(s, "SELECT COUNT(*) FROM lineitem", taus)
        users = t.column("__u0").to_pylist()
        assert all(len(u) == 2 and f"customer:{B}" in u for u in users)
        less, _ = _fbar(s2, "SELECT COUNT(*) FROM lineitem", taus)
        for tau, a, b in zip(taus, full, less, strict=True):
            assert 0 <= a - b <= tau
    finally:
        s.close()
        s2.close()


def test_a_dangling_lookup_gets_a_synthetic_user_and_stays_truncated() -> None:
    """50 line items of an order key with no orders row reach no person: they share the synthetic
    user of that key and count at most τ (they were counted in full, 50)."""
    s = _dup_session(True, dangling=50)
    try:
        (v,), t = _fbar(s, "SELECT COUNT(*) FROM lineitem", [4.0])
        assert v == 4.0
        assert {u for us in t.column("__u0").to_pylist() for u in us} == {"~orders.o_orderkey:999"}
    finally:
        s.close()


def _chain_dup_session(drop_b: bool) -> Any:
    """customer ⋈ orders ⋈ lineitem with order keys 100..107 held by B's orders and by A_i's; C
    holds keys 200.. alone (unaffected). Dropping B cascades to the line items of keys 100..107."""
    cust = list(range(8)) + [50] + ([] if drop_b else [B])
    orders = [(100 + i, i) for i in range(8)] + [(200 + i, 50) for i in range(3)]
    orders += [] if drop_b else [(100 + i, B) for i in range(8)]
    items = [200 + i for i in range(3) for _ in range(2)] + ([] if drop_b else [100 + i for i in range(8) for _ in range(4)])
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("customer", pa.table({"c_custkey": _i64(cust)}), privacy_unit="c_custkey")
    s.register("orders", pa.table({"o_orderkey": _i64([k for k, _ in orders]), "o_custkey": _i64([c for _, c in orders])}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8})
    s.register("lineitem", pa.table({"l_orderkey": _i64(items)}), references={"l_orderkey": "orders.o_orderkey"},
               degree_bounds={"l_orderkey": 4})
    return s


def test_an_enforced_chain_drops_duplicated_keys_so_one_person_moves_it_by_at_most_tau() -> None:
    """The join pairs a line item with each orders row of its key, one owner per tuple; with a
    duplicated key the line item also reaches B, so removing B removed A_i's tuples too (|Δf̄| = 9
    at τ = 1). Rows of a duplicated key are dropped (stable): |Δf̄| ≤ τ, C's tuples still count."""
    sql = ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
           "JOIN lineitem l ON o.o_orderkey = l.l_orderkey")
    taus = [1.0, 2.0, 64.0]
    s, s2 = _chain_dup_session(False), _chain_dup_session(True)
    try:
        jp, _ = _plan(s, sql)
        assert ("o", "o_orderkey") in jp.unique_keys
        full, less = _fast(s, sql, taus), _fast(s2, sql, taus)
        for tau, a, b in zip(taus, full, less, strict=True):
            assert 0 <= a - b <= tau
        assert full[-1] == less[-1] == 6  # C's 6 line items (keys held once) count
    finally:
        s.close()
        s2.close()


# -- F2: references followed through person tables ----------------------------------------------


def _rep_session(drop_rep: bool) -> Any:
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("salesrep", pa.table({"id": _i64([8] if drop_rep else [7, 8])}), privacy_unit="id")
    cust = [] if drop_rep else list(range(30))  # every customer is served by rep 7
    s.register("customer", pa.table({"c_custkey": _i64(cust), "c_rep": _i64([7] * len(cust))}), privacy_unit="c_custkey",
               references={"c_rep": "salesrep.id"}, degree_bounds={"c_rep": 1000})
    o = [c for c in cust for _ in range(5)]
    s.register("orders", pa.table({"o_orderkey": _i64(list(range(len(o)))), "o_custkey": _i64(o)}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8})
    s.register("lineitem", pa.table({"l_orderkey": _i64(list(range(len(o))))}),
               references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 7})
    return s


def test_references_are_followed_through_person_tables() -> None:
    """orders -> customer -> salesrep: the sales representative is a user of every tuple of her
    customers' orders; removing her moves f̄ by at most τ (it moved by 30 at τ = 1)."""
    sql = "SELECT COUNT(*) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey"
    taus = [1.0, 4.0]
    s, s2 = _rep_session(False), _rep_session(True)
    try:
        jp, pb = _plan(s, sql)
        assert {x.person_table for x in jp.slots} == {"customer", "salesrep"}
        assert not pb.single_owner and not pb.enforced
        assert s.explain(sql, epsilon=1.0).mechanism == "r2t"
        full, _ = _fbar(s, sql, taus)
        less, _ = _fbar(s2, sql, taus)
        for tau, a, b in zip(taus, full, less, strict=True):
            assert 0 <= a - b <= tau
    finally:
        s.close()
        s2.close()


# -- F3: one person, one id --------------------------------------------------------------------


def test_a_reference_must_have_the_target_columns_type() -> None:
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    try:
        s.register("node", pa.table({"id": _i64(list(range(10)))}), privacy_unit="id")
        for col in (pa.array(["1", "01"]), pa.array([1.0, 2.0]), pa.array([1, 2], pa.int32())):
            with pytest.raises(ConfigError, match="types differ") as info:
                s.register("likes", pa.table({"a": col}), references={"a": "node.id"}, degree_bounds={"a": 4})
            assert "give 'likes.a' the type BIGINT" in str(info.value)
        assert "likes" not in s.tables
        s.register("fnode", pa.table({"id": pa.array([1.0])}), privacy_unit="id")
        with pytest.raises(ConfigError, match="floating-point"):
            s.register("flikes", pa.table({"a": pa.array([1.0])}), references={"a": "fnode.id"})
        # the target registered (again) with another type after the reference: refused when joined, for free
        s.register("likes", pa.table({"a": _i64([1, 1]), "b": _i64([2, 3])}), references={"a": "node.id", "b": "node.id"},
                   degree_bounds={"a": 4, "b": 4})
        s.register("node", pa.table({"id": pa.array(["1", "2", "3"])}), privacy_unit="id")
        before = s.remaining()
        with pytest.raises(PolicyError, match=r"types differ.*hint: the data owner must give 'likes.a' the type VARCHAR"):
            s.query("SELECT COUNT(*) FROM likes", epsilon=1.0)
        assert s.remaining() == before and s.history().num_rows == 0
    finally:
        s.close()


# -- F4: public tables reference only public tables -------------------------------------------------


def test_a_table_referenced_by_a_public_table_cannot_become_private() -> None:
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    try:
        s.register("region", pa.table({"r_key": _i64([0, 1])}), public=True)
        s.register("nation", pa.table({"n_key": _i64([0, 1, 2]), "n_region": _i64([0, 0, 1])}), public=True,
                   references={"n_region": "region.r_key"})
        with pytest.raises(ConfigError, match="public table 'nation' references 'region'"):
            s.register("region", pa.table({"r_key": _i64([0, 1])}), privacy_unit="r_key")
        assert s.tables["region"].public
    finally:
        s.close()


def test_a_public_table_referencing_people_is_refused_when_joined() -> None:
    """Whatever the registration order, the join path refuses (free) a public table whose
    reference leads to a table that is not public."""
    import dataclasses

    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    try:
        s.register("region", pa.table({"r_key": _i64([0, 1])}), privacy_unit="r_key")
        s.register("nation", pa.table({"n_key": _i64([0, 1, 2]), "n_region": _i64([0, 0, 1])}), public=True)
        s.register("customer", pa.table({"c_custkey": _i64(list(range(30))), "c_nat": _i64([i % 3 for i in range(30)])}),
                   privacy_unit="c_custkey", references={"c_nat": "nation.n_key"})
        catalog = dict(s.tables)
        catalog["nation"] = dataclasses.replace(catalog["nation"], references={"n_region": "region.r_key"})
        with pytest.raises(PolicyError, match="public table 'nation' references 'region.r_key'"):
            analyze("SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_nat = n.n_key", catalog)
    finally:
        s.close()


# -- F5 / F6 / F7: clamps, OFFSET, q ---------------------------------------------------------------


def _graph_session(allow: tuple[bool, bool] = (True, True)) -> Any:
    from dpsql.testing import use_noise, zero_noise

    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("node", pa.table({"id": _i64(list(range(6)))}), privacy_unit="id", allow_conditional_sampling=allow[0])
    s.register("edge", pa.table({"src": _i64([0, 1, 2, 3, 4]), "dst": _i64([1, 2, 3, 4, 5])}),
               references={"src": "node.id", "dst": "node.id"}, degree_bounds={"src": 4, "dst": 4},
               allow_conditional_sampling=allow[1])
    use_noise(s, zero_noise())
    return s


def test_a_clamp_around_a_plain_column_names_the_column() -> None:
    s = _graph_session()
    try:
        plan = analyze("SELECT SUM(LEAST(GREATEST(e1.src, -5), 5)) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src",
                       dict(s.tables))
        # the clamp as SQL computes it: GREATEST / LEAST skip NULL, so a NULL src gives -5
        assert plan.join.value.sql() == "COALESCE(e1__src, -5)" and plan.join.bounds == (-5.0, 5.0)
        plan = analyze("SELECT SUM(GREATEST(LEAST(e2.dst, 10), 0)) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src",
                       dict(s.tables))
        assert plan.join.value.sql() == "COALESCE(e2__dst, 10)" and plan.join.bounds == (0.0, 10.0)
    finally:
        s.close()


def test_offset_and_limit_post_process_the_joined_release() -> None:
    s = _graph_session()
    sql = "SELECT COUNT(*) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src"
    try:
        assert analyze(sql + " LIMIT 1 OFFSET 0", dict(s.tables)).offset == 0
        before = s.remaining()
        # the one released row skipped: no row whatever the data, refused before the charge (as LIMIT 0)
        with pytest.raises(UnsupportedQueryError, match="charged for nothing"):
            s.query(sql + " OFFSET 1", epsilon=1.0)
        assert s.remaining() == before
        assert s.query(sql + " OFFSET 0", epsilon=1.0).table.num_rows == 1
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match="LIMIT must be a non-negative integer literal"):
            s.query(sql + " LIMIT 1 + 1", epsilon=1.0)
        assert s.remaining() == before
    finally:
        s.close()


def test_a_tiny_q_is_named_with_its_usable_range() -> None:
    s = _graph_session()
    try:
        with pytest.raises(ConfigError, match=r"q=1e-09 is too small") as info:
            s.explain("SELECT COUNT(*) FROM edge", epsilon=1.0, options={"q": 1e-9, "max_tuples_per_user": 8})
        m = re.search(r"use q >= ([0-9.e-]+) \(the usable range here is \[", str(info.value))
        assert m is not None
        least = float(m.group(1))
        assert 1e-9 < least <= 1.0
        # the least q named works (up to the owner's permission to sample: F9), half of it does not
        p = s.explain("SELECT COUNT(*) FROM edge", epsilon=1.0, options={"q": least, "max_tuples_per_user": 8})
        assert p.parameters["q"] == least
        with pytest.raises(ConfigError, match="too small"):
            s.explain("SELECT COUNT(*) FROM edge", epsilon=1.0, options={"q": least / 2, "max_tuples_per_user": 8})
    finally:
        s.close()


# -- F9: the owner allows sampling on an attested Delta ------------------------------------------


@pytest.mark.parametrize("allow", [(False, False), (True, False), (False, True)])
def test_sampling_on_an_attested_delta_needs_the_owners_permission(allow: tuple[bool, bool]) -> None:
    s = _graph_session(allow)
    path2 = "SELECT COUNT(*) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src"
    try:
        for call in (s.explain, s.query):
            with pytest.raises(PolicyError, match="has not allowed that for table") as info:
                call(path2, epsilon=1.0, options={"q": 0.25})
            assert "allow_conditional_sampling=True" in str(info.value)
        assert s.history().num_rows == 0
        assert s.explain(path2, epsilon=1.0).mechanism == "r2t"  # the default needs no permission
    finally:
        s.close()
    s = _graph_session((True, True))
    try:
        assert s.explain(path2, epsilon=1.0, options={"q": 0.25}).mechanism == "dp_s4s"
    finally:
        s.close()


def test_the_owners_permission_is_a_table_setting_of_the_config_file(tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": _i64([1, 2])}), tmp_path / "node.parquet")
    pq.write_table(pa.table({"src": _i64([1, 2]), "dst": _i64([2, 1])}), tmp_path / "edge.parquet")
    (tmp_path / "dpsql.toml").write_text(
        '[ledger]\npath = ":memory:"\nepsilon = 10\n'
        '[tables.node]\nsource = "node.parquet"\nprivacy_unit = "id"\nallow_conditional_sampling = true\n'
        '[tables.edge]\nsource = "edge.parquet"\nreferences = { src = "node.id", dst = "node.id" }\n'
        'degree_bounds = { src = 4, dst = 4 }\nallow_conditional_sampling = true\n')
    s = dpsql.Session.from_config(tmp_path / "dpsql.toml")
    try:
        assert s.tables["edge"].allow_conditional_sampling and s.tables["edge"].public_description()["allow_conditional_sampling"]
        assert s.explain("SELECT COUNT(*) FROM edge", epsilon=1.0, options={"q": 0.5}).mechanism == "dp_s4s"
    finally:
        s.close()
