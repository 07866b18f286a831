"""GROUP BY ROLLUP / CUBE / GROUPING SETS: one request, one charge, one result in SQL's shape.

A query with several groupings (``GROUP BY ROLLUP (a, b)`` is the groupings (a, b), (a) and ()) is answered
as one GROUP BY query per grouping, each routed, bound and released exactly as if it were sent alone
(``dpsql.mechanisms.registry.route``), under one ledger entry whose cost is the sum of theirs.

Privacy claim: each component is (epsilon_i, delta_i)-DP in the neighbour relation of its table (its own
mechanism's claim); by basic sequential composition the whole release is (sum epsilon_i, sum delta_i)-DP,
and the sum is what the ledger is charged. The split of the analyst's (epsilon, delta) over the components
is fixed before any row is read: equal shares, or the ``grouping_weights`` option (public numbers); each
share is the largest float whose decimal is at most its exact fraction of the decimal asked, so the shares
sum to at most what was asked (a Gaussian release's delta adds the same floating-point excess as alone).

The result is SQL's: the rows of every grouping, in the order of the groupings, with NULL in the columns a
grouping does not group by; ``GROUPING(a, ...)`` (and ``GROUPING_ID``) gives, as in DuckDB, a bit per
argument (the first the most significant) set where that column is rolled up, which tells a rolled-up NULL
from a released NULL key. ORDER BY, LIMIT and OFFSET apply to the whole result (post-processing).

Everything before the charge is public metadata only: the groupings come from the SQL text, each component
is analysed, routed and bind-checked before the one ``reserve``; a refusal of any component refuses the
whole request for free. After the charge the components run inside one ``charged`` block: any failure
fails the one entry (its charge stands) with the usual generic error.

What is refused (free): a grouping column used other than as a bare output (inside an expression, HAVING
or ORDER BY by expression), more than ``MAX_GROUPINGS`` groupings, ``GROUP BY ALL`` with groupings, and
ORDER BY terms that name no output column.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp

import dpsql.engine as backends
from dpsql import postprocess
from dpsql.budget import Budget, check_delta, check_epsilon, exact, float_at_most
from dpsql.charge import charged, record_release, reserve
from dpsql.errors import ConfigError, UnsupportedQueryError
from dpsql.options import check_options
from dpsql.plan.parse import DIALECT
from dpsql.release import Plan, Release

#: at most this many groupings in one request (CUBE over 6 columns is 64): each costs a share of the budget
MAX_GROUPINGS = 64

_FUNCS = (exp.Grouping, exp.GroupingId)


@dataclass(frozen=True)
class Groupings:
    """A query with several groupings, split into one GROUP BY query per grouping (public: the SQL text only)."""

    text: str
    kind: str
    components: tuple[str, ...]
    groupings: tuple[tuple[str, ...], ...]  # the columns each component groups by (for explain)
    fills: tuple[tuple[tuple[int, int | None], ...], ...]  # per component: (output position, GROUPING value or NULL)
    names: tuple[str | tuple[int, int], ...]  # per output: its name, or (component, column) that releases it
    order: tuple[tuple[int, bool, bool | None], ...]  # (output position, descending, nulls first) of ORDER BY
    limit: int | None
    offset: int | None


def _bad(msg: str, hint: str) -> UnsupportedQueryError:
    return UnsupportedQueryError(msg + "; nothing was charged", hint=hint)


def _strip(e: exp.Expression) -> exp.Expression:
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def _items(e: exp.Expression) -> list[exp.Expression]:
    e = e if isinstance(e, exp.Tuple) else _strip(e)
    return [_strip(x) for x in e.expressions] if isinstance(e, exp.Tuple) else [e]


def _sets_of(g: exp.Expression) -> list[list[exp.Expression]]:
    """The groupings one GROUP BY element stands for."""
    if isinstance(g, exp.Rollup):
        parts = [_items(x) for x in g.expressions]
        return [list(itertools.chain(*parts[:i])) for i in range(len(parts), -1, -1)]
    if isinstance(g, exp.Cube):
        parts = [_items(x) for x in g.expressions]
        n = len(parts)
        return [list(itertools.chain(*(parts[i] for i in range(n) if m >> (n - 1 - i) & 1)))
                for m in range(2 ** n - 1, -1, -1)]
    if isinstance(g, exp.GroupingSets):
        return [s for x in g.expressions for s in _sets_of(x)]
    return [_items(g)]


def _norm(e: exp.Expression, single: bool) -> str:
    e = e.copy()
    if single:  # one table: t.a and a are the same column
        for c in e.find_all(exp.Column):
            c.set("table", None)
    return e.sql(dialect=DIALECT, normalize=True)


def split(sql: Any, catalog: Mapping[str, Any]) -> Groupings | None:
    """The components of ``sql`` when it groups by ROLLUP, CUBE or GROUPING SETS; None otherwise (any
    other query, or text that does not parse: the ordinary path says what is wrong with it). ``catalog``: the
    registered tables' public metadata (a grouping name that is a column of a table in FROM is that column)."""
    if not isinstance(sql, str):
        return None
    try:
        stmt = sqlglot.parse_one(sql, read=DIALECT)
    except Exception:
        return None
    group = stmt.args.get("group") if isinstance(stmt, exp.Select) else None
    if group is None:
        return None
    plain = [g for g in group.expressions if not isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets))]
    with_all = [k.upper() for k in ("rollup", "cube") if group.args.get(k)]
    if len(plain) == len(group.expressions) and not with_all:
        return None
    if group.args.get("grouping_sets") or group.args.get("all"):
        raise _bad("GROUP BY ALL or WITH GROUPING SETS together with groupings is not supported",
                   "name the grouping columns, e.g. GROUP BY ROLLUP (a, b)")
    kind = " / ".join(dict.fromkeys(
        with_all + [{exp.Rollup: "ROLLUP", exp.Cube: "CUBE", exp.GroupingSets: "GROUPING SETS"}[type(g)]
                    for g in group.expressions if g not in plain]))
    elements = [exp.Rollup(expressions=list(group.expressions)) if with_all == ["ROLLUP"] else
                exp.Cube(expressions=list(group.expressions))] if with_all else group.expressions
    sets: list[list[exp.Expression]] = [[]]
    for g in elements:
        sets = [a + b for a in sets for b in _sets_of(g)]
        if len(sets) > MAX_GROUPINGS:
            raise _bad(f"GROUP BY {kind} gives more than {MAX_GROUPINGS} groupings",
                       "send fewer groupings in one request (each costs a share of its budget)")
    tables = list(stmt.find_all(exp.Table))
    single = len(tables) == 1
    columns = {c for t in tables for c in getattr(catalog.get(t.name.lower()), "schema", {})}
    aliases = {it.alias.lower(): it.this for it in stmt.expressions
               if isinstance(it, exp.Alias) and it.alias.lower() not in columns}  # a column wins, as in DuckDB

    def resolve(e: exp.Expression) -> exp.Expression:  # GROUP BY names an output alias: its expression
        if isinstance(e, exp.Literal) and not e.is_string:
            pos = int(e.this) - 1
            if not 0 <= pos < len(stmt.expressions):
                raise _bad(f"GROUP BY position {e.this} is out of range", "name an output column")
            it = stmt.expressions[pos]
            return it.this if isinstance(it, exp.Alias) else it
        if isinstance(e, exp.Column) and not e.table and e.name.lower() in aliases:
            return aliases[e.name.lower()]
        return e

    sets = [[resolve(e) for e in s] for s in sets]
    universe: dict[str, exp.Expression] = {}
    for s in sets:
        for e in s:
            universe.setdefault(_norm(e, single), e)
    for f in stmt.find_all(*_FUNCS):
        f.set("expressions", [resolve(a).copy() if isinstance(a, exp.Column) else a for a in f.expressions])
        if not f.expressions or any(_norm(_strip(a), single) not in universe for a in f.expressions):
            raise _bad(f"{f.sql(dialect=DIALECT)}: the arguments of GROUPING are columns the query groups by",
                       "name grouping columns only, e.g. GROUPING(a, b) with GROUP BY ROLLUP (a, b)")
    outputs = [_output(it, universe, single) for it in stmt.expressions]
    having = stmt.args.get("having")
    for part, where in ((having, "HAVING"),):
        if part is not None:
            for n in part.walk():
                if not _inside(n) and _norm(n, single) in universe:
                    raise _bad(f"a grouping column in {where} with GROUP BY {kind} is not supported: it is NULL in "
                               "the groupings that roll it up", "filter on it in WHERE, or send the groupings apart")
    components, fills = [], []
    for s in sets:
        keys = {_norm(e, single) for e in s}
        c = stmt.copy()
        for k in ("order", "limit", "offset"):
            c.set(k, None)
        c.set("group", exp.Group(expressions=[e.copy() for e in s]) if s else None)
        items, fill = [], list[tuple[int, int | None]]()
        for i, (it, (name, kept)) in enumerate(zip(c.expressions, outputs, strict=True)):
            if kept is not None and kept not in keys:  # rolled up: NULL, filled in after the release
                fill.append((i, None))
                continue
            inner = _strip(it.this if isinstance(it, exp.Alias) else it)
            if isinstance(inner, _FUNCS):  # GROUPING(...) alone: a constant, filled in after the release
                fill.append((i, int(_grouping_bits(inner, keys, single).this)))
                continue
            named = isinstance(it, exp.Alias) or not any(True for _ in it.find_all(*_FUNCS))
            it = _grouping_bits(it, keys, single)
            items.append(it if named else exp.alias_(it, name, quoted=True))
        if not items:
            raise _bad(f"the grouping ({', '.join(e.sql(dialect=DIALECT) for e in s)}) of GROUP BY {kind} releases "
                       "no value: every output is a column it rolls up", "select an aggregate, e.g. COUNT(*)")
        c.set("expressions", items)
        if c.args.get("having") is not None:
            c.set("having", _grouping_bits(c.args["having"], keys, single))
        components.append(c.sql(dialect=DIALECT))
        fills.append(tuple(fill))
    released_by = [next((i for i, f in enumerate(fills) if p not in {q for q, _ in f}), None)
                   for p in range(len(outputs))]
    names = tuple(outputs[p][0] if k is None else (k, p - sum(q < p for q, _ in fills[k]))
                  for p, k in enumerate(released_by))
    order = _order(stmt, outputs)
    limit, offset = (_count(stmt.args.get(k), k.upper()) for k in ("limit", "offset"))
    return Groupings(sql, kind, tuple(components), tuple(tuple(e.sql(dialect=DIALECT) for e in s) for s in sets),
                     tuple(fills), names, order, limit, offset)


