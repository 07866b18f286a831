r"""DP-S4S for scalar select-join-aggregate queries under user-level pure DP (numpy core), and R2T.

Groundwork for join support: the caller supplies the join result as per-tuple weights and the
user–tuple incidence; there is no SQL here.

Input representation
--------------------
* ``weights``: float array (n,), w_t = f(t) ∈ [0, 1] (the caller normalises by a public bound W
  and rescales the released value by W — post-processing).
* ``tuple_idx``, ``user_idx``: equal-length integer arrays, one entry per pair u ⇝ t ("user u
  contributes join tuple t"). A tuple may belong to several users; a tuple with no user is allowed
  (it is constrained by no user and no user's removal affects it). Repeated pairs are merged.
  User ids are arbitrary non-negative integers (they are compacted internally).

Privacy claim
-------------
Neighbouring relation (``docs/mechanisms.md`` §3.1): I ∼ I′ iff they differ by adding or removing
**one user together with every join tuple it contributes to** (user-level, unbounded DP). Every
user contributes to at most Δ = ``max_tuples_per_user`` join tuples (public bound, see "Δ").

Δ. Lemma 3.1 (q < 1) needs |S_u| dominated by Bin(Δ, q). This module never compares the data
with Δ: raising (or doing anything observable) when a user exceeds Δ would reveal that it does.
Where every join tuple has one owner (a single foreign-key chain) the caller enforces Δ by a
stable bounding — :func:`bound_tuples_per_user` keeps at most Δ tuples per user in a keyed
random order that depends only on that user's tuples and the salt, so removing a user changes
nobody else's tuples. Where tuples have several owners (self-joins, several references or
private relations) no stable enforcement exists (removing one user frees capacity for its
neighbours); there Δ is **owner-attested** and the ε claim for q < 1 is **conditional on it**.
R2T (q = 1) needs no Δ.

* Truncation (§3.2, Kasiviswanathan et al. 2013): f̄(S, τ) = max Σ_t x_t s.t.
  Σ_{t: u⇝t} x_t ≤ τ for every user u, 0 ≤ x_t ≤ w_t. Removing user u amounts to forcing x_t = 0
  on u's tuples (u's own constraint then holds trivially), so f̄(I′) ≤ f̄(I), and zeroing u's tuples
  in an optimum of I loses Σ_{t: u⇝t} x_t ≤ τ: the user-level sensitivity of f̄(·, τ) is ≤ τ
  (for τ ≥ the largest user contribution, f̄ = Σ w_t). It is computed by
  :mod:`dpsql.mechanisms._s4s_truncation` on the instance whose weights and τ are rounded down to
  the public grid 2^−k(τ) (a per-tuple map: the sensitivity bound is unchanged): exactly by a
  closed form (one user per tuple) or a verified max-flow (two), and otherwise by HiGHS with a
  primal–dual certificate: the released value P is feasible and within G(τ) = τ·2⁻¹⁰ of the
  optimum. **Every run is calibrated for the sensitivity τ + G(τ)** (below). Which of the three
  runs is set by ``max_people_per_tuple`` (the join plan's most users per tuple, public; the SQL
  mechanisms pass ``PeopleBound.per_tuple``), never by the sample, since the paths' run times
  differ; without it the cheapest exact path for the sample is taken (a data-dependent run time).
* Algorithm 1 (Sample-and-Truncate, §3.4): Poisson-sample the join tuples with rate q → S; release
  f̄(S, τ) + Lap(τ/ε). By Lemma 3.1 (computed through the O(1) PGF form of Lemma 3.2 in
  :func:`dpsql.accounting.s4s_epsilon_prime`) this is ε′(ε, τ, Δ, q)-DP with ε′ ≤ ε. Lemma 3.1
  needs |S_u| to be dominated by Bin(Δ, q), hence the Δ bound is a precondition for q < 1.
* Algorithm 2 (DP-S4S scalar, §3.5): one sample S; grid τ_1 < … < τ_L; for i = L … 1:
  ε_i = ε₀/i, f̂_i = f̄(S, τ_i) + Lap(τ_i/ε_i), f̃_i = f̂_i − (τ_i/ε_i)·ln(kL/β), ε₀ ← ε₀ − ε′_i
  (by default {5.5^{i−1} < Δ} ∪ {Δ} and k = 1; the paper's τ_i = 2^{i−1} ≤ Δ and k = 3 with
  ``tau_base=2, paper_bias=True``: "Grid and bias" below).
  The schedule (τ_i, ε_i, ε′_i) is data independent (:func:`dpsql.accounting.s4s_budget_schedule`,
  checked against tests/vectors/dp_s4s.json). The L runs share the sample, so their cost is bounded
  **jointly** ("Joint accounting" below: ε_joint ≤ ε, not merely Σ ε′_i ≤ ε) — the candidates
  f̃_i/q are all covered, and the released max(0, max_i f̃_i/q) is post-processing of them. **We clamp at 0** (as the authors' code does;
  the true sum is ≥ 0, so this only reduces error); the unclamped value is kept in the result too.
  Utility (Lemma 3.3): w.p. 1 − β, |f̂ − f| = Õ(√(n/q) + 1/q + (τ* + √(τ*/q))/ε_{i*}).
* Approximate DP (δ > 0; §3.6, :func:`s4s_scalar_rdp`): Algorithm 2 with Gaussian noise. Run i
  releases f̄(S, τ_i) + N(0, σ_i²), σ_i = (τ_i + G_i)√(α/(2ρ_i)), rounded to γ_i = 2^⌊log₂(σ_i/16)⌋;
  by Lemma 3.5 (with the certified slack, :func:`dpsql.accounting.s4s_rdp_prime`) it is
  (α, ρ′_i)-RDP. Allocation (open in the spec; chosen here): the pure-DP schedule's 1/i shape in
  RDP at one order α — ρ_i = ρ₀/i, ρ₀ ← ρ₀ − ρ′_i from ρ₀ = ρ_total(α) — so amplification savings
  roll over to the later (smaller-τ) runs; for q < 1 the runs' **joint** RDP ρ_joint
  (:func:`dpsql.accounting.s4s_joint_rdp`, "Joint accounting") must be ≤ ρ_total(α) (with a 1e-9
  relative margin), else every ρ_i is multiplied by the largest common c < 1 that fits (bisection);
  for q = 1 the runs are independent given I and Σ ρ_i ≤ ρ_total(α) is checked exactly.
  ρ_total(α) = ε − ln(1 − 1/α) + (ln δ′ + ln α)/(α − 1) is the CKS/Balle RDP → (ε, δ′) conversion
  solved for ρ, with δ′ = δ − δ_fp and δ_fp = (1 + e^ε)·L·δ_coord the floating-point part of the
  Gaussian sampler (``dpsql.noise`` §3, every run has σ/γ < 32). α is the order of
  :data:`RDP_ORDERS` (1 + 2^{j/4}, j = −16 … 48; public) minimising Σ_i ln(σ_i/τ_i). Bias:
  σ_i√(2 ln(kL/β)) (each candidate overestimates w.p. ≤ β/(kL), the Gaussian analogue of the
  Laplace bias). Total: (ε, δ)-DP, conditional on Δ for q < 1 as above.
* R2T (§3.3, Dong et al. 2022), the unsampled variant (q = 1, no amplification): τ_j = b^j,
  j = 1 … L = ⌈log_b GS⌉ (b = 5.5 by default, 2 in the paper), each run with ε/L: Q̃_j = f̄(I, τ_j) + Lap(L τ_j/ε) − L τ_j ln(L/β)/ε,
  released max(max_j Q̃_j, f̄(I, 0)) (:func:`dpsql.accounting.r2t_schedule`). f̄(I, 0) is the weight
  of tuples no user contributes to: sensitivity 0, released exactly. Composition: ε. R2T's privacy
  does not depend on GS (only its grid does).

Floating point (``dpsql.noise`` section 2): every Laplace draw goes through Mironov's snapping
mechanism (clamp f̄ to a public B = 2^K Λ, add Lap(λ), round to the power-of-two grid Λ ≥ λ,
clamp). A snapped kernel satisfies K(y|v) ≤ exp(|v − v′|/λ + ξ) K(y|v′) with
ξ = 2⁻⁴⁵(B/λ + 2), so in Lemma 3.1's sum every term gains at most the factor e^ξ: the run on the
sample is (ε′(τ/λ, τ, Δ, q) + ξ)-DP. The certified slack G of the truncation acts the same way:
the released value moves by at most min(τ, |S_u|) + G, so every term gains at most e^{G/λ}.
λ_i is calibrated so that ε′(τ_i/λ_i, τ_i, Δ, q) + G(τ_i)/λ_i + ξ_i ≤ ε′_i of the schedule
(bisection on the monotone left side; q = 1: (τ_i + G_i)/λ_i = ε′_i − ξ_i, checked in exact arithmetic), keeping Σ ≤ ε.
R2T's runs use λ_j with (τ_j + G_j)/λ_j + ξ_j ≤ ε/L. The schedule's nominal scales τ/ε (and the biases)
are kept in the results; the scales actually used are ``snap_lambda`` / ``snap_lambdas``.

Joint accounting (why Σ ε′_i is not enough). Basic composition needs the runs' randomness to be
independent given the input; Algorithm 2's runs share the sample S. Lemma 3.1's argument applied
to the vector of runs: for a fixed sample S of the others and a user whose sampled tuples number k
(dominated by K ∼ Bin(Δ, q)), run i moves by at most min(τ_i, k) + G_i, so the joint output density
moves by a factor at most exp(h(k) + Σ_i(G_i/λ_i + ξ_i)), h(k) = Σ_i min(τ_i, k)/λ_i, increasing in
k; averaging over S_u gives p(y | I ∪ u) ≤ E[e^{h(K)}]·e^{Σ(G_i/λ_i + ξ_i)}·p(y | I) and
p(y | I ∪ u) ≥ E[e^{−h(K)}]·e^{−Σ(…)}·p(y | I), hence
ε_joint = ln max{E[e^{h(K)}], 1/E[e^{−h(K)}]} + Σ_i (G_i/λ_i + ξ_i)
(:func:`dpsql.accounting.s4s_joint_epsilon`, exact through a piecewise form of Lemma 3.2's
generating function). Since every factor e^{min(τ_i, K)/λ_i} increases in K, Harris's inequality
gives E[Π_i …] ≥ Π_i E[…]: the sum of the per-run ε′_i can understate the cost, and the bound is
attained where the user owns Δ unit tuples and nobody else has any. Example: Δ = 64, q = 1/16,
ε = 1, base 2 — the paper's scales τ_i/ε_i have Σ ε′_i = 0.9957 but a true loss of 1.0092
(tests/test_s4s_joint.py). dpsql keeps the schedule (ε_i, ε′_i, the spec's vectors) and calibrates
each λ_i per run as below, then checks ε_joint·(1 + 10⁻⁹) + 10⁻¹² ≤ ε; if not, every λ_i is
divided by the largest common c < 1 that fits (bisection; ε_joint increases in c; the snapping
term uses its bound ξ_i ≤ 2⁻⁴⁵(2^{K_i+1} + 2) during the search and its exact value at the end).
q = 1 needs no joint step (the runs are then independent given I). Measured effect: none where
amplification acts on at most one run (ca-GrQc 2-paths and triangles at q = 1/16: ε_joint =
0.99969, 0.99975 without scaling, on the default grid), scales 1.0001–1.009 times larger where several
runs are amplified (default grid: 1.00013 for edges, Δ = 1024, at q = 1/64; 1.0014 at Δ = 448, q = 1/64;
1.00017 at Δ = 448, q = 1/16; 1.0087 at Δ = 64, q = 1/16, base 2). The same holds for the RDP variant with
ρ_joint = (1/(α−1)) ln E[exp((α−1)Σ_i ρ_i((min(τ_i, K) + G_i)/(τ_i + G_i))²)] (Rényi divergences of
independent Gaussian coordinates add; the mixture bound of Lemma 3.5's proof), e.g. Δ = 64,
q = 1/16, ε = 1, δ = 10⁻⁶, base 2: Σ ρ′_i = 0.4818 but ρ_joint = 0.5086 > ρ_total = 0.4826, so
the ρ_i are scaled by 0.8825.

Grid and bias (docs/mechanisms.md §3.5). The default grid is {b^{i−1} : b^{i−1}·√b < Δ} ∪ {Δ}
(:func:`dpsql.accounting.s4s_tau_grid`, keyword ``top_at_delta``, by default ``not paper_bias``): Δ
is always the top threshold (a power within √b below Δ gives way to it), since a top below Δ (the power grid's can be Δ/b) truncates every person
to it at any ε — at q = 1 and Δ = 3 a join COUNT released the number of people, not of tuples. The
base and the bias are the authors' code's: b = 5.5
(:data:`dpsql.accounting.s4s.DEFAULT_TAU_BASE`) and the bias ln(L/β) (each of the L candidates
overestimates w.p. ≤ β/L; the paper's ln(3L/β) also reserves 2β/3 for the sampling events of its
utility proof). The paper's Algorithm 2 is ``tau_base=2, paper_bias=True`` (the spec's vectors,
tests/vectors/dp_s4s.json, are checked in that form). **Privacy is unchanged**: the analysis holds
for any constant base, the bias is subtracted after the noise (post-processing), and the schedule
(ε_i, ε′_i, Σ ε′_i ≤ ε) depends on the grid only through its τ_i and L. Why the default: fewer
thresholds give each run a larger share of ε and the bias subtracts less; measured on ca-GrQc
(nodes as users, D = 1024, ε = 1, ``benchmarks/s4s.py``; docs/mechanisms.md §3.5 has the table).
The authors' code takes Δ in Lemma 3.1 as the largest grid τ (which understates ε′ when the grid tops
out below the true bound); dpsql keeps the declared Δ in Lemma 3.1 for every τ_i and puts Δ itself on
the grid instead (at τ_L = Δ, P[K > Δ] = 0).

Randomness: only through the :class:`dpsql.noise.NoiseSource` passed in (uniforms for the
sample, Laplace for the noise). The true LP values never leave this module.

Sources: Qiu, Xiao, Yang, "DP-S4S" (arXiv 2603.14994, SIGMOD 2026), Algorithms 1–2, Lemmas
3.1–3.3; Dong et al., "R2T" (SIGMOD 2022); Kasiviswanathan et al. (TCC 2013) for the LP;
``docs/mechanisms.md`` §3.1–3.5, vectors ``dp_s4s.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.accounting import (
    r2t_schedule,
    s4s_budget_schedule,
    s4s_epsilon_prime,
    s4s_joint_epsilon,
    s4s_joint_rdp,
    s4s_rdp_prime,
)
from dpsql.accounting.s4s import DEFAULT_TAU_BASE, s4s_grid_size, s4s_tau_grid, tau_grid_base
from dpsql.budget import binary_at_least, binary_at_most, share_of
from dpsql.errors import ConfigError, ExecutionError
from dpsql.mechanisms import _s4s_truncation as _trunc
from dpsql.noise import (
    NoiseSource,
    check_gaussian_representable,
    gaussian_fp_delta,
    gaussian_release,
    round_to_granularity,
    snapping_calibration,
    snapping_exponent,
    snapping_extra,
    snapping_grid,
)

__all__ = [
    "JoinTuples",
    "S4SStep",
    "S4SResult",
    "R2TResult",
    "validate_join_tuples",
    "truncated_value",
    "poisson_sample",
    "s4s_scalar",
    "S4SRdpStep",
    "S4SRdpSchedule",
    "S4SRdpResult",
    "s4s_rdp_schedule",
    "s4s_scalar_rdp",
    "bound_tuples_per_user",
    "r2t_scalar",
    "r2t_release",
]


# ----------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class JoinTuples:
    """Validated join tuples: weights (n,), deduplicated pairs, users compacted to 0..m−1."""

    weights: np.ndarray  #: float64 (n,), in [0, 1]
    tuple_idx: np.ndarray  #: int64 (p,), pairs u ⇝ t, unique
    user_idx: np.ndarray  #: int64 (p,), compacted user ids in [0, m)
    n_users: int  #: m

    def tuples_per_user(self) -> np.ndarray:
        return np.bincount(self.user_idx, minlength=self.n_users)


def _index_array(a: object, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise ConfigError(f"{name} must be a 1-D integer array, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.floor(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ConfigError(
                f"{name} must hold integers, got dtype {arr.dtype}",
                hint="pass the pairs u ~> t as integer arrays tuple_idx, user_idx",
            )
    if np.any(arr < 0):
        raise ConfigError(f"{name} must be >= 0")
    return arr.astype(np.int64, copy=False)


def validate_join_tuples(weights: object, tuple_idx: object, user_idx: object) -> JoinTuples:
    """Check the input representation; raise :class:`ConfigError` on any malformed input."""
    return _compact(*_checked_arrays(weights, tuple_idx, user_idx))


def _sampled_join_tuples(weights: object, tuple_idx: object, user_idx: object, q: float, rng: NoiseSource) -> JoinTuples:
    """Validate everything, draw the Poisson sample, then compact only the sampled pairs
    (weights outside the sample are 0 and their pairs dropped: the same f̄ as masking later)."""
    w, ti, ui = _checked_arrays(weights, tuple_idx, user_idx)
    if q == 1.0:
        return _compact(w, ti, ui)
    mask = poisson_sample(w.size, q, rng)
    keep = mask[ti]
    return _compact(np.where(mask, w, 0.0), ti[keep], ui[keep])


def _checked_arrays(weights: object, tuple_idx: object, user_idx: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    try:
        w = np.asarray(weights)
    except (TypeError, ValueError):
        raise ConfigError("weights must be a 1-D numeric array") from None
    if w.ndim != 1:
        raise ConfigError(f"weights must be a 1-D array, got shape {w.shape}")
    if w.dtype.kind not in "fiub":
        raise ConfigError(f"weights must be numeric, got dtype {w.dtype}")
    w = w.astype(np.float64, copy=False)
    if not (np.all(np.isfinite(w)) and np.all(w >= 0.0) and np.all(w <= 1.0)):
        raise ConfigError(
            "weights must lie in [0, 1]",
            hint="normalise each tuple's value f(t) by a public bound W and rescale the release by W",
        )
    ti = _index_array(tuple_idx, "tuple_idx")
    ui = _index_array(user_idx, "user_idx")
    if ti.shape != ui.shape:
        raise ConfigError(
            f"tuple_idx and user_idx must have the same length, got {ti.size} and {ui.size}",
            hint="one entry per pair u ~> t in both arrays",
        )
    n = w.size
    if ti.size and int(ti.max()) >= n:
        raise ConfigError(f"tuple_idx must be < len(weights) = {n}, got {int(ti.max())}")
    return w, ti, ui


def _compact(w: np.ndarray, ti: np.ndarray, ui: np.ndarray) -> JoinTuples:
    n = w.size
    if ui.size == 0:
        return JoinTuples(w, ti, ui, 0)
    users, uc = np.unique(ui, return_inverse=True)
    uc = uc.astype(np.int64).reshape(-1)
    key = np.unique(uc * np.int64(n) + ti)  # merge repeated pairs (the incidence is a set)
    return JoinTuples(w, key % n, key // n, int(users.size))


def _positive(x: object, name: str, hint: str) -> float:
    try:
        val = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {x!r}", hint=hint) from None
    if isinstance(x, bool) or not (math.isfinite(val) and val > 0):
        raise ConfigError(f"{name} must be finite and > 0, got {x!r}", hint=hint)
    return val


def _rate(q: object) -> float:
    hint = "q is the Poisson sampling rate of the join tuples, in (0, 1], e.g. q=0.1"
    try:
        val = float(q)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"q must be a number, got {q!r}", hint=hint) from None
    if isinstance(q, bool) or not (0.0 < val <= 1.0):
        raise ConfigError(f"q must be in (0, 1], got {q!r}", hint=hint)
    return val


def _beta(beta: object) -> float:
    hint = "beta is the failure probability of the underestimate guarantee, in (0, 1), e.g. 0.1"
    try:
        val = float(beta)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"beta must be a number, got {beta!r}", hint=hint) from None
    if isinstance(beta, bool) or not (0.0 < val < 1.0):
        raise ConfigError(f"beta must be in (0, 1), got {beta!r}", hint=hint)
    return val


def _max_tuples(delta: object) -> int:
    hint = "max_tuples_per_user (Delta) is the public bound on one user's join tuples, an integer >= 1"
    if isinstance(delta, bool) or not isinstance(delta, (int, np.integer)):
        if isinstance(delta, float) and delta.is_integer():
            delta = int(delta)
        else:
            raise ConfigError(f"max_tuples_per_user must be an integer, got {delta!r}", hint=hint)
    if int(delta) < 1:
        raise ConfigError(f"max_tuples_per_user must be >= 1, got {delta!r}", hint=hint)
    return int(delta)


# ----------------------------------------------------------------------------- truncation LP
def _prepared(jt: JoinTuples, mask: np.ndarray | None) -> _trunc.Prepared:
    """The sample's incidence (all tuples if ``mask`` is None), prepared for every τ of a grid."""
    w = jt.weights if mask is None else np.where(mask, jt.weights, 0.0)
    ti, ui = jt.tuple_idx, jt.user_idx
    if mask is not None and ti.size:
        keep = mask[ti]
        ti, ui = ti[keep], ui[keep]
    return _trunc.prepare(w, ti, ui, jt.n_users)


