"""Shared pieces of the aggregate mechanisms: calibration record, noising, rounding, AVG.

Noise goes through :mod:`dpsql.noise` only: Laplace releases (delta = 0) through the snapping
mechanism (section 2 of that module: clamp to a public bound B, Laplace, round to the
power-of-two grid Lambda >= lambda, clamp), Gaussian releases through the exact-addition
sampler whose floating-point delta (section 3) calibration adds to the charged delta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql.budget import Budget, binary_at_least, exact
from dpsql.engine.base import SqlOps
from dpsql.errors import ConfigError
from dpsql.mechanisms import covariance, variance
from dpsql.mechanisms.base import Description, Released, fmt_cap
from dpsql.noise import (
    NoiseSource,
    add_exactly,
    check_gaussian_representable,
    gaussian_fp_delta,
    gaussian_release,
    round_exactly,
    round_to_granularity,
    round_to_points,
)
from dpsql.plan import ir
from dpsql.rewrite.bound import (
    Caps,
    ReleasedColumn,
    bounded_query,
    pair_column,
    pair_columns,
    pair_sources,
    pair_swapped,
    released_columns,
    source_column,
)

Z95 = 1.959963984540054  # two-sided 95% normal quantile
LAPLACE95 = math.log(20.0)  # P(|Lap(b)| > b ln 20) = 0.05


@dataclass
class Calibration:
    """Everything a release needs, computed from public metadata and (epsilon, delta) only."""

    mechanism: str
    cost: Budget
    noise: str  # "gaussian" | "laplace"
    caps: Caps
    columns: list[ReleasedColumn]
    scales: dict[str, float]  # released column -> Gaussian std or Laplace scale
    tau: int | None = None
    tau_star: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Laplace (snapping): released column -> (power-of-two grid Lambda, public clamp bound B)
    snap: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: the analysed query and the privacy unit column it is bounded on (set by the mechanism)
    plan: ir.QueryPlan | None = None
    unit: str = ""

    def std(self, col: str) -> float:
        s = self.scales[col]
        return s if self.noise == "gaussian" else math.sqrt(2.0) * s

    def ci95(self, col: str) -> float:
        s = self.scales[col]
        if self.noise == "gaussian":
            return Z95 * s
        grid = self.snap[col][0] if col in self.snap else 0.0
        return LAPLACE95 * s + grid / 2.0


def needed_columns(plan: ir.QueryPlan, caps: Caps) -> list[Any]:
    need = {source_column(a, caps) for a in plan.aggregates}
    need |= {a.name + "_sum" for a in plan.aggregates if a.kind in (ir.AVG, *ir.VARIANCE_KINDS)}
    need |= {a.name + "_cnt" for a in plan.aggregates if a.kind in (ir.AVG, *ir.VARIANCE_KINDS)}
    need |= {a.name + "_sq" for a in plan.aggregates if a.kind in ir.VARIANCE_KINDS}
    need |= {lead + c for lead, reads in pair_sources(plan).values() for c in reads}
    return [c for c in released_columns(plan, caps) if c.name in need]


def column_words(plan: ir.QueryPlan, name: str) -> str:
    """A released column in the query's own words (the aggregates it carries), never its internal
    name (``__a0``, ``__users``): for messages the analyst reads."""
    return columns_words(plan, [name])[name]


def columns_words(plan: ir.QueryPlan, names: list[str]) -> dict[str, str]:
    """:func:`column_words` of each of ``names``: the aggregates are indexed once (looked up by the
    column name and its prefixes before a '_'), not scanned again for each column."""
    index = {a.name: i for i, a in enumerate(plan.aggregates)}
    shared: dict[str, list[str]] = {}  # a pair's columns carry every aggregate of the pair (bound.pair_sources)
    for n, (lead, _) in pair_sources(plan).items():
        if n != lead:
            shared.setdefault(lead, []).append(plan.aggregates[index[n]].sql)
    out: dict[str, str] = {}
    for name in names:
        if name == "__users":
            sqls = [a.sql for a in plan.aggregates if a.kind in (ir.COUNT_UNITS, ir.COUNT_STAR)]
        else:  # the aggregates named ``name`` or a prefix of it followed by '_'
            cut = [name] + [name[:k] for k, ch in enumerate(name) if ch == "_"]
            sqls = [plan.aggregates[i].sql for i in sorted({index[c] for c in cut if c in index})]
            sqls += [q for c in cut for q in shared.get(c, ())]
        out[name] = ", ".join(dict.fromkeys(sqls)) if sqls else "the count of people per group"
    return out


def default_granularity(scale: float) -> float:
    """Rounding grid for a released noisy sum: a power of ten at most a tenth of the noise scale.

    Data-independent (depends only on the calibrated scale), and fine enough that rounding
    adds nothing noticeable to the error, while removing the float sample bits.
    """
    if not math.isfinite(scale) or scale <= 0:
        return 1.0
    return float(10.0 ** math.floor(math.log10(scale / 10.0)))


def granularity_for(cal: Calibration, col: ReleasedColumn, plan: ir.QueryPlan) -> float:
    return column_granularity(col, plan, cal.scales[col.name])


def declared_granularity(plan: ir.QueryPlan, agg: ir.Aggregate) -> float | None:
    """The declared granularity of the values ``agg`` reads: of its column, or of the one column whose value
    or NULL its argument is (``CASE WHEN c THEN x END``, the form of ``AGG(x) FILTER (WHERE c)``), whose
    sums stay on that column's grid. None when no such column declares one (public: the plan and catalog)."""
    column = agg.column
    if column is None and agg.value is not None:
        column = _sole_column(agg.value)
    return plan.table.column(column).granularity if column else None


