"""Benchmark: dpsql against plain DuckDB, the bounding floor, OpenDP (Polars) and Qrlew.

One command:  python benchmarks/peers.py [--rows 1000000] [--users N] [--repeat 3] [--peers opendp,qrlew]
                                        [--peer-repeat N]
JSON to stdout and ``benchmarks/out/peers_<rows>.json``, a chart to ``benchmarks/out/peers_<rows>.png``
(when matplotlib is installed), and a Markdown table on stderr.

Data: generated events (``_events.py``: heavy-tailed rows per user, Zipf URLs, 50 countries;
users = rows / 5 unless ``--users``). Queries, at epsilon = 1, delta = 1e-5, at most 5 groups and
1 row per group per user (country declared public for Q1 and Q3, likes bounded to [0, 10]):

* Q1 ``SELECT country, COUNT(*) FROM events GROUP BY country``
* Q2 ``SELECT url, country, COUNT(*) FROM events GROUP BY url, country`` (unknown keys)
* Q3 ``SELECT country, SUM(likes), AVG(likes) FROM events GROUP BY country``

Systems, each timed warm (best of ``--repeat`` runs, wall seconds) in this process:

* ``duckdb``: the plain (non-private) query over ``read_parquet``;
* ``floor``: the least work any user-level bounding must do, ``SELECT k, COUNT(*) FROM (SELECT
  DISTINCT user_id, k FROM events) GROUP BY k`` (Q3: one value per (user, group), then its sum),
  over ``read_parquet`` and (``floor_registered``) over the relation dpsql registers for the file
  (invalid UTF-8 is NULL: from its first private read in a process, which checks the file's
  text, DuckDB's own reader with the invalid cells marked, ``dpsql/engine/_duckdb_native.py``;
  each query run twice, untimed, before the first measurement brings it to that state);
* ``dpsql``: ``Session.query`` end to end (routing, bounded SQL, noise, post-processing, and the
  two durable writes of a ledger file); ``dpsql_bounded_sql``: its bounded SQL alone (the text
  ``explain`` shows, with a random salt), run on the same connection;
* ``opendp`` / ``qrlew``: their own processes, in the virtual environments made by
  ``benchmarks/peers/setup_opendp.sh`` and ``setup_qrlew.sh`` (their pins conflict); skipped with
  a message when not installed. Their times include their calibration and rewriting.

CPU seconds (user + system, all threads) are recorded beside each in-process wall time: on a
loaded machine they compare the work done more steadily than wall seconds.

Peak memory: for in-process systems, the peak resident set size above the level before the query
(sampled every 5 ms); for peers, the peak RSS of their whole process. Accuracy against the
unbounded truth: groups released, spurious groups (released keys absent from the data), recall of
large groups (at least ``--large`` distinct users), median relative error of the released count
(Q3: sum) over released groups that exist.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import duckdb  # noqa: E402
from _events import OUT, events_path  # noqa: E402

import dpsql  # noqa: E402
from dpsql.engine import EngineSettings  # noqa: E402

EPS, DELTA, CU, K = 1.0, 1e-5, 5, 1
COUNTRIES = [f"C{i}" for i in range(50)]
QUERIES: dict[str, dict[str, Any]] = {
    "Q1": {"sql": "SELECT country, COUNT(*) AS n FROM events GROUP BY country", "keys": ["country"],
           "label": "GROUP BY country COUNT"},
    "Q2": {"sql": "SELECT url, country, COUNT(*) AS n FROM events GROUP BY url, country", "keys": ["url", "country"],
           "label": "GROUP BY url, country COUNT (unknown keys)"},
    "Q3": {"sql": "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events GROUP BY country", "keys": ["country"],
           "label": "GROUP BY country SUM, AVG"},
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Peak resident set size above the starting level while the block runs (sampled)."""

    def __enter__(self) -> PeakRSS:
        self.base = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def mb(self) -> float:
        return (self.peak - self.base) / 2**20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any, float]:
    """Best wall seconds of ``repeat`` warm runs (after one untimed run), peak MB above the
    starting level over the timed runs, the last result, and the best CPU seconds (user +
    system, every thread of this process; a load-robust measure of the work done)."""
    out = fn()
    best = best_cpu = float("inf")
    with PeakRSS() as mem:
        for _ in range(repeat):
            c = _cpu()
            t = time.perf_counter()
            out = fn()
            best = min(best, time.perf_counter() - t)
            best_cpu = min(best_cpu, _cpu() - c)
    return best, mem.mb, out, best_cpu


def floor_sql(q: str, src: str) -> str:
    keys = ", ".join(QUERIES[q]["keys"])
    if q == "Q3":
        return (f"SELECT {keys}, COUNT(*), SUM(v) FROM (SELECT user_id, {keys}, ANY_VALUE(likes) AS v FROM {src} "
                f"GROUP BY ALL) GROUP BY ALL")
    return f"SELECT {keys}, COUNT(*) FROM (SELECT DISTINCT user_id, {keys} FROM {src}) GROUP BY ALL"


