"""Range workloads: which range counts a list of SQL queries asks for (public metadata only).

A workload is a list of ``SELECT COUNT(*) FROM t WHERE <base conditions> AND <range>`` queries
over one table, where the range constrains one column with a declared ordered domain (1-D) or
a pair of them (2-D), and the base conditions are the same in every query. A histogram query
``SELECT col, COUNT(*) FROM t GROUP BY col`` (or ``GROUP BY col_bin``, or
``GROUP BY floor(col / W) * W``) over an ordered column is the workload of all its (coarse) bins.

Bins: a numeric domain [lo, hi) is cut into ``bins`` equal bins; an integer domain lo..hi
declared with hi - lo + 1 bins has one bin per value. A range endpoint that falls inside a
bin is snapped outward to whole bins (noted in the release). DAWA answers workloads
(``dpsql.mechanisms.dawa_sql``); this module only reads the SQL and the catalog.
"""

from __future__ import annotations

import bisect
import datetime as dt
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.catalog import OrderedDomain, TableSpec, source_identity
from dpsql.errors import PolicyError, QueryError, UnsupportedQueryError
from dpsql.plan import ir
from dpsql.plan.analyze import analyze, is_bin_column, one_value_per_bin, resolve_unit_column, unqualified
from dpsql.plan.folding import Unfoldable, compared_as_float, float_edges, folded_comparison, to_double
from dpsql.plan.parse import DIALECT
from dpsql.plan.typer import parse_type, shifted_literal


def _unit(table: TableSpec, catalog: dict[str, TableSpec]) -> str:
    u = resolve_unit_column(table, catalog)
    assert u is not None
    return u


INTEGER_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                            "UINTEGER", "UBIGINT", "UHUGEINT", "INT1", "INT2", "INT4", "INT8", "INT", "LONG"})


#: cells a 2-D workload's grid may have (n1 x n2)
MAX_GRID_CELLS = 1 << 20
#: border cells a 2-D workload's rectangles may have in all (``dpsql.mechanisms._dawa_hilbert`` maps each
#: rectangle onto the Hilbert order from its border, after the charge: memory and time grow with them)
MAX_BORDER_CELLS = 1 << 22


def rect_border_cells(r0: int, r1: int, c0: int, c1: int) -> int:
    """Cells on the border of the inclusive rectangle rows r0..r1, columns c0..c1; an empty one (a
    range selecting no bin) is answered as the single cell (0, 0): 1."""
    h, w = r1 - r0 + 1, c1 - c0 + 1
    if h < 1 or w < 1:
        return 1
    return h * w if h <= 2 or w <= 2 else 2 * (h + w) - 4


def _as_datetime(v: Any) -> dt.datetime:
    """A time endpoint (a datetime, a date at midnight, or its ISO text) as a datetime."""
    if isinstance(v, dt.datetime):
        return v
    if isinstance(v, dt.date):
        return dt.datetime(v.year, v.month, v.day)
    return dt.datetime.fromisoformat(str(v))


