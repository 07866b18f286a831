"""Allow-list checks on the parsed statement. Every violation is collected, none is fatal alone.

What is accepted (docs/sql.md): one SELECT over one registered table, aggregates COUNT(*),
COUNT(col), COUNT(DISTINCT col), SUM / AVG / VARIANCE / STDDEV (and their spellings in
``ANON_AGGS``) over a bounded value, a WHERE, GROUP BY columns or expressions (with or without
an aggregate; SELECT DISTINCT keys), and HAVING / ORDER BY / LIMIT over the released values. Every function call anywhere in the query
must be on the allow-list (``dpsql.plan.typer.ALLOW_LIST``, plus ``POST_ALLOW_LIST`` over
released values); everything else is refused before any data is read. The expressions evaluated
on private rows (WHERE, GROUP BY keys) are further typed by ``dpsql.plan.typer``.
"""

from __future__ import annotations

from sqlglot import ErrorLevel, exp

from dpsql.errors import Violation
from dpsql.plan import windows as windows_mod
from dpsql.plan.parse import (
    DIALECT,
    as_written,
    is_big,
    keyword_offset,
    line_col,
    line_text,
    position,
    quoted,
    tokens,
)
from dpsql.plan.quantiles import QUANTILE_AGGS
from dpsql.plan.typer import CALL_PARTS, ancestors, func_name, node_problem, row_fields

SUPPORTED_AGGS = (exp.Count, exp.Sum, exp.Avg, exp.Variance, exp.VariancePop, exp.Stddev, exp.StddevSamp, exp.StddevPop,
                  exp.CovarPop, exp.CovarSamp, exp.Corr, exp.RegrSlope, exp.RegrIntercept,
                  exp.RegrCount, exp.RegrAvgx, exp.RegrAvgy, exp.RegrSxx, exp.RegrSyy, exp.RegrSxy, exp.RegrR2,
                  *QUANTILE_AGGS)

#: aggregates sqlglot reads as plain function calls (other engines' spellings) -> the kind they are
ANON_AGGS = {"var": "var_samp", "varp": "var_pop", "std": "stddev_samp", "stdevp": "stddev_pop"}


#: DuckDB's aggregates that sqlglot reads as plain function calls and that are not answered: aggregates all the
#: same, so that the analysis refuses each as one (with its arguments inside it), not as a function over released
#: values whose columns stand outside an aggregate
OTHER_AGGS = frozenset({
    "arbitrary", "arg_max_null", "arg_max_nulls_last", "arg_min_null", "arg_min_nulls_last", "bitstring_agg",
    "count_star", "decimal_average", "entropy", "histogram", "histogram_exact", "kurtosis_pop", "lttb", "mad",
    "product", "reservoir_quantile", "sem", "sum_no_overflow",
    # BigQuery's older differential privacy aggregates: refused naming the aggregate answered here
    "anon_count", "anon_sum", "anon_avg", "anon_var_pop", "anon_stddev_pop", "anon_percentile_cont", "anon_quantiles",
})


#: the meta key marking a condition of an inner join's ON that is read as WHERE's (analyze._comma_joins)
FROM_ON = "dpsql_from_on"


def clause_of(node: exp.Expression | None) -> str:
    """The clause a WHERE condition was written in: "ON" for one moved there from an inner join's ON (its
    refusals name the ON, which the query has it in), else "WHERE"."""
    while node is not None and not isinstance(node, exp.Where):
        if node.meta.get(FROM_ON):
            return "ON"
        node = node.parent
    return "WHERE"


def is_aggregate(node: exp.Expression) -> bool:
    """An aggregate call: sqlglot's aggregates and the spellings of ``ANON_AGGS`` and ``OTHER_AGGS``."""
    return isinstance(node, exp.AggFunc) or (isinstance(node, exp.Anonymous)
                                             and str(node.this).lower() in ANON_AGGS.keys() | OTHER_AGGS)

def distinct_operand(e: exp.Expression) -> exp.Expression:
    """An operand of ``COUNT(DISTINCT ...)`` without its parentheses (``(col)`` is ``col``)."""
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def distinct_row(e: exp.Expression) -> bool:
    """A row of several values as the operand of ``COUNT(DISTINCT ...)``: ``(a, b)``, ``ROW(a, b)`` (its fields
    are checked by the typer, ``type_distinct``), a struct."""
    return row_fields(e) is not None or isinstance(distinct_operand(e), exp.Struct)


