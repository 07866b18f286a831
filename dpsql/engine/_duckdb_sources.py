"""How the DuckDB backend reads each kind of source totally (``dpsql.engine.duckdb``).

A source value that cannot be read is NULL, never an error (an error would reveal, after the
charge, whether that row exists):

- Parquet and Arrow (:func:`_arrow_plan`): DuckDB's Arrow scan converts some types while
  reading and raises on a value it cannot convert, so every column is read through Arrow as
  a type that cannot fail and rebuilt in the view with a total expression, at any depth
  (lists, structs): text is read as bytes and decoded with ``TRY(DECODE(...))`` (invalid
  UTF-8 is NULL; a Parquet file's top-level text is read as its dictionaries of bytes; inside a list each element
  is decoded only where a total test finds it UTF-8,
  so no ``TRY`` fails there); timestamps (every unit, with or without a time zone), durations, dates
  and TIME are read as their stored integers (or range-checked on them) and rebuilt (a value
  outside the range every allow-listed function accepts is NULL); a decimal beyond its
  precision is NULL; float16 and decimal256 are widened; a dictionary of such values
  is decoded first. A map, union or list view holding such values, and any type not known to
  read totally, are refused at registration (``ConfigError``, before any charge).
- Parquet with ``invalid_text = "replace"``: DuckDB's own reader; the Parquet types it
  converts in a way that can fail (timestamps in milliseconds, INT96, TIME, JSON, ...) are
  refused at registration, from the file's schema (an allow-list, :func:`_parquet_unsafe`).
- DuckDB tables and DuckDB's Parquet reader (:func:`_duck_plan`): a DECIMAL beyond its
  precision, a timestamp or TIME beyond DuckDB's usable range are NULL (range tests on the
  stored values); TIMESTAMP_S/_MS/_NS are read as TIMESTAMP.
- Every source: a text (VARCHAR, JSON) or BLOB value longer than the owner's
  ``max_text_bytes`` is NULL, at any depth (a bound on the per-row cost of functions, checked
  on the stored length); a DuckDB MAP holding a key over the cap is NULL as a whole.
- CSV (:func:`_csv_header`, :func:`_csv_unquote`): the dialect is fixed, never sniffed from the
  data; column names come from the header line only; DuckDB reads the engine's copies of the
  files, where a lone carriage return is a space (``dpsql.engine._duckdb_csv``).

Everything here builds sqlglot ASTs (DuckDB dialect) or reads file headers; nothing executes.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from sqlglot import exp

from dpsql.errors import ConfigError, InputUnavailableError

#: CSV column types an owner may declare (``columns={'amount': {'type': 'DOUBLE'}}``)
_CSV_TYPES = re.compile(
    r"^(BOOLEAN|TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|UTINYINT|USMALLINT|UINTEGER|UBIGINT|FLOAT|DOUBLE|"
    r"DECIMAL\(\s*\d{1,2}\s*,\s*\d{1,2}\s*\)|DATE|TIME|TIMESTAMP|TIMESTAMPTZ|VARCHAR)$"
)


# -- source views ------------------------------------------------------------------------------
#: A rebuild of one stored value: SQL over the value as read (None: the value is used as is).
Rebuild = Callable[[exp.Expression], exp.Expression]

#: Microseconds since 1970 of 290000-01-01 (BC) and 294000-01-01: a timestamp outside this range
#: is NULL. DuckDB's TIMESTAMP reaches a little further (290309 BC to 294247), but near its ends
#: ``date_trunc`` (to the year, the millennium) leaves the range and raises.
TS_MIN_US = -9_213_651_676_800_000_000
TS_MAX_US = 9_215_576_668_800_000_000
_DAY_US = 86_400_000_000
#: Days since 1970 of the same range: a DATE outside it is NULL (DuckDB's DATE reaches 5.8
#: million years, but ``date_trunc`` on a date reads it as a TIMESTAMP and raises near its ends)
DATE_MIN_DAY, DATE_MAX_DAY = -(-TS_MIN_US // _DAY_US), TS_MAX_US // _DAY_US
#: Microseconds per unit of Arrow's timestamp, duration and time types ("ns": divided by 1000)
_PER_US = {"s": 1_000_000, "ms": 1_000, "us": 1}


def _num(v: int) -> exp.Expression:
    lit = exp.Literal.number(abs(v))
    return exp.Neg(this=lit) if v < 0 else lit


def _fn(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


def _when(cond: exp.Expression, value: exp.Expression) -> exp.Expression:
    """``CASE WHEN cond THEN value END`` (NULL otherwise)."""
    return exp.Case(ifs=[exp.If(this=cond, true=value)])


def _clamp(e: exp.Expression, lo: int, hi: int) -> exp.Expression:
    """``e`` clamped into [lo, hi]: arithmetic on it cannot overflow even where a CASE around it
    is not taken (DuckDB may evaluate a CASE branch on every row of a vector)."""
    return _fn("LEAST", _fn("GREATEST", e, _num(lo)), _num(hi))


def _in_range(e: exp.Expression, lo: int, hi: int) -> exp.Expression:
    return exp.Between(this=e, low=_num(lo), high=_num(hi))


def _to_us(e: exp.Expression, unit: str, lo_us: int, hi_us: int) -> exp.Expression:
    """BIGINT microseconds of a stored int64 count of ``unit``, or NULL outside [lo_us, hi_us]."""
    if unit == "ns":  # floor division by 1000: never overflows
        us = exp.Sub(this=exp.IntDiv(this=e.copy(), expression=_num(1000)),
                     expression=exp.Case(ifs=[exp.If(this=exp.LT(this=exp.Mod(this=e.copy(), expression=_num(1000)),
                                                                  expression=_num(0)), true=_num(1))],
                                         default=_num(0)))
        return _when(_in_range(exp.paren(us.copy()), lo_us, hi_us), exp.paren(us))
    f = _PER_US[unit]
    lo, hi = -((-lo_us) // f), hi_us // f  # ceil(lo/f), floor(hi/f)
    return _when(_in_range(e.copy(), lo, hi), exp.Mul(this=_clamp(e, lo, hi), expression=_num(f)))


def _decimal_in_range(p: int, s: int) -> Rebuild:
    """A DECIMAL(p, s) value within its declared precision, else NULL. A stored value can hold
    more digits (up to 2**127 for DECIMAL(38)), and negating it then raises inside DuckDB."""
    digits = "9" * (p - s) if p > s else "0"
    top = exp.Cast(this=exp.Literal.string(digits + ("." + "9" * s if s else "")),
                   to=exp.DataType.build(f"DECIMAL({p}, {s})"))
    return lambda e: _when(exp.Between(this=e.copy(), low=exp.Neg(this=top.copy()), high=top.copy()), e)


def _temporal_in_range(tid: str) -> Rebuild | None:
    """For DuckDB's own temporal types: a value outside the range of :data:`TS_MIN_US` (a DATE
    outside :data:`DATE_MIN_DAY`, a TIME outside 00:00 to 24:00) is NULL; seconds, milliseconds and nanoseconds are read as
    TIMESTAMP / TIME with TRY_CAST. The range tests compare stored values: they cannot fail."""
    ts, tz = exp.DataType.build("TIMESTAMP"), exp.DataType.build("TIMESTAMPTZ")
    if tid in ("timestamp", "timestamp_s", "timestamp_ms", "timestamp_ns"):
        lo, hi = _fn("MAKE_TIMESTAMP", _num(TS_MIN_US)), _fn("MAKE_TIMESTAMP", _num(TS_MAX_US))
        conv = (lambda e: e) if tid == "timestamp" else (lambda e: exp.TryCast(this=e, to=ts))
    elif tid in ("timestamp with time zone", "timestamp_tz"):
        lo, hi = _fn("MAKE_TIMESTAMPTZ", _num(TS_MIN_US)), _fn("MAKE_TIMESTAMPTZ", _num(TS_MAX_US))
        conv = lambda e: exp.Cast(this=e, to=tz)  # noqa: E731 - the type itself, no conversion
    elif tid == "date":
        lo, hi = _fn("MAKE_DATE", _num(DATE_MIN_DAY)), _fn("MAKE_DATE", _num(DATE_MAX_DAY))
        conv = lambda e: e  # noqa: E731
    elif tid in ("time", "time_ns"):
        lo = exp.Cast(this=exp.Literal.string("00:00:00"), to=exp.DataType.build("TIME"))
        hi = exp.Cast(this=exp.Literal.string("24:00:00"), to=exp.DataType.build("TIME"))
        conv = (lambda e: e) if tid == "time" else (lambda e: exp.TryCast(this=e, to=exp.DataType.build("TIME")))
    else:
        return None

    def rebuild(e: exp.Expression) -> exp.Expression:
        v = conv(e)
        return _when(exp.Between(this=v.copy(), low=lo.copy(), high=hi.copy()), v)

    return rebuild


def _cap(e: exp.Expression, cap: int | None, value: exp.Expression | None = None, fn: str = "OCTET_LENGTH") -> exp.Expression:
    """``value`` (default ``e``), or NULL when the stored ``e`` is over ``cap`` bytes."""
    value = e if value is None else value
    if cap is None:
        return value
    return _when(exp.LTE(this=_fn(fn, e.copy()), expression=_num(cap)), value)


#: The shape of a value for its size (:func:`_size_guard`): ("leaf", length function or None), ("list", child),
#: ("array", size, child), ("map", key, value), ("struct", [(name, child), ...])
Shape = tuple[Any, ...]


def _duck_shape(t: Any, where: str) -> Shape:
    """The shape of a DuckDB type (a ``DuckDBPyType``) for :func:`_size_guard`."""
    tid = t.id
    if tid in _LENGTHS:
        return ("leaf", _LENGTHS[tid])
    if tid == "list":
        return ("list", _duck_shape(t.children[0][1], where))
    if tid == "array":
        return ("array", int(t.children[1][1]), _duck_shape(t.children[0][1], where))
    if tid == "map":
        return ("map", _duck_shape(t.children[0][1], where), _duck_shape(t.children[1][1], where))
    if tid == "struct":
        return ("struct", [(name, _duck_shape(ft, where)) for name, ft in t.children])
    if tid == "union" and any(_duck_shape(ct, where) != ("leaf", None) for _, ct in t.children):
        raise ConfigError(f"column {where} has type {t}: the size of the values inside it cannot be capped "
                          "at max_text_bytes and max_list_size",
                          hint="store it as a struct, or leave the column out of the source")
    return ("leaf", None)


def _arrow_shape(t: pa.DataType, where: str) -> Shape:
    """The shape of the value DuckDB reads from an Arrow column read as type ``t`` (:func:`_arrow_plan`'s read type)."""
    T = pa.types
    if isinstance(t, pa.BaseExtensionType):
        return _arrow_shape(t.storage_type, where)
    if T.is_dictionary(t):
        return _arrow_shape(t.value_type, where)
    if T.is_string(t) or T.is_large_string(t) or T.is_string_view(t):
        return ("leaf", "STRLEN")
    if T.is_binary(t) or T.is_large_binary(t) or T.is_binary_view(t) or T.is_fixed_size_binary(t):
        return ("leaf", "OCTET_LENGTH")
    if T.is_fixed_size_list(t):
        return ("array", t.list_size, _arrow_shape(t.value_type, where))
    if T.is_list(t) or T.is_large_list(t) or T.is_list_view(t) or T.is_large_list_view(t):
        return ("list", _arrow_shape(t.value_type, where))
    if T.is_map(t):
        return ("map", _arrow_shape(t.key_type, where), _arrow_shape(t.item_type, where))
    if T.is_struct(t):
        return ("struct", [(t.field(i).name, _arrow_shape(t.field(i).type, where)) for i in range(t.num_fields)])
    children = ([t.field(i).type for i in range(t.num_fields)] if T.is_union(t) else
                [t.value_type] if T.is_run_end_encoded(t) else [])
    if any(_arrow_shape(c, where) != ("leaf", None) for c in children):
        raise ConfigError(f"column {where} has type {t}: the size of the values inside it cannot be capped "
                          "at max_text_bytes and max_list_size",
                          hint="store it as a plain column, a list or a struct, or leave the column out of the source")
    return ("leaf", None)


#: How the stored length of a leaf is read, by DuckDB type id: bytes of text and BLOB, bits of a BIT (its text has
#: one character per bit), bytes of a GEOMETRY's WKB
_LENGTHS = {"varchar": "STRLEN", "blob": "OCTET_LENGTH", "bit": "BIT_LENGTH", "geometry": "GEOMETRY"}


def _levels(e: exp.Expression, shape: Shape, depth: int) -> list[exp.Expression]:
    """The size of the value ``e`` of ``shape`` by depth: the first term counts the elements of its outermost
    lists and maps (with the lengths of texts beside them), each next term the elements and lengths one level
    deeper. Each term reads only the elements the terms before it counted (``LEN`` and ``CARDINALITY`` read a
    list's or map's stored length, ``STRLEN`` a text's): so a value whose first terms are over a cap is never
    read further, and none is read as text. NULL counts 0."""
    kind = shape[0]
    if kind == "leaf":
        if shape[1] is None:
            return []
        return [_fn("OCTET_LENGTH", exp.cast(e, "BLOB")) if shape[1] == "GEOMETRY" else _fn(shape[1], e)]
    if kind == "struct":
        per = [_levels(exp.Dot(this=e.copy(), expression=exp.to_identifier(name, quoted=True)), child, depth)
               for name, child in shape[1]]
        out: list[exp.Expression] = []
        for j in range(max((len(p) for p in per), default=0)):
            terms = [_fn("COALESCE", p[j], _num(0)) for p in per if len(p) > j]
            total = terms[0]
            for term in terms[1:]:
                total = exp.Add(this=total, expression=term)
            out.append(total)
        return out
    if kind == "list":
        first, items, child = _fn("LEN", e.copy()), e, shape[1]
    elif kind == "array":  # its size is its type's
        first = exp.Case(ifs=[exp.If(this=exp.Is(this=e.copy(), expression=exp.Null()), true=_num(0))],
                         default=_num(shape[1]))
        items, child = e, shape[2]
    else:  # a map: its entries, each a struct of its key and value
        first, items = _fn("CARDINALITY", e.copy()), _fn("MAP_ENTRIES", e.copy())
        child = ("struct", [("key", shape[1]), ("value", shape[2])])
    var = exp.to_identifier(f"_dpsql_s{depth}")
    inner = _levels(exp.column(var), child, depth + 1)
    return [first] + [_fn("LIST_SUM", _fn("LIST_TRANSFORM", items.copy(), exp.Lambda(this=term, expressions=[var])))
                      for term in inner]


def _size_guard(e: exp.Expression, shape: Shape, cap: int, value: exp.Expression, depth: int) -> exp.Expression:
    """``value``, or NULL when the list, array or map ``e`` is over ``cap`` in size: its elements at every depth
    plus the stored length of each text, BLOB, BIT (in bits) and GEOMETRY inside it (:func:`_levels`). Nested
    ``CASE``s, one per depth: DuckDB evaluates a ``THEN`` only on the rows whose condition holds, so a value is
    read one depth further only while the depths before are within the cap, and the test costs at most about
    ``cap`` element reads, whatever the value holds (a conjunction could be reordered by DuckDB's adaptive filters)."""
    terms = [_fn("COALESCE", t, _num(0)) for t in _levels(e, shape, depth)]
    out = value
    for j in reversed(range(len(terms))):
        total = terms[0].copy()
        for term in terms[1:j + 1]:
            total = exp.Add(this=total, expression=term.copy())
        out = _when(exp.LTE(this=total, expression=_num(cap)), out)
    return out


def _guarded(build: Rebuild | None, shape: Shape, cap: int | None, depth: int) -> Rebuild | None:
    """``build`` (None: the value as is) of an outermost list, array or map, NULL over ``cap`` (:func:`_size_guard`)."""
    if cap is None:
        return build
    return lambda e: _size_guard(e, shape, cap, build(e) if build is not None else e, depth)


#: Valid UTF-8 (RFC 3629: no overlong form, no surrogate, nothing past U+10FFFF) as a pattern over ``HEX(bytes)``: a total
#: test, true exactly where ``DECODE`` succeeds. Text inside a list is decoded only where it holds: a failing ``TRY`` is run
#: again row by row with one exception per failing value, so under ``TRY(DECODE(...))`` alone one list of 32 000 one-byte
#: elements that are not UTF-8 cost 0.36 s of CPU (0.03 s valid), and under one ``TRY`` around the whole list each vector
#: holding one such list ran all its rows' lists again one by one (one person's 300 rows, one a vector, made a read of
#: 614 400 rows 5 s of CPU against 0.2 s).
_UTF8_HEX = ("(?:[0-7][0-9A-F]|(?:C[2-9A-F]|D[0-9A-F])[89AB][0-9A-F]|E0[AB][0-9A-F][89AB][0-9A-F]"
             "|E[1-9A-CEF][89AB][0-9A-F][89AB][0-9A-F]|ED[89][0-9A-F][89AB][0-9A-F]"
             "|F0[9AB][0-9A-F][89AB][0-9A-F][89AB][0-9A-F]|F[1-3][89AB][0-9A-F][89AB][0-9A-F][89AB][0-9A-F]"
             "|F48[0-9A-F][89AB][0-9A-F][89AB][0-9A-F])*")


def _arrow_plan(t: pa.DataType, where: str, cap: int | None, depth: int = 0, list_cap: int | None = None,
                inside: bool = False, dictionary: bool = False) -> tuple[pa.DataType, Rebuild | None]:
    """How to read a column of Arrow type ``t`` totally: the type asked of Arrow (a cast that
    cannot fail: text as bytes, temporal values as their stored integers, float16 and decimal256
    widened) and the SQL that rebuilds the value from it (None: read as is).

    DuckDB's Arrow scan converts some types while reading (seconds and milliseconds to
    microseconds, UTF-8 validation, ...) and raises on a value it cannot convert; every such type
    is rebuilt here with a total expression: a value that does not fit DuckDB's type is NULL.
    Text and BLOB values over ``cap`` bytes are NULL, at any depth; so is a list or map (not ``inside`` another)
    over ``list_cap`` in size (:func:`_size_guard`). A type that is neither known
    to read totally nor rebuilt is refused (``ConfigError``), so a new Arrow type is never read
    unchecked.

    With ``dictionary`` (a top-level column of a Parquet dataset, read with :func:`parquet_format`'s
    ``dictionary_columns``), text is read as a dictionary of bytes: DuckDB's scan receives Parquet's
    dictionary, not every row's copy of it (one person's 6 000 rows repeating one 60 000-character text are
    2.9 kB in the file and were 360 MB decoded before DuckDB saw them). Its value is ``TRY(DECODE(...))`` as
    before, inside a ``COALESCE`` that changes no value: with ``TRY`` outermost (under the cap's ``CASE`` or in a
    projection) DuckDB 2.0.1 copied each vector's 2048 texts and ran out of a 100 MB memory limit on those rows,
    inside the ``COALESCE`` it did not (``tests/test_adversary_dictionary_text.py``). A total test
    (:data:`_UTF8_HEX`) instead of ``TRY`` held the limit too, but took 4.7 s of CPU against 1.3 s there. Text that
    does not repeat pays for the dictionary pyarrow builds at each read: 1M distinct short texts, one thread,
    ``COUNT(DISTINCT ...)`` of the decoded column took 0.54 s of CPU against 0.29 s read as bytes (best of 5).
    """
    T = pa.types
    if isinstance(t, pa.BaseExtensionType):
        if t.extension_name == "arrow.uuid":  # every 16 bytes are a UUID; read as bytes because a
            # filter DuckDB pushes into a Parquet dataset has no Arrow kernel for the extension type
            return t.storage_type, lambda e: exp.TryCast(this=_fn("HEX", e), to=exp.DataType.build("UUID"))
        # Read as the storage type, rebuilt by an expression DuckDB cannot push into the scan as
        # a filter: in a Parquet dataset the file's own type stays the extension type, for which
        # Arrow has no comparison kernel (the pushed filter fails where a row group has
        # statistics, i.e. depending on the data)
        if t.extension_name == "arrow.bool8":  # a byte, true when not 0
            return t.storage_type, lambda e: exp.TryCast(this=e, to=exp.DataType.build("BOOLEAN"))
        if t.extension_name == "arrow.json":
            return _arrow_plan(t.storage_type, where, cap, depth, list_cap, inside)  # text: decoded, never pushed
        raise ConfigError(f"column {where} has extension type {t.extension_name}, which dpsql cannot read safely",
                          hint="store it as its storage type, or leave the column out of the source")
    if T.is_dictionary(t):  # decoded (a filter on a dictionary would meet the file's type too)
        return _arrow_plan(t.value_type, where, cap, depth, list_cap, inside, dictionary)
    if T.is_string(t) or T.is_large_string(t) or T.is_string_view(t):
        raw = pa.large_binary() if T.is_large_string(t) else pa.binary()
        if dictionary and not inside:
            return pa.dictionary(pa.int32(), raw), lambda e: _cap(
                e, cap, _fn("COALESCE", _fn("TRY", _fn("DECODE", e.copy())), exp.Null()))
        if inside:  # an element of a list: decoded only where its bytes are UTF-8 (:data:`_UTF8_HEX`), so no TRY fails
            return raw, lambda e: _cap(e, cap, _fn("TRY", _when(
                _fn("REGEXP_FULL_MATCH", _fn("HEX", e.copy()), exp.Literal.string(_UTF8_HEX)), _fn("DECODE", e.copy()))))
        return raw, lambda e: _cap(e, cap, _fn("TRY", _fn("DECODE", e.copy())))
    if T.is_binary(t) or T.is_large_binary(t) or T.is_binary_view(t) or T.is_fixed_size_binary(t):
        return t, (None if cap is None else (lambda e: _cap(e, cap)))
    if T.is_timestamp(t):
        make = "MAKE_TIMESTAMPTZ" if t.tz is not None else "MAKE_TIMESTAMP"
        unit = t.unit
        return pa.int64(), lambda e: _fn(make, _to_us(e, unit, TS_MIN_US, TS_MAX_US))
    if T.is_date64(t):  # milliseconds; DuckDB's DATE counts days in 32 bits
        ms_lo, ms_hi = DATE_MIN_DAY * 86_400_000, DATE_MAX_DAY * 86_400_000 + 86_399_999
        days = lambda e: exp.IntDiv(this=exp.paren(exp.Sub(this=_clamp(e, ms_lo, ms_hi), expression=_num(ms_lo))),  # noqa: E731
                                    expression=_num(86_400_000))
        return pa.int64(), lambda e: _when(_in_range(e.copy(), ms_lo, ms_hi), _fn(
            "MAKE_DATE", exp.Cast(this=exp.Add(this=days(e), expression=_num(DATE_MIN_DAY)),
                                  to=exp.DataType.build("INTEGER"))))
    if T.is_time(t):  # DuckDB's TIME: 0 to 24:00:00 (a stored value outside is NULL)
        unit = t.unit
        read = pa.int32() if T.is_time32(t) else pa.int64()
        return read, lambda e: exp.Add(this=exp.Cast(this=exp.Literal.string("00:00:00"), to=exp.DataType.build("TIME")),
                                       expression=_fn("TO_MICROSECONDS", _to_us(exp.Cast(this=e, to=exp.DataType.build("BIGINT")),
                                                                              unit, 0, _DAY_US - 1)))
    if T.is_duration(t):
        unit = t.unit
        return pa.int64(), lambda e: _fn("TO_MICROSECONDS", _to_us(e, unit, -(2**63) + 1, 2**63 - 1))
    if T.is_float16(t):
        return pa.float32(), None  # exact; DuckDB does not read float16
    if T.is_decimal(t) and t.bit_width > 128:
        return pa.float64(), None  # DuckDB has no 256-bit DECIMAL; every such value fits a DOUBLE
    if T.is_decimal(t):
        return t, _decimal_in_range(t.precision, t.scale)
    if T.is_date32(t):
        rebuild = _temporal_in_range("date")
        assert rebuild is not None
        return t, rebuild
    if T.is_null(t) or T.is_boolean(t) or T.is_integer(t) or T.is_floating(t) or T.is_interval(t):
        return t, None
    if T.is_list(t) or T.is_large_list(t) or T.is_fixed_size_list(t) or T.is_list_view(t) or T.is_large_list_view(t):
        def outermost(b: Rebuild | None, read: pa.DataType) -> Rebuild | None:
            return b if inside else _guarded(b, _arrow_shape(read, where), list_cap, depth)

        read, build = _arrow_plan(t.value_type, where, cap, depth + 1, list_cap, True)
        if build is None and read.equals(t.value_type):
            return t, outermost(None, t)
        if T.is_list_view(t) or T.is_large_list_view(t):
            raise ConfigError(f"column {where} has type {t}: its elements need a conversion that list views do not allow",
                              hint="store it as a list (pa.list_), or leave the column out of the source")
        var = exp.to_identifier(f"_dpsql_x{depth}")
        body = build(exp.column(var)) if build is not None else exp.column(var)
        outer = pa.large_list(read) if T.is_large_list(t) else pa.list_(read)
        return outer, outermost(lambda e: _fn("LIST_TRANSFORM", e, exp.Lambda(this=body.copy(), expressions=[var])), outer)
    if T.is_struct(t):
        plans = [(t.field(i).name, t.field(i).type, *_arrow_plan(t.field(i).type, where, cap, depth + 1, list_cap, inside))
                 for i in range(t.num_fields)]
        if all(b is None and r.equals(ft) for _, ft, r, b in plans):
            return t, None

        def struct(e: exp.Expression) -> exp.Expression:
            parts = []
            for name, _, _, b in plans:
                sub: exp.Expression = exp.Dot(this=e.copy(), expression=exp.to_identifier(name, quoted=True))
                parts.append(exp.PropertyEQ(this=exp.to_identifier(name, quoted=True), expression=b(sub) if b else sub))
            # a NULL struct stays NULL (not a struct of NULL fields)
            return _when(exp.Not(this=exp.Is(this=e.copy(), expression=exp.Null())), exp.Struct(expressions=parts))

        return pa.struct([pa.field(n, r) for n, _, r, _ in plans]), struct
    children: list[pa.DataType] = []
    if T.is_map(t):
        children = [t.key_type, t.item_type]
    elif T.is_union(t):
        children = [t.field(i).type for i in range(t.num_fields)]
    elif T.is_run_end_encoded(t):
        children = [t.value_type]
    else:
        raise ConfigError(f"column {where} has type {t}, which dpsql cannot read safely",
                          hint="convert it to a supported type (numbers, text, binary, dates, timestamps, lists, "
                               "structs), or leave the column out of the source")
    if all(_arrow_plan(c, where, cap, depth + 1, list_cap, True) == (c, None) for c in children):
        if T.is_map(t):
            # DuckDB's Arrow scan raises on a map holding a key twice (Arrow allows it): read as
            # its entries, a list of structs, which DuckDB does not check
            entry = pa.list_(pa.struct([pa.field("key", t.key_type), pa.field("value", t.item_type)]))
            return entry, (None if inside else _guarded(None, _arrow_shape(entry, where), list_cap, depth))
        _arrow_shape(t, where)  # a union or run-end-encoded array holding a list is refused
        return t, None
    raise ConfigError(
        f"column {where} has type {t}: the text, binary or temporal values inside this type cannot be read safely",
        hint="store it as a plain column, a list or a struct (a map as a list of structs), or leave the column out of the source",
    )


#: Operators of DuckDB's plans (``EXPLAIN``'s names, physical and logical) that compute on their children's rows
#: and read nothing themselves.
_ROW_OPERATORS = frozenset({
    "PROJECTION", "FILTER", "ORDER_BY", "LIMIT", "LIMIT_PERCENT", "STREAMING_LIMIT", "TOP_N", "SAMPLE",
    "RESERVOIR_SAMPLE", "STREAMING_SAMPLE", "WINDOW", "STREAMING_WINDOW", "AGGREGATE", "UNGROUPED_AGGREGATE",
    "HASH_GROUP_BY", "PERFECT_HASH_GROUP_BY", "PARTITIONED_AGGREGATE", "DISTINCT", "PIVOT", "UNION", "EXCEPT",
    "INTERSECT", "JOIN", "COMPARISON_JOIN", "ANY_JOIN", "DEPENDENT_JOIN", "DELIM_JOIN", "LEFT_DELIM_JOIN",
    "RIGHT_DELIM_JOIN", "HASH_JOIN", "NESTED_LOOP_JOIN", "BLOCKWISE_NL_JOIN", "PIECEWISE_MERGE_JOIN", "IE_JOIN",
    "ASOF_JOIN", "CROSS_PRODUCT", "POSITIONAL_JOIN", "POSITIONAL_SCAN", "CTE", "REC_CTE", "REC_KEY_CTE",
})
#: Leaves and table functions that read DuckDB's own stored tables (of the connection's databases, attached
#: DuckDB files and temporary tables included), or make values of their own from the query's constants and the
#: rows above (VALUES, ``range``, ``unnest``, a CTE's rows): SEQ_SCAN and INDEX_SCAN are DuckDB's table scans
#: (``Table``: the table; an extension's catalog, SQLite, Postgres, ..., scans through its own function).
_SAFE_SCANS = frozenset({
    "SEQ_SCAN", "INDEX_SCAN", "DUMMY_SCAN", "EMPTY_RESULT", "COLUMN_DATA_SCAN", "CHUNK_SCAN", "CHUNK_GET",
    "EXPRESSION_SCAN", "EXPRESSION_GET", "CTE_SCAN", "REC_CTE_SCAN", "REC_REC_CTE_SCAN", "DELIM_SCAN", "DELIM_GET",
    "RANGE", "GENERATE_SERIES", "UNNEST",
})


def reading_scans(plan_json: str) -> list[str]:
    """The operators of a plan (DuckDB's ``EXPLAIN (FORMAT JSON)``) that dpsql does not read: every scan and table
    function other than those of :data:`_SAFE_SCANS`, and every operator neither there nor in
    :data:`_ROW_OPERATORS` (an extension's operator, one of a later DuckDB). An allow-list: a table function is
    named by its function in the plan, so any reader, DuckDB's or an extension's, is refused by its name.

    Refused so, among others: a Python object registered with the connection (``con.register(name,
    arrow_table)``, a data frame), a file read through DuckDB's own readers (``read_parquet``, ``read_csv``,
    ``read_text``, ...), an extension's scan (``postgres_scan``, ``sqlite_scan``, ``st_read``, ``read_xlsx``,
    a remote file). Such readers convert values while reading and raise on some: DuckDB's Arrow scan on a duration
    of 2^62 ms, and it trusts the text to be UTF-8, so ``lower``, ``trim`` or ``strpos`` of a text that is not
    raised DuckDB's internal error, which invalidates the database; the Parquet reader on such text, the CSV reader
    on a line it cannot parse (and its sniffer types columns from the rows), the SQLite scanner on a value whose
    type differs from its column's declared type (SQLite stores any type anywhere). The owner's relations must
    never read through one: :func:`_arrow_plan` reads an Arrow table or a Parquet file passed to ``register``
    totally, and a CSV file is read as its lines (``dpsql.engine._duckdb_csv``). DuckDB's own table functions
    that read no person's values (``duckdb_settings()``, ``glob``, ``pragma_*``) are refused too: no private
    table is made of them."""
    import json

    found: list[str] = []
    todo: list[Any] = [json.loads(plan_json)]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        info = node.get("extra_info")
        info = info if isinstance(info, dict) else {}
        name = str(node.get("name") or "").strip().upper()
        function = str(info.get("Function") or "").strip().upper()
        bad: str | None = None
        if function and function not in _SAFE_SCANS:
            bad = function  # a table function (the operator is named after it, or TABLE_SCAN)
        elif name == "INOUT_FUNCTION":  # a table function over rows: ``Name`` is the function
            inout = str(info.get("Name") or "").strip().upper()
            bad = None if inout in _SAFE_SCANS else (inout or name)
        elif name == "TABLE_SCAN":
            bad = None if function else name
        elif name not in _SAFE_SCANS and name not in _ROW_OPERATORS:
            bad = name
        if bad is not None and bad not in found:
            found.append(bad)
        todo.extend(node.get("children") or [])
    return found


def _duck_plan(t: Any, where: str, cap: int | None, depth: int = 0, list_cap: int | None = None,
               inside: bool = False) -> Rebuild | None:
    """The SQL that reads a column of a DuckDB type (a ``DuckDBPyType``) totally, or None.

    For the owner's DuckDB tables and DuckDB's own Parquet reader: text (VARCHAR, JSON) and BLOB
    over ``cap`` bytes, a BIT of more than ``cap`` bits (its text, one character per bit, longer
    than ``cap``) and a GEOMETRY whose WKB is over ``cap`` bytes, are NULL at any depth; a DECIMAL
    beyond its precision, and a timestamp or TIME beyond the range of :func:`_temporal_in_range`, are NULL (a later conversion or
    negation would raise); TIMESTAMP_S/_MS/_NS are read as TIMESTAMP. A LIST, ARRAY or MAP (not ``inside``
    another) over ``list_cap`` in size is NULL (:func:`_size_guard`).
    """
    tid = t.id

    def outermost(b: Rebuild | None) -> Rebuild | None:
        return b if inside else _guarded(b, _duck_shape(t, where), list_cap, depth)

    if tid == "varchar":
        return None if cap is None else (lambda e: _cap(e, cap, fn="STRLEN"))
    if tid == "blob":
        return None if cap is None else (lambda e: _cap(e, cap))
    if tid == "bit":  # counted and listed as its salted text: one character per bit
        return None if cap is None else (lambda e: _cap(e, cap, fn="BIT_LENGTH"))
    if tid == "geometry":  # stored as WKB; counted and listed as its WKT text (at most ~3 characters a byte)
        return None if cap is None else (lambda e: _cap(exp.cast(e, "BLOB"), cap, value=e))
    if tid == "decimal":
        return _decimal_in_range(*(int(v) for _, v in t.children))
    temporal = _temporal_in_range(tid)
    if temporal is not None:
        return temporal
    if tid in ("list", "array"):
        build = _duck_plan(t.children[0][1], where, cap, depth + 1, list_cap, True)
        if build is None:
            return outermost(None)
        var = exp.to_identifier(f"_dpsql_x{depth}")
        body = build(exp.column(var))
        return outermost(lambda e: _fn("LIST_TRANSFORM", e, exp.Lambda(this=body.copy(), expressions=[var])))
    if tid == "struct":
        plans = [(name, _duck_plan(ft, where, cap, depth + 1, list_cap, inside)) for name, ft in t.children]
        if all(b is None for _, b in plans):
            return None

        def struct(e: exp.Expression) -> exp.Expression:
            parts = []
            for name, b in plans:
                sub: exp.Expression = exp.Dot(this=e.copy(), expression=exp.to_identifier(name, quoted=True))
                parts.append(exp.PropertyEQ(this=exp.to_identifier(name, quoted=True), expression=b(sub) if b else sub))
            return _when(exp.Not(this=exp.Is(this=e.copy(), expression=exp.Null())), exp.Struct(expressions=parts))

        return struct
    if tid == "map":
        (_, kt), (_, vt) = t.children
        kb, vb = _duck_plan(kt, where, cap, depth + 1, list_cap, True), _duck_plan(vt, where, cap, depth + 1, list_cap, True)
        if kb is None and vb is None:
            return outermost(None)
        if kt.id in ("varchar", "blob", "bit") or kb is None:
            return outermost(_map_rebuild(kt.id, kb is not None, vb, cap, depth))
    if tid in ("map", "union"):
        if all(_duck_plan(ct, where, cap, depth + 1, list_cap, True) is None for _, ct in t.children):
            _duck_shape(t, where)  # a union holding a list is refused
            return None
        raise ConfigError(
            f"column {where} has type {t}: values inside it cannot be capped at max_text_bytes",
            hint="store it as a list of structs, or leave the column out of the source",
        )
    return None


def _map_rebuild(key_id: str, cap_keys: bool, vb: Rebuild | None, cap: int | None, depth: int) -> Rebuild:
    """A DuckDB MAP with its values rebuilt; a key cannot be NULL, so a map holding a key over
    the cap is NULL as a whole."""
    var = exp.to_identifier(f"_dpsql_x{depth}")
    kvar = exp.to_identifier(f"_dpsql_k{depth}")

    def rebuild(e: exp.Expression) -> exp.Expression:
        entry = exp.column(var)
        key = exp.Dot(this=entry.copy(), expression=exp.to_identifier("key", quoted=True))
        value = exp.Dot(this=entry.copy(), expression=exp.to_identifier("value", quoted=True))
        body = exp.Struct(expressions=[
            exp.PropertyEQ(this=exp.to_identifier("key", quoted=True), expression=key),
            exp.PropertyEQ(this=exp.to_identifier("value", quoted=True), expression=vb(value) if vb else value),
        ])
        out = (e if vb is None else
               _fn("MAP_FROM_ENTRIES", _fn("LIST_TRANSFORM", _fn("MAP_ENTRIES", e.copy()),
                                           exp.Lambda(this=body, expressions=[var]))))
        if not cap_keys or cap is None:
            return out
        size = _fn({"blob": "OCTET_LENGTH", "bit": "BIT_LENGTH"}.get(key_id, "STRLEN"), exp.column(kvar))
        longest = _fn("COALESCE", _fn("LIST_MAX", _fn("LIST_TRANSFORM", _fn("MAP_KEYS", e.copy()),
                                                      exp.Lambda(this=size, expressions=[kvar]))), _num(0))
        return _when(exp.LTE(this=longest, expression=_num(cap)), out)

    return rebuild


#: Parquet types DuckDB's own reader (``invalid_text = "replace"``) reads without converting in
#: a way that can fail (an allow-list of logical and legacy converted types). Refused, among
#: others: timestamps in milliseconds and INT96 (converted to microseconds, out of range raises),
#: TIME (validated), JSON (parsed).
_PARQUET_SAFE_LOGICAL = ("StringType", "MapType", "ListType", "EnumType", "DecimalType", "DateType", "IntType",
                         "NullType", "UUIDType", "Float16Type", "TimestampType")
_PARQUET_SAFE_CONVERTED = frozenset({
    "UTF8", "MAP", "MAP_KEY_VALUE", "LIST", "ENUM", "DECIMAL", "DATE", "TIMESTAMP_MICROS", "INTERVAL",
    "UINT_8", "UINT_16", "UINT_32", "UINT_64", "INT_8", "INT_16", "INT_32", "INT_64",
})


def _parquet_unsafe(ptype: Any, converted: Any, logical: Any) -> str | None:
    """What DuckDB's own reader could fail on in a Parquet leaf, or None when it reads totally."""
    if str(ptype) == "INT96":
        return "an INT96 timestamp"
    if logical is not None:
        kind = str(logical).split("(", 1)[0]
        if kind not in _PARQUET_SAFE_LOGICAL:
            return f"logical type {kind}"
        if kind == "TimestampType" and "MILLIS=MilliSeconds" in str(logical):
            return "a timestamp in milliseconds"
        return None
    if converted is not None and str(converted) not in _PARQUET_SAFE_CONVERTED:
        return f"converted type {converted}"
    return None


def _csv_unquote(col: exp.Expression) -> exp.Expression:
    """A field written as "..." without its quotes ("" inside stands for one "); total."""
    # cheapest and most selective test first: DuckDB evaluates the rest only where it holds
    quoted = exp.and_(
        exp.func("starts_with", col.copy(), exp.Literal.string('"')),
        exp.func("ends_with", col.copy(), exp.Literal.string('"')),
        exp.GTE(this=exp.func("strlen", col.copy()), expression=exp.Literal.number(2)),
    )
    inner = exp.func(
        "replace",
        exp.func("substring", col.copy(), exp.Literal.number(2),
                 exp.Sub(this=exp.func("length", col.copy()), expression=exp.Literal.number(2))),
        exp.Literal.string('""'),
        exp.Literal.string('"'),
    )
    return exp.Case(ifs=[exp.If(this=quoted, true=inner)], default=col.copy())


def _csv_header(path: str, delim: str, encoding: str = "utf-8") -> list[str]:
    """Column names from the header line of a CSV file (never from a data row), in ``encoding``."""
    # errors are raised outside the except blocks: no chained exception quotes the file
    opener: Callable[..., Any] = gzip.open if path.lower().endswith(".gz") else open
    raw: bytes | None = None
    problem = ""
    try:
        with opener(path, "rb") as f:
            raw = f.readline(1 << 20)
    except (gzip.BadGzipFile, zlib.error):  # (a BadGzipFile is an OSError) there, but no gzip stream or a damaged one
        problem = "damaged"
    except EOFError:  # the gzip stream ends before its first line does: still being written?
        problem = "EOFError"
    except IsADirectoryError:  # there, but no file: the caller's mistake (a retry fails again)
        problem = "directory"
    except OSError as e:
        problem = type(e).__name__
    if problem == "damaged":
        raise ConfigError(f"cannot read CSV file {path!r}: it is not a gzip file, or a damaged one (its name ends in .gz)",
                          hint="compress the file with gzip, or name an uncompressed CSV file without the .gz extension")
    if problem == "directory":
        raise ConfigError(f"cannot read CSV file {path!r}: it is a directory, not a CSV file",
                          hint="name the CSV files with a glob that matches only files, e.g. 'dir/*.csv'")
    if raw is None:  # not there (yet), not readable, or still being written: a retry may read it
        raise InputUnavailableError(f"cannot read CSV file {path!r} ({problem})" + (
            ": its gzip stream ends before its first line (still being written?)" if problem == "EOFError" else ""),
                                    hint="check that the file exists and is readable (and, for a .gz file, written whole)")
    nothing = raw == b"" and opener is open  # (no byte at all: not even a byte-order mark, nor a gzip stream)
    if raw.startswith(b"\xef\xbb\xbf") and encoding == "utf-8":
        raw = raw[3:]
    line: str | None = None
    try:
        line = raw.decode(encoding)
    except UnicodeDecodeError:
        pass
    if line is None:
        raise ConfigError(f"the header line of {path!r} is not valid UTF-8",
                          hint='save the CSV file as UTF-8, or, for a file in ISO-8859-1, set the engine setting '
                               'csv_encoding = "latin-1" ([engine] in dpsql.toml, or Session(engine={"csv_encoding": '
                               '"latin-1"}))')
    line = line[:-1] if line.endswith("\n") else line
    line = line[:-1] if line.endswith("\r") else line
    if "\r" in line:  # the rows are read with a lone \r as a space (``dpsql.engine._duckdb_csv``)
        raise ConfigError(f"the header line of {path!r} holds a carriage return not followed by a line feed",
                          hint="CSV lines must end in \\n or \\r\\n (a file whose lines end in \\r alone "
                               "would read as one line): convert the file, e.g. tr '\\r' '\\n'")
    names = []
    try:
        names = next(csv.reader(io.StringIO(line), delimiter=delim, quotechar='"'), [])
    except csv.Error:
        pass
    names = [n.strip() for n in names]
    if not raw:
        # (a plain file read as empty and holding bytes now was written since: a job writing it, as one still empty)
        if _zero_bytes(path, read_empty=nothing):  # nothing written yet (a job that writes it has opened it): a retry may read it, as a
            # gzip stream cut short or a Parquet file without its footer (an input not there yet, exit 66)
            raise InputUnavailableError(f"the CSV file {path!r} is empty (0 bytes): it has no header line (still being "
                                        "written?)", hint="the first line of a CSV source must be its header, e.g. "
                                        "user_id,amount,country; if a job is writing the file, retry once it is written")
        own = _own_stream_note(path)
        raise ConfigError(f"the CSV file {path!r} is empty: it has no header line{own}",
                          hint="the first line of a CSV source must be its header, e.g. user_id,amount,country" + (
                              "; redirect the command's output to a file the source's path or glob does not name"
                              if own else ""))
    if not names or any(not n for n in names):
        raise ConfigError(f"the header line of {path!r} needs a non-empty name for every column",
                          hint="the first line of a CSV source must be its header, e.g. user_id,amount,country")
    seen: dict[str, str] = {}
    for n in names:
        if (first := seen.get(n.lower())) is not None:
            raise ConfigError(f"the header line of {path!r} repeats a column name: {first!r} and {n!r} (names are "
                              "compared case-insensitively)", hint="rename one of them in the header")
        seen[n.lower()] = n
    return names


#: characters DuckDB's file readers read as a glob pattern inside a file name
GLOB_CHARS = frozenset("*?[]{}")


def has_glob_chars(paths: list[str]) -> bool:
    """Whether DuckDB's readers would expand one of these (already expanded) file names again."""
    return any(ch in GLOB_CHARS for p in paths for ch in p)


def _literal_files(name: str, paths: list[str]) -> list[str]:
    """``paths`` for DuckDB's own readers, which expand a glob pattern inside every name they get: a
    file named like ``[ab].csv`` would read ``a.csv`` and ``b.csv`` instead (other rows than the
    files matched at registration). Refused, with nothing read."""
    if has_glob_chars(paths):
        raise ConfigError(f"table '{name}': a file name holds a glob character ({' '.join(sorted(GLOB_CHARS))}), which "
                          "DuckDB's reader would expand into other files",
                          hint="rename the file(s), or (Parquet) keep the default invalid_text = \"null\", which reads "
                               "each matched file as it is")
    return paths


def _type_class(t: pa.DataType) -> str:
    """A Parquet column's Arrow type up to the encodings that convert totally into each other
    (dictionary or not, 32- or 64-bit offsets)."""
    if pa.types.is_dictionary(t):
        return _type_class(t.value_type)
    if pa.types.is_large_string(t):
        return str(pa.string())
    if pa.types.is_large_binary(t):
        return str(pa.binary())
    return str(t)


#: The unit Parquet INT96 timestamps (the legacy type of Spark, Hive and Impala) are read in: pyarrow's
#: default, nanoseconds, silently wraps every instant outside 1677-09-22 .. 2262-04-11 (9999-12-31, the
#: usual "end of time", read as 1816-03-29); microseconds hold DuckDB's whole TIMESTAMP range exactly
#: (an instant beyond about 292 000 years from 1970, which only a forged file holds, still wraps: a
#: property of that one value, never a failure). tests/test_adversary_parquet_int96.py
INT96_UNIT = "us"


def parquet_format(target: pa.Schema | None = None) -> Any:
    """The pyarrow dataset format every Parquet source is read with (INT96 in :data:`INT96_UNIT`); the
    top-level columns ``target`` reads as dictionaries (text, :func:`_arrow_plan`) keep Parquet's dictionaries."""
    import pyarrow.dataset as ds

    keep = {f.name for f in target if pa.types.is_dictionary(f.type)} if target is not None else set()
    return ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit=INT96_UNIT,
                                                                    dictionary_columns=keep))