def _sole_column(value: exp.Expression) -> str | None:
    """The column every non-NULL result of ``value`` is (a CASE whose results are that column or NULL)."""
    if isinstance(value, exp.Paren):
        return _sole_column(value.this)
    if isinstance(value, exp.Column) and not value.table:
        return value.name
    if isinstance(value, exp.Case) and value.this is None:
        results = [i.args.get("true") for i in value.args.get("ifs") or []]
        default = value.args.get("default")
        names = {_sole_column(r) for r in results if not isinstance(r, exp.Null)}
        if default is not None and not isinstance(default, exp.Null):
            names.add(_sole_column(default))
        if len(names) == 1 and None not in names:
            return names.pop()
    return None


def column_granularity(col: ReleasedColumn, plan: ir.QueryPlan, scale: float) -> float:
    """The rounding grid of a released column (public: declared, or from the noise scale)."""
    if col.kind in ("users", "count"):
        return 1.0
    base = col.name.removesuffix("_sum")
    try:
        agg = plan.aggregate_by_name(base)
    except KeyError:
        agg = None
    if agg is not None:
        g = declared_granularity(plan, agg)
        if g:
            return g
    return default_granularity(scale)


def gaussian_fp_charge(
    plan: ir.QueryPlan,
    columns: list[ReleasedColumn],
    scales: dict[str, float],
    *,
    epsilon: float,
    groups_per_unit: float,
    threshold_column: str | None = None,
) -> float:
    """(1 + e^eps) * sum of the per-coordinate floating-point deltas over the coordinates one
    unit can change (``groups_per_unit`` groups, every column): :mod:`dpsql.noise` section 3.

    Also refuses (ConfigError, before any charge) noise that cannot be represented.
    """
    per_group = 0.0
    words = columns_words(plan, [c.name for c in columns])
    for c in columns:
        sigma = scales[c.name]
        gran = column_granularity(c, plan, sigma)
        integer = is_integer_column(c)
        check_gaussian_representable(sigma, gran, integer=integer, what=words[c.name])
        per_group += gaussian_fp_delta(sigma, gran, integer=integer, threshold=c.name == threshold_column)
    return (1.0 + math.exp(min(epsilon, 700.0))) * groups_per_unit * per_group


def charged_delta(delta: float, fp: float) -> float:
    """The delta a Gaussian release is charged: the calibrated ``delta`` plus the sampler's floating-point
    part ``fp`` (the larger of its binary value and its decimal, the ``fp_delta`` shown), added exactly and
    rounded up to a float. The router records the delta asked for plus this excess over the calibrated
    delta (``dpsql.budget.recorded``), so the recorded charge is never below what the release spends, nor
    below the delta asked for plus the ``fp_delta`` shown. A sum that reaches 1 is refused in terms of what
    was asked."""
    total = Fraction(delta) + max(Fraction(fp), exact(fp))
    if total >= 1:
        raise ConfigError(
            f"delta={delta!r} plus the Gaussian sampler's floating-point delta {fp:.3g} (fp_delta) reaches 1: "
            "no privacy is left to claim",
            hint="use a small delta such as 1e-6 (well below 1/number_of_people), or 0 for pure DP",
        )
    return binary_at_least(total)


