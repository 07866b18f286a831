"""A Parquet source the reader cannot open is refused naming the file at fault and the fix, in the flags'
terms, before anything is charged: a directory (Spark writes ``out.parquet/part-*.parquet``) and a file of
a glob that is no Parquet (``_SUCCESS``, a stray text file). Before, both said only ``cannot read table
source for 't' (parquet): OSError`` (or ``ArrowInvalid``), which named no file of the glob."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _ledger_charges import charges
from conftest import run_cli as run


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    (tmp_path / "out.parquet").mkdir()
    pq.write_table(pa.table({"uid": list(range(40))}), tmp_path / "out.parquet" / "part-0000.parquet")
    (tmp_path / "out.parquet" / "_SUCCESS").write_text("")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "1"]) == 0
    return tmp_path


def _query(source: str) -> list[str]:
    return ["--ledger", "l.duckdb", "--table", f"t={source}", "--privacy-unit", "t=uid",
            "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1"]


def test_a_directory_is_refused_with_a_glob_of_its_files(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(_query("out.parquet")) == 2
    err = capsys.readouterr().err
    assert "out.parquet' is a directory" in err and "out.parquet/*.parquet" in err.split("hint:", 1)[1], err
    assert charges(capsys) == 0


def test_a_file_of_a_glob_that_is_no_parquet_is_named(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(_query("out.parquet/*")) == 2
    err = capsys.readouterr().err
    assert "cannot read out.parquet/_SUCCESS: it is not a Parquet file" in err, err
    assert charges(capsys) == 0


def test_a_glob_of_the_parquet_files_is_answered(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: the files themselves are read and charged."""
    assert run(_query("out.parquet/*.parquet")) == 0
    assert charges(capsys) == 1
