r"""The one source of randomness for releases, and the floating-point proofs behind it.

Everything here is vectorised numpy. ``NoiseSource`` draws its bits straight from the
operating system's entropy pool (``os.urandom``); there is no seedable PRNG state in a release.
Tests obtain a seeded or a zero-noise source only through ``dpsql.testing``; the public API has
no ``seed=``.

1. Uniforms: a random sign and a magnitude
------------------------------------------
A uniform U on (0, 1) is never formed as one float (``(k + 0.5)·2⁻⁵³`` rounds to 1.0, and a
53-bit grid truncates every tail at about 36.7 noise scales). It is drawn as a pair (S, M):
S = ±1 a fair sign (which end of (0, 1) U is near) and M = min(U, 1 − U) ∈ (0, ½), the
distance to that end, in the form of Mironov's U* (Mironov 2012, §5.2):

    M = (1 + m·2⁻⁵²)·2^(−e−1),  m uniform on {0, …, 2⁵² − 1},  P(e = k) = 2^(−k), k = 1, 2, …

e is counted from the trailing zero bits of 64-bit words (a word of 64 zeros adds 64 and draws
again, so e has no upper bound). M carries 52 mantissa bits plus the geometric exponent, i.e. at
least 53 random bits, and is never 0 nor ½; (S, M) is the *floor* of an exact real uniform onto
the floating-point grid: coupling a real Ũ ~ U(0, 1) with the draw, V = 2M satisfies
V ≤ Ũ < V(1 + 2⁻⁵²). Mechanisms consume (S, e, m) directly (Laplace: −ln V = e·ln 2 − log1p(m·2⁻⁵²)
is never infinite and has no truncation; Gaussian: Φ⁻¹ of M in the lower tail, mirrored by S;
Bernoulli: an exact comparison). ``uniform_open`` is only a float *view* (U rounded to a double,
kept inside [2⁻¹⁰²³, 1 − 2⁻⁵³]).

2. Laplace under δ = 0: Mironov's snapping mechanism (proved here for this sampler)
----------------------------------------------------------------------------------
Mironov, "On significance of the least significant bits for differential privacy" (CCS 2012),
Theorem 1: for f of sensitivity 1 and λ < B < 2⁴⁶λ, with Λ the least power of two ≥ λ,

    f̃(D) = clamp_B( ⌊ clamp_B(f(D)) ⊕ S ⊗ λ ⊗ LN(U*) ⌉_Λ )

is (1/λ + 2⁻⁴⁹·B/λ)-DP (the proof's last line: ((1 + 12Bη)/λ + 2η)-DP, η = 2⁻⁵³), *assuming an
exactly rounded logarithm*. numpy's ``log1p`` is only faithfully rounded, so dpsql uses the
following self-contained variant of the theorem for the sampler above (all constants below are
what the code charges):

**Theorem (snapping, as implemented).** Let x, x′ be the computed values on neighbouring
datasets, each within 2⁻⁵²·B of an exact statistic of sensitivity Δ (|x_exact − x′_exact| ≤ Δ).
Let λ > 0, Λ = 2^⌈log₂ λ⌉, B a multiple of Λ with Λ ≤ B ≤ 2⁴¹Λ, and assume (A1) numpy's log1p
on [0, 1) errs by less than one ulp (faithful rounding; glibc documents < 1 ulp), and IEEE
binary64 round-to-nearest for +, −, ×. The mechanism

    y = clamp_B( Λ·rint( fl(clamp_B(x) + S·fl(λ·T̂)) / Λ ) ),  T̂ = fl(fl(e·ln2) − fl(log1p(m·2⁻⁵²)))

is ε_snap-DP with ε_snap = Δ/λ + 2⁻⁴⁵·(B/λ + 2).

*Proof.* (i) τ = −ln(V) = e ln 2 − log1p(w) exactly; the three roundings and (A1) give
|T̂ − τ| ≤ 2⁻⁵³(1.5e + 1 + |T̂|) ≤ 2⁻⁵¹(τ + 1) (using e ≤ τ/ln 2 + 1). With the coupling
τ − 2⁻⁵² < τ_c := −ln Ũ ≤ τ, L := Sλτ_c is *exactly* Laplace(λ) and the float noise
Ŷ = S·fl(λT̂) satisfies |Ŷ − L| ≤ 2⁻⁵⁰(|L| + λ). (ii) On outputs y with |y| < B (so
|z| ≤ B + Λ/2 and |L| ≤ 2B + Λ), the computed z = fl(x + Ŷ) is within
E := 2⁻⁴⁸(1.07·B + Λ) of x_exact + L (adding the 2⁻⁵³|z| rounding and the 2⁻⁵²B input error).
Division by Λ, rint and multiplication by Λ are exact. Hence, with I_y the rounding cell of y
(an interval of length Λ, or a half-line [B − Λ/2, ∞) / (−∞, −B + Λ/2] for y = ±B; for the
half-lines, noise beyond 2B + Λ lands on the correct side because it is still 2⁻⁵⁰-accurate),
    P_exact(x + L ∈ I_y shrunk by E) ≤ P(y | x) ≤ P_exact(x + L ∈ I_y grown by E).
(iii) B ≤ 2⁴¹Λ gives E ≤ Λ/64 ≤ λ/32. The Laplace density is 1/λ-log-Lipschitz, so each sliver
of width 2E at a cell edge carries at most 2E/(λ(e^{−1/16} − e^{−1})) ≤ 3.52·E/λ times the
probability of the shrunk cell, and a half-line's probability changes by at most e^{2E/λ}.
So P(y|x)/P(y|x′) ≤ e^{Δ/λ}(1 + 7.1E/λ) ≤ exp(Δ/λ + 8·2⁻⁴⁸(B + Λ)/λ), and Λ < 2λ. ∎

Hypothesis on the input: counts are exact integers, and DAWA's and DP-S4S's values are exact up
to one rounding; a bounded SUM (AVG's and the variances' sums) is the exact sum of its clamped
values on a fixed-point grid (``dpsql.rewrite.bound.fixed_point_scale``), which reaches Python as
an exact integer and enters as its correctly rounded double (:func:`round_exactly`: one rounding,
within 2⁻⁵³ of it). A larger input error e would add 8e/λ to ε (snapping) or about 2e/γ to δ
(Gaussian); the Gaussian releases of exact sums take no input error at all (:func:`add_exactly`).

Vectors: noise is independent per coordinate; a coordinate whose value is the same for D and
D′ has the same output distribution, so a release in which one unit changes at most N
coordinates, with L1 change ≤ Δ₁ in units of λ, is (Δ₁/λ + N·2⁻⁴⁵(B/λ + 2))-DP.
Calibration (:func:`snapping_calibration`) picks B = 2^K·Λ (capped at the representable bound:
2⁶² for integer results) with K ≤ 40 the largest exponent whose extra term is ≤ 1/1000 of the
coordinate's budget, then solves λ = Δ/(ε_coord − 2⁻⁴⁵(2^{K+1} + 2)) so that the *proven* ε is
at most the ε the analyst asked for, which is what the ledger charges. B is public: it depends
only on (ε, Δ) and K, never on data. Scales λ below 2⁻⁹⁰⁰ (:data:`MIN_SCALE`) are refused: above it,
the absolute rounding error of a subnormal intermediate (at most 2⁻¹⁰⁷⁵) is below 2⁻¹⁵⁰·λ, inside the
relative-error terms of the proof (the Gaussian samplers of section 3 refuse σ below it likewise).
Parameters whose noise or result cannot be represented
(ε too small for the extra term, Λ beyond 2⁵² for integer results) are refused before any
charge.

3. Gaussian releases: the floating-point δ of the sampler
---------------------------------------------------------
X̂ = S·fl(σ·(−ndtri(M))) with M the float view of the magnitude. Couple with the exact
G = −S·Φ⁻¹(M_real) ~ N(0, 1). Assume (A2) scipy's ``ndtri`` has relative error ≤ 2⁻⁴⁸ on
(0, ½] (Cephes documents ~2·10⁻¹⁶ ≈ 2⁻⁵²; the test suite cross-checks it against Python's
independent ``statistics.NormalDist``). The floor coupling moves Φ⁻¹ by at most
max_p p/φ(Φ⁻¹(p))·2⁻⁵² = 1.2533·2⁻⁵² on (0, ½]. So, for t = σG,

    |X̂ − t| ≤ ϑ(t) := a|t| + c₀σ,  a = 2⁻⁴⁷, c₀ = 2⁻⁵⁰,

except when e > 1021 (the float view of M is then computed with e = 1021; probability 2⁻¹⁰²¹).

A released coordinate is q(fl(v + X̂)) for a monotone rounding q to granularity γ (released
values are exactly what the analyst sees). IEEE addition returns the correctly rounded exact
sum, so the output is q*(v + X̂) for the *fixed* monotone step function q* = q ∘ RN of the real
sum: the data-dependent rounding of the addition is part of a data-independent post-processing.
The ideal output q*(v + t) is post-processing of the exact Gaussian mechanism, and the two
differ only if a boundary of q* lies within ϑ(t) of v + t. (Integer columns compute
v + rint(X̂) exactly for |v| ≤ 2⁵²; it differs from the ideal v + rint(t) = rint(v + t) (a.s.)
only if a half-integer lies within ϑ(t) of t, the same bound with γ = 1.) The boundaries of q* are at least
γ′ = γ(1 − 2⁻⁸) apart: a preimage of q is γ wide up to the spacing u of the doubles, and q keeps u
at most γ·2⁻¹⁰ (from T = 2^⌈log₂(2⁴²γ)⌉ on, where the doubles are coarser, it rounds to the power-of-two
grid G = 2¹⁰u ≥ γ of each binade, whose boundaries are exact and G − u apart, and the last decimal cell
below T joins T, so the switch leaves more than γ; a decimal grid at such values would leave cells as
narrow as 0.31γ, and ties to even at the half-grid doubles 0.5γ); the decimal clean-up only merges. Summing the sliver probabilities of a function that is
unimodal on each half-line (Σ_k f(b_k) ≤ ∫f/γ′ + 2·sup f) gives, per coordinate,

    δ_round ≤ 1.04·2/(1 − a)·[ (aσ√(2/π) + c₀σ)/γ′ + 2(0.242·a + 0.399·c₀) ] + 2⁻¹⁰⁰⁰,

where 1.04 bounds the density variation across a sliver for |t| ≤ 2²⁰σ and 2⁻¹⁰⁰⁰ the rest
(sup_t (|t|/σ)φ(t/σ) = φ(1) < 0.242, φ(0) < 0.399). The sparse histogram's threshold test is
done exactly in the reals (X̂ ≥ τ* − c with integer τ* and c), so it flips only if t lies
within ϑ of τ* − c: δ_thr ≤ 1.04·2/(1 − a)(0.242a + 0.399c₀). Each coordinate also carries
the 2⁻¹⁰²⁰ cap event.

Coordinates untouched by the unit have identical distributions under D and D′ (independent
noise), so conditioning on them leaves the ≤ N affected coordinates, and the total-variation
coupling gives P̂(A|D) ≤ P(A|D) + δ_fp ≤ e^ε P(A|D′) + δ + δ_fp ≤ e^ε P̂(A|D′) + δ + (1 + e^ε)δ_fp:
the mechanism is (ε, δ + (1 + e^ε)·Σ_affected δ_coord)-DP. :func:`gaussian_fp_delta` computes
δ_coord; calibration adds (1 + e^ε)·Σ to the charged δ (shown in explain/params as
``fp_delta``).
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from dpsql.errors import ConfigError

_TWO52 = 2.0**52
_LN2 = math.log(2.0)
#: the float view of M holds e at this cap (M >= 2**-1023 > 0)
_E_CAP = 1021
#: largest bound for integer-valued snapped results (int64 range, with margin)
INT_BOUND = 2.0**62
#: largest bound for float-valued snapped results
FLOAT_BOUND = 2.0**1000
#: noise scales below this are refused: from 2^-900 on, subnormal rounding (absolute, at most 2^-1075) is
#: below 2^-150 of the scale, inside the relative-error terms of the proofs in sections 2 and 3
MIN_SCALE = 2.0**-900
TINY_SCALE_HINT = ("use a smaller epsilon, or (a bounded aggregate) declare wider bounds or aggregate a rescaled "
                   "value (e.g. x * 1e6) and rescale the result")
#: largest noise grid for integer results: Λ <= 2**52 keeps unit resolution and B <= 2**62
MAX_INT_GRID = 2.0**52
#: Gaussian sampler constants (section 3 of the module docstring)
GAUSS_REL = 2.0**-47
GAUSS_ABS = 2.0**-50
#: bound on |value| of integer Gaussian releases (exact addition)
INT_VALUE_BOUND = 2.0**52


def snapping_extra(bound_over_lambda: float) -> float:
    """The additive term of the snapping theorem: 2⁻⁴⁵·(B/λ + 2), per affected coordinate."""
    return 2.0**-45 * (bound_over_lambda + 2.0)


def snapping_epsilon(sensitivity: float, lam: float, bound: float) -> float:
    """Proven ε of one snapped coordinate: Δ/λ + 2⁻⁴⁵(B/λ + 2) (module docstring, section 2)."""
    return sensitivity / lam + snapping_extra(bound / lam)


def power_of_two_at_least(x: float) -> float:
    """Λ: the least power of two >= x (x > 0, finite)."""
    m, ex = math.frexp(x)  # x = m * 2**ex, m in [0.5, 1)
    return math.ldexp(1.0, ex - 1) if m == 0.5 else math.ldexp(1.0, ex)


#: the largest exponent K of the snapping bound B = 2^K·Λ (the theorem needs B <= 2^41·Λ)
SNAP_MAX_EXPONENT = 40


def snapping_exponent(share: float, *, what: str = "the release") -> int:
    """K <= 40: the largest exponent with 2⁻⁴⁵(2^(K+1) + 2) <= share (B = 2^K·Λ), at least 10.

    A larger B clamps fewer true values (a count is clamped only beyond 2^K noise grids); the
    price is the extra ε term, kept at most ``share`` (1/1000 of the coordinate's budget)."""
    k = SNAP_MAX_EXPONENT
    while k >= 10 and snapping_extra(2.0 ** (k + 1)) > share:
        k -= 1
    if k < 10:
        raise ConfigError(
            f"epsilon is too small for {what}: floating-point noise cannot be calibrated this fine",
            hint="use a larger epsilon (the release would be pure noise anyway)",
        )
    return k


def snapping_grid(
    lam: float, k: int, *, integer: bool = True, what: str = "the release", max_bound: float | None = None
) -> tuple[float, float]:
    """(Λ, B) for scale λ and exponent K: Λ = 2^⌈log₂ λ⌉, B = min(2^K·Λ, cap); refuses overflow."""
    if not (math.isfinite(lam) and 0 < lam <= FLOAT_BOUND):
        raise ConfigError(f"the noise scale of {what} overflows", hint="use a larger epsilon or tighter declared bounds")
    if lam < MIN_SCALE:  # below it, subnormal rounding is no longer small against the scale (the theorem's E)
        raise ConfigError(f"the noise scale of {what} ({lam:.3g}) is too small for a double",
                          hint=TINY_SCALE_HINT)
    grid = power_of_two_at_least(lam)
    cap = INT_BOUND if integer else FLOAT_BOUND
    if max_bound is not None:
        cap = min(cap, float(max_bound))
    if grid > min(MAX_INT_GRID if integer else cap, cap / 2.0**10):
        raise ConfigError(
            f"the noise of {what} (scale {lam:.3g}) cannot be represented"
            + (" in a 64-bit integer result" if integer else ""),
            hint="use a larger epsilon or tighter declared bounds",
        )
    steps = cap / grid  # inf for a fine grid under the double bound (bounds near 1e-4 and below)
    top = math.floor(steps) * grid if math.isfinite(steps) else math.inf
    return grid, min(math.ldexp(grid, k), top)  # a multiple of Λ


def snapping_calibration(
    sensitivity: float,
    epsilon: float,
    *,
    coordinates: int = 1,
    integer: bool = True,
    what: str = "the release",
    max_bound: float | None = None,
) -> tuple[float, float, float]:
    """(λ, Λ, B) for a snapped Laplace release costing at most ``epsilon``.

    ``coordinates`` (N) is how many coordinates one unit can change, ``sensitivity`` (Δ₁) the
    L1 change over them; the proven ε is Δ₁/λ + N·2⁻⁴⁵(B/λ + 2) ≤ epsilon. Raises ConfigError
    (before any charge) when the noise or the result cannot be represented.
    """
    eps = float(epsilon)
    d = float(sensitivity)
    n = max(1, int(coordinates))
    if d == 0.0 and math.isfinite(eps) and eps > 0:  # the sensitivity underflowed (a variance squares its bounds)
        raise ConfigError(f"the noise scale of {what} (0) is too small for a double",
                          hint=TINY_SCALE_HINT)
    if not (math.isfinite(eps) and eps > 0 and math.isfinite(d) and d > 0):
        raise ConfigError(f"cannot calibrate {what}: epsilon={epsilon!r}, sensitivity={sensitivity!r}")
    k = snapping_exponent(eps / 1000.0 / n, what=what)
    lam = d / (eps - n * snapping_extra(2.0 ** (k + 1)))
    grid, bound = snapping_grid(lam, k, integer=integer, what=what, max_bound=max_bound)
    # the proven ε at most ε in exact arithmetic: the bound's slack 2^{K+1} − B/λ vanishes when λ lies just
    # above a power of two, and λ rounded down then proved an ulp more than ε; step λ up by ulps instead
    while Fraction(d) / Fraction(lam) + n * Fraction(2) ** -45 * (Fraction(bound) / Fraction(lam) + 2) > Fraction(eps):
        lam = math.nextafter(lam, math.inf)
        grid, bound = snapping_grid(lam, k, integer=integer, what=what, max_bound=max_bound)
    return lam, grid, bound


def gaussian_fp_delta(
    sigma: float,
    granularity: float,
    *,
    integer: bool,
    threshold: bool = False,
) -> float:
    """δ_coord of one Gaussian coordinate (module docstring, section 3). Vectorisable inputs not needed."""
    s = float(sigma)
    g = float(granularity)
    if not (math.isfinite(s) and s > 0 and math.isfinite(g) and g > 0):
        raise ConfigError(f"invalid Gaussian parameters sigma={sigma!r}, granularity={granularity!r}")
    a = GAUSS_REL
    c = GAUSS_ABS * s
    gp = (1.0 if integer else g) * (1.0 - 2.0**-8)
    sliver = 1.04 * 2.0 / (1.0 - a)
    out = sliver * ((a * s * math.sqrt(2.0 / math.pi) + c) / gp + 2.0 * (0.242 * a + 0.399 * c / s)) + 2.0**-1000
    if threshold:
        out += sliver * (0.242 * GAUSS_REL + 0.399 * GAUSS_ABS)
    return out + 2.0**-1020


def gaussian_fp_delta_affine(granularity: float, *, integer: bool) -> tuple[float, float]:
    """(slope, intercept) with :func:`gaussian_fp_delta`(σ, γ) = slope·σ + intercept for every σ > 0 (section 3:
    the bound is affine in σ). So for a random σ independent of the Gaussian draws, the expected δ_coord is
    δ_coord at E[σ] — the form a mechanism with a data-dependent noise scale needs (``s4s_vector``)."""
    g = float(granularity)
    if not (math.isfinite(g) and g > 0):
        raise ConfigError(f"invalid granularity {granularity!r}")
    a = GAUSS_REL
    gp = (1.0 if integer else g) * (1.0 - 2.0**-8)
    sliver = 1.04 * 2.0 / (1.0 - a)
    slope = sliver * (a * math.sqrt(2.0 / math.pi) + GAUSS_ABS) / gp
    intercept = sliver * 2.0 * (0.242 * a + 0.399 * GAUSS_ABS) + 2.0**-1000 + 2.0**-1020
    return slope, intercept


def check_gaussian_representable(sigma: float, granularity: float, *, integer: bool, what: str) -> None:
    """Refuse (before any charge) Gaussian noise that cannot be represented at this granularity."""
    s = float(sigma)
    if 0.0 <= s < MIN_SCALE:  # the sensitivity underflowed, or nearly: bounds too narrow (a variance squares them)
        raise ConfigError(f"the noise scale of {what} ({s:.3g}) is too small for a double",
                          hint=TINY_SCALE_HINT)
    if not (math.isfinite(s) and s > 0):
        raise ConfigError(f"the noise scale of {what} is not finite (sigma={sigma!r})", hint="use a larger epsilon or delta")
    if integer and s > 2.0**45:
        raise ConfigError(
            f"the noise of {what} (sigma {s:.3g}) cannot be represented in a 64-bit integer result",
            hint="use a larger epsilon or delta",
        )


def _trailing_zeros_plus_one(w: np.ndarray) -> np.ndarray:
    """Per uint64 word: 1 + its number of trailing zero bits (64 for a zero word), as int64."""
    low = w & (~w + np.uint64(1))  # the lowest set bit 2**t (0 for w == 0), exact as a double
    exp = np.frexp(low.astype(np.float64))[1]  # 2**t = 0.5 * 2**(t + 1): t + 1 (0 for w == 0)
    return np.where(w == 0, 64, exp).astype(np.int64)


class NoiseSource:
    """Vectorised noise drawn from OS entropy (see the module docstring)."""

    #: True only for test sources whose noise is identically zero.
    zero_noise = False

    def _random_bytes(self, n: int) -> bytes:
        return os.urandom(n)

    def _words(self, n: int) -> np.ndarray:
        return np.frombuffer(self._random_bytes(8 * n), dtype=np.uint64).copy() if n else np.zeros(0, np.uint64)

    # -- the uniform as (sign, exponent, mantissa) -------------------------------------------
    def _exponents(self, n: int) -> np.ndarray:
        """e >= 1 with P(e = k) = 2**-k, unbounded: 1 + trailing zero bits of random words. A zero
        word (probability 2**-64) adds 64 and the count goes on in a next word, drawn for the
        zero words only, in their order."""
        w = self._words(n)
        e = _trailing_zeros_plus_one(w)
        todo = np.flatnonzero(w == 0)
        while todo.size:
            w = self._words(todo.size)
            e[todo] += _trailing_zeros_plus_one(w)
            todo = todo[w == 0]
        return e

    def sign_magnitude(self, size: int | tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(S, e, f): S = ±1.0, e >= 1 (int64), f = m·2⁻⁵² in [0, 1); M = (1 + f)·2^(−e−1)."""
        shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
        n = int(np.prod(shape)) if shape else 1
        w = self._words(n)
        f = (w >> np.uint64(12)).astype(np.float64) / _TWO52  # 52 bits, exact
        sign = np.where((w & np.uint64(1)) == 1, 1.0, -1.0)
        e = self._exponents(n)
        return sign.reshape(shape), e.reshape(shape), f.reshape(shape)

    @staticmethod
    def _magnitude(e: np.ndarray, f: np.ndarray) -> np.ndarray:
        return np.ldexp(1.0 + f, -(np.minimum(e, _E_CAP) + 1))

    def uniform_magnitude(self, size: int | tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(S, M): a fair sign and the magnitude M ∈ (0, ½) (float view; M >= 2⁻¹⁰²³)."""
        s, e, f = self.sign_magnitude(size)
        return s, self._magnitude(e, f)

    def uniform_open(self, size: int | tuple[int, ...]) -> np.ndarray:
        """A float view of uniforms on (0, 1): M or 1 − M, kept inside [2⁻¹⁰²³, 1 − 2⁻⁵³].

        Mechanisms use the exact consumers (``bernoulli``, ``laplace``, ``normal``) instead.
        """
        s, m = self.uniform_magnitude(size)
        return np.where(s < 0, m, np.minimum(1.0 - m, 1.0 - 2.0**-53))

    def bernoulli(self, p: float, size: int) -> np.ndarray:
        """Boolean array, True with probability exactly p, for a double p in [2⁻¹⁰²¹, 1] (or 0).

        U < p is decided on (S, M): a double p <= ½ is a point of M's grid, and M is the floor of
        the real magnitude, so M < p <=> M_real < p; for S = +1, U = 1 − M_real < p <=>
        M_real > 1 − p <=> (a.s.) M >= 1 − p, with 1 − p exact for p >= ½ (Sterbenz).
        """
        pp = float(p)
        s, m = self.uniform_magnitude(size)
        low = m < pp  # U = M (S = -1)
        high = (m >= 1.0 - pp) if pp >= 0.5 else np.zeros(m.shape, dtype=bool)
        return np.where(s < 0, low, high)

    # -- continuous samplers ------------------------------------------------------------------
    def exponential(self, size: int | tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(S, T̂): a sign and T̂ ≈ −ln V ~ Exp(1), V = 2M, with |T̂ − (−ln V)| ≤ 2⁻⁵¹(T̂ + 1)."""
        s, e, f = self.sign_magnitude(size)
        t = e.astype(np.float64) * _LN2 - np.log1p(f)
        return s, t

    def laplace(self, scale: float | np.ndarray, size: int | tuple[int, ...]) -> np.ndarray:
        """Laplace(0, scale) samples S·scale·T̂ (never infinite, no truncated support)."""
        s, t = self.exponential(size)
        return s * (np.asarray(scale, dtype=np.float64) * t)

    def normal(self, scale: float | np.ndarray, size: int | tuple[int, ...]) -> np.ndarray:
        """N(0, scale²) samples −S·scale·ndtri(M) (M in the lower tail, mirrored by S)."""
        # imported when used: ~0.3 s of CPU, which a pure-ε command never needs
        from scipy.special import ndtri

        s, m = self.uniform_magnitude(size)
        return -s * (np.asarray(scale, dtype=np.float64) * ndtri(m))

    # -- mechanisms ----------------------------------------------------------------------------
    def snap_laplace(
        self, values: np.ndarray, lam: float | np.ndarray, grid: float | np.ndarray, bound: float | np.ndarray
    ) -> np.ndarray:
        """Mironov's snapping mechanism, vectorised: clamp_B(Λ·rint((clamp_B(x) + Lap(λ))/Λ))."""
        x = np.clip(np.asarray(values, dtype=np.float64), -bound, bound)
        if x.size == 0:
            return x
        z = x + self.laplace(lam, x.shape)
        # + 0.0: the grid point only (rint gives -0.0 in the zero cell's lower half, a sign the analysis does not release)
        return np.clip(np.rint(z / grid) * grid, -bound, bound) + 0.0

    def gaussian_noise(self, sigma: float, size: int) -> np.ndarray:
        """Raw N(0, sigma²) noise for :func:`gaussian_release` and threshold tests."""
        return self.normal(sigma, size)

    def salt(self) -> str:
        """A per-query secret salt (hex) for hash-based random choices inside DuckDB."""
        return secrets.token_hex(16)


def gaussian_release(values: np.ndarray, noise: np.ndarray, *, integer: bool) -> np.ndarray:
    """value + noise as analysed in section 3 (integers: v + rint(noise), exact for |v| <= 2⁵²)."""
    v = np.asarray(values, dtype=np.float64)
    if integer:
        return np.clip(np.rint(v), -INT_VALUE_BOUND, INT_VALUE_BOUND) + np.rint(noise) + 0.0  # never -0.0
    return v + noise


def dyadic_sum(terms: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """Σ n_i·2^(−s_i) exactly, as (n, s) with value n·2^(−s) (Python integers: no bound, no rounding)."""
    s = max((si for _, si in terms), default=0)
    return sum((n << (s - si) for n, si in terms), 0), s


def add_exactly(values: Sequence[tuple[int, int]], noise: np.ndarray) -> np.ndarray:
    """RN(v + x) for exact values v = n·2^(−s) (given as (n, s)) and the doubles x of ``noise``: the
    correctly rounded real sum, what IEEE addition returns for an exact v (section 3: the release is then
    q*(v + X̂) of the exact statistic, with no rounding of v before the noise whatever its magnitude).
    CPython divides integers with correct rounding; beyond the double range: ±inf, and an infinite (or NaN)
    noise sample is passed through (never an exception)."""
    out = np.empty(len(values), dtype=np.float64)
    for i, ((n, s), x) in enumerate(zip(values, np.asarray(noise, dtype=np.float64).tolist(), strict=True)):
        if not math.isfinite(x):  # a noise sample beyond the double range: v + x is x, as IEEE addition gives
            out[i] = x
            continue
        a, b = x.as_integer_ratio()  # b is a power of two
        t = max(s, b.bit_length() - 1, 0)
        num = (n << (t - s)) + (a << (t - b.bit_length() + 1))
        try:
            out[i] = num / (1 << t)
        except OverflowError:
            out[i] = math.inf if num > 0 else -math.inf
    return out


def round_exactly(values: Sequence[tuple[int, int]]) -> np.ndarray:
    """RN(v) for exact values v = n·2^(−s) (given as (n, s)): the correctly rounded doubles (CPython's
    integer division); beyond the double range: ±inf. The snapping mechanism's input (section 2)."""
    out = np.empty(len(values), dtype=np.float64)
    for i, (n, s) in enumerate(values):
        try:
            out[i] = n / (1 << s) if s >= 0 else float(n << -s)
        except OverflowError:
            out[i] = math.inf if n > 0 else -math.inf
    return out


def round_to_granularity(values: np.ndarray, granularity: float) -> np.ndarray:
    """Round released noisy values to a multiple of ``granularity`` (1 for counts); monotone, and its
    boundaries (as a function of the real noisy sum) at least γ(1 − 2⁻⁸) apart for every value (section 3):
    where the doubles are coarser than γ·2⁻¹⁰ (|v| ≥ T, a power of two ≥ 2⁴²γ) the grid is the binade's power
    of two 2¹⁰·ulp ≥ γ instead, and values whose decimal cell reaches within 1.5γ of T are released as ±T."""
    if granularity <= 0:
        raise ValueError("granularity must be > 0")
    v = np.asarray(values, dtype=np.float64)
    switch = granularity * 2.0**42
    if not math.isfinite(switch):  # no double is coarse against such a grid
        return _round_fine(v, granularity)
    top = power_of_two_at_least(switch)
    coarse = np.abs(v) >= top  # False for NaN
    if not coarse.any():
        return _round_fine(v, granularity)
    out = _round_fine(np.where(coarse, 0.0, v), granularity)
    near = np.abs(out) > top - 1.5 * granularity  # the last decimal cell(s) below T join T (monotone)
    out = np.where(near, np.copysign(top, out), out)
    with np.errstate(over="ignore", invalid="ignore"):
        m, e = np.frexp(v)  # |v| = m·2^e, m in [0.5, 1): the binade's ulp is 2^(e - 53), the grid 2^(e - 43)
        grid = np.ldexp(1.0, np.where(coarse & np.isfinite(v), e, 0) - 43)
        big = np.rint(v / grid) * grid  # exact: a power-of-two grid at least 2^10 ulps
    return np.where(coarse, np.where(np.isfinite(v), big, v), out) + 0.0


def round_to_points(values: np.ndarray, granularity: float) -> np.ndarray:
    """Round post-processed values (a quantile's grid point, an AVG of released sums, a value read off a synopsis) to
    a multiple of ``granularity`` at every magnitude: only the binary noise of their arithmetic goes. The power-of-two
    grid of :func:`round_to_granularity` at large values is for the Gaussian sampler's floating-point proof alone;
    there it moved a grid point off its grid (12346000.3 at granularity 1e-6 read 12346000.299999237)."""
    if granularity <= 0:
        raise ValueError("granularity must be > 0")
    return _round_fine(np.asarray(values, dtype=np.float64), granularity)


def _round_fine(v: np.ndarray, granularity: float) -> np.ndarray:
    """Round to a multiple of ``granularity`` (values below the coarse switch of :func:`round_to_granularity`)."""
    if granularity == 1:
        return np.rint(v) + 0.0  # + 0.0: a released zero is 0, never -0.0 (whose sign tells the side it was rounded from)
    with np.errstate(over="ignore", invalid="ignore"):
        q = v / granularity
        out = np.rint(q) * granularity
        k = math.log10(granularity)
        if k < 0 and abs(k - round(k)) < 1e-9:
            # a decimal grid: also drop binary representation noise (0.30000000000000004 -> 0.3)
            out = np.round(out, int(-round(k)))
    # from 2^53 grid units on, v / g is already a whole number in doubles (rint is the identity): keep
    # v itself, sparing the round trip's error and a quotient that overflowed to inf
    return np.where(np.isfinite(v) & ~(np.abs(q) < 2.0**53), v, out) + 0.0


def default_noise_source() -> NoiseSource:
    return NoiseSource()
