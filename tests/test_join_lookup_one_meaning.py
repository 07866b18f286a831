"""One meaning per query: a scalar aggregate over a lookup join (one private table, public lookups joined on their
declared keys) is the one-table query over the joined rows at every delta -- rows whose privacy unit is NULL dropped
(they belong to nobody), each person's rows capped at L after the whole WHERE (the lookup's conditions included) --
so its zero-noise answer does not depend on delta, and equals DuckDB's over the private rows with an owner."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

JOIN = "FROM orders o JOIN customers_public c ON o.ck = c.ck"
WHERE = "WHERE c.region = 'n'"
L = 2


def _orders() -> pa.Table:
    """600 people with 1-6 orders each (the cap L = 2 binds), and 300 orders with no owner (uid NULL)."""
    rng = np.random.default_rng(11)
    uid = np.repeat(np.arange(600), rng.integers(1, 7, 600))
    uids: list[int | None] = [int(u) for u in uid] + [None] * 300
    return pa.table({"uid": pa.array(uids, pa.int64()), "ck": rng.integers(0, 8, len(uids)),
                     "amt": np.full(len(uids), 7)})


def _customers() -> pa.Table:
    return pa.table({"ck": list(range(8)), "region": ["n", "s", "e", "w"] * 2})


def _query(sql: str, delta: float, options: dict[str, object] | None = None) -> tuple[str, float]:
    with dpsql.Session(budget=Budget(100.0, 1e-3)) as s:
        s.register("customers_public", _customers(), public=True)
        s.register("orders", _orders(), privacy_unit="uid", max_rows_per_unit=L, references={"ck": "customers_public.ck"},
                   columns={"amt": {"bounds": [0, 10]}})
        use_noise(s, zero_noise())
        mech = s.explain(sql, epsilon=1.0, delta=delta, options=options).mechanism
        return mech, s.query(sql, epsilon=1.0, delta=delta, options=options).to_pylist()[0]["v"]


def _duckdb(agg: str) -> float:
    """The one-table meaning: the joined rows with an owner passing the WHERE, at most L of them per person."""
    con = duckdb.connect()
    con.register("orders", _orders())
    con.register("customers_public", _customers())
    inner = agg.replace("COUNT(*)", "LEAST(COUNT(*), 2)").replace("SUM(o.amt)", "7 * LEAST(COUNT(*), 2)")
    return float(con.execute(f"SELECT SUM(v) FROM (SELECT {inner} AS v {JOIN} {WHERE} AND o.uid IS NOT NULL "
                             "GROUP BY o.uid)").fetchall()[0][0])


@pytest.mark.parametrize("agg", ["COUNT(*)", "SUM(o.amt)"])
def test_same_zero_noise_answer_at_delta_zero_and_positive(agg: str) -> None:
    sql = f"SELECT {agg} AS v {JOIN} {WHERE}"
    mech0, at0 = _query(sql, 0.0)
    mech1, at1 = _query(sql, 1e-6)
    want = _duckdb(agg)
    assert at0 == pytest.approx(want, abs=0.5) and at1 == pytest.approx(want, abs=0.5)
    assert (mech0, mech1) == ("laplace", "gaussian")
    # negative control: counting the ownerless rows, or capping before the WHERE, gives another number
    con = duckdb.connect()
    con.register("orders", _orders())
    con.register("customers_public", _customers())
    assert float(con.execute(f"SELECT {agg} {JOIN} {WHERE}").fetchall()[0][0]) > want + 100


def test_an_explicit_clipped_gaussian_keeps_the_join_mechanism() -> None:
    sql = f"SELECT COUNT(*) AS v {JOIN} {WHERE}"
    mech, _ = _query(sql, 1e-6, {"mechanism": "clipped_gaussian"})
    assert mech == "clipped_gaussian"
    with pytest.raises(dpsql.errors.ConfigError, match="needs delta > 0"):
        _query(sql, 0.0, {"mechanism": "clipped_gaussian"})
