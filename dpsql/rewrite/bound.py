"""Per-unit contribution bounding as a sqlglot AST, composed of small shared steps.

What the caps mean, and the sensitivity each implies, is documented once, in
``dpsql.rewrite.contribution`` (:class:`ContributionModel`, also known as ``Caps``). This
module enforces them. Each step takes a relation (a subquery) and returns one; the spelling of
the building blocks whose meaning differs between engines (the keyed hash, keeping n rows per
partition, clamping, casts, typed literals) is the backend's (``ops``: a
``dpsql.engine.base.SqlOps``, DuckDB's by default), so the same steps serve every backend:

* :func:`base_relation` -- the privacy unit, the group keys and the clamped values
  (:func:`clamped_value`) of the rows passing the user's WHERE; rows with a NULL unit belong to
  nobody and are dropped; with public key domains, rows whose key is outside the domain are
  dropped first (before any group is chosen);
* :func:`cap_rows_per_unit` -- at most L rows per unit;
* :func:`cap_rows_per_group` -- at most k rows per (unit, group);
* :func:`cap_groups_per_unit` -- at most C_u groups per unit.

A text group key is carried compact (:func:`compact_key`: itself below 32 bytes, else the digest of the salt
and its text) from the base rows to the released groups, and only those groups get their texts back
(:func:`with_key_texts`): nothing before the group cap holds a person's long texts.

The row caps share one step, :func:`cap_rows`: where the kept rows are read once on DuckDB
(an aggregation, a range workload's histogram, a quantile's histograms in the forms of
:func:`bounded_value_histograms` that read them once), keep each
partition's n rows with the smallest fresh per-row ``RANDOM()`` draw (one window; for n = 2 the
rows with the smallest and the largest draw, one hash aggregate); elsewhere
(reproducible backends, and relations read more than once: grouped quantiles with k > 1 or L, joins) number
each partition's rows by value (identical rows are interchangeable), then keep the n whose keyed
hash of (partition, number) under the per-query secret salt is smallest -- either way a uniform
random subset that depends only on that partition's own rows. With k = 1 (and no L) the kept row of each (unit, group) is chosen by one
aggregate instead (:func:`_pick_one_row`): on DuckDB the row with the smallest fresh per-row
draw (``RANDOM()``); on backends that must reproduce the salt's choices (Spark and the portable
hash) an exponential race over the distinct value combinations, each weighted by its number of
rows. Either way each row is kept with probability one over the group's rows, exactly as with
numbering. The group cap keeps, per unit, the C_u groups with
the smallest keyed hash of (unit, group), equal hashes ordered by the group key (so at most C_u
whatever collides): on DuckDB one window numbering each unit's groups in that order (a unit
with at most C_u groups keeps them all), elsewhere a per-unit ``ARG_MIN(..., C_u)`` over the
units with more than C_u groups only. The salt is fresh per
query and never shown, so every choice is unpredictable and independent across queries.

:func:`bounded_query` composes them for an aggregation (then, per group: the distinct-unit
count ``__users``, each unit adding 0 or 1, and per aggregate its per-(unit, group)
contribution summed over units -- for VARIANCE / STDDEV the count, centred sum and centred sum
of squares; for COUNT(DISTINCT col) the distinct values of each (unit, group)'s kept rows,
merged over units; a sum of values is the exact integer total of their fixed-point integers, as
text (:func:`exact_text`, ``ReleasedColumn.scale``), so the noise is added to the exact value);
:func:`bounded_histogram` for a range workload's histogram
(the per-unit row cap only, then counts per bin). ``tests/test_bounding.py`` checks the
sensitivities by removing units from generated data.

Every user expression evaluated here (WHERE, group keys, the public-domain filter) is rendered
by dpsql's typer (``dpsql.plan.typer``): explicitly typed, total by construction (operators
that could fail on some value are guarded explicitly -- wide types, ``NULLIF`` divisors,
range guards on date_trunc -- never by ``TRY(...)``, whose slow path a row could trigger on
purpose), keys canonical (binary collation, one spelling of 0.0 and NaN). So whether the
bounded query fails, and how a released key is spelled, never depend on a row (design
invariant 8; ``tests/test_hostile_fuzz.py``).

Caps may be ``math.inf`` (no bounding): the rewrite then returns exactly the original
aggregates, which the golden tests compare against DuckDB on the original query.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.engine.base import (
    DOMAIN_RELATION,
    CodedKeyOps,
    DomainRelation,
    SqlOps,
    coded_key_ops,
    data_type,
    source_name,
    text_digest_of,
)
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.errors import UnsupportedQueryError
from dpsql.plan import ir
from dpsql.plan.typer import (
    CAST_FROM,
    TypeRefusal,
    domain_literal,
    parse_type,
    type_distinct,
    type_key,
    type_predicate,
    type_value,
    uhugeint_text,
)
from dpsql.plan.workload import INTEGER_TYPES, Dim, Workload
from dpsql.rewrite.contribution import Caps, ContributionModel
from dpsql.rewrite.render import DIALECT_MARK, render

__all__ = [
    "SALT_PLACEHOLDER", "Caps", "ContributionModel", "ReleasedColumn", "ValueGrid", "base_relation", "bounded_histogram",
    "bounded_value_histograms", "exact_text", "grid_index",
    "bounded_query", "cap_groups_per_unit", "cap_rows", "cap_rows_per_group", "cap_rows_per_unit", "clamped_value",
    "guard", "key_expression", "released_columns", "source_column", "source_name",
]

SALT_PLACEHOLDER = "<per-query secret salt>"

#: the building blocks used when a caller names no backend
DEFAULT_OPS: SqlOps = DuckDBOps()


@dataclass(frozen=True)
class ReleasedColumn:
    """A column of the bounded result with its per-group sensitivity (L-inf, one unit)."""

    name: str
    sensitivity: float
    kind: str  # users | count | sum
    #: an exact sum (kind ``sum``): the bounded column holds the integer total n of the values'
    #: fixed-point integers as text, its value n * 2^-scale exactly (scale: :func:`fixed_point_scale`
    #: of the bound, public); ``dpsql.mechanisms.common.add_noise`` adds the noise to that value
    scale: int | None = None


def _lit(v: float | int | str) -> exp.Expression:
    if isinstance(v, str):
        return exp.Literal.string(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return exp.Literal.number(int(v))
    return exp.Literal.number(v)


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=False)


_TEXT_TYPES = ("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR", "NVARCHAR")


def unit_expression(unit_column: str, schema: dict[str, str], ops: SqlOps, salt: str) -> exp.Expression:
    """The privacy unit as the caps see it: a text or BLOB unit as the engine's digest of the secret ``salt``
    followed by its text (:func:`salted_text` through ``ops.text_digest``: DuckDB's ``MD5_NUMBER``, a 128-bit
    integer; with the portable keyed hash and on Spark ``md5``, the 32-character hex digest, spelled alike on both
    so that both keep the same rows), any other as it is.

    The caps' windows partition by the unit and carry it with every row of the person, so a text unit's length
    was every row's: one person's 6 000 rows under one 60 000-character id (a few kB of a dictionary-encoded
    Parquet file, 360 MB decoded) made ``SELECT g, COUNT(*) ... GROUP BY g`` fail after its charge under a 100 MB
    memory limit only when that person was present (``tests/test_adversary_round41.py``). The digest is 16 or 32
    bytes whatever the id. It reads the id's bytes (a BLOB's text escapes every byte it does not print as itself,
    a backslash too), so a connection's ``default_collation`` or a column's collation (``nocase``) cannot make the
    people 'Z' and 'z' one partition. Two ids of one digest would be one unit to the caps, and removing one of
    those people would then change the kept rows of both (twice the claimed sensitivity for a signed SUM): under a
    secret salt no one can craft such ids (MD5's collisions need its state, which the salt hides), and two ids
    share a digest by chance with probability about 2^-128 per pair."""
    col = exp.column(unit_column, quoted=True)
    sql_type = schema.get(unit_column.lower(), "")
    if is_text(sql_type) or sql_type.upper().split("(")[0].strip() in ("BLOB", "BYTEA", "BINARY", "VARBINARY"):
        digest = text_digest_of(ops)
        # (the text under the binary collation: a column's NOCASE would pass to the hex digest, which the keyed
        # hash then meets with binary keys)
        return salted_text(binary_text(col, sql_type), salt,
                           digest if digest is not None else (lambda t: exp.MD5(this=t)), sql_type)
    return binary_text(col, sql_type)


def is_text(sql_type: str) -> bool:
    """Whether a catalog type is text (a column or connection collation could apply to it)."""
    if sql_type.rstrip().endswith("]"):  # a list or array of text (VARCHAR[]) is no text
        return False
    typ = sql_type.upper().split("(")[0].strip()
    return typ in _TEXT_TYPES or typ.startswith("VARCHAR")


def binary_text(e: exp.Expression, sql_type: str) -> exp.Expression:
    """``e COLLATE "binary"`` when ``sql_type`` is text, else ``e``: every comparison, partition,
    grouping and DISTINCT over the value then tells 'Z' from 'z' whatever the connection's
    ``default_collation`` or the column's declared collation."""
    if is_text(sql_type):
        return exp.Collate(this=e, expression=exp.to_identifier("binary", quoted=True))
    return e


def _refused(e: TypeRefusal) -> UnsupportedQueryError:
    return UnsupportedQueryError(
        "the query does not type-check: " + "; ".join(m for _, m in e.problems),
        hint="see docs/expressions.md for the allowed operators, functions and types",
    )


def guard(expr: exp.Expression, schema: dict[str, str], what: str = "WHERE") -> exp.Expression:
    """A condition over private rows, rendered total by dpsql's typer (``dpsql.plan.typer``).

    Every operand is typed against the catalog schema, implicit casts are made explicit
    (column casts are TRY_CASTs), and each operator that could fail on some value (integer
    overflow, integer division by zero, date_trunc at the edge of the TIMESTAMP range, ...)
    is guarded explicitly (no TRY(...)), so whether the query fails never depends on a row. There is no shortcut: the typer decides, from the types, what is total.
    Raises UnsupportedQueryError (before any charge) if the expression does not type-check.
    """
    try:
        return type_predicate(expr, schema, what)
    except TypeRefusal as e:
        raise _refused(e) from None


def key_expression(key: ir.GroupKey, schema: dict[str, str], ops: SqlOps | None = None) -> exp.Expression:
    """A GROUP BY key rendered total and canonical (binary collation for text, one spelling
    of 0.0 and NaN for floating point); see ``dpsql.plan.typer.type_key``. For building blocks of another
    dialect than DuckDB's (Spark), a key computed by an expression is cast to the typer's type, DuckDB's: the
    engines' own result types differ (Spark's ``length`` is INT, its DECIMAL products and sums keep other
    precisions), and the released key column has the same type on every engine. The value is DuckDB's, so
    the type holds it."""
    try:
        e, typ = type_key(key.expr, schema)
    except TypeRefusal as err:
        raise _refused(err) from None
    if ops is not None and ops.dialect != "duckdb" and not isinstance(key.expr, exp.Column):
        return exp.Cast(this=e, to=exp.DataType.build(typ.name, dialect="duckdb"))
    return e


def coded_keys(plan: ir.QueryPlan, ops: SqlOps = DEFAULT_OPS) -> frozenset[str]:
    """The group keys carried through the bounding as their position in their public domain
    (``ops.domain_code``: DuckDB's ``ENUM``, which groups, sorts and hashes as a small integer)
    instead of as text: plain text columns whose declared domain has at most
    ``ops.coded_domain_max`` values (none on backends without it), each shorter than
    :data:`COMPACT_BELOW` bytes. From public values only (the query, the catalog and the backend); the
    released key is the same text either way. A code is hashed as its text, the same order as the text
    key's, whose compact key (:func:`compact_key`) is that text below :data:`COMPACT_BELOW` bytes; a domain
    holding a longer value stays text, so the groups kept do not depend on whether a key is coded."""
    coder = coded_key_ops(ops)
    limit = coder.coded_domain_max if coder is not None else 0
    return frozenset(
        k.name for k in plan.keys
        if k.domain is not None and 0 < len(k.domain) <= limit and isinstance(k.expr, exp.Column)
        and is_text(plan.table.schema.get(k.expr.name.lower(), "")) and all(isinstance(v, str) for v in k.domain)
        and all(len(v.encode("utf-8", "surrogatepass")) < COMPACT_BELOW for v in k.domain)
    )


def _coder(ops: SqlOps) -> CodedKeyOps:
    """``ops``' coded-key building blocks; only called for keys :func:`coded_keys` coded, which
    needs them."""
    coder = coded_key_ops(ops)
    if coder is None:  # pragma: no cover - coded_keys codes nothing on such a backend
        raise AssertionError("a coded key on a backend without coded keys")
    return coder


def key_types(plan: ir.QueryPlan, coded: frozenset[str] = frozenset()) -> dict[str, str]:
    """The SQL type of each group key that is carried as its value (not as a code), for :func:`spread_keys`."""
    return {k.name: type_key(k.expr, plan.table.schema)[1].name for k in plan.keys if k.name not in coded}


def _key_item(key: ir.GroupKey, schema: dict[str, str], ops: SqlOps, coded: frozenset[str],
              compact: Sequence[str] = (), salt: str = SALT_PLACEHOLDER) -> exp.Expression:
    """A group key's column of the base rows: the canonical key, its code (:func:`coded_keys`;
    NULL outside the domain), or its :func:`compact_key` (``compact``: :func:`compact_keys`)."""
    if key.name in coded:
        assert isinstance(key.expr, exp.Column) and key.domain is not None
        return exp.alias_(_coder(ops).domain_code(exp.column(key.expr.name, quoted=True), key.domain), key.name, copy=False)
    if key.name in compact:
        sql_type = type_key(key.expr, schema)[1].name
        return exp.alias_(compact_key(key_expression(key, schema, ops), salt, ops, sql_type), key.name, copy=False)
    return exp.alias_(key_expression(key, schema, ops), key.name)


def source_column(agg: ir.Aggregate, caps: Caps) -> str:
    """The bounded column that carries ``agg``: with one row per (unit, group), COUNT(*) is
    the distinct-unit count itself, so both are released as one noisy value."""
    if agg.kind == ir.COUNT_UNITS or (agg.kind == ir.COUNT_STAR and caps.max_rows_per_group == 1):
        return "__users"
    return agg.name


def released_columns(plan: ir.QueryPlan, caps: Caps) -> list[ReleasedColumn]:
    """The numeric columns of the bounded result and the sensitivity each one has."""
    k = caps.rows_per_group_bound  # min(k, L)
    cols = [ReleasedColumn("__users", 1.0, "users")]
    pairs: dict[str, tuple[str, tuple[str, ...]]] | None = None
    for a in plan.aggregates:
        if source_column(a, caps) == "__users":
            continue  # identical to __users
        if a.kind in (ir.COUNT_STAR, ir.COUNT_COL):
            cols.append(ReleasedColumn(a.name, k, "count"))
        elif a.kind == ir.SUM:
            _, m, _ = _value_range(a)
            cols.append(ReleasedColumn(a.name, _times_up(k, m), "sum", fixed_point_scale(m)))
        elif a.kind == ir.AVG:
            # the centred values as the engine computes them: |fl(v - shift)| <= m, which may exceed
            # (hi - lo) / 2 (shift = fl((lo + hi) / 2) is rounded at the bounds' magnitude; adjacent
            # doubles lo, hi give values 0 and hi - lo, twice (hi - lo) / 2)
            _, m, _ = _value_range(a)
            cols.append(ReleasedColumn(a.name + "_sum", _times_up(k, m), "sum", fixed_point_scale(m)))
            cols.append(ReleasedColumn(a.name + "_cnt", k, "count"))
        elif a.kind == ir.COUNT_DISTINCT:
            cols.append(ReleasedColumn(a.name, k, "count"))  # <= k distinct values per (unit, group)
        elif a.kind in ir.VARIANCE_KINDS:
            _, m, m2 = _value_range(a)  # centred values lie in [-m, m], their squares in [0, m2]
            cols.append(ReleasedColumn(a.name + "_sum", _times_up(k, m), "sum", fixed_point_scale(m)))
            cols.append(ReleasedColumn(a.name + "_cnt", k, "count"))
            cols.append(ReleasedColumn(a.name + "_sq", _times_up(k, m2), "sum", fixed_point_scale(m2)))
        elif a.kind in ir.PAIR_KINDS:
            # (dpsql.mechanisms.covariance) centred values a in [-ma, ma], b in [-mb, mb] of the rows where both
            # are non-NULL; their products in [-fl(ma * mb), fl(ma * mb)] (rounding is monotone); the columns
            # every aggregate of the pair reads, once, under the name of the pair's first aggregate
            assert a.second is not None
            if pairs is None:
                pairs = pair_sources(plan)
            lead, reads = pairs[a.name]
            if lead != a.name:
                continue
            _, m, m2 = _value_range(a)
            _, mb, mb2 = _value_range(a.second)
            mab = _product_range(a)
            sens = {"_sum": m, "_sumb": mb, "_ab": mab, "_sq": m2, "_sqb": mb2}
            cols += [ReleasedColumn(a.name + c, k, "count") if c == "_cnt" else
                     ReleasedColumn(a.name + c, _times_up(k, sens[c]), "sum", fixed_point_scale(sens[c])) for c in reads]
    return cols


#: the released columns of a pair (y, x) (``dpsql.mechanisms.covariance``): count, centred sums of y and x, of
#: y * x, of y^2 and x^2, in this order
PAIR_SUFFIXES = ("_cnt", "_sum", "_sumb", "_ab", "_sq", "_sqb")
_PAIR_READS = {
    ir.COVAR_POP: PAIR_SUFFIXES[:4], ir.COVAR_SAMP: PAIR_SUFFIXES[:4], ir.CORR: PAIR_SUFFIXES,
    ir.REGR_SLOPE: (*PAIR_SUFFIXES[:4], "_sqb"), ir.REGR_INTERCEPT: (*PAIR_SUFFIXES[:4], "_sqb"),
    ir.REGR_COUNT: ("_cnt",), ir.REGR_AVGX: ("_cnt", "_sumb"), ir.REGR_AVGY: ("_cnt", "_sum"),
    ir.REGR_SXX: ("_cnt", "_sumb", "_sqb"), ir.REGR_SYY: ("_cnt", "_sum", "_sq"), ir.REGR_SXY: PAIR_SUFFIXES[:4],
    ir.REGR_R2: PAIR_SUFFIXES,
}


def pair_columns(kind: str) -> tuple[str, ...]:
    """The suffixes of the released columns a PAIR_KINDS aggregate reads (:func:`released_columns`)."""
    return _PAIR_READS[kind]


def _pair_identity(a: ir.Aggregate) -> tuple[object, ...]:
    assert a.second is not None
    return tuple((b.column, b.bounds, b.value.sql(dialect="duckdb") if b.value is not None else None)
                 for b in (a, a.second))


#: the suffix of a pair's column read by an aggregate of the same two arguments written in the other order
_SWAPPED = {"_sum": "_sumb", "_sumb": "_sum", "_sq": "_sqb", "_sqb": "_sq"}


def _pair_leads(plan: ir.QueryPlan) -> dict[str, tuple[str, bool]]:
    """Of each PAIR_KINDS aggregate: the query's first aggregate of the same two arguments in either order, and
    whether its own are in the other order."""
    first: dict[tuple[object, ...], tuple[str, tuple[object, ...]]] = {}
    out = {}
    for a in plan.aggregates:
        if a.kind in ir.PAIR_KINDS:
            ident = _pair_identity(a)
            name, theirs = first.get(ident) or first.get(ident[::-1]) or first.setdefault(ident, (a.name, ident))
            out[a.name] = (name, theirs != ident)
    return out


def pair_swapped(plan: ir.QueryPlan) -> frozenset[str]:
    """The PAIR_KINDS aggregates whose arguments are those of their pair's first aggregate in the other order
    (``REGR_COUNT(x, y)`` after ``REGR_SXY(y, x)``): each reads the first's sums of y as its sums of x and the
    reverse (:func:`pair_column`)."""
    return frozenset(n for n, (_, swapped) in _pair_leads(plan).items() if swapped)


def pair_column(suffix: str, swapped: bool) -> str:
    """The suffix of the pair's released column an aggregate reads as its ``suffix`` (:func:`pair_swapped`)."""
    return _SWAPPED.get(suffix, suffix) if swapped else suffix


def pair_sources(plan: ir.QueryPlan) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Of each PAIR_KINDS aggregate: the aggregate whose released columns carry its pair's sums (the query's first
    aggregate of the same two arguments, in either order: its values, bounds and kept rows are the same), and
    the suffixes that one releases (the union of what the pair's aggregates read, :func:`pair_columns`, in the
    first's order of the arguments)."""
    leads = _pair_leads(plan)
    reads: dict[str, set[str]] = {}
    for a in plan.aggregates:
        if a.name in leads:
            first, swapped = leads[a.name]
            reads.setdefault(first, set()).update(pair_column(c, swapped) for c in pair_columns(a.kind))
    return {n: (f, tuple(c for c in PAIR_SUFFIXES if c in reads[f])) for n, (f, _) in leads.items()}


def _times_up(k: float, m: float) -> float:
    """``k * m`` rounded up (a sensitivity: k rows of magnitude at most m may add up to exactly
    k * m, which the nearest double can lie below)."""
    p = k * m
    if math.isfinite(p) and Fraction(p) < Fraction(k) * Fraction(m):
        p = math.nextafter(p, math.inf)
    return p


def aggregate_input(agg: ir.Aggregate, schema: dict[str, str], ops: SqlOps = DEFAULT_OPS) -> exp.Expression:
    """What a value aggregate reads, as DOUBLE (NULL where it does not convert): its column, or its
    expression rendered total by dpsql's typer (``ir.Aggregate.value``)."""
    if agg.value is None:
        assert agg.column is not None
        return ops.try_cast(_decimal_preclamped(agg, schema, ops, exp.column(agg.column, quoted=True)), "DOUBLE")
    try:
        typed = type_value(agg.value, schema)
    except TypeRefusal as e:
        raise _refused(e) from None
    return ops.try_cast(typed, "DOUBLE")


def _decimal_preclamped(agg: ir.Aggregate, schema: dict[str, str], ops: SqlOps, col: exp.Expression) -> exp.Expression:
    """The aggregate's column, a DECIMAL with a scale first clamped in its own type to whole numbers around its
    bounds (``floor(lo)``, ``ceil(hi)``, where the type holds them). DuckDB converts a DECIMAL to DOUBLE cheaply
    only while its unscaled integer is below 2^53; a larger one (999...9.9999999999 in a DECIMAL(38,10)) took
    about 1.3 us against 8 ns, so one person's large values made a SUM's read of their rows several times
    slower. The DOUBLE clamp that follows gives the same values: the conversion is monotone, and the whole
    numbers lie outside [lo, hi]. ``col``: the column's value (itself, or the raw value k = 1's race carried)."""
    typ = parse_type(schema.get((agg.column or "").lower(), ""))
    if typ.kind != "decimal" or typ.scale <= 0 or agg.bounds is None:
        return col
    name, whole = f"DECIMAL({typ.precision},{typ.scale})", 10 ** (typ.precision - typ.scale)
    ifs = []
    for edge, test in ((math.floor(agg.bounds[0]), exp.LT), (math.ceil(agg.bounds[1]), exp.GT)):
        if -whole < edge < whole:  # the type holds it (else no value of the column lies beyond it)
            lit = ops.typed_literal(Decimal(edge), name)
            ifs.append(exp.If(this=test(this=col.copy(), expression=lit), true=lit.copy()))
    return exp.Case(ifs=ifs, default=col) if ifs else col


def fixed_point_scale(magnitude: float) -> int:
    """The exponent k with ``magnitude * 2^k < 2^52`` and ``>= 2^51`` (0 for a magnitude of 0):
    values of at most that magnitude, times 2^k and truncated toward zero, are integers below
    2^52, which an integer SUM adds exactly (in any order) up to 2^74 rows."""
    if magnitude == 0.0 or not math.isfinite(magnitude):
        return 0
    return 52 - math.frexp(magnitude)[1]


def _value_range(agg: ir.Aggregate) -> tuple[float, float, float]:
    """(shift, magnitude, squared magnitude) of the aggregate's clamped value: the value lies in
    [lo - shift, hi - shift] (centred for AVG and the variances), computed as the engine does
    (rounding is monotone, so fl(v - shift) for v in [lo, hi] lies between fl(lo - shift) and
    fl(hi - shift), and a grid value g with |g| <= m has fl(g * g) <= fl(m * m)). The
    sensitivities of :func:`released_columns` are these magnitudes, not (hi - lo) / 2."""
    assert agg.bounds is not None
    lo, hi = agg.bounds
    shift = (lo + hi) / 2.0 if agg.kind in ir.CENTRED_KINDS else 0.0
    m = max(abs(lo - shift), abs(hi - shift)) if shift else max(abs(lo), abs(hi))
    return shift, m, m * m


def _product_range(agg: ir.Aggregate) -> float:
    """The largest magnitude of the product of a pair aggregate's two centred values as the engine computes
    it: fl(a * b) <= fl(ma * mb) for |a| <= ma, |b| <= mb (rounding is monotone)."""
    assert agg.second is not None
    return _value_range(agg)[1] * _value_range(agg.second)[1]


def _clamped_input(agg: ir.Aggregate, schema: dict[str, str], ops: SqlOps, raw: str | None = None) -> exp.Expression:
    """The aggregate's value clamped to its bounds (centred for AVG and the variances), as the
    fixed-point integer of :func:`fixed_point_scale` (truncated toward zero, so no value's
    magnitude grows and the sensitivities of ``released_columns`` hold): every SUM of these is
    exact, so the bounded statistic does not depend on the order DuckDB adds rows in (a running
    floating-point sum's error grows with the rows, and the noise's proof (docs/mechanisms.md 5.3)
    allows only 2^-52 of the bound)."""
    shift, m, _ = _value_range(agg)
    lo, hi = agg.bounds  # type: ignore[misc]
    if raw is None:
        src = aggregate_input(agg, schema, ops)
    else:  # the race carried a bare column as it is (a DECIMAL first clamped in its type), an expression as DOUBLE
        src = ops.try_cast(_decimal_preclamped(agg, schema, ops, _col(raw)) if agg.value is None else _col(raw), "DOUBLE")
    return ops.fixed_point(ops.clamp(src, lo, hi, shift=shift), fixed_point_scale(m))


def _fixed_square(agg: ir.Aggregate, fixed: exp.Expression, ops: SqlOps) -> exp.Expression:
    """The square of a clamped value given as its fixed-point integer ``fixed`` (exact as a DOUBLE:
    below 2^52), as a fixed-point integer of the squares' own scale."""
    _, m, m2 = _value_range(agg)
    k = fixed_point_scale(m)
    as_double = ops.from_fixed_point(fixed, k)
    return ops.fixed_point(exp.Mul(this=as_double, expression=as_double.copy()), fixed_point_scale(m2))


def _fixed_product(agg: ir.Aggregate, fixed_a: exp.Expression, fixed_b: exp.Expression, ops: SqlOps) -> exp.Expression:
    """The product of a pair aggregate's two clamped, centred values given as their fixed-point integers, as a
    fixed-point integer of the products' own scale (:func:`_product_range`)."""
    assert agg.second is not None
    a = ops.from_fixed_point(fixed_a, fixed_point_scale(_value_range(agg)[1]))
    b = ops.from_fixed_point(fixed_b, fixed_point_scale(_value_range(agg.second)[1]))
    return ops.fixed_point(exp.Mul(this=a, expression=b), fixed_point_scale(_product_range(agg)))


def _both(this: exp.Expression, other: exp.Expression) -> exp.Expression:
    """``this`` where ``other`` is not NULL, else NULL: a pair aggregate reads the rows where both values are
    non-NULL (as SQL's COVAR_POP and CORR do)."""
    present = exp.Not(this=exp.Is(this=other, expression=exp.Null()))
    return exp.Case(ifs=[exp.If(this=present, true=this)])


def exact_text(total: exp.Expression) -> exp.Expression:
    """An exact integer sum (``SqlOps.exact_sum``; NULL over no rows: 0) as its decimal text, which every
    engine spells the same way: nothing is rounded before the noise (the scale 2^-k is public, from
    the bounds: ``ReleasedColumn.scale``). A DOUBLE total rounded at its last place, an error the
    Gaussian calibration cannot cover (the ulp of a large total is not public)."""
    zero = exp.cast(exp.Literal.number(0), data_type("HUGEINT"), copy=False)
    return exp.cast(exp.func("coalesce", total, zero, copy=False), data_type("VARCHAR"), copy=False)


#: a public key domain with more values than this enters the AST as one node holding its literals
#: rendered once (per values, column type and dialect; kept): a node per value made every copy and
#: render of the query cost per value (100k values: seconds per query, before DuckDB read the text)
LISTED_INLINE_MAX = 64


@functools.lru_cache(maxsize=16)
def _listed_domain(values: tuple[Any, ...], column_type: str, dialect: str) -> str:
    """The typed literals of ``values`` (public domain values) rendered for ``dialect``, comma-separated."""
    text = render(exp.Tuple(expressions=[domain_literal(v, column_type) for v in values]), dialect=dialect, copy=False)
    assert text.startswith("(") and text.endswith(")")
    return text[1:-1]


def domain_literals(values: tuple[Any, ...], column_type: str, ops: SqlOps = DEFAULT_OPS) -> list[exp.Expression]:
    """The typed literals of a public key domain, as the elements of an IN list or an array: one
    literal per value, or for a long domain one node holding their text rendered for ``ops``'s
    dialect (so refused for any other, as the backends' building blocks are). The text is the
    rendering of the same literals, so the query means the same either way."""
    if len(values) <= LISTED_INLINE_MAX:
        return [domain_literal(v, column_type) for v in values]
    node = exp.Var(this=_listed_domain(tuple(values), column_type, ops.dialect))
    node.meta[DIALECT_MARK] = ops.dialect
    return [node]


#: column types whose domain values a backend's relation holds as they are (text, integers of at most 64 bits,
#: dates, timestamps in microseconds, DECIMAL(p, s): :func:`_relation_kind`)
_RELATION_TYPES = {"VARCHAR": str, "TINYINT": int, "SMALLINT": int, "INTEGER": int, "BIGINT": int,
                   "DATE": dt.date, "TIMESTAMP": dt.datetime}


def _relation_kind(column_type: str) -> type | None:
    """The Python type of every domain value of a column of ``column_type`` (``dpsql.plan.typer.type_domain``)
    that a backend's relation holds, or None (the literals)."""
    t = column_type.upper()
    if re.fullmatch(r"DECIMAL\(\d+,\s*\d+\)", t):
        return Decimal
    return _RELATION_TYPES.get(t)


def domain_rows(values: tuple[Any, ...], column_type: str, ops: SqlOps = DEFAULT_OPS) -> exp.Subquery | None:
    """``(SELECT __d FROM <domain>)``: a long public key domain (at least ``ops.domain_relation_min`` values, a
    property of the domain's length only; text, integer, DATE, TIMESTAMP and DECIMAL columns) as a relation the
    backend registers for the query from the values (:class:`dpsql.engine.base.DomainRelation`; Spark: a temporary
    view), else None (the literals, :func:`domain_literals`). Spark analysed and planned every inlined literal: a GROUP BY over 100 000
    declared keys took minutes. The placeholder's name is no relation of the backend's: it is rendered only for
    ``ops``'s dialect, and the backend names the relation afresh for each run."""
    least = getattr(ops, "domain_relation_min", None)
    kind = _relation_kind(column_type)
    if least is None or len(values) < least or kind is None \
            or not all(type(v) is kind for v in values):  # noqa: E721 - bool is no integer key, a datetime no date
        return None
    node = exp.Table(this=exp.to_identifier("__dpsql_domain"))
    node.meta[DOMAIN_RELATION] = DomainRelation(tuple(values), column_type.upper())
    node.meta[DIALECT_MARK] = ops.dialect
    return exp.Subquery(this=exp.select(_col("__d")).from_(node, copy=False))


def _domain_filter(plan: ir.QueryPlan, ops: SqlOps = DEFAULT_OPS) -> exp.Expression | None:
    """Rows whose key lies in the public domain: the canonical key compared with literals typed
    to the column at registration (``dpsql.plan.typer.type_domain``), e.g. CAST('2024-01-01' AS
    DATE), never bare text that DuckDB would cast or read as arithmetic."""
    conds: list[exp.Expression] = []
    schema = plan.table.schema
    for key in plan.keys:
        if key.domain is not None:
            assert isinstance(key.expr, exp.Column)
            ctype = schema[key.expr.name.lower()]
            values = tuple(v for v in key.domain if v is not None)
            rows = domain_rows(values, ctype, ops)
            cond = (exp.In(this=exp.Paren(this=key_expression(key, schema)), query=rows) if rows is not None else
                    exp.In(this=exp.Paren(this=key_expression(key, schema)), expressions=domain_literals(values, ctype, ops)))
            conds.append(_or_null(cond, key_expression(key, schema), key.domain))
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = exp.And(this=out, expression=c)
    return out


def _or_null(cond: exp.Expression, key: exp.Expression, domain: tuple[Any, ...]) -> exp.Expression:
    """``cond`` (the key is one of the domain's values), or the key is NULL where the domain holds None: the NULL
    group of a lookup column under a LEFT JOIN (``dpsql.mechanisms.lookup``), a public key like the others."""
    if None not in domain:
        return cond
    return exp.Paren(this=exp.Or(this=cond, expression=exp.Is(this=exp.Paren(this=key.copy()), expression=exp.Null())))


def _in_domain_pairs(relation: exp.Expression, plan: ir.QueryPlan, fields: Sequence[str],
                     ops: SqlOps = DEFAULT_OPS, coded: frozenset[str] = frozenset(),
                     coded_later: bool = False, compact: Sequence[str] = (),
                     salt: str = SALT_PLACEHOLDER) -> exp.Select:
    """The rows of ``relation`` (one per unit and group, the keys in the columns named as the
    plan's keys) whose keys lie in their public domains: per key with a domain, a semi-join
    ``key IN (SELECT UNNEST([lit, ...]) AS __d)`` (Spark: ``explode(array(...))``) with the literals
    typed to the column at registration, as in :func:`_domain_filter`.

    The filter reads the key only, so it commutes with grouping by the key: applied to the
    (unit, group) pairs it keeps exactly the pairs of the rows the row-level filter keeps, before
    any group is chosen. It is cheaper there: one probe per pair instead of one per row (and a
    semi-join on a subquery, unlike an IN list of constants, is not pushed below the
    aggregation by DuckDB's optimizer). A coded key (:func:`coded_keys`) is NULL exactly outside
    its domain: ``NOT key IS NULL``, unless ``coded_later``: then the group cap window drops those
    pairs (:func:`_smallest_by_window`). A compact key (``compact``, :func:`compact_key`) is compared with its
    domain's values made compact alike."""
    schema = plan.table.schema
    cond: exp.Expression | None = None
    for key in plan.keys:
        if key.domain is None:
            continue
        if key.name in coded:
            if coded_later:
                continue
            c0 = exp.Not(this=exp.Is(this=_col(key.name), expression=exp.Null()))
            cond = c0 if cond is None else exp.And(this=cond, expression=c0)
            continue
        assert isinstance(key.expr, exp.Column)
        ctype = schema[key.expr.name.lower()]
        values = tuple(v for v in key.domain if v is not None)
        rows = domain_rows(values, ctype, ops)
        if rows is None:
            listed = exp.Array(expressions=domain_literals(values, ctype, ops))
            rows = exp.Subquery(this=exp.select(exp.alias_(exp.func("unnest", listed), "__d")))
        if key.name in compact:
            made = compact_key(binary_text(_col("__d"), ctype), salt, ops, ctype)
            rows = exp.Subquery(this=exp.select(exp.alias_(made, "__d", copy=False)).from_(rows.this.subquery("__domain", copy=False), copy=False))
        c = _or_null(exp.In(this=_col(key.name), query=rows), _col(key.name), key.domain)
        cond = c if cond is None else exp.And(this=cond, expression=c)
    q = exp.select(*[_col(f) for f in fields]).from_(relation, copy=False)
    return q.where(cond, copy=False) if cond is not None else q


# -- the steps ----------------------------------------------------------------------------------


def clamped_value(column: str, lo: float, hi: float, *, shift: float = 0.0, ops: SqlOps = DEFAULT_OPS) -> exp.Expression:
    """Clamping: the column's value as DOUBLE (NULL where it does not convert), clamped to
    [lo, hi], minus ``shift``; NULL stays NULL, as SQL aggregates expect."""
    return ops.clamp(ops.try_cast(exp.column(column, quoted=True), "DOUBLE"), lo, hi, shift=shift)


#: the most columns (besides the partition's) a two-row cap carries through its aggregate form
#: (``DuckDBOps.keep_two_drawn``); wider relations keep the window, which spills more robustly
TWO_ROW_MAX_COLUMNS = 2


def cap_rows(relation: exp.Expression, partition: Sequence[str], order_by: Sequence[str], n: float, salt: str, *,
             alias: str, ops: SqlOps = DEFAULT_OPS, draw: bool = False, coded: frozenset[str] = frozenset(),
             null_free: bool = False) -> exp.Subquery:
    """At most ``n`` rows per partition: a uniform random subset that depends only on the
    partition's own rows. With ``null_free`` (not with ``draw``), a row with a NULL in a partition
    column is not capped (each such row its own partition): a join's input capped per the column
    through which its rows reach people keeps every row that reaches nobody.

    With ``draw`` (the caller's relation is read once) and a backend that draws per row
    (``ops.row_clock()``, DuckDB's ``RANDOM()``): every row gets a fresh draw in a column
    ``__rnd<alias>`` and the ``n`` smallest per partition are kept (one window; identical rows draw
    separately, so every subset of n rows is equally likely); for ``n = 2``, when the backend has
    ``keep_two_drawn`` (DuckDB) and the relation carries at most :data:`TWO_ROW_MAX_COLUMNS`
    columns besides the partition's, the smallest and the largest draw instead (one hash
    aggregate, a uniform pair as well), whose result has the columns ``partition`` then ``order_by``: in this
    mode those must be all the columns the caller reads after the cap (``bounded_query``'s base
    rows: the unit, the keys, the value columns). Otherwise rows are numbered within
    their partition by value (``order_by``: identical rows are interchangeable, so which of them
    gets which number does not matter), and the ``n`` whose keyed hash of (partition, number) is
    smallest are kept, with the row number ``__idx`` as an extra column: reproducible from the
    salt, so a relation read twice makes the same choice both times.
    """
    clock = ops.row_clock() if draw else None
    if clock is not None:
        rnd = "__rnd" + alias  # one draw column per cap (L, then k: each its own draw)
        drawn = exp.select("*", exp.alias_(clock, rnd)).from_(relation, copy=False).subquery("__drawn" + alias, copy=False)
        two = getattr(ops, "keep_two_drawn", None)
        carried = [c for c in order_by if c not in partition]
        if int(n) == 2 and two is not None and len(carried) <= TWO_ROW_MAX_COLUMNS:
            # the first and last by draw: one aggregate, no window (with at most two carried columns:
            # its ARG_MIN_NULL / ARG_MAX_NULL states spill less well than the window sorts, and the
            # memory they need grows with the columns)
            return two(drawn, partition, carried, rnd, alias=alias)
        return ops.keep_n_per_partition(drawn, partition, _col(rnd), int(n), alias=alias)
    idx = exp.Window(
        this=exp.RowNumber(),
        partition_by=[_col(p) for p in partition],
        order=exp.Order(expressions=[exp.Ordered(this=_col(c)) for c in order_by]) if order_by else None,
    )
    numbered = exp.select("*", exp.alias_(idx, "__idx")).from_(relation, copy=False).subquery("__numbered", copy=False)
    # (the spread column, a function of the others, changes no choice)
    drawn_by = [c for c in partition if c != SPREAD]
    if null_free:
        # 0 for a row whose partition is all set (the partition as before), else its own number within the rows of
        # its partition: each a partition of one row, kept. Not hashed: the choices among the other rows are unchanged
        assert clock is None, "null_free caps number their rows"
        nulls = [exp.Is(this=_col(c), expression=exp.Null()) for c in drawn_by]
        anyone = nulls[0] if len(nulls) == 1 else exp.Or(this=nulls[0], expression=nulls[1])
        for extra in nulls[2:]:
            anyone = exp.Or(this=anyone, expression=extra)
        free = exp.Case(ifs=[exp.If(this=anyone, true=_col("__idx"))], default=exp.Literal.number(0))
        numbered = exp.select("*", exp.alias_(free, "__free")).from_(numbered, copy=False).subquery("__freed", copy=False)
        partition = [*partition, "__free"]
    if coded & set(partition):  # a coded key is hashed as its text (:func:`coded_keys`)
        hashed = [_coder(ops).domain_text(_col(c)) if c in coded else _col(c) for c in [*drawn_by, "__idx"]]
        key = _coder(ops).keyed_hash_of(hashed, salt)
    else:
        key = ops.keyed_hash([*drawn_by, "__idx"], salt)
    return ops.keep_n_per_partition(numbered, partition, key, int(n), alias=alias)


#: the column of :func:`spread_keys`
SPREAD = "__spread"


def spread_keys(relation: exp.Expression, keys: Sequence[str], salt: str, ops: SqlOps,
                types: Mapping[str, str] | None = None) -> exp.Subquery:
    """``relation`` with one more column, :data:`SPREAD`: the keyed hash of (unit, keys) under the
    query's secret salt. Partitions and groupings by (unit, keys) also go by it: the same groups,
    but hashed unpredictably. The engine's own hash is public and unsalted (DuckDB's hash of a
    BIGINT is Murmur3's finaliser, a bijection anyone can invert), so one person's rows could hold
    thousands of keys whose hashes share their low bits; a hash aggregate or window partitioned by
    (unit, key) then probed quadratically (20 000 such keys: 1.07 s for a sparse histogram against
    0.03 s for 20 000 random keys), before the group cap bounds that person to a few groups. A
    collision of the keyed hash cannot be crafted without the salt.

    ``types``: the SQL type of each key. A key whose engine hash is not a bijection of its value
    (:func:`weakly_hashed`: text, wide integers and decimals) is hashed as the salt followed by its
    text (:func:`spread_input`): DuckDB's hash of a string has no secret, and strings whose hashes
    are equal in all 64 bits are easy to write (each 8-byte block is XORed into the state and
    multiplied by a constant, so the last block can cancel the others); their keyed hash was equal
    too, and 20 000 such keys of one person made a sparse histogram 24x and a SUM 60x slower."""
    h = _keyed_spread(["__unit", *keys], keys, salt, ops, types)
    return exp.select("*", exp.alias_(h, SPREAD)).from_(relation, copy=False).subquery("__spread_rows", copy=False)


def _keyed_spread(columns: Sequence[str], keys: Sequence[str], salt: str, ops: SqlOps,
                  types: Mapping[str, str] | None) -> exp.Expression:
    """The keyed hash of ``columns`` under ``salt``, the weakly hashed ones among ``keys`` taken as their
    salted text (:func:`spread_input`)."""
    h = ops.keyed_hash(list(columns), salt)
    weak = {k for k in keys if types is not None and k in types and weakly_hashed(types[k])}
    for c in list(h.find_all(exp.Column)):
        if c.name in weak and not c.table:
            c.replace(spread_input(_col(c.name), types[c.name] if types else "", salt, keyed_digest(ops)))
    return h


#: the column of :func:`key_spread` in the final grouping, used when the group cap C_u is above KEY_SPREAD_ABOVE
KEY_SPREAD = "__key_spread"
KEY_SPREAD_ABOVE = 64


def key_spread(keys: Sequence[str], salt: str, ops: SqlOps, types: Mapping[str, str] | None) -> exp.Expression:
    """The keyed hash of the group keys alone (:func:`spread_keys` without the unit): the final grouping by
    the keys, after the group cap, also goes by it. That cap still leaves a person up to C_u keys, and with an
    owner's C_u of 20 000 one person's 20 000 keys of one DuckDB hash made a sparse histogram 1.99 s against
    0.047 s for random ones (BIGINT keys whose hashes share their low bits: 1.52 s against 0.060 s)."""
    return _keyed_spread(keys, keys, salt, ops, types)


#: type names whose engine hash (DuckDB's) is a bijection of the value (Murmur3's 64-bit finaliser of a value of
#: at most 64 bits; floating point once its zero and NaN are canonical; an ENUM by its index in the owner's
#: dictionary); decimals of at most 18 digits too (:func:`weakly_hashed`)
_STRONG_HASH = frozenset({"TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
                          "UBIGINT", "INT1", "INT2", "INT4", "INT8", "BOOLEAN", "BOOL", "FLOAT", "DOUBLE", "REAL",
                          "FLOAT4", "FLOAT8", "DATE", "TIME", "TIMETZ", "TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS",
                          "TIMESTAMP_NS", "TIMESTAMPTZ", "TIMESTAMP_NTZ", "DATETIME", "ENUM"})


def weakly_hashed(sql_type: str) -> bool:
    """Whether values of ``sql_type`` are hashed by :func:`spread_input` as salted text (see there): every
    type but those of :data:`_STRONG_HASH` and decimals of at most 18 digits. Text's hash, a 128-bit
    integer's (its two halves' hashes XORed) or a wide decimal's are easy to make equal for many values
    without any secret, and so are an INTERVAL's (hash(months) XOR hash(days) XOR hash(micros): every
    ``m months + m microseconds`` hashes to 0) and a list's or struct's (its members' hashes combined), and
    of any type not named here. ``""`` (no type known: a computed DOUBLE) is not weak."""
    t = sql_type.strip().upper()
    if not t:
        return False
    if t.endswith("]") or t.startswith(("STRUCT", "MAP", "UNION", "ARRAY")):
        return True
    base = t.split("(")[0].split(" ")[0].strip()
    if base in ("DECIMAL", "NUMERIC"):
        digits = t[len(base):].strip().lstrip("(").split(",")[0].rstrip(")").strip()
        return digits.isdigit() and int(digits) > 18  # DuckDB stores more than 18 digits as a HUGEINT
    return base not in _STRONG_HASH


def spread_input(value: exp.Expression, sql_type: str, salt: str,
                 digest: Callable[[exp.Expression], exp.Expression] | None = None) -> exp.Expression:
    """``value`` as a spread hashes it: as it is, or, for a type whose engine hash anyone can make
    equal for many distinct values (:func:`weakly_hashed`), the secret salt followed by its text.
    Equal keys have equal text (text is compared byte for byte, under the binary collation; integers
    and decimals of one type print exactly; the key types whose equality is coarser than their text,
    INTERVAL and nested types, are refused as keys and join keys), so the spread stays a function of
    the key. (Values the k = 1 race groups, :func:`_pick_one_row`, may be of such a type: two equal
    values of different text, '1 month' and '30 days', are then two of the race's combinations, which
    still keeps one row of the (unit, group).)

    ``digest`` (:func:`keyed_digest`): how the hash reads the salted text. DuckDB's own hash of a string
    hides no difference behind a secret prefix: it XORs each 8-byte block into its state and multiplies
    by an odd constant, and neither carries a difference in the top 3 bits of a word into its low 61. The
    salt's length is public (a multiple of 8), so keys that differ only in bits 5 and 6 of each block's last
    byte (printable ASCII) hash to at most 8 values under every salt
    (``tests/test_adversary_text_hash_differentials.py``). DuckDB's hash therefore reads the salted text
    through a digest (``MD5_NUMBER``); a keyed hash that is already a digest of the text (SHA-256) reads it
    as it is."""
    return salted_text(value, salt, digest, sql_type) if weakly_hashed(sql_type) else value


def distinct_value(agg: ir.Aggregate, schema: dict[str, str], value: exp.Expression, salt: str,
                   digest: Callable[[exp.Expression], exp.Expression] | None = None) -> exp.Expression:
    """What COUNT(DISTINCT col) lists for ``value`` (a kept row's ``col``): its :func:`spread_input`. The
    distinct values of each (person, group) and then of each group are counted by ``list_distinct``, a hash
    table under the engine's hash of the values, so one person's values crafted to share that hash made it
    quadratic within the owner's caps (20 000 text values of one DuckDB hash: ``COUNT(DISTINCT note)`` 6.75 s
    against 0.29 s for random ones; ``tests/test_adversary_text_hash_collisions.py``). Values of a weakly hashed
    type are listed as the salt followed by their text, which is injective on them (the same count; an
    INTERVAL or nested value counts by its spelling, still at most k per (person, group)), through ``digest``
    (the engine's ``text_digest``) where the engine's hash would read that text (a 128-bit digest of a secret-prefixed
    text: two values share one with probability about 2^-128)."""
    return spread_input(value, distinct_type(agg, schema), salt, digest)


def distinct_type(agg: ir.Aggregate, schema: dict[str, str]) -> str:
    """The SQL type of what COUNT(DISTINCT ...) lists: its column's, or its expression's (:func:`distinct_input`)."""
    if agg.value is not None:
        try:
            return type_distinct(agg.value, schema)[1].name
        except TypeRefusal as e:
            raise _refused(e) from None
    return schema.get((agg.column or "").lower(), "")


def distinct_input(agg: ir.Aggregate, schema: dict[str, str]) -> exp.Expression:
    """What COUNT(DISTINCT expr) reads of a row: the expression typed, total and canonical as a GROUP BY key
    (``dpsql.plan.typer.type_distinct``: binary collation, one spelling of 0.0 and NaN), NULL not counted."""
    assert agg.value is not None
    try:
        return type_distinct(agg.value, schema)[0]
    except TypeRefusal as e:
        raise _refused(e) from None


def salted_text(value: exp.Expression, salt: str,
                digest: Callable[[exp.Expression], exp.Expression] | None = None, sql_type: str = "") -> exp.Expression:
    """The secret salt followed by the text of ``value`` (:func:`spread_input`), through ``digest`` if given.
    ``sql_type``: the type of ``value`` if known (kept as the conversion's ``CAST_FROM``: an engine whose
    text of some types is rewritten, Spark's of dates, skips the rewrite for the other types)."""
    # a UHUGEINT's own conversion costs up to 44 us near 2^128 (``dpsql.plan.typer.uhugeint_text``)
    cast = uhugeint_text(value) if sql_type.strip().upper() == "UHUGEINT" else exp.cast(value, data_type("VARCHAR"))
    if sql_type:
        cast.meta[CAST_FROM] = sql_type
    text = exp.DPipe(this=exp.Literal.string(salt), expression=cast)
    return digest(text) if digest is not None else text


def keyed_digest(ops: SqlOps) -> Callable[[exp.Expression], exp.Expression] | None:
    """How ``ops.keyed_hash`` reads a salted text (:func:`spread_input`): through ``ops.text_digest``
    where that hash is the engine's own (``ops.keyed_hash_is_digest`` false), as it is otherwise. Both are
    declarations every building-block class must make (``dpsql.engine.base.check_declarations``): none
    defaults to reading the text as it is."""
    digest = text_digest_of(ops)
    return None if ops.keyed_hash_is_digest else digest


#: the keyed hash of (unit, group) in the group cap over rows (:func:`_groups_by_hash`)
GROUP_HASH = "__ghash"


def rows_group_cap(plan: ir.QueryPlan, caps: ContributionModel, ops: SqlOps, coded: frozenset[str]) -> bool:
    """Whether the group cap C_u runs over the rows themselves, before any grouping (:func:`_groups_by_hash`),
    instead of over the (unit, group) pairs: with counts of units only (one row per
    (unit, group), no per-unit row cap L), a key of a weakly hashed type (:func:`weakly_hashed`: text) carried as
    its value, every key with a public domain coded (:func:`coded_keys`: the window drops the rows outside it),
    the engine's own hash (``ops.keyed_hash_is_digest`` false) and C_u at most :data:`KEY_SPREAD_ABOVE`. Decided
    from public values only.

    The pairs' ``DISTINCT`` before the cap groups a person's keys in a hash table, so it also groups them by
    their spread, the keyed hash of their salted text, which DuckDB's hash reads through ``MD5_NUMBER``
    (:func:`spread_input`): one digest per row, the largest cost of a text-keyed count (1M rows: about 0.1 s of
    CPU). Over the rows, one hash aggregate per (unit, keyed hash), an integer pair whose hash no one can steer
    without the salt (keys of one engine hash share one group of the aggregate: no probing), then a window over
    those groups keeps each unit's first C_u hashes, so the final grouping by key sees at most C_u keys per person
    (a person left with at most :data:`KEY_SPREAD_ABOVE` keys cannot make it slow). The same groups are kept as
    by the pairs' window (the first C_u of each unit in the order of the keyed hash of the compact keys,
    :func:`compact_key`), but for a person's groups that share one keyed hash, which are dropped
    (:func:`_groups_by_hash`)."""
    if not (caps.rows_finite and caps.max_rows_per_group == 1 and caps.groups_finite and not caps.unit_rows_finite):
        return False
    if caps.max_groups_per_unit > KEY_SPREAD_ABOVE or not getattr(ops, "group_cap_window", False):
        return False
    if keyed_digest(ops) is None:
        return False
    if any(a.kind in (ir.COUNT_COL, ir.COUNT_DISTINCT, *ir.VALUE_KINDS) for a in plan.aggregates):
        return False
    if any(k.domain is not None and k.name not in coded for k in plan.keys):
        return False
    return any(weakly_hashed(t) for t in key_types(plan, coded).values())


def _two_drawn(n: float, carried: int, ops: SqlOps) -> bool:
    """Whether :func:`cap_rows` with ``draw`` keeps ``n`` rows per partition, ``carried`` columns besides the
    partition's, by ``keep_two_drawn``'s hash aggregate (no window): the same test as there."""
    return (ops.row_clock() is not None and int(n) == 2 and getattr(ops, "keep_two_drawn", None) is not None
            and carried <= TWO_ROW_MAX_COLUMNS)


#: a text group key of at least this many bytes is carried as the 32-character hex digest of its salted text,
#: a shorter one as itself (:func:`compact_key`): the two never meet (a digest is 32 bytes)
COMPACT_BELOW = 32


def compact_keys(plan: ir.QueryPlan, coded: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The group keys :func:`bounded_query` carries compact (:func:`compact_key`) from the base rows to the
    released groups, their text attached to those groups only (:func:`with_key_texts`): every text key carried as
    its value (not coded). Decided from public values only (the query, the catalog and the backend)."""
    return tuple(k for k, t in key_types(plan, coded).items() if is_text(t))


def _text_bytes(text: exp.Expression, ops: SqlOps) -> exp.Expression:
    """The UTF-8 bytes of ``text`` on ``ops``' engine (a stored length: ``strlen`` on DuckDB, ``octet_length``
    elsewhere), marked as a building block of that dialect."""
    out = exp.func("strlen" if ops.dialect == "duckdb" else "octet_length", text)
    out.meta[DIALECT_MARK] = ops.dialect
    return out


def compact_key(key: exp.Expression, salt: str, ops: SqlOps, sql_type: str) -> exp.Expression:
    """A text group key as the caps, the group cap and the final grouping carry it: itself when shorter than
    :data:`COMPACT_BELOW` bytes, else ``md5`` of the secret ``salt`` followed by its text (the 32-character
    lower-case hex digest of the UTF-8 bytes, spelled alike on DuckDB and Spark); NULL stays NULL. ``key`` is the
    canonical key (binary collation), so two keys are one compact key exactly when their bytes are equal (two
    different long texts share a digest with probability about 2^-128, and no one can craft such texts without
    the salt), and the compact keys keep the binary collation.

    Every structure before the group cap C_u (the row caps' windows, the pairs' ``DISTINCT`` or grouping, the
    aggregate per (unit, keyed hash) of :func:`_groups_by_hash`, the race of :func:`_pick_one_row`) holds each of
    a person's distinct keys, however many: one person's 6 000 rows of one 60 000-character key, or their 40 000
    distinct 4 000-character keys (160 MB decoded from 480 kB of a zstd Parquet file), made
    ``SELECT note, COUNT(*) ... GROUP BY note`` fail after its charge under a 100 MB memory limit only when that
    person was present (``tests/test_adversary_dictionary_text.py``, ``tests/test_adversary_round44.py``). A
    compact key is at most 32 bytes whatever the text. A key shorter than that is no larger than its digest and
    stays itself: it costs no digest per row, and it is ordered and hashed as before (a key of 32 bytes or more is
    hashed as its digest, as uniform under the salt). The length test reads a stored length."""
    digest = exp.MD5(this=salted_text(key.copy(), salt, None, sql_type))
    short = exp.LT(this=_text_bytes(key.copy(), ops), expression=_lit(COMPACT_BELOW))
    return binary_text(exp.Paren(this=exp.Case(ifs=[exp.If(this=short, true=key)], default=digest)), "VARCHAR")


def with_key_texts(groups: exp.Select, plan: ir.QueryPlan, unit_column: str, compact: Sequence[str], salt: str, *,
                   where: exp.Expression | None, use_public_domain: bool, ops: SqlOps) -> exp.Select:
    """The released groups ``groups`` (one row per group, the compact keys in the columns named as the keys) with
    each compact key (:func:`compact_key`) as its text: the rows holding a key of :data:`COMPACT_BELOW` bytes or
    more are read a second time, with their compact keys, and joined onto the groups (the groups preserved, a
    group of short keys matching no row), and per group the text of each key is the smallest of its rows (the
    rows of one digest hold one text; Spark's allow-list has no ``ANY_VALUE``). The aggregate holds one text per
    released group, so one person's texts reach it only for the at most C_u groups that person kept, and a
    released group's spelling is the text of its rows, as before. No digest is computed for a row of short keys."""
    schema = plan.table.schema
    types = key_types(plan)
    proj: list[exp.Expression] = []
    long_rows: exp.Expression | None = None
    for k in plan.keys:
        if k.name in compact:
            text = key_expression(k, schema, ops)
            proj.append(exp.alias_(compact_key(text.copy(), salt, ops, types[k.name]), "__kc" + k.name, copy=False))
            proj.append(exp.alias_(text.copy(), k.name, copy=False))
            long = exp.GTE(this=_text_bytes(text, ops), expression=_lit(COMPACT_BELOW))
            long_rows = long if long_rows is None else exp.Or(this=long_rows, expression=long)
    assert long_rows is not None
    rows = (_rows_of(plan, unit_column, proj, where, use_public_domain, ops)
            .where(exp.Paren(this=long_rows), copy=False).subquery("__key_texts", copy=False))
    names = [c.alias_or_name for c in groups.selects]
    on: exp.Expression | None = None
    for name in compact:
        eq = exp.NullSafeEQ(this=exp.column(name, table="__released"),
                            expression=exp.column("__kc" + name, table="__key_texts"))
        on = eq if on is None else exp.And(this=on, expression=eq)
    cols: list[exp.Expression] = []
    for n in names:
        if n in compact:
            one = exp.Min(this=exp.column(n, table="__key_texts"))
            one.meta[DIALECT_MARK] = ops.dialect  # the one text of the group, on every engine: a building block
            cols.append(exp.alias_(exp.func("coalesce", one, exp.column(n, table="__released")), n, copy=False))
        else:
            cols.append(exp.column(n, table="__released"))
    if getattr(ops, "materialize_shared", False):
        return _with_shared_key_texts(groups, rows, compact, names, ops)
    # (the groups on the join's build side, its right: written so, as DuckDB keeps it where its estimates tie)
    return (exp.select(*cols).from_(rows, copy=False)
            .join(groups.subquery("__released", copy=False), on=on, join_type="right", copy=False)
            .group_by(*[exp.column(n, table="__released") for n in names], copy=False))


#: a text no compact key equals (:func:`compact_key`: shorter than :data:`COMPACT_BELOW` bytes, or 32 hex characters)
NO_COMPACT_KEY = "-" * (COMPACT_BELOW + 1)


def _never_empty(held: exp.Select, compact: Sequence[str]) -> exp.Expression:
    """``held`` (the released groups that hold a long key) and one row of :data:`NO_COMPACT_KEY` per compact key,
    which no row of the texts' read matches. The groups are those of the final grouping before the noisy
    threshold, so one person's group of their own may be the only one holding a long key; with an empty build
    side DuckDB stopped the semi-join's read of the rows early (at one thread, 104 448 of 200 000 rows without a
    person holding one 40-byte key, all with them: ``tests/test_adversary_round45.py``), so whether a whole read
    of the table ran depended on one person's unreleased key. With that row it always runs in full."""
    none = exp.select(*[exp.alias_(binary_text(exp.Literal.string(NO_COMPACT_KEY), "VARCHAR"), n, copy=False)
                        for n in compact])
    return exp.union(held, none, distinct=False, copy=False)


def _with_shared_key_texts(groups: exp.Select, rows: exp.Subquery, compact: Sequence[str], names: Sequence[str],
                           ops: SqlOps) -> exp.Select:
    """:func:`with_key_texts` where the backend materialises a relation read twice (``ops.materialize_shared``,
    DuckDB): the released groups computed once, the rows of long keys semi-joined on the released groups that hold
    a long key, one text per compact key (``MIN``), then joined onto the groups. The semi-join's build side always
    holds one more row, which matches no row (:func:`_never_empty`), so the rows are read in full whatever the
    groups hold (the second read cost Q2 of ``benchmarks/compare_trees.py`` about 0.02-0.05 s of CPU through the
    registered source's view)."""
    shared = "__released_groups"

    def on(left: str, right: str, prefix: str) -> exp.Expression:
        cond: exp.Expression | None = None
        for name in compact:
            eq = exp.NullSafeEQ(this=exp.column(name, table=left), expression=exp.column(prefix + name, table=right))
            cond = eq if cond is None else exp.And(this=cond, expression=eq)
        assert cond is not None
        return cond

    long: exp.Expression | None = None
    for name in compact:
        one = exp.GTE(this=_text_bytes(_col(name), ops), expression=_lit(COMPACT_BELOW))
        long = one if long is None else exp.Or(this=long, expression=one)
    assert long is not None
    held = _never_empty(exp.select(*[_col(n) for n in compact]).from_(exp.to_table(shared), copy=False)
                        .where(long, copy=False), compact).subquery("__long_groups", copy=False)
    mins: list[exp.Expression] = []
    for name in compact:
        one_text = exp.Min(this=exp.column(name, table="__key_texts"))
        one_text.meta[DIALECT_MARK] = ops.dialect  # the one text of the group, on every engine: a building block
        mins.append(exp.alias_(one_text, name, copy=False))
    by = [exp.column("__kc" + n, table="__key_texts") for n in compact]
    texts = (exp.select(*[c.copy() for c in by], *mins).from_(rows, copy=False)
             .join(held, on=on("__long_groups", "__key_texts", "__kc"), join_type="semi", copy=False)
             .group_by(*by, copy=False).subquery("__long_texts", copy=False))
    cols: list[exp.Expression] = []
    for n in names:
        if n in compact:
            cols.append(exp.alias_(exp.func("coalesce", exp.column(n, table="__long_texts"),
                                            exp.column(n, table="__released")), n, copy=False))
        else:
            cols.append(exp.column(n, table="__released"))
    q = (exp.select(*cols).from_(exp.to_table(shared, alias="__released"), copy=False)
         .join(texts, on=on("__released", "__long_texts", "__kc"), join_type="left", copy=False))
    q.set("with_", exp.With(expressions=[exp.CTE(this=groups, alias=exp.TableAlias(this=exp.to_identifier(shared)),
                                                 materialized=True)]))
    return q


def cap_rows_per_unit(relation: exp.Expression, unit: str, order_by: Sequence[str], max_rows: float, salt: str, *,
                      alias: str = "__kept", ops: SqlOps = DEFAULT_OPS, draw: bool = False) -> exp.Subquery:
    """The per-unit row cap L: at most ``max_rows`` rows per unit (:func:`cap_rows`)."""
    return cap_rows(relation, [unit], order_by, max_rows, salt, alias=alias, ops=ops, draw=draw)


def cap_rows_per_group(relation: exp.Expression, unit: str, keys: Sequence[str], order_by: Sequence[str],
                       max_rows: float, salt: str, *, alias: str = "__rows", ops: SqlOps = DEFAULT_OPS,
                       draw: bool = False, coded: frozenset[str] = frozenset()) -> exp.Subquery:
    """The per-(unit, group) row cap k: at most ``max_rows`` rows per unit and group
    (:func:`cap_rows`)."""
    return cap_rows(relation, [unit, *keys], order_by, max_rows, salt, alias=alias, ops=ops, draw=draw, coded=coded)


def cap_groups_per_unit(relation: exp.Expression, unit: str, keys: Sequence[str], output: Sequence[str],
                        max_groups: float, salt: str, *, alias: str = "__chosen",
                        ops: SqlOps = DEFAULT_OPS, coded: frozenset[str] = frozenset(),
                        over_rows: bool = False) -> exp.Subquery:
    """The per-unit group cap C_u, over a relation with one row per (unit, group): per unit,
    the ``max_groups`` rows first in the total order (keyed hash of (unit, group), group key), a
    uniform random choice that depends only on that unit's groups and the salt. The result has
    the columns ``output``.

    Two spellings of the same choice, picked from public values only (the backend, never the
    data):

    * ``ops.group_cap_window`` (DuckDB): :func:`_smallest_by_window`, one window over every
      (unit, group) row, which DuckDB sorts on disk when it does not fit the memory limit. A
      unit with at most C_u groups numbers them 1..C_u and keeps them all.
    * otherwise: most units have at most C_u groups and keep them all, with no choice to make:
      the relation is computed once (materialised where the backend can), the units with more
      than C_u groups are found by one aggregate, and only their rows go through
      :meth:`SqlOps.keep_n_per_partition` (one ``ARG_MIN(..., n)`` aggregate per unit); the
      others pass through as they are. Whether a unit is such a unit depends only on its own
      groups.

    ``coded`` keys (:func:`coded_keys`) are hashed as their text, so the order is the one of the
    text keys under the same salt; equal hashes are then ordered by code (the domain's order). In
    the window, a pair whose code is NULL (its key outside the public domain) comes after every
    pair of its unit inside the domain and is dropped, so the relation need not be filtered first.

    ``over_rows`` (``ops.group_cap_window`` only): the relation may hold several rows per (unit, group), and
    one row of each of the first ``max_groups`` groups is kept (:func:`_groups_by_hash`, :func:`rows_group_cap`).
    """
    n = int(max_groups)
    if coded:
        hashed = [_col(unit)] + [_coder(ops).domain_text(_col(k)) if k in coded else _col(k) for k in keys]
        key = _coder(ops).keyed_hash_of(hashed, salt)
    else:
        key = ops.keyed_hash([unit, *keys], salt)
    if getattr(ops, "group_cap_window", False):
        if over_rows:
            return _groups_by_hash(relation, unit, keys, output, key, n, outside=sorted(coded)).subquery(alias, copy=False)
        return _smallest_by_window(relation, unit, keys, output, key, n, outside=sorted(coded)).subquery(alias, copy=False)
    assert not over_rows, "the group cap over rows is a window"  # rows_group_cap checks ops.group_cap_window
    shared, heavy = "__pairs", "__heavy"
    pairs_cte = exp.CTE(this=exp.select("*").from_(relation, copy=False), alias=exp.TableAlias(this=exp.to_identifier(shared)),
                        materialized=True if getattr(ops, "materialize_shared", False) else None)
    heavy_q = (exp.select(_col(unit)).from_(exp.to_table(shared), copy=False).group_by(_col(unit), copy=False)
               .having(exp.GT(this=exp.Count(this=exp.Star()), expression=_lit(n)), copy=False))
    heavy_cte = exp.CTE(this=heavy_q, alias=exp.TableAlias(this=exp.to_identifier(heavy)))

    def is_heavy() -> exp.Expression:
        return exp.Exists(this=exp.select(_lit(1)).from_(exp.to_table(heavy, alias="__h"), copy=False).where(
            exp.EQ(this=exp.column(unit, table="__h"), expression=exp.column(unit, table="__p")), copy=False))

    light = exp.select(*[exp.column(c, table="__p") for c in output]).from_(
        exp.to_table(shared, alias="__p"), copy=False).where(exp.Not(this=is_heavy()), copy=False)
    heavy_rows = exp.select("__p.*").from_(exp.to_table(shared, alias="__p"), copy=False).where(is_heavy(), copy=False)
    kept = ops.keep_n_per_partition(heavy_rows.subquery("__heavy_rows", copy=False), [unit], key, n,
                                    alias="__kept_groups", output=output)
    chosen = exp.union(light, exp.select(*[_col(c) for c in output]).from_(kept, copy=False), distinct=False, copy=False)
    q = exp.select(*[_col(c) for c in output]).from_(chosen.subquery("__groups", copy=False), copy=False)
    q.set("with_", exp.With(expressions=[pairs_cte, heavy_cte]))
    return q.subquery(alias, copy=False)


def _smallest_by_window(relation: exp.Expression, unit: str, keys: Sequence[str], output: Sequence[str],
                        key: exp.Expression, n: int, *, outside: Sequence[str] = ()) -> exp.Select:
    """Per unit, the ``n`` rows (one per group) first in the total order (keyed hash, group key),
    by one window: ``QUALIFY ROW_NUMBER() OVER (PARTITION BY unit ORDER BY hash, keys...) <= n``.

    The hash is computed once per (unit, group) row, from integers (no text is built per row).
    The group keys break equal hashes (a collision of the unkeyed inner hash would make equal
    keyed hashes under every salt), each ascending with NULL last, so at most ``n`` groups per
    unit are kept whatever collides, and which ones depends only on the unit's own groups and
    the salt. One window over every row is faster than setting the units with at most ``n``
    groups apart first (that needs the relation materialised, an aggregate and two semi-joins,
    to save sorting partitions of at most ``n`` rows), and it spills: DuckDB sorts the
    partitions on disk when they do not fit the memory limit.

    ``outside``: coded keys that are NULL where the key lies outside its public domain. Such a
    row is ordered after every row of its unit whose keys all lie inside (``key IS NULL`` is the
    first order key: false before true), so it takes no place among the first ``n`` of those, and
    it is dropped with the rows past ``n``: the rows kept are those the window keeps over the
    relation filtered first (``_in_domain_pairs``), whose filter DuckDB would push below the
    aggregation onto every row.
    """
    missing = [exp.Is(this=_col(k), expression=exp.Null()) for k in outside]
    order = [exp.Ordered(this=functools.reduce(lambda a, b: exp.Or(this=a, expression=b), missing),
                         nulls_first=False)] if missing else []
    order.append(exp.Ordered(this=key, nulls_first=False))
    order += [exp.Ordered(this=_col(k), nulls_first=False) for k in keys]

    def window(fn: exp.Expression) -> exp.Window:
        return exp.Window(this=fn, partition_by=[_col(unit)], order=exp.Order(expressions=[o.copy() for o in order]))

    kept: exp.Expression = exp.LTE(this=window(exp.RowNumber()), expression=_lit(n))
    for m in missing:
        kept = exp.And(this=exp.Not(this=m.copy()), expression=kept)
    return (exp.select(*[_col(c) for c in output]).from_(relation, copy=False)
            .qualify(kept, copy=False))


#: the largest C_u whose group cap over rows ranks the hashes over integers first (:func:`_groups_by_hash`)
INTEGERS_FIRST_MAX = 1


def _groups_by_hash(relation: exp.Expression, unit: str, keys: Sequence[str], output: Sequence[str],
                    key: exp.Expression, n: int, *, outside: Sequence[str] = ()) -> exp.Select:
    """The group cap over rows (:func:`rows_group_cap`), with no row carried with its key's text through a window
    or a sort. Rows whose coded keys are NULL (outside their domain) are dropped first. Then one hash aggregate per
    (unit, keyed hash of (unit, group), :data:`GROUP_HASH`), an integer pair no one can steer without the salt
    (keys of one engine hash share one of its groups: no probing), keeps the smallest and largest value of each
    key (its compact key, ``MIN`` / ``MAX`` under the binary collation: exact on the bytes) and how many are
    not NULL; a window over those groups keeps each unit's first ``n`` hashes. With ``n`` at most
    :data:`INTEGERS_FIRST_MAX` (a public value) the first ``n`` hashes are found before, over integers alone (a
    hash aggregate per (unit, hash) and the window), and only their rows, read a second time and joined on
    (unit, hash), reach the aggregate of texts: with C_u = 1 most of a person's rows fall outside, and the
    aggregate copied texts into every (unit, hash) group (1M rows, 50 keys, 5 rows per person: 0.32 against
    0.43 CPU s); with more groups kept the second read costs more than it saves (``docs/performance.md``).

    A (unit, hash) whose rows hold one group (each key one value, or NULL throughout) is that group; one whose rows
    hold two or more groups (a collision of the engine's 64-bit hash of (unit, keys): by chance about 2^-64 per
    pair of a person's groups; or crafted, as DuckDB's string hash can be) is dropped (with integers first, after
    taking its place among the first ``n``). So a person keeps at most ``n`` groups whatever collides, chosen from
    their rows and the salt alone, and every other person the groups the pairs' window keeps (the first ``n`` in
    the order of the keyed hash).

    A window over the rows materialised every row of a person, its key's text included, before keeping any: one
    person's 6 000 rows of one 60 000-character key (a few kB of a dictionary-encoded Parquet file, 360 MB
    decoded) failed the query after its charge under a 100 MB memory limit only when that person was present
    (``tests/test_adversary_dictionary_text.py``). The aggregate holds two values per key per (unit, hash),
    whatever its rows, and each is a compact key (:func:`compact_key`, at most 32 bytes): with the texts
    themselves, one person's 40 000 distinct 4 000-character keys were 40 000 groups of two texts each (320 MB),
    and the count failed after its charge with that person only (``tests/test_adversary_round44.py``). A
    compact key is the text itself when shorter than 32 bytes, so the check above compares texts there and
    digests (equal exactly when the texts are, but with probability about 2^-128) otherwise. Both reads of the
    rows are the same deterministic rows (no per-row draw: counts with k = 1 and no L)."""
    missing = [exp.Is(this=_col(k), expression=exp.Null()) for k in outside]

    def hashed_rows(rel: exp.Expression, alias: str) -> exp.Subquery:
        out = exp.select("*", exp.alias_(key.copy(), GROUP_HASH, copy=False)).from_(rel, copy=False)
        if missing:
            out = out.where(exp.Not(this=functools.reduce(lambda a, b: exp.Or(this=a, expression=b),
                                                          [m.copy() for m in missing])), copy=False)
        return out.subquery(alias, copy=False)

    # (one row per (unit, hash) in the window: DENSE_RANK numbers them as ROW_NUMBER would, in a window DuckDB
    # keeps, where it rewrites ROW_NUMBER() <= n into a slower top-n aggregate per unit)
    rank = exp.Window(this=exp.func("dense_rank"), partition_by=[_col(unit)],
                      order=exp.Order(expressions=[exp.Ordered(this=_col(GROUP_HASH), nulls_first=False)]))
    kept: exp.Expression = hashed_rows(relation, "__r")
    if n <= INTEGERS_FIRST_MAX:
        hashes = (exp.select(_col(unit), _col(GROUP_HASH)).from_(hashed_rows(relation.copy(), "__all_hashes"), copy=False)
                  .group_by(_col(unit), _col(GROUP_HASH), copy=False).subquery("__hashes", copy=False))
        # (and one row (NULL, NULL), which matches no row: units and hashes are never NULL; an empty build side,
        # where no row passes the WHERE but one person's, stopped the second read early: tests/test_adversary_round45.py)
        none = exp.select(exp.alias_(exp.Null(), unit, copy=False), exp.alias_(exp.Null(), GROUP_HASH, copy=False))
        first = exp.union(exp.select(_col(unit), _col(GROUP_HASH)).from_(hashes, copy=False)
                          .qualify(exp.LTE(this=rank, expression=_lit(n)), copy=False), none, distinct=False,
                          copy=False).subquery("__first_hashes", copy=False)
        on = exp.And(this=exp.NullSafeEQ(this=exp.column(unit, table="__r"),
                                         expression=exp.column(unit, table="__first_hashes")),
                     expression=exp.NullSafeEQ(this=exp.column(GROUP_HASH, table="__r"),
                                               expression=exp.column(GROUP_HASH, table="__first_hashes")))
        kept = (exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("__r")))
                .from_(kept, copy=False).join(first, on=on, join_type="inner", copy=False)).subquery("__kept_hashes", copy=False)
    agg: list[exp.Expression] = [_col(unit), _col(GROUP_HASH), exp.alias_(exp.Count(this=exp.Star()), "__rows_h")]
    single: exp.Expression | None = None
    for i, k in enumerate(keys):
        agg += [exp.alias_(exp.Min(this=_col(k)), f"__lo{i}"), exp.alias_(exp.Max(this=_col(k)), f"__hi{i}"),
                exp.alias_(exp.Count(this=_col(k)), f"__nn{i}")]
        one = exp.Or(this=exp.Paren(this=exp.And(this=exp.EQ(this=_col(f"__lo{i}"), expression=_col(f"__hi{i}")),
                                                 expression=exp.EQ(this=_col(f"__nn{i}"), expression=_col("__rows_h")))),
                     expression=exp.EQ(this=_col(f"__nn{i}"), expression=_lit(0)))
        single = exp.Paren(this=one) if single is None else exp.And(this=single, expression=exp.Paren(this=one))
    groups = (exp.select(*agg).from_(kept, copy=False).group_by(_col(unit), _col(GROUP_HASH), copy=False))
    if single is not None:
        groups = groups.having(single, copy=False)
    named = exp.select(_col(unit), _col(GROUP_HASH), *[exp.alias_(_col(f"__lo{i}"), k) for i, k in enumerate(keys)]).from_(
        groups.subquery("__hash_groups", copy=False), copy=False)
    out = exp.select(*[_col(c) for c in output]).from_(named.subquery("__one_group", copy=False), copy=False)
    return out if n <= INTEGERS_FIRST_MAX else out.qualify(exp.LTE(this=rank.copy(), expression=_lit(n)), copy=False)


