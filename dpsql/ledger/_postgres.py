"""The budget ledger on PostgreSQL: one budget shared by many processes on many hosts.

``Session(ledger="postgresql://user@host/db")`` / ``[ledger] url = "postgresql://..."``. The
same schema as the DuckDB file (``schema_postgres.sql``: the same tables, columns, checks and
meanings, in PostgreSQL's type names), the same operations (:class:`PostgresLedger` is a
:class:`~dpsql.ledger._store.Ledger`: every method above the transaction is shared, so
reserve-before-read, commit / fail, synopsis reuse, set_total and the refusals are the same
code), through ``psycopg`` 3 (``pip install 'dpsql[postgres]'``).

Why N processes on several hosts never overspend
------------------------------------------------
Every write transaction (reserve, commit, fail, record_reuse, set_total) starts with
``LOCK TABLE ledger_entries, ledger_totals IN EXCLUSIVE MODE`` before it reads anything. That
lock conflicts with itself, so writers run one at a time across every connection to the
database, whatever host they come from; it does not block readers. The transaction runs at READ
COMMITTED (set explicitly: a database default of REPEATABLE READ would freeze a snapshot taken by
any query before the lock), where each statement sees every transaction committed before it started: so a
``reserve`` that holds the lock reads every charge committed before it (the previous holder has
committed and released the lock), decides ``spent + cost <= total`` exactly
(``dpsql.budget.exact_counted_sum_fits``) and inserts its row, and the next writer sees that row. The
charge is durable when COMMIT returns (PostgreSQL's WAL: every write transaction raises
``synchronous_commit`` to ``on`` where the server, database or role sets ``off`` or ``local``,
and keeps ``remote_write`` / ``remote_apply``); the caller reads private rows only after that. A lock that is not
granted within ``lock_timeout`` seconds (PostgreSQL's ``lock_timeout``, set per transaction) is a
LedgerError that changes nothing; the server's, database's or role's ``statement_timeout`` and
``transaction_timeout`` are lifted for the transaction (its one wait is the lock, bounded by
``lock_timeout``), and ``idle_in_transaction_session_timeout`` is set to dpsql's own bound (10 s, or
twice ``lock_timeout``): a process frozen while holding the lock is cut off, its change not made. A read-only transaction (a standby, or
``default_transaction_read_only = on``) is a LedgerError that says so; a connection the server
drops mid-transaction is a LedgerError (the server rolls the transaction back), never psycopg's
own exception. ``tests/test_ledger_postgres.py`` runs N processes charging
one ledger concurrently and checks that the total is never exceeded.

Connections kept between operations
------------------------------------
Opening a connection (and warming a new server backend's caches) was most of an operation's time,
so a ledger keeps its connections (:class:`_Pool`): at most 4 per ledger object and process, one per
thread inside an operation at the same time (a fifth thread waits for one, within its
``lock_timeout``). An idle connection is reused only while it has been idle for less than 30 s, is
younger than 60 s, is outside any transaction and has nothing waiting on its socket (a server that
ended it has said so there); otherwise it is closed and a new one opened. Every setting a
transaction makes is local to it (``SET TRANSACTION``, ``set_config(..., true)``), so a reused
connection starts each transaction as a new one would, except for the server's, database's or
role's defaults, which a session reads when it starts: a change of those reaches a ledger within 60
s. Prepared statements are off (``prepare_threshold=None``), so a pooler in transaction mode
(pgbouncer) can stand between. A forked child never uses its parent's connections: the at-fork hook
(``os.register_at_fork``; and a pid check where a fork bypassed it) points the child's descriptor of
each inherited socket at /dev/null before closing it, so the goodbye that closing sends cannot end
the parent's server session, and the child opens its own. A kept connection that the server
dropped while it was idle and that fails one of the statements that open a transaction (before the
body: nothing has been written) is replaced and the transaction started again, once; for a charge, a
connection lost after that is a LedgerError (the server rolled the transaction back; at COMMIT it may
have committed it: the message says so), never a retry, so a charge is never sent twice. Recording a
release (its query has read private rows, its charge stands) retries connecting until
``Ledger.release_wait`` runs out, so a server that restarts or fails over while the query runs does not
discard an answer already paid for (connecting sends nothing), and starts its transaction again when the
server's statement_timeout (which a transaction's first statements run under, before dpsql lifts it)
cancels one of them (nothing is written yet); a charge says so and gives up. A release whose connection
the server drops inside its transaction (mid-statement, between two, or at COMMIT: a restart, a
fail-over, ``pg_terminate_backend``) is started again on a new connection too, within the same
``release_wait``, and is idempotent: the new transaction takes the ledger's lock (so the cut one has
ended, rolled back or committed), and an entry it finds already released with exactly this release's
parameters and synopsis is the first attempt's COMMIT, which reached the server: nothing more is written
(``PostgresLedger._record_release``; ``tests/test_ledger_postgres_reuse.py``). Recording a failure (``fail``: the
query failed after its charge) is started again the same way, within the same wait (an entry found failed with this
reason is a cut attempt's COMMIT), so that the entry reads 'failed', not 'reserved' (it counts either way). When the
wait runs out after a lost connection, the error is one LedgerError that says the charge stands, that the entry stays
'reserved' (or reads what a COMMIT cut short recorded) and what to do.
``close()`` (and a ledger that is garbage collected) closes the connections; ``tests/test_ledger_postgres_reuse.py``.

Ctrl-C (SIGINT) in the main thread is held back during an operation, as for a ledger file (``dpsql.interrupts``:
the operations run inside ``Ledger._txn``): it is raised where the operation waits (for a connection of the pool;
for the ledger's lock, another creator or the server's answer to a connection, where psycopg cancels the statement
and the connection is closed), before COMMIT (the change is rolled back), or once the connection is given back
(after COMMIT: the change stands, and a charge's caller is told it was interrupted, never that nothing was charged).
It never leaves a connection taken from the pool, counted as being opened, or kept inside a transaction
(``tests/test_ledger_postgres_interrupts.py``).

Refusals: a database without the three tables is "not a dpsql ledger" unless ``create=True``
(then the schema is created, under a transaction-scoped advisory lock so two creators cannot
both create it); a database with the tables but another ``schema_version`` is refused exactly
as a DuckDB file is; tables other than dpsql's are left alone (the ledger uses the connection's
``search_path``: give it a schema of its own with ``?options=-csearch_path%3Ddpsql``); tables of the
ledger's names in more than one schema of the search_path are refused (another schema, e.g. one named
after the user and so read first, could stand in for the ledger's own). A search_path that holds no ledger while another
schema of the database does is refused, with ``create=True`` too (a changed search_path never becomes a fresh
budget; ``dpsql init`` creates a ledger there on purpose). A ledger whose tables have row-level security enabled is
refused in every transaction, for every role: a role that a policy restricts reads only some of the charges (or an older
total), and would charge budget that is spent (``tests/test_ledger_postgres_row_security.py``); so is a ledger whose
table of one of these names is a view (or any relation but a table), which filters the rows read as a policy does.

Each ledger has a random identity, as a ledger file has (``ledger_meta.ledger_id``, 128 bits, drawn when it is
created; a ledger created before identities gets one at its next write, inserted under the ledger's lock, so
one writer draws it and nothing else changes). Every transaction reads it in the statement that checks the
schema (no extra round trip), with the OID of the ``ledger_entries`` table the search_path leads to, and a
:class:`PostgresLedger` object keeps to the ledger it used first: to its identity, or, while that ledger has
none yet (it was only read), to its table's OID. A search_path that changes while a session runs
(``ALTER ROLE`` / ``ALTER DATABASE ... SET search_path`` picked up by a new connection, a pooler's other
server session, another schema of the same tables) would otherwise lead a release to another ledger, whose
entry numbers name other charges: it is refused with a LedgerError that names both schemas and identities
and how to name the schema in the URL; nothing is charged or recorded there.
The URL's password never appears in a message (``Ledger.path`` shows the URL without it).
"""

