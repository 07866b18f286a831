"""Benchmark: the cost of reading sources totally (invalid UTF-8 as NULL, fixed CSV dialect).

One command:  python benchmarks/sources.py [--rows 1000000] [--repeat 5]
Prints JSON (also written to benchmarks/out/sources.json): for a generated Parquet file and
CSV file of ``--rows`` valid rows (two text columns, two numeric), the median time of the same
aggregate query over DuckDB's own reader (``read_parquet`` / sniffed ``read_csv``: an error
on one bad value) and over the view dpsql registers, and their ratio: Parquet with the default
``invalid_text='null'`` (text read as bytes through Arrow and decoded with ``TRY(DECODE(...))``)
and with ``invalid_text='replace'`` (DuckDB's reader, invalid bytes as ``?``); CSV read as
VARCHAR with a fixed dialect and declared types applied by TRY_CAST, plus the time of the copy
the engine reads instead of the file (made once per file version: a lone carriage return as a
space). A second Parquet file
holds temporal and nested columns (a timestamp, a date, a list of text, a BLOB) to measure the
rebuilt temporal values and the text cap at depth: the timestamp is stored in milliseconds for
the default mode (read as integers and rebuilt) and in microseconds for ``'replace'`` (which
refuses millisecond timestamps). Run through the engine only (no noise, no ledger): the scan
cost alone. Runs are interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dpsql.engine import Engine, EngineSettings  # noqa: E402
from dpsql.engine import _duckdb_csv as csvcopy  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
QUERY = ("SELECT country, COUNT(*), SUM(amount), COUNT(DISTINCT note), SUM(length(note)) "
         "FROM {src} WHERE lower(note) <> 'x' AND k > 10 GROUP BY country")
NESTED_QUERY = ("SELECT date_trunc('month', ts), COUNT(*), SUM(len(tags)), SUM(octet_length(b)), MAX(day) "
                "FROM {src} WHERE ts > TIMESTAMP '2021-01-01' GROUP BY 1")


def median_times(con: duckdb.DuckDBPyConnection, sqls: list[str], repeat: int) -> list[float]:
    """Median time of each query, runs interleaved (so machine load affects all alike)."""
    for sql in sqls:
        con.execute(sql).fetchall()  # warm-up
    ts: list[list[float]] = [[] for _ in sqls]
    for _ in range(repeat):
        for i, sql in enumerate(sqls):
            t = time.perf_counter()
            con.execute(sql).fetchall()
            ts[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in ts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    gen = np.random.default_rng(5)
    n = args.rows
    names = np.array([f"name_{i}" for i in range(5000)])
    table = pa.table({
        "user_id": np.arange(n, dtype=np.int64),
        "amount": np.round(gen.uniform(0, 100, n), 2),
        "k": gen.integers(0, 1000, n),
        "country": names[gen.integers(0, 50, n)],
        "note": names[gen.integers(0, 5000, n)],
    })
    out: dict[str, object] = {"rows": n, "repeat": args.repeat}
    with tempfile.TemporaryDirectory() as tmp:
        pq_path = os.path.join(tmp, "t.parquet")
        csv_path = os.path.join(tmp, "t.csv")
        pq.write_table(table, pq_path)
        pacsv.write_csv(table, csv_path)
        ts = (gen.integers(1_577_836_800_000, 1_735_689_600_000, n)).astype("datetime64[ms]")
        nested = pa.table({
            "user_id": np.arange(n, dtype=np.int64),
            "ts": pa.array(ts),
            "day": pa.array(ts.astype("datetime64[D]")),
            "tags": pa.array([[names[i % 5000], names[(i * 7) % 5000]] for i in range(n)], pa.list_(pa.string())),
            "b": pa.array([names[i % 5000].encode() for i in range(n)], pa.binary()),
        })
        ms_path, us_path = os.path.join(tmp, "ms.parquet"), os.path.join(tmp, "us.parquet")
        pq.write_table(nested, ms_path)
        pq.write_table(nested.set_column(1, "ts", nested["ts"].cast(pa.timestamp("us"))), us_path)
        for label, kind, path, plain, types, mode, query in (
            ("parquet (invalid_text='null', default)", "parquet", pq_path, f"read_parquet('{pq_path}')", None, "null", QUERY),
            ("parquet (invalid_text='replace')", "parquet", pq_path, f"read_parquet('{pq_path}')", None, "replace", QUERY),
            ("csv (declared types)", "csv", csv_path, f"read_csv('{csv_path}')",
             {"amount": "DOUBLE", "k": "BIGINT", "user_id": "BIGINT"}, "null", QUERY),
            ("parquet temporal+nested, ts in ms (invalid_text='null', default)", "parquet", ms_path,
             f"read_parquet('{ms_path}')", None, "null", NESTED_QUERY),
            ("parquet temporal+nested, ts in us (invalid_text='replace')", "parquet", us_path,
             f"read_parquet('{us_path}')", None, "replace", NESTED_QUERY),
        ):
            eng = Engine(settings=EngineSettings(invalid_text=mode))
            eng.register_source("t", kind, path, "dpsql_view", types=types)
            con = eng.connection
            base, ours = median_times(con, [query.format(src=plain), query.format(src='"dpsql_view"')], args.repeat)
            out[label] = {"duckdb_reader_ms": round(base * 1e3, 2), "dpsql_view_ms": round(ours * 1e3, 2),
                          "ratio": round(ours / base, 3)}
            if kind == "csv":  # DuckDB reads the engine's copy of the file (a lone \r as a space): made once per version
                copies = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    csvcopy.clean_copy(path, tmp, ".csv")
                    copies.append(time.perf_counter() - t0)
                out[label]["copy_once_per_file_version_ms"] = round(statistics.median(copies) * 1e3, 2)
                out[label]["file_mb"] = round(os.path.getsize(path) / 2**20, 1)
            eng.close()
    text = json.dumps(out, indent=1)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "sources.json"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
