"""Benchmark: the cost of the keyed hash of join keys (``dpsql.rewrite.joins.Spread``) on TPC-H join plans.

One command:  python benchmarks/join_spread_cost.py [--sf 1] [--runs 5]
Uses the TPC-H data and catalogs of ``benchmarks/tpch_joins.py`` (customers or suppliers as people, Delta
enforced: DP-S4S and R2T), and a plan that looks people up: 1994's line items alone, customers as people
(``lineitem -> orders -> customer``, R2T: every tuple and its people reach Python). Each plan runs ``--runs``
times with the keyed hash (``spread``) and without it (``plain``: ``spread_of`` turned off in this process),
interleaved, end to end through ``Session.query`` (DuckDB, the engine's own connection: the drawn sample);
reported: the best and the median seconds of each and spread / plain of the best. JSON on stdout and in
benchmarks/out/join_spread_cost.json (``--portable``: the portable keyed hash's backend, _portable.json).

Measured at SF1 (2 shared cores under a load average of 7-8, so +-20% is noise), spread / plain of the
best of 3: customers DP-S4S 5.76 s / 5.91 s (0.97), suppliers DP-S4S 2.26 / 2.35 (0.96), customers R2T
8.83 / 9.11 (0.97), the looked-up lineitem R2T (best of 2) 15.2 / 19.5 (0.78). With ``--portable``: 1.12,
1.20, 0.87 (DuckDB's own 64-bit hash as the spread); when the spread was the portable SHA-256 of each key's
text, customers DP-S4S took 30.3 s against 6.7 s (4.5x). In DuckDB alone at SF1, 2 threads, best of 5:
orders GROUP BY o_orderkey HAVING COUNT(*) = 1 (the unique-key filter) 0.652 s plain, 0.609 s with the
keyed hash as a grouped column; orders JOIN lineitem 1.088 s, 1.005 s with the keyed hashes compared too.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tpch_joins import CUSTOMERS_SQL, OUT, SUPPLIERS_SQL, data_dir, session  # noqa: E402

import dpsql.rewrite.joins as rj  # noqa: E402
from dpsql.engine.portable import PortableDuckDBOps  # noqa: E402

LOOKUP_SQL = "SELECT COUNT(*) FROM lineitem l WHERE l.l_shipdate >= DATE '1994-01-01' AND l.l_shipdate < DATE '1995-01-01'"

PLANS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "customers_dp_s4s": ("customers", CUSTOMERS_SQL, {}),
    "customers_r2t": ("customers", CUSTOMERS_SQL, {"mechanism": "r2t"}),
    "suppliers_dp_s4s": ("suppliers", SUPPLIERS_SQL, {}),
    "customers_lineitem_lookup_r2t": ("customers", LOOKUP_SQL, {"mechanism": "r2t"}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--portable", action="store_true",
                    help="the portable keyed hash (SHA-256 of the key's text, as on Spark) instead of DuckDB's own")
    args = ap.parse_args()
    d = data_dir(args.sf)
    spread_of = rj.spread_of
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {people: session(d, people, tmp, args.sf) for people in ("customers", "suppliers")}
        if args.portable:  # what engine={"keyed_hash": "portable"} builds
            for s in sessions.values():
                s._engine.ops = PortableDuckDBOps()  # type: ignore[attr-defined]
        try:
            for name in args.plans.split(","):
                people, sql, opts = PLANS[name]
                s = sessions[people]
                times: dict[str, list[float]] = {"plain": [], "spread": []}
                for _ in range(args.runs):
                    for mode in ("plain", "spread"):
                        rj.spread_of = spread_of if mode == "spread" else (lambda *a, **k: None)  # type: ignore[assignment]
                        try:
                            t0 = time.perf_counter()
                            s.query(sql, epsilon=1.0, options=opts)
                            times[mode].append(time.perf_counter() - t0)
                        finally:
                            rj.spread_of = spread_of  # type: ignore[assignment]
                best = {m: min(v) for m, v in times.items()}
                results[name] = {"sql": sql, "options": opts, "best_s": best,
                                 "median_s": {m: statistics.median(v) for m, v in times.items()},
                                 "spread_over_plain": best["spread"] / best["plain"]}
                print(name, results[name]["best_s"], round(results[name]["spread_over_plain"], 3), file=sys.stderr, flush=True)
        finally:
            for s in sessions.values():
                s.close()
    out = {"benchmark": "join_spread_cost", "scale_factor": args.sf, "runs": args.runs, "portable": args.portable,
           "results": results}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "join_spread_cost" + ("_portable" if args.portable else "") + ".json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
