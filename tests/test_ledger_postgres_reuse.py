"""The PostgreSQL ledger keeps its connections open between operations and reuses them.

Opening a connection (and warming a new server backend's caches) was most of a ledger operation's
time: every operation opened one. Now a ledger keeps up to 4 per process (one per thread running an
operation at the same time) and reuses one while it is younger than 60 s and was idle for less than
30 s. What must not change: N threads or processes never overspend; a forked child never uses its
parent's connection; a connection the server dropped (a terminated backend, a restart) is replaced,
and an operation is retried only when the connection dropped before anything was charged, so a charge
is never made twice nor lost without an error.

Connections are counted in ``pg_stat_activity`` (each test has a database of its own) and through the
backend process id of the connection each statement ran on.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from _postgres import Server, running_bouncer, running_server

import dpsql
from dpsql.errors import BudgetExceededError, LedgerError
from dpsql.ledger import open_ledger
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from running_server()


@pytest.fixture
def url(server: Server) -> str:
    u = server.database("r_" + uuid.uuid4().hex[:12])
    open_ledger(u, dpsql.Budget(5.0, 0.0), create=True).close()
    return u


def _backends(server: Server, url: str) -> list[tuple[int, str]]:
    """The client connections to ``url``'s database: (backend pid, application name)."""
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as con:
        return [(r[0], r[1]) for r in con.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
            [url.rsplit("/", 1)[1]]).fetchall()]


def _settle(server: Server, url: str, n: int) -> list[tuple[int, str]]:
    """The connections, once at most ``n`` are left (a backend that was told to end leaves
    pg_stat_activity a moment later); bounded."""
    for _ in range(200):
        found = _backends(server, url)
        if len(found) <= n:
            return found
        time.sleep(0.05)
    return _backends(server, url)


def _terminate(server: Server, pid: int) -> None:
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute("SELECT pg_terminate_backend(%s)", [pid])
        for _ in range(200):  # until the backend is gone
            if not con.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchall():
                return
            time.sleep(0.05)


def _lose_acknowledgement(server: Server, monkeypatch: pytest.MonkeyPatch, spy: Any, statement: str) -> list[int]:
    """Every COMMIT is carried out; the first after ``statement`` was sent then loses its connection before the
    acknowledgement arrives (the backend terminated): the returned list gets that backend's pid."""
    import psycopg

    commit = psycopg.Connection.commit
    killed: list[int] = []

    def lost_acknowledgement(con: Any) -> None:
        commit(con)
        if spy.count(statement) and not killed:
            killed.append(con.info.backend_pid)
            _terminate(server, killed[0])
            con.execute("SELECT 1")  # the connection's failure, as the COMMIT would have seen it

    monkeypatch.setattr(psycopg.Connection, "commit", lost_acknowledgement)
    return killed


