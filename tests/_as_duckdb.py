"""A one-table ``SELECT COUNT(*) AS n FROM t WHERE ...`` answered by dpsql at zero noise (one row per person)
beside DuckDB's own answer on the same rows: the typer's rules must give DuckDB's values."""

from __future__ import annotations

import duckdb
import pyarrow as pa

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


def count_where(t: pa.Table, where: str) -> tuple[int, int]:
    """(dpsql's count, DuckDB's count) of the rows of ``t`` (privacy unit ``pid``) where ``where`` holds."""
    con = duckdb.connect()
    con.register("t", t)
    sql = f"SELECT COUNT(*) AS n FROM t WHERE {where}"
    want = con.execute(sql).fetchone()[0]  # type: ignore[index]
    with dpsql.Session(budget=Budget(100.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        return s.query(sql, epsilon=1.0).to_pylist()[0]["n"], want
