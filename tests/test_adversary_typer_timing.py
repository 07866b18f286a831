"""Attack: the TRY backstop is analyst-triggerable, and its cost is analyst-chosen.

The typer renders every integer ``//`` and ``%`` as ``TRY(a // b)`` around the whole operand
subtree. When one row makes the operator fail (here: -2^63 // -1, an overflow), DuckDB
re-evaluates the TRY's entire subtree row by row for the failing row's vector (up to 2048
rows). The analyst makes that subtree expensive with allow-listed, capped functions and gates
the failure on a secret, so one person's salary bit doubles the run time of a query over
ordinary 1 KB text values: a timing channel of hundreds of milliseconds, against the
threat model's statement that one row changes the run time by its own per-row cost (about a
microsecond; "of the order of the noise floor").

This is a timing measurement, so it uses a wide margin: it fails on the current code by a
factor (about 1.6x); after a fix (no TRY over analyst-sized subtrees, e.g. operands hoisted
into a lower projection, or explicit guards instead of TRY) the two times agree.

Cause: dpsql/plan/typer.py ``Typer.t`` (IntDiv/Mod → ``exp.Try(this=e)`` over the operands'
whole rendered subtree) and ``_arith`` / ``_unary_numeric`` (the same for HUGEINT-sized
arithmetic and DECIMAL rounding).
"""

from __future__ import annotations

import time

import duckdb

import dpsql
from dpsql.budget import Budget

USERS = 4096
TERMS = 12


def _run(s: dpsql.Session, secret: bool) -> float:
    threshold = 0 if secret else 10**9  # the secret: does user 77 earn at least `threshold`?
    heavy = "greatest(" + ", ".join(f"length(reverse(note || '{i}'))" for i in range(TERMS)) + ")"
    sql = (
        "SELECT COUNT(*) AS n FROM t WHERE uid < 2048 AND "
        f"((CASE WHEN uid = 77 AND salary >= {threshold} THEN -9223372036854775808 ELSE {heavy} END) // -1) < 0"
    )
    t0 = time.perf_counter()
    s.query(sql, epsilon=1.0)
    return time.perf_counter() - t0


def test_one_rows_secret_changes_the_run_time_through_the_try_fallback() -> None:
    con = duckdb.connect()
    # ordinary data: 1024 CJK characters of text per person (well under max_text_bytes)
    con.execute(
        f"CREATE TABLE t AS SELECT k AS uid, repeat(chr(20013), 1024) AS note, (k * 37) % 100000 AS salary "
        f"FROM range(0, {USERS}) r(k)"
    )
    s = dpsql.Session(budget=Budget(1e6, 0.9), connection=con)
    try:
        s.register("t", "t", privacy_unit="uid")
        _run(s, False)  # warm-up
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(3):
            for secret in (False, True):
                times[secret].append(_run(s, secret))
    finally:
        s.close()
        con.close()
    fast, slow = min(times[False]), min(times[True])
    assert slow < 1.2 * fast + 0.05, (
        f"one person's salary bit changes the run time: {fast:.3f} s when false, {slow:.3f} s when true "
        f"(all runs: {times})"
    )
