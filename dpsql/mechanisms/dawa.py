"""DAWA: data- and workload-aware answers to range-query workloads (``docs/mechanisms.md`` §2).

Li, Hay, Miklau, Wang, "A Data- and Workload-Aware Algorithm for Range Queries Under Differential
Privacy", PVLDB 7(5) 2014. Pure numpy/scipy; the SQL layer builds the histogram and the workload.
Section numbers § below refer to ``docs/mechanisms.md``.

Privacy claim
-------------
``dawa(x, ranges, epsilon, rng, sensitivity=k)`` is ``epsilon``-differentially private with
respect to the neighbouring relation "x and x' differ by at most k in L1 norm" (k = 1: add or
remove one record, which changes one bin by 1). User-level privacy is the caller's job: bound each
user to k rows and pass ``sensitivity=k``; every noise scale below is multiplied by k (stage 1 is
then epsilon1/k-DP per unit change and epsilon1-DP for k of them by group privacy; stage 2 has
L1 sensitivity k ‖A‖₁ <= k).

* Stage 1 (§2.2, §2.4), epsilon1 = ratio * epsilon (default ratio 0.25, §2.7). Every
  candidate bucket b has cost bcost(x, b) = dev(x, b) + k/epsilon2 + penalty, with
  dev(x, b) = Σ_{j∈b} |x_j − mean_b|, whose sensitivity is Δ_b = 2(1 − 1/|b|) for the buckets
  containing the changed bin and 0 for all others (the other two terms are public constants).
  Each cost gets independent Laplace noise of scale k (Δ_b + Δ_max)/epsilon1,
  Δ_max = 2(1 − 1/L_max) with L_max the longest candidate length — singletons included (scale
  k Δ_max/epsilon1) — and the partition of least noisy cost is chosen with NO clamping of the
  noisy costs. This is the SAFE calibration of §2.4 (a report-noisy-min argument over the
  buckets through the changed bin, valid for any public candidate set containing the
  singletons). It is deliberately MORE CONSERVATIVE than the published reference code (ektelo /
  dpcomp_core), which uses half this scale for |b| >= 2, leaves singletons noiseless and clamps
  noisy costs at 1/epsilon2 — a calibration §2.4 shows empirically to exceed epsilon1
  (log-ratio 2.31 at epsilon1 = 1), and which ``tests/test_dawa_privacy.py`` catches as a
  negative control.
* Stage 2 (§2.3), epsilon2 = epsilon − epsilon1: bucket totals y = B(x) (one record moves one
  y_i by 1); GreedyH picks a weighted hierarchical strategy A from the workload and the partition
  only, with ‖A‖₁ <= 1 (weights on every root-to-leaf path sum to 1, renormalised against
  rounding); z = A y + Lap(k/epsilon2) on every measured row is epsilon2-DP.
* Floating point (``dpsql.noise``). Stage 2 is Mironov's snapping mechanism on every measured
  row (clamp to a public B, Laplace, round to the power-of-two grid Lambda >= lambda, clamp):
  one unit changes at most N = min(rows, ceil(k) * levels) rows (one per level per record) by
  k ||A||_1 in L1 norm (||A||_1 the exact norm of the float weights, bounded above by
  :func:`measured_l1_bound`: their float sum is not), and lambda is raised so that the proven loss
  k ||A||_1 / lambda + N 2^-45 (B/lambda + 2) equals at most epsilon2 (B <= 2^62/(buckets+1), so
  every answer stays in int64: :func:`stage2_max_bound`). Stage 1 releases nothing but its choice, so it needs the
  report-noisy-min argument above to survive floating point rather than snapping (snapping
  each cost to a grid Lambda >= lambda would move the threshold by a whole noise scale). Three
  things make it hold: (a) every noisy cost is clamp_[-B1,B1](g rint((clamp_[0,B1](cost) +
  Lap(b_e)) / g)) with the public B1 = 2^20 max_e b_e and the power-of-two grid
  g >= #candidates * B1 * 2^-50, so every partition cost the DP adds up is an exact multiple of g
  (below 2^53 g) and the DP is an exact argmin with a fixed tie rule: e wins iff its noisy cost
  is in a half-line, given all other noise (lowering e's cost keeps e's path optimal and first
  among ties at every step); (b) the costs are computed from the integer histogram with every
  bin capped at the public 2^59/n^2 (1-Lipschitz, so the sensitivity is unchanged), which makes
  L * dev an exact int64 and the cost exact up to one rounding and the addition of the public
  constants (<= 2^-52 B1 after the clamp, below g); other buckets' noisy costs thus move by at
  most k Delta_f + g + 2g between neighbours, and the threshold by at most
  k (Delta_e + Delta_max) + 4g;
  (c) the float Laplace's half-line probabilities on |t| <= 2 B1 + g are within
  exp(2^-47 (B1 + g)/b_e + 2^-47) of the exact Laplace ones (``dpsql.noise`` section 2, step (i)).
  The argument covers a neighbour that changes one bin by one record; a unit with k rows is k
  such steps (group privacy), each of which must be epsilon1/k-DP, so the floating-point slack is
  paid k times: b_e = (k (Delta_e + Delta_max) + k (4g + 2^-47 (B1 + g))) / (epsilon1 - k 2^-47)
  (:func:`stage1_float_calibration`) keeps stage 1 epsilon1-DP. A cost above B1 is clamped (only
  bad buckets are that expensive). :func:`dawa_precheck` refuses unrepresentable parameters
  before any charge.
* Sequential composition (§2.5): epsilon1 + epsilon2 <= epsilon as exact numbers (epsilon2 is rounded down). Least squares, uniform
  expansion, answering later ranges, coarsening and serialisation are post-processing.
* With ``partition=`` a public, data-independent partition replaces stage 1 and all of epsilon
  goes to stage 2.

Choices that differ from the reference defaults (utility only; none changes the privacy argument)
------------------------------------------------------------------------------------------------
* Candidate buckets: dyadic lengths with starts at multiples of L/2 (``alignment="half"``, about
  4n buckets) instead of every start (§2.2, §2.7; ``alignment="none"``), and a public per-bucket
  cost offset ``bucket_penalty`` = 1.75 × the largest stage-1 noise scale. Without the clamp of
  the reference code, the argmin over noisy costs rewards every extra bucket with its favourable
  noise (a winner's curse), so runs of empty bins are cut into hundreds of buckets; both choices
  counter this. They were selected on 56 DPBench configurations (7 datasets × 2 scales × 2
  epsilons × 2 workloads, ``benchmarks/dawa.py``); ``alignment="none", bucket_penalty=0`` gives
  the plain stage 1 of §2.2.
* GreedyH chooses each node's split p by the exact least-squares error of the queries relevant
  to the node — those meeting the node but not covering its parent entirely (queries covering the
  parent are served by the ancestors' measurements) — instead of the reference code's
  branch^(-depth/2) damping; the root's value is the exact workload error of the final strategy.
* Adjacent buckets that no query can tell apart (identical columns of W̄) are merged into one
  group measured as a whole (the reference code makes such tree nodes leaves, §2.3); the group
  total is spread over its buckets by length.

Released values: the synopsis holds the raw float estimates (bucket totals, and the per-bin
uniform expansion derived from them). The caller rounds them to its declared granularity before
release (:meth:`DawaSynopsis.rounded`, i.e. :func:`dpsql.noise.round_to_granularity`), which is
post-processing and keeps float sample bits out of the output; ``to_json`` stores whatever the
synopsis holds, so store a rounded synopsis.

Accuracy (:meth:`DawaSynopsis.noise_bounds`, ``docs/mechanisms.md`` §2.5): the partition and the
stage-2 strategy are public, so each answer's stage-2 noise is an exactly known linear function of the
measurement noise; its std and a 95% half-width around the bucket-uniform truth (not the true count:
the partition's bias is data dependent) are published per answer.

Noise: every Laplace variate comes from the ``rng`` argument (a :class:`dpsql.noise.NoiseSource`;
no seeds, no global RNG): stage 1 draws one vector of len(candidates) variates, stage 2 one of
n_measurements.

Complexity (n bins; c candidate buckets: ≈ 4n half-aligned, O(n log n) any-start dyadic, O(n²)
all intervals; m queries given as I intervals; k buckets in K groups; branch b; granularity g):

* stage 1 costs: O(c log U), U <= n distinct counts (windows of length <= 32 directly, longer ones
  by a wavelet matrix answering "count and sum of the values below the window mean" — §2.2's
  order-statistics sliding window done offline and vectorised): O(n log n) half-aligned,
  O(n log² n) any-start dyadic;
* stage 1 least-cost partition: O(n log n) DP over right endpoints (all intervals: O(n²));
* GreedyH: O((I log K + n + g K) log_b K);
* measurement + least squares (two passes over the tree) + uniform expansion: O(K log_b K + n);
* answering m ranges: O(n + m) by prefix sums (no dense n × n or m × n matrices anywhere).

2-D (§2.6): the grid's cells are listed in the Hilbert order of the d × d square that contains
it (d a power of two; :func:`hilbert_order`, the orientation of ``tests/vectors/dawa.json``),
skipping the padding cells, which hold no data (the paper keeps them as zeros; skipping them stops
the estimate from spreading mass onto them; only the real cells are ever listed, so the order takes
O(n1 n2) memory whatever d: :func:`grid_order`); rectangles become unions of runs of positions (0/1
interval queries, O(perimeter) each), 1-D DAWA runs on the n1 n2 vector and estimates are mapped
back; rectangles are answered by 2-D prefix sums.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.errors import ConfigError
from dpsql.mechanisms._dawa_greedyh import (
    HierarchicalStrategy,
    IntervalWorkload,
    as_workload,
    greedy_h,
    measured_l1_bound,
    stage2_max_bound,
    strategy_from_splits,
)
from dpsql.mechanisms._dawa_hilbert import (
    check_rects,
    grid_order,
    hilbert_index,
    hilbert_order,
    rects_to_workload,
    side_for,
)
from dpsql.mechanisms._dawa_partition import (
    ALIGNMENTS,
    DEFAULT_ALIGNMENT,
    DEFAULT_BUCKET_PENALTY,
    MAX_N_ALL_INTERVALS,
    Partition,
    _as_data_vector,
    _check_partition,
    bucket_costs,
    candidate_buckets,
    candidate_lengths,
    deviation,
    deviation_sensitivity,
    l1_partition,
    least_cost_partition,
    partition_cost,
    stage1_float_calibration,
    stage1_noise_scales,
    stage1_noisy_costs,
    window_deviations,
)
from dpsql.noise import NoiseSource, round_to_granularity

__all__ = [
    "ALIGNMENTS",
    "DEFAULT_ALIGNMENT",
    "DEFAULT_BUCKET_PENALTY",
    "MAX_N_ALL_INTERVALS",
    "DawaSynopsis",
    "DawaSynopsis2D",
    "HierarchicalStrategy",
    "IntervalWorkload",
    "Partition",
    "bucket_costs",
    "candidate_buckets",
    "candidate_lengths",
    "dawa",
    "dawa_2d",
    "deviation",
    "deviation_sensitivity",
    "greedy_h",
    "grid_order",
    "hilbert_index",
    "hilbert_order",
    "l1_partition",
    "least_cost_partition",
    "partition_cost",
    "rects_to_workload",
    "dawa_precheck",
    "stage1_float_calibration",
    "stage1_noise_scales",
    "stage1_noisy_costs",
    "strategy_from_splits",
    "window_deviations",
]

#: a valid 95% half-width, in standard deviations, of any weighted sum of independent Laplace variates:
#: sqrt(0.33144 / 0.05) = 2.5746, rounded up (:meth:`DawaSynopsis.noise_bounds`)
NOISE95 = 2.58


def snapped_laplace_moments(rho: float, phase: object) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance, in units of λ and λ², of the snapped Laplace noise Λ·rint((x + L)/Λ) − x
    (L ~ Laplace(λ), no clamping) for inputs x with x mod Λ = ``phase`` · λ; ``rho`` = Λ/λ."""
    phi = np.asarray(phase, dtype=np.float64).reshape(-1, 1)
    kmax = int(math.ceil(60.0 / rho)) + 2
    v = np.arange(-kmax, kmax + 1, dtype=np.float64)[None, :] * rho - phi

    def cdf(t: np.ndarray) -> np.ndarray:
        return np.where(t < 0, 0.5 * np.exp(np.minimum(t, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(t, 0.0)))

    p = cdf(v + rho / 2) - cdf(v - rho / 2)
    m1 = (p * v).sum(axis=1)
    return m1, (p * v * v).sum(axis=1) - m1**2


@functools.lru_cache(maxsize=256)
def snapped_laplace_variance(rho: float) -> float:
    """The largest variance (units of λ²) of one snapped Laplace over the phase of its input, Λ/λ = ``rho``:
    2 + rho²/12 up to a few % (2.448 at rho = 2). The maximum over 4096 phases, raised by 0.1% (the
    variance moves by less than that between grid points). Kept per ``rho`` (a function of public
    parameters only; about 30 ms to compute, for every workload query's accuracy)."""
    _, var = snapped_laplace_moments(rho, np.linspace(0.0, rho, 4097))
    return float(var.max()) * 1.001


_KIND_1D = "dpsql.dawa.synopsis"
_KIND_2D = "dpsql.dawa.synopsis2d"
_VERSION = 1


def _coarsen_1d(h: np.ndarray, factor: int) -> np.ndarray:
    if isinstance(factor, bool) or int(factor) != factor or factor < 1:
        raise ConfigError("bin_factor must be an integer >= 1")
    f = int(factor)
    return np.add.reduceat(h, np.arange(0, h.size, f))


@dataclass(frozen=True, eq=False)
class DawaSynopsis:
    """The released DAWA histogram: partition, estimated bucket totals, uniform expansion.

    ``starts``/``ends`` are the closed bucket intervals (bin indices), ``bucket_totals`` the raw
    float least-squares estimates (round before release: :meth:`rounded`). ``params`` records the
    public parameters of the run (epsilon split, sensitivity, branch, granularity, candidates).
    """

    n: int
    starts: np.ndarray
    ends: np.ndarray
    bucket_totals: np.ndarray
    epsilon: float
    epsilon1: float
    epsilon2: float
    sensitivity: float
    params: dict[str, Any] = field(default_factory=dict)
    #: the stage-2 strategy (public: a function of the partition and the workload), stored with the
    #: synopsis when small enough for :meth:`noise_bounds` (:meth:`HierarchicalStrategy.to_dict`)
    strategy: HierarchicalStrategy | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _check_partition(np.stack([self.starts, self.ends], axis=1), self.n)
        if self.bucket_totals.shape != self.starts.shape:
            raise ConfigError("one bucket total per bucket is required")

    @property
    def partition(self) -> Partition:
        return list(zip(self.starts.tolist(), self.ends.tolist(), strict=True))

    def histogram(self) -> np.ndarray:
        """Per-bin estimate x̂ (uniform expansion: x̂_j = ŷ_i / |b_i| for j in b_i)."""
        lens = self.ends - self.starts + 1
        return np.repeat(self.bucket_totals / lens, lens)

    def answer_ranges(self, ranges: object) -> np.ndarray:
        """Answers to any ranges ``(lo, hi)`` (inclusive) from x̂ — free post-processing."""
        return IntervalWorkload.from_ranges(ranges, self.n).answer(self.histogram())

    def answer(self, workload: IntervalWorkload) -> np.ndarray:
        """Answers to a general interval workload over the n bins."""
        return as_workload(workload, self.n).answer(self.histogram())

    def coarsen(self, bin_factor: int) -> np.ndarray:
        """x̂ summed over consecutive blocks of ``bin_factor`` bins (the last block may be shorter)."""
        return _coarsen_1d(self.histogram(), bin_factor)

    def rounded(self, granularity: float = 1.0) -> DawaSynopsis:
        """Same synopsis with bucket totals on multiples of ``granularity`` and clipped to
        +-2^62/(n+1), so every answer fits in an int64 (post-processing).

        The running totals are rounded, not each bucket's: a bucket's total is the difference of
        two rounded running totals, so a range of whole buckets stays within one ``granularity``
        of the unrounded estimate. Rounding each bucket on its own adds up one error per bucket
        in the range, the same way on every run (a group measured as a whole is spread over its
        buckets by length, so its buckets share one fraction): at epsilon = 1000, the count of
        a 100-value domain of 2620 rows came out 2600."""
        lim = stage2_max_bound(self.n)
        running = round_to_granularity(np.cumsum(np.asarray(self.bucket_totals, dtype=np.float64)), granularity)
        totals = np.diff(running, prepend=0.0)
        if granularity != 1.0:  # a difference of two grid points, back onto the decimal grid
            totals = round_to_granularity(totals, granularity)
        return DawaSynopsis(
            self.n,
            self.starts.copy(),
            self.ends.copy(),
            np.clip(totals, -lim, lim),
            self.epsilon,
            self.epsilon1,
            self.epsilon2,
            self.sensitivity,
            {**self.params, "rounded_to": float(granularity)},
            self.strategy,
        )

    def noise_bounds(self, workload: object) -> tuple[np.ndarray, np.ndarray] | None:
        """(std, half-width) of the stage-2 NOISE of each query's raw (unrounded) answer, or None.

        The answer to q is Σ_g w_g ĝ_g (w_g = |q ∩ g| / |g|, ĝ the least-squares group totals), and
        least squares is linear and unbiased, so answer − T_q = a_qᵀ e exactly, where T_q = Σ_g w_g g_g
        is the truth spread uniformly within the strategy's groups (within the stage-1 buckets for the
        workload the strategy was built for; the partition's bias T_q − q(x) is not covered) and e the
        snapped-Laplace measurement noise. e_r = L_r + R_r with L_r ~ Laplace(λ) independent and
        |R_r| <= Λ/2 the snapping grid's rounding. Hence:

        * std <= √v(Λ/λ) · λ ‖a_q‖₂, with v the largest variance of one snapped Laplace over the
          phase of its input (:func:`snapped_laplace_variance`: 2 + (Λ/λ)²/12 up to a few %);
        * P(|a_qᵀL| > t) <= 0.3315 · 2λ²‖a_q‖₂² / t² for every weight vector a_q (a sum of independent
          Laplace variates is a scale mixture of normals, N(0, V) with E V = σ², and
          2Φ̄(t/√v) <= 0.3315 v / t² for all v), so t = 2.58 σ is a valid 95% half-width whatever the
          mix (a single Laplace needs 2.12 σ, a normal 1.96 σ); |a_qᵀR| <= (Λ/2)‖a_q‖₁ is added.

        None without the strategy (a synopsis stored without it), when the exact computation is too
        large (:meth:`HierarchicalStrategy.answer_noise`), or when a released total lies near the
        public snapping bound B (a measurement may have been clamped)."""
        snap = self.params.get("stage2_snapping")
        if self.strategy is None or not snap:
            return None
        lam, grid, bound = float(snap["lambda"]), float(snap["grid"]), float(snap["bound"])
        if float(np.sum(np.abs(self.bucket_totals))) >= bound / 2:
            return None
        norms = self.strategy.answer_noise(as_workload(workload, self.n))
        if norms is None:
            return None
        l2, l1 = norms
        std = math.sqrt(snapped_laplace_variance(grid / lam)) * lam * l2
        half = NOISE95 * math.sqrt(2.0) * lam * l2 + grid / 2.0 * l1
        if not (np.all(np.isfinite(std)) and np.all(np.isfinite(half))):
            return None  # a stored strategy whose weights are too small to invert
        return std, half

    def rounding_bound(self, workload: object) -> np.ndarray:
        """Per query, the largest change :meth:`rounded` can make to its answer: 0 if unrounded, else
        TV/2 · granularity with TV = Σ_i |f_i − f_(i+1)| the total variation of the query's bucket shares
        f_i = |q ∩ b_i| / |b_i| (f = 0 outside): a rounded total is t_i = ŷ_i + δ_i − δ_(i−1), with δ the
        rounding of the running totals (|δ| <= granularity / 2), so the answer Σ f_i t_i moves by
        Σ δ_i (f_i − f_(i+1)). At most 1 for a range, 1/|b| for one bin of bucket b, and far below one
        per run for a 2-D rectangle whose runs share buckets."""
        wl = as_workload(workload, self.n)
        g = float(self.params.get("rounded_to", 0.0))
        if g == 0.0 or wl.n_queries == 0:
            return np.zeros(wl.n_queries)
        k = self.starts.size
        lens = (self.ends - self.starts + 1).astype(np.float64)
        ba = np.searchsorted(self.ends, wl.lo, side="left")
        bb = np.searchsorted(self.ends, wl.hi, side="left")
        same = ba == bb
        # pieces of every query: partial buckets (coverage, merged over the query's intervals) and runs of
        # whole buckets (share 1) in between
        p_q = np.r_[wl.qid, wl.qid[~same]]
        p_b = np.r_[ba, bb[~same]]
        p_cov = np.r_[np.where(same, wl.hi - wl.lo + 1, self.ends[ba] - wl.lo + 1), (wl.hi - self.starts[bb] + 1)[~same]]
        key, inv = np.unique(p_q * (k + 1) + p_b, return_inverse=True)
        cov = np.bincount(inv, weights=p_cov.astype(np.float64))
        part_q, part_b = key // (k + 1), key % (k + 1)
        run = ~same & (bb - ba > 1)
        q = np.r_[part_q, wl.qid[run]]
        st = np.r_[part_b, ba[run] + 1]
        en = np.r_[part_b, bb[run] - 1]
        val = np.r_[cov / lens[part_b], np.ones(int(run.sum()))]
        order = np.lexsort((st, q))
        q, st, en, val = q[order], st[order], en[order], val[order]
        nxt = np.r_[q[1:] == q[:-1], False]  # the next piece belongs to the same query
        adjacent = nxt & (np.r_[st[1:], 0] == en + 1)
        step = np.where(adjacent, np.abs(val - np.r_[val[1:], 0.0]), val + np.where(nxt, np.r_[val[1:], 0.0], 0.0))
        first = np.r_[True, q[1:] != q[:-1]]
        tv = np.bincount(q, weights=step + np.where(first, val, 0.0), minlength=wl.n_queries)
        return tv / 2.0 * g

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": _KIND_1D,
            "version": _VERSION,
            "n": self.n,
            "bucket_lengths": (self.ends - self.starts + 1).tolist(),
            "bucket_totals": [float(v) for v in self.bucket_totals],
            "epsilon": self.epsilon,
            "epsilon1": self.epsilon1,
            "epsilon2": self.epsilon2,
            "sensitivity": self.sensitivity,
            "params": self.params,
            **({"strategy": st} if (st := self._strategy_dict()) is not None else {}),
        }

    def _strategy_dict(self) -> dict[str, Any] | None:
        if self.strategy is None:
            return None
        return self.strategy.to_dict(int(self.params.get("branch", 2)))

    def to_json(self) -> str:
        """JSON text (floats written with round-trip precision)."""
        return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DawaSynopsis:
        if d.get("kind") != _KIND_1D or d.get("version") != _VERSION:
            raise ConfigError(f"not a version-{_VERSION} DAWA synopsis: kind={d.get('kind')!r}")
        lens = np.asarray(d["bucket_lengths"], dtype=np.int64)
        ends = np.cumsum(lens) - 1
        starts = ends - lens + 1
        stored = d.get("strategy")
        strategy = HierarchicalStrategy.from_dict(stored, lens) if isinstance(stored, dict) else None
        return cls(
            int(d["n"]),
            starts,
            ends,
            np.asarray(d["bucket_totals"], dtype=np.float64),
            float(d["epsilon"]),
            float(d["epsilon1"]),
            float(d["epsilon2"]),
            float(d["sensitivity"]),
            dict(d.get("params", {})),
            strategy,
        )

    @classmethod
    def from_json(cls, text: str) -> DawaSynopsis:
        return cls.from_dict(json.loads(text))


