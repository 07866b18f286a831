"""The string work of one query's expressions together is bounded, not only each expression's.

Each expression over private rows may do at most ``MAX_STRING_WORK`` units of string work per row (about 0.45 ms of
CPU on crafted text), but a query may hold up to ``MAX_AGGREGATES`` (1000) aggregates, each argument an expression of
its own, and the bounded query evaluates every one of them on every row before any cap. So one query did up to 1000
times the bound per row: 100 aggregates of 12 ``reverse`` calls each (about 120 000 units each) made one person's 20
rows of 1024 four-byte characters cost 8.3-8.4 s of CPU against 6.7-7.1 s for 20 rows of ASCII letters or without
that person (about 70 ms a row, one thread, 2 000 other people). The expressions of one query (WHERE, GROUP BY keys,
each aggregate's argument; each distinct rendering once, a rendering found within another not again) now do at most
``MAX_QUERY_STRING_WORK`` (4 x ``MAX_STRING_WORK``) units together, more is refused for free, naming the fix.

A GROUP BY key (or a COUNT(DISTINCT ...) value) that builds text is read again after it is built, by every read
that groups by it (its length, its salted MD5 digest, the second read giving released groups their long keys'
texts), and that was not counted: ``GROUP BY concat(LEFT(s, 1024), LEFT(s, 1023), ...)`` of 15 copies (61 kB built
per row, 15 360 units counted) made one person's 2 000 rows of 1024 four-byte characters cost 2.19 s of CPU against
0.14 s under one copy (0.47 s for ASCII rows, 0.11 s for short ones), about 1 ms a row. Each byte a key's value
builds now counts ``KEY_TEXT_WORK`` units towards the key's ``MAX_STRING_WORK``; the largest key accepted (6 copies,
24 kB) costs 0.82 s against 0.23 s, within the per-expression bound.
"""

from __future__ import annotations

import string

import pyarrow as pa
import pytest
import sqlglot

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.plan.typer import KEY_TEXT_WORK, MAX_QUERY_STRING_WORK, MAX_STRING_WORK, _built_value, type_key
from dpsql.testing import use_noise, zero_noise

HOSTILE_UID = 10**6


def _table(hostile: bool) -> pa.Table:
    uid = list(range(40))
    s = [f"note {i % 7}" for i in range(40)]
    if hostile:
        uid += [HOSTILE_UID] * 3
        s += ["\U0001F600" * 1024] * 3
    return pa.table({"uid": pa.array(uid, pa.int64()), "s": pa.array(s, pa.string())})


def _session(hostile: bool = True) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise(3))
    s.register("t", _table(hostile), privacy_unit="uid")
    return s


def _term(m: int) -> str:
    # distinct renderings (DuckDB computes a repeated expression once): about 10 000 units each
    return f"reverse(LEFT(s, {1000 - m % 500}) || '{string.ascii_letters[m // 500]}') = 'x'"


def _heavy(i: int, k: int = 12) -> str:
    """A COUNT whose argument does about 120 000 units of string work per row, within MAX_STRING_WORK alone."""
    return "COUNT(CASE WHEN " + " OR ".join(_term(i * k + j) for j in range(k)) + f" THEN 1 END) AS a{i}"


def test_the_bounds() -> None:
    assert MAX_QUERY_STRING_WORK == 4 * MAX_STRING_WORK


def test_each_heavy_aggregate_alone_is_answered() -> None:
    # the negative control: one aggregate of about 120 000 units is within the per-expression bound, and answered
    s = _session()
    try:
        r = s.query(f"SELECT {_heavy(0)} FROM t", epsilon=1.0)
        assert list(r.to_pylist()[0].values()) == [0]
    finally:
        s.close()


def test_many_heavy_aggregates_are_refused_for_free() -> None:
    # was: each of 100 such aggregates passed on its own, and the query ran them all on every row (one person's
    # crafted rows cost about 70 ms each); now refused before any charge, whoever is in the data
    for hostile in (False, True):
        s = _session(hostile)
        try:
            before = s.remaining()
            with pytest.raises(UnsupportedQueryError, match="units of string work per row together") as e:
                s.query("SELECT " + ", ".join(_heavy(i) for i in range(5)) + " FROM t", epsilon=1.0)
            assert "split the aggregates over several queries" in str(e.value)
            assert s.remaining() == before
        finally:
            s.close()


