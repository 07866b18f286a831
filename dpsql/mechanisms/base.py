"""The Mechanism interface: what every mechanism states in code, and the request it answers.

A mechanism is one object registered under a :class:`MechanismName` in
``dpsql.mechanisms.registry.REGISTRY``. The Session drives every mechanism through the same
steps, in this order (``dpsql/session.py``):

1. ``calibrate(request, contribution)``: from public metadata and (epsilon, delta) only --
   the catalog, the analysed query, the contribution caps -- never from data. Refusals here
   (PolicyError, ConfigError) cost nothing.
2. ``describe(calibration)``: the one description used both by ``explain`` and by the ledger
   row (label, cost, parameters, notes, and which earlier release it reuses, if any).
3. ``bounded(calibration, salt, ops)``: the bounded relation as a sqlglot AST, built from the
   shared bounding steps of ``dpsql.rewrite.bound`` over the backend's building blocks ``ops``
   (``None`` when no private row is read, e.g. an answer from a stored synopsis; a
   ``dpsql.engine.base.BoundedBatch`` of several, read in turn, for a join with several aggregates).
   The Session renders and runs it on the execution backend.
4. ``release(calibration, bounded_rows, rng)``: noise, thresholds and rounding on the fetched
   Arrow table; returns :class:`Released`: the released values under the plan's internal
   names (``__k*`` keys, ``__a*`` aggregates), their accuracy, and what the ledger keeps.

Post-processing (outputs, HAVING, ORDER BY, LIMIT) is not a mechanism's business: it runs on
the released values in ``dpsql.postprocess``, which needs only ``released_types`` (the SQL type
of each released aggregate) and ``key_domain`` (the public key values, when the keys are public).

Optional: ``check_public(calibration, engine)``, run with step 3 before the charge, may read public
tables only (``engine`` is ``dpsql.engine.PublicReads``, which refuses any other). The Session calls
``bounded`` and ``release`` through ``dpsql.mechanisms.registry.Route``, which refuses a relation
that reads private rows under a description charging nothing, and a BIGINT aggregate released as
anything but integers (docs/architecture.md, "Adding a mechanism": what the core enforces and what
it trusts the mechanism for).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
from sqlglot import exp

from dpsql.budget import Budget, calibration_value, recorded
from dpsql.catalog import TableSpec
from dpsql.engine.base import BoundedBatch, SqlOps
from dpsql.errors import ConfigError, PolicyError
from dpsql.noise import NoiseSource
from dpsql.plan import ir
from dpsql.plan.workload import Workload
from dpsql.rewrite.bound import Caps


class MechanismName(enum.StrEnum):
    """The mechanisms dpsql can route a query to (the ``mechanism`` option takes these values)."""

    GAUSSIAN = "gaussian"
    LAPLACE = "laplace"
    SPARSE_HISTOGRAM = "sparse_histogram"
    DAWA = "dawa"
    CONTRIBUTION_PROFILE = "contribution_profile"
    DP_S4S = "dp_s4s"
    R2T = "r2t"
    EXPONENTIAL = "exponential"
    PUBLIC_DOMAIN = "public_domain"
    DP_S4S_VECTOR = "dp_s4s_vector"
    JOIN_CLIPPED = "clipped_gaussian"


@dataclass(frozen=True)
class Request:
    """One analyst request, validated, in terms of public metadata only.

    ``plan`` is the analysed query (None for a workload passed to ``query_many``);
    ``workload`` the range workload it amounts to, when it is one (``dpsql.plan.workload``);
    ``find_synopsis`` looks up a released synopsis by key in the ledger (released values only).

    ``epsilon`` and ``delta`` are what the mechanism calibrates with: built by :meth:`asking`, the largest
    floats whose exact binary values are at most the decimals the ledger records for the analyst's
    ``asked`` budget (``dpsql.budget.calibration_value``). The router records a description's cost
    through :meth:`record` (``dpsql.budget.recorded``): never less than the binary values it calibrated.
    """

    text: str
    epsilon: float
    delta: float
    options: Mapping[str, Any]
    table: TableSpec
    unit: str
    catalog: Mapping[str, TableSpec]
    plan: ir.QueryPlan | None = None
    workload: Workload | None = None
    find_synopsis: Callable[[str], tuple[int, str] | None] = field(default=lambda key: None)
    #: the budget the analyst asked for, as the ledger records it (None: a request built without one,
    #: whose costs are recorded by their binary values rounded up)
    asked: Budget | None = None

    @classmethod
    def asking(cls, epsilon: float, delta: float, **fields: Any) -> Request:
        """A request for the budget (``epsilon``, ``delta``) as the analyst asked for it (checked floats,
        read as decimals by the rounding rule): the one place a query's budget becomes the numbers
        mechanisms calibrate with."""
        asked = Budget(epsilon, delta)
        return cls(epsilon=calibration_value(asked.epsilon), delta=calibration_value(asked.delta), asked=asked,
                   **fields)

    def record(self, cost: Budget) -> Budget:
        """The ledger's record of a mechanism's ``cost`` for this request (``dpsql.budget.recorded``)."""
        return recorded(cost, self.asked)

    @property
    def tables(self) -> list[str]:
        if self.plan is not None and self.plan.join is not None:
            return list(dict.fromkeys(t for _, t in self.plan.join.inputs))
        return [self.table.name]


@dataclass(frozen=True)
class Description:
    """What a calibrated mechanism will do, for ``explain`` and for the ledger row alike."""

    label: str
    cost: Budget
    parameters: dict[str, Any]
    notes: tuple[str, ...] = ()
    #: the ledger entry whose released synopsis answers this request (a zero-cost reuse)
    reuse_of: int | None = None

    @property
    def details(self) -> dict[str, Any]:
        """The parameters a Release reports (all but the internal per-column noise ``scales``)."""
        return {k: v for k, v in self.parameters.items() if k != "scales"}


@dataclass
class Released:
    """A mechanism's output: released (noised) values only.

    ``table``: keys and aggregates under the plan's internal names, or, when ``final``, the
    table handed to the caller as it is (a workload's ``(query, count)`` rows).
    ``accuracy``: per internal aggregate name. ``row_accuracy``: per internal aggregate name,
    a per-row 95% half-width that travels with its row through post-processing (``row_noise_std``:
    likewise, a per-row noise standard deviation).
    ``commit``: extra keyword arguments for ``Ledger.commit`` (a synopsis to keep, counts).
    """

    table: pa.Table
    accuracy: dict[str, dict[str, Any]]
    row_accuracy: dict[str, pa.Array] = field(default_factory=dict)
    #: per internal aggregate name, a per-row noise standard deviation, travelling as ``row_accuracy``
    row_noise_std: dict[str, pa.Array] = field(default_factory=dict)
    commit: dict[str, Any] = field(default_factory=dict)
    final: bool = False
    #: values computed from the released ones (post-processing) that the Release's details carry
    details: dict[str, Any] = field(default_factory=dict)
    #: notes on the released values (post-processing: a function of them and public settings only)
    notes: list[str] = field(default_factory=list)
    #: notes on the rows the caller is shown: per note, one flag per released row (riding along through
    #: HAVING, ORDER BY and LIMIT, as ``row_accuracy``) and the note for (flagged rows shown, rows shown), or
    #: None (post-processing, as ``notes``)
    row_notes: list[tuple[pa.Array, Callable[[int, int], str | None]]] = field(default_factory=list)


class Mechanism(Protocol):
    """The interface every registered mechanism implements (see the module docstring)."""

    @property
    def name(self) -> str:
        """Its ``MechanismName`` (a plugged mechanism: the name it was plugged in under, ``registry.plug_in``)."""

    @property
    def options(self) -> frozenset[str]:
        """The query options this mechanism reads (besides ``mechanism``)."""

    def calibrate(self, request: Request, contribution: Caps) -> Any: ...

    def describe(self, calibration: Any) -> Description: ...

    def bounded(self, calibration: Any, salt: str, ops: SqlOps) -> exp.Expression | BoundedBatch | None: ...

    def released_types(self, calibration: Any) -> dict[str, str]: ...

    def key_domain(self, calibration: Any) -> pa.Table | None: ...

    def release(self, calibration: Any, bounded: Any, rng: NoiseSource) -> Released: ...


def fmt_cap(v: float) -> str:
    return "unlimited" if math.isinf(v) else str(int(v))


def lowered_cap(table: TableSpec, options: Mapping[str, Any], key: str) -> float:
    """A contribution cap for this request: the registered one, or a lower one from the options.

    Owner policy wins: lowering an enforced cap only adds bias (less noise, never less privacy);
    raising it above what the data owner registered is refused before any charge.
    """
    registered = table.rows_per_unit_cap if key == "max_rows_per_unit" else float(getattr(table, key))
    if key not in options:
        return float(registered)
    v = options[key]
    if v > registered:
        raise PolicyError(
            f"option {key}={v} is above the cap {fmt_cap(registered)} that the data owner registered for table '{table.name}'",
            hint=f"pass {key} <= {fmt_cap(registered)}, or omit it",
        )
    return float(v)


def contribution(table: TableSpec, options: Mapping[str, Any], *, grouped: bool = True) -> Caps:
    """The contribution model of a request: one meaning per query whatever mechanism answers it.

    * A GROUP BY keeps at most k = ``max_rows_per_group`` rows per person in each group, in at most
      C_u = ``max_groups_per_unit`` groups (and at most L rows in all when the owner declared
      ``max_rows_per_unit``).
    * An ungrouped aggregate (a scalar, a range count) keeps at most L = ``max_rows_per_unit``
      rows per person after the WHERE (default C_u * k, the most a GROUP BY can keep).

    Caps come from the table's registration, lowered by options if asked (never raised).
    """
    if not grouped:
        for key in ("max_groups_per_unit", "max_rows_per_group"):
            if key in options:
                err = ConfigError(
                    f"option {key} applies to GROUP BY queries: an ungrouped aggregate keeps at most max_rows_per_unit "
                    "rows per person",
                    hint="use the option max_rows_per_unit instead",
                )
                err.inapplicable = frozenset(k for k in ("max_groups_per_unit", "max_rows_per_group") if k in options)
                raise err
        return Caps(1, lowered_cap(table, options, "max_rows_per_unit"))
    if "max_rows_per_unit" in options and table.max_rows_per_unit is None:
        err = ConfigError(
            "option max_rows_per_unit applies to ungrouped aggregates and range workloads: a GROUP BY keeps "
            "max_rows_per_group rows per person in each of at most max_groups_per_unit groups",
            hint="use the options max_rows_per_group and max_groups_per_unit",
        )
        err.inapplicable = frozenset({"max_rows_per_unit"})
        raise err
    unit_cap = lowered_cap(table, options, "max_rows_per_unit") if table.max_rows_per_unit is not None else math.inf
    return Caps(lowered_cap(table, options, "max_groups_per_unit"), lowered_cap(table, options, "max_rows_per_group"),
                unit_cap)
