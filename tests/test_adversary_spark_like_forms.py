"""Spark's RLIKE form of a LIKE / ILIKE pattern with two or more '%' means what DuckDB's LIKE means, also for
patterns the first comparison did not cover: backslashes and \\Q / \\E in a pattern (ILIKE quotes its lowered runs
by \\Q .. \\E), digits at the start of a run, line terminators, '_' next to '%', and runs of '%'.

Every pattern is compared on every text (the typed ``s [I]LIKE pattern ESCAPE '!'``, lowered for Spark as a private
query's WHERE is: all patterns in one query per engine), and patterns of each form through a private query's WHERE,
whose released count at zero noise is DuckDB's and the texts' that match. Skipped (with the reason) without
pyspark/Java."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
import sqlglot
from _spark import both_engines, columns_of, require_spark

import dpsql
from dpsql.plan.typer import Typer
from dpsql.testing import use_noise, zero_noise

require_spark()

N = 60
TEXTS = ["a\\b", "\\E", "\\Q", "x\\Ey", "a\\\\b", "12", "1x2", "a1b2", "\u2028", "a\rb", "a\x85b", "a\u2029b",
         "Ä", "äb", "ab", "a", "", "xyz", "AbC", "a\\", "\\", "ab\\E\\Qc", "1"]
PATTERNS = ["%a\\%b%", "%\\E%", "%\\Q%", "%\\%\\%", "%\\%", "%1%2%", "1%2%", "%_1%", "%\u2028%", "%\r%", "%\x85%",
            "_%_", "%a_%_b%", "%%%", "%Ä%", "%\\E%\\Q%", "\\%%", "%E%", "%\\E\\Q%", "%2%", "1%%"]
OPS = ("LIKE", "ILIKE")
#: patterns of each form also run through a private query: a backslash and several '%', \\E and \\Q, a line
#: terminator, a run of '%' at the end
THROUGH_QUERIES = ["%a\\%b%", "%\\E%\\Q%", "%\u2028%", "1%%"]


def texts() -> pa.Table:
    uid, s = [], []
    for i, t in enumerate(TEXTS):
        for j in range(N):
            uid.append(i * N + j)
            s.append(t)
    return pa.table({"uid": pa.array(uid, pa.int64()), "s": pa.array(s, pa.string())})


def make(kind: str) -> dpsql.Session:
    engine: dict[str, Any] = {"kind": kind, "statement_timeout": 60}
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), engine=engine)
    use_noise(s, zero_noise(5))
    s.register("t", texts(), privacy_unit="uid", max_rows_per_unit=1)
    return s


def condition(op: str, p: str) -> str:
    return f"s {op} '" + p.replace("'", "''") + "' ESCAPE '!'"


@pytest.fixture(scope="module")
def sessions() -> Iterator[tuple[dpsql.Session, dpsql.Session]]:
    spark, duck = make("spark"), make("duckdb")
    yield spark, duck
    spark.close()
    duck.close()


@pytest.fixture(scope="module")
def matches() -> dict[str, tuple[list[list[Any]], list[list[Any]]]]:
    """op -> (Spark's, DuckDB's) value of each pattern on each text (in the order of ``TEXTS``): every op and
    pattern in one query per engine."""
    engines = both_engines(pa.table({"i": pa.array(range(len(TEXTS)), pa.int64()), "s": pa.array(TEXTS, pa.string())}))
    duck, spark = next(engines)
    try:
        exprs = [Typer({"i": "BIGINT", "s": "VARCHAR"}).t(sqlglot.parse_one(f"SELECT {condition(op, p)}", read="duckdb").expressions[0]).expr
                 for op in OPS for p in PATTERNS]
        got, want = columns_of(spark, exprs), columns_of(duck, exprs)
    finally:
        next(engines, None)  # closes both
    n = len(PATTERNS)
    return {op: (got[k * n:(k + 1) * n], want[k * n:(k + 1) * n]) for k, op in enumerate(OPS)}


def counts(s: dpsql.Session, op: str) -> list[Any]:
    out = []
    for p in THROUGH_QUERIES:
        try:
            got: Any = s.query(f"SELECT COUNT(*) AS c FROM t WHERE {condition(op, p)}", epsilon=1.0).table.to_pylist()
        except dpsql.DPSQLError as e:
            got = type(e).__name__
        out.append((p, got))
    return out


@pytest.mark.parametrize("op", OPS)
def test_like_forms_with_backslashes_digits_and_line_ends_mean_the_same_on_spark(
        sessions: tuple[dpsql.Session, dpsql.Session], matches: dict[str, Any], op: str) -> None:
    got, want = matches[op]
    assert [(p, g) for p, g, w in zip(PATTERNS, got, want, strict=True) if g != w] == [], want
    assert any(v is True for col in want for v in col) and any(v is False for col in want for v in col)
    spark, duck = sessions
    released, expected = counts(spark, op), counts(duck, op)
    assert [g for g, w in zip(released, expected, strict=True) if g != w] == [], expected
    # the texts that match, N rows each (one per person): what the comparison above found
    assert expected == [(p, [{"c": N * want[PATTERNS.index(p)].count(True)}]) for p in THROUGH_QUERIES]