def fp_delta_refusal(fp: float, *, epsilon: float, delta: float, laplace: bool) -> ConfigError:
    """The refusal when the floating-point part of the Gaussian noise's delta (``gaussian_fp_charge``)
    exceeds the request. That part grows like e^epsilon, so past epsilon of about 10 a larger epsilon
    makes it worse: the hint then says to lower epsilon (or, where the query can be answered with
    Laplace noise, ``laplace``, to pass delta=0) rather than to raise it."""
    what = f"the floating-point delta of the Gaussian noise ({fp:.3g}) exceeds the requested delta={delta:g}"
    if epsilon >= 10:
        alt = (", or delta=0 (Laplace noise, pure DP)" if laplace else "") + \
            ", or lower the table's max_groups_per_unit (the part grows with it)"
        return ConfigError(f"{what}: this part grows like e^epsilon, so epsilon={epsilon:g} is too large for Gaussian noise",
                           hint=f"use a smaller epsilon (below 10 usually fits){alt}")
    return ConfigError(what, hint="use a larger delta or epsilon, declare a coarser granularity for the column, or lower "
                                  "the table's max_groups_per_unit (the part grows with it)")


def is_integer_column(col: ReleasedColumn) -> bool:
    """Counts (distinct units, rows) are integers and released as int64."""
    return col.kind in ("users", "count")


def exact_totals(values: pa.Array | pa.ChunkedArray, scale: int) -> list[tuple[int, int]]:
    """An exact sum column of the bounded result (``ReleasedColumn.scale``: integer totals as text,
    NULL where a public key has no row: 0) as (n, scale) pairs, value n * 2^-scale."""
    return [(int(t) if t is not None else 0, scale) for t in values.to_pylist()]


