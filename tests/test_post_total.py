"""Regression (review finding): HAVING / ORDER BY / outputs over released values never fail after the charge.

The typer makes every expression over private rows total, but the post-processing clauses
(HAVING, ORDER BY), which dpsql evaluates in DuckDB over the released rows, are neither typed nor
made total: a cast that does not convert (``s::DATE``, ``n::TINYINT`` of a count above 127) or an
integer overflow (``n * 9223372036854775807``) raises inside DuckDB after the budget is charged,
as the generic "failed after its budget was charged" ExecutionError, and the release is lost.
Privacy holds (they run on released rows only, so the outcome is a function of released
values: checked below with a suppressed key that would not cast), but a query whose failure is
certain from its text is charged instead of refused, against "bad input ... spends no budget";
and DuckDB functions outside the allow-list (``repeat(s, 100000000)``) are accepted there.
Cause: dpsql/session.py:698-716 (``_bind_check`` binds HAVING/ORDER BY over NULL keys and 0
aggregates only, so value-dependent casts and overflows pass) and :761-778 (``_post_process``
runs them in DuckDB after the charge); HAVING/ORDER BY were only screened by a deny-list
(dpsql/plan/checks.py:58), not the typer's allow-list (since then they take an allow-list too:
tests/test_allow_list_everywhere.py).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

import dpsql
from dpsql import errors
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


def _session(with_target: bool) -> tuple[dpsql.Session, duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1000 + k AS uid, ((k % 5) + 1)::VARCHAR AS s FROM range(0, 300) r(k)")
    if with_target:
        con.execute("INSERT INTO t VALUES (7, 'not-a-number')")
    s = dpsql.Session(budget=Budget(100.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid")
    return s, con


def _outcome(s: dpsql.Session, sql: str, delta: float) -> tuple[Any, ...]:
    before = s.history().num_rows
    try:
        r = s.query(sql, epsilon=1.0, delta=delta)
    except errors.DPSQLError as e:
        return ("error", type(e).__name__, s.history().num_rows != before)
    return ("ok", r.to_pylist())


@pytest.mark.parametrize(
    ("sql", "delta"),
    [
        ("SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING s::DATE IS NULL", 1e-6),
        ("SELECT s, COUNT(*) AS n FROM t GROUP BY s ORDER BY CAST(s AS DATE)", 1e-6),
        ("SELECT COUNT(*) AS n FROM t HAVING n::TINYINT > 0", 0.0),
        ("SELECT COUNT(*) AS n FROM t ORDER BY n * 9223372036854775807", 0.0),
        # a HAVING of text: DuckDB casts it to BOOLEAN outside any TRY ('2' is no boolean)
        ("SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING s", 1e-6),
        ("SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING (s)", 1e-6),
        ("SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING CASE WHEN n > 0 THEN s END", 1e-6),
        ("SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING s || ''", 1e-6),
        ("SELECT s AS v, COUNT(*) AS n FROM t GROUP BY v HAVING v", 1e-6),
    ],
)
def test_post_processing_failure_is_not_charged(sql: str, delta: float) -> None:
    s, con = _session(False)
    try:
        out = _outcome(s, sql, delta)
        assert out[0] == "ok" or not out[2], f"charged, then failed in post-processing: {sql}: {out}"
    finally:
        s.close()
        con.close()


def test_post_processing_sees_released_rows_only() -> None:
    """What held: a suppressed key that would not cast does not change the outcome."""
    sql = "SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING CAST(s AS INTEGER) > 0"
    outs = []
    for with_target in (True, False):
        s, con = _session(with_target)
        try:
            outs.append(_outcome(s, sql, 1e-6))
        finally:
            s.close()
            con.close()
    assert outs[0] == outs[1] and outs[0][0] == "ok"


def test_a_text_having_keeps_the_keys_that_read_as_true() -> None:
    """``HAVING s`` over released text keys: DuckDB reads the condition as a BOOLEAN ('1' is true); a
    key that is no boolean ('2') drops its row rather than failing the paid release."""
    s, con = _session(False)
    try:
        out = _outcome(s, "SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING s", 1e-6)
    finally:
        s.close()
        con.close()
    assert out == ("ok", [{"s": "1", "n": 60}])
