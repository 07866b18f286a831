"""An expression does at most ``MAX_STRING_WORK`` units of string work per row.

String functions see at most 1024 characters of each text argument, but what a character costs depends on the
text: ``reverse`` (which walks grapheme clusters) of 1024 four-byte characters took 21 us against 1.3 us for 1024
ASCII letters (DuckDB 2.0.1, one thread), so 150 such calls in one expression (bounded only by the rendered size)
made one person's 200 rows cost 1.17-1.56 s of CPU against 0.34-0.57 s for ASCII rows, about 4 ms a row. A
comparison of two texts read from the same row (``s = t``, NULLIF, GREATEST) reads up to the shorter's length,
which a row chooses (up to ``max_text_bytes``). Each call now counts its worst case at analysis, from the query
alone (characters it may read times its class's factor: reverse 6, upper/lower/trim/ILIKE 4, any other 1; a
comparison of two texts one unit per 16 bytes), and an expression counting more than 131 072 units (about 0.45 ms
per row of crafted text) is refused for free, naming the fix (fewer calls, or LEFT(x, n) first).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import sqlglot

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.plan.typer import (
    MAX_STRING_WORK,
    RAW_TEXT_BYTES,
    STRING_CAP,
    TypeRefusal,
    _rendered_string_work,
    type_predicate,
)
from dpsql.testing import use_noise, zero_noise

TABLE = pa.table({
    "uid": pa.array(range(6), pa.int64()),
    "s": pa.array(["abc", "a" * 2000, "", " Zz ", "😀" * 1500, "a,b"], pa.string()),
    "t": pa.array(["x", "y", "z", "a", "b", "c"], pa.string()),
    "n": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
})
SCHEMA = {"uid": "BIGINT", "s": "VARCHAR", "t": "VARCHAR", "n": "BIGINT"}


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise(5))
    s.register("t", TABLE, privacy_unit="uid")
    return s


@pytest.fixture(scope="module")
def duck() -> Any:
    s = _session()
    yield s
    s.close()


def work(where: str) -> int:
    return _rendered_string_work(type_predicate(sqlglot.parse_one(where, read="duckdb"), SCHEMA))


def ors(cond: str, k: int) -> str:
    """``cond`` k times, OR-ed in groups of 8 (within the nesting limit)."""
    groups = [" OR ".join([cond] * min(8, k - i)) for i in range(0, k, 8)]
    return " OR ".join(f"({g})" for g in groups)


REFUSED = [
    ors("reverse(s) = 'x'", 20),  # 20 x (1024 read by the cap + 6 x 1024)
    ors("upper(s) = 'X'", 26),
    ors("s = t", 33),  # two texts read from the row: up to max_text_bytes each
    ors("greatest(s, t) = 'x'", 17),
    ors("NULLIF(s, t) IS NULL", 33),
    " OR ".join(f"contains(lower(trim(s)), '{c}')" for c in "abcdefghijklmn"),
]


@pytest.mark.parametrize("where", REFUSED)
def test_an_expression_with_more_string_work_is_refused_for_free(where: str) -> None:
    s = _session()
    try:
        with pytest.raises(UnsupportedQueryError) as info:
            s.query(f"SELECT COUNT(*) AS v FROM t WHERE {where}", epsilon=1.0)
        msg = str(info.value)
        assert f"more than {MAX_STRING_WORK} units of string work per row" in msg, msg
        assert "use fewer string functions, or cap the text first with LEFT(x, n)" in msg, msg
        assert len(s.history()) == 0
    finally:
        s.close()


@pytest.mark.parametrize("sql", [
    f"SELECT reverse(s) AS k, COUNT(*) AS v FROM t WHERE {ors('reverse(s) = t', 18)} GROUP BY k",
    f"SELECT COUNT(*) AS v FROM t GROUP BY n HAVING COUNT(*) > 0 AND n IN (SELECT n FROM t WHERE {ors('s = t', 33)})",
    f"SELECT SUM(length(s)) AS v FROM t WHERE {ors('upper(s) = t', 26)}",
])
def test_every_expression_over_rows_is_bounded(duck: dpsql.Session, sql: str) -> None:
    before = duck.remaining()
    with pytest.raises(UnsupportedQueryError):
        duck.query(sql, epsilon=1.0, delta=1e-6)
    assert duck.remaining() == before


def test_left_with_a_small_literal_caps_the_work(duck: dpsql.Session) -> None:
    # the refused expression's 20 reverse() calls, each on the text's first 16 characters
    where = ors("reverse(left(s, 16)) = 'x'", 20)
    assert work(where) <= MAX_STRING_WORK
    duck.query(f"SELECT COUNT(*) AS v FROM t WHERE {where}", epsilon=1.0)
    rendered = type_predicate(sqlglot.parse_one("left(s, 16) = 'x'", read="duckdb"), SCHEMA).sql(dialect="duckdb")
    assert 'LEFT("s", 16)' in rendered and "1024" not in rendered, rendered


def test_a_typical_analyst_query_is_answered(duck: dpsql.Session) -> None:
    sql = ("SELECT lower(trim(s)) AS k, COUNT(*) AS v FROM t "
           "WHERE (lower(s) LIKE '%a%' OR upper(s) LIKE '%Z%' OR starts_with(s, 'a') OR ends_with(s, 'b')) "
           "AND length(trim(s)) BETWEEN 1 AND 2000 AND substring(s, 1, 3) <> 'zzz' AND right(s, 2) <> 'qq' "
           "AND split_part(s, ',', 1) <> '' AND replace(s, ',', ';') <> t AND s <> t AND concat(s, '-', t) <> '' "
           "AND NULLIF(s, 'q') IS NOT NULL AND greatest(s, 'a') >= 'a' AND CAST(n AS VARCHAR) <> t GROUP BY k")
    assert work(sql.split(" WHERE ")[1].split(" GROUP BY ")[0]) <= MAX_STRING_WORK // 2
    duck.query(sql, epsilon=1.0, delta=1e-6)


# -- the count ----------------------------------------------------------------------------------------------------

def test_each_call_counts_its_worst_case() -> None:
    cap = STRING_CAP  # LEFT(x, 1024), the cap every string function's argument is rendered with, reads 1024
    assert work("length(s) > 3") == cap + cap
    assert work("reverse(s) = 'x'") == cap + 6 * cap
    assert work("upper(s) = 'X'") == work("lower(s) = 'x'") == work("trim(s) = 'x'") == cap + 4 * cap
    assert work("s ILIKE '%a%'") == cap + 4 * cap and work("s LIKE '%a%'") == cap + cap
    # a comparison of two texts read from the row: one unit per 16 bytes of the shorter, a literal its own
    assert work("s = t") == RAW_TEXT_BYTES // 16
    assert work(f"s = '{'x' * 160}'") == 10 and work("s = 'abc'") == 0
    assert work("reverse(s) = t") == cap + 6 * cap + 4 * cap // 16
    assert work("greatest(s, t) = 'x'") == 2 * RAW_TEXT_BYTES // 16
    assert work("s BETWEEN t AND 'zz'") == RAW_TEXT_BYTES // 16
    # NULLIF evaluates its first argument twice; a sum over the expression
    assert work("NULLIF(reverse(s), 'x') IS NULL") == 2 * (cap + 6 * cap)
    assert work("reverse(s) = 'x' OR length(s) > 1") == cap + 6 * cap + 2 * cap
    # LEFT(x, n) with a literal n reads n characters, and so does each function of it
    assert work("left(s, 16) = 'x'") == 16
    assert work("reverse(left(s, 16)) = 'x'") == 16 + 16 + 6 * 16
    # a number or date as text is short; constants (a long IN list's digests of its elements) cost no row anything
    assert work("CAST(n AS VARCHAR) = t") == 4 * 64 // 16
    assert work("s IN ('a', 'b', 'c', 'd', 'e', 'f', 'g')") == 2 + 2 * (len("dpsql_read_salt") + 2)
    assert work("n > 3") == 0
    # a conversion of text: its guard reads 257 characters twice (LEFT, length), the parse at most 256
    assert work("CAST(s AS INTEGER) = 1") == 257 + 257 + 256


@pytest.mark.parametrize("cond, most", [("reverse(s) = 'x'", 18), ("upper(s) = 'X'", 25), ("length(s) > 1", 64),
                                        ("s = t", 32)])
def test_the_bound_is_what_the_documented_calls_allow(cond: str, most: int) -> None:
    assert work(ors(cond, most)) <= MAX_STRING_WORK
    with pytest.raises(TypeRefusal, match="units of string work per row"):
        work(ors(cond, most + 1))
