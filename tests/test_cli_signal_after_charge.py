"""Ctrl-C or SIGTERM that arrives after a query was charged and released, while its answer is being
written, keeps the released answer.

The charge of such a query stands (its entry reads released), but the answer was only in memory: the
signal unwound the command, which removed the unwritten output files, and the paid release was lost (a
job runner's `timeout` or `docker stop` at that moment meant paying again for the same answer). It is
now saved as a failed write saves it (``.<ledger>.releases/entry-N-RANDOM/release.json``, rows and meta),
and the message says where; the exit code is still the signal's."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import child_env

from dpsql.cli import main

#: the signal arrives at ``HOOK`` of the command (the function is replaced by one that signals first)
PROBE = """
import os, signal, sys
from dpsql import cli

sig, hook = getattr(signal, sys.argv[1]), sys.argv[2]
real = getattr(cli, hook)

def signalled(*a, **k):
    os.kill(os.getpid(), sig)
    for _ in range(10**6):  # the handler raises here
        pass
    return real(*a, **k)

setattr(cli, hook, signalled)
sys.exit(cli.main(sys.argv[3:]))
"""


def _init(cwd: Path) -> None:
    """A fresh ledger in ``cwd`` (created in this process: only the signalled commands need one of their own)."""
    assert main(["--ledger", str(cwd / "l.duckdb"), "init", "--epsilon", "10"]) == 0


@pytest.fixture
def data(tmp_path: Path) -> Path:
    pq.write_table(pa.table({"uid": list(range(200))}), tmp_path / "t.parquet")
    _init(tmp_path)
    return tmp_path


def _run(cwd: Path, sig: str, hook: str, *out: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE), sig, hook, "--ledger", "l.duckdb", "--table",
                           "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "1",
                           *out], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)


def _entries(cwd: Path) -> list[dict[str, object]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--ledger", str(cwd / "l.duckdb"), "budget", "--history", "--format", "json"])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())["entries"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("out", [[], ["-o", "rows.csv", "--meta", "meta.json"]])
def test_a_signal_while_the_answer_is_written_keeps_the_release(data: Path, sig: str, out: list[str]) -> None:
    p = _run(data, sig, "_write_release", *out)
    assert p.returncode == 128 + getattr(signal, sig), p.stderr
    assert "a charge already made stands" in p.stderr and "unexpected" not in p.stderr, p.stderr
    [entry] = _entries(data)
    assert entry["status"] == "released"
    saved = list(data.glob(".l.duckdb.releases/entry-1-*/release.json"))
    assert len(saved) == 1, p.stderr
    assert str(saved[0].parent) in p.stderr and "running the query again would charge again" in p.stderr
    kept = json.loads(saved[0].read_text())
    assert len(kept["rows"]) == 1 and "n" in kept["rows"][0] and kept["meta"]["ledger_id"] == 1
    assert not (data / "rows.csv").exists() and not list(data.glob(".rows.csv.dpsql-*"))


#: as PROBE, and a second signal as the release is being saved (Ctrl-C pressed twice, a job runner's SIGTERM
#: repeated): the process's other threads (DuckDB's workers) do not block it, so Python's handler ran in the
#: middle of the save whatever the main thread's signal mask, and the release was lost after all
TWICE = PROBE.replace("setattr(cli, hook, signalled)", """setattr(cli, hook, signalled)
from dpsql import _output
saving = _output.rescue

def signalled_again(*a, **k):
    os.kill(os.getpid(), sig)
    for _ in range(10**6):
        pass
    return saving(*a, **k)

_output.rescue = signalled_again""")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_second_signal_while_the_release_is_saved_waits_for_the_save(data: Path, sig: str) -> None:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(TWICE), sig, "_write_release", "--ledger", "l.duckdb",
                        "--table", "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
                        "--epsilon", "1"], cwd=data, env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 128 + getattr(signal, sig), p.stderr
    saved = list(data.glob(".l.duckdb.releases/entry-1-*/release.json"))
    assert len(saved) == 1, p.stderr
    assert str(saved[0].parent) in p.stderr and json.loads(saved[0].read_text())["meta"]["ledger_id"] == 1


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_charged_caps_advice_is_written_keeps_it(data: Path, sig: str) -> None:
    """suggest-caps is charged too: its answer, cut short by a signal while it was printed, is kept likewise."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE), sig, "_format_table", "--ledger", "l.duckdb",
                        "--table", "t=t.parquet", "--privacy-unit", "t=uid", "suggest-caps", "t", "--epsilon", "1"],
                       cwd=data, env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 128 + getattr(signal, sig), p.stderr
    [entry] = _entries(data)
    saved = list(data.glob(f".l.duckdb.releases/entry-{entry['entry_id']}-*/release.json"))
    assert len(saved) == 1, p.stderr
    assert str(saved[0].parent) in p.stderr and "running the query again would charge again" in p.stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_before_the_charge_keeps_nothing(data: Path, sig: str) -> None:
    """Negative control: interrupted before the query ran, nothing was charged and nothing is saved."""
    p = _run(data, sig, "_check_output_targets", "-o", "rows.csv")
    assert p.returncode == 128 + getattr(signal, sig), p.stderr
    assert _entries(data) == [] and not (data / ".l.duckdb.releases").exists()
    assert "saved" not in p.stderr


