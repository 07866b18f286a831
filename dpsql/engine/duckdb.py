"""The DuckDB execution backend: the only place SQL meets DuckDB (with the ledger's own store).

Executes SQL rendered by ``dpsql.rewrite.render`` from dpsql's own ASTs and returns Arrow.
Implements :class:`dpsql.engine.base.ExecutionBackend`; its building blocks of bounded queries
are :class:`dpsql.engine.duckdb_ops.DuckDBOps`, and how each kind of source is read totally is
in ``dpsql.engine._duckdb_sources``.

Privacy claims of this module (threat model: docs/threat_model.md):

* **No private text in errors.** Every DuckDB failure becomes a dpsql error whose message is a
  constant (plus public names: what was being run, the owner's limits). DuckDB's own message
  can quote cells, so it is attached (as ``debug_detail``) only when the data owner turned on
  the debug mode (``EngineSettings.debug``, documented as unsafe), and even then scrubbed of
  quoted literals and numbers (:func:`scrub`). Errors are raised outside the ``except`` block,
  so no DuckDB exception rides along as ``__context__``.
* **One generic error after the charge.** A failure while reading private data
  (:meth:`DuckDBBackend.fetch_arrow`: a time-out, out-of-memory, a full temp directory,
  anything else) is the same ``ExecutionError`` with the same text: its class and message do
  not depend on which failure happened, hence not on the data.
* **Data-independent limits.** The owner's memory limit, thread limit and temp-directory cap
  are DuckDB settings applied to every private read; the statement time-out is a timer thread
  calling ``connection.interrupt()`` after a fixed number of seconds (DuckDB has no statement
  time-out of its own). A caller-provided connection gets the settings for the duration of
  each private read and its own values back afterwards (these settings are database-wide in
  DuckDB: a query the caller runs concurrently on the same database shares them meanwhile).
* **Sources are read totally.** A source value that cannot be read is NULL, never an error
  (an error would reveal, after the charge, whether that row exists); see
  ``dpsql.engine._duckdb_sources`` for each kind of source (Parquet, Arrow, CSV, DuckDB tables)
  and the owner's ``max_text_bytes`` cap. CSV: the dialect is fixed (``,`` or tab for .tsv,
  header line), never sniffed from the data; every column is VARCHAR unless the owner declares
  its type, which the view applies with ``TRY_CAST`` (dates and timestamps range-checked). A row
  that does not parse (bad quoting, invalid UTF-8, wrong field count, over-long line) is
  skipped. Column names come from the header line only, so the schema does not depend on any
  data row.
"""

from __future__ import annotations

import functools
import math
import os
import re
import secrets
import shutil
import string
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
from sqlglot import exp

from dpsql import _inherited as inherited
from dpsql.engine import _duckdb_csv as csvcopy
from dpsql.engine import _duckdb_native as native
from dpsql.engine._arrow_post import projection
from dpsql.engine._duckdb_sources import (
    _CSV_TYPES,
    _arrow_plan,
    _cap,
    _csv_header,
    _csv_unquote,
    _distinct_names,
    _duck_plan,
    _expand,
    _literal_files,
    _parquet_unsafe,
    _same_file_types,
    _temp_view,
    _temporal_in_range,
    decimal_storage_reason,
    has_glob_chars,
    parquet_decimal_leaves,
    parquet_format,
    parquet_schema,
    reading_scans,
    view_computations,
)
from dpsql.engine.base import (
    EngineSettings,
    SqlOps,
    private_failure,
    read_salted_text,
    scrub,
    size_bytes,
    source_name,
    text_read_memory,
    view_column,
    with_read_salt,
)
from dpsql.engine.duckdb_ops import DUCKDB, KEEP_BUILD_SIDE, SPILLING_WINDOW, DuckDBOps, SaltedDuckDBOps
from dpsql.errors import (
    ConfigError,
    ExecutionError,
    InputUnavailableError,
    QueryTypeError,
    interrupted_by_signal,
)
from dpsql.rewrite.render import render

__all__ = ["DuckDBBackend", "DuckDBOps", "Engine", "scrub"]


class _Inherited:
    """Stands in for an engine's lock in a process forked from the one that opened the engine. DuckDB's
    state does not survive fork: its worker threads (and any thread of the parent inside a statement,
    holding the engine's lock or DuckDB's own) exist only in the parent, so a statement in the child
    could wait for ever for a task or lock that no thread will ever finish or release (seen: a fork
    pool's worker, after its parent had run queries, waiting inside DuckDB's executor). Every use in
    the child refuses instead, before any charge; closing the Session there leaves the parent's
    connection alone. (Whether a process was forked is public: it depends on no private value.)"""

    def __init__(self, pid: int, what: str = "DuckDB") -> None:
        self.pid, self.what = pid, what

    def __enter__(self) -> None:
        raise inherited_refusal(self.pid, self.what)

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ always raises
        return None


def inherited_refusal(pid: int, what: str) -> ExecutionError:
    """The refusal of an engine used in a process forked from the one that opened it (``what``: its kind, "DuckDB",
    "DuckDB connection" for a caller's connection, or "Spark")."""
    state = {"DuckDB": "DuckDB's state (its connection and worker threads) does not survive fork, so a query here "
                       "could wait for ever",
             "DuckDB connection": "DuckDB's state (the connection given to it, and DuckDB's worker threads) does not "
                                  "survive fork, so a query here could wait for ever",
             "Spark": "its connection to Spark's JVM (py4j's sockets) is the parent's, so a call here would be mixed "
                      "up with the parent's"}[what]
    return ExecutionError(
        f"this Session was opened in process {pid} and is used in a process forked from it (multiprocessing's "
        f"'fork' start method, os.fork): {state}; nothing was charged",
        hint="create a new Session in the child process "
        + ("on a DuckDB connection opened there (the parent's connection shares the parent's DuckDB state) "
           if what == "DuckDB connection" else "")
        + "(with a pool: open it in the pool's initializer, once per worker), or start the workers with the 'spawn' "
        "or 'forkserver' start method; the ledger file is shared by every process",
    )


_ENGINES: weakref.WeakSet[DuckDBBackend] = weakref.WeakSet()
#: the lock of each caller's connection, shared by every engine (Session) on it: a DuckDB connection runs one call
#: at a time (a call from another thread meanwhile is refused, ``ResourceInUseException``, or a ``fetchall`` takes
#: the other call's result) and the private reads change its settings and give them back (``_limited``)
_CONNECTION_LOCKS: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, Any] = weakref.WeakKeyDictionary()
_CONNECTION_LOCKS_MUTEX = threading.Lock()


#: DuckDB's refusal of a call on a connection that runs another thread's call (at once, before doing anything)
_BUSY: Any = getattr(duckdb, "ResourceInUseException", ())
#: how long one call of the engine on a caller's connection waits for such a call to end
_BUSY_WAIT = 10.0
#: the types whose values ``max_text_bytes`` caps (each one inside a STRUCT, a LIST or a MAP counted as a column)
_TEXT_TYPES = re.compile(r"\b(?:VARCHAR|BLOB|JSON|BIT|GEOMETRY)\b")
#: the connection's memory_limit in bytes (NULL where DuckDB shows it in a form it does not parse back)
_LIMIT_BYTES = "SELECT TRY(parse_formatted_bytes(current_setting('memory_limit')))::BIGINT"
#: a value a statement did not read (``DuckDBBackend._settings_known``)
_UNREAD = object()
#: a setting DuckDB shows from another's value (a 15th of memory_limit, unless set), more finely (``_restore``)
_FOLLOWER = ("memory_limit", "write_buffer_row_group_memory_limit")
#: settings a connection may hold for its session over the global value (SET SESSION), which a plain SET (global) leaves
#: in force: pinned, reset and given back for the session
_SESSION = frozenset({"default_order", "default_null_order"})


def _scope(name: str) -> str:
    return "SESSION " if name in _SESSION else ""


def _busy_refusal() -> ConfigError:
    return ConfigError(
        f"the DuckDB connection was busy with calls from another thread of this program, or held a result of "
        f"execute() not fetched to its end, for more than {_BUSY_WAIT:g} s; nothing was charged",
        hint="a DuckDB connection runs one call at a time and refuses other work while a result of execute() is not "
        "fetched to its end: fetch it (fetchall()) or run it on a connection of its own (con.cursor()), in the "
        "program's other threads use a connection of their own while dpsql queries it, or let dpsql open its own "
        "connection")


class _Patient:
    """A caller's connection (and its relations) as the engine calls it. The caller's program may call the connection
    from another thread while a request runs: DuckDB then refuses the engine's call at once, before it does anything
    (``ResourceInUseException``), which failed the request (after its charge, where it was the read). Such a call is
    made again once the other has ended, for up to :data:`_BUSY_WAIT` seconds. (Calls of dpsql's own Sessions on
    the connection take turns: :func:`_connection_lock`.) After the charge (``wait``: :meth:`DuckDBBackend._patient`)
    they wait up to the statement time-out instead."""

    def __init__(self, target: Any, wait: list[float | None] | None = None) -> None:
        self._target = target
        self.wait: list[float | None] = [None] if wait is None else wait  # shared with its relations

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr) or name == "interrupt":
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            pause, until = 0.0005, time.monotonic() + (_BUSY_WAIT if self.wait[0] is None else self.wait[0])
            while True:
                try:
                    out = attr(*args, **kwargs)
                except RuntimeError as e:  # Ctrl-C during the call (DuckDB's client says so): a KeyboardInterrupt
                    if interrupted_by_signal(e):
                        raise KeyboardInterrupt from None
                    raise
                except _BUSY:
                    if time.monotonic() >= until:
                        raise
                    time.sleep(pause)
                    pause = min(2 * pause, 0.02)
                    continue
                if isinstance(out, (duckdb.DuckDBPyConnection, duckdb.DuckDBPyRelation)):
                    return _Patient(out, self.wait)
                return out

        return call


def _connection_lock(con: duckdb.DuckDBPyConnection) -> Any:
    with _CONNECTION_LOCKS_MUTEX:
        return _CONNECTION_LOCKS.setdefault(con, threading.RLock())


def _engines_after_fork() -> None:
    # In the child only the forking thread exists, and DuckDB's state is the parent's: every engine
    # inherited refuses use (_Inherited); a caller's connection's lock is new (a new Session on the
    # connection, which is the caller's to use or not, gets one that no thread of the parent holds).
    global _CONNECTION_LOCKS_MUTEX
    _CONNECTION_LOCKS_MUTEX = threading.Lock()
    for con in list(_CONNECTION_LOCKS.keys()):
        _CONNECTION_LOCKS[con] = threading.RLock()
    for engine in list(_ENGINES):
        engine._lock = _Inherited(engine._pid, "DuckDB" if engine._owned else "DuckDB connection")
        inherited.keep(engine)  # its connection (DuckDB's instance) destroyed here would hang or crash the child
        # the copies of CSV files belong to the parent (which removes them when it closes)
        engine._csv_dir = None
        gone = getattr(engine, "_csv_gone", None)
        if gone is not None:
            gone.detach()  # the parent's (its pid-bound handler would not run here anyway)
            engine._csv_gone = None


os.register_at_fork(after_in_child=_engines_after_fork)


