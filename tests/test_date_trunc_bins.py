"""``GROUP BY date_trunc('<unit>', ts)`` of a TIMESTAMP column whose declared bins split the unit evenly, from a unit
boundary: the histogram of the units answered from the bins (DAWA, every unit released, labelled by its start, which
is date_trunc's value for every row of it), as ``GROUP BY ts`` and ``floor(x / W) * W`` are. It was the sparse
histogram (units released only above a noisy threshold)."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

START = dt.datetime(2024, 1, 1)
TS = [START + dt.timedelta(minutes=17 * i) for i in range(300)]  # 2024-01-01 00:00 to 2024-01-04 12:43


def _session(bounds: tuple[str, str] = ("2024-01-01", "2024-01-05"), width: str = "1 hour",
             column: str = "ts") -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    days = [t.date() for t in TS]
    s.register("t", pa.table({"u": list(range(len(TS))), "ts": TS, "d": days}), privacy_unit="u",
               columns={column: {"bounds": bounds, "bin_width": width}}, max_rows_per_unit=1)
    use_noise(s, zero_noise())
    return s


def test_hours_of_hour_bins_are_the_bins_histogram() -> None:
    s = _session()
    trunc = s.query("SELECT date_trunc('hour', ts) AS h, COUNT(*) AS n FROM t GROUP BY h ORDER BY h", epsilon=1.0)
    plain = s.query("SELECT ts AS h, COUNT(*) AS n FROM t GROUP BY ts ORDER BY ts", epsilon=1.0)
    assert trunc.mechanism == plain.mechanism == "dawa"
    hours = [START + dt.timedelta(hours=i) for i in range(96)]  # every bin, data or not
    assert trunc.table.column("h").to_pylist() == plain.table.column("h").to_pylist() == hours
    assert trunc.table.schema.field("h").type == pa.timestamp("us")  # date_trunc's type, as DuckDB gives it


@pytest.mark.parametrize(("width", "unit", "keys"), [("1 hour", "day", 4), ("15 minutes", "hour", 96),
                                                     ("1 minute", "minute", None), ("6 hours", "day", 4)])
def test_a_unit_of_several_bins_is_the_coarser_histogram(width: str, unit: str, keys: int | None) -> None:
    s = _session(width=width) if keys is not None else _session(bounds=("2024-01-01", "2024-01-02"), width=width)
    r = s.query(f"SELECT date_trunc('{unit}', ts) AS h, COUNT(*) AS n FROM t GROUP BY h ORDER BY h", epsilon=1.0)
    assert r.mechanism == "dawa"
    step = {"day": dt.timedelta(days=1), "hour": dt.timedelta(hours=1), "minute": dt.timedelta(minutes=1)}[unit]
    n = keys if keys is not None else 1440
    assert r.table.column("h").to_pylist() == [START + i * step for i in range(n)]
    end = START + n * step
    # zero noise: DAWA's measured buckets are exact, so the units' counts add up to the rows in the declared range
    assert sum(r.table.column("n").to_pylist()) == sum(1 for t in TS if t < end)


def test_weeks_from_a_monday() -> None:
    """2024-01-01 is a Monday: weeks of one-day bins from it."""
    s = _session(bounds=("2024-01-01", "2024-01-29"), width="1 day")
    r = s.query("SELECT date_trunc('week', ts) AS w, COUNT(*) AS n FROM t GROUP BY w ORDER BY w", epsilon=1.0)
    assert r.mechanism == "dawa"
    assert r.table.column("w").to_pylist() == [START + dt.timedelta(weeks=i) for i in range(4)]
    assert sum(r.table.column("n").to_pylist()) == len(TS)


def test_the_where_narrows_the_units() -> None:
    s = _session()
    r = s.query("SELECT date_trunc('day', ts) AS h, COUNT(*) AS n FROM t WHERE ts >= TIMESTAMP '2024-01-02 00:00:00' "
                "GROUP BY h ORDER BY h", epsilon=1.0)
    assert r.table.column("h").to_pylist() == [START + dt.timedelta(days=i) for i in (1, 2, 3)]


@pytest.mark.parametrize(("kwargs", "unit"), [
    ({"bounds": ("2024-01-01 00:30:00", "2024-01-05 00:30:00")}, "hour"),  # bins not from an hour's start
    ({"width": "2 hours"}, "hour"),  # a bin wider than the unit
    ({"width": "7 minutes"}, "hour"),  # bins that do not split the unit evenly
    ({"bounds": ("2024-01-02", "2024-01-30")}, "week"),  # weeks start on Mondays: 2024-01-02 is a Tuesday
    ({}, "month"),  # a unit of no fixed length
    ({"column": "d", "width": "1 day"}, "day"),  # a DATE column: date_trunc gives a TIMESTAMP, its bins DATEs
])
def test_negative_control_other_truncations_stay_the_sparse_histogram(kwargs: dict, unit: str) -> None:
    col = kwargs.get("column", "ts")
    s = _session(**kwargs)
    r = s.explain(f"SELECT date_trunc('{unit}', {col}) AS h, COUNT(*) AS n FROM t GROUP BY h", epsilon=1.0, delta=1e-6)
    assert r.mechanism == "sparse_histogram"
