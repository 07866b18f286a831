"""The SQL of a join query for DP-S4S and R2T, composed over a backend's ``SqlOps``.

One relation per input (its needed columns renamed ``<alias>__<column>``; the WHERE conjuncts
over that input alone; with an enforced Delta, then at most n rows per value of the column it
joins on, chosen by :func:`dpsql.rewrite.bound.cap_rows`), then only the rows whose key value is held once in the base table for an input the
join enters through a declared key (:func:`_unique_filter`), the inner equi-join, the other WHERE
conjuncts (their parts of fixed width over one input that read a text or BLOB key computed by that input's projection:
:func:`hoisted`), every condition rendered total by the typer (:func:`dpsql.rewrite.bound.guard`). The inputs
are joined left-deep in the order :func:`dpsql.plan.joins.join_sequence` decides from the catalog alone
(the table holding many rows per key first, each table entered through a key on the right of its join,
the side DuckDB builds on): a private read runs in the written order, never in one chosen from row counts.

Text is compared under the binary collation: each input's text columns are re-projected as
``x COLLATE "binary"`` (:func:`dpsql.rewrite.bound.binary_text`) right after that input's own WHERE
conjuncts (which keep the owner's collation, as on a single table), and so are the key columns read
from base tables by :func:`_unique_filter` and :func:`_lookup`. Every later equi-join condition,
Delta cap partition, owner grouping, tuple identity and lookup then tells 'Z' from 'z' whatever the
connection's ``default_collation`` or a column's declared ``COLLATE NOCASE``: a collation that
merged two people would let one person's removal change another's kept tuples (the sensitivities
below assume one person per value). Results equal those under no collation.

Key values are hashed under the per-query secret salt too (:class:`Spread`): every equi-join
condition also compares the keyed hash of both sides' keys, and the unique-key filter's GROUP BY,
the semi-joins before the Delta caps, the lookups' DISTINCTs, joins and groupings and the tuple
identity's partitions also go by it, as a column. One person's rows could otherwise hold thousands of key
values crafted to collide in the engine's public hash, and make those hash tables probe
quadratically (a timing channel: ``benchmarks/hash_collisions.py --joins``). The keyed hash is a
function of the key (equal keys, cast to one type, hash alike), so every match and group is the
same and no choice changes.

Per join tuple:

* its **weight(s)** on an integer grid: COUNT(*) weighs 1; SUM(expr) weighs
  ``floor(clamp(expr, lo, hi) / hi * 2^20)`` units of ``hi / 2^20`` (its positive part), and,
  when lo < 0, ``floor(max(-clamp, 0) / -lo * 2^20)`` units of ``-lo / 2^20`` (its negative
  part). Rounding down each tuple's weight is a per-tuple map: it changes no sensitivity; on
  integers every sum below is exact;
* an identity ``__tid`` (only when the sample is keyed, below): the text of what the tuple carries to the
  truncation -- its weights and its user columns (the owner, or each slot's start columns) --
  each piece length-prefixed (``n`` for NULL, ``v<length>:<text>``), so the text is injective in
  those values, followed by ``#<d>`` with ``d = ROW_NUMBER() OVER (PARTITION BY those columns)``.
  Tuples with the same content are interchangeable (every later step sees only that content),
  so which of them gets which ``d`` does not matter: the multiset of identities is a function of
  the join's content alone. Hence it is the same on every engine and under a re-executed Spark
  task (a global ``ROW_NUMBER() OVER ()`` is neither), and it is distinct for every tuple;
* the **Poisson sample** at rate q, in one of two forms chosen from public facts only (the backend
  and the plan, :func:`_sample_clock`, :func:`reads_sample_once`):

  - **drawn** (DuckDB on a connection the engine opened itself, ``ops.row_clock()`` not None, and
    a sample the query reads exactly once: :func:`truncated_sums`, and :func:`sampled_tuples` with
    no looked-up slot): each tuple draws ``RANDOM()`` once, in a projection over the join
    (``__draw``), and is kept when ``__draw * 2^32 < floor(q 2^32)``; no identity is built.
    Claim: DuckDB's ``RANDOM()`` is a fresh uniform per row (a 64-bit PCG output over 2^64, rounded
    to a double; per-thread generators seeded from OS entropy, which nobody else reaches on the
    engine's own connection), so the keep decisions are independent Bernoulli(q') across tuples,
    identical tuples included, and across queries, independent of the data, with
    q' <= floor(q 2^32)/2^32 <= q (rounding to a double is monotone and the threshold is a double:
    a draw below it comes from an integer below it). Read once, so every later step sees one
    sample: a second read (a CTE referenced twice, which DuckDB may or may not materialise) would
    draw again, and the tuples of one read would miss the other's (``tests/test_join_sampling_drawn.py``:
    the rate, independence within a person and across queries, one read; each with a negative
    control). Not reproducible: Spark, the portable hash (zero-noise comparisons with Spark), a
    caller's connection (its ``RANDOM()`` may have been seeded) and the seeded test sessions
    (``dpsql.testing.use_noise``) take the keyed form;
  - **keyed** (everywhere else): ``SqlOps.bernoulli_keep(['__tid'], salt, q)``, SHA-256 of the
    per-query secret salt and the tuple's identity, first 52 bits compared with floor(q 2^52).
  Claim (computational): SHA-256 keyed by a fresh 128-bit secret salt is indistinguishable from
  a random function, so the keep decisions are independent Bernoulli(q') with q' = floor(q 2^52)/2^52
  <= q, as Lemma 3.1 needs (the accounted q is an upper bound: eps' grows with q). The salt
  never leaves the process; the identities differ per tuple (injective text, distinct ``d``
  among equal content), so the draws are independent whatever the data
  (``tests/test_backend_ops.py``: ``test_bernoulli_keep_has_rate_q`` and
  ``test_bernoulli_keep_is_independent_across_rows_and_salts`` check the rate and independence).
  q = 1 keeps all.

Two outputs:

* :func:`sampled_tuples` -- the general case: per sampled tuple its weight(s) and per user slot
  the person's id (``<person table>:<value>``, the value cast to the type of the person's unit
  column; NULL where the slot's own column is NULL: it reaches nobody) or, for a chain looked up
  through keys, the LIST of every person reached through every row holding each value (a key's
  uniqueness is assumed by the catalog, never trusted: duplicates attach several people), a
  value that reaches no row attaching the synthetic user ``~<table>.<key>:<value>`` (so a
  dangling reference stays truncated at tau). Only the sample reaches Python.
* :func:`truncated_sums` -- the single-owner fast path: per owner the total weight of its
  sampled tuples, then for every tau of the public grid Sum_u min(tau, total_u) (tuples whose
  owner is NULL reach nobody and count in full), computed in the engine in exact integer
  arithmetic and returned as text; the LP's closed form when each tuple has one user.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.errors import ParseError

from dpsql.catalog import TableSpec
from dpsql.engine.base import SqlOps, source_name, text_digest_of
from dpsql.errors import UnsupportedQueryError
from dpsql.plan import ir
from dpsql.plan.joins import SEP, _direct, _type_family, flat, join_sequence, where_conjuncts
from dpsql.plan.joins import parts as key_parts
from dpsql.plan.typer import CAST_FROM, DIGEST_TYPE, TypeRefusal, type_checked, type_predicate
from dpsql.rewrite.bound import (
    binary_text,
    cap_rows,
    guard,
    is_text,
    keyed_digest,
    salted_text,
    weakly_hashed,
)

#: weight grid of sums: a tuple's weight is a whole number of 2^-20 of its bound
SUM_UNITS = 1 << 20


@dataclass(frozen=True)
class Part:
    """One truncated sum: the positive part (sign +1, scale hi) or the negative part (sign -1,
    scale -lo) of a SUM, or the count (sign +1, scale 1, units 1)."""

    name: str
    sign: int
    scale: float  #: a unit of normalised weight is worth ``scale`` in the answer
    units: int  #: integer weight per unit of normalised weight (1 for counts, 2^20 for sums)


def parts_of(jp: ir.JoinPlan) -> list[Part]:
    if jp.kind in (ir.COUNT_STAR, ir.COUNT_COL):
        return [Part("__w0", 1, 1.0, 1)]
    lo, hi = jp.bounds
    out: list[Part] = []
    if hi > 0:
        out.append(Part(f"__w{len(out)}", 1, hi, SUM_UNITS))
    if lo < 0:
        out.append(Part(f"__w{len(out)}", -1, -lo, SUM_UNITS))
    if not out:  # lo = hi = 0: every value is 0
        out.append(Part("__w0", 1, 1.0, SUM_UNITS))
    return out


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=False)


def _lit(v: float | int) -> exp.Expression:
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return exp.Literal.number(int(v))
    return exp.Literal.number(v)


def _weights(jp: ir.JoinPlan, parts: list[Part], ops: SqlOps) -> list[exp.Expression]:
    if jp.kind == ir.COUNT_STAR:
        return [exp.alias_(exp.cast(_lit(1), "BIGINT"), parts[0].name)]
    if jp.kind == ir.COUNT_COL:
        assert jp.value is not None
        w = exp.Case(ifs=[exp.If(this=exp.Is(this=jp.value.copy(), expression=exp.Null()), true=_lit(0))], default=_lit(1))
        return [exp.alias_(exp.cast(w, "BIGINT"), parts[0].name)]
    assert jp.value is not None
    try:
        typed = type_checked(jp.value.copy(), dict(jp.flat_schema)).expr
    except TypeRefusal as e:  # pragma: no cover - the analyser typed it already
        raise UnsupportedQueryError("SUM: " + "; ".join(m for _, m in e.problems)) from None
    lo, hi = jp.bounds
    clamped = ops.clamp(ops.try_cast(typed, "DOUBLE"), lo, hi)
    out = []
    for p in parts:
        signed = clamped.copy() if p.sign > 0 else exp.Neg(this=exp.Paren(this=clamped.copy()))
        pos = exp.func("greatest", signed, _lit(0))
        w = exp.func("floor", exp.Mul(this=exp.Div(this=pos, expression=_lit(float(p.scale))), expression=_lit(p.units)))
        out.append(exp.alias_(exp.func("coalesce", exp.cast(w, "BIGINT"), _lit(0)), p.name))
    return out


#: the column holding :func:`spread_of` of a relation's chosen keys
SPREAD = "__spread"

_FLOAT_TYPES = frozenset({"DOUBLE", "FLOAT", "REAL", "FLOAT4", "FLOAT8"})
#: types whose values are equal exactly when their text and their engine hash are (once floats are
#: canonical): the keys a spread may hash
_PLAIN_TYPES = ("DATE", "TIME", "TIMESTAMP", "DECIMAL", "NUMERIC", "BOOLEAN", "BOOL", "UUID", "BLOB", "UHUGEINT", "BIT")


@dataclass(frozen=True)
class Spread:
    """How a join plan hashes the keys one person could choose: the per-query secret ``salt`` and the
    backend's cheapest keyed hash (``ops.spread_hash``: DuckDB's ``HASH(XOR(HASH(x), HASH(salt)))``,
    Spark's the same with ``xxhash64``; else ``ops.keyed_hash``), as ``dpsql.rewrite.bound.spread_keys``
    does for a single table. It decides nothing (every match and group is the same), so it need not be
    the same on every engine. The engine's own hash is public and unsalted (DuckDB's hash of a BIGINT is Murmur3's finaliser, a
    bijection anyone can invert), so one person's rows could hold thousands of key values whose hashes share
    their low bits, and every hash join, aggregate, DISTINCT or window partition over those values then probed
    quadratically (20 000 such order keys: a join plan 14-51x slower than with 20 000 random keys,
    ``benchmarks/hash_collisions.py --joins``). Every such grouping and equi-join also goes by a keyed hash of
    its key: the same groups and matches (the hash is a function of the key, equal for equal keys), hashed
    unpredictably."""

    salt: str
    ops: SqlOps


def _spread_input(e: exp.Expression, typ: str, other: str, ops: SqlOps) -> exp.Expression | None:
    """``e`` (of type ``typ``, compared with values of type ``other``) as the keyed hash reads it, so that
    values equal in SQL hash alike on every backend: integers of two different types as one wide integer
    (DuckDB hashes -1 as INTEGER and as BIGINT apart), floating point with one zero and one NaN (-0.0 = 0.0
    and NaN = NaN in a join, spelled apart as text); None for a type outside that list (not spread)."""
    t, o = typ.strip().upper(), other.strip().upper()
    if DIGEST_TYPE in (t, o):  # a key carried as its salted digest (:func:`key_digests`) meets only another
        return e if t == o else None
    if _type_family(t) == "int" and _type_family(o) == "int":
        return e if t == o else exp.cast(e, "HUGEINT" if ops.dialect == "duckdb" else "BIGINT")
    if _type_family(t) == "text" and _type_family(o) == "text":
        return e
    if t != o:
        return None
    if t in _FLOAT_TYPES:
        return exp.Case(ifs=[exp.If(this=exp.func("isnan", e.copy()), true=exp.cast(exp.Literal.string("NaN"), t)),
                             exp.If(this=exp.EQ(this=e.copy(), expression=_lit(0)), true=exp.cast(_lit(0), t))],
                        default=e.copy())
    if t.startswith(_PLAIN_TYPES):
        return e
    return None


def spread_of(values: Sequence[tuple[exp.Expression, str]], spread: Spread,
              others: Sequence[str] | None = None) -> exp.Expression | None:
    """The keyed hash (``ops.keyed_hash`` under the query's salt) of ``values`` (expression, type), each
    compared with a value of the type in ``others`` (the same type by default); None when a type is not
    one :func:`_spread_input` hashes."""
    inputs = []
    fast = getattr(spread.ops, "spread_hash", None)  # the backend's cheapest keyed hash (no text per row)
    # a key whose engine hash anyone can make equal for many values (text, wide integers, decimals, UUID,
    # BLOB) is hashed as the salt followed by its text (dpsql.rewrite.bound.spread_input), through the
    # backend's digest where the hash that reads it is the engine's own (spread_input says why)
    digest = text_digest_of(spread.ops) if fast is not None else keyed_digest(spread.ops)
    for i, (e, typ) in enumerate(values):
        other = typ if others is None else others[i]
        x = _spread_input(e, typ, other, spread.ops)
        if x is None:
            return None
        # (a key's salted digest, :func:`key_digests`, is unknown without the salt already)
        weak = typ != DIGEST_TYPE and (weakly_hashed(typ) or weakly_hashed(other))
        # (a UHUGEINT's text is spelled cheaply only with its type known: dpsql.plan.typer.uhugeint_text)
        unsigned = typ if typ.strip().upper() == "UHUGEINT" else ""
        inputs.append(salted_text(x, spread.salt, digest, unsigned) if weak else x)
    if fast is not None:
        return fast([x.copy() for x in inputs], spread.salt)  # type: ignore[no-any-return]
    names = [f"__spread_in{i}" for i in range(len(inputs))]
    h = spread.ops.keyed_hash(names, spread.salt)
    for c in list(h.find_all(exp.Column)):
        if c.name in names and not c.table:
            c.replace(inputs[names.index(c.name)].copy())
    return h


def spread_eq(left: Sequence[tuple[exp.Expression, str]], right: Sequence[tuple[exp.Expression, str]],
              spread: Spread | None) -> exp.Expression | None:
    """``keyed(left) = keyed(right)`` for an equi-join of ``left[i] = right[i]`` (pairs of expression and
    type): true exactly where the keys match, so adding it changes no match, and the join hashes the keyed
    hash. None without a spread, or for a type that is not spread."""
    if spread is None or not left:
        return None
    a = spread_of(left, spread, [t for _, t in right])
    b = spread_of(right, spread, [t for _, t in left])
    if a is None or b is None:
        return None
    return exp.EQ(this=a, expression=b)


def _with_spread(cond: exp.Expression, extra: exp.Expression | None) -> exp.Expression:
    return cond if extra is None else exp.And(this=cond, expression=extra)


_BLOB_TYPES = ("BLOB", "BYTEA", "BINARY", "VARBINARY")


def _digestable(sql_type: str) -> bool:
    """Whether a key of this type may be carried as its salted digest (:func:`key_digests`): text and BLOB, whose
    values one person can make long."""
    return is_text(sql_type) or sql_type.upper().split("(")[0].strip() in _BLOB_TYPES


@dataclass(frozen=True)
class KeyDigest:
    """The salted digest of a text or BLOB key (:func:`key_digests`): the backend's ``text_digest`` (DuckDB's
    ``MD5_NUMBER``, a 128-bit integer; ``md5``'s 32-character hex on the portable hash and on Spark, so that
    both spell identities and order capped rows alike) of the per-query secret salt followed by the key's text,
    as ``dpsql.rewrite.bound.unit_expression`` carries a text privacy unit."""

    salt: str
    ops: SqlOps

    def of(self, value: exp.Expression, sql_type: str) -> exp.Expression:
        """The digest of ``value`` (of type ``sql_type``, already under the binary collation if text)."""
        fn = text_digest_of(self.ops)
        return salted_text(value, self.salt, fn if fn is not None else (lambda t: exp.MD5(this=t)), sql_type)

    def text(self, value: exp.Expression) -> exp.Expression:
        """The text of a digest (a value of :meth:`of`): DuckDB's ``MD5_NUMBER``, a 128-bit unsigned integer, in
        hexadecimal (``HEX``: no leading zeros, one spelling per value), as DuckDB writes such an integer in decimal
        by 128-bit long divisions, about 85 microseconds a value (the ids of a million sampled tuples took 85 s of
        CPU); ``md5``'s hex text (the portable hash, Spark) as it is."""
        fn = text_digest_of(self.ops)
        probe = fn(exp.Null()) if fn is not None else None
        if isinstance(probe, exp.Anonymous) and probe.name.upper() == "MD5_NUMBER":
            return exp.func("hex", value.copy())
        return _as_text(value, DIGEST_TYPE)