#: Ctrl-C at ``argv[1]`` of the release's write transaction (the one after the charge's; ``before_marker``: just after
#: its COMMIT, ``before_commit``: just before it, ``none``: no signal), zero noise so that two runs agree
AT_RELEASE = """
import os, signal, sys
from dpsql import cli
from dpsql.ledger import _store
from dpsql.testing import use_noise, zero_noise

point, charged, sent = sys.argv[1], [], []
opened = cli._open_session

def opening(args):
    s = opened(args)
    use_noise(s, zero_noise())
    return s

def committed(path):  # after a write's COMMIT: the first is the charge's, the second the release's
    charged.append(path)
    if point == "before_marker" and len(charged) == 2:
        sigint()

def committing(path):  # before a transaction's COMMIT: the first after the charge's is the release's
    if point == "before_commit" and charged and not sent:
        sigint()

def sigint():
    sent.append(True)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # (Python's handler would run here, were Ctrl-C not held back by the ledger)
        pass

cli._open_session = opening
_store._HOOKS.update(before_marker=committed, before_commit=committing)
sys.exit(cli.main(sys.argv[2:]))
"""

COMMANDS = {"query": ["query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "1", "--format", "json"],
            "workload": ["query", "--workload", "SELECT COUNT(*) FROM t WHERE uid BETWEEN 0 AND 9; SELECT COUNT(*) FROM t "
                         "WHERE uid BETWEEN 10 AND 99", "--epsilon", "1", "--format", "json"],
            "rollup": ["query", "SELECT g, COUNT(*) AS n FROM t GROUP BY ROLLUP (g)", "--epsilon", "1", "--format", "json"],
            "suggest-caps": ["suggest-caps", "t", "--epsilon", "1", "--format", "json"]}


def _at_release(cwd: Path, point: str, command: str, *out: str, sig: str = "SIGINT") -> subprocess.CompletedProcess[str]:
    cfg = cwd / "owner.toml"
    cfg.write_text('[ledger]\npath = "l.duckdb"\n[tables.t]\nsource = "t.parquet"\nprivacy_unit = "uid"\n'
                   '[tables.t.columns.g]\ndomain = [0, 1, 2]\n[tables.t.columns.uid]\nbounds = [0, 199]\nbins = 200\n')
    probe = textwrap.dedent(AT_RELEASE).replace("signal.SIGINT", f"signal.{sig}")
    return subprocess.run([sys.executable, "-c", probe, point, "--config", str(cfg),
                           *COMMANDS[command], *out], cwd=cwd, env=child_env(), capture_output=True, text=True,
                          timeout=120)


def _grouped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("g")
    pq.write_table(pa.table({"uid": list(range(200)), "g": [i % 3 for i in range(200)]}), d / "t.parquet")
    _init(d)
    return d


@pytest.fixture
def grouped(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    return lambda: _grouped(tmp_path_factory)


@pytest.fixture(scope="module")
def uncut(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], object]:
    """What ``command`` prints run without a signal on a fresh ledger (zero noise: the same on every run), run once a
    command for the whole module."""
    printed: dict[str, object] = {}

    def answer(command: str) -> object:
        if command not in printed:
            q = _at_release(_grouped(tmp_path_factory), "none", command)
            assert q.returncode == 0, q.stderr
            printed[command] = json.loads(q.stdout)
        return printed[command]
    return answer


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("out", [[], ["-o", "rows.json", "--meta", "meta.json"]])
def test_ctrl_c_while_the_ledger_records_the_release_keeps_the_answer(grouped: Callable[[], Path],
                                                                      uncut: Callable[[str], object], command: str,
                                                                      out: list[str]) -> None:
    """Ctrl-C held back by the ledger while it wrote the release, raised just after its COMMIT: the entry reads
    released and the answer was lost (exit 130, nothing kept). It is now saved as after a failed write, and the saved
    release.json is what the command would have printed (a run without the signal, on a fresh ledger, zero noise)."""
    if command == "suggest-caps" and out:
        pytest.skip("suggest-caps writes to standard output only")
    cut = grouped()
    p = _at_release(cut, "before_marker", command, *out)
    assert p.returncode == 130, p.stderr
    assert "interrupted: a charge already made stands" in p.stderr and "unexpected" not in p.stderr, p.stderr
    [entry] = _entries(cut)
    assert entry["status"] == "released" and entry["epsilon"] == 1  # charged once
    saved = list(cut.glob(".l.duckdb.releases/entry-1-*/release.json"))
    assert len(saved) == 1, p.stderr
    assert str(saved[0].parent) in p.stderr and "running the query again would charge again" in p.stderr
    assert not (cut / "rows.json").exists() and not (cut / "meta.json").exists() and not list(cut.glob(".*.json.dpsql-*"))
    assert json.loads(saved[0].read_text()) == uncut(command)


@pytest.mark.parametrize("command", ["query", "suggest-caps"])
def test_ctrl_c_that_rolls_the_release_back_keeps_nothing(grouped: Callable[[], Path], command: str) -> None:
    """Negative control: Ctrl-C raised just before the release's COMMIT rolls it back: the entry stays reserved
    (counted), nothing was released, nothing is saved."""
    d = grouped()
    p = _at_release(d, "before_commit", command)
    assert p.returncode == 130, p.stderr
    assert [e["status"] for e in _entries(d)] == ["reserved"]
    assert not (d / ".l.duckdb.releases").exists() and "saved" not in p.stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_while_the_ledger_records_the_release_keeps_the_answer(grouped: Callable[[], Path],
                                                                                 uncut: Callable[[str], object],
                                                                                 sig: str) -> None:
    """A job runner's SIGTERM (or a hang-up) at the release's COMMIT was not held back as Ctrl-C is: landing just after
    the COMMIT, the entry read released and the answer was lost. It is held and raised as Ctrl-C is: the answer is
    saved (what a run without the signal prints), and the exit is the signal's."""
    cut = grouped()
    p = _at_release(cut, "before_marker", "query", sig=sig)
    assert p.returncode == 128 + getattr(signal, sig), p.stderr
    assert "a charge already made stands" in p.stderr and "unexpected" not in p.stderr, p.stderr
    [entry] = _entries(cut)
    assert entry["status"] == "released" and entry["epsilon"] == 1
    saved = list(cut.glob(".l.duckdb.releases/entry-1-*/release.json"))
    assert len(saved) == 1, p.stderr
    assert str(saved[0].parent) in p.stderr and "running the query again would charge again" in p.stderr
    assert json.loads(saved[0].read_text()) == uncut("query")


def test_sigterm_that_rolls_the_release_back_keeps_nothing(grouped: Callable[[], Path]) -> None:
    """Negative control: SIGTERM just before the release's COMMIT, held back and raised there, rolls it back."""
    d = grouped()
    p = _at_release(d, "before_commit", "query", sig="SIGTERM")
    assert p.returncode == 143, p.stderr
    assert [e["status"] for e in _entries(d)] == ["reserved"]
    assert not (d / ".l.duckdb.releases").exists() and "saved" not in p.stderr


#: as PROBE, the signal at the hook's first call only (a signal comes once)
ONCE = PROBE.replace("def signalled(*a, **k):\n    os.kill", "def signalled(*a, **k):\n    if sent:\n        return real(*a, **k)\n    sent.append(1)\n    os.kill").replace(
    "real = getattr(cli, hook)", "real, sent = getattr(cli, hook), []")


@pytest.mark.parametrize("hook", ["_remaining_after", "_charged"])
def test_a_signal_once_caps_advice_is_charged_before_it_is_printed_keeps_it(data: Path, hook: str) -> None:
    """suggest-caps read the remaining budget (a ledger read, which waits for a busy ledger) and closed its Session
    after the charge but outside the part that keeps the answer: a signal there lost the paid advice, and the
    message ('ledger entry N, released, counted') did not say so."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(ONCE), "SIGTERM", hook, "--ledger", "l.duckdb",
                        "--table", "t=t.parquet", "--privacy-unit", "t=uid", "suggest-caps", "t", "--epsilon", "1"],
                       cwd=data, env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    [entry] = _entries(data)
    assert entry["status"] == "released"
    saved = list(data.glob(f".l.duckdb.releases/entry-{entry['entry_id']}-*/release.json"))
    assert len(saved) == 1, p.stderr
    assert str(saved[0].parent) in p.stderr and "unexpected" not in p.stderr, p.stderr


def test_a_signal_as_a_query_is_noted_charged_keeps_its_answer(data: Path) -> None:
    """As above for query: between its answer and the part that writes it, a signal lost the answer."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(ONCE), "SIGTERM", "_charged", "--ledger", "l.duckdb", "--table",
                        "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "1"],
                       cwd=data, env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    [entry] = _entries(data)
    saved = list(data.glob(f".l.duckdb.releases/entry-{entry['entry_id']}-*/release.json"))
    assert len(saved) == 1 and str(saved[0].parent) in p.stderr, p.stderr
    assert "answer was lost" not in p.stderr, p.stderr


def test_a_signal_as_the_progress_spinner_stops_keeps_the_answer(data: Path) -> None:
    """The answer returned, the signal as the command left its spinner's block (still inside the call's try): the
    interrupt carried no answer, and the paid one was lost."""
    probe = ONCE.replace("real, sent = getattr(cli, hook), []", "real, sent = cli._Progress.__exit__, []").replace(
        "setattr(cli, hook, signalled)", "cli._Progress.__exit__ = signalled")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(probe), "SIGTERM", "-", "--ledger", "l.duckdb", "--table",
                        "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "1"],
                       cwd=data, env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    [entry] = _entries(data)
    assert entry["status"] == "released"
    saved = list(data.glob(f".l.duckdb.releases/entry-{entry['entry_id']}-*/release.json"))
    assert len(saved) == 1 and str(saved[0].parent) in p.stderr, p.stderr