def test_heavy_where_and_keys_count_with_the_aggregates() -> None:
    s = _session()
    try:
        where = " OR ".join(_term(900 + j) for j in range(12))
        with pytest.raises(UnsupportedQueryError, match="units of string work per row together"):
            s.query("SELECT " + ", ".join(_heavy(i) for i in range(4)) + f" FROM t WHERE {where}", epsilon=1.0)
        # four heavy aggregates alone fit (about 480 000 units)
        r = s.query("SELECT " + ", ".join(_heavy(i) for i in range(4)) + " FROM t", epsilon=1.0)
        assert list(r.to_pylist()[0].values()) == [0, 0, 0, 0]
    finally:
        s.close()


def test_a_repeated_expression_counts_once() -> None:
    # the same rendering in several places is computed once (and COUNT(x) types x and its NULL test): not refused
    s = _session()
    heavy = " OR ".join(_term(j) for j in range(12))
    try:
        q = ("SELECT " + ", ".join(f"COUNT(CASE WHEN {heavy} THEN 1 END) AS c{i}" for i in range(8))
             + f" FROM t WHERE NOT ({heavy})")
        r = s.query(q, epsilon=1.0)
        assert len(r.to_pylist()[0]) == 8
    finally:
        s.close()


def test_neighbours_have_the_same_outcome() -> None:
    q = "SELECT " + ", ".join(_heavy(i) for i in range(6)) + " FROM t"
    outcomes = []
    for hostile in (False, True):
        s = _session(hostile)
        try:
            try:
                s.query(q, epsilon=1.0)
                outcomes.append("answered")
            except UnsupportedQueryError as e:
                outcomes.append(str(e))
        finally:
            s.close()
    assert outcomes[0] == outcomes[1] != "answered"


def _copies(m: int) -> str:
    return "concat(" + ", ".join(f"LEFT(s, {1024 - j})" for j in range(m)) + ")"


def test_the_text_a_key_builds_counts_as_string_work() -> None:
    schema = {"uid": "BIGINT", "s": "VARCHAR"}
    rendered, _ = type_key(sqlglot.parse_one(_copies(2), read="duckdb"), schema)
    assert _built_value(rendered) == 4 * (1024 + 1023)
    assert _built_value(type_key(sqlglot.parse_one("LEFT(s, 1024)", read="duckdb"), schema)[0]) == 0
    assert _built_value(type_key(sqlglot.parse_one("s", read="duckdb"), schema)[0]) == 0
    assert KEY_TEXT_WORK * 4 * 1024 * 8 >= MAX_STRING_WORK  # 8 capped texts of four-byte characters, with their reads: over


@pytest.mark.parametrize("query", [
    f"SELECT {_copies(15)} AS k, COUNT(*) AS n FROM t GROUP BY {_copies(15)}",
    f"SELECT COUNT(DISTINCT {_copies(15)}) AS n FROM t",
])
def test_a_key_building_long_text_is_refused_for_free(query: str) -> None:
    # was: answered, one person's 2 000 crafted rows costing about 1 ms each in the reads grouping by the key
    for hostile in (False, True):
        s = _session(hostile)
        try:
            before = s.remaining()
            with pytest.raises(UnsupportedQueryError, match="the key may build too much text per row") as e:
                s.query(query, epsilon=1.0, delta=1e-6)
            assert "concatenate fewer or shorter texts" in str(e.value)
            assert s.remaining() == before
        finally:
            s.close()


def test_a_key_building_a_little_text_is_answered() -> None:
    # the negative control: two copies (8 kB at most) are within the bound, and so is text built inside a condition
    s = _session()
    try:
        r = s.query(f"SELECT {_copies(2)} AS k, COUNT(*) AS n FROM t GROUP BY {_copies(2)}", epsilon=1.0, delta=1e-6)
        assert r.to_pylist() is not None
        r = s.query("SELECT COUNT(DISTINCT LEFT(s, 3) || 'x') AS n FROM t", epsilon=1.0)
        assert len(r.to_pylist()) == 1
    finally:
        s.close()