def _pick_one_row(relation: exp.Expression, unit: str, keys: Sequence[str], values: Sequence[str], salt: str, *,
                  ops: SqlOps, coded: frozenset[str] = frozenset(),
                  value_types: Mapping[str, str] | None = None) -> exp.Subquery:
    """k = 1: one row per (unit, group), uniformly at random among the group's rows, by one
    aggregate. Where the backend draws a fresh uniform per row (``ops.row_clock()``, DuckDB's
    ``RANDOM()``), the row with the smallest draw: ``ARG_MIN(values, RANDOM())`` per (unit,
    group), identical rows included (each has its own draw). Otherwise (reproducible backends)
    over the group's distinct value combinations: each combination ``v`` with ``m`` rows gets the
    key ``-LN(u) / m``, ``u`` the keyed uniform of (unit, group, v); the smallest key wins. This is
    an exponential race (the minimum of ``m`` independent Exp(1) clocks is Exp(m)), so each *row*
    is kept with probability 1 / (the group's rows): identical rows are interchangeable. Either
    way the choice depends only on the unit's own rows in that group and on randomness
    independent of the data."""
    part = [unit, *keys]
    clock = ops.row_clock()
    if clock is not None:
        return ops.keep_n_per_partition(relation, part, clock, 1, alias="__rows", output=[*part, *values])
    texts = [exp.alias_(_coder(ops).domain_text(_col(k)), f"__text{k}") for k in keys if k in coded]
    grouped = [_col(c) for c in [*part, *values]]
    weak = [v for v in values if value_types and weakly_hashed(value_types.get(v, ""))]
    if weak:
        # the distinct values of one (unit, group) are a GROUP BY over values the person chose: values whose
        # engine hash anyone can make equal (text) also go by a keyed hash of their salted text (spread_keys)
        h = ops.keyed_hash([unit, *weak], salt)
        for c in list(h.find_all(exp.Column)):
            if c.name in weak and not c.table:
                c.replace(salted_text(_col(c.name), salt, keyed_digest(ops), (value_types or {}).get(c.name, "")))
        relation = exp.select("*", exp.alias_(h, "__vspread")).from_(relation, copy=False).subquery("__vspread_rows", copy=False)
        grouped.append(_col("__vspread"))
    counted = (exp.select(*[_col(c) for c in [*part, *values]], *texts, exp.alias_(exp.Count(this=exp.Star()), "__m"))
               .from_(relation, copy=False).group_by(*grouped, copy=False).subquery("__counted", copy=False))
    # a coded key is hashed as its text (the same race as over the text key, under the same salt)
    hashed = [unit, *[f"__text{k}" if k in coded else k for k in keys if k != SPREAD], *values]
    race = exp.Div(this=ops.exponential_clock(hashed, salt), expression=_col("__m"))
    return ops.keep_n_per_partition(counted, part, race, 1, alias="__rows", output=[*part, *values])


