"""Sources that are no regular file, the process's own standard error as a source, and refusals over joins that name
their real cause. Each test says what was wrong and what is right now.

* A named pipe (FIFO) whose name ends in ``.parquet`` or ``.csv`` hung registration inside the reader (the Session's
  and the command line's: the open waits for a writer for ever), and so did a query once a registered file was
  replaced by one. Such a file (a FIFO, a socket, a device) is now refused from its metadata alone (``os.stat``, which
  never opens it), naming the path and the fix: a ConfigError at registration (exit 2), a free refusal at a query.
* A source glob matching the file the command's standard error was redirected to (``2> data/x.csv``) exited 66 (an
  input not written yet: retry), though a retry would make that file again; standard output in the same place already
  exited 2. Standard error is now treated as standard output is, and the message says whose file it is.
* With a LEFT JOIN anywhere in a query, GROUP BY over an inner-joined lookup's column without a declared domain was
  refused for the NULL group of the unmatched rows, which that column does not have. The refusal now names its cause
  (such a column's public values are released in full by the join mechanisms only, which do not answer a LEFT JOIN)
  and the same fixes.
* A type refusal in an aggregate's FILTER (WHERE ...) named the aggregate and the CASE it is answered as
  ("COUNT: a CASE / IF condition must be a boolean condition"), over a join as on one table. It now names FILTER, as
  a WHERE's names WHERE.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

import dpsql
from dpsql.errors import ConfigError, InputUnavailableError, PolicyError, UnsupportedQueryError

sys.path.insert(0, str(Path(__file__).parent))

import _join_oracle_fuzz as fz  # noqa: E402


@pytest.fixture(scope="module")
def env() -> Any:
    t = fz.data(3)
    s = fz.session(t)
    yield s, t
    s.close()


def ask(s: Any, sql: str, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return s.query(sql, epsilon=2.0, delta=1e-5, **kw)


def refused_for_free(s: Any, sql: str, kind: type[Exception] = UnsupportedQueryError) -> str:
    before = s.history().num_rows
    with pytest.raises(kind) as e:
        ask(s, sql)
    assert s.history().num_rows == before
    return str(e.value)


def _unblocked(fifo: Path, call: Any) -> BaseException | None:
    """``call()`` in a thread; should it wait on ``fifo`` (the hang this file is about), a writer opened and closed on
    the FIFO releases it, and the test fails saying so rather than hanging. Returns what ``call`` raised."""
    got: list[BaseException | None] = []

    def body() -> None:
        try:
            call()
            got.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            got.append(e)

    th = threading.Thread(target=body, daemon=True)
    th.start()
    th.join(5)
    if th.is_alive():
        for _ in range(50):  # the reader waits in its open: a writer's open and close ends it (EOF)
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK) if _has_reader(fifo) else None
            if fd is not None:
                os.close(fd)
            th.join(0.1)
            if not th.is_alive():
                break
        pytest.fail(f"waited on the named pipe {fifo}")
    return got[0]


def _has_reader(fifo: Path) -> bool:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


# -- 1. a named pipe as a source ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["p.parquet", "c.csv"])
def test_a_named_pipe_source_is_refused_at_registration_without_opening_it(tmp_path: Path, name: str) -> None:
    """Was: registration opened the FIFO in pyarrow's (or the CSV header's) read and waited for a writer for ever.
    Now: a ConfigError naming the path, what it is and the fix, from its metadata only."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    s = dpsql.Session(budget=dpsql.Budget(1, 1e-6))
    try:
        err = _unblocked(fifo, lambda: s.register("t", str(fifo), privacy_unit="u"))
        assert isinstance(err, ConfigError) and not isinstance(err, InputUnavailableError)
        assert f"'{fifo}' is a named pipe (FIFO), not a regular file" in str(err) and "table 't'" in str(err)
        assert "cat PIPE > data.csv" in (err.hint or "")
        # a glob matching it: named, with the glob it matched
        err = _unblocked(fifo, lambda: s.register("t", str(tmp_path / ("*" + Path(name).suffix)), privacy_unit="u"))
        assert isinstance(err, ConfigError) and "(matched by" in str(err) and "named pipe" in str(err)
        # (negative control: a regular file of the same name registers)
        os.remove(fifo)
        if name.endswith(".csv"):
            fifo.write_text("u\n1\n")
        else:
            pq.write_table(pa.table({"u": [1]}), fifo)
        s.register("t", str(fifo), privacy_unit="u")
    finally:
        s.close()


