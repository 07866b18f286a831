"""Value bounds of an aggregate's argument, from public metadata only.

``SUM(expr)`` / ``AVG(expr)`` / ``VARIANCE(expr)`` need bounds [lo, hi] on the value each row
adds. They come from one of two places:

* an explicit clamp in the query with literal bounds, ``LEAST(GREATEST(expr, lo), hi)`` or
  ``GREATEST(LEAST(expr, hi), lo)`` (:func:`clamp_bounds`; the join analysis uses the same
  recogniser);
* interval arithmetic over the declared bounds of the columns it reads (:func:`interval`):
  sound for ``+``, ``-``, unary ``-``, ``*``, numeric literals, parentheses, ``CASE`` (the hull of
  its branch values: conditions need no bounds), ``ABS``, ``LEAST``/``GREATEST``, ``COALESCE``
  (hull of its arguments), and division by a literal non-zero constant. Anything else (division
  by a column, functions with no interval rule, text) is refused with the clamp as the fix.

NULL: a row whose value is NULL (a NULL column, a CASE with no matching branch and no ELSE)
adds nothing to SUM and is not counted by AVG, as in SQL; NULL is never inside an interval, so
it needs no bound. GREATEST / LEAST skip NULL arguments, as in DuckDB: ``GREATEST(x, 12)`` is 12
where x is NULL, and ``GREATEST(x, z)`` is z, so their intervals cover a NULL operand; an explicit
clamp is ``lo`` (``LEAST(GREATEST(e, lo), hi)``) or ``hi`` (``GREATEST(LEAST(e, hi), lo)``) where
e is NULL (:func:`clamp_argument`). Booleans count as 0 / 1.

Privacy never rests on this arithmetic: the bounded query clamps the value of ``expr`` to the
derived [lo, hi] in SQL before any sum (``dpsql.rewrite.bound``), so a row whose raw columns lie
outside their declared bounds (bounds are declarations, not checked constraints) is clamped like
a plain column. The derived interval only decides the sensitivity and how much clamping biases.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlglot import exp

if TYPE_CHECKING:
    from dpsql.catalog import TableSpec

Interval = tuple[float, float]


class NoInterval(Exception):
    """The expression has no bound derivable from public metadata: ``node`` and why."""

    def __init__(self, node: exp.Expression, message: str) -> None:
        self.node = node
        self.message = message
        super().__init__(message)

    def named(self, written: str) -> str:
        """The message with the function named ``written`` (its spelling in the query), when it is a function's."""
        if not written or not isinstance(self.node, exp.Func):
            return self.message
        label = _label(self.node)
        return written + self.message[len(label):] if self.message.startswith(label) else self.message


#: power(x, k) has bounds for a literal whole k in [0, MAX_POWER] (the bounds' own limit, +-1e15, then applies)
MAX_POWER = 64


def number(node: exp.Expression) -> float | None:
    """A finite numeric literal (through parentheses and unary minus), else None."""
    neg = False
    while isinstance(node, (exp.Neg, exp.Paren)):
        if isinstance(node, exp.Neg):
            neg = not neg
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            v = float(node.this)
        except ValueError:
            return None
        if math.isfinite(v):
            return -v if neg else v
    return None


def day_of(v: Any) -> datetime.date | None:
    """The day of a declared range's end: a date or datetime, or ISO text (None if it reads as neither)."""
    if isinstance(v, datetime.datetime):
        return v.date()
    if isinstance(v, datetime.date):
        return v
    if isinstance(v, str):
        try:
            return datetime.date.fromisoformat(v[:10])
        except ValueError:
            return None
    return None


def declared_days(table: TableSpec, column: str, cast: bool = False) -> Interval | None:
    """A DATE column's declared range as day numbers (``date.toordinal``), or None (another type, no range);
    ``cast``: the column is read through ``CAST(col AS DATE)``, so a TIMESTAMP column's range gives its days too."""
    if table.schema.get(column, "").strip().upper() not in (("DATE", "TIMESTAMP") if cast else ("DATE",)):
        return None
    o = table.column(column).ordered
    if o is None or o.kind not in ("date", "timestamp"):  # (a range given as timestamps holds the days of its ends too)
        return None
    lo, hi = day_of(o.lo), day_of(o.hi)
    return None if lo is None or hi is None else (float(lo.toordinal()), float(hi.toordinal()))


