"""SUM / AVG over joins with bounds near the DOUBLE range: refused for free, as on one table.

The join mechanisms truncate weights normalised to [0, 1] and multiply the noisy result by the bound at the end:
with bounds of about 1e308 that product overflowed. DP-S4S released NaN (the positive part's inf plus the negative
part's -inf) or inf, after its charge; R2T was refused with an internal message about JSON parameters; GROUP BY
said 'clip_norm must be a positive number, got None' where no clip_norm was given. One table refuses bounds beyond
1e15 in magnitude (docs/sql.md); joins now do the same, before any charge."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

JOIN = "FROM orders o JOIN customer c ON o.ck = c.ck"


def session(hi: float) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    n = 30
    s.register("customer", pa.table({"ck": list(range(n)), "seg": ["a", "b"] * (n // 2)}), privacy_unit="ck",
               max_rows_per_unit=1, columns={"seg": {"domain": ["a", "b"]}})
    s.register("orders", pa.table({"ok": list(range(2 * n)), "ck": [i % n for i in range(2 * n)],
                                   "amt": [hi if i % 2 else -hi for i in range(2 * n)]}),
               references={"ck": "customer.ck"}, degree_bounds={"ck": 3}, columns={"amt": {"bounds": (-hi, hi)}})
    use_noise(s, zero_noise(3))
    return s


CASES = [
    (f"SELECT SUM(o.amt) {JOIN}", {"mechanism": "dp_s4s", "q": 1.0}, 0.0),
    (f"SELECT SUM(o.amt) {JOIN}", {"mechanism": "r2t"}, 0.0),
    (f"SELECT AVG(o.amt) {JOIN}", {"mechanism": "r2t"}, 0.0),
    (f"SELECT c.seg, SUM(o.amt) {JOIN} GROUP BY c.seg", {}, 1e-6),
    (f"SELECT c.seg, SUM(o.amt) {JOIN} GROUP BY c.seg", {"mechanism": "dp_s4s"}, 1e-6),
    (f"SELECT SUM(LEAST(GREATEST(o.amt, -1e300), 1e300)) {JOIN}", {"mechanism": "dp_s4s", "q": 1.0}, 0.0),
]


@pytest.mark.parametrize(("sql", "opts", "delta"), CASES)
def test_bounds_beyond_1e15_are_refused_for_free(sql: str, opts: dict[str, Any], delta: float) -> None:
    s = session(1.7e308)
    try:
        before = s.remaining()
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match=r"too large \(at most 1e15 in magnitude\)"):
            s.explain(sql, epsilon=1.0, delta=delta, options=opts)
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match=r"too large \(at most 1e15 in magnitude\)"):
            s.query(sql, epsilon=1.0, delta=delta, options=opts)
        assert s.remaining() == before and s.history().num_rows == 0
    finally:
        s.close()


@pytest.mark.parametrize(("sql", "opts", "delta"), CASES)
def test_bounds_of_1e15_are_answered_with_finite_values(sql: str, opts: dict[str, Any], delta: float) -> None:
    """Control: at the limit every release is a finite number."""
    s = session(1e15)
    try:
        r = s.query(sql.replace("1e300", "1e15"), epsilon=1.0, delta=delta, options=opts)
        vals = [v for c in r.table.columns for v in c.to_pylist() if isinstance(v, float)]
        assert vals and all(math.isfinite(v) for v in vals)
    finally:
        s.close()
