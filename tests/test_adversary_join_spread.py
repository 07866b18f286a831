"""The keyed hash of join keys (``dpsql.rewrite.joins.Spread``) changes no match, group, cap or sample.

Each case runs the same join query with the keyed hash and without it (every spread turned off, as the plans
were before it) and compares the bounded rows under one fixed salt (the truncated sums, or the sampled tuples with
their people: what the release adds noise to) and the zero-noise release. Keys equal in SQL but spelled apart:
text under a connection's ``default_collation`` or a column's ``COLLATE NOCASE`` ('A' and 'a' are two people),
integers of two types (down to -2^63), floating-point -0.0/0.0 and NaNs, composite text keys through a looked-up
chain, NULL keys, UBIGINT person keys; and key columns named like the plan's own columns.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
import dpsql.rewrite.joins as rj
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

SALT = "<per-query secret salt>"


def _compare(make: Callable[[], dpsql.Session], sql: str, opts: dict[str, Any] | None,
             monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[dict[str, Any]]]:
    """(bounded rows, zero-noise release) with the keyed hash, asserted equal to those without it."""
    out, hashes = [], []
    for spread in (True, False):
        if not spread:
            monkeypatch.setattr(rj, "spread_of", lambda *a, **k: None)
        s = make()
        try:
            delta = 1e-6 if "GROUP BY" in sql else 0.0
            bounded = s.explain(sql, epsilon=1.0, delta=delta, options=opts).bounded_sql
            hashes.append("".join(bounded.split()).count("XOR(HASH("))
            rows = sorted(map(repr, s._engine.connection.sql(bounded.replace(SALT, "a fixed salt")).fetchall()))
            out.append((rows, s.query(sql, epsilon=1.0, delta=delta, options=opts).table.to_pylist()))
        finally:
            s.close()
    assert hashes[0] > hashes[1]  # the keyed hash of the keys is there, and the control has none of it
    assert out[0] == out[1]
    return out[0]


# -- a key column named like the keyed hash's column ------------------------------------------------------------

def _orders_session(key: str) -> Callable[[], dpsql.Session]:
    def make() -> dpsql.Session:
        g = np.random.default_rng(0)
        s = dpsql.Session(budget=Budget(1e6, 0.9))
        use_noise(s, zero_noise(1))
        ok = np.arange(100) * 7 + 3
        li = np.repeat(ok, g.integers(1, 4, 100))
        s.register("customer", pa.table({"c_custkey": np.arange(60)}), privacy_unit="c_custkey")
        s.register("orders", pa.table({key: ok, "o_custkey": g.integers(0, 60, 100)}),
                   references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8},
                   allow_conditional_sampling=True)
        s.register("lineitem", pa.table({"l_orderkey": li}), references={"l_orderkey": f"orders.{key}"},
                   degree_bounds={"l_orderkey": 4}, allow_conditional_sampling=True)
        return s
    return make


@pytest.mark.parametrize("key", ["__spread", "__key0", "o_orderkey"])
@pytest.mark.parametrize("opts", [{}, {"mechanism": "r2t"}, {"q": 0.5}])
def test_a_key_column_named_like_the_plans_columns_keeps_its_matches(key: str, opts: dict[str, Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The unique-key filter named the base table's key values by the key's own column names next to its keyed
    hash ``__spread``: an order key column called ``__spread`` was compared with the hash, no order passed, and
    every join through it counted 0 (92 join tuples, zero noise) with no error."""
    sql = f"SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON o.{key} = l.l_orderkey"
    rows, released = _compare(_orders_session(key), sql, opts, monkeypatch)
    assert released[0]["COUNT(*)"] > 50  # the join counted its tuples (218 line items, each with one order)


# -- a looked-up chain in a fresh interpreter -------------------------------------------------------------------

def test_a_looked_up_chain_releases_in_a_fresh_interpreter() -> None:
    """DP-S4S over looked-up people flattens the lists of people with ``pyarrow.compute``, which only worked when
    some other module had imported it first: in a fresh interpreter the release failed after the charge."""
    code = textwrap.dedent("""
        import duckdb, dpsql
        from dpsql.testing import use_noise, zero_noise
        con = duckdb.connect()
        con.execute("CREATE TABLE customer AS SELECT range AS c_custkey FROM range(40)")
        con.execute("CREATE TABLE orders AS SELECT range AS o_orderkey, range % 40 AS o_custkey FROM range(80)")
        con.execute("CREATE TABLE lineitem AS SELECT range % 80 AS l_orderkey FROM range(160)")
        s = dpsql.Session(budget=dpsql.Budget(10.0, 0.5), connection=con)
        use_noise(s, zero_noise(1))
        s.register("customer", "customer", privacy_unit="c_custkey", allow_conditional_sampling=True)
        s.register("orders", "orders", references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8},
                   allow_conditional_sampling=True)
        s.register("lineitem", "lineitem", references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 4},
                   allow_conditional_sampling=True)
        print(s.query("SELECT COUNT(*) FROM lineitem", epsilon=1.0, options={"mechanism": "dp_s4s"}).mechanism)
    """)
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "dp_s4s"


