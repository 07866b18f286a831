"""DAWA stage 2: workloads of 0/1 interval queries, GreedyH, measurement and least squares.

Public names are re-exported by :mod:`dpsql.mechanisms.dawa`.

Notation (docs/mechanisms.md section 2.3): k buckets with true totals y; the bucket-level workload is
W̄[q, i] = |q ∩ b_i| / |b_i|. Adjacent buckets whose columns of W̄ are identical cannot be told
apart by any query; they are merged into one *group* (the workload only ever needs their sum), and
the strategy is a weighted hierarchy over the K groups:

* tree: the group range is split into ``branch`` nearly equal children recursively down to single
  groups; each level of the tree is stored as a full partition of [0, K) into segments (a leaf
  reached early is carried down unchanged, and only measured once, at the deepest level);
* weights: bottom-up, each internal node picks p ∈ {1, 1 - 1/g, ..., 1/g} minimising the exact
  least-squares error trace(M_v(p)⁻¹ G_v), where M_v(p) = p² blockdiag(M_children) + (1-p)² 𝟙𝟙ᵀ
  is updated by Sherman–Morrison with u = M⁻¹𝟙, κ = 𝟙ᵀu (docs/mechanisms.md section 2.3), and G_v = Σ_q w_q w_qᵀ runs
  over the queries *relevant* to v: those meeting v but not covering v's parent entirely (a query
  covering the parent is served by the ancestors' measurements; counting it at v over-weights v's
  own total and starves the leaves — on all 4096 prefixes the plain local error gave 4x the error
  of equal level weights, this choice about half of it). Since G_v = Σ_children G_c + (queries
  covering v but not its parent) ⊗ 𝟙𝟙ᵀ, trace(M⁻¹ G_v) = Σ_c T_c + n_v κ and uᵀ G_v u =
  Σ_partial (w_q·u)² + n_v κ², so the recursion stays exact and the root's value is the exact
  workload error of the final strategy. The node's own query gets weight 1 - p, its children's
  sub-strategies are multiplied by p; so the weights on every root-to-leaf path sum to 1 and
  ‖A‖₁ = 1. (The reference code instead damps the cross-child term by branch^(-depth/2).) The
  choice only affects which weights are used, never the privacy.

Complexity (n bins, I workload intervals, K groups, b branch, g granularity, h = ⌈log_b K⌉ + 1
levels): grouping O(I log I + k); GreedyH O(h (I log K + n + K g)); measurement and least
squares (two passes over the levels) O(h K); answering m ranges from a synopsis O(n + m).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.budget import binary_at_least
from dpsql.errors import ConfigError
from dpsql.noise import INT_BOUND, NoiseSource, snapping_calibration

#: the work (element operations) up to which :meth:`HierarchicalStrategy.answer_noise` is computed
#: exactly (about 2 seconds of numpy); beyond it the caller gets None
ANSWER_NOISE_MAX_WORK = 5e8
#: the largest strategy (groups x levels) a synopsis stores for its answers' noise (a few MB of JSON)
STORED_STRATEGY_MAX = 2e6


def measured_l1_bound(sensitivity: float, column_norm: float, levels: int) -> float:
    """The L1 sensitivity the measurement is calibrated for: ``sensitivity`` (k records) times an upper bound on the
    exact ‖A‖₁ of the float weights, rounded up. ``column_norm`` is the largest column norm as
    :meth:`HierarchicalStrategy.column_norms` adds it in floats (``levels`` nonnegative weights added in order, each
    addition rounded to nearest), so every exact column norm is at most ``column_norm``·(1 − 2⁻⁵³)^-(levels − 1)
    <= ``column_norm``·(1 + levels·2⁻⁵²). The weights of a path sum to 1 only in exact arithmetic: their floats
    (e.g. p = 0.89, 0.94, 0.2) add up to 1.0 in floats and to 1 + 1.6·10⁻¹⁶ exactly, and the snapped Laplace
    calibrated for a sensitivity of exactly k proved up to 1.3·10⁻¹⁵ more than epsilon2 where λ lay just above a
    power of two. The bound raises λ by at most levels·2⁻⁵² relative."""
    norm = Fraction(max(1.0, float(column_norm))) * (1 + Fraction(max(1, int(levels)), 2**52))
    return binary_at_least(Fraction(float(sensitivity)) * norm)


def stage2_max_bound(n: int) -> float:
    """2^62 / (n + 1): the cap on the measurement's clamp bound B, and the clip applied to rounded
    bucket totals (:meth:`DawaSynopsis.rounded`), so any answer (a sum of <= n totals) is an int64."""
    return INT_BOUND / (int(n) + 1)


# ---------------------------------------------------------------------------------------------
# workloads


@dataclass(frozen=True, eq=False)
class IntervalWorkload:
    """``n_queries`` linear 0/1 queries over ``n`` bins; query q is the indicator of the union of
    the closed bin intervals ``[lo[t], hi[t]]`` with ``qid[t] == q``.

    1-D range queries have one interval each; 2-D rectangles mapped through the Hilbert order have
    a few per rectangle. Intervals are stored sorted by (qid, lo), disjoint and non-adjacent within
    a query (the constructors merge overlapping or touching intervals: a query is a set of bins).
    """

    n: int
    n_queries: int
    qid: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def from_ranges(cls, ranges: object, n: int) -> IntervalWorkload:
        """Range queries given as an (m, 2) array of inclusive ``(lo, hi)`` bin indices."""
        arr = np.asarray(ranges)
        if arr.size == 0:
            arr = arr.reshape(0, 2)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ConfigError("ranges must be an (m, 2) array of inclusive (lo, hi) bin indices")
        if not np.issubdtype(arr.dtype, np.integer):
            if not np.all(arr == np.rint(arr)):
                raise ConfigError("range endpoints must be integer bin indices")
        arr = arr.astype(np.int64)
        lo, hi = arr[:, 0].copy(), arr[:, 1].copy()
        if np.any(lo > hi) or np.any(lo < 0) or np.any(hi >= n):
            raise ConfigError(f"every range needs 0 <= lo <= hi < n = {n}")
        return cls(int(n), int(arr.shape[0]), np.arange(arr.shape[0], dtype=np.int64), lo, hi)

    @classmethod
    def from_intervals(cls, qid: object, lo: object, hi: object, n: int, n_queries: int) -> IntervalWorkload:
        """General form: interval t belongs to query ``qid[t]``; overlapping/touching intervals merge."""
        q = np.asarray(qid, dtype=np.int64).ravel()
        a = np.asarray(lo, dtype=np.int64).ravel()
        b = np.asarray(hi, dtype=np.int64).ravel()
        if not (q.size == a.size == b.size):
            raise ConfigError("qid, lo and hi must have the same length")
        if np.any(a > b) or np.any(a < 0) or np.any(b >= n) or np.any(q < 0) or np.any(q >= n_queries):
            raise ConfigError(f"every interval needs 0 <= lo <= hi < n = {n} and 0 <= qid < n_queries")
        order = np.lexsort((a, q))
        q, a, b = q[order], a[order], b[order]
        if q.size:
            # merge within a query: a new run starts where the query changes or after a gap
            qstart = np.concatenate(([True], q[1:] != q[:-1]))
            run_hi = _segmented_cummax(b, np.cumsum(qstart) - 1)
            new_run = qstart.copy()
            new_run[1:] |= a[1:] > run_hi[:-1] + 1
            first = np.flatnonzero(new_run)
            b = np.maximum.reduceat(b, first)
            q = q[first]
            a = a[first]
        return cls(int(n), int(n_queries), q, a, b)

    @property
    def single_interval(self) -> bool:
        return self.qid.size == self.n_queries and bool(np.all(self.qid == np.arange(self.n_queries)))

    def answer(self, x: object) -> np.ndarray:
        """W x for a length-n vector (prefix sums: O(n + I))."""
        xv = np.asarray(x, dtype=np.float64)
        if xv.shape != (self.n,):
            raise ConfigError(f"expected a vector of length {self.n}")
        c = np.zeros(self.n + 1)
        np.cumsum(xv, out=c[1:])
        part = c[self.hi + 1] - c[self.lo]
        return np.bincount(self.qid, weights=part, minlength=self.n_queries)

    def to_dense(self) -> np.ndarray:
        """Dense (m, n) 0/1 matrix (tests and small problems only)."""
        w = np.zeros((self.n_queries, self.n + 1))
        np.add.at(w, (self.qid, self.lo), 1.0)
        np.add.at(w, (self.qid, self.hi + 1), -1.0)
        return np.cumsum(w, axis=1)[:, : self.n]

    def bucket_matrix(self, starts: object, ends: object) -> np.ndarray:
        """Dense W̄ (m, k): W̄[q, i] = |q ∩ b_i| / |b_i| (tests and small problems only)."""
        st = np.asarray(starts, dtype=np.int64)
        en = np.asarray(ends, dtype=np.int64)
        d = self.to_dense()
        c = np.zeros((self.n_queries, self.n + 1))
        np.cumsum(d, axis=1, out=c[:, 1:])
        return (c[:, en + 1] - c[:, st]) / (en - st + 1)


def _segmented_cummax(values: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` restarting at every change of the (sorted) segment id."""
    if values.size == 0:
        return values.copy()
    # shift each segment above all previous ones so one global cummax does all segments
    span = int(values.max() - values.min()) + 1
    shifted = (values - values.min()) + seg * span
    return np.maximum.accumulate(shifted) - seg * span + values.min()


