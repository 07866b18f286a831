"""The durable privacy-budget ledger (design invariants 3 and 6).

A ledger is a DuckDB file holding a versioned schema (``schema.sql`` in this package), the total
budget and its change log, and one row per charge: ``reserve`` (before any private row is read)
then ``commit`` or ``fail``; failed runs still count. Next to it, ``.<file>.generation`` (and an
extended attribute of the file) records the last acknowledged change, so a ledger that lost changes
is refused. See
``dpsql.ledger._store`` for the concurrency and durability argument and what DuckDB guarantees.
"""

from dpsql.ledger._store import (
    COUNTING_STATUSES,
    GENERATION_SUFFIX,
    SCHEMA_VERSION,
    Ledger,
    LedgerEntry,
    schema_sql,
)

__all__ = ["Ledger", "LedgerEntry", "SCHEMA_VERSION", "COUNTING_STATUSES", "GENERATION_SUFFIX", "schema_sql"]
