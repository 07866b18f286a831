"""The command line in ETL jobs: outputs named through the caller's own file descriptors.

* ``-o /dev/stdout`` (or ``--meta /dev/stderr``, ``/dev/fd/N``) whose stream the job redirected to a regular file
  (``>> rows.csv``, ``2>> job.log``) was written like a file of its own name: a temporary file beside the target,
  renamed over it. That replaced the log with the new output (the lines appended there before were lost, and every
  later message of the command went to the replaced, unlinked file). Such a path is the caller's stream: it is now
  written in place, as standard output is without ``-o``, so ``>>`` appends and ``>`` keeps its meaning.
* A pipe or a device (``-o /dev/stdout`` of a pipe, ``/dev/full``, a named pipe) is written in place, yet ``-o``/``--meta``
  was refused before the charge as 'permission denied' whenever its directory could not be written (``/dev`` for
  everyone but root): the directory only matters for a file that a temporary sibling replaces.
"""

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

from dpsql import cli


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A table and a fresh ledger (created in this process: only the commands under test need one of their own)."""
    pq.write_table(pa.table({"uid": list(range(100))}), tmp_path / "t.parquet")
    assert _in_process(["--ledger", str(tmp_path / "l.duckdb"), "init", "--epsilon", "10"])[0] == 0
    return tmp_path


def _in_process(argv: list[str]) -> tuple[int, str, str]:
    """``dpsql argv`` run in this process: (exit code, standard output, standard error)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def _dpsql(cwd: Path, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in child_env().items() if k != "DPSQL_LEDGER"}
    return subprocess.run([sys.executable, "-m", "dpsql.cli", *argv], cwd=cwd, env=env, text=True, timeout=120,
                          **kw)  # type: ignore[call-overload]


def _entries(cwd: Path) -> int:
    code, out, err = _in_process(["--ledger", str(cwd / "l.duckdb"), "budget", "--history", "--format", "json"])
    assert code == 0, err
    return len(json.loads(out)["entries"])


QUERY = ("--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
         "--epsilon", "0.1")


@pytest.mark.skipif(not os.path.exists("/dev/stdout"), reason="needs /dev/stdout")
@pytest.mark.parametrize("out", [["--format", "csv"], ["-o", "/dev/stdout", "--format", "csv"]])
def test_rows_to_dev_stdout_appended_to_a_file_keep_what_it_held(data: Path, out: list[str]) -> None:
    """``dpsql query ... -o /dev/stdout >> rows.csv``: the rows are appended, as without -o (negative control)."""
    log = data / "rows.csv"
    log.write_text("earlier rows\n")
    with open(log, "a") as f:
        p = _dpsql(data, *QUERY, *out, stdout=f, stderr=subprocess.PIPE)
    assert p.returncode == 0, p.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier rows", lines
    assert lines[1] == '"n"' and len(lines) == 3, lines
    assert _entries(data) == 1


@pytest.mark.skipif(not os.path.exists("/dev/stderr"), reason="needs /dev/stderr")
def test_meta_to_dev_stderr_appended_to_a_job_log_keeps_the_log_and_the_summary(data: Path) -> None:
    """``dpsql query ... --meta /dev/stderr 2>> job.log``: the job log keeps yesterday's lines, the meta and the
    command's own summary line (it went to the replaced, unlinked file)."""
    log = data / "job.log"
    log.write_text("yesterday's run\n")
    with open(log, "a") as f:
        p = _dpsql(data, *QUERY, "--format", "csv", "--meta", "/dev/stderr", stdout=subprocess.PIPE, stderr=f)
    text = log.read_text()
    assert p.returncode == 0, text
    assert text.startswith("yesterday's run\n"), text
    assert '"mechanism"' in text and "ledger entry 1" in text, text
    assert p.stdout.splitlines()[0] == '"n"'


