"""Hostile stored values on the Spark engine: neighbouring datasets (with and without one person's row), the same
query, the same observable outcome (it runs, with the same released values under zero noise).

A Parquet DECIMAL(p, s) stored as INT32 or INT64 (or an Arrow decimal) can hold an integer of more than p digits.
DuckDB's reader makes such a value NULL (``docs/threat_model.md``); Spark's reader kept it, and Spark's ANSI
arithmetic checks every DECIMAL result against its precision: ``x * x``, ``-x``, ``floor(x)`` and
``COUNT(DISTINCT x)`` raised after the charge exactly when one person's row held such a value. Spark tests are
skipped (with the reason) without pyspark and Java, as the other Spark test files.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import require_spark

import dpsql
from dpsql.errors import DPSQLError
from dpsql.testing import use_noise, zero_noise

N = 30  # people in the neighbouring datasets


def _over_precision(values: list[int] | list[int | None], p: int, s: int) -> pa.Array:
    """decimal128(p, s) holding these stored integers (None: NULL), beyond the declared precision where asked."""
    valid = [v is not None for v in values]
    raw = b"".join((v or 0).to_bytes(16, "little", signed=True) for v in values)
    mask = None if all(valid) else pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(pa.decimal128(p, s), len(values), [mask, pa.py_buffer(raw)],
                                 null_count=valid.count(False))


def _decimals(hostile: bool) -> pa.Table:
    """x DECIMAL(4,2) stored as INT32, y DECIMAL(12,0) stored as INT64; the hostile person stores 32767 (327.67,
    five digits) and 10^15 (sixteen digits)."""
    xs, ys = [25 * i for i in range(N)], [1000 * i for i in range(N)]
    if hostile:
        xs, ys = xs + [32767], ys + [10**15]
    return pa.table({"uid": pa.array(range(len(xs)), pa.int64()), "x": _over_precision(xs, 4, 2),
                     "y": _over_precision(ys, 12, 0)})


@pytest.fixture(scope="module")
def spark() -> Iterator[dpsql.Session]:
    require_spark()
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), engine={"kind": "spark", "statement_timeout": 300})
    use_noise(s, zero_noise(38))
    yield s
    s.close()


@pytest.fixture(scope="module")
def decimal_files(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, str]:
    d = tmp_path_factory.mktemp("round38")
    out = {}
    for hostile in (False, True):
        path = str(d / f"dec_{hostile}.parquet")
        pq.write_table(_decimals(hostile), path, store_decimal_as_integer=True)
        out[hostile] = path
    return out


def _outcome(s: dpsql.Session, sql: str) -> tuple[str, Any]:
    try:
        return "ok", s.query(sql, epsilon=1.0, delta=1e-5).table.to_pylist()
    except DPSQLError as e:
        return "error", (type(e).__name__, str(e))


DECIMAL_QUERIES = [
    "SELECT COUNT(*) AS c FROM {t} WHERE x * x > 0 OR -y < 0",
    "SELECT COUNT(*) AS c FROM {t} WHERE floor(x) + y > 1",
    "SELECT COUNT(DISTINCT x) AS c FROM {t}",
]


def test_a_parquet_decimal_beyond_its_precision_is_null_on_spark(spark: dpsql.Session,
                                                                  decimal_files: dict[bool, str]) -> None:
    # the stored values really exceed the declared precision (pyarrow reads them back as they are)
    back = pq.read_table(decimal_files[True])
    assert str(back.column("x")[N].as_py()) == "327.67" and back.schema.field("x").type == pa.decimal128(4, 2)
    assert pq.ParquetFile(decimal_files[True]).schema.column(1).physical_type == "INT32"
    # negative control: Spark itself raises on the hostile row's arithmetic (ANSI mode checks the precision)
    with pytest.raises(Exception, match="(?i)NUMERIC_VALUE_OUT_OF_RANGE|overflow|precision"):
        spark._engine.spark.read.parquet(decimal_files[True]).selectExpr("x * x AS p").collect()
    for hostile, path in decimal_files.items():
        spark.register(f"dec_{int(hostile)}", path, privacy_unit="uid")
    for sql in DECIMAL_QUERIES:
        base = _outcome(spark, sql.format(t="dec_0"))
        assert base[0] == "ok", (sql, base)
        # zero noise: the hostile person's values are NULL, as DuckDB reads them, so every count is the base one
        assert _outcome(spark, sql.format(t="dec_1")) == base, sql


def test_duckdb_reads_the_same_decimals_as_null(decimal_files: dict[bool, str]) -> None:
    """The DuckDB engine's reading, which the Spark engine now matches (and the counts the Spark test expects)."""
    with dpsql.Session(budget=dpsql.Budget(1e6, 0.5)) as s:
        use_noise(s, zero_noise(38))
        for hostile, path in decimal_files.items():
            s.register(f"dec_{int(hostile)}", path, privacy_unit="uid")
        for sql in DECIMAL_QUERIES:
            base = _outcome(s, sql.format(t="dec_0"))
            assert base[0] == "ok", (sql, base)
            assert _outcome(s, sql.format(t="dec_1")) == base, sql



