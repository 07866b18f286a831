"""dpsql in one process with threads: Sessions, ledgers and connections shared by threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import duckdb
import pytest
from conftest import run_alone, sigint_storm_while_charging, stepped_signal

import dpsql
from dpsql.budget import Budget

pytestmark = pytest.mark.usefixtures("python_sigint")


def _settings(con: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    return tuple(con.execute("SELECT current_setting('threads'), current_setting('memory_limit'), "
                             "current_setting('preserve_insertion_order')").fetchall()[0])


def test_sessions_sharing_a_callers_connection_in_threads_take_turns() -> None:
    """Finding (fixed): Sessions on one caller's connection (``Session(connection=con)``, one per worker thread)
    each locked only their own engine, so two of them ran DuckDB calls on the connection at once. DuckDB refused
    one (a raw ``ResourceInUseException``, or a ConfigError telling to ROLLBACK a failed transaction) or handed
    one call's result to the other's ``fetchall`` (a raw IndexError); a read refused after its charge failed
    with the charge standing; and the caller's settings (threads) were left at dpsql's limits. The
    engines on one connection now share its lock."""
    con = duckdb.connect()
    con.execute("CREATE TABLE big AS SELECT range AS uid FROM range(50000)")
    con.execute("CREATE TABLE small AS SELECT range AS uid FROM range(100)")
    con.execute("SET threads = 3; SET memory_limit = '1GiB'")  # values the engine's limits change and restore exactly
    before = _settings(con)
    sessions = []
    for _ in range(4):
        s = dpsql.Session(None, Budget(1e6), connection=con)
        s.register("big", "big", privacy_unit="uid")
        s.register("small", "small", privacy_unit="uid")
        sessions.append(s)
    bar = threading.Barrier(len(sessions))
    bad: list[Any] = []

    def run(i: int) -> None:
        bar.wait(30)
        for j in range(12):
            name, n = (("big", 50000), ("small", 100))[(i + j) % 2]
            try:
                got = sessions[i].query(f"SELECT COUNT(*) AS n FROM {name}", epsilon=5.0).table.column(0)[0].as_py()
                if abs(got - n) > 50:
                    bad.append((name, got))
            except Exception as e:  # noqa: BLE001
                bad.append((type(e).__name__, str(e)[:200]))

    with ThreadPoolExecutor(len(sessions)) as ex:
        _, pending = wait([ex.submit(run, i) for i in range(len(sessions))], timeout=60)
    assert not pending and bad == []
    for s in sessions:
        assert [e["status"] for e in s.history().to_pylist()] == ["released"] * 12
        s.close()
    assert _settings(con) == before


def _session_on_a_table_of_1000() -> tuple[duckdb.DuckDBPyConnection, dpsql.Session]:
    """A caller's connection holding a table t of 1000 persons, and a Session on it."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS uid FROM range(1000)")
    s = dpsql.Session(None, Budget(100.0), connection=con)
    s.register("t", "t", privacy_unit="uid")
    return con, s


def _blocking_call(con: duckdb.DuckDBPyConnection, started: threading.Event, go: threading.Event) -> threading.Thread:
    """The caller's own thread, in a DuckDB call on ``con`` until ``go`` (a Python function it calls waits)."""
    def pause(x: int) -> int:
        started.set()
        go.wait(20)
        return x

    name = f"pause_{id(go)}"
    con.create_function(name, pause, ["BIGINT"], "BIGINT")
    t = threading.Thread(target=lambda: con.execute(f"SELECT {name}(42)").fetchall())
    t.start()
    assert started.wait(20)
    return t


def _end_when_refused(monkeypatch: Any, ends: list[threading.Event], after: float = 0.0) -> None:
    """Set every event of ``ends`` (the script's calls end) as soon as the engine has found its connection busy and
    waits to call it again (its one pause: the retry of ``dpsql.engine.duckdb._Patient``), or ``after`` seconds
    from then."""
    import dpsql.engine.duckdb as engine

    real = engine.time

    def end(events: list[threading.Event]) -> None:
        for e in events:
            e.set()

    class Clock:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            if ends and not after:
                end(ends)
            elif ends:  # once: the events leave the list, set by a timer
                threading.Timer(after, end, (ends[:],)).start()
                ends.clear()
            real.sleep(seconds)

    monkeypatch.setattr(engine, "time", Clock())


