"""Adversarial probes of the budget ledger across processes, files, servers and the command line.

What an analyst or a careless operator can do to the ledger: race N processes at the end of a
budget with float charges whose float sum differs from their decimal sum, kill a ``dpsql query``
between its charge and its release, point ``--ledger`` at something that is not a ledger (a
SQLite, CSV or Parquet file, a damaged copy, an empty string), run the PostgreSQL ledger on a
server with unusual settings, and compare what a refusal or a failure after the charge shows on
neighbouring datasets. Each test states the promise it checks; the ones that found a break were
fixed in the same change (the test then passes, with a negative control where one makes sense).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import child_env, run_cli, run_together, spawn_python

import dpsql
from dpsql.budget import Budget, exact
from dpsql.errors import BudgetExceededError, DPSQLError, ExecutionError, LedgerError
from dpsql.ledger import Ledger, _store
from dpsql.testing import use_noise, zero_noise

REPO = Path(__file__).resolve().parents[1]


def _reserve(led: Ledger, cost: Budget) -> int:
    return led.reserve(cost, mechanism="m", query="q", tables=["t"], params={})


# --- 1. N processes at the end of the budget, float charges whose float sum is not their decimal sum ------

RACER = """
import json, sys
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError
from dpsql.ledger import Ledger

path, offset = sys.argv[1], int(sys.argv[2])
costs = [(0.2, 1e-7), (0.4, 0.0), (0.1 + 0.2, 2e-7), (0.3, 1e-7), (0.1, 0.0), (1e-300, 0.0)]
led = Ledger.open(path, lock_timeout=60.0)
print("ready", flush=True)
sys.stdin.readline()
ok, refused, other = [], [], []
for i in range(6):
    eps, delta = costs[(i + offset) % len(costs)]
    try:
        ok.append([led.reserve(Budget(eps, delta), mechanism="m", query="q", tables=["t"], params={}), eps, delta])
    except BudgetExceededError:
        refused.append([eps, delta])
    except Exception as e:  # noqa: BLE001 - reported to the parent
        other.append(f"{type(e).__name__}: {e}")
print(json.dumps({"ok": ok, "refused": refused, "other": other}), flush=True)
"""


def test_racing_processes_at_the_budget_end_never_overspend_and_never_refuse_what_fits(tmp_path: Path) -> None:
    """4 processes x 6 charges of mixed sizes against (1.0, 5e-7): the exact decimal sum of what was
    charged never exceeds the total, every refused request exceeds what is left at the end (spent
    only grows, so it did not fit when refused either), ids are 1..n without gaps or duplicates."""
    path = tmp_path / "l.duckdb"
    Ledger.create(path, Budget(1.0, 5e-7)).close()
    results = run_together([spawn_python(RACER, str(path), str(k)) for k in range(4)])
    assert [r["other"] for r in results] == [[]] * 4
    ok = [tuple(x) for r in results for x in r["ok"]]
    refused = [tuple(x) for r in results for x in r["refused"]]
    assert sorted(i for i, _, _ in ok) == list(range(1, len(ok) + 1))
    spent_e = sum((exact(e) for _, e, _ in ok), Fraction(0))
    spent_d = sum((exact(d) for _, _, d in ok), Fraction(0))
    assert spent_e <= 1 and spent_d <= Fraction("5e-7")
    assert refused, "the budget must run out in this race"
    for e, d in refused:
        assert spent_e + exact(e) > 1 or spent_d + exact(d) > Fraction("5e-7"), (e, d)
    led = Ledger.open(path)
    assert led.spent() == Budget.from_exact(spent_e, spent_d)
    # what makes the "never refuse what fits" half able to fail: a ledger adding floats would find
    # 0.2 + 0.4 + 0.3 + 0.1 over a total of 1.0 (and 0.1 + 0.2 over 0.3)
    assert 0.2 + 0.4 + 0.3 + 0.1 > 1.0 and exact(0.2) + exact(0.4) + exact(0.3) + exact(0.1) == 1
    assert 0.1 + 0.2 > 0.3 and exact(0.1) + exact(0.2) == exact(0.3)


LOWERER = """
import json, sys
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, ConfigError
from dpsql.ledger import Ledger

path, role = sys.argv[1], sys.argv[2]
led = Ledger.open(path, lock_timeout=60.0)
print("ready", flush=True)
sys.stdin.readline()
done, refused, other = [], [], []
for i in range(8):
    try:
        if role == "spend":
            led.reserve(Budget(0.1 + 0.2 if i % 2 else 0.1), mechanism="m", query="q", tables=["t"], params={})
            done.append(0.1 + 0.2 if i % 2 else 0.1)
        else:
            new = [1.9, 1.7, 1.5, 1.3, 1.1, 0.9, 0.7, 0.6][i]
            led.set_total(Budget(new), reason=f"lower {i}")
            done.append(new)
    except (BudgetExceededError, ConfigError):
        refused.append(0.1 + 0.2 if role == "spend" and i % 2 else 0.1 if role == "spend" else [1.9, 1.7, 1.5, 1.3, 1.1, 0.9, 0.7, 0.6][i])
    except Exception as e:  # noqa: BLE001 - reported to the parent
        other.append(f"{type(e).__name__}: {e}")
