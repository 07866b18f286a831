"""Row caps k > 1 and L drawn per row on DuckDB (``dpsql.rewrite.bound.cap_rows`` with ``draw``).

The capped relation carries a fresh ``RANDOM()`` per row and keeps the n smallest per partition.
That is only sound if the draw is computed once per row: every aggregate of the query (several
value columns, COUNT(DISTINCT) lists, a variance's three sums, HAVING on the user count, public
key domains) must see the same kept rows, and no cap may be exceeded. And the kept rows must be a
uniform subset, NULL values included, L then k composed as specified.

* one read: the physical plan scans the source once in every query shape, and the released
  columns agree with each other on data where every kept subset is identifiable (per-row values
  are distinct powers of two); negative control: a relation read twice is caught by both checks;
* uniform subsets (exact binomial tests, family-wise failure probability <= 1e-6; the n runs of a
  test are one query over n copies of its data, each copy with units and group keys of its own, so
  each copy's choice is made from its own rows and draws; DuckDB's generator seeded with ``setseed``
  and one thread, so the runs are reproducible), each with a negative control that must fail;
* only ``bounded_query`` (an aggregation that reads its capped relation once) asks for the draw.
* spilling: DuckDB runs the row-cap window as ``ARG_MIN(..., n)`` per partition (held in memory), so
  the row caps do not spill in either form (expected to fail, strict), while the window itself does.
"""

from __future__ import annotations

import ast
import functools
import math
import pathlib
from collections import Counter
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import binomtest
from test_bounding import doubles_sql, plan_for, replica_runs, replicas, spec_for

from dpsql.plan import ir
from dpsql.rewrite.bound import Caps, bounded_query, source_name
from dpsql.rewrite.render import render

ALPHA = 1e-6  # family-wise failure probability of each statistical test


def _sql(plan: ir.QueryPlan, caps: Caps, *, tau: int | None = None, salt: str = "s") -> str:
    return doubles_sql(plan, caps, render(bounded_query(plan, caps, salt=salt, tau=tau, unit_column="user_id")))


