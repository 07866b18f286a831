r"""GROUP BY over joins: DP-S4S's vector mechanism (Algorithm 5), and per-user L2 clipping for one owner.

A grouped join releases one value per key of a public key set (``dpsql.plan.join_groups``): the
vector F = (f_1, …, f_d), f_g = Σ_{t in group g} w_t. Which keys are released never depends on
private rows. Two paths, chosen from public metadata only (``route_grouped_join``):

Privacy claim
-------------
Neighbouring relation (``docs/mechanisms.md`` §3.1): add or remove one person with every join tuple
they contribute to (a tuple belongs to every person reached from any of its rows through any
declared reference; tuples reaching nobody are counted in full, sensitivity 0).

**Clipped Gaussian (one person per tuple: a single foreign-key chain, Δ enforced).** Inside the
engine each owner's contribution vector v_u ∈ ℝ^d (per group, the sum of its tuples' values) is
scaled into the L2 ball of radius C: v_u·min(1, C/‖v_u‖₂); the clipped vectors are summed per
group (``dpsql.rewrite.join_groups.clipped_groups``). Removing one person removes exactly their
tuples, so the sum moves by their clipped vector: L2 sensitivity C (we calibrate for C(1 + 2⁻³⁰),
covering the floating-point rounding of the norm and the scaling: a person's m groups, m ≤ min(Δ, d),
give a norm within (m/2 + 1)·2⁻⁵³ relative and the clipped vector a norm ≤ C(1 + (m/2 + 3)·2⁻⁵³),
below C(1 + 2⁻³⁰) for m < 2²³). The sum across persons is exact: each clipped component truncated
toward zero onto the grid 2^(−k), C·2^k ∈ [2⁵¹, 2⁵²) (truncation never enlarges a component, so the
bound above holds for the grid vector), the integers added exactly in the engine, the tuples reaching
nobody on their own grid likewise; both totals reach Python as exact integers (``clipped_totals``) and
the noise is added to the exact value with one rounding (``dpsql.noise.add_exactly``). So the released
input moves between neighbours by exactly the removed person's grid vector, whatever the number of
persons, the order the engine adds them in, or the size of the unclipped total beside them (a
floating-point SUM across persons, used before, rounded at the last place of the running total: with
tuples reaching nobody worth 2⁴⁵ in a group, the persons' 0.75-clipped values came out 0.31 from their
exact sum, 4.5·10⁸ times the 2⁻³⁰·C allowed; ``tests/test_exact_join_sums.py``). C is the option ``clip_norm``
(declared by the analyst, in the aggregate's units) or, by default, the data-independent
C = Δ·max(|lo|, |hi|) (count: Δ), the largest norm one person's vector can have, so by default
nothing is clipped. Noise N(0, σ²I_d), σ = ``gaussian_sigma``(ε, δ_G, C) (exact analytic-Gaussian
calibration, ``dpsql.accounting``), δ_G = (1 − s)δ, with δ_fp = (1 + e^ε)·d·δ_coord(σ, γ) ≤ sδ the
floating-point part of the sampler and rounding (``dpsql.noise`` §3) at the public grid γ (a power
of two; ≥ 1 and integer for counts); the share s is the first of FP_SHARES = (0.1, 0.25, 0.5, 0.75)
that fits with γ ≤ 2σ, else coarser grids at s = 0.75 up to γ ≤ 4σ (GRID_CAP; beyond, refused: see
"Large key counts"). Charged: (ε, δ).
No sampling on this path.

**DP-S4S vector (Algorithm 5; tuples with several people, or ``mechanism='dp_s4s'``).**
Stage 1: Poisson sample of the join tuples at rate q' ≤ q in the engine, as the scalar path
(``dpsql.rewrite.joins``: a per-tuple ``RANDOM()`` draw on DuckDB's own connection when no slot is
looked up, else SHA-256 keyed by the per-query secret salt); only the sampled tuples' users, group
index and weights reach Python. Weights are normalised to [0, 1] (a SUM's positive and negative
parts are separate vector queries, each with half of (ε, δ)). Stage 2 (SVT, PMSJA): ε₁ = ε/10,
θ = θ₀ + Lap(2κ/ε₁), θ₀ = (30/ε)ln(6/β) (see "Budget split"); for τ = 1, 2, 4, … below Δ, then
τ_L = Δ (``vector_taus``; the paper's doubling is unbounded, a top at 2^⌈log₂ Δ⌉ would add noise ∝ τ_L for no
truncation it avoids): solve the truncation program (Eq. 2, an SOCP: ``dpsql.mechanisms._s4s_socp``; closed form when the plan has one person per
tuple, else Clarabel at every step — a choice made from the plan, never from the sample, since the
two differ in run time) on the sample, E = Σ_u(1 − y_u); stop at the first
τ with E + Lap(4κ/ε₁) ≤ θ (or at τ_L, where every user's vector has norm ≤ Δ ≤ τ_L and E = 0).
Stage 3: α = ``release_alpha``(ε₂ = 9ε/10, δ_A, d), ρ = ε₂ − ln(1/δ_A)/(α − 1), γ and η =
``s4s_eta``(α, ρ, d, "proof") of Lemma 4.1 (see the two paragraphs below); B = (E + 1)/κ; release
F̄ + σ(S)·N(0, I_d), σ(S) = 2τκ·η·SS(B, γ), rounded to the public grid γ_τ, divided by q. By
Lemma 4.2 the whole is (ε′, δ_A)-DP with ε′ = ``s4s_vector_epsilon_parts``(ε, δ_A, α, q, Δ,
svt_share=1/10) ≤ ε — but see "Joint accounting": that number is reported, not charged.

Joint accounting (``dpsql.accounting.s4s`` docstring, same heading). Lemma 4.2 amplifies the SVT and the
release separately and adds the two; both read the one sample (and so do the two parts of a split SUM),
so that composition is not justified (the amplified cost is superadditive in the stages' costs). The
charge composes the un-amplified stages and parts on a fixed sample — SVT ε₁-DP, release (α, ρ)-RDP ⇒
(ε₂, δ_A) with ε₁ + ε₂ = ε per part, so (ε, Σδ_A) for the query — and amplifies once with q′:
ε* = ``s4s_vector_joint_epsilon``(ε, q, Δ) = ln(1 + q′(e^ε − 1)) with δ ≤ q′(δ_A + δ_fp) ≤ δ.
Charged: (ε*, δ); ``explain`` shows ε* as ``epsilon_prime`` and Lemma 4.2's sum as
``epsilon_lemma_4_2``. E.g. ε = 4, q = 1/16, Δ = 1: ε* = 1.470149 (Lemma 4.2: 3.195567 at d = 5).

Budget split. The paper gives the SVT ε₁ = ε/5 with θ₀ = (6/ε₁)ln(6/β); its authors' code gives it
ε/10. Lemma 4.2 composes an ε₁-DP SVT with an (α, ρ)-RDP release and holds for any split, and θ₀
is any public number. We give the SVT ε/10 and keep the paper's threshold *value* (30/ε)ln(6/β):
the release gets 9ε/10 (smaller η, larger γ), the SVT's noise doubles. Simulated on the truncation
sequences E(τ) of the benchmark's samples (TPC-H Q5, Q7a/b/c at SF 0.1 and 1), the mean noise scale
at the stop falls by 12–20% on every sequence but Q5 at SF 1, where it stays level (the paper's
split with a threshold of (6/ε₁)ln(6/β) at ε₁ = ε/10 was worse there by 44%).
κ = 1 + GAP (GAP = 10⁻³, ``_s4s_socp.GAP``) covers the solver: the released E is within the
certified gap g ≤ GAP of the optimum's, so B·κ = E + 1 moves by ≤ 1 + GAP between neighbours and
B = (E + 1)/κ moves by ≤ 1 while still bounding LS_{F̄/(2τκ)} (Eq. 4); the SVT's scales carry κ
for the same reason. Uncertified solves (never observed) release the repaired point: the residual
outside the proof, as in part 1 (``_s4s_truncation``). The paper's LS bound of Eq. (4) is applied
to the solver's certified near-optimal point.

Noise multiplier (Lemma 4.1). We use η = √(α/(ρc)), c = 1 − α + αe^{−2γ} ∈ (0, 1), the form the
lemma's proof needs (``docs/mechanisms.md`` §3.8 remark), not the published √(α/ρ)/c, larger by
1/√c. Proof: for neighbours I, I′ let σ₁ = η·G(I), σ₂ = η·G(I′), t = σ₂²/σ₁². G is γ-smooth, so
t ∈ [e^{−2γ}, e^{2γ}], and the variance term of D_α(N(μ₁,σ₁²I_d)‖N(μ₂,σ₂²I_d)) (Gil et al.) is
≤ ρ/2 by the choice of γ (``s4s_gamma``, unchanged). The mean term is α‖μ₁ − μ₂‖²/(2σ_α²) with
σ_α² = (1 − α)σ₁² + ασ₂² = σ₁²(1 − α + αt) ≥ σ₁²c, and ‖μ₁ − μ₂‖ ≤ LS(I) ≤ B(I) ≤ G(I) = σ₁/η, so
it is ≤ α/(2cη²) = ρ/2. Both terms together: (α, ρ)-RDP, as in the lemma (the reverse order is the
same argument with I′ first). The paper's larger η also satisfies this, so everything else stands.

Order α. Lemma 4.1/4.2 hold for every α > α₀ = 1 + ln(1/δ_A)/ε₂; the paper picks α minimising its
η alone, but the released scale is η·SS(B, γ(α)) and for small B, SS ≈ e^{γB−1}/γ is dominated by
1/γ, which also depends on α. We pick α minimising the public factor η(α)·SS(1/κ, γ(α)) (the noise
multiplier at E = 0, i.e. of σ_lo): a data-independent choice, so the privacy claim is unchanged.
At ε = 4, δ = 10⁻⁷, d = 5 (TPC-H Q5) this factor is about 42 with the release's 9ε/10 (51 at the
paper's 4ε/5), against 106 with the paper's α and η as well.

σ(S) depends on the data: it is **never** reported (not in the Release, explain or the ledger).
Reported instead: the public σ_lo(τ) = 2τκη·SS(1/κ, γ)/q ≤ σ(S)/q and σ_cap(τ) = 2τκη·SS(B_cap/κ,
γ)/q, with B_cap = θ₀ + 1 + (8κ/ε₁)ln(L/p), p = 10⁻³δ: the SVT stops at a τ with E + 1 > B_cap
with probability ≤ p (its noise would have to exceed B_cap − 1 − θ₀), so σ(S) ≤ σ_cap w.p. ≥ 1 − p.
Floating point (the released values are rounded to a public grid γ_τ per τ; ``dpsql.noise`` §3). By
the coupling of ``dpsql.noise`` §3 the mechanism is (ε′, δ_A + (1 + e^ε)·P_mis)-DP, where P_mis bounds,
for every dataset within Δ, the probability that some released coordinate differs from the exact
mechanism's (a sliver event of the Gaussian sampler and rounding), plus L·2⁻⁴⁰ for the SVT's float
comparisons. Conditional on the sample and the SVT, the d Gaussian draws are independent of σ(S), and
one coordinate's sliver probability is δ_coord(σ, γ) = slope(γ)·σ + c₀ — *affine in σ*
(``gaussian_fp_delta_affine``). So, by a union bound over the d coordinates and then the expectation,

    P_mis ≤ d·( E[slope(γ_τ*)·σ(S)] + c₀ ) ≤ d·( max_τ slope(γ_τ)·2τκη · Ŝ + c₀ ),

τ* the stopping τ, Ŝ ≥ E[SS(B(S), γ)] at τ*. Ŝ (``stopped_ss_mean``): SS(B) ≤ e^{γB−1}/γ (the real
maximiser of (k + B)e^{−γk}; B ≤ e^{γB−1}/γ as x ≤ e^{x−1}); with s = γ/κ, B = (E + 1)/κ and
E ≥ 0, a stop before the last τ means E + ν ≤ θ = θ₀ + L₀ (ν the step's query noise), so
e^{sE} ≤ 1 + e^{sθ₀}e^{sL₀}·max_i e^{−sν_i}; at the last τ, E = 0 (Δ holds) and e^{sE} = 1 ≤ the same.
L₀ ~ Lap(2κ/ε₁) is independent of the ν_i ~ Lap(4κ/ε₁) (n ≤ L − 1 of them): E[e^{sL₀}] =
1/(1 − (2γ/ε₁)²) and, by Jensen, E[max_i e^{−sν_i}] ≤ (Σ_i E[e^{−psν_i}])^{1/p} = (n/(1 − (4pγ/ε₁)²))^{1/p}
for any p ≥ 1 with 4pγ/ε₁ < 1 (we take the least over a fixed grid of p). Hence
Ŝ = e^{γ/κ−1}/γ·(1 + e^{sθ₀}·X/(1 − (2γ/ε₁)²)) bounds E[SS] whatever the data, and P_mis does not
depend on a high-probability cap. Where 4γ/ε₁ ≥ 1 (no moment) — or where it is smaller — the older
cap bound is used instead: max_τ δ_coord(σ_cap(τ), γ_τ) + p, with B_cap = θ₀ + 1 + (8κ/ε₁)ln(L/p),
p = 10⁻³δ, the SVT stopping with E + 1 > B_cap with probability ≤ p. Each coordinate therefore costs
about c₀ + slope·σ̄ (≈ 10⁻¹⁴ at σ̄/γ ≈ 1) instead of carrying a share of p: at ε = 4, δ = 10⁻⁷ and
d = 2 526 (Q7c, Δ = 7, q = 1) the grid at τ = 1 is 256 (≈ 0.8σ_lo; with the cap bound alone it was 1 024 at the
paper's budget split and would exceed 8 192 at ours, whose SVT noise — and so B_cap — is twice as large).

Floating point after amplification. P_mis bounds the mismatch for *every* dataset within Δ, so for every
fixed sample S (a sub-multiset of the join tuples, itself within Δ): coupling the float mechanism M̂ with
the exact M on the same draws, for every set A and neighbouring samples S, S′,
P[M̂(S) ∈ A] ≤ P[M(S) ∈ A] + P_mis ≤ e^ε P[M(S′) ∈ A] + δ_A + P_mis ≤ e^ε P[M̂(S′) ∈ A] + δ_A + (1 + e^ε)P_mis:
on a fixed sample M̂ is (ε, δ_A + δ_fp)-DP, δ_fp = (1 + e^ε)(d·P_coord + L·2⁻⁴⁰) (per part, with the part's
ε; the parts compose to (ε, Σ)). "Joint accounting" uses nothing but this fixed-sample guarantee (it holds
for any δ there), so the whole is (ε*, q′·Σ_parts(δ_A + δ_fp))-DP, and each part is checked for
q′(δ_A + δ_fp) ≤ δ_part (q′ rounded up). At q = 1 (q′ = 1) this is δ_fp ≤ δ − δ_A as before; at q < 1 the
floating-point part may use δ/q′ − δ_A, which is larger (at q = 1/4, Δ = 7, d = 2 526 the grid at τ = 1
is 64 instead of 256). Coupling after the amplification instead would need (1 + e^{ε*})P_mis ≤ δ − q′δ_A,
never better: q′(1 + e^ε) < 2 + q′(e^ε − 1) = 1 + e^{ε*}.

Large key counts. The per-coordinate bound's intercept c₀ = 1.04·2/(1 − a)·2(0.242a + 0.399c) = 8.63·10⁻¹⁵
(a = 2⁻⁴⁷, c = 2⁻⁵⁰, ``dpsql.noise`` §3: the sliver probability at the two grid boundaries nearest the
mode of the noise, where a boundary may sit since the value is data-dependent) does not shrink with the
grid — only slope(γ) does. So d(1 + e^ε)c₀ ≤ δ_fp's allowance caps d whatever the grid: with the
allowance fixed at δ/10, at ε = 4, δ = 10⁻⁷ that was d ≤ 0.1δ/((1 + e⁴)c₀) = 20 847 (20 531 at Δ = 4),
and the grid search coarsened the release grid up to ~150σ_lo before refusing (a release of zeros).
Now the share s of δ set aside for the float part (δ_A = (1 − s)δ) is the first of FP_SHARES = (0.1,
0.25, 0.5, 0.75) whose check passes with a grid of at most 2⁵ steps above σ_lo/16 (≤ 2σ_lo); failing
all, coarser grids are tried at s = 0.75 up to the cap γ ≤ 4σ_lo (GRID_CAP; 4σ for clipping): a coarser
grid would round most released values to 0 while charging the full (ε*, δ), so the key count is refused.
α, ρ, γ, η are computed for that δ_A, and any data-independent
δ_A keeps Lemmas 4.1/4.2 (the choice reads (ε, δ, d, q, Δ) only). Its price: η·SS(1/κ, γ) grows by 1.0%,
3.3%, 7.3% (s = 0.25, 0.5, 0.75 against 0.1, d = 20 000). Largest d at ε = 4, δ = 10⁻⁷ (Δ = 4): 67 540
unsampled, 132 567 at q = 1/4 and 469 994 at q = 1/16; clipping (C = 4) 101 623 (the intercept bound at
s = 0.75, 156 358, was reached only with grids of ~10⁶σ).
Beyond, the refusal (``too_many_groups``) names the largest answerable count at this δ and the least
two-significant-digit δ that answers d, both found by bisection and each one a value at which the check
passed. Not used: the library's discrete Gaussian (``dpsql.accounting.discrete_gaussian``) has no
sampler, and its accounting is for a fixed scale and integer sensitivity, while σ(S) here is
data-dependent (Lemma 4.1's Rényi bound between two variances is for the continuous Gaussian). A tighter
c₀ for grids ≫ σ (one boundary near the mode, not two: a factor ≤ 2) would lose the affine form in σ
that the expectation over σ(S) needs. The grid γ_τ is the greatest power of two ≤ σ_lo(τ)/16 (times 2^k,
the same k for every τ) that passes. Charged: (ε*, δ) ("Joint accounting").

Accuracy (``half_width_95``; ``release_half_width``). What it covers: the noise and rounding of one released
value, around Σ_p ±scale_p·F̄_p(S, τ_p)/q — the truncated totals of the *sampled* tuples at the chosen τ's,
divided by q; neither the sampling error nor the truncation bias is in it (the latter's direction is stated in
the note). With probability ≥ 0.95 over the SVT's and the release's noise, for every dataset within Δ (the
samplers' law taken as exact). The noise of one part is σ(S)·Z = 2τκη·SS((E + 1)/κ, γ)·Z, Z ~ N(0, 1) independent
of the SVT; the interval may use the released τ (then h = 2τκη·H) but not E, so H must serve the worst data.
One part (``_worst_stop_half_width``): given the threshold noise L₀ = l, data with excess e_i at the i-th τ
stop there with probability F(θ₀ + l − e_i) (F the query noise's CDF) and then miss with probability
φ(e_i) = 2Φ(−H/SS((e_i + 1)/κ, γ)); at the last τ, e = 0. The largest miss probability over all sequences
e_1 … e_n ≥ 0 (n = L − 1), even sequences chosen knowing l, is a backward recursion V_1(l), bounded above on
cells of l and e; H solves E_l[V_1] = 0.05 by bisection. Two parts (a SUM with a negative lower bound; their
SVTs and draws are independent): a stop before the last τ has E ≤ θ₀ + L₀ − ν_τ ≤ θ₀ + W, W = L₀ + max_i(−ν_i),
so SS at the stop is at most X = SS((max(0, θ₀ + W) + 1)/κ, γ), a data-independent law (``stopped_ss_law``: W's
CDF bounded below by a discretised convolution, mass only moved upwards). The larger part runs the recursion
with φ(e) = E[2Φ(−h/√(a₁²SS_e² + a₂²X₂²))] over the smaller part's X₂ (above its miss probability for any of
its data, and still increasing in e). The law alone (E[2Φ(−h/X)] = 0.05; two parts over both laws) is about
1.3 times the recursion's bound for one part and is its fallback. Added: each part's rounding to its grid, scale·γ_τ/(2q), and 1/2 for a count.
Width (``tests/test_accuracy_s4s_vector.py``, ε = 4, δ = 10⁻⁷, Δ = 8): data with E = 40 below the last τ (near
the worst, θ₀ = 30.7) are covered 95.8% of the time and the interval is 1.05 times the error's 95th percentile
(two parts at E = 30: 1.3); with E = 0 it is 7.2 times. The unknown E is what keeps it wide on such data; the
release also shows ``half_width_95_at_sigma_lo``, the same at E = 0 (a reference, not a bound). Before, the
interval was 1.96·σ_cap (σ_cap at B_cap, a 1 − 10⁻³δ bound on E), 14 times the present one for one part.

Δ: Lemma 4.2's amplification uses q′ = 1 − (1 − q)^Δ. With one person per tuple Δ is enforced
by the per-input row caps (``dpsql.plan.joins``); with several people per tuple it is attested by
the owner's declarations, the claim for q < 1 is conditional on it and needs the owner's
``allow_conditional_sampling`` (as for scalar joins). q = 1 (``mechanism='r2t'`` on a grouped
join: the unsampled PMSJA-style release) needs no Δ for Lemma 4.2 (q′ = 1); τ_L still comes from Δ,
and so does the floating-point part's use of E = 0 at τ_L (true when Δ holds): with an attested Δ
that one term of δ is conditional on it.

Key set: declared domains and years are in the catalog; a public table's keys are read from that
table in the query (public rows); d is then known only at run time, and the parameters above are
computed there from d (public). The charge is still (ε*, δ): ε* depends on (ε, q, Δ) only, and δ is
what the float check above requires for that d. Before the charge (``check_public``, called by the
session's bind step for ``query`` and ``explain`` alike) the public key set is counted — public rows
only — and the parameters are computed for that d, so a δ too small for the key count is refused with
nothing spent; the amount reserved is the amount charged, whatever the private rows. At run time the
parameters are computed again from the key rows the run reads (the same public rows); were the public
table changed in between so that its d no longer fits, the run fails after its charge (the generic
ExecutionError; nothing is released, so (ε*, δ) still bounds what was spent). Per-user clipping does
not sample: its charge is (ε, δ) for every key set.

Observability residuals (``docs/threat_model.md``): the sampled tuples come to Python and the SOCP
runs there, so time and memory depend on the data's size (as for scalar joins).
Engines: the bounded SQL (``dpsql.rewrite.join_groups``) runs on DuckDB and on Spark; with the portable
keyed hash both cap, clip and sample the same tuples (``tests/test_spark_joins.py``). Only the d clipped
sums, or the sampled tuples and the public key set, leave the engine.
Sources: Qiu, Xiao, Yang, "DP-S4S" (SIGMOD 2026) §4 (Lemma 4.1, Algorithm 5, Lemma 4.2);
Dong, Sun, Yi, "Better than composition" (PMSJA, SIGMOD 2023); ``docs/mechanisms.md`` §3.7–3.9.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql.accounting import gaussian_sigma, s4s_gamma_eta, s4s_smooth_sensitivity
from dpsql.accounting._validate import shown
from dpsql.accounting.s4s import (
    s4s_find_alpha,
    s4s_tau_grid,
    s4s_vector_epsilon_parts,
    s4s_vector_joint_epsilon,
)
from dpsql.budget import Budget, share_of
from dpsql.engine.base import SqlOps
from dpsql.errors import ConfigError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms import _s4s_socp as socp
from dpsql.mechanisms.base import Description, MechanismName, Released, Request
from dpsql.mechanisms.basic import sql_arrow_type, typed_array
from dpsql.mechanisms.s4s_sql import JOIN_DIALECTS, bias_direction
from dpsql.noise import (
    NoiseSource,
    add_exactly,
    dyadic_sum,
    gaussian_fp_delta,
    gaussian_fp_delta_affine,
    round_to_granularity,
)
from dpsql.plan import ir
from dpsql.plan.join_groups import MAX_GROUPS
from dpsql.plan.joins import PeopleBound, bound_people
from dpsql.rewrite.bound import Caps
from dpsql.rewrite.join_groups import (
    clip_scale,
    clipped_groups,
    key_set,
    key_set_sizes,
    sampled_groups,
    unowned_scale,
)
from dpsql.rewrite.joins import Part, parts_of

BETA = 0.1
DEFAULT_Q = 1.0 / 16.0
#: relative slack on the clip norm (floating-point norm and scaling)
CLIP_SLACK = 2.0**-30
#: the smallest clip norm C: a person whose norm exceeds C has a component >= C/sqrt(m) whose square is a normal
#: double, so the norm is computed within (m/2 + 1) 2^-53 (smaller squares underflowing add < m 2^-1074);
#: below, a person's squares could underflow to 0, the norm read 0 <= C, and nothing be clipped
CLIP_MIN = 2.0**-400
#: the smallest C / (Delta x max|value|): C / norm (norm <= Delta x max|value|) is then a normal double, within
#: 2^-53 of its value (a subnormal quotient is off by up to 2^-1075 absolute: 0.5000001 x 2^-1074 rounds to
#: 2^-1074, doubling the clipped vector); an infinite norm (squares overflowing) gives C / norm = 0: clipped to 0
CLIP_MIN_RATIO = 2.0**-1000



def clip_in_range(clip: float, max_total: float) -> bool:
    """Whether per-user clipping to ``clip`` keeps every clipped vector within C(1 + 2^-30) (CLIP_MIN,
    CLIP_MIN_RATIO; ``max_total`` = Delta x max|value| bounds a person's norm): the products v x (C / norm)
    are then normal or below C 2^-600 in error (subnormal: 2^-1075 absolute each). Public values only."""
    return clip >= CLIP_MIN and clip >= max_total * CLIP_MIN_RATIO
KAPPA = 1.0 + socp.GAP
FP_SHARE = 0.1  #: the share of δ set aside for the floating-point part first
#: the shares tried in turn (δ_A = (1 − share)·δ) before a release grid coarser than about 2σ_lo (2σ for clipping)
FP_SHARES = (FP_SHARE, 0.25, 0.5, 0.75)
#: grid steps above σ_lo/16 tried at every share: 2^5 × (σ_lo/32, σ_lo/16] ends at most 2σ_lo
FINE_STEPS = 5
#: the coarsest release grid, in units of σ_lo (σ for clipping): beyond it the query is refused (a grid of many σ
#: releases mostly zeros while charging the full (ε, δ))
GRID_CAP = 4.0
#: the SVT's share of ε (module docstring, "Budget split"): the authors' code's 1/10, the paper's threshold value
SVT_SHARE = 0.1


@dataclass(frozen=True)
class VectorParams:
    """Algorithm 5's public parameters for one part at dimension d."""

    d: int
    epsilon: float
    delta: float
    delta_alg: float
    eps1: float
    eps2: float
    theta0: float
    taus: tuple[float, ...]
    alpha: float
    rho: float
    gamma: float
    eta: float
    b_cap: float
    p_exceed: float
    sigma_lo: tuple[float, ...]  #: per τ, before the 1/q scaling
    sigma_cap: tuple[float, ...]
    grid: tuple[float, ...]
    fp_delta: float
    epsilon_prime: float
    q_prime: float
    fp_share: float = FP_SHARE  #: δ_A = (1 − fp_share)·δ


#: Lemma 4.1's multiplier in the form its proof needs (module docstring, "Noise multiplier")
ETA_FORM = "proof"


def _release_factor(alpha: float, eps2: float, delta: float, d: int) -> float:
    """η(α)·SS(1/κ, γ(α)): the noise multiplier of σ_lo (E = 0), a function of public quantities only."""
    rho = eps2 - math.log(1.0 / delta) / (alpha - 1.0)
    if not rho > 0:
        return math.inf
    gamma, eta = s4s_gamma_eta(alpha, rho, d, ETA_FORM)  # one solve of Lemma 4.1's roots for both
    return eta * s4s_smooth_sensitivity(1.0 / KAPPA, gamma)[0]


@lru_cache(maxsize=256)
def release_alpha(eps2: float, delta: float, d: int) -> float:
    """The Rényi order of stage 3: minimises η(α)·SS(1/κ, γ(α)) (module docstring, "Order α").

    Scans α₀ + (α_p − α₀)·2^{k/16}, k = −64 … 64, around the paper's order α_p (``s4s_find_alpha``,
    α₀ = 1 + ln(1/δ)/ε₂), then refines by bounded Brent between the best point's neighbours.
    Data-independent: any α > α₀ keeps Lemma 4.1/4.2."""
    from scipy.optimize import minimize_scalar

    a0 = 1.0 + math.log(1.0 / delta) / eps2
    ap = s4s_find_alpha(eps2, delta, d)
    xs = [a0 + (ap - a0) * 2.0 ** (k / 16.0) for k in range(-64, 65)]
    vals = [_release_factor(x, eps2, delta, d) for x in xs]
    i = min(range(len(xs)), key=lambda j: vals[j])
    lo, hi = xs[max(i - 1, 0)], xs[min(i + 1, len(xs) - 1)]
    res = minimize_scalar(lambda a: _release_factor(a, eps2, delta, d), bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-9 * hi})
    best = float(res.x) if res.success and res.fun <= vals[i] else xs[i]
    return best