def parquet_schema(path: str) -> pa.Schema:
    """A Parquet file's Arrow schema as :func:`parquet_format` reads it (its footer only)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, coerce_int96_timestamp_unit=INT96_UNIT).schema_arrow


#: the most bytes a Parquet DECIMAL may be stored in: 16 hold every 38-digit value, the most either engine reads
DECIMAL_MAX_BYTES = 16


def decimal_storage_problem(name: str, leaves: list[tuple[str, str, int, int]]) -> None:
    """Refuse a Parquet source storing a DECIMAL (at any depth) in a way a reader cannot read totally, from the
    files' footers only: ``leaves`` are each file's DECIMAL leaves as (dotted path, physical type, length,
    precision).

    A DECIMAL stored as variable-length BINARY (as parquet-avro writes an Avro ``bytes`` decimal) can hold any
    number of bytes in any value: pyarrow's reader (the DuckDB engine's) raised on one of more than 16 bytes and
    Spark's on one beyond its precision, so whether a query failed after its charge depended on one person's
    value. A DECIMAL of at most 38 digits stored in a FIXED_LEN_BYTE_ARRAY of more than :data:`DECIMAL_MAX_BYTES`
    bytes pyarrow cannot read at all (every query reading the table failed after its charge; a wider DECIMAL is
    read as a 256-bit one, in at most 32 bytes). Both are refused by both engines, before any row is read."""
    why = decimal_storage_reason(leaves)
    if why is not None:
        raise ConfigError(f"table '{name}': the Parquet files store {why}; a stored value beyond its precision would "
                          "make reads fail",
                          hint="rewrite the files with a fixed DECIMAL encoding (e.g. pyarrow's decimal128, which "
                               "stores it as INT32, INT64 or a FIXED_LEN_BYTE_ARRAY of at most 16 bytes), or leave "
                               "the column out of the files")


def decimal_storage_reason(leaves: list[tuple[str, str, int, int]]) -> str | None:
    """How the first DECIMAL leaf that no reader reads totally is stored (:func:`decimal_storage_problem`), or None."""
    for path, physical, length, precision in leaves:
        most = DECIMAL_MAX_BYTES if precision <= 38 else 32
        if physical == "BYTE_ARRAY" or physical == "BINARY":
            return f"the DECIMAL column '{path}' as variable-length BINARY, whose values can hold any number of digits"
        if physical == "FIXED_LEN_BYTE_ARRAY" and length > most:
            return (f"the DECIMAL column '{path}' in {length} bytes, more than the {most} that hold every "
                    f"{38 if most == 16 else 76}-digit value")
    return None


def parquet_decimal_leaves(path: str) -> list[tuple[str, str, int, int]]:
    """A Parquet file's DECIMAL leaves, (dotted path, physical type, length, precision), from its footer."""
    import pyarrow.parquet as pq

    schema = pq.ParquetFile(path).schema
    out = []
    for i in range(len(schema)):
        c = schema.column(i)
        if c.converted_type == "DECIMAL" or c.logical_type.type == "DECIMAL":
            out.append((c.path, str(c.physical_type), int(c.length or 0), int(c.precision)))
    return out


