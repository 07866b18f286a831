"""Accounting to the last delta: the noise drawn is the noise accounted; extreme budgets, and clauses a view dropped.

* Message (fixed): a GROUP BY over keys released above a noisy threshold at a subnormal delta (5e-324; 1e-320 at
  C_u = 10^6; 1e-315 at C_u = 10^9) was refused with "could not find a feasible sigma", hint "report this as a bug".
  The refusal was right (before any charge) and is no fault: the threshold's delta_infinite = 1 - P^C_u cannot be
  computed that small in doubles, so no noisy threshold meets such a delta. It now says that the delta is too small.
* Crash (fixed, the accounting's public function only): ``dpsql.accounting.gaussian_sigma(1e300, 1e-6, 1e-300)``
  raised ZeroDivisionError (the least sigma underflowed to 0 and was divided by); it is now a ConfigError naming the
  parameters. Queries never reached it (their sensitivities are normalised to >= 1; a clip_norm that small is refused).
* Message (fixed): a DAWA release's recorded parameters (explain and the ledger row) gave epsilon2 as
  (1 - epsilon_split) * epsilon, while the run uses epsilon - epsilon1 stepped down until the two shares' exact sum is
  within epsilon: at epsilon = 0.1 (the default split) the row said epsilon1 = 0.025, epsilon2 = 0.07500000000000001,
  a sum above the 0.1 charged, where the run spent 0.025 + 0.075; at epsilon = 7.3, split 0.1, 0.73 + 6.57 (binary
  sum above 7.3) where the run used 6.569999999999999. The row now states the run's own shares.
* Wrong answer (fixed): USING SAMPLE in a subquery in FROM or in a CTE was dropped when the view was merged into the
  query, so `SELECT COUNT(*) FROM (SELECT * FROM t USING SAMPLE 10)` was charged and answered with the whole table's
  count (50 of 50 rows at zero noise), where the same clause on the outer query (and TABLESAMPLE anywhere) is refused
  for free ("sampling changes each person's contribution"). So were SELECT ... INTO and FOR UPDATE there. They are now
  refused for free in a view too, as in the outer query.
* Wrong answer (fixed): `SELECT * EXCLUDE (v)` in a subquery in FROM or a CTE was merged as `SELECT *` (the check of
  the star's modifiers read sqlglot's old key `except`; the parser names EXCLUDE `except_`), so
  `SELECT SUM(v) FROM (SELECT * EXCLUDE (v) FROM t)`, an error in SQL, was charged and answered with SUM(v). It is now
  refused for free like a view's * REPLACE and * RENAME; so is `* ILIKE '%w%'` (the columns whose names match),
  which was merged as * the same way (SUM(v) answered though the view keeps only w).

Held (recomputed here by routes that share no code with dpsql): every noise draw a release makes, recorded at the
NoiseSource, has the scale the accounting states, and no more draws are made than the release needs: DAWA's stage-1
Laplace on every candidate bucket at k (Delta_b + Delta_max) / epsilon1 (singleton 4 * 1.96875 / 0.25 = 31.5 over 64
bins with L = 4) and its stage-2 snapped Laplace at k / epsilon2 (5.333 -> 5.3368 after the snapping allowance); the
Laplace and Gaussian mechanisms over public keys (sigma_j = sigma * Delta_j, Delta_j = k and k * 10); the sparse
histogram's threshold noise on every group and its extra columns (COUNT(*) at k = 3, the centred AVG sum at
k (hi - lo) / 2 = 15) only on the released ones; a ROLLUP's three groupings each at its own share; DP-S4S's runs at
(tau_i + G_i) / epsilon_i (its RDP runs at their scheduled sigma_i), its epsilon'_i from Lemma 3.1's direct sum (0.033814, 0.251966 at Delta = 3, q = 1/16) and
the vector form's charge ln(1 + q'(e^epsilon - 1)) (2.345131 at epsilon = 4, q' = 1 - (15/16)^3), its SVT noises
2 kappa / epsilon1 and 4 kappa / epsilon1 (epsilon1 = epsilon / 10). The sparse histogram's exact delta (Theorem 5.4
recomputed over a_= = 0..C_u - 1) stays below the delta asked for C_u in {1, 2, 5, 37}, k in {1, 2, 3}, with
COUNT / SUM / AVG, epsilon in {0.05, 1, 8} and delta in {1e-10, 1e-6, 1e-3} (largest ratio 0.99999999988).
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from scipy.special import log_ndtr
from scipy.stats import binom

import dpsql
from dpsql.accounting import calibrate_sparse_histogram, gaussian_sigma
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.testing import SeededNoise, use_noise

sys.path.insert(0, str(Path(__file__).parent))

import _join_oracle_fuzz as fz  # noqa: E402


class Recording(SeededNoise):
    """Seeded noise that records the scale and size of every draw a mechanism makes."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.log: list[tuple[str, np.ndarray, Any]] = []

    def _note(self, kind: str, scale: Any, size: Any) -> None:
        self.log.append((kind, np.atleast_1d(np.asarray(scale, dtype=float)).copy(), size))

    def snap_laplace(self, values, lam, grid, bound):  # type: ignore[no-untyped-def]
        self._note("snap", lam, np.size(values))
        return super().snap_laplace(values, lam, grid, bound)

    def gaussian_noise(self, sigma, size):  # type: ignore[no-untyped-def]
        self._note("gauss", sigma, size)
        return super().gaussian_noise(sigma, size)

    def laplace(self, scale, size):  # type: ignore[no-untyped-def]
        self._note("laplace", scale, size)
        return super().laplace(scale, size)

    def of(self, kind: str) -> list[tuple[np.ndarray, Any]]:
        return [(s, n) for k, s, n in self.log if k == kind]


