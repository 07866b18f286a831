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

from fractions import Fraction
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from _spark import require_spark

import dpsql
from dpsql.mechanisms.s4s_vector import clipped_totals
from dpsql.rewrite.joins import parts_of
from dpsql.testing import use_noise, zero_noise

require_spark()

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
        "lineitem": pa.table({"l_orderkey": l_ord, "l_price": np.round(g.uniform(-20, 100, l_ord.size), 2),
                              # 1993 ... 1997, of which only 1994 ... 1996 are declared (the rest is not counted)
                              "l_shipdate": pa.array(np.datetime64("1993-01-01") + g.integers(0, 5 * 365, l_ord.size)
                                                     .astype("timedelta64[D]"), pa.date32())}),
        "node": pa.table({"id": np.arange(50)}),
        "edge": pa.table({"src": src[keep], "dst": dst[keep],  # duplicate edges included
                          "label": np.array(["x", "y", "z"])[g.integers(0, 3, int(keep.sum()))]}),
    }


def make(kind: str, data: dict[str, pa.Table], keyed_hash: str = "portable", master: str | None = None,
         nation_domain: bool = True) -> dpsql.Session:
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
               degree_bounds={"l_orderkey": ITEMS}, allow_conditional_sampling=True,
               columns={"l_price": {"bounds": (-20, 100)},
                        "l_shipdate": {"bounds": ("1994-01-01", "1996-12-31"), "bin_width": "1 day"}})
    s.register("node", data["node"], privacy_unit="id", allow_conditional_sampling=True)
    s.register("edge", data["edge"], references={"src": "node.id", "dst": "node.id"},
               degree_bounds={"src": 16, "dst": 16}, allow_conditional_sampling=True,
               columns={"label": {"domain": ["x", "y", "z"]}})
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


#: the bounded results of the module's two sessions, by (kind, query, salt): their tables never change and a
#: salted bounding is a function of the rows and the salt, so a query run once per salt serves every test that
#: compares it (as ``tests/test_spark.py``'s ``_SHARED``)
_SHARED: dict[int, dict[tuple[str, str, str], Any]] = {}


@pytest.fixture(scope="module")
def duck(data: dict[str, pa.Table]) -> Any:
    s = make("duckdb", data)
    _SHARED[id(s)] = {}
    yield s
    del _SHARED[id(s)]
    s.close()


@pytest.fixture(scope="module")
def spark(data: dict[str, pa.Table]) -> Any:
    s = make("spark", data)
    _SHARED[id(s)] = {}
    yield s
    del _SHARED[id(s)]
    s.close()


def bounded(s: dpsql.Session, name: str, salt: str) -> pa.Table:
    memo = _SHARED.get(id(s))
    if memo is not None and ("join", name, salt) in memo:
        return memo[("join", name, salt)]
    sql, opts = QUERIES[name]
    r = s._route(sql, 1.0, 1e-5, opts)
    t = s._engine.fetch_arrow(r.mechanism.bounded(r.calibration, salt, s._engine.ops))
    if memo is not None:
        memo[("join", name, salt)] = t
    return t


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
    # both salts for the sampled queries (test_another_salt_samples_other_tuples compares their samples); the
    # others alternate the two over the sorted names (a second salt per query doubled the Spark jobs here)
    both = name.endswith("_sampled")
    for salt in ("salt one", "another salt") if both else (("salt one", "another salt")[sorted(QUERIES).index(name) % 2],):
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
    d, s = bounded(duck, "chain_count_r2t_caps", "salt one"), bounded(spark, "chain_count_r2t_caps", "salt one")
    assert canonical(d) == canonical(s)
    capped = max(int(v) for v in d.to_pylist()[0].values())  # f is monotone in tau: the largest tau's
    assert 0 < capped < truth  # the per-hop caps drop rows ...
    # ... and the caps' choice matters: DuckDB's native hash keeps other rows (negative control)
    native = make("duckdb", data, keyed_hash="native")
    try:
        got = [bounded(native, "chain_count_r2t_caps", salt) for salt in ("salt one", "caps 2", "caps 3")]
        assert any(canonical(g) != canonical(d) for g in got)
    finally:
        native.close()


