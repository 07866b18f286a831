"""Several queries in one request on the Spark engine: the same answers as DuckDB's at zero noise, and a type
combination Spark's rules would convert lossily refused for free (``dpsql.groupings``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _spark import require_spark

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

require_spark()

from test_groupings import _duck, _key, _public, _rows  # noqa: E402


@pytest.fixture(scope="module")
def spark_session() -> Iterator[dpsql.Session]:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine="spark")
    s.register("t", _public(), privacy_unit="uid",
               columns={"a": {"domain": ["x", "y", "z"]}, "b": {"domain": [1, 2]}, "v": {"bounds": [0, 4]}})
    use_noise(s, zero_noise())
    yield s
    s.close()


@pytest.mark.parametrize("sql", [
    "SELECT a, b, GROUPING(a, b) AS g, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY ROLLUP (a, b) ORDER BY g, a, b",
    "SELECT a, COUNT(*) AS n FROM t GROUP BY a UNION ALL SELECT 'all', COUNT(*) FROM t",
])
def test_spark_answers_as_duckdb(spark_session: dpsql.Session, sql: str) -> None:
    r = spark_session.query(sql, epsilon=4, delta=1e-5)
    assert sorted(_rows(r), key=_key) == sorted(_duck(_public(), sql), key=_key)


def test_spark_refuses_a_lossy_type_combination_for_free(spark_session: dpsql.Session) -> None:
    before = spark_session.history().num_rows
    with pytest.raises(UnsupportedQueryError, match="do not combine into one column type"):
        spark_session.query("SELECT a, COUNT(*) FROM t GROUP BY a UNION ALL SELECT b, COUNT(*) FROM t GROUP BY b",
                            epsilon=1, delta=1e-5)
    assert spark_session.history().num_rows == before
