"""The ledger under races and faults: a deterministic race between processes (same file through
the same path, a hard link, a symlink, a bind mount), multi-process stress, a failed CHECKPOINT
(file size limit), lost write-ahead logs and restored old copies, atomic creation, messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import child_env as _env
from conftest import run_together
from conftest import spawn_python as _spawn

from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, LedgerError
from dpsql.ledger import GENERATION_SUFFIX, Ledger, _store

REPO = Path(__file__).resolve().parents[1]


def _reserve(ledger: Ledger, eps: float = 0.1) -> int:
    return ledger.reserve(Budget(eps), mechanism="m", query="q", tables=["t"], params={})


def _nine_tenths_spent(path: Path) -> None:
    led = Ledger.create(path, Budget(1.0))
    for _ in range(9):
        led.commit(_reserve(led))


# --- a deterministic race ------------------------------------------------------------------------

# A reserves and stays inside its critical section (after DuckDB attached the file) until B has
# started its own reserve (B's "before_queue" point: next come the waiting queue and the flock, or,
# unlocked, DuckDB's ATTACH at once), and then 0.3 s more.
HOLDER = """
import json, os, sys, time
from dpsql.budget import Budget
from dpsql.ledger import Ledger, _store
times = {}
def inside(p):
    times["inside"] = time.monotonic()
    print("inside", flush=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.002)
    times["b_started"] = os.path.exists(sys.argv[2])
    time.sleep(0.3)
_store._HOOKS["after_attach"] = inside
_store._HOOKS["after_detach"] = lambda p: times.setdefault("detached", time.monotonic())
led = Ledger(sys.argv[1], lock_timeout=30)
_store._base_connection()
print("ready", flush=True)
sys.stdin.readline()
eid = led.reserve(Budget(0.1), mechanism="m", query="A", tables=["t"], params={})
print(json.dumps({"id": eid, **times}), flush=True)
"""

# B reserves through its own path; records when DuckDB first touches the file.
RACER = """
import json, sys, time
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError
from dpsql.ledger import Ledger, _store
times = {}
_store._HOOKS["before_queue"] = lambda p: open(sys.argv[3], "w").close()
_store._HOOKS["before_attach"] = lambda p: times.setdefault("attach", time.monotonic())
if sys.argv[2] == "unlocked":  # negative control: no flock and no waiting queue at all
    _store._lock_file = lambda *a: ((0, 0), -1)
    _store._unlock = lambda *a: None
    _store._names = lambda *a: True  # no locked inode to compare the path's with
    _store._queue_enter = lambda *a: None
led = Ledger(sys.argv[1], lock_timeout=30)
_store._base_connection()  # DuckDB's instance is up: B attaches right after its start when unlocked
print("ready", flush=True)
sys.stdin.readline()
try:
    result = led.reserve(Budget(0.1), mechanism="m", query="B", tables=["t"], params={})
except BudgetExceededError:
    result = "exceeded"
