"""Long IN lists plan in time linear in their length, with the same answers: a 10 000-value list of the keys a GROUP
BY releases (``tests/test_listed_keys.py``) is planned and answered with exactly the listed keys; the work done once
and shared is the work it replaces (a long condition typed once, kept by its exact form; each SQL type's text kept
per shape; a read's text taken from its bind check's, the read salt put in). ``benchmarks/in_lists.py`` measures
the time (docs/performance.md, "Long IN lists")."""

from __future__ import annotations

import datetime
import decimal
import os
import random
import re
import secrets
import signal
import sys
import threading
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from sqlglot import ErrorLevel, exp

import dpsql
from dpsql.engine.base import read_salted_text, with_read_salt
from dpsql.plan import typer
from dpsql.plan.analyze import listed_domain
from dpsql.plan.parse import parse_statements
from dpsql.plan.typer import READ_SALT, TypeRefusal, type_predicate
from dpsql.rewrite import render as render_module
from dpsql.rewrite.render import render, type_text
from dpsql.testing import use_noise, zero_noise

N = 400


def _table() -> pa.Table:
    return pa.table({
        "uid": pa.array(range(N), pa.int64()),
        "cc": [["FR", "DE", "IT", "ES"][i % 4] for i in range(N)],
        "k": pa.array([i % 7 for i in range(N)], pa.int32()),
        "d": [datetime.date(2024, 1, 1 + i % 5) for i in range(N)],
        "m": pa.array([decimal.Decimal(i % 5 + 10) / 10 for i in range(N)], pa.decimal128(12, 1)),
        "g": [["a", "b"][i % 2] for i in range(N)],
    })


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 0.5))
    s.register("t", _table(), privacy_unit="uid", columns={"g": {"domain": ["a", "b"]}})
    use_noise(s, zero_noise())
    return s


def _counts(sql: str) -> dict[Any, int]:
    """DuckDB's own counts of the query (one row per person here, so the bounded counts)."""
    con = duckdb.connect()
    con.register("t", _table())
    return {r[0]: r[1] for r in con.execute(sql).fetchall()}


def _texts(n: int) -> list[str]:
    return ["FR", "DE"] + [f"v{j:05d}" for j in range(n - 2)]


def test_a_10000_value_list_of_text_keys_is_planned_and_answered_with_every_listed_key() -> None:
    keys = _texts(10_000)
    sql = f"SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ({', '.join(repr(k) for k in keys)}) GROUP BY cc"
    s = _session()
    try:
        # the query plans the list as explain does (explain is the query's planning, run alone): its release names
        # the mechanism the plan chose; the bounded SQL's digests of a text list of more than 5 elements are the
        # same at any length, shown here by explain on 600 of the same keys (explain at 10 000 took about as long
        # as the query: half of this test)
        plan = s.explain(sql.replace(", ".join(repr(k) for k in keys), ", ".join(repr(k) for k in keys[:600])),
                         epsilon=1.0, delta=0.0)
        assert plan.mechanism == "laplace", plan.mechanism
        assert plan.bounded_sql.count("MD5('dpsql_read_salt' || 'v00597')") >= 1  # the digests, under the marker
        r = s.query(sql, epsilon=1.0, delta=0.0)
        assert r.mechanism == "laplace", r.mechanism
    finally:
        s.close()
    got = {row["cc"]: row["n"] for row in r.table.to_pylist()}
    assert sorted(got) == sorted(keys)  # every listed key, a noisy 0 where no row holds it; no other key
    truth = _counts("SELECT cc, COUNT(*) FROM t WHERE cc IN ('FR', 'DE') GROUP BY cc")
    assert got == {k: truth.get(k, 0) for k in keys}


