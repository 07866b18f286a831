"""GROUP BY keys of a join query, over public key sets only. Pure: reads the catalog and the SQL.

A join answers GROUP BY with one released row per key of a *public* key set (every key released,
zero groups included), so which keys exist never depends on private rows. Supported keys (one or
several; the key set is their product, the plain columns of one public table taken together as its rows'
combinations):

* ``public`` -- a plain column of a public table of the join (``n.n_name`` with ``nation``
  registered ``public=True``). Its key set is that table's distinct values after the
  WHERE conjuncts over that table alone (public data, read in the query itself), NULL included
  when the table holds one (SQL's NULL group of the lookup's NULLs);
* a plain DATE column with a declared ordered range, of any table: a ``derived`` key (below), its days;
* ``declared`` -- a plain column with a declared ``domain`` (``columns={'c_mktsegment':
  {'domain': [...]}}``), of any table of the join;
* ``year`` -- ``year(col)``, ``extract(year FROM col)`` or ``date_part('year', col)`` of a DATE or
  TIMESTAMP column with a declared ordered range (``columns={'l_shipdate': {'bounds':
  ('1992-01-01', '1998-12-31'), 'bin_width': '1 day'}}``): the keys are the years from the
  range's first to its last.

Join tuples whose key lies outside the key set (a value missing from a declared domain, a date
outside the declared range) are not counted: a per-tuple filter on the tuple's own values.

* ``derived`` -- an expression (``CASE`` buckets, ``date_trunc``, ``coalesce``, ``floor(x / 10) * 10``, ...),
  typed and rendered total as a one-table GROUP BY key is (``dpsql.plan.typer.type_key``), whose key set is
  computed in the query from public values only, the first that applies:

  - it reads columns of one public table only: its distinct values over that table's rows after the WHERE
    conjuncts over that table alone (as a ``public`` key's);
  - every column it reads has finite public values: a declared ``domain``, a BOOLEAN column, a DATE column
    with a declared ordered range (its days), a TIMESTAMP column with a declared range read through its date
    alone (``date_trunc('month', ts)``, ``year(ts)``, ``CAST(ts AS DATE)``: its days' midnights), an integer
    column with declared bounds (its integers), at most :data:`MAX_GROUPS` combinations: its distinct values over
    their product;
  - it is a ``CASE`` (or ``IF``) whose every result is a text, integer or boolean literal or NULL: those
    results (NULL when a branch or the missing ELSE gives it).

  A tuple is counted under its own value of the expression when that value is in the key set (a per-tuple
  filter, as for every key): the released keys are the key set's, spelled from public values.

* ``private`` -- a plain column of a private table with no declared domain: no public key set. Answered
  only when the join is a lookup join (one private table, public lookups on their keys:
  ``dpsql.mechanisms.lookup``), by the sparse histogram over the joined rows; otherwise refused at routing
  with the PolicyError the key carries (``JoinKey.refusal``).

Any other key is refused with a PolicyError naming the declaration that would make it answerable.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from sqlglot import ErrorLevel, exp

from dpsql.catalog import TableSpec
from dpsql.plan import ir
from dpsql.plan.intervals import day_of
from dpsql.plan.joins import SEP
from dpsql.plan.parse import quoted, stands_for
from dpsql.plan.typer import _INT_RANGES, TEMPORAL_ARG, TypeRefusal, parse_type, type_domain, type_key
from dpsql.plan.workload import _conjuncts as conjuncts

#: the most key combinations a grouped join releases (one noisy value each)
MAX_GROUPS = 100_000


def _year_arg(node: exp.Expression) -> exp.Expression | None:
    if isinstance(node, exp.Year):
        return node.this
    if isinstance(node, exp.Extract) and isinstance(node.this, (exp.Var, exp.Identifier)) and node.this.name.lower() == "year":
        return node.expression
    if (isinstance(node, exp.Anonymous) and str(node.this).lower() in ("date_part", "datepart")
            and len(node.expressions) == 2 and isinstance(node.expressions[0], exp.Literal)
            and node.expressions[0].is_string and node.expressions[0].this.lower() == "year"):
        return node.expressions[1]
    return None


def _year_of(v: Any) -> int | None:
    d = v if isinstance(v, datetime.date) else day_of(v)
    return None if d is None else d.year


def group_keys(
    stmt: exp.Select,
    inputs: list[tuple[str, TableSpec]],
    resolve: Callable[[exp.Column, str], str | None],
    bad: Callable[[exp.Expression, str], None],
    policy: Callable[[exp.Expression, str], None],
    private: Callable[[exp.Expression, str], Any] | None = None,
    schema: Mapping[str, str] | None = None,
    where: exp.Expression | None = None,
) -> list[ir.JoinKey]:
    """The keys of ``stmt``'s GROUP BY (unsupported shapes reported through ``bad``, keys without a
    public key set through ``policy``: the fix is the owner's declaration). A plain column of a private table
    with no declared domain: through ``policy`` too, or, given ``private``, a key of kind ``private`` holding
    ``private``'s answer as its ``refusal`` (the router refuses it unless the join is a lookup join). ``where``: the
    WHERE over flat column names, whose AND-ed ``col IN (literals)`` / ``col = literal`` list a plain column's keys
    (``dpsql.plan.analyze.listed_domain``, as on one table: every listed key released, a row outside them filtered
    out by the WHERE itself)."""
    group = stmt.args.get("group")
    if group is None:
        return []
    for key in ("grouping_sets", "cube", "rollup"):
        if group.args.get(key):
            bad(group, f"GROUP BY ... WITH {key.upper().replace('_', ' ')} is not supported: it releases "
                "several groupings of the same rows (hint: send one GROUP BY query per grouping)")
    aliases = {it.alias.lower(): it.unalias() for it in stmt.expressions if isinstance(it, exp.Alias)}
    tables = dict(inputs)
    keys: list[ir.JoinKey] = []
    written = list(group.expressions)
    if group.args.get("all"):
        # DuckDB's GROUP BY ALL: every output without an aggregate that reads a column (not only earlier
        # outputs' aliases, as n * 2 AS n2 for COUNT(*) AS n), i.e. GROUP BY their positions
        agg_aliases = {a for a, e in aliases.items() if any(True for _ in e.find_all(exp.AggFunc))}
        written[:0] = [exp.Literal.number(i + 1) for i, it in enumerate(stmt.expressions)
                       if not any(True for _ in it.find_all(exp.AggFunc))
                       and any(c.table or c.name.lower() not in agg_aliases for c in it.find_all(exp.Column))]
    for g in written:
        if isinstance(g, exp.Column) and not g.table and g.name.lower() in aliases:
            g = aliases[g.name.lower()]
        elif isinstance(g, exp.Literal) and not g.is_string and g.this.isdigit():  # GROUP BY 1: a select-list position
            n = int(g.this)
            if not 1 <= n <= len(stmt.expressions):
                bad(g, f"GROUP BY {n}: the select list has {len(stmt.expressions)} item(s)")
                continue
            g = stmt.expressions[n - 1].unalias()
        while isinstance(g, exp.Paren):  # GROUP BY (col): the column's key
            g = g.this
        if any(True for _ in g.find_all(exp.AggFunc)):
            bad(g, "aggregates are not allowed in GROUP BY")
            continue
        found = _key(g, tables, resolve, bad, policy, len(keys), private, schema, where)
        if found is not None and all(k.sql != found.sql for k in keys):
            keys.append(found)
    size = 1
    for k in keys:
        size *= len(k.domain) if k.domain is not None else len(k.results) if k.results is not None else 1
    if size > MAX_GROUPS:
        bad(group, f"the GROUP BY keys have {size} combinations; a grouped join releases at most {MAX_GROUPS} groups "
                   "(hint: group by fewer or coarser keys)")
    return keys


def _key(g: exp.Expression, tables: Mapping[str, TableSpec], resolve: Callable[[exp.Column, str], str | None],
         bad: Callable[[exp.Expression, str], None], policy: Callable[[exp.Expression, str], None],
         i: int, private: Callable[[exp.Expression, str], Any] | None = None,
         schema: Mapping[str, str] | None = None, where_flat: exp.Expression | None = None) -> ir.JoinKey | None:
    name = f"__k{i}"
    inner = _year_arg(g)
    col = inner if inner is not None else g
    if not isinstance(col, exp.Column):
        if schema is None:  # pragma: no cover - every caller passes the join's flat schema
            bad(g, f"GROUP BY {quoted(g)}: over joins a key must be a column or year(col)")
            return None
        return _derived(g, name, tables, resolve, bad, policy, private, schema)
    f = resolve(col, "GROUP BY")
    if f is None:
        return None
    alias, _, column = f.partition("__")
    t = tables[alias]
    typ = t.schema.get(column, "VARCHAR")
    spec = t.column(column)
    where = f"{alias}.{column}"
    if inner is not None and schema is not None and typ.upper() == "DATE" and _public_values(t, column) is not None \
            and _conditions_on(where_flat, f):
        # year(d) under conditions on d: the years of the declared days they keep (``dpsql.rewrite.join_groups``,
        # ``_own_conditions``), computed as any key of one DATE column is, not every year of the range
        return _derived(g, name, tables, resolve, bad, policy, private, schema)
    if inner is not None:
        o = spec.ordered
        if o is None or o.kind not in ("date", "timestamp"):
            policy(g, f"GROUP BY {quoted(g)}: the years of '{t.name}.{column}' are not a public key set: the "
                   "column has no declared date range (hint: declare columns={'" + column + "': {'bounds': "
                   "('1992-01-01', '1998-12-31'), 'bin_width': '1 day'}} on table " + repr(t.name) + ")")
            return None
        y0, y1 = _year_of(o.lo), _year_of(_last_day(_grid_end(o)))
        if y0 is None or y1 is None:  # pragma: no cover - the catalog validates ordered date ranges
            bad(g, f"the declared range of '{t.name}.{column}' has no readable years")
            return None
        expr = exp.func("year", exp.column(f, quoted=False))
        # the argument's type, for engines that spell date parts by it (Spark): the column's, not its range's (a
        # TIMESTAMP column declared from '2020-01-01' was lowered as a DATE, unix_date(ts), which Spark refuses)
        expr.meta[TEMPORAL_ARG] = "date" if typ.upper() == "DATE" else "timestamp"
        return ir.JoinKey(name, expr, f"year({where})", "year", alias, column, "BIGINT", tuple(range(y0, y1 + 1)))
    if spec.domain is not None:
        return ir.JoinKey(name, exp.column(f, quoted=False), where, "declared", alias, column, typ, tuple(spec.domain))
    if t.public:
        return ir.JoinKey(name, exp.column(f, quoted=False), where, "public", alias, column, typ, None)
    if schema is not None and typ.upper() == "DATE" and _public_values(t, column) is not None:
        # a DATE column with a declared range: its days, as CAST(col AS DATE) or date_trunc('day', col) of it
        return _derived(g, name, tables, resolve, bad, policy, private, schema)
    if where_flat is not None:
        from dpsql.plan.analyze import listed_domain

        listed = listed_domain(f, where_flat, typ)
        if listed is not None and not [v for v in listed if v is not None]:
            bad(g, f"GROUP BY {quoted(col)}: the WHERE's conditions on '{t.name}.{column}' list no value that they all "
                   "keep, so the release would have no row whatever the data, and be charged for nothing (hint: check "
                   "the IN lists and equalities on the column)")
            return None
        if listed is not None:  # keys the WHERE lists: a public key set (the query's), as a declared domain is
            return ir.JoinKey(name, exp.column(f, quoted=False), where, "declared", alias, column, typ, tuple(listed))
    # no public key set: refused at routing unless the join is a lookup join (dpsql.mechanisms.registry), whose
    # joined rows are the private table's own and whose keys the sparse histogram releases above a noisy threshold
    msg = (f"GROUP BY {quoted(col)}: '{t.name}.{column}' is neither a column of a public table nor declared "
           f"public, so its keys would reveal private values (hint: declare columns={{'{column}': {{'domain': [...]}}}} on "
           f"table '{t.name}', or join a public table and group by its column)")
    o = spec.ordered
    lo, hi = (day_of(o.lo), _last_day(_grid_end(o))) if o is not None and _of_days(o) else (None, None)
    if typ.upper() == "DATE" and lo is not None and hi is not None and (hi - lo).days >= MAX_GROUPS:
        # a declared date range with more days than a grouped join releases: said as such (the catalog's, no row)
        msg = (f"GROUP BY {quoted(col)}: the declared range of '{t.name}.{column}' holds {(hi - lo).days + 1} days, more "
               f"than the {MAX_GROUPS} groups a grouped join releases (hint: group by a coarser key of it, e.g. "
               f"year({quoted(col)}), or declare a shorter range on table '{t.name}')")
    if private is None:
        policy(g, msg)
        return None
    return ir.JoinKey(name, exp.column(f, quoted=False), where, "private", alias, column, typ, None, private(g, msg))


def _conditions_on(where: exp.Expression | None, flat_column: str) -> bool:
    """Whether a conjunct of the WHERE (over flat names) reads the column ``flat_column`` alone."""
    return any({c.name for c in e.find_all(exp.Column)} == {flat_column} for e in conjuncts(where))


#: functions whose value at a TIMESTAMP is their value at its day's midnight (its date alone decides them)
_DAY_FUNCS = (exp.Year, exp.Month, exp.Quarter, exp.Day, exp.DayOfWeek, exp.DayOfWeekIso, exp.DayOfYear, exp.Week,
              exp.Dayname, exp.Monthname, exp.LastDay)
#: date_trunc / extract / date_part parts decided by a timestamp's date alone
_DAY_PARTS = {"year", "quarter", "month", "week", "day", "decade", "century", "millennium", "isoyear", "dow",
              "dayofweek", "isodow", "doy", "dayofyear", "yearweek", "weekofyear"}


def _part(node: exp.Expression | None) -> str | None:
    if isinstance(node, (exp.Var, exp.Identifier)) or (isinstance(node, exp.Literal) and node.is_string):
        return str(node.this).lower()
    return None


def _by_date_only(col: exp.Column) -> bool:
    """Whether this occurrence of a TIMESTAMP column is read through its date alone (``date_trunc('month', ts)``,
    ``year(ts)``, ``CAST(ts AS DATE)``, ...): then its value at any instant of a day is its value at the day's
    midnight."""
    p, key = col.parent, col.arg_key
    if isinstance(p, _DAY_FUNCS) and key == "this":
        return True
    if isinstance(p, (exp.TimestampTrunc, exp.DateTrunc)) and key == "this":
        return _part(p.args.get("unit")) in _DAY_PARTS
    if isinstance(p, exp.Extract) and key == "expression":
        return _part(p.this) in _DAY_PARTS
    if isinstance(p, (exp.Cast, exp.TryCast)) and key == "this":
        return p.to.is_type(exp.DataType.Type.DATE)
    if (isinstance(p, exp.Anonymous) and str(p.this).lower() in ("date_part", "datepart") and len(p.expressions) == 2
            and p.expressions[1] is col):
        return _part(p.expressions[0]) in _DAY_PARTS
    return False


def _last_day(hi_v: Any) -> datetime.date | None:
    """The last day of a declared date range's half-open grid [lo, hi): the day before ``hi`` when ``hi`` is a
    midnight (a DATE bound), else ``hi``'s own day (its instants before ``hi`` are in the grid). A one-table GROUP BY
    releases the grid's bins, so a grouped join releases the same days (README, Range workloads)."""
    if isinstance(hi_v, str):
        try:
            hi_v = datetime.datetime.fromisoformat(hi_v)
        except ValueError:
            return None
    if isinstance(hi_v, datetime.datetime):
        return (hi_v - datetime.timedelta(microseconds=1)).date()
    if isinstance(hi_v, datetime.date):
        return hi_v - datetime.timedelta(days=1)
    return None


