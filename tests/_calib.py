"""Helpers of the calibration tests (``test_calibration_pinned.py``, ``test_calibration_gof.py``).

Only the public API is used: ``dpsql.Session``, ``register``/``query``/``query_many``/``explain``,
``history()``, and the test noise sources of ``dpsql.testing`` (subclassed here).

* :class:`RecordingNoise` — a seeded source that records the scale of every Gaussian and Laplace
  draw, so a test can check the noise the mechanism *actually* drew against a pinned number.
* :class:`ScaledNoise` — a seeded source whose Gaussian and Laplace samples are multiplied by a
  factor: 0.7 is an under-noised mechanism, 1.3 an over-noised one (negative controls).
* :func:`gof_pvalue` — goodness of fit of released values to "truth + noise of the pinned scale,
  then rounded to a grid", by two tests combined with Bonferroni (so the false-rejection
  probability is at most the threshold used): Pearson chi-square over the grid cells (tails with
  expected count < 5 pooled) and Kolmogorov–Smirnov on the randomised probability integral
  transform, which is exactly U(0, 1) for grid-valued data (continuity-aware KS).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from scipy import stats

from dpsql.testing import SeededNoise

#: significance threshold of every goodness-of-fit test: a correctly calibrated mechanism is
#: rejected with probability at most 1e-6 (and the seeds are fixed, so the outcome is reproducible)
ALPHA = 1e-6


class RecordingNoise(SeededNoise):
    """Seeded noise that records (kind, scale array, size) of every Gaussian / Laplace draw."""

    def __init__(self, seed: int | str) -> None:
        super().__init__(seed)
        self.draws: list[tuple[str, np.ndarray, Any]] = []

    def normal(self, scale, size):  # type: ignore[no-untyped-def]
        self.draws.append(("normal", np.array(scale, dtype=np.float64, copy=True), size))
        return super().normal(scale, size)

    def laplace(self, scale, size):  # type: ignore[no-untyped-def]
        self.draws.append(("laplace", np.array(scale, dtype=np.float64, copy=True), size))
        return super().laplace(scale, size)

    def scales(self, kind: str) -> list[float]:
        """Every distinct scale drawn with (``"normal"`` or ``"laplace"``), sorted."""
        out: set[float] = set()
        for k, s, _ in self.draws:
            if k == kind:
                out.update(float(v) for v in np.ravel(s))
        return sorted(out)


class ScaledNoise(SeededNoise):
    """Seeded noise whose Gaussian and Laplace samples are ``factor`` times what they should be."""

    def __init__(self, seed: int | str, factor: float) -> None:
        super().__init__(seed)
        self.factor = float(factor)

    def normal(self, scale, size):  # type: ignore[no-untyped-def]
        return self.factor * super().normal(scale, size)

    def laplace(self, scale, size):  # type: ignore[no-untyped-def]
        return self.factor * super().laplace(scale, size)


def numbers(obj: Any) -> Iterator[float]:
    """Every number inside ``obj`` (dicts, lists, and JSON text such as ledger params)."""
    if isinstance(obj, bool) or obj is None:
        return
    if isinstance(obj, (int, float)):
        yield float(obj)
    elif isinstance(obj, str):
        try:
            parsed = json.loads(obj)
        except ValueError:
            return
        if not isinstance(parsed, str):
            yield from numbers(parsed)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from numbers(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from numbers(v)


def states(obj: Any, value: float, rel: float = 1e-9) -> bool:
    """True if ``obj`` (explain parameters, a ledger row, release details) states ``value``.

    Deliberately blind to key names: each mechanism describes itself in its own words; the test
    asks only that the pinned number is among what it records."""
    return any(math.isclose(x, value, rel_tol=rel, abs_tol=0.0) for x in numbers(obj))


def last_ledger_row(session: Any) -> dict[str, Any]:
    return session.history().to_pylist()[-1]  # type: ignore[no-any-return]


def spread_table(groups: int, per_group: int, groups_per_unit: int, value: float | None = None) -> pa.Table:
    """``groups`` keys ``k00000``..; every key holds exactly ``per_group`` distinct units, one row each.

    Unit u has one row in each of the ``groups_per_unit`` keys (u + i) mod groups, so no unit
    exceeds C_u = ``groups_per_unit`` groups or one row per group: bounding drops nothing and the
    bounded truth is known by construction (COUNT = per_group, SUM = per_group * value).
    """
    assert per_group % groups_per_unit == 0 and groups_per_unit <= groups
    n_units = groups * (per_group // groups_per_unit)
    unit = np.repeat(np.arange(n_units, dtype=np.int64), groups_per_unit)
    key = (unit + np.tile(np.arange(groups_per_unit), n_units)) % groups
    cols: dict[str, Any] = {"uid": pa.array(unit), "k": pa.array(np.char.add("k", np.char.zfill(key.astype(str), 5)))}
    if value is not None:
        cols["v"] = pa.array(np.full(unit.size, float(value)))
    return pa.table(cols)


def key_domain(groups: int) -> list[str]:
    return [f"k{i:05d}" for i in range(groups)]


def _cells(lo: np.ndarray, hi: np.ndarray, cdf: Callable[[np.ndarray], np.ndarray], sf: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """P(lo < X <= hi), accurate in both tails."""
    return np.where(hi <= 0, cdf(hi) - cdf(lo), sf(lo) - sf(hi))


def gof_pvalue(
    released: np.ndarray,
    truth: float,
    dist: Any,
    grid: float,
    *,
    seed: int = 20261130,
) -> float:
    """p-value of "released = grid * rint((truth + X) / grid)" with X ~ ``dist`` (a frozen scipy
    distribution centred at 0), for grid-valued releases with one common truth (so the draws are
    i.i.d.). Bonferroni over two tests: Pearson chi-square on the grid cells and KS on the
    randomised PIT. Asserts every released value lies on the grid.
    """
    r = np.asarray(released, dtype=np.float64)
    j = np.rint(r / grid)
    assert np.all(j * grid == r), "a released value is off its rounding grid"
    d = r - truth
    lo, hi = d - grid / 2.0, d + grid / 2.0
    # -- chi-square over the cells of the grid, tails pooled until each cell expects >= 5
    n = r.size
    c0 = math.floor((dist.ppf(1e-9) + truth) / grid) - 1
    c1 = math.ceil((dist.isf(1e-9) + truth) / grid) + 1
    idx = np.arange(c0, c1 + 1)
    edges_lo = idx * grid - grid / 2.0 - truth
    p = _cells(edges_lo, edges_lo + grid, dist.cdf, dist.sf)
    obs = np.array([np.count_nonzero(j == i) for i in idx], dtype=np.float64)
    exp_ = p * n
    # pool: open-ended tails absorb everything outside [c0, c1] too
    left_obs = float(np.count_nonzero(j < c0))
    right_obs = float(np.count_nonzero(j > c1))
    left_exp = float(dist.cdf(c0 * grid - grid / 2.0 - truth)) * n
    right_exp = float(dist.sf(c1 * grid + grid / 2.0 - truth)) * n
    o_cells, e_cells = [], []
    acc_o, acc_e = left_obs, left_exp
    for o, e in zip(obs, exp_, strict=True):
        acc_o += o
        acc_e += e
        if acc_e >= 5.0:
            o_cells.append(acc_o)
            e_cells.append(acc_e)
            acc_o = acc_e = 0.0
    acc_o += right_obs
    acc_e += right_exp
    if e_cells:
        o_cells[-1] += acc_o
        e_cells[-1] += acc_e
    e_arr = np.asarray(e_cells)
    p_chi = float(stats.chisquare(o_cells, e_arr * n / e_arr.sum()).pvalue) if len(e_cells) > 1 else 1.0
    # -- KS on the randomised probability integral transform: exactly U(0, 1) under the model
    f_lo = dist.cdf(lo)
    f_hi = dist.cdf(hi)
    v = np.random.default_rng(seed).random(n)
    u = f_lo + v * (f_hi - f_lo)
    p_ks = float(stats.kstest(u, "uniform").pvalue)
    return min(1.0, 2.0 * min(p_chi, p_ks))
