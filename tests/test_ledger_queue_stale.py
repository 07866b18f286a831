"""The waiting queue's slot files (``.NAME.q-*`` beside a file ledger) of processes that were killed
while waiting are removed by later operations, and only when no process holds the slot's lock: a live
waiter's slot is never removed. (Each slot is unlinked by its owner when it leaves, or by its successor
once the owner is gone; a waiter killed together with its successor, or whose successor had timed
out, left its slot behind for good.) Each child runs with a hard time limit; no timed asserts."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import spawn_python as _spawn

from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger, _store

WAITER = """
import json, sys
from dpsql.ledger import Ledger
try:
    Ledger(sys.argv[1], lock_timeout=60).remaining()
    print(json.dumps({"ok": True}), flush=True)
except Exception as e:
    print(json.dumps({"error": type(e).__name__}), flush=True)
"""


def _slots(d: Path) -> dict[int, str]:
    """The queue's slot files in ``d`` by the pid in their name."""
    return {int(f.split(".q-")[1].split("-")[0]): f for f in os.listdir(d) if ".ledger.duckdb.q-" in f}


def _join_queue(d: Path, queue: Path) -> subprocess.Popen[str]:
    """A waiter process, returned once its slot is the queue's tail."""
    p = _spawn(WAITER, str(d / "ledger.duckdb"))
    for _ in range(4000):  # bounded: at most ~40 s
        if p.poll() is not None:
            raise AssertionError(p.stderr.read() if p.stderr else "waiter exited")
        if queue.exists() and f".q-{p.pid}-" in queue.read_text():
            return p
        threading.Event().wait(0.01)
    raise AssertionError("the waiter never joined the queue")


def test_slots_of_killed_waiters_are_removed_by_the_next_operation_and_live_ones_kept(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    queue = tmp_path / ".ledger.duckdb.queue"
    inside, release = threading.Event(), threading.Event()

    def hold(p: str) -> None:
        if threading.current_thread().name == "holder":
            inside.set()
            release.wait(60)

    procs: list[subprocess.Popen[str]] = []
    _store._HOOKS["after_attach"] = hold
    holder = threading.Thread(target=lambda: Ledger(str(path), lock_timeout=60).remaining(), name="holder")
    holder.start()
    try:
        assert inside.wait(30)
        # three waiters queue up behind the holder: w1 <- w2 <- w3
        w1, w2, w3 = (_join_queue(tmp_path, queue) for _ in range(3))
        procs += [w1, w2, w3]
        assert {w1.pid, w2.pid, w3.pid} <= set(_slots(tmp_path))
        for w in (w1, w2):  # killed while waiting, together (a cancelled batch of jobs)
            w.send_signal(signal.SIGKILL)
            w.wait(30)
        # the next operation (here one that gives up: the holder still holds the ledger) clears the dead slots
        with pytest.raises(LedgerError, match="locked"):
            Ledger(str(path), lock_timeout=0.3).remaining()
        left = _slots(tmp_path)
        assert w1.pid not in left and w2.pid not in left, left
        assert w3.pid in left  # negative control: the live waiter's slot is kept
        assert os.getpid() in left  # and so is the holder's
        release.set()
        holder.join(60)
        assert w3.stdout is not None and json.loads(w3.stdout.readline()) == {"ok": True}
        w3.wait(30)
    finally:
        release.set()
        holder.join(60)
        _store._HOOKS.pop("after_attach", None)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert Ledger.open(path).remaining() == Budget(1.0)
    assert not _slots(tmp_path)


def test_only_unlocked_regular_slot_files_are_removed(tmp_path: Path) -> None:
    """A slot whose lock another process holds is kept; a FIFO or a symbolic link of a slot's name is
    neither opened for long nor followed nor removed; files of other names are left alone."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    live = tmp_path / ".ledger.duckdb.q-1-1-0000000a"
    dead = tmp_path / ".ledger.duckdb.q-2-1-0000000b"
    fifo = tmp_path / ".ledger.duckdb.q-3-1-0000000c"
    link = tmp_path / ".ledger.duckdb.q-4-1-0000000d"
    other = tmp_path / ".other.duckdb.q-5-1-0000000e"
    target = tmp_path / "keep.txt"
    for f in (live, dead, other, target):
        f.write_bytes(b"")
    os.mkfifo(fifo)
    os.symlink(target, link)
    holder = _spawn("""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
""", str(live))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert Ledger.open(path).remaining() == Budget(1.0)
        assert live.exists() and not dead.exists() and fifo.exists() and os.path.islink(link) and other.exists()
        assert target.exists()
    finally:
        holder.kill()
        holder.wait(10)
    # once its owner is gone, the live slot goes too
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds it now
    finally:
        os.close(fd)
    assert Ledger.open(path).remaining() == Budget(1.0)
    assert not live.exists()


def test_a_sweep_in_the_instant_before_a_new_slot_is_locked_never_leaves_a_waiter_without_its_slot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one window: a slot created but not yet locked looks dead to a sweep. The creator finds its
    name gone once it holds the lock, and queues again with a new slot, which it holds."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    real_open, swept = _store._open_other, []

    def open_then_swept(p: str, flags: int, mode: int = 0o600) -> int:
        fd = real_open(p, flags, mode)
        if flags & os.O_CREAT and ".q-" in p and not swept:  # another process sweeps right now
            swept.append(p)
            d, base = os.path.split(p)
            _store._sweep_dead_slots(d, "ledger.duckdb", os.path.join(d, "someone-else"))
        return fd

    monkeypatch.setattr(_store, "_open_other", open_then_swept)
    slot = _store._queue_enter(str(path), _store.time.monotonic() + 10)
    try:
        assert slot is not None and swept and not os.path.exists(swept[0])
        assert slot[1] != swept[0] and os.path.exists(slot[1])  # a new slot, present and locked by its waiter
        fd = os.open(slot[1], os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        _store._queue_leave(slot)
    assert not _slots(tmp_path)
