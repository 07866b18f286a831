"""Row caps k > 1 and L drawn per row on DuckDB (``dpsql.rewrite.bound.cap_rows`` with ``draw``).

The capped relation carries a fresh ``RANDOM()`` per row and keeps the n smallest per partition.
That is only sound if the draw is computed once per row: every aggregate of the query (several
value columns, COUNT(DISTINCT) lists, a variance's three sums, HAVING on the user count, public
key domains) must see the same kept rows, and no cap may be exceeded. And the kept rows must be a
uniform subset, NULL values included, L then k composed as specified.

* one read: the physical plan scans the source once in every query shape, and the released
  columns agree with each other on data where every kept subset is identifiable (per-row values
  are distinct powers of two); negative control: a relation read twice is caught by both checks;
* uniform subsets (exact binomial tests, family-wise failure probability <= 1e-6, DuckDB's
  generator seeded with ``setseed`` and one thread, so each run is reproducible), each with a
  negative control that must fail;
* only ``bounded_query`` (an aggregation that reads its capped relation once) asks for the draw.
* spilling: DuckDB runs the row-cap window as ``ARG_MIN(..., n)`` per partition (held in memory), so
  the row caps do not spill in either form (expected to fail, strict), while the window itself does.
"""

from __future__ import annotations

import ast
import math
import pathlib
from collections import Counter
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import binomtest
from test_bounding import doubles_sql, plan_for, spec_for

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
# of which user were kept. y, s are other columns of the same row (s NULL for j = 3).
PAIRS = 60
X_BOUNDS, Y_BOUNDS = (0.0, 256.0), (0.0, 100.0)
X_MID, Y_MID = 128.0, 50.0


def _paired_rows() -> pa.Table:
    user, g, x, y, s = [], [], [], [], []
    for p in range(PAIRS):
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
    """(trial, user) -> (kept rows, groups) over every released row of one trial."""
    tot: dict[tuple[int, int], tuple[int, int]] = {}
    for r in rows:
        p = int(r["__k0"].split("-")[0][1:])
        bits = int(r["__a2"])
        for slot in (0, 1):
            n = bin(bits >> (4 * slot) & 0xF).count("1")
            if n:
                k = (r["trial"], 2 * p + slot)
                rows_, groups = tot.get(k, (0, 0))
                tot[k] = (rows_ + n, groups + 1)
    return tot


@pytest.mark.parametrize("caps,domain,tau", SHAPES, ids=[f"{c.max_groups_per_unit:g}-{c.max_rows_per_group:g}-"
                                                          f"{c.max_rows_per_unit:g}-{'dom' if d else 'nodom'}-{t}"
                                                          for c, d, t in SHAPES])
def test_every_aggregate_sees_one_draw_of_the_kept_rows(caps: Caps, domain: bool, tau: int | None) -> None:
    t = _paired_rows()
    groups = sorted(set(t.column("g").to_pylist()))
    spec = spec_for("t", t, bounds={"x": X_BOUNDS, "y": Y_BOUNDS}, domains={"g": tuple(groups)} if domain else None)
    plan = plan_for(CONSISTENCY_SQL, spec)
    sql = _sql(plan, caps, tau=tau)
    assert sql.count("RANDOM() AS __rnd") == 1 + caps.unit_rows_finite  # the drawn form, one draw per cap
    assert " WITH " not in f" {sql.upper()} "  # no shared relation a plan could compute twice
    con = _connect(t, source_name("t"), threads=4, seed=0.31)
    try:
        assert _scans(con, sql) == 1  # the source is read once
        trials = 40
        union = " UNION ALL ".join(f"SELECT {i} AS trial, * FROM ({sql})" for i in range(trials))
        rows = con.sql(union).to_arrow_table().to_pylist()
    finally:
        con.close()
    bad = [v for r in rows for v in _violations(r, caps, tau)]
    assert not bad, bad[:5]
    for (trial, user), (n, g) in _per_user_totals(rows).items():
        assert n <= caps.max_rows_per_unit and g <= caps.max_groups_per_unit, (trial, user, n, g)
    if tau is None:  # every user keeps something in every trial
        assert len(_per_user_totals(rows)) == trials * 2 * PAIRS


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

    t = _paired_rows()
    plan = plan_for(CONSISTENCY_SQL, spec_for("t", t, bounds={"x": X_BOUNDS, "y": Y_BOUNDS}))
    sql = doubles_sql(plan, caps, render(bounded_query(plan, caps, salt="s", unit_column="user_id", ops=SharedOps())))
    assert sql.count("RANDOM() AS __rnd") == 2 and ("MATERIALIZED" in sql) == materialize
    con = _connect(t, source_name("t"), threads=4, seed=0.37)
    try:
        assert _scans(con, sql) == 1
        rows = con.sql(" UNION ALL ".join(f"SELECT {i} AS trial, * FROM ({sql})" for i in range(40))).to_arrow_table().to_pylist()
    finally:
        con.close()
    bad = [v for r in rows for v in _violations(r, caps, None)]
    assert not bad, bad[:5]
    totals = _per_user_totals(rows)
    assert len(totals) == 40 * 2 * PAIRS
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


