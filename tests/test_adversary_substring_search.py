"""Substring searches have a literal, short needle and a bounded count per expression.

The time a query takes is observable; it must not depend much on one person's text. A search for
a needle in a text (contains, strpos / instr / position / locate, the text replace() looks for,
the separator of split_part()) costs up to (text length x needle length) per row. With a needle
that is another column (or any expression) that cost is chosen by the rows themselves: a person
whose two columns hold long near-matches of each other slows the query, and a long literal needle
or many searches in one expression multiply what one crafted text costs. So:

* every search takes a string literal of at most ``MAX_LIKE_PATTERN`` (32) characters as its
  needle (the bound LIKE patterns already had); a needle that is a column or an expression, or a
  longer literal, is refused for free (before any charge), with a message naming the function and
  the fix;
* an expression holds at most ``MAX_SEARCHES`` (16) searches, LIKE / ILIKE tests included (which
  keep their own limit of ``MAX_LIKES`` = 8), counted as written and again in the rendering a row
  evaluates (date_trunc's guard and NULLIF repeat their operand, and each copy searches again).

starts_with / ends_with (and prefix / suffix) compare at one position, like ``=``, so they keep
taking any text (both capped). The Spark engine types expressions with the same typer; its
lowering refuses a search whose needle is not such a literal as well (defence in depth) and counts
the searches again in Spark's form of each expression, where some conversions repeat their operand.
The residual (a crafted text against a short literal needle) is measured by
``benchmarks/substring_search.py`` and stated in docs/threat_model.md.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import sqlglot
from sqlglot import exp

import dpsql
from dpsql.engine.spark_ops import lower_for_spark
from dpsql.errors import UnsupportedQueryError
from dpsql.plan.typer import MAX_LIKE_PATTERN, MAX_LIKES, MAX_SEARCHES, TypeRefusal, type_predicate
from dpsql.testing import use_noise, zero_noise

TEXTS = ["abc", "xabcx", "a,b,c", "zzz", "", "abcabc", "a" * 40, "b" * 40]
TABLE = pa.table({
    "uid": pa.array(list(range(len(TEXTS))), pa.int64()),
    "s": pa.array(TEXTS, pa.string()),
    "t": pa.array(["b", "ab", ",", "q", "", "c", "a" * 33, "b"], pa.string()),
})
SCHEMA = {"uid": "BIGINT", "s": "VARCHAR", "t": "VARCHAR"}
LONG = "a" * (MAX_LIKE_PATTERN + 1)
EDGE = "a" * MAX_LIKE_PATTERN


def session(kind: str = "duckdb") -> dpsql.Session:
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(1000.0, 1e-3), engine={"kind": kind})
    use_noise(s, zero_noise(5))
    s.register("t", TABLE, privacy_unit="uid")
    return s


@pytest.fixture(scope="module")
def duck() -> Any:
    s = session()
    yield s
    s.close()


def count(s: dpsql.Session, where: str) -> Any:
    return s.query(f"SELECT COUNT(*) AS v FROM t WHERE {where}", epsilon=5.0).table.column("v")[0].as_py()


def refused_for_free(s: dpsql.Session, sql: str) -> str:
    before = s.remaining()
    with pytest.raises(UnsupportedQueryError) as info:
        s.query(sql, epsilon=1.0)
    with pytest.raises(UnsupportedQueryError):
        s.explain(sql, epsilon=1.0)
    assert s.remaining() == before
    return str(info.value)


# -- needles: string literals of at most 32 characters ----------------------------------------------------

NON_LITERAL = [
    ("contains(s, t)", "contains()"),
    ("strpos(s, t) > 0", "strpos()"),
    ("instr(s, t) > 0", "strpos()"),
    ("position(t IN s) > 0", "strpos()"),
    ("locate(t, s) > 0", "strpos()"),
    ("contains(s, lower(t))", "contains()"),
    ("contains(s, 'a' || 'b')", "contains()"),
    ("contains(s, CAST(uid AS VARCHAR))", "contains()"),
    ("replace(s, t, 'x') = 'x'", "replace()"),
    ("split_part(s, t, 1) = 'x'", "split_part()"),
]


@pytest.mark.parametrize(("where", "name"), NON_LITERAL)
def test_a_needle_that_is_not_a_literal_is_refused_for_free(duck: dpsql.Session, where: str, name: str) -> None:
    msg = refused_for_free(duck, f"SELECT COUNT(*) AS v FROM t WHERE {where}")
    assert name in msg, msg
    assert "string literal" in msg and str(MAX_LIKE_PATTERN) in msg, msg


LONG_NEEDLES = [
    f"contains(s, '{LONG}')", f"strpos(s, '{LONG}') > 0", f"instr(s, '{LONG}') > 0", f"position('{LONG}' IN s) > 0",
    f"replace(s, '{LONG}', '') = ''", f"split_part(s, '{LONG}', 1) = ''",
]


@pytest.mark.parametrize("where", LONG_NEEDLES)
def test_a_needle_longer_than_32_characters_is_refused_for_free(duck: dpsql.Session, where: str) -> None:
    msg = refused_for_free(duck, f"SELECT COUNT(*) AS v FROM t WHERE {where}")
    assert f"at most {MAX_LIKE_PATTERN} characters" in msg, msg


def test_needles_of_32_characters_and_the_non_search_arguments_are_accepted(duck: dpsql.Session) -> None:
    # controls: the bound is inclusive, and the answers are DuckDB's (zero noise, hand-counted)
    assert count(duck, f"contains(s, '{EDGE}')") == 1
    assert count(duck, f"strpos(s, '{EDGE}') = 1") == 1
    assert count(duck, f"replace(s, '{EDGE}', '') = 'aaaaaaaa'") == 1
    assert count(duck, f"split_part(s, '{EDGE}', 2) = 'aaaaaaaa'") == 1
    assert count(duck, "contains(s, 'abc')") == 3
    assert count(duck, "position('abc' IN s) = 2") == 1
    # the replacement is not searched for: it keeps the longer bound of literal arguments
    assert count(duck, f"replace(s, 'zzz', '{'y' * 100}') = '{'y' * 100}'") == 1
    # starts_with / ends_with compare at one position (as =): any text, capped
    assert count(duck, "starts_with(s, t)") == 3
    assert count(duck, "ends_with(s, t) AND suffix(s, t)") == 4


# -- at most 16 searches per expression, LIKE included -----------------------------------------------------


def ors(*parts: str) -> str:
    return " OR ".join(parts)


def test_at_most_16_searches_per_expression(duck: dpsql.Session) -> None:
    assert MAX_SEARCHES == 16 and MAX_LIKES == 8
    sixteen = ["contains(s, 'a')"] * 4 + ["strpos(s, 'b') > 0"] * 4 + ["replace(s, 'c', '') = ''"] * 4 \
        + ["split_part(s, ',', 1) = 'a'"] * 4
    assert count(duck, ors(*sixteen)) == 7  # control: 16 are accepted (all but "zzz")
    msg = refused_for_free(duck, "SELECT COUNT(*) AS v FROM t WHERE " + ors(*sixteen, "contains(s, 'z')"))
    assert f"at most {MAX_SEARCHES} substring searches" in msg, msg


def test_like_tests_count_as_searches(duck: dpsql.Session) -> None:
    likes = ["s LIKE '%a%'"] * MAX_LIKES
    assert count(duck, ors(*likes, *["contains(s, 'a')"] * (MAX_SEARCHES - MAX_LIKES))) == 5
    msg = refused_for_free(duck, "SELECT COUNT(*) AS v FROM t WHERE "
                           + ors(*likes, *["contains(s, 'a')"] * (MAX_SEARCHES - MAX_LIKES + 1)))
    assert f"at most {MAX_SEARCHES} substring searches" in msg, msg


def test_nested_searches_in_a_group_key_count_too(duck: dpsql.Session) -> None:
    def nest(n: int) -> str:
        e = "s"
        for _ in range(n):
            e = f"replace({e}, 'a', 'b')"
        return e

    duck.query(f"SELECT {nest(MAX_SEARCHES)} AS k, COUNT(*) AS v FROM t GROUP BY k", epsilon=1.0, delta=1e-5)
    msg = refused_for_free(duck, f"SELECT {nest(MAX_SEARCHES + 1)} AS k, COUNT(*) AS v FROM t GROUP BY k")
    assert f"at most {MAX_SEARCHES} substring searches" in msg, msg


def test_the_count_is_per_expression() -> None:
    # the WHERE and the group key are separate expressions: 16 each are accepted
    many = ors(*["contains(s, 'a')"] * MAX_SEARCHES)
    type_predicate(sqlglot.parse_one(many, read="duckdb"), SCHEMA)
    type_predicate(sqlglot.parse_one(many, read="duckdb"), SCHEMA)
    with pytest.raises(TypeRefusal):
        type_predicate(sqlglot.parse_one(many + " OR contains(s, 'a')", read="duckdb"), SCHEMA)


def test_searches_repeated_by_a_guard_count_each_time(duck: dpsql.Session) -> None:
    # date_trunc's range guard reads its operand three times: five such keys are 15 searches a row evaluates,
    # six are 18 (refused, although the query writes only six)
    one = "date_trunc('month', strptime(split_part(s, ',', 1), '%Y')) IS NULL"
    assert count(duck, " AND ".join([one] * 5)) == len(TEXTS)
    msg = refused_for_free(duck, "SELECT COUNT(*) AS v FROM t WHERE " + " AND ".join([one] * 6))
    assert "once made total" in msg and "date_trunc" in msg, msg
    # NULLIF reads its first operand twice
    nullif = "nullif(strpos(s, 'a'), 0) IS NULL"
    type_predicate(sqlglot.parse_one(" OR ".join([nullif] * 8), read="duckdb"), SCHEMA)
    with pytest.raises(TypeRefusal, match="once made total"):
        type_predicate(sqlglot.parse_one(" OR ".join([nullif] * 8 + ["contains(s, 'a')"]), read="duckdb"), SCHEMA)


# -- Spark ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("needle", [exp.column("t"), exp.Lower(this=exp.column("t")), exp.Literal.string(LONG)])
@pytest.mark.parametrize("build", [
    lambda n: exp.Contains(this=exp.column("s"), expression=n),
    lambda n: exp.StrPosition(this=exp.column("s"), substr=n),
    lambda n: exp.Replace(this=exp.column("s"), expression=n, replacement=exp.Literal.string("x")),
    lambda n: exp.SplitPart(this=exp.column("s"), delimiter=n, part_index=exp.Literal.number(1)),
])
def test_spark_lowering_refuses_a_search_without_a_short_literal_needle(build: Any, needle: exp.Expression) -> None:
    q = exp.select(exp.alias_(build(needle), "y")).from_("v")
    with pytest.raises(UnsupportedQueryError, match="Spark"):
        lower_for_spark(q)
    # control: the same search with a literal needle of 32 characters is lowered
    ok = exp.select(exp.alias_(build(exp.Literal.string(EDGE)), "y")).from_("v")
    assert EDGE in lower_for_spark(ok).sql(dialect="spark")


def spark_where(where: str) -> exp.Expression:
    return lower_for_spark(exp.select("uid").from_("v").where(type_predicate(sqlglot.parse_one(where, read="duckdb"),
                                                                              SCHEMA)))


def test_spark_counts_the_searches_of_its_own_form() -> None:
    # Spark's form of date_trunc reads its operand six times (the typer's three), and its DuckDB spelling of a
    # DATE as text 23 times: the count is checked again in Spark's form (free: while binding). A conversion of
    # text reads its operand twice (its length is tested first: CAST_TEXT_CAP)
    trunc = "date_trunc('month', CAST(split_part(s, ',', 1) AS TIMESTAMP)) IS NULL"
    spark_where(trunc)  # 6 searches in the typer's form, 12 in Spark's
    type_predicate(sqlglot.parse_one(" AND ".join([trunc] * 2), read="duckdb"), SCHEMA)  # 12: DuckDB runs it
    for where in (" AND ".join([trunc] * 2), "CAST(CAST(split_part(s, ',', 1) AS DATE) AS VARCHAR) = '2024-01-01'"):
        with pytest.raises(UnsupportedQueryError, match=f"more than {MAX_SEARCHES} substring searches"):
            spark_where(where)
    # control: 16 plain searches stay 16 in Spark's form, and the count is per expression (two projections)
    sixteen = " OR ".join(["contains(s, 'a')"] * MAX_SEARCHES)
    spark_where(sixteen)
    typed = type_predicate(sqlglot.parse_one(sixteen, read="duckdb"), SCHEMA)
    lower_for_spark(exp.select(exp.alias_(typed, "p"), exp.alias_(typed.copy(), "q")).from_("v"))


def test_spark_refuses_and_limits_the_same_way() -> None:
    from _spark import require_spark

    require_spark()
    spark, duck = session("spark"), session("duckdb")
    try:
        for where, _ in NON_LITERAL[:2] + NON_LITERAL[-2:]:
            assert refused_for_free(spark, f"SELECT COUNT(*) AS v FROM t WHERE {where}") == \
                refused_for_free(duck, f"SELECT COUNT(*) AS v FROM t WHERE {where}")
        too_many = ors(*["contains(s, 'a')"] * (MAX_SEARCHES + 1))
        assert f"at most {MAX_SEARCHES}" in refused_for_free(spark, f"SELECT COUNT(*) AS v FROM t WHERE {too_many}")
        # control: 16 literal searches of 32 characters give DuckDB's answer on Spark
        sixteen = ors(*[f"contains(s, '{EDGE}')"] * 8, *["strpos(s, 'b') > 0"] * 4, *["replace(s, 'c', '') = ''"] * 2,
                      *["split_part(s, ',', 2) = 'b'"] * 2)
        assert count(spark, sixteen) == count(duck, sixteen) == 7
    finally:
        spark.close()
        duck.close()
