"""GROUP BY over a join with per-user L2 clipping (``dpsql.rewrite.join_groups.clipped_groups``) sums
the persons' clipped components exactly: each truncated toward zero onto the grid 2^-k (C * 2^k in
[2^51, 2^52)), the tuples reaching nobody on their own grid 2^-k0 (M * 2^k0 in [2^51, 2^52)), both
added as integers (HUGEINT on DuckDB), returned as exact integer text and only rounded together with
the noise (``dpsql.noise.add_exactly``). A floating-point SUM across persons rounds at the running
total's last place, which a large total (e.g. tuples reaching nobody) makes far coarser than the
2^-30 * C the clipped Gaussian's calibration allows.

The data are adversarial: persons whose vector is clipped to a component near C and one near
C * 2^-32 (one huge group, one tiny), persons far below C, persons just around C, mixed signs, and
tuples reaching nobody with the largest declared value. The expected totals replay the engine's
per-person arithmetic in Python (IEEE doubles: the same bits) and add in exact rationals."""

from __future__ import annotations

import math
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.mechanisms import _s4s_socp as socp
from dpsql.mechanisms.s4s_vector import CLIP_SLACK, clipped_totals
from dpsql.noise import add_exactly
from dpsql.plan.analyze import analyze
from dpsql.plan.joins import bound_people
from dpsql.rewrite.bound import fixed_point_scale
from dpsql.rewrite.join_groups import clip_scale, clipped_groups, unowned_scale
from dpsql.rewrite.joins import SUM_UNITS, parts_of

SQL = "SELECT n.n_name, SUM(o.o_price) FROM orders o JOIN nation n ON o.o_nationkey = n.n_nationkey GROUP BY n.n_name"
HUGE_ORDERS = 4096
DELTA = HUGE_ORDERS + 1
CLIP = 0.75  # not a power of two: C / norm has a full mantissa


def adversarial(hi: float, seed: int = 5) -> pa.Table:
    """orders (o_custkey, o_nationkey, o_price) on the bounds [-hi, hi]; NULL o_custkey reaches nobody."""
    g = np.random.default_rng(seed)
    unit = hi / SUM_UNITS  # the join weights' grid
    cust: list[int | None] = []
    nat: list[int] = []
    price: list[float] = []

    def add(c: int | None, n: int, p: float) -> None:
        cust.append(c)
        nat.append(n)
        price.append(p)

    c = 0
    for i in range(40):  # clipped to ~C in one group and ~C * 2^-32 in another, either sign
        sign = 1.0 if i % 3 else -1.0
        for _ in range(HUGE_ORDERS):
            add(c, i % 3, sign * hi)
        add(c, (i + 1) % 3, -sign * unit * (1 + i % 5))
        c += 1
    for _ in range(3000):  # single small orders, mixed signs (far below C when hi is small)
        add(c, int(g.integers(0, 3)), float(g.choice([-1.0, 1.0])) * unit * float(g.integers(1, 64)))
        c += 1
    for _ in range(200):  # two groups whose norm is around C (just below, at, just above) when hi = 1
        a = round(CLIP * 0.6 * SUM_UNITS) + int(g.integers(-3, 4))
        b = round(CLIP * 0.8 * SUM_UNITS) + int(g.integers(-3, 4))
        add(c, 0, a * unit)
        add(c, 1, -b * unit)
        c += 1
    for _ in range(30):  # tuples reaching nobody: the largest value, in one group
        add(None, 1, hi)
    return pa.table({"o_custkey": pa.array(cust, pa.int64()), "o_nationkey": pa.array(nat, pa.int64()),
                     "o_price": pa.array(price, pa.float64())})


def session(orders: pa.Table, hi: float) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1000.0, 1e-3))
    n_cust = int(np.nanmax(orders.column("o_custkey").to_numpy(zero_copy_only=False).astype(float))) + 1
    s.register("nation", pa.table({"n_nationkey": np.arange(3), "n_name": ["A", "B", "C"]}), public=True)
    s.register("customer", pa.table({"c_custkey": np.arange(n_cust)}), privacy_unit="c_custkey")
    s.register("orders", orders, references={"o_custkey": "customer.c_custkey", "o_nationkey": "nation.n_nationkey"},
               degree_bounds={"o_custkey": DELTA}, columns={"o_price": {"bounds": (-hi, hi)}})
    return s


