"""Regressions: the ledger's locking: a huge lock_timeout, and the lock of a killed process that a
forked child keeps alive. Each test runs its processes with hard time limits (no timed asserts)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import child_env as _env
from conftest import spawn_python as _spawn

from dpsql.budget import Budget
from dpsql.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]

# Holds the ledger's lock (inside an operation) for argv[2] seconds, or until a line arrives on its stdin.
HOLDER = """
import select, sys
from dpsql.budget import Budget
from dpsql.ledger import Ledger, _store
def inside(p):
    print("inside", flush=True)
    if select.select([sys.stdin], [], [], float(sys.argv[2]))[0]:
        sys.stdin.readline()
_store._HOOKS["after_attach"] = inside
led = Ledger(sys.argv[1], lock_timeout=30)
led.reserve(Budget(0.1), mechanism="m", query="holder", tables=["t"], params={})
print("done", flush=True)
"""

# A waiter with a huge (finite, accepted) lock_timeout: it should simply wait for the holder.
# Afterwards it stays alive (as a long-running server would) while another process uses the ledger.
HUGE_WAITER = """
import json, sys, time
from dpsql.budget import Budget
from dpsql.ledger import Ledger, _store
_store._HOOKS["before_queue"] = lambda p: print("waiting", flush=True)  # next: the queue and the lock, held
led = Ledger(sys.argv[1], lock_timeout=1e10)
try:
    eid = led.reserve(Budget(0.1), mechanism="m", query="waiter", tables=["t"], params={})
    out = {"ok": eid}
except Exception as e:
    out = {"error": type(e).__name__, "msg": str(e)[:300]}
print(json.dumps(out), flush=True)
time.sleep(float(sys.argv[2]))
"""

OTHER = """
import json, sys
from dpsql.budget import Budget
from dpsql.ledger import Ledger
led = Ledger(sys.argv[1], lock_timeout=4)
try:
    out = {"ok": led.reserve(Budget(0.1), mechanism="m", query="other", tables=["t"], params={})}
except Exception as e:
    out = {"error": type(e).__name__, "msg": str(e)[:300]}
print(json.dumps(out), flush=True)
"""


def _huge_timeout_case(tmp_path: Path, waiter_path: Path, path: Path) -> None:
    holder = _spawn(HOLDER, str(path), "30")
    waiter = None
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "inside"
        waiter = _spawn(HUGE_WAITER, str(waiter_path), "25")
        assert waiter.stdout is not None
        line = waiter.stdout.readline()
        assert line.strip() == "waiting", line
        # the holder lets go 0.5 s after the waiter went on to wait for it (it held 2 s from its start before)
        time.sleep(0.5)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        got = json.loads(waiter.stdout.readline())
        holder.wait(30)
        # the waiter got its charge once the holder was done, or at worst a LedgerError
        assert "ok" in got or got.get("error") in ("LedgerError", "LedgerBusyError"), got
        # and whatever happened, the ledger is usable by another process once the holder is done
        other = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(OTHER), str(path)],
            capture_output=True, text=True, timeout=40, env=_env(),
        )
        res = json.loads(other.stdout.strip().splitlines()[-1])
        assert "ok" in res, res
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)


def test_huge_lock_timeout_waits_for_the_holder(tmp_path: Path) -> None:
    """lock_timeout=1e10 passes validation (finite, >= 0). Under contention the wait must end
    with the lock (or a LedgerError). Was (fixed): the FIFO queue's wait, threading.Event.wait(1e10),
    raises a raw OverflowError (not a LedgerError), and the waiter's queue slot is leaked."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    _huge_timeout_case(tmp_path, path, path)


def test_huge_lock_timeout_never_leaks_the_ledger_lock(tmp_path: Path) -> None:
    """The same through a hard link in another directory (one ledger, so one lock; a separate
    queue, so the waiter goes straight to the inode flock). Was (fixed): the OverflowError escapes
    the lock wait after its helper thread started a blocking flock; when the holder is done the
    helper is granted the lock and, not told that its caller gave up, never releases it: the
    ledger stays locked for every other process as long as the waiter's process lives."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    (tmp_path / "other").mkdir()
    link = tmp_path / "other" / "ledger.duckdb"
    os.link(path, link)
    _huge_timeout_case(tmp_path, link, path)


# A parent that used the ledger, forked a long-lived child (a worker pool, a daemon), and is then
# SIGKILLed while inside a ledger operation.
FORK_THEN_KILLED = """
import os, sys, time
from dpsql.budget import Budget
from dpsql.ledger import Ledger, _store
led = Ledger(sys.argv[1], lock_timeout=30)
led.remaining()                      # the process has now used the ledger
pid = os.fork()
if pid == 0:                         # the child: some unrelated long-lived work
    time.sleep(float(sys.argv[2]))
    os._exit(0)
