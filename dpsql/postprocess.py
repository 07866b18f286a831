"""Post-processing of released values: the query's outputs, HAVING, ORDER BY, LIMIT/OFFSET.

It runs on the released (noised) table only, so it costs no privacy. It knows the analysed
query (``dpsql.plan.ir``: outputs over internal names ``__k*``/``__a*``) and nothing of the
mechanism that produced the values: a mechanism hands over a :class:`~dpsql.mechanisms.base.Released`
(values, their accuracy, per-row intervals) and the SQL types of its aggregates.

Two uses:

* ``check`` before the charge: the post-processing query is bound over a typed placeholder
  shaped like the release (and, with public keys, run over the declared key values), so what
  cannot be evaluated is refused for free.
* ``apply`` after the release: evaluated total (every computed expression under TRY, so a
  value that does not convert gives NULL rather than losing a paid release); per-row interval
  columns ride along hidden and come out in the final row order.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any, Protocol

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import ParseError

from dpsql.errors import ExecutionError, QueryTypeError, UnsupportedQueryError
from dpsql.mechanisms.base import Released
from dpsql.plan import ir, satisfiable, windows
from dpsql.plan.checks import clause_of
from dpsql.plan.parse import as_written
from dpsql.plan.typer import (
    INTERVAL_FORM,
    TypeRefusal,
    guarded_shift,
    interval_parts,
    parse_type,
    type_predicate,
)
from dpsql.rewrite.render import type_text


class _Runs(Protocol):
    """What post-processing needs from the execution backend."""

    def bind_check(self, ast: exp.Expression, *, run: bool = False) -> None: ...

    def post_process(self, table: pa.Table, ast_builder: Callable[[str], exp.Expression]) -> pa.Table: ...


def post_ast(
    plan: ir.QueryPlan, rel: exp.Expression, hidden: list[tuple[str, str]], *, total: bool = False
) -> exp.Expression:
    """The post-processing query over a relation of released values. ``hidden``: (column, alias)
    pairs carried along unchanged. ``total=True`` evaluates every computed output, HAVING and
    ORDER BY expression under TRY (after the charge); the free checks run it without TRY."""

    def t(e: exp.Expression, *, own: bool = False) -> exp.Expression:
        # (``own``: ``e`` is a copy of this query's own already; the plan's expressions are copied once, here: a
        # condition of a long IN list is most of the query's nodes)
        e = _guard_shifts(_guard_divisors(e if own else e.copy()))
        if not total or isinstance(e, (exp.Column, exp.Literal)):
            return e
        return exp.Try(this=e)

    def boolean(e: exp.Expression) -> exp.Expression:
        return exp.cast(e.copy(), "BOOLEAN", copy=False)

    having = None
    if plan.having is not None:
        # a condition that is not BOOLEAN (a text key: HAVING g) is cast by DuckDB implicitly, around
        # the TRY: made explicit, the cast is inside it ('2' is no boolean: NULL, the row is dropped)
        having = t(boolean(plan.having), own=True) if total else t(plan.having)
    lift = _windows(plan, t)
    lifted: Callable[[exp.Expression], exp.Expression] = lambda e: e  # noqa: E731
    if lift is not None:  # windows: computed over the released rows after HAVING, then read as columns
        columns, lifted = lift
        inner = exp.select(exp.Star(), *columns).from_(rel)
        rel = (inner.where(having, copy=False) if having is not None else inner).subquery("__windowed", copy=False)
        having = None
        if plan.qualify is not None:
            having = t(lifted(boolean(plan.qualify) if total else plan.qualify))
    items = [exp.alias_(t(lifted(o.expr)), o.name, quoted=True, copy=False) for o in plan.outputs]
    items += [exp.alias_(exp.column(col), alias, quoted=True, copy=False) for col, alias in hidden]
    q = exp.select(*items, copy=False).from_(rel, copy=False)
    if having is not None:
        q = q.where(having, copy=False)
    order = []
    for o in plan.order:
        o2 = o.copy()
        o2.set("this", t(lifted(o.this)))
        order.append(o2)
    order += [exp.Ordered(this=exp.column(k.name)) for k in plan.keys]
    if order:
        q = q.order_by(*order, copy=False)
    if plan.limit is not None:
        q = q.limit(plan.limit, copy=False)
    if plan.offset is not None:
        q = q.offset(plan.offset, copy=False)
    return q


def _windows(plan: ir.QueryPlan, t: Callable[[exp.Expression], exp.Expression]) -> tuple[
        list[exp.Expression], Callable[[exp.Expression], exp.Expression]] | None:
    """The windows of the outputs, ORDER BY and QUALIFY (``dpsql.plan.windows``) as columns ``__win_<i>`` of the
    released rows, each input evaluated by ``t`` (under TRY after the charge: DuckDB refuses a window inside TRY)
    and ties broken by the keys; and the function that reads an expression's windows from those columns. None
    without windows (and QUALIFY)."""
    exprs = [o.expr for o in plan.outputs] + [o.this for o in plan.order]
    exprs += [plan.qualify] if plan.qualify is not None else []
    found = [w for e in exprs for w in e.find_all(exp.Window)]
    if not found and plan.qualify is None:
        return None
    names: dict[str, str] = {}
    columns: list[exp.Expression] = []
    for w in found:
        text = w.sql(dialect="duckdb")
        if text in names:
            continue
        names[text] = f"__win_{len(names)}"
        w2 = windows.tie_broken(w.copy(), [k.name for k in plan.keys])
        for part in windows.inputs(w2):
            part.replace(t(part))
        columns.append(exp.alias_(w2, names[text]))

    def lifted(e: exp.Expression) -> exp.Expression:
        e = e.copy()
        for w in list(e.find_all(exp.Window)):
            col = exp.column(names[w.sql(dialect="duckdb")])
            if w is e:
                return col
            w.replace(col)
        return e

    return columns, lifted


#: the largest precision of a DECIMAL that a window SUM / AVG adds (to DECIMAL(38)) without a possible overflow:
#: 10^(38 - 28) released rows of the largest such value would be needed
_SUMMED_DECIMAL_PRECISION = 28


def _check_window_sums(backend: _Runs, plan: ir.QueryPlan, source: Callable[[str], exp.Expression],
                       table: pa.Table | None = None) -> None:
    """Refuse for free a window SUM / AVG of HUGEINT, wide DECIMAL or INTERVAL values (whose days DuckDB adds as
    32-bit integers): their sum can overflow on large released values, and DuckDB then raises (a window cannot be evaluated under TRY). Reads the inputs' types
    over ``source`` (placeholders or the public keys), no private row."""
    # (where each window is, as the message names it: its text is over the released columns __a*, __k*)
    located = [(where, w) for where, w in _located_windows(plan) if isinstance(windows.function(w), (exp.Sum, exp.Avg))]
    if not located:
        return
    sums = [w for _, w in located]
    args = [exp.alias_(exp.func("typeof", windows.function(w).this.copy()), f"t{i}") for i, w in enumerate(sums)]
    try:
        out = backend.post_process(table if table is not None else pa.table({"__none": [0]}),
                                   lambda rel: exp.select(*args).from_(source(rel)))
    except ExecutionError:  # pragma: no cover - the same inputs were evaluated over the same values just before
        raise QueryTypeError("the inputs of a window SUM / AVG cannot be evaluated on placeholder values; nothing was "
                             "charged", hint="check the casts and arithmetic inside the window's SUM / AVG") from None
    for i, (where, w) in enumerate(located):
        typ = str(out.column(f"t{i}")[0])
        wide = typ.startswith("DECIMAL(") and int(typ[8:].split(",")[0]) > _SUMMED_DECIMAL_PRECISION
        if typ in ("HUGEINT", "INTERVAL") or wide:
            raise QueryTypeError(
                f"the window {windows.FUNCTIONS[type(windows.function(w))]} in {where} adds {typ} values, whose sum can overflow on large released values (a "
                "window's sum cannot be made NULL on overflow); nothing was charged",
                hint="add them as DOUBLE, e.g. SUM(CAST(x AS DOUBLE)) OVER (...)" if typ != "INTERVAL" else
                "average the interval's seconds, e.g. AVG(date_part('epoch', x)) OVER (...)")


def _located_windows(plan: ir.QueryPlan) -> list[tuple[str, exp.Window]]:
    """Each window of the outputs, ORDER BY and QUALIFY, with where it is as a message names it."""
    places = [(f"output '{o.name}'", o.expr) for o in plan.outputs] + [("ORDER BY", o.this) for o in plan.order]
    return [(where, w) for where, e in places + [("QUALIFY", plan.qualify)] if e is not None
            for w in e.find_all(exp.Window)]


def _as_written(plan: ir.QueryPlan, e: exp.Expression) -> str:
    """``e`` (over the released columns ``__k*``, ``__a*``) spelled with the query's keys and aggregates."""
    names = {k.name: k.sql for k in plan.keys} | {a.name: a.sql for a in plan.aggregates}
    e = e.copy()
    for c in list(e.find_all(exp.Column)):
        if c.name in names:
            if c is e:
                return names[c.name]
            c.replace(exp.Var(this=names[c.name]))
    return e.sql(dialect="duckdb")