def test_a_query_waits_for_the_callers_own_call_on_its_connection_in_another_thread(monkeypatch: Any) -> None:
    """Finding (fixed): an ETL script that kept using its DuckDB connection in one thread while a Session on it
    queried in another made DuckDB refuse dpsql's calls at once (``ResourceInUseException``: a DuckDB connection
    runs one call at a time). Before the charge that was a ConfigError telling to ROLLBACK a failed transaction,
    a QueryTypeError ("does not type-check"), a table that "changed its columns", or a raw IndexError (a
    ``fetchall`` took the script's result); after it, the read failed with the charge standing (13 of 20 queries
    against a script calling the connection in a loop). dpsql's calls now wait for the script's call to end."""
    con, s = _session_on_a_table_of_1000()
    started, go = threading.Event(), threading.Event()
    ends = [go]
    t = _blocking_call(con, started, go)
    _end_when_refused(monkeypatch, ends)  # the script's call ends once dpsql found the connection busy and waits
    try:
        got = s.query("SELECT COUNT(*) AS n FROM t", epsilon=5.0).table.column(0)[0].as_py()
        assert go.is_set()  # (dpsql did find the connection busy, and waited)
    finally:
        go.set()
        t.join(20)
    assert abs(got - 1000) < 50
    # the script's call begins after the charge, before the read
    reserve = s.ledger.reserve
    threads: list[threading.Thread] = []

    def reserve_then_call(*a: Any, **k: Any) -> int:
        entry = reserve(*a, **k)
        threads.append(_blocking_call(con, threading.Event(), go2))
        ends[:] = [go2]  # ends once the read found the connection busy and waits
        return entry

    go2 = threading.Event()
    s.ledger.reserve = reserve_then_call  # type: ignore[method-assign]
    try:
        got = s.query("SELECT COUNT(*) AS n FROM t", epsilon=5.0).table.column(0)[0].as_py()
        assert threads and go2.is_set()  # (the read did find the connection busy, and waited)
    finally:
        s.ledger.reserve = reserve  # type: ignore[method-assign]
        go2.set()
        for t in threads:
            t.join(20)
    assert abs(got - 1000) < 50
    assert [e["status"] for e in s.history().to_pylist()] == ["released", "released"]
    s.close()


def test_a_connection_busy_in_another_thread_for_long_is_refused_before_the_charge(monkeypatch: Any) -> None:
    """A script's call on the connection that outlasts dpsql's wait: the request is refused before its charge,
    saying why (never a misleading refusal or a raw exception)."""
    import dpsql.engine.duckdb as engine

    monkeypatch.setattr(engine, "_BUSY_WAIT", 0.2, raising=False)
    con, s = _session_on_a_table_of_1000()
    started, go = threading.Event(), threading.Event()
    t = _blocking_call(con, started, go)
    try:
        for call in (lambda: s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0),
                     lambda: s.explain("SELECT COUNT(*) AS n FROM t", epsilon=1.0)):
            try:
                call()
                raise AssertionError("answered on a busy connection")
            except dpsql.errors.ConfigError as e:
                assert "busy with calls from another thread" in str(e) and "nothing was charged" in str(e)
                assert "con.cursor()" in str(e.hint)
    finally:
        go.set()
        t.join(20)
    assert s.history().num_rows == 0 and s.remaining() == Budget(100.0)
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.num_rows == 1  # free again: answered
    # after the charge the read waits longer (up to the statement time-out): the charge is not wasted
    reserve, go2, threads = s.ledger.reserve, threading.Event(), list[threading.Thread]()
    ends: list[threading.Event] = []
    # the script's call ends 0.4 s (twice the wait before the charge) after the read found the connection busy
    _end_when_refused(monkeypatch, ends, after=0.4)

    def reserve_then_call(*a: Any, **k: Any) -> int:
        entry = reserve(*a, **k)
        threads.append(_blocking_call(con, threading.Event(), go2))
        ends.append(go2)
        return entry

    s.ledger.reserve = reserve_then_call  # type: ignore[method-assign]
    try:
        assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.num_rows == 1
        assert threads and go2.is_set()  # (the read did find the connection busy, and waited past 0.2 s)
    finally:
        s.ledger.reserve = reserve  # type: ignore[method-assign]
        go2.set()
        for t in threads:
            t.join(20)
    assert [e["status"] for e in s.history().to_pylist()] == ["released", "released"]
    s.close()




