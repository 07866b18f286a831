"""dpsql's own expression typer: every expression over private rows is total by construction.

Claim (design invariant 8): whether a query fails, and the spelling of every released key,
depend only on public metadata (the catalog schema) and released values, never on a row.

How: every expression evaluated on private rows (WHERE, GROUP BY keys, the public-domain
filter, the DAWA base conditions) is typed here, against ``TableSpec.schema`` (column ->
DuckDB type string), before any charge, over one allow-list of operators and functions
(``ALLOW_LIST``), each *total*: it cannot raise on any value of its argument types, either
by itself or through the guards the typer renders around it (integer overflow, division by
zero, date_trunc at the edge of the TIMESTAMP range, ...).
The typer then renders the expression again, for DuckDB, so that

* DuckDB never casts implicitly: operands of different types are cast explicitly to one
  common type, and every cast of a column is a ``TRY_CAST`` (a value that does not convert is
  NULL). Literals are typed by dpsql: a string literal compared with a DATE column is parsed
  here (an invalid date is refused for free) and rendered ``CAST('2024-01-01' AS DATE)``;
  a number that does not fit the column's type makes both sides DOUBLE.
* a column of text is never compared with a number, never used as a condition
  (``WHERE note`` is refused), and types without a total comparison (INTERVAL, lists,
  structs, maps, unions, JSON, TIMESTAMPTZ, BLOB, ...) may only be tested with IS [NOT] NULL
  or cast to VARCHAR.
* nothing runs under ``TRY(...)``: when an expression under TRY fails on one row, DuckDB
  re-runs the TRY's whole subtree row by row for that row's vector, a slowdown an analyst can
  gate on one person's secret. Operators that DuckDB would fail on some value are guarded
  explicitly instead: integer arithmetic in a type wide enough for every result (beyond
  HUGEINT in DOUBLE), ``//`` and ``%`` with a ``NULLIF(b, 0)`` divisor, negation of the least
  HUGEINT through ``NULLIF(x, least)``, ``round(int, -k)`` widened, date functions reading
  TIMESTAMP_S/_MS through ``TRY_CAST(x AS TIMESTAMP)`` and date_trunc with a range guard.
* literals are checked against the type they are used as (a TIMESTAMP_NS literal outside
  1677..2262 is never rendered as a CAST that would fail on the first row reaching it).
* expression size is bounded: at most ``MAX_DEPTH`` levels of nesting and
  ``MAX_RENDERED_NODES`` rendered nodes (guards repeat an operand), both refused for free.
* functions have bounded per-row cost: nothing that repeats, generates series, or runs an
  edit distance / regex; string functions see at most ``STRING_CAP`` characters of a
  non-literal argument (it is rendered ``LEFT(arg, STRING_CAP)``), and what a substring search
  looks for (a LIKE pattern, the needle of contains / strpos, the text replace() replaces, the
  separator of split_part) is a literal of at most ``MAX_LIKE_PATTERN`` characters, at most
  ``MAX_SEARCHES`` searches per expression: a search costs up to (text length x needle length)
  per row, so a needle taken from a row would let that row choose its cost. What a character costs depends on
  the text (reverse, upper/lower and trim cost 4-16 times more on four-byte characters than on ASCII letters), so
  each call counts its worst case, and an expression may do at most ``MAX_STRING_WORK`` units of string work per
  row (``_rendered_string_work``), refused for free beyond, and the expressions of one query (its WHERE, keys and
  every aggregate's argument, each distinct rendering once) at most ``MAX_QUERY_STRING_WORK`` together
  (``query_string_work``).
* group keys are canonical: text keys are grouped under the binary collation (a column
  declared with a collation, a ``default_collation`` on the connection and ``COLLATE`` in
  the query cannot merge 'A' and 'a'), floating-point keys are normalised (-0.0 -> 0.0, every
  NaN -> one NaN), and key types whose equality is coarser than their spelling (INTERVAL,
  TIMESTAMPTZ, nested types, JSON, MAP, UNION, ...) are refused.
* text comparisons are binary too: the text operands of =, <>, <, BETWEEN, IN, LIKE, NULLIF,
  GREATEST/LEAST and of starts_with/ends_with/contains/strpos are rendered ``COLLATE "binary"`` (each one read
  from a row: DuckDB refuses two operands of different collations)
  (DuckDB compares under an operand's collation), so what a WHERE matches never depends on a
  column's declared collation or the connection's ``default_collation`` (ILIKE ignores case by
  its own definition).

Anything not on the allow-list is refused, with every violation listed at once (line and
column). The expressions dpsql evaluates over released values only (the SELECT list, HAVING,
ORDER BY) take the same allow-list plus ``POST_ALLOW_LIST`` (checked by
``dpsql.plan.checks.check_expression_functions``); there is no deny-list anywhere.
The module is pure: it reads no data and imports no database library.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import decimal
import functools
import math
import os
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlglot import exp

from dpsql.budget import PLAIN_FORM, is_plain_number

#: string functions see at most this many characters of a non-literal argument
STRING_CAP = 1024
#: LIKE / ILIKE patterns and other literal text arguments of string functions: at most this long
MAX_PATTERN = 256
#: LIKE/ILIKE: a pattern with '_' or several '%' costs up to (input length x pattern length) per row,
#: so LIKE patterns are shorter and an expression may hold only a few of them (per-row cost bound)
MAX_LIKE_PATTERN = 32
MAX_LIKES = 8
#: a text converted to a number, date, timestamp or boolean: one of more characters converts to NULL (parsing reads
#: all of it, blanks and leading zeros included)
CAST_TEXT_CAP = 256
#: substring searches (LIKE / ILIKE, contains, strpos / instr / position, replace, split_part): each looks for
#: a literal of at most MAX_LIKE_PATTERN characters, and an expression holds at most this many of them (LIKE
#: tests included, which keep their own limit MAX_LIKES): their per-row costs add up
MAX_SEARCHES = 16
#: IN lists: at most this many elements
MAX_IN_LIST = 10_000
#: The longest IN list DuckDB compares element by element; a longer list of constants is looked up in a
#: hash table of its elements (DuckDB's IN-clause rewrite into a join), under DuckDB's hash of them.
IN_LIST_SCANNED = 5
#: expressions nested deeper than this (operators, functions, parentheses) are refused
MAX_DEPTH = 64
#: rendered expressions larger than this are refused: guards repeat an operand (DuckDB evaluates
#: NULLIF(a, b) as CASE WHEN a = b THEN NULL ELSE a END, so ``a`` counts twice), and nested
#: guards would otherwise grow exponentially (measured: about 5,000 such nodes cost ~0.05 s to
#: plan and run over 800 rows, 110,000 nodes over 2 s)
MAX_RENDERED_NODES = 5_000
#: the bytes of text one row's expression may build at worst (concatenations, a replace() whose replacement is
#: longer than the text it replaces), as much as one text cell may hold (max_text_bytes' default): DuckDB builds
#: each such value in full for every row of a vector, outside its memory_limit, before any cut, so replace(note,
#: 'a', <256 four-byte characters>) built 1 MB for each row of 1024 'a's (one person's 300 such rows under eight
#: of them: 0.7 s of CPU and 2.6 GB against 0.06 s and 0.2 GB for 300 rows of 1024 'b's)
MAX_TEXT_BUILT = 65_536
#: the string work one row's expression may do at worst, in characters read (``_rendered_string_work``): what a
#: character costs depends on the text (four-byte characters cost 3-16 times ASCII letters), so each function reading
#: a text counts its worst case, the characters it may read times its class's factor (STRING_FACTORS); a comparison
#: of two texts one per 16 bytes compared (a column up to RAW_TEXT_BYTES). One unit is about 3.4 ns on 1024
#: four-byte characters (DuckDB 2.0.1, one thread): the bound is about 0.45 ms per row. 150 reverse() calls made one
#: person's row of 1024 four-byte characters cost about 4 ms more than one of ASCII letters before it
MAX_STRING_WORK = 131_072
#: the string work one row may do at worst in all the expressions of one query together (:func:`query_string_work`):
#: a query evaluates each of its expressions (WHERE, GROUP BY keys, up to MAX_AGGREGATES aggregates' arguments) on
#: every row before any cap, so MAX_STRING_WORK alone let one query do 1000 times the string work per row (100
#: aggregates of 12 reverse() calls each made one person's 20 rows of 1024 four-byte characters cost 1.2-1.7 s of CPU
#: more than 20 rows of ASCII letters); about 1.8 ms per row at most
MAX_QUERY_STRING_WORK = 4 * MAX_STRING_WORK
#: the bytes of a text read from a row that a comparison may read (max_text_bytes' default; a longer text is NULL)
RAW_TEXT_BYTES = 65_536

#: instants a TIMESTAMP_NS holds (DuckDB: 1677-09-21 00:12:43.145224192 .. 2262-04-11 23:47:16.854775807)
TIMESTAMP_NS_RANGE = (dt.datetime(1677, 9, 22), dt.datetime(2262, 4, 11))
#: the least instant date_trunc() takes: truncating an earlier TIMESTAMP (the least is
#: 290309-12-22 BC, and Arrow/Parquet timestamps may lie even below it) leaves the TIMESTAMP range
TRUNC_LEAST = "290308-01-01 (BC) 00:00:00"

# -- types ----------------------------------------------------------------------------------------

_INT_RANGES: dict[str, tuple[int, int, int]] = {  # name -> (lo, hi, decimal digits)
    "TINYINT": (-(2**7), 2**7 - 1, 3),
    "SMALLINT": (-(2**15), 2**15 - 1, 5),
    "INTEGER": (-(2**31), 2**31 - 1, 10),
    "BIGINT": (-(2**63), 2**63 - 1, 19),
    "HUGEINT": (-(2**127), 2**127 - 1, 39),
    "UTINYINT": (0, 2**8 - 1, 3),
    "USMALLINT": (0, 2**16 - 1, 5),
    "UINTEGER": (0, 2**32 - 1, 10),
    "UBIGINT": (0, 2**64 - 1, 20),
    "UHUGEINT": (0, 2**128 - 1, 39),
}
#: the largest magnitude of a *computed* HUGEINT (arithmetic, abs, negation, round): every engine's
#: HUGEINT holds it (DuckDB's holds +-(2^127 - 1), Spark's DECIMAL(38,0) only +-(10^38 - 1), and its
#: arithmetic raises beyond). A result that could leave it is computed in DOUBLE instead, so no row
#: can make an integer expression overflow on either engine.
HUGEINT_COMPUTED = 10**38 - 1
_SIGNED_ORDER = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT")
_INT_ALIASES = {
    "INT1": "TINYINT", "INT2": "SMALLINT", "SHORT": "SMALLINT", "INT": "INTEGER", "INT4": "INTEGER",
    "SIGNED": "INTEGER", "INT8": "BIGINT", "LONG": "BIGINT", "INT128": "HUGEINT", "UINT8": "UTINYINT",
    "UINT16": "USMALLINT", "UINT32": "UINTEGER", "UINT64": "UBIGINT", "UINT128": "UHUGEINT",
}
_TIMESTAMPS = ("TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS", "DATETIME", "TIMESTAMP_US")


@dataclass(frozen=True)
class SqlType:
    """A DuckDB type as the typer sees it.

    kind: bool | int | decimal | float | varchar | date | timestamp | null | strlit | other
    (``strlit``: a string literal whose type the context decides; ``other``: a type with no
    total comparison or no allowed operation, e.g. INTERVAL, lists, TIMESTAMPTZ).
    """

    kind: str
    name: str
    precision: int = 0
    scale: int = 0
    enum: bool = False  # an ENUM column: used as VARCHAR through an explicit cast

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "decimal", "float")

    def __str__(self) -> str:
        return self.name


BOOLEAN = SqlType("bool", "BOOLEAN")
VARCHAR = SqlType("varchar", "VARCHAR")
DOUBLE = SqlType("float", "DOUBLE")
REAL = SqlType("float", "FLOAT")
BIGINT = SqlType("int", "BIGINT")
DATE = SqlType("date", "DATE")
TIMESTAMP = SqlType("timestamp", "TIMESTAMP")
NULL = SqlType("null", "NULL")
STRLIT = SqlType("strlit", "VARCHAR")


def parse_type(text: str) -> SqlType:
    """The typer's view of a DuckDB type string (as DESCRIBE prints it)."""
    t = " ".join(str(text).strip().upper().split())
    if t in ("BOOLEAN", "BOOL", "LOGICAL"):
        return BOOLEAN
    t2 = _INT_ALIASES.get(t, t)
    if t2 in _INT_RANGES:
        return SqlType("int", t2)
    if t in ("FLOAT", "REAL", "FLOAT4"):
        return SqlType("float", "FLOAT")
    if t in ("DOUBLE", "FLOAT8"):
        return DOUBLE
    m = re.fullmatch(r"(?:DECIMAL|NUMERIC)(?:\((\d+)\s*,\s*(\d+)\))?", t)
    if m:
        p, s = (int(m.group(1)), int(m.group(2))) if m.group(1) else (18, 3)
        return SqlType("decimal", f"DECIMAL({p},{s})", p, s)
    if t in ("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR") or re.fullmatch(r"VARCHAR\(\d+\)", t):
        return VARCHAR
    if t.startswith("ENUM(") and t.endswith(")") and not t.endswith("[]"):
        return SqlType("varchar", "VARCHAR", enum=True)
    if t == "DATE":
        return DATE
    if t in _TIMESTAMPS:
        return SqlType("timestamp", "TIMESTAMP" if t in ("DATETIME", "TIMESTAMP_US") else t)
    return SqlType("other", t)


# -- results and errors ------------------------------------------------------------------------------


@dataclass
class Typed:
    """A rendered, total expression and its type (``value``: the Python value of a literal;
    ``bounds``: for an integer expression, a range proven to hold every value it can take, when
    narrower than its type's, e.g. [0, 2^31] for abs() of an INTEGER)."""

    expr: exp.Expression
    type: SqlType
    literal: bool = False
    value: Any = None
    bounds: tuple[int, int] | None = None


class _Refuse(Exception):
    def __init__(self, node: exp.Expression, message: str) -> None:
        self.node = node
        self.message = message


@dataclass(frozen=True)
class FuncSpec:
    """One allow-listed operator or function: its signature, and whether it is total."""

    name: str
    signature: str
    total: str  # "total" | "can fail (TRY)" | "total (see note)"
    note: str = ""


#: The allow-list: every operator and function dpsql accepts on private rows. Generated docs
#: (docs/expressions.md) list this table; the typer below implements exactly these entries.
ALLOW_LIST: tuple[FuncSpec, ...] = (
    FuncSpec("AND, OR, NOT", "BOOLEAN -> BOOLEAN", "total"),
    FuncSpec("=, <>, <, <=, >, >=, IS [NOT] DISTINCT FROM", "T, T -> BOOLEAN", "total",
             "operands cast explicitly to one common type; text only with text, numbers with numbers, "
             "dates/timestamps with each other or with a valid date/time string literal; mixed timestamp "
             "precisions, and a literal the column's type cannot hold (TIMESTAMP_NS: 1677-09-22..2262-04-11; "
             "TIMESTAMP_S/_MS: finer than the unit), are compared in TIMESTAMP"),
    FuncSpec("[NOT] BETWEEN", "T, T, T -> BOOLEAN", "total", "as comparisons"),
    FuncSpec("[NOT] IN (list)", "T, T... -> BOOLEAN", "total", f"as comparisons; at most {MAX_IN_LIST} elements; a list of more than {IN_LIST_SCANNED} is compared by the "
             "values' MD5 digests under a secret salt (DuckDB looks a long list of constants up in a hash table), a text by "
             f"its first (longest element + 1) characters, which decide it (elements of at most {MAX_PATTERN} characters); a "
             "text list with an element read from a row is compared as written"),
    FuncSpec("IS [NOT] NULL", "any -> BOOLEAN", "total", "the only operation allowed on INTERVAL, lists, structs, ..."),
    FuncSpec("IS [NOT] TRUE / FALSE", "BOOLEAN -> BOOLEAN", "total"),
    FuncSpec("CASE, IF, COALESCE, IFNULL, NULLIF, GREATEST, LEAST", "T... -> T", "total",
             "branches cast explicitly to one common type; NULLIF(a, b) compares in it and returns `a` in its own type, as DuckDB"),
    FuncSpec("CAST, TRY_CAST, ::", "scalar -> BOOLEAN, integer types, DECIMAL(p,s), FLOAT, DOUBLE, VARCHAR, DATE, TIMESTAMP",
             "total", "always rendered TRY_CAST: a value that does not convert is NULL; INTERVAL, UUID, TIME and "
             "TIMESTAMPTZ may be cast to VARCHAR; a literal is converted at analysis (refused if it does not fit); "
             "a column is never cast into TIMESTAMP_S/_MS/_NS (DuckDB's TRY_CAST into them can raise); "
             f"TIMESTAMP_S/_MS values are converted through TIMESTAMP; a text of more than {CAST_TEXT_CAP} characters "
             "converts to NULL (parsing reads all of it); a number is converted only where it fits (a guard renders "
             "DuckDB's own test: a conversion that fails costs an error message, so none is attempted)"),
    FuncSpec("+, -, * (integers)", "integer, integer -> integer", "total",
             "computed in INTEGER, BIGINT or HUGEINT, whichever holds the operands and every result of their types "
             "(a computed HUGEINT up to +-(10^38 - 1), the range of Spark's DECIMAL(38,0) too); beyond: computed in DOUBLE. "
             "A date part's values are bounded (years -5877641..5881580, months 1..12, ...): `year(d) - 1990` is a BIGINT"),
    FuncSpec("+, -, * (DECIMAL)", "numeric, numeric -> DECIMAL or DOUBLE", "total",
             "exact in DECIMAL when the result type holds every result (+, -: max(p1-s1, p2-s2) + max(s1, s2) + 1 digits; *: p1 + p2) within 38 digits, else computed in DOUBLE"),
    FuncSpec("+, -, * (FLOAT, DOUBLE)", "numeric, numeric -> DOUBLE (FLOAT when a FLOAT meets no DOUBLE, as in DuckDB)", "total",
             "overflow gives inf"),
    FuncSpec("/", "numeric, numeric -> DOUBLE (FLOAT when a FLOAT meets no DOUBLE, as in DuckDB)", "total",
             "computed in DOUBLE (a FLOAT quotient in FLOAT: 32 bits, inf beyond its range): x / 0 is inf or NaN"),
    FuncSpec("//, %", "integer, integer -> integer", "total",
             "the divisor is NULLIF(b, 0): division by zero is NULL; // is computed in a type holding every "
             "quotient (for HUGEINT, least // -1 is NULL); % cannot overflow; % on DECIMAL is exact in their common DECIMAL "
             "type (DOUBLE beyond 38 digits); % on DOUBLE or FLOAT is total, and NULL where abs(a) >= abs(b) x 2^53 (its cost "
             "grows with the operands' exponents: computed only where the quotient is below 2^53)"),
    FuncSpec("unary -, abs", "numeric -> numeric", "total",
             "integers widened (-(-128::TINYINT) is 128); the least HUGEINT is NULL; UHUGEINT negated in DOUBLE"),
    FuncSpec("sign", "numeric -> TINYINT", "total"),
    FuncSpec("round, floor, ceil, trunc", "numeric[, INTEGER literal (round only)] -> numeric", "total",
             "trunc of an integer and round(int, k >= 0) are the integer itself, floor/ceil of an integer DOUBLE (as DuckDB); round(int, -k) is "
             "computed in a type holding every result (else DOUBLE); round(DECIMAL(p,0), -k) in DECIMAL(p+1,0) "
             "(DOUBLE at p = 38)"),
    FuncSpec("sqrt, ln, log10", "numeric -> DOUBLE", "total", "computed in DOUBLE (NaN / -inf outside the domain)"),
    FuncSpec("power, pow, **, ^", "numeric, numeric -> DOUBLE", "total",
             "computed in DOUBLE: an overflow is inf, an undefined power (a negative number to a fraction) NaN"),
    FuncSpec("isnan, isinf", "DOUBLE -> BOOLEAN", "total"),
    FuncSpec("lower, upper, trim, ltrim, rtrim, reverse", "VARCHAR -> VARCHAR", "total", f"input capped at {STRING_CAP} characters"),
    FuncSpec("length", "VARCHAR -> BIGINT", "total", f"input capped at {STRING_CAP} characters"),
    FuncSpec("left, right", "VARCHAR, integer -> VARCHAR", "total",
             f"input capped at {STRING_CAP} characters; the count clamped to +-(2^31 - 1)"),
    FuncSpec("substring, substr", "VARCHAR, integer literal[, integer literal] -> VARCHAR", "total",
             f"start/length must be integer literals within +-{STRING_CAP}; input capped"),
    FuncSpec("starts_with, ends_with", "VARCHAR, VARCHAR -> BOOLEAN", "total",
             f"inputs capped at {STRING_CAP} characters (one comparison at one position, as =)"),
    FuncSpec("contains, strpos, instr", "VARCHAR, VARCHAR literal -> BOOLEAN/BIGINT", "total",
             f"a substring search: the text looked for is a literal of at most {MAX_LIKE_PATTERN} characters, at most "
             f"{MAX_SEARCHES} searches per expression (LIKE/ILIKE, replace and split_part count too, and each copy a "
             f"guard such as date_trunc's makes of its operand); input capped at {STRING_CAP} characters"),
    FuncSpec("[NOT] LIKE, [NOT] ILIKE [ESCAPE]", "VARCHAR, VARCHAR literal[, VARCHAR literal] -> BOOLEAN", "total",
             f"pattern: a literal of at most {MAX_LIKE_PATTERN} characters, at most {MAX_LIKES} per expression "
             f"(and each counts as one of the {MAX_SEARCHES} substring searches); "
             "ESCAPE: a literal of one ASCII character (not a letter, '%' or '_') that precedes only '%', '_' or "
             f"itself in the pattern; input capped at {STRING_CAP}"),
    FuncSpec("||, concat", "VARCHAR... -> VARCHAR", "total", f"inputs capped at {STRING_CAP} characters"),
    FuncSpec("concat_ws", "VARCHAR literal, VARCHAR... -> VARCHAR", "total",
             f"the separator a literal; NULL arguments are skipped; inputs capped at {STRING_CAP} characters"),
    FuncSpec("replace", "VARCHAR, VARCHAR literal, VARCHAR literal -> VARCHAR", "total",
             f"the text replaced: a literal of at most {MAX_LIKE_PATTERN} characters (a substring search), the "
             f"replacement one of at most {MAX_PATTERN}; input capped at {STRING_CAP} characters; when the replacement is "
             f"longer than the text it replaces, the result is cut to {STRING_CAP} characters (a value cannot grow beyond "
             "what a string function returns)"),
    FuncSpec("split_part", "VARCHAR, VARCHAR literal, integer literal -> VARCHAR", "total",
             f"the separator: a literal of 1 to {MAX_LIKE_PATTERN} characters (a substring search); the part number "
             f"within +-{STRING_CAP}, not 0 (negative: counted from the end; beyond the parts: ''); input capped at "
             f"{STRING_CAP} characters"),
    FuncSpec("date_trunc", "'part' literal, DATE/TIMESTAMP -> TIMESTAMP", "total",
             "a DATE or TIMESTAMP_S/_MS beyond the TIMESTAMP range is NULL; so is an instant before "
             f"{TRUNC_LEAST} (its truncation would leave the TIMESTAMP range; -infinity is kept)"),
    FuncSpec("date_part, extract", "'part' literal, DATE/TIMESTAMP -> BIGINT", "total",
             "a TIMESTAMP_S/_MS beyond the TIMESTAMP range is NULL (read as TRY_CAST(x AS TIMESTAMP))"),
    FuncSpec("year, month, day, hour, minute, second, quarter, dayofweek, dayofyear, week, isodow, yearweek",
             "DATE/TIMESTAMP -> BIGINT", "total", "as date_part"),
    FuncSpec("dayname, monthname", "DATE/TIMESTAMP -> VARCHAR", "total",
             "English names ('Monday', 'January'), as DuckDB's; computed from date_part (NULL where it is)"),
    FuncSpec("make_date", "integer, integer, integer -> DATE", "total",
             "NULL unless (year, month, day) is a valid date of years 1..9999 (DuckDB would fail on 2023-02-29)"),
    FuncSpec("strftime", "DATE/TIMESTAMP, format literal -> VARCHAR", "total",
             "as date_part; a format specifier DuckDB does not know (%Q, %-a, a trailing %) is refused, naming it"),
    FuncSpec("strptime, try_strptime", "VARCHAR, format literal -> TIMESTAMP", "total",
             "rendered try_strptime: text that does not parse is NULL; input capped; a format with %n (nanoseconds, "
             "a TIMESTAMP_NS in DuckDB) is read as TIMESTAMP; %z and %Z (a TIMESTAMP WITH TIME ZONE) are refused, and so "
             "is a format specifier DuckDB does not know, as for strftime"),
    FuncSpec("+, - (INTERVAL)", "DATE/TIMESTAMP, INTERVAL n unit -> TIMESTAMP", "total",
             "on a literal (`TIMESTAMP '2024-06-01' - INTERVAL 30 DAY`) folded by dpsql before the query runs as DuckDB "
             "would (months clamp to the month's end; a result outside years 1..9999 is refused); on a column "
             "(`ship_date - INTERVAL 2 DAY > order_date`) computed per row, NULL unless the value and its shift both lie "
             "in years 1..9999; one whole unit per INTERVAL (YEAR, QUARTER, MONTH, WEEK, DAY, HOUR, MINUTE, SECOND)"),
    FuncSpec("- (DATE, DATE)", "DATE, DATE -> BIGINT", "total",
             "DuckDB's number of days from the second date to the first, rendered date_diff('day', b, a): NULL where either "
             "is NULL or infinite (DuckDB's `-` gives a number there); two literals are folded by dpsql"),
)

