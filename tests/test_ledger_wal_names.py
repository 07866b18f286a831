"""Regressions: a charge that lives only in the write-ahead log after a failed CHECKPOINT (a full
disk, simulated by RLIMIT_FSIZE as in test_ledger_faults), when the ledger has two names.

The reserve's message says the charge "stands" and that "the next dpsql operation writes it into
the file" provided the named WAL is kept. Both tests check that promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, LedgerError
from dpsql.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]

FULL_DISK = """
import json, os, resource, signal, sys
from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = sys.argv[1]
size = os.path.getsize(os.path.realpath(path))
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
led = Ledger(path, lock_timeout=5)
try:
    led.reserve(Budget(0.25), mechanism="m", query="big " + "x" * 300000, tables=["t"], params={})
    print(json.dumps({"returned": True}))
except LedgerError as e:
    print(json.dumps({"returned": False, "error": str(e)}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _fail_checkpoint_through(name: Path) -> str:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FULL_DISK), str(name)],
        capture_output=True, text=True, timeout=60, env=_env(),
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["returned"] is False
    assert "stands" in got["error"] and "write-ahead log" in got["error"]
    return str(got["error"])


def test_wal_only_charge_through_a_hard_link_is_not_silently_dropped(tmp_path: Path) -> None:
    """The charge is written to ``<name>.wal`` of the name it went through. Was (fixed): the next
    operation through the ledger's other name (a hard link in another directory: one ledger, one
    lock) did not see that WAL, reused the entry id and gave the 0.25 back; the next operation
    through the first name then dropped the stale WAL without a word. Now the generation goes up
    in the inode's attribute before the checkpoint, so the other name refuses the file until the
    WAL is written into it through its own name."""
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    try:
        os.getxattr(path, "user.dpsql.generation")
    except OSError:
        pytest.skip("this file system keeps no extended attributes (the per-inode marker)")
    led.commit(led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={}))
    (tmp_path / "b").mkdir()
    link = tmp_path / "b" / "ledger.duckdb"
    os.link(path, link)
    msg = _fail_checkpoint_through(link)
    assert "entry 2" in msg
    # the WAL is kept, as the message asks; the next operations go through the two names
    assert Path(str(link) + ".wal").exists()
    outcomes = []
    for name in (path, link, path):
        try:
            outcomes.append(Ledger(name).reserve(Budget(0.1), mechanism="m", query="n", tables=["t"], params={}))
        except (LedgerError, BudgetExceededError) as e:
            outcomes.append(type(e).__name__)
    # the charge that "stands" must still count (or the ledger must refuse, naming the WAL)
    hist = Ledger(path).history().to_pylist()
    ids = [r["entry_id"] for r in hist]
    # the other name refuses the file without the charge; then the WAL's own name replays it
    assert outcomes == ["LedgerError", 3, 4], (outcomes, hist)
    assert any(r["epsilon"] == 0.25 and r["entry_id"] == 2 for r in hist), (outcomes, hist)
    assert len(ids) == len(set(ids))


def test_wal_named_in_the_message_is_the_one_duckdb_wrote(tmp_path: Path) -> None:
    """Through a symlink DuckDB resolves the path and writes ``<target>.wal``; the message once
    told the operator to keep ``<symlink>.wal``, a file that does not exist."""
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    led.commit(led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={}))
    link = tmp_path / "current.duckdb"
    os.symlink(path, link)
    msg = _fail_checkpoint_through(link)
    named = [w for w in msg.replace(";", " ").split() if w.endswith(".wal")]
    assert named, msg
    for w in named:
        assert os.path.exists(w), f"the message names {w}, which does not exist; the WAL is " + str(
            sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".wal"))
        )


def test_negative_control_same_name_keeps_the_charge(tmp_path: Path) -> None:
    """Control: through one name the WAL-only charge is replayed by the next operation."""
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    led.commit(led.reserve(Budget(0.25), mechanism="m", query="q", tables=["t"], params={}))
    _fail_checkpoint_through(path)
    assert Ledger(path).remaining() == Budget(0.5)
