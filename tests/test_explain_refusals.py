"""Regression (review finding): ``explain`` refuses what ``query`` refuses.

``explain`` is documented as "what ``query`` would do", but it skips the bind check that
``query`` runs before the charge (DuckDB binding of the bounded query and of the
post-processing query): an invalid ``try_strptime`` format, an ORDER BY naming no column, a
LIMIT beyond BIGINT, or a HAVING comparing a count with text all get a plan from ``explain``
and a QueryTypeError from ``query``. Nothing is charged and nothing depends on the data (not a
leak), but an analyst relying on ``explain`` to validate a query is misled.
Cause: dpsql/session.py:412-418 (``explain`` calls ``_prepare`` only; ``query`` also calls
``_bind_check`` at :497).
"""

from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql import errors
from dpsql.budget import Budget


@pytest.mark.parametrize(
    ("sql", "delta", "cls"),
    [
        # a format specifier DuckDB does not know is named at analysis (it was a type error from the backend's binder)
        ("SELECT COUNT(*) AS n FROM t WHERE try_strptime(s, '%s') IS NULL", 0.0, errors.UnsupportedQueryError),
        # an unknown ORDER BY column is named at analysis (it was a type error from the backend's binder)
        ("SELECT s, COUNT(*) AS n FROM t GROUP BY s ORDER BY nope", 1e-6, errors.UnsupportedQueryError),
        # (LIMIT 99999999999999999999999 keeps every row: tests/test_adversary_sparse_post.py)
        ("SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING n > 'abc'", 1e-6, errors.QueryTypeError),
    ],
)
def test_explain_refuses_what_query_refuses(sql: str, delta: float, cls: type) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1000 + k AS uid, 'a' || (k % 3) AS s FROM range(0, 100) r(k)")
    s = dpsql.Session(budget=Budget(10.0, 1e-3), connection=con)
    s.register("t", "t", privacy_unit="uid")
    try:
        with pytest.raises(cls):
            s.query(sql, epsilon=1.0, delta=delta)  # control: query refuses, for free
        assert s.history().num_rows == 0
        with pytest.raises(errors.QueryError):
            s.explain(sql, epsilon=1.0, delta=delta)
    finally:
        s.close()
        con.close()