#: types with no total comparison whose text (CAST AS VARCHAR) is a canonical spelling
_TEXT_CASTABLE = ("INTERVAL", "UUID", "TIME", "TIMESTAMP WITH TIME ZONE")

_DATE_PARTS = {
    "year", "month", "day", "hour", "minute", "second", "quarter", "week", "dayofweek", "dow", "dayofyear", "doy",
    "decade", "century", "millennium", "isoyear", "yearweek", "epoch", "millisecond", "microsecond", "isodow",
    "weekday", "weekofyear", "milliseconds", "microseconds", "years", "months", "days", "hours", "minutes", "seconds",
}
_TRUNC_PARTS = {"year", "month", "day", "hour", "minute", "second", "quarter", "week", "decade", "century",
                "millennium", "millisecond", "microsecond", "isoyear"}

_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TS_RE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)?")
_NUM_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


_TYPE_NODES: dict[str, exp.DataType] = {}


def _type_node(name: str) -> exp.DataType:
    """``exp.DataType.build(name)``, parsed once per type name (a fresh copy each time: a node has one parent;
    a 9 000-element IN list parsed its element type 27 000 times)."""
    node = _TYPE_NODES.get(name)
    if node is None:
        node = exp.DataType.build(name, dialect="duckdb")
        if len(_TYPE_NODES) < 4096:
            _TYPE_NODES[name] = node
    if not any(isinstance(v, exp.Expression) or (isinstance(v, list) and v) for v in node.args.values()):
        # a plain type (DOUBLE, DATE, ...): its arguments hold no node
        return exp.DataType(**{k: [] if isinstance(v, list) else v for k, v in node.args.items()})
    return node.copy()


def _operand(e: exp.Expression) -> exp.Expression:
    """An operand of a simple CASE's comparison: a copy, in parentheses unless a column or a literal."""
    return e.copy() if isinstance(e, (exp.Column, exp.Literal, exp.Paren)) else exp.Paren(this=e.copy())


def _cast(e: exp.Expression, t: SqlType | str, *, try_: bool = True) -> exp.Expression:
    to = _type_node(t.name if isinstance(t, SqlType) else t)
    return exp.TryCast(this=e, to=to) if try_ else exp.Cast(this=e, to=to)


def _int_type_for(v: int) -> SqlType | None:
    for n in ("INTEGER", "BIGINT", "HUGEINT"):
        lo, hi, _ = _INT_RANGES[n]
        if lo <= v <= hi:
            return SqlType("int", n)
    return None


def _decimal_shape(v: decimal.Decimal) -> tuple[int, int]:
    """(precision, scale) of a decimal literal as written."""
    sign, digits, exponent = v.as_tuple()
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    intd = max(1, len(digits) + exponent) if len(digits) + exponent > 0 else 1
    return intd + scale, scale


def _fits(v: Any, t: SqlType) -> bool:
    """Whether the number ``v`` (int or Decimal) is exactly representable in numeric type ``t``."""
    if t.kind == "float":
        return True
    with decimal.localcontext(decimal.Context(prec=200)):
        d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(v)
        if not d.is_finite():
            return False
        if t.kind == "int":
            if d != d.to_integral_value():
                return False
            lo, hi, _ = _INT_RANGES[t.name]
            return lo <= int(d) <= hi
        if t.kind == "decimal":
            q = d.scaleb(t.scale)
            if q != q.to_integral_value():
                return False
            return abs(d) < decimal.Decimal(10) ** (t.precision - t.scale)
    return False


def _int_digits(t: SqlType) -> int:
    return _INT_RANGES[t.name][2]


def common_numeric(a: SqlType, b: SqlType) -> SqlType:
    """The type both operands are cast to (every cast to it is total or a TRY_CAST)."""
    if a.name == b.name:
        return a
    if a.kind == "float" or b.kind == "float":
        # a REAL with an integer or DECIMAL is a REAL, as DuckDB computes and compares it (with a DOUBLE: DOUBLE)
        return a if b.kind != "float" else b if a.kind != "float" else DOUBLE
    if a.kind == "int" and b.kind == "int":
        alo, ahi, _ = _INT_RANGES[a.name]
        blo, bhi, _ = _INT_RANGES[b.name]
        for n in _SIGNED_ORDER + ("UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT"):
            lo, hi, _ = _INT_RANGES[n]
            if lo <= min(alo, blo) and hi >= max(ahi, bhi) and n in (a.name, b.name):
                return SqlType("int", n)
        for n in _SIGNED_ORDER:
            lo, hi, _ = _INT_RANGES[n]
            if lo <= min(alo, blo) and hi >= max(ahi, bhi):
                return SqlType("int", n)
        return DOUBLE
    # at least one DECIMAL
    ap, as_ = (a.precision, a.scale) if a.kind == "decimal" else (_int_digits(a), 0)
    bp, bs = (b.precision, b.scale) if b.kind == "decimal" else (_int_digits(b), 0)
    s = max(as_, bs)
    ip = max(ap - as_, bp - bs)
    if ip + s <= 38:
        return SqlType("decimal", f"DECIMAL({ip + s},{s})", ip + s, s)
    return DOUBLE


def _parse_date(text: str) -> dt.date | None:
    if not _DATE_RE.fullmatch(text):
        return None
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def _parse_timestamp(text: str) -> dt.datetime | None:
    if not _TS_RE.fullmatch(text):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("T", " "))
    except ValueError:
        return None


def ts_fits(v: Any, t: SqlType) -> bool:
    """Whether the Python instant ``v`` is exactly a value of the timestamp type ``t``."""
    if not isinstance(v, dt.datetime):
        v = dt.datetime(v.year, v.month, v.day)
    if t.name == "TIMESTAMP_NS":
        return TIMESTAMP_NS_RANGE[0] <= v <= TIMESTAMP_NS_RANGE[1]
    if t.name == "TIMESTAMP_S":
        return v.microsecond == 0
    if t.name == "TIMESTAMP_MS":
        return v.microsecond % 1000 == 0
    return True  # TIMESTAMP holds years 1..9999 (all Python instants) to the microsecond


def ts_limits_text(t: SqlType) -> str:
    if t.name == "TIMESTAMP_NS":
        return f"{TIMESTAMP_NS_RANGE[0].date()} .. {TIMESTAMP_NS_RANGE[1].date()}"
    if t.name == "TIMESTAMP_S":
        return "whole seconds"
    if t.name == "TIMESTAMP_MS":
        return "whole milliseconds"
    return "years 1..9999"


def typed_literal(value: Any, t: SqlType) -> exp.Expression:
    """``value`` (already checked to fit ``t``) as a literal of type ``t``, built by sqlglot."""
    if value is None:
        return _cast(exp.Null(), t, try_=False)
    if t.kind == "bool":
        return exp.Boolean(this=bool(value))
    if t.kind == "varchar":
        return exp.Literal.string(str(value))
    if t.kind == "date":
        return _cast(exp.Literal.string(value.isoformat()), DATE, try_=False)
    if t.kind == "timestamp":
        return _cast(exp.Literal.string(value.isoformat(sep=" ")), t, try_=False)
    if t.kind == "float":
        f = float(value)
        if f != f or f in (float("inf"), float("-inf")):
            return _cast(exp.Literal.string(str(f)), t, try_=False)
        return _cast(exp.Literal.string(repr(f)), t, try_=False)
    # int / decimal: the exact value, cast (the value fits: checked by the caller)
    if t.kind == "int":
        return _cast(exp.Literal.number(int(value)), t, try_=False)
    with decimal.localcontext(decimal.Context(prec=200)):
        text = format(decimal.Decimal(value), "f")
    return _cast(exp.Literal.string(text), t, try_=False)


#: the least DOUBLE magnitude that DuckDB's conversion to FLOAT rounds beyond FLOAT's range (its largest value
#: plus half an ulp, 2^128 - 2^103): such a conversion fails (NaN and the infinities convert)
_FLOAT_LIMIT = 2.0**128 - 2.0**103


def _source_max(t: SqlType) -> decimal.Decimal | None:
    """The largest magnitude a value of integer or DECIMAL type ``t`` holds (None for a float)."""
    if t.kind == "int":
        lo, hi, _ = _INT_RANGES[t.name]
        return decimal.Decimal(max(-lo, hi))
    if t.kind == "decimal":
        with decimal.localcontext(decimal.Context(prec=200)):
            return decimal.Decimal(10) ** (t.precision - t.scale) - decimal.Decimal(10) ** -t.scale
    return None


def conversion_guard(e: exp.Expression, src: SqlType, target: SqlType) -> exp.Expression | None:
    """A condition on the number ``e`` of type ``src`` that holds exactly where DuckDB's ``TRY_CAST(e AS target)``
    converts it (NULL and false alike where it does not), or None where every value converts.

    A conversion that fails costs DuckDB a formatted error message before TRY_CAST makes it NULL: 0.2 to 0.9 us a
    value (1e300 to DECIMAL(38,10) 0.7 us, 2^62 to TINYINT 0.2 us) against 3 to 13 ns for one that converts, so one
    person's 20 000 rows of 1e300 under 100 conversions in a WHERE cost 1.4 s of CPU more than ordinary values. Under
    the guard ``CASE WHEN <guard> THEN TRY_CAST(...) END`` no conversion is attempted that fails. The conditions
    follow DuckDB's own tests: a DOUBLE or FLOAT converts to an integer type when it lies in [lo - 0.5, hi + 0.5)
    (rounded to even; the bounds rounded to doubles), to DECIMAL(p, s) when |round(x * 10^s)| < 10^p in doubles
    (rounded half away from zero), a DOUBLE to FLOAT when it is NaN, infinite or below 2^128 - 2^103 in magnitude; a DECIMAL
    rounds half away from zero into an integer type or a DECIMAL of a smaller scale, exactly."""
    D = decimal.Decimal
    conds: list[exp.Expression] = []
    if src.kind == "float" and target.kind == "int":
        lo, hi, _ = _INT_RANGES[target.name]
        return exp.And(this=exp.GTE(this=e.copy(), expression=typed_literal(float(lo) - 0.5, DOUBLE)),
                       expression=exp.LT(this=e.copy(), expression=typed_literal(float(hi) + 0.5, DOUBLE)))
    if src.kind == "float" and target.kind == "decimal":
        x = e.copy() if src.name == "DOUBLE" else _cast(e.copy(), DOUBLE, try_=False)
        scaled = exp.Mul(this=x, expression=typed_literal(float(f"1e{target.scale}"), DOUBLE))
        # |round(y)| < 10^p (half away from zero) is |y| < 10^p - 0.5 for every double y (below 2^52 the bound is
        # exact; above, y is a whole number and the bound rounds to 10^p): no round(), which Spark does not render
        return exp.LT(this=exp.Abs(this=scaled),
                      expression=typed_literal(float(f"1e{target.precision}") - 0.5, DOUBLE))
    if src.kind == "float" and target.kind == "float":
        if src.name == "DOUBLE" and target.name == "FLOAT":
            inf = typed_literal(float("inf"), DOUBLE)
            return exp.Or(this=exp.Or(this=exp.func("isnan", e.copy()),
                                      expression=exp.LT(this=exp.Abs(this=e.copy()), expression=typed_literal(_FLOAT_LIMIT, DOUBLE))),
                          expression=exp.EQ(this=exp.Abs(this=e.copy()), expression=inf))
        return None
    top = _source_max(src)
    if top is None:
        return None
    with decimal.localcontext(decimal.Context(prec=200)):
        neg_ok = src.kind == "decimal" or _INT_RANGES[src.name][0] < 0
        if target.kind == "float":
            # every integer and DECIMAL converts (a UHUGEINT beyond FLOAT's range to inf)
            return None
        if target.kind == "int":
            lo_t, hi_t, _ = _INT_RANGES[target.name]
            rounds = src.kind == "decimal" and src.scale > 0
            low, high = (D(lo_t) - D("0.5"), D(hi_t) + D("0.5")) if rounds else (D(lo_t), D(hi_t))
            if neg_ok and -top <= low if rounds else neg_ok and -top < low:
                conds.append((exp.GT if rounds else exp.GTE)(this=e.copy(), expression=typed_literal(low, src)))
            if (top >= high) if rounds else (top > high):
                conds.append((exp.LT if rounds else exp.LTE)(this=e.copy(), expression=typed_literal(high, src)))
        elif target.kind == "decimal":
            bound = D(10) ** (target.precision - target.scale)
            if src.kind == "decimal" and src.scale > target.scale:
                bound -= D(5) * D(10) ** -(target.scale + 1)  # rounded half away from zero into the smaller scale
            if top >= bound:
                conds.append(exp.LT(this=e.copy(), expression=typed_literal(bound, src)))
                if neg_ok:
                    conds.append(exp.GT(this=e.copy(), expression=typed_literal(-bound, src)))
        else:
            return None
    return functools.reduce(lambda a, c: exp.And(this=a, expression=c), conds) if conds else None


def guarded_conversion(e: exp.Expression, src: SqlType, target: SqlType) -> exp.Expression:
    """``TRY_CAST(e AS target)`` of a number, attempted only where it converts (:func:`conversion_guard`)."""
    out = _cast(e, target)
    out.meta[CAST_FROM] = src.name
    # (a constant reads no row: its conversion costs every row alike, and stays foldable, ``dpsql.plan.folding``)
    guard = conversion_guard(e, src, target) if e.find(exp.Column) is not None else None
    if guard is None:
        return out
    return exp.Case(ifs=[exp.If(this=guard, true=out)])


# -- the typer ------------------------------------------------------------------------------------------


@dataclass
class _Ctx:
    schema: dict[str, SqlType]
    violations: list[tuple[exp.Expression, str]] = field(default_factory=list)


def _lit_number(text: str) -> Any:
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return decimal.Decimal(text)



_INTERVAL_UNITS: dict[str, tuple[int, dt.timedelta]] = {
    "YEAR": (12, dt.timedelta(0)), "QUARTER": (3, dt.timedelta(0)), "MONTH": (1, dt.timedelta(0)),
    "WEEK": (0, dt.timedelta(weeks=1)), "DAY": (0, dt.timedelta(days=1)), "HOUR": (0, dt.timedelta(hours=1)),
    "MINUTE": (0, dt.timedelta(minutes=1)), "SECOND": (0, dt.timedelta(seconds=1)),
}

#: what an INTERVAL may be, wherever it is accepted (refusal text)
INTERVAL_FORM = ("an INTERVAL here is a whole number of one unit (YEAR, QUARTER, MONTH, WEEK, DAY, HOUR, MINUTE or "
                 "SECOND), e.g. INTERVAL 30 DAY or INTERVAL '1 month'; chain several for mixed units (- INTERVAL 1 MONTH "
                 "- INTERVAL 2 DAY)")


def interval_parts(node: exp.Interval) -> tuple[int, dt.timedelta] | None:
    """(months, exact part) of ``INTERVAL n unit`` / ``INTERVAL 'n unit'`` with a whole n (of one unit);
    None for any other INTERVAL. Reads the query's text only."""
    this, unit = node.this, node.args.get("unit")
    while isinstance(this, exp.Paren):
        this = this.this
    text = this.name if isinstance(this, exp.Literal) else None
    uname = unit.name.upper() if isinstance(unit, exp.Var) else None
    if text is not None and uname is None:  # INTERVAL '30 days'
        m = re.fullmatch(r"\s*([+-]?\d+)\s+([A-Za-z]+)\s*", text, re.ASCII)
        text, uname = (m.group(1), m.group(2).upper()) if m else (None, None)
    if uname is not None and uname.endswith("S"):
        uname = uname[:-1]
    # ASCII digits and spaces only, as DuckDB reads a count ('\u0661', an Arabic-Indic one, is no number there)
    if text is None or uname not in _INTERVAL_UNITS or not re.fullmatch(r"\s*[+-]?\d{1,7}\s*", text, re.ASCII):
        return None
    n = int(text)
    months, exact = _INTERVAL_UNITS[uname]
    return n * months, n * exact


