"""DuckDB's spill files hold private rows: where the owner sets no ``temp_directory`` they go to a directory of the
engine's own, made mode 0700 (DuckDB made it with the process's umask: 0755, its files 0644, readable by every user
of the machine), locked while the engine uses it (``dpsql.engine._duckdb_csv.make_dir``), removed when the engine
closes, and after the process was killed (SIGKILL, mid-spill) by the next engine that makes such a directory, in any
process (before, DuckDB's files stayed there for good). Subprocesses with time limits; no timed asserts."""

from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import dpsql

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
        if os.listdir(d):
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.002)
threading.Thread(target=kill_once_spilled, daemon=True).start()
s.query("SELECT k, COUNT(*) FROM t GROUP BY k", epsilon=1.0, delta=1e-6)
print("no spill", flush=True)
"""


def _spill_dirs(root: Path) -> list[str]:
    return sorted(glob.glob(str(root / "dpsql-spill-*")))


def test_a_killed_process_spill_files_are_removed_by_the_next_engine(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SPILL_THEN_KILL), str(tmp_path)], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == -9, (r.returncode, r.stdout, r.stderr[-2000:])  # killed mid-spill
    left = _spill_dirs(tmp_path)
    assert len(left) == 1 and r.stdout.split()[0] == left[0] and os.listdir(left[0]), (left, r.stdout)
    assert stat.S_IMODE(os.stat(left[0]).st_mode) == 0o700  # nobody else could read the files meanwhile
    code = f"import tempfile, dpsql; tempfile.tempdir = {str(tmp_path)!r}; s = dpsql.Session(budget=dpsql.Budget(1.0)); print(s._engine._spill)"
    mine = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert not os.path.exists(left[0])  # swept by the next engine
    assert _spill_dirs(tmp_path) == []  # and that engine's own removed at its exit
    assert mine.stdout.strip().startswith(str(tmp_path / "dpsql-spill-"))


def test_a_live_engines_spill_directory_is_private_locked_and_removed_at_close(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The directory exists from the engine's start, mode 0700; another process's engine (which sweeps) leaves it;
    closing the engine removes it. Negative control: once closed, the same kind of name with no lock is swept."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    s = dpsql.Session(budget=dpsql.Budget(1.0))
    d = s._engine._spill
    assert os.path.isdir(d) and stat.S_IMODE(os.stat(d).st_mode) == 0o700
    code = (f"import json, tempfile, dpsql; tempfile.tempdir = {str(tmp_path)!r}; s = dpsql.Session(budget=dpsql.Budget(1.0)); "
            "print(json.dumps(s._engine._spill))")
    other = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                      check=True).stdout)
    assert os.path.isdir(d) and other != d  # a live engine's directory is never swept
    s.close()
    assert not os.path.exists(d)
    os.mkdir(d, 0o700)  # as a killed process leaves it (no lock held)
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert not os.path.exists(d)


def test_the_owners_temp_directory_is_used_as_it_is(tmp_path: Path) -> None:
    """With ``temp_directory`` set, DuckDB spills there (the owner's place): no directory of the engine's is made."""
    spill = tmp_path / "owner"
    s = dpsql.Session(budget=dpsql.Budget(1.0), engine={"temp_directory": str(spill)})
    assert s._engine._spill == str(spill) and s._engine._spill_gone is None
    s.close()
