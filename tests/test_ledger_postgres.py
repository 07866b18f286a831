"""The PostgreSQL ledger: the same protocol and refusals as the DuckDB file, shared by processes.

A server is started by the fixture itself (``tests/_postgres.py``: temp data directory,
loopback, random port, an unprivileged user). Without PostgreSQL or psycopg the tests skip with
the reason, unless ``DPSQL_REQUIRE_EXTRAS=1`` (CI), where a missing extra is a failure.
"""

from __future__ import annotations

import multiprocessing as mp
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _postgres import Server

import dpsql
from dpsql.errors import BudgetExceededError, ConfigError, LedgerError
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    from _postgres import running_server

    yield from running_server()


@pytest.fixture
def url(server: Server) -> str:
    return server.database("l_" + uuid.uuid4().hex[:12])


def open_ledger(url: str, **kw: object) -> dpsql.ledger.Ledger:
    from dpsql.ledger import open_ledger as _open

    return _open(url, kw.pop("budget", None), **kw)  # type: ignore[arg-type]


def test_protocol_round_trip(url: str) -> None:
    led = open_ledger(url, budget=dpsql.Budget(1.0, 1e-6), create=True)
    assert type(led).__name__ == "PostgresLedger"
    assert led.total() == dpsql.Budget(1.0, 1e-6)
    a = led.reserve(dpsql.Budget(0.3, 0.0), mechanism="basic", query="SELECT 1", tables=["t"], params={"sigma": 2.5})
    led.commit(a, params_update={"n": 3}, synopsis_key="k1", synopsis='{"x": 1}')
    b = led.reserve(dpsql.Budget(0.1 + 0.2, 1e-7), mechanism="basic", query="q", tables=["t", "u"], params={})
    led.fail(b, "time-out")
    assert led.remaining().epsilon == pytest.approx(0.4)
    assert led.find_synopsis("k1") == (a, '{"x": 1}')
    r = led.record_reuse(source_entry_id=a, query="again", tables=["t"])
    e = led.entry(a)
    assert e.status == "released" and e.params == {"sigma": 2.5, "n": 3} and e.tables == ("t",)
    assert led.entry(b).failure_reason == "time-out" and led.entry(r).status == "reused"
    assert led.entry(b).cost == dpsql.Budget(0.1 + 0.2, 1e-7)  # bit-exact doubles
    h = led.history()
    assert isinstance(h, pa.Table) and h.column("status").to_pylist() == ["released", "failed", "reused"]
    with pytest.raises(BudgetExceededError):
        led.reserve(dpsql.Budget(0.5, 0.0), mechanism="basic", query="q", tables=["t"], params={})
    with pytest.raises(LedgerError, match="reserved"):
        led.commit(a)
    led.set_total(dpsql.Budget(2.0, 1e-6), reason="more")
    assert open_ledger(url).total() == dpsql.Budget(2.0, 1e-6)  # another connection, the recorded total
    with pytest.raises(ConfigError):
        open_ledger(url, budget=dpsql.Budget(5.0, 0.0))


