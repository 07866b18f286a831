"""Join plans over key values one person crafted to collide in the engine's hash must not make the query slow.

DuckDB's hash of a BIGINT is public and invertible (``benchmarks/hash_collisions.py``: ``colliding_keys``), so
one customer can hold thousands of orders whose keys share the low bits of their hash. Join plans group,
DISTINCT, semi-join and join by those keys before the per-person caps bound that customer: the unique-key
filter groups the whole orders table by o_orderkey, a correlated EXISTS groups its outer key values, a
looked-up chain DISTINCTs, joins and groups by them. With 20 000 such keys a DP-S4S count over customer JOIN
orders JOIN lineitem took 1.86 s instead of 0.14 s for 20 000 random keys, R2T over lineitem (people looked up
through orders) 6.4 s instead of 0.13 s (``benchmarks/hash_collisions.py --joins``). Every such grouping and
equi-join now also goes by a keyed hash of the key under the query's salt (``dpsql.rewrite.joins.Spread``): the
same groups and matches, hashed unpredictably. Timings live in the benchmark; here the rendered plans are
checked (with a negative control: the same check on the plans without the keyed hash), and the releases
(unchanged, under the same seeded salts, on DuckDB's native and on the portable keyed hash).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import sqlglot
from sqlglot import exp

import dpsql
import dpsql.rewrite.joins as rj
from dpsql.budget import Budget
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.engine.portable import PortableDuckDBOps
from dpsql.engine.spark_ops import SparkOps
from dpsql.rewrite.render import render
from dpsql.testing import use_noise, zero_noise

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from hash_collisions import JOIN_SHAPES, colliding_keys  # noqa: E402

SALT = "<per-query secret salt>"
SHAPES = [*JOIN_SHAPES.values(),
          ("SELECT SUM(l.l_price) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey", {"mechanism": "r2t"}),
          ("SELECT SUM(l.l_price) FROM lineitem l", {}),
          ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
           "JOIN lineitem l ON o.o_orderkey = l.l_orderkey", {"q": 0.5})]
#: the key columns one customer chooses (order keys), as the join plans name them
KEYS = ("o_orderkey", "l_orderkey", "__k0", "__a0")


def _session(n: int = 60, keys: int = 300, *, seed: int = 0, engine: Any = None, text: bool = False) -> dpsql.Session:
    """``n`` customers with one order and one line item each, and one more customer holding ``keys`` orders whose
    keys collide in DuckDB's hash (as text keys with ``text``), each with one to three line items."""
    g = np.random.default_rng(seed)
    ok = np.concatenate([g.integers(-2**62, 2**62, n), np.array(colliding_keys(keys), np.int64)])
    oc = np.concatenate([np.arange(n), np.full(keys, n)])
    li = np.repeat(ok, g.integers(1, 4, ok.size))
    s = dpsql.Session(budget=Budget(1e9, 0.99), engine=engine)
    use_noise(s, zero_noise(seed))
    cust = np.arange(n + 1)
    okeys: Any = ok.astype(str).tolist() if text else ok
    lkeys: Any = li.astype(str).tolist() if text else li
    s.register("nation", pa.table({"n_nationkey": np.arange(5), "n_name": list("ABCDE")}), public=True)
    s.register("customer", pa.table({"c_custkey": cust, "c_nationkey": cust % 5}), privacy_unit="c_custkey",
               references={"c_nationkey": "nation.n_nationkey"})
    s.register("orders", pa.table({"o_orderkey": okeys, "o_custkey": oc}), references={"o_custkey": "customer.c_custkey"},
               degree_bounds={"o_custkey": 8}, allow_conditional_sampling=True)
    s.register("lineitem", pa.table({"l_orderkey": lkeys, "l_price": g.uniform(0, 10, li.size)}),
               references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 4},
               columns={"l_price": {"bounds": (0, 10)}}, allow_conditional_sampling=True)
    return s


def _names(e: exp.Expression) -> set[str]:
    return {c.name.split(".")[-1] for c in e.find_all(exp.Column)}


def _keyed(e: exp.Expression) -> bool:
    """Whether ``e`` reads the keyed hash: the salt itself, or the ``__spread`` column that holds it."""
    return SALT in e.sql(dialect="duckdb") or "__spread" in _names(e)


