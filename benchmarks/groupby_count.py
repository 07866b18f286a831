"""Benchmark: dpsql GROUP BY COUNT over a generated 10M-row events Parquet vs plain DuckDB.

One command:  python benchmarks/groupby_count.py [--rows 10000000] [--repeat 3]
Prints JSON (also written to benchmarks/out/groupby_count.json): wall time of the same
GROUP BY in plain DuckDB (non-private) and through dpsql (bounding + noise + ledger), and
their ratio (and, for context, the ratio to COUNT(DISTINCT user_id), which does the same
per-user grouping work without privacy). Target from the issue: ratio <= 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import duckdb

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _events import OUT, events_path  # noqa: E402

import dpsql  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = events_path(args.rows)
    results = {}
    for key, label in (("country", "GROUP BY country (public keys)"), ("url", "GROUP BY url (sparse histogram)")):
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        q = f"SELECT {key}, COUNT(*) FROM read_parquet('{path}') GROUP BY {key}"
        con.execute(q).fetchall()  # warm the file cache
        base = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            con.execute(q).fetchall()
            base.append(time.perf_counter() - t)
        qd = f"SELECT {key}, COUNT(DISTINCT user_id) FROM read_parquet('{path}') GROUP BY {key}"
        distinct = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            con.execute(qd).fetchall()
            distinct.append(time.perf_counter() - t)
        con.close()
        with tempfile.TemporaryDirectory() as tmp:
            s = dpsql.Session(ledger=os.path.join(tmp, "ledger.duckdb"), budget=dpsql.Budget(1000.0, 1e-2), create=True)
            cols = {"country": {"domain": [f"C{i}" for i in range(50)]}} if key == "country" else None
            s.register("events", path, privacy_unit="user_id", max_groups_per_unit=5, max_rows_per_group=1, columns=cols)
            sql = f"SELECT {key}, COUNT(*) AS n FROM events GROUP BY {key}"
            priv = []
            rows = 0
            for _ in range(args.repeat):
                t = time.perf_counter()
                r = s.query(sql, epsilon=1.0, delta=1e-6)
                priv.append(time.perf_counter() - t)
                rows = r.table.num_rows
            s.close()
        results[key] = {
            "query": label,
            "nonprivate_seconds": min(base),
            "dpsql_seconds": min(priv),
            "ratio": min(priv) / min(base),
            # the same per-user work without privacy: one row per (user, group)
            "nonprivate_count_distinct_seconds": min(distinct),
            "ratio_vs_count_distinct": min(priv) / min(distinct),
            "released_rows": rows,
        }
    out = {"benchmark": "groupby_count", "rows": args.rows, "max_groups_per_unit": 5, "target_ratio": 2.0, "results": results}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "groupby_count.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
