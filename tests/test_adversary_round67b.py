"""Privacy accounting to the last delta: what is charged against what the noise drawn proves, by independent computation.

* Leak (fixed, ulp level): DAWA's stage-2 measurement was calibrated for the L1 sensitivity k * max(1, ||A||_1) with
  ||A||_1 the largest column norm of the GreedyH strategy added up in floats. The weights of a root-to-leaf path sum
  to 1 only in exact arithmetic: their floats can add up to 1.0 in floats and to more than 1 exactly (p = 0.89, 0.94,
  0.2 over 8 buckets: 1 + 1.6e-16; 39% of random split sequences exceed 1). The snapped Laplace is calibrated
  exactly (``dpsql.noise.snapping_calibration`` checks its proven epsilon in rationals) but for the float norm, so
  where lambda lay just above a power of two (no slack left in the snapping term) the measurement proved up to
  1.3e-15 more than epsilon2 (epsilon2 = 8.007812500000226 in the example). The sensitivity is now an upper bound on
  the exact norm of the float weights (``_dawa_greedyh.measured_l1_bound``: the float sum's rounding bounded
  above), which raises lambda by at most levels * 2^-52 relative; the pre-charge check uses the same bound.
* Leak (fixed, ulp level): an R2T run was calibrated for the float sum fl(tau + G) of its threshold and the
  truncation's certified slack G = tau 2^-10, below the exact sum for some thresholds (tau_base 7.1: tau = 7.1^4),
  so a run whose lambda lay just above a power of two proved its share epsilon/L (1 + 2.2e-18) (558 such
  (epsilon, base, GS) points on a scan; the runs' total stayed within epsilon). The sum is now rounded up.
* Leak (fixed, ulp level): at q = 1 a DP-S4S run's lambda came from float divisions only, so a run whose lambda lay
  just above a power of two proved its slot epsilon'_i (1 + 1.04e-16) (epsilon = 67.60498046875014, Delta = 100,
  tau_base 3); the runs' sum stayed within epsilon only by the other runs' slack (4e-19 relative at the closest).
  Each unsampled run is now checked against its slot in exact arithmetic (sampled runs already were, jointly,
  with a margin).

Held (each recomputed here by a route that shares no code with dpsql): the sparse histogram's (sigma, tau*) with
extra columns (AVG, VARIANCE, CORR; J = 2..6 columns, C_u in {1, 3, 7}, k in {1, 2, 3}) meet Theorem 5.4 at 40
digits with mu_o^2 = J/sigma^2 (exact delta / requested = 0.99999999988, the 2^-33 allowance) and tau* - 1 does not,
each extra column's noise is Delta_j * sigma with Delta_j recomputed from the query (k max|bound|, k m^2, k m_a m_b);
the ledger records exactly the cost explain states on every route (sparse histogram, Gaussian and Laplace over public
keys, quantiles beside other aggregates, DAWA histograms, ROLLUP, UNION ALL, DP-S4S, R2T, grouped joins by clipping
and by DP-S4S's vector form, COUNT(DISTINCT person) over a join), and the ledger's spent total is the exact decimal
sum of the rows; per-person clipping of three aggregates composed as one Gaussian (sigma = 85.9422 for a count at
epsilon = 3, delta = 3e-6, Delta = 32, against 135.880 for the split) from a 40-digit bisection; the exponential
mechanism's floating-point allowance xi(N) (its derivation's r = 2^-42 >= 746 * 2^-52 + 2^-50, and its value);
Theorem 5.4's branch and bound equals the brute-force maximum over random parameters; budgets' exact sums at 1e-300,
0.1 + 0.2 and the boundary of the remaining budget.
"""

from __future__ import annotations

import math
import random
import warnings
from fractions import Fraction

import mpmath as mp
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.accounting.sparse_histogram import _exact, _exact_bruteforce
from dpsql.budget import Budget, compose, exact_sum_fits, share_of
from dpsql.mechanisms._dawa_greedyh import (
    _tree_levels,
    greedy_h,
    measured_l1_bound,
    stage2_max_bound,
    strategy_from_splits,
)
from dpsql.mechanisms.dawa import IntervalWorkload
from dpsql.mechanisms.quantile import GAMMA, WEIGHT_REL_ERROR, WEIGHT_SCALE, float_slack
from dpsql.noise import snapping_calibration, snapping_exponent, snapping_extra
from dpsql.testing import seeded_noise, use_noise

# ----------------------------------------------------------------------------- DAWA stage 2: the exact ||A||_1