@pytest.fixture(scope="module")
def one_table() -> Any:
    rng = np.random.default_rng(0)
    n = 3000
    t = pa.table({"uid": rng.integers(0, 1000, n), "d": rng.integers(0, 64, n), "g": rng.choice(["a", "b"], n),
                  "h": rng.choice(list("xyz"), n), "v": rng.uniform(0, 10, n)})
    s = dpsql.Session(budget=Budget(1e9, 0.9))
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=2, max_rows_per_group=3, max_rows_per_unit=4, version="v1",
               columns={"d": {"ordered": {"lo": 0, "hi": 64, "bins": 64}}, "g": {"domain": ["a", "b"]},
                        "v": {"bounds": (0, 10)}})
    yield s
    s.close()


@pytest.fixture(scope="module")
def joins() -> Any:
    s = fz.session(fz.data(5, n=60))
    yield s
    s.close()


def run(s: Any, sql: str, epsilon: float, delta: float = 0.0, options: Any = None) -> tuple[Any, Recording, Any]:
    rec = Recording(1)
    use_noise(s, rec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = s.explain(sql, epsilon=epsilon, delta=delta, options=options)
        out = s.query(sql, epsilon=epsilon, delta=delta, options=options)
    return out, rec, plan.parameters


def one_scale(scales: np.ndarray) -> float:
    u = np.unique(scales)
    assert u.size == 1, u
    return float(u[0])


# ------------------------------------------------------------------------------------------------ fixed findings


@pytest.mark.parametrize("c_u, delta", [(3, 5e-324), (1000, 5e-324), (10**6, 1e-320)])
def test_a_subnormal_delta_is_refused_as_too_small_not_as_a_bug(c_u: int, delta: float) -> None:
    """Was: ConfigError 'could not find a feasible sigma', hint 'report this as a bug'. Now: the delta is named too
    small for the threshold (floating point), with a usable delta in the hint."""
    with pytest.raises(ConfigError, match="too small for the sparse histogram") as e:
        calibrate_sparse_histogram(1.0, delta, tau=1, max_groups=c_u, extra_sensitivities=(), method="exact")
    assert "bug" not in str(e.value) and "1e-6" in str(e.value)


def test_a_subnormal_delta_is_refused_for_free_through_the_session(one_table: Any) -> None:
    before = one_table.history().num_rows
    with pytest.raises(ConfigError, match="too small for the sparse histogram"):
        one_table.query("SELECT h, COUNT(*) FROM t GROUP BY h", epsilon=1, delta=5e-324)
    assert one_table.history().num_rows == before


def test_the_smallest_normal_deltas_still_calibrate() -> None:
    """Control: down to the normal doubles the threshold calibrates (and meets the delta)."""
    for c_u, delta in [(3, 1e-300), (10**6, 1e-300), (1, 2.3e-308)]:
        cal = calibrate_sparse_histogram(1.0, delta, tau=1, max_groups=c_u, extra_sensitivities=(), method="exact")
        assert cal.exact_delta <= delta


def test_gaussian_sigma_whose_scale_underflows_is_a_config_error() -> None:
    """Was: ZeroDivisionError from gaussian_sigma(1e300, 1e-6, 1e-300). Now a ConfigError naming the parameters."""
    with pytest.raises(ConfigError, match="below the smallest double"):
        gaussian_sigma(1e300, 1e-6, 1e-300)


def test_gaussian_sigma_at_extreme_but_representable_scales() -> None:
    """Control: tiny sensitivities and huge epsilons whose sigma is a normal double are calibrated as before."""
    assert gaussian_sigma(1e300, 1e-6, 1.0) == pytest.approx(7.071067811865476e-151, rel=1e-9)
    assert gaussian_sigma(1.0, 1e-6, 1e-300) == pytest.approx(4.2246788893507254e-300, rel=1e-9)
    assert gaussian_sigma(1.0, 1e-6, 1.0) == pytest.approx(4.224678889350725, rel=1e-12)


@pytest.mark.parametrize("epsilon, split", [(0.1, None), (1.3, None), (0.9, None), (7.3, 0.1), (0.3, 0.7)])
def test_dawa_states_the_shares_its_run_uses(one_table: Any, epsilon: float, split: Any) -> None:
    """Was: epsilon2 = (1 - split) * epsilon in explain and the ledger (0.07500000000000001 at epsilon = 0.1), one ulp
    above the run's and with epsilon1 above epsilon. Now the stated shares are the stored synopsis's, within epsilon."""
    opts = {"reuse": "never", **({} if split is None else {"epsilon_split": split})}
    out, rec, params = run(one_table, "SELECT d, COUNT(*) FROM t GROUP BY d", epsilon, 0.0, opts)
    e1, e2 = params["epsilon1"], params["epsilon2"]
    assert Fraction(e1) + Fraction(e2) <= Fraction(repr(epsilon))  # as binary numbers and as the decimal charged
    assert Fraction(repr(e1)) + Fraction(repr(e2)) <= Fraction(repr(epsilon))
    row = one_table.history().to_pylist()[-1]
    stored = json.loads(row["synopsis"])
    assert (stored["epsilon1"], stored["epsilon2"]) == (e1, e2) == (out.details["epsilon1"], out.details["epsilon2"])
    assert json.loads(row["params"])["epsilon2"] == e2


def test_dawa_shares_where_the_product_is_already_exact(one_table: Any) -> None:
    """Control: where (1 - split) * epsilon is the run's share (epsilon = 1), it is stated as before."""
    out, rec, params = run(one_table, "SELECT d, COUNT(*) FROM t GROUP BY d", 1.0, 0.0, {"reuse": "never"})
    assert (params["epsilon1"], params["epsilon2"]) == (0.25, 0.75)


@pytest.mark.parametrize("sql, what", [
    ("SELECT COUNT(*) FROM (SELECT * FROM t USING SAMPLE 10)", "USING SAMPLE"),
    ("SELECT SUM(v) FROM (SELECT * FROM t USING SAMPLE 10 PERCENT (bernoulli, 7))", "USING SAMPLE"),
    ("WITH x AS (SELECT * FROM t USING SAMPLE 10) SELECT g, COUNT(*) FROM x GROUP BY g", "USING SAMPLE"),
    ("SELECT COUNT(*) FROM (SELECT * INTO y FROM t)", "INTO"),
    ("WITH x AS (SELECT * FROM t FOR UPDATE) SELECT COUNT(*) FROM x", "FOR UPDATE"),
    ("SELECT SUM(v) FROM (SELECT * EXCLUDE (v) FROM t)", "EXCLUDE"),
    ("WITH x AS (SELECT t.* EXCLUDE (g) FROM t) SELECT g, COUNT(*) FROM x GROUP BY g", "EXCLUDE"),
    ("SELECT SUM(v) FROM (SELECT * FROM (SELECT * EXCLUDE (v) FROM t))", "EXCLUDE"),
    ("SELECT SUM(v) FROM (SELECT * ILIKE '%uid%' FROM t)", "ILIKE"),
    ("WITH x AS (SELECT * ILIKE '%d' FROM t) SELECT COUNT(*) FROM x", "ILIKE"),
])
def test_a_clause_a_view_cannot_merge_is_refused_for_free(one_table: Any, sql: str, what: str) -> None:
    """Was: the clause was dropped and the rest answered, charged (a sample answered over every row). Now refused
    before any charge, as the same clause on the outer query is."""
    before = one_table.history().num_rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match=what):
            one_table.query(sql, epsilon=1.0, delta=1e-6)
    assert one_table.history().num_rows == before