def _footer(name: str, path: str, read: Callable[[str], Any]) -> Any:
    """``read(path)`` of a Parquet file's footer; a path that is no Parquet file is refused naming it (and, for a
    directory, the glob of its files). The file's name is the owner's; no byte of it is quoted."""
    import os

    if os.path.isdir(path):
        glob = os.path.join(path, "*.parquet")
        raise ConfigError(f"table '{name}': {path!r} is a directory, not a Parquet file",
                          hint=f"name its files with a glob: register('{name}', '{glob}', ...), --table {name}='{glob}' "
                               f"(or source = \"{glob}\" under [tables.{name}] in the config)")
    try:
        return read(path)
    except (OSError, pa.ArrowException) as e:
        gone = isinstance(e, OSError) and not isinstance(e, pa.ArrowException)  # not there, or not readable
        empty = not gone and _zero_bytes(path)  # created, nothing written yet: as an incomplete one, a retry may read it
        partial = not gone and (empty or _partial_parquet(path))  # being written by another job: a retry may read it whole
        why = ("" if gone else ": it is empty (0 bytes: still being written?)" if empty else ": it is an incomplete Parquet "
               "file (its header is there, no footer yet: still being written?)" if partial else ": it is not a Parquet file"
               + _own_stream_note(path))
        raise (InputUnavailableError if gone or partial else ConfigError)(f"table '{name}': cannot read {path}{why} ({type(e).__name__})",
                          hint="check that the file exists, is readable and is valid Parquet; a glob must match "
                               "only Parquet files (e.g. 'dir/*.parquet', not 'dir/*')") from None


