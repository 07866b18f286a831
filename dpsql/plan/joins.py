"""Join queries -> JoinPlan. Pure: reads only public metadata (the catalog and the SQL).

Accepted: ``SELECT <aggregates> FROM a [AS x] JOIN b [AS y] ON x.c = y.d [AND ...] [JOIN ...] [WHERE ...]``
over registered tables, with aliases and self-joins, the aggregates any of COUNT(*), COUNT(col), SUM(expr)
and AVG(expr), and outputs over them; also a single
table that reaches people through several references, or through a chain of references
(``unit_problem`` refuses those on the single-table path).

What the plan states (all public):

* **inputs** (alias -> table), **equi-join conditions** (column equalities; every input's
  columns are renamed ``<alias>__<column>`` so the WHERE clause is typed by
  ``dpsql.plan.typer`` over one flat schema, total as on a single table);
* the **aggregates**: COUNT(*), COUNT(col), or SUM(expr) with bounds from the catalog (a plain
  column with declared bounds) or from an explicit clamp ``LEAST(GREATEST(expr, lo), hi)``
  with literal bounds; AVG(expr) is SUM(expr) and COUNT(expr) (``base_aggregates``). Several
  distinct base aggregates are listed in ``JoinPlan.aggregates`` and each answered on its own
  (``dpsql.mechanisms.join_multi``); the outputs read ``__a<j>`` (AVG: NULL where the count is <= 0);
* the **user slots**: every way a join tuple reaches a person -- an input's own privacy unit,
  a foreign key to a person table's privacy unit, or a chain of foreign keys ending at one,
  followed transitively through every table, person tables included (``orders -> customer ->
  salesrep``: the customer's representative is a user of the order too). Slots that the inner joins'
  equalities prove equal (e.g. ``orders.o_custkey = customer.c_custkey``; a chain
  ``lineitem.l_orderkey -> orders`` whose first hop is the join's own ``l_orderkey =
  o_orderkey``) are one *person class* (a LEFT JOIN's ON proves nothing equal: its rows are kept matched or not);
* **single owner** when there is one person class (every tuple belongs to one person);
* **Delta**, the most join tuples one person can be in, derived from public bounds only:
  per column, the most rows of its table that share one value -- 1 for a key (a reference's
  target), the table's per-unit row cap for its privacy unit, the owner's ``degree_bounds``
  for a foreign key. From an input holding the person, the join is walked input by input, each
  new input multiplying the count by the bound of the column it joins on. A class's bound is
  the least over its slots; Delta is the largest sum over one person table's classes.
  **Enforced** (single owner, no lookups): the bounded query caps every input's rows per
  join column at these bounds, so Delta holds whatever the data. A cap is stable only if each
  capped partition's rows reach one set of people: the partition also holds every other column
  through which the input reaches people (``lineitem`` referencing its order and its customer is
  capped per (order, customer)), each fixed by the inputs joined before; where that is
  impossible the plan is not enforced (``_uniform_caps``). Otherwise Delta is **attested** by
  the owner's declarations: the privacy claim of sampling (q < 1) is conditional on it.

What is assumed and what is enforced. A reference declares its target a key and the data is
expected to honour it (unique keys, no dangling references), but nothing here relies on it for
privacy: a hop the join performs through a key (``reduce``) is exact only for a key value held
by one row, so the join SQL keeps only such rows (``ir.JoinPlan.unique_keys``, a stable filter);
a looked-up chain attaches every person reached through every row holding the value, and a
value reaching no row gets a synthetic user (``dpsql.rewrite.joins``). Degree bounds and keys
feed Delta, which is enforced by caps or attested as above; reference types are checked at
registration and again here (``dpsql.catalog.reference_problems``), as is the rule that public
tables reference only public tables. A public table's declared keys and degree bounds, which a join whose Delta is
attested reads uncapped, are checked on its (public) rows before the charge (``dpsql._public_keys``).

``JOIN b USING (c)`` is ``JOIN b ON a.c = b.c`` (``a``: the input before it holding ``c``), and an unqualified
``c`` then names that one column.

``LEFT JOIN`` (``ir.JoinPlan.left``) only to a public table, its ON equalities of its columns with those of the tables
before it, and no inner join after it naming its columns; the route answers it only when the table is a lookup entered
on its declared key (``dpsql.mechanisms.registry._route_left_lookup``).

Refused, for free, with the fix: RIGHT/FULL outer, other LEFT, cross, non-equi, NATURAL/ASOF joins, an ambiguous USING, subqueries,
tables neither public nor linked to a person, unbounded contributions, GROUP BY over keys without a public key
set (``dpsql.plan.join_groups``), HAVING or ORDER BY naming an aggregate the SELECT list does not release.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlglot import exp

from dpsql.catalog import TableSpec, is_nested_type, join_key_type_problem, reference_problems
from dpsql.errors import PolicyError, UnsupportedQueryError, Violation
from dpsql.plan import ir
from dpsql.plan.checks import (
    LIMIT_FORM,
    LIMIT_ZERO,
    OFFSET_SCALAR,
    SUPPORTED_AGGS,
    check_expression_functions,
    check_statement_shape,
    clause_of,
    never_null_literal,
    row_count,
    violation,
    written_name,
)
from dpsql.plan.intervals import NoInterval, clamp_argument, clamp_bounds, declared_days, interval
from dpsql.plan.names import (
    alias_order_hint,
    ambiguity_problem,
    did_you_mean,
    field_problem,
    qualifier,
    qualifier_problem,
    spell_aliases,
)
from dpsql.plan.parse import as_written, carry_written, quoted, stands_for
from dpsql.plan.typer import TypeRefusal, parse_type, type_checked, type_predicate
from dpsql.plan.views import VALUES_IN_FROM

SEP = "__"

#: the name of the joined relation of a lookup join in its bounded query (``dpsql.mechanisms.lookup``)
LOOKUP_VIEW = "__dpsql_lookup"
#: at most this many distinct base aggregates in one query over a join: each is its own run of the join
#: mechanism (its own bounded query, with 1/m of the budget), so the work grows with them (about 0.1 s of CPU each
#: for ``explain``; benchmarks/analysis_scaling.py)
MAX_JOIN_AGGREGATES = 64
#: aliases and columns that a join may name: rendered as plain identifiers in the join SQL
_PLAIN = re.compile(r"^[a-z_][a-z0-9_]*$")


def flat(alias: str, column: str) -> str:
    """The flat name of an input's column in the join relation (read back up to the first ``SEP``: an
    alias holds no ``SEP`` and does not end in ``_``, so the split is unambiguous)."""
    return f"{alias}{SEP}{column}"


def parts(column: str) -> list[str]:
    """The columns of a (possibly composite, 'a,b') key."""
    return column.split(",")


def table_keys(table: TableSpec, catalog: Mapping[str, TableSpec]) -> set[str]:
    """Columns of ``table`` declared keys: targets of a reference from any registered table."""
    keys = set()
    for t in catalog.values():
        for target in t.references.values():
            tn, _, tc = target.partition(".")
            if tn == table.name:
                keys.add(tc)
    return keys


def max_rows_per_value(table: TableSpec, column: str, catalog: Mapping[str, TableSpec],
                       lowered: Mapping[str, int] | None = None) -> float:
    """The most rows of ``table`` that share one value of ``column`` (public; inf if unknown)."""
    best = math.inf
    if column in table_keys(table, catalog):
        best = 1.0
    if table.privacy_unit == column:
        best = min(best, float(table.rows_per_unit_cap))
    if column in table.degree_bounds:
        best = min(best, float(table.degree_bounds[column]))
    if lowered and f"{table.name}.{column}" in lowered:
        best = min(best, float(lowered[f"{table.name}.{column}"]))
    return best


def _not_plain(col: exp.Column, table: str, where: str) -> str:
    return (f"column '{col.name}' of table '{table}' ({where}): a join reads only columns named with ASCII letters, "
            "digits and '_' (they are written plainly in the join's SQL); single-table queries read it. To join on "
            "it or filter a join by it, expose it under such a name (e.g. a DuckDB view or a renamed Parquet column)")


_ALL_PUBLIC = "every table of the join is public: there is nothing private to protect; query the public data directly"


def _bad(sql: str, node: exp.Expression, msg: str, vs: list[Violation]) -> None:
    vs.append(violation(node, sql, msg))


def _raise(vs: list[Violation], *, policy: bool = False) -> None:
    if not vs:
        return
    seen: set[tuple[str, int, int]] = set()
    out = []
    for v in vs:
        if (v.message, v.line, v.col) not in seen:
            seen.add((v.message, v.line, v.col))
            out.append(v)
    head = str(out[0]) if len(out) == 1 else f"the query has {len(out)} problems"
    cls = PolicyError if policy else UnsupportedQueryError
    raise cls(head, violations=out)


def _average(total: exp.Expression, count: exp.Expression) -> exp.Expression:
    """AVG from its released SUM and COUNT (post-processing): NULL where the released count is <= 0."""
    return exp.Case(ifs=[exp.If(this=exp.GT(this=count.copy(), expression=exp.Literal.number(0)),
                                true=exp.Div(this=total, expression=count))])


class _UnionFind:
    def __init__(self) -> None:
        self.p: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.p.setdefault(x, x)
        while self.p[x] != x:
            self.p[x] = self.p[self.p[x]]
            x = self.p[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[max(ra, rb)] = min(ra, rb)


def _slots_from(table: TableSpec, catalog: Mapping[str, TableSpec], seen: frozenset[str]) -> list[tuple[ir.Hop, ...] | None]:
    """Chains of hops from a row of ``table`` to a person: () for the table's own unit; None marks
    an unresolved reference (refused by the caller).

    References are followed transitively, through person tables too: a row of ``orders`` reaches
    its customer (``o_custkey -> customer.c_custkey``) and, through that customer's row, the
    customer's sales representative (``customer.c_rep -> salesrep.id``): the issue's rule that a
    tuple belongs to every person reached from any of its rows through any declared reference."""
    out: list[tuple[ir.Hop, ...] | None] = []
    if table.public:
        return out
    if table.privacy_unit:
        out.append(())
    for fk, target in table.references.items():
        tn, _, tc = target.partition(".")
        t2 = catalog.get(tn)
        if t2 is None:
            out.append(None)
            continue
        if t2.public:
            continue
        hop = ir.Hop(table.name, fk, tn, tc)
        if t2.privacy_unit == tc:
            out.append((hop,))  # direct: the fk's value is the person
        if tn in seen or tn == table.name:
            continue  # a cycle of references, refused before this (catalog.reference_cycle); stops the walk
        for rest in _slots_from(t2, catalog, seen | {table.name}):
            if rest == () and t2.privacy_unit == tc:
                continue  # the person the direct hop already names
            out.append(None if rest is None else (hop, *rest))
    # de-duplicate
    uniq: list[tuple[ir.Hop, ...] | None] = []
    for s in out:
        if s not in uniq:
            uniq.append(s)
    return uniq


@dataclass
class _Input:
    alias: str
    table: TableSpec
    node: exp.Expression


class _JoinBuilder:
    def __init__(self, sql: str, stmt: exp.Select, catalog: Mapping[str, TableSpec]) -> None:
        self.sql = sql
        self.stmt = stmt
        self.catalog = catalog
        self.vs: list[Violation] = []
        self.inputs: list[_Input] = []
        self.uf = _UnionFind()
        self.unique: list[tuple[str, str]] = []
        #: aliases of inputs already refused (unregistered, table functions, ...)
        self.failed: set[str] = set()
        self.keys: list[ir.JoinKey] = []
        #: column -> the aliases a JOIN ... USING (column) made equal, the first named by an unqualified column
        self.using: dict[str, list[str]] = {}
        #: aliases of the inputs a LEFT JOIN entered (``ir.JoinPlan.left``)
        self.left: list[str] = []
        #: aggregates only the one-table path of a lookup join answers (``ir.JoinPlan.one_table_only``)
        self.deferred: list[Violation] = []
        #: a LEFT JOIN's ON conditions beside its key equalities (``ir.JoinPlan.left_on``)
        self.left_on: list[tuple[str, exp.Expression]] = []
        #: the select list (earlier aliases spelled out) and the place of the output whose columns are resolved
        #: outside its aggregates, if any (an unknown column there may be a later output's alias)
        self.items: list[exp.Expression] = []
        self.item_at: int | None = None

    def bad(self, node: exp.Expression, msg: str) -> None:
        if self._in_subquery(node):
            return  # a part of a subquery in WHERE (its tables, aggregates): the subquery is the one problem, reported
        _bad(self.sql, node, msg, self.vs)

    def _in_subquery(self, node: exp.Expression) -> bool:
        """Whether ``node`` lies inside a subquery (``EXISTS (...)``, ``x IN (SELECT ...)``, a scalar subquery) of
        the statement: the allow-list check refuses the subquery itself, with its fix."""
        up = node.parent
        while up is not None and up is not self.stmt:
            if isinstance(up, (exp.Subquery, exp.Exists)) or (isinstance(up, exp.Select) and isinstance(up.parent, exp.In)):
                return True
            up = up.parent
        return False

    # -- inputs and conditions ------------------------------------------------------------
    def add_input(self, tbl: exp.Expression, at: exp.Expression | None = None) -> bool:
        at = at or tbl
        ok = self._add_input(tbl, at)
        if not ok:  # its columns cannot be resolved: not reported again as unknown (one true problem)
            self.failed.add(str(tbl.alias_or_name).lower() if isinstance(tbl, exp.Table) else str(tbl.alias).lower())
        return ok

    def _add_input(self, tbl: exp.Expression, at: exp.Expression) -> bool:
        if not isinstance(tbl, exp.Table) or not isinstance(tbl.this, exp.Identifier):
            # (a subquery is never here: dpsql.plan.views merges it into the query, or refuses it)
            self.bad(at, f"{VALUES_IN_FROM}; join registered tables" if isinstance(tbl, exp.Values)
                     else "table functions and file paths are not allowed in joins; join registered tables")
            return False
        qual_problem = qualifier_problem(tbl)
        if qual_problem is not None:
            self.bad(at, qual_problem)
            return False
        for key, val in tbl.args.items():
            if val and key not in ("this", "alias", "db", "catalog"):
                self.bad(tbl, f"the table reference clause '{key}' is not supported in joins")
        alias_node = tbl.args.get("alias")
        if isinstance(alias_node, exp.TableAlias) and alias_node.columns:
            self.bad(alias_node, "column aliases on a table are not supported; alias columns in SELECT")
        name = tbl.this.name.lower()
        table = self.catalog.get(name)
        if table is None:
            known = ", ".join(sorted(self.catalog)) or "none"
            self.bad(at, f"table '{tbl.this.name}' is not registered{did_you_mean(tbl.this.name, self.catalog)} "
                         f"(registered tables: {known}); register it first")
            return False
        ambiguous = ambiguity_problem([(i.table.name, qualifier(i.node)) for i in self.inputs] + [(table.name, qualifier(tbl))])
        if ambiguous is not None:
            self.bad(at, ambiguous)
            return False
        alias = (tbl.alias or name).lower()
        if any(i.alias == alias for i in self.inputs):
            self.bad(at, f"'{alias}' names two inputs of the join; give each use of a table its own alias (FROM t AS a JOIN t AS b ...)")
            return False
        if SEP in alias or alias.endswith("_") or not _PLAIN.match(alias):
            # the join relation names a column '<alias>__<column>' and reads the alias back up to the first
            # '__': an alias ending in '_' ('o_' -> 'o___cid') would be read back as another alias
            fix = f"give it an alias: FROM {tbl.this.name} AS t" if not tbl.alias else "choose another alias, e.g. t1"
            self.bad(at, f"alias '{alias}' must be a plain identifier (letters, digits, '_') without '{SEP}' "
                         f"and not ending in '_' ({fix})")
            return False
        self.inputs.append(_Input(alias, table, tbl))
        return True

    def public_twin(self, node: exp.Expression, message: str) -> str:
        """``message`` (a GROUP BY key without a public key set) naming, as its fix, a column of a public table that an
        inner join's ON equates with the key (the same values in every tuple), where there is one."""
        generic = "or join a public table and group by its column)"
        if not isinstance(node, exp.Column) or not message.endswith(generic):
            return message
        alias = (node.table or "").lower()
        mine = next((flat(i.alias, node.name.lower()) for i in self.inputs
                     if i.alias == alias or (not alias and flat(i.alias, node.name.lower()) in self.flat_schema)), None)
        if mine is None:
            return message
        twins = [f"{i.alias}.{c}" for i in self.inputs if i.table.public and i.alias not in self.left
                 for c in sorted(i.table.schema) if flat(i.alias, c) in self.flat_schema
                 and self.uf.find(flat(i.alias, c)) == self.uf.find(mine) and flat(i.alias, c) != mine]
        if not twins:
            return message
        return message[: -len(generic)] + f"or group by {twins[0]}, the public column it is joined to: equal in every joined row)"

    def resolve(self, col: exp.Column, where: str) -> str | None:
        """The flat name of a column reference, or None (reported)."""
        name = col.name.lower()
        if col.table:
            q = col.table.lower()
            inp = next((i for i in self.inputs if i.alias == q), None)
            if inp is None and q in self.failed:
                return None  # its input was refused already
            if inp is None:
                field = next((f for i in self.inputs if (f := field_problem(col, where, i.table.schema, {i.alias}))), None)
                self.bad(col, field or f"{where} refers to unknown table or alias '{col.table}'")
                return None
            if flat(inp.alias, name) not in self.flat_schema:
                self.bad(col, _not_plain(col, inp.table.name, where) if name in inp.table.schema
                         else f"unknown column '{col.name}' in '{q}' (table '{inp.table.name}') ({where})"
                              f"{did_you_mean(col.name, inp.table.schema)}")
                return None
            return flat(inp.alias, name)
        owners = [i for i in self.inputs if flat(i.alias, name) in self.flat_schema]
        if not owners and not _PLAIN.match(name):
            held = [i for i in self.inputs if name in i.table.schema]
            if held:
                self.bad(col, _not_plain(col, held[0].table.name, where))
                return None
        if not owners and self.failed:
            return None  # may be a column of a refused input: that input's problem is reported
        group = self.using.get(name)
        if len(owners) > 1 and group is not None and {o.alias for o in owners} <= set(group):
            return flat(group[0], name)  # a USING column: one value in every input of its group
        if len(owners) != 1:
            hint = "" if owners else (
                (alias_order_hint(col.name, self.items, self.item_at)
                 if where == "SELECT" and self.item_at is not None else "")
                or did_you_mean(col.name, {c for i in self.inputs for c in i.table.schema}))
            self.bad(col, f"column '{col.name}' is ambiguous in {where}; qualify it with its table's alias" if owners
                     else f"column '{col.name}' is unknown in {where} (no joined table has it){hint}")
            return None
        return flat(owners[0].alias, name)

    def known(self, col: exp.Column) -> bool:
        """Whether a column reference names a column of a joined table (one that does not was reported by
        :meth:`resolve`)."""
        name, q = col.name.lower(), col.table.lower() if col.table else None
        return any(flat(i.alias, name) in self.flat_schema for i in self.inputs if q is None or i.alias == q)

    def flatten(self, node: exp.Expression, where: str) -> exp.Expression:
        out = node.copy()
        if isinstance(out, exp.Column):  # the root itself: replace() on a root is a no-op
            return stands_for(exp.column(self.resolve(out, where) or "__unknown", quoted=False), out)
        for c in list(out.find_all(exp.Column)):
            f = self.resolve(c, where)
            c.replace(stands_for(exp.column(f or "__unknown", quoted=False), c))  # messages quote c as written
        return out

    def quiet_flatten(self, node: exp.Expression, where: str) -> exp.Expression:
        """:meth:`flatten` without reporting (a probe: whether ``node`` is written as a key is)."""
        before = len(self.vs)
        try:
            return self.flatten(node, where)
        finally:
            del self.vs[before:]

    def using_condition(self, join: exp.Join, position: int | None) -> exp.Expression | None:
        """``JOIN b USING (c, ...)`` as ``ON a.c = b.c AND ...``: ``a`` is the one input before the join holding
        ``c`` (or, when several inputs were joined by an earlier ``USING (c)``, the first of them, which they all
        equal in an inner join); an unqualified ``c`` then names that column (``resolve``). None if refused."""
        if position is None or not 0 < position < len(self.inputs):  # pragma: no cover - build() gives it
            self.bad(join, "JOIN ... USING could not be read here; write JOIN ... ON a.x = b.y")
            return None
        right = self.inputs[position]
        eqs: list[exp.Expression] = []
        for ident in join.args["using"]:
            name = ident.name.lower() if isinstance(ident, (exp.Identifier, exp.Column)) else ""
            if not name:
                self.bad(join, "JOIN ... USING takes column names; write JOIN ... ON a.x = b.y")
                return None
            left = [i for i in self.inputs[:position] if name in i.table.schema]
            group = self.using.get(name, [])
            if name not in right.table.schema or not left:
                where = f"'{right.alias}' (table '{right.table.name}')" if name not in right.table.schema else \
                    "any table joined before it"
                self.bad(join, f"USING ({ident.name}): column '{ident.name}' is not in {where}; write JOIN ... ON a.x = b.y")
                return None
            if len(left) > 1 and not {i.alias for i in left} <= set(group):
                self.bad(join, f"USING ({ident.name}) is ambiguous: '{ident.name}' is a column of "
                               f"{', '.join(repr(i.alias) for i in left)}; write JOIN ... ON with the column you mean")
                return None
            first = group[0] if group else left[0].alias
            self.using[name] = (group or [first]) + [right.alias]
            eqs.append(exp.EQ(this=exp.column(name, table=first), expression=exp.column(name, table=right.alias)))
        return exp.and_(*eqs, copy=False)

    def add_conditions(self, join: exp.Join, position: int | None = None) -> list[tuple[str, str]]:
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        left = side == "LEFT" and kind in ("", "OUTER") and not join.args.get("method")
        if side in ("RIGHT", "FULL") or (kind == "OUTER" and not left):
            self.bad(join, f"{side or 'OUTER'} joins are not supported: they keep rows of the joined table that match no "
                           "row before it; write the private table first and LEFT JOIN the public lookup tables on "
                           "their declared keys (FROM events e LEFT JOIN countries c ON e.cc = c.code), or use an "
                           "inner JOIN ... ON")
            return []
        if side == "LEFT" and not left:
            self.bad(join, f"LEFT {kind or join.args.get('method')} joins are not supported; use LEFT JOIN ... ON a.x = b.y "
                           "to a public lookup table on its declared key, or an inner JOIN ... ON")
            return []
        if kind in ("CROSS", "NATURAL", "ASOF", "POSITIONAL", "SEMI", "ANTI", "LATERAL") or join.args.get("method"):
            self.bad(join, f"{kind or join.args.get('method')} joins are not supported; use an inner JOIN ... ON a.x = b.y")
            return []
        if join.args.get("pivots"):  # after the ON (of the join's rows so far): read without it, the join was answered
            self.bad(join, "PIVOT / UNPIVOT is not supported: it changes each person's contribution")
            return []
        on = join.args.get("on")
        if join.args.get("using"):
            on = self.using_condition(join, position)
            if on is None:
                return []
        if on is None:
            comma = not any(v for k, v in join.args.items() if k != "this")  # FROM a, b: no equality joined it
            self.bad(join, "cross joins (a join without ON, or FROM a, b) are not supported: they pair every row with every row; write JOIN ... ON a.x = b.y"
                     + (" (or, in WHERE, equate a qualified column of it with one of another listed table: a.x = b.y "
                        "joined by AND)" if comma else ""))
            return []
        conds = []
        # the ON's conjuncts through parentheses too (`LEFT JOIN c ON (e.cc = c.code AND c.pop > 3)` is the same ON as
        # without them): read whole, the group was no equality, and the join was refused as having none
        on_conjuncts = where_conjuncts(on)
        equated = any(isinstance(x, exp.EQ) and isinstance(x.this, exp.Column) and isinstance(x.expression, exp.Column)
                      and x.this.table != x.expression.table for x in on_conjuncts)
        for c in on_conjuncts:
            if left and not self.key_equality(c, position):  # decides matching only (SQL's ON): never drops a row
                self.on_condition(c, position)
                continue
            if not (isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)):
                viewed = [x for x in ((c.this, c.expression) if isinstance(c, exp.EQ) else ())
                          if not isinstance(x, exp.Column) and isinstance(as_written(x), exp.Column)]
                if viewed:  # written as a column, merged as a view's expression: moving it into WHERE would not help
                    body = viewed[0].unnest().copy()  # the view's expression, its columns named as in the view
                    for col in body.find_all(exp.Column):
                        col.set("table", None)
                    self.bad(c, f"'{quoted(as_written(viewed[0]))}' is the view's expression {body.sql(dialect='duckdb')}, "
                                "not a column of a table: a join compares columns of the tables themselves; select the "
                                "column unchanged in the view and join on it")
                    continue
                joins = self.stmt.args.get("joins") or []
                why = ("a JOIN ... USING" if any(j.args.get("using") for j in joins) else
                       "a LEFT JOIN" if any(j.args.get("side") for j in joins) else None)
                if why is not None and (len({x.table for x in c.find_all(exp.Column)}) <= 1 or equated):
                    # a filter on one input, or any condition beside a column equality of two inputs (`o.amt > p.age`),
                    # refused only because the query's ONs are not read as WHERE's conditions: the message said its
                    # other conditions "filter beside it", then refused, naming neither the cause nor the fix (the same
                    # condition in WHERE filters the inner join alike)
                    self.bad(c, f"an inner JOIN's ON holds only equalities between columns (a.x = b.y, joined by AND) in a "
                                f"query with {why}, which keeps each ON apart from WHERE; move this condition into WHERE "
                                "(over an inner join it filters alike)")
                    continue
                self.bad(c, "only equalities between columns (a.x = b.y, joined by AND) join tables: an inner JOIN's ON needs one, "
                            "and its other conditions filter beside it (non-equi and outer joins are not supported)")
                continue
            a, b = self.resolve(c.this, "ON"), self.resolve(c.expression, "ON")
            if a is None or b is None:
                continue
            if a.split(SEP)[0] == b.split(SEP)[0]:
                self.bad(c, "an ON equality must compare columns of two different inputs; move it into WHERE")
                continue
            right = self.joined(join)
            if left and right is not None and right.alias not in (a.split(SEP)[0], b.split(SEP)[0]):
                self.bad(c, f"each equality in a LEFT JOIN's ON compares a column of the table it joins "
                            f"('{right.alias}') with one of a table before it; move it into WHERE")
                continue
            ta, tb = self.flat_schema[a], self.flat_schema[b]
            if _type_family(ta) != _type_family(tb):
                self.bad(c, f"join columns have different types ({ta} and {tb}); join columns of the same type")
                continue
            problem = join_key_type_problem(ta) or join_key_type_problem(tb)
            if problem is not None:
                self.bad(c, f"the join key is {problem}; join on an integer, text, DATE, TIMESTAMP, DECIMAL, BOOLEAN, "
                         "UUID or BLOB column instead")
                continue
            conds.append((a, b))
        right = self.joined(join)
        if left and right is not None:
            if not conds and not self.vs:  # (else: not connected, read as a cross join)
                self.bad(on, f"a LEFT JOIN's ON needs an equality of a column of '{right.alias}' with a column of a table "
                             f"joined before it: LEFT JOIN it ON a column equality (a.x = {right.alias}.y, on the declared "
                             "key), joined to its other conditions by AND; an expression such as upper(a.x) is no column")
            self.left.append(right.alias)
        return conds

    def key_equality(self, c: exp.Expression, position: int | None) -> bool:
        """Whether ``c``, a conjunct of the ON of the LEFT JOIN adding input ``position``, equates a column of that
        input with a column of an input before it (a join equality; anything else is a condition, ``on_condition``)."""
        if not (isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)):
            return False
        if position is None or not 0 < position < len(self.inputs):  # pragma: no cover - build() gives it
            return True
        before = len(self.vs)
        sides = {str(f).split(SEP)[0] for f in (self.resolve(c.this, "ON"), self.resolve(c.expression, "ON"))}
        del self.vs[before:]  # (reported where it is read)
        mine, earlier = self.inputs[position].alias, {i.alias for i in self.inputs[:position]}
        return mine in sides and bool(sides & earlier)

    def on_condition(self, c: exp.Expression, position: int | None) -> None:
        """A LEFT JOIN's ON condition beside its key equality (``ir.JoinPlan.left_on``): over the columns of the input
        it joins and of those before it, a typed boolean, as a WHERE condition; it decides which private rows match a
        lookup row, never drops one (SQL's ON)."""
        before = len(self.vs)
        self.vs.extend(check_expression_functions(c, self.sql, "ON"))
        for a in c.find_all(exp.AggFunc):
            self.bad(a, "aggregates are not allowed in ON")
        f = self.flatten(c, "ON")
        if len(self.vs) > before or self.failed or position is None:
            return
        right = self.inputs[position].alias
        later = sorted({x.name.split(SEP)[0] for x in f.find_all(exp.Column)} - {i.alias for i in self.inputs[:position + 1]})
        if later:
            self.bad(c, f"a LEFT JOIN's ON names columns of the tables before it and of the one it joins ('{right}'), "
                        f"not of {', '.join(repr(a) for a in later)}, joined after it; move the condition into WHERE")
            return
        try:
            type_predicate(f, self.flat_schema, "ON", own=False)
        except TypeRefusal as e:
            for n, m in e.problems:
                self.bad(c if n is None else n, f"ON: {m}")
            return
        self.left_on.append((right, exp.Paren(this=f)))  # (its OR kept apart from the conditions AND-ed to it)

    def joined(self, join: exp.Join) -> _Input | None:
        """The input ``join`` adds (None if refused)."""
        return next((i for i in self.inputs if i.node is join.this), None)

    def check_left(self, join: exp.Join, conds: list[tuple[str, str]]) -> None:
        """A LEFT JOIN is answered only to a public table (a lookup, ``ir.JoinPlan.left``; the route checks that it
        enters on a declared key), and an inner join after it may not name its columns (the bounded query joins the
        LEFT-joined lookups last, which keeps SQL's answer only then)."""
        inp = self.joined(join)
        if inp is None:
            return
        if inp.alias in self.left and not inp.table.public:
            self.bad(join, f"LEFT joins are not supported to a table that is not public ('{inp.table.name}'): a LEFT "
                           "JOIN keeps every row of the tables before it, and is answered only from the private table "
                           "to public lookup tables on their declared keys; write the private table first (FROM events "
                           "e LEFT JOIN countries c ON e.cc = c.code), or use an inner JOIN ... ON")
        elif inp.alias not in self.left and self.left:
            named = sorted({x.split(SEP)[0] for pair in conds for x in pair} & set(self.left))
            if named:
                self.bad(join, f"the inner JOIN of '{inp.alias}' names columns of {', '.join(repr(n) for n in named)}, "
                               "which a LEFT JOIN entered; join it before that LEFT JOIN, or LEFT JOIN it too")

    # -- aggregate ----------------------------------------------------------------------------
    def aggregate(self, node: exp.Expression) -> tuple[str, exp.Expression | None, tuple[float, float]] | None:
        """(kind, flat value expression or None, bounds) of an aggregate call (of AVG: its SUM)."""
        if isinstance(node, exp.Count):
            arg = node.this
            if node.expressions:  # COUNT(a, b): DuckDB has no such COUNT; never answer COUNT(a) for it
                self.bad(node, "COUNT takes one argument (* or a column); count each one separately")
                return None
            if isinstance(arg, exp.Star) or arg is None or never_null_literal(arg):
                return ir.COUNT_STAR, None, (1.0, 1.0)  # COUNT(1), COUNT('x'): every tuple, as COUNT(*)
            if isinstance(arg, exp.Column):
                f = self.resolve(arg, "COUNT")
                return (ir.COUNT_COL, exp.column(f, quoted=False), (1.0, 1.0)) if f else None
            if isinstance(arg, exp.Distinct):  # the column is fine: DISTINCT is what a join cannot bound
                self.flatten(arg, "COUNT")  # (reports unknown columns)
                self.deferred.append(violation(node, self.sql, (
                    "COUNT(DISTINCT ...) is not supported over joins other than lookup joins (one private table "
                    "joined to public tables on their declared keys: one person's tuples are bounded there, not the "
                    "distinct values they hold), except COUNT(DISTINCT person) alone over a join whose every tuple "
                    "belongs to one person (the person's column, or a column the ON equates with it: the number of "
                    "people); count tuples with COUNT(*) or COUNT(col), or ask COUNT(DISTINCT col) of one table")))
                return None
            self.flatten(arg, "COUNT")  # (reports unknown columns); answered over a lookup join's rows only
            self.deferred.append(violation(node, self.sql, (
                "COUNT(expression) is not supported over joins other than lookup joins (one private table joined to "
                "public tables on their declared keys): COUNT takes * or a column; to count the tuples where a "
                "condition holds, move the condition into WHERE (a query of its own if the other aggregates must not "
                "have it)")))
            return None
        if isinstance(node, (exp.Sum, exp.Avg)):
            fn = "AVG" if isinstance(node, exp.Avg) else "SUM"
            arg = node.this
            if isinstance(arg, exp.Distinct):  # as on one table (a clamp is no fix for it)
                self.flatten(arg, fn)  # (reports unknown columns)
                self.bad(node, f"{fn}(DISTINCT ...) is not supported: distinct values are not bounded per person; "
                               "drop DISTINCT")
                return None
            lo_hi = clamp_bounds(arg)
            if lo_hi is not None:
                inner, bounds = lo_hi
                if bounds[0] > bounds[1]:
                    self.bad(node, "the clamp's lower bound is above its upper bound")
                    return None
                if self._too_large(node, fn, bounds):
                    return None
                # as SQL computes the clamp: a NULL argument gives the inner call's literal
                clamped = clamp_argument(arg)
                assert clamped is not None
                return ir.SUM, self.flatten(clamped, fn), bounds
            # a column, or a BOOLEAN column's numeric cast (SUM(flag::INTEGER)), as on one table
            column = arg.this if isinstance(arg, exp.Cast) and isinstance(arg.this, exp.Column) else arg
            if isinstance(column, exp.Column):
                f = self.resolve(column, fn)
                if f is None:
                    return None
                alias, col = f.split(SEP, 1)
                t = next(i.table for i in self.inputs if i.alias == alias)
                if column is not arg and not (parse_type(t.schema.get(col, "")).kind == "bool"
                                              and parse_type(arg.args["to"].sql(dialect="duckdb")).numeric):
                    self.bad(node, f"{fn} over an expression needs literal bounds: write {fn}(LEAST(GREATEST(expr, lo), hi))")
                    return None
                b = t.value_bounds(col)  # declared, or a BOOLEAN's [0, 1] from its type
                if b is None:
                    self.bad(node, f"{fn}({quoted(arg)}) needs value bounds: table '{t.name}' declares none for '{col}', "
                                   f"and the query gives no clamp (hint: write {fn}(LEAST(GREATEST({quoted(arg)}, lo), hi)) "
                                   f"with literal bounds, or register the column with columns={{'{col}': {{'bounds': (lo, hi)}}}})")
                    return None
                if self._too_large(node, fn, b):
                    return None
                value = exp.column(f, quoted=False) if column is arg else self.flatten(arg, fn)
                return ir.SUM, value, b
            return self.derived(node, fn, arg)
        name = (written_name(node, self.sql) or node.sql(dialect="duckdb").split("(", 1)[0] or type(node).__name__).upper()
        if isinstance(node, SUPPORTED_AGGS):  # answered by the one-table mechanisms, over a lookup join's rows only
            self.flatten(node.parent if isinstance(node.parent, exp.WithinGroup) else node, name)  # (unknown columns)
            self.deferred.append(violation(node, self.sql, (
                f"aggregate {name} is not supported over joins other than lookup joins (one private table joined to "
                "public tables on their declared keys); use COUNT, SUM or AVG")))
            return None
        self.bad(node, f"aggregate {name} is not supported over joins; use COUNT, SUM or AVG")
        return None

    def derived(self, node: exp.Expression, fn: str, arg: exp.Expression) -> tuple[str, exp.Expression, tuple[float, float]] | None:
        """SUM / AVG of an expression of bounded columns (``CASE WHEN c.seg = 'A' THEN 1.0 ELSE 0.0 END``, ``l.price *
        2``): its bounds by interval arithmetic (``dpsql.plan.intervals``), as on one table; the value is clamped to
        them in SQL as a declared column's is. An AVG's count is COUNT(*) (``base_aggregates``), so its expression
        must never be NULL (AVG skips NULL values, which the join mechanisms do not count apart)."""
        fix = f"write {fn}(LEAST(GREATEST(expr, lo), hi))"
        before = len(self.vs)
        value = self.flatten(arg, fn)
        if len(self.vs) != before:
            return None

        def bounds(name: str) -> tuple[float, float] | None:
            alias, _, col = name.partition(SEP)
            t = next((i.table for i in self.inputs if i.alias == alias), None)
            kind = parse_type(t.schema.get(col, "")) if t is not None else None
            return t.value_bounds(col) if t is not None and kind is not None and (kind.numeric or kind.kind == "bool") else None

        def days(name: str, cast: bool) -> tuple[float, float] | None:
            alias, _, col = name.partition(SEP)
            t = next((i.table for i in self.inputs if i.alias == alias), None)
            return declared_days(t, col, cast) if t is not None else None

        try:
            lo_hi = interval(value, bounds, days)
        except NoInterval as e:
            why = (f"column '{as_written(e.node).sql(dialect='duckdb')}' has no declared bounds"
                   if isinstance(e.node, exp.Column) else e.message)
            self.bad(node, f"{fn} over an expression needs bounds: {why}; {fix} with literal bounds, or declare the "
                           "columns' bounds")
            return None
        if fn == "AVG" and not _never_null(value):
            self.bad(node, "AVG over an expression that may be NULL is not supported over joins (AVG skips NULL values, "
                           f"and the join mechanisms count every tuple); {fix}, which is never NULL"
                           + (", or give the CASE an ELSE" if isinstance(arg, (exp.Case, exp.If)) else ""))
            return None
        try:
            typed = type_checked(value, dict(self.flat_schema))
        except TypeRefusal as e:
            for n, m in e.problems:
                self.bad(node if n is None else n, f"{fn}: {m}")
            return None
        if not (typed.type.numeric or typed.type.kind == "bool"):
            self.bad(node, f"{fn} needs a numeric value, got {typed.type}")
            return None
        if self._too_large(node, fn, lo_hi):
            return None
        return ir.SUM, value, lo_hi

    def _too_large(self, node: exp.Expression, fn: str, bounds: tuple[float, float]) -> bool:
        """Bounds beyond ``MAX_BOUND`` in magnitude, refused as on one table: the join mechanisms scale their
        normalised result by the bound, which overflowed near the DOUBLE range (NaN or inf released)."""
        from dpsql.plan.analyze import MAX_BOUND, exact_num

        lo, hi = bounds
        if math.isfinite(lo) and math.isfinite(hi) and max(abs(lo), abs(hi)) <= MAX_BOUND:
            return False
        self.bad(node, f"the bounds [{exact_num(lo)}, {exact_num(hi)}] of {fn}'s argument are too large (at most 1e15 in magnitude) "
                       f"(hint: aggregate a rescaled value, e.g. {fn}(x / 1e6), and rescale the result, or declare "
                       "narrower bounds)")
        return True

    def base_aggregates(self, node: exp.Expression) -> list[ir.JoinAggregate] | None:
        """The base aggregates an aggregate call is answered from: itself (COUNT(*), COUNT(col),
        SUM(expr)), or for AVG(x) SUM(x) and COUNT(x) of the same values -- COUNT(col) for a column or a
        BOOLEAN column's numeric cast (NULLs are neither summed nor counted), COUNT(*) for a clamp, which is
        never NULL in SQL."""
        agg = self.aggregate(node)
        if agg is None:
            return None
        if not isinstance(node, exp.Avg):
            return [ir.JoinAggregate(*agg, sql=node.sql(dialect="duckdb"))]
        arg = node.this
        total = ir.JoinAggregate(*agg, sql=exp.Sum(this=arg.copy()).sql(dialect="duckdb"))
        # a column, or a BOOLEAN column's numeric cast (NULL where the column is; also where a cast of TRUE fails,
        # to DECIMAL(1,1), a query SQL does not answer, whose sum is then 0 whatever the count): COUNT(col)
        column = arg.this if isinstance(arg, exp.Cast) and isinstance(arg.this, exp.Column) else arg
        if isinstance(column, exp.Column):
            assert agg[1] is not None
            value = agg[1] if column is arg else agg[1].this  # (the flattened cast's column)
            assert isinstance(value, exp.Column), value
            count = ir.JoinAggregate(ir.COUNT_COL, value.copy(), (1.0, 1.0),
                                     exp.Count(this=column.copy()).sql(dialect="duckdb"))
        else:
            count = ir.JoinAggregate(ir.COUNT_STAR, None, (1.0, 1.0), "COUNT(*)")
        return [total, count]

    # -- main ---------------------------------------------------------------------------------
    def build(self) -> ir.QueryPlan:  # noqa: C901 - one pass over the statement
        stmt, sql = self.stmt, self.sql
        shape = stmt.copy()
        shape.set("joins", None)
        self.vs.extend(check_statement_shape(shape, sql, windows=True))
        from_ = stmt.args.get("from_") or stmt.args.get("from")
        if from_ is None:
            self.bad(stmt, "the query has no FROM clause")
            _raise(self.vs)
        self.add_input(from_.this)
        joins = [j for j in stmt.args.get("joins") or [] if self.add_input(j.this, j)]
        if self.inputs and not self.failed and all(i.table.public for i in self.inputs):
            # the one problem: bounds, keys or aggregates are not what such a query needs (it needs no DP at all)
            _bad(sql, stmt, _ALL_PUBLIC, self.vs)
            _raise(self.vs, policy=True)
        # columns that are not plain identifiers cannot be named in a join (they read as unknown)
        self.flat_schema = {flat(i.alias, c): t for i in self.inputs for c, t in i.table.schema.items() if _PLAIN.match(c)}
        stmt = _spelled(stmt, {c.lower() for i in self.inputs for c in i.table.schema})
        self.items = list(stmt.expressions)
        conditions: list[tuple[str, str]] = []
        for k, j in enumerate(joins):
            conds = self.add_conditions(j, k + 1)
            self.check_left(j, conds)
            conditions += conds
        # columns that hold one value in every tuple: an inner join's ON equalities, not a LEFT JOIN's (its rows are kept
        # matched or not: LEFT JOIN lk ON o.cid = lk.v AND o.cid2 = lk.v leaves cid and cid2 two people)
        for a, b in conditions:
            if not {a.split(SEP)[0], b.split(SEP)[0]} & set(self.left):
                self.uf.union(a, b)
        # the join graph must be connected (no hidden cross join)
        comp = _UnionFind()
        for i in self.inputs:
            comp.find(i.alias)
        for a, b in conditions:
            comp.union(a.split(SEP)[0], b.split(SEP)[0])
        if len({comp.find(i.alias) for i in self.inputs}) > 1 and not self.vs:
            self.bad(stmt, "the join is not connected by ON equalities (a cross join); join every table ON a column equality")

        # WHERE
        where = stmt.args.get("where")
        where_flat = None
        if where is not None:
            before = len(self.vs)
            # each condition named by the clause it was written in: WHERE, or an inner join's ON (read as WHERE's)
            parts = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
            for part in parts:
                self.vs.extend(check_expression_functions(part, sql, clause_of(part), windows=True))
            for a in where.this.find_all(exp.AggFunc):
                if not (isinstance(a.parent, exp.Window) and a.arg_key == "this"):  # a window: refused above
                    self.bad(a, f"aggregates are not allowed in {clause_of(a)}")
            flats = [(part, self.flatten(part, clause_of(part))) for part in parts]
            if len(self.vs) == before and not self.failed:
                for part, flat_part in flats:  # each AND-ed condition is a boolean of its own
                    try:
                        type_predicate(flat_part, self.flat_schema, clause_of(part), own=False)
                    except TypeRefusal as e:
                        for n, m in e.problems:
                            self.bad(part if n is None else n, f"{clause_of(part)}: {m}")
            where_flat = exp.and_(*(flat_part for _, flat_part in flats), copy=False)
        if stmt.args.get("having") is not None:  # over released values: the allow-list of post-processing
            self.vs.extend(check_expression_functions(stmt.args["having"].this, sql, "HAVING", windows=True))
        from dpsql.plan.join_groups import call_key, group_keys, key_outputs

        pv: list[Violation] = []
        self.keys = group_keys(stmt, [(i.alias, i.table) for i in self.inputs], self.resolve, self.bad,
                               lambda n, m: _bad(self.sql, n, self.public_twin(n, m), pv),
                               lambda n, m: violation(n, self.sql, self.public_twin(n, m)), dict(self.flat_schema),
                               where_flat)
        if pv and not self.vs:
            _raise(pv, policy=True)  # a key without a public key set: the owner's declaration is missing
        self.vs.extend(pv)

        # SELECT: aggregates (each answered from base aggregates), outputs over them
        clauses = [*stmt.expressions, *[stmt.args[k] for k in ("having", "order") if stmt.args.get(k) is not None]]
        filters = [f for c in clauses for f in c.find_all(exp.Filter)]
        for f in filters:  # answered by the one-table mechanisms, over a lookup join's rows only
            self.flatten(f.expression, "FILTER")  # (reports unknown columns)
            self.deferred.append(violation(f, self.sql, (
                "aggregate FILTER clauses are not supported over joins other than lookup joins (one private table "
                "joined to public tables on their declared keys); move the condition into WHERE (a separate query if "
                "the other aggregates must not have it)")))
        # a window over the released rows (dpsql.plan.windows) is no aggregate; the aggregates it reads are released
        # as the outputs' are (SUM(SUM(x)) OVER (), RANK() OVER (ORDER BY COUNT(*))), also one only a window names
        windowed = [w.this for c in [*stmt.expressions, *([stmt.args["qualify"]] if stmt.args.get("qualify") else [])]
                    for w in c.find_all(exp.Window)]
        agg_nodes = [a for c in [*stmt.expressions, *([stmt.args["qualify"]] if stmt.args.get("qualify") else [])]
                     for a in c.find_all(exp.AggFunc) if not any(a is w for w in windowed)]
        if stmt.args.get("order") is not None:  # over released values: the allow-list of post-processing, as on one table
            for o in stmt.args["order"].expressions:
                self.vs.extend(check_expression_functions(o, sql, "ORDER BY", windows=True))
        if stmt.args.get("qualify") is not None:
            self.vs.extend(check_expression_functions(stmt.args["qualify"].this, sql, "QUALIFY", windows=True))
        for pos, it in enumerate(stmt.expressions):
            self.vs.extend(check_expression_functions(it, sql, "SELECT", windows=True))
            if isinstance(it, exp.Star) or (isinstance(it, exp.Column) and isinstance(it.this, exp.Star)):
                self.bad(it, "SELECT * releases raw rows and is not allowed; select COUNT(*) or SUM(...)")
            elif not any(True for _ in it.find_all(exp.AggFunc)):
                if stmt.args.get("group") is None and any(True for _ in it.find_all(exp.Column)):
                    self.bad(it, "over joins every output must be an aggregate (COUNT, SUM or AVG)")
                else:
                    self.item_at = pos
                    self.flatten(it, "SELECT")  # reports unknown columns
                    self.item_at = None
        bases: list[ir.JoinAggregate] = []
        at: list[exp.Expression] = []  #: per base, the call it came from (for messages)
        swap: dict[str, exp.Expression] = {}  #: an aggregate call's SQL -> its value over the released __a<j>
        if not agg_nodes:
            self.bad(stmt, "the query must aggregate (COUNT, SUM or AVG)")
        seen: set[str] = set()
        index: dict[tuple[object, ...], int] = {}  #: a base's (kind, value, bounds) -> its place in ``bases``
        for node in agg_nodes:
            key = call_key(node)
            found = None if key in seen else self.base_aggregates(node)  # a repeated call: answered (or refused) once
            seen.add(key)
            if found is None:
                continue
            refs = []
            for ba in found:
                # looked up by key: each base rendered once (rendering every earlier one was quadratic)
                ident = (ba.kind, ba.value.sql(dialect="duckdb") if ba.value is not None else "", ba.bounds)
                idx = index.get(ident)
                if idx is None:
                    idx = index[ident] = len(bases)
                    bases.append(ba)
                    at.append(node)
                refs.append(exp.column(f"__a{idx}"))
            swap[key] = refs[0] if len(refs) == 1 else _average(*refs)
        if not self.vs:
            for ba, node in zip(bases, at, strict=True):
                if ba.value is None:
                    continue
                fn = "AVG" if isinstance(node, exp.Avg) else ("SUM" if ba.kind == ir.SUM else "COUNT")
                try:  # allow-list, depth and rendered size: the limits of every typed expression
                    typed = type_checked(ba.value, dict(self.flat_schema))
                    if ba.kind == ir.SUM and not (typed.type.numeric or typed.type.kind == "bool"):
                        self.bad(node, f"{fn} needs a numeric value, got {typed.type}")
                except TypeRefusal as e:
                    for n, m in e.problems:
                        self.bad(node if n is ba.value else n, f"{fn}: {m}")
        agg = (bases[0].kind, bases[0].value, bases[0].bounds) if bases else None
        value = agg[1] if agg is not None else None
        _raise(self.vs)
        if self.deferred:
            return self.one_table_only(stmt, where_flat, conditions)
        if len(bases) > MAX_JOIN_AGGREGATES:  # each is its own run of the join mechanism: refused before any
            raise UnsupportedQueryError(
                f"the query over a join has {len(bases)} distinct base aggregates; at most {MAX_JOIN_AGGREGATES} are "
                "answered in one query over a join (each is its own run of the join mechanism, with its share of "
                "the budget)", hint="split the aggregates over several queries (each is charged on its own)")
        assert agg is not None
        outputs: list[ir.OutputColumn] = []
        used: set[str] = set()
        written_aliases = {it.alias.lower() for it in stmt.expressions if isinstance(it, exp.Alias)}  # never a renamed one's
        for pos, it in enumerate(stmt.expressions):
            inner = it.unalias()
            name = it.alias if isinstance(it, exp.Alias) else (inner.name if isinstance(inner, exp.Column)
                                                               else inner.sql(dialect="duckdb"))
            written = "" if isinstance(it, exp.Alias) or isinstance(inner, exp.Column) else written_name(
                inner, sql, rendered=name)
            if written and written.lower() != name.split("(", 1)[0].lower():  # mean(x) is named as written, not AVG(x)
                name = written + name[len(name.split("(", 1)[0]):]
            base, n = name, 1
            while name.lower() in used or (name != base and name.lower() in written_aliases):
                name, n = f"{base}_{n}", n + 1
            used.add(name.lower())
            self.item_at = pos  # (key_outputs flattens what is outside the aggregates only)
            post = _over_windows(inner, lambda x: key_outputs(x, self.keys, lambda y: self.flatten(y, "SELECT"), swap,
                                                              lambda y: self.quiet_flatten(y, "SELECT")))
            self.item_at = None
            for c in post.find_all(exp.Column):
                if not self.known(c):
                    continue  # reported as unknown (resolving it above), with its fix
                if not c.name.startswith(("__a", "__k")):
                    self.bad(it, f"'{quoted(c)}' in SELECT is neither aggregated nor a GROUP BY key; add it to GROUP BY or "
                                 "aggregate it")
            outputs.append(ir.OutputColumn(name, post, post.name if isinstance(post, exp.Column) else None))

        join_plan = self.people(agg, value, where_flat, conditions)
        if len(bases) > 1:
            join_plan = dataclasses.replace(join_plan, aggregates=tuple(bases))
        first = self.inputs[0].table
        aggregates = [ir.Aggregate(b.kind, None, f"__a{j}", b.sql, b.bounds) for j, b in enumerate(bases)]
        order = [o.copy() for o in stmt.args["order"].expressions] if stmt.args.get("order") is not None else []
        having_node = stmt.args["having"].this if stmt.args.get("having") is not None else None
        for clause, node in [*(("ORDER BY", o) for o in order), *([("HAVING", having_node)] if having_node else [])]:
            for a in node.find_all(exp.AggFunc):
                if isinstance(a.parent, exp.Window) and a.arg_key == "this":
                    continue  # a window's function (RANK(), SUM(...) OVER): over the released rows
                if call_key(a) not in swap:
                    self.bad(a, f"{clause} {quoted(a)}: over joins an aggregate is released only when the "
                                f"SELECT list asks for it (hint: select it too, or name an output's alias in {clause})")
        _raise(self.vs)
        names = {o.name.lower() for o in outputs}
        # an output's alias names its released value (in HAVING, and inside an ORDER BY expression); a
        # column of a joined table of that name wins
        columns = {c.lower() for i in self.inputs for c in i.table.schema}
        by_alias = {it.alias.lower(): o.expr for it, o in zip(stmt.expressions, outputs, strict=True)
                    if isinstance(it, exp.Alias) and it.alias.lower() not in columns}
        for o in order:  # ORDER BY a key or an aggregate: over the released values (output names stay as they are)
            if not (isinstance(o.this, exp.Column) and not o.this.table and o.this.name.lower() in names):
                o.set("this", self.released_expr(o.this, "ORDER BY", swap, by_alias))
        qualify = None
        if stmt.args.get("qualify") is not None:
            qualify = self.released_expr(stmt.args["qualify"].this, "QUALIFY", swap, by_alias)
        having = self.key_only_where(where_flat)
        if having_node is not None:
            post_having = self.released_expr(having_node, "HAVING", swap, by_alias)
            having = post_having if having is None else exp.and_(exp.Paren(this=having), exp.Paren(this=post_having))
        lim, off = self.int_clause("limit"), self.int_clause("offset")
        if off and not self.keys:
            self.bad(self.stmt.args["offset"], OFFSET_SCALAR.format(n=off))
        _raise(self.vs)
        keys = [ir.GroupKey(k.written if k.written is not None else k.expr, k.name, k.sql, k.domain) for k in self.keys]
        return ir.QueryPlan(sql=sql, table=first, where=None, keys=keys, aggregates=aggregates, outputs=outputs,
                            having=having, order=order, limit=lim, offset=off, join=join_plan, qualify=qualify)

    def one_table_only(self, stmt: exp.Select, where_flat: exp.Expression | None,
                       conditions: list[tuple[str, str]]) -> ir.QueryPlan:
        """The plan of a query with aggregates only the one-table path answers (``self.deferred``): the join and its
        people as usual, no aggregate or output of its own (the join mechanisms never answer it: ``dpsql.mechanisms.
        registry`` refuses it with ``one_table_only`` unless it is a lookup join), and ``statement``, the query over
        the joined relation's flat columns, which ``dpsql.mechanisms.lookup.one_table_plan`` analyses as one table."""
        flat_stmt = stmt.copy()
        flat_stmt.set("joins", None)
        flat_stmt.set("from_" if "from_" in flat_stmt.args or "from" not in flat_stmt.args else "from",
                      exp.From(this=exp.to_table(LOOKUP_VIEW)))
        for c in list(flat_stmt.find_all(exp.Column)):
            before = len(self.vs)
            f = self.resolve(c, "SELECT") if not isinstance(c.this, exp.Star) else None
            del self.vs[before:]  # an output's alias (HAVING, ORDER BY) is no column: the one-table analysis reads it
            if f is not None:
                c.replace(stands_for(exp.column(f, quoted=False), c))
        jp = self.people((ir.COUNT_STAR, None, (1.0, 1.0)), None, where_flat, conditions)
        jp = dataclasses.replace(jp, one_table_only=tuple(self.deferred), statement=flat_stmt)
        keys = [ir.GroupKey(k.written if k.written is not None else k.expr, k.name, k.sql, k.domain) for k in self.keys]
        return ir.QueryPlan(sql=self.sql, table=self.inputs[0].table, where=None, keys=keys, aggregates=[], outputs=[],
                            join=jp)

    def released_expr(self, node: exp.Expression, clause: str, swap: dict[str, exp.Expression],
                      by_alias: dict[str, exp.Expression]) -> exp.Expression:
        """``node`` (HAVING, an ORDER BY item) over the released columns: aggregates and keys as in the
        SELECT list (:func:`key_outputs`), an output's alias as that output's value; anything else is
        neither released nor public, and refused."""
        from dpsql.plan.join_groups import key_outputs  # (join_groups imports this module)

        marks: dict[str, exp.Expression] = {}

        def mark(x: exp.Expression) -> exp.Expression:
            # an alias stands in as a call no key matches, until the keys and aggregates are swapped
            if isinstance(x, exp.Column) and not x.table and x.name.lower() in by_alias:
                name = f"__dpsql_alias_{len(marks)}"
                marks[name] = by_alias[x.name.lower()]
                return exp.Anonymous(this=name, expressions=[])
            return x

        post = _over_windows(node.copy().transform(mark), lambda x: key_outputs(
            x, self.keys, lambda y: self.flatten(y, clause), swap, lambda y: self.quiet_flatten(y, clause)))
        post = post.transform(lambda x: marks[str(x.this)].copy()
                              if isinstance(x, exp.Anonymous) and str(x.this) in marks else x)
        for c in post.find_all(exp.Column):
            if not c.name.startswith(("__a", "__k")):
                self.bad(node, f"'{quoted(c)}' in {clause} is neither aggregated nor a GROUP BY key; add it to GROUP BY or "
                               "aggregate it (and select that aggregate)")
        return post

    def key_only_where(self, where_flat: exp.Expression | None) -> exp.Expression | None:
        """The WHERE's AND-ed conditions that read the GROUP BY keys only (a declared or public
        column, ``year(col)``), over the released key columns. Every key of the public key set is
        released, so without them ``WHERE c.seg <> 'A' GROUP BY c.seg`` would list 'A' with a noisy
        0: they filter the released keys as post-processing (a condition on a key holds for all of
        that key's tuples or for none). Conditions reading anything else are left to the rows."""
        if where_flat is None or not self.keys:
            return None
        def spelled(x: exp.Expression) -> str:
            y = x.copy()
            for i in y.find_all(exp.Identifier):
                i.set("quoted", False)
            return y.sql(dialect="duckdb")

        from dpsql.plan.join_groups import _year_arg  # (join_groups imports this module)

        def key_of(x: exp.Expression) -> str | None:
            if not isinstance(x, (exp.Column, exp.Func)):
                return None
            year = _year_arg(x)  # extract(year FROM d), date_part('year', d): the key year(d) (join_groups._key)
            return by_sql.get(spelled(x if year is None else exp.func("year", year.copy())))

        by_sql = {spelled(k.expr): k.name for k in self.keys}
        # a DATE column grouped by its days (join_groups._key): the key's value is the column's own
        by_sql.update({spelled(k.written): k.name for k in self.keys
                       if k.kind == "derived" and isinstance(k.written, exp.Column)})
        kept: list[exp.Expression] = []
        # the conjuncts through parentheses too (`(o.st <> 'open' AND p.age > 3)` is `o.st <> 'open' AND p.age > 3`):
        # read whole, the group was no condition on the keys alone, so a key it excludes was released as a noisy 0,
        # and a WHERE excluding every key was charged where the same WHERE without the parentheses is refused for free
        for c in where_conjuncts(where_flat):
            try:
                typed = type_predicate(c, self.flat_schema, "WHERE")
            except TypeRefusal:
                continue  # reported by the WHERE's own type check
            typed = typed.transform(lambda x: exp.column(key) if (key := key_of(x)) is not None else x)
            cols = list(typed.find_all(exp.Column))
            if cols and all(x.name in by_sql.values() and not x.table for x in cols):
                kept.append(exp.Paren(this=typed))
        return exp.and_(*kept, copy=False) if kept else None

    def int_clause(self, key: str) -> int | None:
        """LIMIT / OFFSET: post-processing of the one released row, as on a single table."""
        node = self.stmt.args.get(key)
        if node is None:
            return None
        count = row_count(node)
        if count == 0 and key == "limit":
            self.bad(node, LIMIT_ZERO)
            return None
        if count is not None:
            return count
        self.bad(node, f"{key.upper()} {LIMIT_FORM}")
        return None

    def people(self, agg: tuple[str, exp.Expression | None, tuple[float, float]], value: exp.Expression | None,
               where: exp.Expression | None, conditions: list[tuple[str, str]]) -> ir.JoinPlan:
        """User slots, person classes, Delta and how it holds."""
        vs: list[Violation] = []
        slots: list[ir.UserSlot] = []
        # every table the join reads or reaches through references: its references must be usable
        # (types, public tables referencing only public tables), whatever was registered since
        reached: list[str] = []
        todo = [i.table.name for i in self.inputs]
        while todo:
            n = todo.pop()
            if n in reached or n not in self.catalog:
                continue
            reached.append(n)
            todo += [t.partition(".")[0] for t in self.catalog[n].references.values()]
        for n in reached:
            for problem, fix in reference_problems(self.catalog[n], self.catalog):
                _bad(self.sql, self.stmt, f"{problem} (hint: the data owner must {fix})", vs)
        _raise(vs, policy=True)
        for inp in self.inputs:
            chains = _slots_from(inp.table, self.catalog, frozenset())
            if any(c is None for c in chains):
                _bad(self.sql, inp.node, f"table '{inp.table.name}' declares a reference to a table that is not registered: it may "
                     "lead to a person (hint: register the referenced table, or correct the reference)", vs)
                continue
            if not inp.table.public and not chains:
                _bad(self.sql, inp.node, f"table '{inp.table.name}' is neither public nor linked to a person (hint: register it with "
                     "a privacy_unit, a reference to a person table, or public=True if it holds no person)", vs)
                continue
            for ch in chains:
                assert ch is not None
                cols = parts(ch[0].column) if ch else [inp.table.privacy_unit or ""]
                if not all(_PLAIN.match(c) for c in cols):
                    _bad(self.sql, inp.node, f"table '{inp.table.name}' reaches people through column(s) {cols} whose names are "
                         "not plain identifiers; the data owner must rename them to join this table", vs)
                    continue
                slots.append(self.reduce(inp.alias, ch))
        for person in dict.fromkeys(sl.person_table for sl in slots):
            pt = self.catalog[person]
            utype = pt.schema.get(pt.privacy_unit, "").upper() if pt.privacy_unit is not None else ""
            if utype.startswith("INTERVAL"):
                # SQL-equal intervals have several spellings ('1 day', '24:00:00'): one person would be
                # several users to the truncation (dpsql.rewrite.joins._person_text spells ids as text)
                _bad(self.sql, self.stmt, f"the privacy unit '{person}.{pt.privacy_unit}' is an INTERVAL, whose equal values "
                     "are spelled differently, so a join cannot tell its people apart (hint: the data owner must register "
                     "an integer, DECIMAL, text or date privacy unit)", vs)
            elif utype.strip() == "JSON":
                # refused at registration too: JSON compares under the connection's collation ('"A"' and '"a"'
                # one value under nocase) while its spelling, which names the user, tells them apart
                _bad(self.sql, self.stmt, f"the privacy unit '{person}.{pt.privacy_unit}' is JSON, whose equality follows "
                     "the connection's collation while its spelling does not, so a join cannot tell its people apart "
                     "(hint: the data owner must register an integer, DECIMAL, text or date privacy unit)", vs)
            elif is_nested_type(utype):
                # refused at registration too; kept here for a catalog built another way: one person would be
                # several users to the truncation
                _bad(self.sql, self.stmt, f"the privacy unit '{person}.{pt.privacy_unit}' has the nested type {utype}, whose "
                     "equal values can be spelled differently, so a join cannot tell its people apart (hint: the data "
                     "owner must register an integer, DECIMAL, text or date privacy unit)", vs)
        if not slots and not vs:
            _bad(self.sql, self.stmt, _ALL_PUBLIC, vs)
        _raise(vs, policy=True)
        jp = ir.JoinPlan(inputs=tuple((i.alias, i.table.name) for i in self.inputs), conditions=tuple(conditions),
                           where=where, kind=agg[0], value=value, bounds=agg[2], slots=tuple(_dedupe(slots)),
                           flat_schema=dict(self.flat_schema), unique_keys=tuple(self.unique),
                           keys=tuple(self.keys), left=tuple(self.left), left_on=tuple(self.left_on))
        pb = bound_people(jp, self.catalog)
        tables = dict(jp.inputs)
        written = [a for a, _ in jp.inputs]
        # a LEFT JOIN not on a key: the fix is the key, never a degree bound
        loose_left = [a for a in self.left if math.isinf(pb.delta) and all(math.isinf(max_rows_per_value(
            self.catalog[tables[a]], x.split(SEP, 1)[1], self.catalog)) for pair in conditions for x, y in (pair, pair[::-1])
            if x.split(SEP, 1)[0] == a and written.index(y.split(SEP, 1)[0]) < written.index(a))]
        if loose_left:
            refs = [f"'{tables[a]}' declares references={{'{c}': '{r}'}}" for a in tables if a not in self.left
                    for c, r in self.catalog[tables[a]].references.items()]
            raise PolicyError(f"a LEFT JOIN of {', '.join(repr(a) for a in loose_left)} is not on a declared key of its "
                              "table, so one row may match any number of its rows",
                              hint="LEFT JOIN each public lookup on the key the private table references"
                                   + (f" ({'; '.join(refs)})" if refs else "") + ", or use an inner JOIN")
        if math.isinf(pb.delta):
            names = ", ".join(f"'{s.alias}.{s.column}'" + (f" (references {s.hops[0].target_table}.{s.hops[0].target_column})"
                                                           if s.hops else " (its privacy unit)") for s in jp.slots)
            loose = [f"'{s.alias}.{s.column}'" for s in jp.slots
                     if not _finite_chain(self.catalog[dict(jp.inputs)[s.alias]], s.hops, self.catalog)]
            if not loose and all(len(_walk(jp, self.catalog, s.alias, None)[2]) == len(jp.inputs) - 1 for s in jp.slots):
                # every step is bounded: the product of the declared bounds left the DOUBLE range
                raise PolicyError(f"a join tuple reaches people through {len(jp.slots)} path(s) ({names}) and the declared "
                                  "bounds multiply to more join tuples per person (Delta) than a DOUBLE holds: above 2^63, "
                                  "the most the accounting takes",
                                  hint="the data owner may declare smaller degree_bounds or max_rows_per_unit")
            what = (f"no bound on the rows per person through {', '.join(loose)}" if loose else
                    "some input joins on a column with no declared bound")
            example = "degree_bounds={'customer_id': 64}"
            if not loose:
                # the inputs a walk from the first person's input cannot reach through a bounded column: name them,
                # and the declaration that bounds one (the most rows sharing one value of a column it joins on)
                start = jp.slots[0].alias
                walked = {start} | {b for b, _, _ in _walk(jp, self.catalog, start, None)[1]}
                unbounded = [(a, t, sorted({c.split(SEP, 1)[1] for pair in jp.conditions for c in pair
                                            if c.split(SEP, 1)[0] == a})) for a, t in jp.inputs if a not in walked]
                named = [f"'{a}' (table '{t}') on {', '.join(cols)}" for a, t, cols in unbounded if cols]
                if named:
                    what += ": " + "; ".join(named)
                    a, t, cols = next(u for u in unbounded if u[2])
                    ref = "" if cols[0] in self.catalog[t].references else f"references={{'{cols[0]}': 'table.key'}} and "
                    example = (f"{ref}degree_bounds={{'{cols[0]}': N}} on table '{t}' (N: the most rows one value of it "
                               "holds)")
            paths = f"{len(jp.slots)} path" + ("s" if len(jp.slots) != 1 else "")
            _bad(self.sql, self.stmt, f"a join tuple reaches people through {paths} ({names}) and the tuples "
                 f"per person cannot be bounded from the catalog: {what} (hint: {self._lookup_hint(jp)}declare "
                 f"degree_bounds for these references, e.g. {example}, or join on keys and privacy units)", vs)
            _raise(vs, policy=True)
        return jp

    def _lookup_hint(self, jp: ir.JoinPlan) -> str:
        """A join of a private table with a public lookup table on a column the catalog does not declare a key
        of the lookup (one order may then match any number of its rows): the reference that declares it."""
        tables = dict(jp.inputs)
        for a, b in jp.conditions:
            for x, y in ((a, b), (b, a)):
                (xa, xc), (ya, yc) = x.split(SEP, 1), y.split(SEP, 1)
                xt, yt = self.catalog[tables[xa]], self.catalog[tables[ya]]
                if yt.public and not xt.public and xc not in xt.references:
                    return (f"declare {yt.name}.{yc} a key of the lookup table by registering '{xt.name}' with "
                            f"references={{'{xc}': '{yt.name}.{yc}'}}, or ")
        return ""

    def reduce(self, alias: str, chain: tuple[ir.Hop, ...]) -> ir.UserSlot:
        """Follow hops that the join itself performs (an input of the target table joined on the
        target key), so that equal slots get equal person classes."""
        cur, rest = alias, chain
        while rest:
            hop = rest[0]
            if _direct(rest, self.catalog):
                break  # the fk's value is the person
            nxt = next((i.alias for i in self.inputs if i.table.name == hop.target_table
                        and all(self.uf.find(flat(i.alias, tc)) == self.uf.find(flat(cur, fc))
                                for tc, fc in zip(parts(hop.target_column), parts(hop.column), strict=True))), None)
            if nxt is None:
                break
            # the join performs this hop: exact only if the target's key value is unique in its table
            # (join_relation keeps only such rows: see ir.JoinPlan.unique_keys)
            if (nxt, hop.target_column) not in self.unique:
                self.unique.append((nxt, hop.target_column))
            cur, rest = nxt, rest[1:]
        if not rest:
            table = next(i.table for i in self.inputs if i.alias == cur)
            assert table.privacy_unit is not None
            return ir.UserSlot(cur, (), table.name, table.privacy_unit, self.uf.find(flat(cur, table.privacy_unit)))
        person = rest[-1].target_table
        if _direct(rest, self.catalog):
            return ir.UserSlot(cur, rest, person, rest[0].column, self.uf.find(flat(cur, rest[0].column)))
        return ir.UserSlot(cur, rest, person, rest[0].column, None)


