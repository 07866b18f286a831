"""More of the command line as an ETL job meets it: a --ledger that names some other file, CSV column types on the
command line, a --reference to a table that is not there, --help into a pipe whose reader has gone, a misspelt column
in a per-table flag. Bad input spends no budget and leaves nothing behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    """A working directory with a Parquet table of 50 people, a CSV table and a fresh ledger l.duckdb."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"user_id": list(range(50)), "x": list(range(50))}), "e.parquet")
    Path("s.csv").write_text("user_id,amount,day\n" + "".join(f"{i},{i % 7}.5,2024-01-0{1 + i % 9}\n" for i in range(40)))
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "1"]) == 0
    capsys.readouterr()
    return tmp_path


def _entries(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--history", "--format", "json"]) == 0
    return list(json.loads(capsys.readouterr().out)["entries"])


# -- 1. a --ledger that is not a ledger -------------------------------------------------------------------------------

def _other_file(kind: str) -> Path:
    p = Path({"parquet": "data.parquet", "text": "notes.txt", "empty": "empty.duckdb", "duckdb": "warehouse.duckdb"}[kind])
    if kind == "parquet":
        pq.write_table(pa.table({"a": [1, 2, 3]}), p)
    elif kind == "text":
        p.write_text("not a ledger\n")
    elif kind == "empty":
        p.write_bytes(b"")
    else:
        con = duckdb.connect(str(p))
        con.execute("CREATE TABLE t AS SELECT 1 AS a")
        con.close()
    os.utime(p, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    return p


@pytest.mark.parametrize("kind", ["parquet", "text", "empty", "duckdb"])
@pytest.mark.parametrize("command", ["query", "budget"])
def test_a_ledger_flag_naming_another_file_leaves_nothing_beside_it(here: Path, capsys: pytest.CaptureFixture[str],
                                                                     kind: str, command: str) -> None:
    """`--ledger data.parquet` (a job's variables mixed up): refused, but a hidden `.data.parquet.queue` was left beside
    the user's file by every such command. Now nothing is created beside it, and the file keeps its bytes and mtime."""
    p = _other_file(kind)
    before = sorted(os.listdir("."))
    data, mtime = p.read_bytes(), p.stat().st_mtime_ns
    argv = (["--ledger", str(p), "--table", "e=e.parquet", "--privacy-unit", "e=user_id", "query", "SELECT COUNT(*) FROM e",
             "--epsilon", "0.1"] if command == "query" else ["--ledger", str(p), "budget"])
    assert run(argv) == 4
    err = capsys.readouterr().err
    first, _, hint = err.partition("\nhint: ")
    assert "is not a dpsql budget ledger" in first and "--ledger" in first and "Traceback" not in err, err
    assert "--ledger" in hint and "dpsql init" in hint, err
    assert sorted(os.listdir(".")) == before
    assert p.read_bytes() == data and p.stat().st_mtime_ns == mtime
    assert _entries(capsys) == []  # the real ledger is untouched too


def test_a_ledger_still_keeps_its_queue_file(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The negative control: a real ledger's own side files are made and kept as before."""
    assert run(["--ledger", "l.duckdb", "budget"]) == 0
    assert Path(".l.duckdb.queue").exists() and Path(".l.duckdb.generation").exists()