class Spy:
    """Records, for each ledger statement, the backend that ran it and its connection's settings."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from dpsql.ledger import _postgres

        self.seen: list[tuple[str, int, Any]] = []
        self.before: dict[str, Any] = {}  # statement prefix -> callable(connection), run once
        execute = _postgres._Con.execute
        spy = self

        def spying(con: Any, sql: str, params: Any = None) -> Any:
            spy.seen.append((sql, con._con.info.backend_pid, con._con.prepare_threshold))
            for prefix in list(spy.before):
                if sql.startswith(prefix):
                    spy.before.pop(prefix)(con._con)
            return execute(con, sql, params)

        monkeypatch.setattr(_postgres._Con, "execute", spying)

    def backends(self) -> list[int]:
        return list(dict.fromkeys(pid for _, pid, _ in self.seen))

    def count(self, prefix: str) -> int:
        return sum(sql.startswith(prefix) for sql, _, _ in self.seen)


def _charge(led: Any, eps: float = 0.1) -> int:
    entry: int = led.reserve(dpsql.Budget(eps, 0.0), mechanism="m", query="q", tables=["t"], params={})
    return entry


def _charge_in_threads(led: Any, threads: int, each: int) -> tuple[int, list[BaseException]]:
    """``threads`` threads each try ``each`` charges of 0.1 on ``led``; returns the number that
    succeeded and the errors other than an exhausted budget."""
    ok: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        for _ in range(each):
            try:
                led.commit(_charge(led))
                ok.append(1)
            except BudgetExceededError:
                pass
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return len(ok), errors


# -- reuse --------------------------------------------------------------------------------------------


def test_one_connection_serves_every_operation_of_a_ledger(server: Server, url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    for _ in range(10):
        led.commit(_charge(led))
        led.remaining()
    assert led.history().num_rows == 10
    assert len(spy.backends()) == 1, spy.backends()
    assert all(p is None for _, _, p in spy.seen)  # no prepared statements (safe behind pgbouncer)
    assert _backends(server, url) == [(spy.backends()[0], "dpsql ledger")]
    led.close()  # closing the ledger closes its connection
    assert _settle(server, url, 0) == []


def test_a_ledger_that_is_dropped_closes_its_connections(server: Server, url: str) -> None:
    led = open_ledger(url, None)
    led.remaining()
    assert len(_backends(server, url)) == 1
    del led
    gc.collect()
    assert _settle(server, url, 0) == []


def test_a_session_closes_its_ledger_connection(server: Server, url: str) -> None:
    s = dpsql.Session(ledger=url)
    assert s.remaining() == dpsql.Budget(5.0, 0.0)
    assert len(_backends(server, url)) == 1
    s.close()
    assert _settle(server, url, 0) == []


# -- threads: at most 4 connections, and never an overspend ------------------------------------------


def test_threads_share_at_most_four_connections_and_never_overspend(server: Server, url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 threads x 10 charges of 0.1 against a total of 5.0: exactly 50 succeed, whatever the interleaving
    spy = Spy(monkeypatch)
    led = open_ledger(url, None, lock_timeout=60)
    ok, errors = _charge_in_threads(led, threads=8, each=10)
    assert not errors, errors
    assert ok == 50
    h = led.history()
    assert sorted(h.column("entry_id").to_pylist()) == list(range(1, 51))
    assert set(h.column("status").to_pylist()) == {"released"}
    assert led.remaining().epsilon == pytest.approx(0.0, abs=1e-12)
    assert 1 <= len(spy.backends()) <= 4, spy.backends()
    assert len(_backends(server, url)) <= 4
    led.close()


def test_a_fifth_thread_waits_for_a_connection_only_up_to_lock_timeout(server: Server, url: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.ledger import _postgres

    led = open_ledger(url, None, lock_timeout=60)
    inside = threading.Semaphore(0)
    go_on = threading.Event()
    execute = _postgres._Con.execute

    def holding(con: Any, sql: str, params: Any = None) -> Any:
        if threading.current_thread().name.startswith("holder") and sql.startswith("SELECT key, value FROM ledger_meta"):
            inside.release()
            go_on.wait(60)
        return execute(con, sql, params)

    monkeypatch.setattr(_postgres._Con, "execute", holding)
    holders = [threading.Thread(target=led.remaining, name=f"holder{i}") for i in range(4)]
    for t in holders:
        t.start()
    try:
        for _ in holders:
            assert inside.acquire(timeout=60)
        assert len(_backends(server, url)) == 4
        led.lock_timeout = 0.2
        with pytest.raises(LedgerError, match="busy") as info:
            _charge(led)
        assert "nothing was charged" in str(info.value) and "lock_timeout" in (info.value.hint or "")
        assert len(_backends(server, url)) == 4  # no fifth connection was opened
    finally:
        go_on.set()
        for t in holders:
            t.join(60)
    led.lock_timeout = 60
    _charge(led)  # negative control: with the holders done, a connection is free
    assert [e["query"] for e in led.history().to_pylist()] == ["q"]
    led.close()


# -- fork ---------------------------------------------------------------------------------------------

FORK = """
import json, os, sys
import dpsql
from dpsql.ledger import _postgres, open_ledger
url, mode = sys.argv[1], sys.argv[2]
backends = []
execute = _postgres._Con.execute
def spy(self, sql, params=None):
    backends.append(self._con.info.backend_pid)
    return execute(self, sql, params)
