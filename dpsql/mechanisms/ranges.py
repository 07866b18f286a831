"""Range workloads answered by DAWA (``dpsql.mechanisms.dawa``), with free reuse of the synopsis.

The workload itself (which bins each query asks for) is read from the SQL by
``dpsql.plan.workload``; the histogram is bounded by ``dpsql.rewrite.bound.bounded_histogram``
(the per-unit row cap L shared with every mechanism); this module runs DAWA and answers from a
synopsis.

Privacy claim
-------------
Neighbouring relation: add or remove one privacy unit with all of its rows. The bounding SQL
keeps at most k = ``max_rows_per_unit`` rows per unit (a uniform random subset, by a salted
hash of the unit and a per-unit row number) after the base conditions, and drops rows outside the declared domain,
so one unit changes the histogram by at most k in L1 norm. DAWA is run with ``sensitivity=k``
(every noise scale multiplied by k), which makes the synopsis epsilon-DP for this relation
(spec section 2; stage 1 with the safe calibration of section 2.4). The released synopsis
(partition + bucket totals, rounded to integers) is stored with its ledger entry; later range
counts and coarser histograms over the same table, column(s), base conditions and cap are
computed from it alone: post-processing, zero cost.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from dpsql.catalog import TableSpec
from dpsql.plan.analyze import resolve_unit_column
from dpsql.plan.workload import Workload
from dpsql.rewrite.bound import bounded_histogram


def bin_ranges(wl: Workload) -> np.ndarray:
    """The workload's inclusive bin ranges as an (m, 2 * dims) integer array."""
    return np.asarray(wl.ranges, dtype=np.int64).reshape(len(wl.ranges), 2 * len(wl.dims))


#: the bounded histogram is built in the rewrite layer, from the shared per-unit row cap
histogram_sql = bounded_histogram


def unit_column(wl: Workload, catalog: dict[str, TableSpec]) -> str:
    u = resolve_unit_column(wl.table, catalog)
    assert u is not None
    return u


# -- running DAWA and answering from a stored synopsis -----------------------------------------


def fill_histogram(wl: Workload, rows: Any) -> np.ndarray:
    """Dense histogram (1-D vector or 2-D grid) from the bounded (bin, count) rows."""
    shape = tuple(d.n for d in wl.dims)
    x = np.zeros(shape, dtype=np.float64)
    cols = [np.asarray(rows.column(f"__b{i}").to_numpy(zero_copy_only=False), dtype=np.int64) for i in range(len(wl.dims))]
    n = np.asarray(rows.column("__n").to_numpy(zero_copy_only=False), dtype=np.float64)
    if len(n):
        np.add.at(x, tuple(cols), n)
    return x


def run_dawa(wl: Workload, x: np.ndarray, epsilon: float, rng: Any, *, split: float, cap: float) -> Any:
    """The DAWA synopsis of the bounded histogram for this workload, rounded to integers."""
    from dpsql.mechanisms import dawa as _dawa

    r = bin_ranges(wl)
    valid: np.ndarray = np.all(np.asarray(r[:, 0::2] <= r[:, 1::2], dtype=bool), axis=1).astype(bool)
    ranges = np.where(valid[:, None], r, 0)
    if len(wl.dims) == 1:
        return _dawa.dawa(x, ranges, epsilon, rng, ratio=split, sensitivity=cap).rounded(1.0)
    rects = ranges[:, [0, 1, 2, 3]]
    return _dawa.dawa_2d(x, rects, epsilon, rng, ratio=split, sensitivity=cap).rounded(1.0)


def precheck_dawa(wl: Workload, epsilon: float, *, split: float, cap: float) -> None:
    """Refuse, before the charge, parameters whose DAWA noise cannot be represented (no data read)."""
    from dpsql.mechanisms import dawa as _dawa

    n = 1
    for d in wl.dims:
        n *= d.n
    _dawa.dawa_precheck(n, epsilon, ratio=split, sensitivity=cap)


def load_synopsis(text: str) -> Any:
    from dpsql.mechanisms import dawa as _dawa

    kind = json.loads(text).get("kind", "")
    if "2d" in kind:
        return _dawa.DawaSynopsis2D.from_json(text)
    return _dawa.DawaSynopsis.from_json(text)


def answer(wl: Workload, syn: Any) -> np.ndarray:
    """Answers to the workload's ranges from a (rounded) synopsis: post-processing."""
    r = bin_ranges(wl)
    valid: np.ndarray = np.all(np.asarray(r[:, 0::2] <= r[:, 1::2], dtype=bool), axis=1).astype(bool)
    safe = np.where(valid[:, None], r, 0)
    if len(wl.dims) == 1:
        out = np.asarray(syn.answer_ranges(safe), dtype=np.float64)
    else:
        out = np.asarray(syn.answer_rects(safe[:, [0, 1, 2, 3]]), dtype=np.float64)
    out = np.where(valid, out, 0.0)
    return np.rint(out)
