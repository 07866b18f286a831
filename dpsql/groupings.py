"""GROUP BY ROLLUP / CUBE / GROUPING SETS and UNION ALL: one request, one charge, one result in SQL's shape.

A query with several groupings (``GROUP BY ROLLUP (a, b)`` is the groupings (a, b), (a) and ()) is answered
as one GROUP BY query per grouping, and a UNION ALL as one query per SELECT (each of which may have groupings);
each is routed, bound and released exactly as if it were sent alone (``dpsql.mechanisms.registry.route``),
under one ledger entry whose cost is the sum of theirs.

Privacy claim: each component is (epsilon_i, delta_i)-DP in the neighbour relation of its tables (its own
mechanism's claim); by basic sequential composition the whole release is (sum epsilon_i, sum delta_i)-DP,
and the sum is what the ledger is charged. The split of the analyst's (epsilon, delta) over the components
is fixed before any row is read: equal shares, or the ``grouping_weights`` option (public numbers); each
share is the largest float whose decimal is at most its exact fraction of the decimal asked, so the shares
sum to at most what was asked (a Gaussian release's delta adds the same floating-point excess as alone).
Everything after the releases (NULLs and GROUPING values put in place, casts to the combined column types,
concatenation, ORDER BY / LIMIT) is post-processing of released values and public metadata.

The result is SQL's: the rows of every grouping, in the order of the groupings, with NULL in the columns a
grouping does not group by; ``GROUPING(a, ...)`` (and ``GROUPING_ID``) gives, as in DuckDB, a bit per
argument (the first the most significant) set where that column is rolled up, which tells a rolled-up NULL
from a released NULL key. A UNION ALL's rows follow each other under the first SELECT's names, each column of
the type DuckDB's UNION ALL gives it. ORDER BY, LIMIT and OFFSET apply to the whole result.

Everything before the charge is public metadata only: the components come from the SQL text, each is
analysed, routed and bind-checked, and the combined column types decided (``_types``: from the output
types the post-processing binds to over typed placeholders), before the one ``reserve``; a refusal of any
component refuses the whole request for free. After the charge the components run inside one ``charged``
block: any failure fails the one entry (its charge stands) with the usual generic error. The entry keeps the
synopsis of its first query that DAWA answered afresh (a released value), so a later histogram or range workload
it covers is read from it for free, as from a lone histogram's entry (one synopsis per ledger entry).

What is refused (free): a grouping column used other than as a bare output (inside an expression, HAVING
or ORDER BY by expression), more than ``MAX_GROUPINGS`` components, ``GROUP BY ALL`` with groupings, ORDER
BY terms that name no output column, UNION without ALL and BY NAME, SELECTs of different widths, and column
types whose combination a value could fail to convert to (``_widens``).
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from dataclasses import replace as _replace
from fractions import Fraction
from typing import Any

import pyarrow as pa
from sqlglot import ErrorLevel, exp

import dpsql.engine as backends
from dpsql import postprocess
from dpsql.budget import Budget, check_delta, check_epsilon, exact, float_at_least, float_at_most
from dpsql.charge import charged, keeps_answer, record_release, reserve
from dpsql.errors import ConfigError, QueryError, UnsupportedQueryError
from dpsql.options import check_options, routing_shares, warn_if_large
from dpsql.plan.checks import ROW_COUNT_MAX, foreign_clauses, is_aggregate, output_name
from dpsql.plan.parse import (
    DIALECT,
    bracket_identifiers,
    order_by_all_alone,
    parse_duckdb,
    parse_statements,
    refuse_empty_groupings,
)
from dpsql.plan.quantiles import QUANTILE_AGGS
from dpsql.release import Plan, Release
from dpsql.rewrite.render import render

#: the accuracy note of an output column whose accuracy differs between the queries of a request (the command line
#: names where its meta shows each query's: ``cli``)
DIFFERS_BY_QUERY = "differs by query: see details['components']"

#: at most this many groupings in one request (CUBE over 6 columns is 64): each costs a share of the budget
MAX_GROUPINGS = 64

_FUNCS = (exp.Grouping, exp.GroupingId)
_WORDS = re.compile(r"\b(union|rollup|cube|grouping)\b", re.IGNORECASE)
#: a quantile's name (MIN, MAX, MEDIAN, QUANTILE..., PERCENTILE...): a scalar SELECT with one may mix it with other aggregates
_QUANTILE_WORDS = re.compile(r"\b(min|max|median|quantile\w*|percentile\w*|approx_quantile)\s*\(", re.IGNORECASE)
#: the kind of a scalar SELECT whose quantiles and other aggregates are answered as two queries, side by side
MIXED = "SELECT of quantiles and other aggregates"


@dataclass(frozen=True)
class Composite:
    """One request of several queries: the branches of a UNION ALL (one, for a single SELECT with groupings),
    each split into its groupings; ORDER BY / LIMIT / OFFSET of the whole (public: the SQL text only)."""

    text: str
    kind: str
    branches: tuple[Groupings, ...]
    order: tuple[tuple[int, bool, bool | None], ...]
    limit: int | None
    offset: int | None

    @property
    def components(self) -> list[str]:
        return [c for b in self.branches for c in b.components]

    @property
    def groupings(self) -> list[tuple[str, ...] | None]:
        return [k for b in self.branches for k in b.groupings]


@dataclass(frozen=True)
class Groupings:
    """A query with several groupings, split into one GROUP BY query per grouping (public: the SQL text only)."""

    text: str
    kind: str
    components: tuple[str, ...]
    groupings: tuple[tuple[str, ...] | None, ...]  # the columns each component groups by (None: a plain SELECT)
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


def _norm(e: exp.Expression, single: bool | frozenset[str]) -> str:
    """``e``'s spelling as a grouping column. ``single``: True for one table (t.a and a are the same column), else
    the names of the columns only one of the joined tables has (o.a and a are the same column, as in DuckDB)."""
    e = e.copy()
    for c in e.find_all(exp.Column):
        if single is True or (not isinstance(single, bool) and c.name.lower() in single):
            c.set("table", None)
    for i in list(e.find_all(exp.Identifier)):  # a name, quoted or not, in any case: the same column (as in DuckDB)
        i.set("this", i.name.lower())
        i.set("quoted", True)
    return e.sql(dialect=DIALECT, normalize=True, unsupported_level=ErrorLevel.IGNORE)  # a key to match, never run


def split(sql: Any, catalog: Mapping[str, Any]) -> Composite | None:
    """The components of ``sql`` when it groups by ROLLUP, CUBE or GROUPING SETS or is a UNION ALL of SELECTs;
    None otherwise (any other query, or text that does not parse: the ordinary path says what is wrong with it).
    ``catalog``: the registered tables' public metadata (a grouping name that is a column of a table in FROM is
    that column)."""
    words = _WORDS.search(sql) if isinstance(sql, str) else None
    if not isinstance(sql, str) or not (words or _QUANTILE_WORDS.search(sql)):  # most queries: not parsed a second time
        return None
    try:
        # as one query reads it: [col] is "col", a comment after the last ';' (a Semicolon) is no statement
        stmts = [s for s in parse_duckdb(bracket_identifiers(sql)) if s is not None and not isinstance(s, exp.Semicolon)]
    except Exception:
        return None
    if len(stmts) != 1:  # a second statement is refused by the ordinary path (never read as the first alone)
        return None
    stmt = stmts[0]
    if not words:
        return _mixed(sql) if isinstance(stmt, exp.Select) else None
    order_by_all_alone(stmt)
    refuse_empty_groupings(stmt)
    if isinstance(stmt, exp.Select | exp.Union):
        _refuse_dropped_clauses(stmt)
    if isinstance(stmt, exp.Select):
        g = _split_select(stmt, sql, catalog)
        if g is None:  # the words were in a literal or a name: a SELECT of quantiles and other aggregates, maybe
            return _mixed(sql)
        return Composite(sql, f"GROUP BY {g.kind}", (g,), (), None, None)
    if not isinstance(stmt, exp.Union) or stmt.args.get("distinct") or stmt.find(exp.Intersect, exp.Except):
        if isinstance(stmt, exp.Union) and not stmt.find(exp.Intersect, exp.Except):
            raise _bad("UNION without ALL is not supported (it would remove released rows that happen to be equal)",
                       "write UNION ALL")
        return None  # INTERSECT / EXCEPT: the ordinary path refuses them
    if any(u.args.get(k) for u in stmt.find_all(exp.Union) for k in ("by_name", "side", "kind", "on")):
        raise _bad("UNION ALL BY NAME is not supported", "list the columns in the same order in each SELECT")
    selects = _branches(stmt.this) + _branches(stmt.expression)  # the whole's ORDER BY / LIMIT: below
    if stmt.args.get("with_") is not None:  # WITH v AS (...) SELECT ... UNION ALL SELECT ...: each SELECT has the
        ctes = stmt.args["with_"]              # CTEs it reads (and those they read)
        for b in selects:
            names = {t.name.lower() for t in b.find_all(exp.Table)}
            used: list[exp.CTE] = []
            while True:
                more = [c for c in ctes.expressions if c.alias.lower() in names and c not in used]
                if not more:
                    break
                used += more
                names |= {t.name.lower() for c in more for t in c.find_all(exp.Table)}
            own = b.args.get("with_")  # a parenthesised SELECT's own WITH: its CTEs read those before the first SELECT
            mine = [] if own is None else list(own.expressions)
            if used and {c.alias.lower() for c in mine} & {c.alias.lower() for c in used}:
                raise _bad("a CTE of a SELECT of the UNION ALL has the name of a CTE of the WITH before the first SELECT",
                           "rename one of them")
            if used:
                b.set("with_", exp.With(expressions=[c.copy() for c in ctes.expressions if c in used] + mine,
                                        recursive=ctes.args.get("recursive") or (own is not None and own.args.get("recursive"))))
    branches = tuple(_split_select(b, _text(b), catalog) or _plain(b) for b in selects)
    widths = sorted({len(b.names) for b in branches})
    if len(widths) > 1:
        raise _bad(f"the SELECTs of a UNION ALL have {' and '.join(map(str, widths))} columns", "give each SELECT "
                   "the same number of columns, in the same order")
    if sum(len(b.components) for b in branches) > MAX_GROUPINGS:
        raise _bad(f"UNION ALL of more than {MAX_GROUPINGS} queries", "send fewer queries in one request (each costs a "
                   "share of its budget)")
    outputs: list[list[tuple[str, str | None]]] = [[(it.alias_or_name or it.sql(dialect=DIALECT), None)
                                                    for it in b.expressions] for b in selects]
    limit, offset = (_count(stmt.args.get(k), k.upper()) for k in ("limit", "offset"))
    if offset and offset >= len(selects) and stmt.args.get("with_") is None and all(
            isinstance(b, exp.Select) and not b.args.get("group") and b.args.get("with_") is None
            and not any(isinstance(n, exp.Subquery) and isinstance(n.parent, (exp.From, exp.Join)) for n in b.walk())
            for b in selects):
        # each SELECT without GROUP BY (over tables, no CTE or subquery in FROM) releases one row: an OFFSET of at
        # least their number skips every row whatever the data, as LIMIT 0 does
        raise _bad(f"OFFSET {offset} skips every row of a UNION ALL of {len(selects)} queries without GROUP BY (one "
                   "row each), so it would be charged for nothing", f"use an OFFSET below {len(selects)}")
    return Composite(sql, "UNION ALL", branches, _order(selects, outputs, stmt.args.get("order")), limit, offset)


def _mixed(sql: str) -> Composite | None:
    """:func:`_split_mixed` of ``sql`` read as the one-query path reads it (``parse_statements``: DuckDB's other names
    of SUM and AVG are those aggregates, comments dropped), or None where that reading refuses it."""
    try:
        stmts = parse_statements(sql)
    except Exception:
        return None
    return _split_mixed(stmts[0], sql) if len(stmts) == 1 and isinstance(stmts[0], exp.Select) else None


def _split_mixed(stmt: exp.Select, sql: str) -> Composite | None:
    """A scalar SELECT whose outputs each read quantiles only (MIN, MAX, MEDIAN, ...: the exponential mechanism) or
    other aggregates only (noise added to sums), with both present: the two queries ``SELECT <quantile outputs> FROM
    ...`` and ``SELECT <other outputs> FROM ...`` (the same FROM and WHERE), one request, their released columns side
    by side in the order written. None for anything else (the ordinary path answers or refuses it): GROUP BY (the two
    mechanisms release different key sets), HAVING, ORDER BY, LIMIT, DISTINCT, a window, an output that mixes both
    kinds, reads a column outside an aggregate (an alias of another output) or has no aggregate."""
    if any(stmt.args.get(k) for k in ("group", "having", "qualify", "order", "limit", "offset", "distinct", "windows")):
        return None
    if any(isinstance(n.this, QUANTILE_AGGS) for n in stmt.find_all(exp.Filter, exp.WithinGroup)):
        # a quantile's FILTER is refused by the ordinary path (said of the query as written), and WITHIN GROUP has no
        # rendering that reads back as the same call: write MEDIAN(x) or QUANTILE_CONT(x, p) beside other aggregates
        return None
    kinds: list[bool] = []  # per output: a quantile's (True) or another aggregate's (False)
    for item in stmt.expressions:
        found: set[bool] = set()
        for node in item.walk(prune=_call):
            if isinstance(node, (exp.Window, exp.Star, exp.Subquery, exp.Select)) or (
                    isinstance(node, exp.Column) and not _inside_aggregate(node, item)):
                return None
            if _call(node):
                found.add(any(isinstance(x, QUANTILE_AGGS) for x in node.walk()))
        if len(found) != 1:
            return None
        kinds.append(found.pop())
    if len(set(kinds)) != 2:
        return None
    # its two queries are written out: what they would lose is refused, as with several groupings
    _refuse_dropped_clauses(stmt, "a SELECT of quantiles and other aggregates")
    order = list(dict.fromkeys(kinds))  # the kind of the first output first
    components, names = [], []
    wanted = _output_names(stmt, sql)
    for kind in order:
        part = stmt.copy()
        items = [(it, name) for it, name, k in zip(stmt.expressions, wanted, kinds, strict=True) if k == kind]
        part.set("expressions", [it.copy() for it, _ in items])
        text = _text(part)
        try:  # the names the query gets as written here; an output named otherwise gets the whole's name as its alias
            own = _output_names(parse_statements(text)[0], text)
        except Exception:
            own = []
        if own != [name for _, name in items]:
            part.set("expressions", [it.copy() if i < len(own) and own[i] == name else
                                     exp.alias_(it.unalias().copy(), name, quoted=True) for i, (it, name) in enumerate(items)])
            text = _text(part)
        components.append(text)
    seen = {k: 0 for k in order}
    for k in kinds:
        names.append((order.index(k), seen[k]))
        seen[k] += 1
    g = Groupings(sql, "", tuple(components), (None, None), ((), ()), tuple(names), (), None, None)
    return Composite(sql, MIXED, (g,), (), None, None)


def _output_names(stmt: exp.Select, sql: str) -> list[str]:
    """Each output's name as the one-query path names it (``dpsql.plan.analyze``): its alias, else the call as the
    query writes it (``var_samp(x)``, not sqlglot's ``VARIANCE(x)``), a repeated name numbered (``a``, ``a_1``)."""
    written_aliases = {it.alias.lower() for it in stmt.expressions if isinstance(it, exp.Alias)}
    used: set[str] = set()
    suffix: dict[str, int] = {}
    out = []
    for it in stmt.expressions:
        name = output_name(it, sql, used, suffix, written_aliases)
        out.append(name)
    return out


def _sides(g: Composite) -> list[tuple[int, int]]:
    """A :data:`MIXED` request's (query, column) of each output, in the order written."""
    return [n for n in g.branches[0].names if not isinstance(n, str)]


def _call(n: exp.Expression) -> bool:
    """An aggregate call with what belongs to it: its FILTER clause, a percentile's WITHIN GROUP (ORDER BY col)."""
    return isinstance(n, QUANTILE_AGGS) or is_aggregate(n) or (
        isinstance(n, (exp.Filter, exp.WithinGroup)) and (isinstance(n.this, QUANTILE_AGGS) or is_aggregate(n.this)))


def _inside_aggregate(node: exp.Expression, top: exp.Expression) -> bool:
    p = node.parent
    while p is not None and p is not top.parent:
        if _call(p):
            return True
        p = p.parent
    return False


#: clauses a SELECT of several groupings or of a UNION ALL would lose when its parts are written out (DuckDB's dialect
#: has no such clause; one query has them refused, ``dpsql.plan.checks``): refused, never dropped
_DROPPED = {"locks": "FOR UPDATE / FOR SHARE", "into": "SELECT ... INTO", "cluster": "CLUSTER BY",
            "distribute": "DISTRIBUTE BY", "sort": "SORT BY", "sample": "USING SAMPLE", "prewhere": "PREWHERE",
            "connect": "CONNECT BY"}


def _text(part: exp.Expression) -> str:
    """The SQL of one query of the request (a grouping, a SELECT of a UNION ALL), read again as one query is: written
    strictly, a construct DuckDB's dialect has not (``SUM(x IGNORE NULLS)``) is refused as one query refuses it, never
    dropped from the query that is answered (nor does sqlglot print its warning about it on stderr)."""
    return render(part)


def _refuse_dropped_clauses(stmt: exp.Expression, where: str = "a query of several groupings or a UNION ALL") -> None:
    """Refuse a clause of :data:`_DROPPED` on the statement or on any SELECT or UNION of it, and the clauses that the
    parts' SQL would lose or read otherwise: another dialect's (``LIMIT 1 BY k``, ``WITH TOTALS``, ``SELECT AS
    STRUCT``, ``ORDER BY ... WITH FILL``, a table hint), ``FETCH FIRST n PERCENT ROWS ONLY`` and ``... WITH TIES``
    (written out as ``LIMIT n``) in a parenthesised SELECT of a UNION ALL, ``GROUP BY DISTINCT`` (which drops
    repeated groupings)."""
    for node in [stmt, *stmt.find_all(exp.Select, exp.Union)]:
        key = next((k for k in _DROPPED if node.args.get(k)), None)
        if key is not None:
            raise _bad(f"{_DROPPED[key]} is not supported in {where} (nor in one query)",
                       "drop it (ORDER BY sorts the released rows)" if key in ("cluster", "distribute", "sort")
                       else "drop it")
    for what, _ in foreign_clauses(stmt):
        raise _bad(f"{what} is not supported in {where} (nor in one query)", "drop it")
    for node in stmt.find_all(exp.Limit, exp.Fetch, exp.Ordered, exp.Group, exp.Table):
        opts = node.args.get("limit_options") if isinstance(node, (exp.Limit, exp.Fetch)) else None
        if opts is not None and (opts.args.get("percent") or opts.args.get("with_ties")):
            raise _bad(f"LIMIT {'PERCENT' if opts.args.get('percent') else 'WITH TIES'} in {where} is not supported",
                       "write a number of rows, e.g. LIMIT 10")
        if isinstance(node, exp.Ordered) and node.args.get("with_fill"):
            raise _bad("ORDER BY ... WITH FILL (rows added between the keys, ClickHouse's) is not supported",
                       "drop WITH FILL")
        if isinstance(node, exp.Group) and node.args.get("all") is False:
            raise _bad("GROUP BY DISTINCT with several groupings is not supported (it drops the repeated groupings)",
                       "name each grouping once, without DISTINCT")
        if isinstance(node, exp.Table) and node.args.get("sample"):  # (written out, a count of rows for some methods)
            raise _bad("TABLESAMPLE / USING SAMPLE is not supported: sampling changes each person's contribution",
                       "drop the sample (dpsql bounds each person's rows itself)")
        if isinstance(node, exp.Table) and node.args.get("hints"):
            raise _bad("table hints such as WITH (NOLOCK) are not supported", "remove them (the query reads a snapshot)")


def _branches(stmt: exp.Expression) -> list[exp.Select]:
    """The SELECTs of a UNION ALL, left to right (a parenthesised one keeps its own ORDER BY and LIMIT)."""
    while isinstance(stmt, exp.Subquery | exp.Paren):
        stmt = stmt.this
    if isinstance(stmt, exp.Union):
        if stmt.args.get("distinct"):
            raise _bad("UNION without ALL is not supported (it would remove released rows that happen to be equal)",
                       "write UNION ALL")
        if stmt.args.get("order") or stmt.args.get("limit") or stmt.args.get("offset"):
            raise _bad("ORDER BY or LIMIT inside a nested UNION ALL is not supported", "sort the whole result")
        return _branches(stmt.this) + _branches(stmt.expression)
    if not isinstance(stmt, exp.Select):
        raise _bad(f"each part of a UNION ALL is a SELECT, not {type(stmt).__name__}", "write SELECT ... UNION ALL SELECT ...")
    return [stmt]


def _plain(stmt: exp.Select) -> Groupings:
    """A SELECT with one grouping: itself, one component."""
    n = len(stmt.expressions)
    text = _text(stmt)
    return Groupings(text, "", (text,), (None,), ((),),
                     tuple((0, i) for i in range(n)), (), None, None)


def _split_select(stmt: exp.Select, sql: str, catalog: Mapping[str, Any]) -> Groupings | None:
    """:func:`split` of one SELECT: None when it groups by neither ROLLUP, CUBE nor GROUPING SETS."""
    group = stmt.args.get("group")
    if group is None:
        return None
    plain = [g for g in group.expressions if not isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets))]
    with_all = [k.upper() for k in ("rollup", "cube") if group.args.get(k)]
    if len(plain) == len(group.expressions) and not with_all:
        return None
    if with_all and len(plain) != len(group.expressions):
        form = next(g for g in group.expressions if g not in plain).sql(dialect="duckdb")
        raise _bad(f"GROUP BY ... WITH {with_all[0]} follows a plain list of grouping columns, not {form} "
                   "(DuckDB refuses it too)",
                   "write one form, e.g. GROUP BY ROLLUP (a, b), GROUP BY CUBE (a, b) or GROUP BY a, b WITH ROLLUP")
    if group.args.get("grouping_sets") or group.args.get("all"):
        raise _bad("GROUP BY ALL or WITH GROUPING SETS together with groupings is not supported",
                   "name the grouping columns, e.g. GROUP BY ROLLUP (a, b)")
    kind = " / ".join(dict.fromkeys(
        with_all + [{exp.Rollup: "ROLLUP", exp.Cube: "CUBE", exp.GroupingSets: "GROUPING SETS"}[type(g)]
                    for g in group.expressions if g not in plain]))
    if stmt.args.get("qualify") is not None or stmt.find(exp.Window):
        raise _bad(f"window functions and QUALIFY with GROUP BY {kind} are not supported: each grouping is released "
                   "apart, so a window would see one grouping's rows where SQL's sees the rows of all of them",
                   "send one GROUP BY query per grouping with its window")
    elements = [exp.Rollup(expressions=list(group.expressions)) if with_all == ["ROLLUP"] else
                exp.Cube(expressions=list(group.expressions))] if with_all else group.expressions
    sets: list[list[exp.Expression]] = [[]]
    for g in elements:
        sets = [a + b for a in sets for b in _sets_of(g)]
        if len(sets) > MAX_GROUPINGS:
            raise _bad(f"GROUP BY {kind} gives more than {MAX_GROUPINGS} groupings",
                       "send fewer groupings in one request (each costs a share of its budget)")
    tables = list(stmt.find_all(exp.Table))
    schemas = [getattr(catalog.get(t.name.lower()), "schema", None) for t in tables]
    columns = {c for sch in schemas for c in sch or {}}
    owners = Counter(c.lower() for sch in schemas for c in sch or {})  # (a table not registered: its columns unknown)
    single: bool | frozenset[str] = len(tables) == 1 or frozenset(
        c for c, k in owners.items() if k == 1 and None not in schemas)
    aliases = {it.alias.lower(): it.this for it in stmt.expressions
               if isinstance(it, exp.Alias) and it.alias.lower() not in columns}  # a column wins, as in DuckDB

    def resolve(e: exp.Expression) -> exp.Expression:  # GROUP BY names an output alias: its expression
        if isinstance(e, exp.Literal) and not e.is_string:
            if not e.this.isdigit():
                raise _bad(f"GROUP BY {e.this}: a number in GROUP BY is an output's position, a whole number",
                           "group by a column, or by an output's position, e.g. GROUP BY 1")
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
        if any(isinstance(p, (exp.AggFunc, exp.Filter, exp.Where)) for p in _parents(f)):  # DuckDB refuses it too
            raise _bad(f"{f.sql(dialect=DIALECT)}: GROUPING inside an aggregate or in WHERE is not supported (it tells "
                       "the groupings apart, which exist only after the rows are aggregated)",
                       "use GROUPING in the SELECT list, HAVING or ORDER BY")
        f.set("expressions", [resolve(a).copy() if isinstance(a, exp.Column) else a for a in f.expressions])
        if len(f.expressions) > 63:  # its value is a BIGINT, a bit per argument (DuckDB refuses more, too)
            raise _bad(f"GROUPING of {len(f.expressions)} arguments: it takes at most 63 arguments (its value is a "
                       "BIGINT with a bit per argument)", "name each grouping column once")
        if not f.expressions or any(_norm(_strip(a), single) not in universe for a in f.expressions):
            raise _bad(f"{f.sql(dialect=DIALECT)}: the arguments of GROUPING are columns the query groups by",
                       "name grouping columns only, e.g. GROUPING(a, b) with GROUP BY ROLLUP (a, b)")
    outputs = [_output(it, universe, single) for it in stmt.expressions]
    having = stmt.args.get("having")
    for part, where in ((having, "HAVING"),):
        if part is not None:
            for n in part.walk():
                named = resolve(n) if isinstance(n, exp.Column) else n  # by an output's name, too
                if not _inside(n) and _norm(named, single) in universe:
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
        components.append(_text(c))
        fills.append(tuple(fill))
    released_by = [next((i for i, f in enumerate(fills) if p not in {q for q, _ in f}), None)
                   for p in range(len(outputs))]
    names = tuple(outputs[p][0] if k is None else (k, p - sum(q < p for q, _ in fills[k]))
                  for p, k in enumerate(released_by))
    order = _order([stmt], [outputs], stmt.args.get("order"))
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
    """``n`` is (inside) GROUPING() or an aggregate's argument or FILTER: a grouping column there is no output of it."""
    return any(isinstance(p, (*_FUNCS, exp.AggFunc, exp.Filter)) for p in [n, *_parents(n)])


