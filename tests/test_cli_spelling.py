"""How released values are spelled by each output format: a SQL NULL and a text that reads 'NULL'
(or is empty, or holds a line break or a '|') never print alike, in table, CSV or JSON output."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

NAMES = ["NULL", None, "", " a", "a|b", "x\ny", "null", '"q"', "plain", "Zürich", "rtl\u202e"]


def _table(text: str) -> list[list[str]]:
    lines = text.rstrip("\n").split("\n")
    return [[c.strip(" ") for c in line.split(" | ")] for line in lines[2:]]


def test_table_cells_never_confuse_null_with_text() -> None:
    from dpsql.cli import _format_table

    out = _format_table(pa.table({"name": NAMES, "n": list(range(len(NAMES)))}))
    rows = _table(out)
    assert len(rows) == len(NAMES)  # a line break in a value does not split its row
    cells = {int(n): name for name, n in rows}
    assert cells[1] == "NULL"  # SQL NULL: the bare word
    assert len(set(cells.values())) == len(NAMES)  # every value prints differently
    for i, v in enumerate(NAMES):
        if v is None:
            continue
        shown = cells[i]
        assert (json.loads(shown) if shown.startswith('"') else shown) == v  # quoted text reads back exactly
    assert cells[8] == "plain" and cells[9] == "Zürich"  # ordinary text is shown as it is
    assert "\u202e" not in out  # an unprintable character is escaped


def test_numbers_and_null_numbers_in_table_cells() -> None:
    from dpsql.cli import _format_table

    rows = _table(_format_table(pa.table({"k": ["a", "b"], "v": pa.array([1.5, None], pa.float64())})))
    assert rows == [["a", "1.5"], ["b", "NULL"]]


@pytest.fixture
def names_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    n = 1800  # 300 people per name: every group is far above the release threshold
    pick = ["NULL", None, "", " a", "a|b", "x\ny"]
    pq.write_table(pa.table({"user_id": list(range(n)), "name": [pick[i % 6] for i in range(n)]}), "n.parquet")
    assert run(["init", "--epsilon", "100", "--delta", "1e-3", "--ledger", "l.duckdb"]) == 0
    return ["--table", "n=n.parquet", "--privacy-unit", "n=user_id", "--ledger", "l.duckdb", "query",
            "SELECT name, COUNT(*) AS c FROM n GROUP BY name", "--epsilon", "5", "--delta", "1e-6"]


def test_null_and_null_text_in_every_format(names_cli: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(names_cli) == 0
    names = {r[0] for r in _table(capsys.readouterr().out)}
    assert names == {"NULL", '"NULL"', '""', '" a"', '"a|b"', '"x\\ny"'}
    assert run([*names_cli, "--format", "csv"]) == 0
    text = capsys.readouterr().out
    assert '\n,' in text and '\n"NULL",' in text and '\n"",' in text  # NULL: an empty unquoted field
    assert run([*names_cli, "--format", "json"]) == 0
    got = [r["name"] for r in json.loads(capsys.readouterr().out)["rows"]]
    assert sorted(got, key=repr) == sorted(["NULL", None, "", " a", "a|b", "x\ny"], key=repr)
    rows = list(csv.reader(io.StringIO(text)))[1:]
    assert sorted(r[0] for r in rows) == sorted(["NULL", "", "", " a", "a|b", "x\ny"])


def test_json_rows_tell_null_from_nan_and_infinities(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """JSON printed NULL, NaN, +inf and -inf all as null; null is now only SQL NULL."""
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"user_id": list(range(50))}), "t.parquet")
    assert run(["init", "--epsilon", "10", "--ledger", "l.duckdb"]) == 0
    sql = ("SELECT ln(COUNT(*) - 1000000) AS nan_, exp(COUNT(*) + 1000) AS pinf, -exp(COUNT(*) + 1000) AS minf, "
           "NULLIF(COUNT(*), COUNT(*)) AS nul, COUNT(*) - COUNT(*) AS zero FROM t")
    capsys.readouterr()
    assert run(["--table", "t=t.parquet", "--privacy-unit", "t=user_id", "--ledger", "l.duckdb", "query", sql,
                "--epsilon", "1", "--format", "json"]) == 0
    text = capsys.readouterr().out
    row = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} is not JSON"))["rows"][0]
    assert row == {"nan_": "NaN", "pinf": "Infinity", "minf": "-Infinity", "nul": None, "zero": 0}
