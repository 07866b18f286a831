"""Bad values on the command line and in the config: each refusal names the flag or key in the
caller's terms and the fix, exits 2, and charges nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli as run

CFG = ["--config", "examples/dpsql.toml"]


def _spent(capsys: pytest.CaptureFixture[str]) -> float:
    capsys.readouterr()
    assert run([*CFG, "budget", "--format", "json"]) == 0
    return float(json.loads(capsys.readouterr().out)["spent"]["epsilon"])


@pytest.mark.parametrize("flag,value,words", [
    ("--delta", "-1e-5", "--delta -1e-5 is refused: --delta must be a number in [0, 1)"),
    ("--delta", "-inf", "--delta -inf is refused: --delta must be a number in [0, 1)"),
    ("--epsilon", "-1e-3", "--epsilon -1e-3 is refused: --epsilon must be a finite number > 0"),
    ("--epsilon", "-inf", "--epsilon -inf is refused: --epsilon must be a finite number > 0"),
])
def test_negative_numbers_are_judged_as_numbers(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                flag: str, value: str, words: str) -> None:
    """argparse takes '-1e-5' for an option ('expected one argument'): the value reaches the budget check."""
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    args = ["--epsilon", "0.1", flag, value] if flag == "--delta" else [flag, value]
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "expected one argument" not in err and "hint:" in err
    assert _spent(capsys) == 0


@pytest.mark.parametrize("argv,words", [
    (["--epsilon", "1e-400"], "--epsilon 1e-400 is refused: it underflows to 0"),
    (["--epsilon", "1e400"], "--epsilon 1e400 is refused: it overflows to infinity"),
    (["--epsilon", "nan"], "--epsilon nan is refused: --epsilon must be a finite number > 0"),
    (["--epsilon", "0.1", "--delta", "1e-400"], "--delta 1e-400 is refused: it underflows to 0"),
    (["--epsilon", "0.1", "--delta", "NaN"], "--delta NaN is refused: --delta must be a number in [0, 1)"),
])
def test_a_refused_number_is_quoted_as_typed_with_the_reason(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                             argv: list[str], words: str) -> None:
    """--epsilon 1e-400 was reported as 'got 0.0': a value the user never typed, and no reason."""
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "got 0.0" not in err and "hint: give" in err and err.startswith("error: ConfigError"), err
    assert _spent(capsys) == 0


@pytest.mark.parametrize("argv,words", [
    (["init", "--epsilon", "1e-400"], "--epsilon 1e-400 is refused: it underflows to 0"),
    (["init", "--epsilon", "1", "--delta", "1e-400"], "--delta 1e-400 is refused: it underflows to 0"),
    (["suggest-caps", "events", "--epsilon", "1", "--quantile", "1e-400"], "--quantile 1e-400 is refused: it underflows"),
    (["suggest-caps", "events", "--epsilon", "1", "--quantile", "nan"], "--quantile nan is refused"),
])
def test_init_and_suggest_caps_numbers_are_quoted_as_typed(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                           argv: list[str], words: str) -> None:
    assert run(["--ledger", "l.duckdb", *argv]) == 2 if argv[0] == "init" else run([*CFG, *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "hint: give" in err, err
    assert not Path("l.duckdb").exists() and not Path("examples/example_ledger.duckdb").exists()


def test_set_total_that_underflows_is_refused_and_keeps_the_total(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--set-total 1e-400 0 used to set the total to 0 without a word."""
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, "budget", "--set-total", "1e-400", "1e-5", "--reason", "x"]) == 2
    err = capsys.readouterr().err
    assert "--set-total 1e-400 1e-5 is refused: 1e-400: it underflows to 0" in err
    assert run([*CFG, "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["epsilon"] == 10.0


def test_values_after_a_double_dash_are_left_alone() -> None:
    from dpsql.cli import _attach_negative_values

    assert _attach_negative_values(["query", "--epsilon", "-1e-3", "--", "--delta", "-1e-3"]) == [
        "query", "--epsilon=-1e-3", "--", "--delta", "-1e-3"]
    assert _attach_negative_values(["query", "--epsilon", "-x"]) == ["query", "--epsilon", "-x"]


@pytest.mark.parametrize("line,key", [("epsilon = inf", "epsilon"), ("epsilon = -1.0", "epsilon"),
                                      ('epsilon = "ten"', "epsilon"), ("epsilon = 1.0\ndelta = 1.5", "delta")])
def test_a_bad_total_in_the_config_names_the_ledger_section_not_a_flag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], line: str, key: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("c.toml").write_text(f'[ledger]\npath = "l.duckdb"\n{line}\ncreate_if_missing = true\n')
    assert run(["--config", "c.toml", "budget"]) == 2
    err = capsys.readouterr().err
    assert "[ledger]" in err and f"{key} must be" in err and "--epsilon" not in err and f"{key} = " in err
    assert not Path("l.duckdb").exists()


def test_a_missing_source_in_a_config_says_where_relative_paths_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "c.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n'
                                              '[tables.t]\nsource = "t.parquet"\nprivacy_unit = "u"\n')
    monkeypatch.chdir(tmp_path)
    assert run(["--config", "conf/c.toml", "explain", "SELECT COUNT(*) FROM t", "--epsilon", "1"]) == 66  # a file not there (yet)
    err = capsys.readouterr().err
    assert str(tmp_path / "conf" / "t.parquet") in err and "config file's directory" in err


