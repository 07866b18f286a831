"""Regression: with the data owner's configuration (one that registers tables: its tables, policy
and ledger are the owner's, and the flags that would replace them are refused), anyone who could
run the command line could also run ``dpsql --config owner.toml budget --set-total 1000 0`` and
keep querying: a ledger whose config declares no total went from epsilon 1 to 1000 (the budget
refusal's hint names the command). With such a config the total may now only be set to the total
its ``[ledger]`` section declares: the owner writes the new total there first (a file the analyst
cannot write), then records it in the ledger with ``--set-total``."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from dpsql.budget import Budget
from dpsql.ledger import Ledger

OWNER = """
[ledger]
path = "ledger.duckdb"
{total}

[tables.events]
source = "events.parquet"
privacy_unit = "user_id"
"""


def _setup(workdir: Path, total: str) -> list[str]:
    (workdir / "events.parquet").write_bytes((workdir / "examples" / "events.parquet").read_bytes())
    (workdir / "owner.toml").write_text(OWNER.format(total=total))
    Ledger.create(workdir / "ledger.duckdb", Budget(1.0)).close()
    return ["--config", "owner.toml"]


def test_owner_config_without_a_total_refuses_set_total(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _setup(workdir, "")
    assert run_cli([*cfg, "budget", "--set-total", "1000", "0", "--reason", "more"]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and "[ledger]" in err
    assert Ledger.open(workdir / "ledger.duckdb").total() == Budget(1.0)
    assert run_cli([*cfg, "query", "SELECT COUNT(*) FROM events", "--epsilon", "1"]) == 0
    assert run_cli([*cfg, "query", "SELECT COUNT(*) FROM events", "--epsilon", "1"]) == 3  # the budget holds


def test_owner_config_sets_only_the_total_it_declares(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _setup(workdir, "epsilon = 2.0")
    assert run_cli([*cfg, "budget", "--set-total", "1000", "0", "--reason", "more"]) == 2
    assert "epsilon = 2.0" in capsys.readouterr().err
    assert Ledger.open(workdir / "ledger.duckdb").total() == Budget(1.0)
    # control: the owner declared 2.0 in the config, and records it in the ledger
    assert run_cli([*cfg, "budget", "--set-total", "2", "0", "--reason", "new quarter"]) == 0
    assert Ledger.open(workdir / "ledger.duckdb").total() == Budget(2.0)


def test_without_an_owner_config_set_total_works_as_before(workdir: Path) -> None:
    Ledger.create(workdir / "mine.duckdb", Budget(1.0)).close()
    assert run_cli(["--ledger", "mine.duckdb", "budget", "--set-total", "5", "0", "--reason", "mine"]) == 0
    assert Ledger.open(workdir / "mine.duckdb").total() == Budget(5.0)


def test_owner_config_without_a_total_cannot_create_the_ledger(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same for `init`: through an owner config that declares no total, whoever runs the command
    line first (before the owner, or after the ledger was removed) chose the total."""
    (workdir / "events.parquet").write_bytes((workdir / "examples" / "events.parquet").read_bytes())
    (workdir / "owner.toml").write_text(OWNER.format(total=""))
    assert run_cli(["--config", "owner.toml", "init", "--epsilon", "1000"]) == 2
    assert "[ledger]" in capsys.readouterr().err and not (workdir / "ledger.duckdb").exists()
    (workdir / "owner.toml").write_text(OWNER.format(total="epsilon = 1.0"))  # control: the owner declares it
    assert run_cli(["--config", "owner.toml", "init", "--epsilon", "1"]) == 0
    assert Ledger.open(workdir / "ledger.duckdb").total() == Budget(1.0)
