"""One declared date range read alike by one table, a grouped join, a lookup join and Spark; the no-row refusals near
its upper bound and over public lookups. Each test says what was wrong and what is right now.

* A DATE column whose range was declared with midnight timestamps (``(datetime(2020, 1, 1), datetime(2020, 1, 10))``
  or ``'2020-01-01 00:00:00'``) has the same days as one declared with dates: ``GROUP BY d`` on the table alone
  releases them. A grouped join refused ``GROUP BY o.d`` as "neither a column of a public table nor declared
  public" (the range was read as a timestamp range, whose days it took for no key set), and a lookup join released
  its keys above a noisy threshold only (charged, no row at zero noise). Now both release the grid's days, as the
  one table does. Likewise ``SUM(d - DATE '2020-01-01')`` was refused for want of bounds; now its days bound it. And on the one table, ``WHERE d > DATE '2020-01-09'`` over the grid [2020-01-01, 2020-01-10) was
  charged and released the key 2020-01-09, which no row can be in (declared with dates it was refused for free):
  each one-day bin from a midnight holds one DATE value whatever the bounds' spelling, and is read so.
* On Spark, ``year(o.ts)`` as a grouped join's key, of a TIMESTAMP column whose range was declared with dates
  (``('2020-01-01', '2020-01-13')``), was refused ("does not type-check ... on Spark"): the key was lowered as the
  year of a DATE (``unix_date(ts)``), its argument's kind taken from the range's spelling, not the column's type.
  DuckDB answered it. Now it is lowered as a TIMESTAMP's.
* A TIMESTAMP range whose tail after its last whole bin is shorter than the catalog's tolerance (1e-9 of a bin:
  [2019-12-01, 2020-01-01 00:00:00.000001) in one-day bins) has no bin for it on the one table: 31 days there, 32
  over a grouped join. Now a grouped join's days end with the grid's last bin too.
* A CSV source that cannot be opened (a symbolic link to no file) said "is valid Parquet" in its hint; now "CSV".
* A link named .parquet to a /proc file (0 bytes by its metadata, content when read) was refused as an empty file
  still being written (exit 66: retry), though a retry finds it alike. A file of the kernel's pseudo file systems
  (proc, sysfs, ...) is now no file being written: refused as no Parquet file (exit 2).

What held (zero noise, checked against the same queries on one table and DuckDB's plain SQL): the days of a range's
half-open grid agree on one table, a grouped join and a lookup join for date and string bounds, bins instead of
bin_width, a one-day range and TIMESTAMP bounds that are not midnights (a tail of a minute past midnight is a day) (``date_trunc('day', ts)``, ``CAST(ts AS
DATE)``, ``year(ts)``, ``date_trunc('month', ts)``); WHERE, HAVING, QUALIFY and OFFSET past the last day are refused
for free on all three, and one day less is answered; a LEFT JOIN's ON on the lookup alone, the same public table
joined twice through its key, ``r1.rname <> r2.rname`` over one row, refuse only where plain SQL has no row; OFFSETs
of UNION ALL, ROLLUP, CUBE and GROUPING SETS over lookup and grouped joins count the keys the conditions keep;
sources that are FIFOs or devices reached through a symbolic link or a glob are refused at registration and a file
replaced by a FIFO (or a link to one) at the query, for free; a hidden FIFO matched by no glob is never opened.
"""

from __future__ import annotations

import datetime as dt
import os
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from sqlglot import exp

import dpsql
from dpsql.errors import InputUnavailableError, PolicyError, QueryError, UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

D0 = dt.date(2020, 1, 1)
REGIONS = pa.table({"rg": ["n", "s", "e", "w"], "rname": ["North", "South", None, "West"]})


def _data(extra: bool = False) -> tuple[pa.Table, pa.Table]:
    uids = list(range(20)) + ([20] if extra else [])
    rows = [(u, D0 + dt.timedelta(days=(u * 3 + j) % 12), dt.datetime(2020, 1, 1, 6) + dt.timedelta(hours=(u * 17 + j * 5) % 300),
             ["n", "s", "e"][(u + j) % 3]) for u in uids for j in range(2)]
    p = pa.table({"pid": uids})
    o = pa.table({"pid": [r[0] for r in rows], "d": pa.array([r[1] for r in rows], pa.date32()),
                  "ts": pa.array([r[2] for r in rows], pa.timestamp("us")), "rg": [r[3] for r in rows]})
    return p, o


