"""GROUP BY over joins, large key counts: the floating-point δ check re-derived independently.

The key-count limits and δ figures pinned in test_s4s_vector_fp.py and test_s4s_vector_runtime.py (67 540 keys and
δ = 1.4e-6 for 10⁶ keys unsampled; 236 742 keys and δ = 4.1e-7 for a split SUM; δ = 1.4e-10 for four keys at
q = 1/4) were read from the code's output. Here they are computed again from the formulas of docs/mechanisms.md
§3.8-3.9 ("Large key counts") and §5.4 (one coordinate) alone: nothing from dpsql is imported. Every quantity is
computed in decimal arithmetic at 50 significant digits (Python's ``decimal``): the roots of Lemma 4.1 by monotone
Newton steps on a convex function, the Rényi order by a scan and a golden-section search, and the check itself
without the code's safety margins (q′ exact, q′(δ_A + δ_fp) ≤ δ, no factor 1 − 10⁻⁹, no 1 + 10⁻¹²). Where the
docs leave a choice to the implementation (the order α, the grid of p) the docs' stated rule is followed.
``python tests/test_s4s_vector_fp_independent.py`` runs the longer scans behind "least" and "largest" (~2 min).

The chain, for one part with (ε, δ), d keys, sampling rate q and Δ:

* ε₁ = ε/10, ε₂ = 9ε/10, θ₀ = (30/ε)ln(6/β), β = 1/10, κ = 1 + 10⁻³, τ ∈ {1, 2, …, 2^⌈log₂Δ⌉} (L of them),
  q′ = 1 − (1 − q)^Δ, and the float share s ∈ {0.1, 0.25, 0.5, 0.75}: δ_A = (1 − s)δ.
* Lemma 4.1 (§3.8, the proof's η): A = e^{(α−1)ρ/d}, t₁ < 1 < t₂ the roots of t^α − αAt + (α−1)A,
  γ = ½ln min(1/t₁, t₂), η = √(α/(ρc)), c = 1 − α + αe^{−2γ}, ρ = ε₂ − ln(1/δ_A)/(α − 1);
  SS(B, γ) = max_{k ≥ 0 integer} (k + B)e^{−γk}; α minimises η·SS(1/κ, γ).
* σ_lo(τ) = 2τκη·SS(1/κ, γ); the grid γ_τ = 2^{⌊log₂(σ_lo(τ)/16)⌋ + k}, k ≤ 5 (γ_τ ≤ 2σ_lo) at every share, and at
  s = 3/4 also k = 6, the one grid in (2σ_lo, 4σ_lo] (the cap 4σ_lo).
* One coordinate (§5.4): δ_coord(σ, γ) = slope(γ)·σ + c₀, slope(γ) = 1.04·2/(1 − a)·(a√(2/π) + c)/(γ(1 − 2⁻⁸)),
  c₀ = 1.04·2/(1 − a)·2(0.242a + 0.399c) (+ 2⁻¹⁰⁰⁰ + 2⁻¹⁰²⁰), a = 2⁻⁴⁷, c = 2⁻⁵⁰.
* Expectation bound: Ŝ = e^{γ/κ−1}/γ·(1 + e^{γθ₀/κ}·X/(1 − (2γ/ε₁)²)), X = min_p (n/(1 − (4pγ/ε₁)²))^{1/p} over
  p = 1 and p = j/(20·4γ/ε₁) > 1 (j = 1 … 19), n = max(1, L − 1) the SVT's query noises before the last τ;
  P_mean = max_τ slope(γ_τ)·2τκη·Ŝ + c₀. Cap bound: P_cap = max_τ δ_coord(σ_cap(τ), γ_τ) + p₀,
  σ_cap(τ) = 2τκη·SS(B_cap/κ, γ), B_cap = θ₀ + 1 + (8κ/ε₁)ln(L/p₀), p₀ = 10⁻³δ. P_coord = min of the two.
* δ_fp = (1 + e^ε)(d·P_coord + L·2⁻⁴⁰); the part answers d iff some share and allowed grid give
  q′(δ_A + δ_fp) ≤ δ.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

import pytest

PREC = 50
PI = Decimal("3.141592653589793238462643383279502884197169399375")
ONE = Decimal(1)
TWO = Decimal(2)
KAPPA = Decimal("1.001")
BETA = Decimal("0.1")
SHARES = (Decimal("0.1"), Decimal("0.25"), Decimal("0.5"), Decimal("0.75"))
A_REL = Decimal(2.0**-47)  # exact (binary fractions convert exactly)
C_ABS = Decimal(2.0**-50)


def _dec(x: object) -> Decimal:
    if isinstance(x, Fraction):
        return Decimal(x.numerator) / Decimal(x.denominator)
    return Decimal(str(x))


def _pow(x: Decimal, y: Decimal) -> Decimal:
    return (x.ln() * y).exp()


def sliver() -> Decimal:
    return Decimal("1.04") * 2 / (1 - A_REL)


def slope(grid: Decimal) -> Decimal:
    return sliver() * (A_REL * (2 / PI).sqrt() + C_ABS) / (grid * (1 - TWO**-8))


def intercept() -> Decimal:
    return sliver() * 2 * (Decimal("0.242") * A_REL + Decimal("0.399") * C_ABS) + TWO**-1000 + TWO**-1020


def smooth_sensitivity(b: Decimal, gamma: Decimal) -> Decimal:
    """max over integers k ≥ 0 of (k + B)e^{−γk}: log-concave in k, so the maximum is at 0 or next to 1/γ − B."""
    x = 1 / gamma - b
    ks = {0}
    if x > 0:
        f = int(x)
        ks |= {f, f + 1}
    return max((k + b) * (-gamma * k).exp() for k in ks)


def _newton(hdh, t: Decimal, ref: Decimal) -> Decimal:  # type: ignore[no-untyped-def]
    """A convex h (``hdh(t)`` gives h(t) and h′(t)) started where h > 0 on the far side of its root: the steps approach
    the root monotonically (until rounding: a step against the direction of travel, or one below 10⁻³⁰·|t − ref|,
    ends the iteration)."""
    v, d = hdh(t)
    assert v > 0
    first = None
    for _ in range(5000):
        step = v / d
        if first is None:
            first = step
        if step * first <= 0:
            return t
        t -= step
        if abs(step) < Decimal(10) ** -30 * abs(t - ref):
            return t
        v, d = hdh(t)
    raise AssertionError("no convergence")


def gamma_and_c(alpha: Decimal, rho: Decimal, d: int) -> tuple[Decimal, Decimal]:
    """γ = ½ln min(1/t₁, t₂) and c = 1 − α + αe^{−2γ}. With l = (α−1)/α, h(l + y) = (l + y)^α − αA·y exactly, so t₁
    is found as l + y₁ (y₁ > 0, no cancellation when A is large), and then c = α·y₁."""
    big_a = ((alpha - 1) * rho / d).exp()
    low = (alpha - 1) / alpha

    # h and h′ share one power: x^(α−1) = x^α / x (one logarithm and one exponential per Newton step)
    def g(y: Decimal) -> tuple[Decimal, Decimal]:
        p = _pow(low + y, alpha)
        return p - alpha * big_a * y, alpha * p / (low + y) - alpha * big_a

    def h(t: Decimal) -> tuple[Decimal, Decimal]:
        p = _pow(t, alpha)
        return p - alpha * big_a * t + (alpha - 1) * big_a, alpha * p / t - alpha * big_a

    assert h(ONE)[0] < 0
    y1 = _newton(g, Decimal(0), Decimal(0))
    t1 = low + y1
    t2 = _newton(h, _pow(alpha * big_a, 1 / (alpha - 1)), ONE)
    assert 0 < y1 and t1 < 1 < t2
    if 1 / t1 <= t2:
        return (1 / t1).ln() / 2, alpha * y1
    return t2.ln() / 2, 1 - alpha + alpha / t2


@dataclass(frozen=True)
class Release:
    alpha: Decimal
    rho: Decimal
    gamma: Decimal
    eta: Decimal
    factor: Decimal  #: η·SS(1/κ, γ)


def release(alpha: Decimal, eps2: Decimal, delta_a: Decimal, d: int) -> Release | None:
    rho = eps2 - (1 / delta_a).ln() / (alpha - 1)
    if rho <= 0:
        return None
    gamma, c = gamma_and_c(alpha, rho, d)
    assert 0 < c < 1
    eta = (alpha / (rho * c)).sqrt()
    return Release(alpha, rho, gamma, eta, eta * smooth_sensitivity(1 / KAPPA, gamma))


@lru_cache(maxsize=256)
def best_release(eps2: Decimal, delta_a: Decimal, d: int) -> Release:
    """α > α₀ = 1 + ln(1/δ_A)/ε₂ minimising η·SS(1/κ, γ): a scan of α₀ + α₀·2^{j/4}, then golden section.
    Cached: a pure function of its arguments (always computed at ``PREC`` digits), and the controls (``checks`` with
    ``extra_noises``, which changes only Ŝ) ask again for the releases of the figures they control."""
    a0 = 1 + (1 / delta_a).ln() / eps2
    xs = [a0 + a0 * _pow(TWO, Decimal(j) / 4) for j in range(-48, 25)]
    vals = [release(x, eps2, delta_a, d) for x in xs]
    fs = [v.factor if v else Decimal("Infinity") for v in vals]
    i = min(range(len(xs)), key=lambda j: fs[j])
    assert 0 < i < len(xs) - 1, "the minimum lies inside the scanned range"
    lo, hi = xs[i - 1], xs[i + 1]
    r = (Decimal(5).sqrt() - 1) / 2

    def f(x: Decimal) -> Decimal:
        v = release(x, eps2, delta_a, d)
        assert v is not None
        return v.factor

    x1, x2 = hi - r * (hi - lo), lo + r * (hi - lo)
    f1, f2 = f(x1), f(x2)
    # to 10⁻¹² of α: the factor is then within 10⁻¹² of its minimum even at a kink of SS (10⁻²⁴ where smooth), six
    # orders below the finest figure checked (a slack of 10⁻¹³ on δ_fp = 7.5·10⁻⁸)
    while hi - lo > Decimal(10) ** -12 * hi:
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - r * (hi - lo)
            f1 = f(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + r * (hi - lo)
            f2 = f(x2)
    out = release((lo + hi) / 2, eps2, delta_a, d)
    assert out is not None
    return out


def stopped_ss(gamma: Decimal, eps1: Decimal, theta0: Decimal, n: int) -> Decimal:
    s1 = 4 * gamma / eps1
    s0 = 2 * gamma / eps1
    assert s1 < 1
    ps = [ONE] + [Decimal(j) / 20 / s1 for j in range(1, 20) if Decimal(j) / 20 / s1 > 1]
    x = min(_pow(n / (1 - (p * s1) ** 2), 1 / p) for p in ps)
    return (gamma / KAPPA - 1).exp() / gamma * (1 + (gamma * theta0 / KAPPA).exp() / (1 - s0 * s0) * x)


@dataclass(frozen=True)
class Check:
    share: Decimal
    grid: Decimal  #: at τ = 1
    sigma_lo: Decimal  #: at τ = 1, before 1/q
    fp: Decimal
    slack: Decimal  #: q′(δ_A + δ_fp) − δ: the check passes iff ≤ 0
    per_coord: Decimal  #: (1 + e^ε)·P_coord
    allow: Decimal  #: the d at which the check is tight with P_coord held fixed (this share and grid)
    bound: str  #: which bound gave P_coord: "mean" (expectation) or "cap"

    @property
    def passes(self) -> bool:
        return self.slack <= 0


@lru_cache(maxsize=64)
def checks(epsilon: object, delta: object, d: int, q: Fraction, max_tuples: int, extra_noises: int = 0) -> list[Check]:
    """For every share, the coarsest grid it may use (a coarser grid only lowers δ_fp): the check's slack.
    ``extra_noises`` (controls only) counts more SVT query noises in Ŝ than the L − 1 drawn."""
    with localcontext() as ctx:
        ctx.prec = PREC
        eps, dl = _dec(epsilon), _dec(delta)
        eps1, eps2 = eps / 10, eps * 9 / 10
        theta0 = 30 / eps * (6 / BETA).ln()
        n_tau = 1
        while 2 ** (n_tau - 1) < max_tuples:
            n_tau += 1
        taus = [TWO ** i for i in range(n_tau)]
        qp = _dec(1 - (1 - q) ** max_tuples)
        mult = 1 + eps.exp()
        p0 = dl / 1000
        b_cap = theta0 + 1 + 8 * KAPPA / eps1 * (n_tau / p0).ln()
        c0 = intercept()
        out = []
        for share in SHARES:
            delta_a = (1 - share) * dl
            r = best_release(eps2, delta_a, d)
            ss1 = smooth_sensitivity(1 / KAPPA, r.gamma)
            ssc = smooth_sensitivity(b_cap / KAPPA, r.gamma)
            lo = [2 * t * KAPPA * r.eta * ss1 for t in taus]
            cap = [2 * t * KAPPA * r.eta * ssc for t in taus]
            k = 5 if share < SHARES[-1] else 6
            grids = []
            for s in lo:
                e = 0
                while TWO ** (e + 1) <= s / 16:
                    e += 1
                while TWO**e > s / 16:
                    e -= 1
                grids.append(TWO ** (e + k))
            assert all(g <= 4 * s for g, s in zip(grids, lo))
            s_hat = stopped_ss(r.gamma, eps1, theta0, max(1, n_tau - 1) + extra_noises)
            mean = max(slope(g) * 2 * t * KAPPA * r.eta for g, t in zip(grids, taus)) * s_hat + c0
            capb = max(slope(g) * sc + c0 for g, sc in zip(grids, cap)) + p0
            pc = min(mean, capb)
            fp = mult * (d * pc + n_tau * TWO**-40)
            need = qp * (delta_a + fp)
            allow = (dl / qp - delta_a - mult * n_tau * TWO**-40) / (mult * pc)
            out.append(Check(share, grids[0], lo[0], fp, need - dl, mult * pc, allow, "mean" if mean <= capb else "cap"))
        return out


def answers(epsilon: object, delta: object, d: int, q: Fraction, max_tuples: int, extra_noises: int = 0) -> bool:
    return any(c.passes for c in checks(epsilon, delta, d, q, max_tuples, extra_noises))


# ---------------------------------------------------------------------------------------------------------------
# The figures. Every expected number below is this file's own computation (50 digits), written as a literal; they
# agree with those pinned from the code in test_s4s_vector_fp.py and test_s4s_vector_runtime.py.

ONE_Q = Fraction(1)
QUARTER = Fraction(1, 4)


def _best(cs: list[Check]) -> Check:
    return min(cs, key=lambda c: c.slack)


def test_one_coordinate_by_hand() -> None:
    with localcontext() as ctx:
        ctx.prec = PREC
        c0 = intercept()
        mult = 1 + Decimal(4).exp()
        assert abs(c0 / Decimal("8.6274e-15") - 1) < Decimal("1e-4")
        # the intercept bound at share 3/4 (ε = 4, δ = 1e-7): no grid lets more keys through
        assert int(Decimal("0.75e-7") / (mult * c0)) == 156358


def test_largest_key_count_unsampled() -> None:
    """ε = 4, δ = 1e-7, q = 1, Δ = 4: 67 540 keys pass at share 3/4 with the capped grid 4096 (σ_lo = 1644.29,
    4σ_lo = 6577 < 8192); 67 541 fail. Up to the next grid step (d = 105 684, where the grid 8192 allows only
    86 142 keys) and the intercept bound 156 358 nothing larger passes (``python tests/<this file>``)."""
    top = checks(4, "1e-7", 67540, ONE_Q, 4)
    b = _best(top)
    assert b.passes and b.share == Decimal("0.75") and b.grid == 4096 and b.bound == "mean"
    assert abs(b.sigma_lo - Decimal("1644.2875")) < Decimal("1e-4")
    assert abs(b.fp / Decimal("7.49988e-8") - 1) < Decimal("1e-5")
    assert 67541 < b.allow < 67542  # the check is tight just above 67 540
    assert not any(c.passes for c in top[:3])  # no smaller share reaches it
    nxt = checks(4, "1e-7", 67541, ONE_Q, 4)
    assert not any(c.passes for c in nxt)  # control
    assert Decimal("1e-13") < _best(nxt).slack < Decimal("3e-13")  # far above the code's margins (1e-16 here)


def test_least_delta_for_a_million_keys_unsampled() -> None:
    """d = 10⁶: 1.4e-6 is the least two-digit δ (grid 16384 at share 3/4); 1.3e-6 fails, and so does every
    two-digit δ from the intercept bound 6.4e-7 up (the scan in ``__main__``)."""
    ok = _best(checks(4, "1.4e-6", 10**6, ONE_Q, 4))
    assert ok.passes and ok.share == Decimal("0.75") and ok.grid == 16384
    assert abs(ok.sigma_lo - Decimal("5369.943")) < Decimal("1e-3")
    assert not answers(4, "1.3e-6", 10**6, ONE_Q, 4)  # control
    assert _best(checks(4, "1.3e-6", 10**6, ONE_Q, 4)).slack > Decimal("1e-8")


def test_split_sum_parts() -> None:
    """A SUM with a negative lower bound: two parts, each (ε/2, δ/2) = (2, 5e-8) at δ = 1e-7. Per part, 236 742
    keys pass (share 3/4, grid 32768, σ_lo = 12074.21), 236 743 fail; for 10⁶ keys the part needs 2.05e-7
    (query δ 4.1e-7, grid 65536), and 2.0e-7 (query 4.0e-7) fails, as does every two-digit query δ from the
    intercept bound 1.93e-7 up."""
    top = _best(checks(2, "0.5e-7", 236742, ONE_Q, 4))
    assert top.passes and top.share == Decimal("0.75") and top.grid == 32768
    assert abs(top.sigma_lo - Decimal("12074.207")) < Decimal("1e-3")
    assert 236742 < top.allow < 236743
    assert not answers(2, "0.5e-7", 236743, ONE_Q, 4)  # control
    ok = _best(checks(2, "2.05e-7", 10**6, ONE_Q, 4))
    assert ok.passes and ok.grid == 65536
    assert not answers(2, "2.0e-7", 10**6, ONE_Q, 4)  # control


def test_least_delta_for_four_keys_sampled() -> None:
    """ε = 4, q = 1/4, Δ = 4 (q′ = 175/256), d = 4: the SVT's L·2⁻⁴⁰ alone needs
    q′(δ/4 + (1 + e⁴)·3·2⁻⁴⁰) ≤ δ, i.e. δ ≥ 1.2508e-10, so every two-digit δ ≤ 1.2e-10 fails; 1.3e-10 fails with
    the coordinates' slope term at the grid 512 ≤ 4σ_lo = 643 (σ_lo = 160.7), 1.4e-10 passes."""
    with localcontext() as ctx:
        ctx.prec = PREC
        qp = _dec(1 - (1 - QUARTER) ** 4)
        assert qp == Decimal(175) / 256
        floor = qp * (1 + Decimal(4).exp()) * 3 * TWO**-40 / (1 - qp / 4)
        assert abs(floor / Decimal("1.2508e-10") - 1) < Decimal("1e-4") and floor > Decimal("1.2e-10")
    ok = _best(checks(4, "1.4e-10", 4, QUARTER, 4))
    assert ok.passes and ok.share == Decimal("0.75") and ok.grid == 512 and ok.bound == "mean"
    assert abs(ok.sigma_lo - Decimal("160.708")) < Decimal("1e-3")
    assert not answers(4, "1.3e-10", 4, QUARTER, 4)  # control