def _exact_column_norms(strategy) -> list[Fraction]:  # type: ignore[no-untyped-def]
    """The exact L1 norm of every group's column: the exact sum of the float weights of the nodes above it."""
    out = []
    for g in range(strategy.n_groups):
        s = Fraction(0)
        for starts, w in zip(strategy.levels, strategy.weights, strict=True):
            s += Fraction(float(w[int(np.searchsorted(starts, g, side="right")) - 1]))
        out.append(s)
    return out


def _proven_epsilon2(strategy, epsilon2: float, k: float = 1.0) -> Fraction:  # type: ignore[no-untyped-def]
    """The snapping theorem's epsilon of the measurement (dpsql.noise section 2) at the strategy's EXACT norm:
    k ||A||_1 / lambda + N 2^-45 (B / lambda + 2)."""
    lam, _, bound, rows = strategy.snapping(epsilon2, sensitivity=k)
    norm = max(_exact_column_norms(strategy))
    return Fraction(k) * norm / Fraction(lam) + rows * Fraction(2) ** -45 * (Fraction(bound) / Fraction(lam) + 2)


def _eight_buckets():  # type: ignore[no-untyped-def]
    levels = _tree_levels(8, 2)
    ps = [0.89, 0.94, 0.2]
    return strategy_from_splits(np.eye(8), [np.full(lv.shape, ps[d] if d < len(ps) else 1.0)
                                            for d, lv in enumerate(levels)])


def test_the_float_weights_of_a_path_can_sum_above_one_exactly() -> None:
    """The premise (negative control): the float norm reads 1.0 while the exact one is above 1."""
    s = _eight_buckets()
    assert s.l1_sensitivity() == 1.0
    assert float(max(_exact_column_norms(s)) - 1) == pytest.approx(1.5959455978986625e-16, rel=1e-9)


def test_calibrating_for_the_float_norm_proves_more_than_epsilon2() -> None:
    """The former calibration (negative control): the snapped Laplace calibrated for k * max(1, float norm) = 1
    proves more than epsilon2 at the exact norm, by 1.3e-15, at epsilon2 = 8.007812500000226."""
    s = _eight_buckets()
    e2 = 8.007812500000226
    rows = s.snapping(e2)[3]
    lam, _, bound = snapping_calibration(1.0, e2, coordinates=rows, integer=True, what="t",
                                         max_bound=stage2_max_bound(s.n_buckets))
    assert lam == 0.12500000000000003  # two ulps above 2^-3: the snapping term has no slack
    norm = max(_exact_column_norms(s))
    proven = norm / Fraction(lam) + rows * Fraction(2) ** -45 * (Fraction(bound) / Fraction(lam) + 2)
    assert proven > Fraction(e2)
    assert float(proven - Fraction(e2)) == pytest.approx(1.275e-15, rel=1e-2)


def test_dawa_measurement_proves_at_most_epsilon2_at_the_exact_norm() -> None:
    """Was: at epsilon2 = 8.007812500000226 (lambda = 0.125 + 2 ulps, just above a power of two) the measurement
    proved epsilon2 * (1 + 1.6e-16) at the strategy's exact norm; now it proves at most epsilon2 there and on every
    float below it down to 400 ulps (where lambda crosses the power of two)."""
    s = _eight_buckets()
    e2 = 8.007812500000226
    for _ in range(400):
        assert _proven_epsilon2(s, e2) <= Fraction(e2), e2
        e2 = math.nextafter(e2, 0.0)


def _just_above_powers_of_two(strategy, sensitivity: float, tries: int = 60) -> list[float]:  # type: ignore[no-untyped-def]
    """epsilon2 values at which the measurement's lambda lies just above a power of two (no slack in the snapping
    term): the least epsilon2 at which it is still above, found per power, then a few floats below it."""
    n = strategy.snapping(1.0, sensitivity=sensitivity)[3]
    out = []
    for m in range(-3, 4):
        for kk in (20, 30, 40):
            e2 = sensitivity / math.ldexp(1.0, m) + n * snapping_extra(2.0 ** (kk + 1))
            if snapping_exponent(e2 / 1000 / n) != kk:
                continue
            x = e2
            for _ in range(tries):
                out.append(x)
                x = math.nextafter(x, 0.0)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_dawa_measurement_random_strategies_at_their_tightest_epsilon2(seed: int) -> None:
    """GreedyH strategies of random workloads, at the epsilon2 values where the snapping term has no slack: the
    proven epsilon at the exact norm never exceeds epsilon2 (for k = 1 and 3 records per unit)."""
    gen = np.random.default_rng(seed)
    n = int(gen.integers(5, 24))
    lo = gen.integers(0, n, 6)
    hi = np.minimum(n - 1, lo + gen.integers(0, n, 6))
    s = greedy_h(IntervalWorkload.from_ranges(np.c_[lo, hi], n), granularity=int(gen.integers(3, 101)))
    for k in (1.0, 3.0):
        for e2 in _just_above_powers_of_two(s, k, tries=12):
            assert _proven_epsilon2(s, e2, k) <= Fraction(e2), (seed, k, e2)


