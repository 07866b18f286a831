"""What an analyst observes besides the released values, on neighbouring datasets: the text of errors (with their
chained causes and arguments), warnings, log records, and when an interrupted query returns.

* Errors: one person's value that DuckDB itself would quote (a cast of text that fails) appears in no exception
  text, ``repr``, ``args``, chained cause or context, warning or log record, and the outcome is the same with and
  without that person (negative control: DuckDB's own error quotes it).
* Interrupts: with ``min_response_time`` set, a query interrupted by the analyst (Ctrl-C, SIGTERM under the CLI)
  returned at once when its read had finished and the run was sleeping to its padded time, but only at the padded
  time when the read was still running (the interrupt stops the read, then the run sleeps to its pad). So the moment
  the interrupt was answered told whether the read had finished by then, which is what the pad hides: measured with
  a pad of 3 s and Ctrl-C after 1 s, a SUM over 1 000 people answered the interrupt after 1.005 s, and over the same
  people and one more holding 2 million rows after 3.13 s (uninterrupted, both answered in 3.3-3.4 s). The
  interrupt raised also differed: ``KeyboardInterrupt('<withheld>')`` (its text withheld as a failure's) where it
  stopped the read, ``KeyboardInterrupt()`` where it landed in the padding.
* A free request of another thread (``explain``) during a padded query waited for the engine only while the read
  ran, so it returned when the read ended: for free, it timed the read the pad hid (pad 6 s: an explain asked 0.1 s
  into the query returned within 0.2 s without one person, after 5.0 s with that person's 2 million rows). Likewise
  a padded query charged while another run held the engine was padded from its charge, its pad used up waiting.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

SECRET = "Zq7SECRETVALUE"


def _people(with_person: bool) -> pa.Table:
    n = 30
    uid = list(range(1, n + 1))
    note = ["12"] * n
    amount = [float(i % 10) for i in range(n)]
    if with_person:
        uid.append(10_000)
        note.append(SECRET)
        amount.append(1e300)
    return pa.table({"uid": pa.array(uid, pa.int64()), "note": note, "amount": amount})


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(f"{record.name}:{record.levelno}:{record.getMessage()}")


@contextlib.contextmanager
def _all_logs() -> Iterator[_Records]:
    """Every logger at DEBUG, recorded (the levels given back afterwards)."""
    rec = _Records()
    root = logging.getLogger()
    loggers = [root, *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    levels = [lg.level for lg in loggers]
    root.addHandler(rec)
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
    try:
        yield rec
    finally:
        root.removeHandler(rec)
        for lg, lvl in zip(loggers, levels, strict=True):
            lg.setLevel(lvl)


def _chain(e: BaseException) -> list[tuple[str, ...]]:
    """Class, text, repr, args and attributes of ``e`` and of every exception chained to it."""
    out, seen, stack = [], set(), [e]
    while stack:
        cur = stack.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        out.append((type(cur).__name__, str(cur), repr(cur), repr(cur.args), repr(getattr(cur, "__dict__", {}))))
        stack += [cur.__context__, cur.__cause__]
    return out


def _observe(with_person: bool, sql: str) -> dict[str, Any]:
    """Everything the caller sees of ``sql`` except the released values."""
    seen: dict[str, Any] = {}
    with _all_logs() as logs, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
        try:
            use_noise(s, zero_noise(3))
            s.register("t", _people(with_person), privacy_unit="uid", columns={"amount": {"bounds": (0, 10)}})
            try:
                r = s.query(sql, epsilon=1.0, delta=1e-6)
                seen["schema"] = str(r.table.schema)
                seen["details"] = repr(r.details)
            except Exception as e:  # noqa: BLE001 - compared below
                seen["error"] = _chain(e)
                seen["traceback"] = "".join(traceback.format_exception(e))
            seen["history"] = [(h["status"], h["mechanism"], h["query"], h["params"]) for h in s.history().to_pylist()]
        finally:
            s.close()
    seen["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    seen["logs"] = logs.texts
    return seen


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE CAST(note AS INTEGER) > 3",
    "SELECT SUM(amount) FROM t WHERE CAST(note AS DATE) > DATE '2020-01-01'",
    "SELECT note, COUNT(*) FROM t GROUP BY note",
])
def test_one_persons_value_is_in_no_error_warning_or_log_and_changes_no_outcome(sql: str) -> None:
    without, with_person = _observe(False, sql), _observe(True, sql)
    assert SECRET not in repr(with_person)
    assert "error" not in with_person
    assert {k: v for k, v in without.items() if k != "traceback"} == {k: v for k, v in with_person.items()
                                                                      if k != "traceback"}


def test_negative_control_duckdb_itself_quotes_the_value_only_with_that_person() -> None:
    """The comparison above can fail: DuckDB's own CAST fails, quoting the value, exactly where the person is."""
    def raw(with_person: bool) -> str:
        con = duckdb.connect()
        con.register("t", _people(with_person))
        try:
            con.execute("SELECT COUNT(*) FROM t WHERE CAST(note AS INTEGER) > 3").fetchall()
            return "answered"
        except duckdb.Error as e:
            return "".join(traceback.format_exception(e))
        finally:
            con.close()

    assert raw(False) == "answered"
    assert SECRET in raw(True)