def _grouping_bits(node: exp.Expression, keys: set[str], single: bool | frozenset[str]) -> exp.Expression:
    """``node`` with each GROUPING(x, ...) replaced by its value in the grouping by ``keys``: a bit per argument
    (the first the most significant), set where the argument is rolled up."""
    def one(f: exp.Expression) -> exp.Expression:
        if not isinstance(f, _FUNCS):
            return f
        bits = [_norm(_strip(a), single) not in keys for a in f.expressions]
        return exp.Literal.number(sum(b << (len(bits) - 1 - i) for i, b in enumerate(bits)))

    return node.transform(one)


def _output(it: exp.Expression, universe: dict[str, exp.Expression], single: bool | frozenset[str]) -> tuple[str, str | None]:
    """(output name, the grouping column it is, or None). A grouping column inside any other output is refused."""
    inner = it.this if isinstance(it, exp.Alias) else it
    name = it.alias if isinstance(it, exp.Alias) else (inner.name if isinstance(inner, exp.Column) else
                                                            inner.sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE))
    key = _norm(_strip(inner), single)
    if key in universe:
        return name, key
    for n in inner.walk():
        if not _inside(n) and _norm(n, single) in universe:
            raise _bad(f"the output {it.sql(dialect=DIALECT)} uses a grouping column inside an expression, which is "
                       "not supported with several groupings", "select the grouping column itself and compute on the result")
    return name, None


