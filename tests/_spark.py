"""The Spark engine's tests need the 'spark' extra and Java 17: ``require_spark()`` at a test module's top
skips the module without them, or fails it under ``DPSQL_REQUIRE_EXTRAS=1`` (CI, where they must run)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


def require_spark() -> None:
    why = ("the Spark engine needs the 'spark' extra: pip install 'dpsql[spark]'"
           if importlib.util.find_spec("pyspark") is None else
           "the Spark engine needs Java 17 on the PATH" if shutil.which("java") is None else None)
    if why is not None:
        if os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
            raise RuntimeError(why + " (DPSQL_REQUIRE_EXTRAS=1: these tests must run here)")
        pytest.skip(why, allow_module_level=True)


def both_engines(table: Any) -> Iterator[tuple[Any, Any]]:
    """A DuckDB and a Spark backend with ``table`` registered as the view ``v`` (a module fixture's body:
    ``yield from both_engines(t)``), closed afterwards."""
    from dpsql.engine import EngineSettings
    from dpsql.engine.duckdb import DuckDBBackend
    from dpsql.engine.spark import SparkBackend

    duck, spark = DuckDBBackend(None, EngineSettings()), SparkBackend(None, EngineSettings())
    duck.register_source("t", "arrow", table, view="v")
    spark.register_source("t", "arrow", table, view="v")
    yield duck, spark
    duck.close()
    spark.close()


def column_of(backend: Any, e: Any) -> list[Any]:
    """``e`` evaluated over the view ``v`` of :func:`both_engines`, in the order of its column ``i``."""
    from sqlglot import exp

    rows = backend.fetch_arrow(exp.select(exp.column("i"), exp.alias_(e, "y")).from_("v")).to_pylist()
    return [r["y"] for r in sorted(rows, key=lambda r: r["i"])]


def columns_of(backend: Any, exprs: list[Any]) -> list[list[Any]]:
    """Each of ``exprs`` evaluated over the view ``v`` of :func:`both_engines` as :func:`column_of` evaluates one,
    all in one query (one Spark job: a Spark query's fixed cost is most of a small one's time)."""
    from sqlglot import exp

    q = exp.select(exp.column("i"), *[exp.alias_(e.copy(), f"__y{k}") for k, e in enumerate(exprs)]).from_("v")
    rows = sorted(backend.fetch_arrow(q).to_pylist(), key=lambda r: r["i"])
    return [[r[f"__y{k}"] for r in rows] for k in range(len(exprs))]


def values_on_both(engines: Any, sqls: list[str], typed: Any) -> dict[str, tuple[list[Any], list[Any]]]:
    """sql -> (DuckDB's column, Spark's column) for every expression of ``sqls``, each made an expression by
    ``typed`` (as a private query's are typed), all of them in one query per engine (one Spark job instead of one
    per expression)."""
    duck, spark = engines
    es = [typed(sql) for sql in sqls]
    return dict(zip(sqls, zip(columns_of(duck, es), columns_of(spark, es), strict=True), strict=True))


def comparable_session(kind: str, budget: tuple[float, float] = (1e6, 0.9), seed: int = 3) -> Any:
    """A session on ``kind`` ('duckdb' or 'spark') whose releases compare with the other engine's: DuckDB with the
    portable keyed hash (Spark's), zero noise with the salts of ``seed``, a statement timeout of 300 s."""
    import dpsql
    from dpsql.testing import use_noise, zero_noise

    engine: dict[str, Any] = {"kind": kind, "statement_timeout": 300}
    if kind == "duckdb":
        engine["keyed_hash"] = "portable"
    s = dpsql.Session(budget=dpsql.Budget(*budget), engine=engine)
    use_noise(s, zero_noise(seed))
    return s