# -- interrupts while the run is padded to min_response_time -----------------------------------------------------

PAD = 1.0
AT = 0.15  # when the interrupt (or another thread's request) arrives, from the read's start: after a fast read has
# ended, during a slow one


def _interrupted_after(python_sigint: Any, monkeypatch: pytest.MonkeyPatch,
                       read_seconds: float) -> tuple[float, str, tuple[Any, ...]]:
    """Seconds until an interrupt sent ``AT`` s into the private read of a query returns, where it landed (the read
    or after it), and the exception as the caller sees it. A read of ``read_seconds`` stands for one person's rows
    making the private read longer (a real read: over 1 s against 0.05 s for one person's 2 million rows, module
    docstring)."""
    import dpsql.session

    real = dpsql.session.backends.fetch_bounded
    landed: list[str] = []
    timers: list[threading.Timer] = []

    def fetch(engine: Any, ast: Any) -> Any:
        timers.append(threading.Timer(AT, os.kill, (os.getpid(), signal.SIGINT)))
        timers[0].start()
        out = real(engine, ast)
        try:
            time.sleep(max(0.0, read_seconds))
        except KeyboardInterrupt:
            landed.append("during the read")
            raise
        landed.append("after the read")
        return out

    monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", fetch)
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine={"min_response_time": PAD})
    try:
        s.register("t", _people(False), privacy_unit="uid", columns={"amount": {"bounds": (0, 10)}})
        start = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt) as e:
                s.query("SELECT SUM(amount) FROM t", epsilon=0.5, delta=1e-6)
            took = time.monotonic() - start
        finally:
            for t in timers:
                t.join()
        assert e.value.ledger_entry == (1, "failed")  # type: ignore[attr-defined]
        shown = (type(e.value).__name__, repr(e.value), e.value.args, _chain(e.value), sorted(vars(e.value)),
                 e.value.__suppress_context__, [f.name for f in traceback.extract_tb(e.value.__traceback__)])
        assert [h["status"] for h in s.history().to_pylist()] == ["failed"]
    finally:
        s.close()
        monkeypatch.undo()
    return took, landed[0], shown