@dataclass(frozen=True)
class Dim:
    column: str
    domain: OrderedDomain
    #: the column's declared type (DuckDB's spelling): whether a bin holds one value depends on it
    type_text: str | None = None

    @property
    def n(self) -> int:
        return self.domain.bins

    def value_to_pos(self, v: Any) -> float:
        """Position of a value in bin units from the domain start."""
        d = self.domain
        if d.kind == "numeric":
            return (float(v) - float(d.lo)) / d.width
        lo = dt.datetime.fromisoformat(str(d.lo))
        assert d.bin_seconds is not None
        return (_as_datetime(v) - lo).total_seconds() / d.bin_seconds

    def exact_pos(self, v: Any) -> Fraction:
        """``value_to_pos`` in exact arithmetic: the declared bounds as written (as ``bin_label``
        reads them), a number literal as DuckDB reads it (``_number``), times to the microsecond."""
        d = self.domain
        if d.kind == "numeric":
            lo, hi = Fraction(Decimal(repr(float(d.lo)))), Fraction(Decimal(repr(float(d.hi))))
            return (Fraction(v) - lo) * d.bins / (hi - lo)
        lo_t = dt.datetime.fromisoformat(str(d.lo))
        assert d.bin_seconds is not None
        return Fraction((_as_datetime(v) - lo_t) // dt.timedelta(microseconds=1)) / (Fraction(Decimal(repr(float(d.bin_seconds)))) * 1_000_000)

    @property
    def integer(self) -> bool:
        """One value per bin (``analyze.one_value_per_bin``): range endpoints are exact."""
        return one_value_per_bin(self.domain, self.type_text)

    def key_labels(self, i: Sequence[int], *, plain: bool) -> list[Any]:
        """The released keys of a histogram's bins ``i``, typed as DuckDB types the key: the
        lower edges of ``GROUP BY col`` (``plain``) in the column's own type (an integer column's
        are integers, a DATE column's with whole-day bins from midnight are dates, otherwise
        doubles or timestamps), and of ``GROUP BY floor(col / W) * W`` as doubles."""
        labels = self.bin_label(i)
        t = (self.type_text or "").upper()
        if self.domain.kind == "numeric":
            # (an edge outside the 64-bit range, e.g. the declared -2^63 read back as -9223372036854776000, or
            # 2^63 over a UBIGINT, is released as a DOUBLE: an integer key column holds 64-bit values)
            if plain and t in INTEGER_TYPES and all(isinstance(v, int) and -(2**63) <= v < 2**63 for v in labels):
                return labels
            return [float(v) for v in labels]
        if plain and t == "DATE" and all(v.time() == dt.time(0) for v in labels):
            return [v.date() for v in labels]
        return labels

    def bin_label(self, i: Sequence[int]) -> list[Any]:
        d = self.domain
        if d.kind == "numeric":
            # in decimal, from the declared bounds: bin 3 of [0, 1) in 10 bins is 0.3, not 0.30000000000000004
            dlo, dhi = Decimal(repr(float(d.lo))), Decimal(repr(float(d.hi)))
            # (a whole edge exactly: 2^53 + 3 is no double)
            vals = [dlo + Decimal(int(k)) * (dhi - dlo) / Decimal(d.bins) for k in i]
            return [int(v) if v == v.to_integral_value() else float(v) for v in vals]
        lo = dt.datetime.fromisoformat(str(d.lo))
        assert d.bin_seconds is not None
        return [lo + dt.timedelta(seconds=float(k) * d.bin_seconds) for k in i]


@dataclass
class Workload:
    table: TableSpec
    dims: list[Dim]
    base_where: exp.Expression | None
    base_key: str
    sqls: list[str]
    ranges: tuple[tuple[int, ...], ...]  # per query: inclusive bin indices, per dim (lo, hi)
    snapped: list[bool]
    histogram: bool = False  # a GROUP BY over bins: release every bin
    coarsen: int = 1
    notes: list[str] = field(default_factory=list)
    #: a histogram whose WHERE restricts its own column: the bins of the declared domain it can hold in
    #: (``_where_span``), as sorted disjoint inclusive runs (i0, i1). DAWA runs over these bins only, in
    #: order (a synopsis's bin 0 is the first kept bin), and only (coarse) bins holding one of them are
    #: released; None: every bin
    span: tuple[tuple[int, int], ...] | None = None
    #: a 2-D workload whose shared conditions restrict one or both of its columns (``_where_span`` of each): per
    #: dimension its kept runs, or None for every bin. DAWA runs over the grid of the kept rows and columns, in
    #: order; None: the whole grid
    axes: tuple[tuple[tuple[int, int], ...] | None, ...] | None = None

    def transposed(self) -> Workload:
        """The same rectangles over a 2-D grid taken in the other column order (a synopsis made over
        (b, a) answers a workload whose WHERE named a first)."""
        assert len(self.dims) == 2
        return replace(self, dims=self.dims[::-1], ranges=tuple((r[2], r[3], r[0], r[1]) for r in self.ranges),
                       axes=None if self.axes is None else self.axes[::-1], notes=list(self.notes))

    @property
    def size(self) -> int:
        """Bins DAWA runs over: the kept ones, else the whole grid's."""
        if self.span is not None:
            return sum(b - a + 1 for a, b in self.span)
        n = 1
        for k, d in enumerate(self.dims):
            runs = None if self.axes is None else self.axes[k]
            n *= d.n if runs is None else sum(b - a + 1 for a, b in runs)
        return n

    def synopsis_key(self, cap: float, catalog: dict[str, TableSpec], *, binning: list[Any],
                     groups: tuple[float, float, float] | None = None) -> str | None:
        """The key under which this workload's synopsis is stored and found again.

        It names the exact normalised WHERE (string literals keep their case), the table, the
        ordered dimension(s) (bounds, bins and, for dates/times, the bin width), how each dimension's values fall
        into its bins (``binning``, from ``mechanisms.ranges.binning``: exactly at the column's decimal scale, or in
        doubles; a synopsis binned otherwise, e.g. stored before exact bins, holds other rows in its bins), the kept
        bins, the per-unit cap, the privacy unit, and the identity of the source's
        contents (``catalog.source_identity``: an owner-declared version, or file identity and
        modification time). ``None`` when the source has no identity: no reuse. ``groups``: the
        grouped rule's caps (C_u, k, L) when the histogram was bounded by it (a histogram's
        synopsis and a workload's estimate different quantities, so their keys differ).
        """
        ident_src = source_identity(self.table)
        if ident_src is None:
            return None
        ident = {
            "table": self.table.name,
            "source": ident_src,
            "unit": _unit(self.table, catalog),
            # a date/time domain declared by bin_width keeps its hi, so lo, hi and bins do not fix
            # the bins ("6 hours" and "7 hours" over one day are both 4 bins): name their width
            "dims": [[d.column, str(d.domain.lo), str(d.domain.hi), d.domain.bins]
                     + ([] if d.domain.bin_seconds is None else [float(d.domain.bin_seconds)]) for d in self.dims],
            "where": self.base_key,
            "max_rows_per_unit": float(cap),
            "binning": binning,
        }
        if self.span is not None:
            # a synopsis over kept bins answers exactly those (its bin 0 is the first kept bin); one run keeps
            # the key it had when only a range could be kept
            ident["span"] = list(self.span[0]) if len(self.span) == 1 else [list(r) for r in self.span]
        if self.axes is not None:
            ident["axes"] = [None if a is None else [list(r) for r in a] for a in self.axes]
        if groups is not None:
            ident["grouped"] = [None if math.isinf(v) else float(v) for v in groups]
        return "dawa:" + hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _exact(node: exp.Expression) -> str:
    """SQL of a condition with column names unqualified and lower-cased, everything else as
    written (string literals keep their case: ``country = 'US'`` and ``= 'us'`` differ)."""
    return unqualified(node).sql(dialect=DIALECT)


def _where_key(base: list[exp.Expression]) -> str:
    return json.dumps(sorted({_exact(b) for b in base}))


def _conjuncts(e: exp.Expression | None) -> list[exp.Expression]:
    if e is None:
        return []
    if isinstance(e, exp.Paren):
        return _conjuncts(e.this)
    if isinstance(e, exp.And):
        return _conjuncts(e.this) + _conjuncts(e.expression)
    return [e]


_DATE_TYPES = tuple(
    getattr(exp.DataType.Type, t) for t in ("DATE", "TIMESTAMP", "TIMESTAMPNTZ", "DATETIME") if hasattr(exp.DataType.Type, t)
)


def _number(text: str) -> Decimal:
    """A number literal's value as DuckDB reads it: exactly (a DECIMAL) when written without an exponent in
    at most 38 digits, else as a DOUBLE (that double's exact value). ``age >= 20.00000000000000001``
    excludes 20, which its nearest double, 20.0, would not. The digits are those written, leading zeros
    included (DuckDB's width: ``00000000000000000000019.99999999999999999999`` is the DOUBLE 20.0)."""
    d = Decimal(text)
    if "e" in text.lower() or sum(c.isdigit() for c in text) > 38:
        return Decimal(float(text))
    return d


def _literal_value(e: exp.Expression) -> Any:
    if isinstance(e, exp.Paren):
        return _literal_value(e.this)
    if isinstance(e, exp.Cast):
        # only a date/time literal written as a cast (DATE '2024-01-01', CAST('...' AS TIMESTAMP)):
        # a numeric cast changes the value (CAST(20.5 AS INTEGER) is 21), so such a condition is
        # not read as a range endpoint here
        to = e.args.get("to")
        if (
            isinstance(e.this, exp.Literal)
            and e.this.is_string
            and isinstance(to, exp.DataType)
            and to.this in _DATE_TYPES
        ):
            return str(e.this.this)
        raise ValueError("not a literal")
    if isinstance(e, exp.Neg) and isinstance(e.this, exp.Literal) and not e.this.is_string:
        return -_number(str(e.this.this))
    if isinstance(e, exp.Neg) and isinstance(e.this, exp.Paren):  # -(1e400)
        v = _literal_value(e.this)
        if isinstance(v, Decimal):
            return -v
    if isinstance(e, exp.Literal):
        return str(e.this) if e.is_string else _number(str(e.this))
    if isinstance(e, (exp.TsOrDsToDate,)) and isinstance(e.this, exp.Literal):
        return str(e.this.this)
    if isinstance(e, (exp.Add, exp.Sub)):
        return shifted_literal(e)  # DATE '2024-12-31' - INTERVAL 30 DAY, folded as the typer does (or ValueError)
    raise ValueError("not a literal")


_FLIP = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ}


