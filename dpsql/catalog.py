"""The catalog: registered private tables and their public metadata.

Everything here is *public*: the schema, the privacy unit, declared bounds, declared key
domains, ordered domains for range workloads, and contribution caps. Analysis, routing,
calibration and ``explain`` read only this, never a private row.

The catalog objects (``TableSpec``, ``ColumnSpec``, ``OrderedDomain``) are immutable: the
dataclasses are frozen and the mappings inside them are ``ReadOnlyDict``s. They are built in one
place, ``register_table`` (checks of the owner's policy, the source's schema, typed domains);
a table's policy changes only by registering it again.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import numbers
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from dpsql.budget import is_plain_number, plain_float
from dpsql.errors import ConfigError, InputUnavailableError, nearest_names
from dpsql.interrupts import HeldInterrupt, interruption_point
from dpsql.plan.typer import parse_type, type_domain

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: bins an ordered domain may have, declared by ``bins`` or cut by ``bin_width``, for numbers, dates and
#: timestamps alike: DAWA's memory and time, and a histogram's released rows, grow with them after the charge
MAX_BINS = 1 << 22
_RESERVED_NAMES = {"dpsql_ledger", "ledger", "information_schema", "pg_catalog", "duckdb_tables"}


@dataclass(frozen=True)
class OrderedDomain:
    """A public ordered domain for range workloads: [lo, hi] cut into ``bins`` equal bins.

    For numeric columns ``lo``/``hi`` are numbers; for date/timestamp columns they are ISO
    strings and ``bin_width`` is an interval such as ``"1 hour"``; bins are then computed in
    seconds since ``lo``.
    """

    lo: Any
    hi: Any
    bins: int
    kind: str = "numeric"  # numeric | date | timestamp
    bin_seconds: float | None = None  # for date/timestamp

    def __post_init__(self) -> None:
        # checked however the domain is built: every later stage sizes its work by ``bins`` (DAWA's
        # vectors, a histogram's released rows) and runs it after the charge
        b = self.bins
        if isinstance(b, bool) or not isinstance(b, numbers.Integral) or not 1 <= int(b) <= MAX_BINS:
            raise ConfigError(f"an ordered domain needs a whole number of bins between 1 and {MAX_BINS:,}, got {b!r}",
                              hint="declare the column with bounds and bins, e.g. {'bounds': (0, 120), 'bins': 121}")
        if self.kind != "numeric":
            w = self.bin_seconds
            if w is None or isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise ConfigError(f"a date/time ordered domain needs a positive, finite bin width in seconds, got {w!r}",
                                  hint="declare the column with bounds and bin_width, e.g. "
                                  "{'bounds': ['2019-01-01', '2021-01-01'], 'bin_width': '1 day'}")

    @property
    def width(self) -> float:
        if self.kind == "numeric":
            return (float(self.hi) - float(self.lo)) / self.bins
        assert self.bin_seconds is not None
        return self.bin_seconds


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    bounds: tuple[float, float] | None = None
    domain: tuple[Any, ...] | None = None  # public keys: GROUP BY releases every one of them
    ordered: OrderedDomain | None = None  # ordered domain for DAWA range workloads
    granularity: float | None = None  # rounding grid for released noisy sums

    def __post_init__(self) -> None:
        for name in ("bounds", "domain"):  # lists given by hand become tuples: nothing inside can change
            v = getattr(self, name)
            if v is not None and not isinstance(v, tuple):
                object.__setattr__(self, name, tuple(v))


#: the finest rounding grid an owner may declare for released values: a released value v is
#: rounded as rint(v / g) * g, and below this g (near the smallest normal double, 2.2e-308) the
#: quotient overflows for ordinary values, so AVG would release inf and VARIANCE NULL
MIN_GRANULARITY = 1e-300

_K = TypeVar("_K")
_V = TypeVar("_V")


class ReadOnlyDict(dict[_K, _V]):
    """A dict that refuses every change after construction (reads work as for any dict).

    The mappings inside catalog objects (columns, references, schema) are public policy that
    calibration reads: they change only through registration, never through a handed-out
    object. (A dict subclass rather than a ``MappingProxyType`` so that every reader typed
    ``dict`` keeps working; copying returns the object itself.)
    """

    __slots__ = ("_sealed",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "_sealed", False):  # calling __init__ again would refill the dict
            self._refuse()
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        self._refuse()

    def __delattr__(self, name: str) -> NoReturn:
        self._refuse()

    def _refuse(self) -> NoReturn:
        raise TypeError("registered table metadata is read-only: change a table's policy by registering it again "
                        "(Session.register)")

    def __setitem__(self, key: _K, value: _V) -> NoReturn:
        self._refuse()

    def __delitem__(self, key: _K) -> NoReturn:
        self._refuse()

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        self._refuse()

    def clear(self) -> NoReturn:
        self._refuse()

    def pop(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def popitem(self) -> NoReturn:
        self._refuse()

    def setdefault(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def __copy__(self) -> ReadOnlyDict[_K, _V]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ReadOnlyDict[_K, _V]:
        return self  # keys are strings, values strings or frozen specs

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


def _read_only(d: Mapping[_K, _V] | Iterable[tuple[_K, _V]] | None) -> ReadOnlyDict[_K, _V]:
    if isinstance(d, ReadOnlyDict):
        return d
    return ReadOnlyDict(d or {})


@dataclass(frozen=True)
class TableSpec:
    """A registered table's public metadata. Frozen: built once by ``register_table``."""

    name: str
    source: Any
    source_kind: str  # parquet | csv | arrow | duckdb
    privacy_unit: str | None = None
    max_groups_per_unit: float = 1
    max_rows_per_group: float = 1
    max_rows_per_unit: float | None = None  # for range workloads (DAWA); default C_u * k
    columns: dict[str, ColumnSpec] = field(default_factory=ReadOnlyDict)
    references: dict[str, str] = field(default_factory=ReadOnlyDict)  # fk column -> "table.column"
    #: owner-declared degree bounds: fk column -> at most this many rows of this table per referenced value
    degree_bounds: dict[str, int] = field(default_factory=ReadOnlyDict)
    #: a public table: no person in it (e.g. a list of countries); joined freely, never protected
    public: bool = False
    #: the owner allows sampled joins (DP-S4S, q < 1) whose Delta is only attested by the declarations
    #: (several people per tuple): their privacy claim is conditional on the data honouring them
    allow_conditional_sampling: bool = False
    #: owner-declared public upper bound on the table's row count (never read from the data); used only
    #: to evaluate public formulas (error bounds, solver sizes) in ``explain``
    max_table_rows: int | None = None
    tau: int = 1  # suppression threshold for sparse histograms
    schema: dict[str, str] = field(default_factory=ReadOnlyDict)  # column name (lower) -> duckdb type
    view: str | None = None  # name of the session's private view on the source
    version: str | None = None  # owner-declared version of the source's contents (synopsis reuse)
    files: tuple[str, ...] = ()  # file sources: the files matched at registration
    read_key: str = ""  # what shapes the rows a query sees: schema (declared types) and read settings

    def __post_init__(self) -> None:
        for name in ("columns", "references", "schema", "degree_bounds"):
            object.__setattr__(self, name, _read_only(getattr(self, name)))
        object.__setattr__(self, "files", tuple(self.files))

    def column(self, name: str) -> ColumnSpec:
        return self.columns.get(name.lower()) or ColumnSpec(name.lower())

    def value_bounds(self, name: str) -> tuple[float, float] | None:
        """Bounds of a column's values as SUM / AVG read them: declared, else [0, 1] for a BOOLEAN
        (false / true, by its type, as a condition is); None when neither."""
        b = self.column(name).bounds
        if b is not None:
            return float(b[0]), float(b[1])
        return (0.0, 1.0) if parse_type(self.schema.get(name.lower(), "")).kind == "bool" else None

    @property
    def rows_per_unit_cap(self) -> float:
        if self.max_rows_per_unit is not None:
            return self.max_rows_per_unit
        return self.max_groups_per_unit * self.max_rows_per_group

    def public_description(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source_kind": self.source_kind,
            "privacy_unit": self.privacy_unit,
            "max_groups_per_unit": self.max_groups_per_unit,
            "max_rows_per_group": self.max_rows_per_group,
            "max_rows_per_unit": self.max_rows_per_unit,
            "tau": self.tau,
            "references": dict(self.references),
            "degree_bounds": dict(self.degree_bounds),
            "public": self.public,
            "allow_conditional_sampling": self.allow_conditional_sampling,
            "max_table_rows": self.max_table_rows,
            "schema": dict(self.schema),  # every column's type (public: the files' footers, a CSV's declared types)
            "columns": {
                c.name: {k: v for k, v in (("bounds", c.bounds), ("domain", c.domain),
                                                   ("ordered", dataclasses.asdict(c.ordered) if c.ordered else None)) if v}
                for c in self.columns.values()
            },
        }


def source_files(kind: str, source: Any) -> tuple[str, ...]:
    """The files a file source names now (a glob expanded, sorted); () for other sources."""
    if kind not in ("parquet", "csv") or not isinstance(source, str):
        return ()
    return tuple(sorted(glob.glob(source))) if any(ch in source for ch in "*?[") else (source,)


