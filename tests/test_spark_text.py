"""Text functions on Spark give DuckDB's values: ``upper('ß')`` is DuckDB's 'ẞ' (Java's full case mapping, Spark's,
gives 'SS'), and ``lower`` keeps DuckDB's simple mapping of 'İ' and a final 'Σ'. Text that only Spark converts to a
number or boolean (Java's '1d' / '1f' suffixes and hex floats, Arabic-Indic and full-width digits as a DECIMAL, a tab
or newline around a boolean) is NULL there, as on DuckDB.

Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import sqlglot
from _spark import both_engines, column_of, require_spark, values_on_both
from sqlglot import exp

from dpsql.plan.typer import Typer

require_spark()

TEXTS = ["straße", "ß", "ẞ", "STRAẞE", "ßß x ß", "İstanbul", "ΣΑΣ", "όσος", "abc", "", None,
         # conversions: agreed, then read by Spark alone before
         "1", " 2 ", "+3", "-.5", "1e5", "007", "Infinity", "inf", "-inf", "NaN", "true", " false ", "t", "1.25",
         "1d", "1f", "1D", "2.5F", "0x1p3", "٣", "１２", "1٣", "\t1", "1\n", "\ntrue", "\rfalse\x0b", " 1 ", "true "]
CONVERSIONS = ["TRY_CAST(s AS DOUBLE)", "TRY_CAST(s AS FLOAT)", "TRY_CAST(s AS DECIMAL(10,2))", "TRY_CAST(s AS HUGEINT)",
               "TRY_CAST(s AS DECIMAL(38,0))", "TRY_CAST(s AS BOOLEAN)"]
# (as integers DuckDB also reads fractions and exponents, '-.5', '1e5', which Spark does not: docs/spark.md)


@pytest.fixture(scope="module")
def engines() -> Any:
    t = pa.table({"i": pa.array(range(len(TEXTS)), pa.int64()), "s": pa.array(TEXTS, pa.string())})
    yield from both_engines(t)


def _column(backend: Any, e: exp.Expression) -> list[Any]:
    return column_of(backend, e)


def typed(sql: str) -> exp.Expression:
    return Typer({"i": "BIGINT", "s": "VARCHAR"}).t(sqlglot.parse_one(f"SELECT {sql}", read="duckdb").expressions[0]).expr


CASE_MAPPINGS = ["upper(s)", "lower(s)", "upper(lower(s))", "lower(upper(s))", "upper(s) = 'STRASSE'"]


@pytest.fixture(scope="module")
def values(engines: Any) -> dict[str, tuple[list[Any], list[Any]]]:
    """sql -> (DuckDB's column, Spark's column) for every expression of ``CASE_MAPPINGS`` and ``CONVERSIONS``: all
    of them in one query per engine (one Spark job instead of one per expression)."""
    return values_on_both(engines, CASE_MAPPINGS + CONVERSIONS, typed)


@pytest.mark.parametrize("sql", CASE_MAPPINGS)
def test_case_mapping_is_duckdbs(values: dict[str, tuple[list[Any], list[Any]]], sql: str) -> None:
    d, s = values[sql]
    assert d == s


def test_upper_sharp_s_is_one_letter(engines: Any) -> None:
    duck, spark = engines
    assert _column(spark, typed("upper(s)"))[:2] == ["STRAẞE", "ẞ"]
    # negative control: Spark's own upper expands it
    raw = exp.Upper(this=exp.column("s"))
    raw.meta["dpsql_dialect"] = "spark"
    assert _column(spark, raw)[:2] == ["STRASSE", "SS"]


def _same(a: list[Any], b: list[Any]) -> bool:
    return [repr(x) for x in a] == [repr(x) for x in b]


@pytest.mark.parametrize("sql", CONVERSIONS)
def test_text_converts_as_on_duckdb(values: dict[str, tuple[list[Any], list[Any]]], sql: str) -> None:
    d, s = values[sql]
    assert _same(d, s), [(t, a, b) for t, a, b in zip(TEXTS, d, s, strict=True) if repr(a) != repr(b)]


def test_text_conversion_control(engines: Any) -> None:
    """Negative control: Spark's own conversions read the texts DuckDB does not."""
    duck, spark = engines
    for to, text in (("DOUBLE", "1d"), ("DECIMAL(10,2)", "１２"), ("BOOLEAN", "\t1")):
        raw = exp.TryCast(this=exp.column("s"), to=exp.DataType.build(to), safe=True)
        raw.meta["dpsql_dialect"] = "spark"
        assert _column(spark, raw)[TEXTS.index(text)] is not None
        assert _column(duck, typed(f"TRY_CAST(s AS {to})"))[TEXTS.index(text)] is None