def test_a_device_named_as_a_csv_file_is_refused(tmp_path: Path) -> None:
    """A character device behind a .csv name (a symbolic link to /dev/zero, read for ever) is refused the same way."""
    link = tmp_path / "zero.csv"
    link.symlink_to("/dev/zero")
    s = dpsql.Session(budget=dpsql.Budget(1, 1e-6))
    try:
        with pytest.raises(ConfigError, match=r"is a character device, not a regular file"):
            s.register("t", str(link), privacy_unit="u")
    finally:
        s.close()


@pytest.mark.parametrize("name", ["a.parquet", "a.csv"])
def test_a_registered_file_replaced_by_a_named_pipe_is_refused_for_free_at_the_query(tmp_path: Path, name: str) -> None:
    """Was: the check before each charge read the replaced file's footer (or CSV header) again and waited on the FIFO.
    Now: the query is refused for free, saying the file became a named pipe."""
    path = tmp_path / name
    if name.endswith(".csv"):
        path.write_text("u\n1\n2\n")
    else:
        pq.write_table(pa.table({"u": [1, 2]}), path)
    s = dpsql.Session(budget=dpsql.Budget(10, 1e-5))
    try:
        s.register("t", str(path), privacy_unit="u")
        os.remove(path)
        os.mkfifo(path)
        err = _unblocked(path, lambda: ask(s, "SELECT COUNT(*) FROM t"))
        assert isinstance(err, InputUnavailableError)
        assert f"the file '{path}' became a named pipe (FIFO) since it was registered" in str(err)
        assert s.history().num_rows == 0
    finally:
        s.close()


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    Path("d").mkdir()
    Path("d/a.csv").write_text("u\n1\n2\n")
    pq.write_table(pa.table({"u": [1, 2]}), "d/a.parquet")
    assert run(["init", "--ledger", "l.duckdb", "--epsilon", "10"]) == 0
    capsys.readouterr()
    return tmp_path


def _spent(capsys: pytest.CaptureFixture[str]) -> float:
    capsys.readouterr()
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    return float(json.loads(capsys.readouterr().out)["spent"]["epsilon"])


