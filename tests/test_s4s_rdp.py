"""DP-S4S with Gaussian noise under Rényi DP (delta > 0): schedule pinned by hand, total conversion
within (epsilon, delta), noise calibration, zero-noise goldens, validation."""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.accounting import rdp_to_dp
from dpsql.errors import ConfigError
from dpsql.mechanisms import _s4s_truncation as T
from dpsql.mechanisms.s4s import RDP_ORDERS
from dpsql.mechanisms.s4s import s4s_rdp_schedule as _s4s_rdp_schedule
from dpsql.mechanisms.s4s import s4s_scalar_rdp as _s4s_scalar_rdp
from dpsql.testing import seeded_noise, zero_noise

# the numbers pinned here were written for the paper's variant (base 2, ln(3L/beta) bias)
s4s_rdp_schedule = functools.partial(_s4s_rdp_schedule, tau_base=2.0, paper_bias=True)
s4s_scalar_rdp = functools.partial(_s4s_scalar_rdp, tau_base=2.0, paper_bias=True)

# δ_coord of one run (σ/γ < 32), dpsql.noise §3: 1.04·2/(1−a)·[(a√(2/π) + c₀)·32/(1 − 2⁻⁸)
# + 2(0.242a + 0.399c₀)] + 2⁻¹⁰⁰⁰ + 2⁻¹⁰²⁰ with a = 2⁻⁴⁷, c₀ = 2⁻⁵⁰
FP_COORD = 4.4680552472573544e-13


def test_schedule_pinned_single_run():
    """ε = 2, δ = 1e-6, Δ = 1 (L = 1), q = 1, α = 10, by hand:
    δ_fp = (1 + e²)·δ_coord = 3.74827661e-12, δ′ = δ − δ_fp;
    ρ_total = 2 − ln(0.9) + (ln δ′ + ln 10)/9 = 0.8261461586;
    q = 1, Δ = 1 ≤ τ = 1: ρ′ = ρ (Lemma 3.5 with K = 1 surely);
    σ = (1 + 2⁻¹⁰)·√(10/(2·0.8261461586)) = 2.4625239724; bias = σ·√(2 ln 30) = 6.4226075112;
    γ = 2^⌊log₂(σ/16)⌋ = 0.125."""
    s = s4s_rdp_schedule(2.0, 1e-6, 1, 1.0, beta=0.1, alpha=10.0)
    assert s.alpha == 10.0
    assert s.fp_delta == pytest.approx(3.74827661e-12, rel=1e-8)
    assert s.rho_total == pytest.approx(0.8261461586, rel=1e-9)
    (st,) = s.steps
    assert st.tau == 1.0 and st.rho == pytest.approx(0.8261461586, rel=1e-9)
    assert st.rho_prime == pytest.approx(0.8261461586, rel=1e-9)
    assert st.sigma == pytest.approx(2.4625239724, rel=1e-9)
    assert st.bias == pytest.approx(6.4226075112, rel=1e-9)
    assert st.granularity == 0.125
    assert s.epsilon_spent <= 2.0 and s.epsilon_spent == pytest.approx(2.0, abs=1e-12)


def test_schedule_pinned_amplified():
    """ε = 2, δ = 1e-6, Δ = 2 (L = 2), q = ½, α = 10; K ~ Bin(2, ½): p = (¼, ½, ¼). By hand:
    δ_fp = 2(1 + e²)δ_coord; ρ_total = 0.8261457422;
    i = 2: τ = 2, G = 2/1024, ρ₂ = ρ_total/2, ρ′₂ = ln Σ_k p_k exp(9ρ₂((k + G)/(2 + G))²)/9 = 0.2743345280,
           σ₂ = (2 + G)√(10/(2ρ₂)) = 6.9650713545;
    i = 1: ρ₁ = ρ_total − ρ′₂ = 0.5518112141, G = 1/1024,
           ρ′₁ = ln(¼exp(9ρ₁(G/(1 + G))²) + ¾exp(9ρ₁))/9 = 0.5201043479, σ₁ = 3.0131007242."""
    s = s4s_rdp_schedule(2.0, 1e-6, 2, 0.5, beta=0.1, alpha=10.0)
    assert s.rho_total == pytest.approx(0.8261457422, rel=1e-9)
    s2, s1 = s.steps
    assert (s2.i, s2.tau, s1.i, s1.tau) == (2, 2.0, 1, 1.0)
    assert s2.rho_prime == pytest.approx(0.2743345280, rel=1e-9)
    assert s2.sigma == pytest.approx(6.9650713545, rel=1e-9)
    assert s1.rho == pytest.approx(0.5518112141, rel=1e-9)
    assert s1.rho_prime == pytest.approx(0.5201043479, rel=1e-9)
    assert s1.sigma == pytest.approx(3.0131007242, rel=1e-9)
    # amplification: the two runs cost less than the budget; the conversion stays below ε
    assert s.rho_spent == pytest.approx(0.2743345280 + 0.5201043479, rel=1e-9) and s.rho_spent < s.rho_total
    assert s.epsilon_spent < 2.0