def _order(stmts: list[exp.Select], outputs: list[list[tuple[str, str | None]]],
           order: exp.Expression | None) -> tuple[tuple[int, bool, bool | None], ...]:
    """ORDER BY of the whole, as output positions: as in DuckDB, an output's name in any SELECT (of a UNION ALL: the
    first SELECT's names first, then the next's), then an expression of a SELECT (refused where two SELECTs have it
    at different positions, as DuckDB refuses it)."""
    out = []
    for o in order.expressions if order is not None else []:
        e = _strip(o.this)
        if isinstance(e, exp.Var) and e.name.upper() == "ALL":  # DuckDB's ORDER BY ALL: every output, left to right
            out += [(p, bool(o.args.get("desc")), o.args.get("nulls_first")) for p in range(len(outputs[0]))]
            continue
        pos = None
        if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
            pos = int(e.this) - 1 if 0 < int(e.this) <= len(outputs[0]) else None
        else:  # as in DuckDB: an output's name first (ORDER BY a with b AS a is that output), then an expression
            spelled = e.sql(dialect=DIALECT, normalize=True)
            bare = e.name.lower() if isinstance(e, exp.Column) and not e.table else spelled
            pos = next((i for names in outputs for i, (name, _) in enumerate(names) if name.lower() in (bare, spelled)),
                       None)
            found: dict[int, None] = {}
            for stmt in stmts if pos is None else []:
                for i, it in enumerate(stmt.expressions):
                    inner = it.this if isinstance(it, exp.Alias) else it
                    if spelled == inner.sql(dialect=DIALECT, normalize=True) or (
                            isinstance(e, exp.Column) and isinstance(inner, exp.Column) and e.name.lower() == inner.name.lower()
                            and (not e.table or not inner.table or e.table.lower() == inner.table.lower())):
                        found[i] = None
                        break
            if len(found) > 1:
                a, b = list(found)[:2]
                raise _bad(f"ORDER BY {o.this.sql(dialect=DIALECT)} is ambiguous: it is column {a + 1} of one SELECT and "
                           f"column {b + 1} of another (DuckDB refuses it too)", "order by an output's name or position")
            pos = next(iter(found), pos)
        if pos is None:
            raise _bad(f"ORDER BY {o.this.sql(dialect=DIALECT)} names no output column; with several groupings or a "
                       "UNION ALL, ORDER BY sorts the whole result by its output columns",
                       "order by an output's name or position")
        nulls = o.args.get("nulls_first")
        out.append((pos, bool(o.args.get("desc")), nulls))
    return tuple(out)


