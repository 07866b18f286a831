"""The only place SQL meets DuckDB.

Executes SQL rendered by ``rewrite.render`` from dpsql's own ASTs and returns Arrow.

Privacy claims of this module (threat model: docs/threat_model.md):

* **No private text in errors.** Every DuckDB failure becomes a dpsql error whose message is a
  constant (plus public names: what was being run, the owner's limits). DuckDB's own message
  can quote cells, so it is attached (as ``debug_detail``) only when the data owner turned on
  the debug mode (``EngineSettings.debug``, documented as unsafe), and even then scrubbed of
  quoted literals and numbers (:func:`scrub`). Errors are raised outside the ``except`` block,
  so no DuckDB exception rides along as ``__context__``.
* **One generic error after the charge.** A failure while reading private data
  (:meth:`Engine.fetch_arrow`: a time-out, out-of-memory, a full temp directory, anything
  else) is the same ``ExecutionError`` with the same text: its class and message do not
  depend on which failure happened, hence not on the data.
* **Data-independent limits.** The owner's memory limit, thread limit and temp-directory cap
  are DuckDB settings applied to every private read; the statement time-out is a timer thread
  calling ``connection.interrupt()`` after a fixed number of seconds (DuckDB has no statement
  time-out of its own). A caller-provided connection gets the settings for the duration of
  each private read and its own values back afterwards (these settings are database-wide in
  DuckDB: a query the caller runs concurrently on the same database shares them meanwhile).
* **Sources are read totally.** A source value that cannot be read is NULL, never an error
  (an error would reveal, after the charge, whether that row exists):

  - Parquet and Arrow (:func:`_arrow_plan`): DuckDB's Arrow scan converts some types while
    reading and raises on a value it cannot convert, so every column is read through Arrow as
    a type that cannot fail and rebuilt in the view with a total expression, at any depth
    (lists, structs): text is read as bytes and decoded with ``TRY(DECODE(...))`` (invalid
    UTF-8 is NULL); timestamps (every unit, with or without a time zone), durations, dates
    and TIME are read as their stored integers (or range-checked on them) and rebuilt (a value
    outside the range every allow-listed function accepts is NULL); a decimal beyond its
    precision is NULL; float16 and decimal256 are widened; a dictionary of such values
    is decoded first. A map, union or list view holding such values, and any type not known to
    read totally, are refused at registration (``ConfigError``, before any charge).
  - Parquet with ``invalid_text = "replace"``: DuckDB's own reader; the Parquet types it
    converts in a way that can fail (timestamps in milliseconds, INT96, TIME, JSON, ...) are
    refused at registration, from the file's schema (an allow-list).
  - DuckDB tables and DuckDB's Parquet reader (:func:`_duck_plan`): a DECIMAL beyond its
    precision, a timestamp or TIME beyond DuckDB's usable range are NULL (range tests on the
    stored values); TIMESTAMP_S/_MS/_NS are read as TIMESTAMP.
  - Every source: a text (VARCHAR, JSON) or BLOB value longer than the owner's
    ``max_text_bytes`` is NULL, at any depth (a bound on the per-row cost of functions, checked
    on the stored length); a DuckDB MAP holding a key over the cap is NULL as a whole.
  - CSV: the dialect is fixed (``,`` or tab for .tsv, ``"`` quote and escape, header line),
    never sniffed from the data; every column is VARCHAR unless the owner declares its type,
    which the view applies with ``TRY_CAST`` (dates and timestamps range-checked as above). A row that does not parse (bad quoting, invalid
    UTF-8, wrong field count, over-long line) is skipped. Column names come from the header
    line only, so the schema does not depend on any data row.
"""

from __future__ import annotations

import csv
import glob as globmod
import gzip
import io
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import duckdb
import pyarrow as pa
from sqlglot import exp

from dpsql.errors import ConfigError, ExecutionError, QueryTypeError
from dpsql.rewrite.bound import source_name
from dpsql.rewrite.render import render

#: the text of every failure while reading private data (time-out, memory, disk, anything)
PRIVATE_FAILURE = "{what} failed while reading private data; the reason is withheld because it could depend on the data"