print(json.dumps({"result": result, **times}), flush=True)
"""


@pytest.fixture
def bind_mount(tmp_path: Path) -> Iterator[Path]:
    src, dst = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    dst.mkdir()
    r = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("bind mounts need privileges this machine does not grant")
    try:
        yield src
    finally:
        subprocess.run(["umount", str(dst)], check=True)


def _second_path(kind: str, path: Path, tmp_path: Path) -> Path:
    if kind == "same":
        return path
    other = tmp_path / "elsewhere"
    other.mkdir(exist_ok=True)
    if kind == "hardlink":
        os.link(path, other / "alias.duckdb")
        return other / "alias.duckdb"
    if kind == "symlink":
        os.symlink(path, other / "alias.duckdb")
        return other / "alias.duckdb"
    assert kind == "bind"
    return tmp_path / "mnt" / path.name


def _race(path: Path, second: Path, mode: str) -> tuple[dict[str, object], dict[str, object]]:
    """A and B start (and import) together; B's reserve starts while A is inside its critical section."""
    started = path.parent / f"b-started-{uuid.uuid4().hex}"
    a, b = _spawn(HOLDER, str(path), str(started)), _spawn(RACER, str(second), mode, str(started))
    try:
        for p in (a, b):
            assert p.stdout is not None and p.stdin is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", p.stderr.read() if p.stderr else line
        a.stdin.write("go\n")  # type: ignore[union-attr]
        a.stdin.flush()  # type: ignore[union-attr]
        line = a.stdout.readline()  # type: ignore[union-attr]
        assert line.strip() == "inside", a.stderr.read() if a.stderr else line
        b.stdin.write("go\n")  # type: ignore[union-attr]
        b.stdin.flush()  # type: ignore[union-attr]
        out_b, err_b = b.communicate(timeout=60)
        out_a, err_a = a.communicate(timeout=60)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    assert a.returncode == 0 and b.returncode == 0, (err_a, err_b)
    got_a, got_b = json.loads(out_a.strip().splitlines()[-1]), json.loads(out_b.strip().splitlines()[-1])
    assert got_a["b_started"] is True  # B's reserve began while A was inside
    return got_a, got_b