def _insert(con: duckdb.DuckDBPyConnection, table: str, columns: list[list[Any]]) -> None:
    """Append rows given column by column to ``table`` (cast to its declared types, collations included) in
    one statement: the same rows as an INSERT per row, without a round trip each."""
    con.register("__rows", pa.table({f"c{i}": c for i, c in enumerate(columns)}))
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM __rows")
    finally:
        con.unregister("__rows")


# -- text keys under a collation --------------------------------------------------------------------------------

CHAIN = ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
         "JOIN lineitem l ON o.o_orderkey = l.l_orderkey")
TEXT_SHAPES = [(CHAIN, {}), (CHAIN, {"q": 0.5}),
               ("SELECT COUNT(*) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey", {"mechanism": "r2t"}),
               ("SELECT COUNT(*) FROM lineitem l", {}),
               ("SELECT o.o_tag, COUNT(*) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey GROUP BY o.o_tag", {})]


def _text_session(setup: str | None, collate: str) -> Callable[[], dpsql.Session]:
    """Customers 'A'/'a', 'c0'/'C0', ...; orders 'X'/'x', 'k0'/'K0', ...; line items on both spellings."""
    def make() -> dpsql.Session:
        con = duckdb.connect()
        if setup:
            con.execute(f"SET default_collation = '{setup}'")
        t = "VARCHAR" + collate
        con.execute(f"CREATE TABLE customer (c_custkey {t})")
        con.execute(f"CREATE TABLE orders (o_orderkey {t}, o_custkey {t}, o_tag VARCHAR)")
        con.execute(f"CREATE TABLE lineitem (l_orderkey {t})")
        cust = ["A", "a", "B", "b"] + [f"c{i}" for i in range(40)] + [f"C{i}" for i in range(40)]
        orders = ([("X", "A", "t"), ("x", "a", "T"), ("Y", "B", "t"), ("y", "b", "u")]
                  + [(f"k{i}", f"c{i % 40}", "t") for i in range(60)] + [(f"K{i}", f"C{i % 40}", "T") for i in range(60)])
        items = ["X", "x", "x", "Y", "y"] + [f"K{i}" for i in range(60)] + [f"k{i}" for i in range(60)] + [f"k{i}" for i in range(30)]
        _insert(con, "customer", [cust])
        _insert(con, "orders", [list(c) for c in zip(*orders)])
        _insert(con, "lineitem", [items])
        s = dpsql.Session(budget=Budget(1e9, 0.99), connection=con)
        use_noise(s, zero_noise(0))
        s.register("customer", "customer", privacy_unit="c_custkey")
        s.register("orders", "orders", references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8},
                   allow_conditional_sampling=True, columns={"o_tag": {"domain": ["t", "T", "u"]}})
        s.register("lineitem", "lineitem", references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 4},
                   allow_conditional_sampling=True)
        return s
    return make


