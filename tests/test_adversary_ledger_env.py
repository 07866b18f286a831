"""The ledger's environment going wrong: a full disk, permissions, the file system under it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import spawn_python as _spawn

from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger, open_ledger


@pytest.fixture(scope="module")
def server() -> Any:
    """A PostgreSQL server for the tests that leave it running (one that stops it starts its own)."""
    from _postgres import running_server

    yield from running_server()

#: a disk that holds the ledger file as it is but nothing more: every CHECKPOINT that grows it fails
FULL_DISK_RETRIES = """
import json, os, resource, signal, sys
from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = sys.argv[1]
size = os.path.getsize(path)
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
led = Ledger(path, lock_timeout=5)
errors = []
for i in range(3):
    try:
        led.reserve(Budget(0.25), mechanism="m", query="big " + "x" * 300000, tables=["t"], params={})
        errors.append(None)
    except LedgerError as e:
        errors.append(str(e))
print(json.dumps(errors))
"""


def test_retries_on_a_full_disk_charge_once_not_once_per_retry(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    p = _spawn(FULL_DISK_RETRIES, str(path))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    first, *retries = json.loads(out.strip().splitlines()[-1])
    # the first charge reached the write-ahead log and stands (the caller read nothing) ...
    assert first is not None and "entry 1" in first and "stands" in first
    # ... but a retry while the disk is still full adds no charge that would fail the same way
    for e in retries:
        assert e is not None and "nothing was charged" in e and "free disk space" in e, e
    assert led.remaining() == Budget(0.75)
    assert [r["status"] for r in led.history().to_pylist()] == ["reserved"]
    # with space again, the next charge writes the earlier one into the file too
    led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
    assert led.remaining() == Budget(0.5) and not Path(str(path) + ".wal").exists()


def test_a_release_waits_for_a_postgres_server_that_restarts_meanwhile() -> None:
    import os
    import threading

    import _postgres

    for own in _postgres.running_server():  # a server of its own: it is stopped while a query runs
        url = own.database("restarting")
        led = open_ledger(url, Budget(1.0), create=True, lock_timeout=2)
        entry = led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
        pg_ctl = os.path.join(own.bindir, "pg_ctl")
        root = os.path.dirname(own.datadir)
        _postgres._run(own, [pg_ctl, "-D", own.datadir, "-m", "fast", "-w", "stop"])
        # the server comes back a second later (a restart, a fail-over) while the query's answer waits
        opts = f"-c listen_addresses=127.0.0.1 -p {own.port} -k {root} -c fsync=off -c max_connections=60"
        starter = threading.Timer(1.0, _postgres._run, [own, [pg_ctl, "-D", own.datadir, "-o", opts, "-l",
                                                              os.path.join(root, "log"), "-w", "start"]])
        starter.start()
        try:
            led.commit(entry)  # used to give up at once: the paid answer was discarded, the entry left 'reserved'
        finally:
            starter.join()
        assert [e["status"] for e in led.history().to_pylist()] == ["released"]
        # a charge still fails fast on a server that cannot be reached (nothing read yet, nothing lost)
        _postgres._run(own, [pg_ctl, "-D", own.datadir, "-m", "fast", "-w", "stop"])
        with pytest.raises(LedgerError, match="cannot connect.*nothing was charged"):
            led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
        led.close()


def test_a_ledger_path_with_a_nul_character_is_a_config_error(tmp_path: Path) -> None:

    from dpsql.errors import ConfigError

    # (a TOML config can spell one: path = "l\\u0000.duckdb"; Python's file functions raised a bare ValueError)
    for call in (lambda: Ledger.open(tmp_path / "l\0.duckdb"), lambda: Ledger.create(tmp_path / "l\0.duckdb", Budget(1.0))):
        with pytest.raises(ConfigError, match="NUL character.*nothing was created or charged"):
            call()


def test_a_ledger_path_under_a_file_says_there_is_no_ledger_not_that_a_marker_is_unreadable(tmp_path: Path) -> None:

    (tmp_path / "afile").write_text("x")
    for path in (tmp_path / "afile" / "l.duckdb", tmp_path / "afile" / "sub" / "l.duckdb"):
        with pytest.raises(LedgerError, match="no budget ledger at") as info:
            Ledger.open(path)
        assert "marker" not in str(info.value) and "dpsql init" in str(info.value.hint)
    with pytest.raises(LedgerError, match="afile is not a directory"):
        Ledger.create(tmp_path / "afile" / "l.duckdb", Budget(1.0))


def test_postgres_tables_of_another_layout_are_named_as_such(server: Any) -> None:
    import psycopg

    url = server.database("layout")
    with psycopg.connect(url, autocommit=True) as con:  # the ledger's table names, another layout
        con.execute("CREATE TABLE ledger_meta (key text PRIMARY KEY, value text NOT NULL); "
                    "INSERT INTO ledger_meta VALUES ('schema_version', '1'); "
                    "CREATE TABLE ledger_totals (change_id bigint, epsilon float8, delta float8); "
                    "INSERT INTO ledger_totals VALUES (1, 1.0, 0); "
                    "CREATE TABLE ledger_entries (entry_id bigint, epsilon float8, delta float8, status text)")
    led = open_ledger(url, None)
    with pytest.raises(LedgerError, match="do not have the layout of dpsql's ledger") as info:
        led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
    # (it used to say "PostgreSQL failed (UndefinedColumn)", with a hint about the server and rights)
    assert '"created_at"' in str(info.value) and "nothing was charged" in str(info.value)
    led.close()


def test_postgres_history_reads_under_any_datestyle(server: Any) -> None:
    import psycopg

    url = server.database("datestyle")
    led = open_ledger(url, Budget(1.0), create=True)
    led.commit(led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={}))
    led.close()
    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute("ALTER DATABASE datestyle SET DateStyle = 'SQL, DMY'")
    led = open_ledger(url, None)  # (the history raised psycopg's NotImplementedError: a raw exception)
    entries = led.history().to_pylist()
    assert [e["status"] for e in entries] == ["released"] and entries[0]["created_at"].year >= 2024
    assert led.totals_history().num_rows == 1
    led.close()


def test_postgres_ledger_outside_a_changed_search_path_is_not_created_afresh(server: Any) -> None:
    import psycopg

    from dpsql.ledger._postgres import PostgresLedger

    url = server.database("moved_path")
    led = open_ledger(url, Budget(1.0), create=True)
    led.reserve(Budget(1.0), mechanism="m", query="q", tables=["t"], params={})  # all of it spent
    led.close()
    with psycopg.connect(url, autocommit=True) as con:  # the database's search_path changes (a DBA, a migration)
        con.execute("CREATE SCHEMA team; ALTER DATABASE moved_path SET search_path = team")
    for create in (False, True):  # create_if_missing = true created a new ledger there: the whole budget again
        with pytest.raises(LedgerError, match=r"search_path \(team\).*in schema public") as info:
            open_ledger(url, Budget(1.0), create=create)
        assert "nothing was created" in str(info.value) and "NEW budget" in str(info.value.hint)
    # naming the schema reads the ledger; creating one in the new schema stays possible, explicitly (dpsql init)
    assert open_ledger(url + "?options=-csearch_path%3Dpublic", None).remaining() == Budget(0.0)
    PostgresLedger.create(url, Budget(1.0)).close()


def _two_schema_ledgers(server: Any, db: str, *, legacy: bool = False) -> tuple[str, Any, int, Any]:
    """Ledgers in schemas a and b of one database, each with entry 1 reserved (another process's query on b); the
    database's search_path leads to a; returns the URL without a schema, a's ledger object, its entry, and a
    ledger object that has only read a (``legacy``: both ledgers written before identities, with no ledger_id row
    until a write gives them one)."""
    import psycopg

    from dpsql.ledger._postgres import PostgresLedger

    url = server.database(db)
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE SCHEMA a; CREATE SCHEMA b")
    theirs = open_ledger(url + "?options=-csearch_path%3Db", Budget(5.0), create=True)
    entry_b = theirs.reserve(Budget(1.0), mechanism="gaussian", query="theirs", tables=["x"], params={"sigma": 3})
    theirs.close()
    PostgresLedger.create(url + "?options=-csearch_path%3Da", Budget(5.0)).close()  # (dpsql init: a ledger there too)
    with psycopg.connect(url, autocommit=True) as con:
        if legacy:
            con.execute("DELETE FROM a.ledger_meta WHERE key = 'ledger_id'; DELETE FROM b.ledger_meta WHERE key = "
                        "'ledger_id'")
        con.execute(f"ALTER DATABASE {db} SET search_path = a")
    reader = open_ledger(url, None)  # reads a
    led = open_ledger(url, None)
    mine = led.reserve(Budget(0.5), mechanism="laplace", query="mine", tables=["t"], params={"scale": 2})
    assert mine == entry_b == 1
    return url, led, mine, reader


def _switch_to_b(server: Any, db: str) -> None:
    """The database's search_path changes, and the ledger's kept connections are replaced (a restart, a pooler's
    other server session, a connection older than 60 s)."""
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute(f"ALTER DATABASE {db} SET search_path = b")
        con.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> "
                    "pg_backend_pid()", [db])


@pytest.mark.parametrize("legacy", [False, True])
def test_postgres_release_never_lands_in_another_schemas_ledger_after_a_search_path_change(
        server: Any, legacy: bool) -> None:
    import psycopg

    db = "switched_legacy" if legacy else "switched"
    url, led, mine, reader = _two_schema_ledgers(server, db, legacy=legacy)
    _switch_to_b(server, db)
    # (the release used to be recorded on b's entry 1, another process's running query, whose own release was then
    # refused as already released)
    b = "a ledger without an identity yet" if legacy else "ledger [0-9a-f]{32}"
    with pytest.raises(LedgerError, match=rf"now leads to another ledger \(schema b, {b}\) than the one this ledger "
                                          r"object used before \(schema a, ledger [0-9a-f]{32}\)") as info:
        led.commit(mine, params_update={"rows": 3})
    assert "stays 'reserved'" in str(info.value) and "search_path%3Da" in str(info.value.hint)
    with pytest.raises(LedgerError, match=r"another ledger.*nothing was charged"):  # a charge: nothing charged
        led.reserve(Budget(0.5), mechanism="laplace", query="again", tables=["t"], params={})
    # an object that has only read a ledger keeps to it too (one written before identities: by its table)
    before = "a ledger without an identity yet" if legacy else "ledger [0-9a-f]{32}"
    with pytest.raises(LedgerError, match=rf"another ledger \(schema b, {b}\).*\(schema a, {before}\).*nothing was "
                                          "charged"):
        reader.reserve(Budget(0.5), mechanism="laplace", query="again", tables=["t"], params={})
    theirs = open_ledger(url + "?options=-csearch_path%3Db", None)
    theirs.commit(1)
    assert [(e["status"], e["params"]) for e in theirs.history().to_pylist()] == [("released", '{"sigma":3}')]
    a = open_ledger(url + "?options=-csearch_path%3Da", None)
    assert [e["status"] for e in a.history().to_pylist()] == ["reserved"] and a.remaining() == Budget(4.5)
    # (a ledger written before identities gets one with its first write, under the ledger's lock)
    with psycopg.connect(url, autocommit=True) as con:
        ids = con.execute("SELECT (SELECT value FROM a.ledger_meta WHERE key = 'ledger_id'), "
                          "(SELECT value FROM b.ledger_meta WHERE key = 'ledger_id')").fetchone()
    assert ids[0] is not None and ids[1] is not None and ids[0] != ids[1]
    for x in (led, reader, theirs, a):
        x.close()


#: every operation of a ledger beside which a named pipe stands in for a side file (opening a pipe waits for
#: a writer: it used to wait for ever, past lock_timeout, holding the ledger's lock)
PIPE_SIDE_FILE = """
import json, sys
from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger
led = Ledger(sys.argv[1], lock_timeout=2)
errors = []
for call in (led.remaining, lambda: led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})):
    try:
        call()
        errors.append(None)
    except LedgerError as e:
        errors.append(str(e))
