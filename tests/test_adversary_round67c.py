"""dpsql embedded in Python ETL scripts: a caller's DuckDB connection, threads, objects registered and changed.

A caller's connection on which a macro or a Python function is named like one of DuckDB's own functions: DuckDB
looks a name up in the user's schemas (TEMP ones first) before its built-ins, and a Python function registered with
``con.create_function`` is one more overload that wins for its argument types. dpsql's bounded query clamps each value
and caps each person's rows with DuckDB's functions (``LEAST``, ``GREATEST``, ``HASH``, ``COUNT``, ``+``, ...): with
``CREATE MACRO least(a, b) AS a`` on the connection a SUM over a column bounded to [0, 10] released one person's
value of 1 000 unclamped (and one of 1e9 failed the query after its charge). Such a connection is now refused before
the charge, naming the functions and the fix."""

from __future__ import annotations

from typing import Any

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
    # the check's own reads: a macro that would hide the owner's others, or the connection's settings
    ("CREATE MACRO least(a, b) AS a; CREATE MACRO duckdb_functions() AS TABLE SELECT 'x' AS function_name, "
     "true AS internal, 'system' AS database_name, NULL AS extension_name", "duckdb_functions"),
    ("CREATE MACRO current_setting(x) AS NULL", "current_setting"),
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


# -- a signal's handler of the program that raises (a SIGALRM time-out), which dpsql does not hold back -------------


class _Alarm(Exception):
    """What an ETL script's SIGALRM handler raises to time a call out."""


def _plain_session(**engine: Any) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine=engine or None)
    use_noise(s, zero_noise())
    s.register("t", pa.table({"u": list(range(10)), "x": [1.0] * 10}), privacy_unit="u",
               columns={"x": {"bounds": (0, 10)}})
    return s


def test_a_handlers_exception_as_the_time_out_timer_starts_leaves_no_timer_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: the program's exception landing in the statement time-out's ``Timer.start()`` (between starting the thread
    and the ``try`` that stops it) left the timer running: once the time-out passed it interrupted the connection every
    10 ms for ever, and every later query failed after its charge. Now the timer is stopped whatever lands where."""
    import threading

    s = _plain_session(statement_timeout=0.2)
    real = threading.Timer
    raised: list[bool] = []

    class _Interrupted(real):  # type: ignore[misc, valid-type]
        def start(self) -> None:
            super().start()
            if not raised:
                raised.append(True)
                raise _Alarm("the program's time-out")

    try:
        monkeypatch.setattr(threading, "Timer", _Interrupted)
        with pytest.raises(dpsql.errors.ExecutionError, match="charge stands"):  # (cut short after its charge)
            s.query(SUM, epsilon=1.0)
        assert raised
        monkeypatch.setattr(threading, "Timer", real)
        import time

        time.sleep(0.4)  # past the time-out of the timer started above
        for _ in range(3):
            assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 10.0, "n": 10}]
        assert [r["status"] for r in s.history().to_pylist()] == ["failed", "released", "released", "released"]
    finally:
        s.close()


def test_a_handlers_exception_while_the_sql_is_tokenized_is_raised_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: sqlglot's tokenizer wraps any exception of its scan in a TokenError, so the program's time-out raised by its
    SIGALRM handler while a valid query was tokenized came out as 'SQL syntax error: the SQL cannot be split into
    tokens' (the program's exception lost). Now the handler's own exception comes out; nothing is charged."""
    from sqlglot import tokenizer_core

    s = _plain_session()
    real = tokenizer_core.TokenizerCore._scan_number
    calls: list[int] = []

    def handler_lands_here(self: Any) -> Any:  # the handler runs in the thread it interrupts: here, in the scan
        calls.append(1)
        if len(calls) == 1:
            raise _Alarm("the program's time-out")
        return real(self)

    try:
        monkeypatch.setattr(tokenizer_core.TokenizerCore, "_scan_number", handler_lands_here)
        sql = "SELECT [x] AS k, var_samp(x) FROM t WHERE x > 1 GROUP BY [x]"
        s.register("t", pa.table({"u": list(range(10)), "x": [2.0] * 10}), privacy_unit="u",
                   columns={"x": {"bounds": (0, 10), "domain": [2.0]}})
        with pytest.raises(_Alarm):
            s.query(sql, epsilon=1.0)
        assert s.remaining() == dpsql.Budget(100.0, 1e-3)
        # the same text is read afresh (its tokens were remembered as none: T-SQL's [x] then failed to parse, for free,
        # as long as the process ran, and output names written from the tokens changed)
        assert s.query(sql, epsilon=1.0).table.column_names == ["k", "var_samp(x)"]
        # control: a real syntax error is still one
        with pytest.raises(dpsql.errors.SQLSyntaxError, match="SQL syntax error"):
            s.query("SELECT COUNT(*) AS n FROM t WHERE x = 'open", epsilon=1.0)
    finally:
        s.close()


