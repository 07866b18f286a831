"""dpsql embedded in Python ETL scripts: a caller's DuckDB connection, threads, objects registered and changed.

A caller's connection on which a macro or a Python function is named like one of DuckDB's own functions: DuckDB
looks a name up in the user's schemas (TEMP ones first) before its built-ins, and a Python function registered with
``con.create_function`` is one more overload that wins for its argument types. dpsql's bounded query clamps each value
and caps each person's rows with DuckDB's functions (``LEAST``, ``GREATEST``, ``HASH``, ``COUNT``, ``+``, ...): with
``CREATE MACRO least(a, b) AS a`` on the connection a SUM over a column bounded to [0, 10] released one person's
value of 1 000 unclamped (and one of 1e9 failed the query after its charge). Such a connection is now refused before
the charge, naming the functions and the fix."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from duckdb import sqltypes as T

import dpsql
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

SUM = "SELECT SUM(x) AS s, COUNT(*) AS n FROM t"


def _session(con: duckdb.DuckDBPyConnection, big: float = 1000.0) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    s.register("t", pa.table({"u": list(range(10)), "x": [1.0] * 9 + [big]}), privacy_unit="u",
               columns={"x": {"bounds": (0, 10)}})
    return s


SHADOWS = [
    ("CREATE MACRO least(a, b) AS a", "least"),
    ("CREATE TEMP MACRO least(a, b) AS a", "least"),
    ("CREATE MACRO GREATEST(a, b) AS a", "GREATEST"),
    ('CREATE MACRO "+"(a, b) AS 7', "+"),
    ("CREATE MACRO count(x) AS 1", "count"),
    ("CREATE SCHEMA s2; CREATE MACRO s2.ln(x) AS 7; SET search_path = 's2,main'", "ln"),
    ("ATTACH ':memory:' AS other; CREATE MACRO other.main.hash(x) AS 1; USE other", "hash"),
]


@pytest.mark.parametrize("setup,name", SHADOWS)
def test_a_macro_named_like_a_duckdb_function_is_refused_before_the_charge(setup: str, name: str) -> None:
    """Was: the owner's macro stood in for DuckDB's function inside the bounded query (``least``: one person's
    unclamped value released). Now: refused for free, naming the macro and the fix; the ledger is untouched."""
    con = duckdb.connect()
    s = _session(con)
    try:
        con.execute(setup)
        for call in (lambda: s.query(SUM, epsilon=1.0), lambda: s.explain(SUM, epsilon=1.0)):
            with pytest.raises(ConfigError, match=r"named like DuckDB's own") as info:
                call()
            assert repr(name) in str(info.value) and "nothing was charged" in str(info.value)
            assert "DROP MACRO" in str(info.value.hint) and "1000" not in str(info.value)
        assert s.remaining() == dpsql.Budget(100.0, 1e-3) and s.history().num_rows == 0
    finally:
        s.close()


def test_a_python_function_overloading_a_duckdb_function_is_refused_before_the_charge() -> None:
    """Was: ``con.create_function("least", ...)`` for (DOUBLE, INTEGER), the types of the bounded query's clamp,
    released SUM = 1009 over a column bounded to [0, 10]. Now refused for free."""
    con = duckdb.connect()
    con.create_function("least", lambda a, b: a, [T.DOUBLE, T.INTEGER], T.DOUBLE)
    s = _session(con)
    try:
        with pytest.raises(ConfigError, match=r"'least'") as info:
            s.query(SUM, epsilon=1.0)
        assert "open a new connection" in str(info.value.hint)
        assert s.remaining() == dpsql.Budget(100.0, 1e-3)
        con.remove_function("least")  # DuckDB then has no least at all: refused for free as well
        with pytest.raises(dpsql.errors.QueryError):
            s.query(SUM, epsilon=1.0)
        assert s.remaining() == dpsql.Budget(100.0, 1e-3)
    finally:
        s.close()
    fresh = duckdb.connect()  # the fix the hint names: the same program on a new connection answers, clamped
    fresh.create_function("my_least", lambda a, b: a, [T.DOUBLE, T.INTEGER], T.DOUBLE)
    s = _session(fresh)
    try:
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 19.0, "n": 10}]
    finally:
        s.close()


def test_control_the_owners_own_macros_and_functions_under_other_names_are_left_alone() -> None:
    """Negative control: macros and Python functions of names DuckDB does not have change nothing; the value of
    1 000 is clamped to 10 (9 + 10)."""
    con = duckdb.connect()
    con.execute("CREATE MACRO my_clamp(a, b) AS a; CREATE TEMP MACRO my_temp(x) AS x")
    con.create_function("my_udf", lambda a: a, [T.DOUBLE], T.DOUBLE)
    s = _session(con)
    try:
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 19.0, "n": 10}]
        con.execute("DROP MACRO my_clamp")
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 19.0, "n": 10}]
    finally:
        s.close()


def test_a_shadowing_macro_dropped_again_lets_the_same_session_answer() -> None:
    con = duckdb.connect()
    s = _session(con, big=1e9)
    try:
        con.execute("CREATE MACRO least(a, b) AS a")
        with pytest.raises(ConfigError):
            s.query(SUM, epsilon=1.0)
        con.execute("DROP MACRO least")
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 19.0, "n": 10}]
        assert s.history().num_rows == 1
    finally:
        s.close()
