"""End-to-end empirical privacy audits through the public API (``Session.query`` and friends).

For each route: worst-case neighbours D, D' (D' = D minus one person, chosen to maximise the
difference), one output event S fixed in advance from the mechanism's analysis, N releases on
each side with a seeded noise source, and a lower bound on the privacy loss at the charged δ from
Clopper–Pearson intervals:

    ε_lb = ln((p_D,lower − δ) / p_D',upper)

A violation is ε_lb > the charged ε (equivalently p_D − e^ε·p_D' > δ with confidence). Where the
docs give the event probabilities in closed form (Gaussian tails of the sparse histogram, the
exponential mechanism's law), the empirical frequencies are also checked against them, which
catches a mis-calibrated σ even when ε_lb is loose.

Replication. A release noises groups independently with parameters that depend only on public
metadata (docs/mechanisms.md §1.1, §7, §9), so one release over R disjoint copies of the
neighbour pair's target (each copy a different person with the same contribution pattern) gives R
independent draws of the target's output. D holds R copies with the person, D' the same R copies
without. Scalar routes (joins, range workloads) have one draw per release and run at smaller N;
their power is stated in their docstrings.

Every test uses a fixed seed, has total failure probability <= 1e-6 (a union bound over its
intervals), and has a negative control (``ScaledNoise``: every Gaussian/Laplace draw scaled, i.e.
a mechanism whose noise is wrong by a known factor) that the same statistics must catch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from scipy import optimize, special, stats

import dpsql
from dpsql.testing import SeededNoise, use_noise

FAIL = 1e-6  # total failure probability of each test


class ScaledNoise(SeededNoise):
    """A broken noise source for negative controls: Gaussian and Laplace draws scaled by ``factor``."""

    def __init__(self, seed: int | str, factor: float) -> None:
        super().__init__(seed)
        self.factor = factor

    def normal(self, scale, size):  # type: ignore[no-untyped-def]
        return super().normal(np.asarray(scale, dtype=np.float64) * self.factor, size)

    def laplace(self, scale, size):  # type: ignore[no-untyped-def]
        return super().laplace(np.asarray(scale, dtype=np.float64) * self.factor, size)


# -- statistics ----------------------------------------------------------------------------------


def cp_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower bound: P(p < bound) <= alpha."""
    return 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def cp_upper(k: int, n: int, alpha: float) -> float:
    return 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def eps_lower_bound(k_d: int, n_d: int, k_dp: int, n_dp: int, delta: float, alpha: float) -> float:
    """ε_lb at δ from one event (alpha split over the two one-sided intervals); -inf if vacuous."""
    lo = cp_lower(k_d, n_d, alpha / 2) - delta
    up = cp_upper(k_dp, n_dp, alpha / 2)
    return math.log(lo / up) if lo > 0 else -math.inf


def delta_lower_bound(k_d: int, n_d: int, k_dp: int, n_dp: int, eps: float, alpha: float) -> float:
    """A lower bound on P_D(S) − e^ε·P_D'(S) (the hockey-stick divergence at ε)."""
    return cp_lower(k_d, n_d, alpha / 2) - math.exp(eps) * cp_upper(k_dp, n_dp, alpha / 2)


def consistent(k: int, n: int, p: float, alpha: float) -> bool:
    """The two-sided Clopper–Pearson interval at level alpha contains p."""
    return cp_lower(k, n, alpha / 2) <= p <= cp_upper(k, n, alpha / 2)


# -- the spec's calibration, recomputed here (docs/mechanisms.md §1.2) ----------------------------


def delta_gauss(eps: float, mu: float) -> float:
    return float(special.ndtr(-eps / mu + mu / 2) - math.exp(eps) * special.ndtr(-eps / mu - mu / 2))


def least_sigma(eps: float, delta: float, l2: float = 1.0) -> float:
    return float(optimize.brentq(lambda s: delta_gauss(eps, l2 / s) - delta, 1e-3, 1e3, xtol=1e-14))


# -- sessions --------------------------------------------------------------------------------------


class Runner:
    """Fresh sessions as the δ budget fills up; every release's charge is collected."""

    def __init__(self, register: Callable[[dpsql.Session], None], source: SeededNoise, per_session: int = 15):
        self.register, self.source, self.per_session = register, source, per_session
        self.session: dpsql.Session | None = None
        self.used = 0
        self.costs: set[tuple[float, float]] = set()
        self.session_details: dict[str, Any] = {}

    def _fresh(self) -> dpsql.Session:
        if self.session is None or self.used >= self.per_session:
            if self.session is not None:
                self.session.close()
            self.session = dpsql.Session(budget=dpsql.Budget(1e6, 0.99))
            use_noise(self.session, self.source)
            self.register(self.session)
            self.used = 0
        self.used += 1
        return self.session

    def query(self, sql: str, **kw: Any) -> dpsql.Release:
        r = self._fresh().query(sql, **kw)
        self.costs.add((float(r.cost.epsilon), float(r.cost.delta)))
        self.session_details = r.details
        return r

    def call(self, f: Callable[[dpsql.Session], Any]) -> Any:
        r = f(self._fresh())
        self.costs.add((float(r.cost.epsilon), float(r.cost.delta)))
        return r

    def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def cost(self) -> tuple[float, float]:
        assert len(self.costs) == 1, self.costs
        return next(iter(self.costs))


def table_of(units: list[np.ndarray], **cols: list[np.ndarray]) -> pa.Table:
    return pa.table({"uid": np.concatenate(units).astype(np.int64),
                     **{k: np.concatenate(v) for k, v in cols.items()}})


def groups_table(copies: int, size: int, *, with_target: bool, groups_per_unit: int = 1,
                 value: float = 0.0, others: float = 0.0, prefix: str = "g") -> pa.Table:
    """``copies`` disjoint copies of the target's neighbourhood: the target (value ``value``) in
    ``groups_per_unit`` groups of its own copy, each group holding ``size`` distinct units in D
    (the target and size − 1 others, each other unit in one group, value ``others``)."""
    uid, key, val = [], [], []
    next_uid = 0
    for i in range(copies):
        target = next_uid
        next_uid += 1
        for g in range(groups_per_unit):
            members = list(range(next_uid, next_uid + size - 1))
            next_uid += size - 1
            if with_target:
                uid.append(target)
                key.append(f"{prefix}{i}_{g}")
                val.append(value)
            uid.extend(members)
            key.extend([f"{prefix}{i}_{g}"] * len(members))
            val.extend([others] * len(members))
    return pa.table({"uid": pa.array(uid, pa.int64()), "k": pa.array(key, pa.string()), "v": pa.array(val, pa.float64())})


def sparse_releases(tbl: pa.Table, runs: int, source: SeededNoise, caps: int, eps: float, delta: float,
                    sql: str = "SELECT k, COUNT(*) AS n FROM t GROUP BY k",
                    options: dict[str, Any] | None = None, columns: dict[str, Any] | None = None,
                    ) -> tuple[list[pa.Table], dpsql.Release, tuple[float, float]]:
    def register(s: dpsql.Session) -> None:
        s.register("t", tbl, privacy_unit="uid", max_groups_per_unit=caps, max_rows_per_group=1,
                   columns=columns or {})
    run = Runner(register, source)
    try:
        out = []
        r = None
        for _ in range(runs):
            r = run.query(sql, epsilon=eps, delta=delta, options=options)
            out.append(r.table)
        assert r is not None
        return out, r, run.cost()
    finally:
        run.close()


def released_counts(tables: list[pa.Table], col: str = "n") -> dict[str, np.ndarray]:
    """Per release: key -> released value (only released keys)."""
    return [dict(zip(t.column("k").to_pylist(), t.column(col).to_pylist(), strict=True)) for t in tables]  # type: ignore[return-value]


# -- 1. sparse histogram: the Gaussian part (a person in a large group) --------------------------


