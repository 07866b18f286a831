"""Published 95% intervals are honest: they cover the bounded truth at (at least) the nominal
rate, checked with an exact binomial test at failure probability 1e-6, and a deliberately
narrowed interval is caught."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from scipy import stats

import dpsql
from dpsql.testing import seeded_noise, use_noise

ALPHA = 1e-6


def _session(seed: str) -> tuple[dpsql.Session, dict[str, int], dict[str, float]]:
    gen = np.random.default_rng(17)
    keys = [f"k{i}" for i in range(3000)]
    sizes = gen.integers(0, 40, len(keys))
    uid, key, amount = [], [], []
    u = 0
    for k, n in zip(keys, sizes):
        for _ in range(int(n)):
            uid.append(u)
            key.append(k)
            amount.append(float(gen.uniform(0, 50)))
            u += 1
    t = pa.table({"user_id": pa.array(uid, pa.int64()), "k": key, "amount": amount})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    use_noise(s, seeded_noise(seed))
    s.register("t", t, privacy_unit="user_id", columns={"k": {"domain": keys}, "amount": {"bounds": (0, 50)}})
    truth_n = dict(zip(keys, (int(v) for v in sizes)))
    sums: dict[str, float] = {k: 0.0 for k in keys}
    for k, a in zip(key, amount):
        sums[k] += a
    return s, truth_n, sums


def _coverage(seed: str, shrink: float = 1.0) -> tuple[int, int]:
    s, truth_n, truth_s = _session(seed)
    r = s.query("SELECT k, COUNT(*) AS n, SUM(amount) AS total FROM t GROUP BY k", epsilon=1.0, delta=1e-5)
    hw_n = r.accuracy["n"]["ci95_half_width"] * shrink
    hw_s = r.accuracy["total"]["ci95_half_width"] * shrink
    covered = 0
    total = 0
    for row in r.table.to_pylist():
        covered += abs(row["n"] - truth_n[row["k"]]) <= hw_n
        covered += abs(row["total"] - truth_s[row["k"]]) <= hw_s
        total += 2
    return covered, total


def _below_nominal(k: int, n: int) -> bool:
    """Reject 'coverage >= 95%' at level ALPHA (one-sided exact binomial test)."""
    return stats.binomtest(k, n, 0.95, alternative="less").pvalue < ALPHA


def test_intervals_cover_the_bounded_truth():
    k, n = _coverage("coverage")
    assert n == 6000
    assert not _below_nominal(k, n), (k, n)
    assert k / n < 0.99  # not vacuous either


def test_narrowed_intervals_are_caught():
    k, n = _coverage("coverage-control", shrink=0.7)
    assert _below_nominal(k, n), (k, n)