def _window_failure(backend: _Runs, plan: ir.QueryPlan, source: Callable[[str], exp.Expression],
                    table: pa.Table | None = None) -> QueryTypeError | None:
    """After the post-processing failed over public values (``source``: the placeholders or the declared keys): a
    window that fails there alone because LAG / LEAD's default does not convert to its argument's type (DuckDB
    converts it, outside any TRY), or because SUM / AVG does not add its argument's type (a DATE quantile), as a
    refusal naming it and the fix; None when no window is found so. Reads no private row."""
    rows = table if table is not None else pa.table({"__none": [0]})
    keys = [k.name for k in plan.keys]

    def runs(*items: exp.Expression) -> pa.Table | None:
        try:
            return backend.post_process(rows, lambda rel: exp.select(*items).from_(source(rel)))
        except ExecutionError:
            return None

    def prepared(w: exp.Window, *, default: bool = True) -> exp.Window:
        """``w`` as ``post_ast`` evaluates it (its inputs guarded, ties broken by the keys), without LAG / LEAD's
        default if not ``default``."""
        w = windows.tie_broken(w.copy(), keys)
        if not default:
            windows.function(w).set("default", None)
        for part in windows.inputs(w):
            part.replace(_guard_shifts(_guard_divisors(part.copy())))
        return w

    for where, w in _located_windows(plan):
        f = windows.function(w)
        if not isinstance(f, (exp.Lag, exp.Lead, exp.Sum, exp.Avg)) or runs(prepared(w)) is not None:
            continue
        typed = runs(exp.alias_(exp.func("typeof", _guard_shifts(_guard_divisors(f.this.copy()))), "t"))
        if typed is None or not typed.num_rows:
            continue
        typ, arg, name = str(typed.column("t")[0]), _as_written(plan, f.this), windows.FUNCTIONS[type(f)]
        default = f.args.get("default") if isinstance(f, (exp.Lag, exp.Lead)) else None
        if default is not None:
            if runs(prepared(w, default=False)) is None:
                continue
            offset = f.args["offset"].sql(dialect="duckdb")
            return QueryTypeError(
                f"the default {default.sql(dialect='duckdb')} of the window {name} in {where} does not convert to "
                f"{typ}, the type of its argument {arg} ({name} converts its default to it); nothing was charged",
                hint=f"give a default of type {typ}, e.g. {name}({arg}, {offset}, {_EXAMPLE.get(typ, 'NULL')}); for "
                     f"another value, convert the result: COALESCE(CAST({name}({arg}, {offset}) OVER (...) AS VARCHAR), "
                     f"{default.sql(dialect='duckdb')})")
        if isinstance(f, (exp.Sum, exp.Avg)):
            try:
                probe = type(f)(this=exp.Cast(this=exp.Null(), to=exp.DataType.build(typ, dialect="duckdb")))
            except (ParseError, ValueError):
                probe = None
            if probe is not None and runs(exp.alias_(probe, "s")) is not None:
                continue  # (it adds this type: the window failed otherwise, e.g. an overflow on a key value)
            dated = typ == "DATE" or typ.startswith("TIMESTAMP")
            return QueryTypeError(
                f"the window {name} in {where} adds {typ} values ({arg}): {name} adds numbers only; nothing was "
                "charged",
                hint=(f"add the days since a date, e.g. {name}({arg} - DATE '2000-01-01') OVER (...), or take AVG, MIN "
                      "or MAX of the dates" if typ == "DATE" else
                      f"add the seconds since 1970, e.g. {name}(date_part('epoch', {arg})) OVER (...), or take AVG, MIN "
                      "or MAX of the times" if dated else
                      f"add a number computed from the value, e.g. {name}(length({arg})) OVER (...)"))
    return None


#: a literal of each type, as a LAG / LEAD default in a refusal's hint
_EXAMPLE = {"DOUBLE": "0", "BIGINT": "0", "HUGEINT": "0", "INTEGER": "0", "BOOLEAN": "false", "VARCHAR": "''",
            "DATE": "DATE '2000-01-01'", "TIMESTAMP": "TIMESTAMP '2000-01-01 00:00:00'"}


def _guard_divisors(e: exp.Expression) -> exp.Expression:
    """Integer division and modulo by zero give NULL (as in WHERE), never an error: a noisy
    value may be 0, and the free check runs on placeholder zeros."""
    for node in list(e.find_all(exp.IntDiv, exp.Mod)):
        node.set("expression", exp.func("nullif", exp.Paren(this=node.expression.copy()), exp.Literal.number(0)))
    return e


