"""Benchmark: two source trees of dpsql on the peer queries (Q1 and Q3; ``--queries`` to choose among
Q1, Q2, Q3), interleaved in one run.

One command:  python benchmarks/compare_trees.py --base /path/to/other/checkout [--rows 1000000]
                                                 [--rounds 3] [--repeat 7] [--queries Q1,Q2,Q3]

Each round runs one fresh process per tree (``PYTHONPATH`` = the tree; this tree is ``head``), the
trees alternating, so both see the same machine load. In each process, after the registered
relation reaches its steady state (as in ``peers.py``), each query is timed ``--repeat`` times,
alternating with its bounding floor (``peers.py``'s ``floor`` over ``read_parquet``): wall and
CPU seconds (user + system, every thread) of ``Session.query`` end to end and of the floor.
JSON to stdout and ``benchmarks/out/compare_<rows>.json``: per tree and query the best and the
median of every measurement over all rounds, and the ratios dpsql / floor (best and median).
Same data, caps and queries as ``peers.py`` (epsilon 1, delta 1e-5, C_u 5, k 1, country public).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD = os.path.dirname(HERE)

EPS, DELTA, CU, K = 1.0, 1e-5, 5, 1  # as in peers.py
QUERIES = {
    "Q1": "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
    "Q2": "SELECT url, country, COUNT(*) AS n FROM events GROUP BY url, country",
    "Q3": "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events GROUP BY country",
}


def floor_sql(q: str, src: str) -> str:
    """peers.py's bounding floor of Q1, Q2 and Q3."""
    if q == "Q2":
        return f"SELECT url, country, COUNT(*) FROM (SELECT DISTINCT user_id, url, country FROM {src}) GROUP BY ALL"
    if q == "Q3":
        return f"SELECT country, COUNT(*), SUM(v) FROM (SELECT user_id, country, ANY_VALUE(likes) AS v FROM {src} GROUP BY ALL) GROUP BY ALL"
    return f"SELECT country, COUNT(*) FROM (SELECT DISTINCT user_id, country FROM {src}) GROUP BY ALL"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(rows: int, repeat: int, queries: list[str]) -> dict[str, Any]:
    """Runs inside one tree's process: the timings of each query and its floor."""
    sys.path.insert(0, HERE)
    import duckdb
    from _events import events_path

    import dpsql  # the tree on PYTHONPATH (peers.py is not imported: it puts this tree first on sys.path)

    path = events_path(rows, rows // 5)
    src = f"read_parquet('{path}')"
    tmp = tempfile.mkdtemp(prefix="dpsql-compare-")
    s = dpsql.Session(ledger=os.path.join(tmp, "ledger.duckdb"), budget=dpsql.Budget(1e6, 0.5), create=True)
    s.register("events", path, privacy_unit="user_id", max_groups_per_unit=CU, max_rows_per_group=K,
               columns={"country": {"domain": [f"C{i}" for i in range(50)]}, "likes": {"bounds": [0, 10]}})
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SET threads = {s._engine.settings.effective_threads}")
    for _ in range(2):  # the registered relation's steady state (as in peers.py)
        s.query(QUERIES["Q1"], epsilon=EPS, delta=DELTA)
    out: dict[str, Any] = {}
    for q in queries:
        sql = QUERIES[q]
        floor = floor_sql(q, src)
        runs: dict[str, list[float]] = {"floor": [], "floor_cpu": [], "dpsql": [], "dpsql_cpu": []}
        con.execute(floor).fetchall()
        s.query(sql, epsilon=EPS, delta=DELTA)
        for _ in range(repeat):
            for name, fn in (("floor", lambda: con.execute(floor).fetchall()),  # noqa: B023
                             ("dpsql", lambda: s.query(sql, epsilon=EPS, delta=DELTA))):  # noqa: B023
                c, t = _cpu(), time.perf_counter()
                fn()
                runs[name].append(time.perf_counter() - t)
                runs[name + "_cpu"].append(_cpu() - c)
        out[q] = runs
    s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the other source tree (a checkout of dpsql)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--queries", default="Q1,Q3", help="comma-separated, among Q1, Q2, Q3")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    if not queries or any(q not in QUERIES for q in queries):
        ap.error(f"--queries takes a comma-separated list among {', '.join(QUERIES)}, got {args.queries!r}")
    if args.child:
        print(json.dumps(child(args.rows, args.repeat, queries)))
        return
    trees = {"base": os.path.abspath(args.base), "head": HEAD}
    got: dict[str, dict[str, dict[str, list[float]]]] = {t: {} for t in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=tree)
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--base", tree, "--rows",
                                str(args.rows), "--repeat", str(args.repeat), "--queries", args.queries], env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{name} failed: {p.stderr[-2000:]}")
            for q, runs in json.loads(p.stdout).items():
                for k, v in runs.items():
                    got[name].setdefault(q, {}).setdefault(k, []).extend(v)
    results: dict[str, Any] = {}
    for name in trees:
        for q, runs in got[name].items():
            r = {k: {"best": min(v), "median": statistics.median(v)} for k, v in runs.items()}
            for m in ("best", "median"):
                r[f"ratio_{m}"] = r["dpsql"][m] / r["floor"][m]
                r[f"cpu_ratio_{m}"] = r["dpsql_cpu"][m] / r["floor_cpu"][m]
            results.setdefault(q, {})[name] = r
    out = {"benchmark": "compare_trees", "rows": args.rows, "rounds": args.rounds, "repeat": args.repeat,
           "trees": trees, "load_average": os.getloadavg(), "results": results}
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", f"compare_{args.rows}.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    print("trees: " + ", ".join(f"{k} = {v}" for k, v in trees.items()), file=sys.stderr)
    for q, by in results.items():
        for name, r in by.items():
            print(f"{q} {name}: floor {r['floor']['best']:.3f} / {r['floor']['median']:.3f} s, dpsql {r['dpsql']['best']:.3f} / "
                  f"{r['dpsql']['median']:.3f} s (best / median), ratio {r['ratio_best']:.2f}x / {r['ratio_median']:.2f}x, "
                  f"CPU ratio {r['cpu_ratio_best']:.2f}x", file=sys.stderr)


if __name__ == "__main__":
    main()
