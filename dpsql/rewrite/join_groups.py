"""The SQL of a GROUP BY over a join (``dpsql.mechanisms.s4s_vector``), composed over ``SqlOps``.

* ``__dom``: the public key set, one row per key combination with its index ``__gid`` (0 ... d-1,
  ordered by the key values, NULL last): declared domains and years as literal lists; a public table's
  column as its distinct values after the WHERE conjuncts over that table alone (public rows only),
  NULL included when the table holds one (SQL's NULL group; a tuple's key matches the set's NULL-safely).
  A derived key's set over its columns' public values, a long run of consecutive integers or days among them
  counted out from crossed decimal digits rather than listed. The product of the keys' sets when there are
  several, the plain columns of one public table read together as its rows' combinations (its size known first:
  :func:`key_set_sizes` counts each crossed set alone, those combinations as one, before the charge).
* :func:`clipped_groups` (one person per tuple): per owner and group the sum of the tuple values
  (per part the exact integer sum of the weights, converted once: the same bits in any order), each
  owner's vector clipped in L2 to the public bound C (scaled by min(1, C/norm)); tuples whose owner
  is NULL reach nobody and count unclipped. The sum over owners is exact: each person's clipped
  component is truncated toward zero onto the grid 2^-k, k = ``fixed_point_scale(C)`` (C·2^k in
  [2^51, 2^52)), and the integers trunc(component·2^k) are added as integers (``SqlOps.exact_sum``:
  HUGEINT on DuckDB, DECIMAL(38, 0) on Spark), in whatever order the engine adds them; a tuple
  reaching nobody is put on its own grid 2^-k0 (M·2^k0 in [2^51, 2^52), M the largest value of a
  tuple) and those integers are added likewise. Truncation toward zero never enlarges a component,
  so every person's grid vector still has norm <= C(1 + 2^-30). One row per key of ``__dom``: both
  exact integers as text (``0`` where no tuple), so that nothing is rounded before the noise
  (``dpsql.mechanisms.s4s_vector.clipped_totals``, ``dpsql.noise.add_exactly``): a double sum across
  persons rounds at the running total's last place, which the total of the tuples reaching nobody
  (no public bound) can make coarser than C itself. All inside the engine: only 2d integers reach
  Python.
* :func:`sampled_groups` (general): the Poisson-sampled tuples of ``dpsql.rewrite.joins`` with
  their group index, UNION ALL the rows of ``__dom`` (``__tuple`` NULL): only the sample and the
  public key set reach Python.

Portable SQL: the same text runs on DuckDB and, lowered (``dpsql.engine.spark_ops``), on Spark
(a declared domain's ``unnest`` of a list becomes ``explode`` of an array; the union names every
column on both sides). With the portable keyed hash both engines sample and cap the same tuples.

A tuple whose key is not in the key set is dropped (inner join with ``__dom``): a per-tuple filter.

Text keys are canonical (design invariant 8), as in a single-table GROUP BY: the key set's DISTINCT,
its order and the matching of a tuple's key to it use the binary collation, whatever collation the
owner's connection or column declares (``nocase`` would count a tuple under 'AUTO' and 'auto' both:
one person's tuples twice, beyond Delta). A bare text join key with a public key set, read as a value nowhere
else, is carried by the join as its salted digest (``dpsql.rewrite.joins.matched_keys``) and matched to the
digest of the key set's text (the same digest of the same text under the binary collation, NULL for NULL): one
person's long key is never carried with each of their tuples, and the released key is the key set's text.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from sqlglot import exp

from dpsql.catalog import TableSpec
from dpsql.engine.base import SqlOps, source_name
from dpsql.plan import ir
from dpsql.plan.joins import SEP, flat
from dpsql.plan.typer import DIGEST_TYPE, domain_literal, parse_type
from dpsql.rewrite import joins
from dpsql.rewrite.bound import exact_text, fixed_point_scale, guard
from dpsql.rewrite.joins import KeyDigest, Part, _split_where, join_relation, parts_of, sampled_tuples


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=False)


_TEXT_TYPES = ("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR", "NVARCHAR")


def _canonical(k: ir.JoinKey, e: exp.Expression) -> exp.Expression:
    """A key value compared, grouped and ordered under the binary collation when it is text."""
    if k.kind != "year" and k.sql_type.upper().split("(")[0].strip() in _TEXT_TYPES:
        return exp.Collate(this=e, expression=exp.to_identifier("binary", quoted=True))
    return e


def _key_set(k: ir.JoinKey, jp: ir.JoinPlan, catalog: Mapping[str, TableSpec]) -> exp.Select:
    # a key with no public key set (kind 'private') is refused by the router before any read; never read it here
    assert k.kind != "private" and k.refusal is None, f"GROUP BY {k.sql}: no public key set"
    if k.kind == "derived":
        return _derived_set(k, jp, catalog)
    if k.domain is not None:
        # a year is BIGINT, as year() is in SQL (a bare literal would be an INTEGER key)
        vals = [exp.cast(exp.Literal.number(v), "BIGINT") if k.kind == "year" else domain_literal(v, k.sql_type) for v in k.domain]
        listed = exp.select(exp.alias_(exp.func("unnest", exp.Array(expressions=vals)), k.name)).subquery("__domain")
        return exp.select(exp.alias_(_canonical(k, _col(k.name)), k.name)).from_(listed)
    return _public_set([k], jp, catalog)


def _public_set(ks: Sequence[ir.JoinKey], jp: ir.JoinPlan, catalog: Mapping[str, TableSpec]) -> exp.Select:
    """The key set of plain columns of one public table (``ks``, one alias): the distinct rows of those columns
    after the WHERE conjuncts over that table alone, NULL included where the table holds one (SQL's NULL group; read
    from the public table alone). Several columns of one table are its rows' combinations, never their product
    (``GROUP BY s.s_suppkey, s.s_name``: one key per supplier)."""
    alias = ks[0].alias
    t = catalog[dict(jp.inputs)[alias]]
    own = _public_conditions(jp, alias)
    cols = sorted({*[k.column for k in ks], *[c.name.split("__", 1)[1] for e in own for c in e.find_all(exp.Column)]})
    rel: exp.Expression = exp.select(*[exp.alias_(exp.column(c, quoted=True), flat(alias, c)) for c in cols]).from_(
        exp.to_table(t.view or source_name(t.name), quoted=True))
    conds: list[exp.Expression] = [guard(c, dict(jp.flat_schema)) for c in own]
    q = exp.select(*[exp.alias_(_canonical(k, _col(flat(alias, k.column))), k.name) for k in ks]).distinct().from_(
        rel.subquery("__p"))
    for c in conds:
        q = q.where(c)
    return q


#: a run of consecutive integers or days longer than this is counted out in the query, not listed value by value
_LISTED = 64


def _run_start(values: tuple[Any, ...]) -> int | datetime.date | None:
    """The first of ``values`` when they are consecutive integers or consecutive days (an integer range's or a DATE
    range's public values, ``dpsql.plan.join_groups._public_values``), else None."""
    first = values[0] if values else None
    if isinstance(first, int) and not isinstance(first, bool):
        ok = all(type(v) is int and v == first + i for i, v in enumerate(values))
    elif isinstance(first, datetime.datetime):  # a TIMESTAMP column's days (midnights) read through its date alone
        ok = all(type(v) is datetime.datetime and v - first == datetime.timedelta(days=i) for i, v in enumerate(values))
        ok = ok and first == datetime.datetime(first.year, first.month, first.day)
    elif isinstance(first, datetime.date):
        ok = all(type(v) is datetime.date and (v - first).days == i for i, v in enumerate(values))
    else:
        return None
    return first if ok else None


def _values(name: str, typ: str, values: tuple[Any, ...]) -> exp.Select:
    """One column ``name`` holding ``values`` (typed ``typ``), one row each: listed; a long run of consecutive integers
    or days as its first value plus 0 ... n-1, the offsets counted out from crossed decimal digits (a list of literals
    as long as a declared range, up to 100 000, took minutes to copy and render at each query)."""
    start = _run_start(values) if len(values) > _LISTED else None
    if start is None:
        return exp.select(exp.alias_(exp.func("unnest", exp.Array(expressions=[domain_literal(v, typ) for v in values])), name))
    places = len(str(len(values) - 1))
    digits = [exp.select(exp.alias_(exp.func("unnest", exp.Array(expressions=[exp.Literal.number(d) for d in range(10)])),
                                    "__d")).subquery(f"__p{i}") for i in range(places)]
    offset: exp.Expression = _col("__p0.__d")
    for i in range(1, places):
        offset = exp.Add(this=offset, expression=exp.Mul(this=_col(f"__p{i}.__d"), expression=exp.Literal.number(10 ** i)))
    # a day's offset is added to the DATE (DATE + INTEGER is a DATE on both engines; a midnight is that DATE cast to
    # TIMESTAMP); an integer's to the first value
    if isinstance(start, datetime.date):
        day = start.date() if isinstance(start, datetime.datetime) else start
        value = exp.cast(exp.cast(exp.Add(this=domain_literal(day, "DATE"), expression=exp.Paren(this=offset)), "DATE"), typ)
    else:
        value = exp.cast(exp.Add(this=exp.Literal.number(start), expression=exp.Paren(this=offset)), typ)
    q = exp.select(exp.alias_(value, name)).from_(digits[0])
    for d in digits[1:]:
        q = q.join(d, join_type="cross")
    return q.where(exp.LT(this=exp.Paren(this=offset.copy()), expression=exp.Literal.number(len(values))))


def _derived_set(k: ir.JoinKey, jp: ir.JoinPlan, catalog: Mapping[str, TableSpec]) -> exp.Select:
    """A ``derived`` key's set (``dpsql.plan.join_groups``), from public values only: a CASE's literal results; the
    expression's distinct values over the product of its columns' public values; or over the rows of the one public
    table it reads, after the WHERE conjuncts over that table alone."""
    if k.results is not None:
        vals = [exp.cast(exp.Null(), k.sql_type) if v is None else domain_literal(v, k.sql_type) for v in k.results]
        listed = exp.select(exp.alias_(exp.func("unnest", exp.Array(expressions=vals)), k.name)).subquery("__domain")
        return exp.select(exp.alias_(_canonical(k, _col(k.name)), k.name)).from_(listed)
    value = exp.alias_(_canonical(k, k.expr.copy()), k.name)
    if k.value_sets is not None:
        q = exp.select(value).distinct()
        for j, (name, typ, values) in enumerate(k.value_sets):
            listed = _values(name, typ, values).subquery(f"__v{j}")
            q = q.from_(listed) if j == 0 else q.join(listed, join_type="cross")
        own = [guard(c, dict(jp.flat_schema)) for c in _own_conditions(k, jp)]
        if own:
            q = q.where(_kept(k, own))
        return q
    t = catalog[dict(jp.inputs)[k.alias]]
    own = _public_conditions(jp, k.alias)
    read = [c.name for c in k.expr.find_all(exp.Column)] + [c.name for e in own for c in e.find_all(exp.Column)]
    cols = sorted({c.split("__", 1)[1] for c in read})
    rel = exp.select(*[exp.alias_(exp.column(c, quoted=True), flat(k.alias, c)) for c in cols]).from_(
        exp.to_table(t.view or source_name(t.name), quoted=True))
    q = exp.select(value).distinct().from_(rel.subquery("__p"))
    for c in own:
        q = q.where(guard(c, dict(jp.flat_schema)))
    return q


#: types whose SQL equality is identity of the value (an ON equality then makes both sides one value): integers, exact
#: decimals, dates, timestamps without a zone, booleans, UUIDs and text (joins compare text under the binary collation);
#: not floating point (-0.0 = 0.0, NaN) nor anything else
_IDENTITY_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
                   "UHUGEINT", "DECIMAL", "DATE", "TIMESTAMP", "BOOLEAN", "UUID", "VARCHAR")


