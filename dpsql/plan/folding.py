"""Constant expressions compared with a binned column, folded to the value the engine compares with.

A histogram's kept bins (``plan.workload._kept``) are read from comparisons of its column with constants.
A literal is read directly; a constant expression (``age > 1e308 * 10``, ``age < 2 * 10``,
``age > CAST('inf' AS REAL)``) is typed as the comparison is typed for the engine (``typer.type_predicate``:
the casts, the widened integer arithmetic, the DECIMAL arithmetic in its exact result type) and that typed
constant side is evaluated here, in the engine's arithmetic: integers and DECIMALs exactly, DOUBLEs in IEEE
binary64 and REALs in binary32 (overflow is infinite, x / 0 is +-inf or NaN, as DuckDB gives). Only a small grammar is folded
(literals, NULL, unary minus, ``+ - * /``, integer ``//`` and ``%``, NULLIF, abs, casts between numbers and from plain number text, the typer's
DATE and TIMESTAMP literals); anything else
raises :class:`Unfoldable`, and the caller refuses it for free (a kept-bin set read otherwise than the engine
computes could drop bins that hold rows) or keeps every bin.

Public: a function of the query's text and the column's declared type only.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import struct
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.plan.typer import TypeRefusal, type_predicate


class Unfoldable(ValueError):
    """A constant expression that is not folded here."""


_CTX = decimal.Context(prec=200, Emax=10**6, Emin=-(10**6))
# Text is folded only where every engine reads it alike: ASCII digits and blanks (Python's \d and \s, and its
# float() and strip(), also read '３' and '\xa03' as 3, which DuckDB and Spark convert to NULL), and no signed NaN
# ('-nan' and '+nan' are NaN on DuckDB, NULL on Spark): other text is not folded (the caller refuses it for free)
_BLANKS = " \t\n\r\f\v"
_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", re.ASCII)
_INTEGER = re.compile(r"\s*[+-]?\d+\s*", re.ASCII)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?", re.ASCII)
_PLAIN_DECIMAL = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)\s*", re.ASCII)
_SPECIAL = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "+infinity": math.inf,
            "-infinity": -math.inf, "nan": math.nan}
_INT_LIMITS = {
    "TINYINT": (-(2**7), 2**7 - 1), "SMALLINT": (-(2**15), 2**15 - 1), "INT": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1), "INT128": (-(2**127), 2**127 - 1), "UTINYINT": (0, 2**8 - 1),
    "USMALLINT": (0, 2**16 - 1), "UINT": (0, 2**32 - 1), "UBIGINT": (0, 2**64 - 1), "UINT128": (0, 2**128 - 1),
}
_FLOATS = {"DOUBLE": False, "FLOAT": True}  # FLOAT: DuckDB's REAL, 32 bits


def folded_comparison(subject: exp.Expression, other: exp.Expression, column_type: str | None) -> Any:
    """The value the engine compares ``subject`` (the column, or its CAST to DOUBLE) with when the condition is
    ``subject <op> other`` and ``other`` is a column-free expression: an ``int``, ``Decimal`` or ``float`` (inf
    and NaN included), a ``date`` or ``datetime``, None for NULL. Raises :class:`Unfoldable` otherwise."""
    col = subject if isinstance(subject, exp.Column) else subject.this
    if column_type is None or not isinstance(col, exp.Column) or other.find(exp.Column, exp.Select, exp.Star):
        raise Unfoldable("not a constant")
    try:
        typed = type_predicate(exp.EQ(this=subject.copy(), expression=other.copy()), {col.name.lower(): column_type},
                               own=False)
    except TypeRefusal:
        raise Unfoldable("not typed") from None
    if not isinstance(typed, exp.EQ):
        raise Unfoldable("not a comparison")
    sides = [s for s in (typed.this, typed.expression) if s.find(exp.Column) is None]
    if len(sides) != 1:
        raise Unfoldable("not a comparison of the column")
    return evaluate(sides[0])


def compared_as_float(condition: exp.Expression, column: exp.Column, column_type: str | None) -> str | None:
    """``FLOAT`` or ``DOUBLE`` where the engine compares ``column`` (of ``column_type``, an integer or DECIMAL) in
    ``condition`` (its comparison with constants, or an IN list of them) converted to that type, as DuckDB does with a
    REAL (or DOUBLE) constant: the column's value rounded to 24 (53) bits first (16777217 is the REAL 16777216)."""
    if column_type is None or column_type.upper() in ("FLOAT", "REAL", "FLOAT4", "DOUBLE", "FLOAT8"):
        return None
    try:
        typed = type_predicate(condition.copy(), {column.name.lower(): column_type}, own=False)
    except TypeRefusal:
        return None
    for c in typed.walk():
        to = c.args.get("to") if isinstance(c, exp.Cast) else None
        if isinstance(to, exp.DataType) and to.this.name in ("FLOAT", "DOUBLE") and c.find(exp.Column) is not None:
            return str(to.this.name)
    return None


