"""The released-value rounding as the Gaussian floating-point proof needs it (``dpsql.noise`` section 3).

The proof bounds δ_round by summing sliver probabilities over the boundaries of q* = q ∘ RN (q the rounding
to the granularity γ, RN the rounding of the noisy sum to a double) and needs those boundaries to be at
least γ' = γ(1 − 2⁻⁸) apart *for every value*, since the value is data. These tests enumerate consecutive
doubles and measure the boundaries exactly (a boundary between two adjacent doubles whose outputs differ
is their midpoint, computed as a Fraction).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.noise import round_to_granularity


def _min_boundary_gap(granularity: float, start: float, count: int) -> Fraction:
    xs = [start]
    for _ in range(count - 1):
        xs.append(math.nextafter(xs[-1], math.inf))
    out = round_to_granularity(np.array(xs), granularity)
    assert np.all(np.diff(out) >= 0), "the rounding must be monotone"
    cuts = [(Fraction(xs[i]) + Fraction(xs[i + 1])) / 2 for i in np.flatnonzero(out[1:] != out[:-1])]
    gaps = [b - a for a, b in zip(cuts, cuts[1:], strict=False)]
    assert gaps, "the scan must cross at least two boundaries"
    return min(gaps) / Fraction(granularity)


# values where the doubles are coarse against the grid: 2^k·γ for k from 44 to 53 (a sum of 1e11 at γ = 0.01)
@pytest.mark.parametrize("granularity", [0.1, 0.01, 0.001, 0.2, 10.0, 1.0, 0.5])
@pytest.mark.parametrize("log2_units", [44.5, 48.25, 50.0, 51.3, 52.0, 52.6, 53.4])
def test_rounding_boundaries_are_a_granularity_apart_at_large_values(granularity: float, log2_units: float) -> None:
    start = granularity * 2.0**log2_units
    gap = _min_boundary_gap(granularity, start, 8000)
    # measured before: 0.3125·γ (γ = 0.1 near 2^50.5·γ), 0.5·γ (γ = 0.5 or 1 near 2^51·γ: ties to even)
    assert gap >= 1 - Fraction(1, 256), (granularity, log2_units, float(gap))
    assert _min_boundary_gap(granularity, -start - 8000 * math.ulp(start), 8000) >= 1 - Fraction(1, 256)


@pytest.mark.parametrize("granularity", [0.1, 0.01, 1.0, 0.3])
def test_rounding_boundaries_across_the_switch_to_a_coarser_grid(granularity: float) -> None:
    # the doubles' spacing exceeds γ·2⁻⁹ from 2^43·γ on: scan across every binade edge from there to 2^54·γ
    top = math.frexp(granularity * 2.0**43)[1]
    for e in range(top - 1, top + 11):
        edge = math.ldexp(1.0, e)
        start = edge - 4000 * math.ulp(edge / 2)
        assert _min_boundary_gap(granularity, start, 8000) >= 1 - Fraction(1, 256), (granularity, e)


def test_rounding_keeps_ordinary_values() -> None:
    v = np.array([0.0, 0.04, 0.06, 1.25, -3.149, 123456.789, 2.0**38 + 0.3])
    assert round_to_granularity(v, 0.1).tolist() == [0.0, 0.0, 0.1, 1.2, -3.1, 123456.8, 274877906944.3]
    assert round_to_granularity(np.array([1.5, 2.5, -0.4]), 1.0).tolist() == [2.0, 2.0, 0.0]
    big = np.array([0.1 * 2.0**50 + 0.123, math.inf, -math.inf, 1e300])
    r = round_to_granularity(big, 0.1)
    assert r[1] == math.inf and r[2] == -math.inf and abs(r[3] - 1e300) <= 1e300 * 2.0**-42
    assert abs(r[0] - big[0]) <= 0.1 * 2.0**8  # a coarser grid only where doubles are coarse
    # from 2^39 on (γ = 0.1: the power of two at least 2^42·γ), the grid is 2^10 ulps of the binade
    assert round_to_granularity(np.array([2.0**40 + 0.3, 2.0**39 - 0.1]), 0.1).tolist() == [2.0**40 + 0.25, 2.0**39]
