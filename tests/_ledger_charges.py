"""How many entries a command-line test's ledger holds (``dpsql budget --history``): a refusal charges none."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli as run


def charges(capsys: pytest.CaptureFixture[str], ledger: str = "l.duckdb") -> int:
    """The number of entries of ``ledger`` (its history), read through the command line; what ``capsys`` captured
    before is dropped."""
    capsys.readouterr()
    assert run(["--ledger", ledger, "budget", "--history", "--format", "json"]) == 0
    return len(json.loads(capsys.readouterr().out)["entries"])