def float_edges(v: Decimal, real: bool) -> tuple[Decimal, Decimal, bool]:
    """The ends of the values a conversion to REAL (``real``) or DOUBLE rounds to the one nearest ``v`` (finite): the
    midpoints with its neighbours (beyond the largest, the tie with 2^128 or 2^1024, from which on a value rounds to
    inf), and whether both ends round to it (ties go to the even one)."""
    f = _real_of_text(str(v)) if real else float(v)
    fmt, top, inf_bits = ("<I", 2**128, 0x7F800000) if real else ("<Q", 2**1024, 0x7FF0000000000000)
    ffmt = "<f" if real else "<d"
    bits = struct.unpack(fmt, struct.pack(ffmt, abs(f)))[0]
    ends = []
    for up in (False, True):
        if f == 0:
            g = math.copysign(2.0**-149 if real else 5e-324, 1 if up else -1)
        else:
            b = bits + (1 if up == (f > 0) else -1)
            g = math.copysign(math.inf if b >= inf_bits else struct.unpack(ffmt, struct.pack(fmt, b))[0], f)
        ends.append(Decimal(top if up else -top) if math.isinf(g) else _CTX.divide(_CTX.add(Decimal(f), Decimal(g)), 2))
    return ends[0], ends[1], bits % 2 == 0


def evaluate(e: exp.Expression) -> Any:
    """The value of a typed constant expression in the engine's arithmetic (:class:`Unfoldable` if not read here)."""
    if isinstance(e, exp.Paren):
        return evaluate(e.this)
    if isinstance(e, exp.Null):
        return None
    if isinstance(e, exp.Literal):
        if e.is_string:
            return str(e.this)
        text = str(e.this)
        if _INTEGER.fullmatch(text):
            return int(text)
        if _PLAIN_DECIMAL.fullmatch(text) and sum(c.isdigit() for c in text) <= 38:
            return Decimal(text)
        raise Unfoldable("a number literal typed otherwise")
    if isinstance(e, exp.Neg):
        v = evaluate(e.this)
        if v is None or isinstance(v, (int, Decimal, float)):
            return None if v is None else -v
        raise Unfoldable("negation")
    if isinstance(e, exp.Cast):
        return _cast(evaluate(e.this), e.args.get("to"), isinstance(e, exp.TryCast))
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        return _arith(e, evaluate(e.this), evaluate(e.expression))
    if isinstance(e, (exp.IntDiv, exp.Mod)):
        a, b = evaluate(e.this), evaluate(e.expression)
        if a is None or b is None or (isinstance(b, int) and b == 0):
            return None  # (DuckDB: an integer divided by zero is NULL)
        if not (type(a) is int and type(b) is int):
            raise Unfoldable("// or % of other than integers")
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # DuckDB's // truncates toward zero
        return q if isinstance(e, exp.IntDiv) else a - b * q
    if isinstance(e, exp.Nullif):
        a, b = evaluate(e.this), evaluate(e.expression)
        return None if _equal(a, b) else a
    if isinstance(e, exp.Case) and len(e.args.get("ifs") or []) == 1 and isinstance(e.args["ifs"][0].this, exp.EQ):
        # the typer's NULLIF of two types: CASE WHEN a = b (in their common type) THEN NULL ELSE a (its own) END
        when = e.args["ifs"][0]
        x, y = evaluate(when.this.this), evaluate(when.this.expression)
        if x is not None and y is not None and type(x) is not type(y):
            raise Unfoldable("a comparison of two types")
        return evaluate(when.args["true"]) if _equal(x, y) else (
            evaluate(e.args["default"]) if e.args.get("default") is not None else None)
    if isinstance(e, exp.Abs):
        v = evaluate(e.this)
        if v is None or isinstance(v, (int, Decimal, float)):
            return None if v is None else abs(v)
        raise Unfoldable("abs of other than a number")
    raise Unfoldable(f"{type(e).__name__} is not folded")


