"""``repr(Session)``: what was configured (ledger, engine, table names, closed), never a ledger read."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

import dpsql
from dpsql.ledger import Ledger


def _session(tmp_path):
    s = dpsql.Session(str(tmp_path / "ledger.duckdb"), dpsql.Budget(3.0, 1e-5), create=True)
    s.register("visits", pa.table({"user_id": [1, 2, 3], "secret_cell": ["alice", "bob", "carol"]}),
               privacy_unit="user_id")
    return s


def test_repr_names_ledger_engine_and_tables(tmp_path) -> None:
    s = _session(tmp_path)
    try:
        text = repr(s)
        assert text == (f"dpsql.Session(ledger=Ledger({str(tmp_path / 'ledger.duckdb')!r}), engine='duckdb', "
                        "tables=['visits'])")
        assert "alice" not in text and "3.0" not in text  # no cell, no budget
    finally:
        s.close()
    assert repr(s).endswith(", closed)")


def test_repr_reads_nothing_from_the_ledger(tmp_path, monkeypatch) -> None:
    s = _session(tmp_path)
    try:
        def refuse(*a, **k):
            raise AssertionError("repr read the ledger")
        for name in ("total", "remaining", "spent", "history", "_txn"):
            monkeypatch.setattr(Ledger, name, refuse)
        assert "visits" in repr(s)
    finally:
        monkeypatch.undo()
        s.close()


def test_in_memory_session_repr_and_no_pickling() -> None:
    with dpsql.Session(None, dpsql.Budget(1.0), create=True) as s:
        assert repr(s) == "dpsql.Session(ledger=Ledger(':memory:'), engine='duckdb', tables=[])"
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(s)