def base_relation(plan: ir.QueryPlan, unit_column: str, *, where: exp.Expression | None = None,
                  use_public_domain: bool = True, ops: SqlOps = DEFAULT_OPS,
                  coded: frozenset[str] = frozenset(), salt: str = SALT_PLACEHOLDER,
                  compact: Sequence[str] = ()) -> tuple[exp.Select, list[str]]:
    """The rows that may contribute, projected to ``__unit``, the group keys (``coded``: as
    their codes, :func:`coded_keys`) and the clamped values (``<aggregate>_v``); also the names
    of the value columns.

    COUNT(DISTINCT ...) carries what it lists (:func:`distinct_value`, under ``salt``: a value of a weakly hashed
    type as the 128-bit digest of its salted text), computed here, before the row caps, and not the value itself:
    the caps' windows materialise every row of a (unit, group) before keeping k of them, and one person's 6 000
    rows holding one 60 000-character text (a few kB of a dictionary-encoded Parquet file, 360 MB decoded)
    exhausted the engine's memory and temporary-file limits only when that person was present
    (``tests/test_adversary_dictionary_text.py``). The digest is injective on the values with probability about
    1 - 2^-128, so the distinct values counted are the same; the caps order a person's rows by it where they
    ordered them by the value (equal values, equal digests: they number alike). One digest per row instead of
    per kept row, each read from the text as it streams."""
    proj: list[exp.Expression] = [exp.alias_(unit_expression(unit_column, plan.table.schema, ops, salt), "__unit", copy=False)]
    proj += [_key_item(k, plan.table.schema, ops, coded, compact, salt) for k in plan.keys]
    value_cols: list[str] = []
    pairs = pair_sources(plan)
    for a in plan.aggregates:
        if a.kind in (ir.COUNT_COL, ir.COUNT_DISTINCT):
            # COUNT(col): whether the column is NULL (:func:`_present`); COUNT(DISTINCT col): the column as it is;
            # COUNT(expr) reads its typed value (1, or NULL where expr is NULL)
            raw = (_present(a.column) if a.kind == ir.COUNT_COL and a.value is None and a.column is not None
                   else _raw_column(a.column, plan.table.schema) if a.value is None and a.column is not None
                   else distinct_input(a, plan.table.schema) if a.kind == ir.COUNT_DISTINCT
                   else aggregate_input(a, plan.table.schema, ops))
            if a.kind == ir.COUNT_DISTINCT:  # what it lists, before the caps (above)
                raw = distinct_value(a, plan.table.schema, raw, salt, text_digest_of(ops))
            proj.append(exp.alias_(raw, f"{a.name}_v", copy=False))
            value_cols.append(f"{a.name}_v")
        elif a.kind in ir.PAIR_KINDS:
            assert a.second is not None
            if pairs[a.name][0] != a.name:
                continue  # the pair's first aggregate carries its values
            va, vb = _clamped_input(a, plan.table.schema, ops), _clamped_input(a.second, plan.table.schema, ops)
            proj.append(exp.alias_(_both(va, vb.copy()), f"{a.name}_v", copy=False))
            proj.append(exp.alias_(_both(vb, va.copy()), f"{a.name}_w", copy=False))
            value_cols += [f"{a.name}_v", f"{a.name}_w"]
        elif a.kind in ir.VALUE_KINDS:
            proj.append(exp.alias_(_clamped_input(a, plan.table.schema, ops), f"{a.name}_v", copy=False))
            value_cols.append(f"{a.name}_v")
    return _rows_of(plan, unit_column, proj, where, use_public_domain, ops), value_cols


