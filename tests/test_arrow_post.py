"""Post-processing that only renames released columns and orders the rows is done in Arrow
(``dpsql.engine._arrow_post``), and gives exactly the table DuckDB gives: names, types, values bit
for bit and row order, on generated tables; anything else still runs in DuckDB."""

from __future__ import annotations

import random
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from sqlglot import exp

import dpsql
from dpsql.budget import Budget
from dpsql.engine import DuckDBBackend, EngineSettings
from dpsql.engine._arrow_post import projection
from dpsql.testing import use_noise, zero_noise

REL = "__released"


class _Counting:
    """A connection that counts the statements and registrations made through it."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con, self.calls = con, 0

    def __getattr__(self, name: str) -> Any:
        if name in ("sql", "execute", "register"):
            self.calls += 1
        return getattr(self._con, name)


def _in_duckdb(backend: DuckDBBackend, table: pa.Table, query: exp.Select) -> pa.Table:
    """The DuckDB path of ``post_process`` (the fast path refused by a caller's-connection flag)."""
    backend._owned = False
    try:
        return backend.post_process(table, lambda rel: query.copy())
    finally:
        backend._owned = True


def _bits(t: pa.Table) -> list[list[Any]]:
    """Column values with floats as their bit patterns (NaN and -0.0 compared exactly)."""
    out = []
    for col in t.columns:
        if pa.types.is_floating(col.type):
            width = pa.int64() if col.type.bit_width == 64 else pa.int32()
            col = pa.chunked_array([c.view(width) for c in col.chunks], width)
        out.append(col.to_pylist())
    return out


def _text(rng: random.Random) -> str | None:
    pool = ["", "a", "A", "b", "ab", "a b", "é", "e\u0301", "Z", "~", "\x00", "日本", "\U0001f600", "aa", "B"]
    return None if rng.random() < 0.1 else rng.choice(pool) + rng.choice(pool)


def _table(rng: random.Random, n: int) -> pa.Table:
    ints = [None if rng.random() < 0.1 else rng.randint(-5, 5) for _ in range(n)]
    floats = [rng.choice([None, float("nan"), -0.0, 0.0, 1.5, -2.25, float("inf"), float("-inf"), 1e300])
              for _ in range(n)]
    # unique (key text, key int) pairs, as released keys are
    seen: set[tuple[Any, Any]] = set()
    keys: list[tuple[Any, Any]] = []
    while len(keys) < n:
        k = (_text(rng), None if rng.random() < 0.1 else rng.randint(0, 3))
        if k not in seen:
            seen.add(k)
            keys.append(k)
    return pa.table({
        "__k0": pa.array([k[0] for k in keys], pa.string()),
        "__k1": pa.array([k[1] for k in keys], pa.int32()),
        "__a0": pa.array(ints, pa.int64()),
        "__a1": pa.array(floats, pa.float64()),
        "__a2": pa.array([None if rng.random() < 0.2 else rng.random() < 0.5 for _ in range(n)], pa.bool_()),
        "__a3": pa.array([rng.randint(0, 2**64 - 1) for _ in range(n)], pa.uint64()),
        "__a4": pa.array([rng.random() for _ in range(n)], pa.float32()),
    })


def _query(rng: random.Random, table: pa.Table) -> exp.Select:
    cols = list(table.column_names)
    picked = rng.sample(cols, rng.randint(1, len(cols)))
    items = [exp.alias_(exp.column(c), rng.choice(["n", "country", "x y", "Ñ", "é"]) + str(i), quoted=True)
             for i, c in enumerate(picked)]
    order = []
    for c in rng.sample(["__a0", "__a2", "__k1", "__k0"], rng.randint(0, 2)) + ["__k0", "__k1"]:
        order.append(exp.Ordered(this=exp.column(c), desc=rng.random() < 0.3, nulls_first=False))
    return exp.select(*items).from_(exp.to_table(REL)).order_by(*order)


def _by_k0() -> exp.Select:
    """``SELECT __k0 AS k FROM __released ORDER BY __k0`` (ascending, NULLs last, as DuckDB reads it)."""
    return exp.select(exp.alias_(exp.column("__k0"), "k", quoted=True)).from_(exp.to_table(REL)).order_by(
        exp.Ordered(this=exp.column("__k0"), nulls_first=False))


def test_projection_gives_what_duckdb_gives_on_generated_tables() -> None:
    backend = DuckDBBackend(None, EngineSettings())
    rng = random.Random("arrow-post")
    try:
        for trial in range(150):
            table = _table(rng, rng.choice([0, 1, 2, 7, 40]))
            query = _query(rng, table)
            fast = projection(table, query, REL)
            assert fast is not None, query.sql("duckdb")
            slow = _in_duckdb(backend, table, query)
            assert fast.schema == slow.schema, (trial, query.sql("duckdb"))
            assert _bits(fast) == _bits(slow), (trial, query.sql("duckdb"))
    finally:
        backend.close()


def test_the_comparison_can_fail() -> None:
    """Negative control: text ordered as a case-insensitive collation would order it differs."""
    backend = DuckDBBackend(None, EngineSettings())
    try:
        table = pa.table({"__k0": pa.array(["b", "B", "a", "A", "é"], pa.string())})
        query = _by_k0()
        slow = _in_duckdb(backend, table, query)
        wrong = table.take(sorted(range(5), key=lambda i: table.column(0)[i].as_py().lower()))
        assert _bits(slow) != _bits(wrong.rename_columns(["k"]))
        fast = projection(table, query, REL)
        assert fast is not None and _bits(fast) == _bits(slow) == [["A", "B", "a", "b", "é"]]
    finally:
        backend.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT __k0 AS k FROM __released WHERE __a0 > 0 ORDER BY __k0",  # a condition
        "SELECT __k0 AS k FROM __released ORDER BY __k0 LIMIT 1",
        "SELECT __a0 + 1 AS k FROM __released ORDER BY __k0",  # a computed output
        "SELECT __k0 AS k FROM __released ORDER BY __a1",  # floats ordered: DuckDB's
        "SELECT __k0 AS k FROM __released ORDER BY __k0 NULLS FIRST",
        "SELECT __k0 AS __a0, __a0 AS k FROM __released ORDER BY __a0",  # ORDER BY names an output
        "SELECT __k0 AS k, __a0 AS K FROM __released ORDER BY __k0",  # two outputs of one name
        "SELECT __k0 AS k FROM __released",  # no order over several rows
        "SELECT __k0 AS k FROM other ORDER BY __k0",
        "SELECT r.__k0 AS k FROM __released AS r ORDER BY __k0",
        "SELECT DISTINCT __k0 AS k FROM __released ORDER BY __k0",
    ],
)
def test_anything_else_is_left_to_duckdb(sql: str) -> None:
    table = pa.table({"__k0": ["b", "a"], "__a0": [1, 2], "__a1": [0.5, -0.0]})
    assert projection(table, exp.maybe_parse(sql, dialect="duckdb"), REL) is None