def _count(node: Any, what: str) -> int | None:
    if node is None:
        return None
    opts = node.args.get("limit_options") if isinstance(node, exp.Expression) else None
    if opts is not None and (opts.args.get("percent") or opts.args.get("with_ties")):
        raise _bad(f"{what} {'PERCENT' if opts.args.get('percent') else 'WITH TIES'} with several groupings or a "
                   "UNION ALL is not supported", f"write a number of rows, e.g. {what} 10")
    e = node.expression if isinstance(node, (exp.Limit, exp.Offset)) else node.args.get("count") if isinstance(
        node, exp.Fetch) else node  # FETCH FIRST n ROWS ONLY: LIMIT n
    if what == "LIMIT" and isinstance(e, exp.Var) and e.name.upper() == "ALL" and opts is None:
        return None  # LIMIT ALL: no limit, as for one query
    if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit() and (what != "LIMIT" or int(e.this) > 0):
        return min(int(e.this), ROW_COUNT_MAX)  # beyond the engine's row counts: keeps (skips) every row the same
    if what == "LIMIT" and isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
        raise _bad("LIMIT 0 releases no row, so it would be charged for nothing",
                   "drop the LIMIT; explain shows the groupings and the cost for free")
    raise _bad(f"{what} with several groupings must be a whole number", f"write e.g. {what} 10")