def _counts_distinct_expression(node: exp.Expression) -> bool:
    """``COUNT(DISTINCT a, b)`` and ``COUNT(DISTINCT (a, b))``: refused as a whole by the analysis (one message,
    with the fix), so their arguments are not checked on their own."""
    arg = node.this if isinstance(node, exp.Count) else None
    return isinstance(arg, exp.Distinct) and (len(arg.expressions) != 1 or distinct_row(arg.expressions[0]))


def never_null_literal(e: exp.Expression) -> bool:
    """A literal number, string or boolean (optionally negated): never NULL on any row, so that
    ``COUNT(1)`` and ``COUNT('x')`` are ``COUNT(*)``."""
    while isinstance(e, (exp.Neg, exp.Paren)):
        e = e.this
    return isinstance(e, (exp.Literal, exp.Boolean))


#: clauses evaluated by dpsql over released values only (post-processing)
POST_CLAUSES = ("SELECT", "HAVING", "ORDER BY", "QUALIFY")

__all__ = ["ANON_AGGS", "LIMIT_ZERO", "OFFSET_SCALAR", "POST_CLAUSES", "SUPPORTED_AGGS", "check_expression_functions", "check_statement_shape", "foreign_clauses", "distinct_operand",
           "func_name",
           "is_aggregate", "never_null_literal", "violation", "written_name"]


#: the refusal of a LIMIT / OFFSET that is no row count (after the clause's name)
LIMIT_FORM = ("must be a non-negative integer literal: a number of rows (a percentage of the released rows, LIMIT 10% "
              "or LIMIT 10 PERCENT, and WITH TIES have no form here)")

#: the refusal of LIMIT 0 (FETCH FIRST 0 ROWS): no row is released, so the charge would buy nothing
LIMIT_ZERO = ("LIMIT 0 releases no row, yet the query would be charged: to see the output columns and the cost for free, "
              "explain the query without LIMIT 0 (dpsql explain, Session.explain)")

#: the refusal of an OFFSET of 1 or more on a query without GROUP BY keys: its release is one row, which the OFFSET
#: skips whatever the data, as LIMIT 0 does
OFFSET_SCALAR = ("OFFSET {n} skips the one row that an aggregate query without GROUP BY releases, so it would be "
                 "charged for nothing; nothing was charged (hint: drop the OFFSET, or GROUP BY a column to release "
                 "several rows)")


def violation(
    node: exp.Expression,
    sql: str,
    message: str,
    *,
    offset: int | None = None,
    at: tuple[int, int] | None = None,
    rendered: str | None = None,
    written: str | None = None,
) -> Violation:
    """A violation at ``node`` (or at character ``offset`` of ``sql`` when given). A caller that has
    computed them already passes ``at`` (``position(node, sql)``), ``rendered``
    (``node.sql(dialect=DIALECT)``, never for a node that ``is_big``) and ``written``
    (``written_name(node, sql)``): each renders or walks the node's tree again otherwise. A node of a merged
    view is quoted and placed as the query wrote it (``parse.as_written``)."""
    shown = as_written(node)
    if shown is not node:
        node, at, rendered, written = shown, None, None, None
    big = is_big(node)
    if rendered is None and not big:  # (a fragment: a construct DuckDB's dialect lacks is refused, not warned of)
        rendered = node.sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE)
    if offset is not None:
        line, col = line_col(sql, offset)
    else:
        line, col = at if at is not None else position(node, sql, rendered)
    if big:  # quoted from the query's text: rendering a huge expression costs seconds
        start = sum(len(x) + 1 for x in sql.split("\n")[: line - 1]) + col - 1 if line else 0
        frag = " ".join(sql[start:start + 200].split())
        return Violation(message, line, col, frag[:77] + "..." if len(frag) > 80 else frag)
    assert rendered is not None
    frag = rendered
    if written is None:
        written = written_name(node, sql, at=(line, col) if offset is None else None, rendered=rendered)
    if written:  # a function spelled another way in the query (RAND for RANDOM): quote it as written
        frag = _written_call(sql, line, col) or written + frag[len(frag.split("(", 1)[0]):]
    if len(frag) > 80:
        frag = frag[:77] + "..."
    return Violation(message, line, col, frag)