@pytest.mark.skipif(not os.path.exists("/dev/fd/3"), reason="needs /dev/fd")
def test_output_to_dev_fd_of_an_appended_file_appends(data: Path) -> None:
    log = data / "out.csv"
    log.write_text("earlier\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        p = _dpsql(data, *QUERY, "-o", f"/dev/fd/{fd}", "--format", "csv", capture_output=True, pass_fds=(fd,))
    finally:
        os.close(fd)
    assert p.returncode == 0, p.stderr
    assert log.read_text().splitlines()[:2] == ["earlier", '"n"'], log.read_text()


def test_a_device_in_a_directory_one_cannot_write_is_not_refused(data: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """As any user but root sees /dev (not writable): ``-o /dev/full`` is written in place, so it is not 'permission
    denied' before the charge; the write then fails after it, as the README says (exit 5, the answer saved)."""
    real = os.access

    def access(path: object, mode: int, *a: object, **k: object) -> bool:
        if os.path.abspath(str(path)) == "/dev" and mode & os.W_OK:
            return False  # a user other than root
        return real(path, mode, *a, **k)  # type: ignore[arg-type]

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    monkeypatch.chdir(data)
    monkeypatch.setattr(os, "access", access)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(data / "state"))
    code = cli.main([*QUERY, "-o", "/dev/full", "--format", "csv"])
    err = capsys.readouterr().err
    assert "permission denied" not in err, err
    assert code == 5 and "writing -o '/dev/full' failed" in err and "charge stands" in err, err


def test_a_file_in_a_directory_one_cannot_write_is_still_refused(data: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: a regular file is replaced by a temporary sibling, so its directory must be writable."""
    real = os.access
    ro = str(data / "ro")
    os.mkdir(ro)

    def access(path: object, mode: int, *a: object, **k: object) -> bool:
        if os.path.abspath(str(path)) == ro and mode & os.W_OK:
            return False
        return real(path, mode, *a, **k)  # type: ignore[arg-type]

    monkeypatch.chdir(data)
    monkeypatch.setattr(os, "access", access)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    code = cli.main([*QUERY, "-o", "ro/out.csv"])
    err = capsys.readouterr().err
    assert code == 2 and "permission denied" in err and "nothing was charged" in err, err
    assert _entries(data) == 0


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16", "utf-16-be"])
@pytest.mark.parametrize("stdin", [False, True])
def test_a_utf16_sql_file_is_named_as_such_in_cli_terms(data: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], encoding: str, stdin: bool) -> None:
    """A SQL file saved as UTF-16 (as some Windows editors and PowerShell's `>` do) was 'the query text holds a NUL
    character ... (e.g. read the file with encoding='utf-8')' without a byte order mark (a Python hint), or 'not UTF-8
    text' with one. It is refused before anything is charged, naming -f, UTF-16 and how to convert it."""
    import io

    (data / "q.sql").write_bytes("SELECT COUNT(*) AS n FROM t".encode(encoding))
    monkeypatch.chdir(data)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    argv = [*QUERY[:6], "query", "-f", "-" if stdin else "q.sql", "--epsilon", "0.1"]
    if stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((data / "q.sql").read_bytes())))
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "UTF-16" in err and ("(-f -)" in err if stdin else "'q.sql' (-f)" in err), err
    assert "encoding=" not in err and "iconv -f UTF-16" in err, err
    assert _entries(data) == 0


def test_a_utf8_sql_file_still_runs(data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control."""
    (data / "q.sql").write_bytes("\ufeffSELECT COUNT(*) AS n FROM t -- café\n".encode())
    monkeypatch.chdir(data)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    assert cli.main([*QUERY[:6], "query", "-f", "q.sql", "--epsilon", "0.1", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == '"n"'


def test_a_stray_nul_in_a_utf8_sql_file_is_named_without_utf16(data: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (data / "q.sql").write_bytes(b"SELECT COUNT(*) AS n\nFROM t\x00")
    monkeypatch.chdir(data)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    assert cli.main([*QUERY[:6], "query", "-f", "q.sql", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "'q.sql' (-f) holds a NUL character (line 2, column 7)" in err and "UTF-16" not in err, err
    assert "encoding=" not in err and "tr -d" in err, err
    assert _entries(data) == 0


@pytest.mark.skipif(not os.path.exists("/dev/stdout"), reason="needs /dev/stdout")
@pytest.mark.parametrize("closed,out", [
    (1, ["-o", "/dev/stdout", "--format", "csv"]),
    (1, ["-o", "r.csv", "--meta", "/dev/stdout"]),
    (2, ["-o", "r.csv", "--meta", "/dev/stderr"]),
    (1, ["-o", "/dev/fd/1", "--format", "csv"]),
])
def test_an_output_naming_a_closed_stream_is_refused_before_the_charge(data: Path, closed: int, out: list[str]) -> None:
    """``dpsql query ... -o /dev/stdout >&-`` was charged and exited 0 with the rows written to /dev/null (the
    descriptor the closed stream's number came to name): the paid answer was lost without a word. As a closed
    standard output without -o, it is a usage error before the charge (exit 2)."""
    shell = f'exec "$0" -m dpsql.cli "$@" {closed}>&-'  # as a job script runs it: dpsql ... >&- (or 2>&-)
    p = subprocess.run(["sh", "-c", shell, sys.executable, *QUERY, *out], cwd=data,
                       env={k: v for k, v in child_env().items() if k != "DPSQL_LEDGER"},
                       stdout=subprocess.PIPE if closed == 2 else None, stderr=subprocess.PIPE if closed == 1 else None,
                       text=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    if closed == 1:  # (with standard error closed, its messages go nowhere: the exit code and the ledger tell)
        assert "closed" in p.stderr and "nothing was charged" in p.stderr, p.stderr
    assert _entries(data) == 0


def test_an_output_naming_a_descriptor_that_is_not_open_says_so(data: Path) -> None:
    p = _dpsql(data, *QUERY, "-o", "/dev/fd/9", "--format", "csv", capture_output=True)
    assert p.returncode == 2 and "file descriptor 9" in p.stderr and "not open" in p.stderr, p.stderr
    assert _entries(data) == 0
