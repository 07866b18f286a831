"""The budget ledger and the command line in ETL jobs: refusals worded in flags, nothing charged or changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli as run

CFG = ["--config", "examples/dpsql.toml"]


def _budget(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert run([*CFG, "budget", "--format", "json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize("values", [["1", "-1e-9"], ["-1e-9", "0"], ["-inf", "0"], ["1", "-.5e-3"], ["-1", "0"]])
def test_a_negative_set_total_in_scientific_notation_is_refused_naming_the_flag(
        workdir: Path, capsys: pytest.CaptureFixture[str], values: list[str]) -> None:
    """Finding (fixed): ``dpsql budget --set-total 1 -1e-9`` was argparse's 'argument --set-total: expected 2
    arguments' (it takes ``-1e-9`` for an option), where ``--set-total 1 -1`` named the value and the range a total
    needs. Both now get that message (exit 2) and the total is unchanged (``-1``: the negative control)."""
    before = _budget(capsys)
    assert run([*CFG, "budget", "--set-total", *values, "--reason", "typo"]) == 2
    err = capsys.readouterr().err
    assert f"--set-total {' '.join(values)} is refused" in err, err
    assert "needs a finite EPSILON >= 0 and a DELTA in [0, 1)" in err
    assert "expected 2 arguments" not in err
    assert _budget(capsys) == before


@pytest.mark.parametrize("flag", ["--epsilon", "--delta"])
def test_a_negative_number_flag_after_the_command_is_refused_naming_the_flag(
        workdir: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """A negative number in scientific notation after --epsilon/--delta names the flag too (negative control of the
    rewrite above: these were already attached to their flag)."""
    before = _budget(capsys)
    argv = ["query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1"]
    assert run([*CFG, *argv, flag, "-1e-9"]) == 2
    err = capsys.readouterr().err
    assert "expected one argument" not in err and flag in err, err
    assert _budget(capsys) == before


def test_explain_json_with_format_table_is_a_usage_error(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): ``dpsql explain ... --json --format table`` printed JSON, silently overriding the explicit
    --format table. The two contradict each other: a usage error naming both (exit 2); ``--json --format json``,
    ``--json`` alone and ``--format table`` alone still work."""
    q = ["explain", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1"]
    assert run([*CFG, *q, "--json", "--format", "table"]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and "--format table" in err, err
    for extra in (["--json", "--format", "json"], ["--json"], ["--format", "json"]):
        assert run([*CFG, *q, *extra]) == 0
        assert json.loads(capsys.readouterr().out)["mechanism"] == "laplace"
    assert run([*CFG, *q, "--format", "table"]) == 0
    assert capsys.readouterr().out.startswith("mechanism: laplace")


def _job(cwd: Path, argv: list[str], stdout: Path | None = None, stderr: Path | None = None) -> tuple[int, str]:
    """``dpsql ARGV >> stdout 2>> stderr`` in a child process: the exit code and what reached standard error."""
    import subprocess
    import sys

    from conftest import child_env

    env = {k: v for k, v in child_env().items() if k != "DPSQL_LEDGER"}
    with open(stdout or cwd / "rows.out", "ab") as out, open(stderr or cwd / "job.log", "ab") as err:
        p = subprocess.run([sys.executable, "-m", "dpsql.cli", *argv], cwd=cwd, env=env, stdout=out, stderr=err, timeout=120)
    return p.returncode, (stderr or cwd / "job.log").read_bytes().decode("utf-8", "replace")


@pytest.fixture
def etl(tmp_path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    (tmp_path / "data").mkdir()
    pcsv.write_csv(pa.table({"uid": list(range(50))}), tmp_path / "data" / "part-1.csv")
    # the ledger is created in this process: only the jobs under test need one of their own
    assert _in_process(["--ledger", str(tmp_path / "l.duckdb"), "init", "--epsilon", "10"])[0] == 0
    return tmp_path


def _in_process(argv: list[str]) -> tuple[int, str]:
    """``dpsql argv`` run in this process: the exit code and standard output (standard error discarded)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = run(argv)
    return code, out.getvalue()


ETL_QUERY = ["--ledger", "l.duckdb", "--table", "t=data/*.csv", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
             "--epsilon", "0.1", "--format", "csv"]


def _spent(cwd: Path) -> float:
    code, out = _in_process(["--ledger", str(cwd / "l.duckdb"), "budget", "--format", "json"])
    assert code == 0
    return float(json.loads(out)["spent"]["epsilon"])


@pytest.mark.parametrize("target,words", [
    (".l.duckdb.generation", "the budget ledger"),
    ("l.duckdb", "the budget ledger"),
    ("data/part-1.csv", "the source of table 't'"),
    ("data/part-2.csv", None),  # (the redirection makes an empty file that the glob matches: refused as a source)
])
def test_standard_output_appended_to_the_ledger_or_a_source_is_refused_before_the_charge(
        etl: Path, target: str, words: str | None) -> None:
    """Finding (fixed): ``-o /dev/stdout >> .l.duckdb.generation`` (or ``-o`` naming the ledger, a source, or a name
    the source's glob matches) is refused before the charge, but the rows printed without -o to a standard output the
    job appended to the same file were written there after the charge: CSV appended to the ledger's generation marker
    left the ledger refused as damaged (every later command exit 4), and rows appended beside ``data/*.csv`` were read
    back as rows of the table by the next run. Standard output is now checked as -o is (exit 2,
    nothing charged, the file as it was)."""
    path = etl / target
    before = path.read_bytes() if path.exists() else b""
    code, err = _job(etl, ETL_QUERY, stdout=path)
    assert code == 2, err
    if words is not None:
        assert words in err and "nothing was charged" in err and "standard output, redirected to" in err, err
    assert path.read_bytes() == before
    if not before:
        path.unlink()  # (made by the redirection: an empty CSV among the sources)
    assert _spent(etl) == 0
    # negative control: the same job writing elsewhere is answered
    assert _job(etl, ETL_QUERY)[0] == 0
    assert _spent(etl) == pytest.approx(0.1)


def test_suggest_caps_printing_to_the_ledger_is_refused_before_the_charge(etl: Path) -> None:
    """suggest-caps prints its charged advice to standard output: appended to the ledger's generation marker it damaged
    the ledger as a query's rows did. Refused before the charge too."""
    marker = etl / ".l.duckdb.generation"
    before = marker.read_bytes()
    argv = ["--ledger", "l.duckdb", "--table", "t=data/*.csv", "--privacy-unit", "t=uid", "suggest-caps", "t", "--epsilon", "0.1"]
    code, err = _job(etl, argv, stdout=marker)
    assert code == 2 and "standard output, redirected to" in err and "nothing was charged" in err, err
    assert marker.read_bytes() == before and _spent(etl) == 0
    assert _job(etl, argv)[0] == 0  # negative control
    assert _spent(etl) == pytest.approx(0.1)


def test_meta_naming_the_file_standard_output_is_redirected_to_is_refused(etl: Path) -> None:
    """Finding (fixed): ``dpsql query ... --format csv --meta out.json > out.json`` printed the rows into out.json, then
    renamed the meta over it: the rows were lost after the charge, with exit 0 (``-o F --meta F`` is refused as naming
    one file). Refused before the charge; ``--meta /dev/stdout`` (the stream itself, after the rows) still works."""
    out = etl / "out.json"
    code, err = _job(etl, [*ETL_QUERY, "--meta", "out.json"], stdout=out)
    assert code == 2 and "--meta 'out.json' names the file standard output is redirected to" in err, err
    assert out.read_bytes() == b"" and _spent(etl) == 0
    code, err = _job(etl, [*ETL_QUERY, "--meta", "/dev/stdout"], stdout=out)
    assert code == 0, err
    text = out.read_text()
    assert text.startswith('"n"\n') and '"mechanism": "laplace"' in text


def test_a_busy_ledger_names_its_holder_on_one_line(tmp_path: Path) -> None:
    """Finding (fixed): the holder of a busy ledger was quoted with its command line as is: a ``python -c`` program of
    several lines split the error over those lines (a job log's 'error:' line then held only the start of it, and the
    holder's program text came out as lines of their own). Its command line is now said on one line."""
    import subprocess
    import sys

    import dpsql
    from dpsql.errors import LedgerBusyError
    from dpsql.ledger import Ledger

    path = tmp_path / "l.duckdb"
    Ledger.create(str(path), dpsql.Budget(1.0)).close()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)", str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(LedgerBusyError) as e, Ledger.open(str(path), lock_timeout=0.2) as led:
            led.remaining()
        message = e.value.message
        assert f"process {holder.pid} (" in message and "holds it" in message, message
        assert "\n" not in message and "time.sleep" not in message  # cut at 80 characters, on one line
    finally:
        holder.kill()
        holder.wait()


def test_the_remaining_budget_is_shown_rounded_down(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (fixed): ``dpsql budget`` (and a query's summary line) printed the remaining budget with six significant
    digits rounded to nearest: a remaining delta of 9.9999996e-06 read 'delta=1e-05', more than is left, and a job that
    asked for that --delta was refused (exit 3). README: the remaining budget is rounded down, so that a request of
    exactly what it reports fits; the spent budget is shown rounded up (never less than was spent)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "0.30000001", "--delta", "9.9999996e-06"]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget"]) == 0
    out = capsys.readouterr().out
    assert "remaining: epsilon=0.3 delta=9.99999e-06" in out, out
    assert "spent:     epsilon=0 delta=0" in out  # (a zero stays 0)


@pytest.fixture(scope="module")
def pg_server() -> object:
    from _postgres import running_server

    yield from running_server()


@pytest.mark.parametrize("lock_timeout", [8e304, 1.7e308])
def test_a_huge_lock_timeout_on_a_postgresql_ledger_charges_and_records_the_release(
        pg_server: object, tmp_path: Path, lock_timeout: float) -> None:
    """Finding (fixed): the PostgreSQL ledger turned its waits into milliseconds for the server with ``ceil(seconds *
    1000)``: a --lock-timeout above about 6e304 (a finite number the CLI accepts) made that infinite, an
    'unexpected OverflowError' (exit 1). At 8e304 it came once the charge was made, while recording the release (which
    waits three times as long): the answer was lost and the entry stayed 'reserved'. The waits are now capped at the
    server's largest before the conversion; the DuckDB ledger never converted them (negative control below)."""
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq

    import dpsql

    pq.write_table(pa.table({"uid": list(range(20))}), tmp_path / "t.parquet")
    url = pg_server.database("r56_" + uuid.uuid4().hex[:12])  # type: ignore[attr-defined]
    for ledger in (url, str(tmp_path / "l.duckdb")):
        with dpsql.Session(ledger=ledger, budget=dpsql.Budget(1.0), create=True, lock_timeout=lock_timeout) as s:
            s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid")
            r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1)
            assert r.table.num_rows == 1
            assert [(e["status"], e["epsilon"]) for e in s.history().to_pylist()] == [("released", 0.1)]


def test_set_total_against_the_config_s_declared_total_warns_to_update_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (fixed): with a config that declares the total under [ledger] (and registers no tables), ``dpsql budget
    --set-total 20 0`` changed the total silently (exit 0), and every later command with that config was then refused
    (exit 2: the ledger records 20, the config says 10). The change still stands; a warning now says at once which
    config values to update. Setting the total the config declares warns nothing (negative control)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    (tmp_path / "dpsql.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 10.0\ndelta = 0.0\ncreate_if_missing = true\n')
    assert run(["budget"]) == 0
    capsys.readouterr()
    assert run(["budget", "--set-total", "10", "0", "--reason", "same"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert run(["budget", "--set-total", "20", "0", "--reason", "more"]) == 0
    err = capsys.readouterr().err
    assert "warning: the config 'dpsql.toml' declares epsilon = 10.0, delta = 0.0 under [ledger]" in err, err
    assert "epsilon = 20.0, delta = 0.0, the total now recorded" in err


def test_a_signal_once_the_command_is_done_leaves_its_exit_code(tmp_path: Path) -> None:
    """Finding (fixed): SIGTERM landing after ``dpsql query`` had written its answer and recorded the release, while the
    interpreter exited (its handlers given back), killed it with the default action: status -15 (143 to a shell) and
    no line on stderr, so a job runner took an answered, charged query for one cut short. The command's own process
    now ignores a signal once the command is done; an in-process ``main(argv)`` still gives the caller's handlers
    back (negative control)."""
    import signal
    import subprocess
    import sys

    from conftest import child_env

    from dpsql import cli

    assert run(["--ledger", str(tmp_path / "l.duckdb"), "init", "--epsilon", "1"]) == 0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    code = ("import os, signal, sys\nsys.argv = ['dpsql', '--ledger', sys.argv[1], 'budget']\nfrom dpsql.cli import main\n"
            "code = main()\nos.kill(os.getpid(), signal.SIGTERM)\nsys.exit(code)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "l.duckdb")], env=child_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr)
    assert "remaining: epsilon=1" in p.stdout
    assert cli.main(["--ledger", str(tmp_path / "l.duckdb"), "budget"]) == 0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_ledger_is_never_created_under_another_ledger_s_write_ahead_log_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (fixed): ``dpsql init --ledger l.duckdb.wal`` beside the ledger l.duckdb created a second ledger at the
    name DuckDB uses for l.duckdb's write-ahead log: the next charge of l.duckdb checkpointed and deleted that file, and
    the second ledger (its total, any charge recorded in it) was gone ('no budget ledger ..., but a ledger existed
    here'). A name ending in .wal is refused at creation (exit 4, nothing created); the ledger beside it is unharmed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": list(range(20))}), tmp_path / "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "1"]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb.wal", "init", "--epsilon", "5"]) == 4
    err = capsys.readouterr().err
    assert "l.duckdb.wal" in err and "write-ahead log" in err and "nothing was created" in err, err
    assert not (tmp_path / "l.duckdb.wal").exists() and not (tmp_path / ".l.duckdb.wal.generation").exists()
    assert run(["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
                "--epsilon", "0.1"]) == 0
    assert run(["--ledger", "l.duckdb.wal2", "init", "--epsilon", "5"]) == 0  # negative control: another name


@pytest.mark.parametrize("name", [".l.duckdb.queue", ".l.duckdb.q-123-0-abcd"])
def test_a_ledger_is_never_created_under_another_ledger_s_hidden_file_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Finding (fixed): ``dpsql init --ledger .l.duckdb.queue`` beside the ledger l.duckdb (whose queue file did not exist
    yet) created a ledger that the next operation of l.duckdb truncated to its 28-byte queue entry ('not a DuckDB
    database file at all'). The names of a ledger's hidden files are refused at creation (exit 4, nothing created)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "1"]) == 0
    capsys.readouterr()
    assert run(["--ledger", name, "init", "--epsilon", "5"]) == 4
    err = capsys.readouterr().err
    assert "hidden file that dpsql keeps beside a ledger named l.duckdb" in err and "nothing was created" in err, err
    assert not (tmp_path / name).exists()
    assert run(["--ledger", "l.duckdb", "budget"]) == 0
    assert run(["--ledger", ".hidden.duckdb", "init", "--epsilon", "5"]) == 0  # negative control: a hidden name of its own


def test_explain_printing_to_the_ledger_is_refused(etl: Path) -> None:
    """explain is free, but its plan printed to a standard output appended to the ledger's generation marker damaged
    the ledger as a query's rows did: refused (exit 2), the marker as it was; printed elsewhere it works."""
    marker = etl / ".l.duckdb.generation"
    before = marker.read_bytes()
    argv = ["--ledger", "l.duckdb", "--table", "t=data/*.csv", "--privacy-unit", "t=uid", "explain", "SELECT COUNT(*) AS n FROM t",
            "--epsilon", "0.1"]
    code, err = _job(etl, argv, stdout=marker)
    assert code == 2 and "standard output, redirected to" in err, err
    assert marker.read_bytes() == before
    assert _job(etl, argv)[0] == 0  # negative control


def test_budget_printing_to_the_ledger_is_refused(etl: Path) -> None:
    """dpsql budget (--set-total too) printed its summary into a standard output appended to the ledger's generation
    marker, damaging the ledger: refused (exit 2), the marker and the total as they were; printed elsewhere it works."""
    marker = etl / ".l.duckdb.generation"
    before = marker.read_bytes()
    code, err = _job(etl, ["--ledger", "l.duckdb", "budget", "--set-total", "20", "0", "--reason", "r"], stdout=marker)
    assert code == 2 and "standard output, redirected to" in err, err
    assert marker.read_bytes() == before
    out = etl / "b.txt"
    assert _job(etl, ["--ledger", "l.duckdb", "budget"], stdout=out)[0] == 0  # negative control
    assert "total:     epsilon=10 " in out.read_text()