def epsilon_shares(epsilon: float, ratio: float) -> tuple[float, float]:
    """(epsilon1, epsilon2) a staged run at ``epsilon`` and ``ratio`` uses: what explain and the ledger state (the
    product (1 - ratio) * epsilon can be an ulp above epsilon2, and the two shares' sum above epsilon)."""
    _, eps1, eps2 = _check_epsilon(epsilon, ratio, True)
    return eps1, eps2


def _check_epsilon(epsilon: float, ratio: float, staged: bool) -> tuple[float, float, float]:
    eps = float(epsilon)
    if not np.isfinite(eps) or eps <= 0:
        raise ConfigError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not staged:
        return eps, 0.0, eps
    r = float(ratio)
    if not (0.0 < r < 1.0):
        raise ConfigError(
            f"ratio (the share of epsilon spent on the partition) must be in (0, 1), got {ratio!r}"
        )
    eps1 = r * eps
    eps2 = eps - eps1
    # sequential composition needs eps1 + eps2 <= eps exactly: the rounded difference can exceed it
    # by half an ulp, so eps2 steps down to the largest float that keeps the exact sum within eps
    while Fraction(eps1) + Fraction(eps2) > Fraction(eps):
        eps2 = math.nextafter(eps2, 0.0)
    return eps, eps1, eps2


