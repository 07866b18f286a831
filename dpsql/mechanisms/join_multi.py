r"""Join queries with several aggregates: one run of the routed join mechanism per base aggregate,
the query's budget split between them by basic sequential composition.

A join query's aggregates reduce to m distinct *base aggregates* (``dpsql.plan.joins``): COUNT(*),
COUNT(col) and SUM(expr) are their own, AVG(x) is SUM(x) and COUNT(x) of the same values (COUNT(*)
for a clamp, which SQL never makes NULL); repeated calls are answered once. ``SELECT COUNT(*),
SUM(o.total), AVG(o.total)`` has three: COUNT(*), SUM(o.total), COUNT(o.total).

Privacy claim
-------------
Neighbouring relation: the join mechanisms' (``docs/mechanisms.md`` §3.1): add or remove one person
with every join tuple they are in. Base aggregate j is answered by the mechanism routing chose for
the query (``dpsql.mechanisms.registry``: DP-S4S, R2T, DP-S4S's vector form or per-person clipping;
the choice reads the plan's people and the options, the same for every aggregate), run on its own:
its own single-aggregate plan over the same join, WHERE, GROUP BY keys and people
(``ir.JoinPlan.for_aggregate``), its own calibration at (ε_j, δ_j) and its own bounded query, read
after the one charge. The shares are ε_j = ε/m and δ_j = δ/m rounded down to a float, the last one
the exact remainder, so Σ_j ε_j ≤ ε and Σ_j δ_j ≤ δ exactly (as binary numbers: ε and δ are the request's
calibration values, at most the recorded decimals, ``dpsql.budget``).
Run j alone is cost_j-DP (its mechanism's own claim: (ε_j, 0) for DP-S4S under pure DP and for R2T,
(ε_j, δ_j) for DP-S4S under RDP and for clipping, (ε*_j, δ_j) for the vector form, ε*_j its
amplified ε). The m runs use independent randomness — fresh noise from the session's source, and,
when the mechanism samples join tuples (q < 1), a salt of their own, SHA-256 of the query's secret
salt and j (``sub_salt``; on DuckDB's own connection the per-tuple ``RANDOM()`` draws are fresh per
run anyway) — so their samples are independent and together the runs are (Σ_j cost_j)-DP by basic
sequential composition (Dwork & Roth, Theorem 3.16). That sum, rounded up to a float, is charged
(recorded as a decimal at least as large, ``dpsql.budget.recorded``), once, before any private row is
read; it is at most the requested (ε, δ). (Per-person clipping
composes its runs more tightly, as one Gaussian vector: below.)

Why independent samples: a sampled run's amplified cost (Lemma 3.1, Lemma 4.2) holds over the
randomness of its own sample. Runs on one shared sample would need a joint accounting (the one the
mechanisms do for their own runs on a sample: ``dpsql.mechanisms.s4s``, "Joint accounting"), and
it would charge more: the amplification ε ↦ ln(1 + q′(e^ε − 1)) is convex with value 0 at 0, so m
amplified costs at ε/m sum to at most the amplified cost at ε.

Without sampling (q = 1: R2T, clipping, DP-S4S at q = 1) the runs share the query's salt, so the
per-input row caps (enforced Δ) keep the same rows for every aggregate and an AVG divides a SUM by
the COUNT of the same rows. That is sound too: for every fixed salt the capped relation is a stable
function of the data (a person's capped partitions are theirs alone), each run is DP given the
salt, the composition holds given the salt, hence over its draw. With q < 1 each run caps with its
own salt: where the data exceed the declared bounds (the caps bind), a SUM and the COUNT of an AVG
may keep different rows.

Per-person clipping (GROUP BY, one person per tuple) uses a tighter accounting than the split: the
exact Gaussian profile of a composition of Gaussians (``docs/mechanisms.md`` §1.2, §7: the single-table
Gaussian mechanism composes its columns the same way). Run j releases its exact clipped totals plus
N(0, σ_j²I_d), and removing a person moves them by at most C_j′ = C_j(1 + 2⁻³⁰) in L2; scaled by 1/σ_j the
m runs are one Gaussian mechanism with μ = (Σ_j (C_j′/σ_j)²)^½. Each run is calibrated at (ε, δ_j) to the
sensitivity √m·C_j′ (√m rounded up; ``s4s_vector.joint_factor``): √m·C_j′/σ_j ≤ μ*(ε, δ_A,j), the largest
μ of an (ε, δ_A,j)-DP Gaussian, δ_A,j = (1 − s_j)δ_j its Gaussian part. So μ ≤ max_j μ*(ε, δ_A,j) =
μ*(ε, max_j δ_A,j) and the runs together are (ε, max_j δ_A,j)-DP, plus their floating-point parts
Σ_j fp_j (the coupling of ``dpsql.noise`` §3 over all m·d coordinates, each fp_j computed at ε, as the
joint release's ε is ε): (ε, max_j δ_A,j + Σ_j s_jδ_j) ≤ (ε, Σ_j δ_j) ≤ (ε, δ), which is charged. Against
the split, each σ_j is that of ε rather than ε/m at √m times the sensitivity: at ε = 3, δ = 3·10⁻⁶, m = 3,
Δ = 32, σ = 85.9 for a count instead of 135.9. ``clip_norm`` (one norm, in one aggregate's units) is
refused with several aggregates; each run clips at its default Δ·max|value|.

Not used: composing DP-S4S's Gaussian runs under δ > 0 in RDP before one conversion (§4), which would
change their schedules (``dpsql.mechanisms.s4s``); they are split as above.

What the analyst sees depends on public metadata and released values only: m, the shares and every
run's calibration come from the plan, the catalog and the options; a run that cannot be calibrated
at its share is refused while routing (free), with the share named. AVG and any other output over
the aggregates (arithmetic, aliases, ORDER BY, LIMIT) is post-processing of the released values;
AVG is NULL where the released count is ≤ 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pyarrow as pa
from sqlglot import exp

from dpsql.budget import Budget, binary_at_least, binary_at_most
from dpsql.engine.base import BoundedBatch, SqlOps
from dpsql.errors import ConfigError, DPSQLError
from dpsql.mechanisms.base import Description, Mechanism, MechanismName, Released, Request
from dpsql.noise import NoiseSource
from dpsql.plan import ir
from dpsql.rewrite.bound import SALT_PLACEHOLDER, Caps


def shares(total: float, m: int) -> list[float]:
    """``total``/m rounded down to a float for the first m - 1 shares, the exact remainder (rounded down)
    for the last: the shares' exact sum is at most ``total`` (public, data independent). Exact binary
    values, as the runs calibrate with them (``total`` is a calibration value: ``dpsql.budget``)."""
    t = Fraction(total)
    first = [binary_at_most(t / m)] * (m - 1)
    return first + [binary_at_most(t - sum((Fraction(x) for x in first), Fraction(0)))]


def charged_sum(costs: list[Budget]) -> Budget:
    """The runs' costs (binary values) added exactly and rounded up to floats: the query's cost, which the
    router records (``dpsql.budget.recorded``)."""
    e = sum((Fraction(c.epsilon) for c in costs), Fraction(0))
    d = sum((Fraction(c.delta) for c in costs), Fraction(0))
    return Budget(binary_at_least(e), binary_at_least(d))


def sub_salt(salt: str, j: int) -> str:
    """Run j's salt: SHA-256 of the query's secret salt and j (a fixed-length hex key, as the query's own),
    so that keyed samples are independent across runs; readable in ``explain``'s placeholder SQL."""
    if salt == SALT_PLACEHOLDER:
        return f"<per-query secret salt of aggregate {j + 1}>"
    return hashlib.sha256(f"{salt}/aggregate/{j}".encode()).hexdigest()[:32]


@dataclass
class MultiCalibration:
    plan: ir.QueryPlan
    mechanism: Mechanism
    runs: list[Any]  #: one calibration per base aggregate
    epsilons: list[float]
    deltas: list[float]
    samples: bool  #: the runs sample join tuples (q < 1): each gets its own salt
    joint: bool = False  #: per-person clipping: the runs are composed as one Gaussian vector (module docstring)
    notes: list[str] = field(default_factory=list)


def _sub_plan(plan: ir.QueryPlan, j: int) -> ir.QueryPlan:
    assert plan.join is not None
    agg = dataclasses.replace(plan.aggregates[j], name="__a0")
    out = ir.OutputColumn(agg.sql, exp.column("__a0"), "__a0")
    return dataclasses.replace(plan, join=plan.join.for_aggregate(j), aggregates=[agg], outputs=[out], having=None,
                               order=[], limit=None, offset=None)


def calibrate(request: Request, mechanism: Mechanism, contribution: Caps) -> MultiCalibration:
    plan = request.plan
    assert plan is not None and plan.join is not None and len(plan.join.aggregates) > 1
    m = len(plan.join.aggregates)
    joint = mechanism.name == MechanismName.JOIN_CLIPPED
    if joint and "clip_norm" in request.options:
        raise ConfigError(f"clip_norm is a norm in one aggregate's units, and this query has {m} base aggregates "
                          f"({', '.join(a.sql for a in plan.aggregates)}), each clipped at its own default "
                          "Delta x max|value|", hint="omit clip_norm, or ask each aggregate in a query of its own")
    eps = [request.epsilon] * m if joint else shares(request.epsilon, m)
    dels = shares(request.delta, m) if request.delta > 0 else [0.0] * m
    runs = []
    for j, (e_j, d_j) in enumerate(zip(eps, dels, strict=True)):
        sub = dataclasses.replace(request, epsilon=e_j, delta=d_j, plan=_sub_plan(plan, j))
        try:
            c = mechanism.calibrate(sub, contribution)
            if joint:  # one Gaussian vector with the other runs: sigma for sqrt(m) x the run's sensitivity
                from dpsql.mechanisms.s4s_vector import _params

                c.joint = m
                if c.d is not None:
                    _params(c, c.d)  # refuse unusable parameters before any charge
            runs.append(c)
        except DPSQLError as err:  # refused before any charge: say which aggregate and its share
            err.message = (f"{plan.aggregates[j].sql}, one of the query's {m} base aggregates, answered with "
                           f"epsilon={e_j:g}, delta={d_j:g} (the query's budget split {m} ways): {err.message}")
            err.args = (err._render(),)
            raise
    samples = any(getattr(c, "q", 1.0) < 1.0 and getattr(c, "path", "s4s") != "clip" for c in runs)
    cal = MultiCalibration(plan, mechanism, runs, eps, dels, samples, joint)
    how = (f"with epsilon and 1/{m} of delta each, composed as one Gaussian vector (each run's noise calibrated to "
           f"sqrt({m}) x its sensitivity); the charge is (epsilon, delta)" if joint else
           f"with 1/{m} of (epsilon, delta); the charge is the sum of the runs' costs (basic sequential composition)")
    cal.notes.append(
        f"{m} base aggregates ({', '.join(a.sql for a in plan.aggregates)}), each answered by its own run of the "
        f"{mechanism.name} mechanism {how}" + ("; each run samples the join tuples independently" if samples else "")
        + (". AVG is the released SUM over the released COUNT (NULL where that count is <= 0): numerator and "
           "denominator both carry the mechanism's downward bias, so AVG is not an underestimate (its error can go "
           "either way)" if _has_average(plan) else ""))
    return cal


def _has_average(plan: ir.QueryPlan) -> bool:
    """Whether an output divides a released SUM by a released COUNT (an AVG: ``dpsql.plan.joins``)."""
    return any(isinstance(c, exp.Case) and isinstance(c.args["ifs"][0].args.get("true"), exp.Div)
               for o in plan.outputs for c in o.expr.find_all(exp.Case))


def describe(cal: MultiCalibration) -> Description:
    descs = [cal.mechanism.describe(c) for c in cal.runs]
    runs = []
    for j, (a, d) in enumerate(zip(cal.plan.aggregates, descs, strict=True)):
        runs.append({"aggregate": a.sql, "released_as": f"__a{j}", "mechanism": d.label,
                     "budget": {"epsilon": cal.epsilons[j], "delta": cal.deltas[j]},
                     "cost": None if cal.joint else {"epsilon": d.cost.epsilon, "delta": d.cost.delta},
                     "parameters": d.parameters})
    m = len(runs)
    if cal.joint:  # (epsilon, max_j delta_A,j + sum_j fp_j) <= (epsilon, sum_j delta_j): module docstring
        cost = Budget(cal.epsilons[0], charged_sum([Budget(0.0, x) for x in cal.deltas]).delta)
        composition = (f"one Gaussian vector of {m} runs (per-person clipping), one per base aggregate: each run's sigma "
                       f"is calibrated at (epsilon, delta/{m}) to sqrt({m}) x its L2 sensitivity, so the runs together "
                       "are one Gaussian mechanism at (epsilon, the largest run's Gaussian delta) plus their "
                       "floating-point deltas (the exact Gaussian profile of a composition of Gaussians); charged: "
                       "(epsilon, delta)")
    else:
        cost = charged_sum([d.cost for d in descs])
        composition = (f"basic sequential composition of {m} runs, one per base aggregate, each with 1/{m} of "
                       "(epsilon, delta) (the last share the exact remainder); charged: the sum of their costs")
    params: dict[str, Any] = {
        "mechanism": descs[0].label,
        "composition": composition,
        "samples": ("independent per aggregate (each run's own salt)" if cal.samples
                    else "none (q = 1): the runs share the query's salt, so the row caps keep the same rows"),
        "aggregates": runs,
    }
    notes = list(cal.notes)
    for d in descs:
        notes += [n for n in d.notes if n not in notes]
    return Description(label=descs[0].label, cost=cost, parameters=params, notes=tuple(notes))


def _key_rows(table: pa.Table, keys: list[str]) -> list[tuple[Any, ...]]:
    """The key tuples of ``table``'s rows, a NaN key as one value (keys are canonical: one NaN, one zero),
    so that a key compares equal to itself (NaN != NaN: a public DOUBLE key holding NaN was found in no
    run, and every such query failed after its charge)."""
    def canon(v: Any) -> Any:
        return ("NaN",) if isinstance(v, float) and math.isnan(v) else v

    return [tuple(canon(v) for v in row) for row in zip(*(table.column(k).to_pylist() for k in keys), strict=True)]


def _aligned(first: pa.Table, other: pa.Table, keys: list[str]) -> pa.ChunkedArray | pa.Array:
    """``other``'s ``__a0`` in the row order of ``first`` (the same public key set; keys are never NULL)."""
    if not keys or first.select(keys).equals(other.select(keys)):
        return other.column("__a0")
    index = {row: i for i, row in enumerate(_key_rows(other, keys))}
    order = [index[row] for row in _key_rows(first, keys)]
    return other.column("__a0").take(pa.array(order, pa.int64()))


def release(cal: MultiCalibration, rows: list[pa.Table], rng: NoiseSource) -> Released:
    assert cal.plan.join is not None and len(rows) == len(cal.runs)
    outs = [cal.mechanism.release(c, r, rng) for c, r in zip(cal.runs, rows, strict=True)]
    keys = [k.name for k in cal.plan.join.keys]
    table = outs[0].table.select(keys)
    accuracy: dict[str, dict[str, Any]] = {}
    out = Released(table=table, accuracy=accuracy)
    for j, r in enumerate(outs):
        name = f"__a{j}"
        out.table = out.table.append_column(name, _aligned(outs[0].table, r.table, keys))
        if "__a0" in r.accuracy:
            accuracy[name] = {**r.accuracy["__a0"], "aggregate": cal.plan.aggregates[j].sql}
        out.commit.update(r.commit)
        out.details.update({f"{name}.{k}": v for k, v in r.details.items()})
        out.notes += [n for n in r.notes if n not in out.notes]
    return out


class MultiJoinMechanism:
    """Several aggregates over one join: ``mechanism`` run once per base aggregate (module docstring)."""

    def __init__(self, mechanism: Mechanism) -> None:
        self.inner = mechanism
        self.name: str = mechanism.name
        self.options = mechanism.options

    def calibrate(self, request: Request, contribution: Caps) -> MultiCalibration:
        return calibrate(request, self.inner, contribution)

    def describe(self, cal: MultiCalibration) -> Description:
        return describe(cal)

    def bounded(self, cal: MultiCalibration, salt: str, ops: SqlOps) -> BoundedBatch:
        return BoundedBatch(tuple(self.inner.bounded(c, sub_salt(salt, j) if cal.samples else salt, ops)  # type: ignore[misc]
                                  for j, c in enumerate(cal.runs)))

    def released_types(self, cal: MultiCalibration) -> dict[str, str]:
        return {f"__a{j}": self.inner.released_types(c)["__a0"] for j, c in enumerate(cal.runs)}

    def key_domain(self, cal: MultiCalibration) -> pa.Table | None:
        return self.inner.key_domain(cal.runs[0])

    def release(self, cal: MultiCalibration, bounded: Any, rng: NoiseSource) -> Released:
        assert isinstance(bounded, list)
        return release(cal, bounded, rng)


class MultiGroupedJoinMechanism(MultiJoinMechanism):
    """A grouped join's aggregates: as :class:`MultiJoinMechanism`, and the key set read from a public
    table is counted before the charge for every run (each has its own share of delta)."""

    def check_public(self, cal: MultiCalibration, engine: Any) -> None:
        for j, c in enumerate(cal.runs):
            if j == 0 and (cal.plan.having is not None or cal.plan.offset):
                # the runs' plans hold no HAVING nor OFFSET (each releases its aggregate over the key set): the first
                # run's check sees the whole query's, so that an OFFSET past the key set is refused, and the key set
                # is read for the post-processing's check of the HAVING (``key_domain`` is the first run's)
                whole = dataclasses.replace(c, plan=dataclasses.replace(c.plan, having=cal.plan.having,
                                                                        offset=cal.plan.offset))
                self.inner.check_public(whole, engine)  # type: ignore[attr-defined]
                c.read_keys = getattr(whole, "read_keys", None)
                continue
            self.inner.check_public(c, engine)  # type: ignore[attr-defined]