def test_the_outer_sample_is_refused_and_a_plain_view_answered(one_table: Any) -> None:
    """Controls: USING SAMPLE on the outer query was refused already; a view that only projects and filters is merged
    and answered (charged once)."""
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="SAMPLE"):
        one_table.query("SELECT COUNT(*) FROM t USING SAMPLE 10", epsilon=1.0, delta=1e-6)
    before = one_table.history().num_rows
    out, _, _ = run(one_table, "SELECT COUNT(*) AS n FROM (SELECT uid, v FROM t WHERE v > 5)", 1.0, 1e-6)
    assert one_table.history().num_rows == before + 1 and out.table.num_rows == 1


# ------------------------------------------------------------------------------------------------ held: the draws


def test_dawa_draws_its_stage_one_and_two_noise_at_the_stated_scales(one_table: Any) -> None:
    out, rec, params = run(one_table, "SELECT d, COUNT(*) FROM t GROUP BY d", 1.0, 0.0, {"reuse": "never"})
    assert out.mechanism == "dawa" and (out.cost.epsilon, out.cost.delta) == (1.0, 0.0)
    k, e1, e2 = 4.0, 0.25, 0.75  # L = 4 rows per person (< C_u k = 6); epsilon1 = epsilon / 4
    stage1 = rec.of("laplace")[0][0]
    d_max = 2 * (1 - 1 / 64)
    expected = {length: k * (2 * (1 - 1 / length) + d_max) / e1 for length in (1, 2, 4, 8, 16, 32, 64)}
    assert expected[1] == 31.5
    # every candidate's scale is its length's formula, raised by the floating-point allowance only (< 1e-4 relative)
    for length, b in expected.items():
        stated = params["stage1_noise_scales"][str(length)]
        assert b <= stated <= b * (1 + 1e-4)
    assert set(np.round(stage1, 9)) == {round(v, 9) for v in params["stage1_noise_scales"].values()}
    lam = one_scale(np.concatenate([s for s, _ in rec.of("snap")]))
    assert k / e2 <= lam <= k / e2 * 1.001  # the snapping allowance