def _session(d: dict[str, Any] | None = None, ts: dict[str, Any] | None = None, extra: bool = False) -> dpsql.Session:
    p, o = _data(extra)
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
    use_noise(s, zero_noise(72))
    cols = {k: v for k, v in (("d", d), ("ts", ts)) if v is not None}
    s.register("regions", REGIONS, public=True)
    s.register("p", p, privacy_unit="pid")
    s.register("o", o, references={"pid": "p.pid", "rg": "regions.rg"}, degree_bounds={"pid": 2}, columns=cols)
    s.register("o1", o, privacy_unit="pid", max_rows_per_unit=2, references={"rg": "regions.rg"}, columns=cols)
    return s


MIDNIGHTS = {"bounds": (dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 10)), "bin_width": "1 day"}
DATES = {"bounds": ("2020-01-01", "2020-01-10"), "bin_width": "1 day"}


@pytest.fixture(scope="module")
def midnights() -> Any:
    s = _session(MIDNIGHTS)
    yield s
    s.close()


def ask(s: dpsql.Session, sql: str) -> list[dict[str, Any]]:
    before = s.history().num_rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()
    assert s.history().num_rows == before + 1, sql
    return rows


def refused_for_free(s: dpsql.Session, sql: str, kind: Any = (UnsupportedQueryError, QueryError)) -> str:
    before = s.history().num_rows
    with warnings.catch_warnings(), pytest.raises(kind) as e:
        warnings.simplefilter("ignore")
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == before, sql
    return str(e.value)


ONE = "SELECT d AS k, COUNT(*) AS n FROM o1 {w}GROUP BY 1 ORDER BY 1"
JOINED = "SELECT o.d AS k, COUNT(*) AS n FROM o JOIN p ON o.pid = p.pid {w}GROUP BY 1 ORDER BY 1"
LOOKUP = "SELECT o1.d AS k, COUNT(*) AS n FROM o1 JOIN regions r ON o1.rg = r.rg {w}GROUP BY 1 ORDER BY 1"
NINE_DAYS = [D0 + dt.timedelta(days=i) for i in range(9)]


# -- 1. a DATE column's range declared with midnight timestamps -------------------------------------------------------
@pytest.mark.parametrize("sql", [JOINED, LOOKUP])
def test_a_date_range_declared_with_midnights_gives_a_join_the_days_of_one_table(midnights: Any, sql: str) -> None:
    """Was: the grouped join refused (a PolicyError naming no declaration: "neither a column of a public table nor
    declared public"), the lookup join thresholded its keys (no row at zero noise). Now both release the nine days
    of the grid [2020-01-01, 2020-01-10), as the one table does."""
    assert [r["k"] for r in ask(midnights, ONE.format(w=""))] == NINE_DAYS
    assert [r["k"] for r in ask(midnights, sql.format(w=""))] == NINE_DAYS


def test_the_join_keys_of_a_range_declared_with_midnights_are_the_same_for_a_neighbour() -> None:
    """The released keys are public: the same with one more person (whose rows fall on the last day and past it)."""
    s = _session(MIDNIGHTS, extra=True)
    try:
        assert [r["k"] for r in ask(s, JOINED.format(w=""))] == NINE_DAYS
    finally:
        s.close()


def test_string_midnights_read_as_dates_too() -> None:
    s = _session({"bounds": ("2020-01-01 00:00:00", "2020-01-10 00:00:00"), "bin_width": "1 day"})
    try:
        assert [r["k"] for r in ask(s, JOINED.format(w=""))] == NINE_DAYS
    finally:
        s.close()


def test_negative_control_a_date_range_from_noon_is_no_key_set_of_days() -> None:
    """A DATE column's range from noon: the one table releases its bins labelled by their noon instants; no day is a
    bin, so the grouped join still refuses (before any charge)."""
    s = _session({"bounds": ("2020-01-01 12:00:00", "2020-01-10"), "bin_width": "1 day"})
    try:
        assert refused_for_free(s, JOINED.format(w=""), PolicyError)
    finally:
        s.close()


