"""The command line as a scheduler runs it: a standard output whose reader has gone before anything was written,
and a locale whose encoding cannot name the files (PYTHONUTF8=0 under LC_ALL=C).

* ``dpsql query ... | loader`` whose loader died at start: the query was charged, then the write failed (exit 5,
  the answer saved aside). A pipe without a reader is found before the charge, as a closed standard output is
  (exit 2, nothing charged).
* Under an ASCII locale without Python's UTF-8 mode, a config's source named in UTF-8 ('données.parquet') was
  'no file matches' (now exit 66, a retry that never mends), and a --table path of UTF-8 bytes was 'not UTF-8
  text (byte 0xC3 is not UTF-8)'. Both now say that the locale's encoding cannot name the file, and how to run
  under a UTF-8 one (exit 2)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import child_env

from dpsql.cli import main


@pytest.fixture
def data(tmp_path: Path) -> Path:
    pq.write_table(pa.table({"uid": list(range(100))}), tmp_path / "t.parquet")
    pq.write_table(pa.table({"uid": list(range(100))}), tmp_path / "données.parquet")
    assert _in_process(tmp_path, "init", "--epsilon", "10")[0] == 0  # (only the commands under test need a process)
    return tmp_path


def _in_process(cwd: Path, *argv: str) -> tuple[int, str, str]:
    """``dpsql --ledger <cwd>/l.duckdb ARGV`` run in this process: exit code, standard output, standard error."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--ledger", str(cwd / "l.duckdb"), *argv])
    return code, out.getvalue(), err.getvalue()


def _dpsql(cwd: Path, *argv: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in child_env().items() if k != "DPSQL_LEDGER"}
    return subprocess.run([sys.executable, "-m", "dpsql.cli", *argv], cwd=cwd, env={**base, **(env or {})},
                          capture_output="stdout" not in kw, text=True, timeout=120, **kw)  # type: ignore[call-overload]


def _entries(cwd: Path) -> int:
    code, out, err = _in_process(cwd, "budget", "--history", "--format", "json")
    assert code == 0, err
    return len(json.loads(out)["entries"])


QUERY = ("--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
         "--epsilon", "0.1")


@pytest.mark.parametrize("out", [[], ["-o", "/dev/stdout", "--format", "csv"], ["-o", "r.csv", "--meta", "/dev/stdout"]])
@pytest.mark.parametrize("reader", [False, True])
def test_a_pipe_whose_reader_has_gone_is_refused_before_the_charge(data: Path, reader: bool, out: list[str]) -> None:
    r, w = os.pipe()
    if not reader:
        os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "dpsql.cli", *QUERY, *out], cwd=data, env=child_env(), stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
        if reader:
            got = os.read(r, 65536).decode()
            os.close(r)
    if reader:  # negative control: a live reader gets the rows
        assert p.returncode == 0 and got.startswith(("n", '"n"', "{")), p.stderr
        assert _entries(data) == 1
        return
    assert p.returncode == 2, p.stderr
    assert ("standard output is a pipe whose reader has closed it" if not out else "a pipe whose reader has closed it") \
        in p.stderr and "nothing was charged" in p.stderr, p.stderr
    assert _entries(data) == 0


ASCII = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def test_a_config_source_the_locale_cannot_name_says_so(data: Path) -> None:
    (data / "c.toml").write_text('[ledger]\npath = "l.duckdb"\n[tables.t]\nsource = "données.parquet"\nprivacy_unit = "uid"\n',
                                 encoding="utf-8")
    p = _dpsql(data, "--config", "c.toml", "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1", env=ASCII)
    assert p.returncode == 2, p.stderr
    assert "cannot be named in this process's file-system encoding" in p.stderr and "no file matches" not in p.stderr
    assert "PYTHONUTF8=1" in p.stderr.split("hint:")[1], p.stderr
    assert _dpsql(data, "--config", "c.toml", "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1").returncode == 0


def test_a_utf8_table_path_under_an_ascii_locale_is_not_called_not_utf8(data: Path) -> None:
    argv = [a.replace("t=t.parquet", "t=données.parquet") for a in QUERY]
    p = _dpsql(data, *argv, env=ASCII)
    assert p.returncode == 2, p.stderr
    assert "is UTF-8, but this process decodes file names as" in p.stderr and "PYTHONUTF8=1" in p.stderr, p.stderr
    assert _dpsql(data, *argv).returncode == 0  # negative control: under a UTF-8 locale it is read


