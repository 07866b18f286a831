"""Views: non-recursive CTEs (``WITH v AS (...)``) and subqueries in FROM, merged into the flat query.

A view that is a plain projection and filter (``SELECT exprs FROM t [JOIN ... ON ...] [WHERE ...]``) is
inlined before analysis: the outer query's references to its columns become the view's expressions,
its WHERE is ANDed into the outer WHERE and its tables take its place in FROM / JOIN (a view named
twice is a self-join of its body). The merged query is then analysed as any flat query (the same
typer, allow-list, bounds and caps): a view answers nothing that the flat query would not.

Refused, for free, with the fix (write the query flat): a view that aggregates, or holds DISTINCT,
ORDER BY, LIMIT / OFFSET, a window, a set operation or an outer join / USING; WITH RECURSIVE; a CTE
that is never used (it would be silently ignored); a merged query of more than :data:`MAX_NODES`
expression nodes. Inside its own body a CTE's name means the registered table of that name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from dpsql.catalog import TableSpec
from dpsql.errors import PolicyError, UnsupportedQueryError, Violation
from dpsql.plan.checks import check_expression_functions, is_aggregate, violation, written_name
from dpsql.plan.names import did_you_mean
from dpsql.plan.parse import DIALECT, WRITTEN, keyword_offset, original, stands_for, tokens

#: the merged query may hold at most this many expression nodes (a CTE named many times, or CTEs
#: naming each other, multiply their bodies); above it the query is refused
MAX_NODES = 20_000

_FLAT = "write the query flat: select from the registered tables directly, with the conditions in WHERE"

#: clauses on a view's reference or a subquery in FROM, by sqlglot's name: each changes which rows it gives
_CLAUSES = {"pivots": "PIVOT / UNPIVOT", "sample": "TABLESAMPLE", "joins": "a JOIN inside the reference",
            "laterals": "LATERAL", "hints": "a table hint", "version": "a time travel clause (AT / FOR ... AS OF)"}

#: the modifiers of * (EXCLUDE is sqlglot's ``except_``; ``except`` in older versions; * ILIKE 'pattern' keeps the
#: columns whose names match): a view's * with one is refused, merged as a plain * it would give every column
_STAR_MODIFIERS = ("except", "except_", "replace", "rename", "ilike")

#: refused in FROM wherever a table is expected: a VALUES list is rows written in the query, not a registered table
VALUES_IN_FROM = ("VALUES in FROM is not supported: dpsql answers queries over registered tables (each row tied to a "
                  "person), and a VALUES list is rows written into the query")


@dataclass
class _View:
    name: str
    label: str  #: "the CTE 'v'" or "the subquery 't' in FROM"
    tables: list[tuple[str, exp.Table]]  #: (alias, table) in FROM / JOIN order
    joins: list[exp.Join]  #: the joins of tables[1:], ON columns qualified
    outputs: list[tuple[str, exp.Expression, int]]  #: (name, expression, node count)
    where: exp.Expression | None
    where_size: int
    used: bool = False
    specs: dict[str, TableSpec | None] = field(default_factory=dict)  #: alias -> the table's spec


@dataclass
class _Source:
    alias: str
    node: exp.Expression
    view: _View | None = None
    spec: TableSpec | None = None
    outputs: list[tuple[str, exp.Expression, int]] = field(default_factory=list)


def _size(node: exp.Expression | None, stop: int = MAX_NODES + 1) -> int:
    if node is None:
        return 0
    n = 0
    for n, _ in enumerate(node.walk(), 1):
        if n >= stop:
            break
    return n


def _own_nodes(root: exp.Expression, kind: type[exp.Expression]) -> list[exp.Expression]:
    """The ``kind`` nodes of ``root`` outside the queries nested in it (a subquery in WHERE, a view in FROM)."""
    out: list[exp.Expression] = []
    for node in root.walk(prune=lambda n: n is not root and isinstance(n, (exp.Subquery, exp.Select, exp.Exists,
                                                                            exp.With, exp.SetOperation))):
        if isinstance(node, kind):
            out.append(node)
    return out


def _wrap(e: exp.Expression) -> exp.Expression:
    return e if isinstance(e, (exp.Column, exp.Literal, exp.Paren, exp.Boolean, exp.Null)) else exp.Paren(this=e)


def _qualify(c: exp.Column, table: str) -> None:
    """Set ``c``'s table to ``table``, keeping the column as the query wrote it for messages."""
    if c._meta is None or WRITTEN not in c._meta:
        c.meta[WRITTEN] = original(c)
    c.set("table", exp.to_identifier(table))


