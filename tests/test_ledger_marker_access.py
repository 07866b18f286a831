"""Regression: a ledger shared by several users (a group-writable ledger file and directory)
whose generation marker only its creator may write: every other user's charge was committed, then
the marker update failed, so the query failed with "the charge stands" and each retry spent more
budget without ever answering. The marker's writability is now checked before the COMMIT (the
charge is refused and nothing is spent), and a new marker gets the ledger file's permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import GENERATION_SUFFIX, Ledger


def _reserve(led: Ledger) -> int:
    return led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})


def test_unwritable_marker_refuses_the_charge_and_spends_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    _reserve(led)
    marker = str(tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX))
    real_open = os.open

    def denied(p: object, flags: int, *a: object, **k: object) -> int:  # the marker belongs to another user
        if os.fspath(p) == marker and flags & (os.O_WRONLY | os.O_RDWR):  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", marker)
        return real_open(p, flags, *a, **k)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(os, "open", denied)
        for _ in range(3):  # a user retrying
            with pytest.raises(LedgerError, match="nothing was charged") as info:
                _reserve(led)
            assert not info.value.recorded and "marker" in str(info.value)
        assert led.remaining() == Budget(0.9)
    _reserve(led)  # control: writable again, charged as before
    assert Ledger.open(path).remaining() == Budget(0.8)


def test_new_marker_takes_the_ledger_files_permissions(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    marker = tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX)
    os.chmod(path, 0o664)  # the owner shares the ledger with a group
    marker.unlink()
    _reserve(led)
    assert stat.S_IMODE(marker.stat().st_mode) == 0o664