def _zero_bytes(path: str, *, read_empty: bool = False) -> bool:
    """Whether ``path`` is a regular file of no bytes named as a data file (.parquet, .csv, ...): created by a job that
    has not written it yet. A marker of no bytes that a glob may match (Spark's ``_SUCCESS``) is no data file.
    ``read_empty``: the caller read the file (uncompressed) and found no byte, so it had none then: one that has
    bytes now is being written too (they came between the read and this check)."""
    import os
    import stat

    if not path.lower().endswith((".parquet", ".pq", ".csv", ".tsv", ".csv.gz", ".tsv.gz")):
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    if own_stream(st) is not None:  # the process's own standard output or error redirected onto it (``>> data/part-2.csv``,
        # ``2> data/x.csv``, which made it): no job is writing it, and a retry would make it again (refused as any other
        # empty source, exit 2)
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_size == 0 or read_empty) and pseudo_file_system(st) is None


#: file systems whose regular files are made by the kernel as they are read: their size says 0 whatever they hold
_PSEUDO_FILE_SYSTEMS = frozenset({"proc", "sysfs", "debugfs", "tracefs", "securityfs", "configfs", "cgroup", "cgroup2",
                                  "pstore", "bpf", "efivarfs", "fusectl", "binfmt_misc", "devpts", "mqueue"})