def _key_columns(jp: ir.JoinPlan, caps: Sequence[tuple[str, str, int]]) -> set[str]:
    """The flat columns a join plan reads as keys: equi-join conditions, user slots, Delta caps, declared keys."""
    keys = {flat(s.alias, p) for s in jp.slots for p in key_parts(s.column)}
    for x, y in jp.conditions:
        keys |= {x, y}
    for a, c, _ in caps:
        keys |= {flat(a, p) for p in key_parts(c)}
    for a, c in jp.unique_keys:
        keys |= {flat(a, p) for p in key_parts(c)}
    return keys


#: the prefix of a condition's part computed by one input's projection (:func:`hoisted`)
HOISTED = "__cond"


@dataclass(frozen=True)
class Hoisted:
    """A join plan whose conditions applied after the join read a text or BLOB key through parts of their own
    (:func:`hoisted`): ``plan`` with those parts replaced by columns of fixed width (their types in ``plan``'s
    ``flat_schema``), ``parts`` per input the (flat name, part over the input's flat columns) each computes in its
    projection, ``top`` the conditions as written (their refusals are those of the query as written)."""

    plan: ir.JoinPlan
    parts: dict[str, list[tuple[str, exp.Expression]]]
    top: list[exp.Expression]

    def plan_top(self) -> list[exp.Expression]:
        """The conditions ``plan`` applies after the join (those over a LEFT-joined lookup's columns included)."""
        local, top = _split_where(self.plan)
        for a in self.plan.left:
            top += local.pop(a, [])
        return top


