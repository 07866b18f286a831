"""Benchmark: the Gaussian sparse histogram mechanism on generated events.

One command:  python benchmarks/sparse_histogram.py [--rows 1000000 10000000] [--quick]
JSON to stdout and benchmarks/out/sparse_histogram.json. For each data size (~200k users,
heavy-tailed rows per user, Zipf URLs, ~50 countries), at epsilon = 1, delta = 1e-5, C_u = 5,
for ``SELECT url, country, COUNT(*) FROM events GROUP BY url, country``:

* wall time of ``Session.query`` vs the same non-private DuckDB GROUP BY (ratio; target <= 2),
  and vs the non-private COUNT(DISTINCT user_id) GROUP BY (the same per-user work);
* peak memory (max RSS) of a child process running each;
* groups released, recall of groups whose bounded count >= 100, median relative error of the
  released counts against the bounded truth, with the exact (Theorem 5.4) calibration and with
  the add-the-deltas calibration (each with its own optimal sigma and tau*);
* median relative error of released COUNT(*) against the unbounded truth for k = 1 and k = 5
  rows per (user, group).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import duckdb  # noqa: E402
from _events import OUT, events_path  # noqa: E402

import dpsql  # noqa: E402
from dpsql import accounting  # noqa: E402
from dpsql.mechanisms import sparse_histogram as shm  # noqa: E402
from dpsql.noise import NoiseSource  # noqa: E402
from dpsql.plan.analyze import analyze  # noqa: E402
from dpsql.rewrite.bound import Caps, bounded_query  # noqa: E402
from dpsql.rewrite.render import render  # noqa: E402

EPS, DELTA, CU = 1.0, 1e-5, 5
SQL = "SELECT url, country, COUNT(*) AS n FROM events GROUP BY url, country"


def _child_nonprivate(path: str, q: str, conn: Any) -> None:
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    t = time.perf_counter()
    rows = con.execute(q.replace("events", f"read_parquet('{path}')")).fetchall()
    dt = time.perf_counter() - t
    conn.send((dt, len(rows), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def _child_dpsql(path: str, k: int, conn: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        s = dpsql.Session(ledger=os.path.join(tmp, "l.duckdb"), budget=dpsql.Budget(100.0, 1e-3), create=True)
        s.register("events", path, privacy_unit="user_id", max_groups_per_unit=CU, max_rows_per_group=k)
        t = time.perf_counter()
        r = s.query(SQL, epsilon=EPS, delta=DELTA)
        dt = time.perf_counter() - t
        s.close()
    conn.send((dt, r.table.num_rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def _in_child(target: Any, *args: Any) -> tuple[float, int, int]:
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=target, args=(*args, b))
    p.start()
    res = a.recv()
    p.join()
    return res


def _accuracy(path: str, k: int, method: str, rng: NoiseSource) -> dict[str, Any]:
    """Release with the given calibration method; compare against bounded and unbounded truth."""
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("events", path, privacy_unit="user_id", max_groups_per_unit=CU, max_rows_per_group=k)
    plan = analyze(SQL, s.tables)
    caps = Caps(CU, k)
    cal = shm.calibrate(plan, EPS, DELTA, caps, {})
    if method == "add_the_deltas":
        extra = tuple(c.sensitivity for c in cal.columns if c.name != "__users")
        alt = accounting.calibrate_sparse_histogram(
            EPS, DELTA, tau=1, max_groups=CU, extra_sensitivities=extra, method="add_the_deltas"
        )
        cal.scales["__users"] = float(alt.sigma)
        for c, sig in zip([c for c in cal.columns if c.name != "__users"], alt.extra_sigmas):
            cal.scales[c.name] = float(sig)
        cal.tau_star = float(math.ceil(alt.tau_star))
        cal.params["sigma"] = float(alt.sigma)
        cal.params["tau_star"] = cal.tau_star
    salt = rng.salt()
    con = s._engine.connection
    bounded = con.sql(render(bounded_query(plan, caps, salt=salt, tau=cal.tau, unit_column="user_id"))).to_arrow_table()
    released, _ = shm.release(plan, bounded, cal, rng)
    truth = con.sql(
        f"SELECT url, country, COUNT(*) AS n FROM {s.tables['events'].view} GROUP BY url, country"
    ).to_arrow_table()
    s.close()

    def keyed(t: Any, kcols: list[str], vcol: str) -> dict[tuple[Any, ...], float]:
        cols = [t.column(c).to_pylist() for c in kcols]
        return dict(zip(zip(*cols), t.column(vcol).to_pylist()))

    kb = keyed(bounded, ["__k0", "__k1"], "__a0" if k > 1 else "__users")
    kr = keyed(released, ["__k0", "__k1"], "__a0")
    kt = keyed(truth, ["url", "country"], "n")
    big = {g for g, c in kb.items() if c >= 100}
    rel_b = [abs(v - kb[g]) / kb[g] for g, v in kr.items() if kb.get(g)]
    rel_t = [abs(v - kt[g]) / kt[g] for g, v in kr.items() if kt.get(g)]
    return {
        "method": method,
        "rows_per_group_k": k,
        "sigma": cal.params["sigma"],
        "tau_star": cal.tau_star,
        "groups_nonempty": len(kt),
        "groups_after_bounding": len(kb),
        "groups_released": len(kr),
        "groups_bounded_count_ge_100": len(big),
        "recall_bounded_count_ge_100": (len(big & set(kr)) / len(big)) if big else None,
        "median_rel_error_vs_bounded": float(np.median(rel_b)) if rel_b else None,
        "median_rel_error_vs_unbounded": float(np.median(rel_t)) if rel_t else None,
    }


def run(n_rows: int, repeat: int) -> dict[str, Any]:
    path = events_path(n_rows)
    np_times, dp_times = [], []
    np_mem = dp_mem = 0
    distinct_times = []
    released = 0
    for _ in range(repeat):
        t, _, m = _in_child(_child_nonprivate, path, SQL)
        np_times.append(t)
        np_mem = max(np_mem, m)
        t, _, _m = _in_child(
            _child_nonprivate, path, "SELECT url, country, COUNT(DISTINCT user_id) FROM events GROUP BY url, country"
        )
        distinct_times.append(t)
        t, released, m = _in_child(_child_dpsql, path, 1)
        dp_times.append(t)
        dp_mem = max(dp_mem, m)
    _, _, base_mem = _in_child(_child_nonprivate, path, "SELECT 1 AS one FROM events LIMIT 1")
    rng = NoiseSource()
    acc = [
        _accuracy(path, 1, "exact", rng),
        _accuracy(path, 1, "add_the_deltas", rng),
        _accuracy(path, 5, "exact", rng),
    ]
    return {
        "rows": n_rows,
        "users": 200_000,
        "nonprivate_seconds": min(np_times),
        "nonprivate_count_distinct_seconds": min(distinct_times),
        "dpsql_seconds": min(dp_times),
        "ratio_vs_nonprivate": min(dp_times) / min(np_times),
        "ratio_vs_count_distinct": min(dp_times) / min(distinct_times),
        "peak_rss_mb_process_baseline": base_mem / 1024,
        "peak_rss_mb_nonprivate": np_mem / 1024,
        "peak_rss_mb_dpsql": dp_mem / 1024,
        "groups_released": released,
        "accuracy": acc,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1M rows only, one repetition")
    args = ap.parse_args()
    sizes = [1_000_000] if args.quick else args.rows
    out = {
        "benchmark": "sparse_histogram",
        "epsilon": EPS,
        "delta": DELTA,
        "max_groups_per_unit": CU,
        "query": SQL,
        "target_ratio": 2.0,
        "results": [run(n, 1 if args.quick else args.repeat) for n in sizes],
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "sparse_histogram.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
