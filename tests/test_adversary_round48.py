"""Neighbouring datasets (without and with one person's rows), the same query, the same observable outcome.

Finding (fixed): the per-query bound on the text columns a read decodes at once
(``DuckDBBackend.check_text_columns``) ran inside the bind check, which a session remembers per query. Without an
owner's ``memory_limit`` the bound is the caller's connection's own, read again before every charge: a query over
four text columns answered under the caller's 4 GB was, after the caller lowered the limit to 1 GB (which holds
two such columns at one thread), run again at one thread instead of refused, so one person's rows of the longest
texts in those columns would make it fail after its charge, only when that person is there. The remembered bind
check is now keyed by the memory limit the engine's bound is computed under.

Finding (fixed): a ``memory_limit`` or ``max_temp_directory_size`` of 2^64 bytes or more (``"20000000TB"``)
passed the engine settings' check, which DuckDB then refused: on the engine's own connection the session failed
with DuckDB's own ParserException, and on a caller's connection (where the limit is set around each private read)
every query was charged and then failed with the generic error. A size of more digits than a float holds
(``"1" + "0" * 400 + "GB"``) raised an OverflowError. Both are now refused as engine settings, free: a size of at
most 1 000 000 TB.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.engine import EngineSettings
from dpsql.engine.base import size_bytes, text_read_memory
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


@pytest.mark.parametrize("name", ["memory_limit", "max_temp_directory_size"])
@pytest.mark.parametrize("size", ["20000000TB", "18446744073709551616B", "1" + "0" * 400 + "GB", "9.3e2GB"])
def test_a_size_beyond_what_duckdb_reads_is_refused_as_an_engine_setting(name: str, size: str) -> None:
    with pytest.raises(ConfigError, match=name):
        EngineSettings(**{name: size})


def test_a_size_beyond_what_duckdb_reads_is_refused_free_on_a_callers_connection() -> None:
    con = _callers("4GB")
    with pytest.raises(ConfigError, match="memory_limit"):
        dpsql.Session(budget=Budget(10.0, 1e-3), connection=con, engine={"memory_limit": "20000000TB"})
    assert con.execute("SELECT COUNT(*) FROM ev").fetchall() == [(200,)]


def test_control_sizes_duckdb_reads_are_kept() -> None:
    assert size_bytes("1.5 gb") == 1_500_000_000 and size_bytes("100 MiB") == 100 * 2**20
    assert size_bytes("1000000TB") == 10**18
    for size in ("1.5GB", "1000 MiB", " 4gb ", "1000000TB"):
        assert EngineSettings(memory_limit=size).memory_limit == size


def test_the_refusal_of_too_many_text_columns_shows_a_need_above_the_limit(eight_cpus: None) -> None:
    """Both sizes were rounded up to MB, so a need a few kB over the limit read "1000 MB ... more than the
    memory_limit of 1000 MB holds": the limit is now rounded down, the need up."""
    con = _callers("1GB")  # DuckDB shows it as 953.6 MiB: 999 948 288 bytes
    cap = 10**9 // text_read_memory(2, 1)  # two columns need 999 997 440 bytes at one thread
    with dpsql.Session(budget=Budget(10.0, 1e-3), connection=con,
                       engine={"memory_limit": None, "max_text_bytes": cap}) as s:
        s.register("t", "ev", privacy_unit="uid", max_rows_per_unit=3)
        with pytest.raises(ConfigError) as e:
            s.query("SELECT COUNT(*) AS c FROM t WHERE n0 = 'a' OR n1 = 'b'", epsilon=0.5, delta=1e-7)
        assert "1000 MB at one thread, more than the memory_limit of 999 MB" in str(e.value)