def _endpoint(column: exp.Column, other: exp.Expression, schema: dict[str, str]) -> Any:
    """A range endpoint: a literal's value, or a constant expression's as the engine compares the column with it
    (``folding``: ``age < 2 * 10`` ends at 20); ValueError if neither (or NULL)."""
    try:
        return _literal_value(other)
    except ValueError:
        v = _number_value(folded_comparison(column, other, schema.get(column.name.lower())))
        if v is None:
            raise ValueError("NULL") from None
        return v


def _range_part(c: exp.Expression, ordered: dict[str, OrderedDomain],
                schema: dict[str, str]) -> tuple[str, str, Any] | list[tuple[str, str, Any]] | None:
    """(column, op, value) for a comparison of an ordered column with a literal or a folded constant, else None."""
    if isinstance(c, exp.Between) and isinstance(c.this, exp.Column) and c.this.name.lower() in ordered:
        try:
            lo = _endpoint(c.this, c.args["low"], schema)
            hi = _endpoint(c.this, c.args["high"], schema)
        except ValueError:
            return None
        col = c.this.name.lower()
        return [(col, ">=", lo), (col, "<=", hi)]
    for cls, op in ((exp.GTE, ">="), (exp.GT, ">"), (exp.LTE, "<="), (exp.LT, "<"), (exp.EQ, "=")):
        if type(c) is cls:
            left, right = c.this, c.expression
            if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
                left, right = right, left
                op = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "=": "="}[op]
            if isinstance(left, exp.Column) and left.name.lower() in ordered:
                try:
                    return (left.name.lower(), op, _endpoint(left, right, schema))
                except ValueError:
                    return None
    return None


def _bins_for(dim: Dim, parts: list[tuple[str, Any]]) -> tuple[int, int, bool]:
    """Inclusive bin range selected by the comparisons, and whether an endpoint was snapped.

    Positions are in bin units from the domain start; bin i covers [i, i + 1). On an integer
    domain (one whole value per bin) every endpoint is exact: ``>= 17.5`` starts at 18, ``> 17``
    at 18, ``= 17.5`` selects nothing. On a continuous domain ``<= b`` and ``= b`` include the
    whole bin that contains b, ``> a`` the whole bin that starts at a (values equal to a
    included), and an endpoint inside a bin is snapped outward to whole bins; such a query is
    reported as snapped.
    """
    # half-open [lo, hi) in exact arithmetic: an endpoint 1e-10 bins from an edge is not on it (on an
    # integer domain ``>= 20.0000000001`` starts at 21; on a continuous one it is widened to that bin)
    lo, hi = Fraction(0), Fraction(dim.n)
    # a numeric continuous domain's values are binned in doubles by the bounding SQL (``rewrite.bound``): far
    # from zero an edge's double may miss it, so its bins are also found in doubles and the wider range taken
    lo_pos, hi_pos = 0.0, float(dim.n)
    eps = 1e-9
    inexact = False
    for op, v in parts:
        p = dim.value_to_pos(v)
        if not math.isfinite(p):
            # e.g. age = 1e400 (inf as a float): no bin; refused before any charge
            raise UnsupportedQueryError(
                f"the range endpoint {float(v) if isinstance(v, Decimal) else v!r} on '{dim.column}' is not a finite number",
                hint=f"write an endpoint within the declared domain of '{dim.column}'",
            )
        q = dim.exact_pos(v)
        if dim.integer:
            # one whole value per bin: the bins of the whole values the comparison admits
            if op in (">=", "="):
                lo = max(lo, Fraction(math.ceil(q)))
            if op == ">":
                lo = max(lo, Fraction(math.floor(q) + 1))
            if op == "<":
                hi = min(hi, Fraction(math.ceil(q)))
            if op in ("<=", "="):
                hi = min(hi, Fraction(math.floor(q) + 1))
            continue
        # on a continuous domain, "<= b" / "= b" take in the rest of b's bin and "> a" the value a
        inexact = inexact or op in ("<=", "=") or (op == ">" and 0 <= q < dim.n)
        if op in (">=", ">", "="):
            lo, lo_pos = max(lo, q), max(lo_pos, p)
        if op == "<":
            hi, hi_pos = min(hi, q), min(hi_pos, p)
        if op in ("<=", "="):
            hi = min(hi, Fraction(math.floor(float(q) + eps) + 1))
            hi_pos = min(hi_pos, math.floor(p + eps) + 1)
    snapped = inexact or lo.denominator != 1 or (hi.denominator != 1 and hi < dim.n)
    # an endpoint off the edges takes in the whole bin it falls in (a value within eps below an edge is
    # binned above it, as the bounding SQL bins values: ``rewrite.bound._BIN_EDGE_TOLERANCE``)
    # (a value within eps below an edge may also be binned exactly, below it: ``rewrite.bound.exact_scale``)
    i0 = math.floor(lo) if lo.denominator == 1 or dim.integer else min(math.floor(lo), int(math.floor(float(lo) + eps)))
    i1 = int(hi) - 1 if hi.denominator == 1 else int(math.floor(float(hi) + eps))
    if dim.domain.kind == "numeric" and not dim.integer:
        snapped = snapped or abs(lo_pos - round(lo_pos)) > eps or (abs(hi_pos - round(hi_pos)) > eps and hi_pos < dim.n)
        i0 = min(i0, int(math.floor(lo_pos + eps)))
        i1 = max(i1, int(math.ceil(hi_pos - eps)) - 1)
    i0 = min(max(i0, 0), dim.n)
    i1 = min(max(i1, -1), dim.n - 1)
    return i0, i1, snapped


