"""A DOUBLE cast to text is spelled as DuckDB spells it on Spark (a released ``CAST(x AS VARCHAR)`` key).

Java 17's ``Double.toString`` (Spark's text) lays out '1.0E20' / '1.0E-5' where DuckDB writes '1e+20' /
'1e-05', and its digits are not always the fewest that read back ('9.999999999999999E22' for 1e23,
'4.9E-324' for the least subnormal, '2.82879384806159008E17'): compared here over the boundaries of
DuckDB's fixed and exponent layouts, every power of two (subnormals included), powers of ten and their
neighbours, -0.0, the extremes, inf and NaN, and random bit patterns.

Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

import math
import random
import struct
from typing import Any

import pyarrow as pa
import pytest
import sqlglot
from _spark import both_engines, columns_of, require_spark
from sqlglot import exp

import dpsql
from dpsql.plan.typer import Typer
from dpsql.testing import use_noise, zero_noise

require_spark()


def doubles() -> list[float | None]:
    vals: list[float] = [0.0, -0.0, 1.0, -1.0, 0.1, 0.001, 1e-4, 9.999999999999999e-05, 1e-5, 1e7, 12345678.0,
                         1e15, 999999999999999.9, 1e16, 9999999999999998.0, 1e23, 2e23, 8.41e21, 2.82879384806159e17,
                         5e-324, 1e-323, 2.2250738585072009e-308, 2.2250738585072014e-308, 1.7976931348623157e308,
                         123456789012345678.0, 0.30000000000000004, 1 / 3, 2.0**53 + 2, 2.0**63]
    vals += [s * 2.0**k for k in range(-1074, 1024, 7) for s in (1.0, -1.0)]
    for k in range(-323, 309, 3):
        v = float(f"1e{k}")
        vals += [v, math.nextafter(v, 0.0), math.nextafter(v, math.inf)]
    # REALs (as the FLOAT column holds them): '118955820' is the midpoint of two REALs, read back (to even) as
    # 118955824, which DuckDB does not write so
    vals += [118955824.0, 1462245.25]
    rng = random.Random(7)
    while len(vals) < 3000:
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(x):
            vals.append(x)
    return [*vals, math.inf, -math.inf, math.nan, None]


@pytest.fixture(scope="module")
def engines() -> Any:
    vals = doubles()
    yield from both_engines(pa.table({"i": pa.array(range(len(vals)), pa.int64()), "x": pa.array(vals, pa.float64()),
                                      "f": pa.array(vals, pa.float64()).cast(pa.float32(), safe=False)}))


def test_a_double_as_text_is_duckdbs_text(engines: Any) -> None:
    duck, spark = engines
    typed = Typer({"i": "BIGINT", "x": "DOUBLE"}).t(sqlglot.parse_one("SELECT CAST(x AS VARCHAR)", read="duckdb")
                                                   .expressions[0]).expr
    # a REAL (a FLOAT column, REAL arithmetic) too: DuckDB's shortest digits of the 32-bit value, where Java 17
    # writes '1.50323853E9' for 1503238500.0 and '3.4028235E38' for 3.4028235e+38
    real = Typer({"i": "BIGINT", "f": "FLOAT"}).t(sqlglot.parse_one("SELECT CAST(f * 1 AS VARCHAR)", read="duckdb")
                                                 .expressions[0]).expr
    # negative control (below): Spark's own text of the DOUBLE
    raw = exp.Cast(this=exp.column("x"), to=exp.DataType.build("STRING"))
    raw.meta["dpsql_dialect"] = "spark"
    # all of them in one query per engine (one Spark job: its fixed cost is most of a small query's time)
    (d, rd), (s, rs, native) = columns_of(duck, [typed, real]), columns_of(spark, [typed, real, raw])
    vals = doubles()
    bad = [(v, a, b) for v, a, b in zip(vals, d, s, strict=True) if a != b]
    assert not bad, bad[:10]
    bad = [(v, a, b) for v, a, b in zip(vals, rd, rs, strict=True) if a != b]
    assert not bad, bad[:10]
    assert rd[vals.index(1e23)] == "1e+23" and rd[vals.index(0.1)] == "0.1" and rd[vals.index(1e15)] == "1000000000000000.0"
    # DuckDB's text is the shortest that reads back (Python's repr), so the comparison is not vacuous
    assert d[vals.index(1e23)] == "1e+23" and d[vals.index(5e-324)] == "5e-324" and d[1] == "-0.0"
    assert d[vals.index(1e-5)] == "1e-05" and d[vals.index(1e16)] == "1e+16" and d[vals.index(1e15)] == "1000000000000000.0"
    assert d[-4:] == ["inf", "-inf", "nan", None]
    # negative control: Spark's own text differs
    assert native[vals.index(1e23)] == "9.999999999999999E22" != d[vals.index(1e23)]


def test_released_double_text_keys_are_the_same() -> None:
    """End to end with zero noise: ``GROUP BY CAST(x AS VARCHAR)`` releases DuckDB's spelling on both engines."""
    vals = [1e23, 5e-324, 1e-5, 12345678.0, -0.0, 2.82879384806159e17]
    n = 40 * len(vals)
    t = pa.table({"u": pa.array(range(n), pa.int64()), "x": pa.array([vals[i % len(vals)] for i in range(n)], pa.float64())})
    out = []
    for kind in ("duckdb", "spark"):
        s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0, 1e-3),
                          engine={"kind": kind, "keyed_hash": "portable"} if kind == "duckdb" else {"kind": kind})
        try:
            use_noise(s, zero_noise(3))
            s.register("t", t, privacy_unit="u")
            r = s.query("SELECT CAST(x AS VARCHAR) AS k, COUNT(*) AS n FROM t GROUP BY k", epsilon=1.0, delta=1e-5)
            out.append(sorted((row["k"], row["n"]) for row in r.table.to_pylist()))
        finally:
            s.close()
    assert out[0] == out[1] == sorted((repr(v), 40) for v in vals)