from __future__ import annotations

import math
import os
import re
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from dpsql.budget import Budget
from dpsql.errors import ConfigError, LedgerBusyError, LedgerError
from dpsql.interrupts import HeldInterrupt, change_stands, interruptible, interruption_point
from dpsql.ledger._store import (
    _LEDGER_ID_RE,
    _REQUIRED_TABLES,
    Ledger,
    _check_budget,
    _fmt,
    _new_ledger_id,
    _Txn,
    check_new_total,
)

__all__ = ["PostgresLedger", "is_postgres_url", "redact"]

_ADVISORY_KEY = 0x64707371  # "dpsq": serialises ledger creation in one database
_PG_MAX_MS = 2**31 - 1  # the largest lock_timeout PostgreSQL accepts, in milliseconds


def _pg_ms(seconds: float, least: int = 1) -> int:
    """``seconds`` as whole milliseconds for the server, from ``least`` to :data:`_PG_MAX_MS`: capped before the
    conversion, since a huge (finite) lock_timeout made ``seconds * 1000`` infinite, which no int holds."""
    return min(max(least, math.ceil(min(seconds, _PG_MAX_MS / 1000) * 1000)), _PG_MAX_MS)


def is_postgres_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


#: connection parameters whose value is a secret (libpq also reads them from the URL's query string)
_SECRET_PARAMS = ("password", "sslpassword")


def _query_start(rest: str) -> int:
    """Where the query string of a URL's part after '://' starts when no user part comes before its first '/':
    at the first '?' followed by a key=value before any '@' (a '?' with none, as in u:pa/s?s@host, belongs to a
    password that holds an unencoded '/'); its length when there is none."""
    q = rest.find("?")
    while q >= 0:
        at = rest.find("@", q)
        if at < 0 or "=" in rest[q:at]:
            return q
        q = rest.find("?", q + 1)
    return len(rest)


def redact(url: str) -> str:
    """The URL without its password (for messages, ``Ledger.path`` and the history): the one in
    the user part and ``password=`` / ``sslpassword=`` in the query string."""
    try:
        parts = urlsplit(url)
        parts.password  # noqa: B018 - parsed here, so that a malformed user part fails here
    except ValueError as e:  # e.g. an unclosed '[' of an IPv6 host: never quote the URL (a password)
        raise ConfigError(f"the PostgreSQL ledger URL cannot be parsed ({e}); it is not shown, as it may hold a password",
                          hint="check the ledger URL: postgresql://USER@HOST:PORT/DATABASE, an IPv6 host in brackets "
                          "(postgresql://USER@[::1]:5432/DATABASE)") from None
    # read as libpq reads it, not as Python's parser does: the user part runs to the first '@' that comes before
    # any '/' (hidden here up to the last '@' before the next '/' or '?'), and a '?' or '#' in it belongs to the
    # password (Python ends the host at either, so it saw no password in postgresql://u:pa?ss@host/db, which libpq
    # connects with as the password 'pa?ss'); the query string starts at the first '?' after it, and '#' has no
    # meaning there (?password=a#b is the password 'a#b')
    scheme, _, rest = url.partition("://")
    first = next((i for i, ch in enumerate(rest) if ch in "@/"), -1)
    at = -1
    if first >= 0 and rest[first] == "@":
        end = next((i for i in range(first, len(rest)) if rest[i] in "/?"), len(rest))
        at = rest.rfind("@", 0, end)
    user = ""
    if at >= 0:
        info, rest = rest[:at], rest[at + 1:]
        user = (info.split(":", 1)[0] + ":***" if ":" in info else info) + "@"
    elif "@" in rest[:(query_at := _query_start(rest))]:
        # an '@' after a '/' (a password holding an unencoded '/': postgresql://u:pa/ss@host/db, which libpq reads
        # as host 'u', port 'pa' and database 'ss@host/db'): everything up to the last such '@' may be a password
        rest = rest[rest.rfind("@", 0, query_at) + 1:]
        user = "***@"
    host, q, query = rest.partition("?")
    if q:
        query = "&".join(f"{kv[0]}=***" if len(kv) == 2 and unquote(kv[0]).strip().lower() in _SECRET_PARAMS
                         else "=".join(kv) for kv in (pair.split("=", 1) for pair in query.split("&")))
    return f"{scheme}://{user}{host}{q}{query}"


def schema_postgres_sql() -> str:
    return resources.files("dpsql.ledger").joinpath("schema_postgres.sql").read_text(encoding="utf-8")


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise ConfigError("a PostgreSQL ledger needs psycopg 3, which is not installed",
                          hint="pip install 'dpsql[postgres]'") from None
    return psycopg


class _Result:
    def __init__(self, rows: list[tuple[Any, ...]], names: list[str]) -> None:
        self._rows = rows
        self._names = names

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def to_arrow_table(self) -> pa.Table:
        return pa.table({n: [r[i] for r in self._rows] for i, n in enumerate(self._names)})


class _Con:
    """The slice of a DuckDB connection the shared Ledger code uses (``execute(sql, params)``,
    ``fetchall``, ``sql(...).to_arrow_table()``), over a psycopg connection: ``?`` placeholders
    become ``%s``."""

    def __init__(self, con: Any) -> None:
        self._con = con

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> _Result:
        q = sql.replace("%", "%%").replace("?", "%s")
        with self._con.cursor() as cur:
            cur.execute(q, list(params) if params is not None else None)
            if cur.description is None:
                return _Result([], [])
            return _Result(list(cur.fetchall()), [d.name for d in cur.description])

    def sql(self, sql: str) -> _Result:
        return self.execute(sql)


# -- connections kept between operations ------------------------------------------------------------

#: a ledger keeps at most this many connections per process (one per thread inside an operation at once)
_POOL_SIZE = 4
#: a kept connection is reused only while it has been idle for less than this (seconds) ...
_MAX_IDLE = 30.0
#: ... and is younger than this: it then picks up what the server, database or role now set
_MAX_AGE = 60.0
#: the clock of idleness and age (tests replace it)
_clock = time.monotonic


class _Slot:
    """One open connection of a pool, with when it was opened and when it was last given back."""

    __slots__ = ("con", "opened", "idle_since")

    def __init__(self, con: Any) -> None:
        self.con = con
        self.opened = self.idle_since = _clock()


