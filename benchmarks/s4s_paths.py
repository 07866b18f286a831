"""Benchmark: the truncation's path chosen by the plan (people per tuple) versus by the sample, on neighbours.

One command:  python benchmarks/s4s_paths.py [--graph ca-GrQc] [--degree 80] [--repeat 3] [--queries ...] [--graphs DIR]
[--out DIR]  (graphs as for ``benchmarks/s4s.py``: ``--graphs``, ``$DPSQL_GRAPHS`` or ``../shared/data/graphs``)

For edges (2 users per tuple), 2-paths and triangles (3 users) of a SNAP graph (``benchmarks/s4s.py``
builds them the same way, nodes as users, unit weights) and of its neighbour — the same graph plus one
new person joined to the ``--degree`` nodes of highest degree (a high-degree person, present in many
tuples with other heavy people) — this times the truncation f̄(S, τ) over every τ of a grid on one
sample S, for two dispatches:

* ``plan``: the path fixed by the plan's people per tuple (what the mechanisms run: 2 → verified
  max-flow at every τ, 3 → certified LP at every τ);
* ``data``: the cheapest exact path for the sample at each τ (closed form when no tuple keeps two
  heavy users, max-flow when at most two, LP otherwise): the dispatch before the plan chose it.

Grids: DP-S4S's (q = 1/16, τ = 5.5^i < Δ, then Δ) and R2T's (q = 1, τ = 5.5^j, j = 1 … ⌈log GS⌉), Δ as in
``benchmarks/s4s.py`` (D = 1024). The sample keeps a tuple when a keyed hash of its users is below q, so
the two neighbours share the sample of their common tuples (the new person's tuples are added).
Reported per (query, grid, dataset, dispatch): CPU seconds (least of ``--repeat`` timings; the
machine is shared), the paths taken per τ, and the largest difference of the released values
between the two dispatches (≤ G(τ) = τ·2⁻¹⁰, the slack charged on every path). The number to read is
the time difference between the neighbours under each dispatch, besides the absolute times.

``synthetic`` (in ``--queries``; 3 users per tuple): 300 000 tuples (a, b, c), a ≠ b drawn among 2000
users that are heavy at τ = 100 (load ≈ 300) and c a light user of its own, so that no tuple keeps three
heavy users; the neighbour adds one person with 200 tuples (p, a, b), heavy at τ = 100. Grid
τ ∈ {100, 1000} (at 1000 nobody is heavy). Under the data dispatch the person switches τ = 100 from the
max-flow to the LP (measured 0.6 s → 6.8 s CPU), under the plan's both run the LP.
JSON goes to stdout and ``<out>/s4s_paths.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from s4s import D, incidence, load_graph, triangles, two_paths  # noqa: E402

from dpsql.accounting.s4s import DEFAULT_TAU_BASE, r2t_schedule, s4s_tau_grid  # noqa: E402
from dpsql.mechanisms import _s4s_truncation as trunc  # noqa: E402
from dpsql.mechanisms.s4s import validate_join_tuples  # noqa: E402

Q = 1.0 / 16.0
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def keep(cols: tuple[np.ndarray, ...], q: float) -> np.ndarray:
    """A tuple's keep decision from its (sorted) users only: the neighbours share their common tuples' draws."""
    if q >= 1.0:
        return np.ones(cols[0].size, dtype=bool)
    srt = np.sort(np.stack(cols), axis=0).astype(np.uint64)
    h = np.full(cols[0].size, np.uint64(0x9E3779B97F4A7C15))
    for row in srt:
        h = _mix(h ^ row)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53 < q


def build(query: str, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
    if query == "edge":
        return (u, v)
    return two_paths(u, v) if query == "2-path" else triangles(u, v)


def synthetic(person: bool, seed: int = 1) -> tuple[np.ndarray, ...]:
    """The ``synthetic`` query's tuples (module docstring), with or without the new person."""
    g = np.random.default_rng(seed)
    h, n = 2000, 300_000
    a = g.integers(0, h, n)
    b = (a + g.integers(1, h, n)) % h
    c = h + np.arange(n)
    if not person:
        return (a, b, c)
    pa = g.integers(0, h, 200)
    return (np.concatenate([a, pa]), np.concatenate([b, (pa + 1) % h]), np.concatenate([c, np.full(200, h + n)]))