def _rows_of(plan: ir.QueryPlan, unit_column: str, proj: list[exp.Expression], where: exp.Expression | None,
             use_public_domain: bool, ops: SqlOps = DEFAULT_OPS) -> exp.Select:
    """``proj`` over the source rows that may contribute: passing the user's WHERE, with a unit,
    and (with public key domains) a key inside the domain."""
    src = exp.to_table(plan.table.view or source_name(plan.table.name), quoted=True)
    user_where = where if where is not None else plan.where
    cond: exp.Expression = exp.Not(this=exp.Is(this=exp.column(unit_column, quoted=True), expression=exp.Null()))
    if user_where is not None:
        cond = exp.And(this=exp.Paren(this=guard(user_where, plan.table.schema)), expression=cond)
    dom = _domain_filter(plan, ops) if use_public_domain else None
    if dom is not None:
        cond = exp.And(this=cond, expression=dom)
    return exp.select(*proj).from_(src, copy=False).where(cond, copy=False)


def _raw_column(column: str, schema: dict[str, str]) -> exp.Expression:
    """A column an aggregate reads as it is (COUNT(col), COUNT(DISTINCT col)): text under the binary
    collation, so the distinct values are counted by spelling whatever the column's or the
    connection's collation (and a column declared ``COLLATE NOCASE`` can be hashed together with
    the binary unit)."""
    return binary_text(exp.column(column, quoted=True), schema.get(column.lower(), ""))