@pytest.mark.parametrize("name", ["chain_count_sampled", "lookup_sampled", "path2_sampled"])
def test_another_salt_samples_other_tuples(duck: dpsql.Session, spark: dpsql.Session, name: str) -> None:
    # negative control: the equality above is not vacuous (the sample depends on the salt; both samples were
    # drawn by the comparison above)
    assert canonical(bounded(duck, name, "salt one")) != canonical(bounded(spark, name, "another salt"))


def test_zero_noise_join_releases_are_the_same(duck: dpsql.Session, spark: dpsql.Session) -> None:
    got: dict[str, list[Any]] = {}
    for s in (duck, spark):
        use_noise(s, zero_noise(23))  # the same salts, in the same order, on both engines
        # (chain_count_sampled: bit for bit in test_join_releases_are_the_same_on_duckdb_and_spark)
        for name in ("chain_sum_two_parts", "lookup_sampled", "path2_sampled"):
            sql, opts = QUERIES[name]
            r = s.query(sql, epsilon=4.0, options=opts)
            got.setdefault(name, []).append((r.mechanism, r.table.to_pylist()))
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


# -- GROUP BY over joins (dpsql.mechanisms.s4s_vector) ---------------------------------------------

NCO = ("FROM nation n JOIN customer c ON c.c_nationkey = n.n_nationkey JOIN orders o ON c.c_custkey = o.o_custkey")
COL = ("FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON o.o_orderkey = l.l_orderkey")

#: name -> (sql, options, path): every path of a grouped join and every kind of key
GROUPED: dict[str, tuple[str, dict[str, Any] | None, str]] = {
    # per-user L2 clipping in the engine (one person per tuple); clip_norm binds, and so do the per-hop caps
    "clip_public_count": (f"SELECT n.n_name, COUNT(*) AS k {NCO} GROUP BY n.n_name", {"clip_norm": 3.0}, "clip"),
    "clip_public_sum_where": (f"SELECT n.n_name, SUM(l.l_price) AS s {NCO} JOIN lineitem l ON o.o_orderkey = l.l_orderkey "
                              "WHERE n.n_name <> 'E' GROUP BY n.n_name", {"clip_norm": 150.0}, "clip"),
    "clip_year_count": (f"SELECT year(l.l_shipdate) AS y, COUNT(*) AS k {COL} GROUP BY y", None, "clip"),
    # Algorithm 5's sample (q < 1): declared domain, two keys (public x year), several people per tuple, lookups
    "sampled_declared_count": ("SELECT c.c_nationkey, COUNT(*) AS k FROM customer c JOIN orders o "
                               "ON c.c_custkey = o.o_custkey GROUP BY c.c_nationkey", {"q": 0.5}, "s4s"),
    "sampled_two_keys_sum": (f"SELECT n.n_name, year(l.l_shipdate) AS y, SUM(l.l_price) AS s {NCO} "
                             "JOIN lineitem l ON o.o_orderkey = l.l_orderkey GROUP BY n.n_name, y", {"q": 0.5}, "s4s"),
    "sampled_path2_label": ("SELECT e1.label, COUNT(*) AS k FROM edge e1 JOIN edge e2 ON e1.dst = e2.src "
                            "GROUP BY e1.label", {"q": 0.5}, "s4s"),
    "sampled_lookup_year": ("SELECT year(l_shipdate) AS y, COUNT(*) AS k FROM lineitem GROUP BY y", {"q": 0.5}, "s4s"),
    # keys computed by expressions (dpsql.plan.join_groups, "derived"): a CASE of literals over a private column
    # (its results the key set), date_trunc over a declared date range (its months), an expression of a public
    # table's column (its values over that table), an expression of a declared domain (its image)
    "clip_case_literals_count": ("SELECT CASE WHEN l.l_price > 50 THEN 'hi' WHEN l.l_price > 0 THEN 'mid' END AS b, "
                                 f"COUNT(*) AS k {COL} GROUP BY b", None, "clip"),
    "clip_month_count": (f"SELECT date_trunc('month', l.l_shipdate) AS m, COUNT(*) AS k {COL} GROUP BY m", None, "clip"),
    "sampled_public_expression": (f"SELECT CASE WHEN n.n_name IN ('A', 'B') THEN 'ab' ELSE lower(n.n_name) END AS g, "
                                  f"COUNT(*) AS k {NCO} GROUP BY g", {"q": 0.5}, "s4s"),
    "sampled_declared_expression": ("SELECT c.c_nationkey % 3 AS r, COUNT(*) AS k FROM customer c JOIN orders o "
                                    "ON c.c_custkey = o.o_custkey GROUP BY r", {"q": 0.5}, "s4s"),
    # the unsampled variant (q = 1, grouped r2t): every tuple, a SUM's two parts
    "r2t_year_sum": ("SELECT year(l.l_shipdate) AS y, SUM(l.l_price) AS s FROM orders o JOIN lineitem l "
                     "ON o.o_orderkey = l.l_orderkey GROUP BY y", {"mechanism": "r2t"}, "s4s"),
}