def _public_conditions(jp: ir.JoinPlan, alias: str) -> list[exp.Expression]:
    """The WHERE's conjuncts a public input ``alias``'s rows must meet for a tuple holding them to pass: those over its
    columns alone, and those over one other input's columns alone when the inner join's ON equalities make each of
    those columns equal, in every tuple, to a column of ``alias`` of the same type whose equality is identity (then the
    conjunct holds of that column too, rewritten onto it). A key set narrowed by them keeps every key a tuple passing
    the WHERE can have (``WHERE c.c_nationkey > 5`` over ``ON n.n_nationkey = c.c_nationkey`` keeps the nations over 5)."""
    local, _ = _split_where(jp)
    out = list(local.get(alias, []))
    if jp.left or alias in jp.left:
        return out  # (a LEFT-joined lookup's columns are NULL where no row matched: its ON equalities do not always hold)
    schema = dict(jp.flat_schema)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for a, b in jp.conditions:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members: dict[str, list[str]] = {}
    for n in {x for pair in jp.conditions for x in pair}:
        members.setdefault(find(n), []).append(n)

    def identity(n: str) -> bool:
        typ = schema.get(n, "").upper()
        return typ.split("(")[0].strip() in _IDENTITY_TYPES

    for other, conds in local.items():
        if other == alias:
            continue
        for c in conds:
            onto: dict[str, str] = {}
            for col in c.find_all(exp.Column):
                same = sorted(m for m in members.get(find(col.name), []) if m.split(SEP, 1)[0] == alias
                              and schema.get(m, "").upper() == schema.get(col.name, "").upper() and identity(m))
                if not same:
                    break
                onto[col.name] = same[0]
            else:
                if onto:
                    out.append(c.transform(lambda n, onto=onto: exp.column(onto[n.name], quoted=False)
                                           if isinstance(n, exp.Column) and n.name in onto else n))
    return out