def _alive(con: Any) -> bool:
    """Whether an idle connection may still be usable: open, outside any transaction, and nothing
    waiting to be read on its socket (an idle connection receives nothing, unless the server ended it:
    a terminated backend, a restart). Reading the socket costs no round trip; a connection that dies
    later still fails its first statement (then the operation is retried once, see _one_txn)."""
    from psycopg.pq import TransactionStatus

    try:
        if con.closed or con.info.transaction_status != TransactionStatus.IDLE:
            return False
        poller = select.poll()
        poller.register(con.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)
    except Exception:  # noqa: BLE001 - a connection that cannot even say so is not used
        return False


def _close(con: Any) -> None:
    try:
        con.close()
    except Exception:  # noqa: BLE001 - closing a connection the server dropped may fail; it is gone either way
        pass


def _disown(con: Any) -> None:
    """In a forked child, let go of a connection inherited from the parent without touching the
    parent's session: the child's descriptor of the socket is first pointed at /dev/null, so the
    goodbye that closing sends (libpq's Terminate message, a TLS close) goes nowhere instead of
    ending the parent's server session; then it is closed (the parent's descriptor stays open)."""
    try:
        fd = con.fileno()  # (also of a connection found broken: libpq keeps its socket until it is freed)
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)
    except Exception:  # noqa: BLE001 - without a socket there is nothing to protect
        pass
    _close(con)


class _Pool:
    """The open connections of one ledger in this process: at most ``_POOL_SIZE``; an idle one is
    reused while ``_alive``, idle for less than ``_MAX_IDLE`` and younger than ``_MAX_AGE``, else
    closed. A thread that finds every connection in use waits for one, up to the operation's
    deadline (its ``lock_timeout``). In a forked child (the at-fork hook, or the pid check where the
    fork bypassed it) every inherited connection is disowned (``_disown``) and the pool starts empty."""

    def __init__(self) -> None:
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:  # also in a forked child, without the parent's mutex (it may be held)
        self.pid = os.getpid()
        self.cond = threading.Condition(threading.Lock())
        self.idle: list[_Slot] = []
        #: every connection of this pool, idle or in use, and the count of those being opened
        self.slots: set[_Slot] = set()
        self.opening = 0
        self.closed = False

    def forget_inherited(self) -> None:
        for slot in list(self.slots):
            _disown(slot.con)
        self._reset()

    def _mine(self) -> None:
        if self.pid != os.getpid():  # forked without the at-fork hook (defensive)
            self.forget_inherited()

    def acquire(self, connect: Callable[[], Any], deadline: float, busy: Callable[[], Exception]) -> tuple[_Slot, bool]:
        """A connection for one operation: (slot, whether it served an operation before). Waits for
        one of ``_POOL_SIZE`` connections in use until ``deadline`` (``time.monotonic``), then raises
        ``busy()``."""
        self._mine()
        while True:
            interruption_point()  # (Ctrl-C held back by the ledger operation: nothing is taken here)
            stale: list[_Slot] = []
            slot: _Slot | None = None
            state = "open"
            with self.cond:
                now = _clock()
                for s in list(self.idle):  # every expired one goes, not only the one taken
                    if now - s.idle_since >= _MAX_IDLE or now - s.opened >= _MAX_AGE:
                        self.idle.remove(s)
                        self.slots.discard(s)
                        stale.append(s)
                while self.idle and slot is None:
                    s = self.idle.pop()  # the most recently used: the others age out
                    if _alive(s.con):
                        slot, state = s, "reuse"
                    else:
                        self.slots.discard(s)
                        stale.append(s)
                if slot is None:
                    if len(self.slots) + self.opening < _POOL_SIZE:
                        self.opening += 1
                    elif (left := deadline - time.monotonic()) > 0:
                        self.cond.wait(min(left, 0.05))  # (Ctrl-C held back is raised between two steps)
                        state = "wait"
                    else:
                        state = "busy"
            for s in stale:
                _close(s.con)
            if state == "reuse" and slot is not None:
                return slot, True
            if state == "busy":
                raise busy()
            if state == "open":
                break
        try:
            con = connect()
        except BaseException:
            with self.cond:
                self.opening -= 1
                self.cond.notify()
            raise
        slot = _Slot(con)
        with self.cond:
            self.opening -= 1
            self.slots.add(slot)
        return slot, False

    def release(self, slot: _Slot, reusable: bool) -> None:
        """Give a connection back: kept if ``reusable`` and clean (outside any transaction), else closed."""
        if self.pid != os.getpid():
            self._mine()  # (the slot was inherited: disowned with the others)
            return
        keep = reusable and _alive(slot.con)
        with self.cond:
            if slot not in self.slots:  # inherited and disowned, or dropped
                keep = False
            elif keep and not self.closed and _clock() - slot.opened < _MAX_AGE:
                slot.idle_since = _clock()
                self.idle.append(slot)
            else:
                keep = False
                self.slots.discard(slot)
            self.cond.notify()
        if not keep:
            _close(slot.con)

    def discard_idle(self) -> None:
        """Close every idle connection (after one was found dropped: the others probably were too)."""
        with self.cond:
            stale, self.idle = self.idle, []
            for s in stale:
                self.slots.discard(s)
        for s in stale:
            _close(s.con)

    def close(self) -> None:
        """Close the idle connections now and those in use when they are given back."""
        if self.pid != os.getpid():
            self.forget_inherited()
        with self.cond:
            self.closed = True
        self.discard_idle()


#: every pool of this process, for the at-fork hook
_POOLS: weakref.WeakSet[_Pool] = weakref.WeakSet()


def _forget_after_fork() -> None:
    # The child runs one thread; the parent's other threads (and any lock they held) are not there.
    for pool in list(_POOLS):
        pool.forget_inherited()


os.register_at_fork(after_in_child=_forget_after_fork)


