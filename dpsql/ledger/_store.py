"""The durable budget ledger: a DuckDB file that records every privacy charge.

Privacy argument (design invariants 3 and 6)
--------------------------------------------
* The total budget lives in the ledger file (the newest row of ``ledger_totals``), never only in
  memory; a new process reads it back. Changing it is an explicit, logged ``set_total``.
* ``reserve`` runs ONE transaction that reads every counted charge, decides
  ``spent + cost <= total`` exactly (``dpsql.budget.exact_sum_fits``, the one rounding rule) and
  inserts the new charge as ``reserved``. The transaction is durable on disk before ``reserve``
  returns, so the caller may read private rows only after the charge is recorded.
* A reserved charge counts whatever happens next: ``released`` and ``failed`` entries count too
  (a failed run may have touched private data). Only zero-cost ``reused`` entries add nothing.
* Two processes can never overspend: every operation holds DuckDB's exclusive file lock for the
  whole read-check-insert transaction (see below), and threads of one process are serialised by
  a process-wide lock per resolved path.

What DuckDB 2.0.1 guarantees (verified empirically on Linux while writing this module)
------------------------------------------------------------------------------------------
Locking
  * Opening a database file takes a non-blocking ``fcntl(F_SETLK)`` lock on the whole file (a
    write lock read-write, a read lock read-only) for as long as the database instance is open.
  * While one process has the file open read-write, another process's ``duckdb.connect`` fails
    at once (no waiting) for both read-write and read-only opens with ``duckdb.IOException``
    (a subclass of ``OperationalError``): ``IO Error: Could not set lock on file "<path>":
    Conflicting lock is held in <exe> (PID <n>). See also .../concurrency``.
  * While one process has it open read-only, other read-only opens succeed, but a read-write open
    fails with the same IOException (message adds "you would be able to open this database in
    read-only mode"). So a reader DOES block a writer for as long as it keeps the file open.
  * Inside one process DuckDB caches database instances per path: a second read-write
    ``connect`` of the same file shares the first instance (no error, but its transactions then
    run concurrently under optimistic MVCC, where read-check-insert is open to write skew), and
    a connect with a different configuration (e.g. ``read_only=True`` while a read-write
    connection is open) fails with ``duckdb.ConnectionException``: ``Can't open a connection to
    same database file with a different configuration than existing connections``.
  * fcntl locks belong to the process and are dropped when ANY descriptor of the file is
    closed, so this module never opens the ledger file with plain ``open()``.
  * A file that is not a DuckDB database (random bytes, or 0 bytes) gives ``IOException: The
    file "<path>" exists, but it is not a valid DuckDB database file!`` and is left untouched; a
    DuckDB file opened and closed without writes keeps its exact bytes.
  Hence the design: hold nothing open between operations. Each operation opens a short-lived
  connection (read-write for changes, read-only for reads, so readers do not block each other),
  runs one transaction, and closes. On a lock conflict it retries with randomised exponential
  backoff until ``lock_timeout`` seconds, then raises ``LedgerError`` ("... is locked by another
  process (PID n) ..."). In-process, a ``threading.Lock`` per resolved path serialises ledger
  operations so DuckDB's instance sharing never lets two transactions interleave.
Durability
  * ``COMMIT`` appends to ``<path>.wal`` and calls ``fdatasync`` on it before returning (seen
    with strace; ``fsync_mode`` is ``STANDARD``). A process killed right after COMMIT
    (``os._exit``) leaves the commit in the WAL, and the next open (even read-only) replays it.
  * ``CHECKPOINT`` writes the WAL into the database file, ``fdatasync``s it and deletes the WAL;
    closing the last connection checkpoints as well (``checkpoint_on_shutdown``).
  So a charge is durable once COMMIT returns. After COMMIT this module also runs CHECKPOINT (best
  effort; its failure does not undo durability) so the ledger is a single self-contained file
  between operations, and after creating a ledger it fsyncs the parent directory.
Each operation costs roughly 40-50 ms (open + transaction + checkpoint + close).

In-memory ledgers (``path=None``) keep one DuckDB connection for the object's lifetime; they
are for notebooks and tests only: the budget dies with the process.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from importlib import resources
from typing import Any

import duckdb
import pyarrow as pa

from dpsql.budget import Budget, compose, exact_sum_fits
from dpsql.errors import BudgetExceededError, ConfigError, LedgerError

#: The ledger schema version this code reads and writes. ``schema.sql`` inserts the same value.
SCHEMA_VERSION = 1

#: Entry statuses whose cost counts towards the spent budget (basic composition).
COUNTING_STATUSES = ("reserved", "released", "failed")

_REQUIRED_TABLES = ("ledger_meta", "ledger_totals", "ledger_entries")

_INIT_HINT = "create it with `dpsql init --epsilon 1.0 --delta 1e-6 --ledger {path}` (choose your total)"

_ENTRY_COLUMNS = (
    "entry_id, created_at, updated_at, status, mechanism, epsilon, delta, query, tables, params, "
    "failure_reason, synopsis_key, synopsis, source_entry_id"
)


def schema_sql() -> str:
    """The ledger schema DDL (``dpsql/ledger/schema.sql``), the single source of truth."""
    return resources.files("dpsql.ledger").joinpath("schema.sql").read_text(encoding="utf-8")


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
# process-wide locks, one per resolved ledger path


_PATH_LOCKS: dict[str, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def _path_lock(key: str) -> threading.Lock:
    with _PATH_LOCKS_GUARD:
        lock = _PATH_LOCKS.get(key)
        if lock is None:
            lock = _PATH_LOCKS[key] = threading.Lock()
        return lock


# --------------------------------------------------------------------------------------------
# small helpers


def _fmt(b: Budget) -> str:
    return f"(epsilon={b.epsilon!r}, delta={b.delta!r})"


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
        return json.dumps(obj, sort_keys=True, allow_nan=False, default=_json_default, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{what} must be JSON-serialisable with finite numbers: {e}",
            hint="record plain numbers, strings, lists and dicts (no NaN/inf, no arbitrary objects)",
        ) from None


def _check_str(value: object, what: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        kind = "a string" if allow_empty else "a non-empty string"
        raise ConfigError(f"{what} must be {kind}, got {type(value).__name__} {value!r:.60}")
    return value


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


def _lock_holder(msg: str) -> str:
    m = re.search(r"\(PID (\d+)\)", msg)
    return f" (PID {m.group(1)})" if m else ""


# --------------------------------------------------------------------------------------------


class Ledger:
    """A durable privacy-budget ledger stored in a DuckDB file.

    Build one with :meth:`create` or :meth:`open`; the constructor is internal. The object holds
    no file handle: every method opens the file, runs one transaction and closes it again, so
    any number of processes can share one ledger file safely.
    """

    path: str | None

    def __init__(self, path: str | None, *, lock_timeout: float = 10.0) -> None:
        if (
            isinstance(lock_timeout, bool)
            or not isinstance(lock_timeout, int | float)
            or not (math.isfinite(lock_timeout) and lock_timeout >= 0)
        ):
            raise ConfigError(
                f"lock_timeout must be a finite number of seconds >= 0, got {lock_timeout!r}",
                hint="pass e.g. lock_timeout=10.0",
            )
        self.lock_timeout = float(lock_timeout)
        self._closed = False
        self._mem: duckdb.DuckDBPyConnection | None = None
        if path is None:
            self.path = None
            self._lock = threading.Lock()
        else:
            self.path = os.path.abspath(os.fspath(path))
            self._lock = _path_lock(os.path.realpath(self.path))

    # construction --------------------------------------------------------------------------
    @classmethod
    def create(
        cls, path: str | os.PathLike[str] | None, total: Budget, *, lock_timeout: float = 10.0
    ) -> Ledger:
        """Create a new ledger with ``total`` budget. ``path=None`` makes an in-memory ledger
        (notebooks/tests only). Refuses to touch an existing file."""
        _check_budget(total, "total")
        ledger = cls(None if path is None else os.fspath(path), lock_timeout=lock_timeout)
        if ledger.path is None:
            ledger._mem = duckdb.connect(":memory:")
            with ledger._txn(write=True, creating=True) as con:
                ledger._init_schema(con, total)
            return ledger
        p = ledger.path
        if os.path.lexists(p):
            raise LedgerError(
                f"cannot create a ledger at {p}: the file already exists",
                hint="open the existing ledger with Ledger.open(path) (dpsql never overwrites a ledger), "
                "or choose a new path",
            )
        if os.path.lexists(p + ".wal"):
            raise LedgerError(
                f"cannot create a ledger at {p}: an orphaned write-ahead log {p}.wal exists "
                "(DuckDB would replay it into the new file)",
                hint=f"move {p}.wal away (it may belong to a ledger that was moved or deleted), then retry",
            )
        parent = os.path.dirname(p)
        if not os.path.isdir(parent):
            raise LedgerError(
                f"cannot create a ledger at {p}: directory {parent} does not exist",
                hint="create the directory first or choose another path",
            )
        with ledger._txn(write=True, creating=True) as con:
            ledger._init_schema(con, total)
        try:  # make the new directory entry durable too
            fd = os.open(parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
        return ledger

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None,
        total: Budget | None = None,
        *,
        lock_timeout: float = 10.0,
    ) -> Ledger:
        """Open the ledger at ``path`` and use its recorded total.

        If ``total`` is given it must equal the recorded total exactly (else ``ConfigError``:
        changing a total is the explicit, recorded :meth:`set_total`). If the file does not exist
        it is created with ``total``; with ``total=None`` a missing file is a ``LedgerError``.
        """
        if total is not None:
            _check_budget(total, "total")
        if path is None:
            if total is None:
                raise LedgerError(
                    "an in-memory ledger (path=None) has no recorded total",
                    hint="pass total=Budget(epsilon=..., delta=...) or give the path of a ledger file",
                )
            return cls.create(None, total, lock_timeout=lock_timeout)
        p = os.path.abspath(os.fspath(path))
        if not os.path.lexists(p):
            if total is None:
                raise LedgerError(f"no budget ledger at {p}", hint=_INIT_HINT.format(path=p))
            try:
                return cls.create(p, total, lock_timeout=lock_timeout)
            except _AlreadyCreated:
                pass  # another process created it between our check and our lock: open it
            except LedgerError:
                if not os.path.lexists(p):
                    raise
                # created concurrently by someone else: fall through and validate it
        ledger = cls(p, lock_timeout=lock_timeout)
        recorded = ledger.total()  # validates the file
        if total is not None and total != recorded:
            raise ConfigError(
                f"ledger {p} records a total budget of {_fmt(recorded)}, but {_fmt(total)} was passed; "
                "the total is read from the ledger, and changing it is an explicit, recorded operation",
                hint="omit the total to use the recorded one, or change it on purpose with "
                "Ledger.set_total(Budget(...), reason='...') (the change is logged in the ledger)",
            )
        return ledger

    # public API ------------------------------------------------------------------------------
    def total(self) -> Budget:
        """The total budget, read from the ledger."""
        with self._txn(write=False) as con:
            return self._total(con)

    def spent(self) -> Budget:
        """Basic composition of every counted entry (reserved, released and failed)."""
        with self._txn(write=False) as con:
            return compose(self._spent_costs(con))

    def remaining(self) -> Budget:
        """total - spent (exact, floored at zero per coordinate), from one consistent snapshot."""
        with self._txn(write=False) as con:
            return self._total(con).minus(compose(self._spent_costs(con)))

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
        with self._txn(write=True) as con:
            total = self._total(con)
            spent = self._spent_costs(con)
            if not exact_sum_fits(spent, cost, total):
                remaining = total.minus(compose(spent))
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
                    hint="ask for a smaller epsilon/delta, reuse an earlier release, or (if the data "
                    "owner agrees) raise the total with Ledger.set_total(..., reason='...')",
                )
            entry_id = self._next_id(con)
            con.execute(
                "INSERT INTO ledger_entries (entry_id, created_at, updated_at, status, mechanism, epsilon, "
                "delta, query, tables, params) VALUES (?, current_timestamp, current_timestamp, 'reserved', "
                "?, ?, ?, ?, ?, ?)",
                [entry_id, mechanism, cost.epsilon, cost.delta, query, tables, params_json],
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
        with self._txn(write=True) as con:
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

    def fail(self, entry_id: int, reason: str) -> None:
        """Mark a reserved entry ``failed``. Its cost still counts. ``reason`` is stored as given
        and must not contain private values (the caller's job)."""
        entry_id = _check_id(entry_id)
        _check_str(reason, "reason", allow_empty=True)
        with self._txn(write=True) as con:
            self._row_for_transition(con, entry_id, "fail")
            con.execute(
                "UPDATE ledger_entries SET status = 'failed', updated_at = current_timestamp, "
                "failure_reason = ? WHERE entry_id = ?",
                [reason, entry_id],
            )

    def record_reuse(self, *, source_entry_id: int, query: str, tables: list[str]) -> int:
        """Record a zero-cost answer computed from the synopsis stored with ``source_entry_id``
        (post-processing: no privacy cost). Returns the new entry id (status ``reused``)."""
        source_entry_id = _check_id(source_entry_id)
        _check_str(query, "query", allow_empty=True)
        tables = _check_tables(tables)
        with self._txn(write=True) as con:
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
                "current_timestamp, 'reused', ?, 0, 0, ?, ?, '{}', ?)",
                [entry_id, mechanism, query, tables, source_entry_id],
            )
            return entry_id

    def find_synopsis(self, key: str) -> tuple[int, str] | None:
        """``(entry_id, synopsis_json)`` of the first released entry stored under ``key``, or None."""
        _check_str(key, "key")
        with self._txn(write=False) as con:
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
        with self._txn(write=True) as con:
            current = self._total(con)
            spent = self._spent_costs(con)
            if not exact_sum_fits(spent, Budget(0.0, 0.0), new_total):
                raise ConfigError(
                    f"cannot set the total of ledger {self._where()} to {_fmt(new_total)}: "
                    f"{_fmt(compose(spent))} is already spent, and spending cannot be undone",
                    hint="choose a total at least as large as the spent budget in both epsilon and delta",
                )
            if new_total == current:
                return
            change_id = _first(
                con.execute("SELECT COALESCE(MAX(change_id), 0) + 1 FROM ledger_totals").fetchall()
            )[0]
            con.execute(
                "INSERT INTO ledger_totals VALUES (?, current_timestamp, ?, ?, ?, ?, ?)",
                [change_id, new_total.epsilon, new_total.delta, current.epsilon, current.delta, reason],
            )

    def entry(self, entry_id: int) -> LedgerEntry:
        """One entry, by id (``LedgerError`` if unknown)."""
        entry_id = _check_id(entry_id)
        with self._txn(write=False) as con:
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

    def history(self) -> pa.Table:
        """All entries in order of entry id, as an Arrow table (JSON columns as text)."""
        with self._txn(write=False) as con:
            return con.sql(f"SELECT {_ENTRY_COLUMNS} FROM ledger_entries ORDER BY entry_id").to_arrow_table()

    def totals_history(self) -> pa.Table:
        """The log of total-budget changes (first row: the total at creation)."""
        with self._txn(write=False) as con:
            return con.sql("SELECT * FROM ledger_totals ORDER BY change_id").to_arrow_table()

    def close(self) -> None:
        """Forget the ledger. File ledgers hold nothing open between calls; an in-memory ledger
        (and its budget) is discarded."""
        self._closed = True
        if self._mem is not None:
            self._mem.close()
            self._mem = None

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
        row = _first(
            con.execute("SELECT epsilon, delta FROM ledger_totals ORDER BY change_id DESC LIMIT 1").fetchall()
        )
        if row is None:
            raise self._corrupt("it records no total budget (ledger_totals is empty)")
        return self._budget(row[0], row[1], "the total budget")

    def _spent_costs(self, con: duckdb.DuckDBPyConnection) -> list[Budget]:
        rows = con.execute(
            "SELECT entry_id, epsilon, delta FROM ledger_entries WHERE status IN "
            f"({', '.join(repr(s) for s in COUNTING_STATUSES)}) ORDER BY entry_id"
        ).fetchall()
        return [self._budget(e, d, f"entry {i}") for i, e, d in rows]

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

    def _init_schema(self, con: duckdb.DuckDBPyConnection, total: Budget) -> None:
        tables = con.execute(
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
        con.execute(schema_sql())
        got = _first(con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchall())
        if got is None or got[0] != str(SCHEMA_VERSION):  # pragma: no cover - packaging error
            raise LedgerError(
                f"the packaged ledger schema declares version {got and got[0]!r}, but the code expects "
                f"{SCHEMA_VERSION}",
                hint="reinstall dpsql",
            )
        con.execute(
            "INSERT INTO ledger_meta VALUES ('created_at', ?), ('created_by', ?)",
            [datetime.now(UTC).isoformat(), _created_by()],
        )
        con.execute(
            "INSERT INTO ledger_totals VALUES (1, current_timestamp, ?, ?, NULL, NULL, 'created')",
            [total.epsilon, total.delta],
        )

    def _check_schema(self, con: duckdb.DuckDBPyConnection) -> None:
        names = {
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                "AND schema_name = 'main'"
            ).fetchall()
        }
        missing = [t for t in _REQUIRED_TABLES if t not in names]
        if missing:
            what = (
                "an empty DuckDB database"
                if not names
                else f"a DuckDB database with tables {', '.join(sorted(names))}"
            )
            raise LedgerError(
                f"{self._where()} is not a dpsql budget ledger: it is {what} (missing {', '.join(missing)})",
                hint="pass the path of your ledger file, or create a new ledger at a new path with "
                "`dpsql init --epsilon 1.0 --delta 1e-6 --ledger NEW_PATH`; dpsql never modifies or "
                "repairs an existing file",
            )
        row = _first(con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchall())
        if row is None:
            raise self._corrupt("ledger_meta has no schema_version")
        try:
            found = int(row[0])
        except ValueError:
            raise self._corrupt(f"schema_version is {row[0]!r}") from None
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

    # connection handling ------------------------------------------------------------------
    @contextmanager
    def _txn(self, *, write: bool, creating: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """One transaction on a short-lived connection; commit (durable) on success."""
        if self._closed:
            raise LedgerError(
                f"ledger {self._where()} is closed", hint="open it again with Ledger.open(path)"
            )
        deadline = time.monotonic() + self.lock_timeout
        if not self._lock.acquire(timeout=self.lock_timeout):
            raise LedgerError(
                f"ledger {self._where()} is locked by another thread of this process for more than "
                f"{self.lock_timeout:g} s",
                hint="retry later or pass a larger lock_timeout",
            )
        try:
            if self._mem is not None:
                con = self._mem
                owned = False
            else:
                if self.path is None:  # closed in-memory ledger
                    raise LedgerError("this in-memory ledger is closed", hint="create a new one")
                con = self._connect(read_only=not write, creating=creating, deadline=deadline)
                owned = True
            try:
                con.execute("BEGIN TRANSACTION")
                try:
                    if not creating:
                        self._check_schema(con)
                    yield con
                except BaseException:
                    try:
                        con.execute("ROLLBACK")
                    except duckdb.Error:
                        pass
                    raise
                con.execute("COMMIT")  # fdatasync of the WAL happens here: the change is durable
                if write and owned:
                    try:
                        con.execute("CHECKPOINT")
                    except duckdb.Error:
                        pass  # durability already holds via the WAL; the next writer checkpoints
            except duckdb.Error as e:
                raise LedgerError(
                    f"ledger {self._where()}: DuckDB failed while {'writing' if write else 'reading'} "
                    f"the ledger ({type(e).__name__}: {e})",
                    hint="check the file is a dpsql ledger on a writable disk; nothing was recorded "
                    "unless the operation returned",
                ) from None
            finally:
                if owned:
                    try:
                        con.close()
                    except duckdb.Error:
                        pass  # the transaction has already committed or rolled back
        finally:
            self._lock.release()

    def _connect(self, *, read_only: bool, creating: bool, deadline: float) -> duckdb.DuckDBPyConnection:
        """Open the ledger file, retrying lock conflicts with randomised backoff until ``deadline``."""
        assert self.path is not None
        p = self.path
        started = time.monotonic()
        delay = 0.002
        while True:
            if not creating and not os.path.lexists(p):
                # duckdb.connect would silently create an empty database here
                raise LedgerError(
                    f"the budget ledger {p} no longer exists",
                    hint=f"restore it from a backup, or {_INIT_HINT.format(path=p)}",
                )
            limit = deadline
            try:
                return _open_duckdb(p, read_only=read_only)
            except duckdb.IOException as e:
                msg = str(e)
                if "Could not set lock" in msg:
                    why = f"is locked by another process{_lock_holder(msg)}"
                    hint = (
                        "DuckDB allows one writer per file, and a reader blocks writers while it has the "
                        "file open: close other programs holding the ledger (a duckdb shell, a notebook "
                        "connection), or retry with a larger lock_timeout"
                    )
                elif "not a valid DuckDB database" in msg and _size(p) == 0:
                    # transient while another process creates the file; give it at most 1 s
                    why = "is an empty file, not a dpsql budget ledger"
                    hint = (
                        "if a ledger is being created there, retry; otherwise remove the empty file and "
                        + _INIT_HINT.format(path=p)
                    )
                    limit = min(deadline, started + 1.0)
                elif "not a valid DuckDB database" in msg:
                    raise LedgerError(
                        f"{p} is not a dpsql budget ledger: it is not a DuckDB database file at all",
                        hint="pass the path of your ledger file; dpsql never overwrites an existing file "
                        f"(to start a new ledger use a new path: {_INIT_HINT.format(path='NEW_PATH')})",
                    ) from None
                else:
                    raise LedgerError(
                        f"cannot open the budget ledger {p}: {msg}",
                        hint="check the path, the file permissions and free disk space",
                    ) from None
            except duckdb.ConnectionException as e:
                if "different configuration" not in str(e):
                    raise LedgerError(
                        f"cannot open the budget ledger {p}: {e}", hint="check the path"
                    ) from None
                why = "is held open by another DuckDB connection in this process"
                hint = "close that connection (dpsql opens the ledger itself for each operation)"
            except duckdb.Error as e:
                raise LedgerError(
                    f"cannot open the budget ledger {p} as a DuckDB database: {e}",
                    hint="pass the path of your ledger file (restore it from a backup if it is damaged)",
                ) from None
            now = time.monotonic()
            if now >= limit:
                raise LedgerError(f"ledger {p} {why}; gave up after {now - started:.2g} s", hint=hint)
            time.sleep(min(limit - now, random.uniform(0.5, 1.0) * delay))
            delay = min(delay * 2, 0.05)


def _open_duckdb(p: str, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(p, read_only=read_only)
    except duckdb.ConnectionException as e:
        # Another connection of this process holds the file read-write: DuckDB refuses a
        # read-only connection to the same file but shares its instance with a read-write one.
        if read_only and "different configuration" in str(e):
            return duckdb.connect(p, read_only=False)
        raise


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


def _created_by() -> str:
    try:
        from importlib.metadata import version

        return f"dpsql {version('dpsql')}"
    except Exception:
        return "dpsql"


__all__ = ["Ledger", "LedgerEntry", "SCHEMA_VERSION", "COUNTING_STATUSES", "schema_sql"]
