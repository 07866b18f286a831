"""The owner's public table-size declaration (``max_table_rows``): API, config and CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.errors import ConfigError
from tests.conftest import run_cli


def test_register_stores_the_declared_size_and_describes_it() -> None:
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6))
    try:
        s.register("t", pa.table({"u": [1, 2]}), privacy_unit="u", max_table_rows=1_000)
        assert s.tables["t"].max_table_rows == 1_000
        assert s.tables["t"].public_description()["max_table_rows"] == 1_000
        s.register("p", pa.table({"k": [1]}), public=True)
        assert s.tables["p"].max_table_rows is None
    finally:
        s.close()


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "100"])
def test_register_refuses_a_size_that_is_not_a_positive_whole_number(bad: Any) -> None:
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6))
    try:
        with pytest.raises(ConfigError, match="max_table_rows for table 't' must be a whole number >= 1"):
            s.register("t", pa.table({"u": [1, 2]}), privacy_unit="u", max_table_rows=bad)
        assert "t" not in s.tables
    finally:
        s.close()


def test_config_key_reaches_the_catalog(tmp_path: Path) -> None:
    pq.write_table(pa.table({"u": [1, 2, 3]}), tmp_path / "t.parquet")
    (tmp_path / "dpsql.toml").write_text(
        '[ledger]\npath = ":memory:"\nepsilon = 1.0\n[tables.t]\nsource = "t.parquet"\nprivacy_unit = "u"\nmax_table_rows = 50\n')
    s = dpsql.Session.from_config(str(tmp_path / "dpsql.toml"))
    try:
        assert s.tables["t"].max_table_rows == 50
    finally:
        s.close()


def test_cli_flag_declares_the_size_and_names_itself_when_malformed(tmp_path: Path, capsys: Any) -> None:
    pq.write_table(pa.table({"u": [1, 2, 3]}), tmp_path / "t.parquet")
    ledger = str(tmp_path / "l.duckdb")
    assert run_cli(["--ledger", ledger, "init", "--epsilon", "1"]) == 0
    base = ["--table", f"t={tmp_path / 't.parquet'}", "--privacy-unit", "t=u", "--ledger", ledger]
    capsys.readouterr()
    assert run_cli([*base, "--max-table-rows", "t=1000", "describe", "t"]) == 0
    assert "at most 1000 rows" in capsys.readouterr().out
    assert run_cli([*base, "--max-table-rows", "t=1_000", "describe", "t"]) == 2  # not plain notation
    assert "'1_000' is not a plain number" in capsys.readouterr().err
    assert run_cli([*base, "--max-table-rows", "t=many", "describe", "t"]) != 0
    assert "--max-table-rows t=many is refused: 'many' is not a number" in capsys.readouterr().err
    assert run_cli([*base, "--max-table-rows", "other=5", "describe", "t"]) != 0
    assert "no --table other" in capsys.readouterr().err
