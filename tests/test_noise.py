"""The noise module: uniforms never 0 or 1, exact samplers, snapping, the Gaussian fp delta.

Statistical tests use seeded sources from ``dpsql.testing``, fail with probability <= 1e-6 and
each has a negative control that the same test rejects. Calibration numbers are written here by
hand from the formulas of ``dpsql.noise`` (never by re-calling the code under test).
"""

from __future__ import annotations

import math
import statistics
from decimal import Decimal, getcontext

import numpy as np
import pyarrow as pa
import pytest
from scipy import special, stats

import dpsql
from dpsql import Budget
from dpsql.budget import exact
from dpsql.errors import ConfigError
from dpsql.noise import (
    NoiseSource,
    gaussian_fp_delta,
    power_of_two_at_least,
    snapping_calibration,
    snapping_epsilon,
)
from dpsql.testing import seeded_noise, use_noise, zero_noise

ALPHA = 1e-6


class FixedBytes(NoiseSource):
    """Emits a fixed byte pattern first (worst cases of the old sampler), then seeded bytes."""

    def __init__(self, pattern: bytes, n_first: int) -> None:
        self._first = pattern * n_first
        self._inner = seeded_noise("fixed-bytes")

    def _random_bytes(self, n: int) -> bytes:
        take, self._first = self._first[:n], self._first[n:]
        return take + self._inner._random_bytes(n - len(take))


# ----------------------------------------------------------------------------- the uniform
def test_uniform_is_never_zero_or_one_even_on_extreme_bits():
    # all-ones words: the old (k + 0.5) * 2^-53 gave exactly 1.0 here, hence an infinite Laplace draw
    ones = FixedBytes(b"\xff" * 8, 64)
    s, m = ones.uniform_magnitude(32)
    assert np.all(m > 0) and np.all(m < 0.5)
    u = FixedBytes(b"\xff" * 8, 64).uniform_open(32)
    assert np.all(u > 0) and np.all(u < 1)
    assert np.all(np.isfinite(FixedBytes(b"\xff" * 8, 64).laplace(1.0, 32)))
    # all-zero words: the exponent keeps counting (64 per zero word), the float view stays > 0
    zeros = FixedBytes(b"\x00" * 8, 40)
    sign, e, f = zeros.sign_magnitude(4)
    assert np.all(e > 64)
    lap = FixedBytes(b"\x00" * 8, 40).laplace(1.0, 4)
    assert np.all(np.isfinite(lap)) and np.all(np.abs(lap) > 40.0)  # far tail, no truncation at 36.7
    u = FixedBytes(b"\x00" * 8, 40).uniform_open(4)
    assert np.all(u > 0) and np.all(u < 1)


def test_uniform_is_uniform_with_negative_control():
    rng = seeded_noise("uniform-gof")
    u = rng.uniform_open(1_000_000)
    assert u.min() > 0 and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > ALPHA
    # negative control: a 2% power distortion is rejected by the same test
    assert stats.kstest(u**1.02, "uniform").pvalue < ALPHA


def test_exponent_is_geometric_and_mantissa_uniform():
    _, e, f = seeded_noise("exp-gof").sign_magnitude(400_000)
    # P(e = k) = 2^-k: chi-square over k = 1..15 and a pooled tail
    obs = np.array([np.sum(e == k) for k in range(1, 16)] + [np.sum(e >= 16)])
    p = np.array([2.0**-k for k in range(1, 16)] + [2.0**-15])
    assert stats.chisquare(obs, p * e.size).pvalue > ALPHA
    assert stats.kstest(f, "uniform").pvalue > ALPHA
    # negative control: P(e = k) = 0.55 * 0.45^(k-1) is rejected
    q = np.array([0.55 * 0.45 ** (k - 1) for k in range(1, 16)] + [0.45**15])
    assert stats.chisquare(obs, q / q.sum() * e.size).pvalue < ALPHA


