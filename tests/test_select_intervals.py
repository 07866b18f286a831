"""INTERVAL arithmetic in the SELECT list, HAVING and ORDER BY, and dates that post-processing makes.

A GROUP BY key written with an INTERVAL (``year(d + INTERVAL 1 YEAR)``) is typed and made total by the
typer over private rows (NULL unless the value and its shift lie in years 1..9999); the same key named
in the SELECT list is that key, so it must be accepted there too. Over released values (``MAX(d) +
INTERVAL 1 DAY``) the shift is post-processing, and it must be as total as the row-level one: a shift
that leaves years 1..9999 is NULL, as over rows. With zero noise and caps that do not bind, the
answers are plain DuckDB's."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise

N = 600


def people() -> pa.Table:
    """One row per person (no cap binds); dates spread over 2019-2021, a few NULL."""
    return pa.table({
        "uid": list(range(N)),
        "d": [None if i % 37 == 0 else dt.date(2019, 1, 1) + dt.timedelta(days=(i * 11) % 1000) for i in range(N)],
        "ts": [dt.datetime(2020, 1, 31, 12) + dt.timedelta(days=(i * 7) % 700) for i in range(N)],
    })


@pytest.fixture
def s() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("t", people(), privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1,
                  columns={"d": {"bounds": ["2019-01-01", "2022-01-01"], "bin_width": "1 day"}})
    yield sess
    sess.close()


def plain(sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.register("t", people())
    return sorted(con.sql(sql).fetchall(), key=lambda r: tuple((x is None, x) for x in r))


def released(s: Any, sql: str) -> list[tuple[Any, ...]]:
    r = s.query(sql, epsilon=5.0, delta=1e-5)
    return sorted((tuple(row.values()) for row in r.table.to_pylist()), key=lambda r: tuple((x is None, x) for x in r))


@pytest.mark.parametrize("sql", [
    "SELECT year(d + INTERVAL 1 YEAR) AS y, COUNT(*) AS n FROM t GROUP BY y",
    "SELECT year(d + INTERVAL 1 YEAR) AS y, COUNT(*) AS n FROM t GROUP BY year(d + INTERVAL 1 YEAR)",
    "SELECT year(d - INTERVAL '6 months') AS y, COUNT(*) AS n FROM t GROUP BY 1",
    "SELECT date_trunc('month', ts + INTERVAL 1 MONTH) AS m, COUNT(*) AS n FROM t GROUP BY m HAVING COUNT(*) > 10",
    "SELECT date_trunc('year', d) + INTERVAL 1 YEAR AS nxt, COUNT(*) AS n FROM t GROUP BY date_trunc('year', d)",
])
def test_a_key_written_with_an_interval_is_answered_as_plain_duckdb(s: Any, sql: str) -> None:
    assert released(s, sql) == plain(sql)


def test_a_shift_of_a_released_date_is_post_processing(s: Any) -> None:
    out = s.query("SELECT MAX(d) AS m, MAX(d) + INTERVAL 1 DAY AS nxt, MAX(d) - INTERVAL 1 MONTH AS prev FROM t",
                  epsilon=5.0).to_pylist()[0]
    m = dt.datetime.combine(out["m"], dt.time())
    assert out["nxt"] == m + dt.timedelta(days=1)
    assert [(out["prev"],)] == duckdb.sql(f"SELECT TIMESTAMP '{m}' - INTERVAL 1 MONTH").fetchall()


@pytest.mark.parametrize("sql", [
    "SELECT MAX(d) + INTERVAL 9000 YEAR AS v FROM t",
    "SELECT MIN(d) - INTERVAL 2100 YEAR AS v FROM t",
    "SELECT MEDIAN(d) + INTERVAL 9999999 DAY AS v FROM t",
    "SELECT MAX(d) + INTERVAL 1 DAY + INTERVAL 8000 YEAR AS v FROM t",
])
def test_a_shift_of_a_released_date_outside_years_1_to_9999_is_null(s: Any, sql: str) -> None:
    # as over private rows (Typer._shift_value): NULL, never a value the engines compute differently
    # (or fail on: INTERVAL 9999999 DAY leaves DuckDB's range)
    assert s.query(sql, epsilon=5.0).table.to_pylist() == [{"v": None}]


@pytest.mark.parametrize("sql,needle", [
    ("SELECT MAX(d) + INTERVAL '1 month 2 days' AS v FROM t", "whole number of one unit"),
    ("SELECT MAX(d) + INTERVAL 1 FORTNIGHT AS v FROM t", "whole number of one unit"),
    ("SELECT INTERVAL 1 DAY AS i, COUNT(*) AS n FROM t", "INTERVAL"),
])
def test_what_stays_refused_is_refused_for_free(s: Any, sql: str, needle: str) -> None:
    before, rows = s.remaining(), s.history().num_rows
    for run in (s.query, s.explain):
        with pytest.raises(errors.QueryError) as ei:
            run(sql, epsilon=1.0)
        assert needle in str(ei.value)
    assert s.remaining() == before and s.history().num_rows == rows


def test_an_interval_added_to_a_count_is_refused_for_free(s: Any) -> None:
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(errors.QueryError):
        s.query("SELECT COUNT(*) + INTERVAL 1 DAY AS v FROM t", epsilon=1.0)
    assert s.remaining() == before and s.history().num_rows == rows
