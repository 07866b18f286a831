"""A 2-D range workload's conditions shared by every query restrict each of its two columns' bins as a 1-D
workload's do (``dawa_bins``): DAWA runs over the grid of the kept rows and columns only, a shared condition
that keeps no bin is refused before the charge, and the answers at zero noise are DuckDB's counts."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import QueryError
from dpsql.plan import workload
from dpsql.plan.analyze import analyze
from dpsql.testing import use_noise, zero_noise


def grid_table() -> pa.Table:
    """One person in every (age, score bin) cell: ages 0..120, scores at the middle of 20 bins 0.5 wide."""
    ages, scores = np.meshgrid(np.arange(121), np.arange(20) * 0.5 + 0.25, indexing="ij")
    return pa.table({"pid": np.arange(ages.size, dtype=np.int64), "age": ages.ravel().astype(np.int64),
                     "score": scores.ravel()})


def grid_session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1000.0))
    use_noise(s, zero_noise())
    s.register("g", grid_table(), privacy_unit="pid", max_rows_per_unit=1,
               columns={"age": {"bounds": (0, 120), "bins": 121}, "score": {"bounds": (0, 10), "bins": 20}})
    return s


RANGES = ["age BETWEEN 30 AND 39 AND score >= 2 AND score < 5", "age >= 0 AND score >= 0",
          "age BETWEEN 33 AND 37 AND score < 10", "age < 60 AND score >= 4.5 AND score < 6.5"]


def _queries(shared: str) -> list[str]:
    return [f"SELECT COUNT(*) FROM g WHERE {shared} AND {r}" for r in RANGES]


def _truth(queries: list[str]) -> list[int]:
    con = duckdb.connect()
    con.register("g", grid_table())
    return [int(con.execute(q).fetchall()[0][0]) for q in queries]


@pytest.mark.parametrize("shared, axes", [
    ("age <> 35", (((0, 34), (36, 120)), None)),
    ("age NOT IN (35, 36) AND NOT (score >= 5 AND score < 6)", (((0, 34), (37, 120)), ((0, 9), (12, 19)))),
    ("(age IN (3, 34, 36) OR age > 100) AND score <> 2.3", (((3, 3), (34, 34), (36, 36), (101, 120)), None)),
])
def test_shared_conditions_restrict_each_axis(monkeypatch, shared, axes):
    queries = _queries(shared)
    s = grid_session()
    wl = workload.analyze_workload(queries, s.tables)
    assert wl.axes == axes and wl.span is None
    r = s.query_many(queries, epsilon=1.0)
    truth = _truth(queries)
    assert list(r.counts) == truth
    assert r.details["dawa_bins"] == {"age": None if axes[0] is None else [list(x) for x in axes[0]],
                                      "score": None if axes[1] is None else [list(x) for x in axes[1]]}
    # negative control: over the whole grid the excluded zeros are averaged with kept cells
    monkeypatch.setattr(workload, "_where_span", lambda *a, **k: None)
    assert list(grid_session().query_many(queries, epsilon=1.0).counts) != truth


@pytest.mark.parametrize("shared", ["age IN (200, 300)", "score > 20", "age > 1e308 * 10", "age < 0 AND score >= 0"])
def test_a_2d_shared_condition_that_keeps_no_bin_is_refused_for_free(shared):
    s = grid_session()
    with pytest.raises(QueryError, match="admits a value of the declared domain|admits no value|is not a finite number"):
        s.query_many(_queries(shared), epsilon=1.0)
    assert s.remaining() == dpsql.Budget(1000.0) and s.history().num_rows == 0
    assert _truth(_queries(shared)) == [0] * len(RANGES)


def test_a_condition_mixing_both_columns_restricts_no_axis():
    """``age < 10 OR score > 5`` holds in every row and every column of the grid: no axis is restricted (the
    answer stays DuckDB's)."""
    queries = _queries("(age < 10 OR score > 5)")
    s = grid_session()
    assert workload.analyze_workload(queries, s.tables).axes is None
    r = s.query_many(queries, epsilon=1000.0)
    assert all(abs(a - b) <= 2 for a, b in zip(r.counts, _truth(queries)))


@pytest.mark.parametrize("shared", ["age < 10 AND score > 5 AND (age > 20 OR score < 3)",
                                    "(age < 10 OR score > 5) AND age > 20 AND score < 3",
                                    "NOT (age >= 0 OR score >= 0)", "(age < 10 AND score < 1) AND NOT (age < 50)"])
def test_a_2d_shared_condition_mixing_both_columns_that_keeps_no_cell_is_refused(shared):
    """Each column alone keeps some bins, but no cell of the grid can pass both: refused before the charge."""
    s = grid_session()
    with pytest.raises(QueryError, match="admits a value of the declared domain"):
        s.query_many(_queries(shared), epsilon=1.0)
    assert s.remaining() == dpsql.Budget(1000.0)
    assert _truth(_queries(shared)) == [0] * len(RANGES)


def test_a_2d_rectangle_outside_the_kept_cells_counts_as_empty():
    """``age < 10 OR score > 5`` keeps an L of cells: a workload of rectangles outside it only is refused; with one
    rectangle meeting it (negative control), the workload is answered."""
    s = grid_session()
    shared = "(age < 10 OR score > 5)"
    queries = _queries(shared)[:1] + [f"SELECT COUNT(*) FROM g WHERE {shared} AND age >= 0 AND score >= 0"]
    assert _truth(queries[:1]) == [0]
    with pytest.raises(QueryError, match="admits a value of the declared domain"):
        s.query_many(queries[:1], epsilon=1.0)
    assert s.remaining() == dpsql.Budget(1000.0)
    s.query_many(queries, epsilon=1.0)
    assert s.remaining() == dpsql.Budget(999.0)


@pytest.mark.parametrize("shared", ["age < 10 AND (score > 5 OR age <> age) AND score < 3",
                                    "age < 10 AND score > 5 AND (age > 20 OR score < 3 OR FALSE)",
                                    "(age < 10 OR NULL) AND score > 5 AND (age > 20 OR score < 3)"])
def test_a_constant_or_self_comparison_inside_a_mixed_condition_is_read_per_cell(shared):
    """FALSE, NULL and ``age <> age`` hold in no cell: the mixed condition keeps no cell, refused before the charge."""
    s = grid_session()
    assert _truth(_queries(shared)) == [0] * len(RANGES)
    with pytest.raises(QueryError, match="admits a value of the declared domain"):
        s.query_many(_queries(shared), epsilon=1.0)
    assert s.remaining() == dpsql.Budget(1000.0)


def _wide_session() -> dpsql.Session:
    t = pa.table({"pid": np.arange(4, dtype=np.int64), "a": np.array([1, 3, 2, 0], dtype=np.int64),
                  "b": np.array([1, 0, 3, 2], dtype=np.int64)})
    s = dpsql.Session(budget=dpsql.Budget(1000.0))
    use_noise(s, zero_noise())
    s.register("w", t, privacy_unit="pid", max_rows_per_unit=1,
               columns={"a": {"bounds": (0, 1023), "bins": 1024}, "b": {"bounds": (0, 1023), "bins": 1024}})
    return s


def test_the_kept_cells_are_read_exactly_over_many_segments():
    """(a even OR b even) AND a odd AND b odd keeps no cell; each column alone keeps its odd values, 600 runs of the
    1 024 x 1 024 grid: over 360 000 pairs of segments (the check gave up beyond 65 536 and charged). The check is
    exact at any size a 2-D workload may have, and quick."""
    import time

    evens, odds = (", ".join(str(v) for v in range(r, 600, 2)) for r in (0, 1))
    shared = f"(a IN ({evens}) OR b IN ({evens})) AND a IN ({odds}) AND b IN ({odds})"
    queries = [f"SELECT COUNT(*) FROM w WHERE {shared} AND a >= 0 AND b >= 0",
               f"SELECT COUNT(*) FROM w WHERE {shared} AND a BETWEEN 10 AND 500 AND b < 300"]
    con = duckdb.connect()
    con.register("w", pa.table({"a": np.arange(1024).repeat(1024), "b": np.tile(np.arange(1024), 1024)}))
    assert [con.execute(q).fetchall()[0][0] for q in queries] == [0, 0]
    s = _wide_session()
    start = time.perf_counter()
    with pytest.raises(QueryError, match="admits a value of the declared domain"):
        s.query_many(queries, epsilon=1.0)
    assert time.perf_counter() - start < 20.0
    assert s.remaining() == dpsql.Budget(1000.0)
    # negative control: b = 0 added keeps the cells (a odd, b = 0): a rectangle meeting them only is answered
    kept = shared.replace(f"AND b IN ({odds})", f"AND b IN (0, {odds})")
    with pytest.raises(QueryError, match="admits a value of the declared domain"):
        s.query_many([f"SELECT COUNT(*) FROM w WHERE {kept} AND a >= 0 AND b >= 1"], epsilon=1.0)
    assert s.remaining() == dpsql.Budget(1000.0)
    s.query_many([f"SELECT COUNT(*) FROM w WHERE {kept} AND a >= 0 AND b < 1"], epsilon=1.0)
    assert s.remaining() == dpsql.Budget(999.0)


def test_the_kept_cells_are_those_where_duckdb_finds_a_row():
    """On a grid of one value per bin and one row per cell, a rectangle meets a kept cell exactly when DuckDB counts
    a row in it, for random conditions mixing both columns (either column may have more segments)."""
    import random

    rng = random.Random(20261205)
    n0, n1 = 24, 40
    s = dpsql.Session(budget=dpsql.Budget(1.0))
    a, b = np.meshgrid(np.arange(n0), np.arange(n1), indexing="ij")
    s.register("c", pa.table({"pid": np.arange(a.size, dtype=np.int64), "a": a.ravel(), "b": b.ravel()}),
               privacy_unit="pid", max_rows_per_unit=1,
               columns={"a": {"bounds": (0, n0 - 1), "bins": n0}, "b": {"bounds": (0, n1 - 1), "bins": n1}})
    con = duckdb.connect()
    con.register("c", pa.table({"a": a.ravel(), "b": b.ravel()}))

    def cond(depth: int) -> str:
        r = rng.random()
        if depth == 0 or r < 0.3:
            col, n = rng.choice([("a", n0), ("b", n1)])
            op = rng.choice(["<", "<=", ">", ">=", "=", "<>"])
            return rng.choice([f"{col} {op} {rng.randrange(-2, n + 2)}",
                               f"{col} IN ({', '.join(str(rng.randrange(n)) for _ in range(rng.randrange(1, 6)))})",
                               f"{col} {op} {col}", "FALSE", "TRUE"])
        if r < 0.45:
            return f"NOT ({cond(depth - 1)})"
        return f"({cond(depth - 1)} {rng.choice(['AND', 'OR'])} {cond(depth - 1)})"

    dims = [workload.Dim(c, s.tables["c"].columns[c].ordered, "BIGINT") for c in ("a", "b")]
    checked = 0
    for _ in range(150):
        where = cond(4)
        meets = workload._grid_cells(dims, analyze(f"SELECT COUNT(*) FROM c WHERE {where}", s.tables).where)
        cells = set(con.execute(f"SELECT a, b FROM c WHERE {where}").fetchall())
        for _ in range(20):
            r0, r1 = sorted(rng.randrange(n0) for _ in range(2))
            c0, c1 = sorted(rng.randrange(n1) for _ in range(2))
            truth = any(r0 <= x <= r1 and c0 <= y <= c1 for x, y in cells)
            assert (meets is None or meets([r0, r1, c0, c1])) == truth, (where, r0, r1, c0, c1)
            checked += meets is not None
    assert checked > 1000
