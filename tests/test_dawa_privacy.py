"""Empirical privacy test of DAWA stage 1 on a tiny domain, with a negative control.

n = 6, so every interval partition can be enumerated (32 with all intervals as candidates). Stage 1
is run N times (fixed seed, vectorised: one (N, #candidates) block of Laplace noise) on neighbouring
histograms x, x' (one bin changed by 1), the probability of every output partition is estimated,
and the test fails if for some partition the Clopper–Pearson lower confidence bound of
ln(P[x -> B] / P[x' -> B]) exceeds epsilon1 (both directions). Every bound is taken at level
1e-6 / (number of bounds), so a correct mechanism fails with probability <= 1e-6.

The Monte Carlo engine computes the argmin over enumerated partitions of the summed noisy costs;
it is first checked to return exactly what ``l1_partition`` returns for the same noise, so the test
exercises the production costs, scales, penalty and DP.

Negative control: the published reference calibration (half the safe scale for |b| >= 2,
noiseless singletons, spec 2.4) must be caught by the same test on the pair x = 0⁶, x' = e_4 at
epsilon1 = 1 (spec 2.4 reports a log-ratio of 2.31 there).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpsql.mechanisms.dawa import (
    DEFAULT_ALIGNMENT,
    DEFAULT_BUCKET_PENALTY,
    bucket_costs,
    l1_partition,
    stage1_float_calibration,
    stage1_noise_scales,
    stage1_noisy_costs,
)
from dpsql.testing import seeded_noise

N_RUNS = 600_000
EPS1 = 1.0
EPS2 = 3.0  # epsilon2 = 3 epsilon1, i.e. the default ratio 0.25
FAILURE_PROB = 1e-6

ScaleFn = Callable[[np.ndarray, float, int], np.ndarray]


def safe_scales(lengths: np.ndarray, eps1: float, n: int) -> np.ndarray:
    """The production calibration (spec 2.4 safe scale), through the library function."""
    return np.asarray(stage1_noise_scales(lengths, eps1, int(lengths.max())))


def reference_scales(lengths: np.ndarray, eps1: float, n: int) -> np.ndarray:
    """The reference code's calibration: (2 - 1/|b| - 1/n)/eps1, singletons noiseless."""
    return np.where(lengths > 1, (2.0 - 1.0 / lengths - 1.0 / n) / eps1, 0.0)


CONFIGS: dict[str, dict[str, Any]] = {
    # candidates, alignment, penalty used by the production default and by the spec's plain stage 1
    "default": {"dyadic": True, "alignment": DEFAULT_ALIGNMENT, "penalty": DEFAULT_BUCKET_PENALTY},
    "all_intervals": {"dyadic": False, "alignment": "none", "penalty": 0.0},
    "dyadic_any_start": {"dyadic": True, "alignment": "none", "penalty": 0.0},
}


