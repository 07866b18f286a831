"""The single render step: every SQL string dpsql executes is produced here from a sqlglot AST.

Keeping one render step guarantees that no user text is ever executed verbatim, and that
rendering for another engine is a change of dialect that cannot silently change a query:

* **Strict.** sqlglot renders with ``unsupported_level=ErrorLevel.RAISE``: a construct the
  target dialect cannot express (``ARG_MIN(x, h, 5)`` for Spark, which lenient rendering turns
  into ``MIN_BY``, one row instead of five; ``TRY(...)`` where the dialect has none, which
  lenient rendering drops) is an ``UnsupportedQueryError``, never a different query.
* **No silent loss of a guard.** sqlglot renders ``TRY_CAST`` as a plain ``CAST`` for dialects
  it believes lack one (Spark, Postgres, MySQL, ...) without any message: a cast that is NULL
  on a bad value in DuckDB would raise there (Spark in ANSI mode), so whether a query fails
  would depend on a row. A tree holding a ``TRY_CAST`` is refused for such a dialect.
* **Building blocks stay in their dialect.** Strict mode is not enough: ``HASH(a)`` renders
  for Spark without complaint, as Spark's 32-bit Murmur3, a different function. So the
  building blocks whose meaning differs between engines (the keyed hash, keep-n-per-partition,
  clamping, casts that are NULL on failure, typed literals: ``dpsql.engine.base.SqlOps``) are
  made by each backend's own ops, which mark every expression they return with their dialect
  (``meta[DIALECT_MARK]``); rendering such an expression for another dialect is refused.

Backends render for their own dialect (``ExecutionBackend.dialect``), and they render while
binding, before any charge, so a refusal here costs nothing.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from sqlglot import Dialect, ErrorLevel, exp
from sqlglot.errors import UnsupportedError
from sqlglot.generator import Generator

from dpsql.errors import UnsupportedQueryError

ENGINE_DIALECT = "duckdb"

#: meta key naming the dialect a backend's building block was made for
DIALECT_MARK = "dpsql_dialect"


@functools.cache
def _keeps_try_cast(dialect: str, safe: bool) -> bool:
    """Whether ``dialect`` renders a TRY_CAST node (with or without sqlglot's ``safe`` flag, which
    some dialects' renderers consult) as a cast that is NULL on failure, not a plain CAST."""
    probe = exp.TryCast(this=exp.column("x"), to=exp.DataType.build("DOUBLE"))
    if safe:
        probe.set("safe", True)
    return not probe.sql(dialect=dialect).upper().startswith("CAST(")


def render(ast: exp.Expression, *, dialect: str = ENGINE_DIALECT, pretty: bool = False, copy: bool = True) -> str:
    """SQL text of ``ast`` for ``dialect``; UnsupportedQueryError if it cannot be rendered
    there with the same meaning. ``copy=False`` for a tree that is read no more after this
    (sqlglot's generator may rewrite nodes in place; its copy of the tree was about two thirds of
    the time to render a bounded query)."""
    if not isinstance(ast, exp.Expression):  # pragma: no cover - programming error
        raise TypeError("render() takes a sqlglot expression")
    for node in ast.walk():
        if isinstance(node, exp.TryCast) and not _keeps_try_cast(dialect, bool(node.args.get("safe"))):
            raise UnsupportedQueryError(
                f"the query needs TRY_CAST (NULL where a value does not convert), which {dialect} would render as a "
                "plain CAST that can fail on a row",
                hint=f"the {dialect} backend must supply its own guarded cast (SqlOps.try_cast)",
            )
        made_for = node.meta.get(DIALECT_MARK)
        if made_for is not None and made_for != dialect:
            raise UnsupportedQueryError(
                f"the query was built with {made_for}'s building blocks ({type(node).__name__}) and cannot be "
                f"rendered for {dialect}",
                hint=f"build the bounded query with the {dialect} backend's ops (ExecutionBackend.ops)",
            )
    problem: str | None = None
    try:
        d = Dialect.get_or_raise(dialect)  # as ``ast.sql``: the dialect's generator, with its type names kept
        return _kept_types(d.generator_class)(dialect=d, pretty=pretty, unsupported_level=ErrorLevel.RAISE).generate(
            ast, copy=copy)
    except UnsupportedError as e:
        problem = str(e)
    raise UnsupportedQueryError(
        f"the query cannot be rendered for {dialect} without changing its meaning: {problem}",
        hint="this engine lacks a construct the query needs; nothing was run or charged",
    )


#: the most type names :func:`_kept_types` keeps per generator (emptied when full)
TYPE_NAMES_KEPT = 4096
#: the lock of every kept type name (:func:`_kept_types`, :func:`type_text`)
_KEPT_LOCK = threading.Lock()


def _kept_lock_after_fork() -> None:
    """In a forked child, :data:`_KEPT_LOCK` made anew: only the forking thread exists there, and another thread of
    the parent may have held the lock at the fork (held for ever in the child: its first new type's rendering waited
    for ever). The kept names stay: each is a function of its shape alone."""
    global _KEPT_LOCK
    _KEPT_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_kept_lock_after_fork)


