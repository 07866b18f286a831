"""A query's private read runs the text its bind check bound (``DuckDBBackend._described_text``): the bounded tree
of a query is rendered once, for the bind check's ``DESCRIBE``, not again for the read. These tests hold that the
text run is exactly the text the read's tree renders to, that a tree with a read salt still gets its own fresh
salt, and that a kept text is never run for another tree."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql import Budget
from dpsql.engine import duckdb as duck
from dpsql.rewrite.bound import SALT_PLACEHOLDER
from dpsql.rewrite.render import render

QUERIES = [
    "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
    "SELECT url, country, COUNT(*) AS n FROM events GROUP BY url, country",
    "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events WHERE likes > 2 GROUP BY country",
    "SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey",
]


def _session(engine: dict[str, Any] | None = None, budget: float = 1e6, connection: Any = None) -> dpsql.Session:
    g = np.random.default_rng(3)
    s = dpsql.Session(budget=Budget(budget, 0.9), engine=engine, connection=connection)
    s.register("events", pa.table({"user_id": g.integers(0, 80, 400),
                                   "country": np.array([f"C{i}" for i in range(12)])[g.integers(0, 12, 400)],
                                   "url": np.array([f"u{i}" for i in range(30)])[g.integers(0, 30, 400)],
                                   "likes": g.integers(0, 10, 400).astype(np.float64)}),
               privacy_unit="user_id", max_groups_per_unit=3, max_rows_per_group=2,
               columns={"likes": {"bounds": [0, 10]}})
    s.register("customer", pa.table({"c_custkey": np.arange(60)}), privacy_unit="c_custkey")
    s.register("orders", pa.table({"o_orderkey": np.arange(100), "o_custkey": g.integers(0, 60, 100)}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8},
               allow_conditional_sampling=True)
    return s


def _spy(s: dpsql.Session, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[str], list[str]]:
    """The trees the read is given, the text the read runs, and the bounded texts rendered meanwhile."""
    given: list[Any] = []
    ran: list[str] = []
    rendered: list[str] = []
    fetch, con = s._engine.fetch_arrow, s._engine._con

    def fetch_arrow(ast: Any, **kw: Any) -> Any:
        given.append(ast)
        return fetch(ast, **kw)

    class Connection:  # the engine's connection, its private reads' texts noted
        def sql(self, text: str, *a: Any, **kw: Any) -> Any:
            ran.append(text)
            return con.sql(text, *a, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(con, name)

    def spy_render(ast: Any, **kw: Any) -> str:
        out = render(ast, **kw)
        rendered.append(out)
        return out

    monkeypatch.setattr(s._engine, "fetch_arrow", fetch_arrow)
    monkeypatch.setattr(s._engine, "_con", Connection())
    monkeypatch.setattr(duck, "render", spy_render)
    return given, ran, rendered


@pytest.mark.parametrize("engine", [None, {"keyed_hash": "portable"}])
@pytest.mark.parametrize("sql", QUERIES)
def test_a_query_reads_the_text_its_bind_check_bound_rendered_once(sql: str, engine: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    s = _session(engine)
    given, ran, rendered = _spy(s, monkeypatch)
    s.query(sql, epsilon=1.0, delta=1e-6)
    assert len(given) == 1
    text = render(given[0])  # what the read's own tree renders to
    assert [t for t in ran if t == text] == [text]  # the read ran exactly it, once
    assert rendered.count(text) == 1  # rendered once: for the bind check (its DESCRIBE), not again for the read
    assert s._engine._described == {}  # taken by the read: never run again
    s.close()


def test_a_tree_with_a_read_salt_is_read_under_a_fresh_salt_not_the_bound_text(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _session()
    given, ran, _ = _spy(s, monkeypatch)
    codes = ", ".join(f"'u{i}'" for i in range(0, 3000))  # a long IN list: its digests take a read salt
    s.query(f"SELECT COUNT(*) AS n FROM events WHERE url IN ({codes})", epsilon=1.0, delta=1e-6)
    bound = render(given[0])  # the tree as bound: the read salt's marker
    assert ran and bound not in ran  # the read ran a copy with its own salt in place of the marker
    s.close()


def test_a_kept_text_is_run_only_for_its_own_unchanged_tree() -> None:
    s = _session()
    backend = s._engine
    built = s._route("SELECT country, COUNT(*) AS n FROM events GROUP BY country", 1.0, 1e-6, None)
    ast = built.bounded("00" * 16, backend.ops)
    backend.describe(ast)
    other = ast.copy()  # equal, but another tree: rendered, not given the kept text
    assert backend._described_text(other) is None
    kept = backend._described_text(ast)
    assert kept is not None and kept[0] == render(ast)
    assert backend._described_text(ast) is None  # taken once
    for _ in range(6):  # at most 4 kept: bound queries that are refused never read theirs
        backend.describe(ast.copy())
    assert len(backend._described) == 4
    s.close()


def _reads_checked(s: dpsql.Session, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str], list[str]]:
    """The secret salts the session drew, the texts each private read should run (the given tree's own rendering,
    or a prepared read's text), and every text the connection ran."""
    salts: list[str] = []
    expected: list[str] = []
    draw, fetch = s._noise.salt, s._engine.fetch_arrow

    def salt() -> str:
        out = draw()
        salts.append(out)
        return out

    def fetch_arrow(ast: Any, **kw: Any) -> Any:
        expected.append(ast.sql if isinstance(ast, duck.SaltedRead) else render(ast))  # before the read
        return fetch(ast, **kw)

    _, ran, _ = _spy(s, monkeypatch)
    monkeypatch.setattr(s._noise, "salt", salt)
    monkeypatch.setattr(s._engine, "fetch_arrow", fetch_arrow)
    return salts, expected, ran


def _assert_own_texts(salts: list[str], expected: list[str], ran: list[str]) -> None:
    salted = [t for t in ran if any(x in t for x in salts) and not t.startswith("DESCRIBE ")]  # the reads
    assert sorted(salted) == sorted(t for t in expected if any(x in t for x in salts))
    for t in salted:  # each read holds one query's salt, and no salt is read by two queries' texts
        assert sum(x in t for x in salts) == 1
    assert len({next(x for x in salts if x in t) for t in salted}) == len(salted)


def test_threads_of_one_session_each_read_their_own_query_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several threads of one session bind and read at once, every query bound anew (no bind check remembered, so
    each read is a kept text): each read runs the text of its own tree, under its own salt."""
    import threading

    from dpsql import engine as backends

    s = _session()
    monkeypatch.setattr(backends, "remember_bind_check", lambda *_: None)
    salts, expected, ran = _reads_checked(s, monkeypatch)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(4):
                s.query(QUERIES[(k + i) % len(QUERIES)], epsilon=1.0, delta=1e-6)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(expected) == 16
    _assert_own_texts(salts, expected, ran)
    s.close()


def test_refused_and_failed_reads_leave_no_text_for_the_next_query(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query refused after its bind check (over the budget), one whose read fails after it took its kept text,
    an explain (a stand-in salt), and a ROLLUP of five bound queries (more than four kept) never lend their text to
    a later read: each read runs its own tree's text under its own salt."""
    from dpsql import engine as backends
    from dpsql.errors import BudgetExceededError, ExecutionError

    s = _session(budget=10.0)
    monkeypatch.setattr(backends, "remember_bind_check", lambda *_: None)
    salts, expected, ran = _reads_checked(s, monkeypatch)
    with pytest.raises(BudgetExceededError):
        s.query(QUERIES[0], epsilon=10.5, delta=1e-6)
    s.explain(QUERIES[0], epsilon=1.0, delta=1e-6)
    con = s._engine._con
    failed: list[str] = []

    class Failing:
        def sql(self, text: str, *a: Any, **kw: Any) -> Any:
            if not failed and any(x in text for x in salts):
                failed.append(text)
                raise duck.duckdb.IOException("the read failed")
            return con.sql(text, *a, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(con, name)

    monkeypatch.setattr(s._engine, "_con", Failing())
    with pytest.raises(ExecutionError):
        s.query(QUERIES[0], epsilon=1.0, delta=1e-6)
    assert failed == expected[:1]  # the failed read ran its own text
    monkeypatch.setattr(s._engine, "_con", con)
    s.query(QUERIES[0], epsilon=1.0, delta=1e-6)
    s.query("SELECT country, url, COUNT(*) AS n FROM events GROUP BY ROLLUP (country, url)", epsilon=3.0, delta=1e-6)
    s.query("SELECT country, url, COUNT(*) AS n FROM events GROUP BY CUBE (country, url)", epsilon=4.0, delta=1e-6)
    assert len(expected) == 1 + 1 + 3 + 4
    _assert_own_texts(salts, [*failed, *expected[1:]], [*failed, *ran])
    assert not any(SALT_PLACEHOLDER in t for t in ran)  # the stand-in salt of explain and the bind checks: never read
    s.close()


def test_a_callers_connection_batches_and_workloads_read_their_own_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a caller's DuckDB connection with the portable keyed hash: a join's batch of bounded queries (each bound,
    then each read), a DAWA range workload and a GROUP BY, each asked twice (a kept text first, then the prepared
    read): every read runs its own text under its own salt, never the first run's."""
    s = _session({"keyed_hash": "portable"}, connection=duck.duckdb.connect())
    g = np.random.default_rng(5)
    s.register("visits", pa.table({"uid": g.integers(0, 50, 300), "age": g.integers(0, 40, 300)}),
               privacy_unit="uid", columns={"age": {"bounds": [0, 40], "bins": 40}})
    salts, expected, ran = _reads_checked(s, monkeypatch)
    workload = [f"SELECT COUNT(*) FROM visits WHERE age >= {a} AND age < {a + 10}" for a in range(0, 40, 10)]
    for _ in range(2):
        s.query("SELECT COUNT(*) AS n, COUNT(o.o_orderkey) AS k FROM customer c JOIN orders o ON c.c_custkey = "
                "o.o_custkey", epsilon=1.0, delta=1e-6)
        s.query_many(workload, epsilon=1.0)
        s.query(QUERIES[1], epsilon=1.0, delta=1e-6)
    assert len(expected) >= 8  # a batch's two reads each time
    _assert_own_texts(salts, expected, ran)
    assert s._engine._described == {} or all(v[1] not in ran for v in s._engine._described.values())
    s.close()


def test_the_columns_kept_with_a_text_are_its_own_trees_when_another_check_comes_between() -> None:
    """The columns a kept text reads are its own tree's: another thread's ``check_text_columns`` of another query,
    between this bind check's test of whose columns were found last and its taking them, is not taken for this
    query's (which would check another query's text columns, and size the read's threads for them)."""
    from dpsql.engine import _duckdb_native as native

    s = _session()
    backend = s._engine
    mine, other = (s._route(q, 1.0, 1e-6, None).bounded("00" * 16, backend.ops) for q in QUERIES[1:3])
    assert native.reads_of(mine) != native.reads_of(other)

    class Between(tuple):  # type: ignore[type-arg]  # another thread's check runs right after the first look
        def __getitem__(self, i: Any) -> Any:
            out = tuple.__getitem__(self, i)
            if i == 0:
                backend.check_text_columns(other)
            return out

    backend._reads_of = Between((mine, native.reads_of(mine)))
    backend.describe(mine)
    kept = backend._described_text(mine)
    assert kept is not None and kept[1] in (None, native.reads_of(mine))
    s.close()
