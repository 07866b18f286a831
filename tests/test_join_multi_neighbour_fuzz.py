"""Randomised neighbour sensitivity of join queries with several aggregates (``dpsql.mechanisms.join_multi``).

``tests/test_join_neighbour_fuzz.py`` checks single-aggregate join queries. A query with several
aggregates (``SELECT COUNT(*), AVG(o.v), SUM(o.v) ...``, with or without GROUP BY a public key) is
answered by one run of the routed mechanism per base aggregate (COUNT(*), COUNT(col), SUM(expr); AVG is
SUM and COUNT of the same values), each on its own single-aggregate plan, and composed
(docs/mechanisms.md §3.11). The composition is sound only if every run, as calibrated, moves by at
most its own sensitivity when one person leaves. Here the generated schemas, data and queries of
``tests/_join_fuzz.py`` get several aggregates (AVG, SUM, COUNT of a value column, COUNT(*), AVG of a
clamp) added to each query, sometimes at q = 1; the query is routed on D, and every run's calibration
is checked with ``_join_fuzz.compare`` against the same run on D less one person (and every row that
reaches them): truncated sums at fixed thresholds (scalar), clipped totals in L2 (GROUP BY, per-person
clipping), E and F̄ at every τ of the grid (GROUP BY, DP-S4S's vector form), per-owner totals and the
sampled tuples. A fixed schema (rows reaching people, at most 3 per person enforced) is the negative
control: runs calibrated for less than the SQL enforces (Delta = 1, or C/4) must be flagged.
"""

from __future__ import annotations

import collections
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _join_fuzz as fz  # noqa: E402

from dpsql.mechanisms.join_multi import MultiCalibration  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _heap_frozen() -> Any:
    """Each neighbour observation collects earlier garbage before recording warnings; with the heap frozen once here,
    that collection examines only this module's objects (tests/_neighbour.py frozen_heap)."""
    from tests._neighbour import frozen_heap

    with frozen_heap():
        yield


#: fixed seeds (few: the fixed schema below covers per-person clipping)
SEEDS = [110, 112]
QUERIES = 3


def _as_calibrated(cal: Any) -> Any:
    """A run's calibration as the checks read it (the negative control understates its Delta)."""
    return cal


def runs_internals(s: Any, sql: str, opts: dict[str, Any], eps: float, delta: float) -> list[dict[str, Any] | None] | None:
    """The internals (``_join_fuzz.internals``) of every run of the routed query, or None if it is refused."""
    try:
        cal = s._route(sql, eps, delta, opts).calibration
    except Exception:  # noqa: BLE001
        return None
    out = []
    try:
        for c in (cal.runs if isinstance(cal, MultiCalibration) else [cal]):
            c = _as_calibrated(c)
            s._route = lambda *a, _c=c, **k: types.SimpleNamespace(calibration=_c)
            out.append(fz.internals(s, sql, opts, eps, delta))
    finally:
        del s._route  # the class's method again
    return out


def gen_query(T: dict[str, fz.Table], g: np.random.Generator) -> tuple[str, dict[str, Any], bool]:
    """``_join_fuzz.gen_query`` with one to two more aggregates over a value column of one of its inputs."""
    sql, opts, grouped = fz.gen_query(T, g)
    head, _, rest = sql.partition(" FROM ")
    parts = [p.strip() for p in head[len("SELECT "):].split(", ")]
    keys, agg = parts[:-1], parts[-1]
    values = [f"{al}.v" for tn, al in re.findall(r"(\w+) AS (t\d)", rest) if "v" in T[tn].cols]
    aggs = [agg]
    if values:
        v = values[int(g.integers(0, len(values)))]
        extra = [f"AVG({v})", f"SUM({v})", f"COUNT({v})", "COUNT(*)", f"AVG(LEAST(GREATEST({v}, 0), 3))"]
        aggs += [extra[int(i)] for i in g.choice(len(extra), int(g.integers(1, 3)), replace=False)]
    aggs = list(dict.fromkeys(aggs))
    if len(aggs) > 1:
        opts = {k: v for k, v in opts.items() if k != "clip_norm"}  # refused with several aggregates
    if opts.get("q", 1.0) < 1.0 and g.random() < 0.5:
        opts = {**opts, "q": 1.0}
    return f"SELECT {', '.join(keys + aggs)} FROM {rest}", opts, grouped