def audit_sparse_gaussian(factor: float, seed: str, runs: int = 10) -> dict[str, Any]:
    """C_u = 1, target in a group of c = 12 (far above τ*): D has count c, D' count c − 1.
    Events S_k = {released count >= c + k}, k = 0..4 (union bound over the family)."""
    eps, delta, copies, c = 1.0, 0.05, 3000, 12
    res = {}
    for side, with_target in (("D", True), ("D'", False)):
        tbl = groups_table(copies, c, with_target=with_target)
        tabs, rel, cost = sparse_releases(tbl, runs, ScaledNoise(f"{seed}:{side}", factor), 1, eps, delta)
        vals = [np.asarray(t.column("n").to_numpy(zero_copy_only=False), dtype=float) for t in tabs]
        rows = [t.num_rows for t in tabs]
        assert all(r == copies for r in rows)  # every group is far above the threshold
        res[side] = np.concatenate(vals)
        res["cost"], res["details"] = cost, rel.details
    n_d, n_dp = res["D"].size, res["D'"].size
    ks = range(5)
    alpha = FAIL / 2 / len(ks)
    lbs = {}
    for k in ks:
        kd = int(np.sum(res["D"] >= c + k))
        kdp = int(np.sum(res["D'"] >= c + k))
        lbs[k] = eps_lower_bound(kd, n_d, kdp, n_dp, res["cost"][1], alpha)
    # exact law of the released count: c + rint(N(0, σ²)), σ the spec's least σ for (ε, δ), L2 = 1
    sigma = least_sigma(eps, delta)
    k_fix = 2
    p_theory = float(special.ndtr(-(k_fix - 0.5) / sigma))
    k_obs = int(np.sum(res["D"] >= c + k_fix))
    return {"eps_lb": max(lbs.values()), "lbs": lbs, "cost": res["cost"], "sigma_spec": sigma,
            "sigma_engine": res["details"]["sigma"], "consistent": consistent(k_obs, n_d, p_theory, FAIL / 2),
            "freq": k_obs / n_d, "p_theory": p_theory, "n": n_d}


def test_sparse_histogram_gaussian_part() -> None:
    a = audit_sparse_gaussian(1.0, "sparse-gauss")
    eps_c, delta_c = a["cost"]
    assert eps_c == 1.0 and 0.05 <= delta_c < 0.05 + 1e-9
    assert a["sigma_engine"] == pytest.approx(a["sigma_spec"], rel=1e-8)
    assert a["eps_lb"] <= eps_c, a
    assert a["eps_lb"] > 0.6, a  # the audit has power: the bound is close to the claim
    assert a["consistent"], a


def test_sparse_histogram_gaussian_part_control_half_sigma() -> None:
    a = audit_sparse_gaussian(0.5, "sparse-gauss-ctl", runs=5)
    assert a["eps_lb"] > a["cost"][0], a
    assert not a["consistent"], a


# -- 2. sparse histogram: the key-release threshold (a person alone in C_u groups) ----------------


def audit_sparse_threshold(factor: float, seed: str, runs: int = 12, tau: int = 1, tau_as_option: bool = False,
                           ) -> dict[str, Any]:
    """C_u = 3: the target sits in 3 groups of exactly τ distinct units (the δ_infinite branch,
    docs/mechanisms.md §1.4–1.5). In D' those groups hold τ − 1 units, below the deterministic
    threshold, so their keys can never appear (an infinite-loss event): S = {some key of the
    target released}, P_D'(S) = 0 exactly. τ is registered with the table, or (``tau_as_option``)
    raised by the query's ``tau`` option."""
    eps, delta, copies, cu = 1.0, 0.05, 8000 // tau, 3
    filler = groups_table(1, 30, with_target=False, prefix="f")  # one unrelated large group on both sides
    hits, per_group, total_groups = 0, 0, 0
    options = {"tau": tau} if tau_as_option else None
    for side in ("D", "D'"):
        tgt = groups_table(copies, tau, with_target=side == "D", groups_per_unit=cu)
        tbl = pa.table({"uid": pa.concat_arrays([tgt.column("uid").combine_chunks(),
                                                 pa.array(filler.column("uid").to_numpy() + 10**7)]),
                        "k": pa.concat_arrays([tgt.column("k").combine_chunks(), filler.column("k").combine_chunks()]),
                        "v": pa.concat_arrays([tgt.column("v").combine_chunks(), filler.column("v").combine_chunks()])})

        def register(s: dpsql.Session, tbl: pa.Table = tbl) -> None:
            s.register("t", tbl, privacy_unit="uid", max_groups_per_unit=cu, max_rows_per_group=1,
                       tau=1 if tau_as_option else tau)
        run = Runner(register, ScaledNoise(f"{seed}:{side}", factor))
        try:
            tabs = [run.query("SELECT k, COUNT(*) AS n FROM t GROUP BY k", epsilon=eps, delta=delta, options=options).table
                    for _ in range(runs)]
            cost = run.cost()
        finally:
            run.close()
        if side == "D":
            for t in tabs:
                keys = [k for k in t.column("k").to_pylist() if not k.startswith("f")]
                per_group += len(keys)
                hits += len({k.split("_")[0] for k in keys})
                total_groups += copies * cu
        else:
            dp_hits = sum(sum(1 for k in t.column("k").to_pylist() if not k.startswith("f")) for t in tabs)
            assert dp_hits == 0
    details = run.session_details
    n = copies * runs
    sigma, tau_star = details["sigma"], details["tau_star"]
    assert details["tau"] == tau
    p1 = float(special.ndtr(-(tau_star - tau) / sigma))  # one at-threshold group released
    p_any = 1 - (1 - p1) ** cu  # δ_infinite
    alpha = FAIL / 3
    return {"eps_lb": eps_lower_bound(hits, n, 0, n, cost[1], alpha),
            "delta_lb": delta_lower_bound(hits, n, 0, n, cost[0], alpha),
            "cost": cost, "freq": hits / n, "p_theory": p_any, "sigma": sigma, "tau_star": tau_star,
            "consistent": consistent(hits, n, p_any, alpha) and consistent(per_group, total_groups, p1, alpha),
            "n": n}


def test_sparse_histogram_threshold() -> None:
    a = audit_sparse_threshold(1.0, "sparse-thr")
    eps_c, delta_c = a["cost"]
    assert a["delta_lb"] <= delta_c and a["eps_lb"] <= eps_c, a
    assert a["delta_lb"] > 0.5 * delta_c, a  # power: the bound nearly reaches the charged δ
    assert a["consistent"], a


def test_sparse_histogram_threshold_control_noise_too_large() -> None:
    a = audit_sparse_threshold(1.5, "sparse-thr-ctl", runs=4)
    assert a["delta_lb"] > a["cost"][1] and a["eps_lb"] > a["cost"][0], a
    assert not a["consistent"], a


@pytest.mark.parametrize("as_option", [False, True])
def test_sparse_histogram_threshold_tau_3(as_option: bool) -> None:
    """τ = 3 (registered, or raised by the query): the margin is τ* − τ, not τ* − 1."""
    a = audit_sparse_threshold(1.0, f"sparse-thr3-{as_option}", runs=9, tau=3, tau_as_option=as_option)
    assert a["delta_lb"] <= a["cost"][1] and a["eps_lb"] <= a["cost"][0], a
    assert a["consistent"], a


# -- 3. sparse histogram: one group at the threshold and two far above (Lemma 5.3) ----------------


def mixed_table(copies: int, big: int, *, with_target: bool) -> pa.Table:
    uid, key = [], []
    nxt = 0
    for i in range(copies):
        t = nxt
        nxt += 1
        if with_target:
            uid += [t, t, t]
            key += [f"a{i}", f"b{i}_0", f"b{i}_1"]
        for g in range(2):
            uid += list(range(nxt, nxt + big - 1))
            key += [f"b{i}_{g}"] * (big - 1)
            nxt += big - 1
    return pa.table({"uid": np.asarray(uid, dtype=np.int64), "k": np.asarray(key), "v": np.zeros(len(uid))})


