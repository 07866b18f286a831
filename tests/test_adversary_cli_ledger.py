"""The command line and the ledger under hostile input: each refusal is prompt, names the flag, key or
file to fix, exits with its documented code, and charges nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env
from conftest import run_cli as run

CFG = ["--config", "examples/dpsql.toml"]


def _cli_in_child(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``dpsql ARGV`` in a child process, killed after 60 s (a refusal takes about a second): a parse
    that expands a number into a huge integer fails the test instead of holding it."""
    return subprocess.run([sys.executable, "-m", "dpsql.cli", *argv], cwd=cwd, env=child_env(), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("argv,words", [
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1e999999999999"],
     "--epsilon 1e999999999999 is refused: it overflows to infinity"),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--delta", "1e-999999999999"],
     "--delta 1e-999999999999 is refused: it underflows to 0"),
    (["query", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--option", "tau=1e999999999999"],
     "--option tau=1e999999999999 is refused: it overflows to infinity"),
    (["budget", "--set-total", "1e-999999999999", "0", "--reason", "x"],
     "--set-total 1e-999999999999 0 is refused: 1e-999999999999: it underflows to 0"),
])
def test_a_number_with_a_huge_exponent_is_refused_at_once(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                          argv: list[str], words: str) -> None:
    """Finding (fixed): a number flag with a huge exponent (``--epsilon 1e999999999999``, a typo or a
    generated value) was checked for overflow by building its exact rational value, 10**999999999999:
    the command ran for as long as memory lasted (minutes, then the out-of-memory killer) instead of
    being refused. The exponent is now judged without expanding it."""
    assert run([*CFG, "budget"]) == 0  # the ledger exists: a refusal must leave it unspent
    r = _cli_in_child([*CFG, *argv], workdir)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "unexpected" not in r.stderr, r.stderr
    capsys.readouterr()
    assert run([*CFG, "budget", "--format", "json"]) == 0
    budget = json.loads(capsys.readouterr().out)
    assert budget["spent"]["epsilon"] == 0 and budget["total"]["epsilon"] == 10.0