def _grid_end(o: Any) -> Any:
    """The end of a declared date range's grid: ``hi``, or its last bin's end where that comes first (a tail after
    the last whole bin shorter than the catalog's tolerance, 1e-9 of a bin, is in no bin of a one-table histogram:
    [2019-12-01, 2020-01-01 00:00:00.000001) in one-day bins is 31 bins, 2020-01-01 in none)."""
    try:
        lo, hi = datetime.datetime.fromisoformat(str(o.lo)), datetime.datetime.fromisoformat(str(o.hi))
        end = lo + datetime.timedelta(seconds=float(o.bins) * float(o.bin_seconds))
    except (TypeError, ValueError, OverflowError):  # pragma: no cover - the catalog writes ISO bounds and a bin width
        return o.hi
    return min(hi, end)


def _of_days(o: Any) -> bool:
    """Whether a DATE column's declared range is one of days: given as dates, or as timestamps from a midnight
    (``datetime(2020, 1, 1)``, ``'2020-01-01 00:00:00'``), whose one-table histogram releases the same days."""
    if o is None or o.kind not in ("date", "timestamp"):
        return False
    try:
        lo = datetime.datetime.fromisoformat(str(o.lo))
    except ValueError:  # pragma: no cover - the catalog writes ISO bounds
        return False
    return o.kind == "date" or lo == datetime.datetime(lo.year, lo.month, lo.day)