def _wide(tmp_path: Path, spark: dpsql.Session, name: str, p: int, s: int, bad: int) -> list[str]:
    """Two registered tables (without and with a person whose stored ``a`` is ``bad``) of a DECIMAL(p, s) column
    ``a`` stored as a FIXED_LEN_BYTE_ARRAY; person N - 1 holds 10^(p - s - 1) + 7, a legitimate value of p digits."""
    names = []
    for hostile in (False, True):
        a = list(range(N - 1)) + [10 ** (p - 1) + 7 * 10**s] + ([bad] if hostile else [])
        path = tmp_path / f"{name}_{hostile}.parquet"
        pq.write_table(pa.table({"uid": pa.array(range(len(a)), pa.int64()), "a": _over_precision(a, p, s)}), path)
        assert pq.ParquetFile(path).schema.column(1).physical_type == "FIXED_LEN_BYTE_ARRAY"
        spark.register(f"{name}_{int(hostile)}", str(path), privacy_unit="uid")
        names.append(f"{name}_{int(hostile)}")
    return names


WIDE_SQL = "SELECT COUNT(*) AS c FROM {t} WHERE a IS NULL OR a > 3 OR a * 2 = {twice}"


@pytest.mark.parametrize(("p", "s", "bad"), [
    (20, 0, 2**71 - 1),  # 22 digits, the most its 9 bytes hold
    (30, 4, -(2**103)),  # 31 digits in 13 bytes
    (35, 0, 2**119 - 1),  # 36 digits in 15 bytes
])
def test_a_wide_parquet_decimal_beyond_its_precision_is_null_on_spark(spark: dpsql.Session, tmp_path: Path,
                                                                       p: int, s: int, bad: int) -> None:
    # Spark's reader raised on such a value whatever read the column (x IS NULL too): every query reading it
    # failed after its charge exactly when one person's row held one; now the column is read as DECIMAL(38, s)
    names = _wide(tmp_path, spark, f"w{p}", p, s, bad)
    big = 10 ** (p - s - 1) + 7  # the legitimate p-digit value, exactly
    sql = WIDE_SQL.replace("{twice}", str(2 * big))
    base = _outcome(spark, sql.format(t=names[0]))
    assert base[0] == "ok", base
    assert _outcome(spark, sql.format(t=names[1])) == ("ok", [{"c": base[1][0]["c"] + 1}])  # the value as NULL
    assert _outcome(spark, f"SELECT COUNT(*) AS c FROM {names[1]} WHERE a = {big}") == ("ok", [{"c": 1}])


def _view(s: dpsql.Session, name: str) -> str:
    """The registered table's private relation (its engine's view)."""
    spec = s._catalog.get(name)
    assert spec is not None and spec.view is not None
    return spec.view


@pytest.mark.parametrize(("p", "s", "bad"), [
    (38, 0, 2**127 - 1),  # 39 digits, the most its 16 bytes hold
    (38, 0, -(2**127)),  # the least
    (38, 10, -(10**38)),  # one beyond the least legitimate value
    (36, 2, 10**36),  # 37 digits in the 16 bytes of a DECIMAL(36)
])
def test_a_38_digit_parquet_decimal_beyond_its_precision_does_not_fail_a_spark_query(
        spark: dpsql.Session, tmp_path: Path, p: int, s: int, bad: int) -> None:
    # Spark's reader raised on such a value whatever read the column (x IS NULL too), and 16 bytes hold more
    # than any Spark DECIMAL: the column is read as its stored bytes and converted exactly, NULL beyond p digits
    names = _wide(tmp_path, spark, f"w{p}_{s}_{int(bad < 0)}", p, s, bad)
    big = 10 ** (p - s - 1) + 7
    sql = WIDE_SQL.replace("{twice}", str(2 * big))
    base = _outcome(spark, sql.format(t=names[0]))
    assert base[0] == "ok", base  # the legitimate values are read
    assert _outcome(spark, sql.format(t=names[1])) == ("ok", [{"c": base[1][0]["c"] + 1}])  # the value as NULL
    assert _outcome(spark, f"SELECT COUNT(*) AS c FROM {names[1]} WHERE a = {big}") == ("ok", [{"c": 1}])
    # the analyst's relation keeps the declared type (the column is read as bytes underneath)
    view = spark._engine.spark.table(_view(spark, names[1]))
    assert view.schema["a"].dataType.simpleString() == f"decimal({p},{s})"
    raw = spark._engine.spark.table(_view(spark, names[1]) + "_raw")
    assert raw.schema["a"].dataType.simpleString() == "binary"