class _CommitCutShort:
    """The in-memory ledger's connection, whose next COMMIT a signal's handler cuts short as DuckDB's client does: the
    statement raises ``RuntimeError('Query interrupted')`` and the transaction stays open."""

    def __init__(self, con: Any) -> None:
        self.con, self.armed = con, True

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and self.armed:
            self.armed = False
            raise RuntimeError("Query interrupted")
        return self.con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


@pytest.mark.parametrize("cut", ["reserve", "release"])
def test_an_interrupted_commit_of_the_in_memory_ledger_leaves_it_usable(cut: str) -> None:
    """Was: a COMMIT of the in-memory ledger cut short by a signal's handler (a SIGALRM time-out) left its one connection
    inside the transaction: every later operation failed, 'cannot start a transaction within a transaction', then
    'Current transaction is aborted', each called a bug in dpsql. Now the transaction is rolled back (nothing of it
    recorded) and the interrupt is a KeyboardInterrupt, as a ledger file's; the ledger goes on."""
    s = _plain_session()
    led: Any = s.ledger
    try:
        if cut == "release":  # the charge is recorded, the release's COMMIT is cut: the entry stays reserved
            real = led.commit

            def commit(*a: Any, **k: Any) -> Any:
                led._mem = _CommitCutShort(led._mem)
                return real(*a, **k)

            led.commit = commit
        else:
            led._mem = _CommitCutShort(led._mem)
        with pytest.raises(KeyboardInterrupt):
            s.query(SUM, epsilon=1.0)
        led._mem = getattr(led._mem, "con", led._mem)
        led.__dict__.pop("commit", None)
        statuses = [r["status"] for r in s.history().to_pylist()]
        assert statuses == ([] if cut == "reserve" else ["reserved"])
        assert s.remaining() == dpsql.Budget(100.0 - len(statuses), 1e-3)
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 10.0, "n": 10}]
    finally:
        s.close()


class _BeginThenAlarm(_CommitCutShort):
    """The ledger's connection, where the program's handler raises right as BEGIN returns (the transaction begun)."""

    def execute(self, sql: str, *args: Any) -> Any:
        out = self.con.execute(sql, *args)
        if sql == "BEGIN TRANSACTION" and self.armed:
            self.armed = False
            raise _Alarm("the program's time-out")
        return out


def test_a_handlers_exception_right_after_the_in_memory_ledgers_begin_leaves_it_usable() -> None:
    """Was: the exception landing between BEGIN and the try that rolls back left the transaction open, and every later
    operation of the ledger failed ('cannot start a transaction within a transaction', called a bug). Now nothing is
    charged and the ledger goes on."""
    s = _plain_session()
    led: Any = s.ledger
    try:
        led._mem = _BeginThenAlarm(led._mem)
        with pytest.raises(_Alarm):
            s.query(SUM, epsilon=1.0)
        led._mem = led._mem.con
        assert s.remaining() == dpsql.Budget(100.0, 1e-3) and s.history().num_rows == 0
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 10.0, "n": 10}]
    finally:
        s.close()


class _ExitRaisesOnce:
    """The Session's condition, where the program's handler raises as a ``with`` block over it ends (its lock given
    back, the block's count already taken)."""

    def __init__(self, cond: Any, when: int) -> None:
        self.cond, self.when, self.n = cond, when, 0

    def __enter__(self) -> Any:
        return self.cond.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        out = self.cond.__exit__(*exc)
        self.n += 1
        if self.n == self.when and exc[0] is None:
            raise _Alarm("the program's time-out")
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cond, name)


@pytest.mark.parametrize("when", [1, 2])  # 1: as the request took its count; 2: inside giving it back
def test_a_handlers_exception_at_a_step_of_the_sessions_count_of_requests_leaves_it_usable(when: int) -> None:
    """Was: a request's count, taken with ``+=`` before the try that gives it back, stayed taken when the program's
    handler raised right after (the Session then refused every later call of the thread, 'called inside its own
    request', and ``close`` waited for ever), and one raised inside giving it back gave it back twice (a negative
    count that a later registration waited on for ever). Now each request is one entry, added and removed by one step."""
    s = _plain_session()
    lock: Any = s._catalog_lock
    try:
        lock._cond = _ExitRaisesOnce(lock._cond, when)
        with pytest.raises((_Alarm, dpsql.errors.ExecutionError)):
            s.query(SUM, epsilon=1.0)
        lock._cond = lock._cond.cond
        assert (lock._readers, lock._writers, lock._holders, lock._writing) == (0, 0, {}, False)
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 10.0, "n": 10}]
        s.register("t", pa.table({"u": [1, 2], "x": [1.0, 2.0]}), privacy_unit="u", columns={"x": {"bounds": (0, 10)}})
    finally:
        s.close()


