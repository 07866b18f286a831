"""Spark's spelling of the building blocks of bounded queries, and the Spark form of the typer's output.

Pure: builds sqlglot ASTs in the Spark dialect and executes nothing (the backend is
``dpsql.engine.spark``). Every expression :class:`SparkOps` returns is marked as made for Spark,
so strict rendering (``dpsql.rewrite.render``) refuses it for any other dialect.

Spark runs with ANSI mode on (``spark.sql.ansi.enabled``: an overflow, a bad cast or a division
by zero is an error, never a silently wrapped or NULL value), so every operation that could fail
on some value is guarded explicitly here, as the typer guards it for DuckDB:

* :meth:`SparkOps.try_cast` is Spark's ``TRY_CAST`` (NULL where a value does not convert);
* :meth:`SparkOps.keyed_hash` is the portable hash (``dpsql.engine.portable``): the same BIGINT
  DuckDB computes with ``PortableDuckDBOps``, so with zero noise both engines keep the same rows;
* :meth:`SparkOps.keep_n_per_partition` is ``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY key)
  <= n`` (Spark has no n-row ``ARG_MIN``; ``MIN_BY`` keeps one row);
* :meth:`SparkOps.clamp`, :meth:`SparkOps.typed_literal`, :meth:`SparkOps.epoch_seconds`,
  :meth:`SparkOps.least` as DuckDB's, with Spark's type names (TIMESTAMP is ``TIMESTAMP_NTZ``,
  HUGEINT is ``DECIMAL(38,0)``).

:func:`lower_for_spark` turns the rest of a bounded query -- the shared steps of
``dpsql.rewrite.bound`` and the typer's total expressions (``dpsql.plan.typer``, written with
DuckDB's meaning) -- into Spark SQL with the same meaning, or refuses it. It accepts an
allow-list of node kinds whose meaning is the same on Spark once their operands are typed (the
typer makes every operand's type explicit), rewrites those whose spelling or failure behaviour
differs, and refuses everything else with an ``UnsupportedQueryError`` (free: it happens while
binding, before any charge):

* ``/`` in DOUBLE: Spark raises on a zero divisor in ANSI mode where DuckDB gives inf/NaN, so
  ``a / b`` is ``CASE WHEN b = 0 THEN a * (+-inf by the sign of b) ELSE try_divide(a, b) END``;
* ``% NULLIF(b, 0)`` (the typer's integer remainder) is kept (a NULL divisor is NULL on both);
  any other ``%`` and ``//`` are refused;
* ``x COLLATE "binary"`` (canonical text keys) is ``collate(x, 'UTF8_BINARY')``;
* ``ORDER BY`` without NULLS FIRST/LAST gets DuckDB's default (NULLS LAST for ascending), so
  rows are numbered alike on both engines;
* ``unnest([..])`` of a literal list in a projection (a grouped join's declared key set) is
  ``explode(array(..))``;
* ``LIST(DISTINCT x)`` (the people a join tuple reaches through looked-up keys) is
  ``collect_set(x)``: the same set, perhaps in another order;
* LIKE patterns holding a backslash are refused without an ESCAPE (Spark's LIKE escapes with ``\\`` by
  default, DuckDB's has no default escape; with the typer's ``ESCAPE 'c'`` both read only ``c``);
  ``left``/``right`` only with a positive literal count (their meaning differs for negative counts),
  ``substring`` only with a start >= 1;
* substring searches (``contains``, ``strpos``, the text ``replace`` replaces, the separator of ``split_part``) only
  for a string literal of at most ``MAX_LIKE_PATTERN`` characters, as the typer renders them (a needle taken from a
  row would let the row choose the search's cost); an expression whose Spark form holds more than
  ``MAX_SEARCHES`` of them (with LIKE/ILIKE; some conversions below repeat their operand) is refused, and so is
  one whose Spark form holds more than ``MAX_SPARK_NODES`` nodes;
* date and time functions (``date_part``/``extract``, ``year`` ... ``second``, ``date_trunc``)
  with DuckDB's conventions, from the DATE and the microseconds since 1970 (see the section
  below); decade/century/millennium and strftime/strptime are refused;
* a DOUBLE cast to text is DuckDB's spelling (``dpsql.engine.portable.spark_double_text``); ``upper`` maps 'ß'
  to DuckDB's 'ẞ' first (``lower`` 'İ' and 'Σ'); text that only Spark converts (``_SPARK_ONLY_TEXT``) is NULL;
  floor/ceil of a DECIMAL(p, s) is cast to DuckDB's DECIMAL(p, 0);
* refused on Spark: ``//``, ``sign``, ``ln``/``log10``, ``isinf``, ``round``/``floor``/``ceil``
  over a user's value, casts into types Spark lacks (unsigned integers, TIMESTAMP_S/_MS/_NS).

Where Spark's own functions are total but spell a result differently from DuckDB (``lower`` /
``upper`` on some non-ASCII letters, ``TRY_CAST`` of unusual text such as ``'2024-01-01 x'`` to
DATE, which Spark reads as a date and DuckDB as NULL), the query is total on both engines and
the difference is in the value only; ``docs/spark.md`` lists them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, TypeVar

from sqlglot import exp

from dpsql.engine.base import DeclaredOps, literal_text, power_of_two_factors
from dpsql.engine.portable import portable_hash, portable_uniform, spark_double_text, spark_text_as_duckdb
from dpsql.errors import UnsupportedQueryError
from dpsql.plan.typer import (
    CAST_FROM,
    DIGEST_TYPE,
    MAX_LIKE_PATTERN,
    MAX_SEARCHES,
    NUMERIC_ARG,
    TEMPORAL_ARG,
    TRUNC_LEAST,
)
from dpsql.rewrite.render import DIALECT_MARK

SPARK = "spark"
#: meta key of a cast the lowering made from the typer's (not a building block of SparkOps)
_LOWERED = "dpsql_lowered"

E = TypeVar("E", bound=exp.Expression)


def _mark(e: E) -> E:
    e.meta[DIALECT_MARK] = SPARK
    return e


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=False)


_ARG = "dpsql_spark_arg"


def _arg(e: E) -> E:
    """Tag a caller's argument before it is built into a building block (builders copy their
    arguments, so the tag, kept by copies, is how :func:`_built` finds them again)."""
    e.meta[_ARG] = True
    return e


#: the typer's source types (``CAST_FROM``) that are neither a DATE nor a TIMESTAMP
_NOT_TEMPORAL = frozenset({"BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                           "UINTEGER", "UBIGINT", "FLOAT", "REAL", "DOUBLE", "FLOAT8", "VARCHAR", "TEXT", "STRING",
                           "BLOB", DIGEST_TYPE})
#: expressions whose value is never a DATE or TIMESTAMP, whatever their operands
_NEVER_TEMPORAL: tuple[type[exp.Expression], ...] = (exp.Count, exp.Sum, exp.Length, exp.MD5, exp.DPipe, exp.Concat)


def _never_temporal(cast: exp.Cast) -> bool:
    """Whether the operand of a conversion to text is known (from its form or the typer's ``CAST_FROM``) to be
    no DATE or TIMESTAMP, so that Spark's own text is DuckDB's and :func:`spark_text_as_duckdb` (which repeats
    the operand about 20 times for Spark's analyser to fold away) is not needed: the same value, a smaller plan.
    dpsql's own conversions to text (the exact fixed-point sums, lengths and identities of join tuples) are such."""
    src = str(cast.meta.get(CAST_FROM) or "").upper()
    if src in _NOT_TEMPORAL or src.startswith("DECIMAL"):
        return True
    x = cast.this
    while isinstance(x, exp.Paren):
        x = x.this
    if isinstance(x, exp.Collate) or (isinstance(x, exp.Anonymous) and str(x.this).lower() == "collate"):
        # a collation applies to text alone (Spark's ``collate`` gives a STRING): a canonical text key made text
        # again (its cap, its hash) held the whole rewrite of its own text about 20 times over
        return True
    if isinstance(x, exp.Coalesce):
        return all(_never_temporal(exp.Cast(this=a, to=cast.args["to"])) for a in (x.this, *x.expressions))
    if isinstance(x, (exp.Cast, exp.TryCast)) and isinstance(x.args.get("to"), exp.DataType):
        return not x.args["to"].is_type(*exp.DataType.TEMPORAL_TYPES)
    return isinstance(x, (*_NEVER_TEMPORAL, exp.Literal))


def _built(e: E) -> E:
    """Mark every node of ``e`` as made for Spark except the subtrees of the caller's arguments
    (tagged by :func:`_arg`: those are lowered like any other part of the query)."""
    stack: list[exp.Expression] = [e]
    while stack:
        n = stack.pop()
        if n.meta.pop(_ARG, None):
            continue
        n.meta.setdefault(DIALECT_MARK, SPARK)
        stack.extend(n.iter_expressions())
    return e


_SIMPLE_TYPES = {
    "BOOLEAN": "BOOLEAN", "BOOL": "BOOLEAN", "TINYINT": "TINYINT", "SMALLINT": "SMALLINT", "INTEGER": "INT",
    "INT": "INT", "BIGINT": "BIGINT", "HUGEINT": "DECIMAL(38,0)", "INT128": "DECIMAL(38,0)", "FLOAT": "FLOAT",
    "REAL": "FLOAT", "DOUBLE": "DOUBLE", "VARCHAR": "STRING", "TEXT": "STRING", "STRING": "STRING", "DATE": "DATE",
    "TIMESTAMP": "TIMESTAMP_NTZ", "DATETIME": "TIMESTAMP_NTZ", "TIMESTAMP_NTZ": "TIMESTAMP_NTZ",
}


def spark_type(duck: str) -> exp.DataType:
    """Spark's type for a DuckDB type name; UnsupportedQueryError for a type Spark lacks."""
    t = " ".join(str(duck).strip().upper().split())
    m = re.fullmatch(r"(?:DECIMAL|NUMERIC)\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", t)
    if m:
        return exp.DataType.build(f"DECIMAL({m.group(1)},{m.group(2)})", dialect=SPARK)
    name = _SIMPLE_TYPES.get(t)
    if name is None:
        raise UnsupportedQueryError(f"the type {t} has no equivalent on the Spark engine",
                                    hint="cast to BOOLEAN, INTEGER, BIGINT, DECIMAL(p,s), DOUBLE, VARCHAR, DATE or TIMESTAMP")
    return exp.DataType.build(name, dialect=SPARK)


def _duck_name(to: exp.DataType) -> str:
    return to.sql(dialect="duckdb")


def _double(v: float) -> exp.Expression:
    """An exact DOUBLE constant (Spark reads ``0.5`` as DECIMAL, so every double is a cast text)."""
    return exp.Cast(this=exp.Literal.string(repr(float(v))), to=exp.DataType.build("DOUBLE"))


class SparkOps(DeclaredOps):
    """The building blocks of bounded queries for Spark (see :class:`dpsql.engine.base.SqlOps`)."""

    dialect = SPARK
    #: :meth:`keyed_hash` is SHA-256 of the text (``dpsql.engine.portable``): a key's salted text enters it as it is
    keyed_hash_is_digest = True
    #: a public key domain of at least this many values (text or integer keys) is registered as a temporary view
    #: for the query (``dpsql.rewrite.bound.domain_rows``, ``SparkBackend``), not inlined: from its length only
    domain_relation_min = 1000

    def text_digest(self, text: exp.Expression) -> exp.Expression:
        """``md5(text)``: how Spark's own hashes (:meth:`spread_hash`'s xxhash64, the hash sets of ``collect_set``
        and ``array_distinct`` that COUNT(DISTINCT col) lists with) read a key's salted text
        (``dpsql.rewrite.bound.spread_input``). Spark hashes a string with Murmur3_x86_32 over 4-byte blocks, and
        a block pair whose mixed words differ in bit 18 then bit 31 leaves the state as it found it whatever that
        state (a top-bit difference passes ``*5 + c`` unchanged), so after the 32-character salt one person's
        texts built from such pairs share one hash under every salt
        (``tests/test_adversary_spark_text_hash.py``). The 32-character hex digest of the whole salted text is
        unknown without the salt, and 128 bits keep distinct values apart (the same counts as DuckDB's
        ``MD5_NUMBER``); total on every text (Spark reads a string as its UTF-8 bytes)."""
        return _mark(exp.func("md5", text))

    def keyed_hash(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """The portable keyed hash (``dpsql.engine.portable``): a BIGINT from SHA-256 of the
        salt and the columns' canonical text, identical to ``PortableDuckDBOps``'s."""
        return portable_hash(columns, salt, SPARK)

    def spread_hash(self, values: Sequence[exp.Expression], salt: str) -> exp.Expression:
        """A keyed hash of ``values`` that only spreads a hash table's keys (``dpsql.rewrite.joins.Spread``):
        ``xxhash64(xxhash64(values...) ^ xxhash64(salt))``, DuckDB's construction with Spark's 64-bit hash
        (no text per row; equal values hash alike, and it changes no result, so it need not match DuckDB's)."""
        inner = _mark(exp.func("xxhash64", *values))
        key = _mark(exp.func("xxhash64", exp.Literal.string(salt)))
        return _mark(exp.func("xxhash64", _mark(exp.BitwiseXor(this=inner, expression=key))))

    def keyed_uniform(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """A keyed pseudo-random DOUBLE in (0, 1) from the portable hash (``portable_uniform``),
        identical to ``PortableDuckDBOps.keyed_uniform``."""
        return portable_uniform(columns, salt, SPARK)

    def exponential_clock(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """``-LN(keyed_uniform)``: a keyed Exp(1) draw (LN of a value strictly inside (0, 1))."""
        return _mark(exp.Neg(this=_mark(exp.Ln(this=self.keyed_uniform(columns, salt)))))

    def row_clock(self) -> exp.Expression | None:
        """None: the row choice is reproducible from the salt (the same rows as
        ``PortableDuckDBOps``'s, so zero-noise results equal DuckDB's)."""
        return None

    def bernoulli_keep(self, columns: Sequence[str], salt: str, q: float) -> exp.Expression:
        """The same test as ``DuckDBOps.bernoulli_keep``: the first 52 bits of SHA-256 of
        ``salt:c1:c2...`` (integer columns as text, NULL as 'NULL') below ``floor(q * 2^52)``."""
        if not 0.0 < q <= 1.0:
            raise ValueError(f"q must be in (0, 1], got {q!r}")
        parts: list[exp.Expression] = [exp.Literal.string(salt)]
        for c in columns:
            parts += [exp.Literal.string(":"),
                      exp.func("coalesce", exp.Cast(this=_col(c), to=exp.DataType.build("STRING")), exp.Literal.string("NULL"))]
        digest = exp.Anonymous(this="sha2", expressions=[exp.Anonymous(this="concat", expressions=parts),
                                                         exp.Literal.number(256)])
        head = exp.Anonymous(this="substr", expressions=[digest, exp.Literal.number(1), exp.Literal.number(13)])
        value = exp.Cast(this=exp.Anonymous(this="conv", expressions=[head, exp.Literal.number(16), exp.Literal.number(10)]),
                         to=exp.DataType.build("BIGINT"))
        out = exp.LT(this=value, expression=exp.Literal.number(math.floor(q * 2.0**52)))
        for node in out.walk():
            _mark(node)
        return out

    def keep_n_per_partition(self, relation: exp.Expression, partition: Sequence[str], order_key: exp.Expression,
                             n: int, *, alias: str, output: Sequence[str] | None = None) -> exp.Subquery:
        """``ROW_NUMBER() OVER (PARTITION BY partition ORDER BY key) <= n`` in a subquery, then
        every column but the row number (``* EXCEPT``) or exactly ``output``."""
        relation, order_key = _arg(relation.copy()), _arg(order_key.copy())
        rn = exp.Window(this=exp.RowNumber(), partition_by=[_col(p) for p in partition],
                        order=exp.Order(expressions=[exp.Ordered(this=order_key, nulls_first=False)]))
        numbered = exp.select("*", exp.alias_(rn, "__rn")).from_(relation).subquery(f"{alias}__n")
        cond = exp.LTE(this=_col("__rn"), expression=exp.Literal.number(int(n)))
        if output is None:
            star = exp.Star(**{"except_": [_col("__rn")]})
            kept = exp.select(star).from_(numbered).where(cond)
        else:
            kept = exp.select(*[_col(f) for f in output]).from_(numbered).where(cond)
        return _built(kept.subquery(alias))

    def clamp(self, value: exp.Expression, lo: float, hi: float, *, shift: float = 0.0) -> exp.Expression:
        """``CASE WHEN v IS NULL THEN NULL ELSE LEAST(GREATEST(v, lo), hi) [- shift] END``; Spark's
        GREATEST/LEAST skip NULL and order NaN above every number, as DuckDB's."""
        inner, value = _arg(value.copy()), _arg(value.copy())
        e: exp.Expression = exp.Least(this=exp.Greatest(this=inner, expressions=[_double(lo)]), expressions=[_double(hi)])
        if shift:
            e = exp.Sub(this=e, expression=_double(shift))
        out = exp.Case(ifs=[exp.If(this=exp.Is(this=value, expression=exp.Null()), true=exp.Null())], default=e)
        return _built(out)

    def try_cast(self, value: exp.Expression, to: str) -> exp.Expression:
        """Spark's ``TRY_CAST(value AS to)``: NULL where the value does not convert (even in ANSI mode)."""
        return _built(exp.TryCast(this=_arg(value.copy()), to=spark_type(to), safe=True))

    def typed_literal(self, value: Any, to: str) -> exp.Expression:
        """``CAST('<text>' AS to)`` in Spark's type names (exact for numbers of any size, ISO
        dates and timestamps; text is quoted by the renderer, never parsed as SQL)."""
        typ = spark_type(to)
        lit: exp.Expression
        if value is None:
            lit = exp.Null()
        elif isinstance(value, bool):
            return _mark(exp.Boolean(this=value))
        elif isinstance(value, str):
            return _mark(exp.Literal.string(value))
        else:
            lit = exp.Literal.string(literal_text(value))
        return _built(exp.Cast(this=lit, to=typ))

    def epoch_seconds(self, value: exp.Expression) -> exp.Expression:
        """``unix_micros(CAST(ts AS TIMESTAMP)) / 1e6`` in DOUBLE (the session time zone is UTC,
        so a TIMESTAMP_NTZ converts exactly), with the fraction, like DuckDB's ``EPOCH``."""
        micros = exp.Cast(this=exp.Anonymous(this="unix_micros", expressions=[
            exp.Cast(this=_arg(value.copy()), to=exp.DataType.build("TIMESTAMP_LTZ", dialect=SPARK))]),
            to=exp.DataType.build("DOUBLE"))
        return _built(exp.Div(this=micros, expression=_double(1e6)))

    def epoch_micros(self, value: exp.Expression) -> exp.Expression:
        """``unix_micros(CAST(ts AS TIMESTAMP_LTZ))``: microseconds since 1970 as BIGINT (UTC session)."""
        return _built(exp.Anonymous(this="unix_micros", expressions=[
            exp.Cast(this=_arg(value.copy()), to=exp.DataType.build("TIMESTAMP_LTZ", dialect=SPARK))]))

    def least(self, a: exp.Expression, b: exp.Expression) -> exp.Expression:
        return _built(exp.Least(this=_arg(a.copy()), expressions=[_arg(b.copy())]))

    def fixed_point(self, value: exp.Expression, scale: int) -> exp.Expression:
        """``CAST(value * 2^scale AS BIGINT)``: Spark's cast of a DOUBLE truncates toward zero."""
        e: exp.Expression = _arg(value.copy())
        for f in power_of_two_factors(scale):
            e = exp.Mul(this=e, expression=_double(2.0**f))
        return _built(exp.Cast(this=e, to=spark_type("BIGINT")))

    def scaled_integer(self, value: exp.Expression, scale: int) -> exp.Expression:
        """``CAST(v - v % 1 AS DECIMAL(38,0)) * 10^s + CAST(v % 1 * 10^s AS DECIMAL(38,0))`` (scale 0: ``TRY_CAST(v AS
        DECIMAL(38,0))``), exact under Spark's DECIMAL precision rules: ``v % 1`` of a DECIMAL(p, s) is a
        DECIMAL(s + 1, s) (a difference ``v - TRUNC(v)`` would be a DECIMAL(p + 1, s), which Spark rounds to fewer
        digits of scale when p = 38); ``v - v % 1`` (TRUNC(v), an integer: rounding its scale changes nothing)
        keeps p - s whole digits; ``v % 1 * 10^s`` (an integer below 10^s) keeps at least 22; |v| * 10^s < 10^p
        fits DECIMAL(38, 0). Nothing overflows, so nothing raises in ANSI mode."""
        if scale == 0:
            return self.try_cast(value, "HUGEINT")
        dec = spark_type("DECIMAL(38,0)")
        frac = exp.Mod(this=exp.Paren(this=_arg(value.copy())), expression=exp.Cast(
            this=exp.Literal.string("1"), to=spark_type("DECIMAL(1,0)")))
        whole = exp.Sub(this=_arg(value.copy()), expression=frac.copy())
        scaled = exp.Mul(this=exp.Paren(this=frac), expression=exp.Cast(
            this=exp.Literal.string(str(10**scale)), to=spark_type(f"DECIMAL({scale + 1},0)")))
        return _built(exp.Add(
            this=exp.Mul(this=exp.Cast(this=exp.Paren(this=whole), to=dec),
                         expression=exp.Cast(this=exp.Literal.string(str(10**scale)), to=dec.copy())),
            expression=exp.Cast(this=scaled, to=dec.copy())))

    def exact_sum(self, value: exp.Expression) -> exp.Expression:
        """``SUM(CAST(value AS DECIMAL(38, 0)))``: exact to 10^38 (Spark's BIGINT sum overflows)."""
        return _built(exp.Sum(this=exp.Cast(this=_arg(value.copy()), to=spark_type("DECIMAL(38, 0)"))))

    def from_fixed_point(self, total: exp.Expression, scale: int) -> exp.Expression:
        e: exp.Expression = exp.Cast(this=_arg(total.copy()), to=spark_type("DOUBLE"))
        for f in power_of_two_factors(scale):
            e = exp.Mul(this=e, expression=_double(2.0**-f))
        return _built(e)


# -- the Spark form of a bounded query ---------------------------------------------------------------


_SAME: tuple[type[exp.Expression], ...] = (
    # query structure (built by dpsql.rewrite.bound)
    exp.Select, exp.From, exp.Where, exp.Group, exp.Having, exp.Subquery, exp.Table, exp.TableAlias, exp.Identifier,
    exp.Column, exp.Alias, exp.Star, exp.Paren, exp.Window, exp.RowNumber, exp.Order, exp.Distinct, exp.Count,
    exp.Sum, exp.Describe, exp.Exists, exp.Join, exp.With, exp.CTE, exp.Union,
    # the typer's total expressions whose meaning is the same on Spark for typed operands
    exp.Literal, exp.Boolean, exp.Null, exp.And, exp.Or, exp.Not, exp.Is, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT,
    exp.LTE, exp.NullSafeEQ, exp.Between, exp.In, exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least,
    exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Abs, exp.Sqrt, exp.IsNan, exp.Lower, exp.Upper, exp.Length, exp.Trim,
    exp.Reverse, exp.StartsWith, exp.EndsWith, exp.Contains, exp.StrPosition, exp.DPipe, exp.Concat,
    # (ConcatWs is a Concat; replace with literal texts, split_part with a non-empty literal separator and a
    # literal part number other than 0: the typer's forms, the same meaning on Spark)
    exp.Replace, exp.SplitPart,
    exp.DataType, exp.DataTypeParam, exp.Var,
    exp.MD5,  # a long IN list (dpsql.plan.typer._digest): lower-case hex of the UTF-8 bytes on both
    exp.SHA2,  # a field of COUNT(DISTINCT (a, b)) (dpsql.plan.typer._row_text): SHA-256, lower-case hex, on both
)


# -- date and time functions -------------------------------------------------------------------------
#
# The typer's date functions (``date_part``, ``year`` ..., ``date_trunc``) carry DuckDB's meaning
# and the kind of their argument (``TEMPORAL_ARG``: DATE or TIMESTAMP, which Spark reads as
# TIMESTAMP_NTZ). On Spark, calendar parts are read from the DATE (a TIMESTAMP_NTZ cast to DATE
# never fails), time-of-day parts from the microseconds since 1970 (``unix_micros`` of the value
# as TIMESTAMP_LTZ: exact, the session time zone is UTC) with floor arithmetic (``pmod``), so no
# value makes them fail. Conventions as DuckDB's: astronomical years (1 BC is year 0), ISO
# weeks and ISO years, dayofweek Sunday = 0, isodow Monday = 1. DuckDB's infinite dates and
# timestamps (which Spark reads as far-away finite values) are NULL, as DuckDB's date parts of
# them are; date_trunc of them is NULL on Spark where DuckDB keeps +-infinity.

_DAY_US = 86_400_000_000
_TIME_UNIT_US = {"microsecond": 1, "millisecond": 1_000, "second": 1_000_000, "minute": 60_000_000,
                 "hour": 3_600_000_000, "day": _DAY_US}
#: TRUNC_LEAST (290308-01-01 BC, the astronomical year -290307) in microseconds since 1970, proleptic Gregorian
TRUNC_LEAST_US = -9_223_371_158_400_000_000
_INF_US = 2**63 - 1  #: DuckDB's +-infinity TIMESTAMP
_INF_DAYS = 2**31 - 1  #: DuckDB's +-infinity DATE
_PART_ALIAS = {"years": "year", "months": "month", "days": "day", "hours": "hour", "minutes": "minute",
               "seconds": "second", "milliseconds": "millisecond", "microseconds": "microsecond", "dow": "dayofweek",
               "weekday": "dayofweek", "doy": "dayofyear", "weekofyear": "week"}
_FN_PART = {exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.Quarter: "quarter", exp.DayOfWeek: "dayofweek",
            exp.DayOfYear: "dayofyear", exp.Week: "week"}
for _name in ("Hour", "Minute", "Second"):
    if hasattr(exp, _name):
        _FN_PART[getattr(exp, _name)] = _name.lower()
_TRUNC_DATE_FORMAT = {"month": "MM", "quarter": "QUARTER", "year": "YEAR"}


def _fn(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


def _n(v: int) -> exp.Expression:
    return exp.Neg(this=exp.Literal.number(-v)) if v < 0 else exp.Literal.number(v)


def _micros(x: exp.Expression) -> exp.Expression:
    return _fn("unix_micros", exp.Cast(this=x.copy(), to=exp.DataType.build("TIMESTAMP_LTZ", dialect=SPARK)))


def _as_ntz(micros: exp.Expression) -> exp.Expression:
    return exp.Cast(this=_fn("timestamp_micros", micros), to=spark_type("TIMESTAMP"))


def _infinite(x: exp.Expression, kind: str) -> exp.Expression:
    if kind == "date":
        return exp.In(this=_fn("unix_date", x.copy()), expressions=[_n(_INF_DAYS), _n(-_INF_DAYS)])
    return exp.In(this=_micros(x), expressions=[_n(_INF_US), _n(-_INF_US)])


def _finite(x: exp.Expression, kind: str, value: exp.Expression) -> exp.Expression:
    return exp.Case(ifs=[exp.If(this=_infinite(x, kind), true=exp.Null())], default=value)


def _pmod(a: exp.Expression, b: int) -> exp.Expression:
    return _fn("pmod", a, _n(b))


def _date_part(unit: str, x: exp.Expression, kind: str, node: exp.Expression) -> exp.Expression:
    """DuckDB's ``date_part(unit, x)`` (BIGINT; DOUBLE for epoch) in Spark functions."""
    unit = _PART_ALIAS.get(unit, unit)
    d = x.copy() if kind == "date" else exp.Cast(this=x.copy(), to=spark_type("DATE"))
    calendar = {
        "year": lambda: _fn("year", d.copy()), "month": lambda: _fn("month", d.copy()),
        "day": lambda: _fn("dayofmonth", d.copy()), "quarter": lambda: _fn("quarter", d.copy()),
        "dayofyear": lambda: _fn("dayofyear", d.copy()), "week": lambda: _fn("weekofyear", d.copy()),
        "dayofweek": lambda: exp.Sub(this=_fn("dayofweek", d.copy()), expression=_n(1)),
        "isodow": lambda: exp.Add(this=_pmod(exp.Add(this=_fn("dayofweek", d.copy()), expression=_n(5)), 7),
                                  expression=_n(1)),
        "isoyear": lambda: _fn("date_part", exp.Literal.string("YEAROFWEEK"), d.copy()),
    }
    value: exp.Expression
    if unit in calendar:
        value = calendar[unit]()
    elif unit == "yearweek":
        iy, wk = calendar["isoyear"](), calendar["week"]()
        hundreds = exp.Mul(this=exp.Cast(this=iy.copy(), to=spark_type("BIGINT")), expression=_n(100))
        value = exp.Case(ifs=[exp.If(this=exp.GT(this=iy, expression=_n(0)), true=exp.Add(this=hundreds.copy(), expression=wk.copy()))],
                         default=exp.Sub(this=hundreds, expression=wk))
    elif unit == "epoch":
        if kind == "date":
            secs = exp.Mul(this=exp.Cast(this=_fn("unix_date", d), to=spark_type("DOUBLE")), expression=_double(86400.0))
        else:
            secs = exp.Div(this=exp.Cast(this=_micros(x), to=spark_type("DOUBLE")), expression=_double(1e6))
        return _finite(x, kind, secs)
    elif unit in ("hour", "minute", "second", "millisecond", "microsecond"):
        if kind == "date":
            value = exp.Case(ifs=[exp.If(this=exp.Is(this=d, expression=exp.Null()), true=exp.Null())], default=_n(0))
        else:
            within, per = {"hour": (_DAY_US, 3_600_000_000), "minute": (3_600_000_000, 60_000_000),
                           "second": (60_000_000, 1_000_000), "millisecond": (60_000_000, 1_000),
                           "microsecond": (60_000_000, 1)}[unit]
            value = _pmod(_micros(x), within)
            if per != 1:
                value = exp.IntDiv(this=value, expression=_n(per))
    else:
        raise _refuse(node, f"date part '{unit}'")
    return _finite(x, kind, exp.Cast(this=value, to=spark_type("BIGINT")))


def _date_trunc(unit: str, x: exp.Expression, node: exp.Expression) -> exp.Expression:
    """DuckDB's ``date_trunc(unit, x)`` of a TIMESTAMP (the typer reads DATEs as TIMESTAMP and
    NULLs instants below ``TRUNC_LEAST``), as a TIMESTAMP_NTZ: time units by floor arithmetic on
    the microseconds (ISO weeks start on Monday; 1970-01-01 was a Thursday), calendar units by
    Spark's ``trunc`` of the DATE."""
    m = _micros(x)
    value: exp.Expression
    if unit in _TIME_UNIT_US:
        value = _as_ntz(exp.Sub(this=m.copy(), expression=_pmod(m, _TIME_UNIT_US[unit])))
    elif unit == "week":  # back to Monday: pmod(pmod(m, 7 days) + 3 days, 7 days), which cannot overflow
        shifted = exp.Add(this=_pmod(m.copy(), 7 * _DAY_US), expression=_n(3 * _DAY_US))
        value = _as_ntz(exp.Sub(this=m.copy(), expression=_pmod(shifted, 7 * _DAY_US)))
    elif unit in _TRUNC_DATE_FORMAT:
        day = exp.Cast(this=x.copy(), to=spark_type("DATE"))
        value = exp.Cast(this=_fn("trunc", day, exp.Literal.string(_TRUNC_DATE_FORMAT[unit])), to=spark_type("TIMESTAMP"))
    else:
        raise _refuse(node, f"date_trunc to '{unit}'")
    return _finite(x, "timestamp", value)


def _literal_text(node: exp.Expression) -> str | None:
    return str(node.this) if isinstance(node, exp.Literal) and node.is_string else None


def _temporal_lowered(node: exp.Expression) -> exp.Expression | None:
    """The Spark form of a typed date function, or None if ``node`` is none."""
    kind = node.meta.get(TEMPORAL_ARG)
    if isinstance(node, exp.Anonymous) and str(node.this).lower() in ("strftime", "try_strptime", "strptime"):
        raise _refuse(node, f"{str(node.this).lower()}() (its format language differs between DuckDB and Spark)")
    if kind not in ("date", "timestamp"):
        return None
    if isinstance(node, exp.Anonymous) and str(node.this).lower() in ("date_part", "date_trunc") \
            and len(node.expressions) == 2 and _literal_text(node.expressions[0]) is not None:
        unit = str(_literal_text(node.expressions[0])).lower()
        if str(node.this).lower() == "date_trunc":
            return _date_trunc(unit, node.expressions[1], node)
        return _date_part(unit, node.expressions[1], kind, node)
    part = _FN_PART.get(type(node))
    if part is not None and isinstance(node.this, exp.Expression):
        return _date_part(part, node.this, kind, node)
    return None


def _shown(node: exp.Expression) -> str:
    """``node`` named as SQL writes it ('isinf()', 'the operator //'), not by sqlglot's name (IS_INF, INTDIV)."""
    if isinstance(node, exp.Log) and isinstance(node.this, exp.Literal) and str(node.this.this) in ("10", "2"):
        return f"log{node.this.this}()"
    if isinstance(node, exp.Func):
        return node.sql(dialect="duckdb").split("(", 1)[0].lower() + "()"
    if isinstance(node, exp.Binary):
        text, left, right = (e.sql(dialect="duckdb") for e in (node, node.left, node.right))
        if text.startswith(left) and text.endswith(right) and len(text) > len(left) + len(right):
            return "the operator " + text[len(left):len(text) - len(right)].strip()
    return type(node).__name__.upper()


def _refuse(node: exp.Expression, what: str | None = None) -> UnsupportedQueryError:
    name = what or _shown(node)
    return UnsupportedQueryError(
        f"{name} is not supported on the Spark engine (its meaning or failure behaviour differs from DuckDB's); "
        "nothing was run or charged",
        hint="rewrite the query without it, or run it on the DuckDB engine (docs/spark.md lists what Spark supports)",
    )


def _positive_int_literal(e: exp.Expression | None) -> bool:
    return isinstance(e, exp.Literal) and not e.is_string and re.fullmatch(r"\d+", str(e.this)) is not None \
        and int(str(e.this)) >= 1


_INT_TYPES = ("TINYINT", "SMALLINT", "INT", "INTEGER", "BIGINT")


def _constant_int(e: exp.Expression | None) -> int | None:
    """The value of an integer expression built from literals only (integer literals, casts to
    integer types, unary minus, parentheses, GREATEST/LEAST: the typer's spelling of a literal
    count or divisor), else None."""
    if isinstance(e, exp.Paren):
        return _constant_int(e.this)
    if isinstance(e, exp.Literal) and not e.is_string:
        return int(str(e.this)) if re.fullmatch(r"-?\d+", str(e.this)) else None
    if isinstance(e, exp.Neg):
        v = _constant_int(e.this)
        return None if v is None else -v
    if isinstance(e, (exp.Cast, exp.TryCast)) and isinstance(e.args.get("to"), exp.DataType) \
            and e.args["to"].sql(dialect=SPARK).upper() in _INT_TYPES:
        return _constant_int(e.this)
    if isinstance(e, (exp.Greatest, exp.Least)):
        vals = [_constant_int(x) for x in [e.this, *e.expressions]]
        if any(v is None for v in vals):
            return None
        return max(vals) if isinstance(e, exp.Greatest) else min(vals)  # type: ignore[type-var]
    return None


def _outputs(select: exp.Expression) -> list[str] | None:
    """The output column names of a subquery's SELECT, if known from the AST alone."""
    if isinstance(select, exp.Subquery):
        select = select.this
    if not isinstance(select, exp.Select):
        return None
    out: list[str] = []
    for p in select.expressions:
        if isinstance(p, exp.Star):
            src = select.args.get("from_")
            inner = _outputs(src.this) if src is not None and isinstance(src.this, exp.Subquery) else None
            if inner is None:
                return None
            excluded = {c.name for c in (p.args.get("except_") or [])}
            out.extend(c for c in inner if c not in excluded)
        elif isinstance(p, (exp.Alias, exp.Column)):
            out.append(p.alias_or_name)
        else:
            return None
    return out


#: substring searches and the argument each searches for (the typer's forms: a short string literal)
_NEEDLE: dict[type[exp.Expression], str] = {exp.Contains: "expression", exp.StrPosition: "substr",
                                            exp.Replace: "expression", exp.SplitPart: "delimiter"}


def _lower_node(node: exp.Expression) -> exp.Expression:
    made_for = node.meta.get(DIALECT_MARK)
    if made_for is not None:
        return node  # a building block: Spark's own, or refused by strict rendering
    if isinstance(node, exp.Window) and isinstance(node.this, exp.RowNumber) and node.args.get("order") is None:
        # DuckDB numbers rows in any order; Spark requires an ORDER BY (a constant: any order)
        node.set("order", exp.Order(expressions=[exp.Ordered(this=exp.Literal.number(1))]))
        return node
    if isinstance(node, exp.Ordered):
        if not node.args.get("desc") and node.args.get("nulls_first") is None:
            node.set("nulls_first", False)  # DuckDB's default: NULLS LAST
        return node
    if isinstance(node, exp.Select):
        # ``SELECT *, x AS c`` over a relation that already has ``c``: DuckDB resolves a later ``c``
        # to the first one, Spark refuses it as ambiguous; the new column gets another name
        stars = [p for p in node.expressions if isinstance(p, exp.Star)]
        src = node.args.get("from_")
        if stars and src is not None and isinstance(src.this, exp.Subquery):
            inner = _outputs(src.this)
            if inner is not None:
                for p in node.expressions:
                    if isinstance(p, exp.Alias) and p.alias in inner:
                        p.set("alias", exp.to_identifier(p.alias + "__shadowed"))
        return node
    temporal = _temporal_lowered(node)
    if temporal is not None:
        return temporal
    if isinstance(node, (exp.Cast, exp.TryCast)):
        to = node.args.get("to")
        if not isinstance(to, exp.DataType):
            raise _refuse(node, "a CAST")
        text = _literal_text(node.this)
        if text is not None and to.is_type(*exp.DataType.TEMPORAL_TYPES):
            if text == TRUNC_LEAST:  # the typer's date_trunc guard: the least instant it truncates
                return _as_ntz(_n(TRUNC_LEAST_US))
            if text.strip().lower() == "-infinity":  # Spark has no infinite instants: matches no value
                return exp.Cast(this=exp.Null(), to=spark_type(_duck_name(to)))
            if "(bc)" in text.lower() or "infinity" in text.lower():
                raise _refuse(node, f"the date/time literal '{text}'")
        new: exp.Expression = (exp.TryCast(this=node.this, to=spark_type(_duck_name(to)), safe=True)
                               if isinstance(node, exp.TryCast) else exp.Cast(this=node.this, to=spark_type(_duck_name(to))))
        new.meta[DIALECT_MARK] = SPARK
        new.meta[_LOWERED] = True
        rounded = _rounded_conversion(node, new)
        if rounded is not None:
            return rounded
        refused_text = _text_spark_alone_reads(node)
        if refused_text is not None:
            # text only Spark converts is NULL, as on DuckDB (the same query gives the same keys)
            return exp.Case(ifs=[exp.If(this=exp.RegexpLike(this=node.this.copy(), expression=exp.Literal.string(refused_text)),
                                        true=exp.Cast(this=exp.Null(), to=new.args["to"].copy()))], default=new)
        if new.args["to"].is_type(exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR) \
                and str(node.meta.get(CAST_FROM) or "").upper() in _FLOATS:
            # a DOUBLE (or REAL) as text: DuckDB's spelling (shortest digits, '1e+23'), where Java 17 writes
            # '9.999999999999999E22'
            real = str(node.meta.get(CAST_FROM)).upper() in ("FLOAT", "REAL", "FLOAT4")
            if real:  # (the text of its DOUBLE: Java's text of a REAL is not always its nearest 9 digits)
                new.set("this", exp.Cast(this=new.this, to=spark_type("DOUBLE")))
            return _built(spark_double_text(_arg(new), real))
        if new.args["to"].is_type(exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR) and not _never_temporal(node):
            # a DATE or TIMESTAMP as text: DuckDB's spelling outside years 1 .. 9999 (a released key)
            return _built(spark_text_as_duckdb(_arg(node.this.copy()), _arg(new)))
        return new
    if isinstance(node, exp.Div):
        a, b = node.this, node.expression
        inf = exp.Case(ifs=[exp.If(this=exp.Like(this=exp.Cast(this=b.copy(), to=exp.DataType.build("STRING", dialect=SPARK)),
                                                 expression=exp.Literal.string("-%")),
                                   true=_double(-math.inf))], default=_double(math.inf))
        by_zero = exp.Mul(this=a.copy(), expression=inf)
        return exp.Case(ifs=[exp.If(this=exp.EQ(this=b.copy(), expression=_double(0.0)), true=by_zero)],
                        default=exp.Anonymous(this="try_divide", expressions=[a, b]))
    if isinstance(node, exp.Mod):
        if isinstance(node.expression, exp.Nullif):
            return node
        if _constant_int(node.expression) not in (None, 0, -1):
            # the typer's integer remainder by a literal other than 0 and -1: it cannot fail, and
            # Spark's sign convention is DuckDB's (the dividend's)
            return node
        raise _refuse(node, "% on DOUBLE or FLOAT")
    if isinstance(node, exp.Collate):
        coll = node.expression
        if isinstance(coll, (exp.Identifier, exp.Var, exp.Column)) and coll.name.lower() == "binary":
            return exp.Anonymous(this="collate", expressions=[node.this, exp.Literal.string("UTF8_BINARY")])
        raise _refuse(node, "COLLATE")
    if isinstance(node, (exp.Like, exp.ILike)):
        pat = node.expression
        if not (isinstance(pat, exp.Literal) and pat.is_string):
            raise _refuse(node, "a LIKE pattern that is not a literal")
        if isinstance(node.parent, exp.Escape):
            return node  # lowered with its Escape, below
        if "\\" in str(pat.this):
            # Spark's LIKE escapes with a backslash by default, DuckDB's has no default escape (with an
            # explicit ESCAPE both engines read only that character as the escape)
            raise _refuse(node, "a LIKE pattern with a backslash (write it with ESCAPE '!' to match a backslash on Spark)")
        return _like_lowered(node, None, node)
    needle_key = _NEEDLE.get(type(node))
    if needle_key is not None:
        needle = node.args.get(needle_key)
        if not (isinstance(needle, exp.Literal) and needle.is_string and len(str(needle.this)) <= MAX_LIKE_PATTERN):
            raise _refuse(node, f"{node.sql_name().lower()}() searching for anything but a string literal of at most "
                                f"{MAX_LIKE_PATTERN} characters")
        return node
    if isinstance(node, exp.DateFromParts):
        # the typer's make_date, reached only for a valid date of years 1..9999 (its CASE guard): Spark's
        # make_date takes INT arguments (ANSI mode casts no BIGINT down implicitly), which these values fit
        return _fn("make_date", *(exp.Cast(this=node.args[k], to=spark_type("INTEGER")) for k in ("year", "month", "day")))
    if isinstance(node, exp.Escape):
        esc = _literal_text(node.expression)
        if not isinstance(node.this, (exp.Like, exp.ILike)) or esc is None or len(esc) != 1:
            raise _refuse(node, "this ESCAPE")
        # the typer's escape (one ASCII character, not a letter, preceding only %, _ or itself): Spark's meaning
        return _like_lowered(node.this, esc, node)
    if isinstance(node, (exp.Left, exp.Right)):
        if _positive_int_literal(node.expression):
            return node
        count = _constant_int(node.expression)
        if count is not None and count >= 1:
            # the typer clamps the count (LEAST(GREATEST(CAST(n AS BIGINT), ..), ..)); Spark's left/right
            # take an INT: the folded literal
            node.set("expression", exp.Literal.number(count))
            return node
        raise _refuse(node, f"{type(node).__name__.lower()}() with a count that is not a positive literal")
    if isinstance(node, exp.Substring):
        if _positive_int_literal(node.args.get("start")) and (
                node.args.get("length") is None or _positive_int_literal(node.args.get("length"))
                or (isinstance(node.args.get("length"), exp.Literal) and str(node.args["length"].this) == "0")):
            return node
        raise _refuse(node, "substring() with a start below 1 or a negative length")
    decimal_sign = _decimal_sign_lowered(node)
    if decimal_sign is not None:
        return decimal_sign
    if isinstance(node, (exp.Floor, exp.Ceil)) and not node.args.get("decimals"):
        parent = node.parent
        if isinstance(node, exp.Floor) and isinstance(parent, exp.TryCast) and parent.meta.get(DIALECT_MARK) == SPARK \
                and parent.args["to"].sql(dialect=SPARK).upper() == "BIGINT":
            return node  # a histogram bin number: FLOOR then TRY_CAST to BIGINT, over in-range values
        dec = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", str(node.meta.get(NUMERIC_ARG) or "").upper().replace(" ", ""))
        if dec:
            # of a DECIMAL(p, s): DuckDB's is DECIMAL(p, 0), Spark's DECIMAL(p - s + 1, 0), the same value (exact)
            node.meta[DIALECT_MARK] = SPARK
            return exp.Cast(this=node, to=spark_type(f"DECIMAL({dec.group(1)},0)"))
        # DuckDB's floor/ceil of a DOUBLE is a DOUBLE; Spark's is a BIGINT (saturating, NaN -> 0):
        # beyond 2^52 every double is whole already, so floor(x) is x there (inf and NaN too).
        # The test reads x as a DOUBLE: Spark's abs() of a DECIMAL with more than 34 digits rounds
        # and can raise (NUMERIC_VALUE_OUT_OF_RANGE), a cast of a DECIMAL to DOUBLE never does
        x = node.this
        as_double = exp.Cast(this=x.copy(), to=exp.DataType.build("DOUBLE"))
        big = exp.Or(this=exp.func("isnan", as_double.copy()),
                     expression=exp.GTE(this=exp.Abs(this=as_double.copy()), expression=_double(2.0**52)))
        whole = exp.Cast(this=type(node)(this=x.copy()), to=exp.DataType.build("DOUBLE"))
        whole.meta[DIALECT_MARK] = SPARK
        out = exp.Case(ifs=[exp.If(this=big, true=as_double)], default=whole)
        return out
    if isinstance(node, exp.Floor):
        parent = node.parent
        if isinstance(parent, exp.TryCast) and parent.meta.get(DIALECT_MARK) == SPARK and parent.args["to"].sql(dialect=SPARK).upper() == "BIGINT":
            return node  # a histogram bin number: FLOOR then TRY_CAST to BIGINT, over in-range values
        raise _refuse(node, "floor() over a value")
    if isinstance(node, exp.List) and len(node.expressions) == 1 and isinstance(node.expressions[0], exp.Distinct) \
            and len(node.expressions[0].expressions) == 1:
        # DuckDB's LIST(DISTINCT x) (a join tuple's looked-up people): Spark's collect_set, the
        # same set (its order may differ: the truncation reads it as a set; NULLs are dropped by
        # both engines' users, never produced by dpsql.rewrite.joins)
        return exp.Anonymous(this="collect_set", expressions=[node.expressions[0].expressions[0]])
    if isinstance(node, exp.Array) and isinstance(node.parent, exp.Unnest):
        return node  # checked with its Unnest, below
    if isinstance(node, exp.Unnest) and len(node.expressions) == 1 and isinstance(node.expressions[0], exp.Array) \
            and isinstance(node.args.get("alias"), exp.Identifier) and not node.args.get("offset") \
            and isinstance(node.parent, exp.Select) and node.arg_key == "expressions":
        # a declared key set (``dpsql.rewrite.join_groups``): DuckDB's ``unnest([..]) AS k`` in a
        # projection is Spark's ``explode(array(..)) AS k``, one row per element on both
        return exp.alias_(exp.Explode(this=node.expressions[0]), node.args["alias"].copy())
    lowered_list = _list_lowered(node)
    if lowered_list is not None:
        return lowered_list
    if isinstance(node, exp.IsNan):
        # DuckDB's isnan(NULL) is NULL, Spark's is false: NULL in, NULL out
        return exp.Case(ifs=[exp.If(this=exp.Is(this=node.this.copy(), expression=exp.Null()), true=exp.Null())],
                        default=node)
    if isinstance(node, exp.Interval) and isinstance(node.parent, exp.Add) and isinstance(node.this, exp.Literal) \
            and isinstance(node.args.get("unit"), exp.Var) and node.args["unit"].name in ("MONTH", "DAY", "SECOND"):
        # the typer's shift of a TIMESTAMP in years 1..9999 that stays there (``Typer._shift_value``):
        # Spark's TIMESTAMP_NTZ + INTERVAL 'n' MONTH / DAY / SECOND is DuckDB's (months clamp the day
        # to the month's end on both)
        return node
    if isinstance(node, exp.Lower) and not node.meta.get(_LOWERED):
        # DuckDB lowers by the simple case mapping ('İ' is 'i', 'Σ' is 'σ' everywhere); Java's full
        # mapping, Spark's, makes 'İ' two code points ('i̇') and a word's final 'Σ' 'ς': those two
        # letters are mapped first, so a released key or a filter is the same on both engines
        node.meta[_LOWERED] = True
        node.set("this", exp.Anonymous(this="translate", expressions=[
            node.this, exp.Literal.string("\u0130\u03a3"), exp.Literal.string("i\u03c3")]))
        return node
    if isinstance(node, exp.Upper) and not node.meta.get(_LOWERED):
        # DuckDB upper-cases 'ß' to 'ẞ' (one letter, which Java leaves as it is), Java's full mapping, Spark's, to
        # 'SS': mapped first, so a released key or a filter is the same on both engines. (The other letters whose
        # full mapping expands, 'ŉ', 'ǰ', 'ﬁ', Greek with ypogegrammeni, stay apart: docs/spark.md)
        node.meta[_LOWERED] = True
        node.set("this", exp.Anonymous(this="translate", expressions=[
            node.this, exp.Literal.string("\u00df"), exp.Literal.string("\u1e9e")]))
        return node
    if isinstance(node, exp.Max) and isinstance(node.this, exp.Column) and not node.expressions:
        # MAX of a bounded query's own integer column (caps advice: a person's most rows in one
        # group, a COUNT): the same value on both engines
        return node
    if isinstance(node, _SAME):
        return node
    if isinstance(node, exp.DateDiff):  # the typer's rendering of DATE - DATE (date_diff itself is off the allow-list)
        raise _refuse(node, "DATE - DATE (a number of days)")
    raise _refuse(node)


def _simple_lower(text: exp.Expression) -> exp.Expression:
    """Spark's ``lower`` of ``text`` with DuckDB's simple case mapping of 'İ' and 'Σ' (as ``lower`` is lowered)."""
    out = exp.Lower(this=exp.Anonymous(this="translate", expressions=[
        text, exp.Literal.string("\u0130\u03a3"), exp.Literal.string("i\u03c3")]))
    out.meta[_LOWERED] = True
    return out


def _like_lowered(like: exp.Expression, esc: str | None, whole: exp.Expression) -> exp.Expression:
    r"""``whole``, the typer's ``x [I]LIKE 'pattern'`` (``like``) or that with ``ESCAPE esc``, in a Spark form whose
    cost per row is linear in the text. Spark matches a pattern its optimizer does not simplify with a Java regular
    expression, each '%' a backtracking ``.*``: with k of them up to n^k steps on a crafted text of n characters
    (one row of 'a' * 200 took 54 s under '%a%a%a%a%b', DuckDB milliseconds). A pattern with two or more '%' is
    therefore matched by ``RLIKE``: the pattern's parts between its runs of '%', each of fixed length ('_' is any
    one character), the first at the start, the last at the end, each other one at its first occurrence after the
    one before, found once (an atomic group, never tried again), which is a match exactly when the pattern
    matches.

    ILIKE is DuckDB's: the text and the pattern lower-cased by DuckDB's simple case mapping, then LIKE. Spark's own
    ILIKE lower-cases both by Java's full mapping, where 'İ' is two code points and a final 'Σ' is 'ς' ('ib' ILIKE
    'İ%' and 'ΑΣ' ILIKE '%σ' were true on DuckDB only, 'İb' ILIKE '__b' on Spark only): the text and the pattern's
    literal runs are lowered as ``lower`` is (those two letters mapped first), by Spark, on constants (folded once);
    in the regular expression a lowered run is quoted by ``\Q .. \E`` (a lower-cased text holds no ``\E``)."""
    pattern = str(like.expression.this)
    ilike = isinstance(like, exp.ILike)
    parts: list[list[str | None]] = [[]]  # the parts between runs of '%': literal runs, None for '_'
    wild, i = 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "%" and c != esc:
            wild += 1
            if parts[-1] or len(parts) == 1:
                parts.append([])
            i += 1
            continue
        if c == "_" and c != esc:
            parts[-1].append(None)
            i += 1
            continue
        if c == esc:  # the typer's escape precedes only '%', '_' or itself, never ends the pattern
            i += 1
            c = pattern[i]
        if parts[-1] and isinstance(parts[-1][-1], str):
            parts[-1][-1] += c
        else:
            parts[-1].append(c)
        i += 1
    if wild < 2 and not ilike:
        return whole  # at most one '.*': linear already
    out: exp.Expression
    if wild < 2:
        out = exp.Like(this=_simple_lower(like.this.copy()), expression=_simple_lower(like.expression.copy()))
        out.meta[_SEARCH] = True
        return out if esc is None else exp.Escape(this=out, expression=exp.Literal.string(esc))

    pieces: list[exp.Expression | str] = []

    def add(p: list[str | None]) -> None:
        for run in p:
            if run is None:
                pieces.append(".")
            elif ilike:
                pieces.extend(["\\Q", _simple_lower(exp.Literal.string(run)), "\\E"])
            else:
                pieces.append("".join("\\" + c if c.isascii() and not c.isalnum() else c for c in run))

    first, *middle, last = parts
    pieces.append("(?s)\\A")
    add(first)
    for m in middle:
        pieces.append("(?>.*?")
        add(m)
        pieces.append(")")
    pieces.append(".*")
    add(last)
    pieces.append("\\z")
    merged: list[exp.Expression] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], exp.Literal):
            merged[-1] = exp.Literal.string(str(merged[-1].this) + piece)
        else:
            merged.append(exp.Literal.string(piece) if isinstance(piece, str) else piece)
    regex = merged[0] if len(merged) == 1 else exp.Anonymous(this="concat", expressions=merged)
    out = exp.RegexpLike(this=_simple_lower(like.this.copy()) if ilike else like.this.copy(), expression=regex)
    out.meta[DIALECT_MARK] = SPARK
    out.meta[_SEARCH] = True
    return out


_FLOATS = ("DOUBLE", "FLOAT", "REAL", "FLOAT4", "FLOAT8")
_TO_INTEGER = ("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "INT128")


def _rounded_conversion(node: exp.Expression, new: exp.Expression) -> exp.Expression | None:
    """The typer's conversion of a DOUBLE or DECIMAL value (``CAST_FROM``) to an integer type, or of
    a DOUBLE or an integer to FLOAT, with DuckDB's result, or None for any other conversion.

    DuckDB rounds a DOUBLE to the nearest integer, ties to even (``TRY_CAST(2.5 AS INT)`` is 2, of
    1.5 is 2), and a DECIMAL to the nearest, ties away from zero (2.5 is 3); Spark truncates both
    (1). So the operand is first Spark's ``bround(x, 0)`` (ties to even) or ``round(x, 0)`` (ties away
    from zero, DECIMAL(p - s + 1, 0): it cannot overflow), a whole number that then converts exactly
    or is out of range (NULL under TRY_CAST; the typer's other conversions are total). Spark's
    range test of a DOUBLE against BIGINT reads 2^63 as in range and saturates it to 2^63 - 1, where
    DuckDB's is NULL: that one value is NULL here too. A finite DOUBLE beyond FLOAT's range is
    NULL on DuckDB and infinite on Spark: NULL here too."""
    src = str(node.meta.get(CAST_FROM) or "").upper()
    to = _duck_name(node.args["to"]).upper() if isinstance(node.args.get("to"), exp.DataType) else ""
    x = new.this
    # (a FLOAT: whole numbers only, which it and its DOUBLE are alike; its fractions are Spark's already)
    if src in _FLOATS and to in ("HUGEINT", "INT128"):
        return _double_to_decimal(_arg(x), 38, 0, "bround")  # exactly, not through Spark's decimal text
    if src in _FLOATS and to in _TO_INTEGER:
        new.set("this", exp.Anonymous(this="bround", expressions=[x, exp.Literal.number(0)]))
        if to == "BIGINT":
            beyond = exp.GTE(this=x.copy(), expression=_double(2.0**63))
            return exp.Case(ifs=[exp.If(this=beyond, true=exp.Cast(this=exp.Null(), to=spark_type("BIGINT")))],
                            default=new)
        return new
    m = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", src.replace(" ", ""))
    if m and int(m.group(2)) > 0 and to in _TO_INTEGER:
        new.set("this", exp.Anonymous(this="round", expressions=[x, exp.Literal.number(0)]))
        return new
    md = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", to.replace(" ", ""))
    if md and (src in ("DOUBLE", "FLOAT8") or (src in _FLOATS and md.group(2) == "0")):
        return _double_to_decimal(_arg(x), int(md.group(1)), int(md.group(2)))
    if src in ("INTEGER", "INT", "BIGINT") and to in ("FLOAT", "REAL", "FLOAT4"):
        # an integer beyond 2^24 rounds to a REAL (16777217 is 16777216); Spark's optimizer drops a long -> float cast
        # under a float -> double one (its division, a comparison with a DOUBLE), which kept 16777217. Through an
        # exact DECIMAL it stays (DECIMAL -> FLOAT rounds once, to nearest)
        new.set("this", exp.Cast(this=x, to=spark_type("DECIMAL(20,0)")))
        return new
    if src in _FLOATS and to in ("FLOAT", "REAL", "FLOAT4"):
        inf = _double(math.inf)
        overflow = exp.And(this=exp.EQ(this=exp.Abs(this=new.copy()), expression=inf),
                           expression=exp.NEQ(this=exp.Abs(this=x.copy()), expression=inf.copy()))
        return exp.Case(ifs=[exp.If(this=overflow, true=exp.Cast(this=exp.Null(), to=spark_type("FLOAT")))], default=new)
    return None


#: texts Spark converts to a type and DuckDB does not (NULL there), by the typer's target: Java's suffixes and hex
#: floats for DOUBLE/FLOAT ('1d', '1f', '0x1p3'), digits other than ASCII for DECIMAL/HUGEINT ('٣', '１２'), spaces or
#: control characters around a BOOLEAN (' true ', '\t1': DuckDB trims none there)
_SPARK_ONLY_TEXT = {"float": r"[0-9.][dDfF]\s*$|^\s*[+-]?0[xX]", "decimal": r"[^\x00-\x7F]",
                    "bool": r"^[\x00-\x20]|[\x00-\x20]$"}


def _text_spark_alone_reads(node: exp.Expression) -> str | None:
    """The pattern of texts that Spark converts and DuckDB does not for the typer's conversion ``node`` of text
    (``CAST_FROM`` VARCHAR), or None."""
    if str(node.meta.get(CAST_FROM) or "").upper() not in ("VARCHAR", "TEXT", "STRING"):
        return None
    to = _duck_name(node.args["to"]).upper().replace(" ", "") if isinstance(node.args.get("to"), exp.DataType) else ""
    if to in _FLOATS:
        return _SPARK_ONLY_TEXT["float"]
    if to in ("HUGEINT", "INT128") or to.startswith("DECIMAL"):
        return _SPARK_ONLY_TEXT["decimal"]
    if to in ("BOOLEAN", "BOOL"):
        return _SPARK_ONLY_TEXT["bool"]
    return None


def _double_to_decimal(x: exp.Expression, p: int, s: int, rounding: str = "round") -> exp.Expression:
    """``TRY_CAST(x AS DECIMAL(p, s))`` of a DOUBLE ``x`` with DuckDB's result: ``v = round(x * 1e<s>)``
    (the product in DOUBLE, the rounding to the nearest, ties away from zero), NULL unless ``|v| <
    1e<p>``, else exactly ``v / 10^s``. Spark converts a DOUBLE to DECIMAL through its shortest decimal
    text instead (HALF_UP of '1.005' is 1.01, DuckDB's 1.005 * 100 is 100.49999999999999, so 1.00;
    CAST(2^63 AS DECIMAL(38,0)) was 9223372036854776000): a released key differed between the engines.
    Spark's round of a DOUBLE is HALF_UP of that text, which is ties-away of the value itself (a text
    ending in '.5' is the value). The whole ``v`` (below 10^38) reaches DECIMAL exactly through BIGINT
    parts (a whole DOUBLE below 2^63 converts exactly), none of which can overflow (ANSI mode).
    ``rounding="bround"`` (ties to even): DuckDB's conversion of a DOUBLE to HUGEINT (DECIMAL(38,0) here)."""

    def dbl(v: float) -> exp.Expression:
        return _double(v)

    def dec(e: exp.Expression, prec: int = 38, scale: int = 0) -> exp.Expression:
        return exp.Cast(this=e, to=exp.DataType.build(f"DECIMAL({prec},{scale})", dialect=SPARK))

    def bigint(e: exp.Expression) -> exp.Expression:
        return exp.Cast(this=e, to=exp.DataType.build("BIGINT", dialect=SPARK))

    limit = float(f"1e{p}")
    scaled = exp.Mul(this=exp.Paren(this=x.copy()), expression=dbl(float(f"1e{s}")))
    # finite and not far beyond the range (round of an infinity or NaN raises on Spark): rounded
    v = exp.Paren(this=exp.Case(ifs=[exp.If(this=exp.LT(this=exp.Abs(this=scaled.copy()), expression=dbl(2 * limit)),
                                           true=exp.Anonymous(this=rounding, expressions=[scaled, exp.Literal.number(0)]))]))
    if p <= 18:
        whole = dec(bigint(v.copy()))
    else:
        two64, two32 = 2.0**64, 2.0**32
        hi = bigint(exp.Div(this=v.copy(), expression=dbl(two64)))
        rest = exp.Paren(this=exp.Sub(this=v.copy(), expression=exp.Mul(this=exp.Cast(this=hi.copy(), to=exp.DataType.build("DOUBLE")),
                                                                      expression=dbl(two64))))
        mid = bigint(exp.Div(this=rest.copy(), expression=dbl(two32)))
        low = bigint(exp.Sub(this=rest.copy(), expression=exp.Mul(this=exp.Cast(this=mid.copy(), to=exp.DataType.build("DOUBLE")),
                                                                  expression=dbl(two32))))
        whole = exp.Add(this=exp.Add(this=exp.Mul(this=dec(hi, 20), expression=dec(exp.Literal.string(str(2**64)), 20)),
                                     expression=exp.Mul(this=dec(mid, 20), expression=dec(exp.Literal.string(str(2**32)), 20))),
                        expression=dec(low, 20))
    shifted = whole if s == 0 else exp.Mul(this=exp.Paren(this=whole),
                                           expression=dec(exp.Literal.string("0." + "0" * (s - 1) + "1"), 38, s))
    # DuckDB's DECIMAL test compares in DOUBLE (|v| < 1e38: the DOUBLE 1e38 is NULL); its HUGEINT holds that DOUBLE,
    # 99999999999999997748809823456034029568 < 10^38 (the typer then keeps a HUGEINT below 10^38): <= there
    below = rounding == "bround" and int(limit) < 10**p
    inside = (exp.LTE if below else exp.LT)(this=exp.Abs(this=v.copy()), expression=dbl(limit))
    return _built(exp.Case(ifs=[exp.If(this=inside, true=dec(shifted, p, s))]))


def _decimal_sign_lowered(node: exp.Expression) -> exp.Expression | None:
    """The typer's ``-x`` and ``abs(x)`` of a DECIMAL (HUGEINT is DECIMAL(38,0) on Spark), exactly.

    Spark negates a DECIMAL of more than 18 digits through a 34-digit BigDecimal context: a value
    of 35 to 38 digits is rounded, and near the top of its type the rounding overflows it, which
    raises in ANSI mode (``-x`` failed on the row holding 10^38 - 1). Subtraction is exact, and
    with ``spark.sql.decimalOperations.allowPrecisionLoss`` off (``dpsql.engine.spark.SQL_CONF``)
    keeps the scale: ``-x`` is ``CAST(0 - x AS T)`` and ``abs(x)`` is ``CASE WHEN x < 0 THEN
    CAST(0 - x AS T) ELSE x END`` in the operand's type T, which holds every result (a DECIMAL's
    range is symmetric)."""
    if not isinstance(node, (exp.Neg, exp.Abs)) or node.meta.get(NUMERIC_ARG) is None:
        return None
    name = str(node.meta[NUMERIC_ARG]).upper()
    if name == "HUGEINT":
        to = exp.DataType.build("DECIMAL(38,0)", dialect=SPARK)
    elif re.fullmatch(r"DECIMAL\(\d+,\d+\)", name):
        to = spark_type(name)
    else:
        return None
    x = node.this.this if isinstance(node, exp.Neg) and isinstance(node.this, exp.Paren) else node.this
    zero = exp.Cast(this=exp.Literal.string("0"), to=to.copy())
    negated = exp.Cast(this=exp.Sub(this=zero.copy(), expression=exp.Paren(this=x.copy())), to=to.copy())
    if isinstance(node, exp.Neg):
        return exp.Paren(this=negated)
    return exp.Case(ifs=[exp.If(this=exp.LT(this=x.copy(), expression=zero), true=negated)],
                    default=exp.Cast(this=x.copy(), to=to.copy()))


def _spark_fn(name: str, *args: exp.Expression) -> exp.Expression:
    out = exp.Anonymous(this=name, expressions=list(args))
    out.meta[_SPARK_LIST] = True
    return out


_SPARK_LIST = "dpsql_spark_list"


def _list_lowered(node: exp.Expression) -> exp.Expression | None:
    """COUNT(DISTINCT col)'s bounded lists (dpsql.rewrite.bound): DuckDB's list functions in their
    Spark forms, with the same meaning. ``list_value(x)`` is ``array(x)`` (NULL kept as an element,
    as DuckDB does); ``list(x)`` is ``collect_list(x)`` (both skip NULL inputs; never NULL over
    rows); ``flatten`` is the same on both; ``list_distinct`` drops NULL elements in DuckDB, so it is
    ``array_compact(array_distinct(..))``; ``len`` of such a list is ``size``."""
    if isinstance(node, exp.Anonymous) and str(node.this).lower() == "list_value":
        return _spark_fn("array", *node.expressions)
    if isinstance(node, exp.List) and len(node.expressions) == 1 and not isinstance(node.expressions[0], exp.Distinct):
        return _spark_fn("collect_list", node.expressions[0])
    if isinstance(node, exp.Flatten) and node.this.meta.get(_SPARK_LIST):
        return _spark_fn("flatten", node.this)
    if isinstance(node, exp.Anonymous) and str(node.this).lower() == "list_distinct" and len(node.expressions) == 1 \
            and node.expressions[0].meta.get(_SPARK_LIST):
        return _spark_fn("array_compact", _spark_fn("array_distinct", node.expressions[0]))
    if isinstance(node, exp.Length) and node.this.meta.get(_SPARK_LIST):
        return _spark_fn("size", node.this)
    return None


def lower_for_spark(ast: exp.Expression) -> exp.Expression:
    """``ast`` (a bounded query or a query to bind) with every unmarked node in its Spark form;
    UnsupportedQueryError for a construct whose meaning Spark cannot reproduce, or for an expression
    whose Spark form holds more than MAX_SEARCHES substring searches or MAX_SPARK_NODES nodes (``_counted``)."""
    ast = ast.copy()
    for node in ast.walk():
        if isinstance(node, _SEARCH_NODES) and node.meta.get(DIALECT_MARK) is None:
            node.meta[_SEARCH] = True  # the query's own search (copies made below carry the mark)
    grown = [0]
    out = _lower(ast, grown)
    if grown[0] > MAX_SPARK_GROWTH:
        raise _too_large(MAX_SPARK_GROWTH)
    searches, nodes = _counted(out)
    if searches > MAX_SEARCHES:
        raise _too_many_searches()
    if nodes > MAX_SPARK_NODES:
        raise _too_large()
    return out


#: nodes of one scalar expression's Spark form. Some conversions are long there (a DOUBLE written as text about
#: 500 nodes, a DATE as text about 60): a CTE chain doubling one (256 copies, within the merged query's 20 000
#: nodes) was 131 000 nodes, which Spark took 206 s to analyse and 60 s to plan and run, against 2 s on DuckDB
#: (128 copies, 65 000 nodes: 73 s and 18 s). dpsql's own expressions stay well below: a sampled join's tuple
#: expression over 4 tables is about 22 000 nodes
MAX_SPARK_NODES = 50_000

#: nodes the lowering of the query's own conversions (the typer's casts) may add to a whole query. Spark's analysis,
#: which runs before the charge (the bind check) on every query, costs about 0.6 ms of CPU per node: 32 copies of
#: a DOUBLE written as text (16 400 nodes, under MAX_SPARK_NODES) took 10 s, 64 copies 20 s (65 s of wall time on
#: a loaded machine), all for a free refusal or before any charge. The typer bounds an expression's DuckDB form
#: (5 000 parts); what grows is the lowering of the query's conversions: 10 000 added nodes (20 DOUBLEs written as
#: text) cost at most about 6 s. dpsql's own forms (a sampled join's tuple expression: 13 000 to 29 000 nodes over
#: 2 to 5 tables) are the same for every query of their shape, and not counted here
MAX_SPARK_GROWTH = 10_000


#: query structure: the scalar expressions below such a node are counted one by one
_STRUCTURE: tuple[type[exp.Expression], ...] = (
    exp.Select, exp.From, exp.Where, exp.Group, exp.Having, exp.Subquery, exp.Table, exp.TableAlias, exp.Identifier,
    exp.Join, exp.With, exp.CTE, exp.Union, exp.Window, exp.Order, exp.Ordered, exp.Alias, exp.Distinct, exp.Limit)
_SEARCH_NODES: tuple[type[exp.Expression], ...] = (exp.Contains, exp.StrPosition, exp.Replace, exp.SplitPart, exp.Like,
                                                   exp.ILike)
#: meta key marking the query's own substring searches (not those the lowering writes, e.g. a sign test)
_SEARCH = "dpsql_spark_search"
def _too_many_searches() -> UnsupportedQueryError:
    return UnsupportedQueryError(
        f"an expression's Spark form holds more than {MAX_SEARCHES} substring searches (LIKE/ILIKE, contains, strpos, "
        "replace, split_part): Spark's forms of date, time and number conversions repeat their operand, and each "
        "copy searches again; nothing was run or charged",
        hint="use fewer searches, keep them outside conversions to DATE/TIMESTAMP/text, or run the query on the "
             "DuckDB engine",
    )


def _too_large(added: int | None = None) -> UnsupportedQueryError:
    what = (f"an expression's Spark form holds more than {MAX_SPARK_NODES:,} parts" if added is None else
            f"the query's Spark form adds more than {added:,} parts to it")
    return UnsupportedQueryError(
        f"{what} (Spark's forms of number, date and time conversions to text are long, and a CTE or view named "
        "several times repeats them); nothing was run or charged",
        hint="convert fewer values to text in one expression (a DOUBLE written as text is about 500 parts), or run "
             "the query on the DuckDB engine",
    )


def _counted(node: exp.Expression) -> tuple[int, int]:
    """The query's substring searches and the nodes in ``node``'s scalar expression ((0, 0) for query structure),
    refusing every scalar expression below it with more than MAX_SEARCHES searches (the typer's bound, counted
    again in the Spark form) or more than MAX_SPARK_NODES nodes."""
    if isinstance(node, _STRUCTURE):
        for child in node.iter_expressions():
            searches, nodes = _counted(child)
            if not isinstance(child, _STRUCTURE):
                if searches > MAX_SEARCHES:
                    raise _too_many_searches()
                if nodes > MAX_SPARK_NODES:
                    raise _too_large()
        return 0, 0
    searches, nodes = (1 if node.meta.get(_SEARCH) else 0), 1
    for c in node.iter_expressions():
        s, n = _counted(c)
        searches, nodes = searches + s, nodes + n
    return searches, nodes


def _lower(node: exp.Expression, grown: list[int]) -> exp.Expression:
    """Post-order: children first, so every node is checked (a replaced node's children too). ``grown[0]``
    adds up the nodes that the lowering of the query's own conversions (the typer's, ``CAST_FROM``) adds."""
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, _lower(value, grown))
        elif isinstance(value, list):
            node.set(key, [_lower(v, grown) if isinstance(v, exp.Expression) else v for v in value])
    if node.meta.get(CAST_FROM) is None or grown[0] > MAX_SPARK_GROWTH:
        return _lower_node(node)
    before = sum(1 for _ in node.walk())
    out = _lower_node(node)
    grown[0] += sum(1 for _ in out.walk()) - before
    return out
