"""Benchmark: wall time of one ``dpsql query`` on the bundled example data, end to end.

One command:  python benchmarks/cli_startup.py [--repeat 5]
JSON to stdout and ``benchmarks/out/cli_startup.json``. The example directory is copied to a
temporary directory (its ledger is created there on the first run, which is not timed); each
timed run is a new process: ``python -m dpsql.cli --config dpsql.toml query "SELECT country,
COUNT(*) AS n FROM events GROUP BY country" --epsilon 0.01 --delta 1e-8``. Also timed: the
import of ``dpsql.cli`` alone, the CPU seconds of each query process (close to its wall time on an
idle machine, and much less sensitive to load), and which heavy modules a query process never imports (scipy.stats,
scipy.optimize's linear programming, pyarrow.dataset). Target from the issue: under 1 s.

The timed processes run with Python's default bytecode cache (``__pycache__``, written by the
untimed first run), whatever the caller's ``PYTHONDONTWRITEBYTECODE``; the same query with
``PYTHONDONTWRITEBYTECODE=1`` (every process compiles dpsql's modules from source) is reported too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SQL = "SELECT country, COUNT(*) AS n FROM events GROUP BY country"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # Python's default: compiled modules are cached (__pycache__) on the first run and loaded from
    # then on. PYTHONDONTWRITEBYTECODE in the caller's environment would make every timed process
    # compile dpsql's modules from source again; that case is measured separately below.
    nocache = dict(env, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as tmp:
        ex = os.path.join(tmp, "examples")
        shutil.copytree(os.path.join(ROOT, "examples"), ex)
        cmd = [sys.executable, "-m", "dpsql.cli", "--config", "dpsql.toml", "query", SQL, "--epsilon", "0.01",
               "--delta", "1e-8"]
        subprocess.run(cmd, cwd=ex, env=env, check=True, capture_output=True)  # creates the ledger
        walls, cpus = [], []
        for _ in range(args.repeat):
            c = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(cmd, cwd=ex, env=env, check=True, capture_output=True)
            walls.append(time.perf_counter() - t)
            c2 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(c2.ru_utime - c.ru_utime + c2.ru_stime - c.ru_stime)
        walls_nocache = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run(cmd, cwd=ex, env=nocache, check=True, capture_output=True)
            walls_nocache.append(time.perf_counter() - t)
        probe = ("import sys, runpy; sys.argv = " + repr(["dpsql", "--config", "dpsql.toml", "query", SQL,
                 "--epsilon", "0.01", "--delta", "1e-8"]) + "\ntry:\n    runpy.run_module('dpsql.cli', run_name='__main__')\n"
                 "except SystemExit:\n    pass\nprint(sorted(m for m in ('scipy.stats', 'scipy.sparse', 'pyarrow.dataset', "
                 "'dpsql.mechanisms.s4s') if m in sys.modules), file=sys.stderr)")
        loaded = subprocess.run([sys.executable, "-c", probe], cwd=ex, env=env, capture_output=True, text=True)
        imports = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import dpsql.cli"], env=env, check=True)
            imports.append(time.perf_counter() - t)
        bare = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
            bare.append(time.perf_counter() - t)
    out = {
        "benchmark": "cli_startup", "command": "dpsql --config dpsql.toml query " + json.dumps(SQL),
        "query_wall_seconds_best": min(walls), "query_wall_seconds_median": sorted(walls)[len(walls) // 2],
        # CPU seconds (user + system) of the query process: what the wall time is on an idle
        # machine (a query process is mostly single-threaded), and far less sensitive to load
        "query_cpu_seconds_best": min(cpus), "query_cpu_seconds_median": sorted(cpus)[len(cpus) // 2],
        # the same with PYTHONDONTWRITEBYTECODE=1: every process compiles dpsql's modules again
        "query_wall_seconds_best_without_bytecode_cache": min(walls_nocache),
        "import_dpsql_cli_seconds_best": min(imports), "python_startup_seconds_best": min(bare),
        "heavy_modules_loaded_by_a_query": loaded.stderr.strip().splitlines()[-1:] if loaded.stderr else None,
        "target_seconds": 1.0, "load_average": os.getloadavg(),
    }
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", "cli_startup.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
