"""Allowlist checks on the parsed statement. Every violation is collected, none is fatal alone.

What is accepted: one SELECT over one registered table, aggregates COUNT(*), COUNT(col),
COUNT(DISTINCT privacy_unit), SUM(col), AVG(col), a deterministic WHERE, GROUP BY columns or
expressions, and HAVING / ORDER BY / LIMIT over the released values. Everything else is
refused before any data is read. The expressions evaluated on private rows (WHERE, GROUP BY keys)
are further typed and checked against the function allow-list by ``dpsql.plan.typer``.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import Violation
from dpsql.plan.parse import DIALECT, keyword_offset, line_col, position, tokens

# functions that are nondeterministic, read files or the environment, or inspect the database
_DENY_FUNCS = {
    "random", "rand", "setseed", "uuid", "gen_random_uuid", "uuidv4", "uuidv7", "nextval", "currval",
    "getenv", "current_setting", "read_text", "read_blob", "read_csv", "read_csv_auto", "read_json",
    "read_json_auto", "read_json_objects", "read_parquet", "parquet_scan", "parquet_metadata",
    "parquet_schema", "glob", "query", "query_table", "sniff_csv", "read_ndjson", "read_xlsx",
    "sql_auto_complete", "which_secret", "load", "install", "pragma", "checkpoint",
    # error() raises on purpose: a data-dependent error would release a bit outside the noise
    "error",
    # session state outside the query
    "getvariable",
}
_DENY_PREFIXES = ("duckdb_", "pragma_", "read_", "pg_", "sqlite_", "postgres_", "mysql_", "iceberg_", "delta_")
_NONDETERMINISTIC_TYPES: tuple[type[exp.Expression], ...] = (exp.Rand,)
for _name in ("Uuid", "ReadCSV", "ReadParquet"):
    if hasattr(exp, _name):
        _NONDETERMINISTIC_TYPES = _NONDETERMINISTIC_TYPES + (getattr(exp, _name),)

SUPPORTED_AGGS = (exp.Count, exp.Sum, exp.Avg)


def func_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        try:
            return node.sql_name().lower()
        except Exception:  # pragma: no cover - defensive
            return type(node).__name__.lower()
    return ""


def violation(node: exp.Expression, sql: str, message: str, *, offset: int | None = None) -> Violation:
    """A violation at ``node`` (or at character ``offset`` of ``sql`` when given)."""
    line, col = line_col(sql, offset) if offset is not None else position(node, sql)
    frag = node.sql(dialect=DIALECT)
    if len(frag) > 80:
        frag = frag[:77] + "..."
    return Violation(message, line, col, frag)


def check_expression_functions(node: exp.Expression, sql: str, where: str) -> list[Violation]:
    """Refuse nondeterministic, file-reading and catalog functions anywhere in an expression."""
    out: list[Violation] = []
    for sub in node.walk():
        if isinstance(sub, _NONDETERMINISTIC_TYPES):
            out.append(violation(sub, sql, f"{where} uses a function that is not allowed (nondeterministic or reads files)"))
            continue
        if isinstance(sub, exp.Func):
            name = func_name(sub)
            if name in _DENY_FUNCS or name.startswith(_DENY_PREFIXES):
                out.append(
                    violation(sub, sql, f"{where} uses function {name}(), which is not allowed (nondeterministic, reads files, or inspects the database)")
                )
        if isinstance(sub, (exp.Subquery, exp.Exists)) or (
            isinstance(sub, exp.Select) and sub is not node and not isinstance(sub.parent, (exp.Subquery, exp.Exists))
        ):
            out.append(violation(sub, sql, f"subqueries are not supported in {where}"))
        if isinstance(sub, (exp.Placeholder, exp.Parameter)):
            out.append(violation(sub, sql, f"query parameters ($1, ?) are not supported in {where}; write the value into the SQL"))
        if isinstance(sub, exp.Window):
            out.append(violation(sub, sql, "window functions are not supported: they release per-row values"))
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
}


def check_statement_shape(stmt: exp.Expression, sql: str, *, start: int = 0) -> list[Violation]:
    """Structural checks that do not need the catalog. ``start``: offset of the statement."""
    v: list[Violation] = []
    if isinstance(stmt, (exp.Union, exp.Intersect, exp.Except)):
        return [
            violation(
                stmt,
                sql,
                "set operations (UNION/INTERSECT/EXCEPT) are not supported; send one SELECT",
                offset=keyword_offset(sql, {"UNION", "INTERSECT", "EXCEPT"}, after=start),
            )
        ]
    if not isinstance(stmt, exp.Select):
        kind = type(stmt).__name__.upper()
        if kind in ("COMMAND", "COLUMN"):  # sqlglot's fallback for statements it does not model
            first = next((t.text.upper() for t in tokens(sql) if t.start >= start), "")
            kind = first or kind
        return [
            violation(
                stmt,
                sql,
                f"only a single SELECT statement is supported; {kind} statements (DDL, DML, PRAGMA, ATTACH, COPY, INSTALL, SET ...) are refused",
                offset=start,
            )
        ]
    if stmt.args.get("with") or stmt.args.get("with_"):
        v.append(
            violation(
                stmt, sql, "WITH (common table expressions) is not supported",
                offset=keyword_offset(sql, {"WITH"}, after=start),
            )
        )
    if stmt.args.get("distinct"):
        v.append(
            violation(
                stmt,
                sql,
                "SELECT DISTINCT releases raw values and is not supported; use GROUP BY with an aggregate",
                offset=_after_select_keyword(sql, start),
            )
        )
    for key in ("joins", "laterals", "windows", "qualify", "into", "locks", "sample", "pivots", "connect", "prewhere"):
        val = stmt.args.get(key)
        if val:
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
                        val, sql, "QUALIFY (window filtering) is not supported",
                        offset=keyword_offset(sql, {"QUALIFY"}, after=start),
                    )
                )
            else:
                off = keyword_offset(sql, _CLAUSE_WORDS.get(key, set()), after=start)
                label = {"laterals": "LATERAL", "windows": "WINDOW", "locks": "FOR UPDATE/SHARE", "connect": "CONNECT BY"}.get(key, key.upper())
                v.append(violation(stmt, sql, f"{label} clauses are not supported", offset=off))
    return v
