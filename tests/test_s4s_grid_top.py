"""DP-S4S's threshold grid reaches Δ: the default grid (base 5.5, bias ln(L/β)) is
{5.5^{i−1} : 5.5^{i−1}·√5.5 < Δ} ∪ {Δ} (a power within √5.5 below Δ gives way to Δ); the paper's Algorithm 2 (``tau_base=2`` / ``base=2, paper_bias=True``)
keeps τ_i = 2^{i−1} ≤ Δ. Expected grids written out by hand; the amplified cost of the top run (τ = Δ,
where P[K > Δ] = 0) is checked against Lemma 3.1's closed form at τ = Δ, ln max{A₁^Δ, A₂^−Δ}."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.accounting import s4s_budget_schedule, s4s_tau_grid
from dpsql.accounting.s4s import s4s_grid_size
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.mechanisms.s4s import s4s_rdp_schedule, s4s_scalar
from dpsql.mechanisms.s4s_vector import vector_taus
from dpsql.testing import use_noise, zero_noise

P4 = 5.5**4  # 915.0625

# Δ -> (default grid: 5.5^{i-1} with 5.5^{i-1}·√5.5 < Δ (√5.5 = 2.3452), then Δ; the paper's grid: 2^{i-1} <= Δ)
GRIDS = {
    1: ((1.0,), (1.0,)),
    2: ((2.0,), (1.0, 2.0)),  # 1·√5.5 ≥ 2: Δ alone
    3: ((1.0, 3.0), (1.0, 2.0)),
    5: ((1.0, 5.0), (1.0, 2.0, 4.0)),
    6: ((1.0, 6.0), (1.0, 2.0, 4.0)),  # 5.5 is within √5.5 of 6: left out
    12: ((1.0, 12.0), (1.0, 2.0, 4.0, 8.0)),  # 5.5·√5.5 = 12.899 ≥ 12
    13: ((1.0, 5.5, 13.0), (1.0, 2.0, 4.0, 8.0)),
    30: ((1.0, 5.5, 30.0), (1.0, 2.0, 4.0, 8.0, 16.0)),
    31: ((1.0, 5.5, 31.0), (1.0, 2.0, 4.0, 8.0, 16.0)),
    71: ((1.0, 5.5, 30.25, 71.0), tuple(2.0**i for i in range(7))),  # 30.25·√5.5 = 70.94 < 71
    1024: ((1.0, 5.5, 30.25, 166.375, 1024.0), tuple(2.0**i for i in range(11))),
    915: ((1.0, 5.5, 30.25, 166.375, 915.0), tuple(2.0**i for i in range(10))),  # 5.5^4 rounded down
    916: ((1.0, 5.5, 30.25, 166.375, 916.0), tuple(2.0**i for i in range(10))),  # rounded up: no near-twin of Δ
    2147: ((1.0, 5.5, 30.25, 166.375, P4, 2147.0), tuple(2.0**i for i in range(12))),  # P4·√5.5 = 2146.02
}


@pytest.mark.parametrize("delta", sorted(GRIDS))
def test_the_grid_for_both_variants(delta: int) -> None:
    default, paper = GRIDS[delta]
    assert s4s_tau_grid(delta) == default and s4s_grid_size(delta) == len(default)
    assert s4s_tau_grid(delta, 2.0, top_at_delta=False) == paper
    assert s4s_tau_grid(delta, 2.0, top_at_delta=False) == tuple(2.0**i for i in range(delta.bit_length()))
    # the schedules take them (i = L ... 1): the default call, and the paper's Algorithm 2
    assert [s.tau for s in s4s_budget_schedule(1.0, delta, 0.25)] == list(reversed(default))
    pap = s4s_budget_schedule(1.0, delta, 0.25, base=2.0, paper_bias=True)
    assert [s.tau for s in pap] == list(reversed(paper)) and all(isinstance(s.tau, int) for s in pap)
    # the top is an explicit keyword, independent of the bias: the power grid 5.5^{i-1} <= Δ
    power = [5.5**i for i in range(12) if Fraction(11, 2) ** i <= delta]
    assert [s.tau for s in s4s_budget_schedule(1.0, delta, 0.25, top_at_delta=False)] == list(reversed(power))
    # every power below Δ, then Δ (keep_near_top: the vector form's count)
    near = tuple(t for t in power if t < delta) + (float(delta),)
    assert s4s_tau_grid(delta, keep_near_top=True) == near
    # L: the powers p = 5.5^k with p·√5.5 < Δ, i.e. (11/2)^(2k+1) < Δ² (exact), then Δ
    k = 0
    while Fraction(11, 2) ** (2 * k + 1) < delta * delta:
        k += 1
    assert len(default) == k + 1


def test_the_vector_grid_doubles_below_delta_then_takes_delta() -> None:
    assert vector_taus(1) == (1.0,) and vector_taus(4) == (1.0, 2.0, 4.0)
    assert vector_taus(7) == (1.0, 2.0, 4.0, 7.0)  # was 1, 2, 4, 8: the same count, the top lowered to Δ
    assert vector_taus(1025) == tuple(2.0**i for i in range(11)) + (1025.0,)


@pytest.mark.parametrize("eps,delta,q", [(1.0, 3, 1 / 16), (1.0, 31, 1 / 16), (0.5, 1024, 1 / 64), (2.0, 916, 0.25),
                                         (1.0, 6, 1.0), (1.0, 1_000_000, 1 / 16)])
def test_the_new_schedules_spend_at_most_epsilon(eps: float, delta: int, q: float) -> None:
    sched = s4s_budget_schedule(eps, delta, q)
    assert sched[0].tau == delta and [s.i for s in sched] == list(range(len(sched), 0, -1))
    # the accounting's floats may sum one ulp above ε (q = 1: ε′_i = ε_i); the mechanism's schedule below
    # is recomputed a few ulps lower until the exact sum fits
    assert math.fsum(s.epsilon_prime for s in sched) <= eps * (1 + 4e-16)
    assert all(0.0 <= s.epsilon_prime <= s.epsilon for s in sched)
    # the top run, τ = Δ: Lemma 3.1 with P[K > Δ] = 0 is ln max{E[e^{Kx}], 1/E[e^{−Kx}]}, x = ε_L/Δ,
    # K ~ Bin(Δ, q): E[e^{±Kx}] = (1 − q + q e^{±x})^Δ
    top = sched[0]
    x = top.epsilon / delta
    want = max(delta * math.log1p(q * math.expm1(x)), -delta * math.log1p(q * math.expm1(-x)))
    assert top.epsilon_prime == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert top.epsilon == pytest.approx(eps / len(sched), rel=1e-12)
    if q == 1.0:
        assert top.epsilon_prime == pytest.approx(top.epsilon, rel=1e-12)
    # and the mechanism's runs on one shared sample, with the snapping terms, jointly within ε
    r = s4s_scalar(np.zeros(0), np.zeros(0, int), np.zeros(0, int), epsilon=eps, max_tuples_per_user=delta, q=q,
                   rng=zero_noise())
    assert r.steps[0].tau == delta and r.epsilon_joint <= eps and r.epsilon_spent <= eps
    assert sum((Fraction(s.epsilon_prime) for s in r.steps), Fraction(0)) <= Fraction(eps)


@pytest.mark.parametrize("delta,q", [(3, 1 / 16), (31, 0.25), (7, 1.0)])
def test_the_rdp_schedule_takes_the_same_grid_and_stays_within_its_budget(delta: int, q: float) -> None:
    sched = s4s_rdp_schedule(1.0, 1e-6, delta, q)
    assert tuple(s.tau for s in reversed(sched.steps)) == s4s_tau_grid(delta)
    assert sched.rho_joint <= sched.rho_total and sched.epsilon_spent <= 1.0
    paper = s4s_rdp_schedule(1.0, 1e-6, delta, q, tau_base=2.0, paper_bias=True)
    assert tuple(s.tau for s in reversed(paper.steps)) == s4s_tau_grid(delta, 2.0, top_at_delta=False)


# ----------------------------------------------------------------------------- end to end
def _orders_customers(seed: int = 5, n_customers: int = 400) -> tuple[pa.Table, pa.Table]:
    """Customers with 0-3 orders each (Δ = 3 declared)."""
    g = np.random.default_rng(seed)
    n_orders = g.integers(0, 4, n_customers)
    o_cust = np.repeat(np.arange(n_customers), n_orders)
    customer = pa.table({"c_custkey": np.arange(n_customers)})
    orders = pa.table({"o_orderkey": np.arange(o_cust.size) + 10_000, "o_custkey": o_cust})
    return customer, orders


def _session(customer: pa.Table, orders: pa.Table) -> Any:
    s = dpsql.Session(budget=Budget(1e6, 1e-2))
    s.register("customer", customer, privacy_unit="c_custkey")
    s.register("orders", orders, references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 3})
    use_noise(s, zero_noise())
    return s


SQL = "SELECT COUNT(*) FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey"


def test_a_join_count_at_q_1_with_zero_noise_is_the_tuple_count_minus_the_bias() -> None:
    """Δ = 3: grid (1, 3), L = 2, q = 1, ε = 1000: ε_i = 500, bias at τ = 3: (3/500)·ln(2/0.1) = 0.0179744;
    the release is round(n − 0.018) = n, the number of join tuples. Negative control: the power grid
    (τ = 1 only, the old default) releases the number of customers with an order."""
    customer, orders = _orders_customers()
    per = np.bincount(np.asarray(orders.column("o_custkey")), minlength=customer.num_rows)
    n, people = int(per.sum()), int((per > 0).sum())
    assert n > 1.8 * people  # the two answers are far apart
    s = _session(customer, orders)
    try:
        p = s.explain(SQL, epsilon=1000.0, options={"mechanism": "dp_s4s", "q": 1.0}).parameters
        assert p["Delta"] == 3 and p["tau_grid"] == [3.0, 1.0]
        bias = p["schedule"][0]["bias"]
        assert bias == pytest.approx(3 / 500 * math.log(20), rel=1e-9)
        got = s.query(SQL, epsilon=1000.0, options={"mechanism": "dp_s4s", "q": 1.0}).table.column(0)[0].as_py()
        assert got == round(n - bias) == n
        # the paper's grid (τ = 2, 1; L = 2, ε_i = 500): Σ_u min(2, y_u), its bias (2/500)·ln(3·2/0.1) ≈ 0.016
        paper = s.query(SQL, epsilon=1000.0, options={"mechanism": "dp_s4s", "q": 1.0, "tau_base": 2})
        assert paper.table.column(0)[0].as_py() == int(np.minimum(per, 2).sum())
    finally:
        s.close()
    # the numeric core on the same tuples: the default grid and the old power grid (negative control)
    o_cust = np.asarray(orders.column("o_custkey"))
    w, ti = np.ones(o_cust.size), np.arange(o_cust.size)
    new = s4s_scalar(w, ti, o_cust, epsilon=1000.0, max_tuples_per_user=3, q=1.0, rng=zero_noise())
    old = s4s_scalar(w, ti, o_cust, epsilon=1000.0, max_tuples_per_user=3, q=1.0, rng=zero_noise(), top_at_delta=False)
    assert round(new.estimate) == n and new.tau == 3.0
    assert [st.tau for st in old.steps] == [1.0] and round(old.estimate) == people


def test_the_default_sample_is_no_longer_a_person_count() -> None:
    """q = 1/2, zero noise, 3000 customers with 3 orders each (n = 9000): with τ = Δ = 3 on the grid the
    release is |S|/q − bias/q, within 6 sd of n (sd of |S|/q: √(n(1 − q)/q) ≈ 94.9; failure ≤ 1e-8); the
    power grid's τ = 1 would give about 3000·(1 − 1/8)/q = 5250."""
    n_c = 3000
    customer = pa.table({"c_custkey": np.arange(n_c)})
    o_cust = np.repeat(np.arange(n_c), 3)
    orders = pa.table({"o_orderkey": np.arange(o_cust.size), "o_custkey": o_cust})
    s = _session(customer, orders)
    try:
        got = s.query(SQL, epsilon=1000.0, options={"mechanism": "dp_s4s", "q": 0.5}).table.column(0)[0].as_py()
    finally:
        s.close()
    sd = math.sqrt(9000 * 0.5 / 0.5)
    assert abs(got - 9000) <= 6 * sd
    assert abs(got - 5250) > 20 * sd  # negative control: far from the truncated-at-one answer


