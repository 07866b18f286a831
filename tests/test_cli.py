"""The ``dpsql`` command line: help examples that run, output formats, stdout/stderr split,
exit codes (0 ok, 2 usage/query/config, 3 budget, 4 ledger, 5 failed after the charge, 1 other)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_events
from conftest import run_cli as run

from dpsql.budget import Budget, exact, float_at_least
from dpsql.cli import EXAMPLES, build_parser, main
from dpsql.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ("init", "query", "explain", "budget", "tables", "describe", "suggest-caps")


CFG = ["--config", "examples/dpsql.toml"]


# -- help and examples ---------------------------------------------------------------------------------------


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    raise AssertionError("no subcommands")


def test_every_subcommand_is_documented() -> None:
    subs = _subparsers()
    assert set(subs) == set(SUBCOMMANDS)
    assert set(EXAMPLES) == set(SUBCOMMANDS) | {"main"}
    top = build_parser().format_help()
    for name in SUBCOMMANDS:
        assert name in top


def _example_commands(help_text: str) -> list[str]:
    """The commands of the trailing 'example:' block (which must end the help)."""
    lines = help_text.rstrip().split("\n")
    idx = max(i for i, ln in enumerate(lines) if ln.strip() in ("example:", "examples:"))
    block = lines[idx + 1 :]
    assert block, "empty example block"
    assert all(ln.startswith("  dpsql ") for ln in block), block
    return [ln.strip() for ln in block]


@pytest.mark.parametrize("sub", [None, *SUBCOMMANDS])
def test_help_ends_with_an_example(sub: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--help"] if sub is None else [sub, "--help"]) == 0
    out = capsys.readouterr().out
    cmds = _example_commands(out)
    assert all(shlex.split(c)[0] == "dpsql" for c in cmds)
    if sub is not None:
        assert all(sub in shlex.split(c) for c in cmds)


def test_example_block_check_can_fail() -> None:
    with pytest.raises((AssertionError, ValueError)):
        _example_commands("usage: dpsql\n\noptions:\n  -h\n")
    with pytest.raises(AssertionError):
        _example_commands("example:\n  dpsql x\n\nmore text at the end\n")


@pytest.mark.parametrize("sub", ["main", *SUBCOMMANDS])
def test_every_help_example_runs(sub: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(([] if sub == "main" else [sub]) + ["--help"]) == 0
    for cmd in _example_commands(capsys.readouterr().out):
        argv = shlex.split(cmd)[1:]
        code = run(argv)
        captured = capsys.readouterr()
        assert code == 0, (cmd, captured.err)


def test_no_command_prints_help_and_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([]) == 2
    out, err = capsys.readouterr()
    assert "usage:" in err and out == ""  # `dpsql > out.csv` with the command missing leaves out.csv empty


# -- query / explain / budget ----------------------------------------------------------------------------------


def test_query_rows_on_stdout_cost_on_stderr(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sql = "SELECT country, COUNT(*) AS n FROM events GROUP BY country ORDER BY country"
    assert run([*CFG, "query", sql, "--epsilon", "0.5", "--delta", "1e-6", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["country"] for r in rows] == sorted(r["country"] for r in rows) and len(rows) == 20
    assert all(r["n"].lstrip("-").isdigit() for r in rows)
    assert "cost: epsilon=0.5 delta=1e-06" in err and "remaining: epsilon=9.5" in err
    assert "noise std" in err
    assert "epsilon" not in out


def test_a_release_warning_is_printed_on_stderr_and_kept_in_the_meta(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # the warning itself (a MIN above its MAX) is tested in test_quantile.py; here, that the CLI shows it
    from dpsql.mechanisms import quantile

    def crossed(aggs: Any, cols: Any, cal: Any, grouped: bool) -> Any:
        n = len(cols[aggs[0].name])
        return [(pa.array([True] * n), lambda flagged, shown: "MIN(amount) came out above MAX(amount) in 2 of 20 groups")]

    monkeypatch.setattr(quantile, "_min_above_max", crossed)
    sql = "SELECT country, MIN(amount) AS lo, MAX(amount) AS hi FROM events GROUP BY country"
    assert run([*CFG, "query", sql, "--epsilon", "0.5", "--format", "json", "-o", "out.json"]) == 0
    err = capsys.readouterr().err
    assert "warning: MIN(amount) came out above MAX(amount) in 2 of 20 groups" in err
    assert json.loads((workdir / "out.json").read_text())["meta"]["warnings"] == [
        "MIN(amount) came out above MAX(amount) in 2 of 20 groups"]


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "parquet"])
def test_output_formats_to_file(fmt: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = workdir / f"out.{fmt}"
    sql = "SELECT country, COUNT(*) AS n FROM events GROUP BY country"
    assert run([*CFG, "query", sql, "--epsilon", "0.2", "--delta", "1e-6", "--format", fmt, "-o", str(out_file)]) == 0
    assert capsys.readouterr().out == ""  # rows went to the file
    if fmt == "parquet":
        t = pq.read_table(out_file)
        assert t.column_names == ["country", "n"] and t.num_rows == 20
    elif fmt == "json":
        doc = json.loads(out_file.read_text())  # {"rows": [...], "meta": {...}}
        rows = doc["rows"]
        assert len(rows) == 20 and set(rows[0]) == {"country", "n"}
        assert doc["meta"]["ledger_id"] == 1 and doc["meta"]["cost"]["epsilon"] == 0.2
    elif fmt == "csv":
        assert out_file.read_text().splitlines()[0].replace('"', "") == "country,n"
    else:
        lines = out_file.read_text().splitlines()
        assert lines[0].split("|")[0].strip() == "country" and set(lines[1]) <= {"-", "+"}
        assert len(lines) == 22


def test_sql_from_file(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = workdir / "q.sql"
    f.write_text("-- total\nSELECT COUNT(*) AS n\nFROM events\n")
    assert run([*CFG, "query", "-f", str(f), "--epsilon", "0.1", "--format", "json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["rows"][0]) == ["n"]
    assert run([*CFG, "query", "SELECT 1", "-f", str(f), "--epsilon", "0.1"]) == 2
    assert run([*CFG, "query", "-f", str(workdir / "missing.sql"), "--epsilon", "0.1"]) == 66  # not there (yet)
    assert run([*CFG, "query", "--epsilon", "0.1"]) == 2


def test_explain_is_free_and_budget_history(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CFG, "explain", "SELECT url, COUNT(*) FROM events GROUP BY url", "--epsilon", "1", "--delta", "1e-6",
                "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # the charge is the request plus the sampler's floating-point delta (dpsql.noise section 3)
    fp = plan["parameters"]["fp_delta"]
    assert 0 < fp < 1e-10
    # (added exactly and rounded up under the ledger's rounding rule: never below the sum, and at most one
    # float above the least such, the calibrated delta plus fp being rounded up in binary first: dpsql/budget.py)
    up = float_at_least(exact(1e-6) + exact(fp))
    assert plan["mechanism"] == "sparse_histogram" and plan["cost"]["epsilon"] == 1.0
    assert plan["cost"]["delta"] in (up, math.nextafter(up, 1.0))
    assert run([*CFG, "budget"]) == 0
    out = capsys.readouterr().out
    assert "spent:     epsilon=0 delta=0" in out and "remaining: epsilon=10 delta=1e-05" in out
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.25"]) == 0
    capsys.readouterr()
    assert run([*CFG, "budget", "--history"]) == 0
    out = capsys.readouterr().out
    assert "remaining: epsilon=9.75" in out
    header = [c.strip() for c in out.splitlines()[4].split("|")]
    assert header[:3] == ["entry_id", "created_at", "status"] and "query" in header
    assert "SELECT COUNT(*) FROM events" in out and "released" in out


def test_options_on_either_side_of_the_subcommand(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", *CFG]) == 0
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1"]) == 0
    assert run([*CFG, "query", "SELECT url, COUNT(*) FROM events GROUP BY url", "--epsilon", "1", "--delta", "1e-6",
                "--option", "tau=3", "--option", "mechanism=sparse_histogram"]) == 0


def test_tables_from_flags_and_init(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = workdir / "ev.parquet"
    pq.write_table(make_events(), data)
    led = str(workdir / "flags.duckdb")
    flags = ["--ledger", led, "--table", f"ev={data}", "--privacy-unit", "ev=user_id", "--max-groups", "ev=3",
             "--max-rows", "ev=2", "--bounds", "ev.amount=0:100"]
    # no ledger yet: a ledger error, nothing created
    assert run([*flags, "query", "SELECT COUNT(*) FROM ev", "--epsilon", "1"]) == 4
    assert not Path(led).exists()
    assert run(["init", "--epsilon", "2", "--delta", "1e-6", "--ledger", led]) == 0
    assert "created ledger" in capsys.readouterr().err
    assert run(["init", "--epsilon", "2", "--ledger", led]) == 4  # never overwritten
    assert run([*flags, "query", "SELECT SUM(amount) AS s, AVG(amount) AS a FROM ev", "--epsilon", "1",
                "--format", "json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["rows"][0]) == {"s", "a"}
    # the ledger from the environment
    capsys.readouterr()
    import os

    os.environ["DPSQL_LEDGER"] = led
    try:
        assert run(["budget"]) == 0
        assert "remaining: epsilon=1 delta=1e-06" in capsys.readouterr().out
    finally:
        del os.environ["DPSQL_LEDGER"]


# -- exit codes ---------------------------------------------------------------------------------------------------

EXIT_CASES = [
    # usage errors (argparse)
    (["query"], 2),
    (["query", "SELECT COUNT(*) FROM events"], 2),  # --epsilon is required
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "abc"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--format", "xml"], 2),
    (["frobnicate"], 2),
    # query errors
    (["query", "SELECT * FROM events", "--epsilon", "1"], 2),
    (["query", "SELECT COUNT(*) FROM nosuch", "--epsilon", "1"], 2),
    (["query", "SELECT COUNT(*) FROM events JOIN events e2 USING (nosuch)", "--epsilon", "1"], 2),
    (["query", "SELECT COUNT(*) FROM", "--epsilon", "1"], 2),
    (["explain", "DROP TABLE events", "--epsilon", "1"], 2),
    (["query", "SELECT SUM(user_id) FROM events", "--epsilon", "1"], 2),
    (["query", "SELECT COUNT(*) FROM events WHERE url + 1 > 0", "--epsilon", "1"], 2),  # type error: free
    # config errors
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "nan"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "-1"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--delta", "1"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--option", "nosuch=1"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--option", "novalue"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--format", "parquet"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "-o", "/nonexistent-dir/out.csv"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "-o", "."], 2),
    (["budget", "--set-total", "abc", "1"], 2),
    (["budget", "--set-total", "-1", "0"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--table", "x=nope.parquet",
      "--privacy-unit", "x=user_id"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--table", "x=examples/events.parquet"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--table", "x=examples/events.parquet",
      "--privacy-unit", "x=user_id", "--max-groups", "x=abc"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--bounds", "x.amount=0:1"], 2),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--bounds", "events.amount=a:b"], 2),
    # budget exceeded
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "10.5"], 3),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--delta", "1e-4"], 3),
    # (exit code 5, DuckDB failing after the charge, is in test_errors_hide_cells_unless_debug)
]


@pytest.fixture(scope="module")
def shared_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of examples/ for all refused commands: none of them may spend anything."""
    d = tmp_path_factory.mktemp("cli_shared")
    shutil.copytree(REPO / "examples", d / "examples", ignore=shutil.ignore_patterns("*.duckdb*"))
    return d