def grouped_bounded(s: dpsql.Session, name: str, salt: str) -> tuple[str, pa.Table]:
    memo = _SHARED.get(id(s))
    if memo is not None and ("grouped", name, salt) in memo:
        return memo[("grouped", name, salt)]  # type: ignore[no-any-return]
    sql, opts, _ = GROUPED[name]
    r = s._route(sql, 4.0, 1e-5, opts)
    out = r.calibration.path, s._engine.fetch_arrow(r.mechanism.bounded(r.calibration, salt, s._engine.ops))
    if memo is not None:
        memo[("grouped", name, salt)] = out
    return out


def exact_clipped(s: dpsql.Session, name: str, salt: str) -> dict[Any, float]:
    """Per key the clipped total (exact, as a double) of a clipping query's bounded rows."""
    sql, opts, _ = GROUPED[name]
    r = s._route(sql, 4.0, 1e-5, opts)
    rows = s._engine.fetch_arrow(r.mechanism.bounded(r.calibration, salt, s._engine.ops)).sort_by("__gid")
    totals = clipped_totals(rows, r.calibration.clip, parts_of(r.calibration.jp))
    return {k: float(Fraction(n) * Fraction(2) ** -e) for k, (n, e) in zip(rows.column("__k0").to_pylist(), totals)}


def grouped_canonical(t: pa.Table) -> tuple[list[Any], list[Any]]:
    """(the key set's rows, exact; per group the clipped sum, or the sorted multiset of sampled tuples:
    group, weights and, per slot, the person or the set of people)."""
    rows = t.to_pylist()
    if "__tuple" not in t.column_names:  # clipped: the exact integers (persons', unowned tuples') as text
        return sorted(({k: v for k, v in r.items() if k not in ("__c", "__z")} for r in rows), key=lambda r: r["__gid"]), \
            [(r["__c"], r["__z"]) for r in sorted(rows, key=lambda r: r["__gid"])]
    dom = sorted(({k: v for k, v in r.items() if k.startswith("__k") or k == "__gid"} for r in rows
                  if r["__tuple"] is None), key=lambda r: r["__gid"])
    tuples = []
    for r in rows:
        if r["__tuple"] is None:
            continue
        assert all(r[k] is None for k in r if k.startswith("__k"))  # keys travel in the key set only
        w = tuple(v for k, v in sorted(r.items()) if k.startswith("__w"))
        users = tuple(tuple(sorted(v)) if isinstance(v, list) else v for k, v in sorted(r.items()) if k.startswith("__u"))
        tuples.append((r["__gid"], w, users))
    return dom, sorted(tuples, key=repr)


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_grouped_join_bounded_results_are_the_same_on_duckdb_and_spark(duck: dpsql.Session, spark: dpsql.Session,
                                                                        name: str) -> None:
    (dpath, dt), (spath, st) = grouped_bounded(duck, name, "group salt"), grouped_bounded(spark, name, "group salt")
    assert dpath == spath == GROUPED[name][2]
    (ddom, dvals), (sdom, svals) = grouped_canonical(dt), grouped_canonical(st)
    assert ddom == sdom and len(ddom) >= 3, name  # the same public key set, the same indices
    if dpath == "clip":  # exact integer sums of the persons' clipped grid values: the same on both engines
        assert len(dvals) == len(svals) and any(c != "0" for c, _ in dvals)
        assert dvals == svals, name
    else:  # the same sampled tuples (group, weights, people)
        assert dvals and dvals == svals, name