def bounded(s: dpsql.Session, clip: float) -> tuple[pa.Table, list]:
    plan = analyze(SQL, dict(s.tables))
    jp, pb = plan.join, bound_people(plan.join, dict(s.tables))
    assert pb.enforced and pb.owner is not None
    rows = s._engine.fetch_arrow(clipped_groups(jp, dict(s.tables), pb.owner, clip, salt="k", ops=s._engine.ops, caps=pb.caps))
    return rows.sort_by("__gid"), parts_of(jp)


def replay(orders: pa.Table, hi: float, clip: float) -> tuple[list[int], list[int], list[list[float]], int]:
    """Per group (n_name order = nationkey order): Σ trunc(clipped * 2^k), Σ trunc(unowned * 2^k0) as the
    engine defines them; also every person's clipped DOUBLE components (for the controls) and the persons."""
    parts = [(1, hi), (-1, hi)]  # (sign, scale) of the positive and the negative part
    lits = [sg * sc / SUM_UNITS for sg, sc in parts]
    k, k0 = fixed_point_scale(clip), fixed_point_scale(hi)
    w: dict[tuple[int | None, int], list[int]] = defaultdict(lambda: [0, 0])
    unowned = [0, 0, 0]
    for cu, na, p in zip(*(orders.column(n).to_pylist() for n in ("o_custkey", "o_nationkey", "o_price"))):
        x = min(max(p, -hi), hi)
        ws = [math.floor(max(x, 0.0) / hi * SUM_UNITS), math.floor(max(-x, 0.0) / hi * SUM_UNITS)]
        if cu is None:
            unowned[na] += math.trunc((float(ws[0]) * lits[0] + float(ws[1]) * lits[1]) * 2.0**k0)
        else:
            for j in range(2):
                w[(cu, na)][j] += ws[j]
    v = {key: float(a) * 1.0 * lits[0] + float(b) * 1.0 * lits[1] for key, (a, b) in w.items()}
    sq: dict[int | None, float] = defaultdict(float)
    by_person: dict[int | None, list[tuple[int, float]]] = defaultdict(list)
    for (cu, na), x in sorted(v.items()):
        by_person[cu].append((na, x))
    assert max(len(g) for g in by_person.values()) <= 2  # a sum of at most two squares: the same in any order
    clipped_f: list[list[float]] = [[], [], []]
    fixed = [0, 0, 0]
    for cu, comps in by_person.items():
        for _, x in comps:
            sq[cu] += x * x
        norm = math.sqrt(sq[cu])
        for na, x in comps:
            y = x if norm <= clip else x * (clip / norm)
            clipped_f[na].append(y)
            fixed[na] += math.trunc(y * 2.0**k)
    return fixed, unowned, clipped_f, len(by_person)


@pytest.mark.parametrize("hi", [1.0, 2.0**40], ids=["hi=1", "hi=2^40"])
def test_clipped_group_totals_are_exact_sums_of_the_persons_grid_values(hi: float) -> None:
    orders = adversarial(hi)
    s = session(orders, hi)
    try:
        rows, parts = bounded(s, CLIP)
    finally:
        s.close()
    fixed, unowned, clipped_f, persons = replay(orders, hi, CLIP)
    assert persons > 3000
    k, k0 = clip_scale(CLIP), unowned_scale(parts)
    assert (k, k0) == (fixed_point_scale(CLIP), fixed_point_scale(hi))
    assert 2.0**51 <= CLIP * 2.0**k < 2.0**52
    # the engine's integers are exactly the sums of the persons' truncated components (and of the unowned tuples)
    assert [int(x) for x in rows.column("__c").to_pylist()] == fixed
    assert [int(x) for x in rows.column("__z").to_pylist()] == unowned
    exact = [Fraction(f, 2**k) + Fraction(z) * Fraction(2) ** -k0 for f, z in zip(fixed, unowned)]
    totals = clipped_totals(rows, CLIP, parts)
    assert [Fraction(n) * Fraction(2) ** -e for n, e in totals] == exact
    # with zero noise the release input is the exact total rounded once (correctly)
    assert add_exactly(totals, np.zeros(3)).tolist() == [float(x) for x in exact]
    for g in range(3):
        # the grid values differ from the clipped doubles by < 2^-k each, and only toward zero
        real = sum((Fraction(y) for y in clipped_f[g]), Fraction(0))
        grid = Fraction(fixed[g], 2**k)
        assert abs(real - grid) < len(clipped_f[g]) * Fraction(2) ** -k
        assert all(abs(Fraction(math.trunc(y * 2.0**k), 2**k)) <= abs(Fraction(y)) for y in clipped_f[g])
    # the data are as intended: components near C and near C * 2^-32 (hi = 1: also persons around C, not clipped)
    comps = [abs(y) for g in clipped_f for y in g]
    assert max(comps) <= CLIP * (1 + 2.0**-50) and max(comps) > CLIP * (1 - 2.0**-20)
    assert min(c for c in comps if c > 0) < CLIP * 2.0**-31


