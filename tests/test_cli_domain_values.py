"""``--domain TABLE.COL=A,B,C`` declares each value as the column's type reads it, as typed.

The values were read as numbers wherever they looked like one, before the column's type was known: a
VARCHAR column of codes (`--domain t.zip=01234,02000,10`) was refused with "domain value 1234 ... is not
a VARCHAR value" (a value the user never typed; no spelling of the flag could declare it), and a
BOOLEAN column could not be given a domain at all ("'true' is not a BOOLEAN value"). Each value is now
read by the column's type: text as typed, numbers and true/false where the column holds them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

import dpsql
from dpsql.errors import ConfigError

N = 300


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({
        "uid": list(range(N)),
        "zip": [["01234", "02000", "10"][i % 3] for i in range(N)],
        "k": pa.array([[7, 8, 9][i % 3] for i in range(N)], pa.int32()),
        "flag": [i % 2 == 0 for i in range(N)],
        "x": [[0.5, 1e5, -2.0][i % 3] for i in range(N)],
    }), "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "100"]) == 0
    return tmp_path


def _query(capsys: pytest.CaptureFixture[str], column: str, values: str) -> tuple[int, list[dict[str, object]], str]:
    capsys.readouterr()
    code = run(["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "--domain", f"t.{column}={values}",
                "query", f"SELECT {column}, COUNT(*) AS n FROM t GROUP BY {column} ORDER BY {column}", "--epsilon", "1",
                "--format", "json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out)["rows"] if code == 0 else []), err


@pytest.mark.parametrize(("column", "values", "keys"), [
    ("zip", "01234,02000,10", ["01234", "02000", "10"]),
    ("zip", "1e5,-0,+1", ["+1", "-0", "1e5"]),
    ("k", "7,8,9", [7, 8, 9]),
    ("k", "7.0,+8,9", [7, 8, 9]),
    ("flag", "true,false", [False, True]),
    ("flag", "TRUE,False", [False, True]),
    ("x", "0.5,1e5,-2", [-2.0, 0.5, 1e5]),
])
def test_domain_values_are_read_as_the_columns_type(data: Path, capsys: pytest.CaptureFixture[str], column: str, values: str,
                                                     keys: list[object]) -> None:
    code, rows, err = _query(capsys, column, values)
    assert code == 0, err
    assert [r[column] for r in rows] == keys


@pytest.mark.parametrize(("column", "values", "bad"), [
    ("k", "7,eight", "'eight'"), ("k", "7,1_0", "'1_0'"), ("flag", "true,yes", "'yes'"), ("x", "0.5,inf", "'inf'"),
    ("k", "7,7.0", "equal"),
])
def test_values_the_column_cannot_hold_are_refused_as_typed(data: Path, capsys: pytest.CaptureFixture[str], column: str,
                                                            values: str, bad: str) -> None:
    """Negative control: what the column's type does not read is still refused, quoting the value as typed."""
    code, _rows, err = _query(capsys, column, values)
    assert code == 2 and bad in err and "hint:" in err
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--history", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == []


def test_the_python_api_keeps_its_typed_domains(tmp_path: Path) -> None:
    """The library reads text for a numeric or BOOLEAN domain as the command line does (as it reads
    bounds=["0", "100"]), in plain notation only."""
    tbl = pa.table({"uid": list(range(N)), "k": pa.array([[7, 8, 9][i % 3] for i in range(N)], pa.int32()),
                    "flag": [i % 2 == 0 for i in range(N)]})
    with dpsql.Session(budget=dpsql.Budget(10, 0)) as s:
        s.register("t", tbl, privacy_unit="uid", columns={"k": {"domain": ["7", 8, "9"]}, "flag": {"domain": ["true", False]}})
        assert s.tables["t"].columns["k"].domain == (7, 8, 9)
        assert s.tables["t"].columns["flag"].domain == (True, False)
        with pytest.raises(ConfigError, match="0x10"):
            s.register("u", tbl, privacy_unit="uid", columns={"k": {"domain": ["0x10"]}})
