"""Attacks on the row cap of exactly two rows on the drawn path (``DuckDBOps.keep_two_drawn``).

A cap of two (k = 2 or L = 2) keeps, per partition, the rows with the smallest and the largest
per-row ``RANDOM()`` draw: one hash aggregate of ``ARG_MIN_NULL`` / ``ARG_MAX_NULL`` per column,
then the two values of each column unnested in lockstep. These tests check what the
sensitivity argument needs from it:

* one draw per row under parallel threads: in every partition of two rows both rows are kept
  (never one row twice), and every kept row's fields come from one source row; negative control:
  a draw evaluated separately in each aggregate is caught by the same checks;
* a uniform pair (exact binomial tests, family-wise failure probability <= 1e-6, DuckDB's
  generator seeded with ``setseed`` and one thread) in a partition of five rows with two
  identical rows and a NULL value, and for L = 2, L = 2 then k = 2 and L = 3 then k = 2; each
  with negative controls that must fail;
* nothing downstream reads a column the two-row form drops: every aggregate kind, WHERE,
  expression keys, public key domains, tau, scalar and grouped, give the same bounded values as
  the window (a cap of three) on data where both keep every row (NaN, -0.0, NULL keys and values,
  'a' / 'A' keys, also on a NOCASE connection with NOCASE columns);
* reproducible backends (Spark, the salted and portable DuckDB forms) never take this path;
* FINDING (fixed by taking the two-row form only with at most ``TWO_ROW_MAX_COLUMNS`` = 2
  carried columns): under a small memory limit (60MB; about 15MB per carried column is needed)
  the aggregate failed for memory where the window completes, and one person's rows in many
  distinct groups decided whether it failed with four columns. The sections 1-4 test the form
  itself, so they lift that limit (``_any_width``); section 5 runs with it.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import binomtest
from sqlglot import exp
from test_bounding import doubles_sql, plan_for, spec_for

from dpsql.engine.base import source_name
from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps
from dpsql.engine.portable import PortableDuckDBOps
from dpsql.engine.spark_ops import SparkOps
from dpsql.plan import ir
from dpsql.rewrite import bound
from dpsql.rewrite.bound import Caps, bounded_query, cap_rows_per_group
from dpsql.rewrite.render import render

ALPHA = 1e-6  # family-wise failure probability of each statistical test


@pytest.fixture(autouse=True)
def _any_width(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sections 1-4 check the two-row form itself, at any number of carried columns."""
    if "memory" not in request.node.name and "window_completes" not in request.node.name:
        monkeypatch.setattr(bound, "TWO_ROW_MAX_COLUMNS", 64)


def _sql(plan: ir.QueryPlan, caps: Caps, *, tau: int | None = None, ops: Any = None) -> str:
    return doubles_sql(plan, caps, render(bounded_query(plan, caps, salt="s", tau=tau, unit_column="user_id", ops=ops)))


def _uniform(counts: list[int], n: int, probs: list[float]) -> bool:
    """Exact two-sided binomial test of every count against its probability, Bonferroni over the counts."""
    assert sum(counts) == n and math.isclose(sum(probs), 1.0)
    return all(binomtest(c, n, p).pvalue >= ALPHA / len(counts) for c, p in zip(counts, probs))


def _trials(sql: str, table: pa.Table, n: int, seed: float) -> list[list[dict[str, Any]]]:
    """The bounded output of ``n`` independent trials in one run: the table's rows copied ``n`` times, copy i
    with its own users (user_id + 1000 i) and groups (g prefixed 'i:'), so each copy's rows are capped by their
    own draws; the released rows of copy i are trial i (DuckDB seeded, one thread: reproducible)."""
    rows = table.to_pylist()
    copies = [{**r, "user_id": r["user_id"] + 1000 * i, "g": f"{i}:{r['g']}"} for i in range(n) for r in rows]
    con = duckdb.connect()
    con.sql("SET threads = 1")
    con.register(source_name("t"), pa.Table.from_pylist(copies, schema=table.schema))
    con.sql(f"SELECT setseed({seed})").fetchall()
    out: dict[int, list[dict[str, Any]]] = {i: [] for i in range(n)}
    try:
        for r in con.sql(sql).to_arrow_table().to_pylist():
            out[int(r["__k0"].split(":")[0])].append(r)
    finally:
        con.close()
    return [out[i] for i in range(n)]


