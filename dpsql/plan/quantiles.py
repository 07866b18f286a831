"""Quantile aggregates as analysts write them: which column and which p (public SQL text only).

Accepted spellings (all over a plain numeric column with declared bounds, or a DATE / TIMESTAMP
column with a declared ordered domain: bounds with ``bins`` or ``bin_width``, :func:`time_column_problem`):

* ``MIN(col)``, ``MAX(col)``: order statistics near the ends (``mechanisms.quantile``);
* ``MEDIAN(col)``: p = 0.5;
* ``QUANTILE(col, p)``, ``QUANTILE_CONT(col, p)``, ``QUANTILE_DISC(col, p)``,
  ``APPROX_QUANTILE(col, p)``, ``PERCENTILE_CONT(col, p)``, ``PERCENTILE_DISC(col, p)``;
* ``PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY col [ASC|DESC])`` (and ``PERCENTILE_DISC``):
  ``DESC`` asks for the (1 - p)-quantile in ascending order.

The continuous and discrete variants are answered alike: the release is a point of a public grid
over the declared bounds (``mechanisms.quantile``), so the distinction between interpolating and
picking a data value does not survive (no data value is ever released as such).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.plan import ir
from dpsql.plan.typer import parse_type

if TYPE_CHECKING:
    from dpsql.catalog import TableSpec

#: aggregate classes that ask for a quantile (``exp.ApproxQuantile`` is a ``exp.Quantile``)
QUANTILE_AGGS: tuple[type[exp.Expression], ...] = (
    exp.Min, exp.Max, exp.Median, exp.Quantile, exp.PercentileCont, exp.PercentileDisc,
)

_FIX = "write e.g. MEDIAN(col), QUANTILE(col, 0.9) or PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY col)"


_LIST = "one quantile per call is supported"


def _separate(p: exp.Expression | None, call: Callable[[str], str]) -> str | None:
    """For a list of fractions ``p``: the message naming the same quantiles as separate calls (``call(fraction)``
    spells one), each a released value of one query; None for anything else."""
    if not isinstance(p, exp.Array):
        return None
    calls = ", ".join(call(e.sql(dialect="duckdb")) for e in p.expressions[:16])
    return (f"{_LIST}, not a list of fractions (DuckDB's answer would be one list value): write the quantiles as "
            f"separate aggregates, {calls}{', ...' if len(p.expressions) > 16 else ''}, each released as its own column "
            "(one query, the budget split between them)")


def _fraction(node: exp.Expression | None) -> float | str:
    """A literal p in [0, 1], or why not."""
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        p0 = _fraction(node.this)
        if isinstance(p0, str) or p0 == 0.0:  # not a number, or -0 (which is 0)
            return p0
        return f"the quantile fraction must lie between 0 and 1, got -{node.this.this}"
    if isinstance(node, exp.Array):
        return _LIST
    if not isinstance(node, exp.Literal) or node.is_string:
        return f"the quantile fraction must be a numeric literal between 0 and 1; {_FIX}"
    try:
        p = float(node.this)
    except ValueError:
        return f"the quantile fraction must be a numeric literal between 0 and 1; {_FIX}"
    if not 0.0 <= p <= 1.0:
        return f"the quantile fraction must lie between 0 and 1, got {node.this}"
    return p


def quantile_call(node: exp.Expression) -> tuple[str, exp.Expression, float] | str:
    """(kind, column expression, p) of a quantile aggregate, or a message naming the problem."""
    if isinstance(node, exp.WithinGroup):
        inner, order = node.this, node.expression
        if not isinstance(inner, (exp.PercentileCont, exp.PercentileDisc)) or inner.args.get("expression") is not None:
            return f"WITHIN GROUP is supported with PERCENTILE_CONT(p) or PERCENTILE_DISC(p) only; {_FIX}"
        items = order.expressions if isinstance(order, exp.Order) else []
        if len(items) != 1 or not isinstance(items[0], exp.Ordered):
            return f"WITHIN GROUP needs exactly one ORDER BY column; {_FIX}"
        p = _fraction(inner.this)
        col = items[0].this
        if p == _LIST:
            name = "percentile_cont" if isinstance(inner, exp.PercentileCont) else "percentile_disc"
            order = items[0].sql(dialect="duckdb")
            return _separate(inner.this, lambda f: f"{name}({f}) WITHIN GROUP (ORDER BY {order})") or _LIST
        if isinstance(p, str):
            return p
        return ir.QUANTILE, col, round(1.0 - p, 12) if items[0].args.get("desc") else p
    if isinstance(node, (exp.Min, exp.Max)):
        if node.expressions or node.args.get("count") is not None:  # MIN(x, n): DuckDB's n smallest values
            return f"{node.sql_name()} takes one column (for the least/greatest of several values use LEAST/GREATEST)"
        kind = ir.MIN if isinstance(node, exp.Min) else ir.MAX
        return kind, node.this, 0.0 if kind == ir.MIN else 1.0
    if isinstance(node, exp.Median):
        return ir.QUANTILE, node.this, 0.5
    if isinstance(node, exp.Quantile):
        p = _fraction(node.args.get("quantile"))
        if p == _LIST:
            name = "approx_quantile" if isinstance(node, exp.ApproxQuantile) else "quantile"
            col = node.this.sql(dialect="duckdb")
            return _separate(node.args.get("quantile"), lambda f: f"{name}({col}, {f})") or _LIST
        return p if isinstance(p, str) else (ir.QUANTILE, node.this, p)
    if isinstance(node, (exp.PercentileCont, exp.PercentileDisc)):
        if node.args.get("expression") is None:
            return f"{node.sql_name()}(p) needs WITHIN GROUP (ORDER BY col); {_FIX}"
        p = _fraction(node.args.get("expression"))
        if p == _LIST:
            name = "quantile_cont" if isinstance(node, exp.PercentileCont) else "quantile_disc"
            col = node.this.sql(dialect="duckdb")
            return _separate(node.args.get("expression"), lambda f: f"{name}({col}, {f})") or _LIST
        return p if isinstance(p, str) else (ir.QUANTILE, node.this, p)
    return f"unsupported quantile aggregate; {_FIX}"


def time_column_problem(table: TableSpec, column: str, fn: str) -> str | None:
    """None if ``fn`` (MIN, MAX, a quantile) may read the DATE / TIMESTAMP ``column``; else why not,
    with the fix (public metadata only: refused before any charge).

    The candidates are the points of the column's declared ordered domain (``bounds`` with
    ``bins`` or ``bin_width``, ``mechanisms.quantile.value_grid``); a DATE column's bounds must be
    dates (midnights), as its values and the released points are."""
    t = parse_type(table.schema.get(column, ""))
    assert t.kind in ("date", "timestamp")
    fix = (f"register the column with e.g. columns={{'{column}': {{'bounds': ['2019-01-01', '2021-01-01'], "
           f"'bin_width': '1 day'}}}}: the released value is a point of that grid")
    o = table.column(column).ordered
    if o is None or o.kind == "numeric":
        what = "numeric bounds only" if o is not None or table.column(column).bounds is not None else "none"
        return (f"{fn}({column}) over a {t} column needs its date bounds and grid declared (bounds with bins or "
                f"bin_width); table '{table.name}' declares {what} for '{column}' (hint: {fix})")
    if t.kind == "date":
        for v in (o.lo, o.hi):
            x = dt.datetime.fromisoformat(str(v))
            if x != dt.datetime(x.year, x.month, x.day):
                return (f"{fn}({column}): '{column}' is DATE, but its declared bounds ({o.lo}, {o.hi}) are not whole "
                        f"days (hint: declare its bounds as dates, e.g. ['2019-01-01', '2021-01-01'])")
    return None
