"""The CLI for ETL scripts: output format from -o, JSON rows + meta, --meta, Parquet metadata,
machine-readable budget history, --reason, --version, -f -, --domain/--bins, tables, CLI-worded hints."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_events
from conftest import run_cli as run

from dpsql.cli import _cli_text

REPO = Path(__file__).resolve().parents[1]
CFG = ["--config", "examples/dpsql.toml"]
Q = "SELECT country, COUNT(*) AS n FROM events GROUP BY country"


def _spent(capsys: pytest.CaptureFixture[str]) -> float:
    capsys.readouterr()
    assert run([*CFG, "budget", "--format", "json"]) == 0
    return float(json.loads(capsys.readouterr().out)["spent"]["epsilon"])


@pytest.mark.parametrize("name,check", [
    ("out.parquet", lambda p: pq.read_table(p).num_rows == 20),
    ("out.csv", lambda p: p.read_text().splitlines()[0].replace('"', "") == "country,n"),
    ("out.json", lambda p: len(json.loads(p.read_text())["rows"]) == 20),
    ("out.txt", lambda p: p.read_text().startswith("country")),
])
def test_format_follows_the_extension(workdir, capsys, name, check):
    out = workdir / name
    assert run([*CFG, "query", Q, "--epsilon", "0.2", "--delta", "1e-6", "-o", str(out)]) == 0
    assert check(out)


@pytest.mark.parametrize("extra", [["-o", "out.xlsx"], ["-o", "out"], ["-o", "out.csv", "--format", "json"],
                                   ["--format", "parquet"], ["--meta", "no/such/dir/meta.json"]])
def test_bad_output_is_refused_before_any_charge(workdir, capsys, extra):
    # the example ledger does not exist yet: create it by a first free command
    assert run([*CFG, "budget"]) == 0
    assert run([*CFG, "query", Q, "--epsilon", "0.2", "--delta", "1e-6", *extra]) == 2
    assert "hint:" in capsys.readouterr().err
    assert _spent(capsys) == 0


def test_json_meta_and_parquet_metadata(workdir, capsys):
    assert run([*CFG, "query", Q, "--epsilon", "0.2", "--delta", "1e-6", "--format", "json", "--meta", "m.json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    meta = doc["meta"]
    assert meta["mechanism"] == "sparse_histogram" or meta["mechanism"] in ("gaussian", "laplace")
    assert meta["ledger_id"] == 1 and meta["cost"]["epsilon"] == 0.2
    assert meta["remaining"]["epsilon"] == pytest.approx(10 - 0.2)
    assert "n" in meta["accuracy"] and meta["columns"] == ["country", "n"]
    assert json.loads((workdir / "m.json").read_text()) == meta
    assert run([*CFG, "query", Q, "--epsilon", "0.2", "--delta", "1e-6", "-o", "r.parquet"]) == 0
    pmeta = json.loads(pq.read_schema(workdir / "r.parquet").metadata[b"dpsql"])
    assert pmeta["ledger_id"] == 2 and pmeta["cost"]["epsilon"] == 0.2


def test_budget_history_machine_readable_and_set_total_needs_a_reason(workdir, capsys):
    assert run([*CFG, "query", Q, "--epsilon", "0.2", "--delta", "1e-6"]) == 0
    capsys.readouterr()
    assert run([*CFG, "budget", "--history", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith('"entry_id"')
    assert run([*CFG, "budget", "--set-total", "20", "1e-5"]) == 2
    assert "--reason" in capsys.readouterr().err
    # the owner's config may only record the total it declares; the owner changes the ledger itself
    assert run([*CFG, "budget", "--set-total", "20", "1e-5", "--reason", "new quarter"]) == 2
    assert run(["--ledger", "examples/example_ledger.duckdb", "budget", "--set-total", "20", "1e-5",
                "--reason", "new quarter"]) == 0
    capsys.readouterr()
    # the config still declares the old total: the ledger's recorded total wins only on purpose
    assert run(["--ledger", "examples/example_ledger.duckdb", "budget", "--history", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"]["epsilon"] == 20 and len(doc["entries"]) == 1
    assert [c["reason"] for c in doc["total_changes"]][-1] == "new quarter"


def test_version_stdin_tables_domain_and_bins(workdir, capsys, monkeypatch):
    assert run(["--version"]) == 0
    assert capsys.readouterr().out.startswith("dpsql ")
    data = workdir / "ev.parquet"
    t = make_events()
    pq.write_table(t, data)
    led = str(workdir / "l.duckdb")
    assert run(["init", "--epsilon", "5", "--delta", "1e-5", "--ledger", led]) == 0
    flags = ["--ledger", led, "--table", f"ev={data}", "--privacy-unit", "ev=user_id",
             "--domain", "ev.country=US,FR,DE", "--bins", "ev.amount=0:100:10"]
    monkeypatch.setattr("sys.stdin", io.StringIO("SELECT country, COUNT(*) AS n FROM ev GROUP BY country"))
    capsys.readouterr()
    assert run([*flags, "query", "-f", "-", "--epsilon", "1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["country"] for r in out["rows"]] == ["DE", "FR", "US"]  # the declared domain, every key
    assert out["meta"]["mechanism"] == "laplace"
    assert run([*flags, "explain", "SELECT amount, COUNT(*) FROM ev GROUP BY amount", "--epsilon", "1"]) == 0
    assert "dawa" in capsys.readouterr().out
    assert run([*flags, "tables", "--format", "json"]) == 0
    desc = json.loads(capsys.readouterr().out)["ev"]
    assert desc["privacy_unit"] == "user_id" and desc["columns"]["country"]["domain"] == ["US", "FR", "DE"]
    assert run([*flags, "--bins", "ev.x=0:1", "tables"]) == 2
    assert "--bins expects" in capsys.readouterr().err


def test_hints_speak_in_flags_and_config_keys():
    assert "--option tau=10" in _cli_text("hint: e.g. options={'tau': 10}")
    text = _cli_text("hint: register('events', ..., max_groups_per_unit=5, max_rows_per_group=1)")
    assert "[tables.events]" in text and "--max-groups events=5" in text and "register(" not in text
    assert "--set-total" in _cli_text("hint: use Ledger.set_total(Budget(...))")
    assert "--bounds TABLE.COL=LO:HI" in _cli_text("hint: write SUM(LEAST(GREATEST(expr, lo), hi)) with literal bounds, "
                                                   "or declare the columns' bounds")


def test_describe_one_table_and_explain_release_chances(workdir, capsys):
    assert run([*CFG, "describe", "events", "--format", "json"]) == 0
    desc = json.loads(capsys.readouterr().out)
    assert list(desc) == ["events"] and desc["events"]["columns"]["age"]["ordered"]["bins"] == 120
    assert run([*CFG, "describe", "nope"]) == 2
    assert "dpsql tables lists them" in capsys.readouterr().err
    assert run([*CFG, "explain", "SELECT url, COUNT(*) FROM events GROUP BY url", "--epsilon", "1", "--delta", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert "chance that a group is released" in out and "50%" in out  # at n = tau* the chance is one half


def test_describe_lists_the_columns_and_their_types(workdir, capsys):
    """An analyst writes queries against the column types (a TIMESTAMPTZ key is refused, a text compared with a
    number is refused): `describe` lists every column and its type, not only those the policy declares."""
    assert run([*CFG, "describe", "events", "--format", "json"]) == 0
    desc = json.loads(capsys.readouterr().out)["events"]
    assert desc["schema"]["user_id"] == "BIGINT" and desc["schema"]["country"] == "VARCHAR"
    assert run([*CFG, "describe", "events"]) == 0
    out = capsys.readouterr().out
    assert "  country VARCHAR: domain [" in out and "  user_id BIGINT\n" in out, out


def test_suggest_caps_from_the_command_line(workdir, capsys):
    assert run([*CFG, "suggest-caps", "events", "--group-by", "country", "--epsilon", "0.3", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["meta"]["parameters"]["suggested"]) == {"max_rows_per_unit", "max_groups_per_unit", "max_rows_per_group"}
    assert doc["meta"]["cost"]["epsilon"] == 0.3 and doc["rows"][0]["contribution"] == "rows per person"