def _guard_shifts(e: exp.Expression) -> exp.Expression:
    """``x +/- INTERVAL n unit`` over released values, total as over private rows: ``x`` read as a
    TIMESTAMP (a DATE, or a key; a number does not bind, refused before the charge) and shifted only
    when it and its shift lie in years 1..9999, else NULL (``dpsql.plan.typer.guarded_shift``).
    Innermost first, so that a chain of shifts is guarded at every step."""
    shifts = [n for n in e.find_all(exp.Add, exp.Sub)
              if isinstance(n.expression, exp.Interval) or (isinstance(n, exp.Add) and isinstance(n.this, exp.Interval))]
    for node in sorted(shifts, key=lambda n: -n.depth):
        interval, x = ((node.expression, node.this) if isinstance(node.expression, exp.Interval)
                       else (node.this, node.expression))
        parts = interval_parts(interval)
        if parts is None:  # pragma: no cover - refused by the allow-list checks (plan.typer.node_problem)
            raise QueryTypeError(INTERVAL_FORM)
        sign = -1 if isinstance(node, exp.Sub) else 1
        stamp = exp.Cast(this=exp.Paren(this=x.copy()), to=exp.DataType.build("TIMESTAMP"))
        guarded = exp.Paren(this=guarded_shift(stamp, sign * parts[0], sign * parts[1]))
        if node is e:
            return guarded
        node.replace(guarded)
    return e


def _placeholders(plan: ir.QueryPlan, key_types: dict[str, str], aggregate_types: dict[str, str]) -> list[exp.Expression]:
    """One row of public placeholder values of the released relation's columns, typed as released."""
    cols: list[exp.Expression] = []
    for k in plan.keys:
        # a DATE or TIMESTAMP key is a date, never NULL: over NULL, DuckDB folds a comparison with a literal
        # ('garbage', DATE 'garbage') without converting it, which then failed under TRY after the charge
        kt = key_types[k.name]
        dated = kt == "DATE" or kt.startswith("TIMESTAMP")
        key = exp.Literal.string("1970-01-01") if dated else exp.Null()
        cols.append(exp.alias_(exp.cast(key, exp.DataType.build(kt, dialect="duckdb")), k.name))
    for a in plan.aggregates:
        # a non-NULL placeholder: conversions in HAVING / ORDER BY are only tried on values
        typ = aggregate_types.get(a.name, "DOUBLE")
        zero = exp.Literal.string("1970-01-01") if typ in ("DATE", "TIMESTAMP") else exp.Literal.number(0)
        cols.append(exp.alias_(exp.cast(zero, typ), a.name))
    return cols


def output_query(plan: ir.QueryPlan, key_types: dict[str, str], aggregate_types: dict[str, str]) -> exp.Expression | None:
    """The post-processing query over one row of typed placeholders: binding it gives the types of the outputs
    (public metadata only); None when the key types are not all known (keys released from a public domain)."""
    if not all(k.name in key_types for k in plan.keys):
        return None
    return post_ast(plan, exp.select(*_placeholders(plan, key_types, aggregate_types)).subquery("__released"), [])


def check(
    backend: _Runs, plan: ir.QueryPlan, key_types: dict[str, str], aggregate_types: dict[str, str],
    key_domain: pa.Table | None, *, no_row: list[UnsupportedQueryError] | None = None,
) -> None:
    """Refuse, before the charge, post-processing that cannot be evaluated (reads no private row).

    ``key_types``: SQL type of each key column of the bounded relation; ``aggregate_types``: of
    each released aggregate; ``key_domain``: the released keys when they are public (declared),
    then the post-processing is run over exactly them. ``no_row`` (one of several groupings or a UNION ALL's
    SELECTs): the refusal of conditions on the keys that keep none of them is put there instead of raised; the request
    is refused only where each of its queries has no row (``dpsql.groupings``), as for ``HAVING 1 = 0``.
    """
    typed = all(k.name in key_types for k in plan.keys)
    cols: list[exp.Expression] | None = None
    rel: exp.Expression | None = None
    ast: exp.Expression | None = None
    if typed:  # built once for the checks below (a long IN list's condition is most of it)
        try:
            cols = _placeholders(plan, key_types, aggregate_types)
            rel = exp.select(*cols).subquery("__released")
            ast = post_ast(plan, rel, [])
        except Exception:  # noqa: BLE001 - raised again below, after the casts' check, where it was raised
            cols = rel = ast = None
    if cols is None or rel is None or ast is None:
        _refuse_casts_between_numbers_and_dates(post_ast(plan, exp.to_table("__released"), []), key_types, aggregate_types)
    else:  # the same casts (the placeholders' own left out), found in the same order
        _refuse_casts_between_numbers_and_dates(ast, key_types, aggregate_types, skip={id(n) for c in cols for n in c.walk()})
    if typed:
        if cols is None or rel is None or ast is None:
            cols = _placeholders(plan, key_types, aggregate_types)
            rel = exp.select(*cols).subquery("__released")
            ast = post_ast(plan, rel, [])
        try:
            backend.bind_check(ast, run=True)
        except QueryTypeError as failed:
            named = _window_failure(backend, plan, lambda rel: exp.select(*cols).subquery("__placeholders"))
            if named is not None:
                raise named from None
            try:
                backend.bind_check(ast)  # it binds: only its evaluation on the zeros failed
            except QueryTypeError:
                raise failed from None
            raise QueryTypeError(
                "the query's outputs, HAVING or ORDER BY fail on a released value of 0 (a noisy release can be 0, and "
                "a DATE or TIMESTAMP 1970-01-01: they are evaluated there before the charge); nothing was charged",
                hint="keep the expression valid at 0, e.g. GREATEST(CAST(COUNT(*) AS INTEGER), 1) for a day of the month",
            ) from None
        if plan.having is not None:
            _check_having_literals(backend, plan, key_types, cols, ast, rel)
        _check_window_sums(backend, plan, lambda rel: exp.select(*cols).subquery("__placeholders"))
    elif key_domain is None:  # pragma: no cover - every mechanism gives key types or the key values
        raise AssertionError("post-processing check needs the key types or the key values")
    if key_domain is not None:
        try:
            _check_on_keys(backend, plan, aggregate_types, key_domain)
        except UnsupportedQueryError as e:
            if no_row is None or not getattr(e, "no_key_kept", False):
                raise
            no_row.append(e)


def _no_key_kept(message: str, hint: str) -> UnsupportedQueryError:
    """The refusal of conditions on the GROUP BY keys that keep none of the public keys (no row whatever the data)."""
    e = UnsupportedQueryError(message, hint=hint)
    e.no_key_kept = True  # type: ignore[attr-defined]
    return e