def _connect(table: pa.Table, name: str, *, threads: int, seed: float | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.sql(f"SET threads = {threads}")
    con.register("__arrow", table)
    con.sql(f"CREATE TABLE {name} AS SELECT * FROM __arrow")  # a table: its scans are 'Seq Scan' in EXPLAIN
    if seed is not None:
        con.sql(f"SELECT setseed({seed})").fetchall()
    return con


def _scans(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    """How many times the physical plan scans a table."""
    return "\n".join(str(r[1]) for r in con.sql("EXPLAIN " + sql).fetchall()).count("Seq Scan")


# -- 1. the draw is computed once: every aggregate sees the same kept rows ------------------------------------

# pairs of users share three groups; each user has 4 rows per group (12 rows), the row j of the
# user in slot s (0 or 1) has x = 2^(4s + j): the sum of x in a group identifies exactly which rows
# of which user were kept. y, s are other columns of the same row (s NULL for j = 3). TRIALS runs of
# PAIRS pairs are one query over TRIALS * PAIRS pairs (run i: the pairs i * PAIRS, ...): every user
# and group belongs to one run, and each user's rows are chosen from its own rows and draws.
PAIRS = 60
TRIALS = 40
X_BOUNDS, Y_BOUNDS = (0.0, 256.0), (0.0, 100.0)
X_MID, Y_MID = 128.0, 50.0


@functools.cache  # read-only (Arrow tables are immutable): built once per size
def _paired_rows(pairs: int = PAIRS) -> pa.Table:
    user, g, x, y, s = [], [], [], [], []
    for p in range(pairs):
        for slot in (0, 1):
            for grp in range(3):
                for j in range(4):
                    user.append(2 * p + slot)
                    g.append(f"p{p}-{grp}")
                    x.append(float(2 ** (4 * slot + j)))
                    y.append(float(10 * j + slot + 1))
                    s.append(f"v{j}" if j < 3 else None)
    return pa.table({"user_id": pa.array(user, type=pa.int64()), "g": g, "x": x, "y": y,
                     "s": pa.array(s, type=pa.string())})


CONSISTENCY_SQL = ("SELECT g, COUNT(*), COUNT(DISTINCT s), SUM(x), COUNT(x), AVG(y), VARIANCE(x), SUM(y) "
                   "FROM t GROUP BY g")
SHAPES = [  # (C_u, k, L), public domain on g, tau
    (Caps(3, 2), False, None),
    (Caps(3, 2), True, None),
    (Caps(3, 2, 5), False, None),
    (Caps(3, 2, 5), True, 2),
    (Caps(2, 3, 4), False, 2),
    (Caps(3, 1, 5), True, None),
    (Caps(1, 4, 3), False, None),
    (Caps(3, 4, 6), True, None),
]


def _violations(row: dict[str, Any], caps: Caps, tau: int | None) -> list[str]:
    """Every way a released row of CONSISTENCY_SQL disagrees with one set of kept rows within the caps."""
    bits = int(row["__a2"])
    kept = [(slot, j) for slot in (0, 1) for j in range(4) if bits >> (4 * slot + j) & 1]
    out = []
    per_user = Counter(slot for slot, _ in kept)
    if any(c > caps.max_rows_per_group for c in per_user.values()):
        out.append(f"more than k rows of a user: {kept}")
    expect = {
        "__users": len(per_user), "__a0": len(kept), "__a3": len(kept),
        "__a1": len({j for _, j in kept if j < 3}),
        "__a6": sum(10 * j + slot + 1 for slot, j in kept),
        "__a4_sum": sum(10 * j + slot + 1 - Y_MID for slot, j in kept), "__a4_cnt": len(kept),
        "__a5_sum": sum(2 ** (4 * slot + j) - X_MID for slot, j in kept), "__a5_cnt": len(kept),
        "__a5_sq": sum((2 ** (4 * slot + j) - X_MID) ** 2 for slot, j in kept),
    }
    for col, want in expect.items():
        if float(row[col]) != float(want):
            out.append(f"{col} = {row[col]} but the rows {kept} give {want}")
    if tau is not None and len(per_user) < tau:
        out.append(f"a group with {len(per_user)} user(s) released under tau = {tau}")
    return out


def _per_user_totals(rows: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[int, int]]:
    """(trial, user) -> (kept rows, groups) over every released row of that user's trial."""
    tot: dict[tuple[int, int], tuple[int, int]] = {}
    for r in rows:
        p = int(r["__k0"].split("-")[0][1:])
        bits = int(r["__a2"])
        for slot in (0, 1):
            n = bin(bits >> (4 * slot) & 0xF).count("1")
            if n:
                k = (p // PAIRS, 2 * p + slot)
                rows_, groups = tot.get(k, (0, 0))
                tot[k] = (rows_ + n, groups + 1)
    return tot


@pytest.mark.parametrize("caps,domain,tau", SHAPES, ids=[f"{c.max_groups_per_unit:g}-{c.max_rows_per_group:g}-"
                                                          f"{c.max_rows_per_unit:g}-{'dom' if d else 'nodom'}-{t}"
                                                          for c, d, t in SHAPES])
def test_every_aggregate_sees_one_draw_of_the_kept_rows(caps: Caps, domain: bool, tau: int | None) -> None:
    t = _paired_rows(TRIALS * PAIRS)
    groups = sorted(set(t.column("g").to_pylist()))
    spec = spec_for("t", t, bounds={"x": X_BOUNDS, "y": Y_BOUNDS}, domains={"g": tuple(groups)} if domain else None)
    plan = plan_for(CONSISTENCY_SQL, spec)
    sql = _sql(plan, caps, tau=tau)
    assert sql.count("RANDOM() AS __rnd") == 1 + caps.unit_rows_finite  # the drawn form, one draw per cap
    assert " WITH " not in f" {sql.upper()} "  # no shared relation a plan could compute twice
    con = _connect(t, source_name("t"), threads=4, seed=0.31)
    try:
        # the source is read once with its draws; a long text key's texts (bound.with_key_texts: no draw) once more
        assert 1 <= _scans(con, sql) <= 1 + ("__key_texts" in sql)  # (short keys: the table's statistics drop it)
        rows = con.sql(sql).to_arrow_table().to_pylist()
    finally:
        con.close()
    bad = [v for r in rows for v in _violations(r, caps, tau)]
    assert not bad, bad[:5]
    for (trial, user), (n, g) in _per_user_totals(rows).items():
        assert n <= caps.max_rows_per_unit and g <= caps.max_groups_per_unit, (trial, user, n, g)
    if tau is None:  # every user keeps something in every trial
        assert len(_per_user_totals(rows)) == TRIALS * 2 * PAIRS


@pytest.mark.parametrize("materialize", [True, False], ids=["materialized", "plain-cte"])
@pytest.mark.parametrize("caps", [Caps(2, 2, 5), Caps(1, 3, 4)], ids=["2-2-5", "1-3-4"])
def test_group_cap_over_a_shared_relation_reads_one_draw(caps: Caps, materialize: bool) -> None:
    # the group cap without the window (backends that lack it) reads the (unit, group) relation
    # three times through a CTE: with the row caps drawn below it, one evaluation must serve all
    # three (DuckDB computes a CTE read more than once once, AS MATERIALIZED or not)
    from dpsql.engine.duckdb_ops import DuckDBOps

    class SharedOps(DuckDBOps):
        group_cap_window = False
        materialize_shared = materialize

    t = _paired_rows(TRIALS * PAIRS)
    plan = plan_for(CONSISTENCY_SQL, spec_for("t", t, bounds={"x": X_BOUNDS, "y": Y_BOUNDS}))
    sql = doubles_sql(plan, caps, render(bounded_query(plan, caps, salt="s", unit_column="user_id", ops=SharedOps())))
    assert sql.count("RANDOM() AS __rnd") == 2 and ("MATERIALIZED" in sql) == materialize
    con = _connect(t, source_name("t"), threads=4, seed=0.37)
    try:
        assert 1 <= _scans(con, sql) <= 1 + ("__key_texts" in sql)  # (a long text key's texts: their own read)
        rows = con.sql(sql).to_arrow_table().to_pylist()
    finally:
        con.close()
    bad = [v for r in rows for v in _violations(r, caps, None)]
    assert not bad, bad[:5]
    totals = _per_user_totals(rows)
    assert len(totals) == TRIALS * 2 * PAIRS
    for (trial, user), (n, g) in totals.items():
        assert n <= caps.max_rows_per_unit and g <= caps.max_groups_per_unit, (trial, user, n, g)


def test_a_relation_drawn_twice_is_caught() -> None:
    # negative control for the test above: the same capped rows, read twice through a CTE that
    # DuckDB does not materialise (one read for SUM(x), the other for SUM(y)), are two draws: the
    # plan scans the source twice and the released sums disagree about which rows were kept
    t = _paired_rows()
    plan = plan_for("SELECT g, SUM(x) FROM t GROUP BY g", spec_for("t", t, bounds={"x": X_BOUNDS}))
    for caps in (Caps(3, 2), Caps(3, 3)):  # k = 2: first and last by draw; k = 3: the window
        _drawn_twice_disagree(t, plan, caps)


def _subquery(sql: str, alias: str) -> str:
    """The text of the subquery ``( ... ) AS alias`` in ``sql`` (one-line rendering)."""
    end = sql.index(f") AS {alias}")
    depth = 0
    for i in range(end, -1, -1):
        depth += {")": 1, "(": -1}.get(sql[i], 0)
        if depth == 0:
            return sql[i + 1:end]
    raise AssertionError(alias)


def _drawn_twice_disagree(t: pa.Table, plan: ir.QueryPlan, caps: Caps) -> None:
    capped = _subquery(_sql(plan, caps), "__rows")
    assert "RANDOM() AS __rnd__rows" in capped
    two = (f"WITH c AS NOT MATERIALIZED ({capped}) "
           "SELECT a.__k0, a.sx, b.sy FROM (SELECT __k0, SUM(__a0_v) AS sx FROM c GROUP BY __k0) AS a "
           "JOIN (SELECT __k0, SUM(__a0_v) AS sy FROM c GROUP BY __k0) AS b ON a.__k0 = b.__k0")
    con = _connect(t, source_name("t"), threads=4, seed=0.31)
    try:
        assert _scans(con, two) == 2
        rows = con.sql(two).fetchall()
    finally:
        con.close()
    assert len(rows) == 3 * PAIRS
    assert sum(sx != sy for _, sx, sy in rows) > 0  # two draws: the reads disagree


# -- shared by the uniform-subset tests (test_adversary_row_caps_uniform.py) and section 5 ---------------


def _trials(plan: ir.QueryPlan, caps: Caps, table: pa.Table, n: int, seed: float,
            edit: Any = None) -> list[list[dict[str, Any]]]:
    """The bounded output of ``n`` independent runs over ``table``, from one query over ``n`` copies of
    it with units and group keys of their own (``test_bounding.replica_runs``; DuckDB seeded, one
    thread: reproducible)."""
    sql = _sql(plan, caps)
    if edit is not None:
        sql = edit(sql)
    con = _connect(replicas(table, n, key="g" if plan.keys else None), source_name(plan.table.name), threads=1)
    try:
        return replica_runs(con, sql, plan, table, n, seed)
    finally:
        con.close()


def _uniform(counts: list[int], n: int, probs: list[float]) -> bool:
    """Exact two-sided binomial test of every count against its probability, Bonferroni over the counts."""
    assert sum(counts) == n and math.isclose(sum(probs), 1.0)
    return all(binomtest(c, n, p).pvalue >= ALPHA / len(counts) for c, p in zip(counts, probs))


# -- 3. only the aggregation asks for the draw ------------------------------------------------------------------


def test_only_bounded_query_draws_and_only_for_its_row_caps() -> None:
    # a capped relation read twice (range histograms, joins) must keep the salted numbering:
    # every call of the row caps in the package passes draw=True only inside bounded_query,
    # bounded_value_histograms' ungrouped form, whose kept rows are read once (one aggregate over
    # every grid: tests/test_quantile_drawn.py), and bounded_histogram (one chain of subqueries)
    root = pathlib.Path(__file__).resolve().parent.parent / "dpsql"
    drawn: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
                name = getattr(call.func, "id", getattr(call.func, "attr", ""))
                for kw in call.keywords:
                    if kw.arg == "draw" and name in ("cap_rows", "cap_rows_per_unit", "cap_rows_per_group"):
                        drawn.append(f"{path.relative_to(root.parent)}:{fn.name}:{name}:{ast.unparse(kw.value)}")
    passthrough = {"dpsql/rewrite/bound.py:cap_rows_per_unit:cap_rows:draw",
                   "dpsql/rewrite/bound.py:cap_rows_per_group:cap_rows:draw"}
    assert sorted(set(drawn) - passthrough) == ["dpsql/rewrite/bound.py:bounded_histogram:cap_rows_per_unit:True",
                                                "dpsql/rewrite/bound.py:bounded_query:cap_rows_per_group:True",
                                                "dpsql/rewrite/bound.py:bounded_query:cap_rows_per_unit:True",
                                                "dpsql/rewrite/bound.py:bounded_value_histograms:cap_rows_per_group:True",
                                                "dpsql/rewrite/bound.py:bounded_value_histograms:cap_rows_per_unit:True"], drawn


# -- 4. spilling ---------------------------------------------------------------------------------------------


def _row_cap_under_limit(tmp_path: Any, ops: Any, *, disabled: str | None = None, keep: int = 4) -> list[tuple[Any, ...]]:
    """2M units of one row each, ``keep`` rows kept per unit (L = 4 by default, every row kept), under a 60MB limit."""
    from sqlglot import exp

    from dpsql.engine.duckdb_ops import SaltedDuckDBOps
    from dpsql.rewrite.bound import cap_rows_per_unit

    con = duckdb.connect()
    try:
        con.sql("SET threads = 1")
        con.sql(f"SET temp_directory = '{tmp_path / type(ops).__name__}'")
        con.sql("CREATE TABLE r AS SELECT i AS u, 'C' || (i % 50) AS g, (i % 10)::DOUBLE AS x FROM range(2000000) t(i)")
        con.sql("SET memory_limit = '60MB'")
        con.sql("SET preserve_insertion_order = false")
        if disabled is not None:
            con.sql(f"SET disabled_optimizers = '{disabled}'")
        kept = cap_rows_per_unit(exp.select("*").from_("r").subquery("__base"), "u", ["g", "x"], keep, "s",
                                 ops=ops, draw=True)
        q = exp.select(exp.func("count", exp.Star()), exp.func("sum", exp.column("x"))).from_(kept)
        assert ("ROW_NUMBER" in render(q)) == (keep != 2 or isinstance(ops, SaltedDuckDBOps))
        return con.sql(render(q)).fetchall()
    finally:
        con.close()


def _ops(name: str) -> Any:
    from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps

    return DuckDBOps() if name == "drawn" else SaltedDuckDBOps()


def _row_cap_through_the_engine(tmp_path: Any, ops: Any) -> list[tuple[Any, ...]]:
    """The same row cap run by dpsql's DuckDB engine under a 60MB limit (the engine turns DuckDB's
    top-n window rewrite off for the window marked SPILLING_WINDOW)."""
    from sqlglot import exp

    from dpsql.engine import EngineSettings
    from dpsql.engine.base import source_name
    from dpsql.engine.duckdb import DuckDBBackend
    from dpsql.rewrite.bound import cap_rows_per_unit

    b = DuckDBBackend(None, EngineSettings(memory_limit="60MB", threads=1, debug=True, max_text_bytes=4096,
                                           temp_directory=str(tmp_path / ("engine-" + type(ops).__name__))))
    try:
        b.ops = ops
        i = np.arange(2_000_000)
        b.register_source("r", "arrow", pa.table({"u": i, "g": pa.array(["C" + str(k) for k in range(50)])
                                                  .take(pa.array(i % 50)), "x": (i % 10).astype(np.float64)}))
        kept = cap_rows_per_unit(exp.select("*").from_(source_name("r")).subquery("__base"), "u", ["g", "x"], 4, "s",
                                 ops=ops, draw=True)
        q = exp.select(exp.func("count", exp.Star()), exp.func("sum", exp.column("x"))).from_(kept)
        return [tuple(r.values()) for r in b.fetch_arrow(q).to_pylist()]
    finally:
        b.close()


@pytest.mark.parametrize("form", ["drawn", "salted"])
def test_row_caps_spill_under_a_small_memory_limit(tmp_path: Any, form: str) -> None:
    # DuckDB's top_n_window_elimination would rewrite QUALIFY ROW_NUMBER() OVER (PARTITION BY p ORDER BY
    # one key) <= n into ARG_MIN(..., n) per partition, whose states stay in memory (the raw query
    # below fails for memory: the control); the engine runs the marked window as a window, which spills
    assert _row_cap_through_the_engine(tmp_path, _ops(form)) == [(2000000, 9000000.0)]
    with pytest.raises(duckdb.OutOfMemoryException):
        _row_cap_under_limit(tmp_path, _ops(form))


@pytest.mark.parametrize("form", ["drawn", "salted"])
def test_row_cap_window_spills_when_not_rewritten_into_arg_min(tmp_path: Any, form: str) -> None:
    # the cause of the failure above: the same query completes under the same limit as a window
    assert _row_cap_under_limit(tmp_path, _ops(form), disabled="top_n_window_elimination") == [(2000000, 9000000.0)]


# -- 5. two rows: the first and the last by draw -------------------------------------------------------------

# users with 1, 2 and 3 rows in one group, k = 2; x = 2^j names the rows kept (SUM(x)), y = 10 x is
# the same row's other column (SUM(y) = 10 SUM(x) exactly when both fields come from the same rows)
SIZES = pa.table({"user_id": pa.array([1, 2, 2, 3, 3, 3], type=pa.int64()), "g": ["a"] * 6,
                  "x": [1.0, 1.0, 2.0, 1.0, 2.0, 4.0], "y": [10.0, 10.0, 20.0, 10.0, 20.0, 40.0]})


def test_two_rows_keep_one_of_one_both_of_two_and_a_uniform_pair_of_three() -> None:
    plan = plan_for("SELECT g, COUNT(*), SUM(x), SUM(y) FROM t GROUP BY g",
                    spec_for("t", SIZES, bounds={"x": (0, 10), "y": (0, 100)}))
    sql = _sql(plan, Caps(1, 2))
    assert "ORDER BY __rnd" not in sql and "ARG_MAX_NULL(__a1_v, __rnd__rows)" in sql  # no window
    n = 1200
    runs = _trials(plan, Caps(1, 2), SIZES, n, seed=0.43)
    pairs = Counter()
    for r in runs:
        assert len(r) == 1 and r[0]["__users"] == 3 and r[0]["__a0"] == 1 + 2 + 2  # 1 row, 2 rows, 2 of 3
        assert r[0]["__a2"] == 10 * r[0]["__a1"]  # each kept row's x and y come from that one row
        pairs[r[0]["__a1"] - 1.0 - 3.0] += 1  # user 3's pair: 3 (1+2), 5 (1+4) or 6 (2+4)
    assert set(pairs) <= {3.0, 5.0, 6.0}, pairs
    assert _uniform([pairs[3.0], pairs[5.0], pairs[6.0]], n, [1 / 3] * 3), pairs
    # negative controls: the two smallest values (a choice by value) keep 1 + 2 every time; a first row by
    # draw and a second by value (the largest x, or the smallest when the first is the largest) keeps
    # 1 + 4 w.p. 1/3, 2 + 4 w.p. 1/3 and, from a first row 4, 1 + 4 again: 3 never, 5 w.p. 2/3
    assert not _uniform([n, 0, 0], n, [1 / 3] * 3)
    assert not _uniform([0, 2 * n // 3, n - 2 * n // 3], n, [1 / 3] * 3)


def test_two_rows_spill_as_an_aggregate_with_no_optimizer_turned_off(tmp_path: Any) -> None:
    # L = 2 over 2M units of one row: one hash aggregate (fixed-size states), which spills under the
    # same 60MB limit the window needs the engine's help for; the control with L = 4 (the window,
    # rewritten by DuckDB into ARG_MIN lists) fails for memory in test_row_caps_spill_under_a_small_memory_limit
    assert _row_cap_under_limit(tmp_path, _ops("drawn"), keep=2) == [(2000000, 9000000.0)]


def test_two_rows_of_a_relation_with_no_other_column_keep_min_n_2_rows_per_partition() -> None:
    from sqlglot import exp

    from dpsql.engine.duckdb_ops import DuckDBOps
    from dpsql.rewrite.bound import cap_rows_per_unit

    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE r AS SELECT * FROM (VALUES (1), (1), (1), (2), (3), (3)) v(u)")
        kept = cap_rows_per_unit(exp.select("*").from_("r").subquery("__base"), "u", [], 2, "s", ops=DuckDBOps(), draw=True)
        q = exp.select("u", exp.func("count", exp.Star())).from_(kept).group_by("u").order_by("u")
        assert "ROW_NUMBER" not in render(q)
        assert con.sql(render(q)).fetchall() == [(1, 2), (2, 1), (3, 2)]
    finally:
        con.close()