# -- routing, explain and run ------------------------------------------------------------------------------
def _shares(total: float, weights: list[Fraction]) -> list[float]:
    """Each share: the largest float whose decimal is at most its exact part of the decimal asked."""
    return [float_at_most(exact(total) * w) for w in weights]


def _weights(g: Composite, opts: dict[str, Any]) -> list[Fraction]:
    w = opts.pop("grouping_weights", None)
    n = len(g.components)
    if w is None:
        return [Fraction(1, n)] * n
    if not isinstance(w, (list, tuple)) or len(w) != n or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and x == x and x != float("inf") for x in w):
        raise ConfigError(f"grouping_weights must be a list of {n} positive numbers, one per query, got {w!r}",
                          hint="explain lists the queries in order; e.g. grouping_weights=" + str([1] * n))
    ws = [Fraction(repr(float(x))) if isinstance(x, float) else Fraction(x) for x in w]
    return [x / sum(ws) for x in ws]


def _routes(session: Any, g: Composite, epsilon: Any, delta: Any, options: Any) -> tuple[list[Any], list[Fraction]]:
    session._check_open()  # said alone, not as a refusal of the first query at its share
    eps, d, opts = check_epsilon(epsilon), check_delta(delta), check_options(options)
    warn_if_large(eps, d)  # the request's total, which it is charged (each query is routed at its share, unweighed)
    weights = _weights(g, opts)
    n, routes = len(g.components), []
    read: set[str] = set()  # the options some query reads
    unread: dict[str, ConfigError] = {}  # an option a query does not read: that query's refusal of it (the first)
    for i, (sql, e, dd) in enumerate(zip(g.components, _shares(eps, weights), _shares(d, weights), strict=True)):
        if e == 0 or (dd == 0 and d > 0):
            raise ConfigError(f"grouping_weights give query {i + 1} of {n} of the {g.kind} ({sql}) a share of "
                              f"{'epsilon' if e == 0 else 'delta'} that rounds to 0", hint="give weights that are "
                              "closer to each other (explain shows each query's share)")
        own = dict(opts)
        with _naming(g, i, n, sql), routing_shares():
            while True:
                try:
                    routes.append(session._route(sql, e, dd, own))
                    break
                except ConfigError as refusal:  # e.g. its share too small to calibrate: said of that query and share
                    x = _of_query(refusal, g, i, n, sql, e, dd, opts)
                    # each option goes to the queries that read it (tau to a ROLLUP's sparse histograms, not to its
                    # total; max_groups_per_unit to its GROUP BY queries, max_rows_per_unit to the total)
                    if not x.inapplicable or not x.inapplicable <= set(own) - {"mechanism"}:
                        raise
                    for k in x.inapplicable:
                        unread.setdefault(k, x)
                        del own[k]
        read |= set(own)
    for k in opts:
        if k not in read:  # no query reads it: refused, as for one query, by the first query's refusal
            x = unread[k]
            x.message += (f" (nor does any other query of the {g.kind}: each option goes to the queries that read it, "
                          f"and no query reads {k})")
            x.args = (x._render(),)
            raise x
    return routes, weights


def _of_query(x: ConfigError, g: Composite, i: int, n: int, sql: str, e: float, dd: float,
              opts: dict[str, Any]) -> ConfigError:
    """A refusal of one of the queries, said of that query and share (after an option's refusal, which keeps its form:
    the epsilon and delta it names are that query's share)."""
    where = f"query {i + 1} of {n} of the {g.kind} ({sql}), at its share epsilon={e:g}, delta={dd:g} of the budget asked"
    if not any(x.message.startswith((f"{k} ", f"{k}=")) for k in opts):
        x.message = f"{where}: {x.message}"
    elif not x.inapplicable:
        x.message = f"{x.message} ({where})"
    x.args = (x._render(),)
    return x


