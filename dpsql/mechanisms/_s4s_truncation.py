r"""The truncation program of DP-S4S / R2T, solved exactly or with a certified bound.

    f̄(S, τ) = max Σ_t x_t   s.t.  Σ_{t: u⇝t} x_t ≤ τ  for every user u,   0 ≤ x_t ≤ w_t.

What is computed (the function whose sensitivity the mechanisms use)
--------------------------------------------------------------------
Let k(τ) = 30 − max(0, ⌈log₂ τ⌉) and γ = 2^−k(τ) (public: depends on τ only). Every weight is
rounded down to the grid γ (w′_t = γ⌊w_t/γ⌋) and τ likewise (τ′ = γ⌊τ/γ⌋ ≤ τ). The value
returned is f̄(S′, τ′) on the rounded instance S′, where S′ is a per-tuple, data-independent map
of S: removing one user from S removes the same tuples from S′, so f̄(·, τ′) keeps user-level
sensitivity ≤ τ′ ≤ τ. Weights 0 and 1 (counts) are not changed; a weight loses < γ, so
f̄(S′, τ′) ≥ f̄(S, τ) − nγ − m·(τ − τ′) (utility only; n·2⁻³⁰·max(1, τ) is negligible).
The grid makes every capacity an integer multiple of γ, so the max-flow below is exact, and the
sums across tuples and people of the exact paths are sums of integers (in units of γ, each at most
2³⁰) added as integers (``exact_int_sum``: int64 halves, exact below 2³⁶ terms, joined as a Python
integer), in any order. The only rounding is the conversion of the exact total f̄ to a double: one
correct rounding, at most 2⁻⁵³·f̄. The releases allow it: the snapping mechanism takes inputs within
2⁻⁵²·B of the exact statistic and clamps at B (``dpsql.noise`` section 2; f̄ beyond B is clamped either
way, rounding being monotone), and the Gaussian variants charge the sensitivity τ + G with
G = τ·2⁻¹⁰ ≥ 2⁻⁵³·f̄ whenever f̄ ≤ 2⁴³·τ, i.e. always below 2⁴³ sampled tuples (each weighs at most
1). Before, the integers were added as doubles (numpy's pairwise sums, and a difference of two such
sums): exact below 2⁵³γ (2²³ tuples of weight 1 at τ ≤ 1), beyond that off by a few units in the last
place of the total, which G covered in practice but no stated bound did.

Exact reductions (always applied)
---------------------------------
* users whose total weight (load) is ≤ τ′ are dropped: their constraint is implied by x ≤ w;
* tuples touching no remaining (heavy) user are fixed at x_t = w′_t;
* tuples whose heavy owners form the same set enter the same constraints: they merge into one
  variable bounded by the sum of their weights (in particular all tuples whose only heavy owner
  is u merge into one variable y_u, and y_u may be capped at τ′).

Paths (all compute the same f̄(S′, τ′), the LP's up to the slack G charged on every path)
----------------------------------------------------------------------------------------
1. **Closed form** (valid when no variable is shared: every remaining tuple has one heavy owner,
   as in every tuple of a single foreign-key chain): f̄ = fixed + Σ_u min(τ′, y_u). Exact.
2. **Max-flow** (valid when every shared variable has at most two heavy owners, e.g. an edge table
   with both ends as users): the fractional b-matching LP on the multigraph (users = nodes with capacity τ′, merged
   tuples = edges with capacity c_e, private variables = half-edges). Its optimum is half-integral
   in units of γ and equals maxflow/2 on the bipartite double cover: source → u_L (cap τ′),
   u_R → sink (cap τ′), for each edge e = {u, v}: u_L → v_R and v_L → u_R (cap c_e), for each
   private y_u: u_L → sink and source → u_R (cap min(τ′, y_u)). (Flow F gives the feasible point
   x_e = (f(u_L→v_R) + f(v_L→u_R))/2, private x = (f(u_L→sink) + f(source→u_R))/2, whose load at
   u is (out(u_L) + in(u_R))/2 ≤ τ′; an optimum x gives a flow of value 2·Σx by symmetry.)
   Capacities are integers in units of γ, at most 2³⁰ (int32, which scipy's Dinic uses), so the
   max-flow is exact; we still **verify** it: capacity and conservation of the returned flow, and
   a cut of equal capacity (the residual-reachable set), i.e. a certificate of optimality, in
   exact integer arithmetic. A failed verification (never observed) falls through to path 3.
3. **General (any number of heavy owners)**: HiGHS dual simplex (``scipy.optimize.linprog``) on
   the reduced LP, then a **certificate** in floating point with explicit margins: the primal point
   is clipped to [0, c] and every column scaled by min over its rows of min(1, τ′(1 − 2⁻³⁰)/load)
   (feasible, value P ≤ OPT); the row duals y ≥ 0 complete to the dual-feasible
   z_j = max(0, 1 − (Aᵀy)_j + 2⁻³⁰) (value D ≥ OPT, weak duality). If D − P ≤ G(τ) = τ·2⁻¹⁰
   the value P is released. Otherwise the LP is re-solved with tolerances 1e-10, then by the
   interior-point method with crossover. The released P satisfies OPT − G ≤ P ≤ OPT, hence
   |P(S) − P(S ∪ S_u)| ≤ min(τ, |S_u|) + G: **the mechanisms charge the sensitivity τ + G**
   (for every τ and every path, so the charge is public; paths 1–2 have gap 0).

Which path runs is public (timing)
----------------------------------
The closed form takes microseconds to milliseconds, the max-flow milliseconds, the LP up to seconds
(HiGHS's fixed cost alone is a few ms): the path is observable through the run time. The mechanisms
choose it from the **join plan**, never from the sample: ``people`` = the most people one join tuple
can reach under the plan (``PeopleBound.per_tuple`` of ``dpsql.plan.joins``: one per person class of
a slot holding the person, unbounded with a looked-up slot) gives the path of every τ > 0 —
1 → closed form, 2 → max-flow (the LP only after a failed verification, never observed), ≥ 3 → the
certified LP — also when the reduction leaves no heavy user (an empty network or an LP of one
variable of capacity 0 is solved all the same) or only private variables. Choosing by the shape of
what remains (``people=None``, the dispatch before) let one person switch a threshold from the
closed form or the max-flow to the LP (adding a heavy user to tuples of two heavy users), e.g.
0.5 s → 6.1 s CPU at one τ on ``benchmarks/s4s_paths.py``'s synthetic neighbours; with the plan's
path both take the LP. What remains data dependent is the size of the reduced instance (heavy
users, their tuples), like the size of the sample (``docs/threat_model.md``), and the solver's own
run time on it (HiGHS: 7.8 s and 5.4 s on those neighbours: iteration counts vary), and τ = 0
(R2T's f̄(I, 0), public τ) is always the closed form. A sample with more people per tuple than
``people`` allows (impossible under a join plan, whose bound holds on any data; possible for a
caller of the numeric API passing a wrong bound) takes the LP so that the value stays right, and is
counted (``STATS.plan_exceeded``).

If no attempt certifies (never observed on our tests and benchmarks), the best certified-feasible
P is still released: the run's privacy loss then grows by (gap − G)/λ for that candidate — a
graceful degradation rather than a switch, and a *data-independent* fallback value (such as
f̄(S, 0) or a constant) is deliberately NOT used: whether the solver certifies depends on the
data, so switching to a value far from P on one of two neighbouring inputs would break the
sensitivity bound by up to f̄ itself. There is no time limit either: a time-out
would be the same kind of data-dependent switch (the residual is the run time, as for every
mechanism). This residual is the one assumption outside the proof; the module keeps counters
(:data:`STATS`, process-local, never released) so that benchmarks report it.

Measurements (CPU seconds per mechanism call on ca-GrQc, nodes as users, ε = 1, D = 1024; the
code before this module → with the paths chosen from the sample; ``benchmarks/s4s.py`` for the full
table; the plan's paths: docs/mechanisms.md §3.2):

    edges (2 users per tuple, max-flow)   R2T 0.22 → 0.050     DP-S4S q = 1/16 0.13 → 0.005
    2-paths (3 users, certified LP)       R2T 14.5 → 10.7      DP-S4S q = 1/16 1.64 → 0.67
    triangles (3 users, certified LP)     R2T 3.36 → 3.28      DP-S4S q = 1/16 0.41 → 0.16

and on a random instance with 100k tuples, 5000 users, half the tuples with 2 users, unit
weights: 0.17 / 0.18 / 1.10 s → 0.10 / 0.10 / 0.11 s per τ = 1 / 4 / 16. The exact paths replace
the LP outright; on the general path the LP time itself is unchanged (HiGHS's dual simplex; the
primal simplex was 2–7× slower, interior point 2–5× slower, a warm start across the τ grid on the
unreduced LP through HiGHS's own API was not faster than cold reduced solves, and merging tuples
with equal owner sets or sifting columns did not help on the 2-path LPs); the DP-S4S gains there
come from compacting only the sampled pairs and caching the public schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # SciPy's sparse and optimize packages are imported when a join is truncated (slow to import)
    import scipy.sparse as sp

#: relative certified-gap allowance: G(τ) = τ·GAP_FRACTION is added to the sensitivity
GAP_FRACTION = 2.0**-10
#: the int32 cap of scipy's max-flow capacities we stay under
_CAP_BITS = 30
_MARGIN = 2.0**-30
#: HiGHS options of the first attempt
_FIRST_OPTIONS: dict[str, object] = {}


@dataclass
class _Stats:
    """Process-local counters of the paths taken (benchmarks only; never part of a release)."""

    closed_form: int = 0
    max_flow: int = 0
    lp: int = 0
    lp_retries: int = 0
    uncertified: int = 0
    flow_rejected: int = 0
    plan_exceeded: int = 0  #: samples with more people per tuple than the caller's bound (never from a plan)
    max_gap_ratio: float = 0.0  #: largest certified (D − P)/G seen

    def reset(self) -> None:
        for f in ("closed_form", "max_flow", "lp", "lp_retries", "uncertified", "flow_rejected", "plan_exceeded"):
            setattr(self, f, 0)
        self.max_gap_ratio = 0.0


STATS = _Stats()


def gap_bound(tau: float) -> float:
    """G(τ): the certified slack the mechanisms add to the sensitivity τ (public)."""
    return float(tau) * GAP_FRACTION


def grid_exponent(tau: float) -> int:
    """k(τ) = 30 − max(0, ⌈log₂ τ⌉): weights and τ are rounded down to multiples of 2^−k."""
    t = float(tau)
    c = 0 if t <= 1.0 else math.frexp(t)[1] - (1 if math.frexp(t)[0] == 0.5 else 0)
    return _CAP_BITS - max(0, c)


@dataclass(frozen=True)
class Prepared:
    """A sample's incidence, prepared once for every τ of a grid."""

    w: np.ndarray  #: float64 (n,), weights (0 outside the sample)
    ti: np.ndarray  #: int64 (p,), pairs u ⇝ t (unique)
    ui: np.ndarray  #: int64 (p,), users in [0, m)
    n_users: int