def audit_sparse_mixed(factor: float, seed: str, runs: int = 9) -> dict[str, Any]:
    """C_u = 3 with a₌ = 1 (a group where the target is alone) and a₊ = 2 (groups of c = 20).
    Direction D → D': S_k = {the target's lone key released} ∪ {both big groups released with
    counts summing to >= 2c + k}; the exact bound is 1 − P + P·δ_G(ε − ln P; √2/σ)."""
    eps, delta, copies, c = 1.0, 0.05, 2000, 20
    out: dict[str, Any] = {}
    for side, wt in (("D", True), ("D'", False)):
        tabs, rel, cost = sparse_releases(mixed_table(copies, c, with_target=wt), runs,
                                          ScaledNoise(f"{seed}:{side}", factor), 3, eps, delta)
        lone, sums = [], []
        for t in tabs:
            d = dict(zip(t.column("k").to_pylist(), t.column("n").to_pylist(), strict=True))
            for i in range(copies):
                lone.append(f"a{i}" in d)
                b0, b1 = d.get(f"b{i}_0"), d.get(f"b{i}_1")
                sums.append(-math.inf if b0 is None or b1 is None else b0 + b1)
        out[side] = (np.asarray(lone), np.asarray(sums, dtype=float))
        out["cost"], out["details"] = cost, rel.details
    ks = (0, 2, 4, 5, 6, 8)
    alpha = FAIL / 2 / len(ks)
    lbs = {}
    n = copies * runs
    for k in ks:
        ev_d = out["D"][0] | (out["D"][1] >= 2 * c + k)
        ev_dp = out["D'"][0] | (out["D'"][1] >= 2 * c + k)
        lbs[k] = eps_lower_bound(int(ev_d.sum()), n, int(ev_dp.sum()), n, cost[1], alpha)
    assert not out["D'"][0].any()
    return {"eps_lb": max(lbs.values()), "lbs": lbs, "cost": out["cost"], "n": n,
            "sigma": out["details"]["sigma"], "tau_star": out["details"]["tau_star"]}


def test_sparse_histogram_mixed_threshold_and_gaussian() -> None:
    a = audit_sparse_mixed(1.0, "sparse-mixed")
    assert a["eps_lb"] <= a["cost"][0], a


def test_sparse_histogram_mixed_control() -> None:
    a = audit_sparse_mixed(0.6, "sparse-mixed-ctl", runs=5)
    assert a["eps_lb"] > a["cost"][0], a


# -- 4. public-domain GROUP BY (Gaussian and Laplace), VARIANCE / STDDEV, quantiles ---------------


def copies_table(copies: int, target: list[float], others: list[float], *, with_target: bool) -> pa.Table:
    """Key i holds the ``others`` values (one unit each) and, in D, the target's value(s)."""
    uid, key, val = [], [], []
    nxt = 0
    for i in range(copies):
        vals = (list(others) + (list(target) if with_target else []))
        owners = list(range(nxt, nxt + len(others))) + ([nxt + len(others)] * len(target) if with_target else [])
        nxt += len(others) + 1
        uid += owners
        key += [f"k{i}"] * len(vals)
        val += vals
    return pa.table({"uid": np.asarray(uid, dtype=np.int64), "k": np.asarray(key), "v": np.asarray(val, dtype=float)})


def public_releases(copies: int, target: list[float], others: list[float], sql: str, cols: list[str],
                    eps: float, delta: float, runs: int, source_seed: str, factor: float,
                    bounds: tuple[float, float] = (0.0, 10.0), rows_per_group: int = 1,
                    granularity: float | None = None, others_dp: list[float] | None = None,
                    expect_all: bool = True) -> dict[str, Any]:
    keys = [f"k{i}" for i in range(copies)]
    out: dict[str, Any] = {}
    vcol: dict[str, Any] = {"bounds": bounds}
    if granularity is not None:
        vcol["granularity"] = granularity
    for side, wt in (("D", True), ("D'", False)):
        tbl = copies_table(copies, target, others if wt or others_dp is None else others_dp, with_target=wt)

        def register(s: dpsql.Session, tbl: pa.Table = tbl) -> None:
            s.register("t", tbl, privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=rows_per_group,
                       columns={"k": {"domain": keys}, "v": vcol})
        run = Runner(register, ScaledNoise(f"{source_seed}:{side}", factor))
        try:
            vals: dict[str, list[np.ndarray]] = {c: [] for c in cols}
            released = 0
            for _ in range(runs):
                r = run.query(sql, epsilon=eps, delta=delta)
                assert r.table.num_rows == copies or not expect_all
                released += r.table.num_rows
                for c in cols:
                    vals[c].append(np.asarray([math.nan if x is None else x for x in r.table.column(c).to_pylist()],
                                              dtype=float))
            out[side] = {c: np.concatenate(v) for c, v in vals.items()}
            out[side]["__keys"] = released
            out["cost"], out["details"] = run.cost(), r.details
        finally:
            run.close()
    return out


def family_eps_lb(out: dict[str, Any], events: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]],
                  alpha: float) -> tuple[float, dict[str, float]]:
    a = alpha / len(events)
    lbs = {}
    for name, ev in events.items():
        e_d, e_dp = ev(out["D"]), ev(out["D'"])
        lbs[name] = eps_lower_bound(int(e_d.sum()), e_d.size, int(e_dp.sum()), e_dp.size, out["cost"][1], a)
    return max(lbs.values()), lbs


def threshold_eps_lb(stat: dict[str, np.ndarray], thresholds: list[float], delta: float) -> tuple[float, dict[str, float]]:
    """:func:`family_eps_lb` over the events {statistic >= t}, t in ``thresholds``, of one statistic per release."""
    events = {f">={t:g}": (lambda o, t=t: o["x"] >= t) for t in thresholds}
    return family_eps_lb({"D": {"x": stat["D"]}, "D'": {"x": stat["D'"]}, "cost": (None, delta)}, events, FAIL)


def audit_public_sum_gaussian(factor: float, seed: str, runs: int = 8) -> dict[str, Any]:
    """SUM over public keys, Gaussian: the target at the clamp bound (value 1000, bounds (0, 10)),
    in a key with two others at the bound: Δ = 10. Events {sum >= 30 + j}."""
    eps, delta = 1.0, 0.05
    out = public_releases(1500, [1000.0], [10.0, 10.0], "SELECT k, SUM(v) AS s FROM t GROUP BY k", ["s"],
                          eps, delta, runs, seed, factor)
    events = {f">={30 + j}": (lambda o, j=j: o["s"] >= 30 + j) for j in (5, 10, 13, 15, 20)}
    lb, lbs = family_eps_lb(out, events, FAIL / 2)
    sigma = 10 * least_sigma(eps, delta)
    p = float(special.ndtr(-12.5 / sigma))  # released = 30 + rint(N(0, σ²)) on the integer grid
    k = int((out["D"]["s"] >= 43).sum())
    return {"eps_lb": lb, "lbs": lbs, "cost": out["cost"], "n": out["D"]["s"].size, "freq": k / out["D"]["s"].size,
            "p_theory": p, "consistent": consistent(k, out["D"]["s"].size, p, FAIL / 2),
            "sigma_engine": out["details"]["expected_accuracy"]["s"]["noise_std"], "sigma_spec": sigma}


def test_public_sum_gaussian() -> None:
    a = audit_public_sum_gaussian(1.0, "pub-sum")
    assert a["eps_lb"] <= a["cost"][0], a
    assert a["sigma_engine"] == pytest.approx(a["sigma_spec"], rel=1e-8)
    assert a["consistent"], a