@pytest.mark.parametrize("statement", ["DETACH", "ATTACH"])
def test_an_interrupt_during_the_ledgers_detach_leaves_the_ledger_usable(tmp_path: Any, monkeypatch: Any,
                                                                          statement: str) -> None:
    """Finding (fixed): Ctrl-C (or a signal handler's exception) that arrived while a ledger operation DETACHed the
    file left it attached to the process's ledger instance: every later operation of the process, in every thread
    (an ETL script's workers, a notebook after the interrupt), waited lock_timeout for "another DuckDB connection
    in this process" and failed, and DuckDB's lock kept other processes out, until the process ended. The
    interrupt is now raised once the file is detached. Likewise an interrupt right after the ATTACH ran (Python
    runs a signal's handler once DuckDB's call returns)."""
    from dpsql.errors import LedgerError
    from dpsql.ledger import Ledger, _store

    path = tmp_path / "l.duckdb"
    Ledger.create(path, Budget(1.0))
    led = Ledger.open(path, lock_timeout=1.0)
    real = _store._base_connection

    class Cursor:
        def __init__(self, cur: Any) -> None:
            self._cur = cur

        def execute(self, sql: str, *a: Any) -> Any:
            if sql.startswith(statement) and not fired:
                fired.append(1)
                if statement == "ATTACH":
                    self._cur.execute(sql, *a)
                raise KeyboardInterrupt  # the signal's handler ran before DuckDB's DETACH, or after its ATTACH
            return self._cur.execute(sql, *a)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._cur, name)

    class Base:
        def cursor(self) -> Cursor:
            return Cursor(real().cursor())

        def __getattr__(self, name: str) -> Any:
            return getattr(real(), name)

    fired: list[int] = []
    monkeypatch.setattr(_store, "_base_connection", lambda: Base())
    with pytest.raises(KeyboardInterrupt):
        led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})
    assert fired
    out: list[Any] = []

    def other_thread() -> None:
        try:
            out.append(led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={}))
        except LedgerError as e:
            out.append(e)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(20)
    # interrupted at its DETACH, the charge stands (entry 1) and the next one is made; at its ATTACH, none was made
    assert out == ([2] if statement == "DETACH" else [1])
    assert Ledger.open(path).spent() == Budget(0.2 if statement == "DETACH" else 0.1)


def test_suggest_caps_and_register_around_a_close_in_another_thread_say_the_session_is_closed() -> None:
    """Finding (fixed): ``suggest_caps`` on a Session that another thread of the ETL script had closed was refused as
    "the query does not type-check against the table's columns (ConnectionException)" (32 workers, a close after
    0.5 s: 64 of 320 requests), and a ``register`` whose check passed just before another thread's ``close`` failed
    with "cannot read table source ... check that the file exists". Both now say that the Session is closed."""
    import pyarrow as pa
    import pytest

    s = dpsql.Session(None, Budget(10.0))
    s.register("t", pa.table({"uid": [1, 2, 3]}), privacy_unit="uid")
    check = s._check_open
    closer: list[threading.Thread] = []

    def check_then_close() -> None:
        check()
        if not closer:  # another thread closes the Session right after this check
            closer.append(threading.Thread(target=s.close))
            closer[0].start()
            closer[0].join(0.5)  # before the fix it is closed at once; with it, it waits for the registration

    s._check_open = check_then_close  # type: ignore[method-assign]
    s.register("u", pa.table({"uid": [1, 2, 3]}), privacy_unit="uid")  # registered, then closed
    closer[0].join(20)
    assert not closer[0].is_alive()
    with pytest.raises(dpsql.errors.ConfigError, match="this Session is closed"):
        s.suggest_caps("t", epsilon=1.0)
    with pytest.raises(dpsql.errors.ConfigError, match="this Session is closed"):
        s.register("v", pa.table({"uid": [1]}), privacy_unit="uid")


def test_a_result_left_unfetched_on_the_connection_is_named_in_the_refusal(monkeypatch: Any) -> None:
    """Finding (fixed): a single-threaded program that left a result of ``con.execute()`` unfetched on the
    connection it gave the Session was refused with "busy with calls from another thread" (DuckDB refuses other
    work on a connection until such a result is fetched): the refusal now names the unfetched result and how to
    fix it, and nothing is charged."""
    import dpsql.engine.duckdb as engine

    monkeypatch.setattr(engine, "_BUSY_WAIT", 0.2, raising=False)
    con, s = _session_on_a_table_of_1000()
    con.execute("SELECT * FROM range(10000)")  # the program's own result, not fetched
    try:
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        raise AssertionError("answered on a connection holding an unfetched result")
    except dpsql.errors.ConfigError as e:
        assert "not fetched to its end" in str(e) and "nothing was charged" in str(e)
        assert "fetchall()" in str(e.hint)
    con.fetchall()
    assert s.history().num_rows == 0
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.num_rows == 1
    s.close()


