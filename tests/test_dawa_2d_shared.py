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
