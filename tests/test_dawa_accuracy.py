"""DAWA's per-answer noise std and 95% half-width (stage-2 noise only, around the bucket-uniform truth):
exact least-squares variance against simulation with a fixed partition and strategy, negative controls,
coverage on data uniform within buckets, and the SQL / CLI path."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import optimize, stats

from dpsql.mechanisms import ranges
from dpsql.mechanisms._dawa_greedyh import ANSWER_NOISE_MAX_WORK
from dpsql.mechanisms.dawa import (
    NOISE95,
    IntervalWorkload,
    dawa,
    dawa_2d,
    snapped_laplace_moments,
    snapped_laplace_variance,
)
from dpsql.plan import workload
from dpsql.testing import seeded_noise, zero_noise

RUNS = 20000
# the sample variance of RUNS draws of a sum of independent snapped Laplace terms (kurtosis at most the
# largest term's: 5.81 over all phases and Lambda/lambda in [1, 2], computed from snapped_laplace_moments'
# distribution) has a relative standard deviation <= sqrt(5.2 / RUNS); 6 of them (two-sided normal tail
# 2e-9) bound it for all 40 queries with probability >= 1 - 1e-7
VAR_TOL = 6.0 * math.sqrt(5.2 / RUNS)


def _setup(seed: int = 5, n: int = 64, m: int = 24, eps: float = 0.5):
    gen = np.random.default_rng(seed)
    cuts = np.sort(gen.choice(np.arange(1, n), size=40, replace=False))
    part = list(zip(np.r_[0, cuts].tolist(), np.r_[cuts - 1, n - 1].tolist(), strict=True))
    lo, hi = gen.integers(0, n, m), gen.integers(0, n, m)
    # random ranges and prefixes (long ranges make GreedyH measure inner nodes of the tree)
    rng_ = np.r_[np.c_[np.minimum(lo, hi), np.maximum(lo, hi)], np.c_[np.zeros(16, dtype=int), np.arange(3, n, 4)]]
    x = gen.poisson(7, n).astype(float)
    # the partition is public here (all of eps goes to stage 2): the strategy is fixed for every run
    syn = dawa(x, rng_, eps, seeded_noise("setup"), partition=part)
    return part, rng_, x, syn


def _bucket_totals(x, part):
    return np.array([x[a : b + 1].sum() for a, b in part])


def _answer_rows(strategy, wl):
    """a_q for every query (dense, by least squares on every unit measurement vector)."""
    cols = []
    for r in range(strategy.n_measurements):
        z, used = [], 0
        for w in strategy.weights:
            zz = np.full(w.size, np.nan)
            m = w > 0
            e = np.zeros(int(m.sum()))
            if used <= r < used + e.size:
                e[r - used] = 1.0
            zz[m] = e
            used += e.size
            z.append(zz)
        yb = strategy.infer(z)
        cols.append(wl.answer(np.repeat(yb / strategy.bucket_lengths, strategy.bucket_lengths)))
    return np.array(cols).T  # (queries, rows)


def _measure_runs(s, y, epsilon2, rng, runs, sensitivity):
    """``runs`` independent ``s.measure(y, ...)`` at once, per level a (segments, runs) array: measure's rows
    (its zero-noise call gives the clamped true rows, NaN where a segment is not measured), snapped by one
    ``snap_laplace`` over (runs, rows) -- independent draws, as ``runs`` calls of measure make (one run is
    measure's own output bit for bit: checked in ``_simulate``)."""
    lam, grid, bound, _ = s.snapping(epsilon2, sensitivity=sensitivity)
    rows = s.measure(y, epsilon2, zero_noise(), sensitivity=sensitivity)
    measured = [~np.isnan(z) for z in rows]
    flat = np.concatenate([z[m] for z, m in zip(rows, measured, strict=True)])
    noisy = rng.snap_laplace(np.broadcast_to(flat, (runs, flat.size)), lam, grid, bound)
    out, used = [], 0
    for z, m in zip(rows, measured, strict=True):
        level = np.full((z.size, runs), np.nan)
        cnt = int(np.count_nonzero(m))
        level[m] = noisy[:, used : used + cnt].T
        used += cnt
        out.append(level)
    return out


def _simulate(syn, y, wl, runs=RUNS, seed="sim", *, at_once=True):
    """``runs`` releases' answers: the measurements of all runs drawn at once (``_measure_runs``; else one
    ``measure`` per run), the least squares of all runs in one batched ``infer`` (column j is run j's
    estimate: the same map, checked against the one-run call below)."""
    s = syn.strategy
    one = _measure_runs(s, y, syn.epsilon2, seeded_noise(seed), 1, syn.sensitivity)
    own = s.measure(y, syn.epsilon2, seeded_noise(seed), sensitivity=syn.sensitivity)
    assert all(np.array_equal(a[:, 0], b, equal_nan=True) for a, b in zip(one, own, strict=True))
    lens = s.bucket_lengths
    if at_once:
        zs = _measure_runs(s, y, syn.epsilon2, seeded_noise(seed), runs, syn.sensitivity)
    else:
        rng = seeded_noise(seed)
        each = [s.measure(y, syn.epsilon2, rng, sensitivity=syn.sensitivity) for _ in range(runs)]
        zs = [np.stack([z[d] for z in each], axis=1) for d in range(len(s.levels))]
    yb = s.infer(zs)  # (buckets, runs)
    for j in (0, runs - 1):
        assert np.array_equal(yb[:, j], s.infer([z[:, j] for z in zs]))
    x = np.repeat(yb / lens[:, None], lens, axis=0)
    return np.stack([wl.answer(x[:, i]) for i in range(runs)])


@pytest.fixture(scope="module")
def simulated():
    part, rng_, x, syn = _setup()
    wl = IntervalWorkload.from_ranges(rng_, x.size)
    y = _bucket_totals(x, part)
    return part, rng_, x, syn, wl, y, _simulate(syn, y, wl)


def test_noise_std_matches_the_empirical_std_of_answers(simulated):
    part, rng_, x, syn, wl, y, sims = simulated
    s = syn.strategy
    std, half = syn.noise_bounds(rng_)
    a = _answer_rows(s, wl)
    l2, l1 = s.answer_noise(wl)
    assert np.allclose(l2, np.sqrt((a**2).sum(axis=1)), rtol=1e-12, atol=1e-12)
    assert np.allclose(l1, np.abs(a).sum(axis=1), rtol=1e-12, atol=1e-12)
    snap = syn.params["stage2_snapping"]
    lam, grid = snap["lambda"], snap["grid"]
    # exact variance of each measured row: the snapped Laplace's variance at the phase of its true value
    lo, hi, w = s.rows()
    cy = np.r_[0.0, np.cumsum(y)]
    true_rows = w * (cy[hi] - cy[lo])
    _, var_row = snapped_laplace_moments(grid / lam, np.mod(true_rows, grid) / lam)
    exact = (a**2) @ (var_row * lam**2)
    emp = sims.var(axis=0)
    assert np.all(np.abs(emp / exact - 1) < VAR_TOL), np.max(np.abs(emp / exact - 1))
    # the released std bounds the exact one over the unknown phases, and is close to it
    assert np.all(std >= np.sqrt(exact)) and np.all(std <= 1.06 * np.sqrt(exact))
    assert np.all(std**2 >= emp * (1 - VAR_TOL))
    # the raw answers are unbiased for the bucket-uniform truth up to the snapping's small bias
    truth = wl.answer(np.repeat(y / s.bucket_lengths, s.bucket_lengths))
    assert np.all(np.abs(sims.mean(axis=0) - truth) < 6 * std / math.sqrt(RUNS) + 0.06 * lam * l1)


@pytest.mark.parametrize("kind", ["ranges", "bins_and_ranges", "intervals"])
def test_answer_noise_matches_the_dense_map(kind):
    gen = np.random.default_rng(11)
    n = 40
    cuts = np.sort(gen.choice(np.arange(1, n), size=9, replace=False))
    part = list(zip(np.r_[0, cuts].tolist(), np.r_[cuts - 1, n - 1].tolist(), strict=True))
    lo, hi = gen.integers(0, n, 12), gen.integers(0, n, 12)
    r = np.c_[np.minimum(lo, hi), np.maximum(lo, hi)]
    if kind == "ranges":
        wl = IntervalWorkload.from_ranges(r, n)
    elif kind == "bins_and_ranges":  # bins inside a group take the per-group shortcut
        wl = IntervalWorkload.from_ranges(np.r_[np.c_[np.arange(n), np.arange(n)], r], n)
    else:
        t = 30
        a = gen.integers(0, n, t)
        wl = IntervalWorkload.from_intervals(gen.integers(0, 8, t), a, np.minimum(n - 1, a + gen.integers(0, 4, t)), n, 8)
    syn = dawa(np.ones(n), wl, 1.0, seeded_noise("dense"), partition=part)
    a = _answer_rows(syn.strategy, wl)
    l2, l1 = syn.strategy.answer_noise(wl)
    assert np.allclose(l2, np.sqrt((a**2).sum(axis=1)), rtol=1e-12, atol=1e-12)
    assert np.allclose(l1, np.abs(a).sum(axis=1), rtol=1e-12, atol=1e-12)
    # the transpose of the least squares (used when there are fewer queries than measurements)
    l2t, l1t = syn.strategy._answer_noise_adjoint(wl)
    assert np.allclose(l2t, l2, rtol=1e-12, atol=1e-12) and np.allclose(l1t, l1, rtol=1e-12, atol=1e-12)
    assert syn.strategy.answer_noise(wl, max_work=10.0) is None


def test_few_queries_over_many_groups_take_the_adjoint():
    """8000 groups: blocks of unit measurement vectors would cost ~1e9 operations (refused), the
    transpose pass one per query."""
    n, t = 20000, 4000
    gen = np.random.default_rng(4)
    lo = gen.integers(0, n - 3, t)
    wl = IntervalWorkload.from_intervals(gen.integers(0, 5, t), lo, lo + 2, n, 5)
    syn = dawa(np.ones(n), wl, 1.0, seeded_noise("adjoint"), partition=[(i, i) for i in range(n)])
    s = syn.strategy
    assert float(s.n_measurements) * s.n_groups * len(s.levels) > ANSWER_NOISE_MAX_WORK
    l2, l1 = s.answer_noise(wl)
    assert np.all(np.isfinite(l2)) and np.all(l1 >= l2) and np.all(l2 > 0)
    std, half = syn.noise_bounds(wl)
    assert np.all(half > NOISE95 * std)


def test_rounding_bound_is_the_total_variation_of_the_shares_and_holds():
    gen = np.random.default_rng(3)
    for trial in range(30):
        n = int(gen.integers(5, 60))
        k = int(gen.integers(1, n))
        cuts = np.sort(gen.choice(np.arange(1, n), size=k - 1, replace=False)) if k > 1 else np.zeros(0, dtype=int)
        st, en = np.r_[0, cuts], np.r_[cuts - 1, n - 1]
        t = int(gen.integers(1, 20))
        a = gen.integers(0, n, t)
        wl = IntervalWorkload.from_intervals(gen.integers(0, 6, t), a, np.minimum(n - 1, a + gen.integers(0, 8, t)), n, 6)
        syn = dawa(gen.poisson(5, n).astype(float), wl, 1.0, seeded_noise(trial), partition=list(zip(st, en, strict=True)))
        rounded = syn.rounded(1.0)
        shares = np.pad(wl.bucket_matrix(st, en), ((0, 0), (1, 1)))
        bound = rounded.rounding_bound(wl)
        assert np.allclose(bound, np.abs(np.diff(shares, axis=1)).sum(axis=1) / 2)
        assert np.all(np.abs(rounded.answer(wl) - syn.answer(wl)) <= bound + 1e-9)
        assert np.all(syn.rounding_bound(wl) == 0)


def test_without_the_least_squares_variance_reduction_the_std_is_wrong(simulated):
    """Negative control: the variance of the leaf-only estimate (no combination of the tree's
    measurements) is far outside the tolerance the exact value meets."""
    part, rng_, x, syn, wl, y, sims = simulated
    s = syn.strategy
    snap = syn.params["stage2_snapping"]
    lam, grid = snap["lambda"], snap["grid"]
    leaf_w = s.weights[-1]
    wbar = wl.bucket_matrix(np.array([p[0] for p in part]), np.array([p[1] for p in part]))
    assert any(np.any(w > 0) for w in s.weights[:-1])  # the tree's inner nodes are measured
    # group columns: a query's share of each group (grouped buckets have equal columns: use the first)
    wg = wbar[:, s.group_first_bucket]
    naive = snapped_laplace_variance(grid / lam) * lam**2 * (wg**2 / leaf_w**2).sum(axis=1)
    emp = sims.var(axis=0)
    assert np.any(np.abs(emp / naive - 1) >= VAR_TOL)
    assert np.mean(np.abs(emp / naive - 1) >= VAR_TOL) > 0.5


def _coverage(errors, half):
    return float(np.mean(np.abs(errors) <= half))


def test_normal_interval_fails_on_one_laplace_and_ours_holds():
    """Negative control: one bucket, one measurement, so the answer's noise is one snapped Laplace
    (λ ≈ 1.001, grid Λ = 2: errors on the lattice 2k - 0.9 for a true total of 40.9); 1.96 std (3.07) covers
    the errors -2.9, -0.9 and 1.1 only, P = 1 - e^-3.9/2 - e^-2.1/2 ≈ 0.929, and misses about 7% of the time;
    the released half-width (4.65: 2.58 std plus rounding) also covers 3.1, P ≈ 0.982. With 20 000 runs the
    two coverages are 11 and 33 standard errors from 0.95 (failure probability < 1e-20). At a total on the
    grid (40) the 1.96-std interval covers 1 - e^-3 ≈ 0.950 and would not show the miss."""
    n = 8
    x = np.full(n, 40.9 / n)
    whole = np.array([[0, n - 1]])
    syn = dawa(x, whole, 1.0, seeded_noise("one"), partition=[(0, n - 1)])
    assert syn.strategy.n_measurements == 1
    assert syn.params["stage2_snapping"]["grid"] == 2.0
    wl = IntervalWorkload.from_ranges(whole, n)
    sims = _simulate(syn, np.array([x.sum()]), wl, runs=20000, seed="one-laplace")
    err = sims[:, 0] - x.sum()
    std, half = syn.noise_bounds(whole)
    assert 3.0 < 1.96 * std[0] < 3.1 < half[0] < 4.9  # the lattice points each interval covers, as above
    assert _coverage(err, 1.96 * std[0]) < 0.945
    assert _coverage(err, half[0]) >= 0.97


def test_the_constant_bounds_any_sum_of_laplace_terms():
    """2Φ̄(t/√v) <= 0.3315 v/t² for all v (the max of 2uΦ̄(√u) is 0.33143), so a scale mixture of normals
    with mean variance σ² exceeds 2.58σ with probability <= 0.3315/2.58² < 5%: any sum of independent
    Laplace variates is such a mixture. Checked against two equal terms and one term."""
    r = optimize.minimize_scalar(lambda u: -2 * u * stats.norm.sf(math.sqrt(u)), bounds=(0.1, 5), method="bounded")
    assert -r.fun < 0.3315 and 0.3315 / NOISE95**2 < 0.05
    # one Laplace (std √2): P(|L| > 2.58 √2) = exp(-3.65) = 2.6%; two: L1 + L2 (std 2), tail (1 + t/2) e^-t / 2
    assert math.exp(-NOISE95 * math.sqrt(2)) < 0.05
    t = NOISE95 * 2.0
    assert (1 + t / 2) * math.exp(-t) < 0.05


def _fake_workload(r, dims=1, histogram=False):
    return SimpleNamespace(ranges=[tuple(v) for v in r], dims=[None] * dims, histogram=histogram, offset=0, span=None, axes=None)


def test_coverage_on_data_uniform_within_buckets():
    part, rng_, _, syn0 = _setup(seed=7)
    x = np.concatenate([np.full(b - a + 1, float(v)) for (a, b), v in zip(part, np.arange(3, 3 + len(part)), strict=True)])
    wl = _fake_workload(rng_)
    truth = IntervalWorkload.from_ranges(rng_, x.size).answer(x)
    rng = seeded_noise("coverage")
    hits, total = 0, 0
    for _ in range(300):
        syn = dawa(x, rng_, 0.5, rng, partition=part).rounded(1.0)
        got = ranges.answer(wl, syn)
        std, half = ranges.answer_accuracy(wl, syn)
        hits += int(np.sum(np.abs(got - truth) <= half))
        total += got.size
    assert hits / total >= 0.95


def test_coverage_2d_constant_grid_through_stage_1():
    # a constant grid is uniform within every bucket stage 1 may choose: the truth is the bucket-uniform one
    g = np.full((6, 5), 4.0)
    rects = np.array([[0, 2, 0, 4], [1, 5, 1, 3], [0, 5, 0, 4], [3, 3, 2, 2], [2, 4, 0, 1]])
    wl = _fake_workload(rects[:, [0, 1, 2, 3]], dims=2)
    truth = np.array([g[a : b + 1, c : d + 1].sum() for a, b, c, d in rects])
    rng = seeded_noise("coverage-2d")
    hits = total = 0
    for _ in range(200):
        syn = dawa_2d(g, rects, 1.0, rng).rounded(1.0)
        got = ranges.answer(wl, syn)
        std, half = ranges.answer_accuracy(wl, syn)
        assert np.all(np.isfinite(std)) and np.all(std > 0)
        hits += int(np.sum(np.abs(got - truth) <= half))
        total += got.size
    assert hits / total >= 0.95


def test_sql_path_releases_per_answer_std_and_half_width():
    from tests.test_ranges import WORKLOAD, make_session

    s = make_session(noise=seeded_noise("sql-accuracy"))
    r = s.query_many(WORKLOAD, epsilon=1.0)
    acc = r.accuracy["count"]
    assert len(acc["per_row_noise_std"]) == len(acc["per_row_ci95_half_width"]) == 3
    assert all(math.isfinite(v) and v > 0 for v in acc["per_row_noise_std"] + acc["per_row_ci95_half_width"])
    assert all(h > NOISE95 * sd for sd, h in zip(acc["per_row_noise_std"], acc["per_row_ci95_half_width"], strict=True))
    assert "bucket-uniform truth" in acc["note"] and "NOT included" in acc["note"]
    # a histogram: per-row values follow their rows through ORDER BY and LIMIT (same seed: same synopsis)
    full = make_session(noise=seeded_noise("hist")).query("SELECT age, COUNT(*) AS n FROM people GROUP BY age",
                                                          epsilon=1.0)
    desc = make_session(noise=seeded_noise("hist")).query(
        "SELECT age, COUNT(*) AS n FROM people GROUP BY age ORDER BY age DESC LIMIT 5", epsilon=1.0)
    assert desc.table.column("n").to_pylist() == full.table.column("n").to_pylist()[::-1][:5]
    fa, da = full.accuracy["n"], desc.accuracy["n"]
    assert len(fa["per_row_noise_std"]) == len(fa["per_row_ci95_half_width"]) == 121
    assert all(math.isfinite(v) for v in fa["per_row_noise_std"])
    assert da["per_row_noise_std"] == fa["per_row_noise_std"][::-1][:5]
    assert da["per_row_ci95_half_width"] == fa["per_row_ci95_half_width"][::-1][:5]
    # 2-D
    r2 = s.query_many(["SELECT COUNT(*) FROM people WHERE age BETWEEN 20 AND 40 AND score < 5",
                       "SELECT COUNT(*) FROM people WHERE age >= 60 AND score >= 5"], epsilon=1.0)
    assert all(math.isfinite(v) and v > 0 for v in r2.accuracy["count"]["per_row_ci95_half_width"])
    # a stored synopsis keeps its (public) strategy: the same answers get the same accuracy for free
    again = s.query_many(WORKLOAD, epsilon=1.0)
    assert again.cost.epsilon == 0 and again.counts == r.counts
    ra = again.accuracy["count"]
    assert ra["per_row_noise_std"] == pytest.approx(acc["per_row_noise_std"], rel=1e-12)
    assert ra["per_row_ci95_half_width"] == pytest.approx(acc["per_row_ci95_half_width"], rel=1e-12)
    assert "stored synopsis" in ra["note"]
    # a synopsis stored without a strategy: no interval, and the note says why
    syn = ranges.load_synopsis(s.ledger.find_synopsis(
        (w := workload.analyze_workload(WORKLOAD, s.tables)).synopsis_key(5, s.tables, binning=ranges.binning(w)))[1])
    assert syn.strategy is not None
    bare = json.loads(syn.to_json())
    del bare["strategy"]
    old = ranges.load_synopsis(json.dumps(bare))
    assert old.strategy is None
    wl = workload.analyze_workload(WORKLOAD, s.tables)
    assert ranges.answer_accuracy(wl, old) is None
    acc_old, rows = ranges._accuracy(wl, old, True)
    assert rows is None and acc_old["noise_std"] is None and "stage-2 strategy" in acc_old["note"]


def test_cli_shows_the_std_and_meta_has_it(tmp_path, capsys):
    from dpsql.cli import main

    root = Path(__file__).resolve().parents[1]
    ex = tmp_path / "examples"
    shutil.copytree(root / "examples", ex, ignore=shutil.ignore_patterns("*.duckdb*"))
    meta = tmp_path / "meta.json"
    assert main(["--config", str(ex / "dpsql.toml"), "query", "-f", str(root / "sql" / "examples" / "age_ranges.sql"),
                 "--workload", "--epsilon", "0.5", "--format", "json", "--meta", str(meta)]) == 0
    err = capsys.readouterr().err
    assert "noise std" in err and "95% interval +/-" in err
    acc = json.loads(meta.read_text())["accuracy"]["count"]
    assert len(acc["per_row_noise_std"]) == 5 and all(math.isfinite(v) for v in acc["per_row_ci95_half_width"])


def test_a_stored_strategy_that_does_not_fit_loads_without_one():
    """A stored synopsis whose strategy is malformed answers without the noise columns (no exception, no
    endless tree of branch 1, no infinite std)."""
    x = np.arange(16.0)
    r = np.array([[0, 7], [3, 12], [0, 15]])
    syn = dawa(x, r, 1.0, seeded_noise("tamper"), partition=[(0, 3), (4, 9), (10, 15)]).rounded(1.0)
    good = json.loads(syn.to_json())
    assert ranges.load_synopsis(json.dumps(good)).noise_bounds(r) is not None
    bad = [{"group_first_bucket": [0, 2**70, 2**71]}, {"group_first_bucket": [[0], [1], [2]]},
           {"branch": 2**70}, {"branch": True}, {"branch": 1}]
    for change in bad:
        d = json.loads(json.dumps(good))
        d["strategy"].update(change)
        assert ranges.load_synopsis(json.dumps(d)).strategy is None, change
    for w in (1e-200, 1e200):
        d = json.loads(json.dumps(good))
        d["strategy"]["weights"] = [[w if v > 0 else 0.0 for v in lv] for lv in d["strategy"]["weights"]]
        with np.errstate(all="ignore"):
            assert ranges.load_synopsis(json.dumps(d)).noise_bounds(r) is None, w