def test_public_sum_gaussian_control() -> None:
    a = audit_public_sum_gaussian(0.5, "pub-sum-ctl", runs=4)
    assert a["eps_lb"] > a["cost"][0] and not a["consistent"], a


def audit_public_count_laplace(factor: float, seed: str, runs: int = 8) -> dict[str, Any]:
    """COUNT over public keys, δ = 0 (snapping Laplace, grid 2): 4 units vs 3. Events {n >= 4 + j}."""
    eps = 1.0
    out = public_releases(1500, [1.0], [1.0, 1.0, 1.0], "SELECT k, COUNT(*) AS n FROM t GROUP BY k", ["n"],
                          eps, 0.0, runs, seed, factor)
    events = {f">={4 + j}": (lambda o, j=j: o["n"] >= 4 + j) for j in (0, 2, 4)}
    lb, lbs = family_eps_lb(out, events, FAIL / 2)
    lam = 1 / (1 - 2.0**-45 * (2.0**35 + 2))  # docs §7.2: Δ = 1, Λ = 2, B = 2^34·Λ
    p = 0.5 * math.exp(-1 / lam)  # P(2·rint((4 + L)/2) >= 6) = P(L >= 1)
    k = int((out["D"]["n"] >= 6).sum())
    snap = out["details"]["snapping"]["__users"]
    return {"eps_lb": lb, "lbs": lbs, "cost": out["cost"], "n": out["D"]["n"].size, "freq": k / out["D"]["n"].size,
            "p_theory": p, "consistent": consistent(k, out["D"]["n"].size, p, FAIL / 2),
            "lambda_engine": snap["lambda"], "lambda_spec": lam, "grid": snap["grid"]}


def test_public_count_laplace() -> None:
    a = audit_public_count_laplace(1.0, "pub-count")
    assert a["cost"] == (1.0, 0.0)
    assert a["lambda_engine"] == pytest.approx(a["lambda_spec"], rel=1e-12) and a["grid"] == 2.0
    assert a["eps_lb"] <= a["cost"][0], a
    assert a["consistent"], a


def test_public_count_laplace_control() -> None:
    a = audit_public_count_laplace(0.5, "pub-count-ctl", runs=4)
    assert a["eps_lb"] > a["cost"][0] and not a["consistent"], a


def _nan_ge(x: np.ndarray, t: float) -> np.ndarray:
    return np.nan_to_num(x, nan=-math.inf) >= t


def _nan_le(x: np.ndarray, t: float) -> np.ndarray:
    return np.nan_to_num(x, nan=math.inf) <= t


def audit_public_ratio(sql: str, col: str, ge: tuple[float, ...], le: tuple[float, ...], factor: float, seed: str,
                       runs: int = 7) -> dict[str, Any]:
    """AVG, or VARIANCE / STDDEV, over public keys (noisy count, centred sum and, for the variances, the
    sum of squares; Gaussian): four others at 0 and the target at the upper clamp bound (value 1000,
    bounds (0, 10)). No closed form for the law of the released ratio: ε_lb only, over the events
    {col >= t} for t in ``ge``, {col <= t} for t in ``le`` (NULL counts as neither)."""
    out = public_releases(1500, [1000.0], [0.0] * 4, sql, [col], 1.0, 0.05, runs, seed, factor)
    events: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]] = {
        **{f">={t}": (lambda o, t=t: _nan_ge(o[col], t)) for t in ge},
        **{f"<={t}": (lambda o, t=t: _nan_le(o[col], t)) for t in le},
    }
    lb, lbs = family_eps_lb(out, events, FAIL)
    return {"eps_lb": lb, "lbs": lbs, "cost": out["cost"], "n": out["D"][col].size}


AVG = ("SELECT k, AVG(v) AS a FROM t GROUP BY k", "a", (1.0, 2.0, 3.0, 5.0), (0.0, 0.5))
VARIANCE = ("SELECT k, VARIANCE(v) AS var FROM t GROUP BY k", "var", (5.0, 10.0, 20.0), (0.0, 2.0))


@pytest.mark.parametrize(("case", "seed"), [(AVG, "pub-avg"), (VARIANCE, "pub-var")], ids=["avg", "variance"])
def test_public_ratio(case: tuple[Any, ...], seed: str) -> None:
    a = audit_public_ratio(*case, 1.0, seed)
    assert a["eps_lb"] <= a["cost"][0], a


@pytest.mark.parametrize(("case", "seed"), [(AVG, "pub-avg-ctl"), (VARIANCE, "pub-var-ctl")], ids=["avg", "variance"])
def test_public_ratio_control(case: tuple[Any, ...], seed: str) -> None:
    a = audit_public_ratio(*case, 0.3, seed, runs=4)
    assert a["eps_lb"] > a["cost"][0], a


def median_law(values: list[float], eps_em: float, n_cand: int = 11) -> np.ndarray:
    """docs/mechanisms.md §9: the exponential mechanism's law for MEDIAN on the grid 0..10 (one row
    per unit, Δ = ½), with the uniform mixture γ = 2⁻¹⁰."""
    x = np.arange(n_cand, dtype=float)
    a = np.array([sum(v < xi for v in values) for xi in x], dtype=float)
    b = np.array([sum(v > xi for v in values) for xi in x], dtype=float)
    h = len(values) - a - b  # the rows at x_i, counted below or above as fits best
    u = -np.maximum(np.maximum(0.5 * a - 0.5 * (b + h), 0.5 * b - 0.5 * (a + h)), 0)
    w = np.exp(eps_em * u / (2 * 0.5))
    gamma = 2.0**-10
    return (1 - gamma) * w / w.sum() + gamma / n_cand


def audit_median(score_factor: float, seed: str, runs: int = 6) -> dict[str, Any]:
    """MEDIAN over public keys (exponential mechanism on the public grid 0..10): one other at 5,
    the target at the upper clamp bound (1000 → 10). Events fixed from the exact law."""
    import dpsql.mechanisms.quantile as qm

    eps = 1.0
    orig = qm.score_scale
    qm.score_scale = lambda e, d: orig(e, d) * score_factor  # type: ignore[assignment]
    try:
        out = public_releases(1500, [1000.0], [5.0], "SELECT k, MEDIAN(v) AS m FROM t GROUP BY k", ["m"],
                              eps, 0.0, runs, seed, 1.0, granularity=1.0)
    finally:
        qm.score_scale = orig  # type: ignore[assignment]
    agg = out["details"]["aggregates"][0]
    assert agg["candidates"] == 11 and agg["utility_sensitivity"] == 0.5
    eps_run = out["details"]["epsilon_per_release"]
    law_d, law_dp = median_law([5.0, 10.0], eps_run), median_law([5.0], eps_run)
    exact_eps = float(np.max(np.abs(np.log(law_d / law_dp))))
    events = {"6..9": lambda o: (o["m"] >= 6) & (o["m"] <= 9), ">=6": lambda o: o["m"] >= 6,
              "<=4": lambda o: o["m"] <= 4, "<=5": lambda o: o["m"] <= 5}
    lb, lbs = family_eps_lb(out, events, FAIL / 4)
    alpha = FAIL / 8
    # reversed direction (D' as the "high" side) for the events that favour D'
    for name in ("<=4", "<=5"):
        e_d, e_dp = events[name](out["D'"]), events[name](out["D"])
        lbs["rev" + name] = eps_lower_bound(int(e_d.sum()), e_d.size, int(e_dp.sum()), e_dp.size, 0.0, alpha / 2)
    lb = max(lbs.values())
    n = out["D"]["m"].size
    ok = True
    for side, law in (("D", law_d), ("D'", law_dp)):
        k = int(((out[side]["m"] >= 6) & (out[side]["m"] <= 9)).sum())
        ok &= consistent(k, n, float(law[6:10].sum()), FAIL / 4)
    return {"eps_lb": lb, "lbs": lbs, "cost": out["cost"], "n": n, "exact_eps": exact_eps, "consistent": ok}