def _own_conditions(k: ir.JoinKey, jp: ir.JoinPlan) -> list[exp.Expression]:
    """The WHERE's conjuncts that read a plain column key's column alone (``o.o_orderdate < DATE '1995-02-01'``), when
    its key set is exactly the column's public values (a declared domain, a BOOLEAN's two values, a DATE column's days,
    an integer column's integers): applied to the key set too, so that the set (and its size, counted before the
    charge) holds only the keys those conjuncts let through. A tuple is counted only under its own value of the
    column, in the set, and only if it meets every conjunct: the same tuples are counted, and the keys left out are
    those no tuple that meets the WHERE can have (which the post-processing's filter of the released keys removed
    after the release until now). The same typed condition, on the same engine, over the same typed values decides
    both (public values only). Not for a TIMESTAMP read through its date (the set holds its days' midnights, not the
    column's values) nor for an expression of several columns.

    A key computed from that one column (``year(o.o_orderdate)``, ``date_trunc('month', d)``, ``d + 1``, ``i // 10``)
    is the expression over the values those conjuncts let through: a tuple meeting the WHERE whose column holds a
    public value has its key in the set; one whose column lies outside its declared domain or range (a declaration
    the data does not honour) may find its key gone, as a plain column's key is (such a tuple is in no group)."""
    if k.value_sets is None or len(k.value_sets) != 1:
        return []
    name, typ, _ = k.value_sets[0]
    if ({c.name for c in k.expr.find_all(exp.Column)} != {name}
            or parse_type(typ).kind not in ("date", "int", "varchar", "bool", "decimal", "float")
            or parse_type(dict(jp.flat_schema).get(name, "")).name != parse_type(typ).name):
        return []
    local, _ = _split_where(jp)
    return [c for conds in local.values() for c in conds if {col.name for col in c.find_all(exp.Column)} == {name}]


