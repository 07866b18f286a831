r"""DP-S4S and R2T over SQL joins: scalar COUNT / SUM over inner equi-joins of registered tables.

Privacy claim
-------------
Neighbouring relation (``docs/mechanisms.md`` §3.1): add or remove one person together with
every join tuple they contribute to (a tuple belongs to every person reached from any of its rows
through any declared reference: ``dpsql.plan.joins``). Tuples reaching nobody (public rows only)
are constrained by no one and counted in full (sensitivity 0). This needs no declared key to be
unique and no reference to resolve: a looked-up chain attaches every person reached through every
row holding its value, a value reaching no row gets a synthetic user (truncated like a person),
and a hop the join performs through a key keeps only key values held by one row
(``dpsql.rewrite.joins``). Key uniqueness and referential integrity are assumed only by the
owner's degree bounds, i.e. by an attested Delta.

* Truncation: f̄(S, τ) = max Σ x_t s.t. Σ_{t∋u} x_t ≤ τ, 0 ≤ x_t ≤ w_t, on normalised weights
  w_t ∈ [0, 1] (``dpsql.rewrite.joins``: a count weighs 1; a sum's positive and negative parts are
  clamped values over their bound, on a 2⁻²⁰ grid). Removing a person changes f̄ by ≤ τ.
  Single owner (one person per tuple): f̄ = Σ_u min(⌊τ·units⌋, total_u)/units, computed exactly in
  the engine in integers (``truncated_sums``; sensitivity ≤ τ, the noise is calibrated to τ), for
  DP-S4S and R2T alike (R2T also reads τ = 0 there: the weight reaching nobody); otherwise the sampled tuples and their users reach Python
  and the truncation is ``dpsql.mechanisms._s4s_truncation`` (closed form / verified max-flow /
  certified LP with its slack G(τ) charged to the sensitivity), as in ``dpsql.mechanisms.s4s``; the
  path is the plan's (``PeopleBound.per_tuple``: 1, 2, ≥ 3 people per tuple), never the sample's, so
  that one person cannot switch a threshold to a slower path (``explain``: ``truncation``).
* DP-S4S (Algorithm 2): one Poisson sample S at rate q' ≤ q, in the engine (``dpsql.rewrite.joins``):
  on DuckDB's own connection, where the query reads the sample once (this path's closed form, and
  the sampled tuples when no slot is looked up), each tuple's own ``RANDOM()`` draw below
  floor(q 2^32)/2^32 (fresh per tuple and per query, from a generator seeded from OS entropy that
  no caller reaches); elsewhere (Spark, the portable hash, a caller's connection, a sample read
  twice) SHA-256 keyed by the per-query secret salt of the tuple's identity (a computational
  claim). Either way independent Bernoulli(q') keep decisions, q' ≤ q, as Lemma 3.1 needs (ε′
  grows with q, so accounting at q is safe). Thresholds τ_L > … > τ_1: by default
  {5.5^{i−1} < Δ} ∪ {Δ} with the bias ln(L/β) (the authors' code's base and bias, Δ on top so that
  nobody is truncated below Δ by the grid); option ``tau_base=2`` = the paper's Algorithm 2
  (τ_i = 2^{i−1} ≤ Δ, ln(3L/β)), another b: {b^{i−1} < Δ} ∪ {Δ} with ln(L/β); privacy does not depend on it), the schedule of ``dpsql.mechanisms.s4s`` (ε_i = ε₀/i, ε′_i by Lemma 3.1,
  Σ ε′_i ≤ ε, and the runs' joint cost on their shared sample ≤ ε, ``joint_cost`` in ``explain``;
  snapped Laplace), released max(0, max_i (f̂_i − bias_i)/q) × scale. With δ > 0
  the Gaussian variant under RDP (``s4s_rdp_schedule``: 1/i allocation at one order α, the joint
  RDP of the runs within ρ_total, CKS conversion, floating-point δ reserved). This module applies those schedules to a sample drawn
  in SQL (the numeric core draws its own sample in Python, so the steps after the draw are
  repeated here: the same schedule, the same noise calls).
* Lemma 3.1 needs every person to have at most Δ join tuples. **Enforced** Δ (single owner, no
  looked-up slot): every input is capped to the declared rows per value of the column it joins on
  (a stable bounding: each capped partition belongs to one person), so Δ holds on any data.
  **Attested** Δ (several people per tuple): no stable enforcement exists; Δ follows from the
  owner's declared degree bounds and keys, and the claim for q < 1 is conditional on them; the
  default there is R2T (q = 1), whose privacy needs no Δ.
* R2T (Dong et al. 2022): τ_j = b^j, j = 1 … ⌈log_b GS⌉ with GS = max(2, Δ), ε/L per run,
  released max(max_j Q̃_j, f̄(I, 0)) × scale (``dpsql.mechanisms.s4s.r2t_scalar`` /
  ``r2t_release``). δ is not spent.
* A SUM whose lower bound is negative is the difference of its positive and negative parts, each
  answered as above with half of (ε, δ): basic composition.

Nothing here depends on the data before the release: Δ, the grids, the schedules, q and the caps
come from the catalog and the options; the truncation never compares the data with Δ. Sampling
(q < 1) on an attested Δ needs the owner's ``allow_conditional_sampling`` on every private table
the join reads or reaches (refused for free otherwise).

The schedule's last run (i = 1) gets ε₁ = the whole remaining ε₀ as its Laplace budget, as in
Algorithm 2 (``docs/mechanisms.md`` §3.5); its amplified cost ε′(ε₁, τ₁, Δ, q) is below ε₁ when
q < 1, so Σ ε′_i < ε (e.g. 0.9515 at ε = 1) while the ledger charges the requested ε: an
overcharge, on the safe side, kept so that the schedule matches the spec's vectors.

Observability residuals (``docs/threat_model.md``): the ledger's timestamps record when queries
ran, so they reflect how long earlier ones took; R2T (q = 1) and any multi-person plan bring the
sampled join tuples into Python (the whole join at q = 1), so time and memory, and whether the
memory limit is hit (a generic error after the charge), depend on the data's size.
Sources: Qiu, Xiao, Yang, "DP-S4S" (SIGMOD 2026) §2–3, §5; Dong et al., "R2T" (SIGMOD 2022).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from dpsql.accounting import r2t_schedule
from dpsql.accounting.s4s import DEFAULT_TAU_BASE, MAX_TUPLES, tau_grid_base
from dpsql.budget import Budget, share_of
from dpsql.engine.base import SqlOps
from dpsql.errors import ConfigError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms import _s4s_truncation as _trunc
from dpsql.mechanisms import s4s as core
from dpsql.mechanisms.base import Description, MechanismName, Released, Request
from dpsql.noise import NoiseSource, check_gaussian_representable, gaussian_release, round_to_granularity
from dpsql.plan import ir
from dpsql.plan.joins import SEP, PeopleBound, bound_people, max_rows_per_value, parts, table_keys
from dpsql.rewrite.bound import Caps
from dpsql.rewrite.joins import Part, parts_of, sampled_tuples, truncated_sums

#: DP-S4S's default sampling rate (public, data independent: the paper's experiments use 1/16)
DEFAULT_Q = 1.0 / 16.0
#: engines whose join SQL (tuple identities, Poisson sample, lookups) is checked to give the same tuples
#: (``tests/test_spark_joins.py``)
JOIN_DIALECTS = ("duckdb", "spark")
BETA = 0.1


def _grid(options: dict[str, Any]) -> tuple[float, bool]:
    """The option ``tau_base`` (public): the base b of the τ grids and whether Algorithm 2 uses the
    paper's bias ln(3L/β). The default b = 5.5 with ln(L/β) is the authors' code's grid and bias
    (lower error: ``docs/mechanisms.md`` §3.5); ``tau_base=2`` is the paper's Algorithm 2 exactly
    (base 2, ln(3L/β)); any other b in (1, 1024] uses ln(L/β). Privacy does not depend on it."""
    if "tau_base" not in options:
        return DEFAULT_TAU_BASE, False
    v = options["tau_base"]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"tau_base must be a number, got {v!r}", hint="use 2 (the paper's grid) or e.g. 5.5 (the default)")
    b = tau_grid_base(v)
    return b, b == 2.0


@dataclass
class JoinCalibration:
    plan: ir.QueryPlan
    jp: ir.JoinPlan
    people: PeopleBound
    name: MechanismName
    epsilon: float
    delta: float
    q: float
    max_tuples: int
    enforced: bool
    caps: tuple[tuple[str, str, int], ...]
    parts: list[Part]
    fast: bool
    catalog: dict[str, Any]
    steps: tuple[Any, ...] = ()  #: S4S pure: core.S4SStep per run
    rdp: Any = None  #: S4S with delta > 0: core.S4SRdpSchedule
    taus: tuple[float, ...] = ()
    notes: list[str] = field(default_factory=list)
    tau_base: float = DEFAULT_TAU_BASE
    paper_bias: bool = False

    @property
    def part_epsilon(self) -> float:
        return share_of(self.epsilon, len(self.parts))

    @property
    def part_delta(self) -> float:
        return share_of(self.delta, len(self.parts))


def _private_tables(jp: ir.JoinPlan, catalog: dict[str, Any]) -> list[str]:
    """The non-public tables a join reads or reaches through references (sorted)."""
    seen: set[str] = set()
    todo = [t for _, t in jp.inputs]
    while todo:
        n = todo.pop()
        if n in seen or n not in catalog:
            continue
        seen.add(n)
        todo += [t.partition(".")[0] for t in catalog[n].references.values()]
    return sorted(n for n in seen if not catalog[n].public)


def _lowered(options: dict[str, Any], people: PeopleBound, jp: ir.JoinPlan) -> dict[str, int]:
    caps = options.get("degree_caps")
    if caps is None:
        return {}
    if not people.enforced:
        raise PolicyError(
            "degree_caps lower enforced per-join-column row caps, but this join's Delta is attested (several people per "
            "tuple), not enforced", hint="omit degree_caps; max_tuples_per_user may raise an attested Delta")
    if not isinstance(caps, dict):
        raise ConfigError("degree_caps must be a dict such as {'orders.o_custkey': 16}")
    tables = {t for _, t in jp.inputs}
    table_of = dict(jp.inputs)
    # the columns whose rows per value the join's caps may bound: those its equalities join on, and those it caps
    capped = {f"{table_of[x.split(SEP, 1)[0]]}.{x.split(SEP, 1)[1]}".lower() for pair in jp.conditions for x in pair}
    capped |= {f"{table_of[a]}.{c}".lower() for a, col, _ in people.caps for c in (col, *col.split(","))}
    out = {}
    for k, v in caps.items():
        if not isinstance(k, str) or k.count(".") != 1 or k.split(".")[0].lower() not in tables:
            raise ConfigError(f"degree_caps key {k!r} must be 'table.column' of a table in the query")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"degree_caps[{k!r}] must be a whole number >= 1, got {v!r}")
        if k.lower() not in capped:  # it would be accepted, charged and ignored
            t, _, c = k.partition(".")
            raise ConfigError(f"degree_caps key {k!r}: the join caps no rows of '{t.lower()}' by '{c}' (the columns it "
                              f"caps: {', '.join(sorted(capped))})",
                              hint="name one of those columns (explain lists the join's caps), or omit it")
        out[k.lower()] = v
    return out


def calibrate(request: Request, name: MechanismName) -> JoinCalibration:
    plan = request.plan
    assert plan is not None and plan.join is not None
    jp = plan.join
    catalog = dict(request.catalog)
    opts = dict(request.options)
    people = bound_people(jp, catalog)
    lowered = _lowered(opts, people, jp)
    if lowered:
        registered = people
        people = bound_people(jp, catalog, lowered)
        for key, v in lowered.items():
            t, _, c = key.partition(".")
            from dpsql.plan.joins import max_rows_per_value

            reg = max_rows_per_value(catalog[t], c, catalog)
            if v > reg:
                raise PolicyError(f"degree_caps[{key!r}]={v} is above the bound {reg:g} the data owner declared",
                                  hint=f"pass at most {reg:g}, or omit it")
        assert registered.enforced
        if not people.enforced:
            # the lowered bounds reorder the caps so that no capped partition belongs to one set of people: the
            # Delta they give would hold uncapped, on the analyst's word alone (and amplify a sample's privacy)
            named = ", ".join(f"'{k}'" for k in lowered)
            raise PolicyError(
                f"degree_caps {named}: with these bounds the join's row caps can no longer be applied stably (some input "
                "would be capped before the rows that fix its other columns reaching people), so Delta would not be "
                "enforced", hint="lower the other join columns' bounds too, or omit degree_caps "
                f"(the declared bounds enforce Delta={registered.delta:g})")
    if math.isinf(people.delta):  # pragma: no cover - the analyser refuses unbounded plans
        raise PolicyError("the join tuples per person cannot be bounded from the catalog")
    delta_int = int(people.delta)
    if "max_tuples_per_user" in opts:
        v = opts["max_tuples_per_user"]
        if people.enforced:
            raise PolicyError("max_tuples_per_user applies to an attested Delta; this join's Delta is enforced",
                              hint="lower it with degree_caps={'table.column': n} instead")
        if v < delta_int:
            raise PolicyError(
                f"max_tuples_per_user={v} is below Delta={delta_int} that follows from the owner's declarations: an attested "
                "Delta may be raised, never lowered", hint=f"pass max_tuples_per_user >= {delta_int}, or omit it")
        delta_int = int(v)
    if delta_int > MAX_TUPLES:  # before any schedule: the binomial tails take 64-bit counts
        raise ConfigError(f"Delta={delta_int} join tuples per person is above 2^63, the most the accounting takes",
                          hint="the data owner may declare smaller degree bounds (or pass a smaller max_tuples_per_user)")
    q = float(opts.get("q", DEFAULT_Q if name == MechanismName.DP_S4S else 1.0))
    if name == MechanismName.R2T and q != 1.0:
        raise ConfigError("R2T does not sample (q = 1)", hint="omit q, or use mechanism='dp_s4s'")
    if not people.enforced and q < 1.0:
        denied = [t for t in _private_tables(jp, catalog) if not catalog[t].allow_conditional_sampling]
        if denied:
            raise PolicyError(
                f"q={q!r} samples a join whose Delta is only attested (tuples have several people), and the data owner has "
                f"not allowed that for table(s) {', '.join(repr(t) for t in denied)}",
                hint="omit q (R2T, q = 1, needs no Delta); the data owner may register the tables with "
                     "allow_conditional_sampling=True")
    parts = parts_of(jp)
    fast = people.enforced  # one person per tuple: the closed form in the engine (DP-S4S and R2T)
    base, paper_bias = _grid(opts)
    cal = JoinCalibration(plan, jp, people, name, request.epsilon, request.delta, q, delta_int, people.enforced,
                          people.caps if people.enforced else (), parts, fast, catalog, tau_base=base,
                          paper_bias=paper_bias)
    e_p, d_p = cal.part_epsilon, cal.part_delta
    if name == MechanismName.DP_S4S:
        try:
            _s4s_schedule(cal, e_p, d_p, delta_int, q)
        except ConfigError as err:
            if q >= 1.0:
                raise
            least = _least_usable_q(cal, e_p, d_p, delta_int)
            if least is None:  # q = 1 fails too: q is not the cause, and the refusal names what is
                raise
            raise ConfigError(
                f"q={q!r} is too small for this query: at epsilon={request.epsilon!r} (per part {e_p!r}) and Delta={delta_int} "
                f"the sampled runs' budgets eps' shrink with q until the noise cannot be calibrated ({err.message})",
                hint=f"use q >= {least!r} (the usable range here is [{least!r}, 1]), or a larger epsilon",
            ) from None
    else:
        sched, _ = core.r2t_calibration(e_p, max(2.0, float(delta_int)), BETA, cal.tau_base)  # refused before the charge
        cal.taus = tuple(float(s.tau) for s in sched)
    if not people.enforced and q < 1.0:
        cal.notes.append(
            f"Delta={delta_int} is attested by the data owner's declarations (tuples have several people, so it cannot be "
            "enforced): the privacy claim of sampling (q < 1) is conditional on it")
    if people.enforced:
        cal.notes.append(
            "Delta is enforced: each input keeps at most the declared rows per value of the column it joins on "
            f"({', '.join(f'{a}.{c} <= {n}' for a, c, n in cal.caps)}), chosen at random; how many rows this drops is not reported")
    if len(parts) == 2:
        cal.notes.append("SUM with a negative lower bound: its positive and negative parts are answered separately, each "
                         "with half of the budget, and subtracted")
    return cal


def _s4s_schedule(cal: JoinCalibration, e_p: float, d_p: float, delta_int: int, q: float) -> None:
    if d_p > 0:
        cal.rdp = core.s4s_rdp_schedule(e_p, d_p, delta_int, q, BETA, tau_base=cal.tau_base, paper_bias=cal.paper_bias)
        cal.taus = tuple(s.tau for s in cal.rdp.steps)
        for s in cal.rdp.steps:
            check_gaussian_representable(s.sigma, s.granularity, integer=False, what="a DP-S4S run")
    else:
        cal.steps = core._s4s_steps(e_p, delta_int, q, BETA, cal.tau_base, cal.paper_bias)
        cal.taus = tuple(s.tau for s in cal.steps)


def _least_usable_q(cal: JoinCalibration, e_p: float, d_p: float, delta_int: int) -> float | None:
    """The least q = 2^-k (k = 0 ... 60) whose schedule can be calibrated (public quantities only;
    usability grows with q), for the error message of a q that is too small."""
    import dataclasses

    probe = dataclasses.replace(cal, notes=[])
    lo, hi = 0, 61  # 2^-lo usable, 2^-hi not (or unknown)
    try:
        _s4s_schedule(probe, e_p, d_p, delta_int, 1.0)
    except ConfigError:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            _s4s_schedule(probe, e_p, d_p, delta_int, 2.0 ** -mid)
            lo = mid
        except ConfigError:
            hi = mid
    return 2.0 ** -lo


def _schedule(cal: JoinCalibration) -> list[dict[str, Any]]:
    if cal.rdp is not None:
        return [{"tau": s.tau, "rho": s.rho, "rho_prime": s.rho_prime, "sigma": s.sigma, "bias": s.bias} for s in cal.rdp.steps]
    if cal.steps:
        return [{"tau": s.tau, "epsilon": s.epsilon, "epsilon_prime": s.epsilon_prime, "laplace_scale": s.snap_lambda,
                 "bias": s.bias} for s in cal.steps]
    sched = r2t_schedule(cal.part_epsilon, max(2.0, float(cal.max_tuples)), BETA, cal.tau_base)
    return [{"tau": float(s.tau), "epsilon": cal.part_epsilon / len(sched), "laplace_scale": s.laplace_scale, "bias": s.bias}
            for s in sched]


def _joint_cost(cal: JoinCalibration) -> dict[str, float] | None:
    """What the runs on one shared sample cost jointly, per part (public: from the schedule only)."""
    if cal.rdp is not None:
        return {"rho_joint": cal.rdp.rho_joint, "rho_total": cal.rdp.rho_total, "epsilon": cal.rdp.epsilon_spent}
    if cal.steps:
        return {"epsilon_joint": core.joint_epsilon(tuple(cal.steps), cal.max_tuples, cal.q)}
    return None


def join_size_bound(cal: JoinCalibration) -> tuple[float | None, str]:
    """A public upper bound on n, the number of join tuples, from the owner's declarations only
    (``max_table_rows`` of every input, keys, degree bounds, enforced caps), or (None, why not).

    Along a path: start from one input's declared size N_a; each further input y entered through
    equalities y.c = x.a with an already joined x multiplies by the most rows of y sharing one
    value of c: 1 for a declared key (a composite key when all its columns are joined), the
    degree bound or per-person cap of c, an enforced cap, else N_y (a plain product). Every
    partial join row matches at most that many rows of y, so n is at most the product. The least
    product over the start inputs (entering next, greedily, the input with the smallest factor)
    is reported. The WHERE clause only removes tuples. Nothing is read from the data."""
    jp, cat = cal.jp, cal.catalog
    sizes = {a: cat[t].max_table_rows for a, t in jp.inputs}
    missing = sorted({t for a, t in jp.inputs if sizes[a] is None})
    if missing:
        return None, ("not evaluated: the data owner declared no max_table_rows for " + ", ".join(repr(t) for t in missing)
                      + " (register(..., max_table_rows=N), [tables.X] max_table_rows, or --max-table-rows NAME=N)")
    table = dict(jp.inputs)
    caps = {(a, c): n for a, c, n in cal.caps}
    links: dict[tuple[str, str], set[str]] = {}  # (x, y) -> columns of y equated with columns of x
    for left, right in jp.conditions:
        (xa, _, xc), (ya, _, yc) = left.partition("__"), right.partition("__")
        links.setdefault((xa, ya), set()).add(yc)
        links.setdefault((ya, xa), set()).add(xc)

    def factor(x: str, y: str) -> tuple[float, str]:
        cols = links.get((x, y))
        n_y = float(sizes[y])  # type: ignore[arg-type]
        best, why = n_y, f"|{table[y]}| = {n_y:g}"
        if not cols:
            return best, why
        spec = cat[table[y]]
        if any(set(parts(k)) <= cols for k in table_keys(spec, cat)):
            return 1.0, f"1 ({table[y]} AS {y} entered through a declared key)"
        for c in sorted(cols):
            m = min(max_rows_per_value(spec, c, cat), float(caps.get((y, c), math.inf)))
            if m < best:
                best, why = m, f"{m:g} rows of {table[y]} AS {y} per {c}"
        return best, why

    best_n, best_why = math.inf, ""
    for start, _ in jp.inputs:
        seen = [start]
        n = float(sizes[start])  # type: ignore[arg-type]
        why = [f"|{table[start]}| = {n:g}"]
        while len(seen) < len(jp.inputs):
            f, w, y = min(((*factor(x, y), y) for y, _ in jp.inputs if y not in seen for x in seen), key=lambda c: c[0])
            n *= f
            why.append(w)
            seen.append(y)
        if n < best_n:
            best_n, best_why = n, " x ".join(why)
    return best_n, f"n <= {best_n:g} = {best_why} (from the owner's declared table sizes, keys and degree bounds)"


def bias_direction(parts: list[Part], by: str) -> str:
    """Which way the truncation (or clipping) biases the released value: each part's total toward zero, so
    a count or a sum of values >= 0 is biased low, a sum of values <= 0 high, a sum of both either way."""
    signs = {p.sign for p in parts}
    if signs == {1}:
        return f"biased low (by {by})"
    if signs == {-1}:
        return f"biased high, toward zero (by {by}): the values are <= 0"
    return f"biased toward zero (by {by}) for values above and below 0 alike, so the error's sign depends on the data"


def _lemma_3_3(cal: JoinCalibration) -> dict[str, Any]:
    """Lemma 3.3 as a formula of public quantities, evaluated per grid step where n is bounded."""
    if cal.name == MechanismName.R2T:
        return {
            "formula": "R2T: with probability 1 - beta, |answer - truth| = O(L tau* ln(L/beta) / eps) x scale, L the grid "
                       "size, tau* the largest person's contribution rounded up to the grid",
            "per_tau": [{"tau": float(s.tau), "bias": s.bias * sum(p.scale for p in cal.parts)}
                        for s in r2t_schedule(cal.part_epsilon, max(2.0, float(cal.max_tuples)), BETA, cal.tau_base)],
            "note": "the bias subtracted at each threshold (x scale): the error's order when tau* is that threshold",
        }
    n, how = join_size_bound(cal)
    out: dict[str, Any] = {
        "formula": "Lemma 3.3: with probability 1 - beta, |answer - truth| = O~(sqrt(n/q) + 1/q + (tau* + sqrt(tau*/q)) / "
                   "eps_i*) x scale, summed over the parts; n the number of join tuples, tau* the least grid tau at or above "
                   "the largest person's contribution (data: unknown), eps_i* its step's budget"
                   + (" (with delta > 0: sigma_i*/tau_i* in place of 1/eps_i*)" if cal.rdp is not None else ""),
        "n_bound": n,
        "n_derivation": how,
    }
    if n is None:
        out["evaluated"] = how
        return out
    q = cal.q
    steps = ([(s.tau, s.sigma / s.tau) for s in cal.rdp.steps] if cal.rdp is not None
             else [(s.tau, 1.0 / s.epsilon) for s in cal.steps])
    scale = sum(p.scale for p in cal.parts)
    out["evaluated"] = [
        {"tau": float(t), "bound": scale * (math.sqrt(n / q) + 1.0 / q + (t + math.sqrt(t / q)) * inv)} for t, inv in steps
    ]
    out["note"] = ("one value per grid step, as if tau* were that step (the chosen step is private); order of magnitude: "
                   "the constants and logarithmic factors that O~ hides are left out")
    return out


def _truncation_path(cal: JoinCalibration) -> str:
    """The truncation's path on the sample, fixed by the plan's people per tuple (public: it sets the run time)."""
    n = cal.people.per_tuple
    most = "unbounded (a looked-up slot)" if math.isinf(n) else f"{n:g}"
    path = {_trunc.CLOSED_FORM: "closed form", _trunc.MAX_FLOW: "verified max-flow",
            _trunc.LP: "certified LP (HiGHS)"}[_trunc.path_class(n)]
    return f"{path} on the sample at every tau (people per join tuple under the plan: {most})"


def describe(cal: JoinCalibration) -> Description:
    params: dict[str, Any] = {
        "mechanism": cal.name.value,
        "q": cal.q,
        "Delta": cal.max_tuples,
        "Delta_holds": "enforced" if cal.enforced else "attested",
        "Delta_derivation": cal.people.derivation,
        "person_classes": cal.people.classes,
        "caps": [f"{a}.{c} <= {n}" for a, c, n in cal.caps],
        "join": cal.jp.describe(),
        "truncation": "closed form in the engine (one person per tuple)" if cal.fast else _truncation_path(cal),
        "tau_base": cal.tau_base,
        # R2T's bias is L tau ln(L/beta)/eps in every base; ln(3L/beta) is DP-S4S's Algorithm 2 only
        "bias": ("ln(3L/beta) per step (the paper's Algorithm 2)" if cal.paper_bias and cal.name != MechanismName.R2T
                 else "ln(L/beta) per step"),
        "parts": [{"sign": p.sign, "scale": p.scale, "epsilon": cal.part_epsilon,
                   "delta": cal.part_delta if cal.rdp is not None else 0.0} for p in cal.parts],
        "tau_grid": list(cal.taus),
        "schedule": _schedule(cal),
        "joint_cost": _joint_cost(cal),
        "beta": BETA,
        "error_bound": _lemma_3_3(cal),
    }
    cost = Budget(cal.epsilon, cal.delta if cal.rdp is not None else 0.0)
    return Description(label=cal.name.value, cost=cost, parameters=params, notes=tuple(cal.notes))


def _noisy(cal: JoinCalibration, fbars: np.ndarray, rng: NoiseSource) -> float:
    """One part's release from its truncated values f̄(S, τ_i) (normalised weights), per step of
    the schedule: the steps of ``core.s4s_scalar`` / ``core.s4s_scalar_rdp`` after their sample."""
    if cal.rdp is not None:
        cands = []
        for st, v in zip(cal.rdp.steps, fbars):
            noisy = round_to_granularity(
                gaussian_release(np.array([float(v)]), rng.gaussian_noise(st.sigma, 1), integer=False), st.granularity)
            cands.append((float(noisy[0]) - st.bias) / cal.q)
        return max(0.0, max(cands))
    steps = cal.steps
    snapped = rng.snap_laplace(np.asarray(fbars, dtype=np.float64), np.array([s.snap_lambda for s in steps]),
                               np.array([s.snap_grid for s in steps]), np.array([s.snap_bound for s in steps]))
    cands = [(float(v) - s.bias) / cal.q for s, v in zip(steps, snapped)]
    return max(0.0, max(cands))


def _tuples(cal: JoinCalibration, rows: pa.Table, part: Part) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, tuple_idx, user_idx) of the sampled tuples, users compacted from their text ids."""
    n = rows.num_rows
    w = np.asarray(rows.column(part.name).to_numpy(zero_copy_only=False), dtype=np.float64) / part.units
    tis, uis = [], []
    for k in range(len(cal.jp.slots)):
        col = rows.column(f"__u{k}").combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            parents = np.asarray(pc.list_parent_indices(col).to_numpy(zero_copy_only=False), dtype=np.int64)
            col = pc.list_flatten(col)
        else:
            parents = np.arange(len(col), dtype=np.int64)
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        tis.append(parents[valid])
        uis.append(col.filter(pa.array(valid)).cast(pa.large_string()))
    ti = np.concatenate(tis) if tis else np.zeros(0, dtype=np.int64)
    names = pa.concat_arrays(uis) if uis else pa.array([], pa.large_string())
    if len(names):
        # users numbered in the order of their sorted ids, compacted in Arrow: numpy's fixed-width text
        # (np.unique(names.astype(str))) padded every id to the longest, so one person's long id made every
        # tuple's id that long (memory and time growing with that one person's text)
        uniq = pc.unique(names)
        uniq = uniq.take(pc.array_sort_indices(uniq))
        ui = np.asarray(pc.index_in(names, value_set=uniq).to_numpy(zero_copy_only=False), dtype=np.int64)
        # a tuple reaching one person through several slots belongs to that person once
        pairs = np.unique(np.stack([ti, np.asarray(ui, dtype=np.int64).reshape(-1)]), axis=1)
        ti, ui = pairs[0], pairs[1]
    else:
        ui = np.zeros(0, dtype=np.int64)
    assert w.size == n
    return w, ti.astype(np.int64), np.asarray(ui, dtype=np.int64).reshape(-1)