def test_grouped_join_caps_and_clipping_bind_and_the_controls_differ(data: dict[str, pa.Table], duck: dpsql.Session,
                                                                     spark: dpsql.Session) -> None:
    con = duckdb.connect()
    for k, t in data.items():
        con.register(k, t)
    truth = dict(con.execute(f"SELECT n.n_name, COUNT(*) {NCO} GROUP BY 1").fetchall())
    clipped = exact_clipped(duck, "clip_public_count", "group salt")
    assert all(clipped[k] < truth[k] for k in truth)  # the clip norm binds in every group
    by_year = dict(con.execute(f"SELECT year(l.l_shipdate), COUNT(*) {COL} GROUP BY 1").fetchall())
    _, dt = grouped_bounded(duck, "clip_year_count", "group salt")
    capped = exact_clipped(duck, "clip_year_count", "group salt")
    assert sorted(capped) == [1994, 1995, 1996] and all(0 < capped[y] < by_year[y] for y in capped)  # the caps bind
    # negative controls: DuckDB's native hash caps other rows; another salt samples other tuples
    native = make("duckdb", data, keyed_hash="native")
    try:
        got = [grouped_canonical(grouped_bounded(native, "clip_year_count", s)[1])[1] for s in ("g1", "g2", "g3")]
        ref = grouped_canonical(dt)[1]
        assert any(g != ref for g in got)
    finally:
        native.close()
    for name in ("sampled_declared_count", "sampled_path2_label"):  # Spark's sample was drawn by the comparison above
        assert grouped_canonical(grouped_bounded(duck, name, "other salt")[1]) != \
            grouped_canonical(grouped_bounded(spark, name, "group salt")[1])


def test_zero_noise_grouped_join_releases_are_the_same(duck: dpsql.Session, spark: dpsql.Session) -> None:
    for s in (duck, spark):
        use_noise(s, zero_noise(41))  # the same salts, in the same order, on both engines
    nonzero = 0
    # one query per path (the bounded results of all of them are compared above): clipping with an exact
    # sum over public keys, Algorithm 5's sample (one person; several people); the unsampled two-part SUM
    # (r2t_year_sum) is compared the same way in test_join_releases_are_the_same_on_duckdb_and_spark
    names = ("clip_public_sum_where", "sampled_declared_count", "sampled_path2_label")
    for name in names:
        sql, opts, _ = GROUPED[name]
        d, s_ = (x.query(sql, epsilon=4.0, delta=1e-5, options=opts) for x in (duck, spark))
        assert d.mechanism == s_.mechanism, name
        assert [(f.name, f.type) for f in d.table.schema] == [(f.name, f.type) for f in s_.table.schema], name
        drows, srows = d.table.to_pylist(), s_.table.to_pylist()
        value = d.table.column_names[-1]
        assert [{k: v for k, v in r.items() if k != value} for r in drows] == \
            [{k: v for k, v in r.items() if k != value} for r in srows], name  # the released keys, in order
        dv, sv = [r[value] for r in drows], [r[value] for r in srows]
        assert dv == sv, name  # bit for bit: exact sums, the same noise, one rounding
        nonzero += any(v != 0 for v in dv)
    assert nonzero == len(names)  # the values are not trivially zero


def test_explain_of_a_grouped_join_on_spark_is_free(spark: dpsql.Session) -> None:
    before = spark.remaining()
    sql, opts, _ = GROUPED["sampled_declared_count"]
    p = spark.explain(sql, epsilon=4.0, delta=1e-5, options=opts)
    text = "".join(p.bounded_sql.split())
    assert "EXPLODE(ARRAY(" in text and "SHA2(" in text and "BYNAME" not in text
    assert spark.remaining() == before