print(json.dumps(errors))
"""


def test_a_named_pipe_in_place_of_a_marker_or_the_wal_is_refused_at_once(tmp_path: Path) -> None:
    import os
    import subprocess

    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0)).close()
    for side, what in ((tmp_path / ".ledger.duckdb.generation", "generation marker"),
                       (tmp_path / "ledger.duckdb.generation", "generation marker"),  # the earlier releases' name
                       (Path(str(path) + ".wal"), "write-ahead log")):
        saved = side.read_bytes() if side.exists() else None
        side.unlink(missing_ok=True)
        os.mkfifo(side)
        p = _spawn(PIPE_SIDE_FILE, str(path))
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise AssertionError(f"an operation waited for ever on the named pipe {side}") from None
        errors = json.loads(out.strip().splitlines()[-1])
        assert all(e is not None and what in e and "named pipe" in e for e in errors), errors
        side.unlink()
        if saved is not None:
            side.write_bytes(saved)
    assert Ledger(str(path)).remaining() == Budget(1.0)


#: a query whose release is recorded in the write-ahead log, but whose CHECKPOINT then fails (the disk filled up)
RELEASE_CHECKPOINT_FAILS = """
import json, os, resource, signal, sys, warnings
import dpsql
from dpsql.ledger import _store
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
s = dpsql.Session(ledger=sys.argv[1], create=True, budget=dpsql.Budget(1.0, 1e-6))
s.register("t", sys.argv[2], privacy_unit="user_id", max_groups_per_unit=1, max_rows_per_group=1)
calls = []
def full_disk(path):
    calls.append(path)
    if len(calls) == 2:  # the release's (the charge's was the first)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