@pytest.mark.parametrize("where", ["WHERE d > DATE '2020-01-09' ", "WHERE d >= DATE '2020-01-10' "])
def test_a_where_past_the_last_day_of_a_range_declared_with_midnights_is_refused_for_free(midnights: Any,
                                                                                         where: str) -> None:
    """Was: on one table, `WHERE d > DATE '2020-01-09'` was charged and released the key 2020-01-09 (its bin
    [2020-01-09 00:00, 2020-01-10 00:00) was read as holding instants after the first, but a DATE has one value
    there), where declared with dates it is refused. Now refused for free on the table, and over both joins."""
    refused_for_free(midnights, ONE.format(w=where))
    refused_for_free(midnights, JOINED.format(w=where.replace("d ", "o.d ")))
    refused_for_free(midnights, LOOKUP.format(w=where.replace("d ", "o1.d ")))


def test_negative_control_the_last_day_is_answered(midnights: Any) -> None:
    for sql, a in ((ONE, ""), (JOINED, "o."), (LOOKUP, "o1.")):
        assert [r["k"] for r in ask(midnights, sql.format(w=f"WHERE {a}d >= DATE '2020-01-09' "))] == [NINE_DAYS[-1]]


def test_a_sum_of_days_over_a_range_declared_with_midnights_has_its_bounds() -> None:
    """Was: SUM(d - DATE '2020-01-01') refused ("needs bounds: a number of days has bounds from ... DATE columns with
    a declared range"), though d's range was declared, with midnight timestamps. Now bounded by its days as with
    dates: the same sum at zero noise, each value clamped to [0, 9] (rows on 2020-01-11 count 9, not 10)."""
    sql = "SELECT SUM(d - DATE '2020-01-01') AS n FROM o1"
    for extra, want in ((False, 195.0), (True, 196.0)):
        for d in (DATES, MIDNIGHTS):
            s = _session(d, extra=extra)
            try:
                assert ask(s, sql) == [{"n": want}]
            finally:
                s.close()


# -- 2. Spark: year(ts) of a TIMESTAMP column whose range was declared with dates ------------------------------------
def _year_key(s: dpsql.Session, sql: str) -> str:
    from dpsql.engine.spark_ops import lower_for_spark

    (key,) = s._route(sql, 1.0, 1e-6, None).request.plan.join.keys
    return str(lower_for_spark(exp.select(key.expr.copy())).sql(dialect="spark"))


def test_year_of_a_timestamp_declared_with_dates_is_lowered_for_spark_as_a_timestamps() -> None:
    """Was: UNIX_DATE(o__ts) in the key's guard, which Spark refuses for a TIMESTAMP (the query was refused on Spark
    alone). Now the TIMESTAMP's microseconds; a DATE column's year stays a DATE's (negative control)."""
    s = _session(DATES, ts={"bounds": ("2020-01-01", "2020-01-13"), "bin_width": "1 day"})
    try:
        ts = _year_key(s, "SELECT year(o.ts) AS k, COUNT(*) AS n FROM o JOIN p ON o.pid = p.pid GROUP BY 1")
        assert "UNIX_DATE" not in ts and "UNIX_MICROS" in ts
        d = _year_key(s, "SELECT year(o.d) AS k, COUNT(*) AS n FROM o JOIN p ON o.pid = p.pid GROUP BY 1")
        assert "UNIX_DATE(o__d)" in d
        assert ask(s, "SELECT year(o.ts) AS k, COUNT(*) AS n FROM o JOIN p ON o.pid = p.pid GROUP BY 1") == [
            {"k": 2020, "n": 40}]
    finally:
        s.close()


# -- 3. what held: one declaration, one key set, one set of free refusals --------------------------------------------
@pytest.fixture(scope="module")
def dates() -> Any:
    s = _session(DATES)
    yield s
    s.close()


NEAR_THE_END = [
    ("{a}d AS k, COUNT(*) AS n {F} GROUP BY 1 HAVING {a}d > DATE '2020-01-09'", None),
    ("{a}d AS k, COUNT(*) AS n {F} GROUP BY 1 ORDER BY 1 OFFSET 9", None),
    ("{a}d AS k, COUNT(*) AS n {F} GROUP BY 1 ORDER BY 1 OFFSET 8", 1),
    ("{a}d AS k, COUNT(*) AS n {F} GROUP BY 1 QUALIFY row_number() OVER (ORDER BY {a}d) > 9", None),
    ("{a}d AS k, COUNT(*) AS n {F} GROUP BY ROLLUP (1) OFFSET 10", None),
    ("{a}d AS k, COUNT(*) AS n {F} GROUP BY ROLLUP (1) OFFSET 9", 1),
]


