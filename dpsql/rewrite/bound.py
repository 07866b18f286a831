"""Per-user contribution bounding, inside DuckDB, as a sqlglot AST.

Given a plan and caps (C_u groups per unit, k rows per (unit, group)), build one query that

1. projects the privacy unit, the group keys, and clamped values, after the user's WHERE
   (rows with a NULL unit belong to nobody and are dropped; with public key domains, rows
   whose key is outside the domain are dropped first);
2. keeps at most k rows per (unit, group), chosen uniformly at random by ordering on a hash
   of (unit, group, the row's number within its (unit, group) by value, per-query secret
   salt): identical rows are interchangeable, and the choice depends only on that unit's rows;
3. keeps at most C_u groups per unit, chosen uniformly at random by ordering on a salted hash
   of (unit, group) (``salted_hash``): the salt is fresh per query and never shown, so the choice is
   unpredictable and independent of DuckDB's own PRNG;
4. aggregates per group: the distinct-unit count ``__users`` (each unit adds 0 or 1), and
   per aggregate its per-(unit, group) contribution summed over units.

Sensitivity enforced (removing one unit): at most C_u groups change; in each, ``__users``
changes by <= 1, a COUNT(*) / COUNT(col) by <= k, a SUM(col) by <= k * max(|lo|, |hi|), the
centred AVG sum by <= k * (hi - lo) / 2. ``tests/test_bounding.py`` checks this by removing
units from generated data.

Every user expression evaluated here (WHERE, group keys, the public-domain filter) is rendered
by dpsql's typer (``dpsql.plan.typer``): explicitly typed, total by construction (operators
that could fail on some value are guarded explicitly -- wide types, ``NULLIF`` divisors,
range guards on date_trunc -- never by ``TRY(...)``, whose slow path a row could trigger on
purpose), keys canonical (binary collation, one spelling of 0.0 and NaN). So whether the bounded query fails, and how a released key is spelled, never
depend on a row (design invariant 8; ``tests/test_hostile_fuzz.py``).

Caps may be ``math.inf`` (no bounding): the rewrite then returns exactly the original
aggregates, which the golden tests compare against DuckDB on the original query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlglot import exp

from dpsql.engine.base import source_name
from dpsql.errors import UnsupportedQueryError
from dpsql.plan import ir
from dpsql.plan.typer import TypeRefusal, domain_literal, type_key, type_predicate

SALT_PLACEHOLDER = "<per-query secret salt>"


@dataclass(frozen=True)
class Caps:
    max_groups_per_unit: float
    max_rows_per_group: float

    @property
    def groups_finite(self) -> bool:
        return not math.isinf(self.max_groups_per_unit)

    @property
    def rows_finite(self) -> bool:
        return not math.isinf(self.max_rows_per_group)


@dataclass(frozen=True)
class ReleasedColumn:
    """A column of the bounded result with its per-group sensitivity (L-inf, one unit)."""

    name: str
    sensitivity: float
    kind: str  # users | count | sum


def _lit(v: float | int | str) -> exp.Expression:
    if isinstance(v, str):
        return exp.Literal.string(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return exp.Literal.number(int(v))
    return exp.Literal.number(v)


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=False)


def _clamped(column: str, lo: float, hi: float, shift: float = 0.0) -> exp.Expression:
    """The value clamped to [lo, hi] (minus ``shift``); NULL stays NULL, as SQL aggregates expect.

    (DuckDB's GREATEST/LEAST skip NULL arguments, so a bare clamp would turn NULL into lo.)
    """
    c = exp.TryCast(this=exp.column(column, quoted=True), to=exp.DataType.build("DOUBLE"))
    e: exp.Expression = exp.func("least", exp.func("greatest", c.copy(), _lit(lo)), _lit(hi))
    if shift:
        e = exp.Sub(this=e, expression=_lit(shift))
    return exp.Case(ifs=[exp.If(this=exp.Is(this=c, expression=exp.Null()), true=exp.Null())], default=e)


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


def key_expression(key: ir.GroupKey, schema: dict[str, str]) -> exp.Expression:
    """A GROUP BY key rendered total and canonical (binary collation for text, one spelling
    of 0.0 and NaN for floating point); see ``dpsql.plan.typer.type_key``."""
    try:
        return type_key(key.expr, schema)[0]
    except TypeRefusal as e:
        raise _refused(e) from None


def salted_hash(columns: list[str], salt: str) -> exp.Expression:
    """A pseudo-random sort key for the given columns under a secret salt.

    DuckDB's multi-argument HASH combines the arguments' hashes almost linearly, so putting the
    salt in as one more argument would not randomise the order of a unit's groups across salts.
    The salt is therefore hashed together with the columns' hash as one string, which mixes
    fully: HASH(salt || CAST(HASH(columns...) AS VARCHAR)).
    """
    inner = exp.cast(exp.func("hash", *[_col(c) for c in columns]), "VARCHAR")
    return exp.func("hash", exp.DPipe(this=exp.Literal.string(salt), expression=inner, safe=True))


def source_column(agg: ir.Aggregate, caps: Caps) -> str:
    """The bounded column that carries ``agg``: with one row per (unit, group), COUNT(*) is
    the distinct-unit count itself, so both are released as one noisy value."""
    if agg.kind == ir.COUNT_UNITS or (agg.kind == ir.COUNT_STAR and caps.max_rows_per_group == 1):
        return "__users"
    return agg.name


def released_columns(plan: ir.QueryPlan, caps: Caps) -> list[ReleasedColumn]:
    """The numeric columns of the bounded result and the sensitivity each one has."""
    k = caps.max_rows_per_group
    cols = [ReleasedColumn("__users", 1.0, "users")]
    for a in plan.aggregates:
        if source_column(a, caps) == "__users":
            continue  # identical to __users
        if a.kind in (ir.COUNT_STAR, ir.COUNT_COL):
            cols.append(ReleasedColumn(a.name, k, "count"))
        elif a.kind == ir.SUM:
            assert a.bounds is not None
            cols.append(ReleasedColumn(a.name, k * max(abs(a.bounds[0]), abs(a.bounds[1])), "sum"))
        elif a.kind == ir.AVG:
            assert a.bounds is not None
            cols.append(ReleasedColumn(a.name + "_sum", k * (a.bounds[1] - a.bounds[0]) / 2.0, "sum"))
            cols.append(ReleasedColumn(a.name + "_cnt", k, "count"))
    return cols


def _domain_filter(plan: ir.QueryPlan) -> exp.Expression | None:
    """Rows whose key lies in the public domain: the canonical key compared with literals typed
    to the column at registration (``dpsql.plan.typer.type_domain``), e.g. CAST('2024-01-01' AS
    DATE), never bare text that DuckDB would cast or read as arithmetic."""
    conds: list[exp.Expression] = []
    schema = plan.table.schema
    for key in plan.keys:
        if key.domain is not None:
            assert isinstance(key.expr, exp.Column)
            ctype = schema[key.expr.name.lower()]
            lits = [domain_literal(v, ctype) for v in key.domain]
            conds.append(exp.In(this=exp.Paren(this=key_expression(key, schema)), expressions=lits))
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = exp.And(this=out, expression=c)
    return out


def bounded_query(
    plan: ir.QueryPlan,
    caps: Caps,
    *,
    salt: str = SALT_PLACEHOLDER,
    tau: int | None = None,
    unit_column: str,
    where: exp.Expression | None = None,
    use_public_domain: bool = True,
) -> exp.Expression:
    """The bounded aggregation as a sqlglot AST (render it with ``rewrite.render``)."""
    keys = [k.name for k in plan.keys]
    need_values = any(a.kind in (ir.COUNT_COL, ir.SUM, ir.AVG) for a in plan.aggregates)

    # 1. base projection -----------------------------------------------------------------
    proj: list[exp.Expression] = [exp.alias_(exp.column(unit_column, quoted=True), "__unit")]
    proj += [exp.alias_(key_expression(k, plan.table.schema), k.name) for k in plan.keys]
    value_cols: list[str] = []
    for a in plan.aggregates:
        if a.kind == ir.COUNT_COL:
            assert a.column is not None
            proj.append(exp.alias_(exp.column(a.column, quoted=True), f"{a.name}_v"))
            value_cols.append(f"{a.name}_v")
        elif a.kind == ir.SUM:
            assert a.column is not None and a.bounds is not None
            proj.append(exp.alias_(_clamped(a.column, *a.bounds), f"{a.name}_v"))
            value_cols.append(f"{a.name}_v")
        elif a.kind == ir.AVG:
            assert a.column is not None and a.bounds is not None
            mid = (a.bounds[0] + a.bounds[1]) / 2.0
            proj.append(exp.alias_(_clamped(a.column, *a.bounds, shift=mid), f"{a.name}_v"))
            value_cols.append(f"{a.name}_v")
    src = exp.to_table(plan.table.view or source_name(plan.table.name), quoted=True)
    user_where = where if where is not None else plan.where
    cond: exp.Expression = exp.Not(this=exp.Is(this=exp.column(unit_column, quoted=True), expression=exp.Null()))
    if user_where is not None:
        cond = exp.And(this=exp.Paren(this=guard(user_where, plan.table.schema)), expression=cond)
    dom = _domain_filter(plan) if use_public_domain else None
    if dom is not None:
        cond = exp.And(this=cond, expression=dom)
    base = exp.select(*proj).from_(src).where(cond)

    # 2. rows per (unit, group) ---------------------------------------------------------------
    part = [_col("__unit")] + [_col(k) for k in keys]
    rows_src: exp.Expression = base.subquery("__base")
    if caps.rows_finite and need_values:
        # number the rows of each (unit, group) by value (identical rows are interchangeable),
        # then keep the k whose salted hash of (unit, group, number) is smallest: a uniform
        # random subset that depends only on that unit's own rows
        idx = exp.Window(
            this=exp.RowNumber(),
            partition_by=[p.copy() for p in part],
            order=exp.Order(expressions=[exp.Ordered(this=_col(v)) for v in value_cols]),
        )
        numbered = exp.select("*", exp.alias_(idx, "__idx")).from_(rows_src).subquery("__numbered")
        h = salted_hash(["__unit", *keys, "__idx"], salt)
        rn = exp.Window(this=exp.RowNumber(), partition_by=part, order=exp.Order(expressions=[exp.Ordered(this=h)]))
        rows_src = (
            exp.select("*").from_(numbered).qualify(exp.LTE(this=rn, expression=_lit(caps.max_rows_per_group)))
        ).subquery("__rows")
    # one row per unit and group, counts only: the (unit, group) pairs themselves, no per-pair count
    pairs_only = caps.rows_finite and caps.max_rows_per_group == 1 and not need_values
    n_expr: exp.Expression = exp.Count(this=exp.Star())
    if caps.rows_finite and not need_values:
        n_expr = exp.func("least", n_expr, _lit(caps.max_rows_per_group))
    ug_proj: list[exp.Expression] = [_col("__unit")] + [_col(k) for k in keys]
    if not pairs_only:
        ug_proj.append(exp.alias_(n_expr, "__n"))
    for a in plan.aggregates:
        if a.kind == ir.COUNT_COL:
            ug_proj.append(exp.alias_(exp.Count(this=_col(f"{a.name}_v")), f"{a.name}_c"))
        elif a.kind == ir.SUM:
            ug_proj.append(exp.alias_(exp.Sum(this=_col(f"{a.name}_v")), f"{a.name}_s"))
        elif a.kind == ir.AVG:
            ug_proj.append(exp.alias_(exp.Sum(this=_col(f"{a.name}_v")), f"{a.name}_s"))
            ug_proj.append(exp.alias_(exp.Count(this=_col(f"{a.name}_v")), f"{a.name}_c"))
    if pairs_only:
        ug = exp.select(*ug_proj).from_(rows_src).distinct()
    else:
        ug = exp.select(*ug_proj).from_(rows_src).group_by(*part)

    # 3. groups per unit ---------------------------------------------------------------------
    # Per unit, keep the C_u (unit, group) rows with the smallest salted hash: one aggregate
    # per unit (arg_min with n = C_u over a struct of the row), then unnest. This is the same
    # choice as ROW_NUMBER() OVER (PARTITION BY unit ORDER BY hash) <= C_u, and faster.
    chosen: exp.Expression = ug.subquery("__ug")
    if caps.groups_finite and keys:
        fields = [c.alias_or_name for c in ug_proj if c.alias_or_name != "__unit"]
        struct = exp.Struct(
            expressions=[exp.PropertyEQ(this=exp.to_identifier(f), expression=_col(f)) for f in fields]
        )
        h = salted_hash(["__unit", *keys], salt)
        picked = exp.func("arg_min", struct, h, _lit(caps.max_groups_per_unit))
        per_unit = (
            exp.select(exp.alias_(exp.Unnest(expressions=[picked]), "__s")).from_(chosen).group_by(_col("__unit"))
        ).subquery("__per_unit")
        chosen = exp.select(
            *[exp.alias_(exp.func("struct_extract", _col("__s"), exp.Literal.string(f)), f) for f in fields]
        ).from_(per_unit).subquery("__chosen")

    # 4. per-group aggregation -------------------------------------------------------------------
    def zsum(col: str) -> exp.Expression:
        return exp.func("coalesce", exp.Sum(this=_col(col)), _lit(0))

    out: list[exp.Expression] = [_col(k) for k in keys] + [exp.alias_(exp.Count(this=exp.Star()), "__users")]
    for a in plan.aggregates:
        if a.kind == ir.COUNT_STAR:
            out.append(exp.alias_(exp.Count(this=exp.Star()) if pairs_only else zsum("__n"), a.name))
        elif a.kind == ir.COUNT_COL:
            out.append(exp.alias_(zsum(f"{a.name}_c"), a.name))
        elif a.kind == ir.SUM:
            out.append(exp.alias_(zsum(f"{a.name}_s"), a.name))
        elif a.kind == ir.AVG:
            out.append(exp.alias_(zsum(f"{a.name}_s"), a.name + "_sum"))
            out.append(exp.alias_(zsum(f"{a.name}_c"), a.name + "_cnt"))
    final = exp.select(*out).from_(chosen)
    if keys:
        final = final.group_by(*[_col(k) for k in keys])
        if tau is not None and tau > 1:
            final = final.having(exp.GTE(this=exp.Count(this=exp.Star()), expression=_lit(tau)))
    return final
