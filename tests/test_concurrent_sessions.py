"""Two processes querying through Sessions on one ledger file never overspend."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import dpsql

SCRIPT = textwrap.dedent(
    """
    import sys, dpsql
    from dpsql.errors import BudgetExceededError
    ok = refused = 0
    with dpsql.Session(ledger=sys.argv[1], lock_timeout=60) as s:
        s.register("events", sys.argv[2], privacy_unit="user_id")
        for _ in range(6):
            try:
                s.query("SELECT COUNT(*) FROM events", epsilon=0.1)
                ok += 1
            except BudgetExceededError:
                refused += 1
    print(ok, refused)
    """
)


def test_two_processes_never_overspend(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    ledger = str(tmp_path / "shared.duckdb")
    dpsql.Session(ledger=ledger, budget=dpsql.Budget(0.5), create=True).close()
    data = str(root / "examples" / "events.parquet")
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT, ledger, data], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(tuple(int(v) for v in out.split()))
    assert sum(r[0] for r in results) == 5  # exactly 0.5 / 0.1 charges fit
    assert sum(r[1] for r in results) == 7
    with dpsql.Session(ledger=ledger) as s:
        assert s.remaining() == dpsql.Budget(0.0, 0.0)
        assert s.history().num_rows == 5
