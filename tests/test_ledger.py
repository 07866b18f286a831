"""The durable budget ledger: persistence, exact arithmetic, statuses, corrupt files, reuse."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, ConfigError, LedgerError
from dpsql.ledger import SCHEMA_VERSION, Ledger, LedgerEntry, schema_sql

REPO = Path(__file__).resolve().parents[1]


def _reserve(ledger: Ledger, eps: float = 0.1, delta: float = 0.0, **kw: object) -> int:
    args: dict = {"mechanism": "sparse_histogram", "query": "SELECT 1", "tables": ["events"], "params": {}}
    args.update(kw)
    return ledger.reserve(Budget(eps, delta), **args)


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.duckdb"


# --- the schema file -------------------------------------------------------------------------


def test_schema_copies_are_identical() -> None:
    canonical = REPO / "dpsql" / "ledger" / "schema.sql"
    assert canonical.read_bytes() == (REPO / "sql" / "ledger_schema.sql").read_bytes()
    assert schema_sql() == canonical.read_text(encoding="utf-8")


def test_schema_declares_the_code_version() -> None:
    con = duckdb.connect()
    con.execute(schema_sql())
    assert con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchall() == [
        (str(SCHEMA_VERSION),)
    ]


# --- create / open / persistence ---------------------------------------------------------------


def test_create_open_and_remaining_across_reopen(path: Path) -> None:
    with Ledger.create(str(path), Budget(1.0, 1e-6)) as led:
        assert led.path == str(path)
        _reserve(led, 0.25, 1e-7)
    # a new Ledger object is a new process's view: everything comes from the file
    led2 = Ledger.open(str(path))
    assert led2.total() == Budget(1.0, 1e-6)
    assert led2.spent() == Budget(0.25, 1e-7)
    assert led2.remaining() == Budget(0.75, 9e-7)
    assert Ledger.open(path, Budget(1.0, 1e-6)).remaining() == Budget(0.75, 9e-7)  # same total: fine
    assert not Path(str(path) + ".wal").exists()  # checkpointed: one self-contained file


def test_meta_records_version_and_creation(path: Path) -> None:
    Ledger.create(path, Budget(1.0))
    con = duckdb.connect(str(path), read_only=True)
    meta = dict(con.execute("SELECT key, value FROM ledger_meta").fetchall())
    con.close()
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert meta["created_at"].startswith("20")
    assert meta["created_by"].startswith("dpsql")


def test_create_refuses_existing_file(path: Path) -> None:
    Ledger.create(path, Budget(1.0))
    before = _digest(path)
    with pytest.raises(LedgerError, match="already exists") as ei:
        Ledger.create(path, Budget(2.0))
    assert "Ledger.open" in (ei.value.hint or "")
    assert _digest(path) == before
    assert Ledger.open(path).total() == Budget(1.0)


def test_create_at_a_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="it is a directory") as ei:
        Ledger.create(tmp_path, Budget(1.0))
    assert "ledger.duckdb" in (ei.value.hint or "")


def test_open_with_different_total_is_config_error(path: Path) -> None:
    Ledger.create(path, Budget(1.0, 1e-6))
    with pytest.raises(ConfigError, match="explicit, recorded operation") as ei:
        Ledger.open(path, Budget(2.0, 1e-6))
    assert "set_total" in str(ei.value)
    with pytest.raises(ConfigError):  # delta differs only
        Ledger.open(path, Budget(1.0, 1e-5))
    # 0.1 + 0.2 is the float 0.30000000000000004, a different decimal from 0.3: exact rule
    Ledger.create(path.with_name("b.duckdb"), Budget(0.3))
    assert Ledger.open(path.with_name("b.duckdb"), Budget(0.3)).total() == Budget(0.3)
    with pytest.raises(ConfigError):
        Ledger.open(path.with_name("b.duckdb"), Budget(0.1 + 0.2))


def test_open_missing_file(path: Path) -> None:
    with pytest.raises(LedgerError, match="no budget ledger") as ei:
        Ledger.open(path)
    assert "dpsql init --epsilon" in str(ei.value)
    assert not path.exists()
    # a total alone never creates a ledger: a mistyped or deleted path is not a fresh budget
    with pytest.raises(LedgerError, match="no budget ledger") as ei:
        Ledger.open(path, Budget(2.0, 1e-6))
    assert "dpsql init" in (ei.value.hint or "") and "delete" not in str(ei.value)
    assert not path.exists()
    # create=True needs a total
    with pytest.raises(LedgerError, match="no total"):
        Ledger.open(path, create=True)
    # with create=True and a total, open creates it
    led = Ledger.open(path, Budget(2.0, 1e-6), create=True)
    assert path.exists() and led.total() == Budget(2.0, 1e-6)
    assert Ledger.open(path, Budget(2.0, 1e-6), create=True).total() == Budget(2.0, 1e-6)  # exists: opened


def test_file_deleted_after_open_is_not_recreated(path: Path) -> None:
    led = Ledger.create(path, Budget(1.0))
    path.unlink()
    with pytest.raises(LedgerError, match="does not exist"):
        _reserve(led)
    assert not path.exists()


def test_in_memory_ledger() -> None:
    led = Ledger.create(None, Budget(1.0))
    assert led.path is None
    _reserve(led, 0.5)
    assert led.remaining() == Budget(0.5)
    assert Ledger.open(None, Budget(1.0)).remaining() == Budget(1.0)  # a separate, fresh ledger
    with pytest.raises(LedgerError, match="no recorded total"):
        Ledger.open(None)
    led.close()
    with pytest.raises(LedgerError, match="closed"):
        led.remaining()


# --- set_total -------------------------------------------------------------------------------


def test_set_total_is_recorded_and_respected(path: Path) -> None:
    led = Ledger.create(path, Budget(0.2))
    _reserve(led, 0.2)
    with pytest.raises(BudgetExceededError):
        _reserve(led, 0.1)
    led.set_total(Budget(0.5), reason="approved by data owner, ticket 42")
    assert Ledger.open(path).total() == Budget(0.5)
    assert Ledger.open(path, Budget(0.5)).remaining() == Budget(0.3)
    with pytest.raises(ConfigError):
        Ledger.open(path, Budget(0.2))  # the old total no longer matches
    _reserve(led, 0.3)
    log = led.totals_history().to_pylist()
    assert [(r["epsilon"], r["previous_epsilon"], r["reason"]) for r in log] == [
        (0.2, None, "created"),
        (0.5, 0.2, "approved by data owner, ticket 42"),
    ]
    led.set_total(Budget(0.5), reason="no-op")  # unchanged total: nothing recorded
    assert led.totals_history().num_rows == 2


def test_set_total_refuses_below_spent(path: Path) -> None:
    led = Ledger.create(path, Budget(1.0, 1e-6))
    _reserve(led, 0.6, 5e-7)
    with pytest.raises(ConfigError, match="already spent"):
        led.set_total(Budget(0.5, 1e-6), reason="shrink")
    with pytest.raises(ConfigError, match="already spent"):
        led.set_total(Budget(1.0, 4e-7), reason="shrink delta")
    led.set_total(Budget(0.6, 5e-7), reason="close the ledger exactly at spent")
    assert led.remaining() == Budget(0.0, 0.0)
    with pytest.raises(ConfigError, match="reason"):
        led.set_total(Budget(2.0), reason="  ")
    assert led.totals_history().num_rows == 2


# --- exact arithmetic --------------------------------------------------------------------------


def test_ten_tenths_fit_exactly_and_the_eleventh_does_not(path: Path) -> None:
    led = Ledger.create(path, Budget(1.0))
    ids = [_reserve(led, 0.1) for _ in range(10)]
    assert ids == list(range(1, 11))
    assert led.spent() == Budget(1.0) and led.remaining() == Budget(0.0)
    before = led.history()
    with pytest.raises(BudgetExceededError) as ei:
        _reserve(led, 0.1)
    err = ei.value
    assert err.requested == Budget(0.1) and err.remaining == Budget(0.0)
    assert "epsilon=0.1" in str(err) and "epsilon=0.0" in str(err) and "delta=" in str(err)
    assert led.history().equals(before)
    assert err.exit_code == 3


def test_delta_is_exact_too() -> None:
    # pure bookkeeping logic: the in-memory ledger runs the same code without file opens
    led = Ledger.create(None, Budget(10.0, 1e-6))
    for _ in range(10):
        _reserve(led, 0.01, 1e-7)  # in floats, ten 1e-7 sum to 9.999999999999999e-07
    assert led.spent() == Budget(0.1, 1e-6)
    before = led.history()
    with pytest.raises(BudgetExceededError, match=r"\(delta\)") as ei:
        _reserve(led, 0.01, 1e-7)
    assert ei.value.remaining == Budget(9.9, 0.0)
    assert "delta=1e-07" in str(ei.value)
    assert led.history().equals(before)
    _reserve(led, 0.5, 0.0)  # pure-DP charges still fit


# --- statuses ---------------------------------------------------------------------------------


def test_failed_entries_still_count(path: Path) -> None:
    led = Ledger.create(path, Budget(1.0))
    a = _reserve(led, 0.4)
    b = _reserve(led, 0.4)
    led.commit(a)
    led.fail(b, "ExecutionError: DuckDB failed on generated SQL")
    assert led.spent() == Budget(0.8)
    with pytest.raises(BudgetExceededError):
        _reserve(led, 0.3)
    rows = led.history().to_pylist()
    assert [r["status"] for r in rows] == ["released", "failed"]
    assert rows[1]["failure_reason"] == "ExecutionError: DuckDB failed on generated SQL"
    assert Ledger.open(path).entry(b).status == "failed"


def test_commit_and_fail_on_unknown_or_finished_entries() -> None:
    # pure bookkeeping logic: the in-memory ledger runs the same code without file opens
    led = Ledger.create(None, Budget(1.0))
    with pytest.raises(LedgerError, match="no entry 7"):
        led.commit(7)
    with pytest.raises(LedgerError, match="no entry 7"):
        led.fail(7, "x")
    with pytest.raises(LedgerError):
        led.entry(7)
    with pytest.raises(LedgerError, match="integers"):
        led.commit("1")  # type: ignore[arg-type]
    a = _reserve(led)
    led.commit(a)
    with pytest.raises(LedgerError, match="'released'"):
        led.commit(a)
    with pytest.raises(LedgerError, match="'released'"):
        led.fail(a, "late")
    b = _reserve(led)
    led.fail(b, "boom")
    with pytest.raises(LedgerError, match="'failed'"):
        led.commit(b)
    assert [r["status"] for r in led.history().to_pylist()] == ["released", "failed"]


def test_params_are_recorded_and_never_change_meaning(path: Path) -> None:
    led = Ledger.create(path, Budget(1.0, 1e-6))
    params = {"sigma": np.float64(3.5), "tau": np.int64(7), "caps": [1, 2], "rate": 0.5, "noise": "gaussian"}
    a = led.reserve(
        Budget(0.5, 1e-7),
        mechanism="sparse_histogram",
        query="SELECT c, COUNT(*) ...",
        tables=["e", "u"],
        params=params,
    )
    led.commit(a, params_update={"tau_star": 12.25})
    e = Ledger.open(path).entry(a)
    assert isinstance(e, LedgerEntry)
    assert e.params == {
        "sigma": 3.5,
        "tau": 7,
        "caps": [1, 2],
        "rate": 0.5,
        "noise": "gaussian",
        "tau_star": 12.25,
    }
    assert e.cost == Budget(0.5, 1e-7) and e.tables == ("e", "u") and e.mechanism == "sparse_histogram"
    assert e.created_at <= e.updated_at and e.counts

    b = _reserve(led, params={"sigma": 1.0})
    with pytest.raises(LedgerError, match="never changes meaning"):
        led.commit(b, params_update={"sigma": 2.0})
    assert led.entry(b).status == "reserved" and led.entry(b).params == {"sigma": 1.0}
    led.commit(b, params_update={"sigma": 1.0})  # restating the same value is fine

    with pytest.raises(ConfigError, match="JSON"):
        _reserve(led, params={"sigma": float("nan")})
    with pytest.raises(ConfigError, match="JSON"):
        _reserve(led, params={"obj": object()})
    with pytest.raises(ConfigError):
        led.reserve(0.1, mechanism="m", query="q", tables=[], params={})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        _reserve(led, tables="events")
    assert led.history().num_rows == 2


def test_history_is_arrow_in_order() -> None:
    # pure bookkeeping logic: the in-memory ledger runs the same code without file opens
    led = Ledger.create(None, Budget(1.0))
    for i in range(3):
        _reserve(led, 0.1, query=f"SELECT {i}")
    t = led.history()
    assert isinstance(t, pa.Table)
    assert t.column("entry_id").to_pylist() == [1, 2, 3]
    assert t.column("query").to_pylist() == ["SELECT 0", "SELECT 1", "SELECT 2"]
    assert {"status", "epsilon", "delta", "params", "tables", "created_at", "synopsis_key"} <= set(
        t.column_names
    )


# --- synopsis reuse ------------------------------------------------------------------------------


def test_synopsis_store_find_reuse_round_trip(path: Path) -> None:
    led = Ledger.create(path, Budget(1.0))
    key = "dawa:events:amount:0-100:v1"
    assert led.find_synopsis(key) is None
    a = _reserve(led, 0.5, mechanism="dawa")
    assert led.find_synopsis(key) is None  # reserved is not released
    synopsis = json.dumps({"buckets": [[0, 10, 3.5], [10, 100, 7.25]]})
    led.commit(a, synopsis_key=key, synopsis=synopsis)

    found = Ledger.open(path).find_synopsis(key)
    assert found == (a, synopsis)
    spent = led.spent()
    r = led.record_reuse(source_entry_id=a, query="SELECT ... range 0-50", tables=["events"])
    assert led.spent() == spent  # post-processing is free
    row = led.history().to_pylist()[-1]
    assert (row["entry_id"], row["status"], row["epsilon"], row["delta"], row["source_entry_id"]) == (
        r,
        "reused",
        0.0,
        0.0,
        a,
    )
    assert row["mechanism"] == "dawa"
    # a later synopsis under the same key does not replace the first one
    b = _reserve(led, 0.1, mechanism="dawa")
    led.commit(b, synopsis_key=key, synopsis="[]")
    assert led.find_synopsis(key) == (a, synopsis)


def test_reuse_needs_a_released_synopsis() -> None:
    # pure bookkeeping logic: the in-memory ledger runs the same code without file opens
    led = Ledger.create(None, Budget(1.0))
    a = _reserve(led)
    with pytest.raises(LedgerError, match="cannot be reused"):
        led.record_reuse(source_entry_id=a, query="q", tables=[])
    led.commit(a)
    with pytest.raises(LedgerError, match="no synopsis"):
        led.record_reuse(source_entry_id=a, query="q", tables=[])
    with pytest.raises(LedgerError, match="no entry 99"):
        led.record_reuse(source_entry_id=99, query="q", tables=[])
    b = _reserve(led)
    with pytest.raises(ConfigError, match="both"):
        led.commit(b, synopsis_key="k")
    with pytest.raises(ConfigError, match="not valid JSON"):
        led.commit(b, synopsis_key="k", synopsis="{not json")
    assert led.entry(b).status == "reserved"
    assert led.history().num_rows == 2


# --- corrupt / foreign files -------------------------------------------------------------------


def test_random_bytes_file_is_refused_untouched(path: Path) -> None:
    path.write_bytes(os.urandom(5000))
    before = _digest(path)
    for call in (lambda: Ledger.open(path), lambda: Ledger.open(path, Budget(1.0))):
        with pytest.raises(LedgerError, match="not a DuckDB database") as ei:
            call()
        assert str(path) in str(ei.value) and ei.value.hint
    with pytest.raises(LedgerError, match="already exists"):
        Ledger.create(path, Budget(1.0))
    assert _digest(path) == before
    assert not Path(str(path) + ".wal").exists()


def test_empty_file_is_refused_untouched(path: Path) -> None:
    path.write_bytes(b"")
    with pytest.raises(LedgerError, match="empty file"):
        Ledger.open(path, lock_timeout=0.2)
    assert path.read_bytes() == b""


def test_duckdb_file_with_other_tables_is_refused_untouched(path: Path) -> None:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE events AS SELECT range AS id FROM range(10)")
    con.close()
    before = _digest(path)
    with pytest.raises(LedgerError, match="not a dpsql budget ledger") as ei:
        Ledger.open(path, Budget(1.0))
    assert "events" in str(ei.value) and "never modifies" in str(ei.value)
    with pytest.raises(LedgerError):
        Ledger.create(path, Budget(1.0))
    assert _digest(path) == before


def _set_version(path: Path, version: str) -> None:
    con = duckdb.connect(str(path))
    con.execute("UPDATE ledger_meta SET value = ? WHERE key = 'schema_version'", [version])
    con.close()


@pytest.mark.parametrize(("version", "fix"), [("2", "upgrade dpsql"), ("0", "older dpsql")])
def test_wrong_schema_version_is_refused_untouched(path: Path, version: str, fix: str) -> None:
    led = Ledger.create(path, Budget(1.0))
    _reserve(led)
    _set_version(path, version)
    before = _digest(path)
    for call in (lambda: Ledger.open(path), led.remaining, lambda: _reserve(led)):
        with pytest.raises(
            LedgerError, match=f"schema version {version}, but this dpsql reads schema version 1"
        ) as ei:
            call()
        assert fix in str(ei.value)
    assert _digest(path) == before
    _set_version(path, "1")  # nothing recorded was lost
    assert Ledger.open(path).spent() == Budget(0.1)


def test_ledger_error_exit_code() -> None:
    assert LedgerError("x").exit_code == 4


def test_exact_sum_of_repeated_charges_groups_equal_values_exactly():
    """Repeated charges are summed per distinct value (n * exact(value)): still exact decimals."""
    from dpsql.budget import Budget, compose, exact_sum_fits

    spent = [Budget(0.1, 1e-7)] * 9 + [Budget(0.05, 0.0)] * 2  # 0.9 + 0.1 = 1.0 exactly, delta 9e-7
    assert exact_sum_fits(spent, Budget(0.0, 1e-7), Budget(1.0, 1e-6))
    assert not exact_sum_fits(spent, Budget(1e-12, 0.0), Budget(1.0, 1e-6))  # negative control: just over
    assert not exact_sum_fits(spent, Budget(0.0, 1.1e-7), Budget(1.0, 1e-6))
    assert compose(spent) == Budget(1.0, 9e-7)
    assert compose([Budget(0.1)] * 1000) == Budget(100.0)  # float addition would give 99.9999999999986


# --- a long history: the budget check groups the counted charges in SQL ---------------------------


def _fill(path: str, rows: str) -> None:
    con = duckdb.connect(path)
    con.execute(
        "INSERT INTO ledger_entries (entry_id, created_at, updated_at, status, mechanism, epsilon, delta, query, "
        f"tables, params) {rows}")
    con.close()


def test_a_long_history_is_summed_exactly_by_value(tmp_path: Path) -> None:
    # 30 000 earlier entries of three sizes (0.001, 0.002, 0.003; delta 1e-9), every third one a
    # 'released', 'reserved' or 'failed' (all count) and 600 'rejected'-like rows that never
    # existed as counting statuses are absent; exact sum by hand: 10 000 * (0.001 + 0.002 + 0.003)
    # = 60 (as decimals) and 30 000e-9 = 3e-5
    path = str(tmp_path / "l.duckdb")
    Ledger.create(path, Budget(60.5, 1e-4)).close()
    _fill(path, "SELECT i + 1, now(), now(), ['released', 'reserved', 'failed'][1 + (i // 3) % 3], 'm', "
                "[0.001, 0.002, 0.003][1 + i % 3], 1e-9, 'q', ['t'], '{}' FROM range(30000) AS r(i)")
    led = Ledger.open(path)
    assert led.spent() == Budget(60.0, 3e-5)
    assert led.remaining() == Budget(0.5, 7e-5)
    e = led.reserve(Budget(0.5, 0.0), mechanism="m", query="q", tables=["t"], params={})
    assert e == 30001  # the next id after the history
    with pytest.raises(BudgetExceededError):  # exactly nothing left: the smallest cost is refused
        led.reserve(Budget(5e-324, 0.0), mechanism="m", query="q", tables=["t"], params={})
    led.close()


def test_grouped_sums_equal_the_entry_by_entry_sum(tmp_path: Path) -> None:
    # 3 000 entries of about 700 distinct sizes: the grouped exact sum is the one-by-one exact sum
    # (dpsql.budget.compose over every entry); a total one ulp of decimal below it is refused
    from dpsql.budget import compose

    path = str(tmp_path / "l.duckdb")
    Ledger.create(path, Budget(1000.0, 0.5)).close()
    gen = np.random.default_rng(7)
    eps = np.round(gen.uniform(0.001, 0.5, 700), 4)[gen.integers(0, 700, 3000)]
    dl = np.round(gen.uniform(0, 1e-7, 700), 12)[gen.integers(0, 700, 3000)]
    con = duckdb.connect(path)
    con.register("v", pa.table({"i": np.arange(3000), "e": eps, "d": dl}))
    con.execute("INSERT INTO ledger_entries (entry_id, created_at, updated_at, status, mechanism, epsilon, delta, "
                "query, tables, params) SELECT i + 1, now(), now(), 'released', 'm', e, d, 'q', ['t'], '{}' FROM v")
    con.close()
    led = Ledger.open(path)
    want = compose([Budget(float(e), float(d)) for e, d in zip(eps, dl, strict=True)])
    assert led.spent() == want
    assert len(set(zip(eps.tolist(), dl.tolist(), strict=True))) < 3000  # sizes repeat: the grouping matters
    with pytest.raises(ConfigError, match="already spent"):
        led.set_total(Budget(want.epsilon - 1e-9, 0.5), reason="below what is spent")
    led.close()
