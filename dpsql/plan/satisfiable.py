"""Whether the WHERE's conditions on one column can hold for any value of the column's type.

A release over keys above a noisy threshold (no public key set) whose WHERE keeps no row has no row whatever the data:
no group has a row, so none passes the threshold, and the query would be charged for nothing. A constant conjunct
that is not true (``WHERE 1 = 0``) is refused for free by ``dpsql.postprocess.no_row_refusal``; this module decides
the same of conjuncts that read one column only through comparisons with constants (``i > 5 AND i < 3``, ``i <> i``,
``s IS NULL AND s IS NOT NULL``, ``s > 'z' AND s < 'a'``).

Method (exact for the shapes accepted): such a conjunction's truth, as a function of the column's value, is constant
between consecutive constants it compares with (comparisons, ``IN``, ``BETWEEN``, ``IS [NOT] NULL``, combined by
``AND``, ``OR``, ``NOT``). :func:`candidates` gives values of the column's type that meet every such piece: each
constant, its neighbours in the type (an integer's +-1 and a decimal's +-one unit of its scale, of a DOUBLE constant's
neighbouring DOUBLEs too, a float's next values, a date's +-1 day, a timestamp's +-1 microsecond, a date and an instant
beyond Python's years 1..9999, a text followed by the least characters), the midpoints of floats, a value below and
above all constants, the special values of floats, and NULL. The conjunction holds for some value of the column exactly
when it holds for one of these. The constants are those of the typed rendering (the
rendering the bounded query runs, ``dpsql.plan.typer.type_predicate``), evaluated by the engine over a public one-row
relation, and the candidates are cast to the column's type by the engine: the decision reads the SQL and the catalog
only (a function of public metadata), never a private row.

Anything outside these shapes (a function of the column, its negation or a cast of it included: ``-i > 5`` holds at
-6, ``CAST(i AS VARCHAR) > '5'`` at 50, far from the constants; two columns, a subquery, LIKE) is not decided: the
query runs as before.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
from collections.abc import Iterable

from sqlglot import exp

from dpsql.plan.typer import SqlType, parse_type
from dpsql.plan.workload import _conjuncts as conjuncts

#: node types a conjunct decided here may hold (beside one column, read any number of times)
_SHAPES = (exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Neg, exp.Paren, exp.EQ, exp.NEQ, exp.GT, exp.GTE,
           exp.LT, exp.LTE, exp.Is, exp.Not, exp.In, exp.Between, exp.And, exp.Or, exp.Cast, exp.DataType,
           exp.NullSafeEQ, exp.NullSafeNEQ)
#: the column types decided here (others, INTERVAL, TIMESTAMP WITH TIME ZONE, lists, are not)
_KINDS = ("int", "decimal", "float", "varchar", "bool", "date", "timestamp")


def one_column_groups(where: exp.Expression | None, schema: dict[str, str]) -> dict[str, list[exp.Expression]]:
    """The WHERE's conjuncts that read one column only, through comparisons with constants, by that column (lower
    case), for columns of a type decided here and read at least twice (or by a BETWEEN): one comparison alone
    (``country = 'FR'``, the common WHERE) is not decided, so most queries pay nothing for this check. Conjuncts of
    other shapes are left out."""
    groups: dict[str, list[exp.Expression]] = {}
    for c in conjuncts(where):
        names = {col.name.lower() for col in c.find_all(exp.Column)}
        if len(names) != 1 or not all(isinstance(n, _SHAPES) for n in c.walk()):
            continue
        if isinstance(c, exp.In) and (c.args.get("query") is not None or c.args.get("unnest") is not None):
            continue
        if any(isinstance(n, (exp.Neg, exp.Cast)) and n.find(exp.Column) is not None for n in c.walk()):
            continue  # (-i > 5 holds at i = -6, CAST(i AS VARCHAR) > '5' at i = 50: values far from the constants)
        (name,) = names
        if name in schema and parse_type(schema[name]).kind in _KINDS:
            groups.setdefault(name, []).append(c)
    return {name: cs for name, cs in groups.items()
            if sum(1 for c in cs for _ in c.find_all(exp.Column)) >= 2 or any(c.find(exp.Between) for c in cs)}


def constant_operands(typed: exp.Expression) -> list[exp.Expression]:
    """The largest parts of a typed condition that read no column (its constants, cast as the query casts them)."""
    out: list[exp.Expression] = []

    def visit(node: exp.Expression) -> None:
        if isinstance(node, exp.Column):
            return
        if isinstance(node, exp.Collate):  # (its collation's name is no value)
            visit(node.this)
            return
        if not any(isinstance(n, exp.Column) for n in node.walk()):
            if isinstance(node, exp.MD5) and isinstance(node.this, exp.DPipe):
                # an element of a long IN list, compared by its digest (``MD5(salt || CAST(c AS TEXT))``,
                # ``dpsql.plan.typer._digest``): the element itself is the constant (its digest is no value of the
                # column: ``s IN ('a', ..., 'y') AND s > 'b'`` holds at 'y', which no digest's neighbour is)
                node = node.this.expression
                if isinstance(node, exp.Cast) and node.to.is_type(*exp.DataType.TEXT_TYPES):
                    node = node.this
            if not isinstance(node, exp.DataType):
                out.append(node)
            return
        for child in node.iter_expressions():
            visit(child)

    visit(typed)
    return out


def _around(v: float) -> list[float]:
    """A finite DOUBLE constant and the DOUBLEs on either side of it (finite ones): a column compared in DOUBLE
    (``bi > 1e18`` is ``TRY_CAST(bi AS DOUBLE) > 1e18``) holds a value whose DOUBLE is the next one above the constant
    (1e18 + 128) where its own neighbours (1e18 +- 1) round to the constant itself."""
    return [f for f in (math.nextafter(v, -math.inf), v, math.nextafter(v, math.inf)) if math.isfinite(f)]


def _ints(values: Iterable[object]) -> list[str]:
    out: set[int] = {0}
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, decimal.Decimal)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue
        for f in _around(v) if isinstance(v, float) else [v]:
            lo, hi = math.floor(f), math.ceil(f)
            out.update((lo - 1, lo, hi, hi + 1))
    return [str(v) for v in sorted(out)]


def _decimals(values: Iterable[object], scale: int) -> list[str]:
    unit = decimal.Decimal(1).scaleb(-scale)
    out: set[decimal.Decimal] = {decimal.Decimal(0)}
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, decimal.Decimal)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue
        for d in map(decimal.Decimal, _around(v) if isinstance(v, float) else [v]):
            for r in (decimal.ROUND_FLOOR, decimal.ROUND_CEILING):
                q = d.quantize(unit, rounding=r) if abs(d) < decimal.Decimal(10) ** 40 else d.to_integral_value(r)
                out.update((q - unit, q, q + unit))
    return [format(v, "f") for v in sorted(out)]


def _floats(values: Iterable[object], single: bool) -> list[str]:
    finite: set[float] = {0.0}
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, decimal.Decimal)):
            continue
        f = float(v)
        if math.isfinite(f):
            finite.add(f)
    pts = sorted(finite)
    out = set(pts)
    for a, b in zip(pts, pts[1:]):
        out.add(a / 2 + b / 2)
    for f in pts:
        out.update((math.nextafter(f, -math.inf), math.nextafter(f, math.inf)))
        if single:  # the FLOATs nearest f (f cast to FLOAT rounds to one of them) and their neighbours
            for g in _float32_around(f):
                out.update(_float32_around(g))
    out.update((pts[0] * 2 - 1, pts[-1] * 2 + 1))
    return [repr(f) for f in sorted(out)] + ["inf", "-inf", "nan"]


def _float32_around(f: float) -> list[float]:
    """The FLOAT nearest ``f`` and the FLOATs on either side of it (finite ones; none beyond FLOAT's range)."""
    try:
        g = struct.unpack("<f", struct.pack("<f", f))[0]
    except OverflowError:
        return []
    bits = struct.unpack("<i", struct.pack("<f", g))[0]
    out = [g]
    for b in (bits - 1, bits + 1):  # the next FLOATs by their bits (either order for a negative value)
        try:
            v = struct.unpack("<f", struct.pack("<i", b))[0]
        except struct.error:
            continue
        if math.isfinite(v):
            out.append(v)
    return out


def _texts(values: Iterable[object]) -> list[str]:
    out = {""}
    for v in values:
        if isinstance(v, str):
            out.update((v, v + "\x00", v + "\x01"))
    return sorted(out)


#: the engine's dates and instants just outside Python's years 1..9999 (DuckDB's reach 290309 BC .. 294247, and a
#: registered column keeps those of 290000 BC .. 294000): a constant of those years has no neighbour in Python beyond
#: them, so these stand for every value below and above (``d > DATE '9999-12-31'`` holds at 10000-01-01)
_BEYOND_DATES = ["0001-12-31 (BC)", "10000-01-01"]
_BEYOND_TIMESTAMPS = ["0001-12-31 (BC) 23:59:59.999999", "10000-01-01 00:00:00"]


def _dates(values: Iterable[object]) -> list[str]:
    out = {dt.date(1970, 1, 1), dt.date.min, dt.date.max}
    for v in values:
        d = v.date() if isinstance(v, dt.datetime) else v
        if isinstance(d, dt.date):
            for k in (-1, 0, 1):
                try:
                    out.add(d + dt.timedelta(days=k))
                except OverflowError:
                    pass
    return [d.isoformat() for d in sorted(out)] + _BEYOND_DATES


def _timestamps(values: Iterable[object]) -> list[str]:
    out = {dt.datetime(1970, 1, 1), dt.datetime(1, 1, 1), dt.datetime.max}
    step = dt.timedelta(microseconds=1)
    for v in values:
        t = v if isinstance(v, dt.datetime) else dt.datetime.combine(v, dt.time()) if isinstance(v, dt.date) else None
        if t is None:
            continue
        t = t.replace(tzinfo=None)
        for k in (-1, 0, 1):
            try:
                out.add(t + k * step)
            except OverflowError:
                pass
    return [t.isoformat(sep=" ") for t in sorted(out)] + _BEYOND_TIMESTAMPS


def candidates(sql_type: SqlType, constants: Iterable[object]) -> list[str | None]:
    """Texts of values of ``sql_type`` (cast by the engine; one that does not convert is dropped) among which a
    conjunction comparing the column with ``constants`` (their Python values) holds for one if it holds for any value
    of the type; NULL (None) included."""
    values = list(constants)
    kind = sql_type.kind
    if kind == "int":
        got: list[str] = _ints(values)
    elif kind == "decimal":
        got = _decimals(values, sql_type.scale)
    elif kind == "float":
        got = _floats(values, sql_type.name == "FLOAT")
    elif kind == "varchar":
        got = _texts(values)
    elif kind == "bool":
        got = ["true", "false"]
    elif kind == "date":
        got = _dates(values)
    elif kind == "timestamp":
        got = _timestamps(values)
    else:  # pragma: no cover - one_column_groups keeps the kinds above only
        raise AssertionError(kind)
    return [*got, None]