def run_seed(seed: int, n_queries: int) -> tuple[collections.Counter, list[str]]:
    g = np.random.default_rng(seed)
    text = bool(seed % 2)
    T = fz.gen_schema(g)
    D = fz.gen_data(T, g)
    R = fz.reach_all(T, D)
    s_d = fz.session(T, D, text)
    neigh = {v: fz.session(T, fz.without(T, D, v, R), text) for v in fz.victims(T, D, g)}
    seen: collections.Counter = collections.Counter()
    problems: list[str] = []
    try:
        for qi in range(n_queries):
            sql, opts, grouped = gen_query(T, g)
            delta = 1e-6 if grouped or g.random() < 0.3 else 0.0
            a = runs_internals(s_d, sql, opts, 1.0, delta)
            if a is None:
                continue
            how = "multi" if len(a) > 1 else "single"
            for v, s_p in neigh.items():
                where = f"{seed}/{qi} victim {v} {sql} {opts} delta={delta}"
                b = runs_internals(s_p, sql, opts, 1.0, delta)
                if b is None or len(b) != len(a):
                    problems.append(f"{where}: routed differently on D'")
                    continue
                vid = f"{v[0]}:{fz.spell(v[1]) if text else v[1]}"
                for j, (x, y) in enumerate(zip(a, b, strict=True)):
                    if x is None or y is None:
                        continue
                    seen[f"{how}:{x['kind']}"] += 1
                    problems += [f"{where} run {j}: {p}" for p in fz.compare(x, y, vid, fz.digested_id(vid) if text else vid)]
    finally:
        s_d.close()
        for s_p in neigh.values():
            s_p.close()
    return seen, problems


def test_every_run_of_a_multi_aggregate_join_moves_within_its_bound() -> None:
    seen: collections.Counter = collections.Counter()
    for seed in SEEDS:
        kinds, problems = run_seed(seed, QUERIES)
        assert not problems, "\n".join(problems[:10])
        seen += kinds
    # with the fixed schema's (scalar, per-person clipping), every run kind of a multi-aggregate join
    assert {"multi:scalar-fast", "multi:scalar-general", "multi:vector-s4s"} <= set(seen), sorted(seen)


# -- negative controls: a run held to less than its bounding enforces is flagged ---------------------------------------

#: persons (one row each) and rows reaching them with at most 3 per person enforced; the generated data give person 0
#: many rows (capped at 3)
FIXED = {"pub": fz.Table("pub", public=True, keycol="id", cols=["id", "name"]),
         "pa": fz.Table("pa", unit="id", keycol="id", cols=["id", "v", "g"], max_rows_per_unit=1),
         "c0": fz.Table("c0", keycol="k", cols=["k", "v", "g", "f0"], refs={"f0": "pa.id"}, degree={"f0": 3})}
FROM = " FROM pa AS t0 JOIN c0 AS t1 ON t0.id = t1.f0"
FIXED_QUERIES = [("SELECT COUNT(*), AVG(t1.v)" + FROM, {"mechanism": "r2t"}, 0.0),  # runs: scalar, Delta enforced, q = 1
                 ("SELECT t1.g, COUNT(*), AVG(t1.v)" + FROM + " GROUP BY t1.g", {}, 1e-6)]  # runs: per-person clipping


def fixed_problems() -> tuple[collections.Counter, list[str]]:
    g = np.random.default_rng(4)
    d = fz.gen_data(FIXED, g)
    r = fz.reach_all(FIXED, d)
    s_d = fz.session(FIXED, d)
    seen: collections.Counter = collections.Counter()
    out: list[str] = []
    try:
        for sql, opts, delta in FIXED_QUERIES:
            a = runs_internals(s_d, sql, opts, 1.0, delta)
            assert a is not None and len(a) == 3, sql
            for v in fz.victims(FIXED, d, g):
                s_p = fz.session(FIXED, fz.without(FIXED, d, v, r))
                try:
                    b = runs_internals(s_p, sql, opts, 1.0, delta)
                    assert b is not None and len(b) == 3
                    for x, y in zip(a, b, strict=True):
                        assert x is not None and y is not None
                        seen[x["kind"]] += 1
                        out += [f"{sql} victim {v}: {p}" for p in fz.compare(x, y, f"{v[0]}:{v[1]}")]
                finally:
                    s_p.close()
    finally:
        s_d.close()
    return seen, out


def test_fixed_multi_aggregate_joins_hold() -> None:
    seen, problems = fixed_problems()
    assert problems == []
    assert set(seen) == {"scalar-fast", "vector-clip"}, seen


def test_negative_control_an_understated_delta_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run claims Delta = 1 (its calibration's ``max_tuples``) while the SQL enforces the declared 3."""
    import dataclasses

    monkeypatch.setattr(sys.modules[__name__], "_as_calibrated",
                        lambda cal: dataclasses.replace(cal, max_tuples=1) if hasattr(cal, "max_tuples") else cal)
    assert any("enforced Delta=1 exceeded" in p for p in fixed_problems()[1])


def test_negative_control_an_understated_clip_norm_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every clipping run claims C/4 (its calibration's ``clip``) while the SQL clips each person at C."""
    import dataclasses

    monkeypatch.setattr(sys.modules[__name__], "_as_calibrated",
                        lambda cal: dataclasses.replace(cal, clip=cal.clip / 4) if getattr(cal, "clip", 0.0) else cal)
    groups, totals = fz.clipped_groups, fz.clipped_totals  # the SQL (and the decoding of its fixed point) at 4 x C/4
    monkeypatch.setattr(fz, "clipped_groups", lambda jp, cat, owner, c, **kw: groups(jp, cat, owner, 4 * c, **kw))
    monkeypatch.setattr(fz, "clipped_totals", lambda t, c, parts: totals(t, 4 * c, parts))
    assert any("vector-clip" in p and "moved by" in p for p in fixed_problems()[1])
