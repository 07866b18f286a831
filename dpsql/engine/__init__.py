"""Execution backends: where dpsql's ASTs run.

* ``base`` -- the contract: :class:`ExecutionBackend` (register a source, bind, fetch Arrow,
  post-process) and :class:`SqlOps` (the semantic building blocks of bounded queries), the
  owner's :class:`EngineSettings`, and the one error text after a private read
  (:func:`private_failure`).
* ``spark`` -- the Apache Spark backend (``SparkBackend``, optional: pyspark), ``spark_ops`` its
  building blocks and the Spark form of the typer's output; ``portable`` -- the keyed hash both
  engines compute identically.
* ``duckdb`` -- the DuckDB backend (:class:`DuckDBBackend`, also known as ``Engine``);
  ``duckdb_ops`` -- its building blocks (pure); ``_duckdb_sources`` -- how it reads sources.

A new engine is one module implementing both protocols, plus one entry in :data:`BACKENDS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dpsql.engine.base import (
    PRIVATE_FAILURE,
    BoundedBatch,
    EngineSettings,
    ExecutionBackend,
    SqlOps,
    private_failure,
    scrub,
    source_name,
)
from dpsql.engine.duckdb import DuckDBBackend, Engine
from dpsql.engine.duckdb_ops import DuckDBOps


def _spark_backend(session: Any = None, settings: EngineSettings | None = None) -> ExecutionBackend:
    """The Spark backend, imported on use (pyspark is an optional extra: ``dpsql[spark]``)."""
    from dpsql.engine.spark import SparkBackend

    return SparkBackend(session, settings)


#: the available backends by name: each builds a backend from (connection / session or None, settings)
BACKENDS: dict[str, Callable[..., ExecutionBackend]] = {"duckdb": DuckDBBackend, "spark": _spark_backend}



def make_backend(settings: EngineSettings, connection: Any = None, spark: Any = None, *,
                 check_only: bool = False) -> ExecutionBackend:
    """The backend ``settings.kind`` names in :data:`BACKENDS`: DuckDB over ``connection`` (a DuckDB connection or
    None), Spark over ``spark`` (a SparkSession or None: one on ``settings.master``), another engine over
    ``connection``.
    ``check_only``: refuse a wrong combination (ConfigError) and build nothing."""
    from dpsql.errors import ConfigError

    if settings.kind == "spark" and connection is not None:
        raise ConfigError("connection= is a DuckDB connection; the Spark engine takes spark=<SparkSession>",
                          hint="Session(engine='spark', spark=spark_session)")
    if settings.kind != "spark" and spark is not None:
        raise ConfigError("spark= needs the Spark engine", hint="Session(engine='spark', spark=spark_session)")
    if check_only:
        return None  # type: ignore[return-value]
    return BACKENDS[settings.kind](spark if settings.kind == "spark" else connection, settings)


def fetch_bounded(backend: ExecutionBackend, ast: Any) -> Any:
    """The result of a mechanism's bounded relation: None (no private read), an Arrow table, or for a
    :class:`BoundedBatch` the list of its queries' tables (each read in turn, all under one statement time-out)."""
    if isinstance(ast, BoundedBatch):
        # one statement time-out for the whole batch (each read gets what is left of it): m reads with a
        # time-out each could run for m times it, past a min_response_time set to cover one time-out
        limit = backend.settings.statement_timeout
        until = None if limit is None else time.monotonic() + limit
        return [backend.fetch_arrow(q, deadline=until) for q in ast.queries]
    return backend.fetch_arrow(ast) if ast is not None else None


def bounded_under(backend: ExecutionBackend, route: Any, salt: str, key: Any, checked: dict[Any, Any]) -> Any:
    """The bounded query of ``route`` (a mechanism's route) under ``salt``: built; or for a query whose bind check
    passed before (``key`` in ``checked``, whose value keeps the backend's preparation) and a real salt, the
    backend's preparation of it under ``salt`` (built and rendered once, the salt put into the text where that is
    exactly what building it under the salt gives: ``DuckDBBackend.prepare_bounded``), where it prepares one. The
    query that prepares it runs its own build (one of the two the preparation compares; a batch: its only one)."""
    from dpsql.rewrite.bound import SALT_PLACEHOLDER

    def build(s: str) -> Any:
        return route.bounded(s, backend.ops)  # ``Route.bounded``: the mechanism's, refused if it reads rows for free

    # the entry is read once: another thread's first bind check of the same query may end meanwhile
    prepared: Any = checked.get(key, False) if salt != SALT_PLACEHOLDER else False
    if prepared is None:  # prepared with this query: its own build is one of the two the check compares
        prepare = getattr(backend, "prepare_bounded", None)
        made, own = prepare(build, salt) if prepare is not None else (None, build(salt))
        checked[key] = made or False
        return own
    salted = prepared.salted(salt) if prepared else None  # None: a salt unlike the stand-in
    return salted if salted is not None else build(salt)