class PostgresLedger(Ledger):
    """A :class:`Ledger` stored in a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, lock_timeout: float = 10.0) -> None:
        super().__init__(None, lock_timeout=lock_timeout)
        _psycopg()
        self._url = url
        self.path = redact(url)
        self._pool = _Pool()
        #: the ledger this object used first: (its identity, or None for a ledger written before identities; the
        #: OID of its ledger_entries table; its schema), compared at every operation (_check_ledger)
        self._pin: tuple[str | None, str, str] | None = None
        # a ledger that is dropped without close() closes its connections too (the finalizer holds the
        # pool, not the ledger)
        weakref.finalize(self, self._pool.close)

    @classmethod
    def create(cls, path: Any, total: Budget, *, lock_timeout: float = 10.0) -> PostgresLedger:
        """Create the ledger's tables in the database at ``path`` (a URL) with ``total``."""
        check_new_total(_check_budget(total, "total"))
        ledger = cls(str(path), lock_timeout=lock_timeout)
        ledger._create(total, must_be_new=True)
        return ledger

    @classmethod
    def open(cls, path: Any, total: Budget | None = None, *, create: bool = False,
             lock_timeout: float = 10.0) -> PostgresLedger:
        """Open the ledger in the database at ``path`` (a URL); with ``create=True`` and a
        ``total``, create it if the database has no ledger tables yet."""
        if total is not None:
            _check_budget(total, "total")
        if not isinstance(create, bool):
            raise ConfigError(f"create must be True or False, got {create!r}")
        ledger = cls(str(path), lock_timeout=lock_timeout)
        if not ledger._has_tables():
            if not create:
                raise LedgerError(
                    f"no budget ledger in the database {ledger.path}",
                    hint=f"create it with `dpsql init --epsilon 1.0 --delta 1e-6 --ledger '{ledger.path}'` or "
                    "Session(ledger=URL, budget=..., create=True)",
                )
            if total is None:
                raise LedgerError(f"no budget ledger in the database {ledger.path}, and no total to create one with",
                                  hint="pass the total budget together with create=True")
            check_new_total(total)
            if not ledger._create(total):
                return ledger
            # another process created the ledger while this one waited to: its total is compared below, as that of
            # a ledger that was there before (a LedgerError with a Python hint said so, where a file ledger's racing
            # creator is told the ConfigError below)
        recorded = ledger.total()
        if total is not None and total != recorded:
            raise ConfigError(
                f"ledger {ledger.path} records a total budget of {_fmt(recorded)}, but {_fmt(total)} was passed; "
                "the total is read from the ledger, and changing it is an explicit, recorded operation",
                hint="omit the total to use the recorded one, or change it with Ledger.set_total(..., reason='...')",
            )
        return ledger

    # -- connections --------------------------------------------------------------------------------
    def _connect(self, unchanged: str) -> Any:
        psycopg = _psycopg()
        failure: LedgerError | None = None
        try:
            # no prepared statements: a connection pooler in transaction mode (pgbouncer) may hand the next
            # transaction to another server session, which would not know them; Ctrl-C stops the wait for
            # the server (up to connect_timeout) there
            with interruptible():
                con = psycopg.connect(self._url, connect_timeout=min(max(1, math.ceil(self.lock_timeout)), _PG_MAX_MS // 1000),
                                      autocommit=False, prepare_threshold=None, fallback_application_name="dpsql ledger",
                                      # text is sent and read as UTF-8 whatever the database's or role's encoding: under
                                      # LATIN1 a query holding another character raised Python's UnicodeEncodeError, and
                                      # under SQL_ASCII every value was read as bytes (the ledger looked damaged)
                                      client_encoding="UTF8")
        except Exception as e:  # noqa: BLE001 - psycopg's message may hold the password: class and our words only
            reason = _connect_reason(str(e))
            failure = LedgerError(f"cannot connect to the PostgreSQL ledger {self.path} ({type(e).__name__}"
                                  f"{': ' + reason if reason else ''}); {unchanged}",
                                  hint="check the URL, that the server runs and accepts this user")
        if failure is not None:
            raise failure
        from psycopg.types.string import TextLoader

        for name in ("json", "jsonb"):
            con.adapters.register_loader(name, TextLoader)  # JSON columns as text, as the DuckDB ledger reads them
        return con

    def _acquire(
        self, unchanged: str, deadline: float, wait: float | None = None, *, reconnect: bool = False
    ) -> tuple[_Slot, bool]:
        def busy() -> LedgerError:
            return LedgerBusyError(f"ledger {self.path} is busy: {_POOL_SIZE} operations on it in other threads of this "
                               f"process held all its connections for more than {self.lock_timeout if wait is None else wait:g} s; "
                               f"{unchanged}",
                               hint="retry, or pass a larger lock_timeout")

        def connect() -> Any:
            # ``reconnect`` (a release, whose query has read private rows): a server restarting or failing over
            # meanwhile must not discard the answer; connecting sends nothing, so a retry never charges twice
            while True:
                try:
                    return self._connect(unchanged)
                except LedgerError:
                    if not reconnect or (left := deadline - time.monotonic()) <= 0:
                        raise
                    time.sleep(min(left, 0.2))
                    interruption_point()

        return self._pool.acquire(connect, deadline, busy)

    @contextmanager
    def _connection(self, unchanged: str) -> Iterator[Any]:
        """A connection of the pool for one transaction that is not a ledger operation's (no retry)."""
        slot, _ = self._acquire(unchanged, time.monotonic() + self.lock_timeout)
        reusable = False
        try:
            yield slot.con
            reusable = True
        except Exception:
            reusable = True  # kept only if it is back outside any transaction (release checks)
            raise
        finally:
            self._pool.release(slot, reusable)

    def _has_tables(self) -> bool:
        with HeldInterrupt(), self._connection("nothing was changed") as con:  # (Ctrl-C: as in a ledger operation)
            failure: LedgerError | None = None
            try:
                with con.cursor() as cur:
                    # ... and, for a ledger not found, the search_path and the schemas that hold a ledger elsewhere
                    cur.execute("SELECT to_regclass('ledger_meta'), to_regclass('ledger_totals'), to_regclass('ledger_entries'), "
                                "current_setting('search_path'), (SELECT string_agg(DISTINCT n.nspname, ', ' ORDER BY "
                                "n.nspname) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = "
                                "c.relnamespace WHERE c.relname = 'ledger_entries' AND c.relkind IN ('r', 'p'))")
                    *row, search_path, elsewhere = cur.fetchone()
                con.rollback()
            except Exception as e:  # noqa: BLE001 - psycopg's errors; the server's text is not shown
                failure = (_cancelled_failure(self.path, "nothing was changed") if type(e).__name__ == "QueryCanceled"
                           else LedgerError(f"ledger {self.path}: PostgreSQL failed ({type(e).__name__}); nothing was "
                                            "changed", hint="check the server and the user's rights"))
            if failure is not None:
                _rollback(con)
                raise failure
            present = [x is not None for x in row]
            if any(present) and not all(present):
                raise LedgerError(
                    f"the database {self.path} is not a dpsql budget ledger: it has some of the ledger's tables "
                    f"but not all of {', '.join(_REQUIRED_TABLES)}",
                    hint="point the URL at the ledger's own database or schema; dpsql never repairs a ledger",
                )
            if not any(present) and elsewhere:
                # the search_path (of the URL, the role or the database) changed, or the URL names another schema:
                # creating a ledger here (create_if_missing) gave the whole budget again
                raise LedgerError(
                    f"no budget ledger in the search_path ({search_path}) of {self.path}, but the database holds a "
                    f"ledger's tables in schema {elsewhere}; nothing was created or charged",
                    hint="name the ledger's schema in the URL (?options=-csearch_path%3D<schema>). A ledger created in "
                         "this search_path (`dpsql init`) would start a NEW budget, as if nothing had been spent: do "
                         "that only if the data owner decides so",
                )
            return all(present)

    def _create(self, total: Budget, *, must_be_new: bool = False) -> bool:
        """Create the tables. ``must_be_new`` (``dpsql init``, :meth:`create`): an existing ledger is
        refused, as for a file; otherwise (``open(create=True)`` racing another creator) True says that the
        ledger existed (created meanwhile), and the caller compares its recorded total."""
        with HeldInterrupt():  # Ctrl-C: as in a ledger operation (raised where it waits, or once all is given back)
            slot, _ = self._acquire("no ledger was created", time.monotonic() + self.lock_timeout)
            con = slot.con
            try:
                with con.cursor() as cur:
                    # each statement sees what was committed before it, whatever the database's default: under
                    # REPEATABLE READ or SERIALIZABLE the snapshot of the first statement, taken before the wait for
                    # another creator, hid the ledger that creator committed meanwhile (DuplicateTable, as above)
                    cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    # the wait for another creator is bounded as a charge's is (lock_timeout), and the server's
                    # time-outs are lifted for it: an advisory lock otherwise waits forever
                    ms = _pg_ms(self.lock_timeout)
                    cur.execute("SELECT set_config(name, CASE name WHEN 'lock_timeout' THEN %s ELSE '0' END, true) "
                                "FROM pg_catalog.pg_settings WHERE name IN ('lock_timeout', "
                                + ", ".join(f"'{n}'" for n in _LIFTED_TIMEOUTS) + ")", [f"{ms}ms"])
                    with interruptible():  # the wait for another creator: Ctrl-C cancels it
                        cur.execute("SELECT pg_advisory_xact_lock(%s)", [_ADVISORY_KEY])
                    # read from pg_class under this statement's snapshot, taken after the lock was granted: to_regclass
                    # asks the backend's catalog cache, which the wait for an advisory lock does not refresh, so a
                    # ledger another creator committed meanwhile read as missing there, and creating it again failed
                    # (DuplicateTable) where the ledger asked for stood
                    cur.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON "
                                "n.oid = c.relnamespace WHERE c.relname = 'ledger_meta' AND n.nspname = ANY "
                                "(pg_catalog.current_schemas(true)))")
                    exists = bool(cur.fetchone()[0])
                if not exists:
                    c = _Con(con)
                    for stmt in _statements(schema_postgres_sql()):
                        c.execute(stmt)
                    c.execute("INSERT INTO ledger_meta VALUES ('created_at', ?), ('created_by', ?), ('generation', '1'), "
                              "('ledger_id', ?)", [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dpsql",
                                                   _new_ledger_id()])
                    c.execute("INSERT INTO ledger_totals VALUES (1, current_timestamp, ?, ?, NULL, NULL, 'created')",
                              [total.epsilon, total.delta])
                interruption_point()  # Ctrl-C so far: nothing is created
                con.commit()
            except LedgerError:
                _rollback(con)
                raise
            except Exception as e:  # noqa: BLE001
                _rollback(con)
                psycopg = _psycopg()
                if isinstance(e, psycopg.errors.LockNotAvailable):
                    raise LedgerBusyError(f"ledger {self.path} is busy: another process has been creating a ledger in this "
                                      f"database for more than {self.lock_timeout:g} s; no ledger was created",
                                      hint="retry, or pass a larger lock_timeout") from None
                if isinstance(e, psycopg.errors.ReadOnlySqlTransaction):
                    raise _read_only_failure(self.path, "no ledger was created") from None
                if isinstance(e, psycopg.errors.InvalidSchemaName):
                    raise LedgerError(f"cannot create the ledger in {self.path}: the connection's search_path names no "
                                      "schema to create its tables in; no ledger was created",
                                      hint="name one in the URL: ?options=-csearch_path%3D<schema>") from None
                raise LedgerError(f"cannot create the ledger in {self.path} ({type(e).__name__}); no ledger was created",
                                  hint="check that the user may create tables in the database") from None
            finally:
                self._pool.release(slot, True)  # kept only if back outside any transaction
        if exists and must_be_new:
            raise LedgerError(
                f"cannot create a ledger in {self.path}: the database already holds one",
                hint="open the existing ledger with Ledger.open(url) (dpsql never overwrites a ledger), or choose "
                "another database or schema",
            )
        return exists

    @contextmanager
    def _one_txn(self, *, write: bool, creating: bool = False,
                 unchanged: str = "nothing was changed", wait: float | None = None) -> Iterator[tuple[Any, _Txn]]:
        """One transaction: take a connection (a kept one, or a new one), (writers) take the table
        lock, check the schema, run the body, commit. Any failure before COMMIT rolls back:
        ``unchanged`` holds. It runs inside ``Ledger._txn``: Ctrl-C in the main thread is held back
        (``dpsql.interrupts``) and raised where it waits (for a connection of the pool, for the ledger's
        lock: psycopg cancels the statement, and the connection is closed), before COMMIT (rolled back),
        or once the connection is given back. A kept connection found dropped during the opening statements (before
        the body, so before anything is written) is replaced and the transaction started again, once;
        a connection lost from the body on is an error, never a retry (a charge is sent once)."""
        if self._closed:
            raise LedgerError(f"ledger {self.path} is closed", hint="open it again")
        t = _Txn(unchanged)
        psycopg = _psycopg()
        # the pool's wait and the lock's share lock_timeout (``wait``: a release's, Ledger.release_wait, which
        # also waits for a server that cannot be reached: restarting, failing over)
        reconnect = wait is not None
        # a ledger table of another layout than dpsql's (a hand-made or foreign table of the same name)
        layout = (psycopg.errors.UndefinedColumn, psycopg.errors.DatatypeMismatch, psycopg.errors.WrongObjectType)
        wait = self.lock_timeout if wait is None else wait
        deadline = time.monotonic() + wait
        retried = False
        while True:
            slot, reused = self._acquire(unchanged, deadline, wait, reconnect=reconnect)
            con = slot.con
            reusable = False
            try:
                c = _Con(con)
                failure: LedgerError | None = None
                dropped = cancelled = False
                try:
                    if not write:  # one snapshot for every statement of a read (e.g. spent and the entries)
                        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    else:  # each statement sees what was committed before it, whatever the database's default
                        c.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    # PostgreSQL reads 0 as "wait forever" and refuses more than 2^31 - 1 ms
                    ms = _pg_ms(deadline - time.monotonic())
                    # one statement (one round trip) sets, for this transaction: lock_timeout; doubles as the
                    # shortest text that reads back bit-exact, whatever the server's or the database's
                    # extra_float_digits (at 0, 0.1 + 0.2 read back as 0.3: charges undercounted); the
                    # server's time-outs lifted (_LIFTED_TIMEOUTS: those this server has)
                    # ... and the idle-in-transaction time-out set to a bound of dpsql's own (_idle_ms): a process
                    # frozen while it holds the ledger's lock (SIGSTOP, a debugger, a paused VM) blocked every
                    # host, however long; and timestamps in ISO text, the only DateStyle psycopg reads (under
                    # 'SQL, DMY' or 'German' the history raised psycopg's NotImplementedError)
                    c.execute("SELECT set_config(name, CASE name WHEN 'lock_timeout' THEN ? WHEN 'extra_float_digits' "
                              "THEN '3' WHEN 'idle_in_transaction_session_timeout' THEN ? WHEN 'DateStyle' THEN 'ISO' "
                              "ELSE '0' END, true) FROM pg_catalog.pg_settings WHERE name IN ('lock_timeout', "
                              "'extra_float_digits', 'DateStyle', "
                              + ", ".join(f"'{n}'" for n in _LIFTED_TIMEOUTS) + ")", [f"{ms}ms", f"{self._idle_ms()}ms"])
                    if write:
                        with interruptible():  # the one wait: Ctrl-C cancels it (then the connection is closed)
                            c.execute("LOCK TABLE ledger_entries, ledger_totals IN EXCLUSIVE MODE")
                        # a charge is acknowledged only once its WAL record is flushed (and, with synchronous
                        # standbys, flushed there too): a server, database or role set to 'off' or 'local'
                        # would let a crash or fail-over take back a charge whose query has read private rows.
                        # (After the lock: before it, a query would take the snapshot at a stricter isolation.)
                        c.execute("SELECT set_config('synchronous_commit', 'on', true) "
                                  "WHERE current_setting('synchronous_commit') IN ('off', 'local')")
                    found = self._check_ledger(c, unchanged)
                except LedgerError as e:  # not a dpsql ledger's schema, another ledger than this object's
                    failure = e
                except psycopg.errors.LockNotAvailable:
                    failure = LedgerBusyError(f"ledger {self.path} is busy: another dpsql operation (in this or another process) held it for more than "
                                          f"{wait:g} s; {unchanged}",
                                          hint="retry, or pass a larger lock_timeout")
                except psycopg.errors.UndefinedTable:
                    failure = LedgerError(f"the database {self.path} is not a dpsql budget ledger (a table is missing)",
                                          hint="create it with create=True or `dpsql init --ledger URL`")
                except psycopg.errors.ReadOnlySqlTransaction:
                    failure = _read_only_failure(self.path, unchanged)
                except psycopg.errors.InsufficientPrivilege:
                    failure = _privilege_failure(self.path, unchanged, write)
                except layout as e:
                    failure = _layout_failure(self.path, unchanged, e)
                except psycopg.errors.QueryCanceled:
                    # the statement_timeout of the server, database or role, which the first statements run
                    # under (the second lifts it): nothing has been written, so a release (its answer is paid
                    # for) tries again until its wait runs out
                    cancelled = reconnect and time.monotonic() < deadline
                    failure = _cancelled_failure(self.path, unchanged)
                except psycopg.Error as e:
                    # a kept connection that the server ended while it was idle (a terminated backend, a
                    # restart, a pooler or firewall that drops idle connections) shows it here: nothing
                    # has been written in this transaction, so it is started again on a new connection
                    dropped = reused and not retried and con.closed
                    failure = _lost_if(
                        con.closed, f"ledger {self.path}: PostgreSQL failed ({type(e).__name__}); {unchanged}",
                        hint="check the server and the user's rights")
                if dropped:
                    retried = True
                    self._pool.discard_idle()  # kept from before the drop: likely dropped too
                    continue
                if cancelled:
                    _rollback(con)
                    reusable = True  # kept only if the rollback left it outside any transaction
                    time.sleep(0.01)
                    continue
                if failure is not None:
                    _rollback(con)
                    reusable = True  # kept only if the rollback left it outside any transaction
                    raise failure
                drawn: str | None = None  # the identity this write gives a ledger written before identities
                try:
                    yield c, t
                    if write and t.wrote:
                        c.execute("UPDATE ledger_meta SET value = CAST(CAST(value AS BIGINT) + 1 AS VARCHAR) "
                                  "WHERE key = 'generation'")
                        if found[0] is None:  # under the ledger's lock: one writer draws it
                            drawn = _new_ledger_id()
                            c.execute("INSERT INTO ledger_meta VALUES ('ledger_id', ?)", [drawn])
                    interruption_point()  # Ctrl-C so far: nothing is changed (after the COMMIT: the change stands)
                except BaseException as e:
                    _rollback(con)
                    reusable = isinstance(e, Exception)  # not after an interrupt: closed
                    if isinstance(e, psycopg.errors.ReadOnlySqlTransaction):
                        raise _read_only_failure(self.path, unchanged) from None
                    if isinstance(e, psycopg.errors.InsufficientPrivilege):
                        raise _privilege_failure(self.path, unchanged, write) from None
                    if isinstance(e, layout):
                        raise _layout_failure(self.path, unchanged, e) from None
                    if isinstance(e, psycopg.errors.QueryCanceled):
                        raise _cancelled_failure(self.path, unchanged) from None
                    if isinstance(e, psycopg.errors.UntranslatableCharacter | psycopg.errors.CharacterNotInRepertoire):
                        raise LedgerError(f"ledger {self.path}: the database's encoding cannot store a character of the "
                                          f"query's text or of a table's name; {unchanged}",
                                          hint="keep the ledger in a UTF8 database (CREATE DATABASE ... ENCODING 'UTF8'), "
                                               "or leave the character out") from None
                    if isinstance(e, psycopg.Error):
                        # (a connection the server dropped: the server rolled the transaction back)
                        raise _lost_if(
                            con.closed, f"ledger {self.path}: PostgreSQL failed ({type(e).__name__}); {unchanged}",
                            hint="check the server and the user's rights") from None
                    raise
                try:
                    con.commit()
                except psycopg.Error as e:
                    lost = _lost_if(
                        con.closed, f"ledger {self.path}: PostgreSQL could not commit ({type(e).__name__}); the change was not "
                        f"acknowledged: {unchanged}, unless it reached the server before the error (then it counts)",
                        hint="dpsql reads no private row after this error",
                    )
                    lost.unacknowledged = True  # it may stand: a charge's failure exits as one after the charge
                    raise lost from None
                change_stands()  # Ctrl-C held back from here on says the change stands (a release: its answer is kept)
                self._noted(t)
                if drawn is not None:  # committed: this ledger's identity from now on
                    self._pin = (drawn, found[1], found[2])
                reusable = True
                return
            finally:
                self._pool.release(slot, reusable)

    def _record_release(self, entry_id: int, update: dict[str, Any], synopsis_key: str | None, synopsis: str | None,
                        stands: str, *, wait: float, again: bool) -> None:
        """Recording a release (its query has read private rows, its charge stands) whose connection the server
        dropped after its transaction began (a restart, a fail-over, a terminated backend: mid-statement, between
        two, or at COMMIT) starts again on a new connection until ``wait`` runs out, so the paid answer is not
        thrown away. The server rolled the cut transaction back, or, if its COMMIT got there, committed it: the
        next attempt takes the ledger's lock (so that transaction has ended), and an entry it finds released with
        exactly this release's parameters and synopsis is that COMMIT, recorded once (``again``). A charge is never
        started again this way (reserve: its failure says what stands)."""
        self._again(lambda wait, again: super(PostgresLedger, self)._record_release(
            entry_id, update, synopsis_key, synopsis, stands, wait=wait, again=again), entry_id, "released", wait)

    def _record_failure(self, entry_id: int, reason: str, stands: str, *, wait: float | None, again: bool) -> None:
        """Recording a failure (:meth:`fail`), as a release is recorded: within ``release_wait``, started again on a
        new connection when the server drops the one of its transaction; an entry found failed with this reason is
        the COMMIT of a cut attempt that reached the server, and nothing more is written. (Left 'reserved' the entry
        counts the same; its recorded state would not say that its query failed.)"""
        self._again(lambda wait, again: super(PostgresLedger, self)._record_failure(
            entry_id, reason, stands, wait=wait, again=again), entry_id, "failed", self.release_wait())

    def _again(self, attempt: Callable[[float, bool], None], entry_id: int, status: str, wait: float) -> None:
        """Run ``attempt(wait, again)`` (the transaction that marks entry ``entry_id`` ``status``) until it succeeds,
        starting it again on a new connection while the server drops the connection of its transaction and
        ``wait`` is not over. A failure once an attempt was cut short is one LedgerError that says what is known."""
        deadline = time.monotonic() + wait
        again = False
        while True:
            try:
                attempt(max(deadline - time.monotonic(), 0.0), again)
                return
            except LedgerError as e:
                left = deadline - time.monotonic()
                if _connection_lost(e) and left > 0:
                    again = True
                    time.sleep(min(left, 0.05))
                    continue
                if not (again or _connection_lost(e)):
                    raise
            raise self._unrecorded(entry_id, status, wait)

    def _unrecorded(self, entry_id: int, status: str, wait: float) -> LedgerError:
        what = "release" if status == "released" else "failure"
        paid = (" The answer was charged but is not returned." if status == "released" else "")
        return LedgerError(
            f"ledger {self.path}: the connection to PostgreSQL was lost while the {what} of entry {entry_id} was being "
            f"recorded, and it could not be recorded on a new connection within {wait:g} s.{paid} Entry {entry_id} "
            f"stays 'reserved' (or reads '{status}', if the COMMIT of an attempt cut short reached the server); its "
            "charge stands and counts against the budget either way",
            hint="check that the PostgreSQL server is up and reachable (a restart or fail-over that lasts longer); "
                 "the entry's state shows in Session.history() or `dpsql budget --history`"
                 + ("; asking the query again charges again" if status == "released" else ""),
        )

    def _idle_ms(self) -> int:
        """The longest pause between two statements of a ledger transaction before the server ends it
        (rolling it back: a reserve then charged nothing): 10 s, or twice ``lock_timeout``. A live
        transaction pauses for milliseconds; a frozen holder of the lock then blocks the others for a while
        only (a server's own, lower value is not kept: it dropped live connections mid-charge)."""
        return _pg_ms(2 * self.lock_timeout, 10_000)

    def _check_ledger(self, con: Any, unchanged: str) -> tuple[str | None, str, str]:
        """Check that the search_path leads to one dpsql ledger of this version, and to the one this object used
        first; returns the ledger's (identity, ledger_entries OID, schema)."""
        rows = dict(con.execute(_META_AND_PLACES).fetchall())
        places = (rows.pop(_PLACES, None) or "").split(",")
        table = str(rows.pop(_TABLE, ""))
        secured = rows.pop(_ROW_SECURITY, None)
        views = rows.pop(_NOT_TABLES, None)
        if views:
            # a view of a ledger table's name (over the real table, with a WHERE) reads only some of the charges, as
            # a row security policy does, and passes dpsql's INSERT and UPDATE on to the table under it
            raise LedgerError(
                f"ledger {self.path}: {views.replace(',', ', ')} is not a table (a view or another kind of relation), so "
                f"the charges and totals read through it may be only some of the ledger's; {unchanged}",
                hint="the ledger's tables are those dpsql created (`dpsql init`); drop the view and give the table its "
                     "name back",
            )
        if secured:
            # a role that row-level security policies restrict (any but the tables' owner, unless FORCE'd) reads
            # only the rows they let through: a charge it cannot see is left out of the spent budget, a newer total
            # it cannot see leaves an older one in force, so it would charge budget that is spent
            raise LedgerError(
                f"ledger {self.path}: row-level security is enabled on the ledger's table(s) {secured.replace(',', ', ')}, "
                f"so the charges and totals a role reads may be only some of them; {unchanged}",
                hint="every role that uses the ledger must read all of its rows: ALTER TABLE ... DISABLE ROW LEVEL "
                     "SECURITY on the ledger's tables (grant or revoke the role's rights on whole tables instead)",
            )
        if len(places) != len(_REQUIRED_TABLES) or len(set(places)) != 1:
            # a schema earlier in the search_path that holds a table of the ledger's name (e.g. one named
            # after the ledger's user, found first by the default "$user", public) stands in for the
            # ledger's own: an empty ledger_entries there gave the spent budget back
            raise LedgerError(
                f"ledger {self.path}: the ledger's tables are found in more than one schema of the connection's "
                f"search_path ({', '.join(sorted(set(places)))}); another schema's table could stand in for the "
                "ledger's, so nothing is read or charged",
                hint="name the ledger's schema in the URL (?options=-csearch_path%3D<schema>) and drop the other "
                     "schema's tables of these names",
            )
        if "schema_version" not in rows:
            raise self._corrupt("ledger_meta has no schema_version")
        try:
            found = int(rows["schema_version"])
        except ValueError:
            raise self._corrupt(f"schema_version is {rows['schema_version']!r}") from None
        from dpsql.ledger._store import SCHEMA_VERSION

        if found != SCHEMA_VERSION:
            raise LedgerError(
                f"ledger {self.path} has schema version {found}, but this dpsql reads schema version {SCHEMA_VERSION}",
                hint=("upgrade dpsql" if found > SCHEMA_VERSION else
                      f"open it with the older dpsql release that wrote schema version {found}")
                + "; dpsql never rewrites a ledger silently",
            )
        ledger_id = rows.get("ledger_id")
        if ledger_id is not None and not _LEDGER_ID_RE.fullmatch(ledger_id):
            raise self._corrupt(f"ledger_id is {ledger_id[:40]!r}")
        seen = (ledger_id, table, places[0])
        pin = self._pin
        # the identity, once the ledger has one; before (a ledger written before identities, which gets one at its
        # next write), its ledger_entries table: a search_path changed meanwhile (ALTER ROLE / DATABASE ... SET
        # search_path and a new connection, a pooler's other server session, a URL's options) leads to another
        # ledger, whose entry ids name other charges: a release recorded there would land on another's entry
        if pin is not None and (ledger_id != pin[0] if pin[0] is not None else table != pin[1]):
            raise LedgerError(
                f"ledger {self.path}: the connection's search_path now leads to another ledger (schema {places[0]}, "
                f"{_named(ledger_id)}) than the one this ledger object used before (schema {pin[2]}, {_named(pin[0])}): "
                f"its entries are other charges than those recorded before; {unchanged}",
                hint=f"name the ledger's schema in the URL (?options=-csearch_path%3D{pin[2]}) or restore the user's, "
                     "role's or database's search_path; to use the other ledger, open it anew (Ledger.open(url), a new "
                     "Session)",
            )
        if pin is None or pin[0] is None:
            self._pin = seen
        return seen

    def close(self) -> None:
        """Close the ledger's connections (one in use by another thread closes when its operation ends)."""
        self._closed = True
        self._pool.close()