# -- a DuckDB table of the caller's connection whose name comes to mean another table ----------------------------


def _duck(con: duckdb.DuckDBPyConnection, name: str = "t") -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    s.register("t", name, privacy_unit="u", columns={"x": {"bounds": (0, 10)}})
    return s


CHANGES = [
    "CREATE SCHEMA s2; CREATE TABLE s2.t AS SELECT i AS u, 5.0 AS x FROM range(20) r(i); SET search_path = 's2'",
    "CREATE TEMP TABLE t AS SELECT i AS u, 5.0 AS x FROM range(20) r(i)",
]

# A fix must not tell the tables apart by the plan's scans: DuckDB prunes a view's scan from the statistics of its
# table (a view ``WHERE x > 50`` over rows that all have x <= 50 plans no scan at all), so a refusal read from the plan
# would say whether any row passes the view's filter.


@pytest.mark.parametrize("change", CHANGES, ids=["search_path", "temp_table"])
def test_a_registered_duckdb_table_name_that_now_reads_another_table_is_refused_for_free(change: str) -> None:
    """Was read silently (the other table, with the same columns). The name's resolution (current database and schema,
    search path, TEMP tables and views of that name: metadata only) is kept at registration and compared before each
    charge; registering again after the change reads the table the name now means."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS u, 1.0 AS x FROM range(10) r(i)")
    s = _duck(con)
    try:
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 10.0, "n": 10}]
        con.execute(change)
        before = s.history().num_rows
        with pytest.raises(ConfigError, match="resolves 't' differently"):
            s.query(SUM, epsilon=1.0)
        assert s.history().num_rows == before
        s.register("t", "t", privacy_unit="u", columns={"x": {"bounds": (0, 10)}})
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 100.0, "n": 20}]
    finally:
        s.close()


def test_a_use_of_another_database_is_refused_too() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS u, 1.0 AS x FROM range(10) r(i)")
    con.execute("ATTACH ':memory:' AS other; CREATE TABLE other.t AS SELECT i AS u, 3.0 AS x FROM range(10) r(i)")
    s = _duck(con)
    try:
        con.execute("USE other")
        with pytest.raises(ConfigError, match="resolves 't' differently"):
            s.query(SUM, epsilon=1.0)
        con.execute("USE memory")  # (USE sets the search path: still refused, conservatively, until registered again)
        s.register("t", "t", privacy_unit="u", columns={"x": {"bounds": (0, 10)}})
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 10.0, "n": 10}]
    finally:
        s.close()


def test_control_a_table_recreated_under_its_name_or_registered_qualified_is_read() -> None:
    """Negative control: fresh rows under the same name (DROP and CREATE, an ETL job's reload) are read; a table
    registered as 'memory.main.t' is that table whatever TEMP table or search_path comes later (the remedy)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS u, 1.0 AS x FROM range(10) r(i)")
    s = _duck(con)
    q = _duck(con, "memory.main.t")
    try:
        con.execute("DROP TABLE t; CREATE TABLE t AS SELECT i AS u, 2.0 AS x FROM range(10) r(i)")
        assert s.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 20.0, "n": 10}]
        con.execute(CHANGES[0])
        con.execute(CHANGES[1])
        assert q.query(SUM, epsilon=1.0).table.to_pylist() == [{"s": 20.0, "n": 10}]
    finally:
        s.close()
        q.close()


# -- warnings made errors by the program -------------------------------------------------------------------------


def test_a_recorded_release_whose_checkpoint_fails_is_returned_under_warnings_as_errors(tmp_path: Any) -> None:
    """Was: a release recorded in the ledger's write-ahead log whose CHECKPOINT then failed (a full disk) is returned
    with a warning; a program running with warnings as errors (``python -W error``, ``simplefilter("error")``, common in
    test suites and strict jobs) got that warning raised instead, after the charge, and the answer paid for and recorded
    as released was discarded. Now the answer is returned, the warning's text in ``Release.warnings``."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = '''
import json, os, resource, signal, sys, warnings
import dpsql
from dpsql.ledger import _store
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
s = dpsql.Session(ledger=sys.argv[1], create=True, budget=dpsql.Budget(1.0, 1e-6))
import pyarrow as pa
s.register("t", pa.table({"user_id": list(range(50))}), privacy_unit="user_id")
calls = []
def full_disk(path):
    calls.append(path)
    if len(calls) == 2:  # the release's (the charge's was the first)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
_store._HOOKS["before_checkpoint"] = full_disk
warnings.simplefilter("error")
r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
print(json.dumps({"rows": r.table.num_rows, "warnings": r.warnings, "calls": len(calls)}))
'''
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = str(Path(dpsql.__file__).parents[1])
    path = tmp_path / "ledger.duckdb"
    p = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["calls"] == 2 and got["rows"] == 1
    assert any("write-ahead log" in w and "the answer is returned" in w for w in got["warnings"]), got