def stopped_ss_mean(gamma: float, eps1: float, theta0: float, n_queries: int) -> float:
    """Ŝ ≥ E[SS((E + 1)/κ, γ)] at the τ where the SVT stops, for every dataset within Δ (module docstring,
    "Floating point"): e^{γ/κ−1}/γ·(1 + e^{sθ₀}·M₀·X), s = γ/κ, M₀ = 1/(1 − (2γ/ε₁)²) the threshold
    noise's moment, X = min_p (n/(1 − (4pγ/ε₁)²))^{1/p} ≥ E[max_i e^{−sν_i}] over the n query noises.
    inf when 4γ/ε₁ ≥ 1 (no exponential moment)."""
    s0, s1 = 2.0 * gamma / eps1, 4.0 * gamma / eps1
    if s1 >= 1.0:
        return math.inf
    n = max(1, n_queries)
    ps = [1.0] + [c / 20.0 / s1 for c in range(1, 20) if c / 20.0 / s1 > 1.0]
    x = min((n / (1.0 - (p * s1) ** 2)) ** (1.0 / p) for p in ps)
    return math.exp(gamma / KAPPA - 1.0) / gamma * (1.0 + math.exp(gamma * theta0 / KAPPA) / (1.0 - s0 * s0) * x)


#: the failure probability of the published noise half-width (``half_width_95``)
HALF_WIDTH_BETA = 0.05