def dawa(
    x: object,
    ranges: object,
    epsilon: float,
    rng: NoiseSource,
    *,
    ratio: float = 0.25,
    sensitivity: float = 1.0,
    branch: int = 2,
    granularity: int = 100,
    dyadic: bool = True,
    alignment: str = DEFAULT_ALIGNMENT,
    bucket_penalty: float = DEFAULT_BUCKET_PENALTY,
    partition: Sequence[tuple[int, int]] | None = None,
) -> DawaSynopsis:
    """epsilon-DP DAWA synopsis of the histogram ``x`` tuned to the workload ``ranges``.

    ``ranges``: an (m, 2) array of inclusive ``(lo, hi)`` bin indices, or an
    :class:`IntervalWorkload`. ``ratio``: share of epsilon for stage 1. ``sensitivity``: k when
    each user is bounded to k rows. ``branch``/``granularity``: GreedyH's tree fan-out and split
    grid. Stage-1 candidates: ``dyadic`` lengths with starts per ``alignment`` ("half" default,
    "none" = §2.2, "full"), or all O(n²) intervals with ``dyadic=False`` (n <= 2048);
    ``bucket_penalty``: public per-bucket cost offset in units of the largest stage-1 noise scale
    (see :func:`l1_partition`). ``partition``: a public, data-independent partition that replaces
    stage 1 (then all of epsilon goes to stage 2). Returns raw float estimates; round before
    release. The same ``rng`` supplies the noise of both stages.
    """
    xv = _as_data_vector(x)
    n = xv.size
    sens = float(sensitivity)
    if not np.isfinite(sens) or sens <= 0:
        raise ConfigError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    wl = as_workload(ranges, n)
    eps, eps1, eps2 = _check_epsilon(epsilon, ratio, partition is None)
    if partition is None:
        parts = l1_partition(
            xv,
            eps1,
            eps2,
            rng,
            sensitivity=sens,
            dyadic=dyadic,
            alignment=alignment,
            bucket_penalty=bucket_penalty,
        )
    else:
        st_, en_ = _check_partition(partition, n)
        parts = list(zip(st_.tolist(), en_.tolist(), strict=True))
    strategy = greedy_h(wl, parts, branch=branch, granularity=granularity)
    st = np.asarray([p[0] for p in parts], dtype=np.int64)
    en = np.asarray([p[1] for p in parts], dtype=np.int64)
    csum = np.zeros(n + 1)
    np.cumsum(xv, out=csum[1:])
    y = csum[en + 1] - csum[st]
    lam2, grid2, bound2, rows2 = strategy.snapping(eps2, sensitivity=sens)
    z = strategy.measure(y, eps2, rng, sensitivity=sens)
    y_hat = strategy.infer(z)
    params = {
        "ratio": float(ratio) if partition is None else 0.0,
        "branch": int(branch),
        "granularity": int(granularity),
        "candidates": ("dyadic/" + alignment) if dyadic else "all",
        "bucket_penalty": float(bucket_penalty) if partition is None else 0.0,
        "public_partition": partition is not None,
        "n_measurements": strategy.n_measurements,
        "stage2_snapping": {"lambda": lam2, "grid": grid2, "bound": bound2, "changed_rows": rows2},
    }
    return DawaSynopsis(n, st, en, y_hat, eps, eps1, eps2, sens, params, strategy)


