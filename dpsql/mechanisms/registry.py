"""The registry of mechanisms and the one routing step: request -> mechanism + calibration + reason.

``route`` is used by ``Session.query``, ``Session.query_many`` and ``Session.explain`` alike, so
what ``explain`` says is what ``query`` does. It reads public metadata only (the catalog, the
analysed SQL, the options, and the keys of synopses already released in the ledger), so every
refusal here is free.

A new mechanism of dpsql plugs in here: one ``MechanismName`` (``dpsql.mechanisms.base``), one entry in
``REGISTRY``, and the rule in ``route`` that sends requests to it (docs/architecture.md); one defined
outside dpsql is registered by ``plug_in`` and answers the one-table queries forced to it.

Routing rules, in order:

0. A join (or a table reaching people through several references) -> DP-S4S when Delta is
   enforced (one person per tuple; default q = 1/16), R2T (q = 1) when Delta is only attested
   by the owner's declarations, unless the request sets q < 1 (then DP-S4S, its claim
   conditional on the attested Delta) or forces ``mechanism``. Several aggregates (AVG is two):
   one run of that mechanism per base aggregate (``dpsql.mechanisms.join_multi``). A join of one private
   table with public lookup tables on their keys (``_lookup_join``), scalar or GROUP BY, at any delta (no q,
   mechanism unset or one of gaussian / laplace / sparse_histogram) -> rules 3-4 over the capped join's rows
   with the private table's caps (``_route_lookup_one_table``, ``dpsql.mechanisms.lookup``): one meaning at
   every delta, the one-table query's (rows whose unit is NULL dropped, the caps after the whole WHERE). A
   scalar one with mechanism='clipped_gaussian' or an option only the join mechanisms read (such as clip_norm),
   delta > 0 -> the per-person clipping path over one constant group (no sampling: the one-table query's
   sensitivity, ``_route_lookup_join``). A LEFT JOIN from the private table to such lookups: the one-table path
   only (``_route_left_lookup``; a declared key set of a LEFT-joined lookup's column gains NULL), anything else
   with a LEFT JOIN refused. Over a lookup join, the aggregates the join mechanisms do not answer (COUNT(DISTINCT),
   variances, covariances, REGR_*, quantiles: ``ir.JoinPlan.one_table_only``) are answered on that one-table path
   only (quantiles by the exponential mechanism), the query analysed as one table's over the joined rows; over
   other joins, or with the join mechanisms asked, they are refused (``_refuse_one_table_only``); other GROUP BY
   over joins -> ``route_name`` (a key of a private table without a declared domain refused).
1. ``query_many`` (a workload of range counts) -> DAWA (a stored synopsis answers it for free).
2. A histogram over a column with a declared ordered domain -> DAWA (or its stored synopsis: the
   same bounding, so the same quantity); a single range count over such a column -> a stored
   synopsis only when asked (``options={"reuse": "synopsis"}``: the synopsis kept at most L rows
   per person before the range predicate, a slightly different quantity), else (3)/(4).
3. GROUP BY over keys not all declared public -> the Gaussian sparse histogram (needs delta > 0).
4. A scalar aggregate, or GROUP BY over public keys -> Gaussian (delta > 0) or Laplace (delta = 0).

Quantiles (MIN, MAX, MEDIAN, PERCENTILE_CONT, QUANTILE ...) -> the exponential mechanism
(``mechanisms.quantile``), before rule 2; with ``reuse='synopsis'`` a quantile is read from a
stored DAWA synopsis of its ordered column instead (the opt-in of a single range count).

Between 2 and 3: a GROUP BY with no aggregate (``SELECT k FROM t GROUP BY k``, ``SELECT DISTINCT k``)
over keys all declared public -> their declared domain, read from the catalog (``public_domain``,
free); over other keys -> rule 3 (the sparse histogram's released keys, without the count).

The ``mechanism`` option forces a mechanism where it applies and is refused where it does not.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from sqlglot import exp

from dpsql.catalog import TableSpec
from dpsql.engine.base import BoundedBatch
from dpsql.errors import (
    ConfigError,
    DPSQLError,
    ExecutionError,
    PolicyError,
    UnsupportedQueryError,
    Violation,
)
from dpsql.mechanisms.base import Description, Mechanism, MechanismName, Request, contribution
from dpsql.mechanisms.basic import BasicMechanism, domain_size
from dpsql.mechanisms.public_domain import PublicDomain
from dpsql.options import FORCEABLE_NAMES, OPTIONS, UNIVERSAL, mechanism_doc
from dpsql.plan import ir, windows
from dpsql.plan.analyze import analyze, resolve_unit_column
from dpsql.plan.workload import analyze_workload, histogram_workload


def _sparse_histogram() -> Mechanism:
    from dpsql.mechanisms.sparse_histogram import SparseHistogram

    return SparseHistogram()


def _dawa() -> Mechanism:
    from dpsql.mechanisms.ranges import Dawa

    return Dawa()


def _profile() -> Mechanism:
    from dpsql.mechanisms.profile import ContributionProfile

    return ContributionProfile()


def _quantile() -> Mechanism:
    from dpsql.mechanisms.quantile import QuantileMechanism

    return QuantileMechanism()


def _join(name: MechanismName) -> Mechanism:
    from dpsql.mechanisms.s4s_sql import JoinMechanism

    return JoinMechanism(name)


def _vector(name: MechanismName) -> Mechanism:
    from dpsql.mechanisms.s4s_vector import VectorJoinMechanism

    return VectorJoinMechanism(name)


class _Registry(Mapping[MechanismName, Mechanism]):
    """Every mechanism by name, each built (and its module imported) on first use: the join
    mechanisms import SciPy's sparse matrices and the SOCP solver's glue, so a query without a join
    never loads them, and a query answered by one mechanism imports no other's module (a count over
    public keys loads neither DAWA, the sparse histogram, the quantiles nor their accounting)."""

    def __init__(self, factories: dict[MechanismName, Callable[[], Mechanism]]) -> None:
        self._factories, self._built = factories, dict[MechanismName, Mechanism]()

    def __getitem__(self, name: MechanismName) -> Mechanism:
        if name not in self._built:
            self._built[name] = self._factories[name]()
        return self._built[name]

    def __iter__(self) -> Iterator[MechanismName]:
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)

    def _plug(self, name: str, factory: Callable[[], Mechanism] | None) -> None:
        """Add (``factory``) or remove (None) a plugged mechanism (``plug_in``, ``unplug``)."""
        self._built.pop(name, None)  # type: ignore[call-overload]
        if factory is None:
            self._factories.pop(name, None)  # type: ignore[call-overload]
        else:
            self._factories[name] = factory  # type: ignore[index]


REGISTRY: Mapping[MechanismName, Mechanism] = _Registry({
    MechanismName.GAUSSIAN: lambda: BasicMechanism(MechanismName.GAUSSIAN),
    MechanismName.LAPLACE: lambda: BasicMechanism(MechanismName.LAPLACE),
    MechanismName.SPARSE_HISTOGRAM: _sparse_histogram,
    MechanismName.DAWA: _dawa,
    MechanismName.DP_S4S: lambda: _join(MechanismName.DP_S4S),
    MechanismName.R2T: lambda: _join(MechanismName.R2T),
    MechanismName.CONTRIBUTION_PROFILE: _profile,
    MechanismName.EXPONENTIAL: _quantile,
    MechanismName.PUBLIC_DOMAIN: PublicDomain,
    MechanismName.DP_S4S_VECTOR: lambda: _vector(MechanismName.DP_S4S_VECTOR),
    MechanismName.JOIN_CLIPPED: lambda: _vector(MechanismName.JOIN_CLIPPED),
})
#: grouped joins: the unsampled variant of DP-S4S's vector form answers mechanism='r2t'
_GROUPED = _Registry({MechanismName.R2T: lambda: _vector(MechanismName.R2T)})

#: values the ``mechanism`` option accepts (kept in step with ``FORCEABLE_NAMES`` by ``plug_in`` and ``unplug``)
FORCEABLE = ["auto", *FORCEABLE_NAMES]

#: mechanisms plugged in from outside dpsql (``plug_in``): name -> (routing rule, the options it added to ``OPTIONS``)
_PLUGGED: dict[str, tuple[Callable[[Request], str | None], tuple[str, ...]]] = {}


def plug_in(name: str, factory: Callable[[], Mechanism], answers: Callable[[Request], str | None], *,
            options: Mapping[str, str] | None = None) -> None:
    """Register a mechanism defined outside dpsql, editing no file of it (docs/architecture.md, "Plugging in a
    mechanism"). ``factory()`` builds the ``Mechanism`` on first use. It answers a one-table query only when the
    analyst forces it (option ``mechanism=name``, which accepts the name and documents it at once), never by default;
    ``answers(request)`` is its routing rule, over public metadata only: the reason ``explain`` shows, or None when
    it does not answer the request (forcing it is then refused for free). ``options``: the query options it adds,
    name -> description (validated by its ``calibrate``, whose refusals are free); an option already documented is
    refused here (a mechanism reads an existing option by listing it in its ``options``). Raises ValueError for a
    name that is taken or not a lower-case identifier. ``unplug(name)`` removes it."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"a mechanism's name is a lower-case identifier such as 'my_count', got {name!r}")
    if name in REGISTRY or name in FORCEABLE or name in _GROUPED:
        raise ValueError(f"the mechanism name {name!r} is taken")
    added = tuple(options or {})
    taken = [k for k in added if k in OPTIONS]
    if taken:
        raise ValueError(f"option(s) {taken} are documented already: list them in the mechanism's options to read them")
    OPTIONS.update(options or {})
    _PLUGGED[name] = (answers, added)
    FORCEABLE_NAMES.append(name)
    FORCEABLE.append(name)
    OPTIONS["mechanism"] = mechanism_doc()
    REGISTRY._plug(name, factory)  # type: ignore[attr-defined]


def unplug(name: str) -> None:
    """Remove a mechanism registered by ``plug_in`` (with the options it added); ValueError for any other name."""
    if name not in _PLUGGED:
        raise ValueError(f"no mechanism {name!r} was plugged in (unplug removes only what plug_in added)")
    _, added = _PLUGGED.pop(name)
    for k in added:
        OPTIONS.pop(k, None)
    FORCEABLE_NAMES.remove(name)
    FORCEABLE.remove(name)
    OPTIONS["mechanism"] = mechanism_doc()
    REGISTRY._plug(name, None)  # type: ignore[attr-defined]


#: what a mechanism has (``dpsql.mechanisms.base.Mechanism``), checked on a plugged one before it is used
_INTERFACE = ("name", "options", "calibrate", "describe", "bounded", "released_types", "key_domain", "release")


def _route_plugged(request: Request, name: str) -> Route:
    """A query forced to a plugged mechanism: its rule's reason, or a free refusal."""
    assert request.plan is not None
    _check_bin_keys(request.plan)  # the bins of an ordered domain are DAWA's alone
    reason = _PLUGGED[name][0](request)
    if not reason:
        raise PolicyError(f"mechanism '{name}' does not answer this query (no routing rule sends it there)",
                          hint="omit the mechanism option (explain shows the mechanism chosen)")
    mech = REGISTRY[name]  # type: ignore[index]
    missing = [m for m in _INTERFACE if not hasattr(mech, m)]
    if missing or mech.name != name:
        raise TypeError(f"the plugged mechanism '{name}' " + (f"lacks {', '.join(missing)} (dpsql.mechanisms.base."
                        "Mechanism)" if missing else f"says its name attribute is {mech.name!r}"))
    if set(mech.options) - set(OPTIONS):  # an analyst could never pass them (check_options refuses them)
        raise TypeError(f"the plugged mechanism '{name}' reads options no one documented: "
                        f"{sorted(set(mech.options) - set(OPTIONS))}; document them with plug_in(..., options={{...}})")
    _check_applicable(mech, request.options)
    plan = request.plan
    return _finish(request, mech, mech.calibrate(request, contribution(plan.table, request.options,
                                                                        grouped=plan.is_grouped)), reason)

_REASONS = {
    "dawa_histogram": "histogram over a column with a declared ordered domain: DAWA (private partition, then workload-aware measurement)",
    "dawa_workload": "range workload over column(s) with a declared ordered domain: DAWA (private partition, then workload-aware measurement)",
    "sparse": "GROUP BY over keys not declared public: Gaussian sparse histogram (groups released only above a noisy threshold, exact accounting)",
}


@dataclass(frozen=True)
class Route:
    """Where a request goes: the mechanism, its calibration, why, and its description."""

    request: Request
    mechanism: Mechanism
    calibration: Any
    reason: str
    description: Description

    def bounded(self, salt: str, ops: Any) -> Any:
        """The mechanism's bounded relation under ``salt`` over the backend's building blocks ``ops``
        (``Mechanism.bounded``). A relation that reads private rows (not None) under a description that charges
        nothing is refused here, before the charge: no route reads private rows for free, whatever it states."""
        ast = self.mechanism.bounded(self.calibration, salt, ops)
        if ast is not None and not isinstance(ast, (exp.Expression, BoundedBatch)):
            raise TypeError(f"mechanism '{self.description.label}': bounded returned a {type(ast).__name__}: a sqlglot "
                            "expression, a BoundedBatch or None (no private row is read)")
        cost = self.description.cost
        if ast is not None and cost.epsilon == 0 and cost.delta == 0:
            raise ConfigError(
                f"mechanism '{self.description.label}' reads private rows but its description charges nothing "
                "(cost (0, 0)); nothing was read or charged",
                hint="a mechanism that reads private rows states its cost in describe(); one that reads none returns "
                     "None from bounded()",
            )
        return ast

    def release(self, bounded: Any, rng: Any) -> Any:
        """The mechanism's release of the bounded rows (``Mechanism.release``). An aggregate it states as BIGINT
        (``released_types``: a count) released as anything but integers is refused, not shown: a count's noise
        is rounded to whole numbers, and a raw float would show the sampler's bits."""
        released = self.mechanism.release(self.calibration, bounded, rng)
        table = released.table
        for name, typ in self.mechanism.released_types(self.calibration).items():
            if typ == "BIGINT" and name in table.column_names:
                t = table.schema.field(name).type
                if not (pa.types.is_integer(t) or pa.types.is_null(t)):
                    raise ExecutionError(f"mechanism '{self.description.label}' released a count as {t}, not integers")
        if self.request.plan is not None and not released.final:
            _check_released_rows(self.description.label, self.request.plan, table)
        return released

    def bind_key(self) -> tuple[Any, ...] | None:
        """What the bind check of this route is a function of, for a given catalog: the request
        (text, options) and the route (mechanism, and its calibration through the description:
        cost, parameters, reuse). None (never remembered) for a mechanism that also reads public
        rows at its check, which may change."""
        if hasattr(self.mechanism, "check_public"):
            return None
        d = self.description
        return (repr(self.request.text), repr(sorted(self.request.options.items())), type(self.mechanism).__qualname__,
                d.label, repr(d.cost), repr(sorted(d.parameters.items())), d.reuse_of)


def _check_released_rows(label: str, plan: ir.QueryPlan, table: pa.Table) -> None:
    """Refuse (after the charge: a failed run) a release whose rows no mechanism may show, whatever it states: a NaN
    or infinite aggregate; a scalar query's release that is not one row; a key combination released twice (its
    noise averaged away); a key outside its declared domain (only the domain is public). Messages name no value."""
    import numpy as np
    import pyarrow.compute as pc

    for a in plan.aggregates:
        if a.name in table.column_names and pa.types.is_floating(table.schema.field(a.name).type):
            col = table.column(a.name)
            if pc.any(pc.or_(pc.is_nan(col), pc.is_inf(col))).as_py():
                raise ExecutionError(f"mechanism '{label}' released a NaN or infinite value")
    if not plan.keys:
        if table.num_rows != 1:
            raise ExecutionError(f"mechanism '{label}' released {table.num_rows} rows for a query without GROUP BY")
        return
    names = [k.name for k in plan.keys]
    if not set(names) <= set(table.column_names):
        return  # post-processing fails on the missing key, generically
    code = _domain_positions(label, plan, table) if plan.public_keys and domain_size(plan) <= MAX_PUBLIC_GROUPS else None
    if code is not None:  # public keys: each row's place in the domains' product, counted (linear time)
        twice = code.size > 0 and int(np.bincount(code).max()) > 1
    else:
        for k in plan.keys:
            if k.domain is not None and not set(pc.unique(table.column(k.name)).to_pylist()) <= set(k.domain):
                raise ExecutionError(f"mechanism '{label}' released a key outside the declared domain of {k.sql}")
        twice = table.select(names).group_by(names).aggregate([]).num_rows != table.num_rows
    if twice:
        raise ExecutionError(f"mechanism '{label}' released a group more than once")


def _domain_positions(label: str, plan: ir.QueryPlan, table: pa.Table) -> Any:
    """The place of each released row in the product of its keys' declared domains (numpy), refusing a key value
    outside its domain; None where a domain's values do not convert to the released key's type."""
    import numpy as np
    import pyarrow.compute as pc

    code = np.zeros(table.num_rows, dtype=np.int64)
    for k in plan.keys:
        assert k.domain is not None
        col = table.column(k.name).combine_chunks()
        try:
            domain = pa.array(list(k.domain)).cast(col.type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return None
        place = pc.index_in(col, value_set=domain)
        if place.null_count:
            raise ExecutionError(f"mechanism '{label}' released a key outside the declared domain of {k.sql}")
        code = code * len(domain) + place.to_numpy(zero_copy_only=False).astype(np.int64)
    return code


def _finish(request: Request, mechanism: Mechanism, calibration: Any, reason: str) -> Route:
    _check_applicable(mechanism, request.options)  # (rules check before calibrating; this holds for every rule)
    desc = mechanism.describe(calibration)
    desc = dataclasses.replace(desc, cost=request.record(desc.cost))  # recorded >= what was calibrated
    if request.asked is not None and desc.cost.epsilon > request.asked.epsilon:
        raise ConfigError(f"mechanism '{desc.label}' charges epsilon={desc.cost.epsilon:g}, above the "
                          f"epsilon={request.asked.epsilon:g} asked; nothing was charged",
                          hint="a mechanism states a cost within the budget asked for (docs/architecture.md)")
    if request.options.get("reuse") == "synopsis" and desc.reuse_of is None:
        if request.table is not None and request.table.source_kind not in ("parquet", "csv") and (
                request.table.version is None):
            raise PolicyError(
                f"reuse='synopsis' was asked, but table '{request.table.name}' is registered without a version: its "
                "contents have no identity but the label the owner gives them, so its synopses are never stored for "
                "reuse; nothing was charged",
                hint=f"register '{request.table.name}' with version='...' (a label of its contents, e.g. a snapshot "
                     "date), or omit the reuse option to answer the query on its own, which is charged")
        raise PolicyError(
            "reuse='synopsis' was asked, but no stored DAWA synopsis covers this query (same table, ordered column(s), "
            "other conditions, caps and source contents); nothing was charged",
            hint="omit the reuse option to answer the query on its own, which is charged (explain shows the cost)",
        )
    if desc.reuse_of is not None and (desc.cost.epsilon or desc.cost.delta):
        raise ConfigError(f"mechanism '{desc.label}' answers from ledger entry {desc.reuse_of} for free but states a cost "
                          f"{desc.cost}; nothing was charged", hint="a reuse of a stored release states the cost (0, 0)")
    window_note = windows.describe(request.plan) if request.plan is not None else None
    if window_note is not None:
        desc = dataclasses.replace(desc, notes=(*desc.notes, window_note))
    if desc.reuse_of is not None:
        reason = (f"answered from the DAWA synopsis of ledger entry {desc.reuse_of} (same table, column(s) and WHERE): "
                  "post-processing")
    return Route(request, mechanism, calibration, reason, desc)


def _check_applicable(mechanism: Mechanism, options: Mapping[str, Any]) -> None:
    """Refuse the analyst's options (``dpsql.options.OPTIONS``) that ``mechanism`` does not read."""
    bad = sorted(set(options) & set(OPTIONS) - mechanism.options - UNIVERSAL)
    if "grouping_weights" in bad:  # read by dpsql.groupings, which routes each of its queries without it
        raise ConfigError("option grouping_weights applies to a request of several queries only (GROUP BY ROLLUP, "
                          "CUBE or GROUPING SETS, or a UNION ALL); this query is one", hint="drop grouping_weights")
    if bad:
        err = ConfigError(
            f"option(s) {bad} do not apply to the {mechanism.name} mechanism",
            hint=f"the {mechanism.name} mechanism takes: {', '.join(sorted(mechanism.options | UNIVERSAL))}",
        )
        err.inapplicable = frozenset(bad)
        raise err


def _unit(table: TableSpec, catalog: Mapping[str, TableSpec]) -> str:
    unit = resolve_unit_column(table, dict(catalog))
    assert unit is not None  # analysis refuses tables whose unit does not resolve
    return unit


#: combinations a GROUP BY over declared (public) keys may have: each is a released row, built after the
#: charge (4000 x 4000 declared keys took 16 s and 2.6 GB; the same bound as an ordered domain's bins)
MAX_PUBLIC_GROUPS = 1 << 22


def _check_public_groups(plan: ir.QueryPlan) -> None:
    """Refuse, before any charge, a GROUP BY whose declared key domains multiply past MAX_PUBLIC_GROUPS."""
    if not plan.keys or not plan.public_keys:
        return
    size = domain_size(plan)
    if size > MAX_PUBLIC_GROUPS:
        sizes = " x ".join(f"{len(k.domain or ()):,} ({k.sql})" for k in plan.keys)
        raise PolicyError(
            f"the GROUP BY keys' declared domains have {size:,} combinations ({sizes}), each built as a released row "
            f"(before a WHERE on the keys filters them); at most {MAX_PUBLIC_GROUPS:,} are supported",
            hint="group by fewer keys per query (a key fixed by the WHERE need not be grouped by), or declare smaller "
                 "key domains",
        )


def route_workload(
    sqls: Any, epsilon: float, delta: float, options: Mapping[str, Any], catalog: Mapping[str, TableSpec],
    find_synopsis: Callable[[str], tuple[int, str] | None],
) -> Route:
    """Rule 1: a list of range counts (``query_many``)."""
    dawa = REGISTRY[MechanismName.DAWA]
    if options.get("mechanism", "auto") not in ("auto", "dawa"):
        raise ConfigError("range workloads (query_many) are answered by DAWA only", hint="omit the mechanism option")
    _check_applicable(dawa, options)
    wl = analyze_workload(list(sqls) if isinstance(sqls, (list, tuple)) else sqls, dict(catalog))
    req = Request.asking(text="\n;\n".join(wl.sqls), epsilon=epsilon, delta=delta, options=options, table=wl.table,
                         unit=_unit(wl.table, catalog), catalog=catalog, workload=wl, find_synopsis=find_synopsis)
    cal = dawa.calibrate(req, contribution(wl.table, {}))
    return _finish(req, dawa, cal, _REASONS["dawa_workload"])


def route(
    sql: str, epsilon: float, delta: float, options: Mapping[str, Any], catalog: Mapping[str, TableSpec],
    find_synopsis: Callable[[str], tuple[int, str] | None],
) -> Route:
    """Rules 2-4: one SQL query."""
    plan = analyze(sql, dict(catalog))
    table = plan.table
    forced = options.get("mechanism", "auto")
    if plan.join is not None:
        return _route_join(sql, plan, epsilon, delta, options, catalog, find_synopsis)
    _check_public_groups(plan)
    if forced in ("dp_s4s", "r2t", "dp_s4s_vector", "clipped_gaussian"):
        raise PolicyError(f"mechanism '{forced}' answers joins (or tables that reach people through several references)",
                          hint="omit the mechanism option for a single-table query")
    base = Request.asking(text=sql, epsilon=epsilon, delta=delta, options=options, table=table,
                          unit=_unit(table, catalog), catalog=catalog, plan=plan, find_synopsis=find_synopsis)
    if forced in _PLUGGED:
        return _route_plugged(base, forced)
    if any(a.kind in ir.QUANTILE_KINDS for a in plan.aggregates):
        return _route_quantile(base, forced)
    if forced == "exponential":
        raise PolicyError("mechanism 'exponential' answers quantiles (MIN, MAX, MEDIAN, PERCENTILE_CONT, QUANTILE)",
                          hint="omit the mechanism option for counts, sums and averages")

    # rule 2: ordered domains (DAWA, or a stored synopsis)
    if forced in ("auto", "dawa") and any(c.ordered is not None for c in table.columns.values()):
        wl = histogram_workload(plan)
        if wl is not None:
            dawa = REGISTRY[MechanismName.DAWA]  # (built, and its module imported, only where it may answer)
            _check_applicable(dawa, options)
            req = dataclasses.replace(base, workload=wl)
            return _finish(req, dawa, dawa.calibrate(req, contribution(table, options, grouped=True)),
                           _REASONS["dawa_histogram"])
        if options.get("reuse") == "synopsis" and _single_range_count(plan):
            dawa = REGISTRY[MechanismName.DAWA]
            if not (len(plan.outputs) == 1 and plan.outputs[0].source is not None and not plan.order
                    and plan.limit is None and plan.offset is None and plan.having is None):
                # said as such: the refusal below says no synopsis covers the query, though one may cover its count
                raise PolicyError(
                    "reuse='synopsis' reads a plain range count from a stored synopsis, and this query asks more than the count "
                    "(another output, an expression of it, HAVING, ORDER BY, LIMIT or OFFSET); nothing was charged",
                    hint=f"ask SELECT COUNT(*) FROM {table.name} WHERE ... alone (arithmetic, HAVING and LIMIT can be "
                         "applied to the released count), or omit the reuse option")
            try:
                wl = analyze_workload([sql], dict(catalog), plans=[plan]) if set(options) <= dawa.options | UNIVERSAL else None
            except DPSQLError:
                wl = None
            if wl is not None:
                req = dataclasses.replace(base, workload=wl)
                cal = dawa.calibrate(req, contribution(table, {}), reuse_only=True)  # type: ignore[call-arg]
                if cal is not None:
                    return _finish(req, dawa, cal, "")
    if forced == "dawa":
        raise PolicyError(
            "mechanism 'dawa' answers range workloads: use Session.query_many([...]) or a histogram over a column with a declared ordered domain"
        )
    _check_bin_keys(plan)

    # rule 2b: GROUP BY with no aggregate over declared domains: the domain itself, free
    if plan.keys and not plan.aggregates and plan.public_keys and forced == "auto":
        mech = REGISTRY[MechanismName.PUBLIC_DOMAIN]
        _check_applicable(mech, options)
        return _finish(base, mech, mech.calibrate(base, contribution(table, {})),
                       "GROUP BY with no aggregate over keys declared public: the declared domain (public metadata, free)")
    if not plan.aggregates and forced in ("gaussian", "laplace"):
        raise PolicyError(f"mechanism '{forced}' noises aggregates, and the query has none (it asks for the set of keys)",
                          hint="omit the mechanism option: keys declared public are answered from their domain, others by "
                          "the sparse histogram")

    if forced not in ("auto", "gaussian", "laplace", "sparse_histogram"):  # a name no rule above took
        raise PolicyError(f"mechanism '{forced}' does not answer this query (no routing rule sends it there)",
                          hint="omit the mechanism option (explain shows the mechanism chosen)")

    # rule 3: keys not declared public
    if plan.is_grouped and not plan.public_keys:
        if forced in ("gaussian", "laplace"):
            raise PolicyError(
                f"mechanism '{forced}' needs public keys, but the GROUP BY keys are not declared public",
                hint="declare the key column's domain, or let dpsql choose the sparse histogram mechanism",
            )
        forced = "sparse_histogram"
    if forced == "sparse_histogram":
        mech = REGISTRY[MechanismName.SPARSE_HISTOGRAM]
        reason = _REASONS["sparse"]
    else:
        # rule 4: scalar aggregates and public keys
        name = MechanismName(forced) if forced != "auto" else (MechanismName.GAUSSIAN if delta > 0 else MechanismName.LAPLACE)
        mech = REGISTRY[name]
        what = "scalar aggregate" if not plan.keys else f"GROUP BY over {_public_keys(plan, 'keys')}, every key released"
        why = "delta > 0" if name == MechanismName.GAUSSIAN else "delta = 0 (pure DP)"
        reason = f"{what}: {name} mechanism ({why})"
    _check_applicable(mech, options)
    return _finish(base, mech, mech.calibrate(base, contribution(table, options, grouped=plan.is_grouped)), reason)


def _public_keys(plan: ir.QueryPlan, noun: str) -> str:
    """Where a public GROUP BY's keys come from, for explain: declared domains, or the WHERE's list of a column's values."""
    listed = [k.sql for k in plan.keys if k.listed]
    return f"public (declared) {noun}" if not listed else \
        f"public {noun} (declared, or the values the WHERE lists: {', '.join(listed)})"


def _mixed_quantiles(quantiles: list[str], others: list[str], grouped: bool) -> PolicyError:
    """A quantile beside other aggregates: refused (free), naming both and the forms that answer them. (A scalar
    SELECT of both without ORDER BY, LIMIT, HAVING or DISTINCT never comes here: it is answered as two queries in one
    request, ``dpsql.groupings``.)"""
    q, o = ", ".join(dict.fromkeys(quantiles)), ", ".join(dict.fromkeys(others))
    return PolicyError(
        f"a query mixes quantiles ({q}) with other aggregates ({o}); they are released by different mechanisms "
        "(the exponential mechanism over a grid, and noise added to sums)",
        hint=f"ask the quantiles and the other aggregates in separate queries, SELECT {q} FROM ... and SELECT {o} FROM "
             "... (each with the same FROM, WHERE and GROUP BY), or send both SELECTs as one request joined by UNION ALL "
             "(one charge, the budget split between them)" + ("" if grouped else
             "; without ORDER BY, LIMIT, OFFSET, HAVING and DISTINCT, which its one row does not need, this SELECT is "
             "answered as it is, as those two queries in one request"))


def _route_quantile(base: Request, forced: str) -> Route:
    """Quantiles: the exponential mechanism (or a stored synopsis when reuse is asked)."""
    plan = base.plan
    assert plan is not None
    if forced not in ("auto", "exponential"):
        raise PolicyError(f"quantiles (MIN, MAX, MEDIAN, PERCENTILE_CONT, QUANTILE) are answered by the exponential "
                          f"mechanism, not by mechanism '{forced}'", hint="omit the mechanism option")
    others = [a.sql for a in plan.aggregates if a.kind not in ir.QUANTILE_KINDS]
    if others:
        raise _mixed_quantiles([a.sql for a in plan.aggregates if a.kind in ir.QUANTILE_KINDS], others, plan.is_grouped)
    mech = REGISTRY[MechanismName.EXPONENTIAL]
    _check_applicable(mech, base.options)
    what = "scalar quantile" if not plan.keys else f"quantile per {_public_keys(plan, 'key')}, every key released"
    cal = mech.calibrate(base, contribution(base.table, base.options, grouped=plan.is_grouped))
    return _finish(base, mech, cal, f"{what}: exponential mechanism over a public grid of the declared bounds (pure DP)")


def _route_join(
    sql: str, plan: ir.QueryPlan, epsilon: float, delta: float, options: Mapping[str, Any],
    catalog: Mapping[str, TableSpec], find_synopsis: Callable[[str], tuple[int, str] | None],
) -> Route:
    """Rule 0: joins -> DP-S4S (enforced Delta) or R2T (attested Delta)."""
    from dpsql.plan.joins import bound_people

    assert plan.join is not None
    people = bound_people(plan.join, dict(catalog))
    forced = options.get("mechanism", "auto")
    lookup = "q" not in options and _lookup_join(plan.join, people, catalog)
    if plan.join.left:  # only the one-table path answers a LEFT JOIN (the join mechanisms join inner only)
        return _route_left_lookup(sql, plan, people, epsilon, delta, options, catalog, find_synopsis)
    # one meaning per query: a lookup join is the one-table query over its joined rows (NULL units dropped, the caps
    # after the whole WHERE) at every delta, unless a join mechanism or an option only they read is asked for
    if lookup and not set(options) & _JOIN_OPTIONS and forced in _LOOKUP_NAMES:
        one = _route_lookup_one_table(sql, plan, people, epsilon, delta, options, catalog, find_synopsis)
        if one is not None:
            return one
    if plan.join.one_table_only and not lookup and not set(options) & _JOIN_OPTIONS and forced in _LOOKUP_NAMES:
        counted = _people_count_plan(plan, people)  # COUNT(DISTINCT person) over a join with one owner per tuple
        if counted is not None:
            one = _route_lookup_one_table(sql, counted, people, epsilon, delta, options, catalog, find_synopsis,
                                          people_count=True)
            if one is not None:
                return one
            computed = [k.sql for k in plan.join.keys if k.kind in ("year", "derived")]
            if computed and _counts_people_only(counted, people):  # (one_table_plan: the one-table path declares key sets of columns only)
                raise UnsupportedQueryError(
                    f"COUNT(DISTINCT person) over this join is answered grouped by columns only (declared domains, "
                    f"public lookup columns, private columns), not by {', '.join(computed)}, whose key set is computed "
                    "from public values (a DATE column's declared days, year(...), a CASE, an expression)",
                    hint="group by a column (declare the domain of the values to release, e.g. a bucket column), or "
                         "count join tuples with COUNT(*) over these keys")
    if plan.join.one_table_only:  # aggregates the join mechanisms do not answer
        _refuse_one_table_only(plan, options, _lookup_join(plan.join, people, catalog))
    refused = [k.refusal for k in plan.join.keys if k.refusal is not None]
    if refused:  # keys of a private table without a public key set: the join mechanisms would read them from its rows
        from dpsql.plan.joins import _raise

        _raise(refused, policy=True)
    if plan.join.keys:
        return _route_grouped_join(sql, plan, epsilon, delta, options, catalog, find_synopsis)
    if lookup and forced == "clipped_gaussian":
        if delta <= 0:
            raise ConfigError("mechanism 'clipped_gaussian' is a Gaussian mechanism and needs delta > 0",
                              hint="pass delta=1e-7 (for example), or omit the mechanism option (delta = 0: Laplace)")
        return _route_lookup_join(sql, plan, epsilon, delta, options, catalog, find_synopsis)
    if forced not in ("auto", "dp_s4s", "r2t"):
        raise PolicyError(f"joins are answered by DP-S4S or R2T, not by mechanism '{forced}'",
                          hint="use mechanism='dp_s4s' or 'r2t', or omit the option")
    if forced == "auto" and lookup and delta > 0 and not set(options) & _TRUNCATION_OPTIONS:
        return _route_lookup_join(sql, plan, epsilon, delta, options, catalog, find_synopsis)
    if forced == "auto":
        sampled = options.get("q", 1.0 if not people.enforced else 0.5) < 1.0
        forced = "dp_s4s" if people.enforced or sampled else "r2t"
    name = MechanismName(forced)
    mech = _several(REGISTRY[name], plan)
    _check_applicable(mech, options)
    req = Request.asking(text=sql, epsilon=epsilon, delta=delta, options=options, table=plan.table, unit="",
                         catalog=catalog, plan=plan, find_synopsis=find_synopsis)
    holds = "enforced by per-input row caps" if people.enforced else "attested by the owner's declarations"
    if name == MechanismName.DP_S4S:
        reason = f"join: DP-S4S (Poisson-sampled join tuples, truncation with a privately chosen threshold; Delta {holds})"
    else:
        reason = f"join: R2T (no sampling, truncation race over thresholds; Delta {holds})"
    return _finish(req, mech, mech.calibrate(req, contribution(plan.table, {})), reason + _several_reason(plan))


#: options only the join mechanisms read: asked for, they keep a lookup join on those mechanisms
_JOIN_OPTIONS = frozenset({"q", "degree_caps", "max_tuples_per_user", "tau_base", "clip_norm"})
#: options only DP-S4S and R2T read (the per-person clipping path of a scalar lookup join does not): asked for, they
#: route such a query to DP-S4S, as ``q`` does
_TRUNCATION_OPTIONS = frozenset({"degree_caps", "tau_base", "max_tuples_per_user"})
#: the mechanisms a lookup join's one-table path answers with (the ``mechanism`` option's values it accepts)
_LOOKUP_NAMES = ("auto", "gaussian", "laplace", "sparse_histogram", "exponential")


def _refuse_one_table_only(plan: ir.QueryPlan, options: Mapping[str, Any], lookup: bool) -> None:
    """Refuse (free) a join query with aggregates only the one-table path of a lookup join answers
    (``ir.JoinPlan.one_table_only``) that did not reach that path, saying why."""
    from dpsql.plan.joins import _raise

    assert plan.join is not None
    if not lookup:
        _raise(list(plan.join.one_table_only))
    what = ", ".join(dict.fromkeys(v.fragment or "the aggregate" for v in plan.join.one_table_only))
    asked = sorted(set(options) & _JOIN_OPTIONS)
    if asked or options.get("mechanism", "auto") not in _LOOKUP_NAMES:
        by = f"the option(s) {', '.join(asked)} ask" if asked else f"mechanism '{options['mechanism']}' asks"
        raise PolicyError(f"{what} over a lookup join is answered by the one-table mechanisms over the joined rows; {by} "
                          "for the join mechanisms, which answer COUNT(*), COUNT(col), SUM and AVG only, without FILTER",
                          hint="omit it")
    if any(k.kind in ("year", "derived") for k in plan.join.keys):
        by = ", ".join(k.sql for k in plan.join.keys if k.kind in ("year", "derived"))
        raise PolicyError(f"{what} over a lookup join grouped by {by} is not answered: the one-table mechanisms "
                          "know the key sets of columns only, and the join mechanisms answer COUNT(*), COUNT(col), SUM "
                          "and AVG only, without FILTER",
                          hint="declare the column's domain and group by the column, or ask COUNT, SUM or AVG")
    raise PolicyError(f"{what} over this lookup join is not answered: its private table reaches its people through "
                      "another table (its owner is not one of its columns), and the join mechanisms answer COUNT(*), "
                      "COUNT(col), SUM and AVG only, without FILTER", hint="ask COUNT, SUM or AVG")


def _people_count_plan(plan: ir.QueryPlan, people: Any) -> ir.QueryPlan | None:
    """A join whose every tuple belongs to one person (one owner per tuple, Delta enforced by per-input row caps) and
    whose every aggregate is ``COUNT(DISTINCT c)``, c the owner's column or a column the join's ON equates with it:
    the plan with each such c written as the owner's column, which ``_route_lookup_one_table`` answers over the joined
    relation with the owner as its unit (``dpsql.mechanisms.lookup``, "People counted over a join"); None otherwise
    (public metadata and the SQL only). Whether every aggregate is such a count is checked on the one-table plan."""
    from dpsql.plan.joins import flat

    jp, owner = plan.join, people.owner
    if (jp is None or jp.statement is None or jp.left or owner is None or not (people.single_owner and people.enforced)
            or "," in owner.column or len(owner.hops) > 1):
        return None
    same = {flat(owner.alias, owner.column)}
    while True:  # the owner's column and every column equated with it by the ON conditions
        more = {x for pair in jp.conditions for x in pair if set(pair) & same} - same
        if not more:
            break
        same |= more
    unit = flat(owner.alias, owner.column)
    statement = jp.statement.copy()
    for d in list(statement.find_all(exp.Distinct)):
        if isinstance(d.parent, exp.Count) and len(d.expressions) == 1 and isinstance(d.expressions[0], exp.Column) \
                and not d.expressions[0].table and d.expressions[0].name in same:
            d.expressions[0].replace(exp.column(unit, quoted=False))
    counted = dataclasses.replace(plan, join=dataclasses.replace(jp, statement=statement))
    if _counts_people_only(counted, people):
        _refuse_person_keys(plan, jp.statement, same - {unit}, unit)
    return counted


def _counts_people_only(plan: ir.QueryPlan, people: Any) -> bool:
    """Every aggregate of ``_people_count_plan``'s statement is ``COUNT(DISTINCT <the owner's column>)``."""
    from dpsql.plan.joins import flat

    assert plan.join is not None and plan.join.statement is not None and people.owner is not None
    unit = flat(people.owner.alias, people.owner.column)
    aggs = list(plan.join.statement.find_all(exp.AggFunc))
    return bool(aggs) and all(
        isinstance(a, exp.Count) and isinstance(a.this, exp.Distinct) and len(a.this.expressions) == 1
        and isinstance(a.this.expressions[0], exp.Column) and a.this.expressions[0].name == unit
        and not isinstance(a.parent, exp.Filter) for a in aggs)


def _refuse_person_keys(plan: ir.QueryPlan, statement: exp.Select, same: set[str], unit: str) -> None:
    """A count of people grouped by the person's column or one the ON equates with it (``o.o_custkey`` beside the
    unit ``c.c_custkey``, however the GROUP BY names it: ``GROUP BY 1``, an alias, ``ALL``, parentheses): every group
    holds one person, as a GROUP BY of the unit on one table, which is refused for free; refused alike here (the SQL
    and the catalog only), not charged for a release of no row."""
    from dpsql.plan.checks import violation
    from dpsql.plan.joins import SEP, _raise

    assert plan.join is not None
    person = unit.replace(SEP, ".", 1)
    bad = []
    for k in plan.join.keys:
        if not (isinstance(k.expr, exp.Column) and not k.expr.table and k.expr.name in same):
            continue
        written = k.expr.name.replace(SEP, ".", 1)
        what = (f"GROUP BY the privacy unit '{person}'" if k.expr.name == unit else
                f"GROUP BY '{written}', which the join's ON equates with the privacy unit '{person}',")
        message = (f"{what} is refused: each group holds one person, so no group can pass the release threshold "
                   "(nothing would be released, yet the query would be charged); group by another column, or count "
                   f"people with COUNT(DISTINCT {person})")
        node = next((c for c in statement.find_all(exp.Column) if c.name == k.expr.name
                     and not isinstance(c.parent, exp.Distinct)), None)
        bad.append(violation(node, plan.sql, message) if node is not None else Violation(message))
    _raise(bad)


def _lookup_join(jp: ir.JoinPlan, people: Any, catalog: Mapping[str, TableSpec]) -> bool:
    """A join of one private table with public lookup tables on their declared keys (public metadata only):
    one private input, the others public, Delta enforced, and every public input capped at one row per
    value of the column it joins on (a declared key: the cap keeps it one whatever the data)."""
    private = [a for a, t in jp.inputs if not catalog[t].public]
    public = {a for a, t in jp.inputs if catalog[t].public}
    return (len(private) == 1 and people.enforced and people.single_owner
            and all(n == 1 for a, _, n in people.caps if a in public))


def _not_lookup_reason(jp: ir.JoinPlan, people: Any, catalog: Mapping[str, TableSpec]) -> str:
    """Which condition of :func:`_lookup_join` ``jp`` fails, in words (public metadata only)."""
    private = [(a, t) for a, t in jp.inputs if not catalog[t].public]
    if len(private) != 1:
        return f"it joins {len(private)} private tables ({', '.join(f'{t} AS {a}' for a, t in private)})"
    if not (people.single_owner and people.enforced):
        slots = "; ".join(jp.describe()["user_slots"])
        return (f"the rows of '{private[0][1]}' do not each belong to one person named by a column of their own (they "
                f"reach {slots}), so they are not bounded per person as one table's rows")
    fanned = sorted({f"{a}.{c.replace(',', ', ')}" for a, c, n in people.caps if n != 1 and catalog[dict(jp.inputs)[a]].public})
    return f"a public table is joined on a column that is not its declared key ({', '.join(fanned) or 'its ON'})"


def _left_problem(jp: ir.JoinPlan, people: Any, catalog: Mapping[str, TableSpec]) -> str | None:
    """Why a join with LEFT JOINs is not a lookup join whose LEFT-joined inputs each match at most one row per row
    of the join before them (public metadata only), or None. Each LEFT-joined input must be capped at one row per
    value of columns its own ON equates with the inputs before it (a declared key of the lookup)."""
    from dpsql.plan.joins import SEP

    tables = dict(jp.inputs)
    if not _lookup_join(jp, people, catalog):
        return ("a LEFT JOIN is answered only from one private table to public lookup tables joined on their declared "
                f"keys (each private row then matches at most one lookup row), and this join is not one: "
                f"{_not_lookup_reason(jp, people, catalog)}")
    written = [a for a, _ in jp.inputs]
    for a in jp.left:
        own = {x.split(SEP, 1)[1] for pair in jp.conditions for x, y in (pair, pair[::-1])
               if x.split(SEP, 1)[0] == a and written.index(y.split(SEP, 1)[0]) < written.index(a)}
        if not any(ca == a and n == 1 and set(c.split(",")) <= own for ca, c, n in people.caps):
            return (f"the LEFT JOIN of '{a}' (table '{tables[a]}') is not on a declared key of it, so one row may "
                    "match several of its rows")
    return None


def _route_left_lookup(
    sql: str, plan: ir.QueryPlan, people: Any, epsilon: float, delta: float, options: Mapping[str, Any],
    catalog: Mapping[str, TableSpec], find_synopsis: Callable[[str], tuple[int, str] | None],
) -> Route:
    """Rule 0, a LEFT JOIN from the private table to public lookups on their declared keys: the one-table path only
    (``_route_lookup_one_table``): each private row is kept once, whether or not it matches. Everything else is
    refused (free): the join mechanisms, and a LEFT JOIN that is not such a lookup."""
    assert plan.join is not None
    forced = options.get("mechanism", "auto")
    problem = _left_problem(plan.join, people, catalog)
    if problem is not None:
        refs = [(t, c, r) for _, t in plan.join.inputs if not catalog[t].public for c, r in catalog[t].references.items()
                if getattr(catalog.get(r.split(".", 1)[0]), "public", False)]  # a reference into a public lookup
        example = f" (as '{refs[0][0]}' declares references={{'{refs[0][1]}': '{refs[0][2]}'}})" if refs else ""
        owned = "do not each belong to one person" in problem or "private tables (" in problem
        raise PolicyError(problem, hint="use an inner JOIN (the join mechanisms answer inner joins)" if owned else
                          f"LEFT JOIN each public lookup on the column the private table references{example}, or use "
                          "an inner JOIN")
    joins_only = sorted(set(options) & _JOIN_OPTIONS)
    if joins_only or forced not in _LOOKUP_NAMES:
        what = f"the option(s) {', '.join(joins_only)} ask" if joins_only else f"mechanism '{forced}' asks"
        raise PolicyError(f"a LEFT JOIN is answered by the one-table mechanisms (gaussian, laplace, sparse_histogram, "
                          f"exponential) "
                          f"over the joined rows; {what} for the join mechanisms, which join inner only",
                          hint="omit it, or use an inner JOIN")
    one = _route_lookup_one_table(sql, plan, people, epsilon, delta, options, catalog, find_synopsis)
    if one is None:
        why = (f"GROUP BY {', '.join(k.sql for k in plan.join.keys if k.kind in ('year', 'derived'))} (declare the "
               "column's domain and group by the column, or use an inner JOIN)"
               if any(k.kind in ("year", "derived") for k in plan.join.keys) else
               "the private table reaches its people through another table (its owner is not one of its columns)")
        raise PolicyError(f"this LEFT JOIN cannot be answered as one table: {why}",
                          hint="use an inner JOIN, or group by a column with a declared domain")
    return one


def _route_lookup_join(
    sql: str, plan: ir.QueryPlan, epsilon: float, delta: float, options: Mapping[str, Any],
    catalog: Mapping[str, TableSpec], find_synopsis: Callable[[str], tuple[int, str] | None],
) -> Route:
    """Rule 0, a scalar aggregate over a lookup join (``_lookup_join``) asked for the join mechanisms
    (mechanism='clipped_gaussian', or clip_norm; q, degree_caps, tau_base and max_tuples_per_user, which only DP-S4S
    and R2T read, route it to DP-S4S; otherwise ``_route_lookup_one_table``): the
    per-person clipping path of a grouped join over one constant key (a public key set of one value, read from
    no data), no sampling. Its quantity is the join's: each private input capped at L rows per unit before the
    WHERE, as every join mechanism caps its inputs.

    Sensitivity: the bounded query caps the private input at its per-unit row cap L (``p.pid <= L``) and
    each public input at one row per joined key value (``r.region <= 1``), stable caps chosen from the
    catalog; a private row then joins at most one row of each public table, so one person is in at most
    Delta = L join tuples, each worth at most M = max(|lo|, |hi|) (count: 1): a person's total moves the
    released sum by at most C = Delta * M, the sensitivity of the one-table query over the private table.
    The clipped Gaussian (``dpsql.mechanisms.s4s_vector``, path "clip", d = 1) is calibrated to exactly
    that C, the default clip_norm (nothing is clipped). A public table whose key value is duplicated loses
    the extra rows to its cap (the answer changes, the sensitivity does not); a public table joined on a
    column with a fan-out (degree bound > 1) is not a lookup and stays on DP-S4S."""
    assert plan.join is not None and not plan.join.keys
    owner = plan.join.slots[0]
    # one constant group: its key set is a literal (no data read), every tuple in it, never released (plan.keys is empty)
    one = ir.JoinKey("__k0", exp.cast(exp.Literal.number(0), "BIGINT"), "(none: one group, the scalar aggregate)",
                     "declared", owner.alias, owner.column, "BIGINT", (0,))
    grouped = dataclasses.replace(plan, join=dataclasses.replace(plan.join, keys=(one,)))
    mech = _several(REGISTRY[MechanismName.JOIN_CLIPPED], grouped, grouped=True)
    _check_applicable(mech, options)
    req = Request.asking(text=sql, epsilon=epsilon, delta=delta, options=options, table=plan.table, unit="",
                         catalog=catalog, plan=grouped, find_synopsis=find_synopsis)
    reason = ("join of one private table with public lookup tables on their keys: each private row joins at most one "
              "lookup row, so the sensitivity is the one-table query's (Delta x max|value|); the exact total of the capped "
              "join plus Gaussian noise (per-person clipping path, nothing clipped; no sampling)")
    return _finish(req, mech, mech.calibrate(req, contribution(plan.table, {})), reason + _several_reason(plan))


def _left_public_keys(plan: ir.QueryPlan) -> PolicyError:
    """The refusal of a GROUP BY over undeclared public lookup columns in a query with a LEFT JOIN (public metadata
    only). A LEFT-joined lookup's column has a NULL group (its unmatched rows) beside its values, which no public key
    set holds. An inner-joined lookup's column has none: its public values are a key set the join mechanisms
    release in full, but they do not answer a LEFT JOIN (the one-table path, which does, releases declared domains
    only): that is its cause, and the NULL group is not."""
    assert plan.join is not None
    tables = dict(plan.join.inputs)
    public = [k for k in plan.join.keys if k.kind == "public"]
    outer = ", ".join(f"{tables.get(k.alias, k.alias)}.{k.column}" for k in public if k.alias in plan.join.left)
    inner = ", ".join(f"{tables.get(k.alias, k.alias)}.{k.column}" for k in public if k.alias not in plan.join.left)
    cols = ", ".join(c for c in (outer, inner) if c)
    why = []
    if outer:
        why.append(f"{outer} (LEFT-joined) has no declared domain, so no public key set with NULL (the unmatched "
                   "rows' group) is known to release in full")
    if inner:
        lefts = ", ".join(dict.fromkeys(tables.get(a, a) for a in plan.join.left))
        why.append(f"{inner} (inner-joined) has no declared domain: the public values of such a column are released "
                   f"in full by the join mechanisms only, which do not answer a query with a LEFT JOIN (of {lefts})")
    return PolicyError(f"GROUP BY over {cols} in a query with a LEFT JOIN: " + "; ".join(why),
                       hint=f"declare the domain of {cols} ({_declaration(plan)}): every declared key"
                            + (" and NULL are" if outer else " is") + " then released; or pass "
                            "mechanism='sparse_histogram' (keys released above a noisy threshold"
                            + (", NULL included)" if outer else ")")
                            + ("" if outer else "; or join the LEFT-joined lookup with an inner JOIN"))


def _declaration(plan: ir.QueryPlan) -> str:
    """The registration that declares the domains of a lookup join's public key columns, e.g. ``register table 'lk'
    with columns={'region': {'domain': [...]}}`` (public metadata: the plan's names only)."""
    assert plan.join is not None
    tables = dict(plan.join.inputs)
    by_table: dict[str, list[str]] = {}
    for k in plan.join.keys:
        if k.kind == "public":
            by_table.setdefault(tables.get(k.alias, k.alias), []).append(k.column)
    return "; ".join("register table '" + t + "' with columns={" + ", ".join(f"'{c}': {{'domain': [...]}}" for c in cs)
                     + "}" for t, cs in by_table.items())


def _route_lookup_one_table(
    sql: str, plan: ir.QueryPlan, people: Any, epsilon: float, delta: float, options: Mapping[str, Any],
    catalog: Mapping[str, TableSpec], find_synopsis: Callable[[str], tuple[int, str] | None], *,
    people_count: bool = False,
) -> Route | None:
    """Rule 0, a lookup join (``_lookup_join``) on the one-table path (``dpsql.mechanisms.lookup``): the joined
    rows are the private table's own rows, each reaching at most one row of each lookup table, so rules 3-4 apply
    to them with the private table's caps: a scalar aggregate or GROUP BY over declared (public) keys -> Gaussian
    (delta > 0) or Laplace (delta = 0); GROUP BY over other keys of the private table -> the Gaussian sparse
    histogram (delta > 0). None where this path does not apply (then the join rules decide): an owner that is not a
    column of the private table, GROUP BY year(col) (``dpsql.mechanisms.lookup.one_table_plan``), or, unless a
    mechanism is asked for, GROUP BY over undeclared columns of the public tables only (their values are a public
    key set: the join's clipping releases every key, as before lookup joins had this path)."""
    from dpsql.mechanisms.lookup import LookupJoin, one_table_plan

    assert plan.join is not None
    one = one_table_plan(plan, people, catalog)
    if one is None or (people_count and not (one.aggregates and all(a.kind == ir.COUNT_UNITS for a in one.aggregates))):
        return None  # (people_count: ``_people_count_plan``'s join, answered here for counts of its people only)
    forced = options.get("mechanism", "auto")
    kinds = {k.kind for k in plan.join.keys}
    if plan.join.left and forced == "auto" and "public" in kinds and "private" not in kinds:
        raise _left_public_keys(plan)
    if forced == "auto" and "public" in kinds and "private" not in kinds:
        # keys read from a public table's column: that table's values are a public key set, every key released by
        # the join's per-person clipping (the join rules), not thresholded by the sparse histogram
        if plan.join.one_table_only:  # the join rules answer COUNT, SUM and AVG only
            tables = dict(plan.join.inputs)
            cols = ", ".join(f"{tables.get(k.alias, k.alias)}.{k.column}" for k in plan.join.keys if k.kind == "public")
            what = ", ".join(dict.fromkeys(v.fragment or "the aggregate" for v in plan.join.one_table_only))
            raise PolicyError(f"{what} grouped by {cols}, a public lookup column without a declared domain: its key set "
                              "is released in full by the join mechanisms only, which answer COUNT(*), COUNT(col), SUM "
                              "and AVG only, without FILTER",
                              hint=f"declare the domain of {cols} ({_declaration(plan)}), "
                                   "or pass mechanism='sparse_histogram' (keys released above a noisy threshold)")
        if delta <= 0:  # the join rules need delta > 0; a declared domain is the Laplace path of this one
            tables = dict(plan.join.inputs)
            cols = ", ".join(f"{tables.get(k.alias, k.alias)}.{k.column}" for k in plan.join.keys if k.kind == "public")
            raise ConfigError("GROUP BY over joins is answered under (epsilon, delta)-DP and needs delta > 0",
                              hint=f"pass delta=1e-7 (for example), or declare the domain of {cols} ("
                                   f"{_declaration(plan)}): at delta = 0 the Laplace mechanism then "
                                   "answers it, every declared key released")
        return None
    _check_public_groups(one)
    if options.get("reuse") == "synopsis":  # a stored synopsis is of the table's rows, never of them joined with lookups
        joined = ("the join's tuples are several tables' rows joined" if people_count else
                  "a lookup join's rows are the table's rows joined with lookup rows")
        raise PolicyError(f"reuse='synopsis' reads a stored synopsis of one table's rows; {joined}, which no stored "
                          "synopsis holds", hint="omit the reuse "
                          "option (the query is then answered on its own, and charged: explain shows the cost)")
    quantiles = [a.sql for a in one.aggregates if a.kind in ir.QUANTILE_KINDS]
    if quantiles or forced == "exponential":
        others = [a.sql for a in one.aggregates if a.kind not in ir.QUANTILE_KINDS]
        if not quantiles or forced not in ("auto", "exponential"):
            raise PolicyError("mechanism 'exponential' answers quantiles (MIN, MAX, MEDIAN, PERCENTILE_CONT, QUANTILE)"
                              if not quantiles else f"quantiles (MIN, MAX, MEDIAN, PERCENTILE_CONT, QUANTILE) are "
                              f"answered by the exponential mechanism, not by mechanism '{forced}'",
                              hint="omit the mechanism option")
        if others:
            raise _mixed_quantiles(quantiles, others, bool(one.keys))
        name = MechanismName.EXPONENTIAL
        what = ("scalar quantile" if not one.keys else "quantile per public (declared) key, every key released") + \
               ": exponential mechanism over a public grid of the declared bounds (pure DP)"
    elif forced == "sparse_histogram" or (forced == "auto" and one.keys and not one.public_keys):
        if not one.keys:
            raise PolicyError("mechanism 'sparse_histogram' answers GROUP BY queries, and this query has none",
                              hint="omit the mechanism option")
        name, what = MechanismName.SPARSE_HISTOGRAM, _REASONS["sparse"]
    else:
        if one.keys and not one.public_keys:
            raise PolicyError(f"mechanism '{forced}' needs public keys, but the GROUP BY keys are not declared public",
                              hint="declare the key column's domain, or let dpsql choose the sparse histogram mechanism")
        name = MechanismName(forced) if forced != "auto" else (MechanismName.GAUSSIAN if delta > 0 else MechanismName.LAPLACE)
        kind = "scalar aggregate" if not one.keys else "GROUP BY over public (declared) keys, every key released"
        what = f"{kind}: {name} mechanism ({'delta > 0' if name == MechanismName.GAUSSIAN else 'delta = 0 (pure DP)'})"
    mech = LookupJoin(REGISTRY[name], plan.join, people, catalog, people_count=people_count)
    _check_applicable(mech, options)
    req = Request.asking(text=sql, epsilon=epsilon, delta=delta, options=options, table=one.table,
                         unit=one.table.privacy_unit, catalog=catalog, plan=one, find_synopsis=lambda _: None)
    left = (f" (LEFT JOIN of {', '.join(plan.join.left)}: every private row kept once, the lookup's columns NULL "
            "where no row matches)") if plan.join.left else ""
    if people_count:
        reason = ("COUNT(DISTINCT person) over a join whose every tuple belongs to one person: the joined tuples "
                  "(each input capped at its rows per joined value, as the join mechanisms cap them) are bounded as one "
                  f"table's rows whose unit is that person, each person counted once per group; {what}")
    else:
        reason = ("join of one private table with public lookup tables on their keys: each private row joins at most "
                  f"one lookup row{left} (each lookup capped at one row per key), so the joined rows are bounded as the "
                  f"private table's own (its per-person caps, the GROUP BY keys read from the joined rows); {what}")
    cal = mech.calibrate(req, contribution(one.table, options, grouped=one.is_grouped))
    return _finish(req, mech, cal, reason)


def _several(mech: Mechanism, plan: ir.QueryPlan, *, grouped: bool = False) -> Mechanism:
    """A join query with several base aggregates (AVG is two): one run of ``mech`` per base aggregate,
    the budget split by basic composition (``dpsql.mechanisms.join_multi``)."""
    assert plan.join is not None
    if len(plan.join.aggregates) <= 1:
        return mech
    from dpsql.mechanisms.join_multi import MultiGroupedJoinMechanism, MultiJoinMechanism

    return MultiGroupedJoinMechanism(mech) if grouped else MultiJoinMechanism(mech)


def _several_reason(plan: ir.QueryPlan) -> str:
    assert plan.join is not None
    m = len(plan.join.aggregates)
    return f"; {m} base aggregates, one run each (explain's 'aggregates')" if m > 1 else ""


def _route_grouped_join(
    sql: str, plan: ir.QueryPlan, epsilon: float, delta: float, options: Mapping[str, Any],
    catalog: Mapping[str, TableSpec], find_synopsis: Callable[[str], tuple[int, str] | None],
) -> Route:
    """Rule 0, GROUP BY: per-user clipping (one person per tuple) or DP-S4S's vector form."""
    from dpsql.mechanisms.s4s_vector import route_name
    from dpsql.plan.joins import bound_people

    assert plan.join is not None
    people = bound_people(plan.join, dict(catalog))
    name = route_name(dict(options), people)
    mech = _several(_GROUPED[name] if name == MechanismName.R2T else REGISTRY[name], plan, grouped=True)
    _check_applicable(mech, options)
    req = Request.asking(text=sql, epsilon=epsilon, delta=delta, options=options, table=plan.table, unit="",
                         catalog=catalog, plan=plan, find_synopsis=find_synopsis)
    if name == MechanismName.JOIN_CLIPPED:
        reason = ("GROUP BY over a join with one person per tuple: per-person L2 clipping of the vector of group totals "
                  "in the engine, Gaussian noise (no sampling)")
    else:
        # mechanism 'r2t' over a GROUP BY is the vector form's unsampled variant (q = 1): say so, as the label is R2T's
        variant = "unsampled variant (mechanism 'r2t'), " if name == MechanismName.R2T else ""
        reason = (f"GROUP BY over a join: DP-S4S vector form, {variant}q = "
                  f"{options.get('q', 1.0 if name == MechanismName.R2T else 1 / 16):g} (SVT over tau, SOCP truncation, "
                  "smooth-sensitivity Gaussian under Renyi DP)")
    return _finish(req, mech, mech.calibrate(req, contribution(plan.table, {})), reason + _several_reason(plan))


def _single_range_count(plan: ir.QueryPlan) -> bool:
    return not plan.keys and [a.kind for a in plan.aggregates] == [ir.COUNT_STAR] and plan.where is not None


def _check_bin_keys(plan: ir.QueryPlan) -> None:
    """``col_bin`` names the bins of an ordered domain: only a DAWA histogram can group by it."""
    for k in plan.keys:
        for c in k.expr.find_all(exp.Column):
            if c.name.lower() not in plan.table.schema:
                raise PolicyError(
                    f"'{c.name}' (the bins of an ordered domain) can only be used in a histogram "
                    f"SELECT {c.name}, COUNT(*) FROM {plan.table.name} GROUP BY {c.name}, which DAWA answers",
                    hint="for other aggregates group by the column itself or an expression such as floor(col / 10) * 10",
                )


def route_profile(table: str, epsilon: float, options: Mapping[str, Any], catalog: Mapping[str, TableSpec]) -> Route:
    """``Session.suggest_caps``: the contribution profile of one registered table."""
    from dpsql.mechanisms.profile import route_request as _profile_request
    from dpsql.plan.analyze import unit_problem

    name = table.lower() if isinstance(table, str) else table
    if name not in catalog:
        raise ConfigError(f"no table {table!r} is registered", hint="register it first (Session.tables lists them)")
    spec = catalog[name]
    if spec.public:
        raise PolicyError(f"table '{name}' is declared public: it holds no person, so there are no contributions per person "
                          "to advise caps on; nothing was charged", hint="ask for the caps of a table of people")
    unit = resolve_unit_column(spec, dict(catalog))
    if unit is None:
        raise PolicyError(unit_problem(spec, dict(catalog)))
    mech = REGISTRY[MechanismName.CONTRIBUTION_PROFILE]
    req = _profile_request(Request.asking(text=f"-- contribution profile of {name}", epsilon=epsilon, delta=0.0, options=options,
                                          table=spec, unit=unit, catalog=catalog))
    return _finish(req, mech, mech.calibrate(req, contribution(spec, {})), "caps advice: noisy per-person contribution histograms")
