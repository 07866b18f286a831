"""Regression tests: whether a query fails must not depend on one person's row (typer holes).

Each test runs the same SQL on D (with the target user 7) and on D minus user 7 and asserts
that the outcome (success, or the same exception class and message, before any charge) is the
same. Before the typer's fixes each of these failed after the charge on D only: a one-query,
noise-free bit about user 7 (repeatable for a binary search). The negative controls at the end
run the same expressions in DuckDB without dpsql's typer and check that they do fail on D, so
the data really holds the values that break an untyped evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from conftest import run_cli

import dpsql
from dpsql import errors
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

TARGET = 7


def _outcome(s: dpsql.Session, sql: str, delta: float = 0.0) -> tuple[Any, ...]:
    before = s.history().num_rows
    try:
        s.query(sql, epsilon=1.0, delta=delta)
    except errors.DPSQLError as e:
        return ("error", type(e).__name__, str(e), s.history().num_rows != before)
    return ("ok",)


def _duckdb_pair(columns: str, target_rows: list[str], benign: str, sql: str, delta: float = 0.0) -> list[tuple[Any, ...]]:
    """The outcome of ``sql`` on D (benign rows + the target's rows) and on D minus the target."""
    out = []
    for with_target in (True, False):
        con = duckdb.connect()
        con.execute(f"CREATE TABLE t ({columns})")
        if with_target:
            for r in target_rows:
                con.execute(f"INSERT INTO t VALUES {r}")
        con.execute(f"INSERT INTO t {benign}")
        s = dpsql.Session(budget=Budget(1e6, 0.9), connection=con)
        use_noise(s, zero_noise())
        s.register("t", "t", privacy_unit="uid", max_groups_per_unit=2)
        try:
            out.append(_outcome(s, sql, delta))
        finally:
            s.close()
            con.close()
    return out


def _assert_same(pair: list[tuple[Any, ...]], sql: str) -> None:
    with_t, without_t = pair
    assert with_t == without_t, f"outcome depends on user {TARGET}: {sql}\n  with: {with_t}\n  without: {without_t}"
    if with_t[0] == "error":
        assert not with_t[3], f"failed after the charge: {sql}"


BENIGN = (
    "SELECT 1000 + k AS uid, (k % 20)::TINYINT AS ti, (k % 50)::INTEGER AS i, "
    "TIMESTAMP '2024-01-01 08:00' + to_hours(k % 48) AS ts, TIMESTAMP_NS '2024-01-01 08:00' AS tn FROM range(0, 300) r(k)"
)
COLUMNS = "uid BIGINT, ti TINYINT, i INTEGER, ts TIMESTAMP, tn TIMESTAMP_NS"
TARGET_ROW = f"({TARGET}, 127, 2147483647, TIMESTAMP '290309-12-22 (BC) 00:00:00', TIMESTAMP_NS '2200-01-01')"


def test_round_of_an_integer_to_negative_digits_can_overflow() -> None:
    """round(int, -1) is allow-listed as total on integers, but DuckDB raises 'Overflow in ROUND
    of integer' for 127::TINYINT / 2^31-1 (rounds up beyond the type); no TRY is added.
    Cause: dpsql/plan/typer.py ``_round_like`` (can fail only for DECIMAL)."""
    for sql in (
        "SELECT COUNT(*) AS n FROM t WHERE round(ti, -1) > 0",
        f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND round(i, -1) > 0",
    ):
        _assert_same(_duckdb_pair(COLUMNS, [TARGET_ROW], BENIGN, sql), sql)


def test_date_trunc_on_the_earliest_timestamp_fails() -> None:
    """date_trunc('year' | 'quarter' | 'month' | 'isoyear', ts) on TIMESTAMP '290309-12-22 (BC)'
    (the least TIMESTAMP) raises 'Date and time not in timestamp range'; the typer lists
    date_trunc as total. Cause: dpsql/plan/typer.py ``_date_trunc`` (no TRY for TIMESTAMP input)."""
    for part in ("year", "quarter", "month", "isoyear"):
        sql = f"SELECT COUNT(*) AS n FROM t WHERE date_trunc('{part}', ts) > TIMESTAMP '2000-01-01'"
        _assert_same(_duckdb_pair(COLUMNS, [TARGET_ROW], BENIGN, sql), sql)
    key = "SELECT date_trunc('year', ts) AS k, COUNT(*) AS n FROM t GROUP BY k"
    _assert_same(_duckdb_pair(COLUMNS, [TARGET_ROW], BENIGN, key, 1e-6), key)


def test_timestamp_ns_literal_outside_its_range_fails_only_on_rows_that_reach_it() -> None:
    """A date string compared with a TIMESTAMP_NS column is rendered CAST('1500-01-01 00:00:00'
    AS TIMESTAMP_NS), a plain CAST of a constant outside the NS range (1677..2262): DuckDB does
    not fold a failing constant, so the error is raised only when a row reaches the comparison,
    i.e. iff user 7 exists. Cause: dpsql/plan/typer.py ``typed_literal`` / ``_literal_as``
    (the literal is parsed as a Python datetime but never checked against the target's range)."""
    for lit in ("'1500-01-01'", "DATE '1500-01-01'", "'2300-06-01 00:00:00'"):
        sql = f"SELECT COUNT(*) AS n FROM t WHERE uid = {TARGET} AND tn > {lit}"
        _assert_same(_duckdb_pair(COLUMNS, [TARGET_ROW], BENIGN, sql), sql)


def _arrow_pair(unit: str, sql: str) -> list[tuple[Any, ...]]:
    per = {"s": 1, "ms": 1000}[unit]
    out = []
    for with_target in (True, False):
        uids = list(range(1000, 1300))
        ts = [1_700_000_000 * per] * 300
        if with_target:
            uids.append(TARGET)
            ts.append(10**15 * per)  # ~ year 31.7 million: a valid TIMESTAMP_S / _MS, beyond TIMESTAMP
        tbl = pa.table({"uid": pa.array(uids, pa.int64()), "ts": pa.array(ts, pa.timestamp(unit))})
        s = dpsql.Session(budget=Budget(1e6, 0.9))
        use_noise(s, zero_noise())
        s.register("t", tbl, privacy_unit="uid")
        try:
            out.append(_outcome(s, sql))
        finally:
            s.close()
    return out


def test_timestamp_s_and_ms_beyond_the_timestamp_range_fail_in_date_functions() -> None:
    """An Arrow/Parquet timestamp[s] or [ms] column is TIMESTAMP_S / TIMESTAMP_MS in DuckDB and can
    hold instants beyond TIMESTAMP's range. year(), date_trunc(), date_part(), strftime() take
    the column as is, so DuckDB casts it to TIMESTAMP implicitly and fails on such a value.
    Cause: dpsql/plan/typer.py ``_temporal`` (returns r.expr for every timestamp kind; only
    comparisons get a TRY_CAST via ``unify``)."""
    for unit in ("s", "ms"):
        for sql in (
            "SELECT COUNT(*) AS n FROM t WHERE year(ts) > 2000",
            "SELECT COUNT(*) AS n FROM t WHERE date_trunc('day', ts) > TIMESTAMP '2000-01-01'",
            "SELECT COUNT(*) AS n FROM t WHERE strftime(ts, '%Y') = '2023'",
        ):
            _assert_same(_arrow_pair(unit, sql), f"[{unit}] {sql}")


def test_date_trunc_day_on_an_arrow_timestamp_just_before_the_least_timestamp() -> None:
    """An Arrow / Parquet timestamp[us] is any int64: values in [-2^63, least TIMESTAMP) are read
    by DuckDB as TIMESTAMP (they print as '290309-12-21 (BC) ...') and make even
    date_trunc('day', ts) raise 'Date out of range in timestamp conversion'. (DuckDB rewrites
    ``date_trunc(p, ts) > constant`` into ``ts >= constant'``, which hides it; a comparison with
    a column or a GROUP BY key does not.)
    Cause: dpsql/plan/typer.py ``_date_trunc`` (date_trunc of a TIMESTAMP is taken as total)."""
    for sql, delta in (("SELECT COUNT(*) AS n FROM t WHERE date_trunc('day', ts) <> ts", 0.0),
                       ("SELECT date_trunc('day', ts) AS k, COUNT(*) AS n FROM t GROUP BY k", 1e-6)):
        _assert_same(_arrow_us_pair(sql, delta), sql)


def _arrow_us_pair(sql: str, delta: float) -> list[tuple[Any, ...]]:
    out = []
    for with_target in (True, False):
        uids = list(range(1000, 1300))
        ts = [1_700_000_000 * 10**6] * 300
        if with_target:
            uids.append(TARGET)
            ts.append(-9_223_372_036_854_775_000)
        tbl = pa.table({"uid": pa.array(uids, pa.int64()), "ts": pa.array(ts, pa.timestamp("us"))})
        s = dpsql.Session(budget=Budget(1e6, 0.9))
        use_noise(s, zero_noise())
        s.register("t", tbl, privacy_unit="uid")
        try:
            out.append(_outcome(s, sql, delta))
        finally:
            s.close()
    return out


def test_range_workload_base_condition_has_the_same_hole() -> None:
    """query_many (DAWA) types its non-range WHERE conditions with the same typer (``guard`` in
    dpsql/rewrite/bound.py ``bounded_histogram``), so it inherits the holes: the workload is
    charged, then fails iff user 7 is in the data."""
    out = []
    sqls = [f"SELECT COUNT(*) FROM t WHERE age >= {lo} AND age < {lo + 10} AND round(ti, -1) > 0" for lo in range(0, 100, 10)]
    for with_target in (True, False):
        con = duckdb.connect()
        con.execute("CREATE TABLE t (uid BIGINT, age INTEGER, ti TINYINT)")
        if with_target:
            con.execute(f"INSERT INTO t VALUES ({TARGET}, 40, 127)")
        con.execute("INSERT INTO t SELECT 1000 + k, k % 100, (k % 20)::TINYINT FROM range(0, 300) r(k)")
        s = dpsql.Session(budget=Budget(1e6, 0.9), connection=con)
        use_noise(s, zero_noise())
        s.register("t", "t", privacy_unit="uid", max_rows_per_unit=1,
                   columns={"age": {"bounds": (0, 100), "bins": 100}})
        before = s.history().num_rows
        try:
            s.query_many(sqls, epsilon=1.0)
            out.append(("ok",))
        except errors.DPSQLError as e:
            out.append(("error", type(e).__name__, str(e), s.history().num_rows != before))
        finally:
            s.close()
            con.close()
    _assert_same(out, "query_many(... round(ti, -1) > 0)")


def test_cli_exit_code_depends_on_one_person(tmp_path: Path) -> None:
    """The same hole through the CLI: ``dpsql query`` over a Parquet file exits 0 without user 7
    and with the generic charged failure when user 7 (TINYINT 127) is in the file."""
    import pyarrow.parquet as pq

    results = []
    for with_target in (True, False):
        d = tmp_path / ("with" if with_target else "without")
        d.mkdir()
        uids = list(range(1000, 1300)) + ([TARGET] if with_target else [])
        ti = [k % 20 for k in range(300)] + ([127] if with_target else [])
        pq.write_table(pa.table({"uid": pa.array(uids, pa.int64()), "ti": pa.array(ti, pa.int8())}), d / "t.parquet")
        base = ["--ledger", str(d / "ledger.duckdb"), "--table", f"t={d / 't.parquet'}", "--privacy-unit", "t=uid"]
        assert run_cli([*base, "init", "--epsilon", "100"]) == 0
        results.append(run_cli([*base, "query", "--epsilon", "1", "SELECT COUNT(*) AS n FROM t WHERE round(ti, -1) > 0"]))
    assert results[0] == results[1], f"exit code with user 7: {results[0]}, without: {results[1]}"


# -- negative controls: without dpsql's typer, DuckDB fails on the target's row ---------------------------


def _raw_fails(columns: str, rows: list[str], sql: str) -> bool:
    con = duckdb.connect()
    try:
        con.execute(f"CREATE TABLE t ({columns})")
        for r in rows:
            con.execute(f"INSERT INTO t VALUES {r}")
        con.execute(f"INSERT INTO t {BENIGN}")
        try:
            con.execute(sql).fetchall()
        except duckdb.Error:
            return True
        return False
    finally:
        con.close()


def test_control_the_raw_expressions_fail_on_the_target_row() -> None:
    for sql in ("SELECT COUNT(*) FROM t WHERE round(ti, -1) > 0",
                "SELECT COUNT(*) FROM t WHERE round(i, -1) > 0",
                "SELECT COUNT(*) FROM t WHERE date_trunc('year', ts) <> ts",
                "SELECT COUNT(*) FROM t WHERE uid = 7 AND tn > CAST('1500-01-01' AS TIMESTAMP_NS)"):
        assert _raw_fails(COLUMNS, [TARGET_ROW], sql), sql
        assert not _raw_fails(COLUMNS, [], sql), sql  # and not without the target


def test_control_arrow_timestamps_beyond_the_timestamp_range_fail_raw() -> None:
    for unit, value in (("s", 10**15), ("ms", 10**18), ("us", -9_223_372_036_854_775_000)):
        con = duckdb.connect()
        tbl = pa.table({"ts": pa.array([value], pa.int64()).cast(pa.timestamp(unit))})
        con.register("t", tbl)
        sql = "SELECT year(ts) FROM t" if unit != "us" else "SELECT date_trunc('day', ts) FROM t"
        try:
            con.execute(sql).fetchall()
            failed = False
        except duckdb.Error:
            failed = True
        con.close()
        assert failed, (unit, sql)
