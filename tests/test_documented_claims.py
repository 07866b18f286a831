"""Concrete claims of README.md, docs/sql.md and docs/expressions.md, each run as the docs state it.

Each test names the section whose claim it pins. Where a claim did not hold, either the code or
the text was corrected; the test checks the behaviour and, where the text was the one corrected,
that the text now says what the code does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_cli

from dpsql.errors import UnsupportedQueryError
from dpsql.session import OPTIONS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SQL_MD = (ROOT / "docs" / "sql.md").read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return " ".join(text.split())


# -- docs/expressions.md, "The typer" rule 7 and the allow-list: a refusal names the function as SQL spells it


@pytest.mark.parametrize(
    ("expr", "name"),
    [
        ("strftime(url, '%Y') = 'x'", "strftime"),
        ("strptime(age, '%Y') IS NULL", "strptime"),
        ("dayofweek(url) = 1", "dayofweek"),
        ("dayofyear(url) = 1", "dayofyear"),
        ("weekofyear(url) = 1", "weekofyear"),
        ("isodow(url) = 1", "isodow"),
        ("date_trunc('month', url) IS NULL", "date_trunc"),
        ("strpos(age, 'a') > 0", "strpos"),
        ("url || '" + "a" * 300 + "' = 'x'", "concat"),  # || is concat (a text literal of over 256 characters)
    ],
)
def test_expressions_md_type_refusals_name_the_function_as_documented(session, expr: str, name: str) -> None:
    with pytest.raises(UnsupportedQueryError) as e:
        session.query(f"SELECT COUNT(*) FROM events WHERE {expr}", epsilon=1.0, delta=1e-6)
    msg = str(e.value)
    assert f"{name}()" in msg, msg
    for internal in ("time_to_str", "str_to_time", "day_of_week", "day_of_year", "week_of_year", "dayofweek_iso",
                     "timestamp_trunc", "str_position", "dpipe"):
        assert internal not in msg, msg


# -- README, Python API, query(): "options keys are documented in dpsql.session.OPTIONS (...)"


def test_readme_python_api_query_lists_every_option_key() -> None:
    start = README.index("* `query(sql, epsilon=, delta=, options=)`")
    bullet = README[start : README.index("unknown keys are refused", start)]
    missing = sorted(k for k in OPTIONS if f"`{k}`" not in bullet)
    assert not missing, f"README's query() bullet does not name the option(s) {missing}"


# -- README, "The command line in ETL jobs": the meta holds the mechanism, the cost, the remaining budget, the
#    ledger entry, per-column accuracy, the public parameters, notes and warnings; "From Python: Release.meta() ..."


def test_readme_meta_from_python_holds_the_remaining_budget_when_given_it(session) -> None:
    r = session.query("SELECT country, COUNT(*) AS n FROM events GROUP BY country", epsilon=1.0, delta=1e-6)
    keys = {"mechanism", "cost", "ledger_id", "accuracy", "parameters", "notes", "warnings"}
    assert keys <= set(r.meta()) and "remaining" not in r.meta()
    rem = session.remaining()
    assert r.meta(rem)["remaining"] == {"epsilon": rem.epsilon, "delta": rem.delta}
    assert r.to_dict(rem)["meta"]["remaining"] == r.meta(rem)["remaining"]
    assert b'"remaining"' in r.to_arrow(rem).schema.metadata[b"dpsql"]
    assert "`r.meta(s.remaining())`" in README


# -- README, "The command line in ETL jobs", ad-hoc files: how --domain NAME.COL=A,B,C reads its values


def test_readme_cli_domain_values_are_split_at_commas_and_trimmed(tmp_path, capsys, monkeypatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"u": [1, 2], "zip": ["01234", "10"]}), "t.parquet")
    assert run_cli(["init", "--epsilon", "1", "--delta", "1e-6", "--ledger", "l.duckdb"]) == 0
    capsys.readouterr()
    flags = ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=u"]
    assert run_cli([*flags, "--domain", "t.zip= 01234, 10,,", "tables"]) == 0
    assert 'zip: domain ["01234", "10"]' in capsys.readouterr().out  # text as typed, but trimmed
    assert "split at commas with edge spaces trimmed and empty items dropped" in _flat(README)


# -- docs/sql.md, Tables: "FROM schema.t ... Columns may be qualified the same way (schema.t.col)"


def test_sql_md_tables_columns_are_qualified_as_from_names_the_table(session) -> None:
    def count(sql: str) -> int:
        return session.query(sql, epsilon=1.0, delta=1e-6).table.column(0)[0].as_py()

    n = count("SELECT COUNT(*) FROM events WHERE amount > 5")
    assert count("SELECT COUNT(*) FROM main.events WHERE main.events.amount > 5") == n
    assert count("SELECT COUNT(*) FROM db.main.events WHERE db.main.events.amount > 5") == n
    assert count("SELECT COUNT(*) FROM main.events WHERE events.amount > 5") == n
    with pytest.raises(UnsupportedQueryError, match="unknown table or alias 'main.events'"):
        session.query("SELECT COUNT(*) FROM events WHERE main.events.amount > 5", epsilon=1.0, delta=1e-6)
    assert "`FROM t` takes `t.col`, not `main.t.col`" in SQL_MD


# -- README, Benchmarks: "Each script is one command": the scripts exist, and what they need beyond the
#    repository (data sets, the bench extra) is said, in the README and by the script itself


def _load_benchmark(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_benchmarks_exist_and_name_what_they_need(tmp_path, monkeypatch) -> None:
    block = README[README.index("## Benchmarks") : README.index("### Q1-Q3")]
    scripts = re.findall(r"python (benchmarks/\w+\.py)", block)
    assert len(scripts) >= 10 and all((ROOT / s).is_file() for s in scripts)
    flat = _flat(block)
    assert "pip install -e '.[test,bench]'" in flat
    for script in scripts:  # a data set read from outside the repository is named with its variable
        for var in re.findall(r"\"(DPSQL_(?:DPBENCH|GRAPHS))\"", (ROOT / script).read_text(encoding="utf-8")):
            assert f"${var}" in flat, f"{script} reads ${var}, which the README does not name"
    dawa = _load_benchmark("dawa")
    with pytest.raises(SystemExit, match=r"--data DIR or set \$DPSQL_DPBENCH"):
        dawa.main(["--data", str(tmp_path / "none"), "--quick", "--out", str(tmp_path)])
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # the bench extra not installed
    assert "dpsql[bench]" in dawa.plot(str(tmp_path), str(tmp_path), {})


# -- README: every dpsql command it shows (Quick start, "More to try", "The command line in ETL jobs", and the
#    docker compose commands' arguments) runs on a fresh copy of the example data and exits 0


def _readme_commands() -> list[list[str]]:
    import shlex

    cmds: list[list[str]] = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].strip()
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and argv[0].endswith("dpsql") and "--config" in argv:
                    cmds.append(argv[1:])
    flat = _flat(README)
    for args in re.findall(r"`docker compose run --rm dpsql ([^`]+)`", flat):  # the image runs dpsql --config ...
        if not args.startswith("..."):
            cmds.append(["--config", "examples/dpsql.toml", *shlex.split(args)])
    return cmds


def test_readme_commands_run_on_the_example(workdir) -> None:
    cmds = _readme_commands()
    assert len(cmds) >= 12 and any("sql/examples/top_urls.sql" in c for c in cmds)
    failed = [" ".join(c) for c in cmds if run_cli(c) != 0]
    assert not failed, "README commands that fail on the example:\n" + "\n".join(failed)


# -- docs/expressions.md, "The typer" rule 2: "varchar_col = 5 is refused, naming the fix (CAST(col AS INTEGER),
#    or compare with '5')"


def test_expressions_md_text_compared_with_a_number_names_the_fix(session) -> None:
    with pytest.raises(UnsupportedQueryError) as e:
        session.query("SELECT COUNT(*) FROM events WHERE url = 5", epsilon=1.0, delta=1e-6)
    assert "CAST(col AS INTEGER)" in str(e.value) and "'5'" in str(e.value), str(e.value)


# -- README, Exit codes: on Ctrl-C or SIGTERM "a charge already made stands: its entry is marked failed once the
#    query has started" (also while the run is padded to the owner's min_response_time)


def test_readme_interrupt_while_padding_marks_the_entry_failed(events, monkeypatch) -> None:
    import types

    import dpsql.charge

    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6), engine={"min_response_time": 30})
    s.register("events", events, privacy_unit="user_id")

    def sleep(seconds: float) -> None:  # the signal arrives while the run sleeps to its min_response_time
        raise KeyboardInterrupt

    monkeypatch.setattr(dpsql.charge, "time", types.SimpleNamespace(monotonic=dpsql.charge.time.monotonic, sleep=sleep))
    with pytest.raises(KeyboardInterrupt):
        s.query("SELECT COUNT(*) FROM events", epsilon=0.5, delta=0)
    [entry] = s.history().to_pylist()
    assert entry["status"] == "failed" and entry["epsilon"] == 0.5
    assert s.remaining().epsilon == 0.5  # the charge stands
    s.close()


# -- README, "The command line in ETL jobs": "Hints are worded as flags and config keys; a hint about a query
#    option names the option as the Python API does, which --option KEY=VALUE sets"


def test_readme_cli_hints_flags_and_option_names(workdir, capsys) -> None:
    base = ["--config", "examples/dpsql.toml", "query", "--epsilon", "0.1", "--delta", "1e-6"]
    assert run_cli([*base, "SELECT url, SUM(amount) FROM events GROUP BY url", "--option", "max_groups_per_unit=9"]) == 2
    err = capsys.readouterr().err
    assert "pass max_groups_per_unit <= 5, or omit it" in err, err
    assert run_cli(["--config", "examples/dpsql.toml", "query", "--epsilon", "0.1", "SELECT url, COUNT(*) FROM events GROUP BY url"]) == 2
    err = capsys.readouterr().err
    assert "pass --delta (e.g. --delta 1e-6)" in err and "--domain TABLE.col=A,B,C" in err, err
    assert "which `--option KEY=VALUE` sets" in _flat(README)


# -- README, "Python API": the list of errors; "The command line": the exit codes, as `dpsql --help` gives them


def test_readme_error_list_names_every_public_error_class() -> None:
    from dpsql import errors

    start = README.index("* Errors (`dpsql.errors`")
    listed = set(re.findall(r"`(\w+Error)`", README[start:README.index("\n## ", start)]))
    public = {n for n in errors.__all__ if isinstance(getattr(errors, n), type) and issubclass(getattr(errors, n), Exception)}
    assert public - {"DPSQLError"} <= listed, public - listed
    assert {n for n in listed if n.endswith("Error") and hasattr(errors, n)} <= public  # no private class named


def test_readme_and_cli_help_give_the_same_exit_codes() -> None:
    from dpsql.cli import build_parser
    from dpsql.errors import BUSY_EXIT_CODE, CHARGED_EXIT_CODE, NO_INPUT_EXIT_CODE

    text = _flat(README[README.index("* Exit codes:"):])
    text = text[:text.index("\n## ") if "\n## " in text else text.index(" ## ")]
    help_text = _flat(build_parser().description or "")
    codes = {0, 1, 2, 3, 4, CHARGED_EXIT_CODE, NO_INPUT_EXIT_CODE, BUSY_EXIT_CODE, 129, 130, 143}
    for code in codes:
        assert re.search(rf"[;:] {code} ", text) or re.search(rf"\b{code} (interrupted|terminated|by SIGHUP)", text), code
        assert re.search(rf"\b{code} ", help_text), code
    assert f"{CHARGED_EXIT_CODE} a failure after the charge: the budget was spent" in text
    assert f"{CHARGED_EXIT_CODE} a failure after the charge (the charge stands" in help_text
