"""A DATE or TIMESTAMP column's grid from the command line: ``--bins NAME.COL=2024-01-01:2024-12-31:365`` (ISO
dates have no ':'), as ``bounds = ["2024-01-01", "2024-12-31"]`` with ``bins = 365`` in the config. Before, ``--bins``
read only numbers, so MIN/MAX/quantiles and range counts over a date column of a ``--table`` could not be
asked at all, and the refusal's hint was Python (``columns={'d': {'bounds': [...], 'bin_width': '1 day'}}``)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

D = [datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(100)]


@pytest.fixture
def flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": list(range(100)), "d": D,
                             "ts": [datetime.datetime(2024, 1, 1) + datetime.timedelta(hours=i) for i in range(100)]}),
                   "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "10"]) == 0
    return ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid"]


def test_the_refusal_names_the_flag(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run([*flags, "query", "SELECT MIN(d) AS m FROM t", "--epsilon", "1"]) == 2
    hint = capsys.readouterr().err.split("hint:", 1)[1]
    assert "--bins TABLE.d=2019-01-01:2021-01-01:" in hint and "columns={" not in hint, hint


@pytest.mark.parametrize("col", ["d", "ts"])
def test_date_bins_from_the_flag(flags: list[str], capsys: pytest.CaptureFixture[str], col: str) -> None:
    capsys.readouterr()
    assert run([*flags, "--bins", f"t.{col}=2024-01-01:2024-12-31:365", "query", f"SELECT MIN({col}) AS m FROM t",
                "--epsilon", "1", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["m"].startswith("2024-") and doc["meta"]["mechanism"] == "exponential"
    assert run([*flags, "--bins", f"t.{col}=2024-01-01:2024-12-31:365", "describe", "t", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["t"]["columns"][col]["ordered"]["bins"] == 365


@pytest.mark.parametrize("item", ["d=2024-12-31:2024-01-01:365", "d=2024-01-01:5:10", "d=2024-01-01:2024-12-31:0",
                                  "uid=2024-01-01:2024-12-31:3"])
def test_bad_date_bins_are_refused_before_the_charge(flags: list[str], capsys: pytest.CaptureFixture[str],
                                                     item: str) -> None:
    """Also a date grid on a BIGINT column (once kept, and then MIN(uid) said the column declared no bounds)."""
    capsys.readouterr()
    col = item.partition("=")[0]
    assert run([*flags, "--bins", f"t.{item}", "query", f"SELECT MIN({col}) FROM t", "--epsilon", "1"]) == 2
    err = capsys.readouterr().err
    assert "--bins" in err or "a date grid for 't.uid' needs a DATE or TIMESTAMP column, but it is BIGINT" in err, err
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0


@pytest.mark.parametrize("item", ["d=2024-13-01:2024-12-31:5", "d=2024-01-01:2024-02-30:5"])
def test_a_grid_end_that_is_no_date_is_named(flags: list[str], capsys: pytest.CaptureFixture[str], item: str) -> None:
    """'2024-13-01' is named as no date (it was refused as 'LO must be below HI', texts compared as dates)."""
    capsys.readouterr()
    assert run([*flags, "--bins", f"t.{item}", "query", "SELECT MIN(d) FROM t", "--epsilon", "1"]) == 2
    err = capsys.readouterr().err
    assert "is not a date" in err and "below HI" not in err, err


def test_a_numeric_grid_on_a_date_column_is_refused_before_the_charge(flags: list[str],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run([*flags, "--bins", "t.d=0:100:5", "query", "SELECT d, COUNT(*) AS n FROM t GROUP BY d", "--epsilon", "1"]) == 2
    assert "a numeric grid for 't.d' needs a numeric column, but it is DATE" in capsys.readouterr().err
