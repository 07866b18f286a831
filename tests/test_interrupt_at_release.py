"""Ctrl-C (SIGINT) that lands while the ledger records a query's release. The ledger holds it back during its
operation (``dpsql.interrupts.HeldInterrupt``) and raises it once the operation has given back all it took. Landing
after the release's COMMIT, the entry reads released and the charge stands: the KeyboardInterrupt carries the
answer (``e.release``), which was lost before. Landing before the COMMIT (which it rolls back), the entry stays
reserved and nothing was released: the KeyboardInterrupt carries none, as before."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import dpsql
from dpsql import Budget, interrupts
from dpsql.ledger import _store

pytestmark = pytest.mark.usefixtures("python_sigint")

CALLS: dict[str, Callable[[Any], Any]] = {
    "query": lambda s: s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5),
    "groupings": lambda s: s.query("SELECT g, COUNT(*) AS n FROM t GROUP BY ROLLUP (g)", epsilon=0.5),
    "query_many": lambda s: s.query_many(["SELECT COUNT(*) FROM t WHERE x BETWEEN 0 AND 9",
                                          "SELECT COUNT(*) FROM t WHERE x BETWEEN 10 AND 99"], epsilon=0.5),
    "suggest_caps": lambda s: s.suggest_caps("t", epsilon=0.5),
}


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Any]:
    t = pa.table({"uid": list(range(200)), "g": [i % 3 for i in range(200)], "x": [i % 100 for i in range(200)]})
    s = dpsql.Session(str(tmp_path / "l.duckdb"), Budget(10), create=True)
    s.register("t", t, privacy_unit="uid", columns={"g": {"domain": [0, 1, 2]}, "x": {"bounds": [0, 99], "bins": 100}})
    yield s
    s.close()


def _sigint_at(monkeypatch: pytest.MonkeyPatch, hook: str, write: int) -> None:
    """SIGINT at ``hook`` of the ``write``-th write transaction from now (1: the charge, 2: the release)."""
    seen = [0]

    def at(path: str) -> None:
        if hook == "before_commit":
            seen[0] += 1
        elif hook == "before_marker":  # (after the COMMIT)
            seen[0] += 1
        if seen[0] == write:
            seen[0] += 1
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # Python's handler would run here, were Ctrl-C not held back
                pass

    monkeypatch.setitem(_store._HOOKS, hook, at)


def _statuses(s: Any) -> list[str]:
    return list(s.history().column("status").to_pylist())


@pytest.mark.parametrize("call", list(CALLS))
def test_ctrl_c_after_the_releases_commit_keeps_the_answer(session: Any, call: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _sigint_at(monkeypatch, "before_marker", 2)
    with pytest.raises(KeyboardInterrupt) as caught:
        CALLS[call](session)
    monkeypatch.delitem(_store._HOOKS, "before_marker")
    rel = caught.value.release  # type: ignore[attr-defined]
    assert _statuses(session) == ["released"] and rel.ledger_id == 1 and not rel.reused
    assert rel.cost == Budget(0.5) and session.remaining().epsilon == pytest.approx(9.5)  # charged once
    assert rel.table.num_rows >= 1
    frames, tb = [], caught.value.__traceback__
    while tb is not None:
        frames, tb = [*frames, tb.tb_frame.f_code.co_name], tb.tb_next
    assert frames[-1] == "kept" and "_run" not in frames  # (not the frames that read private rows)
    assert interrupts.HELD is None and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    again = CALLS[call](session)  # the Session and ledger go on
    assert again.ledger_id == 2 and _statuses(session) == ["released", "released"]


@pytest.mark.parametrize("call", list(CALLS))
def test_ctrl_c_before_the_releases_commit_keeps_nothing(session: Any, call: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: Ctrl-C raised before the release's COMMIT rolls it back: reserved, no answer."""
    _sigint_at(monkeypatch, "before_commit", 2)
    with pytest.raises(KeyboardInterrupt) as caught:
        CALLS[call](session)
    assert not hasattr(caught.value, "release")
    assert _statuses(session) == ["reserved"] and session.remaining().epsilon == pytest.approx(9.5)


def test_ctrl_c_after_the_charges_commit_carries_no_answer(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C held back until the charge was committed: the query does not run (the entry stays reserved)."""
    _sigint_at(monkeypatch, "before_marker", 1)
    with pytest.raises(KeyboardInterrupt) as caught:
        CALLS["query"](session)
    assert not hasattr(caught.value, "release") and _statuses(session) == ["reserved"]