def _days(lo_v: Any, hi_v: Any) -> list[datetime.date] | None:
    """The days of a declared date range's half-open grid [lo, hi) (:func:`_last_day`)."""
    lo, hi = day_of(lo_v), _last_day(hi_v)
    if lo is None or hi is None or not 0 <= (hi - lo).days < MAX_GROUPS:
        return None
    return [lo + datetime.timedelta(days=n) for n in range((hi - lo).days + 1)]


def _public_values(t: TableSpec, column: str, by_date: bool = False) -> tuple[Any, ...] | None:
    """The finite public values of a column, or None: its declared domain; a BOOLEAN's two values; a DATE
    column's days in its declared ordered range; a TIMESTAMP column's days (as midnights) in its declared ordered
    range when the expression reads it through its date alone (``by_date``); an integer column's integers in its
    declared bounds (at most :data:`MAX_GROUPS` each)."""
    spec = t.column(column)
    if spec.domain is not None:
        return tuple(spec.domain)
    base = t.schema.get(column, "").upper().split("(")[0].strip()
    if base == "BOOLEAN":
        return (False, True)
    o = spec.ordered
    if base == "DATE" and o is not None and _of_days(o):
        days = _days(o.lo, _grid_end(o))
        return None if days is None else tuple(days)
    if base == "TIMESTAMP" and by_date and o is not None and o.kind in ("date", "timestamp"):
        days = _days(o.lo, _grid_end(o))
        return None if days is None else tuple(datetime.datetime(d.year, d.month, d.day) for d in days)
    int_range = _INT_RANGES.get(parse_type(t.schema[column]).name) if column in t.schema else None
    if int_range is not None:  # an integer type (its canonical name, as the typer's table of ranges has it)
        b = spec.bounds if spec.bounds is not None else (o.lo, o.hi) if o is not None and o.kind == "numeric" else None
        if b is None:
            return None
        try:
            lo_f, hi_f = float(b[0]), float(b[1])
        except (TypeError, ValueError):  # pragma: no cover - the catalog validates bounds
            return None
        if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
            return None
        # the column's type holds no value beyond its range (bounds wider than the type, or read as a DOUBLE one past it)
        t_lo, t_hi, _ = int_range
        first, last = max(math.ceil(lo_f), t_lo), min(math.floor(hi_f), t_hi)
        if not last - first < MAX_GROUPS:
            return None
        return tuple(range(int(first), int(last) + 1))
    return None


