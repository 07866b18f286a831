"""The portable keyed hash: one definition on bytes that DuckDB and Spark compute identically.

Every random choice of a bounded query (which rows a unit keeps under a row cap, which groups
under the group cap) is "the n smallest keyed hashes" (``dpsql.rewrite.bound``). DuckDB's
native keyed hash (``DuckDBOps.keyed_hash``: its 64-bit ``HASH``) is fast but exists on DuckDB
only, so the same query on the same data would keep other rows on another engine. The portable
hash is defined on text both engines build the same way:

    h = (first 8 bytes of SHA-256( salt_text || key_text ) as an unsigned integer) - 2^63   (a BIGINT)

* ``salt_text`` is ``<number of UTF-8 bytes of the salt>:<salt>``;
* ``key_text`` is, for each column in order, ``n`` if the value is NULL, else
  ``v<number of UTF-8 bytes of t>:<t>`` with ``t = CAST(value AS VARCHAR / STRING)``.

Every piece says its own length, so the text is injective in the column values' texts (no two
different tuples of texts give the same bytes) and no salt can imitate another. SHA-256 makes
the order pseudo-random, uniform and independent across salts (``tests/test_backend_ops.py``
checks it on every backend, with negative controls).

Identity across engines holds wherever both engines spell the value alike as text: integers,
text (UTF-8 bytes), booleans, decimals, dates and timestamps (checked by
``tests/test_spark.py``), except a date or timestamp before year 1 or after 9999 and a TIMESTAMP WITH
TIME ZONE, which Spark spells otherwise (a released key cast to text is rewritten into DuckDB's
spelling, :func:`spark_text_as_duckdb`; the hash is not, as that rewrite made every Spark hash about
6x slower). Floating-point values are spelled differently beyond about 1e7 or
below 1e-3 (DuckDB ``1e+20``, Spark ``1.0E20``): a DOUBLE privacy unit or DOUBLE group key is
still hashed uniformly on each engine, but the engines may then keep different rows where caps
bind. The bounded query's own hashed columns are the unit, the group keys and the row numbers.

Cost: SHA-256 of a short text per hashed row instead of a 64-bit hash (measured by
``benchmarks/spark.py``); DuckDB therefore keeps its native hash unless the owner asks for
``[engine] keyed_hash = "portable"`` (needed to compare its results with a Spark deployment's).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sqlglot
from sqlglot import exp

from dpsql.engine.duckdb_ops import SaltedDuckDBOps
from dpsql.rewrite.render import DIALECT_MARK

__all__ = ["PortableDuckDBOps", "portable_hash", "salt_text"]


def salt_text(salt: str) -> str:
    """The salt as the hash reads it: its UTF-8 length, a colon, the salt."""
    return f"{len(salt.encode('utf-8'))}:{salt}"


def _mark(e: exp.Expression, dialect: str) -> exp.Expression:
    e.meta[DIALECT_MARK] = dialect
    return e


def _s(v: str) -> exp.Expression:
    return exp.Literal.string(v)


def spark_text_as_duckdb(x: exp.Expression, text: exp.Expression) -> exp.Expression:
    """Spark's ``text`` of ``x`` (``CAST(x AS STRING)``) with DATE and TIMESTAMP_NTZ values spelled as
    DuckDB spells them: Spark writes a year after 9999 with a '+' ('+10000-01-01') and a year before
    1 astronomically with a '-' ('-0095-08-15', '0000-01-01'), DuckDB without the '+' and as
    '0096-08-15 (BC)' / '0001-01-01 (BC)' (timestamps: the ' (BC)' before the time); a TIMESTAMP
    WITH TIME ZONE ends in DuckDB's '+00' (UTC, the session's time zone). Years 1 .. 9999
    and every other type keep Spark's text, which is DuckDB's (``typeof`` is folded by Spark's
    analyser: the rewrite costs nothing for other types). Unmarked: callers mark the tree."""
    year = exp.Anonymous(this="regexp_extract", expressions=[text.copy(), _s("^(-?[0-9]+)-"), exp.Literal.number(1)])
    bc_year = exp.Anonymous(this="format_string", expressions=[
        _s("%04d"), exp.Sub(this=exp.Literal.number(1),
                            expression=exp.TryCast(this=year, to=exp.DataType.build("BIGINT"), safe=True))])
    rest = exp.Anonymous(this="regexp_replace", expressions=[text.copy(), _s("^-?[0-9]+(-[0-9]{2}-[0-9]{2})"),
                                                              _s("$1 (BC)")])
    fixed = exp.Case(ifs=[
        exp.If(this=exp.Like(this=text.copy(), expression=_s("+%")),
               true=exp.Anonymous(this="substr", expressions=[text.copy(), exp.Literal.number(2)])),
        exp.If(this=exp.or_(exp.Like(this=text.copy(), expression=_s("-%")),
                            exp.Like(this=text.copy(), expression=_s("0000-%"))),
               true=exp.Anonymous(this="concat", expressions=[bc_year, rest]))],
        default=text.copy())
    temporal = exp.In(this=exp.Anonymous(this="typeof", expressions=[x.copy()]),
                      expressions=[_s("date"), _s("timestamp_ntz")])
    # a TIMESTAMP WITH TIME ZONE: DuckDB writes its offset ('+00' in UTC, the time zone of dpsql's Spark
    # session), Spark none: the released key CAST(ts AS VARCHAR) and the portable hash of that text differed
    with_zone = exp.EQ(this=exp.Anonymous(this="typeof", expressions=[x.copy()]), expression=_s("timestamp"))
    return exp.Case(ifs=[exp.If(this=temporal, true=fixed),
                         exp.If(this=with_zone, true=exp.Anonymous(this="concat", expressions=[fixed.copy(), _s("+00")]))],
                    default=text.copy())


#: DuckDB's text of a DOUBLE from Java's (Spark's ``CAST(x AS STRING)``, ``__t`` below), in Spark SQL. Java 17's
#: ``Double.toString`` gives digits that read back as the value but not always the fewest ('9.999999999999999E22'
#: for 1e23, '4.9E-324', '2.82879384806159008E17'), and its own layout ('1.0E20', '1.0E-5'); DuckDB writes the
#: shortest digits that read back (the nearest such), fixed for exponents -4 .. 15, else '1e+20', '1e-05'.
#: So: Java's digits as an integer m and exponent q (trailing zeros dropped); for j = 1, 2, .. the two j-digit
#: shorter neighbours of m (the nearer first, ties to even), kept while one reads back as the value; then
#: DuckDB's layout. (The lambdas only name intermediate values; everything is total on a DOUBLE's text.)
_DOUBLE_TEXT = r"""
CASE WHEN __t IS NULL THEN NULL WHEN __t = 'NaN' THEN 'nan' WHEN __t = 'Infinity' THEN 'inf' WHEN __t = '-Infinity' THEN '-inf'
ELSE concat(IF(startswith(__t, '-'), '-', ''), element_at(transform(array(named_struct(
  'r', regexp_replace(concat(regexp_extract(__t, '([0-9]+)[.]', 1), regexp_extract(__t, '[.]([0-9]+)', 1)), '^0+', ''),
  'f', length(regexp_extract(__t, '[.]([0-9]+)', 1)),
  'e', coalesce(TRY_CAST(nullif(regexp_extract(__t, 'E(-?[0-9]+)', 1), '') AS INT), 0),
  'v', abs(TRY_CAST(__t AS DOUBLE)))), __a ->
 CASE WHEN __a.r = '' THEN '0.0' ELSE element_at(transform(array(named_struct(
   'm', TRY_CAST(regexp_replace(__a.r, '0+$', '') AS BIGINT),
   'q', __a.e - __a.f + length(__a.r) - length(regexp_replace(__a.r, '0+$', '')), 'v', __a.v)), __b ->
  element_at(transform(array(aggregate(sequence(1, 17), named_struct('j', 0, 'm', __b.m), (__acc, __j) ->
   element_at(transform(array(CAST(power(10, __j) AS BIGINT)), __p ->
    element_at(transform(array(named_struct(
      'n', __b.m DIV __p + IF(2 * (__b.m % __p) > __p OR (2 * (__b.m % __p) = __p AND (__b.m DIV __p) % 2 = 1), 1, 0),
      'o', __b.m DIV __p + IF(2 * (__b.m % __p) > __p OR (2 * (__b.m % __p) = __p AND (__b.m DIV __p) % 2 = 1), 0, 1))), __c ->
     CASE WHEN __acc.j <> __j - 1 THEN __acc
          WHEN TRY_CAST(concat(CAST(__c.n AS STRING), 'E', CAST(__b.q + __j AS STRING)) AS DOUBLE) = __b.v
            THEN named_struct('j', __j, 'm', __c.n)
          WHEN TRY_CAST(concat(CAST(__c.o AS STRING), 'E', CAST(__b.q + __j AS STRING)) AS DOUBLE) = __b.v
            THEN named_struct('j', __j, 'm', __c.o)
          ELSE __acc END), 1)), 1))), __z ->
   element_at(transform(array(named_struct('s', regexp_replace(CAST(__z.m AS STRING), '0+$', ''),
                                           'x', __b.q + __z.j + length(CAST(__z.m AS STRING)) - 1)), __d ->
    CASE WHEN __d.x BETWEEN -4 AND 15 THEN
      CASE WHEN __d.x >= length(__d.s) - 1 THEN concat(__d.s, repeat('0', __d.x - length(__d.s) + 1), '.0')
           WHEN __d.x >= 0 THEN concat(substr(__d.s, 1, __d.x + 1), '.', substr(__d.s, __d.x + 2))
           ELSE concat('0.', repeat('0', -__d.x - 1), __d.s) END
    ELSE concat(substr(__d.s, 1, 1), IF(length(__d.s) > 1, concat('.', substr(__d.s, 2)), ''), 'e',
                IF(__d.x < 0, '-', '+'), IF(abs(__d.x) < 10, '0', ''), CAST(abs(__d.x) AS STRING)) END), 1)), 1)), 1) END), 1))
