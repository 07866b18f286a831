"""GROUP BY a one-to-one function of the privacy unit (``uid + 0``, ``uid * 2``, ``CAST(uid AS VARCHAR)``,
``name || '!'``): each group holds one person, so no group can pass the sparse histogram's threshold. It was charged
and released nothing; ``GROUP BY uid`` itself was refused for free. Now refused for free alike, naming the unit."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def session() -> Any:
    t = pa.table({"uid": pa.array(range(300), pa.int64()), "name": [f"p{i}" for i in range(300)],
                  "small": pa.array([i % 100 for i in range(300)], pa.int8()), "g": [i % 3 for i in range(300)]})
    s = dpsql.Session(budget=dpsql.Budget(100, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid")
    s.register("u", t, privacy_unit="name")
    yield s
    s.close()


@pytest.mark.parametrize("sql", [
    "SELECT uid + 0 AS k, COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT uid * 2 AS k, COUNT(*) AS n FROM t GROUP BY uid * 2",
    "SELECT 1000 - uid AS k, COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT -uid AS k, SUM(g) AS n FROM t GROUP BY 1",
    "SELECT (uid) + 7 AS k, COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT CAST(uid AS VARCHAR) AS k, COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT 'u' || CAST(uid AS VARCHAR) AS k, COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT g, uid + 1 AS k, COUNT(*) AS n FROM t GROUP BY g, uid + 1",
    "SELECT name || '!' AS k, COUNT(*) AS n FROM u GROUP BY 1",
    "SELECT concat('x', name, 'y') AS k, COUNT(*) AS n FROM u GROUP BY 1",
])
def test_a_one_to_one_function_of_the_unit_is_refused_for_free(session: Any, sql: str) -> None:
    before, left = session.history().num_rows, session.remaining()
    with pytest.raises(errors.UnsupportedQueryError, match="one-to-one function of the privacy unit"):
        session.query(sql, epsilon=1.0, delta=1e-6)
    with pytest.raises(errors.UnsupportedQueryError, match="one-to-one function of the privacy unit"):
        session.explain(sql, epsilon=1.0, delta=1e-6)
    assert session.history().num_rows == before and session.remaining() == left


@pytest.mark.parametrize("sql", [
    "SELECT uid % 3 AS k, COUNT(*) AS n FROM t GROUP BY 1",  # many people per key
    "SELECT uid // 100 AS k, COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT uid * 0 AS k, COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT lower(name) AS k, COUNT(*) AS n FROM u GROUP BY 1",  # not one-to-one over every text
    "SELECT substr(name, 1, 1) AS k, COUNT(*) AS n FROM u GROUP BY 1",
    "SELECT small + 1 AS k, COUNT(*) AS n FROM t GROUP BY 1",  # another column
])
def test_negative_control_other_functions_are_answered(session: Any, sql: str) -> None:
    before = session.history().num_rows
    session.query(sql, epsilon=1.0, delta=1e-6)
    assert session.history().num_rows == before + 1


def test_negative_control_keys_of_several_people_are_released(session: Any) -> None:
    r = session.query("SELECT uid % 3 AS k, COUNT(*) AS n FROM t GROUP BY 1 ORDER BY 1", epsilon=1.0, delta=1e-6)
    assert r.table.column("k").to_pylist() == [0, 1, 2]