def _enumerate(n: int, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Incidence matrix (partitions x candidates) of every partition made of candidate buckets."""
    index = {(int(s), int(s + L - 1)): i for i, (s, L) in enumerate(zip(starts, lengths, strict=True))}
    rows = []
    for mask in range(1 << (n - 1)):
        cuts = [i + 1 for i in range(n - 1) if mask >> i & 1]
        b = [0, *cuts, n]
        parts = [(b[i], b[i + 1] - 1) for i in range(len(b) - 1)]
        if all(p in index for p in parts):
            row = np.zeros(len(index))
            row[[index[p] for p in parts]] = 1.0
            rows.append(row)
    return np.array(rows)


def _setup(x: tuple[int, ...], config: str, scale_fn: ScaleFn):
    cfg = CONFIGS[config]
    starts, lengths, costs = bucket_costs(np.array(x), EPS2, dyadic=cfg["dyadic"], alignment=cfg["alignment"])
    # made floating-point safe as in production (slightly larger scales, public clamp and grid)
    scales, bound, grid = stage1_float_calibration(scale_fn(lengths, EPS1, len(x)), lengths.size, EPS1)
    shifted = costs + cfg["penalty"] * float(np.max(scales))  # what l1_partition adds
    return starts, lengths, shifted, (scales, bound, grid), _enumerate(len(x), starts, lengths)


def _noisy(shifted: np.ndarray, snap: tuple[np.ndarray, float, float], rng: Any, size: Any = None) -> np.ndarray:
    """The production noisy costs (clamped, on the exact grid)."""
    scales, bound, grid = snap
    return stage1_noisy_costs(shifted, scales, bound, grid, rng, size)


@cache
def partition_counts(x: tuple[int, ...], config: str, calibration: str, seed: int) -> np.ndarray:
    scale_fn = safe_scales if calibration == "safe" else reference_scales
    _, lengths, shifted, scales, inc = _setup(x, config, scale_fn)
    rng = seeded_noise(f"dawa-privacy:{seed}")
    counts = np.zeros(inc.shape[0])
    chunk = 100_000
    for k in range(0, N_RUNS, chunk):
        m = min(chunk, N_RUNS - k)
        noisy = _noisy(shifted, scales, rng, (m, lengths.size))
        counts += np.bincount(np.argmin(noisy @ inc.T, axis=1), minlength=inc.shape[0])
    return counts


def log_ratio_lower_bounds(c1: np.ndarray, c2: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """Per partition: lower confidence bound of ln(p1/p2) from Clopper–Pearson bounds at level alpha."""
    p1_lo = np.where(c1 > 0, stats.beta.ppf(alpha, c1, n - c1 + 1), 0.0)
    p2_hi = np.where(c2 < n, stats.beta.ppf(1 - alpha, c2 + 1, n - c2), 1.0)
    with np.errstate(divide="ignore"):
        return np.log(p1_lo) - np.log(p2_hi)


def max_lower_bound(
    x: tuple[int, ...], xp: tuple[int, ...], config: str, calibration: str, n_bounds: int
) -> float:
    a = partition_counts(x, config, calibration, 1)
    b = partition_counts(xp, config, calibration, 2)
    alpha = FAILURE_PROB / n_bounds
    lb = np.maximum(log_ratio_lower_bounds(a, b, N_RUNS, alpha), log_ratio_lower_bounds(b, a, N_RUNS, alpha))
    return float(np.max(lb))


def point_estimate(
    x: tuple[int, ...], xp: tuple[int, ...], config: str, calibration: str, min_count: int = 200
) -> float:
    a = partition_counts(x, config, calibration, 1)
    b = partition_counts(xp, config, calibration, 2)
    ok = (a >= min_count) & (b >= min_count)
    return float(np.max(np.abs(np.log(a[ok]) - np.log(b[ok]))))


ZERO = (0, 0, 0, 0, 0, 0)
E4 = (0, 0, 0, 0, 1, 0)
FLAT = (3, 3, 3, 3, 3, 3)
FLAT_UP = (3, 3, 3, 4, 3, 3)
STEP = (0, 0, 0, 5, 5, 5)
STEP_DOWN = (0, 0, 0, 4, 5, 5)
PAIRS = [(ZERO, E4), (FLAT, FLAT_UP), (STEP, STEP_DOWN)]
#: every bound computed by this module counts against the failure budget
N_BOUNDS = 2 * 32 * (len(PAIRS) * len(CONFIGS) + 1) * 2


@pytest.mark.parametrize("config", list(CONFIGS))
def test_monte_carlo_engine_is_l1_partition(config):
    """Same noise in, same partition out: the enumerator reproduces the production stage 1."""
    cfg = CONFIGS[config]
    for x in (ZERO, E4, STEP, (7, 0, 2, 2, 9, 1)):
        starts, lengths, shifted, scales, inc = _setup(x, config, safe_scales)
        for seed in range(40):
            got = l1_partition(
                np.array(x),
                EPS1,
                EPS2,
                seeded_noise(f"engine:{seed}"),
                dyadic=cfg["dyadic"],
                alignment=cfg["alignment"],
                bucket_penalty=cfg["penalty"],
            )
            noisy = _noisy(shifted, scales, seeded_noise(f"engine:{seed}"))
            row = inc[int(np.argmin(inc @ noisy))]
            want = sorted((int(starts[i]), int(starts[i] + lengths[i] - 1)) for i in np.flatnonzero(row))
            assert got == want


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize(("x", "xp"), PAIRS, ids=["zero-vs-e4", "flat-vs-bump", "step-vs-lower"])
def test_stage1_log_ratio_within_epsilon1(config, x, xp):
    lb = max_lower_bound(x, xp, config, "safe", N_BOUNDS)
    assert lb <= EPS1, f"stage 1 exceeds epsilon1: log-ratio lower bound {lb:.3f} > {EPS1}"
    # the point estimate stays well inside too (spec 2.4 observed about 0.64 at epsilon1 = 1)
    assert point_estimate(x, xp, config, "safe") < EPS1


def test_negative_control_reference_calibration_is_caught():
    """Half the scale and noiseless singletons (the published code, without its clamp) violate."""
    lb = max_lower_bound(ZERO, E4, "all_intervals", "reference", N_BOUNDS)
    assert lb > EPS1 + 0.5, f"the test failed to detect the under-noised stage 1 (bound {lb:.3f})"
    assert point_estimate(ZERO, E4, "all_intervals", "reference") > 2.0