def _written_call(sql: str, line: int, col: int) -> str:
    """The call that starts at (line, col), ``name(...)`` to its closing parenthesis, as the query writes it
    (whitespace runs made one space); '' if none starts there. A function sqlglot renders as another form with
    other arguments (to_char(d, 'YYYY') as a cast that drops the format) is quoted so, not as its rendering."""
    if not line:
        return ""
    start = sum(len(x) + 1 for x in sql.split("\n")[: line - 1]) + col - 1
    toks = [t for t in tokens(sql) if t.start >= start]
    if len(toks) < 2 or toks[0].start != start or toks[1].token_type.name != "L_PAREN":
        return ""
    depth = 0
    for t in toks[1:]:
        depth += {"L_PAREN": 1, "R_PAREN": -1}.get(t.token_type.name, 0)
        if depth == 0:
            return " ".join(sql[start:t.end + 1].split())
    return ""


def output_name(it: exp.Expression, sql: str, used: set[str], suffix: dict[str, int], written_aliases: set[str]) -> str:
    """The name of output ``it`` of a SELECT: its alias; a column's name; else the expression as the query writes its
    call (``var_samp(x)``, not sqlglot's ``VARIANCE(x)``). A name already ``used`` (lower case; the names taken only
    grow) is numbered (``a``, ``a_1``), never onto an alias the query writes (``written_aliases``); ``suffix`` keeps the
    next number to try for each name. Adds the name to ``used``."""
    inner = it.unalias()
    if isinstance(it, exp.Alias):
        name = it.alias
    elif isinstance(inner, exp.Column):
        name = inner.name
    else:
        name = inner.sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE)  # (refused when rendered to run)
        written = written_name(inner, sql, rendered=name)
        if written and written.lower() != name.split("(", 1)[0].lower():
            name = written + name[len(name.split("(", 1)[0]):]
    base, n = name, suffix.get(name.lower(), 1)
    while name.lower() in used or (name != base and name.lower() in written_aliases):
        name = f"{base}_{n}"
        n += 1
    suffix[base.lower()] = n
    used.add(name.lower())
    return name


def written_name(
    node: exp.Expression, sql: str, *, at: tuple[int, int] | None = None, rendered: str | None = None
) -> str:
    """The name of function ``node`` as the query spells it, when it differs from sqlglot's
    spelling (``RAND()`` is read as ``RANDOM()``); '' otherwise. ``at`` and ``rendered``: the
    node's ``position`` and ``node.sql(dialect=DIALECT)`` when the caller has them already."""
    shown = as_written(node)
    if shown is not node:
        node, at, rendered = shown, None, None
    if not isinstance(node, exp.Func):
        return ""
    line, col = at if at is not None else position(node, sql, rendered)
    if not line:
        return ""
    rest = line_text(sql, line)[col - 1:]
    name = rest.split("(", 1)[0].strip()
    if rendered is None:
        rendered = node.sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE)
    rendered = rendered.split("(", 1)[0]
    # a call rendered as another form (date_add(d, 3) is d + INTERVAL 3 DAY) is quoted as rendered, not spliced
    if "(" in rest and name and name.replace("_", "").isalnum() and name != rendered and rendered.replace("_", "").isalnum():
        first = node.this if isinstance(node.this, exp.Expression) else None
        if first is not None and position(first, sql) == (line, col):
            # written where its first operand is (COUNT(*)::DOUBLE, COUNT(*) ^ 2): the call there is the operand's
            return ""
        if isinstance(node, exp.Log) and name.lower() in ("log2", "log10"):
            return ""  # rendered LOG(2, x): its arguments are not log2's (spliced, 'log2(2, x)')
        return name
    return ""


_WINDOW_OVER_AGGREGATES = ("windows over aggregates are answered in the SELECT list, ORDER BY or QUALIFY of the "
                           "aggregate query itself, over its released rows; "
                           "compute a rank, a share of the total or a running total from the released rows "
                           "(ORDER BY the aggregate DESC LIMIT n keeps the largest groups)")


