"""An input file that is missing or cannot be read -- a table's source (not written yet, no file matching its glob,
permission denied, removed while the command ran), the config, the SQL file of -f -- exits 66 (sysexits'
EX_NOINPUT), before anything is charged: a scheduler may retry it once the file is there. Before, it exited 2,
as a mistake in the query text does, which no retry mends. A file that is there but holds the wrong thing (not
Parquet, a directory) and a bad query stay 2 (negative controls). The Python API raises
``InputUnavailableError``, a ``ConfigError`` whose ``exit_code`` is 66."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _ledger_charges import charges
from conftest import run_cli as run

import dpsql
from dpsql.errors import NO_INPUT_EXIT_CODE, ConfigError, ExecutionError, InputUnavailableError


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": list(range(40))}), tmp_path / "a.parquet")
    (tmp_path / "a.csv").write_text("uid\n" + "".join(f"{i}\n" for i in range(40)))
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "1"]) == 0
    return tmp_path


def _query(source: str, sql: str = "SELECT COUNT(*) AS n FROM t") -> list[str]:
    return ["--ledger", "l.duckdb", "--table", f"t={source}", "--privacy-unit", "t=uid",
            "query", sql, "--epsilon", "0.1"]


def _config(tmp_path: Path, source: str) -> Path:
    cfg = tmp_path / "conf dir" / "dpsql job.toml"  # (a path with spaces, as a scheduler's may be)
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(f'[ledger]\npath = "{tmp_path / "l.duckdb"}"\nepsilon = 1.0\n\n'
                   f'[tables.t]\nsource = "{source}"\nprivacy_unit = "uid"\n')
    return cfg


def test_the_exit_code_is_its_own() -> None:
    assert NO_INPUT_EXIT_CODE == 66 and InputUnavailableError.exit_code == 66
    assert NO_INPUT_EXIT_CODE not in (0, 1, 2, 3, 4, 5, 129, 130, 143)
    assert issubclass(InputUnavailableError, ConfigError)  # callers that catch ConfigError still catch it


@pytest.mark.parametrize("source", ["later.parquet", "parts/*.parquet", "later.csv"])
def test_a_source_not_there_yet_exits_66(data: Path, capsys: pytest.CaptureFixture[str], source: str) -> None:
    capsys.readouterr()
    assert run(_query(source)) == 66
    err = capsys.readouterr().err
    assert "error: InputUnavailableError: table 't': no file matches" in err and source in err, err
    assert charges(capsys) == 0


def test_a_config_source_not_there_yet_exits_66(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(data, str(data / "later.parquet"))
    capsys.readouterr()
    assert run(["--config", str(cfg), "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1"]) == 66
    err = capsys.readouterr().err
    assert "later.parquet" in err and str(cfg) in err, err  # the config that names it is named
    assert charges(capsys) == 0
    (data / "later.parquet").write_bytes((data / "a.parquet").read_bytes())  # the file arrives: the retry is answered
    assert run(["--config", str(cfg), "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1"]) == 0


def test_a_missing_config_or_sql_file_exits_66(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--config", "gone.toml", "tables"]) == 66
    assert "config file 'gone.toml' not found" in capsys.readouterr().err
    assert run(_query("a.parquet")[:-4] + ["query", "-f", "gone.sql", "--epsilon", "0.1"]) == 66
    assert "SQL file 'gone.sql' not found" in capsys.readouterr().err
    assert charges(capsys) == 0


def test_a_source_that_cannot_be_read_exits_66(data: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Permission denied (the tests may run as root, who reads any file: the reader is made to refuse it)."""
    real_parquet, real_open = pq.ParquetFile, open

    def parquet_file(path: object, *a: object, **k: object) -> object:
        if str(path).endswith("a.parquet"):
            raise PermissionError(13, "Permission denied")
        return real_parquet(path, *a, **k)

    def opener(path: object, *a: object, **k: object) -> object:
        if str(path).endswith("a.csv"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(pq, "ParquetFile", parquet_file)
    monkeypatch.setattr("dpsql.engine._duckdb_sources.open", opener, raising=False)
    capsys.readouterr()
    assert run(_query("a.parquet")) == 66
    err = capsys.readouterr().err
    assert "error: InputUnavailableError: table 't': cannot read" in err and "PermissionError" in err, err
    assert run(_query("a.csv")) == 66
    err = capsys.readouterr().err
    assert "error: InputUnavailableError: " in err and "a.csv" in err and "PermissionError" in err, err
    monkeypatch.undo()
    monkeypatch.chdir(data)
    assert charges(capsys) == 0


def test_a_source_removed_after_registration_is_refused_as_unavailable(data: Path) -> None:
    """The Python API: a file gone between registration and the query (an ETL job replacing it) is refused for
    free with the same class, which says that a retry (after registering it again) may succeed."""
    for source in ("b.parquet", "b.csv"):
        src = data / source
        src.write_bytes((data / source.replace("b.", "a.")).read_bytes())
        with dpsql.Session(ledger="l.duckdb") as s:
            s.register("t", str(src), privacy_unit="uid")
            os.remove(src)
            with pytest.raises(InputUnavailableError, match="since it was registered") as ei:
                s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1)
            assert ei.value.exit_code == 66
            assert s.history().num_rows == 0