def _direct(chain: tuple[ir.Hop, ...], catalog: Mapping[str, TableSpec]) -> bool:
    """A one-hop chain to a person table's privacy unit: the foreign key's value is the person."""
    return len(chain) == 1 and catalog[chain[0].target_table].privacy_unit == chain[0].target_column


def chain_rows(table: TableSpec, chain: tuple[ir.Hop, ...], catalog: Mapping[str, TableSpec],
               lowered: Mapping[str, int] | None = None) -> float:
    """The most rows of ``table`` that reach one person through ``chain`` (public bounds only)."""
    if not chain:
        assert table.privacy_unit is not None
        return max_rows_per_value(table, table.privacy_unit, catalog, lowered)
    here = max_rows_per_value(table, chain[0].column, catalog, lowered)
    if _direct(chain, catalog):
        return here
    return here * chain_rows(catalog[chain[0].target_table], chain[1:], catalog, lowered)


def _finite_chain(table: TableSpec, chain: tuple[ir.Hop, ...], catalog: Mapping[str, TableSpec]) -> bool:
    """Whether every step of :func:`chain_rows` has a declared bound (its product may still overflow)."""
    if not chain:
        assert table.privacy_unit is not None
        return math.isfinite(max_rows_per_value(table, table.privacy_unit, catalog))
    if math.isinf(max_rows_per_value(table, chain[0].column, catalog)):
        return False
    return _direct(chain, catalog) or _finite_chain(catalog[chain[0].target_table], chain[1:], catalog)


