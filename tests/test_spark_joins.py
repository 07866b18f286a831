"""Joins (DP-S4S and R2T) on Spark: the same join tuples, sample and truncated values as DuckDB.

With the portable keyed hash on DuckDB (``[engine] keyed_hash = "portable"``: the per-hop row caps
choose the same rows) and the join's tuple identities taken from the tuples' content
(``dpsql.rewrite.joins``: the same on every engine), the same join query under the same salt gives,
on DuckDB and on Spark ``local[2]``:

* single owner (closed form in the engine): the same exact truncated sums for every tau, also
  where the declared per-hop caps bind (the data exceed the declared bounds);
* several people per tuple or looked-up people: the same multiset of sampled tuples (weights and
  the set of people of each), so the same truncation;
* with zero noise, the same released value.

Negative controls: another salt samples other tuples, and DuckDB's native hash caps other rows,
so these comparisons can fail. Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

_WHY = ("the Spark engine needs the 'spark' extra: pip install 'dpsql[spark]'"
        if importlib.util.find_spec("pyspark") is None else
        "the Spark engine needs Java 17 on the PATH" if shutil.which("java") is None else None)
if _WHY is not None:
    if os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
        raise RuntimeError(_WHY + " (DPSQL_REQUIRE_EXTRAS=1: these tests must run here)")
    pytest.skip(_WHY, allow_module_level=True)

CHAIN = ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
         "JOIN lineitem l ON o.o_orderkey = l.l_orderkey")
ORDERS, ITEMS = 8, 4


def fk_data(seed: int = 17, n_customers: int = 200) -> dict[str, pa.Table]:
    """customer <- orders <- lineitem, with many customers and orders beyond the declared bounds
    (up to 14 orders per customer, 8 declared; up to 8 items per order, 4 declared): the caps bind."""
    g = np.random.default_rng(seed)
    o_cust = np.repeat(np.arange(n_customers), g.integers(0, ORDERS + 7, n_customers))
    o_key = np.arange(o_cust.size) + 1000
    l_ord = np.repeat(o_key, g.integers(1, ITEMS + 5, o_key.size))
    src, dst = g.integers(0, 50, 300), g.integers(0, 50, 300)
    keep = src != dst
    return {
        "nation": pa.table({"n_nationkey": np.arange(5), "n_name": ["A", "B", "C", "D", "E"]}),
        "customer": pa.table({"c_custkey": np.arange(n_customers), "c_nationkey": g.integers(0, 5, n_customers)}),
        "orders": pa.table({"o_orderkey": o_key, "o_custkey": o_cust}),
        "lineitem": pa.table({"l_orderkey": l_ord, "l_price": np.round(g.uniform(-20, 100, l_ord.size), 2)}),
        "node": pa.table({"id": np.arange(50)}),
        "edge": pa.table({"src": src[keep], "dst": dst[keep]}),  # duplicate edges included
    }


def make(kind: str, data: dict[str, pa.Table], keyed_hash: str = "portable", master: str | None = None,
         nation_domain: bool = False) -> dpsql.Session:
    engine: dict[str, Any] = {"kind": kind, "statement_timeout": 300}
    if kind == "duckdb":
        engine["keyed_hash"] = keyed_hash
    if master is not None:
        engine["master"] = master
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 0.5), engine=engine)
    use_noise(s, zero_noise(23))
    s.register("nation", data["nation"], public=True)
    s.register("customer", data["customer"], privacy_unit="c_custkey", references={"c_nationkey": "nation.n_nationkey"},
               allow_conditional_sampling=True,
               columns={"c_nationkey": {"domain": [0, 1, 2, 3, 4]}} if nation_domain else None)
    s.register("orders", data["orders"], references={"o_custkey": "customer.c_custkey"},
               degree_bounds={"o_custkey": ORDERS}, allow_conditional_sampling=True)
    s.register("lineitem", data["lineitem"], references={"l_orderkey": "orders.o_orderkey"},
               degree_bounds={"l_orderkey": ITEMS}, columns={"l_price": {"bounds": (-20, 100)}},
               allow_conditional_sampling=True)
    s.register("node", data["node"], privacy_unit="id", allow_conditional_sampling=True)
    s.register("edge", data["edge"], references={"src": "node.id", "dst": "node.id"},
               degree_bounds={"src": 16, "dst": 16}, allow_conditional_sampling=True)
    return s


#: name -> (sql, options): every shape of join SQL (closed form / sampled tuples, lookups, parts)
QUERIES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "chain_count_r2t_caps": (CHAIN, {"q": 1.0}),
    "chain_count_sampled": (CHAIN, {"q": 0.25}),
    "chain_sum_two_parts": ("SELECT SUM(l.l_price) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey",
                            {"q": 0.5}),
    "chain_where_across_inputs": (CHAIN + " WHERE c.c_nationkey = 2 OR l.l_price < 0", {"q": 0.5}),
    "lookup_sampled": ("SELECT COUNT(*) FROM lineitem WHERE l_price > 10", {"q": 0.5}),
    "lookup_sum_r2t": ("SELECT SUM(l_price) FROM lineitem", None),
    "path2_sampled": ("SELECT COUNT(*) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src", {"q": 0.5}),
}


@pytest.fixture(scope="module")
def data() -> dict[str, pa.Table]:
    return fk_data()


@pytest.fixture(scope="module")
def duck(data: dict[str, pa.Table]) -> Any:
    s = make("duckdb", data)
    yield s
    s.close()


@pytest.fixture(scope="module")
def spark(data: dict[str, pa.Table]) -> Any:
    s = make("spark", data)
    yield s
    s.close()


def bounded(s: dpsql.Session, name: str, salt: str) -> pa.Table:
    sql, opts = QUERIES[name]
    r = s._route(sql, 1.0, 1e-5, opts)
    return s._engine.fetch_arrow(r.mechanism.bounded(r.calibration, salt, s._engine.ops))


def canonical(t: pa.Table) -> list[Any]:
    """Closed form: the one row of exact truncated sums. Sampled tuples: the sorted multiset of
    (weights, per slot the person or the set of people)."""
    rows = t.to_pylist()
    if "__f0_0" in t.column_names:
        return rows
    out = []
    for r in rows:
        w = tuple(v for k, v in sorted(r.items()) if k.startswith("__w"))
        users = tuple(tuple(sorted(v)) if isinstance(v, list) else v for k, v in sorted(r.items()) if k.startswith("__u"))
        out.append((w, users))
    return sorted(out, key=repr)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_join_bounded_results_are_the_same_on_duckdb_and_spark(duck: dpsql.Session, spark: dpsql.Session,
                                                                name: str) -> None:
    for salt in ("salt one", "another salt"):
        d, s = canonical(bounded(duck, name, salt)), canonical(bounded(spark, name, salt))
        assert d, name
        assert d == s, name


def test_the_caps_bind_and_spark_keeps_the_same_rows(data: dict[str, pa.Table], duck: dpsql.Session,
                                                     spark: dpsql.Session) -> None:
    con = duckdb.connect()
    for k, t in data.items():
        con.register(k, t)
    truth = con.execute(CHAIN).fetchone()[0]
    # every tau of the grid is >= 1: the largest is Delta, where nothing is truncated but the caps
    d, s = bounded(duck, "chain_count_r2t_caps", "caps"), bounded(spark, "chain_count_r2t_caps", "caps")
    assert canonical(d) == canonical(s)
    capped = max(int(v) for v in d.to_pylist()[0].values())  # f is monotone in tau: the largest tau's
    assert 0 < capped < truth  # the per-hop caps drop rows ...
    # ... and the caps' choice matters: DuckDB's native hash keeps other rows (negative control)
    native = make("duckdb", data, keyed_hash="native")
    try:
        got = [bounded(native, "chain_count_r2t_caps", salt) for salt in ("caps", "caps 2", "caps 3")]
        assert any(canonical(g) != canonical(d) for g in got)
    finally:
        native.close()


@pytest.mark.parametrize("name", ["chain_count_sampled", "lookup_sampled", "path2_sampled"])
def test_another_salt_samples_other_tuples(duck: dpsql.Session, spark: dpsql.Session, name: str) -> None:
    # negative control: the equality above is not vacuous (the sample depends on the salt)
    assert canonical(bounded(duck, name, "salt one")) != canonical(bounded(spark, name, "salt two"))


def test_zero_noise_join_releases_are_the_same(data: dict[str, pa.Table]) -> None:
    got: dict[str, list[Any]] = {}
    for kind in ("duckdb", "spark"):
        s = make(kind, data)
        try:
            for name in ("chain_count_sampled", "chain_sum_two_parts", "lookup_sampled", "path2_sampled"):
                sql, opts = QUERIES[name]
                r = s.query(sql, epsilon=4.0, options=opts)
                got.setdefault(name, []).append((r.mechanism, r.table.to_pylist()))
        finally:
            s.close()
    for name, (d, s_) in got.items():
        assert d[0] == s_[0], name
        (dv,), (sv,) = (list(d[1][0].values()), list(s_[1][0].values()))
        assert dv == pytest.approx(sv, rel=1e-9, abs=1e-9), name
    assert any(v[0][1][0] != {k: 0 for k in v[0][1][0]} for v in got.values())  # not all zero


def test_explain_of_a_join_on_spark_is_free_and_has_no_global_row_number(spark: dpsql.Session) -> None:
    before = spark.remaining()
    p = spark.explain(CHAIN, epsilon=1.0, options={"q": 0.25})
    assert "SHA2(" in p.bounded_sql and "ROW_NUMBER() OVER (ORDER BY" not in p.bounded_sql
    assert spark.remaining() == before


GROUPED = ("SELECT c.c_nationkey, COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
           "GROUP BY c.c_nationkey")


def test_grouped_join_is_refused_on_spark_before_any_charge(data: dict[str, pa.Table]) -> None:
    # a GROUP BY over a join (dpsql.mechanisms.s4s_vector) runs on DuckDB only for now: on Spark it
    # is refused with the fix named, before the ledger is touched (explain too)
    duck = make("duckdb", data, nation_domain=True)
    try:  # the query itself is answerable (the refusal below is about the engine)
        assert duck.query(GROUPED, epsilon=4.0, delta=1e-5, options={"q": 0.5}).table.num_rows == 5
    finally:
        duck.close()
    s = make("spark", data, nation_domain=True)
    try:
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match="DuckDB engine") as info:
            s.query(GROUPED, epsilon=4.0, delta=1e-5, options={"q": 0.5})
        assert "DuckDB engine" in (info.value.hint or "")
        with pytest.raises(UnsupportedQueryError, match="DuckDB engine"):
            s.explain(GROUPED, epsilon=4.0, delta=1e-5, options={"q": 0.5})
        assert s.remaining() == before
        assert s.query(CHAIN, epsilon=1.0, options={"q": 0.25}).mechanism  # an ungrouped join still runs
        assert s.remaining() != before  # negative control: a query that runs is charged
    finally:
        s.close()