def test_a_directory_as_config_is_called_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    Path("conf").mkdir()
    assert run(["--config", "conf", "budget"]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "not found" not in err and "hint:" in err


@pytest.mark.parametrize("sql,words", [("SELECT COUNT(*) AS n, SUM(amount) AS s FROM events", "COUNT(*)"),
                                       ("SELECT AVG(amount) AS a FROM events", "AVG(amount)")])
def test_too_small_epsilon_names_the_aggregate_not_an_internal_column(
        workdir: Path, capsys: pytest.CaptureFixture[str], sql: str, words: str) -> None:
    assert run([*CFG, "query", sql, "--epsilon", "1e-300"]) == 2
    err = capsys.readouterr().err
    assert f"too small for {words}" in err and "__" not in err
    assert _spent(capsys) == 0


@pytest.mark.parametrize("hint,flag", [
    ("declare the key column's public domain with columns={'col': {'domain': [...]}}", "--domain TABLE.col=A,B,C"),
    ("register the key column with columns={'<col>': {'domain': [...]}}, or drop the GROUP BY", "--domain TABLE.<col>=A,B,C"),
    ("e.g. columns={'age': {'bounds': (0, 120), 'bins': 121}}", "--bins TABLE.age=0:120:121"),
])
def test_column_declarations_in_hints_become_flags_and_config_keys(hint: str, flag: str) -> None:
    from dpsql.cli import _cli_text

    text = _cli_text(hint)
    assert flag in text and "columns={" not in text and "[tables.T.columns." in text


def test_group_by_without_delta_hints_in_flags(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CFG, "query", "SELECT url, COUNT(*) FROM events GROUP BY url", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--delta 1e-6" in err and "--domain TABLE.col=A,B,C" in err and "columns={" not in err


@pytest.mark.parametrize("argv", [
    ["--degree-bound", "e.user_id=3", "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"],
    ["--max-table-rows", "e=-5", "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"],
    ["suggest-caps", "e", "--epsilon", "0.1", "--quantile", "2"],
    ["suggest-caps", "nope", "--epsilon", "0.1"],
    ["--reference", "e.user_id=x", "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"],
])
def test_flag_errors_of_ad_hoc_tables_hint_in_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"user_id": [1, 2, 3], "x": [1.0, 2.0, 3.0]}), "e.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    capsys.readouterr()
    assert run(["--table", "e=e.parquet", "--privacy-unit", "e=user_id", "--ledger", "l.duckdb", *argv]) == 2
    err = capsys.readouterr().err
    hint = err.split("hint:", 1)[1]
    assert "--" in hint and "={" not in hint and "Session" not in hint and "quantile=" not in hint, err


@pytest.mark.parametrize("kind", ["directory", "binary", "binary-stdin"])
def test_an_unreadable_sql_file_is_a_usage_error_naming_dash_f(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    import io

    assert run([*CFG, "budget"]) == 0
    Path("q").mkdir()
    Path("q.sql").write_bytes(b"\xff\xfeSELECT COUNT(*) FROM events")
    if kind == "binary-stdin":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfeSELECT"), encoding="utf-8"))
    path = {"directory": "q", "binary": "q.sql", "binary-stdin": "-"}[kind]
    capsys.readouterr()
    assert run([*CFG, "query", "-f", path, "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "-f" in err and "unexpected" not in err and "hint:" in err, err
    assert _spent(capsys) == 0


@pytest.mark.parametrize("flag", ["--bounds events.country=0:1", "--bins events.country=0:1:2", "--bounds events.action=0:5"])
def test_bounds_or_bins_on_a_text_column_are_refused_at_registration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """A histogram over bins declared on a VARCHAR column answered (and charged) all-zero counts."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copy(Path(__file__).resolve().parents[1] / "examples" / "events.parquet", "events.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    capsys.readouterr()
    argv = ["--table", "events=events.parquet", "--privacy-unit", "events=user_id", "--ledger", "l.duckdb", *flag.split()]
    col = flag.split(".")[1].split("=")[0]
    assert run([*argv, "query", f"SELECT {col}, COUNT(*) FROM events GROUP BY {col}", "--epsilon", "0.1", "--delta", "0"]) == 2
    err = capsys.readouterr().err
    assert f"'events.{col}' need a numeric" in err and "VARCHAR" in err and "hint:" in err
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0


def test_init_with_a_total_other_than_the_configs_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/dpsql.toml declares epsilon = 10, delta = 1e-5: a ledger created with another total
    would make every later command fail."""
    assert run([*CFG, "init", "--epsilon", "5"]) == 2
    err = capsys.readouterr().err
    assert "[ledger]" in err and "--epsilon 10.0 --delta 1e-05" in err
    assert not Path("examples/example_ledger.duckdb").exists()
    assert run([*CFG, "init", "--epsilon", "10", "--delta", "1e-5"]) == 0
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1"]) == 0


@pytest.mark.parametrize("dup", [
    ["--privacy-unit", "ev=user_id", "--privacy-unit", "ev=country"],
    ["--max-groups", "ev=3", "--max-groups", "ev=5"],
    ["--bounds", "ev.amount=0:100", "--bounds", "ev.amount=0:10"],
    ["--option", "max_rows_per_unit=1", "--option", "max_rows_per_unit=1"],
])
def test_a_flag_given_twice_for_one_name_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                    dup: list[str]) -> None:
    """Repeating a per-name flag is refused before the charge (it used to let the last one win)."""
    import pyarrow.parquet as pq
    from conftest import make_events

    data = workdir / "ev.parquet"
    pq.write_table(make_events(), data)
    led = str(workdir / "dup.duckdb")
    assert run(["init", "--epsilon", "2", "--delta", "1e-6", "--ledger", led]) == 0
    base = ["--ledger", led, "--table", f"ev={data}"]
    if dup[0] != "--privacy-unit":
        base += ["--privacy-unit", "ev=user_id"]
    flags, opts = ([], dup) if dup[0] == "--option" else (dup, [])
    capsys.readouterr()
    assert run([*base, *flags, "query", "SELECT COUNT(*) FROM ev", "--epsilon", "1", *opts]) == 2
    err = capsys.readouterr().err
    assert "is given twice for" in err and "hint: give" in err
    capsys.readouterr()
    assert run(["--ledger", led, "budget", "--format", "json"]) == 0
    assert float(json.loads(capsys.readouterr().out)["spent"]["epsilon"]) == 0
    # control: each flag once runs and charges
    assert run([*base, *flags[:2], "query", "SELECT COUNT(*) FROM ev", "--epsilon", "1", *opts[:2]]) == 0


@pytest.mark.parametrize("flag,value,words", [
    ("--max-groups", "e=0", "--max-groups e=0 is refused: --max-groups needs a whole number >= 1 or 'inf'"),
    ("--max-groups", "e=1e-400", "--max-groups e=1e-400 is refused: it underflows to 0"),
    ("--max-groups", "e=1e400", "--max-groups e=1e400 is refused: it overflows to infinity"),
    ("--max-rows", "e=nan", "--max-rows e=nan is refused: --max-rows needs a whole number >= 1 or 'inf'"),
    ("--bounds", "e.x=0:nan", "--bounds e.x=0:nan is refused: --bounds needs a finite number"),
    ("--bounds", "e.x=0:1e400", "--bounds e.x=0:1e400 is refused: it overflows to infinity"),
    ("--bounds", "e.x=5:1", "--bounds e.x=5:1 is refused: LO must be at most HI"),
    ("--bins", "e.x=0:10:0", "--bins e.x=0:10:0 is refused: --bins needs a whole number >= 1"),
    ("--bins", "e.x=10:0:5", "--bins e.x=10:0:5 is refused: LO must be below HI"),
    ("--max-table-rows", "e=0", "--max-table-rows e=0 is refused: --max-table-rows needs a whole number >= 1"),
])
def test_per_table_numbers_are_refused_in_the_flags_terms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str], flag: str, value: str,
                                                          words: str) -> None:
    """These used to answer in Python terms ('max_groups_per_unit for table ... or math.inf, got 0.0',
    'bounds for ... got (0.0, nan)', no hint), or to take 1e400 as unlimited."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"user_id": [1, 2, 3], "x": [1.0, 2.0, 3.0]}), "e.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    capsys.readouterr()
    base = ["--table", "e=e.parquet", "--privacy-unit", "e=user_id", "--ledger", "l.duckdb"]
    assert run([*base, flag, value, "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert words in err and "hint: e.g. " + flag in err and "math.inf" not in err and "got (" not in err, err
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0


def test_a_join_without_degree_bounds_hints_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"uid": [1, 2, 3]}), "u.parquet")
    pq.write_table(pa.table({"oid": [1, 2, 3], "uid": [1, 1, 2]}), "o.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    capsys.readouterr()
    argv = ["--ledger", "l.duckdb", "--table", "u=u.parquet", "--privacy-unit", "u=uid", "--table", "o=o.parquet",
            "--reference", "o.uid=u.uid", "query", "SELECT COUNT(*) FROM o JOIN u ON o.uid = u.uid", "--epsilon", "0.1"]
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert "--degree-bound TABLE.customer_id=64" in err and "degree_bounds={" not in err, err


def test_unlimited_caps_hint_the_per_query_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """With --max-groups/--max-rows inf the hint named only a config key, which --table users do not have."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"user_id": [1, 2, 3]}), "e.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    base = ["--table", "e=e.parquet", "--privacy-unit", "e=user_id", "--max-groups", "e=inf", "--max-rows", "e=inf",
            "--ledger", "l.duckdb", "explain", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]
    capsys.readouterr()
    assert run(base) == 2
    assert "--option max_rows_per_unit=5" in capsys.readouterr().err
    assert run([*base, "--option", "max_rows_per_unit=5"]) == 0  # the hint works


def test_table_names_differing_in_case_are_one_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--table t=a.parquet --table T=b.parquet registered both as 't', the second silently replacing the
    first (and --privacy-unit T=... was refused as naming no --table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"user_id": [1, 2, 3]}), "a.parquet")
    pq.write_table(pa.table({"uid": [1, 2]}), "b.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    capsys.readouterr()
    q = ["query", "SELECT COUNT(*) FROM t", "--epsilon", "0.1"]
    assert run(["--ledger", "l.duckdb", "--table", "t=a.parquet", "--table", "T=b.parquet", "--privacy-unit", "t=user_id",
                "--privacy-unit", "T=uid", *q]) == 2
    err = capsys.readouterr().err
    assert "--table is given twice for 't' (t=a.parquet and T=b.parquet)" in err and "case-insensitive" in err
    # one table spelled in two cases across flags is one table
    assert run(["--ledger", "l.duckdb", "--table", "T=a.parquet", "--privacy-unit", "t=user_id", "--bounds", "T.USER_ID=0:9",
                "describe", "t"]) == 0
    assert "user_id BIGINT: bounds" in capsys.readouterr().out
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0


def test_public_with_a_privacy_unit_hints_in_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"user_id": [1, 2, 3]}), "a.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "--table", "t=a.parquet", "--privacy-unit", "t=user_id", "--public", "t", "tables"]) == 2
    hint = capsys.readouterr().err.split("hint:", 1)[1]
    assert "--public" in hint and "--privacy-unit" in hint and "public=True" not in hint


