"""Independent audit of the privacy accounting "to the last δ".

Three kinds of checks, each against a route that shares no code with dpsql:

* every number of the spec's vectors that no other test pinned (closed-form ratios, the theorem
  side of the quadrature checks, the float64 cross-check columns), and the 50-digit values at
  1e-12 relative rather than the vectors' looser tolerances;
* the parameters ``explain`` reports, recomputed from the spec's formulas in 40–60 digit mpmath
  (Theorem 5.4, δ_G, Lemma 3.1, the quantile sampler's ξ(N)) at edge parameters: the released
  (σ, τ*) meet the requested δ, σ is at most a hair above the least one, τ* is the least integer;
* composition: what the ledger records for a query is at least the exact sum of what its parts
  state, the grouping shares add up to the request, and every calibrated value errs on the safe side.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import mpmath as mp
import pyarrow as pa
import pytest
from _vectors import load_vectors

import dpsql
from dpsql.accounting import (
    gaussian_delta,
    gaussian_sigma,
    s4s_epsilon_prime,
    sparse_histogram_delta,
    sparse_histogram_min_tau_star,
    zcdp_delta,
    zcdp_to_dp,
)

# ----------------------------------------------------------------------------- references (mpmath)
DPS = 50


def _dg(eps: mp.mpf, mu: mp.mpf) -> mp.mpf:
    """δ_G(ε; μ) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (spec §1.2), any real ε."""
    if mu == 0:
        return max(mp.mpf(0), -mp.expm1(eps))
    return mp.ncdf(-eps / mu + mu / 2) - mp.e**eps * mp.ncdf(-eps / mu - mu / 2)


def _gshm(eps: float, sigma: float, dtau: float, c: int, mo2: float | mp.mpf = 0) -> mp.mpf:
    """Theorem 5.4 (spec §1.5), term by term, a₌ = 0 … C_u − 1."""
    with mp.workdps(DPS):
        e, s, d = mp.mpf(eps), mp.mpf(sigma), mp.mpf(dtau)
        p = mp.ncdf(d / s)
        lnp = mp.log(p)
        best = 1 - p**c
        for a in range(c):
            mu = mp.sqrt((c - a) * (1 / s**2 + mp.mpf(mo2)))
            best = max(best, 1 - p**a + p**a * _dg(e - a * lnp, mu), _dg(e + a * lnp, mu))
        return best


def _sigma_min(eps: float, delta: float, sens: float) -> mp.mpf:
    """The least σ with δ_G(ε; sens/σ) ≤ δ, by bisection in log σ at 50 digits."""
    with mp.workdps(DPS):
        lo, hi = mp.mpf("1e-8"), mp.mpf("1e15")
        for _ in range(300):
            mid = mp.sqrt(lo * hi)
            if _dg(mp.mpf(eps), mp.mpf(sens) / mid) > mp.mpf(delta):
                lo = mid
            else:
                hi = mid
        return hi


def _eps_prime(eps: float, tau: float, n: int, q: float) -> mp.mpf:
    """Lemma 3.1 summed term by term (not the PGF form dpsql uses)."""
    with mp.workdps(DPS):
        e, t, qq = mp.mpf(eps), mp.mpf(tau), mp.mpf(q)
        pk = [mp.binomial(n, k) * qq**k * (1 - qq) ** (n - k) for k in range(n + 1)]
        ft = min(int(math.floor(tau)), n)
        tail = mp.fsum(pk[ft + 1 :])
        up = mp.fsum(pk[k] * mp.e ** (k * e / t) for k in range(ft + 1)) + tail * mp.e**e
        lo = mp.fsum(pk[k] * mp.e ** (-k * e / t) for k in range(ft + 1)) + tail * mp.e ** (-e)
        return max(mp.log(up), -mp.log(lo))


# ----------------------------------------------------------------------------- vector values not pinned elsewhere
def test_vector_single_group_closed_form_ratio() -> None:
    """``C_u=1_closed_form_ratio`` = Φ⁻¹(1 − δ + δ_G)/Φ⁻¹(1 − δ) (spec §1.7), from dpsql's least margins."""
    cases = [c for c in load_vectors("sparse_histogram.json")["minimal_threshold"]["cases"] if c["C_u"] == 1]
    assert len(cases) == 8
    for c in cases:
        ex = sparse_histogram_min_tau_star(c["eps"], c["delta"], sigma=c["sigma"], tau=1, max_groups=1) - 1
        ad = sparse_histogram_min_tau_star(
            c["eps"], c["delta"], sigma=c["sigma"], tau=1, max_groups=1, method="add_the_deltas"
        ) - 1
        # dpsql solves for δ·(1 − DELTA_EVAL_MARGIN): the margins sit up to ~2e-10 relative above the exact ones
        assert ad / ex == pytest.approx(c["C_u=1_closed_form_ratio"], rel=1e-9), c
        assert ex >= c["C_u=1_closed_form_exact"] and ad >= c["C_u=1_closed_form_add"]  # never below