def _laplace_cdf(x: np.ndarray, b: float) -> np.ndarray:
    return np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0.0) / b), 1.0 - 0.5 * np.exp(-np.maximum(x, 0.0) / b))


def _ss_vec(bound: np.ndarray, gamma: float) -> np.ndarray:
    """``s4s_smooth_sensitivity`` elementwise: max over k ∈ {0, ⌊1/γ − B⌋, ⌊1/γ − B⌋ + 1} of (k + B)e^{−γk}."""
    k0 = np.floor(np.maximum(1.0 / gamma - bound, 0.0))
    out = np.array(bound, dtype=np.float64)
    for k in (k0, k0 + 1.0):
        out = np.maximum(out, (k + bound) * np.exp(-gamma * k))
    return out


@lru_cache(maxsize=64)
def stopped_ss_law(eps1: float, theta0: float, gamma: float, n_queries: int, rel: float = 0.005
                   ) -> tuple[np.ndarray, np.ndarray, float]:
    """A discrete law (values x ascending, probabilities p, mass t at +∞) stochastically above
    X = SS((E + 1)/κ, γ) at the τ where the SVT stops, for every dataset within Δ (module docstring,
    "Accuracy"): a stop before the last τ has E ≤ θ₀ + W, W = L₀ + max_i(−ν_i) over the n query noises
    (E ≥ 0; at the last τ, E = 0). W's CDF is bounded below on a grid of step b₀/50 (L₀'s mass on each cell
    paired with the far end of the cell, the mass beyond 25 scales put at +∞, 10⁻¹² taken off for the
    float sums), each cell's mass is put at its upper end, and cells are merged while their x stay
    within 1 + ``rel`` (the largest x kept): every step only moves mass upwards."""
    x_lo = float(_ss_vec(np.array(1.0 / KAPPA), gamma))
    if n_queries <= 0:  # one τ only: the SVT stops at it, E = 0
        return np.array([x_lo]), np.array([1.0]), 0.0
    b0, b1 = 2.0 * KAPPA / eps1, 4.0 * KAPPA / eps1
    h = b0 / 50.0
    lj = np.arange(-25.0 * b0, 25.0 * b0 + h / 2, h)
    pl = np.diff(_laplace_cdf(lj, b0))  # P(L₀ ∈ [l_j, l_{j+1}))
    w0 = lj[0] - 25.0 * b1
    w = w0 + h * np.arange(int((lj[-1] - w0 + 25.0 * b1 + b1 * math.log(n_queries)) / h) + 2)
    # F_W(w_k) ≥ Σ_j P(L₀ ∈ cell j)·F_M(w_k − l_{j+1}) + P(L₀ < l_0)·F_M(w_k − l_0), F_M = F_ν^n
    # w_k − l_{j+1} = w0 − l_1 + (k − j)h: a convolution over m_i = w0 − l_1 + i h, i = −(J − 1) … K − 1
    big_j, big_k = pl.size, w.size
    fm = _laplace_cdf(w0 - lj[1] + h * np.arange(-(big_j - 1), big_k), b1) ** n_queries
    cdf = np.convolve(fm, pl)[big_j - 1:big_j - 1 + big_k] + float(_laplace_cdf(lj[:1], b0)[0]) * _laplace_cdf(w - lj[0], b1) ** n_queries
    cdf = np.clip(np.maximum.accumulate(cdf - 1e-12), 0.0, 1.0)
    x = _ss_vec((np.maximum(theta0 + w, 0.0) + 1.0) / KAPPA, gamma)
    mass = np.diff(cdf, prepend=0.0)
    # merge cells while x stays within 1 + rel of the bin's first x, the bin valued at its largest x
    edges = np.searchsorted(x, x_lo * (1.0 + rel) ** np.arange(1, int(math.log(x[-1] / x_lo) / math.log1p(rel)) + 2), side="right")
    edges = np.unique(np.concatenate([edges[edges < x.size], [x.size]]))
    starts = np.concatenate([[0], edges[:-1]])
    xs = x[edges - 1]
    ps = np.add.reduceat(mass, starts)
    return xs, ps, float(1.0 - cdf[-1])