_postgres._Con.execute = spy
led = open_ledger(url, None)
led.remaining()
parent = backends[-1]
if mode == "no hook":  # as if the fork bypassed os.register_at_fork: the ledger's own pid check must act
    _postgres._POOLS.clear()
elif mode == "naive":  # negative control: the child closes what it inherited as if it were its own
    _postgres._disown = lambda con: con.close()
r, w = os.pipe()
kid = os.fork()
if kid == 0:
    os.close(r)
    out = {}
    try:
        led.reserve(dpsql.Budget(0.1, 0.0), mechanism="m", query="child", tables=["t"], params={})
        out["child"] = backends[-1]
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    os.write(w, json.dumps(out).encode())
    os.close(w)
    sys.exit(0)  # a normal exit: finalizers and garbage collection run in the child
os.close(w)
with os.fdopen(r) as f:
    out = json.loads(f.read())
os.waitpid(kid, 0)
led.reserve(dpsql.Budget(0.1, 0.0), mechanism="m", query="parent", tables=["t"], params={})
out.update(parent=parent, parent_after=backends[-1], spent=led.spent().epsilon,
           queries=[e["query"] for e in led.history().to_pylist()])
print(json.dumps(out))
"""


def _fork(url: str, mode: str) -> dict[str, Any]:
    from conftest import child_env

    p = subprocess.run([sys.executable, "-c", FORK, url, mode], capture_output=True, text=True, timeout=120,
                       env=child_env())
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("mode", ["hook", "no hook"])
def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_alone(url: str, mode: str) -> None:
    out = _fork(url, mode)
    assert "error" not in out, out
    assert out["child"] != out["parent"]  # the child charged over a connection of its own
    assert out["parent_after"] == out["parent"]  # the parent's connection survived the child (and its exit)
    assert out["queries"] == ["child", "parent"] and out["spent"] == pytest.approx(0.2)


def test_fork_negative_control_a_child_that_closes_the_inherited_connection_ends_the_parents(url: str) -> None:
    out = _fork(url, "naive")
    assert "error" not in out, out
    assert out["parent_after"] != out["parent"]  # the parent's backend was ended by its child
    assert out["queries"] == ["child", "parent"]  # ... and the parent's next operation still worked


# -- a connection the server drops --------------------------------------------------------------------


def test_a_backend_terminated_while_idle_is_replaced_without_a_double_charge(server: Server, url: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    led.remaining()
    first = spy.backends()[-1]
    _terminate(server, first)
    entry = _charge(led)
    assert spy.backends()[-1] != first
    assert spy.count("INSERT INTO ledger_entries") == 1
    assert [e["entry_id"] for e in led.history().to_pylist()] == [entry]
    assert led.spent() == dpsql.Budget(0.1, 0.0)
    assert len(_backends(server, url)) == 1
    led.close()


@pytest.mark.parametrize("at", ["SET TRANSACTION", "SELECT set_config(name", "LOCK TABLE",
                                "SELECT key, value FROM ledger_meta"])
def test_a_connection_dropped_before_the_charge_is_retried_once(server: Server, url: str,
                                                              monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    """The pooled connection dies between two operations and the server's end of it is seen only at
    the first statements of the next transaction (nothing charged yet): one retry on a new connection."""
    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    led.remaining()
    first = spy.backends()[-1]
    spy.before[at] = lambda con: _terminate(server, con.info.backend_pid)
    entry = _charge(led)
    assert spy.backends()[-1] != first
    assert spy.count("INSERT INTO ledger_entries") == 1
    assert [e["entry_id"] for e in led.history().to_pylist()] == [entry]
    assert led.spent() == dpsql.Budget(0.1, 0.0)
    led.close()


def test_a_connection_dropped_at_every_attempt_is_retried_only_once(server: Server, url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.ledger import _postgres

    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    led.remaining()
    execute = _postgres._Con.execute  # the spy

    def dropping(con: Any, sql: str, params: Any = None) -> Any:
        if sql.startswith("LOCK TABLE"):
            _terminate(server, con._con.info.backend_pid)
        return execute(con, sql, params)

    monkeypatch.setattr(_postgres._Con, "execute", dropping)
    with pytest.raises(LedgerError, match="nothing was charged"):
        _charge(led)
    assert spy.count("LOCK TABLE") == 2 and spy.count("INSERT") == 0
    monkeypatch.setattr(_postgres._Con, "execute", execute)
    assert led.history().num_rows == 0 and led.spent() == dpsql.Budget(0.0, 0.0)
    led.close()


@pytest.mark.parametrize("at", ["UPDATE ledger_meta", "COMMIT"])
def test_a_connection_dropped_after_the_charge_was_sent_is_never_retried(server: Server, url: str,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       at: str) -> None:
    """Once the INSERT of a charge may have reached the server, a dropped connection is an error (the
    server rolled the transaction back, or, at COMMIT, may have committed it): never a second INSERT."""
    import psycopg

    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    led.remaining()
    if at == "COMMIT":
        commit = psycopg.Connection.commit
        killed: list[int] = []

        def dropping_commit(con: Any) -> None:
            if spy.count("INSERT INTO ledger_entries") and not killed:  # the ledger's COMMIT of the charge
                killed.append(con.info.backend_pid)
                _terminate(server, killed[0])
            commit(con)

        monkeypatch.setattr(psycopg.Connection, "commit", dropping_commit)
        expected = "not acknowledged"
    else:
        spy.before[at] = lambda con: _terminate(server, con.info.backend_pid)
        expected = "nothing was charged"
    with pytest.raises(LedgerError, match=expected):
        _charge(led)
    assert spy.count("INSERT INTO ledger_entries") == 1
    monkeypatch.undo()
    assert led.history().num_rows == 0  # the server rolled the charge back; it was reported, not retried
    _charge(led)
    assert led.spent() == dpsql.Budget(0.1, 0.0)
    led.close()


def _generation(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        return int(con.execute("SELECT value FROM ledger_meta WHERE key = 'generation'").fetchone()[0])


def test_a_release_whose_backend_is_terminated_mid_statement_is_recorded_on_a_new_connection(
        server: Server, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server ends the release's connection while its UPDATE waits on a lock (a restart, a fail-over, an
    administrator's pg_terminate_backend): the server rolled that transaction back, and the release, whose query
    has read private rows and whose charge stands, is recorded on a new connection (it was a LedgerError: the
    paid answer was thrown away and the entry left 'reserved')."""
    import psycopg

    spy = Spy(monkeypatch)
    s = dpsql.Session(ledger=url, budget=None, lock_timeout=5)
    use_noise(s, zero_noise())
    s.register("t", pa.table({"u": pa.array([1, 2, 3], pa.int64())}), privacy_unit="u")
    with psycopg.connect(url, autocommit=True) as admin:
        # the release's UPDATE of its entry waits for an advisory lock the test holds
        admin.execute("CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                      "PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END $$")
        admin.execute("CREATE TRIGGER hold BEFORE UPDATE ON ledger_entries FOR EACH ROW EXECUTE FUNCTION hold()")
        admin.execute("SELECT pg_advisory_lock(4242)")
        out: list[Any] = []

        def query() -> None:
            try:
                out.append(s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5))
            except BaseException as e:  # noqa: BLE001 - checked below
                out.append(e)

        worker = threading.Thread(target=query)
        worker.start()
        waiting: list[Any] = []
        for _ in range(400):
            waiting = admin.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'advisory' AND datname = %s",
                                    [url.rsplit("/", 1)[1]]).fetchall()
            if waiting:
                break
            time.sleep(0.025)
        assert len(waiting) == 1
        _terminate(server, waiting[0][0])
        admin.execute("SELECT pg_advisory_unlock(4242)")
        worker.join(60)
    assert not isinstance(out[0], BaseException), out
    assert out[0].table.column("n").to_pylist() == [3]  # the answer is returned ...
    assert spy.count("UPDATE ledger_entries SET status = 'released'") == 2  # (the first was rolled back)
    entries = s.history().to_pylist()
    assert [e["status"] for e in entries] == ["released"] and s.remaining() == dpsql.Budget(4.5, 0.0)
    assert _generation(url) == 3  # ... and recorded once: created, reserved, released
    s.close()