def as_workload(workload: object, n: int) -> IntervalWorkload:
    if isinstance(workload, IntervalWorkload):
        if workload.n != n:
            raise ConfigError(f"workload is over {workload.n} bins, data has {n}")
        return workload
    return IntervalWorkload.from_ranges(workload, n)


# ---------------------------------------------------------------------------------------------
# grouping of indistinguishable adjacent buckets


def _group_buckets_intervals(
    wl: IntervalWorkload, starts: np.ndarray, ends: np.ndarray, _force_general: bool = False
) -> np.ndarray:
    """Boolean ``cut`` of length k-1: cut[i] iff some query covers buckets i and i+1 in different
    fractions (columns i, i+1 of W̄ differ). Only buckets holding an interval endpoint can differ
    from a neighbour, so only those pairs are examined (exact integer arithmetic)."""
    k = starts.size
    cut = np.zeros(max(k - 1, 0), dtype=bool)
    if k <= 1 or wl.qid.size == 0:
        return cut
    if wl.single_interval and not _force_general:
        return _cuts_single_ranges(wl, starts, ends)
    lens = ends - starts + 1
    # buckets holding an endpoint of interval t
    b_lo = np.searchsorted(ends, wl.lo, side="left")
    b_hi = np.searchsorted(ends, wl.hi, side="left")
    cand_q = np.concatenate([wl.qid] * 4)
    cand_i = np.concatenate([b_lo - 1, b_lo, b_hi - 1, b_hi])
    keep = (cand_i >= 0) & (cand_i < k - 1)
    cand_q, cand_i = cand_q[keep], cand_i[keep]
    pq, pi = cand_q, cand_i  # duplicates are harmless
    cov_i = _coverage(wl, pq, starts[pi], ends[pi])
    cov_j = _coverage(wl, pq, starts[pi + 1], ends[pi + 1])
    differ = cov_i * lens[pi + 1] != cov_j * lens[pi]
    cut[pi[differ]] = True
    return cut


