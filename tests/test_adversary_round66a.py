"""The command line as an ETL job meets it: an output that the next run would read as rows of a private table when
reached through a symbolic link, and refusals whose hints were not in the command line's terms.

Findings (each test says what was wrong and what is right now):

* ``-o link/out.parquet`` with ``--table 't=data/*.parquet'`` (``link`` a symbolic link to ``data``), or the other
  way round, was written after the charge, and the next run read it as rows of the table: the check that refuses an
  output matching a table's glob compared the paths as typed. It now compares them with links resolved too, as the
  output is written at its real path and the glob lists it there; refused before the charge.
* ``--option reuse=x`` was refused with the hint ``e.g. --option --reuse-synopsis`` (no such flag form);
  ``--option degree_caps=5`` with a Python dict ``{'orders.o_custkey': 16}`` that ``--option`` cannot read (no hint);
  ``--option clip_negative=maybe`` with ``--option clip_negative=True``; ``--option tau`` (no ``=``), ``tau=abc``,
  ``sigma=-1``, ``tau_star=x``, ``epsilon_split=2`` with no hint at all; ``--option mechanism=nope`` did not name
  the flag. Each hint is now the flag as typed.
* A config's ``[engine] threads = 0`` (also ``debug``, ``min_response_time``, ``invalid_text``), ``bounds = [5, 1]``,
  ``domain = []`` and ``domain = "US"`` were refused with no hint; the hint now names the config key (and the flag).

What held (kept as passing tests): neighbouring CSV files whose one differing person's line is malformed (an
unterminated quote, too few or too many fields, bytes that are not UTF-8, a NUL, a lone carriage return, a number
that overflows a double) give the same exit code and the same standard error for a query and for explain (zero
noise), the rows differing only by that person's released contribution.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

from dpsql import cli


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    """A working directory with data/a.parquet (60 people), link -> data, and a fresh ledger l.duckdb."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    (tmp_path / "data").mkdir()
    (tmp_path / "other").mkdir()
    pq.write_table(pa.table({"uid": list(range(60)), "g": [i % 3 for i in range(60)]}), "data/a.parquet")
    os.symlink("data", "link")
    os.symlink("other", "elsewhere")
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "5"]) == 0
    capsys.readouterr()
    return tmp_path