def noise_half_width(vp: VectorParams, weights: Sequence[float], beta: float = HALF_WIDTH_BETA) -> float:
    """h with P(|Σ_p a_p X_p Z_p| > h) ≤ ``beta``, a_p = ``weights`` (a part's scale × 2τκη/q at its τ), X_p
    independent draws of ``stopped_ss_law`` and Z_p standard normal: the noise of one released value is
    Σ_p a_p·SS_p·Z_p, each part with its own SVT and draws (module docstring, "Accuracy")."""
    a = sorted((float(w) for w in weights if w > 0), reverse=True)
    if not a:
        return 0.0
    if len(a) > 2:  # pragma: no cover - a SUM has at most two parts
        raise ValueError("at most two parts")
    return a[0] * _unit_half_width(vp.eps1, vp.theta0, vp.gamma, len(vp.taus) - 1, a[1] / a[0] if len(a) == 2 else 0.0, beta)


@lru_cache(maxsize=1024)
def _unit_half_width(eps1: float, theta0: float, gamma: float, n_queries: int, ratio: float, beta: float) -> float:
    """``noise_half_width`` at weights (1, ratio) (ratio 0: one part), by bisection on h; the h returned is one
    at which the bound holds."""
    from scipy.special import ndtr

    xs, ps, tail = stopped_ss_law(eps1, theta0, gamma, n_queries, 0.005 if ratio == 0.0 else 0.03)
    if ratio == 0.0:
        sd, pr = xs, ps
    else:  # two independent parts: the noise is N(0, X₁² + ratio²X₂²)
        sd = np.sqrt(np.add.outer(xs**2, (ratio * xs) ** 2)).ravel()
        pr = np.multiply.outer(ps, ps).ravel()
        tail = 1.0 - (1.0 - tail) ** 2

    def miss(hw: float) -> float:
        return float(np.dot(pr, 2.0 * ndtr(-hw / sd))) + tail

    lo, hi = 0.0, float(sd.max()) * 10.0
    while miss(hi) > beta:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if miss(mid) > beta else (lo, mid)
    if n_queries > 0:  # the tighter bound of the SVT's worst data for the larger part, where it holds
        return _worst_stop_half_width(eps1, theta0, gamma, n_queries, beta, hi, ratio)
    return hi


def _worst_stop_half_width(eps1: float, theta0: float, gamma: float, n_queries: int, beta: float, h_law: float,
                           ratio: float = 0.0, cells: tuple[int, int] = (400, 800)) -> float:
    """H of the part with weight 1 from the SVT's worst data (module docstring, "Accuracy"), at most ``h_law``
    (the bound of ``stopped_ss_law``, also valid). Given the threshold noise L₀ = l, data with excess e_i at the
    i-th τ stop there with probability F(θ₀ + l − e_i) (F the query noise's CDF) and then miss with probability
    φ(e_i) = 2Φ(−H/SS((e_i + 1)/κ, γ)); the last τ has e = 0. The largest miss probability over every sequence
    e_1 … e_n ≥ 0, even one chosen knowing l, is V_1(l): V_{n+1} = φ(0), V_i = max_e V_{i+1} + F(θ₀ + l − e)·
    (φ(e) − V_{i+1})⁺. Bounded above on cells of l (the cell's largest l) and of e (F at the cell's least e,
    φ at its largest; e beyond the grid adds F at its end), L₀'s mass beyond 25 scales counted as a miss;
    E_l[V_1] ≤ β by bisection on H (relative 10⁻³, the upper end returned). With a second part of weight
    ``ratio`` (independent SVT and draws), φ(e) = E[2Φ(−H/√(SS_e² + ratio²X²))] over X of ``stopped_ss_law``,
    which lies above that part's SS at its stop for any data: φ stays increasing in e and above the miss
    probability given the first part's stop."""
    from scipy.special import ndtr

    b0, b1 = 2.0 * KAPPA / eps1, 4.0 * KAPPA / eps1
    n_l, n_e = cells
    lj = np.linspace(-25.0 * b0, 25.0 * b0, n_l + 1)
    pl = np.diff(_laplace_cdf(lj, b0))
    l_out = 1.0 - float(pl.sum()) + 1e-12
    e = np.linspace(0.0, theta0 + 25.0 * b0 + 25.0 * b1, n_e + 1)
    stop = _laplace_cdf(theta0 + lj[1:, None] - e[None, :-1], b1)  # (l cell, e cell): F at the cell's least e
    beyond = _laplace_cdf(theta0 + lj[1:] - e[-1], b1)
    x = _ss_vec((e + 1.0) / KAPPA, gamma)

    if ratio > 0.0:
        xs2, ps2, tail2 = stopped_ss_law(eps1, theta0, gamma, n_queries, 0.03)
        sd = np.sqrt(np.add.outer(x**2, (ratio * xs2) ** 2))  # (e, second part's bins)

    def miss(h: float) -> float:
        phi = 2.0 * ndtr(-h / x) if ratio == 0.0 else np.minimum(2.0 * ndtr(-h / sd) @ ps2 + tail2, 1.0)
        v = np.full(n_l, phi[0])
        for _ in range(n_queries):
            v = v + np.max(stop * np.maximum(phi[None, 1:] - v[:, None], 0.0), axis=1) + beyond
        return float(np.dot(pl, np.minimum(v, 1.0))) + l_out

    lo, hi = 0.5 * h_law, h_law
    if miss(hi) > beta:
        return h_law
    while hi - lo > 1e-3 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if miss(mid) > beta else (lo, mid)
    return hi


