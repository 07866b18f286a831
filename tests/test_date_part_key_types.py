"""Integer expressions of date parts keep DuckDB's BIGINT: ``GROUP BY year(d) - 1990`` was released as a HUGEINT
(Arrow decimal128(38, 0)), because integer arithmetic is computed in a type holding every result of its operands'
types and a date part was a BIGINT of any value. A date part's values are bounded over every DATE and TIMESTAMP DuckDB
holds (years -5877641..5881580, months 1..12, ...), so its arithmetic is computed in BIGINT, total as before."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlglot

import dpsql
from dpsql.plan.typer import _PART_BOUNDS, type_key
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def session() -> Any:
    con = duckdb.connect()
    t = con.sql("SELECT r AS uid, DATE '2020-01-01' + (r * 37)::INTEGER AS d, "
                "TIMESTAMP '2020-01-01' + to_seconds(r * 7919) AS ts, r::BIGINT AS b FROM range(0, 400) t(r)"
                ).to_arrow_table()
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=1)
    yield s, con, t
    s.close()


@pytest.mark.parametrize("key", [
    "year(d) - 1990", "month(d) + 1", "extract(year FROM d) * 12 + month(d)", "yearweek(d) + 1",
    "date_part('hour', ts) * 60 + minute(ts)", "dayofweek(d) + 1", "quarter(d) - 1", "isodow(d) * 2",
])
def test_an_integer_expression_of_date_parts_is_a_bigint_key(session: Any, key: str) -> None:
    s, con, t = session
    _, typ = type_key(sqlglot.parse_one(key, read="duckdb"), {"d": "DATE", "ts": "TIMESTAMP", "b": "BIGINT"})
    assert typ.name == "BIGINT"
    got = s.query(f"SELECT {key} AS k, COUNT(*) AS n FROM t GROUP BY 1 HAVING COUNT(*) > 0", epsilon=1.0, delta=1e-6)
    assert got.table.schema.field("k").type == pa.int64()
    con.register("raw", t)
    truth = {r[0] for r in con.execute(f"SELECT {key} FROM raw").fetchall()}
    assert set(got.table.column("k").to_pylist()) <= truth


def test_negative_control_a_bigint_column_of_any_value_is_still_widened() -> None:
    """``b - 1`` of a BIGINT column can leave BIGINT (b = -2^63): computed in HUGEINT, total."""
    _, typ = type_key(sqlglot.parse_one("b - 1", read="duckdb"), {"b": "BIGINT"})
    assert typ.name == "HUGEINT"


def test_a_date_part_at_the_limits_of_the_date_type_fits(session: Any) -> None:
    """The bounds hold at DuckDB's least and greatest DATE and TIMESTAMP (no BIGINT overflow is possible)."""
    _, con, _ = session
    for part in ("year", "isoyear", "decade", "century", "millennium", "yearweek", "microsecond"):
        for v in ("DATE '5877642-06-25 (BC)'", "DATE '5881580-07-10'", "TIMESTAMP '290309-12-22 (BC) 00:00:00'",
                  "TIMESTAMP '294247-01-10 04:00:54.775806'"):
            got = con.execute(f"SELECT date_part('{part}', {v})").fetchone()
            assert got is not None
            lo, hi = _PART_BOUNDS[part]
            assert lo <= got[0] <= hi, (part, v, got)