@pytest.mark.parametrize("at", ["UPDATE ledger_entries SET status", "UPDATE ledger_meta"])
def test_a_release_whose_connection_drops_inside_its_transaction_is_recorded_once(
        server: Server, url: str, monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    entry = _charge(led)
    spy.before[at] = lambda con: _terminate(server, con.info.backend_pid)
    led.commit(entry, params_update={"rows": 3}, synopsis_key="k", synopsis='{"x": 1}')
    assert spy.count("UPDATE ledger_entries SET status = 'released'") == 2
    assert [(e["status"], json.loads(e["params"])) for e in led.history().to_pylist()] == [("released", {"rows": 3})]
    assert led.find_synopsis("k") == (entry, '{"x": 1}') and _generation(url) == 3
    led.close()


def test_a_release_whose_commit_reached_the_server_before_the_connection_dropped_is_recorded_once(
        server: Server, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The COMMIT of a release was carried out, but the connection dropped before its acknowledgement arrived: the
    release is started again, finds its own entry released as it would record it, and writes nothing more (it
    neither fails as 'already released' nor records twice)."""

    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    entry = _charge(led)
    killed = _lose_acknowledgement(server, monkeypatch, spy, "UPDATE ledger_entries SET status = 'released'")
    led.commit(entry, params_update={"rows": 3}, synopsis_key="k", synopsis='{"x": 1}')
    assert killed and spy.count("UPDATE ledger_entries SET status = 'released'") == 1
    monkeypatch.undo()
    assert [(e["status"], json.loads(e["params"])) for e in led.history().to_pylist()] == [("released", {"rows": 3})]
    assert _generation(url) == 3  # the second attempt wrote nothing
    with pytest.raises(LedgerError, match="only a 'reserved' entry can be released or failed, once"):
        led.commit(entry, params_update={"rows": 3}, synopsis_key="k", synopsis='{"x": 1}')  # a second commit: refused
    led.close()


@pytest.mark.parametrize("at", ["UPDATE ledger_entries SET status", "UPDATE ledger_meta"])
def test_a_failure_whose_connection_drops_inside_its_transaction_is_recorded_once(
        server: Server, url: str, monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    """fail() (its query failed after the charge) whose connection the server drops inside its transaction (a
    restart, pg_terminate_backend, a pooler) is started again on a new connection, as a release is: the entry was
    left 'reserved' (counted the same, but its recorded state did not say that its query failed)."""
    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    entry = _charge(led)
    spy.before[at] = lambda con: _terminate(server, con.info.backend_pid)
    led.fail(entry, "time-out")
    assert spy.count("UPDATE ledger_entries SET status = 'failed'") == 2  # (the first was rolled back)
    assert [(e["status"], e["failure_reason"]) for e in led.history().to_pylist()] == [("failed", "time-out")]
    assert led.spent() == dpsql.Budget(0.1, 0.0) and _generation(url) == 3  # created, reserved, failed
    led.close()


def test_a_failure_whose_commit_reached_the_server_before_the_connection_dropped_is_recorded_once(
        server: Server, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The COMMIT of fail() was carried out, but the connection dropped before its acknowledgement: the failure
    is started again, finds its entry failed with its reason, and writes nothing more (no 'already failed')."""

    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    entry = _charge(led)
    killed = _lose_acknowledgement(server, monkeypatch, spy, "UPDATE ledger_entries SET status = 'failed'")
    led.fail(entry, "time-out")
    assert killed and spy.count("UPDATE ledger_entries SET status = 'failed'") == 1
    monkeypatch.undo()
    assert [(e["status"], e["failure_reason"]) for e in led.history().to_pylist()] == [("failed", "time-out")]
    assert _generation(url) == 3  # the second attempt wrote nothing
    with pytest.raises(LedgerError, match="only a 'reserved' entry can be released or failed, once"):
        led.fail(entry, "time-out")  # a second fail(): refused
    led.close()


def _dropping_always(server: Server, monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    from dpsql.ledger import _postgres

    execute = _postgres._Con.execute

    def dropping(con: Any, sql: str, params: Any = None) -> Any:
        if sql.startswith(prefix):
            _terminate(server, con._con.info.backend_pid)
        return execute(con, sql, params)

    monkeypatch.setattr(_postgres._Con, "execute", dropping)


@pytest.mark.parametrize("status", ["released", "failed"])
def test_a_release_or_failure_whose_connection_drops_at_every_attempt_is_a_public_ledger_error(
        server: Server, url: str, monkeypatch: pytest.MonkeyPatch, status: str) -> None:
    """Every attempt's connection is dropped until the wait runs out: the error is a LedgerError (it was a private
    subclass, _ConnectionLost) that says the charge stands, what state the entry is in, and what to do."""
    led = open_ledger(url, None)
    entry = _charge(led)
    monkeypatch.setattr(led, "release_wait", lambda: 1.0)
    _dropping_always(server, monkeypatch, f"UPDATE ledger_entries SET status = '{status}'")
    with pytest.raises(LedgerError) as info:
        led.commit(entry) if status == "released" else led.fail(entry, "time-out")
    e = info.value
    assert type(e) is LedgerError and e.exit_code == 4 and not e.recorded
    assert f"stays 'reserved' (or reads '{status}', if the COMMIT of an attempt cut short" in e.message, e.message
    assert "charge stands and counts against the budget either way" in e.message
    assert ("The answer was charged but is not returned" in e.message) == (status == "released")
    assert "dpsql budget --history" in str(e.hint)
    monkeypatch.undo()
    assert [x["status"] for x in led.history().to_pylist()] == ["reserved"] and led.spent() == dpsql.Budget(0.1, 0.0)
    led.close()


def test_a_query_whose_release_cannot_be_recorded_raises_a_public_ledger_error(
        server: Server, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.ledger._postgres import PostgresLedger

    s = dpsql.Session(ledger=url, budget=None, lock_timeout=5)
    use_noise(s, zero_noise())
    s.register("t", pa.table({"u": pa.array([1, 2, 3], pa.int64())}), privacy_unit="u")
    monkeypatch.setattr(PostgresLedger, "release_wait", lambda self: 1.0)
    _dropping_always(server, monkeypatch, "UPDATE ledger_entries SET status = 'released'")
    with pytest.raises(LedgerError) as info:
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
    assert type(info.value) is LedgerError and "The answer was charged but is not returned" in info.value.message
    monkeypatch.undo()
    assert [x["status"] for x in s.history().to_pylist()] == ["reserved"]
    s.close()


def test_a_server_restart_inside_a_release_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server restarts (a fail-over, an upgrade) while a release's transaction runs: the release is recorded
    once the server is back, once."""
    for own in running_server():  # a server of its own: the restart ends every connection to it
        url = own.database("restart_inside")
        spy = Spy(monkeypatch)
        led = open_ledger(url, dpsql.Budget(1.0, 0.0), create=True)
        entry = _charge(led)
        spy.before["UPDATE ledger_entries SET status"] = lambda con, own=own: own.restart()
        led.commit(entry, params_update={"rows": 3})
        assert spy.count("UPDATE ledger_entries SET status = 'released'") == 2
        assert [e["status"] for e in led.history().to_pylist()] == ["released"] and _generation(url) == 3
        led.close()


def test_a_server_restart_inside_a_failure_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    for own in running_server():  # a server of its own: the restart ends every connection to it
        url = own.database("restart_inside_fail")
        spy = Spy(monkeypatch)
        led = open_ledger(url, dpsql.Budget(1.0, 0.0), create=True)
        entry = _charge(led)
        spy.before["UPDATE ledger_entries SET status"] = lambda con, own=own: own.restart()
        led.fail(entry, "time-out")
        assert spy.count("UPDATE ledger_entries SET status = 'failed'") == 2
        assert [e["status"] for e in led.history().to_pylist()] == ["failed"] and _generation(url) == 3
        led.close()


def test_a_query_that_fails_after_its_charge_is_recorded_failed_when_the_connection_drops(
        server: Server, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The query fails after its charge, and the server drops the connection that records the failure: the entry
    reads 'failed' (it stayed 'reserved'), and the error is the one of any failure after the charge (exit 5)."""
    from dpsql.engine import Engine
    from dpsql.errors import CHARGED_EXIT_CODE, ExecutionError

    spy = Spy(monkeypatch)
    s = dpsql.Session(ledger=url, budget=None, lock_timeout=5)
    s.register("t", pa.table({"u": pa.array([1, 2, 3], pa.int64())}), privacy_unit="u")
    monkeypatch.setattr(Engine, "fetch_arrow", lambda self, ast, **kw: (_ for _ in ()).throw(RuntimeError("boom")))
    spy.before["UPDATE ledger_entries SET status = 'failed'"] = lambda con: _terminate(server, con.info.backend_pid)
    with pytest.raises(ExecutionError, match="failed after its budget was charged; the charge stands") as info:
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
    assert info.value.exit_code == CHARGED_EXIT_CODE
    assert spy.count("UPDATE ledger_entries SET status = 'failed'") == 2
    assert [e["status"] for e in s.history().to_pylist()] == ["failed"] and s.remaining() == dpsql.Budget(4.5, 0.0)
    s.close()


def test_a_server_restart_between_operations(monkeypatch: pytest.MonkeyPatch) -> None:
    for own in running_server():  # a server of its own: the restart ends every connection to it
        url = own.database("restart")
        spy = Spy(monkeypatch)
        led = open_ledger(url, dpsql.Budget(1.0, 0.0), create=True)
        led.commit(_charge(led))
        before = spy.backends()
        own.restart()
        led.commit(_charge(led))
        assert spy.backends()[-1] not in before
        assert spy.count("INSERT INTO ledger_entries") == 2
        assert [e["status"] for e in led.history().to_pylist()] == ["released", "released"]
        assert led.spent() == dpsql.Budget(0.2, 0.0)
        assert len(_backends(own, url)) == 1
        led.close()


# -- expiry -------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_connection_idle_for_30_s_is_closed_and_replaced(server: Server, url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.ledger import _postgres

    clock = Clock()
    monkeypatch.setattr(_postgres, "_clock", clock)
    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    led.remaining()
    first = spy.backends()[-1]
    clock.now += 29.0
    led.remaining()
    assert spy.backends() == [first]  # idle 29 s: reused
    clock.now += 30.5
    led.remaining()
    assert spy.backends()[-1] != first  # idle 30.5 s: a new connection
    assert [pid for pid, _ in _settle(server, url, 1)] == [spy.backends()[-1]]  # the old one was closed
    led.close()


def test_a_connection_older_than_60_s_is_closed_and_replaced(server: Server, url: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.ledger import _postgres

    clock = Clock()
    monkeypatch.setattr(_postgres, "_clock", clock)
    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    led.remaining()
    first = spy.backends()[-1]
    for _ in range(3):  # used every 20 s: never idle for long, 60 s old at the third
        clock.now += 19.5
        led.remaining()
    assert spy.backends() == [first]  # 58.5 s old
    clock.now += 2.0
    led.remaining()
    assert spy.backends()[-1] != first  # 60.5 s old: a new connection
    assert [pid for pid, _ in _settle(server, url, 1)] == [spy.backends()[-1]]
    led.close()


# -- behind pgbouncer in transaction mode -------------------------------------------------------------


@pytest.fixture(scope="module")
def bouncer(server: Server) -> Iterator[str]:
    yield from running_bouncer(server)


def test_through_pgbouncer_in_transaction_mode_threads_never_overspend(server: Server, bouncer: str) -> None:
    """pgbouncer in transaction mode hands each transaction to one of 2 server sessions, whichever
    client it comes from: the ledger's connections use no prepared statements and no session state."""
    import psycopg

    name = "b_" + uuid.uuid4().hex[:12]
    server.database(name)
    url = bouncer + name
    led = open_ledger(url, dpsql.Budget(3.0, 0.0), create=True, lock_timeout=60)
    ok, errors = _charge_in_threads(led, threads=6, each=8)
    assert not errors, errors
    assert ok == 30 and led.history().num_rows == 30
    assert led.remaining().epsilon == pytest.approx(0.0, abs=1e-12)
    led.close()
    # negative control: connections that prepare their statements fail behind it
    cons = [psycopg.connect(url, prepare_threshold=0) for _ in range(3)]
    try:
        with pytest.raises(psycopg.Error):
            for i in range(20):
                for c in cons:
                    c.execute("SELECT %s::int + 1", [i])
                    c.commit()
    finally:
        for c in cons:
            _close_quietly(c)


def _close_quietly(con: Any) -> None:
    try:
        con.close()
    except Exception:  # noqa: BLE001 - a connection the error left broken
        pass


@pytest.mark.parametrize("status", ["released", "failed"])
def test_through_pgbouncer_a_release_whose_server_session_is_terminated_is_recorded_once(
        server: Server, bouncer: str, monkeypatch: pytest.MonkeyPatch, status: str) -> None:
    """Behind pgbouncer the ledger's connection is to the pooler: when the server session serving the release's
    (or the failure's) transaction is terminated, the pooler closes the client's connection, and it starts again."""
    url = bouncer + server.database("b_" + uuid.uuid4().hex[:12]).rsplit("/", 1)[1]
    led = open_ledger(url, dpsql.Budget(5.0, 0.0), create=True)
    entry = _charge(led)
    spy = Spy(monkeypatch)

    def terminate_server_session(con: Any) -> None:
        with con.cursor() as cur:
            pid = cur.execute("SELECT pg_backend_pid()").fetchone()[0]  # the server session of this transaction
        _terminate(server, pid)

    spy.before["UPDATE ledger_entries SET status"] = terminate_server_session
    led.commit(entry, params_update={"rows": 3}) if status == "released" else led.fail(entry, "time-out")
    assert spy.count(f"UPDATE ledger_entries SET status = '{status}'") == 2
    assert [(e["status"], json.loads(e["params"])) for e in led.history().to_pylist()] == [
        (status, {"rows": 3} if status == "released" else {})]
    led.close()


def test_a_charge_whose_commit_acknowledgement_is_lost_exits_as_charged(server: Server, url: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The COMMIT of a charge reached the server, but the connection dropped before its acknowledgement: the
    charge stands (it counts), so the failure exits as one after the charge (5), not as a ledger error that
    charged nothing (4)."""

    from dpsql.charge import reserve
    from dpsql.errors import CHARGED_EXIT_CODE

    spy = Spy(monkeypatch)
    led = open_ledger(url, None)
    led.remaining()
    killed = _lose_acknowledgement(server, monkeypatch, spy, "INSERT INTO ledger_entries")
    with pytest.raises(LedgerError, match="not acknowledged") as info:
        reserve(led, dpsql.Budget(0.1, 0.0), mechanism="m", query="q", tables=["t"], params={})
    monkeypatch.undo()
    assert killed and led.spent() == dpsql.Budget(0.1, 0.0)  # the charge stands
    assert info.value.exit_code == CHARGED_EXIT_CODE
    led.close()
