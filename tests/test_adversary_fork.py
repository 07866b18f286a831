"""A Session (and a ledger) inherited through fork, in the child: what ends it there, and what it answers.

Each scenario runs in a subprocess with a time-out: a child that hangs or crashes must show up as a failure,
never as a hung test run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(script: str, *args: str, timeout: float = 150) -> dict[str, object]:
    """The script's last line of output (JSON); a hang fails the test and ends the script's processes (its own
    process group: the children it forked too)."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"hung (no answer in {timeout:g} s)")
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


ENDINGS = """
import gc, json, os, sys
import pyarrow as pa
import dpsql
path, ending = sys.argv[1], sys.argv[2]
t = pa.table({"uid": list(range(50_000)), "x": [i % 7 for i in range(50_000)]})
s = dpsql.Session(ledger=path, budget=dpsql.Budget(10.0), create=True)
s.register("t", t, privacy_unit="uid", columns={"x": {"domain": list(range(7))}})
Q = "SELECT x, COUNT(*) FROM t GROUP BY x"
s.query(Q, epsilon=0.1)

def refused(session):
    try:
        session.query(Q, epsilon=0.1)
        return "answered"
    except dpsql.errors.ExecutionError as e:
        return "refused" if "create a new Session in the child" in str(e) else str(e)

pid = os.fork()
if pid == 0:  # the child: its inherited Session refuses, then the child ends as the scenario says
    out = refused(s)
    if ending == "grandchild":  # a fork of the fork: refused there too, and it ends normally
        g = os.fork()
        if g == 0:
            code = 0 if refused(s) == "refused" else 3
            sys.exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(g, 0)[1])
        out = out if code == 0 else f"grandchild {code}"
    if ending == "own":  # a Session of its own, on the same ledger file, answers; then it ends normally
        mine = dpsql.Session(ledger=path)
        mine.register("t", t, privacy_unit="uid", columns={"x": {"domain": list(range(7))}})
        out = out if mine.query(Q, epsilon=0.1).to_arrow().num_rows == 7 else "own failed"
    if ending == "collected":  # closed and dropped: nothing of the parent's DuckDB is destroyed here
        s.close()
        del s
        gc.collect()
        os._exit(0 if out == "refused" else 2)
    sys.exit(0 if out == "refused" else 2)  # interpreter exit: module globals (the Session) are torn down
status = os.waitpid(pid, 0)[1]
print(json.dumps({"child": os.waitstatus_to_exitcode(status), "after": s.query(Q, epsilon=0.1).to_arrow().num_rows,
                  "entries": s.history().num_rows}))
"""


@pytest.mark.parametrize("ending", ["exit", "collected", "grandchild", "own"])
def test_a_child_ending_or_dropping_an_inherited_session_exits_cleanly(tmp_path: Path, ending: str) -> None:
    """Finding (fixed): a child forked from a process with a Session crashed when the Session's DuckDB connection was
    destroyed there: ``sys.exit`` (or the end of the script) in the child died of SIGSEGV at interpreter exit, and
    ``close()`` followed by dropping the Session too. DuckDB's instance does not survive fork (destroying it joins
    worker threads that exist only in the parent). The engines inherited through fork are now kept alive in the
    child (never destroyed there); the parent's Session keeps answering."""
    got = _run(ENDINGS, str(tmp_path / "ledger.duckdb"), ending)
    assert got["child"] == 0, got  # was -11 (SIGSEGV)
    assert got["after"] == 7
    assert got["entries"] == (3 if ending == "own" else 2)  # the parent's two queries (and the child's own one)


POOL_INITIALIZER = """
import json, multiprocessing as mp, sys
import pyarrow as pa
import dpsql
path = sys.argv[1]
t = pa.table({"uid": list(range(100_000)), "x": [i % 7 for i in range(100_000)]})
COLS = {"x": {"domain": list(range(7))}}
s = dpsql.Session(ledger=path, budget=dpsql.Budget(10.0), create=True)
s.register("t", t, privacy_unit="uid", columns=COLS)
Q = "SELECT x, COUNT(*) FROM t GROUP BY x"
s.query(Q, epsilon=0.1)

def start():  # the error's hint, written the usual way: the module's Session replaced by the worker's own
    global s
    s = dpsql.Session(ledger=path)
    s.register("t", t, privacy_unit="uid", columns=COLS)

def work(i):
    return s.query(Q, epsilon=0.1).to_arrow().num_rows

if __name__ == "__main__":
    with mp.get_context("fork").Pool(2, initializer=start) as p:
        answered = p.map(work, range(2))
    print(json.dumps({"answered": answered, "entries": s.history().num_rows}))
"""


def test_a_fork_pool_whose_initializer_replaces_the_modules_session_answers(tmp_path: Path) -> None:
    """Finding (fixed): the fix the refusal names (open the Session in the pool's initializer), written as a module's
    Session replaced by the worker's own (``global s; s = dpsql.Session(...)``), hung for ever: replacing it destroyed
    the inherited DuckDB connection in the worker, which waited in ``std::thread::join`` (DuckDB's task scheduler)
    for threads of the parent, and the pool waited for its workers."""
    got = _run(POOL_INITIALIZER, str(tmp_path / "ledger.duckdb"), timeout=120)
    assert got == {"answered": [7, 7], "entries": 3}


LEDGER_ONLY = """
import json, os, sys
import dpsql
from dpsql.ledger import open_ledger
ledger = open_ledger(sys.argv[1], dpsql.Budget(1.0), create=True)
ledger.remaining()  # the parent's ledger machinery (its DuckDB instance) is in use
pid = os.fork()
if pid == 0:
    ledger.remaining()
    sys.exit(0)
print(json.dumps({"child": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), "left": str(ledger.remaining())}))
"""


def test_a_child_using_an_inherited_ledger_exits_cleanly(tmp_path: Path) -> None:
    """Finding (fixed): the ledger's at-fork hook kept the parent's DuckDB instance in a module's list so as not to
    destroy it in the child, but a module's globals are torn down at interpreter exit: a child that used the ledger and
    ended with ``sys.exit`` was aborted ("terminate called without an active exception", SIGABRT)."""
    got = _run(LEDGER_ONLY, str(tmp_path / "ledger.duckdb"))
    assert got == {"child": 0, "left": "(epsilon=1, delta=0)"}
