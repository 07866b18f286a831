"""The noise scale of every mechanism reachable through the Session, pinned by numbers written here.

Each test runs a query through the public API and checks three things against a number computed
by hand (never by calling dpsql): what ``explain`` states, what the ledger row records (and the
release's details), and the scale of the noise the mechanism actually drew (a recording noise
source). Goodness of fit of the noise actually added: ``test_calibration_gof.py``.

How the numbers were computed (once, offline, in a scratch script independent of dpsql)
--------------------------------------------------------------------------------------
* Gaussian sigma(eps, delta, D): the least sigma with
  Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D) <= delta (exact analytic
  Gaussian, Balle & Wang 2018; spec 1.2), by geometric bisection to 1e-16 relative, evaluated
  twice (math.erfc, and scipy.stats.norm.logcdf in log space); the two agree to 1e-12 and
  sigma(1, 1e-5, 1) matches the 50-digit inverse vector of gaussian_mechanism.json
  (3.730631634815942) to 1e-15. sigma(eps, delta, D) = D * sigma(eps, delta, 1) was checked.
* Basic mechanisms (dpsql/mechanisms/basic.py claim, spec 1.2): one unit touches C = min(C_u,
  #keys) groups (C = 1 for a scalar) and m released columns; column j has sensitivity Delta_j
  (1 for a count with k = 1, k * max|bound| for SUM, k (hi - lo)/2 for AVG's centred sum and k
  for its count). Gaussian: sigma_j = Delta_j * sigma(eps, delta, sqrt(C m)). Laplace (snapping,
  noise.py section 2): eps_c = eps/(C m); K = the largest K <= 40 with 2^-45 (2^(K+1) + 2) <=
  eps_c/1000; lambda_j = Delta_j / (eps_c - 2^-45 (2^(K+1) + 2)); grid Lambda_j = the least power
  of two >= lambda_j; bound B_j = 2^K Lambda_j.
* Sparse histogram (spec 1.5, 1.8; accounting/calibration.py): sigma = sigma(eps, delta,
  sqrt(C_u (1 + J))) for J extra columns (each extra column j gets Delta_j * sigma); tau* = the
  least integer >= tau + sigma Phi^-1((1 - delta)^(1/C_u)). Checked with our own implementation
  of Theorem 5.4 (spec 1.5): delta_GSHM(eps; sigma, tau*) <= delta and delta_GSHM at tau* - 1 >
  delta (values in the comments below).
* DAWA (spec 2.4 safe calibration, dpsql/mechanisms/dawa.py floating-point argument): eps1 =
  split * eps, eps2 = eps - eps1, k = max_rows_per_unit. Stage 1, candidate bucket of length L
  (dyadic lengths up to L_max, starts at multiples of max(1, L/2): n_c candidates):
  base_L = k (2 (1 - 1/L) + 2 (1 - 1/L_max)) / eps1; B1 = 2^20 max_L base_L; grid g = 2^e with
  n_c B1 2^-50 = m 2^e, m in [1/2, 1); slack = 4 g + 2^-47 (B1 + g);
  b_L = (base_L eps1 + k slack) / (eps1 - k 2^-47). Stage 2: snapped Laplace with L1 sensitivity
  k over the measured rows, of which one unit changes at most N (it depends on the released
  partition and is stored with the synopsis): lambda = k / (eps2 - N 2^-45 (2^(K+1) + 2)), K the
  largest with N 2^-45 (2^(K+1) + 2) <= eps2/1000.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from _calib import RecordingNoise, key_domain, last_ledger_row, spread_table, states

import dpsql
from dpsql.testing import use_noise

# --------------------------------------------------------------------------- Gaussian sigma
SIGMA_1 = 3.730631634815946  # sigma(eps=1, delta=1e-5, D=1)
SIGMA_SQRT2 = 5.275909854174823  # sigma(eps=1, delta=1e-5, D=sqrt 2) = sqrt 2 * SIGMA_1
SIGMA_SQRT6 = 19.73705381979614  # sigma(eps=0.5, delta=1e-6, D=sqrt 6)
SIGMA_2 = 8.44935777865368  # sigma(eps=1, delta=1e-6, D=2)

# --------------------------------------------------------------------------- Laplace (snapping)
# scalar COUNT, eps = 1: eps_c = 1, K = 34 (2^-45 (2^35 + 2) = 2^-10 + 2^-44 <= 1/1000 < 2^-9 + 2^-44)
LAMBDA_SCALAR = 1.0009775171066064  # 1 / (1 - 2^-10 - 2^-44)
GRID_SCALAR, BOUND_SCALAR = 2.0, 34359738368.0  # Lambda = 2, B = 2^34 * 2
# C_u = 3, COUNT + SUM(v in [0, 10]), eps = 1: eps_c = 1/6, K = 31 (2^-13 + 2^-44 <= 1/6000 < 2^-12)
LAMBDA_C3_COUNT = 6.004397752262006  # 1 / (1/6 - 2^-13 - 2^-44)
LAMBDA_C3_SUM = 60.043977522620054  # 10 / (1/6 - 2^-13 - 2^-44)
GRID_C3_COUNT, BOUND_C3_COUNT = 8.0, 17179869184.0  # Lambda = 8, B = 2^31 * 8
GRID_C3_SUM, BOUND_C3_SUM = 64.0, 137438953472.0  # Lambda = 64, B = 2^31 * 64

# --------------------------------------------------------------------------- sparse histogram
# eps = 1, delta = 1e-5, C_u = 1, tau = 1, COUNT only: sigma = SIGMA_1,
# tau + sigma Phi^-1(1 - 1e-5) = 16.910736514847574 -> tau* = 17
# (Theorem 5.4: delta at 17 = 1.0e-5 (the Gaussian part), at 16 = 2.90e-5)
TAU_STAR_S1 = 17.0
# eps = 0.5, delta = 1e-6, C_u = 3, tau = 5, COUNT + SUM(v in [0, 10]) (J = 1): sigma = SIGMA_SQRT6,
# SUM std 10 sigma = 197.3705381979614, 5 + sigma Phi^-1((1 - 1e-6)^(1/3)) = 103.10955053101945 -> 104
# (Theorem 5.4: delta at 104 = 1.0e-6, at 103 = 1.029e-6)
TAU_STAR_S2 = 104.0
SUM_SIGMA_S2 = 197.3705381979614
# eps = 1, delta = 1e-6, C_u = 2, tau = 2, COUNT + SUM (J = 1): sigma = SIGMA_2, SUM std 84.4935777865368,
# 2 + sigma Phi^-1((1 - 1e-6)^(1/2)) = 43.331203189433744 -> 44 (delta at 44 = 1.0e-6, at 43 = 1.22e-6)
TAU_STAR_S3 = 44.0
SUM_SIGMA_S3 = 84.4935777865368

# --------------------------------------------------------------------------- DAWA
# D1: histogram over 64 bins, eps = 1, split 0.25 (eps1 = 0.25, eps2 = 0.75), k = 1.
# L_max = 64, n_c = 64 + 63 + 31 + 15 + 7 + 3 + 1 = 184, base_L = 7.875 (L = 1) .. 15.75 (L = 64),
# B1 = 15.75 * 2^20, n_c B1 2^-50 = 2898 * 2^-30 -> g = 2^-18
DAWA1_STAGE1 = {
    1: 7.875061504543051,
    2: 11.875061504543165,
    4: 13.875061504543222,
    8: 14.87506150454325,
    16: 15.375061504543265,
    32: 15.625061504543272,
    64: 15.750061504543275,
}
DAWA1_STAGE1_SPEC = {1: 7.875, 64: 15.75}  # spec 2.4 before the floating-point slack
# stage 2, by N = the number of measured rows one unit can change (recorded with the synopsis; it
# depends on the released partition): (lambda, Lambda, B) = (1 / (0.75 - N 2^-45 (2^(K+1) + 2)), 2, 2^K 2)
# with K the largest with N 2^-45 (2^(K+1) + 2) <= 0.75/1000
DAWA1_STAGE2 = {
    1: (1.3342019543974952, 2.0, 17179869184.0),  # K = 33
    2: (1.3342019543975965, 2.0, 8589934592.0),  # K = 32
    3: (1.334636689475703, 2.0, 8589934592.0),  # K = 32
    4: (1.334201954397799, 2.0, 4294967296.0),  # K = 31
    5: (1.3344192865292568, 2.0, 4294967296.0),  # K = 31
    6: (1.3346366894760067, 2.0, 4294967296.0),  # K = 31
}
# D2: query_many over 100 bins, eps = 2, split 0.5 (eps1 = eps2 = 1), k = 3.
# L_max = 64, n_c = 100 + 99 + 49 + 24 + 11 + 5 + 2 = 290, base_L = 5.90625 (L = 1) .. 11.8125 (L = 64),
# B1 = 11.8125 * 2^20, n_c B1 2^-50 = 3425.625 * 2^-30 -> g = 2^-18
DAWA2_STAGE1 = {
    1: 5.9062960403972635,
    2: 8.906296040397327,
    4: 10.40629604039736,
    8: 11.156296040397375,
    16: 11.531296040397383,
    32: 11.718796040397388,
    64: 11.81254604039739,
}
# stage 2 by N (as above): lambda = 3 / (1 - N 2^-45 (2^(K+1) + 2)), Lambda = 4, B = 2^K 4
DAWA2_STAGE2 = {
    1: (3.002932551319819, 4.0, 68719476736.0),  # K = 34
    2: (3.00293255131999, 4.0, 34359738368.0),  # K = 33
    3: (3.0021988761304903, 4.0, 17179869184.0),  # K = 32
    4: (3.0029325513203315, 4.0, 17179869184.0),  # K = 32
    5: (3.0018321729579807, 4.0, 8589934592.0),  # K = 31
    6: (3.002198876131003, 4.0, 8589934592.0),  # K = 31
    7: (3.002565668907732, 4.0, 8589934592.0),  # K = 31
    8: (3.002932551321015, 4.0, 8589934592.0),  # K = 31
    9: (3.0016488549633684, 4.0, 4294967296.0),  # K = 30
    10: (3.0018321729588346, 4.0, 4294967296.0),  # K = 30
    11: (3.0020155133470197, 4.0, 4294967296.0),  # K = 30
    12: (3.0021988761320273, 4.0, 4294967296.0),  # K = 30
}


def _session(seed: str) -> tuple[dpsql.Session, RecordingNoise]:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    rec = RecordingNoise(seed)
    use_noise(s, rec)
    return s, rec


def _check_everywhere(plan: dpsql.Plan, row: dict, values: list[float], tol: float = 1e-9) -> None:
    """Each pinned value is stated by explain and recorded in the ledger row."""
    for v in values:
        assert states(plan.parameters, v, tol), f"explain does not state {v!r}: {plan.parameters}"
        assert states(row["params"], v, tol), f"the ledger row does not record {v!r}: {row['params']}"


# ============================================================================ basic Gaussian


def test_gaussian_scalar_count_c1() -> None:
    """Scalar COUNT(*), k = 1: C = 1, m = 1, sigma = sigma(1, 1e-5, 1)."""
    s, rec = _session("pin-gauss-scalar")
    s.register("t", pa.table({"uid": np.arange(50), "x": np.arange(50)}), privacy_unit="uid")
    sql = "SELECT COUNT(*) AS n FROM t"
    plan = s.explain(sql, epsilon=1.0, delta=1e-5)
    rel = s.query(sql, epsilon=1.0, delta=1e-5)
    assert rel.mechanism == "gaussian"
    _check_everywhere(plan, last_ledger_row(s), [SIGMA_1])
    assert states(rel.details, SIGMA_1)
    assert rec.scales("normal") == pytest.approx([SIGMA_1], rel=1e-9)
    assert rel.accuracy["n"]["noise_std"] == pytest.approx(SIGMA_1, rel=1e-9)
    assert rel.cost.epsilon == 1.0 and 1e-5 <= rel.cost.delta < 1.01e-5  # + the sampler's fp_delta
    s.close()


def test_gaussian_public_keys_c2() -> None:
    """GROUP BY public keys, C_u = 2, COUNT: D = sqrt 2, sigma = sigma(1, 1e-5, sqrt 2)."""
    s, rec = _session("pin-gauss-c2")
    s.register("t", spread_table(20, 2, 2), privacy_unit="uid", max_groups_per_unit=2,
               columns={"k": {"domain": key_domain(20)}})
    sql = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
    plan = s.explain(sql, epsilon=1.0, delta=1e-5)
    rel = s.query(sql, epsilon=1.0, delta=1e-5)
    _check_everywhere(plan, last_ledger_row(s), [SIGMA_SQRT2, math.sqrt(2.0)])
    assert states(rel.details, SIGMA_SQRT2)
    assert rec.scales("normal") == pytest.approx([SIGMA_SQRT2], rel=1e-9)
    s.close()


def test_gaussian_public_keys_c3_count_and_sum() -> None:
    """C_u = 3, m = 2 (COUNT + SUM, v in [0, 10]), eps = 0.5, delta = 1e-6: D = sqrt 6;
    the count gets sigma, the sum 10 sigma."""
    s, rec = _session("pin-gauss-c3")
    s.register("t", spread_table(30, 3, 3, value=4.0), privacy_unit="uid", max_groups_per_unit=3,
               columns={"k": {"domain": key_domain(30)}, "v": {"bounds": (0, 10)}})
    sql = "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY k"
    plan = s.explain(sql, epsilon=0.5, delta=1e-6)
    rel = s.query(sql, epsilon=0.5, delta=1e-6)
    _check_everywhere(plan, last_ledger_row(s), [SIGMA_SQRT6, 10 * SIGMA_SQRT6, math.sqrt(6.0)])
    assert states(rel.details, SIGMA_SQRT6)
    assert rec.scales("normal") == pytest.approx([SIGMA_SQRT6, 10 * SIGMA_SQRT6], rel=1e-9)
    assert rel.accuracy["n"]["noise_std"] == pytest.approx(SIGMA_SQRT6, rel=1e-9)
    assert rel.accuracy["total"]["noise_std"] == pytest.approx(10 * SIGMA_SQRT6, rel=1e-9)
    s.close()


def test_gaussian_avg() -> None:
    """AVG(v), v in [0, 10], C_u = 1: two noisy columns (centred sum, Delta 5; count, Delta 1), D = sqrt 2."""
    s, rec = _session("pin-gauss-avg")
    s.register("t", spread_table(20, 4, 1, value=3.0), privacy_unit="uid", max_groups_per_unit=1,
               columns={"k": {"domain": key_domain(20)}, "v": {"bounds": (0, 10)}})
    sql = "SELECT k, AVG(v) AS a FROM t GROUP BY k"
    plan = s.explain(sql, epsilon=1.0, delta=1e-5)
    s.query(sql, epsilon=1.0, delta=1e-5)
    _check_everywhere(plan, last_ledger_row(s), [SIGMA_SQRT2, 5 * SIGMA_SQRT2])
    assert rec.scales("normal") == pytest.approx([SIGMA_SQRT2, 5 * SIGMA_SQRT2], rel=1e-9)
    s.close()


# ============================================================================ basic Laplace (snapping)


def test_laplace_scalar_count() -> None:
    s, rec = _session("pin-lap-scalar")
    s.register("t", pa.table({"uid": np.arange(50), "x": np.arange(50)}), privacy_unit="uid")
    sql = "SELECT COUNT(*) AS n FROM t"
    plan = s.explain(sql, epsilon=1.0)
    rel = s.query(sql, epsilon=1.0)
    assert rel.mechanism == "laplace" and rel.cost == dpsql.Budget(1.0, 0.0)
    _check_everywhere(plan, last_ledger_row(s), [LAMBDA_SCALAR, GRID_SCALAR, BOUND_SCALAR], tol=1e-15)
    assert states(rel.details, LAMBDA_SCALAR, 1e-15)
    assert rec.scales("laplace") == pytest.approx([LAMBDA_SCALAR], rel=1e-15)
    assert rel.to_pylist()[0]["n"] % GRID_SCALAR == 0  # on the snapping grid
    s.close()


def test_laplace_public_keys_c3_count_and_sum() -> None:
    s, rec = _session("pin-lap-c3")
    s.register("t", spread_table(30, 3, 3, value=4.0), privacy_unit="uid", max_groups_per_unit=3,
               columns={"k": {"domain": key_domain(30)}, "v": {"bounds": (0, 10)}})
    sql = "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY k"
    plan = s.explain(sql, epsilon=1.0)
    rel = s.query(sql, epsilon=1.0)
    assert states(rel.details, LAMBDA_C3_COUNT, 1e-15) and states(rel.details, LAMBDA_C3_SUM, 1e-15)
    _check_everywhere(
        plan, last_ledger_row(s),
        [LAMBDA_C3_COUNT, LAMBDA_C3_SUM, GRID_C3_COUNT, BOUND_C3_COUNT, GRID_C3_SUM, BOUND_C3_SUM], tol=1e-15,
    )
    assert rec.scales("laplace") == pytest.approx([LAMBDA_C3_COUNT, LAMBDA_C3_SUM], rel=1e-15)
    out = rel.table
    assert all(v % GRID_C3_COUNT == 0 for v in out.column("n").to_pylist())
    assert all(v % GRID_C3_SUM == 0 for v in out.column("total").to_pylist())
    s.close()


# ============================================================================ sparse histogram


def _sparse(seed: str, groups: int, per_group: int, c_u: int, tau: int, value: float | None):
    s, rec = _session(seed)
    cols = {"v": {"bounds": (0, 10)}} if value is not None else None
    s.register("t", spread_table(groups, per_group, c_u, value=value), privacy_unit="uid",
               max_groups_per_unit=c_u, tau=tau, columns=cols)
    return s, rec


def test_sparse_histogram_c1() -> None:
    s, rec = _sparse("pin-sparse-c1", 5, 60, 1, 1, None)
    sql = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
    plan = s.explain(sql, epsilon=1.0, delta=1e-5)
    assert plan.mechanism == "sparse_histogram"
    rel = s.query(sql, epsilon=1.0, delta=1e-5)
    _check_everywhere(plan, last_ledger_row(s), [SIGMA_1, TAU_STAR_S1])
    assert states(rel.details, SIGMA_1)
    assert plan.parameters["tau_star"] == TAU_STAR_S1 and plan.parameters["tau"] == 1
    assert rec.scales("normal") == pytest.approx([SIGMA_1], rel=1e-9)
    assert rel.table.num_rows == 5  # counts 60 >= tau* + 11 sigma: every group released
    s.close()


def test_sparse_histogram_c3_count_and_sum() -> None:
    s, rec = _sparse("pin-sparse-c3", 4, 300, 3, 5, 2.0)
    sql = "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY k"
    plan = s.explain(sql, epsilon=0.5, delta=1e-6)
    assert plan.mechanism == "sparse_histogram"
    rel = s.query(sql, epsilon=0.5, delta=1e-6)
    _check_everywhere(plan, last_ledger_row(s), [SIGMA_SQRT6, SUM_SIGMA_S2, TAU_STAR_S2])
    assert states(rel.details, SUM_SIGMA_S2)
    assert plan.parameters["tau_star"] == TAU_STAR_S2 and plan.parameters["tau"] == 5
    assert rec.scales("normal") == pytest.approx([SIGMA_SQRT6, SUM_SIGMA_S2], rel=1e-9)
    assert rel.table.num_rows == 4  # counts 300 >= tau* + 9.9 sigma
    s.close()


def test_sparse_histogram_c2_count_and_sum() -> None:
    s, rec = _sparse("pin-sparse-c2", 4, 120, 2, 2, 2.0)
    sql = "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY k"
    plan = s.explain(sql, epsilon=1.0, delta=1e-6)
    rel = s.query(sql, epsilon=1.0, delta=1e-6)
    _check_everywhere(plan, last_ledger_row(s), [SIGMA_2, SUM_SIGMA_S3, TAU_STAR_S3])
    assert states(rel.details, SUM_SIGMA_S3)
    assert rec.scales("normal") == pytest.approx([SIGMA_2, SUM_SIGMA_S3], rel=1e-9)
    s.close()


# ============================================================================ DAWA


def _uniform_ordered(bins: int, per_bin: int, rows_per_unit: int) -> pa.Table:
    """x in 0..bins-1, every bin holding per_bin rows; each unit has rows_per_unit rows."""
    x = np.tile(np.arange(bins, dtype=np.int64), per_bin)
    uid = np.arange(x.size, dtype=np.int64) // rows_per_unit
    return pa.table({"uid": uid, "x": x})


def _stage1_scales(rec: RecordingNoise) -> np.ndarray:
    arrays = [s for k, s, _ in rec.draws if k == "laplace" and s.ndim == 1 and s.size > 1]
    assert len(arrays) == 1, "stage 1 draws one vector of Laplace noise, one scale per candidate bucket"
    return arrays[0]


def _stage2_scales(rec: RecordingNoise) -> list[float]:
    return sorted({float(s) for k, s, _ in rec.draws if k == "laplace" and s.ndim == 0})


def _synopsis(row: dict) -> dict:
    assert row["synopsis"], "the DAWA ledger row stores its synopsis"
    return json.loads(row["synopsis"])  # type: ignore[no-any-return]


def _check_stage2(rec: RecordingNoise, syn: dict, table: dict[int, tuple[float, float, float]]) -> None:
    """The stage-2 scale drawn and stored equals the pinned lambda for the recorded N."""
    n_rows = [int(v) for k, v in _walk(syn) if k == "changed_rows"]
    assert len(n_rows) == 1, "the stored synopsis records N, the measured rows one unit can change"
    assert n_rows[0] in table, f"N = {n_rows[0]}: extend the pinned table"
    lam, grid, bound = table[n_rows[0]]
    assert _stage2_scales(rec) == pytest.approx([lam], rel=1e-12)
    for v in (lam, grid, bound):
        assert states(syn, v, 1e-12), f"the stored synopsis does not record {v!r}"


def _walk(obj: object) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((k, v))
            out += _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _walk(v)
    return out


def test_dawa_histogram_scales() -> None:
    s, rec = _session("pin-dawa-1")
    s.register("t", _uniform_ordered(64, 40, 1), privacy_unit="uid", max_rows_per_unit=1, version="v1",
               columns={"x": {"bounds": (0, 64), "bins": 64}})
    sql = "SELECT x, COUNT(*) AS n FROM t GROUP BY x"
    plan = s.explain(sql, epsilon=1.0)
    assert plan.mechanism == "dawa" and plan.cost == dpsql.Budget(1.0, 0.0)
    assert states(plan.parameters, 0.25, 1e-15) and states(plan.parameters, 0.75, 1e-15)  # eps1, eps2
    rel = s.query(sql, epsilon=1.0)
    row = last_ledger_row(s)
    assert states(row["params"], 0.25, 1e-15) and states(row["params"], 0.75, 1e-15)
    # stage 1: 184 candidates, scale by length, singletons noised too (spec 2.4)
    st1 = _stage1_scales(rec)
    assert st1.size == 184
    assert sorted(set(st1.tolist())) == pytest.approx(sorted(DAWA1_STAGE1.values()), rel=1e-12)
    assert st1.min() == pytest.approx(DAWA1_STAGE1_SPEC[1], rel=1e-5)
    assert st1.max() == pytest.approx(DAWA1_STAGE1_SPEC[64], rel=1e-5)
    _check_stage2(rec, _synopsis(row), DAWA1_STAGE2)
    assert rel.table.num_rows == 64
    s.close()


def test_dawa_query_many_scales() -> None:
    s, rec = _session("pin-dawa-2")
    s.register("t", _uniform_ordered(100, 30, 3), privacy_unit="uid", max_rows_per_unit=3, version="v1",
               columns={"x": {"bounds": (0, 100), "bins": 100}})
    sqls = ["SELECT COUNT(*) FROM t WHERE x < 50", "SELECT COUNT(*) FROM t WHERE x >= 50",
            "SELECT COUNT(*) FROM t WHERE x >= 10 AND x < 90"]
    rel = s.query_many(sqls, epsilon=2.0, options={"epsilon_split": 0.5})
    assert rel.mechanism == "dawa" and rel.cost == dpsql.Budget(2.0, 0.0)
    row = last_ledger_row(s)
    assert states(row["params"], 1.0, 1e-15) and states(row["params"], 3.0, 1e-15)  # eps1 = eps2 = 1, k = 3
    st1 = _stage1_scales(rec)
    assert st1.size == 290
    assert sorted(set(st1.tolist())) == pytest.approx(sorted(DAWA2_STAGE1.values()), rel=1e-12)
    _check_stage2(rec, _synopsis(row), DAWA2_STAGE2)
    s.close()


def test_dawa_explain_and_ledger_state_stage1_scales() -> None:
    s, _rec = _session("pin-dawa-3")
    s.register("t", _uniform_ordered(64, 40, 1), privacy_unit="uid", max_rows_per_unit=1, version="v1",
               columns={"x": {"bounds": (0, 64), "bins": 64}})
    sql = "SELECT x, COUNT(*) AS n FROM t GROUP BY x"
    plan = s.explain(sql, epsilon=1.0)
    s.query(sql, epsilon=1.0)
    row = last_ledger_row(s)
    # the singleton and the largest stage-1 scale; 1e-5 accepts the spec value or the float-adjusted one
    for v in (DAWA1_STAGE1[1], DAWA1_STAGE1[64]):
        assert states(plan.parameters, v, 1e-5), f"explain does not state the stage-1 scale {v!r}"
        assert states(row["params"], v, 1e-5), f"the ledger row does not record the stage-1 scale {v!r}"
    s.close()


# spec vectors (tests/vectors/sparse_histogram.json, minimal_threshold, eps = 1, delta = 1e-6, tau = 1):
# sigma_min_gaussian_only = sigma(1, 1e-6, sqrt C_u) (our bisection agrees to 1e-15), and with sigma
# fixed by the caller, min_dtau_exact -> tau* = ceil(1 + min_dtau_exact). With sigma free, tau* =
# ceil(1 + sigma Phi^-1((1 - 1e-6)^(1/C_u))) computed by hand (Theorem 5.4 delta at tau* - 1 exceeds 1e-6).
SPARSE_VECTOR_CASES = [
    # (C_u, sigma option, pinned sigma, pinned tau*)
    (5, None, 9.446669179643115, 49.0),  # 1 + 47.884766227394 -> 49 (Thm 5.4 delta at 48: 1.63e-6)
    (5, 9.541136, 9.541136, 50.0),  # min_dtau_exact 48.36361454182186
    (100, None, 42.24678889326835, 239.0),  # 1 + 237.089028224403 -> 239
    (100, 42.289036, 42.289036, 239.0),  # min_dtau_exact 237.32611902562675
]


@pytest.mark.parametrize(("c_u", "sigma_opt", "sigma", "tau_star"), SPARSE_VECTOR_CASES)
def test_sparse_histogram_against_spec_vectors(c_u: int, sigma_opt: float | None, sigma: float, tau_star: float) -> None:
    s, rec = _session(f"pin-sparse-vec-{c_u}-{sigma_opt}")
    s.register("t", spread_table(5, 300, 5), privacy_unit="uid", max_groups_per_unit=c_u)
    sql = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
    opts = {"sigma": sigma_opt} if sigma_opt is not None else None
    plan = s.explain(sql, epsilon=1.0, delta=1e-6, options=opts)
    assert plan.mechanism == "sparse_histogram" and plan.parameters["tau_star"] == tau_star
    rel = s.query(sql, epsilon=1.0, delta=1e-6, options=opts)
    _check_everywhere(plan, last_ledger_row(s), [sigma, tau_star])
    assert states(rel.details, sigma) and states(rel.details, tau_star)
    assert rec.scales("normal") == pytest.approx([sigma], rel=1e-9)
    s.close()