def _stepped_sigint(n: int, module: Any = None, signum: int = 2) -> Any:
    """SIGINT (or ``signum``) at the ``n``-th signal point of ``module``'s code (the ledger's; ``conftest.stepped_signal``)."""
    from dpsql.ledger import _store

    return stepped_signal(n, {(module or _store).__file__}, signum)


class _Terminated(KeyboardInterrupt):
    """What the CLI's SIGTERM handler raises."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_at_any_point_of_a_ledger_operation_leaves_nothing_taken(tmp_path: Any, sig: str, request: pytest.FixtureRequest) -> None:
    """Finding (fixed): Ctrl-C lands between any two steps of the main thread (where Python runs a signal's handler).
    Landing after the ledger's fairness queue gave a slot but before the ``try`` that gives it back, or inside the
    code that gives it back, the slot stayed taken: the next waiter, in any thread or process, waited out its
    lock_timeout (a release then failed after its charge). Elsewhere the inode lock's descriptor stayed locked
    (every later operation waited and failed), the file stayed attached to the process's DuckDB ("held open by
    another DuckDB connection in this process" for every later operation, a worker's release included), or the
    thread stayed marked as inside an operation (every later operation of the thread refused). A ledger operation
    in the main thread now holds Ctrl-C back and raises it where it waits for a lock or once it has given back
    all it took. Here SIGINT comes at one such point after another of a charge; and SIGTERM with a handler that
    raises (the CLI's), which was not held back (it left the same behind)."""
    if run_alone(request):
        return
    import signal

    signum = getattr(signal, sig)
    handler = signal.getsignal(signum) if sig == "SIGINT" else _raise_terminated
    previous = signal.signal(signum, handler)
    try:
        _stepped_through(tmp_path, signum, handler)
    finally:
        signal.signal(signum, previous)


def _stepped_through(tmp_path: Any, signum: int, handler: Any) -> None:
    import glob
    import signal
    import sys

    from dpsql.ledger import Ledger, _store

    path = tmp_path / "l.duckdb"
    Ledger.create(path, Budget(1e6))
    led = Ledger.open(path, lock_timeout=0.3)

    def reserve() -> None:
        led.reserve(Budget(0.001), mechanism="m", query="q", tables=["t"], params={})

    counting, before = _stepped_sigint(10**9), sys.gettrace()  # a tracer of the run (coverage) is put back
    sys.settrace(counting)
    try:
        reserve()
    finally:
        sys.settrace(before)
    points = counting.seen[0]
    assert points > 100
    interrupted = 0
    for n in range(1, points + 1, 3):
        sys.settrace(_stepped_sigint(n, signum=signum))
        try:
            try:
                reserve()
            finally:
                sys.settrace(before)
        except KeyboardInterrupt:
            interrupted += 1
        st = _store._state()
        left = {"queue slot or its predecessor's": set(st.other_fds), "inode lock": set(st.used_fds),
                "attached": dict(st.attached), "slot file": glob.glob(str(tmp_path / ".l.duckdb.q-*")),
                "thread inside": set(led._inside)}
        assert not any(left.values()), (n, left)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and signal.getsignal(signum) is handler
    assert interrupted > points // 6  # Ctrl-C was raised (held back to the end of the step, or where it waits)
    assert set(Ledger.open(path).history().column("status").to_pylist()) == {"reserved"}  # each charge whole


def test_a_sigint_storm_in_the_main_thread_costs_worker_threads_nothing(tmp_path: Any) -> None:
    """Ctrl-C every 5-50 ms at the main thread, which charges and releases on a file ledger while three worker
    threads query on it: every worker's query is answered, none waits for a slot or lock left taken, nothing is
    left taken afterwards (before, about one run in ten left a queue slot taken: workers waited out lock_timeout)."""
    import glob
    import signal
    import time

    from dpsql.ledger import Ledger, _store

    path = str(tmp_path / "l.duckdb")
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS uid FROM range(1000)")
    sessions = [dpsql.Session(path, Budget(1e9), create=i == 0, lock_timeout=5.0, connection=con.cursor())
                for i in range(3)]
    led = Ledger.open(path, lock_timeout=5.0)
    for s in sessions:
        s.register("t", "t", privacy_unit="uid")
    stop, bad, slow, answered = threading.Event(), list[str](), list[float](), [0]

    def work(s: dpsql.Session) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                s.query("SELECT COUNT(*) AS w FROM t", epsilon=1.0)
                answered[0] += 1
            except BaseException as e:  # noqa: BLE001
                bad.append(repr(e)[:300])
            if time.monotonic() - t0 > 4.0:  # waited out most of lock_timeout (a slow machine: a query in 0.1-1 s)
                slow.append(time.monotonic() - t0)

    interrupted = sigint_storm_while_charging(led, [threading.Thread(target=work, args=(s,)) for s in sessions], stop, 7)
    assert interrupted > 10 and answered[0] >= 3
    assert bad == [] and slow == []
    st = _store._state()
    assert not st.other_fds and not st.used_fds and not st.attached
    assert glob.glob(str(tmp_path / ".l.duckdb.q-*")) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    statuses = [(e["query"], e["status"]) for e in sessions[0].history().to_pylist()]
    assert sum(1 for q, st_ in statuses if "AS w" in q and st_ == "released") == answered[0]
    assert all(st_ == "released" for q, st_ in statuses if "AS w" in q)
    for s in sessions:
        s.close()


def test_ctrl_c_during_a_call_on_the_callers_connection_is_a_keyboard_interrupt() -> None:
    """Finding (fixed): Ctrl-C while dpsql's check of a caller's connection ran (before the charge) came out of
    ``query`` as DuckDB client's raw ``RuntimeError('Query interrupted')``; every call on a caller's connection now
    turns it into the KeyboardInterrupt it stands for."""
    import pytest

    from dpsql.engine.duckdb import _Patient

    class Interrupted:
        def sql(self, *a: Any) -> Any:
            raise RuntimeError("Query interrupted")

        def execute(self, *a: Any) -> Any:
            raise RuntimeError("something else")

    con = _Patient(Interrupted())
    with pytest.raises(KeyboardInterrupt):
        con.sql("SELECT 1")
    with pytest.raises(RuntimeError, match="something else"):
        con.execute("SELECT 1")


def test_ctrl_c_at_any_point_of_a_sessions_count_of_requests_leaves_it_usable(request: pytest.FixtureRequest) -> None:
    """Finding (fixed): Ctrl-C landing after a Session counted a request in flight but before the ``try`` that
    uncounts it, or inside uncounting it, left it counted: every later call of the Session in that thread was
    refused ("a Session was called inside its own request ... in the same thread"), and ``close`` (or a
    registration) in any thread waited for ever. The count is now taken and given back with Ctrl-C held back in
    the main thread. Here SIGINT comes at one such point after another of a query."""
    if run_alone(request):
        return
    import signal
    import sys

    from dpsql import catalog

    con, s = _session_on_a_table_of_1000()
    lock = s._catalog_lock

    def query() -> None:
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.01)

    counting, before = _stepped_sigint(10**9, catalog), sys.gettrace()
    sys.settrace(counting)
    try:
        query()
    finally:
        sys.settrace(before)
    points = counting.seen[0]
    assert points > 20
    for n in range(1, points + 1):
        sys.settrace(_stepped_sigint(n, catalog))
        try:
            try:
                query()
            finally:
                sys.settrace(before)
        except KeyboardInterrupt:
            pass
        assert (lock._readers, lock._writers, lock._holders, lock._writing) == (0, 0, {}, False), n
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    query()
    done = threading.Thread(target=s.close)
    done.start()
    done.join(20)
    assert not done.is_alive()


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_ctrl_c_during_a_charge_before_its_commit_charges_nothing(tmp_path: Any, kind: str) -> None:
    """Ctrl-C held back during a ledger operation in the main thread is raised before its COMMIT where it came
    before it: the charge is rolled back (nothing charged), not recorded and then interrupted."""
    import signal

    from dpsql.ledger import Ledger, open_ledger

    if kind == "file":
        Ledger.create(tmp_path / "l.duckdb", Budget(1.0))
    led = open_ledger(tmp_path / "l.duckdb" if kind == "file" else None, Budget(1.0))
    state = led._budget_state

    def interrupted(con: Any) -> Any:  # inside the charge's transaction: Ctrl-C comes
        signal.raise_signal(signal.SIGINT)
        return state(con)

    led._budget_state = interrupted  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})
    finally:
        led._budget_state = state  # type: ignore[method-assign]
    assert led.history().num_rows == 0 and led.spent() == Budget(0.0)
    assert led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={}) == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
