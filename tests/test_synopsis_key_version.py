"""Regression (review finding): with an owner-declared ``version`` the synopsis key named the
version label and the read definition but not the source, so two different files registered
under the same table name with the same label (e.g. the date of the extract) shared one key: a
session over us.parquet (every age 8) was answered for free from the synopsis of eu.parquet
(every age 1), [0, 100, 0, ...] instead of [..., 100 at age 8, 0]. The key now names the
source's kind and location; the same file under the same label is still reused."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise


def run(src: Path, ledger: Path) -> tuple[bool, list[int]]:
    s = dpsql.Session(ledger=str(ledger), budget=Budget(100.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    try:
        s.register("events", str(src), privacy_unit="uid", max_rows_per_unit=1,
                   columns={"age": {"bounds": (0, 9), "bins": 10}}, version="2026-11-30")
        r = s.query("SELECT age, COUNT(*) FROM events GROUP BY age", epsilon=1.0)
        return r.reused, r.table.column(1).to_pylist()
    finally:
        s.close()


def write(tmp: Path) -> None:
    pq.write_table(pa.table({"uid": list(range(100)), "age": [1] * 100}), tmp / "eu.parquet")
    pq.write_table(pa.table({"uid": list(range(100)), "age": [8] * 100}), tmp / "us.parquet")


EU = [0, 100] + [0] * 8
US = [0] * 8 + [100, 0]


def test_control_same_file_same_version_is_reused(tmp_path: Path) -> None:
    write(tmp_path)
    assert run(tmp_path / "eu.parquet", tmp_path / "l.db") == (False, EU)
    assert run(tmp_path / "eu.parquet", tmp_path / "l.db") == (True, EU)


def test_other_file_same_version_not_reused(tmp_path: Path) -> None:
    write(tmp_path)
    assert run(tmp_path / "eu.parquet", tmp_path / "l.db") == (False, EU)
    reused, counts = run(tmp_path / "us.parquet", tmp_path / "l.db")
    assert (reused, counts) == (False, US), f"reused={reused}: us.parquet answered {counts}"