def test_clipped_integers_of_persons_in_many_groups_agree_up_to_the_norms_rounding() -> None:
    """A person's norm is a floating-point SUM of squares over their groups (a window), added in an order of the
    engine's choosing: with three or more non-integer components it can differ in its last bit between DuckDB and
    Spark, and then so does every clipped component (by a few units of 2^-k). The sums across persons are exact on
    both, so the totals differ by at most the persons' own roundings: 8 groups, 300 persons, C = 777.7, values
    within (-1000, 1000) here gave differences of up to 6 units. The bound: each component is within
    (m/2 + 3) 2^-53 C of the exact clipped value on either engine, so at most 2 (m/2 + 3) 2^-53 C 2^k + 2 < 16 units
    per person (C 2^k < 2^52)."""
    from dpsql.plan.analyze import analyze
    from dpsql.plan.joins import bound_people
    from dpsql.rewrite.join_groups import clipped_groups

    sql = "SELECT n.n_name, SUM(o.o_price) FROM orders o JOIN nation n ON o.o_nationkey = n.n_nationkey GROUP BY n.n_name"
    g = np.random.default_rng(3)
    persons, groups = 300, 8
    cust = np.repeat(np.arange(persons), groups * 3)
    nat = np.tile(np.repeat(np.arange(groups), 3), persons)
    orders = pa.table({"o_custkey": cust, "o_nationkey": nat, "o_price": g.uniform(-1e3, 1e3, cust.size)})
    out = []
    for kind in ("duckdb", "spark"):
        engine: dict[str, Any] = {"kind": kind, "statement_timeout": 300}
        s = dpsql.Session(budget=dpsql.Budget(1000.0, 0.5), engine=engine)
        try:
            s.register("nation", pa.table({"n_nationkey": np.arange(groups), "n_name": list("ABCDEFGH")}), public=True)
            s.register("customer", pa.table({"c_custkey": np.arange(persons)}), privacy_unit="c_custkey")
            s.register("orders", orders, references={"o_custkey": "customer.c_custkey", "o_nationkey": "nation.n_nationkey"},
                       degree_bounds={"o_custkey": groups * 3}, columns={"o_price": {"bounds": (-1e3, 1e3)}})
            plan = analyze(sql, dict(s.tables))
            jp, pb = plan.join, bound_people(plan.join, dict(s.tables))
            assert pb.owner is not None
            rows = s._engine.fetch_arrow(clipped_groups(jp, dict(s.tables), pb.owner, 777.7, salt="k", ops=s._engine.ops,
                                                        caps=pb.caps)).sort_by("__gid")
            out.append([int(c) for c in rows.column("__c").to_pylist()])
        finally:
            s.close()
    duck, spark = out
    assert len(duck) == groups and any(duck)
    assert all(abs(a - b) <= 16 * persons for a, b in zip(duck, spark))


def test_zero_noise_several_aggregates_are_the_same_on_duckdb_and_spark(duck: dpsql.Session, spark: dpsql.Session) -> None:
    """Several aggregates over a join (``dpsql.mechanisms.join_multi``): one bounded query per base aggregate,
    each read on the session's engine, sampled runs under salts of their own (keyed: the same on both
    engines). One query (AVG = SUM / COUNT over a sample), two Spark reads: the grouped paths run the same
    batch of single-aggregate queries, each compared above."""
    sql = "SELECT AVG(l.l_price) AS a, SUM(l.l_price) AS s FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey"
    for s in (duck, spark):
        use_noise(s, zero_noise(57))  # the same salts, in the same order, on both engines
    d, s_ = (x.query(sql, epsilon=4.0, options={"q": 0.5}) for x in (duck, spark))
    assert d.mechanism == s_.mechanism == "dp_s4s" and d.cost == s_.cost and len(d.details["aggregates"]) == 2
    (dr,), (sr,) = d.to_pylist(), s_.to_pylist()
    assert dr == pytest.approx(sr, rel=1e-9) and dr["s"] > 0 and dr["a"] > 0


#: a lookup's column without a declared domain keeps the join's clipping unless the sparse histogram is asked for
LOOKUP_SPARSE = ("SELECT n.n_name AS k, COUNT(*) AS n FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
                 "GROUP BY n.n_name ORDER BY k")


