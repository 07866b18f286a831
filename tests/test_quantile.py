"""Quantiles (MIN, MAX, MEDIAN, PERCENTILE_CONT, QUANTILE): the exponential mechanism over a public
grid (``dpsql.mechanisms.quantile``, docs/mechanisms.md §9) and quantiles read from a stored DAWA
synopsis.

Calibration is pinned by numbers computed by hand; the output distribution is checked against
the mechanism's law on a small domain (chi-square, fixed seed, failure probability <= 1e-6) with
a negative control that must fail; the sensitivity by removing one person from generated data
and running the bounded SQL on both.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import chisquare

import dpsql
from dpsql.engine.duckdb_ops import SaltedDuckDBOps
from dpsql.errors import PolicyError, UnsupportedQueryError
from dpsql.mechanisms import quantile as qm
from dpsql.mechanisms.registry import route
from dpsql.rewrite.bound import Caps, bounded_value_histograms, source_name
from dpsql.rewrite.render import render
from dpsql.testing import seeded_noise, use_noise, zero_noise


def people(n: int = 1000, seed: int = 5, rows_per: int = 1) -> pa.Table:
    gen = np.random.default_rng(seed)
    pid = np.repeat(np.arange(n), rows_per)
    m = len(pid)
    return pa.table({
        "pid": pid.astype(np.int64),
        "age": gen.integers(18, 90, m).astype(np.int64),
        "sex": gen.integers(1, 3, m).astype(np.int64),
        "income": np.round(gen.lognormal(10, 0.8, m), 2),
    })


def session(table: pa.Table | None = None, *, max_rows_per_unit: int | None = 1, noise: Any = None,
            version: str | None = "v1", **kw: Any) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-5))
    use_noise(s, noise if noise is not None else seeded_noise("quantile"))
    s.register("people", table if table is not None else people(), privacy_unit="pid",
               max_rows_per_unit=max_rows_per_unit,
               columns={"age": {"bounds": (0, 100), "bins": 101}, "sex": {"domain": [1, 2]},
                        "income": {"bounds": (0, 200000), "granularity": 100}},
               version=version, **kw)
    return s


# -- parsing: the spellings analysts use ---------------------------------------------------------------

SPELLINGS = [
    ("SELECT MEDIAN(age) FROM people", "quantile", 0.5),
    ("SELECT median(age) AS m FROM people", "quantile", 0.5),
    ("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY age) FROM people", "quantile", 0.5),
    ("SELECT percentile_disc(0.25) within group (order by age) FROM people", "quantile", 0.25),
    ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC) FROM people", "quantile", 0.1),
    ("SELECT QUANTILE(age, 0.75) FROM people", "quantile", 0.75),
    ("SELECT QUANTILE_CONT(age, 0.75) FROM people", "quantile", 0.75),
    ("SELECT QUANTILE_DISC(age, 0.75) FROM people", "quantile", 0.75),
    ("SELECT APPROX_QUANTILE(age, 0.2) FROM people", "quantile", 0.2),
    ("SELECT MIN(age) FROM people", "min", 0.0),
    ("SELECT MAX(people.age) FROM people", "max", 1.0),
]


@pytest.mark.parametrize("sql,kind,p", SPELLINGS)
def test_spellings_map_to_one_quantile(sql: str, kind: str, p: float) -> None:
    s = session()
    r = route(sql, 1.0, 0.0, {}, s.tables, lambda k: None)
    assert r.description.label == "exponential"
    [a] = r.calibration.plan.aggregates
    assert (a.kind, a.column, a.quantile) == (kind, "age", p)


REFUSED = [
    ("SELECT QUANTILE(age, 1.5) FROM people", UnsupportedQueryError, "between 0 and 1"),
    ("SELECT QUANTILE(age, [0.1, 0.9]) FROM people", UnsupportedQueryError, "one quantile per call"),
    ("SELECT QUANTILE(age, x) FROM people", UnsupportedQueryError, "numeric literal"),
    ("SELECT MEDIAN(age + 1) FROM people", UnsupportedQueryError, "plain column"),
    ("SELECT MEDIAN(pid) FROM people", PolicyError, "needs value bounds"),
    ("SELECT PERCENTILE_CONT(0.5) FROM people", UnsupportedQueryError, "WITHIN GROUP"),
    ("SELECT MEDIAN(age) OVER () FROM people", UnsupportedQueryError, "window"),
    ("SELECT MEDIAN(age) - AVG(age) FROM people", PolicyError, "separate queries"),
]


@pytest.mark.parametrize("sql,cls,words", REFUSED)
def test_refusals_name_the_problem_and_spend_nothing(sql: str, cls: type, words: str) -> None:
    s = session()
    before = s.remaining()
    with pytest.raises(cls, match=words):
        s.query(sql, epsilon=1.0)
    assert s.remaining() == before


def test_sparse_keys_are_refused_with_the_fix() -> None:
    s = session(max_rows_per_unit=None)
    with pytest.raises(PolicyError, match="domain declared") as ei:
        s.query("SELECT age, MEDIAN(income) FROM people GROUP BY age", epsilon=1.0)
    assert "domain" in (ei.value.hint or "")


def test_forcing_another_mechanism_is_refused() -> None:
    s = session()
    with pytest.raises(PolicyError, match="exponential"):
        s.query("SELECT MEDIAN(age) FROM people", epsilon=1.0, options={"mechanism": "laplace"})
    with pytest.raises(PolicyError, match="answers quantiles"):
        s.query("SELECT COUNT(*) FROM people", epsilon=1.0, options={"mechanism": "exponential"})


# -- calibration pinned by hand --------------------------------------------------------------------------


def test_calibration_pinned_scalar() -> None:
    s = session()
    p = s.explain("SELECT MEDIAN(age), MIN(age) FROM people", epsilon=1.0, delta=1e-6)
    assert p.mechanism == "exponential"
    assert p.cost == dpsql.Budget(1.0, 0.0)  # pure DP: no delta spent
    med, mn = p.parameters["aggregates"]
    # two aggregates, one group: eps' = 1 / 2
    assert p.parameters["epsilon_per_release"] == pytest.approx(0.5)
    # median: Delta = L * max(p, 1 - p) = 0.5; 101 integer candidates on [0, 100]
    assert med["utility_sensitivity"] == 0.5 and med["candidates"] == 101 and med["grid_step"] == 1.0
    # t = (2 * 0.5 / (0.5 - xi)) * ln(101 / (0.05 - 2^-10)), xi = xi(101) = 2.94e-9 the sampler's
    # floating-point slack: 2 * ln(2060.2391) = 15.2611547 (by hand)
    assert med["rank_error_95"] == pytest.approx(15.2611547, abs=1e-6)
    # MIN: Delta = L = 1, t = 4 * ln(2060.2391) = 30.5223094, target c = ceil(t) = 31
    assert mn["utility_sensitivity"] == 1.0 and mn["rank_error_95"] == pytest.approx(30.5223094, abs=1e-6)
    assert mn["rank_target"] == 31


def test_calibration_pinned_grouped_and_grid() -> None:
    s = session(max_rows_per_unit=None, max_groups_per_unit=2, max_rows_per_group=3)
    p = s.explain("SELECT sex, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY income) FROM people GROUP BY sex",
                  epsilon=2.0)
    [a] = p.parameters["aggregates"]
    # C = min(C_u = 2, groups = 2) = 2, eps' = 2 / 2 = 1; Delta = k * 0.9 = 2.7
    assert p.parameters["epsilon_per_release"] == pytest.approx(1.0)
    assert a["utility_sensitivity"] == pytest.approx(2.7)
    # declared granularity 100 over [0, 200000]: 2001 candidates; p on the dyadic grid: 1 - p = 943718 / 2^20 =
    # 0.89999962, Delta = 3 * that; t = 2 Delta / (1 - xi(2001)) * ln(2001 / (0.05 - 2^-10)) = 57.3310 (by hand)
    assert a["grid_step"] == 100.0 and a["candidates"] == 2001
    assert a["rank_error_95"] == pytest.approx(6 * 943718 / 2**20 * math.log(2001 / (0.05 - 2**-10)), rel=1e-7)
    assert a["rank_error_95"] == pytest.approx(57.3310, abs=1e-3)


def test_grid_without_granularity_is_a_power_of_ten() -> None:
    t = people()
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("people", t, privacy_unit="pid", max_rows_per_unit=1, columns={"income": {"bounds": (0, 250000)}})
    [a] = s.explain("SELECT MEDIAN(income) FROM people", epsilon=1.0).parameters["aggregates"]
    # (hi - lo) / 1000 = 250 -> step 100, 2500 cells
    assert a["grid_step"] == 100.0 and a["candidates"] == 2501


def test_bounds_too_wide_or_huge_are_handled_before_any_charge() -> None:
    t = pa.table({"pid": pa.array([1, 2], pa.int64()), "x": pa.array([1.0, 2.0])})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("w", t, privacy_unit="pid", max_rows_per_unit=1, columns={"x": {"bounds": (-1e308, 1e308)}})
    with pytest.raises(dpsql.errors.ConfigError, match="too wide"):
        s.query("SELECT MEDIAN(x) FROM w", epsilon=1.0)
    s.register("w2", t, privacy_unit="pid", max_rows_per_unit=1,
               columns={"x": {"bounds": (-1e300, 1e300), "granularity": 0.001}})
    [a] = s.explain("SELECT MEDIAN(x) FROM w2", epsilon=1.0).parameters["aggregates"]
    assert a["candidates"] <= 100_001 and a["grid_step"] >= 2e300 / 100_000
    assert s.query("SELECT MEDIAN(x) FROM w2", epsilon=1.0).table.num_rows == 1
    assert s.remaining().epsilon == 9.0
    t3 = t.append_column("k", pa.array([0, 1], pa.int64()))
    s.register("w3", t3, privacy_unit="pid", max_groups_per_unit=1,
               columns={"x": {"bounds": (0, 1), "granularity": 0.00001}, "k": {"domain": list(range(100))}})
    with pytest.raises(PolicyError, match="coarser granularity"):  # 100 groups x 100,001 points
        s.explain("SELECT k, MEDIAN(x) FROM w3 GROUP BY k", epsilon=1.0)


# -- the output distribution is the mechanism's ---------------------------------------------------------

#: a small domain: ages 0..5 (6 candidates), h = [2, 0, 3, 1, 0, 4] rows at each point
HIST = {0: 2, 2: 3, 3: 1, 5: 4}
#: by hand: A = [0, 2, 2, 5, 6, 6], B = [8, 8, 5, 4, 4, 0], u = -dist(0, [(A - B - h) / 2, (A + h - B) / 2])
# h = [2, 0, 3, 1, 0, 4] (10 rows), the median's rows at x_i counted below or above as fits best: the 5th and 6th
# of the sorted rows sit at x_2 and x_3, so both split the rows 1 : 1
U_BY_HAND = [-3.0, -3.0, 0.0, 0.0, -1.0, -1.0]


def _small_release(eps: float = 1.0) -> tuple[Any, Any, pa.Table]:
    t = pa.table({"pid": pa.array([0], pa.int64()), "age": pa.array([0], pa.int64())})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("small", t, privacy_unit="pid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 5)}})
    r = route("SELECT MEDIAN(age) FROM small", eps, 0.0, {}, s.tables, lambda k: None)
    bounded = pa.table({"__q": pa.array([0] * 4, pa.int32()), "__b": pa.array(list(HIST), pa.int64()),
                        "__n": pa.array(list(HIST.values()), pa.int64())})
    return r.mechanism, r.calibration, bounded


def test_utilities_by_hand() -> None:
    h = np.array([[2, 0, 3, 1, 0, 4]], dtype=float)
    assert qm.utilities(h, 0.5, -0.5, 0.0)[0].tolist() == U_BY_HAND
    # MIN with target c = 2: -max(0, A - 2, 2 - A - h) (the 2nd smallest row is at x_0); MAX with c = 1:
    # -max(0, B - 1, 1 - B - h) (the largest is at x_5)
    assert qm.utilities(h, 1.0, 0.0, 2.0)[0].tolist() == [0.0, 0.0, 0.0, -3.0, -4.0, -4.0]
    assert qm.utilities(h, 0.0, 1.0, 1.0)[0].tolist() == [-7.0, -7.0, -4.0, -3.0, -3.0, 0.0]
    # the integer utilities are the same, scaled (the median at p = m / 2^20: a = 2^19, b = -2^19, s = 2^20)
    assert (qm.integer_utilities(h, 2**19, -(2**19), 0)[0] / 2**20).tolist() == U_BY_HAND
    assert qm.integer_utilities(h, 1, 0, 2)[0].tolist() == [0, 0, 0, -3, -4, -4]


def _tied(seed: str) -> dpsql.Session:
    # 1 000 people at 10, 2 000 at 20, 2 800 at 60 (the median is 20: the 2 900th and 2 901st rows), and the
    # 100 smallest of another column all at 16
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS pid, CASE WHEN i < 1000 THEN 10 WHEN i < 3000 THEN 20 ELSE 60 END AS v, "
                "16 + i % 58 AS age FROM range(5800) r(i)")
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.0), connection=con)
    s.register("t", "t", privacy_unit="pid", columns={"v": {"bounds": [0, 100]}, "age": {"bounds": [0, 120]}})
    use_noise(s, seeded_noise(seed))
    return s


def test_quantiles_of_tied_values_are_the_tied_value() -> None:
    """Rows at a grid point count below or above it, as fits best. With -|(1 - p) A - p B| alone, a median held
    by 2 000 equal values scored -900 (A = 1 000 below, B = 2 800 above) and every point of the gap above it -100:
    the median was released uniformly over 21..59 even at epsilon = 1e6, and MIN (the c-th smallest) uniformly
    over [0, 16] below 100 equal minima."""
    s = _tied("tied-values")
    got = [s.query("SELECT MEDIAN(v) AS m, MIN(age) AS lo FROM t", epsilon=4.0).table.to_pylist()[0]
           for _ in range(20)]
    # each draw misses with probability < 0.01 (the uniform mixture 2^-10, the rank error's beta * 17/121 for
    # MIN): 6 misses of 20 have probability < 1e-8
    assert sum(r["m"] == 20.0 for r in got) >= 15 and sum(r["lo"] == 16.0 for r in got) >= 15
    # negative control: the utility without the tied rows puts its best points in the gap (median) and ties
    # every point at or below the minimum (MIN)
    hist = np.zeros((1, 101))
    hist[0, [10, 20, 60]] = [1000, 2000, 2800]
    below = np.cumsum(hist, axis=-1) - hist
    above = hist.sum() - below - hist
    old = -np.abs(0.5 * below - 0.5 * above)[0]
    assert old[20] == -900 and old[21:60].tolist() == [-100.0] * 39 and old.argmax() == 21
    s.close()


def _law(scale: float) -> np.ndarray:
    w = np.exp(scale * np.array(U_BY_HAND))
    return w / w.sum()


def _draws(n: int, seed: str) -> np.ndarray:
    mech, cal, bounded = _small_release(1.0)
    # eps' / (2 Delta) = 1 / (2 * 0.5) = 1: probabilities proportional to e^u
    assert cal.eps_run / (2 * cal.sensitivity[0]) == 1.0
    rng = seeded_noise(seed)
    out = np.empty(n)
    for i in range(n):
        out[i] = mech.release(cal, bounded, rng).table.column("__a0")[0].as_py()
    return out


def test_output_distribution_matches_the_exponential_mechanism() -> None:
    n = 6000
    vals = _draws(n, "quantile-law")
    counts = np.array([(vals == v).sum() for v in range(6)])
    assert counts.sum() == n  # every release is a grid point
    # law by hand: e^u / sum e^u = [.0139, .0378, .1696, .4611, .2797, .0378]
    law = _law(1.0)
    assert law.round(4).tolist() == [0.0176, 0.0176, 0.3527, 0.3527, 0.1297, 0.1297]
    assert chisquare(counts, n * law).pvalue > 1e-6
    # negative controls: the law of a mechanism 30% more or less private is rejected
    assert chisquare(counts, n * _law(1.3)).pvalue < 1e-6
    assert chisquare(counts, n * _law(0.7)).pvalue < 1e-6


def _exact_law(hist: np.ndarray, p: float, scale: float) -> np.ndarray:
    u = qm.utilities(hist[None, :], 1.0 - p, -p, 0.0)[0]
    w = np.exp(scale * (u - u.max()))
    return w / w.sum()


@pytest.mark.parametrize("p", [0.5, 0.1, 0.9])
def test_privacy_loss_over_every_neighbour_of_a_small_domain(p: float) -> None:
    """Exact output laws on D and on every D minus (or plus) one row, L = 1: the largest log-ratio
    is at most eps' (here 1) with the calibrated scale eps' / (2 Delta), Delta = max(p, 1 - p);
    a mechanism calibrated without the factor 2 and with the smaller weight min(p, 1 - p) as its
    sensitivity (scale eps' / min(p, 1 - p)) exceeds it."""
    base = np.array([2, 0, 3, 1, 0, 4], dtype=float)
    neighbours = []
    for i in range(6):
        for d in (-1, 1):
            h = base.copy()
            h[i] += d
            if h[i] >= 0:
                neighbours.append(h)
    delta_u = max(p, 1 - p)

    def worst(scale: float) -> float:
        law = _exact_law(base, p, scale)
        return max(float(np.abs(np.log(law) - np.log(_exact_law(h, p, scale))).max()) for h in neighbours)

    assert worst(1.0 / (2 * delta_u)) <= 1.0 + 1e-12
    assert worst(1.0 / min(p, 1 - p)) > 1.0  # negative control: a mis-calibrated mechanism leaks more than eps'


def test_zero_noise_source_releases_the_best_point() -> None:
    mech, cal, bounded = _small_release()
    # x_2 and x_3 both split the rows 1 : 1 (utility 0); the zero source's draw lands on the first of them
    assert mech.release(cal, bounded, zero_noise()).table.column("__a0")[0].as_py() == 2.0


# -- end to end: answered within the stated rank error ----------------------------------------------------


def _rank_ok(values: np.ndarray, released: float, p: float, t: float, step: float) -> bool:
    """The released point's distance from a p : (1 - p) split (rows at it counted on either side) is within t of
    the best grid point's (values on the grid)."""
    grid = np.arange(0, 101, step)
    a = np.array([(values < x).sum() for x in grid])
    b = np.array([(values > x).sum() for x in grid])
    h = values.size - a - b
    u = np.maximum(np.maximum((1 - p) * a - p * (b + h), p * b - (1 - p) * (a + h)), 0)
    i = int(np.where(grid == released)[0][0])
    return bool(u[i] <= u.min() + t)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_scalar_quantile_within_rank_error(p: float) -> None:
    t = people(2000, seed=11)
    s = session(t, noise=seeded_noise(f"within-{p}"))
    r = s.query(f"SELECT QUANTILE(age, {p}) AS q FROM people", epsilon=1.0)
    q = r.table.column("q")[0].as_py()
    acc = r.accuracy["q"]
    w = max(round(p * 2**20), 2**20 - round(p * 2**20)) / 2**20  # p on the dyadic grid
    assert acc["rank_error_95"] == pytest.approx(2 * w * math.log(101 / (0.05 - 2**-10)), rel=1e-7)
    ages = np.asarray(t.column("age"))
    assert _rank_ok(ages, q, p, acc["rank_error_95"], 1.0)
    assert abs(q - np.quantile(ages, p)) <= 3  # 2000 rows over 72 ages: a rank error of ~15 is a few years


def test_min_max_near_the_data_not_the_bounds() -> None:
    t = people(2000, seed=12)
    s = session(t)
    r = s.query("SELECT MIN(age) AS lo, MAX(age) AS hi FROM people", epsilon=1.0)
    lo, hi = r.table.column("lo")[0].as_py(), r.table.column("hi")[0].as_py()
    # the data lie in 18..89; the c-th value with c = ceil(4 ln 2020) = 31 of ~28 rows per age
    assert 18 <= lo <= 21 and 86 <= hi <= 89


def test_grouped_quantile_every_public_key_released() -> None:
    t = people(2000, seed=13)
    s = session(t, max_rows_per_unit=None)
    r = s.query("SELECT sex, MEDIAN(income) AS m FROM people GROUP BY sex ORDER BY sex", epsilon=1.0)
    assert r.table.column("sex").to_pylist() == [1, 2]
    inc = np.asarray(t.column("income"))
    sex = np.asarray(t.column("sex"))
    for g, m in zip([1, 2], r.table.column("m").to_pylist(), strict=True):
        assert m % 100 == 0  # rounded to the declared granularity
        assert abs(m - np.median(inc[sex == g])) < 3000


def test_having_and_order_on_released_quantiles() -> None:
    s = session(max_rows_per_unit=None)
    r = s.query("SELECT sex, MEDIAN(age) AS m FROM people GROUP BY sex HAVING MEDIAN(age) > 1000 ORDER BY m",
                epsilon=1.0)
    assert r.table.num_rows == 0  # bounds are [0, 100]: post-processing on released values


def test_ledger_row_and_explain_agree() -> None:
    s = session()
    sql = "SELECT MEDIAN(age) FROM people"
    plan = s.explain(sql, epsilon=0.5)
    r = s.query(sql, epsilon=0.5)
    assert r.mechanism == plan.mechanism == "exponential"
    last = s.history().to_pylist()[-1]
    assert last["mechanism"] == "exponential" and last["epsilon"] == 0.5 and last["delta"] == 0.0


# -- remove one person: the bounded SQL moves each histogram by at most r rows -----------------------------


def _histograms(s: dpsql.Session, sql: str, table: pa.Table, salt: str,
                unbounded: bool = False) -> tuple[dict[tuple[Any, ...], np.ndarray], Any]:
    r = route(sql, 1.0, 0.0, {}, s.tables, lambda k: None)
    if unbounded:  # the negative control: the same histograms without any cap
        cal = r.calibration
        ast = bounded_value_histograms(cal.plan, Caps(math.inf, math.inf, math.inf), cal.grids, salt=salt,
                                       unit_column=cal.unit)
    else:
        # coupled by the salt: the reproducible choices (the engine's own per-row draws would choose
        # afresh on D and on D minus one person; tests/test_quantile_drawn.py checks that form's caps)
        ast = r.mechanism.bounded(r.calibration, salt, SaltedDuckDBOps())
    con = duckdb.connect()
    con.register(r.calibration.plan.table.view or source_name("people"), table)
    out = con.sql(render(ast)).to_arrow_table().to_pylist()
    con.close()
    keys = [k.name for k in r.calibration.plan.keys]
    hists: dict[tuple[Any, ...], np.ndarray] = {}
    for row in out:
        g = (*[row[k] for k in keys], row["__q"])
        cells = r.calibration.grids[row["__q"]].cells
        hists.setdefault(g, np.zeros(cells + 1))[row["__b"]] += row["__n"]
    return hists, r.calibration


def _max_change(sql: str, table: pa.Table, reg: dict[str, Any], unbounded: bool = False) -> tuple[float, int, float, Any]:
    """Over several removed people: the largest L1 change of one histogram, of the number of
    histograms changed, and of one utility, between D and D minus that person (same salt)."""
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("people", table, privacy_unit="pid", columns={"age": {"bounds": (0, 100)}, "sex": {"domain": [1, 2]}},
               **reg)
    full, cal = _histograms(s, sql, table, "salt-1", unbounded)
    pids = np.asarray(table.column("pid"))
    worst_l1, worst_groups, worst_u = 0.0, 0, 0.0
    for victim in (0, 1, 2, 3, 7):
        sub = table.filter(pa.array(pids != victim))
        part, _ = _histograms(s, sql, sub, "salt-1", unbounded)
        changed = 0
        for g in set(full) | set(part):
            a = full.get(g, np.zeros_like(next(iter(full.values()))))
            b = part.get(g, np.zeros_like(a))
            if not np.array_equal(a, b):
                changed += 1
            worst_l1 = max(worst_l1, float(np.abs(a - b).sum()))
            agg = cal.plan.aggregates[g[-1]]
            al, be, _ = qm.coefficients(agg)
            ua = qm.utilities(a[None, :], al, be, cal.targets[g[-1]])
            ub = qm.utilities(b[None, :], al, be, cal.targets[g[-1]])
            worst_u = max(worst_u, float(np.abs(ua - ub).max()))
        worst_groups = max(worst_groups, changed)
    return worst_l1, worst_groups, worst_u, cal


def heavy_people() -> pa.Table:
    """People 0..9 have 12 rows each (both sexes, ages everywhere); 200 others one row."""
    gen = np.random.default_rng(21)
    pid = np.concatenate([np.repeat(np.arange(10), 12), np.arange(10, 210)])
    n = len(pid)
    return pa.table({"pid": pid.astype(np.int64), "age": gen.integers(0, 100, n).astype(np.int64),
                     "sex": gen.integers(1, 3, n).astype(np.int64)})


def test_remove_one_person_scalar() -> None:
    l1, groups, du, cal = _max_change("SELECT MEDIAN(age), MIN(age) FROM people", heavy_people(), {"max_rows_per_unit": 3})
    assert l1 <= 3 and groups <= 2  # one histogram per aggregate
    assert l1 == 3  # the bound is reached: a heavy person keeps exactly L rows
    assert du <= max(cal.sensitivity) + 1e-9


def test_remove_one_person_grouped() -> None:
    l1, groups, du, cal = _max_change("SELECT sex, QUANTILE(age, 0.3) FROM people GROUP BY sex", heavy_people(),
                                      {"max_groups_per_unit": 1, "max_rows_per_group": 2})
    assert l1 <= 2 and groups <= 1  # C_u = 1 group, k = 2 rows
    assert du <= cal.sensitivity[0] + 1e-9 and cal.sensitivity[0] == pytest.approx(1.4)  # 2 * max(0.3, 0.7)


def test_remove_one_person_negative_control() -> None:
    """Without bounding the same check sees a heavy person's 12 rows: it can fail."""
    l1, _, du, cal = _max_change("SELECT MEDIAN(age) FROM people", heavy_people(), {"max_rows_per_unit": 3},
                                 unbounded=True)
    assert l1 == 12 and du > cal.sensitivity[0]


# -- from a stored DAWA synopsis: free, on request, labelled -------------------------------------------------


def test_quantile_from_stored_synopsis_is_free_and_recorded() -> None:
    t = people(4000, seed=14)
    s = session(t)
    with pytest.raises(PolicyError, match="no stored DAWA synopsis"):
        s.query("SELECT MEDIAN(age) FROM people", epsilon=1.0, options={"reuse": "synopsis"})
    s.query("SELECT age, COUNT(*) FROM people GROUP BY age", epsilon=1.0)  # DAWA: stores the synopsis
    left = s.remaining()
    plan = s.explain("SELECT MEDIAN(age) FROM people", epsilon=1.0, options={"reuse": "synopsis"})
    assert plan.cost == dpsql.Budget(0.0, 0.0) and "synopsis of ledger entry" in plan.reason
    r = s.query("SELECT MEDIAN(age) AS m, QUANTILE(age, 0.9) AS q9 FROM people", epsilon=1.0,
                options={"reuse": "synopsis"})
    assert s.remaining() == left and r.cost == dpsql.Budget(0.0, 0.0)
    assert "p-quantile of the DAWA histogram" in r.accuracy["m"]["estimates"]
    ages = np.asarray(t.column("age"))
    assert abs(r.table.column("m")[0].as_py() - np.median(ages)) <= 3
    assert abs(r.table.column("q9")[0].as_py() - np.quantile(ages, 0.9)) <= 3
    last = s.history().to_pylist()[-1]
    assert last["status"] == "reused" and last["source_entry_id"] is not None and last["epsilon"] == 0.0
    # MIN / MAX are not read from a histogram; another WHERE has no synopsis
    with pytest.raises(PolicyError, match="MIN and MAX"):
        s.query("SELECT MIN(age) FROM people", epsilon=1.0, options={"reuse": "synopsis"})
    with pytest.raises(PolicyError, match="no stored DAWA synopsis"):
        s.query("SELECT MEDIAN(age) FROM people WHERE sex = 1", epsilon=1.0, options={"reuse": "synopsis"})
    # without the option, the exponential mechanism answers (charged)
    r2 = s.query("SELECT MEDIAN(age) FROM people", epsilon=1.0)
    assert r2.mechanism == "exponential" and r2.cost == dpsql.Budget(1.0, 0.0)


# -- the command line ---------------------------------------------------------------------------------------------


def test_cli_query_and_explain(workdir: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from conftest import run_cli

    cfg = ["--config", "examples/dpsql.toml"]
    assert run_cli([*cfg, "explain", "SELECT country, MEDIAN(amount) AS m FROM events GROUP BY country", "--epsilon", "1"]) == 0
    out = capsys.readouterr().out
    assert "exponential" in out and "rank_error_95" in out
    assert run_cli([*cfg, "query", "SELECT MEDIAN(age) AS m, MAX(amount) AS top FROM events", "--epsilon", "0.5",
                    "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [row] = doc["rows"]
    assert 0 <= row["m"] <= 120 and 0 <= row["top"] <= 100
    assert doc["meta"]["cost"] == {"epsilon": 0.5, "delta": 0.0}
    assert run_cli([*cfg, "query", "SELECT QUANTILE(age, 2) FROM events", "--epsilon", "0.5"]) == 2
    assert "between 0 and 1" in capsys.readouterr().err


# -- MIN above MAX: a warning from the released values ----------------------------------------------


def _min_max_release(rows_per_group: int, seed: int) -> Any:
    groups = [f"g{i}" for i in range(20)]
    n = len(groups) * rows_per_group
    t = pa.table({"uid": list(range(n)), "g": [groups[i % 20] for i in range(n)],
                  "x": [float(10 + (i * 7) % 80) for i in range(n)]})
    s = dpsql.Session(budget=dpsql.Budget(100, 1e-3))
    use_noise(s, seeded_noise(seed))
    s.register("t", t, privacy_unit="uid", columns={"x": {"bounds": (0, 100)}, "g": {"domain": groups}})
    try:
        return s.query("SELECT g, MIN(x) AS lo, MAX(x) AS hi, MEDIAN(x) FROM t GROUP BY g", epsilon=3.0)
    finally:
        s.close()


def test_a_min_above_its_max_is_reported_as_a_warning_from_the_released_values() -> None:
    # three rows per group and c around 20: the c-th smallest and largest kept values cross in most groups
    rel = _min_max_release(3, seed=5)
    rows = rel.to_pylist()
    crossed = sum(r["lo"] > r["hi"] for r in rows)
    assert crossed > 0
    assert len(rel.warnings) == 1 and rel.meta()["warnings"] == rel.warnings
    w = rel.warnings[0]
    assert w.startswith(f"MIN(x) came out above MAX(x) in {crossed} of 20 groups") and "rank_target" in w
    # the notes (what the mechanism means) are unchanged: the warning is the release's own
    assert not any("came out above" in n for n in rel.notes)


def test_no_warning_when_every_min_is_below_its_max() -> None:
    # 400 rows per group, c around 20: MIN and MAX stay apart (the control of the test above)
    rel = _min_max_release(400, seed=5)
    assert all(r["lo"] <= r["hi"] for r in rel.to_pylist())
    assert rel.warnings == [] and rel.meta()["warnings"] == []


def _min_max_query(sql: str) -> Any:
    groups = [f"g{i}" for i in range(20)]
    n = len(groups) * 3
    t = pa.table({"uid": list(range(n)), "g": [groups[i % 20] for i in range(n)],
                  "x": [float(10 + (i * 7) % 80) for i in range(n)]})
    s = dpsql.Session(budget=dpsql.Budget(100, 1e-3))
    use_noise(s, seeded_noise(5))
    s.register("t", t, privacy_unit="uid", columns={"x": {"bounds": (0, 100)}, "g": {"domain": groups}})
    try:
        return s.query(sql, epsilon=3.0)
    finally:
        s.close()


def test_the_warning_counts_the_groups_the_caller_sees() -> None:
    # HAVING, ORDER BY ... LIMIT: the warning speaks of the rows returned, not of the groups filtered out
    full = _min_max_query("SELECT g, MIN(x) AS lo, MAX(x) AS hi FROM t GROUP BY g")
    crossed = {r["g"] for r in full.to_pylist() if r["lo"] > r["hi"]}
    assert 0 < len(crossed) < 20 and full.warnings[0].startswith(f"MIN(x) came out above MAX(x) in {len(crossed)} of 20")
    kept = _min_max_query("SELECT g, MIN(x) AS lo, MAX(x) AS hi FROM t GROUP BY g HAVING MIN(x) <= MAX(x)")
    assert kept.table.num_rows == 20 - len(crossed) and kept.warnings == []
    top = _min_max_query("SELECT g, MIN(x) AS lo, MAX(x) AS hi FROM t GROUP BY g ORDER BY MIN(x) - MAX(x) DESC LIMIT 2")
    assert top.table.num_rows == 2 and len(top.warnings) == 1
    assert top.warnings[0].startswith(f"MIN(x) came out above MAX(x) in {min(2, len(crossed))} of 2 groups")


def test_min_max_whose_rank_target_exceeds_int64_are_answered() -> None:
    """At an epsilon just above the sampler's allowance, c = ceil(rank error) passes 2^63 (here with 2 rows per
    person): the release failed after its charge on the integer overflow; it is answered (target taken at 2^40)."""
    s = session(max_rows_per_unit=2)
    eps = 2 * qm.float_slack(101) * (1 + 1e-9)  # two releases
    plan = s.explain("SELECT MIN(age), MAX(age) FROM people", epsilon=eps)
    assert all(a["rank_target"] > 2.0**63 for a in plan.parameters["aggregates"])
    r = s.query("SELECT MIN(age), MAX(age) FROM people", epsilon=eps)
    assert r.table.num_rows == 1 and all(0 <= v <= 100 for v in r.table.to_pylist()[0].values())


def test_a_quantile_is_its_grid_point_at_values_where_doubles_are_coarse_against_the_granularity() -> None:
    """The released quantile is a point of the public grid (lo + i x step) rounded to the column's granularity only to
    drop the binary noise of that arithmetic: the power-of-two grid that Gaussian releases take from 2^42 granularities
    on (``dpsql.noise.round_to_granularity``) does not move it (12346000.3 read 12346000.299999237 at 1e-6)."""
    t = pa.table({"pid": np.arange(2000), "x": np.full(2000, 12345678.3)})
    with dpsql.Session(budget=dpsql.Budget(100.0)) as s:
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1,
                   columns={"x": {"bounds": [0.3, 20000000.3], "granularity": 1e-6}})
        use_noise(s, zero_noise())
        assert s.explain("SELECT MEDIAN(x) AS m FROM t", epsilon=5.0).parameters["aggregates"][0]["grid_step"] == 1000.0
        got = s.query("SELECT MEDIAN(x) AS m FROM t", epsilon=5.0).to_pylist()[0]["m"]
    assert got == 12346000.3  # the grid point 0.3 + 12346 x 1000 nearest the rows' value
