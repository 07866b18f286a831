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
s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5), engine={"memory_limit": "16MB", "threads": 1, "max_text_bytes": 1000})
n = 600_000  # (spills under 16 MB: a GROUP BY of 100 000 keys)
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


def _run(code: str, root: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(root), *args], capture_output=True, text=True,
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


CLEANED = """
import fcntl, json, os, shutil, stat, sys, tempfile
import numpy as np, pyarrow as pa
import dpsql
tempfile.tempdir = sys.argv[1]
how = sys.argv[2]
s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5), engine={"memory_limit": "16MB", "threads": 1, "max_text_bytes": 1000})
n = 600_000  # (spills under 16 MB: a GROUP BY of 100 000 keys)
s.register("t", pa.table({"uid": np.arange(n), "k": np.arange(n) % 100_000}), privacy_unit="uid")
d = s._engine._spill
proc = os.path.dirname(d)
out = {}
def query():
    try:
        s.query("SELECT k, COUNT(*) FROM t GROUP BY k", epsilon=1.0, delta=1e-6)
        return "answered"
    except dpsql.errors.DPSQLError as e:
        return type(e).__name__
if how != "before":
    out["first"] = query()
    out["spilled"] = os.path.isdir(d) and bool(os.listdir(d))
if how == "files":  # a cleaner running as root: the old files and then their empty directory, not the locked one
    shutil.rmtree(d)
else:  # a cleaner that does not honour the lock: the whole process directory
    shutil.rmtree(proc)
planted = os.path.join(sys.argv[1], "elsewhere")
if how == "plant":  # the name taken meanwhile by a directory anyone may write (as another user would make it)
    os.mkdir(proc)
    os.chmod(proc, 0o777)
elif how == "symlink":
    os.mkdir(planted)
    os.chmod(planted, 0o777)
    os.symlink(planted, proc)
spent = s.remaining()
out["after"] = query()
out["charged"] = s.remaining() != spent
out["mode"] = oct(stat.S_IMODE(os.stat(proc, follow_symlinks=False).st_mode))
try:
    fd = os.open(proc, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out["locked"] = False
    except OSError:
        out["locked"] = True
    os.close(fd)
except OSError:
    out["locked"] = None
out["in_planted"] = sorted(os.listdir(proc if how == "plant" else planted)) if how in ("plant", "symlink") else []
t = dpsql.Session(budget=dpsql.Budget(1.0))
out["new_parent"] = os.path.dirname(t._engine._spill) != proc
out["new_mode"] = oct(stat.S_IMODE(os.stat(os.path.dirname(t._engine._spill)).st_mode))
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("how", ["before", "after", "files"])
def test_a_process_directory_removed_by_a_cleaner_is_made_again_before_the_charge(tmp_path: Path, how: str) -> None:
    """A temporary-file cleaner that does not honour locks (tmpwatch, tmpreaper: by age, as root) removed the process's
    spill directory (or only the files and the engine's directory inside it) while the process lived: DuckDB makes
    no directory above its own, nor its own again once it made it, so every later query of that engine that spilled
    failed after its charge (the charge stands). Before each charge the directory is found removed and made again
    under its name (mode 0700, locked), with the engine's own where DuckDB had made it; the query is answered."""
    r = _run(CLEANED, tmp_path, how)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out.get("first", "answered") == "answered" and out.get("spilled", True), out  # (it did spill)
    assert out["after"] == "answered" and out["charged"], out
    assert out["mode"] == "0o700" and out["locked"] is True, out
    assert _spill_dirs(tmp_path) == []  # removed at the exit all the same


@pytest.mark.parametrize("how", ["plant", "symlink"])
def test_a_process_directory_name_taken_after_a_cleaner_is_refused_for_free(tmp_path: Path, how: str) -> None:
    """Once a cleaner removed the process's spill directory its name is free (and shown in the temporary directory's
    listing): a directory made there by another user (mode 0777), or a symlink to one, received DuckDB's spill files
    (0644 under the usual umask: private rows readable by that user), as did every new Session of the process (its
    check was ``os.path.isdir``, which follows a symlink). The query is refused before the charge, nothing is written
    there, and a new Session makes a directory of its own. Negative control: the same queries are answered where the
    name was left free (test above)."""
    r = _run(CLEANED, tmp_path, how)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["first"] == "answered" and out["spilled"], out
    assert out["after"] == "ConfigError" and not out["charged"], out
    assert out["in_planted"] == [], out
    assert out["new_parent"] and out["new_mode"] == "0o700", out


OWNER = """
import json, os, stat, sys
import numpy as np, pyarrow as pa
import dpsql
spill = os.path.join(sys.argv[1], "owner", "spill")
s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5), engine={"temp_directory": spill, "memory_limit": "16MB", "threads": 1,
                                                         "max_text_bytes": 1000})
n = 600_000  # (spills under 16 MB: a GROUP BY of 100 000 keys)
s.register("t", pa.table({"uid": np.arange(n), "k": np.arange(n) % 100_000}), privacy_unit="uid")
spent = s.remaining()
try:
    s.query("SELECT k, COUNT(*) FROM t GROUP BY k", epsilon=1.0, delta=1e-6)
    out = {"answered": True}
except dpsql.errors.DPSQLError as e:
    out = {"answered": False, "error": type(e).__name__}
out["charged"] = s.remaining() != spent
out["mode"] = oct(stat.S_IMODE(os.stat(spill).st_mode)) if os.path.isdir(spill) else None
print(json.dumps(out), flush=True)
"""


def test_an_owners_temp_directory_is_made_private_with_the_directories_above_it(tmp_path: Path) -> None:
    """An owner's ``temp_directory`` that does not exist yet was left for DuckDB to make at the first spill: DuckDB
    makes no directory above it (``/var/tmp/dpsql/spill`` with no ``/var/tmp/dpsql``: every query that spilled failed
    after its charge, though the start-up check accepted it as one that can be made), and made it with the umask
    (0755, its files 0644: private rows readable by every user). The engine makes it at its start, mode 0700."""
    r = _run(OWNER, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out == {"answered": True, "charged": True, "mode": "0o700"}, out
