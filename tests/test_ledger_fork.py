"""Regression: fork while another thread of the process is inside a ledger operation (a web server
that forks workers, multiprocessing's fork start method). The child must be able to use the
ledger once the parent's operation is over.

The "other thread inside an operation" is pinned deterministically with the store's test hook:
the parent forks from inside its own operation (after DuckDB attached the file), which is what a
fork from any thread sees while another thread is at that point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpsql.budget import Budget
from dpsql.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]

FORK_INSIDE = """
import json, os, sys, time
from dpsql.budget import Budget
from dpsql.ledger import Ledger, _store
path, point = sys.argv[1], sys.argv[2]
kid = []
def inside(p):
    if kid:
        return
    pid = os.fork()
    if pid == 0:
        _store._HOOKS.clear()
        time.sleep(1.0)  # by now the parent's operation is over (it waits for us below)
        try:
            led = Ledger(path, lock_timeout=4)
            out = {"ok": led.reserve(Budget(0.1), mechanism="m", query="child", tables=["t"], params={})}
        except Exception as e:
            out = {"error": type(e).__name__, "msg": str(e)[:400]}
        os.write(1, (json.dumps(out) + "\\n").encode())
        os._exit(0)
    kid.append(pid)
_store._HOOKS[point] = inside
Ledger(path, lock_timeout=30).reserve(Budget(0.1), mechanism="m", query="parent", tables=["t"], params={})
os.waitpid(kid[0], 0)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.parametrize("point", ["before_attach", "after_attach", "before_checkpoint"])
def test_child_forked_during_an_operation_can_use_the_ledger_or_is_told_why_not(tmp_path: Path, point: str) -> None:
    """Was (after_attach, before_checkpoint): the child keeps the parent's DuckDB instance (on
    purpose: destroying it crashes), which still has the ledger attached, so every ATTACH in the
    child fails with "Unique file handle conflict" (DuckDB registers attached files process-wide,
    across instances): the child can never use the ledger, and was told after lock_timeout that
    the ledger "is held open by another DuckDB connection in this process" with the hint "close
    that connection", which it cannot. Now it is refused at once, saying why and what to do, and
    nothing is charged. ``before_attach`` (fork with the flock held, nothing attached yet) is the
    control: the child charges normally."""
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORK_INSIDE), str(path), point],
        capture_output=True, text=True, timeout=50, env=_env(),
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if point == "before_attach":
        assert "ok" in got, got
        assert Ledger(path).remaining() == Budget(0.8)
    else:
        assert got.get("error") == "LedgerError", got
        assert "forked while another thread of its parent process had the ledger open" in got["msg"], got
        assert "hint: use the ledger in a process forked before" in got["msg"], got
        assert "gave up after" not in got["msg"], got  # refused at once, not after lock_timeout
        assert Ledger(path).remaining() == Budget(0.9)  # the parent's charge only


SESSION_FORK = """
import faulthandler, json, os, sys, threading, time
import numpy as np, pyarrow as pa
import dpsql
from dpsql.budget import Budget
from dpsql.ledger import Ledger
path = sys.argv[1]
Ledger.create(path, Budget(100.0))
n = 4_000_000
t = pa.table({"user_id": np.arange(n) % 1_000_000, "amount": np.random.default_rng(1).uniform(0, 100, n)})
s = dpsql.Session(ledger=path)
s.register("t", t, privacy_unit="user_id")
s.query("SELECT COUNT(*) FROM t", epsilon=0.1)  # the Session has been used
th = threading.Thread(target=lambda: s.query("SELECT COUNT(*) FROM t", epsilon=0.1))
th.start()
lock = s._engine._lock  # only to pick the moment: fork while the other thread is running its query
while lock.acquire(blocking=False):
    lock.release()
    time.sleep(0.001)
pid = os.fork()
if pid == 0:
    faulthandler.dump_traceback_later(20, exit=True)  # a hang ends the child, with a traceback
    try:
        out = {"ok": s.query("SELECT COUNT(*) FROM t", epsilon=0.1).ledger_id}
    except Exception as e:
        out = {"error": type(e).__name__, "msg": str(e)[:300]}
    os.write(1, (json.dumps(out) + "\\n").encode())
    os._exit(0)
th.join()
os.waitpid(pid, 0)
"""


def test_session_used_in_a_forked_child_answers_or_refuses(tmp_path: Path) -> None:
    """A Session used in a child forked while another thread was running a query must answer or
    refuse with a clear error, never hang. Was (fixed): the engine's lock (an RLock held by a thread
    that does not exist in the child) is never released: the child blocks forever in the
    engine's bind step, with no time-out (statement_timeout and lock_timeout do not apply)."""
    path = tmp_path / "ledger.duckdb"
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SESSION_FORK), str(path)],
        capture_output=True, text=True, timeout=55, env=_env(),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    assert lines, "the child printed nothing (it hung): " + r.stderr[-1500:]
    got = json.loads(lines[-1])
    assert "ok" in got or got.get("error") in ("ConfigError", "LedgerError", "ExecutionError"), got
    if "error" in got:
        assert "create a new Session in the child" in got["msg"], got


MEMORY_FORK = """
import json, os, sys
import pyarrow as pa
import dpsql
from dpsql.budget import Budget
s = dpsql.Session(None, Budget(1.0))
s.register("e", pa.table({"uid": list(range(50))}), privacy_unit="uid")
kids = []
for i in range(3):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            s.query("SELECT COUNT(*) AS n FROM e", epsilon=1.0)
            out = {"ok": True}
        except Exception as e:
            out = {"error": type(e).__name__, "msg": str(e)[:600]}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    kids.append((pid, r))
outs = []
for pid, r in kids:
    os.waitpid(pid, 0)
    outs.append(json.loads(os.read(r, 65536).decode()))
s.query("SELECT COUNT(*) AS n FROM e", epsilon=1.0)  # the parent's budget is whole
print(json.dumps({"children": outs, "parent_spent": s.ledger.spent().epsilon}))
"""


def test_an_in_memory_ledger_is_not_spent_again_in_forked_children(tmp_path: Path) -> None:
    """Finding (fixed): a Session on an in-memory ledger that forked (multiprocessing's fork start
    method, a pre-forking server) handed each child a copy of the whole remaining budget: three
    children each spent epsilon 1.0 of a total of 1.0, and the parent's ledger knew of none of it.
    A forked child is now refused (a LedgerError, nothing read), so the total holds across the
    processes; the parent keeps its ledger."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(MEMORY_FORK)], capture_output=True, text=True,
                       timeout=120, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["parent_spent"] == 1.0
    for child in got["children"]:
        assert child.get("error") == "LedgerError", child
        assert "in-memory ledger" in child["msg"] and "ledger file" in child["msg"], child