def _analyze_nth(sql: str, i: int, n: int, catalog: dict[str, TableSpec]) -> ir.QueryPlan:
    """``analyze`` of the ``i``-th of ``n`` queries; a refusal names which query it is (its line and
    column are within that query's own text)."""
    try:
        return analyze(sql, catalog)
    except QueryError as e:
        e.message = f"query {i} of {n} of the workload: {e.message}"
        e.args = (e._render(),)
        raise


def analyze_workload(
    sqls: list[str], catalog: dict[str, TableSpec], plans: list[ir.QueryPlan] | None = None
) -> Workload:
    """Check that ``sqls`` form one range workload and map every query to bin ranges.

    ``plans``: the queries already analysed (each query is parsed once)."""
    if not isinstance(sqls, (list, tuple)) or not sqls:
        raise UnsupportedQueryError("query_many needs a non-empty list of SQL range-count queries",
                                    hint="pass a list such as [\"SELECT COUNT(*) FROM t WHERE x >= 0 AND x < 10\"]")
    if plans is None:
        plans = [_analyze_nth(s, i, len(sqls), catalog) for i, s in enumerate(sqls, 1)]
    for i, p in enumerate(plans, 1):
        if p.join is not None:  # its rows are the join's, which no range workload's bins describe
            raise UnsupportedQueryError(
                f"query {i} of {len(plans)} of the workload reads a join; range workloads (query_many, answered by "
                "DAWA) are answered on one table only",
                hint=f"write each query on one table: SELECT COUNT(*) FROM {p.table.name} WHERE <range over a column "
                     "with a declared ordered domain>, conditions on a lookup table's columns as conditions on the "
                     "referencing column (cc IN ('FR', 'DE')); or ask each range count of the join with query()")
    table = plans[0].table
    ordered = {name: c.ordered for name, c in table.columns.items() if c.ordered is not None}
    if not ordered:
        raise PolicyError(
            f"table '{table.name}' declares no ordered domain for range queries",
            hint="register a column with bounds and bins, e.g. columns={'age': {'bounds': (0, 120), 'bins': 121}}",
        )
    base_keys: set[str] | None = None
    base_expr: exp.Expression | None = None
    per_query: list[dict[str, list[tuple[str, Any]]]] = []
    used: list[str] = []
    first: list[exp.Expression] = []  # the other conditions of query 1, as written
    for qi, (s, p) in enumerate(zip(sqls, plans), 1):
        if p.table.name != table.name:
            raise UnsupportedQueryError("all queries of a workload must read the same table",
                                        hint="answer each table's range counts as a workload of its own")
        plain = (len(p.outputs) == 1 and p.outputs[0].source is not None and not p.order and p.limit is None
                 and p.offset is None)
        if p.keys or [a.kind for a in p.aggregates] != [ir.COUNT_STAR] or p.having is not None or not plain:
            raise UnsupportedQueryError(
                f"a range workload query must be SELECT COUNT(*) FROM {table.name} WHERE <range>: {s!r}"
            )
        base: list[exp.Expression] = []
        rng: dict[str, list[tuple[str, Any]]] = {}
        for c in _conjuncts(p.where):
            part = _range_part(c, ordered, table.schema)
            if part is None:
                base.append(c)
                continue
            for col, op, v in part if isinstance(part, list) else [part]:
                rng.setdefault(col, []).append((op, v))
                if col not in used:
                    used.append(col)
        keys = {_exact(b) for b in base}
        if base_keys is None:
            base_keys, first = keys, base
            base_expr = _and(base)
        elif keys != base_keys:
            # name one condition that is in one of the two queries only
            odd = [(qi, b) for b in base if _exact(b) not in base_keys] + [(1, b) for b in first if _exact(b) not in keys]
            at, cond = odd[0]
            raise UnsupportedQueryError(
                f"all queries of a workload must share the same non-range WHERE conditions: query {at} of "
                f"{len(sqls)} has the condition {cond.sql(dialect=DIALECT)}, which is no range and which query "
                f"{qi if at == 1 else 1} does not have",
                hint=f"a range is a comparison of a column with a declared ordered domain ({', '.join(sorted(ordered))}) "
                     "with a literal (<, <=, >, >=, =) or a BETWEEN, ANDed with the others; write a disjunction, IN or "
                     "<> as several queries of ranges, or split the workload by its other conditions",
            )
        per_query.append(rng)
    if not used:
        raise UnsupportedQueryError("no query of the workload has a range over a column with a declared ordered domain",
                                    hint="range over a column registered with bounds and bins, e.g. "
                                    "columns={'age': {'bounds': (0, 120), 'bins': 121}}")
    if len(used) > 2:
        raise UnsupportedQueryError(f"range workloads support one or two ordered columns, got {used}",
                                    hint="split the workload so that each part ranges over at most two of these columns")
    dims = [Dim(c, ordered[c], table.schema.get(c)) for c in used]
    rows, snapped = [], []
    for rng in per_query:
        row: list[int] = []
        sn = False
        for d in dims:
            i0, i1, s_ = _bins_for(d, rng.get(d.column, []))
            row += [i0, i1]
            sn = sn or s_
        rows.append(row)
        snapped.append(sn)
    # a shared condition on a column (age <> 35, age IN (...)) keeps its bins as a histogram's WHERE does; in 2-D
    # each column's (a condition mixing both, age < 10 OR score > 5, restricts neither: a superset of the cells)
    kept_runs = [_where_span(d, base_expr, strict=True) for d in dims]
    span = kept_runs[0] if len(dims) == 1 else None
    axes = tuple(kept_runs) if len(dims) == 2 and any(a is not None for a in kept_runs) else None

    # a 2-D shared condition mixing both columns (age < 10 OR score > 5) may keep fewer cells than its columns' kept
    # bins span: the rectangles meeting no cell where it can hold are known to be empty
    # (on a grid too large, refused below)
    cells = _grid_cells(dims, base_expr) if len(dims) == 2 and dims[0].n * dims[1].n <= MAX_GRID_CELLS else None

    def kept(r: list[int]) -> bool:
        return all(runs is None or any(max(r[2 * k], x) <= min(r[2 * k + 1], y) for x, y in runs)
                   for k, runs in enumerate(kept_runs)) and (cells is None or cells(r))

    if all(any(r[2 * k] > r[2 * k + 1] for k in range(len(dims))) or not kept(r) for r in rows):
        cols = " and ".join(f"'{d.column}'" for d in dims)
        raise QueryError(
            f"no range of this workload admits a value of the declared domain of {cols}: every count is 0 whatever "
            "the data, known from the queries' text alone; nothing was charged",
            hint="check each range's endpoints against the declared bounds (BETWEEN takes the smaller end first)",
        )
    if len(dims) == 2 and dims[0].n * dims[1].n > MAX_GRID_CELLS:
        raise PolicyError(f"2-D range workloads support at most {MAX_GRID_CELLS:,} cells (e.g. 1024 x 1024), got "
                          f"{dims[0].n} x {dims[1].n}",
                          hint="register the columns with fewer bins, or answer each column's ranges as a 1-D workload")
    if len(dims) == 2:
        border = sum(rect_border_cells(*r) for r in rows)
        if border > MAX_BORDER_CELLS:
            raise UnsupportedQueryError(
                f"the {len(rows)} rectangles of this 2-D range workload have {border:,} border cells in all; at most "
                f"{MAX_BORDER_CELLS:,} are supported (a rectangle is mapped onto the grid's Hilbert order from its border "
                f"cells, on a {dims[0].n} x {dims[1].n} grid up to {rect_border_cells(0, dims[0].n - 1, 0, dims[1].n - 1):,} "
                "each)",
                hint="ask fewer or smaller rectangles per workload (each workload is charged on its own), or register the "
                     "columns with fewer bins",
            )
    return Workload(
        table=table,
        dims=dims,
        base_where=base_expr,
        base_key=json.dumps(sorted(base_keys or set())),
        sqls=list(sqls),
        ranges=tuple(tuple(r) for r in rows),
        snapped=snapped,
        span=span,
        axes=axes,
    )


