"""Spark's RLIKE form of a LIKE / ILIKE pattern with two or more '%' means what DuckDB's LIKE means, also for
patterns the first comparison did not cover: backslashes and \\Q / \\E in a pattern (ILIKE quotes its lowered runs
by \\Q .. \\E), digits at the start of a run, line terminators, '_' next to '%', and runs of '%'. Skipped (with
the reason) without pyspark/Java."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from _spark import require_spark

import dpsql
from dpsql.testing import use_noise, zero_noise

require_spark()

N = 60
TEXTS = ["a\\b", "\\E", "\\Q", "x\\Ey", "a\\\\b", "12", "1x2", "a1b2", "\u2028", "a\rb", "a\x85b", "a\u2029b",
         "Ä", "äb", "ab", "a", "", "xyz", "AbC", "a\\", "\\", "ab\\E\\Qc", "1"]
PATTERNS = ["%a\\%b%", "%\\E%", "%\\Q%", "%\\%\\%", "%\\%", "%1%2%", "1%2%", "%_1%", "%\u2028%", "%\r%", "%\x85%",
            "_%_", "%a_%_b%", "%%%", "%Ä%", "%\\E%\\Q%", "\\%%", "%E%", "%\\E\\Q%", "%2%", "1%%"]


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


def counts(s: dpsql.Session, op: str) -> list[Any]:
    out = []
    for p in PATTERNS:
        lit = "'" + p.replace("'", "''") + "'"
        try:
            got: Any = s.query(f"SELECT COUNT(*) AS c FROM t WHERE s {op} {lit} ESCAPE '!'", epsilon=1.0).table.to_pylist()
        except dpsql.DPSQLError as e:
            got = type(e).__name__
        out.append((p, got))
    return out


@pytest.mark.parametrize("op", ["LIKE", "ILIKE"])
def test_like_forms_with_backslashes_digits_and_line_ends_mean_the_same_on_spark(op: str) -> None:
    spark, duck = make("spark"), make("duckdb")
    try:
        got, want = counts(spark, op), counts(duck, op)
        assert [g for g, w in zip(got, want, strict=True) if g != w] == [], want
    finally:
        spark.close()
        duck.close()
