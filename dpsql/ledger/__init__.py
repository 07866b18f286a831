"""The durable privacy-budget ledger (design invariants 3 and 6).

A ledger is a DuckDB file holding a versioned schema (``schema.sql`` in this package), the total
budget and its change log, and one row per charge: ``reserve`` (before any private row is read)
then ``commit`` or ``fail``; failed runs still count. Next to it, ``.<file>.generation`` (and an
extended attribute of the file) records the last acknowledged change, so a ledger that lost changes
is refused. See
``dpsql.ledger._store`` for the concurrency and durability argument and what DuckDB guarantees.
"""

from __future__ import annotations

import os

from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.ledger._store import (
    COUNTING_STATUSES,
    GENERATION_SUFFIX,
    SCHEMA_VERSION,
    Ledger,
    LedgerEntry,
    schema_sql,
)

__all__ = ["open_ledger", "check_reachable", "Ledger", "LedgerEntry", "SCHEMA_VERSION", "COUNTING_STATUSES", "GENERATION_SUFFIX", "schema_sql"]


def open_ledger(
    ledger: str | os.PathLike[str] | None, budget: Budget | None, *, create: bool = False, lock_timeout: float = 10.0
) -> Ledger:
    """The ledger a Session charges: a file (created only when asked), a PostgreSQL database
    (``postgresql://...``: one budget shared by many hosts, ``dpsql.ledger._postgres``), or an
    in-memory one with an explicit total (notebooks and tests only: it forgets everything on exit)."""
    if budget is not None and not isinstance(budget, Budget):
        raise ConfigError("budget must be a dpsql.Budget(epsilon, delta)", hint="budget=dpsql.Budget(1.0, 1e-6)")
    if ledger is not None and os.fspath(ledger) == ":memory:":
        ledger = None  # the same spelling as the config's [ledger] path = ":memory:"
    if ledger is not None and not os.fspath(ledger).strip():
        raise ConfigError("the ledger path is empty", hint="pass a file name such as ledger.duckdb, or None for an in-memory ledger")
    if ledger is None:
        if budget is None:
            raise ConfigError(
                "an in-memory ledger needs a total budget",
                hint="Session(ledger=None, budget=dpsql.Budget(1.0, 1e-6)), or pass a ledger file path",
            )
        return Ledger.create(None, budget)
    if isinstance(ledger, str) and ledger.startswith(("postgresql://", "postgres://")):
        from dpsql.ledger._postgres import PostgresLedger

        return PostgresLedger.open(ledger, budget, create=create, lock_timeout=lock_timeout)
    return Ledger.open(os.fspath(ledger), budget, create=create, lock_timeout=lock_timeout)


def check_reachable(ledger: str | os.PathLike[str] | None, engine_kind: str, *, lock_timeout: float = 10.0) -> None:
    """A PostgreSQL ledger that cannot be reached (a wrong URL, password or server), said before an engine that is
    slow to start starts (Spark: a JVM, a cluster's registration; the tables' registration after it) rather than
    after it: one connection, closed at once; nothing is read or written (the same LedgerError as opening it)."""
    if engine_kind == "spark" and isinstance(ledger, str) and ledger.startswith(("postgresql://", "postgres://")):
        from dpsql.ledger._postgres import PostgresLedger

        led = PostgresLedger(ledger, lock_timeout=lock_timeout)
        led._connect("nothing was changed").close()
        led.close()