def _constant_conjuncts(e: exp.Expression | None) -> list[exp.Expression]:
    """The conjuncts of ``e`` that read nothing (no column, aggregate, window nor subquery): each is one value
    whatever the data (``1 = 0``, ``FALSE``, ``NULL``, ``'a' > 'b'``)."""
    return [c for c in satisfiable.conjuncts(e) if not any(
        isinstance(n, (exp.Column, exp.AggFunc, exp.Window, exp.Select, exp.Star, exp.Placeholder)) for n in c.walk())]


def _true_constant(backend: _Runs, condition: exp.Expression) -> bool:
    """Whether a condition that reads nothing is true (NULL, false or failing: not), evaluated by the engine over a
    public one-row relation (reads no private row)."""
    test = exp.Try(this=exp.cast(condition, "BOOLEAN", copy=False))
    one = pa.table({"__one": pa.array([1], pa.int64())})
    return backend.post_process(one, lambda rel: exp.select("__one").from_(rel).where(test)).num_rows > 0


def refuse_no_row(backend: _Runs, route: Any, public: Any = None) -> None:
    """Raise :func:`no_row_refusal` of a query sent alone (a route: its plan, mechanism and calibration); a query of
    several groupings is refused so only with the others (``dpsql.groupings``)."""
    if route.request.plan is not None:
        refusal = route_no_row_refusal(backend, route, public)
        if refusal is not None:
            raise refusal


def route_no_row_refusal(backend: _Runs, route: Any, public: Any = None) -> UnsupportedQueryError | None:
    """:func:`no_row_refusal` of a route whose plan is not None (alone, or one of several groupings); ``public``: the
    engine as a check before the charge sees it (``dpsql.engine.PublicReads``: public tables only), or None."""
    # a lookup join answered on the one-table path keeps its WHERE in its join plan (``joined_where``, of that
    # mechanism only): `WHERE 1 = 0 GROUP BY e.cc` over `events e JOIN regions r` was charged and released no row,
    # where the same query on `events` is refused (so was each query of its GROUPING SETS)
    return no_row_refusal(backend, route.request.plan, lambda: route.mechanism.key_domain(route.calibration),
                          *lookup_where(route.mechanism, public))


def lookup_where(mechanism: Any, public: Any) -> tuple[exp.Expression | None, Callable[[], Any] | None]:
    """A lookup join's WHERE over the joined relation and its check of the public lookups' rows (``joined_where``
    and ``no_public_row`` of that mechanism only; (None, None) for any other), as :func:`no_row_refusal` takes them."""
    joined = getattr(mechanism, "joined_where", None)
    check = getattr(mechanism, "no_public_row", None)
    return joined, (None if check is None or joined is None or public is None else functools.partial(check, public))


def no_row_refusal(backend: _Runs, plan: ir.QueryPlan, key_domain: Callable[[], pa.Table | None],
                   joined_where: exp.Expression | None = None,
                   no_public_row: Callable[[], Any] | None = None) -> UnsupportedQueryError | None:
    """The free refusal of a release that has no row whatever the data (it would be charged for nothing, as LIMIT 0),
    or None: a HAVING with a conjunct that reads nothing and is not true (every released row is dropped); over keys
    released above a noisy threshold (no public key set), a WHERE with such a conjunct (no group has a row, so none passes the threshold; over public keys the release is noisy
    zeros, and without GROUP BY a noisy count, both answered). Reads the SQL and public one-row relations only.
    ``key_domain``: the mechanism's public key set (None: none), asked only where needed; ``joined_where``: a lookup
    join's WHERE, over the joined relation (its one-table plan's own is None); ``no_public_row``: that join's
    refusal of a WHERE keeping no row of a public lookup (public rows only), or None. A query of several
    groupings is refused so only when each of its queries is (``dpsql.groupings``: ``GROUPING(k) = 1`` is ``0 = 1``
    in the query grouping by k, and the total still has its row)."""
    if not plan.aggregates and plan.public_keys:
        return None  # public keys alone: nothing is charged
    for c in _constant_conjuncts(plan.having):
        if not _true_constant(backend, _guard_shifts(_guard_divisors(c.copy()))):
            return UnsupportedQueryError(
                f"HAVING {c.sql(dialect='duckdb')} is not true whatever the data, so it drops every row of the release, "
                "which would be charged for nothing; nothing was charged",
                hint="drop the condition (explain shows the cost for free)")
    where_of = plan.where if joined_where is None else joined_where
    if not plan.keys or plan.public_keys or where_of is None:
        return None
    where = _constant_conjuncts(where_of)
    # (a lookup join's WHERE names the joined relation's columns `alias__column`, its one-table plan's schema too)
    columns = satisfiable.one_column_groups(where_of, plan.table.schema) \
        if plan.join is None or joined_where is not None else {}
    if (where or columns or no_public_row is not None) and key_domain() is None:  # (a large declared domain has no key set here either)
        for c in where:
            try:
                typed = type_predicate(c, {}, "WHERE")  # (the total rendering the bounded query runs)
            except TypeRefusal:  # pragma: no cover - the analysis typed the whole WHERE
                continue
            if not _true_constant(backend, typed):
                return UnsupportedQueryError(
                    f"{clause_of(c)} {c.sql(dialect='duckdb')} is not true whatever the data, so no group has a row and none "
                    "can pass the release threshold: the release would have no row, and be charged for nothing; "
                    "nothing was charged", hint="drop the condition (explain shows the cost for free)")
        for name, conjuncts in columns.items():
            if not _some_value_meets(backend, name, plan.table.schema[name], conjuncts):
                text, shown = _as_written_conditions(conjuncts, name, joined_where is not None)
                return UnsupportedQueryError(
                    f"{text} for no value of column {shown!r} ({plan.table.schema[name]}), so no group has "
                    "a row and none can pass the release threshold: the release would have no row, and be charged "
                    "for nothing; nothing was charged", hint="check the conditions on the column (explain shows the "
                    "cost for free)")
        if no_public_row is not None:
            refused = no_public_row()
            if isinstance(refused, UnsupportedQueryError):
                return refused
    return None


def written_conditions(conditions: list[tuple[str | None, exp.Expression]], *, joined: bool) -> tuple[str, bool]:
    """Conditions as the query wrote them, each under its clause (``ON e.v > 5 and WHERE e.v < 3``; an inner join's ON
    condition is one of the WHERE's here, marked so: ``dpsql.plan.checks.clause_of``), and whether they are in
    several clauses (the verb's number). Each is (its clause, or None to read the mark; the condition). A merged
    view's column is shown under its own name (``val``, not the base table's ``v``), a joined relation's ``e__v`` as
    ``e.v``. ``joined``: over a joined relation's columns (a one-table column may hold ``__``)."""
    named = as_qualified if joined else (lambda c: c.copy())
    by_clause: dict[str, list[str]] = {}
    for clause, c in conditions:
        # (an OR among them in its parentheses: `(v > 5 OR v IS NULL) AND v < 3` was shown without them, a
        # condition that v = 6 meets)
        w = named(as_written(c))
        while isinstance(w, exp.Paren):
            w = w.this
        by_clause.setdefault(clause or clause_of(c), []).append(
            (exp.Paren(this=w) if isinstance(w, exp.Connector) and len(conditions) > 1 else w).sql(dialect="duckdb"))
    return " and ".join(f"{clause} {' AND '.join(cs)}" for clause, cs in by_clause.items()), len(by_clause) > 1