def test_the_norm_bound_costs_at_most_levels_ulps() -> None:
    """Negative control: the bound moves lambda by at most levels * 2^-52 relative (no visible change in noise)."""
    s = _eight_buckets()
    levels = len(s.levels)
    b = measured_l1_bound(1.0, s.l1_sensitivity(), levels)
    assert 1.0 < b <= 1.0 + (levels + 1) * 2.0**-52
    assert measured_l1_bound(3.0, 1.0, levels) >= 3.0 * (1 + Fraction(levels, 2**52))
    assert Fraction(measured_l1_bound(3.0, 1.0, levels)) >= 3 * max(_exact_column_norms(s))


# ----------------------------------------------------------------------------- sparse histogram, extra columns
mp.mp.dps = 40


def _dg(eps: mp.mpf, mu: mp.mpf) -> mp.mpf:
    return mp.ncdf(-eps / mu + mu / 2) - mp.e**eps * mp.ncdf(-eps / mu - mu / 2)


def _gshm(eps: float, sigma: float, dtau: float, c: int, mo2: mp.mpf) -> mp.mpf:
    """Theorem 5.4 term by term (spec section 1.5), at 40 digits."""
    e, s, d = mp.mpf(eps), mp.mpf(sigma), mp.mpf(dtau)
    p = mp.ncdf(d / s)
    lnp = mp.log(p)
    best = 1 - p**c
    for a in range(c):
        mu = mp.sqrt((c - a) * (1 / s**2 + mo2))
        best = max(best, 1 - p**a + p**a * _dg(e - a * lnp, mu), _dg(e + a * lnp, mu))
    return best


def _events(n: int = 300) -> pa.Table:
    return pa.table({"user_id": [i % 50 for i in range(n)], "url": [f"u{i % 7}" for i in range(n)],
                     "x": [float(i % 10) for i in range(n)], "y": [float(i % 10) - 5 for i in range(n)]})


#: each query's extra columns and their sensitivities at k rows per group (x in [0, 10], y in [-5, 5])
_QUERIES = {
    "SELECT url, VARIANCE(y) FROM events GROUP BY url": lambda k: [k * 5, k, k * 25],
    "SELECT url, CORR(x, y) FROM events GROUP BY url": lambda k: [k, k * 5, k * 5, k * 25, k * 25, k * 25],
    "SELECT url, AVG(x), SUM(y) FROM events GROUP BY url": lambda k: [k * 5, k, k * 5],
}


@pytest.mark.parametrize("c_u,k", [(1, 1), (3, 2), (7, 3)])
@pytest.mark.parametrize("sql", list(_QUERIES))
def test_sparse_histogram_with_extra_columns_meets_theorem_5_4(c_u: int, k: int, sql: str) -> None:
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=100, delta=0.5))
    s.register("events", _events(), privacy_unit="user_id", max_groups_per_unit=c_u, max_rows_per_group=k,
               columns={"x": {"bounds": (0, 10)}, "y": {"bounds": (-5, 5)}})
    for eps, delta in [(0.1, 1e-9), (1.0, 1e-6)]:
        p = s.explain(sql, epsilon=eps, delta=delta).parameters
        sig, ts, tau = p["sigma"], p["tau_star"], p["tau"]
        extra = p["extra_columns"]
        assert sorted(c["sensitivity"] for c in extra.values()) == sorted(float(v) for v in _QUERIES[sql](k))
        for c in extra.values():
            assert c["sigma"] >= c["sensitivity"] * sig * (1 - 2**-52)
        mo2 = mp.mpf(len(extra)) / mp.mpf(sig) ** 2
        at = _gshm(eps, sig, ts - tau, c_u, mo2)
        assert at <= mp.mpf(delta) * (1 - mp.mpf(2) ** -34), (sql, eps, delta)
        assert _gshm(eps, sig, ts - 1 - tau, c_u, mo2) > mp.mpf(delta)