def test_join_releases_are_the_same_on_duckdb_and_spark(duck: dpsql.Session, spark: dpsql.Session) -> None:
    """DP-S4S (scalar and grouped, sampled and clipped, R2T) and lookup joins: the same released table (mechanism,
    names, types, keys in order, values bit for bit: ``tests/test_spark_parity_types.py``'s comparison), not
    trivially zero. (The tests above compare their bounded results.)"""
    from test_spark_parity_types import _differences, _release

    shapes: list[tuple[str, float, dict[str, Any] | None]] = [
        (QUERIES["chain_count_sampled"][0], 0.0, QUERIES["chain_count_sampled"][1]),
        (QUERIES["lookup_sum_r2t"][0], 0.0, None),
        *[(GROUPED[n][0], 1e-5, GROUPED[n][1]) for n in ("clip_year_count", "sampled_two_keys_sum", "r2t_year_sum")],
        (LOOKUP_SPARSE, 1e-6, {"mechanism": "sparse_histogram"}),
    ]
    problems, trivial = {}, []
    for sql, delta, options in shapes:
        d, s = (_release(x, sql, delta, options) for x in (duck, spark))
        assert d.table.num_rows > 0, sql
        if diff := _differences(d, s):
            problems[sql] = diff
        value = d.table.column_names[-1]  # the released aggregate (after the keys)
        if not any(r[value] not in (0, None) for r in d.table.to_pylist()):
            trivial.append(sql)
    assert not problems, problems
    assert not trivial  # the released values are not all zero
    assert d.mechanism == "sparse_histogram"  # the lookup's sparse histogram, as asked (the route of the one-table path)


@pytest.mark.parametrize(("sql", "delta", "options"), [
    # (the sparse histogram over a lookup's column: test_join_releases_are_the_same_on_duckdb_and_spark)
    ("SELECT c.c_nationkey AS k, COUNT(*) AS n FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
     "WHERE n.n_name <> 'B' GROUP BY k ORDER BY k", 0.0, {}),
    ("SELECT COUNT(*) AS n FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey WHERE n.n_name <> 'B'", 0.0, {}),
    # a LEFT JOIN to the lookup (tests/test_lookup_left_join.py): its conditions after the join
    ("SELECT n.n_name AS k, COUNT(*) AS n FROM customer c LEFT JOIN nation n ON c.c_nationkey = n.n_nationkey "
     "WHERE n.n_name IS NULL OR n.n_name <> 'B' GROUP BY n.n_name ORDER BY k", 1e-6, {"mechanism": "sparse_histogram"}),
    ("SELECT COUNT(n.n_name) AS n FROM customer c LEFT JOIN nation n ON c.c_nationkey = n.n_nationkey "
     "WHERE n.n_name IS NULL OR n.n_name <> 'B'", 0.0, {}),
    # a LEFT JOIN's ON conditions (tests/test_lookup_join_on_filter.py): on the lookup, and on the private table
    ("SELECT COUNT(n.n_name) AS n FROM customer c LEFT JOIN nation n ON c.c_nationkey = n.n_nationkey "
     "AND n.n_name <> 'B' AND (c.c_nationkey > 1 OR n.n_name = 'A')", 0.0, {}),
    # FILTER over a lookup join: the one-table path
    ("SELECT COUNT(*) FILTER (WHERE n.n_name <> 'B') AS n FROM customer c JOIN nation n "
     "ON c.c_nationkey = n.n_nationkey", 0.0, {})])
def test_lookup_join_one_table_route_matches_duckdb(duck: Any, spark: Any, sql: str, delta: float,
                                                    options: dict[str, Any]) -> None:
    """A lookup join on the one-table path (sparse histogram, Laplace over declared keys, Laplace scalar): the same
    zero-noise release on both engines."""
    got = [(s.explain(sql, epsilon=8.0, delta=delta, options=options).mechanism,
            s.query(sql, epsilon=8.0, delta=delta, options=options).to_pylist()) for s in (duck, spark)]
    assert got[0] == got[1] and got[0][0] in ("sparse_histogram", "laplace")


