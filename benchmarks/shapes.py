"""Benchmark: query shapes beyond peers.py against their bounding floor.

One command:  python benchmarks/shapes.py [--rows 1000000] [--repeat 2] [--domains 1000,10000,100000]
JSON to stdout and ``benchmarks/out/shapes_<rows>.json``.

Data: the generated events of ``_events.py`` (users = rows / 5), plus two columns derived in
DuckDB for ordered domains: ``amount`` (0..99 999) and ``day`` (a day of 2024). Each shape is
timed warm in one process (best wall seconds, with the CPU seconds of that process beside them):

* ``dpsql``: ``Session.query`` end to end (C_u = 5, k = 1 unless said; country public, likes in [0, 10]);
* ``floor``: the least work any user-level bounding must do for the shape, over ``read_parquet``:
  one value per (user, group) then the statistic (grouped), the 5 largest values per user then
  the statistic (ungrouped, L = 5), the distinct (user, key) pairs then counts (histograms and
  public domains; a public domain's floor filters by the domain from a parameter).

Shapes: grouped and ungrouped quantiles (``MEDIAN``, ``MIN``/``MAX``), a DAWA histogram over 1024
bins with L = 5, and ``GROUP BY url`` over a declared domain of each size in ``--domains``
(explain's time recorded beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import duckdb  # noqa: E402
from _events import OUT, events_path  # noqa: E402

import dpsql  # noqa: E402

COUNTRIES = [f"C{i}" for i in range(50)]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Best wall and best CPU seconds of ``repeat`` runs after one untimed run."""
    fn()
    best = best_cpu = float("inf")
    for _ in range(repeat):
        c, t = _cpu(), time.perf_counter()
        fn()
        best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, _cpu() - c)
    return best, best_cpu


def session(path: str, tmp: str, columns: dict[str, Any], **kw: Any) -> dpsql.Session:
    s = dpsql.Session(ledger=os.path.join(tmp, f"l{time.perf_counter_ns()}.duckdb"), budget=dpsql.Budget(1e9, 0.5),
                      create=True)
    s.register("events", path, privacy_unit="user_id", max_groups_per_unit=5, max_rows_per_group=1, columns=columns, **kw)
    for _ in range(2):  # the registered relation's steady state (the file's text checked by the first)
        s.query("SELECT COUNT(*) FROM events", epsilon=1.0, delta=1e-5)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--domains", default="1000,10000,100000")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dpsql-shapes-")
    raw = events_path(args.rows, args.rows // 5)
    path = os.path.join(tmp, "events.parquet")
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"COPY (SELECT *, (hash(user_id, url, likes) % 100000)::BIGINT AS amount, DATE '2024-01-01' + "
                f"(hash(url) % 365)::INT AS day FROM read_parquet('{raw}')) TO '{path}' (FORMAT parquet)")
    src = f"read_parquet('{path}')"
    one = f"(SELECT user_id, country, ANY_VALUE(likes) AS v FROM {src} GROUP BY ALL)"
    top5 = f"(SELECT UNNEST(l) AS v FROM (SELECT user_id, max(likes, 5) AS l FROM {src} GROUP BY ALL))"
    cols = {"country": {"domain": COUNTRIES}, "likes": {"bounds": [0, 10]}}
    results: dict[str, Any] = {}

    def record(name: str, s: dpsql.Session, sql: str, floor: str, params: list[Any] | None = None,
               delta: float = 1e-5) -> None:
        d, dc = timed(lambda: s.query(sql, epsilon=1.0, delta=delta), args.repeat)
        f, fc = timed(lambda: con.execute(floor, params).fetchall(), args.repeat)
        e, _ = timed(lambda: s.explain(sql, epsilon=1.0, delta=delta), args.repeat)
        results[name] = {"sql": sql, "dpsql": d, "dpsql_cpu": dc, "floor": f, "floor_cpu": fc, "explain": e,
                         "ratio": d / f, "cpu_ratio": dc / fc}
        print(f"{name}: dpsql {d:.3f} s (CPU {dc:.3f}), floor {f:.3f} s (CPU {fc:.3f}), {d / f:.2f}x", file=sys.stderr)

    s = session(path, tmp, cols)
    record("median_by_country", s, "SELECT country, MEDIAN(likes) FROM events GROUP BY country",
           f"SELECT country, MEDIAN(v) FROM {one} GROUP BY 1")
    record("min_max_by_country", s, "SELECT country, MIN(likes), MAX(likes) FROM events GROUP BY country",
           f"SELECT country, MIN(v), MAX(v) FROM {one} GROUP BY 1")
    record("median_scalar_L5", s, "SELECT MEDIAN(likes) FROM events", f"SELECT MEDIAN(v) FROM {top5}")
    record("min_max_scalar_L5", s, "SELECT MIN(likes), MAX(likes) FROM events", f"SELECT MIN(v), MAX(v) FROM {top5}")
    s.close()

    # a DAWA histogram: a fresh session per run (a later run would be answered from the stored synopsis)
    hist = "SELECT amount, COUNT(*) FROM events GROUP BY amount"
    hcols = {"amount": {"bounds": [0, 100000], "bins": 1024}}
    runs = []
    for _ in range(args.repeat):
        s = session(path, tmp, hcols, max_rows_per_unit=5)
        c, t = _cpu(), time.perf_counter()
        s.query(hist, epsilon=1.0)
        runs.append((time.perf_counter() - t, _cpu() - c))
        s.close()
    f, fc = timed(lambda: con.execute(f"SELECT b, COUNT(*) FROM (SELECT DISTINCT user_id, floor(amount * 1024 / 100000) "
                                      f"AS b FROM {src}) GROUP BY 1").fetchall(), args.repeat)
    d, dc = min(runs)
    results["dawa_hist_1024_L5"] = {"sql": hist, "dpsql": d, "dpsql_cpu": dc, "floor": f, "floor_cpu": fc,
                                    "ratio": d / f, "cpu_ratio": dc / fc}
    print(f"dawa_hist_1024_L5: dpsql {d:.3f} s (CPU {dc:.3f}), floor {f:.3f} s (CPU {fc:.3f}), {d / f:.2f}x", file=sys.stderr)

    for size in [int(x) for x in args.domains.split(",") if x]:
        dom = [f"u{i}" for i in range(1, size + 1)]
        s = session(path, tmp, {"url": {"domain": dom}})
        record(f"public_domain_{size}", s, "SELECT url, COUNT(*) FROM events GROUP BY url",
               f"SELECT url, COUNT(*) FROM (SELECT DISTINCT user_id, url FROM {src} WHERE url IN (SELECT UNNEST(?))) "
               "GROUP BY ALL", [dom])
        s.close()

    out = {"benchmark": "shapes", "rows": args.rows, "load_average": os.getloadavg(), "results": results}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"shapes_{args.rows}.json"), "w") as fh:
        json.dump(out, fh, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
