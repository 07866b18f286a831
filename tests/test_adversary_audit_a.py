"""Settings of a caller's DuckDB connection that make dpsql's private read impossible are refused before the charge.

For every private read on a caller's connection (``Session(connection=con)``) the engine sets its limits
(threads, sort order, IEEE floating point, its temp directory, ...) and gives the caller's values back
(``DuckDBBackend._limited``), and refuses a connection that logs statements to a file (``log_query_path``:
the bounded queries hold the secret salt). These happened only inside the read, after the charge: a
connection with ``SET lock_configuration = true`` (no setting can change) or ``SET enable_external_access =
false`` (the temp directory cannot change) failed every query after its charge, releasing nothing, and a
``log_query_path`` set after a query's first answer failed its next run after the charge too (the check at
binding is remembered). Such a connection is now refused before every charge, for free, naming the
setting and the fix; the ledger records nothing. A nesting limit (``max_expression_depth``) lowered after a
query's first answer is set back to DuckDB's default for the read, as the other limits are.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise

BLOCKING = [
    ("SET lock_configuration = true", "lock_configuration"),
    ("SET enable_external_access = false", "enable_external_access"),
    ("SET log_query_path = '{tmp}/statements.log'", "log_query_path"),
]


def _session(con: duckdb.DuckDBPyConnection, arrow: bool) -> dpsql.Session:
    con.execute("CREATE TABLE d AS SELECT k AS uid, k % 3 AS g FROM range(300) r(k)")
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    source: Any = pa.table({"uid": list(range(300)), "g": [k % 3 for k in range(300)]}) if arrow else "d"
    s.register("t", source, privacy_unit="uid", columns={"g": {"bounds": (0, 2), "bins": 3, "domain": [0, 1, 2]}})
    return s


@pytest.mark.parametrize("arrow", [False, True], ids=["duckdb_table", "arrow_table"])
@pytest.mark.parametrize(("setting", "name"), BLOCKING, ids=[n for _, n in BLOCKING])
def test_a_connection_whose_settings_block_the_read_is_refused_before_the_charge(
        tmp_path: Any, setting: str, name: str, arrow: bool) -> None:
    con = duckdb.connect()
    s = _session(con, arrow)
    queries = ["SELECT COUNT(*) AS n FROM t", "SELECT g, COUNT(*) AS n FROM t GROUP BY g"]
    for q in queries:  # answered once: the bind check of each is remembered
        s.query(q, epsilon=1.0, delta=1e-6)
    before = s.history().num_rows
    con.execute(setting.format(tmp=tmp_path))
    for q in queries + ["SELECT MEDIAN(g) AS m FROM t"]:
        with pytest.raises(errors.ConfigError) as refused:
            s.query(q, epsilon=1.0, delta=1e-6)
        assert name in str(refused.value) and "nothing was charged" in str(refused.value)
        with pytest.raises(errors.ConfigError):
            s.explain(q, epsilon=1.0, delta=1e-6)
    with pytest.raises(errors.ConfigError):
        s.query_many(["SELECT COUNT(*) FROM t WHERE g BETWEEN 0 AND 1"], epsilon=1.0)
    with pytest.raises(errors.ConfigError):
        s.suggest_caps("t", epsilon=1.0)
    assert s.history().num_rows == before
    assert s.remaining().epsilon == 8.0


def test_control_the_same_connection_answers_once_the_setting_is_back(tmp_path: Any) -> None:
    con = duckdb.connect()
    s = _session(con, False)
    con.execute(f"SET log_query_path = '{tmp_path}/statements.log'")
    with pytest.raises(errors.ConfigError):
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    con.execute("SET log_query_path = ''")
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 300}]
    assert s.remaining().epsilon == 9.0
    # the engine's own connection is never refused
    own = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    use_noise(own, zero_noise())
    own.register("t", pa.table({"uid": list(range(300))}), privacy_unit="uid")
    assert own.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 300}]


def test_a_nesting_limit_lowered_after_the_first_answer_does_not_fail_the_read() -> None:
    """``SET max_expression_depth = 12`` on the caller's connection after a query was answered once (its bind
    check is remembered): the next run failed after its charge. The private read and post-processing run
    under DuckDB's default limit, as on the engine's own connection; the caller's value is given back."""
    con = duckdb.connect()
    s = _session(con, False)
    con.execute("CREATE TABLE w AS SELECT k AS uid, 'x' || k AS v FROM range(300) r(k)")
    s.register("w", "w", privacy_unit="uid")
    q = "SELECT COUNT(*) AS n FROM w WHERE lower(upper(trim(v))) LIKE 'x%'"
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 300}]
    con.execute("SET max_expression_depth = 12")
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 300}]
    assert con.execute("SELECT current_setting('max_expression_depth')").fetchall()[0][0] == 12


