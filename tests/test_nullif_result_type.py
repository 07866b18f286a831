"""NULLIF(a, b) has the type of its first argument, as in DuckDB: a and b are compared in their common type, but
the value returned is ``a`` itself. ``CAST(NULLIF(2.5, 1e308) AS INTEGER)`` is 3 (the DECIMAL 2.5 rounded half
away from zero), not 2 (a DOUBLE rounded half to even); a DECIMAL column's NULLIF with a DOUBLE sentinel stays a
DECIMAL. At zero noise every answer equals DuckDB's on the same rows."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


def _table() -> pa.Table:
    return pa.table({"pid": pa.array(range(40), pa.int64()), "age": pa.array([i % 8 for i in range(40)], pa.int64()),
                     "d": pa.array([None if i % 5 == 0 else f"{(i % 4) + 0.5}" for i in range(40)]).cast(pa.decimal128(10, 1)),
                     "small": pa.array([i % 3 for i in range(40)], pa.int8())})


@pytest.mark.parametrize("where", [
    "age < CAST(NULLIF(2.5, 1e308) AS INTEGER)",  # 3 in DuckDB: ages 0..2
    "age + 1 = CAST(NULLIF(d, -1e0) AS INTEGER)",
    "CAST(NULLIF(d, -1e0) AS BIGINT) = 3",
    "age // NULLIF(small + 1, 1.5) = 2",
    "NULLIF(small, 1e0) = 2",
])
def test_nullif_answers_as_duckdb(where: str) -> None:
    t = _table()
    con = duckdb.connect()
    con.register("t", t)
    sql = f"SELECT COUNT(*) AS n FROM t WHERE {where}"
    ((want,),) = con.execute(sql).fetchall()
    with dpsql.Session(budget=Budget(100.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1)
        got = s.query(sql, epsilon=1.0).to_pylist()[0]["n"]
    assert got == want, (where, got, want)
    assert want > 0


@pytest.mark.parametrize(("where", "span"), [
    ("age < CAST(NULLIF(2.5, 1e308) AS INTEGER)", ((0, 2),)),
    ("age >= CAST(NULLIF(2.5, 1e308) AS INTEGER) AND age < 6", ((3, 5),)),
    ("age < 3 OR age > NULLIF(CAST('nan' AS DOUBLE), CAST('nan' AS DOUBLE))", ((0, 2),)),  # NaN = NaN: NULL
])
def test_dawa_keeps_exactly_duckdbs_bins_under_nullif(where: str, span: tuple[tuple[int, int], ...]) -> None:
    from test_dawa_where_span import ages_session

    from dpsql.plan import workload
    from dpsql.plan.analyze import analyze

    sql = f"SELECT age, COUNT(*) AS n FROM t WHERE {where} GROUP BY age ORDER BY age"
    s, t = ages_session()
    wl = workload.histogram_workload(analyze(sql, s.tables))
    assert wl is not None and wl.span == span
    con = duckdb.connect()
    con.register("t", t)
    truth = [{"age": a, "n": n} for a, n in con.execute(sql).fetchall()]
    assert s.query(sql, epsilon=1.0).table.to_pylist() == truth
