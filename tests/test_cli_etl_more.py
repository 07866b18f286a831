"""More of the command line as an ETL job meets it: a --ledger that names some other file, CSV column types on the
command line, a --reference to a table that is not there, --help into a pipe whose reader has gone, a misspelt column
in a per-table flag. Bad input spends no budget and leaves nothing behind."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import child_env
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


@pytest.mark.parametrize("command,kind", [("query", "parquet"), ("query", "text"), ("query", "empty"), ("query", "duckdb"),
                                          ("budget", "parquet"), ("budget", "duckdb")])
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


def test_a_ledger_variable_naming_another_file_says_so(here: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`DPSQL_LEDGER=notes.txt` in a job's environment: the refusal says the variable named it, and how to fix that."""
    p = _other_file("text")
    monkeypatch.setenv("DPSQL_LEDGER", str(p))
    assert run(["budget"]) == 4
    err = capsys.readouterr().err
    assert "(named by $DPSQL_LEDGER)" in err and "point $DPSQL_LEDGER at your ledger file" in err, err
    assert not Path(".notes.txt.queue").exists()


def test_a_ledger_still_keeps_its_queue_file(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The negative control: a real ledger's own side files are made and kept as before."""
    assert run(["--ledger", "l.duckdb", "budget"]) == 0
    assert Path(".l.duckdb.queue").exists() and Path(".l.duckdb.generation").exists()


# -- 2. CSV column types on the command line --------------------------------------------------------------------------

def test_a_csv_column_type_is_declared_with_a_flag(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CSV columns are VARCHAR unless typed; the type could be declared only in a config file, so a job with --table had
    no way to SUM a CSV column. `--type NAME.COL=TYPE`, spelled as --bounds and --domain are."""
    flags = ["--ledger", "l.duckdb", "--table", "s=s.csv", "--privacy-unit", "s=user_id", "--type", "s.amount=DOUBLE",
             "--type", "s.day=DATE", "--bounds", "s.amount=0:10"]
    assert run([*flags, "describe", "s", "--format", "json"]) == 0
    schema = json.loads(capsys.readouterr().out)["s"]["schema"]
    assert schema == {"user_id": "VARCHAR", "amount": "DOUBLE", "day": "DATE"}
    assert run([*flags, "query", "SELECT SUM(amount) AS total FROM s", "--epsilon", "0.5", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["column_types"] == ["double"]
    assert run(["--ledger", "l.duckdb", "--table", "s=s.csv", "--privacy-unit", "s=user_id", "describe", "s",
                "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["s"]["schema"]["amount"] == "VARCHAR"  # the control: untyped is text


def test_the_type_flag_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["query", "--help"]) == 0
    assert "--type NAME.COL=TYPE" in capsys.readouterr().out
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "--type NAME.COL=TYPE" in readme


@pytest.mark.parametrize("flag,says", [
    ("s.amount=dbl", ["--type s.amount=dbl", "'dbl' is not a column type", "DOUBLE", "DECIMAL(p,s)"]),
    ("s.amont=DOUBLE", ["--type s.amont=DOUBLE", "column 'amont'", "does not have", "user_id, amount, day"]),
    ("s.amount=", ["--type s.amount=", "names no type", "--type s.amount=DOUBLE"]),
    ("s=DOUBLE", ["--type expects NAME.COL=TYPE", "--type s.COLUMN=DOUBLE"]),
    ("t.amount=DOUBLE", ["--type t.amount=DOUBLE", "no --table t=PATH", "registered with --table: s"]),
    ("e.x=DOUBLE", ["--type e.x=DOUBLE", "CSV", "Parquet"]),
])
def test_a_refused_type_flag_names_the_flag_and_the_fix(here: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                                        says: list[str]) -> None:
    argv = ["--ledger", "l.duckdb", "--table", "s=s.csv", "--privacy-unit", "s=user_id", "--type", flag]
    if flag.startswith("e."):
        argv = ["--ledger", "l.duckdb", "--table", "e=e.parquet", "--privacy-unit", "e=user_id", "--type", flag]
    assert run([*argv, "query", "SELECT COUNT(*) FROM s", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in says), err
    assert "Traceback" not in err and "register(" not in err and "columns={" not in err
    assert _entries(capsys) == []


def test_a_config_that_registers_tables_refuses_the_type_flag(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The owner's config declares its tables' types; an analyst's --type would change what a column holds."""
    Path("c.toml").write_text('[ledger]\npath = "l.duckdb"\n[tables.s]\nsource = "s.csv"\nprivacy_unit = "user_id"\n')
    assert run(["--config", "c.toml", "--type", "s.amount=DOUBLE", "tables"]) == 2
    assert "--type cannot be combined with a config that registers tables" in capsys.readouterr().err


# -- 3. a --reference to a table that is not registered ---------------------------------------------------------------

@pytest.fixture
def orders(here: Path) -> list[str]:
    pq.write_table(pa.table({"o_id": list(range(30)), "o_custkey": [i % 10 for i in range(30)]}), "orders.parquet")
    pq.write_table(pa.table({"c_custkey": list(range(10))}), "customer.parquet")
    return ["--ledger", "l.duckdb", "--table", "orders=orders.parquet"]


@pytest.mark.parametrize("command", [["query", "SELECT COUNT(*) FROM orders", "--epsilon", "0.1"],
                                     ["explain", "SELECT COUNT(*) FROM orders", "--epsilon", "0.1"], ["tables"]])
def test_a_reference_to_a_table_not_registered_is_refused_before_anything(orders: list[str], command: list[str],
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--reference orders.o_custkey=customer.c_custkey` without `--table customer=...`: `tables` listed the reference
    as if it held, and a query was refused only as it was planned, as a PolicyError in the Python API's words."""
    assert run([*orders, "--reference", "orders.o_custkey=customer.c_custkey", *command]) == 2
    err = capsys.readouterr().err
    first, _, hint = err.partition("\nhint: ")
    assert "--reference orders.o_custkey=customer.c_custkey" in first and "'customer'" in first, err
    assert "registered with --table: orders" in first, err
    assert "--table customer=PATH" in hint and "Traceback" not in err and "PolicyError" not in err
    assert _entries(capsys) == []
    # checked with the arguments, before the ledger is opened: a missing ledger is not what is said first
    assert run([*orders, "--ledger", "gone.duckdb", "--reference", "orders.o_custkey=customer.c_custkey", *command][2:]) == 2
    assert "--reference" in capsys.readouterr().err and not Path("gone.duckdb").exists()


def test_a_misspelt_reference_target_is_offered_the_registered_name(orders: list[str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*orders, "--table", "customer=customer.parquet", "--privacy-unit", "customer=c_custkey",
            "--reference", "orders.o_custkey=custmer.c_custkey"]
    assert run([*argv, "query", "SELECT COUNT(*) FROM orders", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "'custmer'" in err and "customer" in err.partition("hint: ")[2], err
    assert _entries(capsys) == []
    argv[-1] = "orders.o_custkey=customer.c_custkey"  # the control: the reference holds once its target is there
    assert run([*argv, "query", "SELECT COUNT(*) FROM orders", "--epsilon", "0.1"]) == 0
    assert len(_entries(capsys)) == 1


# -- 4. --help and --version into a pipe whose reader has gone -------------------------------------------------------

def _pipe_without_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    os.close(r)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.FileIO(w, "w"), encoding="utf-8"))


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["query", "--help"]])
def test_help_into_a_pipe_whose_reader_left_exits_0(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`dpsql --help | head -1`, `dpsql --help | grep -q -- --type`: the reader may leave before the help is written;
    that is no failure (exit 0, nothing on stderr), as the help is for whoever still reads it."""
    with monkeypatch.context() as m:
        _pipe_without_reader(m)
        assert run(argv) == 0
        sys.stdout.close()  # the interpreter's last flush: nothing is left to fail
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_help_that_cannot_be_written_is_an_error(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`dpsql --help > /dev/full`: exit 0, the help lost. A write that fails for another reason than a reader gone is
    exit 1 with a line on stderr; a closed standard output (>&-) is a usage error, as for every other command."""
    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", open("/dev/full", "w", encoding="utf-8"))  # noqa: SIM115
        code = run(argv)
        sys.stdout.close()
    err = capsys.readouterr().err
    assert code == 1 and "error: writing stdout failed" in err and os.strerror(errno.ENOSPC) in err, err
    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", None)
        code = run(argv)
    err = capsys.readouterr().err
    assert code == 2 and "standard output is closed" in err and "usage:" not in err, err


def test_help_into_a_closed_pipe_in_a_process(tmp_path: Path) -> None:
    """The same in a process of its own: nothing on stderr at the interpreter's exit ('Exception ignored ... Broken
    pipe'), and the exit code is 0."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "dpsql", "--help"], stdout=w, stderr=subprocess.PIPE, text=True,
                           env=child_env(), timeout=60, cwd=tmp_path)
    finally:
        os.close(w)
    assert p.returncode == 0 and p.stderr == "", p.stderr


# -- more: what a job meets ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,says", [
    (["--privacy-unit", "e=usr_id"], "--privacy-unit e=usr_id"),
    (["--privacy-unit", "e=user_id", "--bounds", "e.y=0:1"], "--bounds e.y=0:1"),
    (["--privacy-unit", "e=user_id", "--domain", "e.y=1,2"], "--domain e.y=1,2"),
    (["--privacy-unit", "e=user_id", "--bins", "e.y=0:10:10"], "--bins e.y=0:10:10"),
])
def test_a_missing_column_of_a_table_flag_names_the_flag(here: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                                         says: str) -> None:
    """`--privacy-unit e=usr_id` was 'table 'e': privacy unit column 'usr_id' does not exist', `--bounds e.y=0:1`
    'declared column 'y' does not exist': neither said which flag to change."""
    assert run(["--ledger", "l.duckdb", "--table", "e=e.parquet", *flags, "query", "SELECT COUNT(*) FROM e",
                "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert says in err.splitlines()[0] and "user_id, x" in err, err
    assert _entries(capsys) == []


def test_a_flag_naming_a_table_not_given_lists_the_tables(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--privacy-unit f=user_id` (a typo of e): 'options name table 'f' but no --table f=PATH was given', with no word
    of which option, nor of the tables that were given."""
    assert run(["--ledger", "l.duckdb", "--table", "e=e.parquet", "--privacy-unit", "f=user_id", "query",
                "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--privacy-unit f=user_id" in err and "registered with --table: e" in err, err
    assert _entries(capsys) == []


def test_a_directory_of_files_is_hinted_as_a_quoted_glob_flag(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--table e=parts` (a directory of part files): 'pass a glob of its files, e.g. 'parts/*.parquet'', not a flag."""
    Path("parts").mkdir()
    pq.write_table(pa.table({"user_id": [1, 2]}), "parts/a.parquet")
    assert run(["--ledger", "l.duckdb", "--table", "e=parts", "--privacy-unit", "e=user_id", "query",
                "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "--table e='parts/*.parquet'" in err, err
    assert run(["--ledger", "l.duckdb", "--table", "e=parts/*.parquet", "--privacy-unit", "e=user_id", "query",
                "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 0  # the hint, followed, works
    assert len(_entries(capsys)) == 1


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM events", "SELECT COUNT(*) FROM e JOIN f ON e.user_id = f.user_id"])
def test_a_query_of_a_table_not_given_is_hinted_with_the_flags(here: Path, capsys: pytest.CaptureFixture[str],
                                                               sql: str) -> None:
    """'table 'events' is not registered (registered tables: e); register it with a privacy unit first', and no hint of
    how, on the command line."""
    assert run(["--ledger", "l.duckdb", "--table", "e=e.parquet", "--privacy-unit", "e=user_id", "query", sql,
                "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    name = "events" if "events" in sql else "f"
    assert f"--table {name}=PATH --privacy-unit {name}=COLUMN" in err and "(registered tables: e)" in err, err
    assert _entries(capsys) == []


def test_a_table_path_under_the_home_directory(here: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`--table "e=~/data/e.parquet"` (quoted, or --table=e=~/...: no shell expands the ~) was 'no file matches
    '~/data/e.parquet'', where --ledger ~/... and a config's source = "~/..." are read from the home directory."""
    home = here / "home"
    (home / "data").mkdir(parents=True)
    os.replace("e.parquet", home / "data" / "e.parquet")
    monkeypatch.setenv("HOME", str(home))
    assert run(["--ledger", "l.duckdb", "--table=e=~/data/e.parquet", "--privacy-unit", "e=user_id", "query",
                "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 0, capsys.readouterr().err
    assert len(_entries(capsys)) == 1


def test_a_busy_ledger_says_what_to_do_once(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger held past --lock-timeout (another job, `flock`): the hint read 'retry later or try again when the other
    dpsql command has finished, ...', the retry said twice."""
    import fcntl

    fd = os.open("l.duckdb", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert run(["--ledger", "l.duckdb", "--lock-timeout", "0.2", "budget"]) == 75
    finally:
        os.close(fd)
    hint = capsys.readouterr().err.partition("hint: ")[2]
    assert hint.startswith("try again when the other dpsql command has finished, or wait longer with --lock-timeout"), hint


def test_a_source_without_an_extension_is_hinted_with_the_flag(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--table e=export` (a Parquet file saved without its extension): 'cannot tell the format', hinted 'use a .parquet
    or .csv file', which did not say that the name decides, nor how to give one."""
    os.replace("e.parquet", "export")
    assert run(["--ledger", "l.duckdb", "--table", "e=export", "--privacy-unit", "e=user_id", "query",
                "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 2
    hint = capsys.readouterr().err.partition("hint: ")[2]
    assert "--table e" in hint and ".parquet" in hint and "ln -s" in hint, hint
    assert _entries(capsys) == []


def test_init_over_a_file_that_is_no_ledger_says_so(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dpsql init --ledger data.parquet`: refused, as it must be, but hinted 'open the existing ledger with --ledger
    PATH', which that file is not."""
    p = _other_file("parquet")
    data = p.read_bytes()
    assert run(["init", "--ledger", str(p), "--epsilon", "1"]) == 4
    err = capsys.readouterr().err
    assert "is not a ledger" in err and "open the existing ledger" not in err and "choose a new path" in err, err
    assert p.read_bytes() == data and sorted(os.listdir(".")) == sorted([".l.duckdb.generation", "data.parquet", "e.parquet",
                                                                         "l.duckdb", "s.csv"])
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "1"]) == 4  # the control: a ledger is the existing ledger
    assert "open the existing ledger" in capsys.readouterr().err


def test_a_config_reference_to_a_table_it_does_not_register_is_refused_first(orders: list[str],
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The same in the owner's config (`references = { o_custkey = "customer.c_custkey" }`, no [tables.customer]): the
    command line cannot add the table, so the reference never holds; `tables` listed it."""
    Path("c.toml").write_text('[ledger]\npath = "l.duckdb"\n[tables.orders]\nsource = "orders.parquet"\n'
                              'references = { o_custkey = "customr.c_custkey" }\n[tables.customer]\n'
                              'source = "customer.parquet"\nprivacy_unit = "c_custkey"\n')
    assert run(["--config", "c.toml", "tables"]) == 2
    err = capsys.readouterr().err
    assert "[tables.orders] references 'customr.c_custkey'" in err and "did you mean 'customer'" in err, err
    Path("c.toml").write_text(Path("c.toml").read_text().replace("customr", "customer"))  # the control
    assert run(["--config", "c.toml", "query", "SELECT COUNT(*) FROM orders", "--epsilon", "0.1"]) == 0


def test_a_csv_separated_by_semicolons_is_said_to_be(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An export of a ';' locale: 'privacy unit column 'user_id' does not exist; its columns are: user_id;amount',
    which left the reader to spot the separator."""
    Path("semi.csv").write_text("user_id;amount\n1;2,5\n")
    assert run(["--ledger", "l.duckdb", "--table", "s=semi.csv", "--privacy-unit", "s=user_id", "tables"]) == 2
    hint = capsys.readouterr().err.partition("hint: ")[2]
    assert "header is one column holding ';'" in hint and "comma-separated" in hint, hint
    assert run(["--ledger", "l.duckdb", "--table", "s=s.csv", "--privacy-unit", "s=usr_id", "tables"]) == 2
    assert "one column" not in capsys.readouterr().err  # the control: a header of several columns