# ----------------------------------------------------------------------------- the ledger records what explain says


def test_the_ledger_records_the_cost_explain_states_on_every_route() -> None:
    n = 400
    ev = pa.table({"user_id": [i % 40 for i in range(n)], "url": [f"u{i % 7}" for i in range(n)],
                   "c": [f"c{i % 3}" for i in range(n)], "x": [float(i % 10) for i in range(n)],
                   "age": [i % 90 for i in range(n)]})
    cust = pa.table({"id": list(range(40)), "seg": [f"s{i % 2}" for i in range(40)]})
    orders = pa.table({"oid": list(range(400)), "customer_id": [i % 40 for i in range(400)],
                       "total": [float(i % 50) for i in range(400)]})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=1000, delta=0.5))
    use_noise(s, seeded_noise("round67b-ledger"))
    s.register("events", ev, privacy_unit="user_id", max_groups_per_unit=3, max_rows_per_group=2,
               columns={"x": {"bounds": (0, 10)}, "c": {"domain": ["c0", "c1", "c2"]}, "age": {"bounds": (0, 90), "bins": 90}})
    s.register("customers", cust, privacy_unit="id", max_groups_per_unit=1, columns={"seg": {"domain": ["s0", "s1"]}})
    s.register("orders", orders, references={"customer_id": "customers.id"}, degree_bounds={"customer_id": 16},
               columns={"total": {"bounds": (0, 50)}})
    j = "FROM orders o JOIN customers c ON o.customer_id = c.id"
    cases = [
        ("SELECT url, COUNT(*), SUM(x) FROM events GROUP BY url", {}, 0.7, 3e-7),
        ("SELECT c, COUNT(*) FROM events GROUP BY c", {}, 0.3, 0.0),
        ("SELECT COUNT(*), MEDIAN(x) FROM events", {}, 0.7, 3e-7),
        ("SELECT age, COUNT(*) FROM events GROUP BY age", {}, 0.7, 3e-7),
        ("SELECT url, c, COUNT(*) FROM events GROUP BY ROLLUP (url, c)", {}, 1.0, 1e-6),
        ("SELECT c, COUNT(*) FROM events GROUP BY c UNION ALL SELECT url, COUNT(*) FROM events GROUP BY url", {}, 0.7, 3e-7),
        (f"SELECT COUNT(*), AVG(o.total) {j}", {}, 0.7, 3e-7),
        (f"SELECT COUNT(*) {j}", {"mechanism": "r2t"}, 0.3, 0.0),
        (f"SELECT c.seg, COUNT(*), SUM(o.total) {j} GROUP BY c.seg", {}, 0.7, 3e-7),
        (f"SELECT c.seg, COUNT(*) {j} GROUP BY c.seg", {"mechanism": "dp_s4s"}, 0.7, 3e-7),
        (f"SELECT COUNT(DISTINCT c.id) {j}", {}, 0.7, 3e-7),
    ]
    recorded = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for sql, opts, eps, delta in cases:
            cost = s.explain(sql, epsilon=eps, delta=delta, options=opts).cost
            s.query(sql, epsilon=eps, delta=delta, options=opts)
            row = s.history().to_pylist()[-1]
            assert (row["epsilon"], row["delta"]) == (cost.epsilon, cost.delta), sql
            assert cost.epsilon <= eps and Fraction(cost.delta) >= 0
            recorded.append(Budget(row["epsilon"], row["delta"]))
    # the ledger's spent total is the exact decimal sum of its rows (basic composition)
    total_e = sum((Fraction(repr(b.epsilon)) for b in recorded), Fraction(0))
    total_d = sum((Fraction(repr(b.delta)) for b in recorded), Fraction(0))
    assert s.ledger.spent() == compose(recorded) == Budget.from_exact(total_e, total_d)
    assert Fraction(repr(s.ledger.spent().epsilon)) >= total_e and Fraction(repr(s.ledger.spent().delta)) >= total_d
    # and what remains is the exact difference rounded down: asking exactly that much fits, one ulp more does not
    left = s.remaining()
    assert Fraction(repr(left.epsilon)) <= 1000 - total_e and Fraction(repr(left.delta)) <= Fraction("0.5") - total_d
    assert exact_sum_fits(recorded, left, Budget(1000, 0.5))
    assert not exact_sum_fits(recorded, Budget(math.nextafter(left.epsilon, 2e3), left.delta), Budget(1000, 0.5))


