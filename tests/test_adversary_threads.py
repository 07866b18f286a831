"""dpsql in one process with threads: Sessions, ledgers and connections shared by threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import duckdb

import dpsql
from dpsql.budget import Budget


def _settings(con: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    return tuple(con.execute("SELECT current_setting('threads'), current_setting('memory_limit'), "
                             "current_setting('preserve_insertion_order')").fetchall()[0])


def test_sessions_sharing_a_callers_connection_in_threads_take_turns() -> None:
    """Finding (fixed): Sessions on one caller's connection (``Session(connection=con)``, one per worker thread)
    each locked only their own engine, so two of them ran DuckDB calls on the connection at once. DuckDB refused
    one (a raw ``ResourceInUseException``, or a ConfigError telling to ROLLBACK a failed transaction) or handed
    one call's result to the other's ``fetchall`` (a raw IndexError); a read refused after its charge failed
    with the charge standing; and the caller's settings (threads) were left at dpsql's limits. The
    engines on one connection now share its lock."""
    con = duckdb.connect()
    con.execute("CREATE TABLE big AS SELECT range AS uid FROM range(50000)")
    con.execute("CREATE TABLE small AS SELECT range AS uid FROM range(100)")
    con.execute("SET threads = 3; SET memory_limit = '1GiB'")  # values the engine's limits change and restore exactly
    before = _settings(con)
    sessions = []
    for _ in range(4):
        s = dpsql.Session(None, Budget(1e6), connection=con)
        s.register("big", "big", privacy_unit="uid")
        s.register("small", "small", privacy_unit="uid")
        sessions.append(s)
    bar = threading.Barrier(len(sessions))
    bad: list[Any] = []

    def run(i: int) -> None:
        bar.wait(30)
        for j in range(12):
            name, n = (("big", 50000), ("small", 100))[(i + j) % 2]
            try:
                got = sessions[i].query(f"SELECT COUNT(*) AS n FROM {name}", epsilon=5.0).table.column(0)[0].as_py()
                if abs(got - n) > 50:
                    bad.append((name, got))
            except Exception as e:  # noqa: BLE001
                bad.append((type(e).__name__, str(e)[:200]))

    with ThreadPoolExecutor(len(sessions)) as ex:
        _, pending = wait([ex.submit(run, i) for i in range(len(sessions))], timeout=60)
    assert not pending and bad == []
    for s in sessions:
        assert [e["status"] for e in s.history().to_pylist()] == ["released"] * 12
        s.close()
    assert _settings(con) == before
