"""The command line as a data team's ETL scripts meet it, over ad-hoc Parquet and CSV files: refusals of per-table
flags in the flags' own terms, and the README's word on a ledger held past --lock-timeout. Each test says what was
wrong and what is right now. The commands run in this process (``dpsql.cli.main``): the process boundary is not
what they are about."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    """A Parquet file (BIGINT, DOUBLE, DATE, BOOLEAN columns), a CSV file (read as text) and a fresh ledger."""
    import datetime

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": [1, 2, 3], "x": [1.0, 2.0, 3.0], "d": [datetime.date(2024, 1, 1)] * 3,
                             "b": [True, False, True]}), "p.parquet")
    Path("c.csv").write_text("uid,v\n1,10\n2,20\n3,oops\n")
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "10"]) == 0
    capsys.readouterr()
    return tmp_path


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The stderr of ``argv`` (a query), which must be a usage error that charged nothing."""
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "--privacy-unit", "t=uid", *argv, "query", "SELECT COUNT(*) FROM t",
                "--epsilon", "1"]) == 2
    err = capsys.readouterr().err
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0
    assert "Traceback" not in err
    return err


def test_bounds_on_a_csv_text_column_hint_the_type_flag(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--bounds on a CSV column (read as text) was refused with the config's fix, 'declare its type with the bounds
    (type = "DOUBLE", "BIGINT" or "DATE")', which a --table user cannot write anywhere, and without naming the flag.
    Now the flag as typed is refused, and the hint gives --type TABLE.COL=DOUBLE."""
    err = _refused(capsys, ["--table", "t=c.csv", "--bounds", "t.v=0:100"])
    assert "--bounds t.v=0:100 is refused: bounds for 't.v' need a numeric (or date/timestamp) column, but it is VARCHAR (table t: c.csv)" in err
    assert "--type t.v=DOUBLE" in err and 'type = "DOUBLE"' not in err and "nothing was charged" in err
    # both flags on the column are named; the declared type then answers
    err = _refused(capsys, ["--table", "t=c.csv", "--bounds", "t.v=0:100", "--bins", "t.v=0:100:10"])
    assert "--bounds t.v=0:100 and --bins t.v=0:100:10 are refused" in err
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "--table", "t=c.csv", "--privacy-unit", "t=uid", "--type", "t.v=DOUBLE",
                "--bounds", "t.v=0:100", "query", "SELECT SUM(v) AS s FROM t", "--epsilon", "1"]) == 0


def test_bounds_on_a_parquet_text_column_do_not_offer_the_type_flag(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Parquet column carries its own type (--type is refused for it): the hint is to drop the flag, not --type."""
    pq.write_table(pa.table({"uid": [1, 2], "s": ["a", "b"]}), "s.parquet")
    err = _refused(capsys, ["--table", "t=s.parquet", "--bounds", "t.s=0:1"])
    assert "--bounds t.s=0:1 is refused: bounds for 't.s' need a numeric (or date/timestamp) column, but it is VARCHAR (table t: s.parquet)" in err
    assert "--type" not in err and "--domain t.s=A,B,C" in err


def test_bins_on_a_boolean_column_hint_the_domain_flag_not_a_python_mapping(files: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """--bins on a BOOLEAN column was refused with the Python API's fix, "columns={'b': {'domain': [False, True]}}"
    (which _cli_text did not translate: only a domain written [...] was). Now: the flag, and --domain t.b=false,true
    (and a config's refusal gives domain = [false, true], the TOML)."""
    err = _refused(capsys, ["--table", "t=p.parquet", "--bins", "t.b=0:1:2"])
    assert "--bins t.b=0:1:2 is refused: bins for 't.b' need a numeric (or date/timestamp) column, but it is BOOLEAN (table t: p.parquet)" in err
    assert "--domain t.b=false,true" in err and "columns={" not in err
    from dpsql.cli import _cli_text

    text = _cli_text("hint: drop the bins of 'b' (declare its public domain, columns={'b': {'domain': [False, True]}}, ...)")
    assert "columns={" not in text and "domain = [false, true] under [tables.T.columns.b]" in text


def test_a_date_grid_on_a_numeric_column_names_the_flags(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--bins t.x=2024-01-01:2024-02-01:31 on a DOUBLE column was refused with the config's fix only ('bounds = [0,
    100] with bins = 100, or, in a CSV file, its type with the grid (type = "DATE")'). Now the flag, and --bins with
    numbers (and, for a CSV column, --type ...=DATE)."""
    err = _refused(capsys, ["--table", "t=p.parquet", "--bins", "t.x=2024-01-01:2024-02-01:31"])
    assert "--bins t.x=2024-01-01:2024-02-01:31 is refused" in err and "is DOUBLE" in err
    assert "--bins t.x=0:100:100" in err and "bounds = [0, 100]" not in err and "--type" not in err
    err = _refused(capsys, ["--table", "t=c.csv", "--type", "t.v=DOUBLE", "--bins", "t.v=2024-01-01:2024-02-01:31"])
    assert "--type t.v=DATE" in err


def test_too_many_bins_are_refused_naming_the_flag(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--bins t.d=2024-01-01:2024-02-01:5000000 was refused as "bins for 't.d' must be between 1 and 4,194,304", with
    the hint '--bins TABLE.d=0:120:121': a numeric grid for a DATE column, under a placeholder table name. Now the
    flag as typed is refused, with a grid of the same column (one bin per day for dates)."""
    err = _refused(capsys, ["--table", "t=p.parquet", "--bins", "t.d=2024-01-01:2024-02-01:5000000"])
    assert "--bins t.d=2024-01-01:2024-02-01:5000000 is refused: N must be at most 4,194,304" in err
    assert "--bins t.d=2024-01-01:2024-02-01:31" in err and "TABLE." not in err
    err = _refused(capsys, ["--table", "t=p.parquet", "--bins", "t.x=0:100:4194305"])
    assert "--bins t.x=0:100:4194305 is refused" in err and "--bins t.x=0:100:1000" in err


def test_date_bounds_are_pointed_to_the_bins_flag(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--bounds t.d=2024-01-01:2024-12-31 was refused as "'2024-01-01' is not a number" with the hint '--bounds
    events.amount=0:100', though a DATE column's range is declared with --bins on the command line. Now the
    refusal says so, with the --bins flag that declares it (one bin per day); that flag then answers MIN(d)."""
    err = _refused(capsys, ["--table", "t=p.parquet", "--bounds", "t.d=2024-01-01:2024-12-31"])
    assert "--bounds takes numbers" in err and "--bins t.d=2024-01-01:2024-12-31:365" in err
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "--table", "t=p.parquet", "--privacy-unit", "t=uid", "--bins",
                "t.d=2024-01-01:2024-12-31:365", "query", "SELECT MIN(d) AS m FROM t", "--epsilon", "1"]) == 0


def test_a_numeric_bounds_flag_still_answers(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: a --bounds of numbers on a numeric column is unchanged."""
    assert run(["--ledger", "l.duckdb", "--table", "t=p.parquet", "--privacy-unit", "t=uid", "--bounds", "t.x=0:10",
                "query", "SELECT SUM(x) AS s FROM t", "--epsilon", "1"]) == 0


def test_the_readme_says_a_lock_time_out_exits_75() -> None:
    """README's ledger section said a ledger held past lock_timeout gives 'a LedgerError (exit 4)', while the CLI
    exits 75 (LedgerBusyError, EX_TEMPFAIL), as its --help and the README's exit codes say: a job that retries on 75
    would have been written to give up. Now the ledger section says 75 too."""
    from dpsql.errors import LedgerBusyError, LedgerError

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert "then a `LedgerError` (exit 4)" not in readme
    assert "then a `LedgerBusyError` (a `LedgerError`; exit 75" in readme
    assert issubclass(LedgerBusyError, LedgerError) and LedgerBusyError("x").exit_code == 75


def test_reuse_synopsis_and_an_option_reuse_that_says_otherwise_are_refused(files: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--reuse-synopsis set the option reuse to 'synopsis' over whatever --option reuse=... said: with --option
    reuse=never (run DAWA afresh, charged) the answer came from the stored synopsis, for free, exit 0. The two
    contradict each other: now a usage error, nothing charged; either one alone is as before."""
    Path("wl.sql").write_text("SELECT COUNT(*) FROM t WHERE x < 2;\nSELECT COUNT(*) FROM t WHERE x >= 2\n")
    argv = ["--ledger", "l.duckdb", "--table", "t=p.parquet", "--privacy-unit", "t=uid", "--bins", "t.x=0:4:4"]
    assert run([*argv, "query", "-f", "wl.sql", "--workload", "--epsilon", "1"]) == 0  # stores a synopsis
    sql = "SELECT COUNT(*) AS n FROM t WHERE x < 3"
    capsys.readouterr()
    assert run([*argv, "query", sql, "--epsilon", "1", "--reuse-synopsis", "--option", "reuse=never"]) == 2
    err = capsys.readouterr().err
    assert "--reuse-synopsis and --option reuse=never contradict each other" in err and "nothing was charged" in err
    assert run([*argv, "query", sql, "--epsilon", "1", "--reuse-synopsis"]) == 0  # (negative control: free)
    assert "dawa (reused synopsis); cost: epsilon=0" in capsys.readouterr().err
    assert run([*argv, "query", sql, "--epsilon", "1", "--option", "reuse=never"]) == 0  # charged afresh
    assert "reused" not in capsys.readouterr().err
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 2


def test_caps_given_to_a_public_table_are_refused(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-groups p=5 (or --max-rows) for a table declared --public was dropped without a word (`dpsql tables` listed
    p as public, no caps), though such a flag is most often meant for another table. Now it is refused, naming the
    flags; caps on the table of people are as before."""
    argv = ["--ledger", "l.duckdb", "--table", "t=p.parquet", "--privacy-unit", "t=uid", "--table", "p=c.csv", "--public", "p"]
    capsys.readouterr()
    assert run([*argv, "--max-groups", "p=5", "--max-rows", "P=2", "tables"]) == 2
    err = capsys.readouterr().err
    assert "--max-groups p=5 and --max-rows p=2 are refused: --public p declares a table that holds no person" in err
    assert run([*argv, "--max-groups", "t=5", "tables"]) == 0
    assert "t: privacy unit uid; max_groups_per_unit 5" in capsys.readouterr().out


def test_bounds_and_bins_declaring_two_ranges_for_one_column_are_refused(files: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """--bounds t.x=0:10 with --bins t.x=0:100:10 (in either order): the grid's bounds replaced the declared ones
    without a word, so SUM(x) was clamped to [0, 100], with ten times the noise asked for, and `dpsql describe` showed
    bounds [0, 100]. Now two different ranges for one column are refused; one range given by both flags is as before."""
    argv = ["--ledger", "l.duckdb", "--table", "t=p.parquet", "--privacy-unit", "t=uid"]
    sql = ["query", "SELECT SUM(x) AS s FROM t", "--epsilon", "1"]
    for flags in (["--bounds", "t.x=0:10", "--bins", "t.x=0:100:10"], ["--bins", "t.x=0:100:10", "--bounds", "t.x=0:10"]):
        capsys.readouterr()
        assert run([*argv, *flags, *sql]) == 2
        err = capsys.readouterr().err
        assert "--bounds t.x=0:10 and --bins t.x=0:100:10 declare two different bounds for column 'x'" in err
        assert "--bins t.x=0:10:10" in err and "nothing was charged" in err
    assert run([*argv, "--bounds", "T.X=0:10.0", "--bins", "t.x=0:10:10", *sql]) == 0
    assert run([*argv, "--bounds", "t.x=0:10", "--bins", "t.x=0:10:10", "describe", "t"]) == 0
    assert "x DOUBLE: bounds [0.0, 10.0]" in capsys.readouterr().out
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 1


def test_a_reason_without_set_total_is_refused(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dpsql budget --reason "quarterly top-up"` (the --set-total forgotten, or lost to an unset variable) printed the
    budget and exited 0, the total unchanged: a script read that as the change made. Now a usage error saying that
    nothing was changed; with --set-total the change is made as before."""
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--reason", "quarterly top-up"]) == 2
    err = capsys.readouterr().err
    assert "--reason is the reason of a change of the total, and no --set-total was given: nothing was changed" in err
    assert run(["--ledger", "l.duckdb", "budget", "--set-total", "12", "0", "--reason", "quarterly top-up"]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--history", "--format", "json"]) == 0
    changes = json.loads(capsys.readouterr().out)["total_changes"]
    assert [c["reason"] for c in changes][-1] == "quarterly top-up" and len(changes) == 2


@pytest.mark.parametrize("name", ["e.csv", "e.parquet"])
def test_a_source_of_zero_bytes_is_an_input_not_there_yet(files: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """A table's source of 0 bytes (the moment a job has created the file and not yet written it) exited 2 ('is empty',
    'not a Parquet file': running it again fails again), where the same file a moment later, its Parquet header there
    but no footer, or a .csv.gz cut short, exits 66 (a scheduler retries). Now 0 bytes is a 66 too, saying so; a
    gzip file written whole that holds no line, a file that is not Parquet, or a marker of 0 bytes that a glob matches
    (Spark's _SUCCESS: tests/test_cli_source_files.py), stays a 2."""
    Path(name).write_bytes(b"")
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "--table", f"t={name}", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) FROM t",
                "--epsilon", "1"]) == 66
    assert "is empty (0 bytes" in capsys.readouterr().err
    import gzip

    Path("z.csv.gz").write_bytes(gzip.compress(b""))
    Path("x.parquet").write_text("uid\n1\n")
    for other in ("z.csv.gz", "x.parquet"):
        assert run(["--ledger", "l.duckdb", "--table", f"t={other}", "--privacy-unit", "t=uid", "tables"]) == 2


def test_an_option_refused_by_the_owners_policy_names_the_flag(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--option max_groups_per_unit=10 above the registered cap (a PolicyError), or --option max_rows_per_unit=5 on a
    GROUP BY, was refused as 'option max_groups_per_unit=10 is above the cap ...': only refusals worded by the
    option's bare name ('tau must be ...') were said as the flag typed. Now these name '--option KEY=VALUE' too."""
    argv = ["--ledger", "l.duckdb", "--table", "t=p.parquet", "--privacy-unit", "t=uid", "--max-groups", "t=2",
            "--domain", "t.b=false,true", "query", "SELECT b, COUNT(*) AS n FROM t GROUP BY b", "--epsilon", "1"]
    for option in ("max_groups_per_unit=10", "max_rows_per_unit=5"):
        capsys.readouterr()
        assert run([*argv, "--option", option]) == 2
        assert capsys.readouterr().err.startswith(f"error: {'PolicyError' if 'groups' in option else 'ConfigError'}: "
                                                  f"--option {option} is refused: option ")
    capsys.readouterr()
    assert run([*argv, "--option", "tau=2", "--option", "q=0.5"]) == 2  # 'option(s) ['q'] do not apply to ...'
    assert "--option tau=2 and --option q=0.5 are refused: option(s) ['q', 'tau']" in capsys.readouterr().err
    assert run([*argv, "--option", "rank_target=3"]) == 2
    assert "--option rank_target=3 is refused: unknown option(s) ['rank_target']" in capsys.readouterr().err
    assert run([*argv, "--option", "max_groups_per_unit=1"]) == 0  # (negative control: a lower cap is the caller's)


def test_a_grid_on_a_column_with_a_time_zone_is_hinted_in_flags(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--bins on a TIMESTAMPTZ column was refused with the Python API's and the config's fix ("cast an Arrow column to
    pa.timestamp('us') ... or declare type = "TIMESTAMP" for a CSV column"). Now the flag is named, and for a CSV
    column --type ...=TIMESTAMP, which then answers."""
    Path("z.csv").write_text("uid,ts\n1,2024-01-01 00:00:00\n")
    argv = ["--table", "t=z.csv", "--bins", "t.ts=2024-01-01:2024-02-01:31"]
    err = _refused(capsys, [*argv, "--type", "t.ts=TIMESTAMPTZ"])
    assert "--bins t.ts=2024-01-01:2024-02-01:31 and --type t.ts=TIMESTAMPTZ are refused" in err
    assert "--type t.ts=TIMESTAMP," in err and "pa.timestamp" not in err and 'type = "TIMESTAMP"' not in err
    assert run(["--ledger", "l.duckdb", "--privacy-unit", "t=uid", *argv, "--type", "t.ts=TIMESTAMP", "tables"]) == 0


@pytest.mark.parametrize("flag", ["--public", "--allow-conditional-sampling"])
def test_an_empty_table_name_of_a_flag_is_refused(files: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """`--public "$LOOKUP"` (or --allow-conditional-sampling) with the variable unset was dropped without a word, exit
    0, where an empty --table, -o, --meta or -f is refused. Now it is refused too, naming the flag."""
    argv = ["--ledger", "l.duckdb", "--table", "t=p.parquet", "--privacy-unit", "t=uid"]
    capsys.readouterr()
    assert run([*argv, flag, "", "tables"]) == 2
    assert f"{flag} is empty: it names no table" in capsys.readouterr().err
    named = ["--table", "p=c.csv", "--public", "p"] if flag == "--public" else [flag, "t"]  # (negative control)
    assert run([*argv, *named, "tables"]) == 0
