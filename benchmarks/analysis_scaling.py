"""Benchmark: CPU seconds of ``Session.explain`` (analysis, routing, bind check; no private row read) for a
query of N aggregates, for several N, on four shapes.

One command:  python benchmarks/analysis_scaling.py [--ns 50,100,200,400] [--join-ns 8,16,32,64]
                                                  [--shapes flat,view,group_by,join]
JSON to stdout and ``benchmarks/out/analysis_scaling.json``.

Shapes (N distinct aggregates, each its own released value):
  flat      SELECT SUM(CASE WHEN age > i THEN 1 ELSE 0 END) AS w<i>, ... FROM events
  view      the same over WITH v AS (SELECT * FROM events)
  group_by  SELECT country, <the same> FROM events GROUP BY country
  join      SELECT SUM(LEAST(GREATEST(l.price, 0), i + 1)) AS w<i>, ... FROM orders o JOIN lineitem l ...
            (DP-S4S: each aggregate is its own run of the join mechanism, so its cost per aggregate is larger;
            at most ``MAX_JOIN_AGGREGATES`` = 64 of them: ``--join-ns``)
Also: the CPU seconds of the refusal of a query one aggregate above ``MAX_AGGREGATES`` (flat shape).

Each figure is the process's CPU time (user + sys) around one ``explain`` after a warm-up query of
the same shape, with its ratio to the figure for the previous N (2.0 per doubling is linear). The load
average is recorded: other work on the machine slows CPU time less than wall time, but not to nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import dpsql

OUT = Path(__file__).resolve().parent / "out" / "analysis_scaling.json"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def flat_session() -> dpsql.Session:
    g = np.random.default_rng(0)
    n = 2000
    t = pa.table({"user_id": np.arange(n), "age": g.integers(0, 100, n), "amount": g.uniform(0, 100, n),
                  "country": np.array(["US", "FR", "DE"])[g.integers(0, 3, n)]})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    s.register("events", t, privacy_unit="user_id", max_groups_per_unit=2,
               columns={"amount": {"bounds": (0, 100)}, "age": {"bounds": (0, 120)},
                        "country": {"domain": ["US", "FR", "DE"]}})
    return s


def join_session() -> dpsql.Session:
    g = np.random.default_rng(1)
    cust = np.arange(300)
    o_cust = np.repeat(cust, g.integers(1, 9, cust.size))
    o_key = np.arange(o_cust.size)
    l_order = np.repeat(o_key, g.integers(1, 5, o_key.size))
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    s.register("customer", pa.table({"c_custkey": cust}), privacy_unit="c_custkey")
    s.register("orders", pa.table({"o_orderkey": o_key, "o_custkey": o_cust}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8})
    s.register("lineitem", pa.table({"l_orderkey": l_order, "l_price": g.uniform(-20, 100, l_order.size)}),
               references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 4},
               columns={"l_price": {"bounds": (-20, 100)}})
    return s


def case_sums(n: int) -> str:
    return ", ".join(f"SUM(CASE WHEN age > {i} THEN 1 ELSE 0 END) AS w{i}" for i in range(n))


SHAPES: dict[str, tuple[Callable[[], dpsql.Session], Callable[[int], str]]] = {
    "flat": (flat_session, lambda n: f"SELECT {case_sums(n)} FROM events"),
    "view": (flat_session, lambda n: f"WITH v AS (SELECT * FROM events) SELECT {case_sums(n)} FROM v"),
    "group_by": (flat_session, lambda n: f"SELECT country, {case_sums(n)} FROM events GROUP BY country"),
    "join": (join_session, lambda n: "SELECT " + ", ".join(
        f"SUM(LEAST(GREATEST(l.l_price, 0), {i + 1})) AS w{i}" for i in range(n))
        + " FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey"),
}


def explain_cpu(s: dpsql.Session, sql: str) -> tuple[float, str]:
    c = cpu()
    try:
        s.explain(sql, epsilon=1.0, delta=1e-6)
        outcome = "ok"
    except dpsql.errors.DPSQLError as e:
        outcome = f"{type(e).__name__}: {e.message[:120]}"
    return cpu() - c, outcome


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", default="50,100,200,400")
    ap.add_argument("--join-ns", default="8,16,32,64")
    ap.add_argument("--shapes", default="flat,view,group_by,join")
    args = ap.parse_args()
    out: dict[str, Any] = {"load_average_before": os.getloadavg(), "ns": {}, "cpu_seconds": {}, "ratios": {},
                           "outcomes": {}}
    for shape in args.shapes.split(","):
        ns = [int(x) for x in (args.join_ns if shape == "join" else args.ns).split(",")]
        out["ns"][shape] = ns
        make, sql = SHAPES[shape]
        s = make()
        try:
            explain_cpu(s, sql(2))  # warm-up: imports, caches
            secs, outcomes = [], []
            for n in ns:
                t, o = explain_cpu(s, sql(n))
                secs.append(round(t, 3))
                outcomes.append(o)
                print(f"{shape} N={n}: {t:.3f} s CPU ({o})", file=sys.stderr, flush=True)
            out["cpu_seconds"][shape] = dict(zip(map(str, ns), secs))
            out["ratios"][shape] = [round(b / a, 2) if a else None for a, b in zip(secs, secs[1:])]
            out["outcomes"][shape] = dict(zip(map(str, ns), outcomes))
        finally:
            s.close()
    limit = getattr(__import__("dpsql.plan.analyze", fromlist=["MAX_AGGREGATES"]), "MAX_AGGREGATES", None)
    if limit is not None:
        s = flat_session()
        try:
            t, o = explain_cpu(s, SHAPES["flat"][1](limit + 1))
            out["refusal_above_limit"] = {"n": limit + 1, "cpu_seconds": round(t, 4), "outcome": o}
        finally:
            s.close()
    out["load_average_after"] = os.getloadavg()
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
