"""The snapped Laplace calibration proves at most the ε it is given, in exact arithmetic.

``snapping_calibration`` solves λ = Δ/(ε − N·2⁻⁴⁵(2^{K+1} + 2)) in floating point; its proven ε is
Δ/λ + N·2⁻⁴⁵(B/λ + 2) (``dpsql.noise`` section 2). The bound's slack 2^{K+1} − B/λ vanishes when λ lies
just above a power of two (Λ = 2^⌈log₂ λ⌉ ≈ 2λ), and a λ rounded down then proved one ulp more than ε.
The sensitivities below put λ there (Δ = 2^j·(ε − extra)·(1 + t·2⁻⁵²)); an analyst reaches them through
a SUM's bounds.
"""

from __future__ import annotations

from fractions import Fraction

import pyarrow as pa
import pytest

import dpsql
from dpsql.noise import snapping_calibration


def _proven(sensitivity: float, lam: float, bound: float, n: int = 1) -> Fraction:
    return Fraction(sensitivity) / Fraction(lam) + n * Fraction(2) ** -45 * (Fraction(bound) / Fraction(lam) + 2)


@pytest.mark.parametrize(
    ("epsilon", "sensitivity"),
    [(0.7, 44.76874999999638), (0.5, 127.87499999998548), (0.7, 89.53749999999276), (1.0, 255.7499999999855),
     (1.0, 1.0), (0.1, 3.0)],
)
def test_snapping_calibration_never_proves_more_than_epsilon(epsilon: float, sensitivity: float) -> None:
    lam, grid, bound = snapping_calibration(sensitivity, epsilon, integer=False)
    assert _proven(sensitivity, lam, bound) <= Fraction(epsilon)
    assert grid >= lam and bound % grid == 0
    # the calibration stays tight: the extra term takes at most a thousandth of the budget
    assert _proven(sensitivity, lam, bound) > Fraction(epsilon) * Fraction(998, 1000)


def test_a_sum_whose_bounds_reach_that_lambda_is_charged_what_it_proves() -> None:
    table = pa.table({"uid": list(range(20)), "x": [float(i) for i in range(20)]})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("t", table, privacy_unit="uid", max_rows_per_unit=1, columns={"x": {"bounds": (0.0, 44.76874999999638)}})
    r = s.query("SELECT SUM(x) AS s FROM t", epsilon=0.7, delta=0.0)
    snap = next(iter(r.details["snapping"].values()))
    assert _proven(44.76874999999638, snap["lambda"], snap["bound"]) <= Fraction(0.7)
    assert r.cost.epsilon == 0.7
