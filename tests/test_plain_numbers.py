"""Numbers typed as text (CLI flags, config values, strings given to the Python API) are read only
in plain decimal or scientific notation. Python's float() also reads '1_0' (as 10), ' 1', '１０'
(full-width digits) and 'infinity': a typo for 1.0 must not spend ten times the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli as run

import dpsql
from dpsql.budget import is_plain_number
from dpsql.errors import ConfigError

CFG = ["--config", "examples/dpsql.toml"]
NOT_PLAIN = ["1_0", " 1", "1 ", "\uff11\uff10", "0x10", "infinity", "1e1_0", "+1_0.5", "1__0", "\u0661"]


def _spent(capsys: pytest.CaptureFixture[str]) -> float:
    capsys.readouterr()
    assert run([*CFG, "budget", "--format", "json"]) == 0
    return float(json.loads(capsys.readouterr().out)["spent"]["epsilon"])


@pytest.mark.parametrize("text", ["1", "-1", "+1", "1.0", "1.", ".5", "1e-6", "1E+3", "0", "-0.0", "1e400", "1e-400"])
def test_plain_spellings_are_numbers(text: str) -> None:
    assert is_plain_number(text)


@pytest.mark.parametrize("text", [*NOT_PLAIN, "inf", "nan", "-inf", "", ".", "e5", "1e", "1/3", "1.0.0"])
def test_other_spellings_are_not(text: str) -> None:
    assert not is_plain_number(text)


@pytest.mark.parametrize("argv", [
    ["--epsilon", "1_0"], ["--epsilon", " 1"], ["--epsilon", "\uff11"], ["--epsilon", "infinity"],
    ["--epsilon", "0.1", "--delta", "1_0e-6"],
])
def test_query_number_flags_refuse_other_spellings(workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", *argv]) == 2
    err = capsys.readouterr().err
    flag = "--delta" if "--delta" in argv else "--epsilon"
    assert f"{flag} " in err and "plain decimal or scientific notation" in err and "hint:" in err, err
    assert _spent(capsys) == 0


def test_suggest_caps_quantile_refuses_other_spellings(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CFG, "suggest-caps", "events", "--epsilon", "1", "--quantile", "0_9"]) == 2
    err = capsys.readouterr().err
    assert "--quantile" in err and "plain decimal or scientific notation" in err, err
    assert _spent(capsys) == 0


def test_init_refuses_other_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "1_0"]) == 2
    assert "--epsilon" in capsys.readouterr().err
    assert not Path("l.duckdb").exists()


def test_set_total_refuses_other_spellings(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, "budget", "--set-total", "1_0", "1e-5", "--reason", "x"]) == 2
    err = capsys.readouterr().err
    assert "--set-total" in err and "plain decimal or scientific notation" in err, err
    assert run([*CFG, "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["epsilon"] == 10.0


@pytest.mark.parametrize("flag,value", [
    ("--bounds", "e.x=0:1_00"), ("--bins", "e.x=0:10:1_0"), ("--max-groups", "e=1_0"), ("--max-rows", "e=\uff12"),
    ("--max-table-rows", "e=1_000"),
])
def test_per_table_flags_refuse_other_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"user_id": [1, 2, 3], "x": [1.0, 2.0, 3.0]}), "e.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    capsys.readouterr()
    base = ["--table", "e=e.parquet", "--privacy-unit", "e=user_id", "--ledger", "l.duckdb"]
    assert run([*base, flag, value, "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {value} is refused" in err and "plain decimal or scientific notation" in err, err
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0


@pytest.mark.parametrize("opt", ["tau=1_0", "q=0_5", "max_rows_per_unit=\uff12", "sigma=infinity"])
def test_option_values_refuse_other_spellings(workdir: Path, capsys: pytest.CaptureFixture[str], opt: str) -> None:
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "--option", opt]) == 2
    err = capsys.readouterr().err
    assert f"--option {opt} is refused" in err and "plain decimal or scientific notation" in err, err
    assert _spent(capsys) == 0


@pytest.mark.parametrize("old,new", [
    ("epsilon = 10.0", "epsilon = 1_0"), ("delta = 1e-5", "delta = 1_0e-6"), ("epsilon = 10.0", "epsilon = 0xa"),
    ("max_groups_per_unit = 5", "max_groups_per_unit = 5_0"), ("bounds = [0, 100]", "bounds = [0, 1_00]"),
    ("bounds = [0, 100]", 'bounds = [0, "1_00"]'), ("bins = 120", "bins = 1_20"), ("bins = 120", "bins = 0o170"),
])
def test_config_numbers_refuse_other_spellings(workdir: Path, capsys: pytest.CaptureFixture[str], old: str, new: str) -> None:
    cfg = workdir / "examples" / "dpsql.toml"
    text = cfg.read_text()
    assert old in text
    cfg.write_text(text.replace(old, new, 1))
    assert run([*CFG, "tables"]) == 2
    err = capsys.readouterr().err
    assert "plain decimal or scientific notation" in err and "hint:" in err, err
    assert not (workdir / "examples" / "example_ledger.duckdb").exists()


def test_config_underscores_inside_strings_and_comments_are_text(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only number literals are judged: a key, a string or a comment holding 1_0 is left alone."""
    cfg = workdir / "examples" / "dpsql.toml"
    cfg.write_text(cfg.read_text().replace("tau = 1", 'tau = 1  # 1_0 = [2_0]\nversion = "v1_0, 2_0"')
                   .replace("[tables.events.columns.age]", "[tables.events.columns.col_1_0]\nbounds = [0, 1]\n\n"
                            "[tables.events.columns.age]"))
    assert run([*CFG, "tables"]) == 2  # judged as far as the column, which the table lacks
    err = capsys.readouterr().err
    assert "declared column 'col_1_0' does not exist" in err and "plain" not in err, err