# -- 2. uniform subsets -------------------------------------------------------------------------------------


def _trials(plan: ir.QueryPlan, caps: Caps, table: pa.Table, n: int, seed: float,
            edit: Any = None) -> list[list[dict[str, Any]]]:
    """The bounded output of ``n`` independent runs (DuckDB seeded, one thread: reproducible)."""
    sql = _sql(plan, caps)
    if edit is not None:
        sql = edit(sql)
    con = _connect(table, source_name(plan.table.name), threads=1, seed=seed)
    out: dict[int, list[dict[str, Any]]] = {i: [] for i in range(n)}
    try:
        for start in range(0, n, 200):
            union = " UNION ALL ".join(f"SELECT {i} AS trial, * FROM ({sql})" for i in range(start, min(n, start + 200)))
            for r in con.sql(union).to_arrow_table().to_pylist():
                out[r["trial"]].append(r)
    finally:
        con.close()
    return [out[i] for i in range(n)]


def _uniform(counts: list[int], n: int, probs: list[float]) -> bool:
    """Exact two-sided binomial test of every count against its probability, Bonferroni over the counts."""
    assert sum(counts) == n and math.isclose(sum(probs), 1.0)
    return all(binomtest(c, n, p).pvalue >= ALPHA / len(counts) for c, p in zip(counts, probs))


# one user, one group, rows (x, y) = (1, NULL), (NULL, 10), (2, 20), (NULL, NULL), k = 2: each of
# the 6 two-row subsets has probability 1/6, and (COUNT(x), SUM(x), COUNT(y), SUM(y)) names it
NULL_ROWS = pa.table({"user_id": pa.array([4] * 4, type=pa.int64()), "g": ["a"] * 4,
                      "x": pa.array([1.0, None, 2.0, None]), "y": pa.array([None, 10.0, 20.0, None])})
SUBSETS = {  # rows kept -> (COUNT(x), SUM(x), COUNT(y), SUM(y))
    (0, 1): (1, 1.0, 1, 10.0), (0, 2): (2, 3.0, 1, 20.0), (0, 3): (1, 1.0, 0, 0.0),
    (1, 2): (1, 2.0, 2, 30.0), (1, 3): (0, 0.0, 1, 10.0), (2, 3): (1, 2.0, 1, 20.0),
}
NULL_SQL = "SELECT g, COUNT(*), SUM(x), COUNT(x), SUM(y), COUNT(y) FROM t GROUP BY g"


def _subset_counts(runs: list[list[dict[str, Any]]]) -> list[int]:
    names = {v: k for k, v in SUBSETS.items()}
    seen = Counter()
    for r in runs:
        assert len(r) == 1 and r[0]["__a0"] == 2 and r[0]["__users"] == 1
        key = (int(r[0]["__a2"]), float(r[0]["__a1"]), int(r[0]["__a4"]), float(r[0]["__a3"]))
        seen[names.get(key, "not a pair of rows")] += 1
    return [seen[k] for k in SUBSETS] + [seen["not a pair of rows"]]