def _equal(a: Any, b: Any) -> bool:
    """``a = b`` is true in the engine (values of one type; NULL is never equal, NaN equals NaN as in DuckDB)."""
    if a is None or b is None or type(a) is not type(b):
        return False
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def _arith(e: exp.Expression, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    if type(a) is not type(b) or isinstance(a, str):
        raise Unfoldable("operands of two types")
    if isinstance(a, float):
        if isinstance(e, exp.Div):
            if b == 0:  # IEEE, as DuckDB divides DOUBLEs: 1 / 0 is inf, 0 / 0 NaN
                return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
            r = a / b
        else:
            r = a + b if isinstance(e, exp.Add) else a - b if isinstance(e, exp.Sub) else a * b
        # REALs (both operands: the typer casts them alike) in 32 bits, as DuckDB: the double result rounded once is
        # the single-precision one (53 >= 2 * 24 + 2 bits), overflow inf
        return _single(r) if _is_real(e.this) and math.isfinite(r) else r
    if isinstance(e, exp.Div):
        raise Unfoldable("division of integers or DECIMALs")  # (typed as DOUBLE division: not reached)
    if isinstance(a, int):
        r = a + b if isinstance(e, exp.Add) else a - b if isinstance(e, exp.Sub) else a * b
        if abs(r) >= 2**127:
            raise Unfoldable("beyond HUGEINT")
        return r
    op = _CTX.add if isinstance(e, exp.Add) else _CTX.subtract if isinstance(e, exp.Sub) else _CTX.multiply
    r = op(a, b)
    if abs(r) >= Decimal(10) ** 38:
        raise Unfoldable("beyond DECIMAL(38)")
    return r


def _is_real(e: exp.Expression) -> bool:
    """The typed expression ``e`` is a REAL (FLOAT): a cast to it, or arithmetic, negation, abs or NULLIF of REALs."""
    while isinstance(e, (exp.Paren, exp.Neg, exp.Abs, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Nullif)):
        e = e.this
    return isinstance(e, exp.Cast) and isinstance(e.args.get("to"), exp.DataType) and e.args["to"].this.name == "FLOAT"


def _single(f: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", f))[0]
    except OverflowError:  # (Python versions that refuse to round to inf)
        return math.copysign(math.inf, f)


def _cast(v: Any, to: Any, try_: bool) -> Any:
    if v is None:
        return None
    if not isinstance(to, exp.DataType):
        raise Unfoldable("a cast to no type")
    name = to.this.name
    if name in _FLOATS:
        f = to_double(v)
        if _FLOATS[name] and math.isfinite(f):
            try:
                f = _real_of_text(v) if isinstance(v, str) and f != 0 else struct.unpack("f", struct.pack("f", f))[0]
            except OverflowError:
                if try_:
                    return None
                raise Unfoldable("out of REAL's range") from None
        return f
    if name in _INT_LIMITS:
        if isinstance(v, str) and _INTEGER.fullmatch(v):
            v = int(Decimal(v.strip(_BLANKS)))  # (not int(v): Python refuses text of more than 4300 digits)
        if isinstance(v, Decimal) and v.is_finite():  # DuckDB rounds a DECIMAL half away from zero
            v = int(v.quantize(Decimal(1), rounding=decimal.ROUND_HALF_UP, context=_CTX))
        elif isinstance(v, float) and math.isfinite(v):  # and a DOUBLE half to even (0.5 is 0, 1.5 is 2)
            v = round(v)
        elif isinstance(v, float) and try_:
            return None
        if not isinstance(v, int):
            raise Unfoldable("a cast to an integer")
        lo, hi = _INT_LIMITS[name]
        if lo <= v <= hi:
            return v
        if try_:
            return None
        raise Unfoldable("out of the integer type's range")
    if name == "DECIMAL" and len(to.expressions) == 2:
        p, s = (int(x.name) for x in to.expressions)
        if isinstance(v, str) and _PLAIN_DECIMAL.fullmatch(v):
            v = Decimal(v.strip(_BLANKS))
        if isinstance(v, int):
            v = Decimal(v)
        if not isinstance(v, Decimal) or not v.is_finite():
            raise Unfoldable("a cast to DECIMAL")
        if abs(v) >= Decimal(10) ** (p - s):  # (first: beyond it, v may have more digits than _CTX quantizes)
            if try_:
                return None
            raise Unfoldable("out of the DECIMAL's range")
        if v != v.quantize(Decimal(1).scaleb(-s), context=_CTX):
            raise Unfoldable("a rounding cast to DECIMAL")
        return v if v else v.copy_abs()  # (a DECIMAL zero has no sign, as in DuckDB: '-0.0' is 0.0)
    if name in ("DATE", "TIMESTAMP") and isinstance(v, str):
        # the typer's own spelling of a date/time literal (DATE '2024-01-08', make_date(2024, 1, 8), a shifted one)
        if name == "DATE" and _DATE.fullmatch(v):
            return dt.date.fromisoformat(v)
        if name == "TIMESTAMP" and _TIMESTAMP.fullmatch(v):
            return dt.datetime.fromisoformat(v)
    raise Unfoldable(f"a cast to {name}")


def _real_of_text(text: str) -> float:
    """The REAL nearest the number ``text`` (ties to even), as DuckDB parses text to a REAL: one rounding. Through
    a DOUBLE it can be two, and differ: '1.99999994039535522374' is the DOUBLE 2 - 2^-24, a tie then rounded to 2.0,
    where it is below the tie and its REAL is 2 - 2^-23. From the tie above the largest REAL on, +-inf (as DuckDB)."""
    x = Fraction(Decimal(text.strip(_BLANKS)))
    if abs(x) >= 2**128 - 2**103:
        return math.copysign(math.inf, x)
    bits = struct.unpack("<I", struct.pack("<f", max(min(float(x), _REAL_MAX), -_REAL_MAX)))[0]
    near = [struct.unpack("<f", struct.pack("<I", b))[0] for b in (bits - 1, bits, bits + 1) if 0 <= b < 2**32]
    return min((c for c in near if math.isfinite(c)),
               key=lambda c: (abs(Fraction(c) - x), struct.unpack("<I", struct.pack("<f", c))[0] & 1))


_REAL_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]


def to_double(v: Any) -> float:
    """DuckDB's DOUBLE of a value: text parsed (plain numbers, inf, NaN) and rounded to nearest; an integer or
    DECIMAL only where that rounding is a single one (at most 2^53 in its digits: DuckDB divides the DECIMAL's
    integer by a power of ten)."""
    if isinstance(v, float):
        return v
    if isinstance(v, str):
        t = v.strip(_BLANKS).lower()
        if t in _SPECIAL:
            return _SPECIAL[t]
        if _NUMBER.fullmatch(v):
            return float(t)
        raise Unfoldable("text that is no plain number")
    if isinstance(v, int) and abs(v) <= 2**53:
        return float(v)
    if isinstance(v, Decimal) and v.is_finite():
        sign, digits, exponent = v.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0")
        if unscaled <= 2**53 and isinstance(exponent, int) and -22 <= exponent <= 0:
            return float(v)
    raise Unfoldable("a DOUBLE that may be rounded twice")
