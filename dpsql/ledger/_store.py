"""The durable budget ledger: a DuckDB file that records every privacy charge.

Privacy argument (design invariants 3 and 6)
--------------------------------------------
* The total budget lives in the ledger file (the newest row of ``ledger_totals``), never only in
  memory; a new process reads it back. Changing it is an explicit, logged ``set_total``.
* ``reserve`` runs ONE transaction that reads every counted charge, decides
  ``spent + cost <= total`` exactly (``dpsql.budget.exact_counted_sum_fits``, the one rounding rule) and
  inserts the new charge as ``reserved``. ``reserve`` returns only once that row is in the main
  ledger file (COMMIT, then a CHECKPOINT that succeeded), so the caller reads private rows only
  after the charge is durable there. Any failure on the way raises ``LedgerError`` and the
  caller reads nothing.
* A reserved charge counts whatever happens next: ``released`` and ``failed`` entries count too
  (a failed run may have touched private data). Only zero-cost ``reused`` entries add nothing.
* A missing ledger is never created implicitly: only :meth:`Ledger.create` (``dpsql init``) or
  ``Ledger.open(..., create=True)`` create one, and the latter refuses when a generation marker
  shows that a ledger existed at that path before (a deleted ledger is not a fresh budget); a
  plain open then says so too.

Exclusion: why two operations on one ledger never interleave
------------------------------------------------------------
Claim: between the moment DuckDB first touches the ledger file for an operation (reading its
headers) and the moment it has closed it again (after COMMIT, CHECKPOINT and DETACH), no other
dpsql operation on the same file, in any thread or process that reaches the file by any path,
touches it.

1. Every operation first takes ``flock(LOCK_EX)`` on a descriptor of the ledger file itself
   (opened ``O_RDONLY``), and only then lets DuckDB open the file (``ATTACH``); it releases the
   flock only after DuckDB has detached the file. The flock is the first and last thing done.
2. ``flock`` locks belong to the *inode*, not the path: hard links, bind mounts, symlinks and
   case variants of a path all name the same inode, so they contend for one lock. (A sidecar
   ``<path>.lock`` would not: two hard links in different directories have two sidecars.)
3. ``flock`` locks are held per open file description. Each waiter in this process uses its
   own descriptor (a small pool per inode, keyed by ``(st_dev, st_ino)``), so threads of one
   process exclude each other exactly as processes do. Descriptors are opened ``O_CLOEXEC``,
   and in a forked child the at-fork hook (``os.register_at_fork``) closes every inherited
   descriptor of the lock pool and of the waiting queue: a child never shares an open file
   description, hence a lock, with its parent, so a parent killed while holding the lock
   leaves the ledger unlocked even while its children live on.
4. On Linux ``flock`` and DuckDB's ``fcntl`` record locks are independent (verified: a flock
   held by one process does not stop DuckDB in the same process from locking, and blocks
   another process's flock). But closing ANY descriptor of a file drops every ``fcntl`` lock the
   process holds on it (verified: after closing a second descriptor, another process could open
   the database read-write while the first still had it open). So the pool closes an inode's
   descriptors only when no waiter of the process uses that inode and the process's ledger
   DuckDB instance has nothing of it attached (DuckDB then holds no lock on it); between
   operations a file ledger holds no descriptor. (A DuckDB connection of the application's own
   on the ledger file is not supported: dpsql never shares one, see below.)
5. After the flock is granted the path is stat'ed again; if it no longer names the locked inode
   (the file was replaced or removed) the lock is released and the operation starts over or
   reports the missing ledger, so DuckDB opens the locked file (short of a program that is not
   dpsql replacing the file in the instant between that check and the open).
6. Waiting is a loop of non-blocking ``flock`` attempts with short pauses (growing from 0.5 ms
   to at most 5 ms) until ``lock_timeout``: no helper thread and no blocked call outlives a
   time-out, and nothing is left holding or awaiting a lock after the caller gave up. In front
   of it, a first-come-first-served waiting queue of slot files (see ``_queue_enter``) keeps the
   latency tail short; it plays no part in the exclusion argument.
Hence DuckDB's unlocked header read (a DuckDB open reads the headers, then takes its own file
lock without re-reading them) can never see a state that another dpsql operation is about to
change: the budget check, the insert, the checkpoint and the close all happen inside one
exclusive section. Processes that are not dpsql (a ``duckdb`` shell) do not take the flock;
DuckDB's own lock still refuses them while dpsql has the file open, and while they hold it
dpsql waits (retrying DuckDB's lock until ``lock_timeout``). Network file systems that emulate
flock with fcntl locks (NFS) break item 4 and are not supported for ledgers.

Durability and lost write-ahead logs
------------------------------------
* Every write transaction ends with COMMIT (DuckDB appends to ``<path>.wal`` and fdatasyncs it)
  and then CHECKPOINT (DuckDB writes the change into the main file, fdatasyncs it, removes the
  WAL). A failed CHECKPOINT is not ignored: the operation raises ``LedgerError`` saying that
  the change is recorded in the WAL only; for ``reserve`` that means the charge stands and the
  query does not run (nothing is read). DuckDB invalidates the attached database after a
  failed checkpoint; the next operation re-attaches and replays the WAL, and a write first
  checkpoints it: if that fails again (the disk is still full) the write is refused before it
  adds anything, so retries do not pile up charges that fail the same way.
* Why every write checkpoints, not only ``reserve``: DuckDB names the WAL after the path it was
  given (``<path>.wal``), so a WAL left behind by a write through one name of the file (a hard
  link, a bind mount) is invisible to an open through another name, which would then write a
  newer main file; DuckDB then refuses the stale WAL ("WAL checkpoint iteration does not
  match"). So no WAL outlives a successful operation. DETACH is told not to checkpoint by
  itself (``disable_checkpoint_on_shutdown``) so that the explicit, checked CHECKPOINT is the
  only place this happens.
* Each write transaction also increments a generation counter stored in the ledger
  (``ledger_meta.generation``). After its COMMIT (the change is durable in the WAL) and BEFORE
  its CHECKPOINT, the operation raises that generation in two places outside the file: a
  marker file ``.<name>.generation`` next to the resolved path (hidden, like the queue files,
  so ``rm ledger.duckdb*`` before a restore does not remove it; fixed width, updated in place,
  fsynced when created; a marker ``<name>.generation`` of earlier releases is still read and
  kept up to date, never created) and the extended attribute ``user.dpsql.generation`` of the
  file's inode, where the file system keeps extended attributes (ext4, xfs, btrfs, tmpfs; it
  is skipped elsewhere). Every later operation compares the highest of them with the file and
  refuses with ``LedgerError`` when the ledger holds an older generation: the file lacks
  acknowledged changes (a deleted or truncated WAL, a restore of an old copy, or a change whose
  CHECKPOINT failed and that lives only in the WAL of another name of the file), which would
  otherwise silently give budget back. Because the markers go up before the CHECKPOINT, a
  charge that the caller was told "stands" (a failed CHECKPOINT) is protected too: losing its
  WAL is refused, not accepted. The attribute belongs to the inode, so every name of the file
  (hard links in other directories, bind mounts) sees it; the marker files are per directory.
  The markers are lower bounds (a crash or power loss can lose an update, leaving an older
  value) and are raised only after the change is durable in the WAL, so they never cause a
  false refusal: an open through the name whose WAL holds the change replays it. The check is
  also a second line of defence against the stale-header race above: an open that works on
  headers older than an acknowledged change sees a generation below the marker and refuses
  (seen in the test that disables the flock). Opening a missing ledger whose marker file
  exists says that a ledger existed there (restore it; ``dpsql init`` would start a new
  budget).
* Generations alone cannot tell two ledgers apart: another ledger file put in this one's place
  (a wrong backup, another budget's ledger) that was written at least as often would pass. So
  each ledger has a random identity (``ledger_meta.ledger_id``, 128 bits) that the marker files
  record with the generation, and a file of another identity than its marker is refused. A
  ledger created at a path where a deleted ledger's marker lies records that marker's identity
  (``created_over``) and is accepted over it (its generation is higher), so a creation killed
  before it rewrote the marker leaves a usable ledger; the creator holds the new file's inode
  lock from before it has its name until the marker names it.
* Creation is atomic: the new ledger is built under a temporary name in the same directory,
  checkpointed and fsynced, then published with ``link(2)`` (which, unlike ``rename``, fails if
  the name exists, so a concurrent creator is never overwritten), and the directory is fsynced.
  A crash leaves either no ledger or a complete one (plus at most an unused temporary file
  named ``.<name>.creating-*``).

DuckDB connections
------------------
Opening a DuckDB database instance costs about 12 ms of CPU, mostly building the instance, so
each process keeps one private in-memory DuckDB instance for ledger work and each operation
``ATTACH``es the ledger file to it (an idle machine runs ATTACH, the transaction, CHECKPOINT and
``DETACH`` in a few ms; a write costs three fdatasyncs: the WAL at COMMIT, the main file twice
at CHECKPOINT). Nothing is held open between operations. DuckDB also refuses to attach a file that
another DuckDB connection in the same process has open ("Unique file handle conflict"); dpsql
then waits for that connection to close until ``lock_timeout``, and never shares it.

What one operation costs (docs/performance.md, "The ledger's two writes per query"): DuckDB spends
0.2-1 ms of CPU on every statement however small the tables (binding, optimizing; an INSERT about
1 ms) and 2.5-3.5 ms on a CHECKPOINT, so nothing is asked twice. After ATTACH, USE and BEGIN, ONE
statement reads every ``ledger_meta`` row (schema version, generation, identity; it binds only if
all three tables exist); ONE more reads the total and what is spent: a grouping of
``ledger_entries`` by value and by whether the entry counts (its largest id gives the next one),
with every row of ``ledger_totals`` appended (a row per ``set_total``, the newest picked in
Python). A reserve runs 10 statements, a commit 10, a read 7 (``tests/test_ledger_work.py``).
The path is resolved once per operation, after the flock; the marker files and the attribute are
read once for the generation and identity checks (under the flock, as before) and each marker once
more right before it is raised, so a marker is never lowered.

In-memory ledgers (``path=None``) keep one DuckDB connection for the object's lifetime; they
are for notebooks and tests only: the budget dies with the process.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import itertools
import json
import math
import os
import random
import re
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from importlib import resources
from typing import Any

import duckdb
import pyarrow as pa

from dpsql import _inherited as inherited
from dpsql.budget import Budget, compose_counted, counted_remaining, exact_counted_sum_fits
from dpsql.errors import BudgetExceededError, ConfigError, LedgerBusyError, LedgerError, interrupted_by_signal
from dpsql.interrupts import HeldInterrupt as _HeldInterrupt
from dpsql.interrupts import change_stands as _change_stands
from dpsql.interrupts import interruption_point as _interruption_point

#: The ledger schema version this code reads and writes. ``schema.sql`` inserts the same value.
SCHEMA_VERSION = 1

#: Entry statuses whose cost counts towards the spent budget (basic composition).
COUNTING_STATUSES = ("reserved", "released", "failed")

_REQUIRED_TABLES = ("ledger_meta", "ledger_totals", "ledger_entries")

_INIT_HINT = "create it with `dpsql init --epsilon 1.0 --delta 1e-6 --ledger {path}` (choose your total)"

#: Suffix of the generation marker file kept next to a ledger file.
GENERATION_SUFFIX = ".generation"

#: The counted costs grouped by value, with whether they count, how many, the first and the last id
#: (``Ledger._spent_counts``; the same text runs on DuckDB and PostgreSQL).
_SPENT_SQL = (
    f"SELECT epsilon, delta, status IN ({', '.join(repr(s) for s in COUNTING_STATUSES)}), COUNT(*), MIN(entry_id), "
    "MAX(entry_id) FROM ledger_entries GROUP BY 1, 2, 3"
)
#: ``_SPENT_SQL`` and every total (a row per change, marked by the count -1; a group counts at least one
#: entry): one statement for what a reserve decides on.
_STATE_SQL = _SPENT_SQL + " UNION ALL SELECT epsilon, delta, NULL, -1, change_id, NULL FROM ledger_totals"

_ENTRY_COLUMNS = (
    "entry_id, created_at, updated_at, status, mechanism, epsilon, delta, query, tables, params, "
    "failure_reason, synopsis_key, synopsis, source_entry_id"
)


@functools.cache
def schema_sql() -> str:
    """The ledger schema DDL (``dpsql/ledger/schema.sql``), the single source of truth."""
    return resources.files("dpsql.ledger").joinpath("schema.sql").read_text(encoding="utf-8")


def _fp_hint(cost: Budget, remaining: Budget, params: Mapping[str, Any]) -> str:
    """When only a Gaussian sampler's floating-point delta (``fp_delta``, docs/mechanisms.md §5.4) pushes
    the charge over the remaining delta, say so and name a delta that fits. The part grows as delta
    falls (its noise scale does), so the named delta leaves it twice, and is named only when it keeps
    at least half of what remains (the scale then grows by well under 2x); a larger part gets the
    explanation without a number (a delta near it would be refused, the part exceeding it).

    The request's own delta is ``cost.delta - fp`` up to the rounding of their sum (rounded up to a
    float whose decimal is at least the exact sum: within two ulps): a request of exactly the
    remaining delta often reads an ulp or two over it."""
    fp = params.get("fp_delta")
    if not isinstance(fp, float) or not 0 < fp < cost.delta or cost.exact_epsilon > remaining.exact_epsilon:
        return ""
    asked = Fraction(cost.delta) - Fraction(fp) - 2 * Fraction(math.ulp(cost.delta))
    if asked > remaining.exact_delta or cost.exact_delta <= remaining.exact_delta:
        return ""
    words = (f"the charge is the delta asked for plus the Gaussian sampler's floating-point delta {fp:.3g} (fp_delta), "
             "so asking for exactly the remaining delta does not fit: ")
    fits = remaining.delta - 2.0 * fp
    if not fits >= remaining.delta / 2:
        return words + "that part is too large a share of what remains for a nearby delta to fit; "
    text = next(t for t in (f"{fits:.{d}g}" for d in range(3, 18)) if float(t) <= fits)  # never rounded up
    return words + f"ask for delta={text} or less; or "


@dataclass(frozen=True)
class LedgerEntry:
    """One row of the ledger (a charge, or a zero-cost reuse of a stored synopsis)."""

    entry_id: int
    status: str
    mechanism: str
    cost: Budget
    query: str
    tables: tuple[str, ...]
    params: dict[str, Any] = field(hash=False)
    created_at: datetime
    updated_at: datetime
    failure_reason: str | None = None
    synopsis_key: str | None = None
    source_entry_id: int | None = None

    @property
    def counts(self) -> bool:
        """Whether this entry's cost counts towards the spent budget."""
        return self.status in COUNTING_STATUSES


