"""The query plan IR: what a query asks, in terms of public metadata only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from dpsql.catalog import TableSpec

# aggregate kinds understood by the bounding rewrite
COUNT_STAR = "count_star"  # COUNT(*): rows kept per (unit, group), <= k
COUNT_COL = "count"  # COUNT(col): non-null rows kept, <= k
COUNT_UNITS = "count_units"  # COUNT(DISTINCT unit): 0 or 1 per (unit, group)
SUM = "sum"  # SUM(col): clamped to bounds
AVG = "avg"  # AVG(col) = mid + SUM(col - mid) / COUNT(col)


@dataclass(frozen=True)
class Aggregate:
    kind: str
    column: str | None  # table column (lower case) or None for COUNT(*)/COUNT(DISTINCT unit)
    name: str  # internal column name in the released table, e.g. "__a0"
    sql: str  # normalised SQL text of the aggregate, for matching
    bounds: tuple[float, float] | None = None


@dataclass(frozen=True)
class GroupKey:
    expr: exp.Expression  # over table columns (column names lower case, unqualified)
    name: str  # internal name "__k0"
    sql: str
    domain: tuple[Any, ...] | None = None  # public key domain if declared for a plain column


@dataclass
class OutputColumn:
    name: str  # user-visible name
    expr: exp.Expression  # over internal names (__k*, __a*), i.e. post-processing
    source: str | None  # internal name when the output is a bare key/aggregate


@dataclass
class QueryPlan:
    sql: str
    table: TableSpec
    where: exp.Expression | None
    keys: list[GroupKey]
    aggregates: list[Aggregate]
    outputs: list[OutputColumn]
    having: exp.Expression | None = None  # over internal names
    order: list[exp.Ordered] = field(default_factory=list)  # over internal / output names
    limit: int | None = None
    offset: int | None = None

    @property
    def is_grouped(self) -> bool:
        return bool(self.keys)

    @property
    def public_keys(self) -> bool:
        return bool(self.keys) and all(k.domain is not None for k in self.keys)

    def aggregate_by_name(self, name: str) -> Aggregate:
        for a in self.aggregates:
            if a.name == name:
                return a
        raise KeyError(name)
