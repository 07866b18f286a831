"""dpsql embedded in ETL jobs: Python scripts whose signal handlers call back into a Session, and the
command line in shell pipelines."""

from __future__ import annotations

import errno
import io
import sys
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


def _interrupted() -> RuntimeError:
    """What DuckDB's Python client raises when Ctrl-C's KeyboardInterrupt comes during a statement."""
    return RuntimeError("Query interrupted")


def test_ctrl_c_during_a_private_read_is_a_keyboard_interrupt_and_the_charge_stands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's Ctrl-C while DuckDB read the private rows came out as 'ExecutionError: the query failed after
    its budget was charged ... (statement time-out, memory limit ...)', not the KeyboardInterrupt it was."""
    s = dpsql.Session(ledger=str(tmp_path / "l.duckdb"), budget=Budget(10.0, 1e-5), create=True)
    s.register("events", make_events(), privacy_unit="user_id")

    def read(*a: Any, **k: Any) -> Any:
        raise _interrupted()

    monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", read)
    with pytest.raises(KeyboardInterrupt):
        s.query("SELECT COUNT(*) AS n FROM events", epsilon=0.5)
    assert s.history().column("status").to_pylist() == ["failed"]
    s.close()


def test_ctrl_c_during_a_ledger_statement_is_a_keyboard_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It escaped a script as a raw 'RuntimeError: Query interrupted' (neither a DPSQLError nor a KeyboardInterrupt)."""
    from dpsql.ledger import _store

    s = dpsql.Session(ledger=str(tmp_path / "l.duckdb"), budget=Budget(10.0, 1e-5), create=True)
    s.register("events", make_events(), privacy_unit="user_id")

    def attach(path: str) -> None:
        raise _interrupted()

    monkeypatch.setitem(_store._HOOKS, "after_attach", attach)
    with pytest.raises(KeyboardInterrupt):
        s.query("SELECT COUNT(*) AS n FROM events", epsilon=0.5)
    with pytest.raises(KeyboardInterrupt):
        s.remaining()
    monkeypatch.delitem(_store._HOOKS, "after_attach")
    assert s.history().num_rows == 0  # interrupted in the reservation's transaction: nothing committed
    s.close()


def test_only_the_exact_interrupt_shapes_count_as_ctrl_c() -> None:
    """An Arrow source's scan cut by Ctrl-C fails in DuckDB with a message of one shape, matched whole: a message
    that merely contains it (as one quoting a cell could) is not taken for Ctrl-C."""
    import duckdb

    from dpsql.errors import interrupted_by_signal

    shape = "Invalid Input Error: counting the rows of the object registered as '_dpsql_src_t_1a2b_raw' failed: KeyboardInterrupt: "
    assert interrupted_by_signal(duckdb.InvalidInputException(shape))
    assert interrupted_by_signal(_interrupted())
    assert not interrupted_by_signal(duckdb.InvalidInputException(f"Could not convert string '{shape}' to INT32"))
    assert not interrupted_by_signal(duckdb.ConversionException(shape))
    assert not interrupted_by_signal(duckdb.InterruptException("INTERRUPT Error: Interrupted!"))  # the time-out's
    assert not interrupted_by_signal(RuntimeError("Query interrupted by a person's value"))


def test_a_relative_temp_directory_in_the_config_is_the_config_files_not_the_working_directorys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[engine] temp_directory = "spill" was resolved from the working directory: a cron job (run from /) spilled
    into /spill, and where that name was taken by a file, a query of a CSV table failed after its charge."""
    from dpsql.config import load_config

    owner = tmp_path / "owner"
    owner.mkdir()
    (owner / "dpsql.toml").write_text('[ledger]\npath = "l.duckdb"\n\n[engine]\ntemp_directory = "spill"\n')
    elsewhere = tmp_path / "cron"
    elsewhere.mkdir()
    (elsewhere / "spill").write_text("a file, not a directory")
    monkeypatch.chdir(elsewhere)
    assert load_config("../owner/dpsql.toml").engine.temp_directory == str(owner / "spill")
    (owner / "dpsql.toml").write_text('[ledger]\npath = "l.duckdb"\n\n[engine]\ntemp_directory = "/var/tmp/x"\n')
    assert load_config(str(owner / "dpsql.toml")).engine.temp_directory == "/var/tmp/x"  # an absolute one as given


