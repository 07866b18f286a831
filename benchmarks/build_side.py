"""Benchmark: the cost of keeping each hash join's build side as the bounded query writes it.

One command:  python benchmarks/build_side.py [--orders 1000000] [--repeat 5]
Prints JSON (also written to benchmarks/out/build_side.json).

DuckDB's ``build_side_probe_side`` optimizer builds a hash join's table on the input it estimates
smaller, from the sources' row counts: one person could swap the sides where the estimates cross
(``tests/test_adversary_scan_statistics.py``), so dpsql turns it off for every private read
(``dpsql.engine.duckdb.STATISTICS_OPTIMIZERS``). This measures what that costs on a foreign-key join
of Parquet files (``--orders`` orders, a tenth as many customers), the join written both ways round,
read by DuckDB's own reader (a Session's second read): median CPU time (user + sys, DuckDB's threads
included) and wall time of ``Session.query`` over ``--repeat`` interleaved runs, with the optimizer on
(``swap``, as before) and off (``kept``), and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

QUERIES = {
    "orders_join_customers": "SELECT c.seg, COUNT(*) AS n FROM o JOIN c ON o.ck = c.ck GROUP BY c.seg",
    "customers_join_orders": "SELECT c.seg, COUNT(*) AS n FROM c JOIN o ON o.ck = c.ck GROUP BY c.seg",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--orders", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    import dpsql
    from dpsql.engine import _duckdb_native as native
    from dpsql.engine import duckdb as dd

    native.SETTLE_SECONDS = 0.0
    kept = dd.STATISTICS_OPTIMIZERS
    swap = tuple(o for o in kept if o != "build_side_probe_side")
    n_c = max(args.orders // 10, 1)
    tmp = tempfile.mkdtemp(prefix="dpsql-bench-")
    pq.write_table(pa.table({"ck": list(range(n_c)), "seg": [f"s{i % 3}" for i in range(n_c)]}), f"{tmp}/c.parquet")
    pq.write_table(pa.table({"ok": list(range(args.orders)), "ck": [i % n_c for i in range(args.orders)]}),
                   f"{tmp}/o.parquet")
    sessions = {}
    for name, opts in (("swap", swap), ("kept", kept)):
        dd.STATISTICS_OPTIMIZERS = opts  # read when the engine's own connection is created
        s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
        s.register("c", f"{tmp}/c.parquet", privacy_unit="ck", columns={"seg": {"domain": ["s0", "s1", "s2"]}})
        s.register("o", f"{tmp}/o.parquet", references={"ck": "c.ck"}, degree_bounds={"ck": 10})
        sessions[name] = (s, opts)
    times: dict[str, dict[str, list[tuple[float, float]]]] = {q: {k: [] for k in sessions} for q in QUERIES}
    for r in range(args.repeat + 1):  # the first round (the Arrow view and the text check) is not counted
        for q, sql in QUERIES.items():
            for name, (s, opts) in sessions.items():
                dd.STATISTICS_OPTIMIZERS = opts  # each read turns off the module's list
                c0, w0 = os.times(), time.perf_counter()
                s.query(sql, epsilon=1.0, delta=1e-6)
                c1, w1 = os.times(), time.perf_counter()
                if r:
                    times[q][name].append((c1.user + c1.system - c0.user - c0.system, w1 - w0))
    out: dict[str, Any] = {"orders": args.orders, "customers": n_c, "repeat": args.repeat,
                           "load_average": os.getloadavg()}
    for q, by in times.items():
        med = {k: {"cpu_s": statistics.median(c for c, _ in v), "wall_s": statistics.median(w for _, w in v)}
               for k, v in by.items()}
        out[q] = {**med, "cpu_ratio_kept_over_swap": med["kept"]["cpu_s"] / med["swap"]["cpu_s"]}
    for s, _ in sessions.values():
        s.close()
    text = json.dumps(out, indent=2)
    print(text)
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"), exist_ok=True)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "build_side.json"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
