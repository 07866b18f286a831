"""In-memory ledgers: each is a catalog attached to the process's ledger instance (no DuckDB instance of
its own: opening and closing one cost 30-70 ms per Session without a ledger file), isolated from the
others, and dropped when the ledger is closed or collected."""

from __future__ import annotations

import gc

import duckdb
import pytest

import dpsql
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger
from dpsql.ledger._store import _base_connection, _state


def _catalogs() -> set[str]:
    memory = _state().memory
    assert memory is not None
    rows = memory.execute("SELECT database_name FROM duckdb_databases()").fetchall()
    return {r[0] for r in rows if r[0].startswith("dpsql_memory_ledger_")}


def test_an_in_memory_ledger_opens_no_duckdb_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    Ledger.create(None, dpsql.Budget(1.0, 1e-6)).close()  # the process's ledger instance exists now
    opened: list[object] = []
    real = duckdb.connect

    def counting(*a: object, **k: object) -> duckdb.DuckDBPyConnection:
        opened.append(a)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(duckdb, "connect", counting)
    led = Ledger.create(None, dpsql.Budget(1.0, 1e-6))
    led.reserve(dpsql.Budget(0.25, 1e-7), mechanism="m", query="q", tables=["t"], params={})
    assert opened == []
    led.close()


def test_in_memory_ledgers_are_separate_and_dropped_when_closed_or_collected() -> None:
    before = _catalogs()
    a = Ledger.create(None, dpsql.Budget(1.0, 1e-6))
    b = Ledger.create(None, dpsql.Budget(2.0, 1e-6))
    a.reserve(dpsql.Budget(0.25, 1e-7), mechanism="m", query="q", tables=["t"], params={})
    assert a.remaining().epsilon == pytest.approx(0.75) and b.remaining().epsilon == pytest.approx(2.0)
    assert len(_catalogs() - before) == 2
    a.close()
    assert len(_catalogs() - before) == 1
    del b
    gc.collect()
    assert _catalogs() == before
    with pytest.raises(LedgerError, match="closed"):
        a.remaining()


def test_an_in_memory_ledger_outlives_the_file_ledgers_instance_being_replaced(tmp_path) -> None:
    # a file ledger whose DETACH fails closes the process's file-ledger instance (and every connection made
    # from it) and starts a new one: in-memory ledgers live on an instance of their own
    led = Ledger.create(None, dpsql.Budget(1.0, 1e-6))
    Ledger.create(tmp_path / "l.duckdb", dpsql.Budget(1.0, 1e-6)).close()
    st = _state()
    with st.mutex:
        base, st.base = st.base, None
    assert base is not None
    base.close()
    led.reserve(dpsql.Budget(0.25, 1e-7), mechanism="m", query="q", tables=["t"], params={})
    assert led.remaining().epsilon == pytest.approx(0.75)
    assert _base_connection() is not base
    led.close()
