"""Regression (review finding): a date/time ordered domain declared with ``bin_width`` keeps its
declared ``hi``, so ``lo``, ``hi`` and ``bins`` do not determine the bins: over one day, "6 hours"
and "7 hours" both make 4 bins. The synopsis key named only (lo, hi, bins), so a histogram of
7-hour bins was answered from the synopsis of 6-hour bins (120 per bin instead of 140, 140, 140,
60 under zero noise), labelled with the 7-hour edges."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise

SQL = "SELECT t, COUNT(*) FROM t GROUP BY t"


def write(path: Path) -> None:
    ts = [dt.datetime(2026, 1, 1) + dt.timedelta(hours=h % 24) for h in range(480)]
    pq.write_table(pa.table({"uid": list(range(480)), "t": ts}), path)


def run(src: Path, ledger: Path, width: str) -> tuple[bool, list[int]]:
    s = dpsql.Session(ledger=str(ledger), budget=Budget(100.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    try:
        s.register("t", str(src), privacy_unit="uid", max_rows_per_unit=1,
                   columns={"t": {"bounds": ("2026-01-01 00:00:00", "2026-01-02 00:00:00"), "bin_width": width}})
        r = s.query(SQL, epsilon=10.0)
        return r.reused, r.table.column(1).to_pylist()
    finally:
        s.close()


def test_control_same_width_is_reused(tmp_path: Path) -> None:
    write(tmp_path / "t.parquet")
    assert run(tmp_path / "t.parquet", tmp_path / "l.db", "6 hours") == (False, [120] * 4)
    assert run(tmp_path / "t.parquet", tmp_path / "l.db", "6 hours") == (True, [120] * 4)


def test_other_bin_width_same_bin_count_not_reused(tmp_path: Path) -> None:
    write(tmp_path / "t.parquet")
    assert run(tmp_path / "t.parquet", tmp_path / "l.db", "6 hours") == (False, [120] * 4)
    reused, counts = run(tmp_path / "t.parquet", tmp_path / "l.db", "7 hours")
    assert (reused, counts) == (False, [140, 140, 140, 60]), f"reused={reused}: 7-hour bins answered {counts}"
