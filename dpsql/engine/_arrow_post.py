"""Post-processing that only renames released columns and orders the rows, done in Arrow.

Most queries' post-processing (``dpsql.postprocess.post_ast``) is ``SELECT __k0 AS "country", __a0
AS "n" FROM __released ORDER BY __k0``: released columns under the analyst's names, in the order
of the keys. Run in DuckDB it costs a registration, a bind, a run and an Arrow conversion (about
2.5 ms of a query's ~3 ms of post-processing at 1M rows); :func:`projection` gives the same
table from Arrow directly, and returns None for any other query (the caller then runs DuckDB).

The same table means: the same column names and Arrow types, the same values bit for bit, and
the same row order. So it is taken only where that holds by construction, on the engine's own
connection (DuckDB's defaults: ``ASC``/``DESC`` put NULLs last; a caller's connection may set
another ``default_null_order``):

* the query is a SELECT of bare, unqualified columns of the table, each under a distinct alias
  (not empty, no NUL character: DuckDB refuses the one and cuts the other), with at most an ORDER BY (no WHERE, LIMIT, OFFSET, DISTINCT, CTE, ...), over the table alone;
* every column's Arrow type is one DuckDB gives back unchanged (integers, floats, booleans, UTF-8
  text), and every ORDER BY column is an integer, boolean or text column: DuckDB orders text with
  ``COLLATE "binary"`` (the post-processing reads released text so), byte by byte, as Arrow's sort
  does; floats (NaN, -0.0) are left to DuckDB;
* no ORDER BY column shares its name (case-insensitively, as SQL names are) with an alias of
  another column (ORDER BY would name the output), and a table of more than one row has an
  ORDER BY (without one DuckDB's row order is its own).

``tests/test_arrow_post.py`` compares both paths on generated tables.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

#: the query's parts the fast path understands (any other part set: DuckDB runs it)
_PARTS = frozenset({"expressions", "from_", "order"})


def _kept(t: pa.DataType) -> bool:
    """Arrow types DuckDB reads and gives back as the same type and values."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)


def _ordered(t: pa.DataType) -> bool:
    """Arrow types whose sort order is DuckDB's (text: byte order, as ``COLLATE "binary"``)."""
    return pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t)


def _bare(e: exp.Expression, names: set[str]) -> str | None:
    """The table column ``e`` names, if it is an unqualified column of the table."""
    if isinstance(e, exp.Column) and set(k for k, v in e.args.items() if v) == {"this"} and e.name in names:
        return e.name
    return None


def projection(table: pa.Table, query: exp.Expression, relation: str) -> pa.Table | None:
    """``query`` (over ``relation``, bound to ``table``) run in Arrow, or None where it is not a
    plain projection in key order (module docstring)."""
    if not isinstance(query, exp.Select) or not {k for k, v in query.args.items() if v} <= _PARTS:
        return None
    source = query.args.get("from_")
    if not isinstance(source, exp.From) or not isinstance(source.this, exp.Table):
        return None
    if {k for k, v in source.this.args.items() if v} != {"this"} or source.this.name != relation:
        return None
    names = set(table.column_names)
    if len({n.lower() for n in names}) != len(names):
        return None
    types = {f.name: f.type for f in table.schema}
    outputs: list[tuple[str, str]] = []  # (alias, column)
    for item in query.expressions:
        col = _bare(item.this, names) if isinstance(item, exp.Alias) else None
        if col is None or not _kept(types[col]) or not item.alias or "\x00" in item.alias:
            return None  # (DuckDB refuses an empty name and cuts one at a NUL)
        outputs.append((item.alias, col))
    aliases = {alias.lower(): col for alias, col in outputs}
    if len(aliases) != len(outputs):
        return None
    keys: list[tuple[str, str]] = []
    order = query.args.get("order")
    for o in order.expressions if order is not None else []:
        col = _bare(o.this, names) if isinstance(o, exp.Ordered) else None
        if col is None or o.args.get("nulls_first") or not _ordered(types[col]):
            return None
        if aliases.get(col.lower(), col) != col:
            return None
        keys.append((col, "descending" if o.args.get("desc") else "ascending"))
    if not keys and table.num_rows > 1:
        return None
    if keys:
        table = table.take(pc.sort_indices(table, sort_keys=keys))  # NULLs (and NaNs) last: Arrow's default
    schema = pa.schema([pa.field(alias, types[col]) for alias, col in outputs])
    return pa.Table.from_arrays([table.column(col) for _, col in outputs], schema=schema)