def test_the_api_refuses_a_missing_source_with_exit_code_66(data: Path) -> None:
    with dpsql.Session(ledger="l.duckdb") as s, pytest.raises(InputUnavailableError, match="no file matches") as ei:
        s.register("t", "later.parquet", privacy_unit="uid")
    assert ei.value.exit_code == 66


@pytest.mark.parametrize("argv, why", [
    (["SELECT COUNT(*) AS n FROM t WHERE"], "syntax"),
    (["SELECT COUNT(*) AS n FROM nosuch"], "no table"),
])
def test_a_mistake_in_the_query_text_stays_2(data: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                             why: str) -> None:
    """Negative control: a bad query never mends by itself."""
    assert run(_query("a.parquet", argv[0])) == 2
    assert charges(capsys) == 0


def test_a_source_that_holds_the_wrong_thing_stays_2(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: a file that is there but is not Parquet, a directory, or a name without a known
    extension is the caller's mistake (exit 2)."""
    (data / "text.parquet").write_text("not parquet")
    (data / "dir.parquet").mkdir()
    for source in ("text.parquet", "dir.parquet", "later.txt"):
        assert run(_query(source)) == 2, source
    assert charges(capsys) == 0


def test_a_parquet_file_still_being_written_exits_66(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file an upstream job is still writing (not renamed into place: its header is there, its footer not yet) was
    'not a Parquet file' (exit 2, never retried); once written, the same command is answered. A file that is no
    Parquet at all stays 2 (test_a_source_that_holds_the_wrong_thing_stays_2)."""
    whole = (data / "a.parquet").read_bytes()
    (data / "partial.parquet").write_bytes(whole[: len(whole) // 2])
    capsys.readouterr()
    assert run(_query("partial.parquet")) == 66
    err = capsys.readouterr().err
    assert "error: InputUnavailableError: table 't': cannot read" in err and "partial.parquet" in err, err
    assert "no footer yet" in err, err
    assert charges(capsys) == 0
    (data / "partial.parquet").write_bytes(whole)  # the writer is done: the retry is answered
    assert run(_query("partial.parquet")) == 0


def test_a_gzip_csv_still_being_written_exits_66_and_one_that_is_no_gzip_stays_2(
        data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A .csv.gz source whose writer has not got past its first line (the compressed stream ends early) may be read
    once written: 66, as a Parquet file without its footer yet. One that holds no gzip stream, or a damaged one,
    never mends: 2 (they failed as 'cannot read ... check that the file exists' (66) and as an unexpected EOFError /
    zlib.error (1))."""
    import gzip

    whole = gzip.compress(b"uid\n" + b"".join(b"%d\n" % i for i in range(40)))
    (data / "partial.csv.gz").write_bytes(whole[:12])
    (data / "plain.csv.gz").write_bytes((data / "a.csv").read_bytes())
    (data / "damaged.csv.gz").write_bytes(whole[:10] + b"\xff" * 40)
    capsys.readouterr()
    assert run(_query("partial.csv.gz")) == 66
    err = capsys.readouterr().err
    assert "error: InputUnavailableError: " in err and "partial.csv.gz" in err and "unexpected" not in err, err
    for source in ("plain.csv.gz", "damaged.csv.gz"):
        assert run(_query(source)) == 2, source
        err = capsys.readouterr().err
        assert "error: ConfigError: " in err and source in err and "gzip" in err, err
    assert charges(capsys) == 0
    (data / "partial.csv.gz").write_bytes(whole)  # the writer is done: the retry is answered
    assert run(_query("partial.csv.gz")) == 0


@pytest.mark.parametrize("source", ["dir.csv", "parts/*.csv", "dir.csv.gz"])
def test_a_csv_source_that_is_a_directory_stays_2(data: Path, capsys: pytest.CaptureFixture[str], source: str) -> None:
    """A CSV source naming a directory (or a glob matching one) is the caller's mistake, as a Parquet one is: 2 and a
    hint to name its files, not 66 'check that the file exists' (which no retry mends)."""
    (data / "dir.csv").mkdir()
    (data / "dir.csv.gz").mkdir()
    (data / "parts" / "x.csv").mkdir(parents=True)
    (data / "parts" / "a.csv").write_bytes((data / "a.csv").read_bytes())
    capsys.readouterr()
    assert run(_query(source)) == 2
    err = capsys.readouterr().err
    assert "error: ConfigError: " in err and "is a directory" in err, err
    assert charges(capsys) == 0


@pytest.mark.parametrize("source", ["c.parquet", "c.csv"])
def test_a_source_removed_once_charged_is_the_generic_charged_failure(data: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     source: str) -> None:
    """Negative control: a file gone after the charge (during the private read) is the one generic failure (5, the
    charge stands), never 66: what the read met is withheld."""
    import dpsql.engine

    src = data / source
    src.write_bytes((data / source.replace("c.", "a.")).read_bytes())
    real = dpsql.engine.fetch_bounded

    def gone(*a: object, **k: object) -> object:
        os.remove(src)
        return real(*a, **k)

    with dpsql.Session(ledger="l.duckdb") as s:
        s.register("t", str(src), privacy_unit="uid")
        monkeypatch.setattr(dpsql.engine, "fetch_bounded", gone)
        with pytest.raises(ExecutionError, match="failed after its budget was charged") as ei:
            s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1)
        assert not isinstance(ei.value, InputUnavailableError) and ei.value.exit_code == 5
        assert [r["status"] for r in s.history().to_pylist()] == ["failed"]