@pytest.mark.parametrize("make", [
    lambda: dpsql.Budget("1_0"), lambda: dpsql.Budget(1.0, "1_0e-6"), lambda: dpsql.Budget(" 1"),
    lambda: dpsql.Budget("\uff11"),
])
def test_python_api_budget_strings(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="plain decimal or scientific notation"):
        make()


def test_python_api_budget_plain_strings_still_read() -> None:
    assert dpsql.Budget("1.5", "1e-6") == dpsql.Budget(1.5, 1e-6)


@pytest.mark.parametrize("kwargs", [
    {"max_groups_per_unit": "1_0"}, {"max_rows_per_group": "\uff12"},
    {"columns": {"x": {"bounds": ["0", "1_0"]}}}, {"columns": {"x": {"bounds": [0, 10], "granularity": "0_1"}}},
    {"columns": {"x": {"bounds": [0, 10], "bins": "1_0"}}}, {"columns": {"x": {"bounds": [0, 10], "bin_width": "1_0"}}},
])
def test_python_api_register_strings(tmp_path: Path, kwargs: dict) -> None:  # type: ignore[type-arg]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"user_id": [1, 2, 3], "x": [1.0, 2.0, 3.0]}), tmp_path / "e.parquet")
    with dpsql.Session(ledger=None, budget=dpsql.Budget(1.0)) as s:
        with pytest.raises(ConfigError, match="plain decimal or scientific notation"):
            s.register("e", str(tmp_path / "e.parquet"), privacy_unit="user_id", **kwargs)
        assert s.remaining().epsilon == 1.0


@pytest.mark.parametrize("value", ["1_0", " 1", "\uff11"])
def test_python_api_decimal_domain_strings(tmp_path: Path, value: str) -> None:
    """Decimal() reads '1_0' as 10 too: a DECIMAL column's domain given as text takes plain notation."""
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"user_id": [1, 2], "d": pa.array([Decimal("1.00"), Decimal("10.00")], pa.decimal128(6, 2))}),
                   tmp_path / "e.parquet")
    with dpsql.Session(ledger=None, budget=dpsql.Budget(1.0)) as s:
        with pytest.raises(ConfigError, match="plain decimal or scientific notation"):
            s.register("e", str(tmp_path / "e.parquet"), privacy_unit="user_id", columns={"d": {"domain": ["1.5", value]}})
        s.register("e", str(tmp_path / "e.parquet"), privacy_unit="user_id", columns={"d": {"domain": ["1.5", "10"]}})