def test_vector_independent_checks_theorem_side() -> None:
    """The theorem-side numbers of the quadrature checks, computed by dpsql's δ_G and Theorem 5.4."""
    for c in load_vectors("sparse_histogram.json")["independent_checks"]:
        if "term_from_theorem" in c:  # (a₊, a₌) = (1, 1), remove direction
            p = mp.ncdf(mp.mpf(c["dtau"]) / c["sigma"])
            mu = 1 / c["sigma"]
            t = 1 - float(p) + float(p) * gaussian_delta(c["eps"] - math.log(float(p)), mu)
            assert t == pytest.approx(c["term_from_theorem"], rel=1e-12)
            assert c["rel_diff"] <= 1e-12
        elif "theorem_dG(eps;sqrt(2)/sigma)" in c:
            got = gaussian_delta(c["eps"], math.sqrt(2) / c["sigma"])
            assert got == pytest.approx(c["theorem_dG(eps;sqrt(2)/sigma)"], rel=1e-12)
        elif "count_attaining" in c:  # C_u = 1: the sup is attained at a count c ≥ τ
            assert c["count_attaining"] >= c["tau"]
            got = sparse_histogram_delta(c["eps"], sigma=c["sigma"], tau=c["tau"], tau_star=c["tau_star"], max_groups=1)
            assert got == pytest.approx(c["theorem"], rel=1e-12)


def test_vector_float_cross_check_columns_at_1e12() -> None:
    g = load_vectors("gaussian_mechanism.json")
    for c in g["cases"]:
        if c["delta"] > 1e-300:
            d = gaussian_delta(c["eps"], c["mu"])
            ref = float(Decimal(c["delta_str"]))
            assert d == pytest.approx(ref, rel=1e-12), c
            assert d == pytest.approx(c["check_quadrature"], rel=1e-12), c
            assert d == pytest.approx(c["check_plrv"], rel=1e-12), c
    for r in load_vectors("sparse_histogram.json")["grid"]:
        d = sparse_histogram_delta(
            r["eps"], sigma=r["sigma"], tau=r["tau"], tau_star=r["tau_star"], max_groups=r["C_u"],
            mu_other=math.sqrt(r["mu_o2"]),
        )
        assert d == pytest.approx(float(Decimal(r["delta_exact_str"])), rel=1e-12), r
        assert d == pytest.approx(r["float64_logspace_impl"], rel=1e-12), r
    lem = load_vectors("dp_s4s.json")["lemma_3_1"]
    for c in lem["table3"] + lem["extra"]:
        e = s4s_epsilon_prime(c["eps"], c["tau"], c["Delta"], c["q"])
        assert e == pytest.approx(c["eps_prime_direct_50digits"], rel=1e-12), c
        assert e == pytest.approx(c["eps_prime_pgf_float64"], rel=1e-12), c
    o = load_vectors("conversions.json")["external_crosscheck_opendp"]
    assert zcdp_to_dp(o["rho"], o["delta"]) == pytest.approx(o["eps_ours"], rel=1e-12)
    assert zcdp_delta(o["rho"], 0.0) == pytest.approx(o["delta_at_eps0_ours"], rel=1e-12)