def test_a_tau_base_near_one_is_refused_for_free_not_computed_for_minutes() -> None:
    """A base near 1 made thousands of thresholds, each run accounted for: tau_base = 1.0001 kept a
    free explain busy for minutes. At most MAX_TAU_GRID = 64 thresholds (L ≤ log_b Δ + 1): Δ = 3 allows
    b ≥ 3^(1/63) = 1.017591..., refused just below, in the explain and the query alike, before any charge."""
    from dpsql.accounting.s4s import MAX_TAU_GRID

    assert MAX_TAU_GRID == 64
    assert len(s4s_tau_grid(3, 1.01760)) == 64
    with pytest.raises(ConfigError, match="at most 64 are allowed") as ei:
        s4s_tau_grid(3, 1.01758)
    assert "tau_base >= 1.01760" in str(ei.value)  # 3^(1/63) = 1.0175935…, rounded up: passes as written
    assert len(s4s_tau_grid(2**63, 2.0)) == 64  # the paper's base reaches any 64-bit Δ
    customer, orders = _orders_customers()
    s = _session(customer, orders)
    try:
        before = s.remaining()
        for fn in (s.explain, s.query):
            with pytest.raises(ConfigError, match="truncation thresholds"):
                fn(SQL, epsilon=1.0, options={"mechanism": "dp_s4s", "tau_base": 1.0001})
        assert s.remaining() == before
    finally:
        s.close()


