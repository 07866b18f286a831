"""dpsql embedded in ETL jobs: Python scripts whose signal handlers call back into a Session, and the
command line in shell pipelines."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import make_events

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError, ExecutionError


def _in_thread(fn: Any, timeout: float = 10.0) -> Any:
    """``fn()`` in a daemon thread; fails (instead of hanging the test run) when it does not return in time."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out.append(("raised", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"hung for {timeout} s"
    return out[0]


@pytest.mark.parametrize("call", ["close", "register"])
def test_a_session_called_back_from_its_own_running_query_fails_instead_of_hanging(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """A script's SIGTERM handler that closes the Session (or registers fresh data) runs in the thread of the
    query it interrupts: close() waited for that query to finish, which waited for the handler, for ever
    (the job hung until SIGKILL, its ledger entry left 'reserved')."""
    s = dpsql.Session(ledger=str(tmp_path / "l.duckdb"), budget=Budget(10.0, 1e-5), create=True)
    s.register("events", make_events(), privacy_unit="user_id")
    fetch = dpsql.session.backends.fetch_bounded

    def handler_runs_here(*a: Any, **k: Any) -> Any:  # as a signal handler would, in the query's own thread
        if call == "close":
            s.close()
        else:
            s.register("events", make_events(seed=8), privacy_unit="user_id")
        return fetch(*a, **k)

    monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", handler_runs_here)
    kind, err = _in_thread(lambda: s.query("SELECT COUNT(*) AS n FROM events", epsilon=0.5))
    assert kind == "raised" and isinstance(err, ExecutionError)  # after its charge: the generic failure
    monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", fetch)
    assert s.history().column("status").to_pylist() == ["failed"]  # the charge stands, as for any failure
    with pytest.raises(ConfigError, match="inside its own request"):
        with s._catalog_lock.reading():  # before the charge, the refusal itself is seen
            s.close()
    s.close()
    with pytest.raises(ConfigError, match="closed"):
        s.remaining()



def test_a_query_from_inside_a_registration_of_the_same_thread_is_refused() -> None:
    """A handler that queries while its thread registers: it waited for the registration for ever."""
    s = dpsql.Session(budget=Budget(10.0, 1e-5))
    s.register("events", make_events(), privacy_unit="user_id")

    def query_while_registering() -> Any:
        with s._catalog_lock.writing():
            return s.query("SELECT COUNT(*) AS n FROM events", epsilon=0.5)

    kind, err = _in_thread(query_while_registering)
    assert kind == "raised" and isinstance(err, ConfigError) and "inside its own request" in str(err)
    assert s.history().num_rows == 0  # refused before the charge
    s.close()