def _and(parts: list[exp.Expression]) -> exp.Expression | None:
    if not parts:
        return None
    out = parts[0].copy()
    for p in parts[1:]:
        out = exp.And(this=out, expression=p.copy())
    return out


def histogram_workload(plan: ir.QueryPlan) -> Workload | None:
    """A ``GROUP BY <ordered column>`` COUNT(*) query as the workload of all bins, else None.

    ``GROUP BY floor(col / W) * W`` with W a multiple of the bin width asks for a coarser
    histogram (answered from the bins, every coarse bin released).
    """
    if len(plan.keys) != 1 or [a.kind for a in plan.aggregates] != [ir.COUNT_STAR]:
        return None
    key = plan.keys[0].expr
    col, factor = _binned_column(key, plan.table)
    if col is None:
        return None
    cspec = plan.table.column(col)
    assert cspec.ordered is not None
    dim = Dim(col, cspec.ordered, plan.table.schema.get(col))
    n = dim.n
    factor = max(1, factor)
    base = [c for c in _conjuncts(plan.where)]
    # a HAVING on a one-bin group's key (its label, a value of its bin) can hold only in the bins where it can hold
    # for a value: the other bins are never released (a coarse group's count is all of its bins: not restricted)
    having = None if factor > 1 or plan.having is None else plan.having.transform(
        lambda x: exp.column(col) if isinstance(x, exp.Column) and x.name == plan.keys[0].name else x)
    span = _where_span(dim, plan.where, strict=True)
    if having is not None and (span is None or span):
        # (not strict: the analyser's HAVING repeats the WHERE's conditions on the key in their typed form, and a
        # HAVING condition not read here restricts nothing)
        span = _where_span(dim, _and([c for c in (plan.where, having) if c is not None]))
    else:
        having = None  # (the WHERE alone keeps no bin)
    if span is not None and not span:
        d = dim.domain
        ends = dim.key_labels([0, n - 1], plain=True)
        domain = f"values {ends[0]} to {ends[1]}" if dim.integer else f"[{d.lo}, {d.hi}) in {n} bins"
        clauses = " and ".join(c for c, e in (("WHERE", plan.where), ("HAVING", having)) if e is not None)
        raise QueryError(
            f"the {clauses} admit{'' if ' and ' in clauses else 's'} no value "
            f"of the declared domain of '{col}' ({domain}): every bin of "
            "this histogram is empty whatever the data, known from the query's text alone; nothing was charged",
            hint=f"check the {clauses}'s conditions on '{col}' against its declared bounds (BETWEEN takes the smaller "
                 "end first; NULLs and values outside the declared domain are never counted)",
        )
    starts = range(0, n, factor) if span is None else sorted({s for a, b in span for s in range(a - a % factor, b + 1, factor)})
    ranges = tuple((s, min(s + factor - 1, n - 1)) for s in starts)
    return Workload(
        table=plan.table,
        dims=[dim],
        base_where=_and(base),
        base_key=_where_key(base),
        sqls=[plan.sql],
        ranges=ranges,
        snapped=[False] * len(ranges),
        histogram=True,
        coarsen=factor,
        span=span,
    )


Runs = list[tuple[int, int]]  # sorted, disjoint, non-adjacent inclusive runs of bins


def _runs_or(a: Runs, b: Runs) -> Runs:
    out: Runs = []
    for lo, hi in sorted(a + b):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _runs_not(a: Runs, n: int) -> Runs:
    out: Runs = []
    nxt = 0
    for lo, hi in a:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    return out + ([(nxt, n - 1)] if nxt <= n - 1 else [])


_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "=": "<>", "<>": "="}
_COMPARISONS = ((exp.GTE, ">="), (exp.GT, ">"), (exp.LTE, "<="), (exp.LT, "<"), (exp.EQ, "="), (exp.NEQ, "<>"))


def _may(dim: Dim, op: str, v: Any) -> Runs:
    """The bins holding a value for which ``col op v`` can be true (``_bins_for``: on continuous bins the
    bin holding an endpoint is kept whole, so ``<>`` keeps every bin). An infinite v (``1e400``, DuckDB's
    DOUBLE inf) is above (below) every value: ``<>`` and ``<`` (``>``) hold everywhere, the rest nowhere."""
    if isinstance(v, Decimal) and v.is_infinite():
        return [(0, dim.n - 1)] if op == "<>" or (op in ("<", "<=") and v > 0) or (op in (">", ">=") and v < 0) else []
    if op == "<>":
        return _runs_not(_may(dim, "=", v), dim.n) if dim.integer else [(0, dim.n - 1)]
    i0, i1, _ = _bins_for(dim, [(op, v)])
    return [(i0, i1)] if i0 <= i1 else []