@pytest.mark.parametrize("setup,collate", [(None, ""), ("nocase", ""), ("noaccent.nocase", ""), (None, " COLLATE NOCASE")])
@pytest.mark.parametrize("sql,opts", TEXT_SHAPES)
def test_text_keys_under_a_collation_match_alike(setup: str | None, collate: str, sql: str, opts: dict[str, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Joins compare text under the binary collation, and DuckDB's HASH of a binary-collated text hashes its
    bytes: 'X' and 'x' are two orders of two customers with and without the keyed hash, whatever the collation."""
    rows, _ = _compare(_text_session(setup, collate), sql, opts, monkeypatch)
    if sql == "SELECT COUNT(*) FROM lineitem l":
        # a text id is spelled by its salted digest (dpsql.rewrite.joins.key_digests), here under the fixed salt
        a, upper_a = (duckdb.sql(f"SELECT HEX(MD5_NUMBER('a fixed salt' || '{c}'))").fetchall()[0][0]
                      for c in ("a", "A"))
        assert f"(1, ['customer:{a}'])" in rows and f"(1, ['customer:{upper_a}'])" in rows  # two people, not merged
        assert len({r.split("customer:")[1] for r in rows}) == 84  # every customer one person: none merged


# -- numeric keys spelled apart ---------------------------------------------------------------------------------

N = list(range(-20, 40))
NUMERIC = {
    "int-bigint": (pa.int32(), pa.int64(), N, N),
    "smallint-bigint": (pa.int16(), pa.int64(), N, N),
    "bigint-extremes": (pa.int64(), pa.int64(), [2**62 + i for i in N] + [-2**63, 2**63 - 1],
                        [2**62 + i for i in N] + [-2**63, 2**63 - 1]),
    "double-zeros-nans": (pa.float64(), pa.float64(), [0.0, float("nan")] + [i + 0.5 for i in range(58)],
                          [-0.0, float("nan"), -0.0] + [i + 0.5 for i in range(58)]),
    "float-zeros-nans": (pa.float32(), pa.float32(), [0.0, float("nan")] + [i + 0.5 for i in range(58)],
                         [-0.0, float("nan"), -0.0] + [i + 0.5 for i in range(58)]),
    "int-nulls": (pa.int32(), pa.int64(), [*N, None, None], [*N, None]),
    # a UBIGINT person key: its people's ids were cast by sqlglot's default dialect, which does not know the type
    # (ParseError from explain)
    "ubigint-top": (pa.uint64(), pa.uint64(), [2**64 - 1 - i for i in range(60)], [2**64 - 1 - i for i in range(60)]),
    "smallint-ubigint": (pa.int16(), pa.uint64(), list(range(60)), list(range(60))),
}


@pytest.mark.parametrize("case", sorted(NUMERIC))
@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM a JOIN b ON a.k = b.k", "SELECT SUM(b.v) FROM a JOIN b ON a.k = b.k",
                                 "SELECT COUNT(*) FROM a JOIN a a2 ON a.k = a2.k"])
def test_numeric_keys_spelled_apart_match_alike(case: str, sql: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ta, tb, va, vb = NUMERIC[case]

    def make() -> dpsql.Session:
        s = dpsql.Session(budget=Budget(1e6, 0.9))
        use_noise(s, zero_noise(1))
        s.register("a", pa.table({"k": pa.array(va, ta), "v": [1.0] * len(va)}), privacy_unit="k", max_rows_per_unit=3,
                   columns={"v": {"bounds": (0, 10)}})
        s.register("b", pa.table({"k": pa.array(vb, tb), "v": [2.0] * len(vb)}), privacy_unit="k", max_rows_per_unit=3,
                   columns={"v": {"bounds": (0, 10)}})
        return s
    rows, _ = _compare(make, sql, None, monkeypatch)
    if "a2" not in sql:  # every equal pair joined: -0.0 with both zeros, NaN with NaN, NULL with nothing
        assert len(rows) == {"double-zeros-nans": 61, "float-zeros-nans": 61, "bigint-extremes": 62}.get(case, 60)


# -- composite text keys through a looked-up chain --------------------------------------------------------------

def _partsupp_session(setup: str | None) -> Callable[[], dpsql.Session]:
    """supplier 'S0'/'s0', ... <- partsupp (part, supplier) <- lineitem (part, supplier), parts 'a'/'A'/'b'/'B'."""
    def make() -> dpsql.Session:
        con = duckdb.connect()
        if setup:
            con.execute(f"SET default_collation = '{setup}'")
        g = np.random.default_rng(3)
        sup = [f"S{i}" for i in range(10)] + [f"s{i}" for i in range(10)]
        ps = [(p, x) for p in ["a", "A", "b", "B"] for x in sup if g.random() < 0.5]
        con.execute("CREATE TABLE supplier (s_suppkey VARCHAR)")
        con.execute("CREATE TABLE partsupp (ps_partkey VARCHAR, ps_suppkey VARCHAR)")
        con.execute("CREATE TABLE lineitem (l_partkey VARCHAR, l_suppkey VARCHAR, l_qty INTEGER)")
        items = [[*ps[int(g.integers(len(ps)))], int(g.integers(1, 50))] for _ in range(200)]
        _insert(con, "supplier", [sup])
        _insert(con, "partsupp", [list(c) for c in zip(*ps)])
        _insert(con, "lineitem", [list(c) for c in zip(*items)])
        s = dpsql.Session(budget=Budget(1e9, 0.99), connection=con)
        use_noise(s, zero_noise(0))
        s.register("supplier", "supplier", privacy_unit="s_suppkey")
        s.register("partsupp", "partsupp", references={"ps_suppkey": "supplier.s_suppkey"}, degree_bounds={"ps_suppkey": 60})
        s.register("lineitem", "lineitem", references={"l_partkey, l_suppkey": "partsupp.(ps_partkey, ps_suppkey)"},
                   degree_bounds={"l_partkey,l_suppkey": 30}, columns={"l_qty": {"bounds": (0, 50)}},
                   allow_conditional_sampling=True)
        return s
    return make


@pytest.mark.parametrize("setup", [None, "nocase"])
@pytest.mark.parametrize("sql,opts", [
    ("SELECT COUNT(*) FROM partsupp ps JOIN lineitem l ON l.l_partkey = ps.ps_partkey AND l.l_suppkey = ps.ps_suppkey",
     {"mechanism": "r2t"}),
    ("SELECT COUNT(*) FROM supplier s JOIN partsupp ps ON s.s_suppkey = ps.ps_suppkey "
     "JOIN lineitem l ON l.l_partkey = ps.ps_partkey AND l.l_suppkey = ps.ps_suppkey", {"q": 0.5}),
    ("SELECT SUM(l_qty) FROM lineitem", {})])
def test_composite_text_keys_match_alike(setup: str | None, sql: str, opts: dict[str, Any],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _compare(_partsupp_session(setup), sql, opts, monkeypatch)