# --------------------------------------------------------------------------------------------
# process-wide state: flock descriptors per ledger inode, the DuckDB instance used for ledgers


class _ProcessState:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.mutex = threading.Lock()
        #: idle descriptors of each ledger inode, keyed by (st_dev, st_ino)
        self.free_fds: dict[tuple[int, int], list[int]] = {}
        #: descriptors of each inode handed out to waiters and lock holders (and their count)
        self.used_fds: set[int] = set()
        self.in_use: dict[tuple[int, int], int] = {}
        #: other descriptors open for the ledger machinery (queue slots, a predecessor's slot)
        self.other_fds: set[int] = set()
        #: what the ledger DuckDB instance has attached right now: alias -> (real path, inode key)
        self.attached: dict[str, tuple[str, tuple[int, int]]] = {}
        self.base: duckdb.DuckDBPyConnection | None = None
        #: the instance holding in-memory ledgers' catalogs (``_memory_catalog``), never closed
        self.memory: duckdb.DuckDBPyConnection | None = None
        self.aliases = itertools.count(1)


_STATE = _ProcessState()
_FORGOTTEN: list[_ProcessState] = []
#: real paths that a DuckDB instance inherited through fork had attached (see _attach)
_INHERITED_ATTACHED: set[str] = set()


def _reset_after_fork() -> None:
    # The child must not share open file descriptions (hence flocks) or a DuckDB instance with
    # its parent. Every inherited descriptor of the ledger machinery is closed: a flock belongs
    # to the open file description, so a descriptor kept in the child would keep the parent's
    # inode lock or queue slot locked after the parent died. Closing cannot drop a DuckDB lock:
    # fcntl record locks are not inherited through fork, so the child holds none yet. (The
    # other threads of the parent do not exist in the child, so the structures are read
    # without their mutex.) The parent's DuckDB instance is kept referenced: destroying it in
    # the child (whose DuckDB threads were not copied by fork) crashes the process. A ledger it
    # had attached stays registered in this process (see _attach).
    global _STATE
    old = _STATE
    for fd in [*old.used_fds, *old.other_fds, *(f for fds in old.free_fds.values() for f in fds)]:
        try:
            os.close(fd)
        except OSError:
            pass
    if old.base is not None:
        _INHERITED_ATTACHED.update(path for path, _key in old.attached.values())
    for con in (old.base, old.memory):  # a module's list is emptied at interpreter exit: the instance then destroyed
        if con is not None:
            inherited.keep(con)
    _FORGOTTEN.append(old)
    _STATE = _ProcessState()


os.register_at_fork(after_in_child=_reset_after_fork)


def _state() -> _ProcessState:
    if _STATE.pid != os.getpid():  # forked without the at-fork hook (defensive)
        _reset_after_fork()
    return _STATE


#: Test hooks: name -> callable(path), run at the named points of every file operation
#: ("before_queue", "before_attach" (flock held), "after_attach", "before_commit",
#: "before_checkpoint", "before_marker", "after_detach"; in creation "create_schema",
#: "create_checkpoint", "create_link", "create_marker"). Empty in production.
_HOOKS: dict[str, Any] = {}


def _recorded(e: LedgerError) -> LedgerError:
    """Mark a failure that came after the change was committed (``recorded``): for a reserve, the
    charge stands although the operation failed."""
    e.recorded = True
    return e


def _hook(name: str, path: str) -> None:
    f = _HOOKS.get(name)
    if f is not None:
        f(path)


# --------------------------------------------------------------------------------------------
# small helpers


def _fmt(b: Budget) -> str:
    return f"(epsilon={b.epsilon!r}, delta={b.delta!r})"
def _plain_budget(eps: object, delta: object) -> Budget | None:
    """``Budget(eps, delta)`` for the common case, two valid non-negative doubles, without the general
    validation (a few microseconds per distinct charge, inside the ledger's lock); None otherwise
    (the caller then validates, and names an invalid value)."""
    if type(eps) is float and type(delta) is float and 0.0 <= eps < math.inf and 0.0 <= delta < 1.0:
        b = object.__new__(Budget)
        object.__setattr__(b, "epsilon", eps + 0.0)
        object.__setattr__(b, "delta", delta + 0.0)
        return b
    return None


def check_new_total(total: Budget) -> None:
    """A new ledger's total: its epsilon must be above 0 (a total of 0 is created, and answers no query)."""
    if total.epsilon == 0:
        raise ConfigError("a new ledger with a total of epsilon=0 allows no query (every answer costs some epsilon)",
                          hint="choose the total budget, e.g. Budget(epsilon=1.0, delta=1e-6) (dpsql init --epsilon 1.0 "
                          "--delta 1e-6)")


def _check_budget(value: object, what: str) -> Budget:
    if not isinstance(value, Budget):
        raise ConfigError(
            f"{what} must be a dpsql Budget, got {type(value).__name__}",
            hint="pass e.g. Budget(epsilon=1.0, delta=1e-6)",
        )
    return value