def _literal_results(g: exp.Expression) -> list[Any] | None:
    """A CASE's (or IF's) results when every one is a text, integer or boolean literal or NULL (None for NULL, a
    missing ELSE included), else None."""
    while isinstance(g, exp.Paren):
        g = g.this
    if isinstance(g, exp.Case):  # (CASE x WHEN ...: the same results)
        branches = [it.args.get("true") for it in g.args.get("ifs") or []] + [g.args.get("default")]
    elif isinstance(g, exp.If):
        branches = [g.args.get("true"), g.args.get("false")]
    else:
        return None
    out: list[Any] = []
    seen: set[tuple[type, Any]] = set()
    for b in branches:
        while isinstance(b, exp.Paren):
            b = b.this
        neg = isinstance(b, exp.Neg)
        if neg:
            b = b.this
        if b is None or isinstance(b, exp.Null):
            v: Any = None
        elif isinstance(b, exp.Boolean) and not neg:
            v = bool(b.this)
        elif isinstance(b, exp.Literal) and b.is_string and not neg:
            v = b.this
        elif isinstance(b, exp.Literal) and not b.is_string and re.fullmatch(r"[0-9]+", b.this):
            v = -int(b.this) if neg else int(b.this)
        else:
            return None
        if (type(v), v) not in seen:  # (True and 1 are two results)
            seen.add((type(v), v))
            out.append(v)
    return out  # (NULL alone included: CASE ... THEN NULL END, the key set {NULL})


