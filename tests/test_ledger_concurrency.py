"""The ledger under concurrency: real processes, a held file lock, threads, crash durability."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest
from conftest import run_together
from conftest import spawn_python as _spawn

from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, LedgerError
from dpsql.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]



def _reserve(ledger: Ledger, eps: float = 0.1) -> int:
    return ledger.reserve(Budget(eps), mechanism="m", query="SELECT 1", tables=["t"], params={"sigma": 1.0})


WORKER = """
import json, sys
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError
from dpsql.ledger import Ledger

path, attempts = sys.argv[1], int(sys.argv[2])
ledger = Ledger.open(path, lock_timeout=60.0)
print("ready", flush=True)
sys.stdin.readline()  # start together
ok, exceeded, other = [], 0, []
for i in range(attempts):
    try:
        ok.append(ledger.reserve(Budget(0.1), mechanism="m", query=f"q{i}", tables=["t"], params={}))
    except BudgetExceededError:
        exceeded += 1
    except Exception as e:  # noqa: BLE001 - reported to the parent
        other.append(f"{type(e).__name__}: {e}")
print(json.dumps({"ok": ok, "exceeded": exceeded, "other": other}), flush=True)
"""


def test_processes_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    n_proc, attempts = 4, 5
    procs = [_spawn(WORKER, str(path), str(attempts)) for _ in range(n_proc)]
    results = run_together(procs)
    ids = sorted(i for r in results for i in r["ok"])
    assert [r["other"] for r in results] == [[]] * n_proc
    assert ids == list(range(1, 11))  # exactly ten charges of 0.1, no duplicate ids
    assert sum(r["exceeded"] for r in results) == n_proc * attempts - 10
    led = Ledger.open(path)
    assert led.spent() == led.total() == Budget(1.0)
    assert led.history().num_rows == 10


HOLDER = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == "ro")
print("held", flush=True)
sys.stdin.readline()
con.close()
"""


@contextmanager
def _held(path: Path, mode: str) -> Iterator[None]:
    """Another process holds the ledger file open (``rw`` or ``ro``) until the block ends."""
    p = _spawn(HOLDER, str(path), mode)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.strip() == "held", p.stderr.read() if p.stderr else line
        yield
    finally:
        p.communicate("release\n", timeout=30)
        assert p.returncode == 0


def test_locked_ledger_times_out_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    _reserve(led)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with _held(path, "rw"):
        locked = Ledger(str(path), lock_timeout=0.5)
        with pytest.raises(LedgerError, match="locked by another process") as ei:
            _reserve(locked)
        assert "(PID " in str(ei.value) and "lock_timeout" in (ei.value.hint or "")
        with pytest.raises(LedgerError, match="locked"):  # a read-write holder blocks readers too
            locked.remaining()
        with pytest.raises(LedgerError, match="locked"):
            Ledger.open(path, lock_timeout=0.2)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert led.history().num_rows == 1 and led.spent() == Budget(0.1)


def test_reader_in_another_process_blocks_writes_not_reads(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0), lock_timeout=0.5)
    with _held(path, "ro"):
        assert led.remaining() == Budget(1.0)  # read-only opens share the file
        with pytest.raises(LedgerError, match="locked by another process"):
            _reserve(led)
    _reserve(led)  # the lock is gone: works again
    assert led.spent() == Budget(0.1)


def test_waits_for_a_short_lock(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0), lock_timeout=30.0)
    result: list[object] = []
    with _held(path, "rw"):
        t = threading.Thread(target=lambda: result.append(_reserve(led)))
        t.start()
        t.join(0.3)
        assert t.is_alive() and not result  # still retrying while the file is held
    t.join(30)
    assert result == [1]


def test_threads_and_ledger_objects_in_one_process_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    ledgers = [Ledger.open(path, lock_timeout=60.0), Ledger.open(str(path), lock_timeout=60.0)]
    ok: list[int] = []
    exceeded: list[int] = []
    errors: list[BaseException] = []

    def work(led: Ledger) -> None:
        for _ in range(4):
            try:
                ok.append(_reserve(led))
            except BudgetExceededError:
                exceeded.append(1)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

    threads = [threading.Thread(target=work, args=(ledgers[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(ok) == list(range(1, 11)) and len(exceeded) == 6
    assert ledgers[0].spent() == Budget(1.0)


def test_foreign_connection_in_this_process(tmp_path: Path) -> None:
    """Another DuckDB connection of this process holding the ledger open is waited for, then
    refused; dpsql never shares its transactions (read-check-insert there is open to write skew)."""
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0), lock_timeout=0.3)
    for read_only in (True, False):
        con = duckdb.connect(str(path), read_only=read_only)
        try:
            with pytest.raises(LedgerError, match="in this process") as ei:
                _reserve(led)
            assert "nothing was charged" in str(ei.value)
            if read_only:  # read-only opens share the file
                assert led.remaining() == Budget(1.0)
            else:
                with pytest.raises(LedgerError, match="in this process"):
                    led.remaining()
        finally:
            con.close()
    _reserve(led)  # closed: works again
    assert Ledger.open(path).spent() == Budget(0.1)


CRASHER = """
import os, sys
from dpsql.budget import Budget
from dpsql.ledger import Ledger
led = Ledger.open(sys.argv[1])
led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
os._exit(0)  # die without any cleanup right after reserve() returns
"""


def test_reservation_survives_abrupt_exit(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    p = _spawn(CRASHER, str(path))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert Ledger.open(path).spent() == Budget(0.25)


def test_concurrent_open_with_total_creates_once(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    got: list[Budget] = []
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            got.append(Ledger.open(path, Budget(1.0), create=True, lock_timeout=30).total())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=open_it) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and got == [Budget(1.0)] * 3
    assert Ledger.open(path).totals_history().num_rows == 1
