"""Benchmark: dpsql on spread-out data, where almost every (user, url) pair is distinct.

One command:  python benchmarks/spread.py [--rows 10000000] [--users 500000] [--urls 100000]
JSON to stdout and ``benchmarks/out/spread_<rows>.json``.

Data (``_events.spread_path``): users and URLs uniform, so about ``rows`` distinct (user, url)
pairs and every user has far more than C_u = 5 URLs (each user's group cap makes a choice). Each
measurement runs in a fresh child process (cold DuckDB, warm file cache), which reports its wall
seconds and its peak resident set size above its level before the query:

* ``count_distinct``: plain ``SELECT COUNT(DISTINCT user_id) FROM events`` (DuckDB, read_parquet);
* ``count_distinct_by_url``: the same query without privacy, ``SELECT url, COUNT(DISTINCT user_id)
  FROM events GROUP BY url`` (users per URL, what the private query estimates);
* ``distinct_pairs``: plain ``SELECT DISTINCT user_id, url`` aggregation (its peak memory is the
  reference for the bounded query's);
* ``floor``: ``SELECT url, COUNT(*) FROM (SELECT DISTINCT user_id, url FROM events) GROUP BY url``;
* ``dpsql``: ``Session.query("SELECT url, COUNT(*) FROM events GROUP BY url")`` end to end
  (epsilon 1, delta 1e-5, C_u 5, k 1, in-memory ledger), with dpsql's default engine settings
  (memory limit 4GB, spilling to a temporary directory of its own): the process's first query,
  which checks the file's text and then reads it with DuckDB's own reader (docs/performance.md);
* ``dpsql_warm``: the same query as the process's third (after two untimed ones; the first
  checked the file's text once), read by DuckDB's own reader: what a long-lived process (the
  Python API, an ETL job) sees from then on. Its ``peak_mb`` is above the level after the two
  earlier queries (DuckDB keeps its buffers), so ``peak_mb_since_start`` (the child's peak
  above its size before it imported anything) is reported for every step too;
* ``dpsql_replace``: the process's first query with the engine setting ``invalid_text =
  "replace"`` (invalid UTF-8 replaced; DuckDB's own reader from the first read).

Each step also reports its CPU seconds (user + system of the child, every thread, during the
measured call: ``cpu_seconds`` of the fastest run, ``cpu_seconds_min`` over the runs) and the
1-minute load average after each run (``load_averages``): the machine may be shared.

Targets from the issue: dpsql within 2x of plain ``COUNT(DISTINCT user_id)`` time (both forms are
reported: the global count is a much smaller job than any per-URL count, which must find the
distinct (user, url) pairs that the global count never builds) and 1.5x of ``distinct_pairs``
peak memory.

Out-of-core mode: ``--memory-limit 400MB`` runs every measurement under that DuckDB memory limit
(dpsql through its ``memory_limit`` engine setting, spilling to its own temporary directory; the
plain queries with the same limit and a temporary directory), so 10M rows under 400MB stand in
for 100M rows under dpsql's default 4GB. A measurement that fails records its error class and
message (``"failed"``) instead of a time: one command shows whether each step completes.

``--statement-timeout SECONDS`` raises dpsql's time-out (default: the engine's, 300 s) for runs
at 100M rows on a loaded machine. ``--kinds dpsql`` measures only the listed steps and takes
the others from the JSON an earlier run of the same configuration wrote (listed as
``"reused"``), so a long reference need not be measured again.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from _events import OUT, spread_path  # noqa: E402


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_START_RSS = 0  # the child's resident size before it imports or opens anything (set in _child)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _measure(fn: Any) -> tuple[float, float]:
    global _CPU
    base = peak = _rss()
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.005):
            peak = max(peak, _rss())

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t, c = time.perf_counter(), _cpu()
    fn()
    dt = time.perf_counter() - t
    _CPU = _cpu() - c
    stop.set()
    th.join()
    global _PEAK_SINCE_START
    _PEAK_SINCE_START = (max(peak, _rss()) - _START_RSS) / 2**20
    return dt, (max(peak, _rss()) - base) / 2**20


_PEAK_SINCE_START = 0.0
_CPU = 0.0  # the child's CPU seconds (user + system, every thread) during the measured call


def _child(kind: str, path: str, conn: Any, memory_limit: str | None, timeout: float | None) -> None:
    global _START_RSS
    _START_RSS = _rss()
    try:
        _child_run(kind, path, conn, memory_limit, timeout)
    except Exception as e:  # a failure is a result here (synthetic data): its class and message
        detail = getattr(e, "debug_detail", None)  # the engine's own message (debug, synthetic data)
        conn.send(("failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                   + (f" ({str(detail).splitlines()[0]})" if detail else "")))


def _child_run(kind: str, path: str, conn: Any, memory_limit: str | None, timeout: float | None) -> None:
    import tempfile

    import duckdb

    from dpsql.engine import EngineSettings

    # URLs are short: a cap of 4 kB lets a small memory_limit keep its threads (EngineSettings.read_threads)
    engine: dict[str, Any] = {"memory_limit": memory_limit, "debug": True, "max_text_bytes": 4096} if memory_limit else {}
    threads = EngineSettings(**engine).effective_threads
    if kind in ("dpsql", "dpsql_warm", "dpsql_replace"):
        import dpsql

        if kind == "dpsql_replace":  # the owner's choice: invalid UTF-8 replaced, DuckDB's own reader
            engine["invalid_text"] = "replace"
        if timeout is not None:
            engine["statement_timeout"] = timeout
        s = dpsql.Session(ledger=None, budget=dpsql.Budget(100.0, 1e-3), engine=engine or None)
        s.register("events", path, privacy_unit="user_id", max_groups_per_unit=5, max_rows_per_group=1)
        s.explain("SELECT url, COUNT(*) AS n FROM events GROUP BY url", epsilon=1.0, delta=1e-5)
        if kind == "dpsql_warm":  # the process's steady state: the file's text checked (by its first read)
            for _ in range(2):
                s.query("SELECT url, COUNT(*) AS n FROM events GROUP BY url", epsilon=1.0, delta=1e-5)
        out: list[Any] = []
        dt, mb = _measure(lambda: out.append(s.query("SELECT url, COUNT(*) AS n FROM events GROUP BY url",
                                                      epsilon=1.0, delta=1e-5).table.num_rows))
        conn.send((dt, mb, out[0], _PEAK_SINCE_START, _CPU))
        return
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SET threads = {threads}")
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute(f"SET temp_directory = '{tempfile.mkdtemp(prefix='spread-spill-')}'")
        con.execute("SET preserve_insertion_order = false")
    src = f"read_parquet('{path}')"
    q = {
        "count_distinct": f"SELECT COUNT(DISTINCT user_id) FROM {src}",
        "count_distinct_by_url": f"SELECT url, COUNT(DISTINCT user_id) FROM {src} GROUP BY url",
        "distinct_pairs": f"SELECT COUNT(*) FROM (SELECT DISTINCT user_id, url FROM {src})",
        "floor": f"SELECT url, COUNT(*) FROM (SELECT DISTINCT user_id, url FROM {src}) GROUP BY url",
    }[kind]
    res: list[Any] = []
    dt, mb = _measure(lambda: res.append(len(con.execute(q).fetchall())))
    conn.send((dt, mb, res[0], _PEAK_SINCE_START, _CPU))


def run(kind: str, path: str, memory_limit: str | None, timeout: float | None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_child, args=(kind, path, b, memory_limit, timeout))
    p.start()
    got = a.recv()
    p.join()
    if got[0] == "failed":
        return {"failed": got[1]}
    dt, mb, rows, since_start, cpu = got
    return {"seconds": dt, "cpu_seconds": cpu, "peak_mb": mb, "rows": rows, "peak_mb_since_start": since_start,
            "load_average": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--users", type=int, default=500_000)
    ap.add_argument("--urls", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2, help="child processes per measurement (best time kept)")
    ap.add_argument("--memory-limit", default=None, help="DuckDB memory limit for every measurement, e.g. 400MB "
                    "(out-of-core mode); default: dpsql's default settings and DuckDB's for the plain queries")
    ap.add_argument("--statement-timeout", type=float, default=None,
                    help="dpsql's statement time-out in seconds (default: the engine's default)")
    ap.add_argument("--kinds", default="count_distinct,count_distinct_by_url,distinct_pairs,floor,dpsql,dpsql_warm,"
                    "dpsql_replace",
                    help="steps to measure; the others are read from this configuration's earlier JSON")
    args = ap.parse_args()
    path = spread_path(args.rows, args.users, args.urls)
    os.makedirs(OUT, exist_ok=True)
    suffix = f"_{args.memory_limit}" if args.memory_limit else ""
    out_path = os.path.join(OUT, f"spread_{args.rows}{suffix}.json")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    earlier: dict[str, Any] = {}
    if os.path.exists(out_path):
        with open(out_path) as f:
            earlier = json.load(f)
    results: dict[str, Any] = {}
    reused: list[str] = []
    for kind in ("count_distinct", "count_distinct_by_url", "distinct_pairs", "floor", "dpsql", "dpsql_warm",
                 "dpsql_replace"):
        if kind not in kinds:
            if kind not in earlier.get("results", {}):
                raise SystemExit(f"no earlier measurement of {kind} in {out_path}: measure it (--kinds)")
            results[kind] = earlier["results"][kind]
            reused.append(kind)
            continue
        runs = [run(kind, path, args.memory_limit, args.statement_timeout) for _ in range(args.repeat)]
        done = [r for r in runs if "failed" not in r]
        if done:
            results[kind] = min(done, key=lambda r: r["seconds"])
            results[kind]["peak_mb"] = max(r["peak_mb"] for r in done)
            results[kind]["peak_mb_since_start"] = max(r["peak_mb_since_start"] for r in done)
            results[kind]["cpu_seconds_min"] = min(r["cpu_seconds"] for r in done)
            results[kind]["load_averages"] = [r["load_average"] for r in done]
        else:
            results[kind] = {"seconds": None, "peak_mb": None, "failed": runs[0]["failed"]}
    d, w = results["dpsql"], results["dpsql_warm"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / max(b, 1e-9) if a is not None and b is not None else None

    out = {
        "benchmark": "spread", "rows": args.rows, "users": args.users, "urls": args.urls,
        "memory_limit": args.memory_limit, "statement_timeout": args.statement_timeout, "reused": reused,
        "completed": {k: "failed" not in r for k, r in results.items()},
        "load_average": os.getloadavg(), "results": results,
        "dpsql_time_vs_count_distinct": ratio(d["seconds"], results["count_distinct"]["seconds"]),
        "dpsql_time_vs_count_distinct_by_url": ratio(d["seconds"], results["count_distinct_by_url"]["seconds"]),
        "dpsql_time_vs_floor": ratio(d["seconds"], results["floor"]["seconds"]),
        "dpsql_cpu_vs_count_distinct_by_url": ratio(d.get("cpu_seconds_min"),
                                                    results["count_distinct_by_url"].get("cpu_seconds_min")),
        "dpsql_memory_vs_distinct_pairs": ratio(d["peak_mb"], results["distinct_pairs"]["peak_mb"]),
        "warm_time_vs_count_distinct_by_url": ratio(w["seconds"], results["count_distinct_by_url"]["seconds"]),
        "warm_time_vs_floor": ratio(w["seconds"], results["floor"]["seconds"]),
        "warm_memory_vs_distinct_pairs": ratio(w["peak_mb"], results["distinct_pairs"]["peak_mb"]),
        "replace_time_vs_count_distinct_by_url": ratio(results["dpsql_replace"]["seconds"],
                                                       results["count_distinct_by_url"]["seconds"]),
        "replace_memory_vs_distinct_pairs": ratio(results["dpsql_replace"]["peak_mb"],
                                                  results["distinct_pairs"]["peak_mb"]),
        "warm_memory_since_start_vs_distinct_pairs": ratio(w.get("peak_mb_since_start"),
                                                           results["distinct_pairs"].get("peak_mb_since_start")),
        "targets": {"time_vs_count_distinct": 2.0, "memory_vs_distinct_pairs": 1.5},
    }
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