def test_public_keys_draw_sigma_times_each_columns_sensitivity(one_table: Any) -> None:
    out, rec, params = run(one_table, "SELECT g, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY g", 1.0, 1e-6)
    sigma = gaussian_sigma(1.0, 1e-6, math.sqrt(2 * 2))  # C = min(C_u, 2 keys) = 2, m = 2 columns
    draws = [(one_scale(s), n) for s, n in rec.of("gauss")]
    assert draws == [(pytest.approx(3 * sigma, rel=1e-12), 2), (pytest.approx(30 * sigma, rel=1e-12), 2)]
    out, rec, params = run(one_table, "SELECT g, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY g", 1.0)
    lams = [one_scale(s) for s, _ in rec.of("snap")]
    eps_c = 1.0 / 4  # L1 sensitivity C m = 4 coordinates
    assert 3 / eps_c <= lams[0] <= 3 / eps_c * 1.001 and 30 / eps_c <= lams[1] <= 30 / eps_c * 1.001


def test_sparse_histogram_noises_every_group_once_and_released_ones_per_column(one_table: Any) -> None:
    out, rec, params = run(one_table, "SELECT h, COUNT(*) AS n, AVG(v) AS a FROM t GROUP BY h", 1.0, 1e-6)
    sigma = params["sigma"]
    draws = rec.of("gauss")
    assert one_scale(draws[0][0]) == sigma and draws[0][1] == 3  # the threshold noise: every group
    kept = out.table.num_rows
    rest = sorted((one_scale(s) / sigma, n) for s, n in draws[1:])
    # COUNT(*) at k = 3, the centred AVG sum at k (hi - lo) / 2 = 15, its count at k = 3: released groups only
    assert rest == [(pytest.approx(3.0), kept), (pytest.approx(3.0), kept), (pytest.approx(15.0), kept)]