def release(cal: JoinCalibration, rows: pa.Table, rng: NoiseSource) -> Released:
    total = 0.0
    for k, part in enumerate(cal.parts):
        if cal.fast:
            fb = np.array([int(rows.column(f"__f{k}_{i}")[0].as_py()) / part.units for i in range(len(cal.taus))])
            if cal.name == MechanismName.R2T:  # the last column is τ = 0: the weight reaching nobody
                untouched = int(rows.column(f"__f{k}_{len(cal.taus)}")[0].as_py()) / part.units
                est = core.r2t_release(fb, untouched, epsilon=cal.part_epsilon,
                                       global_sensitivity=max(2.0, float(cal.max_tuples)), rng=rng, beta=BETA,
                                       tau_base=cal.tau_base).estimate
            else:
                est = _noisy(cal, fb, rng)
        else:
            w, ti, ui = _tuples(cal, rows, part)
            if cal.name == MechanismName.R2T:
                est = core.r2t_scalar(w, ti, ui, epsilon=cal.part_epsilon, global_sensitivity=max(2.0, float(cal.max_tuples)),
                                      rng=rng, beta=BETA, tau_base=cal.tau_base,
                                      max_people_per_tuple=cal.people.per_tuple).estimate
            else:
                jt = core.validate_join_tuples(w, ti, ui)
                prep = _trunc.prepare(jt.weights, jt.tuple_idx, jt.user_idx, jt.n_users)
                # the path is the plan's (people per tuple), never the sample's: run time is public
                fb = np.array([_trunc.truncate(prep, t, cal.people.per_tuple).value for t in cal.taus])
                est = _noisy(cal, fb, rng)
        total += part.sign * part.scale * est
    is_count = cal.jp.kind in (ir.COUNT_STAR, ir.COUNT_COL)
    value = pa.array([int(round(total))], type=pa.int64()) if is_count else pa.array([total], type=pa.float64())
    acc = {"noise": "gaussian" if cal.rdp is not None else "laplace", "mechanism": cal.name.value,
           "note": "a private choice among truncation thresholds; " + bias_direction(cal.parts, "the chosen step's bias "
           "plus what truncating at that step removes") + "; see the error_bound parameter for the guarantee"}
    return Released(table=pa.table({"__a0": value}), accuracy={"__a0": acc})