# ----------------------------------------------------------------------------- σ: rounded up, never down
@pytest.mark.parametrize("eps", [1e-6, 1e-3, 0.5, 5.0, 50.0])
@pytest.mark.parametrize("delta", [1e-100, 1e-12, 1e-6, 0.1, 0.999])
@pytest.mark.parametrize("sens", [1.0, math.sqrt(51914.0)])
def test_gaussian_sigma_meets_delta_at_50_digits(eps: float, delta: float, sens: float) -> None:
    s = gaussian_sigma(eps, delta, sens)
    with mp.workdps(DPS):
        got = _dg(mp.mpf(eps), mp.mpf(sens) / mp.mpf(s))
        assert got <= mp.mpf(delta), (eps, delta, sens, s)  # safe: the exact δ_G at the released σ
        smin = _sigma_min(eps, delta, sens)
        assert mp.mpf(s) >= smin
        # and not much above: δ_G is within DELTA_EVAL_MARGIN (≈1.2e-10) of δ, a tiny relative step in σ
        # except where δ_G is flat in σ (δ near 1)
        assert float(mp.mpf(s) / smin - 1) <= (1e-5 if delta > 0.5 else 1e-8)


# ----------------------------------------------------------------------------- explain, recomputed
def _events(n: int = 500) -> pa.Table:
    return pa.table({
        "user_id": [i % 50 for i in range(n)],
        "url": [f"u{i % 7}" for i in range(n)],
        "c": [f"c{i % 3}" for i in range(n)],
        "x": [float(i % 10) for i in range(n)],
    })


def _session(c_u: int, k: int) -> dpsql.Session:
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=100, delta=0.5))
    s.register("events", _events(), privacy_unit="user_id", max_groups_per_unit=c_u, max_rows_per_group=k,
               columns={"x": {"bounds": (0, 10)}, "c": {"domain": ["c0", "c1", "c2"]}})
    return s


@pytest.mark.parametrize("c_u,k", [(1, 1), (1, 3), (3, 2), (40, 1), (40, 3)])
@pytest.mark.parametrize("eps,delta", [(0.01, 1e-6), (1.0, 1e-6), (0.01, 0.1), (1.0, 0.1), (20.0, 0.1)])
def test_sparse_histogram_explain_meets_theorem_5_4(c_u: int, k: int, eps: float, delta: float) -> None:
    with pytest.warns(UserWarning) if eps > 10 else _nullcontext():
        p = _session(c_u, k).explain("SELECT url, COUNT(*) FROM events GROUP BY url", epsilon=eps, delta=delta).parameters
    sig, tau, ts, mo = p["sigma"], p["tau"], p["tau_star"], p["mu_other"]
    c = int(p["max_groups_per_unit"])
    assert c == c_u and ts == math.ceil(ts)
    # extra columns: σ_j = Δ_j σ (w = 1) and μ_o² = J/σ² (spec §1.11)
    extra = p["extra_columns"]
    for col in extra.values():
        assert col["sigma"] >= col["sensitivity"] * sig
    assert mo == pytest.approx(math.sqrt(len(extra)) / sig, rel=1e-15)
    at = _gshm(eps, sig, ts - tau, c, mp.mpf(mo) ** 2)
    assert at <= mp.mpf(delta)  # private at the released (σ, τ*)
    assert float(mp.mpf(p["exact_delta"]) / at - 1) == pytest.approx(0.0, abs=1e-12)  # explain's δ is exact
    assert _gshm(eps, sig, ts - 1 - tau, c, mp.mpf(mo) ** 2) > mp.mpf(delta)  # and τ* is the least integer
    # the fp tail is charged on top: recorded δ = δ + fp_delta, never less
    assert p["fp_delta"] > 0


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