def truth(con: duckdb.DuckDBPyConnection, q: str, src: str) -> dict[tuple[Any, ...], tuple[float, int]]:
    keys = ", ".join(QUERIES[q]["keys"])
    val = "SUM(likes)" if q == "Q3" else "COUNT(*)"
    rows = con.execute(f"SELECT {keys}, {val}, COUNT(DISTINCT user_id) FROM {src} GROUP BY ALL").fetchall()
    n = len(QUERIES[q]["keys"])
    return {tuple(r[:n]): (float(r[n]), int(r[n + 1])) for r in rows}


def accuracy(rows: list[list[Any]], n_keys: int, true: dict[tuple[Any, ...], tuple[float, int]],
             large: int) -> dict[str, Any]:
    released = {tuple(r[:n_keys]): r[n_keys] for r in rows}
    spurious = [k for k in released if k not in true]
    big = [k for k, (_, users) in true.items() if users >= large]
    errs = [abs(float(v) - true[k][0]) / true[k][0] for k, v in released.items()
            if k in true and v is not None and true[k][0] != 0]
    return {
        "groups_released": len(released),
        "spurious_groups": len(spurious),
        "large_groups": len(big),
        "recall_large": (sum(1 for k in big if k in released) / len(big)) if big else None,
        "median_relative_error": statistics.median(errs) if errs else None,
    }


