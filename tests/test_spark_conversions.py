"""Conversions and Arrow sources on Spark give DuckDB's values.

* A DOUBLE or DECIMAL converted to an integer (``CAST(x AS INT)``, a common group key) rounds as
  DuckDB does (DOUBLE: to nearest, ties to even; DECIMAL: ties away from zero), where Spark's own
  cast truncates; the ends of each integer range (2^63 included, which Spark's own cast saturates)
  are NULL on both; a finite DOUBLE beyond FLOAT's range is NULL on both.
* Arrow timestamps in seconds or milliseconds and Arrow ``date64`` columns register and read as
  DuckDB reads them (NULL outside 290000 BC .. 294000), where Spark's own conversion raised on one
  value; nested ones are a ConfigError naming the column.

Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

import decimal
from typing import Any

import pyarrow as pa
import pytest
import sqlglot
from _spark import require_spark
from sqlglot import exp

import dpsql
from dpsql.engine import EngineSettings
from dpsql.errors import ConfigError
from dpsql.plan.typer import Typer
from dpsql.testing import use_noise, zero_noise

require_spark()

D = decimal.Decimal
DOUBLES = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999999, 127.5, -128.5, 32767.5, 2147483646.5, 2147483647.5,
           -2147483648.5, 2.0**63, -(2.0**63), 2.0**63 - 1024, 1e19, 1.7976931348623157e308, 3.4028235e38,
           float("nan"), float("inf"), float("-inf"), -0.0, None,
           # near DECIMAL(38,0)'s and HUGEINT's ends: the parts of the exact conversion must not overflow
           5e37, -5e37, 1.9e38, -1.9e38, 3e38,
           # beyond 10^38 - 1 but inside DuckDB's HUGEINT (2^127 - 1): NULL on both (was a value on DuckDB only)
           1.5e38, -1.5e38, 1e38]
DECIMALS = [D("0.5"), D("1.5"), D("2.5"), D("-0.5"), D("-2.5"), D("2.49"), D("127.5"), D("-128.5"), D("32767.50"),
            D("99999.95"), D("-99999.95"), D("2147483647.49"), D("2147483647.50"), D("0.01"), D("-0.01"), None,
            D("12345678.90"), D("-12345678.90"), D("1"), D("0"), D("0.00"), D("-1"), D("7.77"), D("8.88")]
DECIMALS += [D(0)] * (len(DOUBLES) - len(DECIMALS))
WIDE = [D("9999999999999999999999999999.9999999999"), D("-9999999999999999999999999999.9999999999"),
        D("9223372036854775807.5"), D("-9223372036854775808.5"), D("9223372036854775806.5"), D("0.5"), None]
WIDE += [D(0)] * (len(DOUBLES) - len(WIDE))
CASTS = [f"CAST({c} AS {t})" for c in ("d", "f", "m", "w")
         for t in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "FLOAT")]


def table() -> pa.Table:
    n = len(DOUBLES)
    assert len(DECIMALS) == len(WIDE) == n
    return pa.table({"i": pa.array(range(n), pa.int64()), "d": pa.array(DOUBLES, pa.float64()),
                     "f": pa.array(DOUBLES, pa.float64()).cast(pa.float32(), safe=False),
                     "m": pa.array(DECIMALS, pa.decimal128(12, 2)), "w": pa.array(WIDE, pa.decimal128(38, 10))})


def typed(sql: str) -> exp.Expression:
    node = sqlglot.parse_one(f"SELECT {sql}", read="duckdb").expressions[0]
    return Typer({"i": "BIGINT", "d": "DOUBLE", "f": "FLOAT", "m": "DECIMAL(12,2)", "w": "DECIMAL(38,10)"}).t(node).expr


@pytest.fixture(scope="module")
def engines() -> Any:
    from dpsql.engine.duckdb import DuckDBBackend
    from dpsql.engine.spark import SparkBackend

    duck, spark = DuckDBBackend(None, EngineSettings()), SparkBackend(None, EngineSettings())
    duck.register_source("t", "arrow", table(), view="v")
    spark.register_source("t", "arrow", table(), view="v")
    yield duck, spark
    duck.close()
    spark.close()


def _rows(backend: Any, q: exp.Expression) -> list[dict[str, Any]]:
    return sorted(backend.fetch_arrow(q).to_pylist(), key=lambda r: r["i"])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return bool(a == b and type(a) is type(b)) or (a is not None and b is not None and float(a) == float(b))


def test_numbers_convert_to_integers_as_on_duckdb(engines: Any) -> None:
    duck, spark = engines
    q = exp.select(exp.column("i"), *[exp.alias_(typed(e), f"c{k}") for k, e in enumerate(CASTS)]).from_("v")
    d, s = _rows(duck, q), _rows(spark, q)
    assert len(d) == len(s) == len(DOUBLES)
    bad = [(e, i, d[i][f"c{k}"], s[i][f"c{k}"]) for k, e in enumerate(CASTS) for i in range(len(d))
           if not _same(d[i][f"c{k}"], s[i][f"c{k}"])]
    assert not bad, bad[:10]
    # not vacuous: DuckDB rounds (ties to even for a DOUBLE, away from zero for a DECIMAL), NULL at the ends
    col = {e: [r[f"c{k}"] for r in d] for k, e in enumerate(CASTS)}
    assert col["CAST(d AS INTEGER)"][:6] == [0, 2, 2, 0, -2, -2] and col["CAST(m AS INTEGER)"][:5] == [1, 2, 3, -1, -3]
    assert col["CAST(d AS BIGINT)"][DOUBLES.index(2.0**63)] is None
    assert col["CAST(d AS BIGINT)"][DOUBLES.index(-(2.0**63))] == -(2**63)
    assert col["CAST(d AS FLOAT)"][DOUBLES.index(1.7976931348623157e308)] is None
    # negative control: Spark's own cast truncates, so the comparison above can fail
    raw = exp.TryCast(this=exp.column("d"), to=exp.DataType.build("INT"), safe=True)
    raw.meta["dpsql_dialect"] = "spark"
    native = [r["x"] for r in _rows(spark, exp.select("i", exp.alias_(raw, "x")).from_("v"))]
    assert native[:6] == [0, 1, 2, 0, -1, -2] != col["CAST(d AS INTEGER)"][:6]


DECIMAL_CASTS = ["CAST(d AS DECIMAL(10,2))", "CAST(d / 2 + 0.755 AS DECIMAL(10,2))", "CAST(d / 1000 AS DECIMAL(30,20))",
                 "CAST(d AS DECIMAL(38,0))", "CAST(d AS DECIMAL(38,2))", "CAST(d AS HUGEINT)", "CAST(d / 3 AS DECIMAL(18,17))",
                 "CAST(d * 1e17 AS DECIMAL(38,0))", "CAST(f AS HUGEINT)", "CAST(f AS DECIMAL(38,0))", "CAST(f AS DECIMAL(12,2))"]


def test_doubles_convert_to_decimals_digit_for_digit_as_on_duckdb(engines: Any) -> None:
    """DuckDB converts a DOUBLE to DECIMAL(p, s) as round(x * 1e<s>) (ties away from zero, the product
    in DOUBLE) and to HUGEINT exactly; Spark's own cast goes through the double's shortest text (1.005
    to DECIMAL(10,2) was 1.01 on Spark, 1.00 on DuckDB; 2^63 as HUGEINT 9223372036854776000). Compared
    digit for digit (the test above compares through float, which hid these)."""
    duck, spark = engines
    q = exp.select(exp.column("i"), *[exp.alias_(typed(e), f"c{k}") for k, e in enumerate(DECIMAL_CASTS)]).from_("v")
    d, s = _rows(duck, q), _rows(spark, q)
    bad = [(e, DOUBLES[i], d[i][f"c{k}"], s[i][f"c{k}"]) for k, e in enumerate(DECIMAL_CASTS) for i in range(len(d))
           if str(d[i][f"c{k}"]) != str(s[i][f"c{k}"])]
    assert not bad, bad[:10]
    col = {e: [r[f"c{k}"] for r in d] for k, e in enumerate(DECIMAL_CASTS)}
    assert col["CAST(d AS HUGEINT)"][DOUBLES.index(2.0**63)] == 2**63
    assert col["CAST(d / 2 + 0.755 AS DECIMAL(10,2))"][0] == D("1.00")  # 1.005 as a DOUBLE is below the tie
    # negative control: Spark's own conversion reads the double's text, so the comparison above can fail
    raw = exp.TryCast(this=exp.column("d"), to=exp.DataType.build("DECIMAL(38,0)"), safe=True)
    raw.meta["dpsql_dialect"] = "spark"
    native = [r["x"] for r in _rows(spark, exp.select("i", exp.alias_(raw, "x")).from_("v"))]
    assert native[DOUBLES.index(2.0**63)] != col["CAST(d AS DECIMAL(38,0))"][DOUBLES.index(2.0**63)]


def test_integer_keys_from_doubles_are_the_same_released_groups() -> None:
    """End to end, with zero noise: ``GROUP BY CAST(x AS INT)`` over many people per value releases the
    same keys and counts on both engines (1.5 and 2.5 are both 2, 3.5 is 4)."""
    vals = [0.5, 1.5, 2.5, 3.5, -1.5]
    n = 40 * len(vals)
    t = pa.table({"u": pa.array(range(n), pa.int64()), "x": pa.array([vals[i % len(vals)] for i in range(n)])})
    out = []
    for kind in ("duckdb", "spark"):
        s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0, 1e-3), engine={"kind": kind, "keyed_hash": "portable"}
                          if kind == "duckdb" else {"kind": kind})
        try:
            use_noise(s, zero_noise(2))
            s.register("t", t, privacy_unit="u")
            r = s.query("SELECT CAST(x AS INTEGER) AS k, COUNT(*) AS n FROM t GROUP BY k", epsilon=1.0, delta=1e-5)
            out.append(sorted((row["k"], row["n"]) for row in r.table.to_pylist()))
        finally:
            s.close()
    assert out[0] == out[1] == [(-2, 40), (0, 40), (2, 80), (4, 40)]


# -- Arrow temporal columns -----------------------------------------------------------------------------

STAMPS = [0, -1, 10**9, 10**15, -(10**15), 9_215_576_668_800, 9_215_576_668_801, 2**62, None]


def test_arrow_timestamps_in_seconds_and_milliseconds_and_date64_register_as_on_duckdb(engines: Any) -> None:
    duck, spark = engines
    n = len(STAMPS)
    t = pa.table({"i": pa.array(range(n), pa.int64()),
                  "s": pa.array(STAMPS, pa.int64()).cast(pa.timestamp("s")),
                  "ms": pa.array(STAMPS, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                  "ms_ntz": pa.array([None if v is None else v * 1000 + 999 for v in STAMPS[:3]] + [2**63 - 1] * (n - 3),
                                     pa.int64()).cast(pa.timestamp("ms")),
                  "d64": pa.array([None if v is None else max(min(v, 10**9), -(10**9)) * 86_400_000 // 7 for v in STAMPS],
                                  pa.int64()).cast(pa.date64())})
    for b in (duck, spark):
        b.register_source("a", "arrow", t, view="va")
    micros = [exp.alias_(exp.Anonymous(this="epoch_us", expressions=[exp.column(c)]), c) for c in ("s", "ms", "ms_ntz")]
    q = exp.select("i", *micros, exp.alias_(exp.Cast(this=exp.column("d64"), to=exp.DataType.build("VARCHAR")), "d64")) \
        .from_("va")
    spark_q = exp.select("i", *[exp.alias_(exp.Anonymous(this="unix_micros", expressions=[
        exp.Cast(this=exp.column(c), to=exp.DataType.build("TIMESTAMP_LTZ", dialect="spark"))]), c) for c in ("s", "ms", "ms_ntz")],
        exp.alias_(exp.Cast(this=exp.column("d64"), to=exp.DataType.build("STRING")), "d64")).from_("va")
    for node in spark_q.walk():
        node.meta["dpsql_dialect"] = "spark"
    d, s = _rows(duck, q), _rows(spark, spark_q)
    assert d == s
    assert [r["s"] for r in d][:3] == [0, -1_000_000, 10**15] and d[3]["s"] is None and d[5]["s"] is not None \
        and d[6]["s"] is None and d[-1]["s"] is None
    assert d[3]["ms"] == 10**18 and d[7]["ms"] is None and d[1]["d64"] == "1969-12-31"
    # a nested one is a ConfigError naming the column and the fix (the schema's property, never a value's)
    nested = pa.table({"i": pa.array([1], pa.int64()), "deep": pa.array([[0]], pa.list_(pa.int64())).cast(
        pa.list_(pa.timestamp("s")))})
    with pytest.raises(ConfigError, match=r"(?s)column 'deep'.*pa\.timestamp\('us'\)"):
        spark.register_source("n", "arrow", nested, view="vn")


TEXTS = ["İstanbul", "ΟΔΟΣ", "Σ", "ΣΑΣ ΣΑΣ", "ǅ", "ABC", "é", "", None]


def test_lower_is_duckdbs_simple_case_mapping(engines: Any) -> None:
    """DuckDB lowers 'İ' to 'i' and every 'Σ' to 'σ'; Spark (Java's full mapping) gave 'i̇' and a final 'ς'."""
    duck, spark = engines
    t = pa.table({"i": pa.array(range(len(TEXTS)), pa.int64()), "s": pa.array(TEXTS, pa.string())})
    for b in (duck, spark):
        b.register_source("x", "arrow", t, view="vx")
    lowered = Typer({"i": "BIGINT", "s": "VARCHAR"}).t(sqlglot.parse_one("SELECT lower(s)", read="duckdb").expressions[0]).expr
    q = exp.select("i", exp.alias_(lowered, "l")).from_("vx")
    d, s = _rows(duck, q), _rows(spark, q)
    assert d == s
    assert [r["l"] for r in d][:4] == ["istanbul", "οδοσ", "σ", "σασ σασ"]
    # negative control: Spark's own lower spells them otherwise
    raw = exp.Lower(this=exp.column("s"))
    raw.meta["dpsql_dialect"] = "spark"
    native = [r["l"] for r in _rows(spark, exp.select("i", exp.alias_(raw, "l")).from_("vx"))]
    assert native[0] == "i\u0307stanbul" and native[1] == "οδος"


def test_floor_and_ceil_of_a_decimal_are_duckdbs_decimals(engines: Any) -> None:
    """floor/ceil of a DECIMAL(p, s) is DuckDB's DECIMAL(p, 0) on Spark too (it was released as a DOUBLE there,
    so a GROUP BY ceil(price) key was spelled 2.0 on Spark and 2 on DuckDB), digit for digit."""
    duck, spark = engines
    exprs = ["floor(m)", "ceil(m)", "floor(w)", "ceil(w)"]
    q = exp.select(exp.column("i"), *[exp.alias_(typed(e), f"c{k}") for k, e in enumerate(exprs)]).from_("v")
    d, s = _rows(duck, q), _rows(spark, q)
    bad = [(e, i, d[i][f"c{k}"], s[i][f"c{k}"]) for k, e in enumerate(exprs) for i in range(len(d))
           if repr(d[i][f"c{k}"]) != repr(s[i][f"c{k}"])]
    assert not bad, bad[:10]
    assert [r["c1"] for r in d][:5] == [D(1), D(2), D(3), D(0), D(-2)]  # not vacuous: ceil, as DECIMALs


# DuckDB's typing rules the typer follows (REAL with integers and DECIMALs, NULLIF's type, floor/ceil of an integer as
# DOUBLE, NULL + x, DOUBLE literals, integer arithmetic in a type holding its operands), lowered to Spark
TYPED = ["f * m", "f + i", "f * w", "f - i * 3", "f = m", "f < i", "i >= CAST(2 AS REAL)", "f * CAST(3.4e38 AS REAL)",
         "CAST(f * i AS VARCHAR)", "CAST(f + m AS DECIMAL(12,2))", "CAST(f * 2 AS BIGINT)", "floor(i)", "ceil(i * 3)",
         "CAST(floor(i) AS VARCHAR)", "NULLIF(m, d)", "NULLIF(f, d)", "NULLIF(i, f)", "NULLIF(d, f)", "NULLIF(w, m)",
         "CAST(NULLIF(m, d) AS INTEGER)", "-(i)", "i * 0", "NULL + i", "CASE WHEN i > 3 THEN NULL + i ELSE m END",
         "(i - 0.5) - (i + i)", "CAST(2.5 AS DOUBLE) * m", "f * 1e0", "m < 3e0", "i + 16777207 = CAST(16777216 AS REAL)",
         # a REAL divided by (or dividing) a REAL, an integer or a DECIMAL: a REAL quotient, inf beyond its range
         "f / i", "i / f", "f / m", "f / w", "f / f", "f / (i - i)", "f / CAST(1e-38 AS REAL)", "CAST(f / 3 AS VARCHAR)",
         "f / 10 = 0.05", "f / d",
         # an integer beyond 2^24 converted to REAL (16777217 is 16777216) stays a REAL where Spark widens it to DOUBLE
         # (its optimizer drops a long -> float cast under a float -> double one: the quotient was 16777217's)
         "f / (CAST(i AS INTEGER) + 16777216)", "(CAST(i AS INTEGER) + 16777216) / f", "f / CAST(i + 16777216 AS REAL)",
         "CAST(CAST(i AS INTEGER) + 16777216 AS REAL) = CAST(i AS INTEGER) + 16777216e0", "f / (i + 16777216)"]


def test_duckdbs_typing_rules_give_duckdbs_values(engines: Any) -> None:
    duck, spark = engines
    q = exp.select(exp.column("i"), *[exp.alias_(typed(e), f"c{k}") for k, e in enumerate(TYPED)]).from_("v")
    d, s = _rows(duck, q), _rows(spark, q)
    bad = [(e, i, d[i][f"c{k}"], s[i][f"c{k}"]) for k, e in enumerate(TYPED) for i in range(len(d))
           if repr(d[i][f"c{k}"]) != repr(s[i][f"c{k}"]) and not (d[i][f"c{k}"] != d[i][f"c{k}"] and s[i][f"c{k}"] != s[i][f"c{k}"])]
    assert not bad, bad[:10]
    col = {e: [r[f"c{k}"] for r in d] for k, e in enumerate(TYPED)}
    # not vacuous: floor of an integer is a DOUBLE, NULLIF(m, d) the DECIMAL m (-2.5 rounds to -3, as a DOUBLE to -2)
    assert col["CAST(floor(i) AS VARCHAR)"][:2] == ["0.0", "1.0"] and col["CAST(NULLIF(m, d) AS INTEGER)"][3:5] == [None, -3]
    assert col["CAST(f * i AS VARCHAR)"][DOUBLES.index(3.4028235e38)] == "inf"  # REAL arithmetic: 32 bits
    assert col["CAST(f / 3 AS VARCHAR)"][0] == "0.16666667" and col["f / 10 = 0.05"][0] is True  # a REAL quotient
    assert col["f / CAST(1e-38 AS REAL)"][DOUBLES.index(127.5)] == float("inf")
    assert col["f / (CAST(i AS INTEGER) + 16777216)"][1] == 1.5 / 16777216  # the REAL of 16777217 is 16777216
    assert col["CAST(CAST(i AS INTEGER) + 16777216 AS REAL) = CAST(i AS INTEGER) + 16777216e0"][:2] == [True, False]


# -- constants folded for a histogram's kept bins ------------------------------------------------------------------

FOLDED = ["CAST(20.5 AS INTEGER)", "CAST(-20.5 AS INTEGER)", "CAST(21.5e0 AS INTEGER)", "CAST(2.5e0 AS BIGINT)",
          "CAST(-2.5 AS SMALLINT)", "CAST(127.5 AS TINYINT)", "CAST(2.5 AS INTEGER) * 2", "1/0", "-1/0", "0/0",
          "1 / CAST('-0.0' AS DOUBLE)", "1e308 * 10 / 0", "CAST(0 AS REAL) / CAST(0 AS REAL)", "1e308 * 10",
          "CAST(' 12 ' AS INTEGER)", "CAST('\t3' AS DOUBLE)", "CAST('-Infinity' AS DOUBLE)", "CAST('NaN' AS DOUBLE)",
          "NULLIF(3, 3)", "abs(-2.5) * 2"]
# text one engine reads otherwise than the other (or than Python): not folded, so refused for free by DAWA
UNFOLDED = ["CAST('-nan' AS DOUBLE)", "CAST('+nan' AS DOUBLE)", "CAST('３' AS INTEGER)", "CAST('\u00a03' AS DOUBLE)",
            "CAST('1e1' AS INTEGER)"]


@pytest.mark.parametrize("column_type", ["BIGINT", "DOUBLE"])
def test_a_folded_constant_is_the_value_spark_compares_with(engines: Any, column_type: str) -> None:
    """``dpsql.plan.folding`` reads the value a binned column is compared with (``age = CAST(20.5 AS INTEGER)``
    keeps the bin of 21 only): on Spark the typed constant side, lowered as every query is, has that value too, so
    the kept bins are exactly where Spark's rows pass. A DOUBLE divided by zero is IEEE inf/NaN on both engines (the
    lowering's ``/``); a literal DECIMAL or DOUBLE converted to an integer was Spark's truncation (20, the bin of
    21 kept: its rows dropped), and text only DuckDB or Python reads ('-nan', '３') is not folded."""
    import math

    from dpsql.plan.folding import Unfoldable, folded_comparison
    from dpsql.plan.typer import type_predicate

    _, spark = engines
    subject = exp.column("c")
    sides, folded = [], []
    for const in FOLDED + UNFOLDED:
        other = sqlglot.parse_one(const, read="duckdb")
        typed_eq = type_predicate(exp.EQ(this=subject.copy(), expression=other.copy()), {"c": column_type})
        sides.append(typed_eq.expression if typed_eq.this.find(exp.Column) else typed_eq.this)
        try:
            folded.append(folded_comparison(subject, other, column_type))
        except Unfoldable:
            folded.append(Unfoldable)
    q = exp.select(exp.column("i"), *[exp.alias_(e, f"c{k}") for k, e in enumerate(sides)]).from_("v").where("i = 0")
    row = _rows(spark, q)[0]
    bad = [(c, f, row[f"c{k}"]) for k, (c, f) in enumerate(zip(FOLDED, folded))
           if f is Unfoldable or not (_same(f, row[f"c{k}"]) or (f is None and row[f"c{k}"] is None))]
    assert not bad, bad
    assert folded[len(FOLDED):] == [Unfoldable] * len(UNFOLDED)
    # not vacuous: DuckDB's rounding (21, not Spark's own 20) and IEEE division (inf, not NULL) are what Spark gives
    spark_of = {c: row[f"c{k}"] for k, c in enumerate(FOLDED)}
    assert spark_of["CAST(20.5 AS INTEGER)"] == 21 and spark_of["CAST(21.5e0 AS INTEGER)"] == 22
    assert spark_of["1/0"] == math.inf and math.isnan(spark_of["0/0"]) and spark_of["1 / CAST('-0.0' AS DOUBLE)"] == -math.inf