#: 600 keys each: over typer.TYPED_KEPT_FROM nodes (a long condition, typed once and kept); the dates cross a leap
#: day and a year's end
@pytest.mark.parametrize(("column", "values", "literal"), [
    ("k", list(range(-3, 597)), str),
    ("d", [datetime.date(2024, 1, 1) + datetime.timedelta(days=j) for j in range(600)], lambda v: f"'{v}'"),
    ("m", [decimal.Decimal(j + 10) / 10 for j in range(600)], str),
])
def test_long_lists_of_integer_date_and_decimal_keys_release_every_listed_key(column: str, values: list[Any],
                                                                              literal: Any) -> None:
    sql = f"SELECT {column}, COUNT(*) AS n FROM t WHERE {column} IN ({', '.join(literal(v) for v in values)}) GROUP BY {column}"
    s = _session()
    try:
        r = s.query(sql, epsilon=1.0, delta=1e-6)
    finally:
        s.close()
    got = {row[column]: row["n"] for row in r.table.to_pylist()}
    assert sorted(got) == sorted(values)
    truth = _counts(f"SELECT {column}, COUNT(*) FROM t GROUP BY {column}")
    assert got == {v: truth.get(v, 0) for v in values}


@pytest.mark.parametrize("sql", [
    "SELECT g, COUNT(*) AS n FROM t WHERE cc NOT IN ({}) GROUP BY g",  # NOT IN, the keys declared
    "SELECT g, COUNT(*) AS n FROM t WHERE cc IN ({}) GROUP BY g",  # a list on a column that is no key
    "SELECT g, COUNT(*) AS n, SUM(CASE WHEN cc IN ({}) THEN 1 ELSE 0 END) AS c FROM t GROUP BY g",
])
def test_long_lists_that_list_no_key_answer_as_duckdb(sql: str) -> None:
    listed = ", ".join(repr(k) for k in ["FR", "IT"] + [f"v{j:05d}" for j in range(600)])
    s = _session()
    try:
        r = s.query(sql.format(listed), epsilon=1.0, delta=1e-6)
    finally:
        s.close()
    con = duckdb.connect()
    con.register("t", _table())
    truth = {row[0]: tuple(row[1:]) for row in con.execute(sql.format(listed)).fetchall()}
    got = {row[0]: tuple(row[1:]) for row in (tuple(x.values()) for x in r.table.to_pylist())}
    assert sorted(got) == ["a", "b"]  # the declared keys, a noisy 0 where no row is left
    assert got == {g: truth.get(g, tuple(0 for _ in got[g])) for g in got}


def test_the_keys_listed_by_a_long_list_that_conditions_exclude_are_refused_for_free() -> None:
    """The release would have no row: refused, naming the listed keys, whether the conditions are the whole HAVING
    (the keys the post-processing check kept are taken) or ORDER BY and LIMIT follow (run again without them)."""
    listed = ", ".join(repr(k) for k in _texts(600))
    s = _session()
    try:
        for tail in ("", " ORDER BY n DESC LIMIT 5"):
            before = s.remaining()
            with pytest.raises(dpsql.errors.UnsupportedQueryError) as e:
                s.query(f"SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ({listed}) AND cc IS NULL GROUP BY cc{tail}",
                        epsilon=1.0, delta=0.0)
            assert "exclude every listed key (cc: 'FR', 'DE', 'v00000', 'v00001', 'v00002', ...)" in str(e.value)
            assert s.remaining() == before
        # the negative control: conditions that keep one listed key answer it
        r = s.query(f"SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ({listed}) AND cc = 'DE' GROUP BY cc",
                    epsilon=1.0, delta=0.0)
        assert r.table.to_pylist() == [{"cc": "DE", "n": 100}]
    finally:
        s.close()


def test_a_long_decimal_list_is_the_key_set_in_its_order() -> None:
    values = [f"{(j + 10) / 10:.1f}" for j in range(5000)]
    stmt = parse_statements(f"SELECT 1 FROM t WHERE c IN ({', '.join(values)}) AND c IN ({', '.join(values[::-2])})")[0]
    got = listed_domain("c", stmt.args["where"].this, "DECIMAL(12,1)")
    assert got == tuple(decimal.Decimal(v) for v in values[::-2])  # (the last list's order: the first one read)


# -- a long condition typed once ---------------------------------------------------------------------------------


def _condition(n: int, first: str = "a") -> exp.Expression:
    return sqlglot.parse_one(f"k IN ('{first}', {', '.join(repr(f'v{j}') for j in range(n))}) AND x > 1", read="duckdb")


SCHEMA = {"k": "VARCHAR", "x": "BIGINT"}