def _truncated(jt: JoinTuples, mask: np.ndarray | None, tau: float, people: float | None = None) -> float:
    """f̄ on the tuples selected by ``mask`` (all if None); ``jt`` already validated."""
    return _trunc.truncate(_prepared(jt, mask), tau, people).value


def _people(x: object) -> float | None:
    """``max_people_per_tuple``: None, or a whole number >= 1 or ``math.inf`` (public)."""
    if x is None:
        return None
    hint = ("max_people_per_tuple is the most users one join tuple can have under the join's plan (1 for one foreign-key "
            "chain, 2 for an edge whose ends are users, 3 for 2-paths or triangles), a whole number >= 1 or math.inf")
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise ConfigError(f"max_people_per_tuple must be a number, got {x!r}", hint=hint)
    v = float(x)
    if not (v >= 1 and (math.isinf(v) or v.is_integer())):
        raise ConfigError(f"max_people_per_tuple must be a whole number >= 1 or inf, got {x!r}", hint=hint)
    return v


def truncated_value(weights: object, tuple_idx: object, user_idx: object, tau: float, *,
                    max_people_per_tuple: float | None = None) -> float:
    """The truncation LP f̄(T, τ) = max Σ x_t s.t. Σ_{t: u⇝t} x_t ≤ τ ∀u, 0 ≤ x_t ≤ w_t (docs/mechanisms.md §3.2).

    Computed by :mod:`dpsql.mechanisms._s4s_truncation` on the instance whose weights and τ are
    rounded down to the public grid 2^−k(τ) (k(τ) = 30 − max(0, ⌈log₂ τ⌉); weights 0 and 1 are
    unchanged): exactly (closed form when no remaining tuple is shared, verified max-flow when
    every shared tuple has two heavy users) or, with tuples of ≥ 3 heavy users, as a feasible
    value P within the certified gap G(τ) = τ·2⁻¹⁰ of the optimum. ``tau`` ≥ 0 (τ = 0 gives
    the weight of tuples contributed by no user). The result is a true (non-private) value: it
    must only leave through a DP mechanism. ``max_people_per_tuple`` picks the path as in
    :func:`s4s_scalar`.
    """
    people = _people(max_people_per_tuple)
    jt = validate_join_tuples(weights, tuple_idx, user_idx)
    t = _tau_value(tau)
    return _truncated(jt, None, t, people)