def _entries(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--history", "--format", "json"]) == 0
    return list(json.loads(capsys.readouterr().out)["entries"])


def _query(table: str, *extra: str) -> list[str]:
    return ["--ledger", "l.duckdb", "--table", f"t={table}", "--privacy-unit", "t=uid", "query",
            "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.5", *extra]


@pytest.mark.parametrize(("source", "out"), [("data/*.parquet", "link/out.parquet"), ("link/*.parquet", "data/out.parquet")])
def test_an_output_matching_the_glob_through_a_link_is_refused_before_the_charge(
        here: Path, capsys: pytest.CaptureFixture[str], source: str, out: str) -> None:
    """Was: written after the charge (exit 0), and the next run read it as a part file of the table. Now: refused,
    naming the pattern, with nothing charged and nothing written."""
    assert run(_query(source, "-o", out)) == 2
    err = capsys.readouterr().err
    assert "matches the source pattern" in err and "nothing was charged" in err and "hint:" in err, err
    assert sorted(os.listdir("data")) == ["a.parquet"]
    assert _entries(capsys) == []


def test_an_output_through_a_link_to_another_directory_is_written(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: a link to a directory outside the pattern is no part of the table."""
    assert run(_query("data/*.parquet", "-o", "elsewhere/out.parquet")) == 0, capsys.readouterr().err
    assert pq.read_table("other/out.parquet").column_names == ["n"]
    assert sorted(os.listdir("data")) == ["a.parquet"]
    assert [e["status"] for e in _entries(capsys)] == ["released"]


def _refusal(capsys: pytest.CaptureFixture[str], *option: str) -> str:
    capsys.readouterr()
    rc = run(_query("data/*.parquet", *option))
    err = capsys.readouterr().err
    assert rc == 2, err
    return err


@pytest.mark.parametrize(("option", "hint"), [
    ("reuse=x", "hint: e.g. --reuse-synopsis"),
    ("clip_negative=maybe", "hint: e.g. --option clip_negative=true"),
    ("degree_caps=5", """hint: e.g. --option 'degree_caps={"orders.o_custkey": 16}'"""),
    ("tau", "hint: e.g. --option tau=10"),
    ("tau=abc", "hint: e.g. --option tau=10"),
    ("sigma=-1", "hint: e.g. --option sigma=2.0"),
    ("tau_star=x", "hint: e.g. --option tau_star=10.0"),
    ("epsilon_split=2", "hint: e.g. --option epsilon_split=0.5"),
])
def test_an_option_refusal_hints_the_flag_as_typed(here: Path, capsys: pytest.CaptureFixture[str], option: str, hint: str) -> None:
    """Was: '--option --reuse-synopsis', a Python literal --option cannot read, 'True', or no hint. Now the flag."""
    err = _refusal(capsys, "--option", option)
    assert hint in err, err
    assert "--option --" not in err and "options={" not in err, err
    assert _entries(capsys) == []


def test_the_degree_caps_hint_is_read_by_the_flag(here: Path) -> None:
    """The JSON of the hint is what --option reads into a mapping (the Python literal stayed text)."""
    assert cli._option_value('{"orders.o_custkey": 16}') == {"orders.o_custkey": 16}
    assert cli._option_value("{'orders.o_custkey': 16}") == "{'orders.o_custkey': 16}"


def test_an_unknown_mechanism_names_the_flag(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refusal(capsys, "--option", "mechanism=nope")
    assert err.startswith("error: ConfigError: --option mechanism=nope is refused: unknown mechanism 'nope'"), err


def test_an_option_given_well_is_charged(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: the hinted spellings are accepted."""
    assert run(_query("data/*.parquet", "--option", "clip_negative=true", "--option", "mechanism=laplace")) == 0
    assert [e["status"] for e in _entries(capsys)] == ["released"]


CONFIG = '[ledger]\npath = "l.duckdb"\n[tables.t]\nsource = "data/a.parquet"\nprivacy_unit = "uid"\n'


@pytest.mark.parametrize(("extra", "hint"), [
    ("[engine]\nthreads = 0\n", "hint: threads = 4"),
    ("[engine]\ndebug = \"yes\"\n", "hint: debug = false"),
    ("[engine]\nmin_response_time = \"x\"\n", "hint: min_response_time = 0.5"),
    ("[engine]\ninvalid_text = \"drop\"\n", 'hint: invalid_text = "null"'),
    ("[tables.t.columns.g]\nbounds = [5, 1]\n", "hint: e.g. --bounds TABLE.g=0:100 (or [tables.T.columns] in the config)"),
    ("[tables.t.columns.g]\ndomain = []\n", "domain = [...] under [tables.T.columns.g]"),
    ("[tables.t.columns.g]\ndomain = \"1\"\n", "domain = [...] under [tables.T.columns.g]"),
])
def test_a_config_refusal_hints_the_key(here: Path, capsys: pytest.CaptureFixture[str], extra: str, hint: str) -> None:
    """Was: refused with no hint. Now the hint names the config key to write."""
    Path("c.toml").write_text(CONFIG + extra)
    for command in (["tables"], ["query", "SELECT COUNT(*) FROM t", "--epsilon", "0.5"]):
        capsys.readouterr()
        assert run(["--config", "c.toml", *command]) == 2
        err = capsys.readouterr().err
        assert hint in err, err
    assert _entries(capsys) == []


def test_a_good_config_is_charged(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: the config as hinted."""
    Path("c.toml").write_text(CONFIG + "[engine]\nthreads = 1\n[tables.t.columns.g]\ndomain = [0, 1, 2]\n")
    assert run(["--config", "c.toml", "query", "SELECT g, COUNT(*) AS n FROM t GROUP BY g", "--epsilon", "0.5"]) == 0
    assert [e["status"] for e in _entries(capsys)] == ["released"]


# --- neighbouring CSV files: what the analyst observes is the same but for the released values ---

ROWS = "uid,name,amount\n" + "".join(f"{i},n{i % 3},{i % 20}\n" for i in range(80))
ODD = {"unterminated_quote": b'999,"abc,5\n', "few_fields": b"999\n", "many_fields": b"999,a,5,x,y\n",
       "not_utf8": b"999,\xff\xfe,5\n", "nul": b"999,a\x00b,5\n", "lone_cr": b"999,a\rb,5\n", "overflow": b"999,a,1e400\n"}


@pytest.fixture
def zero(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.testing import use_noise, zero_noise

    opened = cli._open_session

    def opening(args: Any, **kw: Any) -> Any:
        s = opened(args, **kw)
        use_noise(s, zero_noise())
        return s

    monkeypatch.setattr(cli, "_open_session", opening)


def _observed(d: Path, body: bytes, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    d.mkdir()
    monkeypatch.chdir(d)
    (d / "t.csv").write_bytes(body)
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "5"]) == 0
    flags = ["--ledger", "l.duckdb", "--table", "t=t.csv", "--privacy-unit", "t=uid", "--type", "t.amount=DOUBLE",
             "--bounds", "t.amount=0:20"]
    seen = []
    for command in (["explain", "SELECT name, SUM(amount) AS s FROM t GROUP BY name", "--epsilon", "1", "--delta", "1e-6"],
                    ["query", "SELECT COUNT(*) AS n, SUM(amount) AS s FROM t", "--epsilon", "1", "--format", "csv"]):
        capsys.readouterr()
        rc = run([*flags, *command])
        out, err = capsys.readouterr()
        seen.append((rc, re.sub(r"_dpsql_src_t_[0-9a-f]+", "_dpsql_src_t", out if command[0] == "explain" else err)))
    return seen


@pytest.mark.parametrize("odd", sorted(ODD))
def test_a_malformed_line_of_one_person_changes_nothing_but_released_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, zero: None, odd: str) -> None:
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    d = _observed(tmp_path / "d", ROWS.encode(), capsys, monkeypatch)
    d2 = _observed(tmp_path / "d2", ROWS.encode() + ODD[odd], capsys, monkeypatch)
    assert d == d2
    assert [rc for rc, _ in d] == [0, 0]


def test_a_config_that_is_not_toml_gets_a_hint(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A TOML syntax error was refused with the reader's message and no hint line; it now says how to fix it."""
    (here / "bad.toml").write_text('[tables.t\npath = "x"\n')
    assert run(["--config", "bad.toml", "query", "--epsilon", "1", "SELECT COUNT(*) FROM t"]) == 2
    err = capsys.readouterr().err
    assert "is not valid TOML" in err and "hint: fix the line named" in err


def test_a_ledger_in_a_missing_directory_names_the_flag(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``dpsql init --ledger nodir/l.duckdb`` said "create the directory first or choose another path" without naming
    how the command line chooses it; it now names --ledger and the config's [ledger] path, and creates nothing."""
    assert run(["--ledger", "nodir/l.duckdb", "init", "--epsilon", "1"]) != 0
    err = capsys.readouterr().err
    assert "does not exist" in err and "--ledger" in err and "[ledger] path" in err
    assert not (here / "nodir").exists()
