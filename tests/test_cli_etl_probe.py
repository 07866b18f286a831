"""The command line as an ETL job meets it: pipes whose reader leaves early, unbuffered streams
(PYTHONUNBUFFERED=1, python -u, as many container images set), mistyped flags."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

KEYS = 12_000  # rows of the answer: its text is well beyond a pipe's 64 KiB


@pytest.fixture
def wide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A table whose GROUP BY over a declared domain releases KEYS rows, and a fresh ledger."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"user_id": list(range(2 * KEYS)), "k": [i % KEYS for i in range(2 * KEYS)]}), "w.parquet")
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "10"]) == 0
    return ["--ledger", "l.duckdb", "--table", "w=w.parquet", "--privacy-unit", "w=user_id",
            "--domain", "w.k=" + ",".join(map(str, range(KEYS)))]


def _entries(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--history", "--format", "json"]) == 0
    return list(json.loads(capsys.readouterr().out)["entries"])


def _unbuffered_pipe_read_then_closed(monkeypatch: pytest.MonkeyPatch, keep: int = 100) -> dict[str, bytes]:
    """sys.stdout as PYTHONUNBUFFERED=1 makes it (a text layer over the raw file, write-through) on a pipe whose reader
    reads ``keep`` bytes and then closes it, as `dpsql ... | head -c 100` does."""
    r, w = os.pipe()
    got: dict[str, bytes] = {}

    def reader() -> None:
        got["data"] = os.read(r, keep)
        os.close(r)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    stream = io.TextIOWrapper(io.FileIO(w, "w"), encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdout", stream)
    return got


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_an_unbuffered_stdout_cut_short_by_its_reader_is_no_success(wide: list[str], capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    """`PYTHONUNBUFFERED=1 dpsql query ... | head -c 100`: the raw write of the rows stopped at the pipe's 64 KiB when the
    reader left, Python's text layer dropped the short count, and the command exited 0 with its answer cut short (and
    the rest neither written nor kept). Now the rest of the write fails as a closed pipe does: exit 5, the answer
    saved beside the ledger, the charge named."""
    with monkeypatch.context() as m:
        _unbuffered_pipe_read_then_closed(m)
        code = run([*wide, "query", "SELECT k, COUNT(*) AS n FROM w GROUP BY k", "--epsilon", "1", "--format", fmt])
    err = capsys.readouterr().err
    assert code == 5, err
    assert "writing stdout failed" in err and "its charge stands (ledger entry 1)" in err and "Traceback" not in err
    saved = next(Path(".l.duckdb.releases").iterdir())
    assert len(json.loads((saved / "release.json").read_text())["rows"]) == KEYS
    assert [e["status"] for e in _entries(capsys)] == ["released"]


def test_an_unbuffered_stdout_cut_short_fails_a_free_command_too(wide: list[str], capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`dpsql budget --history --format csv | head -c 100` (long queries in the history) exited 0 under
    PYTHONUNBUFFERED=1, its CSV cut short."""
    sql = "SELECT COUNT(*) AS n FROM w WHERE CAST(k AS VARCHAR) <> '" + "x" * 2**17 + "'"  # a long query, kept whole
    assert run([*wide, "query", sql, "--epsilon", "0.1"]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--history", "--format", "csv"]) == 0
    assert len(capsys.readouterr().out) > 2**17
    with monkeypatch.context() as m:
        _unbuffered_pipe_read_then_closed(m)
        code = run(["--ledger", "l.duckdb", "budget", "--history", "--format", "csv"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "writing stdout failed" in err and "nothing was charged" in err and "Traceback" not in err


def test_a_directory_named_like_a_parquet_file_is_hinted_in_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`--table t=out.parquet` where out.parquet is a directory (as Spark and Hive write one): the hint named the Python
    call `register('t', '.../out.parquet/*.parquet', ...)` beside the flag."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    (tmp_path / "out.parquet").mkdir()
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "1"]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "--table", "t=out.parquet", "--privacy-unit", "t=user_id", "query",
                "SELECT COUNT(*) FROM t", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "--table t=" in err and "out.parquet/*.parquet" in err
    assert "register(" not in err and "Traceback" not in err


def test_a_table_name_that_is_no_identifier_is_hinted_in_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`--table my-events=...`: the hint read 'e.g. register table 'events'', the Python call's words."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"user_id": [1, 2]}), "e.parquet")
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "1"]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "--table", "my-events=e.parquet", "--privacy-unit", "my-events=user_id", "query",
                "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "not a plain identifier" in err and "--table events=" in err and "register" not in err


@pytest.fixture
def small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"user_id": list(range(50))}), "e.parquet")
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "1"]) == 0
    capsys.readouterr()
    return ["--ledger", "l.duckdb", "--table", "e=e.parquet", "--privacy-unit", "e=user_id"]