@pytest.mark.parametrize("sql, rows", NEAR_THE_END)
@pytest.mark.parametrize("src", ["one", "joined", "lookup"])
def test_held_the_conditions_near_the_upper_bound_are_decided_alike(dates: Any, sql: str, rows: int | None,
                                                                   src: str) -> None:
    F, a = {"one": ("FROM o1", ""), "joined": ("FROM o JOIN p ON o.pid = p.pid", "o."),
            "lookup": ("FROM o1 JOIN regions r ON o1.rg = r.rg", "o1.")}[src]
    q = "SELECT " + sql.format(F=F, a=a)
    if rows is None:
        refused_for_free(dates, q)
    else:
        assert len(ask(dates, q)) == rows


@pytest.mark.parametrize("hi, days", [("2020-01-01 00:00:00.000001", 31), ("2020-01-01 00:01:00", 32)])
def test_a_tail_shorter_than_the_grids_tolerance_is_in_no_day_of_either(hi: str, days: int) -> None:
    """Was: ts declared on [2019-12-01, 2020-01-01 00:00:00.000001) in one-day bins: the one table's grid is 31 bins
    (a tail below 1e-9 of a bin has none), so date_trunc('day', ts) released 31 days there and 32 over a grouped
    join. Now 31 on both; a tail of a minute is a 32nd bin on both (negative control)."""
    s = _session(ts={"bounds": ("2019-12-01", hi), "bin_width": "1 day"})
    try:
        one = ask(s, "SELECT date_trunc('day', ts) AS k, COUNT(*) AS n FROM o1 GROUP BY 1 ORDER BY 1")
        joined = ask(s, "SELECT date_trunc('day', o.ts) AS k, COUNT(*) AS n FROM o JOIN p ON o.pid = p.pid GROUP BY 1 "
                        "ORDER BY 1")
        assert [r["k"] for r in one] == [r["k"] for r in joined] and len(one) == days
    finally:
        s.close()


def test_held_the_same_public_table_joined_twice_refuses_only_where_sql_has_no_row(dates: Any) -> None:
    two = "SELECT o1.rg, COUNT(*) AS n FROM o1 JOIN regions r1 ON o1.rg = r1.rg JOIN regions r2 ON o1.rg = r2.rg WHERE "
    assert "(r1, r2): joined on the same key values" in refused_for_free(dates, two + "r1.rname <> r2.rname GROUP BY 1")
    ask(dates, two + "r1.rname = 'North' OR r2.rname = 'South' GROUP BY 1")  # (charged: SQL has rows of n and s)


# -- 4. a CSV source's hint ------------------------------------------------------------------------------------------
def test_a_csv_source_that_cannot_be_opened_is_hinted_as_csv(tmp_path: Path) -> None:
    """Was: "check that the file exists, is readable and is valid Parquet" for a .csv link to no file."""
    pcsv.write_csv(pa.table({"uid": [1, 2]}), tmp_path / "a.csv")
    os.symlink(tmp_path / "nothing", tmp_path / "b.csv")
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6))
    try:
        with pytest.raises(InputUnavailableError) as e:
            s.register("t", str(tmp_path / "*.csv"), privacy_unit="uid")
        assert "valid CSV" in str(e.value) and "Parquet" not in str(e.value)
    finally:
        s.close()


# -- 5. a pseudo-file reported as 0 bytes --------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_a_link_to_a_proc_file_named_parquet_is_no_file_being_written(tmp_path: Path) -> None:
    """Was: an InputUnavailableError (exit 66: retry). Right: refused as no Parquet file (a ConfigError, exit 2), not
    as an input not written yet."""
    os.symlink("/proc/self/status", tmp_path / "y.parquet")
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6))
    try:
        with pytest.raises(dpsql.errors.ConfigError) as e:
            s.register("t", str(tmp_path / "y.parquet"), privacy_unit="uid")
        assert not isinstance(e.value, InputUnavailableError)
    finally:
        s.close()


def test_negative_control_an_empty_parquet_file_is_an_input_not_written_yet(tmp_path: Path) -> None:
    (tmp_path / "y.parquet").write_bytes(b"")
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6))
    try:
        with pytest.raises(InputUnavailableError, match="empty"):
            s.register("t", str(tmp_path / "y.parquet"), privacy_unit="uid")
    finally:
        s.close()
