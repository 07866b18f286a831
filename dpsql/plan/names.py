"""Table names as analysts write them: ``t``, ``schema.t``, ``db.schema.t``.

Peer engines and their users address tables with schema (and database) qualifiers, e.g.
``FROM PUMS.PUMS``. dpsql registers tables under one plain name, unique in the session, so a
qualified name resolves to the registered table named by its last part: that is unambiguous.
What is refused, for free, with the fix:

* a qualifier naming a system schema (``information_schema``, ``pg_catalog``, ...): those are
  the engine's catalog views, never a registered table;
* one query naming the same registered table under two different qualifiers (``a.t JOIN b.t``):
  the analyst expects two tables, there is one, so the query is ambiguous.

Public metadata only (the SQL and the catalog's names).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlglot import exp

#: qualifiers that name the engine's own catalogs, never a registered table
SYSTEM_SCHEMAS = frozenset({"information_schema", "pg_catalog", "system", "temp", "duckdb_catalog"})


def qualifier(tbl: exp.Expression) -> str:
    """The schema qualifier of a table reference (``db.schema``, lower case; '' if none)."""
    parts = [str(tbl.args[k].name) for k in ("catalog", "db") if tbl.args.get(k) is not None]
    return ".".join(p.lower() for p in parts if p)


def qualifier_problem(tbl: exp.Table) -> str | None:
    """Why a table reference's qualifier cannot name a registered table (None if it can)."""
    parts = [str(tbl.args[k].name).lower() for k in ("catalog", "db") if tbl.args.get(k) is not None]
    system = [p for p in parts if p in SYSTEM_SCHEMAS]
    if system:
        return (f"'{tbl.sql(dialect='duckdb')}' is in the system schema '{system[0]}': schema-qualified names resolve only to "
                "registered tables; use the registered table name")
    return None


def ambiguity_problem(refs: list[tuple[str, str]]) -> str | None:
    """``refs``: (registered name, qualifier) of every table reference of one query. The same
    registered table under two different qualifiers is ambiguous."""
    seen: dict[str, str] = {}
    for name, q in refs:
        if name in seen and seen[name] != q:
            a = f"{seen[name]}.{name}" if seen[name] else name
            b = f"{q}.{name}" if q else name
            return (f"'{a}' and '{b}' both name the registered table '{name}' (dpsql registers each table under one name, "
                    "whatever its schema): the query is ambiguous; write the same name for both, with a table alias for each use")
        seen[name] = q
    return None


def alias_order_hint(name: str, items: list[exp.Expression], at: int) -> str:
    """The fix for output ``at`` of the select list ``items`` naming ``name``, the alias of a later output (or its
    own), which DuckDB does not see there either (``n * 2 AS twice, COUNT(*) AS n``): ``"; 'n' is the alias of a later
    output (...) ..."``, else ``""``. The SQL only."""
    own = items[at] if 0 <= at < len(items) else None
    if isinstance(own, exp.Alias) and own.alias.lower() == name.lower():
        return (f"; '{name}' is this output's own alias ({own.sql(dialect='duckdb')}), which it cannot name (hint: "
                "write the expression of columns or aggregates it stands for)")
    later = next((it for it in items[at + 1:] if isinstance(it, exp.Alias) and it.alias.lower() == name.lower()), None)
    if later is None:
        return ""
    return (f"; '{name}' is the alias of a later output ({later.sql(dialect='duckdb')}): an output names only the "
            f"aliases of the outputs before it, as in DuckDB (hint: move it before this output, or write "
            f"{later.this.sql(dialect='duckdb')} here)")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` when a registered name (public: a table or column of the catalog) is
    close to the mistyped ``name`` (case ignored), else ``""``. Used in the messages of unknown
    tables and columns."""
    import difflib

    cands = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(cands), n=1, cutoff=0.75)
    if not close:
        return ""
    best = cands[close[0]]
    plain = best.replace("_", "a").isalnum() and best.isascii() and not best[0].isdigit()
    return f"; did you mean '{best}'?" if plain else f"; did you mean \"{best}\" (quoted)?"


#: a select-list alias written out where it is named (WHERE, GROUP BY, a later output) may hold at most this
#: many expression nodes
MAX_SPELLED = 20_000


def _size(node: exp.Expression) -> int:
    n = 0
    for n, _ in enumerate(node.walk(), 1):
        if n > MAX_SPELLED:
            break
    return n


def _in_aggregate(c: exp.Expression) -> bool:
    """``c`` is inside an aggregate's argument: not only inside a window's function (``LAG(k) OVER (...)``, ``SUM(k)
    OVER ()``), which reads the released rows, where an alias names an output."""
    p = c.parent
    while p is not None:
        if isinstance(p, exp.AggFunc) and not (isinstance(p.parent, exp.Window) and p.arg_key == "this"):
            return True
        p = p.parent
    return False


def spell_aliases(node: exp.Expression, by_alias: Mapping[str, exp.Expression], *,
                  in_aggregates: bool = True) -> exp.Expression:
    """A copy of ``node`` with each unqualified column named in ``by_alias`` (select-list aliases) replaced
    by its expression, parenthesised where an operator's precedence could otherwise change its meaning
    (``in_aggregates=False``: not inside an aggregate, which reads the table's columns)."""
    if not by_alias:
        return node.copy()
    out = node.copy()
    total, sizes = _size(out), dict[str, int]()
    for c in list(out.find_all(exp.Column)):
        if c.table or c.name.lower() not in by_alias:
            continue
        if not in_aggregates and _in_aggregate(c):
            continue
        aliased = by_alias[c.name.lower()]
        total += sizes.setdefault(c.name.lower(), _size(aliased))
        if total > MAX_SPELLED:  # each alias naming the previous one twice doubles it: refused before it is copied
            from dpsql.errors import UnsupportedQueryError

            raise UnsupportedQueryError(
                f"the select-list aliases written out (an alias names the expression of an earlier one) would hold "
                f"more than {MAX_SPELLED} expression nodes", hint="write the expressions with fewer references to "
                "earlier aliases")
        e = aliased.copy()
        operator = isinstance(e, (exp.Binary, exp.Unary, exp.Predicate, exp.Connector)) and not isinstance(e, exp.Paren)
        new = exp.Paren(this=e) if operator else e
        if c is out:
            return new
        c.replace(new)
    return out


def field_problem(col: exp.Column, where: str, schema: Mapping[str, str], owners: Iterable[str]) -> str | None:
    """``nest.x`` / ``t.nest.x``: a field of the column ``nest`` (DuckDB's struct field access), when ``nest`` is a
    column of ``schema`` and the qualifier before it, if any, one of ``owners`` (its table's names): the refusal,
    naming the column and its type, instead of an unknown table or alias ``nest``."""
    part = col.table.lower()
    owner = str(col.args["db"].name).lower() if col.args.get("db") is not None else ""
    if part not in schema or (owner and owner not in owners) or col.args.get("catalog") is not None:
        return None
    return (f"{where} reads field '{col.name}' of the {schema[part]} column '{col.table}': fields of a column are not "
            "supported (a STRUCT allows only IS [NOT] NULL); store the field as a column of its own")
