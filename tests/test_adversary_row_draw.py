"""Attacks on the k = 1 row choice (one row per (unit, group) among several).

On an engine that owns its DuckDB connection the choice is ``ARG_MIN(values, RANDOM())``: a fresh
per-row draw of the connection's generator. These tests check what that choice must give for the
sensitivity argument: each row kept with probability one over its group's rows (NULL values
included), several value columns taken from one and the same row, one evaluation of the draw per
query (every released column of a unit from its one kept row), and randomness that nothing but OS
entropy fixes -- in particular not the state of a connection the caller hands to the Session.
"""

from __future__ import annotations

import secrets
from collections import Counter
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from scipy.stats import binomtest

import dpsql
from dpsql.rewrite.bound import SALT_PLACEHOLDER

ALPHA = 1e-6  # family-wise failure probability of each statistical test


def _session(table: pa.Table, connection: duckdb.DuckDBPyConnection | None = None, **columns: Any) -> dpsql.Session:
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10, 1e-3), connection=connection)
    s.register("t", table, privacy_unit="user_id", max_groups_per_unit=1, max_rows_per_group=1,
               columns={c: {"bounds": list(b)} for c, b in columns.items()})
    return s


def _varies(outcomes: list[Any]) -> bool:
    return len({repr(o) for o in outcomes}) > 1


# -- randomness the caller's connection cannot fix --------------------------------------------------------------


def test_seeded_caller_connection_does_not_fix_the_row_choice() -> None:
    # The owner hands the Session its own DuckDB connection, on which it called setseed (for
    # reproducible sampling of its own). RANDOM() on that connection is then a fixed sequence:
    # each row's draw is fixed by its scan position, so which row a unit keeps is a function of
    # how many rows (of other people) come before it -- removing one person changes every later
    # person's kept row, beyond the declared caps. The choice must stay fresh per query.
    # One unit, one group, two rows (x = 0 and x = 1): 40 queries, each after setseed(0.5), must
    # not all keep the same row (P = 2 * 2^-40 < 1e-11 for a fresh uniform choice).
    t = pa.table({"user_id": pa.array([7, 7], type=pa.int64()), "g": ["a", "a"], "x": [0.0, 1.0]})
    con = duckdb.connect()
    with _session(t, con, x=(0, 1)) as s:
        sql = s.explain("SELECT g, SUM(x) FROM t GROUP BY g", epsilon=1, delta=1e-6).bounded_sql
        assert SALT_PLACEHOLDER in sql
        kept = []
        for _ in range(40):
            con.execute("SELECT setseed(0.5)").fetchall()
            kept.append(con.execute(sql.replace(SALT_PLACEHOLDER, secrets.token_hex(16))).fetchall())
    assert all(len(k) == 1 and k[0][1] == 1 for k in kept)
    assert _varies([k[0][2] for k in kept]), kept[0]
    # negative control: a choice fixed by the connection's seed does not vary
    assert not _varies([1.0] * 40)