def _tau_value(tau: object) -> float:
    hint = "tau is the truncation threshold, a finite value >= 0"
    try:
        t = float(tau)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"tau must be a number, got {tau!r}", hint=hint) from None
    if isinstance(tau, bool) or not (math.isfinite(t) and t >= 0):
        raise ConfigError(f"tau must be finite and >= 0, got {tau!r}", hint=hint)
    return t


# ----------------------------------------------------------------------------- bounding Δ
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64), vectorised."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def bound_tuples_per_user(tuple_keys: object, user_idx_per_tuple: object, max_tuples: int, salt: bytes) -> np.ndarray:
    """Boolean mask over single-owner tuples: each user keeps at most Δ of its tuples.

    ``tuple_keys`` (int64, one per tuple) must identify a tuple independently of the rest of the
    data (e.g. the base row ids that make it), ``user_idx_per_tuple`` is each tuple's one owner,
    ``salt`` a fresh per-query secret (bytes). Each user keeps the Δ tuples of smallest keyed
    order mix64(key ⊕ s₀) (ties by key), s₀ a 64-bit word taken from ``salt``.

    Stability (why this bounding keeps the neighbouring relation): the tuples a user keeps are a
    function of that user's own tuples and the salt only, so removing one user removes exactly
    its kept tuples and changes nobody else's. This holds only when every tuple has ONE owner
    (a single foreign-key chain); with several owners no stable bounding exists and Δ is
    owner-attested instead (module docstring). The keyed order only avoids a systematic bias
    (e.g. always keeping the oldest rows); privacy does not need it to be secret.
    """
    keys = np.asarray(tuple_keys).astype(np.int64, copy=False).view(np.uint64)
    users = np.asarray(user_idx_per_tuple).astype(np.int64, copy=False)
    delta = _max_tuples(max_tuples)
    if keys.shape != users.shape or keys.ndim != 1:
        raise ConfigError("tuple_keys and user_idx_per_tuple must be 1-D arrays of the same length")
    if not isinstance(salt, (bytes, bytearray)) or len(salt) < 8:
        raise ConfigError("salt must be at least 8 secret bytes", hint="use NoiseSource.salt() or os.urandom(16)")
    s0 = np.uint64(int.from_bytes(bytes(salt[:8]), "little"))
    order = np.lexsort((keys, _mix64(keys ^ s0), users))
    su = users[order]
    first = np.ones(su.size, dtype=bool)
    first[1:] = su[1:] != su[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(su.size), 0))
    rank = np.arange(su.size) - start
    keep = np.zeros(su.size, dtype=bool)
    keep[order] = rank < delta
    return keep