def _parents(n: exp.Expression) -> list[exp.Expression]:
    out, p = [], n.parent
    while p is not None:
        out.append(p)
        p = p.parent
    return out


def _inside(n: exp.Expression) -> bool:
    """``n`` is (inside) GROUPING() or an aggregate's argument: a grouping column there is no output of it."""
    return any(isinstance(p, (*_FUNCS, exp.AggFunc)) for p in [n, *_parents(n)])


def _grouping_bits(node: exp.Expression, keys: set[str], single: bool) -> exp.Expression:
    """``node`` with each GROUPING(x, ...) replaced by its value in the grouping by ``keys``: a bit per argument
    (the first the most significant), set where the argument is rolled up."""
    def one(f: exp.Expression) -> exp.Expression:
        if not isinstance(f, _FUNCS):
            return f
        bits = [_norm(_strip(a), single) not in keys for a in f.expressions]
        return exp.Literal.number(sum(b << (len(bits) - 1 - i) for i, b in enumerate(bits)))

    return node.transform(one)


def _output(it: exp.Expression, universe: dict[str, exp.Expression], single: bool) -> tuple[str, str | None]:
    """(output name, the grouping column it is, or None). A grouping column inside any other output is refused."""
    inner = it.this if isinstance(it, exp.Alias) else it
    name = it.alias if isinstance(it, exp.Alias) else (inner.name if isinstance(inner, exp.Column) else inner.sql(dialect=DIALECT))
    key = _norm(_strip(inner), single)
    if key in universe:
        return name, key
    for n in inner.walk():
        if not _inside(n) and _norm(n, single) in universe:
            raise _bad(f"the output {it.sql(dialect=DIALECT)} uses a grouping column inside an expression, which is "
                       "not supported with several groupings", "select the grouping column itself and compute on the result")
    return name, None