def dawa_precheck(n: int, epsilon: float, *, ratio: float = 0.25, sensitivity: float = 1.0, staged: bool = True) -> None:
    """Refuse (ConfigError) parameters whose DAWA noise cannot be represented, reading no data.

    Run before the budget is charged: the same checks :func:`dawa` makes, with the worst case over
    partitions (at most n buckets, ceil(log2 n) + 2 tree levels).
    """
    eps, eps1, eps2 = _check_epsilon(epsilon, ratio, staged)
    sens = float(sensitivity)
    if not np.isfinite(sens) or sens <= 0:
        raise ConfigError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    nn = max(1, int(n))
    levels = int(np.ceil(np.log2(nn))) + 2 if nn > 1 else 1
    from dpsql.noise import snapping_calibration

    # at least the run's sensitivity (measured_l1_bound of a float norm within a few ulps of 1, over fewer levels)
    snapping_calibration(
        measured_l1_bound(sens, 1.0, levels + 4), eps2, coordinates=int(np.ceil(sens)) * levels, integer=True,
        what="the DAWA measurement", max_bound=stage2_max_bound(nn),
    )
    if staged and nn > 1:
        stage1_float_calibration(np.asarray([4.0 * sens / eps1]), 4 * nn * levels, eps1, records=int(np.ceil(sens)))