#: the kinds of type (``dpsql.plan.typer.SqlType.kind``) of a part an input's projection may compute in place of
#: the text it reads: fixed width, never text, BLOB, lists or other types whose values one person can make long
FIXED_WIDTH = frozenset({"bool", "int", "decimal", "float", "date", "timestamp"})


def _fixed_width(e: exp.Expression, schema: dict[str, str], *, boolean: bool) -> str | None:
    """The type (as the typer names it) of ``e`` when the typer types it and it is of fixed width (BOOLEAN only
    with ``boolean``), else None."""
    try:
        t = type_checked(e, schema).type
    except TypeRefusal:
        return None
    if t.kind not in (("bool",) if boolean else FIXED_WIDTH):
        return None
    return "BOOLEAN" if t.kind == "bool" else t.name


def _typed(e: exp.Expression, schema: dict[str, str], what: str) -> bool:
    try:
        type_predicate(e, schema, what, own=False)
    except TypeRefusal:
        return False
    return True


def hoisted(jp: ir.JoinPlan, caps: Sequence[tuple[str, str, int]]) -> Hoisted:
    """Each condition applied after the join (a WHERE conjunct across inputs) with its largest parts that read the
    columns of one inner-joined input only, one of them a text or BLOB key (:func:`_key_columns`), and whose type is
    of fixed width (:data:`FIXED_WIDTH`: BOOLEAN, an integer, DECIMAL, a float, DATE, TIMESTAMP; never text or
    BLOB), replaced by columns of that type which that input's projection computes (``<alias>____cond<i>``; more
    underscores if the input has a column of that name). The condition then reads such a key only through those
    columns, and the key may be carried as its salted digest (:func:`key_digests`): a condition such as
    ``c.id <> 'x' OR o.amt > 0`` or ``length(c.id) > o.amt`` otherwise carried one customer's 60 000-character id
    with each of their 6 000 joined orders.

    Exactly the same condition: a part's value is computed once per input row from the same values the join carries
    (text under the binary collation, before the digest; rendered total by the typer, :func:`guard`, as the whole
    condition is; the typer types a part from its operands alone, the context only converting its result), and
    SQL's three-valued logic reads its NULL as the part's NULL. A part in the place of a CASE's WHEN ... THEN pair
    is no value and is never replaced. A condition whose rewriting the typer would not accept as written (a part's
    proven range no longer known) keeps its BOOLEAN parts only, as it did before (or none). A LEFT-joined lookup's
    parts stay in the condition (its columns are NULL where no row matched, and a part need not be). From the query
    and the catalog's types only.

    A value aggregate's argument (SUM's, and so AVG's; COUNT's of a bare column reads only whether it is NULL, and
    needs nothing) has its largest parts of the same kind computed alike (the whole argument when it reads one input
    only: ``SUM(LEAST(GREATEST(length(o.cid), 0), 10))``), when the argument keeps its type (else as written)."""
    local, top = _split_where(jp)
    for a in jp.left:
        top += local.pop(a, [])
    keys = {c for c in _key_columns(jp, caps) if _digestable(jp.flat_schema.get(c, ""))}
    # the aggregates' arguments, but COUNT's of a bare column (it reads whether the column is NULL, as its digest tells)
    aggs = [(jp.kind, jp.value), *[(g.kind, g.value) for g in jp.aggregates]]
    values = [v for k, v in aggs if v is not None and not (k == ir.COUNT_COL and isinstance(v, exp.Column))]
    if not any(c.name in keys for e in [*top, *values] for c in e.find_all(exp.Column)):
        return Hoisted(jp, {}, top)
    schema = dict(jp.flat_schema)
    parts: dict[str, list[tuple[str, exp.Expression]]] = {}
    names: dict[str, str] = {}
    types: dict[str, str] = {}

    def name_for(a: str) -> str:
        if a not in names:
            taken = {n.split(SEP, 1)[1].lower() for n in jp.flat_schema if n.split(SEP, 1)[0] == a}
            prefix = HOISTED
            while any(c.startswith(prefix.lower()) for c in taken):
                prefix = "_" + prefix
            names[a] = prefix
        return flat(a, f"{names[a]}{len(parts.get(a, []))}")

    def visit(node: exp.Expression, found: list[tuple[str, str, exp.Expression, str]], boolean: bool) -> None:
        cols = list(node.find_all(exp.Column))
        inputs = {c.name.split(SEP, 1)[0] for c in cols}
        if not cols or not any(c.name in keys for c in cols):
            return
        if len(inputs) == 1 and not inputs & set(jp.left) and node.arg_key != "ifs":
            typ = _fixed_width(node, schema, boolean=boolean)
            if typ is not None:
                a = inputs.pop()
                n = name_for(a)
                parts.setdefault(a, []).append((n, node.copy()))
                found.append((a, n, node.copy(), typ))
                types[n] = typ
                node.replace(exp.column(n))
                return
        for child in list(node.iter_expressions()):
            visit(child, found, boolean)

    conds = []
    for e in top:
        for boolean in (False, True):
            found: list[tuple[str, str, exp.Expression, str]] = []
            holder = exp.Paren(this=e.copy())
            visit(holder.this, found, boolean)
            if not found or boolean or _typed(holder.this, {**schema, **types}, "WHERE"):
                break
            for a, n, _, _ in reversed(found):  # undone: the condition takes its BOOLEAN parts only
                parts[a].pop()
                types.pop(n)
        conds.append(holder.this if found else e.copy())

    def value(kind: str, v: exp.Expression | None) -> exp.Expression | None:
        """An aggregate's argument with its parts of fixed width over one input (the whole argument when it reads one
        input only): the same value, typed alike, or the argument as written."""
        if v is None or (kind == ir.COUNT_COL and isinstance(v, exp.Column)):
            return v
        before = _fixed_width(v, schema, boolean=False)
        found: list[tuple[str, str, exp.Expression, str]] = []
        holder = exp.Paren(this=v.copy())
        visit(holder.this, found, False)
        if not found or (before is not None and _fixed_width(holder.this, {**schema, **types}, boolean=False) == before):
            return holder.this
        for a, n, _, _ in reversed(found):  # undone: the argument as written
            parts[a].pop()
            types.pop(n)
        return v

    new_value = value(jp.kind, jp.value)
    new_aggs = tuple(dataclasses.replace(g, value=value(g.kind, g.value)) for g in jp.aggregates)
    if not parts or not any(parts.values()):
        return Hoisted(jp, {}, top)
    parts = {a: ps for a, ps in parts.items() if ps}
    kept = [w for a, ws in local.items() for w in ws]
    where = _and([*kept, *conds]) if kept or conds else None
    return Hoisted(dataclasses.replace(jp, where=where, value=new_value, aggregates=new_aggs,
                                       flat_schema={**jp.flat_schema, **types}), parts, top)


#: comparisons of two keys that their digests answer alike: equal, unequal, (not) distinct (NULL's digest is NULL)
_KEY_COMPARISONS = (exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.NullSafeNEQ)


def _bare(e: exp.Expression) -> exp.Expression:
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def key_comparisons(cond: exp.Expression, jp: ir.JoinPlan,
                    caps: Sequence[tuple[str, str, int]]) -> list[tuple[exp.Expression, str, str]]:
    """The comparisons in ``cond`` (a condition after the join) of a text or BLOB key of one inner-joined input with
    one of another (``c.id = o.cid``, ``<>``, ``IS [NOT] DISTINCT FROM``), both of one kind (text, or the same BLOB
    type), as (node, flat column, flat column). The join reads text under the binary collation, where two texts are
    equal exactly when their salted digests are (but with probability about 2^-128 per pair, under a secret salt no
    one can aim at), and a NULL's digest is NULL: such a comparison reads both digests alike (:func:`key_digests`)."""
    keys = {c for c in _key_columns(jp, caps) if _digestable(jp.flat_schema.get(c, ""))}
    out = []
    for node in cond.find_all(*_KEY_COMPARISONS):
        x, y = _bare(node.this), _bare(node.expression)
        if not (isinstance(x, exp.Column) and isinstance(y, exp.Column) and x.name in keys and y.name in keys):
            continue
        ax, ay = x.name.split(SEP, 1)[0], y.name.split(SEP, 1)[0]
        if ax == ay or {ax, ay} & set(jp.left):
            continue
        tx, ty = jp.flat_schema.get(x.name, ""), jp.flat_schema.get(y.name, "")
        if (is_text(tx) and is_text(ty)) or (not is_text(tx) and tx.upper().strip() == ty.upper().strip()):
            out.append((node, x.name, y.name))
    return out


