"""The owner's memory_limit holds a vector of the longest texts per reading thread, by construction.

DuckDB's Parquet reader decodes 2048 rows per vector; a read of one person's rows of texts at ``max_text_bytes``
needed up to five such vectors per thread (``dpsql.engine.base.TEXT_VECTORS_PER_THREAD``), and under a smaller
``memory_limit`` every read of that column failed after its charge only when that person was there
(``tests/test_adversary_round44.py``). The engine settings now lower the default ``threads`` until the limit holds
:func:`text_read_memory`, and refuse (free, when the session is created) settings under which it cannot hold even
at one thread; without an owner's ``memory_limit`` the connection's own is the one checked (DuckDB's default, or a
caller's connection's own, read again before every charge).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.cli import main
from dpsql.engine import Engine, EngineSettings
from dpsql.engine import _duckdb_native as native
from dpsql.engine.base import READ_VECTOR_ROWS, TEXT_VECTORS_PER_THREAD, text_read_memory
from dpsql.errors import ConfigError

EVENTS = pa.table({"uid": list(range(200)), "note": [f"n{i % 5}" for i in range(200)]})


@pytest.fixture
def eight_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dpsql.engine.base.os.cpu_count", lambda: 8)  # the default threads: min(4, CPUs) = 4


def test_the_bound_is_vectors_of_the_longest_texts_per_thread() -> None:
    assert READ_VECTOR_ROWS == 2048 and TEXT_VECTORS_PER_THREAD == 6
    assert text_read_memory(1, 65536) == 6 * 2048 * 65536 == 805_306_368
    assert text_read_memory(4, 65536) == 3_221_225_472


def test_the_default_settings_hold_four_threads_of_the_longest_texts(eight_cpus: None) -> None:
    s = EngineSettings()
    assert s.effective_threads == 4 and text_read_memory(4, 65536) <= 4 * 10**9
    with dpsql.Session(budget=Budget(1.0)) as session:
        con = session._engine.connection  # type: ignore[attr-defined]
        assert con.execute("SELECT current_setting('threads')").fetchall()[0][0] == 4


@pytest.mark.parametrize(("limit", "threads"), [("4GB", 4), ("2GB", 2), ("1700MB", 2), ("1GB", 1), ("806MB", 1)])
def test_unset_threads_are_lowered_to_what_the_limit_holds(eight_cpus: None, limit: str, threads: int) -> None:
    assert EngineSettings(memory_limit=limit).effective_threads == threads
    with dpsql.Session(budget=Budget(1.0), engine={"memory_limit": limit}) as session:
        con = session._engine.connection  # type: ignore[attr-defined]
        assert con.execute("SELECT current_setting('threads')").fetchall()[0][0] == threads
    # a lower cap keeps the default threads
    assert EngineSettings(memory_limit=limit, max_text_bytes=4096).effective_threads == 4


def test_explicit_threads_are_kept_or_refused(eight_cpus: None) -> None:
    assert EngineSettings(memory_limit="1700MB", threads=2).effective_threads == 2
    with pytest.raises(ConfigError) as e:
        EngineSettings(memory_limit="1GB", threads=2)
    text = f"{e.value.message} {e.value.hint}"
    assert all(w in text for w in ("memory_limit = '1GB'", "threads = 2", "max_text_bytes = 65536", "1 611 MB",
                                   'raise memory_limit to at least "1611MB"', "at most 40690 at 2 threads",
                                   "or threads", "nothing was charged")), text


@pytest.mark.parametrize("engine", [{"memory_limit": "100MB", "threads": 1}, {"memory_limit": "600MB"},
                                    {"memory_limit": "100MB", "max_text_bytes": 10_000},
                                    {"memory_limit": "1GB", "threads": 3, "max_text_bytes": 40_000}])
def test_settings_that_cannot_hold_one_thread_are_refused_before_anything_is_recorded(
        tmp_path: Path, engine: dict[str, Any]) -> None:
    led = tmp_path / "ledger.duckdb"
    with pytest.raises(ConfigError, match="leave too little memory to read the longest texts") as e:
        dpsql.Session(led, Budget(1.0), engine=engine, create=True)
    assert "raise memory_limit to at least" in (e.value.hint or "") and "lower max_text_bytes" in (e.value.hint or "")
    assert not led.exists()  # refused before the ledger was opened: nothing spent, nothing recorded


def test_the_command_line_refuses_such_a_config_in_its_terms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(EVENTS, tmp_path / "events.parquet")
    cfg = tmp_path / "dpsql.toml"
    cfg.write_text('[ledger]\npath = "l.duckdb"\nepsilon = 3.0\ncreate_if_missing = true\n'
                   '[engine]\nmemory_limit = "100MB"\nthreads = 1\n'
                   '[tables.events]\nsource = "events.parquet"\nprivacy_unit = "uid"\n')
    capsys.readouterr()
    code = main(["--config", str(cfg), "query", "SELECT COUNT(*) FROM events", "--epsilon", "1"])
    err = capsys.readouterr().err
    assert code == ConfigError.exit_code
    assert "memory_limit = '100MB', threads = 1 and max_text_bytes = 65536" in err
    assert '[engine] memory_limit = "..." in dpsql.toml' in err and "at most 8138 at 1 thread" in err
    assert not (tmp_path / "l.duckdb").exists()


def test_no_text_cap_or_another_engine_has_no_bound(eight_cpus: None) -> None:
    """Without a cap no limit holds one person's longest texts (documented: bound stored sizes in the writer);
    Spark's readers run under the cluster's memory settings, not memory_limit (the driver's DuckDB's)."""
    assert EngineSettings(memory_limit="100MB", max_text_bytes=None).effective_threads == 4
    assert EngineSettings(memory_limit="100MB", kind="spark").effective_threads == 4


def _callers(limit: str) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{limit}'")
    con.register("src", EVENTS)
    con.execute("CREATE TABLE ev AS SELECT * FROM src")
    return con


def test_without_an_owners_limit_a_callers_connection_is_checked_before_every_charge(
        eight_cpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="the DuckDB connection's own memory_limit"):
        dpsql.Session(budget=Budget(1.0), connection=_callers("300MB"), engine={"memory_limit": None})
    con = _callers("1700MB")
    seen: list[Any] = []
    real = Engine.fetch_arrow

    def spy(self: Any, ast: Any, *, what: str = "the bounded query") -> Any:
        with self._limited():
            seen.append(self._con.execute("SELECT current_setting('threads')").fetchall()[0][0])
        return real(self, ast, what=what)

    monkeypatch.setattr(Engine, "fetch_arrow", spy)
    with dpsql.Session(budget=Budget(1.0), connection=con, engine={"memory_limit": None}) as s:
        s.register("t", "ev", privacy_unit="uid")
        s.query("SELECT COUNT(*) FROM t", epsilon=0.1)
        assert seen == [2]  # 1.7 GB holds two threads of texts of 65 536 bytes
        con.execute("SET memory_limit = '300MB'")  # the caller lowers it between queries
        before = s.remaining()
        with pytest.raises(ConfigError, match="too little memory"):
            s.query("SELECT COUNT(*) FROM t", epsilon=0.1)
        assert s.remaining() == before and len(s.history().to_pylist()) == 1  # free, nothing recorded
    assert con.execute("SELECT current_setting('threads')").fetchall()[0][0] != 0


def test_without_an_owners_limit_the_engines_own_connection_uses_duckdbs_default(eight_cpus: None) -> None:
    with dpsql.Session(budget=Budget(1.0), engine={"memory_limit": None}) as s:
        con = s._engine.connection  # type: ignore[attr-defined]
        limit, threads = con.execute("SELECT parse_formatted_bytes(current_setting('memory_limit')), "
                                     "current_setting('threads')").fetchall()[0]
        assert threads == max(1, min(4, limit // text_read_memory(1, 65536)))


# --- several text columns read at once: the bound per query ----------------------------------------------------------

WIDE = pa.table({"uid": list(range(200)), **{f"n{j}": [f"v{i % 3}" for i in range(200)] for j in range(4)},
                 "meta": pa.array([{"a": "x", "b": "y"}] * 200), "x": list(range(200))})


def _wide_session(limit: str, cap: int, **engine: Any) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10.0, 1e-3), engine={"memory_limit": limit, "max_text_bytes": cap, **engine})
    s.register("t", WIDE, privacy_unit="uid", max_rows_per_unit=3)
    return s


def test_the_text_columns_a_query_reads_are_counted_from_its_text(eight_cpus: None) -> None:
    with _wide_session("4GB", 1000) as s:
        b = s._engine  # type: ignore[attr-defined]
        view = next(v for v in b._texts if "_dpsql_src_t" in v)
        assert dict(b._texts[view]) == {"n0": 1, "n1": 1, "n2": 1, "n3": 1, "meta": 2}  # a struct's fields each
        for sql, n in [("SELECT COUNT(*) AS c FROM t", 0), ("SELECT COUNT(*) AS c FROM t WHERE x > 3", 0),
                       ("SELECT COUNT(*) AS c FROM t WHERE n0 = 'v1'", 1),
                       ("SELECT n0, n1, COUNT(*) AS c FROM t GROUP BY n0, n1", 2),
                       ("SELECT COUNT(*) AS c FROM t WHERE n0 = 'a' OR n1 = 'b' OR n2 = 'c' OR n3 = 'd'", 4)]:
            ast = backends_bounded(s, sql)
            assert b._text_columns_read(b._render(ast), native.reads_of(ast)) == n, sql


def backends_bounded(s: dpsql.Session, sql: str) -> Any:
    from dpsql.rewrite.bound import SALT_PLACEHOLDER
    r = s._route(sql, 1.0, 1e-6, None)  # type: ignore[attr-defined]
    return r.bounded(SALT_PLACEHOLDER, s._engine.ops)  # type: ignore[attr-defined]


FOUR = "SELECT COUNT(*) AS c FROM t WHERE n0 = 'a' OR n1 = 'b' OR n2 = 'c' OR n3 = 'd'"


def test_a_query_over_more_text_columns_than_the_limit_holds_is_refused_free(eight_cpus: None) -> None:
    cap = 10**9 // text_read_memory(2, 1)  # 1 GB holds two such columns at one thread
    with _wide_session("1GB", cap) as s:
        before = s._ledger.remaining()  # type: ignore[attr-defined]
        with pytest.raises(ConfigError) as e:
            s.query(FOUR, epsilon=1.0, delta=1e-6)
        assert "4 text columns" in str(e.value) and "nothing was charged" in str(e.value)
        assert "memory_limit" in (e.value.hint or "") and "max_text_bytes" in (e.value.hint or "")
        with pytest.raises(ConfigError):
            s.explain(FOUR, epsilon=1.0, delta=1e-6)  # explain refuses what query refuses before its charge
        after = s._ledger.remaining()  # type: ignore[attr-defined]
        assert str(after) == str(before)
        s.query("SELECT COUNT(*) AS c FROM t WHERE n0 = 'a' OR n1 = 'b'", epsilon=1.0, delta=1e-6)  # two: answered


def test_a_query_over_several_text_columns_reads_with_fewer_threads(eight_cpus: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.engine.duckdb import DuckDBBackend
    seen: list[int] = []
    real = DuckDBBackend._threads_of_read

    def spy(self: Any, threads: int) -> Any:
        seen.append(threads)
        return real(self, threads)

    monkeypatch.setattr(DuckDBBackend, "_threads_of_read", spy)
    cap = 10**9 // text_read_memory(4, 1)  # 1 GB holds four threads of one column, two of two, one of four
    with _wide_session("1GB", cap) as s:
        con = s._engine.connection  # type: ignore[attr-defined]
        for sql, threads in [("SELECT COUNT(*) AS c FROM t WHERE x > 1", 4),
                             ("SELECT COUNT(*) AS c FROM t WHERE n0 = 'a'", 4),
                             ("SELECT COUNT(*) AS c FROM t WHERE n0 = 'a' OR n1 = 'b'", 2), (FOUR, 1)]:
            seen.clear()
            s.query(sql, epsilon=0.5, delta=1e-7)
            assert seen == [threads], sql
            assert con.execute("SELECT current_setting('threads')").fetchall()[0][0] == 4  # the engine's, after