def test_a_long_condition_is_typed_once_and_each_caller_gets_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    cond = _condition(1000)
    with monkeypatch.context() as m:
        m.setattr(typer, "TYPED_KEPT_FROM", 10**9)  # nothing kept: typed afresh
        fresh = type_predicate(cond, SCHEMA).sql(dialect="duckdb")
    typer._TYPED.clear()
    first = type_predicate(cond, SCHEMA)
    again = type_predicate(_condition(1000), SCHEMA)  # an equal condition, another tree
    assert first.sql(dialect="duckdb") == again.sql(dialect="duckdb") == fresh
    assert first is not again and len(typer._TYPED) == 1
    for node in list(first.find_all(exp.Column)):  # a caller's copy is its own to change
        node.replace(exp.column("__k0"))
    assert type_predicate(cond, SCHEMA).sql(dialect="duckdb") == fresh
    assert type_predicate(cond, SCHEMA, own=False) is type_predicate(cond, SCHEMA, own=False)  # read only: kept one


@pytest.mark.parametrize(("other", "schema", "what"), [
    (lambda: _condition(1000, first="A"), SCHEMA, "WHERE"),  # text in another case (sqlglot's hash folds it)
    (lambda: _condition(1000), {"k": "VARCHAR", "x": "DOUBLE"}, "WHERE"),  # another schema
    (lambda: _condition(1000), SCHEMA, "ON"),  # another clause
])
def test_a_kept_typing_is_taken_only_for_the_same_condition_schema_and_clause(other: Any, schema: dict[str, str],
                                                                                 what: str) -> None:
    typer._TYPED.clear()
    type_predicate(_condition(1000), SCHEMA)
    cond = other()
    got = type_predicate(cond, schema, what).sql(dialect="duckdb")
    assert len(typer._TYPED) == 2  # kept apart
    typer._TYPED.clear()
    assert got == type_predicate(cond, schema, what).sql(dialect="duckdb")  # as typed afresh