def add_noise(values: pa.Array | pa.ChunkedArray, col: ReleasedColumn, cal: Calibration, rng: NoiseSource) -> np.ndarray:
    """Noisy values of one released column of the bounded result (NULL: 0), by the calibrated mechanism
    (see the module docstring). An exact sum (``col.scale``) gets its Gaussian noise added to the exact
    total with one rounding (``dpsql.noise.add_exactly``: no rounding of the total before the noise,
    whose ulp is not public), or enters the snapping mechanism as its correctly rounded double."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.float64)
    scale = cal.scales[col.name]
    if col.scale is not None:
        exact = exact_totals(values, col.scale)
        if cal.noise == "gaussian":
            return add_exactly(exact, rng.gaussian_noise(scale, len(exact)))
        v = round_exactly(exact)
    else:
        v = np.nan_to_num(np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64), nan=0.0)
        if cal.noise == "gaussian":
            return gaussian_release(v, rng.gaussian_noise(scale, v.size), integer=is_integer_column(col))
    grid, bound = cal.snap[col.name]
    return rng.snap_laplace(v, scale, grid, bound)


def finish_release(
    plan: ir.QueryPlan,
    cal: Calibration,
    keys: dict[str, pa.Array],
    noisy: dict[str, np.ndarray],
    commit: dict[str, Any] | None = None,
) -> Released:
    """Round noisy columns, derive AVGs, and build the released internal table + accuracy.

    The returned table has the key columns and one column per aggregate (``__aN``), all of
    them post-processed noisy values. Accuracy is keyed by internal aggregate name; an AVG's
    per-row interval goes to ``row_accuracy``.
    """
    row_accuracy: dict[str, pa.Array] = {}
    row_noise_std: dict[str, pa.Array] = {}
    cols: dict[str, Any] = dict(keys)
    rounded: dict[str, np.ndarray] = {}
    gran: dict[str, float] = {}
    for c in cal.columns:
        if c.name not in noisy:
            continue
        g = granularity_for(cal, c, plan)
        gran[c.name] = g
        rounded[c.name] = round_to_granularity(noisy[c.name], g)
    accuracy: dict[str, dict[str, Any]] = {}
    pairs, swapped = pair_sources(plan), pair_swapped(plan)
    for a in plan.aggregates:
        src = source_column(a, cal.caps)
        if a.kind in ir.VARIANCE_KINDS:
            _finish_variance(plan, cal, a, rounded, gran, cols, row_accuracy, accuracy)
            continue
        if a.kind in ir.PAIR_KINDS:
            _finish_pair(cal, a, pairs[a.name][0], a.name in swapped, rounded, gran, cols, row_accuracy, accuracy)
            continue
        if a.kind == ir.AVG:
            assert a.bounds is not None
            lo, hi = a.bounds
            mid = (lo + hi) / 2.0
            s = rounded[a.name + "_sum"]
            n = rounded[a.name + "_cnt"]
            with np.errstate(divide="ignore", invalid="ignore"):
                avg = np.where(n >= 1, mid + s / np.maximum(n, 1), np.nan)
            avg = np.clip(avg, lo, hi)
            # a power of ten at most a thousandth of the width (default_granularity of a hundredth), or the
            # column's declared granularity if finer: the declared grid is that of the values and their
            # sums, not of their mean (the mean of whole ages is not a whole number; rounding it there lost
            # up to half a year, the same way on every run)
            g = default_granularity((hi - lo) / 100.0)
            declared = declared_granularity(plan, a)
            if declared:
                g = min(g, declared)
            if g > 0:
                avg = round_to_points(avg, g)  # post-processing: its decimal grid at every magnitude
            else:  # bounds so narrow (width below ~1e-306) that their power of ten underflows: no grid, no rounding
                g = 0.0
            mask = np.isnan(avg)
            cols[a.name] = pa.array(np.where(mask, 0.0, avg), mask=mask, type=pa.float64())
            # delta-method interval around the bounded truth, from released values only: the 95% quantile of
            # the linearised noise (Laplace: ln 20 / sqrt 2 per std bounds any mix of two independent Laplace
            # draws) plus the rounding of the released sum and count (snapping grid and granularity, halved)
            with np.errstate(divide="ignore", invalid="ignore"):
                ss = cal.std(a.name + "_sum")
                sn = cal.std(a.name + "_cnt")
                nn = np.maximum(n, 1)
                std_row = np.sqrt((ss / nn) ** 2 + ((s / nn) * (sn / nn)) ** 2)
                rs, rn = ((gran[a.name + c] + cal.snap.get(a.name + c, (0.0, 0.0))[0]) / 2 for c in ("_sum", "_cnt"))
                half = (Z95 if cal.noise == "gaussian" else LAPLACE95 / math.sqrt(2.0)) * std_row
                half = half + rs / nn + np.abs(s / nn) * rn / nn + g / 2
            # a row released NULL (its noisy count below 1) has no interval, as VARIANCE's and CORR's have none: the
            # width was read from its noisy sum, which the release does not otherwise show
            std_row, half = np.where(mask, np.nan, std_row), np.where(mask, np.nan, half)
            # per-row half-widths travel with the rows (hidden column) through HAVING/ORDER/LIMIT
            row_accuracy[a.name] = pa.array(half, type=pa.float64())
            row_noise_std[a.name] = pa.array(std_row, type=pa.float64())  # travels too: the summary's median
            finite = np.isfinite(std_row)
            typical = float(np.median(std_row[finite])) if finite.any() else None
            accuracy[a.name] = {
                # representative values (median over the released rows); per row below
                "noise_std": typical,
                "ci95_half_width": float(np.median(half[finite])) if typical is not None else None,
                "per_row_ci95_half_width": half.tolist(),
                "granularity": g,
                "note": "AVG = midpoint + noisy centred sum / noisy count (post-processing); approximate interval by the "
                "delta method, per row in per_row_noise_std and per_row_ci95_half_width (noise_std / ci95_half_width: median over rows)",
            }
            continue
        vals = rounded[src]
        typ = pa.int64() if gran[src] == 1.0 and a.kind != ir.SUM else pa.float64()
        if typ == pa.int64():
            cols[a.name] = pa.array(vals.astype(np.int64), type=typ)
        else:
            cols[a.name] = pa.array(vals, type=typ)
        accuracy[a.name] = {
            "noise_std": cal.std(src),
            "ci95_half_width": cal.ci95(src) + gran[src] / 2.0,
            "granularity": gran[src],
            "noise": cal.noise,
        }
        if src in cal.snap:
            grid, bound = cal.snap[src]
            accuracy[a.name]["snapping_grid"] = grid
            accuracy[a.name]["snapping_bound"] = bound
            if np.any(np.abs(np.asarray(noisy[src], dtype=np.float64)) >= bound):
                # a released value at the public bound: the true value may lie beyond it, so the
                # interval above does not cover it (post-processing of released values only)
                accuracy[a.name]["clamped_at_bound"] = True
                accuracy[a.name]["note"] = (
                    f"some values were released at the public snapping bound +/-{bound:g}: the true value may be larger in "
                    "magnitude, outside the interval"
                )
    return Released(table=pa.table(cols) if cols else pa.table({}), accuracy=accuracy, row_accuracy=row_accuracy,
                    row_noise_std=row_noise_std, commit=commit or {})


def third_half_width(cal: Calibration, col: str, gran: float) -> float:
    """A two-sided 1 - 0.05/3 noise half-width of one released column (``dpsql.mechanisms.variance``)."""
    scale = cal.scales[col]
    if cal.noise == "gaussian":
        return variance.Z_THIRD * scale + gran / 2.0
    grid = cal.snap[col][0] if col in cal.snap else 0.0
    return variance.LAPLACE_THIRD * scale + grid / 2.0 + gran / 2.0


def share_half_width(cal: Calibration, col: str, gran: float, m: int) -> float:
    """A two-sided 1 - 0.05/m noise half-width of one released column (``dpsql.mechanisms.covariance``)."""
    scale = cal.scales[col]
    if cal.noise == "gaussian":
        return covariance.z_share(m) * scale + gran / 2.0
    grid = cal.snap[col][0] if col in cal.snap else 0.0
    return covariance.laplace_share(m) * scale + grid / 2.0 + gran / 2.0


def _finish_pair(cal: Calibration, a: ir.Aggregate, lead: str, swapped: bool, rounded: dict[str, np.ndarray], gran: dict[str, float],
                 cols: dict[str, Any], row_accuracy: dict[str, pa.Array], accuracy: dict[str, dict[str, Any]]) -> None:
    """COVAR_POP / COVAR_SAMP / CORR / REGR_* from the released count and centred sums of the pair, released under
    the name ``lead`` of its first aggregate (``bound.pair_sources``; post-processing). Its interval is the
    statistic's range over the box of the m columns it reads (union bound over those m)."""
    assert a.bounds is not None and a.second is not None and a.second.bounds is not None
    ra, rb = (a.bounds[1] - a.bounds[0]) / 2.0, (a.second.bounds[1] - a.second.bounds[0]) / 2.0
    names = pair_columns(a.kind)
    col = {c: lead + pair_column(c, swapped) for c in names}  # the pair's column read as each suffix
    v = {c: rounded[col[c]] for c in names}
    h = {c: share_half_width(cal, col[c], gran[col[c]], len(names)) for c in names}
    unread = np.zeros_like(v["_cnt"])  # a sum this aggregate does not read (nor its statistic)
    args = (v["_cnt"], v.get("_sum", unread), v.get("_sumb", unread), v.get("_ab", unread), v.get("_sq"), v.get("_sqb"))
    ca, cb = (a.bounds[0] + a.bounds[1]) / 2.0, (a.second.bounds[0] + a.second.bounds[1]) / 2.0
    val = covariance.point(a.kind, *args, ra, rb, ca, cb)
    lo, hi = covariance.interval(a.kind, *args, h, ra, rb, ca, cb)
    mask = np.isnan(val)
    if a.kind == ir.REGR_COUNT:  # the rounded noisy count, an integer as COUNT's
        cols[a.name] = pa.array(np.where(mask, 0.0, val).astype(np.int64), mask=mask, type=pa.int64())
    else:
        cols[a.name] = pa.array(np.where(mask, 0.0, val), mask=mask, type=pa.float64())
    half = np.where(mask, np.nan, np.maximum(hi - np.where(mask, 0.0, val), np.where(mask, 0.0, val) - lo))
    row_accuracy[a.name] = pa.array(half, type=pa.float64())
    finite = half[np.isfinite(half)]
    if a.kind == ir.REGR_COUNT:
        accuracy[a.name] = {"noise_std": cal.std(lead + "_cnt"), "ci95_half_width": float(h["_cnt"]),
                            "granularity": gran[lead + "_cnt"], "noise": cal.noise,
                            "note": "the noisy count of the pairs where both arguments are not NULL (as COUNT's: an "
                                    "integer, possibly below 0)"}
        return
    accuracy[a.name] = {
        "ci95_half_width": float(np.median(finite)) if finite.size else None,
        "per_row_ci95_half_width": half.tolist(),
        "noise": cal.noise,
        "note": ("from noisy count and centred sums of the clamped pairs (" + ", ".join(names) + "; post-processing); "
                 "NULL where the count is too small" + (" or a noisy variance is not positive" if a.kind in (ir.CORR, ir.REGR_R2, *covariance.REGR_KINDS) else "")
                 + "; the interval contains the statistic's range over the columns' joint 95% noise box (union bound: "
                 "covers the bounded truth with probability >= 95%), as the largest distance from the released value to "
                 "either end, per row in per_row_ci95_half_width (ci95_half_width: median over rows)"),
    }