def release_half_width(vp: VectorParams, stops: Sequence[tuple[float, float]], q: float, integer: bool
                       ) -> tuple[float, float]:
    """(half_width_95, half_width_95_at_sigma_lo) of one released value Σ_p ±scale_p·F̃_p/q, ``stops`` = the
    parts' (scale, τ at the SVT's stop) (module docstring, "Accuracy"): the noise bound of ``noise_half_width``
    plus each part's rounding to its grid, scale·γ_τ/(2q), and 1/2 for a count's rounding to an integer; the
    second is the same were each part's noise scale σ_lo(τ) (E = 0 at the stop): a reference, not a bound."""
    rounding = (0.5 if integer else 0.0) + sum(s * vp.grid[vp.taus.index(t)] / (2.0 * q) for s, t in stops)
    noise = noise_half_width(vp, [s * 2.0 * t * KAPPA * vp.eta / q for s, t in stops])
    low = 1.96 * math.sqrt(sum((s * vp.sigma_lo[vp.taus.index(t)] / q) ** 2 for s, t in stops))
    return noise + rounding, low + rounding


def fp_coord_expected(grid: tuple[float, ...], taus: tuple[float, ...], cap: tuple[float, ...], p_exceed: float,
                      eta: float, ss_mean: float) -> float:
    """A bound on the probability that one coordinate's released value differs from the exact mechanism's
    (module docstring, "Floating point"): the smaller of (a) the cap bound max_τ δ_coord(σ_cap(τ), γ_τ) + p
    and (b) the expectation bound max_τ slope(γ_τ)·2τκη·Ŝ + intercept (δ_coord is affine in σ)."""
    cap_bound = max(gaussian_fp_delta(sc, g, integer=False) for sc, g in zip(cap, grid)) + p_exceed
    if not math.isfinite(ss_mean):
        return cap_bound
    parts = [gaussian_fp_delta_affine(g, integer=False) for g in grid]
    mean_bound = max(sl * 2.0 * t * KAPPA * eta for (sl, _), t in zip(parts, taus)) * ss_mean + parts[0][1]
    return min(cap_bound, mean_bound * (1.0 + 1e-12))


def q_prime_of(q: float, max_tuples: int) -> float:
    """q′ = 1 − (1 − q)^Δ, the probability that one person's ≤ Δ tuples meet the sample."""
    if q >= 1.0:
        return 1.0
    return -math.expm1(max_tuples * math.log1p(-q))


def vector_taus(max_tuples: int) -> tuple[float, ...]:
    """The SVT's thresholds: 1, 2, 4, … below Δ, then Δ (module docstring; public, from Δ only). Same count
    as the doubling grid 1 … 2^⌈log₂ Δ⌉, whose top it lowers to Δ: at τ = Δ every user's vector (norm ≤ its
    weight sum ≤ Δ) is untruncated, E = 0, as at any larger τ, and the noise at the last step is ∝ τ."""
    return s4s_tau_grid(max_tuples, 2.0, top_at_delta=True, keep_near_top=True)


@lru_cache(maxsize=4096)
def _vector_fit(epsilon: float, delta: float, d: int, q: float, max_tuples: int) -> VectorParams | None:
    """Algorithm 5's public parameters, or None when no (share, grid) covers the floating-point part."""
    # ε₁ + ε₂ ≤ ε exactly (0.1ε + 0.9ε rounds above ε for most ε): at q = 1 the charge is ε itself
    eps1 = SVT_SHARE * epsilon
    eps2 = epsilon - eps1
    while Fraction(eps1) + Fraction(eps2) > Fraction(epsilon):
        eps2 = math.nextafter(eps2, 0.0)
    theta0 = 30.0 / epsilon * math.log(6.0 / BETA)  # the paper's (6/ε₁)ln(6/β) at its ε₁ = ε/5
    taus = vector_taus(max_tuples)
    n_tau = len(taus)
    if not eps2 > 0 or not math.isfinite(eps2):  # pragma: no cover - epsilon validated upstream
        raise ConfigError("epsilon must be positive")
    qp = min(1.0, q_prime_of(q, max_tuples) * (1.0 + 1e-12))  # rounded up
    mult = 1.0 + math.exp(epsilon)
    p = 1e-3 * delta
    b_cap = theta0 + 1.0 + 8.0 * KAPPA / eps1 * math.log(n_tau / p)
    tries = [(s, k) for s in FP_SHARES for k in range(FINE_STEPS + 1)]
    tries += [(FP_SHARES[-1], k) for k in range(FINE_STEPS + 1, 40)]
    for share, k in tries:
        delta_alg = delta * (1.0 - share)
        alpha = release_alpha(eps2, delta_alg, d)
        # ρ + ln(1/δ_A)/(α − 1) ≤ ε₂ in exact arithmetic: 2⁻⁴⁶ε₂ (128 ulps) absorbs the few ulps of ε₂ that the
        # float logarithm, division and subtraction (all terms ≤ ε₂) and the SVT's float scales can lose
        rho = eps2 * (1.0 - 2.0**-46) - math.log(1.0 / delta_alg) / (alpha - 1.0)
        if not rho > 0:  # pragma: no cover - release_alpha keeps ρ > 0 with room to spare
            continue
        gamma, eta = s4s_gamma_eta(alpha, rho, d, ETA_FORM)
        g1 = s4s_smooth_sensitivity(1.0 / KAPPA, gamma)[0]
        gc = s4s_smooth_sensitivity(b_cap / KAPPA, gamma)[0]
        lo = tuple(2.0 * t * KAPPA * eta * g1 for t in taus)
        cap = tuple(2.0 * t * KAPPA * eta * gc for t in taus)
        ss_mean = stopped_ss_mean(gamma, eps1, theta0, n_tau - 1)
        grid = tuple(2.0 ** (math.floor(math.log2(s / 16.0)) + k) for s in lo)
        if any(g > GRID_CAP * s for g, s in zip(grid, lo)):
            break  # coarser grids would release (mostly) zeros: refuse instead
        fp = mult * (d * fp_coord_expected(grid, taus, cap, p, eta, ss_mean) + n_tau * 2.0**-40)
        # on a fixed sample (ε, δ_A + fp); amplified once: q′(δ_A + fp) ≤ δ (module docstring, "Floating point")
        if qp * (delta_alg + fp) <= delta * (1.0 - 1e-9):
            parts = s4s_vector_epsilon_parts(epsilon, delta_alg, alpha, q, max_tuples, svt_share=SVT_SHARE)
            return VectorParams(d, epsilon, delta, delta_alg, eps1, eps2, theta0, taus, alpha, rho, gamma, eta, b_cap, p,
                                lo, cap, grid, fp, min(epsilon, parts.epsilon_prime), parts.q_prime, share)
    return None


def vector_params(epsilon: float, delta: float, d: int, q: float, max_tuples: int, parts: int = 1) -> VectorParams:
    """Public parameters of Algorithm 5 for one part (module docstring); ConfigError (naming the largest key
    count the query's δ = parts·delta answers and the δ this key count needs) if δ cannot cover the float part."""
    vp = _vector_fit(epsilon, delta, d, q, max_tuples)
    if vp is None:
        raise too_many_groups(d, delta * parts,
                              lambda n, dl: _vector_fit(epsilon, dl / parts, n, q, max_tuples) is not None, epsilon=epsilon)
    return vp


def too_many_groups(d: int, delta: float, fits: Callable[[int, float], bool], *, epsilon: float = 0.0) -> ConfigError:
    """The refusal of a key count whose floating-point part δ cannot cover: computed limits, public inputs only.

    The largest answerable count is found by bisection on [1, d) and the least δ (two significant digits,
    up to 0.01) by bisection over those values; each reported value is one at which ``fits`` held. The
    floating-point part grows like e^epsilon: when no count is answerable at epsilon >= 10, the hint says to
    lower epsilon (fewer groups cannot help then)."""
    lo, hi = 0, d  # fits(lo) (lo = 0: none yet), not fits(hi)
    if fits(1, delta):
        lo = 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid, delta) else (lo, mid)
    cands = sorted({float(f"{m}e{e}") for e in range(math.floor(math.log10(delta)) - 1, -3) for m in range(10, 100)
                    if delta < float(f"{m}e{e}") <= 0.01})
    need = None
    a, b = -1, len(cands)  # cands[b] fits (b = len: unknown)
    while b - a > 1:
        mid = (a + b) // 2
        a, b = (a, mid) if fits(d, cands[mid]) else (mid, b)
    if b < len(cands):
        need = cands[b]
    largest = (f"the largest key count answerable at delta={delta:g} is {lo}" if lo
               else f"no key count is answerable at delta={delta:g}")
    needs = f"delta={need:g} would answer {d} groups" if need is not None else f"no delta up to 0.01 answers {d} groups"
    if not lo and need is None and epsilon >= 10:
        return ConfigError(
            f"delta={delta:g} is too small to cover the floating-point part of the noise for {d} groups: {largest}; {needs}:"
            f" this part grows like e^epsilon, so epsilon={epsilon:g} is too large for Gaussian noise",
            hint="use a smaller epsilon (below 10 usually fits)")
    return ConfigError(
        f"delta={delta:g} is too small to cover the floating-point part of the noise for {d} groups: {largest}; {needs}",
        hint=(f"pass delta={need:g} (or more)" if need is not None else "use fewer groups")
        + " or group by fewer keys (each group's noise carries a floating-point share of delta)")