class ScriptedWords(NoiseSource):
    """Hands out the given batches of words, one batch per draw (each of the size asked for)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self._batches = [np.asarray(b, dtype=np.uint64) for b in batches]

    def _words(self, n: int) -> np.ndarray:
        w = self._batches.pop(0)
        assert w.size == n
        return w


def test_exponent_counts_trailing_zeros_across_zero_words_in_order():
    """e = 1 + trailing zeros of the element's word; a zero word adds 64 and the count goes on in
    the next batch, drawn for the zero words only, in their order (the sampler is vectorised)."""
    src = ScriptedWords([[0, 0, 8, 0, 1, 2**63], [0, 2, 4], [1]])
    assert src._exponents(6).tolist() == [64 + 64 + 1, 64 + 2, 4, 64 + 3, 1, 64]
    assert src._batches == []
    big = np.random.default_rng(3).integers(1, 2**63, 10_000, dtype=np.uint64)
    want = [1 + (int(x) & -int(x)).bit_length() - 1 for x in big]  # Python integers, no floats
    assert ScriptedWords([big.tolist()])._exponents(big.size).tolist() == want


def test_seeded_words_are_the_seeded_byte_stream():
    """SeededNoise draws its words straight from PCG64: the same words as NoiseSource reads from its bytes."""
    a, b = seeded_noise("words"), seeded_noise("words")
    for n in (0, 1, 7, 100_000, 0, 3):
        assert np.array_equal(a._words(n), NoiseSource._words(b, n))


def test_bernoulli_is_exact_and_calibrated():
    rng = seeded_noise("bern")
    n = 400_000
    for p in (0.1, 0.5, 0.9):
        k = int(rng.bernoulli(p, n).sum())
        assert stats.binomtest(k, n, p).pvalue > ALPHA / 3
    k = int(rng.bernoulli(0.9, n).sum())
    assert stats.binomtest(k, n, 0.89).pvalue < ALPHA  # negative control
    assert not rng.bernoulli(0.0, 1000).any() and rng.bernoulli(1.0, 1000).all()


# ----------------------------------------------------------------------------- samplers
def test_laplace_and_normal_samples_fit_with_negative_controls():
    lap = seeded_noise("lap-gof").laplace(3.0, 500_000)
    assert stats.kstest(lap, "laplace", args=(0, 3.0)).pvalue > ALPHA
    assert stats.kstest(lap, "laplace", args=(0, 3.1)).pvalue < ALPHA
    nor = seeded_noise("nor-gof").normal(2.0, 500_000)
    assert stats.kstest(nor, "norm", args=(0, 2.0)).pvalue > ALPHA
    assert stats.kstest(nor, "norm", args=(0, 2.06)).pvalue < ALPHA


def test_log1p_assumption_against_exact_decimal():
    """(A1): numpy's log1p on [0, 1) errs by less than one ulp (checked against 40-digit decimals)."""
    getcontext().prec = 40
    gen = np.random.default_rng(7)
    w = np.concatenate([gen.integers(0, 2**52, 3000).astype(np.float64) / 2.0**52, [0.0, 1 - 2.0**-52, 2.0**-52]])
    got = np.log1p(w)
    for wi, gi in zip(w.tolist(), got.tolist()):
        exact = (Decimal(1) + Decimal(wi)).ln()
        ulp = math.ulp(float(exact)) if float(exact) > 0 else 2.0**-1074
        assert abs(Decimal(gi) - exact) < Decimal(ulp)


def test_ndtri_assumption_against_an_independent_inverse():
    """(A2): scipy's ndtri within relative 2^-48 of Python's independent NormalDist.inv_cdf."""
    nd = statistics.NormalDist()
    ps = np.concatenate([np.geomspace(1e-300, 0.5, 2000), np.linspace(0.01, 0.5, 500)])
    for p in ps.tolist():
        a, b = float(special.ndtri(p)), nd.inv_cdf(p)
        assert abs(a - b) <= 2.0**-48 * abs(b) + 2.0**-52, p


