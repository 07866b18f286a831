"""Benchmark: GROUP BY over a long declared key domain on Spark local[2] (docs/spark.md, "Long declared key
domains").

One command:  python benchmarks/spark_domains.py [--keys 10000,100000] [--runs 3] [--engine spark|duckdb]
JSON to stdout and ``benchmarks/out/spark_domains.json``.

``SELECT k, COUNT(*) FROM t GROUP BY k`` over 20 000 rows of 3000 users, ``k`` declared with each number of text
values (C_u = 5, L = 3, zero noise), ``--runs`` queries in turn in one process (the first starts the JVM): wall
seconds and CPU seconds of the process and its children (the JVM), the length of each Spark SQL text rendered,
and a digest of the last release (equal across engines and trees for the same ``--runs``: the salts are drawn
from the seeded test RNG in turn).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import dpsql  # noqa: E402
from dpsql.testing import use_noise, zero_noise  # noqa: E402


def _tree(pid: int) -> list[int]:
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out += _tree(int(child))
    except OSError:
        pass
    return out


def cpu_seconds() -> float:
    """CPU of this process and its descendants (the JVM), from /proc (Linux)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for p in _tree(os.getpid()):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


def run(n_keys: int, runs: int, engine_kind: str) -> dict[str, Any]:
    keys = [f"key{i:06d}" for i in range(n_keys)]
    g = np.random.default_rng(1)
    rows = 20_000
    t = pa.table({"u": g.integers(0, 3000, rows), "k": np.array([*keys, "zz"])[g.integers(0, n_keys + 1, rows)],
                  "v": g.integers(0, 10, rows)})
    engine: dict[str, Any] = {"kind": engine_kind, "statement_timeout": 3600}
    if engine_kind == "duckdb":
        engine["keyed_hash"] = "portable"
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), engine=engine)
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="u", max_groups_per_unit=5, max_rows_per_group=3,
               columns={"k": {"domain": keys}, "v": {"bounds": (0, 10)}})
    be = s._engine
    lengths: list[int] = []
    render = be.render

    def recorded(ast: Any, **kw: Any) -> str:
        out = render(ast, **kw)
        lengths.append(len(out))
        return out

    be.render = recorded  # type: ignore[method-assign]
    out: dict[str, Any] = {"keys": n_keys, "engine": engine_kind, "runs": []}
    for _ in range(runs):
        lengths.clear()
        w0, c0 = time.perf_counter(), cpu_seconds()
        r = s.query("SELECT k, COUNT(*) AS n FROM t GROUP BY k", epsilon=1.0, delta=1e-6)
        out["runs"].append({"wall_s": round(time.perf_counter() - w0, 2), "cpu_s": round(cpu_seconds() - c0, 2),
                            "sql_chars": list(lengths), "rows": r.table.num_rows})
        print(json.dumps(out["runs"][-1]), file=sys.stderr, flush=True)
    out["digest"] = hashlib.sha256(repr(r.table.to_pylist()).encode()).hexdigest()[:16]
    s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="10000,100000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engine", default="spark", choices=["spark", "duckdb"])
    a = ap.parse_args()
    res = [run(int(k), a.runs, a.engine) for k in a.keys.split(",")]
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", "spark_domains.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
