"""Time bins narrower than a second: a value on a bin edge belongs to the bin it starts.

The bounded histogram placed a timestamp in its bin by (EPOCH(ts) - EPOCH(lo)) / width in doubles. EPOCH of an
instant of 2026 is about 1.8e9 seconds, whose double has a spacing of 2.4e-7 s, so with 0.1 s bins a row at
exactly lo + 0.1 s came out at 0.99999... bins and was counted in bin 0 ([0.0, 0.1)), the row at lo + 0.3 s in
bin 2: released bins 2, 0, 2, 0, 2, 2, 0, ... for one row per bin, and range endpoints on those edges (exact by
their analysis) missed or took in the row on the edge. The position is now taken from whole microseconds."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.plan import workload
from dpsql.testing import use_noise, zero_noise

pytestmark = pytest.mark.filterwarnings("ignore:epsilon=")

BASE = dt.datetime(2026, 1, 1)


def _session(width: str, step_us: int, n: int = 100) -> dpsql.Session:
    ts = [BASE + dt.timedelta(microseconds=step_us * k) for k in range(n)]
    s = dpsql.Session(budget=dpsql.Budget(1e7, 0.0))
    use_noise(s, zero_noise())
    end = BASE + dt.timedelta(microseconds=step_us * n)
    s.register("t", pa.table({"pid": np.arange(n), "ts": pa.array(ts, pa.timestamp("us"))}), privacy_unit="pid",
               max_rows_per_unit=1, columns={"ts": {"bounds": (str(BASE), str(end)), "bin_width": width}})
    return s


@pytest.mark.parametrize("width, step_us", [("0.1 seconds", 100_000), ("0.3 seconds", 300_000), ("0.001 seconds", 1000)])
def test_one_row_on_each_edge_is_one_per_bin(width: str, step_us: int) -> None:
    s = _session(width, step_us)
    counts = s.query("SELECT ts, COUNT(*) FROM t GROUP BY ts", epsilon=1e6).table.column(1).to_pylist()
    assert counts == [1] * 100, [(i, c) for i, c in enumerate(counts) if c != 1][:6]
    s.close()


def test_range_endpoints_on_subsecond_edges_count_the_row_on_the_edge() -> None:
    s = _session("0.1 seconds", 100_000)
    got = s.query_many([f"SELECT COUNT(*) FROM t WHERE ts >= TIMESTAMP '{BASE + dt.timedelta(seconds=0.1 * k)}'"
                        for k in (1, 3, 6)], epsilon=1e6).table.column("count").to_pylist()
    assert got == [99, 97, 94]
    wl = workload.analyze_workload([f"SELECT COUNT(*) FROM t WHERE ts >= TIMESTAMP '{BASE + dt.timedelta(seconds=0.3)}'"],
                                   s.tables)
    assert wl.ranges == ((3, 99),) and wl.snapped == [False]  # on an edge: exact, not widened
    s.close()


def test_control_whole_second_bins() -> None:
    s = _session("1 second", 1_000_000)
    counts = s.query("SELECT ts, COUNT(*) FROM t GROUP BY ts", epsilon=1e6).table.column(1).to_pylist()
    assert counts == [1] * 100
    s.close()