def test_lookup_null_groups_match_duckdb(duck: Any, spark: Any) -> None:
    """A LEFT JOIN's NULL group over a declared lookup column (the domain plus NULL), and the inner join's NULL group
    of a lookup column holding NULL (its key set read from the public table): the same release on both engines, and
    SQL's answer at zero noise (tests/test_lookup_left_join.py)."""
    from test_lookup_left_join import REGIONS, _countries, _duckdb, _events

    for s in (duck, spark):
        s.register("countries", _countries(), public=True, columns={"region": {"domain": REGIONS}})
        s.register("countries_open", _countries().rename_columns(["code", "region", "name"]), public=True)
        s.register("events", _events(), privacy_unit="uid", max_rows_per_unit=2, max_groups_per_unit=2,
                   max_rows_per_group=2, references={"cc": "countries.code"}, columns={"amt": {"bounds": [0, 10]}})
        s.register("events2", _events(), privacy_unit="uid", max_rows_per_unit=2, max_groups_per_unit=2,
                   max_rows_per_group=2, references={"cc": "countries_open.code"})
    left = ("SELECT c.region AS k, COUNT(*) AS n, SUM(e.amt) AS s FROM events e LEFT JOIN countries c ON e.cc = c.code "
            "WHERE c.region IS NULL OR c.region <> 'AS' GROUP BY c.region ORDER BY k")
    inner = ("SELECT c.region AS k, COUNT(*) AS n FROM events2 e JOIN countries_open c ON e.cc = c.code "
             "GROUP BY c.region ORDER BY k")
    for sql, delta in ((left, 0.0), (inner, 1e-3)):
        got = [s.query(sql, epsilon=8.0, delta=delta).to_pylist() for s in (duck, spark)]
        want = _duckdb(sql.replace("events2", "events").replace("countries_open", "countries"))
        assert got[0] == got[1] == want and any(r["k"] is None for r in want)


def test_a_lookup_join_grouped_by_a_private_text_key_matches_duckdb(duck: Any, spark: Any) -> None:
    """``GROUP BY`` the private text key of a LEFT lookup join: its joined relation read where the bounded query reads
    it (never one relation held: ``tests/test_adversary_round43.py``), the long key's text read back for its released
    group: the same zero-noise release on both engines."""
    long = "P" * 300
    uid = [u for u in range(120) for _ in range(2)]
    cc = [long if u < 40 else f"k{(u + j) % 4}" for u in range(120) for j in range(2)]
    for s in (duck, spark):
        s.register("codes_t", pa.table({"code": ["k0", "k1"], "region": ["r0", "r1"]}), public=True)
        s.register("events_t", pa.table({"uid": uid, "cc": cc}), privacy_unit="uid", references={"cc": "codes_t.code"})
    sql = "SELECT e.cc AS k, COUNT(*) AS n FROM events_t e LEFT JOIN codes_t c ON e.cc = c.code GROUP BY e.cc ORDER BY k"
    got = [s.query(sql, epsilon=8.0, delta=1e-6).to_pylist() for s in (duck, spark)]
    assert got[0] == got[1] and any(r["k"] == long for r in got[0]) and len(got[0]) > 2


def test_a_duplicated_public_key_is_refused_alike_on_duckdb_and_spark(duck: Any, spark: Any) -> None:
    """A public table's declared key is checked on its rows before the charge (``dpsql._public_keys``) on both
    engines, under the binary collation ('a' and 'A' are two keys), NULL keys allowed: the same message, nothing
    charged; once deduplicated, answered. One Spark read per explain."""
    lab = pa.table({"k": ["a", "A", "b", "b", None, None], "name": ["x", "y", "z", "z", "w", "w"]})
    ev = pa.table({"u": [1, 2, 3], "k": ["a", "A", "b"]})
    sql = "SELECT COUNT(*) FROM pk_ev e JOIN pk_lab l ON e.k = l.k"
    msgs = []
    for s in (duck, spark):
        before = s.history().num_rows
        s.register("pk_lab", lab, public=True)
        s.register("pk_ev", ev, privacy_unit="u", references={"k": "pk_lab.k"})
        with pytest.raises(dpsql.errors.ConfigError) as e:
            s.explain(sql, epsilon=1.0, delta=1e-6)
        msgs.append(str(e.value))
        s.register("pk_lab", lab.take([0, 1, 2, 4, 5]), public=True)
        assert s.explain(sql, epsilon=1.0, delta=1e-6).mechanism == "gaussian"
        assert s.history().num_rows == before
    assert msgs[0] == msgs[1] and "public table 'pk_lab': its column 'k' holds 'b' in 2 rows" in msgs[0]