def remember_bind_check(checked: dict[Any, Any], key: Any) -> None:
    """Remember that the bind check of ``key`` passed (at most 256; never a key whose route is not remembered,
    ``key[0]`` None), keeping a preparation another thread made meanwhile (:func:`bounded_under`)."""
    if key[0] is not None and len(checked) < 256:
        checked.setdefault(key, None)


class PublicReads:
    """The backend as a mechanism's check before the charge sees it (``check_public(calibration, engine)``):
    ``fetch_arrow`` of a query whose every table is the relation of a table declared public (or a CTE of the
    query itself); any other is refused (ConfigError, nothing read), so such a check reads no private row."""

    def __init__(self, backend: ExecutionBackend, catalog: Any) -> None:
        self._backend, self.settings, self.dialect, self.ops = backend, backend.settings, backend.dialect, backend.ops
        self._public = {spec.view for spec in catalog.values() if spec.public and spec.view}

    def fetch_arrow(self, ast: Any, *, what: str = "the public rows") -> Any:
        from sqlglot import exp

        from dpsql.errors import ConfigError

        ctes = {c.alias_or_name for c in ast.find_all(exp.CTE)}
        for t in ast.find_all(exp.Table):
            if not (t.name in self._public or (t.name in ctes and not t.args.get("db"))) or not t.name:
                raise ConfigError(f"{what} reads a table not declared public before the charge; nothing was read or "
                                  "charged", hint="a mechanism's check_public reads public tables only")
        return self._backend.fetch_arrow(ast, what=what)


def public_key_domain(r: Any, backend: ExecutionBackend, catalog: Any) -> Any:
    """The keys a route releases when they are public, for post-processing's check before the charge: declared (the
    calibration's ``key_domain``), or read from public tables only (``PublicReads``; ``public_key_set``: a grouped
    join's key set read at run time, when the query's HAVING, QUALIFY or OFFSET may drop keys); None otherwise."""
    domain = r.mechanism.key_domain(r.calibration)
    if domain is None and hasattr(r.mechanism, "public_key_set"):
        domain = r.mechanism.public_key_set(r.calibration, PublicReads(backend, catalog), r.request.plan)
    return domain


def describe_bounded(backend: ExecutionBackend, ast: Any) -> dict[str, str]:
    """Column types of a bounded relation by binding it (no row read); of a batch, every query is bound
    (so each is refused before the charge if it does not bind) and the first one's types returned."""
    check = getattr(backend, "check_text_columns", lambda _: None)  # DuckDB: memory for the texts a read decodes
    if isinstance(ast, BoundedBatch):
        for q in ast.queries:
            check(q)
        return [dict(backend.describe(q)) for q in ast.queries][0]
    if ast is not None:
        check(ast)
    return dict(backend.describe(ast)) if ast is not None else {}


def render_bounded(backend: ExecutionBackend, ast: Any) -> str:
    """The SQL ``explain`` shows: the bounded relation, or a batch's queries one after another."""
    if isinstance(ast, BoundedBatch):
        return "\n\n".join(f"-- query {i + 1} of {len(ast.queries)}\n{backend.render(q, pretty=True)}"
                             for i, q in enumerate(ast.queries))
    return backend.render(ast, pretty=True) if ast is not None else ""


__all__ = [
    "BoundedBatch",
    "PublicReads",
    "describe_bounded",
    "public_key_domain",
    "fetch_bounded",
    "bounded_under",
    "remember_bind_check",
    "render_bounded",
    "make_backend",
    "BACKENDS",
    "PRIVATE_FAILURE",
    "DuckDBBackend",
    "DuckDBOps",
    "Engine",
    "EngineSettings",
    "ExecutionBackend",
    "SqlOps",
    "private_failure",
    "scrub",
    "source_name",
]