def _as_written_conditions(conjuncts: list[exp.Expression], name: str, joined: bool) -> tuple[str, str]:
    """:func:`written_conditions` of conditions on one column with their verb, and the column as the query named it."""
    text, several = written_conditions([(None, c) for c in conjuncts], joined=joined)
    column = next((col for c in conjuncts for col in c.find_all(exp.Column)), exp.column(name))
    shown = (as_qualified if joined else (lambda c: c.copy()))(as_written(column))
    return text + (" hold" if several else " holds"), shown.sql(dialect="duckdb")


def as_qualified(cond: exp.Expression) -> exp.Expression:
    """A condition over a joined relation's columns (``e__v``) as the query names them (``e.v``); others unchanged."""
    from dpsql.plan.joins import SEP

    def back(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and not n.table and SEP in n.name:
            alias, column = n.name.split(SEP, 1)
            return exp.column(column, table=alias)
        return n

    return cond.copy().transform(back)


def _some_value_meets(backend: _Runs, name: str, type_name: str, conjuncts: list[exp.Expression]) -> bool:
    """Whether the conjunction of conditions on column ``name`` alone holds for some value of its type
    (``dpsql.plan.satisfiable``: exact for the shapes it accepts). Evaluated by the engine over public relations (the
    conditions' constants, then candidate values cast to the type); True where it cannot be decided."""
    sql_type = parse_type(type_name)
    if sql_type.enum:
        return True
    if sum(isinstance(n, exp.Literal) for c in conjuncts for n in c.walk()) > MEETS_MOST_CONSTANTS:
        return True  # a long IN list: not decided (its typing and candidates cost ~1.5 ms a constant), runs as before
    try:
        typed = type_predicate(exp.and_(*(c.copy() for c in conjuncts)), {name: type_name}, "WHERE")
    except Exception:  # pragma: no cover - the analysis typed the whole WHERE (not decided: the query runs as before)
        return True
    key = (type_name, typed.sql(dialect="duckdb"))
    with _MEETS_LOCK:
        known = _MEETS.get(key)
        if known is not None:
            _MEETS.move_to_end(key)
            return known
    meets = _decide_meets(backend, name, type_name, sql_type, typed)
    with _MEETS_LOCK:
        _MEETS[key] = meets
        while len(_MEETS) > 512:
            _MEETS.popitem(last=False)
    return meets


#: the most constants (literals) in the conditions on one column that :func:`_some_value_meets` decides: each costs its
#: typing and a few candidate values (about 1.5 ms a constant in all), so a WHERE of 2 000 listed values beside another
#: condition on the column took 3 s more CPU; with more, the conditions are not decided (the query runs as before)
MEETS_MOST_CONSTANTS = 256

#: decisions of :func:`_some_value_meets` by (type, typed conditions): public (SQL and catalog only)
_MEETS: OrderedDict[tuple[str, str], bool] = OrderedDict()
_MEETS_LOCK = threading.Lock()


def _decide_meets(backend: _Runs, name: str, type_name: str, sql_type: Any, typed: exp.Expression) -> bool:
    try:
        constants = satisfiable.constant_operands(typed)
        values: list[Any] = []
        if constants:
            one = pa.table({"__one": pa.array([1], pa.int64())})
            row = backend.post_process(one, lambda rel: exp.select(
                *(exp.alias_(exp.Try(this=c.copy()), f"__c{j}") for j, c in enumerate(constants))).from_(rel))
            values = list(row.to_pylist()[0].values())
        texts = pa.table({"__v": pa.array(satisfiable.candidates(sql_type, values), pa.string())})
        to = exp.DataType.build(type_name, dialect="duckdb")

        def build(rel: str) -> exp.Expression:
            inner = exp.select(exp.alias_(exp.TryCast(this=exp.column("__v"), to=to), name, quoted=True)).from_(rel)
            test = exp.Try(this=exp.cast(typed, "BOOLEAN", copy=False))
            return exp.select("1").from_(inner.subquery("__candidates")).where(test).limit(1)

        return backend.post_process(texts, build).num_rows > 0
    except Exception:  # (a constant or candidate the engine or Arrow cannot hold): not decided, the query runs
        return True


#: placeholder values of a number or boolean key for ``_check_having_literals``: a HAVING failing at each of them
#: fails whatever the key's value (a literal that does not convert to the key's type: ``HAVING i = 'abc'``)
_KEY_TRIES = {"number": ("0", "1", "1000003", "-7"), "bool": ("false", "true")}


def _check_having_literals(backend: _Runs, plan: ir.QueryPlan, key_types: dict[str, str],
                           cols: list[exp.Expression], ast: exp.Expression, rel: exp.Expression) -> None:
    """Refuse for free a HAVING that fails for every value of a number or boolean key: over the NULL placeholder of
    ``check`` DuckDB folds ``i = 'abc'`` without converting 'abc', and the query was charged and then released
    nothing (WHERE refuses such a literal for free). Tried at a few public values of each such key (the other
    outputs as in ``check``); one that succeeds at any of them is left to run. Reads no private row. ``ast``: the
    post-processing query over ``rel``, the placeholders ``cols``, whose relation each try replaces (the query built
    once: a long IN list's condition is most of it)."""
    tried: list[tuple[int, str]] = []
    for i, k in enumerate(plan.keys):
        t = parse_type(key_types[k.name])
        if t.kind == "bool" or t.numeric:
            tried.append((i, "bool" if t.kind == "bool" else "number"))
    if not tried:
        return
    for j in range(max(len(_KEY_TRIES[kind]) for _, kind in tried)):
        row = [c.copy() for c in cols]
        for i, kind in tried:
            values = _KEY_TRIES[kind]
            name = plan.keys[i].name
            row[i] = exp.alias_(exp.cast(exp.Literal.string(values[j % len(values)]), exp.DataType.build(
                key_types[name], dialect="duckdb")), name)
        tried_rel = exp.select(*row).subquery("__released")
        rel.replace(tried_rel)  # ``post_ast(plan, tried_rel, [])``, built once
        rel = tried_rel
        try:
            backend.bind_check(ast, run=True)
            return
        except QueryTypeError:
            continue
    raise QueryTypeError(
        "HAVING fails whatever the value of a key: a literal compared with a number or boolean key does not convert "
        "to the key's type (e.g. i = 'abc'); nothing was charged",
        hint="compare a key with a literal of its type (i = 5, b = true), or quote it as the key's type reads it",
    )


def _kind(type_name: str | None) -> str | None:
    """'number' (numbers and booleans), 'time' (dates and timestamps) or None, of a SQL type's name (the typer's)."""
    if type_name is None:
        return None
    t = parse_type(type_name)
    return "time" if t.kind in ("date", "timestamp") else "number" if t.numeric or t.kind == "bool" else None


def _refuse_casts_between_numbers_and_dates(ast: exp.Expression, key_types: dict[str, str],
                                            aggregate_types: dict[str, str], skip: Collection[int] = ()) -> None:
    """A cast between numbers (or booleans) and dates or timestamps over released values converts nothing on any
    engine: refused naming the functions that convert (the typer's refusal of it over private rows). ``skip``: the
    ids of casts not to check (the typed placeholders of released values)."""
    types = {**key_types, **aggregate_types}

    def kind(e: exp.Expression) -> str | None:
        while isinstance(e, exp.Paren):
            e = e.this
        if isinstance(e, exp.Column):
            return _kind(types.get(e.name, "DOUBLE" if e.name.startswith("__a") else None))
        if isinstance(e, exp.Cast):
            return _kind(type_text(e.args["to"]))
        if isinstance(e, exp.Literal | exp.Boolean):
            return None if isinstance(e, exp.Literal) and e.is_string else "number"
        if isinstance(e, exp.Neg):
            return kind(e.this)
        if isinstance(e, exp.Add | exp.Sub | exp.Mul | exp.Div):
            return "number" if kind(e.this) == kind(e.expression) == "number" else None
        return None

    for node in ast.find_all(exp.Cast):
        if id(node) in skip:
            continue
        pair = {kind(node.this), _kind(type_text(node.args["to"]))}
        if pair == {"number", "time"}:
            raise QueryTypeError(
                f"the query's outputs, HAVING or ORDER BY cast between a number (or boolean) and a date or timestamp "
                f"({node.sql(dialect='duckdb')}): such a value cannot be cast, no engine converts between them; "
                "nothing was charged",
                hint="convert with make_date(year, month, day), or read a date's parts with year(d), month(d), day(d) "
                "or date_part('epoch', ts)")


#: released aggregate types whose placeholder is not the DOUBLE 0.0 (0 is 1970-01-01 for a DATE / TIMESTAMP)
_PLACEHOLDER_TYPES = {"BIGINT": pa.int64(), "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us")}


