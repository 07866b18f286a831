"""Owner limits on private reads: statement time-out, memory/thread limits, min_response_time.

A failure after the charge (time-out, out of memory, anything) is one generic ExecutionError
whose text does not depend on which failure happened; the ledger entry is marked failed and
the charge stands."""

from __future__ import annotations

import time
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql import Budget, errors
from dpsql.engine import EngineSettings
from dpsql.session import FAILURE_REASON
from dpsql.testing import use_noise, zero_noise

SLOW_SQL = "SELECT COUNT(*) FROM t WHERE amount > 0"


def _slow_connection() -> duckdb.DuckDBPyConnection:
    """A caller's DuckDB view that takes minutes to scan (billions of generated rows)."""
    con = duckdb.connect()
    con.execute("CREATE VIEW huge AS SELECT i AS user_id, (i % 100)::DOUBLE AS amount FROM range(20000000000) r(i)")
    return con


def _session(con: Any = None, source: Any = "huge", **engine: Any) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10.0, 1e-3), connection=con, engine=engine)
    use_noise(s, zero_noise())
    s.register("t", source, privacy_unit="user_id", columns={"amount": {"bounds": (0, 100)}})
    return s


def _fails_after_charge(s: dpsql.Session, sql: str = SLOW_SQL, delta: float = 0.0) -> errors.ExecutionError:
    before = s.remaining()
    with pytest.raises(errors.ExecutionError) as ei:
        s.query(sql, epsilon=0.5, delta=delta)
    e = ei.value
    assert not isinstance(e, errors.QueryError)
    assert "the charge stands" in e.message and e.debug_detail is None
    assert e.__cause__ is None and e.__suppress_context__
    last = s.history().to_pylist()[-1]
    assert last["status"] == "failed" and last["failure_reason"] == FAILURE_REASON
    # the Gaussian charge adds the sampler's floating-point delta (dpsql.noise) to the request
    assert last["epsilon"] == 0.5 and delta <= last["delta"] <= delta * (1 + 1e-6)
    assert s.remaining() == before.minus(Budget(last["epsilon"], last["delta"]))
    return e


def test_statement_timeout_interrupts_and_the_charge_stands() -> None:
    con = _slow_connection()
    with _session(con, statement_timeout=0.5) as s:
        t0 = time.monotonic()
        e = _fails_after_charge(s)
        assert time.monotonic() - t0 < 60  # interrupted, not run to the end
        assert "statement time-out 0.5 s" in (e.hint or "")
    # the caller's connection still works afterwards
    assert con.execute("SELECT 1").fetchall() == [(1,)]


def test_timeout_and_out_of_memory_read_the_same() -> None:
    """Which failure happened is not shown: the message is one constant."""
    con = _slow_connection()
    with _session(con, statement_timeout=0.5, memory_limit="4GB") as s:
        timed_out = _fails_after_charge(s)
    n = 300_000
    big = pa.table({"user_id": np.arange(n), "amount": np.ones(n),
                    "s": np.array([f"value-{i}-" + "x" * 40 for i in range(n)])})
    with _session(source=big, memory_limit="4MB", max_temp_directory_size="1MB", statement_timeout=0.5,
                  max_text_bytes=256) as s2:
        oom = _fails_after_charge(s2, "SELECT s, COUNT(*) AS n FROM t GROUP BY s", delta=1e-6)
    assert oom.message == timed_out.message
    assert type(oom) is type(timed_out)
    # the control: with DuckDB's default limits the same query runs
    with _session(source=big, memory_limit=None, statement_timeout=None) as s3:
        s3.query("SELECT s, COUNT(*) AS n FROM t GROUP BY s", epsilon=0.5, delta=1e-6)


def test_debug_mode_names_the_interrupt() -> None:
    con = _slow_connection()
    s = dpsql.Session(budget=Budget(10.0, 1e-3), connection=con, debug=True, engine={"statement_timeout": 0.3})
    s.register("t", "huge", privacy_unit="user_id", columns={"amount": {"bounds": (0, 100)}})
    with pytest.raises(errors.ExecutionError) as ei:
        s.query(SLOW_SQL, epsilon=0.5)
    assert ei.value.debug_detail is not None and "Interrupt" in ei.value.debug_detail
    s.close()


def test_a_late_timer_does_not_interrupt_the_next_query(events: pa.Table) -> None:
    with _session(source=events, statement_timeout=0.3) as s:
        s.query(SLOW_SQL, epsilon=0.1)
        time.sleep(0.5)  # the first query's timer would have fired by now
        s.query(SLOW_SQL, epsilon=0.1)
        assert [r["status"] for r in s.history().to_pylist()] == ["released", "released"]


