"""SQL text + catalog -> QueryPlan. Pure: reads only public metadata, never a private row.

All violations of the DP subset are collected and raised together, each with line and column.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sqlglot import ErrorLevel, exp

from dpsql.catalog import OrderedDomain, TableSpec, reference_problems, unit_paths
from dpsql.errors import PolicyError, QueryError, UnsupportedQueryError, Violation
from dpsql.plan import ir, windows
from dpsql.plan.checks import (
    ANON_AGGS,
    FROM_ON,
    LIMIT_FORM,
    LIMIT_ZERO,
    OFFSET_SCALAR,
    SUPPORTED_AGGS,
    check_expression_functions,
    check_statement_shape,
    distinct_operand,
    is_aggregate,
    never_null_literal,
    output_name,
    row_count,
    violation,
    written_name,
)
from dpsql.plan.intervals import NoInterval, clamp_argument, clamp_bounds, declared_days, interval
from dpsql.plan.names import (
    alias_order_hint,
    did_you_mean,
    field_problem,
    qualifier,
    qualifier_problem,
    spell_aliases,
)
from dpsql.plan.parse import (
    DIALECT,
    as_written,
    keyword_offset,
    parse_statements,
    quoted,
    stands_for,
    statement_starts,
)
from dpsql.plan.quantiles import QUANTILE_AGGS, quantile_call, time_column_problem
from dpsql.plan.typer import (
    MAX_DEPTH,
    TypeRefusal,
    allow_list_problems,
    check_numeric_column,
    check_query_string_work,
    distinct_type_problem,
    func_name,
    parse_type,
    query_string_work,
    type_checked,
    type_distinct,
    type_domain,
    type_key,
    type_predicate,
    type_value,
)
from dpsql.plan.views import VALUES_IN_FROM, merge_views

_POLICY_PREFIX = "[policy] "


def unqualified(node: exp.Expression) -> exp.Expression:
    """A copy of ``node`` (an aggregate's argument, a condition) with its columns unqualified and
    lower-cased (the table's own names: one table per single-table query)."""
    out = node.copy()
    for c in out.find_all(exp.Column):
        c.set("table", None)
        c.set("db", None)
        c.set("catalog", None)
        c.set("this", exp.to_identifier(c.name.lower()))
    return out


#: bounds of SUM / AVG / VARIANCE / STDDEV arguments: at most this large in magnitude
MAX_BOUND = 1e15

#: ... and, unless zero, at least this large in magnitude and in width (noise scales stay normal doubles)
MIN_BOUND = 1e-100
#: at most this many aggregate calls in one query, and this many output columns: analysis and the bounded query
#: grow with them (checked on the parsed query, before any other analysis: a larger query is refused for free)
MAX_AGGREGATES = 1000
MAX_OUTPUT_COLUMNS = 1000


def exact_num(v: float) -> str:
    """A number as short as ``%g`` where that reads back as the same value, else its shortest exact spelling (so
    two close bounds never print as one)."""
    short = f"{v:g}"
    return short if float(short) == v else repr(float(v))


#: the most values a WHERE's list may give a GROUP BY column as its public key set (:func:`listed_domain`)
LISTED_KEYS_MAX = 10_000


def _listed_literal(node: exp.Expression) -> tuple[str, Any] | None:
    """A literal of a WHERE's list as (kind, value): ``("text", str)``, ``("number", its text)``, ``("bool", bool)``;
    ``("null", None)`` for NULL (it matches no row); None for anything else."""
    if isinstance(node, exp.Paren):
        return _listed_literal(node.this)
    if isinstance(node, exp.Null):
        return ("null", None)
    if isinstance(node, exp.Boolean):
        return ("bool", bool(node.this))
    if isinstance(node, exp.Literal):
        return ("text", node.this) if node.is_string else ("number", node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return ("number", "-" + node.this.this)
    return None


def listed_domain(column: str, where: exp.Expression | None, column_type: str | None) -> tuple[Any, ...] | None:
    """The public key set a WHERE gives a GROUP BY column without a declared domain: the values of its AND-ed
    ``column IN (literals)`` and ``column = literal`` conditions (their intersection where there are several), typed
    to the column as a declared domain is. Every row of the column outside them is filtered out by the WHERE itself,
    so releasing every listed key (a noisy 0 for a key no row holds) reads nothing but the query's text. None where
    there is no such condition, a literal is not of the column's kind (text for text, dates and timestamps, numbers
    for numbers, booleans for BOOLEAN), or the list is longer than :data:`LISTED_KEYS_MAX`."""
    if where is None or column_type is None:
        return None
    conjuncts, todo = [], [where]
    while todo:
        n = todo.pop()
        if isinstance(n, exp.Paren):
            todo.append(n.this)
        elif isinstance(n, exp.And):
            todo += [n.this, n.expression]
        else:
            conjuncts.append(n)

    def names(x: exp.Expression) -> bool:
        return isinstance(x, exp.Column) and x.name.lower() == column

    t = parse_type(column_type)
    kinds = {"varchar": "text", "date": "text", "timestamp": "text", "int": "number", "decimal": "number",
             "float": "number", "bool": "bool"}
    want = kinds.get(t.kind) if t.name != "FLOAT" else None  # (a FLOAT compares a listed double in single precision)
    # a number is listed as the column's own value only in its own form: an integer for integers (9007199254740992e0
    # is a double, which DuckDB compares a BIGINT with as a double), no exponent for decimals; checked exact below
    form = {"int": r"-?[0-9]+", "decimal": r"-?[0-9]+(\.[0-9]+)?"}.get(t.kind)
    found: tuple[Any, ...] | None = None
    for c in conjuncts:
        if isinstance(c, exp.In) and names(c.this) and not c.args.get("query") and not c.args.get("unnest") \
                and not c.args.get("field"):
            items = c.expressions
        elif isinstance(c, exp.EQ) and (names(c.this) or names(c.expression)):
            items = [c.expression if names(c.this) else c.this]
        else:
            continue
        lits = [_listed_literal(x) for x in items]
        if want is None or any(v is None or v[0] not in (want, "null") for v in lits) or (form is not None and any(
                v is not None and v[0] == "number" and not re.fullmatch(form, v[1]) for v in lits)):
            return None
        values = list(dict.fromkeys(v[1] for v in lits if v is not None and v[0] != "null"))
        if len(values) > LISTED_KEYS_MAX:
            return None
        try:
            typed = type_domain(tuple(values), column_type, column)
        except ValueError:  # two literals equal as the column's type ('1.0' and '1'), or a value it cannot hold
            try:
                typed = tuple(dict.fromkeys(type_domain((v,), column_type, column)[0] for v in values))
            except ValueError:
                return None
        held = set(typed)  # (once: a set per literal made a list of 10 000 decimals quadratic)
        if t.kind == "decimal" and any(decimal.Decimal(v[1]) not in held for v in lits if v is not None and v[0] == "number"):
            return None  # a value with more digits than the column's scale: no row holds it, DuckDB compares it wider
        found = typed if found is None else tuple(v for v in found if v in held)
    return found


def _norm(node: exp.Expression) -> str:
    """Normalised SQL of an expression over unqualified, lower-case column names and function
    names; string literals keep their case ('US' and 'us' are different keys)."""
    n = node.copy()
    for c in n.find_all(exp.Column):
        c.set("table", None)
        c.set("db", None)
        c.set("catalog", None)
        ident = c.this
        if isinstance(ident, exp.Identifier):
            c.set("this", exp.to_identifier(ident.name.lower()))
    for f in n.find_all(exp.Anonymous):
        if isinstance(f.this, str):
            f.set("this", f.this.lower())
    return n.sql(dialect=DIALECT, normalize=True, unsupported_level=ErrorLevel.IGNORE)  # a key to match, never run


def lower_columns(node: exp.Expression) -> None:
    """Spell every column of ``node`` as the catalog does (lower case; quoting kept), in place: the
    engine matches identifiers folding ASCII letters only, so ``"Ärger"`` must reach the source's
    ``ärger`` (``dpsql.engine.base.view_column``)."""
    for c in node.find_all(exp.Column):
        ident = c.this
        if isinstance(ident, exp.Identifier):
            ident.set("this", ident.name.lower())


_VALUE_KINDS: dict[type, str] = {
    exp.Sum: ir.SUM, exp.Avg: ir.AVG, exp.Variance: ir.VAR_SAMP, exp.VariancePop: ir.VAR_POP,
    exp.Stddev: ir.STDDEV_SAMP, exp.StddevSamp: ir.STDDEV_SAMP, exp.StddevPop: ir.STDDEV_POP,
}


#: aggregates of two bounded values (``ir.PAIR_KINDS``, ``dpsql.mechanisms.covariance``)
_PAIR_KINDS: dict[type, str] = {exp.CovarPop: ir.COVAR_POP, exp.CovarSamp: ir.COVAR_SAMP, exp.Corr: ir.CORR,
                                exp.RegrSlope: ir.REGR_SLOPE, exp.RegrIntercept: ir.REGR_INTERCEPT,
                                exp.RegrCount: ir.REGR_COUNT, exp.RegrAvgx: ir.REGR_AVGX, exp.RegrAvgy: ir.REGR_AVGY,
                                exp.RegrSxx: ir.REGR_SXX, exp.RegrSyy: ir.REGR_SYY, exp.RegrSxy: ir.REGR_SXY,
                                exp.RegrR2: ir.REGR_R2}


def _value_kind(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return ANON_AGGS[str(node.this).lower()]
    return _VALUE_KINDS[type(node)]


def _written(node: exp.Expression) -> str:
    """The aggregate's name for messages (VAR_SAMP for VARIANCE, as sqlglot reads it)."""
    if isinstance(node, exp.Anonymous):
        return str(node.this).upper()
    return {exp.Variance: "VARIANCE", exp.VariancePop: "VAR_POP", exp.Stddev: "STDDEV", exp.StddevSamp: "STDDEV_SAMP",
            exp.StddevPop: "STDDEV_POP", exp.Sum: "SUM", exp.Avg: "AVG", exp.CovarPop: "COVAR_POP",
            exp.CovarSamp: "COVAR_SAMP", exp.Corr: "CORR",
            **{t: k.upper() for t, k in _PAIR_KINDS.items()}}.get(type(node), type(node).__name__.upper())


def is_bin_column(name: str, table: TableSpec) -> bool:
    """``<col>_bin`` names the bins of ``col`` when ``col`` has a declared ordered domain."""
    base = name.lower().removesuffix("_bin")
    return name.lower().endswith("_bin") and base in table.columns and table.columns[base].ordered is not None


def integral_type(type_text: str | None) -> bool:
    """A column type that holds whole numbers only (integers, DECIMAL(p, 0)), or DATE (whole days)."""
    if not type_text:
        return False
    t = parse_type(type_text)
    return t.kind in ("int", "date") or (t.kind == "decimal" and t.scale == 0)


def one_value_per_bin(d: OrderedDomain, type_text: str | None) -> bool:
    """An ordered domain whose every bin holds one value of the column's type: unit bins from a
    whole lo over a whole-number column (a DOUBLE column's unit bins [k, k + 1) hold every value
    in between), or one-day bins from a midnight over a DATE column."""
    if not integral_type(type_text):
        return False
    if d.kind == "numeric":
        return d.width == 1.0 and float(d.lo).is_integer()
    if d.kind in ("date", "timestamp") and d.bin_seconds == 86400.0:  # (a DATE column's range given as midnights)
        lo = dt.datetime.fromisoformat(str(d.lo))
        return lo == dt.datetime(lo.year, lo.month, lo.day)
    return False


def resolve_unit_column(table: TableSpec, catalog: Mapping[str, TableSpec]) -> str | None:
    """The column of ``table`` that identifies a person, directly or through one foreign key.

    ``None`` unless the table reaches people through exactly one path that the per-unit bounding
    can enforce (design invariant 9): a table with several paths to a person (e.g. a sender and a
    receiver column, or its own unit plus a reference to another person table) would be bounded on
    only one of them, so it is refused (``unit_problem`` says why) until joins bound all of them.
    """
    paths = unit_paths(table, catalog)
    if len(paths) == 1 and paths[0].direct and paths[0].resolved and not reference_problems(table, catalog):
        # (a reference registered before its target is type-checked only now: '7' and '07' would be
        # two units of one person 7, also where the reference repeats the table's own unit column)
        return paths[0].column
    return None


def unit_problem(table: TableSpec, catalog: Mapping[str, TableSpec]) -> str:
    """Why ``resolve_unit_column`` found no single bounded path to a person (for error messages)."""
    paths = unit_paths(table, catalog)
    bad = reference_problems(table, catalog)
    if bad and len(paths) == 1 and paths[0].direct:
        return f"table '{table.name}': " + "; ".join(f"{p} (hint: the data owner must {fix})" for p, fix in bad)
    unresolved = [p for p in paths if not p.resolved]
    if unresolved:
        return (
            f"table '{table.name}' declares references to tables that are not registered ("
            + ", ".join(f"'{p.column}' -> {p.via}" for p in unresolved)
            + "): they may lead to a person, so the table cannot be bounded; register the referenced table or "
            "correct the reference"
        )
    if not paths:
        return (
            f"table '{table.name}' has no privacy unit column and reaches none through a foreign key to a registered "
            "table's privacy unit"
        )
    if len(paths) > 1:
        names = ", ".join(
            f"'{p.column}'" + (f" (references {p.via})" if p.via else " (its privacy unit)") for p in paths
        )
        return (
            f"table '{table.name}' reaches people through {len(paths)} paths ({names}); bounding covers one path only, "
            "so one person could contribute without bound through another: such tables are refused until joins bound every path"
        )
    p = paths[0]
    return (
        f"table '{table.name}' reaches people only through '{p.column}' (references {p.via}), which is not a privacy unit "
        "column: paths of several hops need joins, which are not supported yet"
    )


def _as_named(col: exp.Expression, column: str) -> str:
    """How a message names the column ``col`` reads: ``column``, or what the query wrote where a view's merge
    put ``col`` (a view's alias: ``SUM(x)`` for ``WITH v AS (SELECT product_id AS x ...)``)."""
    return column if as_written(col) is col else quoted(col)


def _agg_name(node: exp.Expression, sql: str) -> str:
    """An aggregate's name as the query spells it (``string_agg``, not sqlglot's GROUPCONCAT)."""
    while isinstance(node, (exp.IgnoreNulls, exp.RespectNulls)):
        node = node.this
    rendered = node.sql(dialect=DIALECT)
    return (written_name(node, sql, rendered=rendered) or rendered.split("(", 1)[0] or func_name(node)).upper()


#: the parts BigQuery's DATE_TRUNC(d, MONTH) names as a bare word, where date_trunc takes the part first, as text
_TRUNC_PARTS = frozenset({"microsecond", "millisecond", "second", "minute", "hour", "day", "week", "isoweek", "month",
                          "quarter", "year", "isoyear"})


def _part_first(c: exp.Column) -> str:
    """The fix for BigQuery's ``DATE_TRUNC(d, MONTH)``, which sqlglot reads as a truncation of a column ``MONTH``."""
    unit = c.parent.args.get("unit") if isinstance(c.parent, (exp.DateTrunc, exp.TimestampTrunc)) else None
    if c.arg_key != "this" or not isinstance(unit, exp.Var) or c.name.lower() not in _TRUNC_PARTS:
        return ""
    return (f" (hint: date_trunc takes the part first, as text: date_trunc('{c.name.lower()}', "
            f"{unit.name.lower()}))")


def _unsupported_aggregate(node: exp.Expression, sql: str) -> str:
    """The refusal of an aggregate that is not answered, naming its supported form when it has one
    (``approx_count_distinct(x)``: ``COUNT(DISTINCT x)``; ``count_if(c)``: ``COUNT(*) FILTER (WHERE c)``)."""
    msg = (f"aggregate {_agg_name(node, sql)} is not supported; use COUNT, SUM, AVG, VARIANCE, STDDEV, COVAR_POP, "
           "COVAR_SAMP, CORR, REGR_SLOPE, REGR_INTERCEPT, REGR_COUNT, REGR_AVGX, REGR_AVGY, REGR_SXX, REGR_SYY, "
           "REGR_SXY, REGR_R2, MIN, MAX, MEDIAN or QUANTILE")
    arg = node.this if isinstance(node, (exp.ApproxDistinct, exp.CountIf)) else None
    if isinstance(arg, exp.Column) and isinstance(node, exp.ApproxDistinct):
        return f"{msg}: the distinct values are counted exactly by COUNT(DISTINCT {quoted(arg)})"
    if arg is not None and isinstance(node, exp.CountIf):
        return f"{msg}: the rows where a condition holds are counted by COUNT(*) FILTER (WHERE {quoted(arg)})"
    form = _ANON_FORMS.get(str(node.this).lower()) if isinstance(node, exp.Anonymous) else None
    if form is not None:
        return (f"{msg}: BigQuery's {_agg_name(node, sql)} is {form} here (write {form}(...); the privacy unit and the "
                "bounds are declared when the table is registered, epsilon and delta are passed with the query)")
    return msg


#: BigQuery's older differential privacy aggregates -> the aggregate that answers them
_ANON_FORMS = {"anon_count": "COUNT", "anon_sum": "SUM", "anon_avg": "AVG", "anon_var_pop": "VAR_POP",
               "anon_stddev_pop": "STDDEV_POP", "anon_percentile_cont": "PERCENTILE_CONT", "anon_quantiles": "QUANTILE"}


def _ancestors(c: exp.Expression, root: exp.Expression) -> Iterator[exp.Expression]:
    """The nodes from ``c``'s parent up to ``root`` (included), innermost first."""
    p = c.parent
    while p is not None:
        yield p
        if p is root:
            return
        p = p.parent


def _in_subquery(c: exp.Expression, root: exp.Expression) -> bool:
    """Whether ``c`` lies in a SELECT nested inside ``root`` (e.g. ``WHERE x IN (SELECT ...)``)."""
    if c is root:
        return False
    p = c.parent
    while p is not None and p is not root:
        if isinstance(p, (exp.Select, exp.Subquery)):
            return True
        p = p.parent
    return False


def _filter_as_case(node: exp.Filter) -> exp.Expression | None:
    """``AGG(x) FILTER (WHERE c)`` as the aggregate of ``CASE WHEN c THEN x END`` (``THEN 1`` for ``COUNT(*)``),
    which skips the rows where ``c`` fails as FILTER does (they are NULL): the same aggregate, value bounds
    and sensitivity as the CASE form written out. COUNT, SUM, AVG and the variances (not DISTINCT); None
    for the others (MIN, MAX, quantiles take a plain column)."""
    agg, where = node.this, node.expression
    cond = where.this if isinstance(where, exp.Where) else where
    arg = agg.this if isinstance(agg, exp.AggFunc) else None
    if not isinstance(arg, exp.Expression) or isinstance(arg, exp.Distinct) or agg.expressions:
        return None
    if isinstance(agg, exp.Count):
        then = exp.Literal.number(1) if isinstance(arg, exp.Star) else arg.copy()
    elif isinstance(agg, (exp.Sum, exp.Avg, exp.Variance, exp.VariancePop, exp.Stddev, exp.StddevPop, exp.StddevSamp)):
        then = arg.copy()
    else:
        return None
    fixed = agg.copy()
    fixed.set("this", exp.Case(ifs=[exp.If(this=cond.copy(), true=then)]))
    return fixed


class _Builder:
    def __init__(self, sql: str, catalog: Mapping[str, TableSpec]) -> None:
        self.sql = sql
        self.catalog = catalog
        self.violations: list[Violation] = []
        self.aggregates: list[ir.Aggregate] = []
        self._aggregate_names: dict[tuple[object, ...], str] = {}  # the key of each of self.aggregates -> its name
        #: the violations that only say an argument has no usable bounds (none, too large or small, a single point),
        #: by id (held here: an id is never reused): REGR_COUNT needs none
        self._unbounded: dict[int, Violation] = {}
        self.keys: list[ir.GroupKey] = []
        self.table: TableSpec | None = None
        self.aliases: set[str] = set()
        self.select_items: list[exp.Expression] = []  # the select list, as written
        self.unit: str | None = None
        self._qualifier = ""

    # -- helpers ---------------------------------------------------------------------
    def bad(self, node: exp.Expression, message: str, *, policy: bool = False) -> None:
        v = violation(node, self.sql, message)
        if policy:
            v = Violation(_POLICY_PREFIX + v.message, v.line, v.col, v.fragment)
        self.violations.append(v)

    def type_check(self, node: exp.Expression, role: str, before: int) -> None:
        """Type ``node`` with dpsql's typer (only when the earlier checks found nothing in it)."""
        assert self.table is not None
        if len(self.violations) != before:
            return
        try:
            if role == "GROUP BY":
                type_key(node, self.table.schema)
            else:
                type_predicate(node, self.table.schema, role, own=False)
        except TypeRefusal as e:
            unknown = {(v.line, v.col) for v in self.violations if v.message.startswith("unknown column")}
            for n, msg in e.problems:
                at = violation(n if n is not None else node, self.sql, "")
                if msg.startswith("unknown column") and (at.line, at.col) in unknown:
                    continue  # named once already (GROUP BY 1 reads the SELECT list's column again)
                self.bad(n if n is not None else node, f"{role}: {msg}")

    def check_columns(self, node: exp.Expression, where: str, *, allow_aliases: bool | set[str] = False) -> None:
        """Report unknown tables and columns in ``node``. ``allow_aliases``: select-list aliases may be
        named (``True``: any of them; a set: those names only)."""
        assert self.table is not None
        aliases = allow_aliases if isinstance(allow_aliases, set) else self.aliases if allow_aliases else set()
        for c in node.find_all(exp.Column):
            if _in_subquery(c, node):
                continue  # a subquery is refused as a whole: its columns belong to its own FROM
            name = c.name.lower()
            qual = c.table.lower() if c.table else ""
            db = ".".join(str(c.args[k].name).lower() for k in ("catalog", "db") if c.args.get(k) is not None)
            if qual and (qual not in self._table_names or (db and db != self._qualifier)):
                self.bad(c, field_problem(c, where, self.table.schema, self._table_names)
                         or f"{where} refers to unknown table or alias '{(db + '.') if db else ''}{c.table}'")
                continue
            if not qual and name in aliases and (not self.table.schema or name not in self.table.schema):
                agg = next((a for a in _ancestors(c, node) if is_aggregate(a) and not windows.is_window_function(a)), None)
                if agg is None:
                    continue
                # an aggregate reads the table's rows, not the outputs: an alias there (of an aggregate: a
                # nested aggregate; of a key) names no column, and its value would be released as NULL
                self.bad(c, f"{where}: the select-list alias '{c.name}' cannot be named inside an aggregate "
                            f"({_agg_name(agg, self.sql)}): an aggregate reads the table's columns (hint: write "
                            "the aliased expression of columns there; an aggregate of an aggregate is not supported)")
                continue
            if self.table.schema and name not in self.table.schema:
                if where != "WHERE" and is_bin_column(name, self.table):
                    continue  # <col>_bin: the bins of a declared ordered domain (histograms)
                at = violation(c, self.sql, "")
                if any(v.message.startswith(f"unknown column '{c.name}'") and (v.line, v.col) == (at.line, at.col)
                       for v in self.violations):
                    continue  # the same column read again (GROUP BY 1, or an output's alias): named once
                self.bad(c, f"unknown column '{c.name}' in table '{self.table.name}' ({where})"
                            f"{self._later_alias(c, node, where) or _part_first(c) or did_you_mean(c.name, self.table.schema)}")

    def _later_alias(self, c: exp.Column, item: exp.Expression, where: str) -> str:
        """The fix for an output naming the alias of a later output (or its own), which DuckDB does not see there
        either (``RANK() OVER (ORDER BY n) AS r, COUNT(*) AS n``): :func:`alias_order_hint`, as over a join."""
        at = next((i for i, it in enumerate(self.select_items) if it is item), None)
        if where != "SELECT" or c.table or at is None:
            return ""
        return alias_order_hint(c.name, self.select_items, at)

    def spelled_items(self, items: list[exp.Expression]) -> tuple[list[exp.Expression], dict[str, exp.Expression]]:
        """Each select item's expression with the earlier aliases it names written out (``g AS a, a || 'x'
        AS b``: b is ``g || 'x'``), as DuckDB reads an output naming an earlier one; and the aliases so
        spelled out. A column of the table wins over an alias of its name (also as in DuckDB). WHERE and
        GROUP BY read an alias through this, so a chain of aliases is the expression written out."""
        assert self.table is not None
        spelled: list[exp.Expression] = []
        by_alias: dict[str, exp.Expression] = {}
        for it in items:
            inner = spell_aliases(it.unalias(), by_alias)
            spelled.append(inner)
            if isinstance(it, exp.Alias) and it.alias.lower() not in self.table.schema:
                by_alias[it.alias.lower()] = inner
        return spelled, by_alias

    def select_aliases(self, node: exp.Expression, items: list[exp.Expression]) -> exp.Expression:
        """``node`` (the WHERE) with each select-list alias it names replaced by the aliased expression
        (earlier aliases it names written out too), as DuckDB reads ``SELECT c AS country ... WHERE
        country <> 'US'``; a column of the table of that name wins (also as in DuckDB). An aliased
        aggregate is then refused as any aggregate in WHERE."""
        return spell_aliases(node, self.spelled_items(items)[1])

    # -- aggregates ------------------------------------------------------------------
    def aggregate_ref(self, node: exp.Expression, clause: str = "SELECT") -> exp.Expression | None:
        """Map an aggregate call to a column reference to its (noisy) released value."""
        assert self.table is not None
        if isinstance(node, exp.Filter):
            case = _filter_as_case(node)
            if case is None:
                self.bad(node, "an aggregate FILTER clause is answered for COUNT, SUM, AVG, VARIANCE and STDDEV only (as "
                               "the aggregate of CASE WHEN c THEN x END); move the condition into WHERE (a separate "
                               "query if the other aggregates must not have it)")
                return None
            # its condition typed as the condition it is (as WHERE's): a refusal there names FILTER, not the
            # aggregate nor the CASE it is answered as ("COUNT: a CASE / IF condition must be ...")
            where = node.expression
            before = len(self.violations)
            self.type_check(where.this if isinstance(where, exp.Where) else where, "FILTER", before)
            if len(self.violations) != before:
                return None
            node = case
        arg = node.expressions[0] if isinstance(node, exp.Anonymous) and len(node.expressions) == 1 else node.this
        if isinstance(node, exp.Anonymous) and len(node.expressions) != 1 and str(node.this).lower() in ANON_AGGS:
            self.bad(node, f"{node.name.upper()} takes one argument")
            return None
        kind: str | None = None
        column: str | None = None
        value: exp.Expression | None = None
        bounds: tuple[float, float] | None = None
        p: float | None = None
        second: tuple[str | None, exp.Expression | None, tuple[float, float]] | None = None
        if isinstance(node, (exp.WithinGroup, *QUANTILE_AGGS)):
            qgot = quantile_call(node)
            if isinstance(qgot, str):
                self.bad(node, f"{clause}: {qgot}")
                return None
            kind, arg, p = qgot
            fn = "MIN" if kind == ir.MIN else "MAX" if kind == ir.MAX else "a quantile"
            if isinstance(arg, exp.Distinct) and len(arg.expressions) == 1:
                if kind in (ir.MIN, ir.MAX):
                    arg = arg.expressions[0]  # MIN(DISTINCT x) is MIN(x)
                else:
                    written = (written_name(node, self.sql) or func_name(node)).upper()
                    self.bad(node, f"{clause}: {written}(DISTINCT ...) is not supported: distinct values are not bounded "
                                   "per person; drop DISTINCT")
                    return None
            if not isinstance(arg, exp.Column):
                self.bad(node, f"{clause}: {fn} takes a plain column with declared bounds; expressions inside it are "
                         "not supported")
                return None
            column = arg.name.lower()
            if self.table.schema and column not in self.table.schema:
                return None  # reported by check_columns
            written = str(getattr(node, "key", "")).upper() if kind != ir.QUANTILE else "a quantile"
            # the call as the query names it (MEDIAN(d), PERCENTILE_CONT(d), QUANTILE(d)), for messages
            inner_call: exp.Expression = node.this if isinstance(node, exp.WithinGroup) else node
            call = (written_name(node, self.sql) or func_name(inner_call)).upper()
            if parse_type(self.table.schema.get(column, "")).kind in ("date", "timestamp"):
                # a DATE / TIMESTAMP column: the grid is its declared ordered domain (no value bounds)
                why = time_column_problem(self.table, column, call)
                if why is not None:
                    self.bad(node, why, policy=True)
                    return None
            else:
                why = check_numeric_column(column, self.table.schema)
                if why is not None:
                    self.bad(node, why.replace("SUM and AVG need a numeric column",
                                               f"{written} needs a numeric, DATE or TIMESTAMP column"))
                    return None
                declared = self.table.column(column).bounds
                if declared is None:
                    self.bad(
                        node,
                        f"{call}({_as_named(arg, column)}) needs value bounds; table "
                        f"'{self.table.name}' declares none for '{column}' "
                        f"(hint: register the column with columns={{'{column}': {{'bounds': (lo, hi)}}}})",
                        policy=True,
                    )
                    return None
                bounds = declared
        elif isinstance(node, exp.Count):
            if node.expressions:  # COUNT(a, b): DuckDB has no such COUNT; never answer COUNT(a) for it
                self.bad(node, "COUNT takes one argument (*, a column or an expression); count each one separately, "
                               "or write COUNT(CASE WHEN a IS NOT NULL AND b IS NOT NULL THEN 1 END)")
                return None
            if isinstance(arg, exp.Star) or arg is None or never_null_literal(arg):
                # COUNT(1), COUNT('x'): every kept row, as COUNT(*) (one aggregate: no second released column)
                kind = ir.COUNT_STAR
            elif isinstance(arg, exp.Distinct):
                exprs = [distinct_operand(e) for e in arg.expressions]  # COUNT(DISTINCT (col)) is COUNT(DISTINCT col)
                if len(exprs) == 1 and isinstance(exprs[0], exp.Column) and exprs[0].name.lower() == self.unit:
                    kind = ir.COUNT_UNITS
                elif len(exprs) == 1 and isinstance(exprs[0], exp.Column):
                    kind, column = ir.COUNT_DISTINCT, exprs[0].name.lower()
                    problem = distinct_type_problem(exprs[0].name, self.table.schema.get(column, ""))
                    if problem is not None:
                        self.bad(node, problem)
                        return None
                elif len(exprs) == 1 and isinstance(exprs[0], exp.Struct):
                    # (a struct's field names would be checked too: the row of its values is answered)
                    call = f"COUNT(DISTINCT {as_written(arg.expressions[0]).sql(dialect=DIALECT, normalize_functions=False)})"
                    self.violations.append(violation(node, self.sql, (
                        "COUNT(DISTINCT ...) of a struct is not supported (hint: to count the distinct combinations of "
                        "its values, write COUNT(DISTINCT (a, b)), a row, which DuckDB counts alike)"), rendered=call))
                    return None
                elif len(exprs) == 1:
                    value = self.distinct_value(node, exprs[0])
                    if value is None:
                        return None
                    kind = ir.COUNT_DISTINCT
                else:
                    # one message for the call (its arguments are not checked on their own: plan.checks); quoted as
                    # written (sqlglot renders COUNT(DISTINCT a, b) as a CASE over a tuple)
                    call = "COUNT(DISTINCT " + ", ".join(as_written(e).sql(dialect=DIALECT, normalize_functions=False)
                                                          for e in arg.expressions) + ")"
                    row = call.removeprefix("COUNT(DISTINCT ").removesuffix(")")
                    fix = (f"to count the distinct combinations, write them as a row, COUNT(DISTINCT ({row})), as DuckDB "
                           "does; or count each value's distinct values in a COUNT(DISTINCT expr) of its own")
                    self.violations.append(violation(node, self.sql, "COUNT(DISTINCT ...) takes one column or expression, "
                                                     f"not several (hint: {fix})", rendered=call))
                    return None
            elif isinstance(arg, exp.Column):
                kind, column = ir.COUNT_COL, arg.name.lower()
            else:
                value = self.count_value(node, arg)
                if value is None:
                    return None
                kind = ir.COUNT_COL
        elif type(node) in _PAIR_KINDS:
            before = len(self.violations)
            got2 = self.pair_bounds(node)
            if got2 is None and isinstance(node, exp.RegrCount) and len(self.violations) > before and all(
                    id(v) in self._unbounded for v in self.violations[before:]):
                # counting needs no bounds: the rows where both arguments are not NULL, as a COUNT's
                del self.violations[before:]
                value = self.pair_count_value(node)
                if value is None:
                    return None
                kind = ir.COUNT_COL
            elif got2 is None:
                return None
            else:
                kind = _PAIR_KINDS[type(node)]
                (column, value, bounds), second = got2
        elif type(node) in _VALUE_KINDS or (isinstance(node, exp.Anonymous) and str(node.this).lower() in ANON_AGGS):
            kind = _value_kind(node)
            fn = _written(node)
            if isinstance(arg, exp.Distinct):
                self.bad(node, f"{fn}(DISTINCT ...) is not supported: distinct values are not bounded per person; drop DISTINCT")
                return None
            got = self.value_bounds(node, arg, fn)
            if got is None:
                return None
            column, value, bounds = got
            lo, hi = bounds[0] + 0.0, bounds[1] + 0.0  # + 0.0: -0.0 prints as 0
            if lo == hi and (kind != ir.SUM or lo == 0.0):
                # nothing private to estimate: the noise would have scale 0 (a point interval)
                what = "0 (or NULL) on every row" if kind == ir.SUM else f"{lo:g} (or NULL) on every row"
                self.bad(node, f"the bounds [{exact_num(lo)}, {exact_num(hi)}] of {fn}'s argument are a single point: its value is "
                               f"{what}, so there is nothing to estimate (hint: widen the bounds, e.g. "
                               f"{fn}(LEAST(GREATEST(expr, lo), hi)) with lo < hi)")
                return None
        else:
            self.bad(node, _unsupported_aggregate(node, self.sql))
            return None
        if column is not None and self.table.schema and column not in self.table.schema:
            return None  # reported by check_columns
        # one released value per distinct (kind, column, bounds, quantile, value): looked up by that key (each
        # value rendered once), never by rendering every earlier aggregate again (quadratic in the select list)
        key: tuple[object, ...] = (kind, column, bounds, p, _norm(value) if value is not None else None)
        if second is not None:
            key += (second[0], second[2], _norm(second[1]) if second[1] is not None else None)
        name = self._aggregate_names.get(key)
        if name is None:
            aname = f"__a{len(self.aggregates)}"
            other = (None if second is None else
                     ir.Aggregate(ir.VAR_POP, second[0], aname, _norm(node), second[2], value=second[1]))
            agg = ir.Aggregate(kind, column, aname, _norm(node), bounds, quantile=p, value=value, second=other)
            self.aggregates.append(agg)
            name = self._aggregate_names[key] = agg.name
        return exp.column(name)

    def pair_bounds(self, node: exp.Expression) -> tuple[tuple[str | None, exp.Expression | None, tuple[float, float]],
                                                          tuple[str | None, exp.Expression | None, tuple[float, float]]] | None:
        """(column, value expression, bounds) of each argument of COVAR_POP / COVAR_SAMP / CORR, as for
        SUM's (:meth:`value_bounds`); every argument's problem is reported."""
        fn = _written(node)
        if node.expression is None or any(v is not None for k, v in node.args.items() if k not in ("this", "expression")):
            # CORR(a, b, c): sqlglot reads the third as a flag, DuckDB has no such CORR: never answer CORR(a, b) for it
            self.bad(node, f"{fn} takes two arguments, {fn}({'y, x' if fn.startswith('REGR') else 'a, b'})")
            return None
        args = (node.this, node.expression)
        first, second = (self.value_bounds(node, a, fn, (i, as_written(args[1 - i]).sql(dialect=DIALECT)))
                         for i, a in enumerate(args))
        if first is None or second is None:
            return None
        for (_, _, (lo, hi)), which in ((first, "first"), (second, "second")):
            if lo == hi:  # a constant: its covariance with anything is 0, its correlation undefined
                lo, hi = lo + 0.0, hi + 0.0  # -0.0 prints as 0
                self.bad(node, f"the bounds [{exact_num(lo)}, {exact_num(hi)}] of {fn}'s {which} argument are a single point: it is "
                               f"{lo:g} (or NULL) on every row, so there is nothing to estimate (hint: widen the bounds, "
                               f"e.g. LEAST(GREATEST(expr, lo), hi) with lo < hi)")
                self._unbounded[id(self.violations[-1])] = self.violations[-1]
                return None
        return first, second

    def pair_count_value(self, node: exp.Expression) -> exp.Expression | None:
        """REGR_COUNT(y, x) of arguments without bounds: COUNT's value of ``CASE WHEN y IS NOT NULL AND x IS NOT
        NULL THEN 1 END`` (:meth:`count_value`), each argument typed numeric (as the bounded form's are)."""
        assert self.table is not None
        fn, failed = _written(node), False
        for a in (node.this, node.expression):
            try:
                typed = type_checked(a, dict(self.table.schema))
            except TypeRefusal as e:
                failed = True
                seen = {(v.line, v.col) for v in self.violations}  # e.g. an unknown column: named once, already
                for n, m in e.problems:
                    v = violation(n if n is not None else node, self.sql, f"{fn}: {m}")
                    if (v.line, v.col) not in seen or v.line is None:
                        self.violations.append(v)
                continue
            if not (typed.type.numeric or typed.type.kind == "bool"):
                failed = True
                self.bad(node, f"{fn} needs numeric arguments, got {typed.type} (hint: cast it, e.g. "
                               f"{fn}(CAST(y AS DOUBLE), x))")
        if failed:
            return None
        both = exp.and_(*(exp.Not(this=exp.Is(this=exp.Paren(this=a.copy()), expression=exp.Null()))
                          for a in (node.this, node.expression)))
        return self.count_value(node, exp.Case(ifs=[exp.If(this=both, true=exp.Literal.number(1))]))

    def distinct_value(self, node: exp.Expression, arg: exp.Expression) -> exp.Expression | None:
        """COUNT(DISTINCT expr), e.g. ``COUNT(DISTINCT lower(email))``: the expression (over unqualified columns),
        whose typed, total and canonical rendering (``dpsql.plan.typer.type_distinct``, as a GROUP BY key's) the
        bounded query lists per (person, group); NULL is not counted. Typed now, so nothing is refused after the
        charge."""
        assert self.table is not None
        before = len(self.violations)
        try:  # allow-list, depth and rendered size: the limits of every typed expression
            _, typ = type_distinct(arg, dict(self.table.schema))
        except TypeRefusal as e:
            # a problem at a place the function and column checks already named is one problem, named once
            seen = {(v.line, v.col) for v in self.violations}
            for n, m in e.problems:
                v = violation(n if n is not None else node, self.sql, m if m.startswith("COUNT(DISTINCT") else f"COUNT: {m}")
                if (v.line, v.col) not in seen or v.line is None:
                    self.violations.append(v)
            return None
        problem = distinct_type_problem(arg.sql(dialect=DIALECT), typ.name)
        if problem is not None:
            self.bad(node, problem)
        return unqualified(arg) if len(self.violations) == before else None

    def count_value(self, node: exp.Expression, arg: exp.Expression) -> exp.Expression | None:
        """COUNT(expr), e.g. ``COUNT(CASE WHEN status = 'paid' THEN 1 END)``: the rows where the
        expression, typed and rendered total by dpsql's typer (a conversion that fails gives NULL, as
        everywhere in dpsql), is not NULL; as the value ``CASE WHEN (expr) IS NOT NULL THEN 1 END``,
        whose non-NULL rows a COUNT counts (the count of a column, with the same caps and noise)."""
        assert self.table is not None
        before = len(self.violations)
        try:  # allow-list, depth and rendered size: the limits of every typed expression
            type_checked(arg, dict(self.table.schema))
        except TypeRefusal as e:
            for n, m in e.problems:
                self.bad(n if n is not None else node, f"COUNT: {m}")
        if len(self.violations) != before:
            return None
        inner = unqualified(arg)
        present = exp.Not(this=exp.Is(this=exp.Paren(this=inner), expression=exp.Null()))
        value = exp.Case(ifs=[exp.If(this=present, true=exp.Literal.number(1))])
        try:  # the value as the bounded query renders it: typed now, so nothing is refused after the charge
            type_value(value, dict(self.table.schema))
        except TypeRefusal as e:
            self.bad(node, f"COUNT: {e.problems[0][1] if e.problems else 'its argument cannot be typed'}")
            return None
        return value

    def value_bounds(self, node: exp.Expression, arg: exp.Expression, fn: str,
                     pair: tuple[int, str] | None = None)  -> tuple[str | None, exp.Expression | None, tuple[float, float]] | None:
        """(column, value expression, bounds) of the argument of SUM / AVG / VARIANCE / STDDEV: a
        column with declared bounds, an explicit clamp with literal bounds, or an expression of
        bounded columns (bounds by interval arithmetic, ``dpsql.plan.intervals``). ``pair``: for an
        argument of a two-argument aggregate, its position (0 or 1) and the other argument as written, for
        the forms the hints write."""
        assert self.table is not None

        def call(inside: str) -> str:  # the aggregate written with ``inside`` as this argument
            if pair is None:
                return f"{fn}({inside})"
            return f"{fn}({inside}, {pair[1]})" if pair[0] == 0 else f"{fn}({pair[1]}, {inside})"

        explicit = clamp_bounds(arg)
        inner = explicit[0] if explicit is not None else arg
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.Column):
            column = inner.name.lower()
            if self.table.schema and column not in self.table.schema:
                return None  # reported by check_columns
            why = check_numeric_column(column, self.table.schema)
            if why is not None:
                self.bad(node, why.replace("SUM and AVG need", f"{fn} needs"))
                return None
        else:
            column = None
        if explicit is not None:
            lo, hi = explicit[1]
            if lo > hi:
                self.bad(node, f"the clamp's lower bound {lo:g} is above its upper bound {hi:g}")
                return None
            # the clamp as SQL computes it: GREATEST / LEAST skip NULL, so a NULL argument gives
            # lo (LEAST(GREATEST(e, lo), hi)) or hi (GREATEST(LEAST(e, hi), lo)), counted by AVG
            clamped = clamp_argument(arg)
            assert clamped is not None
            inner, column = clamped, None
        elif column is not None:
            declared = self.table.value_bounds(column)  # a BOOLEAN's [0, 1] comes from its type
            if declared is None:
                self.bad(
                    node,
                    f"{call(_as_named(inner, column))} needs value bounds; table '{self.table.name}' declares none for "
                    f"'{column}' (hint: register the column with columns={{'{column}': {{'bounds': (lo, hi)}}}}, or clamp "
                    f"in the query: {call(f'LEAST(GREATEST({_as_named(inner, column)}, lo), hi)')}, where a NULL "
                    f"{_as_named(inner, column)} counts as lo, as in SQL)",
                    policy=True,
                )
                self._unbounded[id(self.violations[-1])] = self.violations[-1]
                return None
            lo, hi = float(declared[0]), float(declared[1])
        else:
            schema = self.table.schema

            def declared_bounds(c: str) -> tuple[float, float] | None:
                if c in schema and parse_type(schema[c]).kind == "bool":
                    return 0.0, 1.0  # false / true, by the column's type (as a condition is)
                b = self.table.column(c).bounds if self.table is not None else None
                return None if b is None or check_numeric_column(c, schema) is not None else (float(b[0]), float(b[1]))

            def day_range(c: str, cast: bool) -> tuple[float, float] | None:  # a DATE column's declared range, in days
                return declared_days(self.table, c, cast) if self.table is not None else None

            try:
                lo, hi = interval(inner, declared_bounds, day_range)
            except NoInterval as e:
                off = allow_list_problems(inner)
                for n, m in off:  # a function off the allow-list has no interval rule: name it, once
                    self.bad(n, f"{fn}: {m}")
                if off:
                    return None
                why = e.named(written_name(e.node, self.sql)) if isinstance(e.node, exp.Func) else e.message
                self.bad(node, f"{fn} over an expression needs bounds: {why} (hint: write "
                               f"{call('LEAST(GREATEST(expr, lo), hi)')} with literal bounds, or declare the columns' bounds)")
                self._unbounded[id(self.violations[-1])] = self.violations[-1]
                return None
        # the argument rescaled in a hint: as written for one of two (the other one is written as it is)
        me = "x" if pair is None else as_written(arg).sql(dialect=DIALECT)
        me = me if pair is None or isinstance(as_written(arg), exp.Column) else f"({me})"
        if not (math.isfinite(lo) and math.isfinite(hi)) or max(abs(lo), abs(hi)) > MAX_BOUND:
            self.bad(node, f"the bounds [{exact_num(lo)}, {exact_num(hi)}] of {fn}'s argument are too large (at most 1e15 in magnitude) "
                           f"(hint: aggregate a rescaled value, e.g. {call(f'{me} / 1e6')}, and rescale the result, or declare "
                           "narrower bounds)")
            self._unbounded[id(self.violations[-1])] = self.violations[-1]
            return None
        if 0 < max(abs(lo), abs(hi)) < MIN_BOUND or 0 < hi - lo < MIN_BOUND:
            # noise scales this small leave the normal range of doubles (a variance squares them), where
            # the floating-point proofs of the samplers (dpsql.noise) no longer hold
            self.bad(node, f"the bounds [{exact_num(lo)}, {exact_num(hi)}] of {fn}'s argument are too small (at least 1e-100 in "
                           f"magnitude and width) (hint: aggregate a rescaled value, e.g. {call(f'{me} * 1e6')}, and rescale "
                           "the result)")
            self._unbounded[id(self.violations[-1])] = self.violations[-1]
            return None
        if column is not None:
            return column, None, (lo, hi)
        before = len(self.violations)
        try:  # allow-list, depth and rendered size: the limits of every typed expression
            if explicit is not None:  # the clamp as written first: a refusal names the query's own GREATEST / LEAST
                type_checked(arg, dict(self.table.schema))
            typed = type_checked(inner, dict(self.table.schema))
            if not (typed.type.numeric or typed.type.kind == "bool"):
                self.bad(node, f"{fn} needs a numeric value, got {typed.type}")
        except TypeRefusal as e:
            for n, m in e.problems:
                self.bad(n if n is not None else node, f"{fn}: {m}")
        if len(self.violations) != before:
            return None
        return None, unqualified(inner), (lo, hi)

    def _binned_by_value(self, key: exp.Expression) -> bool:
        """A plain column whose declared ordered domain has one value per bin: a GROUP BY on it may
        be answered with every bin (DAWA's histogram), each labelled with its value, so the
        WHERE's conditions on it filter those labels exactly as they filter rows."""
        if self.table is None or not isinstance(key, exp.Column):
            return False
        name = key.name.lower()
        spec = self.table.columns.get(name)
        return spec is not None and spec.ordered is not None and one_value_per_bin(spec.ordered, self.table.schema.get(name))

    def key_only_where(self, where: exp.Expression | None) -> exp.Expression | None:
        """With every key's domain declared (``mechanisms.public_domain`` without an aggregate,
        ``mechanisms.basic`` with one, both releasing every declared key), the WHERE's conjuncts
        that read key columns only, over the released key columns: they filter the declared domain
        as post-processing (``WHERE country = 'US'`` lists 'US' alone, not the whole domain with
        noisy zeros for the keys the WHERE excludes). Conjuncts reading any other column cannot
        filter it without reading rows."""
        if where is None or not self.keys or not all(k.domain is not None or self._binned_by_value(k.expr) for k in self.keys):
            return None
        key_cols = {k.expr.name.lower() for k in self.keys if isinstance(k.expr, exp.Column)}
        kept: list[exp.Expression] = []
        # the conjuncts through parentheses too, as the refusal of a constant one reads them: `(1 = 0 AND k > 3)` keeps
        # `k > 3` only, as `1 = 0 AND k > 3` does (the whole group, moved to the HAVING, was refused as a HAVING that
        # is never true, quoting its typed rendering, where the same WHERE without the parentheses released zeros)
        for c in _conjuncts(where):
            cols = [x.name.lower() for x in c.find_all(exp.Column)]
            if not cols or any(x not in key_cols for x in cols) or any(is_aggregate(n) for n in c.walk()):
                continue
            try:  # rendered total by the typer, as over private rows (a cast that fails gives NULL)
                typed = type_predicate(c, dict(self.table.schema) if self.table is not None else {}, "WHERE")
            except TypeRefusal:
                continue  # reported by the WHERE's own type check
            by_col = {k.expr.name.lower(): k.name for k in self.keys if isinstance(k.expr, exp.Column)}
            refs = list(typed.find_all(exp.Column))
            if any(r.name.lower() not in by_col for r in refs):
                continue
            for col in refs:
                col.replace(exp.column(by_col[col.name.lower()]))
            kept.append(exp.Paren(this=typed))
        return exp.and_(*kept, copy=False) if kept else None

    def to_post(self, node: exp.Expression, where: str, *, alias_map: dict[str, exp.Expression] | None = None,
                window: bool = False) -> exp.Expression:
        """Rewrite an expression over the query into one over released internal columns. ``window``: ``node``
        is an input of a window function (a column there that is no key is refused as a window over raw rows)."""
        key_by_sql = {k.sql: k for k in self.keys}

        def repl(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Window):
                if window or where not in ("SELECT", "ORDER BY", "QUALIFY") or windows.problem(n) is not None:
                    return exp.Null()  # refused by the function checks: its calls are no second problem
                w = n.copy()  # its function stays a window function: its inputs are over released columns
                for part in windows.inputs(w):
                    part.replace(self.to_post(part, where, alias_map=alias_map, window=True))
                if any(isinstance(x, exp.Window) for x in w.walk() if x is not w):  # (an alias of a window)
                    self.bad(n, f"{where}: window functions cannot be nested; name the window's inputs directly")
                    return exp.Null()
                return w
            if isinstance(n, exp.WithinGroup):
                r = self.aggregate_ref(n, where)
                return r if r is not None else exp.Null()
            if (is_aggregate(n) or isinstance(n, exp.Filter)) and n.find(exp.Window):
                return exp.Null()  # a window inside an aggregate: refused by the function checks
            if is_aggregate(n) or isinstance(n, exp.Filter):
                inner = n.this if isinstance(n, exp.Filter) else n  # FILTER wraps its aggregate
                if any(is_aggregate(x) for x in n.walk() if x is not inner):  # (a FILTER's condition too)
                    self.bad(n, f"{where}: aggregates cannot be nested; aggregate a column or an expression of columns")
                    return exp.Null()
                if isinstance(n, (*SUPPORTED_AGGS, exp.Filter)) or (isinstance(n, exp.Anonymous)
                                                                   and str(n.this).lower() in ANON_AGGS):
                    r = self.aggregate_ref(n, where)
                    return r if r is not None else exp.Null()
                self.bad(n, f"{where}: {_unsupported_aggregate(n, self.sql)}")
                return exp.Null()
            s = _norm(n) if isinstance(n, (exp.Column, exp.Func, exp.Binary, exp.Unary, exp.Predicate, exp.Case, exp.Cast)) else None
            if s is not None and s in key_by_sql:
                return exp.column(key_by_sql[s].name)
            if isinstance(n, exp.Column):
                nm = n.name.lower()
                if alias_map is not None and not n.table and nm in alias_map:
                    return alias_map[nm].copy()
                if nm.startswith("__"):
                    return n
                if self.table is not None and self.table.schema and nm not in self.table.schema and not n.table:
                    return exp.Null()  # unknown column: reported by check_columns
                if n.table and n.table.lower() not in self._table_names:
                    return exp.Null()  # unknown table or alias: reported by check_columns
                shadow = (f"; the output alias '{n.name}' is also a column of the table, and here (a window, an ORDER BY "
                          f"expression, QUALIFY) the column wins, as in DuckDB: rename the alias"
                          if nm in getattr(self, "shadowing_aliases", ()) else "")
                if window:
                    self.bad(n, f"{where}: a window over raw rows would release per-row values: column '{n.name}' is "
                                f"neither a GROUP BY key nor inside an aggregate; {windows.OVER_RELEASED}{shadow} (hint: "
                                f"GROUP BY {n.name}, or aggregate it, e.g. SUM(SUM({n.name})) OVER (...))")
                    return exp.Null()
                self.bad(
                    n,
                    f"{where} uses column '{n.name}' outside an aggregate and not in GROUP BY: non-aggregated output is "
                    f"not allowed{shadow}",
                )
                return exp.Null()
            return n

        return node.copy().transform(repl, copy=False)

    # -- main ------------------------------------------------------------------------
    def build(self, statement: exp.Select | None = None) -> ir.QueryPlan:
        """The plan of ``self.sql``; or, given ``statement`` (a lookup join's query over its joined rows,
        ``analyze_lookup``), of that statement as one table's, messages quoting and placing ``self.sql``."""
        if statement is not None:
            return self.build_statement(statement.copy(), [0])
        stmts = parse_statements(self.sql)
        starts = statement_starts(self.sql)
        if len(stmts) != 1:
            for i, st in enumerate(stmts):
                off = starts[i] if i < len(starts) else None
                if i > 0:
                    self.violations.append(
                        violation(
                            st,
                            self.sql,
                            f"exactly one SQL statement is allowed, got {len(stmts)}; statement {i + 1} starts here",
                            offset=off,
                        )
                    )
                if not isinstance(st, exp.Select):
                    self.violations.extend(check_statement_shape(st, self.sql, start=off or 0))
            raise UnsupportedQueryError(
                f"exactly one SQL statement is allowed, got {len(stmts)}",
                hint="send one SELECT statement per query (range counts over one table are answered together, at one "
                     "charge, by Session.query_many([...]))",
                violations=self.violations,
            )
        _check_size(stmts[0])  # before anything else: a query above the limits costs no analysis
        # CTEs and subqueries in FROM: merged into the flat query (dpsql.plan.views), analysed as one
        _check_on_scope(stmts[0])
        stmt = _comma_joins(_limit_all(_order_by_all(merge_views(stmts[0], self.sql, self.catalog))), self.catalog)
        if isinstance(stmt, exp.Select) and (stmt.args.get("joins") or self._several_paths(stmt)):
            from dpsql.plan.joins import analyze_join  # imported for joins only (a large module)

            return analyze_join(self.sql, stmt, self.catalog)  # joins: DP-S4S / R2T (dpsql.plan.joins)
        return self.build_statement(stmt, starts)

    def build_statement(self, stmt: exp.Expression, starts: list[int]) -> ir.QueryPlan:  # noqa: C901 - one pass
        stmt = _distinct_as_group_by(stmt)
        self.violations.extend(check_statement_shape(stmt, self.sql, start=starts[0] if starts else 0, windows=True))
        distinct = stmt.args.get("distinct") if isinstance(stmt, exp.Select) else None
        if not isinstance(stmt, exp.Select) or (isinstance(distinct, exp.Distinct) and distinct.args.get("on")):
            self._raise()  # (DISTINCT ON: its outputs are raw values; one problem, not also each output)
        assert isinstance(stmt, exp.Select)

        from_ = stmt.args.get("from_") or stmt.args.get("from")
        if from_ is None:
            self.bad(stmt, "the query has no FROM clause; select from a registered table")
            self._raise()
        tbl = from_.this
        self._table_names: set[str] = set()
        if not isinstance(tbl, exp.Table) or not isinstance(tbl.this, exp.Identifier):
            # (a subquery in FROM is never here: dpsql.plan.views merges it into the query, or refuses it)
            if isinstance(tbl, exp.Values):
                self.bad(tbl, f"{VALUES_IN_FROM}; select from a registered table")
            else:
                self.bad(tbl, "table functions (read_parquet, read_csv, ...) and file paths are not allowed in queries; register the file as a table")
            self._raise()
        name = tbl.this.name
        qual_problem = qualifier_problem(tbl)
        if qual_problem is not None:
            self.bad(tbl, qual_problem)
            self._raise()
        if tbl.this.quoted and any(ch in name for ch in "./\\*") :
            self.bad(tbl, "file paths are not allowed in queries; register the file as a table and use its name")
            self._raise()
        # anything attached to the table reference changes which rows are read
        tbl_clauses = {
            "sample": "TABLESAMPLE / USING SAMPLE is not supported: sampling changes each person's contribution",
            "pivots": "PIVOT / UNPIVOT is not supported: it changes each person's contribution",
            "when": "time travel (AT / VERSION) is not supported",
            "ordinality": "WITH ORDINALITY is not supported",
            "joins": "JOINs are not supported yet: a join can multiply one person's contribution",
            "laterals": "LATERAL is not supported",
            "hints": "table hints such as WITH (NOLOCK) are not supported; remove them (the query reads a snapshot)",
        }
        for key, val in tbl.args.items():
            if not val or key in ("this", "alias", "db", "catalog"):
                continue
            self.bad(tbl, tbl_clauses.get(key, f"the table reference clause '{key}' is not supported"))
        alias = tbl.args.get("alias")
        if isinstance(alias, exp.TableAlias) and alias.columns:
            self.bad(alias, "column aliases on the table (FROM t AS x(a, b)) are not supported; alias columns in SELECT")
        table = self.catalog.get(name.lower())
        if table is None:
            known = ", ".join(sorted(self.catalog)) or "none"
            self.bad(
                tbl,
                f"table '{name}' is not registered{did_you_mean(name, self.catalog)} (registered tables: {known}); "
                "register it with a privacy unit first",
                policy=True,
            )
            self._raise()
        assert table is not None
        self.table = table
        # an alias hides the table's own name, as in DuckDB and the join path (FROM t AS a WHERE t.x is refused)
        self._table_names = {tbl.alias.lower() if tbl.alias else table.name.lower()}
        self._qualifier = qualifier(tbl)
        self.unit = resolve_unit_column(table, self.catalog)
        if self.unit is None and table.public:
            private = next((t.name for t in self.catalog.values() if not t.public), "t")
            self.bad(tbl, f"table '{table.name}' is public (registered with public=True): there is nothing private to "
                          f"protect; query the public data directly, or join it to a private table (FROM {private} x "
                          f"JOIN {table.name} p ON ...) to count people", policy=True)
        elif self.unit is None:
            self.bad(
                tbl,
                unit_problem(table, self.catalog)
                + " (hint: only tables whose rows each reach one person through one column (its privacy_unit, or one "
                "foreign key to a registered table's privacy unit) can be queried today)",
                policy=True,
            )

        # SELECT list ---------------------------------------------------------------
        select_items = self.select_items = list(stmt.expressions)
        for it in select_items:
            if isinstance(it, exp.Alias):
                self.aliases.add(it.alias.lower())
        # an output may name an earlier output's alias (COUNT(*) AS n, n / 10 AS share), as in DuckDB; a
        # column of the table wins over an alias of its name
        lateral: list[set[str]] = []
        for it in select_items:
            seen = lateral[-1] if lateral else set()
            lateral.append(seen)
            if isinstance(it, exp.Alias) and it.alias.lower() not in table.schema:
                lateral[-1] = seen | {it.alias.lower()}
        lateral = [set()] + lateral[:-1]
        keyed = _keyed_items(stmt, select_items, table.schema)
        for i, (it, earlier) in enumerate(zip(select_items, lateral, strict=True)):
            if isinstance(it, exp.Star) or (isinstance(it, exp.Column) and isinstance(it.this, exp.Star)):
                self.bad(it, "SELECT * releases raw rows and is not allowed; select aggregates such as COUNT(*)")
            if i not in keyed:  # a key GROUP BY names is checked there, once, against the stricter allow-list
                self.violations.extend(check_expression_functions(it, self.sql, "SELECT", windows=True))
            self.check_columns(it, "SELECT", allow_aliases=earlier)

        # WHERE ---------------------------------------------------------------------
        where = stmt.args.get("where")
        where_expr = where.this if where is not None else None
        if where_expr is not None:
            where_expr = self.select_aliases(where_expr, select_items)
            before = len(self.violations)
            self.violations.extend(check_expression_functions(where_expr, self.sql, "WHERE", windows=True))
            for a in [n for n in where_expr.walk() if is_aggregate(n) and not _in_subquery(n, where_expr)]:
                self.bad(a, "aggregates are not allowed in WHERE; use HAVING")
            self.check_columns(where_expr, "WHERE")
            self.type_check(where_expr, "WHERE", before)
            # the bounded query reads the table under another name: drop table qualifiers (of the copy the aliases
            # were spelled out in: ``spell_aliases`` returns a copy)
            for c in where_expr.find_all(exp.Column):
                c.set("table", None)
                c.set("db", None)
                c.set("catalog", None)
            lower_columns(where_expr)

        # GROUP BY ------------------------------------------------------------------
        group = stmt.args.get("group")
        spelled, alias_exprs = self.spelled_items(select_items)
        group_exprs: list[exp.Expression] = []
        if group is not None:
            if group.args.get("all"):
                # every output that is no aggregate, read through the earlier aliases it names (COUNT(*) AS n,
                # n * 2 AS n2: n2 is an aggregate's value, no key)
                group_exprs.extend(inner for inner in spelled
                                   if not any(is_aggregate(n) or isinstance(n, exp.Window) for n in inner.walk()))
            for g in group.expressions:
                if isinstance(g, exp.Tuple) and not g.expressions:
                    continue  # GROUP BY (): the grand total, i.e. no grouping
                if isinstance(g, (exp.Cube, exp.Rollup, exp.GroupingSets)):
                    kind = {exp.Cube: "CUBE", exp.Rollup: "ROLLUP", exp.GroupingSets: "GROUPING SETS"}[type(g)]
                    self.bad(g, f"GROUP BY {kind} is not supported: it releases several groupings of the same rows "
                                "(hint: send one GROUP BY query per grouping)")
                    # the columns it groups by are keys all the same: naming them in SELECT is no second problem
                    for part in g.expressions:
                        for e in part.expressions if isinstance(part, exp.Tuple) else [part]:
                            while isinstance(e, exp.Paren):
                                e = e.this
                            if not any(_norm(e) == _norm(x) for x in group_exprs):
                                group_exprs.append(e)
                    continue
                if isinstance(g, exp.Literal) and not g.is_string:
                    if not g.this.isdigit():
                        self.bad(g, f"GROUP BY {g.this}: a number in GROUP BY is an output's position, a whole number "
                                    "(hint: group by a column, or by an output's position, e.g. GROUP BY 1)")
                        continue
                    idx = int(g.this) - 1
                    if 0 <= idx < len(select_items):
                        group_exprs.append(spelled[idx])
                    else:
                        self.bad(g, "GROUP BY position is out of range")
                    continue
                if isinstance(g, exp.Column) and not g.table:
                    nm = g.name.lower()
                    if nm in alias_exprs and not (table.schema and nm in table.schema):
                        group_exprs.append(alias_exprs[nm])
                        continue
                group_exprs.append(g)
            for key in ("grouping_sets", "cube", "rollup"):
                if group.args.get(key):
                    self.bad(group, f"GROUP BY ... WITH {key.upper().replace('_', ' ')} is not supported: it releases "
                             "several groupings of the same rows (hint: send one GROUP BY query per grouping)")
        key_sqls = {k.sql for k in self.keys}
        for g in group_exprs:
            while isinstance(g, exp.Paren):  # GROUP BY (col) is GROUP BY col: its domain, the unit's refusal
                g = g.this
            before = len(self.violations)
            self.violations.extend(check_expression_functions(g, self.sql, "GROUP BY", windows=True))
            for a in [n for n in g.walk() if is_aggregate(n)]:
                self.bad(a, "aggregates are not allowed in GROUP BY")
            self.check_columns(g, "GROUP BY")
            if not any(is_bin_column(c.name, table) and c.name.lower() not in table.schema for c in g.find_all(exp.Column)):
                self.type_check(g, "GROUP BY", before)
            s = _norm(g)
            if s in key_sqls:
                continue
            key_sqls.add(s)
            domain, listed = None, False
            if isinstance(g, exp.Column):
                domain = table.column(g.name.lower()).domain
                if domain is None and g.name.lower() != self.unit and table.column(g.name.lower()).ordered is None:
                    # the WHERE's list of the column's keys (a column with bins keeps them: DAWA's bins and labels)
                    domain = listed_domain(g.name.lower(), where_expr, table.schema.get(g.name.lower()))
                    listed = domain is not None
                    if domain == ():
                        self.bad(g, f"the WHERE lists no value of '{g.name}' a row can hold (its lists share none, or "
                                    "list only NULL, which matches no row): the release would have no row whatever the "
                                    "data, and be charged for nothing; nothing was charged")
                if g.name.lower() == self.unit and domain is None:
                    self.bad(g, f"GROUP BY the privacy unit '{g.name}' is refused: each group holds one person, so no group "
                                "can pass the release threshold (nothing would be released, yet the query would be charged); "
                                "group by another column, or count people with COUNT(DISTINCT "
                                f"{g.name})")
            elif self.unit is not None and _injective_in_unit(g, self.unit, table.schema.get(self.unit, "")):
                self.bad(g, f"GROUP BY {g.sql(dialect='duckdb')} is refused: it takes one value per person (a one-to-one "
                            f"function of the privacy unit '{self.unit}'), so each group holds one person and none can "
                            "pass the release threshold (nothing would be released, yet the query would be charged); "
                            f"group by another column, or count people with COUNT(DISTINCT {self.unit})")
            stripped = g.copy()
            for c in stripped.find_all(exp.Column):
                c.set("table", None)
            lower_columns(stripped)
            self.keys.append(ir.GroupKey(stripped, f"__k{len(self.keys)}", s, domain, listed))

        # outputs ---------------------------------------------------------------------
        outputs: list[ir.OutputColumn] = []
        used: set[str] = set()
        suffix: dict[str, int] = {}  # the next _n to try for a repeated name (the names taken only grow)
        alias_post: dict[str, exp.Expression] = {}
        alias_map: dict[str, exp.Expression] = {}  # alias_post less the table's columns (kept as it grows)
        self.shadowing_aliases: set[str] = set()  # aliases named like a column (alias_post less alias_map)
        key_by_sql = {k.sql: k for k in self.keys}
        written_aliases = {it.alias.lower() for it in select_items if isinstance(it, exp.Alias)}  # never a renamed one's
        for it in select_items:
            inner = it.unalias()
            name = output_name(it, self.sql, used, suffix, written_aliases)
            key = None if any(is_aggregate(n) for n in spelled[len(outputs)].walk()) else key_by_sql.get(
                _norm(spelled[len(outputs)])) if key_by_sql else None
            post = exp.column(key.name) if key is not None else self.to_post(inner, "SELECT", alias_map=alias_map)
            src = post.name if isinstance(post, exp.Column) and post.name.startswith("__") else None
            outputs.append(ir.OutputColumn(name, post, src))
            if isinstance(it, exp.Alias):
                alias_post[it.alias.lower()] = post
                if it.alias.lower() not in table.schema:
                    alias_map[it.alias.lower()] = post
                else:
                    self.shadowing_aliases.add(it.alias.lower())

        having = None
        if stmt.args.get("having") is not None:
            hv = stmt.args["having"].this
            self.violations.extend(check_expression_functions(hv, self.sql, "HAVING", windows=True))
            self.check_columns(hv, "HAVING", allow_aliases=True)
            having = self.to_post(hv, "HAVING", alias_map=alias_post)
            if any(isinstance(n, exp.Window) for n in having.walk()):  # an output's alias naming a window
                self.bad(hv, "HAVING names a window function's output: SQL evaluates windows after HAVING; filter on a "
                             "window with QUALIFY")
        order: list[exp.Ordered] = []
        if stmt.args.get("order") is not None:
            for o in stmt.args["order"].expressions:
                self.violations.extend(check_expression_functions(o, self.sql, "ORDER BY", windows=True))
                inner = o.this
                if isinstance(inner, exp.Literal) and not inner.is_string:
                    if not str(inner.this).isdigit() or not 1 <= int(inner.this) <= len(outputs):
                        self.bad(inner, f"ORDER BY position {inner.this} is out of range (the query has {len(outputs)} output column(s))")
                        continue
                    order.append(o.copy())
                    continue
                if isinstance(inner, exp.Column) and not inner.table and inner.name.lower() in used:
                    order.append(o.copy())
                    continue
                self.check_columns(inner, "ORDER BY", allow_aliases=True)
                new = o.copy()
                new.set("this", self.to_post(inner, "ORDER BY", alias_map=alias_map))  # a column wins over an alias (DuckDB)
                order.append(new)
        qualify = None
        if stmt.args.get("qualify") is not None:
            qv = stmt.args["qualify"].this
            self.violations.extend(check_expression_functions(qv, self.sql, "QUALIFY", windows=True))
            self.check_columns(qv, "QUALIFY", allow_aliases=True)
            qualify = self.to_post(qv, "QUALIFY", alias_map=alias_map)  # a column wins over an alias (DuckDB)
            if not any(isinstance(n, exp.Window) for n in (*qualify.walk(), *qv.walk())) and not any(
                    isinstance(n, exp.Window) for o in outputs for n in o.expr.walk()):  # (qv's: one refused there)
                self.violations.append(violation(stmt.args["qualify"], self.sql, "QUALIFY filters on window functions, "
                                                 "and the query has none; filter the released rows with HAVING",
                                                 offset=keyword_offset(self.sql, {"QUALIFY"})))
        key_filter = self.key_only_where(where_expr)
        if key_filter is not None:
            having = key_filter if having is None else exp.And(this=exp.Paren(this=key_filter),
                                                               expression=exp.Paren(this=having))
        if not self.aggregates and not self.keys and not self.violations and any(
                isinstance(n, exp.Window) for it in select_items for n in it.walk()):
            self.bad(next(n for it in select_items for n in it.walk() if isinstance(n, exp.Window)),
                     "a window function without GROUP BY or an aggregate would run over raw rows and release per-row "
                     f"values; {windows.OVER_RELEASED} (hint: aggregate first, e.g. SELECT k, COUNT(*) AS n, "
                     "SUM(COUNT(*)) OVER () AS total FROM t GROUP BY k)")
        if not self.aggregates and not self.keys and not self.violations:
            self.bad(stmt, "the query must aggregate (COUNT, SUM or AVG) or GROUP BY columns: non-aggregated output is not allowed")
        limit = self._int_clause(stmt, "limit")
        offset = self._int_clause(stmt, "offset")
        if offset and not self.keys and self.aggregates:
            self.violations.append(violation(stmt.args["offset"], self.sql, OFFSET_SCALAR.format(n=offset),
                                             offset=keyword_offset(self.sql, {"OFFSET"})))
        self._raise()
        return ir.QueryPlan(
            sql=self.sql,
            table=table,
            where=where_expr,
            keys=self.keys,
            aggregates=self.aggregates,
            outputs=outputs,
            having=having,
            order=order,
            limit=limit,
            offset=offset,
            qualify=qualify,
        )

    def _several_paths(self, stmt: exp.Select) -> bool:
        """A single registered table whose rows reach people through several (resolved) paths, or
        through a chain of references: answered as a one-input join (every path bounded)."""
        from_ = stmt.args.get("from_") or stmt.args.get("from")
        tbl = from_.this if from_ is not None else None
        if not isinstance(tbl, exp.Table) or not isinstance(tbl.this, exp.Identifier) or qualifier_problem(tbl):
            return False
        table = self.catalog.get(tbl.this.name.lower())
        if table is None or table.public or resolve_unit_column(table, self.catalog) is not None:
            return False
        paths = unit_paths(table, self.catalog)
        return bool(paths) and all(p.resolved for p in paths)

    def _int_clause(self, stmt: exp.Select, key: str) -> int | None:
        node = stmt.args.get(key)
        if node is None:
            return None
        count = row_count(node)  # (ANSI FETCH FIRST n ROWS ONLY is LIMIT n; n PERCENT and WITH TIES are refused)
        if count == 0 and key == "limit":
            self.violations.append(violation(node, self.sql, LIMIT_ZERO, offset=keyword_offset(self.sql, {"LIMIT", "FETCH"})))
            return None
        if count is not None:
            return count
        self.violations.append(
            violation(
                node,
                self.sql,
                f"{key.upper()} {LIMIT_FORM}",
                offset=keyword_offset(self.sql, {key.upper()}),
            )
        )
        return None

    def _raise(self) -> None:
        if not self.violations:
            return
        # de-duplicate, keep order
        seen: set[tuple[str, int, int]] = set()
        vs: list[Violation] = []
        for v in self.violations:
            k = (v.message, v.line, v.col)
            # a function off the allow-list is named once, where it stands, whichever check saw it first
            # (the typer names a function as the parser does: LPAD's node is PAD)
            off = ((re.sub(r"function \w+\(\)", "function", v.message, count=1), v.line, v.col)
                   if "is not on the allow-list" in v.message else None)
            if k not in seen and off not in seen:
                seen.add(k)
                if off is not None:
                    seen.add(off)
                vs.append(v)
        policy = [v for v in vs if v.message.startswith(_POLICY_PREFIX)]
        clean = [Violation(v.message.removeprefix(_POLICY_PREFIX), v.line, v.col, v.fragment) for v in vs]
        cls: Callable[..., QueryError] = PolicyError if len(policy) == len(vs) else UnsupportedQueryError
        head = str(clean[0]) if len(clean) == 1 else f"the query has {len(clean)} problems"
        hint = None
        if len(clean) == 1 and "(hint: " in clean[0].message:
            msg, _, h = clean[0].message.partition(" (hint: ")
            head = str(Violation(msg, clean[0].line, clean[0].col, clean[0].fragment))
            hint = h.rstrip(")")
        raise cls(head, violations=clean, hint=hint)


def _keyed_items(stmt: exp.Select, items: list[exp.Expression], schema: Mapping[str, str]) -> set[int]:
    """The positions of the select items that GROUP BY names by alias or position (GROUP BY ALL: every item
    without an aggregate):
    keys, whose functions GROUP BY checks against the allow-list over private rows (a subset of the one over
    released values), so that a function off it is one problem, not also an output's."""
    group = stmt.args.get("group")
    if group is None:
        return set()
    if group.args.get("all"):  # the items without an aggregate (the others are outputs, checked as such)
        return {i for i, it in enumerate(items) if not any(is_aggregate(n) for n in it.walk())}
    by_alias = {it.alias.lower(): i for i, it in enumerate(items) if isinstance(it, exp.Alias) and it.alias.lower() not in schema}
    out: set[int] = set()
    for g in group.expressions:
        if isinstance(g, exp.Literal) and not g.is_string and str(g.this).isdigit():
            out.add(int(g.this) - 1)
        elif isinstance(g, exp.Column) and not g.table and g.name.lower() in by_alias:
            out.add(by_alias[g.name.lower()])
    return out


def _order_by_all(stmt: exp.Expression) -> exp.Expression:
    """DuckDB's ``ORDER BY ALL [DESC]`` is ``ORDER BY 1, 2, ... [DESC]``: every output, left to right (the
    released values, as any ORDER BY)."""
    order = stmt.args.get("order") if isinstance(stmt, exp.Select) else None
    if order is None or not any(isinstance(o.this, exp.Var) and o.this.name.upper() == "ALL" for o in order.expressions):
        return stmt
    out = stmt.copy()
    items: list[exp.Expression] = []
    for o in out.args["order"].expressions:
        if not (isinstance(o.this, exp.Var) and o.this.name.upper() == "ALL"):
            items.append(o)
            continue
        for i in range(len(out.expressions)):
            each = o.copy()
            each.set("this", exp.Literal.number(i + 1))
            items.append(each)
    out.args["order"].set("expressions", items)
    return out


def _after_comma(join: exp.Expression) -> bool:
    """A table listed after a comma in FROM (``FROM a, b``): a join with no kind, condition or method."""
    return not any(v for k, v in join.args.items() if k != "this")


def _plain_inner(join: exp.Expression) -> bool:
    """``JOIN t ON cond`` / ``INNER JOIN t ON cond``: an inner join by a condition only (no USING, side or method)."""
    args = {k: v for k, v in join.args.items() if v and k != "this"}
    return set(args) <= {"on", "kind"} and "on" in args and str(args.get("kind", "INNER")).upper() == "INNER"


def _conjuncts(cond: exp.Expression) -> list[exp.Expression]:
    """The AND-ed terms of a condition, also inside parentheses (``a AND (b AND c)``, as a merged CTE's WHERE
    joins the query's): the same conjunction however it is grouped."""
    while isinstance(cond, exp.Paren):
        cond = cond.this
    if not isinstance(cond, exp.And):
        return [cond]
    return [c for part in cond.flatten() for c in _conjuncts(part)]


def _columns_of(item: exp.Expression, catalog: Mapping[str, TableSpec] | None) -> set[str] | None:
    """The columns of a registered table listed in FROM (lower case); None for anything else."""
    spec = catalog.get(item.name.lower()) if catalog is not None and isinstance(item, exp.Table) and item.name else None
    return None if spec is None else {str(c).lower() for c in spec.schema}


def _on_filters(first: exp.Expression, joins: list[exp.Expression], catalog: Mapping[str, TableSpec] | None) -> bool:
    """Every join an inner ``JOIN ... ON`` and some ON holding, beside an equality of columns of two tables, an AND-ed
    condition of another kind (``JOIN c ON o.ck = c.ck AND c.seg = 'a'``, ``AND o.amt < c.limit``, ``AND p.a = p.b``):
    the same inner join as with that condition in WHERE, so it is read as the comma joins are (an unqualified column is
    that of the one table holding it among those joined so far). An equality of expressions of two tables (``ON o.ck +
    1 = c.ck``) stays in its ON, refused there with its reason; so does an ON with no equality of two tables' columns
    (a non-equi join)."""
    if not joins or not all(_plain_inner(j) for j in joins):
        return False
    scope = [first]
    for j in joins:
        scope.append(j.this)
        held = [_columns_of(it, catalog) for it in scope]

        def tables(c: exp.Expression, held: list[set[str] | None] = held) -> set[str]:
            """The tables whose columns ``c`` names (two marks for a column not bound to one of them)."""
            out: set[str] = set()
            for col in c.find_all(exp.Column):
                if col.table:
                    out.add(col.table.lower())
                    continue
                owners = [it for it, cols in zip(scope, held, strict=True) if cols is not None and col.name.lower() in cols]
                if len(owners) != 1 or None in held:
                    return out | {"?", "??"}
                out.add(owners[0].alias_or_name.lower())
            return out

        kinds = []  # per conjunct: "join" (columns of two tables equated), "filter", or "keep" (left in the ON)
        for c in _conjuncts(j.args["on"]):
            e = c.unnest()
            t = tables(c)
            if isinstance(e, exp.EQ) and len(t) > 1 and c.find(exp.Select) is None:
                both = isinstance(e.this, exp.Column) and isinstance(e.expression, exp.Column)
                kinds.append("join" if both else "keep")
            else:
                kinds.append("filter")
        if "join" in kinds and "filter" in kinds:
            return True
    return False


def _check_on_scope(stmt: exp.Expression) -> None:
    """An ON sees the tables listed before it and its own, as in DuckDB (which refuses the query): a column of a table
    joined after it is refused, before its conditions are read as WHERE's (it was answered as if it stood there)."""
    if not isinstance(stmt, exp.Select) or (from_ := stmt.args.get("from_") or stmt.args.get("from")) is None:
        return
    joins = stmt.args.get("joins") or []
    later = [j.this.alias_or_name.lower() for j in joins]
    for k, j in enumerate(joins):
        on = j.args.get("on")
        seen = {from_.this.alias_or_name.lower(), *later[:k + 1]}
        for col in on.find_all(exp.Column) if on is not None and on.find(exp.Select) is None else []:
            q = col.table.lower()
            if q and q in later[k + 1:] and q not in seen:
                raise UnsupportedQueryError(
                    f"the ON of {j.this.alias_or_name} names {col.sql(dialect='duckdb')}, a column of table "
                    f"'{col.table}', which is joined after it: an ON sees the tables joined before it and its own",
                    hint="move the condition into the ON of that later join, or into WHERE" if (j.args.get("side") or "").upper()
                    != "LEFT" else "write the joins in the order the ON needs (a LEFT JOIN's ON, moved into WHERE, "
                    "would drop the rows it keeps)")


def _comma_joins(stmt: exp.Expression, catalog: Mapping[str, TableSpec] | None = None) -> exp.Expression:
    """``FROM a, b WHERE a.x = b.y AND ...`` (an implicit inner join) is ``FROM a JOIN b ON a.x = b.y WHERE ...``:
    each table listed after a comma takes, as its ON, the WHERE's AND-ed equalities between a column of it and one
    of a table named before it (an inner join filtered by WHERE keeps the same rows). A column is qualified, or
    unqualified and a column of exactly one of the listed tables, all registered (``catalog``), as SQL binds it
    (``FROM customer, orders WHERE c_custkey = o_custkey``); it is qualified so in the ON. A table that gets none
    stays a cross join (refused)."""
    if not isinstance(stmt, exp.Select):
        return stmt
    from_ = stmt.args.get("from_") or stmt.args.get("from")
    joins = stmt.args.get("joins") or []
    if from_ is None or not joins or not (any(_after_comma(j) for j in joins) or _on_filters(from_.this, joins, catalog)) or (
            stmt.args.get("where") is None and not any(_plain_inner(j) for j in joins)):
        return stmt
    out = stmt.copy()
    conds = _conjuncts(out.args["where"].this) if out.args.get("where") is not None else []
    if all(_after_comma(j) or _plain_inner(j) for j in out.args["joins"]):
        # inner joins only (FROM u, i JOIN p ON p.i = i.id WHERE p.u = u.id): an ON is one more AND-ed condition of
        # WHERE, so every join is a comma join and all of them are placed in the order of their equalities below.
        # An unqualified column of an ON is first the column of the one table holding it among those joined since
        # the last comma (FROM u, i JOIN p ON p.i = i.id AND uid < 9: p.uid, as DuckDB binds it), qualified so
        scope = [from_.this]
        for j in out.args["joins"]:
            if not _plain_inner(j):
                scope = [j.this]
                continue
            scope.append(j.this)
            held = [_columns_of(it, catalog) for it in scope]
            for c in _conjuncts(j.args["on"]):
                for col in list(c.find_all(exp.Column)) if c.find(exp.Select) is None and None not in held else []:
                    owners = [it for it, cols in zip(scope, held, strict=True) if col.name.lower() in (cols or ())]
                    if not col.table and len(owners) == 1:
                        stands_for(col, col)  # (a message shows it as the query wrote it: `v`, not `events.v`)
                        col.set("table", exp.to_identifier(owners[0].alias_or_name))
                c.meta[FROM_ON] = True  # its refusals name the ON (checks.clause_of)
                conds.append(c)
            j.set("on", None)
            j.set("kind", None)
    items = [from_.this, *(j.this for j in out.args["joins"])]
    holders: dict[str, set[str]] | None = {}  # column -> the listed tables holding it (None: a table not registered)
    for it in items:
        spec = catalog.get(it.name.lower()) if catalog is not None and isinstance(it, exp.Table) and it.name else None
        if spec is None or holders is None:
            holders = None
            continue
        for col in spec.schema:
            holders.setdefault(str(col).lower(), set()).add(it.alias_or_name.lower())

    def side(c: exp.Column) -> str:
        if c.table or holders is None:
            return c.table.lower()
        held = holders.get(c.name.lower(), set())
        return next(iter(held)) if len(held) == 1 else ""

    def equated(c: exp.Expression) -> tuple[exp.EQ | None, set[str]]:
        e = c
        while isinstance(e, exp.Paren):
            e = e.this
        if isinstance(e, exp.EQ) and isinstance(e.this, exp.Column) and isinstance(e.expression, exp.Column):
            return e, {side(e.this), side(e.expression)}
        return None, set()

    def linked(name: str, seen: set[str]) -> bool:
        return any(name in sides and len(sides) == 2 and sides - {name} <= seen
                   for sides in (equated(c)[1] for c in conds))

    seen = {from_.this.alias_or_name.lower()}
    names = {it.alias_or_name.lower(): it.alias_or_name for it in items}
    if all(_after_comma(j) for j in out.args["joins"]):  # inner joins only: any order (FROM u, i, p WHERE p.u = u.id
        rest, ordered, placed = list(out.args["joins"]), [], set(seen)  # AND p.i = i.id joins p before i)
        while rest:
            j = next((j for j in rest if linked(j.this.alias_or_name.lower(), placed)), rest[0])
            rest.remove(j)
            ordered.append(j)
            placed.add(j.this.alias_or_name.lower())
        out.set("joins", ordered)
    for j in out.args["joins"]:
        name = j.this.alias_or_name.lower()
        if _after_comma(j):
            on = []
            for c in list(conds):
                e, sides = equated(c)
                if e is not None and name in sides and len(sides) == 2 and sides - {name} <= seen:
                    for col in (e.this, e.expression):
                        if not col.table:
                            col.set("table", exp.to_identifier(names[side(col)]))
                    on.append(e)
                    conds.remove(c)
            if on:
                j.set("on", exp.and_(*on, copy=False))
        seen.add(name)
    out.set("where", exp.Where(this=exp.and_(*conds, copy=False)) if conds else None)
    return out


def _limit_all(stmt: exp.Expression) -> exp.Expression:
    """``LIMIT ALL`` (DuckDB's, PostgreSQL's) is no limit: every released row."""
    limit = stmt.args.get("limit") if isinstance(stmt, exp.Select) else None
    if not (isinstance(limit, exp.Limit) and isinstance(limit.expression, exp.Var) and limit.expression.name.upper() == "ALL"
            and limit.args.get("limit_options") is None and limit.args.get("offset") is None):
        return stmt
    out = stmt.copy()
    out.set("limit", None)
    return out


def _distinct_as_group_by(stmt: exp.Expression) -> exp.Expression:
    """``SELECT DISTINCT a, b FROM t [WHERE ...]`` (no aggregate, no GROUP BY) is
    ``SELECT a, b FROM t [WHERE ...] GROUP BY a, b``: the set of key values, released as any
    GROUP BY's keys are (the declared domain, or above the noisy threshold)."""
    if not isinstance(stmt, exp.Select):
        return stmt
    distinct = stmt.args.get("distinct")
    if not isinstance(distinct, exp.Distinct) or distinct.args.get("on") or stmt.args.get("group") is not None:
        return stmt
    items = list(stmt.expressions)
    if not items or any(isinstance(n, exp.Star) or is_aggregate(n) for it in items for n in it.walk()):
        return stmt
    out = stmt.copy()
    out.set("distinct", None)
    out.set("group", exp.Group(expressions=[exp.Literal.number(i + 1) for i in range(len(items))]))
    return out


def _check_size(stmt: exp.Expression) -> None:
    """Refuse a query of more than :data:`MAX_AGGREGATES` aggregate calls (anywhere in it, views included)
    or :data:`MAX_OUTPUT_COLUMNS` select-list items: counted on the parsed query, one walk, before any analysis."""
    calls = sum(1 for n in stmt.walk() if is_aggregate(n))
    if calls > MAX_AGGREGATES:
        raise UnsupportedQueryError(
            f"the query has {calls} aggregate calls; at most {MAX_AGGREGATES} aggregate calls are answered in one "
            "query", hint="split the aggregates over several queries (each is charged on its own)")
    items = len(stmt.expressions) if isinstance(stmt, exp.Select) else 0
    if items > MAX_OUTPUT_COLUMNS:
        raise UnsupportedQueryError(
            f"the query has {items} output columns; at most {MAX_OUTPUT_COLUMNS} output columns are released by one "
            "query", hint="split the select list over several queries (each is charged on its own)")


def analyze_lookup(sql: str, statement: exp.Select, table: TableSpec, name: str) -> ir.QueryPlan:
    """The plan of a lookup join's query (``sql``) as one table's: ``statement`` (``ir.JoinPlan.statement``) over
    ``table``, the joined relation, which its FROM names ``name`` (``dpsql.mechanisms.lookup.one_table_plan``)."""
    def spelled(text: str) -> str:  # a joined column as the query names it, 'c.region' (its table's: 'region')
        text = re.sub(r"columns=\{'(\w+)'", lambda m: "columns={'" + (m[1].split("__", 1)[1] if m[1] in table.schema
                                                                       else m[1]) + "'", text)
        return re.sub(r"\w+", lambda m: m[0].replace("__", ".", 1) if m[0] in table.schema else m[0], text)

    try:
        plan = _Builder(sql, {name: table}).build(statement)
    except QueryError as e:
        e.message, e.hint = spelled(e.message), e.hint and spelled(e.hint)
        e.violations = [Violation(spelled(v.message), v.line, v.col, v.fragment) for v in e.violations]
        e.args = (e._render(),)
        raise
    except RecursionError:
        raise UnsupportedQueryError(
            f"the query is nested too deeply (expressions may be nested at most {MAX_DEPTH} levels)",
            hint="write it with fewer nested parentheses, functions and operators",
        ) from None
    # what explain and the released names show, as the query wrote it (an output's alias is kept as written)
    def renamed(a: ir.Aggregate) -> ir.Aggregate:
        return dataclasses.replace(a, sql=spelled(a.sql), second=a.second and renamed(a.second))

    for out, item in zip(plan.outputs, statement.expressions, strict=True):
        if not isinstance(item, exp.Alias):
            out.name = as_written(item).name if isinstance(item, exp.Column) else spelled(out.name)
    return dataclasses.replace(plan, aggregates=[renamed(a) for a in plan.aggregates],
                               keys=[dataclasses.replace(k, sql=spelled(k.sql)) for k in plan.keys])


def analyze(sql: str, catalog: Mapping[str, TableSpec]) -> ir.QueryPlan:
    """Parse and check ``sql`` against the catalog; return its plan or raise a QueryError.

    A query nested too deeply for the parser (or for any recursive step before the typer's
    own depth limit, ``dpsql.plan.typer.MAX_DEPTH``) is refused here, for free: the outcome
    depends on the SQL text only.
    """
    try:
        with query_string_work() as works:
            plan = _Builder(sql, catalog).build()
    except RecursionError:
        raise UnsupportedQueryError(
            f"the query is nested too deeply (expressions may be nested at most {MAX_DEPTH} levels)",
            hint="write it with fewer nested parentheses, functions and operators",
        ) from None
    too_much = check_query_string_work(works)
    if too_much:
        raise UnsupportedQueryError(
            too_much, hint="use fewer string functions over the query's expressions, split the aggregates over "
            "several queries, or cap texts first with LEFT(x, n) for a small literal n")
    return plan


def _injective_in_unit(g: exp.Expression, unit: str, unit_type: str) -> bool:
    """Whether the GROUP BY key ``g`` reads the privacy unit's column alone, one-to-one: an integer unit (at most 64
    bits) plus or minus a constant integer of at most 18 digits, times a non-zero one (its arithmetic is then exact, in
    BIGINT or HUGEINT: a larger constant is computed in DOUBLE, where ``uid * 10^20`` maps the 64-bit ids 2^60 .. 2^60 +
    255 to one value and ``uid + 10^41`` every id), negated, or cast to text or HUGEINT; a text unit with constant text around it; either cast to text. Anything
    else (``unit % 10``, ``lower(unit)``, nested arithmetic, floats) is not decided here: a refusal must hold for
    every value of the unit's type."""
    t = parse_type(unit_type)
    small_int = t.kind == "int" and t.name not in ("HUGEINT", "UHUGEINT")
    if not small_int and t.kind != "varchar":
        return False

    def constant(e: exp.Expression) -> bool:
        return not any(isinstance(n, (exp.Column, exp.AggFunc, exp.Window, exp.Select, exp.Star)) for n in e.walk())

    def the_unit(e: exp.Expression) -> bool:
        while isinstance(e, exp.Paren):
            e = e.this
        return isinstance(e, exp.Column) and e.name.lower() == unit

    def one_to_one(e: exp.Expression) -> bool:
        while isinstance(e, exp.Paren):
            e = e.this
        if the_unit(e):
            return True
        if small_int:
            if isinstance(e, exp.Neg):
                return the_unit(e.this)
            if isinstance(e, (exp.Add, exp.Sub)):
                return (_is_int_literal(e.expression) and the_unit(e.this)) or (
                    _is_int_literal(e.this) and the_unit(e.expression))
            if isinstance(e, exp.Mul):
                return any(_is_int_literal(c) and _nonzero_literal(c) and the_unit(o)
                           for c, o in ((e.expression, e.this), (e.this, e.expression)))
            if isinstance(e, exp.Cast) and e.to.is_type(exp.DataType.Type.INT128):
                return one_to_one(e.this)
        if isinstance(e, exp.Cast) and e.to.is_type(*exp.DataType.TEXT_TYPES):
            return one_to_one(e.this)
        if isinstance(e, (exp.DPipe, exp.Concat)):
            parts = [e.this, e.expression] if isinstance(e, exp.DPipe) else list(e.expressions)
            reading = [x for x in parts if not constant(x)]
            return (len(reading) == 1 and all(isinstance(x, exp.Literal) and x.is_string for x in parts if constant(x))
                    and (t.kind == "varchar" or isinstance(reading[0], exp.Cast)) and one_to_one(reading[0]))
        return False

    return not the_unit(g) and one_to_one(g)


def _is_int_literal(e: exp.Expression) -> bool:
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.Neg):
        return _is_int_literal(e.this)
    # (at most 18 digits: |unit x c| < 2^64 x 10^18 < 10^38, a HUGEINT on every engine, never a DOUBLE)
    return isinstance(e, exp.Literal) and not e.is_string and str(e.this).isdigit() and len(str(e.this).lstrip("0")) <= 18


def _nonzero_literal(e: exp.Expression) -> bool:
    """Whether an integer literal (``_is_int_literal``) is not zero, read from its digits (no int() of a literal of
    thousands of digits, which Python refuses)."""
    while isinstance(e, (exp.Paren, exp.Neg)):
        e = e.this
    return str(e.this).strip("0") != ""
