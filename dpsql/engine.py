"""The only place SQL meets DuckDB.

Executes SQL rendered by ``rewrite.render`` from dpsql's own ASTs, returns Arrow, and wraps
every DuckDB failure in ``ExecutionError`` whose message carries no cell values (DuckDB
messages can quote data; they are kept on ``debug_detail`` for ``--debug``).
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb
import pyarrow as pa
from sqlglot import exp

from dpsql.errors import ConfigError, ExecutionError, QueryTypeError
from dpsql.rewrite.bound import source_name
from dpsql.rewrite.render import render


class Engine:
    def __init__(self, connection: duckdb.DuckDBPyConnection | None = None) -> None:
        self._owned = connection is None
        self._con = connection if connection is not None else duckdb.connect(":memory:")
        self._lock = threading.RLock()
        self._views: set[tuple[str, str]] = set()
        try:
            self._con.execute("SET enable_progress_bar = false")
        except duckdb.Error:  # pragma: no cover - older settings name
            pass

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self._con

    def close(self) -> None:
        for view, kind in list(self._views):
            self.unregister_source("", kind, view)
        if self._owned:
            self._con.close()

    # -- sources --------------------------------------------------------------------------
    def register_source(self, name: str, kind: str, source: Any, view: str | None = None) -> dict[str, str]:
        """Expose a source as a private TEMP view (``view``, default ``_dpsql_src_<name>``).

        TEMP views live only in this connection's session: nothing is left in a caller's
        database file, and each Session uses its own view names. Returns the schema.
        """
        view = view or source_name(name)
        self._views.add((view, kind))
        with self._lock:
            try:
                if kind == "arrow":
                    self._con.register(view, source)
                else:
                    if kind == "parquet":
                        rel: exp.Expression = exp.func("read_parquet", exp.Literal.string(source))
                    elif kind == "csv":
                        rel = exp.func("read_csv", exp.Literal.string(source))
                    elif kind == "duckdb":
                        rel = exp.to_table(source)
                    else:  # pragma: no cover
                        raise ConfigError(f"unknown source kind {kind!r}")
                    sel = exp.select("*").from_(rel if isinstance(rel, exp.Table) else exp.Table(this=rel))
                    ddl = exp.Create(
                        this=exp.to_table(view, quoted=True),
                        kind="VIEW",
                        expression=sel,
                        replace=True,
                        properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
                    )
                    self._con.execute(render(ddl))
                desc = exp.Describe(this=exp.select("*").from_(exp.to_table(view, quoted=True)))
                rows = self._con.execute(render(desc)).fetchall()
            except duckdb.Error as e:
                raise ConfigError(
                    f"cannot read table source for '{name}' ({kind}): {type(e).__name__}",
                    hint="check that the file exists, is readable and is valid "
                    + ("Parquet" if kind == "parquet" else "CSV" if kind == "csv" else "data")
                    + (" (for a DuckDB table: that the Session's connection has it)" if kind == "duckdb" else ""),
                ) from None
        schema = {str(r[0]).lower(): str(r[1]) for r in rows}
        if len(schema) != len(rows):
            raise ConfigError(f"table '{name}' has column names that differ only by case; dpsql needs them distinct")
        return schema

    def unregister_source(self, name: str, kind: str, view: str | None = None) -> None:
        view = view or source_name(name)
        self._views.discard((view, kind))
        with self._lock:
            try:
                if kind == "arrow":
                    self._con.unregister(view)
                else:
                    self._con.execute(render(exp.Drop(this=exp.to_table(view, quoted=True), kind="VIEW", exists=True)))
            except duckdb.Error:
                pass

    # -- execution ------------------------------------------------------------------------
    def fetch_arrow(self, ast: exp.Expression, *, what: str = "the bounded query") -> pa.Table:
        sql = render(ast)
        with self._lock:
            try:
                # the main connection: registered Arrow sources are connection-local
                return self._con.sql(sql).to_arrow_table()
            except duckdb.Error as e:
                raise ExecutionError(
                    f"DuckDB failed while running {what} ({type(e).__name__})",
                    hint="check column types in WHERE/GROUP BY (e.g. comparing text with numbers); run with --debug to see DuckDB's own message",
                    debug_detail=str(e),
                ) from None

    def describe(self, ast: exp.Expression) -> list[tuple[str, str]]:
        """(column, type) of a query's result, by binding it only (no row is read)."""
        return [(str(r[0]), str(r[1])) for r in self._bind(exp.Describe(this=ast.copy()))]

    def bind_check(self, ast: exp.Expression, *, run: bool = False) -> None:
        """Bind (type-check) a query without reading any row; refuse it for free if it fails.

        ``run=True`` executes it instead, for queries over public, one-row placeholder relations
        only (it also catches constant-conversion errors that binding alone lets through).
        """
        self._bind(ast.copy() if run else exp.Describe(this=ast.copy()))

    def _bind(self, ast: exp.Expression) -> list[Any]:
        with self._lock:
            try:
                return self._con.sql(render(ast)).fetchall()
            except duckdb.Error as e:
                raise QueryTypeError(
                    f"the query does not type-check against the table's columns ({type(e).__name__}); nothing was charged",
                    hint="check the types in WHERE / GROUP BY / HAVING / ORDER BY (e.g. text compared with numbers); "
                    "--debug shows DuckDB's message",
                    debug_detail=str(e),
                ) from None

    def post_process(self, table: pa.Table, ast_builder: Any) -> pa.Table:
        """Run a post-processing query (HAVING/ORDER BY/LIMIT on released values) over ``table``.

        ``ast_builder(name)`` returns the query AST reading from relation ``name``. The input
        holds only released (noisy) values, so this is post-processing.
        """
        with self._lock:
            cur = self._con
            try:
                cur.register("__released", table)
                try:
                    return cur.sql(render(ast_builder("__released"))).to_arrow_table()
                except duckdb.Error as e:
                    raise ExecutionError(
                        f"post-processing (HAVING/ORDER BY/LIMIT) failed ({type(e).__name__})",
                        hint="check the types used in HAVING and ORDER BY",
                        debug_detail=str(e),
                    ) from None
            finally:
                try:
                    cur.unregister("__released")
                except duckdb.Error:
                    pass
