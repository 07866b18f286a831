"""One person's huge value on a caller's DuckDB connection: the outcomes of a query on neighbouring tables.

``t (uid BIGINT, <column>)`` holds 200 people with a short value each; the hostile neighbour adds one more
person through ``hostile`` (an INSERT statement). Each side runs in a fresh Session with zero noise and a 1 s
statement time-out (by default), so a value that makes the query slow shows as a failure on one side only."""

from __future__ import annotations

from typing import Any

import duckdb

import dpsql
from dpsql.errors import DPSQLError
from dpsql.testing import use_noise, zero_noise

#: the hostile person's unit id
HOSTILE = 999


def outcome(s: dpsql.Session, sql: str) -> tuple[str, Any]:
    """("ok", None), or ("error", the exception's class name)."""
    try:
        s.query(sql, epsilon=1.0)
        return ("ok", None)
    except DPSQLError as e:
        return ("error", type(e).__name__)


def neighbour_outcomes(column: str, short: str, hostile: str, sql: str, *, seed: int = 40,
                       timeout: float = 1) -> list[tuple[str, Any]]:
    """The outcomes of ``sql`` without and with the hostile person: ``column`` is the value column's
    definition (``bits BIT``), ``short`` the SQL of each of the 200 short values (over ``range(200) r(i)``),
    ``hostile`` the statement that adds the person; ``timeout`` the statement time-out in seconds."""
    outcomes = []
    for with_hostile in (False, True):
        con = duckdb.connect()
        con.execute(f"CREATE TABLE t (uid BIGINT, {column})")
        con.execute(f"INSERT INTO t SELECT i, {short} FROM range(200) r(i)")
        if with_hostile:
            con.execute(hostile)
        with dpsql.Session(budget=dpsql.Budget(1e6, 0.5), connection=con, engine={"statement_timeout": timeout}) as s:
            use_noise(s, zero_noise(seed))
            s.register("t", "t", privacy_unit="uid")
            outcomes.append(outcome(s, sql))
        con.close()
    return outcomes