def _present(column: str) -> exp.Expression:
    """What COUNT(col) reads of a row: 1 where ``col`` is not NULL, else NULL. The count needs nothing more, and
    the value itself can be costly to read: the k = 1 race groups and hashes the values it carries, a value of a
    weakly hashed type as its salted text, and one person's BIGNUM of 10^6 digits (no size cap) took 1.4 s of CPU
    to convert, deciding alone whether the statement time-out fired (``tests/test_adversary_round39.py``). Every
    row is still kept with the same probability: the race's combinations are coarser, never differently weighted."""
    ref = exp.column(column, quoted=True)
    return exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Is(this=ref, expression=exp.Null())), true=_lit(1))])


def _nested(sql_type: str) -> bool:
    """Whether ``sql_type`` is a LIST, ARRAY, STRUCT, MAP or UNION (DuckDB's or Spark's spelling)."""
    t = sql_type.strip().upper()
    return t.endswith(("]", ">")) or t.startswith(("STRUCT", "MAP", "UNION", "ARRAY"))


def _raw_key(a: ir.Aggregate) -> str:
    """What an aggregate reads, for sharing one raw column between aggregates of the same input (each kind of input
    under its own prefix: a column may be named ``present:a``)."""
    if a.value is not None:  # COUNT(DISTINCT expr) reads its canonical key, the others a DOUBLE
        return ("key:" if a.kind == ir.COUNT_DISTINCT else "expr:") + a.value.sql(dialect="duckdb")
    if a.column is None:
        return ""
    return ("present:" if a.kind == ir.COUNT_COL else "col:") + a.column