def source_identity(table: TableSpec) -> dict[str, Any] | None:
    """What identifies the rows a stored synopsis was computed from (public, owner-side).

    The table's read definition (``read_key``: schema with declared types, and the engine's read
    settings such as ``max_text_bytes``) together with the owner-declared ``version`` when given
    (with the source's kind and location: its files' paths, or the DuckDB table's name, so one
    version label on two sources is two identities; an Arrow table has only its label);
    otherwise, for file sources, each file's identity and modification time (device, inode,
    mtime, size, change time): never a hash of the contents, since reuse must not reveal whether the data
    changed. A glob that now matches other files than at registration has no identity, nor do
    Arrow and DuckDB-table sources without a declared version: their synopses are never reused.
    """
    if table.version is not None:
        # the version labels the contents of *this* source: another file (or DuckDB table) declared
        # with the same label, e.g. the same date, is other data
        where: Any = None
        if table.source_kind in ("parquet", "csv"):
            where = [os.path.realpath(f) for f in table.files]
        elif table.source_kind == "duckdb" and isinstance(table.source, str):
            where = table.source
        return {"version": table.version, "read": table.read_key, "kind": table.source_kind, "where": where}
    if table.source_kind not in ("parquet", "csv") or not table.files:
        return None
    if source_files(table.source_kind, table.source) != table.files:
        return None  # files appeared or vanished since registration
    ids: list[list[Any]] = []
    for f in table.files:
        try:
            st = os.stat(f)
        except OSError:
            return None
        # the change time too: no program sets it back, where a rewrite keeping the size and restoring the mtime
        # (``cp -p``, ``rsync -t``, ``touch -r``) left the other fields as they were
        ids.append([os.path.realpath(f), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns])
    return {"files": ids, "read": table.read_key}


def _check_cap(value: Any, name: str, table: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name} for table '{table}' must be a whole number >= 1 or math.inf, got {value!r}")
    try:
        v = float(plain_float(value, f"{name} for table '{table}'", hint=f"register('{table}', ..., {name}=5)"))
    except ConfigError:
        raise
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name} for table '{table}' must be a whole number >= 1 or math.inf, got {value!r}",
            hint=f"register('{table}', ..., {name}=5)",
        ) from None
    if math.isnan(v) or v < 1 or (not math.isinf(v) and v != int(v)):
        raise ConfigError(
            f"{name} for table '{table}' must be a whole number >= 1 or math.inf, got {value!r}",
            hint=f"register('{table}', ..., {name}=5)",
        )
    return v if math.isinf(v) else int(v)


_TIME_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}


def _parse_seconds(width: str, where: str = "") -> float:
    m = re.fullmatch(r"\s*([-+]?[0-9]+(?:\.[0-9]+)?)\s*(second|minute|hour|day|week)s?\s*", str(width), re.I)
    if not m:
        raise ConfigError(
            f"bin_width {width!r}{where} is not understood",
            hint="use a number for numeric columns, or e.g. '1 hour', '15 minutes', '1 day' for time columns",
        )
    secs = float(m.group(1)) * _TIME_UNITS[m.group(2).lower()]
    if not secs > 0:  # '0 seconds' divided the span by zero
        raise ConfigError(f"bin_width {width!r}{where} must be a positive interval",
                          hint="e.g. '1 hour', '15 minutes' or '1 day'")
    return secs


def _up3(v: float) -> float:
    """``v`` > 0 rounded up to three significant digits."""
    e = math.floor(math.log10(v)) - 2
    return math.ceil(v / 10.0**e) * 10.0**e


def _time_width_text(seconds: float) -> str:
    """A bin_width of at least ``seconds``, in the largest unit it fills, as '7.54 seconds' (rounded up)."""
    unit = next((u for u in ("week", "day", "hour", "minute") if seconds >= _TIME_UNITS[u]), "second")
    v = seconds / _TIME_UNITS[unit]
    dp = max(0, 2 - math.floor(math.log10(v)))
    up = math.ceil(v * 10**dp) / 10**dp
    return f"{up:.{dp}f} {unit}s"


def _too_many_bins(table: str, name: str, bins: float, width: Any, least: str) -> NoReturn:
    count = f"{bins:,.0f}" if math.isfinite(bins) else "too many"
    raise ConfigError(
        f"bin_width {width!r} cuts the ordered domain of '{table}.{name}' into {count} bins; at most {MAX_BINS:,} are "
        "allowed (the work of a range workload or histogram grows with them)",
        hint=f"declare a bin_width of at least {least}, narrower bounds, or 'bins': {MAX_BINS} or fewer",
    )


def _whole_bins(table: str, name: str, bins: Any) -> int:
    """A declared ``bins``: a whole number between 1 and MAX_BINS (2.5 was cut to 2, NaN and inf crashed)."""
    ok = not isinstance(bins, bool) and isinstance(bins, (int, float)) and math.isfinite(bins) and bins == int(bins)
    if not ok or not 1 <= int(bins) <= MAX_BINS:
        raise ConfigError(f"bins for '{table}.{name}' must be between 1 and {MAX_BINS:,} (a whole number), got {bins!r}",
                          hint=f"e.g. columns={{'{name}': {{'bounds': (0, 120), 'bins': 121}}}}")
    return int(bins)


def _short(v: Any, quoted: bool = True) -> str:
    """An owner's declared value for a message, cut to 80 characters."""
    text = repr(v) if quoted else str(v)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_column_spec(table: str, name: str, spec: Any) -> ColumnSpec:
    if not isinstance(spec, dict):
        raise ConfigError(
            f"column spec for '{table}.{name}' must be a dict such as {{'bounds': (0, 100)}}, got {type(spec).__name__}"
        )
    known = {"bounds", "domain", "ordered", "granularity", "bins", "bin_width"}
    unknown = set(spec) - known
    if unknown:
        raise ConfigError(
            f"unknown key(s) {sorted(unknown)} in column spec for '{table}.{name}'"
            f"{nearest_names(sorted(unknown), sorted(known | {'type'}))}",
            hint=f"allowed keys: {sorted(known | {'type'})} ('type': a CSV column's type, e.g. 'DOUBLE')",
        )
    bounds = None
    time_bounds = None
    if spec.get("bounds") is not None:
        b = spec["bounds"]
        if isinstance(b, (str, bytes, bytearray, Mapping)) or not isinstance(b, Iterable):
            # a text's characters were read as the bounds ("05" as (0, 5)); a mapping's keys, or a KeyError
            raise ConfigError(f"bounds for '{table}.{name}' must be a pair (lo, hi) of numbers (or of dates/timestamps "
                              f"together with bins or bin_width), got {b!r}",
                              hint=f"e.g. columns={{'{name}': {{'bounds': (0, 100)}}}} (in a config: bounds = [0, 100])")
        if not isinstance(b, (list, tuple)):
            b = tuple(b)  # e.g. a numpy array
        grid = "bins" in spec or "bin_width" in spec
        try:
            if isinstance(b, (list, tuple)) and not (grid and any(isinstance(x, str) and not is_plain_number(x) for x in b)):
                # text bounds are numbers only in plain notation ('1_0' is not 10); with a grid, other
                # text is a date or timestamp, judged below
                b = tuple(plain_float(x, f"each bound of '{table}.{name}'", hint=f"columns={{'{name}': {{'bounds': (0, 100)}}}}")
                          for x in b)
                if len(b) != 2:
                    raise ValueError
            elif isinstance(b, (list, tuple)):
                raise ValueError
            lo, hi = (float(b[0]), float(b[1]))
        except ConfigError:
            raise
        except (TypeError, ValueError, IndexError):
            if grid and isinstance(b, (list, tuple)) and len(b) == 2:
                time_bounds = (b[0], b[1])  # a date/timestamp ordered domain
                lo = hi = 0.0
            else:
                numbers = isinstance(b, (list, tuple)) and all(isinstance(x, (int, float)) for x in b)
                raise ConfigError(
                    f"bounds for '{table}.{name}' must be a pair (lo, hi) of numbers "
                    f"(or of dates/timestamps together with bins or bin_width), got {b!r}",
                    hint=f"e.g. columns={{'{name}': {{'bounds': (0, 100)}}}}" if numbers else
                    f"for a DATE or TIMESTAMP column declare its grid with the bounds, e.g. columns={{'{name}': "
                    "{'bounds': ['2019-01-01', '2021-01-01'], 'bin_width': '1 day'}}: MIN, MAX, MEDIAN and "
                    "QUANTILE release a point of it",
                ) from None
        if time_bounds is None:
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise ConfigError(f"bounds for '{table}.{name}' must be finite with lo <= hi, got {b!r}",
                                  hint=f"e.g. columns={{'{name}': {{'bounds': (0, 100)}}}}")
            bounds = (lo, hi)
    domain = None
    if spec.get("domain") is not None:
        d = spec["domain"]
        if isinstance(d, (str, bytes)) or not hasattr(d, "__iter__"):
            raise ConfigError(f"domain for '{table}.{name}' must be a list of public key values, got {d!r}",
                              hint=f"e.g. columns={{'{name}': {{'domain': [...]}}}}")
        domain = tuple(d)
        if not domain:
            raise ConfigError(f"domain for '{table}.{name}' is empty",
                              hint=f"list every public key value, e.g. columns={{'{name}': {{'domain': [...]}}}}, or declare "
                              "no domain (keys are then released above a noisy threshold)")
        seen: dict[Any, Any] = {}
        for v in domain:
            try:
                first = seen.get(v, seen)
            except TypeError:  # a list or dict among the values (it raised a bare TypeError)
                raise ConfigError(f"domain for '{table}.{name}' has the value {_short(v)}, which is not a key value",
                                  hint="list plain values of the column's type (text, numbers, dates, booleans)") from None
            if first is not seen:  # one key twice (also 1 and True, or 1 and 1.0, which Python holds equal)
                same = repr(v) if repr(first) == repr(v) else f"{first!r} and {v!r}"
                raise ConfigError(f"domain for '{table}.{name}' has duplicate values: {_short(same, quoted=False)}",
                                  hint="list each public key once")
            seen[v] = v
        for v in domain:
            if isinstance(v, str):
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate: no text column can hold it
                    raise ConfigError(f"domain for '{table}.{name}' has a value that is not valid text (a lone "
                                      "surrogate code point)", hint="give every domain value as valid Unicode text") from None
    ordered = None
    o = spec.get("ordered")
    if o is None and ("bins" in spec or "bin_width" in spec):
        o = {"bins": spec.get("bins"), "bin_width": spec.get("bin_width")}
        if bounds is not None:
            o["lo"], o["hi"] = bounds
        elif time_bounds is not None:
            o["lo"], o["hi"] = time_bounds
    if o is not None:
        ordered = _parse_ordered(table, name, o, bounds)
    gran = spec.get("granularity")
    if gran is not None:
        try:
            gran = float(plain_float(gran, f"granularity for '{table}.{name}'"))
        except ConfigError:
            raise
        except (TypeError, ValueError):
            raise ConfigError(f"granularity for '{table}.{name}' must be a positive number") from None
        if not math.isfinite(gran) or gran <= 0:
            raise ConfigError(f"granularity for '{table}.{name}' must be a positive number")
        if gran < MIN_GRANULARITY:
            raise ConfigError(
                f"granularity for '{table}.{name}' is {gran:g}, too fine for doubles: rounding a released value to "
                f"that grid divides by it and overflows",
                hint=f"declare a granularity of at least {MIN_GRANULARITY:g} (e.g. 1e-6), or none to release unrounded values")
    return ColumnSpec(name.lower(), bounds=bounds, domain=domain, ordered=ordered, granularity=gran)