def test_an_interrupt_returns_at_the_padded_time_whether_the_read_had_ended_or_not(python_sigint: Any,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fast, where_fast, shown_fast = _interrupted_after(python_sigint, monkeypatch, 0.0)
    slow, where_slow, shown_slow = _interrupted_after(python_sigint, monkeypatch, 3 * PAD)
    # control: the interrupt found the two runs in different states (a read that had ended, one still running)
    assert (where_fast, where_slow) == ("after the read", "during the read")
    # before: the fast read's run answered the interrupt at once (about AT s), the slow one at the pad (PAD s)
    assert PAD - 0.05 <= fast < PAD + 1.0, fast
    assert PAD - 0.05 <= slow < PAD + 1.0, slow
    # and the interrupt itself is the same (it was KeyboardInterrupt('<withheld>') where it stopped the read, its
    # text withheld as a failure's, and KeyboardInterrupt() where it landed in the padding)
    assert shown_fast == shown_slow


# -- a free request of another thread while a padded run reads ---------------------------------------------------

def _explain_finished_at(monkeypatch: pytest.MonkeyPatch, read_seconds: float) -> float:
    """When (seconds from the query's start) a free ``explain``, asked from another thread ``AT`` s into the private
    read of a query padded to ``PAD`` s, returned. A read of ``read_seconds`` holds the engine as a private read does
    (one person's rows making it longer: 5.0 s against under 0.2 s for one person's 2 million rows, with a 6 s pad)."""
    import dpsql.session

    real = dpsql.session.backends.fetch_bounded
    reading = threading.Event()

    def fetch(engine: Any, ast: Any) -> Any:
        with engine._lock:  # as DuckDBBackend.fetch_arrow holds it for the read
            reading.set()
            out = real(engine, ast)
            time.sleep(read_seconds)
        return out

    monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", fetch)
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine={"min_response_time": PAD})
    finished: list[float] = []
    try:
        s.register("t", _people(False), privacy_unit="uid", columns={"amount": {"bounds": (0, 10)}})

        def probe() -> None:
            assert reading.wait(30)
            time.sleep(AT)
            # a query not asked before (no remembered bind check), as an analyst would vary it
            s.explain("SELECT COUNT(*) FROM t WHERE amount > 7", epsilon=0.5, delta=1e-6)
            finished.append(time.monotonic() - start)

        other = threading.Thread(target=probe)
        start = time.monotonic()
        other.start()
        try:
            s.query("SELECT SUM(amount) FROM t", epsilon=0.5, delta=1e-6)
        finally:
            other.join()
    finally:
        s.close()
        monkeypatch.undo()
    return finished[0]


def test_a_free_request_of_another_thread_does_not_time_a_padded_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the explain waited for the engine while the read ran and returned as soon as the read ended (at about
    AT s after a fast read, at about AT + the read's time after a slow one), so, for free, it timed a read that the
    query's own response time (padded) hid."""
    fast = _explain_finished_at(monkeypatch, 0.0)
    slow = _explain_finished_at(monkeypatch, 0.6)
    assert PAD - 0.05 <= fast < PAD + 1.0, fast
    assert PAD - 0.05 <= slow < PAD + 1.0, slow


def _second_query_finished_at(monkeypatch: pytest.MonkeyPatch, read_seconds: float) -> float:
    """When (seconds from the first query's start) a second padded query of another thread returned, asked ``AT`` s
    into the first one's read, its own read taking ``read_seconds`` (its bind check remembered from an explain, so it
    is charged at once and then waits for the engine)."""
    import dpsql.session

    real = dpsql.session.backends.fetch_bounded
    reading = threading.Event()
    pad = PAD / 2

    def fetch(engine: Any, ast: Any) -> Any:
        with engine._lock:  # as DuckDBBackend.fetch_arrow holds it for the read
            out = real(engine, ast)
            if threading.current_thread() is threading.main_thread():
                reading.set()
            else:
                time.sleep(read_seconds)
        return out

    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine={"min_response_time": pad})
    finished: list[float] = []
    try:
        s.register("t", _people(False), privacy_unit="uid", columns={"amount": {"bounds": (0, 10)}})
        second = "SELECT COUNT(*) FROM t WHERE amount > 7"
        s.explain(second, epsilon=0.5, delta=1e-6)  # its bind check is remembered
        monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", fetch)

        def other_query() -> None:
            assert reading.wait(30)
            time.sleep(AT / 2)
            s.query(second, epsilon=0.5, delta=1e-6)
            finished.append(time.monotonic() - start)

        other = threading.Thread(target=other_query)
        start = time.monotonic()
        other.start()
        try:
            s.query("SELECT SUM(amount) FROM t", epsilon=0.5, delta=1e-6)
        finally:
            other.join()
    finally:
        s.close()
        monkeypatch.undo()
    return finished[0]


def test_a_padded_query_waiting_for_another_ones_padded_end_is_padded_from_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the second query's pad ran from its charge, while it waited for the first run, so its read came after
    most of its pad and its own time showed through (about 0.15 s later with a read of 0.3 s than with none)."""
    fast = _second_query_finished_at(monkeypatch, 0.0)
    slow = _second_query_finished_at(monkeypatch, 0.3)
    assert PAD - 0.05 <= fast < PAD + 1.0, fast  # the first run's padded end, then a pad of its own
    assert PAD - 0.05 <= slow < PAD + 1.0, slow