def with_person(u: np.ndarray, v: np.ndarray, degree: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The neighbour: one new node joined to the ``degree`` nodes of highest degree (lo < hi as load_graph)."""
    deg = np.bincount(np.concatenate([u, v]))
    top = np.argsort(-deg, kind="stable")[:degree]
    new = int(max(u.max(), v.max())) + 1
    return np.concatenate([u, top]), np.concatenate([v, np.full(top.size, new)]), new


def time_grid(prep: trunc.Prepared, taus: list[float], people: float | None, repeat: int) -> tuple[float, list[str], list[float]]:
    best = math.inf
    paths: list[str] = []
    vals: list[float] = []
    for _ in range(repeat):
        c0 = time.process_time()
        out = [trunc.truncate(prep, t, people) for t in taus]
        best = min(best, time.process_time() - c0)
        paths, vals = [r.path for r in out], [r.value for r in out]
    return best, paths, vals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graph", default="ca-GrQc")
    ap.add_argument("--degree", type=int, default=80, help="the new person's degree (joined to the top-degree nodes)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--queries", default="edge,2-path,triangle,synthetic")
    ap.add_argument("--graphs", default=os.environ.get("DPSQL_GRAPHS",
                                                       str(Path(__file__).resolve().parents[1].parent / "shared/data/graphs")))
    ap.add_argument("--out", default=str(Path(__file__).parent / "out"))
    args = ap.parse_args(argv)
    u, v = load_graph(Path(args.graphs) / f"{args.graph}.edges.csv.gz")
    u2, v2, new = with_person(u, v, args.degree)
    bounds = {"edge": D, "2-path": 3 * D * (D - 1) // 2, "triangle": D * (D - 1) // 2, "synthetic": 0}
    people = {"edge": 2.0, "2-path": 3.0, "triangle": 3.0, "synthetic": 3.0}
    rows: list[dict[str, Any]] = []
    for query in args.queries.split(","):
        delta = bounds[query]
        if query == "synthetic":
            grids = {"fixed": (1.0, [100.0, 1000.0])}
            data = {"D": synthetic(False), "D+person": synthetic(True)}
        else:
            grids = {"s4s 1/16": (Q, [float(t) for t in s4s_tau_grid(delta, DEFAULT_TAU_BASE, top_at_delta=True)]),
                     "r2t": (1.0, [float(s.tau) for s in r2t_schedule(1.0, delta, 0.1, DEFAULT_TAU_BASE)])}
            data = {"D": build(query, u, v), "D+person": build(query, u2, v2)}
        for grid, (q, taus) in grids.items():
            res: dict[str, Any] = {}
            for name, cols in data.items():
                m = keep(cols, q)
                w, ti, ui = incidence(tuple(c[m] for c in cols))
                jt = validate_join_tuples(w, ti, ui)
                prep = trunc.prepare(jt.weights, jt.tuple_idx, jt.user_idx, jt.n_users)
                for disp, pp in (("data", None), ("plan", people[query])):
                    trunc.STATS.reset()
                    cpu, paths, vals = time_grid(prep, taus, pp, args.repeat)
                    res[(name, disp)] = (cpu, paths, vals, int(w.size))
            for disp in ("data", "plan"):
                a, b = res[("D", disp)], res[("D+person", disp)]
                row = {"graph": args.graph, "query": query, "grid": grid, "dispatch": disp, "taus": taus,
                       "tuples": [a[3], b[3]], "cpu_s": [a[0], b[0]], "neighbour_diff_s": b[0] - a[0],
                       "paths": [a[1], b[1]], "new_person_degree": args.degree}
                rows.append(row)
                print(f"{query:8s} {grid:8s} {disp:4s} n={a[3]}/{b[3]} cpu D {a[0]:.3f}s D+p {b[0]:.3f}s diff {b[0] - a[0]:+.3f}s "
                      f"paths D {a[1]} D+p {b[1]}", file=sys.stderr, flush=True)
            gap = max(abs(x - y) / max(1.0, t * trunc.GAP_FRACTION) for name in data
                      for x, y, t in zip(res[(name, "data")][2], res[(name, "plan")][2], taus))
            rows[-1]["max_value_diff_over_G"] = gap
            rows[-2]["max_value_diff_over_G"] = gap
    out = {"rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "s4s_paths.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