def _check_on_keys(backend: _Runs, plan: ir.QueryPlan, aggregate_types: dict[str, str], key_domain: pa.Table) -> None:
    """With public keys the released keys are exactly ``key_domain``: run the post-processing
    over them (zeros for the aggregates), so what fails there is refused before the charge."""
    n = key_domain.num_rows
    values: dict[str, Any] = {name: key_domain.column(name) for name in key_domain.column_names}
    for a in plan.aggregates:
        typ = aggregate_types.get(a.name)
        values[a.name] = pa.array([0] * n, _PLACEHOLDER_TYPES[typ]) if typ in _PLACEHOLDER_TYPES else pa.array([0.0] * n, pa.float64())
    try:
        out = backend.post_process(pa.table(values), lambda rel: post_ast(plan, exp.to_table(rel), []))
        _check_window_sums(backend, plan, exp.to_table, pa.table(values))
    except ExecutionError:
        named = _window_failure(backend, plan, exp.to_table, pa.table(values))
        if named is not None:
            raise named from None
        raise QueryTypeError(
            "the query's outputs, HAVING or ORDER BY cannot be evaluated on the declared key values; nothing was charged",
            hint="check casts and arithmetic over the GROUP BY keys (e.g. CAST(key AS INTEGER) on text keys)",
        ) from None
    kept, every = _key_conjuncts(plan)
    # a QUALIFY that reads the keys alone (its windows' arguments, partitions and orders too) over a HAVING on the keys
    # alone: the release is the key set those conditions keep, then the QUALIFY over exactly those rows (the windows'
    # ties broken by the keys), so whether a key is kept is public as well
    qualify = plan.qualify is not None and len(kept) == len(every) and _on_keys(plan.qualify, plan)
    if (kept or qualify) and plan.aggregates:
        # the release lists the declared keys the WHERE's conditions on them (and HAVING's on the keys alone) keep:
        # when they keep none, it has no row whatever the data, and would be charged for nothing (as a range histogram
        # whose WHERE keeps no bin, LIMIT 0)
        # evaluated as the release evaluates them (under TRY): a key on which a condition fails (CAST(c AS INTEGER) on
        # 'x') is dropped there, the others kept. Where they are the whole HAVING, with no window, QUALIFY, LIMIT or
        # OFFSET, the run above kept exactly those keys: it evaluated the same condition on every key without a
        # failure, so under TRY each is the same value (a long IN list's condition is then run once, not twice)
        if len(kept) == len(every) and plan.qualify is None and not _located_windows(plan) and plan.limit is None \
                and plan.offset is None:
            rows = out.num_rows
        else:
            only = dataclasses.replace(plan, having=exp.and_(*[c.copy() for c in kept], copy=False) if kept else None,
                                       order=[], qualify=plan.qualify if qualify else None, limit=None, offset=None)
            rows = backend.post_process(pa.table(values), lambda rel: post_ast(only, exp.to_table(rel), [], total=True)).num_rows
        if rows == 0:
            # the released keys' values (a declared domain, or a range histogram's bin labels, which no domain lists)
            listed = {k.name: list(dict.fromkeys(key_domain.column(k.name).to_pylist())) for k in plan.keys}
            domains = "; ".join(f"{k.sql}: {', '.join(repr(v) if isinstance(v, str) else str(v) for v in listed[k.name][:5])}"
                                + (", ..." if len(listed[k.name]) > 5 else "") for k in plan.keys)
            # keys the WHERE lists (analyze.listed_domain) are not declared: named as the query gave them
            marks = [k.listed for k in plan.keys]
            which = "declared" if not any(marks) else "listed" if all(marks) else "listed or declared"
            if plan.join is not None and any(k.domain is None and not k.listed for k in plan.keys):
                which = "public"  # (a grouped join's key set read from public tables' rows or a DATE range's days)
            if plan.join is not None and not qualify and any(k.domain is None and not k.listed for k in plan.keys):
                # a grouped join's key set read from public tables' rows or a DATE range's days (every key released)
                raise _no_key_kept(
                    f"the conditions on the GROUP BY keys (in WHERE, or in HAVING alone) exclude every public key "
                    f"({domains}), so the release would have no row whatever the data, and be charged for nothing; "
                    "nothing was charged",
                    hint="check the conditions against the keys' declared ranges and domains, and the public tables' "
                         "rows (explain lists the keys)")
            if qualify:
                # (a QUALIFY whose ROW_NUMBER() orders released values: the rows it keeps are numbered whatever they hold)
                numbers = "" if _on_keys(plan.qualify, plan, numbered=False) else " or the rows' numbers"
                raise _no_key_kept(
                    f"the conditions on the GROUP BY keys (in WHERE, HAVING and QUALIFY, which read the keys alone{numbers}) "
                    f"keep no {which} key ({domains}), so the release would have no row whatever the data, and be charged "
                    "for nothing; nothing was charged",
                    hint="check the QUALIFY against the number of keys the other conditions keep (explain lists the "
                         "keys)")
            raise _no_key_kept(
                f"the conditions on the GROUP BY keys (in WHERE, or in HAVING alone) exclude every {which} key ({domains}), so the release "
                "would have no row whatever the data, and be charged for nothing; nothing was charged",
                hint=f"check the conditions against the {'declared domains' if which == 'declared' else which + ' keys'} "
                "(explain lists the keys); a row whose key is "
                f"not {which} is in no group: group by an expression of the column, e.g. COALESCE(c, 'none'), to "
                "count such rows (its keys are then released above a noisy threshold)")
    if plan.aggregates and plan.offset:
        # the release has at most one row per key the conditions on the keys alone keep (all of them without such
        # conditions; those a QUALIFY on the keys alone keeps of them): an OFFSET skipping that many leaves no row
        # whatever the data, as LIMIT 0 does
        most = rows if kept or qualify else n
        if plan.offset >= most:
            raise UnsupportedQueryError(
                f"OFFSET {plan.offset} skips every row of the release, which has at most {most} (one per public key the "
                "conditions on the keys keep), so it would be charged for nothing; nothing was charged",
                hint=f"use an OFFSET below {most} (explain lists the keys)")


