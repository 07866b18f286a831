"""Benchmark: the ledger's cost per query (one reserve and one commit), and what bounds it.

One command:  python benchmarks/ledger_overhead.py [--pairs 50] [--dir DIR] [--history N] [--distinct]
JSON to stdout and ``benchmarks/out/ledger_overhead.json``. A ledger file is created in a
temporary directory (``--dir``: on the file system to measure), then, with the median of
``--pairs`` runs each (milliseconds):

* ``reserve_ms``, ``commit_ms``, ``pair_ms``: dpsql's two durable writes of one query (flock,
  ATTACH, schema and generation checks, the change, COMMIT with its WAL fdatasync, generation
  markers, CHECKPOINT into the main file, DETACH);
* ``read_ms``: a read-only operation (``Ledger.remaining``);
* the same steps in plain DuckDB on a copy of the ledger file, without dpsql: ``attach_detach_ms``
  (opening and closing the file), ``attach_first_query_detach_ms`` (plus one query, which loads
  the catalog from the file), ``attach_write_checkpoint_detach_ms`` (one durable write of the
  same shape: the floor of a durable write that keeps nothing open between operations);
* ``fdatasync_ms``: one small write and fdatasync on the same file system;
* ``cpu_ms``: the median CPU time (user + system of this process) of each dpsql operation above, which
  other work on a shared machine inflates far less than the wall times.

``--history N`` first fills the ledger with N earlier charges (a long-lived ledger: the budget
check reads every counted charge, grouped by value in SQL), written straight into the file.
``--distinct`` makes every one of them a different epsilon (an analyst who never repeats a value:
the grouping then saves nothing, and the exact sum does all the work).

Target from the issue: pair_ms <= 20. The load average is recorded: other work on the machine
changes these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import duckdb  # noqa: E402

import dpsql  # noqa: E402
from dpsql.ledger import open_ledger  # noqa: E402

CPU: dict[str, float] = {}


def med(fn: Callable[[], object], n: int, name: str = "") -> float:
    ts, cpu = [], []
    for _ in range(n):
        t, c = time.perf_counter(), time.process_time()
        fn()
        ts.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    if name:
        CPU[name] = 1000 * statistics.median(cpu)
    return 1000 * statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--history", type=int, default=0, help="earlier charges in the ledger before measuring")
    ap.add_argument("--distinct", action="store_true", help="every earlier charge a different epsilon")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dpsql-ledger-", dir=args.dir)
    try:
        path = os.path.join(d, "ledger.duckdb")
        led = open_ledger(path, dpsql.Budget(1e6, 0.5), create=True)
        if args.history:
            led.close()
            con = duckdb.connect(path)
            con.execute(
                "INSERT INTO ledger_entries (entry_id, created_at, updated_at, status, mechanism, epsilon, delta, "
                "query, tables, params) SELECT i + 1, now(), now(), 'released', 'gaussian', "
                + ("0.001 + i * 1e-12" if args.distinct else "0.001 * (1 + i % 7)") + ", "
                f"1e-9, 'SELECT 1', ['t'], '{{}}' FROM range({int(args.history)}) AS r(i)")
            con.close()
            led = open_ledger(path, None)
        cost = dpsql.Budget(0.001, 1e-9)
        ids: list[int] = []

        def reserve() -> None:
            ids.append(led.reserve(cost, mechanism="gaussian", query="SELECT 1", tables=["t"], params={"sigma": 1.0}))

        reserve_ms = med(reserve, args.pairs, "reserve")
        todo = iter(list(ids))
        commit_ms = med(lambda: led.commit(next(todo), params_update={"released_rows": 1}), args.pairs, "commit")

        def pair() -> None:
            led.commit(led.reserve(cost, mechanism="gaussian", query="SELECT 1", tables=["t"], params={"sigma": 1.0}))

        pair_ms = med(pair, args.pairs, "pair")
        read_ms = med(led.remaining, args.pairs, "read")
        led.close()

        copy = os.path.join(d, "copy.duckdb")
        shutil.copy(path, copy)
        base = duckdb.connect(":memory:", config={"threads": 1})

        def attach_detach() -> None:
            base.execute(f"ATTACH '{copy}' AS x")
            base.execute("DETACH x")

        def attach_query() -> None:
            base.execute(f"ATTACH '{copy}' AS x")
            base.execute("SELECT COUNT(*) FROM x.ledger_entries").fetchall()
            base.execute("DETACH x")

        def attach_write() -> None:
            base.execute(f"ATTACH '{copy}' AS x")
            c = base.cursor()
            c.execute("BEGIN TRANSACTION")
            c.execute("UPDATE x.ledger_meta SET value = CAST(CAST(value AS BIGINT) + 1 AS VARCHAR) "
                      "WHERE key = 'generation'")
            c.execute("COMMIT")
            c.execute("CHECKPOINT x")
            c.close()
            base.execute("DETACH x")

        raw = {
            "attach_detach_ms": med(attach_detach, args.pairs),
            "attach_first_query_detach_ms": med(attach_query, args.pairs),
            "attach_write_checkpoint_detach_ms": med(attach_write, args.pairs),
        }
        fd = os.open(os.path.join(d, "sync"), os.O_CREAT | os.O_WRONLY, 0o600)

        def sync() -> None:
            os.write(fd, b"x")
            os.fdatasync(fd)

        raw["fdatasync_ms"] = med(sync, args.pairs)
        os.close(fd)
        out = {
            "benchmark": "ledger_overhead", "pairs": args.pairs, "history_entries": args.history, "distinct": args.distinct,
            "ledger_bytes": os.path.getsize(path),
            "reserve_ms": reserve_ms, "commit_ms": commit_ms, "pair_ms": pair_ms, "read_ms": read_ms, **raw,
            "cpu_ms": CPU, "target_pair_ms": 20.0, "load_average": os.getloadavg(),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", "ledger_overhead.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