@pytest.mark.parametrize(
    "eps,delta,big_delta,q",
    [(1.0, 1e-7, 1024, 1 / 16), (1.0, 1e-7, 1024, 1.0), (0.5, 1e-9, 64, 0.25), (4.0, 1e-5, 2**20, 1 / 64)],
)
def test_total_conversion_within_epsilon_delta(eps, delta, big_delta, q):
    s = s4s_rdp_schedule(eps, delta, big_delta, q)
    assert s.alpha in RDP_ORDERS
    assert len(s.steps) == big_delta.bit_length()
    assert [st.tau for st in s.steps] == [2.0 ** (st.i - 1) for st in s.steps]
    spent = sum((Fraction(st.rho_prime) for st in s.steps), Fraction(0))
    assert spent <= Fraction(s.rho_total)  # exactly
    assert all(st.rho_prime <= st.rho * (1 + 1e-12) for st in s.steps)  # Lemma 3.5: ρ′ ≤ ρ
    # the conversion (independent route: the accounting module) at δ − δ_fp is within ε
    assert rdp_to_dp(s.alpha, s.rho_spent, delta - s.fp_delta, "cks") <= eps * (1 + 1e-12)
    assert s.fp_delta == pytest.approx((1 + math.exp(eps)) * len(s.steps) * FP_COORD, rel=1e-12)
    assert s.fp_delta < delta / 100
    # each run's σ is calibrated to its ρ at sensitivity τ + G
    for st in s.steps:
        g = T.gap_bound(st.tau)
        assert st.sigma == pytest.approx((st.tau + g) * math.sqrt(s.alpha / (2 * st.rho)), rel=1e-12)
        assert 16 <= st.sigma / st.granularity < 32


def test_zero_noise_golden():
    # 30 disjoint users with 4 unit tuples each, Δ = 4 (L = 3), q = 1: f̄(τ) = 30·min(τ, 4)
    ui = np.repeat(np.arange(30), 4)
    w, ti = np.ones(ui.size), np.arange(ui.size)
    r = s4s_scalar_rdp(w, ti, ui, epsilon=2.0, delta=1e-6, max_tuples_per_user=4, q=1.0, rng=zero_noise())
    want = [30 * min(st.tau, 4) - st.bias for st in r.schedule.steps]
    assert r.candidates == pytest.approx(want, abs=1e-12)
    assert r.unclamped == pytest.approx(max(want)) and r.estimate == max(0.0, r.unclamped)


def test_gaussian_noise_is_calibrated():
    """q = 1: (q·candidate + bias − f̄)/σ_i is N(0, 1) up to the rounding to γ_i ≤ σ_i/16. Over
    N = 3000 draws mean |Z| lies within 5.3·0.6028/√N of √(2/π) = 0.79788 (normal approximation,
    failure ≈ 1e-7; rounding shifts |Z| by ≤ 1/32); a σ 15% off is rejected (negative control)."""
    w, ti, ui = np.ones(3), np.arange(3), np.arange(3)  # f̄ = 3 for every τ ≥ 1
    rng = seeded_noise(2024)
    z = []
    for _ in range(300):
        r = s4s_scalar_rdp(w, ti, ui, epsilon=1.0, delta=1e-7, max_tuples_per_user=512, q=1.0, rng=rng)
        z += [(c + st.bias - 3.0) / st.sigma for c, st in zip(r.candidates, r.schedule.steps)]
    a = np.abs(np.array(z))
    assert a.size == 3000
    tol = 5.3 * 0.6028 / math.sqrt(a.size) + 1 / 32
    assert abs(a.mean() - math.sqrt(2 / math.pi)) <= tol
    assert abs(a.mean() * 1.15 - math.sqrt(2 / math.pi)) > tol
    assert abs(a.mean() / 1.15 - math.sqrt(2 / math.pi)) > tol


def test_validation():
    good = dict(epsilon=1.0, delta=1e-7, max_tuples_per_user=8, q=0.5, rng=zero_noise())
    for bad in (dict(delta=0.0), dict(delta=1.0), dict(delta=-1e-3), dict(delta=1e-20), dict(epsilon=0.0),
                dict(q=0.0), dict(alpha=1.0), dict(epsilon=1e-4)):
        with pytest.raises(ConfigError):
            s4s_scalar_rdp([1.0], [0], [0], **{**good, **bad})
    # data above Δ is not an error
    r = s4s_scalar_rdp(np.ones(20), np.arange(20), np.zeros(20, int), **good)
    assert math.isfinite(r.estimate)
