"""Window functions over the released rows (post-processing): which are answered, and their checks.

A window in the SELECT list, ORDER BY or QUALIFY of an aggregate query sees the released rows only (one per
released group): its arguments, PARTITION BY and ORDER BY are built from the query's GROUP BY keys, its
aggregates (released and charged as if they were outputs) and literals, so ``SUM(COUNT(*)) OVER ()`` is the
total of the released counts and ``RANK() OVER (ORDER BY COUNT(*) DESC)`` ranks the released groups. A window
over raw rows (a column that is no key) would release per-row values: refused, as is a window in WHERE, GROUP
BY, HAVING or inside an aggregate. Pure functions of the SQL text (no catalog, no data).

Totality: everything a window evaluates is fixed by the text to what cannot fail on any released value: NTILE's
bucket count and LAG / LEAD's offset are positive (non-negative) integer literals; a frame is ROWS with
non-negative integer literal offsets, or RANGE between UNBOUNDED and CURRENT ROW (an offset over a released
value could overflow); no GROUPS, EXCLUDE, DISTINCT or FILTER. Ties are broken by the GROUP BY keys where the
result depends on the order of peers (``tie_broken``), so a result is a function of the released rows only.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.plan import ir

#: the window functions answered over the released rows, by sqlglot class, as named in messages
FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.RowNumber: "ROW_NUMBER", exp.Rank: "RANK", exp.DenseRank: "DENSE_RANK", exp.PercentRank: "PERCENT_RANK",
    exp.CumeDist: "CUME_DIST", exp.Ntile: "NTILE", exp.Lag: "LAG", exp.Lead: "LEAD", exp.FirstValue: "FIRST_VALUE",
    exp.LastValue: "LAST_VALUE", exp.Sum: "SUM", exp.Avg: "AVG", exp.Min: "MIN", exp.Max: "MAX", exp.Count: "COUNT",
}
ALLOWED = ", ".join(FUNCTIONS.values())
#: functions whose value depends on the order of peers in the window's ORDER BY (ties broken by the keys)
_ORDER_SENSITIVE = (exp.RowNumber, exp.Ntile, exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue)

#: functions that give peers one value (a frame does not change them)
_PEERS = (exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist)

#: what a window reads, said in every refusal of a window over raw rows
OVER_RELEASED = ("a window function sees only the released rows (one per group): its arguments, PARTITION BY and "
                 "ORDER BY are GROUP BY keys, aggregates or literals")


def function(w: exp.Window) -> exp.Expression:
    """The window's function, without IGNORE / RESPECT NULLS."""
    f = w.this
    while isinstance(f, (exp.IgnoreNulls, exp.RespectNulls)):
        f = f.this
    return f


def is_window_function(node: exp.Expression) -> bool:
    """``node`` is the function of a window (an aggregate class in sqlglot, but evaluated over released rows)."""
    p = node.parent
    while isinstance(p, (exp.IgnoreNulls, exp.RespectNulls)):
        p = p.parent
    return isinstance(p, exp.Window) and p.this is not None and function(p) is node


def inputs(w: exp.Window) -> list[exp.Expression]:
    """What a window reads of each row: its function's arguments, PARTITION BY and ORDER BY expressions."""
    f = function(w)
    args = [a for a in f.iter_expressions() if not isinstance(a, exp.Star)]
    args = [x for a in args for x in ([a.this, *(o.this for o in a.expressions)] if isinstance(a, exp.Order) else [a])]
    order = w.args.get("order")
    return args + list(w.args.get("partition_by") or []) + [o.this for o in (order.expressions if order else [])]


def _count_literal(e: exp.Expression | None, least: int) -> bool:
    # (at most a BIGINT: DuckDB binds a wider literal as no count)
    return isinstance(e, exp.Literal) and not e.is_string and str(e.this).isdigit() and least <= int(e.this) < 2**63