def _subquery_fix(sub: exp.Expression) -> str:
    """How to write a subquery's condition without it: a JOIN for EXISTS and IN over a table, the values for IN, a
    literal for a scalar subquery."""
    if isinstance(sub, exp.Exists) and isinstance(sub.parent, exp.Not):
        return ("; NOT EXISTS (the rows another table holds no match for) has no answered form: a JOIN keeps the "
                "matched rows only, never the others")
    if isinstance(sub, exp.Exists):
        return ("; JOIN the subquery's table ON the key instead (FROM a JOIN b ON a.k = b.k), with the subquery's "
                "conditions in WHERE: the join keeps a row of a once per matching row of b, so its COUNT(*) and sums "
                "count each row of a as often as b matches it, where EXISTS counts it once")
    body = sub.this if isinstance(sub, exp.Subquery) else sub
    if (isinstance(sub.parent, exp.In) and sub.parent.args.get("query") is sub and isinstance(body, exp.Select)
            and (body.args.get("group") is not None or body.args.get("having") is not None)):
        return ("; its rows are chosen by a total over grouped rows (GROUP BY ... HAVING), which no list of values or "
                "join writes: a release can count or sum the rows of each group (GROUP BY in the query itself), or "
                "filter the groups it releases with HAVING, not select other rows by them")
    if isinstance(sub.parent, exp.In) and sub.parent.args.get("query") is sub:
        return ("; list the values (x IN ('a', 'b')), or JOIN the subquery's table ON the column "
                "(FROM a JOIN b ON a.x = b.y)")
    return "; run the subquery as a query of its own and write its released value into this one as a literal"


