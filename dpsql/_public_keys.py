"""The declarations a join relies on about a public table, checked on its rows before the charge.

A join assumes that a row joined to a public table through a declared key (the target of a reference: at most one
row per value) matches at most one of its rows, and at most ``degree_bounds[c]`` rows through a column ``c`` of it
with a degree bound: the lookup route's one-table caps and DP-S4S's Delta are computed from these declarations
(``dpsql.plan.joins.max_rows_per_value``). Only the enforced plans cap the public rows in the bounded query; a plan
whose Delta is attested (tuples of several people) reads every public row, so a duplicated key multiplied one
person's tuples past Delta (the sampled DP-S4S's privacy claim) and every answer. A public table holds no person:
its rows may be read, and quoted, before the charge. So every declaration of a public input that the request's join
relies on (a key or bounded column whose every part the join's ON equalities name) is checked on the public rows,
through ``dpsql.engine.PublicReads`` (which refuses any other table), and a violation is a ConfigError naming the
table, the column, the most repeated values and the fix; nothing is charged. Private inputs are never read here.

Values are compared as the join compares them: text under the binary collation, rows with a NULL part excluded
(an equality with NULL holds for no row, so NULL key values are allowed, any number of them). A pass is remembered
per table, column set and bound while the source is unchanged: the registration (the frozen ``TableSpec``) and, for
Parquet and CSV files, each file's identity, size and modification and change times (a file rewritten in place is
checked again); a table of the caller's DuckDB connection may change at any time and is checked at every request.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sqlglot import exp

from dpsql.catalog import TableSpec
from dpsql.errors import ConfigError
from dpsql.plan import ir
from dpsql.rewrite.bound import binary_text

#: how many offending values a message quotes (public values, each cut to :data:`_QUOTED` characters)
_SHOWN = 3
_QUOTED = 40


def _declared(table: TableSpec, catalog: Mapping[str, TableSpec]) -> list[tuple[str, int, bool]]:
    """(column or 'a,b', the most rows per value, whether a key) of every declaration on ``table``: its keys, then
    its degree bounds on other columns."""
    from dpsql.plan.joins import table_keys  # (joins only: a large module)
    keys = sorted(table_keys(table, catalog))
    return [(k, 1, True) for k in keys] + [(c, int(n), False) for c, n in sorted(table.degree_bounds.items())
                                            if c not in keys]


def _unchanged_token(table: TableSpec) -> Any:
    """What a remembered pass over ``table`` is valid for; None: check at every request."""
    if table.source_kind == "arrow":
        return ()  # a pyarrow.Table never changes: the registration (compared by identity) suffices
    if table.source_kind not in ("parquet", "csv") or not table.files:
        return None
    try:
        return tuple((os.path.realpath(f), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns)
                     for f in table.files for st in [os.stat(f)])
    except OSError:
        return None


def _violations(table: TableSpec, column: str, most: int, engine: Any) -> tuple[int, list[tuple[str, int]]]:
    """How many values of ``column`` are held by more than ``most`` rows of ``table``, and the first few (quoted,
    with their row counts), read from the public rows only."""
    from dpsql.plan.joins import parts  # (joins only: a large module)
    cols = parts(column)
    keys = [exp.alias_(binary_text(exp.column(c, quoted=True), table.schema.get(c, "")), f"__k{i}")
            for i, c in enumerate(cols)]
    n = exp.func("count", exp.Star())
    grouped = (exp.select(*keys, exp.alias_(n, "__n")).from_(exp.to_table(table.view or "", quoted=True))
               .where(exp.and_(*[exp.Not(this=exp.Is(this=exp.column(c, quoted=True), expression=exp.Null()))
                                 for c in cols]))
               .group_by(*[exp.column(f"__k{i}") for i in range(len(cols))])
               .having(exp.GT(this=n.copy(), expression=exp.Literal.number(most))))
    order = exp.Order(expressions=[exp.Ordered(this=exp.column("__n"), desc=True),
                                   *[exp.Ordered(this=exp.column(f"__k{i}")) for i in range(len(cols))]])
    ranked = exp.select("*", exp.alias_(exp.Window(this=exp.RowNumber(), order=order), "__r"),
                        exp.alias_(exp.Window(this=exp.func("count", exp.Star())), "__v")).from_(grouped.subquery("__g"))
    # the first few by a window, not LIMIT (which the Spark engine refuses): the same rows on every engine
    q = exp.select("*").from_(ranked.subquery("__o")).where(exp.LTE(this=exp.column("__r"),
                                                                    expression=exp.Literal.number(_SHOWN)))
    rows = sorted(engine.fetch_arrow(q, what=f"the check of public table '{table.name}'").to_pylist(),
                  key=lambda r: r["__r"])
    if not rows:
        return 0, []

    def quoted(v: Any) -> str:
        s = repr(v) if isinstance(v, (str, bytes)) else str(v)
        return s if len(s) <= _QUOTED else s[:_QUOTED] + "..."

    shown = [(", ".join(quoted(r[f"__k{i}"]) for i in range(len(cols))), int(r["__n"])) for r in rows]
    return int(rows[0]["__v"]), shown


def _declared_by(table: TableSpec, column: str, catalog: Mapping[str, TableSpec]) -> list[str]:
    return sorted(f"the reference {t.name}.{fk} -> {target}" for t in catalog.values()
                  for fk, target in t.references.items() if target == f"{table.name}.{column}")


def check(plan: ir.QueryPlan | None, catalog: Mapping[str, TableSpec], engine: Any,
          passed: dict[tuple[str, str, int], tuple[TableSpec, Any]]) -> None:
    """Refuse (ConfigError, free) a join relying on a declared key or degree bound that a public input's rows break
    (module docstring). ``engine``: ``dpsql.engine.PublicReads``; ``passed``: the session's remembered passes."""
    jp = plan.join if plan is not None else None
    if jp is None:
        return
    from dpsql.plan.joins import SEP, parts  # (joins only: a large module)
    for alias, name in dict(jp.inputs).items():
        table = catalog[name]
        if not table.public:  # a person's rows: never read before the charge
            continue
        joined = {c.split(SEP, 1)[1] for pair in jp.conditions for c in pair if c.split(SEP, 1)[0] == alias}
        for column, most, key in _declared(table, catalog):
            if not set(parts(column)) <= joined:
                continue  # the join does not enter the table through it: nothing relies on it here
            token = _unchanged_token(table)
            seen = passed.get((name, column, most))
            if token is not None and seen is not None and seen[0] is table and seen[1] == token:
                continue
            count, shown = _violations(table, column, most, engine)
            if not count:
                if token is not None:
                    passed[(name, column, most)] = (table, token)
                continue
            what = ", ".join(f"{v} in {n} rows" for v, n in shown) + (f" (and {count - len(shown)} more value(s))"
                                                                       if count > len(shown) else "")
            col = column.replace(",", ", ")
            if key:
                why = (f"declared a key of '{name}' by " + ", ".join(_declared_by(table, column, catalog))
                       + ", which joins rely on to match at most one of its rows")
                fix = (f"deduplicate '{name}' on {col} (one row per value), or declare the right key: reference a "
                       f"column of '{name}' that holds each value once (a column with several rows per value is "
                       f"declared by degree_bounds on '{name}' instead: docs/sql.md, Joins)")
            else:
                why = f"its degree_bounds declare at most {most} row(s) per value, which joins rely on"
                fix = (f"deduplicate '{name}' on {col}, or register '{name}' again with the right bound "
                       f"(degree_bounds={{'{column}': {max(n for _, n in shown)}}})")
            held = f"its columns '{col}' hold" if "," in column else f"its column '{col}' holds"
            raise ConfigError(f"public table '{name}': {held} {what}: {why}; nothing was charged", hint=fix)