def pseudo_file_system(st: Any) -> str | None:
    """The type of the kernel's pseudo file system (``proc``, ``sysfs``, ...) a file of ``st`` is on, else None: such a
    file reports 0 bytes and holds text when read, so 0 bytes there says nothing of a job still writing it (a retry
    finds it alike). From the mount table of Linux (``/proc/self/mountinfo``, the device of each mount); None where
    there is none to read."""
    import os

    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == dev and " - " in line:
                    kind = line.split(" - ", 1)[1].split()[0]
                    if kind in _PSEUDO_FILE_SYSTEMS:
                        return kind
    except OSError:
        return None
    return None


def own_stream(st: Any) -> str | None:
    """Which of this process's own output streams (standard output, standard error) is the file of ``st``
    (an ``os.stat`` result), or None."""
    import os

    for fd, stream in ((1, "standard output"), (2, "standard error")):
        try:
            if os.path.samestat(st, os.fstat(fd)):
                return stream
        except (OSError, ValueError):
            pass
    return None


def _own_stream_note(path: str) -> str:
    """`` (this process's own standard error, redirected onto it)`` where ``path`` is one of its output streams."""
    import os

    try:
        stream = own_stream(os.stat(path))
    except OSError:
        return ""
    return "" if stream is None else f" (it is this process's own {stream}, redirected onto it)"


