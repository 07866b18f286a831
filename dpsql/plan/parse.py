"""Parsing user SQL with sqlglot (DuckDB dialect), with positions for error messages."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dpsql.errors import SQLSyntaxError

DIALECT = "duckdb"


def line_col(sql: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of a character offset."""
    offset = max(0, min(offset, len(sql)))
    line = sql.count("\n", 0, offset) + 1
    col = offset - (sql.rfind("\n", 0, offset) + 1) + 1
    return line, col


def position(node: exp.Expression, sql: str) -> tuple[int, int]:
    """Best-effort position of a node: the first token under it that carries an offset."""
    best: int | None = None
    for sub in node.walk():
        meta = getattr(sub, "_meta", None) or {}
        start = meta.get("start") if isinstance(meta, dict) else None
        if start is not None and (best is None or start < best):
            best = start
    if best is None:
        frag = node.sql(dialect=DIALECT)
        idx = sql.lower().find(frag.lower()) if frag else -1
        if idx < 0:
            head = frag.split("(")[0].strip()
            idx = sql.lower().find(head.lower()) if head else -1
        if idx < 0:
            return 0, 0
        best = idx
        # a function's name comes before its first argument's token
    return line_col(sql, best)


def parse_statements(sql: str) -> list[exp.Expression]:
    if not isinstance(sql, str):
        raise SQLSyntaxError(f"the query must be a SQL string, got {type(sql).__name__}")
    if not sql.strip():
        raise SQLSyntaxError("the query is empty", hint="pass one SELECT statement")
    try:
        stmts = sqlglot.parse(sql, read=DIALECT)
    except sqlglot.errors.ParseError as e:
        err = e.errors[0] if e.errors else {}
        line = int(err.get("line") or 0)
        col = int(err.get("col") or 0)
        frag = str(err.get("highlight") or "")
        desc = str(err.get("description") or "syntax error")
        raise SQLSyntaxError(
            f"SQL syntax error at line {line}, col {col} near {frag!r}: {desc}",
            line=line,
            col=col,
            fragment=frag,
            hint="check the SQL near the highlighted fragment",
        ) from None
    except sqlglot.errors.TokenError as e:
        raise SQLSyntaxError(f"SQL syntax error: {e}", hint="check quotes and brackets") from None
    return [s for s in stmts if s is not None]