@dataclass(frozen=True)
class PeopleBound:
    """Delta and how it holds, for a join plan (public)."""

    delta: float  #: most join tuples one person is in (inf: unbounded)
    classes: int  #: person classes (1: every tuple has one owner)
    single_owner: bool
    enforced: bool  #: single owner with no looked-up slot: per-input row caps enforce Delta
    caps: tuple[tuple[str, str, int], ...]  #: (alias, column, n): at most n rows per value (enforced only)
    owner: ir.UserSlot | None  #: the slot that identifies the one owner (single owner)
    derivation: str  #: how Delta follows from the declarations
    #: the most people one join tuple reaches (public): one per person class of a slot whose column holds the
    #: person, unbounded (inf) with a looked-up slot (a declared key is not trusted: duplicates attach several)
    per_tuple: float = math.inf


def _walk(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec], start: str, lowered: Mapping[str, int] | None
          ) -> tuple[float, list[tuple[str, str, int]], list[str]]:
    """From input ``start``, add inputs one at a time: each multiplies the tuple count by the most
    rows sharing one value of the column it joins on (least over its joined columns)."""
    uf = _UnionFind()
    tables = {a: catalog[t] for a, t in jp.inputs}
    for a, b in jp.conditions:
        uf.union(a, b)
    cols_of = {a: sorted({c.split(SEP, 1)[1] for pair in jp.conditions for c in pair if c.split(SEP, 1)[0] == a})
               for a, _ in jp.inputs}
    # composite keys and foreign keys of an input, usable when every column is joined
    combos = {a: sorted({k for k in (table_keys(t, catalog) | set(t.degree_bounds) | set(t.references)) if "," in k
                         and set(parts(k)) <= set(cols_of[a])}) for a, t in tables.items()}
    visited = {start}
    factor = 1.0
    caps: list[tuple[str, str, int]] = []
    steps: list[str] = []
    while len(visited) < len(tables):
        seen_classes = {uf.find(flat(x, c)) for x in visited for c in cols_of[x]}
        best: tuple[float, str, str] | None = None
        for b in tables:
            if b in visited:
                continue
            for c in cols_of[b] + combos[b]:
                if all(uf.find(flat(b, p)) in seen_classes for p in parts(c)):
                    m = max_rows_per_value(tables[b], c, catalog, lowered)
                    if best is None or m < best[0]:
                        best = (m, b, c)
        if best is None or math.isinf(best[0]):
            return math.inf, caps, steps
        m, b, c = best
        visited.add(b)
        factor *= m
        caps.append((b, c, int(m)))
        steps.append(f"x{int(m)} ({b}.{c})")
    return factor, caps, steps