def _kept(k: ir.JoinKey, own: list[exp.Expression]) -> exp.Expression:
    """The filter of a key set by the conditions ``own`` (``_own_conditions``, guarded) on its one column. A key
    computed from the column (not the column itself) is the expression's value at NULL for a tuple whose column is
    NULL: ``CASE WHEN d > X THEN 'late' END`` is NULL there as at every day up to X, ``COALESCE(d, DATE '1992-01-01')``
    is that day. Where the conditions hold at NULL too (``d IS NULL OR d > Y``), such a tuple meets them while its key
    may be the value of a day they drop: the set is then not narrowed (as before the conditions narrowed it), so that
    key stays (it was dropped, and ``WHERE d IS NULL`` refused for free, though the NULL group held rows)."""
    held = exp.and_(*own) if len(own) > 1 else own[0]
    name, typ, _ = k.value_sets[0] if k.value_sets else ("", "", ())
    col = k.expr.this if isinstance(k.expr, exp.Cast) and parse_type(k.expr.to.sql(dialect="duckdb")).name == \
        parse_type(typ).name else k.expr
    if isinstance(col, exp.Column) and col.name == name:
        return held  # the column itself: NULL is no key of its set, a tuple whose column is NULL is in no group
    null = exp.Cast(this=exp.Null(), to=exp.DataType.build(typ, dialect="duckdb"))
    at_null = held.copy().transform(lambda n: null.copy() if isinstance(n, exp.Column) and n.name == name else n)
    return exp.or_(exp.paren(held, copy=False), exp.paren(at_null, copy=False))