def public_rows(backend: _Runs, plan: ir.QueryPlan, aggregate_types: dict[str, str], key_domain: pa.Table) -> int:
    """The most rows a release over the public keys ``key_domain`` has before its LIMIT and OFFSET: one per key the
    conditions on the keys alone keep (the WHERE's on declared keys and a HAVING on the keys alone; a QUALIFY decided
    on the key set, :func:`_on_keys`), evaluated as :func:`_check_on_keys` evaluates them (public values only); every
    key where they cannot be evaluated."""
    kept, every = _key_conjuncts(plan)
    qualify = plan.qualify is not None and len(kept) == len(every) and _on_keys(plan.qualify, plan)
    if not plan.aggregates or not (kept or qualify):
        return key_domain.num_rows
    n = key_domain.num_rows
    values: dict[str, Any] = {name: key_domain.column(name) for name in key_domain.column_names}
    for a in plan.aggregates:
        typ = aggregate_types.get(a.name)
        values[a.name] = pa.array([0] * n, _PLACEHOLDER_TYPES[typ]) if typ in _PLACEHOLDER_TYPES else pa.array([0.0] * n, pa.float64())
    only = dataclasses.replace(plan, having=exp.and_(*[c.copy() for c in kept], copy=False) if kept else None,
                               order=[], qualify=plan.qualify if qualify else None, limit=None, offset=None)
    try:
        return backend.post_process(pa.table(values), lambda rel: post_ast(only, exp.to_table(rel), [], total=True)).num_rows
    except ExecutionError:  # pragma: no cover - the same conditions were run over the same values by the check
        return n


def _key_conjuncts(plan: ir.QueryPlan) -> tuple[list[exp.Expression], list[exp.Expression]]:
    """The conjuncts of the HAVING (the WHERE's conditions on declared keys included, which the analysis moves there)
    that read the released keys alone, no aggregate nor window (whether a declared key passes them is public), and
    all its conjuncts."""
    keys = {k.name for k in plan.keys}

    def conjuncts(e: exp.Expression | None) -> list[exp.Expression]:
        while isinstance(e, exp.Paren):
            e = e.this
        if isinstance(e, exp.And):
            return conjuncts(e.this) + conjuncts(e.expression)
        return [] if e is None else [e]

    def on_keys(c: exp.Expression) -> bool:  # (one walk: a long IN list's condition is most of the HAVING)
        cols = False
        for n in c.walk():
            if isinstance(n, (exp.Window, exp.AggFunc)) or (isinstance(n, exp.Column) and n.name not in keys):
                return False
            cols = cols or isinstance(n, exp.Column)
        return cols

    conj = conjuncts(plan.having)
    return [c for c in conj if on_keys(c)], conj


def _on_keys(e: exp.Expression, plan: ir.QueryPlan, *, numbered: bool = True) -> bool:
    """Whether ``e`` (a QUALIFY) keeps a public number of the public keys' rows: it reads the released keys alone,
    windows included (their arguments, partitions and orders), and no aggregate; or it reads, besides constants, one
    ``ROW_NUMBER()`` whose order reads released values (``QUALIFY ROW_NUMBER() OVER (ORDER BY COUNT(*) DESC) > 3``),
    partitioned by keys alone, and windows constant on each of its partitions (partitioned alike or not at all, with
    no order, over keys alone, and no NTILE, LAG or LEAD, which number or shift the rows in the keys' order): each partition's rows are numbered 1..its size whatever their order, so the number of
    rows kept in it is a function of its size. Two row numbers over two orders, or a row number beside a key column
    (``ROW_NUMBER() OVER (ORDER BY COUNT(*)) = 1 AND k = 'a'``) or a ``RANK`` over released values keep a number of
    rows that depends on the values: not decided. ``numbered=False``: the first kind only."""
    keys = {k.name for k in plan.keys}

    def reads_keys_alone(node: exp.Expression) -> bool:
        return not any((isinstance(n, exp.AggFunc) and not windows.is_window_function(n))
                       or (isinstance(n, exp.Column) and n.name not in keys) for n in node.walk())

    if reads_keys_alone(e) or not numbered:
        return reads_keys_alone(e)
    found = list(e.find_all(exp.Window))
    numbers = {w.sql() for w in found if isinstance(w.this, exp.RowNumber) and not w.args.get("spec")}
    if len(numbers) != 1:
        return False
    number = next(w for w in found if w.sql() in numbers)
    partition = [p.sql() for p in number.args.get("partition_by") or []]
    if not all(reads_keys_alone(p) for p in number.args.get("partition_by") or []):
        return False
    for w in found:
        if w.sql() in numbers:
            continue
        # (without an ORDER BY, NTILE, LAG, LEAD and ROW_NUMBER still read the rows' order, the keys': each row its
        # own value, which a row number over released values meets or not depending on those values)
        if w.args.get("order") is not None or w.args.get("spec") or not reads_keys_alone(w) \
                or isinstance(windows.function(w), (exp.RowNumber, exp.Ntile, exp.Lag, exp.Lead)) \
                or [p.sql() for p in w.args.get("partition_by") or []] not in ([], partition):
            return False
    # outside the windows: constants only (a key column there would tell which rows are numbered first)
    rest = e.copy()
    for w in list(rest.find_all(exp.Window)):
        w.replace(exp.Literal.number(0))
    return not any(isinstance(n, (exp.Column, exp.AggFunc)) for n in rest.walk())