def _finish_variance(plan: ir.QueryPlan, cal: Calibration, a: ir.Aggregate, rounded: dict[str, np.ndarray],
                     gran: dict[str, float], cols: dict[str, Any], row_accuracy: dict[str, pa.Array],
                     accuracy: dict[str, dict[str, Any]]) -> None:
    """VARIANCE / STDDEV from the released count, centred sum and sum of squares (post-processing)."""
    assert a.bounds is not None
    r = (a.bounds[1] - a.bounds[0]) / 2.0
    n, s, q = rounded[a.name + "_cnt"], rounded[a.name + "_sum"], rounded[a.name + "_sq"]
    hn, hs, hq = (third_half_width(cal, a.name + c, gran[a.name + c]) for c in ("_cnt", "_sum", "_sq"))
    val = variance.point(a.kind, n, s, q, r)
    lo, hi = variance.interval(a.kind, n, s, q, hn, hs, hq, r)
    mask = np.isnan(val)
    cols[a.name] = pa.array(np.where(mask, 0.0, val), mask=mask, type=pa.float64())
    half = np.where(mask, np.nan, np.maximum(hi - np.where(mask, 0.0, val), np.where(mask, 0.0, val) - lo))
    row_accuracy[a.name] = pa.array(half, type=pa.float64())
    finite = half[np.isfinite(half)]
    typical = float(np.median(finite)) if finite.size else None
    accuracy[a.name] = {
        "ci95_half_width": typical,
        "per_row_ci95_half_width": half.tolist(),
        "noise": cal.noise,
        "note": ("from noisy count, centred sum and sum of squares of the clamped values (post-processing); the "
                 "interval is the statistic's range over the three columns' joint 95% noise box (union bound: "
                 "covers the bounded truth with probability >= 95%), as the largest distance from the released value to either end, "
                 "per row in per_row_ci95_half_width (ci95_half_width: median over rows)"),
    }


