"""One person with many rows against the drawn forms of the caps.

On a connection the engine opened itself, the row caps are kept by DuckDB's per-row ``RANDOM()``
(``DuckDBOps.row_clock``) wherever the capped rows are read once: the aggregation's k = 1 pick
and its L / k caps, quantile histograms (grouped k = 1 without L, ungrouped; several grids read
the kept rows once), a DAWA histogram's L cap with ``LEAST(COUNT(*), k)``. A drawn relation read
twice would draw twice and could keep more rows than the caps. Here one person (unit 0) has 2000
rows in each of six groups, every other person one row; the person's value (100) is one no other
row has, so the person's contribution can be read off the released values (zero noise, the
engine's drawn ops kept) or the bounded histograms, in several query shapes (several aggregates,
HAVING, ORDER BY / LIMIT, WHERE, several grids). It never exceeds the caps; control: without caps
the person's rows exceed every bound checked.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.mechanisms.registry import route
from dpsql.testing import zero_noise

GROUPS = 6
HEAVY_ROWS = 2000  # per group
TOP = 100  # the person's value: no other row has it


def _table() -> pa.Table:
    gen = np.random.default_rng(21)
    n = 400
    u = np.concatenate([np.arange(1, n + 1), np.zeros(GROUPS * HEAVY_ROWS, dtype=np.int64)])
    g = np.concatenate([gen.integers(0, GROUPS, n), np.repeat(np.arange(GROUPS), HEAVY_ROWS)])
    v = np.concatenate([gen.integers(0, 50, n), np.full(GROUPS * HEAVY_ROWS, TOP)])
    return pa.table({"u": u, "g": g, "v": v, "age": v})


def _drawn_session(t: pa.Table, caps: dict[str, float]) -> dpsql.Session:
    """Zero noise with the engine's own drawn ops (``use_noise`` would switch to the salted ones)."""
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(1e12, 0.9))
    s._noise = zero_noise()  # type: ignore[attr-defined]
    s.register("t", t, privacy_unit="u", columns={"g": {"domain": list(range(GROUPS))}, "v": {"bounds": (0, 100)},
                                                  "age": {"bounds": (0, 101), "bins": 101}}, **caps)
    assert type(s._engine.ops) is DuckDBOps
    return s


def _bound(caps: dict[str, float], grouped: bool) -> tuple[float, float, float]:
    """(rows per group, groups, rows in all) one person may add under ``caps``."""
    c, k, big_l = (caps.get("max_groups_per_unit", 1), caps.get("max_rows_per_group", 1),
                   caps.get("max_rows_per_unit", float("inf")))
    if not grouped:
        return min(c * k, big_l), 1, min(c * k, big_l)
    return min(k, big_l), min(c, big_l), min(c * k, big_l)


CAPS = [
    {"max_groups_per_unit": 2, "max_rows_per_group": 1},
    {"max_groups_per_unit": 3, "max_rows_per_group": 2},
    {"max_groups_per_unit": 4, "max_rows_per_group": 3},
    {"max_groups_per_unit": 2, "max_rows_per_group": 3, "max_rows_per_unit": 2},
    {"max_groups_per_unit": 3, "max_rows_per_group": 1, "max_rows_per_unit": 2},
]


def _light(t: pa.Table) -> dict[int, tuple[int, int]]:
    """Per group, (rows, sum of v) of everyone but the person (one row each: every cap keeps it)."""
    out: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for u, g, v in zip(t["u"].to_pylist(), t["g"].to_pylist(), t["v"].to_pylist(), strict=True):
        if u != 0:
            out[g][0] += 1
            out[g][1] += v
    return {g: (n, s) for g, (n, s) in out.items()}


AGGREGATES = ["SELECT g, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY g",
              "SELECT g, SUM(v) AS s, AVG(v) AS a, COUNT(DISTINCT v) AS d, COUNT(v) AS n FROM t GROUP BY g "
              "HAVING SUM(v) >= 0 ORDER BY g",
              "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY g ORDER BY s DESC LIMIT 6"]


def _within(s: dpsql.Session, light: dict[int, tuple[int, int]], checked: dict[str, float]) -> bool:
    """Whether the person adds at most the caps ``checked`` to every released aggregate."""
    per_group, groups, total = _bound(checked, grouped=True)
    ok = True
    for sql in AGGREGATES:
        assert "RANDOM()" in s.explain(sql, epsilon=10, delta=1e-3).bounded_sql
        rows = s.query(sql, epsilon=10, delta=1e-3).table.to_pylist()
        added = {r["g"]: round((r["s"] - light.get(r["g"], (0, 0))[1]) / TOP) for r in rows}
        assert all(r["n"] - light.get(r["g"], (0, 0))[0] == added[r["g"]] for r in rows), sql  # n and s agree
        ok = ok and all(0 <= a <= per_group for a in added.values())
        ok = ok and sum(1 for a in added.values() if a) <= groups and sum(added.values()) <= total
    (row,) = s.query("SELECT COUNT(*) AS n, SUM(v) AS s FROM t", epsilon=10, delta=1e-3).table.to_pylist()
    return ok and 0 <= row["n"] - sum(n for n, _ in light.values()) <= _bound(checked, grouped=False)[2]