def _parts(jp: ir.JoinPlan) -> list[list[ir.JoinKey]]:
    """The keys whose sets are crossed: the plain columns of one public table together (its rows' combinations), every
    other key alone."""
    parts: list[list[ir.JoinKey]] = []
    together: dict[str, list[ir.JoinKey]] = {}
    for k in jp.keys:
        if k.kind == "public" and k.alias in together:
            together[k.alias].append(k)
            continue
        parts.append([k])
        if k.kind == "public":
            together[k.alias] = parts[-1]
    return parts


def _part_set(part: Sequence[ir.JoinKey], jp: ir.JoinPlan, catalog: Mapping[str, TableSpec]) -> exp.Select:
    return _public_set(part, jp, catalog) if len(part) > 1 else _key_set(part[0], jp, catalog)


def key_set_sizes(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec]) -> exp.Select:
    """One row: ``__n<i>``, the number of keys of each crossed set (:func:`_parts`: one public table's columns counted
    as its rows' combinations, as :func:`key_set` builds them), each counted alone (public rows only), so that the size
    of their product is known without building it."""
    counts = [exp.alias_(exp.select(exp.func("count", exp.Star())).from_(_part_set(p, jp, catalog).subquery(f"__s{i}"))
                         .subquery(), f"__n{i}") for i, p in enumerate(_parts(jp))]
    return exp.select(*counts)


def key_set(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec]) -> exp.Select:
    """``__dom``: every key combination and its index ``__gid`` (module docstring)."""
    names = [k.name for k in jp.keys]
    # the plain columns of one public table are read together (its rows' combinations); every other key alone
    parts = _parts(jp)
    where = {k.name: j for j, part in enumerate(parts) for k in part}
    sets = [_part_set(part, jp, catalog) for part in parts]
    q = exp.select(*[_col(f"__d{where[n]}.{n}") for n in names]).from_(sets[0].subquery("__d0"))
    for j, part_set in enumerate(sets[1:], start=1):
        q = q.join(part_set.subquery(f"__d{j}"), join_type="cross")
    order = exp.Window(this=exp.RowNumber(), order=exp.Order(expressions=[exp.Ordered(this=_col(n), nulls_first=False)
                                                                         for n in names]))
    # BIGINT on every engine (ROW_NUMBER is an INT on Spark): the index only, never released
    return q.select(exp.alias_(exp.cast(exp.Sub(this=order, expression=exp.Literal.number(1)), "BIGINT"), "__gid"))


def _digested_keys(jp: ir.JoinPlan, caps: Sequence[tuple[str, str, int]]) -> tuple[frozenset[int], list[str]]:
    """The indexes of the keys the join carries as their salted digest (``joins.matched_keys``: a bare text join key
    with a public key set, read as a value nowhere else), and the names of their projections ``__x<i>``."""
    names = [f"__x{i}" for i in range(len(jp.keys))]
    extra = [exp.alias_(k.expr.copy(), n) for k, n in zip(jp.keys, names, strict=True)]
    # (looked up in the module at each call, as join_relation does: the one decision, whoever replaces it)
    digested = joins.key_digests(jp, caps, extra, (), names)
    return frozenset(i for i, k in enumerate(jp.keys) if isinstance(k.expr, exp.Column) and k.expr.name in digested), names


def _on_keys(jp: ir.JoinPlan, left: str, digested: frozenset[int] = frozenset(),
             digest: KeyDigest | None = None) -> exp.Expression:
    """A tuple's keys matched with ``__dom``'s; a key carried as its digest (``digested``) with the digest of the
    set's text (the same digest of the same text under the binary collation; NULL where the key is NULL)."""
    out: exp.Expression | None = None
    for i, k in enumerate(jp.keys):
        mine = _col(f"{left}.__x{i}")
        if i in digested and digest is not None:
            theirs = digest.of(_canonical(k, _col(f"__dom.{k.name}")), k.sql_type)
        else:
            mine, theirs = _canonical(k, mine), _canonical(k, _col(f"__dom.{k.name}"))
        # NULL matches NULL: the NULL key of a public table's column (``_key_set``)
        c = exp.NullSafeEQ(this=mine, expression=theirs)
        out = c if out is None else exp.And(this=out, expression=c)
    assert out is not None
    return out