def prepare(w: np.ndarray, ti: np.ndarray, ui: np.ndarray, n_users: int) -> Prepared:
    """Sort the pairs by tuple (then user) once; the per-τ work reuses the order."""
    if ti.size:
        o = np.lexsort((ui, ti))
        ti, ui = ti[o], ui[o]
    return Prepared(np.asarray(w, dtype=np.float64), ti, ui, int(n_users))


@dataclass(frozen=True)
class Truncation:
    value: float  #: f̄(S′, τ′) (exact) or the certified primal value P
    path: str  #: "closed_form" | "max_flow" | "lp"
    gap: float  #: certified D − P (0 on the exact paths)


def exact_int_sum(a: np.ndarray) -> int:
    """The exact sum of integers |a_i| < 2^53 (as floats or ints), as a Python integer: each split into
    h·2^26 + l (0 <= l < 2^26), the halves summed in int64 (exact below 2^36 terms), then joined."""
    q = np.asarray(a).astype(np.int64)
    return (int(np.sum(q >> 26)) << 26) + int(np.sum(q & ((1 << 26) - 1)))


def _value(total: int, scale: float) -> float:
    """An exact integer total in units of 1/scale (a power of two) as a double: one correct rounding."""
    return float(total) / scale


#: the path classes, by the most people one join tuple can reach under the plan (public)
CLOSED_FORM, MAX_FLOW, LP = "closed_form", "max_flow", "lp"


