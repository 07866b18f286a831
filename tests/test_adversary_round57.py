"""One-table SQL: date formats.

* ``strftime(d, '%Q')`` (or a format ending in a lone ``%``) was refused by DuckDB's binder as 'the query does not
  type-check against the table's columns ... check the types': a format specifier DuckDB does not know is now refused
  at analysis, naming it.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("fmt", ["%Q", "%", "%Y-%", "%-a", "%E"])
@pytest.mark.parametrize("fn", ["strftime(d, '{}')", "strptime(s, '{}') IS NOT NULL AND TRUE"])
def test_an_unknown_date_format_specifier_is_named_at_analysis(fn: str, fmt: str) -> None:
    t = pa.table({"uid": [1, 2], "d": pa.array([0, 1], pa.date32()), "s": ["2024", "x"]})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", t, privacy_unit="uid")
    expr = fn.format(fmt)
    sql = f"SELECT COUNT(*) FROM t WHERE {expr if 'strptime' in fn else expr + ' = ' + repr('x')}"
    with pytest.raises(UnsupportedQueryError, match="format specifier"):
        s.explain(sql, epsilon=1.0)


@pytest.mark.parametrize("fmt", ["%Y-%m-%d", "%-d/%-m/%y %H:%M:%S.%f", "%%Y %j %U %W %V %G %u %w %a %A %b %B %p %I %c %x %X %T"])
def test_known_date_format_specifiers_are_accepted(fmt: str) -> None:
    t = pa.table({"uid": [1, 2], "d": pa.array([0, 1], pa.date32())})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid")
    s.query(f"SELECT COUNT(*) AS n FROM t WHERE strftime(d, '{fmt}') <> ''", epsilon=1.0)


@pytest.mark.parametrize("sql", [
    "SELECT g, MEDIAN(d) AS m, strftime(m, '%Q') AS f FROM t GROUP BY g",
    "SELECT g, MEDIAN(d) AS m FROM t GROUP BY g HAVING strftime(m, '%Y%') = 'x'",
])
def test_an_unknown_format_specifier_over_released_values_is_named(sql: str) -> None:
    t = pa.table({"uid": [1, 2], "g": ["a", "b"], "d": pa.array([0, 1], pa.date32())})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", t, privacy_unit="uid", columns={"g": {"domain": ["a", "b"]},
                                                    "d": {"bounds": ["1970-01-01", "1971-01-01"], "bin_width": "1 day"}})
    with pytest.raises(UnsupportedQueryError, match="format specifier"):
        s.explain(sql, epsilon=1.0)
    assert s.history().num_rows == 0