#: DuckDB optimizers that plan with the statistics of the rows read (a Parquet row group's or file's
#: min and max, a table's zone maps), off for every private read: with them a filter ``x > 5000`` was
#: pushed into the scan, which skipped each row group whose max is at most 5000 (or folded to an empty
#: result when the file's is), so one person's ``x = 10^9`` switched a query from reading nothing to
#: reading that person's row group: 25 ms against 145 ms of CPU on 500 000 rows with a 2 kB text
#: column, whatever epsilon (``tests/test_adversary_scan_statistics.py``). Off, every filter stays
#: where the bounded query puts it and is evaluated on every row, and no plan reads a statistic.
#: ``build_side_probe_side`` swapped a hash join's sides when the estimated row counts of its inputs
#: (a Parquet footer's, a table's) crossed: with 400 customers and 399 orders, one person adding one of
#: each swapped them. Off, each hash join builds on its right side as the bounded query writes it.
#: ``join_order`` ordered a chain of three or more joins by the same estimates: with 400 customers, 399
#: orders and 399 line items, one person adding one of each regrouped (items JOIN orders) JOIN customers
#: into items JOIN (orders JOIN customers). Off, the joins run in the order the bounded query writes them,
#: which the join SQL decides from the catalog alone (``dpsql.plan.joins.join_sequence``). ``filter_pullup``
#: reads no statistic but goes with it: it turns every inner join below another join into a cross product
#: under a filter (for ``filter_pushdown`` and ``join_order`` to push back down); with both off, that
#: cross product would stay, so each inner join keeps its written ON conditions instead.
STATISTICS_OPTIMIZERS = ("filter_pushdown", "join_filter_pushdown", "statistics_propagation", "row_group_pruner",
                         "build_side_probe_side", "join_order", "filter_pullup")


@dataclass(frozen=True)
class SaltedRead:
    """A bounded query's text under one query's secret salt, with what its tree told about it (the
    optimizers its marks turn off, the columns it may read): :meth:`PreparedRead.salted`."""

    sql: str
    off: tuple[str, ...]
    reads: native.Reads


@dataclass(frozen=True)
class PreparedRead:
    """A bounded query rendered once under a stand-in salt (:meth:`DuckDBBackend.prepare_bounded`),
    so a repeated query is not built, walked and rendered again: each query gets the text with its
    own fresh salt in place of the stand-in. Made only where that text is, by a check at preparation,
    exactly the text the query's tree built under that salt renders to."""

    text: str
    stand_in: str
    off: tuple[str, ...]
    reads: native.Reads

    def salted(self, salt: str) -> SaltedRead | None:
        """The text under ``salt``; None for a salt unlike the stand-in (another length or alphabet than
        lower-case hex), which the check at preparation did not cover: building may read more of it than its
        text (the portable keyed hash reads its length)."""
        if len(salt) != len(self.stand_in) or salt.strip(string.hexdigits.lower()):
            return None
        return SaltedRead(self.text.replace(self.stand_in, salt), self.off, self.reads)