_PLACES = "__places"
_TABLE = "__table"
_ROW_SECURITY = "__row_security"
_NOT_TABLES = "__not_tables"
#: ledger_meta's version, generation and identity, the OID of the ledger_entries table the search_path leads to,
#: and, in one round trip, the schema of every table of the ledger's names that the connection's search_path can
#: see (pg_temp included): one schema, each once
_META_AND_PLACES = (
    "SELECT key, value FROM ledger_meta WHERE key IN ('schema_version', 'generation', 'ledger_id') UNION ALL "
    f"SELECT '{_TABLE}', CAST(CAST(to_regclass('ledger_entries') AS oid) AS VARCHAR) UNION ALL "
    # one scan of the catalog for the tables of the ledger's names the search_path can see: their schemas; those
    # under row-level security (a role its policies restrict reads only some of the charges: relrowsecurity is read
    # as of the statement's snapshot, which in a read, one snapshot taken by its first statement, can predate row
    # security turned on since, while the rows read next are filtered by the catalog's newest state, which
    # row_security_active asks for this role); and those that are no table (a view of the name filters the rows read
    # and passes dpsql's writes on). The last branch reads no row but locks the ledger's tables (as reading
    # ledger_meta locks it), so row security cannot be turned on before the transaction ends (a write has locked
    # ledger_entries and ledger_totals already)
    "SELECT k, v FROM (SELECT string_agg(n.nspname, ',' ORDER BY n.nspname) AS places, "
    "string_agg(c.relname, ',' ORDER BY c.relname) FILTER (WHERE c.relrowsecurity OR "
    "pg_catalog.row_security_active(c.oid)) AS secured, "
    "string_agg(c.relname, ',' ORDER BY c.relname) FILTER (WHERE c.relkind NOT IN ('r', 'p')) AS views "
    "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relname IN ("
    + ", ".join(f"'{t}'" for t in _REQUIRED_TABLES) + ") AND n.nspname = ANY (pg_catalog.current_schemas(true))) AS s "
    f"CROSS JOIN LATERAL (VALUES ('{_PLACES}', s.places), ('{_ROW_SECURITY}', s.secured), ('{_NOT_TABLES}', s.views)) "
    "AS x(k, v) UNION ALL "
    "SELECT NULL, NULL FROM ledger_entries, ledger_totals WHERE false"
)