def test_missing_foreign_and_wrong_version_are_refused(server: Server, url: str) -> None:
    import psycopg

    with pytest.raises(LedgerError, match="no budget ledger"):
        open_ledger(url)
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE TABLE ledger_meta (key VARCHAR, value VARCHAR)")
    with pytest.raises(LedgerError, match="not a dpsql budget ledger"):
        open_ledger(url, budget=dpsql.Budget(1.0, 0.0), create=True)
    other = server.database("v_" + uuid.uuid4().hex[:8])
    led = open_ledger(other, budget=dpsql.Budget(1.0, 0.0), create=True)
    with psycopg.connect(other, autocommit=True) as con:
        con.execute("UPDATE ledger_meta SET value = '2' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="schema version 2"):
        led.remaining()
    with pytest.raises(LedgerError, match="schema version 2"):
        open_ledger(other)


def test_password_never_shown(server: Server) -> None:
    bad = f"postgresql://dpsql:s3cret-pw@127.0.0.1:{server.port}/no_such_db"
    with pytest.raises(LedgerError) as info:
        open_ledger(bad)
    assert "s3cret-pw" not in str(info.value) and "***" in str(info.value)


def test_session_and_config_use_the_shared_ledger(url: str, tmp_path: Path) -> None:
    t = pa.table({"u": pa.array([1, 2, 3, 3], pa.int64()), "x": pa.array([1.0, 2.0, 3.0, 4.0])})
    s = dpsql.Session(ledger=url, budget=dpsql.Budget(2.0, 1e-5), create=True)
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="u")
    s.query("SELECT COUNT(*) FROM t", epsilon=0.5, delta=1e-6)
    s.close()
    cfg = tmp_path / "dpsql.toml"
    cfg.write_text(f'[ledger]\nurl = "{url}"\n')
    s2 = dpsql.Session.from_config(cfg)
    try:
        assert s2.remaining().epsilon == pytest.approx(1.5)
        assert s2.history().column("status").to_pylist() == ["released"]
    finally:
        s2.close()
    cfg.write_text(f'[ledger]\nurl = "{url}"\npath = "x.duckdb"\n')
    with pytest.raises(ConfigError, match="both"):
        dpsql.Session.from_config(cfg)