def test_the_command_line_refuses_a_named_pipe_source_with_exit_2(cli: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: `dpsql --table t=p.parquet query ...` over a FIFO hung. Now: exit 2 (a retry finds the same FIFO), naming
    the path; nothing charged."""
    os.mkfifo("d/p.parquet")
    argv = ["--ledger", "l.duckdb", "--table", "t=d/p.parquet", "--privacy-unit", "t=u", "query", "SELECT COUNT(*) FROM t",
            "--epsilon", "1"]
    rc: list[int] = []
    assert _unblocked(Path("d/p.parquet"), lambda: rc.append(run(argv))) is None
    err = capsys.readouterr().err
    assert rc == [2] and "is a named pipe (FIFO), not a regular file" in err and "p.parquet" in err
    assert _spent(capsys) == 0


# -- 2. the process's own standard error as a source ----------------------------------------------------------------------
@pytest.mark.parametrize("fd", [1, 2])
@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_a_source_glob_matching_the_commands_own_redirected_output_exits_2(cli: Path, capsys: pytest.CaptureFixture[str],
                                                                         fd: int, ext: str) -> None:
    """Was: `2> d/x.csv` with --table t='d/*.csv' exited 66 (an input being written: retry), where the same file as
    standard output exited 2. Now both exit 2, and the message says the file is the command's own stream."""
    argv = ["--ledger", "l.duckdb", "--table", f"t=d/*.{ext}", "--privacy-unit", "t=u", "query", "SELECT COUNT(*) FROM t",
            "--epsilon", "1"]
    own = os.open(f"d/x.{ext}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # the shell's redirection makes the file
    saved = os.dup(fd)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(own, fd)
    try:
        rc = run(argv)
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(own)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"this process's own {'standard error' if fd == 2 else 'standard output'}" in err
    assert _spent(capsys) == 0
    # (negative control: an empty file no stream of the command is, is an input not written yet, exit 66)
    os.truncate(f"d/x.{ext}", 0)
    capsys.readouterr()
    assert run(argv) == 66
    assert "own standard" not in capsys.readouterr().err


# -- 3. GROUP BY over an inner-joined lookup column in a query with a LEFT JOIN -------------------------------------------
INNER_UNDER_LEFT = ("SELECT r.rname, COUNT(*) AS n FROM events e JOIN regions r ON e.rg = r.rg "
                    "LEFT JOIN countries c ON e.cc = c.code GROUP BY r.rname")


def test_an_inner_joined_lookup_key_beside_a_left_join_is_refused_for_its_real_cause(env: Any) -> None:
    """Was: "GROUP BY over regions.rname under a LEFT JOIN: the column has no declared domain, so no public key set
    with NULL (the unmatched rows' group) ...": regions is inner-joined, its column has no such group. Now the refusal
    says the join mechanisms release such a column's public values in full but do not answer a LEFT JOIN."""
    s, _ = env
    msg = refused_for_free(s, INNER_UNDER_LEFT, PolicyError)
    assert "regions.rname (inner-joined) has no declared domain" in msg
    assert "released in full by the join mechanisms only, which do not answer a query with a LEFT JOIN (of countries)" in msg
    assert "unmatched rows' group" not in msg and "NULL are then released" not in msg
    assert "columns={'rname': {'domain': [...]}}" in msg and "sparse_histogram" in msg


def test_a_left_joined_lookup_key_keeps_the_null_group_refusal_and_a_mix_names_both(env: Any) -> None:
    s, _ = env
    msg = refused_for_free(s, "SELECT r.rname, COUNT(*) AS n FROM events e LEFT JOIN regions r ON e.rg = r.rg "
                              "GROUP BY r.rname", PolicyError)
    assert "regions.rname (LEFT-joined) has no declared domain, so no public key set with NULL (the unmatched rows' " in msg
    assert "inner-joined" not in msg
    both = refused_for_free(s, "SELECT c.code, r.rname, COUNT(*) AS n FROM events e LEFT JOIN countries c ON e.cc = c.code "
                               "JOIN regions r ON e.rg = r.rg GROUP BY c.code, r.rname", PolicyError)
    assert "countries.code (LEFT-joined)" in both and "regions.rname (inner-joined)" in both


def test_the_fixes_the_refusal_names_answer(env: Any) -> None:
    # (negative controls: without the LEFT JOIN the join mechanisms release rname's public values; with its domain
    # declared the one-table path answers the query as written)
    s, t = env
    plain = INNER_UNDER_LEFT.replace(" LEFT JOIN countries c ON e.cc = c.code", "")
    assert {r["rname"] for r in ask(s, plain).to_pylist()} <= {"North", "South", "East", "West", None}
    s.register("regions", t["regions"], public=True, columns={"rname": {"domain": ["North", "South", "East", "West"]}})
    try:
        assert sorted(r["rname"] for r in ask(s, INNER_UNDER_LEFT).to_pylist()) == ["East", "North", "South", "West"]
    finally:
        s.register("regions", t["regions"], public=True)


# -- 4. a type refusal inside FILTER --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("sql", "cond"), [
    ("SELECT COUNT(*) FILTER (WHERE kind) AS n FROM events", "kind"),
    ("SELECT COUNT(*) FILTER (WHERE e.kind) AS n FROM events e JOIN countries c ON e.cc = c.code", "e.kind"),
    ("SELECT COUNT(*) FILTER (WHERE e.kind) AS n FROM events e LEFT JOIN countries c ON e.cc = c.code", "e.kind"),
    ("SELECT COUNT(*) FILTER (WHERE o.st) AS n FROM orders o JOIN persons p ON o.pid = p.id", "o.st"),
])
def test_a_filter_condition_that_is_no_boolean_is_refused_naming_filter(env: Any, sql: str, cond: str) -> None:
    """Was: "COUNT: a CASE / IF condition must be a boolean condition ...": the aggregate, and a CASE the query does
    not hold. Now: "FILTER: FILTER must be a boolean condition", over a join as on one table."""
    s, _ = env
    msg = refused_for_free(s, sql)
    assert "FILTER: FILTER must be a boolean condition, but this is VARCHAR" in msg and f": {cond} (line 1" in msg
    assert "CASE" not in msg and "COUNT:" not in msg


