"""An output column's name is printed unambiguously everywhere: the summary on stderr shows a name that could be
misread (a line break or another unprintable character, edge spaces, a ':' or a '"') as a JSON string literal, as the
table's header does, and the CSV and JSON headers read back to the exact names.

``SELECT COUNT(*) AS "a\\nb"`` printed its accuracy line on two lines of stderr (``  a`` and ``b: noise std ...``),
an escape character reached the terminal raw, and ``AS "c: d"`` read as column ``c``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

from dpsql.release import Plan, name_text

NAMES = {  # name: as the summary prints it
    "a\nb": '"a\\nb"', "c: d": '"c: d"', " e": '" e"', 'q"t\tu': '"q\\"t\\tu"', "f\x1bg": '"f\\u001bg"',
    "x,y": "x,y", "é": "é", "n": "n", "COUNT(*)": "COUNT(*)",
}


def test_name_text() -> None:
    assert {n: name_text(n) for n in NAMES} == NAMES


@pytest.fixture
def flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": list(range(100)), "x": [float(i % 10) for i in range(100)]}), "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "10", "--delta", "1e-3"]) == 0
    return ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "--bounds", "t.x=0:10"]


def _sql(names: list[str]) -> str:
    return "SELECT " + ", ".join(f'COUNT(*) AS "{n.replace(chr(34), chr(34) * 2)}"' for n in names) + " FROM t"


@pytest.mark.parametrize("fmt", ["csv", "json", "table"])
def test_every_printed_name_reads_back(flags: list[str], capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    names = [n for n in NAMES if n != "COUNT(*)"]
    capsys.readouterr()
    assert run([*flags, "query", _sql(names), "--epsilon", "1", "--delta", "1e-6", "--format", fmt]) == 0
    out, err = capsys.readouterr()
    summary = [line for line in err.splitlines() if "noise std" in line]
    assert summary == [f"  {NAMES[n]}: noise std {line.split('noise std ')[1]}" for n, line in zip(names, summary)]
    if fmt == "csv":
        assert next(csv.reader(io.StringIO(out, newline=""))) == names
        assert pacsv.read_csv(io.BytesIO(out.encode())).column_names == names
    elif fmt == "json":
        assert list(json.loads(out)["rows"][0]) == names
    else:
        cells = [c.strip(" ") for c in out.splitlines()[0].split(" | ")]  # a quoted cell is a JSON string literal
        assert [json.loads(c) if c.startswith('"') else c for c in cells] == names


def test_explain_names_the_column_unambiguously() -> None:
    plan = Plan(sql="", mechanism="laplace", reason="", cost=__import__("dpsql").Budget(1.0, 0.0), bounded_sql="",
                parameters={"expected_accuracy": {"a\nb": {"noise_std": 1.0, "ci95_half_width": 2.0}, "n": {"note": "x"}}})
    lines = str(plan).splitlines()
    assert 'expected accuracy of "a\\nb": noise std 1, 95% interval +/- 2' in lines
    assert "expected accuracy of n: x" in lines


def test_warnings_and_notes_that_quote_a_name_stay_on_one_line(flags: list[str], capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A warning quotes the SQL of its aggregate (``MIN("a<line break>b") came out above ...``): it printed over two
    lines of stderr, the second read as a line of its own. Each summary line now escapes what is unprintable."""
    import dpsql
    from dpsql.release import Release

    real = dpsql.Session.query

    def query(self: Any, *a: Any, **k: Any) -> Release:
        rel = real(self, *a, **k)
        rel.warnings = ['MIN("a\nb") came out above MAX("a\nb"): \x1b[2J']
        rel.accuracy = {"a\nb": {"note": "note\nwith a break"}}
        return rel

    monkeypatch.setattr(dpsql.Session, "query", query)
    capsys.readouterr()
    assert run([*flags, "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert 'warning: MIN("a\\nb") came out above MAX("a\\nb"): \\u001b[2J' in err
    assert '  "a\\nb": note\\nwith a break' in err
    assert not any("\x1b" in line for line in err)


def test_tables_and_describe_print_each_column_on_one_unambiguous_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``dpsql tables`` / ``describe`` printed a column named ``a<line break>b`` over two lines (``  a`` and
    ``b DOUBLE: bounds ...``), and ``describe``'s ``  c d DOUBLE`` did not say where the name ends."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": [1, 2], "a\nb": [1.0, 2.0], "c d": [1.0, 2.0], "e": [1.0, 2.0]}), "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "10", "--delta", "1e-3"]) == 0
    flags = ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid",
             "--bounds", "t.a\nb=0:10", "--bounds", "t.c d=0:10", "--bounds", "t.e=0:10"]
    capsys.readouterr()
    assert run([*flags, "tables"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": bounds")[0] for line in lines[1:]] == ['  "a\\nb"', "  c d", "  e"], lines
    assert run([*flags, "describe", "t"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == ["  uid BIGINT", '  "a\\nb" DOUBLE: bounds [0.0, 10.0]', '  "c d" DOUBLE: bounds [0.0, 10.0]',
                         "  e DOUBLE: bounds [0.0, 10.0]"], lines