def matched_keys(jp: ir.JoinPlan) -> frozenset[str]:
    """The flat columns of the GROUP BY keys that are bare text columns with a public key set (``declared`` or
    ``public``): such a key is only matched with its key set (``dpsql.rewrite.join_groups``, NULL-safely), which
    a digest can be as well as the text, the set's texts digested alike (:func:`key_digests`)."""
    return frozenset(k.expr.name for k in jp.keys if isinstance(k.expr, exp.Column) and k.kind in ("declared", "public")
                     and is_text(k.sql_type) and is_text(jp.flat_schema.get(k.expr.name, "")))


def key_digests(jp: ir.JoinPlan, caps: Sequence[tuple[str, str, int]], extra: Sequence[exp.Expression] = (),
                ids: Sequence[str] = (), matched: Sequence[str] = (), distinct: Collection[str] = ()) -> frozenset[str]:
    """The flat text and BLOB columns a join plan carries as their salted digest (:class:`KeyDigest`) from the
    input's projection on: those read only as keys (equi-join conditions, user slots, Delta caps, declared
    keys), never as values (the conditions applied after the join, but for their parts that one input's
    projection computes before the digest, :func:`hoisted`, and their comparisons of two inputs' keys, which
    compare the digests of both, :func:`key_comparisons`, both digested or neither; SUM's argument, but for its parts computed alike;
    COUNT's unless a bare column (it reads only whether the column is NULL, and so does its digest), GROUP BY keys, the one-table statement of
    a lookup join but for its columns the caller reads for equality only, ``distinct``, ``extra`` projections other
    than the caller's person columns ``ids`` and the ``distinct`` ones, output names of bare columns). Both sides of an equi-join are carried alike (a column that is
    not digested keeps the other side as it is).

    A key is carried with every joined row, and through the Delta caps' windows, which materialise every row
    of a partition before keeping any: one customer whose 60 000-character id is repeated over 6 000 orders
    (a few kB of a dictionary-encoded Parquet file, 360 MB decoded) made every join mechanism fail after its
    charge under a 100 MB memory limit, only when that customer was present
    (``tests/test_adversary_round41.py``). A digest is 16 or 32 bytes whatever the key. Equal keys have one
    digest (the text is read under the binary collation, as every join reads text), and under a secret salt
    no one can craft two keys of one digest (two people as one would change another's kept tuples); two keys
    share one by chance with probability about 2^-128 per pair. Person ids (:func:`_person_text`) and the
    synthetic users of dangling references (:func:`_key_text`) are spelled from the digest of a text or BLOB
    value wherever it is carried as it is, so one person has one id in every slot."""
    slot_cols = {flat(s.alias, p) for s in jp.slots for p in key_parts(s.column)}
    keys = _key_columns(jp, caps)
    values: set[str] = set()

    def read(e: exp.Expression | None) -> None:
        if e is not None:
            values.update(c.name for c in e.find_all(exp.Column))

    hoist = hoisted(jp, caps)
    compared: list[tuple[str, str]] = []
    for e in hoist.plan_top():
        holder = exp.Paren(this=e.copy())  # (a comparison may be the whole condition)
        for node, x, y in key_comparisons(holder, jp, caps):  # (read by their digests: both digested, or neither)
            compared.append((x, y))
            node.replace(exp.true())
        read(holder)
    for a, c in jp.left_on:  # (an ON condition over the lookup's columns alone filters its rows before the digest)
        if not {col.name.split(SEP, 1)[0] for col in c.find_all(exp.Column)} <= {a}:
            read(c)
    # (an argument's parts of fixed width over one input computed by its projection, :func:`hoisted`)
    for kind, e in ((hoist.plan.kind, hoist.plan.value), *[(g.kind, g.value) for g in hoist.plan.aggregates]):
        # COUNT(col) of a bare column reads only whether it is NULL, and a digest is NULL exactly where its text is
        if not (kind == ir.COUNT_COL and isinstance(e, exp.Column)):
            read(e)
    keyed = matched_keys(jp) if matched else frozenset()
    for e in [k.expr for k in jp.keys if not (isinstance(k.expr, exp.Column) and k.expr.name in keyed)]:
        read(e)
    if jp.statement is not None:  # (but for the columns the caller reads for equality only, ``distinct``)
        values.update(c.name for c in jp.statement.find_all(exp.Column) if c.name not in distinct)
    for e in extra:
        inner = e.this if isinstance(e, exp.Alias) else e
        if not (e.alias_or_name in ids and isinstance(inner, exp.Column) and inner.name in slot_cols) and not (
                e.alias_or_name in matched and isinstance(inner, exp.Column) and inner.name in keyed) and (
                e.alias_or_name not in distinct):
            read(e)
    chosen = {c for c in keys if c not in values and _digestable(jp.flat_schema.get(c, ""))}
    changed = True
    while changed:
        changed = False
        for x, y in (*jp.conditions, *compared):
            if (x in chosen) != (y in chosen):
                chosen -= {x, y}
                changed = True
    return frozenset(chosen)


def _needed(jp: ir.JoinPlan, caps: Sequence[tuple[str, str, int]]) -> dict[str, list[str]]:
    cols: dict[str, set[str]] = {a: set() for a, _ in jp.inputs}

    def add(f: str) -> None:
        a, _, c = f.partition(SEP)
        if a in cols:
            cols[a].add(c)

    for a, b in jp.conditions:
        add(a)
        add(b)
    for e in (jp.where, jp.value, *[a.value for a in jp.aggregates], *[k.expr for k in jp.keys], *[c for _, c in jp.left_on]):
        if e is not None:
            for c in e.find_all(exp.Column):
                add(c.name)
    if jp.statement is not None:  # the query as one table's over the joined relation (its output aliases are no columns)
        for c in jp.statement.find_all(exp.Column):
            if c.name in jp.flat_schema:
                add(c.name)
    for s in jp.slots:
        cols[s.alias].update(key_parts(s.column))
    for a, c, _ in caps:
        cols[a].update(key_parts(c))
    for a, c in jp.unique_keys:
        cols[a].update(key_parts(c))
    return {a: sorted(v) for a, v in cols.items()}


