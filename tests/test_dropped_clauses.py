"""Clauses DuckDB's dialect does not have were dropped without a word where a query's parts are written out: ``FOR
UPDATE`` after a ROLLUP or a UNION ALL, ``CLUSTER BY`` / ``DISTRIBUTE BY`` (Hive's) on any query. Each is now refused
for free, naming the clause, on one query as on several groupings or a UNION ALL."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", pa.table({"uid": list(range(40)), "k": ["a", "b"] * 20}), privacy_unit="uid",
               columns={"k": {"domain": ["a", "b"]}})
    use_noise(s, zero_noise())
    return s


_ONE = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
_ROLLUP = "SELECT k, COUNT(*) AS n FROM t GROUP BY ROLLUP (k)"
_UNION = f"{_ONE} UNION ALL {_ONE}"


@pytest.mark.parametrize("query", [_ONE, _ROLLUP, _UNION])
@pytest.mark.parametrize(("clause", "named"), [("FOR UPDATE", "FOR UPDATE"), ("CLUSTER BY k", "CLUSTER BY"),
                                               ("DISTRIBUTE BY k", "DISTRIBUTE BY")])
def test_a_clause_the_engine_lacks_is_refused_for_free(session: dpsql.Session, query: str, clause: str,
                                                       named: str) -> None:
    before = session.history().num_rows
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match=named):
        session.query(f"{query} {clause}", epsilon=1.0, delta=1e-6)
    assert session.history().num_rows == before


@pytest.mark.parametrize("query", [_ONE, _ROLLUP, _UNION])
def test_negative_control_the_same_queries_with_order_by_are_answered(session: dpsql.Session, query: str) -> None:
    r = session.query(f"{query} ORDER BY 1", epsilon=1.0, delta=1e-6)
    assert r.table.num_rows >= 2
