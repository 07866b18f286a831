"""The Python work of building a bounded query (``dpsql.rewrite.bound.bounded_query``), which every
query pays before DuckDB reads a row: no type is parsed from its text, and the tree is built
without copying its own subtrees over and over.

Counted, not timed (no timed assertions in tests; ``benchmarks/peers.py`` times it): sqlglot's
``DataType.build("DOUBLE")`` runs the SQL parser on every call, and its ``func`` and ``alias_``
copy their arguments, so a bounded query whose layers each wrapped the previous ones copied its
large parts (the domain's 50 literals, the clamped values) at every layer. Before the fix the
peer queries' builds created 3.4x (``SUM``, ``AVG`` by country) and 4.5x (``COUNT`` by country)
the nodes they return and parsed 18 and 4 type names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
import sqlglot.expressions.core as sqlglot_core
from sqlglot import exp
from test_bounding import plan_for, spec_for

from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.rewrite.bound import Caps, bounded_query

EVENTS = pa.table({"user_id": [1, 2, 3], "country": ["C1", "C2", "C1"], "url": ["a", "b", "c"],
                   "likes": [1, 2, 3]})
SPEC = spec_for("events", EVENTS, bounds={"likes": (0, 10)}, domains={"country": tuple(f"C{i}" for i in range(50))})
CAPS = Caps(max_groups_per_unit=5, max_rows_per_group=1)


@contextmanager
def _counted() -> Iterator[dict[str, int]]:
    """Counts the sqlglot nodes created and the type texts parsed while the block runs."""
    seen = {"nodes": 0, "parsed": 0}
    init, from_str = sqlglot_core.Expr.__init__, exp.DataType.from_str.__func__

    def counting_init(self: Any, *a: Any, **k: Any) -> None:
        seen["nodes"] += 1
        init(self, *a, **k)

    def counting_from_str(cls: Any, *a: Any, **k: Any) -> Any:
        seen["parsed"] += 1
        return from_str(cls, *a, **k)

    sqlglot_core.Expr.__init__ = counting_init  # type: ignore[method-assign]
    exp.DataType.from_str = classmethod(counting_from_str)  # type: ignore[method-assign, assignment]
    try:
        yield seen
    finally:
        sqlglot_core.Expr.__init__ = init  # type: ignore[method-assign]
        exp.DataType.from_str = classmethod(from_str)  # type: ignore[method-assign, assignment]


@pytest.mark.parametrize("sql", [
    "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
    "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events GROUP BY country",
    "SELECT url, country, COUNT(*) AS n FROM events GROUP BY url, country",
])
def test_building_a_bounded_query_parses_no_type_and_copies_little(sql: str) -> None:
    plan = plan_for(sql, SPEC)
    bounded_query(plan, CAPS, salt="s", unit_column="user_id", ops=DuckDBOps())  # caches filled
    with _counted() as seen:
        ast = bounded_query(plan, CAPS, salt="s", unit_column="user_id", ops=DuckDBOps())
    returned = sum(1 for _ in ast.walk())
    assert seen["parsed"] == 0
    assert seen["nodes"] <= 2.5 * returned, (seen["nodes"], returned)


@pytest.mark.parametrize("sql", [
    "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
    "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events GROUP BY country",
])
def test_reading_a_bounded_query_renders_it_without_a_copy(sql: str) -> None:
    """The tree built for one read is rendered once, without sqlglot's copy of it (about two
    thirds of a render; before: a copy of every node), and reads what the copied render reads."""
    from dpsql.engine.duckdb import DuckDBBackend
    from dpsql.rewrite.render import render

    backend = DuckDBBackend(None)
    try:
        backend.register_source("events", "arrow", EVENTS)
        plan = plan_for(sql, SPEC)
        ast = bounded_query(plan, CAPS, salt="s", unit_column="user_id", ops=backend.ops)
        expected = render(ast)
        with _counted() as seen:
            rows = backend.fetch_arrow(ast)
        assert seen["nodes"] < sum(1 for _ in ast.walk()) / 2, seen  # a copy would create one per node
        # the same rows (the engine keeps no row order: preserve_insertion_order is off)
        assert sorted(map(repr, rows.to_pylist())) == sorted(map(repr, backend._con.sql(expected).to_arrow_table().to_pylist()))
        assert render(ast) == expected  # the tree still renders to the same query
    finally:
        backend.close()


def test_the_analysis_renders_each_aggregate_call_once_for_its_spelling() -> None:
    """The analysis renders an aggregate call of the SELECT list twice: once for its normalised text (the key
    that merges equal aggregates) and once for its position and spelling in the query (the name its argument's
    messages use); it rendered the call again for the spelling, a copy of its tree each time."""
    from collections import Counter

    from dpsql.plan.analyze import analyze

    sql = "SELECT country, SUM(likes) AS s, AVG(likes) AS a, COUNT(*) AS n FROM events GROUP BY country"
    rendered: Counter[str] = Counter()
    original = exp.Expression.sql

    def counting_sql(self: Any, *a: Any, **k: Any) -> str:
        rendered[type(self).__name__] += 1
        return original(self, *a, **k)

    exp.Expression.sql = counting_sql  # type: ignore[method-assign]
    try:
        plan = analyze(sql, {"events": SPEC})
    finally:
        exp.Expression.sql = original  # type: ignore[method-assign]
    assert [a.kind for a in plan.aggregates] == ["sum", "avg", "count_star"]
    assert rendered["Sum"] == rendered["Avg"] == rendered["Count"] == 2, rendered


class _CallsCounted:
    """A DuckDB connection whose calls are counted by method name (the engine's own connection, seen from outside)."""

    texts: list[str] = []  # the statements' texts, of every such connection

    def __init__(self, con: Any, calls: list[str]) -> None:
        self._con, self._calls = con, calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._con, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(name)
            self.texts.append(str(args[0]) if args else "")
            return attr(*args, **kwargs)
        return call


def test_the_settings_probe_runs_with_extension_autoloading_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's own connection asks which settings it has with ``current_setting``; on a DuckDB build without ICU
    linked in, naming ICU's 'Calendar' setting could autoload (or install) the extension. The probe turns extension
    autoloading and autoinstalling off before it, in the same call."""
    import duckdb

    import dpsql.engine.duckdb as engine_duckdb
    from dpsql.engine.duckdb import DuckDBBackend

    connect = duckdb.connect
    monkeypatch.setattr(engine_duckdb.duckdb, "connect", lambda *a, **k: _CallsCounted(connect(*a, **k), []))
    del _CallsCounted.texts[:]
    backend = DuckDBBackend(None)
    try:
        probes = [t for t in _CallsCounted.texts if "current_setting('Calendar')" in t]
        assert len(probes) == 1, _CallsCounted.texts
        before = probes[0].split("current_setting('Calendar')")[0]
        assert "SET autoinstall_known_extensions = false" in before and "SET autoload_known_extensions = false" in before
        assert backend._icu  # still found where ICU is linked in
    finally:
        backend.close()


def test_the_engines_own_connection_starts_and_binds_in_few_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call on a DuckDB connection costs its own round trip: the engine's own connection gets its settings in
    one call of all its SET statements (before: one call each, about 20) and finds the settings it pins with
    ``current_setting`` (not ``duckdb_settings()``, which computes every setting), in the call that reads its
    memory_limit; a bind check of a bounded query
    is one statement (``DESCRIBE`` and the query's text, rendered once), executed directly, not through a relation
    (``sql``) that binds it once more before running it. The settings and the described types are the same."""
    import duckdb

    import dpsql.engine.duckdb as engine_duckdb
    from dpsql.engine.duckdb import DuckDBBackend

    calls: list[str] = []
    connect = duckdb.connect
    monkeypatch.setattr(engine_duckdb.duckdb, "connect", lambda *a, **k: _CallsCounted(connect(*a, **k), calls))
    backend = DuckDBBackend(None)
    try:
        assert calls.count("execute") + calls.count("sql") <= 2, calls  # which settings exist and memory_limit; the SETs
        assert backend._icu and backend._follower  # the settings it pins and reads are found (current_setting)
        assert not any("duckdb_settings" in t for t in _CallsCounted.texts), _CallsCounted.texts  # ~6 ms a call
        shown = dict(backend._con.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ('TimeZone', 'preserve_insertion_order', "
            "'enable_progress_bar', 'autoload_known_extensions', 'default_null_order', 'disabled_optimizers')").fetchall())
        assert shown["TimeZone"] == "UTC" and shown["preserve_insertion_order"] == "false", shown
        assert shown["enable_progress_bar"] == "false" and shown["autoload_known_extensions"] == "false", shown
        assert shown["default_null_order"].lower().startswith("nulls_last") and "statistics_propagation" in shown["disabled_optimizers"], shown
        backend.register_source("events", "arrow", EVENTS)
        ast = bounded_query(plan_for("SELECT country, SUM(likes) AS s FROM events GROUP BY country", SPEC), CAPS,
                            salt="s", unit_column="user_id", ops=backend.ops)
        del calls[:]
        described = backend.describe(ast)
        assert calls == ["execute"], calls
        assert described == [
            (str(r[0]), str(r[1])) for r in backend._con.sql("DESCRIBE " + backend.render(ast)).fetchall()]
    finally:
        backend.close()
