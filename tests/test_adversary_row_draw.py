"""Attacks on the k = 1 row choice (one row per (unit, group) among several).

On an engine that owns its DuckDB connection the choice is ``ARG_MIN(values, RANDOM())``: a fresh
per-row draw of the connection's generator. These tests check what that choice must give for the
sensitivity argument: each row kept with probability one over its group's rows (NULL values
included), several value columns taken from one and the same row, one evaluation of the draw per
query (every released column of a unit from its one kept row), and randomness that nothing but OS
entropy fixes -- in particular not the state of a connection the caller hands to the Session.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import binomtest
from test_bounding import bounded_sql, doubles_sql, plan_for, spec_for

import dpsql
from dpsql.catalog import ColumnSpec, TableSpec
from dpsql.engine.base import source_name
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.plan.analyze import analyze
from dpsql.rewrite.bound import SALT_PLACEHOLDER, Caps, bounded_query
from dpsql.rewrite.render import render
from dpsql.testing import use_noise, zero_noise

ALPHA = 1e-6  # family-wise failure probability of each statistical test


def _session(table: pa.Table, connection: duckdb.DuckDBPyConnection | None = None, **columns: Any) -> dpsql.Session:
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10, 1e-3), connection=connection)
    s.register("t", table, privacy_unit="user_id", max_groups_per_unit=1, max_rows_per_group=1,
               columns={c: {"bounds": list(b)} for c, b in columns.items()})
    return s


def _varies(outcomes: list[Any]) -> bool:
    return len({repr(o) for o in outcomes}) > 1


# -- randomness the caller's connection cannot fix --------------------------------------------------------------


def test_seeded_caller_connection_does_not_fix_the_row_choice() -> None:
    # The owner hands the Session its own DuckDB connection, on which it called setseed (for
    # reproducible sampling of its own). RANDOM() on that connection is then a fixed sequence:
    # each row's draw is fixed by its scan position, so which row a unit keeps is a function of
    # how many rows (of other people) come before it -- removing one person changes every later
    # person's kept row, beyond the declared caps. The choice must stay fresh per query.
    # One unit, one group, two rows (x = 0 and x = 1): 40 queries, each after setseed(0.5), must
    # not all keep the same row (P = 2 * 2^-40 < 1e-11 for a fresh uniform choice).
    t = pa.table({"user_id": pa.array([7, 7], type=pa.int64()), "g": ["a", "a"], "x": [0.0, 1.0]})
    con = duckdb.connect()
    with _session(t, con, x=(0, 1)) as s:
        sql = s.explain("SELECT g, SUM(x) FROM t GROUP BY g", epsilon=1, delta=1e-6).bounded_sql
        assert SALT_PLACEHOLDER in sql
        kept = []
        for _ in range(40):
            con.execute("SELECT setseed(0.5)").fetchall()
            kept.append(con.execute(sql.replace(SALT_PLACEHOLDER, secrets.token_hex(16))).fetchall())
    assert all(len(k) == 1 and k[0][1] == 1 for k in kept)
    assert _varies([k[0][2] for k in kept]), kept[0]
    # negative control: a choice fixed by the connection's seed does not vary
    assert not _varies([1.0] * 40)


# -- the per-row draw: uniform per row, NULLs included, every column from one row ------------------------------

N_TRIALS = 600


def _plan(sql: str, table: pa.Table, bounds: dict[str, tuple[float, float]]) -> Any:
    con = duckdb.connect()
    con.register("t", table)
    schema = {str(r[0]).lower(): str(r[1]) for r in con.execute("DESCRIBE SELECT * FROM t").fetchall()}
    con.close()
    spec = TableSpec(name="t", source="<arrow>", source_kind="arrow", privacy_unit="user_id",
                     columns={c: ColumnSpec(c, bounds=b) for c, b in bounds.items()}, schema=schema)
    return analyze(sql, {"t": spec})


def _bounded(plan: Any, caps: Caps, salt: str, ops: Any) -> str:
    return doubles_sql(plan, caps, render(bounded_query(plan, caps, salt=salt, unit_column="user_id", ops=ops)))


def _trials(plan: Any, table: pa.Table, n: int, ops: Any) -> list[tuple[Any, ...]]:
    """The released columns of the single group's bounded row, for ``n`` runs (each with its own
    salt and its own per-row draws: one UNION ALL branch per run)."""
    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.register(source_name("t"), table)
    base = _bounded(plan, Caps(1, 1), "@@SALT@@", ops)
    cols = [f"__a{i}" for i in range(len(plan.aggregates))]
    out: list[tuple[Any, ...]] = []
    for start in range(0, n, 10):  # DuckDB plans a UNION ALL of 10 branches 3x faster per branch than one of 150
        parts = [f"SELECT {', '.join(cols)} FROM ({base.replace('@@SALT@@', f'trial-{i}')})"
                 for i in range(start, min(n, start + 10))]
        out += [tuple(r) for r in con.execute(" UNION ALL ".join(parts)).fetchall()]
    con.close()
    assert len(out) == n
    return out


def _is_row_distribution(outcomes: list[tuple[Any, ...]], expected: dict[tuple[Any, ...], float]) -> bool:
    """Every outcome one of the expected rows (no mixing of two rows), each at its rate (exact
    two-sided binomial tests, Bonferroni over the rows)."""
    n = len(outcomes)
    seen = Counter(outcomes)
    if set(seen) - set(expected):
        return False
    return all(binomtest(seen[o], n, p).pvalue >= ALPHA / len(expected) for o, p in expected.items())


# one unit, one group, four rows; SUM(x) and COUNT(x) read one raw column (ARG_MIN_NULL of it), SUM(y) a
# second one (ARG_MIN of a struct of both). Kept row -> (SUM(x), COUNT(x)[, SUM(y)]), each row with
# probability 1/4: (NULL, 1) -> (0, 0, 1); (1, NULL) twice -> (1, 1, 0) at 1/2; (2, 2) -> (2, 1, 2).
ROWS = pa.table({"user_id": pa.array([4] * 4, type=pa.int64()), "g": ["a"] * 4,
                 "x": [None, 1.0, 2.0, 1.0], "y": [1.0, None, 2.0, None]})
CASES = {
    "one-column": ("SELECT g, SUM(x), COUNT(x) FROM t GROUP BY g",
                   {("a", 0.0, 0): 0.25, ("a", 1.0, 1): 0.5, ("a", 2.0, 1): 0.25}),
    "two-columns": ("SELECT g, SUM(x), COUNT(x), SUM(y) FROM t GROUP BY g",
                    {("a", 0.0, 0, 1.0): 0.25, ("a", 1.0, 1, 0.0): 0.5, ("a", 2.0, 1, 2.0): 0.25}),
    "ungrouped": ("SELECT SUM(x), COUNT(x), SUM(y) FROM t",
                  {(0.0, 0, 1.0): 0.25, (1.0, 1, 0.0): 0.5, (2.0, 1, 2.0): 0.25}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_row_draw_keeps_each_row_with_null_values_at_one_over_rows(case: str) -> None:
    sql, expected = CASES[case]
    plan = _plan(sql, ROWS, {"x": (0.0, 10.0), "y": (0.0, 10.0)})
    assert _bounded(plan, Caps(1, 1), "s", DuckDBOps()).count("RANDOM()") == 1
    keys = 1 if plan.keys else 0
    got = [(*(("a",) if keys else ()), *o) for o in _trials(plan, ROWS, N_TRIALS, DuckDBOps())]
    assert _is_row_distribution(got, expected), Counter(got)
    # negative controls: one kept row per distinct value combination, unweighted (1/3 each) ...
    thirds = [o for o in expected for _ in range(N_TRIALS // 3)]
    assert not _is_row_distribution(thirds, expected)
    # ... and, at the right rates, one unit's columns taken from two different rows
    swapped = [(*o[:-1], 9.0) if i % 50 == 0 else o for i, o in enumerate(got)]
    assert not _is_row_distribution(swapped, expected)


# -- one evaluation of the draw per query --------------------------------------------------------------------


class _NoWindowOps(DuckDBOps):
    """DuckDB with the group cap spelled as on backends without ``group_cap_window``: the
    (unit, group) relation -- holding the draw -- in a CTE read three times, not materialised."""

    group_cap_window = False
    materialize_shared = False


def _two_rows_per_group(n_units: int) -> pa.Table:
    # every unit in two groups, each with one row x = 1 and one row x = NULL
    u, g, x = [], [], []
    for i in range(n_units):
        for k in (i % 10, (i + 3) % 10):
            for v in (1.0, None):
                u.append(i)
                g.append(f"g{k}")
                x.append(v)
    return pa.table({"user_id": pa.array(u, type=pa.int64()), "g": g, "x": x, "y": x})


def _one_row_per_unit(rows: list[dict[str, Any]]) -> bool:
    """Per group, every column as if each unit gave one and the same row: SUM(x) = COUNT(x) =
    AVG's and VARIANCE's counts = SUM(y) (y = x on every row); centred sums (x - 0.5) = COUNT(x) / 2;
    squares = COUNT(x) / 4."""
    for r in rows:
        c = float(r["__a2"])
        if not (float(r["__a1"]) == c == float(r["__a3_cnt"]) == float(r["__a4_cnt"]) == r["__a5"]
                and r["__a3_sum"] == r["__a4_sum"] == c / 2 and r["__a4_sq"] == c / 4
                and float(r["__a0"]) == r["__users"] >= c):
            return False
    return True


SHAPES = "SELECT g, COUNT(*), SUM(x), COUNT(x), AVG(x), VARIANCE(x), SUM(y) FROM t GROUP BY g"


@pytest.mark.parametrize("ops", [DuckDBOps(), _NoWindowOps()], ids=["window", "no-window"])
def test_every_column_of_a_unit_comes_from_one_evaluation_of_the_draw(ops: Any) -> None:
    # A relation holding RANDOM() evaluated twice (a CTE inlined at each reference, a self-join)
    # could give one unit two different rows in one release: SUM(x) from its x = 1 row and
    # COUNT(x) from its NULL row. Each of 6000 units has one x = 1 and one x = NULL row per group
    # (y = x: two raw columns, chosen as one struct).
    t = _two_rows_per_group(6000)
    plan = _plan(SHAPES, t, {"x": (0.0, 1.0), "y": (0.0, 1.0)})
    sql = _bounded(plan, Caps(1, 1), "salt", ops)
    assert sql.count("RANDOM()") == 1 and "STRUCT_EXTRACT" in sql
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.register(source_name("t"), t)
    for _ in range(3):
        rows = con.sql(sql).to_arrow_table().to_pylist()
        assert len(rows) == 10 and sum(r["__users"] for r in rows) == 6000
        assert _one_row_per_unit(rows), rows
    # negative control: the same relation read twice (SUM(x) from one evaluation, COUNT(x) from
    # another): the counts of ~600 units per group, each 0 or 1 at random, differ in some group
    # (each agrees with probability about 0.03; all ten below 1e-14)
    twice = (f"SELECT a.* REPLACE (b.__a2 AS __a2) FROM ({sql}) AS a JOIN ({sql}) AS b ON a.__k0 = b.__k0")
    rows = con.sql(twice).to_arrow_table().to_pylist()
    assert len(rows) == 10 and not _one_row_per_unit(rows)
    con.close()


# -- reproducible test sessions with several rows per group ---------------------------------------------------


def _zero_noise_sums(seed: int, *, per_row_draw: bool = False) -> dict[str, float]:
    # 20000 units in 10 groups, each with two rows x = 0 and x = 1: the bounded SUM(x) of a group
    # is the number of its units that kept their x = 1 row
    n = 20000
    t = pa.table({"user_id": pa.array([i for i in range(n) for _ in (0, 1)], type=pa.int64()),
                  "g": [f"g{i % 10}" for i in range(n) for _ in (0, 1)], "x": [0.0, 1.0] * n})
    with _session(t, x=(0, 1)) as s:
        use_noise(s, zero_noise(seed))
        if per_row_draw:
            s._engine.ops = DuckDBOps()  # type: ignore[attr-defined]
        sql = "SELECT g, SUM(x) AS s FROM t GROUP BY g"
        assert ("RANDOM()" in s.explain(sql, epsilon=1, delta=1e-6).bounded_sql) == per_row_draw
        return {r["g"]: r["s"] for r in s.query(sql, epsilon=1, delta=1e-6).table.to_pylist()}


def test_seeded_sessions_reproduce_releases_with_several_rows_per_group() -> None:
    # sessions given reproducible noise make every choice from the salt sequence, so one seed
    # gives one release even where each (unit, group) has several rows to choose from
    a, b = _zero_noise_sums(3), _zero_noise_sums(3)
    assert len(a) == 10 and a == b
    assert all(0 < v < 2000 for v in a.values())  # a choice was made: neither all 0 nor all 1 rows
    # negative control: the per-row draw under the same seed does not reproduce (each group's sum
    # of ~2000 fair coins agrees between two runs with probability below 0.02: all ten below 1e-16)
    c, d = _zero_noise_sums(3, per_row_draw=True), _zero_noise_sums(3, per_row_draw=True)
    assert len(c) == len(d) == 10 and c != d


# -- one read of the rows, whatever one person's groups ----------------------------------------------------------


def _rows_read(con: duckdb.DuckDBPyConnection, sql: str, tmp_path: Any) -> int:
    """The rows every scan of ``sql``'s physical plan produced (DuckDB's JSON profile)."""
    out = tmp_path / f"profile_{secrets.token_hex(4)}.json"
    con.execute("SET enable_profiling = 'json'")
    con.execute(f"SET profiling_output = '{out}'")
    try:
        con.execute(sql).fetchall()
    finally:
        con.execute("SET enable_profiling = 'no_output'")
    total = 0
    stack = list(json.loads(out.read_text())["operator"])
    while stack:
        node = stack.pop()
        if "SCAN" in node.get("type", ""):
            total += int(node.get("intermediate_rows", 0))
        stack.extend(node.get("children", []))
    return total


_COUNTRIES = tuple(f"C{i}" for i in range(10))


@pytest.mark.parametrize("sql", [
    "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events GROUP BY country",
    "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
    "SELECT url, SUM(likes) AS s FROM events GROUP BY url",
])
def test_one_persons_second_group_does_not_switch_on_a_second_read(sql: str, tmp_path: Any) -> None:
    # Where every person has one group, a plan could answer most people from one aggregate per
    # person and read the rows again only for people with several groups, behind a join that DuckDB
    # skips when no such person exists. Then one person's second group would switch a second read of
    # every row on: a query slower by a whole scan because of one person (docs/threat_model.md,
    # timing). The bounded SQL reads the same rows whatever the groups: with that person's two rows
    # added it reads its two rows once per read of the rows. Control: a plan with such a gated second read reads
    # about twice the rows once the person is there.
    n_users, per_user = 2000, 5
    base = {"user_id": np.repeat(np.arange(n_users), per_user),
            "country": [f"C{u % 10}" for u in range(n_users) for _ in range(per_user)],
            "url": [f"u{u % 37}" for u in range(n_users) for _ in range(per_user)],
            "likes": np.arange(n_users * per_user) % 7}
    one = pa.table(base)
    # one more person, with one row in each of two groups
    two = pa.concat_tables([one, pa.table({"user_id": [n_users] * 2, "country": ["C1", "C2"], "url": ["u1", "u2"],
                                           "likes": [3, 4]}).cast(one.schema)])
    spec = spec_for("events", one, bounds={"likes": (0, 10)}, domains={"country": _COUNTRIES})
    plan = plan_for(sql, spec)
    text = bounded_sql(plan, Caps(5, 1), secrets.token_hex(8), ops=DuckDBOps())
    gated = ("SELECT country, COUNT(*) FROM (SELECT * FROM events SEMI JOIN (SELECT user_id FROM events GROUP BY "
             "user_id HAVING COUNT(DISTINCT country) > 1) AS m USING (user_id)) GROUP BY country")
    read: dict[str, list[int]] = {"bounded": [], "gated": []}
    for data in (one, two):
        con = duckdb.connect()
        try:
            con.register(source_name("events"), data)
            read["bounded"].append(_rows_read(con, text, tmp_path))
            con.register("events", data)
            read["gated"].append(_rows_read(con, gated, tmp_path))
        finally:
            con.close()
    # (each read of the rows whatever the groups: the bounding's, and for the text key url the one giving long keys
    # their texts)
    assert read["bounded"][1] - read["bounded"][0] == 2 * (2 if "url" in sql else 1), read
    assert read["bounded"][0] >= n_users * per_user, read
    assert read["gated"][1] - read["gated"][0] >= n_users * per_user // 2, read
