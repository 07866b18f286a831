"""Regression: the generation marker is the only record that a ledger lost acknowledged charges,
and it was named ``<ledger>.generation``, so the ordinary clean-up of a damaged ledger before a
restore, ``rm ledger.duckdb*`` (the file, its WAL, and whatever else starts with that name),
deleted it too, and a restored old copy then silently gave spent budget back. It is now the hidden
``.<ledger>.generation`` (like the queue files); a marker under the old name is still read."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pytest

from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger


def _charge(led: Ledger, eps: float) -> None:
    led.commit(led.reserve(Budget(eps), mechanism="m", query="q", tables=["t"], params={}))


def _restore_after(path: Path, clean: str) -> Ledger:
    led = Ledger.create(path, Budget(1.0))
    _charge(led, 0.25)
    backup = path.parent / "backups"
    backup.mkdir()
    shutil.copy2(path, backup / "ledger.duckdb")  # a nightly backup of the ledger file
    _charge(led, 0.5)  # acknowledged after the backup: 0.25 remain
    for f in glob.glob(clean):  # the operator clears the damaged ledger before restoring
        os.unlink(f)
    shutil.copy2(backup / "ledger.duckdb", path)
    return Ledger.open(path)


def test_restore_after_glob_cleanup_is_refused(tmp_path: Path) -> None:
    """Was (fixed): `rm ledger.duckdb*` removes the marker, and the restored copy is accepted with 0.75
    remaining instead of 0.25."""
    path = tmp_path / "ledger.duckdb"
    try:
        led = _restore_after(path, str(path) + "*")
    except LedgerError as e:
        assert "older than its last acknowledged change" in str(e)
        return
    assert led.remaining() == Budget(0.25), f"the restore gave budget back: {led.remaining()} remaining"


def test_negative_control_restore_without_glob_is_refused(tmp_path: Path) -> None:
    """Control: removing only the ledger file (and its WAL) keeps the marker, and the old copy is
    refused."""
    path = tmp_path / "ledger.duckdb"
    with pytest.raises(LedgerError, match="older than its last acknowledged change"):
        _restore_after(path, str(path))


def test_deleted_ledger_message_says_a_ledger_existed(tmp_path: Path) -> None:
    """Opening a deleted ledger (its marker proves a ledger with charges existed at this path)
    without create=True says only "no budget ledger ... create it with `dpsql init`": the first
    fix offered is the one that starts a fresh budget. ``create=True`` already reports the
    marker; the plain open (every `dpsql query` / `dpsql budget`) should too."""
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    _charge(led, 0.5)
    os.unlink(path)
    with pytest.raises(LedgerError) as ei:
        Ledger.open(path)
    assert "existed" in str(ei.value) or "generation" in str(ei.value), str(ei.value)


def test_marker_under_the_old_name_is_still_read(tmp_path: Path) -> None:
    """Ledgers of earlier releases have ``<ledger>.generation``: it still counts (the highest
    recorded generation of all markers wins)."""
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    _charge(led, 0.25)  # generation 3 (create 1, reserve 2, commit 3)
    (tmp_path / ".ledger.duckdb.generation").unlink()
    try:
        os.removexattr(path, "user.dpsql.generation")
    except OSError:
        pass
    assert led.remaining() == Budget(0.75)  # control: the file is newest, nothing else recorded
    (tmp_path / "ledger.duckdb.generation").write_text(f"dpsql ledger generation {4:020d}\n")
    with pytest.raises(LedgerError, match="older than its last acknowledged change") as ei:
        led.remaining()
    assert "ledger.duckdb.generation records that generation 4" in str(ei.value)


def test_plain_open_of_a_deleted_ledger_says_init_starts_a_new_budget(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    _charge(Ledger.create(path, Budget(1.0)), 0.5)
    os.unlink(path)
    with pytest.raises(LedgerError, match="a ledger existed here") as ei:
        Ledger.open(path)
    assert "restore the ledger file from a backup" in (ei.value.hint or "")
    assert "NEW budget" in (ei.value.hint or "")
    # control: a path where no ledger ever was gets the plain "create it" message
    with pytest.raises(LedgerError, match="no budget ledger at") as ei2:
        Ledger.open(tmp_path / "never.duckdb")
    assert "existed" not in str(ei2.value)