@pytest.mark.parametrize("typed,meant,argv", [
    ("--epsilom", "--epsilon", ["query", "SELECT COUNT(*) FROM e", "--epsilom", "0.1"]),
    ("--formt", "--format", ["query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1", "--formt", "csv"]),
    ("--ouput", "--output", ["query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1", "--ouput", "x.csv"]),
    ("--histroy", "--history", ["budget", "--histroy"]),
    ("--privacy-units", "--privacy-unit", ["query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1", "--privacy-units", "e=x"]),
])
def test_a_mistyped_flag_is_named_with_the_flag_meant(small: list[str], capsys: pytest.CaptureFixture[str], typed: str,
                                                      meant: str, argv: list[str]) -> None:
    """`--epsilom 0.1` was refused as 'the following arguments are required: --epsilon', which does not say that
    --epsilom was typed; `--formt csv` as 'unrecognized arguments' under the usage of `dpsql`, which lists no --format."""
    assert run([*small, *argv]) == 2
    err = capsys.readouterr().err
    assert f"{typed} is not a flag of dpsql {argv[0]}" in err and f"did you mean {meant}?" in err, err
    assert f"usage: dpsql {argv[0]}" in err
    assert "Traceback" not in err
    assert [e for e in _entries(capsys)] == []


@pytest.mark.parametrize("argv,meant", [
    (["query", "SELECT COUNT(*) FROM e", "--eps", "0.1"], "--epsilon"),
    (["query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1", "--form", "csv"], "--format"),
    (["query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1", "--out", "x.csv"], "--output"),
])
def test_an_abbreviated_flag_is_refused_naming_it_in_full(small: list[str], capsys: pytest.CaptureFixture[str],
                                                          argv: list[str], meant: str) -> None:
    """`--eps 0.1`, `--form csv` were read as --epsilon and --format (argparse's prefix matching, documented nowhere):
    a job written so breaks, or changes meaning, the day a flag with the same prefix is added (`--o` already was
    ambiguous between --option and --output). Flags are spelled in full."""
    assert run([*small, *argv]) == 2
    err = capsys.readouterr().err
    assert f"did you mean {meant}?" in err and "spelled in full" in err, err
    assert not Path("x.csv").exists() and _entries(capsys) == []


