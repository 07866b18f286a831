"""The crash campaign (benchmarks/ledger_crash.py) at a small size: SIGKILL two workers at
random points of create/reserve/commit/fail/set_total, then check the ledger's consistency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_crash_campaign_small(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ledger_crash.py"), "--trials", "6", "--seed", "7",
         "--max-delay-ms", "300", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["violations"] == [] and out["ok"] is True
    assert out["trials"] == 6 and out["kills"] == 12
    # not vacuous: workers acknowledged operations before being killed, in several steps
    assert out["acknowledged_operations"] > 0
    assert len(out["kill_after_step"]) >= 3
    assert json.loads((tmp_path / "ledger_crash.json").read_text()) == out


def test_crash_checker_catches_violations(tmp_path: Path) -> None:
    """Negative control: the campaign's checker flags lost acknowledgements and missing ledgers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ledger_crash", REPO / "benchmarks" / "ledger_crash.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from dpsql.budget import Budget
    from dpsql.ledger import Ledger

    path = tmp_path / "ledger.duckdb"
    problems, _ = mod._check(str(path), "create", ["created\n"])
    assert problems == ["the ledger file is missing although it had been created"]
    led = Ledger.create(path, Budget(1.0))
    led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})
    problems, n = mod._check(str(path), "ops", ["R 1\nC 1\nR 2\n"])
    assert n == 3
    assert "acknowledged commit 1 is 'reserved'" in problems
    assert "acknowledged reserve 2 is None" in problems