@pytest.mark.parametrize("kind", ["same", "hardlink", "symlink", "bind"])
def test_deterministic_race_is_serialised(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "bind":
        src = request.getfixturevalue("bind_mount")
        path = src / "ledger.duckdb"
    else:
        path = tmp_path / "ledger.duckdb"
    _nine_tenths_spent(path)
    second = _second_path(kind, path, tmp_path)
    got_a, got_b = _race(path, second, "locked")
    # DuckDB in B first touched the file only after A had detached it
    assert got_b["attach"] >= got_a["detached"] > got_a["inside"]  # type: ignore[operator]
    assert got_a["id"] == 10 and got_b["result"] == "exceeded"
    led = Ledger.open(path)
    assert led.spent() == Budget(1.0) and led.history().num_rows == 10


def test_deterministic_race_negative_control(tmp_path: Path) -> None:
    """Without the flock, B's DuckDB touches the file while A is inside: the test can fail."""
    path = tmp_path / "ledger.duckdb"
    _nine_tenths_spent(path)
    got_a, got_b = _race(path, path, "unlocked")
    assert got_b["attach"] < got_a["detached"]  # type: ignore[operator]


# --- the race as found: DuckDB paused between reading the headers and taking its lock ----------

# An LD_PRELOAD shim (compiled here when a C compiler is available) delays DuckDB's fcntl write
# lock on one file, i.e. the moment after DuckDB has read the file's headers through an unlocked
# handle and before it locks the file: until a release file exists (at most DPSQL_SHIM_MS).
SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef int (*fcntl_fn)(int, int, ...);
static void delay_lock(int fd, int cmd, void *arg) {
    if (cmd != F_SETLK && cmd != F_SETLKW) return;
    struct flock *fl = (struct flock *)arg;
    if (!fl || fl->l_type != F_WRLCK) return;
    const char *want = getenv("DPSQL_SHIM_PATH"), *ms = getenv("DPSQL_SHIM_MS"), *sig = getenv("DPSQL_SHIM_SIGNAL");
    const char *rel = getenv("DPSQL_SHIM_RELEASE");
    if (!want || !ms || !sig || !rel) return;
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return;
    target[n] = 0;
    if (strcmp(target, want) != 0) return;
    FILE *f = fopen(sig, "w");
    if (f) fclose(f);
    for (int i = 0; i < atoi(ms) && access(rel, F_OK) != 0; i++) usleep(1000);
}
int fcntl(int fd, int cmd, ...) {
    static fcntl_fn real;
    if (!real) real = (fcntl_fn)dlsym(RTLD_NEXT, "fcntl");
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    delay_lock(fd, cmd, arg);
    return real(fd, cmd, arg);
}
int fcntl64(int fd, int cmd, ...) {
    static fcntl_fn real;
    if (!real) real = (fcntl_fn)dlsym(RTLD_NEXT, "fcntl64");
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    delay_lock(fd, cmd, arg);
    return real(fd, cmd, arg);
}
"""

SHIM_WORKER = """
import json, sys
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, LedgerError
from dpsql.ledger import Ledger, _store
if sys.argv[2] == "unlocked":  # negative control: no flock and no waiting queue at all
    _store._lock_file = lambda *a: ((0, 0), -1)
    _store._unlock = lambda *a: None
    _store._names = lambda *a: True  # no locked inode to compare the path's with
    _store._queue_enter = lambda *a: None
    # and DuckDB's type-detecting ATTACH (no TYPE DUCKDB), which reads the headers before DuckDB's own
    # lock: with TYPE DUCKDB (what the ledger uses), DuckDB reads them after its lock
    _real_base = _store._base_connection

    class _Cur:
        def __init__(self, c):
            self._c = c

        def execute(self, sql, *a):
            return self._c.execute(sql.replace(" (TYPE DUCKDB)", "").replace("(TYPE DUCKDB, ", "("), *a)

        def __getattr__(self, name):
            return getattr(self._c, name)

    class _Base:
        def __init__(self, b):
            self._b = b

        def cursor(self):
            return _Cur(self._b.cursor())

        def __getattr__(self, name):
            return getattr(self._b, name)

    _store._base_connection = lambda: _Base(_real_base())
led = Ledger(sys.argv[1], lock_timeout=30)
if sys.argv[3] == "A":  # started with B, goes once B's DuckDB has paused; says when its reserve starts
    _store._base_connection()
    _store._HOOKS["before_queue"] = lambda p: open(sys.argv[4], "w").close()
    print("ready", flush=True)
    sys.stdin.readline()
try:
    result = led.reserve(Budget(0.1), mechanism="m", query=sys.argv[3], tables=["t"], params={})
except BudgetExceededError:
    result = "exceeded"
except LedgerError as e:
    result = "error: " + str(e)
print(json.dumps({"result": result}), flush=True)
"""


@pytest.fixture(scope="module")
def fcntl_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the LD_PRELOAD shim")
    d = tmp_path_factory.mktemp("shim")
    (d / "shim.c").write_text(SHIM_C)
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "shim.so"), str(d / "shim.c"), "-ldl"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build the LD_PRELOAD shim: {r.stderr[:200]}")
    return d / "shim.so"


def _shim_race(path: Path, shim: Path, mode: str) -> tuple[object, object]:
    """B's DuckDB pauses between reading the headers and locking; A reserves meanwhile: B goes on once
    A is done (unlocked: A is not held up) or 0.5 s after A's reserve started (locked: A waits for B)."""
    signal_file, release, a_started = path.parent / "paused", path.parent / "release", path.parent / "a-started"
    env = _env()
    env.update(LD_PRELOAD=str(shim), DPSQL_SHIM_PATH=os.path.realpath(path), DPSQL_SHIM_MS="30000",
               DPSQL_SHIM_SIGNAL=str(signal_file), DPSQL_SHIM_RELEASE=str(release))
    a = _spawn(SHIM_WORKER, str(path), mode, "A", str(a_started))
    b = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SHIM_WORKER), str(path), mode, "B"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert a.stdout is not None and a.stdin is not None
        line = a.stdout.readline()
        assert line.strip() == "ready", a.stderr.read() if a.stderr else line
        for _ in range(3000):  # until B's DuckDB has read the headers and paused before its lock
            if signal_file.exists() or b.poll() is not None:
                break
            threading.Event().wait(0.01)
        assert signal_file.exists(), b.communicate(timeout=60)
        a.stdin.write("go\n")
        a.stdin.flush()
        if mode == "locked":
            for _ in range(3000):
                if a_started.exists() or a.poll() is not None:
                    break
                threading.Event().wait(0.01)
            assert a_started.exists(), a.communicate(timeout=60)
            try:  # A waits for B (its flock), so it can only finish early if the flock is broken
                a.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        else:
            a.wait(timeout=60)
        release.touch()
        out_a, err_a = a.communicate(timeout=60)
        out_b, err_b = b.communicate(timeout=60)
    finally:
        release.touch()
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    assert a.returncode == 0 and b.returncode == 0, (err_a, err_b)
    return json.loads(out_a.strip().splitlines()[-1])["result"], json.loads(out_b.strip().splitlines()[-1])["result"]