#: column types that value bounds and ordered domains (bins) cannot describe: an aggregate refuses
#: them, and a histogram over them would compare text with numbers
_UNORDERED_TYPES = ("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR", "BLOB", "BYTEA", "UUID", "JSON", "ENUM",
                    "STRUCT", "MAP", "UNION", "BIT")


def is_nested_type(type_name: str) -> bool:
    """STRUCT, LIST, ARRAY, MAP or UNION: compared member by member under the connection's collation
    (no binary collation reaches inside), and spelled apart for SQL-equal members ({'x': -0.0},
    {'x': 0.0}), so such a value cannot identify a person."""
    t = type_name.strip().upper()
    return t.endswith("]") or t.startswith(("STRUCT", "MAP", "UNION"))


#: the types a join may key on: those whose values the join's keyed hash covers (``dpsql.rewrite.joins.Spread``:
#: integers, text and floating point by name, the types whose engine hash is a bijection of the value or which
#: it hashes as salted text by prefix, as it does), and ENUM (its values are the owner's dictionary)
_JOIN_KEY_NAMES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                             "UBIGINT", "INT", "INT1", "INT2", "INT4", "INT8", "INT16", "VARCHAR", "TEXT", "STRING",
                             "FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8"})
_JOIN_KEY_PREFIXES = ("DATE", "TIME", "TIMESTAMP", "DECIMAL", "NUMERIC", "BOOLEAN", "BOOL", "UUID", "BLOB", "UHUGEINT",
                      "BIT", "ENUM")


def join_key_type_problem(type_name: str) -> str | None:
    """Why a column of ``type_name`` cannot be a join key (an ON equality, a declared reference), or None.

    Join plans group, DISTINCT, semi-join and join by key values one person chose before any cap bounds
    that person, so every such grouping also goes by a keyed hash of the key under the query's secret salt,
    which starts from the engine's hash of the key. For the types of :data:`_JOIN_KEY_NAMES` and
    :data:`_JOIN_KEY_PREFIXES` that hash is a bijection of the value or is taken of the salt followed by the
    key's text; for the others (INTERVAL, nested types, JSON, BIGNUM, ...) DuckDB's hash is easy to make equal in all 64 bits for many values, and a hash table holding them probes
    quadratically: an INTERVAL hashes as hash(months) XOR hash(days) XOR hash(micros), so every
    ``m months + m microseconds`` hashes to 0 (one customer's 20 000 such order keys made R2T over lineitem
    66.7 s against 0.22 s for random ones); a list or struct combines its members' hashes, and strings with
    one hash are easy to write (``tests/test_adversary_join_key_types.py``). Such types also compare coarser
    than their spelling (1 month = 30 days; members under the connection's collation)."""
    t = type_name.strip().upper()
    base = re.split(r"[\s(\[]", t, maxsplit=1)[0]
    if is_nested_type(t) or not (base in _JOIN_KEY_NAMES or t.startswith(_JOIN_KEY_PREFIXES)):
        return (f"of type {type_name}, which no join may key on: its engine hash is easy to make equal for many "
                "values (join plans group and join by the key before any cap bounds a person, so one person's "
                "keys could make the query slow)")
    return None


def type_domains(table: str, columns: dict[str, ColumnSpec], schema: dict[str, str]) -> dict[str, ColumnSpec]:
    """Domains typed to their column at registration: every value must be a value of the column's
    type (an integer domain on a VARCHAR column, a date that is not a date, ... is a ConfigError),
    and the column's type must have a canonical spelling. The typed values are what the
    public-domain filter renders as typed literals (e.g. CAST('2024-01-01' AS DATE))."""
    out: dict[str, ColumnSpec] = {}
    for name, c in columns.items():
        typ = schema.get(name, "").upper()
        if (c.bounds is not None or c.ordered is not None) and ("[" in typ or typ.startswith(_UNORDERED_TYPES)):
            what = "bounds and bins" if c.ordered is not None else "bounds"
            raise ConfigError(
                f"{what} for '{table}.{name}' need a numeric (or date/timestamp) column, but it is {schema[name]}",
                hint=f"if '{name}' holds numbers or dates in a CSV file (read as text), declare its type with "
                f"the {what} (type = \"DOUBLE\", \"BIGINT\" or \"DATE\"); otherwise drop the {what} of '{name}' "
                "(to release its values as keys, declare its public domain instead)",
            )
        if (c.bounds is not None or c.ordered is not None) and ("WITH TIME ZONE" in typ or typ in ("TIMESTAMPTZ", "TIMETZ")):
            # no comparison or GROUP BY may read such a value (its equality is coarser than its spelling): a
            # histogram or range query over it would be refused every time
            raise ConfigError(
                f"bounds for '{table}.{name}' need a numeric, DATE or TIMESTAMP column, but it is {schema[name]}, which "
                "no range, histogram or comparison may read",
                hint=f"register '{name}' as a TIMESTAMP (its UTC time without a zone: cast an Arrow column to "
                     "pa.timestamp('us'), write the Parquet or DuckDB column as TIMESTAMP, or declare type = "
                     f"\"TIMESTAMP\" for a CSV column) with the bounds and grid, or drop the bounds of '{name}'",
            )
        if c.ordered is not None and typ == "BOOLEAN":
            # a grid over [0, 1] would release its keys as 0.0 / 1.0, not the column's false / true
            raise ConfigError(
                f"bins for '{table}.{name}' need a numeric (or date/timestamp) column, but it is BOOLEAN",
                hint=f"drop the bins of '{name}': GROUP BY {name} releases false and true as keys (declare its public "
                     f"domain, columns={{'{name}': {{'domain': [False, True]}}}}, to release both whatever the data)",
            )
        if c.ordered is not None and c.ordered.kind != "numeric" and name in schema and not typ.startswith(("DATE", "TIMESTAMP")):
            raise ConfigError(f"a date grid for '{table}.{name}' needs a DATE or TIMESTAMP column, but it is {schema[name]}",
                              hint=f"declare numeric bounds for '{name}' (e.g. bounds = [0, 100] with bins = 100), or, in a "
                                   "CSV file, its type with the grid (type = \"DATE\")")
        if c.ordered is not None and c.ordered.kind == "numeric" and name in schema and typ.startswith(("DATE", "TIME")):
            # (the bounding SQL's TRY_CAST of a date to DOUBLE is NULL: every row would be dropped, after the charge)
            raise ConfigError(f"a numeric grid for '{table}.{name}' needs a numeric column, but it is {schema[name]}",
                              hint=f"declare its bounds as dates (e.g. bounds = [\"2024-01-01\", \"2025-01-01\"] with "
                                   f"bins = 366, or --bins {table}.{name}=2024-01-01:2025-01-01:366)")
        if c.domain is not None and name in schema:
            try:
                dom = type_domain(c.domain, schema[name], f"'{table}.{name}' ({schema[name]})")
            except ValueError as e:
                raise ConfigError(
                    f"public domain of '{table}.{name}': {e}",
                    hint=f"list values of the column's type {schema[name]}, e.g. strings for VARCHAR, "
                    "dates (or 'YYYY-MM-DD' strings) for DATE, whole numbers for integer columns",
                ) from None
            c = dataclasses.replace(c, domain=dom)
        out[name] = c
    return out


