"""The sensitivities of centred sums (AVG, VARIANCE / STDDEV) are those of the values the engine
computes: fl(clamp(v) - shift) with shift = fl((lo + hi) / 2), whose magnitude can exceed
(hi - lo) / 2 when the midpoint is rounded at the bounds' magnitude. With adjacent doubles
lo < hi (an analyst may write them as literal LEAST/GREATEST bounds), shift is lo or hi and one
person moves the centred sum by hi - lo, twice (hi - lo) / 2 (and the sum of squares by four
times ((hi - lo) / 2)^2). ``dpsql.rewrite.bound.released_columns`` takes the magnitudes from
``_value_range`` (products rounded up); checked here on neighbouring datasets D, D + one person."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from test_bounding import plan_for, run_bounded, spec_for

from dpsql.rewrite.bound import Caps, released_columns

CASES = [
    (5e14, math.nextafter(5e14, math.inf)),  # adjacent doubles: shift = lo, values 0 and hi - lo
    (-0.6285009366462934, math.nextafter(-0.6285009366462934, math.inf)),
    (1710485.3521289863, 1710708.8390226322),  # rounded midpoint, values 1.2e-10 beyond (hi - lo) / 2
    (0.1, 0.3),
]


def _table(xs: list[float], rows_each: int = 1) -> pa.Table:
    units = np.repeat(np.arange(len(xs), dtype=np.int64), rows_each)
    return pa.table({"user_id": units, "x": np.repeat(np.array(xs, dtype=np.float64), rows_each)})


def _largest_change(lo: float, hi: float, sql: str, caps: Caps, rows_each: int) -> tuple[dict[str, float], dict[str, float]]:
    base = [lo, hi, (lo + hi) / 2.0] * 3
    spec = spec_for("t", _table(base), bounds={"x": (lo, hi)})
    plan = plan_for(sql, spec)
    sens = {c.name: c.sensitivity for c in released_columns(plan, caps)}
    d = run_bounded(plan, caps, _table(base, rows_each)).to_pylist()[0]
    worst: dict[str, float] = {}
    for extra in (lo, hi):
        d1 = run_bounded(plan, caps, _table([*base, extra], rows_each)).to_pylist()[0]
        for c in sens:
            if c in d and c != "__users":
                worst[c] = max(worst.get(c, 0.0), float(abs(Fraction(d1[c]) - Fraction(d[c]))))
    return worst, sens


@pytest.mark.parametrize("lo,hi", CASES)
@pytest.mark.parametrize("sql", ["SELECT AVG(x) FROM t", "SELECT VARIANCE(x) FROM t", "SELECT STDDEV(x) FROM t"])
def test_one_person_moves_a_centred_sum_by_at_most_its_sensitivity(lo: float, hi: float, sql: str) -> None:
    worst, sens = _largest_change(lo, hi, sql, Caps(1, 1), 1)
    for c, w in worst.items():
        assert w <= sens[c], (c, w, sens[c])


def test_literal_clamp_bounds_on_adjacent_doubles() -> None:
    lo, hi = CASES[0]
    worst, sens = _largest_change(lo, hi, f"SELECT AVG(LEAST(GREATEST(x, {lo!r}), {hi!r})) FROM t", Caps(1, 1), 1)
    assert worst["__a0_sum"] == hi - lo <= sens["__a0_sum"]
    # negative control: the half-width (hi - lo) / 2 the sensitivity used to be is exceeded twice over
    assert worst["__a0_sum"] == 2 * ((hi - lo) / 2.0)


def test_variance_squares_on_adjacent_doubles_negative_control() -> None:
    lo, hi = CASES[0]
    worst, sens = _largest_change(lo, hi, "SELECT VARIANCE(x) FROM t", Caps(1, 1), 1)
    r = (hi - lo) / 2.0
    assert worst["__a0_sq"] == 4 * r * r <= sens["__a0_sq"]


def test_several_rows_per_person_round_the_bound_up() -> None:
    # k rows of magnitude m may add up to exactly k * m, which the nearest double can lie below
    hi = float.fromhex("0x1.0000000000003p+0")
    lo = -hi
    spec = spec_for("t", _table([0.0]), bounds={"x": (lo, hi)})
    plan = plan_for("SELECT SUM(x) FROM t", spec)
    (s,) = [c.sensitivity for c in released_columns(plan, Caps(1, 3)) if c.name == "__a0"]
    assert Fraction(s) >= 3 * Fraction(hi)
    assert 3 * hi < 3 * Fraction(hi)  # negative control: the nearest product is below the exact one
