"""Hilbert-curve order of a d x d grid and the mapping of rectangles to interval workloads (spec 2.6).

Complexity: the order is O(d² log d) vectorised; a rectangle becomes the runs of consecutive
Hilbert positions inside it, found from its border cells only (a run starts at a cell whose curve
predecessor lies outside the rectangle, and every such cell is on the border because the curve
moves between 4-neighbours), so O(perimeter) per rectangle.
"""

from __future__ import annotations

import numpy as np

from dpsql.errors import ConfigError
from dpsql.mechanisms._dawa_greedyh import IntervalWorkload


def _check_side(d: int) -> int:
    if isinstance(d, bool) or int(d) != d or d < 1 or (int(d) & (int(d) - 1)) != 0:
        raise ConfigError(f"the Hilbert side must be a power of two >= 1, got {d!r}")
    return int(d)


def hilbert_order(d: int) -> np.ndarray:
    """Cells of a d x d grid (d a power of two) in Hilbert-curve order: a (d², 2) array of (row, col).

    Orientation: the curve starts at (0, 0) and ends at (d-1, 0); for d = 2 it visits
    (0,0), (0,1), (1,1), (1,0), for d = 4 it starts (0,0), (1,0), (1,1), (0,1), (0,2) — exactly the
    order of ``hilbert_order`` in the spec vectors (first coordinate = row = axis 0).
    """
    d = _check_side(d)
    t = np.arange(d * d, dtype=np.int64)
    a = np.zeros_like(t)  # first coordinate
    b = np.zeros_like(t)  # second coordinate
    s = 1
    while s < d:
        ra = 1 & (t // 2)
        rb = 1 & (t ^ ra)
        # rotate the sub-square when rb == 0 (flip it too when ra == 1)
        rot = rb == 0
        flip = rot & (ra == 1)
        a = np.where(flip, s - 1 - a, a)
        b = np.where(flip, s - 1 - b, b)
        a, b = np.where(rot, b, a), np.where(rot, a, b)
        a = a + s * ra
        b = b + s * rb
        t = t // 4
        s *= 2
    return np.stack([a, b], axis=1)


def hilbert_index(d: int) -> np.ndarray:
    """(d, d) array: position of cell (row, col) along :func:`hilbert_order`."""
    order = hilbert_order(d)
    idx = np.empty((d, d), dtype=np.int64)
    idx[order[:, 0], order[:, 1]] = np.arange(d * d, dtype=np.int64)
    return idx


def side_for(shape: tuple[int, int]) -> int:
    """d = 2^ceil(log2 max(n1, n2)): the padded square side."""
    m = max(int(shape[0]), int(shape[1]))
    return 1 << max(0, (m - 1).bit_length())


def rects_to_workload(rects: object, shape: tuple[int, int], d: int | None = None) -> IntervalWorkload:
    """Rectangles ``(r0, r1, c0, c1)`` (inclusive, on a grid of ``shape``) as 0/1 queries over the
    d² Hilbert positions of the padded square: one query per rectangle, as runs of positions."""
    n1, n2 = int(shape[0]), int(shape[1])
    d = side_for((n1, n2)) if d is None else _check_side(d)
    arr = np.asarray(rects)
    if arr.size == 0:
        arr = arr.reshape(0, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ConfigError("rects must be an (m, 4) array of inclusive (r0, r1, c0, c1)")
    if not np.issubdtype(arr.dtype, np.integer) and not np.all(arr == np.rint(arr)):
        raise ConfigError("rectangle bounds must be integer cell indices")
    arr = arr.astype(np.int64)
    r0, r1, c0, c1 = arr.T
    if (
        np.any(r0 > r1)
        or np.any(c0 > c1)
        or np.any(r0 < 0)
        or np.any(c0 < 0)
        or np.any(r1 >= n1)
        or np.any(c1 >= n2)
    ):
        raise ConfigError(f"every rectangle needs 0 <= r0 <= r1 < {n1} and 0 <= c0 <= c1 < {n2}")
    m = arr.shape[0]
    order = hilbert_order(d)
    index = np.empty((d, d), dtype=np.int64)
    index[order[:, 0], order[:, 1]] = np.arange(d * d, dtype=np.int64)
    if m == 0:
        return IntervalWorkload.from_intervals([], [], [], d * d, 0)
    # border cells of every rectangle, each once: full top row, bottom row if distinct, then the
    # left and right columns without their top and bottom cells (right only if distinct)
    h_in = np.maximum(r1 - r0 - 1, 0)
    w = c1 - c0 + 1
    has_bottom = r1 > r0
    has_right = c1 > c0
    parts = (
        (r0, c0, w, 0, 1),
        (r1, c0, np.where(has_bottom, w, 0), 0, 1),
        (r0 + 1, c0, h_in, 1, 0),
        (r0 + 1, c1, np.where(has_right, h_in, 0), 1, 0),
    )
    rid_l, rr_l, cc_l = [], [], []
    for row0, col0, cnt, dr, dc in parts:
        rid = np.repeat(np.arange(m), cnt)
        off = np.arange(rid.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        rid_l.append(rid)
        rr_l.append(np.repeat(row0, cnt) + dr * off)
        cc_l.append(np.repeat(col0, cnt) + dc * off)
    rid = np.concatenate(rid_l)
    pos = index[np.concatenate(rr_l), np.concatenate(cc_l)]

    def inside(p: np.ndarray, q: np.ndarray) -> np.ndarray:
        ok = (p >= 0) & (p < d * d)
        cell = order[np.clip(p, 0, d * d - 1)]
        return (
            ok & (cell[:, 0] >= r0[q]) & (cell[:, 0] <= r1[q]) & (cell[:, 1] >= c0[q]) & (cell[:, 1] <= c1[q])
        )

    is_start = ~inside(pos - 1, rid)
    is_end = ~inside(pos + 1, rid)
    # sorted by (rectangle, position), starts and ends of the runs alternate within a rectangle
    ks = np.sort(rid[is_start] * (d * d) + pos[is_start])
    ke = np.sort(rid[is_end] * (d * d) + pos[is_end])
    return IntervalWorkload.from_intervals(ks // (d * d), ks % (d * d), ke % (d * d), d * d, m)