def guarded_shift(x: exp.Expression, months: int, delta: dt.timedelta) -> exp.Expression:
    """``x`` (a TIMESTAMP expression) shifted by ``months`` or the exact ``delta``, total: ``CASE WHEN x
    BETWEEN lo AND hi THEN x + INTERVAL ... END``, where [lo, hi] are the instants of years 1..9999
    whose shift stays in years 1..9999 (computed here, exactly). Any other instant (an earlier or later
    year, a shift leaving the range) is NULL: nothing outside the years every engine computes alike
    reaches the addition, so it cannot fail, and DuckDB and Spark give the same instant (a month shift
    clamps the day to the month's end on both). Used over private rows (``Typer._shift_value``) and over
    released values (post-processing, ``dpsql.postprocess``)."""
    lo, hi = dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    nothing = _cast(exp.Null(), TIMESTAMP, try_=False)
    iv: exp.Interval
    if months:
        # x + k months is in range iff x's month, shifted by k, is (the day only clamps down)
        top = 9999 * 12 + 11 - max(months, 0)  # months as year * 12 + month - 1
        bottom = 12 + max(-months, 0)
        if top < bottom:
            return nothing
        y, m = divmod(top + 1, 12)
        hi = min(hi, dt.datetime(y, m + 1, 1) - dt.timedelta(microseconds=1)) if y <= 9999 else hi
        y, m = divmod(bottom, 12)
        lo = dt.datetime(y, m + 1, 1)
        iv = exp.Interval(this=exp.Literal.string(str(months)), unit=exp.Var(this="MONTH"))
    else:
        try:
            lo, hi = (lo - delta, hi) if delta < dt.timedelta(0) else (lo, hi - delta)
        except OverflowError:  # a shift longer than years 1..9999
            return nothing
        micros = delta // dt.timedelta(microseconds=1)
        day = 86_400_000_000
        iv = (exp.Interval(this=exp.Literal.string(str(micros // day)), unit=exp.Var(this="DAY")) if micros % day == 0
              else exp.Interval(this=exp.Literal.string(str(micros // 1_000_000)), unit=exp.Var(this="SECOND")))
    inside = exp.Between(this=x.copy(), low=typed_literal(lo, TIMESTAMP), high=typed_literal(hi, TIMESTAMP))
    return exp.Case(ifs=[exp.If(this=inside, true=exp.Add(this=x.copy(), expression=iv))])


class Typer:
    """Types and re-renders one expression over a table schema. Raise-free: see ``violations``."""

    def __init__(self, schema: dict[str, str]) -> None:
        self.schema = {k.lower(): parse_type(v) for k, v in schema.items()}
        self.likes = 0
        self.searches = 0
        #: operands of + / - typed by :meth:`_date_days` and found no DATE, by id: :meth:`_numeric` takes them
        #: instead of typing them again (twice per level made a chain x + 1 + 1 + ... exponential in its length)
        #: an operand of + or - typed once by :meth:`_date_days` (not a DATE) and taken by :meth:`_numeric`: by id, with
        #: the node itself (an id is compared only while its node lives)
        self._operands: dict[int, tuple[exp.Expression, Typed]] = {}

    # ---- entry points ------------------------------------------------------------------------
    def run(self, node: exp.Expression) -> Typed:
        return self.t(node)

    # ---- helpers ---------------------------------------------------------------------------------
    @staticmethod
    def refuse(node: exp.Expression, message: str) -> _Refuse:
        return _Refuse(node, message)

    def coerce(self, r: Typed, target: SqlType, node: exp.Expression) -> exp.Expression:
        """``r`` as an expression of type ``target`` (explicit, total)."""
        src = r.type
        if src.kind == "null":
            return _cast(exp.Null(), target, try_=False)
        if r.literal:
            v = self._literal_as(r, target, node)
            return typed_literal(v, target)
        if src.name == target.name and not src.enum:
            return r.expr
        if target.name in ("TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS"):
            # DuckDB's casts into these can raise even under TRY_CAST (DATE -> TIMESTAMP_NS is
            # an internal error): unify() never asks for one, CAST(... AS TIMESTAMP_NS) is refused
            raise self.refuse(node, f"a value of type {src} cannot be converted to {target} here; convert to TIMESTAMP")
        if src.name in ("TIMESTAMP_S", "TIMESTAMP_MS") and target.name != "TIMESTAMP":
            # through TIMESTAMP: TRY_CAST(TIMESTAMP_S AS VARCHAR) beyond TIMESTAMP's range raises
            # an internal error in DuckDB; an instant beyond it is NULL
            return _cast(_cast(r.expr, TIMESTAMP), target)
        if src.numeric and target.numeric:
            return guarded_conversion(r.expr, src, target)
        out = uhugeint_text(r.expr) if src.name == "UHUGEINT" and target.kind == "varchar" else _cast(r.expr, target)
        out.meta[CAST_FROM] = src.name
        if src.kind == "varchar" and target.kind != "varchar":
            # parsing reads the whole text, leading zeros and blanks included: one person's text of 60 000 characters
            # cost each conversion 60-150 us (a short one 0.2 us), so 400 conversions in one expression read their
            # 20 rows 0.5 s longer. A text of more than CAST_TEXT_CAP characters converts to NULL, tested on at most
            # that many characters plus one
            short = exp.LTE(this=exp.Length(this=exp.Left(this=r.expr.copy(), expression=exp.Literal.number(CAST_TEXT_CAP + 1))),
                            expression=exp.Literal.number(CAST_TEXT_CAP))
            return exp.Case(ifs=[exp.If(this=short, true=out)])
        return out

    def _literal_as(self, r: Typed, target: SqlType, node: exp.Expression) -> Any:
        """The Python value of literal ``r`` in type ``target``, or refuse (free, at analysis)."""
        v = r.value
        k = target.kind
        if r.type.kind == "strlit":
            text = str(v)
            if k == "varchar":
                return text
            if k == "date":
                d = _parse_date(text)
                if d is None:
                    raise self.refuse(node, f"'{text}' is not a date (write 'YYYY-MM-DD')")
                return d
            if k == "timestamp":
                ts = _parse_timestamp(text)
                if ts is None:
                    raise self.refuse(node, f"'{text}' is not a timestamp (write 'YYYY-MM-DD HH:MM:SS')")
                return self._ts_in(ts, target, node)
            if k == "bool":
                if text.lower() in ("true", "false"):
                    return text.lower() == "true"
                raise self.refuse(node, f"'{text}' is not a boolean (write true or false)")
            if target.numeric:
                raise self.refuse(
                    node,
                    f"the string '{text}' is compared with a number; write the number without quotes",
                )
            raise self.refuse(node, f"a string literal cannot be used as {target}")
        if r.type.kind == "bool":
            if k == "bool":
                return v
            raise self.refuse(node, f"a boolean literal cannot be used as {target}")
        if r.type.kind == "varchar" and k == "varchar":  # a typed text literal (CAST('a' AS VARCHAR), VARCHAR 'a')
            return str(v)
        if r.type.numeric:
            if target.numeric and _fits(v, target):
                if target.name == "FLOAT" and isinstance(v, (int, decimal.Decimal)):
                    # an integer or DECIMAL is rounded to a REAL once, as DuckDB converts it: through a DOUBLE it can
                    # be twice, and differ (2^60 + 2^36 + 1 is the REAL 2^60 + 2^37; its DOUBLE, a tie, the REAL 2^60)
                    from dpsql.plan.folding import _real_of_text
                    return _real_of_text(str(v))
                if target.kind == "float":
                    return float(v)
                if target.kind == "int":
                    return int(v)
                return decimal.Decimal(v)
            raise self.refuse(node, f"the number {v} does not fit {target}")
        if r.type.kind in ("date", "timestamp") and k in ("date", "timestamp"):
            if k == "timestamp" and isinstance(v, dt.date) and not isinstance(v, dt.datetime):
                return self._ts_in(dt.datetime(v.year, v.month, v.day), target, node)
            if k == r.type.kind:
                return self._ts_in(v, target, node) if k == "timestamp" else v
        raise self.refuse(node, f"a literal of type {r.type} cannot be used as {target}")

    def _ts_in(self, v: dt.datetime, target: SqlType, node: exp.Expression) -> dt.datetime:
        """``v`` if the timestamp type ``target`` holds it exactly, else refuse (free)."""
        if not ts_fits(v, target):
            raise self.refuse(node, f"the instant '{v.isoformat(sep=' ')}' is not a {target} value "
                                    f"({ts_limits_text(target)}); compare with CAST(col AS TIMESTAMP)")
        return v

    def unify(self, parts: list[Typed], node: exp.Expression, what: str) -> SqlType:
        """The common type of ``parts`` (comparison operands, CASE branches, IN elements)."""
        typed = [p for p in parts if p.type.kind != "null"]
        if not typed:
            return NULL
        for p in typed:
            if p.type.kind == "other":
                castable = p.type.name.split("(")[0] in _TEXT_CASTABLE
                raise self.refuse(
                    node,
                    f"{what} uses a value of type {p.type}, which has no total comparison here; "
                    + ("only IS [NOT] NULL or CAST(... AS VARCHAR) is allowed on it" if castable else
                       "only IS [NOT] NULL is allowed on it (and COUNT of it)"),
                )
        nonlit = [p for p in typed if not p.literal]
        kinds = {p.type.kind for p in typed}
        # the family
        if kinds <= {"varchar", "strlit"}:
            return VARCHAR
        if kinds <= {"bool", "strlit"}:
            return BOOLEAN
        if kinds <= {"date", "timestamp", "strlit"}:
            if "timestamp" in kinds:
                # one timestamp type only when every non-literal part has it: DuckDB's casts
                # into TIMESTAMP_S/_MS/_NS can fail even under TRY_CAST (DATE -> TIMESTAMP_NS
                # raises an internal error), so anything mixed is compared in TIMESTAMP
                ts_names = {p.type.name for p in nonlit}
                if not ts_names:
                    ts_names = {p.type.name for p in typed if p.type.kind == "timestamp"}
                t = SqlType("timestamp", ts_names.pop()) if len(ts_names) == 1 and "DATE" not in ts_names else TIMESTAMP
                # a literal the type cannot hold (TIMESTAMP_NS: 1677..2262; _S/_MS: finer
                # than the unit) makes the comparison one in TIMESTAMP (like numbers and DOUBLE)
                for p in typed:
                    if p.literal and p.type.kind in ("date", "timestamp", "strlit"):
                        pv = p.value
                        if p.type.kind == "strlit":
                            pv = _parse_timestamp(str(pv)) if t.kind == "timestamp" else None
                        if pv is not None and not ts_fits(pv, t):
                            return TIMESTAMP
                return t
            if "date" in kinds:
                return DATE
        if kinds <= {"int", "decimal", "float", "strlit"} and "strlit" not in kinds:
            base = [p.type for p in nonlit]
            if base:
                t = base[0]
                for b in base[1:]:
                    t = common_numeric(t, b)
                # literals that do not fit widen the type
                for p in typed:
                    if p.literal and p.type.name == "DOUBLE":
                        # a DOUBLE literal (7e-1, CAST(2.5 AS DOUBLE)) is no flexible number: DuckDB computes and compares
                        # an integer, DECIMAL or REAL with it in DOUBLE (CAST(2.5 AS DOUBLE) % dc is NaN at dc = 0)
                        t = DOUBLE
                    elif p.literal and p.type.name == "FLOAT":
                        # nor is a number cast to REAL (CAST(16777216 AS REAL)): an integer or DECIMAL is compared with
                        # it in REAL, as DuckDB (16777217 is then the REAL 16777216)
                        t = common_numeric(t, p.type)
                    if p.literal and not _fits(p.value, t):
                        t = common_numeric(t, p.type)
                        if not _fits(p.value, t):
                            t = DOUBLE
                return t
            t = typed[0].type
            for p in typed[1:]:
                t = common_numeric(t, p.type)
            return t
        names = sorted({("text" if p.type.kind in ("varchar",) else str(p.type)) for p in typed})
        hint = ""
        if "varchar" in kinds and kinds & {"int", "decimal", "float"}:
            # name the fix with the query's own number type and literal (CAST(col AS INTEGER), or compare with '5')
            nums = [p for p in typed if p.type.kind in ("int", "decimal", "float")]
            num = nums[0]
            lit = num.expr.sql(dialect="duckdb") if len(nums) == 1 and isinstance(num.expr, exp.Literal) else ""
            to = "DOUBLE" if num.literal and num.type.kind != "int" else num.type
            hint = (f"; DuckDB would cast text implicitly and fail on a value that does not convert: write CAST(col AS "
                    f"{to}) (a value that does not convert is then NULL) or compare with "
                    + (f"the string literal '{lit}'" if lit else "a string literal"))
        elif "strlit" in kinds and kinds & {"int", "decimal", "float"}:
            hint = "; write the number without quotes"
        raise self.refuse(node, f"{what} mixes incompatible types ({', '.join(names)}){hint}")

    def cap(self, r: Typed, node: exp.Expression) -> exp.Expression:
        """A VARCHAR argument of a string function: at most STRING_CAP characters."""
        if r.type.kind not in ("varchar", "strlit"):
            raise self.refuse(node, f"{self._fname(node)}() takes text, got {r.type}; write CAST(... AS VARCHAR)")
        if r.literal:
            if len(str(r.value)) > MAX_PATTERN:
                raise self.refuse(node, f"text literals given to {self._fname(node)}() may have at most {MAX_PATTERN} characters")
            return exp.Literal.string(str(r.value))
        return exp.Left(this=self.coerce(r, VARCHAR, node), expression=exp.Literal.number(STRING_CAP))

    @staticmethod
    def _fname(node: exp.Expression) -> str:
        name = func_name(node) or type(node).__name__.lower()
        return _SQL_SPELLING.get(name, name)

    def boolean(self, node: exp.Expression, what: str) -> exp.Expression:
        r = self.t(node)
        if r.type.kind == "null":
            return _cast(exp.Null(), BOOLEAN, try_=False)
        if r.type.kind == "bool":
            return self.coerce(r, BOOLEAN, node)
        raise self.refuse(
            node,
            f"{what} must be a boolean condition, but this is {r.type if r.type.kind != 'strlit' else 'a string'}"
            + ("; DuckDB would cast each value to BOOLEAN and fail on the first that does not convert: "
               "write a comparison such as col = 'yes', or TRY_CAST(col AS BOOLEAN)" if r.type.kind in ("varchar", "strlit")
               else "; write a comparison"),
        )

    def int_literal(self, node: exp.Expression, what: str, bound: int) -> int:
        r = self.t(node)
        if not (r.literal and r.type.kind == "int") or abs(int(r.value)) > bound:
            raise self.refuse(node, f"{what} must be an integer literal between -{bound} and {bound}")
        return int(r.value)

    def search(self, where: exp.Expression, name: str) -> None:
        """Count one substring search of this expression (at most MAX_SEARCHES, LIKE tests included; ``name``
        as the message shows it). The rendering is counted again (``_check_rendered``): guards repeat operands."""
        self.searches += 1
        if self.searches > MAX_SEARCHES:
            raise self.refuse(where, f"an expression may hold at most {MAX_SEARCHES} substring searches (LIKE/ILIKE, "
                                     f"contains, strpos, replace, split_part; here {name} is one too many): their "
                                     "costs per row add up; split the condition or drop some of them")

    def needle(self, node: exp.Expression, parent: exp.Expression, fname: str, what: str, example: str) -> str:
        """The literal text a substring search looks for (``what``: how ``fname()`` calls it), at most
        MAX_LIKE_PATTERN characters, counted as one search: a search costs up to (text length x needle
        length) per row, so a needle taken from a row (a column, any expression) would let that row choose
        the cost of the query."""
        r = self.t(node)
        if not (r.literal and r.type.kind == "strlit"):
            raise self.refuse(node, f"{what} of {fname}() must be a string literal of at most {MAX_LIKE_PATTERN} "
                                    "characters, not a column or an expression (a search's cost per row grows with what "
                                    f"it looks for, so it may not come from a row): write it as one literal, e.g. {example}")
        text = str(r.value)
        if len(text) > MAX_LIKE_PATTERN:
            raise self.refuse(node, f"{what} of {fname}() may have at most {MAX_LIKE_PATTERN} characters (a search's "
                                    f"cost per row grows with its length), not {len(text)}: search for a shorter literal")
        self.search(parent, f"{fname}()")
        return text

    def text_literal(self, node: exp.Expression, what: str) -> str:
        r = self.t(node)
        if not (r.literal and r.type.kind == "strlit"):
            raise self.refuse(node, f"{what} must be a string literal")
        return str(r.value)

    # ---- the cases ---------------------------------------------------------------------------------
    def t(self, node: exp.Expression) -> Typed:
        """``node`` typed and rendered; refused as soon as its rendering exceeds ``MAX_RENDERED_NODES``
        (guards repeat their operand, so checking only the final rendering let the typer build,
        and spend time exponential in the nesting on, renderings far beyond the limit first)."""
        r = self._t(node)
        if _rendered_size(r.expr) > MAX_RENDERED_NODES:
            raise self.refuse(node, TOO_LARGE)
        return r

    def _t(self, node: exp.Expression) -> Typed:  # noqa: C901 - one dispatch over node kinds
        if isinstance(node, exp.Paren):
            r = self.t(node.this)
            return Typed(exp.Paren(this=r.expr), r.type, r.literal, r.value, r.bounds)
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star):
                raise self.refuse(node, "* is not allowed in an expression")
            name = node.name.lower()
            typ = self.schema.get(name)
            if typ is None:
                raise self.refuse(node, f"unknown column '{node.name}'")
            col = exp.column(name, quoted=True)
            if typ.enum:
                return Typed(_cast(col, VARCHAR, try_=False), VARCHAR)
            return Typed(col, typ)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return Typed(exp.Literal.string(node.this), STRLIT, True, node.this)
            text = str(node.this)
            if not _NUM_RE.fullmatch(text):
                raise self.refuse(node, f"number literal {text!r} is not understood")
            if re.search(r"[eE]", text):
                f = float(text)
                return Typed(typed_literal(f, DOUBLE), DOUBLE, True, decimal.Decimal(text))
            v = _lit_number(text)
            if isinstance(v, int):
                it = _int_type_for(v)
                if it is None:
                    return Typed(typed_literal(float(v), DOUBLE), DOUBLE, True, decimal.Decimal(v))
                return Typed(exp.Literal.number(v), it, True, v)
            p, s = _decimal_shape(v)
            if p > 38:
                return Typed(typed_literal(float(v), DOUBLE), DOUBLE, True, v)
            dtp = SqlType("decimal", f"DECIMAL({p},{s})", p, s)
            return Typed(typed_literal(v, dtp), dtp, True, v)
        if isinstance(node, exp.Boolean):
            return Typed(exp.Boolean(this=bool(node.this)), BOOLEAN, True, bool(node.this))
        if isinstance(node, exp.Null):
            return Typed(exp.Null(), NULL, True, None)
        if isinstance(node, exp.Neg):
            r = self.t(node.this)
            if r.literal and r.type.numeric:
                # exact: Decimal's unary minus would round to the context's 28 digits
                # (a DECIMAL zero has no sign, as in DuckDB: -0.0 is 0.0, and x / -0.0 is x / 0)
                v = (r.value.copy_negate() if r.value else r.value.copy_abs()) if isinstance(r.value, decimal.Decimal) \
                    else -r.value
                if isinstance(v, int):
                    it = _int_type_for(v)
                    if it is not None:
                        return Typed(exp.Literal.number(v) if v >= 0 else exp.Neg(this=exp.Literal.number(-v)), it, True, v)
                    return Typed(typed_literal(float(v), DOUBLE), DOUBLE, True, decimal.Decimal(v))
                if r.type.kind == "float":
                    return Typed(typed_literal(float(v), DOUBLE), DOUBLE, True, v)
                return Typed(typed_literal(v, r.type), r.type, True, v)
            if not r.type.numeric:
                raise self.refuse(node, f"unary minus needs a number, got {r.type}")
            if r.type.kind == "int":
                lo, hi = self._range(r)
                wide = self._holding(min(lo, -hi), max(hi, -lo))  # (the operand is cast into it too)
                if wide is not None:
                    return Typed(_numeric_tag(exp.Neg(this=exp.Paren(this=self.coerce(r, wide, node))), wide), wide,
                                 bounds=(-hi, -lo))
                if r.type.name == "HUGEINT":
                    # -x fails only for the least HUGEINT: that value is NULL (one operand reference)
                    return Typed(_numeric_tag(exp.Neg(this=exp.Paren(this=_not_least(r.expr, r.type))), r.type), r.type)
                # unsigned beyond HUGEINT (UHUGEINT): computed in DOUBLE
                return Typed(exp.Neg(this=exp.Paren(this=self.coerce(r, DOUBLE, node))), DOUBLE)
            return Typed(_numeric_tag(exp.Neg(this=exp.Paren(this=r.expr)), r.type), r.type)
        if isinstance(node, (exp.And, exp.Or)):
            a = self.boolean(node.this, "AND/OR")
            b = self.boolean(node.expression, "AND/OR")
            cls = type(node)
            return Typed(cls(this=exp.Paren(this=a), expression=exp.Paren(this=b)), BOOLEAN)
        if isinstance(node, exp.Not):
            a = self.boolean(node.this, "NOT")
            return Typed(exp.Not(this=exp.Paren(this=a)), BOOLEAN)
        if isinstance(node, exp.Is):
            rhs = node.expression
            if isinstance(rhs, exp.Null):
                r = self.t(node.this)
                return Typed(exp.Is(this=exp.Paren(this=r.expr), expression=exp.Null()), BOOLEAN)
            if isinstance(rhs, exp.Boolean):
                a = self.boolean(node.this, "IS TRUE/FALSE")
                return Typed(exp.Is(this=exp.Paren(this=a), expression=exp.Boolean(this=bool(rhs.this))), BOOLEAN)
            raise self.refuse(node, "IS takes NULL, TRUE or FALSE")
        if isinstance(node, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)):
            a, b = self.t(node.this), self.t(node.expression)
            typ = self.unify([a, b], node, "the comparison")
            if typ.kind == "null":
                return Typed(_cast(exp.Null(), BOOLEAN, try_=False), BOOLEAN)
            cls = type(node)
            return Typed(cls(this=_text_binary(self.coerce(a, typ, node), typ), expression=_other_binary(self.coerce(b, typ, node), typ)),
                         BOOLEAN)
        if isinstance(node, exp.Between):
            if node.args.get("symmetric"):
                raise self.refuse(node, "BETWEEN SYMMETRIC is not supported: write the bounds in order (low AND high)")
            parts = [self.t(node.this), self.t(node.args["low"]), self.t(node.args["high"])]
            typ = self.unify(parts, node, "BETWEEN")
            if typ.kind == "null":
                return Typed(_cast(exp.Null(), BOOLEAN, try_=False), BOOLEAN)
            c = [self.coerce(p, typ, node) for p in parts]
            return Typed(exp.Between(this=_text_binary(c[0], typ), low=_other_binary(c[1], typ), high=_other_binary(c[2], typ)), BOOLEAN)
        if isinstance(node, exp.In):
            if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
                raise self.refuse(node, "IN takes a list of values")
            items = list(node.expressions)
            if len(items) > MAX_IN_LIST:
                raise self.refuse(node, f"IN lists may have at most {MAX_IN_LIST} elements")
            parts = [self.t(node.this)] + [self.t(i) for i in items]
            typ = self.unify(parts, node, "IN")
            if typ.kind == "null":
                return Typed(_cast(exp.Null(), BOOLEAN, try_=False), BOOLEAN)
            c = [self.coerce(p, typ, node) for p in parts]
            text_read = typ.kind == "varchar" and not all(p.literal for p in parts[1:])
            if len(items) > IN_LIST_SCANNED and _digestible(typ) and not text_read:
                # (a list with an element read from a row is no hash table's: DuckDB and Spark compare it element
                # by element, each comparison stopping at the first difference, where a digest reads all of both)
                head = c[0]
                if typ.kind == "varchar":
                    # a text longer than every element equals none: its digest reads at most one character more
                    # than the longest (one person's 60 kB texts under 400 such lists: 60 ms a row, against 0.1 ms)
                    longest = max((len(str(p.value)) for p in parts[1:] if p.value is not None), default=0)
                    if longest > MAX_PATTERN:  # the digest reads as much of every row's text
                        raise self.refuse(node, f"the texts of an IN list of more than {IN_LIST_SCANNED} elements may have at "
                                                f"most {MAX_PATTERN} characters (each row's text is read up to the longest), "
                                                f"not {longest}: compare a longer text with =")
                    head = exp.Left(this=head, expression=exp.Literal.number(longest + 1))
                return Typed(exp.In(this=_digest(head, typ), expressions=[_digest(x, typ) for x in c[1:]]), BOOLEAN)
            return Typed(exp.In(this=_text_binary(c[0], typ), expressions=[_other_binary(x, typ) for x in c[1:]]), BOOLEAN)
        if isinstance(node, exp.Case):
            if node.this is not None:
                # CASE x WHEN v THEN ...: compare x with each v (a comparison in parentheses: DuckDB refuses to parse
                # a chained comparison such as a = 'x' = b)
                conds = [exp.EQ(this=_operand(node.this), expression=_operand(i.this)) for i in node.args.get("ifs") or []]
            else:
                conds = [i.this for i in node.args.get("ifs") or []]
            values = [i.args.get("true") for i in node.args.get("ifs") or []]
            default = node.args.get("default")
            return self._conditional(node, conds, values, default)
        if isinstance(node, exp.If):
            return self._conditional(node, [node.this], [node.args.get("true")], node.args.get("false"))
        if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
            args = [node.this] + list(node.expressions)
            parts = [self.t(x) for x in args if x is not None]
            typ = self.unify(parts, node, self._fname(node).upper())
            if typ.kind == "null":
                return Typed(exp.Null(), NULL, True, None)
            c = [self.coerce(p, typ, node) for p in parts]
            cls = type(node)
            if cls is exp.Coalesce:
                return Typed(cls(this=_text_binary(c[0], typ), expressions=[_other_binary(x, typ) for x in c[1:]]), typ)
            # DuckDB's GREATEST / LEAST skip NULL arguments (NULL only when all are): keep that
            # meaning, which sqlglot renders as written only with ignore_nulls (otherwise as a
            # NULL-propagating CASE)
            return Typed(cls(this=_text_binary(c[0], typ), expressions=[_other_binary(x, typ) for x in c[1:]], ignore_nulls=True), typ)
        if isinstance(node, exp.Nullif):
            a, b = self.t(node.this), self.t(node.expression)
            typ = self.unify([a, b], node, "NULLIF")
            if typ.kind == "null":
                return Typed(exp.Null(), NULL, True, None)
            if a.type.kind not in ("null", "strlit") and a.type.name != typ.name:
                # DuckDB compares in the common type but returns ``a`` in its own type (NULLIF(2.5, 1e308) is the
                # DECIMAL 2.5, which CAST(... AS INTEGER) rounds to 3; as a DOUBLE it would be 2)
                same = exp.EQ(this=_text_binary(self.coerce(a, typ, node), typ), expression=_other_binary(self.coerce(b, typ, node), typ))
                own = self.coerce(a, a.type, node)
                return Typed(exp.Case(ifs=[exp.If(this=same, true=_cast(exp.Null(), a.type, try_=False))], default=own),
                             a.type, bounds=a.bounds)
            return Typed(exp.Nullif(this=_text_binary(self.coerce(a, typ, node), typ),
                                    expression=_other_binary(self.coerce(b, typ, node), typ)), typ)
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return self._cast(node)
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
            return self._arith(node)
        if isinstance(node, exp.Div):
            a, b = self._numeric(node.this, node), self._numeric(node.expression, node)
            if "FLOAT" in (a.type.name, b.type.name) and DOUBLE.name not in (a.type.name, b.type.name):
                # a REAL with a REAL, an integer or a DECIMAL: DuckDB divides in REAL (32 bits; beyond its range inf).
                # The cast, a no-op on DuckDB, is where Spark (whose quotient is a DOUBLE) rounds it to a REAL
                quotient = exp.Div(this=self.coerce(a, REAL, node), expression=self.coerce(b, REAL, node))
                return Typed(exp.Cast(this=quotient, to=exp.DataType.build("FLOAT")), REAL)
            return Typed(exp.Div(this=self.coerce(a, DOUBLE, node), expression=self.coerce(b, DOUBLE, node)), DOUBLE)
        if isinstance(node, (exp.IntDiv, exp.Mod)):
            a, b = self._numeric(node.this, node), self._numeric(node.expression, node)
            typ = self.unify([a, b], node, "//" if isinstance(node, exp.IntDiv) else "%")
            if typ.kind == "decimal" and isinstance(node, exp.Mod):
                # exact in the common DECIMAL type (|a % b| < |b| cannot overflow; DuckDB's
                # DECIMAL % is exact, where DOUBLE's fmod gives 0.3 % 0.1 = 0.09999999999999998);
                # a zero divisor is NULL
                return Typed(exp.Mod(this=self.coerce(a, typ, node), expression=_nonzero(self.coerce(b, typ, node), typ)), typ)
            if typ.kind == "decimal":
                typ = DOUBLE
            if typ.kind == "float" and isinstance(node, exp.IntDiv):
                if a.type.kind == b.type.kind == "int":  # a UHUGEINT with a signed integer: DuckDB's common type is DOUBLE
                    raise self.refuse(node, f"// of {a.type} and {b.type}: no integer type holds both; cast one, e.g. "
                                            "CAST(a AS HUGEINT) // b (a value that does not fit is then NULL)")
                raise self.refuse(node, "// takes integers; use floor(a / b)")
            cls = type(node)
            if typ.kind != "int":
                return Typed(_float_remainder(self.coerce(a, typ, node), self.coerce(b, typ, node)), typ)
            return self._int_div(node, a, b, typ)
        if isinstance(node, exp.DPipe):
            return Typed(exp.DPipe(this=self.cap(self.t(node.this), node), expression=self.cap(self.t(node.expression), node), safe=True), VARCHAR)
        if isinstance(node, (exp.Like, exp.ILike)):
            return self._like(node, None)
        if isinstance(node, exp.Escape):
            if not isinstance(node.this, (exp.Like, exp.ILike)):
                raise self.refuse(node, "ESCAPE is only allowed after a LIKE or ILIKE pattern")
            return self._like(node.this, node)
        if isinstance(node, exp.Collate):
            raise self.refuse(
                node,
                "COLLATE is not allowed: a collation makes different spellings equal, so a released key could be "
                "spelled by one person's row; use lower()/upper() to compare text case-insensitively",
            )
        if isinstance(node, exp.Func):
            handler = _FUNCS.get(type(node))
            if handler is None and isinstance(node, exp.Anonymous):
                handler = _ANON.get(str(node.this).lower())
            if handler is not None:
                return handler(self, node)
            fix = _OFF_LIST_FIXES.get(self._fname(node), _OFF_LIST_FIXES.get(type(node)))
            raise self.refuse(
                node,
                f"function {self._fname(node)}() is not on the allow-list of functions with a total, bounded-cost "
                "evaluation (see docs/expressions.md)" + (f"; {fix}" if fix else ""),
            )
        raise self.refuse(node, f"the expression {type(node).__name__.upper()} is not on the allow-list (see docs/expressions.md)")

    def _like(self, node: exp.Expression, escape: exp.Escape | None) -> Typed:
        """``x [NOT] LIKE / ILIKE 'pattern' [ESCAPE 'c']``: a literal pattern of at most MAX_LIKE_PATTERN
        characters, at most MAX_LIKES per expression. An escape is one ASCII character (DuckDB takes one byte)
        other than a letter (ILIKE lower-cases the pattern on some engines), '%' and '_', and in the pattern
        it precedes only '%', '_' or itself: DuckDB reads an escaped ordinary letter as the letter and fails
        on a pattern ending in its escape, Spark fails on both, so such a pattern is refused here, for free,
        on every engine."""
        a = self.t(node.this)
        pr = self.t(node.expression)
        where = escape if escape is not None else node
        if not (pr.literal and pr.type.kind == "strlit"):
            raise self.refuse(where, "the LIKE pattern must be a string literal")
        pattern = str(pr.value)
        if len(pattern) > MAX_LIKE_PATTERN:
            raise self.refuse(where, f"a LIKE pattern may have at most {MAX_LIKE_PATTERN} characters (its cost per row grows with its length)")
        esc: str | None = None
        if escape is not None:
            er = self.t(escape.expression)
            esc = str(er.value) if er.literal and er.type.kind == "strlit" else None
            if esc is None or len(esc) != 1 or not esc.isascii() or esc in "%_" or esc.isalpha():
                raise self.refuse(escape, "ESCAPE takes a string literal of one ASCII character other than a letter, "
                                          "'%' and '_', e.g. ESCAPE '!' or ESCAPE '\\'")
            problem = _escape_problem(pattern, esc)
            if problem is not None:
                raise self.refuse(escape, problem)
        self.likes += 1
        if self.likes > MAX_LIKES:
            raise self.refuse(where, f"an expression may hold at most {MAX_LIKES} LIKE/ILIKE tests (bounded cost per row)")
        self.search(where, "LIKE" if isinstance(node, exp.Like) else "ILIKE")
        cls = type(node)
        out: exp.Expression = cls(this=_binary(self.cap(a, node)), expression=self.cap(pr, node))
        if esc is not None:
            out = exp.Escape(this=out, expression=exp.Literal.string(esc))
        if node.args.get("negate"):
            out = exp.Not(this=out)
        return Typed(out, BOOLEAN)

    def _numeric(self, node: exp.Expression, parent: exp.Expression) -> Typed:
        r = self._operand(node)
        if r.type.kind == "null":
            return Typed(_cast(exp.Null(), DOUBLE, try_=False), DOUBLE)
        if not r.type.numeric:
            raise self.refuse(
                parent,
                f"arithmetic needs numbers, got {r.type if r.type.kind != 'strlit' else 'a string'}"
                + ("; write CAST(col AS DOUBLE) (a value that does not convert is then NULL)" if r.type.kind == "varchar" else "")
                + ("; shift a date or timestamp by an INTERVAL (d + INTERVAL 1 DAY), compare it with a shifted literal "
                   "(ts > TIMESTAMP '2024-12-31' - INTERVAL 30 DAY), or subtract two DATEs for a number of days "
                   + (f"(CAST({node.sql(dialect='duckdb') if isinstance(node, exp.Column) else 'ts'} AS DATE) - DATE '2024-01-01')"
                      if r.type.kind == "timestamp" else "(d - DATE '2024-01-01')")
                   if r.type.kind in ("date", "timestamp") else ""),
            )
        return r

    @staticmethod
    def _range(r: Typed) -> tuple[int, int]:
        if r.literal and r.type.kind == "int":
            return int(r.value), int(r.value)
        if r.bounds is not None:
            return r.bounds
        lo, hi, _ = _INT_RANGES[r.type.name]
        return lo, hi

    @staticmethod
    def _widest(a: SqlType, b: SqlType) -> SqlType:
        """The wider of a signed integer type of ``_holding`` and another integer type, when it is a signed one."""
        order = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT")
        return b if b.name in order and order.index(b.name) > order.index(a.name) else a

    @staticmethod
    def _holding(lo: int, hi: int) -> SqlType | None:
        """The smallest signed integer type (at least INTEGER) holding [lo, hi], if any (a computed
        HUGEINT: at most ``HUGEINT_COMPUTED`` in magnitude, the range every engine holds)."""
        for n in ("INTEGER", "BIGINT", "HUGEINT"):
            tlo, thi, _ = _INT_RANGES[n] if n != "HUGEINT" else (-HUGEINT_COMPUTED, HUGEINT_COMPUTED, 38)
            if tlo <= lo and hi <= thi:
                return SqlType("int", n)
        return None

    def _int_div(self, node: exp.Expression, a: Typed, b: Typed, typ: SqlType) -> Typed:
        """Integer ``//`` / ``%``, total without TRY (so no row can trigger TRY's slow path).

        Division by zero is NULL: the divisor is ``NULLIF(b, 0)``. ``//`` overflows only for the
        least value of a signed type divided by -1: it is computed in a type that holds every
        quotient of the operand types (|a // b| <= |a|); for HUGEINT operands, where none exists,
        ``CASE WHEN b = -1 THEN -NULLIF(a, least) ELSE a // NULLIF(b, 0) END``. ``%`` cannot
        overflow (|a % b| < |b|; DuckDB gives least % -1 = 0).
        """
        cls = type(node)
        if b.literal and b.value not in (0, -1):
            # a literal divisor other than 0 and -1: neither failure is possible
            return Typed(cls(this=self.coerce(a, typ, node), expression=self.coerce(b, typ, node)), typ)
        if isinstance(node, exp.IntDiv):
            (lo, hi), (blo, _) = self._range(a), self._range(b)
            m = max(abs(lo), abs(hi))
            qlo, qhi = (0 if lo >= 0 and blo >= 0 else -m), m  # every quotient lies in [qlo, qhi]
            tlo, thi, _ = _INT_RANGES[typ.name]
            if not (tlo <= qlo and qhi <= thi):
                wide = self._holding(min(qlo, tlo), max(qhi, thi))  # holds both operands and quotients
                if wide is not None and typ.name == "BIGINT" and wide.name == "HUGEINT" and _plain(node):
                    # two columns (or a column and a literal) divided in BIGINT, a machine division:
                    # DuckDB's 128-bit division loops over the dividend's bits, so one person's values
                    # near 2^62 made each // about 5x slower than small ones; the one quotient beyond
                    # BIGINT (least // -1) is the HUGEINT negation. Operands that are expressions keep
                    # the 128-bit division: this CASE repeats them, and their work would count twice
                    ca, cb = self.coerce(a, typ, node), self.coerce(b, typ, node)
                    quot = _cast(cls(this=ca.copy(), expression=_nonzero(cb.copy(), typ)), wide, try_=False)
                    neg = exp.Neg(this=exp.Paren(this=_cast(ca.copy(), wide, try_=False)))
                    return Typed(exp.Case(ifs=[exp.If(this=exp.EQ(this=cb.copy(), expression=typed_literal(-1, typ)),
                                                      true=neg)], default=quot), wide)
                if wide is not None:
                    typ = wide
                elif typ.name == "HUGEINT":
                    ca, cb = self.coerce(a, typ, node), self.coerce(b, typ, node)
                    minus_one = typed_literal(-1, typ)
                    quot = cls(this=ca.copy(), expression=_nonzero(cb.copy(), typ))
                    neg = exp.Neg(this=exp.Paren(this=_not_least(ca.copy(), typ)))
                    return Typed(exp.Case(ifs=[exp.If(this=exp.EQ(this=cb.copy(), expression=minus_one), true=neg)],
                                          default=quot), typ)
                else:  # pragma: no cover - unify() gives a signed type whenever a quotient can be negative
                    raise self.refuse(node, f"// on {typ} cannot be computed exactly here")
        ca, cb = self.coerce(a, typ, node), self.coerce(b, typ, node)
        return Typed(cls(this=ca, expression=_nonzero(cb, typ)), typ)

    def _arith(self, node: exp.Expression) -> Typed:
        if isinstance(node, (exp.Add, exp.Sub)) and (
            isinstance(node.expression, exp.Interval) or (isinstance(node, exp.Add) and isinstance(node.this, exp.Interval))
        ):
            return self._shift_literal(node)
        days = self._date_days(node)
        if days is not None:
            return days
        between = self._days_between(node)
        if between is not None:
            return between
        a, b = self._numeric(node.this, node), self._numeric(node.expression, node)
        cls = type(node)
        nulls = [isinstance(n, exp.Null) for n in (node.this, node.expression)]
        if nulls[0] != nulls[1]:
            # NULL + x is NULL of x's type as in DuckDB (NULL - 1 is an INTEGER: not DOUBLE, which would turn a
            # CASE of it and a DECIMAL into DOUBLE), of no type for a DECIMAL x
            other = b if nulls[0] else a
            if other.type.kind == "decimal":
                return Typed(exp.Null(), NULL, True, None)
            return Typed(_cast(exp.Null(), other.type, try_=False), other.type)
        if a.type.kind == "int" and b.type.kind == "int":
            # integers: computed in a type wide enough for every result of the operand types
            # (total, no TRY); only when none exists (HUGEINT-sized operands) under TRY
            (alo, ahi), (blo, bhi) = self._range(a), self._range(b)
            if isinstance(node, exp.Add):
                lo, hi = alo + blo, ahi + bhi
            elif isinstance(node, exp.Sub):
                lo, hi = alo - bhi, ahi - blo
            else:
                prods = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
                lo, hi = min(prods), max(prods)
            # (the operands are cast into it too: bi * 0 is 0, an INTEGER, of a BIGINT bi)
            wide = self._holding(min(lo, alo, blo), max(hi, ahi, bhi))
            if wide is not None and a.bounds is not None and not a.literal:
                wide = self._widest(wide, a.type)  # (an operand of narrow proven range keeps its type: DuckDB's)
            if wide is not None and b.bounds is not None and not b.literal:
                wide = self._widest(wide, b.type)
            if wide is not None:
                return Typed(cls(this=self.coerce(a, wide, node), expression=self.coerce(b, wide, node)), wide,
                             bounds=(lo, hi))
        typ = self.unify([a, b], node, "arithmetic")
        if typ.kind == "decimal" or {a.type.kind, b.type.kind} == {"int", "decimal"}:
            # (an integer counts the digits of its proven range: a sum widened to HUGEINT may still fit)
            exact = self._decimal_arith(node, a, b)
            if exact is not None:
                return exact
        if typ.kind in ("decimal", "int"):
            # DECIMAL arithmetic whose result type cannot hold every result, and integers beyond
            # HUGEINT: computed in DOUBLE (total)
            typ = DOUBLE
        return Typed(cls(this=self.coerce(a, typ, node), expression=self.coerce(b, typ, node)), typ)

    def _operand(self, node: exp.Expression) -> Typed:
        """``node`` typed: taken from :attr:`_operands` when :meth:`_date_days` typed this very node already."""
        kept = self._operands.pop(id(node), None)
        return kept[1] if kept is not None and kept[0] is node else self.t(node)

    def _date_days(self, node: exp.Expression) -> Typed | None:
        """``DATE +/- n`` (and ``n + DATE``) for an integer literal n: DuckDB's DATE n days later (earlier), i.e. the
        shift by ``INTERVAL n DAY`` cast back to DATE: a literal folded here, a row's value NULL unless it and its
        shift lie in years 1..9999 (:meth:`_shift_value`). None for anything else (refused as arithmetic)."""
        if not isinstance(node, (exp.Add, exp.Sub)):
            return None
        pairs = [(node.this, node.expression)] + ([(node.expression, node.this)] if isinstance(node, exp.Add) else [])
        for d_node, n_node in pairs:
            k = n_node.this if isinstance(n_node, exp.Neg) else n_node
            if not (isinstance(k, exp.Literal) and not k.is_string and str(k.this).isdigit()):
                continue
            n = int(str(k.this)) * (-1 if isinstance(n_node, exp.Neg) else 1) * (-1 if isinstance(node, exp.Sub) else 1)
            r = self._operand(d_node)
            if r.type.kind != "date":
                self._operands[id(d_node)] = (d_node, r)
                return None
            if abs(n) > 3_700_000:  # (more days than years 1..9999 hold: no date in dpsql's date range)
                raise self.refuse(node, "the shift by a number of days is outside years 1..9999")
            if r.literal and r.value is not None:
                try:
                    v = r.value + dt.timedelta(days=n)
                except OverflowError:
                    raise self.refuse(node, "the shifted date is outside years 1..9999") from None
                return Typed(typed_literal(v, DATE), DATE, True, v)
            shifted = self._shift_value(r, 0, dt.timedelta(days=n), node)
            return Typed(_cast(shifted.expr, DATE, try_=False), DATE)
        return None

    def _days_between(self, node: exp.Expression) -> Typed | None:
        """``DATE - DATE``: DuckDB's BIGINT number of days from the second to the first (NULL where either is
        NULL). Two literals are folded here; otherwise rendered ``date_diff('day', b, a)``, which is total: it
        is NULL for an infinite date (where DuckDB's ``-`` gives a number), and two finite dates (32-bit day
        numbers) lie at most 2^32 days apart, a BIGINT (the bound the typer proves). None for anything else."""
        if not isinstance(node, exp.Sub):
            return None
        a = self._operand(node.this)
        if a.type.kind != "date":
            self._operands[id(node.this)] = (node.this, a)
            return None
        b = self._operand(node.expression)
        if b.type.kind != "date":
            self._operands[id(node.this)] = (node.this, a)
            self._operands[id(node.expression)] = (node.expression, b)
            return None
        if a.literal and b.literal:
            if a.value is None or b.value is None:
                return Typed(_cast(exp.Null(), BIGINT, try_=False), BIGINT)
            v = (a.value - b.value).days
            return Typed(typed_literal(v, BIGINT), BIGINT, True, v, bounds=(v, v))
        diff = exp.DateDiff(this=self.coerce(a, DATE, node), expression=self.coerce(b, DATE, node),
                            unit=exp.var("DAY"))
        return Typed(diff, BIGINT, bounds=(-(2**32), 2**32))

    def _shift_literal(self, node: exp.Expression) -> Typed:
        """``DATE/TIMESTAMP literal +/- INTERVAL n unit`` (or ``INTERVAL ... + literal``), folded here into
        a TIMESTAMP literal (DuckDB's type for both), as DuckDB computes it: months are added with the day
        clamped to the month's end (``DATE '2024-03-31' - INTERVAL 1 MONTH`` is 2024-02-29 00:00:00),
        other units exactly. Nothing is evaluated on a row, so the result is as total as any literal.
        An INTERVAL applied to a non-literal DATE/TIMESTAMP is computed per row (:meth:`_shift_value`);
        on anything else it is refused (an INTERVAL is no value a row may hold here)."""
        interval, other = (node.expression, node.this) if isinstance(node.expression, exp.Interval) else (node.this, node.expression)
        sign = -1 if isinstance(node, exp.Sub) else 1
        r = self.t(other)
        if r.type.kind in ("date", "timestamp") and not r.literal:
            months, delta = self._interval_value(interval)
            return self._shift_value(r, sign * months, sign * delta, node)
        if not (r.literal and r.type.kind in ("date", "timestamp") and r.value is not None):
            raise self.refuse(node, "INTERVAL arithmetic is only supported on a DATE or TIMESTAMP value, e.g. "
                              "order_ts >= TIMESTAMP '2024-06-01' - INTERVAL 30 DAY or ship_date - INTERVAL 2 DAY > order_date")
        months, delta = self._interval_value(interval)
        v = r.value if isinstance(r.value, dt.datetime) else dt.datetime(r.value.year, r.value.month, r.value.day)
        try:
            if months:
                y, m = divmod(v.month - 1 + sign * months, 12)
                year, month = v.year + y, m + 1
                if not 1 <= year <= 9999:
                    raise OverflowError
                last = (dt.date(year + (month == 12), month % 12 + 1, 1) - dt.timedelta(days=1)).day if year < 9999 or month < 12 else 31
                v = v.replace(year=year, month=month, day=min(v.day, last))
            v = v + sign * delta
        except OverflowError:
            raise self.refuse(node, "the shifted date is outside years 1..9999") from None
        return Typed(typed_literal(v, TIMESTAMP), TIMESTAMP, True, v)

    def _shift_value(self, r: Typed, months: int, delta: dt.timedelta, node: exp.Expression) -> Typed:
        """A DATE/TIMESTAMP expression shifted by one INTERVAL (``months``, or the exact ``delta``) as a
        TIMESTAMP: :func:`guarded_shift` of it (NULL unless the value and its shift lie in years 1..9999)."""
        x = self.coerce(r, TIMESTAMP, node)  # a DATE (or TIMESTAMP_S/_MS/_NS) through TRY_CAST
        return Typed(guarded_shift(x, months, delta), TIMESTAMP)

    def _interval_value(self, node: exp.Interval) -> tuple[int, dt.timedelta]:
        """(months, exact part) of ``INTERVAL n unit`` / ``INTERVAL 'n unit'`` with a whole n (of one unit)."""
        parts = interval_parts(node)
        if parts is None:
            raise self.refuse(node, INTERVAL_FORM)
        return parts

    def _decimal_digits(self, r: Typed) -> tuple[int, int] | None:
        """(precision, scale) of a DECIMAL or integer operand: an integer's digits are those of
        its proven range (a literal's own value)."""
        if r.type.kind == "decimal":
            return r.type.precision, r.type.scale
        if r.type.kind == "int":
            lo, hi = self._range(r)
            return max(1, len(str(max(abs(lo), abs(hi))))), 0
        return None

    def _decimal_arith(self, node: exp.Expression, a: Typed, b: Typed) -> Typed | None:
        """``+ - *`` on DECIMAL (and integer) operands, exactly, when DuckDB's result type holds
        every result of the operand types: ``a + b`` / ``a - b`` in DECIMAL(max(p1-s1, p2-s2) +
        max(s1, s2) + 1, max(s1, s2)) and ``a * b`` in DECIMAL(p1 + p2, s1 + s2), at most 38 digits.
        Then no value overflows (DuckDB raises only on a result beyond its type), and
        ``j * 0.1 = 0.3`` holds as in SQL (in DOUBLE, 3 * 0.1 is 0.30000000000000004). None when
        the type would need more than 38 digits (computed in DOUBLE by the caller)."""
        da, db = self._decimal_digits(a), self._decimal_digits(b)
        if da is None or db is None:
            return None
        (pa_, sa), (pb, sb) = da, db
        cls = type(node)
        if isinstance(node, (exp.Add, exp.Sub)):
            s = max(sa, sb)
            ip = max(pa_ - sa, pb - sb)
            if ip + s + 1 > 38:
                return None
            # both operands in DECIMAL(ip + s, s): DuckDB adds them in DECIMAL(ip + s + 1, s)
            common = SqlType("decimal", f"DECIMAL({ip + s},{s})", ip + s, s)
            rt = SqlType("decimal", f"DECIMAL({ip + s + 1},{s})", ip + s + 1, s)
            return Typed(cls(this=self.coerce(a, common, node), expression=self.coerce(b, common, node)), rt)
        if pa_ + pb > 38:
            return None
        if pa_ + pb > 18:
            # DuckDB multiplies two DECIMALs of at most 18 digits in 64 bits whatever the result
            # type (and raises beyond): one operand in 128 bits (>= 19 digits) makes it 128-bit;
            # the result type is then DECIMAL(min(38, p1' + p2), s1 + s2), which holds every product
            pa_ = max(pa_, 19)
        ta = SqlType("decimal", f"DECIMAL({pa_},{sa})", pa_, sa)
        tb = SqlType("decimal", f"DECIMAL({pb},{sb})", pb, sb)
        rp = min(38, pa_ + pb)
        rt = SqlType("decimal", f"DECIMAL({rp},{sa + sb})", rp, sa + sb)
        return Typed(cls(this=self.coerce(a, ta, node), expression=self.coerce(b, tb, node)), rt)

    def _conditional(
        self, node: exp.Expression, conds: list[exp.Expression], values: list[exp.Expression | None],
        default: exp.Expression | None,
    ) -> Typed:
        cs = [self.boolean(c, "a CASE / IF condition") for c in conds]
        parts = [self.t(v) if v is not None else Typed(exp.Null(), NULL, True, None) for v in values]
        dpart = self.t(default) if default is not None else None
        typ = self.unify(parts + ([dpart] if dpart is not None else []), node, "CASE / IF")
        if typ.kind == "null":
            return Typed(exp.Null(), NULL, True, None)
        ifs = [exp.If(this=c, true=self.coerce(p, typ, node)) for c, p in zip(cs, parts, strict=True)]
        d = self.coerce(dpart, typ, node) if dpart is not None else None
        return Typed(exp.Case(ifs=ifs, default=d), typ)

    _CAST_TARGETS = ("bool", "int", "decimal", "float", "varchar", "date", "timestamp")

    def _cast(self, node: exp.Expression) -> Typed:
        to = node.args.get("to")
        target = parse_type(to.sql(dialect="duckdb")) if isinstance(to, exp.DataType) else SqlType("other", "?")
        if target.kind not in self._CAST_TARGETS or target.enum:
            raise self.refuse(
                node, f"CAST to {to.sql(dialect='duckdb') if isinstance(to, exp.Expression) else to} is not supported; "
                "cast to BOOLEAN, an integer type, DECIMAL(p,s), DOUBLE, VARCHAR, DATE or TIMESTAMP",
            )
        if target.kind == "decimal" and not (1 <= target.precision <= 38 and 0 <= target.scale <= target.precision):
            raise self.refuse(node, "DECIMAL(p,s) needs 1 <= p <= 38 and 0 <= s <= p")
        r = self.t(node.this)
        if r.type.kind == "null":
            return Typed(_cast(exp.Null(), target, try_=False), target)
        timely = {r.type.kind in ("date", "timestamp"), target.kind in ("date", "timestamp")}
        if len(timely) == 2 and (r.type.numeric or r.type.kind == "bool" or target.numeric or target.kind == "bool"):
            # no engine converts these (DuckDB's TRY_CAST is NULL for every row, Spark refuses it when binding)
            raise self.refuse(
                node, f"a value of type {r.type} cannot be cast to {target}: no engine converts between numbers (or booleans) "
                "and dates or timestamps; convert with make_date(year, month, day), or read a date's parts with "
                "year(d), month(d), day(d) or date_part('epoch', ts)")
        if r.literal:
            if r.type.kind == "strlit" and target.kind in ("date", "timestamp", "bool", "varchar"):
                return Typed(typed_literal(self._literal_as(r, target, node), target), target, True, self._literal_as(r, target, node))
            if r.type.numeric and target.numeric and _fits(r.value, target):
                v = float(r.value) if target.kind == "float" else r.value
                if target.name == "FLOAT" and v - v == 0:  # (finite)
                    # a REAL holds the number rounded to 32 bits (CAST(0.1 AS REAL) is 0.100000001490116...): the
                    # literal carries that value, as DuckDB compares it with a DOUBLE
                    from dpsql.plan.folding import _real_of_text
                    v = _real_of_text(str(r.value))
                return Typed(typed_literal(v, target), target, True, v)
            if r.type.kind in ("date", "timestamp") and target.kind in ("date", "timestamp"):
                # converted here (a TIMESTAMP_NS outside 1677..2262 is refused), never at run time
                v = r.value
                if target.kind == "date":
                    v = v.date() if isinstance(v, dt.datetime) else v
                else:
                    v = self._ts_in(v if isinstance(v, dt.datetime) else dt.datetime(v.year, v.month, v.day), target, node)
                return Typed(typed_literal(v, target), target, True, v)
            # any other literal conversion: TRY_CAST (NULL if it does not convert), its source type recorded as for a
            # column's (an engine whose conversion differs from DuckDB's, e.g. Spark's truncating CAST(20.5 AS INT),
            # converts it as DuckDB: 21, the value ``dpsql.plan.folding`` reads for a histogram's kept bins)
            out = _cast(r.expr, target)
            if r.type.kind != "strlit":
                out.meta[CAST_FROM] = r.type.name
            return Typed(out, target)
        if r.type.kind == "other":
            base = r.type.name.split("(")[0]
            if target.kind == "varchar" and base in _TEXT_CASTABLE:
                return Typed(_cast(r.expr, VARCHAR), VARCHAR)
            raise self.refuse(
                node, f"values of type {r.type} cannot be cast here; only {', '.join(_TEXT_CASTABLE)} cast to VARCHAR"
            )
        if target.name == "HUGEINT" and (r.type.kind == "float" or r.type.name == "UHUGEINT"):
            # through DECIMAL(38,0), guarded (below): the conversion to HUGEINT then always succeeds
            return Typed(_cast(guarded_conversion(r.expr, r.type, parse_type("DECIMAL(38,0)")), target), target)
        out = self.coerce(r, target, node) if r.type.name != target.name else r.expr
        if target.kind == "varchar" and r.type.kind in ("int", "decimal", "float", "date", "timestamp", "bool"):
            out.meta[_SHORT_TEXT] = True  # at most 64 characters (``_chars``)
        if target.name == "HUGEINT" and (r.type.kind in ("float", "varchar") or r.type.name == "UHUGEINT"):
            # a converted HUGEINT holds what every engine's does, +-(10^38 - 1) (Spark's is DECIMAL(38,0)): beyond,
            # NULL on both (DuckDB's own reaches +-(2^127 - 1): CAST(1.5e38 AS HUGEINT) was a value there, NULL on Spark)
            out = _cast(_cast(out, "DECIMAL(38,0)"), target)
        return Typed(out, target)


def _escape_problem(pattern: str, esc: str) -> str | None:
    """Why ``pattern`` is not a LIKE pattern every engine reads alike with the escape ``esc``, or None."""
    i = 0
    while i < len(pattern):
        if pattern[i] == esc:
            nxt = pattern[i + 1] if i + 1 < len(pattern) else None
            if nxt is None:
                return f"the LIKE pattern ends with its escape character '{esc}': escape '%', '_' or '{esc}' itself"
            if nxt not in ("%", "_", esc):
                return (f"the escape character '{esc}' may precede only '%', '_' or itself in the LIKE pattern, not '{nxt}' "
                        f"(write '{nxt}' alone)")
            i += 2
        else:
            i += 1
    return None


def _unary_numeric(result: Callable[[SqlType], tuple[SqlType, bool]], name: str) -> Callable[[Typer, exp.Expression], Typed]:
    def h(ty: Typer, node: exp.Expression) -> Typed:
        extra = [k for k, v in node.args.items() if v is not None and k not in ("this", "decimals")]
        if extra:
            raise ty.refuse(node, f"{name}() takes one argument here")
        r = ty._numeric(node.this, node)
        digits: int | None = None
        if node.args.get("decimals") is not None:
            if not isinstance(node, exp.Round):
                raise ty.refuse(node, f"{name}() takes one argument here; use round(x, digits)")
            digits = ty.int_literal(node.args["decimals"], f"the digits of {name}()", 38)
        cls = type(node)
        if result is _to_double:
            # sqrt, ln: DOUBLE for every argument type (the integer and DECIMAL rules below are
            # those of abs and the roundings, which keep the argument's value domain)
            return Typed(cls(this=ty.coerce(r, DOUBLE, node)), DOUBLE)
        if isinstance(node, exp.Abs) and r.type.kind == "int":
            lo, hi = ty._range(r)
            top = max(abs(lo), abs(hi))
            wide = ty._holding(0, top)
            if wide is not None:
                return Typed(_numeric_tag(exp.Abs(this=ty.coerce(r, wide, node)), wide), wide,
                             bounds=(0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), top))
            if r.type.name == "HUGEINT":  # abs fails only on the least HUGEINT: NULL
                return Typed(_numeric_tag(exp.Abs(this=_not_least(r.expr, r.type)), r.type), r.type)
            return Typed(r.expr, r.type)  # unsigned
        if r.type.kind == "int" and isinstance(node, (exp.Floor, exp.Ceil)) and digits is None:
            # DuckDB's floor / ceil of an integer are DOUBLE (CAST(floor(i) AS VARCHAR) is '1.0'): the same here
            return Typed(cls(this=ty.coerce(r, DOUBLE, node)), DOUBLE)
        if r.type.kind == "int" and not isinstance(node, exp.Abs):
            # trunc of an integer, and round to digits >= 0, are the integer itself (as in DuckDB); round to
            # digits < 0 is computed in a type holding every result (|round(x, -k)| <= |x| + 10^k), else in DOUBLE
            if digits is None or digits >= 0:
                return Typed(ty.coerce(r, r.type, node) if r.literal else r.expr, r.type)
            lo, hi = ty._range(r)
            wide = ty._holding(min(lo, -hi) - 10 ** (-digits), max(hi, -lo) + 10 ** (-digits))
            rt = wide if wide is not None else DOUBLE
            return Typed(cls(this=ty.coerce(r, rt, node), decimals=exp.Literal.number(digits)), rt)
        if r.type.kind == "decimal":
            # DuckDB rounds DECIMAL(p,s) into DECIMAL(p, s'), s' = min(s, max(digits, 0)); a value
            # that gains an integer digit (99.9 -> 100) overflows only when s' = s = 0 and
            # digits < 0 (round(DECIMAL(p,0), -k)): then computed in DECIMAL(p+1,0), or DOUBLE at p = 38
            src: SqlType = r.type
            if digits is not None and digits < 0 and r.type.scale == 0:
                src = (SqlType("decimal", f"DECIMAL({r.type.precision + 1},0)", r.type.precision + 1, 0)
                       if r.type.precision < 38 else DOUBLE)
            s_out = r.type.scale if digits is None and isinstance(node, exp.Abs) else min(r.type.scale, max(digits or 0, 0))
            rt = DOUBLE if src.kind == "float" else (
                src if isinstance(node, exp.Abs) else SqlType("decimal", f"DECIMAL({src.precision},{s_out})", src.precision, s_out))
            if isinstance(node, exp.Ceil) and src.kind == "decimal" and src.scale > 0:
                rt = SqlType("decimal", f"DECIMAL({src.precision},0)", src.precision, 0)
            args: dict[str, Any] = {"this": ty.coerce(r, src, node)}
            if digits is not None:
                args["decimals"] = exp.Literal.number(digits)
            out = cls(**args)
            return Typed(_numeric_tag(out, src) if isinstance(node, (exp.Abs, exp.Floor, exp.Ceil)) and digits is None
                         else out, rt)
        rt, _ = result(r.type)
        args = {"this": ty.coerce(r, DOUBLE, node) if rt.kind == "float" and r.type.kind != "float" else
                (r.expr if not r.literal else ty.coerce(r, r.type, node))}
        if digits is not None:
            args["decimals"] = exp.Literal.number(digits)
        return Typed(cls(**args), rt)

    return h


def _abs(t: SqlType) -> tuple[SqlType, bool]:
    return t, False


def _round_like(t: SqlType) -> tuple[SqlType, bool]:
    return t, False


def _plain(node: exp.Expression) -> bool:
    """Both operands of ``node`` are column references or literals (in parentheses or not)."""
    return all(isinstance(o.unnest(), (exp.Column, exp.Literal)) for o in (node.this, node.expression))


def _nonzero(e: exp.Expression, t: SqlType) -> exp.Expression:
    """``NULLIF(e, 0)``: a divisor that is never zero (x // 0 and x % 0 are NULL)."""
    return exp.Nullif(this=e, expression=typed_literal(0, t))


#: a DOUBLE or FLOAT ``a % b`` is computed where |a| < |b| x 2^53 (the quotient a whole number a DOUBLE counts
#: exactly): DuckDB's remainder (C's fmod) loops over the exponents' difference, about 3 ns a bit, so one person's
#: a = 1e308 over their own b near 1e-300 cost 6 us a remainder against 30 ns for ordinary values (up to 2 100 bits;
#: 2^53: at most about 0.15 us)
FLOAT_REMAINDER_SPAN = 2.0**53


def _float_remainder(a: exp.Expression, b: exp.Expression) -> exp.Expression:
    """``a % b`` of DOUBLE (or FLOAT) operands, NULL where |a| >= |b| x FLOAT_REMAINDER_SPAN (finite a, b nonzero):
    ``CASE WHEN NOT (abs(a) >= abs(b) * 2^53) OR abs(a) > <greatest DOUBLE> OR b = 0 THEN a % b END``. A NaN operand,
    an infinite a and a zero b keep DuckDB's NaN, an infinite b its a (each a loop of no length)."""
    far = exp.GTE(this=exp.Abs(this=a.copy()),
                  expression=exp.Mul(this=exp.Abs(this=b.copy()), expression=typed_literal(FLOAT_REMAINDER_SPAN, DOUBLE)))
    infinite = exp.GT(this=exp.Abs(this=a.copy()), expression=typed_literal(1.7976931348623157e308, DOUBLE))
    zero = exp.EQ(this=b.copy(), expression=typed_literal(0.0, DOUBLE))
    cond = exp.Or(this=exp.Or(this=exp.Not(this=exp.paren(far)), expression=infinite), expression=zero)
    return exp.Case(ifs=[exp.If(this=cond, true=exp.Mod(this=a, expression=b))])


#: 2^127 - 1, and 2^127 as 10^19 x _U127_HIGH + _U127_LOW (``uhugeint_text``)
_U127_MASK = 2**127 - 1
_U127_HIGH, _U127_LOW = divmod(2**127, 10**19)


def uhugeint_text(u: exp.Expression) -> exp.Expression:
    """The text of a UHUGEINT ``u`` (as ``CAST(u AS VARCHAR)``, NULL for NULL), without DuckDB's own conversion, which
    divides by 10 in a loop over the value's bits digit after digit: 0.7 us for a small value, 24 us near 2^100 and 44
    us near 2^128, so one person's rows under a few conversions each told whether their values were large. Below 2^127
    the value is converted as a HUGEINT (at most about 0.4 us); from 2^127 on, v = u - 2^127 (its low 127 bits, which
    no conversion fails on) is split by 10^19 in HUGEINT and 2^127 added digit group by digit group (at most about
    1.5 us; DuckDB only: no other engine has the type)."""
    i128 = exp.DataType.build("INT128", dialect="duckdb")
    u128 = exp.DataType.build("UINT128", dialect="duckdb")

    def big(v: int) -> exp.Expression:
        return exp.Cast(this=exp.Literal.number(v), to=i128.copy())

    low = exp.TryCast(this=exp.BitwiseAnd(this=exp.paren(u.copy()), expression=exp.Cast(this=exp.Literal.number(_U127_MASK), to=u128.copy())),
                      to=i128.copy())
    q = exp.paren(exp.IntDiv(this=low.copy(), expression=big(10**19)))
    r = exp.paren(exp.Sub(this=low.copy(), expression=exp.Mul(this=q.copy(), expression=big(10**19))))
    carry = exp.GTE(this=r.copy(), expression=big(10**19 - _U127_LOW))

    def text(e: exp.Expression) -> exp.Expression:
        out = exp.TryCast(this=e, to=exp.DataType.build("VARCHAR"))
        out.meta[_SHORT_TEXT] = True  # at most 40 characters (``_chars``)
        return out

    def joined(high: exp.Expression, rest: exp.Expression) -> exp.Expression:
        padded = exp.Anonymous(this="LPAD", expressions=[text(rest), exp.Literal.number(19), exp.Literal.string("0")])
        padded.meta[_SHORT_TEXT] = True
        return exp.DPipe(this=text(high), expression=padded, safe=True)

    above = exp.Case(ifs=[exp.If(this=carry, true=joined(exp.Add(this=q.copy(), expression=big(_U127_HIGH + 1)),
                                                         exp.Sub(this=r.copy(), expression=big(10**19 - _U127_LOW))))],
                     default=joined(exp.Add(this=q.copy(), expression=big(_U127_HIGH)), exp.Add(this=r.copy(), expression=big(_U127_LOW))))
    below = exp.LTE(this=u.copy(), expression=exp.Cast(this=exp.Literal.number(_U127_MASK), to=u128.copy()))
    return exp.Case(ifs=[exp.If(this=below, true=text(low))], default=above)


def _not_least(e: exp.Expression, t: SqlType) -> exp.Expression:
    """``NULLIF(e, least value of t)``: the one value whose negation overflows is NULL."""
    return exp.Nullif(this=e, expression=typed_literal(_INT_RANGES[t.name][0], t))


def _to_double(t: SqlType) -> tuple[SqlType, bool]:
    return DOUBLE, False


def _sign(ty: Typer, node: exp.Expression) -> Typed:
    r = ty._numeric(node.this, node)
    return Typed(exp.Sign(this=r.expr), SqlType("int", "TINYINT"))


def _log10(ty: Typer, node: exp.Expression) -> Typed:
    base = node.this
    arg = node.expression
    if arg is None:
        raise ty.refuse(node, "log() takes log10(x) or ln(x) here")
    if not (isinstance(base, exp.Literal) and str(base.this) == "10"):
        raise ty.refuse(node, "only log10(x) and ln(x) are on the allow-list")
    r = ty._numeric(arg, node)
    return Typed(exp.Log(this=exp.Literal.number(10), expression=ty.coerce(r, DOUBLE, node)), DOUBLE)


def _isnan(ty: Typer, node: exp.Expression) -> Typed:
    r = ty._numeric(node.this, node)
    return Typed(type(node)(this=ty.coerce(r, DOUBLE, node)), BOOLEAN)


def _text1(result: SqlType) -> Callable[[Typer, exp.Expression], Typed]:
    def h(ty: Typer, node: exp.Expression) -> Typed:
        extra = [k for k, v in node.args.items() if v is not None and k not in ("this", "position")]
        if extra:
            raise ty.refuse(node, f"{ty._fname(node)}() takes one text argument here")
        new = node.copy()
        new.set("this", ty.cap(ty.t(node.this), node))
        return Typed(new, result)

    return h


def _left_right(ty: Typer, node: exp.Expression) -> Typed:
    s = ty.cap(ty.t(node.this), node)
    n = ty.t(node.expression)
    if n.type.kind != "int":
        raise ty.refuse(node, f"{ty._fname(node)}() takes (text, integer)")
    cls = type(node)
    if cls is exp.Left and n.literal and 1 <= int(n.value) <= STRING_CAP and not isinstance(s, exp.Literal):
        # LEFT(x, n) of a literal n within the cap reads only n characters (MAX_STRING_WORK counts it so)
        return Typed(exp.Left(this=s.this, expression=exp.Literal.number(int(n.value))), VARCHAR)
    # the count clamped to +-(2^31 - 1): DuckDB fails on a count beyond its substring range
    count = exp.Least(
        this=exp.Greatest(this=ty.coerce(n, BIGINT, node), expressions=[exp.Literal.number(-(2**31 - 1))]),
        expressions=[exp.Literal.number(2**31 - 1)],
    )
    return Typed(cls(this=s, expression=count), VARCHAR)


def _substring(ty: Typer, node: exp.Expression) -> Typed:
    s = ty.cap(ty.t(node.this), node)
    start = ty.int_literal(node.args["start"], "the start of substring()", STRING_CAP) if node.args.get("start") else 1
    args: dict[str, Any] = {"this": s, "start": exp.Literal.number(start) if start >= 0 else exp.Neg(this=exp.Literal.number(-start))}
    if node.args.get("length") is not None:
        ln = ty.int_literal(node.args["length"], "the length of substring()", STRING_CAP)
        args["length"] = exp.Literal.number(ln) if ln >= 0 else exp.Neg(this=exp.Literal.number(-ln))
    return Typed(exp.Substring(**args), VARCHAR)


def _text2(result: SqlType) -> Callable[[Typer, exp.Expression], Typed]:
    """starts_with / ends_with: one comparison at one position (as =), both texts capped."""
    def h(ty: Typer, node: exp.Expression) -> Typed:
        extra = [k for k, v in node.args.items() if v is not None and k not in ("this", "expression")]
        if extra or node.args.get("expression") is None:
            raise ty.refuse(node, f"{ty._fname(node)}() takes two text arguments here")
        new = node.copy()
        new.set("this", _binary(ty.cap(ty.t(node.this), node)))  # DuckDB matches under the collation
        new.set("expression", _other_binary(ty.cap(ty.t(node.expression), node), VARCHAR))
        return Typed(new, result)

    return h


def _search(result: SqlType, name: str) -> Callable[[Typer, exp.Expression], Typed]:
    """``contains(s, 'needle')`` / ``strpos(s, 'needle')`` (instr, position, locate): a literal needle of at
    most MAX_LIKE_PATTERN characters (``Typer.needle``); the text searched is capped."""
    def h(ty: Typer, node: exp.Expression) -> Typed:
        other_key = "substr" if isinstance(node, exp.StrPosition) else "expression"
        extra = [k for k, v in node.args.items() if v is not None and k not in ("this", other_key)]
        if extra or node.args.get(other_key) is None:
            raise ty.refuse(node, f"{name}() takes two text arguments here")
        new = node.copy()
        new.set("this", _binary(ty.cap(ty.t(node.this), node)))  # DuckDB matches under the collation
        text = ty.needle(node.args[other_key], node, name, "the text searched for", f"{name}(note, 'abc')")
        new.set(other_key, exp.Literal.string(text))
        return Typed(new, result)

    return h


def _anon_text2(name: str) -> Callable[[Typer, exp.Expression], Typed]:
    def h(ty: Typer, node: exp.Expression) -> Typed:
        args = list(node.expressions)
        if len(args) != 2:
            raise ty.refuse(node, f"{name}() takes two text arguments")
        capped = [ty.cap(ty.t(a), node) for a in args]
        return Typed(exp.Anonymous(this=name.upper(), expressions=[_binary(capped[0]), _other_binary(capped[1], VARCHAR)]), BOOLEAN)

    return h


def _concat(ty: Typer, node: exp.Expression) -> Typed:
    args = list(node.expressions)
    if not args:
        raise ty.refuse(node, "concat() needs arguments")
    return Typed(exp.Concat(expressions=[ty.cap(ty.t(a), node) for a in args], safe=True, coalesce=True), VARCHAR)


def _replace(ty: Typer, node: exp.Expression) -> Typed:
    """``replace(s, 'from', 'to')`` with literal ``from`` and ``to``. The input is capped (STRING_CAP characters);
    when ``to`` is longer than ``from`` the result is cut to STRING_CAP characters as well, so a replacement cannot
    grow a value (or a key built from it) beyond what a string function may return. An empty ``from`` changes
    nothing (DuckDB's and Spark's meaning)."""
    if node.args.get("replacement") is None:
        raise ty.refuse(node, "replace() takes (text, 'from', 'to')")
    src = ty.cap(ty.t(node.this), node)
    frm = ty.needle(node.expression, node, "replace", "the text to replace", "replace(note, 'abc', 'x')")
    to = ty.text_literal(node.args["replacement"], "the replacement in replace()")
    if len(to) > MAX_PATTERN:
        raise ty.refuse(node, f"the replacement in replace() may have at most {MAX_PATTERN} characters")
    if not frm:
        return Typed(src, VARCHAR)
    out: exp.Expression = exp.Replace(this=_binary(src), expression=exp.Literal.string(frm),
                                      replacement=exp.Literal.string(to))
    if len(to) > len(frm):
        out = exp.Left(this=out, expression=exp.Literal.number(STRING_CAP))
    return Typed(out, VARCHAR)


def _split_part(ty: Typer, node: exp.Expression) -> Typed:
    """``split_part(s, 'sep', n)``: a non-empty literal separator and a literal part number n != 0 within
    +-STRING_CAP (negative: counted from the end; beyond the parts: ''). An empty separator and part 0 mean
    different things on DuckDB and Spark (Spark fails on part 0), so they are refused."""
    extra = [k for k, v in node.args.items() if v is not None and k not in ("this", "delimiter", "part_index")]
    if extra or node.args.get("delimiter") is None or node.args.get("part_index") is None:
        raise ty.refuse(node, "split_part() takes (text, 'separator', part number)")
    src = ty.cap(ty.t(node.this), node)
    sep = ty.needle(node.args["delimiter"], node, "split_part", "the separator", "split_part(note, ',', 2)")
    if not sep:
        raise ty.refuse(node, f"the separator of split_part() must have 1 to {MAX_LIKE_PATTERN} characters")
    n = ty.int_literal(node.args["part_index"], "the part number of split_part()", STRING_CAP)
    if n == 0:
        raise ty.refuse(node, "split_part() counts parts from 1 (or from -1 at the end): part 0 is none")
    idx = exp.Literal.number(n) if n > 0 else exp.Neg(this=exp.Literal.number(-n))
    return Typed(exp.SplitPart(this=_binary(src), delimiter=exp.Literal.string(sep), part_index=idx), VARCHAR)


def _concat_ws(ty: Typer, node: exp.Expression) -> Typed:
    """``concat_ws('sep', a, b, ...)``: a literal separator, text arguments (capped); NULL arguments are skipped."""
    args = list(node.expressions)
    if len(args) < 2:
        raise ty.refuse(node, "concat_ws() takes ('separator', text, ...)")
    sep = ty.text_literal(args[0], "the separator of concat_ws()")
    if len(sep) > MAX_PATTERN:
        raise ty.refuse(node, f"the separator of concat_ws() may have at most {MAX_PATTERN} characters")
    # a NULL argument is skipped, as concat_ws skips it
    typed = [r for r in (ty.t(a) for a in args[1:]) if r.type.kind != "null"]
    if not typed:
        return Typed(exp.Literal.string(""), STRLIT, True, "")
    parts = [ty.cap(r, node) for r in typed]
    # (safe, coalesce: DuckDB's own CONCAT_WS, which skips NULL arguments, as sqlglot renders it then)
    return Typed(exp.ConcatWs(expressions=[exp.Literal.string(sep), *parts], safe=True, coalesce=True), VARCHAR)


_DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
                "November", "December")


def _day_month_name(ty: Typer, node: exp.Expression) -> Typed:
    """``dayname(d)`` / ``monthname(d)``: DuckDB's English names, rendered as a CASE over ``date_part('dow' |
    'month', d)`` (the same name DuckDB's own function gives for every DATE and TIMESTAMP, NULL for +-infinity),
    so every engine that computes the date part computes the name."""
    if any(v is not None for k, v in node.args.items() if k != "this"):
        raise ty.refuse(node, f"{ty._fname(node)}() takes one DATE or TIMESTAMP")
    arg, kind = _temporal_arg(ty, node, node.this)
    day = isinstance(node, exp.Dayname)
    part = _tag(exp.Anonymous(this="date_part", expressions=[exp.Literal.string("dow" if day else "month"), arg]), kind)
    names = _DAY_NAMES if day else _MONTH_NAMES
    first = 0 if day else 1
    ifs = [exp.If(this=exp.Literal.number(i + first), true=exp.Literal.string(n)) for i, n in enumerate(names)]
    return Typed(exp.Case(this=part, ifs=ifs), VARCHAR)


def _make_date(ty: Typer, node: exp.Expression) -> Typed:
    """``make_date(y, m, d)`` of integers: NULL unless (y, m, d) is a date of years 1..9999 (DuckDB raises on an
    invalid date; every engine holds these years). Literal arguments are folded here; otherwise the call runs
    only under ``CASE WHEN <a valid date> THEN make_date(...) END``."""
    keys = ("year", "month", "day")
    if any(node.args.get(k) is None for k in keys) or any(v is not None for k, v in node.args.items() if k not in keys):
        raise ty.refuse(node, "make_date() takes (year, month, day) as integers")
    parts = [ty.t(node.args[k]) for k in keys]
    for p_ in parts:
        if p_.type.kind not in ("int", "null"):
            raise ty.refuse(node, f"make_date() takes integers, got {p_.type if p_.type.kind != 'strlit' else 'a string'}"
                                  "; write CAST(x AS INTEGER) (a value that does not convert is then NULL)")
    if any(p_.type.kind == "null" for p_ in parts):
        return Typed(_cast(exp.Null(), DATE, try_=False), DATE)
    if all(p_.literal for p_ in parts):
        try:
            v = dt.date(*(int(p_.value) for p_ in parts))
        except (ValueError, OverflowError):
            return Typed(_cast(exp.Null(), DATE, try_=False), DATE)
        return Typed(typed_literal(v, DATE), DATE, True, v)
    y, m, d = (ty.coerce(p_, BIGINT, node) for p_ in parts)

    def num(v: int) -> exp.Expression:
        return exp.Literal.number(v)

    def divides(k: int) -> exp.Expression:
        return exp.EQ(this=exp.Mod(this=y.copy(), expression=num(k)), expression=num(0))

    not_century = exp.NEQ(this=exp.Mod(this=y.copy(), expression=num(100)), expression=num(0))
    leap = exp.Or(this=exp.Paren(this=exp.And(this=divides(4), expression=not_century)), expression=divides(400))
    last = exp.Case(ifs=[
        exp.If(this=exp.EQ(this=m.copy(), expression=num(2)), true=exp.Case(ifs=[exp.If(this=leap, true=num(29))], default=num(28))),
        exp.If(this=exp.In(this=m.copy(), expressions=[num(4), num(6), num(9), num(11)]), true=num(30)),
    ], default=num(31))
    valid = exp.and_(exp.Between(this=y.copy(), low=num(1), high=num(9999)),
                     exp.Between(this=m.copy(), low=num(1), high=num(12)),
                     exp.Between(this=d.copy(), low=num(1), high=last), copy=False)
    return Typed(exp.Case(ifs=[exp.If(this=valid, true=exp.DateFromParts(year=y, month=m, day=d))]), DATE)


def _pow(ty: Typer, node: exp.Expression) -> Typed:
    """``power(x, y)`` (``pow``, ``**``, ``^``) in DOUBLE: an overflow is inf, an undefined power NaN (never an
    error, as for the other DOUBLE operators)."""
    a, b = ty._numeric(node.this, node), ty._numeric(node.expression, node)
    return Typed(exp.Pow(this=ty.coerce(a, DOUBLE, node), expression=ty.coerce(b, DOUBLE, node)), DOUBLE)


def _temporal(ty: Typer, node: exp.Expression, arg: exp.Expression, *, trunc: bool = False) -> exp.Expression:
    """The argument of a date function, read so that the function cannot fail on any value."""
    return _temporal_arg(ty, node, arg, trunc=trunc)[0]


def _temporal_arg(ty: Typer, node: exp.Expression, arg: exp.Expression, *, trunc: bool = False) -> tuple[exp.Expression, str]:
    """The argument of a date function, read so that the function cannot fail on any value, and
    its kind: ``date`` if it reads as a DATE, else ``timestamp`` (text literals and
    TIMESTAMP_S/_MS become TIMESTAMP), for backends that spell date functions by argument type.

    * TIMESTAMP_S / TIMESTAMP_MS hold instants beyond TIMESTAMP's range, and DuckDB's date
      functions cast them to TIMESTAMP implicitly (and fail): they are read as
      ``TRY_CAST(x AS TIMESTAMP)`` (such an instant is NULL). TIMESTAMP_NS always fits.
    * ``trunc``: date_trunc() of an instant before ``TRUNC_LEAST`` leaves the TIMESTAMP range
      (the least TIMESTAMP truncated to its year; Arrow/Parquet timestamps below the least
      TIMESTAMP even for 'day'), so such an instant is NULL (-infinity is kept); a DATE is read
      as ``TRY_CAST(d AS TIMESTAMP)`` first (a DATE beyond the TIMESTAMP range is NULL).
    Every other date function is total on every DATE, TIMESTAMP and TIMESTAMP_NS value,
    infinities included (checked by tests/test_typer_extremes.py).
    """
    r = ty.t(arg)
    if r.type.kind == "strlit":
        v = ty._literal_as(r, TIMESTAMP, node)
        return typed_literal(v, TIMESTAMP), "timestamp"  # years 1..9999: every date function is total on it
    if r.type.kind not in ("date", "timestamp"):
        raise ty.refuse(node, f"{ty._fname(node)}() takes a DATE or TIMESTAMP, got {r.type}")
    kind = "date" if r.type.kind == "date" else "timestamp"
    if r.literal:
        return ty.coerce(r, TIMESTAMP if trunc else r.type, node), kind  # Python dates: years 1..9999
    e = r.expr
    if r.type.name in ("TIMESTAMP_S", "TIMESTAMP_MS") or (trunc and r.type.name in ("DATE", "TIMESTAMP_NS")):
        e = _cast(e, TIMESTAMP)  # TIMESTAMP_NS -> TIMESTAMP always converts
    if trunc and r.type.name != "TIMESTAMP_NS":
        least = _cast(exp.Literal.string(TRUNC_LEAST), TIMESTAMP, try_=False)
        minus_inf = _cast(exp.Literal.string("-infinity"), TIMESTAMP, try_=False)
        ok = exp.Or(this=exp.GTE(this=e.copy(), expression=least), expression=exp.EQ(this=e.copy(), expression=minus_inf))
        e = exp.Case(ifs=[exp.If(this=ok, true=e.copy())])
    return e, kind


E = TypeVar("E", bound=exp.Expression)

#: meta key on a typed negation or abs() of an integer or DECIMAL, and floor/ceil of a DECIMAL: its operand's type
#: name (DuckDB's), for backends whose negation of a wide DECIMAL is not exact or whose floor/ceil gives another
#: type (``dpsql.engine.spark_ops``)
NUMERIC_ARG = "dpsql_numeric_arg"


def _numeric_tag(e: E, t: SqlType) -> E:
    e.meta[NUMERIC_ARG] = t.name
    return e


#: meta key on the typer's conversion of a value: the type name (DuckDB's) it converts from, for
#: backends whose conversions round differently (``dpsql.engine.spark_ops``: DuckDB rounds a DOUBLE
#: to the nearest integer, ties to even, and a DECIMAL to the nearest, ties away from zero)
CAST_FROM = "dpsql_cast_from"

#: the type a join plan gives a text or BLOB key column that it carries as the salted digest of its text
#: (``dpsql.rewrite.joins.key_digests``): a ``CAST_FROM`` of this type converts a digest (DuckDB's 128-bit
#: integer, or the 32-character hex text), never a DATE or TIMESTAMP
DIGEST_TYPE = "DIGEST"

#: meta key on a typed date function: the kind of its argument ("date" or "timestamp"), for
#: backends that spell date functions differently by argument type (``dpsql.engine.spark_ops``)
TEMPORAL_ARG = "dpsql_temporal_arg"


def _tag(e: exp.Expression, kind: str) -> exp.Expression:
    e.meta[TEMPORAL_ARG] = kind
    return e


def _part_unit(ty: Typer, node: exp.Expression, unit: exp.Expression | None, allowed: set[str]) -> str:
    if isinstance(unit, (exp.Var, exp.Identifier)):
        text = unit.name
    elif isinstance(unit, exp.Literal) and unit.is_string:
        text = str(unit.this)
    else:
        raise ty.refuse(node, f"the part of {ty._fname(node)}() must be a literal such as 'month'")
    if text.lower() not in allowed:
        raise ty.refuse(node, f"'{text}' is not a supported date part for {ty._fname(node)}()")
    return text.lower()


def _date_trunc(ty: Typer, node: exp.Expression) -> Typed:
    unit = _part_unit(ty, node, node.args.get("unit"), _TRUNC_PARTS)
    arg = _temporal(ty, node, node.this, trunc=True)
    # DuckDB's result is a TIMESTAMP for every argument type (TIMESTAMP_NS too)
    return Typed(_tag(exp.Anonymous(this="date_trunc", expressions=[exp.Literal.string(unit), arg]), "timestamp"),
                 TIMESTAMP)


#: the values each date part (a BIGINT) can take over every DATE and TIMESTAMP DuckDB holds (its least and greatest
#: DATE are in years -5877641 and 5881580): an integer expression of a part (``year(d) - 1990``, ``month(d) + 1``) is
#: then computed in BIGINT, as DuckDB types it, not widened to HUGEINT for a BIGINT of any value
_YEARS = (-5_877_642, 5_881_581)
_PART_BOUNDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("year", "years", "isoyear"), _YEARS),
    "decade": (_YEARS[0] // 10, _YEARS[1] // 10 + 1), "century": (_YEARS[0] // 100, _YEARS[1] // 100 + 1),
    "millennium": (_YEARS[0] // 1000, _YEARS[1] // 1000 + 1),
    "yearweek": (_YEARS[0] * 100 - 53, _YEARS[1] * 100 + 53),
    **dict.fromkeys(("month", "months"), (1, 12)), **dict.fromkeys(("day", "days"), (1, 31)),
    **dict.fromkeys(("hour", "hours"), (0, 23)), **dict.fromkeys(("minute", "minutes"), (0, 59)),
    **dict.fromkeys(("second", "seconds"), (0, 59)), "quarter": (1, 4), **dict.fromkeys(("week", "weekofyear"), (1, 53)),
    **dict.fromkeys(("dayofweek", "dow", "weekday"), (0, 6)), "isodow": (1, 7),
    **dict.fromkeys(("dayofyear", "doy"), (1, 366)), **dict.fromkeys(("millisecond", "milliseconds"), (0, 59_999)),
    **dict.fromkeys(("microsecond", "microseconds"), (0, 59_999_999)),
}
#: sqlglot's nodes of one date part
_NODE_PARTS = {"Year": "year", "Month": "month", "Day": "day", "Quarter": "quarter", "DayOfWeek": "dayofweek",
               "DayOfYear": "dayofyear", "Week": "week", "Hour": "hour", "Minute": "minute", "Second": "second"}


def _part_value(expr: exp.Expression, unit: str) -> Typed:
    """A date part's value: DOUBLE for 'epoch', else a BIGINT with the part's bounds."""
    if unit == "epoch":
        return Typed(expr, DOUBLE)
    return Typed(expr, BIGINT, bounds=_PART_BOUNDS.get(unit))


def _extract(ty: Typer, node: exp.Expression) -> Typed:
    unit = _part_unit(ty, node, node.this, _DATE_PARTS)
    arg, kind = _temporal_arg(ty, node, node.expression)
    return _part_value(_tag(exp.Anonymous(this="date_part", expressions=[exp.Literal.string(unit), arg]), kind), unit)


def _date_part(ty: Typer, node: exp.Expression) -> Typed:
    args = list(node.expressions)
    if len(args) != 2:
        raise ty.refuse(node, "date_part() takes ('part', date)")
    unit = _part_unit(ty, node, args[0], _DATE_PARTS)
    arg, kind = _temporal_arg(ty, node, args[1])
    return _part_value(_tag(exp.Anonymous(this="date_part", expressions=[exp.Literal.string(unit), arg]), kind), unit)


def _epoch(ty: Typer, node: exp.Expression) -> Typed:
    """DuckDB's ``epoch(x)`` (sqlglot's TimeToUnix): ``date_part('epoch', x)``, the DOUBLE of seconds since 1970."""
    if any(v is not None for k, v in node.args.items() if k != "this"):
        raise ty.refuse(node, "epoch() takes one DATE or TIMESTAMP")
    arg, kind = _temporal_arg(ty, node, node.this)
    return Typed(_tag(exp.Anonymous(this="date_part", expressions=[exp.Literal.string("epoch"), arg]), kind), DOUBLE)


def _date_fn(ty: Typer, node: exp.Expression) -> Typed:
    extra = [k for k, v in node.args.items() if v is not None and k != "this"]
    if extra:
        raise ty.refuse(node, f"{ty._fname(node)}() takes one DATE or TIMESTAMP")
    new = node.copy()
    arg, kind = _temporal_arg(ty, node, node.this)
    new.set("this", arg)
    return Typed(_tag(new, kind), BIGINT, bounds=_PART_BOUNDS.get(_NODE_PARTS.get(type(node).__name__, "")))


def _part_fn(part: str) -> Callable[[Typer, exp.Expression], Typed]:
    """DuckDB's function for one date part (``dayofmonth(d)``, ``weekday(d)``, ``isodow(d)``, ...): typed as
    ``date_part('part', d)``, whose rendering every engine has."""
    def typed(ty: Typer, node: exp.Expression) -> Typed:
        args = list(node.expressions) if isinstance(node, exp.Anonymous) else [node.this]
        if len(args) != 1 or any(v is not None for k, v in node.args.items() if k not in ("this", "expressions")):
            raise ty.refuse(node, f"{ty._fname(node)}() takes one DATE or TIMESTAMP")
        arg, kind = _temporal_arg(ty, node, args[0])
        return _part_value(_tag(exp.Anonymous(this="date_part", expressions=[exp.Literal.string(part), arg]), kind),
                           part)
    return typed


#: the conversions DuckDB's strftime and strptime know (``%-d``: without padding, for the letters of FORMAT_UNPADDED);
#: any other makes DuckDB's binder refuse the query, which said only that it did not type-check
FORMAT_LETTERS = frozenset("aAbBcdfgGhHIjmMnpSTuUVwWxXyYzZ%")
FORMAT_UNPADDED = frozenset("djmyHIMS")


def format_problem(f: str, fname: str) -> str | None:
    """Why the format ``f`` of ``fname`` (strftime, strptime) is refused: a format specifier DuckDB does not know
    (``%Q``, ``%-a``, a trailing ``%``); None if it has none."""
    i = 0
    while i < len(f):
        if f[i] != "%":
            i += 1
            continue
        j = i + 2 if f[i + 1:i + 2] == "-" else i + 1
        c = f[j:j + 1]
        if not c or c not in (FORMAT_UNPADDED if j == i + 2 else FORMAT_LETTERS):
            return (f"the format of {fname}() has the format specifier {f[i:j + 1]!r}, which DuckDB does not know; "
                    "use %Y, %m, %d, %H, %M, %S, %f, %j, %a, %b, ... ('%%' for a percent sign; '%-d' and the like "
                    "without padding, for d, j, m, y, H, I, M and S)")
        i = j + 1
    return None


def _check_format(ty: Typer, node: exp.Expression, f: str, fname: str) -> None:
    msg = format_problem(f, fname)
    if msg is not None:
        raise ty.refuse(node, msg)


def _strftime(ty: Typer, node: exp.Expression) -> Typed:
    fmt = node.args.get("format")
    if fmt is None:
        raise ty.refuse(node, "strftime() takes (date, 'format')")
    f = ty.text_literal(fmt, "the format of strftime()")
    if len(f) > MAX_PATTERN:
        raise ty.refuse(node, f"the format of strftime() may have at most {MAX_PATTERN} characters")
    _check_format(ty, node, f, "strftime")
    arg = _temporal(ty, node, node.this)
    return Typed(exp.Anonymous(this="strftime", expressions=[arg, exp.Literal.string(f)]), VARCHAR)


def _strptime(ty: Typer, node: exp.Expression) -> Typed:
    fmt = node.args.get("format")
    if fmt is None or any(v is not None for k, v in node.args.items() if k not in ("this", "format")):
        raise ty.refuse(node, "strptime() takes (text, 'format')")
    f = ty.text_literal(fmt, "the format of strptime()")
    if len(f) > MAX_PATTERN:
        raise ty.refuse(node, f"the format of strptime() may have at most {MAX_PATTERN} characters")
    _check_format(ty, node, f, "strptime")
    specs = _format_specifiers(f)
    if specs & {"z", "Z"}:
        # DuckDB's result is then a TIMESTAMP WITH TIME ZONE, whose comparisons, date parts and
        # truncations go through the connection's time zone (and the typer's TIMESTAMP literals
        # would be converted to it at run time)
        raise ty.refuse(node, "strptime() with a time-zone specifier (%z, %Z) gives a TIMESTAMP WITH TIME ZONE, which "
                              "is not supported here; parse the local date and time without the offset")
    s = ty.cap(ty.t(node.this), node)
    # try_strptime: text that does not parse is NULL
    out: exp.Expression = exp.Anonymous(this="try_strptime", expressions=[s, exp.Literal.string(f)])
    if "n" in specs:
        # %n (nanoseconds) makes DuckDB's result a TIMESTAMP_NS: a TIMESTAMP literal compared with
        # it (or date_trunc's range guard) would be cast to TIMESTAMP_NS at run time, and fail
        # only when a row reaches it (a TIMESTAMP_NS holds 1677..2262 only); read as TIMESTAMP
        # (every TIMESTAMP_NS converts; the nanoseconds are truncated to microseconds)
        out = _cast(out, TIMESTAMP)
    return Typed(out, TIMESTAMP)


def _format_specifiers(f: str) -> set[str]:
    """The conversion letters of a strftime/strptime format (``%-d`` is ``d``; ``%%`` is none)."""
    out: set[str] = set()
    i = 0
    while i < len(f):
        if f[i] == "%" and i + 1 < len(f):
            j = i + 1
            if f[j] == "-" and j + 1 < len(f):
                j += 1
            if f[j] != "%":
                out.add(f[j])
            i = j + 1
        else:
            i += 1
    return out


_FUNCS: dict[type[exp.Expression], Callable[[Typer, exp.Expression], Typed]] = {
    exp.Abs: _unary_numeric(_abs, "abs"),
    exp.Round: _unary_numeric(_round_like, "round"),
    exp.Floor: _unary_numeric(_round_like, "floor"),
    exp.Ceil: _unary_numeric(_round_like, "ceil"),
    exp.Trunc: _unary_numeric(_round_like, "trunc"),
    exp.Sqrt: _unary_numeric(_to_double, "sqrt"),
    exp.Ln: _unary_numeric(_to_double, "ln"),
    exp.Log: _log10,
    exp.Sign: _sign,
    exp.IsNan: _isnan,
    exp.IsInf: _isnan,
    exp.Lower: _text1(VARCHAR),
    exp.Upper: _text1(VARCHAR),
    exp.Trim: _text1(VARCHAR),
    exp.Reverse: _text1(VARCHAR),
    exp.Length: _text1(BIGINT),
    exp.Left: _left_right,
    exp.Right: _left_right,
    exp.Substring: _substring,
    exp.StartsWith: _text2(BOOLEAN),
    exp.EndsWith: _text2(BOOLEAN),
    exp.Contains: _search(BOOLEAN, "contains"),
    exp.StrPosition: _search(BIGINT, "strpos"),
    exp.Concat: _concat,
    exp.ConcatWs: _concat_ws,
    exp.Replace: _replace,
    exp.SplitPart: _split_part,
    exp.Dayname: _day_month_name,
    exp.Monthname: _day_month_name,
    exp.DateFromParts: _make_date,
    exp.Pow: _pow,
    exp.TimestampTrunc: _date_trunc,
    exp.DateTrunc: _date_trunc,
    exp.Extract: _extract,
    exp.Year: _date_fn,
    exp.Month: _date_fn,
    exp.Day: _date_fn,
    exp.Quarter: _date_fn,
    exp.DayOfWeek: _date_fn,
    exp.DayOfYear: _date_fn,
    exp.Week: _date_fn,
    exp.DayOfMonth: _part_fn("day"),
    exp.WeekOfYear: _part_fn("week"),
    exp.DayOfWeekIso: _part_fn("isodow"),
    exp.TimeToUnix: _epoch,
    exp.TimeToStr: _strftime,
    exp.StrToTime: _strptime,
}
for _name in ("Hour", "Minute", "Second"):
    if hasattr(exp, _name):
        _FUNCS[getattr(exp, _name)] = _date_fn

_ANON: dict[str, Callable[[Typer, exp.Expression], Typed]] = {
    "date_part": _date_part,
    "datepart": _date_part,
    "weekday": _part_fn("dayofweek"),
    "yearweek": _part_fn("yearweek"),
    "prefix": _anon_text2("starts_with"),
    "suffix": _anon_text2("ends_with"),
    "try_strptime": lambda ty, node: _strptime(
        ty, exp.StrToTime(this=node.expressions[0], format=node.expressions[1]) if len(node.expressions) == 2 else node
    ),
}


# -- public entry points ---------------------------------------------------------------------------------

#: key types whose equality is their spelling (after the normalisation below)
KEY_KINDS = ("bool", "int", "decimal", "float", "varchar", "date", "timestamp")


#: key types whose released values would not keep their value: DuckDB exports UHUGEINT to
#: Arrow as decimal128(38, 0), so a value >= 2^127 wraps to a negative number (HUGEINT keeps
#: its raw 128-bit value and round-trips)
_UNEXPORTABLE_KEYS = ("UHUGEINT",)


def _unexportable(t: SqlType, fix: str) -> str:
    return (f"GROUP BY key of type {t} is not allowed: its values beyond 2^127 cannot be released as numbers "
            f"(they would wrap to negative numbers); group by {fix}, whose text is exact")


def _binary(e: exp.Expression) -> exp.Expression:
    """``e COLLATE "binary"`` (once)."""
    if isinstance(e, exp.Collate):
        return e
    inner = e if isinstance(e, exp.Column) else exp.Paren(this=e)
    return exp.Collate(this=inner, expression=exp.to_identifier("binary", quoted=True))


#: meta key of the literal that stands for a secret the engine draws afresh for each private read
#: (``dpsql.engine.base.with_read_salt``); explain and the bind check show and bind the literal itself
READ_SALT = "dpsql_read_salt"


def _digestible(t: SqlType) -> bool:
    """Whether ``x IN (...)`` of type ``t`` is compared by digest (:func:`_digest`): every type whose text is
    one spelling per value and whose cast to VARCHAR is total (not TIMESTAMP_S/_MS/_NS: DuckDB raises on
    some of their values)."""
    return t.kind in ("varchar", "strlit", "int", "decimal", "float", "date", "bool") or t.name == "TIMESTAMP"


def _digest(e: exp.Expression, t: SqlType) -> exp.Expression:
    """``MD5(salt || text of e)``, the salt a secret drawn for each private read (:data:`READ_SALT`).

    ``x IN (c1, ..., cn)`` with more than :data:`IN_LIST_SCANNED` elements is rendered ``MD5(salt || x) IN
    (MD5(salt || c1), ...)``. DuckDB answers a long IN list from a hash table of its elements, under its
    own hash, which has no secret: text whose hashes are equal in all 64 bits is easy to write, and integers
    whose hashes share a bucket and its salt bits are computed by inverting the hash. An analyst who listed
    up to MAX_IN_LIST constants sharing the hash of a guessed value made every row holding that value
    compare with all of them (``tests/test_adversary_in_list_collisions.py``). Under a secret salt no one
    can choose constants whose digests share a bucket. The text is the value's one spelling (a float's
    -0.0 and NaNs made canonical first, text compared byte for byte as the binary collation does), so the
    digests are equal exactly when the values are, up to an MD5 collision under a secret prefix."""
    if t.kind in ("varchar", "strlit"):
        text = e
    else:
        v = _canonical_key(Typed(e, t), e) if t.kind == "float" and not _plain_float(e) else e
        text = exp.Cast(this=v, to=exp.DataType(this=exp.DataType.Type.VARCHAR, nested=False))  # build() parses: 36 us a constant
    salt = exp.Literal.string(READ_SALT)
    salt.meta[READ_SALT] = True
    return exp.MD5(this=exp.DPipe(this=salt, expression=text))


def _text_binary(e: exp.Expression, t: SqlType) -> exp.Expression:
    """A text operand of a comparison (=, <, BETWEEN, IN, LIKE, NULLIF, GREATEST, ...) under the
    binary collation: DuckDB compares under the operand's collation, so a column declared
    ``COLLATE NOCASE`` or a connection's ``default_collation`` would make 'A' match 'a' (the
    answer would depend on the owner's connection rather than on the query, and disagree with the
    binary group keys). The collation of one operand decides the comparison."""
    return _binary(e) if t.kind in ("varchar", "strlit") else e


def _other_binary(e: exp.Expression, t: SqlType) -> exp.Expression:
    """Another text operand of a comparison, read from a row, under the binary collation too: DuckDB refuses to
    compare two operands of different explicit collations (``"note" COLLATE "binary" = "name"`` of a caller's
    ``name VARCHAR COLLATE NOCASE`` was a binder error: refused, while ``name = note`` was answered). A string
    literal has no collation of its own and stays as it is."""
    bare = e
    while isinstance(bare, exp.Paren):
        bare = bare.this
    return e if isinstance(bare, exp.Literal) else _text_binary(e, t)


def _plain_float(e: exp.Expression) -> bool:
    """Whether ``e`` is a float literal (``CAST('2.5' AS DOUBLE)``, :func:`typed_literal`) that is neither
    NaN nor zero in any float type: :func:`_canonical_key` would give ``e`` itself (its ELSE branch), so a
    long IN list of constants skips the CASE (a quarter of the nodes the analysis types, renders and the
    engine parses per element). Magnitudes from 1e-30 up stay nonzero as REAL (its least normal is 1.2e-38)."""
    if not isinstance(e, exp.Cast) or not isinstance(e.this, exp.Literal):
        return False
    try:
        f = float(e.this.this)
    except (TypeError, ValueError):
        return False
    return 1e-30 <= abs(f) < float("inf")


def _canonical_key(r: Typed, node: exp.Expression) -> exp.Expression:
    e = r.expr
    k = r.type.kind
    if k == "varchar" or k == "strlit":
        # binary collation: a column collation or default_collation cannot merge spellings
        return _binary(e)
    if k == "float":
        zero = typed_literal(0.0, r.type)
        nan = typed_literal(float("nan"), r.type)
        return exp.Case(
            ifs=[
                exp.If(this=exp.func("isnan", e.copy()), true=nan),
                exp.If(this=exp.EQ(this=e.copy(), expression=zero.copy()), true=zero),
            ],
            default=e.copy(),
        )
    return e


_STRUCTURAL: tuple[type[exp.Expression], ...] = (
    exp.Paren, exp.Column, exp.Literal, exp.Boolean, exp.Null, exp.Neg, exp.And, exp.Or, exp.Not, exp.Is,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Between, exp.In,
    exp.Case, exp.If, exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif, exp.Cast, exp.TryCast, exp.Add,
    exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.DPipe, exp.Like, exp.ILike, exp.Escape,
    # parts of the nodes above (names, types, date-part units)
    exp.Identifier, exp.DataType, exp.DataTypeParam, exp.Var,
)


#: Post-processing (SELECT outputs, HAVING, ORDER BY: evaluated by dpsql over released values
#: only, never over private rows) accepts the allow-list above plus these entries. The names of
#: this table are the whole extension; everything else is refused in every clause.
POST_ALLOW_LIST: tuple[FuncSpec, ...] = (
    FuncSpec("COUNT, SUM, AVG", "the released aggregates", "released values",
             "as the query's aggregates (their arguments are checked by the analysis)"),
    FuncSpec("exp", "numeric -> DOUBLE", "released values only", "e.g. to undo a log scale"),
    FuncSpec("log, log2", "[base, ] numeric -> DOUBLE", "released values only", "log(x) is the base-10 logarithm"),
)

#: other spellings of allow-listed functions: the parser reads each as the function it names
ALIASES: dict[str, str] = {
    "ceiling": "ceil", "char_length": "length", "character_length": "length", "len": "length",
    "lcase": "lower", "ucase": "upper", "datepart": "date_part", "datetrunc": "date_trunc", "mod": "%",
    "position": "strpos", "prefix": "starts_with", "suffix": "ends_with",
    "dayofmonth": "day", "weekday": "dayofweek", "weekofyear": "week", "epoch": "date_part('epoch', ...)",
}

#: node types behind POST_ALLOW_LIST (besides the aggregates COUNT/SUM/AVG)
_POST_FUNCS: tuple[type[exp.Expression], ...] = (exp.Exp,)
#: parts of a select item / ORDER BY item / aggregate call (COUNT(*), COUNT(DISTINCT u))
_POST_STRUCTURAL: tuple[type[exp.Expression], ...] = (exp.Alias, exp.Ordered, exp.Star, exp.Distinct,
                                                       exp.Count, exp.Sum, exp.Avg)

_DOCS = "see docs/expressions.md"


#: sqlglot's names of allow-listed functions that SQL spells otherwise: a message names the function as
#: docs/expressions.md and DuckDB spell it (strftime(), not sqlglot's time_to_str())
_SQL_SPELLING = {
    "time_to_str": "strftime", "str_to_time": "strptime", "day_of_week": "dayofweek", "day_of_year": "dayofyear",
    "day_of_month": "dayofmonth", "week_of_year": "weekofyear", "dayofweek_iso": "isodow",
    "timestamp_trunc": "date_trunc", "str_position": "strpos", "date_from_parts": "make_date",
    "is_nan": "isnan", "is_inf": "isinf", "dpipe": "concat", "time_to_unix": "epoch",
    "timestamp_from_parts": "make_timestamp", "date_bin": "time_bucket",
}


def func_name(node: exp.Expression) -> str:
    """The SQL name of a function node (lower case), '' for other nodes."""
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        try:
            return node.sql_name().lower()
        except Exception:  # pragma: no cover - defensive
            return type(node).__name__.lower()
    return ""


def node_problem(sub: exp.Expression, *, post: bool = False) -> str | None:
    """Why the single node ``sub`` is not on the allow-list (None if it is).

    ``post=False``: expressions over private rows (``ALLOW_LIST``); ``post=True``: expressions
    over released values (``ALLOW_LIST`` plus ``POST_ALLOW_LIST``)."""
    fmt = sub.args.get("format") if isinstance(sub, (exp.TimeToStr, exp.StrToTime)) else None
    if isinstance(fmt, exp.Literal) and fmt.is_string:  # (over private rows the typer checks it again)
        msg = format_problem(str(fmt.this), "strftime" if isinstance(sub, exp.TimeToStr) else "strptime")
        if msg is not None:
            return msg
    if isinstance(sub, (exp.Cast, exp.TryCast)) and isinstance(sub.args.get("to"), exp.DataType):
        target = parse_type(sub.args["to"].sql(dialect="duckdb"))
        if target.kind not in Typer._CAST_TARGETS or target.enum:
            time = (" (for a time of day, compare hour(ts), minute(ts) or second(ts): CAST(ts AS TIME) < TIME "
                    "'06:00:00' is hour(ts) < 6)") if sub.args["to"].is_type("time", "timetz") else (
                " (a TIMESTAMP column is compared with TIMESTAMP '2024-06-01 00:00:00', the time in UTC)"
                if sub.args["to"].is_type("timestamptz") else "")
            return (f"CAST to {sub.args['to'].sql(dialect='duckdb')} is not supported (not on the allow-list); cast to "
                    f"BOOLEAN, an integer type, DECIMAL(p,s), DOUBLE, VARCHAR, DATE or TIMESTAMP ({_DOCS}){time}")
        if post and target.name in _UNEXPORTABLE_KEYS:  # an output: exported to Arrow as DECIMAL(38, 0)
            return (f"CAST to {target} over released values is not supported: its values beyond 2^127 cannot be "
                    "released as numbers (they would wrap to negative numbers); cast to HUGEINT, DOUBLE or VARCHAR")
    if post and isinstance(sub, exp.Literal) and not sub.is_string and str(sub.this).isdigit() and (
            2**127 <= int(str(sub.this)) < 2**128):  # DuckDB types it UHUGEINT (see the CAST above)
        return (f"the integer {sub.this} is a UHUGEINT to DuckDB, whose values beyond 2^127 cannot be released as "
                f"numbers (they would wrap to negative numbers); write it as a DOUBLE ({float(int(str(sub.this))):.6g}) "
                "or as text")
    if isinstance(sub, exp.Collate):
        if post:
            return f"COLLATE is not on the allow-list of post-processing ({_DOCS})"
        return ("COLLATE is not allowed: a collation makes different spellings equal, so a released key "
                "could be spelled by one person's row; use lower()/upper() to compare text case-insensitively")
    if isinstance(sub, _COMPARISONS) and any(isinstance(x, _COMPARISONS) for x in (sub.this, sub.expression)):
        return ("chained comparisons (a < b < c) are not supported, as in DuckDB: combine the comparisons with AND "
                "(18 <= age AND age < 65), or parenthesize the one to compare first")
    if isinstance(sub, exp.Interval) and isinstance(sub.parent, (exp.Add, exp.Sub)):
        if not post:
            return None  # DATE/TIMESTAMP +/- INTERVAL: typed by the typer (Typer._shift_literal), else refused there
        # over released values (a released DATE, or a GROUP BY key named in the SELECT list): rendered
        # total by dpsql.postprocess (guarded_shift), so only its form is checked here
        return None if interval_parts(sub) is not None else INTERVAL_FORM
    if isinstance(sub, exp.Anonymous):
        if str(sub.this).lower() in _ANON:
            return None
    elif isinstance(sub, _STRUCTURAL) or type(sub) in _FUNCS:
        return None
    elif post and (isinstance(sub, _POST_STRUCTURAL) or type(sub) in _POST_FUNCS):
        return None
    fix = _OFF_LIST_FIXES.get(type(sub))
    if isinstance(sub, exp.Func):
        name = str(sub.this).lower() if isinstance(sub, exp.Anonymous) else Typer._fname(sub)
        fix = _OFF_LIST_FIXES.get(name, fix)
        if post:
            return (f"function {name}() is not on the allow-list of functions over released values "
                    f"(outputs, HAVING, ORDER BY; {_DOCS})" + (f"; {fix}" if fix else ""))
        return (f"function {name}() is not on the allow-list of functions with a total, bounded-cost evaluation ({_DOCS})"
                + (f"; {fix}" if fix else ""))
    what = _OPERATOR_NAMES.get(type(sub), type(sub).__name__.upper())
    return f"the expression {what} is not on the allow-list ({_DOCS})" + (f"; {fix}" if fix else "")


#: operators named as SQL writes them (sqlglot's class names run their words together: SIMILARTO)
_OPERATOR_NAMES: dict[type[exp.Expression], str] = {exp.SimilarTo: "SIMILAR TO"}


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_CLOCK_FIX = "a release must not depend on when it ran: write the date as a literal (DATE '2024-12-31')"
_SHIFT_FIX = "shift by an INTERVAL: d + INTERVAL 3 DAY (or date_add(d, INTERVAL 3 DAY)), d - INTERVAL 3 DAY"
_PATTERN_FIX = "match text with LIKE / ILIKE ('%' and '_'), starts_with, ends_with or contains"
_EPOCH_FIX = ("write date_part('epoch', ts) (seconds as a DOUBLE, answered: epoch_ms(ts) > 1717200000000 is "
              "date_part('epoch', ts) > 1717200000), or compare the timestamp itself with a literal "
              "(ts > TIMESTAMP '2024-06-01 00:00:00')")
_LIST_FIX = "lists are not answered: test membership with IN (x IN ('a', 'b'))"
_SPLIT_FIX = "lists are not answered: split_part(s, '/', 2) is the second part of s split at '/'"
_FORMAT_FIX = "format a date or timestamp with DuckDB's strftime(d, '%Y-%m') (or group by date_trunc('month', d))"
#: the fix for common functions and operators that are not on the allow-list (by name or node type)
_OFF_LIST_FIXES: dict[str | type[exp.Expression], str] = {
    "current_date": _CLOCK_FIX, "current_timestamp": _CLOCK_FIX, "current_time": _CLOCK_FIX, "now": _CLOCK_FIX,
    "get_current_timestamp": _CLOCK_FIX, "transaction_timestamp": _CLOCK_FIX,
    "datediff": ("compare the column with a shifted literal instead: date_diff('day', d, DATE '2024-12-31') < 30 is "
                 "d > DATE '2024-12-31' - INTERVAL 30 DAY"),
    "date_add": _SHIFT_FIX, "date_sub": _SHIFT_FIX,
    "epoch_ms": _EPOCH_FIX, "epoch_us": _EPOCH_FIX, "epoch_ns": _EPOCH_FIX, exp.UnixToTime: _EPOCH_FIX,
    "strlen": "write length(s), which counts characters (strlen counts bytes)",
    "octet_length": "write length(s), which counts characters (octet_length counts bytes)",
    "make_timestamp": ("write the timestamp as a literal: make_timestamp(2024, 3, 1, 0, 0, 0) is "
                       "TIMESTAMP '2024-03-01 00:00:00' (make_date(y, m, d) of integers is answered)"),
    "time_bucket": ("group by date_trunc('week', ts) (or 'day', 'month', 'hour', ...): time_bucket(INTERVAL '1 week', "
                    "ts) is date_trunc('week', ts), weeks starting on Monday"),
    "regexp_extract": _PATTERN_FIX, "regexp_replace": ("replace(s, 'abc', 'x') replaces a literal text; "
                                                       + _PATTERN_FIX + " to test a pattern"),
    "regexp_split_to_array": _SPLIT_FIX, "split": _SPLIT_FIX, "str_split": _SPLIT_FIX, "string_split": _SPLIT_FIX,
    exp.Bracket: ("substring(s, 1, 2) is s[1:2], and split_part(s, '/', 2) the second part of s split at '/' (lists "
                  "are not answered)"), exp.Slice: "substring(s, 1, 2) is s[1:2]",
    "width_bucket": "bucket with arithmetic: floor((x - lo) / width) (or a CASE of ranges)",
    "to_date": "parse text with strptime(s, '%Y-%m-%d') (NULL where it does not parse) or CAST(s AS DATE)",
    "array_contains": _LIST_FIX, "list_contains": _LIST_FIX, "list_has": _LIST_FIX, "array_has": _LIST_FIX,
    "array": _LIST_FIX, exp.Array: _LIST_FIX,
    exp.Tuple: ("compare each column on its own, under AND: (a, b) = ('x', 1) is a = 'x' AND b = 1, and "
                "(a, b) IN (('x', 1), ('y', 2)) is (a = 'x' AND b = 1) OR (a = 'y' AND b = 2)"),
    "age": _CLOCK_FIX + ", and compare the column with it shifted: age(ts) > INTERVAL 30 DAY is "
                        "ts < TIMESTAMP '2024-12-31' - INTERVAL 30 DAY",
    "last_day": "group by the month's first day, date_trunc('month', d), or by year(d) and month(d)",
    "regexp_like": _PATTERN_FIX, "regexp_matches": _PATTERN_FIX, "regexp_full_match": _PATTERN_FIX,
    exp.SimilarTo: _PATTERN_FIX, exp.Glob: _PATTERN_FIX,
    "to_char": _FORMAT_FIX, "format_date": _FORMAT_FIX, "format_timestamp": _FORMAT_FIX, "date_format": _FORMAT_FIX,
}


def allow_list_problems(node: exp.Expression, *, post: bool = False) -> list[tuple[exp.Expression, str]]:
    """Every construct in ``node`` that is not on the allow-list (all of them, for one report)."""
    out: list[tuple[exp.Expression, str]] = []
    refused: set[int] = set()
    for sub in node.walk(bfs=False):  # depth first: left to right in the SQL text
        if isinstance(sub, CALL_PARTS) and any(id(a) in refused for a in ancestors(sub)):
            continue  # a part of a refused call (its INTERVAL, slice or JSON path): no problem of its own
        msg = node_problem(sub, post=post)
        if msg is not None:
            out.append((sub, msg))
            refused.add(id(sub))
    return out


#: nodes that are parts of a call, never a value of their own: reported with the call when it is refused
CALL_PARTS: tuple[type[exp.Expression], ...] = (exp.Interval, exp.Slice, exp.JSONPath, exp.JSONPathPart, exp.Array)


def ancestors(node: exp.Expression) -> Iterator[exp.Expression]:
    p = node.parent
    while p is not None:
        yield p
        p = p.parent


def _depth(node: exp.Expression) -> int:
    """The nesting depth of ``node`` (iterative: a deep tree cannot exhaust the stack here)."""
    best = 0
    stack: list[tuple[exp.Expression, int]] = [(node, 1)]
    while stack:
        n, d = stack.pop()
        best = max(best, d)
        for child in n.iter_expressions():
            stack.append((child, d + 1))
    return best


def _constant(node: exp.Expression) -> bool:
    """A literal, possibly typed (``CAST('2024-01-01' AS DATE)``) or negated."""
    if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
        return True
    if isinstance(node, (exp.Cast, exp.TryCast, exp.Neg, exp.Paren, exp.MD5)):
        return _constant(node.this)
    if isinstance(node, exp.DPipe):  # a digest's salt and a constant (_digest)
        return _constant(node.this) and _constant(node.expression)
    if isinstance(node, exp.Case):  # a float constant made canonical (_digest)
        return all(_constant(c) for c in node.iter_expressions())
    if isinstance(node, exp.If):
        return _constant(node.this) and _constant(node.args["true"])
    if isinstance(node, (exp.IsNan, exp.EQ)):
        return all(_constant(c) for c in node.iter_expressions())
    return False


def _size(node: exp.Expression) -> int:
    """The size of ``node`` as DuckDB evaluates it: NULLIF(a, b) counts ``a`` twice. The constant
    elements of an IN list count nothing: DuckDB looks a value up in them (they are bounded by
    ``MAX_IN_LIST``), and counting them made lists of a few thousand typed literals "too large"."""
    if isinstance(node, exp.Nullif):
        return 1 + 2 * _size(node.this) + _size(node.expression)
    if isinstance(node, exp.In):
        return 1 + _size(node.this) + sum(_size(c) for c in node.expressions if not _constant(c))
    return 1 + sum(_size(c) for c in node.iter_expressions())


def _check_shape(node: exp.Expression) -> None:
    """Refuse (free: it depends on the query only) an expression nested deeper than MAX_DEPTH."""
    if _depth(node) > MAX_DEPTH:
        raise TypeRefusal([(node, (
            f"the expression is nested more than {MAX_DEPTH} levels deep (a long chain such as a + b + c + ... "
            "counts one level per operator, and so does each parenthesis); write it with fewer nested operators"
        ))])


#: meta key caching a rendered node's size (``_size``); copies of a node carry it
_SIZE = "dpsql_rendered_size"

TOO_LARGE = (f"the expression is too large once made total (more than {MAX_RENDERED_NODES} parts once each integer "
             "division, negation and date_trunc carries its guard); nest fewer of them")


def _rendered_size(node: exp.Expression) -> int:
    """``_size(node)``, cached on each node of a rendering (the typer builds renderings bottom up
    and never changes a node it has sized), so sizing every intermediate result costs O(new nodes)."""
    cached = node.meta.get(_SIZE)
    if cached is not None:
        return int(cached)
    if isinstance(node, exp.Nullif):
        n = 1 + 2 * _rendered_size(node.this) + _rendered_size(node.expression)
    elif isinstance(node, exp.In):
        n = 1 + _rendered_size(node.this) + sum(_rendered_size(c) for c in node.expressions if not _constant(c))
    else:
        n = 1 + sum(_rendered_size(c) for c in node.iter_expressions())
    node.meta[_SIZE] = n
    return n


#: the rendered nodes that search a text for a literal (each counts against MAX_SEARCHES)
_SEARCHES: tuple[type[exp.Expression], ...] = (exp.Contains, exp.StrPosition, exp.Replace, exp.SplitPart, exp.Like,
                                               exp.ILike)

TOO_MANY_SEARCHES = (f"the expression holds more than {MAX_SEARCHES} substring searches (LIKE/ILIKE, contains, strpos, "
                     "replace, split_part) once made total: date_trunc, integer division and NULLIF repeat their operand, "
                     "and each copy searches again; use fewer searches, or keep them outside those functions")


def _rendered_searches(node: exp.Expression) -> int:
    """The substring searches a row evaluates in ``node`` (DuckDB evaluates NULLIF(a, b) as a CASE reading ``a``
    twice, as ``_rendered_size`` counts it)."""
    own = 1 if isinstance(node, _SEARCHES) else 0
    if isinstance(node, exp.Nullif):
        return own + 2 * _rendered_searches(node.this) + _rendered_searches(node.expression)
    return own + sum(_rendered_searches(c) for c in node.iter_expressions())


TOO_MUCH_TEXT = (f"the expression may build more than {MAX_TEXT_BUILT} bytes of text per row (each text argument of a "
                 f"string function is up to {STRING_CAP} characters of up to 4 bytes; a concatenation builds the sum of its "
                 "parts, a replace() whose replacement is longer than the text it replaces up to (the input's characters / "
                 "that text's length) replacements): concatenate fewer texts, or replace a longer text or with a shorter "
                 "replacement")


def _text_bytes(node: exp.Expression) -> int:
    """At most the bytes of the text ``node`` (an argument of a text-building function) holds: a string literal's
    own; anything else at most STRING_CAP characters (the cap on every text argument; fewer where :func:`_chars`
    knows, e.g. LEFT(x, n)) of up to 4 bytes."""
    while isinstance(node, (exp.Collate, exp.Paren)):
        node = node.this
    if isinstance(node, exp.Literal) and node.is_string:
        return len(node.this.encode())
    return 4 * min(STRING_CAP, _chars(node))


def _rendered_text(node: exp.Expression) -> int:
    """The bytes of text a row builds in ``node`` at worst: each concatenation the sum of its parts (a digest's
    salted text, compared with a hash, is not counted), each growing replace() its output before the cut."""
    own = 0
    if isinstance(node, (exp.Concat, exp.ConcatWs)):
        parts = list(node.expressions)
        own = sum(_text_bytes(p) for p in parts)
        if isinstance(node, exp.ConcatWs) and len(parts) > 2:
            own += (len(parts) - 3) * _text_bytes(parts[0])
    elif isinstance(node, exp.DPipe) and not isinstance(node.parent, exp.MD5):
        own = _text_bytes(node.this) + _text_bytes(node.expression)
    elif isinstance(node, exp.Replace):
        frm, to = (len(str(node.expression.this)), len(str(node.args["replacement"].this).encode()))
        if frm and to > frm:
            own = max(_text_bytes(node.this), (STRING_CAP // frm) * to + (STRING_CAP % frm) * 4)
    if isinstance(node, exp.Nullif):
        return own + 2 * _rendered_text(node.this) + _rendered_text(node.expression)
    return own + sum(_rendered_text(c) for c in node.iter_expressions())


#: string work per character read, by cost class (measured on 1024 four-byte characters against the ~3.4 us a
#: linear scan of them costs, LEFT(x, 1024) included): per-character case mapping and trimming (upper/lower ~10 us,
#: ILIKE, which folds case, as much; trim ~5 us) 4, reverse (which walks grapheme clusters, ~18 us) 6; every other
#: function reading a text (LEFT, length, substring, right, starts_with, the searches, concat, strptime) 1
STRING_FACTORS: dict[type[exp.Expression], int] = {exp.Upper: 4, exp.Lower: 4, exp.ILike: 4, exp.Trim: 4,
                                                   exp.Reverse: 6}
_SCANS: tuple[type[exp.Expression], ...] = (exp.Left, exp.Right, exp.Length, exp.Substring, exp.StartsWith,
                                            exp.EndsWith, exp.Contains, exp.StrPosition, exp.Like, exp.Replace,
                                            exp.SplitPart, exp.Concat, exp.ConcatWs, exp.DPipe, exp.MD5)
_TEXT_COMPARISONS: tuple[type[exp.Expression], ...] = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE,
                                                  exp.NullSafeEQ, exp.NullSafeNEQ, exp.Nullif)

TOO_MUCH_STRING_WORK = (f"the expression may do more than {MAX_STRING_WORK} units of string work per row (a string "
                        f"function reads up to {STRING_CAP} characters of each text argument, and what a character "
                        "costs depends on the text: each call counts its worst case, reverse 6 units a character, "
                        "upper/lower/trim/ILIKE 4, any other 1, and a comparison of two texts read from the row up to "
                        f"{RAW_TEXT_BYTES // 16}); use fewer string functions, or cap the text first with LEFT(x, n) "
                        "for a small literal n (a function of LEFT(x, 16) reads 16 characters)")


#: meta key marking a number, date, timestamp or boolean converted to text (at most 64 characters: 40 digits of a
#: DECIMAL(38, s), a DATE's '290309-12-22 (BC)')
_SHORT_TEXT = "dpsql_short_text"


def _chars(node: exp.Expression) -> int:
    """At most the characters of the text ``node`` (a literal its own, LEFT(x, n) of a literal n at most n, a
    string function's result at most STRING_CAP, a number or date as text 64, anything read from a row
    RAW_TEXT_BYTES)."""
    while isinstance(node, (exp.Collate, exp.Paren)):
        node = node.this
    if isinstance(node, exp.Literal) and node.is_string:
        return len(node.this)
    if node.meta.get(_SHORT_TEXT) or isinstance(node, exp.Null):
        return 64
    if isinstance(node, exp.Left) and isinstance(node.expression, exp.Literal) and not node.expression.is_string:
        return min(int(node.expression.this), _chars(node.this))
    if isinstance(node, (exp.Concat, exp.ConcatWs, exp.DPipe)):
        return sum(_chars(p) for p in node.iter_expressions())
    if isinstance(node, (exp.Greatest, exp.Least, exp.Coalesce)):
        return max(_chars(p) for p in node.iter_expressions())
    if isinstance(node, exp.Case):
        branches = [*(i.args["true"] for i in node.args["ifs"]), node.args.get("default") or exp.Null()]
        return max(_chars(p) for p in branches)
    if isinstance(node, (exp.Upper, exp.Lower, exp.Trim, exp.Reverse, exp.Right, exp.Substring, exp.Replace,
                         exp.SplitPart, exp.Left)):
        return min(STRING_CAP, _chars(node.this))
    return RAW_TEXT_BYTES


def _compared_bytes(node: exp.Expression) -> int:
    """At most the bytes a comparison reads of the text ``node``."""
    while isinstance(node, (exp.Collate, exp.Paren)):
        node = node.this
    if isinstance(node, exp.Literal) and node.is_string:
        return len(node.this.encode())
    return min(RAW_TEXT_BYTES, 4 * _chars(node))


def _is_text(node: exp.Expression) -> bool:
    """A comparison's operand that the typer rendered as text (``COLLATE "binary"``), or a string literal."""
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Collate) or (isinstance(node, exp.Literal) and node.is_string)


def _comparison_work(node: exp.Expression) -> int:
    """The string work of one comparison node: each pair of texts compared reads at most the shorter's bytes."""
    def pair(a: exp.Expression, b: exp.Expression) -> int:
        return min(_compared_bytes(a), _compared_bytes(b)) // 16

    if isinstance(node, _TEXT_COMPARISONS) and (_is_text(node.this) or _is_text(node.expression)):
        return pair(node.this, node.expression)
    if isinstance(node, exp.Between) and _is_text(node.this):
        return pair(node.this, node.args["low"]) + pair(node.this, node.args["high"])
    if isinstance(node, exp.In) and _is_text(node.this):
        return sum(pair(node.this, e) for e in node.expressions)
    if isinstance(node, (exp.Greatest, exp.Least)):
        args = [node.this, *node.expressions]
        if any(_is_text(a) for a in args):
            return 2 * sum(pair(args[0], a) for a in args[1:])  # each step compares and keeps the larger
    return 0


def _string_work(node: exp.Expression) -> int:
    """The string work of ``node`` itself (its arguments not included)."""
    factor = STRING_FACTORS.get(type(node), 1 if isinstance(node, _SCANS) else 0)
    if isinstance(node, exp.Anonymous) and str(node.this).upper() == "TRY_STRPTIME":
        factor = 1
    if factor:
        if isinstance(node, (exp.Concat, exp.ConcatWs, exp.DPipe, exp.MD5)):
            read = sum(min(STRING_CAP, _chars(p)) for p in node.iter_expressions())
        elif isinstance(node, exp.Anonymous):
            read = min(STRING_CAP, _chars(node.expressions[0]))
        elif isinstance(node, exp.Left) and isinstance(node.expression, exp.Literal):
            read = _chars(node)
        else:
            read = min(STRING_CAP, _chars(node.this))
        return factor * read
    if isinstance(node, (exp.Cast, exp.TryCast)) and str(node.meta.get(CAST_FROM, "")).startswith("VARCHAR"):
        return CAST_TEXT_CAP  # a conversion of text parses at most this much (its guard's LEFT and length count too)
    return _comparison_work(node)


def _rendered_string_work(node: exp.Expression) -> int:
    """The string work a row does in ``node`` at worst, in characters read (``MAX_STRING_WORK``; NULLIF's first
    argument counted twice as ``_rendered_size`` counts it; a constant, such as a long IN list's digests of its
    elements, is computed once, not per row)."""
    if _constant(node):
        return 0
    own = _string_work(node)
    if isinstance(node, exp.Nullif):
        return own + 2 * _rendered_string_work(node.this) + _rendered_string_work(node.expression)
    return own + sum(_rendered_string_work(c) for c in node.iter_expressions())


#: the string work of each distinct rendering typed within :func:`query_string_work`, by its text
_QUERY_WORK: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("dpsql_query_string_work",
                                                                                    default=None)


@contextlib.contextmanager
def query_string_work() -> Iterator[dict[str, int]]:
    """Collect the string work of every expression typed meanwhile (in this thread or task), each distinct rendering
    once (DuckDB computes a repeated expression once): the analysis of one query refuses a total above
    :data:`MAX_QUERY_STRING_WORK` (:func:`check_query_string_work`)."""
    works: dict[str, int] = {}
    token = _QUERY_WORK.set(works)
    try:
        yield works
    finally:
        _QUERY_WORK.reset(token)


def _count_query_work(rendered: exp.Expression, work: int | None = None) -> None:
    works = _QUERY_WORK.get()
    if works is None:
        return
    if work is None:
        work = _rendered_string_work(rendered)
    if work:
        works[rendered.sql(dialect="duckdb")] = work


TOO_MUCH_QUERY_STRING_WORK = (
    f"the query's expressions may do more than {MAX_QUERY_STRING_WORK} units of string work per row together (each "
    f"expression at most {MAX_STRING_WORK}: every expression of a query, its WHERE, GROUP BY keys and each "
    "aggregate's argument, runs on every row before any cap, so their string work adds up)")


def check_query_string_work(works: dict[str, int]) -> str | None:
    """The refusal of a query whose expressions (:func:`query_string_work`) may do more string work per row together
    than :data:`MAX_QUERY_STRING_WORK`, or None. A rendering found within another is not counted again: the analysis
    types a part on its own too (a WHERE's conditions on the keys; COUNT(x)'s ``x`` and its test ``x IS NULL``), and
    a part evaluated elsewhere as well (a condition of the WHERE, which is a filter of its own) is at most the one
    WHERE's work more."""
    if sum(works.values()) <= MAX_QUERY_STRING_WORK:
        return None
    kept: list[str] = []
    total = 0
    for text in sorted(works, key=len, reverse=True):
        if any(text in other for other in kept):
            continue
        kept.append(text)
        total += works[text]
        if total > MAX_QUERY_STRING_WORK:
            return TOO_MUCH_QUERY_STRING_WORK
    return None


def _check_rendered(node: exp.Expression, rendered: exp.Expression) -> exp.Expression:
    if _depth(rendered) > 4 * MAX_DEPTH or _size(rendered) > MAX_RENDERED_NODES:
        raise TypeRefusal([(node, TOO_LARGE)])
    if _rendered_searches(rendered) > MAX_SEARCHES:
        raise TypeRefusal([(node, TOO_MANY_SEARCHES)])
    if _rendered_text(rendered) > MAX_TEXT_BUILT:
        raise TypeRefusal([(node, TOO_MUCH_TEXT)])
    work = _rendered_string_work(rendered)
    if work > MAX_STRING_WORK:
        raise TypeRefusal([(node, TOO_MUCH_STRING_WORK)])
    _count_query_work(rendered, work)
    return rendered


def type_checked(node: exp.Expression, schema: dict[str, str]) -> Typed:
    """``node`` typed and rendered with the limits of every entry point (allow-list, depth and
    rendered size; raises ``TypeRefusal``), whatever its type."""
    _check_shape(node)
    problems = allow_list_problems(node)
    if problems:
        raise TypeRefusal(problems)
    try:
        r = Typer(schema).t(node)
    except _Refuse as rf:
        raise TypeRefusal([(rf.node, rf.message)]) from None
    _check_rendered(node, r.expr)
    return r


#: conditions of at least this many nodes are typed once (:data:`_TYPED`)
TYPED_KEPT_FROM = 512
#: the most typed conditions :data:`_TYPED` keeps (the least recently used goes first)
TYPED_KEPT = 8
#: the most nodes the typed renderings :data:`_TYPED` keeps hold together (about 350 bytes each), beyond the one typed
#: last, kept whatever its size (the analysis and the bounded query type one long condition): a count alone let
#: eight renderings of lists of 10 000 values hold 0.8 GB for the process's life (a DOUBLE list's is 280 000 nodes)
TYPED_KEPT_NODES = 300_000
#: the typed rendering of each long condition, by its exact form (:func:`_condition_key`), schema and clause: the
#: analysis types a WHERE, its conditions on the keys alone, and the bounded query each relation that filters rows
#: by it, so an IN list of 10 000 values was typed four times (about 0.5 s each). A refusal is not kept (it is typed
#: again, and names the nodes of the condition at hand). Never handed out: each caller gets a copy of its own
_TYPED: OrderedDict[tuple[Any, ...], tuple[exp.Expression, int]] = OrderedDict()  # (rendering, its nodes)
_TYPED_LOCK = threading.Lock()


def _typed_lock_after_fork() -> None:
    """In a forked child, :data:`_TYPED_LOCK` made anew: only the forking thread exists there, and another thread of
    the parent may have held the lock at the fork (held for ever in the child: a new Session's first long condition
    waited for ever). The kept typings stay: each is a function of its key alone."""
    global _TYPED_LOCK
    _TYPED_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_typed_lock_after_fork)


def _condition_key(node: exp.Expression, schema: dict[str, str], what: str) -> tuple[Any, ...] | None:
    """Everything the typing of ``node`` depends on, exactly (each node's class, arguments, comments, type and meta,
    in order: text in its own case, where sqlglot's hash folds it), with the schema and the clause; None for a
    condition of fewer than :data:`TYPED_KEPT_FROM` nodes (typed each time, as cheap as this key)."""
    out: list[Any] = [what, tuple(sorted(schema.items()))]
    stack: list[Any] = [node]
    nodes = 0
    while stack:
        n = stack.pop()
        if not isinstance(n, exp.Expression):
            out.append(("value", n))
            continue
        nodes += 1
        # (``_type`` is set by an annotation only: a cast's or a type's ``type`` is its own; ``meta`` would make one)
        typ, meta = getattr(n, "_type", None), getattr(n, "_meta", None)
        head: list[Any] = [type(n), tuple(n.comments) if n.comments else None,
                           typ.sql(dialect="duckdb") if typ is not None else None,
                           tuple(meta.items()) if meta else None]  # (in order: a copy keeps it)
        children: list[Any] = []
        for k, v in n.args.items():
            if isinstance(v, list):
                head.append((k, len(v)))
                children.extend(v)
            elif isinstance(v, exp.Expression):
                head.append((k, 1))
                children.append(v)
            else:
                head.append((k, v))
        out.append(tuple(head))
        stack.extend(reversed(children))
    if nodes < TYPED_KEPT_FROM:
        return None
    key = tuple(out)
    try:
        hash(key)
    except TypeError:  # an argument sqlglot keeps unhashable: typed each time
        return None
    return key


def type_predicate(node: exp.Expression, schema: dict[str, str], what: str = "WHERE", *,
                   own: bool = True) -> exp.Expression:
    """The total, explicitly typed rendering of a condition (raises ``TypeRefusal``). ``own=False``: the caller only
    reads the rendering (a long condition's kept one, :data:`_TYPED`, may be handed out: never change it)."""
    key = _condition_key(node, schema, what) if isinstance(node, exp.Expression) else None
    if key is not None:
        with _TYPED_LOCK:
            found = _TYPED.get(key)
            if found is not None:
                _TYPED.move_to_end(key)
        if found is not None:
            _count_query_work(found[0])
            return found[0].copy() if own else found[0]
    _check_shape(node)
    problems = allow_list_problems(node)
    if problems:
        raise TypeRefusal(problems)
    ty = Typer(schema)
    try:
        typed = _check_rendered(node, ty.boolean(node, what))
    except _Refuse as r:
        raise TypeRefusal([(r.node, r.message)]) from None
    if key is None:
        return typed
    nodes = sum(1 for _ in typed.walk())  # (a tenth of the typing's time, on the first typing only)
    with _TYPED_LOCK:
        _TYPED[key] = (typed, nodes)
        _TYPED.move_to_end(key)
        held = sum(n for _, n in _TYPED.values())
        while len(_TYPED) > 1 and (len(_TYPED) > TYPED_KEPT or held > TYPED_KEPT_NODES):
            held -= _TYPED.popitem(last=False)[1][1]
    return typed.copy() if own else typed


#: string work per byte of text a GROUP BY key (or a counted distinct value) builds (``_rendered_text``): the bounded
#: query reads a key's value again after building it, in every read that groups by it (its length, its salted MD5
#: digest, the binary collation, the second read that gives released groups their long keys' texts), about 14-17 ns
#: a byte: one person's 2 000 rows of 1024 four-byte characters under GROUP BY concat() of 15 copies of the text
#: (61 kB built per row, 15 360 units of string work alone) cost 2.19 s of CPU against 0.14 s under one copy
KEY_TEXT_WORK = 4

TOO_MUCH_KEY_TEXT = (f"the key may build too much text per row: each byte a GROUP BY key or a COUNT(DISTINCT ...) value "
                     f"builds (a concatenation, a growing replace) is read again by the grouping, {KEY_TEXT_WORK} units "
                     f"of string work a byte, and an expression may do at most {MAX_STRING_WORK}; concatenate fewer "
                     "or shorter texts (LEFT(x, n) for a small literal n), or group by the columns themselves")


def _built_value(node: exp.Expression) -> int:
    """The bytes of text a value (a key, a counted value) may hold that a row built (a concatenation, a growing
    replace, ``_rendered_text``'s own count of the node that makes the value): 0 for a value read from the row, a
    number or a constant; a CASE, COALESCE, NULLIF, GREATEST or LEAST its largest branch."""
    while isinstance(node, (exp.Collate, exp.Paren, exp.Cast, exp.TryCast)):
        node = node.this
    if isinstance(node, exp.Case):
        branches = [i.args.get("true") for i in node.args.get("ifs") or []] + [node.args.get("default")]
        return max((_built_value(b) for b in branches if isinstance(b, exp.Expression)), default=0)
    if isinstance(node, exp.If):
        branches = [node.args.get("true"), node.args.get("false")]
        return max((_built_value(b) for b in branches if isinstance(b, exp.Expression)), default=0)
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif)):
        return max((_built_value(b) for b in node.iter_expressions()), default=0)
    if isinstance(node, (exp.Concat, exp.ConcatWs, exp.DPipe, exp.Replace)):
        return _rendered_text(node) - sum(_rendered_text(c) for c in node.iter_expressions())
    return 0