def test_median_exponential_mechanism() -> None:
    a = audit_median(1.0, "median")
    assert a["cost"] == (1.0, 0.0)
    assert a["exact_eps"] <= 1.0
    assert a["eps_lb"] <= a["cost"][0], a
    assert a["consistent"], a


def test_median_control_double_scale() -> None:
    a = audit_median(4.0, "median-ctl", runs=4)
    assert a["eps_lb"] > a["cost"][0] and not a["consistent"], a


# -- 5. persons over the caps: the bounding must hold the loss to one capped contribution ---------


def overcap_table(copies: int, c: int, groups: int, rows: int, *, with_target: bool, drop: int = 1) -> pa.Table:
    """Copy i: ``groups`` groups of c − 1 others; the target has ``rows`` rows in each of them.
    ``drop`` > 1 removes that many persons per copy on the D' side (the control: two persons)."""
    uid, key = [], []
    nxt = 0
    for i in range(copies):
        t = nxt
        nxt += 1
        if with_target:
            for g in range(groups):
                uid += [t] * rows
                key += [f"g{i}_{g}"] * rows
        for g in range(groups):
            members = list(range(nxt, nxt + c - 1))
            nxt += c - 1
            if not with_target and g < drop - 1:
                members = members[1:]
            uid += members
            key += [f"g{i}_{g}"] * len(members)
    return pa.table({"uid": np.asarray(uid, dtype=np.int64), "k": np.asarray(key), "v": np.zeros(len(uid))})


def audit_sparse_overcap(drop: int, seed: str, runs: int = 12) -> dict[str, Any]:
    """C_u = 1, k = 1, but the target has 3 rows in each of 2 groups of size c = 15: bounding keeps
    one group and one row, so Σ counts moves by 1 (σ√2 noise on the sum). Events
    {n_0 + n_1 >= 2c − 1 + j}. Control: D' lacks two persons (what a broken bound would allow)."""
    eps, delta, copies, c = 1.0, 0.05, 1500, 15
    sums = {}
    for side, wt in (("D", True), ("D'", False)):
        tabs, rel, cost = sparse_releases(overcap_table(copies, c, 2, 3, with_target=wt, drop=drop), runs,
                                          ScaledNoise(f"{seed}:{side}", 1.0), 1, eps, delta)
        s = []
        for t in tabs:
            d = dict(zip(t.column("k").to_pylist(), t.column("n").to_pylist(), strict=True))
            s += [d.get(f"g{i}_0", -1000) + d.get(f"g{i}_1", -1000) for i in range(copies)]
        sums[side] = np.asarray(s, dtype=float)
    lb, lbs = threshold_eps_lb(sums, [2 * c - 1 + k for k in (1, 2, 3, 4)], cost[1])
    return {"eps_lb": lb, "lbs": lbs, "cost": cost, "n": sums["D"].size}


def test_sparse_histogram_over_the_caps() -> None:
    a = audit_sparse_overcap(1, "sparse-overcap")
    assert a["eps_lb"] <= a["cost"][0], a


def test_sparse_histogram_over_the_caps_control_two_persons() -> None:
    a = audit_sparse_overcap(2, "sparse-overcap-ctl", runs=6)
    assert a["eps_lb"] > a["cost"][0], a


def audit_public_sum_overcap(extra_drop: bool, seed: str, runs: int = 7) -> dict[str, Any]:
    """SUM over public keys with max_rows_per_group = 2: the target has 5 rows at the bound (1000 →
    10), two others one row each at 10, so Δ = 20. Events {sum >= 40 + j}. Control: D' also lacks
    one other (a contribution of 30, what a broken row cap would allow)."""
    others_dp = [10.0] if extra_drop else [10.0, 10.0]
    keys_n = 1500
    eps, delta = 1.0, 0.05
    out = public_releases(keys_n, [1000.0] * 5, [10.0, 10.0], "SELECT k, SUM(v) AS s FROM t GROUP BY k", ["s"],
                          eps, delta, runs, seed, 1.0, rows_per_group=2, others_dp=others_dp)
    events = {f">={40 + j}": (lambda o, j=j: o["s"] >= 40 + j) for j in (10, 20, 25, 30, 40)}
    lb, lbs = family_eps_lb(out, events, FAIL)
    return {"eps_lb": lb, "lbs": lbs, "cost": out["cost"], "n": out["D"]["s"].size,
            "noise_std": out["details"]["expected_accuracy"]["s"]["noise_std"]}


def test_public_sum_over_the_caps() -> None:
    a = audit_public_sum_overcap(False, "pub-overcap")
    assert a["noise_std"] == pytest.approx(20 * least_sigma(1.0, 0.05), rel=1e-8)
    assert a["eps_lb"] <= a["cost"][0], a


def test_public_sum_over_the_caps_control() -> None:
    a = audit_public_sum_overcap(True, "pub-overcap-ctl", runs=4)
    assert a["eps_lb"] > a["cost"][0], a


# -- 6. GROUP BY over a join (one person per join tuple: per-person L2 clipping + Gaussian) -------


def join_tables(copies: int, delta_cap: int, target_orders: int, others: int, *, with_target: bool,
                extra_drop: int = 0) -> tuple[pa.Table, pa.Table]:
    """Key i (a public nation): the target customer with ``target_orders`` orders and ``others``
    customers with one order each (``extra_drop`` of them also missing on the D' side)."""
    cust, nat, o_cust = [], [], []
    nxt = 0
    for i in range(copies):
        t = nxt
        nxt += 1
        if with_target:
            cust.append(t)
            nat.append(i)
            o_cust += [t] * target_orders
        oth = list(range(nxt, nxt + others))
        nxt += others
        if not with_target:
            oth = oth[extra_drop:]
        cust += oth
        nat += [i] * len(oth)
        o_cust += oth
    customer = pa.table({"c_custkey": np.asarray(cust, dtype=np.int64), "c_nat": np.asarray(nat, dtype=np.int64)})
    orders = pa.table({"o_orderkey": np.arange(len(o_cust), dtype=np.int64), "o_custkey": np.asarray(o_cust, dtype=np.int64)})
    return customer, orders


JOIN_GROUP_SQL = ("SELECT c.c_nat, COUNT(*) AS n FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey "
                  "GROUP BY c.c_nat")


