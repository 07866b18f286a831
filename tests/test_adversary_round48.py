"""Neighbouring datasets (without and with one person's rows), the same query, the same observable outcome.

Finding (fixed): the per-query bound on the text columns a read decodes at once
(``DuckDBBackend.check_text_columns``) ran inside the bind check, which a session remembers per query. Without an
owner's ``memory_limit`` the bound is the caller's connection's own, read again before every charge: a query over
four text columns answered under the caller's 4 GB was, after the caller lowered the limit to 1 GB (which holds
two such columns at one thread), run again at one thread instead of refused, so one person's rows of the longest
texts in those columns would make it fail after its charge, only when that person is there. The remembered bind
check is now keyed by the memory limit the engine's bound is computed under.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.engine.base import text_read_memory
from dpsql.errors import ConfigError

WIDE = pa.table({"uid": list(range(200)), **{f"n{j}": [f"v{i % 3}" for i in range(200)] for j in range(4)}})
FOUR = "SELECT COUNT(*) AS c FROM t WHERE n0 = 'a' OR n1 = 'b' OR n2 = 'c' OR n3 = 'd'"


@pytest.fixture
def eight_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dpsql.engine.base.os.cpu_count", lambda: 8)


def _callers(limit: str) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{limit}'")
    con.register("src", WIDE)
    con.execute("CREATE TABLE ev AS SELECT * FROM src")
    return con


def _history(s: dpsql.Session) -> list[Any]:
    return list(s.history().to_pylist())


def test_a_callers_lowered_limit_refuses_a_remembered_query_over_several_text_columns(eight_cpus: None) -> None:
    con = _callers("4GB")
    cap = 9 * 10**8 // text_read_memory(2, 1)  # 1 GB holds two such columns at one thread, 4 GB all four
    with dpsql.Session(budget=Budget(10.0, 1e-3), connection=con,
                       engine={"memory_limit": None, "max_text_bytes": cap}) as s:
        s.register("t", "ev", privacy_unit="uid", max_rows_per_unit=3)
        s.query(FOUR, epsilon=0.5, delta=1e-7)  # answered under 4 GB; its bind check remembered
        con.execute("SET memory_limit = '1GB'")  # the caller lowers it between queries
        before, recorded = s.remaining(), len(_history(s))
        with pytest.raises(ConfigError, match="4 text columns"):
            s.query(FOUR, epsilon=0.5, delta=1e-7)
        assert s.remaining() == before and len(_history(s)) == recorded  # free, nothing recorded
        s.query("SELECT COUNT(*) AS c FROM t WHERE n0 = 'a' OR n1 = 'b'", epsilon=0.5, delta=1e-7)  # two: answered
        con.execute("SET memory_limit = '4GB'")
        s.query(FOUR, epsilon=0.5, delta=1e-7)  # raised again: answered again