def _order(stmt: exp.Select, outputs: list[tuple[str, str | None]]) -> tuple[tuple[int, bool, bool | None], ...]:
    order = stmt.args.get("order")
    out = []
    for o in order.expressions if order is not None else []:
        e = _strip(o.this)
        pos = None
        if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
            pos = int(e.this) - 1 if 0 < int(e.this) <= len(outputs) else None
        else:
            spelled = e.sql(dialect=DIALECT, normalize=True)
            for i, it in enumerate(stmt.expressions):
                inner = it.this if isinstance(it, exp.Alias) else it
                if spelled in (outputs[i][0].lower(), inner.sql(dialect=DIALECT, normalize=True)) or (
                        isinstance(e, exp.Column) and e.name.lower() == outputs[i][0].lower()):
                    pos = i
                    break
        if pos is None:
            raise _bad(f"ORDER BY {o.this.sql(dialect=DIALECT)} names no output column; with several groupings ORDER "
                       "BY sorts the whole result by its output columns", "order by an output's name or position")
        nulls = o.args.get("nulls_first")
        out.append((pos, bool(o.args.get("desc")), nulls))
    return tuple(out)


def _count(node: Any, what: str) -> int | None:
    if node is None:
        return None
    e = node.expression if isinstance(node, (exp.Limit, exp.Offset)) else node
    if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit() and (what != "LIMIT" or int(e.this) > 0):
        return int(e.this)
    if what == "LIMIT" and isinstance(e, exp.Literal) and e.this.isdigit():
        raise _bad("LIMIT 0 releases no row, so it would be charged for nothing",
                   "drop the LIMIT; explain shows the groupings and the cost for free")
    raise _bad(f"{what} with several groupings must be a whole number", f"write e.g. {what} 10")