def join_sequence(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec]) -> tuple[str, ...]:
    """The order in which the join SQL joins the inputs of ``jp`` (aliases), from public metadata only.

    The bounded query joins them left-deep in this order, each input on the right of its join: the side
    DuckDB builds its hash table on, as written (private reads run with ``join_order`` and
    ``build_side_probe_side`` off, which chose both from the inputs' estimated row counts, so that one
    person's rows could regroup a chain or swap a join's sides: ``dpsql.engine.duckdb.STATISTICS_OPTIMIZERS``).
    The order therefore depends on the query and the catalog, never on the rows.

    Each input after the first shares an ON equality with one before it (no cross product), and is the one
    with the fewest rows per joined value (``max_rows_per_value``: 1 for a declared key, a degree bound,
    a per-person row cap; ties: the order the query names them): a table entered through its key (the
    "one" side of a foreign key: a person table's unit, a dimension) is built, and the table holding many
    rows per key probes. The first input is the one from which this walk multiplies the tuples the least
    (``lineitem`` in customer - orders - lineitem: x1 through ``o_orderkey``, x1 through ``c_custkey``,
    against x8 x4 from ``customer``), so the hash tables are those of the tables reached through keys."""
    aliases = [a for a, _ in jp.inputs]
    written = {a: i for i, a in enumerate(aliases)}
    tables = {a: catalog[t] for a, t in jp.inputs}
    edges = [(x.split(SEP, 1), y.split(SEP, 1)) for x, y in jp.conditions]

    def rows_per_value(b: str, done: set[str]) -> float | None:
        cols = {bc for (xa, xc), (ya, yc) in edges for (ba, bc), (oa, _) in (((xa, xc), (ya, yc)), ((ya, yc), (xa, xc)))
                if ba == b and oa in done}
        if not cols:
            return None
        t = tables[b]
        combos = {k for k in (table_keys(t, catalog) | set(t.degree_bounds) | set(t.references)) if set(parts(k)) <= cols}
        return min(max_rows_per_value(t, c, catalog) for c in cols | combos)

    def walk(start: str) -> tuple[float, list[str]] | None:
        order, done, factor = [start], {start}, 1.0
        while len(order) < len(aliases):
            steps = [(m, written[b], b) for b in aliases if b not in done
                     for m in [rows_per_value(b, done)] if m is not None]
            if not steps:
                return None
            m, _, b = min(steps)
            order.append(b)
            done.add(b)
            factor *= m
        return factor, order

    walks = [(w[0], written[a], w[1]) for a in aliases for w in [walk(a)] if w is not None]
    if not walks:  # pragma: no cover - an accepted plan's inputs are all linked by ON equalities
        return tuple(aliases)
    return tuple(min(walks)[2])