def join_relation(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec], *, salt: str, ops: SqlOps,
                  caps: Sequence[tuple[str, str, int]], parts: list[Part], extra: Sequence[exp.Expression] = (),
                  with_tid: bool = True, extra_types: Mapping[str, str] | None = None,
                  ids: Sequence[str] = (), matched: Sequence[str] = (), distinct: Collection[str] = ()) -> exp.Select:
    """The join with weights (``parts``), optional extra projections (``extra_types``: the types of those
    that are not join columns, by name; ``ids``: the names of those that are person columns the caller only
    groups by or spells ids from) and the tuple id ``__tid``. Every equi-join, semi-join, grouping and
    partition over a key also goes by its keyed hash (:class:`Spread`); a text or BLOB key read only as a key
    is carried as its salted digest (:func:`key_digests`), the parts of the conditions after the join that read
    it through one input alone computed by that input's projection (:func:`hoisted`)."""
    spread = Spread(salt, ops)
    needed = _needed(jp, caps)
    digested = key_digests(jp, caps, extra, ids, matched, distinct)
    digest = KeyDigest(salt, ops)
    hoist = hoisted(jp, caps)
    if hoist.parts and hoist.top:  # the conditions as written, typed as they are (a refusal is the query's own)
        guard(_and(hoist.top), dict(jp.flat_schema))
    jp = hoist.plan
    original = jp
    if digested:  # (the plan as the join sees its columns: a digested key has the digest's type)
        jp = dataclasses.replace(jp, flat_schema={**jp.flat_schema, **{c: DIGEST_TYPE for c in digested}})
    cap_of = {(a, c): n for a, c, n in caps}
    # the inputs joined left-deep in an order decided from the catalog alone, each built on its join's right side;
    # the LEFT-joined lookups last, in FROM order (no inner join names their columns: dpsql.plan.joins.check_left),
    # their WHERE conditions applied after the join (SQL's meaning: a lookup column is NULL where no row matched)
    left = set(jp.left)
    written = [a for a, _ in jp.inputs]
    sequence = tuple(a for a in join_sequence(jp, catalog) if a not in left) + jp.left
    order = {a: i for i, a in enumerate(sequence)}
    local, top = _split_where(jp)
    for a in jp.left:
        top += local.pop(a, [])
    # a LEFT JOIN's ON conditions: on its lookup's columns alone, a filter of the lookup's rows (SQL's LEFT JOIN of
    # (SELECT * FROM lookup WHERE ...)); the others part of the LEFT JOIN's ON. Either decides matching, drops no row
    on_extra: dict[str, list[exp.Expression]] = {}
    for a, c in jp.left_on:
        if {col.name.split(SEP, 1)[0] for col in c.find_all(exp.Column)} <= {a}:
            local.setdefault(a, []).append(c)
        else:
            on_extra.setdefault(a, []).append(c)
    built: dict[str, exp.Expression] = {}
    # capped inputs in the order the bound was derived (each joins inputs built before it)
    build_order = list(dict.fromkeys([a for a, _, _ in caps] + [a for a, _ in jp.inputs]))
    for a in build_order:
        t = catalog[dict(jp.inputs)[a]]
        cols = needed[a] or [sorted(t.schema)[0]]
        proj = [exp.alias_(exp.column(c, quoted=True), flat(a, c)) for c in cols]
        rel: exp.Expression = exp.select(*proj).from_(exp.to_table(t.view or source_name(t.name), quoted=True))
        if local.get(a):
            rel = exp.select("*").from_(rel.subquery("__where")).where(guard(_and(local[a]), dict(original.flat_schema)))
        if hoist.parts.get(a):
            # the parts of the conditions after the join over this input (:func:`hoisted`), computed from the text
            # under the binary collation, as the join would read it, before a key becomes its digest
            rel = exp.select(*[exp.alias_(binary_text(_col(flat(a, c)), _type_of(t, c)), flat(a, c)) for c in cols]).from_(
                rel.subquery("__h"))
            rel = exp.select(*[exp.alias_(_carried(_col(flat(a, c)), _type_of(t, c), flat(a, c) in digested, digest)
                                          if flat(a, c) in digested else _col(flat(a, c)), flat(a, c)) for c in cols],
                             *[exp.alias_(_part(e, original.flat_schema[n], dict(original.flat_schema), ops), n)
                               for n, e in hoist.parts[a]]).from_(rel.subquery("__b"))
            cols = [*cols, *[n.split(SEP, 1)[1] for n, _ in hoist.parts[a]]]
        elif any(is_text(_type_of(t, c)) or flat(a, c) in digested for c in cols):
            # from here on (caps, joins, identities, owners) text is compared under the binary collation, and a
            # key read only as a key is its salted digest
            rel = exp.select(*[exp.alias_(_carried(_col(flat(a, c)), _type_of(t, c), flat(a, c) in digested, digest),
                                          flat(a, c)) for c in cols]).from_(rel.subquery("__b"))
        # a LEFT-joined lookup keeps every row its own ON can match: probed against the inputs written before it only
        probed = {x: r for x, r in built.items() if a not in left or written.index(x) < written.index(a)}
        for (ca, cc), n in cap_of.items():
            if ca == a:
                rel = _semi_filter(rel, jp, a, cc, probed, spread=spread, columns=[flat(a, c) for c in cols])
                # a row with a NULL in its partition reaches nobody through it (or joins nothing): not capped
                kept = cap_rows(rel.subquery("__in"), [flat(a, p) for p in key_parts(cc)], [flat(a, c) for c in cols], n, salt,
                                alias="__capped", ops=ops, null_free=True)
                rel = exp.select(*[_col(flat(a, c)) for c in cols]).from_(kept)
        for ua, uc in jp.unique_keys:
            if ua == a:
                rel = _unique_filter(rel, a, uc, t, spread=spread, columns=[flat(a, c) for c in cols],
                                     digested=digested, digest=digest)
        built[a] = rel
    # each input's tree is used once from here on: wrapped and joined in place (copy=False), not deep-copied
    rels = [built[a].subquery(a, copy=False) for a in sequence]
    q = exp.select(*_weights(jp, parts, ops), *extra).from_(rels[0], copy=False)
    for i, rel in enumerate(rels[1:], start=1):
        pairs = [(x, y) if order[y.split(SEP)[0]] == i else (y, x) for x, y in jp.conditions
                 if max(order[x.split(SEP)[0]], order[y.split(SEP)[0]]) == i]
        conds = [exp.EQ(this=_col(x), expression=_col(y)) for x, y in pairs]
        on: exp.Expression = exp.true()
        for c in conds:
            on = c if on == exp.true() else exp.And(this=on, expression=c)
        # (earlier inputs' keys) = (this input's keys), hashed by the keyed hash too
        same = spread_eq([(_col(x), jp.flat_schema.get(x, "")) for x, _ in pairs], [(_col(y), jp.flat_schema.get(y, "")) for _, y in pairs],
                         spread)
        on = _with_spread(on, same)
        if on_extra.get(sequence[i]):
            on = exp.And(this=on, expression=exp.Paren(this=guard(_and(on_extra[sequence[i]]), dict(jp.flat_schema), "ON")))
        q = q.join(rel, on=on, join_type="left" if sequence[i] in left else "inner", copy=False)
    if top:
        q = q.where(_after_join(_and(top), original, caps, dict(original.flat_schema), digested), copy=False)
    if with_tid:
        types = {n: jp.flat_schema[n] for n in jp.flat_schema}
        types.update({p.name: "BIGINT" for p in parts})
        types.update(extra_types or {})
        return _with_tid(q, types=types, spread=spread)
    return q


def _after_join(cond: exp.Expression, jp: ir.JoinPlan, caps: Sequence[tuple[str, str, int]], schema: dict[str, str],
                digested: frozenset[str]) -> exp.Expression:
    """The conditions after the join rendered total by the typer (:func:`guard`), each comparison of two keys carried
    as their digests (:func:`key_comparisons`) comparing those digests: the typer renders it as a BOOLEAN column
    of a name no input has (``__keys<i>``: a flat name has its input's alias before ``__``), then replaced."""
    holder = exp.Paren(this=cond.copy())  # (a comparison may be the whole condition)
    compared: dict[str, exp.Expression] = {}
    for node, x, y in key_comparisons(holder, jp, caps):
        if x in digested and y in digested:
            name = f"__keys{len(compared)}"
            compared[name] = type(node)(this=_col(x), expression=_col(y))
            node.replace(exp.column(name))
    out = guard(holder.this, {**schema, **dict.fromkeys(compared, "BOOLEAN")})
    if not compared:
        return out
    rendered = exp.Paren(this=out)  # (the placeholder may be the whole rendering)
    for c in list(rendered.find_all(exp.Column)):
        if c.name in compared and not c.table:
            c.replace(exp.Paren(this=compared[c.name].copy()))
    return rendered.this


def _part(e: exp.Expression, typ: str, schema: dict[str, str], ops: SqlOps) -> exp.Expression:
    """A part of fixed width (:func:`hoisted`) rendered total by the typer, as the whole condition renders it: a
    BOOLEAN part as a condition (:func:`guard`), another as a value, converted to the typer's type (DuckDB's) on
    another engine (Spark's ``length`` is an INT, its DECIMAL results keep other precisions), as
    ``dpsql.rewrite.bound.key_expression`` converts a computed key: the value is DuckDB's, so the type holds it."""
    if typ == "BOOLEAN":
        return guard(e, schema)
    try:
        r = type_checked(e.copy(), schema).expr
    except TypeRefusal as err:  # pragma: no cover - hoisted() typed it
        raise UnsupportedQueryError("; ".join(m for _, m in err.problems)) from None
    if ops.dialect != "duckdb":
        return exp.Cast(this=r, to=exp.DataType.build(typ, dialect="duckdb"))
    return r


def _type_of(t: TableSpec, column: str) -> str:
    return t.schema.get(column, t.schema.get(column.lower(), ""))


def _carried(e: exp.Expression, sql_type: str, digested: bool, digest: KeyDigest) -> exp.Expression:
    """A column as the join carries it: text under the binary collation, a digested key as its digest."""
    e = binary_text(e, sql_type)
    return digest.of(e, sql_type) if digested else e


#: types whose text every engine writes with its own plain conversion (no DATE or TIMESTAMP, no floating point
#: with an engine's own spelling): their conversion to text records the type (``CAST_FROM``), which lets an
#: engine that rewrites the text of other types (Spark's spelling of dates) convert them plainly
_PLAIN_TEXT = ("BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
               "UBIGINT", "VARCHAR", "TEXT", "STRING", "DECIMAL")


def _as_text(col: exp.Expression, typ: str | None = None) -> exp.Expression:
    """``CAST(col AS VARCHAR)``, recording ``typ`` (the column's type, if known) where it is one of
    :data:`_PLAIN_TEXT`: the same text on every engine, and on Spark the plain conversion."""
    text = exp.cast(col.copy(), "VARCHAR")
    t = (typ or "").upper().strip()
    if t and (t in _PLAIN_TEXT or t.startswith("DECIMAL(") or t == DIGEST_TYPE):
        text.meta[CAST_FROM] = t
    return text


def _id_piece(col: exp.Expression, typ: str | None = None, digest: KeyDigest | None = None) -> exp.Expression:
    """``n`` for NULL, else ``v<number of characters of t>:<t>`` with ``t = CAST(col AS VARCHAR)``
    (``typ``: the column's type, if known: :func:`_as_text`; a key's digest spelled by ``digest.text``)."""
    text = digest.text(col) if typ == DIGEST_TYPE and digest is not None else _as_text(col, typ)
    body = exp.DPipe(this=exp.DPipe(this=exp.DPipe(this=exp.Literal.string("v"), expression=exp.cast(
        exp.func("length", text.copy()), "VARCHAR"), safe=True), expression=exp.Literal.string(":"), safe=True),
        expression=text, safe=True)
    return exp.Case(ifs=[exp.If(this=exp.Is(this=col.copy(), expression=exp.Null()), true=exp.Literal.string("n"))],
                    default=body)