def test_the_kept_typings_hold_at_most_their_nodes_beyond_the_one_typed_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long condition's typing is kept by nodes, not only by count: eight lists of 10 000 values held 0.8 GB."""
    typer._TYPED.clear()
    size = sum(1 for _ in type_predicate(_condition(1000), SCHEMA, own=False).walk())

    def kept() -> list[str]:
        return [re.findall(r"'([a-d])'", t.sql())[0] for t, _ in typer._TYPED.values()]  # each one's first value

    monkeypatch.setattr(typer, "TYPED_KEPT_NODES", 10 * size)  # the negative control: room for all
    type_predicate(_condition(1000, first="b"), SCHEMA)
    assert kept() == ["a", "b"]
    monkeypatch.setattr(typer, "TYPED_KEPT_NODES", size)  # room for one: the least recently used goes
    type_predicate(_condition(1000, first="a"), SCHEMA)  # (used again: kept, "b" now the least recent)
    type_predicate(_condition(1000, first="c"), SCHEMA)
    assert kept() == ["c"] and sum(n for _, n in typer._TYPED.values()) == size
    assert type_predicate(_condition(1000, first="c"), SCHEMA, own=False) is \
        type_predicate(_condition(1000, first="c"), SCHEMA, own=False)  # the kept one, taken
    monkeypatch.setattr(typer, "TYPED_KEPT_NODES", size // 2)  # room for none: the one typed last is kept
    type_predicate(_condition(1000, first="d"), SCHEMA)
    assert kept() == ["d"]

def test_a_refused_long_condition_is_refused_each_time_naming_its_own_nodes() -> None:
    typer._TYPED.clear()
    for _ in range(2):
        cond = sqlglot.parse_one(f"k IN ({', '.join(str(j) for j in range(1000))}, 'x')", read="duckdb")
        with pytest.raises(TypeRefusal) as e:
            type_predicate(cond, {"k": "INTEGER"})
        assert all(any(n is m for m in cond.walk()) for n, _ in e.value.problems if n is not None)
    assert not typer._TYPED



@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
@pytest.mark.parametrize("module, lock", [(typer, "_TYPED_LOCK"), (render_module, "_KEPT_LOCK")])
def test_a_forked_child_types_and_renders_whatever_lock_another_thread_held_at_the_fork(module: Any, lock: str) -> None:
    """The locks of the kept typings and type names are made anew in a forked child: another thread of the parent held
    one at the fork, and the child (a new Session's first long condition there) waited for ever on it."""
    held, done = threading.Event(), threading.Event()
    inherited = getattr(module, lock)

    def hold() -> None:
        with inherited:
            held.set()
            done.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(60)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 4
        try:
            signal.alarm(60)  # (waiting for ever on the lock: killed by SIGALRM)
            if not inherited.locked() or getattr(module, lock) is inherited:
                code = 3  # the negative control: the lock inherited is held, for ever, in the child
            else:
                typer._TYPED.clear()
                render_module._TYPE_TEXTS.clear()
                render_module._kept_types.cache_clear()
                typed = type_predicate(_condition(1000), SCHEMA)
                text = render(typed)
                assert text == typed.sql(dialect="duckdb") and type_text(exp.DataType.build("DECIMAL(9,2)")) == \
                    "DECIMAL(9, 2)"
                code = 0
        finally:
            sys.stdout.flush()
            os._exit(code)
    done.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status

# -- each SQL type's text kept per shape ----------------------------------------------------------------------------


TYPED = [
    ("k IN ({})", "INTEGER", [str(j) for j in range(40)]),
    ("k IN ({})", "BIGINT", [str(j) for j in range(40)]),
    ("k IN ({})", "DECIMAL(12,1)", [f"{j / 10:.1f}" for j in range(40)]),
    ("k IN ({})", "DECIMAL(38,10)", [f"{j / 7:.10f}" for j in range(40)]),
    ("k IN ({})", "DATE", [f"'2024-01-{j % 28 + 1:02d}'" for j in range(40)]),
    ("k IN ({})", "TIMESTAMP", [f"'2024-01-{j % 28 + 1:02d} 10:00:00'" for j in range(40)]),
    ("k IN ({})", "DOUBLE", [f"{j}.5" for j in range(40)]),
    ("k IN ({})", "BOOLEAN", ["true", "false", "true", "false", "true", "false", "true"]),
    ("k IN ({})", "SMALLINT", [str(j) for j in range(40)]),
    ("k IN ({})", "HUGEINT", [str(10**20 + j) for j in range(40)]),
    ("k IN ({})", "FLOAT", [f"{j}.25" for j in range(40)]),
    ("k IN ({})", "VARCHAR", [f"'it''s {j}'" for j in range(40)]),
    ("k * 2 IN ({})", "DECIMAL(9,2)", [f"{j}.25" for j in range(40)]),
]


@pytest.mark.parametrize(("where", "column", "values"), TYPED)
@pytest.mark.parametrize("dialect", ["duckdb", "spark"])
def test_types_rendered_once_per_shape_read_as_sqlglot_renders_them(where: str, column: str, values: list[str],
                                                                     dialect: str) -> None:
    typed = type_predicate(sqlglot.parse_one(where.format(", ".join(values)), read="duckdb"), {"k": column})
    for pretty in (False, True, False):  # (the second time from the kept texts)
        want = typed.sql(dialect=dialect, pretty=pretty, unsupported_level=ErrorLevel.RAISE)
        assert render(typed, dialect=dialect, pretty=pretty) == want
    for cast in typed.find_all(exp.Cast):
        assert type_text(cast.args["to"]) == cast.args["to"].sql(dialect="duckdb")


def test_a_type_a_dialect_cannot_render_is_refused_each_time() -> None:
    tree = exp.select(exp.Cast(this=exp.column("x"), to=exp.DataType.build("INT128"))).from_("t")
    for _ in range(2):
        with pytest.raises(dpsql.errors.UnsupportedQueryError):
            render(tree, dialect="singlestore")
    assert render(tree) == tree.sql(dialect="duckdb")


# -- a read's text from its bind check's ----------------------------------------------------------------------------


def _bounded(s: dpsql.Session, sql: str) -> Any:
    r = s._route(sql, 1.0, 1e-6, None)
    return r.bounded("00" * 16, s._engine.ops)


SALT = "0123456789abcdef" * 2


def test_the_read_salted_text_is_the_salted_trees_text() -> None:
    s = _session()
    try:
        listed = ", ".join(repr(k) for k in _texts(500))
        for sql in (f"SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ({listed}) GROUP BY cc",
                    f"SELECT g, COUNT(*) AS n FROM t WHERE cc NOT IN ({listed}) AND k IN (1, 2, 3, 4, 5, 6) GROUP BY g"):
            ast = _bounded(s, sql)
            got = read_salted_text(ast, render(ast), SALT)
            assert got is not None and f"'{READ_SALT}'" not in got and f"'{SALT}'" in got
            with pytest.MonkeyPatch.context() as m:
                m.setattr("secrets.token_hex", lambda _n: SALT)
                assert got == render(with_read_salt(ast))
            assert render(ast) != got  # the tree itself is unchanged: it keeps the marker
        # a query listing the marker's text: not told apart from the salt by the text, so the tree is salted
        ast = _bounded(s, f"SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ({listed}, '{READ_SALT}') GROUP BY cc")
        assert read_salted_text(ast, render(ast)) is None
        ast = _bounded(s, "SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ('FR', 'DE') GROUP BY cc")  # no read salt
        assert read_salted_text(ast, render(ast)) is None
    finally:
        s.close()



MARKED = "/* sqlglot.meta dpsql_read_salt */"


def test_a_comment_marks_no_literal_of_the_query_as_the_read_salt() -> None:
    """sqlglot sets the meta key a ``sqlglot.meta`` comment names on the node it follows: the read salt's mark on a
    literal of the query would have put the secret salt in its place (and a node marked as written crashed the
    analysis). dpsql's marks are dropped from a parsed query."""
    sql = f"SELECT g, COUNT(*) AS n FROM t WHERE cc IN ('FR' {MARKED}, 'DE') AND g <> 'x' {MARKED} GROUP BY g"
    raw = sqlglot.parse_one(sql, read="duckdb")  # the negative control: sqlglot marks them
    assert [n.this for n in raw.find_all(exp.Literal) if n.meta.get(READ_SALT)] == ["FR", "x"]
    parsed = parse_statements(sql)[0]
    assert not [n for n in parsed.walk() if any(str(k).startswith("dpsql_") for k in (n._meta or {}))]
    assert parsed.find(exp.Literal).meta["line"] == 1  # sqlglot's own keys kept
    s = _session()
    try:
        listed = ", ".join(repr(k) for k in _texts(600))
        ast = _bounded(s, f"SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ({listed}) AND g <> 'x' {MARKED} GROUP BY cc")
        assert all(n.this == READ_SALT for n in ast.find_all(exp.Literal) if n.meta.get(READ_SALT))
        with pytest.raises(dpsql.errors.QueryError, match="nosuch"):
            s.explain("SELECT COUNT(*) AS n FROM t WHERE nosuch /* sqlglot.meta dpsql_written */ > 1", epsilon=1.0)
    finally:
        s.close()

def test_each_read_of_a_long_list_runs_its_bind_checks_text_under_a_fresh_salt(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _session()
    ran: list[str] = []
    con = s._engine._con

    class Connection:  # the engine's connection, the texts its private reads run noted
        def sql(self, text: str, *a: Any, **kw: Any) -> Any:
            ran.append(text)
            return con.sql(text, *a, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(con, name)

    salts: list[str] = []

    def token_hex(n: int) -> str:  # every secret drawn (the read salt, the query's, names), noted
        out = random.getrandbits(8 * n).to_bytes(n, "big").hex()
        salts.append(out)
        return out

    monkeypatch.setattr(s._engine, "_con", Connection())
    monkeypatch.setattr(secrets, "token_hex", token_hex)
    listed = ", ".join(repr(k) for k in _texts(600))
    sql = f"SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ({listed}) GROUP BY cc"
    try:
        for _ in range(2):
            s.query(sql, epsilon=1.0, delta=1e-6)
    finally:
        s.close()
    # the first read runs its bind check's text, the second (its bind check remembered) the tree salted anew
    reads = [t for t in ran if "_dpsql_src_t_" in t and not t.startswith("DESCRIBE ")]
    assert len(reads) == 2
    used = []
    for text in reads:
        assert f"'{READ_SALT}'" not in text  # every digest under a secret
        of_list = set(re.findall(r"MD5\('([0-9a-f]{32})' \|\| 'v\d{5}'\)", text))
        assert len(of_list) == 1 and of_list <= set(salts)
        used += of_list
    assert used[0] != used[1]  # drawn for each read