def unspread(sql: str) -> list[str]:
    """The hash tables of a rendered join plan over the customer's key values without the keyed hash: every
    GROUP BY and DISTINCT over a key column, every equi-join (ON) and correlated EXISTS comparing one, and
    every window partitioned by one except the Delta caps' (those read only the key values of the capped
    input before them, at most Delta per person: the semi-join in front keeps no other). The public key set of
    a GROUP BY over a join (``__dom``, public rows or declared values) and the joins with it are no one's."""
    out = []
    tree = sqlglot.parse_one(sql, dialect="duckdb")
    for cte in list(tree.find_all(exp.CTE)):
        if cte.alias == "__dom":
            cte.pop()
    for node in tree.walk():
        if isinstance(node, exp.Group):
            group = exp.Tuple(expressions=[e.copy() for e in node.expressions])
            if _names(group) & set(KEYS) and not _keyed(group):
                out.append("GROUP BY " + group.sql())
        elif isinstance(node, exp.Select) and node.args.get("distinct"):
            if {s.alias_or_name for s in node.selects} & set(KEYS) and "__spread" not in {s.alias_or_name for s in node.selects}:
                out.append("DISTINCT " + ", ".join(s.alias_or_name for s in node.selects))
        elif isinstance(node, exp.Join) and node.args.get("on") is not None:
            on = node.args["on"]
            if _names(on) & set(KEYS) and not _keyed(on) and "__dom" not in on.sql():
                out.append("JOIN ON " + on.sql())
        elif isinstance(node, exp.Exists):
            where = node.this.args.get("where")
            if where is not None and _names(where) & set(KEYS) and not _keyed(where):
                out.append("EXISTS " + where.sql())
        elif isinstance(node, exp.Window) and node.args.get("partition_by") and not node.args.get("order"):
            part = exp.Tuple(expressions=[e.copy() for e in node.args["partition_by"]])
            if _names(part) & set(KEYS) and not _keyed(part):
                out.append("PARTITION BY " + part.sql())
    return out


def _bounded(s: dpsql.Session, sql: str, opts: dict[str, Any]) -> str:
    # pure DP where the plan allows it (a scalar's (epsilon, delta) calibration costs seconds, the SQL is the same)
    return s.explain(sql, epsilon=1.0, delta=1e-6 if "GROUP BY" in sql else 0.0, options=opts).bounded_sql


def _off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plans as they were before the keyed hash (every spread turned off)."""
    monkeypatch.setattr(rj, "spread_of", lambda *a, **k: None)


def test_the_crafted_order_keys_collide_in_duckdbs_hash() -> None:
    keys = colliding_keys(300)
    row = duckdb.connect().execute(
        "SELECT COUNT(DISTINCT k), COUNT(DISTINCT hash(k) & 16777215) FROM (SELECT UNNEST(?::BIGINT[]) AS k)", [keys]).fetchall()[0]
    assert row == (300, 1)


@pytest.mark.parametrize("sql,opts", SHAPES)
def test_every_hash_table_over_chosen_keys_goes_by_the_keyed_hash(sql: str, opts: dict[str, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    s = _session(20, 30)
    try:
        bounded = _bounded(s, sql, opts)
        assert unspread(bounded) == [], unspread(bounded)
        assert "HASH(XOR(HASH(" in bounded
        _off(monkeypatch)  # the control: without it the same check finds the key's hash tables
        assert unspread(_bounded(s, sql, opts))
    finally:
        s.close()


def _canonical(v: Any) -> Any:
    return sorted(map(repr, v)) if isinstance(v, list) else v


def _outputs(sql: str, opts: dict[str, Any], **kw: Any) -> list[str]:
    """The bounded query's rows under a fixed salt (sorted; lists of people sorted): what the release adds
    noise to."""
    s = _session(**kw)
    try:
        bounded = _bounded(s, sql, opts).replace(SALT, "a fixed salt")
        rows = s._engine.connection.sql(bounded).to_arrow_table().to_pylist()
    finally:
        s.close()
    assert any(v not in (0, "0", None, []) for r in rows for v in r.values())  # something was counted
    return sorted(repr({k: _canonical(v) for k, v in r.items()}) for r in rows)


VARIANTS = [pytest.param(sql, opts, {}, id=f"native-{i}") for i, (sql, opts) in enumerate(SHAPES)]
VARIANTS += [pytest.param(*JOIN_SHAPES[shape], kw, id=f"{name}-{shape}")
             for shape in ("dp_s4s_chain_count", "r2t_orders_lineitem_count", "r2t_lineitem_lookup", "group_by_over_join")
             for name, kw in (("portable", {"engine": {"keyed_hash": "portable"}}), ("text_keys", {"text": True}))]


@pytest.mark.parametrize("sql,opts,kw", VARIANTS)
def test_results_are_unchanged(sql: str, opts: dict[str, Any], kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bounded rows (truncated sums, sampled tuples and their people, clipped group totals) under one
    salt with and without the keyed hash, colliding keys included: the same matches, caps and sample."""
    rows = _outputs(sql, opts, **kw)
    _off(monkeypatch)
    assert _outputs(sql, opts, **kw) == rows