# ----------------------------------------------------------------------------- snapping
def test_snapping_output_on_grid_and_within_bound():
    lam, grid, bound = 1.7, 2.0, 2.0**12
    x = np.array([0.0, 3.3, -7.1, 1e9, -1e300, 4095.9, -4096.0, 2.0**12 - 0.5] * 5000)
    y = seeded_noise("snap-grid").snap_laplace(x, lam, grid, bound)
    assert np.all(np.abs(y) <= bound)
    assert np.all(y / grid == np.rint(y / grid))
    assert np.all(y[x >= bound] >= bound - 40 * lam)  # clamped input, then noise
    assert np.all(np.isfinite(y))


def _snapped_probs(v: float, lam: float, grid: float, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact output distribution of clamp_B(grid * round((v + Lap(lam)) / grid))."""
    ks = np.arange(-bound / grid, bound / grid + 1)
    pts = ks * grid
    lo = np.where(ks == ks[0], -np.inf, pts - grid / 2)
    hi = np.where(ks == ks[-1], np.inf, pts + grid / 2)
    cdf = stats.laplace(loc=v, scale=lam).cdf
    return pts, cdf(hi) - cdf(lo)


def test_snapped_noise_actually_added_fits_the_exact_distribution():
    lam, grid, bound, v = 3.0, 4.0, 64.0, 5.3
    y = seeded_noise("snap-gof").snap_laplace(np.full(300_000, v), lam, grid, bound)
    pts, p = _snapped_probs(v, lam, grid, bound)
    obs = np.array([np.sum(y == t) for t in pts])
    assert obs.sum() == y.size  # nothing off the grid
    keep = p * y.size >= 20
    pooled_obs = np.append(obs[keep], obs[~keep].sum())
    pooled_p = np.append(p[keep], p[~keep].sum())
    assert stats.chisquare(pooled_obs, pooled_p * y.size).pvalue > ALPHA
    # negative control: the distribution for a 5% larger scale is rejected
    _, p2 = _snapped_probs(v, lam * 1.05, grid, bound)
    pooled_p2 = np.append(p2[keep], p2[~keep].sum())
    assert stats.chisquare(pooled_obs, pooled_p2 * y.size).pvalue < ALPHA


def test_snapping_calibration_by_hand():
    # eps = 1, Delta = 1: K = 34 (2^-45 (2^35 + 2) = 2^-10 + 2^-44 <= 1e-3 < 2^-45 (2^36 + 2)),
    # lambda = 1/(1 - 2^-10 - 2^-44) = 1.0009775171066064..., Lambda = 2, B = 2^34 * 2 = 2^35
    lam, grid, bound = snapping_calibration(1.0, 1.0)
    assert lam == pytest.approx(1.0009775171066064, rel=1e-15)
    assert grid == 2.0 and bound == 2.0**35
    # eps = 0.01: K = 27 (2^-45 (2^28 + 2) = 7.63e-6 <= 1e-5 < 2^-45 (2^29 + 2)),
    # lambda = 1/(0.01 - 2^-17 - 2^-44) = 100.07635219798..., Lambda = 128, B = 2^27 * 128 = 2^34
    lam, grid, bound = snapping_calibration(1.0, 0.01)
    assert lam == pytest.approx(100.0763521979855, rel=1e-12)
    assert grid == 128.0 and bound == 2.0**34
    # the proven epsilon never exceeds the request
    for eps in (0.003, 0.1, 1.0, 7.0):
        for d in (1.0, 3.5, 250.0):
            lam, grid, bound = snapping_calibration(d, eps)
            assert snapping_epsilon(d, lam, bound) <= eps
            assert grid == power_of_two_at_least(lam) and grid / 2 < lam <= grid


@pytest.mark.parametrize("eps", [1e-300, 1e-12])
def test_unrepresentable_parameters_are_refused(eps):
    with pytest.raises(ConfigError):
        snapping_calibration(1.0, eps)


def test_gaussian_fp_delta_by_hand():
    # sigma = 5, granularity 1, integer: 1.04 * 2/(1 - 2^-47) * [(2^-47 * 5 * sqrt(2/pi) + 2^-50 * 5)
    # / (1 - 2^-8) + 2 (0.242 * 2^-47 + 0.399 * 2^-50)] + 2^-1000 + 2^-1020
    # = 2.08 * [(2.8343e-14 + 4.4409e-15) / 0.99609 + 2 (1.7195e-15 + 3.5439e-16)] = 7.709e-14
    assert gaussian_fp_delta(5.0, 1.0, integer=True) == pytest.approx(7.709e-14, rel=1e-3)
    # the threshold test adds 2.08 * (1.7195e-15 + 3.5439e-16) = 4.314e-15
    assert gaussian_fp_delta(5.0, 1.0, integer=True, threshold=True) == pytest.approx(7.709e-14 + 4.314e-15, rel=1e-3)


# ----------------------------------------------------------------------------- end to end
def _session(noise: NoiseSource | None = None) -> dpsql.Session:
    t = pa.table({"uid": np.arange(200, dtype=np.int64), "v": np.arange(200, dtype=np.float64) % 7})
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    if noise is not None:
        use_noise(s, noise)
    s.register("t", t, privacy_unit="uid", columns={"v": {"bounds": (0, 10)}})
    return s


def test_tiny_epsilon_is_refused_before_any_charge():
    """The reported attack: eps = 1e-300 with delta = 0 released -2^63 and was charged."""
    with _session() as s:
        with pytest.raises(ConfigError, match="cannot be represented|too small"):
            s.explain("SELECT COUNT(*) FROM t", epsilon=1e-300)
        with pytest.raises(ConfigError, match="cannot be represented|too small"):
            s.query("SELECT COUNT(*) FROM t", epsilon=1e-300)
        assert s.remaining() == Budget(100.0, 1e-3) and s.history().num_rows == 0


def test_laplace_release_is_snapped_and_charged_as_asked():
    with _session(seeded_noise("e2e-lap")) as s:
        p = s.explain("SELECT COUNT(*) FROM t", epsilon=1.0)
        snap = p.parameters["snapping"]["__count"] if "__count" in p.parameters["snapping"] else next(
            iter(p.parameters["snapping"].values())
        )
        # one column, one group, Delta = 1: the hand numbers of test_snapping_calibration_by_hand
        assert snap["lambda"] == pytest.approx(1.0009775171066064, rel=1e-15)
        assert snap["grid"] == 2.0 and snap["bound"] == 2.0**35
        assert p.cost == Budget(1.0, 0.0) and p.parameters["epsilon_proven"] <= 1.0
        vals = [s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.column("n")[0].as_py() for _ in range(20)]
        assert all(v % 2 == 0 for v in vals)  # on the power-of-two grid
        assert s.remaining() == Budget(80.0, 1e-3)


def test_gaussian_charge_includes_the_fp_delta():
    with _session(zero_noise()) as s:
        r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0, delta=1e-6)
        # sigma = 4.2246788893 (analytic Gaussian, eps 1, delta 1e-6, sensitivity 1); per coordinate
        # 2.08 [(2^-47 * 4.22468 * 0.79788 + 2^-50 * 4.22468)/0.99609 + 2 (1.7195e-15 + 3.5439e-16)]
        # = 6.6476e-14; times (1 + e) = 2.4718e-13
        fp = r.details["fp_delta"]
        assert fp == pytest.approx(2.4718e-13, rel=1e-3)
        # the delta asked for plus fp, rounded up (dpsql/budget.py: by at most a float more than the least)
        assert r.cost.epsilon == 1.0 and exact(1e-6) + exact(fp) <= exact(r.cost.delta)
        assert exact(math.nextafter(math.nextafter(r.cost.delta, 0.0), 0.0)) < exact(1e-6) + exact(fp)
        assert s.remaining() == Budget(100.0, 1e-3).minus(r.cost)
        assert r.table.column("n")[0].as_py() == 200  # zero noise: the exact count


def test_dawa_tiny_epsilon_is_refused_before_any_charge():
    t = pa.table({"uid": np.arange(300, dtype=np.int64), "age": np.arange(300, dtype=np.int64) % 100})
    with dpsql.Session(budget=Budget(10.0, 0.0)) as s:
        s.register("t", t, privacy_unit="uid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 100), "bins": 100}})
        qs = ["SELECT COUNT(*) FROM t WHERE age >= 3 AND age < 10", "SELECT COUNT(*) FROM t WHERE age < 50"]
        with pytest.raises(ConfigError, match="too small|cannot be represented"):
            s.query_many(qs, epsilon=1e-300)
        with pytest.raises(ConfigError, match="too small|cannot be represented"):
            s.query("SELECT age, COUNT(*) FROM t GROUP BY age", epsilon=1e-300)
        assert s.remaining() == Budget(10.0, 0.0) and s.history().num_rows == 0
        use_noise(s, seeded_noise("dawa-e2e"))
        r = s.query_many(qs, epsilon=1.0)
        assert r.cost == Budget(1.0, 0.0) and s.remaining() == Budget(9.0, 0.0)


def test_dawa_float_calibrations_by_hand_and_outputs_on_grid():
    from dpsql.mechanisms.dawa import IntervalWorkload, greedy_h, stage1_float_calibration

    # stage 1: B1 = 2^20 * 2 = 2^21; need = 8 * 2^21 * 2^-50 = 2^-26 -> grid 2^-25 (a power of two
    # >= need); slack = 4 * 2^-25 + 2^-47 (2^21 + 2^-25) = 1.3411045e-7;
    # b = (base * 0.5 + slack) / (0.5 - 2^-47): 1.00000026822, 2.00000026822
    scales, bound, grid = stage1_float_calibration(np.array([1.0, 2.0]), 8, 0.5)
    assert bound == 2.0**21 and grid == 2.0**-25
    assert scales == pytest.approx([1.00000026822, 2.00000026822], rel=1e-10)
    # stage 2: snapped rows lie on the grid, inside [-B, B]
    n = 64
    wl = IntervalWorkload.from_ranges(np.array([[0, 9], [5, 40], [0, 63]]), n)
    s = greedy_h(wl, [(i, i) for i in range(n)])
    lam, g2, b2, rows = s.snapping(0.5, sensitivity=2.0)
    assert g2 == power_of_two_at_least(lam) and b2 <= 2.0**62 / (n + 1) and rows <= 2 * len(s.levels)
    z = np.concatenate(s.measure(np.arange(n, dtype=float) * 1e6, 0.5, seeded_noise("dawa-grid"), sensitivity=2.0))
    z = z[np.isfinite(z)]
    assert z.size == s.n_measurements and np.all(np.abs(z) <= b2) and np.all(z / g2 == np.rint(z / g2))


def test_given_tau_star_is_rounded_up_to_an_integer():
    t = pa.table({"uid": np.arange(300, dtype=np.int64), "g": np.array(list("abc"))[np.arange(300) % 3]})
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        s.register("t", t, privacy_unit="uid")
        p = s.explain("SELECT g, COUNT(*) FROM t GROUP BY g", epsilon=1.0, delta=1e-5, options={"tau_star": 40.2})
        assert p.parameters["tau_star"] == 41.0


def test_gaussian_noise_actually_added_fits_the_rounded_normal():
    """Integer columns release v + rint(X): compare with P(rint(N(0, s^2)) = k) exactly."""
    from dpsql.noise import gaussian_release

    sigma, v, n = 2.7, 11.0, 300_000
    rng = seeded_noise("gauss-gof")
    y = gaussian_release(np.full(n, v), rng.gaussian_noise(sigma, n), integer=True)
    assert np.all(y == np.rint(y))
    ks = np.arange(-25, 26)
    obs = np.array([np.sum(y - v == k) for k in ks])
    assert obs.sum() == n

    def probs(s: float) -> np.ndarray:
        return stats.norm.cdf((ks + 0.5) / s) - stats.norm.cdf((ks - 0.5) / s)

    keep = probs(sigma) * n >= 20
    assert stats.chisquare(np.append(obs[keep], obs[~keep].sum()), np.append(probs(sigma)[keep], 1 - probs(sigma)[keep].sum()) * n).pvalue > ALPHA
    p2 = probs(sigma * 1.03)
    assert stats.chisquare(np.append(obs[keep], obs[~keep].sum()), np.append(p2[keep], 1 - p2[keep].sum()) * n).pvalue < ALPHA
