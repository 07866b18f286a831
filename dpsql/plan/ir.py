"""The query plan IR: what a query asks, in terms of public metadata only."""

from __future__ import annotations

import dataclasses
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
QUANTILE = "quantile"  # MEDIAN / PERCENTILE_CONT / QUANTILE(col, p): exponential mechanism (mechanisms.quantile)
MIN = "min"  # MIN(col): a low order statistic by the same mechanism
MAX = "max"  # MAX(col): a high order statistic by the same mechanism
QUANTILE_KINDS = (QUANTILE, MIN, MAX)
COUNT_DISTINCT = "count_distinct"  # COUNT(DISTINCT col), col not the unit: <= k values per (unit, group)
VAR_SAMP = "var_samp"  # VARIANCE / VAR / VAR_SAMP: from count, centred sum, centred sum of squares
VAR_POP = "var_pop"  # VAR_POP / VARP
STDDEV_SAMP = "stddev_samp"  # STDDEV / STD / STDDEV_SAMP / STDEV: sqrt of VAR_SAMP
STDDEV_POP = "stddev_pop"  # STDDEV_POP / STDEVP
#: aggregates released through (count, centred sum, centred sum of squares): dpsql.mechanisms.variance
VARIANCE_KINDS = (VAR_SAMP, VAR_POP, STDDEV_SAMP, STDDEV_POP)
COVAR_POP = "covar_pop"  # COVAR_POP(a, b): from count, centred sums of a, b and of a * b
COVAR_SAMP = "covar_samp"  # COVAR_SAMP(a, b)
CORR = "corr"  # CORR(a, b): also the centred sums of squares of a and b
REGR_SLOPE = "regr_slope"  # REGR_SLOPE(y, x): also the centred sum of squares of x (the second argument)
REGR_INTERCEPT = "regr_intercept"  # REGR_INTERCEPT(y, x)
REGR_COUNT = "regr_count"  # REGR_COUNT(y, x): the count of the pairs alone
REGR_AVGX = "regr_avgx"  # REGR_AVGX(y, x): count and centred sum of x
REGR_AVGY = "regr_avgy"  # REGR_AVGY(y, x): count and centred sum of y
REGR_SXX = "regr_sxx"  # REGR_SXX(y, x): count, centred sum and sum of squares of x
REGR_SYY = "regr_syy"  # REGR_SYY(y, x): count, centred sum and sum of squares of y
REGR_SXY = "regr_sxy"  # REGR_SXY(y, x): COVAR_POP's sums
REGR_R2 = "regr_r2"  # REGR_R2(y, x): CORR's sums
#: aggregates of two values (``Aggregate.second``) released through centred sums: dpsql.mechanisms.covariance
PAIR_KINDS = (COVAR_POP, COVAR_SAMP, CORR, REGR_SLOPE, REGR_INTERCEPT, REGR_COUNT, REGR_AVGX, REGR_AVGY, REGR_SXX,
              REGR_SYY, REGR_SXY, REGR_R2)
#: aggregates that read a clamped value (a column, or ``Aggregate.value``)
VALUE_KINDS = (SUM, AVG, *VARIANCE_KINDS, *PAIR_KINDS)
#: aggregates whose clamped values are centred on their bounds' midpoint
CENTRED_KINDS = (AVG, *VARIANCE_KINDS, *PAIR_KINDS)


@dataclass(frozen=True)
class Aggregate:
    kind: str
    column: str | None  # table column (lower case) or None for COUNT(*)/COUNT(DISTINCT unit)
    name: str  # internal column name in the released table, e.g. "__a0"
    sql: str  # normalised SQL text of the aggregate, for matching
    bounds: tuple[float, float] | None = None
    quantile: float | None = None  # p in [0, 1] for QUANTILE (0 for MIN, 1 for MAX)
    #: the expression the aggregate reads when it is not a plain column (``column`` is then None):
    #: over unqualified lower-case table columns, clamped to ``bounds`` in the bounded query
    value: exp.Expression | None = None
    #: a PAIR_KINDS aggregate's second argument: a VAR_POP aggregate of the same name whose column,
    #: value and bounds are those of the second argument (its clamped, centred value)
    second: Aggregate | None = None


