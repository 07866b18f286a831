"""Hostile stored values on the Spark engine: neighbouring datasets (with and without one person's row), the same
query, the same observable outcome (it runs, with the same released values under zero noise).

A Parquet DECIMAL(p, s) stored as INT32 or INT64 (or an Arrow decimal) can hold an integer of more than p digits.
DuckDB's reader makes such a value NULL (``docs/threat_model.md``); Spark's reader kept it, and Spark's ANSI
arithmetic checks every DECIMAL result against its precision: ``x * x``, ``-x``, ``floor(x)`` and
``COUNT(DISTINCT x)`` raised after the charge exactly when one person's row held such a value. Spark tests are
skipped (with the reason) without pyspark and Java, as the other Spark test files.
"""

from __future__ import annotations

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


def _over_precision(values: list[int], p: int, s: int) -> pa.Array:
    """decimal128(p, s) holding these stored integers, beyond the declared precision where asked."""
    raw = b"".join(v.to_bytes(16, "little", signed=True) for v in values)
    return pa.Array.from_buffers(pa.decimal128(p, s), len(values), [None, pa.py_buffer(raw)])


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


@pytest.mark.xfail(strict=True, reason=(
    "not fixed: a Parquet DECIMAL(36, s) to DECIMAL(38, s) is stored in a FIXED_LEN_BYTE_ARRAY of 16 bytes, which "
    "holds 39 digits, more than any Spark DECIMAL; Spark's reader raises (Decimal precision exceeds its declared "
    "precision) on such a value whatever reads the column, `x IS NULL` included, so every query reading the column "
    "fails after its charge exactly when one person's row holds one. A fix needs a reader that yields the stored "
    "bytes (or refusing such columns at registration, from the footer: every DECIMAL(36) to DECIMAL(38) column)"))
def test_a_38_digit_parquet_decimal_beyond_its_precision_does_not_fail_a_spark_query(
        spark: dpsql.Session, tmp_path: Path) -> None:
    names = _wide(tmp_path, spark, "w38", 38, 0, 2**127 - 1)  # 39 digits
    sql = WIDE_SQL.replace("{twice}", str(2 * (10**37 + 7)))
    base = _outcome(spark, sql.format(t=names[0]))
    assert base[0] == "ok", base  # the legitimate values are read
    assert _outcome(spark, sql.format(t=names[1])) == ("ok", [{"c": base[1][0]["c"] + 1}])
