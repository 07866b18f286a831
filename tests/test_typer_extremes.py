"""Exhaustive totality checks of the typer's renderings at the extremes of every type.

Each allow-listed numeric and temporal operation is typed by dpsql's typer, then its rendering
is run by DuckDB over tables holding the extreme values of the argument types (least and
greatest values, -1/0/1, infinities, Arrow timestamps beyond TIMESTAMP's range and below its
least value). Totality (design invariant 8): DuckDB must not raise on any row. The negative
controls run the same DuckDB expressions without the typer's rendering and must raise, so the
tables really hold the values that break an untyped evaluation.
"""

from __future__ import annotations

import itertools

import duckdb
import pyarrow as pa
import pytest
import sqlglot

from dpsql.plan.typer import (
    _DATE_PARTS,
    _INT_RANGES,
    _TRUNC_PARTS,
    Typer,
    TypeRefusal,
    _Refuse,
    type_key,
    type_predicate,
)

INT_TYPES = list(_INT_RANGES)


def _int_values(name: str) -> list[int]:
    lo, hi, _ = _INT_RANGES[name]
    return sorted({v for v in (lo, lo + 1, -1, 0, 1, 2, hi - 1, hi) if lo <= v <= hi})


def _render(expr: str, schema: dict[str, str]) -> str:
    node = sqlglot.parse_one(expr, read="duckdb")
    return Typer(schema).t(node).expr.sql(dialect="duckdb")


def _render_or_none(expr: str, schema: dict[str, str]) -> str | None:
    """The rendering, or None when the typer refuses (for free, at analysis) the expression."""
    try:
        return _render(expr, schema)
    except _Refuse:
        return None


def _pair_table(con: duckdb.DuckDBPyConnection, ta: str, tb: str) -> None:
    va = ", ".join(f"(CAST('{v}' AS {ta}))" for v in _int_values(ta))
    vb = ", ".join(f"(CAST('{v}' AS {tb}))" for v in _int_values(tb))
    con.execute(f"CREATE OR REPLACE TABLE t AS SELECT a, b FROM (VALUES {va}) x(a) CROSS JOIN (VALUES {vb}) y(b)")


@pytest.mark.parametrize("ta", INT_TYPES)
def test_integer_operators_are_total_on_every_pair_of_extremes(ta: str) -> None:
    con = duckdb.connect()
    for tb in INT_TYPES:
        _pair_table(con, ta, tb)
        schema = {"a": ta, "b": tb}
        rendered = 0
        for e in ("a + b", "a - b", "a * b", "a // b", "a % b", "b // a", "-a", "abs(a)", "sign(a)", "floor(a)",
                  "ceil(a)", "trunc(a)", "round(a)", "a // -1", "a % -1", "a // 0", "a % 0", "-(-a)", "abs(-a)",
                  "abs(a) // b", "(-a) // b", "(a + a) // b", "(a * a) // -1", "abs(abs(a))", "b // abs(a)",
                  *(f"round(a, {d})" for d in (-38, -20, -19, -10, -3, -2, -1, 0, 2, 38))):
            sql = _render_or_none(e, schema)  # None: refused for free (e.g. // of UHUGEINT by a signed type)
            if sql is not None:
                assert "TRY(" not in sql.upper(), sql  # total without TRY's slow path
                con.execute(f"SELECT {sql} FROM t").fetchall()
                rendered += 1
        assert rendered >= 20, (ta, tb, rendered)


def test_integer_controls_fail_without_the_typer() -> None:
    con = duckdb.connect()
    _pair_table(con, "TINYINT", "TINYINT")
    for raw in ("round(a, -1)", "a // b", "a % b"):
        with pytest.raises(duckdb.Error):
            con.execute(f"SELECT {raw} FROM t").fetchall()
    _pair_table(con, "BIGINT", "BIGINT")
    with pytest.raises(duckdb.Error):
        con.execute("SELECT a // -1 FROM t WHERE b <> 0").fetchall()
    _pair_table(con, "HUGEINT", "HUGEINT")
    with pytest.raises(duckdb.Error):
        con.execute("SELECT -a FROM t").fetchall()


DECIMALS = [(1, 0), (3, 0), (3, 2), (10, 3), (18, 0), (19, 0), (38, 0), (38, 2), (38, 37), (38, 38)]


@pytest.mark.parametrize("p,s", DECIMALS)
def test_decimal_rounding_is_total(p: int, s: int) -> None:
    typ = f"DECIMAL({p},{s})"
    top = "9" * p
    big = f"{top[: p - s] or '0'}.{top[p - s:]}" if s else top
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT v::{typ} AS a FROM (VALUES ('{big}'), ('-{big}'), ('0'), ('1'), ('-1')) x(v) "
                f"WHERE TRY_CAST(v AS {typ}) IS NOT NULL")
    schema = {"a": typ}
    for fn in ("-a", "abs(a)", "floor(a)", "ceil(a)", "trunc(a)", "round(a)", "sign(a)", "a + a", "a * a", "a % a",
               *(f"round(a, {d})" for d in (-38, -5, -2, -1, 0, 1, 2, 37, 38))):
        sql = _render(fn, schema)
        assert "TRY(" not in sql.upper(), sql
        con.execute(f"SELECT {sql} FROM t").fetchall()


