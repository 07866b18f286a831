"""Bounds and grids are refused at registration on columns no histogram or range could use as
declared: a BOOLEAN grid (its keys would come out as 0.0 / 1.0, not false / true) and any bounds on a
TIMESTAMP WITH TIME ZONE (no comparison or GROUP BY may read it: every such query would be refused)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise


def table() -> pa.Table:
    return pa.table({
        "pid": np.arange(20, dtype=np.int64),
        "flag": [i % 3 == 0 for i in range(20)],
        "ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=i) for i in range(20)],
                       type=pa.timestamp("us", tz="UTC")),
    })


def session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(10.0))
    use_noise(s, zero_noise())
    return s


@pytest.mark.parametrize("spec", [{"bounds": (0, 1), "bins": 2}, {"bounds": (0, 1), "bin_width": 0.5}])
def test_a_boolean_grid_is_refused(spec):
    with pytest.raises(errors.ConfigError, match="BOOLEAN") as e:
        session().register("t", table(), privacy_unit="pid", max_rows_per_unit=1, columns={"flag": spec})
    assert "GROUP BY flag" in e.value.hint and "'domain': [False, True]" in e.value.hint


def test_a_boolean_releases_false_and_true():
    s = session()
    s.register("t", table(), privacy_unit="pid", max_groups_per_unit=1, max_rows_per_group=1,
               columns={"flag": {"domain": [False, True]}})
    r = s.query("SELECT flag, COUNT(*) AS n FROM t GROUP BY flag ORDER BY flag", epsilon=1.0)
    assert r.table.column("flag").to_pylist() == [False, True]
    # bounds alone still bound SUM(flag)
    s.register("u", table(), privacy_unit="pid", max_rows_per_unit=1, columns={"flag": {"bounds": (0, 1)}})
    assert s.query("SELECT SUM(flag) AS s FROM u", epsilon=1.0).table.column("s").to_pylist() == [7]


@pytest.mark.parametrize("spec", [{"bounds": ("2024-01-01", "2024-01-02"), "bin_width": "1 hour"},
                                  {"bounds": ("2024-01-01", "2024-01-02"), "bins": 24}, {"bounds": (0, 1)}])
def test_timestamp_with_time_zone_bounds_are_refused(spec):
    with pytest.raises(errors.ConfigError, match="TIMESTAMP WITH TIME ZONE") as e:
        session().register("t", table(), privacy_unit="pid", max_rows_per_unit=1, columns={"ts": spec})
    assert "as a TIMESTAMP" in e.value.hint and "TIMESTAMP\"" in e.value.hint


def test_the_named_fix_works():
    t = table()
    t = t.set_column(2, "ts", t.column("ts").cast(pa.timestamp("us")))
    s = session()
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1,
               columns={"ts": {"bounds": ("2024-01-01", "2024-01-02"), "bin_width": "1 hour"}})
    r = s.query_many(["SELECT COUNT(*) FROM t WHERE ts < TIMESTAMP '2024-01-01 05:00:00'"], epsilon=1.0)
    assert r.counts == [5]