def test_race_between_header_read_and_lock_cannot_overspend(tmp_path: Path, fcntl_shim: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    _nine_tenths_spent(path)
    got_a, got_b = _shim_race(path, fcntl_shim, "locked")
    # B holds the ledger's flock while DuckDB pauses, so A waits and then sees B's charge
    assert (got_a, got_b) == ("exceeded", 10)
    led = Ledger.open(path)
    assert led.spent() == Budget(1.0) and led.history()["query"].to_pylist()[-1] == "B"


def test_race_between_header_read_and_lock_negative_control(tmp_path: Path, fcntl_shim: Path) -> None:
    """Without the flock the race of the finding is back: B's DuckDB works on the stale headers it
    read before A's change. Either both get entry 10 (the overspend of the finding), or the
    generation marker (A's change raised it) makes B refuse the stale snapshot."""
    path = tmp_path / "ledger.duckdb"
    _nine_tenths_spent(path)
    got_a, got_b = _shim_race(path, fcntl_shim, "unlocked")
    assert got_a == 10
    assert got_b == 10 or "older than its last acknowledged change" in str(got_b)


# --- stress: many processes through two names of one file ----------------------------------------

STRESSER = """
import json, sys
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError
from dpsql.ledger import Ledger
led = Ledger(sys.argv[1], lock_timeout=60)
print("ready", flush=True)
sys.stdin.readline()
ok, committed, exceeded, other = [], [], 0, []
for i in range(int(sys.argv[2])):
    try:
        e = led.reserve(Budget(0.05), mechanism="m", query=f"q{i}", tables=["t"], params={})
        ok.append(e)
        led.commit(e)
        committed.append(e)
    except BudgetExceededError:
        exceeded += 1
    except Exception as e:
        other.append(f"{type(e).__name__}: {e}")
print(json.dumps({"ok": ok, "committed": committed, "exceeded": exceeded, "other": other}), flush=True)
"""


def test_stress_processes_through_a_hard_link(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))  # fits exactly 20 charges of 0.05
    other = tmp_path / "d2"
    other.mkdir()
    os.link(path, other / "link.duckdb")
    n_proc, attempts = 6, 6
    procs = [_spawn(STRESSER, str(path if i % 2 else other / "link.duckdb"), str(attempts)) for i in range(n_proc)]
    results = run_together(procs)
    assert [r["other"] for r in results] == [[]] * n_proc
    ids = sorted(i for r in results for i in r["ok"])
    assert ids == list(range(1, 21))  # no duplicate, no overspend
    assert sum(r["exceeded"] for r in results) == n_proc * attempts - 20
    hist = Ledger.open(path).history()
    assert hist["entry_id"].to_pylist() == ids
    assert set(hist["status"].to_pylist()) == {"released"}  # no acknowledged commit was lost


