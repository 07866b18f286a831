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
