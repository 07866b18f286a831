"""Two processes querying through Sessions on one ledger file never overspend."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

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


def _parked_or_done(thread: Any, done: Any, limit: float = 5.0) -> None:
    """Wait until ``thread`` sets ``done`` or waits (parked in a ``threading`` wait: for the request in flight), at
    most ``limit`` seconds (what a fixed wait of ``limit`` gave, without its idle seconds once the thread waits)."""
    import threading
    import time

    end = time.monotonic() + limit
    while not done.wait(0.01) and time.monotonic() < end:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            return


def test_registering_a_table_again_while_another_thread_queries_it_loses_no_charge(tmp_path: Path) -> None:
    """Finding (fixed): a table registered again (fresh data under the same name) while another thread
    of the Session was between its charge and its read dropped the view that query had been planned
    on: the query failed after its charge (a wasted charge, the generic 'failed after its budget was
    charged'), or, a moment earlier, was refused as 'does not type-check'. A registration now waits for
    the requests in flight; they read the registration they were planned on."""
    import threading

    import pyarrow as pa

    import dpsql
    from dpsql.budget import Budget

    old = pa.table({"uid": list(range(100))})
    new = pa.table({"uid": list(range(300))})
    s = dpsql.Session(tmp_path / "l.duckdb", Budget(10.0), create=True)
    s.register("e", old, privacy_unit="uid")
    done = threading.Event()

    def again() -> None:
        s.register("e", new, privacy_unit="uid")
        done.set()

    reserve = s.ledger.reserve

    def reserve_then_register(*a: Any, **k: Any) -> int:
        entry = reserve(*a, **k)
        t = threading.Thread(target=again)
        t.start()  # another thread registers the table again now
        _parked_or_done(t, done)  # without the fix it is done at once; with it, it waits for this query
        return entry

    s.ledger.reserve = reserve_then_register  # type: ignore[method-assign]
    try:
        r = s.query("SELECT COUNT(*) AS n FROM e", epsilon=1.0)  # planned on the old registration
        assert r.table.num_rows == 1
    finally:
        s.ledger.reserve = reserve  # type: ignore[method-assign]
    assert done.wait(30.0)  # the registration went through once the query was done
    assert [e["status"] for e in s.history().to_pylist()] == ["released"]
    assert s.tables["e"].view and s.query("SELECT COUNT(*) AS n FROM e", epsilon=1.0).table.num_rows == 1
    s.close()


def test_closing_a_session_while_another_thread_queries_lets_the_query_finish(tmp_path: Path) -> None:
    """Finding (fixed): ``close()`` from one thread while another thread's query was between its charge
    and its read closed the engine and the ledger under it: the query failed after its charge, and
    its entry stayed 'reserved' for ever (marking it failed was refused by the closed ledger), so the
    history read as if the process had crashed. ``close()`` now waits for the requests in flight."""
    import threading

    import pyarrow as pa

    import dpsql
    from dpsql.budget import Budget
    from dpsql.ledger import Ledger

    path = tmp_path / "l.duckdb"
    s = dpsql.Session(path, Budget(10.0), create=True)
    s.register("e", pa.table({"uid": list(range(100))}), privacy_unit="uid")
    done = threading.Event()

    def close() -> None:
        s.close()
        done.set()

    reserve = s.ledger.reserve

    def reserve_then_close(*a: Any, **k: Any) -> int:
        entry = reserve(*a, **k)
        t = threading.Thread(target=close)
        t.start()  # another thread closes the Session now
        _parked_or_done(t, done)  # without the fix it is closed at once; with it, close waits for this query
        return entry

    s.ledger.reserve = reserve_then_close  # type: ignore[method-assign]
    r = s.query("SELECT COUNT(*) AS n FROM e", epsilon=1.0)
    assert r.table.num_rows == 1
    assert done.wait(30.0)
    assert [e["status"] for e in Ledger.open(path).history().to_pylist()] == ["released"]
    with pytest.raises(dpsql.errors.ConfigError, match="this Session is closed"):
        s.query("SELECT COUNT(*) AS n FROM e", epsilon=1.0)  # control: closed for what comes after