def path_class(people: float) -> str:
    """The path a plan whose join tuples reach at most ``people`` people runs at every τ > 0
    (module docstring, "Which path runs is public"): 1 → closed form, 2 → max-flow, ≥ 3 (or
    unbounded, ``math.inf``) → certified LP."""
    if not people >= 1:  # also NaN
        raise ValueError(f"people per tuple must be >= 1, got {people!r}")
    return CLOSED_FORM if people <= 1 else MAX_FLOW if people <= 2 else LP


def truncate(p: Prepared, tau: float, people: float | None = None) -> Truncation:
    """f̄(S′, τ′) as described in the module docstring (τ ≥ 0 finite, validated by the caller).

    ``people``: the most people one join tuple can reach under the join plan (public; ``math.inf``
    when unbounded). It alone picks the path at τ > 0 (:func:`path_class`), whatever the sample holds.
    ``None`` picks the cheapest exact path for the instance at hand instead: a choice made from the
    data, whose run time one user can switch (for callers without a plan, and as a comparison)."""
    k = grid_exponent(tau)
    scale = float(2**k)
    wq = np.floor(p.w * scale)  # integers (as floats, at most 2^30) in units of γ = 2^−k
    tq = math.floor(float(tau) * scale)
    total_q = exact_int_sum(wq)
    ti, ui = p.ti, p.ui
    if tq == 0:  # τ′ = 0 (public): only the tuples no user contributes to (and zero weights) count
        STATS.closed_form += 1
        owned = np.zeros(p.w.size, dtype=bool)
        owned[ti] = True
        return Truncation(_value(exact_int_sum(wq[~owned]), scale), CLOSED_FORM, 0.0)
    cls = None if people is None else path_class(people)
    load = np.bincount(ui, weights=wq[ti], minlength=p.n_users)
    heavy = load > tq
    hp = heavy[ui]
    ti_h, ui_h = ti[hp], ui[hp]  # still sorted by (tuple, user)
    tup, start, cnt = np.unique(ti_h, return_index=True, return_counts=True)
    fixed_q = total_q - exact_int_sum(wq[tup])
    # one signature per tuple: its sorted heavy owners (padded with −1)
    width = int(cnt.max()) if cnt.size else 1
    sig = np.full((tup.size, width), -1, dtype=np.int64)
    for j in range(width):
        has = cnt > j
        sig[has, j] = ui_h[start[has] + j]
    usig, inv = np.unique(sig, axis=0, return_inverse=True)
    cap = np.bincount(inv.reshape(-1), weights=wq[tup], minlength=usig.shape[0])
    cap = np.minimum(cap, float(tq))  # a variable in some constraint ≤ τ′ never exceeds τ′
    owners = (usig >= 0).sum(axis=1)
    most = int(owners.max()) if owners.size else 0  # heavy owners of one variable (data)
    if cls is None:  # the data-chosen dispatch: the cheapest exact path for this instance
        cls = CLOSED_FORM if most <= 1 else MAX_FLOW if most == 2 else LP
    elif (cls == CLOSED_FORM and most > 1) or (cls == MAX_FLOW and most > 2):
        # the sample holds more people per tuple than ``people`` says: a wrong bound (never from a
        # join plan, whose bound holds on any data); the value stays right, through the general path
        STATS.plan_exceeded += 1
        cls = LP
    if cls == CLOSED_FORM:
        # path 1: only private variables (one per heavy user)
        STATS.closed_form += 1
        return Truncation(_value(fixed_q + exact_int_sum(np.minimum(cap, tq)), scale), CLOSED_FORM, 0.0)
    if cls == MAX_FLOW:
        flow = _max_flow(usig, owners, cap, tq)
        if flow is not None:
            STATS.max_flow += 1
            return Truncation(_value(2 * fixed_q + flow, 2.0 * scale), MAX_FLOW, 0.0)
        STATS.flow_rejected += 1
    val_q, gap_q = _certified_lp(usig, owners, cap, tq)
    STATS.lp += 1
    return Truncation(float((Fraction(fixed_q) + Fraction(val_q)) / Fraction(scale)), LP, gap_q / scale)


