"""The function allow-list holds in every clause: WHERE and GROUP BY (private rows), and the
SELECT list, HAVING and ORDER BY (post-processing over released values). There is no deny-list:
every DuckDB function that is not on the allow-list is refused, before any charge."""

from __future__ import annotations

import logging
import pathlib
import re
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from sqlglot import exp

import dpsql
from dpsql import errors
from dpsql.budget import Budget
from dpsql.catalog import TableSpec
from dpsql.plan import checks
from dpsql.plan.analyze import analyze
from dpsql.plan.parse import DIALECT
from dpsql.plan.typer import ALIASES, ALLOW_LIST, POST_ALLOW_LIST, post_allow_list_markdown
from dpsql.testing import use_noise, zero_noise

CATALOG = {"t": TableSpec("t", "/nonexistent/never-read.parquet", "parquet", privacy_unit="uid",
                          schema={"uid": "BIGINT", "x": "DOUBLE", "s": "VARCHAR", "d": "DATE"},
                          columns={})}

#: the DuckDB spellings the allow-lists name (every clause accepts at most these)
ALLOWED = (
    {tok for f in ALLOW_LIST + POST_ALLOW_LIST for tok in re.split(r"[,/ ]+", f.name.lower())
     if re.fullmatch(r"[a-z_][a-z0-9_]*", tok)}
    | set(ALIASES)
)

#: argument lists tried for each name: the parser maps a name to a function by its arity and
#: literal arguments, never by types; ``x`` becomes COUNT(*) in the clauses over released values
ARGS = ["", "x", "x, 2", "'a', x", "x, 2, 3"]

CLAUSES = ("SELECT", "WHERE", "GROUP BY", "HAVING", "ORDER BY")


def _query(name: str, args: str) -> str:
    call = f"{name}({args})"
    post = f"{name}({args.replace('x', 'COUNT(*)')})"
    return (f"SELECT {post} AS v\nFROM t WHERE {call} IS NULL\nGROUP BY {call}\nHAVING {post} IS NULL\n"
            f"ORDER BY {post}")


def _duckdb_function_names() -> list[str]:
    names = {r[0] for r in duckdb.sql("SELECT DISTINCT function_name FROM duckdb_functions()").fetchall()}
    return sorted(n for n in names if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n))


#: the parts of a call that are its arguments (a column, a literal, COUNT(*)), not its functions
_ARGUMENT_NODES = (exp.Column, exp.Identifier, exp.Literal, exp.Count, exp.Star)


def _call_shape(call: str) -> tuple[str, ...]:
    """The functions ``call`` parses to (node classes, depth first), its arguments left out; a syntax error's
    shape is ("error",). The checks of every clause read these nodes: two argument lists of one name that
    parse to the same shape are refused (or not) by the same code over the same nodes."""
    try:
        tree = sqlglot.parse_one(call, read=DIALECT)
    except sqlglot.errors.ParseError:
        return ("error",)
    return tuple(type(n).__name__ for n in tree.walk() if not isinstance(n, _ARGUMENT_NODES))


def _distinct_argument_lists(name: str) -> list[str]:
    """The ARGS of ``name`` that parse to distinct shapes (over private rows and over released values),
    the first of each in ARGS order."""
    kept: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
    for args in ARGS:
        key = (_call_shape(f"{name}({args})"), _call_shape(f"{name}({args.replace('x', 'COUNT(*)')})"))
        kept.setdefault(key, args)
    return list(kept.values())


def _refused_clauses(sql: str) -> set[str]:
    """The clauses with a violation (every message names its clause); all when the SQL does not parse."""
    try:
        analyze(sql, CATALOG)
    except errors.SQLSyntaxError:
        return set(CLAUSES)
    except errors.QueryError as e:
        return {c for v in e.violations for c in CLAUSES if v.message.startswith(f"{c}:") or f" in {c}" in v.message}
    return set()


def _accepted(sql: str) -> bool:
    try:
        analyze(sql, CATALOG)
    except errors.QueryError:
        return False
    return True


def test_every_duckdb_function_off_the_allow_list_is_refused_in_every_clause() -> None:
    """Analysis only (reads no row, touches no database): every function name DuckDB has that
    the allow-lists do not name is refused in the SELECT list, WHERE, GROUP BY, HAVING and
    ORDER BY, whatever its arguments.

    Each name is analysed with every argument list of ARGS that parses to a distinct shape (the
    function nodes the parser makes of it: by arity and literal arguments, over private rows and
    over released values); argument lists that parse to the same nodes as an earlier one take the
    same checks over the same nodes, and are analysed once (about 1 250 queries instead of 5 300)."""
    logging.disable(logging.WARNING)  # sqlglot warns about a few names it cannot transpile
    try:
        names = _duckdb_function_names()
        assert len(names) > 800
        leaks = []
        tried = points = 0
        for name in names:
            if name.lower() in ALLOWED:
                continue
            points += len(ARGS)
            for args in _distinct_argument_lists(name):
                tried += 1
                sql = _query(name, args)
                missing = set(CLAUSES) - _refused_clauses(sql)
                if missing:
                    leaks.append((sorted(missing), sql))
        assert points > 4_000 and tried > 1_000
        assert leaks == []
    finally:
        logging.disable(logging.NOTSET)


