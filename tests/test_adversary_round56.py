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