def _cuts_single_ranges(wl: IntervalWorkload, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """:func:`_group_buckets_intervals` for one range per query: a range [lo, hi] covers the buckets
    strictly between its end buckets fully and the end buckets B_lo, B_hi in part, so its column
    values change only at B_lo - 1 | B_lo, B_lo | B_lo + 1, B_hi - 1 | B_hi and B_hi | B_hi + 1."""
    k = starts.size
    cut = np.zeros(k, dtype=bool)  # one spare slot for index k - 1
    lens = ends - starts + 1
    lo, hi = wl.lo, wl.hi
    b_lo = np.searchsorted(ends, lo, side="left")
    b_hi = np.searchsorted(ends, hi, side="left")
    cut[b_lo[b_lo > 0] - 1] = True  # 0 | positive share
    cut[b_hi] = True  # positive share | 0 (slot k - 1 is dropped below)
    two = b_lo < b_hi
    bl, bh, lo2, hi2 = b_lo[two], b_hi[two], lo[two], hi[two]
    cov_lo = ends[bl] - lo2 + 1
    cov_hi = hi2 - starts[bh] + 1
    adjacent = bl + 1 == bh
    # B_lo | B_lo + 1: shares cov_lo/len(B_lo) vs (1 or cov_hi/len(B_hi))
    nxt_cov = np.where(adjacent, cov_hi, lens[np.minimum(bl + 1, k - 1)])
    nxt_len = np.where(adjacent, lens[bh], lens[np.minimum(bl + 1, k - 1)])
    cut[bl[cov_lo * nxt_len != nxt_cov * lens[bl]]] = True
    # B_hi - 1 | B_hi: shares (1 or cov_lo/len(B_lo)) vs cov_hi/len(B_hi)
    prv_cov = np.where(adjacent, cov_lo, lens[bh - 1])
    prv_len = np.where(adjacent, lens[bl], lens[bh - 1])
    cut[(bh - 1)[prv_cov * lens[bh] != cov_hi * prv_len]] = True
    return cut[: k - 1]


def _coverage(wl: IntervalWorkload, q: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """|query q ∩ [s, e]| for many (q, s, e): number of bins of the query inside the bucket."""
    key_iv = wl.qid * (wl.n + 1) + wl.lo
    # bins of q in [0, p) for p = s and p = e + 1, via the query's intervals before p
    return _bins_before(wl, key_iv, q, e + 1) - _bins_before(wl, key_iv, q, s)


def _bins_before(wl: IntervalWorkload, key_iv: np.ndarray, q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Number of bins j < p that belong to query q (intervals of q sorted by lo)."""
    ln = wl.hi - wl.lo + 1
    # per-query cumulative interval lengths
    cum = np.cumsum(ln)
    first = np.searchsorted(wl.qid, q, side="left")
    # last interval of q with lo < p
    t = np.searchsorted(key_iv, q * (wl.n + 1) + p, side="left") - 1
    has = (t >= first) & (t >= 0)
    t_safe = np.where(has, t, 0)
    before_first = np.where(first > 0, cum[np.maximum(first - 1, 0)], 0)
    full_prev = np.where(has, cum[t_safe] - ln[t_safe] - before_first, 0)
    partial = np.where(has, np.minimum(wl.hi[t_safe], p - 1) - wl.lo[t_safe] + 1, 0)
    return full_prev + partial


def _group_buckets_dense(wbar: np.ndarray) -> np.ndarray:
    if wbar.shape[1] <= 1:
        return np.zeros(max(wbar.shape[1] - 1, 0), dtype=bool)
    return np.any(wbar[:, 1:] != wbar[:, :-1], axis=0)


# ---------------------------------------------------------------------------------------------
# the tree


def _tree_levels(n_groups: int, branch: int) -> list[np.ndarray]:
    """Segment starts of every level (level 0 = root); each level partitions [0, K)."""
    levels = [np.zeros(1, dtype=np.int64)]
    while True:
        starts = levels[-1]
        sizes = np.diff(starts, append=n_groups)
        if np.all(sizes == 1):
            return levels
        nc = np.where(sizes > 1, np.minimum(branch, sizes), 1)
        parent = np.repeat(np.arange(starts.size), nc)
        pos = np.arange(parent.size) - np.repeat(np.cumsum(nc) - nc, nc)
        q, r = np.divmod(sizes[parent], nc[parent])
        levels.append(starts[parent] + pos * q + np.minimum(pos, r))


def _child_first(levels: list[np.ndarray]) -> list[np.ndarray]:
    """For level d < last: index (in level d+1) of the first child of each segment."""
    return [np.searchsorted(levels[d + 1], levels[d], side="left") for d in range(len(levels) - 1)]


# ---------------------------------------------------------------------------------------------
# node error terms Q_v = ‖W̄_v u‖² and κ_v = 𝟙ᵀu_v


class _IntervalQ:
    """Q and κ of every segment of a level, for a workload of bin intervals (no dense matrices).

    With ũ_j = u_g / |g| on the bins of group g, Σ_i W̄[q, i] u_i over a node = Σ_{j ∈ q ∩ node} ũ_j,
    so both are prefix-sum differences. A node lying inside one interval of q is counted in
    ``n_full`` (a difference array; its contribution is κ_v²); a node holding an endpoint of q gets
    the partial sum per (q, node). The u-independent geometry of each level is cached.
    """

    def __init__(self, wl: IntervalWorkload, g_lo: np.ndarray, g_hi: np.ndarray) -> None:
        self.wl = wl
        self.g_lo = g_lo
        self.g_hi = g_hi
        self.g_bins = g_hi - g_lo + 1
        self.g_len = self.g_bins.astype(np.float64)
        self.single = wl.single_interval
        self._geom: dict[int, tuple[np.ndarray, ...]] = {}

    def _geometry(self, level: int, seg_starts: np.ndarray) -> tuple[np.ndarray, ...]:
        if level in self._geom:
            return self._geom[level]
        wl = self.wl
        nseg = seg_starts.size
        seg_end = np.append(seg_starts[1:], self.g_lo.size) - 1
        s_lo = self.g_lo[seg_starts]
        s_hi = self.g_hi[seg_end]
        lo, hi = wl.lo, wl.hi
        a = np.searchsorted(s_hi, lo, side="left")
        b = np.searchsorted(s_hi, hi, side="left")
        first_full = a + (s_lo[a] < lo)
        last_full = b - (s_hi[b] > hi)
        has_full = first_full <= last_full
        diff = np.bincount(first_full[has_full], minlength=nseg + 1) - np.bincount(
            last_full[has_full] + 1, minlength=nseg + 1
        )
        n_full = np.cumsum(diff)[:nseg].astype(np.float64)
        # partial segments: a (if not fully covered), b (if b != a and not fully covered)
        pa = (s_lo[a] < lo) | (s_hi[a] > hi)
        pb = (b != a) & (s_hi[b] > hi)
        i1 = np.concatenate([np.minimum(hi, s_hi[a])[pa] + 1, hi[pb] + 1])
        i0 = np.concatenate([lo[pa], s_lo[b][pb]])
        segs = np.concatenate([a[pa], b[pb]])
        inv = np.zeros(0, dtype=np.int64)
        if not self.single:
            key = np.concatenate([wl.qid[pa], wl.qid[pb]]) * nseg + segs
            order = np.argsort(key, kind="stable")
            ks = key[order]
            new = np.ones(ks.size, dtype=bool)
            new[1:] = ks[1:] != ks[:-1]
            inv = np.empty(ks.size, dtype=np.int64)
            inv[order] = np.cumsum(new) - 1
            segs = ks[new] % nseg
        geom = (s_lo, s_hi, n_full, i1, i0, segs, inv)
        self._geom[level] = geom
        return geom

    def __call__(
        self, level: int, seg_starts: np.ndarray, u: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s_lo, s_hi, n_full, i1, i0, segs, inv = self._geometry(level, seg_starts)
        cum = np.zeros(self.wl.n + 1)
        np.cumsum(np.repeat(u / self.g_len, self.g_bins), out=cum[1:])
        kappa = cum[s_hi + 1] - cum[s_lo]
        vals = cum[i1] - cum[i0]
        if not self.single:
            vals = np.bincount(inv, weights=vals, minlength=segs.size)
        q_part = np.bincount(segs, weights=vals * vals, minlength=seg_starts.size)
        return q_part, n_full, kappa


class _DenseQ:
    """Q and κ from a dense group-level workload matrix (m, K)."""

    def __init__(self, wg: np.ndarray) -> None:
        self.wg = wg

    def __call__(
        self, level: int, seg_starts: np.ndarray, u: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = np.add.reduceat(self.wg * u[None, :], seg_starts, axis=1)
        full = np.minimum.reduceat(self.wg, seg_starts, axis=1) == 1.0
        q_part = np.sum(np.where(full, 0.0, s * s), axis=0)
        return q_part, np.sum(full, axis=0).astype(np.float64), np.add.reduceat(u, seg_starts)


# ---------------------------------------------------------------------------------------------
# the strategy


@dataclass(frozen=True, eq=False)
class HierarchicalStrategy:
    """A weighted hierarchical strategy over k buckets (grouped into K groups).

    ``levels[d]`` are the segment starts (group indices) of level d, ``weights[d]`` the weight of
    each segment's own query at that level (0 = not measured; segments of one group are measured
    only at the deepest level). ``p[d]`` are the chosen splits (1 for pass-through segments).
    ``workload_error`` is trace((AᵀA)⁻¹ W̄ᵀW̄) for the workload it was built for (the expected
    total squared error is ``2 (sensitivity / epsilon2)² · workload_error``).
    """

    bucket_lengths: np.ndarray
    group_first_bucket: np.ndarray
    levels: list[np.ndarray]
    p: list[np.ndarray]
    weights: list[np.ndarray]
    workload_error: float

    @property
    def n_buckets(self) -> int:
        return int(self.bucket_lengths.size)

    @property
    def n_groups(self) -> int:
        return int(self.group_first_bucket.size)

    def _group_totals(self, y: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.asarray(y, dtype=np.float64), self.group_first_bucket)

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Measured queries ``(first_bucket, last_bucket_exclusive, weight)``, level by level."""
        gb = np.append(self.group_first_bucket, self.n_buckets)
        lo_l, hi_l, w_l = [], [], []
        for starts, w in zip(self.levels, self.weights, strict=True):
            ends = np.append(starts[1:], self.n_groups)
            m = w > 0
            lo_l.append(gb[starts[m]])
            hi_l.append(gb[ends[m]])
            w_l.append(w[m])
        return np.concatenate(lo_l), np.concatenate(hi_l), np.concatenate(w_l)

    def dense_matrix(self) -> np.ndarray:
        """A as a dense (rows, k) matrix over buckets (tests and small problems only)."""
        lo, hi, w = self.rows()
        a = np.zeros((w.size, self.n_buckets))
        for r in range(w.size):
            a[r, lo[r] : hi[r]] = w[r]
        return a

    def column_norms(self) -> np.ndarray:
        """Σ_v c_v over the nodes containing each bucket (the L1 norm of each column of A)."""
        col = np.zeros(self.n_groups)
        for starts, w in zip(self.levels, self.weights, strict=True):
            col += np.repeat(w, np.diff(starts, append=self.n_groups))
        return np.repeat(col, np.diff(self.group_first_bucket, append=self.n_buckets))

    def l1_sensitivity(self) -> float:
        """‖A‖₁ (max column L1 norm): the stage-2 sensitivity when one y_i changes by 1."""
        return float(np.max(self.column_norms()))

    @property
    def n_measurements(self) -> int:
        return int(sum(int(np.count_nonzero(w)) for w in self.weights))

    def snapping(self, epsilon2: float, *, sensitivity: float = 1.0) -> tuple[float, float, float, int]:
        """(lambda, Lambda, B, N): the snapped Laplace of the measurement (``dpsql.noise`` section 2).

        One record moves one bucket total by 1, hence at most one measured row per level: one
        unit (k records) changes at most N = min(rows, ceil(k) * levels) rows, by
        k * ||A||_1 in L1 norm (the exact norm of the float weights, bounded above by
        :func:`measured_l1_bound`). lambda is calibrated so that k ||A||_1 / lambda +
        N 2^-45 (B/lambda + 2) <= epsilon2; B keeps every answer in int64 (:func:`stage2_max_bound`).
        """
        eps2 = float(epsilon2)
        if not np.isfinite(eps2) or eps2 <= 0:
            raise ConfigError("epsilon2 must be > 0")
        l1 = measured_l1_bound(sensitivity, self.l1_sensitivity(), len(self.levels))
        n_rows = max(1, min(self.n_measurements, int(np.ceil(float(sensitivity))) * len(self.levels)))
        lam, grid, bound = snapping_calibration(
            l1, eps2, coordinates=n_rows, integer=True, what="the DAWA measurement",
            max_bound=stage2_max_bound(self.n_buckets),
        )
        return lam, grid, bound, n_rows

    def measure(
        self, y: object, epsilon2: float, rng: NoiseSource, *, sensitivity: float = 1.0
    ) -> list[np.ndarray]:
        """z = snap(A y) on every measured row: epsilon2-DP (see :meth:`snapping`).

        Returns one array per level (NaN where a segment is not measured).
        """
        lam, grid, bound, _ = self.snapping(epsilon2, sensitivity=sensitivity)
        yv = np.asarray(y, dtype=np.float64)
        if yv.shape != (self.n_buckets,):
            raise ConfigError(f"expected {self.n_buckets} bucket totals")
        cg = np.zeros(self.n_groups + 1)
        np.cumsum(self._group_totals(yv), out=cg[1:])
        out = []
        true_rows = []
        for starts, w in zip(self.levels, self.weights, strict=True):
            ends = np.append(starts[1:], self.n_groups)
            m = w > 0
            true_rows.append(w[m] * (cg[ends[m]] - cg[starts[m]]))
        flat = np.concatenate(true_rows) if true_rows else np.zeros(0)
        noisy = rng.snap_laplace(flat, lam, grid, bound) if flat.size else flat
        used = 0
        for starts, w in zip(self.levels, self.weights, strict=True):
            z = np.full(starts.size, np.nan)
            m = w > 0
            cnt = int(np.count_nonzero(m))
            z[m] = noisy[used : used + cnt]
            used += cnt
            out.append(z)
        return out

    def infer(self, z: Sequence[np.ndarray]) -> np.ndarray:
        """Least squares ŷ = (AᵀA)⁻¹Aᵀz in O(K · levels), returned per bucket.

        Two passes: bottom-up, each node's best estimate from its subtree (inverse-variance
        combination of its own measurement z_v / c_v, variance 1/c_v², with the sum of its
        children's estimates); top-down, the parent's final estimate minus the children's sum is
        distributed to the children in proportion to their variances. Group totals are then split
        over the group's buckets in proportion to bucket length (uniform expansion).

        Each level may also be a (segments, B) array of B independent measurement sets: the result is
        then (buckets, B), column j the estimate from column j (the map is linear and column-wise).
        """
        zs = [np.asarray(zd, dtype=np.float64) for zd in z]
        batched = bool(zs) and zs[0].ndim == 2
        final = self._group_estimates(zs if batched else [zd[:, None] for zd in zs])
        lens = self.bucket_lengths.astype(np.float64)
        counts = np.diff(self.group_first_bucket, append=self.n_buckets)
        glen = np.add.reduceat(lens, self.group_first_bucket)
        out = np.repeat(final / glen[:, None], counts, axis=0) * lens[:, None]
        return out if batched else out[:, 0]

    def _group_estimates(self, z: Sequence[np.ndarray]) -> np.ndarray:
        """Least-squares group totals (K, B) from measurements given per level as (segments, B) arrays
        (B independent columns; linear in z, which :meth:`answer_noise` relies on)."""
        n_lv = len(self.levels)
        est: list[np.ndarray] = [np.empty(0)] * n_lv
        var: list[np.ndarray] = [np.empty(0)] * n_lv
        first = _child_first(self.levels)
        for d in range(n_lv - 1, -1, -1):
            w = self.weights[d]
            zd = z[d]
            if d == n_lv - 1:
                if np.any(w <= 0):
                    raise ValueError("every group must be measured at the deepest level")
                est[d] = zd / w[:, None]
                var[d] = 1.0 / (w * w)
                continue
            s = np.add.reduceat(est[d + 1], first[d], axis=0)
            vs = np.add.reduceat(var[d + 1], first[d])
            e = s.copy()
            v = vs.copy()
            m = w > 0
            if np.any(m):
                own_prec = w[m] ** 2
                prec = 1.0 / vs[m] + own_prec
                e[m] = (s[m] / vs[m][:, None] + zd[m] / w[m][:, None] * own_prec[:, None]) / prec[:, None]
                v[m] = 1.0 / prec
            est[d] = e
            var[d] = v
        final = est[0]
        for d in range(n_lv - 1):
            s = np.add.reduceat(est[d + 1], first[d], axis=0)
            vs = np.add.reduceat(var[d + 1], first[d])
            sizes = np.diff(first[d], append=est[d + 1].shape[0])
            resid = np.repeat((final - s) / vs[:, None], sizes, axis=0)
            final = est[d + 1] + var[d + 1][:, None] * resid
        return final

    def to_dict(self, branch: int) -> dict[str, Any] | None:
        """The public strategy (groups and weights; the tree follows from the group count and
        ``branch``) for a stored synopsis, so answers from it get their noise too: about 2-3 numbers
        per group, fewer than the synopsis's bucket totals. None above :data:`STORED_STRATEGY_MAX`."""
        if float(self.n_groups) * len(self.levels) > STORED_STRATEGY_MAX:
            return None
        return {"branch": int(branch), "group_first_bucket": self.group_first_bucket.tolist(),
                "weights": [[float(v) for v in w] for w in self.weights]}

    @classmethod
    def from_dict(cls, d: dict[str, Any], bucket_lengths: np.ndarray) -> HierarchicalStrategy | None:
        """Inverse of :meth:`to_dict` (None if the stored strategy does not fit the buckets)."""
        try:
            gfirst = np.asarray(d["group_first_bucket"], dtype=np.int64)
            k = int(np.asarray(bucket_lengths).size)
            if gfirst.ndim != 1 or gfirst.size == 0 or gfirst[0] != 0 or np.any(np.diff(gfirst) <= 0) or gfirst[-1] >= k:
                return None
            branch = d["branch"]
            if type(branch) is not int or branch < 2:  # 1 would build levels forever
                return None
            levels = _tree_levels(int(gfirst.size), branch)
            weights = [np.asarray(w, dtype=np.float64) for w in d["weights"]]
            if len(weights) != len(levels) or any(w.shape != lv.shape for w, lv in zip(weights, levels, strict=True)):
                return None
            if not all(np.all(np.isfinite(w) & (w >= 0) & (w <= 1.0)) for w in weights) or np.any(weights[-1] <= 0):
                return None
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        return cls(np.asarray(bucket_lengths, dtype=np.int64), gfirst, levels, [np.ones(lv.size) for lv in levels],
                   weights, math.nan)

    def answer_noise(self, workload: IntervalWorkload, *, max_work: float = ANSWER_NOISE_MAX_WORK
                     ) -> tuple[np.ndarray, np.ndarray] | None:
        """(‖a_q‖₂, ‖a_q‖₁) per query q of ``workload`` (over the n bins of the buckets), where a_q is
        the row of the linear map from the measurement noise to the noise of q's answer: the answer
        is Σ_bins q_j x̂_j (uniform expansion of the least-squares group totals), so its noise is
        a_qᵀe for the measurement noise vector e. Exact: least squares is linear, and a_q[r] is q's
        answer when the measurements are the r-th unit vector, computed for blocks of unit vectors at
        once (O(rows · (K · levels + intervals)) work, no dense matrix larger than a block), or, with
        fewer queries than rows, by the transpose of the inference for blocks of queries
        (O(queries · K · levels)). A query
        of one interval inside one group (a histogram's bin) is that group's total times its share,
        so such queries cost one query per group whatever their number. None when the work exceeds
        ``max_work`` (the domain is too large for the exact computation).
        """
        wl = workload
        lens = self.bucket_lengths.astype(np.int64)
        if int(lens.sum()) != wl.n:
            raise ConfigError(f"workload is over {wl.n} bins, the buckets cover {int(lens.sum())}")
        g_lo = (np.cumsum(lens) - lens)[self.group_first_bucket]
        g_bins = np.add.reduceat(lens, self.group_first_bucket)
        one = np.bincount(wl.qid, minlength=wl.n_queries)[wl.qid] == 1
        g_of = np.searchsorted(g_lo, wl.lo, side="right") - 1
        inner_iv = one & (g_of == np.searchsorted(g_lo, wl.hi, side="right") - 1)
        if not np.any(inner_iv):
            return self._answer_noise(wl, max_work)
        groups, slot = np.unique(g_of[inner_iv], return_inverse=True)
        rest = ~inner_iv
        n_rest = int(np.unique(wl.qid[rest]).size)
        # the other queries, renumbered, then one whole-group query per group in use
        rest_q = np.unique(wl.qid[rest], return_inverse=True)[1]
        reduced = IntervalWorkload.from_intervals(
            np.r_[rest_q, n_rest + np.arange(groups.size)], np.r_[wl.lo[rest], g_lo[groups]],
            np.r_[wl.hi[rest], g_lo[groups] + g_bins[groups] - 1], wl.n, n_rest + groups.size)
        norms = self._answer_noise(reduced, max_work)
        if norms is None:
            return None
        l2, l1 = np.zeros(wl.n_queries), np.zeros(wl.n_queries)
        share = (wl.hi[inner_iv] - wl.lo[inner_iv] + 1) / g_bins[g_of[inner_iv]]
        q_in = wl.qid[inner_iv]
        l2[q_in] = share * norms[0][n_rest + slot]
        l1[q_in] = share * norms[1][n_rest + slot]
        q_rest = np.unique(wl.qid[rest])
        l2[q_rest] = norms[0][:n_rest]
        l1[q_rest] = norms[1][:n_rest]
        return l2, l1

    def _answer_noise(self, wl: IntervalWorkload, max_work: float) -> tuple[np.ndarray, np.ndarray] | None:
        """Forward (blocks of unit measurement vectors) or adjoint (blocks of queries), whichever is cheaper."""
        n_rows = self.n_measurements
        k = self.n_groups
        n_iv = wl.qid.size
        forward = float(n_rows) * (k * len(self.levels) + n_iv + wl.n_queries + k)
        adjoint = float(wl.n_queries) * (k * len(self.levels) + n_rows) + 4.0 * n_iv
        if min(forward, adjoint) > max_work:
            return None
        if adjoint < forward:
            return self._answer_noise_adjoint(wl)
        lens = self.bucket_lengths.astype(np.int64)
        g_lo = (np.cumsum(lens) - lens)[self.group_first_bucket]
        g_len = np.add.reduceat(lens, self.group_first_bucket).astype(np.float64)

        def prefix_at(cum: np.ndarray, est: np.ndarray, j: np.ndarray) -> np.ndarray:
            # Σ of the expanded estimate over bins [0, j): whole groups before j, plus a share of j's group
            g = np.clip(np.searchsorted(g_lo, j, side="right") - 1, 0, k - 1)
            inside = (j < wl.n)[:, None]
            share = ((j - g_lo[g]) / g_len[g])[:, None] * est[g]
            return np.where(inside, cum[g] + share, cum[k])

        # measured rows in measurement order: (level, segment)
        lv = np.concatenate([np.full(int(np.count_nonzero(w > 0)), d) for d, w in enumerate(self.weights)])
        seg = np.concatenate([np.flatnonzero(w > 0) for w in self.weights])
        block = max(1, min(n_rows, int(4_000_000 // (k + n_iv + wl.n_queries + 1))))
        sq = np.zeros(wl.n_queries)
        l1 = np.zeros(wl.n_queries)
        for r0 in range(0, n_rows, block):
            cols = np.arange(r0, min(r0 + block, n_rows))
            z = [np.zeros((lvl.size, cols.size)) for lvl in self.levels]
            for d in np.unique(lv[cols]):
                sel = lv[cols] == d
                z[d][seg[cols[sel]], np.flatnonzero(sel)] = 1.0
            est = self._group_estimates(z)
            cum = np.zeros((k + 1, cols.size))
            np.cumsum(est, axis=0, out=cum[1:])
            part = prefix_at(cum, est, wl.hi + 1) - prefix_at(cum, est, wl.lo)
            if wl.single_interval:
                a = part
            else:
                a = np.zeros((wl.n_queries, cols.size))
                np.add.at(a, wl.qid, part)
            sq += np.einsum("ij,ij->i", a, a)
            l1 += np.abs(a).sum(axis=1)
        return np.sqrt(sq), l1


    def _answer_noise_adjoint(self, wl: IntervalWorkload) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`answer_noise` by the transpose of :meth:`_group_estimates`: a_q = Gᵀ v_q for q's group
        shares v_q (v_q[g] = |q ∩ g| / |g|), run backwards through the two passes for blocks of queries."""
        lens = self.bucket_lengths.astype(np.int64)
        k = self.n_groups
        n_lv = len(self.levels)
        first = _child_first(self.levels)
        g_lo = (np.cumsum(lens) - lens)[self.group_first_bucket]
        g_len = np.add.reduceat(lens, self.group_first_bucket)
        g_hi = g_lo + g_len - 1
        # the constants of both passes: subtree variances, the children's sum's variance, the blends
        var: list[np.ndarray] = [np.empty(0)] * n_lv
        vsum: list[np.ndarray] = [np.empty(0)] * n_lv
        alpha: list[np.ndarray] = [np.empty(0)] * n_lv
        beta: list[np.ndarray] = [np.empty(0)] * n_lv
        for d in range(n_lv - 1, -1, -1):
            w = self.weights[d]
            if d == n_lv - 1:
                var[d] = 1.0 / (w * w)
                continue
            vs = np.add.reduceat(var[d + 1], first[d])
            m = w > 0
            prec = np.where(m, 1.0 / vs + w * w, 1.0)
            alpha[d] = np.where(m, (1.0 / vs) / prec, 1.0)
            beta[d] = np.where(m, w / prec, 0.0)
            var[d] = np.where(m, 1.0 / prec, vs)
            vsum[d] = vs
        sizes = [np.diff(first[d], append=self.levels[d + 1].size) for d in range(n_lv - 1)]
        gamma = [var[d + 1] / np.repeat(vsum[d], sizes[d]) for d in range(n_lv - 1)]
        ga_all = np.searchsorted(g_lo, wl.lo, side="right") - 1
        gb_all = np.searchsorted(g_lo, wl.hi, side="right") - 1
        sq = np.zeros(wl.n_queries)
        l1 = np.zeros(wl.n_queries)
        block = max(1, min(wl.n_queries, int(4_000_000 // (2 * k + self.n_measurements + 1))))
        for q0 in range(0, wl.n_queries, block):
            q1 = min(q0 + block, wl.n_queries)
            t0, t1 = np.searchsorted(wl.qid, [q0, q1], side="left")
            c = wl.qid[t0:t1] - q0
            lo, hi, ga, gb = wl.lo[t0:t1], wl.hi[t0:t1], ga_all[t0:t1], gb_all[t0:t1]
            diff = np.zeros((k + 1, q1 - q0))
            same = ga == gb
            pts = np.zeros((k, q1 - q0))
            np.add.at(pts, (ga[same], c[same]), (hi[same] - lo[same] + 1) / g_len[ga[same]])
            two = ~same
            np.add.at(pts, (ga[two], c[two]), (g_hi[ga[two]] - lo[two] + 1) / g_len[ga[two]])
            np.add.at(pts, (gb[two], c[two]), (hi[two] - g_lo[gb[two]] + 1) / g_len[gb[two]])
            np.add.at(diff, (ga[two] + 1, c[two]), 1.0)
            np.add.at(diff, (gb[two], c[two]), -1.0)
            fbar = np.cumsum(diff, axis=0)[:k] + pts
            # top-down pass backwards: final_{d+1} = est_{d+1} + γ ⊙ E(final_d − R est_{d+1})
            ebar: list[np.ndarray] = [np.zeros((lv.size, q1 - q0)) for lv in self.levels]
            for d in range(n_lv - 2, -1, -1):
                t = np.add.reduceat(gamma[d][:, None] * fbar, first[d], axis=0)
                ebar[d + 1] += fbar - np.repeat(t, sizes[d], axis=0)
                fbar = t
            ebar[0] += fbar
            # bottom-up pass backwards: est_d = α ⊙ R est_{d+1} + β ⊙ z_d (measured), R est_{d+1} (not)
            parts = []
            for d in range(n_lv):
                w = self.weights[d]
                m = w > 0
                if d == n_lv - 1:
                    parts.append(ebar[d][m] / w[m][:, None])
                    continue
                parts.append(beta[d][m][:, None] * ebar[d][m])
                ebar[d + 1] += np.repeat(alpha[d][:, None] * ebar[d], sizes[d], axis=0)
            a = np.concatenate(parts, axis=0)  # (measurements, queries), in measurement order
            sq[q0:q1] = np.einsum("ij,ij->j", a, a)
            l1[q0:q1] = np.abs(a).sum(axis=0)
        return np.sqrt(sq), l1

def _choose_splits(
    levels: list[np.ndarray],
    n_groups: int,
    qfun: _IntervalQ | _DenseQ,
    granularity: int,
    fixed_p: list[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], float]:
    """Bottom-up GreedyH; returns p per level and the root's trace((AᵀA)⁻¹ W̄ᵀW̄).

    With ``fixed_p`` the given splits are used instead of chosen (to evaluate a given strategy).
    """
    n_lv = len(levels)
    first = _child_first(levels)
    u = np.ones(n_groups)
    grid = 1.0 - np.arange(granularity, dtype=np.float64) / granularity  # 1, 1-1/g, ..., 1/g
    p_levels: list[np.ndarray] = [np.empty(0)] * n_lv
    # queries covering a node's (true) parent entirely
    parent_full: list[np.ndarray] = [np.zeros(1)]
    for d in range(n_lv - 1):
        sizes = np.diff(levels[d], append=n_groups)
        _, nf, _ = qfun(d, levels[d], u)
        nch = np.diff(first[d], append=levels[d + 1].size)
        par = np.repeat(np.arange(levels[d].size), nch)
        parent_full.append(np.where(sizes[par] > 1, nf[par], parent_full[d][par]))
    q_part, n_full, _ = qfun(n_lv - 1, levels[-1], u)
    rel = n_full - parent_full[-1]
    trace = q_part + rel  # leaves: M = [1], trace = G_gg
    p_levels[-1] = np.ones(levels[-1].size)
    for d in range(n_lv - 2, -1, -1):
        starts = levels[d]
        sizes = np.diff(starts, append=n_groups)
        t_children = np.add.reduceat(trace, first[d])
        internal = sizes > 1
        q_part, n_full, kappa = qfun(d, starts, u)
        # (a pass-through segment is a leaf already counted at the deepest level)
        rel = np.where(internal, n_full - parent_full[d], 0.0)
        # local Gram G_v: children's local Grams plus the queries that cover v but not its parent
        q_val = q_part + rel * kappa**2
        t_base = t_children + rel * kappa
        T, Q, K = t_base[internal], q_val[internal], kappa[internal]
        if fixed_p is not None:
            pv = fixed_p[d][internal][:, None]
        else:
            pv = grid[None, :]
        one_m = (1.0 - pv) ** 2
        t = one_m / (pv * pv + one_m * K[:, None])
        err = (T[:, None] - t * Q[:, None]) / (pv * pv)
        j = np.argmin(err, axis=1)  # first minimum: the largest p on ties
        rows = np.arange(err.shape[0])
        p_int = np.broadcast_to(pv, err.shape)[rows, j]
        t_int = t[rows, j]
        new_trace = t_base.copy()
        new_trace[internal] = err[rows, j]
        factor = np.ones(starts.size)
        factor[internal] = (1.0 - t_int * K) / (p_int * p_int)
        u = u * np.repeat(factor, sizes)
        p_d = np.ones(starts.size)
        p_d[internal] = p_int
        p_levels[d] = p_d
        trace = new_trace
    return p_levels, float(trace[0])


def _weights_from_p(levels: list[np.ndarray], p_levels: list[np.ndarray], n_groups: int) -> list[np.ndarray]:
    """Own-query weights: c_v = (1 - p_v) Π_{ancestors a} p_a; deepest level: Π_{ancestors} p_a."""
    first = _child_first(levels)
    mult = np.ones(1)
    weights = []
    for d in range(len(levels)):
        if d == len(levels) - 1:
            weights.append(mult.copy())
            break
        weights.append((1.0 - p_levels[d]) * mult)
        nch = np.diff(first[d], append=levels[d + 1].size)
        mult = np.repeat(mult * p_levels[d], nch)
    # guard against rounding: ‖A‖₁ must not exceed 1
    col = np.zeros(n_groups)
    for starts, w in zip(levels, weights, strict=True):
        col += np.repeat(w, np.diff(starts, append=n_groups))
    top = float(np.max(col))
    if top > 1.0:
        weights = [w / top for w in weights]
    return weights


def _normalise_buckets(buckets: object, n: int) -> tuple[np.ndarray, np.ndarray]:
    if buckets is None:
        return np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)
    arr = np.asarray(buckets, dtype=np.int64).reshape(-1, 2)
    st, en = arr[:, 0], arr[:, 1]
    if st.size == 0 or st[0] != 0 or en[-1] != n - 1 or np.any(en < st) or np.any(st[1:] != en[:-1] + 1):
        raise ConfigError("buckets must be consecutive closed intervals [start, end] covering 0..n-1")
    return st, en


def greedy_h(
    workload: object,
    buckets: object = None,
    *,
    branch: int = 2,
    granularity: int = 100,
) -> HierarchicalStrategy:
    """GreedyH (docs/mechanisms.md section 2.3): a weighted hierarchical strategy over the buckets, ‖A‖₁ <= 1.

    ``workload`` is either an :class:`IntervalWorkload` over n bins (then ``buckets`` is the
    partition as closed intervals ``(start, end)``; default: singleton buckets) or a dense
    bucket-level workload matrix W̄ of shape (m, k) (then ``buckets`` must be None; bucket lengths
    are taken as 1). The choice depends only on the workload and the partition, never on the data.
    """
    if isinstance(branch, bool) or int(branch) != branch or branch < 2:
        raise ConfigError("branch must be an integer >= 2")
    if isinstance(granularity, bool) or int(granularity) != granularity or granularity < 1:
        raise ConfigError("granularity must be an integer >= 1")
    branch = int(branch)
    granularity = int(granularity)
    qfun: _IntervalQ | _DenseQ
    if isinstance(workload, IntervalWorkload):
        st, en = _normalise_buckets(buckets, workload.n)
        cut = _group_buckets_intervals(workload, st, en)
        gfirst = np.flatnonzero(np.concatenate(([True], cut)))
        g_lo = st[gfirst]
        g_hi = np.append(st[gfirst[1:]] - 1, workload.n - 1)
        qfun = _IntervalQ(workload, g_lo, g_hi)
        lengths = en - st + 1
    else:
        wbar = np.asarray(workload, dtype=np.float64)
        if wbar.ndim != 2 or wbar.shape[1] < 1:
            raise ConfigError("a dense workload must be an (m, k) bucket-level matrix")
        if buckets is not None:
            raise ConfigError("with a dense W̄ the buckets are its columns; pass buckets=None")
        cut = _group_buckets_dense(wbar)
        gfirst = np.flatnonzero(np.concatenate(([True], cut)))
        qfun = _DenseQ(wbar[:, gfirst])
        lengths = np.ones(wbar.shape[1], dtype=np.int64)
    n_groups = gfirst.size
    levels = _tree_levels(n_groups, branch)
    p_levels, err = _choose_splits(levels, n_groups, qfun, granularity)
    weights = _weights_from_p(levels, p_levels, n_groups)
    return HierarchicalStrategy(lengths, gfirst, levels, p_levels, weights, err)


def strategy_from_splits(
    workload: object, p_levels: Sequence[np.ndarray], *, branch: int = 2, buckets: object = None
) -> HierarchicalStrategy:
    """The hierarchical strategy with given splits (no grouping; for baselines and tests).

    ``p_levels[d]`` gives p for every segment of level d of the tree over the k buckets.
    """
    if isinstance(workload, IntervalWorkload):
        st, en = _normalise_buckets(buckets, workload.n)
        k = st.size
        qfun: _IntervalQ | _DenseQ = _IntervalQ(workload, st, en)
        lengths = en - st + 1
    else:
        wbar = np.asarray(workload, dtype=np.float64)
        k = wbar.shape[1]
        qfun = _DenseQ(wbar)
        lengths = np.ones(k, dtype=np.int64)
    levels = _tree_levels(k, int(branch))
    if len(p_levels) != len(levels) or any(
        np.shape(p) != lv.shape for p, lv in zip(p_levels, levels, strict=False)
    ):
        raise ConfigError("p_levels must give one split per segment of every tree level")
    pl = [np.asarray(p, dtype=np.float64) for p in p_levels]
    _, err = _choose_splits(levels, k, qfun, 1, fixed_p=pl)
    weights = _weights_from_p(levels, pl, k)
    return HierarchicalStrategy(lengths, np.arange(k, dtype=np.int64), levels, pl, weights, err)