def _check_key_text(node: exp.Expression, rendered: exp.Expression) -> None:
    """Refuse a key (or a counted distinct value) whose built text, read again by the grouping
    (:data:`KEY_TEXT_WORK`), takes its string work above :data:`MAX_STRING_WORK`."""
    built = _built_value(rendered)
    if not built:
        return
    work = _rendered_string_work(rendered) + KEY_TEXT_WORK * built
    if work > MAX_STRING_WORK:
        raise TypeRefusal([(node, TOO_MUCH_KEY_TEXT)])
    _count_query_work(rendered, work)


def type_key(node: exp.Expression, schema: dict[str, str]) -> tuple[exp.Expression, SqlType]:
    """The total, canonical rendering of a GROUP BY key and its type (raises ``TypeRefusal``)."""
    r = type_checked(node, schema)
    _check_key_text(node, r.expr)
    if r.type.kind == "null":
        return _cast(exp.Null(), VARCHAR, try_=False), VARCHAR
    if r.type.kind not in KEY_KINDS and r.type.kind != "strlit":
        fix = (
            f"group by CAST({node.sql(dialect='duckdb')} AS VARCHAR), whose text is canonical"
            if r.type.name.split("(")[0] in _TEXT_CASTABLE
            else "group by a column of a scalar type instead"
        )
        raise TypeRefusal([(node, (
            f"GROUP BY key of type {r.type} is not allowed: its equality is coarser than its spelling "
            f"(or it has no canonical spelling), so a released key could be spelled by one person's row; {fix}"
        ))])
    if r.type.name in _UNEXPORTABLE_KEYS:
        raise TypeRefusal([(node, _unexportable(r.type, f"CAST({node.sql(dialect='duckdb')} AS VARCHAR)"))])
    typ = VARCHAR if r.type.kind == "strlit" else r.type
    return _canonical_key(Typed(r.expr, typ), node), typ