def _charge(url: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from dpsql.ledger import open_ledger as _open

    led = _open(url, None, lock_timeout=60)
    ok = 0
    for i in range(n):
        try:
            eid = led.reserve(dpsql.Budget(0.1, 0.0), mechanism="basic", query=f"q{i}", tables=["t"], params={})
            led.commit(eid)
            ok += 1
        except BudgetExceededError:
            pass
    out.put(ok)


def test_concurrent_processes_never_overspend(url: str) -> None:
    # 6 processes x 12 charges of 0.1 against a total of 3.0: exactly 30 succeed, whatever the interleaving
    open_ledger(url, budget=dpsql.Budget(3.0, 0.0), create=True).close()
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_charge, args=(url, 12, out)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0
    succeeded = sum(out.get(timeout=10) for _ in procs)
    led = open_ledger(url)
    assert succeeded == 30
    h = led.history()
    assert h.num_rows == 30 and sorted(h.column("entry_id").to_pylist()) == list(range(1, 31))
    assert led.spent() == dpsql.Budget(3.0, 0.0) or led.spent().epsilon == pytest.approx(3.0)
    assert led.remaining().epsilon == pytest.approx(0.0, abs=1e-12)


# -- the server's settings and a server that drops the connection -------------------------------------


def _configured(server: Server, setting: str) -> str:
    import psycopg

    name = "l_" + uuid.uuid4().hex[:12]
    url = server.database(name)
    open_ledger(url, budget=dpsql.Budget(1.0, 0.0), create=True).close()
    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute(f'ALTER DATABASE "{name}" SET {setting}')
    return url


def test_a_statement_timeout_shorter_than_the_lock_wait_does_not_fail_a_charge(server: Server) -> None:
    """A database (or role) statement_timeout below the time a charge waits for the ledger's lock cancelled
    the wait: a busy ledger failed with 'PostgreSQL failed (QueryCanceled)' instead of waiting up to the
    ledger's lock_timeout. Every ledger transaction now lifts the server's statement, idle-in-transaction
    (and, where the server has it, transaction) time-outs: its one wait is the lock, bounded by lock_timeout."""
    import threading
    import time

    import psycopg

    url = _configured(server, "statement_timeout = '200ms'")
    holder = psycopg.connect(url)  # another writer holds the ledger's lock until the charge has waited 0.4 s for it
    holder.execute("SET LOCAL statement_timeout = 0")
    holder.execute("LOCK TABLE ledger_entries, ledger_totals IN EXCLUSIVE MODE")

    def commit_once_waited_for() -> None:  # the charge seen waiting in pg_locks, then twice the statement_timeout
        with psycopg.connect(url, autocommit=True) as watcher:
            watcher.execute("SET statement_timeout = 0")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not watcher.execute(
                    "SELECT 1 FROM pg_locks WHERE database = (SELECT oid FROM pg_database WHERE datname = "
                    "current_database()) AND relation = 'ledger_entries'::regclass AND NOT granted").fetchall():
                time.sleep(0.01)
        time.sleep(0.4)
        holder.commit()

    release = threading.Thread(target=commit_once_waited_for)
    release.start()
    try:
        led = open_ledger(url, lock_timeout=60)
        t0 = time.monotonic()
        led.reserve(dpsql.Budget(0.1, 0.0), mechanism="basic", query="q", tables=["t"], params={})
        assert time.monotonic() - t0 > 0.2  # it did wait beyond the server's statement_timeout
        assert led.spent() == dpsql.Budget(0.1, 0.0)
    finally:
        release.join()
        holder.close()
    # negative control: the setting is in force for other statements of that database
    with psycopg.connect(url) as con, pytest.raises(psycopg.errors.QueryCanceled):
        con.execute("SELECT pg_sleep(1)")


def test_a_read_only_database_is_named_with_the_fix(server: Server) -> None:
    url = _configured(server, "default_transaction_read_only = on")
    led = open_ledger(url)
    assert led.remaining() == dpsql.Budget(1.0, 0.0)  # reads work
    with pytest.raises(LedgerError) as info:
        led.reserve(dpsql.Budget(0.1, 0.0), mechanism="basic", query="q", tables=["t"], params={})
    text = str(info.value) + " " + str(info.value.hint)
    assert "read-only" in text and "default_transaction_read_only" in text and "nothing was charged" in text
    assert led.remaining() == dpsql.Budget(1.0, 0.0)
    other = server.database("r_" + uuid.uuid4().hex[:12])
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute(f'ALTER DATABASE "{other.rsplit("/", 1)[1]}" SET default_transaction_read_only = on')
    with pytest.raises(LedgerError, match="read-only") as info:
        open_ledger(other, budget=dpsql.Budget(1.0, 0.0), create=True)
    assert "default_transaction_read_only" in str(info.value.hint)


@pytest.mark.parametrize("at", ["connect", "LOCK TABLE", "INSERT INTO ledger_entries", "UPDATE ledger_meta"])
def test_a_connection_the_server_drops_is_a_ledger_error(server: Server, monkeypatch: pytest.MonkeyPatch,
                                                         at: str) -> None:
    """The server ends the ledger's connection (pg_terminate_backend, a restart, a fail-over, an
    idle-in-transaction time-out) at each step of a charge: psycopg's own OperationalError escaped
    (from the statement, or from the rollback of the dead connection) instead of a LedgerError saying
    that nothing was charged. Nothing is charged in every case."""
    import psycopg

    from dpsql.ledger import _postgres

    url = _configured(server, "work_mem = '4MB'")  # any ledger of its own
    # (at "connect": a ledger object that has not connected yet; an opened one reuses its connection)
    led = _postgres.PostgresLedger(url) if at == "connect" else open_ledger(url)

    def kill(con: Any) -> None:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [con.info.backend_pid])

    if at == "connect":
        connect = _postgres.PostgresLedger._connect

        def dropped(self: Any, unchanged: str) -> Any:
            con = connect(self, unchanged)
            kill(con)
            return con

        monkeypatch.setattr(_postgres.PostgresLedger, "_connect", dropped)
    else:
        execute = _postgres._Con.execute

        def dropping(self: Any, sql: str, params: Any = None) -> Any:
            if sql.startswith(at):
                kill(self._con)
            return execute(self, sql, params)

        monkeypatch.setattr(_postgres._Con, "execute", dropping)
    with pytest.raises(LedgerError, match="nothing was (charged|changed)"):
        led.reserve(dpsql.Budget(0.1, 0.0), mechanism="basic", query="q", tables=["t"], params={})
    if at == "connect":
        with pytest.raises(LedgerError):
            open_ledger(url)
    monkeypatch.undo()
    assert open_ledger(url).remaining() == dpsql.Budget(1.0, 0.0)