def _type_shape(node: exp.Expression) -> tuple[Any, ...] | None:
    """Everything the text of a SQL type ``node`` depends on (its class and arguments, its parameters' too), or None
    where it holds anything but types, parameters, literals, identifiers and names, a comment or a type annotation."""
    if not isinstance(node, (exp.DataType, exp.DataTypeParam, exp.Literal, exp.Identifier, exp.Var)) or node.comments \
            or getattr(node, "_type", None) is not None:
        return None
    out: list[Any] = [type(node)]
    for k, v in node.args.items():
        if isinstance(v, exp.Expression):
            sub = _type_shape(v)
            if sub is None:
                return None
            out.append((k, sub))
        elif isinstance(v, list):
            subs = [_type_shape(x) if isinstance(x, exp.Expression) else None for x in v]
            if any(x is None for x in subs):
                return None
            out.append((k, tuple(subs)))
        elif v is None or isinstance(v, (str, bool, int, exp.DataType.Type)):
            out.append((k, v))
        else:
            return None
    return tuple(out)


@functools.cache
def _kept_types(cls: type[Generator]) -> type[Generator]:
    """``cls`` that renders each SQL type once per shape (:func:`_type_shape`) and ``pretty``, kept: a long IN list of
    typed constants (``CAST(CAST(1 AS BIGINT) AS TEXT)`` per element, the typer's digests of a list) renders two
    types per element, and sqlglot's DuckDB renderer builds several types to compare each with (about 40 us a type,
    most of the rendering of such a list). The same text: a type's text depends on its shape alone, and one whose
    rendering found a construct the dialect lacks is not kept (it is rendered, and refused, each time). A type's
    rendering may change the node it renders (dropping a precision the dialect lacks): only the nodes of a tree that
    is rendered from a copy, or read no more (``render``'s ``copy``)."""
    kept: dict[tuple[Any, ...], str] = {}
    own = cls.datatype_sql

    def datatype_sql(self: Any, expression: exp.DataType) -> str:
        shape = _type_shape(expression)
        if shape is None:
            return own(self, expression)
        at = (self.pretty, shape)
        text = kept.get(at)
        if text is None:
            before = len(self.unsupported_messages)
            text = own(self, expression)
            if len(self.unsupported_messages) == before:
                with _KEPT_LOCK:
                    if len(kept) >= TYPE_NAMES_KEPT:
                        kept.clear()
                    kept[at] = text
        return text

    return type(f"{cls.__name__}KeptTypes", (cls,), {"datatype_sql": datatype_sql, "__module__": __name__})


#: the text of each SQL type, for DuckDB, by shape (:func:`type_text`)
_TYPE_TEXTS: dict[tuple[Any, ...], str] = {}


def type_text(node: exp.Expression) -> str:
    """``node.sql(dialect="duckdb")`` of a SQL type (a cast's ``to``), kept per shape (:func:`_type_shape`): the same
    text (it depends on the shape alone, and DuckDB's renderer supports every type: no message is left out), where a
    check reading the type of each cast of a long IN list's typed constants rendered two types per element."""
    shape = _type_shape(node)
    if shape is None:
        return node.sql(dialect=ENGINE_DIALECT)
    text = _TYPE_TEXTS.get(shape)
    if text is None:
        text = node.sql(dialect=ENGINE_DIALECT)
        with _KEPT_LOCK:
            if len(_TYPE_TEXTS) >= TYPE_NAMES_KEPT:
                _TYPE_TEXTS.clear()
            _TYPE_TEXTS[shape] = text
    return text