def test_a_float_sum_across_persons_misses_by_more_than_the_calibrations_slack() -> None:
    """Negative control: the same clipped doubles (and the unowned tuples' values) added in floating point,
    as a running SUM adds them, miss the exact total by far more than 2^-30 * C, and the miss depends on the
    order; the exact integers do not."""
    hi = 2.0**40
    orders = adversarial(hi)
    fixed, unowned, clipped_f, _ = replay(orders, hi, CLIP)
    k, k0 = fixed_point_scale(CLIP), fixed_point_scale(hi)
    slack = Fraction(CLIP) * Fraction(2) ** -30
    g = 1  # the group holding the tuples reaching nobody
    # as the float SUM over owners added them: the unowned tuples' total (one row, owner NULL), then the persons
    values = [30 * hi] + clipped_f[g]
    exact = sum((Fraction(v) for v in values), Fraction(0))
    running = 0.0
    for v in values:
        running += v
    assert abs(Fraction(running) - exact) > 2**20 * slack
    backwards = 0.0
    for v in reversed(values):
        backwards += v
    assert backwards != running  # order-dependent
    # the exact path: the persons' grid values and the unowned tuples as integers, in any order
    assert Fraction(fixed[g], 2**k) + Fraction(unowned[g]) * Fraction(2) ** -k0 == \
        sum((Fraction(math.trunc(y * 2.0**k), 2**k) for y in reversed(clipped_f[g])), Fraction(0)) + \
        Fraction(unowned[g]) * Fraction(2) ** -k0


def test_removing_a_person_moves_the_exact_totals_by_their_truncated_clipped_vector() -> None:
    """The released input moves by exactly the removed person's grid vector (norm <= C): no rounding in between,
    even beside a total of 2^40 from the tuples reaching nobody."""
    hi = 2.0**40
    orders = adversarial(hi)
    cust = orders.column("o_custkey").to_pylist()
    victim = 7  # one of the clipped persons (two groups)
    keep = pa.array([c != victim for c in cust])
    s, s2 = session(orders, hi), session(orders.filter(keep), hi)
    try:
        (rows, parts), (rows2, _) = bounded(s, CLIP), bounded(s2, CLIP)
    finally:
        s.close()
        s2.close()
    a = [Fraction(n) * Fraction(2) ** -e for n, e in clipped_totals(rows, CLIP, parts)]
    b = [Fraction(n) * Fraction(2) ** -e for n, e in clipped_totals(rows2, CLIP, parts)]
    diff = [x - y for x, y in zip(a, b)]
    assert sum(1 for d in diff if d != 0) == 2
    # the calibrated L2 sensitivity C(1 + 2^-30) (the norm's and the scaling's roundings), and nothing more
    assert Fraction(CLIP) ** 2 * (1 - Fraction(2) ** -40) <= sum(d * d for d in diff) <= (Fraction(CLIP) * (1 + Fraction(CLIP_SLACK))) ** 2
    assert abs(float(a[1])) > 2.0**39  # the group with the large unowned total moved as well, exactly


# -- DP-S4S's vector F̄ (dpsql.mechanisms._s4s_socp, "Exact sums") -------------------------------------

def _vector_instance(seed: int = 3) -> socp.Instance:
    """One person per tuple (the closed form): heavy users clipped to ~τ in one group and ~τ·2^-21 in
    another, light users with one tiny tuple, and many tuples reaching nobody (a large fixed total)."""
    g = np.random.default_rng(seed)
    w: list[float] = []
    gid: list[int] = []
    ti: list[int] = []
    ui: list[int] = []
    u = 0
    for _ in range(1500):
        for wt, gr in ((1.0, 0), (1.0, 0), (2.0**-20 * float(g.integers(1, 9)), 1)):
            ti.append(len(w))
            ui.append(u)
            w.append(wt)
            gid.append(gr)
        u += 1
    for _ in range(3000):
        ti.append(len(w))
        ui.append(u)
        w.append(2.0**-20 * float(g.integers(1, 2**20)))
        gid.append(int(g.integers(0, 2)))
        u += 1
    n_free = 1 << 16
    w += [1.0] * n_free
    gid += [1] * n_free
    return socp.Instance(np.array(w), np.array(gid, dtype=np.int64), np.array(ti, dtype=np.int64),
                         np.array(ui, dtype=np.int64), u, 2, one_person=True)


