"""Row caps keep uniform subsets (split from ``test_adversary_row_caps.py``, whose module docstring
describes the adversary and the statistics): L and k keep each subset of a unit's (group's) rows with
equal probability, NULL values counting as rows, and every aggregate of the query sees one joint choice."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_adversary_row_caps import _sql, _trials, _uniform
from test_bounding import plan_for, spec_for

from dpsql.rewrite.bound import Caps

# -- 2. uniform subsets -------------------------------------------------------------------------------------


# one user, one group, rows (x, y) = (1, NULL), (NULL, 10), (2, 20), (NULL, NULL), k = 2: each of
# the 6 two-row subsets has probability 1/6, and (COUNT(x), SUM(x), COUNT(y), SUM(y)) names it
NULL_ROWS = pa.table({"user_id": pa.array([4] * 4, type=pa.int64()), "g": ["a"] * 4,
                      "x": pa.array([1.0, None, 2.0, None]), "y": pa.array([None, 10.0, 20.0, None])})
SUBSETS = {  # rows kept -> (COUNT(x), SUM(x), COUNT(y), SUM(y))
    (0, 1): (1, 1.0, 1, 10.0), (0, 2): (2, 3.0, 1, 20.0), (0, 3): (1, 1.0, 0, 0.0),
    (1, 2): (1, 2.0, 2, 30.0), (1, 3): (0, 0.0, 1, 10.0), (2, 3): (1, 2.0, 1, 20.0),
}
NULL_SQL = "SELECT g, COUNT(*), SUM(x), COUNT(x), SUM(y), COUNT(y) FROM t GROUP BY g"


def _subset_counts(runs: list[list[dict[str, Any]]]) -> list[int]:
    names = {v: k for k, v in SUBSETS.items()}
    seen = Counter()
    for r in runs:
        assert len(r) == 1 and r[0]["__a0"] == 2 and r[0]["__users"] == 1
        key = (int(r[0]["__a2"]), float(r[0]["__a1"]), int(r[0]["__a4"]), float(r[0]["__a3"]))
        seen[names.get(key, "not a pair of rows")] += 1
    return [seen[k] for k in SUBSETS] + [seen["not a pair of rows"]]


@pytest.mark.parametrize("caps", [Caps(1, 2), Caps(1, 2, 3)], ids=["k", "L-then-k"])
def test_k_rows_with_null_values_are_a_uniform_pair_chosen_jointly(caps: Caps) -> None:
    plan = plan_for(NULL_SQL, spec_for("t", NULL_ROWS, bounds={"x": (0, 5), "y": (0, 50)}))
    n = 1200
    counts = _subset_counts(_trials(plan, caps, NULL_ROWS, n, seed=0.11))
    assert counts[-1] == 0, counts  # every run keeps one pair of rows for all four aggregates
    assert _uniform(counts[:-1], n, [1 / 6] * 6), counts
    # negative control: rows ordered by their x value first (NULL last), the draw breaking ties only:
    # the pair (1, NULL) / (2, 20) every time, which the same test refuses
    def by_value_first(sql: str) -> str:
        if "ORDER BY __rnd__rows)" in sql:  # the window (L = 3, then k = 2)
            assert sql.count("ORDER BY __rnd__rows)") == 1
            return sql.replace("ORDER BY __rnd__rows)", "ORDER BY __a1_v NULLS LAST, __rnd__rows)")
        # first and last by draw (k = 2): by x first (NULL last; values 1 and 2 differ by more than a draw)
        assert sql.count(", __rnd__rows)") == 8  # ARG_MIN_NULL and ARG_MAX_NULL of four value columns
        return sql.replace(", __rnd__rows)", ", COALESCE(__a1_v * 2, 1e9) + __rnd__rows)")

    biased = _subset_counts(_trials(plan, caps, NULL_ROWS, n, seed=0.11, edit=by_value_first))
    assert not _uniform(biased[:-1], n, [1 / 6] * 6), biased
    # negative control of the joint choice: x and y each from its own uniform pair of rows (two
    # draws), simulated with a fixed seed: pairs that are no pair of rows appear, which the test refuses
    rng = np.random.default_rng(5)
    pairs = list(SUBSETS)
    split = []
    for _ in range(n):
        px, py = pairs[rng.integers(6)], pairs[rng.integers(6)]
        cx, sx = SUBSETS[px][:2]
        cy, sy = SUBSETS[py][2:]
        split.append([{"__a0": 2, "__users": 1, "__a1": sx, "__a2": cx, "__a3": sy, "__a4": cy}])
    assert _subset_counts(split)[-1] > 0


ONE_COLUMN = pa.table({"user_id": pa.array([6] * 4, type=pa.int64()), "g": ["a"] * 4,
                        "x": pa.array([1.0, None, 2.0, None])})


@pytest.mark.parametrize("sql,caps", [
    ("SELECT g, COUNT(*), SUM(x), COUNT(x) FROM t GROUP BY g", Caps(1, 2)),
    ("SELECT g, COUNT(*), SUM(x), COUNT(x) FROM t GROUP BY g", Caps(1, 2, 3)),
    ("SELECT COUNT(*), SUM(x), COUNT(x) FROM t", Caps(1, 2)),
    ("SELECT COUNT(*), SUM(x), COUNT(x) FROM t", Caps(1, math.inf, 2)),
], ids=["k", "L-then-k", "ungrouped-k", "ungrouped-L"])
def test_one_value_column_keeps_null_rows_as_often_as_others(sql: str, caps: Caps) -> None:
    # one value column: DuckDB runs the window as ARG_MIN(x, draw, n) with x itself, not a struct
    # of the row; a NULL x must still count as a row. Rows x = 1, NULL, 2, NULL: (COUNT(x),
    # SUM(x)) of the two kept is (1, 1) w.p. 2/6, (2, 3) 1/6, (1, 2) 2/6, (0, 0) 1/6; COUNT(*) is always 2
    plan = plan_for(sql, spec_for("t", ONE_COLUMN, bounds={"x": (0, 5)}))
    assert "RANDOM() AS __rnd" in _sql(plan, caps)
    n = 1200
    runs = _trials(plan, caps, ONE_COLUMN, n, seed=0.71)
    assert all(len(r) == 1 and r[0]["__a0"] == 2 for r in runs)
    seen = Counter((int(r[0]["__a2"]), float(r[0]["__a1"])) for r in runs)
    outcomes, probs = [(1, 1.0), (2, 3.0), (1, 2.0), (0, 0.0)], [2 / 6, 1 / 6, 2 / 6, 1 / 6]
    assert set(seen) <= set(outcomes), seen
    assert _uniform([seen[o] for o in outcomes], n, probs), seen
    # negative control: an ARG_MIN that skips NULL arguments would keep (1, 2) every time
    assert not _uniform([0, n, 0, 0], n, probs)


def test_l_then_k_keeps_a_uniform_subset_of_the_unit_then_of_its_group() -> None:
    # one user, rows a: 1, 2, 4 and b: 8; L = 3, then k = 1 (C_u = 2 keeps both groups). L keeps 3
    # of the 4 rows uniformly (each triple 1/4); then each group one of its kept rows uniformly:
    #   b dropped by L (1/4): a keeps 1, 2 or 4, 1/12 each;
    #   b kept (3/4): a kept two of its three rows, and keeps each value with probability 1/4.
    t = pa.table({"user_id": pa.array([9] * 4, type=pa.int64()), "g": ["a", "a", "a", "b"], "x": [1.0, 2.0, 4.0, 8.0]})
    plan = plan_for("SELECT g, SUM(x) FROM t GROUP BY g", spec_for("t", t, bounds={"x": (0, 10)}))
    outcomes = [(1.0, True), (2.0, True), (4.0, True), (1.0, False), (2.0, False), (4.0, False)]
    probs = [1 / 4, 1 / 4, 1 / 4, 1 / 12, 1 / 12, 1 / 12]
    n = 1200

    def counts(runs: list[list[dict[str, Any]]]) -> list[int]:
        seen = Counter()
        for r in runs:
            by = {row["__k0"]: row for row in r}
            assert set(by) <= {"a", "b"} and "a" in by and all(row["__a0"] in (1.0, 2.0, 4.0, 8.0) for row in r)
            seen[(by["a"]["__a0"], "b" in by)] += 1
        return [seen[o] for o in outcomes]

    sql = _sql(plan, Caps(2, 1, 3))
    assert "ORDER BY __rnd__unit_rows" in sql and "ORDER BY __rnd__rows" in sql
    got = counts(_trials(plan, Caps(2, 1, 3), t, n, seed=0.27))
    assert _uniform(got, n, probs), got
    # negative control: k before L (k = 1 leaves 2 rows, which L = 3 keeps: b never dropped, a
    # uniform over 1, 2, 4); that is what the caps give without L, run the same way
    wrong = counts(_trials(plan, Caps(2, 1), t, n, seed=0.27))
    assert wrong[3:] == [0, 0, 0]
    assert not _uniform(wrong, n, probs), wrong


def test_l_alone_keeps_a_uniform_subset_of_rows() -> None:
    # one user, one group, values 1, 1, 2, 4, L = 2 and no k: each of the 6 pairs of rows is equally
    # likely (identical rows draw separately): kept sum 2 w.p. 1/6, 3 w.p. 2/6, 5 w.p. 2/6, 6 w.p. 1/6
    t = pa.table({"user_id": pa.array([5] * 4, type=pa.int64()), "g": ["a"] * 4, "x": [1.0, 2.0, 1.0, 4.0]})
    plan = plan_for("SELECT g, SUM(x) FROM t GROUP BY g", spec_for("t", t, bounds={"x": (0, 10)}))
    caps = Caps(1, math.inf, 2)
    sql = _sql(plan, caps)
    assert "ARG_MAX_NULL(__a0_v, __rnd__unit_rows)" in sql and "__rnd__rows" not in sql  # L = 2: first and last
    n = 1200
    sums = Counter(r[0]["__a0"] for r in _trials(plan, caps, t, n, seed=0.53))
    assert set(sums) <= {2.0, 3.0, 5.0, 6.0}, sums
    probs = [1 / 6, 2 / 6, 2 / 6, 1 / 6]
    assert _uniform([sums[2.0], sums[3.0], sums[5.0], sums[6.0]], n, probs), sums
    # negative control: the two distinct values 1 merged into one row ({1, 2}, {1, 4}, {2, 4}, 1/3
    # each: the sum 2 never, 3, 5, 6 n/3 each) fails the same test
    assert not _uniform([0, n // 3, n // 3, n - 2 * (n // 3)], n, probs)
