"""The budget ledger under files replaced, copied and restored while processes charge it.

Each test states the promise it checks: the total charged never exceeds the ledger's budget, no
released answer is uncharged, and a failure says what happened. A file replaced under an operation
that holds the ledger, a ledger copied to a second path, a backup restored together with its
generation marker. The ones marked xfail need more than a local change (see their reasons).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import child_env

from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, LedgerError
from dpsql.ledger import Ledger, _store


def _reserve(led: Ledger, eps: float = 0.5) -> int:
    return led.reserve(Budget(eps, 0.0), mechanism="m", query="q", tables=["t"], params={})


def _charge_in_child(path: Path, eps: float = 0.5) -> subprocess.CompletedProcess[str]:
    """Another process's reserve that does not wait for the queue (lock_timeout=0): it takes the inode
    flock of whatever file the path names when it comes."""
    code = textwrap.dedent(f"""
        from dpsql.budget import Budget
        from dpsql.ledger import Ledger
        print(Ledger.open({str(path)!r}, lock_timeout=0).reserve(
            Budget({eps!r}, 0.0), mechanism="m", query="q", tables=["t"], params={{}}))
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                          timeout=60)


def _once(f: Callable[[str], None]) -> Callable[[str], None]:
    done: list[int] = []

    def hook(path: str) -> None:
        if not done:
            done.append(1)
            f(path)
    return hook


@pytest.fixture
def hooks() -> object:
    yield _store._HOOKS
    _store._HOOKS.clear()


# --- 1. the ledger file replaced (by a copy of itself) while an operation holds it ---------------------------
#
# Process A locks the ledger's inode and attaches it; meanwhile the file at the path is replaced by a copy
# of itself (a restore, a sync tool writing the file anew) and process B, whose wait for the queue ran out,
# locks the NEW inode and charges it. Before the fix, A's reserve went into the old, unlinked file and
# returned an entry id (its query would then read and release), while the ledger at the path shows only
# B's charge under the same entry id: 1.5 charged of a total of 1.0, and A's answer uncharged there.


@pytest.mark.parametrize("when", ["after_attach", "before_marker"])
def test_a_ledger_replaced_during_a_charge_refuses_that_charge(
    tmp_path: Path, hooks: dict[str, object], when: str
) -> None:
    p = tmp_path / "l.duckdb"
    _reserve(Ledger.create(p, Budget(1.0, 0.0)))
    shutil.copyfile(p, tmp_path / "copy.duckdb")
    a = Ledger.open(p)
    other: list[subprocess.CompletedProcess[str]] = []

    def replace_and_charge(_path: str) -> None:
        os.replace(tmp_path / "copy.duckdb", p)
        if when == "after_attach":
            other.append(_charge_in_child(p))

    hooks[when] = _once(replace_and_charge)
    with pytest.raises(LedgerError, match="replaced") as info:
        _reserve(a)
    hooks.clear()
    err = info.value
    assert "stop what rewrites it" in (err.hint or "")
    if when == "after_attach":  # before A's COMMIT: A charged nothing, B's charge is the ledger's
        assert other[0].returncode == 0, other[0].stderr
        assert "nothing was charged" in str(err) and not err.unacknowledged
        led = Ledger.open(p)
        assert led.spent() == Budget(1.0, 0.0)
        assert led.history().column("status").to_pylist() == ["reserved", "reserved"]
    else:  # after A's COMMIT into the replaced file: it exits as charged, reads nothing, and the older copy
        # now at the path is refused
        assert err.unacknowledged and "no private row was read" in str(err)
        with pytest.raises(LedgerError, match="older than its last acknowledged change"):
            Ledger.open(p)


def test_negative_control_a_ledger_replaced_between_operations_is_caught_by_its_marker(tmp_path: Path) -> None:
    p = tmp_path / "l.duckdb"
    a = Ledger.create(p, Budget(1.0, 0.0))
    _reserve(a)
    shutil.copyfile(p, tmp_path / "copy.duckdb")
    _reserve(a)
    os.replace(tmp_path / "copy.duckdb", p)
    with pytest.raises(LedgerError, match="older than its last acknowledged change"):
        _reserve(a)


