"""Benchmark: DP-S4S over a foreign-key join, the drawn sample against the keyed one and the floor.

One command:  python benchmarks/join_sampling.py [--rows 1000000] [--runs 3]
Synthetic, seeded data: ``users`` (the people, rows/40 of them, a country 0-9) and ``events``
(``--rows`` rows, each referencing a user; degree bound 64 per user, enforced; ``amount`` in
[0, 100]). Two queries through ``Session.query`` at q = 1/16 (single owner: the closed form in the
engine):

* ``count``: ``SELECT COUNT(*) FROM events e JOIN users u ON e.user_id = u.user_id``
* ``sum_where``: ``SELECT SUM(e.amount) ... WHERE u.country < 5 AND e.amount > 10``

Each runs in three forms, best of ``--runs`` process CPU seconds (DuckDB's threads included) and
wall seconds: ``drawn`` (the engine's own connection: a per-tuple ``RANDOM()`` draw), ``keyed``
(the same session with ``SaltedDuckDBOps``: the keyed SHA-256 of a text identity per tuple, as
Spark, the portable hash and a caller's connection sample), and ``q1`` (q = 1: the caps, the join
and the truncation with no sampling: the bounding floor), beside ``plain`` (the query itself in
plain DuckDB over the same Arrow tables, 4 threads: no bounding at all). JSON on stdout and in
``benchmarks/out/join_sampling_<rows>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import duckdb
import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dpsql  # noqa: E402
from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
QUERIES = {
    "count": "SELECT COUNT(*) FROM events e JOIN users u ON e.user_id = u.user_id",
    "sum_where": "SELECT SUM(e.amount) FROM events e JOIN users u ON e.user_id = u.user_id "
                 "WHERE u.country < 5 AND e.amount > 10",
}


def tables(rows: int) -> dict[str, pa.Table]:
    g = np.random.default_rng(1)
    n_users = max(1, rows // 40)
    return {"users": pa.table({"user_id": np.arange(n_users), "country": g.integers(0, 10, n_users)}),
            "events": pa.table({"user_id": g.integers(0, n_users, rows), "amount": np.round(g.uniform(0, 100, rows), 2)})}


def session(t: dict[str, pa.Table]) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5))
    s.register("users", t["users"], privacy_unit="user_id")
    s.register("events", t["events"], references={"user_id": "users.user_id"}, degree_bounds={"user_id": 64},
               columns={"amount": {"bounds": (0, 100)}})
    return s


def plain(t: dict[str, pa.Table], sql: str, runs: int) -> dict[str, float]:
    con = duckdb.connect()
    con.execute("SET threads = 4")
    for name, tab in t.items():
        con.register(name, tab)
    cpus, walls = [], []
    for _ in range(runs):
        c0, w0 = cpu(), time.perf_counter()
        con.execute(sql).fetchall()
        cpus.append(cpu() - c0)
        walls.append(time.perf_counter() - w0)
    con.close()
    return {"cpu_s": round(min(cpus), 3), "wall_s": round(min(walls), 3)}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def best(s: dpsql.Session, sql: str, q: float, runs: int) -> dict[str, float]:
    cpus, walls = [], []
    for _ in range(runs):
        c0, w0 = cpu(), time.perf_counter()
        s.query(sql, epsilon=1.0, options={"q": q})
        cpus.append(cpu() - c0)
        walls.append(time.perf_counter() - w0)
    return {"cpu_s": round(min(cpus), 3), "wall_s": round(min(walls), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    t = tables(a.rows)
    s = session(t)
    out: dict[str, object] = {"rows": a.rows, "runs": a.runs, "q": 1 / 16, "load": os.getloadavg()[0]}
    try:
        for name, sql in QUERIES.items():
            res = {}
            s._engine.ops = DuckDBOps()
            res["drawn"] = best(s, sql, 1 / 16, a.runs)
            res["q1"] = best(s, sql, 1.0, a.runs)
            s._engine.ops = SaltedDuckDBOps()
            res["keyed"] = best(s, sql, 1 / 16, a.runs)
            res["plain"] = plain(t, sql, a.runs)
            res["keyed_vs_drawn_cpu"] = round(res["keyed"]["cpu_s"] / max(res["drawn"]["cpu_s"], 1e-9), 2)
            res["drawn_vs_q1_cpu"] = round(res["drawn"]["cpu_s"] / max(res["q1"]["cpu_s"], 1e-9), 2)
            out[name] = res
    finally:
        s.close()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"join_sampling_{a.rows}.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
