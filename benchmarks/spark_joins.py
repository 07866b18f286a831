"""Benchmark: a DP-S4S join query through dpsql on Spark local[2] and on DuckDB, side by side.

One command:  python benchmarks/spark_joins.py [--size 1m|10m | --rows N] [--master local[2]] [--quick]
Prints JSON (also written to benchmarks/out/spark_joins.json, or spark_joins_<size>.json with
--size). Data (generated once into a
temporary directory): ``customer`` (rows / 40 customers, the people), ``orders`` (0..16 per
customer, declared <= 16) and ``lineitem`` (``--rows`` line items, 1..7 per order, declared
<= 8). Query: ``SUM(l.l_price)`` over customer JOIN orders JOIN lineitem WHERE c_nationkey < 4.

Each engine runs in its own process: wall time of ``Session.query`` (join, caps, sample,
truncation in the engine, noise, ledger) at q = 1/16 and at q = 1, after one warm-up (``--quick``:
no warm-up, q = 1/16 only, for the largest sizes on a small machine), the truncated sums of the
bounded query under one fixed salt, which must be equal on Spark and on DuckDB with the portable
keyed hash (``equal`` in the output), and the peak resident memory of the engine's process (and,
for Spark, of its JVM: in local mode the driver runs the executors). DuckDB is also timed with
its native hash.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from spark import _hwm_kib, _jvm_children  # noqa: E402 - the sibling benchmark's /proc readers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
SIZES = {"1m": 1_000_000, "10m": 10_000_000}
SQL = ("SELECT SUM(l.l_price) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
       "JOIN lineitem l ON o.o_orderkey = l.l_orderkey WHERE c.c_nationkey < 4")


def make_data(root: str, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    g = np.random.default_rng(1)
    n_c = max(1, rows // 40)
    o_cust = np.repeat(np.arange(n_c), g.integers(0, 17, n_c))
    o_key = np.arange(o_cust.size)
    l_ord = np.repeat(o_key, g.integers(1, 8, o_key.size))[:rows]
    pq.write_table(pa.table({"c_custkey": np.arange(n_c), "c_nationkey": g.integers(0, 5, n_c)}),
                   os.path.join(root, "customer.parquet"))
    pq.write_table(pa.table({"o_orderkey": o_key, "o_custkey": o_cust}), os.path.join(root, "orders.parquet"))
    pq.write_table(pa.table({"l_orderkey": l_ord, "l_price": np.round(g.uniform(-20, 100, l_ord.size), 2)}),
                   os.path.join(root, "lineitem.parquet"))


def run_engine(kind: str, root: str, master: str, keyed_hash: str, quick: bool = False) -> dict[str, Any]:
    import dpsql
    from dpsql.testing import use_noise, zero_noise

    engine: dict[str, Any] = {"kind": kind, "statement_timeout": 3600}
    if kind == "duckdb":
        engine["keyed_hash"] = keyed_hash
    else:
        engine["master"] = master
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 0.5), engine=engine)
    use_noise(s, zero_noise(3))
    s.register("customer", os.path.join(root, "customer.parquet"), privacy_unit="c_custkey")
    s.register("orders", os.path.join(root, "orders.parquet"), references={"o_custkey": "customer.c_custkey"},
               degree_bounds={"o_custkey": 16})
    s.register("lineitem", os.path.join(root, "lineitem.parquet"), references={"l_orderkey": "orders.o_orderkey"},
               degree_bounds={"l_orderkey": 8}, columns={"l_price": {"bounds": (-20, 100)}})
    out: dict[str, Any] = {}
    if not quick:
        s.query(SQL, epsilon=1.0, options={"q": 1 / 16})  # warm-up
    for q in (1 / 16,) if quick else (1 / 16, 1.0):
        t = time.perf_counter()
        s.query(SQL, epsilon=1.0, options={"q": q})
        out[f"seconds_q={q:g}"] = round(time.perf_counter() - t, 2)
    r = s._route(SQL, 1.0, 0.0, {"q": 1 / 16})
    t = time.perf_counter()
    out["bounded"] = s._engine.fetch_arrow(r.mechanism.bounded(r.calibration, "bench salt", s._engine.ops)).to_pylist()
    out["seconds_bounded_query_only"] = round(time.perf_counter() - t, 2)
    out["peak_rss_mib_python"] = round(_hwm_kib() / 1024, 1)
    if kind == "spark":
        out["peak_rss_mib_jvm"] = round(sum(_hwm_kib(p) for p in _jvm_children()) / 1024, 1)
    s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--size", choices=sorted(SIZES), help="line items: 1m or 10m (overrides --rows)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="no warm-up, q = 1/16 only")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "HASH", "ROOT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.size:
        a.rows = SIZES[a.size]
    if a.child:
        print(json.dumps(run_engine(a.child[0], a.child[2], a.master, a.child[1], a.quick)))
        return
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        make_data(root, a.rows)
        res: dict[str, Any] = {"rows": a.rows, "query": SQL, "master": a.master, "quick": a.quick, "cpus": os.cpu_count(),
                               "seconds_data_generation": round(time.perf_counter() - t0, 1)}
        for kind, h in (("duckdb", "native"), ("duckdb", "portable"), ("spark", "portable")):
            t0 = time.perf_counter()
            cmd = [sys.executable, __file__, "--master", a.master, "--child", kind, h, root] + (["--quick"] if a.quick else [])
            p = subprocess.run(cmd, capture_output=True, text=True, check=True)
            res[f"{kind}_{h}"] = json.loads(p.stdout.strip().splitlines()[-1])
            res[f"{kind}_{h}"]["seconds_process"] = round(time.perf_counter() - t0, 1)
    res["equal"] = res["duckdb_portable"]["bounded"] == res["spark_portable"]["bounded"]
    for k in ("duckdb_native", "duckdb_portable", "spark_portable"):
        res[k].pop("bounded")
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"spark_joins_{a.size}.json" if a.size else "spark_joins.json"), "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