@dataclass(frozen=True)
class ClipParams:
    d: int
    clip: float
    sigma: float
    grid: float
    fp_delta: float
    fp_share: float = FP_SHARE  #: the Gaussian is calibrated at (ε, (1 − fp_share)·δ)


def joint_factor(runs: int) -> float:
    """√runs rounded up: the L2 sensitivity factor of one run among ``runs`` composed as one Gaussian vector."""
    return 1.0 if runs <= 1 else math.nextafter(math.sqrt(runs), math.inf)


@lru_cache(maxsize=4096)
def _clip_fit(epsilon: float, delta: float, d: int, clip: float, integer: bool, joint: int = 1) -> ClipParams | None:
    """Per-user clipping's σ and grid, or None when no (share, grid) covers the floating-point part: the shares
    FP_SHARES in turn with grids up to 2σ, then coarser grids at the largest share (module docstring).
    ``joint`` = m > 1: one of m runs composed as one Gaussian vector (``dpsql.mechanisms.join_multi``): σ is
    calibrated to the sensitivity √m·C(1 + 2⁻³⁰), so that the m runs together shift by at most the sensitivity
    their σ's are calibrated to."""
    sens = clip * (1.0 + CLIP_SLACK) * joint_factor(joint)
    mult = 1.0 + math.exp(epsilon) if epsilon < 700.0 else math.inf  # (beyond, e^epsilon is no double: nothing fits)
    for fine in (True, False):
        for share in FP_SHARES if fine else FP_SHARES[-1:]:
            sigma = gaussian_sigma(epsilon, delta * (1.0 - share), sens)
            if not math.isfinite(sigma):
                # a clip_norm near the DOUBLE range (1e308) needs a noise scale beyond it (before any charge)
                raise ConfigError(f"clip_norm={clip!r} is too large: the noise it needs at epsilon={epsilon!r}, "
                                  f"delta={delta!r} has a scale beyond the DOUBLE range",
                                  hint="declare a smaller clip_norm (or omit it: the default is Delta x max|value|)")
            base = 0 if integer else math.floor(math.log2(sigma / 16.0))
            for k in range(0, 60):
                grid = 2.0 ** (base + k)
                if fine and k > 0 and grid > 2.0 * sigma:
                    break
                if k > 0 and grid > GRID_CAP * sigma:
                    break  # coarser grids would release (mostly) zeros: refuse instead
                fp = mult * d * gaussian_fp_delta(sigma, grid, integer=False)
                if fp <= share * delta * (1.0 - 1e-9):
                    return ClipParams(d, clip, sigma, grid, fp, share)
    return None


def clip_params(epsilon: float, delta: float, d: int, clip: float, integer: bool, joint: int = 1) -> ClipParams:
    """σ and grid of per-user clipping; ConfigError (with computed limits) if δ cannot cover the float part."""
    cp = _clip_fit(epsilon, delta, d, clip, integer, joint)
    if cp is None:
        raise too_many_groups(d, delta, lambda n, dl: _clip_fit(epsilon, dl, n, clip, integer, joint) is not None,
                              epsilon=epsilon)
    if integer and 40.0 * cp.sigma > _EXACT_INTEGERS:
        # a count is released as an integer: noise past 2^53 is not one (past 2^63 it wrapped to -2^63)
        raise ConfigError(f"clip_norm={clip!r} is too large for a count: its noise (sigma {cp.sigma:.3g}) leaves the "
                          "integers a count is released as",
                          hint=f"declare clip_norm at most {shown(clip * _EXACT_INTEGERS / (40.0 * cp.sigma), 3, up=False)} (or omit it)")
    return cp


#: counts are released as integers, exact in a DOUBLE up to 2^53 (40 sigma: never reached in practice)
_EXACT_INTEGERS = 2.0 ** 53


@dataclass
class VectorCalibration:
    plan: ir.QueryPlan
    jp: ir.JoinPlan
    people: PeopleBound
    name: MechanismName
    path: str  #: "clip" | "s4s"
    epsilon: float
    delta: float
    q: float
    max_tuples: int
    parts: list[Part]
    catalog: dict[str, Any]
    d: int | None  #: None: the key set is read from a public table at run time
    clip: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: clipping only: this run is one of ``joint`` runs (several aggregates) composed as one Gaussian vector
    joint: int = 1

    @property
    def part_epsilon(self) -> float:
        return share_of(self.epsilon, len(self.parts))

    @property
    def part_delta(self) -> float:
        return share_of(self.delta, len(self.parts))

    @property
    def integer(self) -> bool:
        return self.jp.kind in (ir.COUNT_STAR, ir.COUNT_COL)


def _d(jp: ir.JoinPlan) -> int | None:
    n = 1
    for k in jp.keys:
        if k.domain is None:
            return None
        n *= len(k.domain)
    return n


def calibrate(request: Request, name: MechanismName) -> VectorCalibration:
    from dpsql.mechanisms.s4s_sql import _private_tables

    plan = request.plan
    assert plan is not None and plan.join is not None and plan.join.keys
    jp = plan.join
    catalog = dict(request.catalog)
    opts = dict(request.options)
    if request.delta <= 0:
        raise ConfigError("GROUP BY over joins is answered under (epsilon, delta)-DP and needs delta > 0",
                          hint="pass delta=1e-7 (for example)")
    people = bound_people(jp, catalog)
    if math.isinf(people.delta):  # pragma: no cover - the analyser refuses unbounded plans
        raise PolicyError("the join tuples per person cannot be bounded from the catalog")
    delta_int = int(people.delta)
    if "max_tuples_per_user" in opts:
        v = opts["max_tuples_per_user"]
        if people.enforced:
            raise PolicyError("max_tuples_per_user applies to an attested Delta; this join's Delta is enforced",
                              hint="omit the max_tuples_per_user option: the enforced Delta is used")
        if v < delta_int:
            raise PolicyError(f"max_tuples_per_user={v} is below Delta={delta_int} that follows from the owner's declarations: "
                              "an attested Delta may be raised, never lowered", hint=f"pass max_tuples_per_user >= {delta_int}")
        delta_int = int(v)
    path = "clip" if name == MechanismName.JOIN_CLIPPED else "s4s"
    if path == "clip" and not people.enforced:
        raise PolicyError("per-user clipping needs one person per join tuple (a single foreign-key chain); this join's "
                          "tuples have several people", hint="omit the mechanism option (DP-S4S answers it)")
    q = float(opts.get("q", DEFAULT_Q if name == MechanismName.DP_S4S_VECTOR else 1.0))
    if path == "clip" and "q" in opts:
        raise ConfigError("per-user clipping does not sample", hint="omit q, or use mechanism='dp_s4s'")
    if name == MechanismName.R2T and q != 1.0:
        raise ConfigError("the unsampled variant does not sample (q = 1)", hint="omit q, or use mechanism='dp_s4s'")
    if "clip_norm" in opts and path != "clip":
        raise ConfigError("clip_norm applies to the per-user clipping path (one person per tuple)", hint="omit clip_norm")
    if path == "s4s" and not people.enforced and q < 1.0:
        denied = [t for t in _private_tables(jp, catalog) if not catalog[t].allow_conditional_sampling]
        if denied:
            raise PolicyError(
                f"q={q!r} samples a join whose Delta is only attested (tuples have several people), and the data owner has "
                f"not allowed that for table(s) {', '.join(repr(t) for t in denied)}",
                hint="use mechanism='r2t' (q = 1, needs no Delta); the data owner may register the tables with "
                     "allow_conditional_sampling=True")
    if path == "s4s" and not people.enforced:  # the plan allows several people per tuple: the cone solver runs
        import importlib.util

        if importlib.util.find_spec("clarabel") is None:
            raise ConfigError("GROUP BY over a join whose tuples have several people needs the cone solver Clarabel, "
                              "which is not installed", hint="pip install 'dpsql[joins]' (or pip install clarabel)")
    parts = parts_of(jp)
    lo, hi = jp.bounds
    default_clip = float(delta_int) * (1.0 if jp.kind != ir.SUM else max(abs(lo), abs(hi), 1e-300))
    clip = float(opts.get("clip_norm", default_clip))
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigError(f"clip_norm must be a positive number, got {opts.get('clip_norm')!r}")
    if path == "clip" and not math.isfinite(float(delta_int) * max(p.scale for p in parts)):
        # a person's group total (at most Delta x max|value|) must be a finite DOUBLE for its norm and clipping
        raise ConfigError("per-user clipping: Delta x max(|lo|, |hi|) exceeds the DOUBLE range", hint="declare narrower bounds")
    if path == "clip" and not (jp.kind == ir.SUM and lo == hi == 0.0) and not clip_in_range(clip, float(delta_int) * max(p.scale for p in parts)):
        raise ConfigError(f"clip_norm={clip!r} is outside the range in which per-user clipping is computed within "
                          f"C(1 + 2^-30): it must be at least {CLIP_MIN!r} and at least 2^-1000 x Delta x max(|lo|, |hi|) "
                          f"= {float(delta_int) * max(p.scale for p in parts) * CLIP_MIN_RATIO!r}",
                          hint="declare a larger clip_norm (or omit it: the default Delta x max|value| clips nothing)")
    if path == "clip":
        parts = [Part("__a0", 1, 1.0, 1)]
    cal = VectorCalibration(plan, jp, people, name, path, request.epsilon, request.delta, q, delta_int, parts, catalog, _d(jp),
                            clip)
    if cal.d is not None:
        _params(cal, cal.d)  # refuse unusable parameters before any charge
    if path == "clip":
        how = "the option clip_norm" if "clip_norm" in opts else f"the default Delta x max|value| = {clip:g} (nothing is clipped)"
        cal.notes.append(f"one person per join tuple: each person's vector of per-group totals is clipped in L2 to C = {clip:g} "
                         f"({how}) inside the engine, then Gaussian noise of scale sigma (public) is added; no sampling")
    else:
        cal.notes.append("the noise scale sigma(S) depends on the data (smooth sensitivity): it is never shown; the "
                         "parameters give public bounds sigma_lo <= sigma(S) <= sigma_cap (the latter except with probability "
                         "p_exceed)")
        if not people.enforced and q < 1.0:
            cal.notes.append(f"Delta={delta_int} is attested by the data owner's declarations (tuples have several people): "
                             "the privacy claim of sampling (q < 1) is conditional on it")
    if len(parts) == 2:
        cal.notes.append("SUM with a negative lower bound: its positive and negative parts are answered separately, each with "
                         "half of the budget, and subtracted")
    if cal.d is None:
        charge = ("the requested (epsilon, delta)" if path == "clip"
                  else "(epsilon_prime, delta): epsilon_prime does not depend on d, and delta is checked for the counted d")
        cal.notes.append("the key set is read from a public table at run time: d, and the parameters that depend on it, "
                         "are computed then (public; the key set is counted before the charge); the charge is " + charge)
    return cal


