"""Range endpoints a hair away from a bin edge: the bins a workload query selects are those of the
values its WHERE admits (exactly, on an integer or date domain), or the query says it was widened.

An endpoint within 1e-9 bin widths of an edge was read as on the edge: ``age >= 20.0000000001`` over
an integer domain counted every row with age 20, which the WHERE excludes, and
``d >= TIMESTAMP '2026-01-05 00:00:00.00001'`` over a DATE domain counted 2026-01-05; on a continuous
domain such an endpoint was widened to the edge's bin without saying so (``snapped``)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import QueryError
from dpsql.plan import workload

N = 400
BASE = dt.date(2026, 1, 1)


def _table() -> pa.Table:
    return pa.table({
        "pid": pa.array(range(N), pa.int64()),
        "age": pa.array([i % 60 for i in range(N)], pa.int64()),
        "d": pa.array([BASE + dt.timedelta(days=i % 20) for i in range(N)], pa.date32()),
        "dec": pa.array([Decimal(i % 100) / 10 for i in range(N)], pa.decimal128(10, 2)),
        "ts": pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(hours=6 * (i % 80)) for i in range(N)], pa.timestamp("us")),
    })


@pytest.fixture(scope="module")
def catalog() -> dict:
    s = dpsql.Session(budget=dpsql.Budget(1.0, 0.0))
    s.register("t", _table(), privacy_unit="pid", max_rows_per_unit=1, columns={
        "age": {"bounds": (0, 99), "bins": 100}, "dec": {"bounds": (0, 10), "bins": 100},
        "d": {"bounds": ("2026-01-01", "2026-02-01"), "bin_width": "1 day"},
        "ts": {"bounds": ("2026-01-01", "2026-02-01"), "bin_width": "1 day"}})
    yield s.tables
    s.close()


def _bin_count(wl: workload.Workload) -> int:
    """Rows of the table in the workload's bins (the histogram DAWA is run on, without noise)."""
    (dim,), (i0, i1) = wl.dims, wl.ranges[0]
    dom = dim.domain
    if dom.kind == "numeric":
        b = f"floor((CAST({dim.column} AS DOUBLE) - {float(dom.lo)}) / {dom.width} + 1e-9)"
    else:
        b = f"floor((epoch(CAST({dim.column} AS TIMESTAMP)) - epoch(TIMESTAMP '{dom.lo}')) / {dom.bin_seconds})"
    return _duck(f"SELECT COUNT(*) FROM t WHERE {b} BETWEEN {i0} AND {i1}")


def _duck(sql: str) -> int:
    con = duckdb.connect()
    con.register("t", _table())
    return int(con.execute(sql).fetchall()[0][0])


EXACT = [
    "age >= 20.0000000001 AND age < 30",
    "age > 19.9999999999 AND age < 30",
    "age >= 20 AND age < 30.0000000001",
    "age >= 20 AND age <= 29.9999999999",
    "age = 20.0000000001",
    "age >= 20.00000000000000001 AND age < 30",
    # leading zeros count as digits in DuckDB: over 38 digits the literal is a DOUBLE (20.0), so age 20 fails '>'
    "age > 00000000000000000000019.99999999999999999999 AND age < 30",
    "age <= 00000000000000000000029.99999999999999999999 AND age >= 20",
    "age >= 19.999999999 AND age < 30",
    "age >= 20 AND age < 30",
    "d >= TIMESTAMP '2026-01-05 00:00:00.00001'",
    "d > TIMESTAMP '2026-01-04 23:59:59.99999'",
    "d < TIMESTAMP '2026-01-05 00:00:00.00001'",
    "d >= DATE '2026-01-05' AND d < DATE '2026-01-10'",
]


@pytest.mark.parametrize("where", EXACT)
def test_an_integer_or_date_domain_selects_exactly_the_values_the_where_admits(catalog: dict, where: str) -> None:
    sql = f"SELECT COUNT(*) FROM t WHERE {where}"
    if where == "age = 20.0000000001":  # no whole age: a workload of empty ranges only is refused, for free
        with pytest.raises(QueryError, match="no range of this workload admits a value"):
            workload.analyze_workload([sql], catalog)
        assert _duck(sql) == 0
        return
    wl = workload.analyze_workload([sql], catalog)
    assert wl.snapped == [False]
    assert _bin_count(wl) == _duck(sql), wl.ranges


WIDENED = [
    "dec >= 2.50000000001 AND dec < 5",
    "dec >= 2.49999999999 AND dec < 5",
    "dec >= 2.5 AND dec < 5.00000000001",
    "ts >= TIMESTAMP '2026-01-05 00:00:00.00001'",
    "ts < TIMESTAMP '2026-01-04 23:59:59.99999'",
]


@pytest.mark.parametrize("where", WIDENED)
def test_a_continuous_endpoint_off_an_edge_is_reported_widened(catalog: dict, where: str) -> None:
    sql = f"SELECT COUNT(*) FROM t WHERE {where}"
    wl = workload.analyze_workload([sql], catalog)
    assert wl.snapped == [True], wl.ranges
    assert _bin_count(wl) >= _duck(sql)


@pytest.mark.parametrize("where", ["dec >= 2.5 AND dec < 5", "dec >= 0.3 AND dec < 0.7",
                                   "ts >= TIMESTAMP '2026-01-05 00:00:00' AND ts < DATE '2026-01-09'"])
