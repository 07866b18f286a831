"""Benchmark: join queries in the order the bounded query writes them, against DuckDB's estimated order.

One command:  python benchmarks/join_order.py [--customers 50000] [--repeat 3]
Prints JSON (also written to benchmarks/out/join_order.json).

DuckDB's ``join_order`` optimizer orders a chain of joins by the estimated row counts of its inputs (a
Parquet footer's, a table's), so one person's rows could regroup the chain
(``tests/test_adversary_scan_statistics.py``); every private read now runs with it (and ``filter_pullup``,
which turned each inner join below another into a cross product for it to rebuild) off, and the join SQL
writes the inputs in an order decided from the catalog (``dpsql.plan.joins.join_sequence``: the table with
many rows per key probes, each table reached through a key is built). Three forms of each query, interleaved,
through ``Session.query`` on Parquet files read by DuckDB's own reader (the first round, through the Arrow
view, is not counted):

* ``estimated``: ``join_order`` and ``filter_pullup`` on (the plan before, chosen from the row counts);
* ``written``: both off, the inputs in the catalog's order (what private reads run now);
* ``as_typed``: both off, the inputs in the order the query names them (the order without ``join_sequence``).

Synthetic, seeded data: ``customer`` (``--customers``, the people, a nation 0-24), ``orders`` (0-8 per
customer, degree bound 8), ``lineitem`` (1-4 per order, degree bound 4, a part), public ``nation`` (25) and
``part`` (``--customers`` / 5). Each query at q = 1/16 (DP-S4S, one owner: the truncation in the engine).
Reported per query and form: the median CPU seconds (user + sys of the process: DuckDB's threads included)
and wall seconds, the CPU ratios written / estimated and as_typed / estimated, and the load average.

Measured (2 cores shared with other work, load average 29-53): ``--customers 100000 --repeat 3``, CPU written /
estimated 1.05 (chain3_count, 1.07 s), 1.00 (chain4_group, 1.59 s), 1.12 (chain3_sum_where, 0.46 s), 0.87 (star,
1.67 s), 1.00 (two_customers_orders, 0.22 s); ``--customers 400000 --repeat 2 --queries chain3_count,chain4_group,star``:
0.98 (5.21 s), 0.96 (7.92 s), 1.05 (9.64 s), as_typed / estimated 1.19, 1.09, 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

QUERIES = {
    "chain3_count": "SELECT COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                    "JOIN lineitem l ON l.l_orderkey = o.o_orderkey",
    "chain4_group": "SELECT n.n_name, COUNT(*) AS k FROM nation n JOIN customer c ON c.c_nationkey = n.n_nationkey "
                    "JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
                    "GROUP BY n.n_name",
    "chain3_sum_where": "SELECT SUM(l.l_price) AS s FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                        "JOIN lineitem l ON l.l_orderkey = o.o_orderkey WHERE l.l_price > 50 AND c.c_nationkey < 5",
    "star": "SELECT COUNT(*) AS n FROM part p JOIN lineitem l ON l.l_partkey = p.p_partkey "
            "JOIN orders o ON l.l_orderkey = o.o_orderkey",
    "two_customers_orders": "SELECT COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey",
}


def _data(n_c: int, tmp: str) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    g = np.random.default_rng(7)
    n_orders = g.integers(0, 9, n_c)
    o_cust = np.repeat(np.arange(n_c), n_orders)
    o_key = np.arange(o_cust.size) + 10
    n_items = g.integers(1, 5, o_key.size)
    l_ord = np.repeat(o_key, n_items)
    n_p = max(n_c // 5, 1)
    tables = {
        "nation": pa.table({"n_nationkey": np.arange(25), "n_name": [f"N{i}" for i in range(25)]}),
        "part": pa.table({"p_partkey": np.arange(n_p)}),
        "customer": pa.table({"c_custkey": np.arange(n_c), "c_nationkey": g.integers(0, 25, n_c)}),
        "orders": pa.table({"o_orderkey": o_key, "o_custkey": o_cust}),
        "lineitem": pa.table({"l_orderkey": l_ord, "l_partkey": g.integers(0, n_p, l_ord.size),
                              "l_price": np.round(g.uniform(0, 100, l_ord.size), 2)}),
    }
    for name, t in tables.items():
        pq.write_table(t, f"{tmp}/{name}.parquet")


def _session(tmp: str) -> Any:
    import dpsql

    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
    s.register("nation", f"{tmp}/nation.parquet", public=True)
    s.register("part", f"{tmp}/part.parquet", public=True)
    s.register("customer", f"{tmp}/customer.parquet", privacy_unit="c_custkey",
               references={"c_nationkey": "nation.n_nationkey"})
    s.register("orders", f"{tmp}/orders.parquet", references={"o_custkey": "customer.c_custkey"},
               degree_bounds={"o_custkey": 8})
    s.register("lineitem", f"{tmp}/lineitem.parquet", references={"l_orderkey": "orders.o_orderkey", "l_partkey": "part.p_partkey"},
               degree_bounds={"l_orderkey": 4}, columns={"l_price": {"bounds": (0, 100)}})
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--customers", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--queries", default=",".join(QUERIES))
    args = ap.parse_args()

    from dpsql.engine import _duckdb_native as native
    from dpsql.engine import duckdb as dd
    from dpsql.plan import joins as plan_joins
    from dpsql.rewrite import joins as rewrite_joins

    native.SETTLE_SECONDS = 0.0
    written = dd.STATISTICS_OPTIMIZERS
    estimated = tuple(o for o in written if o not in ("join_order", "filter_pullup"))

    def as_typed(jp: Any, catalog: Any) -> tuple[str, ...]:
        return tuple(a for a, _ in jp.inputs)

    forms = {"estimated": (estimated, plan_joins.join_sequence), "written": (written, plan_joins.join_sequence),
             "as_typed": (written, as_typed)}
    tmp = tempfile.mkdtemp(prefix="dpsql-bench-")
    _data(args.customers, tmp)
    sessions = {}
    for name, (opts, _) in forms.items():
        dd.STATISTICS_OPTIMIZERS = opts  # read when the engine's own connection is created
        sessions[name] = _session(tmp)
    queries = {q: QUERIES[q] for q in args.queries.split(",")}
    times: dict[str, dict[str, list[tuple[float, float]]]] = {q: {k: [] for k in forms} for q in queries}
    for r in range(args.repeat + 1):  # the first round (the Arrow view and the text check) is not counted
        for q, sql in queries.items():
            for name, (opts, seq) in forms.items():
                dd.STATISTICS_OPTIMIZERS = opts  # each read turns off the module's list
                rewrite_joins.join_sequence = seq  # type: ignore[assignment]
                c0, w0 = os.times(), time.perf_counter()
                sessions[name].query(sql, epsilon=1.0, delta=1e-6, options={"q": 1 / 16})
                c1, w1 = os.times(), time.perf_counter()
                if r:
                    times[q][name].append((c1.user + c1.system - c0.user - c0.system, w1 - w0))
                print(f"round {r} {q} {name}: {c1.user + c1.system - c0.user - c0.system:.2f} s CPU", file=sys.stderr)
    dd.STATISTICS_OPTIMIZERS = written
    rewrite_joins.join_sequence = plan_joins.join_sequence
    out: dict[str, Any] = {"customers": args.customers, "repeat": args.repeat, "load_average": os.getloadavg()}
    for q, by in times.items():
        med = {k: {"cpu_s": round(statistics.median(c for c, _ in v), 3), "wall_s": round(statistics.median(w for _, w in v), 3)}
               for k, v in by.items()}
        out[q] = {**med, "cpu_written_over_estimated": round(med["written"]["cpu_s"] / med["estimated"]["cpu_s"], 3),
                  "cpu_as_typed_over_estimated": round(med["as_typed"]["cpu_s"] / med["estimated"]["cpu_s"], 3)}
    for s in sessions.values():
        s.close()
    text = json.dumps(out, indent=2)
    print(text)
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"), exist_ok=True)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "join_order.json"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
