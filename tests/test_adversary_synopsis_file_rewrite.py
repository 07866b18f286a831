"""A file rewritten in place with the same size and its modification time restored (``cp -p``, ``rsync -t``,
``touch -r``, an extract tool that stamps the data's date) is other data: its stored DAWA synopsis must not
answer for it. The source identity named device, inode, size and mtime but not the change time, which no
program can set back: a session reading the new file (the engine's CSV copy, keyed by its own version with the
change time, read the new rows) answered its histogram for free from the old file's synopsis, every age 1
instead of every age 8."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise

pytestmark = pytest.mark.filterwarnings("ignore:epsilon=1000 is unusually large")


def run(src: Path, ledger: Path) -> tuple[bool, list[int]]:
    s = dpsql.Session(ledger=str(ledger), budget=Budget(10000.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    try:
        s.register("events", str(src), privacy_unit="uid", max_rows_per_unit=1, columns={"age": {"type": "BIGINT", "bounds": (0, 9), "bins": 10}})
        r = s.query("SELECT age, COUNT(*) FROM events GROUP BY age", epsilon=1000.0)
        return r.reused, r.table.column(1).to_pylist()
    finally:
        s.close()


def write(path: Path, age: int) -> None:
    path.write_text("uid,age\n" + "".join(f"{i:03d},{age}\n" for i in range(100)))


def test_a_same_size_rewrite_with_its_mtime_restored_is_not_answered_from_the_old_synopsis(tmp_path: Path) -> None:
    src, ledger = tmp_path / "events.csv", tmp_path / "ledger.duckdb"
    write(src, 1)
    old = os.stat(src)
    assert run(src, ledger) == (False, [0, 100] + [0] * 8)
    time.sleep(0.05)
    write(src, 8)  # the same bytes but one digit per line, in place (same inode and size)
    os.utime(src, ns=(old.st_atime_ns, old.st_mtime_ns))
    new = os.stat(src)
    assert (new.st_ino, new.st_size, new.st_mtime_ns) == (old.st_ino, old.st_size, old.st_mtime_ns)
    reused, counts = run(src, ledger)
    assert not reused and counts == [0] * 8 + [100, 0]


def test_control_the_untouched_file_is_answered_from_its_synopsis(tmp_path: Path) -> None:
    src, ledger = tmp_path / "events.csv", tmp_path / "ledger.duckdb"
    write(src, 1)
    assert run(src, ledger) == (False, [0, 100] + [0] * 8)
    assert run(src, ledger) == (True, [0, 100] + [0] * 8)