# ----------------------------------------------------------------------------- sampling
def poisson_sample(n: int, q: float, rng: NoiseSource) -> np.ndarray:
    """Boolean mask (n,): each of n tuples kept independently with probability q ∈ (0, 1].

    Uses ``rng.bernoulli`` (U_t < q decided exactly on the sign/magnitude uniform, never 0 or 1).
    q = 1 keeps everything without drawing.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigError(f"n must be an integer >= 0, got {n!r}")
    qq = _rate(q)
    if qq == 1.0 or n == 0:
        return np.ones(int(n), dtype=bool)
    return np.asarray(rng.bernoulli(qq, int(n)), dtype=bool)


# ----------------------------------------------------------------------------- Algorithm 2
@dataclass(frozen=True)
class S4SStep:
    """One run of Algorithm 2 (data independent, from the accounting schedule)."""

    i: int
    tau: float  #: τ_i = b^{i−1}
    epsilon: float  #: ε_i = ε₀/i (Laplace budget of the run on the sample)
    epsilon_prime: float  #: ε′(ε_i, τ_i, Δ, q), what the run costs (Lemma 3.1)
    laplace_scale: float  #: τ_i/ε_i (the schedule's nominal scale)
    bias: float  #: (τ_i/ε_i)·ln(kL/β), k = 1 (default) or 3 (paper)
    snap_lambda: float = 0.0  #: λ_i actually used (snapping), τ_i/λ_i + ξ_i fits ε′_i
    snap_grid: float = 0.0  #: Λ_i, the power-of-two output grid
    snap_bound: float = 0.0  #: B_i, the public clamp


@dataclass(frozen=True)
class S4SResult:
    """Output of :func:`s4s_scalar`. Every field is DP (or public); no true value is kept."""

    estimate: float  #: released value: max(0, max_i f̃_i / q)
    unclamped: float  #: max_i f̃_i / q (also DP; the clamp is post-processing)
    candidates: tuple[float, ...]  #: f̃_i / q in schedule order (i = L … 1), all covered by Σ ε′_i
    steps: tuple[S4SStep, ...]  #: the schedule, i = L … 1
    epsilon: float  #: the budget asked for
    epsilon_spent: float  #: Σ ε′_i (≤ epsilon; the exact sum of the ε′_i floats is ≤ epsilon too)
    q: float
    max_tuples_per_user: int
    beta: float
    tau: float  #: τ of the step attaining the maximum (the chosen threshold)
    epsilon_joint: float = 0.0  #: the proven ε of the L runs on one sample, jointly (:func:`joint_epsilon`); ≤ epsilon


def _top(paper_bias: object, top_at_delta: bool | None) -> bool:
    """Whether Δ is the grid's top threshold: ``top_at_delta``, or by default ``not paper_bias`` (the
    paper's Algorithm 2 keeps its power grid τ_i = b^{i−1} ≤ Δ; docs/mechanisms.md §3.5)."""
    return (not paper_bias) if top_at_delta is None else bool(top_at_delta)


@functools.lru_cache(maxsize=64)
def _s4s_steps(
    e: float, delta: int, q: float, beta: float, base: float = DEFAULT_TAU_BASE, paper_bias: bool = False,
    top_at_delta: bool | None = None,
) -> tuple[S4SStep, ...]:
    """The accounting's schedule, with Σ ε′_i ≤ ε checked in exact rational arithmetic.

    Floating subtraction in the schedule can leave the exact sum of the ε′_i one ulp above ε
    (e.g. q = 1, where ε′_i = ε_i). Then the schedule is recomputed for a target a few ulps
    below ε (a change far below the 1e-9 tolerance of tests/vectors/dp_s4s.json).
    """
    target = e
    for _ in range(64):
        sched = s4s_budget_schedule(target, delta, q, beta, base, paper_bias=paper_bias,
                                    top_at_delta=_top(paper_bias, top_at_delta))
        if sum((Fraction(s.epsilon_prime) for s in sched), Fraction(0)) <= Fraction(e):
            out = []
            for s in sched:
                lam, grid, bound = _snapped(float(s.tau), s.epsilon, s.epsilon_prime, delta, q)
                out.append(S4SStep(s.i, float(s.tau), s.epsilon, s.epsilon_prime, s.laplace_scale, s.bias,
                                   lam, grid, bound))
            return _jointly_within(tuple(out), e, delta, q)
        target = float(np.nextafter(target, 0.0)) * (1.0 - 4.0 * float(np.finfo(float).eps))
    raise ExecutionError(f"DP-S4S schedule overspends epsilon={e!r}")  # pragma: no cover