print(json.dumps({"done": done, "refused": refused, "other": other}), flush=True)
"""


def test_lowering_the_total_while_others_spend_never_goes_below_what_is_spent(tmp_path: Path) -> None:
    """Two spenders and one owner lowering the total concurrently: in the end spent <= total
    (exactly), every refused set_total is below what is spent, and every refused charge does not
    fit what is left (the total only went down and spending only up after each refusal)."""
    path = tmp_path / "l.duckdb"
    Ledger.create(path, Budget(2.0)).close()
    res = run_together([spawn_python(LOWERER, str(path), role) for role in ("spend", "spend", "lower")])
    assert [r["other"] for r in res] == [[]] * 3
    led = Ledger.open(path)
    spent = sum((exact(c) for r in res[:2] for c in r["done"]), Fraction(0))
    total = exact(led.total().epsilon)
    assert spent <= total and led.spent() == Budget.from_exact(spent, Fraction(0))
    assert all(exact(t) < spent for t in res[2]["refused"])
    assert all(spent + exact(c) > total for r in res[:2] for c in r["refused"])
    assert led.totals_history().num_rows == 1 + len(res[2]["done"])
    from dpsql.errors import ConfigError

    below = math.nextafter(float(spent), 0.0) if exact(float(spent)) >= spent else float(spent)
    while exact(below) >= spent:
        below = math.nextafter(below, 0.0)
    with pytest.raises(ConfigError, match="already spent"):  # and afterwards, one ulp below what is spent
        led.set_total(Budget(below), reason="below")


# --- 2. kill -9 / Ctrl-C of `dpsql query` between its charge and its release ---------------------------

KILLER = """
import os, signal, sys
from dpsql.ledger import _store
from dpsql.cli import main

when, sig = sys.argv[1], getattr(signal, sys.argv[2])
state = {"writes": 0}

def checkpoint(path):
    state["writes"] += 1
    if when == "wal_only":  # the charge is committed to the WAL, not yet in the main file
        os.kill(os.getpid(), sig)

def detached(path):
    if when == "after_reserve" and state["writes"] == 1:  # the charge is durable, no row read yet
        state["writes"] += 1
        os.kill(os.getpid(), sig)

_store._HOOKS["before_checkpoint"] = checkpoint
_store._HOOKS["after_detach"] = detached
sys.exit(main(sys.argv[3:]))
"""


def _cli(argv: list[str], cwd: Path, capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``dpsql ARGV`` run from ``cwd`` in this process (``main``, as the command calls it), for the
    commands whose claim is not about a process of their own. Log records of WARNING and above go
    to stderr, as in a process of its own (Python's last-resort handler)."""
    capsys.readouterr()
    old = os.getcwd()
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    os.chdir(cwd)
    try:
        rc = run_cli(argv)
    finally:
        os.chdir(old)
        logging.getLogger().removeHandler(handler)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, out.out, out.err)


@pytest.mark.parametrize(("when", "sig"), [("wal_only", "SIGKILL"), ("after_reserve", "SIGKILL"),
                                           ("after_reserve", "SIGINT"), ("after_reserve", "SIGTERM")])
def test_killed_query_keeps_its_charge_and_releases_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            when: str, sig: str) -> None:
    """The query is killed in a process of its own; the ledger is then read and used from this one."""
    shutil.copy(REPO / "examples" / "events.parquet", tmp_path / "events.parquet")
    flags = ["--table", "e=events.parquet", "--privacy-unit", "e=user_id", "--ledger", "l.duckdb"]
    assert _cli([*flags, "init", "--epsilon", "1", "--delta", "0"], tmp_path, capsys).returncode == 0
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLER), when, sig, *flags, "query",
                        "SELECT COUNT(*) AS n FROM e", "--epsilon", "0.25"],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    if sig == "SIGKILL":
        assert p.returncode == -signal.SIGKILL, p.stderr
    else:  # Ctrl-C, or a job runner's SIGTERM (it used to end the process without a word)
        assert p.returncode == 128 + getattr(signal, sig) and "a charge already made stands" in p.stderr, p.stderr
    assert p.stdout == ""  # nothing released
    b = _cli([*flags, "budget", "--history", "--format", "json"], tmp_path, capsys)
    assert b.returncode == 0, b.stderr
    got = json.loads(b.stdout)
    assert got["spent"]["epsilon"] == 0.25  # the charge stands
    assert [e["status"] in ("reserved", "failed") for e in got["entries"]] == [True]
    q = _cli([*flags, "query", "SELECT COUNT(*) AS n FROM e", "--epsilon", "0.75", "--format", "json"], tmp_path, capsys)
    assert q.returncode == 0, q.stderr  # the ledger still works; 0.25 + 0.75 is exactly the total
    assert json.loads(q.stdout)["meta"]["remaining"]["epsilon"] == 0.0
    again = _cli([*flags, "query", "SELECT COUNT(*) AS n FROM e", "--epsilon", "0.01"], tmp_path, capsys)
    assert again.returncode == 3 and "nothing was charged" in again.stderr  # negative control: it is spent


# --- 3. a ledger path that names something else: another storage engine, a damaged file ------------------