def aggregate_types(plan: ir.QueryPlan) -> dict[str, str]:
    """The SQL type of each released aggregate: counts are integers, the rest DOUBLE."""
    return {
        a.name: "BIGINT" if a.kind in (ir.COUNT_STAR, ir.COUNT_COL, ir.COUNT_UNITS, ir.COUNT_DISTINCT, ir.REGR_COUNT)
        else "DOUBLE"
        for a in plan.aggregates
    }


def ledger_parameters(cal: Calibration) -> dict[str, Any]:
    """The parameters recorded in the ledger and shown by explain (one source for both)."""
    p: dict[str, Any] = dict(cal.params)
    if cal.plan is not None:
        p["expected_accuracy"] = expected_accuracy(cal)
    p["noise"] = cal.noise
    # an unlimited cap is recorded as null (JSON has no infinity)
    p["max_groups_per_unit"] = None if math.isinf(cal.caps.max_groups_per_unit) else cal.caps.max_groups_per_unit
    p["max_rows_per_group"] = None if math.isinf(cal.caps.max_rows_per_group) else cal.caps.max_rows_per_group
    p["max_rows_per_unit"] = None if math.isinf(cal.caps.max_rows_per_unit) else cal.caps.max_rows_per_unit
    if cal.plan is not None:
        p["estimates"] = estimated_quantity(cal.caps, grouped=cal.plan.is_grouped)
    if cal.tau is not None:
        p["tau"] = cal.tau
    if cal.tau_star is not None:
        p["tau_star"] = cal.tau_star
    return p