def check_expression_functions(node: exp.Expression, sql: str, where: str, *, windows: bool = False) -> list[Violation]:
    """Every function and operator in ``node`` must be on the allow-list; subqueries, query
    parameters and window functions are refused with their own messages. ``windows``: a window in the
    SELECT list, ORDER BY or QUALIFY is answered over the released rows (``dpsql.plan.windows``): its
    function and frame are checked there, its inputs here as post-processing.

    WHERE and GROUP BY (evaluated on private rows) use the typer's ``ALLOW_LIST``; the SELECT
    list, HAVING and ORDER BY (post-processing over released values) use ``ALLOW_LIST`` plus
    ``POST_ALLOW_LIST`` (``dpsql.plan.typer``; docs/expressions.md). There is no deny-list:
    a function DuckDB adds in a new release is refused until it is listed. Aggregate calls are
    left to the analysis, which accepts COUNT, SUM and AVG only and names any other.
    """
    out: list[Violation] = []
    # (node, its clause's label, post-processing?): an aggregate's argument in a post-processing
    # clause is read on private rows, so it is checked against ALLOW_LIST under the aggregate's
    # name, as the analysis checks it (one message, not one per list)
    stack: list[tuple[exp.Expression, str, bool]] = [(node, where, where in POST_CLAUSES)]
    refused: set[int] = set()  #: the nodes reported: a part of one (its INTERVAL, slice, JSON path) is not reported again
    while stack:  # depth first, left to right in the SQL text
        sub, where, post = stack.pop()
        if isinstance(sub, CALL_PARTS) and any(id(a) in refused for a in ancestors(sub)):
            continue
        if isinstance(sub, (exp.Subquery, exp.Exists)) or (
            isinstance(sub, exp.Select) and sub is not node and not isinstance(sub.parent, (exp.Subquery, exp.Exists))
        ):
            out.append(violation(sub, sql, f"subqueries are not supported in {where}{_subquery_fix(sub)}"))
            continue
        if isinstance(sub, (exp.Placeholder, exp.Parameter)):
            out.append(violation(sub, sql, f"query parameters ($1, ?) are not supported in {where}; write the value into the SQL"))
            continue
        if isinstance(sub, exp.In) and isinstance(sub.this, exp.Tuple):  # one message, not one per tuple
            out.append(violation(sub, sql, f"{where}: row values ((a, b) IN ((x, y), ...)) are not supported; compare "
                                           "each column: (a = x AND b = y) OR (a = ... AND b = ...)"))
            continue
        if isinstance(sub, (exp.Any, exp.All)):  # x LIKE ANY ([...]): one message, not also one for the list
            arr = sub.this.this if isinstance(sub.this, exp.Paren) else sub.this
            items = arr.expressions if isinstance(arr, (exp.Array, exp.Tuple)) else None
            like = sub.parent if isinstance(sub.parent, (exp.Like, exp.ILike)) and sub.parent.expression is sub else None
            if like is not None and items and len(items) <= 16:
                # DuckDB has no LIKE ANY / ALL: the OR (AND) of each test, as the query writes the operand and patterns
                # (NOT applies to each test: NOT LIKE ALL is true where no pattern matches)
                op = ("NOT " if like.args.get("negate") else "") + ("ILIKE" if isinstance(like, exp.ILike) else "LIKE")
                joiner = " OR " if isinstance(sub, exp.Any) else " AND "
                fix = "DuckDB has no " + op + (" ANY" if isinstance(sub, exp.Any) else " ALL") + "; write " + joiner.join(
                    f"{quoted(like.this)} {op} {quoted(i)}" for i in items)
            elif (isinstance(sub, exp.Any) and isinstance(sub.parent, exp.EQ) and sub.parent.expression is sub
                    and isinstance(arr, exp.Array) and items and len(items) <= 10 and all(never_null_literal(i) for i in items)):
                fix = f"write {quoted(sub.parent.this)} IN ({', '.join(quoted(i) for i in items)})"
            else:
                fix = "write each test, joined with OR for ANY, AND for ALL (x LIKE 'a%' OR x LIKE 'b%')"
            out.append(violation(sub, sql, f"{where}: ANY / ALL over a list are not supported; {fix}"))
            continue
        if isinstance(sub, exp.Window) and windows:
            if post and where != "HAVING":
                f = windows_mod.function(sub)
                spelled = written_name(f, sql) if isinstance(f, exp.Func) else ""  # string_agg, not GROUP_CONCAT
                msg = windows_mod.problem(sub, spelled)
                if msg is None:
                    stack.extend((c, where, post) for c in reversed(windows_mod.inputs(sub)))
                else:
                    out.append(violation(sub, sql, f"{where}: {msg}", written=spelled or None))
            elif where == "HAVING":
                out.append(violation(sub, sql, "window functions are not allowed in HAVING (SQL evaluates windows after "
                                               "HAVING); filter on a window with QUALIFY"))
            else:
                label = "GROUP BY (or a SELECT DISTINCT, whose outputs are its keys)" if where == "GROUP BY" else where
                out.append(violation(sub, sql, f"a window function in {label} would run over raw rows: "
                                               f"{windows_mod.OVER_RELEASED}; use it in the SELECT list, ORDER BY or "
                                               "QUALIFY of an aggregate query"))
            continue
        if isinstance(sub, exp.Window):
            over_aggregates = any(is_aggregate(n) for n in sub.walk() if n is not sub.this)
            out.append(violation(sub, sql, f"window functions are not supported: {_WINDOW_OVER_AGGREGATES}" if over_aggregates
                                 else "window functions are not supported: they release per-row values"))
            continue
        if isinstance(sub, (exp.WithinGroup, *QUANTILE_AGGS)) and post:
            continue  # a quantile: its column and fraction are checked by the analysis (plan.quantiles)
        if isinstance(sub, exp.Filter):
            continue  # an aggregate's FILTER clause: refused by the analysis, with the fix (move it into WHERE)
        if is_aggregate(sub):
            if not post:
                continue  # an aggregate over private rows in WHERE / GROUP BY: refused by the analysis
            if _counts_distinct_expression(sub):
                continue
            if isinstance(sub, SUPPORTED_AGGS) or isinstance(sub, exp.Anonymous):  # another: named by the analysis
                # rendered once, for its position and its spelling (each rendering copies the call's tree)
                rendered = None if is_big(sub) else sub.sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE)
                name = (written_name(sub, sql, rendered=rendered)
                        or (str(sub.this) if isinstance(sub, exp.Anonymous) else sub.sql_name())).upper()
                args = [a for c in sub.iter_expressions() if not isinstance(c, exp.Star)
                        for a in (c.expressions if isinstance(c, exp.Distinct) else [c])]
                stack.extend((a, name, False) for a in reversed(args))
            continue
        else:
            # ANY_VALUE(x) is IGNORE NULLS around the aggregate: the aggregate is reported (by its name) by the analysis
            wrapper = isinstance(sub, (exp.IgnoreNulls, exp.RespectNulls)) and is_aggregate(sub.this)
            msg = None if wrapper else node_problem(sub, post=post)
            rand = isinstance(sub, exp.Rand)
            if msg is None and not rand and isinstance(sub, exp.Func) and not isinstance(sub, exp.Anonymous):
                missing = [k for k, required in sub.arg_types.items() if required and sub.args.get(k) is None]
                if missing:
                    msg = f"function {func_name(sub)}() is missing its argument(s); see docs/expressions.md for its signature"
            if msg is not None or rand:
                # the node's rendering, position and spelling, once for the message and its fragment
                rendered = None if is_big(sub) else sub.sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE)
                at = position(sub, sql, rendered)
                written = written_name(sub, sql, at=at, rendered=rendered)
                if rand:
                    name = written or "RANDOM"
                    msg = (f"function {name}() is not on the allow-list: dpsql's results are reproducible functions of the "
                           f"released values (and a random draw over private rows is not one); remove {name}() (see docs/expressions.md)")
                elif written:  # name the function as the query spells it (date_diff, not sqlglot's datediff)
                    assert msg is not None
                    msg = msg.replace(f"function {func_name(sub) or type(sub).__name__.lower()}()", f"function {written}()", 1)
                out.append(violation(sub, sql, f"{where}: {msg}", at=at, rendered=rendered, written=written))
                refused.add(id(sub))
        stack.extend((c, where, post) for c in reversed(list(sub.iter_expressions())))
    return out