_store._HOOKS["before_checkpoint"] = full_disk
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
print(json.dumps({"rows": r.table.num_rows, "warnings": [str(x.message) for x in w], "calls": len(calls)}))
"""


def test_an_answer_whose_release_is_recorded_is_returned_when_the_checkpoint_fails(tmp_path: Path) -> None:
    import duckdb

    data = tmp_path / "t.parquet"
    duckdb.sql(f"COPY (SELECT range AS user_id FROM range(50)) TO '{data}' (FORMAT parquet)")
    path = tmp_path / "ledger.duckdb"
    p = _spawn(RELEASE_CHECKPOINT_FAILS, str(path), str(data))
    out, err = p.communicate(timeout=60)
    # the release was recorded (in the write-ahead log), and the answer paid for used to be discarded with an error
    assert p.returncode == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    assert got["calls"] == 2 and got["rows"] == 1
    assert any("recorded in the write-ahead log" in w and "the answer is returned" in w for w in got["warnings"]), got
    led = Ledger(str(path))
    assert [e["status"] for e in led.history().to_pylist()] == ["released"] and led.remaining().epsilon == 0.5
    led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})  # writes the release into the file
    assert not Path(str(path) + ".wal").exists()


def test_postgres_release_tries_again_when_the_statement_timeout_cancels_its_first_statement(
    server: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import psycopg

    from dpsql.ledger import _postgres as pg

    url = server.database("stt")
    led = open_ledger(url, Budget(1.0), create=True)
    entry = led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
    led.close()
    with psycopg.connect(server.url, autocommit=True) as con:  # a tiny default, which new sessions read
        con.execute("ALTER DATABASE stt SET statement_timeout = '50ms'")
    led = open_ledger(url, None)
    execute, slow = pg._Con.execute, [True]

    def once_slow(self: Any, sql: str, params: Any = None, execute: Any = execute, slow: list[bool] = slow) -> Any:
        if slow and sql.startswith("SET TRANSACTION"):  # a loaded server: the first statement overruns it
            slow.clear()
            return execute(self, "SELECT pg_sleep(0.5)")
        return execute(self, sql, params)

    monkeypatch.setattr(pg._Con, "execute", once_slow)
    led.commit(entry)  # used to fail: the paid answer discarded, the entry left 'reserved'
    assert [e["status"] for e in led.history().to_pylist()] == ["released"]
    slow.append(True)  # a charge gives up at once, saying why
    with pytest.raises(LedgerError, match="statement_timeout.*nothing was charged") as info:
        led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
    assert "ALTER ROLE" in str(info.value.hint)
    led.close()


def test_a_switched_directory_link_never_lets_a_release_land_in_another_ledger(tmp_path: Path) -> None:
    import os

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    os.symlink("a", tmp_path / "current")  # e.g. a deployment's 'current' link
    Ledger.create(tmp_path / "a" / "l.duckdb", Budget(5.0)).close()
    other = Ledger.create(tmp_path / "b" / "l.duckdb", Budget(5.0))
    theirs = other.reserve(Budget(1.0), mechanism="gaussian", query="theirs", tables=["x"], params={"sigma": 3})
    led = Ledger.open(tmp_path / "current" / "l.duckdb")
    mine = led.reserve(Budget(0.5), mechanism="laplace", query="mine", tables=["t"], params={"scale": 2})
    assert mine == theirs == 1
    os.remove(tmp_path / "current")
    os.symlink("b", tmp_path / "current")  # switched while the query runs
    # (the release used to be recorded on the other ledger's entry 1, another process's running query, whose
    # own release was then refused as already released)
    with pytest.raises(LedgerError, match="now leads to another ledger file") as info:
        led.commit(mine, params_update={"rows": 3})
    assert "stays 'reserved'" in str(info.value)
    other.commit(theirs)
    assert [(e["status"], e["params"]) for e in other.history().to_pylist()] == [("released", '{"sigma":3}')]
    assert [e["status"] for e in Ledger.open(tmp_path / "a" / "l.duckdb").history().to_pylist()] == ["reserved"]


def test_a_lock_timeout_beyond_the_float_range_is_a_config_error(tmp_path: Path) -> None:
    from dpsql.config import load_config
    from dpsql.errors import ConfigError

    huge = 10**400  # TOML reads an integer of any length (it raised OverflowError: "error: unexpected OverflowError")
    with pytest.raises(ConfigError, match="lock_timeout must be a finite number"):
        Ledger(str(tmp_path / "l.duckdb"), lock_timeout=huge)
    cfg = tmp_path / "dpsql.toml"
    cfg.write_text(f'[ledger]\npath = "l.duckdb"\nlock_timeout = {huge}\n')
    with pytest.raises(ConfigError, match=r"\[ledger\] lock_timeout must be a finite number"):
        load_config(str(cfg))