def _reach_columns(table: TableSpec, catalog: Mapping[str, TableSpec]) -> list[str]:
    """The columns of ``table`` through which its rows reach people: the first column of each chain
    of ``_slots_from`` (its own unit, a foreign key). Public metadata only."""
    out: list[str] = []
    for ch in _slots_from(table, catalog, frozenset()):
        if ch is None:
            continue
        for c in parts(ch[0].column) if ch else [table.privacy_unit or ""]:
            if c not in out:
                out.append(c)
    return out


def _uniform_caps(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec], owner: ir.UserSlot,
                  caps: list[tuple[str, str, int]]) -> tuple[tuple[str, str, int], ...] | None:
    """``caps`` (the anchor's, then the walk's, in walk order) with each partition widened by the
    input's other columns that reach people, or None where that is impossible.

    A cap keeps n rows per partition, a choice among that partition's rows: it is stable under
    removing a person only if every row of a partition reaches the same people, i.e. if the
    partition fixes every column through which the input reaches people. ``lineitem`` capped per
    ``l_orderkey`` but also referencing its customer: one person's line items on other people's
    orders pushed those people's rows out of the cap (removing a person who is in no tuple changed
    others' tuples). So each such column joins the partition; the cap's n still bounds the rows that
    extend one partial tuple when the column is fixed by the inputs joined before (its class, under
    the ON equalities, holds a column of an input joined before; for the anchor: the owner's class),
    since every row extending that partial tuple then lies in one partition. If a column is not
    fixed so, no partition is both stable and a bound: the plan is not enforced (Delta attested)."""
    uf = _UnionFind()
    for a, b in jp.conditions:
        uf.union(a, b)
    tables = {a: catalog[t] for a, t in jp.inputs}
    cols_of = {a: {c.split(SEP, 1)[1] for pair in jp.conditions for c in pair if c.split(SEP, 1)[0] == a}
               for a, _ in jp.inputs}
    out: list[tuple[str, str, int]] = []
    visited: list[str] = []
    for i, (a, col, n) in enumerate(caps):
        fixed = ({uf.find(flat(a, owner.column))} if i == 0
                 else {uf.find(flat(x, c)) for x in visited for c in cols_of[x]})
        cols = list(parts(col))
        for c in _reach_columns(tables[a], catalog):
            if c in cols:
                continue
            if uf.find(flat(a, c)) not in fixed:
                return None
            cols.append(c)
        out.append((a, ",".join(cols), n))
        visited.append(a)
    return tuple(out)