@pytest.mark.parametrize("caps", [Caps(1, 2), Caps(1, 2, 3)], ids=["k", "L-then-k"])
def test_k_rows_with_null_values_are_a_uniform_pair_chosen_jointly(caps: Caps) -> None:
    plan = plan_for(NULL_SQL, spec_for("t", NULL_ROWS, bounds={"x": (0, 5), "y": (0, 50)}))
    n = 1200
    counts = _subset_counts(_trials(plan, caps, NULL_ROWS, n, seed=0.11))
    assert counts[-1] == 0, counts  # every run keeps one pair of rows for all four aggregates
    assert _uniform(counts[:-1], n, [1 / 6] * 6), counts
    # negative control: rows ordered by their x value first (NULL last), the draw breaking ties only:
    # the pair (1, NULL) / (2, 20) every time, which the same test refuses
    def by_value_first(sql: str) -> str:
        if "ORDER BY __rnd__rows)" in sql:  # the window (L = 3, then k = 2)
            assert sql.count("ORDER BY __rnd__rows)") == 1
            return sql.replace("ORDER BY __rnd__rows)", "ORDER BY __a1_v NULLS LAST, __rnd__rows)")
        # first and last by draw (k = 2): by x first (NULL last; values 1 and 2 differ by more than a draw)
        assert sql.count(", __rnd__rows)") == 8  # ARG_MIN_NULL and ARG_MAX_NULL of four value columns
        return sql.replace(", __rnd__rows)", ", COALESCE(__a1_v * 2, 1e9) + __rnd__rows)")

    biased = _subset_counts(_trials(plan, caps, NULL_ROWS, n, seed=0.11, edit=by_value_first))
    assert not _uniform(biased[:-1], n, [1 / 6] * 6), biased
    # negative control of the joint choice: x and y each from its own uniform pair of rows (two
    # draws), simulated with a fixed seed: pairs that are no pair of rows appear, which the test refuses
    rng = np.random.default_rng(5)
    pairs = list(SUBSETS)
    split = []
    for _ in range(n):
        px, py = pairs[rng.integers(6)], pairs[rng.integers(6)]
        cx, sx = SUBSETS[px][:2]
        cy, sy = SUBSETS[py][2:]
        split.append([{"__a0": 2, "__users": 1, "__a1": sx, "__a2": cx, "__a3": sy, "__a4": cy}])
    assert _subset_counts(split)[-1] > 0


ONE_COLUMN = pa.table({"user_id": pa.array([6] * 4, type=pa.int64()), "g": ["a"] * 4,
                        "x": pa.array([1.0, None, 2.0, None])})


@pytest.mark.parametrize("sql,caps", [
    ("SELECT g, COUNT(*), SUM(x), COUNT(x) FROM t GROUP BY g", Caps(1, 2)),
    ("SELECT g, COUNT(*), SUM(x), COUNT(x) FROM t GROUP BY g", Caps(1, 2, 3)),
    ("SELECT COUNT(*), SUM(x), COUNT(x) FROM t", Caps(1, 2)),
    ("SELECT COUNT(*), SUM(x), COUNT(x) FROM t", Caps(1, math.inf, 2)),
], ids=["k", "L-then-k", "ungrouped-k", "ungrouped-L"])
def test_one_value_column_keeps_null_rows_as_often_as_others(sql: str, caps: Caps) -> None:
    # one value column: DuckDB runs the window as ARG_MIN(x, draw, n) with x itself, not a struct
    # of the row; a NULL x must still count as a row. Rows x = 1, NULL, 2, NULL: (COUNT(x),
    # SUM(x)) of the two kept is (1, 1) w.p. 2/6, (2, 3) 1/6, (1, 2) 2/6, (0, 0) 1/6; COUNT(*) is always 2
    plan = plan_for(sql, spec_for("t", ONE_COLUMN, bounds={"x": (0, 5)}))
    assert "RANDOM() AS __rnd" in _sql(plan, caps)
    n = 1200
    runs = _trials(plan, caps, ONE_COLUMN, n, seed=0.71)
    assert all(len(r) == 1 and r[0]["__a0"] == 2 for r in runs)
    seen = Counter((int(r[0]["__a2"]), float(r[0]["__a1"])) for r in runs)
    outcomes, probs = [(1, 1.0), (2, 3.0), (1, 2.0), (0, 0.0)], [2 / 6, 1 / 6, 2 / 6, 1 / 6]
    assert set(seen) <= set(outcomes), seen
    assert _uniform([seen[o] for o in outcomes], n, probs), seen
    # negative control: an ARG_MIN that skips NULL arguments would keep (1, 2) every time
    assert not _uniform([0, n, 0, 0], n, probs)


