r"""Quantiles, medians, MIN and MAX (docs/mechanisms.md §9): the exponential mechanism over a public grid of the
declared bounds, or, on request, a quantile read from a stored DAWA synopsis.

The quantity
------------
For a column with declared bounds [lo, hi], the candidates are the points of a public grid
x_i = lo + i * s, i = 0..G (the last one capped at hi), with s the column's declared
granularity (1 for integer columns without one; else a power of ten giving 1,000 to 10,000
cells), coarsened tenfold until G <= 100,000. Every kept row's value is clamped to [lo, hi] and
counted at its nearest grid point; h_i is the number of kept rows at x_i,
A_i = sum_{j<i} h_j the rows below x_i and B_i = sum_{j>i} h_j the rows above. The rows at x_i count
below or above it, as fits best: with g(j) = alpha (A_i + j) + beta (B_i + h_i - j) - t for j of them
counted below, the utility is u_i = -dist(0, [g(0), g(h_i)]) (0 where some split makes g vanish; without
it a value held by many rows could never be released: a median held by 2,000 equal values scored -900,
the empty gap above it -100, and was released in the gap whatever epsilon):

* p-quantile (MEDIAN: p = 1/2; PERCENTILE_CONT / QUANTILE ...): alpha = 1 - p, beta = -p, t = 0,
  u_i = -max(0, (1 - p) A_i - p (B_i + h_i), p B_i - (1 - p) (A_i + h_i)), which is 0 exactly where x_i
  is a p-quantile of the kept rows, without needing the private n (with no row at x_i it is
  -|(1 - p) A_i - p B_i|, the form of Smith 2011, "Privacy-preserving statistical estimation with
  optimal convergence rates", used for DP medians since);
* MIN: alpha = 1, beta = 0, t = c, u_i = -max(0, A_i - c, c - A_i - h_i); MAX: alpha = 0, beta = 1,
  t = c, u_i = -max(0, B_i - c, c - B_i - h_i): the c-th smallest (largest) kept value, with
  c = ceil(t) the mechanism's own 95% rank error below (public). A DP release cannot be the
  exact minimum (that is one person's value): u = -A_i alone would be maximal everywhere below
  the minimum and the release uniform over [lo, min]; the target c makes points below the
  c-th value lose utility, so the release sits near the low end of the data, not of the bounds.

Rows are bounded exactly as for other aggregates (``rewrite.bound.bounded_value_histograms``):
an ungrouped query keeps at most L = ``max_rows_per_unit`` rows per person; a GROUP BY over
public keys at most k rows per person and group, in at most C_u groups (and L rows in all).

Privacy claim
-------------
Neighbouring relation: add or remove one privacy unit with all of its rows (user level).
One unit adds or removes at most r = min(k, L) kept rows in a group (r = L ungrouped); each row
changes exactly one of A_i, h_i, B_i by 1, so each end g(0), g(h_i) by at most max(|alpha|, |beta|),
and the distance from 0 to an interval moves by at most the larger move of its ends: |Delta u_i| <=
r * max(1 - p, p) for a quantile and <= r for MIN / MAX: the utility sensitivity Delta. The grid is public, so
the candidate set never depends on the data. Each (group, aggregate) release samples
i with probability proportional to exp(eps' u_i / (2 Delta)) -- the exponential mechanism of
McSherry and Talwar 2007, which is eps'-DP for a utility of sensitivity Delta. One unit touches
at most C = min(C_u, L, number of public groups) groups (C = 1 ungrouped) and the query has m
quantile aggregates, so eps' = eps / (C * m) and the release is eps-DP by basic composition;
the charge is (eps, 0). Groups are the public key domain, all released, so which keys appear
never depends on the data (sparse keys are refused).

Sampling, with its floating-point effects proven and charged (:func:`sample_index`):

1. Exact integer utilities. p is taken on the dyadic grid p = m / 2^20 (m = round(p 2^20), public;
   at most 5e-7 from the p asked), so u_i = -dist(0, [a min(A_i, C) + b min(B_i + h_i, C) - t,
   a min(A_i + h_i, C) + b min(B_i, C) - t]) / s with integers a = 2^20 - m, b = -m, s = 2^20 (MIN:
   a = 1, b = 0, s = 1; MAX: a = 0, b = 1), target t = c s (at most C: a larger c shifts every utility
   alike), and C = 2^40. Saturating the counts at C keeps each one's change per row at most 1 (so Delta is
   unchanged) and every integer below 2^62: the utilities U_i = s u_i are exact int64.
2. Scores d_i = k (U_i - max_j U_j) <= 0 with the public float k <= eps_em / (2 Delta_int),
   Delta_int = s Delta, checked in exact rationals (so the exact mechanism with scale k is
   eps_em-DP). U_i - max U is exact; converting it to a double and multiplying by k rounds twice:
   d_i = d*_i (1 + theta), |theta| <= 2^-52. Weights w_i = exp(d_i), assuming the C library's exp
   within 2^-50 relative (glibc documents < 1 ulp); for d*_i >= -746 (other weights underflow and
   count in the additive term below) the weight is within e^{+-r} of exp(d*_i), r = 2^-42.
   The best weight is exp(0) = 1 exactly.
3. Integer weights W_i = floor(w_i 2^45) (int64; with N <= 100,001 < 2^17 candidates the sum is
   below 2^62), and i is drawn with probability W_i / sum W exactly: an exact uniform integer below
   sum W by rejection on OS-entropy words (acceptance >= 1/2; 16 words per group per round).
4. With probability gamma = 2^-10 (ten exact random bits), the index is instead uniform over the N
   candidates (exact, as in 3). Mixing an eps-DP law with a data-independent one stays eps-DP,
   and it gives every candidate probability >= gamma / N, which turns the additive rounding of 3
   into a relative one.

Then, for every output i and neighbours D, D' (P the exact law with scale k, e^{-eps_em} <= P/P'
<= e^{eps_em}), the implemented law Q = (1 - gamma) W_i / sum W + gamma / N satisfies
Q(D)_i / Q(D')_i <= exp(eps_em + xi) with
    xi(N) = 4r - ln(1 - N e^r / S) - ln(1 - N (1 - gamma) / (gamma S)),  S = 2^45
(W_i / sum W <= P_i e^{2r} / (1 - N e^r / S) and >= P_i e^{-2r} - 1 / S, since sum exp(d*) >= 1).
xi <= 3.9e-6 at N = 100,001 and is public: each release runs at eps_em = eps' - xi(N), so the
charge eps' is exact. The rank statement below is for the mixture (its failure probability
includes gamma). Timing: the work is O(groups x N); the rejection rounds are geometric with
acceptance >= 1/2 per word, 16 words a round (a second round with probability <= 2^-16).

Accuracy (public, shown by explain and in each release): by the exponential mechanism's utility
bound (McSherry and Talwar 2007; Dwork and Roth 2014, Theorem 3.11), with probability >= 1 - beta
the released point's utility is at least OPT - t with t = (2 Delta / eps') ln((G + 1) / beta),
OPT the best candidate's utility, for the exponential mechanism at eps_em; the mixture of step 4
adds gamma to the failure probability, so ``rank_error_95`` uses beta = 0.05 - 2^-10 for it.
For a quantile this is a *rank* statement: the kept rows below
and above the released value (those at it counted on either side) split p : (1 - p) up to t (in units of rows, max(p, 1 - p)
weighted); beta = 0.05 in ``rank_error_95``. No interval in value units can be stated without
the data. The bound is attained: when every kept row of a group holds one value, the candidates on
each side of it share one utility (a median: all of them), and the release misses that value with probability (N − 1)e^{−k·gap}/(1 + …),
the union bound up to its denominator (``tests/test_accuracy_quantile.py``: t shrunk by 10% fails coverage on
such data; on spread data the error's 95th percentile is about t/3.8). The released value is a grid point, rounded to the declared granularity.

From a stored DAWA synopsis (``options={"reuse": "synopsis"}``, the same opt-in as a single
range count, ``dpsql.mechanisms.registry``): on a column with a declared ordered domain, a
quantile 0 < p < 1 of an ungrouped query is read from the synopsis of the same table, column,
WHERE and caps (released histogram, negative bins set to 0 -> CDF -> the first bin where the
CDF reaches p * total, interpolated linearly inside a bin of a continuous domain). That is
post-processing of a released synopsis: no charge, and the ledger row records the reuse. It
estimates the p-quantile of the synopsis's bounded histogram (rows inside the declared domain,
as that synopsis bounded them), which the release states.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from dpsql.budget import Budget, share_of
from dpsql.engine.base import SqlOps
from dpsql.errors import ConfigError, PolicyError
from dpsql.mechanisms.base import Description, MechanismName, Released, Request, fmt_cap, lowered_cap
from dpsql.mechanisms.basic import KEY_DOMAIN_CHECK_LIMIT, _domain_table, _join_keys, domain_size
from dpsql.mechanisms.common import bounding_note, estimated_quantity
from dpsql.noise import NoiseSource, round_to_points
from dpsql.plan import ir
from dpsql.plan.typer import parse_type
from dpsql.plan.workload import Workload, column_workload
from dpsql.rewrite.bound import Caps, ValueGrid, bounded_value_histograms

#: candidates per grid at most (the grid is coarsened tenfold until it fits)
MAX_CELLS = 100_000
#: groups x candidates a release may weigh (memory and time are public: they depend on these only)
MAX_TOTAL_CANDIDATES = 5_000_000
#: the failure probability of the published rank error (uniform mixture included)
BETA = 0.05
#: the probability of the data-independent uniform draw (sampling, step 4)
GAMMA = 2.0**-10
#: fixed-point scale of the integer weights (sampling, step 3)
WEIGHT_SCALE = 2**45
#: relative error of a computed weight (sampling, step 2)
WEIGHT_REL_ERROR = 2.0**-42
#: dyadic grid of the quantile fraction (sampling, step 1)
P_BITS = 20
#: cumulative counts saturate here (sampling, step 1)
COUNT_CAP = 2**40
_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                  "UBIGINT", "UHUGEINT")


#: microseconds in a day: a DATE column's grid steps are whole days
DAY_MICROS = 86_400_000_000
_EPOCH = dt.datetime(1970, 1, 1)


def micros(v: dt.datetime) -> int:
    """Microseconds since 1970-01-01 00:00:00, exactly."""
    return (v - _EPOCH) // dt.timedelta(microseconds=1)


def time_type(plan: ir.QueryPlan, agg: ir.Aggregate) -> str:
    """The type name of a DATE / TIMESTAMP quantile column (``DATE``, ``TIMESTAMP``, ``TIMESTAMP_NS``, ...), else ''."""
    t = parse_type(plan.table.schema.get(agg.column or "", ""))
    return t.name if t.kind in ("date", "timestamp") else ""


def time_grid(plan: ir.QueryPlan, agg: ir.Aggregate, typ: str) -> ValueGrid:
    """The grid of a DATE / TIMESTAMP column: its declared ordered domain's [lo, hi] (both points of
    the grid; analysis checked that a DATE column's are dates) and its bin width as the step (a
    DATE column's rounded up to whole days, a TIMESTAMP column's to whole microseconds), coarsened
    tenfold while the grid has more than MAX_CELLS cells. Computed in integer microseconds, so the
    points (lo + i * step, the last capped at hi) are exact DATEs / TIMESTAMPs."""
    o = plan.table.column(agg.column or "").ordered
    assert o is not None and o.bin_seconds is not None and o.kind != "numeric"
    lo, hi = dt.datetime.fromisoformat(str(o.lo)), dt.datetime.fromisoformat(str(o.hi))
    lo_us, hi_us = micros(lo), micros(hi)
    if typ == "DATE":
        step = max(1, math.ceil(o.bin_seconds * 1e6 / DAY_MICROS - 1e-9)) * DAY_MICROS
    else:
        step = max(1, round(o.bin_seconds * 1e6))
    while -(-(hi_us - lo_us) // step) > MAX_CELLS:
        step *= 10
    cells = -(-(hi_us - lo_us) // step)
    return ValueGrid(agg.column or "", lo_us / 1e6, hi_us / 1e6, step / 1e6, cells, typ, (lo, hi), step)


def time_values(grid: ValueGrid, idx: np.ndarray) -> tuple[np.ndarray, pa.Array]:
    """The released grid points of a DATE / TIMESTAMP grid: (seconds since 1970 as DOUBLE, the Arrow
    array: date32 for a DATE column, timestamp[us] otherwise), from exact integer microseconds."""
    assert grid.time_bounds is not None
    lo_us, hi_us = micros(grid.time_bounds[0]), micros(grid.time_bounds[1])
    us = np.minimum(lo_us + idx.astype(np.int64) * grid.step_micros, hi_us)  # |us| < 2.6e17: exact in int64
    if grid.time_type == "DATE":
        return us / 1e6, pa.array((us // DAY_MICROS).astype(np.int32), type=pa.date32())
    return us / 1e6, pa.array(us, type=pa.timestamp("us"))


def grid_public(grid: ValueGrid) -> dict[str, Any]:
    """lo, hi and step of a grid as explain and the release show them: numbers, or for a DATE /
    TIMESTAMP grid ISO text and the step in days (seconds, microseconds) as text, e.g. '1 day'."""
    if not grid.time_type:
        return {"lo": grid.lo, "hi": grid.hi, "grid_step": grid.step}
    assert grid.time_bounds is not None
    lo, hi = grid.time_bounds
    if grid.time_type == "DATE":
        lo, hi = lo.date(), hi.date()
    n, unit = grid.step_micros, "microsecond"
    for size, name in ((DAY_MICROS, "day"), (1_000_000, "second")):
        if n % size == 0:
            n, unit = n // size, name
            break
    return {"lo": lo.isoformat(), "hi": hi.isoformat(), "grid_step": f"{n} {unit}{'s' if n != 1 else ''}"}


def _step_text(grid: ValueGrid) -> str:
    step = grid_public(grid)["grid_step"]
    return step if isinstance(step, str) else f"{step:g}"


def value_grid(plan: ir.QueryPlan, agg: ir.Aggregate) -> ValueGrid:
    """The public candidate grid of one quantile aggregate (see the module docstring)."""
    typ = time_type(plan, agg)
    if typ:
        return time_grid(plan, agg, typ)
    assert agg.column is not None and agg.bounds is not None
    lo, hi = float(agg.bounds[0]), float(agg.bounds[1])
    width = hi - lo
    if not math.isfinite(width):
        raise ConfigError(
            f"the declared bounds of '{agg.column}' ({agg.bounds[0]:g}, {agg.bounds[1]:g}) are too wide for a quantile's grid",
            hint=f"register '{agg.column}' with narrower bounds",
        )
    base = plan.table.column(agg.column).granularity
    if not base:
        if plan.table.schema.get(agg.column, "").upper() in _INTEGER_TYPES:
            base = 1.0
        else:
            # a width below 1000 times the least double has no such power (width / 1000 underflows to 0):
            # base 0 is refused as too fine below, as a power of ten that underflows is
            tenth = width / 1000.0
            base = 10.0 ** math.floor(math.log10(tenth)) if tenth > 0 else (0.0 if width > 0 else 1.0)
    ratio = width / float(base) if float(base) > 0 else math.inf
    if not math.isfinite(ratio):  # a granularity (or a width) too fine for doubles: no grid can be built
        raise ConfigError(
            f"the granularity of '{agg.column}' is too fine for its declared bounds ({agg.bounds[0]:g}, {agg.bounds[1]:g}) "
            "to build a quantile's grid",
            hint=f"register '{agg.column}' with a coarser granularity (or wider bounds)",
        )
    k = 0
    while ratio / 10.0**k > MAX_CELLS:
        k += 1
    step = float(base) * 10.0**k
    cells = int(math.ceil(width / step - 1e-9)) if width > 0 else 0
    return ValueGrid(agg.column, lo, hi, step, cells)


def integer_coefficients(agg: ir.Aggregate) -> tuple[int, int, int]:
    """(a, b, s): s u_i = -|a A_i + b B_i - s c| in integers (p on the dyadic grid m / 2^20)."""
    if agg.kind == ir.MIN:
        return 1, 0, 1
    if agg.kind == ir.MAX:
        return 0, 1, 1
    m = int(round(float(agg.quantile if agg.quantile is not None else 0.5) * 2**P_BITS))
    return 2**P_BITS - m, -m, 2**P_BITS


def coefficients(agg: ir.Aggregate) -> tuple[float, float, float]:
    """(alpha, beta, weight): u_i = -|alpha A_i + beta B_i - c|, and max(|alpha|, |beta|) (exact dyadic floats)."""
    a, b, s = integer_coefficients(agg)
    return a / s, b / s, max(abs(a), abs(b)) / s


def float_slack(candidates: int) -> float:
    """xi(N) of the module docstring: the most the implemented sampler's log-ratio exceeds eps_em."""
    r, n, big = WEIGHT_REL_ERROR, float(candidates), float(WEIGHT_SCALE)
    return 4 * r - math.log1p(-n * math.exp(r) / big) - math.log1p(-n * (1 - GAMMA) / (GAMMA * big))