# -- routing, explain and run ------------------------------------------------------------------------------
def _shares(total: float, weights: list[Fraction]) -> list[float]:
    """Each share: the largest float whose decimal is at most its exact part of the decimal asked."""
    return [float_at_most(exact(total) * w) for w in weights]


def _weights(g: Groupings, opts: dict[str, Any]) -> list[Fraction]:
    w = opts.pop("grouping_weights", None)
    n = len(g.components)
    if w is None:
        return [Fraction(1, n)] * n
    if not isinstance(w, (list, tuple)) or len(w) != n or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and x == x and x != float("inf") for x in w):
        raise ConfigError(f"grouping_weights must be a list of {n} positive numbers, one per grouping, got {w!r}",
                          hint="explain lists the groupings in order; e.g. grouping_weights=" + str([1] * n))
    ws = [Fraction(repr(float(x))) if isinstance(x, float) else Fraction(x) for x in w]
    return [x / sum(ws) for x in ws]


def _routes(session: Any, g: Groupings, epsilon: Any, delta: Any, options: Any) -> tuple[list[Any], list[Fraction]]:
    eps, d, opts = check_epsilon(epsilon), check_delta(delta), check_options(options)
    weights = _weights(g, opts)
    routes = [session._route(sql, e, dd, opts) for sql, e, dd in
              zip(g.components, _shares(eps, weights), _shares(d, weights), strict=True)]
    return routes, weights


def _cost(routes: list[Any]) -> Budget:
    total = Budget(0.0, 0.0)
    for r in routes:
        total = total + r.description.cost
    return total


def _components(g: Groupings, routes: list[Any], weights: list[Fraction]) -> list[dict[str, Any]]:
    return [{"sql": sql, "grouping": list(keys), "mechanism": r.description.label, "share": float(w),
             "cost": {"epsilon": r.description.cost.epsilon, "delta": r.description.cost.delta},
             "parameters": r.description.details}
            for sql, keys, r, w in zip(g.components, g.groupings, routes, weights, strict=True)]


def _label(routes: list[Any]) -> str:
    return "groupings(" + ", ".join(dict.fromkeys(r.description.label for r in routes)) + ")"


def _reason(g: Groupings, weights: list[Fraction]) -> str:
    split = "equal shares" if len(set(weights)) == 1 else "the shares of grouping_weights"
    return (f"GROUP BY {g.kind}: {len(g.components)} groupings, each answered as its own GROUP BY query with "
            f"{split} of epsilon and delta (basic composition: the cost is the sum)")