def _draw_per_aggregate(sql: str, rnd: str) -> str:
    """Negative control: each ARG_MIN_NULL / ARG_MAX_NULL orders by its own RANDOM() (the draw
    evaluated once per aggregate instead of once per row)."""
    assert sql.count(f", {rnd})") >= 2
    return sql.replace(f", {rnd})", ", RANDOM())")


# -- 1. one draw per row, under parallel threads ---------------------------------------------------------------

def _pairs_table(units: int) -> pa.Table:
    # units of two rows (x = 1, 2) and of three rows (x = 1, 2, 4); y = 10 x and s = 'v' || x belong to the row
    u2 = np.repeat(np.arange(units), 2)
    u3 = np.repeat(np.arange(units, 2 * units), 3)
    x = np.concatenate([np.tile([1.0, 2.0], units), np.tile([1.0, 2.0, 4.0], units)])
    return pa.table({"u": np.concatenate([u2, u3]), "g": pa.array(["a"] * len(x)), "x": x, "y": 10 * x,
                     "s": pa.array([f"v{int(v)}" for v in x])})


def _bad_units(edit: Any = None) -> tuple[int, int, int, int]:
    """(units, two-row units not kept whole, kept rows whose y or s is not their x's, units of three
    not keeping two distinct rows) over 100000 + 100000 units, four threads."""
    con = duckdb.connect()
    try:
        con.sql("SET threads = 4")
        con.register("r", _pairs_table(100_000))
        kept = cap_rows_per_group(exp.select("*").from_("r").subquery("__base"), "u", ["g"], ["x", "y", "s"], 2, "salt",
                                  ops=DuckDBOps(), draw=True)
        sql = render(exp.select("*").from_(kept))
        assert "ROW_NUMBER" not in sql and "ARG_MAX_NULL(s, __rnd__rows)" in sql
        if edit is not None:
            sql = edit(sql)
        q = (f"SELECT COUNT(*), SUM(CASE WHEN u < 100000 AND sx <> 3 THEN 1 ELSE 0 END), SUM(mixed), "
             f"SUM(CASE WHEN u >= 100000 AND (n <> 2 OR nd <> 2) THEN 1 ELSE 0 END) FROM ("
             f"SELECT u, SUM(x) AS sx, COUNT(*) AS n, COUNT(DISTINCT x) AS nd, "
             f"SUM(CASE WHEN y = 10 * x AND s = 'v' || CAST(x AS INTEGER) THEN 0 ELSE 1 END) AS mixed "
             f"FROM ({sql}) GROUP BY u)")
        row = con.sql(q).fetchall()[0]
        return int(row[0]), int(row[1]), int(row[2]), int(row[3])
    finally:
        con.close()


def test_two_rows_are_two_whole_rows_under_parallel_threads() -> None:
    assert _bad_units() == (200_000, 0, 0, 0)
    # negative control: a draw per aggregate keeps one row twice or mixes the fields of two rows
    units, split, mixed, twice = _bad_units(lambda s: _draw_per_aggregate(s, "__rnd__rows"))
    assert units == 200_000 and split > 10_000 and mixed > 10_000 and twice > 10_000, (split, mixed, twice)


# -- 2. uniform pairs: identical rows, NULL values, the caps composed -----------------------------------------

# one user, one group, five rows x = 1, 1 (two identical rows), 2, NULL, 4; k = 2: each of the 10 pairs of rows
# has probability 1/10, and (COUNT(x), SUM(x)) of the pair takes these values with these probabilities (by hand):
FIVE = pa.table({"user_id": pa.array([5] * 5, type=pa.int64()), "g": ["a"] * 5,
                 "x": pa.array([1.0, 1.0, 2.0, None, 4.0])})