def _params(cal: VectorCalibration, d: int) -> Any:
    if cal.path == "clip":
        return clip_params(cal.epsilon, cal.delta, d, cal.clip, cal.integer, cal.joint)
    return vector_params(cal.part_epsilon, cal.part_delta, d, cal.q, cal.max_tuples, len(cal.parts))


def _size_formula(cal: VectorCalibration) -> dict[str, Any]:
    """The SOCP's size as a formula of public quantities, evaluated where the owner declared table sizes."""
    from dpsql.plan.joins import _walk

    k = len(cal.jp.slots)
    out: dict[str, Any] = {
        "formula": f"variables <= |S| + |users(S)| <= (1 + {k}) |S|; cones <= |users(S)|; linear rows = |S| + 2 variables; "
                   "E|S| = q |J|, |J| <= rows(t) x (join factor from t) for any input t",
    }
    best = math.inf
    for a, t in cal.jp.inputs:
        rows = cal.catalog[t].max_table_rows
        if rows is None:
            continue
        factor, _, _ = _walk(cal.jp, cal.catalog, a, None)
        best = min(best, rows * factor)
    if math.isfinite(best):
        out["join_tuples_at_most"] = best
        out["expected_sample_at_most"] = cal.q * best
        out["variables_at_most"] = (1 + k) * cal.q * best
    else:
        out["evaluated"] = "not evaluated: the owner declared no max_table_rows for the join's tables"
    return out


def describe(cal: VectorCalibration) -> Description:
    params: dict[str, Any] = {
        "mechanism": cal.name.value,
        "path": "per-user L2 clipping + Gaussian (one person per tuple)" if cal.path == "clip"
        else "DP-S4S vector (Algorithm 5: sampled tuples, SVT over tau, SOCP truncation, smooth-sensitivity Gaussian)",
        "q": cal.q if cal.path == "s4s" else 1.0,
        "Delta": cal.max_tuples,
        "Delta_holds": "enforced" if cal.people.enforced else "attested",
        "Delta_derivation": cal.people.derivation,
        "join": cal.jp.describe(),
        "group_keys": [{"key": k.sql, "kind": k.kind, "values": _key_values(k)} for k in cal.jp.keys],
        "d": cal.d if cal.d is not None else "number of public keys (known at run time)",
        "parts": [{"sign": p.sign, "scale": p.scale} for p in cal.parts],
        "beta": BETA,
    }
    cost = Budget(cal.epsilon, cal.delta)
    if cal.path == "clip":
        params["clip_norm"] = cal.clip
        if cal.d is not None:
            cp = _params(cal, cal.d)
            params.update({"sigma": cp.sigma, "l2_sensitivity": cal.clip * (1 + CLIP_SLACK) * joint_factor(cal.joint),
                           "granularity": cp.grid,
                           "fp_delta": cp.fp_delta, "granularity_cap_sigma": GRID_CAP, "delta_gaussian": cal.delta * (1 - cp.fp_share)})
    else:
        params["budget_split"] = {"svt_epsilon": "epsilon/10 per part", "release_epsilon": "9 epsilon/10 per part",
                                  "per_part": {"epsilon": cal.part_epsilon, "delta": cal.part_delta}}
        params["solver"] = {"program": "SOCP (PMSJA Eq. 2)",
                            "path": "closed form (the plan has one person per tuple)" if cal.people.enforced
                            else "Clarabel at every SVT step (the plan allows several people per tuple)",
                            "certified_gap_allowance": socp.GAP, **_size_formula(cal)}
        if cal.d is not None:
            vp = _params(cal, cal.d)
            params.update({
                "tau_grid": list(vp.taus), "svt_threshold": vp.theta0, "svt_threshold_noise_scale": 2 * KAPPA / vp.eps1,
                "svt_query_noise_scale": 4 * KAPPA / vp.eps1, "alpha": vp.alpha, "rho": vp.rho, "gamma": vp.gamma,
                "eta": vp.eta, "B_cap": vp.b_cap, "p_exceed": vp.p_exceed,
                "sigma_lo": [s / cal.q for s in vp.sigma_lo], "sigma_cap": [s / cal.q for s in vp.sigma_cap],
                "granularity": list(vp.grid), "granularity_cap_sigma_lo": GRID_CAP, "fp_delta": vp.fp_delta,
                "epsilon_lemma_4_2": vp.epsilon_prime * len(cal.parts), "delta_algorithm": vp.delta_alg})
        else:
            params["tau_grid"] = list(vector_taus(cal.max_tuples))
        # ε* depends on (ε, q, Δ) only, never on d: the same charge whether d is declared or read at run time
        params.update({"q_prime": q_prime_of(cal.q, cal.max_tuples), "epsilon_prime": joint_epsilon(cal)})
        cost = Budget(joint_epsilon(cal), cal.delta)
    return Description(label=cal.name.value, cost=cost, parameters=params, notes=tuple(cal.notes))


def joint_epsilon(cal: VectorCalibration) -> float:
    """The charged ε* of the sampled path: all stages and parts on one sample, amplified once (module
    docstring, "Joint accounting"); ≤ cal.epsilon."""
    return s4s_vector_joint_epsilon(cal.epsilon, cal.q, cal.max_tuples)


def _domain(rows: pa.Table, jp: ir.JoinPlan) -> pa.Table:
    if "__tuple" in rows.column_names:
        import pyarrow.compute as pc

        rows = rows.filter(pc.is_null(rows.column("__tuple")))
    return rows.select([k.name for k in jp.keys] + ["__gid"]).sort_by("__gid")


def clipped_totals(rows: pa.Table, clip: float, parts: Sequence[Part]) -> list[tuple[int, int]]:
    """The exact per-group totals of ``clipped_groups``' rows, in ``__gid`` order, as (n, s) with value
    n·2^(−s): the persons' clipped components on the grid 2^(−k) plus the tuples reaching nobody on 2^(−k0)."""
    k, k0 = clip_scale(clip), unowned_scale(parts)
    rows = rows.sort_by("__gid")
    return [dyadic_sum([(int(c), k), (int(z), k0)]) for c, z in zip(rows.column("__c").to_pylist(), rows.column("__z").to_pylist())]


def release(cal: VectorCalibration, rows: pa.Table, rng: NoiseSource) -> Released:
    dom = _domain(rows, cal.jp)
    d = dom.num_rows
    keys = {k.name: dom.column(k.name) for k in cal.jp.keys}
    if d == 0:
        empty = pa.array([], type=pa.int64() if cal.integer else pa.float64())
        return Released(table=pa.table({**keys, "__a0": empty}), accuracy={"__a0": {"mechanism": cal.name.value}})
    if cal.path == "clip":
        cp = clip_params(cal.epsilon, cal.delta, d, cal.clip, cal.integer, cal.joint)
        # the exact totals plus the noise, rounded once (dpsql.noise.add_exactly), then to the public grid
        noisy = round_to_granularity(add_exactly(clipped_totals(rows, cal.clip, parts_of(cal.jp)),
                                                 rng.gaussian_noise(cp.sigma, d)), cp.grid)
        acc: dict[str, Any] = {"mechanism": cal.name.value, "noise": "gaussian", "sigma": cp.sigma, "half_width_95": 1.96 * cp.sigma,
               "note": "per-user L2 clipping to clip_norm + Gaussian noise; " + bias_direction(parts_of(cal.jp), "the clipping, "
               "where a person's vector is longer than clip_norm")}
        total = noisy
    else:
        total = np.zeros(d)
        taus: list[float] = []
        caps: list[float] = []
        stops: list[tuple[float, float]] = []
        acc = {"mechanism": cal.name.value, "noise": "gaussian (smooth sensitivity; its scale is not shown)", "taus": taus,
               "sigma_cap": caps, "note": "half_width_95 covers the noise and rounding only, with probability >= 0.95 for "
               "any data: the interval is around the truncated total of the sampled tuples at the chosen tau, divided "
               "by q (the sampling error and the truncation are not in it); it is wide because the noise scale grows with "
               "the truncation excess E at the SVT's stop, which is not shown (half_width_95_at_sigma_lo: the same at "
               "E = 0). sigma_cap bounds the noise scale except with probability p_exceed (explain); "
               + bias_direction(cal.parts, "the truncation at the chosen tau")}
        import pyarrow.compute as pc

        tup = rows.filter(pc.is_valid(rows.column("__tuple")))
        from dpsql.mechanisms.s4s_sql import _tuples

        for part in cal.parts:
            vp = vector_params(cal.part_epsilon, cal.part_delta, d, cal.q, cal.max_tuples, len(cal.parts))
            w, ti, ui = _tuples(_Slots(cal.jp), tup, part)  # type: ignore[arg-type]
            w = np.clip(w, 0.0, 1.0)
            gid = np.asarray(tup.column("__gid").to_numpy(zero_copy_only=False), dtype=np.int64)
            n_users = int(ui.max()) + 1 if ui.size else 0
            # the closed form or the cone solver: chosen by the plan (public), never by the sample (timing)
            inst = socp.Instance(w, gid, ti, ui, n_users, d, one_person=cal.people.enforced)
            est, tau = _algorithm5(inst, vp, rng)
            total += part.sign * part.scale * est / cal.q
            taus.append(tau)
            caps.append(part.scale * vp.sigma_cap[vp.taus.index(tau)] / cal.q)
            stops.append((part.scale, tau))
        acc["half_width_95"], acc["half_width_95_at_sigma_lo"] = release_half_width(vp, stops, cal.q, cal.integer)
    value = pa.array(np.rint(total).astype(np.int64)) if cal.integer else pa.array(total, type=pa.float64())
    return Released(table=pa.table({**keys, "__a0": value}), accuracy={"__a0": acc})