def bound_people(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec], lowered: Mapping[str, int] | None = None) -> PeopleBound:
    """Delta of a join plan from the owner's declarations (``lowered``: per-query lower bounds on
    ``table.column`` degrees, enforced plans only). See the module docstring."""
    tables = {a: catalog[t] for a, t in jp.inputs}
    #: per person class: (Delta, slot, caps widened to stable partitions or None, derivation), the least
    #: Delta; and the least Delta among slots whose caps partition stably (enforceable)
    per_class: dict[tuple[str, str], tuple[float, ir.UserSlot, tuple[tuple[str, str, int], ...] | None, str]] = {}
    stable: dict[tuple[str, str], tuple[float, ir.UserSlot, tuple[tuple[str, str, int], ...] | None, str]] = {}
    per_tuple = float(len({(s.person_table, s.person_class) for s in jp.slots}))
    if any(s.person_class is None for s in jp.slots):
        per_tuple = math.inf
    for k, s in enumerate(jp.slots):
        key = (s.person_table, s.person_class if s.person_class is not None else f"#lookup{k}")
        m = chain_rows(tables[s.alias], s.hops, catalog, lowered)
        rest, caps, steps = _walk(jp, catalog, s.alias, lowered)
        d = m * rest
        anchored = math.isfinite(d) and (not s.hops or _direct(s.hops, catalog))
        uniform = _uniform_caps(jp, catalog, s, [(s.alias, s.column, int(m)), *caps]) if anchored else None
        how = f"{s.alias}.{s.column}: {m:g} row(s) per person" + "".join(" " + x for x in steps) + f" = {d:g}"
        if key not in per_class or d < per_class[key][0]:
            per_class[key] = (d, s, uniform, how)
        if uniform is not None and (key not in stable or d < stable[key][0]):
            stable[key] = (d, s, uniform, how)
    single = len(per_class) == 1
    if single and next(iter(per_class)) in stable:
        per_class = stable  # one owner: enforce through a stable slot (its Delta, maybe above the least)
    sums: dict[str, float] = {}
    for (person, _), (d, *_rest) in per_class.items():
        sums[person] = sums.get(person, 0.0) + d
    delta = max(sums.values()) if sums else math.inf
    owner = next(iter(per_class.values()))[1] if single else None
    widened = next(iter(per_class.values()))[2] if single else None
    enforced = (single and math.isfinite(delta) and owner is not None and owner.person_class is not None
                and widened is not None)
    caps_t = widened if enforced and widened is not None else ()
    derivation = "; ".join(v[3] for v in per_class.values())
    return PeopleBound(delta, len(per_class), single, enforced, caps_t, owner, derivation, per_tuple)