def test_decimal_control_fails_without_the_typer() -> None:
    con = duckdb.connect()
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT round({'9' * 38}::DECIMAL(38,0), -1)").fetchall()


# -- temporal -------------------------------------------------------------------------------------------

I64 = 2**63
#: int64 values of Arrow timestamps: the int64 extremes (DuckDB's +-infinity are +-(2^63 - 1)),
#: values just inside them, far beyond TIMESTAMP's range for _S/_MS, and ordinary instants
RAW = [-I64, -I64 + 1, -I64 + 2, -9_223_372_036_854_775_000, -(10**15), -1, 0, 1_700_000_000, 10**15,
       9_223_372_036_854_775_000, I64 - 2, I64 - 1]
DAYS = [-(2**31), -(2**31) + 1, -(2**31) + 2, -2_147_000_000, -1, 0, 19_000, 2_147_000_000, 2**31 - 2, 2**31 - 1]


def _temporal_table() -> pa.Table:
    n = max(len(RAW), len(DAYS))
    raw = (RAW * 2)[:n]
    days = (DAYS * 2)[:n]
    return pa.table({
        "d": pa.array(days, pa.int32()).cast(pa.date32()),
        "ts": pa.array(raw, pa.int64()).cast(pa.timestamp("us")),
        "tss": pa.array(raw, pa.int64()).cast(pa.timestamp("s")),
        "tms": pa.array(raw, pa.int64()).cast(pa.timestamp("ms")),
        "tns": pa.array(raw, pa.int64()).cast(pa.timestamp("ns")),
    })


def _temporal_con() -> tuple[duckdb.DuckDBPyConnection, dict[str, str]]:
    con = duckdb.connect()
    arrow = _temporal_table()
    con.register("arrow_t", arrow)
    con.execute("CREATE TABLE t AS SELECT * FROM arrow_t")
    # the least and greatest TIMESTAMP and infinities, written by DuckDB itself
    con.execute("INSERT INTO t (d, ts) VALUES (DATE '5877642-06-25 (BC)', TIMESTAMP '290309-12-22 (BC) 00:00:00'), "
                "(DATE '5881580-07-10', TIMESTAMP '294247-01-10 04:00:54.775806'), "
                "(DATE 'infinity', TIMESTAMP 'infinity'), (DATE '-infinity', TIMESTAMP '-infinity')")
    schema = {r[0]: r[1] for r in con.execute("DESCRIBE t").fetchall()}
    assert schema == {"d": "DATE", "ts": "TIMESTAMP", "tss": "TIMESTAMP_S", "tms": "TIMESTAMP_MS", "tns": "TIMESTAMP_NS"}
    return con, schema


def _temporal_exprs(c: str) -> list[str]:
    out = [f"{f}({c})" for f in ("year", "month", "day", "hour", "minute", "second", "quarter", "dayofweek",
                                  "dayofyear", "week")]
    out += [f"date_part('{p}', {c})" for p in sorted(_DATE_PARTS)]
    out += [f"extract({p} FROM {c})" for p in ("year", "month", "epoch", "isoyear")]
    out += [f"date_trunc('{p}', {c})" for p in sorted(_TRUNC_PARTS)]
    out += [f"strftime({c}, '%Y-%m-%d %H:%M:%S.%f %G %V %j')", f"CAST({c} AS DATE)", f"CAST({c} AS TIMESTAMP)",
            f"CAST({c} AS VARCHAR)", f"date_trunc('year', date_trunc('day', {c}))"]
    return out


@pytest.mark.parametrize("col", ["d", "ts", "tss", "tms", "tns"])
def test_date_functions_are_total_at_the_extremes(col: str) -> None:
    con, schema = _temporal_con()
    for e in _temporal_exprs(col):
        con.execute(f"SELECT {_render(e, schema)} FROM t").fetchall()
        key, _ = type_key(sqlglot.parse_one(e, read="duckdb"), schema)
        con.execute(f"SELECT {key.sql(dialect='duckdb')} AS k, COUNT(*) FROM t GROUP BY k").fetchall()
    for other, lit in itertools.product(["d", "ts", "tss", "tms", "tns"],
                                        ["'1500-01-01'", "DATE '1500-01-01'", "'2300-06-01 00:00:00'", "'2024-01-01 00:00:00.5'"]):
        for cond in (f"{col} > {lit}", f"{col} = {other}", f"date_trunc('month', {col}) <> {other}",
                     f"{col} BETWEEN {lit} AND {other}", f"{col} IN ({lit}, {other})"):
            try:
                pred = type_predicate(sqlglot.parse_one(cond, read="duckdb"), schema)
            except TypeRefusal:  # e.g. a timestamp string compared with a DATE: refused for free
                continue
            con.execute(f"SELECT COUNT(*) FROM t WHERE {pred.sql(dialect='duckdb')}").fetchall()


@pytest.mark.parametrize("raw", [
    "date_trunc('year', ts)", "date_trunc('day', ts)", "year(tss)", "strftime(tms, '%Y')", "date_trunc('day', d)",
])
def test_temporal_controls_fail_without_the_typer(raw: str) -> None:
    con, _ = _temporal_con()
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT {raw} FROM t").fetchall()