def test_a_rollup_draws_each_grouping_at_its_own_share(one_table: Any) -> None:
    out, rec, params = run(one_table, "SELECT g, h, COUNT(*) AS n FROM t GROUP BY ROLLUP (g, h)", 1.0, 1e-6)
    comps = params["components"]
    assert [c["share"] for c in comps] == [pytest.approx(1 / 3)] * 3
    draws = [(one_scale(s), n) for s, n in rec.of("gauss")]
    # (g): public keys, C = 2, one column at k = 3; (): a scalar at L = 4
    third_e, third_d = 1 / 3, 1e-6 / 3
    assert (pytest.approx(3 * gaussian_sigma(third_e, third_d, math.sqrt(2)), rel=1e-9), 2) in draws
    assert (pytest.approx(4 * gaussian_sigma(third_e, third_d, 1.0), rel=1e-9), 1) in draws


def lemma_3_1(eps: float, tau: float, delta: int, q: float) -> float:
    """epsilon' of Sample-and-Truncate by the lemma's direct sum over K ~ Bin(Delta, q)."""
    k = np.arange(0, delta + 1)
    p = binom.pmf(k, delta, q)
    low = k <= math.floor(tau)
    up = float(np.sum(p[low] * np.exp(k[low] * eps / tau)) + np.sum(p[~low]) * math.exp(eps))
    down = float(np.sum(p[low] * np.exp(-k[low] * eps / tau)) + np.sum(p[~low]) * math.exp(-eps))
    return max(math.log(up), -math.log(down))


def test_dp_s4s_runs_and_their_amplified_costs(joins: Any) -> None:
    out, rec, params = run(joins, "SELECT COUNT(*) FROM orders o JOIN persons p ON o.pid = p.id", 1.0)
    sched = params["schedule"]
    assert [s["tau"] for s in sched] == [3.0, 1.0] and params["q"] == 0.0625 and params["Delta"] == 3
    assert sched[0]["epsilon"] == 0.5
    assert sched[0]["epsilon_prime"] == pytest.approx(lemma_3_1(0.5, 3.0, 3, 1 / 16), rel=1e-9)
    assert sched[0]["epsilon_prime"] == pytest.approx(0.033814, abs=1e-6)
    assert sched[1]["epsilon"] == pytest.approx(1.0 - sched[0]["epsilon_prime"], rel=1e-12)  # all that is left
    assert sched[1]["epsilon_prime"] == pytest.approx(lemma_3_1(sched[1]["epsilon"], 1.0, 3, 1 / 16), rel=1e-9)
    assert sched[1]["epsilon_prime"] == pytest.approx(0.251966, abs=1e-6)
    lams = sorted(float(v) for s, _ in rec.of("snap") for v in s)
    for s, lam in zip(sorted(sched, key=lambda s: s["laplace_scale"]), lams):
        assert lam == s["laplace_scale"]
        assert s["tau"] / s["epsilon"] <= lam <= s["tau"] / s["epsilon"] * 1.02  # tau + G (G = tau 2^-10), snapping
    assert params["joint_cost"]["epsilon_joint"] <= 1.0 and out.cost.epsilon == 1.0


def test_dp_s4s_rdp_runs_draw_their_scheduled_sigmas(joins: Any) -> None:
    out, rec, params = run(joins, "SELECT COUNT(*) FROM orders o JOIN persons p ON o.pid = p.id", 1.0, 1e-6)
    sigmas = sorted(s["sigma"] for s in params["schedule"])
    assert sorted(one_scale(s) for s, _ in rec.of("gauss")) == sigmas
    for s in params["schedule"]:  # sigma_i = (tau_i + G_i) sqrt(alpha / (2 rho_i)): the same alpha for every run
        assert s["sigma"] ** 2 * s["rho"] / (s["tau"] * (1 + 2.0**-10)) ** 2 == pytest.approx(
            params["schedule"][0]["sigma"] ** 2 * params["schedule"][0]["rho"]
            / (params["schedule"][0]["tau"] * (1 + 2.0**-10)) ** 2, rel=1e-6)
    assert params["joint_cost"]["epsilon"] <= 1.0 and (out.cost.epsilon, out.cost.delta) == (1.0, 1e-6)


