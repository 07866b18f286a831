"""An empty file name given to -o, --meta or -f (an unset shell variable: ``-o "$OUT"``) is refused before
anything is charged, naming the flag, as ``--ledger ''`` is.

Before, ``-o ''`` wrote the rows to standard output (into the job's log) and ``--meta ''`` wrote no meta
at all: the query was charged, the exit code was 0, and the file the script went on to read was never
written. ``-f ''`` was reported as "no SQL given", as if the flag had been left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli as run

CFG = ["--config", "examples/dpsql.toml"]
Q = ["query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1"]


def _entries(capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    assert run([*CFG, "budget", "--history", "--format", "json"]) == 0
    return len(json.loads(capsys.readouterr().out)["entries"])


@pytest.mark.parametrize("argv", [[*Q, "-o", ""], [*Q, "--meta", ""], [*Q, "-o", "", "--format", "csv"],
                                  [*Q, "-o", "out.csv", "--meta", ""], ["query", "-f", "", "--epsilon", "0.1"],
                                  ["explain", "-f", "", "--epsilon", "0.1"]])
def test_an_empty_file_name_is_refused_before_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                          argv: list[str]) -> None:
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, *argv]) == 2
    out, err = capsys.readouterr()
    flag = argv[argv.index("") - 1]
    assert f"error: ConfigError: {flag} is empty" in err and "hint:" in err and flag in err.split("hint:", 1)[1]
    assert out == ""  # no rows among the job's log
    assert _entries(capsys) == 0
    assert not Path("out.csv").exists()


def test_the_same_flags_with_names_are_answered(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: the same commands with file names (and '-' for standard output) run and charge."""
    Path("q.sql").write_text("SELECT COUNT(*) AS n FROM events\n")
    assert run([*CFG, *Q, "-o", "out.csv", "--meta", "meta.json"]) == 0
    assert Path("out.csv").read_text().startswith('"n"') and json.loads(Path("meta.json").read_text())["ledger_id"] == 1
    assert run([*CFG, *Q, "-o", "-"]) == 0
    assert run([*CFG, "query", "-f", "q.sql", "--epsilon", "0.1"]) == 0
    assert _entries(capsys) == 3