# ----------------------------------------------------------------------------- per-person clipping composed as one Gaussian


def _least_sigma(eps: float, delta: float, sens: float) -> mp.mpf:
    lo, hi = mp.mpf("1e-6"), mp.mpf("1e12")
    for _ in range(200):
        mid = mp.sqrt(lo * hi)
        if _dg(mp.mpf(eps), mp.mpf(sens) / mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def test_clipped_runs_composed_as_one_gaussian_at_40_digits() -> None:
    """Three base aggregates over a join with one person per tuple: each run at (epsilon, delta/3) for sqrt(3) times
    its clipped sensitivity C(1 + 2^-30) with its Gaussian part 0.9 of its delta (docs: sigma = 85.9 for a count at
    epsilon = 3, delta = 3e-6, Delta = 32, against 135.9 for the split)."""
    cust = pa.table({"id": list(range(40)), "seg": [f"s{i % 2}" for i in range(40)]})
    orders = pa.table({"oid": list(range(400)), "customer_id": [i % 40 for i in range(400)],
                       "total": [float(i % 50) for i in range(400)]})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=100, delta=0.5))
    s.register("customers", cust, privacy_unit="id", max_groups_per_unit=1, columns={"seg": {"domain": ["s0", "s1"]}})
    s.register("orders", orders, references={"customer_id": "customers.id"}, degree_bounds={"customer_id": 32},
               columns={"total": {"bounds": (0, 50)}})
    p = s.explain("SELECT c.seg, COUNT(*), SUM(o.total), AVG(o.total) FROM orders o JOIN customers c "
                  "ON o.customer_id = c.id GROUP BY c.seg", epsilon=3.0, delta=3e-6)
    assert (p.cost.epsilon, p.cost.delta) == (3.0, 3e-6)
    runs = p.parameters["aggregates"]
    assert len(runs) == 3
    dj = sum((Fraction(r["budget"]["delta"]) for r in runs), Fraction(0))
    assert dj <= Fraction(3e-6)
    for r in runs:
        q = r["parameters"]
        clip, sigma, dg = q["clip_norm"], q["sigma"], q["delta_gaussian"]
        assert clip == 32.0 * (50.0 if r["aggregate"].startswith("SUM") else 1.0)
        need = _least_sigma(3.0, dg, math.sqrt(3) * clip * (1 + 2.0**-30))
        assert mp.mpf(sigma) >= need and float(mp.mpf(sigma) / need - 1) < 1e-8
        assert q["fp_delta"] + dg <= r["budget"]["delta"]
    count = next(r for r in runs if r["aggregate"] == "COUNT(*)")["parameters"]["sigma"]
    assert count == pytest.approx(85.9422416764, rel=1e-9)
    assert float(_least_sigma(1.0, 9e-7, 32 * (1 + 2.0**-30))) == pytest.approx(135.8802653332, rel=1e-9)


# ----------------------------------------------------------------------------- the exponential mechanism's allowance


def test_quantile_float_slack_from_its_derivation() -> None:
    """r bounds a weight's relative error: d = d*(1 + theta), |theta| <= 2^-52, for d* >= -746, and exp within 2^-50;
    xi(N) = 4r - ln(1 - N e^r / S) - ln(1 - N (1 - gamma) / (gamma S)) recomputed at 40 digits."""
    assert WEIGHT_REL_ERROR >= 746 * 2.0**-52 + 2.0**-50
    for n in (2, 1001, 100_001):
        r, big = mp.mpf(WEIGHT_REL_ERROR), mp.mpf(WEIGHT_SCALE)
        ref = 4 * r - mp.log(1 - n * mp.e**r / big) - mp.log(1 - n * (1 - mp.mpf(GAMMA)) / (mp.mpf(GAMMA) * big))
        assert float_slack(n) >= ref * (1 - mp.mpf(10) ** -14)
        assert float(float_slack(n) / ref - 1) < 1e-12
    assert float_slack(100_001) < 3.9e-6


# ----------------------------------------------------------------------------- Theorem 5.4: branch and bound