FIVE_PAIRS = {  # (COUNT(x), SUM(x)) -> probability
    (2, 2.0): 1 / 10,   # {1, 1'}
    (2, 3.0): 2 / 10,   # {1, 2}, {1', 2}
    (1, 1.0): 2 / 10,   # {1, NULL}, {1', NULL}
    (2, 5.0): 2 / 10,   # {1, 4}, {1', 4}
    (1, 2.0): 1 / 10,   # {2, NULL}
    (2, 6.0): 1 / 10,   # {2, 4}
    (1, 4.0): 1 / 10,   # {NULL, 4}
}


def _five_counts(runs: list[list[dict[str, Any]]]) -> list[int]:
    seen: Counter[Any] = Counter()
    for r in runs:
        ok = len(r) == 1 and r[0]["__a0"] == 2 and r[0]["__users"] == 1
        key = (int(r[0]["__a2"]), float(r[0]["__a1"])) if ok else None
        seen[key if key in FIVE_PAIRS else "not a pair of rows"] += 1
    return [seen[k] for k in FIVE_PAIRS] + [seen["not a pair of rows"]]


def test_two_of_five_rows_with_identical_rows_and_null_is_a_uniform_pair() -> None:
    plan = plan_for("SELECT g, COUNT(*), SUM(x), COUNT(x) FROM t GROUP BY g", spec_for("t", FIVE, bounds={"x": (0, 5)}))
    sql = _sql(plan, Caps(1, 2))
    assert "ARG_MAX_NULL(__a1_v, __rnd__rows)" in sql and "ORDER BY __rnd" not in sql
    n = 2000
    counts = _five_counts(_trials(sql, FIVE, n, seed=0.21))
    assert counts[-1] == 0, counts
    assert _uniform(counts[:-1], n, list(FIVE_PAIRS.values())), counts
    # negative controls: (a) identical rows merged (a uniform pair of the distinct values 1, 2, NULL, 4: the
    # pair {1, 1'} never, the six others 1/6 each) is refused by the same test
    merged = [0] + [n // 6] * 5 + [n - 5 * (n // 6)]
    assert not _uniform(merged, n, list(FIVE_PAIRS.values()))
    # (b) a draw per aggregate: one row twice (e.g. NULL, NULL: COUNT(x) = 0) or fields of two rows
    bad = _five_counts(_trials(_draw_per_aggregate(sql, "__rnd__rows"), FIVE, 400, seed=0.21))
    assert bad[-1] > 0 or not _uniform(bad[:-1], 400, list(FIVE_PAIRS.values())), bad


# one user, group a with x = 1, 2, 4 and group b with x = 8, 16 (x names the row): the total of the kept x
TWO_GROUPS = pa.table({"user_id": pa.array([9] * 5, type=pa.int64()), "g": ["a", "a", "a", "b", "b"],
                       "x": [1.0, 2.0, 4.0, 8.0, 16.0]})
# L = 2 (then k = 2, a no-op): a uniform pair of the five rows, each of the 10 totals 1/10
L2_TOTALS = {t: 1 / 10 for t in (3.0, 5.0, 6.0, 9.0, 10.0, 12.0, 17.0, 18.0, 20.0, 24.0)}
# L = 3 then k = 2 (by hand): 3 of 5 rows uniformly (10 subsets), then 2 of a's kept rows when it keeps three:
# {1,2,4} (1 subset) -> 3, 5, 6 each 1/30; two of a and one of b (6 subsets) -> 11, 13, 14, 19, 21, 22 each
# 1/10; one of a and both of b (3 subsets) -> 25, 26, 28 each 1/10
L3K2_TOTALS = {3.0: 1 / 30, 5.0: 1 / 30, 6.0: 1 / 30, 11.0: 0.1, 13.0: 0.1, 14.0: 0.1, 19.0: 0.1, 21.0: 0.1,
               22.0: 0.1, 25.0: 0.1, 26.0: 0.1, 28.0: 0.1}


def _totals(runs: list[list[dict[str, Any]]], support: dict[float, float]) -> list[int]:
    seen: Counter[Any] = Counter()
    for r in runs:
        total = sum(float(row["__a0"]) for row in r)
        seen[total if total in support else "outside"] += 1
    return [seen[t] for t in support] + [seen["outside"]]


@pytest.mark.parametrize("caps,support,forms", [
    (Caps(2, 2, 2), L2_TOTALS, ("ARG_MAX_NULL(__a0_v, __rnd__unit_rows)", "ARG_MAX_NULL(__a0_v, __rnd__rows)")),
    (Caps(2, 2, 3), L3K2_TOTALS, ("ORDER BY __rnd__unit_rows", "ARG_MAX_NULL(__a0_v, __rnd__rows)")),
], ids=["L2-then-k2", "L3-then-k2"])
def test_l_then_k_of_two_keeps_a_uniform_subset(caps: Caps, support: dict[float, float], forms: tuple[str, ...]) -> None:
    plan = plan_for("SELECT g, SUM(x) FROM t GROUP BY g", spec_for("t", TWO_GROUPS, bounds={"x": (0, 20)}))
    sql = _sql(plan, caps)
    assert all(f in sql for f in forms), sql
    n = 3000
    counts = _totals(_trials(sql, TWO_GROUPS, n, seed=0.37), support)
    assert counts[-1] == 0, counts
    assert _uniform(counts[:-1], n, list(support.values())), counts
    # negative control: the two smallest rows every time (a choice by value) is refused
    assert not _uniform([n] + [0] * (len(support) - 1), n, list(support.values()))
    # negative control: the L draw evaluated per aggregate keeps rows twice or mixes them: outside the support
    if "ARG_MAX_NULL(__a0_v, __rnd__unit_rows)" in sql:
        bad = _totals(_trials(_draw_per_aggregate(sql, "__rnd__unit_rows"), TWO_GROUPS, 400, seed=0.37), support)
        assert bad[-1] > 0, bad


def test_scalar_l_of_two_counts_two_rows_per_unit() -> None:
    # no GROUP BY, COUNT(*) only: the two-row form with no column to carry (one literal copy per kept row)
    t = pa.table({"user_id": pa.array([1, 2, 2, 3, 3, 3, 4, 4, 4, 4], type=pa.int64()), "x": [1.0] * 10})
    plan = plan_for("SELECT COUNT(*) FROM t", spec_for("t", t))
    sql = _sql(plan, Caps(1, math.inf, 2))
    assert "__copy" in sql and "ROW_NUMBER" not in sql
    con = duckdb.connect()
    try:
        con.register(source_name("t"), t)
        assert con.sql(sql).fetchall() == [(4, 1 + 2 + 2 + 2)]
        # control: the same data under L = 3 keeps 1 + 2 + 3 + 3 rows
        assert con.sql(_sql(plan, Caps(1, math.inf, 3))).fetchall() == [(4, 1 + 2 + 3 + 3)]
    finally:
        con.close()


# -- 3. nothing downstream reads a dropped column: the same bounded values as the window ----------------------

# every (unit, group) and unit has at most two rows, so a cap of two and a cap of three keep every row
WHOLE = pa.table({
    "user_id": pa.array([1, 1, 2, 2, 3, 4, 4, 5, 5], type=pa.int64()),
    "g": pa.array(["a", "b", "a", "a", "b", "A", "a", None, None]),
    "d": pa.array([1.5, -0.0, 0.0, float("nan"), 2.0, None, 3.25, 1.0, None]),
    "s": pa.array(["Z", "z", "z", None, "Z", "zz", "z", "q", "q"]),
    "n": pa.array([10, 20, None, 40, 50, 60, 70, 80, 90], type=pa.int64()),
})
SHAPES = [
    "SELECT g, COUNT(*), COUNT(s), COUNT(DISTINCT s), SUM(d), AVG(d), VARIANCE(d), STDDEV(n) FROM t GROUP BY g",
    "SELECT LOWER(g) AS lg, COUNT(DISTINCT s), SUM(n) FROM t WHERE n > 15 OR s = 'Z' GROUP BY LOWER(g)",
    "SELECT COUNT(*), COUNT(DISTINCT s), SUM(d), AVG(n), VAR_POP(d) FROM t",
    "SELECT COUNT(*) FROM t WHERE d >= 0",
    "SELECT g, s, COUNT(*), SUM(n) FROM t GROUP BY g, s",
]


@pytest.mark.parametrize("sql", SHAPES, ids=range(len(SHAPES)))
@pytest.mark.parametrize("two,three", [(Caps(2, 2), Caps(2, 3)), (Caps(2, math.inf, 2), Caps(2, math.inf, 3)),
                                       (Caps(2, 2, 2), Caps(2, 3, 3))], ids=["k", "L", "L-then-k"])
@pytest.mark.parametrize("domain", [False, True], ids=["nodom", "dom"])
def test_two_row_form_gives_the_windows_values_when_every_row_is_kept(sql: str, two: Caps, three: Caps,
                                                                      domain: bool) -> None:
    bounds = {"d": (-1.0, 3.0), "n": (0.0, 100.0)}
    domains = {"g": ("a", "b", "A")} if domain else None
    plan = plan_for(sql, spec_for("t", WHOLE, bounds=bounds, domains=domains))
    a, b = _sql(plan, two, tau=1), _sql(plan, three, tau=1)
    assert ("AS __two" in a) == ("__rnd" in a) and "AS __two" not in b and "ORDER BY __rnd" not in a
    assert "AS __two" in a or (two.max_rows_per_unit == math.inf and "COUNT(*) FROM" in sql)  # k alone: counts only
    con = duckdb.connect()
    try:
        con.sql("SET threads = 2")
        con.register(source_name("t"), WHOLE)
        got, want = (sorted(con.sql(q).fetchall(), key=repr) for q in (a, b))
    finally:
        con.close()
    assert len(got) == len(want) and got, (got, want)
    for x, y in zip(got, want):
        assert all(u == v or (isinstance(u, float) and math.isclose(u, v, rel_tol=1e-12, abs_tol=1e-12))
                   for u, v in zip(x, y)), (x, y)


def test_nocase_connection_and_columns_count_spellings_apart_in_both_forms() -> None:
    # a connection whose default collation and columns are NOCASE: the two-row form reads the binary-collated
    # values the window read, so 'Z' and 'z' stay two values and 'a' and 'A' two groups (k = 2: every row kept)
    t = pa.table({"user_id": pa.array([1, 1, 2, 2], type=pa.int64()), "g": ["a", "A", "a", "a"], "s": ["Z", "z", "q", "Q"]})
    con = duckdb.connect()
    try:
        con.sql("SET default_collation = 'nocase'")
        con.sql(f"CREATE TABLE {source_name('t')} (user_id BIGINT, g VARCHAR COLLATE NOCASE, s VARCHAR COLLATE NOCASE)")
        con.register("__arrow", t)
        con.sql(f"INSERT INTO {source_name('t')} SELECT * FROM __arrow")
        spec = spec_for("t", t)
        want = {"SELECT g, COUNT(DISTINCT s), COUNT(s) FROM t GROUP BY g": [("A", 1, 1, 1), ("a", 2, 3, 3)],
                "SELECT COUNT(DISTINCT s) FROM t": [(2, 4)]}
        for q, rows in want.items():
            for caps in (Caps(2, 2), Caps(2, 2, 2), Caps(2, 3, 3)):
                sql = _sql(plan_for(q, spec), caps)
                assert ("AS __two" in sql) == (caps.max_rows_per_unit == 2 or caps.max_rows_per_group == 2)
                assert sorted(con.sql(sql).fetchall()) == rows, (q, caps)
    finally:
        con.close()


# -- 4. reproducible backends never draw ----------------------------------------------------------------------

@pytest.mark.parametrize("ops", [SaltedDuckDBOps(), PortableDuckDBOps(), SparkOps()], ids=lambda o: type(o).__name__)
def test_reproducible_backends_keep_the_salted_choice(ops: Any) -> None:
    plan = plan_for("SELECT g, COUNT(DISTINCT s), SUM(d) FROM t GROUP BY g",
                    spec_for("t", WHOLE, bounds={"d": (-1.0, 3.0)}))
    for caps in (Caps(2, 2), Caps(2, 2, 2), Caps(2, math.inf, 2)):
        ast = bounded_query(plan, caps, salt="s", unit_column="user_id", ops=ops)
        text = ast.sql(dialect="spark" if isinstance(ops, SparkOps) else "duckdb").upper()
        assert "ARG_MAX_NULL" not in text and "__RND" not in text and "RAND" not in text.replace("RANDOM_", ""), text
        assert "__IDX" in text  # the salted numbering
    # control: the drawn DuckDB form does take the two-row aggregate
    assert "ARG_MAX_NULL" in _sql(plan, Caps(2, 2), ops=DuckDBOps())


# -- 5. FINDING: memory -------------------------------------------------------------------------------------
# ARG_MIN_NULL / ARG_MAX_NULL states in DuckDB's hash aggregate need about 15MB of memory per carried column
# whatever the number of groups once it is large (measured: 2 columns fail at 36MB, 3 at 40MB, 6 at 60MB,
# 12 at 100MB, 24 at 200MB, all completing as the window); MIN, MAX, SUM or FIRST states of the same width
# spill. So under an owner's small memory_limit the query fails where the window completes, and one person
# with many rows in distinct groups (many partitions) decides whether it fails.

def _completes(k: int, columns: int, attacker_rows: int) -> bool:
    """SUM of ``columns`` value columns by g: 10000 users of 4 rows in 2 groups, plus one user with
    ``attacker_rows`` rows each in its own group; k = ``k``, through dpsql's DuckDB engine with
    memory_limit 60MB, one thread: whether the bounded query completes."""
    from dpsql.engine import EngineSettings
    from dpsql.engine.duckdb import DuckDBBackend
    from dpsql.errors import ExecutionError

    users = np.concatenate([np.arange(40_000) // 4, np.full(attacker_rows, 10**9)])
    groups = np.concatenate([np.array(["a", "b"] * 20_000), np.array([f"x{j}" for j in range(attacker_rows)], dtype=str)])
    cols: dict[str, Any] = {"user_id": users, "g": pa.array(groups.astype(str))}
    cols.update({f"x{c}": (np.arange(len(users)) * 7 + c).astype(np.float64) for c in range(columns)})
    t = pa.table(cols)
    plan = plan_for("SELECT g, " + ", ".join(f"SUM(x{c})" for c in range(columns)) + " FROM t GROUP BY g",
                    spec_for("t", t, bounds={f"x{c}": (0.0, 1e9) for c in range(columns)}))
    with tempfile.TemporaryDirectory() as tmp:
        b = DuckDBBackend(None, EngineSettings(memory_limit="60MB", threads=1, temp_directory=tmp,
                                               max_text_bytes=4096))
        try:
            b.ops = DuckDBOps()
            b.register_source("t", "arrow", t)
            ast = bounded_query(plan, Caps(1, k), salt="s", unit_column="user_id", ops=b.ops, tau=5)
            assert ("ARG_MAX_NULL" in render(ast)) == (k == 2 and columns <= bound.TWO_ROW_MAX_COLUMNS)
            try:
                out = b.fetch_arrow(ast).to_pylist()
            except ExecutionError:
                return False
            assert sorted(r["__k0"] for r in out) == ["a", "b"]
            return True
        finally:
            b.close()


def test_the_window_completes_under_60mb_with_or_without_the_person() -> None:
    # the controls for the finding below: the window (k = 3) completes with the person's 300000 groups, and the
    # two-row form completes with them for one and two value columns
    assert _completes(3, 4, 300_000)
    assert _completes(2, 1, 300_000)
    assert _completes(2, 2, 300_000)


def test_one_persons_rows_do_not_decide_whether_two_rows_fail_under_memory_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    # four value columns take the window (TWO_ROW_MAX_COLUMNS = 2): it completes with the person's rows
    assert _completes(2, 4, 0) and _completes(2, 4, 300_000)
    # negative control: the two-row form forced at four columns fails for memory once the person is there
    monkeypatch.setattr(bound, "TWO_ROW_MAX_COLUMNS", 64)
    assert _completes(2, 4, 0) and not _completes(2, 4, 300_000)