#: what a failed connection's message says, in dpsql's words (psycopg's text is never quoted: it can hold the password)
_CONNECT_REASONS = (
    (("Connection refused",), "the server refused the connection: it is not running, or not listening at this host and port"),
    (("database \"", "does not exist"), "the database does not exist"),
    (("role \"", "does not exist"), "the user does not exist on the server"),
    (("authentication failed",), "the server refused the user's authentication (password, pg_hba.conf)"),
    (("no password supplied",), "the server asks for a password and the URL gives none"),
    (("failed to resolve host",), "the host name does not resolve"),
    (("could not translate host name",), "the host name does not resolve"),
    (("timeout expired",), "no answer from the server in time (retry later)"),
    (("too many clients",), "the server has no free connection (retry later)"),
    (("remaining connection slots",), "the server has no free connection (retry later)"),
    (("starting up",), "the server is starting up (retry later)"),
    (("shutting down",), "the server is shutting down (retry later)"),
    (("in recovery mode",), "the server is recovering (retry later)"),
    (("invalid response to SSL negotiation",), "what answers at this host and port is not a PostgreSQL server"),
    (("SSL",), "the server and the URL disagree on SSL (sslmode)"),
    (("invalid",), "the URL holds an invalid parameter"),
)


def _connect_reason(text: str) -> str:
    """Why a connection failed, from psycopg's message, in fixed words (empty when it says nothing known)."""
    return next((why for needles, why in _CONNECT_REASONS if all(n in text for n in needles)), "")