def _one_row_per_group(plan: ir.QueryPlan, unit_column: str, salt: str, *, where: exp.Expression | None,
                       use_public_domain: bool, ops: SqlOps, coded: frozenset[str] = frozenset(),
                       compact: Sequence[str] = ()) -> exp.Select:
    """k = 1 with values: one row per (unit, group) with its values (``__n`` = 1, and per
    aggregate its ``_c`` / ``_s`` columns), the kept row chosen by :func:`_pick_one_row` over the
    raw values of the columns the aggregates read (clamped after the choice: the same values
    :func:`base_relation` computes, of the same uniformly chosen row). COUNT(DISTINCT ...) of a weakly hashed
    scalar type (text, a row's text, HUGEINT, a wide DECIMAL) reads what it lists, the digest of its salted text
    (:func:`distinct_value`), computed before the race, as :func:`base_relation` does before the windows: the
    race groups and carries the digest, never the text (one person's distinct texts of a well compressed file
    are not held by the race's grouping). Such values are equal exactly when their texts are. A nested value
    still races as it is (its members' floats, -0.0 and 0.0, are one value to the grouping, two texts) and is
    listed after the race. The ``compact`` text keys race as their compact keys (:func:`compact_key`)."""
    keys = [k.name for k in plan.keys]
    schema = plan.table.schema
    raw: dict[str, str] = {}
    source: dict[str, exp.Expression] = {}

    def read(a: ir.Aggregate) -> str:  # a digest is not shared with an aggregate that reads the value itself
        t = distinct_type(a, schema)
        digested = a.kind == ir.COUNT_DISTINCT and weakly_hashed(t) and not _nested(t)
        return "digest:" + _raw_key(a) if digested else _raw_key(a)

    for a in plan.aggregates:
        if a.kind in (ir.COUNT_COL, ir.COUNT_DISTINCT, *ir.VALUE_KINDS):
            src = read(a)
            if src not in raw:
                raw[src] = f"__r{len(raw)}"
                plain = src.removeprefix("digest:")
                source[src] = (_present(plain.removeprefix("present:")) if plain.startswith("present:") else
                               _raw_column(a.column, schema) if a.value is None and a.column is not None
                               else distinct_input(a, schema) if plain.startswith("key:")
                               else aggregate_input(a, schema, ops))
                if src != plain:
                    source[src] = distinct_value(a, schema, source[src], salt, text_digest_of(ops))
    proj: list[exp.Expression] = [exp.alias_(unit_expression(unit_column, plan.table.schema, ops, salt), "__unit", copy=False)]
    proj += [_key_item(k, plan.table.schema, ops, coded, compact, salt) for k in plan.keys]
    proj += [exp.alias_(source[c], r, copy=False) for c, r in raw.items()]
    base = _rows_of(plan, unit_column, proj, where, use_public_domain, ops).subquery("__base", copy=False)
    pkeys = keys
    if keys and not set(keys) <= coded:  # (:func:`spread_keys`)
        base, pkeys = spread_keys(base, keys, salt, ops, key_types(plan, coded)), [*keys, SPREAD]
    # the raw columns of COUNT(col) keep their type; COUNT(DISTINCT expr) its key's (a digest, above, is no
    # weakly hashed value); every other value is a DOUBLE
    types = {r: schema.get(c.removeprefix("col:").lower(), "") for c, r in raw.items() if c.startswith("col:")}
    types |= {raw[read(a)]: distinct_type(a, schema) for a in plan.aggregates
              if a.kind == ir.COUNT_DISTINCT and a.value is not None and read(a) == _raw_key(a)}
    picked = _pick_one_row(base, "__unit", pkeys, list(raw.values()), salt, ops=ops, coded=coded, value_types=types)

    def present(r: str) -> exp.Expression:
        return exp.Case(ifs=[exp.If(this=exp.Is(this=_col(r), expression=exp.Null()), true=_lit(0))], default=_lit(1))

    out: list[exp.Expression] = [_col("__unit"), *[_col(k) for k in keys], exp.alias_(_lit(1), "__n", copy=False)]
    for a in plan.aggregates:
        if a.kind not in (ir.COUNT_COL, ir.COUNT_DISTINCT, *ir.VALUE_KINDS):
            continue
        r = raw[read(a)]
        if a.kind == ir.COUNT_COL:
            out.append(exp.alias_(present(r), f"{a.name}_c", copy=False))
        elif a.kind == ir.COUNT_DISTINCT:  # what it lists: its digest (above), or listed now
            listed = _col(r) if read(a) != _raw_key(a) else distinct_value(a, schema, _col(r), salt, text_digest_of(ops))
            out.append(exp.alias_(exp.func("list_value", listed), f"{a.name}_l", copy=False))
        elif a.kind == ir.SUM:
            out.append(exp.alias_(_clamped_input(a, plan.table.schema, ops, raw=r), f"{a.name}_s", copy=False))
        else:
            v = _clamped_input(a, plan.table.schema, ops, raw=r)
            out.append(exp.alias_(v, f"{a.name}_s", copy=False))
            out.append(exp.alias_(exp.Case(ifs=[exp.If(this=exp.Is(this=v.copy(), expression=exp.Null()), true=_lit(0))],
                                           default=_lit(1)), f"{a.name}_c", copy=False))
            if a.kind in ir.VARIANCE_KINDS:
                out.append(exp.alias_(_fixed_square(a, v, ops), f"{a.name}_q", copy=False))
    return exp.select(*out).from_(picked, copy=False)


# -- bounded aggregation ------------------------------------------------------------------------