def _sixteen_bytes(p: int) -> list[int | None]:
    """Stored integers of a 16-byte DECIMAL(p): the extremes +-(10^p - 1), the integers around the 8-byte halves'
    boundaries (2^63, 2^64), NULL, and one beyond +-(10^p - 1), 2^127 - 1 and -2^127 (the last four NULL when read)."""
    top = 10**p - 1
    near = [0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, 2**96 + 5, top // 3, 10 ** (p - 1)]
    return [top, -top, None, *near, *(-v for v in near[3:]), top + 1, -(top + 1), 2**127 - 1, -(2**127)]


def _read(stored: list[int | None], p: int, s: int) -> list[decimal.Decimal | None]:
    """How DuckDB's reader reads them: the exact value, NULL beyond p digits."""
    return [None if v is None or abs(v) >= 10**p else decimal.Decimal(f"{v}E-{s}") for v in stored]


SIXTEEN = [(38, 0), (38, 10), (37, 37)]


@pytest.fixture(scope="module")
def sixteen_byte_files(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int, bool], str]:
    d = tmp_path_factory.mktemp("round38_16")
    out = {}
    for p, s in SIXTEEN:
        for dictionary in (False, True):
            a = _sixteen_bytes(p)
            path = str(d / f"d{p}_{s}_{dictionary}.parquet")
            pq.write_table(pa.table({"uid": pa.array(range(len(a)), pa.int64()), "a": _over_precision(a, p, s)}),
                           path, use_dictionary=dictionary)
            assert pq.ParquetFile(path).schema.column(1).length == 16
            out[(p, s, dictionary)] = path
    return out


def test_a_16_byte_parquet_decimal_reads_exactly_on_spark_as_on_duckdb(
        spark: dpsql.Session, sixteen_byte_files: dict[tuple[int, int, bool], str]) -> None:
    with dpsql.Session(budget=dpsql.Budget(1e6, 0.5)) as duck:
        for (p, s, dictionary), path in sixteen_byte_files.items():
            want = _read(_sixteen_bytes(p), p, s)
            assert sum(v is None for v in want) == 5  # NULL and the four beyond p digits
            name = f"x{p}_{s}_{int(dictionary)}"
            for sess in (spark, duck):
                sess.register(name, path, privacy_unit="uid")
            view = spark._engine.spark.table(_view(spark, name))
            assert view.schema["a"].dataType.simpleString() == f"decimal({p},{s})"
            got = {r["uid"]: r["a"] for r in view.collect()}
            assert [got[i] for i in range(len(want))] == want, (p, s, dictionary)
            on_duck = duck._engine._con.execute(f"SELECT a FROM {_view(duck, name)} ORDER BY uid").fetchall()
            assert [r[0] for r in on_duck] == want, (p, s, dictionary)


SIXTEEN_QUERIES = [
    "SELECT COUNT(*) AS c FROM {t} WHERE a IS NULL",
    "SELECT COUNT(*) AS c FROM {t} WHERE a > 0",
    "SELECT COUNT(*) AS c FROM {t} WHERE a = {top} OR a = -{top}",
    "SELECT COUNT(*) AS c FROM {t} WHERE a BETWEEN -{half} AND {half}",
    "SELECT COUNT(DISTINCT a) AS c FROM {t}",
]


def test_zero_noise_queries_over_a_16_byte_decimal_release_the_same_on_both_engines(
        spark: dpsql.Session, sixteen_byte_files: dict[tuple[int, int, bool], str]) -> None:
    """Over the dictionary-encoded files (pyarrow's default): Spark reads a 16-byte DECIMAL as its bytes, so no
    predicate on the value reaches the Parquet reader, and the encoding changes only the bytes the scan reads,
    which the test above checks exactly for both encodings."""
    with dpsql.Session(budget=dpsql.Budget(1e6, 0.5)) as duck:
        use_noise(duck, zero_noise(38))
        for (p, s, dictionary), path in sixteen_byte_files.items():
            if not dictionary:
                continue
            name = f"z{p}_{s}_{int(dictionary)}"
            for sess in (spark, duck):
                sess.register(name, path, privacy_unit="uid")
            raw = spark._engine.spark.table(_view(spark, name) + "_raw")
            assert raw.schema["a"].dataType.simpleString() == "binary"  # read as its bytes, converted by the view
            top, half = (str(decimal.Decimal(f"{v}E-{s}")) for v in (10**p - 1, 2**64))
            for sql in SIXTEEN_QUERIES:
                q = sql.format(t=name, top=top, half=half)
                on_duck = _outcome(duck, q)
                assert on_duck[0] == "ok", (q, on_duck)
                assert _outcome(spark, q) == on_duck, q