@dataclass(frozen=True)
class GroupKey:
    expr: exp.Expression  # over table columns (column names lower case, unqualified)
    name: str  # internal name "__k0"
    sql: str
    domain: tuple[Any, ...] | None = None  # public key domain if declared for a plain column
    listed: bool = False  # the domain is the WHERE's list of the column's values (``analyze.listed_domain``)


@dataclass
class OutputColumn:
    name: str  # user-visible name
    expr: exp.Expression  # over internal names (__k*, __a*), i.e. post-processing
    source: str | None  # internal name when the output is a bare key/aggregate


@dataclass(frozen=True)
class Hop:
    """One declared reference followed: ``table.column`` -> ``target_table.target_column`` (a key)."""

    table: str
    column: str
    target_table: str
    target_column: str


@dataclass(frozen=True)
class UserSlot:
    """One way a join tuple reaches a person: from input ``alias``, through ``hops`` (empty: the
    input's own privacy unit ``column``; one hop to a person table's unit: the foreign key's value
    is the person; longer: looked up through the chain of keys). ``person_class``: the class of
    join columns that holds the person's id (slots with the same person table and class are the
    same person in every tuple); None for a looked-up chain (a class of its own)."""

    alias: str
    hops: tuple[Hop, ...]
    person_table: str
    column: str
    person_class: str | None


@dataclass(frozen=True)
class JoinKey:
    """A GROUP BY key of a join whose key set is public (``dpsql.plan.join_groups``).

    ``kind``: ``declared`` (a column with a declared ``domain``: ``domain`` holds its typed values),
    ``year`` (year(col) of a column with a declared date/timestamp range: ``domain`` holds the
    years), ``public`` (a column of a public table: the key set is that table's distinct non-NULL
    values after the WHERE conjuncts over that table alone, read from the public table in the
    query; ``domain`` is None), ``derived`` (an expression with a public key set: over the columns of one
    public table, over columns with finite public values, or a CASE whose results are literals; ``domain`` is
    None, the key set is computed in the query from public values only), ``private`` (a column of a private table with no declared domain: no public
    key set; answered by the sparse histogram on a lookup join only, else refused with ``refusal``). ``expr`` is
    over flat column names; ``sql_type`` its SQL type."""

    name: str  #: internal name ``__k<i>``
    expr: exp.Expression
    sql: str
    kind: str
    alias: str
    column: str
    sql_type: str
    domain: tuple[Any, ...] | None = None
    #: kind ``private`` (a column of a private table with no declared domain): why the join mechanisms refuse
    #: it (a ``Violation``); only the one-table path of a lookup join answers it (``dpsql.mechanisms.lookup``)
    refusal: Any = None
    #: kind ``derived`` (an expression over columns, ``dpsql.plan.join_groups``): its written form over flat column
    #: names (unquoted), by which the SELECT list, HAVING and ORDER BY name the key
    match: str | None = None
    #: kind ``derived`` over columns with finite public values: per column read, (flat name, SQL type, its values);
    #: the key set is the expression's distinct values over their product (empty: a constant expression)
    value_sets: tuple[tuple[str, str, tuple[Any, ...]], ...] | None = None
    #: kind ``derived`` for a CASE whose every result is a literal: those results (None for NULL), the key set
    results: tuple[Any, ...] | None = None
    #: kind ``derived``: the expression as written over flat column names, before typing (``expr`` is its total,
    #: canonical rendering); the one-table path of a lookup join types it again as its own key
    written: exp.Expression | None = None


@dataclass(frozen=True)
class JoinAggregate:
    """One base aggregate of a join query: COUNT(*), COUNT(expr) or SUM(expr) (an AVG is a SUM and a
    COUNT of the same values). ``value`` is over flat column names; ``sql`` names it for explain."""

    kind: str
    value: exp.Expression | None
    bounds: tuple[float, float]
    sql: str