def _in_key_order(table: pa.Table, keys: list[str]) -> pa.Table:
    """The released rows sorted by their keys: a window's value (the last bits of a floating-point SUM over a
    partition, whose order SQL leaves open) then follows the released values, never the order the mechanism's
    engine produced the rows in (which can follow groups that were not released). A key type Arrow cannot sort
    (public metadata) leaves the order as it is."""
    try:
        return table.sort_by([(k, "ascending") for k in keys])  # (NULL keys last)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # pragma: no cover - every key type sorts today
        return table


def clip_negative(table: pa.Table, columns: list[str]) -> pa.Table:
    """max(0, value) on the given released columns (post-processing; NULL stays NULL)."""
    import pyarrow.compute as pc

    for name in columns:
        if name in table.column_names:
            i = table.column_names.index(name)
            col = table.column(i)
            zero = pa.scalar(0, col.type) if not pa.types.is_floating(col.type) else pa.scalar(0.0, col.type)
            table = table.set_column(i, name, pc.max_element_wise(col, zero))
    return table


def nonnegative_aggregates(plan: ir.QueryPlan) -> list[str]:
    """The aggregates whose true value cannot be negative: counts, and sums/averages of a column
    whose declared lower bound is >= 0 (public metadata only)."""
    out = []
    for a in plan.aggregates:
        if a.kind in ir.PAIR_KINDS:
            # ``bounds`` are the first argument's: a covariance, correlation, slope, intercept or REGR_SXY can be
            # negative whatever they are; REGR_COUNT is a count, REGR_AVGY / REGR_AVGX the mean of y / of x
            arg = {ir.REGR_AVGY: a, ir.REGR_AVGX: a.second}.get(a.kind)
            if a.kind == ir.REGR_COUNT or (arg is not None and arg.bounds is not None and arg.bounds[0] >= 0):
                out.append(a.name)
            continue
        counts = a.kind in (ir.COUNT_STAR, ir.COUNT_COL, ir.COUNT_UNITS, ir.COUNT_DISTINCT)
        if counts or (a.bounds is not None and a.bounds[0] >= 0):
            out.append(a.name)
    return out


def apply(
    backend: _Runs, plan: ir.QueryPlan, released: Released, *, nonnegative: bool = False, estimates: str | None = None
) -> tuple[pa.Table, dict[str, dict[str, Any]], list[str]]:
    """The caller's table from the released values, the accuracy of each output column, and the notes on
    the rows shown (``Released.notes``, then each of ``Released.row_notes`` for the rows that came out).

    ``nonnegative`` (the ``clip_negative`` option): aggregates that cannot be negative are
    released as max(0, value) before the outputs, HAVING and ORDER BY see them. ``estimates``:
    what the released aggregates estimate (the bounded truth, in words), stated per column."""
    table = released.table
    if nonnegative:
        table = clip_negative(table, nonnegative_aggregates(plan))
    accuracy = dict(released.accuracy)
    hidden: list[tuple[str, str]] = []
    for agg, values in released.row_accuracy.items():
        table = table.append_column(f"__row_acc_{agg}", values)
    for agg, values in released.row_noise_std.items():
        table = table.append_column(f"__row_std_{agg}", values)
    taken = {o.name for o in plan.outputs}
    for i, o in enumerate(plan.outputs):
        for prefix, short, per_row in (("__row_acc_", "__ci_", released.row_accuracy),
                                       ("__row_std_", "__sd_", released.row_noise_std)):
            if o.source is not None and o.source in per_row:
                alias = f"{short}{i}"
                while alias in taken:  # never collide with an output the analyst named
                    alias = "_" + alias
                taken.add(alias)
                hidden.append((f"{prefix}{o.source}", alias))
    flagged: list[str] = []
    for i, (flags, _) in enumerate(released.row_notes):
        table = table.append_column(f"__row_note_{i}", flags)
        alias = f"__rn_{i}"
        while alias in taken:
            alias = "_" + alias
        taken.add(alias)
        flagged.append(alias)
        hidden.append((f"__row_note_{i}", alias))
    if plan.keys and _windows(plan, lambda e: e) is not None:
        table = _in_key_order(table, [k.name for k in plan.keys])
    out = backend.post_process(table, lambda rel: post_ast(plan, exp.to_table(rel), hidden, total=True))
    # notes on the rows shown (after HAVING, ORDER BY, LIMIT): the flags of the rows that came out
    notes = list(released.notes)
    for (_, note), alias in zip(released.row_notes, flagged, strict=True):
        text = note(sum(bool(f) for f in out.column(alias).to_pylist()), out.num_rows)
        if text is not None:
            notes.append(text)
        out = out.drop_columns([alias])
    rows_acc: dict[str, list[Any]] = {}
    rows_std: dict[str, list[Any]] = {}
    for col, alias in hidden:
        if alias in flagged:
            continue
        if col.startswith("__row_std_"):
            rows_std[col.removeprefix("__row_std_")] = out.column(alias).to_pylist()
        else:
            rows_acc[col.removeprefix("__row_acc_")] = out.column(alias).to_pylist()
        out = out.drop_columns([alias])
    by_output: dict[str, dict[str, Any]] = {}
    for o in plan.outputs:
        if o.source is not None and o.source in accuracy:
            acc = accuracy[o.source]
            # a summary that is a median over rows is taken over the rows shown (after the WHERE's key
            # exclusions, HAVING and LIMIT), as the per-row lists are
            if o.source in rows_acc:
                acc = {**acc, "per_row_ci95_half_width": rows_acc[o.source]}
                if acc.get("ci95_half_width") is not None:
                    acc["ci95_half_width"] = _median(rows_acc[o.source], acc["ci95_half_width"])
            if o.source in rows_std:
                if acc.get("noise_std") is not None:
                    acc = {**acc, "noise_std": _median(rows_std[o.source], acc["noise_std"])}
                acc = {**acc, "per_row_noise_std": rows_std[o.source]}
            by_output[o.name] = {**acc, "estimates": estimates} if estimates else acc
        elif o.source is None:
            by_output[o.name] = {"note": "derived from released values (post-processing)"}
    return out, by_output, notes


def _median(values: list[Any], otherwise: float) -> float:
    """The median of the finite values (a row released NULL has none), else ``otherwise``."""
    finite = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    if not finite:
        return otherwise
    mid = len(finite) // 2
    return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2