@pytest.mark.parametrize("alias", ["", "a\x00b"])
def test_names_duckdb_would_refuse_or_cut_are_left_to_it(alias: str) -> None:
    table = pa.table({"__k0": ["b", "a"]})
    query = exp.select(exp.alias_(exp.column("__k0"), alias, quoted=True)).from_(exp.to_table(REL)).order_by(
        exp.Ordered(this=exp.column("__k0"), nulls_first=False))
    assert projection(table, query, REL) is None


def test_large_text_and_dictionaries_are_left_to_duckdb() -> None:
    query = _by_k0()
    for col in (pa.array(["b", "a"], pa.large_string()), pa.array(["b", "a"]).dictionary_encode()):
        assert projection(pa.table({"__k0": col}), query, REL) is None


def test_a_grouped_query_runs_no_duckdb_statement_after_its_bounded_read() -> None:
    """The Q1 shape of ``benchmarks/peers.py``: the read of the bounded relation is the only
    statement after the charge (before: a registration and a post-processing query too)."""
    events = pa.table({"user_id": list(range(40)), "country": ["b", "a", "c", "a"] * 10})
    with dpsql.Session(budget=Budget(100.0, 1e-3)) as s:
        use_noise(s, zero_noise())
        s.register("events", events, privacy_unit="user_id", columns={"country": {"domain": ["a", "b", "c", "d"]}})
        sql = "SELECT country, COUNT(*) AS n FROM events GROUP BY country"
        s.query(sql, epsilon=1.0, delta=1e-6)  # the bind check, remembered
        engine = s._engine
        counting = _Counting(engine._con)
        engine._con = counting  # type: ignore[assignment]
        try:
            r = s.query(sql, epsilon=1.0, delta=1e-6)
        finally:
            engine._con = counting._con
        assert counting.calls == 1
        assert r.table.schema == pa.schema([("country", pa.string()), ("n", pa.int64())])
        assert r.table.to_pylist() == [{"country": "a", "n": 20}, {"country": "b", "n": 10},
                                       {"country": "c", "n": 10}, {"country": "d", "n": 0}]
