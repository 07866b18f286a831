"""The PostgreSQL ledger: the same protocol and refusals as the DuckDB file, shared by processes.

A server is started by the fixture itself (``tests/_postgres.py``: temp data directory,
loopback, random port, an unprivileged user). Without PostgreSQL or psycopg the tests skip with
the reason, unless ``DPSQL_REQUIRE_EXTRAS=1`` (CI), where a missing extra is a failure.
"""

from __future__ import annotations

import multiprocessing as mp
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from _postgres import Server

import dpsql
from dpsql.errors import BudgetExceededError, ConfigError, LedgerError
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    from _postgres import running_server

    yield from running_server()


@pytest.fixture
def url(server: Server) -> str:
    return server.database("l_" + uuid.uuid4().hex[:12])


def open_ledger(url: str, **kw: object) -> dpsql.ledger.Ledger:
    from dpsql.ledger import open_ledger as _open

    return _open(url, kw.pop("budget", None), **kw)  # type: ignore[arg-type]


def test_protocol_round_trip(url: str) -> None:
    led = open_ledger(url, budget=dpsql.Budget(1.0, 1e-6), create=True)
    assert type(led).__name__ == "PostgresLedger"
    assert led.total() == dpsql.Budget(1.0, 1e-6)
    a = led.reserve(dpsql.Budget(0.3, 0.0), mechanism="basic", query="SELECT 1", tables=["t"], params={"sigma": 2.5})
    led.commit(a, params_update={"n": 3}, synopsis_key="k1", synopsis='{"x": 1}')
    b = led.reserve(dpsql.Budget(0.1 + 0.2, 1e-7), mechanism="basic", query="q", tables=["t", "u"], params={})
    led.fail(b, "time-out")
    assert led.remaining().epsilon == pytest.approx(0.4)
    assert led.find_synopsis("k1") == (a, '{"x": 1}')
    r = led.record_reuse(source_entry_id=a, query="again", tables=["t"])
    e = led.entry(a)
    assert e.status == "released" and e.params == {"sigma": 2.5, "n": 3} and e.tables == ("t",)
    assert led.entry(b).failure_reason == "time-out" and led.entry(r).status == "reused"
    assert led.entry(b).cost == dpsql.Budget(0.1 + 0.2, 1e-7)  # bit-exact doubles
    h = led.history()
    assert isinstance(h, pa.Table) and h.column("status").to_pylist() == ["released", "failed", "reused"]
    with pytest.raises(BudgetExceededError):
        led.reserve(dpsql.Budget(0.5, 0.0), mechanism="basic", query="q", tables=["t"], params={})
    with pytest.raises(LedgerError, match="reserved"):
        led.commit(a)
    led.set_total(dpsql.Budget(2.0, 1e-6), reason="more")
    assert open_ledger(url).total() == dpsql.Budget(2.0, 1e-6)  # another connection, the recorded total
    with pytest.raises(ConfigError):
        open_ledger(url, budget=dpsql.Budget(5.0, 0.0))


def test_missing_foreign_and_wrong_version_are_refused(server: Server, url: str) -> None:
    import psycopg

    with pytest.raises(LedgerError, match="no budget ledger"):
        open_ledger(url)
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE TABLE ledger_meta (key VARCHAR, value VARCHAR)")
    with pytest.raises(LedgerError, match="not a dpsql budget ledger"):
        open_ledger(url, budget=dpsql.Budget(1.0, 0.0), create=True)
    other = server.database("v_" + uuid.uuid4().hex[:8])
    led = open_ledger(other, budget=dpsql.Budget(1.0, 0.0), create=True)
    with psycopg.connect(other, autocommit=True) as con:
        con.execute("UPDATE ledger_meta SET value = '2' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="schema version 2"):
        led.remaining()
    with pytest.raises(LedgerError, match="schema version 2"):
        open_ledger(other)


def test_password_never_shown(server: Server) -> None:
    bad = f"postgresql://dpsql:s3cret-pw@127.0.0.1:{server.port}/no_such_db"
    with pytest.raises(LedgerError) as info:
        open_ledger(bad)
    assert "s3cret-pw" not in str(info.value) and "***" in str(info.value)


def test_session_and_config_use_the_shared_ledger(url: str, tmp_path: Path) -> None:
    t = pa.table({"u": pa.array([1, 2, 3, 3], pa.int64()), "x": pa.array([1.0, 2.0, 3.0, 4.0])})
    s = dpsql.Session(ledger=url, budget=dpsql.Budget(2.0, 1e-5), create=True)
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="u")
    s.query("SELECT COUNT(*) FROM t", epsilon=0.5, delta=1e-6)
    s.close()
    cfg = tmp_path / "dpsql.toml"
    cfg.write_text(f'[ledger]\nurl = "{url}"\n')
    s2 = dpsql.Session.from_config(cfg)
    try:
        assert s2.remaining().epsilon == pytest.approx(1.5)
        assert s2.history().column("status").to_pylist() == ["released"]
    finally:
        s2.close()
    cfg.write_text(f'[ledger]\nurl = "{url}"\npath = "x.duckdb"\n')
    with pytest.raises(ConfigError, match="both"):
        dpsql.Session.from_config(cfg)


def _charge(url: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from dpsql.ledger import open_ledger as _open

    led = _open(url, None, lock_timeout=60)
    ok = 0
    for i in range(n):
        try:
            eid = led.reserve(dpsql.Budget(0.1, 0.0), mechanism="basic", query=f"q{i}", tables=["t"], params={})
            led.commit(eid)
            ok += 1
        except BudgetExceededError:
            pass
    out.put(ok)


def test_concurrent_processes_never_overspend(url: str) -> None:
    # 6 processes x 12 charges of 0.1 against a total of 3.0: exactly 30 succeed, whatever the interleaving
    open_ledger(url, budget=dpsql.Budget(3.0, 0.0), create=True).close()
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_charge, args=(url, 12, out)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0
    succeeded = sum(out.get(timeout=10) for _ in procs)
    led = open_ledger(url)
    assert succeeded == 30
    h = led.history()
    assert h.num_rows == 30 and sorted(h.column("entry_id").to_pylist()) == list(range(1, 31))
    assert led.spent() == dpsql.Budget(3.0, 0.0) or led.spent().epsilon == pytest.approx(3.0)
    assert led.remaining().epsilon == pytest.approx(0.0, abs=1e-12)
