"""DuckDB's spelling of the building blocks of bounded queries (:class:`dpsql.engine.base.SqlOps`).

Pure: builds sqlglot ASTs in the DuckDB dialect and executes nothing (the rewrite layer uses
these without an engine; the backend is ``dpsql.engine.duckdb``). Every expression returned
is marked as made for DuckDB, so strict rendering (``dpsql.rewrite.render``) refuses to
render it for any other dialect: ``HASH(a)`` would render for Spark without complaint, as a
different (32-bit Murmur3) hash, and ``ARG_MIN(x, h, n)`` has no Spark spelling at all.

The semantics each method promises are those of :class:`~dpsql.engine.base.SqlOps`, checked
against pure-Python references in ``tests/test_backend_ops.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

from sqlglot import exp

from dpsql.engine.base import DeclaredOps, data_type, literal_text, power_of_two_factors
from dpsql.rewrite.render import DIALECT_MARK

DUCKDB = "duckdb"

#: meta mark of a subquery whose joins must build their hash tables on the right side as written
#: (the backend honours it; no bounding step needs it since the group cap became one window):
#: DuckDB's estimates of Arrow scans are unknown (about 1 row), and building on the large side
#: instead fails for memory where it should spill
KEEP_BUILD_SIDE = "dpsql_keep_build_side"

#: meta mark of a subquery whose ``QUALIFY ROW_NUMBER() ... <= n`` must run as the window it is
#: (the backend honours it): DuckDB's ``top_n_window_elimination`` rewrites a one-key window of
#: that shape into ``ARG_MIN(..., n)`` per partition, whose lists are held in memory and never
#: spill (Q3 with k = 2 at 100M rows failed for memory under the default 4 GB), while the window
#: sorts on disk
SPILLING_WINDOW = "dpsql_spilling_window"

E = TypeVar("E", bound=exp.Expression)


def _mark(e: E) -> E:
    e.meta[DIALECT_MARK] = DUCKDB
    return e


def _number(v: float | int) -> exp.Expression:
    """A numeric constant: whole numbers as integers (``3``, not ``3.0``), non-finite as DOUBLE."""
    if isinstance(v, float) and not math.isfinite(v):
        return exp.Cast(this=exp.Literal.string(repr(v)), to=data_type("DOUBLE"))
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return exp.Literal.number(int(v))
    return exp.Literal.number(v)


def _pow2(k: int) -> exp.Expression:
    """The DOUBLE 2^k, exactly (``|k| <= 1000``)."""
    return exp.Cast(this=exp.Literal.string(repr(2.0**k)), to=data_type("DOUBLE"))


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=False)


def _binary(e: exp.Expression) -> exp.Expression:
    """``e COLLATE "binary"``: a text compared, grouped and hashed by its bytes, whatever the
    connection's ``default_collation``."""
    return _mark(exp.Collate(this=e, expression=exp.to_identifier("binary", quoted=True)))


