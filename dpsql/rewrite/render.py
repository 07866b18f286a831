"""The single render step: every SQL string dpsql executes is produced here from a sqlglot AST.

Keeping one render step means the same bounded plans can later be rendered for another
engine (e.g. Spark) by changing the dialect, and it guarantees that no user text is ever
executed verbatim.
"""

from __future__ import annotations

from sqlglot import exp

ENGINE_DIALECT = "duckdb"


def render(ast: exp.Expression, *, dialect: str = ENGINE_DIALECT, pretty: bool = False) -> str:
    if not isinstance(ast, exp.Expression):  # pragma: no cover - programming error
        raise TypeError("render() takes a sqlglot expression")
    return ast.sql(dialect=dialect, pretty=pretty)
