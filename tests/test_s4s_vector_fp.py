"""GROUP BY over joins: the floating-point part of δ at large key counts (docs/mechanisms.md §3.9).

Per coordinate the sampler's error bound has an intercept c₀ = 1.04·2/(1 − a)·2(0.242a + 0.399c)
(a = 2⁻⁴⁷, c = 2⁻⁵⁰: the two boundaries of the release grid nearest the noise's mode), which no coarser grid
removes: d·(1 + e^ε)·c₀ must fit the floating-point share of δ. With the share fixed at δ/10 this capped
d at 0.1δ/((1 + e⁴)c₀) = 20 847 at ε = 4, δ = 1e-7. Now (i) larger shares (δ_A = (1 − share)δ, share up to 3/4)
are tried before a grid coarser than about 2σ_lo, and (ii) on the sampled path the float part is charged on
the fixed sample, before amplification: q′(δ_A + δ_fp) ≤ δ. All numbers below are by hand unless marked."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import dpsql  # noqa: E402
from dpsql.budget import Budget  # noqa: E402
from dpsql.errors import ConfigError  # noqa: E402
from dpsql.mechanisms.s4s_vector import KAPPA, clip_params, stopped_ss_mean, vector_params  # noqa: E402
from dpsql.testing import use_noise, zero_noise  # noqa: E402

A, C = 2.0**-47, 2.0**-50
SLIVER = 1.04 * 2 / (1 - A)
C0 = SLIVER * 2 * (0.242 * A + 0.399 * C)  # = 8.6274e-15
MULT4 = 1 + math.exp(4.0)  # = 55.598


def slope(grid: float) -> float:
    return SLIVER * (A * math.sqrt(2 / math.pi) + C) / (grid * (1 - 2.0**-8))


def test_intercept_by_hand() -> None:
    assert C0 == pytest.approx(8.6274e-15, rel=1e-4) and MULT4 == pytest.approx(55.598, rel=1e-4)
    # the old cap (share 1/10) and the new one (share 3/4) from the intercept alone
    assert math.floor(0.1e-7 / (MULT4 * C0)) == 20847
    assert math.floor(0.75e-7 / (MULT4 * C0)) == 156358


def test_sampled_path_checks_the_float_part_after_amplification() -> None:
    """q = 1/4, Δ = 7, d = 2526 (Q7c): q′ = 1 − (3/4)⁷ = 14197/16384; the grid at τ = 1 is 64 (σ_lo = 323.3):
    q′(0.9δ + δ_fp(64)) ≤ δ < q′(0.9δ + δ_fp(32)). Negative control: δ_fp(64) > δ/10, so the unamplified
    rule (q = 1, test_s4s_vector.py) needs the grid 256."""
    vp = vector_params(4.0, 1e-7, 2526, 0.25, 7)
    assert vp.grid == (64.0, 128.0, 256.0, 512.0) and vp.sigma_lo[0] == pytest.approx(323.32, rel=1e-4)
    assert vp.fp_share == 0.1 and vp.delta_alg == pytest.approx(0.9e-7, rel=1e-12)
    qp = 14197 / 16384
    assert vp.q_prime == pytest.approx(qp, rel=1e-12)
    s_hat = stopped_ss_mean(vp.gamma, vp.eps1, vp.theta0, 3)

    def fp(grid: float) -> float:
        return MULT4 * (2526 * (slope(grid) * 2 * KAPPA * vp.eta * s_hat + C0) + 4 * 2.0**-40)

    assert vp.fp_delta == pytest.approx(fp(64.0), rel=1e-9) and vp.fp_delta == pytest.approx(2.4539e-8, rel=1e-4)
    assert qp * (0.9e-7 + fp(64.0)) <= 1e-7 < qp * (0.9e-7 + fp(32.0))
    assert fp(64.0) > 1e-8  # negative control: δ/10 alone would not cover this grid


def test_a_larger_share_comes_before_a_coarse_grid() -> None:
    """q = 1, Δ = 4, d = 20 000: δ/10 and δ/4 do not fit with a grid ≤ 2σ_lo, δ/2 does (δ_A = 5e-8), grid 1024 at
    σ_lo = 877.6 (pinned). The intercept alone is d(1 + e⁴)c₀ = 9.593e-9."""
    vp = vector_params(4.0, 1e-7, 20000, 1.0, 4)
    assert vp.fp_share == 0.5 and vp.delta_alg == pytest.approx(5e-8, rel=1e-12)
    assert vp.grid[0] == 1024.0 and vp.sigma_lo[0] == pytest.approx(877.60, rel=1e-4) and vp.grid[0] <= 2 * vp.sigma_lo[0]
    assert 20000 * MULT4 * C0 == pytest.approx(9.593e-9, rel=1e-3)
    assert 20000 * MULT4 * C0 < vp.fp_delta <= 0.5e-7


@pytest.mark.parametrize("q,d_max,grid", [(1.0, 67540, 4096.0), (0.25, 132567, 8192.0)])
def test_the_largest_key_count_at_delta_1e_7(q: float, d_max: int, grid: float) -> None:
    """ε = 4, δ = 1e-7, Δ = 4 (τ ∈ {1, 2, 4}): the grid is capped at 4σ_lo, so the largest count is set by the
    coarsest grid ≤ 4σ_lo at share 3/4, not by the intercept bound alone (156 358 unsampled; 252 857 at q = 1/4,
    whose grids were ~10⁶σ). By hand: δ_fp = (1 + e⁴)(d(slope(γ₁)·2κηŜ + c₀) + 3·2⁻⁴⁰) (slope(γ_τ)·τ is the same
    for every τ as γ_τ = τγ₁), which must fit q′(δ/4 + δ_fp) ≤ δ(1 − 10⁻⁹), q′ = 175/256 at q = 1/4 (1 unsampled);
    η and Ŝ are the code's (pinned at d_max). The next count is refused; d_max is the count the refusal of 10⁶
    names (the bisection's; feasibility is not monotone in d near a power-of-two grid step, so at q = 1/4 the
    refusal of d_max + 1 names a smaller count, still one that is answered)."""
    vp = vector_params(4.0, 1e-7, d_max, q, 4)
    assert vp.fp_share == 0.75 and vp.grid[0] == grid
    assert grid <= 4 * vp.sigma_lo[0] < 2 * grid  # the coarsest grid under the cap
    s_hat = stopped_ss_mean(vp.gamma, vp.eps1, vp.theta0, 2)
    per = MULT4 * (slope(grid) * 2 * KAPPA * vp.eta * s_hat + C0)
    qp = 1.0 if q == 1.0 else 175 / 256 * (1 + 1e-12)
    allow = 1e-7 * (1 - 1e-9) / qp - 0.25e-7 - MULT4 * 3 * 2.0**-40
    assert vp.fp_delta == pytest.approx(d_max * per + MULT4 * 3 * 2.0**-40, rel=1e-9)
    assert d_max <= allow / per < d_max + 2  # η, Ŝ move with d: the next count misses by less than one
    assert d_max < (0.75 if q == 1.0 else 256 / 175 - 0.25) * 1e-7 / (MULT4 * C0)  # the intercept bound is looser
    with pytest.raises(ConfigError, match="largest key count answerable at delta=1e-07 is "):
        vector_params(4.0, 1e-7, d_max + 1, q, 4)
    with pytest.raises(ConfigError, match=f"largest key count answerable at delta=1e-07 is {d_max};"):
        vector_params(4.0, 1e-7, 10**6, q, 4)


def test_refusal_names_the_delta_that_answers_the_key_count() -> None:
    """d = 10⁶ unsampled: the intercept alone needs δ ≥ d(1 + e⁴)c₀/0.75 = 6.3956e-7, but with the grid capped at
    4σ_lo the slope term needs more: the least two-digit δ is 1.4e-6 (pinned; 1.3e-6 refused, the control)."""
    need = 1e6 * MULT4 * C0 / 0.75
    assert need == pytest.approx(6.3956e-7, rel=1e-4)
    with pytest.raises(ConfigError, match=r"delta=1\.4e-06 would answer 1000000 groups") as e:
        vector_params(4.0, 1e-7, 10**6, 1.0, 4)
    assert "is 67540" in str(e.value) and "pass delta=1.4e-06" in (e.value.hint or "")
    vp = vector_params(4.0, 1.4e-6, 10**6, 1.0, 4)
    assert vp.d == 10**6 and vp.grid[0] <= 4 * vp.sigma_lo[0]
    with pytest.raises(ConfigError):  # negative control: the next smaller two-digit delta does not
        vector_params(4.0, 1.3e-6, 10**6, 1.0, 4)


def test_clipping_path_uses_the_same_shares() -> None:
    """Per-user clipping, C = 12, counts, d = 30 000 (refused before: 30 000(1 + e⁴)c₀ = 1.439e-8 > δ/10):
    share 1/2, σ = 15.935 (analytic Gaussian at (4, 5e-8), sensitivity 12(1 + 2⁻³⁰); pinned), grid 16;
    δ_fp = (1 + e⁴)·d·(slope(16)σ + c₀) by hand. Largest count at the grid cap 4σ: share 3/4, σ = 16.289 (pinned),
    grid 64 ≤ 4σ < 128: ⌊0.75δ(1 − 10⁻⁹)/((1 + e⁴)(slope(64)σ + c₀))⌋ = 111 369 (the intercept bound was 156 358)."""
    assert 30000 * MULT4 * C0 == pytest.approx(1.439e-8, rel=1e-3) and 30000 * MULT4 * C0 > 1e-8
    cp = clip_params(4.0, 1e-7, 30000, 12.0, True)
    assert cp.fp_share == 0.5 and cp.grid == 16.0 and cp.sigma == pytest.approx(15.935, rel=1e-4)
    assert cp.fp_delta == pytest.approx(MULT4 * 30000 * (slope(16.0) * cp.sigma + C0), rel=1e-6)
    assert cp.fp_delta <= 0.5e-7
    top = clip_params(4.0, 1e-7, 111369, 12.0, True)
    assert top.fp_share == 0.75 and top.grid == 64.0 and top.sigma == pytest.approx(16.289, rel=1e-4)
    assert top.grid <= 4 * top.sigma < 2 * top.grid
    assert math.floor(0.75e-7 * (1 - 1e-9) / (MULT4 * (slope(64.0) * top.sigma + C0))) == 111369
    with pytest.raises(ConfigError, match="largest key count answerable at delta=1e-07 is 111369;"):
        clip_params(4.0, 1e-7, 10**6, 12.0, True)


def _wide(n_keys: int) -> dpsql.Session:
    g = np.random.default_rng(3)
    nc = 2000
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("nation", pa.table({"n_nationkey": np.arange(n_keys), "n_name": [f"N{i:07d}" for i in range(n_keys)]}),
               public=True)
    s.register("customer", pa.table({"c_custkey": np.arange(nc), "c_nationkey": g.integers(0, n_keys, nc)}),
               privacy_unit="c_custkey", references={"c_nationkey": "nation.n_nationkey"})
    s.register("orders", pa.table({"o_orderkey": np.arange(3 * nc), "o_custkey": np.repeat(np.arange(nc), 3)}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 4})
    return s


WIDE = ("SELECT n.n_name, COUNT(*) AS cnt FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
        "JOIN nation n ON c.c_nationkey = n.n_nationkey GROUP BY n.n_name")


def test_a_public_key_set_of_30000_is_answered_and_of_200000_refused_free() -> None:
    s = _wide(30000)
    use_noise(s, zero_noise())
    r = s.query(WIDE, epsilon=4.0, delta=1e-7)
    assert r.table.num_rows == 30000 and r.mechanism == "clipped_gaussian"
    grid = s.explain(WIDE, epsilon=4.0, delta=1e-7).parameters
    assert "granularity" not in grid  # d is counted at run time: the grid is not known to explain
    truth = 3 * np.bincount(np.random.default_rng(3).integers(0, 30000, 2000), minlength=30000)
    got = np.asarray(r.table.column("cnt").to_pylist())  # keys in n_name order = n_nationkey order
    cp = clip_params(4.0, 1e-7, 30000, 4.0, True)  # C = Delta = 4 (3 orders per customer: nothing clipped)
    assert cp.fp_share == 0.5 and cp.grid == 4.0 and r.accuracy["cnt"]["sigma"] == cp.sigma
    assert np.array_equal(got, 4 * np.rint(truth / 4))  # no noise: the true counts at the public grid
    r2 = s.query(WIDE, epsilon=4.0, delta=1e-7, options={"mechanism": "dp_s4s", "q": 0.25})
    assert r2.table.num_rows == 30000
    s.close()
    s = _wide(200000)
    before, rows = s.remaining(), s.history().num_rows
    for call in (s.explain, s.query):
        with pytest.raises(ConfigError, match="largest key count answerable at delta=1e-07 is 101623") as e:
            call(WIDE, epsilon=4.0, delta=1e-7)
        assert "would answer 200000 groups" in str(e.value)
    assert s.remaining() == before and s.history().num_rows == rows
    s.close()
    # by hand: C = 4, share 3/4, σ = 5.4296 (pinned), grid 16 ≤ 4σ < 32 (the cap)
    top = clip_params(4.0, 1e-7, 101623, 4.0, True)
    assert top.grid == 16.0 and top.sigma == pytest.approx(5.4296, rel=1e-4) and top.grid <= 4 * top.sigma < 32
    assert math.floor(0.75e-7 * (1 - 1e-9) / (MULT4 * (slope(16.0) * top.sigma + C0))) == 101623


def test_a_split_sum_reports_the_query_delta() -> None:
    """A SUM with a negative lower bound is two parts, each with (ε/2, δ/2): the refusal speaks of the query's δ.
    By hand (ε = 4, δ = 1e-7, q = 1, d = 10⁶): each part needs 10⁶(1 + e²)c₀ ≤ 0.75·δ/2, i.e. δ ≥ 1.9300e-7,
    so the intercept alone would allow 2.0e-7 and 518 128 groups; with the grid capped at 4σ_lo the slope term
    binds: 236 742 groups and δ = 4.1e-7 (pinned; both below/above the intercept figures)."""
    mult2 = 1 + math.exp(2.0)
    assert 2 * 1e6 * mult2 * C0 / 0.75 == pytest.approx(1.9300e-7, rel=1e-4)
    assert math.floor(0.75 * 0.5e-7 / (mult2 * C0)) == 518128
    with pytest.raises(ConfigError, match=r"delta=1e-07 is too small .* is 236742; delta=4.1e-07 would answer 1000000"):
        vector_params(2.0, 0.5e-7, 10**6, 1.0, 4, 2)
    assert vector_params(2.0, 2.05e-7, 10**6, 1.0, 4).d == 10**6  # the part's delta at the reported 4.1e-7
    with pytest.raises(ConfigError):  # control: the part's delta at 4.0e-7
        vector_params(2.0, 2.0e-7, 10**6, 1.0, 4)
