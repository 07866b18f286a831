"""A query of a ROLLUP, CUBE, GROUPING SETS or UNION ALL whose conditions on its keys keep none of its declared keys.

Was: such a query refused the whole request ("the conditions on the GROUP BY keys ... exclude every declared key"),
though the request has rows: ``SELECT c, COUNT(*) FROM t WHERE c IS NULL GROUP BY ROLLUP (c)`` has its total's row (the
people whose c is NULL), and a UNION ALL has its other SELECTs' rows. A query with ``HAVING 1 = 0`` beside others was
answered, as docs/sql.md says: with several groupings or a UNION ALL, a request is refused for having no row only
when each of its queries has none. Now the conditions on the keys are read so too: the request is answered (charged
in full, as with ``HAVING 1 = 0``: that query's share buys no row), and refused for free where every query has no row.
Sent alone, the same query is still refused for free, also after the request that held it passed its checks.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

N = 300


@pytest.fixture
def session() -> Any:
    t = pa.table({"uid": list(range(N)), "c": ["a", "b", None] * (N // 3), "s": ["x", "y", "x"] * (N // 3)})
    s = dpsql.Session(budget=Budget(100.0, 1e-2))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", columns={"c": {"domain": ["a", "b", "c"]}, "s": {"domain": ["x", "y"]}})
    yield s
    s.close()


def _plain(sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.register("t", pa.table({"uid": list(range(N)), "c": ["a", "b", None] * (N // 3), "s": ["x", "y", "x"] * (N // 3)}))
    try:
        return sorted(con.execute(sql).fetchall(), key=repr)
    finally:
        con.close()


@pytest.mark.parametrize("where, total", [("c IS NULL", 100), ("c = 'q'", 0), ("c = 'a' AND c = 'b'", 0)])
def test_a_rollup_whose_grouping_by_the_key_keeps_no_key_releases_its_total(session: Any, where: str, total: int) -> None:
    sql = f"SELECT c, COUNT(*) AS n FROM t WHERE {where} GROUP BY ROLLUP (c)"
    session.explain(sql, epsilon=1.0, delta=1e-5)
    r = session.query(sql, epsilon=1.0, delta=1e-5)
    assert r.table.to_pylist() == [{"c": None, "n": total}]
    # DuckDB's own rows hold the group of NULL keys too (no declared key: in no group of a release over declared keys)
    assert (None, total) in _plain(sql)
    assert session.history().num_rows == 1 and r.cost.epsilon == 1.0


def test_a_union_all_select_that_keeps_no_key_leaves_the_others_rows(session: Any) -> None:
    sql = "SELECT c, COUNT(*) AS n FROM t WHERE c = 'q' GROUP BY c UNION ALL SELECT s, COUNT(*) FROM t GROUP BY s"
    assert session.query(sql, epsilon=1.0, delta=1e-5).table.to_pylist() == [{"c": "x", "n": 200}, {"c": "y", "n": 100}]
    assert session.history().num_rows == 1


@pytest.mark.parametrize("sql", [
    "SELECT c, COUNT(*) AS n FROM t WHERE c = 'q' GROUP BY c UNION ALL SELECT s, COUNT(*) FROM t WHERE s = 'z' GROUP BY s",
    "SELECT c, COUNT(*) AS n FROM t WHERE c = 'q' GROUP BY c UNION ALL SELECT s, COUNT(*) FROM t GROUP BY s HAVING 1 = 0",
    "SELECT c, s, COUNT(*) AS n FROM t WHERE c = 'q' AND s = 'z' GROUP BY GROUPING SETS ((c), (s))",
])
def test_a_request_each_of_whose_queries_keeps_no_key_is_refused_for_free(session: Any, sql: str) -> None:
    before = session.remaining()
    with pytest.raises(UnsupportedQueryError, match=r"^query 1 of 2 .*exclude every declared key"):
        session.query(sql, epsilon=1.0, delta=1e-5)
    with pytest.raises(UnsupportedQueryError, match="exclude every declared key"):
        session.explain(sql, epsilon=1.0, delta=1e-5)
    assert session.remaining() == before and session.history().num_rows == 0


def test_the_query_alone_is_refused_for_free_after_the_request_that_held_it(session: Any) -> None:
    """The request's checks of the query are not remembered as passed: alone it is checked, and refused, anew."""
    part = "SELECT c, COUNT(*) AS n FROM t WHERE c = 'q' GROUP BY c"
    session.query(f"{part} UNION ALL SELECT s, COUNT(*) FROM t GROUP BY s", epsilon=1.0, delta=1e-5)
    spent = session.remaining()
    for _ in range(2):
        with pytest.raises(UnsupportedQueryError, match="exclude every declared key"):
            session.query(part, epsilon=0.5, delta=1e-5)
    assert session.remaining() == spent and session.history().num_rows == 1


def test_negative_control_a_select_keeping_a_key_is_answered_with_its_rows(session: Any) -> None:
    sql = "SELECT c, COUNT(*) AS n FROM t WHERE c = 'a' GROUP BY c UNION ALL SELECT s, COUNT(*) FROM t GROUP BY s"
    assert session.query(sql, epsilon=1.0, delta=1e-5).table.to_pylist() == [
        {"c": "a", "n": 100}, {"c": "x", "n": 200}, {"c": "y", "n": 100}]
