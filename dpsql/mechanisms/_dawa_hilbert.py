"""Hilbert-curve order of a d x d grid and the mapping of rectangles to interval workloads (docs/mechanisms.md section 2.6).

The grid is placed in a d x d square (d a power of two) only to define the curve; the padding cells
are never listed, so the 1-D vector has exactly n1 n2 entries.

Complexity: the order of an n1 x n2 grid is O(n1 n2 log d) time and O(n1 n2) memory, vectorised: the
curve position of every real cell is computed directly and the cells sorted by it (listing the whole
d x d square first took O(d²): a 2^20 x 1 grid asked for 2^40 cells). A rectangle becomes the runs
of consecutive positions inside it, found from its border cells only, so O(perimeter) per
rectangle; a workload's border cells are bounded by :data:`MAX_BORDER_CELLS`.
"""

from __future__ import annotations

import numpy as np

from dpsql.errors import ConfigError
from dpsql.mechanisms._dawa_greedyh import IntervalWorkload

#: border cells a workload's rectangles may have in all (``dpsql.plan.workload`` refuses more before
#: any charge; each costs about a hundred bytes while the runs are found)
MAX_BORDER_CELLS = 1 << 22


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


def hilbert_positions(d: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Position along :func:`hilbert_order` of each cell (rows[i], cols[i]) of the d x d square.

    The inverse of the walk in :func:`hilbert_order`, one bit level at a time (from the top): the
    quadrant adds s² q, q = (3 r) ^ c for the level's bits r, c, then the cell is rotated into the
    quadrant's frame (transposed, and flipped when r = 1 and c = 0). O(len log d) time, O(len) memory.
    """
    d = _check_side(d)
    a = np.asarray(rows, dtype=np.int64).copy()
    b = np.asarray(cols, dtype=np.int64).copy()
    pos = np.zeros(a.shape, dtype=np.int64)
    s = d // 2
    while s > 0:
        ra = (a & s) > 0
        rb = (b & s) > 0
        pos += (s * s) * ((3 * ra.astype(np.int64)) ^ rb.astype(np.int64))
        rot = ~rb
        flip = rot & ra
        # within the remaining low bits, d - 1 - v complements them: the same as XOR with d - 1
        a = np.where(flip, a ^ (d - 1), a)
        b = np.where(flip, b ^ (d - 1), b)
        a, b = np.where(rot, b, a), np.where(rot, a, b)
        s //= 2
    return pos


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


def grid_order(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The cells of an n1 x n2 grid in the Hilbert order of its padded d x d square, padding skipped.

    Returns ``(cells, index)``: ``cells`` is (n1 n2, 2) of (row, col) in curve order and
    ``index[row, col]`` the position of a cell in that list. Skipping the padding (docs/mechanisms.md section 2.6 pads
    with zeros) keeps the vector at n1 n2 entries and stops estimates leaking into cells that
    cannot hold data; consecutive real cells stay neighbours except where the curve crosses padding.
    Only the real cells are visited (their curve positions, then a sort): memory O(n1 n2) whatever d.
    """
    n1, n2 = int(shape[0]), int(shape[1])
    if n1 < 1 or n2 < 1:
        raise ConfigError("the grid must have at least one row and one column")
    flat = np.arange(n1 * n2, dtype=np.int64)  # cell (r, c) is r * n2 + c
    pos = hilbert_positions(side_for((n1, n2)), flat // n2, flat % n2)
    by_curve = np.argsort(pos, kind="stable")  # positions are distinct: any sort gives this order
    del pos
    cells = np.stack([by_curve // n2, by_curve % n2], axis=1)
    index = np.empty(n1 * n2, dtype=np.int64)
    index[by_curve] = flat
    return cells, index.reshape(n1, n2)


def check_rects(rects: object, shape: tuple[int, int]) -> np.ndarray:
    """Validate rectangles ``(r0, r1, c0, c1)`` (inclusive cell indices) on a grid of ``shape``."""
    arr = np.asarray(rects)
    if arr.size == 0:
        arr = arr.reshape(0, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ConfigError("rects must be an (m, 4) array of inclusive (r0, r1, c0, c1)")
    if not np.issubdtype(arr.dtype, np.integer) and not np.all(arr == np.rint(arr)):
        raise ConfigError("rectangle bounds must be integer cell indices")
    arr = arr.astype(np.int64)
    r0, r1, c0, c1 = arr.T
    n1, n2 = int(shape[0]), int(shape[1])
    if (
        np.any(r0 > r1)
        or np.any(c0 > c1)
        or np.any(r0 < 0)
        or np.any(c0 < 0)
        or np.any(r1 >= n1)
        or np.any(c1 >= n2)
    ):
        raise ConfigError(f"every rectangle needs 0 <= r0 <= r1 < {n1} and 0 <= c0 <= c1 < {n2}")
    return arr


def rects_to_workload(rects: object, shape: tuple[int, int]) -> IntervalWorkload:
    """Rectangles ``(r0, r1, c0, c1)`` (inclusive, on a grid of ``shape``) as 0/1 queries over the
    n1 n2 positions of :func:`grid_order`: one query per rectangle, as maximal runs of positions.

    A run starts at a cell whose predecessor in the order lies outside the rectangle; its curve
    predecessor is a 4-neighbour (a padding cell or the previous real cell), so run starts and
    ends are border cells of the rectangle and only the border is examined: O(perimeter) each.
    """
    n1, n2 = int(shape[0]), int(shape[1])
    arr = check_rects(rects, (n1, n2))
    r0, r1, c0, c1 = arr.T
    m = arr.shape[0]
    h, w_ = r1 - r0 + 1, c1 - c0 + 1
    border = int(np.sum(np.where((h <= 2) | (w_ <= 2), h * w_, 2 * (h + w_) - 4)))
    if border > MAX_BORDER_CELLS:
        raise ConfigError(f"the {m} rectangles have {border:,} border cells in all; at most {MAX_BORDER_CELLS:,} are supported",
                          hint="pass fewer or smaller rectangles, or a coarser grid")
    order, index = grid_order((n1, n2))
    size = n1 * n2
    if m == 0:
        return IntervalWorkload.from_intervals([], [], [], size, 0)
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
        ok = (p >= 0) & (p < size)
        cell = order[np.clip(p, 0, size - 1)]
        return (
            ok & (cell[:, 0] >= r0[q]) & (cell[:, 0] <= r1[q]) & (cell[:, 1] >= c0[q]) & (cell[:, 1] <= c1[q])
        )

    is_start = ~inside(pos - 1, rid)
    is_end = ~inside(pos + 1, rid)
    # sorted by (rectangle, position), starts and ends of the runs alternate within a rectangle
    ks = np.sort(rid[is_start] * size + pos[is_start])
    ke = np.sort(rid[is_end] * size + pos[is_end])
    return IntervalWorkload.from_intervals(ks // size, ks % size, ke % size, size, m)