def hop_column(h: ir.Hop) -> str:
    return h.column


def _dedupe(slots: list[ir.UserSlot]) -> list[ir.UserSlot]:
    out: list[ir.UserSlot] = []
    for s in slots:
        if s not in out:
            out.append(s)
    return out


#: integer types DuckDB compares with each other without a failing cast (UHUGEINT is compared with a signed
#: type through HUGEINT, which fails on values >= 2^127: it joins only with itself)
_INT_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                        "UBIGINT", "INT", "INT1", "INT2", "INT4", "INT8", "INT16"})


def _type_family(t: str) -> str:
    """Types an ON equality may compare: the integer types with each other (exact), the text types with
    each other, otherwise one type with itself. Whole type names only: a prefix test read INTERVAL and
    BIGINT[] as integers and VARCHAR[] as text, and DuckDB's implicit cast between them ran on the joined
    rows (failing, after the charge, only when some row reached it)."""
    t = t.strip().upper()
    if t in _INT_TYPES:
        return "int"
    if re.fullmatch(r"(VARCHAR|TEXT|STRING)(\(\d+\))?", t):  # Spark spells a bounded text VARCHAR(n)
        return "text"
    return t


def _spelled(stmt: exp.Select, columns: set[str]) -> exp.Select:
    """``stmt`` with the select-list aliases that an output (earlier ones) or the WHERE names written out, as
    on one table (``COUNT(*) AS n, n * 2 AS n2``; ``WHERE seg <> 'a'``); a column of a joined table of that
    name wins, and an aggregate's argument is left as written (it reads the tables' columns)."""
    by_alias: dict[str, exp.Expression] = {}
    items: list[exp.Expression] = []
    for it in stmt.expressions:
        inner = spell_aliases(it.unalias(), by_alias, in_aggregates=False)
        if isinstance(it, exp.Alias):
            items.append(carry_written(exp.Alias(this=inner, alias=it.args["alias"].copy()), it))
            if it.alias.lower() not in columns:
                by_alias[it.alias.lower()] = inner
        elif inner.sql(dialect="duckdb") != it.sql(dialect="duckdb"):  # named as written
            items.append(exp.Alias(this=inner, alias=exp.to_identifier(it.sql(dialect="duckdb"), quoted=True)))
        else:
            items.append(it)
    where = stmt.args.get("where")
    if not by_alias:
        return stmt
    out = stmt.copy()
    out.set("expressions", items)
    if where is not None:
        out.set("where", exp.Where(this=spell_aliases(where.this, by_alias)))
    return out


