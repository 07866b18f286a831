"""Lookup joins on the one-table path: one private table joined with public lookup tables on their keys.

A lookup join (``dpsql.mechanisms.registry._lookup_join``, public metadata only): one private input, every
other input public, one owner per tuple with Delta enforced, and every public input capped at one row per
value of the column the join enters it through (a declared key; a key duplicated in the lookup's rows is refused
before the charge, ``dpsql._public_keys``, and the cap keeps this claim should the data change after that check). Its rows are a row-wise function of the
private table's rows: the joined relation ``J`` is rendered (``dpsql.rewrite.joins.join_relation``) with
the lookups' caps (the private input is capped later, by the one-table bounding, after the whole WHERE as on one
table), the WHERE applied, the inner join dropping every private row whose lookup key is NULL or absent from
the lookup (SQL semantics). So each
private row yields at most one row of ``J``, carrying the same person (the owner column, a column of the
private table), and the lookup rows it reads are public and fixed.

Privacy claim. Neighbouring relation: add or remove one person with all their rows (user level). Adding a
person adds their private rows only; the public inputs and their one-row-per-key caps are the same (public
data: each key's kept row is chosen among that key's lookup rows alone, ``dpsql.rewrite.bound.cap_rows``). So
``J`` changes by exactly that person's rows, all holding their unit:
``J`` is a one-table relation with unit column ``<owner alias>__<owner column>``, and the one-table
bounding (``dpsql.rewrite.bound.bounded_query``: at most L rows per person; GROUP BY: at most k rows per
(person, group) in at most C_u groups, the groups taken over the *joined* rows' keys, so a person whose
rows reach several groups through the lookup is capped like any other) gives the one-table sensitivities
(``dpsql.mechanisms.basic``, ``dpsql.mechanisms.sparse_histogram``) with the private table's caps.
Rows whose unit is NULL are dropped (they belong to nobody), as on one table.

LEFT JOIN (``ir.JoinPlan.left``: the route admits it only from the private table to public lookups on their declared
keys, ``dpsql.mechanisms.registry._left_problem``). The bounded query joins those lookups last, each by a LEFT JOIN,
and applies their WHERE conditions after it, so ``J`` is SQL's: every private row that passes the WHERE appears
exactly once, its lookup columns NULL where its key is NULL or matches no (capped) lookup row. Each private row
still yields at most one row of ``J`` (exactly one before the WHERE), carrying its own person, and the lookup rows
are public and fixed: ``J`` is again a row-wise function of the private rows, and the privacy claim above holds
unchanged, with the same caps and sensitivities. A GROUP BY over a LEFT-joined lookup's column with a declared
domain releases that domain plus NULL (the group of the unmatched rows): a public key set fixed by the catalog,
released whatever the data, so whether the NULL group appears tells nothing about anyone.

Aggregates the join mechanisms do not answer (COUNT(DISTINCT ...), VARIANCE / STDDEV, COVAR_* / CORR / REGR_*, MIN,
MAX and the quantiles: ``ir.JoinPlan.one_table_only``): the query is analysed as one table's over ``J``
(``ir.JoinPlan.statement``, ``dpsql.plan.analyze.analyze_lookup``), so each is computed over the bounded rows of ``J``
as over a table's rows, with the same sensitivity argument (``J`` is a row-wise function of the private rows). No
stored synopsis is read for ``J`` (a synopsis holds one table's own rows: ``reuse`` is refused).

People counted over a join (``registry._people_count_plan``): a join of any inputs, private ones included, whose every
tuple belongs to one person (``PeopleBound.single_owner``, Delta enforced: ``dpsql.plan.joins``), asked only
``COUNT(DISTINCT c)``, c the owner's column or a column its ON equates with it (read as the owner's column). ``J`` is
the join rendered as the join mechanisms render it, every input capped at its rows per joined value (each cap's
partition lies within one person's rows: ``_uniform_caps``) and every key entered on behalf of a person kept only where
the base table holds it once (``dpsql.rewrite.joins._unique_filter``), the WHERE applied. Neighbouring relation: add or
remove one person with every row reaching them. Each tuple of ``J`` holds rows of its owner and public rows only, and
the rows the caps and the unique-key filter keep in one partition depend on that partition's rows alone, so adding a
person adds tuples whose unit is that person and changes no other tuple: ``J`` is again a one-table relation with unit
column ``<owner alias>__<owner column>``, and the one-table count of units (0 or 1 per person and group, in at most
C_u groups: the owner's table's caps) has sensitivity 1 per group, whatever each person's number of tuples. Any other
aggregate is refused (it would count or sum capped join tuples, which the join mechanisms answer).

The mechanisms read ``J`` as a CTE named :data:`VIEW` placed first in their bounded query when they read it once, and
as that relation itself at each read when they read it more than once (:meth:`LookupJoin.bounded`), as the one-table
path reads a source's view: DuckDB computes and holds a CTE it reads twice, so one person's long private key, carried
with each of their joined rows, was held in memory whole (``tests/test_adversary_round43.py``). Every read is the same
rows: ``J`` is a function of the private and public rows and the salt (no per-row draw; each lookup's kept row per key
chosen by the keyed hash of its position among that key's rows ordered by their content, interchangeable rows alike). Every
choice here is made from the catalog and the SQL (the route is data independent), the caps from the private
table's registration lowered by the options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sqlglot import exp

from dpsql.catalog import ColumnSpec, TableSpec
from dpsql.engine.base import SqlOps
from dpsql.mechanisms.base import Description, Mechanism
from dpsql.plan import ir
from dpsql.plan.joins import LOOKUP_VIEW, SEP, PeopleBound, flat, where_conjuncts
from dpsql.rewrite.bound import is_text

#: the name of the joined relation in the bounded query
VIEW = LOOKUP_VIEW


def one_table_plan(plan: ir.QueryPlan, people: PeopleBound, catalog: Mapping[str, TableSpec]) -> ir.QueryPlan | None:
    """The plan of a lookup join as a query over one table, the joined relation (module docstring): its
    schema the join's flat columns, its unit the owner's column, its caps and tau the private table's.
    None (then the join mechanisms answer) when the owner is not a column of the private input holding the person,
    or for a GROUP BY year(col), or another expression with a public key set (``derived``) of an inner join (the
    one-table path declares key sets for columns only; under a LEFT JOIN, which the join mechanisms do not answer, such
    an expression is a one-table key, answered as on one table: by the sparse histogram)."""
    jp = plan.join
    owner = people.owner
    if jp is None or owner is None or "," in owner.column or len(owner.hops) > 1:
        return None
    if any(k.kind == "year" for k in jp.keys):  # a key set of years: the one-table path knows domains of columns only
        return None
    if not jp.left and any(k.kind == "derived" for k in jp.keys):  # an expression's public key set, released in full by
        return None  # the join mechanisms; under a LEFT JOIN (inner joins only there) the one-table path's keys
    private = catalog[dict(jp.inputs)[owner.alias]]
    if private.public:
        return None
    columns: dict[str, ColumnSpec] = {}
    for a, t in jp.inputs:
        for c, spec in catalog[t].columns.items():
            if flat(a, c) in jp.flat_schema:
                columns[flat(a, c)] = dataclasses.replace(spec, name=flat(a, c))
    table = TableSpec(
        name=private.name, source=None, source_kind=private.source_kind, privacy_unit=flat(owner.alias, owner.column),
        max_groups_per_unit=private.max_groups_per_unit, max_rows_per_group=private.max_rows_per_group,
        max_rows_per_unit=private.max_rows_per_unit, columns=columns, tau=private.tau, schema=dict(jp.flat_schema),
        view=VIEW,
    )
    if jp.statement is not None:  # aggregates the join mechanisms do not answer: the query analysed as one table's
        from dpsql.plan.analyze import analyze_lookup

        one = analyze_lookup(plan.sql, jp.statement, table, VIEW)
        # the WHERE is the joined relation's (applied where it is rendered); its conditions on declared keys alone
        # still filter the released keys (the plan's HAVING), as on one table
        return dataclasses.replace(one, where=None, keys=_left_keys(one.keys, jp), join=jp)
    bases = jp.aggregates or (ir.JoinAggregate(jp.kind, jp.value, jp.bounds, plan.aggregates[0].sql),)
    aggregates = []
    for j, b in enumerate(bases):
        column = b.value.name if isinstance(b.value, exp.Column) and not b.value.table else None
        value = None if column is not None else b.value
        if b.kind == ir.COUNT_COL and value is not None:  # COUNT(expr): 1 where expr is not NULL
            value = exp.Case(ifs=[exp.If(this=exp.Is(this=value.copy(), expression=exp.Null()), true=exp.Null())],
                             default=exp.Literal.number(1))
        aggregates.append(ir.Aggregate(b.kind, column, f"__a{j}", b.sql, b.bounds if b.kind == ir.SUM else None,
                                       value=value))
    return dataclasses.replace(plan, table=table, where=None, aggregates=aggregates, keys=_left_keys(plan.keys, jp))


def counted_only(jp: ir.JoinPlan, unit: str | None) -> frozenset[str]:
    """The joined relation's columns that the one-table statement (``jp.statement``) reads only as the argument of
    ``COUNT(DISTINCT col)`` or ``COUNT(col)``, or never (never as a group key, in HAVING or elsewhere; never the
    unit): such a
    text or BLOB key is carried through the join as the text of its salted digest
    (``dpsql.rewrite.joins.KeyDigest``), which counts alike (distinct texts have distinct digests, but with
    probability about 2^-128 per pair under a secret salt; a NULL's digest is NULL). One person's long private key
    was otherwise carried with each of their joined rows (``tests/test_adversary_round43.py``)."""
    if jp.statement is None:
        return frozenset()
    seen: dict[str, bool] = {}
    for c in jp.statement.find_all(exp.Column):
        if c.name not in jp.flat_schema:
            continue
        p = c.parent
        ok = (isinstance(p, exp.Count) or (isinstance(p, exp.Distinct) and len(p.expressions) == 1
                                             and isinstance(p.parent, exp.Count)))
        # (text only: the digest's text stands for a text; a BLOB counted keeps its bytes)
        ok = ok and is_text(jp.flat_schema[c.name])
        seen[c.name] = seen.get(c.name, True) and ok
    # a column the statement never names (a join key only) is read by the join alone
    return frozenset(n for n in jp.flat_schema if seen.get(n, True) and n != unit)


def _left_keys(keys: list[ir.GroupKey], jp: ir.JoinPlan) -> list[ir.GroupKey]:
    """A LEFT-joined lookup's column with a declared domain: that domain plus NULL, the group of the private rows no
    lookup row matches (and of the lookup's own NULLs), released like every declared key whatever the data."""
    return [dataclasses.replace(k, domain=(*k.domain, None)) if k.domain is not None and None not in k.domain
            and isinstance(k.expr, exp.Column) and k.expr.name.split("__", 1)[0] in jp.left else k for k in keys]


class LookupJoin:
    """A one-table mechanism (Gaussian, Laplace, sparse histogram) reading the joined relation of a lookup
    join: its bounded query with the capped join as its first CTE (:data:`VIEW`)."""

    @property
    def joined_where(self) -> exp.Expression | None:
        """The query's WHERE over the joined relation (``postprocess.refuse_no_row`` reads it: the one-table plan's
        own WHERE is None)."""
        return self.jp.where

    def no_public_row(self, reads: Any) -> Exception | None:
        """The free refusal of a WHERE whose conjuncts over one public lookup's columns alone keep none of its rows
        (``postprocess.no_row_refusal`` asks it over keys released above a noisy threshold only), or None. A tuple of
        the join holds one of that table's rows (inner join), or, LEFT joined, one that meets the LEFT JOIN's ON
        conditions over that table alone or NULLs: when none of those rows (nor, LEFT, the row of NULLs) meets those
        conjuncts, no tuple does, and the release has no row whatever the data. The same public table joined twice
        (inner joins) through its declared key on values the ON equalities make equal is one row of it in every tuple
        (the key is checked unique on its rows before, ``dpsql._public_keys``): the conjuncts over either alias are then
        decided together, on each row (:meth:`_same_rows`). Reads the public table's rows only, through ``reads``
        (``dpsql.engine.PublicReads``, which refuses any other table: one count of them per table, as a grouped
        join's key set is read), at most :data:`_MOST_CONSTANTS` constants each; not decided (None) on any failure."""
        from dpsql.errors import UnsupportedQueryError
        from dpsql.postprocess import written_conditions
        from dpsql.rewrite.bound import guard
        from dpsql.rewrite.joins import _split_where

        local, top = _split_where(self.jp)
        inputs, schema = dict(self.jp.inputs), dict(self.jp.flat_schema)
        one = self._same_rows()
        members: dict[str, list[str]] = {}
        for a, _ in self.jp.inputs:
            members.setdefault(one.get(a, a), []).append(a)
        conds: dict[str, list[exp.Expression]] = {}
        for a, cs in local.items():
            conds.setdefault(one.get(a, a), []).extend(cs)
        for c in top:  # (`c1.pop > c2.pop`: over one row when c1 and c2 are one)
            reps = {one.get(a, a) for a in (col.name.split(SEP, 1)[0] for col in c.find_all(exp.Column))}
            if len(reps) == 1:
                conds.setdefault(reps.pop(), []).append(c)
        for alias, where in sorted(conds.items()):
            t = self.catalog.get(inputs.get(alias, ""))
            if t is None or not t.public or not t.view:
                continue
            # a LEFT JOIN's ON conditions over that table alone: the rows it matches (others leave NULLs)
            on = [p for a, c in self.jp.left_on if a == alias for p in where_conjuncts(c)
                  if all(col.name.split(SEP, 1)[0] == alias for col in p.find_all(exp.Column))] \
                if alias in self.jp.left else []
            constants = sum(1 for e in where for _ in e.find_all(exp.Literal))
            if constants > _MOST_CONSTANTS:
                continue  # (a long IN list: typed and counted anew at every request; not decided, the query runs)
            if constants + sum(1 for e in on for _ in e.find_all(exp.Literal)) > _MOST_CONSTANTS:
                on = []  # (the ON's long IN list: every lookup row read, as without it; a superset, still sound)
            others = set(members[alias]) - {alias}

            def as_one(e: exp.Expression, others: set[str] = others, alias: str = alias) -> exp.Expression:
                def swap(n: exp.Expression) -> exp.Expression:
                    if isinstance(n, exp.Column) and n.name.split(SEP, 1)[0] in others:
                        return exp.column(flat(alias, n.name.split(SEP, 1)[1]), quoted=n.this.quoted)
                    return n
                return e.copy().transform(swap)

            try:
                read = [as_one(c) for c in where]
                cols = sorted({c.name.split(SEP, 1)[1] for e in [*read, *on] for c in e.find_all(exp.Column)})
                rows: exp.Expression = exp.select(*[exp.alias_(exp.column(c, quoted=True), flat(alias, c))
                                                    for c in cols]).from_(exp.to_table(t.view, quoted=True))
                if on:
                    rows = exp.select("*").from_(rows.subquery("__o")).where(*[guard(c.copy(), schema) for c in on])
                if alias in self.jp.left:  # (its row of NULLs where no lookup row matched)
                    rows = exp.union(rows, exp.select(*[exp.alias_(exp.cast(exp.null(), schema[flat(alias, c)]),
                                                                   flat(alias, c)) for c in cols]), distinct=False)
                # (a count, one row: Spark's lowering refuses LIMIT; the public table is scanned once, as its key set is)
                q = exp.select(exp.alias_(exp.Count(this=exp.Star()), "__n")).from_(rows.subquery("__p")).where(
                    *[guard(c, schema) for c in read])
                if reads.fetch_arrow(q, what="the public lookup's rows").column(0)[0].as_py() != 0:
                    continue
            except Exception:  # (a condition or type the engine cannot hold here): not decided, the query runs
                continue
            text, several = written_conditions([*(("ON", c) for c in on), *((None, c) for c in where)], joined=True)
            names = ", ".join(members[alias]) if others else alias
            return UnsupportedQueryError(
                f"{text} {'keep' if several else 'keeps'} no row of the public table {t.name!r} ({names})"
                + (": joined on the same key values, one row of it in each tuple" if others else "")
                + (" nor its row of NULLs (LEFT JOIN)" if alias in self.jp.left else "")
                + ", so no group has a row and none can pass the release threshold: the release would have no row "
                "whatever the data, and be charged for nothing; nothing was charged",
                hint="check the conditions on the public table's columns (explain shows the cost for free)")
        return None

    def _same_rows(self) -> dict[str, str]:
        """Aliases of one public table, each inner-joined through the same declared key (its one-row cap) on columns
        that the join's equalities (inner joins only) make equal: alias -> the first of them in FROM order. Each tuple
        holds one row of that table for all of them (public metadata only)."""
        left = set(self.jp.left)
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.get(x, x) != x:
                x = parent[x]
            return x

        for a, b in self.jp.conditions:
            if a.split(SEP, 1)[0] not in left and b.split(SEP, 1)[0] not in left:
                parent[find(a)] = find(b)
        caps = {alias: (cols, n) for alias, cols, n in self.caps}
        seen: dict[tuple[str, str, tuple[str, ...]], str] = {}
        out: dict[str, str] = {}
        for alias, name in self.jp.inputs:
            cols, n = caps.get(alias, ("", 0))
            table = self.catalog.get(name)
            if n != 1 or alias in left or table is None or not table.public:
                continue
            key = (table.name, cols, tuple(find(flat(alias, c)) for c in cols.split(",")))
            first = seen.setdefault(key, alias)
            if first != alias:
                out[alias] = first
        return out

    def __init__(self, inner: Mechanism, jp: ir.JoinPlan, people: PeopleBound, catalog: Mapping[str, TableSpec], *,
                 people_count: bool = False) -> None:
        self.inner, self.jp, self.catalog = inner, jp, dict(catalog)
        self.name, self.options = inner.name, inner.options
        assert people.owner is not None
        self.unit = flat(people.owner.alias, people.owner.column)  #: the joined relation's unit column
        self.people_count = people_count
        if people_count:  # (module docstring, "People counted over a join"): every input's caps, as the join's
            assert people.single_owner and people.enforced
            self.caps = tuple(people.caps)
        else:
            #: the lookups' caps (one row per joined value); the private input's is the one-table bounding's
            self.caps = tuple(c for c in people.caps if c[0] != people.owner.alias)
            assert all(n == 1 and catalog[dict(jp.inputs)[a]].public for a, _, n in self.caps)

    def calibrate(self, request: Any, contribution: Any) -> Any:
        return self.inner.calibrate(request, contribution)

    def describe(self, calibration: Any) -> Description:
        d = self.inner.describe(calibration)
        caps = [f"{a}.{c.replace(',', ', ')} <= {n}" for a, c, n in self.caps]
        if self.people_count:
            note = ("people counted over a join whose every tuple belongs to one person: the inputs joined, each capped "
                    f"at its rows per joined value ({'; '.join(caps)}), then bounded as one table whose unit is "
                    f"the owner ({self.unit.replace('__', '.', 1)}); each person counts once (per group) whatever their tuples")
        else:
            note = ("lookup join: the private rows joined with the public lookup rows (each lookup capped at one row "
                    f"per joined value: {'; '.join(caps)}), then bounded as one table")
        if self.jp.left:
            note += (f"; LEFT JOIN of {', '.join(self.jp.left)}: a private row no lookup row matches is kept once, the "
                     "lookup's columns NULL (their WHERE conditions applied after the join)")
        return dataclasses.replace(d, notes=(*d.notes, note))

    def bounded(self, calibration: Any, salt: str, ops: SqlOps) -> Any:
        from dpsql.rewrite.joins import KeyDigest, _needed, join_relation, key_digests, parts_of

        ast = self.inner.bounded(calibration, salt, ops)
        if ast is None:
            return None
        assert isinstance(ast, exp.Select), type(ast)  # the one-table mechanisms' bounded query
        needed = _needed(self.jp, self.caps)
        names = sorted(flat(a, c) for a, cols in needed.items() for c in cols)
        counted = counted_only(self.jp, self.unit)
        plain = [exp.column(n, quoted=False) for n in names]
        # a key the statement only counts distinct (or counts) is carried as the text of its digest (32 characters)
        digested = key_digests(self.jp, self.caps, plain, distinct=counted) & counted
        text = KeyDigest(salt, ops).text
        extra = [exp.alias_(text(c), c.name) if c.name in digested else c for c in plain]
        rel = join_relation(self.jp, self.catalog, salt=salt, ops=ops, caps=self.caps,
                            parts=parts_of(self.jp), extra=extra, with_tid=False, distinct=counted)
        reads = [t for t in ast.find_all(exp.Table) if t.name == VIEW and not t.db]
        if len(reads) > 1:
            # read more than once (the group cap's hashes, the groups, the released long keys' texts): the relation
            # at each read, as a source's view is read, since DuckDB computes and holds a CTE read twice (whatever
            # NOT MATERIALIZED says), every joined row with its texts (tests/test_adversary_round43.py). Each read is
            # the same rows: J is a function of the rows and the salt (the lookups' kept rows chosen by content)
            for t in reads:
                t.replace(rel.copy().subquery(t.alias_or_name, copy=False))
            return ast
        cte = exp.CTE(this=rel, alias=exp.TableAlias(this=exp.to_identifier(VIEW, quoted=True)))
        with_ = ast.args.get("with_")
        if with_ is None:
            ast.set("with_", exp.With(expressions=[cte]))
        else:
            with_.set("expressions", [cte, *with_.expressions])
        return ast

    def released_types(self, calibration: Any) -> dict[str, str]:
        return self.inner.released_types(calibration)

    def key_domain(self, calibration: Any) -> Any:
        return self.inner.key_domain(calibration)

    def release(self, calibration: Any, bounded: Any, rng: Any) -> Any:
        return self.inner.release(calibration, bounded, rng)


#: the most constants the check of a public lookup's rows (``LookupJoin.no_public_row``) decides, as the one-column
#: check of a WHERE decides at most ``postprocess.MEETS_MOST_CONSTANTS``
_MOST_CONSTANTS = 256
