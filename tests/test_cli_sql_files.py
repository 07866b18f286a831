"""SQL as an ETL job hands it over (a file ending in a comment, bytes that are not UTF-8) and
rows to standard output with `-o -`: answered or refused in the command line's terms, and a
refusal charges nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli as run

CFG = ["--config", "examples/dpsql.toml"]


def _entries(capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    assert run([*CFG, "budget", "--history", "--format", "json"]) == 0
    return len(json.loads(capsys.readouterr().out)["entries"])


@pytest.mark.parametrize("text", [
    "SELECT COUNT(*) AS n FROM events;\n-- end of the daily count\n",
    "SELECT COUNT(*) AS n FROM events; /* generated */",
    "-- daily count\nSELECT COUNT(*) AS n FROM events;\n\n-- eof\n",
])
def test_a_comment_after_the_last_semicolon_is_not_a_statement(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                                text: str) -> None:
    """A file whose statement is followed by a comment was refused: 'exactly one SQL statement is
    allowed, got 2' (the parser gives a comment after ';' as a statement of its own)."""
    (workdir / "q.sql").write_text(text)
    assert run([*CFG, "query", "-f", "q.sql", "--epsilon", "0.1", "--format", "json"]) == 0, capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 1
    assert _entries(capsys) == 1


def test_a_workload_file_ending_in_a_comment_is_its_statements(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "w.sql").write_text("SELECT COUNT(*) FROM events WHERE age BETWEEN 18 AND 30;\n"
                                   "SELECT COUNT(*) FROM events WHERE age BETWEEN 31 AND 60;\n-- two ranges\n")
    assert run([*CFG, "query", "-f", "w.sql", "--workload", "--epsilon", "0.1", "--format", "json"]) == 0, \
        capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 2