def test_control_a_clause_that_accepts_a_function_is_detected() -> None:
    """The sweep can fail: with an allow-listed name, the clauses that accept it are found."""
    assert _refused_clauses(_query("abs", "x")) == set()
    assert _refused_clauses(_query("exp", "x")) == {"WHERE", "GROUP BY"}  # exp() only over released values
    assert _refused_clauses(_query("max", "x")) == set(CLAUSES)  # an aggregate over an aggregate
    assert _refused_clauses(_query("mode", "x")) == set(CLAUSES)  # an aggregate dpsql does not answer


def test_control_argument_lists_that_parse_apart_are_each_analysed() -> None:
    """The sweep keeps every argument list the parser reads as another function: a name it does not
    know is one anonymous call whatever its arguments; date_trunc's arities and literal arguments
    parse to distinct nodes."""
    assert _distinct_argument_lists("nosuchfn") == [""]
    assert _distinct_argument_lists("date_trunc") == ["", "x, 2", "'a', x"]
    assert _call_shape("left(x, 2)") != _call_shape("left()")


def test_control_allowed_names_are_accepted() -> None:
    """The sweep above can fail: allow-listed names in these forms are accepted."""
    assert _accepted("SELECT COUNT(*) FROM t WHERE abs(x) IS NULL")
    assert _accepted("SELECT COUNT(*) FROM t HAVING abs(COUNT(*)) IS NULL")
    assert _accepted("SELECT COUNT(*) AS n FROM t ORDER BY exp(COUNT(*))")
    assert _accepted("SELECT power(COUNT(*), 2) AS v FROM t")
    assert _accepted("SELECT COUNT(*) FROM t GROUP BY lcase(s)")
    assert not _accepted("SELECT COUNT(*) FROM t WHERE exp(x) IS NULL")  # post-processing only


#: (call, the name the refusal gives it)
NOTABLE = [
    ("stats(x)", "stats"), ("current_query()", "current_query"), ("current_setting('threads')", "current_setting"),
    ("version()", "version"), ("txid_current()", "txid_current"), ("getenv('HOME')", "getenv"),
    ("duckdb_tables()", "duckdb_tables"), ("duckdb_settings()", "duckdb_settings"),
    ("read_text('/etc/passwd')", "read_text"), ("now()", "now"), ("sleep_ms(1000)", "sleep_ms"),
    ("write_log('x')", "write_log"), ("current_user", "current_user"), ("uuid()", "uuid"), ("random()", "random"),
    ("getvariable('v')", "getvariable"), ("query_table('t')", "query_table"), ("enable_logging()", "enable_logging"),
    ("force_checkpoint()", "force_checkpoint"), ("hash(x)", "hash"), ("md5(s)", "md5"),
    ("levenshtein(s, 'a')", "levenshtein"), ("error('x')", "error"), ("typeof(x)", "typeof"),
    ("current_date", "current_date"),
]


@pytest.fixture(scope="module")
def session() -> Any:
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", pa.table({"uid": pa.array(range(20), pa.int64()), "x": [1.0] * 20, "s": ["a"] * 20}),
               privacy_unit="uid")
    yield s
    s.close()


@pytest.mark.parametrize(("call", "name"), NOTABLE, ids=[n for _, n in NOTABLE])
def test_notable_functions_refused_by_name_before_any_charge(session: Any, call: str, name: str) -> None:
    post = call.replace("(x)", "(COUNT(*))")
    queries = {
        "WHERE": f"SELECT COUNT(*) FROM t WHERE {call} IS NULL",
        "GROUP BY": f"SELECT COUNT(*) FROM t GROUP BY {call}",
        "HAVING": f"SELECT COUNT(*) FROM t HAVING {post} IS NULL",
        "ORDER BY": f"SELECT COUNT(*) AS n FROM t ORDER BY {post}",
        "SELECT": f"SELECT {post} AS v, COUNT(*) AS n FROM t",
    }
    for clause, sql in queries.items():
        for run in (session.query, session.explain):
            with pytest.raises(errors.UnsupportedQueryError) as ei:
                run(sql, epsilon=1.0, delta=1e-6)
            msg = str(ei.value)
            assert f"{clause}: function {name}()" in msg and "not on the allow-list" in msg, msg
            assert "docs/expressions.md" in msg, msg
    assert session.history().num_rows == 0 and session.remaining() == Budget(10.0, 1e-3)


def test_no_deny_list_left() -> None:
    src = pathlib.Path(checks.__file__).read_text()
    assert "_DENY" not in src and not hasattr(checks, "_DENY_FUNCS")


def test_post_allow_list_is_documented() -> None:
    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "expressions.md").read_text()
    assert post_allow_list_markdown() in doc, "regenerate the post-processing table in docs/expressions.md"


def test_post_processing_still_computes_over_released_values() -> None:
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", pa.table({"uid": pa.array(range(20), pa.int64()), "c": ["a", "b"] * 10}), privacy_unit="uid",
               columns={"c": {"domain": ["a", "b"]}})
    use_noise(s, zero_noise())
    try:
        r = s.query("SELECT upper(c) AS u, round(power(COUNT(*), 2)) AS sq FROM t GROUP BY c "
                    "HAVING exp(0) = 1 ORDER BY ceiling(log2(COUNT(*) + 1)), u", epsilon=1.0)
        assert r.table.column("u").to_pylist() == ["A", "B"] and r.table.column("sq").to_pylist() == [100.0, 100.0]
    finally:
        s.close()