@pytest.mark.parametrize("argv,code", EXIT_CASES, ids=[" ".join(c[0])[:70] for c in EXIT_CASES])
def test_exit_codes(argv: list[str], code: int, shared_workdir: Path, monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(shared_workdir)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    assert run([*CFG, *argv]) == code
    out, err = capsys.readouterr()
    if code == 3 or (code == 2 and argv[0] != "frobnicate" and "--epsilon" in argv and "abc" not in argv):
        assert err.strip(), "no message on stderr"
        assert "Traceback" not in err
    # refused commands spend nothing
    ledger = shared_workdir / "examples" / "example_ledger.duckdb"
    if ledger.exists():
        with Ledger.open(str(ledger)) as led:
            assert led.spent() == Budget(0.0, 0.0) and led.history().num_rows == 0


def test_ledger_errors_exit_4(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = workdir / "corrupt.duckdb"
    bad.write_bytes(b"not a ledger" * 100)
    before = bad.read_bytes()
    # the owner's config names the ledger (flags cannot replace an owner config's ledger)
    cfg = (workdir / "examples" / "dpsql.toml").read_text().replace('path = "example_ledger.duckdb"', f'path = "{bad}"')
    (workdir / "examples" / "corrupt.toml").write_text(cfg)
    for argv in (["budget"], ["query", "SELECT COUNT(*) FROM events", "--epsilon", "1"], ["init", "--epsilon", "1"]):
        assert run(["--config", "examples/corrupt.toml", *argv]) == 4
        assert "LedgerError" in capsys.readouterr().err
    assert run([*CFG, "--ledger", str(bad), "budget"]) == 2  # refused: the config is the owner's
    assert "cannot be combined with a config" in capsys.readouterr().err
    assert bad.read_bytes() == before
    assert run(["--ledger", str(workdir / "missing.duckdb"), "budget"]) == 4


Q1 = ["query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1"]


def _statuses() -> list[str]:
    with Ledger.open("examples/example_ledger.duckdb") as led:
        return [e["status"] for e in led.history().to_pylist()]


def test_a_failure_after_the_charge_exits_5_and_an_unexpected_one_before_it_exits_1(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An ETL script tells from the exit code whether budget was spent: exit 1 covered both an unexpected failure
    before any charge and a failure after the charge (the charge stands). A failure after the charge exits 5."""
    from dpsql.engine import Engine
    from dpsql.session import Session

    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:  # the engine's read of the bounded query fails, after the reserve
        m.setattr(Engine, "fetch_arrow", lambda self, ast, **kw: (_ for _ in ()).throw(RuntimeError("boom")))
        assert run([*CFG, *Q1]) == 5
    err = capsys.readouterr().err
    assert "ExecutionError" in err and "failed after its budget was charged; the charge stands" in err, err
    assert "Session" not in err and "boom" not in err
    assert _statuses() == ["failed"]
    with monkeypatch.context() as m:  # an unexpected failure (a bug) before the charge: nothing is spent
        m.setattr(Session, "_bind_check", lambda self, *a, **k: {}["missing"])
        assert run([*CFG, *Q1]) == 1
    err = capsys.readouterr().err
    assert "error: unexpected KeyError" in err and "charge stands" not in err, err
    assert _statuses() == ["failed"]
    with monkeypatch.context() as m:  # an unexpected failure (a bug) once the answer is charged: 5, and said so
        m.setattr("dpsql.cli._remaining_after", lambda s: {}["missing"])
        assert run([*CFG, *Q1]) == 5
    err = capsys.readouterr().err
    assert "error: unexpected KeyError after the query was answered; its charge stands (ledger entry 2)" in err, err
    assert _statuses() == ["failed", "released"]
    with monkeypatch.context() as m:  # the release cannot be recorded: the charge stands, the answer is not given
        from dpsql.errors import LedgerError
        from dpsql.ledger import _store

        def unrecorded(self: Any, entry_id: int, *a: Any, **k: Any) -> None:
            raise LedgerError(f"entry {entry_id} stays 'reserved': its release was not recorded")

        m.setattr(_store.Ledger, "_record_release", unrecorded)
        assert run([*CFG, *Q1]) == 5
    out, err = capsys.readouterr()
    assert "error: LedgerError: entry 3 stays 'reserved'" in err and not out.strip(), (out, err)
    assert "the answer was charged but is not returned (asking again charges again)" in err, err
    assert _statuses() == ["failed", "released", "reserved"]
    assert run([*CFG, "query", "SELECT nope FROM events", "--epsilon", "0.1"]) == 2  # refusals keep their codes
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "10.5"]) == 3
    assert _statuses() == ["failed", "released", "reserved"]


def test_a_release_that_a_postgresql_ledger_could_not_record_is_told_in_cli_terms() -> None:
    from dpsql.cli import _cli_text
    from dpsql.ledger._postgres import PostgresLedger

    e = PostgresLedger("postgresql://u@localhost/db")._unrecorded(3, "released", 20.0)
    text = _cli_text(str(e))
    assert "Session" not in text and "shows in `dpsql budget --history`; asking the query again charges again" in text
    assert "The answer was charged but is not returned. Entry 3 stays 'reserved'" in text, text


def test_errors_hide_cells_unless_debug(workdir: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pq.write_table(make_events(sentinel="SENTINEL_SECRET_42"), workdir / "secret.parquet")
    assert run(["init", "--epsilon", "5", "--ledger", "s.duckdb"]) == 0
    flags = ["--ledger", "s.duckdb", "--table", "t=secret.parquet", "--privacy-unit", "t=user_id"]
    # a value that does not convert is NULL (the outcome never depends on one person's data)
    capsys.readouterr()
    assert run([*flags, "query", "SELECT COUNT(*) FROM t WHERE CAST(url AS INTEGER) > 3", "--epsilon", "0.1"]) == 0
    out, err = capsys.readouterr()
    assert "SENTINEL" not in out + err
    # a type error is found by dpsql's typer before any row is read: a query error, free
    assert run([*flags, "query", "SELECT COUNT(*) FROM t WHERE url + 1 > 0", "--epsilon", "0.1"]) == 2
    out, err = capsys.readouterr()
    assert "UnsupportedQueryError" in err and "SENTINEL" not in out + err
    # DuckDB failing after the charge (simulated: its messages can quote cells) exits 5; --debug
    # (honoured: the CLI user registered every table) shows DuckDB's message scrubbed of values
    from dpsql.engine import Engine
    from dpsql.errors import ExecutionError

    def failing(self, ast, *, what="the bounded query"):  # type: ignore[no-untyped-def]
        raise ExecutionError("DuckDB failed while running the bounded query (ConversionException)",
                             debug_detail="Conversion Error: Could not convert string 'SENTINEL_SECRET_42' to INT32")

    monkeypatch.setattr(Engine, "fetch_arrow", failing)
    assert run([*flags, "query", "SELECT COUNT(*) FROM t", "--epsilon", "0.1"]) == 5
    out, err = capsys.readouterr()
    assert "ExecutionError" in err and "SENTINEL" not in out + err
    assert run([*flags, "--debug", "query", "SELECT COUNT(*) FROM t", "--epsilon", "0.1"]) == 5
    err = capsys.readouterr().err
    assert "debug: Conversion Error: Could not convert string" in err  # the control
    assert "SENTINEL" not in err and "42" not in err
    # the ledger: the failed runs count, the type error does not; the history quotes no cell
    assert run(["--ledger", "s.duckdb", "budget", "--history"]) == 0
    out = capsys.readouterr().out
    assert "failed" in out and "SENTINEL" not in out
    assert "spent:     epsilon=0.3 delta=0" in out


def test_debug_is_an_owner_setting(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the config's tables are the owner's: --debug is refused (free) unless [engine] debug = true
    assert run([*CFG, "--debug", "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and "[engine] debug = true" in err
    assert run([*CFG, "budget"]) == 0
    assert "spent:     epsilon=0 delta=0" in capsys.readouterr().out


def test_subprocess_entry_point(workdir: Path) -> None:
    cmd = [sys.executable, "-m", "dpsql.cli", *CFG, "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1",
           "--format", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=workdir)
    assert p.returncode == 0, p.stderr
    assert list(json.loads(p.stdout)["rows"][0]) == ["n"]
    assert "remaining: epsilon=9.9" in p.stderr


def test_workload_flag_runs_query_many(tmp_path, capsys):
    import shutil


    root = Path(__file__).resolve().parents[1]
    ex = tmp_path / "examples"
    shutil.copytree(root / "examples", ex, ignore=shutil.ignore_patterns("*.duckdb*"))
    sqlf = root / "sql" / "examples" / "age_ranges.sql"
    assert main(["--config", str(ex / "dpsql.toml"), "query", "-f", str(sqlf), "--workload", "--epsilon", "0.5",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)["rows"]
    assert len(out) == 5 and all("count" in r for r in out)
    assert not out[0]["query"].startswith("/*")
    # a later range over the same WHERE is free
    assert main(["--config", str(ex / "dpsql.toml"), "query",
                 "SELECT COUNT(*) FROM events WHERE action = 'view' AND age BETWEEN 18 AND 44", "--epsilon", "0.5",
                 "--reuse-synopsis"]) == 0
    err = capsys.readouterr().err
    assert "reused" in err and "remaining: epsilon=9.5" in err


def test_python_dash_m_dpsql_runs_the_command_line(tmp_path):
    """``python -m dpsql`` is the command line too (a venv whose scripts directory is not on PATH)."""
    import os

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    led = tmp_path / "l.duckdb"
    p = subprocess.run([sys.executable, "-m", "dpsql", "--ledger", str(led), "init", "--epsilon", "1"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0 and led.exists(), p.stderr
    p = subprocess.run([sys.executable, "-m", "dpsql", "budget", "--epsilon"], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("usage: dpsql"), p.stderr
