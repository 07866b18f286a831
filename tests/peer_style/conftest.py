"""A census-like table (PUMS-style: one row per person) registered as a peer engine's users
would describe it, and a truth connection that runs the same SQL on the raw rows."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql

#: the data owner's metadata, as a peer's YAML would state it
PUMS_COLUMNS = {
    "age": {"bounds": (0, 100)},
    "sex": {"domain": [0, 1], "bounds": (0, 1)},
    "educ": {"domain": list(range(1, 17)), "bounds": (1, 16)},
    "race": {"domain": list(range(1, 7))},
    "income": {"bounds": (0, 500000)},
    "married": {"domain": [0, 1], "bounds": (0, 1)},
}


def pums_table(n: int = 1000, seed: int = 20261130) -> pa.Table:
    """age 18..93, sex 0/1, educ 1..16, race 1..6 (skewed), income (skewed, by education), married 0/1; pid unique."""
    gen = np.random.default_rng(seed)
    age = gen.integers(18, 94, n)
    educ = np.clip(np.rint(gen.normal(10, 3, n)), 1, 16).astype(np.int64)
    race = gen.choice(np.arange(1, 7), n, p=[0.6, 0.15, 0.1, 0.08, 0.04, 0.03])
    income = np.clip(np.rint(gen.lognormal(9.5 + 0.08 * educ, 0.9)), 0, 420000)
    married = (gen.random(n) < np.clip((age - 18) / 60, 0.1, 0.7)).astype(np.int64)
    return pa.table({
        "age": age.astype(np.int64), "sex": gen.integers(0, 2, n).astype(np.int64), "educ": educ,
        "race": race.astype(np.int64), "income": income.astype(np.int64), "married": married,
        "pid": np.arange(1, n + 1, dtype=np.int64),
    })


@pytest.fixture(scope="module")
def pums() -> pa.Table:
    return pums_table()


@pytest.fixture(scope="module")
def peer_session(pums: pa.Table) -> Iterator[dpsql.Session]:
    s = dpsql.Session(budget=dpsql.Budget(100000.0, 0.5))
    s.register("pums", pums, privacy_unit="pid", max_rows_per_unit=1, max_groups_per_unit=1, max_rows_per_group=1,
               columns=PUMS_COLUMNS)
    yield s
    s.close()


@pytest.fixture(scope="module")
def truth(pums: pa.Table) -> Iterator[duckdb.DuckDBPyConnection]:
    """The raw table, as ``pums`` and as ``PUMS.PUMS`` (the peer's schema-qualified name)."""
    con = duckdb.connect()
    con.register("pums_arrow", pums)
    con.execute("CREATE TABLE pums AS SELECT * FROM pums_arrow")
    con.execute("CREATE SCHEMA pums")
    con.execute("CREATE TABLE pums.pums AS SELECT * FROM pums_arrow")
    yield con
    con.close()
