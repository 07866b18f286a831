"""Benchmark: the Spark engine's fixed costs: registering Parquet sources and the size of join SQL.

One command:  python benchmarks/spark_setup.py [--files 3] [--repeat 3]
Prints JSON (also written to benchmarks/out/spark_setup.json): the wall and CPU time (this process and its
JVM, from /proc) of registering one Parquet file and a glob of ``--files`` files, with the schema read from
the footers on the driver (the engine's path) and through Spark's schema inference (its job, the previous
path, forced here), best of ``--repeat``; and the Spark SQL size (KB) and the count of DuckDB date spellings
(``TYPEOF(``) of the join tests' bounded queries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def tree_cpu() -> float:
    """User + system CPU seconds of this process and its descendants (the JVM), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    info: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            fl = s[s.rindex(")") + 2:].split()
            info[int(d)] = (int(fl[1]), (int(fl[11]) + int(fl[12])) / tick)
    tree, grew = {os.getpid()}, True
    while grew:
        grew = False
        for pid, (parent, _) in info.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(info[p][1] for p in tree if p in info)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    import pyarrow.parquet as pq
    from test_spark import events
    from test_spark_joins import QUERIES, fk_data, make

    from dpsql.engine import EngineSettings
    from dpsql.engine.spark import SparkBackend
    from dpsql.engine.spark_ops import SparkOps, lower_for_spark
    from dpsql.rewrite.render import render

    res: dict[str, Any] = {"load_before": os.getloadavg(), "files": a.files}
    b = SparkBackend(None, EngineSettings())
    with tempfile.TemporaryDirectory() as root:
        for i in range(a.files):
            pq.write_table(events(seed=i), os.path.join(root, f"part-{i}.parquet"))
        for label, source in (("one_file", os.path.join(root, "part-0.parquet")), ("glob", os.path.join(root, "*.parquet"))):
            for how in ("footers", "spark_inference"):
                best: tuple[float, float] | None = None
                for _ in range(a.repeat):
                    saved = SparkBackend._footer_schemas
                    if how == "spark_inference":
                        SparkBackend._footer_schemas = lambda self, paths: None  # type: ignore[method-assign]
                    try:
                        c0, t0 = tree_cpu(), time.perf_counter()
                        b.register_source("t", "parquet", source, view="v")
                        took = (time.perf_counter() - t0, tree_cpu() - c0)
                    finally:
                        SparkBackend._footer_schemas = saved  # type: ignore[method-assign]
                    b.unregister_source("t", "parquet", view="v")
                    best = took if best is None or took[0] < best[0] else best
                assert best is not None
                res[f"register_{label}_{how}"] = {"wall_s": round(best[0], 3), "cpu_s": round(best[1], 3)}
    b.close()
    s = make("duckdb", fk_data())
    for name, (sql, opts) in sorted(QUERIES.items()):
        r = s._route(sql, 1.0, 1e-5, opts)
        text = render(lower_for_spark(r.mechanism.bounded(r.calibration, "bench salt", SparkOps())), dialect="spark")
        res[f"sql_{name}"] = {"kb": round(len(text) / 1024, 1), "date_spellings": text.upper().count("TYPEOF(")}
    s.close()
    res["load_after"] = os.getloadavg()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "spark_setup.json"), "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
