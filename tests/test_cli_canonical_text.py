"""Every text format of the command line (csv, json, table) spells a released value of each type the same way,
in a form ETL loaders parse: a TIMESTAMP is ISO 8601 with a 'T' and the fraction digits of its unit
(``2024-01-02T00:00:00.000000``), a NaN or infinite double is ``NaN``/``Infinity``/``-Infinity``.

The CSV wrote ``2024-01-02 00:00:00.000000`` where JSON wrote ``2024-01-02T00:00:00`` and the table
``2024-01-02 00:00:00``; the CSV wrote ``nan``/``inf``, which Java and Spark loaders do not read as numbers,
where JSON wrote ``"NaN"``/``"Infinity"``."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

from dpsql.budget import Budget
from dpsql.cli import _render_rows
from dpsql.release import Release

US = 1_704_112_215_123_456  # 2024-01-01 12:30:15.123456 UTC, in microseconds
DAY = 1_704_153_600_000_000  # 2024-01-02 00:00:00
CASES = {  # column: (Arrow array, the canonical text of each value)
    "ts_us": (pa.array([US, DAY, None], pa.int64()).cast(pa.timestamp("us")),
              ["2024-01-01T12:30:15.123456", "2024-01-02T00:00:00.000000", None]),
    "ts_s": (pa.array([US // 10**6, DAY // 10**6, None], pa.int64()).cast(pa.timestamp("s")),
             ["2024-01-01T12:30:15", "2024-01-02T00:00:00", None]),
    "ts_ms": (pa.array([US // 1000, DAY // 1000, None], pa.int64()).cast(pa.timestamp("ms")),
              ["2024-01-01T12:30:15.123", "2024-01-02T00:00:00.000", None]),
    "ts_ns": (pa.array([US * 1000 + 7, DAY * 1000, None], pa.int64()).cast(pa.timestamp("ns")),
              ["2024-01-01T12:30:15.123456007", "2024-01-02T00:00:00.000000000", None]),
    "tstz": (pa.array([US, DAY, None], pa.int64()).cast(pa.timestamp("us", tz="Europe/Paris")),
             ["2024-01-01T12:30:15.123456Z", "2024-01-02T00:00:00.000000Z", None]),
    "ts_far": (pa.array([2**62, -(2**62), None], pa.int64()).cast(pa.timestamp("us")),
               ["148108-07-06T14:00:27.387904", "-144169-06-28T09:59:32.612096", None]),
    "d": (pa.array([dt.date(2024, 1, 2), dt.date(1, 1, 1), None]), ["2024-01-02", "0001-01-01", None]),
    "d_far": (pa.array([20_000_000, 0, None], pa.int32()).cast(pa.date32()), ["56728-02-22", "1970-01-01", None]),
    "tm": (pa.array([dt.time(12, 30, 15, 123456), dt.time(0, 0), None]), ["12:30:15.123456", "00:00:00.000000", None]),
    "f": (pa.array([float("nan"), float("-inf"), float("inf")]), ["NaN", "-Infinity", "Infinity"]),
    "big": (pa.array([1.7976931348623157e308, 5e-324, 0.1 + 0.2]), ["1.7976931348623157e+308", "5e-324", "0.30000000000000004"]),
    "dec": (pa.array([Decimal("0"), Decimal("-0.0000000001"), None], pa.decimal128(38, 10)),
            ["0.0000000000", "-0.0000000001", None]),
    "b": (pa.array([True, False, None]), ["true", "false", None]),
}


def _release(columns: list[str]) -> Release:
    table = pa.table({c: CASES[c][0] for c in columns})
    return Release(table=table, cost=Budget(1.0, 0.0), mechanism="laplace", accuracy={}, ledger_id=1)


def _texts(rel: Release, fmt: str) -> dict[str, list[str | None]]:
    out = _render_rows(rel, fmt, None).decode()
    names = rel.table.column_names
    if fmt == "json":
        rows = json.loads(out)["rows"]
        return {c: [None if r[c] is None else r[c] if isinstance(r[c], str) else json.dumps(r[c]) for r in rows] for c in names}
    if fmt == "csv":
        lines = out.splitlines()
        rows = list(csv.reader(io.StringIO(out, newline="")))[1:]
        assert all('"' not in line for line in lines[1:] if line != '""')  # no value of these types is quoted
        return {c: [r[i] or None for r in rows] for i, c in enumerate(names)}  # NULL: an empty field ("" alone)
    rows = [[v.strip() for v in line.split(" | ")] for line in out.splitlines()[2:]]
    return {c: [None if r[i] == "NULL" else r[i] for r in rows] for i, c in enumerate(names)}


@pytest.mark.parametrize("fmt", ["csv", "json", "table"])
@pytest.mark.parametrize("column", sorted(CASES))
def test_each_type_is_spelled_canonically_in_every_text_format(fmt: str, column: str) -> None:
    got = _texts(_release([column]), fmt)[column]
    want = CASES[column][1]
    if fmt == "json" and column == "b":
        want = ["true", "false", None]  # JSON's own booleans
    assert got == want


def test_the_python_api_keeps_arrow_types_and_to_dict_is_the_json_form() -> None:
    rel = _release(["ts_us", "d"])
    assert rel.table.schema.field("ts_us").type == pa.timestamp("us")
    assert rel.to_pylist()[1]["ts_us"] == dt.datetime(2024, 1, 2)
    assert rel.to_dict()["rows"][1] == {"ts_us": "2024-01-02T00:00:00.000000", "d": "0001-01-01"}


def test_a_timestamp_key_reads_the_same_from_csv_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The query of the report: a TIMESTAMP key printed with --format csv and --format json."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    ts = [dt.datetime(2024, 1, 1, 12, 30, 15, 123456), dt.datetime(2024, 1, 2)]
    pq.write_table(pa.table({"uid": list(range(200)), "ts": pa.array([ts[i % 2] for i in range(200)], pa.timestamp("us"))}),
                   "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "10", "--delta", "1e-3"]) == 0
    flags = ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid",
             "--domain", "t.ts=2024-01-01 12:30:15.123456,2024-01-02 00:00:00"]
    keys = {}
    for fmt in ("csv", "json", "table"):
        capsys.readouterr()
        assert run([*flags, "query", "SELECT ts, COUNT(*) AS n FROM t GROUP BY ts ORDER BY ts", "--epsilon", "1",
                    "--format", fmt]) == 0
        out = capsys.readouterr().out
        keys[fmt] = ([r["ts"] for r in json.loads(out)["rows"]] if fmt == "json" else
                     [r["ts"] for r in csv.DictReader(io.StringIO(out))] if fmt == "csv" else
                     [line.split(" | ")[0].strip() for line in out.splitlines()[2:]])
    assert keys["csv"] == keys["json"] == keys["table"] == ["2024-01-01T12:30:15.123456", "2024-01-02T00:00:00.000000"]
    assert [dt.datetime.fromisoformat(k) for k in keys["csv"]] == ts


def test_budget_history_spells_its_times_and_numbers_alike_in_csv_json_and_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``budget --history`` wrote created_at ``2026-12-05 02:36:49.314260+0000`` in the CSV and
    ``2026-12-05T02:36:49.314260+00:00`` in JSON, and a delta ``0.0000010000002471773102`` and ``1.0000002471773102e-06``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": list(range(50))}), "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "10", "--delta", "1e-3"]) == 0
    assert run(["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "query",
                "SELECT COUNT(*) AS n FROM t", "--epsilon", "1", "--delta", "1e-6"]) == 0
    seen = {}
    for fmt in ("csv", "json", "table"):
        capsys.readouterr()
        assert run(["--ledger", "l.duckdb", "budget", "--history", "--format", fmt]) == 0
        out = capsys.readouterr().out
        if fmt == "json":
            row = json.loads(out)["entries"][0]
        elif fmt == "csv":
            row = next(csv.DictReader(io.StringIO(out, newline="")))
        else:
            lines = out.splitlines()
            at = next(i for i, line in enumerate(lines) if line.startswith("entry_id"))
            row = dict(zip([c.strip() for c in lines[at].split(" | ")], [v.strip() for v in lines[at + 2].split(" | ")]))
        seen[fmt] = (row["created_at"], str(row["delta"]))
    assert seen["csv"] == seen["json"], seen
    assert seen["table"][0] == seen["json"][0]
    stamp = dt.datetime.fromisoformat(seen["json"][0])
    assert stamp.utcoffset() == dt.timedelta(0) and seen["json"][0].endswith("Z") and "T" in seen["json"][0]


def test_the_meta_names_each_columns_arrow_type() -> None:
    """A JSON value alone does not say its type: "NaN" is a text or a double, "2024-01-02" a text or a DATE, "1.50" a
    text or a DECIMAL. The meta lists each column's Arrow type beside its name, as the Python API and Parquet hold it."""
    rel = _release(["d", "ts_us", "f", "dec", "b"])
    meta = json.loads(_render_rows(rel, "json", None))["meta"]
    assert meta["columns"] == ["d", "ts_us", "f", "dec", "b"]
    assert meta["column_types"] == ["date32[day]", "timestamp[us]", "double", "decimal128(38, 10)", "bool"]
    assert meta["column_types"] == [str(f.type) for f in rel.table.schema]