@pytest.mark.parametrize("args", [(4, "1e-7", 67540, ONE_Q, 4), (2, "0.5e-7", 236742, ONE_Q, 4),
                                  (4, "1.4e-10", 4, QUARTER, 4)])
def test_the_figures_resolve_the_svt_noise_count(args: tuple) -> None:  # type: ignore[type-arg]
    """Negative control of the derivation's resolution: counting L query noises in Ŝ instead of the L − 1 drawn
    (the last τ compares nothing) would refuse each of these figures."""
    assert answers(*args)
    assert not answers(*args, extra_noises=1)


def _two_digit(lo: Decimal, hi: Decimal) -> list[Decimal]:
    return sorted({Decimal(m).scaleb(e) for e in range(-14, -4) for m in range(10, 100)
                   if lo <= Decimal(m).scaleb(e) <= hi})


def _main() -> None:  # pragma: no cover - the longer scans behind the docstrings above (about 2 minutes)
    with localcontext() as ctx:
        ctx.prec = PREC
        ds = _two_digit(Decimal("6.3e-7"), Decimal("1.4e-6"))
        print("d = 1e6, q = 1:", [(str(v), answers(4, v, 10**6, ONE_Q, 4)) for v in ds])
        ds = _two_digit(Decimal("1.9e-7"), Decimal("4.1e-7"))
        print("split SUM, query delta:", [(str(v), answers(2, v / 2, 10**6, ONE_Q, 4)) for v in ds])

        def sigma_lo(eps: int, dl: str, d: int) -> Decimal:
            with localcontext() as c2:
                c2.prec = PREC
                r = best_release(Decimal(eps) * 9 / 10, Decimal(dl) / 4, d)
                return 2 * KAPPA * r.eta * smooth_sensitivity(1 / KAPPA, r.gamma)

        for eps, dl, lo, hi, step in [(4, "1e-7", 67541, 156358, 2048), (2, "0.5e-7", 236743, 518128, 16384)]:
            while hi - lo > 1:  # the first d whose share-3/4 grid doubles
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if sigma_lo(eps, dl, mid) >= step else (mid, hi)
            c = checks(eps, dl, hi, ONE_Q, 4)[-1]
            print(f"eps={eps} delta={dl}: grid doubles at d={hi} to {c.grid}, which allows {float(c.allow):.0f} keys")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main())