def _after_select_keyword(sql: str, after: int) -> int | None:
    """Offset of the token right after the first top-level SELECT (where DISTINCT sits)."""
    sel = keyword_offset(sql, {"SELECT"}, after=after)
    if sel is None:
        return None
    for t in tokens(sql):
        if t.start > sel:
            return t.start
    return None


#: the keyword that opens each clause refused on a SELECT (for error positions)
_CLAUSE_WORDS = {
    "laterals": {"LATERAL"},
    "windows": {"WINDOW"},
    "qualify": {"QUALIFY"},
    "into": {"INTO"},
    "locks": {"FOR"},
    "sample": {"USING", "TABLESAMPLE"},
    "pivots": {"PIVOT", "UNPIVOT"},
    "connect": {"CONNECT", "START"},
    "prewhere": {"PREWHERE"},
    "cluster": {"CLUSTER"},
    "distribute": {"DISTRIBUTE"},
    "sort": {"SORT"},
}


def foreign_clauses(stmt: exp.Expression) -> list[tuple[str, exp.Expression]]:
    """The clauses of other dialects in ``stmt`` (each SELECT of it) that sqlglot reads but DuckDB's dialect has not, with
    the node holding each: read without them, the query would be answered as another (``LIMIT 1 BY k`` as ``LIMIT 1``,
    ``GROUP BY k WITH TOTALS`` without its totals row, ``SELECT AS STRUCT`` as a plain SELECT)."""
    out: list[tuple[str, exp.Expression]] = []
    for node in stmt.walk():
        if isinstance(node, exp.Select) and node.args.get("kind"):
            out.append((f"SELECT AS {str(node.args['kind']).upper()} (one value per row, BigQuery's)", node))
        elif isinstance(node, exp.Group) and node.args.get("totals"):
            out.append(("GROUP BY ... WITH TOTALS (a totals row, ClickHouse's)", node))
        elif isinstance(node, exp.Limit) and node.args.get("expressions"):
            out.append(("LIMIT n BY ... (the first rows of each group, ClickHouse's)", node))
    return out


