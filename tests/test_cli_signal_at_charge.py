"""A signal that lands once the ledger has recorded a query's charge but before the query reads private rows (held
back by the ledger until the charge's COMMIT, or just after the ledger returned its entry) said only 'a charge already
made stands (see dpsql budget --history)': a job's log could not tell whether this command had charged, nor which
entry. It now names the entry and what became of it, as a signal during the private read does: ledger entry N,
reserved (counted), nothing released. The Python API's KeyboardInterrupt carries it as ``ledger_entry``, at every
point a signal can land between the charge and the read (a stepped test, in a fresh interpreter)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import child_env, run_alone, signal_at_a_new_place

from dpsql.cli import main

#: SIGTERM (argv[1]) at ``argv[2]``: ``charge_commit`` just after the charge's COMMIT (held back by the ledger),
#: ``charged`` when the run enters its guarded part (the ledger has returned the entry), ``none``: no signal
PROBE = """
import os, signal, sys
from dpsql import cli, session
from dpsql.ledger import _store

sig, point, sent = getattr(signal, sys.argv[1]), sys.argv[2], []
real_charged = session.charged

def send():
    sent.append(True)
    os.kill(os.getpid(), sig)
    for _ in range(10**6):  # (the handler raises here, unless the ledger holds the signal back)
        pass

def committed(path):  # after a write's COMMIT: the first is the charge's
    if point == "charge_commit" and not sent:
        send()

def charged(*a, **k):
    if point == "charged" and not sent:
        send()
    return real_charged(*a, **k)

_store._HOOKS.update(before_marker=committed)
session.charged = charged
sys.exit(cli.main(sys.argv[3:]))
"""


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A table and a fresh ledger (created in this process: only the signalled command needs a process of its own)."""
    pq.write_table(pa.table({"uid": list(range(200))}), tmp_path / "t.parquet")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["--ledger", str(tmp_path / "l.duckdb"), "init", "--epsilon", "10"]) == 0, err.getvalue()
    return tmp_path


def _run(cwd: Path, sig: str, point: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE), sig, point, "--ledger", "l.duckdb", "--table",
                           "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
                           "--epsilon", "1"], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)


def _entries(cwd: Path) -> list[dict[str, object]]:
    """The ledger's entries, as ``dpsql budget --history --format json`` prints them (read in this process)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--ledger", str(cwd / "l.duckdb"), "budget", "--history", "--format", "json"])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())["entries"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("sig, words", [("SIGTERM", "terminated (SIGTERM)"), ("SIGINT", "interrupted"),
                                        ("SIGHUP", "hung up (SIGHUP)")])
@pytest.mark.parametrize("point", ["charge_commit", "charged"])
def test_a_signal_between_the_charge_and_the_read_names_the_reserved_entry(data: Path, sig: str, words: str,
                                                                            point: str) -> None:
    p = _run(data, sig, point)
    assert p.returncode == 128 + {"SIGTERM": 15, "SIGINT": 2, "SIGHUP": 1}[sig], p.stderr
    assert [(e["entry_id"], e["status"]) for e in _entries(data)] == [(1, "reserved")]
    assert (f"{words}: a charge already made stands (this query's: ledger entry 1, reserved, counted; nothing was "
            "released)") in p.stderr, p.stderr
    assert "unexpected" not in p.stderr and "see dpsql budget --history" not in p.stderr, p.stderr


def test_without_a_signal_the_probe_answers(data: Path) -> None:
    """Negative control: the probe itself changes nothing."""
    p = _run(data, "SIGTERM", "none")
    assert p.returncode == 0, p.stderr
    assert [(e["entry_id"], e["status"]) for e in _entries(data)] == [(1, "released")]


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) AS n FROM t", "SELECT g, COUNT(*) AS n FROM t GROUP BY ROLLUP (g)"])
def test_ctrl_c_at_every_point_after_the_charge_names_the_entry_as_the_ledger_has_it(
        tmp_path: Path, request: pytest.FixtureRequest, python_sigint: None, sql: str) -> None:
    """Ctrl-C at each point where Python runs a signal's handler in Session.query (and the charge's code): whenever
    the ledger holds an entry of this query from which nothing was released, the KeyboardInterrupt names it with
    the status the ledger records (reserved: cut short before or at the private read; failed: marked so); never an
    entry it does not have; and once the entry reads released, it carries the answer (``e.release``), up to the
    call's last step (it was lost when Ctrl-C came after the release was built, as Session.query returned it).

    Each distinct place is tried once (``conftest.signal_at_a_new_place``): a point's code position, with its callers'
    call sites and the number of ledger writes made so far. A point at the same place again is another iteration of
    the same loop, or another call from the same call site, with the ledger unchanged since: the same code, reached
    the same way, with the same entry (or none) in the same status, so the same outcome is expected. That is what
    the ROLLUP's second grouping and the per-column and per-item loops repeat (of the ROLLUP's 775 points, 493 are
    distinct places; of the COUNT's, all); the ledger's writes (the charge, the release) each start a new phase, so
    every point before, between and after them stays, and so does every position reached by another path."""
    if run_alone(request):
        return
    import dpsql.charge
    import dpsql.groupings
    import dpsql.session
    from dpsql.ledger import _store

    pq.write_table(pa.table({"uid": list(range(50)), "g": [i % 3 for i in range(50)]}), tmp_path / "t.parquet")
    files = {dpsql.session.__file__, dpsql.charge.__file__, dpsql.groupings.__file__}
    writes, tried, named = [0], set[object](), dict[str, int]()
    _store._HOOKS["before_marker"] = lambda path: writes.__setitem__(0, writes[0] + 1)  # after each write's COMMIT
    try:
        with dpsql.Session(ledger=str(tmp_path / "l.duckdb"), budget=dpsql.Budget(1e6), create=True) as s:
            s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", columns={"g": {"domain": [0, 1, 2]}})
            before = s.history().num_rows
            while True:
                writes[0] = 0
                tracer = signal_at_a_new_place(tried, files, lambda: writes[0])
                answered = None
                sys.settrace(tracer)
                try:
                    s.query(sql, epsilon=1)
                    answered = True
                except KeyboardInterrupt as e:
                    sys.settrace(None)
                    h = s.history().to_pylist()[before:]
                    if h and h[0]["status"] == "released":  # the paid answer is never lost: the interrupt carries it
                        assert getattr(e, "release", None) is not None and e.release.ledger_id == h[0]["entry_id"], h
                        named["released"] = named.get("released", 0) + 1
                    elif h:  # charged, nothing released: the entry is named as it is, and no answer comes with it
                        assert getattr(e, "ledger_entry", None) == (h[0]["entry_id"], h[0]["status"]), h
                        assert getattr(e, "release", None) is None, h
                        named[h[0]["status"]] = named.get(h[0]["status"], 0) + 1
                    elif not h:
                        assert getattr(e, "ledger_entry", None) is None and getattr(e, "release", None) is None, h
                    before += len(h)
                finally:
                    sys.settrace(None)
                if answered:
                    before = s.history().num_rows
                if answered and not tracer.sent[0]:  # every place was tried
                    break
    finally:
        _store._HOOKS.pop("before_marker", None)
    assert all(named.get(k, 0) >= 2 for k in ("reserved", "failed", "released")), named  # every window was reached