def test_a_filter_comparison_of_mixed_types_names_filter_over_a_join(env: Any) -> None:
    s, _ = env
    msg = refused_for_free(s, "SELECT SUM(e.v) FILTER (WHERE e.kind > 5) AS n FROM events e JOIN countries c ON e.cc = c.code")
    assert msg.startswith("FILTER: the comparison mixes incompatible types") and "SUM:" not in msg
    # (negative control: a boolean FILTER over the join is answered)
    before = s.history().num_rows
    ask(s, "SELECT SUM(e.v) FILTER (WHERE e.v > 0) AS n FROM events e JOIN countries c ON e.cc = c.code")
    assert s.history().num_rows == before + 1


# -- 5. refusal labels: the clause and the names the query wrote ----------------------------------------------------------
@pytest.mark.parametrize(("sql", "said"), [
    # an inner join's ON conditions were labelled WHERE
    ("SELECT e.cc, COUNT(*) AS n FROM events e JOIN countries c ON e.cc = c.code AND e.v > 5 WHERE e.v < 3 GROUP BY e.cc",
     "WHERE e.v < 3 and ON e.v > 5 hold for no value of column 'e.v' (DOUBLE)"),
    # (an unqualified column of an ON was shown qualified, `ON events.v > 5`, as the analysis binds it)
    ("SELECT cc, COUNT(*) AS n FROM events JOIN countries c ON cc = c.code AND v > 5 WHERE v < 3 GROUP BY cc",
     "WHERE v < 3 and ON v > 5 hold for no value of column 'v' (DOUBLE)"),
    ("SELECT e.cc, COUNT(*) AS n FROM events e JOIN countries c ON e.cc = c.code AND 1 = 0 GROUP BY e.cc",
     "ON 1 = 0 is not true whatever the data"),
    ("SELECT e.cc, COUNT(*) AS n FROM events e JOIN countries c ON e.cc = c.code AND c.zone = 'AM' AND c.pop > 50 "
     "GROUP BY e.cc", "ON c.zone = 'AM' AND c.pop > 50 keeps no row of the public table 'countries' (c)"),
    # a merged view's conditions named the base table's column (v) for the view's (val)
    ("WITH x AS (SELECT cc, v AS val FROM events) SELECT cc, COUNT(*) AS n FROM x WHERE val > 5 AND val < 3 GROUP BY cc",
     "WHERE val > 5 AND val < 3 holds for no value of column 'val' (DOUBLE)"),
    ("WITH x AS (SELECT cc, v AS val FROM events WHERE v > 5) SELECT cc, COUNT(*) AS n FROM x WHERE val < 3 GROUP BY cc",
     "WHERE v > 5 AND val < 3 holds for no value of column 'v' (DOUBLE)"),
    ("WITH x AS (SELECT cc, v AS val FROM events) SELECT x.cc, COUNT(*) AS n FROM x JOIN countries c ON x.cc = c.code "
     "WHERE x.val > 5 AND val < 3 GROUP BY x.cc", "WHERE x.val > 5 AND val < 3 holds for no value of column 'x.val'"),
])
def test_a_no_row_refusal_names_the_clause_and_the_columns_as_written(env: Any, sql: str, said: str) -> None:
    s, _ = env
    msg = refused_for_free(s, sql)
    assert said in msg and "nothing was charged" in msg


def test_the_no_row_refusal_of_one_table_still_reads_as_before(env: Any) -> None:
    # (negative control: conditions all in WHERE, on the table's own columns)
    s, _ = env
    msg = refused_for_free(s, "SELECT cc, COUNT(*) FROM events WHERE (v > 5 OR v IS NULL) AND v < 3 AND v < 4 GROUP BY cc")
    assert "WHERE (v > 5 OR v IS NULL) AND v < 3 AND v < 4 holds for no value of column 'v' (DOUBLE)" in msg


