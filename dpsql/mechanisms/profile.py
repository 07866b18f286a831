"""Caps advice: noisy histograms of how much each person contributes, and caps read from them.

Choosing ``max_rows_per_unit`` (or ``max_groups_per_unit`` and ``max_rows_per_group``) trades
bias (rows beyond the caps are dropped) against noise (it grows with the caps). The owner or
analyst asks ``Session.suggest_caps(table, epsilon=...)``; this charged release answers with the
distribution of per-person contributions on a power-of-two scale, and the caps that keep a chosen
share (``quantile``) of people whole, read from the noisy histograms (post-processing).

Privacy claim
-------------
Neighbouring relation: add or remove one person with all of their rows. Each histogram counts
people by one number per person (their rows; with ``group_by``: their groups, and their most rows
in one group) put in bin ``min(floor(log2(value)), 20)`` (computed exactly, by comparisons with powers of two): one person is in exactly one bin of
each histogram, so each histogram has L1 sensitivity 1. Every bin is released through Mironov's
snapping mechanism (``dpsql.noise`` section 2) calibrated with ``snapping_calibration(1, eps_h)``,
whose proven loss for the one changed bin is at most eps_h; the h histograms split epsilon
equally (basic composition): the release is epsilon-DP. Bins, the power-of-two scale and the
quantile are public; counts are rounded to integers and clipped at 0, and the suggested caps are
computed from the released counts only (post-processing).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql.budget import Budget, plain_float, share_of
from dpsql.catalog import TableSpec
from dpsql.engine.base import SqlOps
from dpsql.mechanisms.base import Description, MechanismName, Released, Request
from dpsql.noise import NoiseSource, snapping_calibration
from dpsql.plan import ir
from dpsql.plan.typer import _UNEXPORTABLE_KEYS, TypeRefusal, parse_type, type_key
from dpsql.rewrite.bound import SPREAD, Caps, key_expression, spread_keys, unit_expression

#: bins 0..MAX_BIN: a value v (>= 1) is in bin min(floor(log2 v), MAX_BIN), i.e. [2^b, 2^(b+1))
MAX_BIN = 20

_WHAT = {
    "rows": ("max_rows_per_unit", "rows per person"),
    "groups": ("max_groups_per_unit", "groups per person"),
    "rows_per_group": ("max_rows_per_group", "most rows per person in one group"),
}


@dataclass
class ProfileCalibration:
    table: TableSpec
    unit: str
    group_by: str | None
    quantile: float
    epsilon: float
    snap: tuple[float, float, float]  # (lambda, grid, bound) of every bin

    @property
    def histograms(self) -> list[str]:
        return ["rows", "groups", "rows_per_group"] if self.group_by else ["rows"]


class ContributionProfile:
    """``Session.suggest_caps``: how much people contribute, as noisy power-of-two histograms."""

    name = MechanismName.CONTRIBUTION_PROFILE
    options: frozenset[str] = frozenset()

    def calibrate(self, request: Request, contribution: Caps) -> ProfileCalibration:
        group_by = request.options.get("group_by")
        quantile = float(request.options.get("quantile", 0.9))
        h = 3 if group_by else 1
        snap = snapping_calibration(1.0, share_of(request.epsilon, h), integer=True, what="the contribution histogram")
        return ProfileCalibration(request.table, request.unit, group_by, quantile, request.epsilon, snap)

    def describe(self, cal: ProfileCalibration) -> Description:
        lam, grid, bound = cal.snap
        return Description(
            label=str(self.name),
            cost=Budget(cal.epsilon, 0.0),
            parameters={"histograms": cal.histograms, "group_by": cal.group_by, "quantile": cal.quantile,
                        "epsilon_per_histogram": cal.epsilon / len(cal.histograms), "bins": MAX_BIN + 1,
                        "snapping": {"lambda": lam, "grid": grid, "bound": bound}, "l1_sensitivity_per_histogram": 1},
            notes=(f"people counted per power-of-two bin of their contribution; suggested caps keep at least "
                   f"{cal.quantile:.0%} of people whole, read from the noisy counts (post-processing)",),
        )

    def bounded(self, cal: ProfileCalibration, salt: str, ops: SqlOps) -> exp.Expression:
        src = exp.to_table(cal.table.view, quoted=True)
        unit = unit_expression(cal.unit, dict(cal.table.schema), ops, salt)  # text units as their salted digest
        not_null = exp.Not(this=exp.Is(this=unit.copy(), expression=exp.Null()))

        def binned(value: exp.Expression) -> exp.Expression:
            # min(floor(log2 v), MAX_BIN) by comparisons with powers of two: exact for every count,
            # and the same SQL on every engine (no floating-point log, which Spark's lowering refuses)
            ifs = [exp.If(this=exp.GTE(this=value.copy(), expression=exp.Literal.number(2**b)),
                          true=exp.Literal.number(b)) for b in range(MAX_BIN, 0, -1)]
            return exp.Case(ifs=ifs, default=exp.Literal.number(0))

        def hist(what: str, per_unit: exp.Expression) -> exp.Expression:
            return (exp.select(exp.alias_(exp.Literal.string(what), "what"), exp.alias_(binned(exp.column("v")), "bin"),
                               exp.alias_(exp.Count(this=exp.Star()), "people"))
                    .from_(per_unit.subquery("__per_unit")).group_by(exp.Literal.number(1), exp.Literal.number(2)))

        rows = exp.select(exp.alias_(exp.Count(this=exp.Star()), "v")).from_(src).where(not_null).group_by(unit.copy())
        parts = [hist("rows", rows)]
        if cal.group_by:
            key = ir.GroupKey(expr=_group_key(cal.group_by, cal.table.schema), name="__k0", sql=cal.group_by)
            k = key_expression(key, dict(cal.table.schema))
            key_type = type_key(key.expr, dict(cal.table.schema))[1].name
            # one person's keys could be chosen to collide in the engine's public hash (a quadratic
            # GROUP BY): the (person, key) pairs are grouped by the salted spread too (spread_keys)
            keyed = exp.select(exp.alias_(unit.copy(), "__unit"), exp.alias_(k, "__k0")).from_(src).where(not_null)
            pairs = (exp.select(exp.alias_(exp.column("__unit"), "__u"), exp.alias_(exp.Count(this=exp.Star()), "__n"))
                     .from_(spread_keys(keyed.subquery("__keyed"), ["__k0"], salt, ops, {"__k0": key_type}))
                     .group_by(exp.column("__unit"), exp.column("__k0"), exp.column(SPREAD)))
            groups = exp.select(exp.alias_(exp.Count(this=exp.Star()), "v")).from_(pairs.subquery("__pairs")).group_by("__u")
            most = exp.select(exp.alias_(exp.Max(this=exp.column("__n")), "v")).from_(pairs.subquery("__pairs")).group_by("__u")
            parts += [hist("groups", groups), hist("rows_per_group", most)]
        out: exp.Expression = parts[0]
        for p in parts[1:]:
            out = exp.union(out, p, distinct=False)
        return out

    def released_types(self, cal: ProfileCalibration) -> dict[str, str]:
        return {}

    def key_domain(self, cal: ProfileCalibration) -> pa.Table | None:
        return None

    def release(self, cal: ProfileCalibration, bounded: pa.Table | None, rng: NoiseSource) -> Released:
        assert bounded is not None
        lam, grid, bound = cal.snap
        names, lows, highs, counts = [], [], [], []
        suggested: dict[str, int] = {}
        rows = bounded.to_pylist()
        for what in cal.histograms:
            true = np.zeros(MAX_BIN + 1)
            for r in rows:
                if r["what"] == what:
                    true[int(r["bin"])] += float(r["people"])
            noisy = np.maximum(np.rint(rng.snap_laplace(true, lam, grid, bound)), 0.0)
            cum = np.cumsum(noisy)
            total = cum[-1]
            b = int(np.searchsorted(cum, cal.quantile * total)) if total > 0 else 0
            suggested[_WHAT[what][0]] = int(2 ** (min(b, MAX_BIN) + 1) - 1)
            for i in range(MAX_BIN + 1):
                names.append(_WHAT[what][1])
                lows.append(2**i)
                highs.append(2 ** (i + 1) - 1 if i < MAX_BIN else None)
                counts.append(int(noisy[i]))
        if "max_rows_per_group" in suggested:  # a person's rows in one group never exceed their rows
            suggested["max_rows_per_group"] = min(suggested["max_rows_per_group"], suggested["max_rows_per_unit"])
        table = pa.table({"contribution": names, "from": lows, "to": pa.array(highs, pa.int64()), "people": counts})
        acc = {"noise": "laplace", "noise_std": float(np.sqrt(2.0) * lam), "snapping_grid": grid,
               "note": "people per bin, noisy; suggested caps (details['suggested']) read from these counts"}
        return Released(table=table, accuracy={"people": acc}, commit={"params_update": {"suggested": suggested}},
                        final=True, details={"suggested": suggested})


def _group_key(column: str, schema: Mapping[str, str]) -> exp.Expression:
    """The key ``group_by`` counts groups of: the column, or its exact text where its released values could not keep
    their value (UHUGEINT): no key is released here, only how many groups each person has."""
    col = exp.column(column)
    return exp.cast(col, "VARCHAR") if parse_type(schema[column]).name in _UNEXPORTABLE_KEYS else col


def route_request(request: Request) -> Any:
    """Validate what ``Session.suggest_caps`` asks (public metadata only: free refusals)."""
    from dpsql.errors import ConfigError

    opts = request.options
    q = plain_float(opts.get("quantile", 0.9), "quantile", hint="e.g. quantile=0.9")
    try:  # any real number, as epsilon (a numpy float32 was refused as not 'in (0, 1)')
        qf = math.nan if isinstance(q, bool) else float(q)
    except (TypeError, ValueError, OverflowError):
        qf = math.nan
    if not 0 < qf < 1:
        raise ConfigError(f"quantile must be a number in (0, 1), got {q!r}", hint="e.g. quantile=0.9")
    g = opts.get("group_by")
    if g is not None and (not isinstance(g, str) or g.lower() not in request.table.schema):
        raise ConfigError(f"group_by {g!r} is not a column of table '{request.table.name}'",
                          hint=f"its columns are: {', '.join(sorted(request.table.schema))}")
    if g is not None:  # a key dpsql cannot group by: said here, as group_by takes a column (no CAST can be given)
        try:
            type_key(_group_key(g.lower(), request.table.schema), dict(request.table.schema))
        except TypeRefusal:
            raise ConfigError(
                f"group_by '{g}' cannot be counted as groups: column '{g.lower()}' of table '{request.table.name}' is of "
                f"type {request.table.schema[g.lower()]}, which dpsql does not group by (not a scalar, or its equality is "
                "coarser than its spelling)",
                hint="give group_by a column of a text, number, BOOLEAN, DATE or TIMESTAMP type, or leave it out") from None
    # the schema's spelling: a name matched in any case but looked up as given was a raw KeyError
    return dataclasses.replace(request, options={**opts, "quantile": qf, "group_by": g if g is None else g.lower()})
