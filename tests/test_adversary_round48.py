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

Finding (fixed, wording): the refusal of a query over too many text columns rounded both sizes up to MB, so a
need a few kB over the limit read "1000 MB at one thread, more than the memory_limit of 1000 MB holds"; the limit
is now rounded down.

What held (no change needed): the text columns a query reads at once are counted from its text (struct,
dictionary, large_string, string_view and large_binary columns; a lookup join's public table named), with only
``binary`` (``COLLATE "binary"``) among the bounded SQL's own identifiers; the threads come back after statement
time-outs and under three threads sharing a Session on a caller's connection. The hoisted parts of fixed width
and the comparisons of two inputs' keys release, with zero noise, what the plan before them released over text
keys with NULLs (CASE, COALESCE, NULLIF, failing casts, overflow near 2^63, // and % by zero, BETWEEN, IN, IS [NOT]
DISTINCT, comparisons of BOOLEAN parts: 68 queries, each under DP-S4S and R2T), as do a lookup join's counted keys
(with a declared domain, HAVING, max_text_bytes of 16, 4 and 1). A DECIMAL clamped in its type releases what
DOUBLE does under bounds below zero, within (0, 1) and whole (the tests below), also for DECIMAL(38,37) and
DECIMAL(4,3) at their ends when checked once.
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


#: one person's DECIMAL(18,4) values at the type's ends and around the bounds below (NULL too)
DECIMALS = ["99999999999999.9999", "-99999999999999.9999", "-7.5001", "-2.2499", "3.0000", "3.5001", None, "-1.0000",
            "0.0001", "0.2499", "0.7501"]


def _decimal_releases(typ: str, bounds: tuple[float, float], opts: Any) -> list[Any]:
    from decimal import Decimal

    from dpsql.testing import use_noise, zero_noise

    con = duckdb.connect()
    con.execute(f"CREATE TABLE t (uid BIGINT, d {typ})")
    conv = Decimal if typ.startswith("DECIMAL") else (lambda v: float(Decimal(v)))
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, None if (v := DECIMALS[i % len(DECIMALS)]) is None else conv(v))
                                                   for i in range(330)])
    s = dpsql.Session(budget=Budget(1e9, 0.5), connection=con)
    use_noise(s, zero_noise(48))
    s.register("t", "t", privacy_unit="uid", columns={"d": {"bounds": bounds}}, max_rows_per_unit=3)
    try:
        return [s.query(q, epsilon=1.0, delta=1e-6, options=opts).table.to_pylist()
                for q in ("SELECT SUM(d) AS a, AVG(d) AS b FROM t", "SELECT VARIANCE(d) AS v FROM t")]
    finally:
        s.close()


@pytest.mark.parametrize("bounds", [(-7.5, -2.25), (0.25, 0.75), (3, 3.5)])
@pytest.mark.parametrize("opts", [None, {"max_rows_per_unit": 1}])
def test_held_a_decimal_clamped_in_its_type_releases_what_doubles_do_under_negative_and_fractional_bounds(
        bounds: tuple[float, float], opts: Any) -> None:
    """The clamp of a DECIMAL to whole numbers around its bounds before its conversion (``bound._decimal_preclamped``)
    changes no release: bounds below zero, within (0, 1), and whole; k = 3 and the race of k = 1."""
    released = _decimal_releases("DECIMAL(18,4)", bounds, opts)
    assert released == _decimal_releases("DOUBLE", bounds, opts)
    assert (released[0][0]["a"] < 0) == (bounds[1] < 0) and released[0][0]["a"] != 0  # non-vacuous: the bounds bind