# -- what a cron job or an Airflow task meets: working directory /, standard input /dev/null, a kill before the charge


def test_the_default_ledger_says_it_is_the_default_of_the_working_directory(data: Path) -> None:
    """A job started from / without --ledger, $DPSQL_LEDGER or a config read 'no budget ledger at
    /dpsql_ledger.duckdb': that this is the default in the working directory was left to guess."""
    p = _dpsql(data, "--table", "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
               "--epsilon", "0.1")
    assert p.returncode == 4, p.stderr
    assert f"no budget ledger at {data / 'dpsql_ledger.duckdb'}" in p.stderr or "no budget ledger at dpsql_ledger.duckdb" in p.stderr
    assert "the default" in p.stderr and "--ledger" in p.stderr and str(data) in p.stderr, p.stderr


def test_sql_from_an_empty_standard_input_says_so(data: Path) -> None:
    """A scheduler starts jobs with standard input at /dev/null: -f - then read 'the query is empty'."""
    p = subprocess.run([sys.executable, "-m", "dpsql.cli", *QUERY[:6], "query", "-f", "-", "--epsilon", "0.1"], cwd=data,
                       env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "standard input (-f -) is empty" in p.stderr and "nothing was charged" in p.stderr, p.stderr


def test_a_relative_config_not_found_names_the_working_directory(data: Path) -> None:
    p = _dpsql(Path("/"), "--config", "jobs/nightly.toml", "tables")
    assert p.returncode == 66, p.stderr
    assert "config file 'jobs/nightly.toml' not found (relative to the working directory /)" in p.stderr, p.stderr


def test_a_signal_before_the_charge_says_nothing_was_charged(data: Path) -> None:
    """SIGTERM (a job runner's timeout) before the query was charged said 'a charge already made stands (see dpsql
    budget --history)': the job's log could not tell whether to reconcile a charge."""
    probe = ("import os, signal, sys\nfrom dpsql import cli\nreal = cli._check_output_targets\n"
             "def hook(*a):\n    os.kill(os.getpid(), signal.SIGTERM)\n    for _ in range(10**6):\n        pass\n"
             "cli._check_output_targets = hook\nsys.exit(cli.main(sys.argv[1:]))\n")
    p = subprocess.run([sys.executable, "-c", probe, *QUERY], cwd=data, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 143, p.stderr
    assert "terminated (SIGTERM): nothing was charged by this command" in p.stderr, p.stderr
    assert _entries(data) == 0


HOLDER = """
import sys, time
from dpsql.ledger import Ledger
led = Ledger.open(sys.argv[1])
with led._txn(write=True) as (con, t):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_busy_ledger_exits_75_apart_from_a_missing_or_damaged_one(data: Path) -> None:
    """Another job holding the ledger past --lock-timeout exited 4, as a missing or damaged ledger does: a scheduler
    could not tell 'retry in a minute' from 'page someone'. It is EX_TEMPFAIL (75) now, nothing changed; the Python
    API raises LedgerBusyError, a LedgerError whose exit_code is 75."""
    from dpsql.errors import BUSY_EXIT_CODE, LedgerBusyError, LedgerError

    assert BUSY_EXIT_CODE == LedgerBusyError.exit_code == 75 and issubclass(LedgerBusyError, LedgerError)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "l.duckdb", "30"], cwd=data, env=child_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        p = _dpsql(data, "--lock-timeout", "0.3", *QUERY)
        assert p.returncode == 75, p.stderr
        assert "error: LedgerBusyError: ledger" in p.stderr and "nothing was changed" in p.stderr, p.stderr
        import dpsql

        with pytest.raises(LedgerBusyError) as ei, dpsql.Session(ledger=str(data / "l.duckdb"), lock_timeout=0.3) as s:
            s.register("t", str(data / "t.parquet"), privacy_unit="uid")
            s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1)
        assert ei.value.exit_code == 75
    finally:
        holder.kill()
        holder.wait()
    assert _entries(data) == 0
    assert _dpsql(data, *[a.replace("l.duckdb", "none.duckdb") for a in QUERY]).returncode == 4  # missing: still 4