def _value(parts: list[Part]) -> exp.Expression:
    """The tuple's signed value in the aggregate's units (count: 1; sum: its clamped value, on the
    2^-20 grid of ``dpsql.rewrite.joins``), at most :func:`value_bound` in magnitude."""
    out: exp.Expression | None = None
    for p in parts:
        v = exp.Mul(this=exp.cast(_col(p.name), "DOUBLE"), expression=exp.Literal.number(repr(p.sign * p.scale / p.units)))
        out = v if out is None else exp.Add(this=out, expression=v)
    assert out is not None
    return out


def value_bound(parts: Sequence[Part]) -> float:
    """M: the largest magnitude of one tuple's value (:func:`_value`): a part's weight is at most
    ``units`` (so w * (scale / units) <= scale, rounding being monotone) and a tuple's value is
    nonzero in one part only (its positive or its negative part)."""
    return max(p.scale for p in parts)


def clip_scale(clip: float) -> int:
    """k of the persons' fixed-point grid 2^-k: ``fixed_point_scale(C)`` (C * 2^k in [2^51, 2^52)), so a
    clipped component (at most C(1 + 2^-30) in magnitude) times 2^k is an integer below 2^53."""
    return fixed_point_scale(float(clip))


def unowned_scale(parts: Sequence[Part]) -> int:
    """k of the grid of the tuples reaching nobody: ``fixed_point_scale(M)``, M = :func:`value_bound`."""
    return fixed_point_scale(value_bound(parts))


def _person_total(parts: list[Part], ops: SqlOps) -> exp.Expression:
    """A person's total in one group: per part the exact integer sum of its weights, converted to
    DOUBLE once and scaled (one rounding per part; the same bits on every engine and in any order)."""
    out: exp.Expression | None = None
    for p in parts:
        v = exp.Mul(this=ops.from_fixed_point(ops.exact_sum(_col(p.name)), 0),
                    expression=exp.Literal.number(repr(p.sign * p.scale / p.units)))
        out = v if out is None else exp.Add(this=out, expression=v)
    assert out is not None
    return out