def test_the_history_table_cuts_a_long_query_short(small: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`dpsql budget --history` padded every row's query cell to the longest query ever recorded: one query of 3 MB
    (the SQL may hold 16 Mi characters) made 20 entries print 66 MB, built whole in memory. The table cuts a long query
    short and says so; --format json and csv print it whole."""
    long = "SELECT COUNT(*) FROM e WHERE CAST(user_id AS VARCHAR) <> '" + "x" * 2**17 + "'"
    assert run([*small, "query", long, "--epsilon", "0.1"]) == 0
    for _ in range(3):
        assert run([*small, "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--history"]) == 0
    out = capsys.readouterr().out
    assert len(out) < 4000, len(out)
    assert "SELECT COUNT(*) FROM e WHERE CAST(user_id AS VARCHAR) <> 'xxx" in out and out.count("SELECT COUNT(*) FROM e") == 4
    assert "--format json" in out and "entry 1" in out
    assert [e["query"] for e in _entries(capsys)][0] == long  # whole in the JSON


def test_an_exhausted_budget_is_hinted_in_flags(small: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A job that runs out of budget mid-script: exit 3, nothing charged, and the fix in flags (it read 'ask for a
    smaller epsilon/delta', the Python parameters)."""
    assert run([*small, "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.75"]) == 0
    capsys.readouterr()
    assert run([*small, "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.5"]) == 3
    err = capsys.readouterr().err
    assert "privacy budget exceeded" in err and "nothing was charged" in err
    assert "--epsilon" in err.split("hint:")[1] and "epsilon/delta" not in err and "dpsql budget --set-total" in err
    assert len(_entries(capsys)) == 1


@pytest.mark.parametrize("sql,where,what", [
    ("SELECT COUNT(*)\nFROM e\nWHERE CAST(user_id AS VARCHAR) = 'abc\n", "line 3, col 34", "quoted text"),
    ("SELECT COUNT(*)\nFROM e\nWHERE \"user_id > 3\n", "line 3, col 7", "quoted name"),
    ("SELECT COUNT(*) -- total\nFROM e /* people\n", "line 2, col 8", "comment"),
    ("SELECT COUNT(*) FROM e WHERE CAST(user_id AS VARCHAR) <> '" + "x" * 100_000 + "' AND user_id = 'it''s\n",
     "line 1, col 100075", "quoted text"),
])
def test_an_unclosed_quote_or_comment_is_placed_by_line_and_column(small: list[str], capsys: pytest.CaptureFixture[str],
                                                                   sql: str, where: str, what: str) -> None:
    """An unclosed quote in a -f file was 'SQL syntax error: Error tokenizing '...'': no line or column, and up to 100
    characters of the SQL around the end of the text, with its line breaks, on stderr (an error of several lines)."""
    Path("q.sql").write_text(sql)
    assert run([*small, "query", "-f", "q.sql", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    first, hint = err.splitlines()
    assert first.startswith("error: SQLSyntaxError:") and where in first and what in first, err
    assert "xxxxxxxxxx" not in err and hint.startswith("hint: ") and _entries(capsys) == []


def test_a_missing_ledger_named_by_the_environment_says_so(small: list[str], capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose $DPSQL_LEDGER names a ledger that is not there (a stale variable in a cron job's environment): the
    error named the path only, and its hint `dpsql init ... --ledger PATH`, with no word of where the path came from."""
    monkeypatch.setenv("DPSQL_LEDGER", "gone.duckdb")
    assert run([*small[2:], "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 4
    err = capsys.readouterr().err
    assert "no budget ledger at" in err and "$DPSQL_LEDGER" in err.splitlines()[0], err
    assert not Path("gone.duckdb").exists()


def test_sql_piped_without_f_dash_is_hinted_with_it(small: list[str], capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`echo "SELECT ..." | dpsql query --epsilon 0.1`: 'no SQL given', hinted with an SQL argument only; standard input
    is read with -f -."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("SELECT COUNT(*) FROM e"))
    assert run([*small, "query", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "no SQL given" in err and "-f -" in err and "-f FILE" in err
    assert _entries(capsys) == []


@pytest.mark.parametrize("stdin", [False, True])
def test_a_byte_that_is_not_utf8_in_an_sql_file_is_placed(small: list[str], capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch, stdin: bool) -> None:
    """A Latin-1 'é' on line 40 of a -f file (or -f -) was 'is not UTF-8 text', with no word of where; the SQL argument
    names the byte and where it is."""
    raw = b"-- report\n" * 39 + "SELECT COUNT(*) FROM e WHERE 'caf\u00e9' = 'x'\n".encode("latin-1")
    Path("q.sql").write_bytes(raw)
    if stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert run([*small, "query", "-f", "-" if stdin else "q.sql", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "byte 0xE9 at line 40, column 34" in err, err
    assert "iconv -f LATIN1 -t UTF-8" in err and _entries(capsys) == []


@pytest.mark.parametrize("command", ["query", "explain"])
def test_a_refused_query_of_a_workload_file_is_placed_in_the_file(small: list[str], capsys: pytest.CaptureFixture[str],
                                                                  command: str) -> None:
    """`query -f ranges.sql --workload`, its third query mistyped on line 5: the error said '(line 1, col 31)', a place
    in the statement as dpsql had rewritten it (one line, comments dropped), not in the file."""
    Path("w.sql").write_text("-- ranges\nSELECT COUNT(*) FROM e WHERE user_id BETWEEN 1 AND 10;\n"
                             "SELECT COUNT(*) FROM e WHERE user_id > 30;\nSELECT COUNT(*)\n  FROM e WHERE usr_id > 3;\n")
    argv = [*small, "--bins", "e.user_id=0:50:50", command, "-f", "w.sql", "--workload", "--epsilon", "0.1"]
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert "query 3 of 3 of the workload" in err and "usr_id" in err and "(line 5, col 16)" in err, err
    Path("w.sql").write_text(Path("w.sql").read_text().replace("usr_id", "user_id"))
    assert run(argv) == 0
    capsys.readouterr()
    assert len(_entries(capsys)) == (command == "query")


def test_a_ledger_in_a_missing_directory_says_the_directory_is_missing(small: list[str],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`--ledger /data/ledgr/l.duckdb` (a mistyped directory): 'no budget ledger at ...' and a hint to create one there
    with `dpsql init`, which then failed for the directory; the directory's absence tells of a wrong path."""
    assert run([*small[2:], "--ledger", "ledgr/l.duckdb", "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 4
    first = capsys.readouterr().err.splitlines()[0]
    assert "no budget ledger at" in first and "directory" in first and "does not exist" in first, first
    assert not Path("ledgr").exists()


@pytest.mark.parametrize("table,unit,says", [
    ("e=", "e=user_id", "--table e= names no file"),  # --table "e=$SRC" with SRC unset
    ("=e.parquet", "e=user_id", "--table =e.parquet names no table"),
    ("e=e.parquet", "=user_id", "--privacy-unit =user_id names no table"),
])
def test_an_empty_name_or_path_of_a_table_flag_is_refused_naming_it(small: list[str], capsys: pytest.CaptureFixture[str],
                                                                     table: str, unit: str, says: str) -> None:
    """`--table "e=$SRC"` with SRC unset was 'unsupported table source str', hinted with a pyarrow.Table and the
    Session's DuckDB connection; `--table =e.parquet` was '--table  needs a privacy unit' (hint: `--privacy-unit =user_id`)."""
    assert run([*small[:2], "--table", table, "--privacy-unit", unit, "query", "SELECT COUNT(*) FROM e",
                "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert says in err and "pyarrow" not in err and "Session" not in err, err
    assert _entries(capsys) == []


def test_a_cap_of_the_config_is_refused_in_toml_words(small: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`max_groups_per_unit = 0` under [tables.e]: '... must be a whole number >= 1 or math.inf' (Python's name)."""
    Path("c.toml").write_text('[ledger]\npath = "l.duckdb"\n[tables.e]\nsource = "e.parquet"\nprivacy_unit = "user_id"\n'
                              "max_groups_per_unit = 0\n")
    assert run(["--config", "c.toml", "tables"]) == 2
    err = capsys.readouterr().err
    assert "max_groups_per_unit" in err and "math.inf" not in err and "or inf" in err, err


@pytest.mark.parametrize("argv,code", [(["query", "SELECT 1", "--epsilom", "1"], 2), (["frob"], 2), (["--help"], 0),
                                       (["query", "--help"], 0), (["--version"], 0)])
def test_main_returns_the_exit_code_of_a_usage_error_or_help(argv: list[str], code: int,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """dpsql.cli.main(argv) called by a Python ETL job returns its exit code; a mistyped flag, an unknown command, --help
    and --version raised SystemExit instead, which ends the calling job unless it catches it."""
    from dpsql.cli import main

    assert main(argv) == code
    assert "Traceback" not in capsys.readouterr().err


def test_a_refused_version_of_the_config_is_hinted_in_toml(small: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`version = ""` under [tables.e]: hinted with `register(..., version='2026-11-30')`, the Python call."""
    Path("c.toml").write_text('[ledger]\npath = "l.duckdb"\n[tables.e]\nsource = "e.parquet"\nprivacy_unit = "user_id"\n'
                              'version = ""\n')
    assert run(["--config", "c.toml", "tables"]) == 2
    err = capsys.readouterr().err
    assert "version" in err and "register(" not in err and 'version = "2026-11-30" under [tables.' in err, err


def test_a_delta_beyond_a_pure_dp_ledger_says_only_delta_0_fits(small: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger created with --delta 0 (the default of init) and a query that needs delta: 'ask for a smaller
    --epsilon or --delta', which no smaller delta but 0 can satisfy."""
    assert run([*small, "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1", "--delta", "1e-9"]) == 3
    err = capsys.readouterr().err
    assert "privacy budget exceeded (delta)" in err and "total delta is 0" in err and "--delta 0" in err, err
    assert _entries(capsys) == []


def test_a_reason_that_is_not_utf8_names_the_flag(small: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--reason` holding a byte that is not UTF-8 (a Latin-1 shell): 'the ledger cannot store reason ...', the Python
    parameter's name; the total is unchanged."""
    assert run(["--ledger", "l.duckdb", "budget", "--set-total", "2", "0", "--reason", "caf\udce9"]) == 2
    err = capsys.readouterr().err
    assert "--reason" in err.splitlines()[0] and "not valid Unicode" in err, err
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["epsilon"] == 1
