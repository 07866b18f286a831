"""The quantile sampler's floating-point proof (``dpsql.mechanisms.quantile``, module docstring
"Sampling"): integer utilities, a public score scale, integer weights, an exact uniform integer and
a gamma = 2^-10 uniform mixture. Pinned slack, the implemented law's privacy loss on neighbours,
and the output law by chi-square (fixed seeds, failure probability <= 1e-6, negative controls)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binom, chisquare

from dpsql.mechanisms import quantile as qm
from dpsql.testing import seeded_noise


def test_slack_pinned_by_hand() -> None:
    # xi(N) = 4 * 2^-42 - ln(1 - N e^{2^-42} / 2^45) - ln(1 - N (1 - 2^-10) / (2^-10 2^45))
    # ~ N * 2^-35 for these N: 101 -> 2.9404e-9, 100001 -> 2.9104e-6 (by hand)
    assert qm.float_slack(101) == pytest.approx(2.9404e-9, rel=1e-4)
    assert qm.float_slack(100_001) == pytest.approx(2.9104e-6, rel=1e-4)
    assert qm.float_slack(100_001) < 4e-6


@pytest.mark.parametrize("eps,delta", [(1.0, 1), (0.3, 524288), (1e-3, 3 * 2**20), (7.25, 943718)])
def test_score_scale_never_exceeds_the_calibration(eps: float, delta: int) -> None:
    k = qm.score_scale(eps, delta)
    assert Fraction(k) * 2 * delta <= Fraction(eps)
    assert Fraction(math.nextafter(k, math.inf)) * 2 * delta > Fraction(eps) or k == eps / (2 * delta)


def test_integer_utilities_by_hand_and_saturated() -> None:
    h = np.array([[2, 0, 3, 1, 0, 4]])
    # median, p = 1/2: a = b = 2^19 in magnitude; 2^20 u = -dist(0, [2^19 (A - B - h), 2^19 (A + h - B)]) (the rows
    # at x_i counted below or above as fits best), u = [-3, -3, 0, 0, -1, -1]
    u = qm.integer_utilities(h, 2**19, -(2**19), 0)
    assert (u[0] / 2**20).tolist() == [-3.0, -3.0, 0.0, 0.0, -1.0, -1.0]
    # counts above C saturate: A, B and with the rows at x_i never exceed 2^40, so every value stays exact in int64
    ub = qm.integer_utilities(np.array([[0, 3e15]]), 2**19, -(2**19), 0)
    assert ub.dtype == np.int64 and ub[0].tolist() == [-(2**59), 0]
    assert qm.integer_utilities(np.array([[3e15, 0, 3e15]]), 2**19, -(2**19), 0)[0].tolist() == [0, 0, 0]


def _implemented_law(u: np.ndarray, k: float) -> np.ndarray:
    """Q_i = (1 - gamma) W_i / sum W + gamma / N, W_i = floor(exp(k (U_i - max U)) 2^45), in exact rationals."""
    d = (u - u.max()).astype(np.float64) * k
    w = [int(x) for x in np.floor(np.exp(d) * float(qm.WEIGHT_SCALE))]
    tot, n, g = sum(w), len(w), Fraction(qm.GAMMA)
    return np.array([float((1 - g) * Fraction(x, tot) + g / n) for x in w])


def _neighbours(base: np.ndarray) -> list[np.ndarray]:
    out = []
    for i in range(base.size):
        for dd in (-1, 1):
            h = base.copy()
            h[i] += dd
            if h[i] >= 0:
                out.append(h)
    return out


@pytest.mark.parametrize("eps", [1.0, 40.0])
def test_implemented_law_loses_at_most_eps_plus_slack_on_every_neighbour(eps: float) -> None:
    """Large eps pushes most weights to (or below) one unit of 2^-45: the additive rounding is then
    what the mixture must absorb. Negative control: without the mixture a weight that rounds to 0
    on one side only makes the loss infinite."""
    base = np.array([5, 0, 9, 1, 0, 2, 3, 0, 0, 7])  # utilities [-8.5, -8.5, 0, -0.5, -1.5, -1.5, -3.5, -6.5, ...]
    a, b = 2**19, -(2**19)  # the median: s = 2^20, a = 2^20 - m, b = -m, m = 2^19
    delta_int = 1 * 2**19
    n = base.size
    eps_em = eps - qm.float_slack(n)
    k = qm.score_scale(eps_em, delta_int)
    law = _implemented_law(qm.integer_utilities(base[None, :], a, b, 0)[0], k)
    worst = 0.0
    for h in _neighbours(base):
        other = _implemented_law(qm.integer_utilities(h[None, :], a, b, 0)[0], k)
        worst = max(worst, float(np.abs(np.log(law) - np.log(other)).max()))
    assert worst <= eps + 1e-12
    # negative control: the same integer weights without the uniform mixture
    def bare(u: np.ndarray) -> np.ndarray:
        d = (u - u.max()).astype(np.float64) * k
        w = np.floor(np.exp(d) * float(qm.WEIGHT_SCALE))
        return w / w.sum()
    if eps >= 40:
        p0 = bare(qm.integer_utilities(base[None, :], a, b, 0)[0])
        ratios = []
        for h in _neighbours(base):
            p1 = bare(qm.integer_utilities(h[None, :], a, b, 0)[0])
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios.append(float(np.abs(np.log(p0) - np.log(p1))[(p0 > 0) | (p1 > 0)].max()))
        assert max(ratios) > eps  # some candidate's weight is zero on one side only


def test_output_law_by_chi_square() -> None:
    u = np.array([-8, -6, -3, -1, -2, -6], dtype=np.int64) * 2**19  # 2^20 x [-4, -3, -1.5, -.5, -1, -3]
    k = 1.0 / 2**20  # probabilities proportional to e^{u / 2^20}
    reps = 120_000
    idx = qm.sample_index(np.tile(u, (reps, 1)), k, seeded_noise("quantile-sampler-law"))
    counts = np.bincount(idx, minlength=6)
    exact = np.exp(u / 2**20)
    law = (1 - qm.GAMMA) * exact / exact.sum() + qm.GAMMA / 6
    assert chisquare(counts, reps * law).pvalue > 1e-6
    for scale in (0.9, 1.1):  # negative controls: a mechanism 10% more or less private is rejected
        alt = np.exp(scale * u / 2**20)
        assert chisquare(counts, reps * ((1 - qm.GAMMA) * alt / alt.sum() + qm.GAMMA / 6)).pvalue < 1e-6


def test_the_mixture_draws_uniformly_with_probability_gamma() -> None:
    n, reps = 8, 400_000
    u = np.array([0] + [-(10**12)] * (n - 1), dtype=np.int64)  # every other weight is exactly 0
    idx = qm.sample_index(np.tile(u, (reps, 1)), 1.0, seeded_noise("quantile-mixture"))
    others = int((idx != 0).sum())
    p = qm.GAMMA * (n - 1) / n
    lo, hi = binom.ppf(5e-7, reps, p), binom.isf(5e-7, reps, p)
    assert lo <= others <= hi  # ~342 expected
    assert not (lo <= 0 <= hi)  # negative control: a sampler without the mixture (0 others) fails
    assert set(np.unique(idx[idx != 0]).tolist()) == set(range(1, n))


@pytest.mark.parametrize("t", [1, 3, 5, 7, 2**40 + 3])
def test_uniform_below_is_exact_and_in_range(t: int) -> None:
    draws = qm._uniform_below(np.full(60_000, t, dtype=np.int64), seeded_noise(f"below-{t}"))
    assert draws.min() >= 0 and draws.max() < t
    if t <= 7:
        counts = np.bincount(draws, minlength=t)
        assert chisquare(counts).pvalue > 1e-6 if t > 1 else counts[0] == 60_000
        if t == 3:  # negative control: the biased law of taking 2 random bits modulo 3
            assert chisquare(counts, 60_000 * np.array([0.5, 0.25, 0.25])).pvalue < 1e-6
    else:  # the top and bottom halves are equally likely
        assert abs(int((draws < t // 2).sum()) - 30_000) < 5 * math.sqrt(15_000) + 1


def test_a_min_max_target_beyond_int64_is_the_law_of_the_target_at_the_count_cap() -> None:
    """c = ceil(rank error) is public and unbounded (tiny epsilon, large caps): above every (saturated) count the
    utilities only shift by a constant, so the law is that of c = C, and nothing overflows int64."""
    h = np.array([[2, 0, 3, 1, 0, 4]])
    for a, b in ((1, 0), (0, 1)):
        at_cap = qm.integer_utilities(h, a, b, qm.COUNT_CAP)
        for c in (2**62, 2**63 + 5, 10**25):
            u = qm.integer_utilities(h, a, b, c)
            assert u.dtype == np.int64 and (u - u.max()).tolist() == (at_cap - at_cap.max()).tolist()