def join_releases(copies: int, customer: pa.Table, orders: pa.Table, cap: int, sql: str, runs: int,
                  source: SeededNoise, eps: float, delta: float,
                  options: dict[str, Any] | None = None) -> tuple[list[pa.Table], dpsql.Release, tuple[float, float]]:
    def register(s: dpsql.Session) -> None:
        s.register("customer", customer, privacy_unit="c_custkey", columns={"c_nat": {"domain": list(range(copies))}})
        s.register("orders", orders, references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": cap})
    run = Runner(register, source)
    try:
        tabs, r = [], None
        for _ in range(runs):
            r = run.query(sql, epsilon=eps, delta=delta, options=options)
            tabs.append(r.table)
        assert r is not None
        return tabs, r, run.cost()
    finally:
        run.close()


def audit_join_group_by(factor: float, seed: str, runs: int = 2, extra_drop: int = 0) -> dict[str, Any]:
    """The target owns Δ = 4 orders, all in one public key (L2 contribution 4, the clip norm);
    two others own one order each. D: count 6, D': 2. Events {n >= 6 + j}."""
    eps, delta, copies, cap = 1.0, 0.05, 1000, 4
    vals = {}
    for side, wt in (("D", True), ("D'", False)):
        cu, od = join_tables(copies, cap, cap, 2 + extra_drop, with_target=wt, extra_drop=extra_drop)
        tabs, rel, cost = join_releases(copies, cu, od, cap, JOIN_GROUP_SQL, runs,
                                        ScaledNoise(f"{seed}:{side}", factor), eps, delta)
        assert all(t.num_rows == copies for t in tabs)
        vals[side] = np.concatenate([np.asarray(t.column("n").to_pylist(), dtype=float) for t in tabs])
        details = rel.details
    base = 6 + extra_drop
    ks = (0, 2, 4, 6, 8, 10)
    alpha = FAIL / 2 / len(ks)
    lbs = {k: eps_lower_bound(int((vals["D"] >= base + k).sum()), vals["D"].size,
                              int((vals["D'"] >= base + k).sum()), vals["D'"].size, cost[1], alpha) for k in ks}
    sigma = details["sigma"]
    p = float(special.ndtr(-5.5 / sigma))  # P(6 + rint(N) >= 12)
    k_obs = int((vals["D"] >= base + 6).sum())
    return {"eps_lb": max(lbs.values()), "lbs": lbs, "cost": cost, "n": vals["D"].size, "sigma": sigma,
            "l2": details["l2_sensitivity"], "mechanism": details["mechanism"],
            "consistent": consistent(k_obs, vals["D"].size, p, FAIL / 2), "freq": k_obs / vals["D"].size, "p": p}


def test_join_group_by() -> None:
    a = audit_join_group_by(1.0, "join-group")
    assert a["mechanism"] == "clipped_gaussian" and a["l2"] == pytest.approx(4.0)
    assert a["eps_lb"] <= a["cost"][0], a
    assert a["consistent"], a


def test_join_group_by_control() -> None:
    a = audit_join_group_by(0.4, "join-group-ctl", runs=1)
    assert a["eps_lb"] > a["cost"][0] and not a["consistent"], a


# -- 7. scalar routes: one draw per release (small N; the benchmark runs them at large N) ---------


def s4s_tables(persons: int, cap: int, *, with_target: bool) -> tuple[pa.Table, pa.Table]:
    """The instance on which the amplification lemma is tight: ``persons`` people each own ``cap``
    orders and nobody else owns any; D' lacks them (two bystanders without orders on both sides)."""
    owners = list(range(persons)) if with_target else []
    cust = owners + [10**6, 10**6 + 1]
    o_cust = [u for u in owners for _ in range(cap)]
    return (pa.table({"c_custkey": np.asarray(cust, dtype=np.int64), "c_nat": np.zeros(len(cust), dtype=np.int64)}),
            pa.table({"o_orderkey": np.arange(len(o_cust), dtype=np.int64), "o_custkey": np.asarray(o_cust, dtype=np.int64)}))


S4S_SQL = "SELECT COUNT(*) AS n FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey"


def laplace_sf(a: float, lam: float) -> float:
    return 0.5 * math.exp(-a / lam) if a >= 0 else 1 - 0.5 * math.exp(a / lam)


def s4s_p_positive(details: dict[str, Any], fbars: list[float]) -> float:
    """P(released >= 1) for q = 1 (docs §3.5, snapping §5.3): step i releases
    Λ_i·rint((f̄_i + Lap(λ_i))/Λ_i) − bias_i with Λ_i the least power of two >= λ_i."""
    none = 1.0
    for st, f in zip(details["schedule"], fbars, strict=True):
        lam, bias = st["laplace_scale"], st["bias"]
        grid = 2.0 ** math.ceil(math.log2(lam))
        m = math.ceil((bias + 0.5) / grid)
        none *= 1 - laplace_sf(grid * (m - 0.5) - f, lam)
    return 1 - none


def audit_s4s_scalar(factor: float, seed: str, runs: int, eps: float = 4.0, q: float = 1.0,
                     persons: int = 1) -> dict[str, Any]:
    """DP-S4S scalar COUNT over a join (q = 1 makes the charge tight: joint ε = ε). Δ = 4; D: the
    target owns 4 orders, D': nobody owns any. Event {released >= 1}."""
    cap = 4
    out: dict[str, Any] = {}
    for side, wt in (("D", True), ("D'", False)):
        cu, od = s4s_tables(persons, cap, with_target=wt)

        def register(s: dpsql.Session, cu: pa.Table = cu, od: pa.Table = od) -> None:
            s.register("customer", cu, privacy_unit="c_custkey")
            s.register("orders", od, references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": cap})
        run = Runner(register, ScaledNoise(f"{seed}:{side}", factor), per_session=10**6)
        try:
            vals = []
            for _ in range(runs):
                r = run.query(S4S_SQL, epsilon=eps, options={"q": q})
                vals.append(r.table.column(0)[0].as_py())
            out[side] = np.asarray(vals, dtype=float)
            out["cost"], out["details"] = run.cost(), r.details
        finally:
            run.close()
    det = out["details"]
    assert det["mechanism"] == "dp_s4s" and det["tau_grid"] == [4.0, 1.0]
    alpha = FAIL / 2
    k_d, k_dp = int((out["D"] >= 1).sum()), int((out["D'"] >= 1).sum())
    lb = eps_lower_bound(k_d, runs, k_dp, runs, 0.0, alpha)
    res = {"eps_lb": lb, "cost": out["cost"], "n": runs, "freq_D": k_d / runs, "freq_D'": k_dp / runs,
           "joint": det["joint_cost"]["epsilon_joint"]}
    if q == 1.0:
        p_d = s4s_p_positive(det, [float(min(4, cap * persons)), float(min(1, cap * persons))])
        p_dp = s4s_p_positive(det, [0.0, 0.0])
        res.update(p_D=p_d, p_Dp=p_dp, exact_eps=math.log(max(p_d / p_dp, (1 - p_dp) / (1 - p_d))),
                   consistent=consistent(k_d, runs, p_d, alpha / 2) and consistent(k_dp, runs, p_dp, alpha / 2))
    return res


def test_s4s_scalar_join_count() -> None:
    """Power: N = 20 per side. The exact law of the event is checked, which catches a Laplace
    scale off by ~16x at ε = 8 (the control); ε_lb can only catch gross violations at this N.
    benchmarks/privacy_audit.py runs the same audit at N = 2000."""
    a = audit_s4s_scalar(1.0, "s4s", 20, eps=8.0)
    assert a["cost"] == (8.0, 0.0) and a["joint"] == pytest.approx(8.0, rel=1e-4)
    assert a["exact_eps"] <= 8.0
    assert a["eps_lb"] <= a["cost"][0], a
    assert a["consistent"], a


def test_s4s_scalar_join_count_control() -> None:
    a = audit_s4s_scalar(16.0, "s4s-ctl", 20, eps=8.0)
    assert not a["consistent"], a


def audit_suggest_caps(factor: float, seed: str, runs: int) -> dict[str, Any]:
    """suggest_caps (rows per person, one histogram of 21 power-of-two bins, snapping Laplace with
    Λ = 2, counts rint'ed and clipped at 0). Bins are noised independently with a public λ, so the
    13 targets of D, one alone in each of bins 0..12 (1, 2, 4, …, 4096 rows), give 12 draws of the
    one-person bin per release (bin 0 also holds a bystander); bins 1..20 of D' and bins 13..20
    of D are draws of the empty bin. Event {count >= 2}: P_D = P(L >= 0) = ½, P_D' = P(L >= 1) = ½e^{−1/λ}, a log-ratio
    of exactly 1/λ ≈ ε."""
    nb = 13
    hit: dict[str, list[bool]] = {"D": [], "D'": []}
    for side, wt in (("D", True), ("D'", False)):
        uid = np.repeat(np.arange(nb), 2 ** np.arange(nb)) if wt else np.zeros(0)
        tbl = pa.table({"uid": np.concatenate([uid, [10**6]]).astype(np.int64),
                        "k": np.asarray(["a"] * (len(uid) + 1))})  # + one bystander with 1 row (bin 0)

        def register(s: dpsql.Session, tbl: pa.Table = tbl) -> None:
            s.register("t", tbl, privacy_unit="uid", max_groups_per_unit=1)
        run = Runner(register, ScaledNoise(f"{seed}:{side}", factor), per_session=10**6)
        try:
            for _ in range(runs):
                r = run.call(lambda s: s.suggest_caps("t", epsilon=1.0))
                people = r.table.column("people").to_pylist()
                assert len(people) == 21
                if wt:
                    hit["D"] += [c >= 2 for c in people[1:nb]]  # bin 0 also holds the bystander
                    hit["D'"] += [c >= 2 for c in people[nb:]]
                else:
                    hit["D'"] += [c >= 2 for c in people[1:]]
            cost, details = run.cost(), r.details
        finally:
            run.close()
    lam = details["snapping"]["lambda"]
    p_d, p_dp = 0.5, 0.5 * math.exp(-1 / lam)
    n_d, n_dp = len(hit["D"]), len(hit["D'"])
    k_d, k_dp = sum(hit["D"]), sum(hit["D'"])
    alpha = FAIL / 2
    return {"eps_lb": eps_lower_bound(k_d, n_d, k_dp, n_dp, 0.0, alpha), "cost": cost, "n": (n_d, n_dp),
            "freq_D": k_d / n_d, "freq_D'": k_dp / n_dp, "p_D": p_d, "p_D'": p_dp, "lambda": lam,
            "consistent": consistent(k_d, n_d, p_d, alpha / 2) and consistent(k_dp, n_dp, p_dp, alpha / 2)}


def test_suggest_caps() -> None:
    a = audit_suggest_caps(1.0, "caps", 30)
    assert a["cost"] == (1.0, 0.0) and a["lambda"] == pytest.approx(1 / (1 - 2.0**-45 * (2.0**35 + 2)), rel=1e-12)
    assert a["eps_lb"] <= a["cost"][0], a
    assert a["consistent"], a


def test_suggest_caps_control() -> None:
    a = audit_suggest_caps(0.4, "caps-ctl", 15)
    assert a["eps_lb"] > a["cost"][0] and not a["consistent"], a


def audit_dawa(factor: float, seed: str, runs: int, eps: float = 1.0) -> dict[str, Any]:
    """DAWA through query_many (16 bins, one row per person): D has the target alone in bin 5 and
    three bystanders in bin 15, D' only the bystanders (the "x = 0 vs e_j" neighbours of
    docs/mechanisms.md §2.4). Events on the released counts of [5, 5] and [4, 7]. One draw per
    release: the test file does not run this (too slow for power); benchmarks/privacy_audit.py does."""
    work = ["SELECT COUNT(*) FROM t WHERE x BETWEEN 5 AND 5", "SELECT COUNT(*) FROM t WHERE x BETWEEN 4 AND 7",
            "SELECT COUNT(*) FROM t WHERE x BETWEEN 0 AND 15", "SELECT COUNT(*) FROM t WHERE x BETWEEN 8 AND 15"]
    out: dict[str, Any] = {}
    for side, wt in (("D", True), ("D'", False)):
        xs = ([5] if wt else []) + [15, 15, 15]
        tbl = pa.table({"uid": np.arange(len(xs), dtype=np.int64), "x": np.asarray(xs, dtype=np.int64)})

        def register(s: dpsql.Session, tbl: pa.Table = tbl) -> None:
            s.register("t", tbl, privacy_unit="uid", max_rows_per_unit=1, columns={"x": {"bounds": (0, 16), "bins": 16}})
        run = Runner(register, ScaledNoise(f"{seed}:{side}", factor), per_session=10**6)
        try:
            got = [run.call(lambda s: s.query_many(work, epsilon=eps)).counts for _ in range(runs)]
        finally:
            run.close()
        out[side] = np.asarray(got, dtype=float)
        out["cost"] = run.cost()
    events = {f"[5,5]>={t}": (lambda o, t=t: o[:, 0] >= t) for t in (1, 2, 3)}
    events.update({f"[4,7]>={t}": (lambda o, t=t: o[:, 1] >= t) for t in (1, 2, 3)})
    a = FAIL / len(events) / 2
    lbs = {}
    for name, ev in events.items():
        e_d, e_dp = ev(out["D"]), ev(out["D'"])
        lbs[name] = max(eps_lower_bound(int(e_d.sum()), runs, int(e_dp.sum()), runs, 0.0, a),
                        eps_lower_bound(int(e_dp.sum()), runs, int(e_d.sum()), runs, 0.0, a))
    return {"eps_lb": max(lbs.values()), "lbs": lbs, "cost": out["cost"], "n": runs,
            "freq": {k: (float(ev(out["D"]).mean()), float(ev(out["D'"]).mean())) for k, ev in events.items()}}


# -- 8. reuse of a stored synopsis reads no private row -------------------------------------------


@pytest.mark.filterwarnings("ignore:epsilon=50 is unusually large")
def test_synopsis_reuse_is_post_processing(tmp_path: Any) -> None:
    """A free answer from a stored DAWA synopsis must be a function of that synopsis only: asked
    on D and on D' (another person's rows removed, the same declared version) it must be identical,
    while a charged query tells D from D' (the control). Deterministic (no failure probability)."""
    path = str(tmp_path / "ledger.duckdb")
    gen = np.random.default_rng(5)
    x = gen.integers(0, 32, 400)
    d = pa.table({"uid": np.arange(400, dtype=np.int64), "x": x.astype(np.int64)})
    heavy = np.isin(np.arange(400), np.arange(0, 400, 2))  # D' drops half the people
    dprime = d.filter(pa.array(~heavy))
    workload = ["SELECT COUNT(*) FROM t WHERE x BETWEEN 0 AND 7", "SELECT COUNT(*) FROM t WHERE x BETWEEN 8 AND 31"]
    reuse_sql = ["SELECT COUNT(*) FROM t WHERE x BETWEEN 3 AND 20",
                 "SELECT x, COUNT(*) AS n FROM t GROUP BY x ORDER BY x",
                 "SELECT MEDIAN(x) AS m FROM t"]

    def session(tbl: pa.Table, seed: str) -> dpsql.Session:
        s = dpsql.Session(ledger=path, budget=dpsql.Budget(10.0, 1e-5), create=True)
        use_noise(s, SeededNoise(seed))
        s.register("t", tbl, privacy_unit="uid", max_rows_per_unit=1, version="v1",
                   columns={"x": {"bounds": (0, 32), "bins": 32}})
        return s

    s = session(d, "reuse-1")
    first = s.query_many(workload, epsilon=1.0)
    assert not first.reused and first.cost.epsilon == 1.0
    s.close()
    answers = []
    for tbl, seed in ((d, "reuse-2"), (dprime, "reuse-3"), (d, "reuse-4")):
        s = session(tbl, seed)
        before = s.remaining()
        got = []
        for q in reuse_sql:
            r = s.query(q, epsilon=1.0, options={"reuse": "synopsis"})
            assert r.reused and r.cost == dpsql.Budget(0.0, 0.0), q
            got.append(r.table.to_pylist())
        assert s.remaining() == before
        answers.append(got)
        s.close()
    assert answers[0] == answers[1] == answers[2]
    # control: charged answers do tell the two datasets apart (zero noise would be exact; seeded
    # noise at epsilon=50 is within a few units, and the counts differ by ~100)
    fresh = []
    for tbl in (d, dprime):
        s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-5))
        use_noise(s, SeededNoise("reuse-ctl"))
        s.register("t", tbl, privacy_unit="uid", max_rows_per_unit=1, columns={"x": {"bounds": (0, 32), "bins": 32}})
        fresh.append(s.query(reuse_sql[0], epsilon=50.0).table.column(0)[0].as_py())
        s.close()
    assert abs(fresh[0] - fresh[1]) > 50