def _replay_closed_form(inst: socp.Instance, tau: float) -> list[int]:
    k = fixed_point_scale(tau)
    owned = np.zeros(inst.w.size, dtype=bool)
    owned[inst.ti] = True
    out = [0] * inst.d
    for t in np.flatnonzero(~owned).tolist():
        out[int(inst.gid[t])] += math.trunc(float(inst.w[t]) * 2.0**k)
    load: dict[tuple[int, int], float] = defaultdict(float)
    for t, uu in zip(inst.ti.tolist(), inst.ui.tolist()):
        load[(uu, int(inst.gid[t]))] += float(inst.w[t])  # exact: weights on the 2^-20 grid
    sq: dict[int, float] = defaultdict(float)
    for (uu, _), x in sorted(load.items()):
        sq[uu] += x * x  # at most two groups per user: the same in any order
    for (uu, gg), x in load.items():
        norm = math.sqrt(sq[uu])
        y = tau / norm if norm > tau else 1.0
        out[gg] += math.trunc(x * y * 2.0**k)
    return out


def test_vector_truncation_sums_the_clipped_loads_exactly_in_any_order() -> None:
    inst = _vector_instance()
    tau = 1.0
    k = fixed_point_scale(tau)
    tr = socp.truncate(inst, tau)
    assert [e for _, e in tr.exact] == [k] * inst.d
    assert [n for n, _ in tr.exact] == _replay_closed_form(inst, tau)
    assert tr.values.tolist() == [float(Fraction(n, 2**e)) for n, e in tr.exact]  # one correct rounding each
    # the same bits whatever the order of the sampled tuples (they come in thread order from the engine)
    perm = np.random.default_rng(9).permutation(inst.w.size)
    inv = np.argsort(perm)
    shuffled = socp.Instance(inst.w[perm], inst.gid[perm], inv[inst.ti], inst.ui, inst.n_users, inst.d, one_person=True)
    tr2 = socp.truncate(shuffled, tau)
    assert tr2.exact == tr.exact and tr2.values.tobytes() == tr.values.tobytes()
    # negative control: the same clipped loads added as doubles depend on the order they come in
    load = np.bincount(inst.ui * inst.d + inst.gid[inst.ti], weights=inst.w[inst.ti])
    users, groups = np.arange(load.size) // inst.d, np.arange(load.size) % inst.d
    norm = np.sqrt(np.bincount(users, weights=load * load))
    vals = load * np.where(norm > tau, tau / np.where(norm > tau, norm, 1.0), 1.0)[users]
    free = np.bincount(inst.gid, weights=np.where(np.isin(np.arange(inst.w.size), inst.ti), 0.0, inst.w), minlength=inst.d)
    sums = set()
    for seed in range(6):
        o = np.random.default_rng(seed).permutation(vals.size)
        sums.add(tuple((free + np.bincount(groups[o], weights=vals[o], minlength=inst.d)).tolist()))
    assert len(sums) > 1


def test_vector_truncation_moves_by_exactly_the_removed_persons_grid_vector() -> None:
    inst = _vector_instance()
    tau = 1.0
    victim = 11  # a clipped user (two groups)
    keep_t = np.ones(inst.w.size, dtype=bool)
    keep_t[inst.ti[inst.ui == victim]] = False
    new_index = np.cumsum(keep_t) - 1
    mine = inst.ui == victim
    without = socp.Instance(inst.w[keep_t], inst.gid[keep_t], new_index[inst.ti[~mine]], inst.ui[~mine], inst.n_users,
                            inst.d, one_person=True)
    a, b = socp.truncate(inst, tau), socp.truncate(without, tau)
    diff = [Fraction(n1 - n2, 2**e) for (n1, e), (n2, _) in zip(a.exact, b.exact)]
    assert all(x != 0 for x in diff)
    assert tau**2 * (1 - Fraction(2) ** -40) <= sum(x * x for x in diff) <= (tau * (1 + Fraction(2) ** -30)) ** 2