def _partial_parquet(path: str) -> bool:
    """Whether ``path`` starts as a Parquet file does (its magic bytes) but does not end as one: the footer, written
    last, is missing (a file another job is still writing in place)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0, 2)
            if f.tell() < 8:
                return head == b"PAR1"
            f.seek(-4, 2)
            return head == b"PAR1" and f.read(4) != b"PAR1"
    except OSError:
        return False


def _distinct_names(name: str, names: list[str]) -> None:
    """Refuse a source with two columns whose names differ only in case (free: its schema only).
    DuckDB compares column names case-insensitively: the view's ``"a"`` bound the raw ``"A"``
    (text read as bytes) and renamed the second one ``a_1``, so the catalog typed a column as
    another's type and exposed the undecoded, uncapped bytes of a text column."""
    seen: dict[str, str] = {}
    for i, n in enumerate(names):
        if not n or "\x00" in n:  # (DuckDB could not bind a view over it: "cannot read table source ... check that the file exists")
            raise ConfigError(f"table '{name}': its column {i + 1} (of {len(names)}) has "
                              f"{'a NUL character in its name' if n else 'an empty name'}, which SQL cannot name",
                              hint="rename the column in the source (e.g. table.rename_columns(...) for an Arrow table), or "
                              "drop it, before registering it")
        other = seen.get(n.lower())
        seen[n.lower()] = n
        if other is not None:
            raise ConfigError(
                f"table '{name}': two columns are named {other!r} and {n!r}, which SQL does not tell apart (names "
                "are compared case-insensitively)",
                hint="rename or drop one of them before registering the source",
            )