def test_r2t_grid_is_capped_too() -> None:
    from dpsql.accounting.s4s import r2t_schedule

    assert len(r2t_schedule(1.0, 2.0**64, base=2.0)) == 64
    with pytest.raises(ConfigError, match="R2T thresholds"):
        r2t_schedule(1.0, 1000.0, base=1.0001)
    customer, orders = _orders_customers()
    s = _session(customer, orders)
    try:
        before = s.remaining()
        with pytest.raises(ConfigError, match="thresholds"):
            s.query(SQL, epsilon=1.0, options={"mechanism": "r2t", "tau_base": 1.0001})
        assert s.remaining() == before
    finally:
        s.close()


def _three_tables(degree: int) -> Any:
    customer, orders = _orders_customers()
    lineitem = pa.table({"l_orderkey": np.repeat(np.asarray(orders.column("o_orderkey")), 2),
                         "l_flag": np.tile(np.array(["A", "B"]), orders.num_rows)})
    s = dpsql.Session(budget=Budget(1e6, 1e-2))
    s.register("customer", customer, privacy_unit="c_custkey")
    s.register("orders", orders, references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": degree})
    s.register("lineitem", lineitem, references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": degree},
               columns={"l_flag": {"domain": ["A", "B"]}})
    use_noise(s, zero_noise())
    return s


def test_a_delta_above_2_63_is_refused_before_any_charge_not_a_crash() -> None:
    """Degree bounds 2^32 on two hops make Δ = 2^64: DP-S4S's binomial tails raised a raw TypeError
    (scipy's 64-bit counts), R2T's GROUP BY form a threshold-grid refusal whose hint named a tau_base
    it does not take (the clipped Gaussian GROUP BY does not depend on Δ's size and still runs). Δ is refused as such (at most 2^63), by explain and query alike, for free."""
    join = "FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey"
    s = _three_tables(2**32)
    try:
        before = s.remaining()
        for sql, opts in ((f"SELECT COUNT(*) {join}", {}),
                          (f"SELECT l_flag, COUNT(*) {join} GROUP BY l_flag", {"mechanism": "r2t"}),
                          (f"SELECT COUNT(*) {join}", {"mechanism": "r2t"})):
            for fn in (s.explain, s.query):
                with pytest.raises(ConfigError, match="2\\^63"):
                    fn(sql, epsilon=1.0, delta=1e-6, options=opts)
        assert s.remaining() == before
        with pytest.raises(ConfigError, match="at most 2\\^63"):
            s4s_tau_grid(2**63 + 1, 2.0)
    finally:
        s.close()
    # negative control: Δ = 2^62 is planned
    s = _three_tables(2**31)
    try:
        assert s.explain(f"SELECT COUNT(*) {join}", epsilon=1.0, options={"mechanism": "r2t"}) is not None
    finally:
        s.close()
