"""Regression: a PostgreSQL ledger on a server, database or role configured with
``synchronous_commit = off`` (a common throughput setting) acknowledged a charge before its WAL
record was flushed, so a server crash after the query had read private rows could lose the charge
and give its budget back. The module docstring asked to keep the setting on; every write
transaction of the ledger now runs with ``synchronous_commit = on`` when the session's value is
``off`` or ``local`` (a stronger remote_write / remote_apply is kept)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _postgres import Server

import dpsql


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    from _postgres import running_server

    yield from running_server()


def _setting_at_insert(url: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from dpsql.ledger import _postgres, open_ledger

    led = open_ledger(url, dpsql.Budget(1.0), create=True)
    seen: list[str] = []
    execute = _postgres._Con.execute

    def spy(self: Any, sql: str, params: Any = None) -> Any:
        out = execute(self, sql, params)
        if sql.startswith("INSERT INTO ledger_entries"):
            seen.append(execute(self, "SELECT current_setting('synchronous_commit')").fetchall()[0][0])
        return out

    monkeypatch.setattr(_postgres._Con, "execute", spy)
    led.reserve(dpsql.Budget(0.1), mechanism="m", query="q", tables=["t"], params={})
    return seen


@pytest.mark.parametrize(("configured", "expected"), [("off", "on"), ("local", "on"), ("remote_apply", "remote_apply"),
                                                      ("on", "on")])
def test_charges_are_committed_durably_whatever_the_database_says(server: Server, monkeypatch: pytest.MonkeyPatch,
                                                                  configured: str, expected: str) -> None:
    import psycopg

    name = "l_" + uuid.uuid4().hex[:12]
    url = server.database(name)
    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = {configured}')
    assert _setting_at_insert(url, monkeypatch) == [expected]
