"""DAWA stage 1: bucket deviations, bucket costs, the noise calibration and the least-cost partition.

Public names are re-exported by :mod:`dpsql.mechanisms.dawa`, whose docstring states the privacy
claim. Indices are 0-based; a bucket is a closed bin interval ``[start, end]``.

Complexity (n bins, c candidate buckets: dyadic lengths with any start c = O(n log n); with
half-aligned starts, the default of the private stage 1, c ≈ 4n; all intervals c = O(n²)):

* :class:`_WaveletMatrix` over the value ranks (U <= n distinct values, ``B = bit_length(n)``
  levels, a public depth: with ``bit_length(U)`` the running time would step up when one person's
  rows make U cross a power of two, about 0.15 s per level at n = 2^20): O(n B) build, O(B) per "count and sum of the values below a threshold inside a window"
  query, each step vectorised over all queries at once;
* deviations of all candidates: windows of length <= 32 directly (O(L) each), longer ones by one
  wavelet query each: O(c log n), i.e. O(n log² n) for any-start dyadic candidates (docs/mechanisms.md section 2.2's
  order-statistics sliding window, done offline) and O(n log n) for half-aligned ones;
* least-cost partition: dynamic programme over right endpoints, O(n log n) for dyadic lengths
  (lengths >= 128 relaxed per block of 128 right ends with numpy, shorter ones in an unrolled
  Python loop), O(n²) for all intervals (one numpy reduction per right end).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpsql.errors import ConfigError
from dpsql.noise import NoiseSource

#: Largest domain for which the all-intervals candidate set (O(n^2) buckets) is accepted.
MAX_N_ALL_INTERVALS = 2048

Partition = list[tuple[int, int]]

#: default per-bucket cost offset of the private stage 1, in units of the largest noise scale
DEFAULT_BUCKET_PENALTY = 1.75


# ---------------------------------------------------------------------------------------------
# input checks


def _as_data_vector(x: object) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1 or arr.size == 0:
        raise ConfigError(
            "DAWA needs a non-empty 1-D histogram",
            hint="pass the counts of an ordered domain as a 1-D array",
        )
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ConfigError("DAWA histogram must be numeric")
    arr = arr.astype(np.float64) if not np.issubdtype(arr.dtype, np.integer) else arr.astype(np.int64)
    if arr.dtype == np.float64 and not np.all(np.isfinite(arr)):
        raise ConfigError("DAWA histogram contains NaN or infinite counts")
    # integer-valued floats are summed exactly in int64
    if arr.dtype == np.float64 and np.all(arr == np.rint(arr)) and np.max(np.abs(arr)) < 2.0**52:
        arr = arr.astype(np.int64)
    return arr


def _check_positive(name: str, value: float) -> float:
    v = float(value)
    if not np.isfinite(v) or v <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return v


#: start rule of dyadic candidates: "none" = any start (docs/mechanisms.md section 2.2), "half" = multiples of L/2,
#: "full" = multiples of L (the dyadic intervals of a binary tree)
ALIGNMENTS = ("none", "half", "full")
#: default start rule of the private stage 1 (chosen by measurement, see the dawa module docstring)
DEFAULT_ALIGNMENT = "half"


def candidate_lengths(n: int, *, dyadic: bool = True) -> np.ndarray:
    """Candidate bucket lengths: 1, 2, 4, ... <= n (dyadic) or 1..n (all intervals)."""
    if n < 1:
        raise ConfigError("domain size must be >= 1")
    if dyadic:
        return 1 << np.arange(int(n).bit_length(), dtype=np.int64)
    if n > MAX_N_ALL_INTERVALS:
        raise ConfigError(
            f"the all-intervals candidate set is O(n^2); n = {n} exceeds {MAX_N_ALL_INTERVALS}",
            hint="use dyadic=True (the default) for large domains",
        )
    return np.arange(1, n + 1, dtype=np.int64)


def _check_alignment(alignment: str) -> str:
    if alignment not in ALIGNMENTS:
        raise ConfigError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")
    return alignment


def candidate_buckets(
    n: int, *, dyadic: bool = True, alignment: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    """Candidate buckets as ``(starts, lengths)``, ordered by length, then start.

    ``dyadic=False``: every interval (n <= 2048). ``dyadic=True``: lengths 1, 2, 4, ... <= n with
    starts restricted by ``alignment``: "none" every start 0..n-L (O(n log n) buckets), "half"
    multiples of max(1, L/2) (about 4n buckets), "full" multiples of L (about 2n buckets).
    Singletons are always candidates, so every n has a partition.
    """
    lens = candidate_lengths(n, dyadic=dyadic)
    step = np.ones_like(lens)
    if dyadic:
        _check_alignment(alignment)
        if alignment == "half":
            step = np.maximum(lens // 2, 1)
        elif alignment == "full":
            step = lens
    counts = (n - lens) // step + 1
    lengths = np.repeat(lens, counts)
    offsets = np.cumsum(counts) - counts
    starts = (np.arange(lengths.size, dtype=np.int64) - np.repeat(offsets, counts)) * np.repeat(step, counts)
    return starts, lengths


# ---------------------------------------------------------------------------------------------
# deviations


class _WaveletMatrix:
    """Static wavelet matrix over the value ranks of ``x``, with per-level prefix sums of the values.

    ``count_sum_below(lo, hi, thr)`` returns, for every query, the number and the sum of the
    ``x_j`` with ``lo <= j < hi`` whose rank is ``< thr`` (rank = index in the sorted distinct
    values), in O(bit_length(n)) vectorised steps: the depth is public (``bit_length(n)``, not
    of the number of distinct values, which one person can move across a power of two).
    """

    def __init__(self, x: np.ndarray) -> None:
        self.uniq, ranks = np.unique(x, return_inverse=True)
        n = x.size
        self.nbits = max(1, int(n).bit_length())
        idx_t = np.intp  # fancy indexing converts other index types on every gather
        sum_t = np.int64 if x.dtype == np.int64 else np.float64
        cur = ranks.astype(np.int64)
        vals = x.astype(sum_t)
        self.zeros_prefix: list[np.ndarray] = []
        self.sum0_prefix: list[np.ndarray] = []
        self.n_zeros: list[int] = []
        for level in range(self.nbits - 1, -1, -1):
            bit = (cur >> level) & 1
            zero = bit == 0
            zp = np.zeros(n + 1, dtype=idx_t)
            np.cumsum(zero, out=zp[1:])
            sp = np.zeros(n + 1, dtype=sum_t)
            np.cumsum(np.where(zero, vals, 0), out=sp[1:])
            self.zeros_prefix.append(zp)
            self.sum0_prefix.append(sp)
            self.n_zeros.append(int(zp[-1]))
            order = np.argsort(bit, kind="stable")
            cur = cur[order]
            vals = vals[order]

    def rank_threshold(self, values: np.ndarray) -> np.ndarray:
        """Rank threshold t(v) such that ``x_j < v  <=>  rank_j < t(v)``."""
        return np.searchsorted(self.uniq, values, side="left").astype(np.int64)

    def count_sum_below(
        self, lo: np.ndarray, hi: np.ndarray, thr: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        zp0 = self.zeros_prefix[0]
        lo = np.asarray(lo).astype(zp0.dtype)
        hi = np.asarray(hi).astype(zp0.dtype)
        thr = np.asarray(thr).astype(zp0.dtype)
        cnt = np.zeros(lo.shape, dtype=zp0.dtype)
        tot = np.zeros(lo.shape, dtype=self.sum0_prefix[0].dtype)
        for i, level in enumerate(range(self.nbits - 1, -1, -1)):
            zp = self.zeros_prefix[i]
            sp = self.sum0_prefix[i]
            one = (thr >> level) & 1
            is_one = one.astype(bool)
            zl = zp[lo]
            zh = zp[hi]
            # bit of the threshold is 1: every element of this window with bit 0 is below it
            cnt += (zh - zl) * one
            np.add(tot, sp[hi] - sp[lo], out=tot, where=is_one)
            z = zp.dtype.type(self.n_zeros[i])
            lo = np.where(is_one, z + (lo - zl), zl)
            hi = np.where(is_one, z + (hi - zh), zh)
        return cnt.astype(np.int64), tot


#: windows handled per vectorised block (keeps the working set in cache)
_CHUNK = 1 << 15


def _deviations(
    x: np.ndarray, starts: np.ndarray, lengths: np.ndarray, wm: _WaveletMatrix | None = None
) -> np.ndarray:
    """dev(x, [s, s+L-1]) = sum |x_j - mean| for many windows at once (x already validated)."""
    if wm is None:
        wm = _WaveletMatrix(x)
    csum = np.zeros(x.size + 1, dtype=x.dtype)
    np.cumsum(x, out=csum[1:])
    out = np.empty(starts.size, dtype=np.float64)
    if _exact_ok(x, int(lengths.max()) if lengths.size else 1):
        # integer histogram: L dev = sum |L x_j - T| = T (2 c_below - L) + L (T - 2 s_below) with
        # "below" = {L x_j < T} = {x_j < ceil(T / L)}, all in exact int64; one rounding at the end
        for k in range(0, starts.size, _CHUNK):
            st = starts[k : k + _CHUNK]
            ln = lengths[k : k + _CHUNK]
            en = st + ln
            total = csum[en] - csum[st]
            thr = -((-total) // ln)
            below_cnt, below_sum = wm.count_sum_below(st, en, wm.rank_threshold(thr))
            num = total * (2 * below_cnt - ln) + ln * (total - 2 * below_sum)
            out[k : k + _CHUNK] = num / ln
        return out
    for k in range(0, starts.size, _CHUNK):
        st = starts[k : k + _CHUNK]
        ln = lengths[k : k + _CHUNK]
        en = st + ln
        total = csum[en] - csum[st]
        mean = total / ln
        below_cnt, below_sum = wm.count_sum_below(st, en, wm.rank_threshold(mean))
        # sum_{above} (x - m) + sum_{below} (m - x) = (total - 2 sum_below) + m (2 cnt_below - L);
        # values equal to the mean contribute 0 on either side
        dev = (total - 2 * below_sum).astype(np.float64) + mean * (2 * below_cnt - ln)
        # cancellation can leave -1e-12 on perfectly uniform windows
        out[k : k + _CHUNK] = np.maximum(dev, 0.0)
    return out


def _exact_ok(x: np.ndarray, max_len: int) -> bool:
    """Integer histogram whose window sums times lengths fit in int64 (exact deviations)."""
    if x.dtype != np.int64 or x.size == 0:
        return False
    big = int(np.max(np.abs(x)))
    return big * x.size * max(1, max_len) * 4 < 2**62


def stage1_bin_cap(n: int) -> int:
    """Public per-bin cap of stage 1's cost computation: keeps every deviation exact (int64)."""
    return max(1, 2**59 // (max(1, n) ** 2))


def deviation(x: object, start: object, length: object) -> np.ndarray | float:
    """dev(x, b) = sum_{j in b} |x_j - b(x)/|b|| for the bucket ``b = [start, start+length-1]``.

    ``start`` and ``length`` may be arrays (broadcast together); a scalar call returns a float.
    """
    xv = _as_data_vector(x)
    s, ln = np.broadcast_arrays(np.asarray(start, dtype=np.int64), np.asarray(length, dtype=np.int64))
    scalar = s.ndim == 0
    s1 = np.atleast_1d(s).ravel()
    l1 = np.atleast_1d(ln).ravel()
    if np.any(l1 < 1) or np.any(s1 < 0) or np.any(s1 + l1 > xv.size):
        raise ConfigError("bucket out of range: need length >= 1 and 0 <= start, start+length <= n")
    out = _deviations(xv, s1, l1).reshape(np.shape(s))
    return float(out) if scalar else out


def window_deviations(
    x: object, *, dyadic: bool = True, alignment: str = "none"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deviation of every candidate bucket (:func:`candidate_buckets`): ``(starts, lengths, devs)``."""
    xv = _as_data_vector(x)
    starts, lengths = candidate_buckets(xv.size, dyadic=dyadic, alignment=alignment)
    return starts, lengths, _window_devs(xv, starts, lengths)


#: windows up to this length are evaluated directly (O(L) each, cheaper than the tree for small L)
_DIRECT_MAX_LEN = 32


def _window_devs(x: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Deviations of candidates grouped by length (as made by :func:`candidate_buckets`)."""
    out = np.empty(starts.size, dtype=np.float64)
    small = lengths <= _DIRECT_MAX_LEN
    xf = x.astype(np.float64)
    for L in np.unique(lengths[small]).tolist():
        sel = np.flatnonzero(lengths == L)
        if L == 1:
            out[sel] = 0.0
            continue
        if _exact_ok(x, L):
            wi = np.lib.stride_tricks.sliding_window_view(x, L)[starts[sel]]
            tot = wi.sum(axis=1, keepdims=True)
            out[sel] = np.abs(L * wi - tot).sum(axis=1) / L  # exact int64 numerator, one rounding
            continue
        win = np.lib.stride_tricks.sliding_window_view(xf, L)[starts[sel]]
        mean = win.mean(axis=1, keepdims=True)
        out[sel] = np.abs(win - mean).sum(axis=1)
    big = ~small
    if np.any(big):
        out[big] = _deviations(x, starts[big], lengths[big])
    return out


# ---------------------------------------------------------------------------------------------
# costs, noise scales


def deviation_sensitivity(length: object) -> np.ndarray | float:
    """Delta_b = 2 (1 - 1/|b|): the most dev(x, b) moves when one bin of b changes by 1."""
    ln = np.asarray(length, dtype=np.float64)
    out = 2.0 * (1.0 - 1.0 / ln)
    return float(out) if out.ndim == 0 else out


def stage1_noise_scales(
    lengths: object, epsilon1: float, max_length: int, *, sensitivity: float = 1.0
) -> np.ndarray | float:
    """Safe Laplace scale of a candidate bucket's noisy cost (docs/mechanisms.md section 2.4).

    ``sensitivity * (Delta_b + Delta_max) / epsilon1`` with Delta_b = 2(1 - 1/|b|) and
    Delta_max = 2(1 - 1/L_max), L_max = ``max_length`` the longest candidate length. Singletons get
    Delta_max / epsilon1: they are NOT noiseless. This is twice the scale of the published
    reference code for |b| >= 2 (see the module docstring of :mod:`dpsql.mechanisms.dawa`).
    """
    eps1 = _check_positive("epsilon1", epsilon1)
    sens = _check_positive("sensitivity", sensitivity)
    if max_length < 1:
        raise ConfigError("max_length must be >= 1")
    ln = np.asarray(lengths, dtype=np.float64)
    if np.any(ln < 1) or np.any(ln > max_length):
        raise ConfigError("bucket lengths must lie in [1, max_length]")
    delta_max = 2.0 * (1.0 - 1.0 / float(max_length))
    out = sens * (2.0 * (1.0 - 1.0 / ln) + delta_max) / eps1
    return float(out) if out.ndim == 0 else out


def stage1_float_calibration(
    base_scales: np.ndarray, n_candidates: int, epsilon1: float, *, records: int = 1
) -> tuple[np.ndarray, float, float]:
    """(scales, B1, g): the stage-1 noise scales made safe for floating point (dawa docstring).

    Costs are clamped to [0, B1] with the public bound B1 = 2^20 * max(base scale), noised, rounded
    to the power-of-two grid g >= n_candidates * B1 * 2^-50 (so every partition cost the DP sums is
    exact) and clamped to [-B1, B1]. The report-noisy-min argument covers a neighbour that changes
    one bin by one record; a unit with ``records`` = k rows is k such steps (group privacy), each of
    which must be epsilon1/k-DP. Per step the threshold moves by at most (Delta_e + Delta_max) + 4g,
    and the float noise's half-line probabilities are within exp(2^-47 (B1 + g)/b + 2^-47) of the
    exact Laplace ones (``dpsql.noise`` section 2, step (i)), so with base_e = k (Delta_e +
    Delta_max)/eps1 the scales b_e = (base_e * eps1 + k (4g + 2^-47 (B1 + g))) / (eps1 - k 2^-47)
    keep every step eps1/k-DP and the unit eps1-DP: the floating-point slack is paid k times.
    """
    base = np.asarray(base_scales, dtype=np.float64)
    s0 = float(np.max(base)) if base.size else 0.0
    if s0 == 0.0:
        return base, 0.0, 0.0  # one candidate partition only (all singletons): nothing to hide
    eps1 = float(epsilon1)
    k = max(1, int(math.ceil(records)))
    bound = math.ldexp(s0, 20)
    need = max(1, int(n_candidates)) * bound * 2.0**-50
    grid = math.ldexp(1.0, math.frexp(need)[1])  # a power of two >= need
    slack = 4.0 * grid + 2.0**-47 * (bound + grid)
    if not (eps1 > k * 2.0**-40 and math.isfinite(bound) and bound < 2.0**900):
        raise ConfigError(
            f"epsilon1={eps1:g} cannot be represented in the private partition's floating-point noise",
            hint="use a larger epsilon",
        )
    scales = (base * eps1 + k * slack) / (eps1 - k * 2.0**-47)
    return scales, bound, grid


def stage1_noisy_costs(
    costs: np.ndarray,
    scales: np.ndarray,
    bound: float,
    grid: float,
    rng: NoiseSource,
    size: int | tuple[int, ...] | None = None,
) -> np.ndarray:
    """clamp_[-B1,B1](g * rint((clamp_[0,B1](cost) + Lap(b)) / g)); ``size`` draws several rows."""
    c = np.asarray(costs, dtype=np.float64)
    if bound == 0.0:
        return np.broadcast_to(c, size).copy() if size is not None else c.copy()
    shape = c.shape if size is None else size
    z = np.clip(c, 0.0, bound) + rng.laplace(scales, shape)
    return np.clip(np.rint(z / grid) * grid, -bound, bound)


def bucket_costs(
    x: object,
    epsilon2: float,
    *,
    dyadic: bool = True,
    alignment: str = "none",
    sensitivity: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, lengths, bcost)`` for every candidate bucket: bcost = dev + sensitivity/epsilon2.

    ``sensitivity/epsilon2`` is the expected absolute stage-2 noise of a bucket (Prop. 1 of the
    paper); it is a public constant, so it does not enter the privacy analysis.
    """
    eps2 = _check_positive("epsilon2", epsilon2)
    sens = _check_positive("sensitivity", sensitivity)
    starts, lengths, devs = window_deviations(x, dyadic=dyadic, alignment=alignment)
    return starts, lengths, devs + sens / eps2


# ---------------------------------------------------------------------------------------------
# least-cost partition


def _least_cost(
    n: int, starts: np.ndarray, lengths: np.ndarray, costs: np.ndarray
) -> tuple[float, Partition]:
    """argmin over interval partitions of the summed bucket costs (DP over right endpoints).

    For each right end r = 1..n the candidate lengths are scanned in increasing order and replaced
    only on a strict improvement, so ties go to the shortest last bucket (the vectors' convention).
    """
    lens = np.unique(lengths)
    if lens[0] != 1 or np.count_nonzero(lengths == 1) != n:
        raise ValueError("every singleton must be a candidate, otherwise some n have no partition")
    if lens.size <= 64 and starts.size <= _SPARSE_FACTOR * n:
        return _dp_sparse(n, starts, lengths, costs)
    # per length, the cost of the bucket starting at s (+inf where [s, s+L-1] is no candidate)
    cost_of: list[np.ndarray] = []
    for L in lens.tolist():
        sel = lengths == L
        c = np.full(n - L + 1, np.inf)
        c[starts[sel]] = costs[sel]
        cost_of.append(c)
    best = np.zeros(n + 1)
    choice = np.zeros(n + 1, dtype=np.int64)
    if lens.size <= 64:
        bl, ch = _dp_blocked([int(v) for v in lens], cost_of, n)
        best = np.asarray(bl)
        choice = np.asarray(ch, dtype=np.int64)
    else:
        # all intervals (small n): matrix M[L-1, s] = cost of [s, s+L-1]
        mat = np.full((lens.size, n), np.inf)
        for i, c in enumerate(cost_of):
            mat[int(lens[i]) - 1, : c.size] = c
        for r in range(1, n + 1):
            ls = np.arange(1, r + 1)
            vals = best[r - ls] + mat[ls - 1, r - ls]
            k = int(np.argmin(vals))  # first minimum = shortest length on ties
            best[r] = vals[k]
            choice[r] = k + 1
    parts: Partition = []
    r = n
    while r > 0:
        L = int(choice[r])
        parts.append((r - L, r - 1))
        r -= L
    parts.reverse()
    return float(best[n]), parts


#: candidate sets with at most this many buckets per bin use the candidate-by-candidate DP
_SPARSE_FACTOR = 6


def _dp_sparse(n: int, starts: np.ndarray, lengths: np.ndarray, costs: np.ndarray) -> tuple[float, Partition]:
    """The DP for sparse candidate sets (e.g. half-aligned dyadic, about 4n buckets).

    Candidates are relaxed in order of right end, then length: when the buckets ending at e are
    relaxed, every C[s] with s < e is final; strict improvement keeps the shortest of tied lengths.
    O(#candidates) Python steps.
    """
    ends = starts + lengths
    order = np.lexsort((lengths, ends))
    best = [float("inf")] * (n + 1)
    best[0] = 0.0
    choice = [0] * (n + 1)
    for e, s, c, L in zip(
        ends[order].tolist(),
        starts[order].tolist(),
        costs[order].tolist(),
        lengths[order].tolist(),
        strict=True,
    ):
        v = best[s] + c
        if v < best[e]:
            best[e] = v
            choice[e] = L
    parts: Partition = []
    r = n
    while r > 0:
        L = choice[r]
        parts.append((r - L, r - 1))
        r -= L
    parts.reverse()
    return best[n], parts


#: block size of the blocked DP: lengths >= this are relaxed with numpy, shorter ones in Python
_DP_BLOCK = 128


def _dp_blocked(lens: list[int], cost_of: list[np.ndarray], n: int) -> tuple[list[float], list[int]]:
    """C[r] = min_L C[r-L] + cost_L[r-L] for few candidate lengths (ascending), r = 1..n.

    Right ends are processed in blocks of ``_DP_BLOCK``: all sources of a length >= the block size
    lie before the block, so those lengths are relaxed for the whole block with numpy slices; the
    short lengths are relaxed sequentially. Equivalent to scanning lengths 1, 2, 4, ... with strict
    improvement (short lengths come first and the long-length candidate replaces only if strictly
    better).
    """
    blk = _DP_BLOCK
    small = [(L, c.tolist()) for L, c in zip(lens, cost_of, strict=True) if L < blk]
    big = [(L, c) for L, c in zip(lens, cost_of, strict=True) if L >= blk]
    small_lists = [c for _, c in small]
    fast = [L for L, _ in small] == [1, 2, 4, 8, 16, 32, 64]
    best_arr = np.full(n + 1, np.inf)
    best_arr[0] = 0.0
    bl = [0.0] * (n + 1)
    ch = [0] * (n + 1)
    inf = float("inf")
    for r0 in range(1, n + 1, blk):
        r1 = min(n + 1, r0 + blk)
        base = np.full(r1 - r0, np.inf)
        base_len = np.zeros(r1 - r0, dtype=np.int64)
        for L, c in big:
            if L > r1 - 1:
                break
            lo = max(r0, L)
            v = best_arr[lo - L : r1 - L] + c[lo - L : r1 - L]
            seg = base[lo - r0 :]
            upd = v < seg
            seg[upd] = v[upd]
            base_len[lo - r0 :][upd] = L
        base_l = base.tolist()
        base_len_l = base_len.tolist()
        if fast and r0 > blk:
            _dp_block_dyadic7(r0, r1, bl, ch, small_lists, base_l, base_len_l)
            best_arr[r0:r1] = bl[r0:r1]
            continue
        for r in range(r0, r1):
            b = inf
            c_len = 0
            for L, cl in small:
                if L > r:
                    break
                v = bl[r - L] + cl[r - L]
                if v < b:
                    b = v
                    c_len = L
            v = base_l[r - r0]
            if v < b:
                b = v
                c_len = base_len_l[r - r0]
            bl[r] = b
            ch[r] = c_len
        best_arr[r0:r1] = bl[r0:r1]
    return bl, ch


def _dp_block_dyadic7(
    r0: int,
    r1: int,
    bl: list[float],
    ch: list[int],
    small: list[list[float]],
    base_l: list[float],
    base_len_l: list[int],
) -> None:
    """The sequential part of :func:`_dp_blocked` unrolled for lengths 1, 2, ..., 64 (r0 > 128).

    Same scan order and strict-improvement rule as the generic loop.
    """
    c1, c2, c4, c8, c16, c32, c64 = small
    for r in range(r0, r1):
        b = bl[r - 1] + c1[r - 1]
        L = 1
        v = bl[r - 2] + c2[r - 2]
        if v < b:
            b = v
            L = 2
        v = bl[r - 4] + c4[r - 4]
        if v < b:
            b = v
            L = 4
        v = bl[r - 8] + c8[r - 8]
        if v < b:
            b = v
            L = 8
        v = bl[r - 16] + c16[r - 16]
        if v < b:
            b = v
            L = 16
        v = bl[r - 32] + c32[r - 32]
        if v < b:
            b = v
            L = 32
        v = bl[r - 64] + c64[r - 64]
        if v < b:
            b = v
            L = 64
        v = base_l[r - r0]
        if v < b:
            b = v
            L = base_len_l[r - r0]
        bl[r] = b
        ch[r] = L


def partition_cost(
    x: object, partition: Sequence[tuple[int, int]], epsilon2: float, *, sensitivity: float = 1.0
) -> float:
    """pcost(x, B) = sum_{b in B} (dev(x, b) + sensitivity/epsilon2) (noise free)."""
    xv = _as_data_vector(x)
    eps2 = _check_positive("epsilon2", epsilon2)
    st, en = _check_partition(partition, xv.size)
    devs = _deviations(xv, st, en - st + 1)
    return float(np.sum(devs) + st.size * float(sensitivity) / eps2)


def _check_partition(partition: object, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate closed intervals ``(start, end)`` covering 0..n-1 in order; return both columns."""
    arr = np.asarray(partition, dtype=np.int64).reshape(-1, 2)
    st, en = arr[:, 0], arr[:, 1]
    if st.size == 0 or st[0] != 0 or en[-1] != n - 1 or np.any(en < st) or np.any(st[1:] != en[:-1] + 1):
        raise ConfigError(
            "a partition must be consecutive closed intervals [start, end] covering 0..n-1 in order"
        )
    return st, en


def least_cost_partition(
    x: object,
    epsilon2: float,
    *,
    dyadic: bool = True,
    alignment: str = "none",
    sensitivity: float = 1.0,
) -> Partition:
    """Noise-free argmin_B pcost(x, B) (docs/mechanisms.md section 2.2, Problem 1). NOT private: for tests and analysis.

    Candidates: :func:`candidate_buckets` (default: dyadic lengths, any start, as in the vectors).
    """
    xv = _as_data_vector(x)
    starts, lengths, costs = bucket_costs(
        xv, epsilon2, dyadic=dyadic, alignment=alignment, sensitivity=sensitivity
    )
    return _least_cost(xv.size, starts, lengths, costs)[1]


def l1_partition(
    x: object,
    epsilon1: float,
    epsilon2: float,
    rng: NoiseSource,
    *,
    sensitivity: float = 1.0,
    dyadic: bool = True,
    alignment: str = DEFAULT_ALIGNMENT,
    bucket_penalty: float = DEFAULT_BUCKET_PENALTY,
) -> Partition:
    """Private stage 1 (docs/mechanisms.md section 2.2 Algorithm 1 with the safe calibration of 2.4): epsilon1-DP.

    Every candidate bucket (:func:`candidate_buckets`; default dyadic lengths with starts at
    multiples of L/2) has cost ``dev + sensitivity/epsilon2 + bucket_penalty * s_max`` and gets
    independent Laplace noise of scale :func:`stage1_noise_scales` (singletons included; s_max is
    the largest of these scales); the noisy costs are NOT clamped, and the partition of least noisy
    cost is returned as a list of closed intervals ``(start, end)``. Floating point: the noisy
    costs are clamped, put on a power-of-two grid (exact DP sums) and the scales raised slightly
    (:func:`stage1_float_calibration`); the argument is in :mod:`dpsql.mechanisms.dawa`.

    The privacy argument of docs/mechanisms.md section 2.4 holds for any public candidate set that contains the
    singletons (each partition has exactly one bucket through the changed bin), with L_max the
    longest candidate. ``bucket_penalty`` is public and data-independent, so it does not change the
    sensitivity of the costs either. It offsets the winner's curse of a minimum over noisy costs:
    a run of empty bins can be cut in exponentially many ways and the DP collects the favourable
    noise of every extra bucket, so with the plain objective (penalty 0) a sparse histogram is cut
    into thousands of buckets. The reference code avoids this by clamping noisy costs at
    1/epsilon2, which docs/mechanisms.md section 2.4 shows to break the privacy bound. The half-aligned starts reduce the
    number of cuts (and the work) for the same reason. Both defaults were chosen on the DPBench
    benchmark (``benchmarks/dawa.py``); ``alignment="none", bucket_penalty=0`` is the spec's plain
    stage 1.
    """
    xv = _as_data_vector(x)
    if xv.dtype == np.int64:
        # public per-bin cap (1-Lipschitz, so the sensitivity is unchanged): exact deviations
        cap = stage1_bin_cap(xv.size)
        xv = np.clip(xv, -cap, cap)
    eps1 = _check_positive("epsilon1", epsilon1)
    pen = float(bucket_penalty)
    if not np.isfinite(pen) or pen < 0:
        raise ConfigError(f"bucket_penalty must be a finite number >= 0, got {bucket_penalty!r}")
    starts, lengths, costs = bucket_costs(
        xv, epsilon2, dyadic=dyadic, alignment=alignment, sensitivity=sensitivity
    )
    base = np.asarray(stage1_noise_scales(lengths, eps1, int(lengths.max()), sensitivity=sensitivity))
    scales, bound, grid = stage1_float_calibration(base, costs.size, eps1, records=int(math.ceil(sensitivity)))
    shifted = costs + pen * float(scales.max())
    noisy = stage1_noisy_costs(shifted, scales, bound, grid, rng)
    return _least_cost(xv.size, starts, lengths, noisy)[1]


def stage1_scale_table(
    n: int, epsilon1: float, *, sensitivity: float = 1.0, dyadic: bool = True, alignment: str = DEFAULT_ALIGNMENT
) -> dict[int, float]:
    """The stage-1 Laplace scale of each candidate length, exactly as :func:`l1_partition`
    draws them (safe calibration, floating-point adjusted): public, from n, epsilon1 and k only."""
    starts, lengths = candidate_buckets(int(n), dyadic=dyadic, alignment=alignment)
    base = np.asarray(stage1_noise_scales(lengths, epsilon1, int(lengths.max()), sensitivity=sensitivity))
    scales = stage1_float_calibration(base, starts.size, epsilon1, records=int(math.ceil(sensitivity)))[0]
    return {int(L): float(scales[np.flatnonzero(lengths == L)[0]]) for L in np.unique(lengths)}
