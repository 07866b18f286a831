"""GROUP BY keys of a join query, over public key sets only. Pure: reads the catalog and the SQL.

A join answers GROUP BY with one released row per key of a *public* key set (every key released,
zero groups included), so which keys exist never depends on private rows. Supported keys (one or
several; the key set is their product):

* ``public`` -- a plain column of a public table of the join (``n.n_name`` with ``nation``
  registered ``public=True``). Its key set is that table's distinct values after the
  WHERE conjuncts over that table alone (public data, read in the query itself), NULL included
  when the table holds one (SQL's NULL group of the lookup's NULLs);
* ``declared`` -- a plain column with a declared ``domain`` (``columns={'c_mktsegment':
  {'domain': [...]}}``), of any table of the join;
* ``year`` -- ``year(col)``, ``extract(year FROM col)`` or ``date_part('year', col)`` of a DATE or
  TIMESTAMP column with a declared ordered range (``columns={'l_shipdate': {'bounds':
  ('1992-01-01', '1998-12-31'), 'bin_width': '1 day'}}``): the keys are the years from the
  range's first to its last.

Join tuples whose key lies outside the key set (a value missing from a declared domain, a date
outside the declared range) are not counted: a per-tuple filter on the tuple's own values.

* ``private`` -- a plain column of a private table with no declared domain: no public key set. Answered
  only when the join is a lookup join (one private table, public lookups on their keys:
  ``dpsql.mechanisms.lookup``), by the sparse histogram over the joined rows; otherwise refused at routing
  with the PolicyError the key carries (``JoinKey.refusal``).

Any other key is refused with a PolicyError naming the declaration that would make it answerable.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from sqlglot import exp

from dpsql.catalog import TableSpec
from dpsql.plan import ir
from dpsql.plan.parse import quoted
from dpsql.plan.typer import TEMPORAL_ARG

#: the most key combinations a grouped join releases (one noisy value each)
MAX_GROUPS = 100_000


def _year_arg(node: exp.Expression) -> exp.Expression | None:
    if isinstance(node, exp.Year):
        return node.this
    if isinstance(node, exp.Extract) and isinstance(node.this, (exp.Var, exp.Identifier)) and node.this.name.lower() == "year":
        return node.expression
    if (isinstance(node, exp.Anonymous) and str(node.this).lower() in ("date_part", "datepart")
            and len(node.expressions) == 2 and isinstance(node.expressions[0], exp.Literal)
            and node.expressions[0].is_string and node.expressions[0].this.lower() == "year"):
        return node.expressions[1]
    return None


def _year_of(v: Any) -> int | None:
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.year
    if isinstance(v, str):
        try:
            return datetime.date.fromisoformat(v[:10]).year
        except ValueError:
            return None
    return None


def group_keys(
    stmt: exp.Select,
    inputs: list[tuple[str, TableSpec]],
    resolve: Callable[[exp.Column, str], str | None],
    bad: Callable[[exp.Expression, str], None],
    policy: Callable[[exp.Expression, str], None],
    private: Callable[[exp.Expression, str], Any] | None = None,
) -> list[ir.JoinKey]:
    """The keys of ``stmt``'s GROUP BY (unsupported shapes reported through ``bad``, keys without a
    public key set through ``policy``: the fix is the owner's declaration). A plain column of a private table
    with no declared domain: through ``policy`` too, or, given ``private``, a key of kind ``private`` holding
    ``private``'s answer as its ``refusal`` (the router refuses it unless the join is a lookup join)."""
    group = stmt.args.get("group")
    if group is None:
        return []
    for key in ("grouping_sets", "cube", "rollup"):
        if group.args.get(key):
            bad(group, f"GROUP BY ... WITH {key.upper().replace('_', ' ')} is not supported: it releases "
                "several groupings of the same rows (hint: send one GROUP BY query per grouping)")
    aliases = {it.alias.lower(): it.unalias() for it in stmt.expressions if isinstance(it, exp.Alias)}
    tables = dict(inputs)
    keys: list[ir.JoinKey] = []
    written = list(group.expressions)
    if group.args.get("all"):
        # DuckDB's GROUP BY ALL: every output without an aggregate that reads a column (not only earlier
        # outputs' aliases, as n * 2 AS n2 for COUNT(*) AS n), i.e. GROUP BY their positions
        agg_aliases = {a for a, e in aliases.items() if any(True for _ in e.find_all(exp.AggFunc))}
        written[:0] = [exp.Literal.number(i + 1) for i, it in enumerate(stmt.expressions)
                       if not any(True for _ in it.find_all(exp.AggFunc))
                       and any(c.table or c.name.lower() not in agg_aliases for c in it.find_all(exp.Column))]
    for g in written:
        if isinstance(g, exp.Column) and not g.table and g.name.lower() in aliases:
            g = aliases[g.name.lower()]
        elif isinstance(g, exp.Literal) and not g.is_string and g.this.isdigit():  # GROUP BY 1: a select-list position
            n = int(g.this)
            if not 1 <= n <= len(stmt.expressions):
                bad(g, f"GROUP BY {n}: the select list has {len(stmt.expressions)} item(s)")
                continue
            g = stmt.expressions[n - 1].unalias()
        if any(True for _ in g.find_all(exp.AggFunc)):
            bad(g, "aggregates are not allowed in GROUP BY")
            continue
        found = _key(g, tables, resolve, bad, policy, len(keys), private)
        if found is not None and all(k.sql != found.sql for k in keys):
            keys.append(found)
    size = 1
    for k in keys:
        size *= len(k.domain) if k.domain is not None else 1
    if size > MAX_GROUPS:
        bad(group, f"the GROUP BY keys have {size} combinations; a grouped join releases at most {MAX_GROUPS} groups "
                   "(hint: group by fewer or coarser keys)")
    return keys