END"""


@functools.cache
def _double_text_template(real: bool = False) -> exp.Expression:
    # a REAL: its digits read back as a REAL (the fewest for the 32-bit value, as DuckDB writes it)
    # (the text read is then the DOUBLE's of that REAL, nearly its exact value: the nearer candidate is the nearer to
    # the value, the fewest digits that read back are taken over every length, and DuckDB keeps a digit more where
    # the two are equally near: 1462245.25, not 1462245.2)
    # (and DuckDB takes no digits that read back only as a tie of two REALs, to even: 118955824.0, not 118955820.0,
    # which is the midpoint of 118955816 and 118955824; such digits are told by the text a hair below and above
    # them, 90 digits further on, beyond any distance of other digits to a midpoint, which read back otherwise)
    text = _DOUBLE_TEXT.replace(" AS DOUBLE)", " AS FLOAT)").replace(
        "WHEN TRY_CAST(concat(CAST(__c.", "WHEN 2 * (__b.m % __p) <> __p AND TRY_CAST(concat(CAST(__c.").replace(
        "WHEN __acc.j <> __j - 1 THEN __acc", "WHEN false THEN __acc") if real else _DOUBLE_TEXT
    if real:
        for c in ("n", "o"):
            read = f"TRY_CAST(concat(CAST(__c.{c} AS STRING), 'E', CAST(__b.q + __j AS STRING)) AS FLOAT) = __b.v"
            assert read in text
            text = text.replace(read, read + (
                f" AND TRY_CAST(concat(CAST(__c.{c} - 1 AS STRING), repeat('9', 90), 'E', CAST(__b.q + __j - 90 AS STRING))"
                f" AS FLOAT) = __b.v AND TRY_CAST(concat(CAST(__c.{c} AS STRING), repeat('0', 89), '1E',"
                f" CAST(__b.q + __j - 90 AS STRING)) AS FLOAT) = __b.v"))
    tree = sqlglot.parse_one(text, read="spark")
    for node in tree.walk():
        if isinstance(node, exp.TryCast):
            node.set("safe", True)
    return tree


def spark_double_text(text: exp.Expression, real: bool = False) -> exp.Expression:
    """DuckDB's text of a DOUBLE (``CAST(x AS VARCHAR)``: '1e+20', '1e-05', '-0.0', '5e-324', 'inf', 'nan')
    from Spark's ``text`` of it (``CAST(x AS STRING)``, Java's spelling), identical for every DOUBLE
    (``tests/test_spark_doubles.py``); of a REAL with ``real`` (Java's '1.50323853E9' is DuckDB's
    '1503238500.0'). Unmarked: callers mark the tree."""
    out = _double_text_template(real).copy()
    # one evaluation of the text: the whole rewrite is a lambda over it
    return exp.Anonymous(this="element_at", expressions=[
        exp.Anonymous(this="transform", expressions=[exp.Array(expressions=[text.copy()]),
                                                     exp.Lambda(this=out, expressions=[exp.to_identifier("__t")])]),
        exp.Literal.number(1)])


def _piece(column: str, dialect: str) -> exp.Expression:
    col = exp.column(column, quoted=False)
    # (Spark's text of a date outside years 1 .. 9999, of a TIMESTAMP WITH TIME ZONE or of a DOUBLE is not
    # rewritten into DuckDB's here: the hash knows no column types, and a rewrite chosen by typeof() made every
    # Spark hash about 6x slower (dates) or 10x slower to analyse (doubles); such keys hash apart across engines)
    text: exp.Expression = exp.Cast(this=col.copy(), to=exp.DataType.build("VARCHAR"))
    nbytes = exp.func("strlen", text.copy()) if dialect == "duckdb" else exp.func("octet_length", text.copy())
    length_text = exp.Cast(this=nbytes, to=exp.DataType.build("VARCHAR"))
    body = exp.DPipe(this=exp.DPipe(this=exp.DPipe(this=exp.Literal.string("v"), expression=length_text, safe=True),
                                    expression=exp.Literal.string(":"), safe=True), expression=text, safe=True)
    return exp.Case(ifs=[exp.If(this=exp.Is(this=col, expression=exp.Null()), true=exp.Literal.string("n"))],
                    default=body)


def portable_hash(columns: Sequence[str], salt: str, dialect: str) -> exp.Expression:
    """The portable keyed hash of ``columns`` under ``salt`` as a BIGINT expression for
    ``dialect`` (``duckdb`` or ``spark``), marked as made for it."""
    text: exp.Expression = exp.Literal.string(salt_text(salt))
    for c in columns:
        text = exp.DPipe(this=text, expression=_piece(c, dialect), safe=True)
    two63 = exp.Literal.number(2**63)
    if dialect == "duckdb":
        hex16 = exp.Substring(this=exp.func("sha256", text), start=exp.Literal.number(1), length=exp.Literal.number(16))
        unsigned = exp.Cast(this=exp.DPipe(this=exp.Literal.string("0x"), expression=hex16, safe=True),
                            to=exp.DataType.build("UBIGINT", dialect="duckdb"))
        wide: exp.Expression = exp.Cast(this=unsigned, to=exp.DataType.build("HUGEINT", dialect="duckdb"))
    elif dialect == "spark":
        digest = exp.func("sha2", text, exp.Literal.number(256))
        hex16 = exp.Substring(this=digest, start=exp.Literal.number(1), length=exp.Literal.number(16))
        conv = exp.Anonymous(this="conv", expressions=[hex16, exp.Literal.number(16), exp.Literal.number(10)])
        wide = exp.Cast(this=conv, to=exp.DataType.build("DECIMAL(20,0)"))
    else:  # pragma: no cover - programming error
        raise ValueError(f"no portable hash for dialect {dialect!r}")
    # the unsigned 64-bit value shifted by 2^63 into BIGINT's range (order kept), computed exactly
    out = exp.Cast(this=exp.Sub(this=wide, expression=two63), to=exp.DataType.build("BIGINT"))
    for node in out.walk():
        _mark(node, dialect)
    return out


def portable_uniform(columns: Sequence[str], salt: str, dialect: str) -> exp.Expression:
    """The top 53 bits of the portable hash (a signed BIGINT, the unsigned value minus 2^63) as a
    DOUBLE strictly inside (0, 1): ``((h >> 11) + 2^52 + 0.5) / 2^53``, never 0 or 1."""
    h = portable_hash(columns, salt, dialect)
    if dialect == "duckdb":
        shifted: exp.Expression = exp.BitwiseRightShift(this=exp.paren(h), expression=exp.Literal.number(11))
    else:
        shifted = exp.Anonymous(this="shiftright", expressions=[h, exp.Literal.number(11)])
    top = exp.Cast(this=exp.paren(shifted), to=exp.DataType.build("DOUBLE"))
    out = exp.Div(this=exp.paren(exp.Add(this=top, expression=exp.Literal.number(float(2**52) + 0.5))),
                  expression=exp.Literal.number(float(2**53)))
    for node in out.walk():
        _mark(node, dialect)
    return out


class PortableDuckDBOps(SaltedDuckDBOps):
    """DuckDB's building blocks with the portable keyed hash (identical choices to Spark's)."""

    #: group keys stay text, as on Spark (the same hash input and the same order of ties)
    coded_domain_max = 0
    #: :meth:`keyed_hash` is SHA-256 of the text: a key's salted text enters it as it is (as on Spark)
    keyed_hash_is_digest = True

    def keyed_hash(self, columns: Sequence[str], salt: str) -> exp.Expression:
        return portable_hash(columns, salt, "duckdb")

    def keyed_uniform(self, columns: Sequence[str], salt: str) -> exp.Expression:
        return portable_uniform(columns, salt, "duckdb")


    def text_digest(self, text: exp.Expression) -> exp.Expression:
        """``md5(text)``, the 32-character lowercase hex digest, as Spark's ``text_digest``: COUNT(DISTINCT ...) carries
        it through the row caps, which order a person's rows by it and race over it
        (``dpsql.rewrite.bound.base_relation``), so both engines must spell it alike to keep the same rows (DuckDB's
        ``MD5_NUMBER``, a UHUGEINT, orders and prints otherwise). Unknown without the salt, as ``MD5_NUMBER`` is."""
        return _mark(exp.func("md5", text), "duckdb")