# -- 9. extra released columns and several groups per person --------------------------------------


def audit_sparse_extra_columns(factor: float, seed: str, runs: int = 6) -> dict[str, Any]:
    """Sparse histogram with COUNT(*) and SUM(v), k = 2 rows per group: the target has 5 rows at
    1000 (clamped to 10) in a group of c = 25 others (one row at 10 each). Bounded, the target moves
    COUNT(*) by 2 and SUM by 20, the column sensitivities (σ_j = Δ_j·σ, docs §1.11). Normalised,
    both shift by 1: events {n/2 + s/20 >= base + j}."""
    eps, delta, copies, c = 1.0, 0.05, 2000, 26
    stat = {}
    for side, wt in (("D", True), ("D'", False)):
        uid, key, val = [], [], []
        nxt = 0
        for i in range(copies):
            if wt:
                uid += [nxt] * 5
                key += [f"g{i}"] * 5
                val += [1000.0] * 5
            nxt += 1
            uid += list(range(nxt, nxt + c - 1))
            key += [f"g{i}"] * (c - 1)
            val += [10.0] * (c - 1)
            nxt += c - 1
        tbl = pa.table({"uid": np.asarray(uid, dtype=np.int64), "k": np.asarray(key), "v": np.asarray(val)})

        def register(s: dpsql.Session, tbl: pa.Table = tbl) -> None:
            s.register("t", tbl, privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=2,
                       columns={"v": {"bounds": (0.0, 10.0)}})
        run = Runner(register, ScaledNoise(f"{seed}:{side}", factor))
        try:
            vals = []
            for _ in range(runs):
                r = run.query("SELECT k, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY k", epsilon=eps, delta=delta)
                assert r.table.num_rows == copies
                n = np.asarray(r.table.column("n").to_pylist(), dtype=float)
                sm = np.asarray(r.table.column("s").to_pylist(), dtype=float)
                vals.append(n / 2 + sm / 20)
            stat[side] = np.concatenate(vals)
            cost, details = run.cost(), r.details
        finally:
            run.close()
    base = (c - 1) / 2 + 10 * (c - 1) / 20 + 2  # D's bounded truth: (c−1+2)/2 + (10(c−1)+20)/20
    lb, lbs = threshold_eps_lb(stat, [base + k for k in (0, 1, 2, 3, 4)], cost[1])
    return {"eps_lb": lb, "lbs": lbs, "cost": cost, "n": stat["D"].size,
            "sigma": details["sigma"], "extra": details["extra_columns"]}


