"""Ordinary one-table analyst SQL against plain DuckDB on known data, at zero noise, with caps and bounds
that drop and clamp nothing (as ``tests/test_adversary_semantics.py``).

Findings covered:

1. ``SUM(x) FILTER (WHERE c)`` and ``AVG(x) FILTER (WHERE c)`` (and the ``CASE WHEN c THEN x END`` they
   stand for) dropped the column's declared ``granularity``: the sum was rounded to the grid of its noise
   scale (32700 for 32743 with granularity 0.01 declared, where ``SUM(x) ... WHERE c`` gives 32743) and the
   mean to a thousandth of the bounds' width (51.9 for 51.87), although the values summed are the column's
   own values or NULL.
2. A subquery or CTE with GROUP BY in FROM (``SELECT * FROM (SELECT g, COUNT(*) AS n FROM t GROUP BY g)
   WHERE n > 500``) was refused with "aggregate in the outer query only: an aggregate of aggregates is not
   supported", which names neither the flat query nor HAVING, the fix for a filter on the aggregate.
3. ``epoch(ts)`` (now answered as ``date_part('epoch', ts)``; ``epoch_ms(ts)`` stands in for it here), ``age(ts)`` and ``last_day(d)`` were refused as off the allow-list without a fix, where
   ``date_part('epoch', ts)``, a shifted literal and ``date_trunc('month', d)`` are answered.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

EPS, DELTA = 10.0, 1e-3


def _table(n: int = 2000, seed: int = 5) -> pa.Table:
    gen = np.random.default_rng(seed)
    x = [None if gen.random() < 0.2 else float(v) for v in gen.integers(0, 100, n)]
    b = [None if gen.random() < 0.2 else bool(v) for v in gen.integers(0, 2, n)]
    g = [None if gen.random() < 0.2 else str(v) for v in gen.choice(["a", "b", "c"], n)]
    return pa.table({"uid": np.arange(n), "x": pa.array(x, pa.float64()), "b": pa.array(b, pa.bool_()),
                     "g": pa.array(g, pa.string())})


def _session(t: pa.Table, delta: float) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e12, 0.9))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=50, max_rows_per_group=1,
               columns={"x": {"bounds": (0, 100), "granularity": 0.01}})
    return s


def _duck(t: pa.Table, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.register("t", t)
    return con.execute(sql).fetchall()


# -- 1. FILTER keeps the column's declared granularity --------------------------------------------------------


@pytest.mark.parametrize("delta", [0.0, DELTA])
@pytest.mark.parametrize("sql", [
    "SELECT SUM(x) FILTER (WHERE b) AS v FROM t",
    "SELECT SUM(CASE WHEN b THEN x END) AS v FROM t",
    "SELECT SUM(CASE WHEN b THEN x ELSE NULL END) AS v FROM t",
    "SELECT AVG(x) FILTER (WHERE b) AS v FROM t",
    "SELECT AVG(CASE WHEN g = 'a' THEN x END) AS v FROM t",
])
def test_a_filtered_aggregate_is_rounded_to_the_columns_declared_granularity(sql: str, delta: float) -> None:
    t = _table()
    s = _session(t, delta)
    got = s.query(sql, epsilon=EPS, delta=delta).table.column("v").to_pylist()[0]
    (want,), = _duck(t, sql)
    # the declared grid is 0.01: a sum of whole numbers is exact, a mean within half a step
    assert got == pytest.approx(float(want), abs=0.005 + 1e-9), (sql, got, want)


def test_negative_control_an_expression_that_changes_the_values_keeps_the_default_grid() -> None:
    """``x / 3`` is not on the column's grid: its sum keeps the grid of its noise scale (coarser than 0.01)."""
    t = _table()
    s = _session(t, DELTA)
    sql = "SELECT SUM(CASE WHEN b THEN x / 3 END) AS v FROM t"
    got = s.query(sql, epsilon=EPS, delta=DELTA).table.column("v").to_pylist()[0]
    (want,), = _duck(t, sql)
    assert got != pytest.approx(float(want), abs=0.005)


@pytest.mark.parametrize("sql", [
    "SELECT g, AVG(x) FILTER (WHERE b) AS v FROM t GROUP BY g",
    "SELECT g, SUM(x) FILTER (WHERE b) AS v FROM t GROUP BY g",
])
def test_a_filtered_aggregate_per_group_is_rounded_to_the_declared_granularity(sql: str) -> None:
    t = _table()
    s = _session(t, DELTA)
    got = {r["g"]: r["v"] for r in s.query(sql, epsilon=EPS, delta=DELTA).table.to_pylist()}
    want = {k: float(v) for k, v in _duck(t, sql)}
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=0.005 + 1e-9), (k, got[k], want[k])


# -- 2. GROUP BY in a subquery: the hint names the flat query ------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT * FROM (SELECT g, COUNT(*) AS n FROM t GROUP BY g) WHERE n > 500",
    "WITH a AS (SELECT g, COUNT(*) AS n FROM t GROUP BY g) SELECT g, n FROM a WHERE n > 500",
])
def test_group_by_in_a_subquery_names_having_as_the_fix(sql: str) -> None:
    s = _session(_table(), DELTA)
    before = s.remaining()
    with pytest.raises(UnsupportedQueryError) as info:
        s.query(sql, epsilon=EPS, delta=DELTA)
    text = str(info.value)
    assert "HAVING" in text and "outer query" in text, text
    assert s.remaining() == before


# -- 3. Off-list date functions name their answered forms ----------------------------------------------------


@pytest.mark.parametrize(("sql", "fix"), [
    ("SELECT COUNT(*) FROM t WHERE epoch_ms(ts) > 1717200000000", "date_part('epoch', ts)"),
    ("SELECT COUNT(*) FROM t WHERE age(ts) > INTERVAL 30 DAY", "literal"),
    ("SELECT last_day(d) AS m, COUNT(*) AS n FROM t GROUP BY m", "date_trunc('month'"),
])
def test_an_off_list_date_function_names_the_form_that_is_answered(sql: str, fix: str) -> None:
    import datetime

    t = pa.table({"uid": [1, 2], "ts": [datetime.datetime(2024, 6, 1, 12)] * 2, "d": [datetime.date(2024, 6, 1)] * 2})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1)
    with pytest.raises(UnsupportedQueryError) as info:
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert fix in str(info.value), str(info.value)
    assert s.remaining().epsilon == 10.0
