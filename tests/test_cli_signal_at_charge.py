"""A signal that lands once the ledger has recorded a query's charge but before the query reads private rows (held
back by the ledger until the charge's COMMIT, or just after the ledger returned its entry) said only 'a charge already
made stands (see dpsql budget --history)': a job's log could not tell whether this command had charged, nor which
entry. It now names the entry and what became of it, as a signal during the private read does: ledger entry N,
reserved (counted), nothing released. The Python API's KeyboardInterrupt carries it as ``ledger_entry``, at every
point a signal can land between the charge and the read (a stepped test, in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import child_env, run_alone, stepped_signal

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
    pq.write_table(pa.table({"uid": list(range(200))}), tmp_path / "t.parquet")
    p = subprocess.run([sys.executable, "-m", "dpsql.cli", "--ledger", "l.duckdb", "init", "--epsilon", "10"],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return tmp_path


def _run(cwd: Path, sig: str, point: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE), sig, point, "--ledger", "l.duckdb", "--table",
                           "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
                           "--epsilon", "1"], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)


def _entries(cwd: Path) -> list[dict[str, object]]:
    b = subprocess.run([sys.executable, "-m", "dpsql.cli", "--ledger", "l.duckdb", "budget", "--history", "--format",
                        "json"], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)
    assert b.returncode == 0, b.stderr
    return json.loads(b.stdout)["entries"]  # type: ignore[no-any-return]


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
    call's last step (it was lost when Ctrl-C came after the release was built, as Session.query returned it)."""
    if run_alone(request):
        return
    import dpsql.charge
    import dpsql.groupings
    import dpsql.session

    pq.write_table(pa.table({"uid": list(range(50)), "g": [i % 3 for i in range(50)]}), tmp_path / "t.parquet")
    files = {dpsql.session.__file__, dpsql.charge.__file__, dpsql.groupings.__file__}
    n, named = 0, dict[str, int]()
    with dpsql.Session(ledger=str(tmp_path / "l.duckdb"), budget=dpsql.Budget(1e6), create=True) as s:
        s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", columns={"g": {"domain": [0, 1, 2]}})
        while True:
            n += 1
            before = s.history().num_rows
            tracer = stepped_signal(n, files)
            answered = None
            sys.settrace(tracer)
            try:
                s.query(sql, epsilon=1)
                answered = True
            except KeyboardInterrupt as e:
                sys.settrace(None)
                h = s.history().to_pylist()[before:]
                if h and h[0]["status"] == "released":  # the paid answer is never lost: the interrupt carries it
                    assert getattr(e, "release", None) is not None and e.release.ledger_id == h[0]["entry_id"], (n, h)
                    named["released"] = named.get("released", 0) + 1
                elif h:  # charged, nothing released: the entry is named as it is, and no answer comes with it
                    assert getattr(e, "ledger_entry", None) == (h[0]["entry_id"], h[0]["status"]), (n, h)
                    assert getattr(e, "release", None) is None, (n, h)
                    named[h[0]["status"]] = named.get(h[0]["status"], 0) + 1
                elif not h:
                    assert getattr(e, "ledger_entry", None) is None and getattr(e, "release", None) is None, n
            finally:
                sys.settrace(None)
            if answered and tracer.seen[0] < n:  # every point was tried
                break
    assert all(named.get(k, 0) >= 2 for k in ("reserved", "failed", "released")), named  # every window was reached