def test_an_internal_error_class_is_named_by_its_public_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Two concurrent `dpsql init` on one path: the loser printed 'error: _AlreadyCreated: ...'."""
    from dpsql.ledger import Ledger, _store

    monkeypatch.chdir(tmp_path)

    def lost_race(path: object, total: object, *args: object, **kwargs: object) -> None:
        raise _store._AlreadyCreated("cannot create a ledger at l.duckdb: another process created one there just now")

    monkeypatch.setattr(Ledger, "create", staticmethod(lost_race))
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 4
    assert capsys.readouterr().err.startswith("error: LedgerError: cannot create a ledger")


@pytest.mark.parametrize("opt,words", [("q=1e-400", "--option q=1e-400 is refused: it underflows to 0"),
                                       ("max_rows_per_unit=1e400", "--option max_rows_per_unit=1e400 is refused: it overflows")])
def test_an_option_value_a_double_cannot_hold_is_quoted_as_typed(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                                 opt: str, words: str) -> None:
    """--option q=1e-400 was judged as 'got 0.0'."""
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "--option", opt]) == 2
    err = capsys.readouterr().err
    assert words in err and "got 0.0" not in err and "got inf" not in err, err
    assert _spent(capsys) == 0


@pytest.mark.parametrize("argv,words", [
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "--epsilon", "5"], "--epsilon is given twice (0.1 and 5)"),
    (["--ledger", "examples/example_ledger.duckdb", "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1",
      "--ledger", "other.duckdb"], "--ledger is given twice"),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "-o", "a.csv", "--output", "b.csv"], "--output is given twice"),
])
def test_a_one_value_flag_given_twice_is_a_usage_error(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                       argv: list[str], words: str) -> None:
    """argparse kept the last: --epsilon 0.1 ... --epsilon 5 charged 5."""
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run(["--config", "examples/dpsql.toml", *argv] if argv[0] != "--ledger" else argv) == 2
    assert words in capsys.readouterr().err
    assert _spent(capsys) == 0
    assert not Path("a.csv").exists() and not Path("b.csv").exists()


@pytest.mark.parametrize("stdin", [False, True])
def test_a_sql_file_with_a_byte_order_mark_is_read_as_sql(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch, stdin: bool) -> None:
    """A UTF-8 BOM (as Windows editors save) made -f fail with 'syntax error at line 1, col 14 near ('."""
    import io

    data = "\ufeffSELECT COUNT(*) AS n FROM events\r\n".encode()
    Path("q.sql").write_bytes(data)
    if stdin:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    assert run([*CFG, "budget"]) == 0
    assert run([*CFG, "explain", "-f", "-" if stdin else "q.sql", "--epsilon", "0.1"]) == 0


@pytest.mark.parametrize("line", ['epsilon = "10.0"', 'epsilon = 10.0\ndelta = "1e-5"'])
def test_a_total_written_as_text_in_the_config_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                          line: str) -> None:
    """[ledger] epsilon = "10.0" (a TOML string) was read as the number 10 (and delta = "1e-5" as 1e-5)."""
    cfg = workdir / "examples" / "dpsql.toml"
    text = cfg.read_text()
    cfg.write_text(text.replace("epsilon = 10.0\ndelta = 1e-5", line))
    assert run([*CFG, "budget"]) == 2
    err = capsys.readouterr().err
    assert "[ledger]" in err and "a number" in err and "quotes" in err and "hint:" in err, err
    assert not (workdir / "examples" / "example_ledger.duckdb").exists()  # nothing was created


def test_a_table_file_of_another_kind_is_refused_in_flag_terms(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--table t=data.txt (a name that is neither .parquet nor .csv, and no such file) said 'the
    Session has no DuckDB connection' with a hint about Session(connection=...)."""
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    assert run(["--ledger", "l.duckdb", "--table", "t=data.txt", "--privacy-unit", "t=user_id", "tables"]) == 2
    err = capsys.readouterr().err
    assert "Session" not in err and "connection" not in err and "--table" in err and ".parquet" in err, err


@pytest.mark.parametrize("values", [["abc", "1e-5"], ["1", "1"], ["nan", "0"]])
def test_a_bad_set_total_is_refused_as_such_before_the_ledger_is_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], values: list[str]) -> None:
    """With a ledger that is missing (a typo in --ledger), a bad --set-total was reported as the
    missing ledger (exit 4) and the bad numbers only on the next try."""
    monkeypatch.chdir(tmp_path)
    assert run(["--ledger", "missing.duckdb", "budget", "--set-total", *values, "--reason", "x"]) == 2
    err = capsys.readouterr().err
    assert "--set-total" in err and "no budget ledger" not in err, err


def test_a_config_saved_with_a_byte_order_mark_is_read(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config saved by a Windows editor (UTF-8 with a byte order mark) was 'not valid TOML:
    Invalid statement (at line 1, column 1)'."""
    cfg = workdir / "examples" / "dpsql.toml"
    cfg.write_bytes(b"\xef\xbb\xbf" + cfg.read_bytes().replace(b"\n", b"\r\n"))
    assert run([*CFG, "budget", "--format", "json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["total"]["epsilon"] == 10.0
