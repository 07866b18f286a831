"""The work one ledger operation does (counted, not timed; timings are in benchmarks/ledger_overhead.py).

A charge takes its exclusive lock, attaches the file, checks it, writes, commits and checkpoints: what
the privacy argument needs. These tests pin that nothing is done twice: one statement reads
``ledger_meta`` (schema version, generation and identity), one more the total and what is spent, the
path is resolved once, each marker
file is read once for the checks, and the budget sum converts each distinct value of a coordinate once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dpsql import budget as budget_module
from dpsql.budget import Budget, compose_counted
from dpsql.ledger import Ledger, _store


class _Counting:
    """A DuckDB connection (or cursor) that records every statement it runs."""

    def __init__(self, target: Any, log: list[str]) -> None:
        self._target = target
        self._log = log

    def cursor(self) -> _Counting:
        return _Counting(self._target.cursor(), self._log)

    def execute(self, sql: str, *args: Any) -> Any:
        self._log.append(sql)
        return self._target.execute(sql, *args)

    def sql(self, sql: str) -> Any:
        self._log.append(sql)
        return self._target.sql(sql)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


@contextmanager
def _statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    log: list[str] = []
    base = _store._base_connection
    with monkeypatch.context() as m:
        m.setattr(_store, "_base_connection", lambda: _Counting(base(), log))
        yield log


def _reserve(led: Ledger) -> int:
    return led.reserve(Budget(0.01, 1e-9), mechanism="gaussian", query="SELECT 1", tables=["t"], params={"sigma": 1.0})


@pytest.fixture
def led(tmp_path: Path) -> Ledger:
    led = Ledger.create(tmp_path / "ledger.duckdb", Budget(10.0, 1e-3))
    led.commit(_reserve(led))  # a ledger in use: generation above 1, markers written
    return led


OPERATIONS: dict[str, tuple[Callable[[Ledger], object], int]] = {
    # ATTACH, USE, BEGIN, ledger_meta, total and spent, INSERT, generation, COMMIT, CHECKPOINT, DETACH
    "reserve": (_reserve, 10),
    # ATTACH, USE, BEGIN, ledger_meta, the entry, UPDATE, generation, COMMIT, CHECKPOINT, DETACH
    "commit": (lambda led: led.commit(_reserve(led)), 10),
    # ATTACH, USE, BEGIN, ledger_meta, total and spent, COMMIT, DETACH
    "remaining": (Ledger.remaining, 7),
}


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_an_operation_reads_ledger_meta_once(led: Ledger, op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run, statements = OPERATIONS[op]
    if op == "commit":
        entry = _reserve(led)
        run = lambda led: led.commit(entry)  # noqa: E731 - the reserve is not counted
    with _statements(monkeypatch) as log:
        run(led)
    meta_reads = [s for s in log if "FROM ledger_meta" in s]
    assert len(meta_reads) == 1, log  # schema version, generation and identity from one statement
    assert len(log) == statements, log
    assert not any("ORDER BY" in s for s in log), log  # the newest total is picked in Python


def test_an_in_memory_ledger_is_created_in_few_statements(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new in-memory ledger's catalog was attached just now under a name of its own: it is not asked for its tables
    (a file ledger's is, in case another process created one meanwhile), and the schema and the read of the version it
    declares are one call. Every Session without a ledger file creates one."""
    log: list[str] = []
    memory = _store._state().memory
    if memory is None:
        Ledger.create(None, Budget(1.0, 0.0)).close()
        memory = _store._state().memory
    with monkeypatch.context() as m:
        m.setattr(_store._state(), "memory", _Counting(memory, log))
        led = Ledger.create(None, Budget(3.0, 1e-4))
    try:
        assert not any("duckdb_tables" in s for s in log), log
        # ATTACH, USE, BEGIN, the schema and its version, the identity rows, the first total, COMMIT
        assert len(log) == 7, log
        assert led.total() == Budget(3.0, 1e-4) and led.remaining() == Budget(3.0, 1e-4)
    finally:
        led.close()


def test_one_operation_resolves_the_path_and_reads_each_marker_once(
    led: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved: list[str] = []
    marker_reads: list[str] = []
    realpath, read_marker = os.path.realpath, _store._read_marker_id

    def counting_realpath(p: Any, *a: Any, **k: Any) -> Any:
        resolved.append(os.fspath(p))
        return realpath(p, *a, **k)

    def counting_read(path: str) -> Any:
        marker_reads.append(path)
        return read_marker(path)

    with monkeypatch.context() as m:
        m.setattr(os.path, "realpath", counting_realpath)
        m.setattr(_store, "_read_marker_id", counting_read)
        _reserve(led)
    assert len(resolved) == 2, resolved  # the waiting queue's directory, and the operation's files
    # the generation and identity checks read both marker files once; raising the marker reads it again
    # right before writing it (never lowering a marker another ledger creation may have written)
    assert sorted(marker_reads) == sorted([_store._marker_path(led.path or ""), _store._legacy_marker_path(led.path or ""),
                                           _store._marker_path(led.path or "")]), marker_reads


def test_the_budget_sum_converts_each_distinct_value_of_a_coordinate_once(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = [(Budget(0.001 + i * 1e-12, 1e-9), 2) for i in range(300)]
    calls: list[float] = []

    def counting_repr(x: Any) -> str:
        calls.append(x)
        return repr(x)

    monkeypatch.setattr(budget_module, "repr", counting_repr, raising=False)
    budget_module._exact_counted_sums(counted)
    assert len(calls) == 301  # 300 epsilons, one delta (the sum; the result's float is then read off it)
    monkeypatch.undo()
    total = compose_counted(counted)
    # the same exact sums as adding every charge one by one
    one_by_one = compose_counted([(b, 1) for b, n in counted for _ in range(n)])
    assert total == one_by_one and total.delta == 600e-9


def test_spent_counts_only_counted_entries_and_numbers_after_every_entry(led: Ledger) -> None:
    """The spent statement groups every entry by value and by whether it counts: reused entries (zero
    cost) are not counted but their ids are taken; failed ones count."""
    synopsis_entry = _reserve(led)
    led.commit(synopsis_entry, synopsis_key="k", synopsis='{"x": 1}')
    failed = _reserve(led)
    led.fail(failed, "no rows")
    reuse = led.record_reuse(source_entry_id=synopsis_entry, query="SELECT 1", tables=["t"])
    with led._txn(write=False) as (con, _t):
        groups, next_id = led._spent_counts(con)
    assert next_id == reuse + 1
    assert groups == [(Budget(0.01, 1e-9), 3)]  # the fixture's entry, the released one and the failed one
    assert led.spent() == Budget(0.03, 3e-9)
    assert _reserve(led) == reuse + 1