def test_exact_int_sum_of_the_scalar_truncation_is_exact_where_float_sums_are_not() -> None:
    """The scalar truncation's sums across tuples and people (``_s4s_truncation.exact_int_sum``): exact for
    integers below 2^53 in any number and order; numpy's float sum of the same values is not (control)."""
    from dpsql.mechanisms._s4s_truncation import exact_int_sum

    g = np.random.default_rng(4)
    a = np.concatenate([[2.0**53 - 1], g.integers(0, 2**30, 200_000).astype(np.float64), [2.0**53 - 1, 1.0, 3.0]])
    want = sum(int(x) for x in a.tolist())
    assert exact_int_sum(a) == want
    assert exact_int_sum(a[::-1]) == want and exact_int_sum(a.astype(np.int64)) == want
    assert int(np.sum(a)) != want  # control: numpy's float sum rounds beyond 2^53


def test_clipping_refuses_bounds_whose_person_totals_overflow_before_the_charge() -> None:
    """Delta x max|value| beyond the DOUBLE range would make a person's total infinite (then NaN when clipped):
    refused for free (a public check of the declared bounds, at most 1e15 in magnitude as on one table)."""
    orders = adversarial(1.0).slice(0, 10)
    s = session(orders, 1e306)
    try:
        before = s.remaining()
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="too large"):
            s.query(SQL, epsilon=1.0, delta=1e-6, options={"clip_norm": 1.0})
        assert s.remaining() == before
    finally:
        s.close()


# -- the range of the clip norm: the norm and the scaling C / norm stay in the normal DOUBLE range --------------

def _one_person_change(hi: float, clip: float, victim_price: float) -> float:
    """||total(D) - total(D - victim)||_2 / C on the bounded SQL (no noise): the victim (one order of
    ``victim_price`` in group A) and one other person (one order of ``hi`` in group B)."""
    full = pa.table({"o_custkey": pa.array([0, 1], pa.int64()), "o_nationkey": pa.array([0, 1], pa.int64()),
                     "o_price": pa.array([victim_price, hi], pa.float64())})
    out = []
    for t in (full, full.slice(1, 1)):
        s = session(t, hi)
        try:
            rows, parts = bounded(s, clip)
        finally:
            s.close()
        out.append([Fraction(n) * Fraction(2) ** -e for n, e in clipped_totals(rows, clip, parts)])
    sq = sum(((x - y) ** 2 for x, y in zip(*out)), Fraction(0))
    return math.sqrt(float(sq / Fraction(clip) ** 2))


def test_the_clipped_vector_stays_within_C_when_the_unclipped_ratio_is_moderate() -> None:
    """Control for the two tests below: ordinary magnitudes give a change of exactly about C."""
    assert 1.0 - 2.0**-20 <= _one_person_change(2.0**10, 0.75, 2.0**10) <= 1.0 + CLIP_SLACK


@pytest.mark.parametrize(("hi", "clip"), [
    # C / norm = 0.5000...01 * 2^-1074 (subnormal) rounds up to 2^-1074: the clipped vector was about 2C
    (2.0**49, 2.0**-1026 + 2.0**-1035),
    # tiny bounds: the square of a person's total underflows to 0, the norm reads 0 <= C and nothing is clipped:
    # the change was 1024 C
    (2.0**-600, 2.0**-610),
], ids=["C/norm subnormal", "norm underflows"])
def test_clip_norms_whose_arithmetic_leaves_the_normal_range_are_refused_for_free(hi: float, clip: float) -> None:
    """The calibration's C(1 + 2^-30) holds only while C / norm and the squares are normal doubles: a clip norm
    (or bounds) outside that range is refused before the charge, from public values alone."""
    orders = pa.table({"o_custkey": pa.array([0], pa.int64()), "o_nationkey": pa.array([0], pa.int64()),
                       "o_price": pa.array([hi], pa.float64())})
    s = session(orders, hi)
    try:
        before = s.remaining()
        with pytest.raises(dpsql.errors.ConfigError, match="clip_norm"):
            s.query(SQL, epsilon=1.0, delta=1e-6, options={"clip_norm": clip})
        assert s.remaining() == before
    finally:
        s.close()