class JoinMechanism:
    """DP-S4S (sampled, q < 1 by default) or R2T (q = 1) over a join plan."""

    options = frozenset({"q", "degree_caps", "max_tuples_per_user", "tau_base"})

    def __init__(self, name: MechanismName) -> None:
        assert name in (MechanismName.DP_S4S, MechanismName.R2T)
        self.name = name

    name: MechanismName

    def calibrate(self, request: Request, contribution: Caps) -> JoinCalibration:
        """``contribution`` (the first table's per-unit caps) is not used: joins bound people
        through the plan's Delta (``dpsql.plan.joins``)."""
        return calibrate(request, self.name)

    def describe(self, cal: JoinCalibration) -> Description:
        return describe(cal)

    def bounded(self, cal: JoinCalibration, salt: str, ops: SqlOps) -> exp.Expression:
        if ops.dialect not in JOIN_DIALECTS:  # refused before the charge (the bind check builds this first)
            raise UnsupportedQueryError(
                f"joins run on the DuckDB and Spark engines only: their sampling and truncation are not checked on "
                f"{ops.dialect}", hint="answer the join with a Session on the DuckDB engine (the default)",
            )
        if cal.fast:
            assert cal.people.owner is not None
            taus = cal.taus + ((0.0,) if cal.name == MechanismName.R2T else ())  # R2T's floor f̄(I, 0)
            return truncated_sums(cal.jp, cal.catalog, cal.people.owner, taus, salt=salt, q=cal.q, ops=ops,
                                  caps=cal.caps)
        return sampled_tuples(cal.jp, cal.catalog, salt=salt, q=cal.q, ops=ops, caps=cal.caps)

    def released_types(self, cal: JoinCalibration) -> dict[str, str]:
        return {"__a0": "BIGINT" if cal.jp.kind in (ir.COUNT_STAR, ir.COUNT_COL) else "DOUBLE"}

    def key_domain(self, cal: JoinCalibration) -> pa.Table | None:
        return None

    def release(self, cal: JoinCalibration, bounded: pa.Table | None, rng: NoiseSource) -> Released:
        assert bounded is not None
        return release(cal, bounded, rng)