@dataclass(frozen=True)
class _Slots:
    jp: ir.JoinPlan


def noise_scale(tau: float, excess: float, gamma: float, eta: float) -> float:
    """σ(S) = 2τκ·η·SS(B, γ), B = (E + 1)/κ: Lemma 4.1 applied to F̄/(2τκ) (module docstring)."""
    return 2.0 * tau * KAPPA * eta * s4s_smooth_sensitivity((excess + 1.0) / KAPPA, gamma)[0]


def _algorithm5(inst: socp.Instance, vp: VectorParams, rng: NoiseSource,
                truncate: Callable[[socp.Instance, float], socp.VectorTruncation] | None = None) -> tuple[np.ndarray, float]:
    """Stages 2–3 of Algorithm 5 on the sample (module docstring): the noisy F̃ (before 1/q) and τ.
    ``truncate`` (tests only) replaces the deterministic truncation, e.g. by precomputed outputs."""
    trunc = truncate or socp.truncate
    theta = vp.theta0 + float(rng.laplace(2.0 * KAPPA / vp.eps1, 1)[0])
    chosen = None
    for i, tau in enumerate(vp.taus):
        tr = trunc(inst, tau)
        last = i == len(vp.taus) - 1
        if last or tr.excess + float(rng.laplace(4.0 * KAPPA / vp.eps1, 1)[0]) <= theta:
            chosen = (i, tau, tr)
            break
    assert chosen is not None
    i, tau, tr = chosen
    sigma = noise_scale(tau, tr.excess, vp.gamma, vp.eta)  # data dependent: never reported
    noisy = round_to_granularity(add_exactly(tr.exact, rng.gaussian_noise(sigma, inst.d)), vp.grid[i])
    return noisy, tau


class VectorJoinMechanism:
    """GROUP BY over joins: per-user clipping (one person per tuple) or DP-S4S's vector form."""

    options = frozenset({"q", "max_tuples_per_user", "clip_norm"})

    def __init__(self, name: MechanismName) -> None:
        self.name = name

    name: MechanismName

    def calibrate(self, request: Request, contribution: Caps) -> VectorCalibration:
        return calibrate(request, self.name)

    def describe(self, cal: VectorCalibration) -> Description:
        return describe(cal)

    def bounded(self, cal: VectorCalibration, salt: str, ops: SqlOps) -> exp.Expression:
        if ops.dialect not in JOIN_DIALECTS:  # refused before the charge (the bind check builds this first)
            raise UnsupportedQueryError(
                f"joins run on the DuckDB and Spark engines only: their sampling and truncation are not checked on "
                f"{ops.dialect}", hint="answer the join with a Session on the DuckDB engine (the default)")
        caps = cal.people.caps if cal.people.enforced else ()
        if cal.path == "clip":
            assert cal.people.owner is not None
            return clipped_groups(cal.jp, cal.catalog, cal.people.owner, cal.clip, salt=salt, ops=ops, caps=caps)
        return sampled_groups(cal.jp, cal.catalog, salt=salt, q=cal.q, ops=ops, caps=caps)

    def released_types(self, cal: VectorCalibration) -> dict[str, str]:
        return {"__a0": "BIGINT" if cal.integer else "DOUBLE"}

    def public_key_set(self, cal: VectorCalibration, engine: Any, plan: ir.QueryPlan) -> pa.Table | None:
        """Before the charge, for post-processing's check of the keys (``key_domain`` for a key set read at run time):
        the keys of a set read from public tables or a declared DATE range (the WHERE's conditions on their columns
        applied), when the query's HAVING or QUALIFY (``plan``'s) may drop some or its OFFSET skip some (at most 100 000
        keys; public rows only). With it a HAVING or a QUALIFY on the keys alone that keeps none of them, or an OFFSET
        at or beyond their number, is refused for free, as over a declared domain."""
        if cal.d is not None or (plan.having is None and plan.qualify is None and not plan.offset):
            return None
        sizes = engine.fetch_arrow(key_set_sizes(cal.jp, cal.catalog), what="the public key set")
        if not 0 < math.prod(int(sizes.column(i)[0].as_py()) for i in range(sizes.num_columns)) <= 100_000:
            return None
        keys = engine.fetch_arrow(key_set(cal.jp, cal.catalog), what="the public key set")
        return keys.select([k.name for k in cal.jp.keys])

    def key_domain(self, cal: VectorCalibration) -> pa.Table | None:
        if cal.d is None or cal.d > 100_000:
            return None
        import itertools

        combos = sorted(itertools.product(*[k.domain or () for k in cal.jp.keys]))
        return pa.table({k.name: typed_array([c[i] for c in combos], sql_arrow_type(k.sql_type or ""))
                         for i, k in enumerate(cal.jp.keys)})

    def check_public(self, cal: VectorCalibration, engine: Any) -> None:
        """Before any charge: with a key set read from a public table, count its keys (public rows only)
        and refuse (ConfigError, nothing spent, naming the computed limits) when (epsilon, delta) cannot be
        calibrated for that d; d is the product of the keys' sets, each counted alone (the product is never built
        here). With a key computed by an expression (``derived``), beyond ``MAX_GROUPS`` combinations the query is
        refused (UnsupportedQueryError), as declared domains are at planning; a public table's columns alone are
        bounded by what (epsilon, delta) calibrates. The charge itself, (eps*, delta), does not depend on d (module
        docstring)."""
        if cal.d is not None:
            return
        # each key's set counted alone (the product is never built here): d is their product
        sizes = engine.fetch_arrow(key_set_sizes(cal.jp, cal.catalog), what="the public key set")
        d = math.prod(int(sizes.column(i)[0].as_py()) for i in range(sizes.num_columns))
        if d > MAX_GROUPS and any(k.kind == "derived" for k in cal.jp.keys):
            raise UnsupportedQueryError(
                f"the GROUP BY keys have {d} combinations in their public key sets; a grouped join releases at most "
                f"{MAX_GROUPS} groups", hint="group by fewer or coarser keys, or filter the public table in the WHERE")
        if d == 0:
            # the WHERE's conditions on the keys' columns alone left no public key (a DATE key's range outside its
            # days): the release would have no row whatever the data, as a declared domain the conditions exclude
            raise UnsupportedQueryError(
                "the public key sets of the GROUP BY keys hold no key once the WHERE's conditions on their columns alone "
                "are applied, so the release would have no row whatever the data, and be charged for nothing; nothing "
                "was charged",
                hint="check the conditions against the keys' declared ranges and domains, and the public tables' rows "
                     "(explain lists the keys)")
        _params(cal, d)

    def release(self, cal: VectorCalibration, bounded: pa.Table | None, rng: NoiseSource) -> Released:
        assert bounded is not None
        return release(cal, bounded, rng)


def _key_values(k: ir.JoinKey) -> int | str:
    """How many keys a GROUP BY key's public key set holds, or where they come from (explain)."""
    if k.domain is not None:
        return len(k.domain)
    if k.results is not None:
        return len(k.results)
    if k.value_sets is not None:
        return "the expression over its columns' public values (computed at run time)"
    return "read from the public table"


def route_name(options: dict[str, Any], people: PeopleBound) -> MechanismName:
    """Which mechanism answers a grouped join (public metadata only)."""
    forced = options.get("mechanism", "auto")
    if forced not in ("auto", "dp_s4s", "r2t", "dp_s4s_vector", "clipped_gaussian"):
        raise PolicyError(f"GROUP BY over joins is answered by per-user clipping or DP-S4S, not by mechanism '{forced}'",
                          hint="use mechanism='dp_s4s', 'r2t' (unsampled) or 'clipped_gaussian', or omit the option")
    if forced == "auto":
        if "q" in options:
            return MechanismName.DP_S4S_VECTOR
        # as for scalar joins: an attested Delta defaults to the unsampled variant, whose privacy needs no Delta
        return MechanismName.JOIN_CLIPPED if people.enforced else MechanismName.R2T
    if forced == "r2t":
        return MechanismName.R2T
    if forced == "clipped_gaussian":
        return MechanismName.JOIN_CLIPPED
    return MechanismName.DP_S4S_VECTOR
