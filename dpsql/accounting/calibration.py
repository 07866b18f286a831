r"""Calibration of the Gaussian sparse histogram mechanism: choose σ and τ* for a target (ε, δ).

Setting (``docs/mechanisms.md`` §1 and §1.11; every § below refers to that file): a ``GROUP BY``
release with per-user group bound C_u, deterministic threshold τ on true counts, noisy threshold
τ* and Gaussian count noise σ, accounted with Theorem 5.4 (``method="exact"``,
:mod:`.sparse_histogram`) or with the Wilson et al. bound (``method="add_the_deltas"``).

Extra aggregate columns (SUM, …) — the noise convention
-------------------------------------------------------
Extra column j, with per-group L2 sensitivity Δ_j (one user changes that group's aggregate by at
most Δ_j in L2), receives independent Gaussian noise with standard deviation

    σ_j = w · Δ_j · σ            (w = ``extra_noise_multiplier``, default 1)

so every extra column has the same per-group privacy loss as the count scaled by 1/w: its μ is
Δ_j/σ_j = 1/(wσ). The per-group Mahalanobis sensitivity of the J extra columns is therefore

    mu_other² = Σ_j 1/(w²σ²) = J/(w²σ²),      μ_k² = k·(1/σ² + mu_other²) = k·(1 + J/w²)/σ²,

i.e. with w = 1 each extra column costs exactly as much Gaussian privacy as the count itself and
the Gaussian-only noise floor scales by √(1 + J). Choosing w > 1 makes the extra columns noisier and
cheaper. (The Δ_j only scale their own noise; they do not change the accounting.)

The objective: reliably-released group size
-------------------------------------------
Given (ε, δ, τ, C_u) two knobs remain, σ and τ*. Larger σ means noisier counts but a smaller
Gaussian share of δ, leaving more δ for the threshold; smaller σ means accurate counts but (near the
Gaussian-only floor σ_min) a large threshold. A group with true count n ≥ τ is published with
probability Φ((n − τ*)/σ), so the smallest group published with probability at least p
(``release_probability``, default 0.95) is

    n_p(σ) = τ*(σ) + z_p·σ,          z_p = Φ⁻¹(p)   (1.645 for p = 0.95),

where τ*(σ) is the least noisy threshold meeting (ε, δ) at that σ. We choose σ minimising n_p,
then τ* = τ*(σ). Why this objective: it is measured in the units users see (a count), it rewards
exactly the two things that matter for a sparse histogram — publishing small groups (τ*) and
publishing them with small error (σ enters with weight z_p, which is also the number of standard
deviations of noise a just-published group carries) — and it has no free constant other than an
interpretable probability. ``release_probability=0.5`` minimises τ* alone.

What the optimum looks like. τ*(σ) ≥ τ + Δτ_LB(σ) with Δτ_LB(σ) = σ·Φ⁻¹((1 − δ)^{1/C_u}) (§1.8),
linear in σ. Under the exact accounting the bound is attained as soon as the Gaussian part
does not bind, which (in every setting of ``tests/vectors``, the URL case study included) already
holds at σ_min, the least σ with δ_Gaussian ≤ δ: δ_GSHM = max(δ_infinite, δ_Gaussian) there, so
both parts may use the whole δ. Then σ_min minimises σ and τ* simultaneously, for every p — there
is no trade-off, and calibration costs two Theorem-5.4 evaluations. When the Gaussian part does bind
(possible for large μ), we scan σ/σ_min − 1 on a log grid (stopping at the first σ where the bound is
attained: beyond it n_p only grows) and refine the best cell with bounded Brent. Under add-the-deltas
the two δ's are added, so n_p(σ) is U-shaped (→ ∞ at σ_min) and the same scan + Brent finds its
minimum from closed forms. Either way calibration takes a few ms for C_u up to 1e5.

The returned τ* is a float; round it up (:func:`.sparse_histogram.round_tau_star_up`) before use.
If σ is rounded up too, recompute τ* for the rounded σ with :func:`calibrate_sparse_histogram_fixed`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from dpsql.accounting import _validate as v
from dpsql.accounting.gaussian import DELTA_EVAL_MARGIN, gaussian_sigma
from dpsql.accounting.sparse_histogram import _dtau_closed_form, _exact, _min_tau_star
from dpsql.errors import ConfigError

__all__ = [
    "SparseHistogramCalibration",
    "calibrate_sparse_histogram",
    "calibrate_sparse_histogram_fixed",
]


@dataclass(frozen=True)
class SparseHistogramCalibration:
    """Noise and thresholds for one sparse-histogram release, with the accounting behind them."""

    epsilon: float
    delta: float
    sigma: float  #: std of the Gaussian noise on counts
    tau: int  #: deterministic threshold on true counts (keep iff count >= tau)
    tau_star: float  #: noisy threshold (publish iff noisy count >= tau_star); round up before use
    max_groups: int  #: C_u, groups per user
    mu_other: float  #: per-group Mahalanobis sensitivity of the extra columns, √J/(wσ)
    extra_sensitivities: tuple[float, ...]  #: Δ_j of the extra columns
    extra_sigmas: tuple[float, ...]  #: noise std of each extra column, w·Δ_j·σ
    extra_noise_multiplier: float  #: w
    exact_delta: float  #: Theorem 5.4 δ at epsilon for (sigma, tau_star)
    delta_gaussian: float  #: δ_G(ε; μ_{C_u}) (the a = 0 term)
    delta_infinite: float  #: 1 − Φ((τ* − τ)/σ)^{C_u}
    add_the_deltas_delta: float  #: δ that add-the-deltas would certify for (sigma, tau_star)
    add_the_deltas_tau_star: float  #: least τ* under add-the-deltas at the same sigma (inf if none)
    sigma_min: float  #: least σ with δ_Gaussian <= delta (Gaussian-only floor)
    method: str  #: accounting used to choose the parameters ("exact" | "add_the_deltas")
    release_probability: float  #: p in the objective n_p = τ* + Φ⁻¹(p)·σ
    release_count: float  #: n_p: smallest true count published with probability >= p
    fixed: tuple[str, ...] = ()  #: parameters the caller fixed ("sigma", "tau_star")

    @property
    def delta_tau(self) -> float:
        """The noisy margin τ* − τ."""
        return self.tau_star - self.tau

    @property
    def add_the_deltas_ratio(self) -> float:
        """(τ*_add − τ) / (τ* − τ): how much larger add-the-deltas would make the margin (nan if τ* ≤ τ)."""
        if self.delta_tau <= 0:
            return math.nan
        return (self.add_the_deltas_tau_star - self.tau) / self.delta_tau


# ----------------------------------------------------------------------------- helpers
class _Problem:
    """Validated inputs and the δ/τ* oracles for one calibration."""

    def __init__(
        self,
        epsilon: object,
        delta: object,
        tau: object,
        max_groups: object,
        extra_sensitivities: object,
        method: object,
        release_probability: object,
        extra_noise_multiplier: object,
    ) -> None:
        self.e = v.epsilon_target(epsilon)
        self.d = v.delta_target(delta)
        # what the evaluated δ must meet: the exact δ is then ≤ d despite ~1e-12 evaluation error
        self.d_safe = self.d * (1.0 - DELTA_EVAL_MARGIN)
        self.tau = v.count(
            tau, "tau", minimum=1, hint="tau is the deterministic threshold on true counts: an integer >= 1"
        )
        self.c = v.count(
            max_groups,
            "max_groups",
            minimum=1,
            hint="max_groups (C_u) is the per-user group bound: a whole number >= 1",
        )
        if isinstance(extra_sensitivities, str | bytes) or not isinstance(
            extra_sensitivities, Sequence | np.ndarray
        ):
            raise ConfigError(
                f"extra_sensitivities must be a sequence of numbers, got {extra_sensitivities!r}",
                hint="pass one L2 sensitivity per extra aggregate column, e.g. extra_sensitivities=(100.0,)",
            )
        self.extra = tuple(
            v.positive(
                x,
                f"extra_sensitivities[{i}]",
                hint="each extra column needs its per-group L2 sensitivity > 0",
            )
            for i, x in enumerate(extra_sensitivities)
        )
        self.method = v.choice(method, "method", ("exact", "add_the_deltas"))
        p = v.real(release_probability, "release_probability")
        if not 0.5 <= p < 1.0:
            raise ConfigError(
                f"release_probability must be in [0.5, 1), got {release_probability!r}",
                hint="it is the publication probability defining the objective; 0.95 is the default",
            )
        self.p = p
        self.z = float(ndtri(p))
        self.w = v.positive(
            extra_noise_multiplier,
            "extra_noise_multiplier",
            hint="w scales the extra columns' noise: sigma_j = w * sensitivity_j * sigma; 1.0 is the default",
        )
        self.j = len(self.extra)
        # μ_C = sqrt(C (1 + J/w²)) / σ: the Gaussian-only calibration has this L2 sensitivity
        self.factor = math.sqrt(1.0 + self.j / (self.w * self.w))
        self.sigma_min = gaussian_sigma(self.e, self.d, math.sqrt(self.c) * self.factor)

    def mu_other(self, sigma: float) -> float:
        return math.sqrt(self.j) / (self.w * sigma)

    def min_tau_star(self, sigma: float, method: str | None = None) -> float:
        return _min_tau_star(
            self.e, self.d, sigma, self.tau, self.c, self.mu_other(sigma), method or self.method
        )

    def delta_at(self, sigma: float, tau_star: float, method: str | None = None) -> float:
        m = method or self.method
        r = _exact(self.e, sigma, tau_star - self.tau, self.c, self.mu_other(sigma))
        if m == "exact":
            return r.delta
        return r.delta_gaussian + r.delta_infinite

    def lower_bound_dtau(self, sigma: float) -> float:
        return _dtau_closed_form(sigma, self.d_safe, self.c)

    def record(
        self, sigma: float, tau_star: float, fixed: tuple[str, ...] = ()
    ) -> SparseHistogramCalibration:
        r = _exact(self.e, sigma, tau_star - self.tau, self.c, self.mu_other(sigma))
        return SparseHistogramCalibration(
            epsilon=self.e,
            delta=self.d,
            sigma=sigma,
            tau=self.tau,
            tau_star=tau_star,
            max_groups=self.c,
            mu_other=self.mu_other(sigma),
            extra_sensitivities=self.extra,
            extra_sigmas=tuple(self.w * s * sigma for s in self.extra),
            extra_noise_multiplier=self.w,
            exact_delta=r.delta,
            delta_gaussian=r.delta_gaussian,
            delta_infinite=r.delta_infinite,
            add_the_deltas_delta=r.delta_gaussian + r.delta_infinite,
            add_the_deltas_tau_star=self.min_tau_star(sigma, "add_the_deltas"),
            sigma_min=self.sigma_min,
            method=self.method,
            release_probability=self.p,
            release_count=tau_star + self.z * sigma,
            fixed=fixed,
        )

    def first_feasible_sigma(self) -> tuple[float, float]:
        """σ_min, nudged up by ulps if rounding leaves δ_Gaussian a hair above δ; and τ*(σ)."""
        sigma = self.sigma_min
        for _ in range(64):
            ts = self.min_tau_star(sigma)
            if math.isfinite(ts):
                return sigma, ts
            sigma = float(np.nextafter(sigma, math.inf))
        # gaussian_sigma meets delta_Gaussian; what no sigma meets is the threshold's delta_infinite = 1 - P^C_u at a
        # subnormal delta (P within C_u * delta of 1 is not a double): a delta too small, not a fault
        raise ConfigError(
            f"delta={self.d!r} is too small for the sparse histogram: the probability that a group at the threshold "
            "is released cannot be computed that small in floating point, so no noisy threshold can be calibrated",
            hint="use a delta such as 1e-6 (well below 1/number_of_people); a subnormal delta is never reachable",
        )


def _scan_and_refine(
    objective: Callable[[float], float], sigma_min: float, stop: Callable[[float], bool], upper_ratio: float
) -> float:
    """Minimise objective(σ) over σ ∈ (σ_min, σ_min·(1 + upper_ratio)].

    Coarse scan of r = σ/σ_min − 1 on a log grid from 1e-10 to ``upper_ratio`` (stopping early once
    ``stop(σ)`` says the objective only grows beyond σ), then bounded Brent on log r over the two
    cells around the best grid point.
    """
    rs = np.geomspace(1e-10, upper_ratio, 33)
    vals: list[float] = []
    for r in rs:
        s = sigma_min * (1.0 + float(r))
        vals.append(objective(s))
        if stop(s):
            break
    rs = rs[: len(vals)]
    k = int(np.argmin(vals))
    lo = math.log(rs[k - 1]) if k > 0 else math.log(rs[0]) - 4.0 * math.log(10.0)
    hi = math.log(rs[k + 1]) if k + 1 < len(rs) else math.log(rs[k])
    if hi <= lo:
        return sigma_min * (1.0 + float(rs[k]))
    from scipy.optimize import minimize_scalar  # imported when used: slow to import

    res = minimize_scalar(
        lambda t: objective(sigma_min * (1.0 + math.exp(t))),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-6},
    )
    best_r = math.exp(float(res.x))
    if float(res.fun) > vals[k]:
        best_r = float(rs[k])
    return sigma_min * (1.0 + best_r)


def _optimise(pb: _Problem) -> tuple[float, float]:
    """The (σ, τ*) minimising n_p = τ* + z·σ under pb.method (see module docstring)."""
    sigma0, ts0 = pb.first_feasible_sigma()
    if pb.method == "exact" and ts0 - pb.tau <= pb.lower_bound_dtau(sigma0) * (1.0 + 1e-9) + 1e-9:
        # The closed-form lower bound is attained at the Gaussian-only floor: for every larger σ,
        # τ*(σ) >= τ + Δτ_LB(σ) > τ*(σ_min) and z·σ > z·σ_min, so σ_min is optimal.
        return sigma0, ts0

    def objective(s: float) -> float:
        ts = pb.min_tau_star(s)
        return ts + pb.z * s if math.isfinite(ts) else math.inf

    def lb_attained(s: float) -> bool:
        if pb.method != "exact":
            return False
        ts = pb.min_tau_star(s)
        return ts - pb.tau <= pb.lower_bound_dtau(s) * (1.0 + 1e-9) + 1e-9

    # n_p(σ) >= τ + σ·(Φ⁻¹((1−δ)^{1/C}) + z): beyond σ_hi = n_p(2σ_min)/(that slope) nothing can win.
    slope = pb.lower_bound_dtau(1.0) + pb.z
    ref = objective(2.0 * sigma0)
    upper = 1.0
    if slope > 0 and math.isfinite(ref):
        upper = max(1.0, (ref - pb.tau) / slope / sigma0 - 1.0)
    sigma = _scan_and_refine(objective, sigma0, lb_attained, upper)
    ts = pb.min_tau_star(sigma)
    return sigma, ts


# ----------------------------------------------------------------------------- public
def calibrate_sparse_histogram(
    epsilon: float,
    delta: float,
    *,
    tau: int = 1,
    max_groups: int,
    extra_sensitivities: Sequence[float] = (),
    method: str = "exact",
    release_probability: float = 0.95,
    extra_noise_multiplier: float = 1.0,
) -> SparseHistogramCalibration:
    """Choose σ and τ* for an (ε, δ) sparse histogram release (objective: module docstring).

    ``extra_sensitivities`` lists the per-group L2 sensitivity of each extra noisy column; column j
    gets noise std ``extra_noise_multiplier * extra_sensitivities[j] * sigma``.
    """
    pb = _Problem(
        epsilon,
        delta,
        tau,
        max_groups,
        extra_sensitivities,
        method,
        release_probability,
        extra_noise_multiplier,
    )
    sigma, ts = _optimise(pb)
    return pb.record(sigma, ts)



def calibrate_sparse_histogram_fixed(
    epsilon: float,
    delta: float,
    *,
    sigma: float | None = None,
    tau_star: float | None = None,
    tau: int = 1,
    max_groups: int,
    extra_sensitivities: Sequence[float] = (),
    method: str = "exact",
    release_probability: float = 0.95,
    extra_noise_multiplier: float = 1.0,
) -> SparseHistogramCalibration:
    """Calibrate with σ and/or τ* fixed by the caller; the free one is filled in.

    * neither fixed: same as :func:`calibrate_sparse_histogram`;
    * σ fixed: τ* = least noisy threshold at that σ (ConfigError if σ is below the Gaussian floor);
    * τ* fixed: the least σ meeting (ε, δ) with that τ* (least count noise; ConfigError naming the
      smallest feasible τ* if there is none);
    * both fixed: checked; ConfigError stating the δ those values imply if it exceeds ``delta``.
    """
    pb = _Problem(
        epsilon,
        delta,
        tau,
        max_groups,
        extra_sensitivities,
        method,
        release_probability,
        extra_noise_multiplier,
    )
    s = (
        None
        if sigma is None
        else v.positive(sigma, "sigma", hint="sigma is the std of the count noise; pass sigma > 0")
    )
    ts = (
        None
        if tau_star is None
        else v.real(tau_star, "tau_star", hint="tau_star is the noisy threshold, a finite number")
    )
    if s is None and ts is None:
        sig, t_s = _optimise(pb)
        return pb.record(sig, t_s)
    if s is not None and s < pb.sigma_min:  # (checked first: 1/s^2 overflows for s near 1e-300)
        raise ConfigError(
            f"sigma={s!r} is too small for (epsilon={pb.e!r}, delta={pb.d!r}): the Gaussian part alone "
            f"already has delta above the target, so no threshold can help",
            hint=f"use sigma >= {v.shown(pb.sigma_min, 6, up=True)} (the Gaussian-only minimum for max_groups={pb.c})",
        )
    if s is not None and ts is not None:
        d_at = pb.delta_at(s, ts)
        if d_at > pb.d_safe:
            need = pb.min_tau_star(s)
            fix = (
                f"raise tau_star to at least {v.shown(need, 6, up=True)} at this sigma"
                if math.isfinite(need)
                else f"sigma must be at least {v.shown(pb.sigma_min, 6, up=True)} for this (epsilon, delta)"
            )
            raise ConfigError(
                f"sigma={s!r} with tau_star={ts!r} gives delta={d_at:.6g} at epsilon={pb.e!r} "
                f"({pb.method} accounting), above the requested delta={pb.d!r}",
                hint=fix,
            )
        return pb.record(s, ts, fixed=("sigma", "tau_star"))
    if s is not None:
        t_s = pb.min_tau_star(s)
        if not math.isfinite(t_s):
            raise ConfigError(
                f"sigma={s!r} is too small for (epsilon={pb.e!r}, delta={pb.d!r}): the Gaussian part alone "
                f"already has delta above the target, so no threshold can help",
                hint=f"use sigma >= {v.shown(pb.sigma_min, 6, up=True)} (the Gaussian-only minimum for max_groups={pb.c})",
            )
        return pb.record(s, t_s, fixed=("sigma",))
    assert ts is not None
    sig = _least_sigma_for_tau_star(pb, ts)
    return pb.record(sig, ts, fixed=("tau_star",))


def _least_sigma_for_tau_star(pb: _Problem, ts: float) -> float:
    """Least σ with δ(σ, ts) <= δ, or ConfigError naming the least feasible τ*.

    τ*(σ), the least threshold at σ, falls from its value at the Gaussian floor σ_min to its minimum
    at σ* (the optimum of the z = 0 objective) and rises after it, so {σ : τ*(σ) <= ts} is an interval
    containing σ*; its left end is found by bisection on [σ_min, σ*].
    """

    def ok(s: float) -> bool:
        return pb.delta_at(s, ts) <= pb.d_safe

    sigma0, _ = pb.first_feasible_sigma()
    if ok(sigma0):
        return sigma0
    best_sigma, best_ts = _optimise(_with_z0(pb))
    if not ok(best_sigma):
        raise ConfigError(
            f"tau_star={ts!r} is too small for (epsilon={pb.e!r}, delta={pb.d!r}) with max_groups={pb.c} "
            f"({pb.method} accounting): no sigma meets the target",
            hint=f"the least feasible tau_star is {best_ts:.6g} (at sigma={best_sigma:.6g}); use at least that",
        )
    lo, hi = sigma0, best_sigma
    for _ in range(200):
        if hi - lo <= 1e-12 * hi:
            break
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _with_z0(pb: _Problem) -> _Problem:
    """A copy of pb whose objective is τ* alone (release_probability = 0.5)."""
    q = object.__new__(_Problem)
    q.__dict__.update(pb.__dict__)
    q.p, q.z = 0.5, 0.0
    return q