def _checked(session: Any, g: Composite, routes: list[Any], salted: bool) -> list[Any]:
    """``Session._bind_check`` of each query (under a stand-in salt, or a fresh secret salt when ``salted``)."""
    out, n, empty = [], len(routes), list[UnsupportedQueryError | None]()
    for i, (sql, r) in enumerate(zip(g.components, routes, strict=True)):
        with _naming(g, i, n, sql):
            salt = None if r.description.reuse_of is not None else session._noise.salt()
            no_row: list[UnsupportedQueryError] = []  # conditions on its keys that keep none: refused only if each has none
            out.append(session._bind_check(r, salt, alone=False, no_row=no_row) if salted
                       else session._bind_check(r, alone=False, no_row=no_row))
            empty.append(no_row[0] if no_row else None)
    _refuse_no_row_at_all(session, g, routes, empty)
    return out


def _refuse_no_row_at_all(session: Any, g: Composite, routes: list[Any], empty: list[Any]) -> None:
    """Refuse, for free, a request each of whose queries has no row whatever the data (``postprocess.no_row_refusal``,
    or ``empty``: the refusal of conditions on its keys that keep none of its public keys): it would be charged for
    nothing. One such query beside others is answered (``GROUP BY ROLLUP (k) HAVING GROUPING(k) = 1``, or ``WHERE k =
    'zz'`` with no such declared key: the query grouping by k has no row, the total has one)."""
    first = None
    for i, (sql, r, none) in enumerate(zip(g.components, routes, empty, strict=True)):
        if r.request.plan is None:
            return
        refusal = none or postprocess.route_no_row_refusal(  # (a lookup join's WHERE too)
            session._engine, r, backends.PublicReads(session._engine, session._catalog))
        if refusal is None:
            return
        if first is None:
            first = (i, sql, refusal)
    if first is not None:
        i, sql, refusal = first
        with _naming(g, i, len(routes), sql):
            raise refusal


@contextlib.contextmanager
def _naming(g: Composite, i: int, n: int, sql: str) -> Iterator[None]:
    """A refusal of one of the queries says which (its positions are in that query's text)."""
    try:
        yield
    except QueryError as e:
        e.message = f"query {i + 1} of {n} of the {g.kind} ({sql}): {e.message}"
        e.args = (e._render(),)
        raise


def _cost(routes: list[Any]) -> Budget:
    """The sum of the queries' costs (basic composition), exact; each coordinate recorded as the smallest float whose
    decimal is at least the exact sum, so the charge is never below what the queries spend (it is at most the
    budget asked for whenever each query's cost is at most its share)."""
    costs = [r.description.cost for r in routes]
    delta = sum((c.exact_delta for c in costs), Fraction(0))
    # each query's share fits, but the Gaussian samplers' floating-point parts take the sum to 1, or so close below
    # it (0.99999999999999994) that the least float recording it is 1.0
    if delta >= 1 or float_at_least(delta) >= 1:
        raise ConfigError(
            f"the {len(routes)} queries' shares of delta plus their Gaussian samplers' floating-point deltas (fp_delta) add "
            "up to a delta that reaches 1 as recorded: no privacy is left to claim; nothing was charged", hint="use a small delta such as 1e-6 (well below 1/number_of_people), or 0 for pure DP")
    return Budget(float_at_least(sum((c.exact_epsilon for c in costs), Fraction(0))), float_at_least(delta))


def _components(g: Composite, routes: list[Any], weights: list[Fraction]) -> list[dict[str, Any]]:
    return [{"sql": sql, **({} if keys is None else {"grouping": list(keys)}), "mechanism": r.description.label,
             "share": float(w), "cost": {"epsilon": r.description.cost.epsilon, "delta": r.description.cost.delta},
             "parameters": r.description.details}
            for sql, keys, r, w in zip(g.components, g.groupings, routes, weights, strict=True)]


def _label(g: Composite, routes: list[Any]) -> str:
    kind = "union_all" if g.kind == "UNION ALL" else "quantiles_apart" if g.kind == MIXED else "groupings"
    return kind + "(" + ", ".join(dict.fromkeys(r.description.label for r in routes)) + ")"


def _reason(g: Composite, weights: list[Fraction]) -> str:
    split = "equal shares" if len(set(weights)) == 1 else "the shares of grouping_weights"
    return (f"{g.kind}: {len(g.components)} queries, each answered as if sent alone, with {split} of epsilon and "
            "delta (basic composition: the cost is the sum)")


def _types(session: Any, g: Composite, routes: list[Any], asts: list[Any]) -> list[exp.DataType]:
    """The type of each output of the whole result, before the charge and from public metadata only: each query's
    outputs over typed placeholders (``postprocess.output_query``), NULL where a grouping rolls a column up and
    BIGINT for GROUPING, all under one UNION ALL that the engine binds (its rules for combining types)."""
    engine, selects, listed, i = session._engine, [], [], 0
    width = len(g.branches[0].names)
    if g.kind == MIXED:  # side by side: each output keeps its own query's type
        own = []
        for sql, r, ast in zip(g.components, routes, asts, strict=True):
            q = postprocess.output_query(r.request.plan, _key_types(engine, r, ast),
                                         r.mechanism.released_types(r.calibration))
            if q is None:
                raise _bad(f"{sql}: its output types are not known before the charge", "send it alone")
            own.append([t for _, t in engine.describe(q)])
        return [exp.DataType(this=_T.NULL) if own[c][j].strip('"').upper() == "NULL" else
                exp.DataType.build(own[c][j], dialect=engine.dialect) for c, j in _sides(g)]
    for b in g.branches:
        for sql, fill in zip(b.components, b.fills, strict=True):
            r, ast = routes[i], asts[i]
            i += 1
            q = postprocess.output_query(r.request.plan, _key_types(engine, r, ast),
                                         r.mechanism.released_types(r.calibration))
            # a bare NULL output has DuckDB's type NULL: it takes the type of the others, as a rolled-up column's
            types = ["NULL" if t.strip('"').upper() == "NULL" else t for _, t in engine.describe(q)] if q is not None else []
            if q is None or len(types) != width - len(fill):
                raise _bad(f"{sql}: its output types are not known before the charge", "send it alone")
            filled, cols, items = dict(fill), iter(types), []
            for p in range(width):
                typ = (None if filled[p] is None else "BIGINT") if p in filled else next(cols)
                typ = None if typ == "NULL" else typ
                try:
                    cast = exp.Null() if typ is None else exp.cast(exp.Null(), exp.DataType.build(typ, dialect=engine.dialect))
                except Exception:
                    raise _bad(f"{sql}: its output of type {typ} cannot be combined with the other queries' outputs",
                               "cast it to a plain type (VARCHAR, BIGINT, DOUBLE, DATE, ...)") from None
                items.append(exp.alias_(cast, f"c{p}"))
            listed.append(["NULL" if p in filled and filled[p] is None else "BIGINT" if p in filled else
                           types[p - sum(q < p for q in filled)] for p in range(width)])
            selects.append(exp.select(*items))
    union = selects[0]
    for sel in selects[1:]:
        union = exp.union(union, sel, distinct=False)
    try:
        described = engine.describe(union)
    except QueryError:
        differ = [f"column {p + 1}: " + ", ".join(dict.fromkeys(t[p] for t in listed)) for p in range(width)
                  if len({t[p] for t in listed} - {"NULL"}) > 1]
        raise _bad(f"the outputs of the {g.kind} do not combine into one column type ({'; '.join(differ)})",
                   "CAST the outputs to one type in each SELECT") from None
    combined = [exp.DataType(this=_T.NULL) if t.strip('"').upper() == "NULL" else  # NULL in every query: kept
                exp.DataType.build(t, dialect=engine.dialect) for _, t in described]
    for p, t in enumerate(combined):  # each cast to the type of the whole is one that no value can fail
        narrow = [x for x in dict.fromkeys(row[p] for row in listed)
                  if x != "NULL" and not _widens(exp.DataType.build(x, dialect=engine.dialect), t)]
        if narrow:
            raise _bad(f"the outputs of the {g.kind} do not combine into one column type (column {p + 1}: "
                       f"{', '.join(dict.fromkeys(row[p] for row in listed if row[p] != 'NULL'))}; combined as "
                       f"{t.sql(dialect=engine.dialect)}, which {', '.join(narrow)} does not always convert to)",
                       "CAST the outputs to one type in each SELECT")
    return combined


