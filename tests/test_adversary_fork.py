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


REUSE = """
import json, os, sys, warnings
import pyarrow as pa
import dpsql
warnings.simplefilter("ignore")
path = sys.argv[1]
n = 20_000
t = pa.table({"uid": list(range(n)), "age": [i % 100 for i in range(n)]})
s = dpsql.Session(ledger=path, budget=dpsql.Budget(10.0), create=True)
s.register("t", t, privacy_unit="uid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 100), "bins": 100}},
           version="v1")
HIST = "SELECT age, COUNT(*) FROM t GROUP BY age"
WL = ["SELECT COUNT(*) FROM t WHERE age BETWEEN 20 AND 29", "SELECT COUNT(*) FROM t WHERE age BETWEEN 30 AND 39"]
s.query(HIST, epsilon=0.5)
s.query_many(WL, epsilon=0.5)
CALLS = {
    "histogram": lambda: s.query(HIST, epsilon=0.5),
    "coarser bins": lambda: s.query("SELECT floor(age / 10) * 10 AS decade, COUNT(*) FROM t GROUP BY decade", epsilon=0.5),
    "workload": lambda: s.query_many(WL, epsilon=0.5),
    "explain workload": lambda: s.explain(WL, epsilon=0.5),
}
parent = {name: ("reused" if getattr(call(), "reused", True) else "charged") for name, call in CALLS.items()}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    child = {}
    before = s.history().num_rows
    for name, call in CALLS.items():
        try:
            call()
            child[name] = "answered"
        except Exception as e:
            child[name] = f"{type(e).__name__}: {e}"
    child["entries added"] = s.history().num_rows - before
    os.write(w, json.dumps(child).encode())
    os._exit(0)
os.close(w)
with os.fdopen(r) as f:
    child = json.loads(f.read())
os.waitpid(pid, 0)
print(json.dumps({"parent": parent, "child": child}))
"""


def test_a_synopsis_reuse_in_a_forked_child_is_refused_like_every_query(tmp_path: Path) -> None:
    """Finding (fixed): on the engine's own connection, a child refused every query but a reuse of a stored DAWA
    synopsis: a histogram and a workload answered from it (with a ledger entry each), an ``explain`` of the workload
    answered, and a coarser histogram, whose post-processing check runs in DuckDB, was refused as a QueryTypeError
    ("cannot be evaluated on the declared key values"), a wrong reason. The engine's check before every request
    (``check_connection``) now refuses a forked child first, whatever the request reads."""
    got = _run(REUSE, str(tmp_path / "ledger.duckdb"))
    assert got["parent"] == {"histogram": "reused", "coarser bins": "reused", "workload": "reused",
                             "explain workload": "reused"}  # the control: in the parent each is a free reuse
    child = got["child"]
    assert isinstance(child, dict)
    assert child.pop("entries added") == 0
    for name, outcome in child.items():
        assert outcome.startswith("ExecutionError: this Session was opened in process "), (name, outcome)
        assert "nothing was charged" in outcome and "create a new Session in the child" in outcome, (name, outcome)


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


RAW_FORK = """
import ctypes, json, os, sys
import duckdb
import pyarrow as pa
import dpsql
path, connection = sys.argv[1], sys.argv[2] == "caller"
t = pa.table({"uid": list(range(50_000)), "x": [i % 7 for i in range(50_000)]})
caller = duckdb.connect() if connection else None
s = dpsql.Session(ledger=path, budget=dpsql.Budget(10.0), create=True, connection=caller)
s.register("t", t, privacy_unit="uid", columns={"x": {"domain": list(range(7))}})
Q = "SELECT x, COUNT(*) FROM t GROUP BY x"
s.query(Q, epsilon=0.1)
r, w = os.pipe()
pid = ctypes.PyDLL(None).fork() if sys.argv[3] == "libc" else os.fork()  # libc: a C library's fork, no at-fork hook
if pid == 0:
    out = {}
    for name, call in [("query", lambda: s.query(Q, epsilon=0.1)), ("explain", lambda: s.explain(Q, epsilon=0.1)),
                       ("register", lambda: s.register("t2", t, privacy_unit="uid"))]:
        try:
            call()
            out[name] = "answered"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"
    out["entries"] = s.history().num_rows
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
with os.fdopen(r) as f:
    got = json.loads(f.read())
os.waitpid(pid, 0)
print(json.dumps(got))
"""


@pytest.mark.parametrize(("connection", "fork"), [("own", "libc"), ("caller", "libc"), ("caller", "os")])
def test_a_child_is_refused_whatever_forked_it_and_told_to_open_its_own_connection(
        tmp_path: Path, connection: str, fork: str) -> None:
    """Finding (fixed): a fork that runs no at-fork hook (a C library's ``fork()``) left the inherited engine as it
    was: the child's query was answered and charged on the parent's DuckDB state (or waited for ever where a thread of
    the parent held the engine's lock). The engine now also compares its process id before every request and every
    registration. And on a caller's connection the hint says to open a DuckDB connection in the child as well (a new
    Session on the parent's connection would share the parent's DuckDB state)."""
    got = _run(RAW_FORK, str(tmp_path / "ledger.duckdb"), connection, fork)
    assert got.pop("entries") == 1  # the parent's query only
    for name, outcome in got.items():
        assert isinstance(outcome, str) and outcome.startswith("ExecutionError: this Session was opened in process "), \
            (name, outcome)
        assert "nothing was charged" in outcome and "create a new Session in the child process" in outcome
        assert ("on a DuckDB connection opened there" in outcome) == (connection == "caller"), (name, outcome)