def test_threads_through_two_names_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    os.link(path, tmp_path / "second.duckdb")
    ledgers = [Ledger.open(path, lock_timeout=60), Ledger.open(tmp_path / "second.duckdb", lock_timeout=60)]
    ok: list[int] = []
    errors: list[BaseException] = []

    def work(led: Ledger) -> None:
        for _ in range(8):
            try:
                e = _reserve(led, 0.05)
                ok.append(e)
                led.commit(e)
            except BudgetExceededError:
                pass
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

    threads = [threading.Thread(target=work, args=(ledgers[i % 2],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and sorted(ok) == list(range(1, 21))
    assert set(ledgers[0].history()["status"].to_pylist()) == {"released"}


FORKER = """
import multiprocessing as mp, sys
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError
from dpsql.ledger import Ledger

def work(path, q):
    led = Ledger(path, lock_timeout=60)
    got = []
    for _ in range(5):
        try:
            got.append(led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={}))
        except BudgetExceededError:
            pass
    q.put(got)

if __name__ == "__main__":
    path = sys.argv[1]
    Ledger(path).remaining()  # the parent has used the ledger before forking
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=work, args=(path, q)) for _ in range(4)]
    for p in ps: p.start()
    ids = sorted(i for _ in ps for i in q.get(timeout=120))
    for p in ps: p.join(60)
    print(ids)
"""


def test_forked_children_do_not_share_the_parents_lock(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    script = tmp_path / "forker.py"
    script.write_text(FORKER)
    r = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=180, env=_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(list(range(1, 11)))


# --- a failed CHECKPOINT is a failed reserve -----------------------------------------------------

# The file size limit is the main file's current size: the WAL (small) can be written and
# fsynced, but the CHECKPOINT, which must grow the main file, fails ("File too large").
FULL_DISK = """
import json, os, resource, signal, sys
from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import Ledger
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = sys.argv[1]
size = os.path.getsize(path)
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
led = Ledger(path, lock_timeout=5)
try:
    led.reserve(Budget(0.25), mechanism="m", query="big " + "x" * 300000, tables=["t"], params={})
    print(json.dumps({"returned": True}))
except LedgerError as e:
    print(json.dumps({"returned": False, "error": str(e)}))
"""


def test_failed_checkpoint_is_a_failed_reserve_and_a_lost_wal_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    led.commit(_reserve(led, 0.25))
    p = _spawn(FULL_DISK, str(path))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    assert got["returned"] is False  # the caller would read nothing
    assert "write-ahead log" in got["error"] and "entry 2" in got["error"] and "stands" in got["error"]
    wal = Path(str(path) + ".wal")
    assert wal.exists()
    # the WAL is lost (an operator freeing space): the budget must not come back silently
    saved = wal.read_bytes()
    wal.unlink()
    # the error said the charge stands, and the marker went up before the checkpoint: a file
    # without the charge is refused (it would give 0.25 back), it is not silently accepted
    with pytest.raises(LedgerError, match="older than its last acknowledged change"):
        Ledger.open(path)
    wal.write_bytes(saved)
    # ... and with the WAL back, the next operation writes the charge into the main file
    led2 = Ledger.open(path)
    assert led2.remaining() == Budget(0.5) and led2.entry(2).status == "reserved"
    _reserve(led2, 0.1)  # an acknowledged write: generation and marker advance
    assert not wal.exists()


def test_older_main_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    led.commit(_reserve(led, 0.25))
    old = tmp_path / "backup.duckdb"
    shutil.copyfile(path, old)
    led.commit(_reserve(led, 0.25))  # acknowledged after the copy was taken
    shutil.copyfile(old, path)  # a restore of an old copy (or a lost WAL) would give 0.25 back
    for call in (led.remaining, lambda: _reserve(led), lambda: Ledger.open(path)):
        with pytest.raises(LedgerError, match="older than its last acknowledged change") as ei:
            call()
        assert ".wal" in (ei.value.hint or "") and "delete" not in str(ei.value)
    marker = tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX)
    assert marker.read_text().startswith("dpsql ledger generation ")


def test_damaged_marker_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    (tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX)).write_text("garbage")
    with pytest.raises(LedgerError, match="generation marker .* is damaged"):
        led.remaining()


# --- creation -------------------------------------------------------------------------------------


def test_creation_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.duckdb"

    def boom(p: str) -> None:
        raise OSError("simulated crash before the ledger is published")

    monkeypatch.setattr(_store, "_fsync_path", boom)
    with pytest.raises(OSError, match="simulated crash"):
        Ledger.create(path, Budget(1.0))
    assert sorted(os.listdir(tmp_path)) == []  # no ledger, no empty file, no temporary left behind
    monkeypatch.undo()
    assert Ledger.create(path, Budget(1.0)).remaining() == Budget(1.0)
    assert sorted(os.listdir(tmp_path)) == [".ledger.duckdb" + GENERATION_SUFFIX, ".ledger.duckdb.queue", "ledger.duckdb"]


def test_deleted_ledger_is_not_recreated_implicitly(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    _reserve(led, 0.5)
    path.unlink()
    with pytest.raises(LedgerError, match="a ledger existed here") as ei:
        Ledger.open(path, Budget(1.0), create=True)
    assert "dpsql init" in (ei.value.hint or "")
    assert not path.exists()
    # an explicit init starts a new ledger whose generations continue above the old marker
    new = Ledger.create(path, Budget(1.0))
    assert new.remaining() == Budget(1.0)
    _reserve(new, 0.1)
    assert Ledger.open(path).spent() == Budget(0.1)


# --- messages -------------------------------------------------------------------------------------


def test_lock_timeout_messages_say_what_was_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0), lock_timeout=0.3)
    # the release's longer wait (10.3 s here) is pinned in tests/test_ledger_release_wait.py; these are its messages
    monkeypatch.setattr(led, "release_wait", lambda: 0.6)
    entry = _reserve(led)
    gate = threading.Event()
    done = threading.Event()

    def hold(p: str) -> None:
        gate.set()
        done.wait(30)

    _store._HOOKS["after_attach"] = hold
    holder = threading.Thread(target=lambda: Ledger(str(path), lock_timeout=5).remaining())
    holder.start()
    try:
        assert gate.wait(10)
        _store._HOOKS.pop("after_attach")
        with pytest.raises(LedgerError, match="locked") as ei:
            led.commit(entry)
        assert f"entry {entry} stays 'reserved': the charge stands" in str(ei.value)
        assert "nothing was recorded" not in str(ei.value)
        with pytest.raises(LedgerError, match="nothing was charged"):
            _reserve(led)
    finally:
        _store._HOOKS.pop("after_attach", None)
        done.set()
        holder.join(30)
    led.commit(entry)
    assert led.entry(entry).status == "released" and led.spent() == Budget(0.1)


def test_ledger_error_hints_never_say_delete(tmp_path: Path) -> None:
    bad = tmp_path / f"{uuid.uuid4().hex}.duckdb"
    bad.write_bytes(b"")
    for call in (lambda: Ledger.open(bad), lambda: Ledger.open(tmp_path / "missing.duckdb", Budget(1.0))):
        with pytest.raises(LedgerError) as ei:
            call()
        text = str(ei.value).lower()
        assert "delete" not in text and "remove the" not in text


def test_waiters_are_served_first_come_first_served(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger.create(path, Budget(1.0))
    queue = tmp_path / ".ledger.duckdb.queue"
    release, held = threading.Event(), threading.Event()
    order: list[str] = []

    def hook(p: str) -> None:
        name = threading.current_thread().name
        if name == "holder":
            held.set()
            release.wait(30)
        else:
            order.append(name)

    _store._HOOKS["after_attach"] = hook
    try:
        threads = [threading.Thread(target=lambda: Ledger(str(path), lock_timeout=60).remaining(), name="holder")]
        threads[0].start()
        # the holder in the queue and holding the lock before the first waiter starts: else its own entry in the
        # queue, made late on a loaded machine, looked like w1's, and w2 was started (and served) before w1
        assert held.wait(60)
        names = ["w1", "w2", "w3", "w4", "w5"]
        for name in names:
            before = queue.read_text() if queue.exists() else ""
            t = threading.Thread(target=lambda: _reserve(Ledger(str(path), lock_timeout=60), 0.1), name=name)
            t.start()
            threads.append(t)
            # until this waiter has put itself at the tail of the queue (a bound of 5 s let a loaded machine start
            # the next waiter first: the one inversion once seen)
            deadline = time.monotonic() + 60
            while not (queue.exists() and queue.read_text() != before):
                assert time.monotonic() < deadline, f"{name} never entered the queue"
                threading.Event().wait(0.005)
        release.set()
        for t in threads:
            t.join(60)
    finally:
        _store._HOOKS.pop("after_attach", None)
    assert order == names
    assert [e for e in Ledger.open(path).history()["query"].to_pylist()] == ["q"] * 5
    assert not [f for f in os.listdir(tmp_path) if ".q-" in f]  # every slot file was removed


def test_damaged_wal_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Every acknowledged change is in the main file, so a WAL left next to it (only ever by a
    failed operation) holds nothing acknowledged: DuckDB ignores a damaged one, nothing is lost."""
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    led.commit(_reserve(led, 0.25))
    Path(str(path) + ".wal").write_bytes(os.urandom(3000))
    assert led.remaining() == Budget(0.75)
    assert _reserve(led, 0.25) == 2 and led.entry(1).status == "released"
    assert led.remaining() == Budget(0.5)


def test_cli_creates_a_missing_ledger_only_on_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.cli import main

    shutil.copytree(REPO / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("*.duckdb*"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    cfg = tmp_path / "examples" / "dpsql.toml"
    query = ["query", "SELECT COUNT(*) FROM events", "--epsilon", "0.5"]
    # create_if_missing does not apply to a --ledger given on the command line (a typo stays an
    # error); with a config that registers tables, --ledger is refused outright (the owner's ledger)
    assert main(["--config", str(cfg), "--ledger", str(tmp_path / "typo.duckdb"), *query]) == 2
    assert not (tmp_path / "typo.duckdb").exists()
    assert main(["--ledger", str(tmp_path / "typo.duckdb"), "--table", "e=examples/events.parquet",
                 "--privacy-unit", "e=user_id", "query", "SELECT COUNT(*) FROM e", "--epsilon", "0.5"]) == 4
    assert not (tmp_path / "typo.duckdb").exists()
    # without create_if_missing, the config's ledger is not created either
    plain = tmp_path / "examples" / "plain.toml"
    plain.write_text(cfg.read_text().replace("create_if_missing = true", ""))
    assert main(["--config", str(plain), *query]) == 4
    assert main(["--config", str(plain), "budget"]) == 4
    assert not (tmp_path / "examples" / "example_ledger.duckdb").exists()
    # the bundled example config creates it (the README's first command)
    assert main(["--config", str(cfg), *query]) == 0
    assert Ledger.open(tmp_path / "examples" / "example_ledger.duckdb").spent() == Budget(0.5)


def test_ledger_without_generation_counter_is_adopted(tmp_path: Path) -> None:
    """A ledger written before generations were counted (no meta row, no marker) opens, and its
    first write starts the counter and the marker."""
    import duckdb

    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    led.commit(_reserve(led, 0.25))
    con = duckdb.connect(str(path))
    con.execute("DELETE FROM ledger_meta WHERE key = 'generation'")
    con.close()
    marker = tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX)
    marker.unlink()
    try:  # the inode's copy of the marker, where the file system keeps one
        os.removexattr(path, "user.dpsql.generation")
    except OSError:
        pass
    assert led.remaining() == Budget(0.75) and not marker.exists()
    _reserve(led, 0.25)
    assert marker.read_text().startswith(f"dpsql ledger generation {1:020d} id ")
    assert Ledger.open(path).remaining() == Budget(0.5)