def test_control_endpoints_on_edges_are_exact(catalog: dict, where: str) -> None:
    sql = f"SELECT COUNT(*) FROM t WHERE {where}"
    wl = workload.analyze_workload([sql], catalog)
    assert wl.snapped == [False]
    assert _bin_count(wl) == _duck(sql)


# -- epsilon_split at its extremes: the refusal names the share that is too small ----------------------


@pytest.mark.parametrize("split, share", [(1 - 1e-16, "epsilon2"), (1e-300, "epsilon1")])
def test_an_extreme_epsilon_split_is_refused_for_free_naming_the_split(split: float, share: str) -> None:
    """epsilon=1 with epsilon_split=1-1e-16 was refused as 'epsilon is too small' with the hint 'use a larger
    epsilon': epsilon is not the problem, the split leaves 1e-16 of it to one stage."""
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("t", _table(), privacy_unit="pid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 99), "bins": 100}})
    with pytest.raises(dpsql.errors.ConfigError) as e:
        s.query_many(["SELECT COUNT(*) FROM t WHERE age < 50"], epsilon=1.0, options={"epsilon_split": split})
    assert share in str(e.value) and "epsilon_split" in str(e.value), str(e.value)
    assert s.history().num_rows == 0 and s.remaining().epsilon == 10.0
    s.close()


# -- reuse='never': accepted by the option check, so it must do what it says ---------------------------


def test_reuse_never_charges_a_fresh_synopsis_where_one_is_stored() -> None:
    """``options={'reuse': 'never'}`` was accepted and ignored: a workload or histogram with a stored synopsis
    was still answered from it (an analyst asking for a fresh estimate got the old one, and no charge)."""
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("t", _table(), privacy_unit="pid", max_rows_per_unit=1, version="v1",
               columns={"age": {"bounds": (0, 99), "bins": 100}})
    wl = ["SELECT COUNT(*) FROM t WHERE age < 50"]
    hist = "SELECT age, COUNT(*) FROM t GROUP BY age"
    assert not s.query_many(wl, epsilon=1.0).reused and not s.query(hist, epsilon=1.0).reused
    assert s.query_many(wl, epsilon=1.0).reused and s.query(hist, epsilon=1.0).reused  # control: the default reuses
    r1 = s.query_many(wl, epsilon=1.0, options={"reuse": "never"})
    r2 = s.query(hist, epsilon=1.0, options={"reuse": "never"})
    assert not r1.reused and not r2.reused
    assert s.remaining().epsilon == 6.0
    s.close()


# -- a continuous domain far from zero: the bins are the doubles' ------------------------------------


def test_an_edge_far_from_zero_is_widened_where_the_doubles_miss_it() -> None:
    """On [1e9, 1e9 + 10) in 0.1 bins the decimal value 1000000000.3 is on an edge, but its double is
    1000000000.29999995, which the bounding SQL bins at 2.9999995 (bin 2): ``big >= 1000000000.3`` must take
    in bin 2 and say it was widened (exact arithmetic alone would start at bin 3 and miss the row)."""
    vals = [Decimal("1000000000.3"), Decimal("1000000000.25"), Decimal("1000000001.0")]
    t = pa.table({"pid": pa.array(range(3), pa.int64()), "big": pa.array(vals, pa.decimal128(12, 2))})
    s = dpsql.Session(budget=dpsql.Budget(1.0, 0.0))
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1, columns={"big": {"bounds": (1e9, 1e9 + 10), "bins": 100}})
    con = duckdb.connect()
    con.register("t", t)
    for where in ("big >= 1000000000.3", "big < 1000000000.3", "big >= 1000000001"):
        sql = f"SELECT COUNT(*) FROM t WHERE {where}"
        wl = workload.analyze_workload([sql], s.tables)
        (i0, i1), = wl.ranges
        got = con.execute(f"SELECT COUNT(*) FROM t WHERE floor((CAST(big AS DOUBLE) - 1e9) / 0.1 + 1e-9) "
                          f"BETWEEN {i0} AND {i1}").fetchall()[0][0]
        want = con.execute(sql).fetchall()[0][0]
        assert got == want if not wl.snapped[0] else got >= want, (where, wl.ranges, wl.snapped, got, want)
    s.close()


@pytest.mark.parametrize("where", ["age > 00000000000000000000019.99999999999999999999",
                                   "age <= 00000000000000000000029.99999999999999999999"])
def test_a_query_reads_a_literal_with_leading_zeros_as_duckdb_and_the_workload_do(where: str) -> None:
    """Over 38 written digits (leading zeros included) DuckDB reads a number literal as a DOUBLE: a query's WHERE
    admits the rows DuckDB's does, as the range workload's bins do (it was read as an exact DECIMAL)."""
    from dpsql.testing import use_noise, zero_noise

    with dpsql.Session(budget=dpsql.Budget(10.0, 0.0)) as s:
        use_noise(s, zero_noise())
        s.register("t", _table(), privacy_unit="pid", max_rows_per_unit=1)
        sql = f"SELECT COUNT(*) AS n FROM t WHERE {where}"
        assert s.query(sql, epsilon=1.0).table.column("n")[0].as_py() == _duck(sql)
