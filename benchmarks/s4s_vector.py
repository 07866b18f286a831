"""Benchmark: GROUP BY over TPC-H joins -- DP-S4S's vector form (Algorithm 5) and per-user clipping.

One command:  python benchmarks/s4s_vector.py [--sf 0.1] [--runs 5] [--q 0.25 0.0625] [--queries q5 q7a ...]
TPC-H Parquet files come from ``tpchgen-cli`` (the ``bench`` extra), cached in ``$DPSQL_TPCH_CACHE``
(default ~/.cache/dpsql/tpch-sf<sf>). ε = 4, δ = 1e-7 (the paper's vector setting).

Queries (the paper's Q5 and Q7 variants, §5; keys are public: nation names of the public ``nation``
table, years of the declared ship-date range, ship dates of a declared date domain):

* q5      revenue per nation of ASIA, 1994 orders, customer and supplier of the same nation;
          people: customers AND suppliers (two people per tuple: Algorithm 5 with the cone program).
* q7a_c   line items per customer nation; people: customers (one person per tuple).
* q7a_ps  line items per supplier nation; people: partsupps (one person per tuple; a partsupp id
          ``ps_id`` = ps_partkey * 100000 + ps_suppkey is added to partsupp and lineitem, since
          privacy units are single columns).
* q7b     line items per customer nation and ship year (125 groups); people: customers.
* q7c_o   revenue per ship date (2526 groups); people: orders.
* q7c_ps  revenue per ship date; people: partsupps (at most 32 line items each, declared).

Each query runs with DP-S4S's vector form (``mechanism='dp_s4s'``) at every q of ``--q`` and, where
one person owns each tuple, with per-user clipping (the default path there; for q7c also with a
declared ``clip_norm`` of 300 000, about three line items' revenue); q5 also unsampled
(``mechanism='r2t'``: q = 1, the paper's PMSJA comparison). Reported per
configuration: L2 relative error ‖noisy − true‖₂/‖true‖₂ (mean over ``--runs`` after dropping the
largest and smallest when runs ≥ 5, as the paper does; ``--trim 0.2`` drops 20% on each side),
the per-run errors, median wall and CPU seconds end to end (``Session.query``; CPU of all the
process's threads), the 1-minute load average before and after, peak resident memory of the process
so far (MB), and the solver's counters. With q5, also Q5's truncation program in PMSJA's form (all
join tuples, a cone per user, no reductions) solved once per τ = 1, 2, 4 by the same solver, timed
(``unreduced_q5``; ``--no-unreduced`` skips it). The paper (SF 4, PMSJA with MOSEK): Q5 at q = 1/4
23.5% error vs 13.9% unsampled, 38 s vs more than 10 000 s. JSON on stdout and in
benchmarks/out/s4s_vector_sf<sf>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import duckdb
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dpsql  # noqa: E402
from dpsql.mechanisms import _s4s_socp  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
TABLES = ("customer", "orders", "lineitem", "supplier", "nation", "region", "partsupp")
REV = "LEAST(GREATEST(l.l_extendedprice * (1 - l.l_discount), 0), 100000)"
FIRST, LAST = datetime.date(1992, 1, 1), datetime.date(1998, 12, 31)

QUERIES = {
    "q5": ("cs", f"SELECT n.n_name, SUM({REV}) AS revenue FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                 "JOIN lineitem l ON l.l_orderkey = o.o_orderkey JOIN supplier s ON l.l_suppkey = s.s_suppkey "
                 "JOIN nation n ON s.s_nationkey = n.n_nationkey WHERE c.c_nationkey = s.s_nationkey AND n.n_regionkey = 2 "
                 "AND o.o_orderdate >= DATE '1994-01-01' AND o.o_orderdate < DATE '1995-01-01' GROUP BY n.n_name"),
    "q7a_c": ("c", "SELECT n.n_name, COUNT(*) AS cnt FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                   "JOIN lineitem l ON l.l_orderkey = o.o_orderkey JOIN nation n ON c.c_nationkey = n.n_nationkey GROUP BY n.n_name"),
    "q7a_ps": ("ps", "SELECT n.n_name, COUNT(*) AS cnt FROM partsupp ps JOIN lineitem l ON l.l_psid = ps.ps_id "
                     "JOIN supplier s ON s.s_suppkey = ps.ps_suppkey JOIN nation n ON s.s_nationkey = n.n_nationkey "
                     "GROUP BY n.n_name"),
    "q7b": ("c", "SELECT n.n_name, year(l.l_shipdate) AS y, COUNT(*) AS cnt FROM customer c JOIN orders o "
                 "ON c.c_custkey = o.o_custkey JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
                 "JOIN nation n ON c.c_nationkey = n.n_nationkey GROUP BY n.n_name, y"),
    "q7c_o": ("o", f"SELECT l.l_shipdate AS d, SUM({REV}) AS revenue FROM orders o JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
                   "GROUP BY d"),
    "q7c_ps": ("ps", f"SELECT l.l_shipdate AS d, SUM({REV}) AS revenue FROM partsupp ps JOIN lineitem l ON l.l_psid = ps.ps_id "
                     "GROUP BY d"),
}


def data_dir(sf: float, partsupp_ids: bool = True) -> str:
    d = os.environ.get("DPSQL_TPCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dpsql", f"tpch-sf{sf:g}")
    if not all(os.path.exists(os.path.join(d, f"{t}.parquet")) for t in TABLES):
        exe = shutil.which("tpchgen-cli") or os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
        if not os.path.exists(exe):
            sys.exit("tpchgen-cli is missing: pip install 'dpsql[bench]' (or pip install tpchgen-cli)")
        os.makedirs(d, exist_ok=True)
        subprocess.run([exe, "parquet", "-s", f"{sf:g}", f"--tables={','.join(TABLES)}", f"--output-dir={d}"], check=True)
    # partsupps as people: one id column (privacy units are single columns); written only when a
    # query with partsupps as people runs (a copy of lineitem: 1 GB at SF 4)
    if partsupp_ids and not os.path.exists(os.path.join(d, "lineitem_ps.parquet")):
        con = duckdb.connect()
        con.execute(f"COPY (SELECT *, ps_partkey * 100000 + ps_suppkey AS ps_id FROM '{d}/partsupp.parquet') "
                    f"TO '{d}/partsupp_ps.parquet' (FORMAT parquet)")
        con.execute(f"COPY (SELECT *, l_partkey * 100000 + l_suppkey AS l_psid FROM '{d}/lineitem.parquet') "
                    f"TO '{d}/lineitem_ps.parquet' (FORMAT parquet)")
    return d


def session(d: str, people: str, tmp: str) -> dpsql.Session:
    s = dpsql.Session(ledger=os.path.join(tmp, f"{people}-{time.time_ns()}.duckdb"), budget=dpsql.Budget(1e6, 1e-1), create=True)
    p = {t: os.path.join(d, f"{t}.parquet") for t in TABLES}
    ship = {"l_shipdate": {"bounds": (FIRST.isoformat(), LAST.isoformat()), "bin_width": "1 day"}}
    s.register("region", p["region"], public=True)
    s.register("nation", p["nation"], public=True, references={"n_regionkey": "region.r_regionkey"})

    def pub_or(t: str, **kw: object) -> None:
        s.register(t, p[t], public=True, **kw)  # type: ignore[arg-type]
    if people in ("c", "cs"):
        s.register("customer", p["customer"], privacy_unit="c_custkey", references={"c_nationkey": "nation.n_nationkey"},
                   allow_conditional_sampling=True)
        s.register("orders", p["orders"], references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 64},
                   allow_conditional_sampling=True)
    if people == "cs":
        s.register("supplier", p["supplier"], privacy_unit="s_suppkey", references={"s_nationkey": "nation.n_nationkey"},
                   allow_conditional_sampling=True)
        s.register("lineitem", p["lineitem"], references={"l_orderkey": "orders.o_orderkey", "l_suppkey": "supplier.s_suppkey"},
                   degree_bounds={"l_orderkey": 7, "l_suppkey": 1024}, allow_conditional_sampling=True, columns=ship)
    elif people == "c":
        pub_or("supplier", references={"s_nationkey": "nation.n_nationkey"})
        s.register("lineitem", p["lineitem"], references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 7},
                   columns=ship)
    elif people == "o":
        s.register("orders", p["orders"], privacy_unit="o_orderkey")
        s.register("lineitem", p["lineitem"], references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 7},
                   columns=_date_domain())
    elif people == "ps":
        pub_or("supplier", references={"s_nationkey": "nation.n_nationkey"})
        s.register("partsupp", os.path.join(d, "partsupp_ps.parquet"), privacy_unit="ps_id",
                   references={"ps_suppkey": "supplier.s_suppkey"})
        s.register("lineitem", os.path.join(d, "lineitem_ps.parquet"), references={"l_psid": "partsupp.ps_id"},
                   degree_bounds={"l_psid": 32}, columns=_date_domain())
    return s


def _date_domain() -> dict[str, dict[str, object]]:
    days = [(FIRST + datetime.timedelta(days=i)).isoformat() for i in range((LAST - FIRST).days + 1)]
    return {"l_shipdate": {"domain": days}}


def truth(d: str, sql: str) -> dict[tuple, float]:
    con = duckdb.connect()
    for t in TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM '{d}/{t}.parquet'")
    if os.path.exists(os.path.join(d, "lineitem_ps.parquet")):
        con.execute(f"CREATE OR REPLACE VIEW partsupp AS SELECT * FROM '{d}/partsupp_ps.parquet'")
        con.execute(f"CREATE OR REPLACE VIEW lineitem AS SELECT * FROM '{d}/lineitem_ps.parquet'")
    rows = con.execute(sql).fetchall()
    return {tuple(r[:-1]): float(r[-1]) for r in rows}


def l2_error(table: object, true: dict[tuple, float]) -> float:
    cols = table.column_names  # type: ignore[attr-defined]
    keys = list(zip(*[table.column(c).to_pylist() for c in cols[:-1]]))  # type: ignore[attr-defined]
    vals = table.column(cols[-1]).to_pylist()  # type: ignore[attr-defined]
    got = dict(zip(keys, vals))
    allk = set(got) | set(true)
    num = sum((float(got.get(k, 0.0)) - true.get(k, 0.0)) ** 2 for k in allk)
    den = sum(v * v for v in true.values())
    return (num / den) ** 0.5


def unreduced_program(d: str, taus: tuple[float, ...] = (1.0, 2.0, 4.0)) -> list[dict[str, float]]:
    """Q5's truncation program as PMSJA states it (Eq. 2), on all join tuples, without dpsql's exact
    reductions (every user gets a cone, every tuple a variable, no merging), solved once per τ by the
    same solver (Clarabel). Measures what the unsampled program costs before the reductions; the
    mechanism never runs this (benchmark only)."""
    import clarabel
    import scipy.sparse as sp

    con = duckdb.connect()
    for t in TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM '{d}/{t}.parquet'")
    sql = QUERIES["q5"][1].replace(f"SUM({REV}) AS revenue", f"c.c_custkey, s.s_suppkey, {REV} / 100000.0 AS w")
    sql = sql.split(" GROUP BY")[0]
    t0 = time.perf_counter()
    tab = con.sql(sql).to_arrow_table()
    fetch_s = time.perf_counter() - t0
    _, gid = np.unique(np.asarray(tab.column("n_name").to_pylist(), dtype=object).astype(str), return_inverse=True)
    ck, cinv = np.unique(tab.column("c_custkey").to_numpy(), return_inverse=True)
    sk, sinv = np.unique(tab.column("s_suppkey").to_numpy(), return_inverse=True)
    w = tab.column("w").to_numpy().astype(np.float64)
    nt, nc, ns = w.size, ck.size, sk.size
    nu, ng = nc + ns, int(gid.max()) + 1
    owners = np.concatenate([cinv, nc + sinv])  # two owners per tuple
    rows_t = np.concatenate([np.arange(nt), np.arange(nt)])
    n = nu + nt  # x = [y (nu), z (nt)]
    link = sp.csr_matrix((np.concatenate([np.ones(2 * nt), -np.ones(nt)]),
                          (np.concatenate([rows_t, np.arange(nt)]), np.concatenate([owners, nu + np.arange(nt)]))), shape=(nt, n))
    eye = sp.identity(n, format="csr")
    # one cone per user: (τ; −Σ_{t∋u, group g} w_t z_t for each group g the user's tuples reach; the
    # other groups' entries are identically 0 and left out)
    ug, ug_inv = np.unique(owners * ng + np.concatenate([gid, gid]), return_inverse=True)
    per_user = np.bincount(ug // ng, minlength=nu)
    head = np.concatenate([[0], np.cumsum(per_user + 1)[:-1]])
    rank = np.arange(ug.size) - np.repeat(np.concatenate([[0], np.cumsum(per_user)[:-1]]), per_user)
    ug_row = head[ug // ng] + 1 + rank
    n_cone = int((per_user + 1).sum())
    cone_a = sp.csr_matrix((-np.concatenate([w, w]), (ug_row[ug_inv.reshape(-1)], nu + rows_t)), shape=(n_cone, n))
    a_mat = sp.vstack([link, eye, -eye, cone_a]).tocsc()
    c = np.concatenate([-np.ones(nu), np.zeros(nt)])
    out = []
    for tau in taus:
        cone_b = np.zeros(n_cone)
        cone_b[head] = tau
        b_vec = np.concatenate([np.ones(nt), np.ones(n), np.zeros(n), cone_b])
        cones = [clarabel.NonnegativeConeT(nt + 2 * n)] + [clarabel.SecondOrderConeT(int(k) + 1) for k in per_user]
        st = clarabel.DefaultSettings()
        st.verbose = False
        t0, c0 = time.perf_counter(), time.process_time()
        sol = clarabel.DefaultSolver(sp.csc_matrix((n, n)), c, a_mat, b_vec, cones, st).solve()
        out.append({"tau": tau, "join_tuples": nt, "users": nu, "variables": n, "cones": nu, "status": str(sol.status),
                    "excess": float(nu + sol.obj_val), "seconds": time.perf_counter() - t0,
                    "cpu_seconds": time.process_time() - c0, "fetch_seconds": fetch_s})
        print(json.dumps({"unreduced_q5": out[-1]}), flush=True, file=sys.stderr)
    return out


def trimmed(xs: list[float], frac: float = 0.0) -> float:
    """Mean after dropping the largest and smallest (one each when there are ≥ 5 runs; with ``frac`` > 0,
    ⌊frac·n⌋ each, as the paper drops 20 of 100 on each side)."""
    xs = sorted(xs)
    k = int(frac * len(xs)) if frac > 0 else (1 if len(xs) >= 5 else 0)
    if k:
        xs = xs[k:-k]
    return statistics.mean(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=0.1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--q", type=float, nargs="+", default=[0.25, 0.0625])
    ap.add_argument("--queries", nargs="+", default=list(QUERIES))
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--delta", type=float, default=1e-7)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/out/s4s_vector_sf<sf>.json)")
    ap.add_argument("--trim", type=float, default=0.0, help="drop this fraction of runs on each side (paper: 0.2)")
    ap.add_argument("--no-clip", action="store_true", help="skip the per-user clipping rows (unchanged by DP-S4S)")
    ap.add_argument("--no-unreduced", action="store_true",
                    help="skip timing Q5's truncation program without the exact reductions (PMSJA's form)")
    args = ap.parse_args()
    d = data_dir(args.sf, partsupp_ids=any(QUERIES[n][0] == "ps" for n in args.queries))
    results = []
    unreduced = unreduced_program(d) if "q5" in args.queries and not args.no_unreduced else None
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.queries:
            people, sql = QUERIES[name]
            true = truth(d, sql)
            configs: list[tuple[str, float, dict[str, float]]] = [("dp_s4s", q, {}) for q in args.q]
            if people != "cs":
                if not args.no_clip:
                    configs.insert(0, ("clipped_gaussian", 1.0, {}))
                    if name.startswith("q7c"):  # a declared clip norm: about three line items' worth of revenue
                        configs.insert(1, ("clipped_gaussian", 1.0, {"clip_norm": 300000.0}))
            else:
                configs.insert(0, ("r2t", 1.0, {}))  # the unsampled variant (PMSJA with the RDP smooth-sensitivity release)
            for mech, q, extra in configs:
                s = session(d, people, tmp)
                opts: dict[str, object] = ({"mechanism": mech, **extra} if mech in ("clipped_gaussian", "r2t")
                                           else {"mechanism": "dp_s4s", "q": q})
                errs, secs, cpus = [], [], []
                _s4s_socp.STATS.reset()
                load0 = os.getloadavg()[0]
                for _ in range(args.runs):
                    t0, c0 = time.perf_counter(), time.process_time()
                    r = s.query(sql, epsilon=args.epsilon, delta=args.delta, options=opts)
                    secs.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
                    errs.append(l2_error(r.table, true))
                acc = next(iter(r.accuracy.values()))
                st = _s4s_socp.STATS
                row = {"query": name, "sf": args.sf, "mechanism": mech, "q": q, **extra, "groups": len(true),
                       "l2_relative_error": trimmed(errs, args.trim), "errors": errs,
                       "seconds_median": statistics.median(secs), "cpu_seconds_median": statistics.median(cpus),
                       "loadavg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
                       "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                       "taus_last_run": acc.get("taus"), "solver": {"socp": st.socp, "closed_form": st.closed_form,
                                                                  "retries": st.retries, "uncertified": st.uncertified,
                                                                  "max_variables": st.max_vars, "max_cones": st.max_cones}}
                print(json.dumps(row), flush=True, file=sys.stderr)
                results.append(row)
                s.close()
    os.makedirs(OUT, exist_ok=True)
    out = {"benchmark": "s4s_vector", "epsilon": args.epsilon, "delta": args.delta, "runs": args.runs, "trim": args.trim,
           "results": results, "load_average": list(os.getloadavg()),
           "unreduced_q5": unreduced,
           "paper_reference": "Q5 at SF 4, q = 1/4: 23.5% L2 relative error (PMSJA unsampled 13.9%), 38 s (PMSJA > 10 000 s)"}
    with open(args.out or os.path.join(OUT, f"s4s_vector_sf{args.sf:g}.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