def test_a_null_in_a_one_column_csv_of_numbers_is_kept_as_a_row() -> None:
    """A one-column CSV wrote a NULL as an empty line, which Arrow's CSV reader (and pandas) skip: a released row was
    lost on reading (``SELECT NULLIF(COUNT(*), 0) AS n``). A number, boolean, date or timestamp column, which holds no
    empty text, now writes it as ``""``, read as NULL by DuckDB, Arrow and pandas; a text column keeps the empty line
    (``""`` is its empty text)."""
    import pyarrow.csv as pacsv

    for column in ("ts_us", "big", "dec", "b", "d"):
        table = pa.table({column: pa.array([CASES[column][0][0], None]).cast(CASES[column][0].type)})
        rel = Release(table=table, cost=Budget(1.0, 0.0), mechanism="laplace", accuracy={}, ledger_id=1)
        out = _render_rows(rel, "csv", None)
        assert out.decode().splitlines()[2] == '""', out
        assert pacsv.read_csv(io.BytesIO(out)).column(0).null_count == 1
    text = Release(table=pa.table({"s": ["a", None, ""]}), cost=Budget(1.0, 0.0), mechanism="laplace", accuracy={},
                   ledger_id=1)
    assert _render_rows(text, "csv", None).decode() == '"s"\n"a"\n\n""\n'  # negative control: text keeps the empty line
    two = Release(table=pa.table({"n": [1.5, None], "m": [None, 2]}), cost=Budget(1.0, 0.0), mechanism="laplace",
                  accuracy={}, ledger_id=1)
    assert _render_rows(two, "csv", None).decode() == '"n","m"\n1.5,\n,2\n'  # two columns: NULL is an empty field
