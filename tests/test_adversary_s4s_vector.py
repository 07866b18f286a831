"""Adversarial checks of GROUP BY over joins' joint charge ε* and its amplified floating-point check.

ε* = ln(1 + q′(e^ε − 1)), q′ = 1 − (1 − q)^Δ; on a fixed sample the float part δ_fp must satisfy
q′(δ_A + δ_fp) ≤ δ (``dpsql.mechanisms.s4s_vector``, "Floating point after amplification"). Numbers pinned
here are by hand; the float bound is recomputed from the published formulas (docs/mechanisms.md §3.9, §5.4),
independently of the module's code."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import dpsql  # noqa: E402
from dpsql.budget import Budget  # noqa: E402
from dpsql.errors import ConfigError, ExecutionError  # noqa: E402
from dpsql.mechanisms.s4s_vector import KAPPA, clip_params, vector_params  # noqa: E402
from dpsql.testing import use_noise, zero_noise  # noqa: E402

A, C = 2.0**-47, 2.0**-50  # the sampler's relative and absolute error bounds (§5.4)
SLIVER = 1.04 * 2 / (1 - A)
C0 = SLIVER * 2 * (0.242 * A + 0.399 * C)

QUERY = ("SELECT n.n_name, COUNT(*) AS cnt FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
         "JOIN nation n ON c.c_nationkey = n.n_nationkey GROUP BY n.n_name")


def _session(n_keys: int, seed: int) -> dpsql.Session:
    """A public key table of n_keys nations; customers (people) with at most 4 orders (Delta = 4, enforced)."""
    g = np.random.default_rng(seed)
    nc = 300
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("nation", pa.table({"n_nationkey": np.arange(n_keys), "n_name": [f"N{i:05d}" for i in range(n_keys)]}),
               public=True)
    s.register("customer", pa.table({"c_custkey": np.arange(nc), "c_nationkey": g.integers(0, n_keys, nc)}),
               privacy_unit="c_custkey", references={"c_nationkey": "nation.n_nationkey"})
    k = g.integers(0, 5, nc)
    s.register("orders", pa.table({"o_orderkey": np.arange(int(k.sum())), "o_custkey": np.repeat(np.arange(nc), k)}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 4})
    return s


def _slope(grid: float) -> float:
    return SLIVER * (A * math.sqrt(2 / math.pi) + C) / (grid * (1 - 2.0**-8))


def _ss_mean(gamma: float, eps1: float, theta0: float, n: int) -> float:
    """Ŝ of the docs, with the moment order p on an own grid (1, 1.01, …): any p ≥ 1 with 4pγ/ε₁ < 1 bounds."""
    s1 = 4 * gamma / eps1
    x = min((n / (1 - (p * s1) ** 2)) ** (1 / p) for p in (1 + i / 100 for i in range(4000)) if p * s1 < 1)
    return math.exp(gamma / KAPPA - 1) / gamma * (1 + math.exp(gamma * theta0 / KAPPA) / (1 - (2 * gamma / eps1) ** 2) * x)


def test_joint_epsilon_and_q_prime_by_hand_in_explain() -> None:
    """ε = 1, q = 1/16, Δ = 4: q′ = 1 − (15/16)⁴ = 14 911/65 536 = 0.227523804; e − 1 = 1.718281828;
    ε* = ln(1 + 0.227523804 · 1.718281828) = ln(1.390951186) = 0.329986979. Negative control: not ε."""
    s = _session(4, 1)
    p = s.explain(QUERY, epsilon=1.0, delta=1e-7, options={"mechanism": "dp_s4s", "q": 1 / 16})
    assert p.parameters["q_prime"] == pytest.approx(0.227523804, abs=1e-9)
    assert p.cost.epsilon == pytest.approx(0.329986979, abs=1e-8) and p.cost.delta == 1e-7
    assert p.cost.epsilon < 0.5
    s.close()


@pytest.mark.parametrize("eps,delta,d,q,tuples", [(4.0, 1e-7, 2526, 0.25, 7), (4.0, 1e-7, 2526, 1.0, 7),
                                                  (1.0, 1e-6, 500, 1 / 16, 4), (0.5, 1e-8, 50, 0.5, 2)])
def test_reported_float_part_passes_the_amplified_check_recomputed_independently(
        eps: float, delta: float, d: int, q: float, tuples: int) -> None:
    """From the public parameters alone: δ_fp ≤ (1 + e^ε)(d·(max_τ slope(γ_τ)·2τκη·Ŝ + c₀) + L·2⁻⁴⁰) and
    q′(δ_A + δ_fp) ≤ δ with q′ = 1 − (1 − q)^Δ; δ_A = (1 − s)δ with s one of the published shares."""
    vp = vector_params(eps, delta, d, q, tuples)
    qp = 1 - (1 - q) ** tuples
    theta0 = 30 / eps * math.log(6 / 0.1)
    n_tau = len(vp.taus)
    assert n_tau == math.ceil(math.log2(tuples)) + 1 and vp.eps1 == pytest.approx(eps / 10)
    mean = max(_slope(g) * 2 * t * KAPPA * vp.eta for g, t in zip(vp.grid, vp.taus)) * _ss_mean(vp.gamma, eps / 10, theta0,
                                                                                                   n_tau - 1) + C0
    fp = (1 + math.exp(eps)) * (d * mean + n_tau * 2.0**-40)
    assert vp.fp_share in (0.1, 0.25, 0.5, 0.75) and vp.delta_alg == pytest.approx((1 - vp.fp_share) * delta, rel=1e-12)
    assert vp.fp_delta == pytest.approx(fp, rel=1e-3)  # the published bound (moment order p on another grid)
    assert qp * (vp.delta_alg + fp) <= delta
    assert all(g > s / 32 for g, s in zip(vp.grid, vp.sigma_lo))  # 2^k times the greatest power of two <= sigma_lo/16


def test_the_charge_stands_and_nothing_is_released_when_the_public_key_set_grows_after_the_bind_check() -> None:
    """The bind check counts 4 public keys (δ = 2e-10 fits 4 groups but not 400); the run then reads 400 key rows:
    the run fails after its charge with the generic error, the ledger entry is failed and counts (ε*, δ) — the
    amount explain showed — and the session stays usable. ε* at ε = 4, q = 1/4, Δ = 4: 3.6280503 (by hand:
    ln(1 + (175/256)(e⁴ − 1)))."""
    s = _session(400, 2)
    use_noise(s, zero_noise())
    opts = {"mechanism": "dp_s4s", "q": 0.25}
    with pytest.raises(ConfigError, match="too small"):  # 400 public keys at delta = 2e-10: refused free
        s.explain(QUERY, epsilon=4.0, delta=2e-10, options=opts)
    eng = s._engine
    real = eng.fetch_arrow

    def stale_count(ast, *, what="the bounded query"):  # the key table had 4 rows when it was counted
        if what == "the public key set":
            return pa.table({"n": pa.array([4], pa.int64())})
        return real(ast, what=what)

    eng.fetch_arrow = stale_count
    plan = s.explain(QUERY, epsilon=4.0, delta=2e-10, options=opts)
    assert plan.cost.epsilon == pytest.approx(3.6280503, abs=1e-7)
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(ExecutionError, match="failed after its budget was charged") as e:
        s.query(QUERY, epsilon=4.0, delta=2e-10, options=opts)
    assert "400" not in str(e.value) and "delta" not in str(e.value)  # generic text only
    hist = s.history().to_pylist()
    assert len(hist) == rows + 1 and hist[-1]["status"] == "failed"
    assert hist[-1]["epsilon"] == pytest.approx(plan.cost.epsilon, rel=1e-12) and hist[-1]["delta"] == 2e-10
    assert before.epsilon - s.remaining().epsilon == pytest.approx(plan.cost.epsilon, rel=1e-9)
    assert before.delta - s.remaining().delta == pytest.approx(2e-10, rel=1e-6)
    eng.fetch_arrow = real
    r = s.query(QUERY, epsilon=4.0, delta=1e-7, options=opts)  # still usable; 400 keys fit at 1e-7
    assert r.table.num_rows == 400 and s.history().to_pylist()[-1]["status"] == "released"
    s.close()


def test_refusal_and_explain_do_not_depend_on_private_rows() -> None:
    """Same public key table, different private rows (other customers' nations and order counts): the refusal text
    (largest count, needed δ), explain's cost and parameters are identical, and nothing is charged."""
    texts, plans = [], []
    for seed in (3, 4):
        s = _session(400, seed)
        before = s.remaining()
        with pytest.raises(ConfigError) as e:
            s.query(QUERY, epsilon=4.0, delta=2e-10, options={"mechanism": "dp_s4s", "q": 0.25})
        texts.append(str(e.value))
        assert s.remaining() == before and s.history().num_rows == 0
        p = s.explain(QUERY, epsilon=4.0, delta=1e-7, options={"mechanism": "dp_s4s", "q": 0.25})
        plans.append((p.cost, {k: v for k, v in p.parameters.items() if k != "join"}))
        s.close()
    assert texts[0] == texts[1]
    assert "would answer 400 groups" in texts[0]
    assert plans[0] == plans[1]


def test_the_largest_answerable_key_count_is_not_a_release_of_zeros() -> None:
    """At ε = 4, δ = 1e-7, Δ = 4, q = 1 the refusal names 67 540 as the largest answerable count (docs §3.9).
    A grid γ ≥ 64σ would round every value with |v| ≪ γ/2 to 0 (a charged release of zeros): the grid is capped
    at 4σ_lo (4σ for clipping) and the limits are those of the cap. Control: at d = 30 000 the grid is ≈ 1.9σ_lo."""
    ok = vector_params(4.0, 1e-7, 30000, 1.0, 4)
    assert ok.grid[0] <= 2 * ok.sigma_lo[0]
    with pytest.raises(ConfigError, match="largest key count answerable at delta=1e-07 is 67540"):
        vector_params(4.0, 1e-7, 10**6, 1.0, 4)
    vp = vector_params(4.0, 1e-7, 67540, 1.0, 4)
    assert all(g <= 4 * s for g, s in zip(vp.grid, vp.sigma_lo))
    cp = clip_params(4.0, 1e-7, 101623, 4.0, True)
    assert cp.grid <= 4 * cp.sigma


def test_the_run_time_key_set_ignores_conditions_on_private_columns() -> None:
    """d (and so the refusal and the parameters) comes from public rows only: a WHERE conjunct that also reads a
    private column filters tuples, never keys (400 keys released); one over the public table alone filters keys
    (10). Control: the same conjunct moved onto the public table does change d."""
    s = _session(400, 5)
    use_noise(s, zero_noise())
    base = ("SELECT n.n_name, COUNT(*) AS cnt FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
            "JOIN nation n ON c.c_nationkey = n.n_nationkey WHERE {} GROUP BY n.n_name")
    opts = {"mechanism": "dp_s4s", "q": 0.25}
    for cond, d in (("n.n_nationkey < c.c_nationkey + 1 AND c.c_custkey < 5", 400), ("n.n_nationkey + c.c_custkey < 0", 400),
                    ("n.n_nationkey < 10", 10)):
        assert s.query(base.format(cond), epsilon=1.0, delta=1e-7, options=opts).table.num_rows == d
    s.close()