#: values of a row counted by COUNT(DISTINCT (a, b, ...)): each one's text is listed for every row (its cost that of
#: as many COUNT(DISTINCT) aggregates)
MAX_ROW_FIELDS = 64


def row_fields(node: exp.Expression) -> list[exp.Expression] | None:
    """The fields of a row ``(a, b)`` or ``ROW(a, b)`` (parentheses around it dropped), else None."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Tuple) or (isinstance(node, exp.Anonymous) and str(node.this).upper() == "ROW"):
        return list(node.expressions)
    return None


def _row_leaves(fields: list[exp.Expression]) -> list[exp.Expression]:
    """The fields of a row with each row among them replaced by its own fields: a row is never NULL and rows are
    equal field by field, so ``((a, b), c)`` has the distinct values of ``(a, b, c)`` (each field then read once)."""
    out: list[exp.Expression] = []
    for f in fields:
        inner = row_fields(f)
        out += [f] if inner is None else _row_leaves(inner)
    return out


def _row_text(fields: list[tuple[exp.Expression, SqlType]]) -> exp.Expression:
    """A row's fields (each typed and canonical) as one text: per field ``n`` for NULL, else ``v`` and the SHA-256 of
    its text (``CAST_FROM`` its type, as an engine spells that type; lower-case hex of the UTF-8 bytes on both).
    Injective up to a SHA-256 collision: the text of a canonical key is one per value (``spread_input``) and every
    piece has a fixed length, so two rows have one text exactly when each field is NULL in both or equal in both, as
    DuckDB's DISTINCT compares rows. Each field is read once, through its digest: the row's text is at most 65 bytes
    a field, whatever the row holds (the fields' own texts, concatenated, built up to a text cell's 64 kB each, one
    person's 64 long texts megabytes a row), joined as a balanced tree of concatenations."""
    pieces: list[exp.Expression] = []
    for e, typ in fields:
        text = exp.Cast(this=e.copy(), to=_type_node("VARCHAR"))
        text.meta[CAST_FROM] = typ.name
        digest = exp.SHA2(this=text, length=exp.Literal.number(256))
        pieces.append(exp.Coalesce(this=exp.DPipe(this=exp.Literal.string("v"), expression=digest, safe=True),
                                   expressions=[exp.Literal.string("n")]))

    def joined(parts: list[exp.Expression]) -> exp.Expression:
        if len(parts) <= 1:
            return parts[0] if parts else exp.Literal.string("")
        half = len(parts) // 2
        return exp.DPipe(this=joined(parts[:half]), expression=joined(parts[half:]), safe=True)

    return joined(pieces)


def _nested_kind(t: SqlType) -> str | None:
    """``list``, ``map``, ``struct`` or ``union`` for a nested type (as DuckDB spells it), else None."""
    name = t.name.strip().upper()
    if name.endswith("]"):
        return "list"
    return next((k.lower() for k in ("MAP", "STRUCT", "UNION") if name.startswith(k + "(")), None)


def type_distinct(node: exp.Expression, schema: dict[str, str],
                  in_row: bool = False) -> tuple[exp.Expression, SqlType]:
    """The total, canonical rendering of the argument of ``COUNT(DISTINCT expr)`` and its type (raises
    ``TypeRefusal``): as a GROUP BY key's (:func:`type_key`: binary collation for text, one spelling of 0.0 and
    NaN), so its distinct values are its distinct spellings, and of the same key types. A row ``(a, b)`` /
    ``ROW(a, b)`` is the text of its fields (:func:`_row_text`, each field as this typed; a row among them by its own
    fields), never NULL: DuckDB counts the distinct rows, a row with NULL fields too. Each field is checked with the
    limits of every expression and read once, a cost linear in the query's text."""
    fields = row_fields(node)
    if fields is not None:
        fields = _row_leaves(fields)
        if len(fields) > MAX_ROW_FIELDS:
            raise TypeRefusal([(node, f"COUNT(DISTINCT ...) of a row of {len(fields)} values: at most {MAX_ROW_FIELDS} are "
                                      "counted together, a row inside it by its values (each value's text is read for "
                                      "every row); count fewer together")])
        problems: list[tuple[exp.Expression, str]] = []
        typed: list[tuple[exp.Expression, SqlType]] = []
        for f in fields:
            try:
                typed.append(type_distinct(f, schema, in_row=True))
            except TypeRefusal as e:
                problems += e.problems
        if problems:
            raise TypeRefusal(problems)
        return _row_text(typed), VARCHAR
    r = type_checked(node, schema)
    _check_key_text(node, r.expr)
    if r.type.kind == "null":
        return _cast(exp.Null(), VARCHAR, try_=False), VARCHAR
    nested = _nested_kind(r.type) if in_row and r.type.kind not in KEY_KINDS else None
    if nested is not None:  # (COUNT(DISTINCT ls) alone counts a list column: the row is what cannot hold it)
        bare = node
        while isinstance(bare, exp.Paren):
            bare = bare.this
        what = f"the {nested} column '{bare.name}'" if isinstance(bare, exp.Column) else f"a {nested} value"
        alone = (f"count the distinct {nested}s alone, COUNT(DISTINCT {bare.name})" if isinstance(bare, exp.Column)
                 else f"count a {nested} column alone, e.g. COUNT(DISTINCT col)")
        raise TypeRefusal([(node, (
            f"COUNT(DISTINCT ...) of a row: {what} cannot be a field of a counted row (it is {r.type}; the fields "
            f"of a counted row are values of a scalar type); {alone}, or leave it out of the row"))])
    if r.type.kind not in KEY_KINDS and r.type.kind != "strlit":
        fix = (f"count the distinct values of CAST({node.sql(dialect='duckdb')} AS VARCHAR), whose text is canonical"
               if r.type.name.split("(")[0] in _TEXT_CASTABLE else "count a value of a scalar type instead")
        raise TypeRefusal([(node, (
            f"COUNT(DISTINCT ...) of a value of type {r.type} is not supported: its equality is coarser than its "
            f"spelling (or it has no canonical spelling), so its distinct values are not its distinct spellings; {fix}"
        ))])
    typ = VARCHAR if r.type.kind == "strlit" else r.type
    return _canonical_key(Typed(r.expr, typ), node), typ


def type_value(node: exp.Expression, schema: dict[str, str]) -> exp.Expression:
    """The total, explicitly typed rendering of an aggregate's numeric argument (raises ``TypeRefusal``)."""
    r = type_checked(node, schema)
    if not (r.type.numeric or r.type.kind == "bool"):
        raise TypeRefusal([(node, f"an aggregate's argument must be numeric, got {r.type}")])
    return r.expr


class TypeRefusal(Exception):
    """Raised by the entry points: (node, message) pairs for the analyser's violations."""

    def __init__(self, problems: list[tuple[exp.Expression, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(m for _, m in problems))


def distinct_type_problem(column: str, type_name: str) -> str | None:
    """Why COUNT(DISTINCT column) of ``type_name`` is refused, or None. DuckDB compares INTERVAL values
    after normalising them (INTERVAL '1 day' = INTERVAL '24 hours', INTERVAL '1 month' = INTERVAL '30 days'),
    and a list, struct or map compares its INTERVAL members so; the bounded query's list functions count
    distinct representations, and no spelling is canonical: refused, as an INTERVAL GROUP BY key is."""
    bare = re.sub(r'"(?:[^"]|"")*"', '""', str(type_name).upper())  # a quoted member name is no type
    if re.search(r"\b(BIGNUM|VARINT|VARIANT)\b", bare):
        # the distinct values are listed as their salted text, and a BIGNUM (also inside a VARIANT) has no size cap:
        # converting one person's 10^6-digit value to text took 1.4 s of CPU (superlinear in its digits), so that one
        # cell decided whether the query passed the statement time-out (tests/test_adversary_round39.py)
        return (f"COUNT(DISTINCT {column}) is not supported: '{column}' is {type_name}, whose values (a BIGNUM, or one "
                "held by a VARIANT) have no size cap, and "
                "counting distinct values converts each to text, at a cost superlinear in its digits (hint: COUNT("
                f"{column}) counts its non-NULL values; or register a bounded numeric column instead)")
    if not re.search(r"\bINTERVAL\b", bare):
        return None
    return (f"COUNT(DISTINCT {column}) is not supported: '{column}' is {type_name}, and DuckDB compares INTERVAL values "
            "after normalising them (INTERVAL '1 day' = INTERVAL '24 hours', INTERVAL '1 month' = INTERVAL '30 days'), "
            "so their distinct values are not their distinct spellings (hint: COUNT("
            f"{column}) counts its non-NULL values; to count distinct lengths, register a numeric column that holds them)")


def check_numeric_column(column: str, schema: dict[str, str]) -> str | None:
    """None if SUM/AVG may read ``column``; else the reason."""
    t = parse_type(schema.get(column.lower(), "")) if schema else None
    if t is None or t.numeric or t.kind == "bool":
        return None
    return f"'{column}' is {t}; SUM and AVG need a numeric column"


# -- public key domains (registration) -------------------------------------------------------------------


def type_domain(values: tuple[Any, ...], column_type: str, where: str) -> tuple[Any, ...]:
    """Domain values typed to the column, or ValueError naming the first mismatch.

    Returns the normalised Python values (dates as ``datetime.date``, timestamps as
    ``datetime.datetime``, decimals as ``decimal.Decimal``) that ``domain_literal`` renders.
    """
    t = parse_type(column_type)
    if t.kind not in KEY_KINDS:
        raise ValueError(f"{where} is of type {t}, which cannot be a public key (its equality is coarser than its spelling)")
    if t.name in _UNEXPORTABLE_KEYS:
        raise ValueError(f"{where} is of type {t}, which cannot be a public key: " + _unexportable(t, "a VARCHAR column"))
    out: list[Any] = []
    for v in values:
        out.append(_domain_value(v, t, where))
    if len(set(out)) != len(out):
        raise ValueError(f"the domain of {where} has values that are equal as {t}")
    return tuple(out)


def _domain_value(v: Any, t: SqlType, where: str) -> Any:
    bad = ValueError(f"domain value {v!r} of {where} is not a {t} value")
    k = t.kind
    if isinstance(v, str) and k in ("bool", "int", "float"):  # as typed on the command line (--domain t.k=1,2)
        v = _domain_text(v, t, where, bad)
    if k == "bool":
        if isinstance(v, bool):
            return v
        raise bad
    if isinstance(v, bool):
        raise bad
    if k == "varchar":
        if isinstance(v, str):
            return v
        raise bad
    if k == "int":
        w = v if isinstance(v, int) else int(v) if isinstance(v, float) and v.is_integer() else None
        if w is not None and t.name == "HUGEINT" and _fits(w, t) and abs(w) >= 10**38:
            # a released key is an Arrow decimal128(38, 0), which cannot be made from it (every query listing it failed)
            raise ValueError(f"domain value {v!r} of {where} has more than 38 digits: it cannot be released as a key")
        if isinstance(v, int) and _fits(v, t):
            return v
        if isinstance(v, float) and v.is_integer() and _fits(int(v), t):
            return int(v)
        raise bad
    if k == "decimal":
        if isinstance(v, str) and not is_plain_number(v):  # Decimal() reads '1_0' as 10, and ' 1', '１'
            raise ValueError(f"domain value {v!r} of {where} is not a {t} value: write it in {PLAIN_FORM}")
        if isinstance(v, (int, float, str, decimal.Decimal)):
            try:
                d = decimal.Decimal(str(v)) if not isinstance(v, decimal.Decimal) else v
            except decimal.InvalidOperation:
                raise bad from None
            if d.is_finite() and _fits(d, t):
                with decimal.localcontext() as ctx:  # the default 28 digits cannot hold a DECIMAL(38)
                    ctx.prec = 80
                    return d.quantize(decimal.Decimal(1).scaleb(-t.scale))
        raise bad
    if k == "float":
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"domain value {v!r} of {where} is not a finite number: a declared domain lists finite "
                             "values (a row holding NaN or an infinity is in no group; to count such rows, group by an "
                             "expression of the column, e.g. CAST(col AS VARCHAR), which the sparse histogram answers)")
        if isinstance(v, (int, float)) and float(v) == float(v) and abs(float(v)) != float("inf"):
            f = float(v) + 0.0
            if t.name == "FLOAT":
                # a FLOAT column compares in single precision: the value it holds is the nearest
                # single, so two declared values that round to one single are one key (refused by
                # the caller), and a value rounding beyond the FLOAT range would be a key of infinity
                try:
                    f = struct.unpack("<f", struct.pack("<f", f))[0] + 0.0
                except OverflowError:
                    raise bad from None
            return f
        raise bad
    if k == "date":
        if isinstance(v, dt.datetime):
            raise bad
        if isinstance(v, dt.date):
            return v
        if isinstance(v, str) and _parse_date(v) is not None:
            return _parse_date(v)
        raise bad
    if k == "timestamp":
        ts: dt.datetime | None = None
        if isinstance(v, dt.datetime):
            ts = v if v.tzinfo is None else None
        elif isinstance(v, dt.date):
            ts = dt.datetime(v.year, v.month, v.day)
        elif isinstance(v, str):
            ts = _parse_timestamp(v)
        if ts is None:
            raise bad
        if not ts_fits(ts, t):
            # a plain CAST of it would fail only when a row reaches the domain filter
            raise ValueError(f"domain value {v!r} of {where} is not a {t} value ({ts_limits_text(t)})")
        return ts
    raise bad  # pragma: no cover


def _domain_text(v: str, t: SqlType, where: str, bad: ValueError) -> Any:
    """A domain value given as text for a BOOLEAN or numeric column: ``true``/``false`` (any case), or a
    number in plain notation (as ``bounds=["0", "100"]`` is read); anything else is refused as typed."""
    if t.kind == "bool":
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        raise bad
    if not is_plain_number(v):  # float() reads '1_0', 'inf', ' 1' and full-width digits
        raise ValueError(f"domain value {v!r} of {where} is not a {t} value: write it in {PLAIN_FORM}")
    if t.kind == "int":  # exactly: '9007199254740993.0' is not rounded through a double
        d = decimal.Decimal(v)
        return int(d) if d == d.to_integral_value() else float(v)
    return float(v)


def shifted_literal(node: exp.Expression) -> dt.datetime:
    """The instant of a DATE/TIMESTAMP literal shifted by INTERVALs (``DATE '2024-12-31' - INTERVAL 30 DAY``),
    folded as the typer folds it (``Typer._shift_literal``); ValueError if ``node`` is not one."""
    if not (isinstance(node, (exp.Add, exp.Sub)) and any(isinstance(x, exp.Interval) for x in (node.this, node.expression))):
        raise ValueError("not a shifted literal")
    try:
        r = Typer({}).t(node)
    except _Refuse:
        raise ValueError("not a shifted literal") from None
    if not (r.literal and isinstance(r.value, dt.datetime)):  # pragma: no cover - _shift_literal gives one
        raise ValueError("not a shifted literal")
    return r.value


def domain_literal(value: Any, column_type: str) -> exp.Expression:
    """A typed literal for a domain value (checked again here: ValueError if it is not a value
    of the column's type, e.g. for a catalog built by hand rather than by registration)."""
    t = parse_type(column_type)
    return typed_literal(_domain_value(value, t, "the key column"), t)


def post_allow_list_markdown() -> str:
    """The post-processing additions and the aliases as Markdown (docs/expressions.md embeds it)."""
    rows = ["| function | signature | evaluated on | note |", "| --- | --- | --- | --- |"]
    for f in POST_ALLOW_LIST:
        rows.append(f"| {f.name} | {f.signature} | {f.total} | {f.note} |")
    rows += ["", "Other spellings of allow-listed functions (accepted wherever the function is): "
             + ", ".join(f"`{a}` ({b})" for a, b in sorted(ALIASES.items())) + "."]
    return "\n".join(rows)


def allow_list_markdown() -> str:
    """The allow-list as a Markdown table (docs/expressions.md embeds it)."""
    rows = ["| operator / function | signature | evaluation | note |", "| --- | --- | --- | --- |"]
    for f in ALLOW_LIST:
        rows.append(f"| {f.name} | {f.signature} | {f.total} | {f.note} |")
    return "\n".join(rows)