def _sqlite_ledger_lookalike(path: Path) -> None:
    con = sqlite3.connect(path)
    for t in ("ledger_meta", "ledger_totals", "ledger_entries"):
        con.execute(f"CREATE TABLE {t} (x)")
    con.commit()
    con.close()


def test_sqlite_csv_or_parquet_file_as_ledger_is_refused_as_not_duckdb(tmp_path: Path) -> None:
    """Finding (fixed): ATTACH without a type let DuckDB pick the storage from the file: a SQLite
    file made it install and load its SQLite extension (a download from the network; a SQLite file
    with the ledger's tables would have been accepted as a ledger), and a CSV or Parquet path failed
    with "Cannot launch in-memory database in read-only mode!". Now every such file is refused as
    "not a DuckDB database file", untouched, and no extension is ever loaded."""
    files = {"sqlite": tmp_path / "budget.sqlite", "csv": tmp_path / "budget.csv", "parquet": tmp_path / "b.parquet"}
    _sqlite_ledger_lookalike(files["sqlite"])
    files["csv"].write_text("a,b\n1,2\n")
    pq.write_table(pa.table({"a": [1]}), files["parquet"])
    for kind, f in files.items():
        before = f.read_bytes()
        with pytest.raises(LedgerError) as e:
            Ledger.open(f)
        msg = str(e.value)
        assert "not a DuckDB database file" in msg, (kind, msg)
        assert "extension" not in msg.lower() and "read-only mode" not in msg, (kind, msg)
        assert f.read_bytes() == before
    loaded = _store._base_connection().execute(
        "SELECT extension_name FROM duckdb_extensions() WHERE loaded AND extension_name = 'sqlite_scanner'").fetchall()
    assert loaded == []
    # negative control: an ATTACH without a type picks the SQLite storage for such a file (here with
    # autoinstall off, so DuckDB only says it lacks the extension and never tries to download it)
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        con.execute(f"ATTACH '{files['sqlite']}' AS x")
        picked = "attached"
    except duckdb.Error as err:
        picked = str(err)
    finally:
        con.close()
    assert "sqlite" in picked.lower() or picked == "attached", picked  # attached: the extension is installed