def _requalify(e: exp.Expression, rename: Mapping[str, str]) -> exp.Expression:
    out = e.copy()
    for c in list(out.find_all(exp.Column)):
        if c.table and c.table.lower() in rename:
            _qualify(c, rename[c.table.lower()])
    return out


class _Merger:
    def __init__(self, sql: str, catalog: Mapping[str, TableSpec]) -> None:
        self.sql = sql
        self.catalog = catalog
        self.nodes = 0

    def refuse(self, node: exp.Expression, message: str, hint: str | None = None, *, offset: int | None = None,
               policy: bool = False) -> None:
        v = violation(node, self.sql, message, offset=offset)
        cls = PolicyError if policy else UnsupportedQueryError
        raise cls(str(v), violations=[Violation(message, v.line, v.col, v.fragment)], hint=hint)

    def count(self, n: int, at: exp.Expression) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            self.refuse(at, f"the query with its CTEs and subqueries merged would hold more than {MAX_NODES} expression "
                            "nodes (a CTE named many times, or CTEs naming each other, repeat their bodies)",
                        f"{_FLAT}, or name each CTE fewer times")

    def select_start(self, body: exp.Expression, *words: str) -> int:
        """The offset of the SELECT keyword that opens ``body`` (of its first recorded token if unknown)."""
        first = _start(body)
        heads = [t.start for t in tokens(self.sql) if t.start <= first and t.text.upper() in (words or ("SELECT", "FROM"))]
        return heads[-1] if heads else first

    # -- a view's body -----------------------------------------------------------------------------
    def shape(self, body: exp.Expression, label: str) -> None:
        """Refuse a body that is not a plain projection and filter, naming the construct."""
        inner = body
        while isinstance(inner, exp.Subquery) and not inner.args.get("alias"):
            inner = inner.this
        if isinstance(inner, exp.Table):  # FROM (t), FROM ((t)), FROM (t JOIN u ON ...): parentheses, no SELECT
            plain = not inner.args.get("joins") and isinstance(inner.this, exp.Identifier)
            self.refuse(body, "parentheses around a table or a join in FROM are not supported",
                        "write the table or the join without the parentheses"
                        + (f" (FROM {exp.Table(this=inner.this.copy(), alias=inner.args.get('alias')).sql(dialect=DIALECT)})"
                           if plain else ""))
        if isinstance(body, exp.Subquery):  # FROM ((SELECT ...)) t
            self.refuse(body, f"doubled parentheses around a subquery in FROM ({label}) are not supported",
                        "write one pair of parentheses: FROM (SELECT ...) t")
        if isinstance(body, exp.Values):
            self.refuse(body, f"{VALUES_IN_FROM} ({label})", "select from a registered table")
        if not isinstance(body, exp.Select):
            what = ("a set operation (UNION / INTERSECT / EXCEPT)" if isinstance(body, exp.SetOperation)
                    else f"a {type(body).__name__.upper()} statement")
            self.refuse(body, f"{what} in {label} is not supported: only a plain SELECT ... FROM ... WHERE is merged "
                              "into the query", f"{_FLAT} (one SELECT per query)")
        assert isinstance(body, exp.Select)
        checks: list[tuple[str, str, str]] = [
            ("distinct", "DISTINCT", "drop DISTINCT (count distinct people with COUNT(DISTINCT unit) in the outer query)"),
            ("group", "GROUP BY", "group and aggregate in the outer query (a condition on an aggregate in its HAVING, "
                                  "e.g. HAVING COUNT(*) > 10; an expression of one in its SELECT): an aggregate of "
                                  "aggregates is not supported"),
            ("having", "HAVING", "aggregate in the outer query only, with HAVING there"),
            ("order", "ORDER BY", "drop the ORDER BY (order the outer query's released rows instead)"),
            ("limit", "LIMIT", "drop the LIMIT: it keeps rows chosen by their order, not by person"),
            ("offset", "OFFSET", "drop the OFFSET: it keeps rows chosen by their order, not by person"),
            ("qualify", "QUALIFY", "drop the window filter"),
            ("windows", "a WINDOW clause", "drop the window"),
            ("laterals", "LATERAL", "join registered tables with JOIN ... ON"),
            ("connect", "CONNECT BY", "drop it"),
            # refused in the outer query too (``checks``): merged, they were dropped, so a sample was answered in full
            ("sample", "USING SAMPLE", "drop the sample: sampling changes each person's contribution (dpsql bounds "
                                       "each person's rows itself)"),
            ("into", "SELECT ... INTO", "drop INTO"),
            ("locks", "FOR UPDATE / FOR SHARE", "drop the locking clause"),
            ("prewhere", "PREWHERE", "write the condition in WHERE"),
            # DuckDB's dialect has none of these: merged, they were dropped without a word (refused in the outer query)
            ("cluster", "CLUSTER BY", "drop it (ORDER BY in the outer query sorts the released rows)"),
            ("distribute", "DISTRIBUTE BY", "drop it (ORDER BY in the outer query sorts the released rows)"),
            ("sort", "SORT BY", "drop it (ORDER BY in the outer query sorts the released rows)"),
            ("kind", "SELECT AS STRUCT / AS VALUE", "drop AS STRUCT / AS VALUE (select the columns)"),
        ]
        unit = self.groups_by_unit(body)
        if unit is not None:  # SmartNoise's and Qrlew's per-person pre-aggregation: name its flat form
            per_person = (f"a per-person pre-aggregation (GROUP BY {unit}) is not needed: dpsql bounds each person's rows "
                          "itself (the table's max_groups_per_unit and max_rows_per_group); a mean per person is a ratio "
                          f"of flat aggregates: COUNT(*) / COUNT(DISTINCT {unit}) rows, SUM(x) / COUNT(DISTINCT {unit}) "
                          "of x (a distribution of per-person values is not supported)")
            checks = [(k, w, per_person if k == "group" else f) for k, w, f in checks]
        for key, what, fix in checks:
            val = body.args.get(key)
            if val:
                word = what.split()[0]
                off = keyword_offset(self.sql, {word, what}, after=self.select_start(body)) if word in (
                    "DISTINCT", "GROUP", "ORDER", "LIMIT", "OFFSET", "QUALIFY", "HAVING") else None
                self.refuse(val if isinstance(val, exp.Expression) else body,
                            f"{what} in {label} is not supported: only a plain projection and filter (SELECT expressions "
                            "FROM tables [JOIN ... ON ...] [WHERE ...]) is merged into the query",
                            f"{_FLAT}; {fix}", offset=off)
        for item in body.expressions:
            for node in _own_nodes(item, exp.Expression):
                if isinstance(node, exp.Window):
                    self.refuse(node, f"a window function in {label} is not supported: only a plain projection and "
                                      "filter is merged into the query", f"{_FLAT}; window functions are not supported")
                if is_aggregate(node):
                    self.refuse(node, f"an aggregate in {label} is not supported: the released aggregates are the outer "
                                      "query's; an aggregate inside a view would be an aggregate of aggregates",
                                f"{_FLAT}, with the aggregate in the outer SELECT")
        for node in _own_nodes(body, exp.Window):
            self.refuse(node, f"a window function in {label} is not supported", f"{_FLAT}; window functions are not "
                        "supported")

    def groups_by_unit(self, body: exp.Select) -> str | None:
        """The privacy unit a view's GROUP BY names, as written, when it groups by the unit of a table it reads."""
        group = body.args.get("group")
        from_ = body.args.get("from_")
        if group is None or from_ is None:
            return None
        units = {spec.privacy_unit.lower() for t in [from_.this] + [j.this for j in body.args.get("joins") or []]
                 if isinstance(t, exp.Table) and (spec := self.catalog.get(t.name.lower())) is not None
                 and spec.privacy_unit}
        return next((c.name for c in group.expressions if isinstance(c, exp.Column) and c.name.lower() in units), None)

    def view(self, body: exp.Expression, name: str, label: str, columns: list[exp.Identifier],
             scope: dict[str, _View], at: exp.Expression) -> _View:
        self.shape(body, label)
        assert isinstance(body, exp.Select)
        flat = self.merge(body, scope, expand=True)
        from_ = flat.args.get("from_")
        if from_ is None:
            self.refuse(body, f"{label} has no FROM clause", "select from a registered table")
        items: list[exp.Expression] = [from_.this] + [j.this for j in flat.args.get("joins") or []]
        tables: list[tuple[str, exp.Table]] = []
        specs: dict[str, TableSpec | None] = {}
        for t in items:
            if isinstance(t, exp.Values):
                self.refuse(t, f"{VALUES_IN_FROM} ({label})", "select from a registered table")
            if not isinstance(t, exp.Table) or not isinstance(t.this, exp.Identifier):
                self.refuse(t, f"table functions and file paths are not allowed in queries ({label})",
                            "register the file as a table and select from its name")
            assert isinstance(t, exp.Table)
            a = t.alias_or_name.lower()
            if a in specs:
                self.refuse(t, f"'{a}' names two tables in {label}", "give each use of a table its own alias")
            specs[a] = self.catalog.get(t.name.lower())
            tables.append((a, t))
        for j in flat.args.get("joins") or []:
            self.join_form(j, label)

        def owners(name: str) -> list[str]:
            return [a for a, s in specs.items() if s is not None and name in s.schema]

        registered = all(s is not None for s in specs.values())

        def resolve(e: exp.Expression, aliases: dict[str, tuple[exp.Expression, int]]) -> exp.Expression:
            out = e.copy()
            for c in _own_nodes(out, exp.Column):
                assert isinstance(c, exp.Column)
                if isinstance(c.this, exp.Star):
                    continue
                if c.table:
                    if c.table.lower() not in specs:
                        self.refuse(c, f"{label} refers to '{c.table}', which is not one of its tables (a correlated "
                                       "or lateral subquery is not supported)", _FLAT)
                    continue
                nm = c.name.lower()
                own = owners(nm)
                if not own and nm in aliases:
                    alias, n = aliases[nm]
                    self.count(n, c)  # an alias named k times is copied k times: counted before the copy
                    new = stands_for(_wrap(alias.copy()), c)
                    if c is out:
                        return new
                    c.replace(new)
                elif len(tables) == 1:
                    _qualify(c, tables[0][0])
                elif len(own) == 1:
                    _qualify(c, own[0])
                elif own:
                    self.refuse(c, f"column '{c.name}' is ambiguous in {label}: it is a column of "
                                   f"{', '.join(repr(a) for a in own)}", "qualify it with the alias you mean")
                elif registered:
                    # left bare, it would be read from a table of the outer query or an alias of its SELECT
                    bare = nm.removesuffix("_bin") if nm.endswith("_bin") else None
                    by_bin = owners(bare) if bare else []
                    if len(by_bin) == 1:
                        _qualify(c, by_bin[0])
                        continue
                    cols = sorted({col for s in specs.values() if s is not None for col in s.schema})
                    self.refuse(c, f"unknown column '{c.name}' in {label} (the columns of its tables: "
                                   f"{', '.join(cols)}){did_you_mean(c.name, cols)}",
                                "a view reads only its own tables' columns (a correlated subquery is not supported)")
            return out

        outputs: list[tuple[str, exp.Expression]] = []
        earlier: dict[str, tuple[exp.Expression, int]] = {}
        for it in flat.expressions:
            inner = it.unalias() if isinstance(it, exp.Alias) else it
            star = inner if isinstance(inner, exp.Star) else inner.this if (
                isinstance(inner, exp.Column) and isinstance(inner.this, exp.Star)) else None
            if star is not None:
                if any(star.args.get(k) for k in _STAR_MODIFIERS):
                    self.refuse(it, f"SELECT * with EXCLUDE / REPLACE / RENAME / ILIKE in {label} is not supported",
                                "list the columns the view selects")
                q = inner.table.lower() if isinstance(inner, exp.Column) and inner.table else None
                if q is not None and q not in specs:
                    self.refuse(it, f"{label} refers to '{q}', which is not one of its tables", _FLAT)
                for a, t in tables:
                    if q is not None and a != q:
                        continue
                    spec = specs[a]
                    if spec is None:
                        known = ", ".join(sorted(self.catalog)) or "none"
                        self.refuse(t, f"table '{t.name}' is not registered{did_you_mean(t.name, self.catalog)} "
                                       f"(registered tables: {known}); register it with a privacy unit first",
                                    policy=True)
                    assert spec is not None
                    outputs.extend((col, exp.column(col, table=a, quoted=not col.isidentifier() or col != col.lower()))
                                   for col in spec.schema)
                continue
            e = resolve(inner, earlier)
            if isinstance(it, exp.Alias):
                nm = it.alias.lower()
                earlier[nm] = (e, _size(e))
            elif isinstance(inner, exp.Column):
                nm = inner.name.lower()
            else:
                nm = inner.sql(dialect="duckdb").lower()
            outputs.append((nm, e))
        if columns:
            if len(columns) != len(outputs):
                self.refuse(at, f"{label} names {len(columns)} column(s) but its SELECT gives {len(outputs)}",
                            "name as many columns as the SELECT lists (or alias them in the SELECT)")
            outputs = [(c.name.lower(), e) for c, (_, e) in zip(columns, outputs, strict=True)]
        w = flat.args.get("where")
        where = resolve(w.this, earlier) if w is not None else None
        joins = []
        for j in flat.args.get("joins") or []:
            jj = j.copy()
            if jj.args.get("on") is not None:
                jj.set("on", resolve(jj.args["on"], {}))
            joins.append(jj)
        # every output, used or not, names columns its tables hold and functions of the allow-list over private
        # rows (an unused one is not run, but a mistake in it is no less a mistake)
        for it in flat.expressions:
            if isinstance(it, exp.Star) or (isinstance(it, exp.Column) and isinstance(it.this, exp.Star)):
                continue
            bad = check_expression_functions(it.unalias(), self.sql, label)
            if bad:
                raise UnsupportedQueryError(str(bad[0]), violations=bad[:1])
        for _, e in outputs + ([("", where)] if where is not None else []):
            for c in _own_nodes(e, exp.Column):
                assert isinstance(c, exp.Column)
                spec = specs.get(c.table.lower()) if c.table else None
                if spec is not None and spec.schema and c.name.lower() not in spec.schema and not c.name.lower().endswith("_bin"):
                    self.refuse(c, f"unknown column '{c.name}' in table '{spec.name}' ({label})"
                                   f"{did_you_mean(c.name, spec.schema)}")
        sized = [(n, e, _size(e)) for n, e in outputs]
        for _, e, s in sized:
            if s > MAX_NODES:
                self.count(s, e)
        return _View(name, label, tables, joins, sized, where, _size(where), specs=specs)

    def join_form(self, j: exp.Join, label: str) -> None:
        side = (j.args.get("side") or "").upper()
        kind = (j.args.get("kind") or "").upper()
        if j.args.get("pivots"):  # after the ON: merged without it, the view's join was read as a plain join
            self.refuse(j, f"PIVOT / UNPIVOT in {label} is not supported: it changes each person's contribution", _FLAT)
        if side or j.args.get("using") or j.args.get("method") or kind not in ("", "INNER", "CROSS"):
            what = "JOIN ... USING" if j.args.get("using") else f"{side or kind or j.args.get('method')} JOIN"
            self.refuse(j, f"{what} with {label} is not supported: only inner JOIN ... ON is merged (the view's "
                           "conditions move into WHERE, which an outer join does not allow)",
                        f"{_FLAT}, joining with JOIN ... ON a.x = b.y")

    # -- a query naming views ----------------------------------------------------------------------
    def merge(self, stmt: exp.Select, scope: dict[str, _View], *, expand: bool = False) -> exp.Select:
        with_ = stmt.args.get("with_") or stmt.args.get("with")
        scope = dict(scope)
        local: list[tuple[exp.CTE, _View]] = []
        if isinstance(with_, exp.With):
            if with_.args.get("recursive"):
                self.refuse(with_, "WITH RECURSIVE is not supported: a recursive CTE has no flat form",
                            _FLAT, offset=keyword_offset(self.sql, {"RECURSIVE"}, after=self.select_start(with_, "WITH")))
            names: set[str] = set()
            for cte in with_.expressions:
                name = cte.alias.lower()
                if name in names:
                    self.refuse(cte.args["alias"], f"the CTE name '{cte.alias}' is defined twice", "give each CTE its own name")
                names.add(name)
                inner = {k: v for k, v in scope.items() if k != name}  # in its own body the name is the table's
                alias = cte.args.get("alias")
                cols = list(alias.columns) if isinstance(alias, exp.TableAlias) else []
                v = self.view(cte.this, name, f"the CTE '{cte.alias}'", cols, inner, cte)
                local.append((cte, v))
                scope[name] = v
        from_ = stmt.args.get("from_")
        items: list[exp.Expression] = ([from_.this] if from_ is not None else []) + [j.this for j in stmt.args.get("joins") or []]
        sources = [self.source(t, scope) for t in items]
        # a CTE named only inside a subquery of WHERE, SELECT, ...: that subquery is the problem (refused by the
        # analysis), not the CTE
        elsewhere = {t.name.lower() for t in stmt.find_all(exp.Table) if not any(
            isinstance(a, exp.With) for a in _ancestors(t, stmt))}
        for cte, v in local:
            if not v.used and cte.alias.lower() not in elsewhere:
                self.refuse(cte.args["alias"], f"the CTE '{cte.alias}' is defined but never used (it would be ignored)",
                            "remove it, or select from it")
        if not any(s.view is not None for s in sources):
            if with_ is None:
                return stmt
            out = stmt.copy()
            out.set("with_", None)
            out.set("with", None)
            return out
        for j in stmt.args.get("joins") or []:
            self.join_form(j, next(s.view.label for s in sources if s.view is not None))
        self.count(_size(stmt), stmt)
        return self.inline(stmt, sources, expand)

    def source(self, t: exp.Expression, scope: dict[str, _View]) -> _Source:
        if isinstance(t, exp.Subquery):
            alias = t.args.get("alias")
            name = t.alias.lower() if t.alias else "subquery"
            label = f"the subquery '{t.alias}' in FROM" if t.alias else "a subquery in FROM"
            cols = list(alias.columns) if isinstance(alias, exp.TableAlias) else []
            self.clauses(t, label)
            v = self.view(t.this, name, label, cols, scope, t)
            v.used = True
            return _Source(name, t, v, outputs=v.outputs)
        if (isinstance(t, exp.Table) and isinstance(t.this, exp.Identifier) and not t.args.get("db")
                and not t.args.get("catalog") and t.name.lower() in scope):
            v = scope[t.name.lower()]
            v.used = True
            self.clauses(t, f"the reference to {v.label}")
            alias = t.args.get("alias")
            outputs = v.outputs
            if isinstance(alias, exp.TableAlias) and alias.columns:
                if len(alias.columns) != len(outputs):
                    self.refuse(alias, f"{len(alias.columns)} column alias(es) for {v.label}, which has {len(outputs)} "
                                       "column(s)", "name as many columns as the view has")
                outputs = [(c.name.lower(), e, s) for c, (_, e, s) in zip(alias.columns, outputs, strict=True)]
            return _Source(t.alias_or_name.lower(), t, v, outputs=outputs)
        spec = self.catalog.get(t.name.lower()) if isinstance(t, exp.Table) and isinstance(t.this, exp.Identifier) else None
        return _Source(str(t.alias_or_name).lower(), t, spec=spec)

    def clauses(self, t: exp.Expression, label: str) -> None:
        """Refuse a clause on ``t`` (a view's reference or a subquery in FROM): merged without it, the query would
        be answered as another query (PIVOT, UNPIVOT and TABLESAMPLE were dropped)."""
        for key, val in t.args.items():
            if val and key not in ("this", "alias"):
                self.refuse(t, f"a clause on {label} ({_CLAUSES.get(key, key.upper())}) is not supported: it changes "
                               "which rows it gives", _FLAT)

    def inline(self, stmt: exp.Select, sources: list[_Source], expand: bool) -> exp.Select:
        # the new alias of every table of every view: a one-table view's table takes the reference's alias
        taken = {s.alias for s in sources}
        renames: dict[int, dict[str, str]] = {}
        for i, s in enumerate(sources):
            if s.view is None:
                continue
            if len(s.view.tables) == 1:
                renames[i] = {s.view.tables[0][0]: s.alias}
                continue
            m: dict[str, str] = {}
            for a, _ in s.view.tables:
                new = a if a not in taken else f"{s.alias}_{a}"
                k = 2
                while new in taken:
                    new, k = f"{s.alias}_{a}_{k}", k + 1
                taken.add(new)
                m[a] = new
            renames[i] = m
        by_alias = {s.alias: (i, s) for i, s in enumerate(sources)}
        label = next(s.view.label for s in sources if s.view is not None)
        # every column a merged table holds, for the select-list aliases the merge could capture
        underlying: dict[str, str] = {}
        for s in sources:
            specs = s.view.specs.values() if s.view is not None else [s.spec]
            for spec in specs:
                if spec is not None:
                    for col in spec.schema:
                        underlying.setdefault(col, spec.name)
        out_aliases = {it.alias.lower() for it in stmt.expressions if isinstance(it, exp.Alias)}
        unknown_table = any(s.view is None and s.spec is None for s in sources)

        out = stmt.copy()
        out.set("with_", None)
        out.set("with", None)

        def view_output(c: exp.Column, i: int, s: _Source) -> exp.Expression:
            nm = c.name.lower()
            found = [(e, n) for name, e, n in s.outputs if name == nm]
            assert s.view is not None
            if not found and nm.endswith("_bin") and any(name == nm[:-4] for name, _, _ in s.outputs):
                return view_bins(c, i, s)
            if not found:
                cols = ", ".join(name for name, _, _ in s.outputs)
                self.refuse(c, f"unknown column '{c.name}' in {s.view.label} (its columns: {cols})"
                               f"{did_you_mean(c.name, [name for name, _, _ in s.outputs])}",
                            "a view has only the columns its SELECT lists: add the column there")
            if len(found) > 1:
                self.refuse(c, f"column '{c.name}' of {s.view.label} is ambiguous (its SELECT gives it twice)",
                            "alias the columns of the view's SELECT apart")
            e, n = found[0]
            self.count(n, c)
            return _wrap(_requalify(e, renames[i]))

        def view_bins(c: exp.Column, i: int, s: _Source) -> exp.Expression:
            """``<col>_bin`` of a view: the bins of the table column the view's ``col`` is, if it is one."""
            assert s.view is not None
            base = c.name.lower()[:-4]
            found = [e for name, e, _ in s.outputs if name == base]
            e = _requalify(found[0], renames[i]) if len(found) == 1 else None
            if not isinstance(e, exp.Column) or not e.table:
                self.refuse(c, f"'{c.name}' names the bins of '{base}', which in {s.view.label} is "
                               f"{'given twice' if len(found) > 1 else 'an expression'}, not a column of a table "
                               "(bins are those of a column's declared ordered domain)",
                            "select the column itself in the view, or group by the bins in a query over the table")
            assert isinstance(e, exp.Column)
            return exp.column(f"{e.name}_bin", table=e.table, quoted=e.this.quoted)

        # a bare column of a view in SELECT keeps its output name; in a view's body, * (or v.*) over a view
        # is the view's columns (elsewhere SELECT * is refused by the analysis)
        items: list[exp.Expression] = []
        for it in out.expressions:
            star = it if isinstance(it, exp.Star) else it.this if (
                isinstance(it, exp.Column) and isinstance(it.this, exp.Star)) else None
            if star is not None and expand and not any(star.args.get(k) for k in _STAR_MODIFIERS):
                q = it.table.lower() if isinstance(it, exp.Column) and it.table else None
                for s in sources:
                    if q is not None and s.alias != q:
                        continue
                    names = ([n for n, _, _ in s.outputs] if s.view is not None
                             else list(s.spec.schema) if s.spec is not None else None)
                    if names is None:
                        items.append(it)  # an unregistered table: refused by the analysis
                        break
                    items.extend(exp.Alias(this=exp.column(n, table=s.alias, quoted=True), alias=exp.to_identifier(n, quoted=True))
                                 for n in names)
                continue
            if isinstance(it, exp.Column) and not isinstance(it.this, exp.Star):
                it = stands_for(exp.Alias(this=it, alias=it.this.copy()), it)
            elif star is None and not isinstance(it, exp.Alias) and not expand and _own_nodes(it, exp.Column):
                # an unaliased expression keeps the name the flat query gives it (its text as written)
                name = it.sql(dialect=DIALECT)
                written = written_name(it, self.sql, rendered=name)
                if written and written.lower() != name.split("(", 1)[0].lower():
                    name = written + name[len(name.split("(", 1)[0]):]
                it = stands_for(exp.Alias(this=it, alias=exp.to_identifier(name, quoted=True)), it)
            items.append(it)
        out.set("expressions", items)

        for c in _own_nodes(out, exp.Column):
            assert isinstance(c, exp.Column)
            if c.args.get("db") is not None or c.args.get("catalog") is not None:
                continue
            if c.table:
                hit = by_alias.get(c.table.lower())
                if hit is None:
                    self.refuse(c, f"the query refers to unknown table or alias '{c.table}' (it names {label})",
                                "qualify columns with the alias of a table or view in FROM")
                assert hit is not None
                i, s = hit
                if s.view is None:
                    continue
                if isinstance(c.this, exp.Star):
                    c.replace(stands_for(exp.Star(), c))
                    continue
                c.replace(stands_for(view_output(c, i, s), c))
                continue
            if isinstance(c.this, exp.Star):
                continue
            nm = c.name.lower()
            own = [(i, s) for i, s in enumerate(sources)
                   if (s.view is not None and any(n == nm for n, _, _ in s.outputs))
                   or (s.spec is not None and nm in s.spec.schema)]
            if nm in out_aliases and any(s.view is not None for _, s in own) and _names_an_output(c, out):
                continue  # HAVING / ORDER BY: the output of that name, as in DuckDB and the flat query
            if len(own) > 1:
                self.refuse(c, f"column '{c.name}' is ambiguous: it is a column of "
                               f"{', '.join(repr(s.alias) for _, s in own)}", "qualify it with the alias you mean")
            if own:
                i, s = own[0]
                if s.view is not None:
                    c.replace(stands_for(view_output(c, i, s), c))
                else:
                    _qualify(c, s.alias)
                continue
            if unknown_table:
                continue  # the unregistered table is refused by the analysis
            if nm.endswith("_bin"):  # <col>_bin: the bins of col's declared ordered domain, col as the query names it
                bins = [(i, s) for i, s in enumerate(sources) if s.view is not None and any(
                    n == nm[:-4] for n, _, _ in s.outputs)]
                tables = [s for s in sources if s.spec is not None and nm[:-4] in s.spec.schema]
                if len(bins) == 1 and not tables:
                    c.replace(stands_for(view_bins(c, *bins[0]), c))
                    continue
                if tables and not bins:
                    continue  # a registered table's: the analysis reads its domain
                if len(bins) + len(tables) > 1:
                    self.refuse(c, f"column '{c.name}' is ambiguous: '{nm[:-4]}' is a column of "
                                   f"{', '.join(repr(s.alias) for _, s in bins)}{''.join(', ' + repr(s.alias) for s in tables)}",
                                "qualify it with the alias you mean")
            if nm in out_aliases:
                if isinstance(c.parent, exp.Ordered) and c.parent.parent is out.args.get("order"):
                    continue  # ORDER BY an output's name: the output
                if nm in underlying:
                    self.refuse(c, f"the select-list alias '{c.name}' is also a column of table '{underlying[nm]}', "
                                   f"which {label} reads: merged, the column would be read instead of the alias",
                                "give the select-list alias another name")
                continue
            cols = sorted({n for s in sources for n, _, _ in s.outputs}
                          | {c2 for s in sources if s.spec is not None for c2 in s.spec.schema})
            self.refuse(c, f"unknown column '{c.name}' (the columns of the query's tables and views: "
                           f"{', '.join(cols)}){did_you_mean(c.name, cols)}",
                        "a view has only the columns its SELECT lists: add the column there")

        # FROM / JOIN: each view's tables in its place, its joins after it
        def placed(i: int, s: _Source) -> tuple[exp.Table, list[exp.Join]]:
            assert s.view is not None
            m = renames[i]
            first: exp.Table | None = None
            joins: list[exp.Join] = []
            for k, (a, t) in enumerate(s.view.tables):
                tt = t.copy()
                if m[a] != tt.name.lower() or tt.alias:
                    stands_for(tt, t).set("alias", exp.TableAlias(this=exp.to_identifier(m[a])))
                if k == 0:
                    first = tt
                else:
                    j = s.view.joins[k - 1].copy()
                    j.set("this", tt)
                    if j.args.get("on") is not None:
                        j.set("on", _requalify(j.args["on"], m))
                    joins.append(j)
            assert first is not None
            return first, joins

        new_joins: list[exp.Join] = []
        if sources[0].view is not None:
            first, js = placed(0, sources[0])
            out.args["from_"].set("this", stands_for(first, out.args["from_"].this))
            new_joins.extend(js)
        for k, j in enumerate(out.args.get("joins") or [], 1):
            s = sources[k]
            if s.view is None:
                new_joins.append(j)
                continue
            first, js = placed(k, s)
            j.set("this", stands_for(first, j.this))
            new_joins.append(j)
            new_joins.extend(js)
        out.set("joins", new_joins or None)

        for s in sources:  # counted before any copy is made
            if s.view is not None:
                self.count(s.view.where_size, stmt)
        conds = [_requalify(s.view.where, renames[i]) for i, s in enumerate(sources)
                 if s.view is not None and s.view.where is not None]
        w = out.args.get("where")
        if w is not None:
            conds.append(w.this)
        if conds:
            cond = conds[0] if len(conds) == 1 else exp.and_(*[exp.Paren(this=c) for c in conds], copy=False)
            out.set("where", exp.Where(this=cond))
        return out


