"""Text functions on Spark give DuckDB's values: ``upper('ß')`` is DuckDB's 'ẞ' (Java's full case mapping, Spark's,
gives 'SS'), and ``lower`` keeps DuckDB's simple mapping of 'İ' and a final 'Σ'.

Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import sqlglot
from _spark import require_spark
from sqlglot import exp

from dpsql.engine import EngineSettings
from dpsql.plan.typer import Typer

require_spark()

TEXTS = ["straße", "ß", "ẞ", "STRAẞE", "ßß x ß", "İstanbul", "ΣΑΣ", "όσος", "abc", "", None]


@pytest.fixture(scope="module")
def engines() -> Any:
    from dpsql.engine.duckdb import DuckDBBackend
    from dpsql.engine.spark import SparkBackend

    t = pa.table({"i": pa.array(range(len(TEXTS)), pa.int64()), "s": pa.array(TEXTS, pa.string())})
    duck, spark = DuckDBBackend(None, EngineSettings()), SparkBackend(None, EngineSettings())
    duck.register_source("t", "arrow", t, view="v")
    spark.register_source("t", "arrow", t, view="v")
    yield duck, spark
    duck.close()
    spark.close()


def _column(backend: Any, e: exp.Expression) -> list[Any]:
    rows = backend.fetch_arrow(exp.select(exp.column("i"), exp.alias_(e, "y")).from_("v")).to_pylist()
    return [r["y"] for r in sorted(rows, key=lambda r: r["i"])]


def typed(sql: str) -> exp.Expression:
    return Typer({"i": "BIGINT", "s": "VARCHAR"}).t(sqlglot.parse_one(f"SELECT {sql}", read="duckdb").expressions[0]).expr


@pytest.mark.parametrize("sql", ["upper(s)", "lower(s)", "upper(lower(s))", "lower(upper(s))", "upper(s) = 'STRASSE'"])
def test_case_mapping_is_duckdbs(engines: Any, sql: str) -> None:
    duck, spark = engines
    e = typed(sql)
    assert _column(duck, e) == _column(spark, e)


def test_upper_sharp_s_is_one_letter(engines: Any) -> None:
    duck, spark = engines
    assert _column(spark, typed("upper(s)"))[:2] == ["STRAẞE", "ẞ"]
    # negative control: Spark's own upper expands it
    raw = exp.Upper(this=exp.column("s"))
    raw.meta["dpsql_dialect"] = "spark"
    assert _column(spark, raw)[:2] == ["STRASSE", "SS"]