def explain(session: Any, g: Groupings, epsilon: Any, delta: Any, options: Any) -> Plan:
    with session._catalog_lock.reading():
        routes, weights = _routes(session, g, epsilon, delta, options)
        asts = [session._bind_check(r) for r in routes]
        bounded = "\n".join(f"-- grouping {i + 1}: ({', '.join(k)})\n{backends.render_bounded(session._engine, a)}"
                            for i, (k, a) in enumerate(zip(g.groupings, asts, strict=True)))
    cost, left = _cost(routes), session._ledger.remaining()
    over = [] if cost.fits_in(left) else [f"this costs more than the remaining budget ({left}): query would refuse it"]
    notes = list(dict.fromkeys(n for r in routes for n in r.description.notes))
    return Plan(sql=g.text, mechanism=_label(routes), reason=_reason(g, weights), cost=cost,
                parameters={"components": _components(g, routes, weights)}, bounded_sql=bounded, notes=[*notes, *over])


def run(session: Any, g: Groupings, epsilon: Any, delta: Any, options: Any) -> Release:
    """``Session.query`` of ``g``, under the caller's catalog lock (from the analysis to the last read of rows)."""
    routes, weights = _routes(session, g, epsilon, delta, options)
    asts = [session._bind_check(r, None if r.description.reuse_of is not None else session._noise.salt())
            for r in routes]
    cost, components = _cost(routes), _components(g, routes, weights)
    tables = sorted({t for r in routes for t in r.request.tables})
    entry = reserve(session._ledger, cost, mechanism=_label(routes), query=g.text, tables=tables,
                    params={"components": components})
    parts, updates = [], []
    with charged(session._ledger, session._engine, entry, "the query"):
        for r, ast in zip(routes, asts, strict=True):
            reused = r.description.reuse_of is not None
            released = r.release(None if reused else backends.fetch_bounded(session._engine, ast), session._noise)
            clip = bool(r.request.options.get("clip_negative", False))
            parts.append(postprocess.apply(session._engine, r.request.plan, released, nonnegative=clip,
                                           estimates=r.description.parameters.get("estimates")))
            updates.append(released.commit.get("params_update") or {})
        table = _combine(session, g, [p[0] for p in parts])
    record_release(session._ledger, entry, {"params_update": {"component_updates": updates}}
                   if any(updates) else {})
    accuracy: dict[str, dict[str, Any]] = {}
    for name in table.column_names:
        seen = [p[1][name] for p in parts if name in p[1]]
        same = all(a == seen[0] for a in seen)
        accuracy[name] = seen[0] if seen and same else {"note": "differs by grouping: see details['components']"}
    for c, p in zip(components, parts, strict=True):
        c["accuracy"] = p[1]
    warns = list(dict.fromkeys(w for p in parts for w in p[2]))
    notes = list(dict.fromkeys(n for r in routes for n in r.description.notes))
    return Release(table, cost, _label(routes), accuracy, entry, False, {"components": components}, notes, warns)


def _combine(session: Any, g: Groupings, tables: list[pa.Table]) -> pa.Table:
    """The components' rows one after another under the names of the outputs (a rolled-up column's NULLs take
    its type), then ORDER BY / LIMIT / OFFSET over the whole (post-processing of released values)."""
    names = [n if isinstance(n, str) else tables[n[0]].column_names[n[1]] for n in g.names]
    typed = []
    for t, fill in zip(tables, g.fills, strict=True):
        for pos, value in fill:  # in order of position: each lands where the query has it
            col = pa.nulls(t.num_rows) if value is None else pa.array([value] * t.num_rows, pa.int64())
            t = t.add_column(pos, names[pos], col)
        typed.append(t.rename_columns(names))
    table = pa.concat_tables(typed, promote_options="permissive")
    if not g.order and g.limit is None and g.offset is None:
        return table
    cols = [f"c{i}" for i in range(len(names))]
    table = table.rename_columns(cols)

    def build(rel: str) -> exp.Expression:
        q = exp.select(*[exp.column(c) for c in cols]).from_(rel)
        if g.order:
            q = q.order_by(*[exp.Ordered(this=exp.column(cols[p]), desc=desc, nulls_first=nf if nf is not None else False)
                             for p, desc, nf in g.order])
        if g.limit is not None:
            q = q.limit(g.limit)
        if g.offset is not None:
            q = q.offset(g.offset)
        return q

    return session._engine.post_process(table, build).rename_columns(names)
