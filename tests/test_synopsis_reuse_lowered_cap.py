"""Regression (review finding): with ``reuse='synopsis'`` a range count (or a quantile) may be read
from a histogram's synopsis, made by the other bounding rule, but that lookup used the table's
registered caps and ignored a cap the request lowered. Every person has 5 rows (ages 0..4,
max_rows_per_unit=5): after a histogram, ``COUNT(*) WHERE age BETWEEN 0 AND 4`` with
``max_rows_per_unit=1`` was answered 500 (the synopsis kept 5 rows per person) where the quantity
asked for is 100. It is now refused for free unless a synopsis made at the lowered cap exists."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql import Budget
from dpsql.errors import PolicyError
from dpsql.testing import use_noise, zero_noise

COUNT = "SELECT COUNT(*) FROM t WHERE age BETWEEN 0 AND 4"
HIST = "SELECT age, COUNT(*) FROM t GROUP BY age"


@pytest.fixture
def session(tmp_path: Path):  # type: ignore[no-untyped-def]
    pq.write_table(pa.table({"uid": [i // 5 for i in range(500)], "age": [i % 5 for i in range(500)]}),
                   tmp_path / "t.parquet")
    s = dpsql.Session(ledger=str(tmp_path / "l.db"), budget=Budget(100.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", max_rows_per_unit=5, max_groups_per_unit=5,
               max_rows_per_group=1, columns={"age": {"bounds": (0, 9), "bins": 10}})
    yield s
    s.close()


def test_control_registered_caps_read_the_histogram(session: dpsql.Session) -> None:
    assert not session.query(HIST, epsilon=5.0).reused
    r = session.query(COUNT, epsilon=5.0, options={"reuse": "synopsis"})
    assert r.reused and r.table.column(0).to_pylist() == [500]


def test_lowered_cap_not_read_from_a_synopsis_at_the_registered_cap(session: dpsql.Session) -> None:
    assert not session.query(HIST, epsilon=5.0).reused
    left = session.remaining()
    with pytest.raises(PolicyError, match="no stored DAWA synopsis covers"):
        session.query(COUNT, epsilon=5.0, options={"reuse": "synopsis", "max_rows_per_unit": 1})
    assert session.remaining() == left


def test_lowered_cap_read_from_a_histogram_at_that_cap(session: dpsql.Session) -> None:
    assert not session.query(HIST, epsilon=5.0, options={"max_rows_per_unit": 1}).reused
    r = session.query(COUNT, epsilon=5.0, options={"reuse": "synopsis", "max_rows_per_unit": 1})
    assert r.reused and r.table.column(0).to_pylist() == [100]


def test_quantile_lowered_cap_not_read_from_the_registered_cap(session: dpsql.Session) -> None:
    assert not session.query(HIST, epsilon=5.0).reused
    with pytest.raises(PolicyError):
        session.query("SELECT MEDIAN(age) FROM t", epsilon=5.0, options={"reuse": "synopsis", "max_rows_per_unit": 1})