_T = exp.DataType.Type
#: decimal digits of each integer type (the unsigned ones cannot hold a negative number)
_DIGITS = {_T.TINYINT: 3, _T.SMALLINT: 5, _T.INT: 10, _T.BIGINT: 19, _T.INT128: 39, _T.UTINYINT: 3,
           _T.USMALLINT: 5, _T.UINT: 10, _T.UBIGINT: 20, _T.UINT128: 39}
_UNSIGNED = {_T.UTINYINT, _T.USMALLINT, _T.UINT, _T.UBIGINT, _T.UINT128}


def _widens(s: exp.DataType, t: exp.DataType) -> bool:
    """Every value of type ``s`` converts to type ``t``: the same type, anything to text, a number to a double,
    a BOOLEAN to any number with a digit before the point (1 or 0), an integer to a wider one of the same sign or to a decimal with room for its digits, a decimal to one with as
    many digits before and after the point. Any other pair is refused before the charge (a cast there could
    fail on a released value, or is not implemented: BIGINT to DATE)."""
    if s.sql() == t.sql() or t.this in exp.DataType.TEXT_TYPES:
        return True
    if s.this == _T.BOOLEAN:  # true / false: 1 / 0, in any number type with a digit before the point
        return t.this in (_T.DOUBLE, _T.FLOAT) or t.this in _DIGITS or (
            t.this == _T.DECIMAL and len(t.expressions) == 2 and int(t.expressions[0].sql()) > int(t.expressions[1].sql()))
    if t.this in (_T.DOUBLE, _T.FLOAT):
        return s.this in exp.DataType.NUMERIC_TYPES
    if t.this in _DIGITS and s.this in _DIGITS:
        return _DIGITS[s.this] <= _DIGITS[t.this] and (s.this in _UNSIGNED or t.this not in _UNSIGNED)
    if t.this == _T.DECIMAL and len(t.expressions) == 2:
        p, sc = (int(e.sql()) for e in t.expressions)
        if s.this in _DIGITS:
            return _DIGITS[s.this] <= p - sc
        if s.this == _T.DECIMAL and len(s.expressions) == 2:
            p1, s1 = (int(e.sql()) for e in s.expressions)
            return p1 - s1 <= p - sc and s1 <= sc
    return False


def _key_types(engine: Any, r: Any, ast: Any) -> dict[str, str]:
    """The SQL type of each key the route releases: bound in its bounded relation, or, for keys released from
    their public domain (``Mechanism.key_domain``: DAWA's bins, declared values), the engine's type of a domain
    value (``typeof`` over the first row of the domain: public metadata)."""
    types = backends.describe_bounded(engine, ast)
    missing = [k.name for k in r.request.plan.keys if k.name not in types]
    domain = r.mechanism.key_domain(r.calibration) if missing else None
    if domain is None or domain.num_rows == 0 or not set(missing) <= set(domain.column_names):
        return types
    row = engine.post_process(domain.select(missing).slice(0, 1), lambda rel: exp.select(*[
        exp.alias_(exp.Anonymous(this="typeof", expressions=[exp.column(n, quoted=True)]), n, quoted=True)
        for n in missing]).from_(rel))
    return {**types, **{n: str(row.column(n)[0].as_py()) for n in missing}}


def _most_rows(g: Composite, routes: list[Any], session: Any) -> int | None:
    """The most rows the request can release, known before the charge when every query's rows are (one without GROUP
    BY: one row; over public keys: one per key of the set the post-processing's check runs over that the conditions on
    the keys alone keep, ``postprocess.public_rows``), after the LIMIT and OFFSET of each query, of each SELECT and of
    the whole; None when some query's rows are not known (a sparse histogram's keys are those above its noisy
    threshold)."""
    routes_left = iter(routes)
    total = 0
    for b in g.branches:
        rows = 0
        for _ in b.components:
            r = next(routes_left)
            plan = r.request.plan
            if plan is None:
                return None
            if plan.keys:
                dom = r.mechanism.key_domain(r.calibration)
                if dom is None and hasattr(r.mechanism, "public_key_set"):
                    # a grouped join's key set read from public tables (public rows only), as for the query sent alone
                    # with an OFFSET: `GROUP BY ROLLUP (r.rname) OFFSET 10` over four regions was charged for no row
                    dom = r.mechanism.public_key_set(r.calibration, backends.PublicReads(session._engine, session._catalog),
                                                     _replace(plan, offset=plan.offset or 1))
                if dom is None:
                    return None
                # (the keys its conditions on the keys alone keep: `WHERE k = 'a' GROUP BY k` has one row, as when sent
                # alone; every declared key was counted, so an OFFSET past every row of a UNION ALL of such was charged)
                n = postprocess.public_rows(session._engine, plan, r.mechanism.released_types(r.calibration), dom)
            else:
                n = 1
            n = max(0, n - (plan.offset or 0))
            rows += n if plan.limit is None else min(n, plan.limit)
        rows = max(0, rows - (b.offset or 0))
        total += rows if b.limit is None else min(rows, b.limit)
    total = max(0, total - (g.offset or 0))
    return total if g.limit is None else min(total, g.limit)


def _refuse_offset_past_every_row(g: Composite, routes: list[Any], session: Any) -> None:
    """Before the charge: an OFFSET (of the whole, or of a SELECT with groupings) that leaves no row whatever the data
    is refused, as LIMIT 0 is (``SELECT k, COUNT(*) ... GROUP BY ROLLUP (k) OFFSET 3`` over two declared keys)."""
    if not (g.offset or any(b.offset for b in g.branches)):
        return
    if _most_rows(g, routes, session) == 0:
        most = _most_rows(_replace(g, offset=None, limit=None, branches=tuple(
            _replace(b, offset=None, limit=None) for b in g.branches)), routes, session)
        raise _bad(f"the OFFSET skips every row of the {g.kind}, which has at most {most} (one per query without "
                   "GROUP BY, one per public key the conditions on the keys keep of each other query), so it would be "
                   "charged for nothing",
                   "use a smaller OFFSET (explain lists the queries)")