# ----------------------------------------------------------------------------- path 2
def _max_flow(usig: np.ndarray, owners: np.ndarray, cap: np.ndarray, tq: int) -> int | None:
    """maxflow on the double cover (module docstring), verified; None if the check fails."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import maximum_flow

    if usig.shape[1] < 2:  # no shared variable (the plan's path runs all the same)
        usig = np.hstack([usig, np.full((usig.shape[0], 2 - usig.shape[1]), -1, dtype=np.int64)])
    users, node = np.unique(usig[usig >= 0], return_inverse=True)
    h = users.size
    lab = np.full(usig.shape, -1, dtype=np.int64)
    lab[usig >= 0] = node.reshape(-1)
    src, snk = 2 * h, 2 * h + 1  # u_L = i, u_R = h + i
    pair = owners == 2
    a, b, c2 = lab[pair, 0], lab[pair, 1], cap[pair].astype(np.int64)
    priv = owners == 1
    pu, pc = lab[priv, 0], cap[priv].astype(np.int64)
    ar = np.arange(h, dtype=np.int64)
    tcap = np.full(h, tq, dtype=np.int64)
    rows = np.concatenate([np.full(h, src), h + ar, a, b, pu, np.full(pu.size, src)])
    cols = np.concatenate([ar, np.full(h, snk), h + b, h + a, np.full(pu.size, snk), h + pu])
    caps = np.concatenate([tcap, tcap, c2, c2, pc, pc])
    keep = caps > 0
    rows, cols, caps = rows[keep], cols[keep], caps[keep]
    n_nodes = 2 * h + 2
    g = sp.csr_matrix((caps, (rows, cols)), shape=(n_nodes, n_nodes), dtype=np.int64)
    g.sum_duplicates()
    np.minimum(g.data, tq, out=g.data)  # parallel arcs merged: still ≤ τ′ of their endpoint
    # an empty network (nobody heavy) is solved and verified too: the path's cost does not depend on it
    if g.nnz and int(g.data.max()) >= 2**31:  # pragma: no cover - k(τ) keeps every capacity ≤ 2^30
        return None
    res = maximum_flow(g.astype(np.int32), src, snk, method="dinic")
    return _verify_flow(g, res.flow, src, snk)


def _verify_flow(g: sp.csr_matrix, flow: object, src: int, snk: int) -> int | None:
    """Exact check that ``flow`` is a maximum flow of ``g``; returns its value or None."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import breadth_first_order

    f = sp.csr_matrix(flow, dtype=np.int64)
    n = g.shape[0]
    # the antisymmetric flow matrix: positive part on arcs of g, capacities respected
    fp = f.multiply(f > 0).tocsr()
    fp.eliminate_zeros()
    diff = (g - fp).tocsr()
    if diff.nnz and int(diff.data.min()) < 0:  # flow above capacity or on a non-arc
        return None
    out_f = np.asarray(fp.sum(axis=1)).reshape(-1)
    in_f = np.asarray(fp.sum(axis=0)).reshape(-1)
    net = out_f - in_f
    inner = np.ones(n, dtype=bool)
    inner[[src, snk]] = False
    if np.any(net[inner] != 0):
        return None
    value = int(net[src])
    # residual graph: forward arcs with spare capacity, backward arcs carrying flow
    res_fwd = diff.copy()
    res_fwd.data = (res_fwd.data > 0).astype(np.int8)
    res_fwd.eliminate_zeros()
    res_back = fp.T.tocsr()
    res_back.data = (res_back.data > 0).astype(np.int8)
    resid = (res_fwd + res_back).tocsr()
    reach = np.zeros(n, dtype=bool)
    reach[breadth_first_order(resid, src, directed=True, return_predecessors=False)] = True
    if reach[snk]:
        return None
    gc = g.tocoo()
    cut = int(gc.data[reach[gc.row] & ~reach[gc.col]].sum())
    if cut != value:
        return None
    return value