@pytest.mark.parametrize("vectorized_nested", ["true", "false"])
def test_a_wide_decimal_beside_nested_columns_is_null_beyond_its_precision_on_spark(
        spark: dpsql.Session, tmp_path: Path, vectorized_nested: str) -> None:
    """In a table with a nested column, a wide DECIMAL in at most 15 bytes too is read as its bytes: Spark's
    row-based reader, which reads such a table where the owner turns the vectorized reading of nested columns
    off, checked the declared precision when reading it as DECIMAL(38, s), and raised."""
    conf = spark._engine.spark.conf
    was = conf.get("spark.sql.parquet.enableNestedColumnVectorizedReader")
    conf.set("spark.sql.parquet.enableNestedColumnVectorizedReader", vectorized_nested)
    try:
        b30 = list(range(N - 1)) + [2**103 - 1, None]  # 31 digits in the 13 bytes of a DECIMAL(30, 4)
        b38 = list(range(N - 1)) + [-(10**38 - 1), -(2**127)]
        names = []
        for hostile in (False, True):
            n = N + 1 if hostile else N
            table = pa.table({"uid": pa.array(range(n), pa.int64()), "a": _over_precision(b30[:n], 30, 4),
                              "b": _over_precision(b38[:n], 38, 0), "st": pa.array([{"k": i} for i in range(n)])})
            path = tmp_path / f"nested_{hostile}.parquet"
            pq.write_table(table, path)
            names.append(f"nest_{vectorized_nested}_{int(hostile)}")
            spark.register(names[-1], str(path), privacy_unit="uid")
        sql = "SELECT COUNT(*) AS c FROM {t} WHERE a IS NULL OR b IS NULL OR a > 2 OR b < -5"
        base = _outcome(spark, sql.format(t=names[0]))
        assert base[0] == "ok", base
        assert _outcome(spark, sql.format(t=names[1])) == ("ok", [{"c": base[1][0]["c"] + 1}])
        got = {r["uid"]: (r["a"], r["b"]) for r in spark._engine.spark.table(_view(spark, names[1])).collect()}
        assert got[N - 1] == (None, decimal.Decimal(-(10**38 - 1))) and got[N] == (None, None)
        assert got[3] == (decimal.Decimal("0.0003"), decimal.Decimal(3))
    finally:
        conf.set("spark.sql.parquet.enableNestedColumnVectorizedReader", was)


@pytest.mark.parametrize(("length", "p", "s"), [(9, 20, 3), (13, 30, 0), (15, 38, 38), (16, 38, 0), (16, 36, 5),
                                                (20, 38, 2)])
def test_the_conversion_of_stored_bytes_is_exact_for_every_length(spark: dpsql.Session, length: int, p: int,
                                                                   s: int) -> None:
    """The view's conversion of a DECIMAL's stored bytes, over random integers of every size the bytes hold and
    the edges (+-(10^p - 1) and one beyond, the bytes' own extremes, the 8-byte halves' boundaries): exactly the
    value, NULL beyond p digits; a FIXED_LEN_BYTE_ARRAY of 20 bytes too (a writer may use more than 16)."""
    import random

    from sqlglot import exp

    from dpsql.engine.spark import SPARK, _decimal_from_bytes
    from dpsql.rewrite.render import render

    rng = random.Random(38 * length + p)
    most = 2 ** (8 * length - 1)
    top = 10**p - 1
    edges = [0, 1, -1, top, -top, top + 1, -top - 1, most - 1, -most, 2**63, -(2**63), 2**64, -(2**64), 2**64 - 1]
    stored = [v for v in edges if -most <= v < most]
    stored += [rng.randrange(-(2**bits), 2**bits) for bits in range(1, 8 * length) for _ in range(8)]
    rows = [(i, v.to_bytes(length, "big", signed=True)) for i, v in enumerate(stored)] + [(len(stored), None)]
    df = spark._engine.spark.createDataFrame(rows, "i bigint, b binary")
    df.createOrReplaceTempView("stored_bytes")
    sql = render(exp.select(exp.alias_(_decimal_from_bytes(exp.column("b", quoted=True), p, s, length), "d"), "i")
                 .from_("stored_bytes"), dialect=SPARK)
    got = {r["i"]: r["d"] for r in spark._engine.spark.sql(sql).collect()}
    want = [*_read(stored, p, s), None]
    assert [got[i] for i in range(len(want))] == want
    assert any(w is None for w in want[:-1]) == (top < most)  # beyond p digits where the bytes hold more
