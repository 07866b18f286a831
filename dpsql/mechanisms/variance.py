"""VARIANCE / VAR_POP / STDDEV / STDDEV_POP (and the spellings VAR, STD, STDEV, VARP, STDEVP):
post-processing of three noisy bounded sums, with an honest 95% interval.

Privacy claim
-------------
Neighbouring relation: add or remove one privacy unit with all of its rows (user level).
The bounded query (``dpsql.rewrite.bound``) clamps each kept row's value to the declared (or
derived, ``dpsql.plan.intervals``) bounds [lo, hi] and centres it, c = clamp(x) - m with
m = (lo + hi) / 2, so |c| <= r = (hi - lo) / 2 and 0 <= c^2 <= r^2 (r as computed: the largest
|fl(lo - m)|, |fl(hi - m)|, which rounding can make larger than (hi - lo) / 2,
``dpsql.rewrite.bound.released_columns``). Per group it releases

* n = COUNT(x) of the kept rows: one unit changes it by at most k,
* S = SUM(c): one unit changes it by at most k * r,
* Q = SUM(c^2): one unit changes it by at most k * r^2,

with k = min(max_rows_per_group, max_rows_per_unit) rows kept per (unit, group). These are three
released columns of the answering mechanism (``dpsql.mechanisms.basic``: Gaussian or snapped
Laplace; or the sparse histogram's extra columns), each noised on the scale of its own
sensitivity, so the budget is split evenly among the normalised columns (the L2 / L1
sensitivity sqrt(C * m) / C * m counts all three: m grows by 3 per variance). The variance is
then computed from released values only (post-processing, no further privacy cost):

    var_pop = Q / n - (S / n)^2,  var_samp = var_pop * n / (n - 1),  stddev = sqrt(var),

clipped to its possible range ([0, r^2] for var_pop, [0, 2 r^2] for var_samp: values in
[lo, hi] cannot spread more). It estimates the variance of the *bounded* values (clamped, at
most k rows per person in each group), which is what the ledger states.

Accuracy (honest, not an approximation): each of n, S, Q lies within its 95/3 % two-sided
noise interval with probability >= 1 - 0.05/3 (Gaussian: z = 2.394 standard deviations;
snapped Laplace: lambda * ln(60) plus half the snapping grid; plus half the rounding grid), so
all three do at once with probability >= 95% (union bound). The interval reported is the
range of the variance over that box (exact extremes of Q/n - (S/n)^2 over a box, then the
n/(n-1) factor and the clip), so it covers the bounded truth with probability >= 95%. It is
wide for small groups, as it should be.
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.plan import ir

#: two-sided normal quantile for a 1 - 0.05/3 interval (each of three columns)
Z_THIRD = 2.3939797998185104
#: P(|Lap(b)| > b ln 60) = 1/60 = 0.05 / 3
LAPLACE_THIRD = math.log(60.0)


def point(kind: str, n: np.ndarray, s: np.ndarray, q: np.ndarray, r: float) -> np.ndarray:
    """The released statistic from released n, S, Q (NaN where the count is too small)."""
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        pop = np.clip(q / n - (s / n) ** 2, 0.0, r * r)
        samp = np.clip(pop * n / (n - 1.0), 0.0, 2.0 * r * r)
    if kind in (ir.VAR_POP, ir.STDDEV_POP):
        out = np.where(n >= 1, pop, np.nan)
    else:
        out = np.where(n >= 2, samp, np.nan)
    return np.sqrt(out) if kind in (ir.STDDEV_SAMP, ir.STDDEV_POP) else out


def interval(kind: str, n: np.ndarray, s: np.ndarray, q: np.ndarray, hn: float, hs: float, hq: float,
             r: float) -> tuple[np.ndarray, np.ndarray]:
    """The range of the statistic over the box n +- hn, S +- hs, Q +- hq (see the module docstring)."""
    n = np.asarray(n, dtype=np.float64)
    n_lo, n_hi = np.maximum(n - hn, 1.0), np.maximum(n + hn, 1.0)
    s_lo, s_hi = s - hs, s + hs
    q_lo, q_hi = np.maximum(q - hq, 0.0), np.maximum(q + hq, 0.0)
    means = np.stack([s_lo / n_lo, s_lo / n_hi, s_hi / n_lo, s_hi / n_hi])
    m_lo, m_hi = means.min(axis=0), means.max(axis=0)
    sq_max = np.maximum(m_lo**2, m_hi**2)
    sq_min = np.where((m_lo <= 0) & (m_hi >= 0), 0.0, np.minimum(m_lo**2, m_hi**2))
    pop_lo = np.clip(q_lo / n_hi - sq_max, 0.0, r * r)
    pop_hi = np.clip(q_hi / n_lo - sq_min, 0.0, r * r)
    if kind in (ir.VAR_POP, ir.STDDEV_POP):
        lo, hi = pop_lo, pop_hi
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            f_lo = n_hi / np.maximum(n_hi - 1.0, 1e-300)
            f_hi = np.where(n_lo >= 2, n_lo / (n_lo - 1.0), np.inf)
        # np.where evaluates both branches: 0 x inf where f_hi is infinite (masked) must not warn, which
        # under a caller's warnings-as-errors would fail a query after its charge
        with np.errstate(invalid="ignore", over="ignore"):
            lo = np.clip(np.where(n_hi >= 2, pop_lo * f_lo, 0.0), 0.0, 2.0 * r * r)
            hi = np.clip(np.where(np.isfinite(f_hi), pop_hi * f_hi, 2.0 * r * r), 0.0, 2.0 * r * r)
    if kind in (ir.STDDEV_SAMP, ir.STDDEV_POP):
        return np.sqrt(lo), np.sqrt(hi)
    return lo, hi