def _named(ledger_id: str | None) -> str:
    return f"ledger {ledger_id}" if ledger_id is not None else "a ledger without an identity yet"


def _lost_if(lost: bool, message: str, *, hint: str) -> LedgerError:
    """A LedgerError, marked (``_connection_lost``) when the server dropped the connection of the ledger transaction
    (a terminated backend, a restart, a fail-over) after it began: the server rolled the transaction back, or, at
    COMMIT, may have committed it. The mark is for the retries of a release or a failure (users see a LedgerError)."""
    e = LedgerError(message, hint=hint)
    e._connection_lost = lost  # type: ignore[attr-defined]
    return e


def _connection_lost(e: LedgerError) -> bool:
    return bool(getattr(e, "_connection_lost", False))


def _rollback(con: Any) -> None:
    """Roll back, whatever the connection's state: a connection the server has dropped (its backend
    terminated, a restart, a fail-over) raises on ROLLBACK, and that error would replace the
    LedgerError being raised. The server rolls back the transaction of a connection it dropped."""
    try:
        con.rollback()
    except Exception:  # noqa: BLE001 - the connection is closed right after
        pass


#: time-outs of the server, database or role that would cut a ledger transaction short. Each is
#: lifted for the transaction (those the server has): its only wait is for the ledger's lock,
#: bounded by ``lock_timeout``, and a ``statement_timeout`` below that wait turned a busy ledger
#: into a failure; an idle-in-transaction time-out below the driver's pause between two statements
#: dropped the connection mid-charge (a charge's transaction sets that one to ``_idle_ms`` instead).
_LIFTED_TIMEOUTS = ("statement_timeout", "idle_in_transaction_session_timeout", "transaction_timeout")