@pytest.mark.parametrize("arrow", [False, True], ids=["duckdb_table", "arrow_table"])
def test_an_aborted_transaction_on_the_callers_connection_is_refused_before_the_charge(arrow: bool) -> None:
    """The caller's transaction failed (every statement then fails until ROLLBACK): an Arrow table's query
    failed after its charge, a DuckDB table's raised DuckDB's own exception. Both are a free ConfigError now,
    naming the way out; after ROLLBACK the query is answered."""
    con = duckdb.connect()
    s = _session(con, arrow)
    q = "SELECT COUNT(*) AS n FROM t"
    s.query(q, epsilon=1.0)
    con.execute("BEGIN TRANSACTION")
    with pytest.raises(duckdb.Error):
        con.execute("SELECT CAST('x' AS INTEGER)")
    with pytest.raises(errors.ConfigError, match="ROLLBACK"):
        s.query(q, epsilon=1.0)
    assert s.remaining().epsilon == 9.0
    con.execute("ROLLBACK")
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 300}]


@pytest.mark.parametrize("kind", ["TEMP VIEW", "TEMP TABLE"])
def test_a_callers_relation_named_like_the_released_values_does_not_fail_post_processing(kind: str) -> None:
    """Post-processing (ORDER BY, outputs over released values) registered the released table on the caller's
    connection under the fixed name ``__released_raw``: a caller's temporary view or table of that name made it
    raise DuckDB's CatalogException (raw, before the charge on a query's first run; after the charge once the
    query's bind check was remembered). The caller's relation is left as it was."""
    con = duckdb.connect()
    s = _session(con, False)
    q = "SELECT g, COUNT(*) AS n, g + 1 AS h FROM t GROUP BY g ORDER BY g DESC"
    want = [{"g": 2, "n": 100, "h": 3}, {"g": 1, "n": 100, "h": 2}, {"g": 0, "n": 100, "h": 1}]
    con.execute(f"CREATE {kind} __released_raw AS SELECT 42 AS x")
    assert s.query(q, epsilon=1.0, delta=1e-3).table.to_pylist() == want  # first run: bound, then answered
    assert s.query(q, epsilon=1.0, delta=1e-3).table.to_pylist() == want  # its bind check remembered
    assert s.remaining().epsilon == 8.0
    assert con.execute("SELECT * FROM __released_raw").fetchall() == [(42,)]


HUGE = "9" * 5000
HUGE_LITERALS = [
    f"SELECT COUNT(*) AS n FROM t WHERE g > {HUGE}",
    f"SELECT COUNT(*) AS n FROM t WHERE g IN ({HUGE}, 1)",
    f"SELECT COUNT(*) AS n FROM t WHERE CAST(g AS DECIMAL({HUGE}, 2)) > 1",
    f"SELECT COUNT(*) AS n FROM t WHERE make_date({HUGE}, 1, 1) IS NULL",
    f"SELECT g, COUNT(*) AS n FROM t GROUP BY g LIMIT {HUGE}",
    f"SELECT g, COUNT(*) AS n FROM t GROUP BY g ORDER BY {HUGE}",
    "SELECT COUNT(*) AS n FROM t WHERE g > 1e999999999999999999999",
    ["SELECT COUNT(*) FROM t WHERE g BETWEEN 0 AND 1e999999999999999999999"],
]


@pytest.mark.parametrize("sql", HUGE_LITERALS, ids=range(len(HUGE_LITERALS)))
def test_a_number_literal_beyond_any_value_is_a_syntax_error(sql: Any) -> None:
    """An integer literal of more than 4300 digits raised Python's ValueError, one with an exponent of more than
    18 digits decimal.InvalidOperation (both raw, from the analysis): a free SQLSyntaxError naming the limits now."""
    s = _session(duckdb.connect(), False)
    with pytest.raises(errors.SQLSyntaxError, match="out of range"):
        if isinstance(sql, list):
            s.query_many(sql, epsilon=1.0)
        else:
            s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 0


def test_control_long_but_representable_number_literals_are_read() -> None:
    s = _session(duckdb.connect(), False)
    tiny = "0." + "0" * 400 + "1"  # 403 characters: a DOUBLE 0
    for sql in (f"SELECT COUNT(*) AS n FROM t WHERE g > {tiny}", "SELECT COUNT(*) AS n FROM t WHERE g < 1e9999",
                "SELECT COUNT(*) AS n FROM t WHERE g > -1.5e-9999"):
        assert s.query(sql, epsilon=1.0).table.num_rows == 1