def _infinite(e: exp.Expression) -> Decimal | None:
    """A string cast to DOUBLE that DuckDB reads as infinite or NaN (``CAST('nan' AS DOUBLE)``, ``'-inf'::DOUBLE``,
    ``CAST('1e400' AS DOUBLE)``) as an infinite Decimal, NaN as +inf (DuckDB orders NaN above every number and
    equal to itself only); None for anything else."""
    to = e.args.get("to")
    if not (isinstance(e, exp.Cast) and isinstance(e.this, exp.Literal) and e.this.is_string
            and isinstance(to, exp.DataType) and to.this == exp.DataType.Type.DOUBLE):
        return None
    try:  # (as the folding reads text: '-nan' and Unicode digits or blanks are not read here)
        f = to_double(str(e.this.this))
    except Unfoldable:
        return None
    return Decimal("Infinity") if math.isnan(f) else Decimal(f) if math.isinf(f) else None


def _number_value(v: Any) -> Any:
    """A folded constant (``folding.folded_comparison``) as a literal's value: a Decimal, inf and NaN as with
    ``_infinite`` (NaN above every number), a date or datetime, None for NULL."""
    if v is None or isinstance(v, (Decimal, dt.date)):
        return v
    if isinstance(v, float):
        return Decimal("Infinity") if math.isnan(v) else Decimal(v)
    if isinstance(v, int):
        return Decimal(v)
    raise Unfoldable("not a number")


def _kept(dim: Dim, e: exp.Expression, strict: bool = False) -> tuple[Runs, Runs]:
    """(may, must): the bins where the condition ``e`` can be true for a value of ``dim``'s column (a superset),
    and those where it cannot be false (a subset of the complement of where it can be false). In SQL's
    three-valued logic a row passes only where ``e`` is true; a comparison with NULL is neither true nor
    false, and so is its NOT. A condition not read here may be true or false anywhere. A constant expression is
    folded (``plan.folding``); ``strict``: one that is not folded and compared with a numeric column is refused
    (UnsupportedQueryError, free), else it restricts nothing."""
    n, col = dim.n, dim.column
    every: Runs = [(0, n - 1)]

    # an integer column within 2^53 cast to DOUBLE keeps its value: compared with the literal's double
    t = (dim.type_text or "").upper()
    exact_double = t == "DOUBLE" or (
        t in INTEGER_TYPES and dim.domain.kind == "numeric" and max(abs(float(dim.domain.lo)), abs(float(dim.domain.hi))) <= 2.0**53)

    def as_double(c: exp.Expression) -> bool:
        to = c.args.get("to")
        return (isinstance(c, exp.Cast) and exact_double and isinstance(c.this, exp.Column) and isinstance(to, exp.DataType)
                and to.this == exp.DataType.Type.DOUBLE and not to.expressions)

    def ours(c: exp.Expression) -> bool:
        return (isinstance(c, exp.Column) or as_double(c)) and (c if isinstance(c, exp.Column) else c.this).name.lower() == col

    # a column compared in REAL or DOUBLE (with such a constant: as DuckDB) is rounded to 24 or 53 bits first, unless
    # it is an integer within 2^24 or 2^53: it passes wherever its REAL or DOUBLE does
    ints = t in INTEGER_TYPES and dim.domain.kind == "numeric"
    span = max(abs(float(dim.domain.lo)), abs(float(dim.domain.hi))) if ints else math.inf
    may_round = t not in ("DOUBLE", "FLOAT", "REAL", "FLOAT4") and span > 2.0**24

    def in_float(condition: exp.Expression, subject: exp.Expression) -> str | None:
        c = subject if isinstance(subject, exp.Column) else subject.this
        kind = compared_as_float(condition, c, dim.type_text) if may_round and isinstance(c, exp.Column) else None
        return None if kind == "DOUBLE" and span <= 2.0**53 else kind

    def atom(op: str, other: exp.Expression, subject: exp.Expression, real: str | None | bool = False) -> tuple[Runs, Runs]:
        if isinstance(other, exp.Null):
            return [], every  # NULL, never true nor false: its NOT is never true either
        cast = as_double(subject)
        try:
            v = _infinite(other)
            v = _literal_value(other) if v is None else v
        except (ValueError, ArithmeticError, TypeError):
            try:  # a constant expression: the value the engine compares with (1e308 * 10 is inf, 2 * 10 is 20)
                v = _number_value(folded_comparison(subject, other, dim.type_text))
            except Unfoldable:
                # (a date/time constant not folded here, e.g. TIMESTAMP_NS '...' or date_trunc(...), restricts nothing)
                if strict and other.find(exp.Column) is None and dim.domain.kind == "numeric":
                    raise UnsupportedQueryError(
                        f"the comparison of '{col}' with the constant expression {other.sql(dialect=DIALECT)} is not read "
                        f"for the bins of '{col}' (dpsql folds literals, + - * / // %, NULLIF, abs and casts between numbers "
                        "only), so the "
                        "bins where a value can pass the WHERE are unknown; nothing was charged",
                        hint="write its value as a literal (e.g. 20 for 2 * 10)") from None
                return every, []
            if v is None:
                return [], every  # (as NULL)
        try:
            v = Decimal(float(v)) if cast else v  # (DuckDB compares a DOUBLE with the literal's double)
            kind = in_float(exp.EQ(this=subject.copy(), expression=other.copy()), subject) if real is False else real
            if isinstance(v, Decimal) and v.is_finite() and other.find(exp.Column) is None and kind:
                lo, hi, ends = float_edges(v, kind == "FLOAT")  # the values whose REAL is v's: REAL(x) < v where x < lo, ...

                def wide(o: str) -> Runs:  # the bins where REAL(x) o v
                    if o in ("<", "<="):
                        return _may(dim, "<" if ends == (o == "<") else "<=", lo if o == "<" else hi)
                    if o in (">", ">="):
                        return _may(dim, ">" if ends == (o == ">") else ">=", hi if o == ">" else lo)
                    if o == "=":
                        return _runs_not(_runs_or(_runs_not(wide(">="), n), _runs_not(wide("<="), n)), n)
                    return _runs_not(wide("="), n) if dim.integer else every

                return wide(op), _runs_not(wide(_NEGATED[op]), n)
            return _may(dim, op, v), _runs_not(_may(dim, _NEGATED[op], v), n)
        except (QueryError, ValueError, TypeError, OverflowError, ArithmeticError):
            return every, []  # an endpoint read otherwise than DuckDB may read it: no restriction

    def both(parts: list[tuple[Runs, Runs]], conj: bool) -> tuple[Runs, Runs]:
        # one sort for all parts (an IN list of 10 000 values): a union at once, an intersection as the
        # complement of the union of the complements
        def join(sets: list[Runs]) -> Runs:
            if not conj:
                return _runs_or([r for x in sets for r in x], [])
            return _runs_not(_runs_or([r for x in sets for r in _runs_not(x, n)], []), n)

        return join([m for m, _ in parts]), join([u for _, u in parts])

    if isinstance(e, exp.Paren):
        return _kept(dim, e.this, strict)
    if isinstance(e, (exp.And, exp.Or)):
        return both([_kept(dim, e.this, strict), _kept(dim, e.expression, strict)], isinstance(e, exp.And))
    if isinstance(e, exp.Not):
        may, must = _kept(dim, e.this, strict)
        return _runs_not(must, n), _runs_not(may, n)
    if isinstance(e, exp.Is) and ours(e.this) and isinstance(e.expression, exp.Null):
        return [], []  # NULLs are never counted
    if isinstance(e, exp.Between) and ours(e.this):
        s = e.this
        real = in_float(e, s)  # (the ends and the column in one common type)
        lo, hi = atom(">=", e.args["low"], s, real), atom("<=", e.args["high"], s, real)
        if e.args.get("symmetric"):  # either order of the ends
            return both([both([lo, hi], True), both([atom("<=", e.args["low"], s, real), atom(">=", e.args["high"], s, real)],
                                                    True)], False)
        return both([lo, hi], True)
    if isinstance(e, exp.In) and ours(e.this) and e.expressions and not e.args.get("query"):
        real = in_float(e, e.this)  # (the list and the column in one common type: once for the whole list)
        return both([atom("=", x, e.this, real) for x in e.expressions], False)
    if isinstance(e, exp.Boolean):  # TRUE, FALSE
        return (every, every) if e.this else ([], [])
    if isinstance(e, exp.Null):  # a NULL condition: never true nor false
        return [], every
    if isinstance(e, (exp.NullSafeEQ, exp.NullSafeNEQ)) and ours(e.this) and ours(e.expression):
        # the column IS [NOT] DISTINCT FROM itself: never distinct, NULL included (true or false, never NULL)
        return (every, every) if isinstance(e, exp.NullSafeEQ) else ([], [])
    for cls, op in _COMPARISONS:
        if type(e) is cls:
            if ours(e.this) and ours(e.expression):
                # the column compared with itself (age <> age): a value of the domain (never NaN) equals itself, so
                # =, <=, >= are true and <>, <, > false in every bin (NULL, in no bin, is neither)
                return (every, every) if op in ("=", "<=", ">=") else ([], [])
            if ours(e.this) and not ours(e.expression):
                return atom(op, e.expression, e.this)
            if ours(e.expression) and not ours(e.this):
                return atom({">=": "<=", ">": "<", "<=": ">=", "<": ">"}.get(op, op), e.this, e.expression)
    return every, []