class DuckDBBackend:
    """The DuckDB execution backend (:class:`dpsql.engine.base.ExecutionBackend`).

    One DuckDB connection (the caller's, or its own in-memory database), used under one lock:
    every statement dpsql runs on it goes through this class. ``ops`` are the DuckDB spelling of
    the bounded queries' building blocks (:class:`dpsql.engine.duckdb_ops.DuckDBOps`).

    Only a connection the engine opened itself draws the row choices of an aggregation (k = 1,
    and the row caps k > 1 and L) from DuckDB's ``RANDOM()`` (``DuckDBOps.row_clock``): its
    generator is seeded from OS entropy and nobody else reaches it. A caller's connection may have been seeded (``SELECT setseed(...)``), which
    makes ``RANDOM()`` a fixed sequence: each row's draw would then be fixed by its scan position,
    so the row one person keeps would depend on the rows of the people before it. There every
    choice is made from the per-query secret salt instead (:class:`SaltedDuckDBOps`).
    """

    dialect = DUCKDB
    ops: SqlOps = DuckDBOps()

    def __init__(self, connection: duckdb.DuckDBPyConnection | None = None,
                 settings: EngineSettings | None = None) -> None:
        self.settings = settings or EngineSettings()
        if self.settings.temp_directory is not None:
            _check_spill_dir(self.settings.temp_directory)
        if self.settings.keyed_hash == "portable":
            from dpsql.engine.portable import PortableDuckDBOps

            self.ops = PortableDuckDBOps()
        elif connection is not None:
            self.ops = SaltedDuckDBOps()  # the caller's generator may be seeded: choices from the salt
        self._owned = connection is None
        self._con: Any = duckdb.connect(":memory:") if connection is None else _Patient(connection)
        self._lock: Any = threading.RLock() if connection is None else _connection_lock(connection)
        self._pid = os.getpid()  # the process that opened the engine: in any other (a forked child) it refuses use
        _ENGINES.add(self)
        self._views: set[tuple[str, str]] = set()
        #: view -> (table name, source as given, how DuckDB resolved its name at registration) of a caller's DuckDB
        #: table named without its database and schema (:meth:`_resolution`)
        self._resolved: dict[str, tuple[str, str, tuple[Any, ...]]] = {}
        self._native: dict[str, native.NativeSource] = {}  # Parquet sources DuckDB's reader may read
        self._texts: dict[str, list[tuple[str, int]]] = {}  # view -> (column, its text values) (_text_columns_read)
        self._limit_bytes: int | None = None  # the memory_limit the threads were found under (_read_threads)
        self._builds = 0  # native views built: each joins a flags table of its own name
        self._csv: dict[str, csvcopy.CsvSource] = {}  # CSV sources, read from the engine's copies
        # Parquet sources read through a pyarrow dataset: the files' version and footers it was made from
        self._datasets: dict[str, _Dataset] = {}
        # CSV sources: the header line they were registered with (every file's), and the files' versions then
        self._csv_headers: dict[str, tuple[list[str], native.Version]] = {}
        self._csv_dir: str | None = None
        self._csv_gone: weakref.finalize[Any, Any] | None = None  # removes the copies if close() never comes
        self._until: float | None = None  # the statement time-out's deadline (csvcopy.now()) during a read
        self._callers: dict[tuple[str, str], str | None] = {}  # a caller's size setting, as shown: its bytes
        # the last few bounded queries bound by ``describe``: (the tree, its text, the columns it reads), which
        # ``fetch_arrow`` of the same unchanged tree runs instead of rendering it again (:meth:`_described_text`)
        self._described: dict[int, tuple[exp.Expression, str, native.Reads | None]] = {}
        self._reads_of: tuple[exp.Expression | None, native.Reads | None] = (None, None)  # check_text_columns' last
        # DuckDB's ICU (when loaded) spells a TIMESTAMPTZ in the connection's Calendar (pinned: _limits)
        with self._lock:
            known, shown = self._settings_known(("Calendar", _FOLLOWER[1]))
            self._icu, self._follower = "Calendar" in known, _FOLLOWER[1] in known
            # the threads of a private read: memory_limit must hold a vector of the longest texts per thread
            try:
                self._threads = self._read_threads(
                    self._con.sql(_LIMIT_BYTES).fetchall()[0][0] if shown is _UNREAD else shown)
            except ConfigError:
                if self._owned:
                    self._con.close()
                raise
        # DuckDB's spill files: in the owner's temp_directory, else in a directory of the engine's own inside the
        # process's (csvcopy.spill_dir: mode 0700, where DuckDB made its directory with the process's umask, 0755, its
        # files 0644, private rows readable by every user of the machine; locked while the process lives, swept after
        # a SIGKILL by the next engine that makes such a directory: DuckDB left its files behind for good)
        self._spill = self.settings.temp_directory or csvcopy.spill_dir()
        self._spill_used = False  # whether DuckDB made the engine's spill directory (it makes it once: _check_spill)
        if self._owned:  # a caller's connection keeps its own settings: private reads change them and back (_limited)
            self._con.execute("; ".join([  # one call, the statements in this order (each costs a call of its own)
                "SET enable_progress_bar = false",
                *(f"SET {name} = {_sql_str(value)}" for name, value in self._limits()),
                # results of the bounded queries have no order to keep: lets DuckDB stream and spill freely
                "SET preserve_insertion_order = false",
                # a TIMESTAMPTZ's text (a key cast to VARCHAR) in UTC, as on Spark, not in the machine's time zone
                "SET TimeZone = 'UTC'",
                # no plan of this connection reads the rows' statistics (STATISTICS_OPTIMIZERS): set once
                # here rather than around every private read (three statements a query)
                f"SET disabled_optimizers = {_sql_str(', '.join(STATISTICS_OPTIMIZERS))}"]))

    def _settings_known(self, names: tuple[str, ...]) -> tuple[set[str], Any]:
        """Which of the settings ``names`` the connection has, and the connection's ``memory_limit`` in bytes as
        :data:`_LIMIT_BYTES` reads it where the same statement read it (else :data:`_UNREAD`).
        ``duckdb_settings()`` computes every setting's value (about 6 ms a call); on the engine's own connection the
        usual case, all of them, is asked first of ``current_setting`` (a statement that fails where one is missing,
        which on a caller's connection would abort the caller's transaction), together with the memory limit, and
        ``duckdb_settings()`` answers only where it fails. Extension autoloading and autoinstalling are turned off
        first, in the same call (``_limits`` sets them so again): on a DuckDB build without ICU linked in, naming
        ICU's ``Calendar`` setting could otherwise load, or fetch, the extension."""
        if self._owned:
            try:
                row = self._con.execute(
                    "SET autoinstall_known_extensions = false; SET autoload_known_extensions = false; SELECT "
                    + ", ".join([*(f"current_setting({_sql_str(n)})" for n in names), _LIMIT_BYTES[len("SELECT "):]])
                ).fetchall()[0]
                return set(names), row[-1]
            except duckdb.Error:
                pass
        return {r[0] for r in self._con.execute(
            f"SELECT name FROM duckdb_settings() WHERE name IN ({', '.join(_sql_str(n) for n in names)})").fetchall()}, _UNREAD

    def render(self, ast: exp.Expression, *, pretty: bool = False) -> str:
        """SQL text of ``ast`` for DuckDB, rendered strictly (``dpsql.rewrite.render``)."""
        return render(ast, dialect=self.dialect, pretty=pretty)

    def _render(self, ast: exp.Expression, *, copy: bool = True) -> str:
        return render(ast, dialect=self.dialect, copy=copy)

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self._con if self._owned else self._con._target

    @property
    def debug(self) -> bool:
        return self.settings.debug

    def close(self) -> None:
        self._described.clear()  # kept texts hold their queries' secret salts: none outlives the engine's use
        self._reads_of = (None, None)
        if self._pid != os.getpid():  # a forked child's copy: the connection, its views and copies are the parent's
            return
        for view, kind in list(self._views):
            self.unregister_source("", kind, view)
        csvcopy.remove_dir(self._csv_dir)
        self._csv_dir = None
        if self._csv_gone is not None:
            self._csv_gone.detach()
            self._csv_gone = None
        if self._owned:
            self._con.close()
        if self._owned and self.settings.temp_directory is None:  # (DuckDB removed its files and, mostly, the directory)
            shutil.rmtree(self._spill, ignore_errors=True)

    def _detail(self, e: BaseException) -> str | None:
        """Only in the owner's debug mode: DuckDB's message scrubbed of literals and numbers;
        for any other exception its class alone (its text is not in a known shape to scrub)."""
        if not self.settings.debug:
            return None
        if isinstance(e, duckdb.Error):
            return f"{type(e).__name__}: {scrub(str(e))}"
        return type(e).__name__

    # -- sources --------------------------------------------------------------------------
    def register_source(self, name: str, kind: str, source: Any, view: str | None = None,
                        types: dict[str, str] | None = None) -> dict[str, str]:
        """Expose a source as a private TEMP view (``view``, default ``_dpsql_src_<name>``).

        TEMP views live only in this connection's session: nothing is left in a caller's
        database file, and each Session uses its own view names. ``types`` (CSV only) are the
        owner's declared column types. Returns the schema. Reads schemas and the CSV header
        line only, never a data row. A glob is expanded once, here: files added later are
        not read by this registration (each query warns of them: ``catalog.check_sources_unchanged``).
        """
        self.check_process()
        view = view or source_name(name)
        types = {k.lower(): v for k, v in (types or {}).items()}
        if kind in ("parquet", "csv") and isinstance(source, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", source):
            raise ConfigError(f"table '{name}': {source!r} is a URI of remote storage, which the DuckDB engine does not "
                              "read (only files of this machine)",
                              hint="use the Spark engine ([engine] kind = \"spark\"), or copy the files here and give "
                                   "their path")
        if types and kind != "csv":
            raise ConfigError(
                f"table '{name}': column types can be declared for CSV sources only ({sorted(types)})",
                hint="Parquet, Arrow and DuckDB sources carry their own column types",
            )
        failure: ConfigError | None = None
        rows: list[Any] = []
        with self._lock:
            self._views.add((view, kind))
            try:
                if kind in ("arrow", "parquet"):
                    self._register_arrow(name, kind, source, view)
                else:
                    if kind == "csv":
                        sel = self._csv_select(name, source, types)
                        files = _literal_files(name, _expand(source))
                        self._csv[view] = csvcopy.CsvSource(name, source, types, files)
                        self._csv_headers[view] = self._csv_registered(name, source, files)
                    elif kind == "duckdb":
                        sel = self._duckdb_select(name, source)
                    else:  # pragma: no cover
                        raise ConfigError(f"unknown source kind {kind!r}")
                    self._con.execute(self._render(_temp_view(view, sel)))
                if kind == "csv":  # its schema is its header and declared types: the view is bound once
                    rows = self._csv_schema(name, source, types)
                else:
                    desc = exp.Describe(this=exp.select("*").from_(exp.to_table(view, quoted=True)))
                    rows = self._con.execute(self._render(desc)).fetchall()
            except duckdb.Error as e:
                failure = ConfigError(
                    f"cannot read table source for '{name}' ({kind}): {type(e).__name__}",
                    hint="check that the file exists, is readable and is valid "
                    + ("Parquet" if kind == "parquet" else "CSV" if kind == "csv" else "data")
                    + (" (for a DuckDB table: that the Session's connection has it)" if kind == "duckdb" else ""),
                )
            except (OSError, pa.ArrowException) as e:  # an OSError: a file gone or not readable (a retry may read it)
                failure = (ConfigError if isinstance(e, pa.ArrowException) else InputUnavailableError)(
                    f"cannot read table source for '{name}' ({kind}): {type(e).__name__}",
                    hint="check that the file exists, is readable and is valid " + ("CSV" if kind == "csv" else "Parquet"))
            except ConfigError:
                self.unregister_source(name, kind, view)
                raise
        if failure is not None:
            self.unregister_source(name, kind, view)
            raise failure
        schema = {str(r[0]).lower(): str(r[1]) for r in rows}
        self._texts[view] = [(c, k) for c, t in schema.items() if (k := len(_TEXT_TYPES.findall(t.upper())))]
        if len(schema) != len(rows):
            self.unregister_source(name, kind, view)
            raise ConfigError(f"table '{name}' has column names that differ only by case; dpsql needs them distinct")
        return schema

    def _register_arrow(self, name: str, kind: str, source: Any, view: str) -> None:
        """Arrow tables and Parquet files, read totally (:func:`_arrow_plan`); for Parquet with
        ``invalid_text = "replace"``, DuckDB's own reader (:meth:`_parquet_replace_select`)."""
        import pyarrow.dataset as ds

        if kind == "parquet":
            paths = _expand(source)
            _same_file_types(name, paths)
            schema = ds.dataset(paths[0], format=parquet_format()).schema
        else:
            schema = source.schema
        _distinct_names(name, schema.names)
        if kind == "parquet" and self.settings.invalid_text == "replace":
            # DuckDB's reader reads the files as they are at each query, typed by their footers: a column
            # widened since (INTEGER now BIGINT) broke the totality the catalog's types were rendered for
            version = native.versions(paths)
            self._con.execute(self._render(_temp_view(view, self._parquet_replace_select(name, source))))
            self._datasets[view] = _Dataset(paths, [parquet_schema(p) for p in paths], None, None, version)
            return
        cap = self.settings.max_text_bytes
        plans = [(f, *_arrow_plan(f.type, f"'{name}.{f.name}'", cap, list_cap=self.settings.max_list_size,
                                  dictionary=kind == "parquet")) for f in schema]
        target = pa.schema([pa.field(f.name, read) for f, read, _ in plans])
        if kind == "parquet":
            version = native.versions(paths)
            raw: Any = ds.dataset(paths, format=parquet_format(target), schema=target)
            self._datasets[view] = _Dataset(paths, [parquet_schema(p) for p in paths], target, view + "_raw", version)
        else:
            raw = source if target.equals(schema) else source.cast(target)
            raw, plans = _validated_text(raw, plans, cap)
        raw_name = view + "_raw"
        self._con.register(raw_name, raw)
        cols = []
        for f, _, build in plans:
            ref = exp.column(f.name, quoted=True)
            cols.append(exp.alias_(build(ref) if build is not None else ref, view_column(f.name), quoted=True))
        sel = exp.select(*cols).from_(exp.to_table(raw_name, quoted=True))
        self._con.execute(self._render(_temp_view(view, sel)))
        if kind == "parquet" and native.eligible(schema) and not has_glob_chars(paths):
            # (DuckDB's reader would expand a glob character in a file name into other files)
            self._native[view] = native.NativeSource(name, view, paths, schema, sel)

    def _parquet_replace_select(self, name: str, source: str) -> exp.Select:
        """DuckDB's Parquet reader, invalid UTF-8 replaced by ``?``. The types it converts while
        reading and rejects when a value is out of range are refused here (before any row is
        read): the default ``invalid_text = "null"`` reads them totally."""
        paths = _literal_files(name, _expand(source))
        _same_file_types(name, paths)
        files = exp.Array(expressions=[exp.Literal.string(p) for p in paths])
        unsafe = self._replace_unsafe(paths)
        if unsafe is not None:
            raise ConfigError(
                f"column '{name}.{unsafe[0]}' is stored as {unsafe[1]}, which DuckDB's own Parquet reader "
                "(invalid_text = \"replace\") converts in a way that can fail on a stored value",
                hint="use the default invalid_text = \"null\" (which reads it totally), or store the column "
                     "as another type (a timestamp in microseconds, text)",
            )
        # no hive partitioning: a "user_id=7/" directory must not override the rows' own user_id
        reader = exp.func("read_parquet", files,
                          exp.EQ(this=exp.column("utf8_validation"), expression=exp.Literal.string("replace")),
                          exp.EQ(this=exp.column("hive_partitioning"), expression=exp.false()),
                          # a BLOB stays a BLOB (as registered) whatever the connection's binary_as_string
                          exp.EQ(this=exp.column("binary_as_string"), expression=exp.false()))
        return self._capped_select(name, exp.Table(this=reader))

    def _replace_unsafe(self, paths: list[str]) -> tuple[str, str] | None:
        """The first column of these Parquet files (its name and how it is stored) that DuckDB's own reader
        converts in a way that can fail on a stored value (:func:`_parquet_unsafe`), or None; footers only."""
        files = exp.Array(expressions=[exp.Literal.string(p) for p in paths])
        meta = self._con.execute(self._render(exp.select("name", "type", "converted_type", "logical_type")
                                        .from_(exp.Table(this=exp.func("parquet_schema", files))))).fetchall()
        for col, ptype, converted, logical in meta:
            stored = _parquet_unsafe(ptype, converted, logical)
            if stored is not None:
                return str(col), stored
        return None

    def _capped_select(self, name: str, rel: exp.Expression, only: list[str] | None = None) -> exp.Select:
        """Every column of a relation DuckDB reads (``only``: these), through :func:`_duck_plan` (bind only)."""
        bound = self._con.sql(self._render(exp.select("*").from_(rel.copy())))
        items = []
        for col, typ in zip(bound.columns, bound.types):
            if only is not None and str(col) not in only:
                continue
            ref = exp.column(str(col), quoted=True)
            build = _duck_plan(typ, f"'{name}.{col}'", self.settings.max_text_bytes, list_cap=self.settings.max_list_size)
            items.append(exp.alias_(build(ref) if build is not None else ref, view_column(str(col)), quoted=True))
        return exp.select(*items).from_(rel)

    def _csv_select(self, name: str, source: str, types: dict[str, str], read: list[str] | None = None) -> exp.Select:
        """The view of a CSV source: ``read`` are the files DuckDB reads (the engine's copies,
        ``dpsql.engine._duckdb_csv``); None at registration (the header and types only: no row)."""
        delim = _csv_delimiter(source)
        paths = _literal_files(name, _expand(source))
        names = _csv_header(paths[0], delim, self.settings.csv_encoding)
        low = {n.lower(): n for n in names}
        bad = sorted(set(types) - set(low))
        if bad:
            raise ConfigError(f"table '{name}': declared column(s) {bad} are not in the CSV header",
                              hint=f"its columns are: {', '.join(names)}")
        for c, t in types.items():
            if not isinstance(t, str) or not _CSV_TYPES.match(t.strip().upper()):
                raise ConfigError(
                    f"type {t!r} declared for '{name}.{c}' is not supported",
                    hint="use BOOLEAN, INTEGER, BIGINT, DOUBLE, DECIMAL(p,s), DATE, TIMESTAMP or VARCHAR",
                )
        cols = exp.Struct(expressions=[
            exp.PropertyEQ(this=exp.Literal.string(n), expression=exp.Literal.string("VARCHAR")) for n in names
        ])

        def opt(k: str, v: exp.Expression) -> exp.Expression:
            return exp.EQ(this=exp.column(k), expression=v)

        files: exp.Expression = (exp.Literal.string(paths[0]) if len(paths) == 1 and paths[0] == source and read is None
                                 else exp.Array(expressions=[exp.Literal.string(p) for p in (read or paths)]))
        reader = exp.func(
            "read_csv",
            files,
            opt("columns", cols),
            opt("header", exp.true()),
            opt("auto_detect", exp.false()),
            opt("delim", exp.Literal.string(delim)),
            # no quoting: every physical line is one record, so one line (one person's row) can
            # never swallow or split the lines of others (an unbalanced quote once took every
            # later line with it); quotes around a field are removed below
            opt("quote", exp.Literal.string("")),
            opt("escape", exp.Literal.string("")),
            opt("new_line", exp.Literal.string("\\n")),  # with strict_mode off, CRLF files read too
            opt("strict_mode", exp.false()),
            opt("ignore_errors", exp.true()),
            opt("parallel", exp.true()),
            opt("hive_partitioning", exp.false()),  # a "uid=7/" directory never sets a column
        )
        inner, outer = [], []
        for n in names:
            field, column = self._csv_column(n, types.get(n.lower()))
            inner.append(exp.alias_(field, n, quoted=True, copy=False))
            outer.append(exp.alias_(column, view_column(n), quoted=True, copy=False))
        # two levels, each column's expression of a constant size: the inner select reads each field
        # once (unquoted, then its declared type's TRY_CAST), the outer caps or range-checks that one
        # column (a cap or a range test over the inner expression would repeat it)
        fields = exp.select(*inner, copy=False).from_(exp.Table(this=reader), copy=False)
        return exp.select(*outer, copy=False).from_(fields.subquery("__fields", copy=False), copy=False)

    def _csv_column(self, name: str, declared: str | None) -> tuple[exp.Expression, exp.Expression]:
        """(field, column) of one CSV column: the field read from the line (unquoted, then cast to
        the declared type), and the view's column over the field as ``name`` (text capped at
        ``max_text_bytes``, a date or timestamp outside the range of years 1..9999 NULL)."""
        field: exp.Expression = _csv_unquote(exp.column(name, quoted=True))
        column: exp.Expression = exp.column(name, quoted=True)
        if declared is not None and declared.strip().upper() != "VARCHAR":
            field = exp.TryCast(this=field, to=exp.DataType.build(declared.strip().upper(), dialect="duckdb"))
            # TRY_CAST accepts timestamps up to DuckDB's ends, where date_trunc raises
            edge = {"TIMESTAMP": "timestamp", "TIMESTAMPTZ": "timestamp with time zone",
                    "DATE": "date"}.get(declared.strip().upper())
            if edge is not None:
                rebuild = _temporal_in_range(edge)
                assert rebuild is not None
                column = rebuild(column)
        else:
            column = _cap(column, self.settings.max_text_bytes, fn="STRLEN")
        return field, column

    def _csv_schema(self, name: str, source: str, types: dict[str, str]) -> list[tuple[str, str]]:
        """(column, type) of a CSV source's view without binding it (DuckDB's binder takes time that
        grows faster than the width of a select list: a wide file's view is bound once, by its
        CREATE): the header's columns, VARCHAR or their declared type as DuckDB spells it, read from a
        one-column select per distinct declared type."""
        names = self._header_of(source, _literal_files(name, _expand(source))[0])
        spelled: dict[str, str] = {}
        for t in {types[n.lower()] for n in names if n.lower() in types}:
            field, column = self._csv_column("x", t)
            probe = exp.select(exp.alias_(column, "x")).from_(
                exp.select(exp.alias_(field, "x")).from_(
                    exp.select(exp.alias_(exp.cast(exp.Null(), "VARCHAR"), "x")).subquery("__v")).subquery("__f"))
            spelled[t] = str(self._con.execute(self._render(exp.Describe(this=probe))).fetchall()[0][1])
        return [(n, spelled.get(types.get(n.lower(), ""), "VARCHAR")) for n in names]

    def _duckdb_select(self, name: str, source: str) -> exp.Select:
        """A table of the caller's connection; text, JSON, BLOB and GEOMETRY over ``max_text_bytes`` (a BIT over
        that many bits) read as NULL at any depth (:func:`_duck_plan`). A relation whose plan, directly or through views, reads anything
        but DuckDB's own tables and the values a query makes itself (VALUES, ``range``, ...) is refused
        (:func:`reading_scans`, an allow-list): a Python object registered with the connection (an Arrow table,
        a data frame), a file read by DuckDB's own readers, an extension's scan, any other table function. Its
        values would reach queries unchecked, and reading some of them fails. Only the bound plan is read, never
        a row."""
        rel = exp.to_table(source)
        try:
            scans = self.reading_scans(exp.select("*").from_(rel.copy()))
        except duckdb.ConnectionException:  # closed by the caller (it was "ConnectionException", hinting at a file)
            raise ConfigError(f"table '{name}': the DuckDB connection given to this Session is closed",
                              hint="open the Session on an open connection (Session(connection=con)), or let dpsql open "
                              "its own connection") from None
        except duckdb.CatalogException:  # named (it was "CatalogException", hinting at a file)
            raise ConfigError(f"table '{name}': the Session's connection has no table '{source}' (or it is a view over a "
                              "table or schema that is gone)",
                              hint="check the name (a table of an attached database is 'db.table' or 'db.schema.table'; "
                              "list them with con.sql('SHOW ALL TABLES')), and that the Session was given that connection "
                              "(Session(connection=con))") from None
        if scans:
            raise ConfigError(
                f"table '{name}': '{source}' of the Session's connection reads {', '.join(scans)}: not a DuckDB table "
                "but a Python object registered with the connection, a file read by DuckDB's own reader, an "
                "extension's scan or another table function, which converts values while reading (text that is not "
                "UTF-8, a duration or timestamp beyond DuckDB's range, a CSV line that does not parse) and fails on "
                "some: queries would fail after their charge depending on one person's row",
                hint=f"register the pyarrow.Table or the Parquet / CSV file itself (register('{name}', table_or_path, "
                "...)), which dpsql reads totally, or materialise the relation in the connection (CREATE TABLE ... AS "
                f"SELECT * FROM {source})",
            )
        self._warn_computed_view(name, source)
        if not rel.catalog:  # (a name read through the search path: which table it is may change, _check_resolved)
            self._resolved[source_name(name)] = (name, source, self._resolution(rel.name))
        return self._capped_select(name, rel)

    def _resolution(self, table: str, state: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        """What decides which table a name without its database reads (metadata only, never a row): the current
        database and schema, the search path, and whether a TEMP table or view has that name (DuckDB reads TEMP
        first). ``state``: :meth:`_resolution_state`, read once for several names. (Run under ``self._lock``.)"""
        db, schema, path, temp = state if state is not None else self._resolution_state()
        return db, schema, path, table.lower() in temp

    def _resolution_state(self) -> tuple[Any, ...]:
        row = self._con.sql(
            "SELECT current_database(), current_schema(), current_setting('search_path'), "
            "list(CASE WHEN database_name = 'temp' THEN lower(table_name) END) FROM duckdb_tables()").fetchall()[0]
        views = self._con.sql("SELECT list(CASE WHEN database_name = 'temp' THEN lower(view_name) END) "
                              "FROM duckdb_views()").fetchall()[0][0]
        return (*row[:3], frozenset(str(t) for t in [*(row[3] or ()), *(views or ())] if t is not None))

    def _check_resolved(self) -> None:
        """Refuse, for free, a request on a caller's DuckDB table registered by a name without its database whose
        resolution changed since (a ``SET search_path``, ``USE``, or a TEMP table or view of that name, which DuckDB
        reads first): the name would read another table than the one registered, silently. (Run under
        ``self._lock``.)"""
        state = self._resolution_state() if self._resolved else None
        for name, source, then in list(self._resolved.values()):
            if self._resolution(exp.to_table(source).name, state) != then:
                raise ConfigError(
                    f"table '{name}': the Session's connection now resolves '{source}' differently from when it was "
                    "registered (its search path, current database or schema, or a TEMP table or view of that name "
                    "changed), so it could read another table; nothing was charged",
                    hint=f"register the table by its full name (register('{name}', '{then[0]}.{then[1]}.{exp.to_table(source).name}', "
                         "...) for the table registered), or register it again after the change")

    def _warn_computed_view(self, name: str, source: str) -> None:
        """Warn the owner (of their own view's definition: no row is read) where ``source`` is a view that computes
        its columns or conditions: DuckDB computes them as each row is read, so one that fails on one person's row
        (``CAST(s AS INTEGER)`` of a text) fails every query reading it after its charge (docs/threat_model.md)."""
        with self._lock:
            try:
                rows = self._con.execute("SELECT lower(view_name), sql FROM duckdb_views() WHERE NOT internal").fetchall()
            except _BUSY:
                raise _busy_refusal() from None
        found = view_computations({str(n): str(q) for n, q in rows if q}, source)
        if found:
            import warnings

            warnings.warn(
                f"table '{name}': '{source}' is a view that computes {', '.join(found)} as it reads each row: where one "
                "row makes such an expression fail (a CAST of text that is not a number, an overflow), every query "
                "reading it fails after its charge, and whether it fails tells of that row; register only views whose "
                "expressions cannot fail (TRY_CAST, try(...)), or materialise the view (CREATE TABLE ... AS), where "
                "you see the failure", stacklevel=6)

    def reading_scans(self, ast: exp.Expression) -> list[str]:
        """The operators of ``ast``'s plan that read anything but DuckDB's own tables and the values a query makes
        itself (:func:`reading_scans`, an allow-list); the plan only, no row is read."""
        with self._lock:
            try:
                plans = self._con.sql("EXPLAIN (FORMAT JSON) " + self._render(ast)).fetchall()
            except _BUSY:
                raise _busy_refusal() from None
        return sorted({s for row in plans for s in reading_scans(str(row[1]))})  # every plan explain_output shows

    def unregister_source(self, name: str, kind: str, view: str | None = None) -> None:
        view = view or source_name(name)
        self._views.discard((view, kind))
        self._resolved.pop(view, None)
        self._texts.pop(view, None)
        nsrc = self._native.pop(view, None)
        self._datasets.pop(view, None)
        self._csv_headers.pop(view, None)
        flags = [] if nsrc is None else [*nsrc.stale, *([nsrc.marks] if nsrc.marks else [])]
        src = self._csv.pop(view, None)
        if src is not None:
            csvcopy.drop(src)
        with self._lock:
            try:
                self._con.execute(self._render(exp.Drop(this=exp.to_table(view, quoted=True), kind="VIEW", exists=True)))
            except duckdb.Error:
                pass
            if kind in ("arrow", "parquet"):
                for table in (view + "_raw", *flags):
                    try:
                        self._con.unregister(table)
                    except duckdb.Error:
                        pass

    # -- limits ---------------------------------------------------------------------------
    def _read_threads(self, shown: Any) -> int:
        """The threads of a private read (``EngineSettings.read_threads``): under the owner's ``memory_limit``, or
        without one under the connection's (``shown``: its bytes, as :data:`_LIMIT_BYTES` reads them; DuckDB's
        default on the engine's own connection, the caller's own on theirs). A ConfigError (free) where that limit
        cannot hold a vector of the longest texts even at one thread."""
        s = self.settings
        if s.memory_limit is not None or not isinstance(shown, int):
            self._limit_bytes = None if s.memory_limit is None else size_bytes(s.memory_limit)
            return s.effective_threads
        self._limit_bytes = shown
        return s.read_threads(shown, "DuckDB's default memory_limit" if self._owned
                              else "the DuckDB connection's own memory_limit")

    @property
    def read_bound(self) -> tuple[int | None, int]:
        """The memory limit (bytes) and threads a private read's text columns are bounded under: part of the key of a
        remembered bind check, whose :meth:`check_text_columns` holds only under them (a caller's connection's own
        limit, read again before every charge, may have changed since)."""
        return self._limit_bytes, self._threads

    def _text_columns_read(self, sql: str, reads: native.Reads) -> int:
        """How many text values a scan of the private read ``sql`` may decode at once: of the registered sources the
        query's text mentions, the most text-like columns (:data:`_TEXT_TYPES`, a struct's fields counted one by
        one) of one source that the query names (``reads``; every one where it may read a column without naming
        it). One source's: a thread runs one task of one pipeline at a time, and a scan's vectors are of its own
        source (a join's build side is read before its probe side). From the query's text and the types only."""
        return max((sum(k for col, k in cols if reads.names is None or col.lower() in reads.names)
                    for view, cols in self._texts.items() if view in sql), default=0)

    def _threads_for(self, columns: int) -> int:
        """The threads of a read decoding ``columns`` text columns (:meth:`_text_columns_read`): the engine's
        (:meth:`_read_threads`, which the limit holds for one such column), lowered until ``memory_limit`` holds
        :func:`text_read_memory` for each of them; 0 where it does not at one thread."""
        cap, limit = self.settings.max_text_bytes, self._limit_bytes
        if columns <= 1 or cap is None or limit is None:
            return self._threads
        return min(self._threads, limit // (text_read_memory(1, cap) * columns))

    def check_text_columns(self, ast: exp.Expression) -> None:
        """Refuse (free) a private read of ``ast`` that decodes more text columns at once than ``memory_limit`` holds
        vectors of at one thread (:meth:`_threads_for`): one person's rows of the longest texts in each would make
        it fail after its charge, only when that person is there."""
        reads = native.reads_of(ast)
        self._reads_of = (ast, reads)  # kept for the describe that follows (describe_bounded)
        # the relations it names and its strings stand for its text (rendering is the bind's, which an interrupt ends)
        named = " ".join([t.name for t in ast.find_all(exp.Table)] + list(reads.strings))
        columns = self._text_columns_read(named, reads)
        if self._threads_for(columns) >= 1:
            return
        cap, limit = self.settings.max_text_bytes, self._limit_bytes
        assert cap is not None and limit is not None
        need = text_read_memory(1, cap) * columns
        raise ConfigError(
            f"this query reads {columns} text columns at once; DuckDB's Parquet reader needs up to "
            f"{text_read_memory(1, 1) // 2048} vectors of {2048} of each column's longest texts (max_text_bytes = {cap}), "
            f"{-(-need // 10**6)} MB at one thread, more than the memory_limit of {limit // 10**6} MB holds; "
            "nothing was charged",
            hint="read fewer text columns in one query, or raise the engine's memory_limit, or lower max_text_bytes "
                 "([engine] in dpsql.toml, or Session(engine={...}))")

    def _limits(self) -> list[tuple[str, str]]:
        s = self.settings
        # never fetch or load an extension because a query names a type or function of one
        out = [("autoinstall_known_extensions", "false"), ("autoload_known_extensions", "false"),
               ("threads", str(self._threads)),
               # an ORDER BY without a direction (the analyst's, and the bounding's windows and sorts)
               # means ascending, NULLs last, whatever a caller's connection sets
               ("default_order", "ASC"), ("default_null_order", "NULLS_LAST"),
               # the typer's total expressions assume DuckDB's defaults: IEEE floating point (ln(0) is
               # -inf, 1/0.0 inf, not an error), / as true division, warnings as warnings; a caller's
               # connection set otherwise failed after the charge exactly when one person's row held a 0
               ("ieee_floating_point_ops", "true"), ("integer_division", "false"), ("warnings_as_errors", "false"),
               # DuckDB's default nesting limit, under which every query the engine's own connection answers binds:
               # a caller's connection lowered after a query's (remembered) bind check failed it after the charge
               ("max_expression_depth", "1000"),
               # nothing about a private read is printed or logged by DuckDB: a caller's connection with the
               # progress bar or DuckDB's logger on printed or stored them meanwhile (the profiler: _limited)
               ("enable_progress_bar", "false"), ("enable_logging", "false"),
               # results come back in the Arrow types the release reads (lossless conversion exported a
               # HUGEINT count as opaque bytes: AVG failed after its charge on such a connection)
               ("arrow_lossless_conversion", "false"), ("produce_arrow_string_view", "false"),
               ("arrow_output_list_view", "false")]
        if self._icu:
            # a TIMESTAMPTZ's text is made under the connection's calendar: under 'chinese' or 'dangi' the text of an
            # instant from about the year 100 000 on raised DuckDB's internal error (which also invalidated the
            # database), so a caller's connection failed the query after its charge exactly where one row held one
            out.append(("Calendar", "gregorian"))
        if s.memory_limit is not None:
            out.append(("memory_limit", s.memory_limit))
        if s.max_temp_directory_size is not None:
            out.append(("max_temp_directory_size", s.max_temp_directory_size))
        out.append(("temp_directory", self._spill))
        return out

    @contextmanager
    def _threads_of_read(self, threads: int) -> Iterator[None]:
        """``threads`` for one private read where they are fewer than the engine's (:meth:`_threads_for`)."""
        if threads == self._threads:
            yield
            return
        self._con.execute(f"SET threads = {int(threads)}")
        try:
            yield
        finally:
            self._con.execute(f"SET threads = {int(self._threads)}")

    @contextmanager
    def _limited(self) -> Iterator[None]:
        """The owner's limits for one private read (a caller's connection gets its values back)."""
        if self._owned:
            yield
            return
        limits = self._limits()
        # one statement reads every setting, one sets them all and one restores them (a statement
        # each cost ~25 ms per query on a caller's connection)
        names = [name for name, _ in limits]
        follows = [_FOLLOWER[1]] * (self._follower and _FOLLOWER[0] in names)
        row = self._con.sql("SELECT " + ", ".join(f"current_setting('{n}')" for n in
                                                      [*follows, *names, "log_query_path", "enable_profiling"])).fetchall()[0]
        follow = {_FOLLOWER[0]: (_FOLLOWER[1], str(row[0]))} if follows else {}
        row = row[len(follows):]
        _refuse_query_log(row[-2])
        saved = [(name, str(value)) for (name, _), value in zip(limits, row[:-2], strict=True)]
        # the profiler prints (or writes to the caller's profiling_output) each query's plan with the
        # exact number of rows through each operator (the rows a WHERE kept: a count before any noise)
        profiling = row[-1]
        try:
            # inside the try: settings changed before an interrupt of this statement are restored too
            sets = [f"SET {_scope(name)}{name} = {_sql_str(value)}" for name, value in limits]
            sets += ["RESET enable_profiling"] if profiling is not None else []
            try:
                self._con.execute("; ".join(sets))
            except duckdb.NotImplementedException as e:
                if "temporary directory" not in str(e):
                    raise
                # DuckDB keeps a connection's temp directory once something spilled there (the caller's, or ours
                # since an earlier read): the read spills into it, and it is not given back either
                saved[:] = [(name, value) for name, value in saved if name != "temp_directory"]
                self._con.execute("; ".join(x for x in sets if not x.startswith("SET temp_directory ")))
            yield
        finally:
            self._restore(saved, profiling, follow)

    def _restore(self, saved: list[tuple[str, str]], profiling: Any, follow: dict[str, tuple[str, str]]) -> None:
        """The caller's settings back (``_limited``). DuckDB shows a size rounded (``current_setting``, ``duckdb_settings()``
        and ``PRAGMA database_size`` alike; none gives its bytes), so setting the text it showed lowered it: a default
        ``memory_limit`` of 18.8 GiB came back as 18.7 GiB, ``1234567kB`` (shown 1.1 GiB) as 1.0 GiB. Each setting is reset
        to DuckDB's default, in one statement, which gives back a default exactly; one that then shows otherwise (the
        caller set it) is set to its text, a size to the least number of bytes that shows as it did, and as the setting
        DuckDB shows from it (:data:`_FOLLOWER`) did (found once per shown text): what they show is the caller's again,
        to the character, and repeated queries never drift."""
        for name, original in [x for x in saved if x[0] == "temp_directory"]:
            saved = [x for x in saved if x[0] != "temp_directory"]
            try:
                if self._set_shown(name, original) != original:  # pragma: no cover - DuckDB showed it so
                    self._con.execute("RESET temp_directory")
            except duckdb.Error:  # our read spilled there: DuckDB keeps a used temp directory (and spills into it)
                pass
        try:
            now = self._con.execute("; ".join(
                [f"SET enable_profiling = {_sql_str(str(profiling))}"] * (profiling is not None)
                + [f"RESET {_scope(name)}{name}" for name, _ in saved]
                + ["SELECT " + ", ".join(f"current_setting('{name}')" for name, _ in saved)])).fetchall()[0]
        except duckdb.Error:  # pragma: no cover - resetting settings DuckDB reported
            now = (None,) * len(saved)
        for (name, original), shown in zip(saved, now, strict=True):
            if shown is not None and str(shown) == original:
                continue
            for value in (self._callers.get((name, original)), original):
                try:
                    if value is not None and self._set_shown(name, value) == original:
                        break
                except duckdb.Error:
                    pass
            else:
                self._callers[(name, original)] = self._least_shown_as(name, original, follow.get(name))

    def _set_shown(self, name: str, value: str | None) -> str:
        """Set ``name`` to ``value`` (None: leave it) and say what DuckDB shows for it."""
        sql = f"SELECT current_setting('{name}')"
        return str(self._con.execute(sql if value is None else f"SET {_scope(name)}{name} = {_sql_str(value)}; {sql}").fetchall()[0][0])

    def _least_shown_as(self, name: str, shown: str, follow: tuple[str, str] | None) -> str | None:
        """The least number of bytes (as ``'<n>b'``) that DuckDB shows as ``shown``, a size it showed for setting
        ``name``, and for which ``follow`` (a setting DuckDB shows from it, and what it showed) shows as it did if
        one does; the setting is left at it when found. None when ``shown`` is not a size."""
        try:
            want = self._con.execute("SELECT parse_formatted_bytes(?)::BIGINT", [shown]).fetchall()[0][0]
            hi = want + max(want // 8, 1 << 20)  # shows more than ``shown`` (a size shows 2 to 4 digits)
            least = self._least(name, want - 1, hi, name, want)
            if follow is not None:
                want = self._con.execute("SELECT parse_formatted_bytes(?)::BIGINT", [follow[1]]).fetchall()[0][0]
                finer = self._least(name, least - 1, hi, follow[0], want)
                if self._set_shown(name, f"{finer}b") == shown and self._set_shown(follow[0], None) == follow[1]:
                    return f"{finer}b"
            return f"{least}b" if self._set_shown(name, f"{least}b") == shown else None
        except duckdb.Error:
            return None

    def _least(self, name: str, lo: int, hi: int, watch: str, want: int) -> int:
        """The least ``b`` in (lo, hi] for which setting ``name`` to ``b`` bytes makes ``watch`` show at least ``want``
        bytes (it grows with ``b``; ``hi``: assumed to)."""
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            got = self._con.execute(f"SET {name} = '{mid}b'; SELECT parse_formatted_bytes(current_setting('{watch}'))"
                                    "::BIGINT").fetchall()[0][0]
            lo, hi = (lo, mid) if got >= want else (mid, hi)
        return hi

    @contextmanager
    def _deadline(self, until: float | None = None) -> Iterator[None]:
        """Interrupt the connection after the owner's statement time-out (a timer thread:
        DuckDB has no statement time-out), or at ``until`` (a ``time.monotonic()`` instant: what is
        left of a batch's time-out) if that is sooner. The deadline does not depend on the data."""
        limit = self.settings.statement_timeout
        if limit is None:
            yield
            return
        if until is not None:
            limit = min(limit, until - time.monotonic())
            if limit <= 0:  # nothing left of a batch's time-out: the read does not start (the generic failure)
                raise TimeoutError("the statement time-out passed")
        # Python-side steps of the read (the copies of CSV files) check it themselves: an
        # interrupt reaches only a running DuckDB statement
        self._until = csvcopy.now() + limit
        done = threading.Event()
        guard = threading.Lock()

        def fire() -> None:
            # DuckDB drops an interrupt that arrives while no statement runs (a time-out firing before the
            # read's statement began let it run unbounded): interrupt until the read ends
            while True:
                with guard:
                    if done.is_set():
                        return
                    self._con.interrupt()
                if done.wait(0.01):
                    return

        timer = threading.Timer(limit, fire)
        timer.daemon = True
        try:
            # inside the try: a signal's handler that raises while the timer starts (a SIGALRM time-out of the program,
            # which is not held back) left it running with nothing to stop it: it interrupted every later statement of
            # the connection, each later query failing after its charge
            timer.start()
            yield
        finally:
            self._until = None
            with guard:
                done.set()
            timer.cancel()

    @contextmanager
    def _patient(self) -> Iterator[None]:
        """After the charge (a private read, a post-processing), a caller's connection busy with the program's own
        call in another thread is waited for up to the statement time-out (none: as long as it takes), not
        :data:`_BUSY_WAIT`: failing would waste the charge."""
        if not isinstance(self._con, _Patient):  # dpsql's own connection: no other caller
            yield
            return
        limit = self.settings.statement_timeout
        self._con.wait[0] = math.inf if limit is None else limit
        try:
            yield
        finally:
            self._con.wait[0] = None

    @staticmethod
    def _marked_off(ast: exp.Expression) -> list[str]:
        """DuckDB optimizers to turn off while a query runs, from marks on its parts (the query's
        shape only, never the data): :data:`KEEP_BUILD_SIDE`, the build/probe side swap (each hash
        join builds on its right side as written, the small one, instead of trusting the
        estimates of Arrow scans, unknown, about 1 row, which can put 10M rows on the build side);
        :data:`SPILLING_WINDOW`, the top-n window rewrite (a row cap's window stays a window, which
        sorts on disk, instead of per-partition ``ARG_MIN(..., n)`` lists held in memory)."""
        marks = {m for n in ast.walk() if n._meta for m in (KEEP_BUILD_SIDE, SPILLING_WINDOW) if n.meta.get(m)}
        return [name for m, name in ((KEEP_BUILD_SIDE, "build_side_probe_side"),
                                     (SPILLING_WINDOW, "top_n_window_elimination")) if m in marks]

    @contextmanager
    def _optimizers_off(self, off: list[str]) -> Iterator[None]:
        """The optimizers ``off`` (:meth:`_marked_off`) turned off while the block runs (on the
        engine's own connection, :data:`STATISTICS_OPTIMIZERS` are off from its start)."""
        if self._owned:
            off = [o for o in off if o not in STATISTICS_OPTIMIZERS]
        if not off:
            yield
            return
        before = str(self._con.sql("SELECT current_setting('disabled_optimizers')").fetchall()[0][0])
        names = [x.strip() for x in before.split(",") if x.strip()]
        names += [o for o in dict.fromkeys(off) if o not in names]
        self._con.execute(f"SET disabled_optimizers = {_sql_str(', '.join(names))}")
        try:
            yield
        finally:
            self._con.execute(f"SET disabled_optimizers = {_sql_str(before)}")

    # -- execution ------------------------------------------------------------------------
    def prepare_bounded(self, build: Callable[[str], Any], salt: str) -> tuple[PreparedRead | None, Any]:
        """A bounded query ``build(salt)`` rendered once, for every later query of the same bind key
        (``dpsql.session``) to run with its own salt (None where that would not be exact), and what this
        query (of secret ``salt``) runs. The query is built under ``salt``, and, only where that is one
        query without a read salt (``with_read_salt``: drawn again for each read), under a random stand-in
        salt: only where the stand-in's text does not hold ``salt`` and becomes the text built under ``salt``
        when ``salt`` is put in place of the stand-in (the salt enters the text verbatim, if at all, and
        nothing else in it varies) is it kept. A batch (or no read) is built once, as before."""
        from dpsql.plan.typer import READ_SALT

        built = build(salt)
        if not isinstance(built, exp.Expression) or any(n.meta.get(READ_SALT) for n in built.find_all(exp.Literal)):
            return None, built
        off, reads = tuple(self._marked_off(built)), native.reads_of(built)  # read before the rendering
        own = SaltedRead(self._render(built, copy=False), off, reads)  # what fetch_arrow runs of ``built``
        one = secrets.token_hex(16)
        stand_in = build(one)
        if not isinstance(stand_in, exp.Expression):
            return None, own
        off, reads = tuple(self._marked_off(stand_in)), native.reads_of(stand_in)
        text = self._render(stand_in, copy=False)
        if salt in text or text.replace(one, salt) != own.sql or off != own.off:
            return None, own
        return PreparedRead(text, one, off, reads), own

    def fetch_arrow(self, ast: exp.Expression | SaltedRead, *, what: str = "the bounded query",
                    deadline: float | None = None) -> pa.Table:
        """Run a query that reads private data, under the owner's limits and time-out (and, for a
        batch, ``deadline``: :meth:`_deadline`).

        Any failure is the one generic ExecutionError (:data:`PRIVATE_FAILURE`). ``ast`` is the
        query built for this read: its marks are read, the read salt put in (a copy, if it has one),
        then it is rendered without a copy; or a prepared query's text under this query's salt
        (:meth:`prepare_bounded`)."""
        reads: native.Reads | None
        if isinstance(ast, SaltedRead):
            off, salted, sql, reads = [*STATISTICS_OPTIMIZERS, *ast.off], None, ast.sql, ast.reads
        else:
            off = [*STATISTICS_OPTIMIZERS, *self._marked_off(ast)]
            kept = self._described_text(ast)
            read_salted = read_salted_text(ast, kept[0]) if kept is not None else None
            if kept is not None and read_salted is not None:  # the bound text, the read salt put in: no copy
                salted, sql, reads = ast, read_salted, kept[1]
            else:
                salted = with_read_salt(ast)
                kept = kept if salted is ast else None
                sql, reads = kept if kept is not None else (self._render(salted, copy=False), None)
        failure: ExecutionError | None = None
        columns = self._text_columns_read(sql, reads if reads is not None else native.reads_of(salted))
        with self._lock:
            try:
                with (self._patient(), self._limited(), self._threads_of_read(max(1, self._threads_for(columns))),
                      self._optimizers_off(off), self._deadline(deadline)):
                    used_arrow = self._dataset_views(sql)
                    used = self._native_views(sql, salted, reads)
                    used_csv = self._csv_views(sql)
                    # the main connection: registered Arrow sources are connection-local
                    out = self._con.sql(sql).to_arrow_table()
                    read = [(src.paths, v) for src, v in used] + [(c.paths, v) for c, v in used_csv] + used_arrow
                    if any(native.versions(paths) != v for paths, v in read):
                        raise OSError("a source file changed during the read")  # the generic failure below
                    return out
            except (duckdb.Error, pa.ArrowException, MemoryError, OSError) as e:
                if interrupted_by_signal(e):  # Ctrl-C while an Arrow source was scanned: a KeyboardInterrupt
                    raise KeyboardInterrupt from None
                failure = private_failure(what, self._detail(e), self.settings)
            finally:
                if not self._spill_used and self.settings.temp_directory is None:  # (DuckDB made it if it spilled)
                    self._spill_used = os.path.isdir(self._spill)
        assert failure is not None
        raise failure

    def _header_of(self, source: str, path: str) -> list[str]:
        return _csv_header(path, _csv_delimiter(source), self.settings.csv_encoding)

    def _csv_registered(self, name: str, source: str, files: list[str]) -> tuple[list[str], native.Version]:
        """The header every file of a CSV source has, and the files' versions (taken first). The files are read by
        position under the first file's header: one whose header differs (the columns in another order) read a
        person's rows under another column, one person's rows as many people; it is refused."""
        version = native.versions(files)
        header = self._header_of(source, files[0])
        for f in files[1:]:
            if self._header_of(source, f) != header:
                raise ConfigError(f"table '{name}': the CSV file {f!r} has another header line than {files[0]!r}; "
                                  "the files of a source are read by position under the first file's header",
                                  hint="give every file of the source the same header line (the same columns in "
                                       "the same order), or register the files as separate tables")
        return header, version

    def source_changed(self, view: str) -> str | None:
        """Why the files of ``view`` (Parquet or CSV) can no longer be read as registered, or None: checked
        before every charge, from the files' metadata only (footers, a CSV file's header line, read again only
        where the file's version changed; no row)."""
        src = self._csv.get(view)
        if src is None:
            return self.parquet_changed(view)
        try:
            now = native.versions(src.paths)
        except native.SpecialFile as e:  # (its header line is never read: a reader would wait on a FIFO for ever)
            return str(e)
        except OSError:
            return "one of its CSV files is gone"
        header, then = self._csv_headers.get(view, ([], now))
        for path, a, b in zip(src.paths, now, then, strict=False):
            if a == b:
                continue
            try:
                changed = self._header_of(src.source, path) != header
            except Exception:  # noqa: BLE001 - zlib.error, EOFError, ConfigError: whatever the first line's bytes
                # emptied, another encoding, a lone carriage return, a .gz that does not decompress, or no header
                # at all (the first line one person's row): the read failed after the charge, or not, by its bytes
                return "the first line of one of its CSV files is no longer a readable header"
            if changed:
                # the view selects the registered columns by name, the files by position: a column gone failed
                # every query after its charge, columns in another order read one person's rows as many people
                return "its CSV header changed"
        return None

    def parquet_changed(self, view: str) -> str | None:
        """Why the Parquet files of ``view``'s Arrow view can no longer be read as registered, or None
        (checked before every charge; the files' footers only, no row). pyarrow's dataset keeps each
        file's footer (row groups, page offsets and sizes) from when it was made, so a file replaced
        since (an ETL job's new export under the same name) was read with the old footer: the query
        failed after its charge, or read misplaced pages, depending on the new file's bytes. A new
        version with the same schema gets a new dataset; another schema is refused, for free. DuckDB's own
        reader (``invalid_text = "replace"``) types the files by their footers at each query: a column
        widened since registration (INTEGER now BIGINT) made ``x * x`` overflow, after the charge, where one
        person's value was large; another schema is refused likewise."""
        with self._lock:
            return self._refresh_dataset(view)

    def _refresh_dataset(self, view: str) -> str | None:
        import pyarrow.dataset as ds

        d = self._datasets.get(view)
        if d is None:
            return None
        try:
            now = native.versions(d.paths)
            if now == d.version:
                return None
            schemas = [parquet_schema(p) for p in d.paths]
        except native.SpecialFile as e:  # (its footer is never read: a reader would wait on a FIFO for ever)
            return str(e)
        except (OSError, pa.ArrowException):
            return "one of its Parquet files can no longer be read"
        if len(schemas) != len(d.schemas) or any(not a.equals(b) for a, b in zip(schemas, d.schemas, strict=True)):
            return "its Parquet files changed their columns or types"
        # the same Arrow types can be stored another way: a DECIMAL now variable-length BINARY (as registration
        # refuses it) failed the read after the charge exactly where one person's value held more than 16 bytes
        try:
            why = next((w for p in d.paths if (w := decimal_storage_reason(parquet_decimal_leaves(p)))), None)
        except (OSError, pa.ArrowException):
            return "one of its Parquet files can no longer be read"
        if why is not None:
            return f"its Parquet files store {why}"
        if d.raw is None:
            # DuckDB's own reader: the same Arrow schema can be stored as a type that reader converts and fails
            # on (a timestamp[us] now INT96, as Spark writes it, raised where one person's stored day was beyond
            # its range), which registration refuses
            try:
                unsafe = self._replace_unsafe(d.paths)
            except duckdb.InterruptException:
                raise
            except duckdb.Error:
                return "one of its Parquet files can no longer be read"
            if unsafe is not None:
                return (f"its Parquet files store the column '{unsafe[0]}' as {unsafe[1]} (which DuckDB's own reader, "
                        "invalid_text = \"replace\", converts in a way that can fail on a stored value)")
        if d.raw is not None:
            self._con.register(d.raw, ds.dataset(d.paths, format=parquet_format(d.target), schema=d.target))
        d.version = now  # a file replaced again meanwhile is found by the read's check after it
        return None

    def _dataset_views(self, sql: str) -> list[tuple[list[str], native.Version]]:
        """The Parquet datasets the query ``sql`` names, each made again if its files changed (with the
        versions to find again after the read: a file replaced during the read fails it)."""
        out = []
        for view, d in self._datasets.items():
            if view not in sql:
                continue
            if self._refresh_dataset(view) is not None:
                raise OSError("a source file changed its schema")  # the generic failure of the read
            out.append((d.paths, d.version))
        return out

    def _native_views(self, sql: str, ast: exp.Expression | None = None,
                      known: native.Reads | None = None) -> list[tuple[native.NativeSource, native.Version]]:
        """Point each Parquet source the query ``sql`` (of ``ast``) names at DuckDB's own reader
        where the text columns the query may read (:func:`native.reads_of`; all of them without
        ``ast``) were checked in the files' current version (``dpsql.engine._duckdb_native``), else
        at the Arrow view; returns the sources read natively with the versions to find again after
        the read. A column is checked once per file version, on the first read that names it; the
        view reads the columns not yet checked as NULL. (A view name inside a literal only makes
        every text column of a source be checked that the query does not read.) ``known``: what
        the query may read, already found from its tree (a prepared query's)."""
        used = []
        reads: native.Reads | None = known
        for view, src in self._native.items():
            if view not in sql or src.disabled:
                continue
            src.reads += 1
            version = native.versions(src.paths)
            if src.checked != version and (src.checked is not None or src.stale):
                # the file changed (or a rebuild failed with the Arrow view believed in place): the
                # Arrow view until checked again
                self._arrow_view(src)
            if reads is None:
                reads = native.reads_of(ast) if ast is not None else native.Reads(None)
            new = [c for c in reads.text_columns(src) if c not in src.columns]
            if src.checked == version and not new:
                used.append((src, version))
                continue
            if not native.settled(version):
                continue
            try:
                bad = native.invalid_cells(src, self._threads, new)
            except (pa.ArrowException, OSError):  # the check cannot read them: the Arrow view (same values) stays
                bad = None
            if bad is None:
                self._arrow_view(src)
                src.disabled = True
                continue
            if self._native_rebuild(src, version, src.columns | frozenset(new), {**src.bad, **bad}):
                used.append((src, version))
        return used

    def _native_rebuild(self, src: native.NativeSource, version: native.Version, checked: frozenset[str],
                        bad: dict[str, Any]) -> bool:
        """Point ``src``'s view at DuckDB's reader with the text columns ``checked`` (their invalid
        cells ``bad``) in ``version``; False where the Arrow view stays. The view and its flags
        table change together: the flags are registered under a name of their own, the view
        replaced in one statement, and only then ``src``'s state updated and the previous flags
        dropped. An exception anywhere between (the statement time-out interrupts every statement
        once it has passed, and the check may outlast it) leaves the previous view reading the
        previous flags, and ``src`` describing them; the new flags are dropped after the next
        replacement of the view (the failed statement may have taken effect)."""
        self._builds += 1
        name = f"_dpsql_flags_{self._builds}_{src.view}"
        try:
            sel, marks = native.native_select(src, self._native_capped(src), name, checked, bad)
        except duckdb.InterruptException:
            raise
        except duckdb.Error:  # the reader does not bind these files: the Arrow view stays
            self._arrow_view(src)
            src.disabled = True
            return False
        if marks is not None:
            src.stale.append(name)  # not the view's until the view is replaced
            self._con.register(name, marks)
        schema = self._schema_of(sel)
        if schema is None or schema != self._schema_of(src.arrow_select):
            self._arrow_view(src)
            src.disabled = True  # from the schemas only: the native reader would not give the same columns
            return False
        if native.versions(src.paths) != version:  # changed while it was checked
            self._arrow_view(src)
            return False
        self._con.execute(self._render(_temp_view(src.view, sel)))
        if src.marks is not None:
            src.stale.append(src.marks)
        src.marks = name if marks is not None else None
        src.checked, src.columns, src.bad = version, checked, bad
        self._drop_stale(src)
        return True

    def _arrow_view(self, src: native.NativeSource) -> None:
        """``src`` read through its Arrow view, nothing checked (its files changed, or the native
        view cannot be built)."""
        if src.checked is not None or src.stale:
            self._con.execute(self._render(_temp_view(src.view, src.arrow_select.copy())))
        if src.marks is not None:
            src.stale.append(src.marks)
        src.checked, src.columns, src.bad, src.marks = None, frozenset(), {}, None
        self._drop_stale(src)

    def _drop_stale(self, src: native.NativeSource) -> None:
        """Unregister the flags tables ``src``'s view no longer reads (right after the view was
        replaced); one that cannot be dropped now is dropped after the next replacement."""
        kept = []
        for name in src.stale:
            if name == src.marks:
                continue
            try:
                self._con.unregister(name)
            except duckdb.Error:
                kept.append(name)
        src.stale = kept

    def _csv_views(self, sql: str) -> list[tuple[csvcopy.CsvSource, native.Version]]:
        """Point each CSV source the query ``sql`` names at copies of its files' current version
        (``dpsql.engine._duckdb_csv``: a lone carriage return read as a space, not as the end of a
        record); returns the sources with the versions to find again after the read. OSError (the
        generic failure) if a file is missing or changes meanwhile."""
        used = []
        for view, src in self._csv.items():
            if view not in sql:
                continue
            if self._csv_dir is None or not os.path.isdir(self._csv_dir):
                if self._csv_gone is not None:
                    self._csv_gone()  # the vanished directory's lock given up
                self._csv_dir = csvcopy.make_dir(self.settings.temp_directory, self._until)
                self._csv_gone = weakref.finalize(self, csvcopy.remove_dir, self._csv_dir, os.getpid())
            suffix = ".tsv" if _csv_delimiter(src.source) == "\t" else ".csv"
            fresh, version = csvcopy.refresh(src, self._csv_dir, suffix, self._until, self.settings.csv_encoding)
            if fresh:
                # the headers were checked before the charge, the files copied after it: a file replaced in between
                # would be read by position under the registered header (one person's rows as many people)
                header = self._csv_headers.get(view, (None, None))[0]
                if header is not None and not all(self._copied_header(src.source, c) == header for c in src.copies):
                    csvcopy.drop(src)
                    raise OSError("a CSV file's header changed before its read")  # the generic failure of the read
                try:
                    self._con.execute(self._render(_temp_view(view, self._csv_select(src.name, src.source, src.types,
                                                                                     src.copies))))
                except BaseException:
                    csvcopy.drop(src)  # the view still reads the old copies: copied again at the next read
                    raise
            used.append((src, version))
        return used

    def _copied_header(self, source: str, copy: str) -> list[str] | None:
        """The header line of the engine's copy of a CSV file (UTF-8 text), None if it has none."""
        try:
            return _csv_header(copy, _csv_delimiter(source), "utf-8")
        except ConfigError:
            return None

    def _schema_of(self, sel: exp.Expression) -> list[tuple[str, str]] | None:
        """(column, type) of a source select by binding it (no row is read); None if it does not bind."""
        try:
            return [(str(r[0]), str(r[1])) for r in self._con.sql(self._render(exp.Describe(this=sel.copy()))).fetchall()]
        except duckdb.InterruptException:  # the statement time-out, not the binding: the read's generic failure
            raise
        except duckdb.Error:
            return None

    def _native_capped(self, src: native.NativeSource) -> Callable[[exp.Expression], exp.Select]:
        return lambda rel: self._capped_select(src.name, rel, [f.name for f in src.schema])

    def describe(self, ast: exp.Expression) -> list[tuple[str, str]]:
        """(column, type) of a query's result, by binding it only (no row is read)."""
        return [(str(r[0]), str(r[1])) for r in self._bind(ast, describe=True)]

    def _described_text(self, ast: exp.Expression) -> tuple[str, native.Reads | None] | None:
        """The text (and the columns it reads, where known) that :meth:`describe` bound of this very tree, taken
        once, or None. A private read runs the text its bind check bound, without rendering the tree again (one
        rendering of a bounded query is several ms). Rendering does not change a tree that is rendered with a copy
        (``describe``), nor does anything between the bind check and the read; a tree built anew, or a copy with
        a read salt put in (``with_read_salt``), is another object and is rendered."""
        with self._lock:
            kept = self._described.pop(id(ast), None)
        return (kept[1], kept[2]) if kept is not None and kept[0] is ast else None

    def check_process(self) -> None:
        """Refuse (free) use in a process forked from the one that opened the engine, before any statement: also
        where the fork ran no at-fork hook (a C library's ``fork()``), which left the engine's lock as it was (held,
        for ever, where another thread of the parent held it)."""
        if self._pid != os.getpid():
            raise inherited_refusal(self._pid, "DuckDB" if self._owned else "DuckDB connection")

    def _check_spill(self) -> None:
        """Before every charge: the engine's spill directory can take DuckDB's files (``csvcopy.keep_spill``). A
        temporary-file cleaner that does not honour the process directory's lock may have removed it (or the files and
        the engine's directory inside it) while the process lived: DuckDB makes no directory above its own, nor its own
        again once made, so every later query that spilled failed after its charge. It is made again under its name;
        where something else took that name meanwhile (another user's directory, a symlink), which would have received
        the spill files, the query is refused (free)."""
        if self.settings.temp_directory is not None:
            return
        self._spill_used = self._spill_used or os.path.isdir(self._spill)
        if not csvcopy.keep_spill(self._spill, self._spill_used):
            raise ConfigError(
                f"the directory of this process for DuckDB's spill files ({os.path.dirname(self._spill)}) was removed "
                "while in use, and something else now has its name, where the spill files of private rows could be "
                "read by others; nothing was charged",
                hint="open a new Session (its engine makes a directory of its own), keep temporary-file cleaners from "
                     "removing locked directories (systemd-tmpfiles leaves them), or set the engine's temp_directory to "
                     "a directory of the data owner's")

    def check_connection(self) -> None:
        """Refuse (free) a caller's connection on which a private read cannot run: one that logs every statement
        (``log_query_path``, :func:`_refuse_query_log`), or whose settings :meth:`_limited` cannot change
        (``lock_configuration``; ``enable_external_access = false`` forbids changing the temp directory). The
        read sets its limits only after the charge, where such a connection failed every query (nothing
        released). One statement, before every charge (the bind check is remembered, these settings are not)."""
        self.check_process()  # first: also a request that would not use DuckDB (a synopsis reuse done in Arrow)
        self._check_spill()
        if self._owned:
            return
        failure: ConfigError | None = None
        with self._lock:
            try:
                log, locked, external, limit, profiling = self._con.sql(  # a relation's own result, never another call's
                    "SELECT current_setting('log_query_path'), current_setting('lock_configuration'), "
                    "current_setting('enable_external_access'), " + _LIMIT_BYTES[len("SELECT "):]
                    + ", current_setting('enable_profiling')").fetchall()[0]
                # (a connection whose settings are locked is refused below: its profiler is left alone)
                functions = self._functions(None if str(locked).lower() == "true" else profiling)
            except _BUSY:
                failure = _busy_refusal()
            except duckdb.ConnectionException:  # closed by the caller (ROLLBACK cannot help)
                failure = ConfigError("the DuckDB connection given to this Session is closed; nothing was charged",
                                      hint="close this Session and open a new one on an open connection (or let dpsql "
                                      "open its own connection)")
            except duckdb.Error as e:  # e.g. the caller's transaction aborted: every statement fails until ROLLBACK
                failure = ConfigError(
                    f"the DuckDB connection cannot run a statement now ({type(e).__name__}); nothing was charged",
                    hint="end the connection's failed transaction (ROLLBACK) or let dpsql open its own connection",
                )
        if failure is not None:
            raise failure
        _refuse_query_log(log)
        _refuse_shadowed_functions(*functions)
        self._threads = self._read_threads(limit)  # the caller may have changed their memory_limit since
        blocked = [f"{name} = {value}" for name, value, bad in (("lock_configuration", "true", str(locked).lower() == "true"),
                                                                ("enable_external_access", "false", str(external).lower() == "false"))
                   if bad]
        if blocked:
            raise ConfigError(
                f"the DuckDB connection's settings ({', '.join(blocked)}) keep dpsql from setting its limits "
                "(threads, sort order, floating point, temp directory) for a private read; nothing was charged",
                hint="open the connection without these settings while dpsql queries it, or let dpsql open its own "
                     "connection",
            )

    def _functions(self, profiling: Any) -> tuple[Any, Any]:
        """The caller's connection's functions that :func:`_refuse_shadowed_functions` checks (a statement of its own:
        a subquery of ``check_connection``'s went past the nesting limits callers set), never shown by the caller's
        profiler (its plan is no one's data, but printed at every query)."""
        if profiling is not None:
            self._con.execute("RESET enable_profiling")
        try:
            macros, core = self._con.sql(_FUNCTIONS).fetchall()[0]
            self._check_resolved()  # (the same: metadata statements, out of the caller's profiler)
        finally:
            if profiling is not None:
                self._con.execute(f"SET enable_profiling = {_sql_str(str(profiling))}")
        return macros, core

    def bind_check(self, ast: exp.Expression, *, run: bool = False) -> None:
        """Bind (type-check) a query without reading any row; refuse it for free if it fails.

        ``run=True`` executes it instead, for queries over public, one-row placeholder relations
        only (it also catches constant-conversion errors that binding alone lets through).
        """
        self._bind(ast, describe=not run)

    def _bind(self, ast: exp.Expression, *, describe: bool) -> list[Any]:
        """Run ``ast`` (``describe``: ``DESCRIBE`` of it, which binds it only). The text is rendered once from one copy
        of ``ast`` (the text of ``exp.Describe(this=ast)`` is ``DESCRIBE`` and the query's text). On the engine's own
        connection the statement is executed directly: a relation (``sql``) bound it once more before running it."""
        # binding reads schemas only: the exception class is public, DuckDB's text is not shown
        failure: QueryTypeError | ConfigError | None = None
        with self._lock:
            try:
                if not self._owned:  # the bound query's text holds the query's secret salt
                    _refuse_query_log(self._con.sql("SELECT current_setting('log_query_path')").fetchall()[0][0])
                text = self._render(ast)
                sql = ("DESCRIBE " if describe else "") + text
                if self._owned:  # no other caller's result on this connection to keep apart from
                    rows = self._con.execute(sql).fetchall()
                else:
                    rows = self._con.sql(sql).fetchall()
                if describe:  # the read of this tree runs this text (at most 4 kept: refused queries never read)
                    # read once: check_text_columns (of another thread's query, not under the lock) may replace it
                    checked, found = self._reads_of
                    reads = found if checked is ast else None
                    while len(self._described) >= 4:
                        self._described.pop(next(iter(self._described)))
                    self._described[id(ast)] = (ast, text, reads)
                return rows
            except (duckdb.Error, RuntimeError) as e:
                if interrupted_by_signal(e):  # Ctrl-C while DuckDB bound the query: a KeyboardInterrupt
                    raise KeyboardInterrupt from None
                if not isinstance(e, duckdb.Error):
                    raise
                failure = _busy_refusal() if isinstance(e, _BUSY) else QueryTypeError(
                    f"the query does not type-check against the table's columns ({type(e).__name__}); nothing was charged",
                    hint="check the types in WHERE / GROUP BY / HAVING / ORDER BY (e.g. text compared with numbers)",
                    debug_detail=self._detail(e),
                )
        assert failure is not None
        raise failure

    def post_process(self, table: pa.Table, ast_builder: Any) -> pa.Table:
        """Run a post-processing query (HAVING/ORDER BY/LIMIT on released values) over ``table``.

        ``ast_builder(name)`` returns the query AST reading from relation ``name``. The input
        holds only released (noisy) values, so this is post-processing. Text columns are read
        ``COLLATE "binary"``: HAVING, ORDER BY and LIMIT compare released keys as WHERE and
        GROUP BY do, whatever the caller's ``default_collation`` (under 'nocase', 'A' and 'a' tied
        in ORDER BY and LIMIT kept one of them in the engine's internal row order). On the engine's
        own connection, a query that only renames columns and orders rows is done in Arrow
        (``dpsql.engine._arrow_post``: the same table, without a DuckDB statement).
        """
        query = ast_builder("__released")
        if self._owned:
            try:
                done = projection(table, query, "__released")
            except pa.ArrowException:  # pragma: no cover - DuckDB answers whatever Arrow does not
                done = None
            if done is not None:
                return done
        failure: ExecutionError | None = None
        # a name of its own: a caller's temporary table or view named like a fixed one made the registration
        # fail (DuckDB's raw error before the charge once the query was bound, after it otherwise)
        raw = f"__dpsql_released_{secrets.token_hex(8)}"
        with self._lock, self._patient(), self._limited():
            cur = self._con
            try:
                try:
                    cur.register(raw, table)
                    if table.num_columns and isinstance(query, exp.Select):
                        query = query.with_("__released", as_=_binary_text_columns(table.schema, raw), copy=False)
                    else:  # pragma: no cover - every post-processing query is a SELECT over released columns
                        query = ast_builder(raw)
                    return cur.sql(self._render(query, copy=False)).to_arrow_table()  # built for this run
                except duckdb.Error as e:
                    failure = ExecutionError(
                        "post-processing (HAVING/ORDER BY/LIMIT) of the released values failed",
                        hint="check the types used in HAVING and ORDER BY",
                        debug_detail=self._detail(e),
                    )
            finally:
                try:
                    cur.unregister(raw)
                except duckdb.Error:
                    pass
        assert failure is not None
        raise failure


def _valid_utf8(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Bytes as UTF-8 text, each value that is not valid UTF-8 NULL: where the cast fails, the invalid values are
    found for the whole chunk at once (:func:`dpsql.engine._duckdb_native.invalid_mask`: steps validated in C++,
    numpy passes over a failing step's non-ASCII bytes; halving down to slices of 4096 values, then decoding each
    in Python, took twice as long on 2M values, 99% invalid)."""
    try:
        return arr.cast(target)
    except pa.ArrowInvalid:
        pass
    import pyarrow.compute as pc

    bad = pa.array(native.invalid_mask(arr), pa.bool_())
    return pc.if_else(bad, pa.nulls(len(arr), arr.type), arr).cast(target)


def _validated_text(raw: pa.Table, plans: list[tuple[pa.Field, pa.DataType, Any]],
                    cap: int | None) -> tuple[pa.Table, list[tuple[pa.Field, pa.DataType, Any]]]:
    """An Arrow table's top-level text columns (read as bytes, ``raw``) validated once, here: each value that is not
    UTF-8 NULL, the column given to DuckDB as text the view only caps. Decoded in the view under ``TRY(DECODE(...))``,
    each vector holding one invalid value was run again row by row (about 1.5 ms for 2048 rows), so one person's
    300 such rows, one per vector, made a read of 614 400 rows 0.55 s of CPU against 0.10 s in valid text. The table
    is copied here anyway (its text cast to bytes); a Parquet dataset, read afresh at each query, is not."""
    out = list(plans)
    for i, (f, read, _) in enumerate(plans):
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
            continue
        text = pa.large_string() if pa.types.is_large_binary(read) else pa.string()
        column = pa.chunked_array([_valid_utf8(c, text) for c in raw.column(i).chunks], text)
        raw = raw.set_column(i, pa.field(f.name, text), column)
        out[i] = (f, text, None if cap is None else (lambda e: _cap(e, cap, fn="STRLEN")))
    return raw, out


def _binary_text_columns(schema: pa.Schema, relation: str) -> exp.Select:
    """``SELECT`` every column of ``relation``, text ones ``COLLATE "binary"`` (dictionary-encoded
    text read as VARCHAR first)."""
    items: list[exp.Expression] = []
    for f in schema:
        col: exp.Expression = exp.column(f.name, quoted=True)
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            if pa.types.is_dictionary(f.type):
                col = exp.cast(col, "VARCHAR")
            col = exp.Collate(this=col, expression=exp.to_identifier("binary", quoted=True))
        items.append(exp.alias_(col, f.name, quoted=True))
    return exp.select(*items).from_(exp.to_table(relation, quoted=True))


#: the functions of a caller's connection that could stand in for DuckDB's own (:func:`_refuse_shadowed_functions`):
#: the owner's macros (in any schema of any attached database), and the built-in catalog's core functions, where a
#: Python function registered with ``con.create_function`` lands as one more overload
#: (no filter: at a caller's ``logging_level = 'TRACE'`` DuckDB's logger records a filter's adaptive order; NULLs for the rest)
_FUNCTIONS = ("SELECT list(CASE WHEN NOT internal THEN function_name END), list(CASE WHEN database_name = 'system' "
              "THEN CASE WHEN extension_name IS NULL THEN function_name END END) FROM system.main.duckdb_functions()")


@functools.cache
def _builtin_functions() -> tuple[frozenset[str], Counter[str]]:
    """DuckDB's own functions, as a fresh connection of this process has them: every name (lower case), and how
    many overloads each core function has (the second list of :data:`_FUNCTIONS`)."""
    con = duckdb.connect()
    try:
        rows = con.sql("SELECT function_name, database_name = 'system' AND extension_name IS NULL "
                       "FROM duckdb_functions() WHERE internal").fetchall()
    finally:
        con.close()
    return frozenset(str(n).lower() for n, _ in rows), Counter(str(n) for n, core in rows if core)


def _refuse_shadowed_functions(macros: list[str] | None, core: list[str] | None) -> None:
    """A caller's connection on which a name of DuckDB's own functions calls the owner's code: a macro
    (``CREATE MACRO least(a, b) AS a``, also TEMP, in another schema or attached database; DuckDB looks a name up in
    the user's schemas before its built-ins, operators such as ``+`` included) or a Python function registered under
    such a name (``con.create_function("least", ...)``, an overload that wins for its argument types). dpsql's
    bounded query clamps values and caps each person's rows with these functions (``LEAST``, ``GREATEST``, ``HASH``,
    ``COUNT``, ...), and the analyst's allow-listed functions have their bounds derived from DuckDB's meaning: a
    ``least`` that returned its first argument released a SUM of one person's unclamped value. Refused, for free, naming
    the functions (the owner's own names, no value)."""
    names, overloads = _builtin_functions()
    found = sorted({str(m) for m in macros or () if m is not None and str(m).lower() in names}
                   | {n for n, c in Counter(str(n) for n in core or () if n is not None).items()
                      if n.lower() in names and c > overloads[n]})
    if found:
        raise ConfigError(
            f"the DuckDB connection defines functions named like DuckDB's own ({', '.join(map(repr, found))}): dpsql's "
            "private queries would call them in place of DuckDB's (its bounding of each person's contribution among "
            "them), so the connection cannot answer privately; nothing was charged",
            hint="drop or rename these macros (DROP MACRO name) and register Python functions under names of their "
                 "own (con.remove_function(name) removes DuckDB's function of that name too: open a new connection), "
                 "or give this Session a connection without them (or none: dpsql opens its own)",
        )


def _refuse_query_log(path: Any) -> None:
    """A caller's connection whose ``log_query_path`` is set writes every statement's text to that file:
    dpsql's bounded queries hold the query's secret salt (its bounding, the keyed spread of
    (person, key) and the S4S join sample, whose amplification needs the sample unknown). Setting it
    aside and back would truncate the caller's file, so such a connection is refused, for free."""
    if path:
        raise ConfigError(
            "the DuckDB connection logs every statement to a file (log_query_path): dpsql's private queries hold "
            "their secret salt, which must not be written anywhere; nothing was charged",
            hint="unset it on the connection (SET log_query_path = '') while dpsql queries it, or let dpsql "
                 "open its own connection",
        )


class _Dataset:
    """A Parquet source's pyarrow dataset (``raw``, read as ``target``; None for DuckDB's own reader, which
    reads the files afresh): its files, their footers' schemas and version when it was made."""

    def __init__(self, paths: list[str], schemas: list[pa.Schema], target: pa.Schema | None, raw: str | None,
                 version: native.Version) -> None:
        self.paths, self.schemas, self.target, self.raw, self.version = paths, schemas, target, raw, version


def _csv_delimiter(source: str) -> str:
    """A CSV source's field delimiter: tab for ``.tsv`` (``.tsv.gz``) files, else a comma."""
    return "\t" if source.lower().endswith((".tsv", ".tsv.gz")) else ","


def _check_spill_dir(path: str) -> None:
    """Refuse, before anything is charged, an owner's ``temp_directory`` that cannot be a directory (it, or
    a directory above it, is a file) or cannot be made in its nearest existing directory: every read of a
    CSV table (whose copies go there) and every query that spills failed after its charge. Then make it where it is
    missing (mode 0700, the directories above it too)."""
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p) or not os.access(p, os.W_OK | os.X_OK):
        why = "is not a directory" if not os.path.isdir(p) else "is not writable"
        raise ConfigError(f"engine setting temp_directory {path!r} cannot be used: {p} {why}; nothing was charged",
                          hint="the data owner sets temp_directory to a directory the engine can create and write, e.g. "
                          "temp_directory = \"/var/tmp/dpsql\" under [engine], or removes it (the system's temporary directory)")
    # made here, mode 0700, with the directories above it where missing: DuckDB makes it at its first spill with the
    # process's umask (0755, its files 0644: private rows readable by every user), and none above it (every query that
    # spilled failed after its charge)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"engine setting temp_directory {path!r} cannot be used: it cannot be made "
                          f"({e.strerror or type(e).__name__}); nothing was charged",
                          hint="the data owner sets temp_directory to a directory the engine can create and write, e.g. "
                          "temp_directory = \"/var/tmp/dpsql\" under [engine], or removes it (the system's temporary directory)") from None


def _sql_str(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"




#: the name other modules know the DuckDB backend by
Engine = DuckDBBackend