@pytest.mark.parametrize("text", ["-- nothing to run yet\n", "/* TODO */ ;\n"])
def test_a_file_of_comments_only_says_so(workdir: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    (workdir / "q.sql").write_text(text)
    assert run([*CFG, "query", "-f", "q.sql", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "no SQL statement" in err and "only comments" in err and "hint:" in err, err
    assert _entries(capsys) == 0


def test_a_query_argument_that_is_not_utf8_is_named_in_flag_terms(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The shell hands Python undecodable bytes as lone surrogates; the refusal spoke of Python
    ("read the file with encoding='utf-8'")."""
    sql = os.fsdecode(b"SELECT COUNT(*) FROM events WHERE country = '\xe9'")
    assert run([*CFG, "query", sql, "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "encoding=" not in err and "-f" in err and "hint:" in err, err
    assert _entries(capsys) == 0


@pytest.mark.parametrize("fmt", [None, "csv", "json"])
def test_dash_as_output_is_standard_output(workdir: Path, capsys: pytest.CaptureFixture[str], fmt: str | None) -> None:
    """`-o -` was refused ('unknown extension') or, with --format, wrote a file named '-'."""
    argv = [*CFG, "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1", "-o", "-"]
    assert run([*argv, *(["--format", fmt] if fmt else [])]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert not (workdir / "-").exists()
    assert ("n" in out.splitlines()[0]) if fmt != "json" else json.loads(out)["rows"][0].keys() == {"n"}


def test_dash_as_output_in_parquet_is_refused_before_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CFG, "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1", "-o", "-", "--format", "parquet"]) == 2
    assert "--format parquet needs -o FILE" in capsys.readouterr().err
    assert _entries(capsys) == 0


def test_dash_as_meta_is_refused_before_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--meta -` wrote the meta to a file named '-'."""
    assert run([*CFG, "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1", "--meta", "-"]) == 2
    err = capsys.readouterr().err
    assert "--meta -" in err and "--format json" in err, err
    assert not (workdir / "-").exists()
    assert _entries(capsys) == 0


def test_a_gaussian_request_without_delta_is_told_the_flags(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hint was the Python API's: "pass delta=1e-6 or use mechanism='laplace'"."""
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "--option", "mechanism=gaussian"]) == 2
    err = capsys.readouterr().err
    assert "--delta 1e-6" in err and "--option mechanism=laplace" in err and "delta=1e-6" not in err, err
    assert _entries(capsys) == 0


def test_dash_as_output_with_stdout_closed_is_refused_before_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", None)
        assert run([*CFG, "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1", "-o", "-"]) == 2
    assert "standard output is closed" in capsys.readouterr().err
    assert _entries(capsys) == 0


def test_reuse_synopsis_refusals_name_the_flag(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """They said "reuse='synopsis' was asked ... omit the reuse option" (the Python API's option)."""
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events WHERE age BETWEEN 18 AND 30", "--epsilon", "0.1",
                "--reuse-synopsis"]) == 2
    err = capsys.readouterr().err
    assert "--reuse-synopsis was asked" in err and "drop --reuse-synopsis" in err and "reuse=" not in err, err
    assert _entries(capsys) == 0


@pytest.mark.parametrize("stdin", [False, True])
def test_an_endless_or_huge_sql_input_is_refused_without_reading_it_whole(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, stdin: bool) -> None:
    """-f /dev/zero was read until the machine ran out of memory (the process was killed), and a
    300 MB file was read whole (then 'the query is empty')."""
    import io

    from dpsql import cli

    monkeypatch.setattr(cli, "MAX_SQL_CHARS", 1000, raising=False)
    text = "SELECT COUNT(*) AS n FROM events" + " " * 2000
    if stdin:
        monkeypatch.setattr("sys.stdin", io.StringIO(text))
    else:
        Path("q.sql").write_text(text)
    assert run([*CFG, "query", "-f", "-" if stdin else "q.sql", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "no query is that long" in err and "hint:" in err, err
    assert _entries(capsys) == 0
    monkeypatch.setattr(cli, "MAX_SQL_CHARS", 2032)  # control: at the limit it is read
    if stdin:
        monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert run([*CFG, "query", "-f", "-" if stdin else "q.sql", "--epsilon", "0.1"]) == 0


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_sql_from_dev_zero_is_refused_at_once(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CFG, "query", "-f", "/dev/zero", "--epsilon", "0.1"]) == 2
    assert "no query is that long" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["true", "True", "false"])
def test_a_boolean_option_can_be_given_on_the_command_line(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                          value: str) -> None:
    """--option clip_negative=true (and =True, as the refusal's own hint said) was refused: 'clip_negative
    must be true or false, got 'true'': the option could not be set from the command line at all."""
    assert run([*CFG, "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1", "--option",
                f"clip_negative={value}", "--format", "json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["rows"][0]["n"] is not None
    assert _entries(capsys) == 1


def test_a_refused_query_of_a_workload_file_is_named_by_its_place(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal of the second statement of a workload file said "(line 1, col 34)": its place in
    that statement alone, so in a file of many statements nothing said which one was refused."""
    (workdir / "w.sql").write_text("SELECT COUNT(*) FROM events WHERE age BETWEEN 18 AND 30;\n"
                                   "SELECT COUNT(*) FROM events WHERE agee BETWEEN 31 AND 60;\n"
                                   "SELECT COUNT(*) FROM events WHERE age BETWEEN 61 AND 90;\n")
    assert run([*CFG, "query", "-f", "w.sql", "--workload", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "query 2 of 3 of the workload" in err and "agee" in err, err
    assert _entries(capsys) == 0


def test_query_many_names_the_refused_query(events) -> None:  # type: ignore[no-untyped-def]
    import dpsql
    from dpsql.errors import QueryError

    with dpsql.Session(budget=dpsql.Budget(1.0)) as s:
        s.register("r", events, privacy_unit="user_id", columns={"age": {"bounds": (0, 100), "bins": 10}})
        with pytest.raises(QueryError, match=r"query 3 of 3 of the workload") as e:
            s.query_many(["SELECT COUNT(*) FROM r WHERE age < 10", "SELECT COUNT(*) FROM r WHERE age < 20",
                          "SELECT COUNT(*) FROM r WHERE nope < 30"], epsilon=0.1)
        assert "nope" in str(e.value) and s.history().num_rows == 0


def test_forcing_dawa_on_one_query_is_told_the_workload_flag(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal named the Python API: "use Session.query_many([...]) or a histogram ..."."""
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "--option", "mechanism=dawa"]) == 2
    err = capsys.readouterr().err
    assert "--workload" in err and "Session" not in err and "query_many" not in err, err
    assert _entries(capsys) == 0


def test_sql_from_a_closed_standard_input_is_a_usage_error(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`dpsql query -f - <&-` (a job runner that closes stdin) ended with "error: unexpected
    AttributeError" and exit 1."""
    import sys

    with monkeypatch.context() as m:
        m.setattr(sys, "stdin", None)
        assert run([*CFG, "query", "-f", "-", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "standard input" in err and "closed" in err and "unexpected" not in err, err
    assert _entries(capsys) == 0


def test_grouping_weights_can_be_given_on_the_command_line(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--option grouping_weights=[1,3] (the form the refusal's own hint shows) was read as the text '[1,3]' and
    refused: the split of a ROLLUP's or UNION ALL's budget could not be set from the command line at all."""
    sql = "SELECT COUNT(*) AS n FROM events UNION ALL SELECT COUNT(*) FROM events"
    assert run([*CFG, "explain", sql, "--epsilon", "0.4", "--option", "grouping_weights=[1, 3]"]) == 0, \
        capsys.readouterr().err
    assert '"share": 0.25' in capsys.readouterr().out
    assert run([*CFG, "query", sql, "--epsilon", "0.4", "--option", "grouping_weights=[1,3]", "--format", "json"]) == 0, \
        capsys.readouterr().err
    shares = [c["share"] for c in json.loads(capsys.readouterr().out)["meta"]["parameters"]["components"]]
    assert shares == [0.25, 0.75]
    assert _entries(capsys) == 1


def test_a_rollup_over_undeclared_keys_says_missing_groups_are_not_zeros(workdir: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """GROUP BY url says its groups are released only above a noisy threshold; GROUP BY ROLLUP (url), whose first
    query is that GROUP BY, said nothing of it, so a url missing from the output read as a zero."""
    assert run([*CFG, "query", "SELECT url, COUNT(*) AS n FROM events GROUP BY ROLLUP (url)", "--epsilon", "1",
                "--delta", "1e-6"]) == 0
    err = capsys.readouterr().err
    assert "query 1 of 2 (SELECT url, COUNT(*) AS n FROM events GROUP BY url): groups are released only above a noisy " \
           "threshold (tau* = " in err and "a group missing from the output is not a zero" in err, err
    assert "query 2 of 2" not in err


def test_accuracy_that_differs_by_query_names_where_the_cli_shows_it(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A column whose accuracy differs by query said "see details['components']" (the Python API's name); the
    command line's meta holds it under parameters.components."""
    sql = "SELECT COUNT(*) AS n FROM events UNION ALL SELECT COUNT(*) AS n FROM events"
    assert run([*CFG, "query", sql, "--epsilon", "0.4", "--option", "grouping_weights=[1,3]", "--meta",
                str(workdir / "meta.json")]) == 0
    err = capsys.readouterr().err
    assert "n: differs by query: per query in the meta's parameters.components (--meta, --format json)" in err, err
    assert "details[" not in err
    parts = json.loads((workdir / "meta.json").read_text())["parameters"]["components"]
    assert parts[0]["accuracy"]["n"] != parts[1]["accuracy"]["n"]
