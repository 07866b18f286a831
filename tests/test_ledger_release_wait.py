"""Recording a release waits longer for the ledger's lock than a charge does: its query has read private rows and its
charge stands, so giving up after ``lock_timeout`` threw away an answer already paid for (``Ledger.release_wait``).
The holder is another process inside a ledger operation until it is told to let go, once the release has waited past
``lock_timeout``; no timed asserts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import spawn_python

import dpsql
from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger

# holds the ledger's lock inside one operation until it reads a line (or the end) of its stdin
HOLDER = """
import sys
from dpsql.budget import Budget
from dpsql.ledger import Ledger, _store
def inside(p):
    print("inside", flush=True)
    sys.stdin.readline()
_store._HOOKS["after_attach"] = inside
Ledger(sys.argv[1], lock_timeout=30).reserve(Budget(0.1), mechanism="m", query="holder", tables=["t"], params={})
"""


def _hold(path: Path) -> Any:
    holder = spawn_python(HOLDER, str(path))
    assert holder.stdout is not None and holder.stdout.readline().strip() == "inside"
    return holder


def _let_go_later(holder: Any, seconds: float) -> threading.Timer:
    """The holder lets the lock go ``seconds`` from now (its operation then ends)."""
    def go() -> None:
        holder.stdin.write("go\n")
        holder.stdin.flush()

    timer = threading.Timer(seconds, go)
    timer.start()
    return timer


def _done(holder: Any) -> None:
    holder.stdin.close()  # (lets go at once, if not yet told)
    holder.wait(30)


def test_a_release_is_recorded_when_the_lock_is_held_past_lock_timeout(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    led = Ledger(str(path), lock_timeout=0.5)
    entry = led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})
    holder = _hold(path)
    timer = None
    try:
        with pytest.raises(LedgerError, match="busy|gave up"):  # the control: a charge waits lock_timeout only
            led.reserve(Budget(0.1), mechanism="m", query="q2", tables=["t"], params={})
        # the holder lets go only once the release has waited past lock_timeout (0.5 s), by 0.25 s
        timer = _let_go_later(holder, 0.75)
        led.commit(entry)  # the release waits the holder out
    finally:
        if timer is not None:
            timer.join()
        _done(holder)
    assert led.entry(entry).status == "released"
    assert led.release_wait() == 0.5 + 10.0


def test_a_query_answers_when_another_process_holds_the_ledger_while_it_reads(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    s = dpsql.Session(str(path), Budget(1.0), create=True, lock_timeout=0.5)
    s.register("t", pa.table({"u": [1, 2, 3]}), privacy_unit="u")
    holders: list[Any] = []
    timers: list[threading.Timer] = []
    real, commit = s._engine.fetch_arrow, s.ledger.commit

    def fetch_then_hold(*a: object, **k: object) -> pa.Table:  # another process takes the lock during the read
        out = real(*a, **k)
        holders.append(_hold(path))
        return out

    def commit_while_held(*a: Any, **k: Any) -> Any:  # the holder lets go once the release has waited past
        timers.extend(_let_go_later(h, 0.75) for h in holders)  # lock_timeout (0.5 s), by 0.25 s
        return commit(*a, **k)

    s._engine.fetch_arrow = fetch_then_hold  # type: ignore[method-assign]
    s.ledger.commit = commit_while_held  # type: ignore[method-assign]
    try:
        r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1)
    finally:
        for t in timers:
            t.join()
        for h in holders:
            _done(h)
    assert holders and timers and s.ledger.entry(r.ledger_id).status == "released"


# holds the ledger file open in DuckDB (a program that is not dpsql) until its stdin closes
DUCK_HOLDER = """
import sys, duckdb
con = duckdb.connect(sys.argv[1])
print("inside", flush=True)
sys.stdin.read()
"""


def test_a_release_that_gives_up_says_how_long_it_waited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release waits ``release_wait`` (not ``lock_timeout``): the message that it gave up states the time it waited,
    also while a program that is not dpsql holds the file (it said 'gave up after 0.1 s' after waiting 1.5 s)."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    led = Ledger(str(path), lock_timeout=0.1)
    entry = led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})
    monkeypatch.setattr(Ledger, "release_wait", lambda self: 0.75)  # (well apart from lock_timeout)
    holder = spawn_python(DUCK_HOLDER, str(path))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "inside"
        with pytest.raises(LedgerError, match="not dpsql") as e:
            led.commit(entry)
    finally:
        holder.stdin.close()  # type: ignore[attr-defined]
        holder.wait(30)  # type: ignore[attr-defined]
    assert float(str(e.value).split("gave up after ", 1)[1].split(" s", 1)[0]) >= 0.7


def test_an_in_memory_ledger_release_waits_as_long_as_a_files() -> None:
    """Another thread inside an in-memory ledger's operation: a release waits ``release_wait`` there too (it gave up
    after ``lock_timeout``, the answer already paid for thrown away)."""
    import threading

    led = Ledger.create(None, Budget(1.0), lock_timeout=0.2)
    entry = led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})
    led._mem_lock.acquire()  # another thread's operation, until the release has waited twice lock_timeout
    with pytest.raises(LedgerError, match="busy"):  # the control: a charge waits lock_timeout only
        led.reserve(Budget(0.1), mechanism="m", query="q2", tables=["t"], params={})
    threading.Timer(0.4, led._mem_lock.release).start()
    led.commit(entry)
    assert led.entry(entry).status == "released"


@pytest.mark.parametrize("lock_timeout", [4e9, 1e300])
def test_an_in_memory_ledger_takes_any_lock_timeout(lock_timeout: float) -> None:
    """A lock_timeout (or a release's longer wait) past what the thread lock's time-out can hold raised a raw
    OverflowError ('timestamp out of range for platform time_t'); a file ledger took it."""
    led = Ledger.create(None, Budget(1.0), lock_timeout=lock_timeout)
    entry = led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})
    led.commit(entry)
    assert led.entry(entry).status == "released"


def test_the_cli_help_says_a_release_waits_longer(capsys: pytest.CaptureFixture[str]) -> None:
    """``--lock-timeout 0`` still waits for a busy ledger (10 s) to record an answered query's release: the help says so."""
    from dpsql.cli import main

    assert main(["query", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "release" in text.split("--lock-timeout SECONDS")[-1].split(" --", 1)[0]
