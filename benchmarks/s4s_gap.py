"""Benchmark diagnostic: where DP-S4S's error on graph pattern counts comes from (one sample, many schedules).

One command:  python benchmarks/s4s_gap.py [--graph ca-GrQc] [--query 2-path] [--q 0.0625] [--samples 200] [--out DIR]

For each of ``--samples`` Poisson samples S of the join tuples (rate q), the truncated values
f̄(S, τ_i) are computed once for every τ of the grid τ_i = 5.5^{i−1}, i = 1 … 9 (exact, with
``dpsql.mechanisms.truncated_value``), and one vector of standard Laplace draws Z_i is drawn.
Every schedule below is then evaluated on the same (S, Z) (common random numbers), so the
differences between schedules are not sampling noise:

    candidate_i = (f̄(S, τ_i) + λ_i Z_i − bias_i)/q,   estimate = max(0, max_i candidate_i).

Schedules (all with base 5.5, β = 0.1, ε = 1, bias ln(L/β)):

* ``product``: the product default, ``dpsql.mechanisms.s4s`` (declared Δ: 3D(D−1)/2 for
  2-paths, D(D−1)/2 for triangles; the snapping scales λ_i of the real mechanism);
* ``authors_delta``: **benchmark only, not a product option, unsound in general** — the authors'
  code: the grid from GS = D² (9 steps up to 5.5⁸) and Δ = ⌊5.5⁸⌋ = 837 339 in Lemma 3.1, which
  understates ε′ of the top steps when Δ exceeds the grid's top; λ_i = τ_i/ε_i (no snapping);
* ``delta_d2``: Δ = D² (the papers' GS), λ_i = τ_i/ε_i, also unsound for 2-paths (3D(D−1)/2 > D²).

Error decomposition at the chosen step i*: relative to the true count f,
sampling = (|S|/q − f)/f, truncation = (f̄(S, τ_i*) − |S|)/(q f) (≤ 0), noise = λ Z/(q f),
bias = −bias_i*/(q f); they add up to the unclamped relative error. Also: how often each τ is
chosen, the trimmed mean (20% + 20% dropped, as the paper and the authors' ``main.py`` do) over
all samples, and the spread of the trimmed mean of 10 runs (the authors' code's default
``--repeats 10``, i.e. 6 runs after trimming) and of 20 runs (``benchmarks/s4s.py``) by resampling the
per-sample errors.

The wall and process CPU time of the whole diagnostic are reported (the truncation dominates).
JSON goes to stdout and ``<out>/s4s_gap_<graph>_<query>_<q>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from s4s import D, incidence, load_graph, triangles, trimmed_mean, two_paths  # noqa: E402

from dpsql.accounting import s4s_epsilon_prime  # noqa: E402
from dpsql.mechanisms.s4s import _s4s_steps, truncated_value  # noqa: E402

BASE = 5.5
BETA = 0.1
EPS = 1.0


def plain_schedule(taus: list[float], delta: int, q: float) -> list[tuple[float, float, float]]:
    """(τ_i, λ_i, bias_i) of Algorithm 2's 1/i schedule, i = L … 1, with Δ in Lemma 3.1 (no snapping)."""
    big_l = len(taus)
    eps0 = EPS
    out = []
    for i in range(big_l, 0, -1):
        tau = taus[i - 1]
        eps_i = eps0 / i
        eps0 = max(0.0, eps0 - s4s_epsilon_prime(eps_i, tau, delta, q))
        lam = tau / eps_i
        out.append((tau, lam, lam * math.log(big_l / BETA)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graph", default="ca-GrQc")
    ap.add_argument("--query", default="2-path", choices=["2-path", "triangle"])
    ap.add_argument("--q", type=float, default=1 / 16)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    default_graphs = os.environ.get("DPSQL_GRAPHS", str(Path(__file__).resolve().parents[1].parent / "shared/data/graphs"))
    ap.add_argument("--graphs", default=default_graphs)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out"))
    args = ap.parse_args(argv)
    gdir = Path(args.graphs)
    if not gdir.is_dir() and Path("/work/shared/data/graphs").is_dir():
        gdir = Path("/work/shared/data/graphs")
    t0, c0 = time.perf_counter(), time.process_time()

    u, v = load_graph(gdir / f"{args.graph}.edges.csv.gz")
    cols = two_paths(u, v) if args.query == "2-path" else triangles(u, v)
    w, ti, ui = incidence(cols)
    truth = float(w.sum())
    q = args.q
    declared = 3 * D * (D - 1) // 2 if args.query == "2-path" else D * (D - 1) // 2

    prod = _s4s_steps(EPS, declared, q, BETA, BASE, False)
    taus_authors = [BASE**j for j in range(int(math.log(D * D, BASE)) + 1)]  # GS = D² (their l2/triangle)
    schedules: dict[str, list[tuple[float, float, float]]] = {
        "product": [(s.tau, s.snap_lambda, s.bias) for s in prod],
        "authors_delta": plain_schedule(taus_authors, int(taus_authors[-1]), q),
        "delta_d2": plain_schedule(taus_authors, D * D, q),
    }
    all_taus = sorted({t for sch in schedules.values() for t, _, _ in sch})

    rng = np.random.default_rng(args.seed)
    n = w.size
    per: dict[str, list[dict[str, float]]] = {k: [] for k in schedules}
    for _ in range(args.samples):
        mask = rng.random(n) < q
        keep = mask[ti]
        ws = np.where(mask, w, 0.0)
        size = float(ws.sum())
        fbar = {t: truncated_value(ws, ti[keep], ui[keep], t) for t in all_taus}
        z = rng.laplace(size=len(all_taus))
        zt = dict(zip(all_taus, z))
        for name, sch in schedules.items():
            cands = [(fbar[t] + lam * zt[t] - b) / q for t, lam, b in sch]
            k = int(np.argmax(cands))
            t, lam, b = sch[k]
            est = max(0.0, cands[k])
            per[name].append({
                "rel_error": abs(est - truth) / truth,
                "tau": t,
                "sampling": (size / q - truth) / truth,
                "truncation": (fbar[t] - size) / (q * truth),
                "noise": lam * zt[t] / (q * truth),
                "bias": -b / (q * truth),
            })

    res: dict[str, Any] = {}
    for name, rows in per.items():
        errs = [r["rel_error"] for r in rows]
        taus_chosen = [r["tau"] for r in rows]
        boot = np.random.default_rng(1)
        tm10 = [trimmed_mean(list(boot.choice(errs, 10))) for _ in range(2000)]
        tm20 = [trimmed_mean(list(boot.choice(errs, 20))) for _ in range(2000)]
        at = {}
        for t in sorted(set(taus_chosen)):
            sel = [r for r in rows if r["tau"] == t]
            at[f"{t:.1f}"] = {
                "share": len(sel) / len(rows),
                **{c: float(np.mean([r[c] for r in sel])) for c in ("sampling", "truncation", "noise", "bias", "rel_error")},
            }
        res[name] = {
            "schedule": [{"tau": t, "laplace_scale_over_q": lam / q, "bias_over_q": b / q, "bias_rel": b / q / truth}
                         for t, lam, b in schedules[name]],
            "rel_error_trimmed": trimmed_mean(errs),
            "rel_error_median": float(np.median(errs)),
            "rel_error_mean": float(np.mean(errs)),
            "trimmed_mean_of_10_runs": {"p05": float(np.quantile(tm10, 0.05)), "p50": float(np.median(tm10)),
                                        "p95": float(np.quantile(tm10, 0.95)),
                                        "share_at_or_below_0.42": float(np.mean(np.asarray(tm10) <= 0.42))},
            "trimmed_mean_of_20_runs": {"p05": float(np.quantile(tm20, 0.05)), "p50": float(np.median(tm20)),
                                        "p95": float(np.quantile(tm20, 0.95))},
            "sampling_error_sd": float(np.std([r["sampling"] for r in rows])),
            "by_chosen_tau": at,
            "errors": errs,
        }
    out = {"graph": args.graph, "query": args.query, "q": q, "samples": args.samples, "truth": truth,
           "tuples": int(n), "declared_delta": declared, "epsilon": EPS, "beta": BETA, "tau_base": BASE,
           "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "schedules": res}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    tag = f"{args.graph}_{args.query}_{round(1 / q)}"
    (Path(args.out) / f"s4s_gap_{tag}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
