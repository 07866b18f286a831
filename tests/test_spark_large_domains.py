"""A GROUP BY over a long declared key domain on Spark: the domain is a temporary view registered for the query
(``dpsql.rewrite.bound.domain_rows``) instead of literals in the SQL, and the release is DuckDB's, bit for bit, at
zero noise (keys, order, types, values); the views are gone after each query. The SQL's shape (no literal of the
domain, a length independent of it) is pinned without Spark in ``tests/test_spark_lowering.py``. Skipped (with the
reason) without pyspark/Java."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal as D
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _spark import comparable_session, require_spark

import dpsql
from dpsql.testing import use_noise, zero_noise

require_spark()

URLS = [f"https://site/{i}" for i in range(2500)] + ["o'brien", "ü", ""]
AGES = list(range(1500))
# dates, timestamps (microseconds) and DECIMALs: the ends of the years 1 .. 9999 and negative, zero and small decimals
DAYS = [dt.date(1, 1, 1), dt.date(9999, 12, 31)] + [dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in range(1100)]
STAMPS = [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)] + [
    dt.datetime(2024, 3, 1, 12, 30, 0, 7) + dt.timedelta(hours=i, microseconds=i) for i in range(1000)]
DECS = [D(i).scaleb(-2) - 5 for i in range(1100)] + [D("9999999.99"), D("-9999999.99")]
QUERIES = [
    "SELECT url, COUNT(*) AS n FROM t GROUP BY url",             # the domain on the (unit, group) pairs
    "SELECT age, SUM(v) AS s, AVG(v) AS a FROM t GROUP BY age",  # integer keys
    "SELECT url, MEDIAN(v) AS m FROM t GROUP BY url",            # the domain on the rows (quantiles)
    "SELECT url, age, COUNT(*) AS n FROM t WHERE age < 40 GROUP BY url, age",  # two long domains
    "SELECT day, COUNT(*) AS n FROM t GROUP BY day",             # dates
    "SELECT ts, SUM(v) AS s FROM t GROUP BY ts",                 # timestamps
    "SELECT dec, COUNT(*) AS n FROM t GROUP BY dec",             # DECIMALs
]


def _table() -> pa.Table:
    g = np.random.default_rng(11)
    n = 2500

    def pick(values: list[Any], outside: Any) -> list[Any]:  # declared values, the ends, one undeclared value
        return [[*values, outside][i] for i in g.integers(0, len(values) + 1, n)]

    urls = np.array([*URLS, "not-declared"], dtype=object)[g.integers(0, len(URLS) + 1, n)]
    return pa.table({"u": g.integers(0, 500, n), "url": pa.array(urls.tolist(), pa.string()),
                     "age": pa.array(g.integers(0, 1600, n), pa.int32()), "v": g.integers(0, 10, n),
                     "day": pa.array(pick(DAYS, dt.date(2019, 1, 1)), pa.date32()),
                     "ts": pa.array(pick(STAMPS, dt.datetime(2024, 3, 1, 12, 30, 0, 8)), pa.timestamp("us")),
                     "dec": pa.array(pick(DECS, D("-5.01")), pa.decimal128(9, 2))})


def _session(kind: str) -> dpsql.Session:
    s = comparable_session(kind)  # each query sets its own zero noise (the same salts on both engines)
    s.register("t", _table(), privacy_unit="u", max_groups_per_unit=4, max_rows_per_group=2,
               columns={"url": {"domain": URLS}, "age": {"domain": AGES}, "v": {"bounds": (0, 10)},
                        "day": {"domain": DAYS}, "ts": {"domain": STAMPS}, "dec": {"domain": [str(d) for d in DECS]}})
    return s


@pytest.fixture(scope="module")
def sessions():  # type: ignore[no-untyped-def]
    duck, spark = _session("duckdb"), _session("spark")
    yield duck, spark
    duck.close()
    spark.close()


def _views(s: dpsql.Session) -> list[str]:
    return [t.name for t in s._engine.spark.catalog.listTables() if t.name.startswith("_dpsql_domain")]


@pytest.mark.parametrize("sql", QUERIES)
def test_a_long_domain_releases_what_duckdb_releases_and_leaves_no_view(sessions, sql) -> None:
    duck, spark = sessions
    out = []
    for s in (duck, spark):
        use_noise(s, zero_noise())
        out.append(s.query(sql, epsilon=1.0, delta=1e-6).table)
    d, k = out
    assert k.schema == d.schema
    assert k.to_pylist() == d.to_pylist()
    key = sql.split()[1].rstrip(",")
    if "age" not in sql:  # every declared key, no other
        assert sorted(r[key] for r in d.to_pylist()) == sorted({"url": URLS, "day": DAYS, "ts": STAMPS, "dec": DECS}[key])
    assert any(r.get("n") or r.get("s") or r.get("m") for r in d.to_pylist())
    assert _views(spark) == []