def _day_span(node: exp.Expression, days: Callable[[str, bool], Interval | None] | None) -> Interval | None:
    """The day numbers a DATE operand of ``DATE - DATE`` can take: a DATE literal's own, or a DATE column's
    declared range (``days(column)``); None for anything else."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.DATE) and isinstance(node.this, exp.Literal) \
            and node.this.is_string:
        try:
            d = datetime.date.fromisoformat(str(node.this.this))
        except ValueError:
            return None
        return float(d.toordinal()), float(d.toordinal())
    if isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.DATE) and isinstance(node.this, exp.Column) \
            and days is not None:  # the day of a DATE or TIMESTAMP column (within the days of its declared range)
        return days(node.this.name.lower(), True)
    if isinstance(node, exp.Column) and days is not None:
        return days(node.name.lower(), False)
    return None


def clamp_bounds(node: exp.Expression) -> tuple[exp.Expression, Interval] | None:
    """``LEAST(GREATEST(e, lo), hi)`` or ``GREATEST(LEAST(e, hi), lo)`` with literal bounds:
    ``(e, (lo, hi))``; None for anything else (lo > hi is returned as written: callers refuse it)."""
    while isinstance(node, exp.Paren):
        node = node.this
    for outer, inner_cls in ((exp.Least, exp.Greatest), (exp.Greatest, exp.Least)):
        if isinstance(node, outer) and len(node.expressions) == 1:
            hi_or_lo = number(node.expressions[0])
            inner = node.this
            while isinstance(inner, exp.Paren):
                inner = inner.this
            if hi_or_lo is None or not isinstance(inner, inner_cls) or len(inner.expressions) != 1:
                return None
            other = number(inner.expressions[0])
            if other is None:
                return None
            lo, hi = (other, hi_or_lo) if outer is exp.Least else (hi_or_lo, other)
            return inner.this, (lo, hi)
    return None


def _never_null(node: exp.Expression) -> bool:
    """A numeric or boolean literal: never NULL on any row (anything else may be)."""
    while isinstance(node, exp.Paren):
        node = node.this
    return number(node) is not None or isinstance(node, exp.Boolean)


def clamp_argument(node: exp.Expression) -> exp.Expression | None:
    """What an explicit clamp (:func:`clamp_bounds`) clamps, with NULL replaced as SQL does it
    (GREATEST / LEAST skip NULL arguments): ``LEAST(GREATEST(e, lo), hi)`` is ``lo`` where e is
    NULL and ``GREATEST(LEAST(e, hi), lo)`` is ``hi``, i.e. the inner call's literal, so the clamp
    equals clamping ``COALESCE(e, that literal)`` (for lo <= hi). None when ``node`` is no clamp."""
    if clamp_bounds(node) is None:
        return None
    while isinstance(node, exp.Paren):
        node = node.this
    inner = node.this
    while isinstance(inner, exp.Paren):
        inner = inner.this
    return exp.Coalesce(this=inner.this.copy(), expressions=[inner.expressions[0].copy()])


def _label(node: exp.Expression) -> str:
    """How a message names ``node``: its operator or function as SQL writes it (``||``, ``LPAD``,
    ``FOO``), not the parser's class name."""
    ops = {exp.DPipe: "||", exp.Mod: "%", exp.IntDiv: "//", exp.Pow: "^", exp.BitwiseAnd: "&", exp.BitwiseOr: "|",
           exp.BitwiseXor: "xor", exp.BitwiseLeftShift: "<<", exp.BitwiseRightShift: ">>"}
    if type(node) in ops:
        return ops[type(node)]
    if isinstance(node, exp.Anonymous):
        return str(node.this).upper()
    if isinstance(node, exp.Func):
        # DuckDB's name for it (epoch(ts) is EPOCH, never sqlglot's TIME_TO_UNIX); callers that have the query's
        # text name it as written (:func:`NoInterval.named`)
        shown = node.sql(dialect="duckdb").split("(", 1)[0]
        return shown if shown.replace("_", "").isalnum() else node.sql_name()
    return type(node).__name__.upper()


