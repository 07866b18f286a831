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
(docs/mechanisms.md section 2; stage 1 with the safe calibration of section 2.4). The released synopsis
(partition + bucket totals, rounded to integers) is stored with its ledger entry; later range
counts and coarser histograms over the same table, column(s), base conditions and cap are
computed from it alone: post-processing, zero cost.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql.budget import Budget
from dpsql.catalog import TableSpec
from dpsql.engine.base import SqlOps
from dpsql.errors import ConfigError, PolicyError
from dpsql.mechanisms.base import Description, MechanismName, Released, Request, fmt_cap, lowered_cap
from dpsql.mechanisms.common import estimated_quantity
from dpsql.noise import NoiseSource
from dpsql.plan import ir
from dpsql.plan.analyze import resolve_unit_column
from dpsql.plan.workload import Workload
from dpsql.rewrite import bound as _bound
from dpsql.rewrite.bound import Caps, bounded_histogram


def bin_ranges(wl: Workload) -> np.ndarray:
    """The workload's inclusive bin ranges as an (m, 2 * dims) integer array, in the bins DAWA runs
    over (a histogram restricted by its WHERE: its kept bins, numbered from the first; a range's first and
    last bin of the declared domain become its first and last kept bin)."""
    r = np.asarray(wl.ranges, dtype=np.int64).reshape(len(wl.ranges), 2 * len(wl.dims))
    if wl.span is not None:
        return _in_kept(r, wl.span)
    if wl.axes is not None:  # a 2-D workload restricted on one or both columns: each pair of ends on its own
        return np.concatenate([r[:, 2 * k : 2 * k + 2] if runs is None else _in_kept(r[:, 2 * k : 2 * k + 2], runs)
                               for k, runs in enumerate(wl.axes)], axis=1)
    return r


