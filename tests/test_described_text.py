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
from dpsql.rewrite.render import render

QUERIES = [
    "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
    "SELECT url, country, COUNT(*) AS n FROM events GROUP BY url, country",
    "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events WHERE likes > 2 GROUP BY country",
    "SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey",
]


def _session(engine: dict[str, Any] | None = None) -> dpsql.Session:
    g = np.random.default_rng(3)
    s = dpsql.Session(budget=Budget(1e6, 0.9), engine=engine)
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
