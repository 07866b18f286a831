"""Every refusal of a config file names it as the command line gave it.

A relative ``--config c.toml`` was named ``'c.toml'`` by the refusals of reading it (an unknown key, TOML syntax) and
by its absolute path by those raised when its tables were registered (``config file '/abs/dir/c.toml',
tables.t.source: ...``) or its in-memory ledger refused: one file, two names in one job's log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli as run


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    (tmp_path / "cfg").mkdir()
    return tmp_path


LEDGER = '[ledger]\npath = "l.duckdb"\nepsilon = 1\ndelta = 1e-6\ncreate_if_missing = true\n'


@pytest.mark.parametrize("given", ["cfg/c.toml", "./cfg/../cfg/c.toml"])
def test_a_tables_refusal_names_the_config_as_given(here: Path, given: str, capsys: pytest.CaptureFixture[str]) -> None:
    (here / "cfg" / "c.toml").write_text(LEDGER + '[tables.t]\nsource = "nope.parquet"\nprivacy_unit = "u"\n')
    assert run(["--config", given, "query", "--epsilon", "1", "SELECT COUNT(*) FROM t"]) != 0
    err = capsys.readouterr().err
    assert f"config file {given!r}, tables.t.source" in err, err
    assert str(here) + "/cfg/c.toml" not in err


def test_a_read_refusal_names_it_so_too(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: the refusals of reading the file named it as given already."""
    (here / "cfg" / "c.toml").write_text(LEDGER + "bogus = 1\n")
    assert run(["--config", "cfg/c.toml", "query", "--epsilon", "1", "SELECT 1"]) != 0
    assert "config file 'cfg/c.toml': unknown keys ['bogus']" in capsys.readouterr().err


def test_an_in_memory_ledger_refusal_names_it_as_given(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (here / "cfg" / "c.toml").write_text('[ledger]\npath = ":memory:"\nepsilon = 1\n')
    assert run(["--config", "cfg/c.toml", "query", "--epsilon", "1", "SELECT 1"]) != 0
    err = capsys.readouterr().err
    assert "config file 'cfg/c.toml' keeps its ledger in memory" in err, err