print(pid, flush=True)
def inside(p):
    print("inside", flush=True)
    time.sleep(60)                   # killed here, holding the ledger lock
_store._HOOKS["after_attach"] = inside
led.reserve(Budget(0.1), mechanism="m", query="parent", tables=["t"], params={})
"""


def test_lock_of_a_killed_process_is_not_kept_by_its_forked_child(tmp_path: Path) -> None:
    """A process killed while holding the ledger lock must not leave the ledger locked. Was (fixed): the
    descriptor carrying the flock was opened before the fork, the child "forgets" inherited
    descriptors without closing them, so the open file description (and its flock) survives in
    the child: every other dpsql process times out until that unrelated child exits."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    parent = _spawn(FORK_THEN_KILLED, str(path), "25")
    child_pid = None
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "inside"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        other = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(OTHER), str(path)],
            capture_output=True, text=True, timeout=40, env=_env(),
        )
        res = json.loads(other.stdout.strip().splitlines()[-1])
        assert "ok" in res, res
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child_pid is not None:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


RETRIER = """
import json, os, sys, threading
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger
led = Ledger(sys.argv[1], lock_timeout=0.001)
failed = 0
for _ in range(300):      # a service retrying "later", as the hint says, while the ledger is busy
    try:
        led.remaining()
    except LedgerError:
        failed += 1
print(json.dumps({"failed": failed, "threads": threading.active_count(),
                  "fds": len(os.listdir("/proc/self/fd"))}), flush=True)
"""


def test_timed_out_attempts_leave_nothing_behind(tmp_path: Path) -> None:
    """While another process holds the ledger (a stuck or stopped process), every attempt that
    times out leaves a helper thread blocked in flock and a descriptor behind (one for the queue
    slot it waited on, one for the inode). Was (fixed): 300 retries leave ~300 threads and ~300
    descriptors; a default 1024-descriptor process then fails every operation on any file with
    "Too many open files"."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    holder = _spawn(HOLDER, str(path), "40")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "inside"
        r = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(RETRIER), str(path)],
            capture_output=True, text=True, timeout=50, env=_env(),
        )
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["failed"] == 300  # the holder never let go: every attempt timed out, correctly
        assert got["threads"] < 20 and got["fds"] < 60, got
    finally:
        holder.kill()
        holder.wait(10)


TIMED_OUT = """
import json, sys
from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger
try:
    Ledger(sys.argv[1], lock_timeout=1.0).remaining()
    out = {"ok": True}
except LedgerError as e:
    out = {"msg": str(e)}
print(json.dumps(out), flush=True)
"""


def test_time_out_message_counts_the_whole_wait(tmp_path: Path) -> None:
    """The waiter spends its lock_timeout in the arrival-order queue (behind the holder's slot);
    the message once counted only the time after the queue ("gave up after 0 s"). It must report
    at least the 1 s it waited. Control: the ledger is locked the whole time, so it times out."""
    import re

    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    holder = _spawn(HOLDER, str(path), "20")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "inside"
        r = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(TIMED_OUT), str(path)],
            capture_output=True, text=True, timeout=40, env=_env(),
        )
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert "msg" in got, got
        m = re.search(r"gave up after ([0-9.e+-]+) s", got["msg"])
        assert m is not None, got
        assert float(m.group(1)) >= 0.95, got
    finally:
        holder.kill()
        holder.wait(10)


# The same, but the child is forked from inside the operation (the parent holds its queue slot
# and the inode lock at that moment), e.g. by another thread starting a worker process.
FORK_INSIDE_THEN_KILLED = """
import os, sys, time
from dpsql.budget import Budget
from dpsql.ledger import Ledger, _store
led = Ledger(sys.argv[1], lock_timeout=30)
def inside(p):
    pid = os.fork()
    if pid == 0:                     # the child: some unrelated long-lived work
        time.sleep(float(sys.argv[2]))
        os._exit(0)
    print(pid, flush=True)
    print("inside", flush=True)
    time.sleep(60)                   # killed here, holding the queue slot and the ledger lock
_store._HOOKS["after_attach"] = inside
led.reserve(Budget(0.1), mechanism="m", query="parent", tables=["t"], params={})
"""


def test_child_forked_inside_an_operation_keeps_neither_lock_nor_queue_slot(tmp_path: Path) -> None:
    """Was (fixed): the child inherited the descriptors of the inode lock and of the parent's
    queue slot; after the parent was killed, the next process waited on that slot for its whole
    lock_timeout (the slot's flock lived on in the child) and then timed out."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    parent = _spawn(FORK_INSIDE_THEN_KILLED, str(path), "25")
    child_pid = None
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "inside"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        other = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(OTHER), str(path)],
            capture_output=True, text=True, timeout=40, env=_env(),
        )
        res = json.loads(other.stdout.strip().splitlines()[-1])
        assert "ok" in res, res
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child_pid is not None:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