def bounded_query(
    plan: ir.QueryPlan,
    caps: ContributionModel,
    *,
    salt: str = SALT_PLACEHOLDER,
    tau: int | None = None,
    unit_column: str,
    where: exp.Expression | None = None,
    use_public_domain: bool = True,
    ops: SqlOps | None = None,
) -> exp.Expression:
    """The bounded aggregation as a sqlglot AST (render it with ``rewrite.render`` for the
    dialect of ``ops``, DuckDB's by default): base rows, then the caps L, k, C_u in that order,
    then one row per group with ``__users`` and the aggregates' bounded sums."""
    ops = ops if ops is not None else DEFAULT_OPS
    keys = [k.name for k in plan.keys]
    pairs = pair_sources(plan)
    need_values = any(a.kind in (ir.COUNT_COL, ir.COUNT_DISTINCT, *ir.VALUE_KINDS) for a in plan.aggregates)

    # k = 1 with values and no L: one aggregate picks each (unit, group)'s row (no windows)
    # (not with a pair aggregate, whose two values the one-row pick does not carry: the windows keep its rows)
    one_row = (caps.rows_finite and caps.max_rows_per_group == 1 and need_values and not caps.unit_rows_finite
               and not any(a.kind in ir.PAIR_KINDS for a in plan.aggregates))

    # public key domains: rows with keys outside them are dropped before any group is chosen; with
    # no per-unit row cap L (which must not count them), on the (unit, group) pairs, not the rows
    pairs_domain = (use_public_domain and bool(keys) and not caps.unit_rows_finite
                    and any(k.domain is not None for k in plan.keys))
    row_domain = use_public_domain and not pairs_domain
    # text keys of small public domains as their codes (NULL outside the domain), filtered on the pairs
    coded = coded_keys(plan, ops) if pairs_domain else frozenset()
    # text keys, counts of units only: the group cap over the rows, before any grouping (no digest per row)
    over_rows = bool(keys) and rows_group_cap(plan, caps, ops, coded)

    # text keys as their compact keys (a long text as its salted digest) up to the released groups, which then get
    # their texts (:func:`compact_key`, :func:`with_key_texts`)
    compact = compact_keys(plan, coded) if keys else ()

    # 1. base rows ------------------------------------------------------------------------------
    base, value_cols = base_relation(plan, unit_column, where=where, use_public_domain=row_domain, ops=ops,
                                     coded=coded, salt=salt, compact=compact)
    rows_src: exp.Expression = base.subquery("__base", copy=False)

    # 2. rows per unit (L) ------------------------------------------------------------------------
    if caps.unit_rows_finite:
        rows_src = cap_rows_per_unit(rows_src, "__unit", [*keys, *value_cols], caps.max_rows_per_unit, salt,
                                     alias="__unit_rows", ops=ops, draw=True)
    # every (unit, group) partition and grouping before the group cap also goes by a salted hash of it
    # (:func:`spread_keys`): keys crafted to collide in the engine's own hash made them quadratic (after
    # L, which partitions by the unit alone)
    pkeys = keys
    if keys and not set(keys) <= coded and not one_row and not over_rows:
        # (a compact key is text: a short key is itself)
        rows_src, pkeys = spread_keys(rows_src, keys, salt, ops, key_types(plan, coded)), [*keys, SPREAD]

    # 3. rows per (unit, group) (k) ---------------------------------------------------------------
    if caps.rows_finite and need_values and not one_row:
        rows_src = cap_rows_per_group(rows_src, "__unit", pkeys, value_cols, caps.max_rows_per_group, salt, ops=ops,
                                      draw=True, coded=coded)
    # one row per unit and group, counts only: the (unit, group) pairs themselves, no per-pair count
    pairs_only = caps.rows_finite and caps.max_rows_per_group == 1 and not need_values
    # (a backend, or a test, without the mask plan sets count_units_by_mask to None)
    if pairs_only and caps.groups_finite and len(keys) == 1 and keys[0] in coded and callable(_coder(ops).count_units_by_mask):
        # one coded key, counts of units only: each unit's groups as one mask, capped per unit, no pairs
        key = plan.keys[0]
        assert key.domain is not None
        counted = _coder(ops).count_units_by_mask(rows_src, keys[0], key.domain, int(caps.max_groups_per_unit), salt).subquery("__chosen", copy=False)
        cols: list[exp.Expression] = [_col(keys[0]), _col("__users")]
        cols += [exp.alias_(_col("__users"), a.name, copy=False) for a in plan.aggregates if a.kind == ir.COUNT_STAR]
        by_units = exp.select(*cols).from_(counted, copy=False)
        if tau is not None and tau > 1:
            by_units = by_units.where(exp.GTE(this=_col("__users"), expression=_lit(tau)), copy=False)
        return by_units
    n_expr: exp.Expression = exp.Count(this=exp.Star())
    if caps.rows_finite and not need_values:
        # counts only: capping the count per (unit, group) at k is the same as keeping k rows
        n_expr = ops.least(n_expr, _lit(caps.max_rows_per_group))
    part = [_col("__unit")] + [_col(k) for k in pkeys]
    ug_proj: list[exp.Expression] = [_col("__unit")] + [_col(k) for k in pkeys]
    if not pairs_only:
        ug_proj.append(exp.alias_(n_expr, "__n", copy=False))
    for a in plan.aggregates:
        if a.kind == ir.COUNT_COL:
            ug_proj.append(exp.alias_(exp.Count(this=_col(f"{a.name}_v")), f"{a.name}_c", copy=False))
        elif a.kind == ir.SUM:
            ug_proj.append(exp.alias_(ops.exact_sum(_col(f"{a.name}_v")), f"{a.name}_s", copy=False))
        elif a.kind in ir.PAIR_KINDS:
            lead, reads = pairs[a.name]
            if lead != a.name:
                continue  # read from the pair's first aggregate's sums
            v, w = f"{a.name}_v", f"{a.name}_w"
            assert a.second is not None
            ug_proj.append(exp.alias_(exp.Count(this=_col(v)), f"{a.name}_c", copy=False))
            if "_sum" in reads:
                ug_proj.append(exp.alias_(ops.exact_sum(_col(v)), f"{a.name}_s", copy=False))
            if "_sumb" in reads:
                ug_proj.append(exp.alias_(ops.exact_sum(_col(w)), f"{a.name}_t", copy=False))
            if "_ab" in reads:
                ug_proj.append(exp.alias_(ops.exact_sum(_fixed_product(a, _col(v), _col(w), ops)), f"{a.name}_p",
                                          copy=False))
            if "_sq" in reads:
                ug_proj.append(exp.alias_(ops.exact_sum(_fixed_square(a, _col(v), ops)), f"{a.name}_q", copy=False))
            if "_sqb" in reads:
                ug_proj.append(exp.alias_(ops.exact_sum(_fixed_square(a.second, _col(w), ops)), f"{a.name}_r",
                                          copy=False))
        elif a.kind == ir.AVG or a.kind in ir.VARIANCE_KINDS:
            ug_proj.append(exp.alias_(ops.exact_sum(_col(f"{a.name}_v")), f"{a.name}_s", copy=False))
            ug_proj.append(exp.alias_(exp.Count(this=_col(f"{a.name}_v")), f"{a.name}_c", copy=False))
            if a.kind in ir.VARIANCE_KINDS:
                ug_proj.append(exp.alias_(ops.exact_sum(_fixed_square(a, _col(f"{a.name}_v"), ops)), f"{a.name}_q", copy=False))
        elif a.kind == ir.COUNT_DISTINCT:
            # the distinct values of this (unit, group)'s kept rows, as base_relation lists them (list_distinct
            # drops NULL)
            ug_proj.append(exp.alias_(exp.func("list_distinct", exp.func("list", _col(f"{a.name}_v"))), f"{a.name}_l",
                                      copy=False))
    if over_rows:
        # the first C_u groups of each unit, over its rows, one row each: its at most C_u (unit, group) pairs
        kept = cap_groups_per_unit(rows_src, "__unit", keys, ["__unit", *keys], caps.max_groups_per_unit, salt,
                                   alias="__kept_rows", ops=ops, coded=coded, over_rows=True)
        ug = exp.select(*[_col(c) for c in ["__unit", *keys]]).from_(kept, copy=False)
    elif one_row:
        ug = _one_row_per_group(plan, unit_column, salt, where=where, use_public_domain=row_domain, ops=ops,
                                coded=coded, compact=compact)
    elif pairs_only:
        ug = exp.select(*ug_proj).from_(rows_src, copy=False).distinct(copy=False)
    else:
        ug = exp.select(*ug_proj).from_(rows_src, copy=False).group_by(*part, copy=False)

    # a coded key's filter on the pairs is pushed by DuckDB below the aggregation onto the rows, where the
    # code is then computed twice per row (the filter's, the projection's): the group cap window drops them
    in_window = bool(coded) and caps.groups_finite and getattr(ops, "group_cap_window", False)
    if pairs_domain and not over_rows:  # (over rows: every key with a domain is coded, dropped by the window)
        ug = _in_domain_pairs(ug.subquery("__pairs_all", copy=False), plan, [c.alias_or_name for c in ug.selects], ops,
                              coded, coded_later=in_window, compact=compact, salt=salt)

    # 4. groups per unit (C_u) --------------------------------------------------------------------
    chosen: exp.Expression = ug.subquery("__ug", copy=False)
    if caps.groups_finite and keys and not over_rows:
        fields = [c.alias_or_name for c in ug.selects if c.alias_or_name != "__unit"]
        chosen = cap_groups_per_unit(chosen, "__unit", keys, fields, caps.max_groups_per_unit, salt, ops=ops,
                                     coded=coded)

    # 5. per-group aggregation --------------------------------------------------------------------
    def zsum(col: str) -> exp.Expression:
        return exp.func("coalesce", exp.Sum(this=_col(col)), _lit(0))

    def vsum(col: str) -> exp.Expression:
        # the exact fixed-point total as integer text (released_columns: its public scale)
        return exact_text(ops.exact_sum(_col(col)))

    out: list[exp.Expression] = [exp.alias_(_coder(ops).domain_text(_col(k)), k, copy=False) if k in coded else _col(k)
                                 for k in keys]
    out.append(exp.alias_(exp.Count(this=exp.Star()), "__users", copy=False))
    for a in plan.aggregates:
        if a.kind == ir.COUNT_STAR:
            out.append(exp.alias_(exp.Count(this=exp.Star()) if pairs_only else zsum("__n"), a.name, copy=False))
        elif a.kind == ir.COUNT_COL:
            out.append(exp.alias_(zsum(f"{a.name}_c"), a.name, copy=False))
        elif a.kind == ir.SUM:
            out.append(exp.alias_(vsum(f"{a.name}_s"), a.name, copy=False))
        elif a.kind in ir.PAIR_KINDS and pairs[a.name][0] == a.name:
            out.append(exp.alias_(zsum(f"{a.name}_c"), a.name + "_cnt", copy=False))
            out += [exp.alias_(vsum(f"{a.name}_{x}"), a.name + suffix, copy=False)
                    for x, suffix in (("s", "_sum"), ("t", "_sumb"), ("p", "_ab"), ("q", "_sq"), ("r", "_sqb"))
                    if suffix in pairs[a.name][1]]
        elif a.kind == ir.AVG or a.kind in ir.VARIANCE_KINDS:
            out.append(exp.alias_(vsum(f"{a.name}_s"), a.name + "_sum", copy=False))
            out.append(exp.alias_(zsum(f"{a.name}_c"), a.name + "_cnt", copy=False))
            if a.kind in ir.VARIANCE_KINDS:
                out.append(exp.alias_(vsum(f"{a.name}_q"), a.name + "_sq", copy=False))
        elif a.kind == ir.COUNT_DISTINCT:
            values = exp.func("list_distinct", exp.func("flatten", exp.func("list", _col(f"{a.name}_l"))))
            out.append(exp.alias_(exp.func("coalesce", exp.func("len", values), _lit(0)), a.name))
    grouped: list[exp.Expression] = [_col(k) for k in keys]
    # a coded key is a small integer of the owner's domain; a person left with at most KEY_SPREAD_ABOVE keys
    # cannot make the grouping slow (64 keys of one hash: 2 000 probes)
    if keys and not set(keys) <= coded and caps.max_groups_per_unit > KEY_SPREAD_ABOVE:
        # a column of a subquery: as an expression of the keys in GROUP BY, the optimiser dropped it
        chosen = (exp.select("*", exp.alias_(key_spread(keys, salt, ops, key_types(plan, coded)), KEY_SPREAD))
                  .from_(chosen, copy=False).subquery("__key_spread_rows", copy=False))
        grouped.append(_col(KEY_SPREAD))
    final = exp.select(*out).from_(chosen, copy=False)
    if keys:
        final = final.group_by(*grouped, copy=False)
        if tau is not None and tau > 1:
            final = final.having(exp.GTE(this=exp.Count(this=exp.Star()), expression=_lit(tau)), copy=False)
    if compact:  # the released groups' texts (a long key's, read again for those groups only)
        final = with_key_texts(final, plan, unit_column, compact, salt, where=where, use_public_domain=row_domain,
                               ops=ops)
    return final


# -- bounded histogram (range workloads) --------------------------------------------------------


#: a value within this many bin widths below a bin edge is on the edge (as in ``workload._bins_for``)
_BIN_EDGE_TOLERANCE = 1e-9


def exact_scale(dim: Dim, dialect: str) -> int | None:
    """The decimal scale s of ``dim``'s values when its bins are computed exactly in integers (its values
    times 10^s as HUGEINT: an integer column, s = 0, or a DECIMAL(p, s) with s <= 19, over a numeric
    domain, on DuckDB and Spark: ``SqlOps.scaled_integer``), else None (the bins are computed in doubles).
    Public: the column's declared type, the domain and the engine."""
    if dialect not in ("duckdb", "spark") or dim.domain.kind != "numeric":
        return None
    t = (dim.type_text or "").upper().replace(" ", "")
    if t in INTEGER_TYPES:
        return 0
    m = re.fullmatch(r"(?:DECIMAL|NUMERIC)\((\d+),(\d+)\)", t)
    # (x - trunc(x)) * 10^s is a DECIMAL of up to 2s digits: at most 38 whatever the value
    return int(m.group(2)) if m is not None and int(m.group(2)) <= 19 else None


def _exact_bin(dim: Dim, col: exp.Expression, ops: SqlOps) -> tuple[exp.Expression, exp.Expression] | None:
    """(bin index, inside the domain) of an integer or DECIMAL column in exact integer arithmetic: a value
    v = V / 10^s is in bin floor((v - lo) * bins / (hi - lo)), the bounds read as written (``Dim.exact_pos``).
    In doubles, 1000000000000.002 of a DECIMAL(38,10) over bins 0.001 wide is 1000000000000.00195..., in the
    bin before, and the BIGINT 2^53 + 1 is 2^53. V is clamped to the domain first, so no value can overflow
    the HUGEINT arithmetic (Spark: DECIMAL(38, 0), below 10^38; its bounds are checked here, from public numbers
    only); None where they do not fit (the bins are then computed in doubles)."""
    scale = exact_scale(dim, ops.dialect)
    if scale is None:
        return None
    dom, unit = dim.domain, 10 ** scale
    lo, hi = Fraction(Decimal(repr(float(dom.lo)))), Fraction(Decimal(repr(float(dom.hi))))
    v_lo, v_hi = math.ceil(lo * unit), math.ceil(hi * unit)  # inside: v_lo <= V < v_hi
    per = Fraction(dom.bins) / ((hi - lo) * unit)  # bins per step of V
    off = (v_lo - lo * unit) * per  # the position of V = v_lo, >= 0
    q = math.lcm(per.denominator, off.denominator)
    x, y = int(per * q), int(off * q)
    if max(abs(v_lo), abs(v_hi), (v_hi - v_lo) * x + y) >= 1 << 125:
        return None

    def big(v: int) -> exp.Expression:
        return ops.typed_literal(v, "HUGEINT")

    v = ops.scaled_integer(col, scale)
    clamped = ops.least(exp.func("greatest", v.copy(), big(v_lo)), big(v_hi))
    num = exp.Add(this=exp.Mul(this=exp.Paren(this=exp.Sub(this=clamped, expression=big(v_lo))), expression=big(x)),
                  expression=big(y))
    index = exp.IntDiv(this=exp.Paren(this=num), expression=big(q))
    # both engines' integer division (DuckDB's //, Spark's DIV: a BIGINT) of a number >= 0: its floor
    index.meta[DIALECT_MARK] = ops.dialect
    inside = exp.And(this=exp.GTE(this=v.copy(), expression=big(v_lo)), expression=exp.LT(this=v.copy(), expression=big(v_hi)))
    return index, inside