@dataclass(frozen=True)
class JoinPlan:
    """An aggregate over an inner equi-join (``dpsql.plan.joins``); public metadata only.

    ``inputs``: (alias, table name) in FROM order; ``conditions``: equalities between flat column
    names ``<alias>__<column>``; ``where`` and ``value`` are over flat names (``flat_schema``);
    ``kind``: count_star | count | sum; ``bounds``: the aggregate's per-tuple value bounds.
    ``aggregates``: with several base aggregates, all of them (``kind``, ``value`` and ``bounds``
    are then the first's); each is answered on its own plan, :meth:`for_aggregate`."""

    inputs: tuple[tuple[str, str], ...]
    conditions: tuple[tuple[str, str], ...]
    where: exp.Expression | None
    kind: str
    value: exp.Expression | None
    bounds: tuple[float, float]
    slots: tuple[UserSlot, ...]
    flat_schema: dict[str, str]
    #: (alias, key column(s)) of inputs that the join enters through a declared key (a hop of a
    #: user slot performed by the join's own equalities): the join SQL keeps only the rows whose
    #: key value occurs once in the base table, so such a hop reaches exactly one row
    unique_keys: tuple[tuple[str, str], ...] = ()
    #: GROUP BY keys over public key sets (``dpsql.plan.join_groups``); () for a scalar aggregate
    keys: tuple[JoinKey, ...] = ()
    #: the base aggregates when there are several (``dpsql.mechanisms.join_multi``); () for one
    aggregates: tuple[JoinAggregate, ...] = ()
    #: aliases of the inputs entered by a LEFT JOIN (public lookups on their declared keys only: the route
    #: refuses every other LEFT JOIN), in FROM order: every row of the inputs before them kept, their columns NULL
    #: where no row matches (``dpsql.mechanisms.lookup``)
    left: tuple[str, ...] = ()
    #: a LEFT JOIN's ON conditions beside its key equalities: (the LEFT-joined alias, a condition over flat names of
    #: that input and those before it); each decides which rows match a lookup row, never drops one (SQL's ON)
    left_on: tuple[tuple[str, exp.Expression], ...] = ()
    #: aggregates the join mechanisms do not answer but the one-table mechanisms do (COUNT(DISTINCT ...), MIN, MAX,
    #: quantiles, VARIANCE, STDDEV, COVAR_*, CORR, REGR_*): why the join rules refuse them (``Violation``s); only
    #: the one-table path of a lookup join answers the query then (``dpsql.mechanisms.lookup``), from ``statement``
    one_table_only: tuple[Any, ...] = ()
    #: with ``one_table_only``: the query over the join's flat column names (``<alias>__<column>``) as one table's,
    #: each column marked as written (messages quote the query), its FROM naming :data:`dpsql.mechanisms.lookup.VIEW`
    statement: exp.Select | None = None

    def for_aggregate(self, j: int) -> JoinPlan:
        """The single-aggregate plan of base aggregate ``j``: the same join, WHERE, keys and people."""
        a = self.aggregates[j]
        return dataclasses.replace(self, kind=a.kind, value=a.value, bounds=a.bounds, aggregates=())

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": [f"{t} AS {a}" for a, t in self.inputs],
            "on": [f"{a.replace('__', '.', 1)} = {b.replace('__', '.', 1)}" for a, b in self.conditions],
            "aggregate": self.kind,
            "value_bounds": list(self.bounds),
            "user_slots": [
                f"{s.alias}.{s.column}" + "".join(f" -> {h.target_table}.{h.target_column}" for h in s.hops)
                + f" ({s.person_table})" for s in self.slots
            ],
        }


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
    #: QUALIFY (over internal / output names): a filter on the windows over the released rows (dpsql.plan.windows)
    qualify: exp.Expression | None = None
    limit: int | None = None
    offset: int | None = None
    join: JoinPlan | None = None  # a join query (or a table with several paths to people)

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
