"""A literal cast to REAL holds the number rounded to 32 bits, as in DuckDB: ``x < CAST(0.1 AS REAL)`` over a DOUBLE
column compares with 0.100000001490116..., so a row holding the DOUBLE 0.1 passes. At zero noise the count equals
DuckDB's; negative control: ``x < 0.1`` passes none of them."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize(("where", "want"), [("x < CAST(0.1 AS REAL)", 10), ("x < 0.1", 0),
                                             ("x = CAST(0.5 AS REAL)", 10), ("x <= CAST(0.7 AS FLOAT)", 20)])
def test_a_real_literal_compares_at_its_rounded_value(where: str, want: int) -> None:
    t = pa.table({"pid": list(range(20)), "x": [0.1] * 10 + [0.5] * 10})
    con = duckdb.connect()
    con.register("t", t)
    sql = f"SELECT COUNT(*) AS n FROM t WHERE {where}"
    assert con.execute(sql).fetchone()[0] == want
    with dpsql.Session(budget=Budget(100.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        assert s.query(sql, epsilon=1.0).to_pylist()[0]["n"] == want
