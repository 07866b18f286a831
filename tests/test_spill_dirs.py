"""DuckDB's spill files hold private rows: where the owner sets no ``temp_directory`` each engine spills into a
directory of its own inside its process's directory for them (``dpsql.engine._duckdb_csv.spill_dir``), made mode 0700
(DuckDB made its directory with the process's umask: 0755, its files 0644, readable by every user of the machine),
locked while the process lives, removed at its exit, and after the process was killed (SIGKILL, mid-spill) by the
next engine that makes such a directory, in any process (before, DuckDB's files stayed there for good).
Subprocesses with time limits; no timed asserts."""

from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock and SIGKILL")

SPILL_THEN_KILL = """
import os, signal, sys, tempfile, threading, time
import numpy as np, pyarrow as pa
import dpsql
tempfile.tempdir = sys.argv[1]
s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5), engine={"memory_limit": "60MB", "threads": 1, "max_text_bytes": 4000})
n = 3_000_000
s.register("t", pa.table({"uid": np.arange(n), "k": np.arange(n) % 100_000}), privacy_unit="uid")
d = s._engine._spill
print(d, flush=True)
def kill_once_spilled():
    while True:
        if os.path.isdir(d) and os.listdir(d):
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.002)
threading.Thread(target=kill_once_spilled, daemon=True).start()
s.query("SELECT k, COUNT(*) FROM t GROUP BY k", epsilon=1.0, delta=1e-6)
print("no spill", flush=True)
"""

OPEN = """
import json, sys, tempfile, dpsql
tempfile.tempdir = sys.argv[1]
s = dpsql.Session(budget=dpsql.Budget(1.0))
t = dpsql.Session(budget=dpsql.Budget(1.0))
print(json.dumps([s._engine._spill, t._engine._spill]))
"""


def _spill_dirs(root: Path) -> list[str]:
    return sorted(glob.glob(str(root / "dpsql-spill-*")))


def _run(code: str, root: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(root)], capture_output=True, text=True,
                          timeout=180, **kw)  # type: ignore[call-overload]


def test_a_killed_process_spill_files_are_removed_by_the_next_engine(tmp_path: Path) -> None:
    r = _run(SPILL_THEN_KILL, tmp_path)
    assert r.returncode == -9, (r.returncode, r.stdout, r.stderr[-2000:])  # killed mid-spill
    left = _spill_dirs(tmp_path)
    spilled = r.stdout.split()[0]
    assert len(left) == 1 and os.path.dirname(spilled) == left[0] and os.listdir(spilled), (left, r.stdout)
    assert stat.S_IMODE(os.stat(left[0]).st_mode) == 0o700  # nobody else could read the files meanwhile
    mine = json.loads(_run(OPEN, tmp_path, check=True).stdout)
    assert not os.path.exists(left[0])  # swept by the next process's first engine
    assert _spill_dirs(tmp_path) == []  # and that process's own directory removed at its exit
    assert all(os.path.dirname(os.path.dirname(m)) == str(tmp_path) for m in mine)


def test_one_directory_per_process_private_locked_and_removed_at_exit(tmp_path: Path) -> None:
    """Two engines of one process spill into two directories of one process directory (mode 0700); a live process's
    directory is never swept by another's; it is gone when its process ends. Negative control: the same name, left
    unlocked (as a killed process leaves it), is swept."""
    code = OPEN + "import time, sys; print(flush=True); sys.stdin.readline()\n"
    live = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout is not None and live.stdin is not None
        a, b = json.loads(live.stdout.readline())
        parent = os.path.dirname(a)
        assert os.path.dirname(b) == parent and a != b and stat.S_IMODE(os.stat(parent).st_mode) == 0o700
        other = json.loads(_run(OPEN, tmp_path, check=True).stdout)
        assert os.path.isdir(parent) and os.path.dirname(other[0]) != parent  # the live process's is kept
        live.stdin.write("\n")
        live.stdin.flush()
        assert live.wait(timeout=60) == 0
    finally:
        live.kill()
    assert not os.path.exists(parent)
    os.mkdir(parent, 0o700)  # as a killed process leaves it (no lock held)
    _run(OPEN, tmp_path, check=True)
    assert not os.path.exists(parent) and _spill_dirs(tmp_path) == []


def test_the_owners_temp_directory_is_used_as_it_is(tmp_path: Path) -> None:
    """With ``temp_directory`` set, DuckDB spills there (the owner's place): no directory of the engine's is made."""
    import dpsql

    spill = tmp_path / "owner"
    s = dpsql.Session(budget=dpsql.Budget(1.0), engine={"temp_directory": str(spill)})
    assert s._engine._spill == str(spill)
    s.close()
    assert _spill_dirs(tmp_path) == []