def _in_kept(r: np.ndarray, runs: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Inclusive (first, last) bins of the declared domain as positions among the kept bins ``runs``."""
    starts, ends = (np.asarray(v, dtype=np.int64) for v in zip(*runs))
    before = np.concatenate([[0], np.cumsum(ends - starts + 1)])  # kept bins before each run

    def kept_upto(x: np.ndarray) -> np.ndarray:  # kept bins <= x
        j = np.searchsorted(starts, x, side="right") - 1
        k = np.maximum(j, 0)
        return np.where(j < 0, 0, before[k] + np.minimum(ends[k], x) - starts[k] + 1)

    return np.stack([kept_upto(r[:, 0] - 1), kept_upto(r[:, 1]) - 1], axis=1)


def _kept_bins(runs: tuple[tuple[int, int], ...] | None, n: int) -> np.ndarray:
    return np.arange(n) if runs is None else np.concatenate([np.arange(a, b + 1) for a, b in runs])


def binning(wl: Workload) -> list[Any]:
    """How each dimension's values fall into its bins in the bounded histogram (``rewrite.bound.bounded_histogram``),
    named in the synopsis key (``Workload.synopsis_key``): exactly at the column's decimal scale, in doubles with
    the edge tolerance, or (dates and times) in whole microseconds. The same on DuckDB and Spark (both bin an
    integer or DECIMAL column exactly: ``bound.exact_scale``)."""
    out: list[Any] = []
    for d in wl.dims:
        scale = _bound.exact_scale(d, "duckdb")
        out.append(["exact", scale] if scale is not None else ["double", _bound._BIN_EDGE_TOLERANCE]
                   if d.domain.kind == "numeric" else ["micros"])
    return out


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
    if wl.span is not None:  # the bins the WHERE's own literals exclude hold no row that passes it
        return np.concatenate([x[a : b + 1] for a, b in wl.span])
    if wl.axes is not None:
        return x[np.ix_(*[_kept_bins(runs, d.n) for runs, d in zip(wl.axes, wl.dims)])]
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

    n = wl.size
    try:
        _dawa.dawa_precheck(n, epsilon, ratio=split, sensitivity=cap)
    except ConfigError as e:
        if 0.0 < split < 1.0 and split != 0.25:  # the split may be the problem, not epsilon: name both shares
            e.message += (f" (epsilon_split={split!r} gives the partition epsilon1 = {split * epsilon:.3g} and the "
                          f"measurement epsilon2 = {(1 - split) * epsilon:.3g})")
            e.hint = f"{e.hint}; or an epsilon_split nearer 0.25 (the default)" if e.hint else \
                "use an epsilon_split nearer 0.25 (the default)"
            e.args = (e._render(),)
        raise


def synopsis_epsilon(text: str) -> float | None:
    """The epsilon a stored synopsis was made at (a released parameter of its run), None if it does not say (text
    that is no JSON is refused where the synopsis is loaded, with dpsql's words)."""
    try:
        d = json.loads(text)
    except ValueError:
        return None
    d = d.get("flat", d) if isinstance(d, dict) else {}
    e = d.get("epsilon") if isinstance(d, dict) else None
    return float(e) if isinstance(e, (int, float)) and not isinstance(e, bool) else None


def load_synopsis(text: str) -> Any:
    from dpsql.mechanisms import dawa as _dawa

    kind = json.loads(text).get("kind", "")
    if "2d" in kind:
        return _dawa.DawaSynopsis2D.from_json(text)
    return _dawa.DawaSynopsis.from_json(text)


def _consecutive_bins(wl: Workload, r: np.ndarray, valid: np.ndarray) -> bool:
    return wl.histogram and len(wl.dims) == 1 and bool(np.all(valid)) and bool(np.all(r[1:, 0] == r[:-1, 1] + 1))


def answer(wl: Workload, syn: Any, *, running: bool = False) -> np.ndarray:
    """Answers to the workload's ranges from a (rounded) synopsis: post-processing. ``running``: the ranges are
    the bins in order (a quantile's CDF), rounded by their running totals as a released histogram's are."""
    r = bin_ranges(wl)
    valid: np.ndarray = np.all(np.asarray(r[:, 0::2] <= r[:, 1::2], dtype=bool), axis=1).astype(bool)
    safe = np.where(valid[:, None], r, 0)
    if len(wl.dims) == 1:
        out = np.asarray(syn.answer_ranges(safe), dtype=np.float64)
    else:
        out = np.asarray(syn.answer_rects(safe[:, [0, 1, 2, 3]]), dtype=np.float64)
    out = np.where(valid, out, 0.0)
    if running or _consecutive_bins(wl, r, valid):
        # consecutive bins: round the running totals, each bin the difference of two, so a sum of
        # released bins stays within 1 of the estimate (bins of one bucket share one fraction,
        # e.g. 26.2 each, which rounding bin by bin would turn into a loss of 0.2 per bin)
        return np.diff(np.rint(np.cumsum(out)), prepend=0.0)
    return np.rint(out)


def answer_accuracy(wl: Workload, syn: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Per answer of :func:`answer`: (noise std, 95% half-width around the bucket-uniform truth), or None.

    The noise terms are :meth:`DawaSynopsis.noise_bounds` (public: the partition, the stage-2
    strategy and its snapping parameters). The half-width adds the rounding: that of the synopsis's
    bucket totals (:meth:`DawaSynopsis.rounding_bound`, at most 1 for a range) and the answer's own,
    1/2 (consecutive histogram bins, whose running totals are rounded again: 1). An empty range is
    exactly 0."""
    r = bin_ranges(wl)
    valid: np.ndarray = np.all(np.asarray(r[:, 0::2] <= r[:, 1::2], dtype=bool), axis=1).astype(bool)
    safe = np.where(valid[:, None], r, 0)
    if len(wl.dims) == 1:
        out = syn.noise_bounds(safe)
        rounding = None if out is None else syn.rounding_bound(safe)
    else:
        out2 = syn.noise_bounds(safe[:, [0, 1, 2, 3]])
        out = None if out2 is None else out2[:2]
        rounding = None if out2 is None else out2[2]
    if out is None or rounding is None:
        return None
    std, half = out
    final = 1.0 if _consecutive_bins(wl, r, valid) else 0.5
    half = half + rounding + final
    return np.where(valid, std, 0.0), np.where(valid, half, 0.0)


# -- the DAWA mechanism: fresh synopsis or free reuse ------------------------------------------

_ACCURACY_NOTE = "DAWA: error is data dependent (partition bias plus stage-2 Laplace noise)"
_NOISE_NOTE = ("DAWA: noise_std and ci95_half_width cover the stage-2 noise only, per answer in per_row_noise_std and "
               "per_row_ci95_half_width (noise_std / ci95_half_width: median over answers). The interval is around "
               "the bucket-uniform truth (each stage-1 bucket's true count spread evenly over its bins); the "
               "partition's bias, the difference from the true count, is data dependent and NOT included. "
               "Exact least-squares noise variance (snapped Laplace bounded over its rounding), a 95% bound valid "
               "for any sum of independent Laplace terms (2.58 std) plus the snapping grid's and the integer "
               "rounding's worst case")
_REUSE_NOISE_NOTE = ("; answered from a stored synopsis at zero cost: its buckets that the workload it was made for never "
                     "told apart share one total, so for these ranges the truth is spread evenly over such groups of "
                     "buckets")
_NO_NOISE_NOTE = {
    "reuse": "; this stored synopsis does not keep its stage-2 strategy (stored before strategies were kept, or too large "
             "for the exact computation), so its noise cannot be computed here",
    "fresh": "; the noise could not be computed exactly for this domain size (too many buckets and queries) or a "
             "released total lies near the noise's public clamping bound",
}


@dataclass
class DawaCalibration:
    """A DAWA run (or a reuse of a stored synopsis), from public metadata only."""

    workload: Workload
    plan: ir.QueryPlan | None  # the analysed query; None for query_many
    unit: str
    cap: float
    epsilon: float
    split: float
    key: str | None  # where the synopsis is stored (None: the source has no identity, no reuse)
    reuse: tuple[int, str] | None  # (ledger entry, synopsis) answering this for free
    #: a histogram's grouped caps (C_u, k, L): its bins are bounded as any GROUP BY; ``cap`` is then
    #: their L1 sensitivity min(C_u * k, L). None: a workload of range counts (L rows per unit)
    groups: Caps | None = None
    #: what the reused synopsis estimates (its own bounding rule, which an opted-in reuse may not share)
    reuse_estimates: str = ""


def _stage1_scales(wl: Workload, epsilon1: float, cap: float) -> dict[str, float]:
    """Stage 1's Laplace scale per candidate bucket length (public: n, epsilon1 and k only)."""
    from dpsql.mechanisms._dawa_partition import stage1_scale_table

    n = wl.size
    if n <= 1:
        return {}
    return {str(length): scale for length, scale in stage1_scale_table(n, epsilon1, sensitivity=cap).items()}


def _estimates(groups: Caps | None, cap: float) -> str:
    """What a synopsis bounded by ``groups`` (a histogram's grouped rule), else by ``cap`` rows per unit, estimates."""
    if groups is not None:
        return estimated_quantity(groups, grouped=True)
    return (f"range counts over at most {fmt_cap(cap)} row(s) per person kept from the rows passing the other "
            "conditions (before the range predicate)")


class Dawa:
    """Range workloads and histograms over ordered columns: DAWA, or a stored synopsis."""

    name = MechanismName.DAWA
    options = frozenset({"epsilon_split", "max_rows_per_unit", "max_groups_per_unit", "max_rows_per_group"})

    def calibrate(self, request: Request, contribution: Caps, *, reuse_only: bool = False) -> DawaCalibration | None:
        """A stored synopsis's answer when one holds the request (:meth:`_calibrate`), a 2-D one in either
        column order (the columns are taken in the order the WHERE names them); else a fresh DAWA run."""
        wl = request.workload
        if wl is not None and len(wl.dims) == 2 and request.options.get("reuse") != "never":
            for w in (wl, wl.transposed()):
                found = self._calibrate(replace(request, workload=w), contribution, reuse_only=True)
                if found is not None:
                    return found
        return self._calibrate(request, contribution, reuse_only=reuse_only)

    def _calibrate(self, request: Request, contribution: Caps, *, reuse_only: bool = False) -> DawaCalibration | None:
        """A histogram (GROUP BY over the bins) is bounded by the grouped rule, ``contribution``;
        a workload of range counts (``query_many``, a single range count) by L rows per unit.
        A stored synopsis answers for free when it was made by the same rule; one made by the
        other rule only when the request opts in (``reuse=synopsis``)."""
        wl = request.workload
        assert wl is not None
        opt_in = request.options.get("reuse") == "synopsis"
        catalog = dict(request.catalog)
        groups: Caps | None = None
        if wl.histogram:
            groups = contribution
            cap = contribution.rows_bound
            key = wl.synopsis_key(cap, catalog, binning=binning(wl), groups=(groups.max_groups_per_unit,
                                                                             groups.max_rows_per_group,
                                                                             groups.max_rows_per_unit))
        else:
            for opt in ("max_groups_per_unit", "max_rows_per_group"):
                if opt in request.options:
                    raise ConfigError(f"option {opt} applies to GROUP BY queries and histograms: a workload of range "
                                      "counts keeps at most max_rows_per_unit rows per person",
                                      hint="use the option max_rows_per_unit instead")
            cap = lowered_cap(wl.table, request.options, "max_rows_per_unit")
            key = wl.synopsis_key(cap, catalog, binning=binning(wl))
        never = request.options.get("reuse") == "never"  # a fresh synopsis, charged, even where one is stored
        found = request.find_synopsis(key) if key is not None and not never else None
        estimates = _estimates(groups, cap)
        if found is None and opt_in:
            other = self._other_rule_key(wl, request, catalog, histogram_rule=groups is None)
            found = request.find_synopsis(other) if other is not None else None
            table, opts = wl.table, request.options
            cap_l = lowered_cap(table, opts, "max_rows_per_unit") if table.max_rows_per_unit is not None or \
                "max_rows_per_unit" in opts else math.inf
            estimates = _estimates(Caps(float(table.max_groups_per_unit), float(table.max_rows_per_group), cap_l)
                                   if groups is None else None, lowered_cap(table, opts, "max_rows_per_unit"))
        split = float(request.options.get("epsilon_split", 0.25))
        cal = DawaCalibration(wl, request.plan, request.unit, cap, request.epsilon, split, key, found, groups,
                              estimates if found is not None else "")
        if found is not None:
            return cal
        if reuse_only:
            return None
        if math.isinf(cap):
            what = ("finite max_groups_per_unit and max_rows_per_group (or max_rows_per_unit)" if wl.histogram
                    else "a finite max_rows_per_unit (or max_groups_per_unit and max_rows_per_group)")
            raise PolicyError(
                f"table '{wl.table.name}' needs {what} for range workloads and histograms",
                hint=f"register('{wl.table.name}', ..., max_rows_per_unit=1)",
            )
        precheck_dawa(wl, request.epsilon, split=split, cap=cap)  # unrepresentable noise: refused for free
        return cal

    @staticmethod
    def _other_rule_key(wl: Workload, request: Request, catalog: dict[str, TableSpec], *, histogram_rule: bool) -> str | None:
        """The key of a synopsis made by the other bounding rule, with the caps of this request: the
        registered ones, or lower ones from its options (a cap the request lowers is never answered
        from a synopsis kept at the higher one). A histogram request that lowers its per-bin or
        per-person bin caps has no counterpart under the rule of L rows per unit: None."""
        table = wl.table
        opts = request.options
        cap_l = lowered_cap(table, opts, "max_rows_per_unit") if table.max_rows_per_unit is not None or \
            "max_rows_per_unit" in opts else math.inf
        if histogram_rule:
            g = Caps(float(table.max_groups_per_unit), float(table.max_rows_per_group), cap_l)
            return wl.synopsis_key(g.rows_bound, catalog, binning=binning(wl), groups=(g.max_groups_per_unit,
                                                                                     g.max_rows_per_group,
                                                                                     g.max_rows_per_unit))
        if any(o in opts for o in ("max_groups_per_unit", "max_rows_per_group")):
            return None
        return wl.synopsis_key(lowered_cap(table, opts, "max_rows_per_unit"), catalog, binning=binning(wl))

    def describe(self, cal: DawaCalibration) -> Description:
        wl = cal.workload
        dims = [{"column": d.column, "lo": str(d.domain.lo), "hi": str(d.domain.hi), "bins": d.n} for d in wl.dims]
        snapped = {"snapped_to_bins": [i for i, s in enumerate(wl.snapped) if s]} if any(wl.snapped) else {}
        widened = (f"queries {snapped['snapped_to_bins']} (0-based) were widened to whole bins: an endpoint inside a bin, "
                   "or >, <= or = on a continuous domain, takes in the whole bin, so such a count covers more values "
                   "than the WHERE admits",) if snapped else ()
        if cal.reuse is not None:
            made = synopsis_epsilon(cal.reuse[1])
            # a synopsis made at less than the epsilon asked (e.g. a ROLLUP's share) answers with that run's noise:
            # said in words, not only in the accuracy figures (the epsilon asked is not spent)
            less = (f"the synopsis was made at epsilon={made:g}, below the epsilon={cal.epsilon:g} asked: its answers carry "
                    "that run's noise (see the accuracy), larger than a fresh run's; options={'reuse': 'never'} runs DAWA "
                    "afresh, charged",) if made is not None and made < cal.epsilon else ()
            return Description(
                label="dawa (reused synopsis)",
                cost=Budget(0.0, 0.0),
                parameters={"source_entry_id": cal.reuse[0], "dims": dims, **snapped, "estimates": cal.reuse_estimates,
                            **({} if made is None else {"synopsis_epsilon": made})},
                notes=(f"answered from the DAWA synopsis of ledger entry {cal.reuse[0]} (same table, column(s) and WHERE): "
                       "post-processing, no budget spent", *less, *widened),
                reuse_of=cal.reuse[0],
            )
        from dpsql.mechanisms.dawa import epsilon_shares

        eps1, eps2 = epsilon_shares(cal.epsilon, cal.split)  # the run's own shares (their sum is within epsilon)
        params: dict[str, Any] = {
            "epsilon1": eps1,
            "epsilon2": eps2,
            "max_rows_per_unit": cal.cap if cal.groups is None else (
                None if math.isinf(cal.groups.max_rows_per_unit) else cal.groups.max_rows_per_unit),
            "dims": dims,
            "queries": len(wl.sqls) if not wl.histogram else len(wl.ranges),
            "stage1_calibration": "safe (docs/mechanisms.md section 2.4): Laplace (Delta_b + Delta_max) * k / epsilon1 on every bucket, no clamping",
            "stage1_noise_scales": _stage1_scales(wl, eps1, cal.cap),
            **snapped,
        }
        if wl.histogram:
            params["bins_released"] = len(wl.ranges)
        if wl.span is not None:
            params["dawa_bins"] = [list(r) for r in wl.span]
        if wl.axes is not None:
            params["dawa_bins"] = {d.column: None if runs is None else [list(r) for r in runs]
                                   for d, runs in zip(wl.dims, wl.axes)}
        if cal.groups is not None:
            params["max_groups_per_unit"] = cal.groups.max_groups_per_unit
            params["max_rows_per_group"] = cal.groups.max_rows_per_group
            params["l1_sensitivity"] = cal.cap
        params["estimates"] = _estimates(cal.groups, cal.cap)
        kept = ", ".join(f"{a}..{b}" if a < b else f"{a}" for a, b in wl.span or ())
        span = (f"the WHERE restricts '{wl.dims[0].column}' to bins {kept} of the declared domain (dawa_bins): DAWA runs "
                "over these bins only" + (" and releases only the bins holding them" if wl.histogram else
                                          ", a range's count from its kept bins") +
                " (the others hold no row that passes the WHERE)",) if wl.span is not None else ()
        if wl.axes is not None:
            span = ("the shared conditions restrict " + " and ".join(
                f"'{d.column}' to bins " + ", ".join(f"{a}..{b}" if a < b else f"{a}" for a, b in runs)
                for d, runs in zip(wl.dims, wl.axes) if runs is not None) + " of the declared domain (dawa_bins): DAWA "
                "runs over the grid of these rows and columns only, a range's count from its kept cells (the others "
                "hold no row that passes the WHERE)",)
        return Description(
            label="dawa",
            cost=Budget(cal.epsilon, 0.0),
            parameters=params,
            notes=("DAWA is pure epsilon-DP: no delta is spent",
                   f"each unit keeps at most {fmt_cap(cal.cap)} row(s), chosen at random; rows outside the declared "
                   "domain are dropped", *span, *widened),
        )

    def bounded(self, cal: DawaCalibration, salt: str, ops: SqlOps) -> exp.Expression | None:
        if cal.reuse is not None:
            return None
        return bounded_histogram(cal.workload, cal.unit, cal.cap, salt, ops=ops, groups=cal.groups)

    def released_types(self, cal: DawaCalibration) -> dict[str, str]:
        return {a.name: "BIGINT" for a in cal.plan.aggregates} if cal.plan is not None else {}

    def key_domain(self, cal: DawaCalibration) -> pa.Table | None:
        """A histogram releases every (coarse) bin: its keys are the public bin labels."""
        if cal.plan is None or not cal.workload.histogram:
            return None
        plain = isinstance(cal.plan.keys[0].expr, exp.Column)
        labels = cal.workload.dims[0].key_labels([r[0] for r in cal.workload.ranges], plain=plain)
        return pa.table({cal.plan.keys[0].name: _key_array(cal.workload.dims[0], labels, plain)})

    def release(self, cal: DawaCalibration, bounded: pa.Table | None, rng: NoiseSource) -> Released:
        wl = cal.workload
        commit: dict[str, Any] = {}
        if cal.reuse is not None:
            syn = load_synopsis(cal.reuse[1])
        else:
            assert bounded is not None
            syn = run_dawa(wl, fill_histogram(wl, bounded), cal.epsilon, rng, split=cal.split, cap=cal.cap)
            if cal.key is not None:  # a source without an identity (Arrow, DuckDB table, no version): no reuse
                commit = {"synopsis_key": cal.key, "synopsis": syn.to_json()}
        answers = answer(wl, syn).astype(np.int64)
        acc, per_row = _accuracy(wl, syn, cal.reuse is not None)
        if cal.plan is not None:  # per-row values travel with their rows (HAVING, ORDER BY, LIMIT): row_accuracy
            acc = {k: v for k, v in acc.items() if not k.startswith("per_row_")}
        if cal.plan is None:
            table = pa.table({"query": pa.array(wl.sqls), "count": pa.array(answers)})
            return Released(table=table, accuracy={"count": acc}, commit=commit, final=True)
        agg = cal.plan.aggregates[0].name
        if wl.histogram:
            plain = isinstance(cal.plan.keys[0].expr, exp.Column)
            labels = wl.dims[0].key_labels([r[0] for r in wl.ranges], plain=plain)
            table = pa.table({cal.plan.keys[0].name: _key_array(wl.dims[0], labels, plain), agg: pa.array(answers)})
        else:
            table = pa.table({agg: pa.array(answers)})
        row_acc = {agg: pa.array(per_row[1], type=pa.float64())} if per_row is not None else {}
        row_std = {agg: pa.array(per_row[0], type=pa.float64())} if per_row is not None else {}
        return Released(table=table, accuracy={agg: acc}, row_accuracy=row_acc, row_noise_std=row_std, commit=commit)


def _key_array(dim: Any, labels: list[Any], plain: bool) -> pa.Array:
    """A histogram's released keys as an Arrow array of the key column's own type where its lower edges are whole
    numbers that the type holds: ``GROUP BY age`` of an INTEGER column releases INTEGER keys (int32), as every other
    mechanism does (a sparse histogram's, a declared domain's), not BIGINT; so post-processing reads them alike
    (``age * 2000000000`` overflowed to NULL over one and was 4000000000 over the other) and an output file's schema
    does not follow the route. Other keys (doubles, dates, timestamps, an edge the type cannot hold) as Arrow infers."""
    from dpsql.mechanisms.basic import sql_arrow_type, typed_array

    typ = sql_arrow_type(dim.type_text or "") if plain else None
    if (typ is not None and (pa.types.is_integer(typ) or pa.types.is_decimal(typ))
            and all(isinstance(v, int) and not isinstance(v, bool) for v in labels)):
        return typed_array(labels, typ)
    return pa.array(labels)


def _accuracy(wl: Workload, syn: Any, reused: bool) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray] | None]:
    """The accuracy entry of a DAWA release and its per-answer (noise std, 95% half-width), None if not computable."""
    acc: dict[str, Any] = {"noise": "laplace", "noise_std": None, "ci95_half_width": None}
    bounds = answer_accuracy(wl, syn)
    if bounds is None:
        acc["note"] = _ACCURACY_NOTE + _NO_NOISE_NOTE["reuse" if reused else "fresh"] + (
            "; answered from a stored synopsis at zero cost" if reused else "")
        return acc, None
    std, half = bounds
    acc.update({"noise_std": float(np.median(std)) if std.size else 0.0,
                "ci95_half_width": float(np.median(half)) if half.size else 0.0,
                "per_row_noise_std": std.tolist(), "per_row_ci95_half_width": half.tolist(),
                "granularity": 1.0, "covers": "bucket-uniform truth (stage-2 noise only; partition bias excluded)",
                "note": _NOISE_NOTE + (_REUSE_NOISE_NOTE if reused else "")})
    return acc, (std, half)
