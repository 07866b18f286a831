"""A released DECIMAL is written in fixed-point notation with its scale in every text format, as DuckDB
spells it (``CAST(x AS VARCHAR)``).

Python's and Arrow's decimal text switch to scientific notation for small values: a DECIMAL(38, 10) key
0 was written ``0E-10`` and -0.0000000001 ``-1E-10`` in the CSV, JSON and table outputs, while 2.5 was
``2.5000000000`` in the same column, so a loader reading the column as fixed-point text (or comparing
keys as text) met two notations. (The CSV writes the column as quoted text: Arrow's CSV writer has no
fixed-point form for a decimal.)"""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

KEYS = [Decimal("0"), Decimal("-0.0000000001"), Decimal("2.5"), Decimal("0.0000001"), Decimal("-123456789012345678.0000000001")]
N = 300


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": list(range(N)), "d": pa.array([KEYS[i % len(KEYS)] for i in range(N)], pa.decimal128(38, 10)),
                             "e": pa.array([Decimal("-1.5"), Decimal("0")][i % 2] for i in range(N)), }), "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "100"]) == 0
    return tmp_path


def _spelled(column: str, typ: str, values: list[Decimal]) -> set[str]:
    """DuckDB's text of each value as a ``typ``."""
    rows = ", ".join(f"('{v}')" for v in values)
    return {r[0] for r in duckdb.sql(f"SELECT CAST(CAST(v AS {typ}) AS VARCHAR) FROM (VALUES {rows}) t(v)").fetchall()}


def _rows(capsys: pytest.CaptureFixture[str], column: str, fmt: str) -> list[str]:
    capsys.readouterr()
    domain = ",".join(str(k) for k in (KEYS if column == "d" else [Decimal("-1.5"), Decimal("0")]))
    assert run(["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "--domain", f"t.{column}={domain}",
                "query", f"SELECT {column}, COUNT(*) AS n FROM t GROUP BY {column}", "--epsilon", "1", "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        return [r[column] for r in json.loads(out)["rows"]]
    if fmt == "csv":  # the decimal column is written as text, quoted like every text column
        return [r[column] for r in csv.DictReader(io.StringIO(out))]
    return [line.split("|")[0].strip() for line in out.splitlines()[2:]]


@pytest.mark.parametrize("fmt", ["csv", "json", "table"])
def test_a_decimal_key_is_written_in_fixed_point(data: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    got = _rows(capsys, "d", fmt)
    assert set(got) == _spelled("d", "DECIMAL(38, 10)", KEYS)
    assert "0.0000000000" in got and "-0.0000000001" in got and not any("E" in v for v in got)


@pytest.mark.parametrize("fmt", ["csv", "json", "table"])
def test_a_decimal_written_plainly_before_is_unchanged(data: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    """Negative control: DECIMAL(18, 1) values, which were already spelled in fixed point."""
    assert set(_rows(capsys, "e", fmt)) == {"-1.5", "0.0"} == _spelled("e", "DECIMAL(18, 1)", [Decimal("-1.5"), Decimal("0")])
