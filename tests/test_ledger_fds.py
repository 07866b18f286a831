"""Regression: a long-running process (a service with one ledger per tenant or per project, a test
runner) uses many ledgers one after the other. Ledger's docstring says the object "holds no file
handle" and close() "forgets the ledger"; the flock descriptor pool once kept one descriptor per
ledger inode open forever (never closed, so as not to drop DuckDB's fcntl locks), so the process
ran out of descriptors, and deleted ledgers kept their disk space. Now an inode's descriptors are
closed once no operation of the process uses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dpsql.budget import Budget
from dpsql.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]

MANY = """
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
from dpsql.budget import Budget
from dpsql.ledger import Ledger
d = sys.argv[1]
done = 0
err = None
held = None
for i in range(int(sys.argv[2])):
    p = os.path.join(d, f"tenant{i}.duckdb")
    try:
        with Ledger.create(p, Budget(1.0)) as led:
            led.commit(led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={}))
        done += 1
    except Exception as e:
        err = f"{type(e).__name__}: {str(e)[:300]}"
        break
    fds = sorted(os.listdir("/proc/self/fd"))
    if i == 0:
        first = fds
    elif fds != first:  # a descriptor kept after a ledger is closed: it accumulates with every ledger
        held = {"after": i + 1, "fds": len(fds), "after_first": len(first)}
        break
print(json.dumps({"done": done, "error": err, "held": held}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_many_ledgers_in_one_process_do_not_exhaust_descriptors(tmp_path: Path) -> None:
    """Was (fixed): with 128 descriptors allowed, ledger ~120 fails with "Too many open files" (one
    descriptor kept per ledger). Here 32 are allowed (a ledger operation uses 9 at most, 5 of them
    the interpreter's own), so one kept descriptor per ledger fails at ledger ~23 and one per two
    ledgers at ~46, before the 60th; and the set of open descriptors after every ledger must equal
    the set after the first, which catches any descriptor kept per ledger at once. (The time-out
    only catches a hang.)"""
    n = 60
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MANY), str(tmp_path), str(n)],
        capture_output=True, text=True, timeout=300, env=_env(),
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"done": n, "error": None, "held": None}, got


def test_closed_ledger_holds_no_descriptor(tmp_path: Path) -> None:
    """A closed ledger whose file is then deleted must not be kept open by the process."""
    path = tmp_path / "gone.duckdb"
    with Ledger.create(path, Budget(1.0)) as led:
        led.remaining()
    ino = os.stat(path).st_ino
    os.unlink(path)
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if st.st_ino == ino and st.st_nlink == 0:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert not held, f"deleted ledger still open through descriptors {held}"