#: relative and absolute safety margins on the joint ε (its binomial tails are accurate to ~1e-12)
_JOINT_RTOL, _JOINT_ATOL = 1e-9, 1e-12


def joint_epsilon(steps: tuple[S4SStep, ...], delta: int, q: float) -> float:
    """The proven ε of the L snapped runs on one sample, jointly (module docstring, "Joint accounting"):
    ε_joint(1/λ_i) + Σ_i (G(τ_i)/λ_i + ξ_i), ξ_i = 2⁻⁴⁵(B_i/λ_i + 2); for q = 1, Σ_i (τ_i + G_i)/λ_i + ξ_i."""
    extra = math.fsum(_trunc.gap_bound(s.tau) / s.snap_lambda + snapping_extra(s.snap_bound / s.snap_lambda)
                      for s in steps)
    if q == 1.0:
        return math.fsum(s.tau / s.snap_lambda for s in steps) + extra
    rates = [1.0 / s.snap_lambda for s in steps]
    return s4s_joint_epsilon(rates, [s.tau for s in steps], delta, q) + extra


def _jointly_within(steps: tuple[S4SStep, ...], e: float, delta: int, q: float) -> tuple[S4SStep, ...]:
    """The steps unchanged if their joint ε (with a safety margin) is ≤ ε; else every λ_i divided by
    the largest common c < 1 (found by bisection, the joint ε being increasing in c) that fits,
    with each run's snapping grid recomputed for its new λ_i at the same exponent."""

    def fits(st: tuple[S4SStep, ...]) -> bool:
        return joint_epsilon(st, delta, q) * (1.0 + _JOINT_RTOL) + _JOINT_ATOL <= e

    if q == 1.0 or fits(steps):  # q = 1: the per-step calibration is basic composition (independent runs)
        return steps

    def scaled(c: float) -> tuple[S4SStep, ...]:
        out = []
        for s in steps:
            lam = s.snap_lambda / c
            k = snapping_exponent(s.epsilon_prime / 1000.0, what="a DP-S4S run")  # as in _snapped
            grid, bound = snapping_grid(lam, k, integer=False, what="a DP-S4S run")
            out.append(dataclasses.replace(s, snap_lambda=lam, snap_grid=grid, snap_bound=bound))
        return tuple(out)

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if fits(scaled(mid)):
            lo = mid
        else:
            hi = mid
    if not lo > 0:  # pragma: no cover - c → 0 makes every term vanish but the ξ_i (≤ ε/1000 each)
        raise ExecutionError(f"DP-S4S schedule overspends epsilon={e!r} jointly")
    return scaled(lo)


def _snapped(tau: float, eps_i: float, eps_prime: float, delta: int, q: float) -> tuple[float, float, float]:
    """(λ, Λ, B) of one run: the largest τ/λ with ε′(τ/λ, τ, Δ, q) + G(τ)/λ + ξ ≤ ε′_i (docstring).

    G(τ) = g·τ is the certified slack of the truncation (``_s4s_truncation``): the released
    value moves by at most min(τ, |S_u|) + G when one user is added, so every term of Lemma 3.1
    gains at most the factor e^{G/λ} = e^{g·τ/λ}, like the snapping term ξ.
    """
    what = "a DP-S4S run"
    g = _trunc.GAP_FRACTION
    k = snapping_exponent(eps_prime / 1000.0, what=what)
    target = eps_prime - snapping_extra(2.0 ** (k + 1))
    if q == 1.0:
        eps_l = target / (1.0 + g)
    else:
        lo, hi = 0.0, eps_i
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            if s4s_epsilon_prime(mid, tau, delta, q) + g * mid <= target:
                lo = mid
            else:
                hi = mid
        eps_l = lo
    if not eps_l > 0:
        raise ConfigError("epsilon is too small for DP-S4S's floating-point noise", hint="use a larger epsilon")
    lam = tau / eps_l
    grid, bound = snapping_grid(lam, k, integer=False, what=what)
    if q == 1.0:
        # the run alone, in exact arithmetic: (τ + G)/λ + ξ ≤ ε′_i. The float divisions above can leave it a few ulps
        # above (τ = 27, ε = 67.60498046875014, Δ = 100, base 3: λ two ulps above 2, where ξ's bound has no slack,
        # proved ε′_i·(1 + 1.0·10⁻¹⁶)); for q < 1 the joint check's margin covers them (:func:`_jointly_within`)
        sens = Fraction(tau) + Fraction(_trunc.gap_bound(tau))
        for _ in range(64):  # (a few ulps at most: the float calibration is within 10^-15 relative)
            if sens / Fraction(lam) + Fraction(2) ** -45 * (Fraction(bound) / Fraction(lam) + 2) <= Fraction(eps_prime):
                break
            lam = math.nextafter(lam, math.inf)
            grid, bound = snapping_grid(lam, k, integer=False, what=what)
        else:  # pragma: no cover - never seen: refused rather than run above its slot
            raise ConfigError("DP-S4S's noise scale could not be proven within its share of epsilon",
                              hint="use a slightly different epsilon")
    return lam, grid, bound


def s4s_scalar(
    weights: object,
    tuple_idx: object,
    user_idx: object,
    *,
    epsilon: float,
    max_tuples_per_user: int,
    q: float,
    rng: NoiseSource,
    beta: float = 0.1,
    tau_base: float = DEFAULT_TAU_BASE,
    paper_bias: bool = False,
    top_at_delta: bool | None = None,
    max_people_per_tuple: float | None = None,
) -> S4SResult:
    """DP-S4S Algorithm 2 (scalar, pure DP): an ε-DP estimate of Σ_t w_t under user-level DP.

    See the module docstring for the privacy argument. ``q = 1`` runs without sampling (then
    ε′_i = ε_i and the schedule is plain basic composition). Raises :class:`ConfigError` on invalid
    parameters or malformed inputs only — never on the data's values: a user with more than
    ``max_tuples_per_user`` tuples is not detected (see "Δ" in the module docstring; single-owner
    tuples are bounded by the caller, e.g. with :func:`bound_tuples_per_user`). Grid: ``tau_base`` and
    ``top_at_delta`` (None: ``not paper_bias``), :func:`dpsql.accounting.s4s_tau_grid`.

    ``max_people_per_tuple``: the most users one join tuple can have under the join's plan (public: 1
    for a foreign-key chain, 2 for an edge table whose ends are users, 3 for 2-paths and triangles,
    ``math.inf`` unbounded); it alone picks the truncation's path (closed form / max-flow / certified
    LP) at every τ, so that the run time does not switch with one user's tuples. None (the default,
    for inputs without a plan) picks per τ the cheapest exact path for the sample: a choice made
    from the data (``dpsql.mechanisms._s4s_truncation``). The released value is the same either way
    up to the certified slack G that every run is charged.
    """
    e = _positive(epsilon, "epsilon", "epsilon is the query's total budget, e.g. epsilon=1.0")
    qq = _rate(q)
    delta = _max_tuples(max_tuples_per_user)
    b = _beta(beta)
    people = _people(max_people_per_tuple)
    # Δ is never checked against the data here (raising would reveal whether it is exceeded):
    # see "Δ" in the module docstring.
    steps = _s4s_steps(e, delta, qq, b, tau_grid_base(tau_base), bool(paper_bias), _top(paper_bias, top_at_delta))
    spent = math.fsum(s.epsilon_prime for s in steps)

    jt = _sampled_join_tuples(weights, tuple_idx, user_idx, qq, rng)
    prep = _prepared(jt, None)
    fbars = np.array([_trunc.truncate(prep, s.tau, people).value for s in steps])
    snapped = rng.snap_laplace(
        fbars,
        np.array([s.snap_lambda for s in steps]),
        np.array([s.snap_grid for s in steps]),
        np.array([s.snap_bound for s in steps]),
    )
    cands = [(float(v) - s.bias) / qq for s, v in zip(steps, snapped)]
    best = int(np.argmax(cands))
    raw = float(cands[best])
    return S4SResult(
        estimate=max(0.0, raw),
        unclamped=raw,
        candidates=tuple(float(c) for c in cands),
        steps=steps,
        epsilon=e,
        epsilon_spent=spent,
        q=qq,
        max_tuples_per_user=delta,
        beta=b,
        tau=steps[best].tau,
        epsilon_joint=_joint_cached(steps, delta, qq),
    )