#: CSV column types an owner may declare (``columns={'amount': {'type': 'DOUBLE'}}``)
_CSV_TYPES = re.compile(
    r"^(BOOLEAN|TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|UTINYINT|USMALLINT|UINTEGER|UBIGINT|FLOAT|DOUBLE|"
    r"DECIMAL\(\s*\d{1,2}\s*,\s*\d{1,2}\s*\)|DATE|TIME|TIMESTAMP|TIMESTAMPTZ|VARCHAR)$"
)

_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$", re.I)


@dataclass(frozen=True)
class EngineSettings:
    """Owner settings of the execution engine (``Session(engine=...)``, ``[engine]`` in dpsql.toml).

    They live with the data owner's configuration; no query option can change them.

    ``debug``: attach DuckDB's own (scrubbed) messages to errors as ``debug_detail``. UNSAFE:
        scrubbing is best effort, a message may still reveal something about a private value.
        For the data owner's own troubleshooting only, never on a deployment analysts query.
    ``memory_limit``: DuckDB memory limit for dpsql's queries, e.g. ``"4GB"`` (None: DuckDB's default).
    ``threads``: DuckDB threads for dpsql's queries (None: min(4, CPUs)).
    ``statement_timeout``: seconds a private read may run before it is interrupted (None: no limit).
        A time-out happens after the charge: the charge stands and the error is the generic one.
    ``min_response_time``: seconds every query that reads private data takes at least, padded by
        sleeping, failures included (0: no padding). Set it above the slowest expected query
        (and at least ``statement_timeout`` plus the release time) to hide run-time differences.
    ``max_temp_directory_size``: cap on DuckDB's spill files, e.g. ``"10GB"`` (None: DuckDB's default).
    ``invalid_text``: how Parquet text that is not valid UTF-8 is read: ``"null"`` (default: the
        value is NULL; text is read as bytes through Arrow and decoded) or ``"replace"`` (each
        invalid byte becomes ``?``; DuckDB's own reader, faster, which refuses at registration
        the column types it cannot read totally, such as timestamps in milliseconds). Both are
        total: never an error. Arrow tables are always read the ``"null"`` way.
    ``max_text_bytes``: a text or BLOB value of any source longer than this many bytes (UTF-8)
        is read as NULL, also inside lists, structs and maps, so one hostile cell cannot make
        per-row functions arbitrarily slow (None: no cap). The check is on the stored length.
    """

    debug: bool = False
    memory_limit: str | None = "4GB"
    threads: int | None = None
    statement_timeout: float | None = 300.0
    min_response_time: float = 0.0
    max_temp_directory_size: str | None = None
    max_text_bytes: int | None = 65536
    invalid_text: str = "null"

    def __post_init__(self) -> None:
        if self.invalid_text not in ("null", "replace"):
            raise ConfigError(f"engine setting invalid_text must be 'null' or 'replace', got {self.invalid_text!r}")
        if not isinstance(self.debug, bool):
            raise ConfigError(f"engine setting debug must be true or false, got {self.debug!r}")
        for name in ("memory_limit", "max_temp_directory_size"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not _SIZE.match(v)):
                raise ConfigError(f"engine setting {name} must be a size such as '4GB', got {v!r}",
                                  hint=f"{name} = \"4GB\"")
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ConfigError(f"engine setting threads must be a whole number >= 1, got {t!r}")
        st = self.statement_timeout
        if st is not None and (isinstance(st, bool) or not isinstance(st, (int, float)) or not st > 0 or st == float("inf")):
            raise ConfigError(f"engine setting statement_timeout must be a positive number of seconds, got {st!r}",
                              hint="statement_timeout = 300")
        c = self.max_text_bytes
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ConfigError(f"engine setting max_text_bytes must be a whole number >= 1, got {c!r}")
        m = self.min_response_time
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not (0 <= m < float("inf")):
            raise ConfigError(f"engine setting min_response_time must be a number of seconds >= 0, got {m!r}")

    @classmethod
    def from_dict(cls, d: Any) -> EngineSettings:
        if d is None:
            return cls()
        if isinstance(d, EngineSettings):
            return d
        if not isinstance(d, dict):
            raise ConfigError("[engine] settings must be a table / dict", hint="[engine] statement_timeout = 300")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown engine setting(s) {unknown}", hint=f"known: {sorted(known)}")
        return cls(**d)

    @property
    def effective_threads(self) -> int:
        return self.threads if self.threads is not None else max(1, min(4, os.cpu_count() or 1))


