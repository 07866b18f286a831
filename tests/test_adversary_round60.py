"""GROUP BY over declared keys: the free check of the conditions on the keys alone.

* ``HAVING COUNT(*) > 0 AND CAST(c AS INTEGER) = 1`` over a text key declared ``['1', 'x']`` released the row of
  key '1' (the release evaluates HAVING under TRY: 'x' does not convert, so its row is dropped). The check that
  refuses, for free, conditions on the keys that keep no declared key evaluated the key-only conjunct without TRY,
  over every declared key: 'x' failed the cast and the query was refused as an ExecutionError ('post-processing of
  the released values failed'). The check now evaluates the conjuncts as the release does.
* Over DAWA's histogram (declared bins, no declared domain) the same refusal listed the keys as 'x: ': it now lists
  the released keys' values (the bin labels).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


def _session() -> dpsql.Session:
    n = 40
    t = pa.table({"uid": list(range(n)), "c": ["1", "x"] * (n // 2)})
    s = dpsql.Session(budget=Budget(10.0, 0.9))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=1, columns={"c": {"domain": ["1", "x"]}})
    return s


@pytest.mark.parametrize("having", ["COUNT(*) > 0 AND CAST(c AS INTEGER) = 1", "n > 0 AND CAST(c AS INTEGER) = 1"])
def test_a_key_condition_that_fails_on_some_declared_keys_keeps_the_others(having: str) -> None:
    with _session() as s:
        r = s.query(f"SELECT c, COUNT(*) AS n FROM t GROUP BY c HAVING {having}", epsilon=1.0, delta=1e-6)
        assert r.to_pylist() == [{"c": "1", "n": 20}]


def test_negative_control_a_key_condition_that_fails_on_every_declared_key_is_refused_for_free() -> None:
    with _session() as s:
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match="exclude every declared key"):
            s.query("SELECT c, COUNT(*) AS n FROM t GROUP BY c HAVING n > 0 AND CAST(c AS INTEGER) = 7",
                    epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0


def test_a_histogram_over_declared_bins_names_its_bins_when_the_conditions_keep_none() -> None:
    """DAWA's histogram releases the declared bins a condition on the key can hold (labelled with their lower edges):
    a HAVING on the key that keeps no label is refused for free, naming the labels (no declared domain lists them:
    the refusal said 'x: ')."""
    n = 100
    t = pa.table({"uid": list(range(n)), "x": pa.array([(i % 100) / 10 for i in range(n)])})
    with dpsql.Session(budget=Budget(10.0, 0.9)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="uid", columns={"x": {"bounds": (0, 10), "bin_width": 1}})
        assert len(s.query("SELECT x, COUNT(*) AS n FROM t GROUP BY x HAVING x > 8.5", epsilon=1.0).to_pylist()) == 1
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match=r"exclude every declared key \(x: 9\.0\)"):
            s.query("SELECT x, COUNT(*) AS n FROM t GROUP BY x HAVING x > 9.5", epsilon=1.0)
        assert s.remaining() == before and s.history().num_rows == 1
