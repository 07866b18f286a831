"""Ctrl-C (SIGINT) and SIGTERM at awkward moments: whatever the signal interrupts (a DuckDB
statement of the ledger, an import, Python code run from a string), `dpsql` exits 130 / 143 with
its one line on stderr, as documented, never 'unexpected ...' (exit 1) or a death by another signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import child_env

#: a ledger statement that DuckDB is running when the signal arrives: DuckDB stops it and raises
#: RuntimeError('Query interrupted') in place of the KeyboardInterrupt that the handler raised (as
#: seen with `kill` during `dpsql budget`); here the statement's interruption is played by the hook
IN_DUCKDB = """
import os, signal, sys
from dpsql.ledger import _store
from dpsql.cli import main

sig = getattr(signal, sys.argv[1])

def statement(path):
    _store._HOOKS.pop("after_attach")
    try:
        os.kill(os.getpid(), sig)
        for _ in range(1000):
            pass
    except KeyboardInterrupt:
        raise RuntimeError("Query interrupted") from None

_store._HOOKS["after_attach"] = statement
sys.exit(main(sys.argv[2:]))
"""

#: the signal arrives while Python runs code compiled from a string (dataclasses and namedtuple
#: build their methods so, e.g. during a lazy import); the command is started as `python -m`
FROM_STRING = """
import sys
from dpsql import cli

def budget(args):
    exec("import os, signal; os.kill(os.getpid(), signal.{sig}); x = [i for i in range(1000)]")
    return 0

cli._cmd_budget = budget
sys.exit(cli.main(sys.argv[1:]))
"""


def _init(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "dpsql.cli", "init", "--epsilon", "1", "--ledger", "l.duckdb"],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_during_a_ledger_statement_exits_as_a_signal(tmp_path: Path, sig: str) -> None:
    """It was 'error: unexpected RuntimeError' (exit 1): DuckDB turns the interrupt into a
    RuntimeError, which the command treated as a failure of its own."""
    _init(tmp_path)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(IN_DUCKDB), sig, "budget", "--ledger", "l.duckdb"],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 128 + getattr(signal, sig), p.stderr
    assert "nothing was charged by this command" in p.stderr and "unexpected" not in p.stderr, p.stderr  # (budget)
    b = subprocess.run([sys.executable, "-m", "dpsql.cli", "budget", "--ledger", "l.duckdb", "--format", "json"],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60)
    assert b.returncode == 0 and json.loads(b.stdout)["remaining"]["epsilon"] == 1.0, b.stderr  # the ledger is whole


def test_a_hang_up_the_job_ignores_is_still_ignored(tmp_path: Path) -> None:
    """Under nohup (SIGHUP ignored) the command runs on; with SIGHUP at its default (a closed ssh session) it was
    killed outright, its entry left reserved with no line on stderr: it now exits 129 as for SIGTERM (above)."""
    _init(tmp_path)
    ignored = "import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" + textwrap.dedent(IN_DUCKDB)
    p = subprocess.run([sys.executable, "-c", ignored, "SIGHUP", "budget", "--ledger", "l.duckdb"],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "remaining" in p.stdout.lower() and "hung up" not in p.stderr, (p.stdout, p.stderr)


def test_sigterm_inside_code_run_from_a_string_exits_143_under_python_m(tmp_path: Path) -> None:
    """It died by SIGINT (exit status -2; 130 in a shell) after printing 'terminated (SIGTERM)':
    a KeyboardInterrupt raised inside exec(string) marks the interpreter as interrupted by Ctrl-C,
    and `python -m` then ends the process with SIGINT whatever main() returned."""
    mod = tmp_path / "dpsql_signal_probe.py"
    mod.write_text(FROM_STRING.replace("{sig}", "SIGTERM"))
    p = subprocess.run([sys.executable, "-m", "dpsql_signal_probe", "budget", "--ledger", "l.duckdb"],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 143, (p.returncode, p.stderr)
    assert "terminated (SIGTERM): nothing was charged by this command" in p.stderr, p.stderr  # (budget never charges)