def clipped_groups(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec], owner: ir.UserSlot, clip: float, *, salt: str,
                   ops: SqlOps, caps: Sequence[tuple[str, str, int]]) -> exp.Select:
    """One row per key (in no order): the keys, ``__gid``, ``__c`` = Σ_u trunc(clip_C(v_u)[g]·2^k) (k of :func:`clip_scale`)
    and ``__z`` = Σ_t trunc(value_t·2^k0) over the tuples reaching nobody (k0 of :func:`unowned_scale`), both
    exact integers as text (module docstring; ``dpsql.mechanisms.s4s_vector.clipped_totals`` reads them)."""
    parts = parts_of(jp)
    k, k0 = clip_scale(clip), unowned_scale(parts)
    extra = [exp.alias_(k_.expr.copy(), f"__x{i}") for i, k_ in enumerate(jp.keys)]
    extra.append(exp.alias_(_col(flat(owner.alias, owner.column)), "__owner"))
    digested, names = _digested_keys(jp, caps)
    rel = join_relation(jp, catalog, salt=salt, ops=ops, caps=caps, parts=parts, extra=extra, with_tid=False, ids=["__owner"],
                        matched=names)
    nobody = exp.Is(this=_col("__j.__owner"), expression=exp.Null())
    # tuples reaching nobody count in full: each on its own grid, exactly summed (their total has no public bound)
    unowned = ops.exact_sum(exp.Case(ifs=[exp.If(this=nobody, true=ops.fixed_point(exp.Paren(this=_value(parts)), k0))]))
    # every builder below extends a tree built here and used once: in place (copy=False), not by a deep copy of
    # the whole join at each step (the copies were most of the planning time of a GROUP BY join)
    per = (exp.select(_col("__j.__owner"), _col("__dom.__gid"), exp.alias_(_person_total(parts, ops), "__v"),
                      exp.alias_(unowned, "__f"))
           .from_(rel.subquery("__j", copy=False), copy=False)
           .join(exp.to_table("__dom"), on=_on_keys(jp, "__j", digested, KeyDigest(salt, ops)), join_type="inner", copy=False)
           .group_by(_col("__j.__owner"), _col("__dom.__gid"), copy=False))
    # each owner's norm by a window over its rows (no self-join: the join is computed once on every engine)
    norm = exp.func("sqrt", exp.Window(this=exp.func("sum", exp.Mul(this=_col("__v"), expression=_col("__v"))),
                                       partition_by=[_col("__owner")]))
    c = exp.Literal.number(repr(float(clip)))
    # each person's clipped component truncated toward zero onto the grid 2^-k (never larger in magnitude)
    clipped = exp.Case(ifs=[
        exp.If(this=exp.Is(this=_col("__owner"), expression=exp.Null()), true=exp.Null()),
        exp.If(this=exp.LTE(this=_col("__norm"), expression=c), true=ops.fixed_point(_col("__v"), k))],
        default=ops.fixed_point(exp.Mul(this=_col("__v"), expression=exp.Paren(this=exp.Div(this=c, expression=_col("__norm")))), k))
    normed = exp.select(_col("__owner"), _col("__gid"), _col("__v"), _col("__f"), exp.alias_(norm, "__norm")).from_(
        per.subquery("__t", copy=False), copy=False)
    per_group = (exp.select(_col("__gid"), exp.alias_(ops.exact_sum(clipped), "__c"), exp.alias_(ops.exact_sum(_col("__f")), "__z"))
                 .from_(normed.subquery("__n", copy=False), copy=False).group_by(_col("__gid"), copy=False))
    # the exact integers as text (every engine spells an integer the same way): no rounding before the noise
    texts = [exp.alias_(exact_text(_col(f"__g.__{n}")), f"__{n}") for n in ("c", "z")]
    out = (exp.select(*[_col(f"__dom.{k_.name}") for k_ in jp.keys], _col("__dom.__gid"), *texts)
           .from_("__dom", copy=False)
           .join(per_group.subquery("__g", copy=False), on=exp.EQ(this=_col("__dom.__gid"), expression=_col("__g.__gid")),
                 join_type="left", copy=False))
    # no ORDER BY: the release sorts the rows by ``__gid`` (``s4s_vector._domain``, ``clipped_totals``); on Spark a
    # global sort is one more job (the range partitioning's sample) and one more shuffle per query
    return out.with_("__dom", as_=key_set(jp, catalog), copy=False)


def sampled_groups(jp: ir.JoinPlan, catalog: Mapping[str, TableSpec], *, salt: str, q: float, ops: SqlOps,
                   caps: Sequence[tuple[str, str, int]] = ()) -> exp.Expression:
    """The sampled tuples with ``__gid``, and the rows of ``__dom`` (``__tuple`` NULL)."""
    extra = [(f"__x{i}", k.expr) for i, k in enumerate(jp.keys)]
    digested, names = _digested_keys(jp, caps)
    types = {f"__x{i}": DIGEST_TYPE if i in digested else "BIGINT" if k.kind == "year" else k.sql_type
             for i, k in enumerate(jp.keys)}
    st = sampled_tuples(jp, catalog, salt=salt, q=q, ops=ops, caps=caps, extra=extra, extra_types=types, matched=names)
    keep = [c.split(".")[-1] for c in st.named_selects if not c.split(".")[-1].startswith("__x")]
    names = [k.name for k in jp.keys]
    # a positional UNION ALL with every column named on both sides (Spark has no UNION BY NAME); an
    # untyped NULL takes the other side's type on both engines
    tuples = (exp.select(*[_col(f"__st.{c}") for c in keep], _col("__dom.__gid"), exp.alias_(exp.true(), "__tuple"),
                         *[exp.alias_(exp.Null(), n) for n in names])
              .from_(st.subquery("__st"))
              .join(exp.to_table("__dom"), on=_on_keys(jp, "__st", digested, KeyDigest(salt, ops)), join_type="inner"))
    dom = exp.select(*[exp.alias_(exp.Null(), c) for c in keep], _col("__dom.__gid"), exp.alias_(exp.Null(), "__tuple"),
                     *[_col(f"__dom.{n}") for n in names]).from_("__dom")
    union = exp.Union(this=tuples, expression=dom, distinct=False)
    return exp.select("*").from_(union.subquery("__all")).with_("__dom", as_=key_set(jp, catalog))
