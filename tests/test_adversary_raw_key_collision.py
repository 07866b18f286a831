"""The k = 1 path shares one raw column between aggregates reading the same input: a column whose name spells
another input's key (``present:a``, what COUNT(a) reads) must not be read as that input."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("sql", [
    'SELECT COUNT(a) AS c, COUNT(DISTINCT "present:a") AS d FROM t',
    'SELECT COUNT(DISTINCT "present:a") AS d, COUNT(a) AS c FROM t',
])
def test_a_column_named_like_a_raw_key_is_read_as_itself(sql: str) -> None:
    t = pa.table({"uid": list(range(10)), "a": [1] * 10, "present:a": list(range(10))})
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", t, privacy_unit="uid")
    assert s.query(sql, epsilon=1.0, delta=1e-5).table.to_pylist()[0] == {"c": 10, "d": 10}
    s.close()