def _same_file_types(name: str, paths: list[str]) -> None:
    """Refuse a multi-file Parquet source whose files store a column under different types (footers
    only). Both readers convert every file to the first file's types with a checked cast, which
    fails on a value that does not fit (2^40 in an int32 column, 1.5 in an int64 one): whether a
    query failed would then depend on one cell. A column missing from some file reads as NULL; one named
    there in another case (``AGE`` for ``age``) is refused. A DECIMAL
    stored in a way no reader reads totally is refused too (:func:`decimal_storage_problem`)."""
    for p in paths:
        decimal_storage_problem(name, _footer(name, p, parquet_decimal_leaves))
    schema = _footer(name, paths[0], parquet_schema)
    _distinct_names(name, schema.names)  # (Arrow's dataset refused a repeated name: "cannot read table source")
    if len(paths) < 2:
        return
    first = {f.name: f.type for f in schema}
    folded = {n.lower(): n for n in first}
    extra: dict[str, list[str]] = {}  # file -> its columns the first file lacks
    for p in paths[1:]:
        later = _footer(name, p, parquet_schema)
        _distinct_names(name, later.names)
        if more := [n for n in later.names if n not in first and n.lower() not in folded]:
            extra[p] = more
        for f in later:
            t = first.get(f.name)
            if t is None and f.name.lower() in folded:
                # DuckDB's reader matches names case-insensitively (and casts to the first file's type), the
                # Arrow view exactly (the column NULL in this file): neither may decide the rows read
                raise ConfigError(
                    f"table '{name}': column '{f.name}' in {p} is named '{folded[f.name.lower()]}' in {paths[0]}; "
                    "names differing only in case are one column to DuckDB's reader and two to Arrow's",
                    hint="write every file with the same column names, or register the files as separate tables")
            if t is not None and _type_class(t) != _type_class(f.type):
                raise ConfigError(
                    f"table '{name}': column '{f.name}' is {f.type} in {p} but {t} in {paths[0]}; a value of one "
                    "type that does not fit the other would make reads fail",
                    hint="write every file with the same column types (cast the column when writing), or register "
                         "the files as separate tables")
    if extra:  # the table has the first file's columns: these were dropped without a word
        p, cols = next(iter(extra.items()))
        also = f" (and {len(extra) - 1} other file(s))" if len(extra) > 1 else ""
        warnings.warn(f"table '{name}': column(s) {', '.join(repr(n) for n in cols)} of {p}{also} are not in {paths[0]}, "
                      "the first file of the source, whose columns the table has: they are not read (write every file "
                      "with the same columns, or register the files as separate tables)", stacklevel=2)


