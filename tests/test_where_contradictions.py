"""WHERE conditions on one column that hold for no value of its type, over keys released above a threshold: refused
before the charge (``dpsql.plan.satisfiable``; the release would have no row whatever the data).

The decision must never refuse a condition some value meets (a wrong refusal would keep an analyst from a query the
data may answer): each random conjunction below is decided against a brute-force search over a dense grid of values of
the type, evaluated by DuckDB on the same typed rendering the query runs."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlglot

import dpsql
from dpsql import errors
from dpsql.plan import satisfiable
from dpsql.plan.typer import type_predicate
from dpsql.postprocess import _some_value_meets
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def session() -> Any:
    con = duckdb.connect()
    con.execute("CREATE TABLE ev (uid BIGINT, s VARCHAR, i INTEGER, x DECIMAL(5, 2), f DOUBLE, r FLOAT, d DATE, "
                "ts TIMESTAMP, b BOOLEAN, k VARCHAR)")
    con.execute("INSERT INTO ev SELECT r, ['x','y','z'][r % 3 + 1], r % 50, (r % 7) / 4, r / 3, r / 7, "
                "DATE '2024-01-01' + (r % 30)::INTEGER, TIMESTAMP '2024-01-01' + to_seconds(r), r % 2 = 0, "
                "['a','b'][r % 2 + 1] FROM range(0, 300) t(r)")
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9))
    use_noise(s, zero_noise())
    s.register("t", con.sql("SELECT * FROM ev").to_arrow_table(), privacy_unit="uid", columns={"k": {"domain": ["a", "b"]}, "i": {"bounds": (0, 100)}})
    yield s
    s.close()


def _charged(s: dpsql.Session) -> int:
    return int(s.history().num_rows)


@pytest.mark.parametrize("where", [
    "i > 5 AND i < 3", "i > 5 AND i < 6", "i <> i", "i = 1 AND i = 2", "i IN (1, 2) AND i NOT IN (1, 2)",
    "i IS NULL AND i > 0", "NOT (i = i) ", "i BETWEEN 5 AND 3",
    "x > 1.00 AND x < 1.01", "x >= 1.005 AND x <= 1.005", "f > 2 AND f < 1", "f <> f", "f > 1 AND f < 1.0000000000000002",
    "r > 1 AND r < 1.0000001",
    "s > 'z' AND s < 'a'", "s = 'a' AND s = 'b'", "s IS NULL AND s IS NOT NULL", "s < '' OR s IS NULL AND s IS NOT NULL",
    "d > DATE '2024-01-02' AND d < DATE '2024-01-03'", "d > '2024-02-01' AND d <= '2024-01-15'",
    "ts > TIMESTAMP '2024-01-01 00:00:00' AND ts < TIMESTAMP '2024-01-01 00:00:00.000001'",
    "b AND NOT b", "b = true AND b = false",
    "tt.i > 5 AND tt.i < 3",
])
def test_a_where_no_value_of_a_column_meets_is_refused_for_free(session: Any, where: str) -> None:
    before, left = _charged(session), session.remaining()
    with pytest.raises(errors.UnsupportedQueryError, match="holds for no value of column|lists no value"):
        session.query(f"SELECT s, COUNT(*) AS n FROM t AS tt WHERE {where} GROUP BY s", epsilon=1.0, delta=1e-6)
    with pytest.raises(errors.UnsupportedQueryError, match="holds for no value of column|lists no value"):
        session.explain(f"SELECT s, COUNT(*) AS n FROM t AS tt WHERE {where} GROUP BY s", epsilon=1.0, delta=1e-6)
    assert _charged(session) == before and session.remaining() == left


@pytest.mark.parametrize("where", [
    "i > 5 AND i < 7", "i >= 5 AND i <= 5", "i IS NULL", "i IN (1, 2) AND i NOT IN (1)", "i > 2147483646",
    "x > 1.00 AND x < 1.02", "f > 1 AND f < 1.0000000000000004", "r > 1 AND r < 1.0000003", "f <> f OR f IS NULL", "f > 1e308",
    "s > 'a' AND s < 'b'", "s > 'a' AND s < 'a' || 'b'", "s >= '' AND s < 'a'",
    "d > DATE '2024-01-02' AND d < DATE '2024-01-04'", "ts > TIMESTAMP '2024-01-01' AND ts < TIMESTAMP '2024-01-01 00:00:00.000002'",
    "b AND b IS NOT NULL", "b IS NULL",
])
def test_negative_control_a_where_some_value_meets_is_answered(session: Any, where: str) -> None:
    before = _charged(session)
    session.query(f"SELECT s, COUNT(*) AS n FROM t WHERE {where} GROUP BY s", epsilon=1.0, delta=1e-6)
    assert _charged(session) == before + 1


@pytest.mark.parametrize("sql", [
    "SELECT k, COUNT(*) AS n FROM t WHERE i > 5 AND i < 3 GROUP BY k",  # public keys: noisy zeros, answered
    "SELECT COUNT(*) AS n FROM t WHERE i > 5 AND i < 3",  # no GROUP BY: a noisy count, answered
    "SELECT s, COUNT(*) AS n FROM t WHERE i > 5 AND f < i GROUP BY s",  # two columns: not decided
    "SELECT s, COUNT(*) AS n FROM t WHERE abs(i) < 0 GROUP BY s",  # a function of the column: not decided
    "SELECT s, COUNT(*) AS n FROM t WHERE i > 2147483647 GROUP BY s",  # one comparison alone: not decided (cost)
])
def test_negative_control_other_shapes_are_charged_as_before(session: Any, sql: str) -> None:
    before = _charged(session)
    session.query(sql, epsilon=1.0, delta=1e-6)
    assert _charged(session) == before + 1


_GRIDS: dict[str, list[Any]] = {
    "INTEGER": [None, *range(-12, 13), -(2**31), 2**31 - 1],
    "DECIMAL(5,2)": [None, -4.0, 4.0, *sorted({round(c + d / 100, 2) for c in (0, 1, 1.01, -0.25, 2, 0.5) for d in range(-3, 4)})],
    "DOUBLE": [None, float("nan"), float("inf"), float("-inf"), *(v / 8 for v in range(-40, 41))],
    "VARCHAR": [None, "", "a", "a\x01", "aa", "ab", "b", "b\x00", "ba", "c", "z", "zz", "\x7f", "é"],
    "DATE": [None, *(dt.date(2024, 1, 1) + dt.timedelta(days=n) for n in range(-5, 12))],
    "BOOLEAN": [None, True, False],
}
_CONSTANTS: dict[str, list[str]] = {
    "INTEGER": ["-3", "0", "1", "2", "3", "5", "7", "2.5", "-0.5"],
    "DECIMAL(5,2)": ["0", "1", "1.01", "1.005", "-0.25", "2", "0.5"],
    "DOUBLE": ["0", "1", "1.5", "-2", "2.25", "1e300", "'nan'::DOUBLE", "'inf'::DOUBLE"],
    "VARCHAR": ["''", "'a'", "'aa'", "'b'", "'ba'", "'z'"],
    "DATE": ["DATE '2024-01-01'", "DATE '2024-01-03'", "DATE '2024-01-04'", "'2024-01-06'"],
    "BOOLEAN": ["true", "false"],
}
_OPS = ["=", "<>", "<", "<=", ">", ">="]


def _atom(rng: random.Random, typ: str) -> str:
    c = rng.choice(_CONSTANTS[typ])
    pick = rng.random()
    if pick < 0.55:
        return f"c {rng.choice(_OPS)} {c}"
    if pick < 0.65:
        return rng.choice(["c IS NULL", "c IS NOT NULL"])
    if pick < 0.8:
        return f"c {rng.choice(['IN', 'NOT IN'])} ({', '.join(rng.sample(_CONSTANTS[typ], 2))})"
    if pick < 0.9:
        lo, hi = rng.sample(_CONSTANTS[typ], 2)
        return f"c {rng.choice(['BETWEEN', 'NOT BETWEEN'])} {lo} AND {hi}"
    return f"NOT (c {rng.choice(_OPS)} {c})"


def _conjunction(rng: random.Random, typ: str) -> list[str]:
    parts = []
    for _ in range(rng.randint(1, 3)):
        a = _atom(rng, typ)
        if rng.random() < 0.25:
            a = f"({a} OR {_atom(rng, typ)})"
        parts.append(a)
    return parts


@pytest.mark.parametrize("typ", sorted(_GRIDS))
def test_the_decision_agrees_with_a_search_over_the_type(session: Any, typ: str) -> None:
    """75 random conjunctions per type (fixed seed): never refused where a value of the grid meets them (the grid
    holds values between and beyond the constants); refused where none does only when no value of the type can
    (checked: each refusal's conjunction is false at every grid value). Negative control: the count of refusals is
    not zero, so the search does test refusals."""
    rng = random.Random(20261207 + len(typ))
    con = duckdb.connect()
    grid = pa.table({"c": pa.array(_GRIDS[typ], type={
        "INTEGER": pa.int32(), "DECIMAL(5,2)": pa.float64(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(),
        "DATE": pa.date32(), "BOOLEAN": pa.bool_()}[typ])})
    con.register("g_raw", grid)
    con.execute(f"CREATE TABLE g AS SELECT CAST(c AS {typ}) AS c FROM g_raw")
    refused = 0
    for _ in range(75):
        parts = _conjunction(rng, typ)
        conj = [sqlglot.parse_one(p, read="duckdb") for p in parts]
        typed = type_predicate(sqlglot.exp.and_(*(c.copy() for c in conj)), {"c": typ}, "WHERE")
        found = con.execute(f"SELECT count(*) FROM g WHERE TRY(CAST({typed.sql(dialect='duckdb')} AS BOOLEAN))"
                            ).fetchone()
        assert found is not None
        meets = _some_value_meets(session._engine, "c", typ, conj)
        if found[0] > 0:
            assert meets, parts
        elif not meets:
            refused += 1
    assert refused > 0


def test_the_candidates_of_each_kind_hold_null_and_the_constants_neighbours() -> None:
    t = satisfiable.candidates
    from dpsql.plan.typer import parse_type
    assert {"4", "5", "6", None} <= set(t(parse_type("INTEGER"), [5]))
    assert {"1.00", "1.01", "1.02", None} <= set(t(parse_type("DECIMAL(5,2)"), [1.01]))
    assert {"a", "a\x00", "a\x01", "", None} <= set(t(parse_type("VARCHAR"), ["a"]))
    assert {"2024-01-01", "2024-01-02", "2024-01-03"} <= set(t(parse_type("DATE"), [dt.date(2024, 1, 2)]))
    assert {"inf", "-inf", "nan", "1.5"} <= set(t(parse_type("DOUBLE"), [1.0, 2.0]))


def test_conditions_with_more_constants_than_decided_are_charged_as_before(session: Any) -> None:
    """Deciding costs the typing and candidates of every constant (about 1.5 ms each): over
    ``postprocess.MEETS_MOST_CONSTANTS`` constants on one column (a long IN list beside another condition) the
    conditions are not decided and the query runs as before, at the limit they are."""
    from dpsql.postprocess import MEETS_MOST_CONSTANTS

    def where(n: int) -> str:  # n constants, no value meets them (listed values, all below 0 and the other above)
        return f"i IN ({', '.join(str(-v) for v in range(1, n))}) AND i > 0"

    before = _charged(session)
    with pytest.raises(errors.UnsupportedQueryError, match="holds for no value of column"):
        session.query(f"SELECT s, COUNT(*) AS n FROM t WHERE {where(MEETS_MOST_CONSTANTS)} GROUP BY s", epsilon=1.0,
                      delta=1e-6)
    assert _charged(session) == before
    r = session.query(f"SELECT s, COUNT(*) AS n FROM t WHERE {where(MEETS_MOST_CONSTANTS + 1)} GROUP BY s",
                      epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == 0 and _charged(session) == before + 1