def test_l_then_k_keeps_a_uniform_subset_of_the_unit_then_of_its_group() -> None:
    # one user, rows a: 1, 2, 4 and b: 8; L = 3, then k = 1 (C_u = 2 keeps both groups). L keeps 3
    # of the 4 rows uniformly (each triple 1/4); then each group one of its kept rows uniformly:
    #   b dropped by L (1/4): a keeps 1, 2 or 4, 1/12 each;
    #   b kept (3/4): a kept two of its three rows, and keeps each value with probability 1/4.
    t = pa.table({"user_id": pa.array([9] * 4, type=pa.int64()), "g": ["a", "a", "a", "b"], "x": [1.0, 2.0, 4.0, 8.0]})
    plan = plan_for("SELECT g, SUM(x) FROM t GROUP BY g", spec_for("t", t, bounds={"x": (0, 10)}))
    outcomes = [(1.0, True), (2.0, True), (4.0, True), (1.0, False), (2.0, False), (4.0, False)]
    probs = [1 / 4, 1 / 4, 1 / 4, 1 / 12, 1 / 12, 1 / 12]
    n = 1200

    def counts(runs: list[list[dict[str, Any]]]) -> list[int]:
        seen = Counter()
        for r in runs:
            by = {row["__k0"]: row for row in r}
            assert set(by) <= {"a", "b"} and "a" in by and all(row["__a0"] in (1.0, 2.0, 4.0, 8.0) for row in r)
            seen[(by["a"]["__a0"], "b" in by)] += 1
        return [seen[o] for o in outcomes]

    sql = _sql(plan, Caps(2, 1, 3))
    assert "ORDER BY __rnd__unit_rows" in sql and "ORDER BY __rnd__rows" in sql
    got = counts(_trials(plan, Caps(2, 1, 3), t, n, seed=0.27))
    assert _uniform(got, n, probs), got
    # negative control: k before L (k = 1 leaves 2 rows, which L = 3 keeps: b never dropped, a
    # uniform over 1, 2, 4); that is what the caps give without L, run the same way
    wrong = counts(_trials(plan, Caps(2, 1), t, n, seed=0.27))
    assert wrong[3:] == [0, 0, 0]
    assert not _uniform(wrong, n, probs), wrong


def test_l_alone_keeps_a_uniform_subset_of_rows() -> None:
    # one user, one group, values 1, 1, 2, 4, L = 2 and no k: each of the 6 pairs of rows is equally
    # likely (identical rows draw separately): kept sum 2 w.p. 1/6, 3 w.p. 2/6, 5 w.p. 2/6, 6 w.p. 1/6
    t = pa.table({"user_id": pa.array([5] * 4, type=pa.int64()), "g": ["a"] * 4, "x": [1.0, 2.0, 1.0, 4.0]})
    plan = plan_for("SELECT g, SUM(x) FROM t GROUP BY g", spec_for("t", t, bounds={"x": (0, 10)}))
    caps = Caps(1, math.inf, 2)
    sql = _sql(plan, caps)
    assert "ARG_MAX_NULL(__a0_v, __rnd__unit_rows)" in sql and "__rnd__rows" not in sql  # L = 2: first and last
    n = 1200
    sums = Counter(r[0]["__a0"] for r in _trials(plan, caps, t, n, seed=0.53))
    assert set(sums) <= {2.0, 3.0, 5.0, 6.0}, sums
    probs = [1 / 6, 2 / 6, 2 / 6, 1 / 6]
    assert _uniform([sums[2.0], sums[3.0], sums[5.0], sums[6.0]], n, probs), sums
    # negative control: the two distinct values 1 merged into one row ({1, 2}, {1, 4}, {2, 4}, 1/3
    # each: the sum 2 never, 3, 5, 6 n/3 each) fails the same test
    assert not _uniform([0, n // 3, n // 3, n - 2 * (n // 3)], n, probs)


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

    b = DuckDBBackend(None, EngineSettings(memory_limit="60MB", threads=1, debug=True,
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