# ----------------------------------------------------------------------------- path 3
def _certified_lp(usig: np.ndarray, owners: np.ndarray, cap: np.ndarray, tq: int) -> tuple[float, float]:
    """(P, D − P) of the reduced LP, in units of γ; P feasible, D dual feasible (docstring)."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    if cap.size == 0:  # nothing left to truncate: one user and one variable of capacity 0 (value 0), so that
        # the solver and the certificate run all the same (the path's fixed cost does not depend on the data)
        usig, cap = np.zeros((1, 1), dtype=np.int64), np.zeros(1)
    users, node = np.unique(usig[usig >= 0], return_inverse=True)
    h = users.size
    var, _ = np.nonzero(usig >= 0)  # row-major, the same order as usig[usig >= 0]
    a = sp.csr_matrix((np.ones(var.size), (node.reshape(-1), var)), shape=(h, usig.shape[0]))
    g_q = tq * GAP_FRACTION
    best_p, best_gap = 0.0, math.inf
    attempts: list[tuple[str, dict[str, object]]] = [
        ("highs-ds", dict(_FIRST_OPTIONS)),
        ("highs-ds", {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}),
        ("highs-ipm", {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}),
    ]
    for n_try, (method, opts) in enumerate(attempts):
        if n_try:
            STATS.lp_retries += 1
        res = linprog(
            -np.ones(cap.size),
            A_ub=a,
            b_ub=np.full(h, float(tq)),
            bounds=np.column_stack([np.zeros(cap.size), cap]),
            method=method,
            options=opts,
        )
        x = getattr(res, "x", None)
        marg = getattr(getattr(res, "ineqlin", None), "marginals", None)
        if x is None or marg is None:
            continue
        p_val, d_val = _certificate(a, cap, float(tq), np.asarray(x, float), -np.asarray(marg, float))
        gap = max(0.0, d_val - p_val)
        if p_val > best_p or (p_val == best_p and gap < best_gap):
            best_p, best_gap = p_val, gap
        if gap <= g_q:
            STATS.max_gap_ratio = max(STATS.max_gap_ratio, gap / g_q if g_q > 0 else 0.0)
            return p_val, gap
    STATS.uncertified += 1
    if best_p == 0.0 and best_gap == math.inf:
        best_p = _greedy(a, cap, float(tq))
    return best_p, best_gap


def _certificate(a: sp.csr_matrix, cap: np.ndarray, tau: float, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(P, D): a repaired feasible primal value and a dual-feasible upper bound."""
    x = np.clip(x, 0.0, cap)
    load = a @ x
    limit = tau * (1.0 - _MARGIN)
    s = np.ones(load.size)
    over = load > limit
    s[over] = limit / load[over]
    col_scale = np.ones(cap.size)
    ac = a.tocoo()
    np.minimum.at(col_scale, ac.col, s[ac.row])
    x = x * col_scale
    p_val = math.fsum(x.tolist())
    y = np.maximum(y, 0.0)
    cover = a.T @ y
    z = np.maximum(0.0, 1.0 - cover + _MARGIN)
    d_val = math.fsum((tau * y).tolist()) + math.fsum((cap * z).tolist())
    d_val *= 1.0 + _MARGIN
    return p_val, d_val


def _greedy(a: sp.csr_matrix, cap: np.ndarray, tau: float) -> float:
    """A feasible point without any solver: x = c scaled by its rows' min(1, τ/load)."""
    p, _ = _certificate(a, cap, tau, cap.copy(), np.zeros(a.shape[0]))
    return p