def analyze_join(sql: str, stmt: exp.Select, catalog: Mapping[str, TableSpec]) -> ir.QueryPlan:
    """The plan of a join query (or of a single table with several paths to people)."""
    return _JoinBuilder(sql, stmt, catalog).build()


def _never_null(node: exp.Expression) -> bool:
    """A value SQL never makes NULL on any row: a numeric or boolean literal, a CASE / IF whose every result (its ELSE
    included) is one, a COALESCE with one such argument, or + - * and unary minus of such values."""
    while isinstance(node, exp.Paren):
        node = node.this
    if never_null_literal(node) and not (isinstance(node, exp.Literal) and node.is_string):
        return True
    if isinstance(node, exp.Case):
        return (node.args.get("default") is not None and _never_null(node.args["default"])
                and all(_never_null(i.args["true"]) for i in node.args.get("ifs") or []))
    if isinstance(node, exp.If):
        return node.args.get("false") is not None and _never_null(node.args["true"]) and _never_null(node.args["false"])
    if isinstance(node, exp.Coalesce):
        return any(_never_null(a) for a in [node.this, *node.expressions])
    if isinstance(node, exp.Neg):
        return _never_null(node.this)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        return _never_null(node.this) and _never_null(node.expression)
    return False


def _over_windows(node: exp.Expression, post: Callable[[exp.Expression], exp.Expression]) -> exp.Expression:
    """``post`` (aggregates and keys -> the released columns) applied to ``node`` and to the inputs of each window in
    it (``dpsql.plan.windows.inputs``: arguments, PARTITION BY, ORDER BY), never to a window's own function (RANK(), the
    outer SUM of SUM(SUM(x)) OVER ()), which runs over the released rows as on one table."""
    from dpsql.plan import windows

    found: list[exp.Window] = []

    def lift(x: exp.Expression) -> exp.Expression:
        if isinstance(x, exp.Window):
            found.append(x.copy())
            return exp.Var(this=f"__dpsql_window_{len(found) - 1}")
        return x

    outer = post(node.copy().transform(lift))
    done: list[exp.Expression] = []
    for w in found:
        for part in windows.inputs(w):
            new = post(part)
            if new is not part:
                part.replace(new)
        done.append(w)
    return outer.transform(lambda x: done[int(x.name.rsplit("_", 1)[1])].copy()
                           if isinstance(x, exp.Var) and x.name.startswith("__dpsql_window_") else x)


def where_conjuncts(cond: exp.Expression | None) -> list[exp.Expression]:
    """The AND-ed terms of a condition, also inside parentheses: the same conjunction however it is grouped."""
    while isinstance(cond, exp.Paren):
        cond = cond.this
    if cond is None:
        return []
    if not isinstance(cond, exp.And):
        return [cond]
    return [c for part in cond.flatten() for c in where_conjuncts(part)]