def _key(g: exp.Expression, tables: Mapping[str, TableSpec], resolve: Callable[[exp.Column, str], str | None],
         bad: Callable[[exp.Expression, str], None], policy: Callable[[exp.Expression, str], None],
         i: int, private: Callable[[exp.Expression, str], Any] | None = None) -> ir.JoinKey | None:
    name = f"__k{i}"
    inner = _year_arg(g)
    col = inner if inner is not None else g
    if not isinstance(col, exp.Column):
        bad(g, f"GROUP BY {quoted(g)}: over joins a key must be a column of a public table, a column with a "
               "declared domain, or year(col) of a date column with a declared range (hint: group by such a column, or "
               "declare columns={'<col>': {'domain': [...]}} on its table)")
        return None
    f = resolve(col, "GROUP BY")
    if f is None:
        return None
    alias, _, column = f.partition("__")
    t = tables[alias]
    typ = t.schema.get(column, "VARCHAR")
    spec = t.column(column)
    where = f"{alias}.{column}"
    if inner is not None:
        o = spec.ordered
        if o is None or o.kind not in ("date", "timestamp"):
            policy(g, f"GROUP BY {quoted(g)}: the years of '{t.name}.{column}' are not a public key set: the "
                   "column has no declared date range (hint: declare columns={'" + column + "': {'bounds': "
                   "('1992-01-01', '1998-12-31'), 'bin_width': '1 day'}} on table " + repr(t.name) + ")")
            return None
        y0, y1 = _year_of(o.lo), _year_of(o.hi)
        if y0 is None or y1 is None:  # pragma: no cover - the catalog validates ordered date ranges
            bad(g, f"the declared range of '{t.name}.{column}' has no readable years")
            return None
        expr = exp.func("year", exp.column(f, quoted=False))
        expr.meta[TEMPORAL_ARG] = o.kind  # the argument's kind, for engines that spell date parts by it (Spark)
        return ir.JoinKey(name, expr, f"year({where})", "year", alias, column, "BIGINT", tuple(range(y0, y1 + 1)))
    if spec.domain is not None:
        return ir.JoinKey(name, exp.column(f, quoted=False), where, "declared", alias, column, typ, tuple(spec.domain))
    if t.public:
        return ir.JoinKey(name, exp.column(f, quoted=False), where, "public", alias, column, typ, None)
    # no public key set: refused at routing unless the join is a lookup join (dpsql.mechanisms.registry), whose
    # joined rows are the private table's own and whose keys the sparse histogram releases above a noisy threshold
    msg = (f"GROUP BY {quoted(col)}: '{t.name}.{column}' is neither a column of a public table nor declared "
           f"public, so its keys would reveal private values (hint: declare columns={{'{column}': {{'domain': [...]}}}} on "
           f"table '{t.name}', or join a public table and group by its column)")
    if private is None:
        policy(g, msg)
        return None
    return ir.JoinKey(name, exp.column(f, quoted=False), where, "private", alias, column, typ, None, private(g, msg))


def key_outputs(node: exp.Expression, keys: list[ir.JoinKey], flatten: Callable[[exp.Expression], exp.Expression],
                aggregates: Mapping[str, exp.Expression] | None = None) -> exp.Expression:
    """A SELECT item over internal names: aggregates -> their released values (``aggregates``: by the
    call's lower-case SQL, e.g. ``__a1``, or AVG's quotient of two; default ``__a0``), key expressions
    -> ``__k<i>``. The caller makes sure every aggregate call is in ``aggregates``."""
    by_sql = {k.expr.sql(dialect="duckdb"): k.name for k in keys}

    def swap(x: exp.Expression) -> exp.Expression:
        if isinstance(x, exp.AggFunc):
            if aggregates is None:
                return exp.column("__a0")
            return aggregates[x.sql(dialect="duckdb").lower()].copy()
        if isinstance(x, (exp.Column, exp.Year, exp.Extract, exp.Anonymous)):
            year = _year_arg(x)  # (extract(year FROM d), date_part('year', d): the key year(d), as :func:`_key` reads it)
            s = flatten(x if year is None else exp.func("year", year.copy())).sql(dialect="duckdb")
            if s in by_sql:
                return exp.column(by_sql[s])
        return x

    return node.copy().transform(swap)