def test_theorem_5_4_branch_and_bound_equals_brute_force() -> None:
    rnd = random.Random(67)
    for _ in range(250):
        c = rnd.choice([1, 2, 3, 10, 57, 400])
        sigma = 10 ** rnd.uniform(-1, 3)
        dtau = sigma * rnd.uniform(-1, 12)
        eps = 10 ** rnd.uniform(-4, 1.5)
        mo = rnd.choice([0.0, rnd.uniform(0, 3) / sigma])
        got, want = _exact(eps, sigma, dtau, c, mo).delta, _exact_bruteforce(eps, sigma, dtau, c, mo)
        assert got == pytest.approx(want, rel=1e-13, abs=1e-300)
        assert got >= want * (1 - 1e-15)


# ----------------------------------------------------------------------------- exact sums of budgets


def test_budget_sums_are_exact_at_the_edges() -> None:
    assert compose([Budget(0.1), Budget(0.2)]) == Budget(0.3)
    assert exact_sum_fits([Budget(0.1)] * 9, Budget(0.1), Budget(1.0))
    assert not exact_sum_fits([Budget(0.1)] * 10, Budget(5e-324), Budget(1.0))
    tiny = [Budget(1.0, 1e-300)] * 3
    assert compose(tiny).delta >= 3e-300 and Fraction(repr(compose(tiny).delta)) >= 3 * Fraction("1e-300")
    assert exact_sum_fits(tiny, Budget(0.0, 1e-300), Budget(4.0, 4e-300))
    assert not exact_sum_fits(tiny, Budget(0.0, math.nextafter(1e-300, 1.0)), Budget(4.0, 4e-300))
    left = Budget(1.0, 1e-6).minus(compose([Budget(1 / 3, 1e-7)] * 2))
    assert exact_sum_fits([Budget(1 / 3, 1e-7)] * 2, left, Budget(1.0, 1e-6))
    assert not exact_sum_fits([Budget(1 / 3, 1e-7)] * 2, Budget(math.nextafter(left.epsilon, 2), left.delta),
                              Budget(1.0, 1e-6))


# ----------------------------------------------------------------------------- R2T: each run's sensitivity tau + G


def test_an_r2t_run_proves_at_most_its_share() -> None:
    """Was: a run was calibrated for the float sum fl(tau + G) of its threshold and the truncation's certified slack
    G = tau 2^-10, below the exact sum for tau = 7.1^4 = 2541.1680999999994 (tau_base 7.1), so at epsilon =
    9.943944177627777, GS = 1000 (lambda two ulps above 1024) the run proved epsilon/L (1 + 2.2e-18). Now the sum is
    rounded up: every run proves at most its share, there and on the 40 floats below."""
    from dpsql.mechanisms.s4s import r2t_calibration

    tau = 2541.1680999999994
    assert Fraction(tau + tau * 2.0**-10) < Fraction(tau) * (1 + Fraction(1, 1024))  # the premise (control)
    e = 9.943944177627777
    for _ in range(40):
        sched, snaps = r2t_calibration(e, 1000.0, 0.1, 7.1)
        share = Fraction(share_of(e, len(sched)))
        for s, (lam, _, bound) in zip(sched, snaps, strict=True):
            t = Fraction(float(s.tau))
            proven = t * Fraction(1025, 1024) / Fraction(lam) + Fraction(2) ** -45 * (Fraction(bound) / Fraction(lam) + 2)
            assert proven <= share, (e, s.tau)
        e = math.nextafter(e, 0.0)


# ----------------------------------------------------------------------------- DP-S4S at q = 1: each run within its slot


def test_an_unsampled_dp_s4s_run_proves_at_most_its_slot() -> None:
    """Was: at q = 1 a run's lambda = tau / (target / (1 + g)) came from float divisions only, and at epsilon =
    67.60498046875014, Delta = 100, tau_base 3 the run at tau = 27 (lambda two ulps above 2, no slack left in the
    snapping term) proved its slot epsilon'_i (1 + 1.04e-16); the runs' sum stayed within epsilon only by the other
    runs' slack (as close as 4e-19 relative on a scan). Each run is now checked in exact arithmetic."""
    from dpsql.mechanisms import s4s as s4s_mod

    e = 67.60498046875014
    for _ in range(30):
        steps = s4s_mod._s4s_steps(e, 100, 1.0, 0.1, 3.0, False, None)
        total = Fraction(0)
        for st in steps:
            t = Fraction(st.tau)
            lam = Fraction(st.snap_lambda)
            proven = t * Fraction(1025, 1024) / lam + Fraction(2) ** -45 * (Fraction(st.snap_bound) / lam + 2)
            assert proven <= Fraction(st.epsilon_prime), (e, st.tau)
            total += proven
        assert total <= Fraction(e)
        e = math.nextafter(e, 0.0)
