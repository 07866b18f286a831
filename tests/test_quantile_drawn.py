"""Quantile histograms kept by the engine's per-row draw (``ops.row_clock()``, DuckDB's
``RANDOM()``; ``dpsql.rewrite.bound.bounded_value_histograms``): k = 1 per (unit, group) by one
aggregate, the per-unit row cap L of an ungrouped quantile by the draw, and the kept rows read
once, so every grid of a query sees the same kept rows."""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from scipy.stats import norm

import dpsql
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.mechanisms.registry import route
from dpsql.rewrite.bound import source_name
from dpsql.rewrite.render import render

OPS = DuckDBOps()


def _hist(table: pa.Table, sql: str, reg: dict[str, Any], edit: Any = None) -> tuple[list[dict[str, Any]], Any]:
    """The bounded histograms' rows of ``sql`` over ``table`` (the draw's ops), and the calibration."""
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("t", table, privacy_unit="u", columns={"a": {"bounds": (0, 100)}, "b": {"bounds": (0, 100)},
                                                      "g": {"domain": list(range(10))}}, **reg)
    r = route(sql, 1.0, 0.0, {}, s.tables, lambda k: None)
    text = render(r.mechanism.bounded(r.calibration, "salt", OPS))
    assert "RANDOM()" in text
    if edit is not None:
        text = edit(text)
    con = duckdb.connect()
    con.register(r.calibration.plan.table.view or source_name("t"), table)
    out = con.sql(text).to_arrow_table().to_pylist()
    con.close()
    s.close()
    return out, r.calibration


def _point(cal: Any, q: int, v: float) -> int:
    g = cal.grids[q]
    return math.floor((v - g.lo) / g.step + 0.5)


def test_grouped_k1_keeps_one_row_of_each_pair_in_at_most_cu_groups_per_unit():
    gen = np.random.default_rng(11)
    rows = []
    for u in range(400):
        for g in gen.choice(10, size=int(gen.integers(1, 9)), replace=False):
            for _ in range(int(gen.integers(1, 5))):
                rows.append((u, int(g), int(10 * g + gen.integers(0, 4)), 0))
    t = pa.table({"u": [r[0] for r in rows], "g": [r[1] for r in rows], "a": [r[2] for r in rows],
                  "b": [r[3] for r in rows]})
    out, cal = _hist(t, "SELECT g, MEDIAN(a) FROM t GROUP BY g", {"max_groups_per_unit": 3})
    groups_of: dict[int, set[int]] = {}
    values_of: dict[int, set[int]] = {}
    for u, g, a, _ in rows:
        groups_of.setdefault(u, set()).add(g)
        values_of.setdefault(g, set()).add(_point(cal, 0, a))
    assert sum(r["__n"] for r in out) == sum(min(len(gs), 3) for gs in groups_of.values())
    for r in out:  # a kept point is a value of that group's rows, and a group holds at most one per unit
        assert r["__b"] in values_of[r["__k0"]]
    users = {g: sum(1 for gs in groups_of.values() if g in gs) for g in range(10)}
    per_group: dict[int, int] = {}
    for r in out:
        per_group[r["__k0"]] = per_group.get(r["__k0"], 0) + r["__n"]
    assert all(per_group[g] <= users[g] for g in per_group)


def _two_to_one(edit: Any = None) -> tuple[int, int]:
    """30 000 units, each with the rows 0, 0 and 50 in one group: how many keep a 0."""
    n = 30_000
    t = pa.table({"u": np.repeat(np.arange(n), 3), "g": np.zeros(3 * n, dtype=np.int64),
                  "a": np.tile([0, 0, 50], n), "b": np.zeros(3 * n, dtype=np.int64)})
    out, cal = _hist(t, "SELECT g, MEDIAN(a) FROM t GROUP BY g", {"max_groups_per_unit": 1}, edit)
    zero = sum(r["__n"] for r in out if r["__b"] == _point(cal, 0, 0))
    return zero, n


def _binomial_ok(k: int, n: int, p: float) -> bool:
    z = norm.isf(0.5e-6)  # two-sided failure probability 1e-6
    return abs(k - n * p) <= z * math.sqrt(n * p * (1 - p))


def test_the_row_of_a_pair_is_uniform_over_its_rows_repeated_values_included():
    zero, n = _two_to_one()
    assert _binomial_ok(zero, n, 2 / 3)
    # negative control: the choice by value (the smallest) fails the same test
    broken, _ = _two_to_one(lambda sql: sql.replace("RANDOM()", "__g0"))
    assert not _binomial_ok(broken, n, 2 / 3)


def test_every_grid_of_a_grouped_query_reads_the_same_kept_row():
    # each unit's rows in its group: (a, b) = (0, 0) or (50, 100): two grids, one draw per pair
    n = 5000
    t = pa.table({"u": np.repeat(np.arange(n), 2), "g": np.repeat(np.arange(n) % 10, 2),
                  "a": np.tile([0, 50], n), "b": np.tile([0, 100], n)})
    out, cal = _hist(t, "SELECT g, MIN(a), MAX(b) FROM t GROUP BY g", {"max_groups_per_unit": 2})
    for g in range(10):
        a0 = sum(r["__n"] for r in out if r["__k0"] == g and r["__q"] == 0 and r["__b"] == _point(cal, 0, 0))
        b0 = sum(r["__n"] for r in out if r["__k0"] == g and r["__q"] == 1 and r["__b"] == _point(cal, 1, 0))
        total = sum(r["__n"] for r in out if r["__k0"] == g and r["__q"] == 0)
        assert a0 == b0 and total == n // 10 and 0 < a0 < total


def test_ungrouped_quantiles_keep_at_most_l_rows_per_unit_read_once():
    gen = np.random.default_rng(5)
    sizes = gen.integers(1, 7, 2000)
    u = np.repeat(np.arange(len(sizes)), sizes)
    a = gen.integers(0, 2, len(u)) * 50
    t = pa.table({"u": u, "g": np.zeros(len(u), dtype=np.int64), "a": a, "b": a * 2})
    for cap in (1, 2, 3):
        out, cal = _hist(t, "SELECT MIN(a), MAX(b) FROM t", {"max_rows_per_unit": cap})
        for q in (0, 1):
            assert sum(r["__n"] for r in out if r["__q"] == q) == int(np.minimum(sizes, cap).sum())
        # one read of the kept rows: b = 2a row by row, so both grids count the same rows at 0
        zeros = [sum(r["__n"] for r in out if r["__q"] == q and r["__b"] == _point(cal, q, 0)) for q in (0, 1)]
        assert zeros[0] == zeros[1]
