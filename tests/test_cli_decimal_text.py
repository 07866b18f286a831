"""A released DECIMAL is written in fixed-point notation with its scale in every text format, as DuckDB
spells it (``CAST(x AS VARCHAR)``).

Python's and Arrow's decimal text switch to scientific notation for small values: a DECIMAL(38, 10) key
0 was written ``0E-10`` and -0.0000000001 ``-1E-10`` in the CSV, JSON and table outputs, while 2.5 was
``2.5000000000`` in the same column, so a loader reading the column as fixed-point text (or comparing
keys as text) met two notations. (The CSV writes every DECIMAL as a bare number in fixed point.)"""

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
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "100", "--delta", "0.1"]) == 0
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
    if fmt == "csv":
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


@pytest.mark.parametrize("sql", [
    "SELECT e, COUNT(*) AS n FROM t GROUP BY e",  # DECIMAL(18, 1)
    "SELECT uid % 3 + 1 AS k, COUNT(*) AS n FROM t GROUP BY uid % 3 + 1",  # a HUGEINT key: decimal128(38, 0)
], ids=["decimal_18_1", "hugeint"])
def test_a_decimal_arrow_writes_in_fixed_point_stays_a_bare_number_in_the_csv(data: Path, capsys: pytest.CaptureFixture[str],
                                                                            sql: str) -> None:
    """A DECIMAL whose scale is at most 6 (an integer key computed in HUGEINT, a DECIMAL(18, 1)) was always written
    in fixed point, unquoted, as the other numbers: a loader cutting fields or comparing them as text still reads
    ``1,100``, not ``"1",100``."""
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "--domain", "t.e=-1.5,0",
                "query", sql, "--epsilon", "1", "--delta", "1e-6", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 3 and not any(line.startswith('"') for line in lines[1:]), lines