@pytest.mark.parametrize(
    "sql,eps,delta,sens",
    [
        ("SELECT COUNT(*), SUM(x) FROM events", 0.3, 1e-7, math.sqrt(2)),  # 1 group, 2 columns
        ("SELECT c, AVG(x) FROM events GROUP BY c", 0.1, 3e-6, math.sqrt(6)),  # 3 groups × 2 columns
    ],
)
def test_basic_gaussian_explain_sigma_and_charge(sql: str, eps: float, delta: float, sens: float) -> None:
    s = _session(3, 2)
    r = s.query(sql, epsilon=eps, delta=delta)
    p = r.details
    assert p["l2_sensitivity"] == pytest.approx(sens, rel=1e-15)
    with mp.workdps(DPS):
        assert _dg(mp.mpf(eps), mp.mpf(p["l2_sensitivity"]) / mp.mpf(p["sigma"])) <= mp.mpf(delta)
        assert float(mp.mpf(p["sigma"]) / _sigma_min(eps, delta, p["l2_sensitivity"]) - 1) <= 1e-10
    led = s.history().to_pylist()[-1]
    assert Fraction(led["epsilon"]) >= Fraction(eps)
    # the ledger's δ is at least (the decimal asked, and its float) + fp_delta exactly, at most one float above
    want = max(Fraction(delta), Fraction(Decimal(repr(delta)))) + Fraction(p["fp_delta"])
    assert Fraction(led["delta"]) >= want
    assert float(Fraction(led["delta"]) - want) <= math.ulp(led["delta"])


@pytest.mark.parametrize(
    "sql,eps,delta,n",
    [
        ("SELECT c, url, COUNT(*) FROM events GROUP BY ROLLUP(c, url)", 0.7, 1e-6, 3),
        ("SELECT c, url, COUNT(*) FROM events GROUP BY GROUPING SETS((c),(url),())", 0.7, 1e-6, 3),
        ("SELECT c, url, COUNT(*), SUM(x) FROM events GROUP BY CUBE(c, url)", 0.9, 3e-6, 4),
    ],
)
def test_grouping_shares_and_ledger_sum(sql: str, eps: float, delta: float, n: int) -> None:
    s = _session(3, 2)
    r = s.query(sql, epsilon=eps, delta=delta)
    comps = r.details["components"]
    assert len(comps) == n
    assert sum(Fraction(c["share"]) for c in comps) <= 1
    assert float(1 - sum(Fraction(c["share"]) for c in comps)) <= n * 2**-53
    led = s.history().to_pylist()[-1]
    sum_eps = sum(Fraction(c["cost"]["epsilon"]) for c in comps)
    sum_delta = sum(Fraction(c["cost"]["delta"]) for c in comps)
    assert sum_eps <= Fraction(led["epsilon"]) and Fraction(led["epsilon"]) == Fraction(eps)
    assert sum_delta <= Fraction(led["delta"])  # the ledger covers every part's δ and fp tail, exactly
    assert float(Fraction(led["delta"]) - sum_delta) <= math.ulp(led["delta"])
    for c in comps:
        par, ce, cd = c["parameters"], c["cost"]["epsilon"], c["cost"]["delta"]
        assert Fraction(cd) >= Fraction(par["fp_delta"])
        base = Fraction(cd) - Fraction(par["fp_delta"])  # the part's calibrated δ
        if c["mechanism"] == "sparse_histogram":
            at = _gshm(ce, par["sigma"], par["tau_star"] - par["tau"], int(par["max_groups_per_unit"]),
                       mp.mpf(par["mu_other"]) ** 2)
            assert at <= mp.mpf(base.numerator) / base.denominator
        else:
            with mp.workdps(DPS):
                mu = mp.mpf(par["l2_sensitivity"]) / mp.mpf(par["sigma"])
                assert _dg(mp.mpf(ce), mu) <= mp.mpf(base.numerator) / base.denominator


# ----------------------------------------------------------------------------- quantiles, DAWA, DP-S4S
def test_quantile_float_slack_and_split() -> None:
    from dpsql.mechanisms.quantile import GAMMA, WEIGHT_REL_ERROR, WEIGHT_SCALE, float_slack

    with mp.workdps(DPS):
        r, big, g = mp.mpf(WEIGHT_REL_ERROR), mp.mpf(WEIGHT_SCALE), mp.mpf(GAMMA)
        for n in (2, 1001, 100001):
            xi = 4 * r - mp.log(1 - n * mp.e**r / big) - mp.log(1 - n * (1 - g) / (g * big))
            assert float_slack(n) == pytest.approx(float(xi), rel=1e-15)
    s = _session(2, 3)
    p = s.explain("SELECT c, MEDIAN(x) FROM events GROUP BY c", epsilon=0.3, delta=0).parameters
    assert p["epsilon_per_release"] == pytest.approx(0.3 / 2, rel=1e-15)  # C = min(C_u, groups) = 2
    assert p["aggregates"][0]["utility_sensitivity"] == 3 * 0.5  # r·max(p, 1 − p)


