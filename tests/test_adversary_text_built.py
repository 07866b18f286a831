"""An expression builds at most ``MAX_TEXT_BUILT`` bytes of text per row.

String functions see at most 1024 characters of each text argument, but some build more than they
read: a concatenation builds the sum of its parts, and replace() with a replacement longer than the
text it replaces builds (characters / that text's length) replacements before its result is cut to 1024
characters. DuckDB builds each such value in full for every row of a vector, in memory its
``memory_limit`` does not count. So ``replace(note, 'a', <256 four-byte characters>)`` built 1 MB for each
row holding 1024 'a's and about 1 kB for any other: one person's 300 such rows under eight of them took
0.67-0.75 s of CPU and 2.6 GB of memory, against 0.05-0.07 s and 0.2 GB when those 300 rows held 'b's
(20 000 other rows; the first run 2-3 s), and 2048 such rows in one vector under sixteen of them would
have built 32 GB. What a row can build is a function of the query alone (literal lengths and the cap),
so it is bounded at analysis: an expression that may build more than one text cell holds by default
(65 536 bytes) is refused for free, naming the fix.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from test_adversary_substring_search import refused_for_free

import dpsql
from dpsql.plan.typer import CAST_TEXT_CAP, MAX_TEXT_BUILT, STRING_CAP, _rendered_text, type_predicate
from dpsql.testing import use_noise, zero_noise

TABLE = pa.table({
    "uid": pa.array(range(6), pa.int64()),
    "s": pa.array(["abc", "a" * 2000, "", "zzz", "😀" * 1500, "a,b"], pa.string()),
    "t": pa.array(["x", "y", "z", "a", "b", "c"], pa.string()),
})
SCHEMA = {"uid": "BIGINT", "s": "VARCHAR", "t": "VARCHAR"}
WIDE = "😀" * 256  # a replacement of 256 characters, 1024 bytes


@pytest.fixture(scope="module")
def duck() -> Any:
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(1000.0, 1e-3))
    use_noise(s, zero_noise(5))
    s.register("t", TABLE, privacy_unit="uid", columns={"t": {"domain": ["x", "y", "z"]}})
    yield s
    s.close()


REFUSED = [
    f"length(replace(s, 'a', '{WIDE}')) > 5",  # 1024 replacements of 1024 bytes: 1 MB per row
    f"replace(s, 'a', '{'y' * 65}') = ''",  # 1024 x 65 bytes
    "concat(" + ", ".join(["s"] * 17) + ") = ''",  # 17 x 1024 characters of up to 4 bytes
    " || ".join(["s"] * 10) + " = ''",  # each || builds both its (capped) sides
    "concat_ws('-', " + ", ".join(["s"] * 17) + ") = ''",
    " OR ".join([f"replace(s, 'a', '{'y' * 40}') = ''"] * 2),  # the bound is per expression
    f"NULLIF(replace(s, 'a', '{'y' * 40}'), '') = ''",  # NULLIF evaluates its first argument twice
]


@pytest.mark.parametrize("where", REFUSED)
def test_an_expression_that_may_build_more_text_is_refused_for_free(duck: dpsql.Session, where: str) -> None:
    msg = refused_for_free(duck, f"SELECT COUNT(*) AS v FROM t WHERE {where}")
    assert f"more than {MAX_TEXT_BUILT} bytes of text per row" in msg, msg
    assert "concatenate fewer texts, or replace a longer text or with a shorter replacement" in msg, msg


@pytest.mark.parametrize("sql", [
    f"SELECT replace(s, 'a', '{WIDE}') AS k, COUNT(*) AS v FROM t GROUP BY k",
    f"SELECT t, COUNT(*) AS v FROM t WHERE replace(s, 'a', '{WIDE}') <> '' GROUP BY t",
    f"SELECT COUNT(replace(s, 'a', '{WIDE}')) AS v FROM t",
])
def test_every_expression_over_rows_is_bounded(duck: dpsql.Session, sql: str) -> None:
    assert "bytes of text per row" in refused_for_free(duck, sql)


ACCEPTED = [
    f"replace(s, 'zzz', '{'y' * 100}') = ''",  # 341 replacements of 100 bytes
    f"replace(s, 'a', '{'y' * 64}') = ''",  # exactly the bound
    "replace(s, ',', '; ') = ''",
    f"replace(s, 'abc', '') = '' AND replace(s, 'a', '{'y' * 60}') <> 'q'",  # a shrinking replace builds nothing new
    "concat(" + ", ".join(["s"] * 16) + ") = ''",
    "s || '-' || t || '-' || s = ''",
    "concat_ws('-', s, t, s, t) = ''",
    "s IN ('a', 'b', 'c', 'd', 'e', 'f', 'g')",  # a digest's salted text is no built value
]


@pytest.mark.parametrize("where", ACCEPTED)
def test_expressions_within_the_bound_are_answered(duck: dpsql.Session, where: str) -> None:
    duck.query(f"SELECT COUNT(*) AS v FROM t WHERE {where}", epsilon=1.0)


def _built(node: Any) -> list[Any]:
    """The text-building nodes of a rendering (concatenations and growing replaces)."""
    out = []
    for n in node.walk():
        if isinstance(n, (sqlglot.exp.Concat, sqlglot.exp.ConcatWs, sqlglot.exp.DPipe)):
            out.append(n)
        elif isinstance(n, sqlglot.exp.Replace) and len(n.args["replacement"].this) > len(n.expression.this):
            out.append(n)
    return out


@pytest.mark.parametrize("where", [
    *ACCEPTED[:5], "s || t = ''", "concat_ws('-', s, t) = ''", f"replace(s, 'ab', '{'é' * 50}') = ''",
])
def test_the_bound_holds_on_the_texts_that_build_the_most(where: str) -> None:
    """The static bound is the worst case: every built value, on texts made to build the most (every character
    a match, or 4 bytes), is at most what the analysis counted for it."""
    rendered = type_predicate(sqlglot.parse_one(where, read="duckdb"), SCHEMA)
    bound = _rendered_text(rendered)
    assert bound <= MAX_TEXT_BUILT
    worst = ["😀" * STRING_CAP, "a" * STRING_CAP, "ab" * STRING_CAP, "z" * STRING_CAP, ",", "😀" * 3000]
    con = duckdb.connect()
    con.register("w", pa.table({"s": pa.array(worst), "t": pa.array(worst[::-1])}))
    for node in _built(rendered):
        largest = con.execute(f"SELECT MAX(strlen({node.sql(dialect='duckdb')})) FROM w").fetchone()[0]
        assert largest <= _rendered_text(node) <= bound, (node.sql(dialect="duckdb"), largest)


# -- a long IN list of texts digests at most one character more than its longest element --------------------
#
# ``x IN (c1, ..., cn)`` with more than 5 elements is compared by salted digest, MD5(salt || x), which reads all
# of x; comparisons stop at the first difference. One person's 20 rows of 60 000 characters under 400 such
# lists of one-character texts took 3.3-3.6 s of CPU against 2.1-2.4 s for 20 rows of 'y' (60 ms a row). A text
# longer than every element equals none of them, so the digest reads LEFT(x, longest + 1) (after: 2.43-2.46 s
# against 2.43-2.46 s); a list with an element read from a row is no hash table's (DuckDB and Spark compare
# it element by element), so it is compared as written.

IN_TABLE = pa.table({
    "uid": pa.array(range(8), pa.int64()),
    "s": pa.array(["abc", "abcd", "ab", "ééé", "éééé", "x" * 60000, "a,b", None], pa.string()),
    "t": pa.array(["abc", "q", "ab", "x", "éééé", "y", "z", "w"], pa.string()),
})


@pytest.fixture(scope="module")
def in_session() -> Any:
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(1e6, 1e-3))
    use_noise(s, zero_noise(5))
    s.register("t", IN_TABLE, privacy_unit="uid")
    yield s
    s.close()


def test_a_long_text_in_list_digests_at_most_one_character_more_than_its_longest_element(in_session: Any) -> None:
    where = "s IN ('abc', 'ééé', 'q', 'r', 's', 'tt')"
    bounded = in_session.explain(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1.0).bounded_sql
    assert "MD5('dpsql_read_salt' || LEFT(\"s\", 4))" in bounded, bounded
    # the answers are DuckDB's own (zero noise): a longer text that starts with an element matches none
    for w in [where, "s IN ('ab', 'a,b', 'q', 'r', 's', 't', NULL)", "NOT s IN ('éééé', 'abcd', 'q', 'r', 's', 't')",
              f"s IN ('{'x' * 256}', 'q', 'r', 's', 't', 'u')"]:
        got = in_session.query(f"SELECT COUNT(*) AS n FROM t WHERE {w}", epsilon=1.0).table.column("n")[0].as_py()
        expect = duckdb.connect().execute(f"SELECT COUNT(*) FROM IN_TABLE WHERE {w}").fetchone()[0]
        assert got == expect, (w, got, expect)


def test_a_text_in_list_with_an_element_read_from_a_row_is_compared_as_written(in_session: Any) -> None:
    where = "s IN ('q', 'r', 's', 'u', 'v', 'w', t)"
    bounded = in_session.explain(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1.0).bounded_sql
    assert "MD5" not in bounded, bounded
    got = in_session.query(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1.0).table.column("n")[0].as_py()
    assert got == 3  # abc, ab, éééé


# -- a text converted to a number, date, timestamp or boolean reads at most CAST_TEXT_CAP + 1 characters -----
#
# Parsing reads the whole text, leading zeros and blanks included: a text of 60 000 characters cost each
# conversion 60-150 us against 0.2 us for a short one (DuckDB 2.0.1, one thread), so one person's 20 rows of
# '000...01' under 250 conversions in one expression took 0.46-0.66 s of CPU against 0.18-0.35 s for 20 rows of
# '1'. A text of more than CAST_TEXT_CAP characters converts to NULL, tested on its first CAST_TEXT_CAP + 1
# (after, at the 200 conversions the guards leave room for: 0.20-0.55 s against 0.16-0.49 s).

CAST_TABLE = pa.table({
    "uid": pa.array(range(7), pa.int64()),
    "s": pa.array(["0" * (CAST_TEXT_CAP - 2) + "12", "0" * (CAST_TEXT_CAP - 1) + "12", "0" * 60000 + "1", " 7 ",
                   "2024-01-0" + "1", "true", None], pa.string()),
})


@pytest.mark.parametrize("to", ["INTEGER", "BIGINT", "HUGEINT", "DECIMAL(18,3)", "DOUBLE", "DATE", "TIMESTAMP", "BOOLEAN"])
def test_a_conversion_of_text_reads_a_bounded_prefix(to: str) -> None:
    rendered = type_predicate(sqlglot.parse_one(f"CAST(s AS {to}) IS NULL", read="duckdb"), SCHEMA).sql(dialect="duckdb")
    assert f'CASE WHEN LENGTH(LEFT("s", {CAST_TEXT_CAP + 1})) <= {CAST_TEXT_CAP} THEN TRY_CAST("s" AS' in rendered, rendered


def test_a_text_longer_than_the_cap_converts_to_null() -> None:
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(1e6, 1e-3))
    use_noise(s, zero_noise(5))
    s.register("t", CAST_TABLE, privacy_unit="uid")
    try:
        def count(where: str) -> int:
            return s.query(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1.0).table.column("n")[0].as_py()

        assert count("CAST(s AS INTEGER) = 12") == 1  # CAST_TEXT_CAP characters convert, one more does not
        assert count("CAST(s AS INTEGER) IS NOT NULL") == 2  # and neither does '000...01' (60 001 characters)
        assert count("CAST(s AS INTEGER) = 7") == 1
        assert count("CAST(s AS DATE) = DATE '2024-01-01'") == 1
        assert count("CAST(s AS BOOLEAN)") == 1
    finally:
        s.close()


def test_a_long_text_in_list_of_texts_longer_than_256_characters_is_refused_for_free(in_session: Any) -> None:
    # the digest reads each row's text up to the longest element: 400 lists of one 60 000-character element
    # would read a person's long text 400 times again
    long = "x" * 257
    msg = refused_for_free(in_session, f"SELECT COUNT(*) AS n FROM t WHERE s IN ('{long}', 'q', 'r', 's', 't', 'u')")
    assert "at most 256 characters" in msg and "compare a longer text with =" in msg, msg
    # controls: 256 characters in a long list, and any length in a short one (compared as written) or with =
    for where in [f"s IN ('{'x' * 256}', 'q', 'r', 's', 't', 'u')", f"s IN ('{long}', 'q')", f"s = '{'x' * 60000}'"]:
        in_session.query(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1.0)