def test_sparse_histogram_extra_columns() -> None:
    a = audit_sparse_extra_columns(1.0, "sparse-extra")
    assert a["eps_lb"] <= a["cost"][0], a


def test_sparse_histogram_extra_columns_control() -> None:
    a = audit_sparse_extra_columns(0.5, "sparse-extra-ctl", runs=4)
    assert a["eps_lb"] > a["cost"][0], a


def audit_public_two_keys(factor: float, seed: str, runs: int = 5) -> dict[str, Any]:
    """SUM over public keys with max_groups_per_unit = 2: the target has one row at the bound in
    each of its copy's two keys (with two others each), L2 sensitivity √2·10. Events on s_0 + s_1."""
    eps, delta, copies = 1.0, 0.05, 750
    keys = [f"k{i}_{g}" for i in range(copies) for g in range(2)]
    tot = {}
    for side, wt in (("D", True), ("D'", False)):
        uid, key, val = [], [], []
        nxt = 0
        for i in range(copies):
            t = nxt
            nxt += 1
            for g in range(2):
                if wt:
                    uid.append(t)
                    key.append(f"k{i}_{g}")
                    val.append(1000.0)
                uid += [nxt, nxt + 1]
                key += [f"k{i}_{g}"] * 2
                val += [10.0, 10.0]
                nxt += 2
        tbl = pa.table({"uid": np.asarray(uid, dtype=np.int64), "k": np.asarray(key), "v": np.asarray(val)})

        def register(s: dpsql.Session, tbl: pa.Table = tbl) -> None:
            s.register("t", tbl, privacy_unit="uid", max_groups_per_unit=2, max_rows_per_group=1,
                       columns={"k": {"domain": keys}, "v": {"bounds": (0.0, 10.0)}})
        run = Runner(register, ScaledNoise(f"{seed}:{side}", factor))
        try:
            vals = []
            for _ in range(runs):
                r = run.query("SELECT k, SUM(v) AS s FROM t GROUP BY k", epsilon=eps, delta=delta)
                d = dict(zip(r.table.column("k").to_pylist(), r.table.column("s").to_pylist(), strict=True))
                vals.append(np.asarray([d[f"k{i}_0"] + d[f"k{i}_1"] for i in range(copies)], dtype=float))
            tot[side] = np.concatenate(vals)
            cost, details = run.cost(), r.details
        finally:
            run.close()
    ks = (10, 15, 20, 25, 30)
    alpha = FAIL / 2 / len(ks)
    lbs = {k: eps_lower_bound(int((tot["D"] >= 60 + k).sum()), tot["D"].size,
                              int((tot["D'"] >= 60 + k).sum()), tot["D'"].size, cost[1], alpha) for k in ks}
    return {"eps_lb": max(lbs.values()), "lbs": lbs, "cost": cost, "n": tot["D"].size,
            "noise_std": details["expected_accuracy"]["s"]["noise_std"],
            "sigma_spec": 10 * least_sigma(eps, delta, math.sqrt(2))}


def test_public_two_keys_per_person() -> None:
    a = audit_public_two_keys(1.0, "pub-two")
    assert a["noise_std"] == pytest.approx(a["sigma_spec"], rel=1e-8)
    assert a["eps_lb"] <= a["cost"][0], a


def test_public_two_keys_per_person_control() -> None:
    a = audit_public_two_keys(0.5, "pub-two-ctl", runs=3)
    assert a["eps_lb"] > a["cost"][0], a


def audit_having(factor: float, seed: str, runs: int = 2) -> dict[str, Any]:
    """HAVING over public keys releases only which keys pass a condition on a hidden aggregate:
    it must be decided on the noisy value (and the hidden column charged). Key with 30 units vs
    29; event {key released} for HAVING COUNT(*) >= 31, whose law is exact: 30 + rint(N(0, σ²))
    >= 31 with σ = 1.8779, the least σ for (1, 0.01). Decided on true counts it would release
    the key never under D' and always under D."""
    out = public_releases(1500, [1.0], [1.0] * 29, "SELECT k, 1 AS one FROM t GROUP BY k HAVING COUNT(*) >= 31", [],
                          1.0, 0.01, runs, seed, factor, expect_all=False)
    d, dp = out["D"]["__keys"], out["D'"]["__keys"]
    n = 1500 * runs
    sigma = least_sigma(1.0, 0.01)
    p_d, p_dp = float(special.ndtr(-0.5 / sigma)), float(special.ndtr(-1.5 / sigma))  # 30 + rint(N) >= 31
    alpha = FAIL / 4
    return {"eps_lb": eps_lower_bound(d, n, dp, n, out["cost"][1], alpha * 2), "cost": out["cost"], "n": n,
            "freq": (d / n, dp / n), "p": (p_d, p_dp), "columns": out["details"]["columns"],
            "consistent": consistent(d, n, p_d, alpha) and consistent(dp, n, p_dp, alpha)}


def test_having_is_decided_on_noisy_values() -> None:
    a = audit_having(1.0, "having")
    assert a["columns"] == 1 and a["cost"][0] == 1.0
    assert a["eps_lb"] <= a["cost"][0], a
    assert a["consistent"], a


def test_having_control() -> None:
    a = audit_having(0.3, "having-ctl", runs=1)
    assert a["eps_lb"] > a["cost"][0] and not a["consistent"], a