def _grid_cells(dims: list[Dim], where: exp.Expression | None) -> Any:
    """For a 2-D workload: a test of whether a rectangle (r0, r1, c0, c1) of bins meets a cell where the WHERE can
    hold, read exactly from its comparisons of either column with constants (``_kept`` of each) under ``AND``,
    ``OR`` and ``NOT``; None when every cell may pass. Each comparison is constant between consecutive cuts of its
    column's runs, so the WHERE is evaluated once per pair of segments: a bit mask of one column's segments per
    segment of the other, the column with fewer segments indexing the masks (on a grid of at most
    ``MAX_GRID_CELLS`` cells, at most 1 024 masks of any length). A rectangle is tested on the OR of its masks,
    read from a table of ORs over runs of 2^k masks. Public: the query's text and the declared domains."""
    if where is None:
        return None
    n0, n1 = dims[0].n, dims[1].n
    leaves: dict[int, tuple[int, Runs, Runs]] = {}  # id(leaf) -> (column index, may, must)

    def walk(e: exp.Expression) -> bool:
        if isinstance(e, exp.Paren):
            return walk(e.this)
        if isinstance(e, (exp.And, exp.Or)):
            return walk(e.this) and walk(e.expression)
        if isinstance(e, exp.Not):
            return walk(e.this)
        read = [(k, *_kept(d, e)) for k, d in enumerate(dims)]
        known = [x for x in read if (x[1], x[2]) != ([(0, dims[x[0]].n - 1)], [])]
        if known and e.find(exp.Column) is None:
            known = known[:1]  # a constant (FALSE, NULL): the same in every cell, read on the first column
        if len(known) > 1:
            return False  # (no comparison reads both columns)
        leaves[id(e)] = known[0] if known else (-1, [], [])
        return True

    if not walk(where):
        return None
    cuts: list[list[int]] = [[0, n0], [0, n1]]
    for k, may, must in leaves.values():
        if k >= 0:
            cuts[k] += [x for a, b in may + must for x in (a, b + 1)]
    segs = [sorted(set(c)) for c in cuts]
    # masks indexed by the column with fewer segments (``lo``), over the other's (``hi``)
    lo = 0 if len(segs[0]) <= len(segs[1]) else 1
    hi = 1 - lo
    rows, cols = segs[lo][:-1], segs[hi][:-1]
    full = (1 << len(cols)) - 1

    def inside(runs: Runs, x: int) -> bool:  # (runs: sorted and disjoint)
        i = bisect.bisect_right(runs, (x, math.inf)) - 1
        return i >= 0 and runs[i][0] <= x <= runs[i][1]

    def bits(runs: Runs) -> int:
        return int("".join("1" if inside(runs, x) else "0" for x in reversed(cols)) or "0", 2)

    def masks(e: exp.Expression) -> tuple[list[int], list[int]]:
        """(may, must) per segment of column ``lo``: bit masks over column ``hi``'s segments."""
        if isinstance(e, exp.Paren):
            return masks(e.this)
        if isinstance(e, (exp.And, exp.Or)):
            (a, b), (c, d) = masks(e.this), masks(e.expression)
            if isinstance(e, exp.And):
                return [x & y for x, y in zip(a, c)], [x & y for x, y in zip(b, d)]
            return [x | y for x, y in zip(a, c)], [x | y for x, y in zip(b, d)]
        if isinstance(e, exp.Not):
            may, must = masks(e.this)
            return [full & ~x for x in must], [full & ~x for x in may]
        k, may_r, must_r = leaves[id(e)]
        if k < 0:  # not read here: may hold anywhere, never certain
            return [full] * len(rows), [0] * len(rows)
        if k == lo:
            return [full if inside(may_r, x) else 0 for x in rows], [full if inside(must_r, x) else 0 for x in rows]
        return [bits(may_r)] * len(rows), [bits(must_r)] * len(rows)

    may_rows, _ = masks(where)
    if all(m == full for m in may_rows):
        return None
    # ors[k][i]: the OR of masks i .. i + 2^k - 1 (a rectangle's rows are the OR of two of them)
    ors = [may_rows]
    while 1 << len(ors) <= len(rows):
        last, step = ors[-1], 1 << (len(ors) - 1)
        ors.append([last[i] | last[i + step] for i in range(len(last) - step)])

    def meets(r: list[int]) -> bool:
        if r[0] > r[1] or r[2] > r[3]:
            return False
        i0, i1 = (bisect.bisect_right(rows, x) - 1 for x in (r[2 * lo], r[2 * lo + 1]))
        j0, j1 = (bisect.bisect_right(cols, x) - 1 for x in (r[2 * hi], r[2 * hi + 1]))
        k = (i1 - i0 + 1).bit_length() - 1
        m = ors[k][i0] | ors[k][i1 - (1 << k) + 1]
        return (m >> j0) & ((1 << (j1 - j0 + 1)) - 1) != 0

    return meets