def bounding_note(caps: Caps, grouped: bool = True) -> str:
    return (
        "bounding: " + estimated_quantity(caps, grouped=grouped) + "; how many rows it drops is not reported because "
        "that would depend on the data; `dpsql tables` shows the caps, options can lower them, the data owner sets them"
    )


def expected_accuracy(cal: Calibration) -> dict[str, dict[str, Any]]:
    """Per output column of the query: the noise std and 95% half-width its release will have
    (from the calibration only: public). AVG's interval depends on the released count."""
    plan = cal.plan
    assert plan is not None
    by_name = {c.name: c for c in cal.columns}
    out: dict[str, dict[str, Any]] = {}
    pairs, swapped = pair_sources(plan), pair_swapped(plan)
    for o in plan.outputs:
        try:
            a = plan.aggregate_by_name(o.source or "")
        except KeyError:
            continue
        if a.kind == ir.AVG:
            out[o.name] = {"note": "midpoint + noisy sum / noisy count: the interval depends on the released count"}
            continue
        if a.kind in ir.VARIANCE_KINDS:
            out[o.name] = {"note": "from noisy count, centred sum and sum of squares (each noise_std in parameters.scales): "
                           "the interval depends on the released count", "column_noise_std": {
                               c: cal.std(a.name + c) for c in ("_cnt", "_sum", "_sq")}}
            continue
        if a.kind == ir.REGR_COUNT:  # the pair's noisy count itself, as a COUNT's
            src = pairs[a.name][0] + "_cnt"
            gran = granularity_for(cal, by_name[src], plan)
            out[o.name] = {"noise_std": cal.std(src), "ci95_half_width": cal.ci95(src) + gran / 2.0}
            continue
        if a.kind in ir.PAIR_KINDS:
            out[o.name] = {"note": "from noisy count and centred sums (each noise_std in parameters.scales): the "
                           "interval depends on the released values", "column_noise_std": {
                               c: cal.std(pairs[a.name][0] + pair_column(c, a.name in swapped))
                               for c in pair_columns(a.kind)}}
            continue
        src = source_column(a, cal.caps)
        gran = granularity_for(cal, by_name[src], plan)
        out[o.name] = {"noise_std": cal.std(src), "ci95_half_width": cal.ci95(src) + gran / 2.0}
    return out


def estimated_quantity(caps: Caps, *, grouped: bool) -> str:
    """What the released aggregates estimate, in words: the bounded truth (public: from the caps)."""
    if not grouped:
        return (f"aggregates over at most {fmt_cap(caps.max_rows_per_group)} row(s) per person after the WHERE "
                "(rows beyond are dropped at random, so totals can be below the raw table's)")
    per_unit = f", {fmt_cap(caps.max_rows_per_unit)} row(s) in all" if caps.unit_rows_finite else ""
    return (f"aggregates over at most {fmt_cap(caps.max_rows_per_group)} row(s) per person in each group and "
            f"{fmt_cap(caps.max_groups_per_unit)} group(s) per person{per_unit} (rows beyond are dropped at random)")


class BoundedAggregates:
    """What the basic and the sparse-histogram mechanisms share: the bounded aggregates of
    ``rewrite.bound.bounded_query``, their types, and one description for explain and the ledger."""

    def describe(self, cal: Calibration) -> Description:
        grouped = bool(cal.plan and cal.plan.is_grouped)
        return Description(label=cal.mechanism, cost=cal.cost, parameters=ledger_parameters(cal),
                           notes=(*cal.notes, bounding_note(cal.caps, grouped=grouped)))

    def bounded(self, cal: Calibration, salt: str, ops: SqlOps) -> exp.Expression:
        assert cal.plan is not None
        return bounded_query(cal.plan, cal.caps, salt=salt, tau=cal.tau, unit_column=cal.unit, ops=ops)

    def released_types(self, cal: Calibration) -> dict[str, str]:
        assert cal.plan is not None
        return aggregate_types(cal.plan)
