"""Hostile data and queries on the Spark engine: what the analyst observes (whether a query fails,
the error, the released keys) depends on public metadata and released values only, as on DuckDB.

Each test runs a query on neighbouring datasets (with and without one person's hostile row) and
checks that the outcome's form is the same, with a negative control showing that the hazard is
real (Spark itself raises, or the value is really there). One dpsql Session on Spark (local[2]) is
shared by the whole module. Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import require_spark

import dpsql
from dpsql.errors import ConfigError, DPSQLError, ExecutionError
from dpsql.testing import use_noise, zero_noise

require_spark()

SENTINEL = "zq-sentinel-4417"
N = 60  # people in every table: enough for a key held by all of them to pass the threshold
_names = itertools.count()


@pytest.fixture(scope="module")
def spark() -> Any:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), engine={"kind": "spark", "statement_timeout": 300})
    use_noise(s, zero_noise(17))
    yield s
    s.close()


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adv-lake")


def register(s: dpsql.Session, lake: Path, table: pa.Table, **kw: Any) -> str:
    """``table`` as a Parquet file registered under a fresh name (privacy unit ``uid``)."""
    name = f"t{next(_names)}"
    pq.write_table(table, lake / f"{name}.parquet")
    s.register(name, str(lake / f"{name}.parquet"), privacy_unit="uid", **kw)
    return name


def outcome(s: dpsql.Session, sql: str, epsilon: float = 1.0) -> tuple[str, Any]:
    """("ok", released rows) or ("error", the exception's class and text)."""
    try:
        return "ok", s.query(sql, epsilon=epsilon, delta=1e-5).table.to_pylist()
    except DPSQLError as e:
        return "error", (type(e).__name__, str(e))


def people(column: str, values: list[Any], typ: pa.DataType, extra: list[Any] = ()) -> pa.Table:  # type: ignore[assignment]
    vals = list(values) + list(extra)
    return pa.table({"uid": pa.array(range(len(vals)), pa.int64()), column: pa.array(vals, typ)})


# -- integer arithmetic in HUGEINT: Spark's DECIMAL(38,0) holds +-(10^38 - 1), DuckDB's HUGEINT 2^127 ----------


ORACLE = ("SELECT COUNT(*) AS c FROM {t} WHERE (CASE WHEN uid = 3 AND a = {guess} THEN 9000000000000000000 "
          "ELSE 0 END) * 15000000000000000000 > 0")


def test_computed_hugeint_cannot_overflow_on_spark(spark: dpsql.Session, lake: Path) -> None:
    # the product lies in (10^38, 2^127): HUGEINT on DuckDB, but Spark's DECIMAL(38,0) raises on it
    # in ANSI mode. Before the fix, the query failed exactly when person 3's row matched the guess
    # (and ran when it did not): an oracle on any predicate over one person's row.
    t = register(spark, lake, people("a", [30 + i % 5 for i in range(N)], pa.int64()))
    assert outcome(spark, ORACLE.format(t=t, guess=33)) == ("ok", [{"c": 1}])  # zero noise: the condition ran
    # the value beyond DECIMAL(38,0) is real: Spark itself raises on it
    with pytest.raises(Exception, match="NUMERIC_VALUE_OUT_OF_RANGE|(?i:overflow)"):
        spark._engine.spark.sql("SELECT CAST(9000000000000000000 AS DECIMAL(38,0)) * "
                                "CAST(15000000000000000000 AS DECIMAL(38,0)) AS p").collect()
    # BIGINT * BIGINT (at most 2^126 < 10^38) is still computed exactly in HUGEINT on both engines
    big = 2**62 + 1
    t = register(spark, lake, people("a", [big] * N, pa.int64()))
    assert outcome(spark, f"SELECT COUNT(*) AS c FROM {t} WHERE a * a = {big * big} AND a * a <> {big * big + 1}") \
        == ("ok", [{"c": N}])


# -- negation and abs() of a wide DECIMAL: Spark rounds them to 34 digits, and can overflow -----------------


def test_negating_a_wide_decimal_is_exact_and_total(spark: dpsql.Session, lake: Path) -> None:
    import decimal

    top = decimal.Decimal("9" * 38)  # the greatest DECIMAL(38,0): Spark's -x rounds it to -10^38 and raises
    odd = decimal.Decimal("12345678901234567890123456789012345678")  # 38 digits: Spark's -x rounds it
    t = register(spark, lake, people("amt", [decimal.Decimal(i % 5) for i in range(N)], pa.decimal128(38, 0),
                                     extra=[top, odd]))
    # every operation runs on every row (each condition holds for every value, so none is skipped)
    every = "-amt < 1 AND abs(amt) >= 0 AND ceil(amt) > -1e39 AND floor(amt) < 1e39"
    assert outcome(spark, f"SELECT COUNT(*) AS c FROM {t} WHERE {every}") == ("ok", [{"c": N + 2}])
    # exact: the negated 38-digit values are found by equality, on Spark as on DuckDB
    assert outcome(spark, f"SELECT COUNT(*) AS c FROM {t} WHERE -amt = -{odd} OR abs(-amt) = {top}") == ("ok", [{"c": 2}])
    # negative control: Spark's own negation of that value raises in ANSI mode
    with pytest.raises(Exception, match="NUMERIC_VALUE_OUT_OF_RANGE"):
        spark._engine.spark.sql(f"SELECT -amt AS y FROM {spark.tables[t].view}").collect()


def test_negating_a_wide_decimal_with_a_scale(spark: dpsql.Session, lake: Path) -> None:
    import decimal

    v = decimal.Decimal("-" + "9" * 29 + "." + "9" * 9)  # DECIMAL(38,9): Spark's -x rounds it up and raises
    w = decimal.Decimal("12345678901234567890123456789.123456789")
    t = register(spark, lake, people("x", [decimal.Decimal("1.5")] * N, pa.decimal128(38, 9), extra=[v, w]))
    assert outcome(spark, f"SELECT COUNT(*) AS c FROM {t} WHERE -x = {-v} OR -x = -{w}") == ("ok", [{"c": 2}])
    assert outcome(spark, f"SELECT abs(x) AS k, COUNT(*) AS c FROM {t} GROUP BY abs(x)") == (
        "ok", [{"k": decimal.Decimal("1.500000000"), "c": N}])


# -- text that is not valid UTF-8 -------------------------------------------------------------------------------


def test_invalid_utf8_text_is_null_as_on_duckdb(spark: dpsql.Session, lake: Path) -> None:
    # Spark keeps invalid bytes; before, the released key was spelled mangled (b'x\xff\xfey' came out
    # as 'x' after the driver's post-processing) and `to_pylist()` of Spark's own result raised
    raw = [b"aaa"] * N + [b"x\xff\xfey"] * N
    t = register(spark, lake, pa.table({"uid": pa.array(range(len(raw)), pa.int64()),
                                        "k": pa.array(raw, pa.binary()).view(pa.string())}))
    status, rows = outcome(spark, f"SELECT k, COUNT(*) AS c FROM {t} GROUP BY k")
    assert status == "ok"
    assert sorted(rows, key=repr) == sorted([{"k": "aaa", "c": N}, {"k": None, "c": N}], key=repr)
    assert outcome(spark, f"SELECT COUNT(*) AS c FROM {t} WHERE k LIKE '%y'") == ("ok", [{"c": 0}])
    # negative control: the bytes are in the file, and Spark reads them as they are
    seen = spark._engine.spark.read.parquet(str(lake / f"{t}.parquet")).toArrow().column("k").cast(pa.binary())
    assert b"x\xff\xfey" in seen.to_pylist()


# -- Parquet timestamps stored in milliseconds -------------------------------------------------------------------


def test_millisecond_timestamps_beyond_the_range_are_null(spark: dpsql.Session, lake: Path) -> None:
    # Spark's reader converts milliseconds to microseconds with an exact multiplication: one stored
    # value beyond +-2^63 microseconds made every query reading the column fail (after the charge)
    import datetime as dt

    ms = 1704164645678  # 2024-01-02 03:04:05.678
    hostile = people("x", [ms] * N + [-(10**18)], pa.int64())
    hostile = hostile.set_column(1, "x", hostile.column("x").cast(pa.timestamp("ms")))
    t1 = register(spark, lake, hostile)
    assert outcome(spark, f"SELECT COUNT(*) AS c FROM {t1} WHERE x > '2024-01-02 03:04:05.677' OR x IS NULL") \
        == ("ok", [{"c": N + 1}])
    assert outcome(spark, f"SELECT date_trunc('second', x) AS k, COUNT(*) AS c FROM {t1} GROUP BY date_trunc('second', x)") \
        == ("ok", [{"k": dt.datetime(2024, 1, 2, 3, 4, 5), "c": N}])
    # negative control: Spark's own reader raises on the file
    with pytest.raises(Exception, match="FAILED_READ_FILE|ArithmeticException|overflow"):
        spark._engine.spark.read.parquet(str(lake / f"{t1}.parquet")).collect()


def test_millisecond_and_microsecond_files_of_one_column_are_refused(spark: dpsql.Session, lake: Path) -> None:
    d = lake / "mixed-units"
    d.mkdir()
    for unit in ("ms", "us"):
        t = people("x", [1704164645678] * 3, pa.int64())
        pq.write_table(t.set_column(1, "x", t.column("x").cast(pa.timestamp("ms")).cast(pa.timestamp(unit))),
                       d / f"part-{unit}.parquet")
    with pytest.raises(ConfigError, match="milliseconds in some files"):
        spark.register("mixed_units", str(d / "part-*.parquet"), privacy_unit="uid")


# -- a failure on Spark after the charge: charged once, recorded, the one generic error, no value anywhere ------------


def test_a_spark_failure_charges_once_and_says_nothing(spark: dpsql.Session, lake: Path,
                                                       capfd: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # a file that vanishes during the read (after the check before the charge, which refuses a file gone
    # for free: tests/test_spark_replaced_sources.py) makes Spark fail while reading (FileNotFound, whose
    # message names the file and Spark would log it): the run is charged once, marked failed, the
    # earlier entries stay as they were, and neither the error nor the output carries the value
    from dpsql.engine.spark import SparkBackend

    t = register(spark, lake, people("url", [SENTINEL] * N, pa.string()))
    assert outcome(spark, f"SELECT COUNT(*) AS c FROM {t} WHERE url = '{SENTINEL}'") == ("ok", [{"c": N}])
    before, left = spark.history().to_pylist(), spark.remaining()
    checked = SparkBackend._read_files

    def then_gone(self: SparkBackend, sql: str) -> Any:
        out = checked(self, sql)
        (lake / f"{t}.parquet").unlink()
        return out

    monkeypatch.setattr(SparkBackend, "_read_files", then_gone)
    capfd.readouterr()
    with pytest.raises(ExecutionError) as info:
        spark.query(f"SELECT url, COUNT(*) AS c FROM {t} GROUP BY url", epsilon=0.5, delta=1e-5)
    err = info.value
    assert "withheld" in str(err) and SENTINEL not in str(err) and t not in str(err)
    assert err.__cause__ is None and err.__suppress_context__ and err.debug_detail is None
    ctx = err.__context__
    while ctx is not None:  # whatever is chained is withheld
        assert ctx.args == ("<withheld>",), ctx.args
        ctx = ctx.__context__
    out, errs = capfd.readouterr()
    assert SENTINEL not in out + errs and f"{t}.parquet" not in out + errs
    after = spark.history().to_pylist()
    assert after[:len(before)] == before and len(after) == len(before) + 1
    assert after[-1]["status"] == "failed" and after[-1]["epsilon"] == 0.5
    assert after[-1]["failure_reason"] is not None and SENTINEL not in after[-1]["failure_reason"]
    assert spark.remaining().epsilon == pytest.approx(left.epsilon - 0.5, abs=1e-12)


# -- files of one source that disagree on a column's type ----------------------------------------------------------


def test_files_that_disagree_on_a_type_are_refused_at_registration(spark: dpsql.Session, lake: Path) -> None:
    # Spark takes the schema from one file and raises while reading another whose column has another
    # type: before, a query reading the column failed after its charge because of one person's file
    d = lake / "disagree"
    d.mkdir()
    pq.write_table(people("x", [5] * N, pa.int64()), d / "a.parquet")
    pq.write_table(pa.table({"uid": pa.array([N + 1], pa.int64()), "x": pa.array([SENTINEL])}), d / "b.parquet")
    with pytest.raises(ConfigError, match="disagree") as info:
        spark.register("disagree", str(d / "*.parquet"), privacy_unit="uid")
    assert SENTINEL not in str(info.value)
    # negative control: Spark's own read of the two files fails on the values, not the footers
    with pytest.raises(Exception, match="FAILED_READ_FILE|PARQUET_COLUMN_DATA_TYPE_MISMATCH"):
        spark._engine.spark.read.parquet(str(d / "a.parquet"), str(d / "b.parquet")).where("x > 1").collect()
    # widening Spark reads totally (INT32 in one file, BIGINT in the other) and a column of NULLs stay allowed
    w = lake / "widen"
    w.mkdir()
    pq.write_table(people("x", [5] * N, pa.int64()), w / "a.parquet")
    pq.write_table(pa.table({"uid": pa.array([N + 1], pa.int64()), "x": pa.array([7], pa.int32())}), w / "b.parquet")
    pq.write_table(pa.table({"uid": pa.array([N + 2], pa.int64()), "x": pa.array([None], pa.null())}), w / "c.parquet")
    spark.register("widen", str(w / "*.parquet"), privacy_unit="uid")
    assert outcome(spark, "SELECT COUNT(*) AS c FROM widen WHERE x > 1") == ("ok", [{"c": N + 1}])


# -- the caller's SparkSession settings ----------------------------------------------------------------------------


def test_settings_the_callers_session_was_started_with_do_not_change_dpsql_sql(spark: dpsql.Session, lake: Path) -> None:
    # ``newSession()`` inherits the options a SparkSession was built with (spark-defaults.conf, the
    # builder's .config(...)): a caller's session with ANSI's reserved keywords enforced made every
    # query with a SUM, a COUNT(DISTINCT ..) or a cast to text fail to parse (QueryTypeError on Spark
    # only); dpsql's session now sets the parser options it relies on
    from pyspark.sql import SparkSession

    base = spark._engine.spark
    jvm = base._jvm
    opts = jvm.java.util.HashMap()
    for k in ("spark.sql.ansi.enforceReservedKeywords", "spark.sql.ansi.doubleQuotedIdentifiers"):
        opts.put(k, "true")
    caller = SparkSession(base.sparkContext, jsparkSession=jvm.org.apache.spark.sql.classic.SparkSession(
        base._jsc.sc(), opts))
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5), engine="spark", spark=caller)
    try:
        # negative control: dpsql's session would inherit the caller's option
        assert caller.newSession().conf.get("spark.sql.ansi.enforceReservedKeywords") == "true"
        use_noise(s, zero_noise(3))
        t = register(s, lake, pa.table({"uid": pa.array(range(N), pa.int64()),
                                        "k": pa.array(["a", "b"] * (N // 2)),
                                        "x": pa.array([1.5] * N)}), max_groups_per_unit=1,
                     columns={"x": {"bounds": (0, 2)}})
        assert outcome(s, f"SELECT k, COUNT(*) AS c, SUM(x) AS s FROM {t} GROUP BY k") == \
            ("ok", [{"k": "a", "c": N // 2, "s": 1.5 * N / 2}, {"k": "b", "c": N // 2, "s": 1.5 * N / 2}])
        assert outcome(s, f"SELECT COUNT(DISTINCT k) AS c FROM {t}") == ("ok", [{"c": 2}])
    finally:
        s.close()


def test_a_column_whose_lower_case_is_longer_is_reached_on_spark_as_on_duckdb() -> None:
    """'İd'.lower() is 'i̇d' (one letter more): the catalog and the queries spell it so, and Spark's
    case-insensitive match (letter by letter) never paired it with the view's 'İd': every query
    naming it was refused on Spark only. Spark's views now expose the catalog's names, as DuckDB's."""
    t = pa.table({"uid": list(range(60)), "İd": ["x", "y", "z"] * 20, "Maß": [1.0] * 60})
    got = []
    for kind in ("duckdb", "spark"):
        with dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"kind": kind}) as s:
            use_noise(s, zero_noise())
            s.register("ev", t, privacy_unit="uid", max_groups_per_unit=1,
                       columns={"İd": {"domain": ["x", "y", "z"]}, "Maß": {"bounds": (0, 2)}})
            got.append([sorted(map(repr, s.query(q, epsilon=1.0, delta=1e-6).to_pylist())) for q in (
                'SELECT "İd", COUNT(*) AS n, SUM("Maß") AS s FROM ev GROUP BY "İd"',
                "SELECT COUNT(*) AS n FROM ev WHERE \"İd\" = 'x' AND maß > 0")])
    assert got[0] == got[1]
    assert got[0][0] == sorted(repr({"İd": k, "n": 20, "s": 20.0}) for k in "xyz") and got[0][1] == [repr({"n": 20})]
