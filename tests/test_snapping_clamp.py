"""Regression (review finding): the snapping bound B = 2^K Lambda depends only on epsilon and the
sensitivity, so a large epsilon gives a small B and a true value above B is released as B.

With K capped at 30, epsilon = 1e5 gave B = 2^30 * 2^-16 = 16384, and a table of 20 000 people
was released as 16 384 with an interval of a fraction of a unit. K now goes up to 40 (the
theorem allows 2^41): B = 2^40 * 2^-16 = 2^24; and a value released at the bound is flagged in
the accuracy (``clamped_at_bound``), since the interval does not cover it."""

from __future__ import annotations

import warnings

import duckdb

import dpsql
from dpsql import Budget
from dpsql.testing import seeded_noise, use_noise

N = 20_000


def release(n: int) -> tuple[int, float]:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE people AS SELECT i AS uid FROM range({n}) r(i)")
    s = dpsql.Session(budget=Budget(1e6, 1e-3), connection=con)
    use_noise(s, seeded_noise(7))
    s.register("t", "people", privacy_unit="uid")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "epsilon is unusually large"
        r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=1e5)
    return int(r.table.column("n")[0].as_py()), float(r.accuracy["n"]["ci95_half_width"])


def test_control_small_table_inside_bound() -> None:
    value, ci = release(10_000)
    assert abs(value - 10_000) <= ci


def test_released_count_within_claimed_interval_for_large_epsilon() -> None:
    value, ci = release(N)
    assert abs(value - N) <= ci, f"released {value} for a true count of {N}, claimed +/- {ci}"


def test_a_value_released_at_the_bound_is_flagged() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE people AS SELECT i AS uid FROM range(40000) r(i)")
    s = dpsql.Session(budget=Budget(1e12, 1e-3), connection=con)
    use_noise(s, seeded_noise(7))
    s.register("t", "people", privacy_unit="uid")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # eps = 1e8: share 1e5, K = 40, lambda ~ 1e-8, Lambda = 2^-26, B = 2^14 = 16384 < 40000
        r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=1e8)
    assert r.table.column("n")[0].as_py() == 16384
    assert r.accuracy["n"]["clamped_at_bound"] is True and r.accuracy["n"]["snapping_bound"] == 16384
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ok = s.query("SELECT COUNT(*) AS n FROM t WHERE uid < 100", epsilon=1e8)
    assert "clamped_at_bound" not in ok.accuracy["n"]
