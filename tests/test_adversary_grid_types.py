"""A numeric grid declared on a DATE or TIMESTAMP column is refused at registration, as a date grid on a numeric
column is: it was kept, and a histogram over it was charged and released zeros under number keys (0, 20, 40, ...),
since the bounding SQL's TRY_CAST of a date to DOUBLE is NULL and drops every row."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigError


@pytest.mark.parametrize("col", ["d", "ts"])
def test_a_numeric_grid_on_a_date_column_is_refused_at_registration(col: str) -> None:
    t = pa.table({"uid": list(range(10)), "d": [dt.date(2024, 1, 1 + i) for i in range(10)],
                  "ts": [dt.datetime(2024, 1, 1, i) for i in range(10)]})
    with dpsql.Session(budget=dpsql.Budget(1.0)) as s:
        with pytest.raises(ConfigError, match="numeric grid"):
            s.register("t", t, privacy_unit="uid", columns={col: {"bounds": (0, 100), "bins": 5}})
        # control: a date grid on it registers
        s.register("t", t, privacy_unit="uid", columns={col: {"bounds": ("2024-01-01", "2024-02-01"), "bins": 31}})
