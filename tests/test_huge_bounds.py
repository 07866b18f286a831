"""Regression (review finding): declared bounds of huge magnitude crashed explain and query

A SUM/AVG over a column whose declared bounds are close to DBL_MAX (or a small epsilon with
large bounds) makes the snapping grid overflow in ``power_of_two_at_least``: the caller gets a
raw ``OverflowError('math range error')`` from ``math.ldexp`` instead of the ConfigError (with a
hint) that every other unrepresentable noise scale raises. It happens before any charge and does
not depend on the data, so it is not a leak, but bad input must give a clear dpsql error.
Cause: dpsql/noise.py:161 (``power_of_two_at_least``) called from ``snapping_grid`` (noise.py:190)
before its representability check (noise.py:194).
"""

from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql import errors
from dpsql.budget import Budget


def _session(bounds: tuple[float, float]) -> dpsql.Session:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1000 + k AS uid, (k % 7)::DOUBLE AS x FROM range(0, 50) r(k)")
    s = dpsql.Session(budget=Budget(10.0, 1e-6), connection=con)
    s.register("t", "t", privacy_unit="uid", columns={"x": {"bounds": bounds}})
    return s


@pytest.mark.parametrize("method", ["explain", "query"])
@pytest.mark.parametrize(("bounds", "epsilon"), [((-1e308, 1e308), 1.0), ((0.0, 1e307), 0.1)])
def test_huge_bounds_give_a_dpsql_error_not_overflowerror(method: str, bounds: tuple[float, float], epsilon: float) -> None:
    s = _session(bounds)
    try:
        with pytest.raises(errors.DPSQLError):
            getattr(s, method)("SELECT SUM(x) AS v FROM t", epsilon=epsilon)
        assert s.history().num_rows == 0  # nothing charged
    finally:
        s.close()


def test_control_moderate_bounds_are_answered() -> None:
    """Negative control: the same query with ordinary bounds is answered."""
    s = _session((0.0, 10.0))
    try:
        assert len(s.query("SELECT SUM(x) AS v FROM t", epsilon=1.0).to_pylist()) == 1
    finally:
        s.close()