def test_dawa_split_and_stage1_scales() -> None:
    t = pa.table({"user_id": [i % 50 for i in range(500)], "age": [i % 90 for i in range(500)]})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=10, delta=0))
    s.register("people", t, privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=3,
               max_rows_per_unit=4, columns={"age": {"bounds": (0, 90), "bins": 90}})
    p = s.explain("SELECT age, COUNT(*) FROM people GROUP BY age", epsilon=0.5).parameters
    e1, e2, k = p["epsilon1"], p["epsilon2"], p["l1_sensitivity"]
    assert Fraction(e1) + Fraction(e2) <= Fraction(0.5) and e1 == 0.25 * 0.5
    lmax = max(int(b) for b in p["stage1_noise_scales"])
    assert lmax == 64  # the longest dyadic candidate within 90 bins
    for b, scale in p["stage1_noise_scales"].items():
        want = (2 * (1 - 1 / int(b)) + 2 * (1 - 1 / lmax)) * k / e1  # (Δ_b + Δ_max)·k/ε₁, spec §2.4
        assert scale >= want  # snapping's allowance only adds noise
        assert scale <= want * (1 + 1e-3)


def _customers_and_orders(degree: int) -> dpsql.Session:
    """40 customers, 400 orders (10 each), the orders' degree bound per customer ``degree``; no ledger."""
    cust = pa.table({"id": list(range(40))})
    orders = pa.table({"oid": list(range(400)), "customer_id": [i % 40 for i in range(400)]})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=10, delta=0))
    s.register("customers", cust, privacy_unit="id", max_groups_per_unit=1)
    s.register("orders", orders, references={"customer_id": "customers.id"}, degree_bounds={"customer_id": degree})
    return s


def test_s4s_paper_schedule_from_explain() -> None:
    s = _customers_and_orders(degree=16)
    p = s.explain("SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id", epsilon=1.0,
                  options={"tau_base": 2}).parameters
    q, big_d = p["q"], p["Delta"]
    assert (q, big_d) == (0.0625, 16)
    sched = p["schedule"]
    assert [st["tau"] for st in sched] == [16.0, 8.0, 4.0, 2.0, 1.0]
    remaining, total = mp.mpf(1), mp.mpf(0)
    with mp.workdps(DPS):
        for i, st in zip(range(len(sched), 0, -1), sched, strict=True):
            ei = remaining / i
            epi = _eps_prime(float(ei), st["tau"], big_d, q)
            assert float(mp.mpf(st["epsilon"]) / ei - 1) == pytest.approx(0.0, abs=1e-12)
            assert float(mp.mpf(st["epsilon_prime"]) / epi - 1) == pytest.approx(0.0, abs=1e-12)
            bias = mp.mpf(st["tau"]) / ei * mp.log(3 * len(sched) / mp.mpf("0.1"))
            assert float(mp.mpf(st["bias"]) / bias - 1) == pytest.approx(0.0, abs=1e-12)
            # the run's noise costs less than its slot, leaving room for the snapping term
            at_lambda = _eps_prime(st["tau"] / st["laplace_scale"], st["tau"], big_d, q)
            assert at_lambda < mp.mpf(st["epsilon_prime"])
            remaining -= epi
            total += epi
        assert total <= 1