@pytest.mark.parametrize("caps", CAPS)
def test_the_person_adds_at_most_the_caps_to_released_aggregates(caps: dict[str, float]) -> None:
    t = _table()
    s = _drawn_session(t, caps)
    try:
        assert _within(s, _light(t), caps)
    finally:
        s.close()


def test_control_wider_caps_than_checked_are_caught() -> None:
    t = _table()
    s = _drawn_session(t, {"max_groups_per_unit": 4, "max_rows_per_group": 3})
    try:
        assert not _within(s, _light(t), {"max_groups_per_unit": 2, "max_rows_per_group": 1})
    finally:
        s.close()


def _histograms(s: dpsql.Session, sql: str, drawn: bool) -> tuple[list[dict[str, Any]], Any]:
    """The bounded histograms of ``sql`` through the engine, and the calibration; ``drawn``: whether
    this form keeps rows by the per-row draw (else the salted numbering, or counts only)."""
    r = route(sql, 1.0, 0.0, {}, s.tables, lambda k: None)
    ast = r.mechanism.bounded(r.calibration, "a salt", s._engine.ops)
    assert ("RANDOM()" in s._engine.render(ast)) == drawn, sql
    return s._engine.fetch_arrow(ast).to_pylist(), r.calibration


@pytest.mark.parametrize("caps", CAPS + [{"max_rows_per_unit": 1}, {"max_rows_per_unit": 2}, {"max_rows_per_unit": 5}])
def test_the_person_adds_at_most_the_caps_to_quantile_histograms(caps: dict[str, float]) -> None:
    s = _drawn_session(_table(), caps)
    try:
        grouped = ["SELECT g, MEDIAN(v) FROM t GROUP BY g", "SELECT g, MIN(v), MAX(v), QUANTILE(v, 0.9) FROM t GROUP BY g",
                   "SELECT g, MAX(v) FROM t WHERE g < 5 GROUP BY g HAVING MAX(v) > 0"]
        ungrouped = ["SELECT MEDIAN(v) FROM t", "SELECT MIN(v), MAX(v), MEDIAN(v) FROM t WHERE g <> 3"]
        for sql in grouped + ungrouped:
            is_grouped = sql in grouped
            k1 = caps.get("max_rows_per_group", 1) == 1 and "max_rows_per_unit" not in caps
            out, cal = _histograms(s, sql, drawn=not is_grouped or k1)
            per_group, groups, _ = _bound(caps, grouped=is_grouped) if is_grouped else (
                cal.caps.rows_per_group_bound, 1, cal.caps.rows_per_group_bound)
            for q in range(len(cal.grids)):
                top = round((TOP - cal.grids[q].lo) / cal.grids[q].step)
                added = {r.get("__k0"): r["__n"] for r in out if r["__q"] == q and r["__b"] == top}
                assert all(a <= per_group for a in added.values()) and len(added) <= groups, (sql, q, added)
    finally:
        s.close()


@pytest.mark.parametrize("caps", CAPS)
def test_the_person_adds_at_most_the_caps_to_a_dawa_histogram(caps: dict[str, float]) -> None:
    s = _drawn_session(_table(), caps)
    try:
        for sql in ["SELECT age, COUNT(*) FROM t GROUP BY age", "SELECT age, COUNT(*) FROM t WHERE g < 4 GROUP BY age"]:
            out, cal = _histograms(s, sql, drawn="max_rows_per_unit" in caps)
            added = sum(r["__n"] for r in out if r["__b0"] == TOP)
            # one bin holds all of the person's rows: at most min(k, L) of them
            assert added <= min(caps.get("max_rows_per_group", 1), caps.get("max_rows_per_unit", float("inf"))), (sql, added)
    finally:
        s.close()


def test_control_the_persons_rows_exceed_every_bound_without_caps() -> None:
    t = _table()
    con = duckdb.connect()
    con.register("t", t)
    per_group = dict(con.execute("SELECT g, COUNT(*) FROM t WHERE u = 0 GROUP BY g").fetchall())
    for caps in CAPS:
        bound_k, bound_c, bound_total = _bound(caps, grouped=True)
        assert min(per_group.values()) > bound_k and len(per_group) > bound_c and sum(per_group.values()) > bound_total
    con.close()