def explain(session: Any, g: Composite, epsilon: Any, delta: Any, options: Any) -> Plan:
    with session._catalog_lock.reading():
        routes, weights = _routes(session, g, epsilon, delta, options)
        asts = _checked(session, g, routes, salted=False)
        _refuse_offset_past_every_row(g, routes, session)
        _types(session, g, routes, asts)
        n = len(asts)
        bounded = "\n".join(f"-- query {i + 1} of {n}: {sql}\n{backends.render_bounded(session._engine, a)}"
                            for i, (sql, a) in enumerate(zip(g.components, asts, strict=True)))
    cost, left = _cost(routes), session._ledger.remaining()
    over = [] if cost.fits_in(left) else [f"this costs more than the remaining budget ({left}): query would refuse it"]
    notes = list(dict.fromkeys(n for r in routes for n in r.description.notes))
    return Plan(sql=g.text, mechanism=_label(g, routes), reason=_reason(g, weights), cost=cost,
                parameters={"components": _components(g, routes, weights)}, bounded_sql=bounded, notes=[*notes, *over])


@keeps_answer  # Ctrl-C held back while the release was recorded: raised with the answer (``e.release``)
def run(session: Any, g: Composite, epsilon: Any, delta: Any, options: Any) -> Release:
    """``Session.query`` of ``g``, under the caller's catalog lock (from the analysis to the last read of rows)."""
    routes, weights = _routes(session, g, epsilon, delta, options)
    types = _types(session, g, routes, _checked(session, g, routes, salted=False))  # under a stand-in salt
    _refuse_offset_past_every_row(g, routes, session)
    asts = _checked(session, g, routes, salted=True)
    cost, components = _cost(routes), _components(g, routes, weights)
    tables = sorted({t for r in routes for t in r.request.tables})
    entry = reserve(session._ledger, cost, mechanism=_label(g, routes), query=g.text, tables=tables,
                    params={"components": components})
    parts, updates, synopsis = [], [], dict[str, Any]()
    with charged(session._ledger, session._engine, entry, "the query"):
        for r, ast in zip(routes, asts, strict=True):
            reused = r.description.reuse_of is not None
            released = r.release(None if reused else backends.fetch_bounded(session._engine, ast), session._noise)
            clip = bool(r.request.options.get("clip_negative", False))
            parts.append(postprocess.apply(session._engine, r.request.plan, released, nonnegative=clip,
                                           estimates=r.description.parameters.get("estimates")))
            updates.append(released.commit.get("params_update") or {})
            if not synopsis and released.commit.get("synopsis_key") is not None:  # the entry keeps one synopsis: the first
                synopsis = {k: released.commit[k] for k in ("synopsis_key", "synopsis")}
        table = _combine(session, g, [p[0] for p in parts], types)
    accuracy: dict[str, dict[str, Any]] = {}
    for j, name in enumerate(table.column_names):
        # a query's column at position j, whatever its own name (UNION ALL: the first SELECT's names)
        seen = [p[1][n] for p, n in zip(parts, _names_at(g, [p[0] for p in parts], j), strict=True)
                if n is not None and n in p[1]]
        if seen:  # none for a key column
            accuracy[name] = seen[0] if all(a == seen[0] for a in seen) else {"note": DIFFERS_BY_QUERY}
    for c, p in zip(components, parts, strict=True):
        c["accuracy"] = p[1]
    warns = list(dict.fromkeys(w for p in parts for w in p[2]))
    notes = list(dict.fromkeys(n for r in routes for n in r.description.notes))
    out = Release(table, cost, _label(g, routes), accuracy, entry, False, {"components": components}, notes, warns)
    # built first: Ctrl-C once the release is recorded is raised with it (keeps_answer)
    # a DAWA query's synopsis (a released value) is kept as a lone histogram's is, so later requests read it for free
    record_release(session._ledger, entry, ({"params_update": {"component_updates": updates}} if any(updates) else {})
                   | synopsis, out)
    return out


def _names_at(g: Composite, tables: list[pa.Table], j: int) -> list[str | None]:
    """Each query's own name of the output column at position ``j`` (None where a rolled-up column or GROUPING's
    value is put in place: ``_combine``)."""
    out: list[str | None] = []
    if g.kind == MIXED:
        c, own = _sides(g)[j]
        return [t.column_names[own] if k == c else None for k, t in enumerate(tables)]
    for b in g.branches:
        for t, fill in zip(tables[len(out):len(out) + len(b.components)], b.fills, strict=True):
            filled = {pos for pos, _ in fill}
            own = j - sum(1 for pos in filled if pos < j)
            out.append(None if j in filled or own >= t.num_columns else t.column_names[own])
    return out


def _combine(session: Any, g: Composite, tables: list[pa.Table], types: list[exp.DataType]) -> pa.Table:
    """The rows of every query one after another (post-processing of released values): in each branch, a
    rolled-up column's NULLs and GROUPING's values put in place, every column cast to the type of the whole
    (``_types``), the branch's ORDER BY / LIMIT; then the branches under the first one's names, and the
    ORDER BY / LIMIT / OFFSET of the whole."""
    cols = [f"c{i}" for i in range(len(types))]
    if g.kind == MIXED:  # one released row each (scalar queries): their columns side by side, in the order written
        at = _sides(g)
        return pa.Table.from_arrays([tables[c].column(j) for c, j in at],
                                    names=[tables[c].column_names[j] for c, j in at])

    def cast(rel: str) -> exp.Expression:
        return exp.select(*[exp.column(c) if t.this == _T.NULL else exp.alias_(exp.cast(exp.column(c), t), c)
                            for c, t in zip(cols, types, strict=True)]).from_(rel)

    out, i = [], 0
    for b in g.branches:
        part = tables[i:i + len(b.components)]
        i += len(b.components)
        names = [n if isinstance(n, str) else part[n[0]].column_names[n[1]] for n in b.names]
        typed = []
        for t, fill in zip(part, b.fills, strict=True):
            for pos, value in fill:  # in order of position: each lands where the query has it
                col = pa.nulls(t.num_rows) if value is None else pa.array([value] * t.num_rows, pa.int64())
                t = t.add_column(pos, cols[pos], col)
            typed.append(session._engine.post_process(t.rename_columns(cols), cast))
        table = _sorted(session, pa.concat_tables(typed, promote_options="permissive"), b.order, b.limit, b.offset)
        out.append(table.rename_columns(names))
    names = out[0].column_names
    table = pa.concat_tables([t.rename_columns(cols) for t in out], promote_options="permissive")
    return _sorted(session, table, g.order, g.limit, g.offset).rename_columns(names)


def _sorted(session: Any, table: pa.Table, order: tuple[tuple[int, bool, bool | None], ...], limit: int | None,
            offset: int | None) -> pa.Table:
    """ORDER BY output positions, LIMIT and OFFSET over released rows (columns c0, c1, ...), by the engine."""
    if not order and limit is None and offset is None:
        return table
    cols = table.column_names

    def build(rel: str) -> exp.Expression:
        q = exp.select(*[exp.column(c) for c in cols]).from_(rel)
        if order:
            q = q.order_by(*[exp.Ordered(this=exp.column(cols[p]), desc=desc, nulls_first=bool(nf))
                             for p, desc, nf in order])
        if limit is not None:
            q = q.limit(limit)
        if offset is not None:
            q = q.offset(offset)
        return q

    return session._engine.post_process(table, build)
