"""Benchmark: registering a wide CSV file (thousands of columns).

One command:  python benchmarks/csv_wide.py [--widths 1000,2000,4000] [--rows 20]
Prints JSON (also written to benchmarks/out/csv_wide.json): per width, the seconds of
``Session.register`` of a generated CSV file (a ``uid`` column and WIDTH text columns), and the
seconds of one COUNT(col) query over it, whose read binds the view again over the engine's copy.
Registration binds the view once (its CREATE; the schema is the header with the declared types),
and each column's SQL is of a constant size (``tests/test_csv_wide.py`` counts both); what grows
faster than the width is DuckDB's binder over one select list of WIDTH expressions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dpsql  # noqa: E402


def write(path: str, width: int, rows: int) -> None:
    with open(path, "w") as f:
        f.write("uid," + ",".join(f"c{i}" for i in range(width)) + "\n")
        for r in range(rows):
            f.write(f"{r}," + ",".join(str(i + r) for i in range(width)) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="1000,2000,4000")
    ap.add_argument("--rows", type=int, default=20)
    args = ap.parse_args()
    out = []
    with tempfile.TemporaryDirectory() as d:
        for width in (int(w) for w in args.widths.split(",")):
            path = os.path.join(d, f"w{width}.csv")
            write(path, width, args.rows)
            with dpsql.Session(budget=dpsql.Budget(100.0)) as s:
                t = time.perf_counter()
                s.register("w", path, privacy_unit="uid")
                reg = time.perf_counter() - t
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    s.query("SELECT COUNT(c0) AS n FROM w", epsilon=1.0)
                query = time.perf_counter() - t
            out.append({"width": width, "register_s": round(reg, 3), "query_s": round(query, 3)})
            print(json.dumps(out[-1]), file=sys.stderr)
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"), exist_ok=True)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "csv_wide.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