def _power(x: float, n: int) -> float:
    """``x ** n`` in floats, +-inf beyond their range (Python raises there; the bounds check then refuses)."""
    try:
        return float(x) ** n
    except OverflowError:
        return math.copysign(math.inf, x) if n % 2 else math.inf


def _hull(parts: list[Interval]) -> Interval:
    return min(p[0] for p in parts), max(p[1] for p in parts)


def _mul(a: Interval, b: Interval) -> Interval:
    prods = [x * y for x in a for y in b]
    prods = [0.0 if math.isnan(p) else p for p in prods]  # 0 * inf never arises: bounds are finite
    return min(prods), max(prods)


def interval(node: exp.Expression, bounds: Callable[[str], Interval | None],
             days: Callable[[str, bool], Interval | None] | None = None) -> Interval:
    """Bounds of ``node``'s value on any row, from ``bounds(column)`` (declared column bounds) and ``days(column)``
    (a DATE column's declared range as day numbers, read by ``DATE - DATE``, a number of days; with True: the
    column read through ``CAST(col AS DATE)``).

    Raises :class:`NoInterval` naming the part that has none."""
    while isinstance(node, exp.Paren):
        node = node.this
    v = number(node)
    if v is not None:
        return v, v
    if isinstance(node, exp.Boolean):
        x = 1.0 if node.this else 0.0
        return x, x
    if isinstance(node, (exp.Predicate, exp.Connector, exp.Not)):  # a condition: false / true = 0 / 1
        return 0.0, 1.0
    if isinstance(node, exp.Column):
        b = bounds(node.name.lower())
        if b is None:
            raise NoInterval(node, f"column '{node.name}' has no declared bounds")
        return float(b[0]), float(b[1])
    if isinstance(node, exp.Neg):
        lo, hi = interval(node.this, bounds, days)
        return -hi, -lo
    if isinstance(node, exp.Add):
        a, b = interval(node.this, bounds, days), interval(node.expression, bounds, days)
        return a[0] + b[0], a[1] + b[1]
    if isinstance(node, exp.Sub):
        span_a, span_b = _day_span(node.this, days), _day_span(node.expression, days)
        if span_a is not None and span_b is not None:  # DATE - DATE: a number of days
            return span_a[0] - span_b[1], span_a[1] - span_b[0]
        for side, span, other in ((node.this, span_a, span_b), (node.expression, span_b, span_a)):
            inner = side.this if isinstance(side, exp.Paren) else side
            cast = isinstance(inner, exp.Cast) and inner.to.is_type(exp.DataType.Type.DATE)
            # the other side a date with a range: this one is a date too (the typer's DATE - DATE; a DATE - n shifts
            # by a literal n), one without a range: named, not the other side's column
            if span is None and (cast or (other is not None and number(inner) is None)):
                col = inner if isinstance(inner, exp.Column) else inner.find(exp.Column) if cast else None
                raise NoInterval(side, "a number of days has bounds from DATE literals and DATE columns (or CAST(col AS "
                                       "DATE) of a TIMESTAMP column) with a declared date range"
                                 + (f"; column '{col.name}' declares none" if col is not None else
                                    f"; {inner.sql(dialect='duckdb')} is none of these"))
        a, b = interval(node.this, bounds, days), interval(node.expression, bounds, days)
        return a[0] - b[1], a[1] - b[0]
    if isinstance(node, exp.Mul):
        return _mul(interval(node.this, bounds, days), interval(node.expression, bounds, days))
    if isinstance(node, exp.Div) and not isinstance(node, exp.IntDiv):
        c = number(node.expression)
        if c is None or c == 0:
            raise NoInterval(node, "division has a bound only by a literal non-zero constant")
        a = interval(node.this, bounds, days)
        return _mul(a, (1.0 / c, 1.0 / c))
    if isinstance(node, exp.Abs):
        lo, hi = interval(node.this, bounds, days)
        if lo >= 0:
            return lo, hi
        if hi <= 0:
            return -hi, -lo
        return 0.0, max(-lo, hi)
    clamp = clamp_bounds(node)
    if clamp is not None and clamp[1][0] <= clamp[1][1]:
        return clamp[1]  # LEAST(GREATEST(e, lo), hi): in [lo, hi] whatever e is, NULL included
    if isinstance(node, (exp.Least, exp.Greatest)):
        # GREATEST / LEAST skip NULL arguments: the value is that of one non-NULL argument, at
        # least (GREATEST) every non-NULL one. An argument that may be NULL can drop out, so its
        # bound on the far side holds only for the arguments that are never NULL (literals)
        args = [node.this, *node.expressions]
        parts = [interval(e, bounds, days) for e in args]
        fixed = [p for e, p in zip(args, parts) if _never_null(e)]
        if isinstance(node, exp.Greatest):
            return max([min(p[0] for p in parts), *(p[0] for p in fixed)]), max(p[1] for p in parts)
        return min(p[0] for p in parts), min([max(p[1] for p in parts), *(p[1] for p in fixed)])
    if isinstance(node, exp.Coalesce):
        return _hull([interval(e, bounds, days) for e in [node.this, *node.expressions]])
    if isinstance(node, exp.Case):
        branches = [i.args["true"] for i in node.args.get("ifs") or []]
        default = node.args.get("default")
        if default is not None:
            branches.append(default)
        parts = [interval(b, bounds, days) for b in branches if not isinstance(b, exp.Null)]
        if not parts:
            raise NoInterval(node, "every branch of the CASE is NULL")
        return _hull(parts)
    if isinstance(node, exp.If):  # IF(cond, a, b)
        parts = [interval(b, bounds, days) for b in (node.args.get("true"), node.args.get("false")) if b is not None
                 and not isinstance(b, exp.Null)]
        if not parts:
            raise NoInterval(node, "every branch of the IF is NULL")
        return _hull(parts)
    if isinstance(node, exp.Nullif):  # the first argument, or NULL (which SUM skips)
        return interval(node.this, bounds, days)
    if isinstance(node, (exp.Round, exp.Floor, exp.Ceil, exp.Trunc)) and not node.args.get("to") \
            and not node.args.get("expression"):
        digits = node.args.get("decimals")
        k = number(digits) if digits is not None else 0.0
        if k is None or k < 0 or not float(k).is_integer():
            raise NoInterval(node, f"{_label(node)} has an interval rule only without digits or with whole digits >= 0")
        # x rounded to k >= 0 decimals lies between floor(x) and ceil(x), and floor / ceil are monotone
        lo, hi = interval(node.this, bounds, days)
        return float(math.floor(lo)), float(math.ceil(hi))
    if isinstance(node, exp.Pow):
        k = number(node.expression)
        if k is None or not float(k).is_integer() or not 0 <= k <= MAX_POWER:
            raise NoInterval(node, f"power(x, k) has an interval rule only for a literal whole k from 0 to {MAX_POWER}")
        lo, hi = interval(node.this, bounds, days)
        n = int(k)
        if n % 2 == 1 or lo >= 0:  # monotone on [lo, hi]
            return _power(lo, n), _power(hi, n)
        if hi <= 0:
            return _power(hi, n), _power(lo, n)
        return (0.0 if n else 1.0), _power(max(-lo, hi), n)
    if isinstance(node, exp.Cast) and node.to.is_type(*exp.DataType.REAL_TYPES, *exp.DataType.INTEGER_TYPES):
        lo, hi = interval(node.this, bounds, days)
        if node.to.is_type(*exp.DataType.INTEGER_TYPES):  # rounds to an integer: widen by one half
            return math.floor(lo), math.ceil(hi)
        return lo, hi
    raise NoInterval(node, f"{_label(node)} has no interval rule (supported: + - * / by a constant, "
                           "power by a whole constant, CASE, ABS, LEAST, GREATEST, COALESCE, NULLIF, ROUND, FLOOR, CEIL, TRUNC, numeric CAST)")
