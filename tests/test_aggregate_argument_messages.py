"""A refused aggregate argument is named once, in the aggregate's terms.

An aggregate's argument is read on private rows, so it is held to the allow-list of functions
with a total, bounded-cost evaluation (not to the wider list over released values). A function
off that list used to be reported twice: once by the SELECT list's check as if it were over
released values, once by the aggregate's own analysis (or as "ANONYMOUS has no interval rule").
Messages name operators and functions as the query writes them (``||``, ``GREATEST``)."""

from __future__ import annotations

import os
import tempfile

import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.catalog import TableSpec
from dpsql.plan.analyze import analyze

SCHEMA = {"uid": "BIGINT", "x": "DOUBLE", "s": "VARCHAR"}
CATALOG = {"t": TableSpec("t", "/nonexistent/never-read.parquet", "parquet", privacy_unit="uid", schema=SCHEMA,
                          columns={})}
ROW_LIST = "is not on the allow-list of functions with a total, bounded-cost evaluation"
POST_LIST = "is not on the allow-list of functions over released values"


def refusal(sql: str) -> errors.QueryError:
    with pytest.raises(errors.QueryError) as e:
        analyze(sql, CATALOG)
    return e.value


@pytest.mark.parametrize("sql, label, name", [
    ("SELECT SUM(foo(x)) FROM t", "SUM", "foo"),
    ("SELECT SUM(LEAST(GREATEST(x, 0), 1)) + SUM(exp(x)) FROM t", "SUM", "exp"),
    ("SELECT AVG(LEAST(GREATEST(foo(x), 0), 1)) FROM t", "AVG", "foo"),
    ("SELECT COUNT(lpad(s, 3)) FROM t", "COUNT", "lpad"),
    ("select variance(foo(x)) from t", "VARIANCE", "foo"),
    ("SELECT s, Sum(foo(x)) FROM t GROUP BY s", "SUM", "foo"),
])
def test_a_function_off_the_list_inside_an_aggregate_is_one_problem_under_the_aggregates_name(
        sql: str, label: str, name: str) -> None:
    e = refusal(sql)
    assert len(e.violations) == 1, [str(v) for v in e.violations]
    msg = e.violations[0].message
    assert msg.startswith(f"{label}: function {name}() {ROW_LIST}"), msg
    assert POST_LIST not in str(e) and "ANONYMOUS" not in str(e) and "interval rule" not in str(e)


def test_functions_over_released_values_stay_allowed_outside_the_aggregate() -> None:
    # exp() is on the post-processing list: over the released SUM it is accepted, inside SUM it is not
    analyze("SELECT exp(SUM(LEAST(GREATEST(x, 0), 1))) AS e FROM t", CATALOG)
    e = refusal("SELECT COUNT(*) AS n FROM t HAVING bar(COUNT(*)) > 1")
    assert len(e.violations) == 1 and e.violations[0].message.startswith(f"HAVING: function bar() {POST_LIST}")


def test_every_clause_still_names_its_own_problem() -> None:
    # one function off the list in WHERE and in an aggregate: two problems, each in its clause's terms
    e = refusal("SELECT SUM(foo(x)) FROM t WHERE foo(x) > 1")
    assert [v.message.split(":")[0] for v in e.violations] == ["SUM", "WHERE"]


@pytest.mark.parametrize("sql, named, not_named", [
    ("SELECT SUM(s || 'a') FROM t", "|| has no interval rule", "DPIPE"),
    ("SELECT SUM(x % 2) FROM t", "% has no interval rule", "MOD"),
    ("SELECT SUM(LEAST(GREATEST(s || 'a', 0), 1)) FROM t", "GREATEST mixes incompatible types", "COALESCE"),
])
def test_messages_name_operators_and_functions_as_written(sql: str, named: str, not_named: str) -> None:
    e = refusal(sql)
    assert named in str(e) and not_named not in str(e), str(e)


def test_the_refusals_spend_nothing() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        s = dpsql.Session(ledger=os.path.join(tmp, "l.duckdb"), budget=dpsql.Budget(1.0, 1e-6), create=True)
        s.register("t", pa.table({"uid": [1, 2], "x": [1.0, 2.0], "s": ["a", "b"]}), privacy_unit="uid",
                   columns={"x": {"bounds": [0, 10]}})
        for sql in ("SELECT SUM(foo(x)) FROM t", "SELECT COUNT(lpad(s, 3)) FROM t", "SELECT SUM(s || 'a') FROM t"):
            with pytest.raises(errors.QueryError):
                s.query(sql, epsilon=0.5, delta=1e-7)
        assert s.remaining() == dpsql.Budget(1.0, 1e-6) and s.history().num_rows == 0
        s.close()


@pytest.mark.parametrize("sql, named", [
    ("SELECT MEDIAN(x) FROM t", "MEDIAN(x) needs value bounds"),
    ("SELECT quantile_cont(x, 0.3) FROM t", "QUANTILE_CONT(x) needs value bounds"),
    ("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY x) FROM t", "PERCENTILE_CONT(x) needs value bounds"),
    ("SELECT MIN(x) FROM t", "MIN(x) needs value bounds"),
])
def test_a_quantile_refusal_names_the_call_as_written(sql: str, named: str) -> None:
    assert named in str(refusal(sql))