def _expand(source: str) -> list[str]:
    """The files of a source path (a glob is expanded once, sorted)."""
    if not any(ch in source for ch in "*?["):
        return [source]
    import glob

    paths = sorted(glob.glob(source))
    if not paths:
        raise InputUnavailableError(f"no file matches {source!r}")
    return paths



def _temp_view(view: str, sel: exp.Expression) -> exp.Create:
    return exp.Create(
        this=exp.to_table(view, quoted=True),
        kind="VIEW",
        expression=sel,
        replace=True,
        properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
    )


# -- views of a caller's connection ---------------------------------------------------------------------------------

#: the nodes of a view's expression that compute nothing that can fail: a column, a literal, a comparison of them (a
#: TRY_CAST and ``try(...)`` are total whatever they hold); anything else is computed by DuckDB as the view reads a row
_PLAIN_VIEW_NODES: tuple[type[exp.Expression], ...] = (
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Star, exp.Alias, exp.Paren, exp.Table,
    exp.TableAlias, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.In, exp.Not, exp.And, exp.Or,
    exp.Tuple)


def _computed(node: exp.Expression) -> bool:
    """Whether ``node`` computes something whose reading of a row could fail (a CAST, arithmetic, a function)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, exp.TryCast) or (isinstance(n, exp.Anonymous) and str(n.this).lower() == "try"):
            continue
        if not isinstance(n, _PLAIN_VIEW_NODES):
            return True
        stack.extend(n.iter_expressions())
    return False


def view_computations(views: dict[str, str], source: str, *, limit: int = 6) -> list[str]:
    """What the view ``source`` and the views it reads compute (at most ``limit`` items, named by view and column,
    never quoting the definition, whose literals may be data), from ``views`` (a view's name, lower case, to its
    ``CREATE VIEW`` text, as ``duckdb_views()`` has it): its output columns and its conditions (WHERE, ON, HAVING) that
    are more than columns, literals and comparisons of them, and so computed by DuckDB row by row as the view is read.
    Empty for a table, or a view that only selects and filters. Reads the definitions only."""
    import sqlglot

    found: list[str] = []
    todo, seen = [source.split(".")[-1].strip('"').lower()], set[str]()
    while todo and len(found) < limit and len(seen) < 32:
        name = todo.pop()
        if name in seen or name not in views:
            continue
        seen.add(name)
        try:
            tree = sqlglot.parse_one(views[name], read="duckdb")
        except Exception:  # sqlglot cannot read DuckDB's text of this view: the whole view is said to compute
            found.append(f"view {name}")
            continue
        for sel in tree.find_all(exp.Select):
            found += [f"{name}.{e.alias_or_name or '?'}" for e in sel.expressions
                      if _computed(e.this if isinstance(e, exp.Alias) else e)]
            conds = [(w, c.this) for w, c in (("WHERE", sel.args.get("where")), ("HAVING", sel.args.get("having")))
                     if c is not None]
            conds += [("ON", j.args.get("on")) for j in sel.args.get("joins") or ()]
            found += [f"{name}'s {what} condition" for what, c in conds if c is not None and _computed(c)]
        todo += [t.name.lower() for t in tree.find_all(exp.Table)]
    return list(dict.fromkeys(found))[:limit]
