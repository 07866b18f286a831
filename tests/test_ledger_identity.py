"""Regression: the generation marker next to a ledger compared generation numbers only, so another
ledger file put in the ledger's place (a wrong backup, a copy of another budget's ledger) was
accepted whenever it had been written at least as often: 0.9 of spent epsilon came back. Each
ledger now records a random identity (``ledger_meta`` 'ledger_id'), the marker records it with
the generation, and a file that is not the marker's ledger is refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest

from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import GENERATION_SUFFIX, Ledger


def _charge(led: Ledger, eps: float) -> None:
    led.commit(led.reserve(Budget(eps), mechanism="m", query="q", tables=["t"], params={}))


def _put_in_place(src: Path, dst: Path) -> None:
    """Copy ``src`` over ``dst`` the way an operator would (a new file, renamed into place)."""
    shutil.copyfile(src, str(dst) + ".tmp")
    os.replace(str(dst) + ".tmp", dst)


def _spent_and_other(tmp_path: Path) -> tuple[Path, Path]:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    for _ in range(3):
        _charge(led, 0.3)  # 0.9 spent, generation 7
    (tmp_path / "other").mkdir()
    other = tmp_path / "other" / "ledger.duckdb"
    oth = Ledger.create(other, Budget(1.0))
    for i in range(10):  # nothing spent, written more often (generation 12)
        oth.set_total(Budget(2.0 + i), reason="x")
    oth.set_total(Budget(1.0), reason="back")
    return path, other


def test_another_ledger_put_in_place_is_refused(tmp_path: Path) -> None:
    """Was: accepted with 1.0 remaining instead of 0.1."""
    path, other = _spent_and_other(tmp_path)
    _put_in_place(other, path)
    with pytest.raises(LedgerError, match="not the ledger whose generation marker"):
        Ledger.open(path)
    with pytest.raises(LedgerError, match="not the ledger whose generation marker"):
        Ledger(str(path)).reserve(Budget(0.5), mechanism="m", query="q", tables=["t"], params={})


def test_negative_control_a_copy_of_the_same_ledger_is_accepted(tmp_path: Path) -> None:
    """Control: a complete copy of the ledger itself (a move through a copy) is the same ledger."""
    path, _other = _spent_and_other(tmp_path)
    backup = tmp_path / "backup.duckdb"
    shutil.copyfile(path, backup)
    _put_in_place(backup, path)
    led = Ledger.open(path)
    assert led.remaining() == Budget(0.1)
    _charge(led, 0.1)
    assert Ledger.open(path).remaining() == Budget(0.0)


def _without_identity(tmp_path: Path) -> tuple[Path, Ledger, int]:
    """A ledger charged 0.25 of 1.0 (the object that did), its identity removed and its marker as earlier
    releases wrote it (at that generation)."""
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    _charge(led, 0.25)
    con = duckdb.connect(str(path))
    con.execute("DELETE FROM ledger_meta WHERE key = 'ledger_id'")
    generation = int(con.execute("SELECT value FROM ledger_meta WHERE key = 'generation'").fetchall()[0][0])
    con.close()
    (tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX)).write_text(f"dpsql ledger generation {generation:020d}\n")
    return path, led, generation


def test_ledger_without_identity_adopts_one_and_then_is_checked(tmp_path: Path) -> None:
    """A ledger written before identities (no meta row) and its marker open as before; the first
    write records an identity in both, and from then on a ledger without it is refused."""
    path, led, generation = _without_identity(tmp_path)
    marker = tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX)
    older = tmp_path / "older.duckdb"
    shutil.copyfile(path, older)
    assert led.remaining() == Budget(0.75)
    _charge(led, 0.25)
    text = marker.read_text()
    assert text.startswith(f"dpsql ledger generation {generation + 2:020d} id ") and len(text.split()[-1]) == 32
    assert Ledger.open(path).remaining() == Budget(0.5)
    with duckdb.connect(str(older)) as con:  # pretend the copy without identity was written as often
        con.execute("UPDATE ledger_meta SET value = '99' WHERE key = 'generation'")
    _put_in_place(older, path)
    with pytest.raises(LedgerError, match="not the ledger whose generation marker"):
        Ledger.open(path)


def test_init_over_a_deleted_ledger_starts_a_new_identity(tmp_path: Path) -> None:
    """``dpsql init`` where a ledger was deleted (its marker left): the new ledger is used at once."""
    path = tmp_path / "ledger.duckdb"
    _charge(Ledger.create(path, Budget(1.0)), 0.5)
    path.unlink()
    led = Ledger.create(path, Budget(2.0))
    _charge(led, 0.5)
    assert Ledger.open(path).remaining() == Budget(1.5)


def test_init_over_a_deleted_ledger_killed_before_its_marker_is_usable(tmp_path: Path) -> None:
    """A creation over a deleted ledger's marker that dies after the file got its name, before the
    marker records the new identity, leaves a usable ledger (the new file names the ledger it
    replaced), not one refused as "another ledger put in its place"."""
    import subprocess
    import sys

    path = tmp_path / "ledger.duckdb"
    _charge(Ledger.create(path, Budget(1.0)), 0.5)
    path.unlink()
    code = (
        "import os, sys\n"
        "from dpsql.budget import Budget\n"
        "from dpsql.ledger import Ledger, _store\n"
        "_store._HOOKS['create_marker'] = lambda p: os._exit(9)\n"
        f"Ledger.create({str(path)!r}, Budget(2.0))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 9
    led = Ledger.open(path)
    assert led.remaining() == Budget(2.0)
    _charge(led, 0.5)
    assert Ledger.open(path).remaining() == Budget(1.5)
    # the file that replaced the deleted ledger does not vouch for a third ledger put in its place
    other = tmp_path / "other.duckdb"
    oth = Ledger.create(other, Budget(2.0))
    for i in range(10):
        oth.set_total(Budget(3.0 + i), reason="x")
    _put_in_place(other, path)
    with pytest.raises(LedgerError, match="not the ledger whose generation marker"):
        Ledger.open(path)


def test_an_identity_whose_write_rolled_back_is_not_kept(tmp_path: Path) -> None:
    """A ledger written before identities: a write that fails before its COMMIT (here at the hook before it) does
    not record the identity it drew, so this object keeps no identity the file never had; when another writer then
    records the ledger's identity, this object goes on using the same ledger (not refused as another one)."""
    from dpsql.ledger import _store

    path = _without_identity(tmp_path)[0]
    mine = Ledger.open(path)

    def fail(_p: str) -> None:
        raise OSError("the disk failed")

    _store._HOOKS["before_commit"] = fail
    try:
        with pytest.raises(OSError):
            _charge(mine, 0.25)
    finally:
        _store._HOOKS.pop("before_commit")
    _charge(Ledger.open(path), 0.25)  # another writer records the ledger's identity
    assert mine.remaining() == Budget(0.5)
    _charge(mine, 0.25)
    assert Ledger.open(path).remaining() == Budget(0.25)