def scrub(text: str) -> str:
    """DuckDB's message for the owner's debug mode: first line only, quoted literals and numbers
    removed, capped in length. Best effort: the debug mode stays unsafe."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    first = re.sub(r"'(?:[^']|'')*'?", "'?'", first)
    first = re.sub(r'"(?:[^"]|"")*"?', '"?"', first)
    first = re.sub(r"\\x[0-9A-Fa-f]{2}", "", first)
    first = re.sub(r"[-+]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?", "#", first)
    first = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in first)
    return first[:240]


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


def _arrow_plan(t: pa.DataType, where: str, cap: int | None, depth: int = 0) -> tuple[pa.DataType, Rebuild | None]:
    """How to read a column of Arrow type ``t`` totally: the type asked of Arrow (a cast that
    cannot fail: text as bytes, temporal values as their stored integers, float16 and decimal256
    widened) and the SQL that rebuilds the value from it (None: read as is).

    DuckDB's Arrow scan converts some types while reading (seconds and milliseconds to
    microseconds, UTF-8 validation, ...) and raises on a value it cannot convert; every such type
    is rebuilt here with a total expression: a value that does not fit DuckDB's type is NULL.
    Text and BLOB values over ``cap`` bytes are NULL, at any depth. A type that is neither known
    to read totally nor rebuilt is refused (``ConfigError``), so a new Arrow type is never read
    unchecked.
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
            return _arrow_plan(t.storage_type, where, cap, depth)  # text: decoded, never pushed
        raise ConfigError(f"column {where} has extension type {t.extension_name}, which dpsql cannot read safely",
                          hint="store it as its storage type, or leave the column out of the source")
    if T.is_dictionary(t):  # decoded (a filter on a dictionary would meet the file's type too)
        read, build = _arrow_plan(t.value_type, where, cap, depth)
        return read, build
    if T.is_string(t) or T.is_large_string(t) or T.is_string_view(t):
        raw = pa.large_binary() if T.is_large_string(t) else pa.binary()
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
        read, build = _arrow_plan(t.value_type, where, cap, depth + 1)
        if build is None and read.equals(t.value_type):
            return t, None
        if T.is_list_view(t) or T.is_large_list_view(t):
            raise ConfigError(f"column {where} has type {t}: its elements need a conversion that list views do not allow",
                              hint="store it as a list (pa.list_), or leave the column out of the source")
        var = exp.to_identifier(f"_dpsql_x{depth}")
        body = build(exp.column(var)) if build is not None else exp.column(var)
        outer = pa.large_list(read) if T.is_large_list(t) else pa.list_(read)
        return outer, lambda e: _fn("LIST_TRANSFORM", e, exp.Lambda(this=body.copy(), expressions=[var]))
    if T.is_struct(t):
        plans = [(t.field(i).name, t.field(i).type, *_arrow_plan(t.field(i).type, where, cap, depth + 1))
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
    if all(_arrow_plan(c, where, cap, depth + 1) == (c, None) for c in children):
        return t, None
    raise ConfigError(
        f"column {where} has type {t}: the text, binary or temporal values inside this type cannot be read safely",
        hint="store it as a plain column, a list or a struct (a map as a list of structs), or leave the column out of the source",
    )


def _duck_plan(t: Any, where: str, cap: int | None, depth: int = 0) -> Rebuild | None:
    """The SQL that reads a column of a DuckDB type (a ``DuckDBPyType``) totally, or None.

    For the owner's DuckDB tables and DuckDB's own Parquet reader: text (VARCHAR, JSON) and BLOB
    over ``cap`` bytes are NULL at any depth; a DECIMAL beyond its precision, and a timestamp or
    TIME beyond the range of :func:`_temporal_in_range`, are NULL (a later conversion or
    negation would raise); TIMESTAMP_S/_MS/_NS are read as TIMESTAMP.
    """
    tid = t.id
    if tid == "varchar":
        return None if cap is None else (lambda e: _cap(e, cap, fn="STRLEN"))
    if tid == "blob":
        return None if cap is None else (lambda e: _cap(e, cap))
    if tid == "decimal":
        return _decimal_in_range(*(int(v) for _, v in t.children))
    temporal = _temporal_in_range(tid)
    if temporal is not None:
        return temporal
    if tid in ("list", "array"):
        build = _duck_plan(t.children[0][1], where, cap, depth + 1)
        if build is None:
            return None
        var = exp.to_identifier(f"_dpsql_x{depth}")
        body = build(exp.column(var))
        return lambda e: _fn("LIST_TRANSFORM", e, exp.Lambda(this=body.copy(), expressions=[var]))
    if tid == "struct":
        plans = [(name, _duck_plan(ft, where, cap, depth + 1)) for name, ft in t.children]
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
        kb, vb = _duck_plan(kt, where, cap, depth + 1), _duck_plan(vt, where, cap, depth + 1)
        if kb is None and vb is None:
            return None
        if kt.id in ("varchar", "blob") or kb is None:
            return _map_rebuild(kt.id, kb is not None, vb, cap, depth)
    if tid in ("map", "union"):
        if all(_duck_plan(ct, where, cap, depth + 1) is None for _, ct in t.children):
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
        size = _fn("OCTET_LENGTH" if key_id == "blob" else "STRLEN", exp.column(kvar))
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


def _csv_header(path: str, delim: str) -> list[str]:
    """Column names from the header line of a CSV file (never from a data row)."""
    # errors are raised outside the except blocks: no chained exception quotes the file
    opener: Callable[..., Any] = gzip.open if path.lower().endswith(".gz") else open
    raw: bytes | None = None
    problem = ""
    try:
        with opener(path, "rb") as f:
            raw = f.readline(1 << 20)
    except OSError as e:
        problem = type(e).__name__
    if raw is None:
        raise ConfigError(f"cannot read CSV file {path!r} ({problem})", hint="check that the file exists and is readable")
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    line: str | None = None
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if line is None:
        raise ConfigError(f"the header line of {path!r} is not valid UTF-8", hint="save the CSV file as UTF-8")
    names = next(csv.reader(io.StringIO(line.rstrip("\r\n")), delimiter=delim, quotechar='"'), [])
    names = [n.strip() for n in names]
    if not names or any(not n for n in names):
        raise ConfigError(f"the header line of {path!r} needs a non-empty name for every column",
                          hint="the first line of a CSV source must be its header, e.g. user_id,amount,country")
    low = [n.lower() for n in names]
    if len(set(low)) != len(low):
        raise ConfigError(f"the header line of {path!r} repeats a column name (names are compared case-insensitively)")
    return names


class _InheritedBusy:
    """Stands in for an engine's lock in a process forked while another thread of the parent was
    using the engine: that thread does not exist here, so its lock would never be released and
    the DuckDB connection it was using may be left mid-statement. Every use refuses instead of
    hanging (whether a query was running is public: it depends on no private value)."""

    def __enter__(self) -> None:
        raise ExecutionError(
            "this Session's engine was inherited through fork while another thread of the parent process "
            "was running a query with it; its DuckDB connection cannot be used in this process (no "
            "statement ran)",
            hint="create a new Session in the child process (or fork before using the Session, or start "
            "workers with the 'spawn' or 'forkserver' start method)",
        )

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ always raises
        return None


_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _engines_after_fork() -> None:
    # In the child only the forking thread exists. An engine lock held by another thread was
    # copied locked and would block forever: such engines refuse use; the others get a new lock.
    for engine in list(_ENGINES):
        lock = engine._lock
        if isinstance(lock, _InheritedBusy):
            continue
        if lock.acquire(blocking=False):  # free, or held by the forking thread itself (an RLock)
            lock.release()
        else:
            engine._lock = _InheritedBusy()


os.register_at_fork(after_in_child=_engines_after_fork)


class Engine:
    def __init__(self, connection: duckdb.DuckDBPyConnection | None = None,
                 settings: EngineSettings | None = None) -> None:
        self.settings = settings or EngineSettings()
        self._owned = connection is None
        self._con = connection if connection is not None else duckdb.connect(":memory:")
        self._lock: Any = threading.RLock()
        _ENGINES.add(self)
        self._views: set[tuple[str, str]] = set()
        self._callers: dict[str, tuple[str, str]] = {}  # a caller's setting: (its text, as shown)
        try:
            self._con.execute("SET enable_progress_bar = false")
        except duckdb.Error:  # pragma: no cover - older settings name
            pass
        if self._owned:
            for name, value in self._limits():
                self._con.execute(f"SET {name} = {_sql_str(value)}")

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self._con

    @property
    def debug(self) -> bool:
        return self.settings.debug

    def close(self) -> None:
        for view, kind in list(self._views):
            self.unregister_source("", kind, view)
        if self._owned:
            self._con.close()

    def _detail(self, e: BaseException) -> str | None:
        """Only in the owner's debug mode: DuckDB's message scrubbed of literals and numbers;
        for any other exception its class alone (its text is not in a known shape to scrub)."""
        if not self.settings.debug:
            return None
        if isinstance(e, duckdb.Error):
            return f"{type(e).__name__}: {scrub(str(e))}"
        return type(e).__name__

    # -- sources --------------------------------------------------------------------------
    def register_source(self, name: str, kind: str, source: Any, view: str | None = None,
                        types: dict[str, str] | None = None) -> dict[str, str]:
        """Expose a source as a private TEMP view (``view``, default ``_dpsql_src_<name>``).

        TEMP views live only in this connection's session: nothing is left in a caller's
        database file, and each Session uses its own view names. ``types`` (CSV only) are the
        owner's declared column types. Returns the schema. Reads schemas and the CSV header
        line only, never a data row. A glob is expanded once, here: files added later are
        not read by this registration.
        """
        view = view or source_name(name)
        types = {k.lower(): v for k, v in (types or {}).items()}
        if types and kind != "csv":
            raise ConfigError(
                f"table '{name}': column types can be declared for CSV sources only ({sorted(types)})",
                hint="Parquet, Arrow and DuckDB sources carry their own column types",
            )
        failure: ConfigError | None = None
        rows: list[Any] = []
        with self._lock:
            self._views.add((view, kind))
            try:
                if kind in ("arrow", "parquet"):
                    self._register_arrow(name, kind, source, view)
                else:
                    if kind == "csv":
                        sel = self._csv_select(name, source, types)
                    elif kind == "duckdb":
                        sel = self._duckdb_select(name, source)
                    else:  # pragma: no cover
                        raise ConfigError(f"unknown source kind {kind!r}")
                    self._con.execute(render(_temp_view(view, sel)))
                desc = exp.Describe(this=exp.select("*").from_(exp.to_table(view, quoted=True)))
                rows = self._con.execute(render(desc)).fetchall()
            except duckdb.Error as e:
                failure = ConfigError(
                    f"cannot read table source for '{name}' ({kind}): {type(e).__name__}",
                    hint="check that the file exists, is readable and is valid "
                    + ("Parquet" if kind == "parquet" else "CSV" if kind == "csv" else "data")
                    + (" (for a DuckDB table: that the Session's connection has it)" if kind == "duckdb" else ""),
                )
            except (OSError, pa.ArrowException) as e:
                failure = ConfigError(f"cannot read table source for '{name}' ({kind}): {type(e).__name__}",
                                      hint="check that the file exists, is readable and is valid Parquet")
            except ConfigError:
                self.unregister_source(name, kind, view)
                raise
        if failure is not None:
            self.unregister_source(name, kind, view)
            raise failure
        schema = {str(r[0]).lower(): str(r[1]) for r in rows}
        if len(schema) != len(rows):
            self.unregister_source(name, kind, view)
            raise ConfigError(f"table '{name}' has column names that differ only by case; dpsql needs them distinct")
        return schema

    def _register_arrow(self, name: str, kind: str, source: Any, view: str) -> None:
        """Arrow tables and Parquet files, read totally (:func:`_arrow_plan`); for Parquet with
        ``invalid_text = "replace"``, DuckDB's own reader (:meth:`_parquet_replace_select`)."""
        if kind == "parquet" and self.settings.invalid_text == "replace":
            self._con.execute(render(_temp_view(view, self._parquet_replace_select(name, source))))
            return
        cap = self.settings.max_text_bytes
        if kind == "parquet":
            import pyarrow.dataset as ds

            paths = _expand(source)
            schema = ds.dataset(paths[0], format="parquet").schema
        else:
            schema = source.schema
        plans = [(f, *_arrow_plan(f.type, f"'{name}.{f.name}'", cap)) for f in schema]
        target = pa.schema([pa.field(f.name, read) for f, read, _ in plans])
        if kind == "parquet":
            raw: Any = ds.dataset(paths, format="parquet", schema=target)
        else:
            raw = source if target.equals(schema) else source.cast(target)
        raw_name = view + "_raw"
        self._con.register(raw_name, raw)
        cols = []
        for f, _, build in plans:
            ref = exp.column(f.name, quoted=True)
            cols.append(exp.alias_(build(ref) if build is not None else ref, f.name, quoted=True))
        self._con.execute(render(_temp_view(view, exp.select(*cols).from_(exp.to_table(raw_name, quoted=True)))))

    def _parquet_replace_select(self, name: str, source: str) -> exp.Select:
        """DuckDB's Parquet reader, invalid UTF-8 replaced by ``?``. The types it converts while
        reading and rejects when a value is out of range are refused here (before any row is
        read): the default ``invalid_text = "null"`` reads them totally."""
        paths = _expand(source)
        files = exp.Array(expressions=[exp.Literal.string(p) for p in paths])
        meta = self._con.execute(render(exp.select("name", "type", "converted_type", "logical_type")
                                        .from_(exp.Table(this=exp.func("parquet_schema", files))))).fetchall()
        for col, ptype, converted, logical in meta:
            stored = _parquet_unsafe(ptype, converted, logical)
            if stored is not None:
                raise ConfigError(
                    f"column '{name}.{col}' is stored as {stored}, which DuckDB's own Parquet reader "
                    "(invalid_text = \"replace\") converts in a way that can fail on a stored value",
                    hint="use the default invalid_text = \"null\" (which reads it totally), or store the column "
                         "as another type (a timestamp in microseconds, text)",
                )
        reader = exp.func("read_parquet", files,
                          exp.EQ(this=exp.column("utf8_validation"), expression=exp.Literal.string("replace")))
        return self._capped_select(name, exp.Table(this=reader))

    def _capped_select(self, name: str, rel: exp.Expression) -> exp.Select:
        """Every column of a relation DuckDB reads, through :func:`_duck_plan` (bind only)."""
        bound = self._con.sql(render(exp.select("*").from_(rel.copy())))
        items = []
        for col, typ in zip(bound.columns, bound.types):
            ref = exp.column(str(col), quoted=True)
            build = _duck_plan(typ, f"'{name}.{col}'", self.settings.max_text_bytes)
            items.append(exp.alias_(build(ref) if build is not None else ref, str(col), quoted=True))
        return exp.select(*items).from_(rel)

    def _csv_select(self, name: str, source: str, types: dict[str, str]) -> exp.Select:
        delim = "\t" if source.lower().endswith((".tsv", ".tsv.gz")) else ","
        paths = _expand(source)
        names = _csv_header(paths[0], delim)
        low = {n.lower(): n for n in names}
        bad = sorted(set(types) - set(low))
        if bad:
            raise ConfigError(f"table '{name}': declared column(s) {bad} are not in the CSV header",
                              hint=f"its columns are: {', '.join(names)}")
        for c, t in types.items():
            if not isinstance(t, str) or not _CSV_TYPES.match(t.strip().upper()):
                raise ConfigError(
                    f"type {t!r} declared for '{name}.{c}' is not supported",
                    hint="use BOOLEAN, INTEGER, BIGINT, DOUBLE, DECIMAL(p,s), DATE, TIMESTAMP or VARCHAR",
                )
        cols = exp.Struct(expressions=[
            exp.PropertyEQ(this=exp.Literal.string(n), expression=exp.Literal.string("VARCHAR")) for n in names
        ])

        def opt(k: str, v: exp.Expression) -> exp.Expression:
            return exp.EQ(this=exp.column(k), expression=v)

        files: exp.Expression = (exp.Literal.string(paths[0]) if len(paths) == 1 and paths[0] == source
                                 else exp.Array(expressions=[exp.Literal.string(p) for p in paths]))
        reader = exp.func(
            "read_csv",
            files,
            opt("columns", cols),
            opt("header", exp.true()),
            opt("auto_detect", exp.false()),
            opt("delim", exp.Literal.string(delim)),
            # no quoting: every physical line is one record, so one line (one person's row) can
            # never swallow or split the lines of others (an unbalanced quote once took every
            # later line with it); quotes around a field are removed below
            opt("quote", exp.Literal.string("")),
            opt("escape", exp.Literal.string("")),
            opt("new_line", exp.Literal.string("\\n")),  # with strict_mode off, CRLF files read too
            opt("strict_mode", exp.false()),
            opt("ignore_errors", exp.true()),
            opt("parallel", exp.true()),
        )
        items = []
        for n in names:
            col: exp.Expression = _csv_unquote(exp.column(n, quoted=True))
            declared = types.get(n.lower())
            if declared is not None and declared.strip().upper() != "VARCHAR":
                col = exp.TryCast(this=col, to=exp.DataType.build(declared.strip().upper(), dialect="duckdb"))
                # TRY_CAST accepts timestamps up to DuckDB's ends, where date_trunc raises
                edge = {"TIMESTAMP": "timestamp", "TIMESTAMPTZ": "timestamp with time zone",
                        "DATE": "date"}.get(declared.strip().upper())
                if edge is not None:
                    col = exp.paren(col)
                    rebuild = _temporal_in_range(edge)
                    assert rebuild is not None
                    col = rebuild(col)
            else:
                col = _cap(col, self.settings.max_text_bytes, fn="STRLEN")
            items.append(exp.alias_(col, n, quoted=True))
        return exp.select(*items).from_(exp.Table(this=reader))

    def _duckdb_select(self, name: str, source: str) -> exp.Select:
        """A table of the caller's connection; text, JSON and BLOB over ``max_text_bytes`` read as
        NULL at any depth (:func:`_duck_plan`)."""
        return self._capped_select(name, exp.to_table(source))

    def unregister_source(self, name: str, kind: str, view: str | None = None) -> None:
        view = view or source_name(name)
        self._views.discard((view, kind))
        with self._lock:
            try:
                self._con.execute(render(exp.Drop(this=exp.to_table(view, quoted=True), kind="VIEW", exists=True)))
            except duckdb.Error:
                pass
            if kind in ("arrow", "parquet"):
                try:
                    self._con.unregister(view + "_raw")
                except duckdb.Error:
                    pass

    # -- limits ---------------------------------------------------------------------------
    def _limits(self) -> list[tuple[str, str]]:
        s = self.settings
        out = [("threads", str(s.effective_threads))]
        if s.memory_limit is not None:
            out.append(("memory_limit", s.memory_limit))
        if s.max_temp_directory_size is not None:
            out.append(("max_temp_directory_size", s.max_temp_directory_size))
        return out

    @contextmanager
    def _limited(self) -> Iterator[None]:
        """The owner's limits for one private read (a caller's connection gets its values back)."""
        if self._owned:
            yield
            return
        saved = []
        for name, value in self._limits():
            shown = str(self._con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0])
            # DuckDB shows sizes rounded: restore the caller's own text again while the setting
            # still shows what our last restore left, so repeated queries never drift
            prev = self._callers.get(name)
            original = prev[0] if prev is not None and prev[1] == shown else shown
            saved.append((name, original))
            self._con.execute(f"SET {name} = {_sql_str(value)}")
        try:
            yield
        finally:
            for name, original in reversed(saved):
                try:
                    self._con.execute(f"SET {name} = {_sql_str(original)}")
                    shown = str(self._con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0])
                    self._callers[name] = (original, shown)
                except duckdb.Error:  # pragma: no cover - restoring a value DuckDB reported
                    pass

    @contextmanager
    def _deadline(self) -> Iterator[None]:
        """Interrupt the connection after the owner's statement time-out (a timer thread:
        DuckDB has no statement time-out). The deadline does not depend on the data."""
        limit = self.settings.statement_timeout
        if limit is None:
            yield
            return
        done = threading.Event()
        guard = threading.Lock()

        def fire() -> None:
            with guard:
                if not done.is_set():
                    self._con.interrupt()

        timer = threading.Timer(limit, fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            with guard:
                done.set()
            timer.cancel()

    # -- execution ------------------------------------------------------------------------
    def fetch_arrow(self, ast: exp.Expression, *, what: str = "the bounded query") -> pa.Table:
        """Run a query that reads private data, under the owner's limits and time-out.

        Any failure is the one generic ExecutionError (:data:`PRIVATE_FAILURE`)."""
        sql = render(ast)
        failure: ExecutionError | None = None
        with self._lock:
            try:
                with self._limited(), self._deadline():
                    # the main connection: registered Arrow sources are connection-local
                    return self._con.sql(sql).to_arrow_table()
            except (duckdb.Error, pa.ArrowException, MemoryError, OSError) as e:
                failure = private_failure(what, self._detail(e), self.settings)
        assert failure is not None
        raise failure

    def describe(self, ast: exp.Expression) -> list[tuple[str, str]]:
        """(column, type) of a query's result, by binding it only (no row is read)."""
        return [(str(r[0]), str(r[1])) for r in self._bind(exp.Describe(this=ast.copy()))]

    def bind_check(self, ast: exp.Expression, *, run: bool = False) -> None:
        """Bind (type-check) a query without reading any row; refuse it for free if it fails.

        ``run=True`` executes it instead, for queries over public, one-row placeholder relations
        only (it also catches constant-conversion errors that binding alone lets through).
        """
        self._bind(ast.copy() if run else exp.Describe(this=ast.copy()))

    def _bind(self, ast: exp.Expression) -> list[Any]:
        # binding reads schemas only: the exception class is public, DuckDB's text is not shown
        failure: QueryTypeError | None = None
        with self._lock:
            try:
                return self._con.sql(render(ast)).fetchall()
            except duckdb.Error as e:
                failure = QueryTypeError(
                    f"the query does not type-check against the table's columns ({type(e).__name__}); nothing was charged",
                    hint="check the types in WHERE / GROUP BY / HAVING / ORDER BY (e.g. text compared with numbers)",
                    debug_detail=self._detail(e),
                )
        assert failure is not None
        raise failure

    def post_process(self, table: pa.Table, ast_builder: Any) -> pa.Table:
        """Run a post-processing query (HAVING/ORDER BY/LIMIT on released values) over ``table``.

        ``ast_builder(name)`` returns the query AST reading from relation ``name``. The input
        holds only released (noisy) values, so this is post-processing.
        """
        failure: ExecutionError | None = None
        with self._lock:
            cur = self._con
            try:
                cur.register("__released", table)
                try:
                    return cur.sql(render(ast_builder("__released"))).to_arrow_table()
                except duckdb.Error as e:
                    failure = ExecutionError(
                        "post-processing (HAVING/ORDER BY/LIMIT) of the released values failed",
                        hint="check the types used in HAVING and ORDER BY",
                        debug_detail=self._detail(e),
                    )
            finally:
                try:
                    cur.unregister("__released")
                except duckdb.Error:
                    pass
        assert failure is not None
        raise failure


def private_failure(what: str, detail: str | None, settings: EngineSettings) -> ExecutionError:
    """The one error for any failure after data was read: the text depends on public settings only."""
    limits = []
    if settings.statement_timeout is not None:
        limits.append(f"statement time-out {settings.statement_timeout:g} s")
    if settings.memory_limit is not None:
        limits.append(f"memory limit {settings.memory_limit}")
    return ExecutionError(
        PRIVATE_FAILURE.format(what=what[:1].upper() + what[1:]),
        hint="possible causes: the owner's limits (" + (", ".join(limits) or "none set")
        + "), a full temp directory, or a bug. Simplify the query or ask the data owner, who can "
        "reproduce it with the engine's debug mode (unsafe: see docs/threat_model.md)",
        debug_detail=detail,
    )


def _expand(source: str) -> list[str]:
    """The files of a source path (a glob is expanded once, sorted)."""
    paths = sorted(globmod.glob(source)) if any(ch in source for ch in "*?[") else [source]
    if not paths:
        raise ConfigError(f"no file matches {source!r}")
    return paths


def _sql_str(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _temp_view(view: str, sel: exp.Expression) -> exp.Create:
    return exp.Create(
        this=exp.to_table(view, quoted=True),
        kind="VIEW",
        expression=sel,
        replace=True,
        properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
    )