def rank_error(delta_u: float, eps_run: float, candidates: int, beta: float = BETA) -> float:
    """t = (2 Delta / eps_em) ln(candidates / (beta - gamma)), eps_em = eps' - xi(candidates):
    P(u(released) < OPT - t) <= beta (the uniform mixture included)."""
    return 2.0 * delta_u / (eps_run - float_slack(candidates)) * math.log(candidates / (beta - GAMMA))


def _distance_to_zero(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """-dist(0, [min(lo, hi), max(lo, hi)]): 0 where the interval holds 0 (1-Lipschitz in lo and hi)."""
    return -np.maximum(np.maximum(np.minimum(lo, hi), -np.maximum(lo, hi)), 0)


def utilities(hist: np.ndarray, alpha: float, beta: float, target: float) -> np.ndarray:
    """u_i = -dist(0, [alpha A_i + beta (B_i + h_i) - target, alpha (A_i + h_i) + beta B_i - target]) for each
    row of ``hist`` (groups x candidates): the rows at x_i counted below or above as fits best."""
    h = np.asarray(hist, dtype=np.float64)
    upto = np.cumsum(h, axis=-1)
    total = h.sum(axis=-1, keepdims=True)
    below, above = upto - h, total - upto
    return _distance_to_zero(alpha * below + beta * (above + h) - target, alpha * upto + beta * above - target)


def integer_utilities(hist: np.ndarray, a: int, b: int, target: int) -> np.ndarray:
    """U_i = -dist(0, [a A + b B' - target, a A' + b B - target]) in int64, with A = min(A_i, C),
    A' = min(A_i + h_i, C), B = min(B_i, C), B' = min(B_i + h_i, C) (step 1 of the module docstring).
    A target above every end (a MIN / MAX rank target c = ceil(rank error), public and unbounded at a tiny epsilon)
    is lowered to the largest end, max(a, 0) C + max(b, 0) C: the utilities then shift by a constant only (the
    same law), and every value stays in int64."""
    target = min(target, (max(a, 0) + max(b, 0)) * COUNT_CAP)
    h = np.minimum(np.rint(np.asarray(hist, dtype=np.float64)), float(COUNT_CAP)).astype(np.int64)
    upto = np.cumsum(h, axis=-1)
    total = h.sum(axis=-1, keepdims=True)
    below, upto_c = np.minimum(upto - h, COUNT_CAP), np.minimum(upto, COUNT_CAP)
    above, from_c = np.minimum(total - upto, COUNT_CAP), np.minimum(total - upto + h, COUNT_CAP)
    return _distance_to_zero(a * below + b * from_c - target, a * upto_c + b * above - target)


def score_scale(eps_em: float, delta_int: int) -> float:
    """The largest double k <= eps_em / (2 delta_int), checked in exact rationals."""
    k = eps_em / (2.0 * delta_int)
    while Fraction(k) * 2 * delta_int > Fraction(eps_em):
        k = math.nextafter(k, 0.0)
    return k


def _uniform_below(totals: np.ndarray, rng: NoiseSource) -> np.ndarray:
    """Exact uniform integers in [0, T) for each T >= 1 of ``totals`` (int64 < 2^63), by rejection
    on OS-entropy words: a word's top e bits with 2^e >= T, kept when below T (probability >= 1/2)."""
    t = np.asarray(totals, dtype=np.int64)
    bits = np.frexp(t.astype(np.float64))[1].astype(np.uint64)  # float(T) < 2^e and T < 2^e
    out = np.zeros(t.shape, dtype=np.int64)
    todo = np.arange(t.size)
    per = 16
    while todo.size:
        w = rng._words(todo.size * per).reshape(todo.size, per)
        cand = (w >> (np.uint64(64) - bits[todo])[:, None]).astype(np.int64)
        ok = cand < t[todo][:, None]
        first = np.argmax(ok, axis=1)
        hit = ok[np.arange(todo.size), first]
        out[todo[hit]] = cand[np.arange(todo.size), first][hit]
        todo = todo[~hit]
    return out


def sample_index(utilities_int: np.ndarray, k: float, rng: NoiseSource) -> np.ndarray:
    """Per row (group), index i with probability (1 - gamma) W_i / sum W + gamma / N, the sampler of
    the module docstring (steps 2-4) for the exact law proportional to exp(k U_i).

    A zero-noise test source (``dpsql.testing.zero_noise``) returns the best candidate (goldens)."""
    u = np.atleast_2d(np.asarray(utilities_int, dtype=np.int64))
    if getattr(rng, "zero_noise", False):
        return np.argmax(u, axis=-1)
    g, n = u.shape
    d = (u - u.max(axis=1, keepdims=True)).astype(np.float64) * k
    weights = np.floor(np.exp(d) * float(WEIGHT_SCALE)).astype(np.int64)
    cum = np.cumsum(weights, axis=1)
    r = _uniform_below(cum[:, -1], rng)
    idx = np.argmax(cum > r[:, None], axis=1)
    mix = (rng._words(g) >> np.uint64(64 - 10)) == 0  # probability exactly 2^-10 = GAMMA
    if mix.any():
        idx[mix] = _uniform_below(np.full(int(mix.sum()), n, dtype=np.int64), rng)
    return idx


@dataclass
class QuantileCalibration:
    """One quantile release, from public metadata and epsilon only."""

    plan: ir.QueryPlan
    unit: str
    caps: Caps
    epsilon: float
    groups_per_unit: float = 1.0
    eps_run: float = 0.0
    grids: list[ValueGrid] = field(default_factory=list)
    sensitivity: list[float] = field(default_factory=list)
    targets: list[float] = field(default_factory=list)
    #: (ledger entry, synopsis, what it estimates) answering from a stored DAWA synopsis
    reuse: tuple[int, str, str] | None = None
    workload: Workload | None = None

    def rank_error(self, j: int) -> float:
        return rank_error(self.sensitivity[j], self.eps_run, self.grids[j].cells + 1)


def _quantile_aggs(plan: ir.QueryPlan) -> list[ir.Aggregate]:
    return [a for a in plan.aggregates if a.kind in ir.QUANTILE_KINDS]


def _min_above_max(aggs: list[ir.Aggregate], numbers: dict[str, np.ndarray], cal: QuantileCalibration, grouped: bool
                   ) -> list[tuple[pa.Array, Callable[[int, int], str | None]]]:
    """Per released row, whether its MIN(col) lies above the MAX(col) of its group (post-processing of
    released values), with the note for the rows the caller is shown (after HAVING, ORDER BY and LIMIT):
    MIN and MAX are the c-th smallest and largest kept values, so with fewer than about 2c kept rows, or
    within their rank errors, they cross; neither is adjusted."""
    notes: list[tuple[pa.Array, Callable[[int, int], str | None]]] = []
    for j, lo in enumerate(aggs):
        for i, hi in enumerate(aggs):
            if lo.kind != ir.MIN or hi.kind != ir.MAX or lo.column != hi.column:
                continue
            a, b = numbers[lo.name], numbers[hi.name]
            # the column's name is SQL text, which may hold braces (x{y}): no str.format over it
            head = f"{lo.sql} came out above {hi.sql}"
            text = (f": they estimate the c-th smallest and the c-th largest "
                    f"kept values (c = {cal.targets[j]:g} and {cal.targets[i]:g}: rank_target), which cross when a group "
                    f"keeps fewer than about {cal.targets[j] + cal.targets[i]:g} rows, and each may miss its rank by up "
                    "to rank_error_95 rows; a larger epsilon lowers c and the rank error (neither value is adjusted)")

            def note(crossed: int, shown: int, head: str = head, text: str = text) -> str | None:
                if not crossed:
                    return None
                return head + (f" in {crossed} of {shown} groups" if grouped else "") + text

            notes.append((pa.array(a > b, type=pa.bool_()), note))
    return notes


class QuantileMechanism:
    """MIN / MAX / MEDIAN / quantiles: the exponential mechanism, or a stored DAWA synopsis."""

    name = MechanismName.EXPONENTIAL
    options = frozenset({"max_rows_per_unit", "max_groups_per_unit", "max_rows_per_group"})

    def calibrate(self, request: Request, contribution: Caps) -> QuantileCalibration:
        plan = request.plan
        assert plan is not None
        aggs = _quantile_aggs(plan)
        assert aggs and len(aggs) == len(plan.aggregates)
        if plan.keys and not plan.public_keys:
            fixes = []
            for k in plan.keys:
                if k.domain is not None:
                    continue
                if isinstance(k.expr, exp.Column):
                    fixes.append(f"register the key column with columns={{'{k.expr.name}': {{'domain': [...]}}}}")
                else:
                    fixes.append(f"the key {k.expr.sql(dialect='duckdb')} is an expression: group by a column with a "
                                 "declared domain instead")
            raise PolicyError(
                "a quantile (MIN, MAX, MEDIAN, PERCENTILE) with GROUP BY needs every key's domain declared: the groups "
                "are then public and all released",
                hint="; ".join(fixes) + ", or drop the GROUP BY",
            )
        cal = QuantileCalibration(plan, request.unit, contribution, request.epsilon)
        if request.options.get("reuse") == "synopsis":
            self._find_synopsis(cal, request, aggs)
            if cal.reuse is None:
                col, name = aggs[0].column or "", plan.table.name
                # a histogram is a fix only where its synopsis could answer: an ungrouped quantile of an ordered column
                # (releasing one for a grouped quantile or a column without bins spends budget and changes nothing)
                if column_workload(plan, col) is not None:
                    where = "WHERE ... " if plan.where is not None else ""
                    first = (f"release the histogram of '{col}' first, with the same WHERE (SELECT {col}, COUNT(*) FROM "
                             f"{name} {where}GROUP BY {col}), or ")
                elif plan.keys:
                    first = "no stored histogram answers a grouped quantile (only an ungrouped one is read from one): "
                else:
                    first = (f"no stored histogram answers quantiles of '{col}' (it has no declared ordered domain, bounds "
                             "and bins): ")
                raise PolicyError(
                    "reuse='synopsis' was asked, but no stored DAWA synopsis covers this quantile (an ungrouped query over a "
                    "column with a declared ordered domain, with a synopsis of the same table, column, other conditions, "
                    "caps and source contents); nothing was charged",
                    hint=first + "omit the reuse option to answer with the exponential mechanism (charged; explain shows the "
                    "cost)",
                )
            return cal
        caps = contribution
        r = caps.rows_per_group_bound
        if math.isinf(r):
            raise PolicyError(
                f"table '{plan.table.name}' has no finite max_rows_per_unit (nor finite max_rows_per_group), so one "
                "person's effect on a quantile is unbounded",
                hint=f"register('{plan.table.name}', ..., max_rows_per_unit=5)",
            )
        groups = domain_size(plan) if plan.keys else 1
        cal.groups_per_unit = float(min(caps.groups_bound, groups)) if plan.keys else 1.0
        cal.eps_run = share_of(request.epsilon, cal.groups_per_unit * len(aggs))
        for a in aggs:
            grid = value_grid(plan, a)
            _, _, weight = coefficients(a)
            cal.grids.append(grid)
            cal.sensitivity.append(r * weight)
        total = groups * sum(g.cells + 1 for g in cal.grids)
        if total > MAX_TOTAL_CANDIDATES:
            raise PolicyError(
                f"this quantile query would weigh {total:,} candidates (groups x grid points), more than "
                f"{MAX_TOTAL_CANDIDATES:,}; nothing was charged",
                hint="declare a coarser granularity for the column, or group by fewer keys",
            )
        for j, a in enumerate(aggs):
            cal.targets.append(float(math.ceil(cal.rank_error(j))) if a.kind in (ir.MIN, ir.MAX) else 0.0)
        # eps_em = eps' - xi(N) must be positive: below the sampler's floating-point allowance the
        # release would run at a negative scale (privacy loss ~|eps_em| + xi, above the charge eps')
        slack = max(float_slack(g.cells + 1) for g in cal.grids)
        if not (cal.eps_run > slack and all(math.isfinite(cal.rank_error(j)) for j in range(len(aggs)))):
            raise ConfigError(
                f"epsilon={request.epsilon:g} is too small for a quantile release: each release gets "
                f"{cal.eps_run:.3g}, at or below the sampler's floating-point allowance {slack:.3g}; nothing was charged",
                hint=f"use an epsilon above {request.epsilon * 2 * slack / cal.eps_run:.3g}, fewer quantiles per query, "
                "or a coarser granularity (fewer grid points)")
        return cal

    @staticmethod
    def _find_synopsis(cal: QuantileCalibration, request: Request, aggs: list[ir.Aggregate]) -> None:
        from dpsql.mechanisms.ranges import Dawa, binning

        if any(a.kind != ir.QUANTILE or a.quantile in (0.0, 1.0) for a in aggs):
            raise PolicyError(
                "reuse='synopsis' reads quantiles 0 < p < 1 (MEDIAN, PERCENTILE_CONT, QUANTILE) from a stored histogram; "
                "MIN and MAX are not read from one (a histogram's noisy extreme bins say little about them)",
                hint="omit the reuse option to answer MIN / MAX with the exponential mechanism (charged)",
            )
        if len({a.column for a in aggs}) != 1:
            raise PolicyError("reuse='synopsis' reads quantiles of one column per query from its stored histogram",
                              hint="ask one query per column")
        typ = time_type(cal.plan, aggs[0])
        if typ:  # no stored histogram answers a date grid's quantile (``column_workload``: numeric domains only)
            raise PolicyError(
                f"reuse='synopsis' reads quantiles of a numeric column from its stored histogram; '{aggs[0].column}' is "
                f"{typ}: its quantiles are answered by the exponential mechanism over its date grid; nothing was charged",
                hint="omit the reuse option (charged; explain shows the cost)",
            )
        wl = column_workload(cal.plan, aggs[0].column or "")
        if wl is None:
            return
        catalog = dict(request.catalog)
        table = wl.table
        cap = lowered_cap(table, request.options, "max_rows_per_unit")
        key = wl.synopsis_key(cap, catalog, binning=binning(wl))
        found = request.find_synopsis(key) if key is not None else None
        col = wl.dims[0].column
        what = (f"the p-quantile of the DAWA histogram of rows inside the declared domain of '{col}', at most "
                f"{fmt_cap(cap)} row(s) per person after the other conditions")
        if found is None:
            other = Dawa._other_rule_key(wl, request, catalog, histogram_rule=True)
            found = request.find_synopsis(other) if other is not None else None
            what = (f"the p-quantile of the DAWA histogram of rows inside the declared domain of '{col}', bounded as a "
                    f"GROUP BY over its bins ({fmt_cap(table.max_rows_per_group)} row(s) per person and bin, "
                    f"{fmt_cap(table.max_groups_per_unit)} bin(s) per person)")
        if found is not None:
            cal.reuse = (found[0], found[1], what)
            cal.workload = wl

    def describe(self, cal: QuantileCalibration) -> Description:
        aggs = _quantile_aggs(cal.plan)
        if cal.reuse is not None:
            return Description(
                label="quantile (reused DAWA synopsis)",
                cost=Budget(0.0, 0.0),
                parameters={"source_entry_id": cal.reuse[0], "estimates": cal.reuse[2],
                            "quantiles": [a.quantile for a in aggs]},
                notes=(f"read from the DAWA synopsis of ledger entry {cal.reuse[0]} (released histogram -> CDF -> "
                       "quantile): post-processing, no budget spent",
                       "estimates " + cal.reuse[2]),
                reuse_of=cal.reuse[0],
            )
        per: list[dict[str, Any]] = []
        by_agg = {a.name: j for j, a in enumerate(aggs)}
        for j, a in enumerate(aggs):
            g = cal.grids[j]
            per.append({"aggregate": a.sql, "kind": a.kind, "p": a.quantile, "column": a.column, **grid_public(g),
                        "candidates": g.cells + 1, "utility_sensitivity": cal.sensitivity[j],
                        "rank_target": cal.targets[j] if a.kind != ir.QUANTILE else None,
                        "rank_error_95": cal.rank_error(j)})
        expected: dict[str, Any] = {}
        for o in cal.plan.outputs:
            if o.source in by_agg:
                j = by_agg[o.source]
                expected[o.name] = {
                    "rank_error_95": cal.rank_error(j), "grid_step": grid_public(cal.grids[j])["grid_step"],
                    "note": (f"a point of a grid of step {_step_text(cal.grids[j])}; with probability 0.95 the rows below/above "
                             f"it split as asked up to {cal.rank_error(j):.4g} rows (relative to the best grid point)"),
                }
        params: dict[str, Any] = {
            "epsilon_per_release": cal.eps_run,
            "groups_per_unit": cal.groups_per_unit,
            "rows_per_group": cal.caps.rows_per_group_bound,
            "aggregates": per,
            "expected_accuracy": expected,
            "max_groups_per_unit": None if math.isinf(cal.caps.max_groups_per_unit) else cal.caps.max_groups_per_unit,
            "max_rows_per_group": None if math.isinf(cal.caps.max_rows_per_group) else cal.caps.max_rows_per_group,
            "max_rows_per_unit": None if math.isinf(cal.caps.max_rows_per_unit) else cal.caps.max_rows_per_unit,
            "estimates": estimated_quantity(cal.caps, grouped=cal.plan.is_grouped)
            + "; values clamped to the declared bounds and counted at the nearest grid point",
        }
        return Description(
            label="exponential",
            cost=Budget(cal.epsilon, 0.0),
            parameters=params,
            notes=(
                "exponential mechanism over a public grid of the declared bounds (pure epsilon-DP, no delta spent); "
                "rank_error_95: with probability 0.95 the rows below/above the released value split as asked up to "
                "that many rows (relative to the best grid point)",
                "MIN / MAX release the c-th smallest / largest kept value (c = rank_target, public): the exact extreme "
                "is one person's value",
                bounding_note(cal.caps, grouped=cal.plan.is_grouped),
            ),
        )

    def bounded(self, cal: QuantileCalibration, salt: str, ops: SqlOps) -> exp.Expression | None:
        if cal.reuse is not None:
            return None
        return bounded_value_histograms(cal.plan, cal.caps, cal.grids, salt=salt, unit_column=cal.unit, ops=ops)

    def released_types(self, cal: QuantileCalibration) -> dict[str, str]:
        if cal.reuse is not None:
            return {a.name: "DOUBLE" for a in cal.plan.aggregates}
        return {a.name: "DOUBLE" if not g.time_type else "DATE" if g.time_type == "DATE" else "TIMESTAMP"
                for a, g in zip(_quantile_aggs(cal.plan), cal.grids, strict=True)}

    def key_domain(self, cal: QuantileCalibration) -> pa.Table | None:
        if not cal.plan.public_keys or domain_size(cal.plan) > KEY_DOMAIN_CHECK_LIMIT:
            return None
        return _domain_table(cal.plan, pa.table({}))

    # -- release ---------------------------------------------------------------------------------
    def release(self, cal: QuantileCalibration, bounded: pa.Table | None, rng: NoiseSource) -> Released:
        if cal.reuse is not None:
            return self._from_synopsis(cal)
        assert bounded is not None
        plan = cal.plan
        aggs = _quantile_aggs(plan)
        keys = [k.name for k in plan.keys]
        if keys:
            dom = _domain_table(plan, bounded)
            n_groups = dom.num_rows
            dom = dom.append_column("__pos", pa.array(np.arange(n_groups, dtype=np.int64)))
            joined = _join_keys(dom, bounded, keys)  # a LEFT JOIN's NULL group matches its NULL key
            joined = joined.filter(pc.is_valid(joined.column("__q")))
            pos = np.asarray(joined.column("__pos").to_numpy(zero_copy_only=False), dtype=np.int64)
            rows = joined
            key_cols = {k: dom.column(k) for k in keys}
        else:
            n_groups = 1
            rows = bounded
            pos = np.zeros(rows.num_rows, dtype=np.int64)
            key_cols = {}
        q = np.asarray(rows.column("__q").to_numpy(zero_copy_only=False), dtype=np.int64)
        b = np.asarray(rows.column("__b").to_numpy(zero_copy_only=False), dtype=np.int64)
        n = np.asarray(rows.column("__n").to_numpy(zero_copy_only=False), dtype=np.float64)
        cols: dict[str, Any] = dict(key_cols)
        numbers: dict[str, np.ndarray] = {}  # the released values as numbers (dates: seconds since 1970)
        accuracy: dict[str, dict[str, Any]] = {}
        for j, a in enumerate(aggs):
            grid = cal.grids[j]
            hist = np.zeros((n_groups, grid.cells + 1), dtype=np.float64)
            sel = q == j
            np.add.at(hist, (pos[sel], np.clip(b[sel], 0, grid.cells)), n[sel])
            ia, ib, scale = integer_coefficients(a)
            u = integer_utilities(hist, ia, ib, int(cal.targets[j]) * scale)
            delta_int = math.ceil(cal.caps.rows_per_group_bound) * max(abs(ia), abs(ib))
            k = score_scale(cal.eps_run - float_slack(grid.cells + 1), delta_int)
            idx = sample_index(u, k, rng)
            gran: Any
            if grid.time_type:
                gran = grid_public(grid)["grid_step"]
                numbers[a.name], cols[a.name] = time_values(grid, idx)
            else:
                vals = np.minimum(grid.lo + idx.astype(np.float64) * grid.step, grid.hi)
                gran = plan.table.column(a.column or "").granularity or grid.step
                numbers[a.name] = vals = np.clip(round_to_points(vals, gran), grid.lo, grid.hi)
                cols[a.name] = pa.array(vals, type=pa.float64())
            accuracy[a.name] = {
                "noise": "exponential",
                "noise_std": None,
                "ci95_half_width": None,
                "rank_error_95": cal.rank_error(j),
                "rank_target": cal.targets[j] if a.kind != ir.QUANTILE else None,
                "p": a.quantile,
                "grid_step": grid_public(grid)["grid_step"],
                "granularity": gran,
                "note": ("exponential mechanism: with probability 0.95 the kept rows below/above the released value split "
                         f"as asked up to {cal.rank_error(j):.3g} rows, relative to the best grid point (a rank, not a "
                         "value interval)"),
            }
        return Released(table=pa.table(cols), accuracy=accuracy,
                        row_notes=_min_above_max(aggs, numbers, cal, bool(cal.plan.keys)))

    def _from_synopsis(self, cal: QuantileCalibration) -> Released:
        from dpsql.mechanisms.ranges import answer, load_synopsis

        assert cal.reuse is not None and cal.workload is not None
        wl = cal.workload
        dim = wl.dims[0]
        # the bins as the histogram released them (running totals rounded): bin by bin, 1.8 rows read as 2 and the
        # CDF drifted above the released one
        est = np.maximum(answer(wl, load_synopsis(cal.reuse[1]), running=True), 0.0)
        cdf = np.cumsum(est)
        total = float(cdf[-1]) if cdf.size else 0.0
        edges = np.asarray(dim.bin_label(list(range(dim.n))), dtype=np.float64)
        width = dim.domain.width
        cols: dict[str, Any] = {}
        accuracy: dict[str, dict[str, Any]] = {}
        for a in cal.plan.aggregates:
            p = float(a.quantile if a.quantile is not None else 0.5)
            if total <= 0:
                cols[a.name] = pa.array([None], type=pa.float64())
            else:
                target = p * total
                i = int(np.searchsorted(cdf, target, side="left"))
                i = min(i, dim.n - 1)
                if dim.integer:
                    v = float(edges[i])
                else:
                    before = float(cdf[i - 1]) if i > 0 else 0.0
                    frac = (target - before) / est[i] if est[i] > 0 else 0.0
                    v = float(edges[i] + width * min(max(frac, 0.0), 1.0))
                gran = cal.plan.table.column(a.column or "").granularity
                if gran:
                    v = float(round_to_points(np.asarray([v]), gran)[0])
                cols[a.name] = pa.array([v], type=pa.float64())
            accuracy[a.name] = {
                "noise": "laplace", "noise_std": None, "ci95_half_width": None, "p": p,
                "estimates": cal.reuse[2],
                "note": "read from a stored DAWA synopsis at zero cost (released histogram -> CDF -> quantile); its "
                        "error is data dependent (DAWA's partition bias plus stage-2 Laplace noise)",
            }
        return Released(table=pa.table(cols), accuracy=accuracy)
