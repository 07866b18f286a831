"""SUM / AVG over a BOOLEAN column read as 0 / 1 (``SUM(flag::INTEGER)``, the share of trues as
``AVG(CAST(flag AS DOUBLE))``): the cast of a boolean lies in [0, 1] by its type, so it needs no declared
bounds (it was refused: "column 'flag' has no declared bounds", though a condition such as
``SUM(CAST(x > 3 AS INTEGER))`` was answered). With zero noise and caps that do not bind, the
answers are plain DuckDB's."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise


def people() -> pa.Table:
    n = 800
    return pa.table({"uid": list(range(n)), "g": [["a", "b"][i % 2] for i in range(n)],
                     "flag": [None if i % 11 == 0 else i % 3 == 0 for i in range(n)], "note": ["x"] * n})


@pytest.fixture
def s() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("t", people(), privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1)
    yield sess
    sess.close()


@pytest.mark.parametrize("sql", [
    "SELECT g, SUM(flag::INTEGER) AS n FROM t GROUP BY g",
    "SELECT g, SUM(flag) AS n FROM t GROUP BY g",
    "SELECT g, SUM(CAST(flag AS BIGINT) * 2) AS n FROM t GROUP BY g",
    "SELECT SUM(CAST(flag AS DOUBLE)) AS n, COUNT(flag) AS m FROM t",
])
def test_a_boolean_cast_is_bounded_by_its_type(s: Any, sql: str) -> None:
    con = duckdb.connect()
    con.register("t", people())
    got = sorted(tuple(r.values()) for r in s.query(sql, epsilon=5.0, delta=1e-5).to_pylist())
    assert got == sorted(con.sql(sql).fetchall())


def test_text_still_needs_bounds(s: Any) -> None:
    with pytest.raises(errors.UnsupportedQueryError, match="has no declared bounds"):
        s.query("SELECT SUM(CAST(note AS INTEGER)) AS n FROM t", epsilon=1.0)