def test_the_clip_norm_range_check_is_what_keeps_the_sensitivity() -> None:
    """What the refused parameters did (negative control for the refusal): the bounded SQL itself, outside the
    range, moves by far more than C(1 + 2^-30) when one person is removed."""
    assert _one_person_change(2.0**49, 2.0**-1026 + 2.0**-1035, 2.0**49) > 1.9
    assert _one_person_change(2.0**-600, 2.0**-610, 2.0**-600) > 1000.0


# -- dpsql.noise.add_exactly ---------------------------------------------------------------------------------

def _rounded(n: int, s: int, x: float) -> float:
    v = Fraction(n) * Fraction(2) ** -s + Fraction(x)
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def test_add_exactly_is_the_correctly_rounded_sum() -> None:
    """Against exact rationals: random and adversarial n (up to 2000 bits, either sign), s in [-1100, 1200], x
    normal, subnormal, zero, the largest double; ties (v + x exactly halfway) round to even."""
    g = np.random.default_rng(21)
    specials = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308]
    cases = []
    for _ in range(20_000):
        s = int(g.choice([0, 1, 52, int(g.integers(-1100, 1200)), int(g.integers(0, 400))]))
        bits = int(g.choice([1, 53, 54, 127, 2000]))
        n = int.from_bytes(g.bytes(bits // 8 + 1), "little") % (1 << bits) * int(g.choice([1, -1]))
        r = g.random()
        x = float(g.choice(specials)) if r < 0.2 else math.ldexp(float(g.uniform(-1, 1)), int(g.integers(-1074, 1024))) \
            if r < 0.5 else float(g.normal(0, 10.0 ** int(g.integers(-30, 30))))
        cases.append((n, s, x))
    cases += [((1 << 53) + 1, 0, 0.0), ((1 << 53) + 3, 0, 0.0), (1, 1075, 0.0), (3, 1075, 0.0), (-3, 1076, 0.0),
              (1, 0, 2.0**53), (-1, 0, 1.0), (0, 7, -0.0)]
    got = add_exactly([(n, s) for n, s, _ in cases], np.array([x for _, _, x in cases]))
    want = np.array([_rounded(n, s, x) for n, s, x in cases])
    assert got.tobytes() == want.tobytes()


def test_add_exactly_passes_non_finite_noise_through() -> None:
    """A noise sample beyond the DOUBLE range (a public sigma near it) is infinite: the sum is that infinity, as
    IEEE addition gives, never an exception after the charge; NaN stays NaN."""
    out = add_exactly([(5, 3), (-(1 << 200), 0), (7, -1000)], np.array([math.inf, -math.inf, math.nan]))
    assert out[0] == math.inf and out[1] == -math.inf and math.isnan(out[2])


def test_the_cone_paths_linking_rows_hold_at_the_carried_grid_values() -> None:
    """The released F̄ carries w·z truncated onto 2^-k, below z by up to 2^-k/w (≈ 2e-7 at τ = 1000 and
    the least weight 2^-20); the repair lowers y until every linking row Σ y_u − z_j ≤ |U_j| − 1 holds
    at that carried z, exactly (checked in rationals). Checking it at z itself left the row violated by
    that much, far above the repair's margin (the negative control)."""
    from fractions import Fraction

    from dpsql.mechanisms import _s4s_socp as socp
    from dpsql.rewrite.bound import fixed_point_scale

    tau, w = 1000.0, 2.0**-20
    k = fixed_point_scale(tau)
    args = dict(wv=np.array([w]), var_u=np.array([0, 1]), vrow=np.array([0, 0]), n_own=np.array([2]),
                hv=np.array([True, True]), cu=np.array([0, 1]), cv=np.array([0, 0]), ug_row=np.array([1, 3]),
                ug_inv=np.array([0, 1]), n_cone=4, head=np.array([0, 2]), tau=tau)

    def row_excess(y: np.ndarray, zv: np.ndarray) -> Fraction:
        q = int(np.trunc(w * zv[0] * 2.0**k))  # what grid_values carries
        return Fraction(y[0]) + Fraction(y[1]) - Fraction(q, 2**k) / Fraction(w) - 1

    y, zv = socp._repair(np.array([1.0, 0.7]), np.array([0.7]), **args)  # type: ignore[arg-type]
    assert row_excess(y, zv) <= 0
    # control: the row checked at z (the repair before), tight there, is violated at the carried value
    assert row_excess(np.array([1.0, 0.7]), np.array([0.7])) > 1e-7