def _parse_ordered(table: str, name: str, o: Any, bounds: tuple[float, float] | None) -> OrderedDomain:
    if not isinstance(o, dict):
        raise ConfigError(f"ordered domain for '{table}.{name}' must be a dict with lo, hi and bins or bin_width")
    lo = o.get("lo", bounds[0] if bounds else None)
    hi = o.get("hi", bounds[1] if bounds else None)
    if lo is None or hi is None:
        raise ConfigError(
            f"ordered domain for '{table}.{name}' needs lo and hi",
            hint="e.g. columns={'age': {'bounds': (0, 120), 'bins': 121}}",
        )
    bins = plain_float(o.get("bins"), f"bins for '{table}.{name}'")
    width = o.get("bin_width")
    if bins is not None and width is not None:  # one was dropped without a word (bins for numbers, the width for dates)
        raise ConfigError(f"the ordered domain of '{table}.{name}' declares bins={o.get('bins')!r} and "
                          f"bin_width={width!r}: declare bins or bin_width, not both",
                          hint="keep the one you mean: bins cuts the bounds into that many equal bins, bin_width into "
                               "bins of that width")
    if isinstance(width, str) and not re.search(r"[a-z]", width, re.I):  # a number as text; '1 hour' is a span
        width = plain_float(width, f"bin_width for '{table}.{name}'")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        lo_f, hi_f = float(lo), float(hi)
        if not (math.isfinite(lo_f) and math.isfinite(hi_f)) or hi_f <= lo_f:
            raise ConfigError(f"ordered domain for '{table}.{name}' needs finite lo < hi")
        if not math.isfinite(hi_f - lo_f):  # (its bins' count or width was a raw OverflowError)
            raise ConfigError(f"the ordered domain of '{table}.{name}' spans {lo!r} to {hi!r}, wider than a double holds",
                              hint=f"declare narrower bounds for '{name}' (a span below about 1.7e308)")
        if bins is None and width is None:
            raise ConfigError(f"ordered domain for '{table}.{name}' needs bins or bin_width")
        if bins is None:
            w = width
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise ConfigError(f"bin_width for '{table}.{name}' must be a positive, finite number, got {width!r}",
                                  hint=f"e.g. columns={{'{name}': {{'bounds': (0, 120), 'bin_width': 5}}}}")
            w = float(w)
            count = (hi_f - lo_f) / w  # inf for a width far below the span (1e-320): refused, not an OverflowError
            if not count <= MAX_BINS + 1e-9 * MAX_BINS:
                _too_many_bins(table, name, math.ceil(count - 1e-9) if math.isfinite(count) else count, width,
                               f"{_up3((hi_f - lo_f) / MAX_BINS):.3g}")
            bins = int(math.ceil(count - 1e-9))
            hi_f = lo_f + bins * w
        bins = _whole_bins(table, name, bins)
        if lo_f.is_integer() and hi_f.is_integer() and bins == int(hi_f - lo_f) + 1:
            # integer domain lo..hi inclusive, one bin per value: bins are [v, v + 1)
            hi_f += 1.0
        return OrderedDomain(lo_f, hi_f, bins, "numeric")
    # date / timestamp
    import datetime as dt

    def to_dt(v: Any) -> dt.datetime:
        if isinstance(v, dt.datetime):
            return v
        if isinstance(v, dt.date):
            return dt.datetime(v.year, v.month, v.day)
        try:
            return dt.datetime.fromisoformat(str(v))
        except ValueError:
            raise ConfigError(f"ordered domain bound {v!r} for '{table}.{name}' is not an ISO date/timestamp") from None

    lo_d, hi_d = to_dt(lo), to_dt(hi)
    if lo_d.tzinfo is not None or hi_d.tzinfo is not None:
        # DATE and TIMESTAMP values carry no offset (TIMESTAMPTZ columns are refused where bounds are read)
        raise ConfigError(f"the date bounds ({lo}, {hi}) of '{table}.{name}' carry a UTC offset; a DATE or TIMESTAMP "
                          "column's values have none",
                          hint=f"declare the bounds of '{name}' without an offset, e.g. ['2019-01-01', '2021-01-01']")
    span = (hi_d - lo_d).total_seconds()
    if span <= 0:
        raise ConfigError(f"ordered domain for '{table}.{name}' needs lo < hi")
    if width is not None:
        secs = _parse_seconds(width, f" for '{table}.{name}'")
        count = span / secs
        if not count <= MAX_BINS + 1e-9 * MAX_BINS:  # as a numeric domain's: '1 second' over a year is 31,622,400
            _too_many_bins(table, name, math.ceil(count - 1e-9) if math.isfinite(count) else count, width,
                           _time_width_text(span / MAX_BINS))
        bins = int(math.ceil(count - 1e-9))
    elif bins is not None:
        # as a numeric domain's (0 divided by zero, a negative count made a 1 us grid)
        bins = _whole_bins(table, name, bins)
        secs = span / bins
    else:
        raise ConfigError(f"ordered domain for '{table}.{name}' needs bins or bin_width")
    kind = "date" if (isinstance(lo, dt.date) and not isinstance(lo, dt.datetime)) or len(str(lo)) == 10 else "timestamp"
    return OrderedDomain(lo_d.isoformat(sep=" "), hi_d.isoformat(sep=" "), bins, kind, secs)


def _source_hint(source: Any) -> str:
    """How to pass an unsupported source: Arrow streams and datasets, and data frames, by name."""
    accepted = "a Parquet path or glob, a CSV path, a pyarrow.Table, or a table name in the Session's DuckDB connection"
    if type(source).__name__ == "DuckDBPyRelation":  # (it has a to_table, which creates a table in its connection)
        return ("materialise the relation in the Session's connection, rel.create('NAME') (CREATE TABLE NAME AS ...), "
                f"and register 'NAME'; or pass rel.to_arrow_table() (a pyarrow.Table); accepted: {accepted}")
    if callable(getattr(source, "read_all", None)):  # pyarrow.RecordBatchReader (a stream, read once)
        return (f"a {type(source).__name__} can be read only once, and dpsql reads the table at every query: pass "
                f"source.read_all() (a pyarrow.Table), or {accepted}")
    if callable(getattr(source, "to_table", None)):  # pyarrow.dataset.Dataset
        return (f"pass the dataset's Parquet path or glob (read at every query), or source.to_table() (a pyarrow.Table "
                f"held in memory); accepted: {accepted}")
    if callable(getattr(source, "to_numpy", None)) and hasattr(source, "columns"):  # a pandas / polars data frame
        return f"convert it first, e.g. pyarrow.Table.from_pandas(df) or df.to_arrow(); accepted: {accepted}"
    return f"pass {accepted}"


_LOCALE_HINT = ("run dpsql under a UTF-8 locale (e.g. LANG=C.UTF-8, as a job's environment: env LANG=C.UTF-8 dpsql "
                "...), or with PYTHONUTF8=1")


def _utf8_bytes(name: str) -> bool:
    """Whether the bytes of the file name ``name`` (decoded by the locale) are UTF-8 text."""
    try:
        os.fsencode(name).decode("utf-8")
    except UnicodeError:
        return False
    return True


#: a URI of another scheme than file:// (s3a://, hdfs://, gs://, ...): read by the Spark engine as given
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def classify_source(source: Any, *, has_connection: bool) -> tuple[str, Any]:
    """Decide what kind of source this is: parquet / csv path (or glob), arrow, duckdb table."""
    try:
        import pyarrow as pa

        if isinstance(source, pa.Table):
            return "arrow", source
        if isinstance(source, pa.RecordBatch):
            return "arrow", pa.Table.from_batches([source])
    except ImportError:  # pragma: no cover
        pass
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source:
        raise ConfigError(f"unsupported table source {type(source).__name__}", hint=_source_hint(source))
    if source.startswith("file:///"):  # a local file's URI: its path (the engines, and the checks below, read paths)
        source = source[len("file://"):]
    low = source.lower()
    is_glob = any(ch in source for ch in "*?[")
    if _REMOTE.match(source):
        # another URI scheme (s3a://, hdfs://, ...): no file of this machine to check; the engine reads it (Spark, as
        # it is configured for the scheme) or refuses it (DuckDB). Its files are not checked before each charge.
        if low.endswith((".parquet", ".pq")) or (is_glob and ".parquet" in low):
            return "parquet", source
        raise ConfigError(f"table source {source!r}: a URI source must name Parquet files (.parquet, or a glob of them)",
                          hint="e.g. s3a://bucket/events/*.parquet (the Spark engine), or a local .parquet or .csv path")
    if low.endswith((".parquet", ".pq")) or (is_glob and ".parquet" in low):
        kind = "parquet"
    elif low.endswith((".csv", ".csv.gz", ".tsv")):
        kind = "csv"
    elif has_connection and _IDENT.match(source.split(".")[-1] or ""):
        return "duckdb", source
    elif os.path.isdir(source):
        raise ConfigError(
            f"{source!r} is a directory",
            hint=f"pass a glob of its files, e.g. {os.path.join(source, '*.parquet')!r}, or one .parquet or .csv file",
        )
    elif os.path.exists(source) and low.endswith((".duckdb", ".ddb", ".db")):
        raise ConfigError(
            f"{source!r} is a database file, not a table: dpsql registers a table of a DuckDB database by its name in "
            "the Session's connection",
            hint=f"open it and register its table by name: Session(..., connection=duckdb.connect({source!r}, "
            "read_only=True)).register(NAME, 'TABLE', ...)",
        )
    elif os.path.exists(source):
        raise ConfigError(
            f"cannot tell the format of {source!r}",
            hint="use a .parquet or .csv file, or a pyarrow.Table (a DuckDB database's table: by its name in "
            "Session(connection=duckdb.connect(PATH)))",
        )
    else:
        raise ConfigError(
            f"table source {source!r} is not a .parquet/.csv path and the Session has no DuckDB connection",
            hint="pass a Parquet or CSV path, a pyarrow.Table, or Session(connection=duckdb_connection) to use its tables",
        )
    try:  # a name the locale's encoding cannot hold is no file to the file system: not 'no file matches'
        os.fsencode(source)
    except UnicodeEncodeError:
        raise ConfigError(
            f"table source {source!r} cannot be named in this process's file-system encoding "
            f"({sys.getfilesystemencoding()}, from its locale), so no file can be opened under that name",
            hint=_LOCALE_HINT) from None
    matches = glob.glob(source) if is_glob else ([source] if os.path.exists(source) else [])
    if "**" in source:  # DuckDB's and Spark's globs recurse there, Python's (which dpsql expands) does not
        star = (f"table source {source!r}: '**' matches one directory level, as '*' does, not any depth of "
                "directories")
        fix = "name each level with '*' (e.g. 'data/*/*.parquet' for files one directory down), or register each depth as its own table"
        if not matches:
            raise ConfigError(star + ": no file matches it", hint=fix)
        warnings.warn(f"{star}: {len(matches)} file(s) matched ({fix})", stacklevel=4)
    if not matches:  # not written yet, perhaps: a retry may find it
        raise InputUnavailableError(
            f"no file matches {source!r}",
            hint="check the path (relative paths are resolved from the current directory; in a config file, from "
            "the config file's directory)",
        )
    for f in matches:  # the Parquet and CSV readers open only file names that are UTF-8 text
        _regular_or_directory(source, f)
        bad = next((c for c in os.path.abspath(f) if "\udc80" <= c <= "\udcff"), None)
        if bad is not None and _utf8_bytes(os.path.abspath(f)):  # read with a locale that is not UTF-8
            raise ConfigError(
                f"table source {source!r}: the file name {f!r} is UTF-8, but this process decodes file names as "
                f"{sys.getfilesystemencoding()} (from its locale), and the Parquet and CSV readers open names given "
                "as UTF-8 text", hint=_LOCALE_HINT)
        if bad is not None:
            raise ConfigError(
                f"table source {source!r}: the file name {f!r} is not UTF-8 text (byte 0x{ord(bad) - 0xDC00:02X} is not "
                "UTF-8), and the Parquet and CSV readers open only UTF-8 file names",
                hint="rename the file (and the directories on its path) to UTF-8 text",
            )
    return kind, os.path.abspath(source) if not is_glob else source