def _projected_types(q: exp.Select, types: Mapping[str, str]) -> dict[str, str]:
    """The types of ``q``'s projected columns that ``types`` knows (by the output name, or for an alias
    of a column, by the column's name)."""
    out = {}
    for p in q.expressions:
        name = p.alias_or_name
        inner = p.this if isinstance(p, exp.Alias) else p
        if name in types:
            out[name] = types[name]
        elif isinstance(inner, exp.Column) and inner.name in types:
            out[name] = types[inner.name]
    return out


def _with_tid(q: exp.Select, *, types: Mapping[str, str] | None = None, spread: Spread | None = None) -> exp.Select:
    """``q`` (the join's projection) with the tuple identity ``__tid`` (module docstring): the
    injective text of every projected column, then ``#`` and the tuple's number among the tuples
    with the same projected values (partitioned also by the keyed hash of the projected columns
    whose ``types`` are known: :class:`Spread`)."""
    names = [p.alias_or_name for p in q.expressions]
    cols = [_col(f"__t.{n}") for n in names]
    part = [c.copy() for c in cols]
    known = _projected_types(q, types) if types else {}
    if spread is not None and types:
        hashed = [(_col(f"__t.{n}"), known[n]) for n in names if n in known]
        h = spread_of(hashed, spread) if hashed else None
        if h is not None:
            part.append(h)
    dup = exp.Window(this=exp.RowNumber(), partition_by=part)
    digest = KeyDigest(spread.salt, spread.ops) if spread is not None else None
    text: exp.Expression = exp.Literal.string("")
    for n, c in zip(names, cols, strict=True):
        text = exp.DPipe(this=text, expression=_id_piece(c, known.get(n), digest), safe=True)
    text = exp.DPipe(this=exp.DPipe(this=text, expression=exp.Literal.string("#"), safe=True),
                     expression=_as_text(dup, "BIGINT"), safe=True)
    return exp.select(*[c.copy() for c in cols], exp.alias_(text, "__tid")).from_(q.subquery("__t"))


def _unique_filter(rel: exp.Expression, alias: str, key: str, table: TableSpec, *,
                   spread: Spread | None = None, columns: Sequence[str] | None = None,
                   digested: frozenset[str] = frozenset(), digest: KeyDigest | None = None) -> exp.Expression:
    """Keep the rows of input ``alias`` whose value of the declared key ``key`` occurs exactly once
    in the base table (before any WHERE or cap). The join enters this input through that key on
    behalf of a user slot (``ir.JoinPlan.unique_keys``): a key value held by several rows would
    make the referencing row reach every one of their people, while the join pairs it with each
    row separately (one person per tuple). Dropping every row of a duplicated key value is stable
    under the neighbouring relation: a key value is duplicated or not by the base table alone, and
    when removing a person turns a duplicated value unique, every row referencing that value
    reached the removed person and is removed with them, so no tuple appears. Applied after the
    row caps, which depend only on their own partitions. The key values are grouped and probed
    together with their keyed hash (:class:`Spread`): every row's key value is in the base table's
    aggregate, before any cap. A key part the input carries as its digest (``digested``, :func:`key_digests`) is
    read from the base table as its digest too."""
    keys = key_parts(key)
    src = exp.to_table(table.view or source_name(table.name), quoted=True)
    dig = [flat(alias, c) in digested and digest is not None for c in keys]
    types = [DIGEST_TYPE if d else _type_of(table, c) for c, d in zip(keys, dig, strict=True)]
    typed = [(_carried(exp.column(c, quoted=True), _type_of(table, c), d, digest) if d and digest is not None
              else binary_text(exp.column(c, quoted=True), _type_of(table, c)), typ)
             for c, d, typ in zip(keys, dig, types, strict=True)]
    h = spread_of(typed, spread) if spread is not None else None
    mine = (spread_of([(_col(flat(alias, c)), typ) for c, typ in zip(keys, types, strict=True)], spread)
            if spread is not None and columns is not None else None)
    cond = _and([exp.EQ(this=exp.column(c, table="__once", quoted=True), expression=_col(f"__r.{flat(alias, c)}"))
                 for c in keys])
    if h is None or mine is None or columns is None:
        once = (exp.select(*[exp.alias_(e.copy(), c, quoted=True) for (e, _), c in zip(typed, keys, strict=True)]).from_(src)
                .group_by(*[e.copy() for e, _ in typed])
                .having(exp.EQ(this=exp.Count(this=exp.Star()), expression=_lit(1))))
        probe = exp.select(exp.Literal.number(1)).from_(once.subquery("__once")).where(cond)
        return exp.select("*").from_(rel.subquery("__r")).where(exp.Exists(this=probe))
    # the keyed hash as a column of both sides (DuckDB drops from a GROUP BY an expression of the other
    # keys, and groups the outer values of a correlated EXISTS by the columns it reads)
    # the key values under names of their own: a key column may itself be called ``__spread``
    names = [f"__key{i}" for i in range(len(keys))]
    hashed = (exp.select(*[exp.alias_(e.copy(), n) for (e, _), n in zip(typed, names, strict=True)],
                         exp.alias_(h, SPREAD)).from_(src).subquery("__keys"))
    once = (exp.select(*[_col(n) for n in names], _col(SPREAD)).from_(hashed)
            .group_by(*[_col(n) for n in names], _col(SPREAD))
            .having(exp.EQ(this=exp.Count(this=exp.Star()), expression=_lit(1))))
    cond = _and([exp.EQ(this=_col(f"__once.{n}"), expression=_col(f"__r.{flat(alias, c)}")) for n, c in zip(names, keys, strict=True)])
    cond = exp.And(this=cond, expression=exp.EQ(this=exp.column(SPREAD, table="__once"), expression=_col(f"__r.{SPREAD}")))
    probe = exp.select(exp.Literal.number(1)).from_(once.subquery("__once")).where(cond)
    r = exp.select("*", exp.alias_(mine, SPREAD)).from_(rel.subquery("__rs")).subquery("__r")
    return exp.select(*[_col(f"__r.{c}") for c in columns]).from_(r).where(exp.Exists(this=probe))


def _semi_filter(rel: exp.Expression, jp: ir.JoinPlan, alias: str, cap_column: str,
                 built: Mapping[str, exp.Expression], *, spread: Spread | None = None,
                 columns: Sequence[str] | None = None) -> exp.Expression:
    """Before capping ``alias`` per ``cap_column``: keep only the rows whose partition value occurs
    in an input built before it that it joins on that column (``EXISTS``). Whole partitions are
    kept or dropped by their value alone, and a partition's capped rows depend only on its own
    rows, so the join is exactly the same; the cap just skips partitions that cannot join."""
    for other, other_rel in built.items():
        pairs = []
        for p in key_parts(cap_column):
            mine = flat(alias, p)
            match = next((y if x == mine else x for x, y in jp.conditions
                          if mine in (x, y) and (y if x == mine else x).split(SEP, 1)[0] == other), None)
            if match is None:
                break
            pairs.append((mine, match))
        else:
            cond = _and([exp.EQ(this=_col(f"__x.{theirs}"), expression=_col(f"__r.{mine}")) for mine, theirs in pairs])
            mine_t = [jp.flat_schema.get(m, "") for m, _ in pairs]
            theirs_t = [jp.flat_schema.get(t, "") for _, t in pairs]
            h_mine = spread_of([(_col(m), t) for (m, _), t in zip(pairs, mine_t, strict=True)], spread, theirs_t) if spread else None
            h_theirs = spread_of([(_col(t), ty) for (_, t), ty in zip(pairs, theirs_t, strict=True)], spread, mine_t) if spread else None
            if h_mine is None or h_theirs is None or columns is None:
                probe = exp.select(exp.Literal.number(1)).from_(other_rel.subquery("__x")).where(cond)
                return exp.select("*").from_(rel.subquery("__r")).where(exp.Exists(this=probe))
            # the keyed hash as a column of both sides (a correlated EXISTS groups the outer rows by the columns it
            # reads, then joins on them: :class:`Spread`)
            cond = exp.And(this=cond, expression=exp.EQ(this=_col(f"__x.{SPREAD}"), expression=_col(f"__r.{SPREAD}")))
            theirs_rel = exp.select("*", exp.alias_(h_theirs, SPREAD)).from_(other_rel.subquery("__xs")).subquery("__x")
            probe = exp.select(exp.Literal.number(1)).from_(theirs_rel).where(cond)
            r = exp.select("*", exp.alias_(h_mine, SPREAD)).from_(rel.subquery("__rs")).subquery("__r")
            return exp.select(*[_col(f"__r.{c}") for c in columns]).from_(r).where(exp.Exists(this=probe))
    return rel


def _and(conds: Sequence[exp.Expression]) -> exp.Expression:
    out = conds[0].copy()
    for c in conds[1:]:
        out = exp.And(this=out, expression=c.copy())
    return out


def _split_where(jp: ir.JoinPlan) -> tuple[dict[str, list[exp.Expression]], list[exp.Expression]]:
    """The WHERE's conjuncts over one input's columns (applied to that input before its row cap:
    a per-row filter keeps each capped partition a function of its own rows, and spares the cap
    rows the query drops anyway), and the rest (applied to the join)."""
    if jp.where is None:
        return {}, []
    conjuncts = where_conjuncts(jp.where)  # (through parentheses: one conjunction however it is grouped)
    local: dict[str, list[exp.Expression]] = {}
    top: list[exp.Expression] = []
    for c in conjuncts:
        aliases = {col.name.split(SEP, 1)[0] for col in c.find_all(exp.Column)}
        if len(aliases) == 1:
            local.setdefault(aliases.pop(), []).append(c)
        else:
            top.append(c)
    return local, top


