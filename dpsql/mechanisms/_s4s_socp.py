r"""The truncation program of DP-S4S's vector form (PMSJA's QCQP, Eq. 2), as a second-order-cone program.

    max Σ_u y_u  s.t.  ‖(Σ_{t∈T_f: u⇝t} w_t z_t)_f‖₂ ≤ τ  ∀u,   Σ_{u⇝t} y_u − z_t ≤ |U_t| − 1  ∀t,
                       0 ≤ y, z ≤ 1;     F̄_f = Σ_{t∈T_f} w_t z_t,   E = Σ_u (1 − y_u).

Each user's quadratic constraint is a second-order cone (τ, A_u z) ∈ SOC, so the QCQP is an SOCP,
solved by Clarabel (an interior-point conic solver, Apache-2.0, maintained by the Oxford control
group, with its own Python package; chosen over cvxpy+ECOS/SCS for a direct sparse interface and
primal and dual solutions that we certify ourselves).

Exact reductions (applied first)
--------------------------------
* a user whose whole vector has norm ≤ τ ("light") satisfies its cone for every z ∈ [0, 1]
  (weights ≥ 0): its cone is dropped;
* a tuple with no heavy owner has z_t = 1 at an optimum (z_t appears only as −z_t on the left of
  ≤ rows and in no remaining cone); a user all of whose tuples are such has y_u = 1;
* tuples with the same owners and the same group enter the same rows with their weights summed:
  one variable with the summed weight (their weighted mean of z is feasible and keeps the objective);
* when the join plan guarantees one person per tuple (``Instance.one_person``, public: a single
  foreign-key chain to one person class) the program separates per user: y_u = min(1, τ/‖v_u‖),
  z = y_u on u's tuples (closed form, no solver): F̄ is the sum of the users' vectors scaled into
  the τ-ball, i.e. per-user L2 clipping. F̄ is summed exactly (below), so that it does not depend on
  the order of the sampled rows (which differs between runs and engines) in any bit.

Exact sums
----------
F̄_g sums, over people (and tuples reaching nobody), values that are not on a common grid (y_u·load,
w·z). A floating-point sum of them rounds at the last place of the running total, an error growing
with the number of summands that no sensitivity bound allows for. Instead (:func:`grid_values`) each
summand — a person's clipped load y_u·load_ug (at most τ(1 + 2⁻³⁰)), a merged variable's w·z (at most
its user's load in that group, ≤ τ after the repair), a tuple reaching nobody or fixed at z = 1 (a
weight ≤ 1 ≤ τ) — is truncated toward zero onto the grid 2^(−k), k = ``fixed_point_scale(τ)``
(τ·2^k ∈ [2⁵¹, 2⁵²): every summand times 2^k is an integer below 2⁵³), and the integers are added
exactly (:func:`_group_int_sums`). The exact totals go to the release, which adds the noise with one
rounding (``dpsql.noise.add_exactly``). Truncation toward zero never enlarges a summand: on the closed
form, removing a person moves F̄ by exactly their grid vector, of norm ≤ τ(1 + 2⁻³⁰) (within the
sensitivity 2τκ(E + 1) ≥ 2τ used); on the cone path the grid values are w·z̃ with z̃ ≤ z, so every cone
still holds, and the repair checks every linking row at z̃ (not z, which is up to 2^(−k)/w larger), lowering
y where it must: the released point (y, z̃) is feasible, and E is taken from that y. Weights on the 2⁻²⁰ grid are
whole multiples of 2^(−k) for τ < 2³², so sums of unclipped weights are unchanged.

Which path runs is public (timing)
----------------------------------
The closed form takes microseconds, the cone solver milliseconds to seconds, so the choice between
them is observable through the run time. It is made from ``Instance.one_person`` alone, which the
mechanism sets from the join plan (``PeopleBound.enforced``), never from the sample: when the plan
allows several people per tuple, every call hands the reduced program to Clarabel — also when the
sampled tuples happen to have one person each, and also when no user is heavy (an empty program).
What remains data dependent is the program's size (heavy users, their tuples), like the sample's
size (``docs/threat_model.md``). With ``one_person`` set, a tuple with two owners is an internal
error (the plan excludes it), never a silent switch.

Certificate (general path)
--------------------------
Clarabel solves min c'x s.t. Ax + s = b, s ∈ K. From its dual z we take z̃ = Π_{K*}(z) (negative
parts of the orthant rows set to 0; a cone's head raised to the norm of its tail, which changes
only b'z̃ since the head rows of A are zero) and r = c + Aᵀz̃. For every feasible x ∈ [0, 1]ⁿ,
c'x ≥ r'x − b'z̃ ≥ Σ min(0, r_i) − b'z̃, so D = b'z̃ − Σ min(0, r_i) bounds max Σ y from above.
The primal point is repaired into feasibility (clip to [0, 1]; z on the tuples of a user whose
cone is violated scaled by τ(1 − 2⁻⁴⁰)/‖A_u z‖; then every y on a violated linking row lowered
by the violation), giving P ≤ OPT. We release F̄ and E_P = Σ(1 − y) of the repaired point, and
the certified gap g = D − P: OPT is within g of P, so E_P ∈ [E*, E* + g]. A run is *certified*
when g ≤ GAP (public; the mechanism adds it to the sensitivity of B: ``s4s_vector``). Otherwise
the solve is repeated with tighter tolerances; if still uncertified the repaired point is used
and counted in :data:`STATS` (never observed in our tests and benchmarks) — as in
``_s4s_truncation``, no switch to a far-away data-independent value is made, since whether the
solver certifies depends on the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.rewrite.bound import fixed_point_scale

#: certified-gap allowance, in users (added to the sensitivity of B = E + 1 by the mechanism)
GAP = 1e-3
_MARGIN = 2.0**-40


@dataclass
class _Stats:
    """Process-local counters (benchmarks only; never part of a release)."""

    closed_form: int = 0
    socp: int = 0
    retries: int = 0
    uncertified: int = 0
    max_vars: int = 0
    max_cones: int = 0

    def reset(self) -> None:
        for f in ("closed_form", "socp", "retries", "uncertified", "max_vars", "max_cones"):
            setattr(self, f, 0)


STATS = _Stats()


@dataclass(frozen=True)
class Instance:
    """A sample: weights w ∈ [0, 1] (n,), group index gid (n,) in [0, d), pairs (ti, ui)."""

    w: np.ndarray
    gid: np.ndarray
    ti: np.ndarray
    ui: np.ndarray
    n_users: int
    d: int
    #: public (from the join plan): every tuple has at most one person, so the closed form applies
    one_person: bool = False


@dataclass(frozen=True)
class VectorTruncation:
    values: np.ndarray  #: F̄ (d,), each the correctly rounded ``exact`` value
    excess: float  #: E_P = Σ_u (1 − y_u) of the released point
    gap: float  #: certified D − P (0 on the exact paths)
    path: str  #: "closed_form" | "socp" (fixed by ``Instance.one_person``)
    #: F̄ exactly: per group (n, k), the value n·2^(−k) (module docstring, "Exact sums")
    exact: tuple[tuple[int, int], ...] = ()


_SPLIT = 26


def _group_int_sums(gid: np.ndarray, q: np.ndarray, d: int) -> list[int]:
    """Σ q over each group (q: int64, |q| < 2^53) as Python integers, exactly: each q is split into
    q = h·2^26 + l (0 <= l < 2^26, |h| <= 2^27) and the halves summed in int64 (exact below 2^36 terms
    per group), then joined without bound."""
    out = [0] * d
    if gid.size == 0:
        return out
    o = np.argsort(gid, kind="stable")
    gs, qs = gid[o], q[o]
    starts = np.flatnonzero(np.concatenate([[True], gs[1:] != gs[:-1]]))
    hs = np.add.reduceat(qs >> _SPLIT, starts)
    ls = np.add.reduceat(qs & ((1 << _SPLIT) - 1), starts)
    for g, h, lo in zip(gs[starts].tolist(), hs.tolist(), ls.tolist()):
        out[g] = (h << _SPLIT) + lo
    return out


def grid_values(pieces: list[tuple[np.ndarray, np.ndarray]], d: int, tau: float) -> tuple[np.ndarray, tuple[tuple[int, int], ...]]:
    """F̄ from its summands (group index, value >= 0) (module docstring, "Exact sums"): each value
    truncated toward zero onto the grid 2^(−k), k = ``fixed_point_scale(τ)``, summed exactly per group;
    the exact totals and their correctly rounded doubles."""
    k = fixed_point_scale(float(tau))
    gid = np.concatenate([np.asarray(g, dtype=np.int64) for g, _ in pieces]) if pieces else np.zeros(0, dtype=np.int64)
    v = np.concatenate([np.asarray(x, dtype=np.float64) for _, x in pieces]) if pieces else np.zeros(0)
    q = np.trunc(v * 2.0**k).astype(np.int64)  # below 2^53: every summand is at most τ(1 + 2^-30), or a weight <= 1 <= τ
    sums = _group_int_sums(gid, q, d)
    exact = tuple((n, k) for n in sums)
    return np.array([n / (1 << k) if k >= 0 else float(n << -k) for n in sums], dtype=np.float64), exact


def truncate(inst: Instance, tau: float) -> VectorTruncation:
    """F̄, E of the program at τ > 0 (module docstring). The path is ``inst.one_person`` (public)."""
    w, gid, ti, ui, d = inst.w, inst.gid, inst.ti, inst.ui, inst.d
    # per (user, group) loads and per-user norms
    key = ui.astype(np.int64) * d + gid[ti]
    uk, inv = np.unique(key, return_inverse=True)
    load = np.bincount(inv.reshape(-1), weights=w[ti])
    norm = np.sqrt(np.bincount(uk // d, weights=load * load, minlength=inst.n_users))
    heavy = norm > tau
    if inst.one_person:
        if ti.size and int(np.bincount(ti).max()) > 1:
            raise RuntimeError("internal error: a join tuple has several people on a plan with one person per tuple")
        # closed form y_u = min(1, τ/‖v_u‖) for every user (1 for light users)
        STATS.closed_form += 1
        y = np.where(heavy, tau / np.where(heavy, norm, 1.0), 1.0)
        owned = np.zeros(w.size, dtype=bool)
        owned[ti] = True
        # F̄_g = Σ_u y_u·load_ug summed per (user, group) in key order (load is exact in any order: weights on the
        # 2^-20 grid), so F̄ is a function of the sample alone. Σ_t w_t·y_u in row order changed its last bits with
        # the order the engine returned the tuples in (threads; DuckDB vs Spark): a zero-noise release on a
        # rounding tie then went either way
        vals, exact = grid_values([(gid[~owned], w[~owned]), (uk % d, load * y[uk // d])], d, tau)
        return VectorTruncation(vals, float(np.sum(1.0 - y[heavy])), 0.0, "closed_form", exact)
    active_t = np.zeros(w.size, dtype=bool)
    active_t[ti[heavy[ui]]] = True
    sel = active_t[ti]
    fixed = (gid[~active_t], w[~active_t])
    return _socp(w, gid, ti[sel], ui[sel], heavy, fixed, tau, d)


def _socp(w: np.ndarray, gid: np.ndarray, ti: np.ndarray, ui: np.ndarray, heavy: np.ndarray,
          fixed: tuple[np.ndarray, np.ndarray], tau: float, d: int) -> VectorTruncation:
    import clarabel

    if ti.size == 0:  # no heavy user: the empty program, still handed to the solver (module docstring)
        st = clarabel.DefaultSettings()
        st.verbose = False
        STATS.socp += 1
        clarabel.DefaultSolver(sp.csc_matrix((0, 0)), np.zeros(0), sp.csc_matrix((0, 0)), np.zeros(0), [], st).solve()
        vals, exact = grid_values([fixed], d, tau)
        return VectorTruncation(vals, 0.0, 0.0, "socp", exact)
    # merge tuples by (sorted owner set, group)
    o = np.lexsort((ui, ti))
    ti, ui = ti[o], ui[o]
    tup, start, cnt = np.unique(ti, return_index=True, return_counts=True)
    width = int(cnt.max())
    sig = np.full((tup.size, width + 1), -1, dtype=np.int64)
    sig[:, 0] = gid[tup]
    for j in range(width):
        has = cnt > j
        sig[has, j + 1] = ui[start[has] + j]
    usig, vinv = np.unique(sig, axis=0, return_inverse=True)
    vinv = vinv.reshape(-1)
    wv = np.bincount(vinv, weights=w[tup], minlength=usig.shape[0])
    nv = usig.shape[0]
    users, uidx = np.unique(usig[:, 1:][usig[:, 1:] >= 0], return_inverse=True)
    nu = users.size
    vrow, vcol = np.nonzero(usig[:, 1:] >= 0)  # (var, slot) in row-major order, matching uidx
    var_u = uidx.reshape(-1)
    n_own = (usig[:, 1:] >= 0).sum(axis=1)
    hv = heavy[users]
    n = nu + nv  # x = [y (nu), z (nv)]
    # rows: linking (nv), y ≤ 1 (nu), −y ≤ 0 (nu), z ≤ 1 (nv), −z ≤ 0 (nv), then one cone per heavy user
    link = sp.csr_matrix((np.concatenate([np.ones(vrow.size), -np.ones(nv)]),
                          (np.concatenate([vrow, np.arange(nv)]), np.concatenate([var_u, nu + np.arange(nv)]))), shape=(nv, n))
    eye = sp.identity(n, format="csr")
    blocks = [link, eye[:nu], -eye[:nu], eye[nu:], -eye[nu:]]
    b = [n_own - 1.0, np.ones(nu), np.zeros(nu), np.ones(nv), np.zeros(nv)]
    n_lin = 2 * n + nv
    # cones: per heavy user u, rows (τ; −Σ_{j∈u,g} W_j z_j for each group g of u)
    hu = np.nonzero(hv)[0]
    mem = hv[var_u]
    cu, cv = var_u[mem], vrow[mem]  # (user, var) memberships of heavy users
    cg = usig[cv, 0]
    ug_key = cu * d + cg
    ugs, ug_inv = np.unique(ug_key, return_inverse=True)
    ug_user = ugs // d
    # row index of each (user, group): heads first per user
    order_users = {int(u): k for k, u in enumerate(hu)}
    per_user = np.bincount(np.array([order_users[int(u)] for u in ug_user], dtype=np.int64), minlength=hu.size)
    head = np.concatenate([[0], np.cumsum(per_user + 1)[:-1]])
    rank_in_user = np.arange(ugs.size) - np.repeat(np.concatenate([[0], np.cumsum(per_user)[:-1]]), per_user)
    ug_row = head[np.array([order_users[int(u)] for u in ug_user], dtype=np.int64)] + 1 + rank_in_user
    n_cone = int((per_user + 1).sum())
    cone_a = sp.csr_matrix((-wv[cv], (ug_row[ug_inv.reshape(-1)], nu + cv)), shape=(n_cone, n))
    cone_b = np.zeros(n_cone)
    cone_b[head] = tau
    a_mat = sp.vstack(blocks + [cone_a]).tocsc()
    b_vec = np.concatenate(b + [cone_b])
    c = np.concatenate([-np.ones(nu), np.zeros(nv)])
    cones = [clarabel.NonnegativeConeT(n_lin)] + [clarabel.SecondOrderConeT(int(k) + 1) for k in per_user]
    STATS.socp += 1
    STATS.max_vars = max(STATS.max_vars, n)
    STATS.max_cones = max(STATS.max_cones, hu.size)
    p_mat = sp.csc_matrix((n, n))
    best: tuple[float, float, np.ndarray, np.ndarray] | None = None
    for attempt in range(2):
        st = clarabel.DefaultSettings()
        st.verbose = False
        if attempt:
            STATS.retries += 1
            st.tol_gap_abs = st.tol_gap_rel = 1e-11
            st.tol_feas = 1e-11
            st.max_iter = 400
        sol = clarabel.DefaultSolver(p_mat, c, a_mat, b_vec, cones, st).solve()
        x = np.asarray(sol.x, dtype=np.float64)
        zd = np.asarray(sol.z, dtype=np.float64)
        if x.size != n or not np.all(np.isfinite(x)):
            continue
        y, zv = _repair(x[:nu].copy(), x[nu:].copy(), wv, var_u, vrow, n_own, hv, cu, cv, ug_row, ug_inv, n_cone, head, tau)
        p_val = math.fsum(y.tolist())
        d_val = _dual_bound(a_mat, b_vec, c, zd, n_lin, head, per_user) if np.all(np.isfinite(zd)) else math.inf
        gap = max(0.0, d_val - p_val)
        if best is None or gap < best[1]:
            best = (p_val, gap, y, zv)
        if gap <= GAP:
            break
    if best is None or best[1] > GAP:
        STATS.uncertified += 1
    if best is None:  # pragma: no cover - Clarabel always returns a point
        y = np.zeros(nu)
        zv = _scaled_point(wv, cu, cv, ug_row, ug_inv, n_cone, head, tau, nv)
        best = (0.0, math.inf, y, zv)
    p_val, gap, y, zv = best
    vals, exact = grid_values([fixed, (usig[:, 0], wv * zv)], d, tau)
    return VectorTruncation(vals, float(nu - p_val), float(gap), "socp", exact)


def _cone_norms(zv: np.ndarray, wv: np.ndarray, cv: np.ndarray, ug_row: np.ndarray, ug_inv: np.ndarray, n_cone: int,
                head: np.ndarray) -> np.ndarray:
    """‖A_u z‖ per heavy user (in the order of ``head``)."""
    rows = np.bincount(ug_row[ug_inv.reshape(-1)], weights=wv[cv] * zv[cv], minlength=n_cone)
    sq = rows * rows
    sq[head] = 0.0
    ends = np.concatenate([head[1:], [n_cone]])
    csum = np.concatenate([[0.0], np.cumsum(sq)])
    return np.sqrt(np.maximum(0.0, csum[ends] - csum[head]))


def _repair(y: np.ndarray, zv: np.ndarray, wv: np.ndarray, var_u: np.ndarray, vrow: np.ndarray, n_own: np.ndarray,
            hv: np.ndarray, cu: np.ndarray, cv: np.ndarray, ug_row: np.ndarray, ug_inv: np.ndarray, n_cone: int,
            head: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    y = np.clip(y, 0.0, 1.0)
    zv = np.clip(zv, 0.0, 1.0)
    norms = _cone_norms(zv, wv, cv, ug_row, ug_inv, n_cone, head)
    limit = tau * (1.0 - _MARGIN)
    scale_u = np.where(norms > limit, limit / np.where(norms > 0, norms, 1.0), 1.0)
    # heavy users in the order of head: map membership user -> its position
    hu = np.nonzero(hv)[0]
    pos = np.full(hv.size, -1, dtype=np.int64)
    pos[hu] = np.arange(hu.size)
    fac = np.ones(zv.size)
    np.minimum.at(fac, cv, scale_u[pos[cu]])
    zv = zv * fac
    # linking rows: Σ_{u∈U_j} y_u − z_j ≤ |U_j| − 1; lower every y of a violated row by its violation.
    # Checked at the z the release carries: w·z truncated onto the grid 2^-k (:func:`grid_values`), below
    # z by up to 2^-k/w (≈ 3e-7 at τ = 1000 and the least weight 2^-20, far above the margin); the
    # division by w rounds once (relative 2^-53), inside the margin
    k = fixed_point_scale(float(tau))
    with np.errstate(divide="ignore", invalid="ignore"):
        carried = np.where(wv > 0, np.trunc(wv * zv * 2.0**k) / 2.0**k / wv, zv)
    lhs = np.bincount(vrow, weights=y[var_u], minlength=zv.size) - np.minimum(zv, carried) - (n_own - 1.0)
    viol = np.maximum(0.0, lhs + 4.0 * _MARGIN * n_own)
    if viol.any():
        low = np.zeros(y.size)
        np.maximum.at(low, var_u, viol[vrow])
        y = np.maximum(0.0, y - low)
    return y, zv


def _dual_bound(a_mat: sp.csc_matrix, b: np.ndarray, c: np.ndarray, z: np.ndarray, n_lin: int, head: np.ndarray,
                per_user: np.ndarray) -> float:
    """D ≥ max Σ y from a projected dual point (module docstring)."""
    z = z.copy()
    z[:n_lin] = np.maximum(z[:n_lin], 0.0)
    off = n_lin
    tails = z[off:]
    sq = tails * tails
    sq[head] = 0.0
    ends = np.concatenate([head[1:], [tails.size]])
    csum = np.concatenate([[0.0], np.cumsum(sq)])
    tnorm = np.sqrt(np.maximum(0.0, csum[ends] - csum[head]))
    tails[head] = np.maximum(tails[head], tnorm * (1.0 + _MARGIN))
    z[off:] = tails
    r = c + a_mat.T @ z
    val = math.fsum((b * z).tolist()) - math.fsum(np.minimum(0.0, r).tolist())
    return val * (1.0 + 1e-12) + 1e-12


def _scaled_point(wv: np.ndarray, cu: np.ndarray, cv: np.ndarray, ug_row: np.ndarray, ug_inv: np.ndarray, n_cone: int,
                  head: np.ndarray, tau: float, nv: int) -> np.ndarray:  # pragma: no cover - see _socp
    zv = np.ones(nv)
    norms = _cone_norms(zv, wv, cv, ug_row, ug_inv, n_cone, head)
    s = np.where(norms > tau, tau / np.where(norms > 0, norms, 1.0), 1.0)
    fac = np.ones(nv)
    users = np.unique(cu)
    pos = {int(u): k for k, u in enumerate(users)}
    np.minimum.at(fac, cv, s[np.array([pos[int(u)] for u in cu], dtype=np.int64)])
    return zv * fac