def test_a_huge_exponent_in_a_per_table_flag_is_refused_at_once(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The same for the numbers of --bounds, --bins and the caps."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"u": [1, 2], "x": [1.0, 2.0]}), tmp_path / "t.parquet")
    base = ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=u"]
    assert run(["init", "--epsilon", "1", "--ledger", str(tmp_path / "l.duckdb")]) == 0
    for flag, value, words in (("--bounds", "t.x=0:1e999999999999", "--bounds t.x=0:1e999999999999 is refused: it overflows"),
                               ("--bins", "t.x=1e-999999999999:1:4", "is refused: it underflows to 0"),
                               ("--max-groups", "t=1e999999999999", "--max-groups t=1e999999999999 is refused: it overflows")):
        r = _cli_in_child([*base, flag, value, "query", "SELECT COUNT(*) FROM t", "--epsilon", "0.5"], tmp_path)
        assert r.returncode == 2 and words in r.stderr, r.stderr
    capsys.readouterr()
    assert run(["--ledger", str(tmp_path / "l.duckdb"), "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0


@pytest.mark.parametrize("text,words", [
    ("[ledger]\npath = \"l.duckdb\"\nepsilon = " + "1" * 5000 + "\n", "line 3"),
    ("[ledger]\npath = \"l.duckdb\"\nepsilon = 0x" + "f" * 5000 + "\n", "line 3"),
    ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested"),
])
def test_a_hostile_config_is_a_config_error_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              text: str, words: str) -> None:
    """Finding (fixed): a config with an integer of more digits than Python converts (5000), or arrays nested
    100 000 deep, escaped the TOML reader's own error: 'error: unexpected ValueError' or 'unexpected
    RecursionError' (exit 1) from the command line, and a bare ValueError from Session.from_config."""
    import dpsql
    from dpsql.errors import ConfigError

    cfg = tmp_path / "dpsql.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match="dpsql.toml") as e:
        dpsql.Session.from_config(cfg)
    assert words in str(e.value) and len(str(e.value)) < 600  # the 5000 digits are not quoted back
    assert run(["--config", str(cfg), "budget"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ConfigError: config file") and "unexpected" not in err, err


FROZEN_HOLDER = """
import os, signal, sys
import dpsql
from dpsql.ledger import _store

def freeze(path):
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # a frozen process: Ctrl-Z, a debugger, a paused container

_store._HOOKS["after_attach"] = freeze
_store.Ledger.open(sys.argv[1]).reserve(dpsql.Budget(0.5, 0.0), mechanism="m", query="frozen", tables=["t"], params={})
"""


def test_a_frozen_holder_of_the_ledger_lock_is_named_with_the_way_out(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): a dpsql process stopped (SIGSTOP, Ctrl-Z, a debugger) while it held a file
    ledger's lock blocks every other operation on that ledger until it resumes, and each waiter gave up
    after lock_timeout with 'locked by another dpsql operation ... look for a stuck process that has the
    ledger file open': no process named, so an ETL operator had to hunt for it with lsof. The message
    now names the holder's process id and state, and how to resume or end it; nothing is charged."""
    from conftest import child_env

    import dpsql
    from dpsql.errors import LedgerError
    from dpsql.ledger import Ledger

    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, dpsql.Budget(1.0))
    holder = subprocess.Popen([sys.executable, "-c", FROZEN_HOLDER, str(path)], stdout=subprocess.PIPE, text=True,
                              env=child_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(LedgerError) as e:
            Ledger.open(path, lock_timeout=0.5)
        text = str(e.value)
        assert f"process {holder.pid}" in text and "stopped" in text and f"kill -CONT {holder.pid}" in text, text
        assert run(["--ledger", str(path), "--lock-timeout", "0.5", "budget"]) == 75  # the command line says the same (busy: retry later)
        err = capsys.readouterr().err
        assert f"process {holder.pid}" in err and "stopped" in err, err
    finally:
        holder.kill()
        holder.wait(timeout=60)
    led = Ledger.open(path)
    assert led.remaining() == dpsql.Budget(1.0) and led.history().num_rows == 0  # the frozen reserve never committed


def test_lock_timeout_flag_sets_the_wait_of_one_command(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Gap (closed): the command line had no way to say how long to wait for a busy ledger; an ETL job on a
    shared ledger could only ask the data owner to raise [ledger] lock_timeout in the config, and the
    time-out's hint said so. --lock-timeout SECONDS (before or after the command) sets it for this command,
    with the owner's config too (it changes no policy, only how long this command waits)."""
    from dpsql.ledger import Ledger

    seen: list[float] = []
    init = Ledger.__init__

    def spy(self: Ledger, path: str | None, *, lock_timeout: float = 10.0) -> None:
        seen.append(lock_timeout)
        init(self, path, lock_timeout=lock_timeout)

    monkeypatch.setattr(Ledger, "__init__", spy)
    for argv in ([*CFG, "--lock-timeout", "75", "budget"], [*CFG, "budget", "--lock-timeout", "75"],
                 [*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "--lock-timeout", "75"],
                 ["--ledger", "x.duckdb", "--lock-timeout", "75", "init", "--epsilon", "1"]):
        seen.clear()
        assert run(argv) == 0, capsys.readouterr().err
        assert seen and set(seen) == {75.0}, (argv, seen)
    seen.clear()
    assert run([*CFG, "budget"]) == 0 and set(seen) == {10.0}  # without it: the config's (here its default)
    capsys.readouterr()
    for value, words in (("-1", "--lock-timeout -1 is refused: --lock-timeout must be a finite number of seconds >= 0"),
                         ("nan", "--lock-timeout nan is refused"), ("1e999", "--lock-timeout 1e999 is refused: it overflows"),
                         ("soon", "argument --lock-timeout: 'soon' is not a number")):
        assert run([*CFG, "budget", "--lock-timeout", value]) == 2
        err = capsys.readouterr().err
        assert words in err, err
    assert run([*CFG, "--lock-timeout", "5", "budget", "--lock-timeout", "6"]) == 2
    assert "--lock-timeout is given twice" in capsys.readouterr().err


def test_a_lock_time_out_hint_names_the_flag(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The time-out of a busy ledger tells the command-line user how to wait longer: --lock-timeout."""
    import threading

    from dpsql.ledger import Ledger, _store

    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    gate, done = threading.Event(), threading.Event()

    def hold(p: str) -> None:
        gate.set()
        done.wait(60)

    _store._HOOKS["after_attach"] = hold
    holder = threading.Thread(target=lambda: Ledger("examples/example_ledger.duckdb", lock_timeout=60).remaining())
    holder.start()
    try:
        assert gate.wait(30)
        _store._HOOKS.pop("after_attach")
        assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "--lock-timeout", "0.2"]) == 75
    finally:
        _store._HOOKS.pop("after_attach", None)
        done.set()
        holder.join(60)
    err = capsys.readouterr().err
    assert "locked by another dpsql operation" in err and "--lock-timeout SECONDS" in err and "lock_timeout under" in err, err
    assert Ledger.open("examples/example_ledger.duckdb").history().num_rows == 0


@pytest.mark.parametrize("name", ["budget_café.duckdb", "預算.duckdb"])
def test_a_ledger_named_in_any_language_is_usable(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Finding (fixed): a ledger whose file name holds a character outside ASCII ('budget_café.duckdb') was
    created, and then every operation on it failed with 'unexpected UnicodeEncodeError' (exit 1): the
    waiting queue wrote the ledger's name into its tail file as ASCII."""
    import dpsql
    from dpsql.ledger import Ledger

    path = tmp_path / name
    Ledger.create(path, dpsql.Budget(1.0))
    led = Ledger.open(path)
    entry = led.reserve(dpsql.Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
    led.commit(entry)
    assert Ledger.open(path).remaining() == dpsql.Budget(0.75)
    assert run(["--ledger", str(path), "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0.25


def test_a_ledger_path_that_is_not_utf8_is_refused_in_flag_terms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (fixed): DuckDB opens only file names that are UTF-8. A --ledger path holding a byte that is not
    UTF-8 (a Latin-1 name) made init fail with DuckDB's 'Python Conversion Failure' and a hint about disk
    space, and every other command with 'unexpected UnicodeEncodeError' (exit 1). It is now refused as what
    it is, before anything is created or charged."""
    import os

    latin1 = os.fsdecode(str(tmp_path).encode() + b"/l\xe9.duckdb")
    assert run(["--ledger", latin1, "init", "--epsilon", "1"]) == 2
    err = capsys.readouterr().err
    assert "error: ConfigError:" in err and "not UTF-8" in err and "--ledger" in err, err
    assert os.listdir(tmp_path) == []
    assert run(["--ledger", latin1, "budget"]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "unexpected" not in err, err
    from dpsql import Budget
    from dpsql.errors import ConfigError
    from dpsql.ledger import Ledger

    for call in (lambda: Ledger.create(latin1, Budget(1.0)), lambda: Ledger.open(latin1, Budget(1.0), create=True)):
        with pytest.raises(ConfigError, match="is not UTF-8 text"):
            call()
    assert os.listdir(tmp_path) == []


def test_a_table_file_named_outside_utf8_is_refused_before_the_charge(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (fixed): --table t=FILE whose name holds a byte that is not UTF-8 (alone, or matched by a glob)
    failed with 'unexpected UnicodeEncodeError' (exit 1) from the Parquet reader; it is now a ConfigError
    naming the file (exit 2), and nothing is charged."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    latin1 = os.fsdecode(b"e\xe9.parquet")
    with open(latin1, "wb") as f:  # pyarrow itself takes only UTF-8 names
        pq.write_table(pa.table({"u": [1, 2], "x": [1.0, 2.0]}), f)
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "1"]) == 0
    for source in (latin1, "*.parquet"):
        assert run(["--ledger", "l.duckdb", "--table", f"t={source}", "--privacy-unit", "t=u", "query",
                    "SELECT COUNT(*) FROM t", "--epsilon", "0.5"]) == 2
        err = capsys.readouterr().err
        assert "error: ConfigError:" in err and "not UTF-8" in err and "rename" in err, err
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0


@pytest.mark.parametrize("argv,flag_words,api_words", [
    (["COUNT(*)", "--epsilon", "1e308"], "use a smaller --epsilon", "use a smaller epsilon"),
    (["COUNT(*)", "--epsilon", "1e-320"], "--epsilon is too small for COUNT(*)", "use a larger epsilon"),
    (["MEDIAN(amount)", "--epsilon", "1e-300"], "--epsilon 1e-300 is too small", "use an epsilon above"),
    (["COUNT(*)", "--epsilon", "1", "--delta", "0.9999999999999999"], "--delta 0.9999999999999999 plus",
     "use a small delta such as"),
    (["AVG(amount)", "--epsilon", "1", "--option", "tau=abc"], "--option tau=abc is refused: tau must be", "\nerror"),
])
def test_budget_and_option_refusals_speak_in_flags(workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                                   flag_words: str, api_words: str) -> None:
    """Finding (fixed): refusals of an --epsilon, --delta or --option value the mechanism cannot use spoke
    in Python parameters: 'use a smaller epsilon', 'epsilon is too small for COUNT(*) ... use a larger
    epsilon', 'use an epsilon above 2.91e-07', 'delta=0.99... plus ... use a small delta such as 1e-6',
    'tau must be a whole number >= 1, got 'abc'' (which flag?). They now name the flags."""
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, "explain", f"SELECT {argv[0]} FROM events", *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert flag_words in err and api_words not in err, err
    assert "epsilon=" not in err.replace("--option", "") and "delta=" not in err, err


def test_a_warning_about_the_budget_names_the_flag(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'warning: epsilon=10000 is unusually large' spoke of a Python parameter on the command line."""
    assert run([*CFG, "explain", "SELECT COUNT(*) FROM events", "--epsilon", "10000"]) == 0
    err = capsys.readouterr().err
    assert "warning: --epsilon 10000 is unusually large" in err, err


@pytest.mark.parametrize("command", [["budget"], ["init", "--epsilon", "1"]])
def test_a_malformed_postgres_url_is_a_config_error_that_hides_the_password(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str],
                                                                             command: list[str]) -> None:
    """Finding (fixed): a PostgreSQL ledger URL that Python's URL parser refuses (an unclosed '[' of an
    IPv6 host) failed in the password redaction itself: 'unexpected ValueError' (exit 1), and a bare
    ValueError from the Python API. It is now a ConfigError that never shows the URL (it may hold a
    password)."""
    from dpsql.errors import ConfigError
    from dpsql.ledger._postgres import PostgresLedger

    url = "postgresql://analyst:s3cret@[::1/dpsql"
    assert run(["--ledger", url, "--lock-timeout", "1", *command]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ConfigError:") and "s3cret" not in err and "--ledger" in err, err
    with pytest.raises(ConfigError) as e:
        PostgresLedger.open(url, lock_timeout=1)
    assert "s3cret" not in str(e.value) and "URL" in str(e.value)


def test_init_on_a_broken_symbolic_link_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dpsql init --ledger L` where L is a symbolic link to a missing file said 'the file already exists',
    while `dpsql budget --ledger L` said it does not exist: both true of the link, neither helpful."""
    import os

    (tmp_path / "l.duckdb").symlink_to(tmp_path / "gone" / "target.duckdb")
    assert run(["--ledger", str(tmp_path / "l.duckdb"), "init", "--epsilon", "1"]) == 4
    err = capsys.readouterr().err
    assert "symbolic link" in err and "target.duckdb" in err and "does not exist" in err and "already exists" not in err, err
    assert os.listdir(tmp_path) == ["l.duckdb"]


def test_a_ledger_name_too_long_for_its_side_files_is_refused_before_anything(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger file name that fits the file system (230 bytes of its 255) but leaves no room for the hidden
    files beside it (.NAME.generation, the queue's .NAME.q-..., the temporary .NAME.creating-...) failed in
    DuckDB with 'File name too long' and a hint about disk space. It is refused as what it is."""
    import os

    name = "l" * 223 + ".duckdb"
    assert run(["--ledger", str(tmp_path / name), "init", "--epsilon", "1"]) == 2
    err = capsys.readouterr().err
    assert "error: ConfigError:" in err and "230 bytes" in err and "--ledger" in err, err
    assert os.listdir(tmp_path) == []
    short = "l" * 200 + ".duckdb"  # room enough: created and used
    assert run(["--ledger", str(tmp_path / short), "init", "--epsilon", "1"]) == 0
    assert run(["--ledger", str(tmp_path / short), "budget"]) == 0


QUEUE_WAITER = """
import sys, time
import dpsql
from dpsql.ledger import Ledger
led = Ledger.open(sys.argv[1], lock_timeout=0.5)
e = led.reserve(dpsql.Budget(0.25), mechanism="m", query="q", tables=["t"], params={})
print("charged", e, flush=True)
"""


def test_a_process_frozen_inside_the_queue_update_delays_the_others_only_up_to_lock_timeout(tmp_path: Path) -> None:
    """Finding (fixed): entering the waiting queue takes a short exclusive flock on the queue's tail file
    (for one read and one write), and took it with a blocking call, outside lock_timeout. A process frozen
    (SIGSTOP, Ctrl-Z, a debugger) inside that window held every later dpsql operation on the ledger forever,
    whatever its lock_timeout. Here the frozen process is stood in for by holding that flock: an operation
    now waits for it at most lock_timeout, then goes on without its queue turn (the ledger's own lock still
    excludes), and charges."""
    import fcntl
    import os

    from conftest import child_env

    import dpsql
    from dpsql.ledger import Ledger

    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, dpsql.Budget(1.0))
    Ledger.open(path).remaining()  # the queue's tail file exists
    fd = os.open(tmp_path / ".ledger.duckdb.queue", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = subprocess.run([sys.executable, "-c", QUEUE_WAITER, str(path)], env=child_env(), capture_output=True,
                           text=True, timeout=60)
    finally:
        os.close(fd)
    assert r.returncode == 0 and r.stdout.strip() == "charged 1", r.stderr
    assert Ledger.open(path).spent() == dpsql.Budget(0.25)