#: the grid of a drawn sample's threshold: the sample keeps the tuples whose draw is below
#: floor(q * 2^32) / 2^32 (DuckDB's ``RANDOM()`` is a uniform 64-bit integer over 2^64 rounded to a
#: double, so a threshold on this grid is exact and kept with probability at most the threshold)
DRAW_GRID = 1 << 32


def _sample_clock(ops: SqlOps, q: float) -> exp.Expression | None:
    """The per-tuple draw of a Poisson sample at rate q that the caller reads exactly once, or None
    for the keyed hash of the tuple's identity (``__tid``).

    A draw needs a backend that draws per row from a generator nobody else reaches
    (``ops.row_clock()``: DuckDB on a connection the engine opened itself, never Spark, the
    portable hash or a caller's connection, whose ``RANDOM()`` may be seeded) and a rate on the
    draw's threshold grid (q >= 2^-32, public). The caller must read the sampled relation once: a
    second read would evaluate ``RANDOM()`` again and sample again."""
    if q >= 1.0 or math.floor(q * DRAW_GRID) < 1:
        return None
    return ops.row_clock()


def _sampled(rel: exp.Select, salt: str, q: float, ops: SqlOps, clock: exp.Expression | None = None) -> exp.Select:
    """The tuples of ``rel`` kept by the Poisson sample at rate q (all when q = 1).

    With ``clock`` (:func:`_sample_clock`; the result is read once): each tuple draws once, in a
    projection of its own (``__draw``, a column DuckDB computes once per tuple and never pushes
    below the join), and is kept when ``__draw * 2^32 < floor(q * 2^32)``: independent
    Bernoulli(q') draws with q' <= floor(q * 2^32) / 2^32 <= q, a fresh generator state per query.
    Otherwise the keyed hash of the identity ``__tid`` (``SqlOps.bernoulli_keep``)."""
    sub = rel.subquery("__join")
    if q < 1.0 and clock is not None:
        drawn = exp.select("*", exp.alias_(clock, "__draw")).from_(sub).subquery("__drawn")
        below = exp.LT(this=exp.Mul(this=_col("__draw"), expression=exp.Literal.number(DRAW_GRID)),
                       expression=exp.Literal.number(math.floor(q * DRAW_GRID)))
        return exp.select("*").from_(drawn).where(below)
    out = exp.select("*").from_(sub)
    if q < 1.0:
        out = out.where(ops.bernoulli_keep(["__tid"], salt, q))
    return out


def _person_text(catalog: Mapping[str, TableSpec], person: str, value: exp.Expression, digest: KeyDigest, *,
                 digested: bool = False) -> exp.Expression:
    """A person's id: ``<person table>:<value>``, the value cast to the type of the person table's
    unit column first (every reference to it has that type: ``dpsql.catalog.reference_problems``),
    so that equal values have one spelling. A floating-point unit has values that are equal in SQL
    (and so one person: the engine groups them together) but spelled apart: -0.0 and 0.0, and NaNs
    of either sign ('-nan', 'nan'); they are spelled '0.0' and 'nan', else one person would be
    two users to the truncation, each kept up to tau. A text or BLOB unit is spelled by its salted digest
    (``value`` itself where ``digested``: :func:`key_digests`), whatever its length."""
    t = catalog[person]
    assert t.privacy_unit is not None
    typ = t.schema.get(t.privacy_unit, "VARCHAR")
    if _digestable(typ):
        text: exp.Expression = digest.text(value if digested else digest.of(exp.cast(value, typ), typ))
        return exp.DPipe(this=exp.Literal.string(person + ":"), expression=text, safe=True)
    try:
        typed = exp.cast(value, typ)
    except ParseError:  # a DuckDB-only type name (UBIGINT, UHUGEINT, ...) that sqlglot reads only in its dialect
        typed = exp.cast(value, exp.DataType.build(typ, dialect="duckdb"))
    text = exp.cast(typed, "VARCHAR")
    if typ.upper().startswith(("DOUBLE", "FLOAT", "REAL")):
        text = exp.Case(ifs=[exp.If(this=exp.func("isnan", typed.copy()), true=exp.Literal.string("nan")),
                             exp.If(this=exp.EQ(this=typed.copy(), expression=_lit(0)), true=exp.Literal.string("0.0"))],
                        default=text)
    return exp.DPipe(this=exp.Literal.string(person + ":"), expression=text, safe=True)


def _key_text(table: TableSpec, key: str, values: Sequence[exp.Expression], digest: KeyDigest,
              digested: Sequence[bool]) -> exp.Expression:
    """A synthetic user for a key value that reaches no person (a dangling or NULL reference):
    ``~<table>.<key>:<value>`` (composite parts joined by ','); it
    names no person table (``~``), so it never coincides with a person's id. A text or BLOB part is
    spelled by its salted digest (the value itself where ``digested``), as :func:`_person_text` spells ids."""
    out: exp.Expression = exp.Literal.string(f"~{table.name}.{key}:")
    for i, (c, v, d) in enumerate(zip(key_parts(key), values, digested, strict=True)):
        typ = table.schema.get(c, "VARCHAR")
        txt: exp.Expression
        if d or _digestable(typ):  # (digits or hex: no ',')
            txt = digest.text(v.copy() if d else digest.of(exp.cast(v.copy(), typ), typ))
        else:
            txt = exp.cast(exp.cast(v.copy(), typ), "VARCHAR")
        if i:
            out = exp.DPipe(this=out, expression=exp.Literal.string(","), safe=True)
        out = exp.DPipe(this=out, expression=txt, safe=True)
    return out


def _all_set(values: Sequence[exp.Expression]) -> exp.Expression:
    return _and([exp.Not(this=exp.Is(this=v.copy(), expression=exp.Null())) for v in values])