# -- 6. missed free refusals: decided from the public lookup's rows --------------------------------------------------------
# (countries, public: FR pop 78, DE pop NULL, US pop 2, JP pop 61)
TWICE = ("SELECT e.rg, COUNT(*) AS n FROM events e JOIN countries c1 ON e.cc = c1.code JOIN countries c2 ON {} = c2.code "
         "WHERE {} GROUP BY e.rg")


@pytest.mark.parametrize(("on", "where"), [("e.cc", "c1.pop > 50 AND c2.pop < 10"), ("c1.code", "c1.pop > 50 AND c2.pop < 10"),
                                           ("e.cc", "c1.pop > c2.pop")])
def test_one_public_table_joined_twice_on_one_key_under_conditions_no_row_meets_is_refused_for_free(
        env: Any, on: str, where: str) -> None:
    """Was: each alias's conditions were decided alone (c1 has rows with pop > 50, c2 rows with pop < 10), and the query
    was charged for a release without a row: both aliases are the one row of `countries` whose code is e.cc. Now they
    are decided together, on each public row."""
    s, _ = env
    msg = refused_for_free(s, TWICE.format(on, where))
    assert f"WHERE {where} keeps no row of the public table 'countries' (c1, c2): joined on the same key values" in msg


@pytest.mark.parametrize(("sql", "rows"), [
    (TWICE.format("e.cc", "c1.pop > 50 AND c2.pop > 60"), True),   # (JP meets both)
    (TWICE.format("e.cc", "c1.pop >= c2.pop"), True),
    (TWICE.format("e.rg", "c1.pop > 50 AND c2.pop < 10"), False),  # another column's value: two rows, not decided
    (TWICE.format("e.cc", "c1.pop > 50 AND c2.pop < 10").replace("JOIN countries c2", "LEFT JOIN countries c2"), False),
])
def test_aliases_not_tied_to_one_row_or_conditions_a_row_meets_are_answered(env: Any, sql: str, rows: bool) -> None:
    # (negative controls: charged and answered, the answer as SQL's at zero noise where a row passes the threshold)
    s, t = env
    before = s.history().num_rows
    ask(s, sql)
    assert s.history().num_rows == before + 1
    if rows:
        con = fz.reference(t)
        assert con.execute(sql).fetchall(), "the public rows meet the conditions: some tuples exist"
        con.close()


LEFT_ON = "SELECT e.rg, COUNT(*) AS n FROM events e LEFT JOIN countries c ON e.cc = c.code AND {} WHERE {} GROUP BY e.rg"


def test_a_left_joins_on_filter_with_a_where_on_the_lookup_that_keep_no_row_are_refused_for_free(env: Any) -> None:
    """Was: the WHERE c.pop < 10 was decided over every public row (US has pop 2) and the row of NULLs, though the ON
    lets only rows with pop > 50 match: charged, no row released. Now the ON's conditions over the lookup alone decide
    which public rows can be there."""
    s, _ = env
    msg = refused_for_free(s, LEFT_ON.format("c.pop > 50", "c.pop < 10"))
    assert ("ON c.pop > 50 and WHERE c.pop < 10 keep no row of the public table 'countries' (c) nor its row of NULLs "
            "(LEFT JOIN)") in msg


@pytest.mark.parametrize(("on", "where"), [("c.pop > 50", "c.pop > 60"), ("c.pop > 50", "c.pop < 10 OR c.pop IS NULL"),
                                           ("c.pop > e.v", "c.pop < 10")])
def test_a_left_joins_on_filter_with_a_where_some_row_meets_is_answered(env: Any, on: str, where: str) -> None:
    # (negative controls: a row meets both (JP); the row of NULLs meets the WHERE; an ON over the private row's column
    # too, which the public rows alone do not decide)
    s, _ = env
    before = s.history().num_rows
    ask(s, LEFT_ON.format(on, where))
    assert s.history().num_rows == before + 1