def _derived(g: exp.Expression, name: str, tables: Mapping[str, TableSpec],
             resolve: Callable[[exp.Column, str], str | None], bad: Callable[[exp.Expression, str], None],
             policy: Callable[[exp.Expression, str], None], private: Callable[[exp.Expression, str], Any] | None,
             schema: Mapping[str, str]) -> ir.JoinKey | None:
    """A GROUP BY expression over a join (module docstring, ``derived``), or None (reported)."""
    bare = g
    while isinstance(bare, exp.Paren):  # GROUP BY (CASE ... END): the key the SELECT list writes without them
        bare = bare.this
    flat_g = bare.copy()
    for c in list(flat_g.find_all(exp.Column)):
        f = resolve(c, "GROUP BY")
        if f is None:
            return None
        flat_c = stands_for(exp.column(f, quoted=False), c)
        flat_g = flat_c if c is flat_g else flat_g  # (the key is the column itself: a DATE column's days)
        c.replace(flat_c)
    try:
        total, typ = type_key(flat_g, dict(schema))
    except TypeRefusal as e:
        for n, m in e.problems:
            bad(g if n is None else n, f"GROUP BY {quoted(g)}: {m}")
        return None
    cols = list(dict.fromkeys(c.name for c in flat_g.find_all(exp.Column)))
    spelled = flat_g.copy()
    for ident in spelled.find_all(exp.Identifier):
        ident.set("quoted", False)
    match = spelled.sql(dialect="duckdb")
    expr = exp.Cast(this=total, to=exp.DataType.build(typ.name, dialect="duckdb"))
    written = quoted(g)
    located = [(c, *c.partition(SEP)[::2]) for c in cols]
    first_alias, first_column = (located[0][1], located[0][2]) if located else ("", "")

    def key(**kw: Any) -> ir.JoinKey:
        return ir.JoinKey(name, expr, written, "derived", kw.pop("alias", first_alias), first_column, typ.name,
                          None, None, match, written=flat_g, **kw)

    aliases = {a for _, a, _ in located}
    if len(aliases) == 1 and tables[next(iter(aliases))].public:
        return key()  # the distinct values over the public table's rows (``dpsql.rewrite.join_groups``)
    by_date = {f for f in cols if all(_by_date_only(c) for c in flat_g.find_all(exp.Column) if c.name == f)}
    listed: list[tuple[str, str, tuple[Any, ...]]] = []
    size = 1
    for f, a, c in located:
        vals = _public_values(tables[a], c, f in by_date)
        if vals is None:
            break
        listed.append((f, schema.get(f, tables[a].schema.get(c, "VARCHAR")), vals))
        size *= len(vals)
    sets = listed if len(listed) == len(located) else None
    empty = next((f for f, _, vals in listed if not vals), None)
    if sets is not None and empty is not None:  # (integer bounds outside the column's type's range)
        a, _, c = empty.partition(SEP)
        bad(g, f"GROUP BY {written}: the declared bounds of '{tables[a].name}.{c}' hold no value of its type "
               f"{tables[a].schema.get(c, '')}, so the release would have no row whatever the data (hint: declare "
               "bounds within the column type's range)")
        return None
    if sets is not None and size <= MAX_GROUPS:
        return key(value_sets=tuple(sets))
    results = _literal_results(g)
    if results is not None:
        try:
            typed = type_domain(tuple(v for v in results if v is not None), typ.name, f"GROUP BY {written}")
        except ValueError:
            typed = None
        if typed is not None:
            listed = list(typed) + ([None] if None in results else [])
            return key(results=tuple(listed))
    if sets is not None:  # finite, but too many combinations
        bad(g, f"GROUP BY {written}: its columns' public values have {size} combinations; a grouped join computes a "
               f"key set from at most {MAX_GROUPS} (hint: narrow the declared domains or ranges, or group by coarser keys)")
        return None
    lacking = [f"{tables[a].name}.{c}" for f, a, c in located if _public_values(tables[a], c, f in by_date) is None]
    col_a, col_c = next(((a, c) for f, a, c in located if _public_values(tables[a], c, f in by_date) is None),
                        (first_alias, first_column))
    msg = (f"GROUP BY {written}: over joins a key computed by an expression needs a public key set, and "
           f"{', '.join(repr(x) for x in lacking)} {'has' if len(lacking) == 1 else 'have'} no finite set of public "
           f"values (a declared domain, a DATE or integer range of at most {MAX_GROUPS} values, or a TIMESTAMP range "
           "read through its date alone, e.g. date_trunc('day', ts)) (hint: declare "
           f"columns={{'{col_c}': {{'domain': [...]}}}} on table '{tables[col_a].name}', compute the key from one public "
           "table's columns only, or write a CASE whose results are literals)")
    if private is None or not located:
        policy(g, msg)
        return None
    return ir.JoinKey(name, flat_g, written, "private", col_a, col_c, typ.name, None, private(g, msg), match,
                      written=flat_g)