def test_a_user_without_write_rights_is_told_which_grant_is_missing(server: Server) -> None:
    import psycopg

    url = _configured(server, "work_mem = '4MB'")
    role = "r_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f"CREATE ROLE {role} LOGIN")
        con.execute(f"GRANT SELECT ON ledger_meta, ledger_totals, ledger_entries TO {role}")
    as_reader = url.replace("//dpsql@", f"//{role}@")
    led = open_ledger(as_reader)
    assert led.remaining() == dpsql.Budget(1.0, 0.0)  # reading is allowed
    with pytest.raises(LedgerError, match="may not write") as info:
        led.reserve(dpsql.Budget(0.1, 0.0), mechanism="basic", query="q", tables=["t"], params={})
    assert "GRANT SELECT, INSERT, UPDATE ON ledger_meta, ledger_totals, ledger_entries" in str(info.value.hint)
    assert "nothing was charged" in str(info.value)
    # creating a ledger where the user may not create tables says so
    other = server.database("c_" + uuid.uuid4().hex[:12])
    with pytest.raises(LedgerError, match="no ledger was created") as info:
        open_ledger(other.replace("//dpsql@", f"//{role}@"), budget=dpsql.Budget(1.0, 0.0), create=True)
    assert "create tables" in str(info.value.hint)


def test_a_schema_earlier_in_the_search_path_cannot_stand_in_for_the_ledger(server: Server) -> None:
    """Someone who may create schemas in the database (not write the ledger) creates one named after
    the ledger's user, which the default search_path ("$user", public) reads first, holding an empty
    ledger_entries: the ledger read it, the spent budget was 0 again, and a charge of 0.9 against a
    total of 1.0 that had 0.1 left went through. Tables of the ledger's names in two schemas of the
    search_path are now refused; naming the ledger's schema in the URL reads the real one."""
    import psycopg

    url = _configured(server, "work_mem = '4MB'")
    led = open_ledger(url)
    led.commit(led.reserve(dpsql.Budget(0.9, 0.0), mechanism="m", query="q", tables=["t"], params={}))
    ddl = dpsql.ledger._postgres.schema_postgres_sql()
    entries = ddl[ddl.index("CREATE TABLE ledger_entries"):].split(";")[0]
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE SCHEMA dpsql")  # the ledger's user is 'dpsql'
        con.execute(entries.replace("CREATE TABLE ledger_entries", "CREATE TABLE dpsql.ledger_entries"))
    for attempt in (lambda: open_ledger(url).remaining(),
                    lambda: open_ledger(url).reserve(dpsql.Budget(0.9, 0.0), mechanism="m", query="q", tables=["t"],
                                                     params={})):
        with pytest.raises(LedgerError, match="more than one schema") as info:
            attempt()
        assert "search_path" in str(info.value.hint)
    # the ledger's own schema named in the URL: the real ledger, 0.1 left
    pinned = open_ledger(url + "?options=-csearch_path%3Dpublic")
    assert pinned.remaining().epsilon == pytest.approx(0.1)
    with pytest.raises(BudgetExceededError):
        pinned.reserve(dpsql.Budget(0.9, 0.0), mechanism="m", query="q", tables=["t"], params={})
    with psycopg.connect(url, autocommit=True) as con:  # negative control: without it, the shadow is what is read
        assert con.execute("SELECT count(*) FROM ledger_entries").fetchone() == (0,)