@functools.lru_cache(maxsize=64)
def _joint_cached(steps: tuple[S4SStep, ...], delta: int, q: float) -> float:
    return joint_epsilon(steps, delta, q)


# ----------------------------------------------------------------------------- R2T
@dataclass(frozen=True)
class R2TResult:
    """Output of :func:`r2t_scalar` (all fields DP or public)."""

    estimate: float  #: max(max_j Q̃_j, f̄(I, 0))
    candidates: tuple[float, ...]  #: Q̃_j, j = 1 … L
    taus: tuple[float, ...]  #: τ_j = 2^j
    laplace_scales: tuple[float, ...]  #: L τ_j/ε (nominal)
    biases: tuple[float, ...]  #: L τ_j ln(L/β)/ε
    epsilon: float
    tau: float  #: τ of the maximising candidate (0.0 if f̄(I, 0) wins)
    snap_lambdas: tuple[float, ...] = ()  #: λ_j actually used: τ_j/λ_j + ξ_j ≤ ε/L


def r2t_scalar(
    weights: object,
    tuple_idx: object,
    user_idx: object,
    *,
    epsilon: float,
    global_sensitivity: float,
    rng: NoiseSource,
    beta: float = 0.1,
    tau_base: float = DEFAULT_TAU_BASE,
    max_people_per_tuple: float | None = None,
) -> R2TResult:
    """R2T (Dong et al. 2022; docs/mechanisms.md §3.3): the unsampled race over τ_j = b^j, each run with ε/L.

    ``global_sensitivity`` ≥ 2 is the public bound GS_Q that sets the grid (L = ⌈log_b GS⌉;
    b = ``tau_base``, 5.5 by default, 2 in the paper). ``max_people_per_tuple`` picks the
    truncation's path as in :func:`s4s_scalar`.
    """
    e = _positive(epsilon, "epsilon", "epsilon is the query's total budget, e.g. epsilon=1.0")
    b = _beta(beta)
    base = tau_grid_base(tau_base)
    gs = _r2t_sensitivity(e, global_sensitivity, b, base)
    people = _people(max_people_per_tuple)
    sched, _ = r2t_calibration(e, gs, b, base)  # public: refused before the data
    jt = validate_join_tuples(weights, tuple_idx, user_idx)
    prep = _prepared(jt, None)
    taus = [float(s.tau) for s in sched]
    fbars = np.array([_trunc.truncate(prep, t, people).value for t in taus])
    return r2t_release(fbars, _trunc.truncate(prep, 0.0, people).value, epsilon=e, global_sensitivity=global_sensitivity,
                       rng=rng, beta=b, tau_base=base)


def _r2t_sensitivity(e: float, global_sensitivity: object, b: float, base: float) -> float:
    r2t_schedule(e, global_sensitivity, b, base)  # type: ignore[arg-type]  # validates GS (ConfigError)
    return float(global_sensitivity)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=64)
def r2t_calibration(
    e: float, gs: float, beta: float, base: float
) -> tuple[tuple[Any, ...], tuple[tuple[float, float, float], ...]]:
    """R2T's schedule and each run's snapping (λ_j, Λ_j, B_j) with (τ_j + G(τ_j))/λ_j + ξ_j ≤ ε/L:
    public quantities only (raises :class:`ConfigError` when ε is too small for the noise)."""
    sched = tuple(r2t_schedule(e, gs, beta, base))
    share = share_of(e, len(sched))
    # sensitivity τ_j + G(τ_j): the certified slack of the truncation (module docstring), added exactly and rounded
    # up (a grid of tau_base = 7.1 has τ = 2541.1680999999994, whose float sum with G is below the exact one: the run
    # proved 2·10⁻¹⁸ more than ε/L where λ lay just above a power of two)
    snaps = tuple(
        snapping_calibration(binary_at_least(Fraction(float(s.tau)) + Fraction(_trunc.gap_bound(float(s.tau)))), share,
                             integer=False, what="an R2T run")
        for s in sched
    )
    return sched, snaps


def r2t_release(
    fbars: np.ndarray,
    untouched: float,
    *,
    epsilon: float,
    global_sensitivity: float,
    rng: NoiseSource,
    beta: float = 0.1,
    tau_base: float = DEFAULT_TAU_BASE,
) -> R2TResult:
    """R2T's release from the truncated values: ``fbars[j]`` = f̄(I, τ_j) for the τ_j of
    :func:`dpsql.accounting.r2t_schedule` (same ε, GS, β, base) and ``untouched`` = f̄(I, 0), the
    weight no user contributes to. Each f̄(·, τ_j) must have user-level sensitivity ≤ τ_j + G(τ_j)
    (exact values, e.g. the in-engine closed form, have G = 0 and are covered). The steps of
    :func:`r2t_scalar` after its truncation; the in-engine single-owner path calls it directly.
    """
    e = _positive(epsilon, "epsilon", "epsilon is the query's total budget, e.g. epsilon=1.0")
    b = _beta(beta)
    base = tau_grid_base(tau_base)
    gs = _r2t_sensitivity(e, global_sensitivity, b, base)
    sched, snaps = r2t_calibration(e, gs, b, base)
    fb = np.asarray(fbars, dtype=np.float64)
    if fb.shape != (len(sched),):
        raise ConfigError(f"fbars must hold one value per threshold ({len(sched)}), got shape {fb.shape}")
    snapped = rng.snap_laplace(
        fb, np.array([p[0] for p in snaps]), np.array([p[1] for p in snaps]), np.array([p[2] for p in snaps])
    )
    cands = [float(v) - s.bias for s, v in zip(sched, snapped)]
    base = float(untouched)  # sensitivity 0: released exactly
    best = int(np.argmax(cands))
    if cands[best] >= base:
        est, tau = float(cands[best]), float(sched[best].tau)
    else:
        est, tau = base, 0.0
    return R2TResult(
        estimate=est,
        candidates=tuple(float(c) for c in cands),
        taus=tuple(float(s.tau) for s in sched),
        laplace_scales=tuple(s.laplace_scale for s in sched),
        biases=tuple(s.bias for s in sched),
        epsilon=e,
        tau=tau,
        snap_lambdas=tuple(p[0] for p in snaps),
    )


# ----------------------------------------------------------------------------- approximate DP (RDP)
#: Rényi orders tried by :func:`s4s_rdp_schedule`: α = 1 + 2^{j/4}, j = −16 … 48 (public, fixed)
RDP_ORDERS = tuple(1.0 + 2.0 ** (j / 4.0) for j in range(-16, 49))