def _where_span(dim: Dim, where: exp.Expression | None, strict: bool = False) -> tuple[tuple[int, int], ...] | None:
    """The bins of ``dim`` in which a value can pass the WHERE, read from its comparisons of that column with
    literals (``<``, ``<=``, ``>``, ``>=``, ``=``, ``<>``, ``BETWEEN``, ``IN``, ``IS NULL``) under ``AND``,
    ``OR`` and ``NOT`` (``_kept``; an endpoint inside a continuous bin keeps the whole bin), as runs; None
    when that is every bin, () when it is none.

    Privacy: a function of the query's text (its literals) and the declared domain only, public
    metadata; the bins it leaves out hold no row that passes the WHERE, and DAWA over the kept bins is
    DAWA over a sub-vector of the bounded histogram, whose L1 sensitivity is at most the whole one's."""
    if where is None:
        return None
    may, _ = _kept(dim, where, strict)
    if may == [(0, dim.n - 1)]:
        return None
    return tuple(may)


#: date_trunc's units of a fixed length in seconds (a week from a Monday's midnight; a month has no fixed length)
_TRUNC_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}


def _binned_column(key: exp.Expression, table: TableSpec) -> tuple[str | None, int]:
    if isinstance(key, exp.Column):
        name = key.name.lower()
        if name in table.columns and table.columns[name].ordered is not None:
            return name, 1
        if is_bin_column(name, table) and name not in table.schema:
            return name.removesuffix("_bin"), 1
        return None, 1
    # date_trunc('<unit>', col) of a TIMESTAMP column whose bins split the unit evenly, from a unit boundary: the
    # coarser histogram of the units, each labelled by its first bin's start, which is date_trunc's value there
    if isinstance(key, exp.TimestampTrunc) and isinstance(key.this, exp.Column) and isinstance(key.args.get("unit"), exp.Var):
        name = key.this.name.lower()
        c = table.columns.get(name)
        unit = _TRUNC_SECONDS.get(str(key.args["unit"].this).lower())
        if (c is None or c.ordered is None or c.ordered.kind == "numeric" or unit is None or not c.ordered.bin_seconds
                or parse_type(table.schema.get(name, "")).name != "TIMESTAMP"):
            return None, 1
        ratio = unit / c.ordered.bin_seconds
        try:
            lo = dt.datetime.fromisoformat(str(c.ordered.lo))
        except ValueError:  # pragma: no cover - the catalog validates the bounds
            return None, 1
        since = (lo - dt.datetime(lo.year, lo.month, lo.day)).total_seconds() + 86400 * lo.weekday() * (unit == 604800)
        if abs(ratio - round(ratio)) > 1e-9 or round(ratio) < 1 or since % unit != 0 or lo.tzinfo is not None:
            return None, 1
        return name, int(round(ratio))
    # floor(col / W) * W  with W a whole multiple of the bin width
    if isinstance(key, exp.Mul) and isinstance(key.this, exp.Floor):
        inner = key.this.this
        if isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.Div) and isinstance(inner.this, exp.Column):
            try:
                w1 = _literal_value(inner.expression)
                w2 = _literal_value(key.expression)
            except ValueError:
                return None, 1
            name = inner.this.name.lower()
            c = table.columns.get(name)
            if c is None or c.ordered is None or c.ordered.kind != "numeric" or w1 != w2:
                return None, 1
            ratio = float(w1) / c.ordered.width
            if abs(ratio - round(ratio)) > 1e-9 or round(ratio) < 1 or float(c.ordered.lo) % float(w1) != 0:
                return None, 1
            return name, int(round(ratio))
    return None, 1


def column_workload(plan: ir.QueryPlan, column: str) -> Workload | None:
    """Every single bin of ``column``'s declared ordered domain, under the plan's WHERE as base
    conditions: the workload whose stored synopsis a quantile of ``column`` can be read from
    (``dpsql.mechanisms.quantile``). None when the column has no numeric ordered domain or the
    query is grouped."""
    cspec = plan.table.columns.get(column)
    if plan.keys or cspec is None or cspec.ordered is None or cspec.ordered.kind != "numeric":
        return None
    dim = Dim(column, cspec.ordered, plan.table.schema.get(column))
    base = _conjuncts(plan.where)
    # a histogram under this WHERE ran over its kept bins only (``_where_span``): its synopsis is named by them, and
    # a bin outside them reads as empty (``ranges.bin_ranges``)
    return Workload(table=plan.table, dims=[dim], base_where=_and(base), base_key=_where_key(base), sqls=[plan.sql],
                    ranges=tuple((i, i) for i in range(dim.n)), snapped=[False] * dim.n,
                    span=_where_span(dim, plan.where) or None)