def call_key(node: exp.Expression) -> str:
    """The key an aggregate call of a join query is known by (each call once; HAVING, ORDER BY and QUALIFY name the
    SELECT list's): its SQL with names in lower case (``SUM(O.V)`` and ``sum(o.v)`` are one call, as in DuckDB), string
    literals as written (``o.k = 'A'`` and ``o.k = 'a'`` are two: the whole text in lower case made them one, and the
    second call was answered with the first's value)."""
    n = node.copy()
    for ident in n.find_all(exp.Identifier):
        ident.set("this", ident.name.lower())
        ident.set("quoted", True)
    for f in n.find_all(exp.Anonymous):
        if isinstance(f.this, str):
            f.set("this", f.this.lower())
    return n.sql(dialect="duckdb", unsupported_level=ErrorLevel.IGNORE)


def key_outputs(node: exp.Expression, keys: list[ir.JoinKey], flatten: Callable[[exp.Expression], exp.Expression],
                aggregates: Mapping[str, exp.Expression] | None = None,
                probe: Callable[[exp.Expression], exp.Expression] | None = None) -> exp.Expression:
    """A SELECT item over internal names: aggregates -> their released values (``aggregates``: by the
    call's :func:`call_key`, e.g. ``__a1``, or AVG's quotient of two; default ``__a0``), key expressions
    -> ``__k<i>`` (a ``derived`` key: any expression without aggregates that is written as the key is,
    over the same columns; ``probe`` flattens it without reporting, default ``flatten``). The caller makes sure
    every aggregate call is in ``aggregates``."""
    by_sql = {k.expr.sql(dialect="duckdb"): k.name for k in keys if k.match is None}
    by_match = {k.match: k.name for k in keys if k.match is not None}
    # only a node of a derived key's own class is flattened and rendered to compare (each once, not every subtree)
    roots = tuple({type(k.written) for k in keys if k.match is not None and k.written is not None})

    def matched(x: exp.Expression) -> str | None:
        if (not roots or not isinstance(x, roots) or (isinstance(x, exp.Column) and exp.Column not in roots)
                or any(True for _ in x.find_all(exp.AggFunc)) or not any(True for _ in x.find_all(exp.Column))):
            return None
        y = (probe or flatten)(x)
        for ident in y.find_all(exp.Identifier):
            ident.set("quoted", False)
        return by_match.get(y.sql(dialect="duckdb"))

    def swap(x: exp.Expression) -> exp.Expression:
        if isinstance(x, exp.AggFunc):
            if aggregates is None:
                return exp.column("__a0")
            return aggregates[call_key(x)].copy()
        if (hit := matched(x)) is not None:
            return exp.column(hit)
        if isinstance(x, (exp.Column, exp.Year, exp.Extract, exp.Anonymous)):
            year = _year_arg(x)  # (extract(year FROM d), date_part('year', d): the key year(d), as :func:`_key` reads it)
            s = flatten(x if year is None else exp.func("year", year.copy())).sql(dialect="duckdb")
            if s in by_sql:
                return exp.column(by_sql[s])
        return x

    return node.copy().transform(swap)
