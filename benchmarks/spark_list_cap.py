"""Benchmark: the cost of the Spark engine's nested caps (``max_list_size``, ``max_text_bytes`` inside lists) on
ordinary data, two source trees interleaved.

One command:  python benchmarks/spark_list_cap.py --base /path/to/other/checkout [--rows 1000000] [--rounds 3]

A Parquet file of ``--rows`` rows, each with a 3-element list of integers (``lst``) and one of three short texts
(``tags``), is registered with the Spark engine (``local[2]``) by one fresh process per tree and round, the trees
alternating, so both see the same machine load. Each process times ``SELECT COUNT(DISTINCT c) FROM v`` and
``SELECT COUNT(*) FROM v WHERE c IS NOT NULL`` over the source view, for each column, best of ``--repeat`` after one
warm-up: wall seconds and CPU seconds of the Spark JVM (user + system, every thread, from ``/proc``). JSON to stdout:
per tree, query and column, the best of every process. The load average is printed beside each round.
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

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD = os.path.dirname(HERE)
QUERIES = {"count_distinct": "SELECT COUNT(DISTINCT {c}) FROM v", "not_null": "SELECT COUNT(*) FROM v WHERE {c} IS NOT NULL"}
COLUMNS = ("lst", "tags")


def _jvm_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(path: str, repeat: int) -> dict[str, Any]:
    from dpsql.engine import EngineSettings
    from dpsql.engine.spark import SparkBackend

    b = SparkBackend(None, EngineSettings())
    b.register_source("t", "parquet", path, view="v")
    pid = int(b.spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    out: dict[str, Any] = {}
    for q, sql in QUERIES.items():
        for c in COLUMNS:
            text = sql.format(c=c)
            b.spark.sql(text).collect()  # warm-up
            best: tuple[float, float] | None = None
            for _ in range(repeat):
                w0, c0 = time.perf_counter(), _jvm_cpu(pid)
                b.spark.sql(text).collect()
                w, cpu = time.perf_counter() - w0, _jvm_cpu(pid) - c0
                best = (w, cpu) if best is None or cpu < best[1] else best
            assert best is not None
            out[f"{q}.{c}"] = {"wall": round(best[0], 3), "cpu": round(best[1], 3)}
    b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the other checkout of dpsql")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.repeat)))
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = a.rows
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lists.parquet")
        ints = pa.ListArray.from_arrays(pa.array(range(0, 3 * n + 1, 3), pa.int32()),
                                        pa.array([i % 1000 for i in range(3 * n)], pa.int32()))
        words = pa.array([f"tag{i % 50}" for i in range(3 * n)], pa.string())
        tags = pa.ListArray.from_arrays(pa.array(range(0, 3 * n + 1, 3), pa.int32()), words)
        pq.write_table(pa.table({"uid": pa.array(range(n), pa.int64()), "lst": ints, "tags": tags}), path)
        results: dict[str, list[dict[str, Any]]] = {"head": [], "base": []}
        for r in range(a.rounds):
            for tree, root in (("base", a.base), ("head", HEAD)) if r % 2 else (("head", HEAD), ("base", a.base)):
                env = {**os.environ, "PYTHONPATH": root}
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--base", a.base, "--child", path,
                                       "--repeat", str(a.repeat)], env=env, capture_output=True, text=True, check=True)
                results[tree].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(f"round {r} {tree}: load average {os.getloadavg()}", file=sys.stderr)
    summary = {tree: {k: {m: sorted(run[k][m] for run in runs) for m in ("wall", "cpu")} for k in runs[0]}
               for tree, runs in results.items()}
    for tree, per in summary.items():
        for k, v in per.items():
            print(tree, k, json.dumps(v))


if __name__ == "__main__":
    main()