def _read_only_failure(path: str | None, unchanged: str) -> LedgerError:
    return LedgerError(
        f"ledger {path}: the PostgreSQL transaction is read-only (the server is a standby in recovery, or the "
        f"server, database or role sets default_transaction_read_only = on); {unchanged}",
        hint="point the URL at the primary server, or let the ledger's user write: ALTER ROLE <user> SET "
             "default_transaction_read_only = off (or ALTER DATABASE <db> ...)",
    )


def _cancelled_failure(path: str | None, unchanged: str) -> LedgerError:
    return LedgerError(
        f"ledger {path}: the server cancelled a statement of the ledger's transaction (QueryCanceled: the "
        "statement_timeout of the server, database or role, which the first statements of a transaction run under "
        f"before dpsql lifts it, or pg_cancel_backend); {unchanged}",
        hint="give the ledger's user a statement_timeout of at least a second, or none (ALTER ROLE <user> SET "
             "statement_timeout = '5s')",
    )


def _layout_failure(path: str | None, unchanged: str, e: Any) -> LedgerError:
    """The ledger's tables exist but not as dpsql's schema has them (a column missing or of another type: a
    hand-made or foreign table of the same name). The server's primary message names objects only."""
    return LedgerError(
        f"ledger {path}: its tables do not have the layout of dpsql's ledger ({type(e).__name__}: "
        f"{e.diag.message_primary}); {unchanged}",
        hint="point the URL at a ledger that dpsql created (schema_postgres.sql), e.g. in a schema of its own "
             "(?options=-csearch_path%3D<schema>); dpsql never repairs or alters a ledger",
    )


def _privilege_failure(path: str | None, unchanged: str, write: bool) -> LedgerError:
    need = "SELECT, INSERT, UPDATE" if write else "SELECT"
    return LedgerError(
        f"ledger {path}: the PostgreSQL user may not {'write' if write else 'read'} the ledger's tables; {unchanged}",
        hint=f"as the ledger's owner: GRANT {need} ON ledger_meta, ledger_totals, ledger_entries TO <user> (and USAGE "
             "on their schema)",
    )


def _statements(script: str) -> list[str]:
    """The statements of a DDL script (comments dropped; no ``;`` inside strings in it)."""
    body = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in re.split(r";\s*(?:\n|$)", body) if s.strip()]