def problem(w: exp.Window, written: str = "") -> str | None:
    """Why ``w`` is not answered over the released rows (None: it is), with the fix. ``written``: the name of its
    function as the query spells it, when sqlglot's differs (``string_agg``, read as GROUP_CONCAT)."""
    f = function(w)
    name = FUNCTIONS.get(type(f.this if isinstance(f, exp.Filter) else f))
    if name is None:
        called = (written or (str(f.this) if isinstance(f, exp.Anonymous) else f.sql_name() if isinstance(f, exp.Func)
                              else type(f).__name__)).upper()
        return (f"window function {called} is not supported over the released rows; the window functions answered are "
                f"{ALLOWED}")
    if w.args.get("alias") is not None:
        return ("a named window (OVER w) is not supported; write the window in the OVER clause, e.g. "
                "OVER (PARTITION BY k ORDER BY COUNT(*) DESC)")
    if any(isinstance(n, exp.Window) for n in w.walk() if n is not w):
        return "window functions cannot be nested; compute the inner window as an output of its own"
    if isinstance(f.this, exp.Distinct) or isinstance(f, exp.Filter) or any(  # an aggregate's own FILTER is answered
            not isinstance(n.this, exp.AggFunc) for n in f.find_all(exp.Filter)):
        return f"{name}(DISTINCT ...) or FILTER in a window is not supported; drop DISTINCT / FILTER"
    if isinstance(f, (exp.RowNumber, exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist)) and any(
            True for _ in f.iter_expressions()):
        return f"{name}() takes no argument; rank by a value with OVER (ORDER BY value), e.g. {name}() OVER (ORDER BY COUNT(*) DESC)"
    if isinstance(f, exp.Ntile) and not _count_literal(f.this, 1):
        return "NTILE takes a positive integer literal (the number of buckets), e.g. NTILE(4)"
    if isinstance(f, (exp.Lag, exp.Lead)) and f.args.get("offset") is not None and not _count_literal(f.args["offset"], 0):
        return f"{name}'s offset is a non-negative integer literal, e.g. {name}(x, 1)"
    default = f.args.get("default") if isinstance(f, (exp.Lag, exp.Lead)) else None
    while isinstance(default, (exp.Neg, exp.Paren)) or (isinstance(default, exp.Cast) and isinstance(  # DATE '...'
            default.this, (exp.Literal, exp.Null, exp.Boolean, exp.Neg))):
        default = default.this
    if default is not None and not isinstance(default, (exp.Literal, exp.Null, exp.Boolean)):
        # converted to the argument's type outside any TRY: a released value that does not convert would fail
        return (f"{name}'s default is a literal (converted to the argument's type, it could fail on a released value "
                f"otherwise), e.g. {name}(x, 1, 0); write COALESCE({name}(x) OVER (...), expr) for another value")
    spec = w.args.get("spec")
    if spec is not None:
        kind = str(spec.args.get("kind") or "").upper()
        if spec.args.get("exclude") is not None:
            return "EXCLUDE in a window frame is not supported; drop it"
        bounds = [spec.args.get("start"), spec.args.get("end")]
        start, end = _position(bounds[0], spec.args.get("start_side")), _position(bounds[1], spec.args.get("end_side"))
        if start == 4 or end == 0 or start > end:
            return ("a window frame ends before it starts; write its bounds in order, from UNBOUNDED PRECEDING "
                    "through n PRECEDING, CURRENT ROW and n FOLLOWING to UNBOUNDED FOLLOWING, e.g. "
                    "ROWS BETWEEN 2 PRECEDING AND CURRENT ROW")
        offsets = [b for b in bounds if b is not None and not (isinstance(b, str) and b.upper() in ("UNBOUNDED", "CURRENT ROW"))]
        if kind == "ROWS":
            if not all(_count_literal(b, 0) for b in offsets):
                return "a ROWS frame's offsets are non-negative integer literals, e.g. ROWS BETWEEN 2 PRECEDING AND CURRENT ROW"
        elif kind == "RANGE":
            if offsets:
                return ("a RANGE frame with an offset is not supported over the released rows (an offset over a noisy "
                        "value could overflow); use ROWS BETWEEN n PRECEDING AND CURRENT ROW (one row per group)")
        else:
            return f"{kind or 'this'} window frame is not supported; use ROWS or RANGE"
    return None


def _position(bound: object, side: object) -> int:
    """A frame bound's place: 0 UNBOUNDED PRECEDING, 1 n PRECEDING, 2 CURRENT ROW (or no end), 3 n FOLLOWING,
    4 UNBOUNDED FOLLOWING."""
    if bound is None or (isinstance(bound, str) and bound.upper() == "CURRENT ROW"):
        return 2
    following = str(side or "").upper() == "FOLLOWING"
    if isinstance(bound, str) and bound.upper() == "UNBOUNDED":
        return 4 if following else 0
    return 3 if following else 1


def tie_broken(w: exp.Window, keys: list[str]) -> exp.Window:
    """``w`` with the GROUP BY key columns ``keys`` appended to its ORDER BY where its result depends on the
    order of peers (ROW_NUMBER, NTILE, LAG, LEAD, FIRST_VALUE, LAST_VALUE, a ROWS frame), so that it is a function
    of the released rows, not of their order in the engine. A FIRST_VALUE / LAST_VALUE with neither ORDER BY nor
    frame keeps its frame, the whole partition; with a RANGE frame, the keys order the peers inside the function,
    which keeps the peers (the frame) of SQL."""
    f = function(w)
    spec = w.args.get("spec")
    rows = spec is not None and str(spec.args.get("kind") or "").upper() == "ROWS"
    if not keys or isinstance(f, _PEERS) or not (isinstance(f, _ORDER_SENSITIVE) or rows):
        return w  # (a ranking function ignores a frame: its peers stay peers)
    w = w.copy()
    order = w.args.get("order")
    extra = [exp.Ordered(this=exp.column(k), nulls_first=False) for k in keys]
    if isinstance(f, (exp.FirstValue, exp.LastValue)) and (order is not None or spec is not None) and not rows:
        # a RANGE frame ends at a peer of the current row: the keys order the peers inside the function
        # (``LAST_VALUE(x ORDER BY o, k)``), so that every peer reads one value; appended to the window's ORDER BY
        # they would split the peers (each row its own LAST_VALUE)
        g = function(w)
        g.set("this", exp.Order(this=g.this, expressions=[*(o.copy() for o in (order.expressions if order else [])),
                                                          *extra]))
        return w
    if order is None and spec is None and isinstance(function(w), (exp.FirstValue, exp.LastValue)):
        w.set("spec", exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING", end="UNBOUNDED",
                                     end_side="FOLLOWING"))
    w.set("order", exp.Order(expressions=[*(order.expressions if order else []), *extra]))
    return w


def describe(plan: ir.QueryPlan) -> str | None:
    """The explain note of a query with windows or QUALIFY: what is evaluated over the released rows (over the
    released columns ``__k*``, ``__a*`` of the bounded SQL); None without windows."""
    parts = [f"{o.name} = {o.expr.sql(dialect='duckdb')}" for o in plan.outputs if o.expr.find(exp.Window)]
    parts += [f"ORDER BY {o.sql(dialect='duckdb')}" for o in plan.order if o.find(exp.Window)]
    if plan.qualify is not None:
        parts.append(f"QUALIFY {plan.qualify.sql(dialect='duckdb')}")
    if not parts:
        return None
    return ("window functions are evaluated over the released rows only (post-processing, no further cost; groups "
            "not released are absent from them; ties are broken by the GROUP BY keys): " + "; ".join(parts))
