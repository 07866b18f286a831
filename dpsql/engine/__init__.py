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

from collections.abc import Callable
from typing import Any

from dpsql.engine.base import (
    PRIVATE_FAILURE,
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

__all__ = [
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
