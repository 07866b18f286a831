"""Benchmark: Q1-Q3 through dpsql on Spark local[2] and on DuckDB, time and memory side by side.

One command:  python benchmarks/spark.py [--rows 10000000] [--repeat 2] [--master local[2]]
Prints JSON (also written to benchmarks/out/spark.json). Data: the generated events Parquet of
``benchmarks/_events.py`` (heavy-tailed rows per user, Zipf URLs, 50 countries). Queries:

* Q1 ``SELECT country, COUNT(*) FROM events GROUP BY country`` (public keys, C_u = 5, k = 1);
* Q2 ``SELECT url, COUNT(*) FROM events GROUP BY url`` (sparse histogram: the caps bind);
* Q3 ``SELECT country, SUM(likes), AVG(likes) FROM events GROUP BY country`` (bounds [0, 10], k = 3).

Each engine runs in its own process: wall time of ``Session.query`` (bound, run, noise, ledger)
per query (best of ``--repeat``, after one warm-up), the peak resident memory of the process
(and, for Spark, of its JVM), and the bounded aggregates of each query under one fixed salt,
which must be equal on both engines (DuckDB with the portable keyed hash; ``equal`` in the
output). DuckDB is also timed with its native hash, to show what the portable hash costs.
"""

from __future__ import annotations

import argparse
import decimal
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _events import OUT, events_path  # noqa: E402

QUERIES = {
    "Q1": "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
    "Q2": "SELECT url, COUNT(*) AS n FROM events GROUP BY url",
    "Q3": "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events GROUP BY country",
}


def _hwm_kib(pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _jvm_children() -> list[int]:
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == me:
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def run_engine(kind: str, path: str, repeat: int, master: str, keyed_hash: str) -> dict[str, Any]:
    import dpsql

    engine: dict[str, Any] = {"kind": kind, "statement_timeout": 3600, "debug": True}  # synthetic data
    if kind == "spark":
        engine["master"] = master
    else:
        engine["keyed_hash"] = keyed_hash
    out: dict[str, Any] = {"engine": kind if kind == "spark" else f"duckdb ({keyed_hash} hash)", "queries": {}}
    with tempfile.TemporaryDirectory() as tmp:
        s = dpsql.Session(ledger=os.path.join(tmp, "ledger.duckdb"), budget=dpsql.Budget(1e6, 0.5), create=True,
                          engine=engine)
        s.register("events", path, privacy_unit="user_id", max_groups_per_unit=5, max_rows_per_group=3,
                   columns={"country": {"domain": [f"C{i}" for i in range(50)]}, "likes": {"bounds": (0, 10)}})
        for name, sql in QUERIES.items():
            if repeat:
                s.query(sql, epsilon=1.0, delta=1e-6)  # warm-up (JIT, file cache)
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                s.query(sql, epsilon=1.0, delta=1e-6)
                times.append(time.perf_counter() - t)
            r = s._route(sql, 1.0, 1e-6, None)
            ast = r.mechanism.bounded(r.calibration, "benchmark salt", s._engine.ops)
            rows = [{k: (int(v) if isinstance(v, decimal.Decimal) and v == v.to_integral_value() else
                         float(v) if isinstance(v, decimal.Decimal) else v) for k, v in r.items()}
                    for r in s._engine.fetch_arrow(ast).to_pylist()]
            out["queries"][name] = {"seconds": min(times) if times else None, "bounded": rows}
        s.close()
    out["peak_rss_mib_python"] = round(_hwm_kib() / 1024, 1)
    if kind == "spark":
        out["peak_rss_mib_jvm"] = round(sum(_hwm_kib(p) for p in _jvm_children()) / 1024, 1)
    return out


def _canon(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((tuple(sorted((k, float(v) if not isinstance(v, str) and v is not None else v)
                                for k, v in r.items())) for r in rows), key=repr)


def _equal(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    ca, cb = _canon(a), _canon(b)
    if len(ca) != len(cb):
        return False
    for ra, rb in zip(ca, cb, strict=True):
        for (ka, va), (kb, vb) in zip(ra, rb, strict=True):
            if ka != kb:
                return False
            if isinstance(va, float) and isinstance(vb, float):
                if abs(va - vb) > 1e-9 * max(1.0, abs(va), abs(vb)):
                    return False
            elif va != vb:
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "HASH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = events_path(args.rows)
    if args.child:
        print(json.dumps(run_engine(args.child[0], path, args.repeat, args.master, args.child[1]), default=str))
        return
    results = []
    for kind, h in (("duckdb", "portable"), ("duckdb", "native"), ("spark", "portable")):
        proc = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--repeat", str(args.repeat),
                               "--master", args.master, "--child", kind, h], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{kind} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    duck, native, spark = results
    summary: dict[str, Any] = {"rows": args.rows, "master": args.master, "queries": {}}
    for name in QUERIES:
        summary["queries"][name] = {
            "sql": QUERIES[name],
            "duckdb_portable_s": round(duck["queries"][name]["seconds"], 3),
            "duckdb_native_s": round(native["queries"][name]["seconds"], 3),
            "spark_s": round(spark["queries"][name]["seconds"], 3),
            "groups": len(duck["queries"][name]["bounded"]),
            "equal": _equal(duck["queries"][name]["bounded"], spark["queries"][name]["bounded"]),
        }
    summary["memory_mib"] = {
        "duckdb_portable": duck["peak_rss_mib_python"], "duckdb_native": native["peak_rss_mib_python"],
        "spark_driver_python": spark["peak_rss_mib_python"], "spark_jvm": spark.get("peak_rss_mib_jvm"),
    }
    summary["all_equal"] = all(q["equal"] for q in summary["queries"].values())
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "spark.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))
    if not summary["all_equal"]:
        raise SystemExit("the bounded results differ between DuckDB and Spark")


if __name__ == "__main__":
    main()