def check_statement_shape(stmt: exp.Expression, sql: str, *, start: int = 0, windows: bool = False) -> list[Violation]:
    """Structural checks that do not need the catalog. ``start``: offset of the statement; ``windows``: QUALIFY is
    answered (over the released rows, ``dpsql.plan.windows``)."""
    v: list[Violation] = []
    if isinstance(stmt, (exp.Union, exp.Intersect, exp.Except)):
        return [
            violation(
                stmt,
                sql,
                "set operations (UNION/INTERSECT/EXCEPT) are not supported; send one SELECT (aggregates of one "
                "table under several conditions are one SELECT: COUNT(*) FILTER (WHERE ...) for each, or GROUP BY the "
                "column that tells them apart)",
                offset=keyword_offset(sql, {"UNION", "INTERSECT", "EXCEPT"}, after=start),
            )
        ]
    if not isinstance(stmt, exp.Select):
        kind = type(stmt).__name__.upper()
        if kind in ("COMMAND", "COLUMN"):  # sqlglot's fallback for statements it does not model
            first = next((t.text.upper() for t in tokens(sql) if t.start >= start), "")
            kind = first or kind
        fix = (": to see how dpsql would answer a query, and its cost, for free, use Session.explain(sql, epsilon=...) "
               "or `dpsql explain SQL --epsilon ...`" if kind in ("EXPLAIN", "DESCRIBE", "SUMMARIZE", "SHOW") else "")
        return [
            violation(
                stmt,
                sql,
                f"only a single SELECT statement is supported; {kind} statements (DDL, DML, PRAGMA, ATTACH, COPY, INSTALL, SET ...) "
                f"are refused{fix}",
                offset=start,
            )
        ]
    for item in stmt.expressions:
        if isinstance(item, exp.Alias) and not item.alias:  # DuckDB's parser refuses it (late: in the typer)
            v.append(violation(item, sql, 'an output column needs a non-empty name: AS "" names none; give it an '
                                          f'alias, e.g. {item.this.sql(dialect="duckdb")} AS n'))
    distinct = stmt.args.get("distinct")
    if distinct:
        # (SELECT DISTINCT k without an aggregate or GROUP BY is answered, as GROUP BY k, before this check)
        on = distinct.args.get("on") if isinstance(distinct, exp.Distinct) else None
        if on is not None:
            keys = ", ".join(e.sql(dialect="duckdb") for e in (on.expressions if isinstance(on, exp.Tuple) else [on]))
            what = (f"SELECT DISTINCT ON is not supported: it keeps one raw row per key; write SELECT DISTINCT {keys} "
                    f"(the keys), or GROUP BY {keys} with an aggregate")
        else:
            what = ("SELECT DISTINCT with an aggregate or GROUP BY is not supported; drop DISTINCT (the rows of a GROUP "
                    "BY are distinct keys already; SELECT DISTINCT k without an aggregate lists the keys)")
        v.append(violation(stmt, sql, what, offset=_after_select_keyword(sql, start)))
    for what, node in foreign_clauses(stmt):
        v.append(violation(node, sql, f"{what} is not supported", offset=start if node is stmt else None))
    for key in ("joins", "laterals", "windows", "qualify", "into", "locks", "sample", "pivots", "connect", "prewhere",
                "cluster", "distribute", "sort"):
        val = stmt.args.get(key)
        if val and not (key == "qualify" and windows):
            if key == "joins":
                for j in val:
                    v.append(
                        violation(
                            j,
                            sql,
                            "JOINs are not supported yet: a join can multiply one person's contribution (join support via DP-S4S is planned; foreign keys in the catalog are already recorded)",
                        )
                    )
            elif key == "qualify":
                v.append(
                    violation(
                        val, sql, "QUALIFY (window filtering) is answered in a SELECT of its own only; "
                                  "keep the first released rows with ORDER BY ... LIMIT n instead (ORDER BY n DESC "
                                  "LIMIT 3 for the 3 largest counts)",
                        offset=keyword_offset(sql, {"QUALIFY"}, after=start),
                    )
                )
            else:
                off = keyword_offset(sql, _CLAUSE_WORDS.get(key, set()), after=start)
                label = {"laterals": "LATERAL", "windows": "WINDOW", "locks": "FOR UPDATE/SHARE", "connect": "CONNECT BY",
                         "cluster": "CLUSTER BY", "distribute": "DISTRIBUTE BY", "sort": "SORT BY"}.get(key, key.upper())
                fix = " (ORDER BY sorts the released rows)" if key in ("cluster", "distribute", "sort") else ""
                v.append(violation(stmt, sql, f"{label} clauses are not supported{fix}", offset=off))
    return v


#: the largest LIMIT / OFFSET the engine takes (a BIGINT)
ROW_COUNT_MAX = 2**63 - 1


def row_count(node: exp.Expression) -> int | None:
    """The row count of a LIMIT / OFFSET / FETCH FIRST clause: a non-negative integer literal, else None
    (refused by the caller): ``LIMIT 10%`` / ``PERCENT`` (a share of the rows) and ``WITH TIES`` are no count.
    A count beyond the engine's 64-bit row counts is read as the largest one (it keeps, or skips, every row
    the same), so the clause is never refused later as if a released value had failed it."""
    opts = node.args.get("limit_options")
    if opts is not None and (opts.args.get("percent") or opts.args.get("with_ties")):
        return None
    val = node.args.get("count") if isinstance(node, exp.Fetch) else node.args.get("expression") or node.this
    if isinstance(val, exp.Literal) and not val.is_string and str(val.this).isdigit():
        return min(int(val.this), ROW_COUNT_MAX)
    return None
