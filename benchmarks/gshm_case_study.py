"""GSHM case study (Wilkins et al. Section 6; ``docs/mechanisms.md`` §1.9): exact vs add-the-deltas thresholds.

Setting: Facebook "URL shares", views column, max_groups C_u = 51,914, τ = 1, (ε, δ) = (0.349, 1e-5).
For σ on a grid from 2230 to 2400 (step 5) this computes the least noisy threshold τ* under the exact
accounting (Theorem 5.4) and under add-the-deltas, their ratio (of the margins τ* − τ), the time per
exact δ evaluation, compares with the table of ``docs/mechanisms.md`` §1.9, and plots τ* against σ.

Usage::

    python benchmarks/gshm_case_study.py [--out DIR]      # default DIR: benchmarks/out/

Writes DIR/gshm_case_study.json (also printed to stdout) and DIR/gshm_case_study.png (needs matplotlib;
if it is missing the JSON says so and everything else still runs).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from dpsql.accounting import (  # noqa: E402
    calibrate_sparse_histogram,
    gaussian_delta,
    gaussian_sigma,
    sparse_histogram_delta,
    sparse_histogram_min_tau_star,
    sparse_histogram_tau_star_lower_bound,
)
from dpsql.accounting.sparse_histogram import _exact_bruteforce  # noqa: E402

C_U = 51_914
TAU = 1
EPS = 0.349
DELTA = 1e-5

# docs/mechanisms.md §1.9 table (full precision from tests/vectors/sparse_histogram.json,
# case_study_facebook_urls.table_min_dtau_vs_sigma): sigma -> (Δτ exact, Δτ add-the-deltas)
SPEC_TABLE = {
    2228.0: (math.inf, math.inf),
    2230.0: (13959.549878680036, 15491.379057950098),
    2250.0: (14084.747635439498, 14785.500074964375),
    2300.0: (14397.742027338154, 14748.98671880237),
    2400.0: (15023.730811135465, 15169.131230362837),
    2528.0: (15824.996454396023, 15881.603820745077),
}
SPEC_TOLERANCE_DTAU = 1e-6  # absolute, as in the vector file


def _num(x: float) -> float | str:
    """JSON has no infinity: write it as the string "inf"."""
    return "inf" if math.isinf(x) else x


def row_for(sigma: float) -> dict:
    ts_exact = sparse_histogram_min_tau_star(EPS, DELTA, sigma=sigma, tau=TAU, max_groups=C_U)
    ts_add = sparse_histogram_min_tau_star(
        EPS, DELTA, sigma=sigma, tau=TAU, max_groups=C_U, method="add_the_deltas"
    )
    lb = sparse_histogram_tau_star_lower_bound(DELTA, sigma=sigma, tau=TAU, max_groups=C_U)
    d_ex, d_add = ts_exact - TAU, ts_add - TAU
    return {
        "sigma": sigma,
        "delta_gaussian": gaussian_delta(EPS, math.sqrt(C_U) / sigma),
        "tau_star_exact": _num(ts_exact),
        "tau_star_add_the_deltas": _num(ts_add),
        "dtau_exact": _num(d_ex),
        "dtau_add_the_deltas": _num(d_add),
        "dtau_closed_form_lower_bound": lb - TAU,
        "ratio_dtau_add_over_exact": (d_add / d_ex) if math.isfinite(d_ex) and math.isfinite(d_add) else None,
        "exact_equals_lower_bound": bool(math.isfinite(d_ex) and abs(d_ex - (lb - TAU)) <= 1e-9 * d_ex),
    }


def time_exact_delta(sigma: float, tau_star: float, repeats: int = 300) -> dict:
    def one() -> float:
        return sparse_histogram_delta(EPS, sigma=sigma, tau=TAU, tau_star=tau_star, max_groups=C_U)

    one()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    brute = _exact_bruteforce(EPS, sigma, tau_star - TAU, C_U, 0.0)
    t_brute = time.perf_counter() - t0
    return {
        "sigma": sigma,
        "tau_star": tau_star,
        "repeats": repeats,
        "seconds_per_exact_delta_median": statistics.median(times),
        "seconds_per_exact_delta_mean": statistics.fmean(times),
        "seconds_per_exact_delta_p95": float(np.quantile(times, 0.95)),
        "seconds_bruteforce_all_terms_accurate": t_brute,
        "delta_fast": one(),
        "delta_bruteforce": brute,
    }


def spec_comparison(rows_by_sigma: dict[float, dict]) -> list[dict]:
    out = []
    for sigma, (ex_ref, add_ref) in SPEC_TABLE.items():
        r = rows_by_sigma.get(sigma) or row_for(sigma)
        ex = math.inf if r["dtau_exact"] == "inf" else r["dtau_exact"]
        ad = math.inf if r["dtau_add_the_deltas"] == "inf" else r["dtau_add_the_deltas"]
        if math.isinf(ex_ref):
            ok = math.isinf(ex) and math.isinf(ad)
            diffs: tuple[float | None, float | None] = (None, None)
        else:
            diffs = (abs(ex - ex_ref), abs(ad - add_ref))
            ok = max(diffs) <= SPEC_TOLERANCE_DTAU
        out.append(
            {
                "sigma": sigma,
                "spec_dtau_exact": _num(ex_ref),
                "ours_dtau_exact": _num(ex),
                "spec_dtau_add_the_deltas": _num(add_ref),
                "ours_dtau_add_the_deltas": _num(ad),
                "abs_diff_exact": diffs[0],
                "abs_diff_add_the_deltas": diffs[1],
                "within_tolerance": ok,
            }
        )
    return out


def make_plot(rows: list[dict], path: Path, sigma_min: float) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        return f"matplotlib unavailable: {exc}"
    sig = [r["sigma"] for r in rows if r["tau_star_exact"] != "inf"]
    ex = [r["tau_star_exact"] for r in rows if r["tau_star_exact"] != "inf"]
    ad = [r["tau_star_add_the_deltas"] for r in rows if r["tau_star_exact"] != "inf"]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(sig, ex, label="exact (Theorem 5.4)", color="tab:blue", lw=2)
    ax.plot(sig, ad, label="add the deltas", color="tab:orange", lw=2, ls="--")
    ax.axvline(sigma_min, color="grey", lw=1, ls=":", label=f"Gaussian-only floor σ = {sigma_min:.2f}")
    ax.set_xlabel("σ (count noise std)")
    ax.set_ylabel("least noisy threshold τ*")
    ax.set_title(f"GSHM, URL shares: C_u = {C_U:,}, τ = {TAU}, (ε, δ) = ({EPS}, {DELTA:g})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out", help="output directory")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    sigmas = [float(s) for s in range(2230, 2401, 5)]
    rows = [row_for(s) for s in sigmas]
    t_grid = time.perf_counter() - t0
    by_sigma = {r["sigma"]: r for r in rows}

    timing = time_exact_delta(2300.0, float(by_sigma[2300.0]["tau_star_exact"]))
    t0 = time.perf_counter()
    cal_exact = calibrate_sparse_histogram(EPS, DELTA, tau=TAU, max_groups=C_U)
    t_cal_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    cal_add = calibrate_sparse_histogram(EPS, DELTA, tau=TAU, max_groups=C_U, method="add_the_deltas")
    t_cal_add = time.perf_counter() - t0
    sigma_min = gaussian_sigma(EPS, DELTA, math.sqrt(C_U))

    comparison = spec_comparison(by_sigma)
    png = args.out / "gshm_case_study.png"
    plot_error = make_plot(rows, png, sigma_min)

    ratios = [r["ratio_dtau_add_over_exact"] for r in rows if r["ratio_dtau_add_over_exact"] is not None]
    result = {
        "setting": {
            "max_groups": C_U,
            "tau": TAU,
            "epsilon": EPS,
            "delta": DELTA,
            "source": "docs/mechanisms.md §1.9",
        },
        "sigma_min_gaussian_only": sigma_min,
        "grid": {"sigma_from": sigmas[0], "sigma_to": sigmas[-1], "step": 5.0, "points": len(sigmas)},
        "rows": rows,
        "summary": {
            "ratio_dtau_add_over_exact_max": max(ratios),
            "ratio_dtau_add_over_exact_min": min(ratios),
            "exact_equals_closed_form_lower_bound_everywhere": all(
                r["exact_equals_lower_bound"] for r in rows
            ),
            "seconds_for_whole_grid_both_methods": t_grid,
        },
        "timing_exact_delta": timing,
        "calibration": {
            "exact": {
                "sigma": cal_exact.sigma,
                "tau_star": cal_exact.tau_star,
                "exact_delta": cal_exact.exact_delta,
                "release_count_p95": cal_exact.release_count,
                "seconds": t_cal_exact,
            },
            "add_the_deltas": {
                "sigma": cal_add.sigma,
                "tau_star": cal_add.tau_star,
                "exact_delta": cal_add.exact_delta,
                "release_count_p95": cal_add.release_count,
                "seconds": t_cal_add,
            },
        },
        "spec_comparison": comparison,
        "spec_comparison_all_within_tolerance": all(c["within_tolerance"] for c in comparison),
        "plot": str(png) if plot_error is None else None,
        "plot_error": plot_error,
        "environment": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
        },
    }
    text = json.dumps(result, indent=2)
    (args.out / "gshm_case_study.json").write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