@dataclass(frozen=True)
class S4SRdpStep:
    """One Gaussian run of the RDP variant of Algorithm 2 (data independent)."""

    i: int
    tau: float  #: τ_i of the grid (:func:`dpsql.accounting.s4s_tau_grid`)
    rho: float  #: ρ_i = ρ₀/i, the RDP (order α) of the unsampled release at sensitivity τ_i + G_i
    rho_prime: float  #: ρ′_i (Lemma 3.5 with the certified slack G_i), what the run costs
    sigma: float  #: σ_i = (τ_i + G_i)·√(α/(2ρ_i))
    bias: float  #: σ_i·√(2 ln(kL/β)) (k = 1 default, 3 paper), subtracted from the noisy value
    granularity: float  #: γ_i = 2^⌊log₂(σ_i/16)⌋, the released value's rounding grid


@dataclass(frozen=True)
class S4SRdpSchedule:
    alpha: float
    rho_total: float  #: ρ available at order α for (ε, δ − δ_fp) by the CKS conversion
    steps: tuple[S4SRdpStep, ...]
    rho_spent: float  #: Σ ρ′_i, the per-run costs of Lemma 3.5 summed (below the joint cost when q < 1)
    fp_delta: float  #: (1 + e^ε)·Σ_i δ_coord,i: the floating-point part of δ (dpsql.noise §3)
    epsilon_spent: float  #: CKS ε of (α, rho_joint) at δ − fp_delta; ≤ ε
    rho_joint: float = 0.0  #: the runs' joint RDP on one sample (:func:`dpsql.accounting.s4s_joint_rdp`, with margin); ≤ rho_total


def _rdp_rho_total(e: float, d: float, a: float) -> float:
    """ρ with ρ + ln(1 − 1/α) − (ln δ + ln α)/(α − 1) = ε (CKS / Balle et al. RDP → DP)."""
    return e - math.log1p(-1.0 / a) + (math.log(d) + math.log(a)) / (a - 1.0)


def _rdp_steps(
    rho_total: float, a: float, delta: int, q: float, beta: float, base: float, paper_bias: bool, scale: float = 1.0,
    top_at_delta: bool = True,
) -> list[S4SRdpStep]:
    grid = s4s_tau_grid(delta, base, top_at_delta=top_at_delta)
    big_l = len(grid)
    z = math.sqrt(2.0 * math.log((3.0 if paper_bias else 1.0) * big_l / beta))
    rho0 = rho_total
    out = []
    for i in range(big_l, 0, -1):
        tau = grid[i - 1]
        gap = _trunc.gap_bound(tau)
        rho_i = scale * rho0 / i
        sigma = (tau + gap) * math.sqrt(a / (2.0 * rho_i))
        rp = s4s_rdp_prime(a, rho_i, tau, delta, q, gap=gap)
        rho0 = max(0.0, rho0 - rp)
        gran = math.ldexp(1.0, math.floor(math.log2(sigma / 16.0)))
        out.append(S4SRdpStep(i, tau, rho_i, rp, sigma, sigma * z, gran))
    return out


@functools.lru_cache(maxsize=64)
def _rdp_schedule_cached(
    e: float, d: float, delta: int, q: float, beta: float, alpha: float | None, base: float, paper_bias: bool = False,
    top: bool = True,
) -> S4SRdpSchedule:
    big_l = s4s_grid_size(delta, base, top_at_delta=top)
    # every run's σ/γ < 32, so δ_coord ≤ gaussian_fp_delta(32, 1) (it depends on σ/γ only)
    fp = (1.0 + math.exp(min(e, 700.0))) * big_l * gaussian_fp_delta(32.0, 1.0, integer=False)
    # δ′ = δ − δ_fp rounded down: the conversion below is then valid for the exact δ′ as well
    d_rdp = binary_at_most(Fraction(d) - Fraction(fp)) if d > fp else 0.0
    if not d_rdp > 0:
        # the floating-point part grows with the grid's size and e^eps: name the delta this grid needs
        # fp = (1 + e^eps)·L·g grows with e^eps: a smaller epsilon always helps; a delta of 1 or more never exists
        per = big_l * gaussian_fp_delta(32.0, 1.0, integer=False)
        most = math.log(d / per - 1.0) if d / per > 1.0 else None  # the largest epsilon this delta allows
        need = f"it needs delta > {fp:.3g}" if fp < 1 else "no delta below 1 is enough"
        smaller = f"epsilon below {most:.3g}" if most is not None and most > 0 else "a smaller epsilon"
        raise ConfigError(f"delta={d:.6g} is too small for DP-S4S's floating-point Gaussian noise over {big_l} thresholds "
                          f"at epsilon={e!r} ({need})",
                          hint=(f"use delta > {fp:.3g}, or " if fp < 1 else "use ") + smaller
                          + (", or a larger tau_base (fewer thresholds)" if big_l > 8 else ""))
    best: tuple[float, float, list[S4SRdpStep]] | None = None
    for a in (RDP_ORDERS if alpha is None else (alpha,)):
        rt = _rdp_rho_total(e, d_rdp, a)
        if not rt > 0:
            continue
        steps = _rdp_steps(rt, a, delta, q, beta, base, paper_bias, top_at_delta=top)
        score = math.fsum(math.log(s.sigma / s.tau) for s in steps)  # geometric mean of σ_i/τ_i
        if best is None or score < best[0]:
            best = (score, a, steps)
    if best is None:
        raise ConfigError(
            f"epsilon={e!r} is too small for delta={d!r} at every Rényi order",
            hint="use a larger epsilon or delta (the RDP conversion needs epsilon > ln(1/delta)/(alpha-1) + ...)",
        )
    _, a, steps = best
    rt = _rdp_rho_total(e, d_rdp, a)

    def conv(r: float | Fraction) -> float:
        """An upper bound on the CKS ε of (α, r)-RDP at δ′ = d_rdp: the float evaluation plus 2⁻⁴⁶ of the
        magnitudes of its terms (its few roundings and faithfully rounded logarithms err by a few ulps of
        them), so that comparing it with ε by ``<=`` never lets the delivered ε exceed ε by an ulp."""
        rf = binary_at_least(Fraction(r))
        t1 = math.log1p(-1.0 / a)
        ld, la = math.log(d_rdp), math.log(a)
        t2 = (ld + la) / (a - 1.0)
        return rf + t1 - t2 + 2.0**-46 * (abs(rf) + abs(t1) + (abs(ld) + abs(la)) / (a - 1.0))

    if q < 1.0:  # the runs share one sample: the joint RDP (not Σ ρ′_i) must fit ("Joint accounting")
        def joint(st: list[S4SRdpStep]) -> float:
            return s4s_joint_rdp(a, [s.rho for s in st], [s.tau for s in st], delta, q,
                                 [_trunc.gap_bound(s.tau) for s in st])

        def fits(st: list[S4SRdpStep]) -> bool:
            jr = joint(st) * (1.0 + _JOINT_RTOL) + _JOINT_ATOL
            return jr <= rt and conv(jr) <= e

        if not fits(steps):
            lo, hi = 0.0, 1.0
            for _ in range(50):
                mid = 0.5 * (lo + hi)
                if fits(_rdp_steps(rt, a, delta, q, beta, base, paper_bias, scale=mid, top_at_delta=top)):
                    lo = mid
                else:
                    hi = mid
            if not lo > 0:  # pragma: no cover - c → 0 makes every run's ρ vanish
                raise ExecutionError(f"DP-S4S RDP schedule overspends epsilon={e!r} jointly")
            steps = _rdp_steps(rt, a, delta, q, beta, base, paper_bias, scale=lo, top_at_delta=top)
        jr = joint(steps) * (1.0 + _JOINT_RTOL) + _JOINT_ATOL
        spent = math.fsum(s.rho_prime for s in steps)
        return S4SRdpSchedule(a, rt, tuple(steps), spent, fp, conv(jr), jr)
    for _ in range(64):
        # q = 1 (independent runs): the exact RDP of the releases as drawn, Σ α(min(τ_i, Δ) + G_i)²/(2σ_i²)
        # from the float σ_i themselves (σ_i may round below its formula), must convert to at most ε
        spent_f = sum((Fraction(a) * (Fraction(min(s.tau, delta)) + Fraction(_trunc.gap_bound(s.tau))) ** 2
                       / (2 * Fraction(s.sigma) ** 2) for s in steps), Fraction(0))
        eps_conv = conv(spent_f)
        if eps_conv <= e:
            return S4SRdpSchedule(a, _rdp_rho_total(e, d_rdp, a), tuple(steps), binary_at_least(spent_f), fp,
                                  eps_conv, binary_at_least(spent_f))
        # lower ρ_total by the excess (the spent RDP moves with it one to one), and by a few ulps more
        rt = float(np.nextafter(rt - 2.0 * (eps_conv - e), 0.0)) * (1.0 - 4.0 * float(np.finfo(float).eps))
        steps = _rdp_steps(rt, a, delta, q, beta, base, paper_bias, top_at_delta=top)
    raise ExecutionError(f"DP-S4S RDP schedule overspends epsilon={e!r}")  # pragma: no cover


