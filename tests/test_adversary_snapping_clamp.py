"""Adversarial: the snapping bound B = 2^K Lambda (K <= 30) depends only on epsilon and the
sensitivity, so a large epsilon gives a small B and a true value above B is released as B,
while the release's accuracy (ci95_half_width) claims an error of a fraction of a unit.

By hand, epsilon = 1e5, COUNT(*) with sensitivity 1: share = eps/1000 = 100, K = 30;
lambda = 1/(1e5 - 2^-45 (2^31 + 2)) ~ 1e-5, Lambda = 2^-16, B = 2^30 * 2^-16 = 16384.
A table of 20 000 people is released as 16 384, far outside the claimed interval."""

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