class DuckDBOps(DeclaredOps):
    """The building blocks of bounded queries for DuckDB (see :class:`dpsql.engine.base.SqlOps`)."""

    dialect = DUCKDB
    #: a relation the bounded query reads more than once is computed once (``AS MATERIALIZED``)
    materialize_shared = True
    #: the per-unit group cap C_u is chosen by one window over every (unit, group) row (sorted on
    #: disk when it does not fit the memory limit), not by ``ARG_MIN(..., C_u)`` (held in
    #: memory): ``dpsql.rewrite.bound.cap_groups_per_unit``. Public: never depends on the data.
    group_cap_window = True

    #: a text group key whose public domain has at most this many values is carried through the
    #: bounding as its position in the domain (:meth:`domain_code`), not as text; at most 63 so
    #: that one BIGINT holds a unit's set of groups (:meth:`count_units_by_mask`). Chosen from the
    #: public domain's size only.
    coded_domain_max = 63

    def domain_code(self, key: exp.Expression, values: Sequence[str]) -> exp.Expression:
        """``TRY_CAST(key AS ENUM(values...))``: a text key as its position in its public domain
        (``ENUM`` values compare, group, sort and hash as small integers), NULL for a key outside
        the domain (or NULL). The lookup is by exact spelling, whatever the column's or the
        connection's collation (the binary comparison of the domain filter). The text is
        :meth:`domain_text` of the code."""
        enum = exp.DataType(this=exp.DataType.Type.ENUM, expressions=[exp.Literal.string(v) for v in values])
        return _mark(exp.TryCast(this=key, to=enum))

    def domain_text(self, code: exp.Expression) -> exp.Expression:
        """The text of a :meth:`domain_code` (``CAST(code AS VARCHAR) COLLATE "binary"``): the domain
        value's spelling. Binary: under a connection's ``default_collation`` (``nocase``, ``nfc``,
        ...) DuckDB's ``HASH`` of a text hashes its collation key, so 'US' and 'us' would hash
        alike for every unit and salt, and the group cap would always keep the one of smaller code."""
        return _binary(_mark(exp.cast(code, data_type("VARCHAR"))))

    def count_units_by_mask(self, relation: exp.Expression, key: str, values: Sequence[str], n: int,
                            salt: str) -> exp.Select:
        """The per-unit group cap and the count of units per group in one pass, for one coded key
        (:meth:`domain_code`, at most :attr:`coded_domain_max` values) over ``relation``'s rows
        (columns ``__unit`` and ``key``): the columns ``key`` (text) and ``__users``.

        Each unit's groups are one BIGINT, bit ``c`` for the domain's value ``c`` (``BIT_OR`` per
        unit: a hash aggregate of fixed-size states, which spills like the ``DISTINCT``). A unit
        with at most ``n`` groups keeps them all; a unit with more keeps the ``n`` whose
        :meth:`keyed_hash` of (unit, group's text) is smallest, ties by code: the choice the group
        cap window (``dpsql.rewrite.bound._smallest_by_window``) makes over the coded pairs (and,
        but for ties, over the text keys), computed from the unit's own mask. The units are then counted per kept set (few distinct sets),
        and each set's count added to each of its groups: no (unit, group) pair is materialised
        and nothing is sorted by unit."""
        code = exp.cast(_mark(exp.func("enum_code", _col(key), copy=False)), data_type("BIGINT"), copy=False)
        one = exp.cast(_number(1), data_type("BIGINT"), copy=False)
        # a row outside the domain (NULL code) shifts by NULL, which BIT_OR skips: a unit with no row inside
        # has a NULL mask and is dropped after the aggregate (a filter on the code before it is pushed by
        # DuckDB onto the rows, where the code was then computed twice per row)
        bits = _mark(exp.func("bit_or", exp.BitwiseLeftShift(this=one, expression=code), copy=False))
        masks = (exp.select(_col("__unit"), exp.alias_(bits, "__m", copy=False))
                 .from_(relation, copy=False).group_by(_col("__unit"), copy=False)
                 .having(exp.Not(this=exp.Is(this=bits.copy(), expression=exp.Null())), copy=False)
                 .subquery("__masks", copy=False))

        def codes(mask: str) -> exp.Expression:  # the codes of a mask's set bits, ascending
            shifted = exp.paren(exp.BitwiseRightShift(this=_col(mask), expression=_col("__c")))
            has = exp.EQ(this=exp.paren(exp.BitwiseAnd(this=shifted, expression=_number(1))), expression=_number(1))
            every = exp.func("range", _number(0), _number(len(values)), copy=False)
            return _mark(exp.func("list_filter", every, exp.Lambda(this=has, expressions=[exp.to_identifier("__c")]), copy=False))

        def text(c: exp.Expression) -> exp.Expression:  # the domain value of code c
            listed = exp.Array(expressions=[exp.Literal.string(v) for v in values])
            return _binary(_mark(exp.func("list_extract", listed, exp.Add(this=c, expression=_number(1)), copy=False)))

        h = self.keyed_hash_of([_col("__unit"), text(_col("__c"))], salt)
        pair = exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier("h"), expression=h),
                                       exp.PropertyEQ(this=exp.to_identifier("c"), expression=_col("__c"))])
        ranked = _mark(exp.func("list_transform", codes("__m"), exp.Lambda(this=pair, expressions=[exp.to_identifier("__c")]), copy=False))
        first = _mark(exp.func("list_slice", _mark(exp.func("list_sort", ranked, copy=False)), _number(1), _number(n), copy=False))
        bit = exp.BitwiseLeftShift(this=one.copy(), expression=exp.Dot(this=_col("__s"), expression=exp.to_identifier("c")))
        as_bits = _mark(exp.func("list_transform", first, exp.Lambda(this=bit, expressions=[exp.to_identifier("__s")]), copy=False))
        few = exp.LTE(this=_mark(exp.func("bit_count", _col("__m"), copy=False)), expression=_number(n))
        kept = exp.Case(ifs=[exp.If(this=few, true=_col("__m"))], default=exp.cast(_mark(exp.func("list_sum", as_bits, copy=False)), data_type("BIGINT"), copy=False))
        per_set = (exp.select(exp.alias_(kept, "__kept", copy=False), exp.alias_(exp.Count(this=exp.Star()), "__n", copy=False))
                   .from_(masks, copy=False).group_by(_col("__kept"), copy=False).subquery("__sets", copy=False))
        spread = (exp.select(exp.alias_(exp.Unnest(expressions=[codes("__kept")]), "__c", copy=False), _col("__n"))
                  .from_(per_set, copy=False).subquery("__spread", copy=False))
        users = exp.cast(exp.Sum(this=_col("__n")), data_type("BIGINT"), copy=False)
        return _mark(exp.select(exp.alias_(text(_col("__c")), key, copy=False), exp.alias_(users, "__users", copy=False)).from_(spread, copy=False)
                     .group_by(_col("__c"), copy=False))

    def keyed_hash(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """``HASH(XOR(HASH(columns...), HASH(salt)))``: DuckDB's 64-bit hash of the columns, XORed
        with the salt's 64-bit hash (a constant, computed once per query), hashed again.

        The outer hash of a 64-bit integer is a full-avalanche bijective mixer (Murmur3's
        finaliser), so flipping the salt's bits reorders a unit's groups unpredictably; no text is
        built per row (integer work only). DuckDB's multi-argument ``HASH(a, b, ...)`` combines
        the arguments' hashes almost linearly, so putting the salt in as one more argument would
        not randomise the order of a unit's groups across salts (``tests/test_backend_ops.py``
        keeps that as its negative control, and a salt XORed in without the outer hash as
        another: it preserves the order's structure).
        """
        return self.keyed_hash_of([_col(c) for c in columns], salt)

    def keyed_hash_of(self, values: Sequence[exp.Expression], salt: str) -> exp.Expression:
        """:meth:`keyed_hash` of expressions (a coded key's text, :meth:`domain_text`: the same
        hash as of the text column itself)."""
        inner = _mark(exp.func("hash", *values))
        key = _mark(exp.func("hash", exp.Literal.string(salt)))
        return _mark(exp.func("hash", exp.BitwiseXor(this=inner, expression=key)))

    #: :meth:`keyed_hash` is DuckDB's own hash (not a digest): it reads a key's salted text through
    #: :meth:`text_digest` (``dpsql.rewrite.bound.keyed_digest``)
    keyed_hash_is_digest = False

    def text_digest(self, text: exp.Expression) -> exp.Expression:
        """``MD5_NUMBER(text)``: how DuckDB's own hash (:meth:`keyed_hash_of`, :meth:`spread_hash`) reads a
        key's salted text (``dpsql.rewrite.bound.spread_input``: DuckDB's string hash keeps the low 61 bits of
        its state free of the top 3 bits of every block, whatever the salt before them, so crafted keys take at
        most 8 hashes). The digest mixes every bit of the text under the secret salt; DuckDB hashes the
        128-bit result as the XOR of its halves' hashes."""
        return _mark(exp.func("md5_number", text))

    def spread_hash(self, values: Sequence[exp.Expression], salt: str) -> exp.Expression:
        """A keyed hash of ``values`` that only spreads a hash table's keys (``dpsql.rewrite.joins.Spread``:
        equal for equal values, unpredictable without the salt, never a random choice): DuckDB's own
        keyed hash (:meth:`keyed_hash_of`) on every DuckDB backend, the portable one included (it changes
        no result, so it need not match Spark's; the portable SHA-256 of every key's text made a TPC-H join
        4.5x slower)."""
        return DuckDBOps.keyed_hash_of(self, values, salt)

    def keyed_uniform(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """The top 53 bits of :meth:`keyed_hash` as a DOUBLE strictly inside (0, 1):
        ``((h >> 11) + 0.5) / 2^53``, never 0 (so ``LN`` of it is finite)."""
        h = self.keyed_hash(columns, salt)
        top = exp.Cast(this=exp.paren(exp.BitwiseRightShift(this=h, expression=exp.Literal.number(11))),
                       to=data_type("DOUBLE"))
        return _mark(exp.Div(this=exp.paren(exp.Add(this=top, expression=exp.Literal.number(0.5))),
                             expression=exp.Literal.number(float(2**53))))

    def exponential_clock(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """``-LN(keyed_uniform)``: a keyed Exp(1) draw."""
        return _mark(exp.Neg(this=_mark(exp.Ln(this=self.keyed_uniform(columns, salt)))))

    def row_clock(self) -> exp.Expression | None:
        """``RANDOM()``: DuckDB's per-row uniform in [0, 1) (a PCG generator per thread, seeded
        from OS entropy when the connection starts; 20M draws are 20M distinct values), drawn
        afresh for every row and every query. A tie between two rows of one (unit, group) has
        probability below 1e-12 per pair of rows; the aggregate then keeps either (both are
        that unit's own rows). ``setseed`` would fix the sequence: ``DuckDBBackend`` uses this
        only on a connection it opened itself (a caller's gets :class:`SaltedDuckDBOps`)."""
        return _mark(exp.Rand())

    def keep_n_per_partition(self, relation: exp.Expression, partition: Sequence[str], order_key: exp.Expression,
                             n: int, *, alias: str, output: Sequence[str] | None = None) -> exp.Subquery:
        """Two spellings of the same choice (the n rows with the smallest key per partition):

        * ``output=None``: ``SELECT * FROM relation QUALIFY ROW_NUMBER() OVER (PARTITION BY
          partition ORDER BY key) <= n`` (every column, including helper columns), marked
          :data:`SPILLING_WINDOW` so that it runs as a window and spills;
        * ``output`` given: one aggregate per partition, ``UNNEST(ARG_MIN({output...}, key,
          n))``, then the struct's fields; faster than the window when there are many
          partitions and few columns. For ``n = 1``: ``ARG_MIN(field, key)`` (a struct of the
          fields when there are several), grouped by the partition, with no list to unnest.
        """
        if output is None:
            rn = exp.Window(this=exp.RowNumber(), partition_by=[_col(p) for p in partition],
                            order=exp.Order(expressions=[exp.Ordered(this=order_key)]))
            kept = exp.select("*").from_(relation, copy=False).qualify(exp.LTE(this=rn, expression=_number(n)), copy=False)
            out = _mark(kept.subquery(alias, copy=False))
            out.meta[SPILLING_WINDOW] = True  # run as a window, which spills (not DuckDB's ARG_MIN rewrite)
            return out
        if n == 1:
            # one row per partition: one hash aggregate, no list to unnest
            rest = [f for f in output if f not in partition]
            items: list[exp.Expression] = [_col(p) for p in partition if p in output]
            if len(rest) == 1:
                items.append(exp.alias_(_mark(exp.func("arg_min_null", _col(rest[0]), order_key.copy())), rest[0]))
                return _mark(exp.select(*items).from_(relation, copy=False).group_by(*[_col(p) for p in partition], copy=False).subquery(alias, copy=False))
            if rest:
                one = exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(f), expression=_col(f)) for f in rest])
                items.append(exp.alias_(_mark(exp.func("arg_min", one, order_key.copy())), "__s"))
            inner = exp.select(*items).from_(relation, copy=False).group_by(*[_col(p) for p in partition], copy=False).subquery("__per_unit", copy=False)
            outer = [exp.alias_(exp.func("struct_extract", _col("__s"), exp.Literal.string(f)), f) if f in rest
                     else _col(f) for f in output]
            return _mark(exp.select(*outer).from_(inner, copy=False).subquery(alias, copy=False))
        struct = exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(f), expression=_col(f)) for f in output])
        picked = _mark(exp.func("arg_min", struct, order_key, _number(n)))
        per_partition = (
            exp.select(exp.alias_(exp.Unnest(expressions=[picked]), "__s")).from_(relation, copy=False)
            .group_by(*[_col(p) for p in partition], copy=False)
        ).subquery("__per_unit", copy=False)
        fields = [exp.alias_(exp.func("struct_extract", _col("__s"), exp.Literal.string(f)), f) for f in output]
        return _mark(exp.select(*fields).from_(per_partition, copy=False).subquery(alias, copy=False))

    def keep_two_drawn(self, relation: exp.Expression, partition: Sequence[str], columns: Sequence[str],
                       draw: str, *, alias: str) -> exp.Subquery:
        """Two rows per partition chosen uniformly at random by one hash aggregate (no window, no
        list state: it spills like any aggregate), from a per-row draw column ``draw`` of
        ``relation``: the rows with the smallest and the largest draw (one row when the partition
        has one). The draws are i.i.d. and continuous, so their ranks are a uniform random
        permutation of the partition's rows and {first, last} is a uniform random 2-subset: every
        pair of rows has probability 2 (n-2)! / n! = 1 / C(n, 2). Each column is picked by
        ``ARG_MIN_NULL`` / ``ARG_MAX_NULL`` (NULL values kept) on the same draw column (drawn once
        per row), so the fields of a kept row come from one row; the two lists are unnested in
        lockstep. The result has the columns ``partition`` then ``columns``."""
        rnd = _col(draw)
        inner: list[exp.Expression] = [_col(p) for p in partition]
        inner.append(exp.alias_(exp.Count(this=exp.Star()), "__n2"))
        for i, c in enumerate(columns):
            inner.append(exp.alias_(_mark(exp.func("arg_min_null", _col(c), rnd.copy())), f"__lo{i}"))
            inner.append(exp.alias_(_mark(exp.func("arg_max_null", _col(c), rnd.copy())), f"__hi{i}"))
        per_partition = (exp.select(*inner).from_(relation, copy=False)
                         .group_by(*[_col(p) for p in partition], copy=False)).subquery("__two", copy=False)

        def two(lo: exp.Expression, hi: exp.Expression) -> exp.Expression:
            one = exp.EQ(this=_col("__n2"), expression=_number(1))
            return _mark(exp.Unnest(expressions=[exp.Case(ifs=[exp.If(this=one, true=exp.Array(expressions=[lo]))],
                                                          default=exp.Array(expressions=[lo.copy(), hi]))]))

        outer: list[exp.Expression] = [_col(p) for p in partition]
        if columns:
            outer += [exp.alias_(two(_col(f"__lo{i}"), _col(f"__hi{i}")), c) for i, c in enumerate(columns)]
            return _mark(exp.select(*outer).from_(per_partition, copy=False).subquery(alias, copy=False))
        copies = exp.select(*outer, exp.alias_(two(_number(1), _number(1)), "__copy")).from_(per_partition, copy=False)
        return _mark(exp.select(*[_col(p) for p in partition]).from_(copies.subquery("__copies", copy=False), copy=False)
                     .subquery(alias, copy=False))

    def clamp(self, value: exp.Expression, lo: float, hi: float, *, shift: float = 0.0) -> exp.Expression:
        """``CASE WHEN v IS NULL THEN NULL ELSE LEAST(GREATEST(v, lo), hi) [- shift] END``.

        DuckDB's GREATEST/LEAST skip NULL arguments, so a bare clamp would turn NULL into lo.
        NaN sorts above every number in DuckDB: GREATEST(NaN, lo) is NaN and LEAST(NaN, hi) hi.
        """
        e: exp.Expression = exp.func("least", exp.func("greatest", value.copy(), _number(lo), copy=False), _number(hi),
                                     copy=False)
        if shift:
            e = exp.Sub(this=e, expression=_number(shift))
        return _mark(exp.Case(ifs=[exp.If(this=exp.Is(this=value, expression=exp.Null()), true=exp.Null())], default=e))

    def try_cast(self, value: exp.Expression, to: str) -> exp.Expression:
        """``TRY_CAST(value AS to)``: NULL where the value does not convert."""
        return _mark(exp.TryCast(this=value, to=data_type(to, DUCKDB)))

    def typed_literal(self, value: Any, to: str) -> exp.Expression:
        """``CAST('<text>' AS to)``: DuckDB parses the text as a value of the type (numbers
        exactly, whatever their size; dates and timestamps in ISO form; quotes in text are
        escaped by the renderer). ``None`` is a NULL of the type."""
        typ = data_type(to, DUCKDB)
        lit: exp.Expression
        if value is None:
            lit = exp.Null()
        elif isinstance(value, bool):
            lit = exp.Boolean(this=value)
        else:
            lit = exp.Literal.string(literal_text(value))
        return _mark(exp.Cast(this=lit, to=typ))

    def epoch_seconds(self, value: exp.Expression) -> exp.Expression:
        """``EPOCH(ts)``: seconds since 1970 as DOUBLE, with the fraction (Spark's
        UNIX_TIMESTAMP, which sqlglot would render it as, drops the fraction)."""
        return _mark(exp.func("epoch", value))

    def epoch_micros(self, value: exp.Expression) -> exp.Expression:
        """``EPOCH_US(ts)``: microseconds since 1970 as BIGINT."""
        return _mark(exp.Anonymous(this="epoch_us", expressions=[value]))

    def least(self, a: exp.Expression, b: exp.Expression) -> exp.Expression:
        return _mark(exp.func("least", a, b))

    def fixed_point(self, value: exp.Expression, scale: int) -> exp.Expression:
        """``CAST(TRUNC(value * 2^scale) AS BIGINT)`` (DuckDB's cast alone rounds to nearest)."""
        e: exp.Expression = value.copy()
        for f in power_of_two_factors(scale):
            e = exp.Mul(this=e, expression=_pow2(f))
        return _mark(exp.Cast(this=_mark(exp.func("trunc", e, copy=False)), to=data_type("BIGINT")))

    def scaled_integer(self, value: exp.Expression, scale: int) -> exp.Expression:
        """``TRY_CAST(TRUNC(v) AS HUGEINT) * 10^s + TRY_CAST((v - TRUNC(v)) * 10^s AS HUGEINT)``: the fraction
        times 10^s is a DECIMAL of up to 2s digits, exact whatever the value."""
        if scale == 0:
            return self.try_cast(value, "HUGEINT")
        unit = self.typed_literal(10**scale, "HUGEINT")
        whole = _mark(exp.func("trunc", value.copy()))
        frac = _mark(exp.Mul(this=_mark(exp.Paren(this=_mark(exp.Sub(this=value.copy(), expression=whole.copy())))),
                             expression=unit.copy()))
        return _mark(exp.Add(this=_mark(exp.Mul(this=self.try_cast(whole, "HUGEINT"), expression=unit)),
                             expression=self.try_cast(frac, "HUGEINT")))

    def exact_sum(self, value: exp.Expression) -> exp.Expression:
        """``SUM`` of BIGINT (or HUGEINT) values: a HUGEINT, exact."""
        return _mark(exp.Sum(this=value.copy()))

    def from_fixed_point(self, total: exp.Expression, scale: int) -> exp.Expression:
        e: exp.Expression = exp.Cast(this=total.copy(), to=data_type("DOUBLE"))
        for f in power_of_two_factors(scale):
            e = exp.Mul(this=e, expression=_pow2(-f))
        return _mark(e)

    # -- Poisson sampling (joins) --------------------------------------------------------------
    def bernoulli_keep(self, columns: Sequence[str], salt: str, q: float) -> exp.Expression:
        """``CAST('0x' || SUBSTR(SHA256(salt || ':' || CAST(c1 AS VARCHAR) || ':' || ...), 1, 13)
        AS UBIGINT) < floor(q * 2^52)``: the first 52 bits of SHA-256 of the salt and the columns'
        text (joined by ':'; the columns are integers, so the text is unambiguous), compared with
        the rate. A NULL column is hashed as the text 'NULL'."""
        if not 0.0 < q <= 1.0:
            raise ValueError(f"q must be in (0, 1], got {q!r}")
        text: exp.Expression = exp.Literal.string(salt)
        for c in columns:
            part = exp.func("coalesce", exp.cast(_col(c), data_type("VARCHAR"), copy=False), exp.Literal.string("NULL"))
            text = exp.DPipe(this=exp.DPipe(this=text, expression=exp.Literal.string(":"), safe=True),
                             expression=part, safe=True)
        digest = _mark(exp.func("sha256", text))
        head = exp.DPipe(this=exp.Literal.string("0x"), expression=exp.func("substr", digest, _number(1), _number(13)),
                         safe=True)
        threshold = math.floor(q * 2.0**52)
        return _mark(exp.LT(this=exp.cast(head, data_type("UBIGINT", DUCKDB)), expression=exp.Literal.number(threshold)))


class SaltedDuckDBOps(DuckDBOps):
    """DuckDB's building blocks with every random choice reproducible from the salt: no
    per-row draw (:meth:`row_clock` is None), so a one-row choice is the keyed exponential race
    over counted values. Runs on neighbouring data with one salt then make the same choices for
    every unit both contain (the coupling ``tests/test_bounding.py`` checks sensitivity with)."""

    def row_clock(self) -> exp.Expression | None:
        return None
