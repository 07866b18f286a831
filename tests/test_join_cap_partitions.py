"""Enforced Delta needs each capped partition to belong to one set of people. An input is capped
per value of the column it joins on; when the input reaches people through another column too
(``lineitem`` references its order, and its customer directly), rows of one partition belonged to
different people: a person with no join tuple at all could fill every other customer's partitions
with line items of their own and push those customers' rows out of the cap. Removing that one
person (in zero tuples) then moved the truncated count of the others by hundreds at Delta = 32.
The cap now partitions by the joined column and every column through which the input reaches
people (all fixed by the rows already joined), so a partition's rows reach the same people."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.plan.analyze import analyze
from dpsql.plan.joins import bound_people
from dpsql.rewrite.joins import truncated_sums

N = 60
SQL = ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
       "JOIN lineitem l ON l.l_orderkey = o.o_orderkey AND l.l_custkey = c.c_custkey")


def _session(intruder: bool) -> dpsql.Session:
    """N customers with one order and 4 line items each; the intruder (customer N, no order) holds 40
    line items on every other customer's order (rows that reach both the intruder and that customer)."""
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    cust = list(range(N)) + ([N] if intruder else [])
    lk, lc = np.repeat(np.arange(N) + 1000, 4), np.repeat(np.arange(N), 4)
    if intruder:
        lk = np.concatenate([lk, np.repeat(np.arange(N) + 1000, 40)])
        lc = np.concatenate([lc, np.full(N * 40, N)])
    s.register("customer", pa.table({"c_custkey": pa.array(cust, pa.int64())}), privacy_unit="c_custkey")
    s.register("orders", pa.table({"o_orderkey": np.arange(N) + 1000, "o_custkey": np.arange(N)}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8})
    s.register("lineitem", pa.table({"l_orderkey": lk, "l_custkey": lc}),
               references={"l_orderkey": "orders.o_orderkey", "l_custkey": "customer.c_custkey"},
               degree_bounds={"l_orderkey": 4, "l_custkey": 10_000})
    return s


def _truncated(intruder: bool, taus: list[float], seed: int) -> list[int]:
    with _session(intruder) as s:
        plan = analyze(SQL, dict(s.tables))
        assert plan.join is not None
        pb = bound_people(plan.join, dict(s.tables))
        assert pb.enforced and pb.delta == 32 and pb.owner is not None
        q = truncated_sums(plan.join, dict(s.tables), pb.owner, taus, salt=f"salt{seed}", q=1.0, ops=s._engine.ops,
                           caps=pb.caps)
        row = s._engine.fetch_arrow(q).to_pylist()[0]
        return [int(row[f"__f0_{i}"]) for i in range(len(taus))]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_person_in_no_tuple_moves_the_truncated_count_by_at_most_tau(seed: int) -> None:
    taus = [1.0, 4.0, 32.0]
    with_intruder, without = _truncated(True, taus, seed), _truncated(False, taus, seed)
    assert without == [N, 4 * N, 4 * N]
    for tau, a, b in zip(taus, with_intruder, without, strict=True):
        assert abs(a - b) <= tau, (tau, a, b)


def test_the_cap_partitions_by_every_column_that_reaches_people() -> None:
    with _session(False) as s:
        plan = analyze(SQL, dict(s.tables))
        assert plan.join is not None
        caps = bound_people(plan.join, dict(s.tables)).caps
    assert ("l", "l_orderkey,l_custkey", 4) in caps


# -- generated hostile data: duplicated order keys, NULL and dangling references, people over the bounds --------
def _hostile(seed: int, n: int = 25) -> dict[str, pa.Table]:
    g = np.random.default_rng(seed)
    o_cust: list[object] = np.repeat(np.arange(n), g.integers(0, 6, n)).tolist()
    o_key: list[object] = (np.arange(len(o_cust)) + 100).tolist()
    for i in g.choice(len(o_key), 4, replace=False):
        o_key[i] = o_key[(i + 3) % len(o_key)]  # an order key held by two customers
    for i in g.choice(len(o_cust), 2, replace=False):
        o_cust[i] = None
    m = 300
    l_key: list[object] = g.choice(np.asarray([*o_key, 9999], dtype=np.int64), m).tolist()
    l_cust: list[object] = g.integers(0, n, m).tolist()  # mostly someone else's order
    for i in g.choice(m, 10, replace=False):
        l_key[i] = None
    for i in g.choice(m, 10, replace=False):
        l_cust[i] = None
    return {"customer": pa.table({"c_custkey": pa.array(np.arange(n), pa.int64())}),
            "orders": pa.table({"o_orderkey": pa.array(o_key, pa.int64()), "o_custkey": pa.array(o_cust, pa.int64())}),
            "lineitem": pa.table({"l_orderkey": pa.array(l_key, pa.int64()), "l_custkey": pa.array(l_cust, pa.int64())})}


def _without(data: dict[str, pa.Table], victim: int) -> dict[str, pa.Table]:
    """Every row that reaches ``victim`` removed: their customer row and orders, and every line item on an order key
    they hold or naming them as its customer."""
    import pyarrow.compute as pc

    o, li, c = data["orders"], data["lineitem"], data["customer"]
    mine = pc.fill_null(pc.equal(o["o_custkey"], victim), False)
    gone = pc.or_(pc.fill_null(pc.is_in(li["l_orderkey"], value_set=o.filter(mine)["o_orderkey"]), False),
                  pc.fill_null(pc.equal(li["l_custkey"], victim), False))
    return {"customer": c.filter(pc.not_equal(c["c_custkey"], victim)), "orders": o.filter(pc.invert(mine)),
            "lineitem": li.filter(pc.invert(gone))}


def _sums(data: dict[str, pa.Table], sql: str, taus: list[float], salt: str) -> list[int]:
    with dpsql.Session(budget=Budget(100.0, 1e-3)) as s:
        s.register("customer", data["customer"], privacy_unit="c_custkey")
        s.register("orders", data["orders"], references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 3})
        s.register("lineitem", data["lineitem"], references={"l_orderkey": "orders.o_orderkey",
                                                             "l_custkey": "customer.c_custkey"},
                   degree_bounds={"l_orderkey": 3, "l_custkey": 5})
        plan = analyze(sql, dict(s.tables))
        assert plan.join is not None
        pb = bound_people(plan.join, dict(s.tables))
        assert pb.enforced and pb.owner is not None
        q = truncated_sums(plan.join, dict(s.tables), pb.owner, taus, salt=salt, q=1.0, ops=s._engine.ops, caps=pb.caps)
        row = s._engine.fetch_arrow(q).to_pylist()[0]
        return [int(row[f"__f0_{i}"]) for i in range(len(taus))]


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM orders o JOIN lineitem l ON l.l_orderkey = o.o_orderkey AND l.l_custkey = o.o_custkey",
    SQL.replace("AND l.l_custkey = c.c_custkey", "AND l.l_custkey = o.o_custkey"),
])
def test_removing_anyone_moves_each_truncated_value_by_at_most_tau_on_hostile_data(sql: str) -> None:
    """(Partitioned per order key only, as before, seed 2 fails at victim 0, tau 1: 5 against 3.)"""
    taus = [1.0, 2.0, 1e6]
    for seed in (2,):
        data = _hostile(seed)
        full = _sums(data, sql, taus, f"s{seed}")
        for victim in range(0, 25, 4):
            for tau, a, b in zip(taus, full, _sums(_without(data, victim), sql, taus, f"s{seed}"), strict=True):
                assert abs(a - b) <= tau, (seed, victim, tau, a, b)