def test_creating_waits_for_another_creator_only_up_to_lock_timeout(server: Server) -> None:
    """Creation serialises creators with an advisory lock, which waited forever (``dpsql init`` hung while
    another creator's transaction stayed open). The wait is now bounded by lock_timeout, with a LedgerError
    naming the fix; once the other creator is done, creation goes through."""
    import time

    import psycopg

    from dpsql.ledger._postgres import _ADVISORY_KEY

    url = server.database("l_" + uuid.uuid4().hex[:12])
    holder = psycopg.connect(url)
    holder.execute("SELECT pg_advisory_xact_lock(%s)", [_ADVISORY_KEY])
    try:
        t0 = time.monotonic()
        with pytest.raises(LedgerError, match="busy: another process has been creating a ledger") as e:
            open_ledger(url, budget=dpsql.Budget(1.0, 0.0), create=True, lock_timeout=0.5)
        assert time.monotonic() - t0 < 30 and "lock_timeout" in (e.value.hint or "")
    finally:
        holder.rollback()
        holder.close()
    led = open_ledger(url, budget=dpsql.Budget(1.0, 0.0), create=True, lock_timeout=0.5)
    assert led.total() == dpsql.Budget(1.0, 0.0)
    led.close()


STALLED_HOLDER = """
import os, signal, sys
import dpsql
from dpsql.ledger import _postgres, open_ledger
execute = _postgres._Con.execute
def stall(self, sql, params=None):
    if sql.startswith("INSERT INTO ledger_entries"):  # the ledger's lock is held from here to COMMIT
        print("holding", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # a frozen process: a debugger, a paused VM, a ^Z
    return execute(self, sql, params)
_postgres._Con.execute = stall
open_ledger(sys.argv[1], None, lock_timeout=1.0).reserve(dpsql.Budget(0.5, 0.0), mechanism="m", query="stalled",
                                                         tables=["t"], params={})
"""


def test_a_frozen_process_holding_the_ledger_lock_blocks_the_others_only_for_a_while(url: str) -> None:
    """Finding (fixed): every ledger transaction lifted the server's idle_in_transaction_session_timeout to
    0 (no limit), so a dpsql process frozen while it held the ledger's table lock (SIGSTOP, a debugger, a
    paused VM) blocked every charge on every host until it resumed, however long: each waiter gave up
    'busy' after lock_timeout. The idle time-out is now bounded (10 s, or twice lock_timeout): the server
    ends the frozen transaction, which had charged nothing, and the others go on."""
    import signal
    import subprocess
    import sys

    from conftest import child_env

    open_ledger(url, budget=dpsql.Budget(1.0, 0.0), create=True)
    holder = subprocess.Popen([sys.executable, "-c", STALLED_HOLDER, url], stdout=subprocess.PIPE, text=True,
                              env=child_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        led = open_ledger(url, lock_timeout=60.0)
        e = led.reserve(dpsql.Budget(0.5, 0.0), mechanism="m", query="after", tables=["t"], params={})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert [(x["entry_id"], x["query"]) for x in led.history().to_pylist()] == [(e, "after")]
    assert led.remaining() == dpsql.Budget(0.5, 0.0)  # the frozen transaction charged nothing


def test_a_release_that_gives_up_says_how_long_it_waited(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release waits ``release_wait``, not ``lock_timeout``: its 'busy' message states the wait it made (it said
    'held it for more than 0.1 s' after waiting 1.5 s)."""
    import psycopg

    from dpsql.ledger import Ledger

    led = open_ledger(url, budget=dpsql.Budget(1.0, 0.0), create=True, lock_timeout=0.1)
    entry = led.reserve(dpsql.Budget(0.1, 0.0), mechanism="basic", query="q", tables=["t"], params={})
    monkeypatch.setattr(Ledger, "release_wait", lambda self: 1.5)
    with psycopg.connect(url) as holder:
        holder.execute("LOCK TABLE ledger_entries, ledger_totals IN EXCLUSIVE MODE")
        with pytest.raises(LedgerError, match="busy") as e:
            led.commit(entry)
    assert "more than 1.5 s" in str(e.value)