def test_named_pipe_or_device_as_ledger_is_refused_at_once(tmp_path: Path) -> None:
    """Finding (fixed): `--ledger PATH` naming a FIFO hung forever in open(2) (waiting for a writer),
    past lock_timeout; /dev/null and /dev/zero were "an empty file", a directory "Is a directory"
    with a hint about permissions and disk space. Each is now refused at once by what it is."""
    fifo = tmp_path / "ledger.fifo"
    os.mkfifo(fifo)
    paths = {str(fifo): "a named pipe", "/dev/zero": "a device", str(tmp_path): "a directory"}
    # one process runs `dpsql --ledger PATH budget` for each (its time-out catches a hang in open(2))
    script = """
        import contextlib, io, json, sys, time
        from dpsql.cli import main
        out = []
        for path in sys.argv[1:]:
            err, start = io.StringIO(), time.monotonic()
            with contextlib.redirect_stderr(err):
                rc = main(["--ledger", path, "budget"])
            out.append([rc, err.getvalue(), time.monotonic() - start])
        print(json.dumps(out))
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *paths], cwd=tmp_path, env=child_env(),
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    for (rc, err, took), kind in zip(json.loads(p.stdout.strip().splitlines()[-1]), paths.values(), strict=True):
        assert rc == 4 and f"is not a dpsql budget ledger: it is {kind}" in err, err
        assert took < 30
    assert not any(tmp_path.glob(".ledger.fifo.q-*"))  # the waiting queue left nothing behind
    # nor its tail file ("nothing was changed"): as root, `--ledger /dev/null` left /dev/.null.queue
    assert not any(tmp_path.glob(".ledger.fifo*")) and not (tmp_path.parent / f".{tmp_path.name}.queue").exists()


def test_damaged_ledger_names_the_damage_and_the_restore(tmp_path: Path) -> None:
    """Finding (fixed): a truncated or checksum-damaged ledger was reported with the hint "check the
    path, the file permissions and free disk space". Now it says the file is damaged and to restore
    it from a backup; nothing is changed and other ledgers of the process keep working."""
    good = tmp_path / "good.duckdb"
    led = Ledger.create(good, Budget(1.0))
    for _ in range(3):
        _reserve(led, Budget(0.1))
    data = good.read_bytes()
    flipped = bytearray(data)
    flipped[4096:4160] = bytes(b ^ 0xFF for b in flipped[4096:4160])
    for name, content in (("truncated", data[: len(data) // 2]), ("short", data[:12288]), ("flipped", bytes(flipped))):
        p = tmp_path / f"{name}.duckdb"
        p.write_bytes(content)
        with pytest.raises(LedgerError) as e:
            _reserve(Ledger(str(p)), Budget(0.1))
        assert "is damaged" in e.value.message and "restore the ledger from a backup" in (e.value.hint or ""), name
        assert "nothing was charged" in e.value.message
        assert p.read_bytes() == content
    assert Ledger.open(good).spent() == Budget(0.3)  # negative control: the intact copy opens


def test_read_only_ledger_reads_and_refuses_charges_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger on a read-only mount: `budget` and `explain` work, `query` is a LedgerError (exit 4)
    that names the file system, nothing is charged and nothing next to the ledger changes."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare for a read-only bind mount")
    src, mnt = tmp_path / "data", tmp_path / "ro"
    shutil.copytree(REPO / "examples", src, ignore=shutil.ignore_patterns("*.duckdb*"))
    mnt.mkdir()
    assert _cli(["--config", str(src / "dpsql.toml"), "budget"], tmp_path, capsys).returncode == 0  # creates it
    before = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    script = textwrap.dedent(f"""
        mount --bind -o ro {src} {mnt} || exit 99
        cd {tmp_path}
        py="{sys.executable} -m dpsql.cli --config {mnt}/dpsql.toml"
        $py budget --format json > budget.out 2> budget.err; echo "budget $?" > rc
        $py explain "SELECT COUNT(*) AS n FROM events" --epsilon 0.1 > explain.out 2>&1; echo "explain $?" >> rc
        $py query "SELECT COUNT(*) AS n FROM events" --epsilon 0.1 > query.out 2> query.err; echo "query $?" >> rc
    """)
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], env=child_env(), capture_output=True, text=True, timeout=120)
    if r.returncode == 99 or not (tmp_path / "rc").exists():
        pytest.skip(f"no read-only bind mount here: {r.stderr[:200]}")
    rc = dict(line.split() for line in (tmp_path / "rc").read_text().splitlines())
    assert rc == {"budget": "0", "explain": "0", "query": "4"}, (rc, (tmp_path / "query.err").read_text())
    assert json.loads((tmp_path / "budget.out").read_text())["spent"]["epsilon"] == 0.0
    err = (tmp_path / "query.err").read_text()
    assert "Read-only file system" in err and "nothing was charged" in err
    assert (tmp_path / "query.out").read_text() == ""
    assert {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()} == before
    # negative control: the same command on the writable path charges
    assert _cli(["--config", str(src / "dpsql.toml"), "query", "SELECT COUNT(*) AS n FROM events",
                 "--epsilon", "0.1"], tmp_path, capsys).returncode == 0
    assert Ledger.open(src / "example_ledger.duckdb").spent() == Budget(0.1)


def test_adjacent_doubles_are_grouped_apart_in_the_budget_check(tmp_path: Path) -> None:
    """The budget check sums counted charges grouped by value in SQL (``Ledger._spent_counts``): two
    charges one ulp apart (0.1 and the next double; 0.30000000000000004 and 0.3; 5e-324 and 0) must
    stay apart, and the grouped exact sum must equal the entry-by-entry exact sum, as Fractions."""
    from dpsql.budget import _exact_counted_sums

    vals = [0.1, math.nextafter(0.1, 1.0), 0.1 + 0.2, 0.3, 5e-324, 0.0]
    path = tmp_path / "l.duckdb"
    Ledger.create(path, Budget(100.0, 0.0)).close()
    con = duckdb.connect(str(path))
    con.register("v", pa.table({"i": np.arange(300), "e": np.array(vals * 50),
                                "d": np.array([1e-9, math.nextafter(1e-9, 1.0)] * 150)}))
    con.execute("INSERT INTO ledger_entries (entry_id, created_at, updated_at, status, mechanism, epsilon, delta, "
                "query, tables, params) SELECT i + 1, now(), now(), 'released', 'm', e, d, 'q', ['t'], '{}' FROM v")
    con.close()
    led = Ledger.open(path)
    with led._txn(write=False) as (c, _t):
        groups, next_id = led._spent_counts(c)
    assert next_id == 301 and len(groups) == 6  # 6 distinct (epsilon, delta) pairs (value i has delta i % 2)
    want = (sum((exact(v) for v in vals), Fraction(0)) * 50,
            sum((exact(d) for d in [1e-9, math.nextafter(1e-9, 1.0)]), Fraction(0)) * 150)
    assert _exact_counted_sums(groups) == want
    # negative control: merging the neighbours (as a tolerance or a rounding would) changes the sum
    merged = [(Budget(round(b.epsilon, 12), round(b.delta, 15)), n) for b, n in groups]
    assert _exact_counted_sums(merged) != want


# --- 4. budget arithmetic at the edges ------------------------------------------------------------------


def test_reported_remaining_is_always_spendable() -> None:
    """Finding (fixed): remaining() rounded the exact remainder to the nearest float, so after a
    charge of 1e-20 out of 1.0 it reported 1.0 left and then refused a request of 1.0 with the
    self-contradicting "needs (epsilon=1.0) but has (epsilon=1.0) remaining" (and "exceeded
    (budget)", naming neither coordinate). remaining() now rounds down: its value always fits."""
    led = Ledger.create(None, Budget(1.0, 1e-5))
    _reserve(led, Budget(1e-20, 1e-30))
    left = led.remaining()
    assert exact(left.epsilon) <= 1 - Fraction("1e-20") and exact(left.delta) <= Fraction("1e-5") - Fraction("1e-30")
    with pytest.raises(BudgetExceededError, match=r"exceeded \(epsilon\)"):  # negative control: one ulp more
        _reserve(led, Budget(math.nextafter(left.epsilon, 2.0), 0.0))
    _reserve(led, left)  # exactly what was reported
    again = led.remaining()  # 1 - 1e-20 - 0.9999999999999999 = 9.999e-17 (as decimals), never more
    assert exact(again.epsilon) <= 1 - Fraction("1e-20") - exact(left.epsilon)
    _reserve(led, again)
    with pytest.raises(BudgetExceededError, match=r"exceeded \(epsilon\)"):
        _reserve(led, Budget(1e-300, 0.0))


def test_remaining_of_plain_decimals_is_unchanged() -> None:
    led = Ledger.create(None, Budget(1.0, 1e-5))
    for _ in range(3):
        _reserve(led, Budget(0.1, 1e-7))
    assert repr(led.remaining()) == "Budget(epsilon=0.7, delta=9.7e-06)"


def test_negative_zero_is_recorded_as_zero() -> None:
    """Finding (fixed, cosmetic): `--delta -0` was accepted and recorded as -0.0 ("delta=-0" in the
    cost line and the history)."""
    led = Ledger.create(None, Budget(1.0, -0.0))
    e = _reserve(led, Budget(0.5, -0.0))
    for v in (led.total().delta, led.entry(e).cost.delta, Budget(-0.0, 0.0).epsilon):
        assert math.copysign(1.0, v) == 1.0
    assert str(led.entry(e).cost) == "(epsilon=0.5, delta=0)"


# --- 5. the command line: an empty --ledger or $DPSQL_LEDGER ----------------------------------------------


def test_empty_ledger_flag_or_variable_is_refused_not_replaced_by_the_default(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding (fixed): `--ledger "$UNSET"` (an empty string) was ignored, so the query charged the
    default ./dpsql_ledger.duckdb (or $DPSQL_LEDGER); an empty $DPSQL_LEDGER became the working
    directory ("Is a directory") or a Python-worded "pass ... or None". Both are now usage errors
    (exit 2) naming the flag or variable, and nothing is charged anywhere."""
    flags = ["--table", "e=examples/events.parquet", "--privacy-unit", "e=user_id"]
    assert run_cli([*flags, "--ledger", "dpsql_ledger.duckdb", "init", "--epsilon", "1"]) == 0
    capsys.readouterr()
    query = ["query", "SELECT COUNT(*) AS n FROM e", "--epsilon", "0.5"]
    assert run_cli([*flags, "--ledger", "", *query]) == 2
    assert "--ledger is empty" in capsys.readouterr().err
    monkeypatch.setenv("DPSQL_LEDGER", "")
    assert run_cli([*flags, *query]) == 2
    assert "$DPSQL_LEDGER is set but empty" in capsys.readouterr().err
    assert Ledger.open("dpsql_ledger.duckdb").spent() == Budget(0.0)
    monkeypatch.delenv("DPSQL_LEDGER")
    assert run_cli([*flags, *query]) == 0  # negative control: without the empty flag the default is charged
    assert Ledger.open("dpsql_ledger.duckdb").spent() == Budget(0.5)


def test_invalid_budget_hints_speak_in_flags(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): `query --epsilon 0` and `budget --set-total -1 0` answered with the Python
    hint "pass a positive epsilon, e.g. epsilon=1.0" (and --set-total, which accepts 0, said "> 0")."""
    cfg = ["--config", "examples/dpsql.toml"]
    assert run_cli([*cfg, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0"]) == 2
    err = capsys.readouterr().err
    assert "e.g. --epsilon 1.0" in err and "epsilon=1.0" not in err
    assert run_cli([*cfg, "budget"]) == 0  # creates the example ledger
    capsys.readouterr()
    assert run_cli([*cfg, "budget", "--set-total", "-1", "0", "--reason", "r"]) == 2
    err = capsys.readouterr().err
    assert "--set-total needs a finite EPSILON >= 0" in err and "e.g. --set-total 10 1e-5" in err
    assert Ledger.open("examples/example_ledger.duckdb").totals_history().num_rows == 1  # nothing changed


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("flag", ["-o", "--meta"])
def test_output_that_fails_after_the_charge_says_so(workdir: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """Finding (fixed): `-o /dev/full` (or --meta) passes the writability check before the charge and
    then fails to write: the command printed "error: unexpected OSError" (exit 1) without saying
    which output failed or that the charge stands. Now it names the output, the ledger entry and
    that the charge stands (exit 5, as any failure after the charge)."""
    argv = ["--config", "examples/dpsql.toml", "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1",
            flag, "/dev/full", *(["--format", "csv"] if flag == "-o" else [])]
    assert run_cli(argv) == 5
    err = capsys.readouterr().err
    assert f"writing {flag} '/dev/full' failed" in err and "charge stands (ledger entry 1)" in err, err
    assert "unexpected" not in err
    assert Ledger.open("examples/example_ledger.duckdb").spent() == Budget(0.1)  # charged: it was answered


def test_config_total_out_of_date_says_how_to_match_it(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): after `budget --set-total` the config's [ledger] total no longer matches and
    every command says "... but (epsilon=10.0, ...) was passed" with the hint "omit the total ... or
    change it with dpsql budget --set-total", which the user had just done. It now names the
    config's [ledger] values and the values to write there; nothing is charged meanwhile."""
    cfg = ["--config", "examples/dpsql.toml"]
    assert run_cli([*cfg, "budget"]) == 0  # creates the example ledger (create_if_missing)
    assert run_cli(["--ledger", "examples/example_ledger.duckdb", "budget", "--set-total", "20", "1e-5", "--reason",
                    "new quarter"]) == 0
    capsys.readouterr()
    assert run_cli([*cfg, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "the config's [ledger] says (epsilon=10.0, delta=1e-05)" in err and "was passed" not in err
    assert "set epsilon = 20.0 and delta = 1e-05 under [ledger]" in err
    assert Ledger.open("examples/example_ledger.duckdb").spent() == Budget(0.0)


# --- 6. what a refusal and a failure after the charge show, on neighbouring datasets ------------------------


def _events(with_person: bool) -> pa.Table:
    uid = np.repeat(np.arange(1, 61), 3)
    t = pa.table({"uid": uid, "x": (np.arange(len(uid)) % 10).astype(float), "s": ["a"] * len(uid)})
    if with_person:
        t = pa.concat_tables([t, pa.table({"uid": [999], "x": [7.0], "s": ["zq-sentinel-4417"]})])
    return t


def _parquet_session(root: Path, with_person: bool) -> tuple[dpsql.Session, Path]:
    root.mkdir(parents=True, exist_ok=True)
    src = root / "src.parquet"
    pq.write_table(_events(with_person), src)
    old = time.time() - 10
    os.utime(src, (old, old))
    s = dpsql.Session(None, Budget(1.0, 1e-6))
    use_noise(s, zero_noise())
    s.register("t", str(src), privacy_unit="uid", columns={"x": {"bounds": (0, 10)}})
    return s, src


def test_budget_refusal_reads_no_row_and_reads_the_same_on_neighbours(tmp_path: Path) -> None:
    outcomes = []
    for with_person in (False, True):
        s, _ = _parquet_session(tmp_path / str(with_person), with_person)
        reads: list[int] = []
        fetch = s._engine.fetch_arrow

        def counting(*a: Any, _fetch: Any = fetch, _reads: list[int] = reads, **k: Any) -> Any:
            _reads.append(1)
            return _fetch(*a, **k)

        s._engine.fetch_arrow = counting  # type: ignore[method-assign]
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.9)
        assert len(reads) == 1  # negative control: a charged query reads
        with pytest.raises(BudgetExceededError) as e:
            s.query("SELECT SUM(x) AS sx FROM t WHERE s = 'zq-sentinel-4417'", epsilon=0.2)
        assert len(reads) == 1  # the refusal read no private row
        outcomes.append((type(e.value).__name__, str(e.value), s.history().num_rows, str(s.ledger.spent())))
        s.close()
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("mutation", ["delete", "garbage"])
def test_source_lost_after_the_charge_is_the_generic_charged_failure_on_neighbours(tmp_path: Path, mutation: str) -> None:
    """The source file deleted or overwritten between the charge and the read: the same generic
    ExecutionError on D and D + one person, the entry marked failed with the constant reason, and
    the charge counted."""
    outcomes = []
    for with_person in (False, True):
        s, src = _parquet_session(tmp_path / str(with_person), with_person)
        # the in-memory ledger has no file hooks: charge a file ledger instead
        s._ledger = Ledger.create(tmp_path / f"{with_person}.duckdb", Budget(1.0, 1e-6))

        def lose(path: str, _src: Path = src) -> None:
            _store._HOOKS.pop("before_checkpoint", None)
            if mutation == "delete":
                _src.unlink()
            else:
                _src.write_bytes(b"not parquet " * 64)

        _store._HOOKS["before_checkpoint"] = lose
        try:
            with pytest.raises(ExecutionError) as e:
                s.query("SELECT COUNT(*) AS n, SUM(x) AS sx FROM t", epsilon=0.5)
        finally:
            _store._HOOKS.pop("before_checkpoint", None)
        h = s.history().to_pylist()
        assert [x["status"] for x in h] == ["failed"]
        outcomes.append((str(e.value), e.value.debug_detail, h[0]["failure_reason"], str(s.ledger.spent())))
        s.close()
    assert outcomes[0] == outcomes[1]
    assert "charge stands" in outcomes[0][0] and outcomes[0][3] == "(epsilon=0.5, delta=0)"


# --- 7. the PostgreSQL ledger under unusual server settings and lock time-outs ------------------------------


@pytest.fixture(scope="module")
def pg() -> Iterator[Any]:
    from _postgres import running_server

    yield from running_server()


def test_postgres_ledger_reads_charges_bit_exact_whatever_extra_float_digits(pg: Any) -> None:
    """Finding (fixed): with `extra_float_digits = 0` (a server, database or role setting) PostgreSQL
    prints doubles with 15 digits, so a charge of 0.1 + 0.2 (0.30000000000000004) read back as 0.3:
    three of them left 0.1 of a total of 1.0, and a fourth charge of 0.1 overspent (1.00000000000000012).
    The ledger now sets extra_float_digits itself in every transaction."""
    import psycopg

    from dpsql.ledger import open_ledger

    url = pg.database("efd")
    led = open_ledger(url, Budget(1.0, 0.0), create=True)
    with psycopg.connect(pg.url, autocommit=True) as c:
        c.execute("ALTER DATABASE efd SET extra_float_digits = 0")
    with psycopg.connect(url) as c:  # negative control: the setting is in force for a plain reader
        assert c.execute("SELECT CAST(0.1 AS DOUBLE PRECISION) + 0.2").fetchone()[0] == 0.3
    for _ in range(3):
        _reserve(led, Budget(0.1 + 0.2))
    assert led.spent() == Budget(0.9000000000000002)  # 0.90000000000000012 spent, shown rounded up
    with pytest.raises(BudgetExceededError):
        _reserve(led, Budget(0.1))
    assert open_ledger(url, None).entry(1).cost.epsilon == 0.1 + 0.2


def test_postgres_lock_timeout_zero_gives_up_and_huge_works(pg: Any) -> None:
    """Finding (fixed): lock_timeout=0 (PostgreSQL's "no time-out") waited forever for a held lock,
    where the file ledger gives up at once; a lock_timeout above 2^31 ms (PostgreSQL's maximum)
    failed every operation with "PostgreSQL failed (InvalidParameterValue)"."""
    import psycopg

    from dpsql.ledger import open_ledger

    url = pg.database("lt")
    open_ledger(url, Budget(1.0, 0.0), create=True)
    assert open_ledger(url, None, lock_timeout=1e7).remaining() == Budget(1.0, 0.0)
    holder = psycopg.connect(url)
    holder.execute("LOCK TABLE ledger_entries IN EXCLUSIVE MODE")
    got: list[BaseException | None] = []

    def go() -> None:
        try:
            _reserve(open_ledger(url, None, lock_timeout=0), Budget(0.1))
            got.append(None)
        except BaseException as e:  # noqa: BLE001
            got.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(10)
    waited = t.is_alive()
    holder.rollback()
    holder.close()
    t.join(30)
    assert not waited, "lock_timeout=0 kept waiting for the held lock"
    assert isinstance(got[0], LedgerError) and "is busy" in str(got[0]) and "nothing was charged" in str(got[0])
    led = open_ledger(url, None, lock_timeout=0)
    _reserve(led, Budget(0.1))  # negative control: without the holder it is granted
    assert led.spent() == Budget(0.1)


def test_budget_command_never_prints_the_postgres_password(pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): `dpsql --ledger postgresql://user:PASSWORD@host/db budget` printed the URL with
    its password on stdout ("ledger: ..." and the JSON summary's "ledger"), although `init` and every
    error message redact it."""
    url = pg.database("pw").replace("dpsql@", "dpsql:hunter2-secret@")
    assert _cli(["--ledger", url, "init", "--epsilon", "1"], tmp_path, capsys).returncode == 0
    for extra in ([], ["--format", "json"], ["--history", "--format", "json"], ["--set-total", "2", "0", "--reason", "r"]):
        p = _cli(["--ledger", url, "budget", *extra], tmp_path, capsys)
        assert p.returncode == 0, p.stderr
        assert "hunter2" not in p.stdout + p.stderr, extra
        assert "dpsql:***@127.0.0.1" in p.stdout  # negative control: the ledger is still named


def test_password_in_the_query_string_is_redacted_too(pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): libpq also takes the password from the URL's query string
    (`postgresql://dpsql@host/db?password=...`); redact() only knew the user:password@ form, so this
    password appeared in every message, Ledger.path and the `budget` output."""
    from dpsql.ledger import open_ledger

    url = pg.database("qpw") + "?password=hunter2-query&sslmode=disable"
    assert _cli(["--ledger", url, "init", "--epsilon", "1"], tmp_path, capsys).returncode == 0
    led = open_ledger(url, None)
    assert "hunter2" not in str(led.path) and "password=***" in str(led.path)
    p = _cli(["--ledger", url, "budget", "--format", "json"], tmp_path, capsys)
    assert p.returncode == 0 and "hunter2" not in p.stdout + p.stderr
    bad = url.replace(str(pg.port), "1")  # nothing listens there: the connection error names the URL
    q = _cli(["--ledger", bad, "budget"], tmp_path, capsys)
    assert q.returncode == 4 and "password=***" in q.stderr and "hunter2" not in q.stderr


def test_postgres_init_refuses_an_existing_ledger_like_a_file(pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): `dpsql init` on a PostgreSQL database that already holds a ledger with the
    same total printed "created ledger ..." and exited 0 (a file ledger is refused: exit 4)."""
    url = pg.database("init2")
    assert _cli(["--ledger", url, "init", "--epsilon", "1"], tmp_path, capsys).returncode == 0
    again = _cli(["--ledger", url, "init", "--epsilon", "1"], tmp_path, capsys)
    assert again.returncode == 4 and "already holds one" in again.stderr, again.stderr
    assert "created ledger" not in again.stderr
    f = _cli(["--ledger", "l.duckdb", "init", "--epsilon", "1"], tmp_path, capsys)
    assert f.returncode == 0
    assert _cli(["--ledger", "l.duckdb", "init", "--epsilon", "1"], tmp_path, capsys).returncode == 4  # the file's rule
    from dpsql.ledger import open_ledger

    led = open_ledger(url, Budget(1.0), create=True)  # open(create=True) still uses an existing ledger
    assert led.totals_history().num_rows == 1


_PYTHON_WORDS = ("Session(", "Ledger.", "create=True", "lock_timeout", "budget=")


def test_postgres_ledger_refusals_speak_in_flags(pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): through the command line, a PostgreSQL ledger's refusals named the Python API:
    "... or Session(ledger=URL, budget=..., create=True)", "open the existing ledger with
    Ledger.open(url)"."""
    url = pg.database("hints")
    runs = [_cli(["--ledger", url, "budget"], tmp_path, capsys)]  # no ledger there yet
    assert _cli(["--ledger", url, "init", "--epsilon", "1"], tmp_path, capsys).returncode == 0
    runs.append(_cli(["--ledger", url, "init", "--epsilon", "1"], tmp_path, capsys))  # one exists
    for p in runs:
        assert p.returncode == 4 and "hint:" in p.stderr, p.stderr
        assert not [w for w in _PYTHON_WORDS if w in p.stderr], p.stderr
        assert "dpsql init" in p.stderr or "--ledger" in p.stderr, p.stderr


def test_a_ledger_held_open_by_another_program_is_told_in_flags(tmp_path: Path) -> None:
    """Finding (fixed): a ledger held open by a program that is not dpsql (a duckdb shell) gave, through
    the command line, the hint "... or retry with a larger lock_timeout", a Python parameter that
    the command line has no flag for."""
    from dpsql import cli

    path = tmp_path / "l.duckdb"
    Ledger.create(path, Budget(1.0))
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', "
                               "flush=True); sys.stdin.readline()", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=child_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LedgerError, match="that is not dpsql") as e:
            Ledger.open(path, lock_timeout=0.2).remaining()
    finally:
        holder.communicate("\n", timeout=60)
    text = cli._cli_text(str(e.value))
    assert "lock_timeout" in str(e.value) and "lock_timeout" not in text, text  # the API keeps its parameter
    assert "duckdb shell" in text and "retry" in text, text


# --- 8. Spark and DuckDB: the same refusals, the same charges -----------------------------------------------


@pytest.mark.slow
def test_spark_and_duckdb_refuse_and_charge_alike(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
        if os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
            pytest.fail("the Spark engine must run here")
        pytest.skip("the Spark engine needs pyspark and Java 17")
    pq.write_table(_events(True), tmp_path / "src.parquet")
    queries = [("SELECT COUNT(*) AS n FROM t", 0.5, 0.0), ("SELECT nosuch FROM t", 0.1, 0.0),
               ("SELECT s, SUM(x) AS v FROM t GROUP BY s", 0.1, 1e-7), ("SELECT COUNT(*) AS n FROM t", 0.9, 0.0),
               ("SELECT SUM(x + 'a') FROM t", 0.1, 0.0), ("SELECT COUNT(*) FROM t", float("nan"), 0.0),
               ("SELECT COUNT(*) FROM t WHERE CAST(s AS INTEGER) > 1", 0.1, 0.0)]
    seen = {}
    for kind in ("duckdb", "spark"):
        s = dpsql.Session(None, Budget(1.0, 1e-6), engine={"kind": kind})
        use_noise(s, zero_noise())
        s.register("t", str(tmp_path / "src.parquet"), privacy_unit="uid", columns={"x": {"bounds": (0, 10)}})
        out: list[Any] = []
        for q, eps, delta in queries:
            try:
                r = s.query(q, epsilon=eps, delta=delta)
                out.append(("ok", str(r.mechanism), r.cost))
            except DPSQLError as e:
                out.append((type(e).__name__, str(e)))
        out.append([(x["status"], x["epsilon"], x["delta"], x["mechanism"]) for x in s.history().to_pylist()])
        # the source deleted between the charge and the read (a file ledger, for its hooks)
        copy = tmp_path / f"{kind}.parquet"
        shutil.copy(tmp_path / "src.parquet", copy)
        s.register("u", str(copy), privacy_unit="uid")
        s._ledger = Ledger.create(tmp_path / f"{kind}.duckdb", Budget(1.0, 1e-6))
        _store._HOOKS["before_checkpoint"] = lambda p, _c=copy: (_store._HOOKS.pop("before_checkpoint"), _c.unlink())
        try:
            s.query("SELECT COUNT(*) AS n FROM u", epsilon=0.5)
            out.append("answered")
        except DPSQLError as e:
            out.append((type(e).__name__, str(e), [(x["status"], x["failure_reason"]) for x in s.history().to_pylist()]))
        finally:
            _store._HOOKS.pop("before_checkpoint", None)
        seen[kind] = out
        s.close()
    assert seen["duckdb"] == seen["spark"]
    assert seen["duckdb"][-1][0] == "ExecutionError" and "charge stands" in seen["duckdb"][-1][1]
    assert [o[0] for o in seen["duckdb"][:-2]] == ["ok", "UnsupportedQueryError", "ok", "BudgetExceededError",
                                                   "UnsupportedQueryError", "ConfigError", "ok"]