def test_min_response_time_pads_successes_and_failures(events: pa.Table) -> None:
    with _session(source=events, min_response_time=0.8) as s:
        t0 = time.monotonic()
        s.query(SLOW_SQL, epsilon=0.1)
        assert time.monotonic() - t0 >= 0.8
    con = _slow_connection()
    with _session(con, statement_timeout=0.2, min_response_time=1.0) as s:
        t0 = time.monotonic()
        _fails_after_charge(s)
        assert time.monotonic() - t0 >= 1.0
    # the control: no padding when it is not set (a failure at the 0.2 s time-out returns well before 1 s)
    with _session(con, statement_timeout=0.2) as s:
        t0 = time.monotonic()
        _fails_after_charge(s)
        assert time.monotonic() - t0 < 1.0


def test_limits_on_the_owned_connection(events: pa.Table) -> None:
    with _session(source=events, threads=1, memory_limit="512MB", max_text_bytes=32768) as s:
        con = s._engine.connection
        assert con.execute("SELECT current_setting('threads')").fetchall()[0][0] == 1
        assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] in ("512.0 MiB", "488.2 MiB")


def test_a_callers_connection_gets_its_settings_back(events: pa.Table) -> None:
    con = duckdb.connect()
    con.execute("SET threads = 3")
    con.execute("SET memory_limit = '1GB'")
    before = con.execute("SELECT current_setting('threads'), current_setting('memory_limit')").fetchall()
    seen: list[Any] = []
    from dpsql.engine import Engine

    real = Engine.fetch_arrow

    def spy(self, ast, *, what="the bounded query"):  # type: ignore[no-untyped-def]
        with self._limited():
            seen.append(self._con.execute("SELECT current_setting('threads')").fetchall()[0][0])
        return real(self, ast, what=what)

    con.register("src", events)
    con.execute("CREATE TABLE ev AS SELECT * FROM src")
    s = dpsql.Session(budget=Budget(10.0), connection=con, engine={"threads": 2})
    try:
        Engine.fetch_arrow = spy  # type: ignore[method-assign]
        s.register("t", "ev", privacy_unit="user_id")
        for _ in range(3):  # repeated set/restore does not drift (DuckDB shows sizes rounded)
            s.query("SELECT COUNT(*) FROM t", epsilon=0.1)
    finally:
        Engine.fetch_arrow = real  # type: ignore[method-assign]
        s.close()
    assert seen == [2, 2, 2]
    after = con.execute("SELECT current_setting('threads'), current_setting('memory_limit')").fetchall()
    assert after[0][0] == before[0][0] == 3
    # memory_limit comes back as DuckDB reports it (rounded to 0.1 MiB)
    assert abs(float(after[0][1].split()[0]) - float(before[0][1].split()[0])) < 0.11


@pytest.mark.parametrize("bad", [
    {"statement_timeout": 0}, {"statement_timeout": "10"}, {"threads": 0}, {"memory_limit": "lots"},
    {"min_response_time": -1}, {"debug": "yes"}, {"nosuch": 1},
])
def test_engine_settings_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(errors.ConfigError):
        EngineSettings.from_dict(bad)
    with pytest.raises(errors.ConfigError):
        dpsql.Session(budget=Budget(1.0), engine=bad)


def test_debug_must_be_a_bool() -> None:
    with pytest.raises(errors.ConfigError):
        dpsql.Session(budget=Budget(1.0), debug="no")  # type: ignore[arg-type]


def test_engine_settings_from_config(tmp_path: Any) -> None:
    (tmp_path / "dpsql.toml").write_text(
        "[ledger]\npath = \":memory:\"\nepsilon = 10\n[engine]\nstatement_timeout = 12.5\nmin_response_time = 0.25\nthreads = 1\n"
    )
    with dpsql.Session.from_config(tmp_path / "dpsql.toml") as s:
        st = s._engine.settings
        assert (st.statement_timeout, st.min_response_time, st.threads, st.debug) == (12.5, 0.25, 1, False)


def test_query_options_cannot_change_engine_settings(events: pa.Table) -> None:
    with _session(source=events) as s:
        for key in ("statement_timeout", "debug", "min_response_time", "memory_limit"):
            with pytest.raises(errors.ConfigError, match="unknown option"):
                s.query(SLOW_SQL, epsilon=0.1, options={key: 1})
