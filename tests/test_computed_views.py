"""A view of the caller's connection that computes its columns or conditions is warned of at registration: DuckDB
computes them as each row is read, so one that fails on one person's row fails every query reading it after its
charge (docs/threat_model.md, views). The warning names the view's columns, never its definition's text."""
from __future__ import annotations

import warnings

import duckdb
import pytest

import dpsql
from dpsql.engine._duckdb_sources import view_computations


def _registered(con: duckdb.DuckDBPyConnection, name: str) -> list[str]:
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6), connection=con)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            s.register(name, name, privacy_unit="uid")
        assert all(x.filename == __file__ for x in w), [x.filename for x in w]  # the caller's line
        return [str(x.message) for x in w]
    finally:
        s.close()


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    c.execute("CREATE TABLE raw AS SELECT i AS uid, CAST(i AS VARCHAR) AS s, i AS n FROM range(10) r(i)")
    c.execute("CREATE VIEW casts AS SELECT uid, CAST(s AS INTEGER) AS x, n + 1 AS m, s FROM raw")
    c.execute("CREATE VIEW tries AS SELECT uid, TRY_CAST(s AS INTEGER) AS x, s, n FROM raw WHERE n > 2 AND s <> 'secret'")
    c.execute("CREATE VIEW filters AS SELECT uid, s FROM raw WHERE CAST(s AS INTEGER) > 2")
    c.execute("CREATE VIEW nested AS SELECT * FROM casts WHERE uid > 1")
    return c


def test_a_view_computing_columns_is_warned_of_by_column(con: duckdb.DuckDBPyConnection) -> None:
    (msg,) = _registered(con, "casts")
    assert "casts.x, casts.m" in msg and "TRY_CAST" in msg and "CREATE TABLE ... AS" in msg, msg
    assert "CAST(s" not in msg  # the definition is not quoted (its literals may be data)
    (msg,) = _registered(con, "filters")
    assert "filters's WHERE condition" in msg, msg
    (msg,) = _registered(con, "nested")  # a view over a computing view
    assert "casts.x" in msg, msg


def test_tables_and_views_that_only_select_and_filter_are_not_warned_of(con: duckdb.DuckDBPyConnection) -> None:
    assert _registered(con, "raw") == []
    assert _registered(con, "tries") == []  # TRY_CAST, and comparisons of columns and literals


def test_the_warning_never_quotes_a_literal_of_the_definition() -> None:
    views = {"v": "CREATE VIEW v AS SELECT uid, CASE WHEN uid = 5 THEN 'alice@example.com' END AS note FROM raw;"}
    assert view_computations(views, "v") == ["v.note"]
    assert view_computations(views, "main.V".lower()) == ["v.note"]
    assert view_computations({}, "v") == []  # a table