def _lookup(k: int, s: ir.UserSlot, catalog: Mapping[str, TableSpec], digest: KeyDigest, *,
            spread: Spread | None = None, digested: frozenset[str] = frozenset()) -> exp.Select:
    """Every person a sampled tuple's row reaches through slot ``s``'s chain of references, as a
    list per start value (``__k<i>``, the slot's columns): each hop reads EVERY row of its target
    table holding the value (a declared key is assumed, not trusted, to be unique: duplicates
    attach several people), and a hop that reaches no row (a dangling reference, or a NULL met on
    the way) attaches the synthetic user of the last key value that was looked up (``_key_text``),
    so those tuples stay truncated. A NULL start value reaches nobody (no row is looked up).
    Each hop reads its table's DISTINCT (key, next value) pairs: the people reached are the same,
    and one person's duplicated rows in two hops cost their sum, not their product, of work.
    With ``spread`` (:class:`Spread`), each DISTINCT, join and grouping over key values also goes by
    their keyed hash (``__spread``: the start values' and each hop's key values'; a join compares the
    keyed hashes of both sides' values); the result has the start values' ``__spread`` too. A start column the
    sample carries as its digest (``digested``, :func:`key_digests`) is looked up by the digest of the first hop's
    key, and each hop carries a text or BLOB next value (the next hop's key, or the person's unit) as its digest, the
    next hop reading its key as a digest too: one customer's long id over thousands of orders was otherwise carried
    with each of their (order key, customer) pairs (``tests/test_adversary_round43.py``); every id is spelled from
    digests of text (:func:`_person_text`, :func:`_key_text`)."""
    direct_last = _direct(s.hops[-1:], catalog)
    fetch = s.hops[:-1] if direct_last else s.hops
    starts = key_parts(s.column)
    start_table = catalog[s.hops[0].table] if s.hops else None
    start_dig = [flat(s.alias, p) in digested for p in starts]
    start_types = [DIGEST_TYPE if d else _type_of(start_table, p) if start_table is not None else ""
                   for p, d in zip(starts, start_dig, strict=True)]
    start_cols = [(_col(f"__s.{flat(s.alias, p)}"), typ) for p, typ in zip(starts, start_types, strict=True)]
    h0 = spread_of(start_cols, spread) if spread is not None else None
    st = (exp.select(*[exp.alias_(_col(f"__s.{flat(s.alias, p)}"), f"__k{i}") for i, p in enumerate(starts)])
          .distinct().from_("__s").where(_all_set([_col(f"__s.{flat(s.alias, p)}") for p in starts])))
    if h0 is not None:  # the keyed hash computed below the DISTINCT (an expression of the keys would be dropped from it)
        st.set("distinct", None)
        inner = st.select(exp.alias_(h0, SPREAD)).subquery("__sts")
        st = exp.select(*[_col(f"__k{i}") for i in range(len(starts))], _col(SPREAD)).distinct().from_(inner)
    q = exp.select(*[_col(f"__st.__k{i}") for i in range(len(starts))]).from_(st.subquery("__st"))
    prev: list[exp.Expression] = [_col(f"__st.__k{i}") for i in range(len(starts))]
    prev_types, prev_dig = start_types, start_dig
    looked: list[tuple[TableSpec, str, list[exp.Expression], str, list[bool]]] = []  # (table, key, values, alias, digested)
    for j, hop in enumerate(fetch):
        t = catalog[hop.target_table]
        nxt = s.hops[j + 1].column if j + 1 < len(s.hops) else t.privacy_unit
        assert nxt is not None
        keys, nexts = key_parts(hop.target_column), key_parts(nxt)
        la = f"__l{k}_{j}"
        # (a key compared with a digested value is read as its digest)
        key_types = [DIGEST_TYPE if d else _type_of(t, c) for c, d in zip(keys, prev_dig, strict=True)]
        key_vals = [_carried(exp.column(c, quoted=True), _type_of(t, c), d, digest) for c, d in zip(keys, prev_dig, strict=True)]
        # a text or BLOB next value (the next hop's key, or the person's unit) as its digest: one person's long id
        # is never carried with each of their rows here
        next_dig = [_digestable(_type_of(t, c)) for c in nexts]
        rel = (exp.select(*[exp.alias_(v.copy(), f"__a{i}") for i, v in enumerate(key_vals)],
                          *[exp.alias_(_carried(exp.column(c, quoted=True), _type_of(t, c), d, digest), f"__b{i}")
                            for i, (c, d) in enumerate(zip(nexts, next_dig, strict=True))],
                          exp.alias_(_lit(1), "__m"))
               .distinct()  # equal (key, next) rows reach the same people: one each, so that one person's
               # duplicated rows in two hops make no product of rows (work linear in each person's rows)
               .from_(exp.to_table(t.view or source_name(t.name), quoted=True)))
        hk = (spread_of([(v.copy(), typ) for v, typ in zip(key_vals, key_types, strict=True)], spread, prev_types)
              if spread is not None else None)
        hp = spread_of(list(zip(prev, prev_types, strict=True)), spread, key_types) if spread is not None else None
        on = _and([exp.EQ(this=_col(f"{la}.__a{i}"), expression=prev[i]) for i in range(len(keys))])
        if hk is not None and hp is not None:
            # the key values' keyed hash, computed below the DISTINCT, and compared in the join
            rel.set("distinct", None)
            inner = rel.select(exp.alias_(hk, SPREAD)).subquery("__hop")
            rel = exp.select(*[_col(n) for n in rel.named_selects], _col(SPREAD)).distinct().from_(inner)
            on = exp.And(this=on, expression=exp.EQ(this=_col(f"{la}.{SPREAD}"), expression=hp))
        q = q.join(rel.subquery(la), on=on, join_type="left")
        looked.append((t, hop.target_column, prev, la, prev_dig))
        prev = [_col(f"{la}.__b{i}") for i in range(len(nexts))]
        prev_types = [DIGEST_TYPE if d else _type_of(t, c) for c, d in zip(nexts, next_dig, strict=True)]
        prev_dig = next_dig
    # the user: the person at the end, or the synthetic user where the chain stopped
    final = _person_text(catalog, s.person_table, prev[0], digest, digested=prev_dig[0])
    last_t, last_key, last_vals, _, last_dig = looked[-1]
    ifs = []
    for j, (t, key, vals, la, dig) in enumerate(looked):
        here = _key_text(t, key, vals, digest, dig)
        if j:
            pt, pk, pv, _, pd = looked[j - 1]
            here = exp.Case(ifs=[exp.If(this=_all_set(vals), true=here)], default=_key_text(pt, pk, pv, digest, pd))
        ifs.append(exp.If(this=exp.Is(this=_col(f"{la}.__m"), expression=exp.Null()), true=here))
    ifs.append(exp.If(this=exp.Is(this=prev[0].copy(), expression=exp.Null()),
                      true=_key_text(last_t, last_key, last_vals, digest, last_dig)))
    uid = exp.Case(ifs=ifs, default=final)
    users = exp.func("list", exp.Distinct(expressions=[uid]))
    group = [_col(f"__st.__k{i}") for i in range(len(starts))]
    if h0 is not None:
        q = q.select(exp.alias_(_col(f"__st.{SPREAD}"), SPREAD))
        group.append(_col(f"__st.{SPREAD}"))
    return q.select(exp.alias_(users, "__users")).group_by(*group)


def reads_sample_once(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec]) -> bool:
    """Whether :func:`sampled_tuples` reads its sample ``__s`` once: when no user slot is looked
    up. A looked-up slot reads it twice (its distinct start values for :func:`_lookup`, then the
    join back to the tuples), and a per-row draw evaluated by each read would sample twice."""
    return all(not s.hops or _direct(s.hops, catalog) for s in jp.slots)


def sampled_tuples(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec], *, salt: str, q: float, ops: SqlOps,
                   caps: Sequence[tuple[str, str, int]] = (), extra: Sequence[tuple[str, exp.Expression]] = (),
                   extra_types: Mapping[str, str] | None = None, matched: Sequence[str] = ()) -> exp.Select:
    """Per sampled tuple: the weights ``__w*`` and per user slot ``__u<k>``: the
    person's id (VARCHAR; NULL where the slot's column is NULL: it reaches nobody) for a slot
    whose column holds the person, or the list of ids (VARCHAR[]) of a looked-up chain
    (:func:`_lookup`). ``extra``: (name, expression over the join's flat columns) carried along
    (e.g. a GROUP BY key), ``extra_types`` their types by name where known."""
    parts = parts_of(jp)
    spread = Spread(salt, ops)
    starts = list(dict.fromkeys(flat(s.alias, p) for s in jp.slots for p in key_parts(s.column)))
    more = [exp.alias_(e.copy(), n) for n, e in extra]  # part of the tuple's content, hence of its identity
    clock = _sample_clock(ops, q) if reads_sample_once(jp, catalog) else None
    projected = [_col(c) for c in starts] + more
    digested, digest = key_digests(jp, caps, projected, starts, matched), KeyDigest(salt, ops)
    rel = join_relation(jp, catalog, salt=salt, ops=ops, caps=caps, parts=parts, extra=projected,
                        with_tid=q < 1.0 and clock is None, extra_types=extra_types, ids=starts, matched=matched)
    sample = _sampled(rel, salt, q, ops, clock)
    out = exp.select(*[_col(f"__s.{p.name}") for p in parts], *[_col(f"__s.{n}") for n, _ in extra]).from_("__s")
    for k, s in enumerate(jp.slots):
        if not s.hops or _direct(s.hops, catalog):
            out = out.select(exp.alias_(_person_text(catalog, s.person_table, _col(f"__s.{flat(s.alias, s.column)}"), digest,
                                                     digested=flat(s.alias, s.column) in digested), f"__u{k}"))
            continue
        la = f"__lk{k}"
        cols = key_parts(s.column)
        on = _and([exp.EQ(this=_col(f"{la}.__k{i}"), expression=_col(f"__s.{flat(s.alias, p)}")) for i, p in enumerate(cols)])
        looked_up = _lookup(k, s, catalog, digest, spread=spread, digested=digested)
        if SPREAD in looked_up.named_selects:  # the start values' keyed hash, as the lookup computed it
            t0 = catalog[s.hops[0].table]
            mine = spread_of([(_col(f"__s.{flat(s.alias, p)}"), DIGEST_TYPE if flat(s.alias, p) in digested else _type_of(t0, p))
                              for p in cols], spread)
            assert mine is not None
            on = exp.And(this=on, expression=exp.EQ(this=_col(f"{la}.{SPREAD}"), expression=mine))
        out = out.join(looked_up.subquery(la), on=on, join_type="left")
        out = out.select(exp.alias_(_col(f"{la}.__users"), f"__u{k}"))
    return out.with_("__s", as_=sample)


def truncated_sums(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec], owner: ir.UserSlot, taus: Sequence[float], *,
                   salt: str, q: float, ops: SqlOps, caps: Sequence[tuple[str, str, int]]) -> exp.Select:
    """One row: ``__f<p>_<i>`` = Sum over owners u of min(taus[i] * units, total_u) for part p, as
    exact integer text (single owner: the truncation LP's closed form)."""
    parts = parts_of(jp)
    owner_col = flat(owner.alias, owner.column)
    clock = _sample_clock(ops, q)  # the sample is read once: by the per-owner aggregate
    rel = join_relation(jp, catalog, salt=salt, ops=ops, caps=caps, parts=parts,
                        extra=[exp.alias_(_col(owner_col), "__owner")], with_tid=q < 1.0 and clock is None, ids=["__owner"])
    sample = _sampled(rel, salt, q, ops, clock).subquery("__s")
    per_owner = (exp.select(_col("__owner"), *[exp.alias_(exp.func("sum", _col(p.name)), f"__t{k}")
                                                for k, p in enumerate(parts)])
                 .from_(sample).group_by(_col("__owner"))).subquery("__per_owner")
    cols = []
    for k, p in enumerate(parts):
        for i, tau in enumerate(taus):
            cap = int(tau * p.units)
            v = exp.Case(ifs=[exp.If(this=exp.Is(this=_col("__owner"), expression=exp.Null()), true=_col(f"__t{k}"))],
                         default=ops.least(_col(f"__t{k}"), exp.cast(_lit(cap), "HUGEINT")))
            total = exp.func("coalesce", exp.func("sum", v), exp.cast(_lit(0), "HUGEINT"))
            cols.append(exp.alias_(exp.cast(total, "VARCHAR"), f"__f{k}_{i}"))
    return exp.select(*cols).from_(per_owner)