@pytest.mark.parametrize("under", ["file", "file/sub"])
def test_a_temp_directory_that_cannot_be_made_is_refused_before_the_charge(tmp_path: Path, under: str) -> None:
    """A temp_directory at (or under) a file failed every query of a CSV table after its charge."""
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError, match="temp_directory .* cannot be used"):
        dpsql.Session(ledger=str(tmp_path / "l.duckdb"), budget=Budget(10.0, 1e-5), create=True,
                      engine={"temp_directory": str(tmp_path / under)})
    assert not (tmp_path / "l.duckdb").exists()
    s = dpsql.Session(budget=Budget(10.0, 1e-5), engine={"temp_directory": str(tmp_path / "new" / "spill")})
    s.close()  # one to be made is fine


def _as_ascii_locale_reads(text: str) -> str:
    """``text`` typed in UTF-8, as Python reads the command line under an ASCII locale (LC_ALL=C with
    PYTHONUTF8=0): every byte above 0x7F a lone surrogate."""
    return text.encode("utf-8").decode("ascii", "surrogateescape")


def test_utf8_text_on_the_command_line_of_an_ascii_locale_is_read_as_utf8(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under LC_ALL=C PYTHONUTF8=0 'été' in a query, a --domain or a --reason was refused as 'not UTF-8 text
    (byte 0xC3 is not UTF-8)': the bytes were UTF-8, only the locale was not."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import run_cli as run

    pq.write_table(pa.table({"uid": list(range(40)), "saison": ["été", "hiver"] * 20}), "s.parquet")
    flags = ["--ledger", "l.duckdb", "--table", "s=s.parquet", "--privacy-unit", "s=uid",
             "--domain", _as_ascii_locale_reads("s.saison=été,hiver")]
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "10"]) == 0
    sql = _as_ascii_locale_reads("SELECT saison, COUNT(*) AS n FROM s WHERE saison = 'été' GROUP BY saison")
    assert run([*flags, "query", sql, "--epsilon", "1", "--format", "json"]) == 0
    assert [r["saison"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["été"]
    assert run(["--ledger", "l.duckdb", "budget", "--set-total", "20", "0", "--reason", _as_ascii_locale_reads("période")]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--history", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_changes"][-1]["reason"] == "période"
    latin1 = "SELECT COUNT(*) FROM s WHERE saison = 'été'".encode("latin-1").decode("ascii", "surrogateescape")
    assert run([*flags, "query", latin1, "--epsilon", "1"]) == 2  # bytes that are not UTF-8 are still refused
    assert "not UTF-8" in capsys.readouterr().err


def test_a_relative_path_from_a_removed_working_directory_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A cron job left in a release directory that a deploy removed: '-o out.csv' or '--ledger l.duckdb' failed with
    'error: unexpected FileNotFoundError' (exit 1, the code of a failure after the charge). Absolute paths still work."""
    import json

    import pyarrow.parquet as pq
    from conftest import run_cli as run

    pq.write_table(make_events(), tmp_path / "e.parquet")
    led = str(tmp_path / "l.duckdb")
    flags = ["--ledger", led, "--table", f"e={tmp_path / 'e.parquet'}", "--privacy-unit", "e=user_id"]
    assert run(["--ledger", led, "init", "--epsilon", "10"]) == 0
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    capsys.readouterr()
    for argv in (["--ledger", "l.duckdb", "init", "--epsilon", "1"],
                 [*flags, "query", "SELECT COUNT(*) AS n FROM e", "--epsilon", "1", "-o", "out.csv"]):
        assert run(argv) == 2
        err = capsys.readouterr().err
        assert "working directory" in err and "unexpected" not in err and "hint:" in err
    assert run([*flags, "query", "SELECT COUNT(*) AS n FROM e", "--epsilon", "1", "-o", str(tmp_path / "out.csv")]) == 0
    capsys.readouterr()
    assert run(["--ledger", led, "budget", "--history", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["entries"]) == 1  # only the query with an absolute -o


def test_the_ledger_used_from_inside_its_own_operation_says_so_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's signal handler that reads the budget (s.remaining()) while the query's own ledger transaction
    runs in that thread waited for its own lock for lock_timeout, then blamed 'another thread of this process'."""
    import time

    from dpsql.errors import LedgerError
    from dpsql.ledger import _store

    s = dpsql.Session(ledger=str(tmp_path / "l.duckdb"), budget=Budget(10.0, 1e-5), create=True, lock_timeout=3)
    s.register("events", make_events(), privacy_unit="user_id")
    seen: list[BaseException] = []

    def handler_reads_the_budget(path: str) -> None:
        monkeypatch.delitem(_store._HOOKS, "after_attach")
        try:
            s.remaining()
        except LedgerError as e:
            seen.append(e)

    monkeypatch.setitem(_store._HOOKS, "after_attach", handler_reads_the_budget)
    start = time.monotonic()
    s.query("SELECT COUNT(*) AS n FROM events", epsilon=0.5)  # the handler's failure stays in the handler
    assert time.monotonic() - start < 2
    assert len(seen) == 1 and "inside one of its own operations" in str(seen[0])
    assert s.history().column("status").to_pylist() == ["released"]
    s.close()


def test_a_query_from_inside_a_query_of_the_same_thread_is_refused_before_its_charge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler that queried while its thread's query read private rows found DuckDB's connection busy with the
    interrupted statement: refused as 'does not type-check (ResourceInUseException)', or, for a query whose bind
    check was remembered from an earlier run, failed after its charge."""
    s = dpsql.Session(ledger=str(tmp_path / "l.duckdb"), budget=Budget(10.0, 1e-5), create=True)
    s.register("events", make_events(), privacy_unit="user_id")
    fetch = dpsql.session.backends.fetch_bounded
    inner: list[BaseException] = []

    def handler_queries(*a: Any, **k: Any) -> Any:
        monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", fetch)
        try:
            s.query("SELECT COUNT(*) AS n FROM events", epsilon=0.25)
        except dpsql.errors.DPSQLError as e:
            inner.append(e)
        return fetch(*a, **k)

    monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", handler_queries)
    s.query("SELECT COUNT(*) AS n FROM events", epsilon=0.5)
    assert len(inner) == 1 and isinstance(inner[0], ConfigError) and "inside its own request" in str(inner[0])
    assert s.history().column("epsilon").to_pylist() == [0.5]  # the inner one charged nothing
    s.close()


def test_ctrl_c_while_a_query_is_type_checked_is_a_keyboard_interrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before its charge, DuckDB binds the bounded query: Ctrl-C then escaped as a raw RuntimeError('Query interrupted')."""
    s = dpsql.Session(budget=Budget(10.0, 1e-5))
    s.register("events", make_events(), privacy_unit="user_id")

    def render(*a: Any, **k: Any) -> str:
        raise _interrupted()

    with monkeypatch.context() as m:
        m.setattr(s._engine, "_render", render)
        with pytest.raises(KeyboardInterrupt):
            s.explain("SELECT COUNT(*) AS n FROM events", epsilon=0.5)
    s.close()


@pytest.mark.parametrize("typ,value,text", [
    ("timestamp_us", 2**62, "148108-07-06T14:00:27.387904"),
    ("timestamp_us", -(2**62), "-144169-06-28T09:59:32.612096"),
    ("timestamp_us_utc", 2**62, "148108-07-06T14:00:27.387904Z"),
    ("timestamp_s", 2**40, "36812-02-20T00:36:16"),
    ("date32", 20_000_000, "56728-02-22"),
])
def test_csv_spells_dates_and_timestamps_beyond_year_9999(typ: str, value: int, text: str) -> None:
    """DuckDB's dates and timestamps reach far beyond Arrow's CSV writer: a released key past year 32767 was written
    '<value out of range: 4611686018427387904>', and a TIMESTAMPTZ past 9999 as a wrong year (17036 for 148108)."""
    import csv
    import io
    import types

    import pyarrow as pa

    from dpsql.cli import _render_rows

    arrow_type = {"timestamp_us": pa.timestamp("us"), "timestamp_us_utc": pa.timestamp("us", tz="UTC"),
                  "timestamp_s": pa.timestamp("s"), "date32": pa.date32()}[typ]
    raw = pa.array([value, 10**4, None], pa.int32()) if typ == "date32" else pa.array([value, 10**9, None], pa.int64())
    table = pa.table({"k": raw.cast(arrow_type), "n": [1, 2, 3]})
    out = _render_rows(types.SimpleNamespace(table=table), "csv", None).decode()
    rows = list(csv.reader(io.StringIO(out, newline="")))
    assert rows[1] == [text, "1"]
    want = table.column("k")[1].as_py()  # in range: the ISO text of the value Python reads
    assert (type(want).fromisoformat(rows[2][0].rstrip("Z")).replace(tzinfo=want.tzinfo) if typ != "date32"
            else type(want).fromisoformat(rows[2][0])) == want
    assert rows[3] == ["", "3"]  # NULL stays an empty unquoted field


class _FullStderr(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("argv,code", [
    (["query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1", "-o", "out.csv"], 0),
    (["query", "SELECT COUNT(*) AS n FROM nosuch", "--epsilon", "0.1"], 2),
    (["query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "1000"], 3),
])
def test_a_failing_stderr_never_changes_the_exit_code(workdir: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                      code: int) -> None:
    """Cron with 2>>log on a full disk, or 2>&1 | head: a refused query (2, 3) exited 1, the code that says a charge may
    stand, and an answered one whose rows were written to -o exited 1 too (a retry would charge again)."""
    from conftest import run_cli as run

    assert run(["--config", "examples/dpsql.toml", "budget"]) == 0
    with monkeypatch.context() as m:
        m.setattr(sys, "stderr", _FullStderr())
        assert run(["--config", "examples/dpsql.toml", *argv]) == code
    if code == 0:
        assert (workdir / "out.csv").read_text().startswith('"n"')


def test_a_uhugeint_output_that_arrow_cannot_hold_is_refused_before_the_charge() -> None:
    """DuckDB exports a UHUGEINT to Arrow as DECIMAL(38, 0): a released value of 3e38 (a noisy count times 1e35) was
    written as -40082366920938463463374607431768211456 in every format, with exit 0."""
    s = dpsql.Session(budget=Budget(10.0, 1e-5))
    s.register("events", make_events(), privacy_unit="user_id")
    big = "CAST('100000000000000000000000000000000000' AS UHUGEINT)"
    for sql in (f"SELECT CAST(COUNT(*) AS UHUGEINT) * {big} AS v FROM events",
                "SELECT COUNT(*) AS n, 300000000000000000000000000000000000000 AS w FROM events"):
        with pytest.raises(dpsql.errors.QueryError, match="UHUGEINT"):
            s.query(sql, epsilon=0.5)
    assert s.history().num_rows == 0
    r = s.query(f"SELECT CAST(COUNT(*) AS HUGEINT) AS v FROM events WHERE CAST(user_id AS UHUGEINT) < {big}", epsilon=0.5)
    assert r.table.num_rows == 1  # over private rows, a UHUGEINT is never exported: allowed
    s.close()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_ledger_path_starting_with_a_tilde_is_the_home_directorys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    how: str) -> None:
    """`--ledger=~/l.duckdb` (no shell expands '~' after '=') and DPSQL_LEDGER="~/l.duckdb" made a directory named '~'
    in the working directory, where the config's [ledger] path expands it."""
    from conftest import run_cli as run

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    argv = ["init", "--epsilon", "1"]
    if how == "flag":
        argv = ["--ledger=~/l.duckdb", *argv]
    else:
        monkeypatch.setenv("DPSQL_LEDGER", "~/l.duckdb")
    assert run(argv) == 0
    assert (home / "l.duckdb").exists() and not (work / "~").exists()