@pytest.mark.parametrize("a,b,lo", [("INTEGER", "BIGINT", -5), ("SMALLINT", "HUGEINT", -5), ("UINTEGER", "BIGINT", 0),
                                    ("UBIGINT", "TINYINT", 0)])
def test_integer_keys_of_two_types_hash_alike(a: str, b: str, lo: int) -> None:
    """Equal integers of two types match in the keyed hash too: the two sides are cast to one type first. The
    control: DuckDB hashes a negative INTEGER and the same BIGINT apart, so the raw columns' keyed hashes differ."""
    spread = rj.Spread("salt", DuckDBOps())
    eq = rj.spread_eq([(exp.column("x"), a)], [(exp.column("y"), b)], spread)
    hx, hy = rj.spread_of([(exp.column("x"), a)], spread), rj.spread_of([(exp.column("y"), b)], spread)
    assert eq is not None and hx is not None and hy is not None
    cond, raw = render(eq, dialect="duckdb"), render(exp.EQ(this=hx, expression=hy), dialect="duckdb")
    row = duckdb.connect().execute(f"SELECT bool_and({cond}), bool_and({raw}) FROM (SELECT CAST(v AS {a}) AS x, "
                                   f"CAST(v AS {b}) AS y FROM range({lo}, 100) t(v))").fetchall()[0]
    assert row[0] is True
    if lo < 0:
        assert row[1] is False


def test_floating_point_keys_hash_one_zero_and_one_nan() -> None:
    """-0.0 = 0.0 and NaN = NaN in a join: their keyed hashes are equal on the portable (text) hash as well."""
    for ops in (DuckDBOps(), PortableDuckDBOps()):
        h = rj.spread_of([(exp.column("x"), "DOUBLE")], rj.Spread("salt", ops))
        assert h is not None
        sql = render(exp.select(exp.alias_(h, "h")).from_("t"), dialect="duckdb")
        con = duckdb.connect()
        con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (CAST('-0.0' AS DOUBLE)), (0.0), (CAST('nan' AS DOUBLE)), "
                    "(-CAST('nan' AS DOUBLE))) v(x)")
        hs = [r[0] for r in con.execute(sql).fetchall()]
        assert hs[0] == hs[1] and hs[2] == hs[3] and hs[0] != hs[2]


def test_types_outside_the_list_are_not_spread() -> None:
    """A key type whose equality the text or the engine hash may not follow (an INTERVAL: '1 month' =
    '30 days') keeps its plain join; two different types outside the integer and text families too."""
    spread = rj.Spread("salt", SparkOps())
    assert rj.spread_of([(exp.column("x"), "INTERVAL")], spread) is None
    assert rj.spread_eq([(exp.column("x"), "DATE")], [(exp.column("y"), "TIMESTAMP")], spread) is None
    assert rj.spread_of([(exp.column("x"), "BIGINT")], spread) is not None


def test_each_engine_spreads_with_its_own_cheap_keyed_hash() -> None:
    """The spread decides nothing, so each engine uses its own 64-bit keyed hash, no text per row: DuckDB's
    ``HASH(XOR(HASH(x), HASH(salt)))`` with the portable keyed hash too (its SHA-256 of every key's text made a
    TPC-H join 4.5x slower), Spark's the same with ``xxhash64``; salted either way."""
    x = [(exp.column("x"), "BIGINT")]
    for ops in (DuckDBOps(), PortableDuckDBOps()):
        assert render(rj.spread_of(x, rj.Spread("s3cret", ops)), dialect="duckdb") == "HASH(XOR(HASH(x), HASH('s3cret')))"  # type: ignore[arg-type]
    spark = render(rj.spread_of(x, rj.Spread("s3cret", SparkOps())), dialect="spark")  # type: ignore[arg-type]
    assert spark == "XXHASH64(XXHASH64(x) ^ XXHASH64('s3cret'))"
