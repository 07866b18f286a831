"""A table of the caller's DuckDB connection altered after registration: the catalog's types are
stale, and the private view binds the table's current columns. Before the fix a query rendered
for an INTEGER column compared a now-VARCHAR column through DuckDB's implicit cast: it failed
(after its charge) exactly when some row held text that is not a number, so whether the query
failed depended on one person's cell. It must be refused before the charge, whatever the rows."""

from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise


def _session(con: duckdb.DuckDBPyConnection) -> dpsql.Session:
    con.execute("CREATE TABLE t AS SELECT i AS uid, i % 10 AS x FROM range(100) r(i)")
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid", columns={"x": {"bounds": [0, 10]}})
    return s


@pytest.mark.parametrize("with_text_cell", [False, True])
def test_altered_column_type_is_refused_before_the_charge_whatever_the_rows(with_text_cell: bool) -> None:
    con = duckdb.connect()
    s = _session(con)
    q = "SELECT COUNT(*) AS n FROM t WHERE x = 5"
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 10}]  # remembered bind check
    con.execute("ALTER TABLE t ALTER x TYPE VARCHAR")
    if with_text_cell:  # one person's cell that DuckDB's implicit cast to a number fails on
        con.execute("INSERT INTO t VALUES (1000, 'abc')")
    before = s.history().num_rows
    with pytest.raises(errors.ConfigError, match="changed its columns"):
        s.query(q, epsilon=1.0)
    with pytest.raises(errors.ConfigError, match="changed its columns"):
        s.explain(q, epsilon=1.0)
    assert s.history().num_rows == before  # nothing charged
    s.register("t", "t", privacy_unit="uid")  # registered again: the catalog has x VARCHAR
    assert s.query("SELECT COUNT(*) AS n FROM t WHERE x = '5'", epsilon=1.0).table.to_pylist() == [{"n": 10}]
    s.close()


def test_dropped_or_recreated_table_is_refused_before_the_charge() -> None:
    con = duckdb.connect()
    s = _session(con)
    con.execute("DROP TABLE t")
    with pytest.raises(errors.ConfigError, match="changed its columns"):
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    con.execute("CREATE TABLE t AS SELECT i AS uid, CAST(i AS VARCHAR) AS x FROM range(5) r(i)")
    with pytest.raises(errors.ConfigError, match="changed its columns"):
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    assert s.history().num_rows == 0
    con.execute("DROP TABLE t")  # re-created with the registered columns (and one more, which the view does not read)
    con.execute("CREATE TABLE t AS SELECT i AS uid, i % 10 AS x, i AS extra FROM range(100) r(i)")
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 100}]
    s.close()


def test_unchanged_table_answers() -> None:
    con = duckdb.connect()
    s = _session(con)
    con.execute("INSERT INTO t VALUES (500, 3)")  # rows change, columns do not
    assert s.query("SELECT COUNT(*) AS n FROM t WHERE x = 3", epsilon=1.0).table.to_pylist() == [{"n": 11}]
    s.close()