def run_peer(name: str, path: str, rows: int, repeat: int) -> dict[str, Any]:
    py = os.path.join(HERE, "peers", f".venv-{name}", "bin", "python")
    if not os.path.exists(py):
        return {"skipped": f"{name} is not installed: run benchmarks/peers/setup_{name}.sh"}
    p = subprocess.Popen([py, os.path.join(HERE, "peers", f"run_{name}.py"), path, str(rows), str(repeat)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    if p.returncode != 0:
        return {"skipped": f"{name} failed (exit {p.returncode}): {err.strip().splitlines()[-1:] if err else ''}"}
    res = json.loads(out)
    res["_peak_rss_mb"] = res.pop("peak_rss_kb", 0) / 1024
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=None, help="default: rows / 5")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peers", default="opendp,qrlew", help="comma-separated, or '' for none")
    ap.add_argument("--peer-repeat", type=int, default=None, help="timed runs per peer query (default: --repeat)")
    ap.add_argument("--large", type=int, default=100, help="a group is large with at least this many distinct users")
    args = ap.parse_args()
    users = args.users or args.rows // 5
    path = events_path(args.rows, users)
    src = f"read_parquet('{path}')"
    threads = EngineSettings().effective_threads

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SET threads = {threads}")
    n_rows = con.execute(f"SELECT COUNT(*) FROM {src}").fetchall()[0][0]

    tmp = tempfile.mkdtemp(prefix="dpsql-peers-")
    s = dpsql.Session(ledger=os.path.join(tmp, "ledger.duckdb"), budget=dpsql.Budget(1e6, 0.5), create=True)
    s.register("events", path, privacy_unit="user_id", max_groups_per_unit=CU, max_rows_per_group=K,
               columns={"country": {"domain": COUNTRIES}, "likes": {"bounds": [0, 10]}})
    scon = s._engine.connection  # the relation dpsql registered, for the floor over the same read path
    view = [v for (v,) in scon.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal AND "
                                       "view_name LIKE '_dpsql_src_events%' AND view_name NOT LIKE '%_raw'").fetchall()][0]

    # the registered relation's steady state: a column's text is checked on the first private read that names
    # it, and until then the view reads it as NULL, so every query runs (twice) before any floor is measured
    for _ in range(2):
        for spec in QUERIES.values():
            s.query(spec["sql"], epsilon=EPS, delta=DELTA)
    results: dict[str, Any] = {}
    for q, spec in QUERIES.items():
        true = truth(con, q, src)
        n_keys = len(spec["keys"])
        r: dict[str, Any] = {"query": spec["label"], "sql": spec["sql"]}
        plain, floor, floor_reg = spec["sql"].replace("events", src), floor_sql(q, src), floor_sql(q, f'"{view}"')
        t, mb, _, cpu = timed(lambda: con.execute(plain).fetchall(), args.repeat)  # noqa: B023
        r["duckdb"] = {"seconds": t, "cpu_seconds": cpu, "peak_mb": mb}
        t, mb, _, cpu = timed(lambda: con.execute(floor).fetchall(), args.repeat)  # noqa: B023
        r["floor"] = {"seconds": t, "cpu_seconds": cpu, "peak_mb": mb, "sql": floor_sql(q, "events")}
        t, mb, _, cpu = timed(lambda: scon.execute(floor_reg).fetchall(), args.repeat)  # noqa: B023
        r["floor_registered"] = {"seconds": t, "cpu_seconds": cpu, "peak_mb": mb}
        sql = spec["sql"]
        bounded = s.explain(sql, epsilon=EPS, delta=DELTA).bounded_sql.replace(
            "'<per-query secret salt>'", "'" + secrets.token_hex(16) + "'")
        t, mb, _, cpu = timed(lambda: scon.execute(bounded).fetchall(), args.repeat)  # noqa: B023
        r["dpsql_bounded_sql"] = {"seconds": t, "cpu_seconds": cpu, "peak_mb": mb}
        t, mb, rel, cpu = timed(lambda: s.query(sql, epsilon=EPS, delta=DELTA), args.repeat)  # noqa: B023
        val = "s" if q == "Q3" else "n"
        rows = [[*[row[k] for k in spec["keys"]], row[val]] for row in rel.to_pylist()]
        r["dpsql"] = {"seconds": t, "cpu_seconds": cpu, "peak_mb": mb, "mechanism": rel.mechanism, **accuracy(rows, n_keys, true, args.large)}
        r["dpsql"]["ratio_to_floor"] = t / r["floor"]["seconds"]
        r["dpsql"]["ratio_to_floor_registered"] = t / r["floor_registered"]["seconds"]
        r["dpsql"]["cpu_ratio_to_floor"] = cpu / r["floor"]["cpu_seconds"]
        r["dpsql"]["cpu_ratio_to_floor_registered"] = cpu / r["floor_registered"]["cpu_seconds"]
        r["dpsql_bounded_sql"]["ratio_to_floor_registered"] = (r["dpsql_bounded_sql"]["seconds"]
                                                               / r["floor_registered"]["seconds"])
        results[q] = r
    s.close()
    con.close()

    peers = [p for p in args.peers.split(",") if p]
    notes = {}
    for name in peers:
        res = run_peer(name, path, n_rows, args.peer_repeat or args.repeat)
        if "skipped" in res:
            notes[name] = res["skipped"]
            print(f"{name}: skipped: {res['skipped']}", file=sys.stderr)
            continue
        tcon = duckdb.connect()
        for q, spec in QUERIES.items():
            true = truth(tcon, q, src)
            pr = res[q]
            results[q][name] = {"seconds": min(pr["seconds"]), "peak_mb_process": res["_peak_rss_mb"],
                                **accuracy(pr["rows"], len(spec["keys"]), true, args.large)}
        tcon.close()

    out = {"benchmark": "peers", "rows": n_rows, "users": users, "epsilon": EPS, "delta": DELTA,
           "max_groups_per_unit": CU, "max_rows_per_group": K, "threads": threads, "large_group_users": args.large,
           "load_average": os.getloadavg(), "skipped": notes, "results": results}
    os.makedirs(OUT, exist_ok=True)
    base = os.path.join(OUT, f"peers_{args.rows}")
    with open(base + ".json", "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    print(table(out, peers), file=sys.stderr)
    chart(out, peers, base + ".png")


def table(out: dict[str, Any], peers: list[str]) -> str:
    cols = ["duckdb", "floor", "floor_registered", "dpsql_bounded_sql", "dpsql", *peers]
    lines = ["| query | " + " | ".join(cols) + " | dpsql / floor | CPU s: floor, floor_registered, bounded SQL, dpsql "
             "| dpsql groups (spurious) | recall large | median rel. err |",
             "|---" * (len(cols) + 6) + "|"]
    for q, r in out["results"].items():
        cells = [f"{r[c]['seconds']:.3f}" if c in r else "-" for c in cols]
        d = r["dpsql"]
        err = d["median_relative_error"]
        cpu = ", ".join(f"{r[c]['cpu_seconds']:.3f}" for c in ("floor", "floor_registered", "dpsql_bounded_sql", "dpsql"))
        lines.append(f"| {q} {r['query']} | " + " | ".join(cells) + f" | {d['ratio_to_floor']:.2f}x | {cpu} | "
                     f"{d['groups_released']} ({d['spurious_groups']}) | "
                     f"{d['recall_large'] if d['recall_large'] is None else format(d['recall_large'], '.3f')} | "
                     f"{'-' if err is None else format(err, '.4f')} |")
    return "\n".join(lines)


def chart(out: dict[str, Any], peers: list[str], png: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart", file=sys.stderr)
        return
    systems = ["duckdb", "floor", "dpsql", *peers]
    qs = list(out["results"])
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.8 / len(systems)
    for i, name in enumerate(systems):
        vals = [out["results"][q].get(name, {}).get("seconds", 0.0) for q in qs]
        ax.bar([j + i * w for j in range(len(qs))], vals, w, label=name)
    ax.set_xticks([j + w * (len(systems) - 1) / 2 for j in range(len(qs))])
    ax.set_xticklabels(qs)
    ax.set_yscale("log")
    ax.set_ylabel("wall seconds (log scale)")
    ax.set_title(f"{out['rows']:,} rows, {out['users']:,} users; epsilon 1, delta 1e-5, C_u 5, k 1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"chart: {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