@pytest.mark.parametrize("opts,log_arg", [({"mechanism": "r2t"}, "L/beta"), ({"mechanism": "r2t", "tau_base": 2}, "L/beta")])
def test_r2t_schedule_and_its_bias_label(opts: dict, log_arg: str) -> None:
    """R2T (spec §3.3): τ_j = b^j, j = 1..L, L least with b^L ≥ GS; Lap(Lτ_j/ε); bias Lτ_j ln(L/β)/ε, in
    both bases. The paper's ln(3L/β) belongs to DP-S4S's Algorithm 2, not to R2T: with ``tau_base=2`` explain
    said "ln(3L/beta)" for R2T while its numbers are ln(L/β) (τ = 2, L = 7: 59.479 = 14 ln 70, not 14 ln 210)."""
    s = _customers_and_orders(degree=100)
    p = s.explain("SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id", epsilon=1.0,
                  options=opts).parameters
    base = float(opts.get("tau_base", 5.5))
    big_l = math.ceil(math.log(100) / math.log(base) - 1e-12)
    assert [st["tau"] for st in p["schedule"]] == [base**j for j in range(1, big_l + 1)]
    for st in p["schedule"]:
        assert st["laplace_scale"] == pytest.approx(big_l * st["tau"], rel=1e-15)
        assert st["bias"] == pytest.approx(big_l * st["tau"] * math.log(big_l / 0.1), rel=1e-14)
    assert log_arg in p["bias"] and "3L" not in p["bias"]


def test_vector_split_in_the_summary_table_is_the_one_explain_reports() -> None:
    """docs/mechanisms.md §6 said the grouped-join release used "ε/5 split" while §3.9 and explain give the SVT
    ε/10 and the release 9ε/10 (Lemma 4.2 holds for any split; the summary must name the one charged)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "mechanisms.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| DP-S4S vector |"))
    dpsql_cell = row.split("|")[2]
    assert "ε/10" in dpsql_cell and "9ε/10" in dpsql_cell and "ε/5 split" not in dpsql_cell
    cust = pa.table({"id": list(range(40)), "seg": [f"s{i % 2}" for i in range(40)]})
    orders = pa.table({"oid": list(range(400)), "customer_id": [i % 40 for i in range(400)]})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=10, delta=1e-5))
    s.register("customers", cust, privacy_unit="id", max_groups_per_unit=1, columns={"seg": {"domain": ["s0", "s1"]}})
    s.register("orders", orders, references={"customer_id": "customers.id"}, degree_bounds={"customer_id": 16})
    p = s.explain("SELECT c.seg, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.seg",
                  epsilon=4.0, delta=1e-7, options={"mechanism": "dp_s4s"}).parameters
    assert p["budget_split"]["svt_epsilon"] == "epsilon/10 per part"
    assert p["budget_split"]["release_epsilon"] == "9 epsilon/10 per part"
    # Lemma 4.2 at that split, from the parameters shown (ρ a hair below ε₂ − ln(1/δ_A)/(α − 1), never above)
    with mp.workdps(DPS):
        a, rho, d_a, qp = (mp.mpf(p[k]) for k in ("alpha", "rho", "delta_algorithm", "q_prime"))
        assert rho <= mp.mpf(3.6) - mp.log(1 / d_a) / (a - 1)
        lem = mp.log(1 + qp * mp.expm1(mp.mpf(0.4))) + (mp.log(1 + qp * mp.expm1((a - 1) * rho)) + mp.log(1 / d_a)) / (a - 1)
        assert mp.mpf(p["epsilon_lemma_4_2"]) >= lem
        assert float(mp.mpf(p["epsilon_lemma_4_2"]) / lem - 1) <= 1e-12


@pytest.mark.parametrize("opts", [{"sigma": 5.0, "tau_star": 21.2}, {"sigma": 4.2, "tau_star": 30.0}, {"sigma": 4.2}])
def test_a_refusals_least_sigma_or_tau_star_is_accepted_as_written(opts: dict) -> None:
    """The hint of a refused fixed (σ, τ*) names the least value that passes, rounded up at the shown digits: it
    named τ* ≥ 24.7671 at σ = 5 (ε = 1, δ = 1e-6, C_u = 1) where the least is 24.767121544…, so the value
    written back was refused again (δ = 1.00002e-06)."""
    import re

    from dpsql.errors import ConfigError

    s = _session(1, 1)
    sql = "SELECT url, COUNT(*) FROM events GROUP BY url"
    with pytest.raises(ConfigError) as ei:
        s.explain(sql, epsilon=1.0, delta=1e-6, options=opts)
    m = re.search(r"(tau_star|sigma) (?:to at least|>=|must be at least) ([0-9.e+-]+)", str(ei.value))
    assert m, str(ei.value)
    key, val = m.group(1), float(m.group(2))
    fixed = {**opts, key: val}
    p = s.explain(sql, epsilon=1.0, delta=1e-6, options=fixed).parameters
    assert p[key] >= val - 1e-12 * val
    assert _gshm(1.0, p["sigma"], p["tau_star"] - p["tau"], 1) <= mp.mpf(1e-6)


def test_case_study_calibration_through_explain() -> None:
    """URL-shares case study (C_u = 51914, ε = 0.349, δ = 1e-5): σ is the vector's σ_min rounded up by at most the
    evaluation margin, τ* the least integer above the closed-form margin σΦ⁻¹((1 − δ)^{1/C_u}) (the Gaussian part
    does not bind), and the sampler's δ for 51914 coordinates is charged on top, below δ."""
    cs = load_vectors("sparse_histogram.json")["case_study_facebook_urls"]
    t = pa.table({"user_id": [i % 50 for i in range(500)], "url": [f"u{i % 7}" for i in range(500)]})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=10, delta=1e-3))
    s.register("events", t, privacy_unit="user_id", max_groups_per_unit=51914, max_rows_per_group=1)
    p = s.explain("SELECT url, COUNT(*) FROM events GROUP BY url", epsilon=0.349, delta=1e-5).parameters
    smin = cs["min_sigma_gaussian_only"]
    assert smin <= p["sigma"] <= smin * (1 + 1e-10)
    with mp.workdps(DPS):
        pr = -mp.expm1(mp.log1p(-mp.mpf("1e-5")) / 51914)
        lb = -mp.mpf(p["sigma"]) * mp.sqrt(2) * mp.erfinv(2 * pr - 1)  # σΦ⁻¹(1 − p)
    assert p["tau_star"] == math.ceil(1 + float(lb))
    assert 0 < p["fp_delta"] < 1e-5