def bounded_histogram(wl: Workload, unit: str, cap: float, salt: str, *, ops: SqlOps | None = None,
                      groups: Caps | None = None) -> exp.Expression:
    """A range workload's bounded histogram: the rows in the declared domain passing the base
    conditions, counts per bin (``__b0``[, ``__b1``], ``__n``).

    * ``groups=None`` (a workload of range counts: an ungrouped rule): at most ``cap`` (L) rows
      per unit (:func:`cap_rows_per_unit`). One unit changes it by at most L in L1 norm.
    * ``groups`` = (C_u, k, L) (a histogram, a GROUP BY over the bins: the grouped rule, the same
      as any GROUP BY): at most L rows per unit when L is finite, then at most k rows per unit
      and bin, in at most C_u bins per unit. One unit changes it by at most min(C_u * k, L).
    """
    ops = ops if ops is not None else DEFAULT_OPS
    src = exp.to_table(wl.table.view or source_name(wl.table.name), quoted=True)
    proj: list[exp.Expression] = [exp.alias_(unit_expression(unit, wl.table.schema, ops, salt), "__unit")]
    cond: exp.Expression = exp.Not(this=exp.Is(this=exp.column(unit, quoted=True), expression=exp.Null()))
    if wl.base_where is not None:
        cond = exp.And(this=exp.Paren(this=guard(wl.base_where, wl.table.schema)), expression=cond)
    for i, d in enumerate(wl.dims):
        col = exp.column(d.column, quoted=True)
        dom = d.domain
        if dom.kind == "numeric":
            num = ops.try_cast(col.copy(), "DOUBLE")
            pos: exp.Expression = exp.Div(
                this=exp.Paren(this=exp.Sub(this=num.copy(), expression=exp.Literal.number(float(dom.lo)))),
                expression=exp.Literal.number(dom.width),
            )
            inside = exp.And(
                this=exp.GTE(this=num.copy(), expression=exp.Literal.number(float(dom.lo))),
                expression=exp.LT(this=num.copy(), expression=exp.Literal.number(float(dom.hi))),
            )
        else:
            assert dom.bin_seconds is not None
            ts = ops.try_cast(col.copy(), "TIMESTAMP")
            lo_ts = ops.typed_literal(str(dom.lo), "TIMESTAMP")
            hi_ts = ops.typed_literal(str(dom.hi), "TIMESTAMP")
            # in whole microseconds (exact): EPOCH's double of an instant of 2026 is 2.4e-7 s apart, so with
            # 0.1 s bins a value on an edge came out a hair below it, in the bin before
            pos = exp.Div(
                this=exp.Paren(this=exp.Sub(this=ops.epoch_micros(ts.copy()), expression=ops.epoch_micros(lo_ts.copy()))),
                expression=ops.typed_literal(float(Decimal(repr(float(dom.bin_seconds))) * 1_000_000), "DOUBLE"),
            )
            inside = exp.And(this=exp.GTE(this=ts.copy(), expression=lo_ts), expression=exp.LT(this=ts.copy(), expression=hi_ts))
        if dom.kind == "numeric":
            # a value on a bin edge belongs to the bin it starts, as a range endpoint on that edge
            # selects it (``workload._bins_for``, the same 1e-9 bin tolerance): 0.3 / 0.1 is
            # 2.9999999999999996 in floating point, which flooring alone would put in [0.2, 0.3).
            # Date/time edges are whole seconds, exact in EPOCH's double, and a timestamp a few
            # microseconds before midnight is not on the edge: no tolerance there
            pos = exp.Add(this=exp.Paren(this=pos), expression=exp.Literal.number(_BIN_EDGE_TOLERANCE))
        exact = _exact_bin(d, col, ops)
        if exact is not None:
            pos, inside = exact
        else:
            pos = exp.func("floor", pos)
        b = ops.least(ops.try_cast(pos, "BIGINT"), exp.Literal.number(d.n - 1))
        proj.append(exp.alias_(b, f"__b{i}"))
        cond = exp.And(this=cond, expression=inside)
    base: exp.Expression = exp.select(*proj).from_(src, copy=False).where(cond, copy=False).subquery("__base", copy=False)
    bins = [f"__b{i}" for i in range(len(wl.dims))]
    # the kept rows are read once (one chain of subqueries): the L cap may take the engine's per-row draw
    if groups is not None:
        if groups.unit_rows_finite:
            base = cap_rows_per_unit(base, "__unit", bins, groups.max_rows_per_unit, salt, alias="__kept", ops=ops,
                                     draw=True)
        count: exp.Expression = exp.Count(this=exp.Star())
        if groups.rows_finite:
            # counts only: k rows of a (unit, bin) count as LEAST(rows, k) whichever are kept
            count = ops.least(count, _lit(groups.max_rows_per_group))
        pairs: exp.Expression = (exp.select(_col("__unit"), *[_col(b) for b in bins], exp.alias_(count, "__c"))
                                 .from_(base, copy=False).group_by(_col("__unit"), *[_col(b) for b in bins], copy=False)
                                 .subquery("__pairs_hist", copy=False))
        if groups.groups_finite:
            pairs = cap_groups_per_unit(pairs, "__unit", bins, ["__unit", *bins, "__c"], groups.max_groups_per_unit, salt,
                                        alias="__chosen", ops=ops)
        return (exp.select(*[_col(b) for b in bins], exp.alias_(exp.Sum(this=_col("__c")), "__n"))
                .from_(pairs, copy=False).group_by(*[_col(b) for b in bins], copy=False))
    if cap != float("inf"):
        base = cap_rows_per_unit(base, "__unit", bins, cap, salt, alias="__kept", ops=ops, draw=True)
    return (exp.select(*[_col(b) for b in bins], exp.alias_(exp.Count(this=exp.Star()), "__n"))
            .from_(base, copy=False).group_by(*[_col(b) for b in bins], copy=False))


# -- bounded value histograms (quantiles) ---------------------------------------------------------


@dataclass(frozen=True)
class ValueGrid:
    """A public grid over a column's declared bounds: candidates lo + i * step, i = 0..cells
    (the last one capped at hi). A value is counted at its nearest grid point.

    A DATE / TIMESTAMP column (``time_type`` its type name, e.g. ``"DATE"``, ``"TIMESTAMP_NS"``):
    lo, hi and step are seconds since 1970-01-01 00:00:00, and ``time_bounds`` the declared
    bounds (``datetime``) that the value is clamped to in its own type (:func:`clamped_time`),
    ``step_micros`` the step in whole microseconds (exact, for the released points)."""

    column: str
    lo: float
    hi: float
    step: float
    cells: int
    time_type: str = ""
    time_bounds: tuple[Any, Any] | None = None
    step_micros: int = 0


#: the instants a TIMESTAMP_S / _MS column holds exactly, in microseconds
_TIME_UNIT_MICROS = {"TIMESTAMP_S": 1_000_000, "TIMESTAMP_MS": 1_000}


def clamped_time(grid: ValueGrid, ops: SqlOps = DEFAULT_OPS) -> exp.Expression:
    """A DATE / TIMESTAMP column's value clamped to the declared [lo, hi], as DOUBLE seconds since 1970
    (NULL for NULL), total on every value of the column's type: the comparisons are made in the
    column's own type against literals it holds (so a DATE or TIMESTAMP_S far beyond the TIMESTAMP
    range, and DuckDB's +-infinity, compare as they are and clamp to hi or lo), and only a value
    inside [lo, hi] (years 1..9999) is converted: ``CASE WHEN v < lo THEN lo_s WHEN v > hi THEN hi_s
    ELSE epoch(TRY_CAST(v AS TIMESTAMP)) END``. A TIMESTAMP_S / _MS column compares with lo rounded
    up and hi rounded down to its unit (the same rows fall below / above); a TIMESTAMP_NS column
    (1677..2262 only) is compared as ``TRY_CAST(v AS TIMESTAMP)``, which holds every one of its
    values, infinities included."""
    import datetime as dt

    assert grid.time_bounds is not None
    lo, hi = grid.time_bounds
    col: exp.Expression = exp.column(grid.column, quoted=True)
    typ = grid.time_type
    if typ == "DATE":
        lo_lit, hi_lit = ops.typed_literal(lo.date(), "DATE"), ops.typed_literal(hi.date(), "DATE")
    elif typ in _TIME_UNIT_MICROS:
        unit = _TIME_UNIT_MICROS[typ]
        epoch = dt.datetime(1970, 1, 1)
        lo_us, hi_us = ((v - epoch) // dt.timedelta(microseconds=1) for v in (lo, hi))
        up = epoch + dt.timedelta(microseconds=-(-lo_us // unit) * unit)
        down = epoch + dt.timedelta(microseconds=(hi_us // unit) * unit)
        lo_lit, hi_lit = ops.typed_literal(up, typ), ops.typed_literal(down, typ)
    else:
        if typ != "TIMESTAMP":  # TIMESTAMP_NS: every value converts, infinities to infinities
            col = ops.try_cast(col, "TIMESTAMP")
        lo_lit, hi_lit = ops.typed_literal(lo, "TIMESTAMP"), ops.typed_literal(hi, "TIMESTAMP")
    # only a value inside [lo, hi] reaches the conversion (a TIMESTAMP_NS column is one already)
    ts = col.copy() if typ in ("TIMESTAMP", "TIMESTAMP_NS") else ops.try_cast(col.copy(), "TIMESTAMP")
    return exp.Case(ifs=[exp.If(this=exp.LT(this=col.copy(), expression=lo_lit), true=ops.typed_literal(grid.lo, "DOUBLE")),
                         exp.If(this=exp.GT(this=col.copy(), expression=hi_lit), true=ops.typed_literal(grid.hi, "DOUBLE"))],
                    default=ops.epoch_seconds(ts))


def grid_index(grid: ValueGrid, ops: SqlOps = DEFAULT_OPS) -> exp.Expression:
    """The grid point nearest to the clamped value, as BIGINT (NULL for NULL): floor((v - lo) / step + 1/2)."""
    v = clamped_time(grid, ops) if grid.time_type else clamped_value(grid.column, grid.lo, grid.hi, ops=ops)
    pos = exp.Add(this=exp.Div(this=exp.Paren(this=exp.Sub(this=v, expression=_lit(grid.lo))), expression=_lit(grid.step)),
                  expression=exp.Literal.number(0.5))
    return ops.try_cast(exp.func("floor", pos), "BIGINT")


def bounded_value_histograms(plan: ir.QueryPlan, caps: ContributionModel, grids: Sequence[ValueGrid], *,
                             salt: str = SALT_PLACEHOLDER, unit_column: str,
                             ops: SqlOps | None = None) -> exp.Expression:
    """Per group and per grid: how many kept rows have their (clamped) value at each grid
    point (``__q`` the grid's position in ``grids``, ``__b`` the point, ``__n`` the rows).

    The rows are bounded exactly as for any aggregate: at most L rows per unit, then at most k
    rows per (unit, group) (an ungrouped query: L rows per unit), in at most C_u groups per
    unit (public key domains: rows with keys outside the domain are dropped first). So one unit
    changes each touched group's histogram by at most min(k, L) rows in L1 norm, in at most
    min(C_u, L, number of groups) groups. Rows whose value is NULL are kept (they count towards
    the caps) but are in no histogram, as SQL's own quantiles ignore NULL.

    On a backend that draws per row (``ops.row_clock()``), grouped with k = 1 and no L, and
    ungrouped, the rows are kept by the draw and read once (:func:`_histograms_read_once`);
    otherwise by the salted numbering, the kept rows joined back to the chosen groups.
    """
    ops = ops if ops is not None else DEFAULT_OPS
    keys = [k.name for k in plan.keys]
    buckets = [f"__g{i}" for i in range(len(grids))]
    proj: list[exp.Expression] = [exp.alias_(unit_expression(unit_column, plan.table.schema, ops, salt), "__unit")]
    proj += [exp.alias_(key_expression(k, plan.table.schema, ops), k.name) for k in plan.keys]
    proj += [exp.alias_(grid_index(g, ops), b) for g, b in zip(grids, buckets, strict=True)]
    rows: exp.Expression = _rows_of(plan, unit_column, proj, None, True, ops).subquery("__base", copy=False)
    drawn = ops.row_clock() is not None  # the backend draws per row: the kept rows must then be read once
    if drawn and keys and caps.rows_finite and caps.max_rows_per_group == 1 and not caps.unit_rows_finite:
        # k = 1, no L: one row per (unit, group) by one aggregate (as ``bounded_query``'s k = 1),
        # then the group cap over those rows, one per pair (no numbering windows, no join back)
        kept: exp.Expression = _pick_one_row(rows, "__unit", keys, buckets, salt, ops=ops)
        if caps.groups_finite:
            kept = cap_groups_per_unit(kept, "__unit", keys, [*keys, *buckets], caps.max_groups_per_unit, salt,
                                       alias="__chosen", ops=ops)
        ctes = [exp.CTE(this=exp.select(*[_col(c) for c in [*keys, *buckets]]).from_(kept, copy=False),
                        alias=exp.TableAlias(this=exp.to_identifier("__qrows")))]
        return _histograms_read_once(keys, buckets, ctes)
    if drawn and not keys and (caps.unit_rows_finite or caps.rows_finite):
        # ungrouped: each unit's rows kept by their draws (k = 1: one aggregate; k = 2: one aggregate
        # for at most two grids; otherwise one window), not numbered by value and hashed (two windows)
        kept = rows
        if caps.unit_rows_finite:
            kept = cap_rows_per_unit(kept, "__unit", buckets, caps.max_rows_per_unit, salt, alias="__unit_rows",
                                     ops=ops, draw=True)
        if caps.rows_finite and caps.max_rows_per_group == 1:
            kept = _pick_one_row(kept, "__unit", [], buckets, salt, ops=ops)
        elif caps.rows_finite:
            kept = cap_rows_per_group(kept, "__unit", [], buckets, caps.max_rows_per_group, salt, ops=ops, draw=True)
        ctes = [exp.CTE(this=exp.select(*[_col(c) for c in buckets]).from_(kept, copy=False),
                        alias=exp.TableAlias(this=exp.to_identifier("__qrows")))]
        return _histograms_read_once(keys, buckets, ctes)
    if caps.unit_rows_finite:
        rows = cap_rows_per_unit(rows, "__unit", [*keys, *buckets], caps.max_rows_per_unit, salt, alias="__unit_rows",
                                 ops=ops)
    if caps.rows_finite:
        rows = cap_rows_per_group(rows, "__unit", keys, buckets, caps.max_rows_per_group, salt, ops=ops)
    ctes = [exp.CTE(this=exp.select("*").from_(rows, copy=False), alias=exp.TableAlias(this=exp.to_identifier("__qcapped")))]
    kept = exp.select("__unit", *keys, *buckets).from_("__qcapped", copy=False)
    if keys and caps.groups_finite:
        pairs = (exp.select(_col("__unit"), *[_col(k) for k in keys]).from_("__qcapped", copy=False).distinct(copy=False)
                 .subquery("__pairs_q", copy=False))
        chosen = cap_groups_per_unit(pairs, "__unit", keys, ["__unit", *keys], caps.max_groups_per_unit, salt,
                                     alias="__chosen", ops=ops)
        on: exp.Expression = exp.EQ(this=exp.column("__unit", table="__r"), expression=exp.column("__unit", table="__chosen"))
        for k in keys:
            on = exp.And(this=on, expression=exp.NullSafeEQ(this=exp.column(k, table="__r"),
                                                           expression=exp.column(k, table="__chosen")))
        kept = (exp.select(*[exp.column(c, table="__r") for c in ["__unit", *keys, *buckets]])
                .from_(exp.to_table("__qcapped", alias="__r"), copy=False).join(chosen, on=on, join_type="inner", copy=False))
    ctes.append(exp.CTE(this=kept, alias=exp.TableAlias(this=exp.to_identifier("__qrows"))))
    parts: list[exp.Select] = []
    for i, b in enumerate(buckets):
        parts.append(
            exp.select(*[_col(k) for k in keys], exp.alias_(_lit(i), "__q"), exp.alias_(_col(b), "__b"),
                       exp.alias_(exp.Count(this=exp.Star()), "__n"))
            .from_("__qrows", copy=False)
            .where(exp.Not(this=exp.Is(this=_col(b), expression=exp.Null())), copy=False)
            .group_by(*[_col(k) for k in keys], _col(b), copy=False)
        )
    union: exp.Expression = parts[0]
    for p in parts[1:]:
        union = exp.union(union, p, distinct=False, copy=False)
    q = exp.select("*").from_(union.subquery("__hist", copy=False) if len(parts) > 1 else parts[0].subquery("__hist"),
                              copy=False)
    q.set("with_", exp.With(expressions=ctes))
    return q


def _histograms_read_once(keys: Sequence[str], buckets: Sequence[str], ctes: list[exp.CTE]) -> exp.Select:
    """The histograms of :func:`bounded_value_histograms` (columns keys, ``__q``, ``__b``, ``__n``)
    from the kept rows ``__qrows`` (the last CTE), which are read once: rows kept by fresh draws
    (``ops.row_clock()``) would be drawn again by a second read. Several grids: each row's
    (grid, point) pairs unnested in lockstep (DuckDB), then one aggregate."""
    if len(buckets) == 1:
        flat: exp.Expression = exp.select(*[_col(k) for k in keys], exp.alias_(_lit(0), "__q"),
                                          exp.alias_(_col(buckets[0]), "__b")).from_("__qrows", copy=False)
    else:
        grid = exp.Unnest(expressions=[exp.Array(expressions=[_lit(i) for i in range(len(buckets))])])
        point = exp.Unnest(expressions=[exp.Array(expressions=[_col(b) for b in buckets])])
        flat = exp.select(*[_col(k) for k in keys], exp.alias_(grid, "__q"), exp.alias_(point, "__b")).from_(
            "__qrows", copy=False)
    hist = (exp.select(*[_col(k) for k in keys], _col("__q"), _col("__b"), exp.alias_(exp.Count(this=exp.Star()), "__n"))
            .from_(flat.subquery("__points", copy=False), copy=False)
            .where(exp.Not(this=exp.Is(this=_col("__b"), expression=exp.Null())), copy=False)
            .group_by(*[_col(k) for k in keys], _col("__q"), _col("__b"), copy=False))
    q = exp.select("*").from_(hist.subquery("__hist", copy=False), copy=False)
    q.set("with_", exp.With(expressions=ctes))
    return q