def _names_an_output(c: exp.Column, stmt: exp.Select) -> bool:
    """Whether bare ``c`` stands in ``stmt``'s HAVING or ORDER BY outside an aggregate: there a select-list alias
    wins over a column of that name (in SELECT, WHERE and GROUP BY the column wins)."""
    clauses = [stmt.args.get("having"), stmt.args.get("order")]
    for a in _ancestors(c, stmt):
        if is_aggregate(a):
            return False
        if any(a is k for k in clauses if k is not None):
            return True
    return False


def _ancestors(node: exp.Expression, root: exp.Expression) -> list[exp.Expression]:
    out: list[exp.Expression] = []
    p = node.parent
    while p is not None and p is not root:
        out.append(p)
        p = p.parent
    return out


def _start(node: exp.Expression) -> int:
    """The smallest token offset recorded in ``node`` (0 if none)."""
    best = None
    for sub in node.walk():
        meta = getattr(sub, "_meta", None) or {}
        s = meta.get("start") if isinstance(meta, dict) else None
        if isinstance(s, int) and (best is None or s < best):
            best = s
    return best or 0


def merge_views(stmt: exp.Expression, sql: str, catalog: Mapping[str, TableSpec]) -> exp.Expression:
    """``stmt`` with its CTEs and subqueries in FROM merged in (``stmt`` itself when it has none)."""
    if not isinstance(stmt, exp.Select):
        return stmt
    from_ = stmt.args.get("from_")
    items = ([from_.this] if from_ is not None else []) + [j.this for j in stmt.args.get("joins") or []]
    if not (stmt.args.get("with_") or stmt.args.get("with")) and not any(isinstance(t, exp.Subquery) for t in items):
        return stmt
    return _Merger(sql, catalog).merge(stmt, {})