@pytest.mark.parametrize("gs", [1e9, 2.0**40, 2.0**62])
def test_tau_base_hints_pass_as_written(gs: float) -> None:
    """A grid with too many thresholds names the least tau_base that fits, rounded up: it named 1.38237 for
    GS = 1e9, which was refused again ("makes about 64 R2T thresholds")."""
    import re

    from dpsql.accounting.s4s import r2t_schedule, s4s_tau_grid
    from dpsql.errors import ConfigError

    for call in (lambda b: r2t_schedule(1.0, gs, 0.1, b), lambda b: s4s_tau_grid(gs, b)):
        with pytest.raises(ConfigError) as ei:
            call(1.0001)
        m = re.search(r"tau_base >= ([0-9.e+-]+)", str(ei.value))
        assert m, str(ei.value)
        call(float(m.group(1)))  # accepted as written


@pytest.mark.parametrize("eps,delta", [(4.0, 1e-7), (0.3, 1e-9), (1.0, 1e-5)])
def test_clip_norm_hint_passes_as_written(eps: float, delta: float) -> None:
    """A clip_norm too large for a count names the largest that fits, rounded down: it named 1.73e+14 at
    (ε, δ) = (4, 1e-7), above the limit, which was refused again."""
    import re

    from dpsql.errors import ConfigError

    cust = pa.table({"id": list(range(40)), "seg": [f"s{i % 2}" for i in range(40)]})
    orders = pa.table({"oid": list(range(400)), "customer_id": [i % 40 for i in range(400)]})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(epsilon=10, delta=1e-3))
    s.register("customers", cust, privacy_unit="id", max_groups_per_unit=1, columns={"seg": {"domain": ["s0", "s1"]}})
    s.register("orders", orders, references={"customer_id": "customers.id"}, degree_bounds={"customer_id": 16})
    sql = "SELECT c.seg, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.seg"
    with pytest.raises(ConfigError) as ei:
        s.explain(sql, epsilon=eps, delta=delta, options={"clip_norm": 2.0**63})
    m = re.search(r"clip_norm at most ([0-9.e+-]+)", str(ei.value))
    assert m, str(ei.value)
    s.explain(sql, epsilon=eps, delta=delta, options={"clip_norm": float(m.group(1))})  # accepted as written