def test_dp_s4s_vector_charge_and_svt_noise(joins: Any) -> None:
    out, rec, params = run(joins, "SELECT p.seg, COUNT(*) FROM orders o JOIN persons p ON o.pid = p.id GROUP BY p.seg",
                           4.0, 1e-7, {"mechanism": "dp_s4s"})
    q_prime = 1 - (15 / 16) ** 3
    assert params["q_prime"] == pytest.approx(q_prime, rel=1e-15)
    assert out.cost.epsilon == pytest.approx(math.log1p(q_prime * math.expm1(4.0)), rel=1e-12)
    assert out.cost.epsilon == pytest.approx(2.345131, abs=1e-6)
    svt = [one_scale(s) for s, _ in rec.of("laplace")]
    eps1 = 4.0 / 10
    assert svt[0] == params["svt_threshold_noise_scale"] == pytest.approx(2 * 1.001 / eps1)
    assert set(svt[1:]) == {params["svt_query_noise_scale"]} and params["svt_query_noise_scale"] == pytest.approx(4 * 1.001 / eps1)
    # the release's noise: sigma(S) (data dependent, never shown) is at least the public sigma_lo of its stopping tau
    (sig, d), = [(one_scale(s), n) for s, n in rec.of("gauss")]
    assert d == 3 and min(params["sigma_lo"]) * params["q"] <= sig * (1 + 1e-12)


# ------------------------------------------------------------------------------------------------ held: Theorem 5.4


def delta_g(eps: float, mu: float) -> float:
    a, b = mu / 2 - eps / mu, -mu / 2 - eps / mu
    la, lb = float(log_ndtr(a)), float(log_ndtr(b))
    return math.exp(la) * -math.expm1(eps + lb - la)


def theorem_5_4(eps: float, sigma: float, dtau: float, c_u: int, mu_o: float) -> float:
    ln_p = float(log_ndtr(dtau / sigma))
    best = -math.expm1(c_u * ln_p)
    for a in range(c_u):
        mu = math.sqrt((c_u - a) * (1 / sigma**2 + mu_o**2))
        p_a = math.exp(a * ln_p)
        best = max(best, 1 - p_a + p_a * delta_g(eps - a * ln_p, mu), delta_g(eps + a * ln_p, mu))
    return best


@pytest.mark.parametrize("c_u, k", [(1, 1), (2, 1), (5, 3), (37, 2)])
def test_sparse_histogram_meets_theorem_5_4_recomputed(c_u: int, k: int) -> None:
    t = pa.table({"uid": [1, 2, 3], "g": ["a", "b", "a"], "v": [1.0, 2.0, 3.0]})
    with dpsql.Session(budget=Budget(1e9, 0.9)) as s:
        s.register("t", t, privacy_unit="uid", max_groups_per_unit=c_u, max_rows_per_group=k,
                   columns={"v": {"bounds": (-3, 10)}})
        for sql in ["SELECT g, COUNT(*) AS n FROM t GROUP BY g", "SELECT g, COUNT(*) n, SUM(v) s, AVG(v) a FROM t GROUP BY g"]:
            for eps, delta in [(0.05, 1e-6), (1.0, 1e-6), (8.0, 1e-3), (1.0, 1e-3)]:
                p = s.explain(sql, epsilon=eps, delta=delta).parameters
                extra = p["extra_columns"]
                # COUNT(*) is the threshold's own count at k = 1, an extra column of sensitivity k above;
                # SUM: k max|bound| = 10 k; AVG: its centred sum k (hi - lo) / 2 = 6.5 k and its count k
                want: dict[str, float] = {"__a0": k} if k > 1 else {}
                if "SUM" in sql:
                    want.update({"__a1": 10.0 * k, "__a2_sum": 6.5 * k, "__a2_cnt": k})
                assert {c: v["sensitivity"] for c, v in extra.items()} == pytest.approx(want)
                mu_o = math.sqrt(sum((v["sensitivity"] / v["sigma"]) ** 2 for v in extra.values()))
                assert mu_o == pytest.approx(p["mu_other"], rel=1e-12)
                got = theorem_5_4(eps, p["sigma"], p["tau_star"] - p["tau"], c_u, mu_o)
                assert got <= delta
                # tau* is the least integer that meets it
                assert theorem_5_4(eps, p["sigma"], p["tau_star"] - 1 - p["tau"], c_u, mu_o) > delta * (1 - 2.0**-33)