def _json_default(o: object) -> Any:
    if isinstance(o, Budget):
        return {"epsilon": o.epsilon, "delta": o.delta}
    if isinstance(o, Fraction):
        return str(o)
    if isinstance(o, set | frozenset):
        return sorted(o)
    tolist = getattr(o, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return tolist()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _to_json(obj: object, what: str) -> str:
    try:
        text = json.dumps(obj, sort_keys=True, allow_nan=False, default=_json_default, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{what} must be JSON-serialisable with finite numbers: {e}",
            hint="record plain numbers, strings, lists and dicts (no NaN/inf, no arbitrary objects)",
        ) from None
    if "\\ud" in text and not _utf8(json.dumps(json.loads(text), ensure_ascii=False)):
        # a lone surrogate (as Python decodes bytes that are not UTF-8): DuckDB's and PostgreSQL's JSON refuse it
        raise ConfigError(f"the ledger cannot store {what}: a string in it is not valid Unicode (a lone surrogate, "
                          "as Python decodes bytes that are not UTF-8)",
                          hint="pass text encoded as UTF-8")
    return text


def _check_str(value: object, what: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        kind = "a string" if allow_empty else "a non-empty string"
        raise ConfigError(f"{what} must be {kind}, got {type(value).__name__} {value!r:.60}")
    if "\x00" in value or not value.isascii() and not _utf8(value):
        raise ConfigError(
            f"the ledger cannot store {what} {value!r:.60}: it holds "
            + ("a NUL character" if "\x00" in value else "text that is not valid Unicode (a lone surrogate, as "
               "Python decodes bytes that are not UTF-8)"),
            hint="pass text encoded as UTF-8, without NUL characters",
        )
    return value


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_tables(tables: object) -> list[str]:
    if isinstance(tables, str) or not isinstance(tables, Sequence):
        raise ConfigError(
            f"tables must be a list of table names, got {tables!r}", hint='pass tables=["events"]'
        )
    out = []
    for t in tables:
        out.append(_check_str(t, "each table name"))
    return out


def _check_id(entry_id: object) -> int:
    if isinstance(entry_id, bool) or not isinstance(entry_id, int):
        raise LedgerError(
            f"ledger entry ids are integers, got {entry_id!r}",
            hint="pass the id returned by Ledger.reserve() or Ledger.record_reuse()",
        )
    return entry_id


def _utf8_path(p: str) -> str:
    """``p``, refused when it is not UTF-8 text (a byte that is not UTF-8 reaches Python as a lone
    surrogate): DuckDB opens only files whose names are UTF-8, and failed on such a path with a
    'Python Conversion Failure' after dpsql had begun (its message blamed the disk). A NUL character
    (which no file name holds: Python's file functions raised a bare ValueError) is refused too."""
    if "\0" in p:
        raise ConfigError(
            f"the ledger path {p!r} contains a NUL character, which no file name can hold; nothing was created or "
            "charged",
            hint="give the ledger's path without the NUL character (e.g. path = \"ledger.duckdb\" under [ledger])",
        )
    bad = next((c for c in p if "\udc80" <= c <= "\udcff"), None)
    if bad is not None:
        raise ConfigError(
            f"the ledger path {p!r} is not UTF-8 text (byte 0x{ord(bad) - 0xDC00:02X} is not UTF-8): DuckDB opens only "
            "files whose names are UTF-8; nothing was created or charged",
            hint="give the ledger a path that is UTF-8 text (rename the file, together with its hidden "
            ".NAME.generation marker, if it exists)",
        )
    _not_a_connection_string(p)
    return p


#: a PostgreSQL connection string that is no URL dpsql reads, in a ledger path made absolute: a scheme naming
#: PostgreSQL in another case, with a driver or after a space ('PostgreSQL://', 'postgresql+psycopg://'; as a path
#: its '//' is one '/'), or libpq's key=value form (a password, or two of its keywords)
_PG_SCHEME = re.compile(r"(?:^|/)(\s*)(postgres(?:ql)?(?:\+[\w.-]*)?):/", re.I)
_PG_KEYWORD = re.compile(r"(^|[\s/])(host|hostaddr|port|dbname|user|password|passfile|sslmode|service|options)\s*=",
                         re.I)


def _not_a_connection_string(p: str) -> None:
    """Refuse a ledger path that is a PostgreSQL connection string dpsql does not read as one (no file of that
    name exists): taken for a file, its refusal ('no budget ledger at ...', 'dpsql init --ledger ...') printed
    the password it holds. The text is not shown, only what it looks like."""
    scheme = _PG_SCHEME.search(p)
    pairs = _PG_KEYWORD.findall(p)
    keys = {k.lower() for _, k in pairs}
    # libpq separates its pairs by spaces (a directory of a partitioned layout, /lake/host=a/port=1/, by slashes)
    conninfo = "password" in keys or (len(keys) >= 2 and any(sep.isspace() for sep, _ in pairs))
    if (scheme is None and not conninfo) or os.path.lexists(p):
        return
    seen = ("libpq's key=value form" if scheme is None else
            f"a URL of scheme {scheme.group(2)!r}" + (" after a space" if scheme.group(1) else ""))
    raise ConfigError(
        f"the ledger is a PostgreSQL connection string ({seen}) that dpsql does not read as one, and as a file path it "
        "names no ledger; it is not shown, as it may hold a password; nothing was created or charged",
        hint="name a PostgreSQL ledger by a URL that starts with exactly postgresql:// or postgres:// (lower case, "
        "nothing before it, no driver such as +psycopg): postgresql://USER@HOST:PORT/DATABASE (the password in "
        "~/.pgpass or $PGPASSWORD); in dpsql.toml, under [ledger] as url = \"...\"",
    )


#: bytes that the hidden files beside a ledger add to its name (".NAME.creating-PID-RANDOM", ".NAME.q-PID-N-RANDOM")
_SIDE_NAME_ROOM = 40


def _check_name_room(p: str) -> None:
    """Refuse a ledger file name that leaves no room, within the file system's longest name, for the
    hidden files dpsql keeps beside it (they failed in DuckDB with 'File name too long')."""
    d, name = os.path.split(p)
    try:
        most = os.pathconf(d if os.path.isdir(d) else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        return
    n = len(os.fsencode(name))
    if n + _SIDE_NAME_ROOM > most:
        raise ConfigError(
            f"the ledger file name {name[:24]}... is {n} bytes long: dpsql keeps hidden files beside the ledger whose "
            f"names add up to {_SIDE_NAME_ROOM} bytes to it, beyond this file system's limit of {most}; nothing was created",
            hint=f"give the ledger a name of at most {most - _SIDE_NAME_ROOM} bytes",
        )


def _lock_holder(msg: str) -> str:
    m = re.search(r"\(PID (\d+)\)", msg)
    return f" (PID {m.group(1)})" if m else ""




# --------------------------------------------------------------------------------------------


class _Txn:
    """What one ledger transaction is about, for honest messages when something fails."""

    def __init__(self, unchanged: str) -> None:
        #: what is true when the change was NOT made (lock timeout, error before COMMIT)
        self.unchanged = unchanged
        #: what is recorded once COMMIT succeeded (set by the body when it knows, e.g. the id)
        self.committed = "the change is recorded"
        #: whether the body wrote anything (False e.g. for set_total to the same total)
        self.wrote = True
        #: the entry the body gives a status, and that status (:meth:`Ledger.last_entry`), once COMMIT returned
        self.note: tuple[int, str] | None = None



class Ledger:
    """A durable privacy-budget ledger stored in a DuckDB file.

    Build one with :meth:`create` or :meth:`open`; the constructor is internal. The object holds
    no file handle: every method locks the file, runs one transaction and closes it again, so
    any number of threads and processes can share one ledger file safely.
    """

    path: str | None

    def __init__(self, path: str | None, *, lock_timeout: float = 10.0) -> None:
        try:
            ok = (not isinstance(lock_timeout, bool) and isinstance(lock_timeout, int | float)
                  and math.isfinite(lock_timeout) and lock_timeout >= 0)
        except OverflowError:  # an int beyond the float range
            ok = False
        if not ok:
            raise ConfigError(
                f"lock_timeout must be a finite number of seconds >= 0, got {lock_timeout!r}",
                hint="pass e.g. lock_timeout=10.0",
            )
        self.lock_timeout = float(lock_timeout)
        self._closed = False
        self._mem: duckdb.DuckDBPyConnection | None = None
        self._mem_lock = threading.Lock()
        self._mem_pid = os.getpid()  # an in-memory ledger's budget exists in this process only
        self._mem_gone: weakref.finalize[Any, Any] | None = None
        self._identity: str | None = None  # of the file ledger this object used first (_file_txn)
        self._inside: set[tuple[int, int]] = set()  # (process, thread) inside a transaction (_txn)
        self.path = None if path is None else _utf8_path(os.path.abspath(os.fspath(path)))

    # construction --------------------------------------------------------------------------
    @classmethod
    def create(
        cls, path: str | os.PathLike[str] | None, total: Budget, *, lock_timeout: float = 10.0
    ) -> Ledger:
        """Create a new ledger with ``total`` budget (what ``dpsql init`` does). ``path=None``
        makes an in-memory ledger (notebooks/tests only). Refuses to touch an existing file.

        The file appears atomically: built under a temporary name in the same directory, made
        durable, then linked into place (never over an existing file)."""
        check_new_total(_check_budget(total, "total"))
        ledger = cls(None if path is None else os.fspath(path), lock_timeout=lock_timeout)
        if ledger.path is None:
            ledger._mem = _memory_catalog(ledger)
            with ledger._txn(write=True, creating=True) as (con, _):
                ledger._init_schema(con, total, generation=1, fresh=True)
            return ledger
        ledger._create_file(total)
        return ledger

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None,
        total: Budget | None = None,
        *,
        create: bool = False,
        lock_timeout: float = 10.0,
    ) -> Ledger:
        """Open the ledger at ``path`` and use its recorded total.

        If ``total`` is given it must equal the recorded total exactly (else ``ConfigError``:
        changing a total is the explicit, recorded :meth:`set_total`). A missing file is a
        ``LedgerError`` unless ``create=True`` and ``total`` is given: then a new ledger with that
        total is created, except where a generation marker shows that a ledger existed at this
        path before (a deleted ledger is never silently replaced by a fresh budget).
        """
        if total is not None:
            _check_budget(total, "total")
        if not isinstance(create, bool):
            raise ConfigError(f"create must be True or False, got {create!r}")
        if path is None:
            if total is None:
                raise LedgerError(
                    "an in-memory ledger (path=None) has no recorded total",
                    hint="pass total=Budget(epsilon=..., delta=...) or give the path of a ledger file",
                )
            return cls.create(None, total, lock_timeout=lock_timeout)
        p = _utf8_path(os.path.abspath(os.fspath(path)))
        if not os.path.lexists(p):
            existed = _path_marker(p)
            if existed is not None and not os.path.lexists(p):
                raise LedgerError(
                    f"no budget ledger at {p}, but a ledger existed here: its generation marker "
                    f"{existed[1]} records that it held {existed[0]} acknowledged changes",
                    hint="restore the ledger file from a backup (dpsql then checks that the copy holds "
                    "every recorded charge). `dpsql init` at this path would start a NEW budget, as if "
                    "nothing had been spent: do that only if the data owner decides so",
                )
            if not create:
                where = os.path.dirname(p)  # a mistyped directory: said, as `dpsql init` there would fail too
                gone = "" if os.path.isdir(where) else f" (its directory {where} does not exist either: check the path)"
                raise LedgerError(
                    f"no budget ledger at {p}{gone}",
                    hint=f"{_INIT_HINT.format(path=p)}; if the path is right and the ledger was moved or "
                    "lost, restore it from a backup (dpsql never starts a fresh budget by itself)",
                )
            if total is None:
                raise LedgerError(
                    f"no budget ledger at {p}, and no total to create one with",
                    hint=f"pass the total budget together with create=True, or {_INIT_HINT.format(path=p)}",
                )
            if existed is None:
                try:
                    return cls.create(p, total, lock_timeout=lock_timeout)
                except LedgerError:
                    if not os.path.lexists(p):
                        raise
                    # another process created it between our check and our link: open it
        ledger = cls(p, lock_timeout=lock_timeout)
        recorded = ledger.total()  # validates the file
        if total is not None and total != recorded:
            raise ConfigError(
                f"ledger {p} records a total budget of {_fmt(recorded)}, but {_fmt(total)} was passed; "
                "the total is read from the ledger, and changing it is an explicit, recorded operation",
                hint="omit the total to use the recorded one, or change it on purpose with "
                "`dpsql budget --set-total EPS DELTA --reason ...` or "
                "Ledger.set_total(Budget(...), reason='...') (the change is logged in the ledger)",
            )
        return ledger

    # public API ------------------------------------------------------------------------------
    def total(self) -> Budget:
        """The total budget, read from the ledger."""
        with self._txn(write=False) as (con, _t):
            return self._total(con)

    def spent(self) -> Budget:
        """Basic composition of every counted entry (reserved, released and failed)."""
        with self._txn(write=False) as (con, _t):
            return compose_counted(self._spent_counts(con)[0])

    def remaining(self) -> Budget:
        """total - spent (exact, floored at zero per coordinate), from one consistent snapshot."""
        with self._txn(write=False) as (con, _t):
            spent, _, total = self._budget_state(con)
            return counted_remaining(spent, total)

    def reserve(
        self, cost: Budget, *, mechanism: str, query: str, tables: list[str], params: dict[str, Any]
    ) -> int:
        """Charge ``cost`` durably before any private row is read; returns the entry id.

        One transaction: read what is spent, check ``spent + cost <= total`` exactly, insert a
        ``reserved`` row, commit (WAL fsync). If it does not fit, raise ``BudgetExceededError``
        and change nothing.
        """
        _check_budget(cost, "cost")
        _check_str(mechanism, "mechanism")
        _check_str(query, "query", allow_empty=True)
        tables = _check_tables(tables)
        if not isinstance(params, Mapping):
            raise ConfigError(f"params must be a dict of mechanism parameters, got {type(params).__name__}")
        params_json = _to_json(dict(params), "params")
        with self._txn(write=True, unchanged="nothing was charged") as (con, t):
            spent, entry_id, total = self._budget_state(con)
            if not exact_counted_sum_fits(spent, cost, total):
                remaining = counted_remaining(spent, total)
                over = [
                    name
                    for name, need, have in (
                        ("epsilon", cost.exact_epsilon, remaining.exact_epsilon),
                        ("delta", cost.exact_delta, remaining.exact_delta),
                    )
                    if need > have
                ]
                raise BudgetExceededError(
                    f"privacy budget exceeded ({' and '.join(over) or 'budget'}): this query needs "
                    f"{_fmt(cost)} but ledger {self._where()} has {_fmt(remaining)} remaining of its "
                    f"total {_fmt(total)}; nothing was charged",
                    requested=cost,
                    remaining=remaining,
                    hint=_fp_hint(cost, remaining, params)
                    + ("the ledger's total delta is 0, so only requests with delta 0 (pure DP) fit; "
                       if "delta" in over and total.delta == 0 else "")
                    + "ask for a smaller epsilon/delta, reuse an earlier release, or (if the data "
                    "owner agrees) raise the total with Ledger.set_total(..., reason='...')",
                )
            con.execute(
                "INSERT INTO ledger_entries (entry_id, created_at, updated_at, status, mechanism, epsilon, "
                "delta, query, tables, params) VALUES (?, current_timestamp, current_timestamp, 'reserved', "
                "?, ?, ?, ?, ?, ?)",
                [entry_id, mechanism, cost.epsilon, cost.delta, query, tables, params_json],
            )
            t.note = (entry_id, "reserved")
            t.committed = (
                f"the charge of entry {entry_id} {_fmt(cost)} stands (it counts against the budget) and is "
                "recorded"
            )
        return entry_id

    def commit(
        self,
        entry_id: int,
        *,
        params_update: dict[str, Any] | None = None,
        synopsis_key: str | None = None,
        synopsis: str | None = None,
    ) -> None:
        """Mark a reserved entry ``released``, durably.

        ``params_update`` may add parameters known only after the run (it may not change a
        recorded one). ``synopsis_key``/``synopsis`` (JSON text) store a synopsis for free
        post-processing reuse via :meth:`find_synopsis` / :meth:`record_reuse`.
        """
        entry_id = _check_id(entry_id)
        if (synopsis_key is None) != (synopsis is None):
            raise ConfigError(
                "commit() needs both synopsis_key and synopsis, or neither",
                hint="pass synopsis_key='...' together with synopsis='<json text>'",
            )
        if synopsis_key is not None:
            _check_str(synopsis_key, "synopsis_key")
            if not isinstance(synopsis, str):
                raise ConfigError(f"synopsis must be JSON text (str), got {type(synopsis).__name__}")
            try:
                json.loads(synopsis)
            except ValueError as e:
                raise ConfigError(
                    f"synopsis is not valid JSON ({e.__class__.__name__} at position {getattr(e, 'pos', '?')})",
                    hint="serialise the synopsis with json.dumps(...)",
                ) from None
        if params_update is not None and not isinstance(params_update, Mapping):
            raise ConfigError(f"params_update must be a dict, got {type(params_update).__name__}")
        update = json.loads(_to_json(dict(params_update or {}), "params_update"))
        stands = (
            f"entry {entry_id} stays 'reserved': the charge stands (it counts against the budget), but its "
            "release was not recorded"
        )
        self._record_release(entry_id, update, synopsis_key, synopsis, stands, wait=self.release_wait(), again=False)

    def _record_release(self, entry_id: int, update: dict[str, Any], synopsis_key: str | None, synopsis: str | None,
                        stands: str, *, wait: float, again: bool) -> None:
        """:meth:`commit`'s transaction. ``again``: the same release once more, after a transaction of it was cut
        short where its COMMIT may have reached the ledger (the PostgreSQL ledger's lost connection): an entry
        found released with exactly these parameters and synopsis is that COMMIT, and nothing more is written."""
        with self._txn(write=True, unchanged=stands, wait=wait) as (con, t):
            t.committed = f"the release of entry {entry_id} (whose charge stands either way) is recorded"
            t.note = (entry_id, "released")
            if again:
                row = _first(con.execute(
                    "SELECT status, CAST(params AS VARCHAR), synopsis_key, CAST(synopsis AS VARCHAR) FROM ledger_entries "
                    "WHERE entry_id = ?", [entry_id]).fetchall())
                if row is not None and row[0] == "released" and (row[2], row[3]) == (synopsis_key, synopsis):
                    recorded = json.loads(row[1])
                    if all(k in recorded and recorded[k] == v for k, v in update.items()):
                        t.wrote = False
                        return
            status, params_text = self._row_for_transition(con, entry_id, "commit")
            params = json.loads(params_text)
            for k, v in update.items():
                if k in params and params[k] != v:
                    raise LedgerError(
                        f"commit({entry_id}) would change recorded parameter {k!r} of entry {entry_id} "
                        "(a recorded field never changes meaning); nothing was changed",
                        hint="record the post-run value under a new key, e.g. "
                        f"params_update={{'{k}_final': ...}}",
                    )
            params.update(update)
            con.execute(
                "UPDATE ledger_entries SET status = 'released', updated_at = current_timestamp, "
                "params = ?, synopsis_key = ?, synopsis = ? WHERE entry_id = ?",
                [_to_json(params, "params"), synopsis_key, synopsis, entry_id],
            )

    def _noted(self, t: _Txn) -> None:
        """Once a transaction's COMMIT returned (Ctrl-C still held back): the status it gave the entry that this thread
        reserved last through this object (:meth:`last_entry`)."""
        if t.note is None:
            return
        notes = self.__dict__.setdefault("_last_entries", {})
        me = threading.get_ident()
        if t.note[1] == "reserved" or notes.get(me, (None,))[0] == t.note[0]:
            notes[me] = t.note

    def last_entry(self) -> tuple[int, str] | None:
        """The entry this thread reserved last through this object and the status this object has recorded for it since
        (``'reserved'``, ``'released'``, ``'failed'``), or None: what a request cut short by a signal (Ctrl-C, SIGTERM)
        leaves in the ledger, which the Session names on its KeyboardInterrupt (``ledger_entry``). Kept in memory:
        no ledger read."""
        return self.__dict__.get("_last_entries", {}).get(threading.get_ident())  # type: ignore[no-any-return]

    def release_wait(self) -> float:
        """How long recording a release (:meth:`commit`) waits for the ledger's lock: its query has read private rows
        and its charge stands, so giving up would discard an answer already paid for. ``lock_timeout`` and then the
        bound on a frozen holder's hold (10 s, or twice ``lock_timeout``: the PostgreSQL ledger cuts such a holder
        off then). The wait depends on other processes' ledger operations only, never on the data."""
        return self.lock_timeout + max(10.0, 2 * self.lock_timeout)

    def fail(self, entry_id: int, reason: str) -> None:
        """Mark a reserved entry ``failed``. Its cost still counts. ``reason`` is stored as given
        and must not contain private values (the caller's job)."""
        entry_id = _check_id(entry_id)
        _check_str(reason, "reason", allow_empty=True)
        stands = (
            f"entry {entry_id} stays 'reserved': the charge stands (it counts against the budget), but the "
            "failure was not recorded"
        )
        self._record_failure(entry_id, reason, stands, wait=None, again=False)

    def _record_failure(self, entry_id: int, reason: str, stands: str, *, wait: float | None, again: bool) -> None:
        """:meth:`fail`'s transaction. ``again``: the same failure once more, after a transaction of it was cut short
        where its COMMIT may have reached the ledger (the PostgreSQL ledger's lost connection): an entry found failed
        with exactly this reason is that COMMIT, and nothing more is written."""
        with self._txn(write=True, unchanged=stands, wait=wait) as (con, t):
            t.committed = f"the failure of entry {entry_id} (whose charge stands either way) is recorded"
            t.note = (entry_id, "failed")
            if again:
                row = _first(con.execute("SELECT status, failure_reason FROM ledger_entries WHERE entry_id = ?",
                                         [entry_id]).fetchall())
                if row is not None and tuple(row) == ("failed", reason):
                    t.wrote = False
                    return
            self._row_for_transition(con, entry_id, "fail")
            con.execute(
                "UPDATE ledger_entries SET status = 'failed', updated_at = current_timestamp, "
                "failure_reason = ? WHERE entry_id = ?",
                [reason, entry_id],
            )

    def record_reuse(
        self, *, source_entry_id: int, query: str, tables: list[str], params: Mapping[str, Any] | None = None
    ) -> int:
        """Record a zero-cost answer computed from the synopsis stored with ``source_entry_id``
        (post-processing: no privacy cost). Returns the new entry id (status ``reused``)."""
        source_entry_id = _check_id(source_entry_id)
        params_json = _to_json(dict(params or {}), "params")
        _check_str(query, "query", allow_empty=True)
        tables = _check_tables(tables)
        with self._txn(write=True, unchanged="the reuse was not recorded (it costs nothing)") as (con, t):
            row = _first(
                con.execute(
                    "SELECT status, mechanism, synopsis_key FROM ledger_entries WHERE entry_id = ?",
                    [source_entry_id],
                ).fetchall()
            )
            if row is None:
                raise self._unknown(source_entry_id, "record_reuse")
            status, mechanism, key = row
            if status != "released" or key is None:
                raise LedgerError(
                    f"entry {source_entry_id} of ledger {self._where()} cannot be reused: it is {status!r}"
                    + (" and stores no synopsis" if key is None else ""),
                    hint="reuse only an entry returned by Ledger.find_synopsis(key)",
                )
            entry_id = self._next_id(con)
            con.execute(
                "INSERT INTO ledger_entries (entry_id, created_at, updated_at, status, mechanism, epsilon, "
                "delta, query, tables, params, source_entry_id) VALUES (?, current_timestamp, "
                "current_timestamp, 'reused', ?, 0, 0, ?, ?, ?, ?)",
                [entry_id, mechanism, query, tables, params_json, source_entry_id],
            )
            t.committed = f"the zero-cost reuse entry {entry_id} is recorded"
        return entry_id

    def find_synopsis(self, key: str) -> tuple[int, str] | None:
        """``(entry_id, synopsis_json)`` of the first released entry stored under ``key``, or None."""
        _check_str(key, "key")
        with self._txn(write=False) as (con, _t):
            row = _first(
                con.execute(
                    "SELECT entry_id, CAST(synopsis AS VARCHAR) FROM ledger_entries "
                    "WHERE status = 'released' AND synopsis_key = ? ORDER BY entry_id LIMIT 1",
                    [key],
                ).fetchall()
            )
        return None if row is None else (int(row[0]), str(row[1]))

    def set_total(self, new_total: Budget, *, reason: str) -> None:
        """Change the total budget: an explicit operation logged in ``ledger_totals``.
        Refuses a total below what is already spent. Setting the current total is a no-op."""
        _check_budget(new_total, "new_total")
        _check_str(reason, "reason")
        with self._txn(write=True, unchanged="the total was not changed") as (con, t):
            spent, _, current = self._budget_state(con)
            if not exact_counted_sum_fits(spent, Budget(0.0, 0.0), new_total):
                raise ConfigError(
                    f"cannot set the total of ledger {self._where()} to {_fmt(new_total)}: "
                    f"{_fmt(compose_counted(spent))} is already spent, and spending cannot be undone",
                    hint="choose a total at least as large as the spent budget in both epsilon and delta",
                )
            if new_total == current:
                t.wrote = False
                return
            change_id = _first(
                con.execute("SELECT COALESCE(MAX(change_id), 0) + 1 FROM ledger_totals").fetchall()
            )[0]
            con.execute(
                "INSERT INTO ledger_totals VALUES (?, current_timestamp, ?, ?, ?, ?, ?)",
                [change_id, new_total.epsilon, new_total.delta, current.epsilon, current.delta, reason],
            )
            t.committed = f"the new total {_fmt(new_total)} is recorded"


    def entry(self, entry_id: int) -> LedgerEntry:
        """One entry, by id (``LedgerError`` if unknown)."""
        entry_id = _check_id(entry_id)
        with self._txn(write=False) as (con, _t):
            row = _first(
                con.execute(
                    f"SELECT {_ENTRY_COLUMNS} FROM ledger_entries WHERE entry_id = ?", [entry_id]
                ).fetchall()
            )
        if row is None:
            raise self._unknown(entry_id, "entry")
        (eid, created, updated, status, mech, eps, delta, query, tables, params, reason, key, _syn, src) = row
        return LedgerEntry(
            entry_id=int(eid),
            status=status,
            mechanism=mech,
            cost=Budget(eps, delta),
            query=query,
            tables=tuple(tables),
            params=json.loads(params),
            created_at=created,
            updated_at=updated,
            failure_reason=reason,
            synopsis_key=key,
            source_entry_id=src,
        )

    def snapshot(self, *, history: bool = False) -> dict[str, Any]:
        """``total``, ``spent`` and ``remaining`` (with ``history``: also ``entries`` and
        ``total_changes``, as :meth:`history` and :meth:`totals_history` give them) read in one
        transaction, so they agree with each other while other processes charge the ledger."""
        with self._txn(write=False) as (con, _t):
            counts, _, total = self._budget_state(con)
            out: dict[str, Any] = {"total": total, "spent": compose_counted(counts),
                                   "remaining": counted_remaining(counts, total)}
            if history:
                out["entries"] = con.sql(f"SELECT {_ENTRY_COLUMNS} FROM ledger_entries ORDER BY entry_id").to_arrow_table()
                out["total_changes"] = con.sql("SELECT * FROM ledger_totals ORDER BY change_id").to_arrow_table()
            return out

    def history(self) -> pa.Table:
        """All entries in order of entry id, as an Arrow table (JSON columns as text)."""
        with self._txn(write=False) as (con, _t):
            return con.sql(f"SELECT {_ENTRY_COLUMNS} FROM ledger_entries ORDER BY entry_id").to_arrow_table()

    def totals_history(self) -> pa.Table:
        """The log of total-budget changes (first row: the total at creation)."""
        with self._txn(write=False) as (con, _t):
            return con.sql("SELECT * FROM ledger_totals ORDER BY change_id").to_arrow_table()

    def close(self) -> None:
        """Forget the ledger. File ledgers hold nothing open between calls; an in-memory ledger
        (and its budget) is discarded."""
        self._closed = True
        if self._mem is not None:
            self._mem.close()
            self._mem = None
            if self._mem_gone is not None:
                self._mem_gone()  # its catalog is dropped from the process's ledger instance

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.path if self.path is not None else ':memory:'!r})"

    # internals -----------------------------------------------------------------------------
    def _where(self) -> str:
        return self.path if self.path is not None else "(in memory)"

    def _unknown(self, entry_id: int, op: str) -> LedgerError:
        return LedgerError(
            f"{op}({entry_id}): ledger {self._where()} has no entry {entry_id}",
            hint="pass an id returned by Ledger.reserve() on this same ledger",
        )

    def _row_for_transition(self, con: duckdb.DuckDBPyConnection, entry_id: int, op: str) -> tuple[str, str]:
        row = _first(
            con.execute(
                "SELECT status, CAST(params AS VARCHAR) FROM ledger_entries WHERE entry_id = ?", [entry_id]
            ).fetchall()
        )
        if row is None:
            raise self._unknown(entry_id, op)
        if row[0] != "reserved":
            raise LedgerError(
                f"{op}({entry_id}): entry {entry_id} of ledger {self._where()} is {row[0]!r}; only a "
                "'reserved' entry can be released or failed, once",
                hint="each reserve() is followed by exactly one commit() or fail()",
            )
        return str(row[0]), str(row[1])

    @staticmethod
    def _next_id(con: duckdb.DuckDBPyConnection) -> int:
        return int(
            _first(con.execute("SELECT COALESCE(MAX(entry_id), 0) + 1 FROM ledger_entries").fetchall())[0]
        )

    def _total(self, con: duckdb.DuckDBPyConnection) -> Budget:
        # every row (one per set_total, a handful) and the newest picked here: a plain scan costs DuckDB a
        # third of what ORDER BY ... LIMIT 1 costs, and the statement is the same on PostgreSQL
        return self._newest_total(con.execute("SELECT change_id, epsilon, delta FROM ledger_totals").fetchall())

    def _newest_total(self, rows: Sequence[Sequence[Any]]) -> Budget:
        """The total of the newest of ``(change_id, epsilon, delta)`` rows of ``ledger_totals``."""
        if not rows:
            raise self._corrupt("it records no total budget (ledger_totals is empty)")
        _, eps, delta = max(rows, key=lambda r: r[0])
        return self._budget(eps, delta, "the total budget")

    def _budget_state(self, con: duckdb.DuckDBPyConnection) -> tuple[list[tuple[Budget, int]], int, Budget]:
        """:meth:`_spent_counts` and :meth:`_total` from ONE statement (``_STATE_SQL``): what a reserve,
        a read of what remains and ``set_total`` decide on. The total is validated first, as before."""
        rows = con.execute(_STATE_SQL).fetchall()
        total = self._newest_total([(i, e, d) for e, d, _, n, i, _ in rows if n == -1])
        spent, next_id = self._counted([r for r in rows if r[3] != -1])
        return spent, next_id, total

    def _spent_counts(self, con: duckdb.DuckDBPyConnection) -> tuple[list[tuple[Budget, int]], int]:
        """The counted costs grouped by value (cost, how many entries), and the next entry id, from
        one statement: the grouping is the engine's, so a reserve costs the same Python work at
        ten entries as at a million (each distinct cost is validated once, an invalid one named by
        its first entry)."""
        # one aggregation over every entry, grouped also by whether the entry counts, whose largest id gives
        # the next one (a single scan: half the cost in DuckDB of a filtered grouping plus a second MAX)
        return self._counted(con.execute(_SPENT_SQL).fetchall())

    def _counted(self, rows: Sequence[Sequence[Any]]) -> tuple[list[tuple[Budget, int]], int]:
        """:meth:`_spent_counts` of the rows of ``_SPENT_SQL``."""
        spent = [(_plain_budget(e, d) or self._budget(e, d, f"entry {i}"), int(n))
                 for e, d, counted, n, i, _ in rows if counted is True]
        last = max((int(m) for *_, m in rows if m is not None), default=0)
        return spent, last + 1

    def _budget(self, eps: object, delta: object, what: str) -> Budget:
        try:
            return Budget(eps, delta)  # type: ignore[arg-type]
        except ConfigError:
            raise self._corrupt(
                f"{what} holds an invalid budget (epsilon={eps!r}, delta={delta!r})"
            ) from None

    def _corrupt(self, why: str) -> LedgerError:
        return LedgerError(
            f"ledger {self._where()} is corrupt: {why}",
            hint="restore the ledger file from a backup; dpsql never repairs a ledger silently",
        )

    def _init_schema(
        self, con: duckdb.DuckDBPyConnection, total: Budget, *, generation: int, ledger_id: str | None = None,
        created_over: str = "", fresh: bool = False,
    ) -> None:
        """Create the schema and the first rows in ``con``'s database. ``fresh``: a catalog this process attached just
        now under a name of its own (an in-memory ledger's), which holds no table: not asked for its tables."""
        tables = [] if fresh else con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        ).fetchall()
        if tables:
            names = {r[0] for r in tables}
            if set(_REQUIRED_TABLES) <= names:
                raise _AlreadyCreated(
                    f"cannot create a ledger at {self._where()}: another process created one there just now",
                    hint="open it with Ledger.open(path)",
                )
            raise LedgerError(
                f"cannot create a ledger at {self._where()}: it is a DuckDB database with other tables",
                hint="choose a new path for the ledger",
            )
        # the DDL and the read of the version it declares in one call (a script's result is its last statement's)
        got = _first(con.execute(schema_sql() + "\nSELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchall())
        if got is None or got[0] != str(SCHEMA_VERSION):  # pragma: no cover - packaging error
            raise LedgerError(
                f"the packaged ledger schema declares version {got and got[0]!r}, but the code expects "
                f"{SCHEMA_VERSION}",
                hint="reinstall dpsql",
            )
        con.execute(
            "INSERT INTO ledger_meta VALUES ('created_at', ?), ('created_by', ?), ('generation', ?), ('ledger_id', ?)",
            [datetime.now(UTC).isoformat(), _created_by(), str(generation), ledger_id or _new_ledger_id()],
        )
        if created_over:  # the identities in the markers of a ledger deleted at this path
            con.execute("INSERT INTO ledger_meta VALUES ('created_over', ?)", [created_over])
        con.execute(
            "INSERT INTO ledger_totals VALUES (1, current_timestamp, ?, ?, NULL, NULL, 'created')",
            [total.epsilon, total.delta],
        )

    def _check_schema(self, con: duckdb.DuckDBPyConnection) -> int:
        """Check that this is a ledger of our schema version; returns its generation (0 when the
        ledger predates generation counting)."""
        return self._schema_meta(con)[0]

    def _schema_meta(self, con: duckdb.DuckDBPyConnection) -> tuple[int, dict[str, str]]:
        """:meth:`_check_schema`, also returning every ``ledger_meta`` row (identity included), read by
        the same single statement."""
        try:  # one statement that binds only if all three tables exist (a plain scan and an empty branch)
            meta = dict(
                con.execute(
                    "SELECT key, value FROM ledger_meta UNION ALL SELECT NULL, NULL FROM ledger_totals, ledger_entries "
                    "WHERE false"
                ).fetchall()
            )
        except duckdb.CatalogException:
            meta = None  # a table is missing: say what the file is instead
        if meta is None:
            _rollback(con)
            con.execute("BEGIN TRANSACTION")
            names = {
                r[0]
                for r in con.execute(
                    "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                    "AND schema_name = 'main'"
                ).fetchall()
            }
            missing = [t for t in _REQUIRED_TABLES if t not in names]
            what = (
                "an empty DuckDB database"
                if not names
                else f"a DuckDB database with tables {', '.join(sorted(names))}"
            )
            err = LedgerError(
                f"{self._where()} is not a dpsql budget ledger: it is {what} (missing {', '.join(missing)})",
                hint="pass the path of your ledger file, or create a new ledger at a new path with "
                "`dpsql init --epsilon 1.0 --delta 1e-6 --ledger NEW_PATH`; dpsql never modifies or "
                "repairs an existing file",
            )
            err.not_a_ledger = True  # type: ignore[attr-defined]
            raise err
        if "schema_version" not in meta:
            raise self._corrupt("ledger_meta has no schema_version")
        try:
            found = int(meta["schema_version"])
        except ValueError:
            raise self._corrupt(f"schema_version is {meta['schema_version']!r}") from None
        if found != SCHEMA_VERSION:
            if found > SCHEMA_VERSION:
                fix = (
                    f"upgrade dpsql to a release that reads ledger schema version {found} "
                    "(the ledger was written by a newer dpsql)"
                )
            else:
                fix = (
                    f"open it with the older dpsql release that wrote schema version {found}; this "
                    "release has no migration for it and never rewrites a ledger silently"
                )
            raise LedgerError(
                f"ledger {self._where()} has schema version {found}, but this dpsql reads schema "
                f"version {SCHEMA_VERSION}",
                hint=fix,
            )
        try:
            return int(meta.get("generation", "0")), meta
        except ValueError:
            raise self._corrupt(f"generation is {meta['generation']!r}") from None

    # file creation --------------------------------------------------------------------------
    def _create_file(self, total: Budget) -> None:
        p = self.path
        assert p is not None
        if os.path.isdir(p):
            raise LedgerError(
                f"cannot create a ledger at {p}: it is a directory",
                hint=f"give the ledger a file path, e.g. {os.path.join(p, 'ledger.duckdb')}",
            )
        _check_name_room(p)
        if os.path.islink(p) and not os.path.exists(p):
            raise LedgerError(
                f"cannot create a ledger at {p}: it is a symbolic link to {os.readlink(p)}, which does not exist "
                "(a ledger is created under a new name, never through a link)",
                hint="create the ledger at the path the link names, or choose a new path",
            )
        if os.path.isfile(p) and not _duckdb_header(p):  # (init --ledger data.parquet: a mix-up of a job's paths)
            raise LedgerError(
                f"cannot create a ledger at {p}: a file already exists there, and it is not a ledger (not a DuckDB "
                "database); nothing was changed",
                hint=f"choose a new path, e.g. {os.path.join(os.path.dirname(p), 'ledger.duckdb')} (dpsql never overwrites a "
                "file)",
            )
        if os.path.lexists(p):
            raise LedgerError(
                f"cannot create a ledger at {p}: the file already exists",
                hint="open the existing ledger with Ledger.open(path) (dpsql never overwrites a ledger), "
                "or choose a new path",
            )
        if p.endswith(".wal"):  # DuckDB writes, replays and deletes FILE.wal for FILE: a ledger there would be lost
            raise LedgerError(
                f"cannot create a ledger at {p}: a name ending in .wal is the one DuckDB gives the write-ahead log of "
                f"{p[:-4]}, which it replays and deletes when that file is opened; nothing was created",
                hint=f"choose a name that does not end in .wal, e.g. {p[:-4]}-ledger.duckdb",
            )
        side = re.fullmatch(r"\.(.+)\.(?:generation|queue|q-\d+-.*)", os.path.basename(p), re.DOTALL)
        if side is not None:  # the hidden files of a ledger NAME beside it: its operations rewrite them
            raise LedgerError(
                f"cannot create a ledger at {p}: that is the name of a hidden file that dpsql keeps beside a ledger named "
                f"{side.group(1)} in the same directory (its generation marker or its queue), which that ledger's operations "
                "overwrite; nothing was created",
                hint=f"choose a name of its own, e.g. {os.path.join(os.path.dirname(p), 'ledger.duckdb')}",
            )
        if os.path.lexists(p + ".wal"):
            raise LedgerError(
                f"cannot create a ledger at {p}: an orphaned write-ahead log {p}.wal exists "
                "(DuckDB would replay it into the new file)",
                hint=f"move {p}.wal away (it may belong to a ledger that was moved or deleted), then retry",
            )
        parent, name = os.path.split(p)
        if not os.path.isdir(parent):
            raise LedgerError(
                f"cannot create a ledger at {p}: "
                + (f"{parent} is not a directory" if os.path.lexists(parent) else f"directory {parent} does not exist"),
                hint="create the directory first or choose another path",
            )
        try:
            found = _path_marker(p)
        except LedgerError:
            found = None  # an unreadable marker of a ledger that is gone: the new one starts over it
        previous = found[0] if found is not None else 0
        generation = previous + 1  # generations at one path only ever grow
        ledger_id = _new_ledger_id()
        replaced = []  # the identities the markers of a deleted ledger here record
        for where in (_marker_path(p), _legacy_marker_path(p)):
            try:
                old = _read_marker_id(where)
            except LedgerError:
                old = None
            if old is not None and old[1] is not None:
                replaced.append(old[1])
        tmp = os.path.join(parent, f".{name}.creating-{os.getpid()}-{random.getrandbits(32):08x}")
        try:
            base = _base_connection()
            alias = f"dpsql_ledger_{next(_state().aliases)}"
            try:
                base.cursor().execute(f"ATTACH {_sql_str(tmp)} AS {alias} (TYPE DUCKDB)")
                _note_attached(alias, tmp)
            except duckdb.Error as e:
                raise LedgerError(
                    f"cannot create a ledger at {p}: {type(e).__name__}: {e}",
                    hint="check that the directory is writable and the disk has free space",
                ) from None
            try:
                con = base.cursor()
                try:
                    con.execute(f"USE {alias}")
                    con.execute("BEGIN TRANSACTION")
                    _hook("create_schema", p)
                    self._init_schema(con, total, generation=generation, ledger_id=ledger_id,
                                      created_over=",".join(replaced))
                    con.execute("COMMIT")
                    _hook("create_checkpoint", p)
                    con.execute(f"CHECKPOINT {alias}")
                finally:
                    con.close()
            except duckdb.Error as e:
                raise LedgerError(
                    f"cannot create a ledger at {p}: writing it failed ({type(e).__name__}: {e}); "
                    "no ledger was created",
                    hint="check that the directory is writable and the disk has free space",
                ) from None
            finally:
                _detach(base, alias)
            if os.path.lexists(tmp + ".wal"):  # pragma: no cover - DuckDB checkpointed above
                raise LedgerError(
                    f"cannot create a ledger at {p}: DuckDB left a write-ahead log; no ledger was created",
                    hint="check free disk space and retry",
                )
            _fsync_path(tmp)
            # the new file's inode is locked before it appears under its name, until its markers
            # record it: an operation through the name never sees a marker of a ledger deleted here
            # before (of another identity) together with the new file
            key, fd = _lock_file(tmp, time.monotonic() + self.lock_timeout, p, "no ledger was created")
            published = False
            try:
                _hook("create_link", p)
                self._publish(tmp, p)
                published = True
            finally:
                if not published:
                    _unlock(key, fd)
        finally:
            for f in (tmp, tmp + ".wal"):
                try:
                    os.unlink(f)
                except FileNotFoundError:
                    pass
                except OSError:  # pragma: no cover - an unused temporary file is harmless
                    pass
        try:
            _fsync_path(parent)
            _hook("create_marker", p)
            # record the generation and identity outside the file (never lowering a marker)
            _raise_markers(p, generation, ledger_id)
        finally:
            _unlock(key, fd)

    @staticmethod
    def _publish(tmp: str, p: str) -> None:
        """Give the complete new ledger ``tmp`` its name ``p``, never over an existing file."""
        try:
            os.link(tmp, p)  # atomic, and never replaces an existing file
        except FileExistsError:
            raise _AlreadyCreated(
                f"cannot create a ledger at {p}: another process created one there just now",
                hint="open it with Ledger.open(path)",
            ) from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise LedgerError(
                    f"cannot create a ledger at {p}: {e.strerror}", hint="check the directory permissions"
                ) from None
            # a file system without hard links: rename (atomic; the existence check races
            # only with another creator, whose ledger holds no charge yet)
            if os.path.lexists(p):
                raise _AlreadyCreated(
                    f"cannot create a ledger at {p}: another process created one there just now",
                    hint="open it with Ledger.open(path)",
                ) from None
            os.rename(tmp, p)

    # transactions ---------------------------------------------------------------------------
    @contextmanager
    def _txn(
        self, *, write: bool, creating: bool = False, unchanged: str = "nothing was changed", wait: float | None = None
    ) -> Iterator[tuple[duckdb.DuckDBPyConnection, _Txn]]:
        """:meth:`_one_txn`, refused at once in a thread that is inside a transaction of this ledger already (a
        signal handler runs in the thread it interrupts): it would wait for its own lock, then time out."""
        with _HeldInterrupt():  # Ctrl-C in the main thread: raised where it waits, or once all is given back
            me = (os.getpid(), threading.get_ident())
            if me in self._inside:
                raise LedgerError(
                    f"ledger {self._where()} was used from inside one of its own operations in the same thread (e.g. by "
                    f"a signal handler that interrupted a query); {unchanged}",
                    hint="in a signal handler, set a flag (or raise an exception) and use dpsql once the interrupted "
                    "call has returned")
            self._inside.add(me)
            try:
                with self._one_txn(write=write, creating=creating, unchanged=unchanged, wait=wait) as out:
                    yield out
            finally:
                self._inside.discard(me)

    @contextmanager
    def _one_txn(
        self, *, write: bool, creating: bool = False, unchanged: str = "nothing was changed", wait: float | None = None
    ) -> Iterator[tuple[duckdb.DuckDBPyConnection, _Txn]]:
        """One transaction: lock, attach, check, run the body, commit, checkpoint, detach, unlock (waiting for the
        lock up to ``wait`` seconds, by default ``lock_timeout``)."""
        if self._closed:
            raise LedgerError(
                f"ledger {self._where()} is closed", hint="open it again with Ledger.open(path)"
            )
        t = _Txn(unchanged)
        if self.path is None:
            with self._mem_txn(write=write, creating=creating, t=t, wait=wait) as con:
                yield con, t
            return
        p = self.path
        started = time.monotonic()
        deadline = started + (self.lock_timeout if wait is None else wait)
        _hook("before_queue", p)
        try:
            st: os.stat_result | None = os.stat(p)
        except OSError:
            st = None  # missing or unreadable: said by _lock_file
        if st is not None and not stat.S_ISREG(st.st_mode):  # refused before the queue leaves a file beside it
            raise _not_regular(p, st, t.unchanged)
        if st is not None and not _duckdb_header(p):  # a Parquet or text file: refused before the queue, too
            raise _not_duckdb(p, st.st_size == 0)
        real = _real_path(p)  # the queue's directory, resolved once (a lstat per component)
        tail = None if real is None else _queue_tail(real)
        had_tail = tail is None or os.path.lexists(tail)
        slot = None if real is None else _queue_enter(real, deadline)  # fairness only: first come, first served
        try:
            key, fd = _lock_file(p, deadline, p, t.unchanged, started)  # the exclusion
            try:
                with self._file_txn(write=write, t=t, deadline=deadline, started=started, key=key) as con:
                    yield con, t
            finally:
                _unlock(key, fd)
        except RuntimeError as e:
            if interrupted_by_signal(e):  # Ctrl-C during a ledger statement: a KeyboardInterrupt, as anywhere else
                raise KeyboardInterrupt from None
            raise
        except LedgerError as e:
            if getattr(e, "not_a_ledger", False) and not had_tail and tail is not None:
                # another DuckDB database: the queue this operation made beside the user's file goes with it (the
                # queue is fairness only, so a waiter that read it meanwhile loses nothing)
                try:
                    os.unlink(tail)
                except OSError:
                    pass
            raise
        finally:
            _queue_leave(slot)

    @contextmanager
    def _mem_txn(
        self, *, write: bool, creating: bool, t: _Txn, wait: float | None = None
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._mem_pid != os.getpid():
            # a forked child holds a copy of the budget: spending it there, in every child, would
            # spend the total once per process, unknown to the parent and to each other
            raise LedgerError(
                f"an in-memory ledger cannot be used in a forked process (it belongs to process {self._mem_pid}; "
                f"a copy in each child would spend the whole budget again); {t.unchanged}",
                hint="give the Session a ledger file (Session(ledger='ledger.duckdb', ...)), which every process "
                "shares, or run the queries in the process that created the in-memory ledger",
            )
        wait = self.lock_timeout if wait is None else wait
        if not _acquire(self._mem_lock, min(wait, 1e9)):  # 31 years: forever (more overflows the lock's clock)
            raise LedgerBusyError(
                f"the in-memory ledger is busy in another thread for more than {wait:g} s; "
                f"{t.unchanged}",
                hint="retry later or pass a larger lock_timeout",
            )
        try:
            con = self._mem
            if con is None:
                raise LedgerError("this in-memory ledger is closed", hint="create a new one")
            try:
                try:
                    # inside the try: a signal's handler that raises as BEGIN returns left the transaction open
                    con.execute("BEGIN TRANSACTION")
                    if not creating:
                        self._check_schema(con)
                    yield con
                    _interruption_point()  # Ctrl-C so far: nothing is changed
                except BaseException:
                    _rollback(con)
                    raise
                try:
                    con.execute("COMMIT")
                except BaseException:
                    # a signal's handler that is not held back (a SIGALRM time-out's exception) cuts the COMMIT short
                    # (DuckDB's 'Query interrupted') with the transaction still open: the ledger's one connection then
                    # refused every later operation ('cannot start a transaction within a transaction')
                    _rollback(con)
                    raise
                self._noted(t)
            except RuntimeError as e:
                if interrupted_by_signal(e):  # as a ledger file's: a KeyboardInterrupt, as anywhere else
                    raise KeyboardInterrupt from None
                raise
            except duckdb.Error as e:
                raise LedgerError(
                    f"in-memory ledger: DuckDB failed ({type(e).__name__}: {e}); {t.unchanged}",
                    hint="this is a bug in dpsql; please report it",
                ) from None
        finally:
            self._mem_lock.release()

    @contextmanager
    def _file_txn(
        self, *, write: bool, t: _Txn, deadline: float, started: float, key: tuple[int, int]
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """The transaction on the ledger file whose inode ``key`` this operation has flock'ed."""
        p = self.path
        assert p is not None
        base = _base_connection()
        alias = f"dpsql_ledger_{next(_state().aliases)}"
        real = os.path.realpath(p)  # resolved once per operation (a lstat per component), after the flock
        paths = _marker_paths(real, resolved=True)
        wal = real + ".wal"  # DuckDB names the WAL after the resolved path
        try:
            st = os.stat(wal)
        except OSError:
            st = None  # none (the usual case), or unreadable: DuckDB says so
        if st is not None and not stat.S_ISREG(st.st_mode):  # a named pipe: DuckDB's open waited for ever
            raise LedgerError(
                f"ledger {p}: its write-ahead log {wal} is {_kind(st)}, not a file DuckDB could have written; "
                f"{t.unchanged}",
                hint=f"move {wal} away (a write-ahead log that DuckDB left is a regular file: keep that one)",
            )
        _hook("before_attach", p)
        drawn: str | None = None  # an identity this write gives a ledger written before identities
        try:
            self._attach(
                base, alias, read_only=not write, deadline=deadline, started=started, unchanged=t.unchanged, real=real
            )
        except LedgerError:
            raise
        except BaseException:  # an interrupt during the ATTACH, which may have run: the file is not left attached
            _detach(base, alias)
            raise
        try:
            con = base.cursor()
            try:
                try:
                    con.execute(f"USE {alias}")
                    con.execute("BEGIN TRANSACTION")
                except duckdb.Error as e:
                    raise self._duck_failed(e, write, t.unchanged) from None
                try:
                    generation, meta = self._schema_meta(con)
                    marks = _read_marks(paths)
                    ledger_id = self._check_identity(meta, self._check_generation(generation, marks), marks)
                    if ledger_id is not None and self._identity not in (None, ledger_id):
                        # the path now leads to another ledger (a directory or symbolic link on it was switched,
                        # with that ledger's own markers): its entry ids name other charges than this object's
                        raise LedgerError(
                            f"ledger {p} now leads to another ledger file than the one this ledger object used "
                            f"before (ledger {ledger_id}, not {self._identity}: a directory or symbolic link on the "
                            f"path was switched); its entries are other charges than those recorded before; "
                            f"{t.unchanged}",
                            hint="point the path back at the ledger that recorded the earlier charges, or open "
                            "the other one anew (Ledger.open(path), a new Session)",
                        )
                    self._identity = self._identity or ledger_id
                    if write and os.path.exists(wal):
                        # an earlier change lives in the WAL only (its CHECKPOINT failed, e.g. on a full
                        # disk): it goes into the file first, or this change would join it there, count,
                        # and fail the same way
                        try:
                            con.execute(f"CHECKPOINT {alias}")
                        except duckdb.Error as e:
                            raise LedgerError(
                                f"ledger {p}: an earlier change is still in the write-ahead log {wal} only, and "
                                f"writing it into the ledger file failed again ({type(e).__name__}: {e}); "
                                f"{t.unchanged}",
                                hint=f"free disk space, then retry (the next dpsql operation writes the earlier "
                                f"change into the file); keep {wal} next to the ledger",
                            ) from None
                    _hook("after_attach", p)
                    yield con
                    if write and t.wrote:
                        generation += 1
                        con.execute(
                            "UPDATE ledger_meta SET value = ? WHERE key = 'generation'"
                            if generation > 1
                            else "INSERT OR REPLACE INTO ledger_meta VALUES ('generation', ?)",
                            [str(generation)],
                        )
                        if ledger_id is None:  # a ledger of an earlier release: it gets its identity now
                            ledger_id = drawn = _new_ledger_id()  # this object's identity once COMMITted (below)
                            con.execute("INSERT INTO ledger_meta VALUES ('ledger_id', ?)", [ledger_id])
                        # after the COMMIT the markers must go up: a marker this process cannot write
                        # would leave a committed change refused, so it is found now, before anything counts
                        self._check_markers_writable(t.unchanged, paths)
                        if not _names(p, key):  # another process may hold the new file's flock and charge it
                            raise self._replaced("", t.unchanged)
                    _hook("before_commit", p)
                    _interruption_point()  # Ctrl-C so far: nothing is changed (after the COMMIT: the change stands)
                except BaseException as e:
                    _rollback(con)
                    if isinstance(e, duckdb.Error):
                        raise self._duck_failed(e, write, t.unchanged) from None
                    raise
                try:
                    con.execute("COMMIT")  # appends to <path>.wal and fdatasyncs it
                except duckdb.Error as e:
                    d = os.path.dirname(wal)
                    if "Permission denied" in str(e) and os.path.exists(p) and not os.access(d, os.W_OK | os.X_OK):
                        raise LedgerError(  # the WAL could not be created: nothing was written
                            f"ledger {p}: its directory {d} is not writable, and DuckDB writes every change to "
                            f"{wal} there first; {t.unchanged}",
                            hint="make the ledger's directory writable for every user who charges the ledger, as "
                            "the ledger file and its marker are (e.g. chmod g+w on all three for a shared group); "
                            "reading it (dpsql budget) needs no write access",
                        ) from None
                    raise LedgerError(
                        f"ledger {p}: DuckDB could not commit the change ({type(e).__name__}: {e}); it was "
                        f"not acknowledged: {t.unchanged}, unless the write reached the disk before the "
                        "error (then it counts)",
                        hint="check free disk space and that the file system is writable; dpsql reads no "
                        "private row after this error",
                    ) from None
                _change_stands()  # Ctrl-C held back from here on says the change stands (a release: its answer is kept)
                self._noted(t)
                if drawn is not None:  # an identity drawn by a write that rolled back is never this object's
                    self._identity = drawn
                if write and t.wrote:
                    # the markers go up BEFORE the checkpoint: from here on a ledger file (under any
                    # name) without this change is refused, even while the change is in the WAL only
                    _hook("before_marker", p)
                    try:
                        _raise_markers(p, generation, ledger_id, paths)
                    except (OSError, LedgerError) as e:
                        raise _recorded(LedgerError(
                            f"ledger {p}: {t.committed} in the write-ahead log {wal}, but its generation "
                            f"marker {paths[0]} could not be updated ({e})",
                            hint=f"make the ledger's directory writable; keep {wal} next to the ledger (the "
                            "next dpsql operation writes it into the file). This operation did not complete: "
                            "no private row was read after this error",
                        )) from None
                    _hook("before_checkpoint", p)
                    try:
                        con.execute(f"CHECKPOINT {alias}")  # into the main file, fdatasync'ed
                    except duckdb.Error as e:
                        raise _recorded(LedgerError(
                            f"ledger {p}: {t.committed} in the write-ahead log {wal} only; writing it "
                            f"into the ledger file failed ({type(e).__name__}: {e})",
                            hint=f"free disk space; keep {wal} next to the ledger (the next dpsql "
                            "operation through this same path writes it into the file). This operation did "
                            "not complete: no private row was read after this error",
                        )) from None
                    if not _names(p, key):  # the change went into a file that is no longer the ledger
                        lost = self._replaced(" and wrote", f"{t.committed} in the file it locked, which is no longer "
                                              "at that path, and another process may have charged the new file "
                                              "meanwhile; this operation stops here: no private row was read after "
                                              "this error")
                        lost.unacknowledged = True  # may not stand: a charge's failure exits as one after the charge
                        raise lost
            finally:
                con.close()
        finally:
            _detach(base, alias)
            _hook("after_detach", p)

    def _replaced(self, wrote: str, what: str) -> LedgerError:
        return LedgerError(
            f"ledger {self.path} was moved or replaced by another file while this operation held it{wrote} (a restore, a copy "
            f"or a sync tool wrote the path anew); {what}",
            hint="never replace a ledger file while dpsql uses it: stop what rewrites it, then retry (a file at the path "
            "that lacks a recorded change is refused by its generation marker)",
        )

    def _duck_failed(self, e: duckdb.Error, write: bool, unchanged: str) -> LedgerError:
        if _damaged(str(e)):
            return LedgerError(
                f"the budget ledger {self._where()} is damaged ({type(e).__name__}: {e}); {unchanged}",
                hint=_DAMAGED_HINT,
            )
        return LedgerError(
            f"ledger {self._where()}: DuckDB failed while {'writing' if write else 'reading'} the ledger "
            f"({type(e).__name__}: {e}); {unchanged}",
            hint="check that the file is a dpsql ledger on a writable disk with free space",
        )

    def _check_identity(self, meta: Mapping[str, str], generation: int, marks: _Marks) -> str | None:
        """The ledger's identity (None for a ledger written before identities were recorded), after
        refusing a file that is not the ledger whose marker files lie next to it: another ledger put
        in its place would replace the recorded charges with its own, whatever its generation. A
        ledger created at this path over the marker of a deleted one names that one ('created_over'),
        which it replaces until its own identity reaches the marker."""
        assert self.path is not None
        ledger_id = meta.get("ledger_id")
        if ledger_id is not None and not _LEDGER_ID_RE.fullmatch(str(ledger_id)):
            raise self._corrupt(f"ledger_id is {str(ledger_id)[:40]!r}")
        replaced = str(meta.get("created_over", "")).split(",")
        for where, found in marks.items():
            if found is None or found[1] is None or found[1] == ledger_id:
                continue
            if found[1] in replaced and found[0] < generation:
                continue
            this = f"ledger {ledger_id}" if ledger_id is not None else "a ledger without an identity"
            raise LedgerError(
                f"ledger {self.path} is not the ledger whose generation marker {where} lies next to it: the "
                f"file is {this}, but the marker records ledger {found[1]} at generation {found[0]}; another "
                "ledger file was put in its place, and using it would replace the recorded charges with its own",
                hint="put the ledger that was here back (restore its newest copy together with its .wal file). "
                "Only the data owner can decide to continue with this file instead: then move the marker "
                f"{where} away first (the budget history becomes this file's)",
            )
        return None if ledger_id is None else str(ledger_id)

    def _check_markers_writable(self, unchanged: str, paths: tuple[str, str]) -> None:
        assert self.path is not None
        for where in paths:
            try:
                os.close(os.open(where, os.O_WRONLY | os.O_CLOEXEC))
            except FileNotFoundError:
                continue  # created after the COMMIT, in the directory that holds the WAL
            except OSError as e:
                raise LedgerError(
                    f"ledger {self.path}: its generation marker {where} cannot be written ({e.strerror}); {unchanged}",
                    hint="every user who charges the ledger needs write access to the marker as well as to the ledger "
                    "file and its directory (e.g. chmod g+w on all three for a shared group)",
                ) from None

    def _check_generation(self, generation: int, marks: _Marks) -> int:
        assert self.path is not None
        found = _recorded_generation(self.path, marks)
        if found is not None and generation < found[0]:
            marker, where = found
            real = os.path.realpath(self.path)
            raise LedgerError(
                f"ledger {self.path} is older than its last acknowledged change: the file holds generation "
                f"{generation}, but {where} records that generation {marker} was written; recorded "
                "charges are missing (a lost or truncated write-ahead log, a restored old copy, or a change "
                "still in the write-ahead log of another name of this file), and using this file would "
                "give spent budget back",
                hint=f"if the ledger has another name (a hard link in another directory, a bind mount) with a "
                "'.wal' file next to it, run one dpsql operation through that name (it writes the change "
                f"into the file); otherwise restore the newest copy of the ledger together with its "
                f"{os.path.basename(real)}.wal file. dpsql never accepts an older ledger by itself. If no "
                "complete copy exists, only the data owner can decide to go on: write the file's generation "
                f"into {_marker_path(self.path)} (and the {_XATTR} attribute), then lower the total by the "
                "budget that went missing with `dpsql budget --set-total`",
            )
        return generation

    def _attach(
        self, base: duckdb.DuckDBPyConnection, alias: str, *, read_only: bool, deadline: float, started: float,
        unchanged: str, real: str | None = None,
    ) -> None:
        """ATTACH the (flock'ed) ledger file, waiting out DuckDB locks of programs that are not dpsql until ``deadline``
        (``started``: when the operation began waiting, queue and flock included, for the message)."""
        p = self.path
        assert p is not None
        # TYPE DUCKDB: the file is read as a DuckDB database or refused, never handed by its contents
        # or extension to another storage (SQLite, a CSV or Parquet reader) or to an extension that
        # DuckDB would install from the network
        sql = f"ATTACH {_sql_str(p)} AS {alias} (TYPE DUCKDB" + (", READ_ONLY)" if read_only else ")")
        delay = 0.002
        while True:
            try:
                base.cursor().execute(sql)
                _note_attached(alias, p, real)
                return
            except duckdb.Error as e:
                msg = str(e)
                busy = "Could not set lock" in msg  # (another program's lock: it may let go)
                if busy:
                    why = f"is locked by another process{_lock_holder(msg)} that is not dpsql"
                    hint = (
                        "DuckDB allows one writer per file, and a reader blocks writers while it has the "
                        "file open: close other programs holding the ledger (a duckdb shell, a notebook "
                        "connection), or retry with a larger lock_timeout"
                    )
                elif ("Unique file handle conflict" in msg or "already attached" in msg) and (
                    os.path.realpath(p) in _INHERITED_ATTACHED
                ):
                    raise LedgerError(
                        f"cannot open the budget ledger {p} in this process: it was forked while another "
                        "thread of its parent process had the ledger open, and DuckDB keeps that file "
                        f"registered in every process forked at that moment; {unchanged}",
                        hint="use the ledger in a process forked before the parent used it, or start "
                        "worker processes with the 'spawn' or 'forkserver' start method (multiprocessing)",
                    ) from None
                elif "Unique file handle conflict" in msg or "already attached" in msg:
                    why = "is held open by another DuckDB connection in this process"
                    hint = (
                        "close that connection (dpsql opens the ledger itself for each operation and "
                        "never shares another connection's transactions)"
                    )
                elif _damaged(msg):
                    raise LedgerError(
                        f"the budget ledger {p} is damaged ({type(e).__name__}: {msg}); {unchanged}",
                        hint=_DAMAGED_HINT,
                    ) from None
                elif "not a valid DuckDB database" in msg:
                    raise _not_duckdb(p, _size(p) == 0) from None
                else:
                    raise LedgerError(
                        f"cannot open the budget ledger {p}: {type(e).__name__}: {msg}; {unchanged}",
                        hint="check the path, the file permissions and free disk space",
                    ) from None
            now = time.monotonic()
            if now >= deadline:
                raise (LedgerBusyError if busy else LedgerError)(
                    f"ledger {p} {why}; gave up after {now - started:.2g} s; {unchanged}", hint=hint
                )
            _interruption_point()
            time.sleep(min(deadline - now, random.uniform(0.5, 1.0) * delay))
            delay = min(delay * 2, 0.05)


# --------------------------------------------------------------------------------------------
# the flock on the ledger inode (see "Exclusion" in the module docstring)


#: what a truncated or corrupted ledger file makes DuckDB say (checksums, short reads)
_DAMAGED_MESSAGES = ("Corrupt database file", "Could not read enough bytes")
_DAMAGED_HINT = (
    "the file is truncated or corrupted: restore the ledger from a backup together with its .wal file (dpsql "
    "then checks that the copy holds every recorded charge); dpsql never repairs a ledger silently, and "
    "`dpsql init` at a new path would start a NEW budget, as if nothing had been spent"
)


def _names(p: str, key: tuple[int, int]) -> bool:
    """Whether ``p`` still names the inode ``key`` (the file this operation flock'ed)."""
    try:
        s = os.stat(p)
    except OSError:
        return False
    return (s.st_dev, s.st_ino) == key


def _damaged(msg: str) -> bool:
    return any(m in msg for m in _DAMAGED_MESSAGES)


def _ledger_missing(p: str) -> LedgerError:
    return LedgerError(
        f"the budget ledger {p} does not exist (any more)",
        hint=f"restore it from a backup, or {_INIT_HINT.format(path=p)}",
    )


def _take_fd(p: str, key: tuple[int, int]) -> int | None:
    """A descriptor of inode ``key`` not used by any other waiter of this process, or None when
    ``p`` turned out to name another inode (the path changed under us)."""
    st = _state()
    with st.mutex:
        free = st.free_fds.get(key)
        if free:
            fd = free.pop()
        else:
            try:
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise _ledger_missing(p) from None
            except OSError as e:
                raise LedgerError(
                    f"cannot open the budget ledger {p}: {e.strerror}",
                    hint="check the path and the file permissions",
                ) from None
            s = os.fstat(fd)
            got = (s.st_dev, s.st_ino)
            if got != key:
                if st.in_use.get(got):  # closing it could drop a DuckDB lock on that inode
                    st.free_fds.setdefault(got, []).append(fd)
                else:
                    os.close(fd)
                return None
        st.used_fds.add(fd)
        st.in_use[key] = st.in_use.get(key, 0) + 1
        return fd


def _give_back(key: tuple[int, int], fd: int) -> None:
    """Return a descriptor from :func:`_take_fd`. When no other waiter of this process uses the
    inode and DuckDB has nothing attached, every descriptor of the inode is closed (closing a
    descriptor drops the process's fcntl locks on the file, which then belong to nobody)."""
    st = _state()
    with st.mutex:
        if fd not in st.used_fds:  # from before a fork: closed by the at-fork hook
            return
        st.used_fds.discard(fd)
        left = st.in_use.get(key, 1) - 1
        if left > 0 or any(k == key for _p, k in st.attached.values()):
            st.in_use[key] = left
            st.free_fds.setdefault(key, []).append(fd)
            return
        st.in_use.pop(key, None)
        for f in (fd, *st.free_fds.pop(key, [])):
            try:
                os.close(f)
            except OSError:  # pragma: no cover - our own descriptor
                pass


def _poll_flock(fd: int, op: int, deadline: float) -> bool:
    """``flock(fd, op)`` trying until ``deadline``: True when granted, False when the time is up.
    Non-blocking attempts with a short, growing pause (at most 5 ms) between them: no helper
    thread and no blocked call outlives a time-out, and any ``lock_timeout`` works (each pause
    is short). Raises OSError if flock itself fails."""
    pause = 0.0005
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now >= deadline:
            return False
        _interruption_point()
        time.sleep(min(deadline - now, pause))
        pause = min(pause * 1.5, 0.005)


def _acquire(lock: Any, wait: float) -> bool:
    """``lock.acquire(timeout=wait)``, with an :func:`_interruption_point` every 50 ms."""
    end = time.monotonic() + wait
    while not lock.acquire(timeout=min(max(end - time.monotonic(), 0.0), 0.05)):
        if time.monotonic() >= end:
            return False
        _interruption_point()
    return True


def _kind(s: os.stat_result) -> str:
    return "a directory" if stat.S_ISDIR(s.st_mode) else "a named pipe" if stat.S_ISFIFO(s.st_mode) else (
        "a device" if stat.S_ISCHR(s.st_mode) or stat.S_ISBLK(s.st_mode) else "not a regular file")


def _not_regular(p: str, s: os.stat_result, unchanged: str) -> LedgerError:
    return LedgerError(
        f"{p} is not a dpsql budget ledger: it is {_kind(s)}; {unchanged}",
        hint="pass the path of your ledger file (a regular file), e.g. --ledger ledger.duckdb; to start "
        "a new ledger: " + _INIT_HINT.format(path="NEW_PATH"),
    )


#: the bytes of every DuckDB database file at offset 8 (after its header's checksum)
_DUCKDB_MAGIC = b"DUCK"


def _duckdb_header(p: str) -> bool:
    """Whether the file ``p`` starts as a DuckDB database does (True too when it cannot be read here: the lock and
    the ATTACH then say why). Read without the lock: those bytes of a DuckDB file never change."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True  # (replaced meanwhile: said by the lock)
        return os.pread(fd, 12, 0)[8:12] == _DUCKDB_MAGIC
    except OSError:
        return True
    finally:
        os.close(fd)


def _not_duckdb(p: str, empty: bool) -> LedgerError:
    return LedgerError(
        f"{p} is not a dpsql budget ledger: it is "
        + ("an empty file" if empty else "not a DuckDB database file at all")
        + " (dpsql creates ledgers atomically, so no ledger of dpsql ever looks like this); nothing was changed, and "
        "nothing was created beside it",
        hint="pass the path of your ledger file (restore it from a backup if it is damaged); "
        "to start a new ledger use a new path: " + _INIT_HINT.format(path="NEW_PATH"),
    )


def _real_path(p: str) -> str | None:
    """``p`` resolved (None when it cannot be: the queue is then skipped, the inode flock alone excludes)."""
    try:
        return os.path.realpath(p)
    except OSError:
        return None


def _queue_tail(real: str) -> str:
    """The queue's tail file ``.<name>.queue`` beside the ledger whose resolved path is ``real``."""
    d, name = os.path.split(real)
    return os.path.join(d, f".{name}.queue")


def _lock_file(
    p: str, deadline: float, where: str, unchanged: str, started: float | None = None
) -> tuple[tuple[int, int], int]:
    """Take the exclusive flock of the inode ``p`` names; returns (key, fd) for :func:`_unlock`.
    ``started``: when the operation began waiting (in the queue), for the time-out message."""
    if started is None:
        started = time.monotonic()
    while True:
        try:
            s = os.stat(p)
        except FileNotFoundError:
            raise _ledger_missing(p) from None
        except OSError as e:
            raise LedgerError(f"cannot open the budget ledger {p}: {e.strerror}", hint="check the path") from None
        if not stat.S_ISREG(s.st_mode):  # a FIFO would block the open below forever, past lock_timeout
            raise _not_regular(p, s, unchanged)
        key = (s.st_dev, s.st_ino)
        fd = _take_fd(p, key)
        if fd is None:
            continue
        try:
            granted = _poll_flock(fd, fcntl.LOCK_EX, deadline)
        except OSError as e:
            _give_back(key, fd)
            raise LedgerError(
                f"cannot lock the budget ledger: flock failed ({e.strerror})",
                hint="keep the ledger on a local file system that supports flock (not NFS)",
            ) from None
        except BaseException:
            _give_back(key, fd)
            raise
        if not granted:
            _give_back(key, fd)
            holder, way_out = _flock_holder(key)
            raise LedgerBusyError(
                f"ledger {where} is locked by another dpsql operation{holder or ' (in this or another process)'}; "
                f"gave up after {time.monotonic() - started:.2g} s of waiting for it; {unchanged}",
                hint=way_out or "retry later or pass a larger lock_timeout; if no other dpsql program is running, "
                "look for a stuck process that has the ledger file open",
            )
        try:
            s2 = os.stat(p)
        except FileNotFoundError:
            _unlock(key, fd)
            raise _ledger_missing(p) from None
        if (s2.st_dev, s2.st_ino) != key:  # replaced while we waited: lock the new file instead
            _unlock(key, fd)
            continue
        return key, fd


#: process states of /proc/PID/stat that never let go of a lock by themselves
_FROZEN_STATES = {"T": "stopped (SIGSTOP, Ctrl-Z)", "t": "stopped by a debugger",
                  "D": "blocked in the kernel (disk or network file system I/O)"}


def _flock_holder(key: tuple[int, int]) -> tuple[str, str]:
    """Who holds the flock of inode ``key``, read from ``/proc/locks`` (Linux): the holder in words and
    a hint on how to get it to let go; ``("", "")`` where that cannot be told (another system, the
    holder gone meanwhile). A frozen holder (SIGSTOP, a debugger) keeps the ledger locked for as long
    as it stays frozen: the waiters are told which process it is and how to resume or end it."""
    dev, ino = key
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return "", ""
    pids = [int(w[4]) for w in (ln.split() for ln in lines)
            if len(w) >= 6 and w[1] == "FLOCK" and w[5] == want and w[4].isdigit()]  # '->' lines are waiters
    if not pids:
        return "", ""
    pid = pids[0]
    if pid == os.getpid():
        return " (another thread of this process)", ""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except (OSError, IndexError):
        state, cmd = "", ""
    cmd = " ".join("".join(c if c.isprintable() else " " for c in cmd).split())  # one line (python -c "...\n...")
    cmd = cmd if len(cmd) <= 80 else cmd[:77] + "..."
    who = f": process {pid}" + (f" ({cmd})" if cmd else "") + " holds it"
    frozen = _FROZEN_STATES.get(state)
    if frozen is None:
        return who, ""
    if state == "D":
        return (f"{who} and is {frozen}, so it keeps the ledger locked until that I/O ends",
                "check the disk or network file system the ledger is on (keep ledgers on a local file system); the "
                "ledger is usable again as soon as the process lets go")
    return (f"{who} and is {frozen}, so it keeps the ledger locked until it runs again",
            f"resume it with `kill -CONT {pid}`, or end it with `kill -KILL {pid}` (a charge it had already reserved "
            "still counts); the ledger is usable again as soon as it lets go")


# --------------------------------------------------------------------------------------------
# the waiting queue: fairness, not exclusion
#
# flock gives the lock to whichever waiter tries first after the holder unlocks, so under load
# a waiter can lose many times in a row (a long latency tail). Waiters therefore first queue up
# first-come-first-served: each creates its own slot file ``.<name>.q-*`` next to the ledger and
# holds an exclusive flock on it, swaps its name into ``.<name>.queue`` (the queue's tail), and
# waits (shared flock) on its predecessor's slot, which is unlocked when the predecessor is
# done, gives up, or dies (the successor then unlinks a dead predecessor's slot; every entry
# also sweeps away slots whose lock nobody holds, see _sweep_dead_slots, so a waiter killed
# with no successor left to notice leaves nothing behind). Only then does it wait for the
# inode flock above, which alone provides exclusion: the queue may be skipped (no writable
# directory), be split (two names of the file in different directories) or be left early on a
# time-out without any effect on correctness.


def _open_other(path: str, flags: int, mode: int = 0o600) -> int:
    st = _state()
    fd = os.open(path, flags | os.O_CLOEXEC, mode)
    with st.mutex:
        st.other_fds.add(fd)
    return fd


def _close_other(fd: int) -> bool:
    """Close a descriptor from :func:`_open_other`; False (and nothing done) when it is from
    before a fork (the at-fork hook closed it)."""
    st = _state()
    with st.mutex:
        if fd not in st.other_fds:
            return False
        st.other_fds.discard(fd)
    os.close(fd)
    return True


def _queue_enter(real: str, deadline: float, tries: int = 3) -> tuple[int, str] | None:
    """Enter the waiting queue beside the ledger whose resolved path is ``real``."""
    d, name = os.path.split(real)
    mine = os.path.join(d, f".{name}.q-{os.getpid()}-{next(_state().aliases)}-{random.getrandbits(32):08x}")
    try:
        my_fd = _open_other(mine, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)  # others may lock it to test it
    except OSError:
        return None  # e.g. a read-only directory: the inode flock alone (correct, less fair)
    slot = (my_fd, mine)
    pred = ""
    try:
        # a new file: granted at once, unless a sweep (_sweep_dead_slots) holds it for an instant, taking
        # it for a dead waiter's slot before this process locked it; if the sweep removed it, start again
        if not _poll_flock(my_fd, fcntl.LOCK_EX, deadline) or not names_file(mine, my_fd):
            _queue_leave(slot)
            return _queue_enter(real, deadline, tries - 1) if tries > 1 and time.monotonic() < deadline else None
        tail_fd = _open_other(os.path.join(d, f".{name}.queue"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # held by others for a read and a write only, but a process frozen inside them (SIGSTOP, a
            # debugger) holds it for as long as it stays frozen: waited for within lock_timeout only, then
            # the queue is skipped (the inode flock alone excludes), never an unbounded blocking flock
            queued = _poll_flock(tail_fd, fcntl.LOCK_EX, deadline)
            if queued:
                # file names as the file system holds them (bytes): a ledger may be named in any language
                pred = os.fsdecode(os.pread(tail_fd, 4096, 0).strip())
                mine_b = os.fsencode(os.path.basename(mine))
                os.ftruncate(tail_fd, len(mine_b))
                os.pwrite(tail_fd, mine_b, 0)
        finally:
            _close_other(tail_fd)  # releases its flock
        _sweep_dead_slots(d, name, mine)
    except OSError:
        _queue_leave(slot)
        return None
    except BaseException:  # e.g. KeyboardInterrupt while waiting: leave the queue, hold nothing
        _queue_leave(slot)
        raise
    if not queued:
        _queue_leave(slot)
        return None
    if not pred.startswith(f".{name}.q-") or "/" in pred:
        return slot
    pred_path = os.path.join(d, pred)
    try:
        pred_fd = _open_other(pred_path, os.O_RDONLY)
    except OSError:
        return slot  # the predecessor has already left
    try:
        granted = _poll_flock(pred_fd, fcntl.LOCK_SH, deadline)
    except OSError:
        granted = True  # cannot wait on it: go straight to the inode flock
    except BaseException:  # e.g. KeyboardInterrupt: leave the queue, hold nothing
        _close_other(pred_fd)
        _queue_leave(slot)
        raise
    _close_other(pred_fd)
    if granted:
        try:
            os.unlink(pred_path)  # gone already unless the predecessor died
        except OSError:
            pass
    # not granted: the time-out is reported by the inode flock, which has no time left either
    return slot


def names_file(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        s, f = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (s.st_dev, s.st_ino) == (f.st_dev, f.st_ino)


def _sweep_dead_slots(d: str, name: str, mine: str) -> None:
    """Remove the slot files ``.<name>.q-*`` in ``d`` of waiters that are gone. A waiter holds the
    exclusive flock of its slot from before the slot is in the queue until it has unlinked it, and a
    flock dies with the last descriptor of its holder (the at-fork hook closes a forked child's
    copies): so a slot whose lock this process is granted (non-blocking) has no live owner (a waiter
    killed by SIGKILL, or a machine that lost power), and it is unlinked while still locked. The one
    window, a new slot not yet locked by its creator, is closed on the creator's side: having locked
    its slot, the creator checks that the name is still its file (:func:`names_file`) and starts again if
    a sweep removed it. Only regular files are opened (never a FIFO or a device, never through a
    symbolic link), without blocking; a slot that cannot be opened (another user's, unreadable) is
    left alone. A successor already unlinks its dead predecessor's slot; the sweep removes the slots
    no successor will look at (a waiter killed together with its successor, or after its successor
    timed out)."""
    sweep_unlocked(d, f".{name}.q-", mine, _open_other, _close_other)


def sweep_unlocked(d: str, prefix: str, mine: str, open_fd: Callable[[str, int], int] = os.open,
                   close_fd: Callable[[int], object] = os.close) -> None:
    """Unlink each regular file ``prefix*`` in ``d`` (other than ``mine``) whose exclusive flock this
    process is granted without blocking, while holding it: a file whose owner holds its flock from
    creation until it removes the file is thus removed only once that owner is gone (a flock dies
    with its holder). Never opened through a symbolic link, never a FIFO or a device, never
    blocking; a file that cannot be opened is left alone."""
    try:
        with os.scandir(d) as it:
            names = [e.name for e in it if e.name.startswith(prefix) and os.path.join(d, e.name) != mine]
    except OSError:
        return
    for n in names:
        path = os.path.join(d, n)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            fd = open_fd(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its owner is alive
                continue
            if names_file(path, fd):
                os.unlink(path)  # still locked by this process: no owner can have taken it meanwhile
        except OSError:
            pass
        finally:
            close_fd(fd)


def _queue_leave(slot: tuple[int, str] | None) -> None:
    if slot is None:
        return
    fd, path = slot
    st = _state()
    with st.mutex:
        mine = fd in st.other_fds
    if not mine:  # a slot of the parent, seen in a forked child: not ours to remove
        return
    try:
        os.unlink(path)  # a successor that has not opened it yet skips it
    except OSError:
        pass
    _close_other(fd)  # releases the flock: the successor stops waiting


def _unlock(key: tuple[int, int], fd: int) -> None:
    st = _state()
    with st.mutex:
        mine = fd in st.used_fds
    if not mine:  # taken before a fork: the at-fork hook closed it (the lock is the parent's)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        _give_back(key, fd)


# --------------------------------------------------------------------------------------------
# DuckDB: one private in-memory instance per process, ledger files ATTACHed per operation


def _base_connection() -> duckdb.DuckDBPyConnection:
    st = _state()
    with st.mutex:
        if st.base is None:
            # no extension is ever installed or loaded on the ledger's instance (a ledger path naming a
            # SQLite file made DuckDB download its SQLite extension, and accept such a file as a ledger)
            base = duckdb.connect(":memory:", config={"threads": 1, "autoinstall_known_extensions": False,
                                                      "autoload_known_extensions": False})
            # DETACH must not checkpoint by itself: operations that need the main file up to date
            # run CHECKPOINT explicitly and check that it succeeded
            base.execute("PRAGMA disable_checkpoint_on_shutdown")
            st.base = base
        return st.base


def _memory_catalog(ledger: Ledger) -> duckdb.DuckDBPyConnection:
    """A connection to a new in-memory catalog attached to the process's instance for in-memory ledgers. A
    new DuckDB instance per ledger cost 20-50 ms to open and 10-15 ms to close (every Session without a ledger
    file made one); attaching a catalog costs about 1 ms. The instance is not the file ledgers' (which a failed
    DETACH replaces, closing its connections) and is never closed. The catalog is detached when the ledger is
    closed or collected; the ledger refuses to run in a forked child (``_mem_txn``)."""
    st = _state()
    with st.mutex:
        if st.memory is None:
            st.memory = duckdb.connect(":memory:", config={"threads": 1, "autoinstall_known_extensions": False,
                                                           "autoload_known_extensions": False})
        memory = st.memory
        alias = f"dpsql_memory_ledger_{next(st.aliases)}"
    cur = memory.cursor()
    try:
        cur.execute(f"ATTACH ':memory:' AS {alias}")
        con = memory.cursor()
        con.execute(f"USE {alias}")
    except duckdb.Error as e:
        _drop_memory_catalog(memory, alias, os.getpid())
        raise LedgerError(f"in-memory ledger: DuckDB failed ({type(e).__name__}: {e}); nothing was created",
                          hint="this is a bug in dpsql; please report it") from None
    finally:
        cur.close()
    ledger._mem_gone = weakref.finalize(ledger, _drop_memory_catalog, memory, alias, os.getpid(), con)
    return con


def _drop_memory_catalog(memory: duckdb.DuckDBPyConnection, alias: str, pid: int,
                         con: duckdb.DuckDBPyConnection | None = None) -> None:
    if os.getpid() != pid:  # a forked child's copy: the parent's instance is not touched from here
        return
    try:
        if con is not None:
            con.close()
        cur = memory.cursor()  # the finalizer may run on any thread: a cursor of its own
        try:
            cur.execute(f"DETACH DATABASE IF EXISTS {alias}")
        finally:
            cur.close()
    except duckdb.Error:  # the instance is already gone (interpreter shutdown)
        pass


def _note_attached(alias: str, path: str, real: str | None = None) -> None:
    """Record that ``alias`` has ``path`` attached (its inode's descriptors then stay open);
    ``real``: its resolved path, when the caller has it."""
    st = _state()
    try:
        s = os.stat(path)
        key = (s.st_dev, s.st_ino)
    except OSError:
        key = (-1, -1)
    with st.mutex:
        st.attached[alias] = (real or os.path.realpath(path), key)


def _note_detached(alias: str) -> None:
    st = _state()
    with st.mutex:
        st.attached.pop(alias, None)


def _detach(base: duckdb.DuckDBPyConnection, alias: str) -> None:
    """:func:`_detach_once`, done again where an interrupt (Ctrl-C, an exception of a signal handler) came during it,
    and the interrupt raised once the file is detached: the DETACH it stopped left the file attached to the process's
    instance, so every later operation of the process on the ledger (in any thread) waited for "another DuckDB
    connection in this process" and failed, and DuckDB's lock kept every other process out, until the process ended."""
    interrupt: BaseException | None = None
    for _ in range(3):
        try:
            _detach_once(base, alias)
            break
        except BaseException as e:  # not a duckdb.Error: _detach_once handles those
            interrupt = interrupt or e
    if interrupt is not None:
        raise interrupt


def _detach_once(base: duckdb.DuckDBPyConnection, alias: str) -> None:
    """DETACH (which also closes the file). If it fails, the attachment must not linger and keep
    the file open: the process's ledger instance is then replaced. Done again after it ran, it finds
    the file detached."""
    cur = base.cursor()
    try:
        cur.execute(f"DETACH {alias}")
        _note_detached(alias)
    except duckdb.Error:
        try:
            still = cur.execute(
                "SELECT count(*) FROM duckdb_databases() WHERE database_name = ?", [alias]
            ).fetchall()[0][0]
        except duckdb.Error:
            still = 1
        if still:
            st = _state()
            with st.mutex:
                if st.base is base:
                    st.base = None
            try:
                base.close()
                _note_detached(alias)
            except duckdb.Error:
                pass
        else:
            _note_detached(alias)
    finally:
        try:
            cur.close()
        except duckdb.Error:
            pass


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass
    except RuntimeError as e:  # cut short by a signal's handler: once more (the in-memory ledger keeps its connection)
        if not interrupted_by_signal(e):
            raise
        try:
            con.execute("ROLLBACK")
        except (duckdb.Error, RuntimeError):
            pass


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


# --------------------------------------------------------------------------------------------
# the generation marker


def _marker_path(p: str) -> str:
    """The marker file: ``.<name>.generation`` next to the resolved path (hidden, like the queue
    files, so that ``rm ledger.duckdb*`` before a restore does not remove it)."""
    return _marker_paths(p)[0]


def _legacy_marker_path(p: str) -> str:
    """Where earlier releases kept the marker (``<name>.generation``); still read, never created."""
    return _marker_paths(p)[1]


def _marker_paths(p: str, *, resolved: bool = False) -> tuple[str, str]:
    """The marker file and the legacy one of ``p`` (``resolved``: ``p`` is already the real path;
    ``realpath`` costs a ``lstat`` per component, so an operation resolves the path once)."""
    real = p if resolved else os.path.realpath(p)
    d, name = os.path.split(real)
    return os.path.join(d, f".{name}{GENERATION_SUFFIX}"), real + GENERATION_SUFFIX


#: What the marker files of one operation recorded when it began: marker path -> (generation, identity)
_Marks = dict[str, tuple[int, str | None] | None]


def _read_marks(paths: tuple[str, str]) -> _Marks:
    """Read both marker files once, for the generation and the identity checks of one operation."""
    return {where: _read_marker_id(where) for where in paths}


#: The extended attribute of the ledger file's inode that mirrors the marker (best effort).
_XATTR = "user.dpsql.generation"
_NO_XATTR = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA, errno.EPERM, errno.EACCES}


def _read_xattr(p: str) -> int | None:
    try:
        data = os.getxattr(p, _XATTR)
    except OSError as e:
        if e.errno in _NO_XATTR or e.errno == errno.ENOENT:
            return None
        raise LedgerError(
            f"cannot read the generation attribute {_XATTR} of the ledger {p}: {e.strerror}",
            hint="check the file's permissions (it guards against a ledger that lost recorded charges)",
        ) from None
    if not re.fullmatch(rb"\d{1,20}", data):
        raise LedgerError(
            f"the generation attribute {_XATTR} of the ledger {p} is damaged ({data[:40]!r})",
            hint="restore the ledger from a backup, or set the attribute to the ledger_meta 'generation' "
            "value of the newest ledger copy (setfattr -n user.dpsql.generation -v N FILE)",
        )
    return int(data)


def _path_marker(p: str, marks: _Marks | None = None) -> tuple[int, str] | None:
    """The highest generation recorded by the marker files of path ``p`` (or in ``marks``, as
    :func:`_read_marks` read them), and where."""
    best: tuple[int, str] | None = None
    for where, found in (marks or _read_marks(_marker_paths(p))).items():
        g = None if found is None else found[0]
        if g is not None and (best is None or g > best[0]):
            best = (g, where)
    return best


def _recorded_generation(p: str, marks: _Marks | None = None) -> tuple[int, str] | None:
    """The highest generation recorded outside the ledger file for ``p``: its marker files and
    the attribute of its inode (which every name of the file shares, hard links included)."""
    best = _path_marker(p, marks)
    g = _read_xattr(p)
    if g is not None and (best is None or g > best[0]):
        best = (g, f"the attribute {_XATTR} of the ledger file")
    return best


def _raise_markers(
    p: str, generation: int, ledger_id: str | None = None, paths: tuple[str, str] | None = None
) -> None:
    """Raise every marker of ``p`` to ``generation`` (never lowering one): the marker file (and
    a legacy one that exists), which also records the ledger's identity, and the inode's
    attribute, where the file system has them. ``paths``: :func:`_marker_paths` of ``p``. Each
    marker is read again right before it is written (not taken from the operation's start)."""
    marker, legacy = paths or _marker_paths(p)
    for where in (marker, legacy):
        if where is legacy and not os.path.exists(where):
            continue
        found = _read_marker_id(where)
        if found is None or found[0] < generation or (found[0] == generation and found[1] != ledger_id):
            _write_marker(where, generation, ledger_id)
    current = _read_xattr(p)
    if current is None or current < generation:
        try:
            os.setxattr(p, _XATTR, str(generation).encode("ascii"))
        except OSError as e:
            if e.errno not in _NO_XATTR:
                raise


_MARKER_RE = re.compile(r"dpsql ledger generation (\d{1,20})(?: id ([0-9a-f]{32}))?\n")
_LEDGER_ID_RE = re.compile(r"[0-9a-f]{32}")


def _new_ledger_id() -> str:
    """A ledger's identity: 128 random bits, recorded in the file and in its markers."""
    return f"{random.SystemRandom().getrandbits(128):032x}"


def _unreadable_marker(path: str, why: str | None) -> LedgerError:
    return LedgerError(
        f"cannot read the ledger's generation marker {path}: {why}",
        hint="make it a readable regular file (it guards against a ledger that lost recorded charges)",
    )


def _read_marker_id(path: str) -> tuple[int, str | None] | None:
    """The generation a marker file records and the identity of its ledger (None in a marker
    of an earlier release, which recorded no identity)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (a named pipe would block a plain open)
    except (FileNotFoundError, NotADirectoryError):  # (a component of the path is a file: no ledger, no marker)
        return None
    except OSError as e:
        raise _unreadable_marker(path, e.strerror) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # read, it never ended (a named pipe) or failed
            raise _unreadable_marker(path, f"it is {_kind(st)}")
        data = os.pread(fd, 256, 0)
    except OSError as e:
        raise _unreadable_marker(path, e.strerror) from None
    finally:
        os.close(fd)
    if not data:  # created, then lost to a crash before its first write reached the disk
        return None
    m = _MARKER_RE.fullmatch(data.decode("ascii", "replace"))
    if m is None:
        raise LedgerError(
            f"the ledger's generation marker {path} is damaged ({data[:40]!r})",
            hint="restore it from the backup that holds the ledger; it must read 'dpsql ledger "
            "generation N id ID' with N and ID the ledger_meta 'generation' and 'ledger_id' values of "
            "the newest ledger copy",
        )
    return int(m.group(1)), m.group(2)


def _write_marker(path: str, generation: int, ledger_id: str | None = None) -> None:
    """Write the marker in place (fixed width, so an update never shortens it). Only its creation
    is fsynced: the marker is written after the main file is durable, so a later update that a
    power loss takes back leaves an older value, a lower bound that can never cause a refusal."""
    ident = "" if ledger_id is None else f" id {ledger_id}"
    data = f"dpsql ledger generation {generation:020d}{ident}\n".encode("ascii")
    existed = os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, data, 0)
        if not existed:
            _share_like_ledger(fd, path)
            os.fsync(fd)
    finally:
        os.close(fd)
    if not existed:
        _fsync_path(os.path.dirname(path))


def _share_like_ledger(fd: int, marker: str) -> None:
    """Give a new marker the permission bits of its ledger file (a ledger shared with a group
    gets a marker the group can write too); best effort."""
    d, name = os.path.split(marker)
    ledger = os.path.join(d, name.removeprefix(".").removesuffix(GENERATION_SUFFIX))
    try:
        os.fchmod(fd, stat.S_IMODE(os.stat(ledger).st_mode) & 0o666)
    except OSError:
        pass


def _fsync_path(path: str) -> None:
    """fsync a file or directory (best effort for directories on file systems that refuse it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _AlreadyCreated(LedgerError):
    """Raised inside create() when a concurrent process created the same ledger first."""


def _first(rows: list[Any]) -> Any:
    """First row of a fully fetched result (DuckDB 2.x refuses new work on a connection while a
    result is only partly fetched, so results here are always fetched completely)."""
    return rows[0] if rows else None


def _size(p: str) -> int:
    try:
        return os.stat(p).st_size
    except OSError:
        return -1


@functools.cache
def _created_by() -> str:
    try:
        from importlib.metadata import version

        return f"dpsql {version('dpsql')}"
    except Exception:
        return "dpsql"


__all__ = ["Ledger", "LedgerEntry", "SCHEMA_VERSION", "COUNTING_STATUSES", "GENERATION_SUFFIX", "schema_sql"]
