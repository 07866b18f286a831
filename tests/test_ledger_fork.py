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
import json, os, sys
from dpsql.budget import Budget
from dpsql.ledger import Ledger, _store
path, point = sys.argv[1], sys.argv[2]
kid, done = [], []
def inside(p):
    if kid:
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _store._HOOKS.clear()
        os.close(w)
        os.read(r, 1)  # the parent's operation is over (it says so, then waits for us below)
        try:
            led = Ledger(path, lock_timeout=4)
            out = {"ok": led.reserve(Budget(0.1), mechanism="m", query="child", tables=["t"], params={})}
        except Exception as e:
            out = {"error": type(e).__name__, "msg": str(e)[:400]}
        os.write(1, (json.dumps(out) + "\\n").encode())
        os._exit(0)
    os.close(r)
    kid.append(pid)
    done.append(w)
_store._HOOKS[point] = inside
Ledger(path, lock_timeout=30).reserve(Budget(0.1), mechanism="m", query="parent", tables=["t"], params={})
os.write(done[0], b".")
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
        out = {"error": type(e).__name__, "msg": str(e)[:1000]}
    os.write(1, (json.dumps(out) + "\\n").encode())
    os._exit(0)
th.join()
os.waitpid(pid, 0)
"""


def test_session_used_in_a_forked_child_answers_or_refuses(tmp_path: Path) -> None:
    """A Session used in a child forked while another thread was running a query must answer or
    refuse with a clear error, never hang. Was (fixed): the engine's lock (an RLock held by a thread
    that does not exist in the child) is never released: the child blocks forever in the
    engine's bind step, with no time-out (statement_timeout and lock_timeout do not apply). Now every
    engine inherited through fork refuses, for free (``test_a_session_inherited_through_a_fork_pool_refuses_for_free``)."""
    path = tmp_path / "ledger.duckdb"
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SESSION_FORK), str(path)],
        capture_output=True, text=True, timeout=55, env=_env(),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    assert lines, "the child printed nothing (it hung): " + r.stderr[-1500:]
    got = json.loads(lines[-1])
    assert got.get("error") == "ExecutionError", got  # every engine inherited through fork refuses
    assert "create a new Session in the child" in got["msg"] and "nothing was charged" in got["msg"], got


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
        try:  # the ledger on its own (the query is refused by the engine first)
            out["remaining"] = str(s.remaining())
        except Exception as e:
            out["ledger_error"], out["ledger_msg"] = type(e).__name__, str(e)[:600]
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
    A forked child is now refused (nothing read): a query by the engine, which no forked child may use
    (``test_a_session_inherited_through_a_fork_pool_refuses_for_free``), and the ledger on its own with a
    LedgerError, so the total holds across the processes; the parent keeps its ledger."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(MEMORY_FORK)], capture_output=True, text=True,
                       timeout=120, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["parent_spent"] == 1.0
    for child in got["children"]:
        assert child.get("error") == "ExecutionError", child
        assert "create a new Session in the child" in child["msg"] and "nothing was charged" in child["msg"], child
        assert child.get("ledger_error") == "LedgerError", child
        assert "in-memory ledger" in child["ledger_msg"] and "ledger file" in child["ledger_msg"], child


POOL_FORK = """
import json, multiprocessing as mp, os, sys, faulthandler
import numpy as np, pyarrow as pa
import dpsql
faulthandler.dump_traceback_later(90, exit=True)  # a hang ends the parent, with a traceback
path = sys.argv[1]
n = 2_000_000  # large enough that DuckDB's worker threads take part in the parent's reads
t = pa.table({"user_id": np.arange(n) % 200_000, "x": np.arange(n) % 7})
s = dpsql.Session(ledger=path, budget=dpsql.Budget(10.0), create=True)
s.register("t", t, privacy_unit="user_id", max_groups_per_unit=5,
           columns={"x": {"domain": [0, 1, 2, 3, 4, 5, 6]}})
Q = "SELECT x, COUNT(*) FROM t GROUP BY x"
s.query(Q, epsilon=0.1)  # the parent's engine has run (its threads are busy with it)

def inherited(i):
    try:
        return {"ok": s.query(Q, epsilon=0.1).ledger_id}
    except Exception as e:
        return {"error": type(e).__name__, "msg": str(e)}

own = None
def start():  # the hint's way: a Session of the worker's own, on the same ledger file
    global own
    own = dpsql.Session(ledger=path)
    own.register("t", t, privacy_unit="user_id", max_groups_per_unit=5, columns={"x": {"domain": [0, 1, 2, 3, 4, 5, 6]}})

def fresh(i):
    return own.query(Q, epsilon=0.1).to_arrow().num_rows

with mp.get_context("fork").Pool(2) as p:
    refused = p.map(inherited, range(4))
with mp.get_context("fork").Pool(2, initializer=start) as p:
    answered = p.map(fresh, range(2))
after = s.query(Q, epsilon=0.1).to_arrow().num_rows  # the parent's Session is unharmed
print(json.dumps({"refused": refused, "answered": answered, "after": after,
                  "entries": s.history().num_rows, "spent": s.ledger.spent().epsilon}))
"""


def test_a_session_inherited_through_a_fork_pool_refuses_for_free(tmp_path: Path) -> None:
    """Finding (fixed): a Session opened in the parent and used in a worker of a 'fork' pool (a module-level
    Session, multiprocessing's default start method on Linux) was charged, then its read waited for ever inside
    DuckDB's executor: DuckDB's state does not survive fork (its worker threads exist only in the parent). Every
    engine inherited through fork now refuses use, before anything is charged, naming the fix; a Session opened
    in the worker answers, on the same ledger file; the parent's Session keeps answering."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(POOL_FORK), str(tmp_path / "ledger.duckdb")],
                       capture_output=True, text=True, timeout=170, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for child in got["refused"]:
        assert child.get("error") == "ExecutionError", child
        assert "used in a process forked from it" in child["msg"] and "nothing was charged" in child["msg"], child
        assert "hint: create a new Session in the child process" in child["msg"], child
    assert got["answered"] == [7, 7] and got["after"] == 7
    assert got["entries"] == 4  # the parent's two queries and the workers' own two: none for a refusal
    assert got["spent"] == pytest.approx(0.4)
