"""A looked-up chain of references (a join tuple whose people are found through tables the join
does not read) must cost work linear in one person's rows. The lookup joins each hop's table on
the key value; without collapsing equal (key, next value) rows per hop, one person holding n
duplicated rows in each of two hops made n^2 intermediate rows (n = 3000: 9 million, the query
13 times slower), so the run time revealed that person's duplicates. The released people are a
DISTINCT list per start value, so collapsing equal hop rows changes nothing released."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from sqlglot import exp

import dpsql
from dpsql.budget import Budget
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.plan.analyze import analyze
from dpsql.rewrite.joins import KeyDigest, _lookup
from dpsql.testing import use_noise, zero_noise

N = 200
SQL = "SELECT COUNT(*) FROM lineitem l JOIN nation n ON l.l_nationkey = n.n_nationkey"


def _session(dup: int) -> dpsql.Session:
    """customer (people: c_person; c_custkey a key) <- orders <- lineitem; person 0 holds ``dup`` extra
    customer rows with key 0 and ``dup`` extra orders with key 0 of customer 0 (all of them person 0's)."""
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    zeros = np.zeros(dup, np.int64)
    cust = pa.table({"c_custkey": np.concatenate([np.arange(N), zeros]), "c_person": np.concatenate([np.arange(N), zeros])})
    orders = pa.table({"o_orderkey": np.concatenate([np.arange(2 * N), zeros]),
                       "o_custkey": np.concatenate([np.arange(2 * N) % N, zeros])})
    li = pa.table({"l_orderkey": np.arange(2 * N), "l_nationkey": np.arange(2 * N) % 5})
    s.register("nation", pa.table({"n_nationkey": np.arange(5)}), public=True)
    s.register("dummy", pa.table({"x": [0]}), public=True, references={"x": "nation.n_nationkey"})
    s.register("customer", cust, privacy_unit="c_person")
    s.register("orders", orders, references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 4})
    s.register("lineitem", li, references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 4})
    return s


def _lookup_rows(s: dpsql.Session) -> tuple[int, list[tuple[int, tuple[str, ...]]]]:
    """(rows the lookup's joins produce before grouping, the people per start value)."""
    plan = analyze(SQL, dict(s.tables))
    jp = plan.join
    assert jp is not None
    (k, slot), = [(k, sl) for k, sl in enumerate(jp.slots) if sl.person_class is None]
    q = _lookup(k, slot, dict(s.tables), KeyDigest("salt", DuckDBOps()))
    view = s.tables["lineitem"].view
    assert view is not None
    sample = exp.select(exp.alias_(exp.column("l_orderkey"), f"{slot.alias}__l_orderkey")).from_(exp.to_table(view, quoted=True))
    people = s._engine.fetch_arrow(q.with_("__s", as_=sample)).to_pylist()
    work = q.copy()
    work.set("group", None)
    work.set("expressions", [exp.alias_(exp.func("count", exp.Star()), "n")])
    n = int(s._engine.fetch_arrow(work.with_("__s", as_=sample)).column("n")[0].as_py())
    return n, sorted((int(r["__k0"]), tuple(sorted(r["__users"]))) for r in people)


def test_lookup_work_is_linear_in_one_persons_duplicated_rows() -> None:
    with _session(0) as s0, _session(3000) as s1:
        n0, people0 = _lookup_rows(s0)
        n1, people1 = _lookup_rows(s1)
    assert people0 == people1  # the same people per start value: duplicates attach nobody new
    assert people1[0] == (0, ("customer:0",))
    # linear: person 0's 6000 extra rows may add at most a few rows per extra row (they added 9 million)
    assert n1 - n0 <= 2 * 6000, (n0, n1)


def test_the_lookup_release_is_unchanged_by_collapsing_duplicates() -> None:
    with _session(50) as s:
        use_noise(s, zero_noise())
        r = s.query(SQL, epsilon=1.0).table.column(0)[0].as_py()
    with _session(0) as s:
        use_noise(s, zero_noise())
        assert s.query(SQL, epsilon=1.0).table.column(0)[0].as_py() == r
