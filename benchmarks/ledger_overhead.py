"""Benchmark: the ledger's cost per query (one reserve and one commit), and what bounds it.

One command:  python benchmarks/ledger_overhead.py [--pairs 50] [--dir DIR] [--history N] [--distinct]
                                                   [--url postgresql://user@host/db]
JSON to stdout and ``benchmarks/out/ledger_overhead.json`` (``ledger_overhead_postgres.json`` with
``--url``). A ledger file is created in a
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

``--url`` measures a PostgreSQL ledger instead (``pip install 'dpsql[postgres]'``): the database
at the URL must hold no ledger (one with a large total is created there) or be one made by an
earlier run of this benchmark (its remaining budget is used). Its figures: ``reserve_ms``,
``commit_ms``, ``pair_ms``, ``read_ms`` and ``cpu_ms`` as above, ``open_and_read_ms`` (opening the
ledger and one read, as a new process or ``dpsql budget`` does), ``server_cpu_ms`` (where the server
runs on this machine: the CPU time of all its processes, read from /proc, per operation, the mean over
each measurement; a ledger's backend does most of an operation's work), and two floors in plain psycopg:
``connect_close_ms`` (one connection opened and closed, what every operation paid when the
ledger kept no connection) and ``round_trip_ms`` (one ``SELECT 1`` on an open connection: a
ledger transaction sends 6 to 9 statements and a COMMIT). ``--history`` applies here too.

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
SERVER_CPU: dict[str, float] = {}


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
    ap.add_argument("--url", default=None, help="measure the PostgreSQL ledger in this database instead of a file")
    args = ap.parse_args()
    if args.url:
        return postgres(args)
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
    write(out, "ledger_overhead.json")


def write(out: dict[str, object], name: str) -> None:
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", name), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


def postgres(args: argparse.Namespace) -> None:
    import psycopg

    from dpsql.errors import LedgerError
    from dpsql.ledger._postgres import redact

    url = args.url
    try:
        led = open_ledger(url, None)  # a ledger of an earlier run
    except LedgerError:
        led = open_ledger(url, dpsql.Budget(1e6, 0.5), create=True)
    if args.history:
        with psycopg.connect(url, autocommit=True) as con:
            con.execute(
                "INSERT INTO ledger_entries (entry_id, created_at, updated_at, status, mechanism, epsilon, delta, "
                "query, tables, params) SELECT i + 1 + (SELECT COALESCE(MAX(entry_id), 0) FROM ledger_entries), "
                "now(), now(), 'released', 'gaussian', "
                + ("0.001 + i * 1e-12" if args.distinct else "0.001 * (1 + i % 7)") + ", "
                "1e-9, 'SELECT 1', ARRAY['t'], '{}' FROM generate_series(0, %s) AS r(i)", [int(args.history) - 1])
    led.close()
    server = _postmaster(url)

    def measure(fn: Callable[[], object], name: str) -> float:
        before = _server_cpu(server)
        ms = med(fn, args.pairs, name)
        after = _server_cpu(server)
        if before is not None and after is not None:
            SERVER_CPU[name] = 1000 * (after - before) / args.pairs
        return ms

    led = open_ledger(url, None)
    led.close()
    opened: list[object] = []

    def open_and_read() -> None:
        opened.append(open_ledger(url, None))
        opened[-1].remaining()  # type: ignore[attr-defined]
        opened[-1].close()  # type: ignore[attr-defined]

    open_and_read_ms = measure(open_and_read, "open_and_read")
    led = open_ledger(url, None)
    cost = dpsql.Budget(0.001, 1e-9)
    ids: list[int] = []

    def reserve() -> None:
        ids.append(led.reserve(cost, mechanism="gaussian", query="SELECT 1", tables=["t"], params={"sigma": 1.0}))

    reserve_ms = measure(reserve, "reserve")
    todo = iter(list(ids))
    commit_ms = measure(lambda: led.commit(next(todo), params_update={"released_rows": 1}), "commit")

    def pair() -> None:
        led.commit(led.reserve(cost, mechanism="gaussian", query="SELECT 1", tables=["t"], params={"sigma": 1.0}))

    pair_ms = measure(pair, "pair")
    read_ms = measure(led.remaining, "read")
    led.close()
    connect_close_ms = med(lambda: psycopg.connect(url).close(), args.pairs)
    with psycopg.connect(url, autocommit=True) as con:
        round_trip_ms = med(lambda: con.execute("SELECT 1").fetchall(), args.pairs)
    out = {
        "benchmark": "ledger_overhead", "ledger": "postgresql", "url": redact(url), "pairs": args.pairs,
        "history_entries": args.history, "distinct": args.distinct, "open_and_read_ms": open_and_read_ms,
        "reserve_ms": reserve_ms, "commit_ms": commit_ms, "pair_ms": pair_ms, "read_ms": read_ms,
        "connect_close_ms": connect_close_ms, "round_trip_ms": round_trip_ms, "cpu_ms": CPU,
        "server_cpu_ms": SERVER_CPU,
        "load_average": os.getloadavg(),
    }
    write(out, "ledger_overhead_postgres.json")



def _postmaster(url: str) -> int | None:
    """The PostgreSQL server's main process, where it runs on this machine (else None)."""
    import psycopg

    with psycopg.connect(url) as con:
        backend = con.info.backend_pid
        try:
            with open(f"/proc/{backend}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{parent}/cmdline", "rb") as f:
                return parent if b"postgres" in f.read() else None
        except (OSError, ValueError, IndexError):
            return None


def _server_cpu(postmaster: int | None) -> float | None:
    """CPU seconds used so far by the server: its main process, its ended children (reaped: counted
    in the main process's cutime/cstime) and its live ones."""
    if postmaster is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")

    def fields(pid: int | str) -> list[str]:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    try:
        main = fields(postmaster)
    except OSError:
        return None
    total = sum(int(x) for x in main[11:15])
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                f = fields(pid)
            except OSError:
                continue
            if int(f[1]) == postmaster:
                total += int(f[11]) + int(f[12])
    return total / tick


if __name__ == "__main__":
    main()