#: what a file that is neither a regular file nor a directory is, by its mode (``stat.S_IFMT``)
_SPECIAL_FILES = {0o010000: "a named pipe (FIFO)", 0o140000: "a socket", 0o020000: "a character device",
                  0o060000: "a block device"}


def _regular_or_directory(source: str, path: str) -> None:
    """Refuse a source file that is a named pipe, a socket or a device (from its metadata only: ``os.stat``, which
    never opens it). A reader opening a FIFO waits for a writer for ever (registration hung in pyarrow's read);
    a device or a socket is no data file either, and a retry finds it again (a ConfigError, exit 2). A directory
    is refused by the readers, with the glob of its files as the fix; a path gone meanwhile is theirs to tell."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    what = _SPECIAL_FILES.get(stat.S_IFMT(mode), "a special file")
    named = f"{path!r}" if path == source else f"{path!r} (matched by {source!r})"
    raise ConfigError(f"table source {named} is {what}, not a regular file: a reader would wait on it or read no table "
                      "from it", hint="name a regular .parquet or .csv file (copy a stream into one first, e.g. "
                      "cat PIPE > data.csv), or a glob matching only such files")


def check_table_name(name: Any) -> str:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ConfigError(
            f"table name {name!r} is not a plain identifier",
            hint="use letters, digits and underscores, e.g. register('events', ...)",
        )
    if name.lower() in _RESERVED_NAMES or name.lower().startswith("_dpsql"):
        raise ConfigError(f"table name {name!r} is reserved", hint="choose another name")
    return name.lower()


@dataclass(frozen=True)
class UnitPath:
    """One way a table's rows reach a person: its own privacy-unit column, or a foreign key
    column that references another table. ``direct`` paths end at a privacy-unit column after at
    most one hop (bounded by the per-unit caps); other paths need joins. ``resolved`` is False for
    a reference to a table that is not registered (it may lead to a person: unknown)."""

    column: str  # column of the table itself
    via: str | None  # "table.column" for a foreign key, None for the table's own privacy unit
    direct: bool
    resolved: bool = True


def unit_paths(table: TableSpec, catalog: Mapping[str, TableSpec]) -> list[UnitPath]:
    """Every path from a row of ``table`` to a person that the catalog declares.

    A foreign key is a path to a person when its target table is registered with a privacy unit
    (or itself reaches one through its own references), including the table itself (a
    ``referrer_id -> users.id`` self-reference is a second person per row): it is *direct* when
    it references that unit column, and indirect (several hops) otherwise. A foreign key that
    repeats the table's own privacy-unit column is the same path. A person table's own references
    to people are paths of the referencing table too (``orders -> customer -> salesrep``: the
    representative is a person of the order, as in ``dpsql.plan.joins``), so such a table is not
    bounded by its one foreign key alone. A reference to a table that is not registered is
    returned unresolved (callers refuse it: it may lead to a person); references to registered
    tables that reach no person are not paths to a person.
    """
    paths: list[UnitPath] = []
    own = table.privacy_unit.lower() if table.privacy_unit else None
    if own:
        paths.append(UnitPath(own, None, True))

    def reaches_person(name: str, seen: frozenset[str]) -> bool:
        t = catalog.get(name)
        if t is None or name in seen or t.public:
            return False
        if t.privacy_unit:
            return True
        return any(reaches_person(tgt.partition(".")[0].lower(), seen | {name}) for tgt in t.references.values())

    for fk, target in table.references.items():
        tname, _, tcol = target.partition(".")
        fk_l = fk.lower()
        ref = catalog.get(tname.lower())
        if ref is None:
            paths.append(UnitPath(fk_l, target.lower(), False, resolved=False))
            continue
        if not reaches_person(tname.lower(), frozenset()):
            continue
        direct = ref.privacy_unit is not None and ref.privacy_unit.lower() == tcol.lower()
        if direct and ref.name.lower() != table.name.lower():
            # the person's row reaches further people through its own references (orders -> customer ->
            # salesrep: the representative is a person of the order too, as in joins): each is a path
            for fk2, target2 in ref.references.items():
                t2 = catalog.get(target2.partition(".")[0].lower())
                if t2 is None:
                    paths.append(UnitPath(fk_l, f"{target.lower()} -> {target2.lower()}", False, resolved=False))
                elif reaches_person(t2.name.lower(), frozenset()) and not (
                        fk2.lower() == ref.privacy_unit and t2.privacy_unit is not None
                        and t2.privacy_unit.lower() == target2.partition(".")[2].lower() and t2.name != ref.name):
                    paths.append(UnitPath(fk_l, f"{target.lower()} -> {target2.lower()}", False))
        if fk_l == own and direct and ref.name.lower() != table.name.lower():
            continue  # the table's own unit column, also declared as a reference to the person table
        paths.append(UnitPath(fk_l, target.lower(), direct))
    return paths


_FLOAT_TYPES = ("FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8")


def reference_problems(table: TableSpec, catalog: Mapping[str, TableSpec]) -> list[tuple[str, str]]:
    """(problem, fix) for each of ``table``'s references that the join path cannot use safely,
    against the tables registered now (checked at registration and again when a join is planned,
    since a referenced table may be registered, or registered again, later):

    * a reference's target column(s) must exist (the join SQL reads them), and its column(s) must have exactly
      the type(s) of the target column(s), and not a floating-point type: a person's id is built from the typed
      value, and values of different types (1, '01', 1.0) or floating-point spellings (-0.0, 0.0) would make
      one person several;
    * a public table may reference only registered public tables (a row that references a person
      is not public)."""
    out: list[tuple[str, str]] = []
    cycle = reference_cycle(table, catalog)
    if cycle is not None and len(cycle) == 1 and key_columns(cycle[0][0]) == key_columns(cycle[0][1]):
        out.append((f"the reference '{cycle[0][0]}' -> '{cycle[0][1]}' names the column itself",
                    f"drop '{cycle[0][0]}' from references"))
    elif cycle is not None:
        hops = ", ".join(f"'{a}' -> '{b}'" for a, b in cycle)
        out.append((f"the references {hops} form a cycle back to '{table.name}': a row would belong to a chain of people "
                    "without end (each person's row reaches the next through the same references), which no cap bounds",
                    f"declare one of these columns without its reference (a plain column), e.g. drop '{cycle[-1][0]}' "
                    "from references"))
    for fk, target in table.references.items():
        tn, _, tc = target.partition(".")
        ref = catalog.get(tn)
        if table.public and (ref is None or not ref.public):
            out.append((f"public table '{table.name}' references '{target}', which is not a registered public table: a row "
                        "that references a person is not public",
                        f"register '{tn}' with public=True, or register '{table.name}' again without public=True"))
        if ref is None or not ref.schema or not table.schema:
            continue
        for a, b in zip(fk.split(","), tc.split(","), strict=True):
            ta, tb = table.schema.get(a), ref.schema.get(b)
            if tb is None:  # the join SQL would read it: a binder error, named as a type error, on every query
                out.append((f"reference '{table.name}.{a}' -> '{tn}.{b}': table '{tn}' has no column '{b}'",
                            f"correct the reference to a column of '{tn}' ({', '.join(sorted(ref.schema))})"))
                continue
            if ta is None:
                continue
            problem = join_key_type_problem(ta)
            if problem is not None:
                out.append((f"reference '{table.name}.{a}' -> '{tn}.{b}' is {problem}",
                            f"join on an integer, text, DATE, TIMESTAMP, DECIMAL, BOOLEAN, UUID or BLOB column instead "
                            f"(e.g. CAST '{table.name}.{a}' and '{tn}.{b}' to VARCHAR in the source)"))
            elif ta.upper() != tb.upper():
                out.append((f"reference '{table.name}.{a}' ({ta}) -> '{tn}.{b}' ({tb}): the types differ, so one value "
                            "could be spelled several ways (1, '01', 1.0) and count as several people",
                            f"give '{table.name}.{a}' the type {tb} (e.g. CAST in the source, or a declared CSV column type)"))
            elif ta.upper().startswith(_FLOAT_TYPES):
                out.append((f"reference '{table.name}.{a}' -> '{tn}.{b}' is of floating-point type {ta}: not a usable key",
                            "use an integer, DECIMAL or text key"))
    return out


def reference_cycle(table: TableSpec, catalog: Mapping[str, TableSpec]) -> list[tuple[str, str]] | None:
    """The first cycle of declared references that leads from ``table`` back to ``table``, as
    ``('table.fk', 'target.column')`` hops, or None. Public tables are not followed (they reach no
    person). Every path from a row to a person is followed to its end (a row belongs to each person
    it reaches, and to each person that person's row reaches: ``dpsql.plan.joins``), so a cycle
    (``users.referrer_id -> users.id``, or ``customer.c_lastorder -> orders`` with
    ``orders.o_custkey -> customer``) attaches a row to a chain of people of unbounded length:
    design invariant 9 refuses it."""
    start = table.name.lower()

    def spec(name: str) -> TableSpec | None:
        return table if name == start else catalog.get(name)

    def walk(name: str, path: list[tuple[str, str]], seen: frozenset[str]) -> list[tuple[str, str]] | None:
        t = spec(name)
        if t is None or t.public:
            return None
        for fk, target in t.references.items():
            tn = target.partition(".")[0].lower()
            hop = (f"{t.name}.{fk}", target)
            if tn == start:
                return [*path, hop]
            if tn in seen:
                continue  # a cycle that does not pass through ``table``: reported for its own tables
            found = walk(tn, [*path, hop], seen | {tn})
            if found is not None:
                return found
        return None

    return walk(start, [], frozenset({start}))


def key_columns(text: str) -> str:
    """A (possibly composite) key's columns, normalised: 'a, B' -> 'a,b' (also '(a, b)')."""
    return ",".join(c.strip().lower() for c in text.strip().strip("()").split(","))


def _plain(v: Any) -> Any:
    """A column spec as plain dicts (a read-only mapping, e.g. from a loaded config, is copied)."""
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _warn_shared_source(catalog: Mapping[str, TableSpec], tname: str, kind: str, src: Any, files: tuple[str, ...],
                        public: bool) -> None:
    """Warn (the owner, of their own registrations: no row is read) of a source of people registered under two
    names, or as people and as public: to dpsql each name is a table of its own, so one human in both is two persons
    (a join of the two protects them at twice the bound), and a public copy's values are released as they are."""
    mine = {os.path.realpath(f) for f in files}
    for other in catalog.values():
        if other.name == tname or (public and other.public) or other.source_kind != kind:
            continue
        same = (bool(mine & {os.path.realpath(f) for f in other.files}) if files
                else kind == "duckdb" and isinstance(src, str) and src.lower() == str(other.source).lower())
        if not same:
            continue
        what = f"'{os.path.basename(sorted(mine)[0])}'" if files else f"'{src}'"
        if public or other.public:
            pub, people = (tname, other.name) if public else (other.name, tname)
            warnings.warn(f"public table '{pub}' reads {what} as table '{people}', which holds people, does: a public "
                          "table's values are released as they are (its keys in full, its columns as join keys), so "
                          f"register '{pub}' as public only if its source holds no person", stacklevel=4)
        else:
            warnings.warn(f"table '{tname}' reads {what} as table '{other.name}' does: to dpsql they are two tables of "
                          "people, so one human in both is two persons (a join of the two protects them at twice the "
                          "bound); register each source of people once (a self-join takes aliases of one table)",
                          stacklevel=4)
        return


#: ``register_source(name, kind, source, view, types=...) -> schema``: the engine's step that
#: creates the private view on a source and returns its schema (column -> type); and
#: ``unregister_source(name, kind, view)``, its inverse
RegisterSource = Callable[..., dict[str, str]]
UnregisterSource = Callable[[str, str, "str | None"], None]


def register_table(
    catalog: MutableMapping[str, TableSpec],
    name: Any,
    source: Any,
    *,
    register_source: RegisterSource,
    unregister_source: UnregisterSource,
    view_suffix: str,
    has_connection: bool = False,
    read_settings: Mapping[str, Any] | None = None,
    privacy_unit: str | None = None,
    max_groups_per_unit: float = 1,
    max_rows_per_group: float = 1,
    max_rows_per_unit: float | None = None,
    columns: Mapping[str, Mapping[str, Any]] | None = None,
    references: Mapping[str, str] | None = None,
    tau: int = 1,
    version: str | None = None,
    public: bool = False,
    degree_bounds: Mapping[str, Any] | None = None,
    allow_conditional_sampling: bool = False,
    max_table_rows: int | None = None,
) -> TableSpec:
    """Register a private table in ``catalog`` (reading only the source's schema, never a row).

    Checks the owner's policy (caps, tau, version, column specs, references, privacy unit),
    creates the private view ``_dpsql_src_<name>_<view_suffix>`` through ``register_source``
    (a table registered again under the same name is replaced: its old view is dropped first),
    checks the declared columns against the schema, types the public domains, and stores the
    frozen ``TableSpec``. On any error the new view is dropped and a ConfigError names the fix.
    ``read_settings``: the engine's settings that shape the rows a query reads (e.g.
    ``max_text_bytes``); with the schema they make the table's ``read_key``.
    ``version``: an owner-declared label of the source's contents (e.g. a snapshot date). A
    stored DAWA synopsis is reused only for the same version; without one, file sources are
    identified by each file's identity and modification time, and Arrow or DuckDB-table
    sources are never answered from a stored synopsis.
    ``public``: the table holds no person (e.g. a list of countries): it needs no privacy unit
    and no bounds, and joins freely; its rows are not protected. It may reference only other
    public tables.
    ``references``: foreign key column -> ``'table.column'``. Declaring a reference declares the
    target column a key of its table (at most one row per value), as SQL foreign keys do.
    ``degree_bounds``: foreign key column -> the largest number of rows of this table that
    reference one value (e.g. each customer has at most 64 orders: ``{'o_custkey': 64}`` on
    ``orders``), a public bound declared by the owner and never read from the data. Joins use
    them to bound the join tuples per person (Delta): see ``dpsql.plan.joins``.
    ``allow_conditional_sampling``: a join that reads or reaches this table and whose Delta is only
    attested (tuples with several people) may be answered with sampling (DP-S4S, q < 1), whose
    privacy is then conditional on the data honouring the declared degree bounds and keys, only
    if every private table it reads or reaches allows it (default False: R2T, q = 1, which needs
    no Delta; an analyst's q < 1 is refused for free).
    ``max_table_rows``: a public upper bound on the table's row count declared by the owner (e.g. a
    published size), never read from the data. ``explain`` evaluates public formulas that need table
    sizes (a join's error bound, a solver's size) only where every table involved declares one.
    """
    tname = check_table_name(name)
    try:
        kind, src = classify_source(source, has_connection=has_connection)
    except ConfigError as e:  # named: a config or a command line registers several tables (its class kept)
        raise type(e)(f"table '{tname}': {e.message}", hint=e.hint) from None
    caps_g = _check_cap(max_groups_per_unit, "max_groups_per_unit", tname)
    caps_r = _check_cap(max_rows_per_group, "max_rows_per_group", tname)
    caps_u = _check_cap(max_rows_per_unit, "max_rows_per_unit", tname) if max_rows_per_unit is not None else None
    if version is not None and (not isinstance(version, str) or not version):
        raise ConfigError(f"version for table '{tname}' must be a non-empty string, got {version!r}",
                          hint="e.g. register(..., version='2026-11-30')")
    tau_v = _check_cap(tau, "tau", tname)  # as the caps are read: 2.0 (TOML's float) and "2" are 2
    if math.isinf(tau_v):
        raise ConfigError(f"tau for table '{tname}' must be a whole number >= 1, got {tau!r}",
                          hint=f"register('{tname}', ..., tau=10)")
    tau = int(tau_v)
    if columns is not None and not isinstance(columns, Mapping):
        raise ConfigError(f"columns for table '{tname}' must be a dict of column specs, got {type(columns).__name__}",
                          hint="columns={'amount': {'bounds': (0, 100)}}")
    if references is not None and not isinstance(references, Mapping):
        raise ConfigError(f"references for table '{tname}' must be a dict, got {type(references).__name__}",
                          hint="references={'customer_id': 'customers.id'}")
    if privacy_unit is not None and (not isinstance(privacy_unit, str) or not privacy_unit):
        raise ConfigError(f"privacy_unit for table '{tname}' must be a column name, got {privacy_unit!r}",
                          hint=f"register('{tname}', ..., privacy_unit='user_id')")
    col_specs: dict[str, ColumnSpec] = {}
    types: dict[str, str] = {}
    for cname, cspec in (columns or {}).items():
        if str(cname).lower() in col_specs:  # SQL names are case-insensitive: a second spec would replace the first
            first = next(c for c in (columns or {}) if str(c).lower() == str(cname).lower())
            raise ConfigError(f"the policy declares columns '{first}' and '{cname}' of table '{tname}', which are one "
                              "column (names are case-insensitive): one spec would silently replace the other",
                              hint=f"declare the column once (columns={{'{first}': {{...}}}}, or one "
                                   f"[tables.{tname}.columns.{first}] in the config)")
        cspec = _plain(cspec)
        if isinstance(cspec, dict) and "type" in cspec:  # a CSV column's declared type
            types[cname.lower()] = cspec.pop("type")
        col_specs[cname.lower()] = parse_column_spec(tname, cname, cspec)
    refs: dict[str, str] = {}
    for fk, target in (references or {}).items():
        if not isinstance(target, str) or target.count(".") != 1 or not isinstance(fk, str):
            raise ConfigError(
                f"reference for '{tname}.{fk}' must be 'table.column', got {target!r}",
                hint="references={'customer_id': 'customers.id'}; a composite key: {'a,b': 'table.x,y'}",
            )
        fk_n, target_n = key_columns(fk), key_columns(target.partition(".")[2])
        if len(fk_n.split(",")) != len(target_n.split(",")):
            raise ConfigError(f"reference for '{tname}.{fk}' pairs {len(fk_n.split(','))} column(s) with "
                              f"{len(target_n.split(','))}", hint="references={'a,b': 'table.x,y'}: as many columns on each side")
        if fk_n in refs:
            raise ConfigError(f"table '{tname}' declares the reference of '{fk_n}' twice (names are case-insensitive): "
                              "one would silently replace the other", hint="declare each foreign key once")
        refs[fk_n] = f"{target.partition('.')[0].strip().lower()}.{target_n}"
    if not isinstance(public, bool):
        raise ConfigError(f"public for table '{tname}' must be True or False, got {public!r}")
    if not isinstance(allow_conditional_sampling, bool):
        raise ConfigError(f"allow_conditional_sampling for table '{tname}' must be True or False, "
                          f"got {allow_conditional_sampling!r}")
    if max_table_rows is not None and (isinstance(max_table_rows, bool) or not isinstance(max_table_rows, int)
                                       or max_table_rows < 1):
        raise ConfigError(f"max_table_rows for table '{tname}' must be a whole number >= 1, got {max_table_rows!r}",
                          hint="e.g. max_table_rows=1_500_000 (a public upper bound on the row count), or omit it")
    if degree_bounds is not None and not isinstance(degree_bounds, Mapping):
        raise ConfigError(f"degree_bounds for table '{tname}' must be a dict, got {type(degree_bounds).__name__}",
                          hint="degree_bounds={'customer_id': 64}: at most 64 rows per referenced customer")
    degrees: dict[str, int] = {}
    for fk, d in (degree_bounds or {}).items():
        fk = key_columns(str(fk))
        if fk not in refs:
            raise ConfigError(f"degree bound for '{tname}.{fk}', which is not a declared reference",
                              hint=f"declare it first: references={{'{fk}': 'table.column'}}")
        dv = _check_cap(d, f"degree_bounds['{fk}']", tname)
        if math.isinf(dv):
            raise ConfigError(f"degree_bounds['{fk}'] for table '{tname}' must be finite (omit it for no bound)")
        degrees[fk.lower()] = int(dv)
    if public:
        if privacy_unit is not None:
            raise ConfigError(f"public table '{tname}' cannot have a privacy unit: a public table holds no person",
                              hint="drop public=True, or drop privacy_unit")
        for target in refs.values():
            ref = catalog.get(target.partition(".")[0])
            if ref is None or not ref.public:
                raise ConfigError(
                    f"public table '{tname}' references '{target}', which is not a registered public table: "
                    "a row that references a person is not public",
                    hint="register the referenced table first with public=True, or do not declare the table public",
                )
    if not public:  # a person table may not become the target of a public table's reference
        for other in catalog.values():
            if other.public and other.name != tname and any(t.partition(".")[0] == tname for t in other.references.values()):
                raise ConfigError(
                    f"public table '{other.name}' references '{tname}': '{tname}' must stay public (a row that references "
                    "a person is not public)",
                    hint=f"register '{other.name}' again without public=True (or without that reference) first, "
                    f"or register '{tname}' with public=True",
                )
    if privacy_unit is None and not refs and not public:
        raise ConfigError(
            f"table '{tname}' needs a privacy unit: the column that identifies a person, or a foreign key path to one",
            hint=f"register('{tname}', ..., privacy_unit='user_id') or references={{'user_id': 'users.id'}}, "
            "or public=True for a table that holds no person",
        )
    # registered again: the new view under the other of two names, so that a refused registration
    # leaves the table's working registration as it was (dropped only once the new one is in place)
    old = catalog.get(tname)
    view = f"_dpsql_src_{tname}_{view_suffix}"
    if old is not None and old.view == view:
        view += "_2"
    files = source_files(kind, src)
    schema = register_source(tname, kind, src, view, types=types)
    problems = []
    if privacy_unit is not None and privacy_unit.lower() not in schema:
        problems.append(f"privacy unit column '{privacy_unit}' does not exist")
    for c in col_specs:
        if c not in schema:
            problems.append(f"declared column '{c}' does not exist")
    for fk in refs:
        for part in fk.split(","):
            if part not in schema:
                problems.append(f"foreign key column '{part}' does not exist")
    if problems:
        unregister_source(tname, kind, view)
        # a Hive-style directory (DIR/g=a/part.parquet): its partition column is in the path, not in the files
        named = {*col_specs, *(p for fk in refs for p in fk.split(",")), *([privacy_unit.lower()] if privacy_unit else [])}
        parts = {seg.partition("=")[0].lower() for f in files for seg in os.path.dirname(f).split(os.sep) if "=" in seg}
        hive = sorted(c for c in named & parts if c not in schema)
        raise ConfigError(
            f"table '{tname}': " + "; ".join(problems) + (
                f" ({', '.join(repr(c) for c in hive)}: a Hive partition directory of its files, such as "
                f"{hive[0]}=VALUE/; dpsql reads the columns stored in the Parquet files only, not partition columns)"
                if hive else ""),
            hint=f"its columns are: {', '.join(sorted(schema))}" + (
                "; register the partitioned data as one Arrow table, pyarrow.dataset.dataset(DIR, "
                "partitioning='hive').to_table(), or write the partition column into the files" if hive else "")
            + (f"; its header is one column holding {', '.join(repr(d) for d in delims)}: a CSV source is read "
               "comma-separated (tab-separated when named .tsv), so write the file with commas (or convert it to Parquet)"
               if (delims := [d for d in ";|\t" if kind == "csv" and len(schema) == 1 and d in next(iter(schema))])
               else ""),
        )
    unit_type = schema[privacy_unit.lower()] if privacy_unit is not None else ""
    if is_nested_type(unit_type):
        # under 'nocase' the people {'s': 'Z'} and {'s': 'z'} were one partition of the caps
        unregister_source(tname, kind, view)
        raise ConfigError(f"table '{tname}': the privacy unit '{privacy_unit}' has the nested type {unit_type}, "
                          "whose values cannot be told apart by their binary value",
                          hint="register an integer, DECIMAL, text or date column that identifies a person (e.g. derive "
                          "one upstream)")
    if unit_type.strip().strip('"').upper() == "NULL":  # (an Arrow null column): every row would belong to nobody
        unregister_source(tname, kind, view)
        raise ConfigError(f"table '{tname}': the privacy unit '{privacy_unit}' has the type NULL (no value but NULL), so "
                          "every row would belong to nobody and be dropped: every answer would be noise alone",
                          hint="register the column that identifies a person (an Arrow column of type pa.null() holds no "
                          "value: build the table with the id column's real type)")
    if unit_type.strip().upper() == "JSON":
        # JSON compares under the connection's collation (no binary collation applies to it) but is spelled
        # apart: under 'nocase' the people '"A"' and '"a"' were one value to the caps and joins, two users to
        # the truncation (a one-person join plan then failed after its charge when both existed)
        unregister_source(tname, kind, view)
        raise ConfigError(f"table '{tname}': the privacy unit '{privacy_unit}' has the type JSON, whose equality follows the "
                          "connection's collation while its spelling does not, so it cannot tell people apart",
                          hint="register an integer, DECIMAL, text or date column that identifies a person (e.g. CAST "
                          "the JSON to VARCHAR upstream)")
    try:
        col_specs = type_domains(tname, col_specs, schema)
    except ConfigError:
        unregister_source(tname, kind, view)
        raise
    probe = TableSpec(name=tname, source=None, source_kind=kind, references=refs, public=public, schema=schema)
    others = {**catalog, tname: probe}
    bad = reference_problems(probe, others)  # (tables referencing this one are checked again when joined)
    if bad:
        unregister_source(tname, kind, view)
        raise ConfigError(f"table '{tname}': " + "; ".join(p for p, _ in bad), hint=bad[0][1])
    spec = TableSpec(
        name=tname,
        source=src if kind != "arrow" else "<arrow table>",
        source_kind=kind,
        privacy_unit=privacy_unit.lower() if privacy_unit else None,
        max_groups_per_unit=caps_g,
        max_rows_per_group=caps_r,
        max_rows_per_unit=caps_u,
        columns=col_specs,
        references=refs,
        degree_bounds=degrees,
        public=public,
        allow_conditional_sampling=allow_conditional_sampling,
        max_table_rows=max_table_rows,
        tau=tau,
        schema=schema,
        view=view,
        version=version,
        files=files,
        read_key=json.dumps({"schema": schema, **{k: v for k, v in (read_settings or {}).items()
                                                  if k != "csv_encoding" or kind == "csv"}}, sort_keys=True),
    )
    _warn_shared_source(catalog, tname, kind, src, files, public)  # (once it is registered: no warning before a refusal)
    catalog[tname] = spec
    if old is not None:
        unregister_source(tname, old.source_kind, old.view)
    return spec


class CatalogLock:
    """Registrations (and closing) against the requests in flight in other threads of one Session. A
    request (``reading``) holds it from its analysis to its last read of private rows; a registration
    (``writing``, which replaces a table's view) or ``close`` waits for the requests in flight, so a
    request never finds the view it was planned on dropped, or the engine closed, after its charge.
    A waiting writer goes before requests that arrive after it (threads that query without pause do not
    hold a registration or ``close`` off for ever; no request runs inside another). A forked child starts
    with a fresh lock: the parent's threads that held it do not exist there. A request, registration or
    ``close`` from a thread that holds it (a signal handler, which runs in the thread it interrupts) is
    refused before anything is charged: it would wait for itself for ever, or find the engine's connection
    busy with the request it interrupted."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        # each request and registration is one entry, added and removed by one step each, so that an exception that a
        # signal's handler raises at any step (a SIGALRM time-out of the program's, which is not held back as Ctrl-C is)
        # leaves it either taken or not, and giving it back twice changes nothing: counts taken with ``+=`` were left
        # taken (the thread refused as inside its own request for ever, every later request of it refused) or given
        # back twice (a negative count that a registration or ``close`` waited on for ever)
        self._reads: dict[object, int] = {}  # request -> its thread
        self._writes: dict[object, int] = {}  # registration or close, waiting or active -> its thread
        self._active: object | None = None  # the registration or close running

    # (read by tests: the counts as they were kept)
    @property
    def _readers(self) -> int:
        return len(self._reads)

    @property
    def _writers(self) -> int:
        return len(self._writes)

    @property
    def _writing(self) -> bool:
        return self._active is not None

    @property
    def _holders(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for thread in list(self._reads.values()):
            out[thread] = out.get(thread, 0) + 1
        return out

    def _mine(self) -> threading.Condition:
        if self._pid != os.getpid():
            self.__init__()  # type: ignore[misc]
        return self._cond

    def _refuse_inside(self) -> None:
        me = threading.get_ident()
        active = self._active
        if (active is not None and self._writes.get(active) == me) or me in list(self._reads.values()):
            raise ConfigError(
                "a Session was called inside its own request or registration in the same thread (e.g. by a signal handler "
                "that interrupted a query): it would wait for that request, which waits for it",
                hint="in a signal handler, raise an exception instead (e.g. sys.exit()) and close the Session once the "
                "query has unwound (a with block does)")

    # Ctrl-C between taking a count and the try that gives it back (or inside giving it back) left the count taken:
    # the thread was refused as inside its own request for ever, and ``close`` waited for ever. Counts are taken
    # and given back with Ctrl-C held back in the main thread (raised where it waits, or once the count is safe), and
    # taken inside the try that gives them back (other signals' handlers are not held back).
    def _wait(self) -> None:
        self._cond.wait(0.05)
        interruption_point()

    def _given_back(self, give_back: Callable[[], None]) -> None:
        done = False
        try:
            with HeldInterrupt():
                give_back()
                done = True
        finally:
            if not done:  # Ctrl-C before it was held back (or another signal's handler raised): once more, as it changes nothing twice
                give_back()

    def _leave_reading(self, me: object) -> None:
        with self._mine():
            self._reads.pop(me, None)
            self._cond.notify_all()

    def _leave_writing(self, me: object) -> None:
        with self._mine():
            if self._active is me:
                self._active = None
            self._writes.pop(me, None)
            self._cond.notify_all()

    @contextmanager
    def reading(self) -> Iterator[None]:
        me = object()
        with HeldInterrupt() as held:
            try:
                with self._mine():
                    self._refuse_inside()
                    while self._writes:
                        self._wait()
                    self._reads[me] = threading.get_ident()
                held.__exit__()  # a Ctrl-C held back is raised here
                yield
            finally:
                self._given_back(lambda: self._leave_reading(me))

    @contextmanager
    def writing(self) -> Iterator[None]:
        me = object()
        with HeldInterrupt() as held:
            try:
                with self._mine():
                    self._refuse_inside()
                    self._writes[me] = threading.get_ident()
                    while self._active is not None or self._reads:
                        self._wait()
                    self._active = me
                held.__exit__()  # a Ctrl-C held back is raised here
                yield
            finally:
                self._given_back(lambda: self._leave_writing(me))


def _engine_hook(engine: Any, hook: str, table: str, what: str) -> Any:
    """The engine's check ``hook`` for a table that needs it; an engine without it is refused (free), never taken
    to have nothing to report."""
    found = getattr(engine, hook, None)
    if found is None:
        raise ConfigError(
            f"table '{table}': the engine {type(engine).__name__} cannot tell {what} since it was registered (it has no "
            f"{hook}), which every request checks before its charge; nothing was charged",
            hint="use an engine that implements it (docs/architecture.md, 'Adding an execution backend'), or register "
                 "the table from a pyarrow.Table")
    return found


def check_sources_unchanged(catalog: Mapping[str, TableSpec], tables: Iterable[str], engine: Any) -> None:
    """Refuse (free) a request reading a table of the caller's DuckDB connection -- among ``tables``
    and the tables their references reach -- whose columns or types changed since it was
    registered (an ALTER TABLE, a table dropped or re-created under the same name).

    The catalog's types decide how each expression is rendered total, while the private view of
    such a table binds the table's current columns at every query: a column now VARCHAR where
    INTEGER was registered would be compared through DuckDB's implicit cast, which fails on a
    cell that is not a number, so whether the query failed (after its charge) would depend on
    one row. ``engine.describe(ast)`` binds the view only (the owner's metadata, no row is read); the
    session calls this before every charge, the remembered bind check included.

    Also refused: such a table that now reads anything but DuckDB's own tables and the values a query makes
    itself (a Python object registered with the connection, a file read by DuckDB's own reader, an extension's
    scan, another table function: ``engine.reading_scans``, an allow-list over the plan only), as registration
    refuses it: a relation of that name registered (or a view replaced) after the table was, which hides it.

    And a Parquet or CSV table whose files were replaced since: with the same schema (CSV: header line) the
    engine reads them as they now are, with another one (or a file gone) the request is refused
    (``engine.source_changed``).

    First of all, the caller's connection itself (``engine.check_connection``, where the engine has one): one on
    which a private read cannot run is refused, whatever was checked before (the caller may change it)."""
    from sqlglot import exp

    from dpsql.errors import QueryTypeError

    getattr(engine, "check_connection", lambda: None)()

    seen: set[str] = set()
    todo = list(tables)
    while todo:
        name = todo.pop()
        spec = catalog.get(name)
        if spec is None or name in seen:
            continue
        seen.add(name)
        todo += [t.partition(".")[0] for t in spec.references.values()]
        if spec.source_kind in ("parquet", "csv") and spec.view is not None:
            problem = _engine_hook(engine, "source_changed", name, "whether its files were replaced")(spec.view)
            if problem is not None:  # replaced or removed meanwhile (an ETL job): registered again, it may be read
                raise InputUnavailableError(
                    f"table '{name}': {problem} since it was registered (from the files' metadata; no row was "
                    "read); nothing was charged",
                    hint=f"register '{name}' again (Session.register) so that its policy and types match the files",
                )
        if spec.source_kind in ("parquet", "csv") and isinstance(spec.source, str) and any(c in spec.source for c in "*?["):
            # a glob is expanded once, at registration: an ETL job's new part files are not read until then
            added = set(source_files(spec.source_kind, spec.source)) - set(spec.files)
            if added:
                warnings.warn(f"table '{name}': {len(added)} file(s) matching {spec.source!r} were added since it was "
                              f"registered and are not read by this query; register '{name}' again (Session.register) "
                              "to read them", UserWarning, stacklevel=4)
        if spec.source_kind != "duckdb" or spec.view is None:
            continue
        view = exp.select("*").from_(exp.to_table(spec.view, quoted=True))
        try:
            now: dict[str, str] | None = {str(c).lower(): str(t) for c, t in engine.describe(view)}
        except QueryTypeError:  # not a busy connection (ConfigError): that is said as it is
            now = None
        if now != dict(spec.schema):
            raise ConfigError(
                f"table '{name}': its DuckDB table changed its columns or types since it was registered (or no longer "
                "exists); nothing was charged",
                hint=f"register '{name}' again (Session.register) so that its policy and types match the table",
            )
        found = _engine_hook(engine, "reading_scans", name, "what its DuckDB table now reads")(view)
        if found:
            raise ConfigError(
                f"table '{name}': its DuckDB table now reads {', '.join(found)} (not a DuckDB table but a Python object "
                "registered with the connection, a file read by DuckDB's own reader, an extension's scan or another "
                "table function, since it was registered): queries would fail after "
                "their charge depending on one person's row; nothing was charged",
                hint=f"drop what hides the table in the connection, or register '{name}' again from the pyarrow.Table "
                "or the file itself (Session.register), which dpsql reads totally",
            )