@dataclass(frozen=True, eq=False)
class DawaSynopsis2D:
    """A 2-D DAWA synopsis: the 1-D synopsis over the grid's cells in Hilbert order (:func:`grid_order`).

    ``side`` is the side d of the padded square that defines the curve (padding cells are skipped).
    """

    shape: tuple[int, int]
    side: int
    flat: DawaSynopsis

    def grid(self) -> np.ndarray:
        """Per-cell estimate, shape ``self.shape``."""
        cells, _ = grid_order(self.shape)
        g = np.zeros(self.shape)
        g[cells[:, 0], cells[:, 1]] = self.flat.histogram()
        return g

    def answer_rects(self, rects: object) -> np.ndarray:
        """Answers to rectangles ``(r0, r1, c0, c1)`` (inclusive) by 2-D prefix sums of the grid."""
        arr = _check_rects(rects, self.shape)
        n1, n2 = self.shape
        c = np.zeros((n1 + 1, n2 + 1))
        c[1:, 1:] = np.cumsum(np.cumsum(self.grid(), axis=0), axis=1)
        r0, r1, c0, c1 = arr.T
        return c[r1 + 1, c1 + 1] - c[r0, c1 + 1] - c[r1 + 1, c0] + c[r0, c0]

    def coarsen(self, bin_factor: int) -> np.ndarray:
        """Grid summed over ``bin_factor`` x ``bin_factor`` blocks (edge blocks may be smaller)."""
        g = np.apply_along_axis(_coarsen_1d, 0, self.grid(), bin_factor)
        return np.apply_along_axis(_coarsen_1d, 1, g, bin_factor)

    def rounded(self, granularity: float = 1.0) -> DawaSynopsis2D:
        return DawaSynopsis2D(self.shape, self.side, self.flat.rounded(granularity))

    def noise_bounds(self, rects: object) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`DawaSynopsis.noise_bounds` of rectangles, and :meth:`DawaSynopsis.rounding_bound`."""
        wl = rects_to_workload(rects, self.shape)
        out = self.flat.noise_bounds(wl)
        if out is None:
            return None
        return out[0], out[1], self.flat.rounding_bound(wl)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": _KIND_2D,
            "version": _VERSION,
            "shape": list(self.shape),
            "side": self.side,
            "flat": self.flat.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DawaSynopsis2D:
        if d.get("kind") != _KIND_2D or d.get("version") != _VERSION:
            raise ConfigError(f"not a version-{_VERSION} 2-D DAWA synopsis: kind={d.get('kind')!r}")
        shape = (int(d["shape"][0]), int(d["shape"][1]))
        side = int(d["side"])
        flat = DawaSynopsis.from_dict(d["flat"])
        if flat.n != shape[0] * shape[1] or side != side_for(shape):
            raise ConfigError("inconsistent 2-D DAWA synopsis (side / shape / length)")
        return cls(shape, side, flat)

    @classmethod
    def from_json(cls, text: str) -> DawaSynopsis2D:
        return cls.from_dict(json.loads(text))


def _check_rects(rects: object, shape: tuple[int, int]) -> np.ndarray:
    return check_rects(rects, shape)


def dawa_2d(
    grid: object,
    rects: object,
    epsilon: float,
    rng: NoiseSource,
    *,
    ratio: float = 0.25,
    sensitivity: float = 1.0,
    branch: int = 2,
    granularity: int = 100,
    dyadic: bool = True,
    alignment: str = DEFAULT_ALIGNMENT,
    bucket_penalty: float = DEFAULT_BUCKET_PENALTY,
) -> DawaSynopsis2D:
    """epsilon-DP DAWA over a 2-D grid of counts for a workload of rectangles (§2.6).

    ``rects``: an (m, 4) array of inclusive ``(r0, r1, c0, c1)``. Same privacy claim as
    :func:`dawa` (one record changes one cell by 1).
    """
    g = np.asarray(grid)
    if g.ndim != 2 or g.size == 0:
        raise ConfigError("dawa_2d needs a non-empty 2-D grid of counts")
    shape = (int(g.shape[0]), int(g.shape[1]))
    cells, _ = grid_order(shape)
    flat = g[cells[:, 0], cells[:, 1]]
    wl = rects_to_workload(rects, shape)
    syn = dawa(
        flat,
        wl,
        epsilon,
        rng,
        ratio=ratio,
        sensitivity=sensitivity,
        branch=branch,
        granularity=granularity,
        dyadic=dyadic,
        alignment=alignment,
        bucket_penalty=bucket_penalty,
    )
    return DawaSynopsis2D(shape, side_for(shape), syn)