def s4s_rdp_schedule(
    epsilon: float,
    delta: float,
    max_tuples_per_user: int,
    q: float,
    beta: float = 0.1,
    alpha: float | None = None,
    tau_base: float = DEFAULT_TAU_BASE,
    paper_bias: bool = False,
    top_at_delta: bool | None = None,
) -> S4SRdpSchedule:
    """The data-independent schedule of the RDP variant of Algorithm 2 (docs/mechanisms.md §3.6).

    Allocation (the spec leaves it open): the same 1/i shape as the pure-DP schedule, in RDP at one
    order α: ρ₀ ← ρ_total(α); for i = L … 1: ρ_i = ρ₀/i, σ_i = (τ_i + G_i)√(α/(2ρ_i)),
    ρ₀ ← ρ₀ − ρ′_i (Lemma 3.5), so the last run takes what amplification left over and
    Σ ρ′_i ≤ ρ_total. ρ_total(α) = ε − ln(1 − 1/α) + (ln δ′ + ln α)/(α − 1) makes (α, ρ_total)-RDP
    imply (ε, δ′)-DP (CKS 2020 / Balle et al. 2020 Thm 21), δ′ = δ − δ_fp. α is the order of
    :data:`RDP_ORDERS` (or the given ``alpha``) minimising Σ_i ln(σ_i/τ_i), the geometric mean of
    the noise multipliers (the chosen τ is unknown in advance, so every run counts alike). The grid
    is :func:`dpsql.accounting.s4s_tau_grid` (``top_at_delta`` None: ``not paper_bias``, Δ on top).
    """
    e = _positive(epsilon, "epsilon", "epsilon is the query's total budget, e.g. epsilon=1.0")
    hint = "delta is the query's delta, in (0, 1), e.g. delta=1e-7"
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise ConfigError(f"delta must be a number, got {delta!r}", hint=hint) from None
    if isinstance(delta, bool) or not (0.0 < d < 1.0):
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}", hint=hint)
    a = None
    if alpha is not None:
        a = _positive(alpha, "alpha", "alpha is a Renyi order > 1")
        if not a > 1.0:
            raise ConfigError(f"alpha must be > 1, got {alpha!r}", hint="alpha is a Renyi order > 1")
    return _rdp_schedule_cached(e, d, _max_tuples(max_tuples_per_user), _rate(q), _beta(beta), a, tau_grid_base(tau_base),
                                bool(paper_bias), _top(paper_bias, top_at_delta))


@dataclass(frozen=True)
class S4SRdpResult:
    """Output of :func:`s4s_scalar_rdp` (every field DP or public)."""

    estimate: float  #: max(0, max_i f̃_i/q)
    unclamped: float
    candidates: tuple[float, ...]  #: f̃_i/q, i = L … 1
    schedule: S4SRdpSchedule
    epsilon: float
    delta: float
    q: float
    max_tuples_per_user: int
    beta: float
    tau: float  #: τ of the maximising candidate


def s4s_scalar_rdp(
    weights: object,
    tuple_idx: object,
    user_idx: object,
    *,
    epsilon: float,
    delta: float,
    max_tuples_per_user: int,
    q: float,
    rng: NoiseSource,
    beta: float = 0.1,
    alpha: float | None = None,
    tau_base: float = DEFAULT_TAU_BASE,
    paper_bias: bool = False,
    top_at_delta: bool | None = None,
    max_people_per_tuple: float | None = None,
) -> S4SRdpResult:
    r"""DP-S4S Algorithm 2 with Gaussian noise under Rényi DP: an (ε, δ)-DP estimate of Σ_t w_t.

    Privacy (neighbouring relation and the Δ condition as for :func:`s4s_scalar`): one Poisson
    sample S; run i releases f̄(S, τ_i) + N(0, σ_i²) rounded to γ_i. Lemma 3.5 (with the certified
    slack G_i, :func:`dpsql.accounting.s4s_rdp_prime`) makes run i (α, ρ′_i)-RDP; RDP composes
    additively at α over the L runs on the same sample, Σ ρ′_i ≤ ρ_total(α), and the CKS
    conversion gives (ε, δ − δ_fp)-DP; the floating-point sampler and rounding add
    δ_fp = (1 + e^ε)·Σ_i δ_coord,i (``dpsql.noise`` §3), so the whole is (ε, δ)-DP. The candidates
    f̃_i = f̂_i − σ_i√(2 ln(kL/β)) (each underestimates f̄(S, τ_i) except w.p. β/(kL), the Gaussian
    analogue of the pure-DP bias) are rescaled by 1/q; the release max(0, max_i f̃_i/q) is
    post-processing. Raises :class:`ConfigError` on invalid parameters only. ``max_people_per_tuple``
    picks the truncation's path as in :func:`s4s_scalar`.
    """
    people = _people(max_people_per_tuple)
    sched = s4s_rdp_schedule(epsilon, delta, max_tuples_per_user, q, beta, alpha, tau_base, paper_bias, top_at_delta)
    qq = _rate(q)
    for st in sched.steps:  # public: refused before any data is read
        check_gaussian_representable(st.sigma, st.granularity, integer=False, what="a DP-S4S run")
    jt = _sampled_join_tuples(weights, tuple_idx, user_idx, qq, rng)
    prep = _prepared(jt, None)
    cands = []
    for st in sched.steps:
        v = np.array([_trunc.truncate(prep, st.tau, people).value])
        noisy = round_to_granularity(gaussian_release(v, rng.gaussian_noise(st.sigma, 1), integer=False),
                                     st.granularity)
        cands.append((float(noisy[0]) - st.bias) / qq)
    best = int(np.argmax(cands))
    raw = float(cands[best])
    return S4SRdpResult(
        estimate=max(0.0, raw),
        unclamped=raw,
        candidates=tuple(cands),
        schedule=sched,
        epsilon=float(epsilon),
        delta=float(delta),
        q=qq,
        max_tuples_per_user=_max_tuples(max_tuples_per_user),
        beta=_beta(beta),
        tau=sched.steps[best].tau,
    )
