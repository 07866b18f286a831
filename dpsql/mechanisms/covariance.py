"""COVAR_POP / COVAR_SAMP / CORR and the REGR_* family (REGR_SLOPE, REGR_INTERCEPT, REGR_COUNT, REGR_AVGX,
REGR_AVGY, REGR_SXX, REGR_SYY, REGR_SXY, REGR_R2) of two bounded values: post-processing of noisy bounded
sums, with an honest 95% interval.

Privacy claim
-------------
Neighbouring relation: add or remove one privacy unit with all of its rows (user level).
The bounded query (``dpsql.rewrite.bound``) reads, of each kept row, the two arguments a and b,
each clamped to its own declared (or derived, ``dpsql.plan.intervals``) bounds and centred on
its midpoint (|a| <= ra, |b| <= rb, the magnitudes as computed, ``bound._value_range``), and
only the rows where both are non-NULL (as SQL's COVAR_POP and CORR skip a pair with a NULL).
Per group it releases

* n = the count of those rows: one unit changes it by at most k,
* Sa = SUM(a), Sb = SUM(b): by at most k * ra and k * rb,
* Sab = SUM(a * b): by at most k * fl(ra * rb) (|fl(a * b)| <= fl(ra * rb), rounding is monotone),
* for CORR also Qa = SUM(a^2), Qb = SUM(b^2): by at most k * ra^2 and k * rb^2 (for REGR_SLOPE(a, b)
  and REGR_INTERCEPT(a, b), whose independent variable is the second argument b, Qb only),

with k = min(max_rows_per_group, max_rows_per_unit) rows kept per (unit, group) (one choice of
rows for every aggregate of the query). An aggregate reads only some of them (``bound.pair_columns``):
COVAR_POP, COVAR_SAMP, REGR_SXY n, Sa, Sb, Sab; CORR, REGR_R2 all six; REGR_SLOPE, REGR_INTERCEPT n, Sa, Sb,
Sab, Qb; REGR_COUNT n alone; REGR_AVGY n, Sa; REGR_AVGX n, Sb; REGR_SYY n, Sa, Qa; REGR_SXX n, Sb, Qb (a is
the first argument, y; b the second, x). The aggregates of one query over the same two arguments, in either
order, read the same kept, clamped, centred pairs, so they share one release of the union of the columns they
read (``bound.pair_sources``: under the name of the first of them, in its order; one written (x, y) reads the
sums of y as those of x and the reverse, ``bound.pair_swapped``); each column is released once, and charged once. These are 1 to 6 released columns of the answering mechanism (``dpsql.mechanisms.basic``: Gaussian or snapped Laplace; or the sparse
histogram's extra columns), each noised on the scale of its own sensitivity: the budget is split
evenly among the normalised columns (m in the L2 / L1 sensitivity sqrt(C * m) / C * m grows by
the number of columns released for the pair). Every sum is the exact total of fixed-point integers (``bound.fixed_point_scale``).
The statistic is computed from released values only (post-processing, no further cost):

    cov_pop  = Sab / n - (Sa / n) (Sb / n)            (centring does not change a covariance)
    cov_samp = cov_pop * n / (n - 1)
    corr     = cov_pop / sqrt(var_a * var_b),  var_a = Qa / n - (Sa / n)^2 (likewise var_b),
    slope    = cov_pop / var_b,  intercept = mean_a - slope * mean_b,
               mean_a = ca + Sa / n clipped to a's bounds (ca their midpoint; likewise mean_b),
    REGR_COUNT = n,  REGR_AVGY = mean_a,  REGR_AVGX = mean_b,
    REGR_SYY = max(Qa - Sa^2 / n, 0),  REGR_SXX = max(Qb - Sb^2 / n, 0),  REGR_SXY = Sab - Sa Sb / n,
    REGR_R2  = corr^2 where var_b > 0 and var_a > 0;  1 where var_b > 0 and var_a <= 0,

(SQL's definitions: n var_pop, n covar_pop, corr^2 with REGR_R2's rules: NULL where var_pop(x) = 0, else 1
where var_pop(y) = 0; x is b). REGR_COUNT is the released count itself (a noisy count, as COUNT's: it may be
below 0; over arguments without bounds the analysis answers it as COUNT of the rows where both are not NULL,
``dpsql.plan.analyze``, not here). REGR_AVGX, REGR_AVGY, REGR_SXX, REGR_SYY, REGR_SXY are NULL where the released count is below 1
(SQL: NULL over no pairs); REGR_R2 where it is below 2 or the released var_b is not positive (x's rule first,
as in SQL), and 1 where var_b > 0 and the released var_a is not positive. REGR_SXX and REGR_SYY are at least 0,
REGR_R2 in [0, 1]; REGR_SXY is not clipped (its range depends on the private count).

NULL where the released count is below 1 (COVAR_POP), below 2 (COVAR_SAMP, CORR, REGR_SLOPE, REGR_INTERCEPT), for CORR
where a released variance var_a or var_b is not positive, for REGR_SLOPE and REGR_INTERCEPT where var_b is not positive (the
noisy sums say nothing about the spread then: a total rule on released values, never an error after
the charge), and where a slope or intercept is not a finite double. COVAR and CORR are clipped to their
possible range: |cov_pop| <= ra * rb, |cov_samp| <= 2 ra * rb (values in [-r, r] cannot co-vary
more), corr in [-1, 1]; a slope has no range of its own. It estimates the statistic of the *bounded* values (clamped,
at most k rows per person in each group), which is what the ledger states.

Accuracy (honest, not an approximation): each of the m columns lies within its two-sided
1 - 0.05/m noise interval (Gaussian: z_{1 - 0.025/m} standard deviations; snapped Laplace:
lambda ln(20 m) plus half the snapping grid; plus half the rounding grid), so all do at once
with probability >= 95% (union bound). The interval reported contains the statistic's range over
that box (bounded by interval arithmetic over the box's corners: wider than the exact range,
never narrower), so it covers the bounded truth with probability >= 95%; for REGR_SLOPE and REGR_INTERCEPT it
is unbounded (infinite) where the box holds a variance var_b of 0. m counts the columns the aggregate reads
(a shared release has more, read by others: each statistic's union bound is over its own). REGR_COUNT's is
the count's own (m = 1); REGR_R2's is CORR's interval squared (all of [0, 1] where CORR's is [-1, 1]).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from dpsql.plan import ir

REGR_KINDS = (ir.REGR_SLOPE, ir.REGR_INTERCEPT)
#: the regression aggregates read from fewer sums: no covariance-over-variance ratio
MOMENT_KINDS = (ir.REGR_COUNT, ir.REGR_AVGX, ir.REGR_AVGY, ir.REGR_SXX, ir.REGR_SYY, ir.REGR_SXY)


def z_share(m: int) -> float:
    """The two-sided normal quantile of a 1 - 0.05/m interval."""
    return NormalDist().inv_cdf(1.0 - 0.025 / m)


def laplace_share(m: int) -> float:
    """P(|Lap(b)| > b ln(20 m)) = 1 / (20 m) = 0.05 / m."""
    return math.log(20.0 * m)


def _limit(kind: str, ra: float, rb: float) -> float:
    if kind in REGR_KINDS:
        return math.inf  # a slope has no range of its own
    if kind == ir.CORR:
        return 1.0
    return ra * rb * (2.0 if kind == ir.COVAR_SAMP else 1.0)


def point(kind: str, n: np.ndarray, sa: np.ndarray, sb: np.ndarray, sab: np.ndarray,
          qa: np.ndarray | None, qb: np.ndarray | None, ra: float, rb: float,
          ca: float = 0.0, cb: float = 0.0) -> np.ndarray:
    """The released statistic from released sums (NaN where it is NULL, see the module docstring);
    ``ca``, ``cb``: the centring shifts (the bounds' midpoints) of the two arguments (REGR_INTERCEPT)."""
    n = np.asarray(n, dtype=np.float64)
    if kind in MOMENT_KINDS:
        return _moment_point(kind, n, sa, sb, sab, qa, qb, ra, rb, ca, cb)
    lim = _limit(kind, ra, rb)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        nn = np.maximum(n, 1.0)
        pop = sab / nn - (sa / nn) * (sb / nn)
        if kind == ir.REGR_R2:  # CORR^2, NULL where var_b (x's) is not positive, else 1 where var_a (y's) is not
            assert qa is not None and qb is not None
            va, vb = qa / nn - (sa / nn) ** 2, qb / nn - (sb / nn) ** 2
            r = np.clip(pop / np.sqrt(np.where((va > 0) & (vb > 0), va * vb, 1.0)), -1.0, 1.0)
            return np.where((n >= 2) & (vb > 0), np.where(va > 0, r * r, 1.0), np.nan)
        if kind in REGR_KINDS:
            assert qb is not None
            vb = qb / nn - (sb / nn) ** 2
            ok = (n >= 2) & (vb > 0)
            out = pop / np.where(ok, vb, 1.0)
            if kind == ir.REGR_INTERCEPT:  # mean(y) - slope * mean(x), each mean clipped to its bounds
                out = np.clip(ca + sa / nn, ca - ra, ca + ra) - out * np.clip(cb + sb / nn, cb - rb, cb + rb)
            return np.where(ok & np.isfinite(out), out, np.nan)
        if kind == ir.COVAR_POP:
            return np.where(n >= 1, np.clip(pop, -lim, lim), np.nan)
        if kind == ir.COVAR_SAMP:
            return np.where(n >= 2, np.clip(pop * nn / np.maximum(nn - 1.0, 1.0), -lim, lim), np.nan)
        assert qa is not None and qb is not None
        va = qa / nn - (sa / nn) ** 2
        vb = qb / nn - (sb / nn) ** 2
        ok = (n >= 2) & (va > 0) & (vb > 0)
        r = pop / np.sqrt(np.where(ok, va * vb, 1.0))
        return np.where(ok, np.clip(r, -1.0, 1.0), np.nan)


def _moment_point(kind: str, n: np.ndarray, sa: np.ndarray, sb: np.ndarray, sab: np.ndarray, qa: np.ndarray | None,
                  qb: np.ndarray | None, ra: float, rb: float, ca: float, cb: float) -> np.ndarray:
    """REGR_COUNT (the released count itself), REGR_AVGX / REGR_AVGY (the midpoint plus the centred mean, clipped
    to the bounds), REGR_SXX / REGR_SYY (the centred sum of squares less the squared sum over n, at least 0) and
    REGR_SXY (the sum of products less the product of the sums over n): NULL where the count is below 1."""
    if kind == ir.REGR_COUNT:
        return n
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        nn = np.maximum(n, 1.0)
        if kind == ir.REGR_AVGX:
            out = np.clip(cb + sb / nn, cb - rb, cb + rb)
        elif kind == ir.REGR_AVGY:
            out = np.clip(ca + sa / nn, ca - ra, ca + ra)
        elif kind == ir.REGR_SXX:
            assert qb is not None
            out = np.maximum(qb - sb * sb / nn, 0.0)
        elif kind == ir.REGR_SYY:
            assert qa is not None
            out = np.maximum(qa - sa * sa / nn, 0.0)
        else:
            out = sab - sa * sb / nn
        return np.where((n >= 1) & np.isfinite(out), out, np.nan)


def _square_range(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The range of v^2 over v in [lo, hi]."""
    low = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(lo * lo, hi * hi))
    return low, np.maximum(lo * lo, hi * hi)


def _moment_interval(kind: str, n: np.ndarray, sa: np.ndarray, sb: np.ndarray, sab: np.ndarray, qa: np.ndarray | None,
                     qb: np.ndarray | None, h: dict[str, float], ra: float, rb: float, ca: float,
                     cb: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`interval` of the MOMENT_KINDS: the statistic's range over the box of the columns it reads."""
    if kind == ir.REGR_COUNT:
        return n - h["_cnt"], n + h["_cnt"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        n_lo, n_hi = np.maximum(n - h["_cnt"], 1.0), np.maximum(n + h["_cnt"], 1.0)
        if kind in (ir.REGR_AVGX, ir.REGR_AVGY):
            s, hs, c, r = (sb, h["_sumb"], cb, rb) if kind == ir.REGR_AVGX else (sa, h["_sum"], ca, ra)
            m_lo, m_hi = _ratio_range(s - hs, s + hs, n_lo, n_hi)
            return np.clip(c + m_lo, c - r, c + r), np.clip(c + m_hi, c - r, c + r)
        if kind in (ir.REGR_SXX, ir.REGR_SYY):
            s, q, hs, hq = (sb, qb, h["_sumb"], h["_sqb"]) if kind == ir.REGR_SXX else (sa, qa, h["_sum"], h["_sq"])
            assert q is not None
            sq_lo, sq_hi = _square_range(s - hs, s + hs)
            return np.maximum(q - hq - sq_hi / n_lo, 0.0), np.maximum(q + hq - sq_lo / n_hi, 0.0)
        p_lo, p_hi = _product_range(sa - h["_sum"], sa + h["_sum"], sb - h["_sumb"], sb + h["_sumb"])
        d_lo, d_hi = _ratio_range(p_lo, p_hi, n_lo, n_hi)
        return sab - h["_ab"] - d_hi, sab + h["_ab"] - d_lo


def _ratio_range(lo: np.ndarray, hi: np.ndarray, d_lo: np.ndarray, d_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The range of x / d over x in [lo, hi], d in [d_lo, d_hi] with d_lo > 0."""
    c = np.stack([lo / d_lo, lo / d_hi, hi / d_lo, hi / d_hi])
    return c.min(axis=0), c.max(axis=0)


def _product_range(a_lo: np.ndarray, a_hi: np.ndarray, b_lo: np.ndarray, b_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = np.stack([a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi])
    return c.min(axis=0), c.max(axis=0)


def interval(kind: str, n: np.ndarray, sa: np.ndarray, sb: np.ndarray, sab: np.ndarray, qa: np.ndarray | None,
             qb: np.ndarray | None, h: dict[str, float], ra: float, rb: float, ca: float = 0.0,
             cb: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """An interval containing the statistic's range over the box of each released column +- its half-width
    ``h`` (keyed by the column suffixes ``_cnt``, ``_sum``, ``_sumb``, ``_ab``, ``_sq``, ``_sqb``)."""
    n = np.asarray(n, dtype=np.float64)
    if kind in MOMENT_KINDS:
        return _moment_interval(kind, n, sa, sb, sab, qa, qb, h, ra, rb, ca, cb)
    if kind == ir.REGR_R2:  # CORR's interval, squared (all of [0, 1] where the box holds a variance of 0)
        r_lo, r_hi = interval(ir.CORR, n, sa, sb, sab, qa, qb, h, ra, rb)
        return _square_range(r_lo, r_hi)
    lim = _limit(kind, ra, rb)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        n_lo, n_hi = np.maximum(n - h["_cnt"], 1.0), np.maximum(n + h["_cnt"], 1.0)
        ma = _ratio_range(sa - h["_sum"], sa + h["_sum"], n_lo, n_hi)
        mb = _ratio_range(sb - h["_sumb"], sb + h["_sumb"], n_lo, n_hi)
        mab = _ratio_range(sab - h["_ab"], sab + h["_ab"], n_lo, n_hi)
        prod = _product_range(*ma, *mb)
        c_lo, c_hi = mab[0] - prod[1], mab[1] - prod[0]
        if kind == ir.COVAR_SAMP:
            # n / (n - 1) over the box: in [n_hi / (n_hi - 1), n_lo / (n_lo - 1)]; unbounded if n_lo < 2
            f_lo = np.where(n_hi >= 2, n_hi / np.maximum(n_hi - 1.0, 1.0), 1.0)
            f_hi = np.where(n_lo >= 2, n_lo / np.maximum(n_lo - 1.0, 1.0), np.inf)
            c_lo, c_hi = _product_range(c_lo, c_hi, f_lo, f_hi)
            c_lo = np.where(np.isfinite(f_hi), c_lo, -lim)
            c_hi = np.where(np.isfinite(f_hi), c_hi, lim)
        if kind in REGR_KINDS:
            assert qb is not None
            sq_b = _product_range(*mb, *mb)
            vb_lo = np.maximum(qb - h["_sqb"], 0.0) / n_hi - np.maximum(sq_b[1], 0.0)
            vb_hi = np.maximum(qb + h["_sqb"], 0.0) / n_lo - np.maximum(sq_b[0], 0.0)
            ok = vb_lo > 0  # else the box holds a variance of 0: the slope is unbounded
            safe_lo = np.where(ok, vb_lo, 1.0)
            s_lo, s_hi = _ratio_range(c_lo, c_hi, safe_lo, np.where(ok, np.maximum(vb_hi, vb_lo), 1.0))
            if kind == ir.REGR_INTERCEPT:
                ya = np.clip(ca + ma[0], ca - ra, ca + ra), np.clip(ca + ma[1], ca - ra, ca + ra)
                xb = np.clip(cb + mb[0], cb - rb, cb + rb), np.clip(cb + mb[1], cb - rb, cb + rb)
                p_lo, p_hi = _product_range(s_lo, s_hi, *xb)
                s_lo, s_hi = ya[0] - p_hi, ya[1] - p_lo
            return np.where(ok, s_lo, -np.inf), np.where(ok, s_hi, np.inf)
        if kind == ir.CORR:
            assert qa is not None and qb is not None
            sq_a = _product_range(*ma, *ma)  # (Sa / n)^2 over the box, as a product (contains the square's range)
            sq_b = _product_range(*mb, *mb)
            va_lo = np.maximum(qa - h["_sq"], 0.0) / n_hi - np.maximum(sq_a[1], 0.0)
            va_hi = np.maximum(qa + h["_sq"], 0.0) / n_lo - np.maximum(sq_a[0], 0.0)
            vb_lo = np.maximum(qb - h["_sqb"], 0.0) / n_hi - np.maximum(sq_b[1], 0.0)
            vb_hi = np.maximum(qb + h["_sqb"], 0.0) / n_lo - np.maximum(sq_b[0], 0.0)
            ok = (va_lo > 0) & (vb_lo > 0)
            d_lo = np.sqrt(np.where(ok, va_lo * vb_lo, 1.0))
            d_hi = np.sqrt(np.where(ok, np.maximum(va_hi * vb_hi, va_lo * vb_lo), 1.0))
            r_lo, r_hi = _ratio_range(c_lo, c_hi, d_lo, d_hi)
            c_lo, c_hi = np.where(ok, r_lo, -1.0), np.where(ok, r_hi, 1.0)
        return np.clip(c_lo, -lim, lim), np.clip(c_hi, -lim, lim)