# --- 2. a ledger copied to a second path --------------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason=(
    "a copy of a ledger file at another path (cp, or a second deployment given a copy) is a second full "
    "budget of the same identity: its directory holds no marker, and the generation marker and the "
    "extended attribute of the original do not travel with a plain copy. Refusing it needs state that "
    "outlives the file and its directory (e.g. a per-identity record outside the ledger's directory, or a "
    "recorded inode with an explicit 'adopt' for a moved or restored file): a design change"))
def test_a_copy_of_a_ledger_at_another_path_is_not_a_second_budget(tmp_path: Path) -> None:
    (tmp_path / "copy").mkdir()
    p, q = tmp_path / "l.duckdb", tmp_path / "copy" / "l.duckdb"
    _reserve(Ledger.create(p, Budget(1.0, 0.0)))
    shutil.copy2(p, q)
    _reserve(Ledger.open(p))
    with pytest.raises((LedgerError, BudgetExceededError)):
        _reserve(Ledger.open(q))  # would bring what was charged to 1.5 of a total of 1.0


@pytest.mark.xfail(strict=True, reason=(
    "the generation marker lies next to each name of the ledger: one hard link in another directory, used "
    "less, keeps an older marker, and an older copy restored under that name (a new file) is checked against "
    "it only; the same design change as a copy at another path"))
def test_an_older_copy_restored_under_a_less_used_hard_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = tmp_path / "a" / "l.duckdb", tmp_path / "b" / "l.duckdb"
    first = Ledger.create(a, Budget(1.0, 0.0))
    _reserve(first, 0.1)
    os.link(a, b)
    second = Ledger.open(b)
    _reserve(second, 0.1)
    shutil.copyfile(b, tmp_path / "backup.duckdb")
    _reserve(second, 0.1)
    _reserve(second, 0.1)
    os.replace(tmp_path / "backup.duckdb", a)
    with pytest.raises(LedgerError, match="older than its last acknowledged change"):
        Ledger.open(a)  # holds 0.2 of the 0.4 charged


# --- 3. a backup restored together with its generation marker ----------------------------------------------


@pytest.mark.xfail(strict=True, reason=(
    "the README asks to keep the generation marker in backups; restoring the ledger together with its "
    "marker (a directory restore, tar --xattrs, mv of both) rolls back both, and the spent budget since the "
    "backup is given back unnoticed. Detecting it needs a record of the newest generation that a restore "
    "of the directory does not roll back: a design change"))
def test_restoring_a_backup_with_its_marker_does_not_give_budget_back(tmp_path: Path) -> None:
    (tmp_path / "bak").mkdir()
    p, marker = tmp_path / "l.duckdb", tmp_path / ".l.duckdb.generation"
    led = Ledger.create(p, Budget(1.0, 0.0))
    _reserve(led, 0.25)
    for f in (p, marker):
        shutil.copy2(f, tmp_path / "bak" / f.name)
    _reserve(led, 0.25)
    _reserve(led, 0.25)
    for f in (p, marker):
        os.replace(tmp_path / "bak" / f.name, f)
    with pytest.raises(LedgerError):
        assert Ledger.open(p).spent() == Budget(0.75, 0.0)


def test_negative_control_restoring_the_ledger_without_its_marker_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bak").mkdir()
    p = tmp_path / "l.duckdb"
    led = Ledger.create(p, Budget(1.0, 0.0))
    _reserve(led, 0.25)
    shutil.copy2(p, tmp_path / "bak" / p.name)
    _reserve(led, 0.25)
    os.replace(tmp_path / "bak" / p.name, p)
    with pytest.raises(LedgerError, match="older than its last acknowledged change"):
        Ledger.open(p)


def test_a_ledger_moved_away_during_a_charge_charges_nothing(tmp_path: Path, hooks: dict[str, object]) -> None:
    p = tmp_path / "l.duckdb"
    _reserve(Ledger.create(p, Budget(1.0, 0.0)))
    a = Ledger.open(p)
    hooks["after_attach"] = _once(lambda _path: os.replace(p, tmp_path / "moved.duckdb"))
    with pytest.raises(LedgerError, match="moved or replaced") as info:
        _reserve(a)
    hooks.clear()
    assert "nothing was charged" in str(info.value)
    os.replace(tmp_path / "moved.duckdb", p)  # put back: it holds the first charge only
    assert Ledger.open(p).spent() == Budget(0.5, 0.0)
