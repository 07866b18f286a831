"""The scalar join truncation's path (closed form / max-flow / certified LP) is chosen from the plan.

The paths differ in run time, so which one runs must not depend on one person's tuples: it is fixed
by the most people one join tuple can reach under the plan (``PeopleBound.per_tuple``), never by the
sample. Checked on neighbouring datasets (a person whose tuples hold two heavy people besides them,
switching a threshold from the max-flow to the LP under the sample-chosen dispatch, which is the
negative control), through the numeric core and through SQL; and the plan's paths give the value of
the exact ones (up to the certified slack G on the LP)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_joins import CHAIN, PATH2, _partsupp_session, make_session
from test_s4s_truncation import brute_force, instance

from dpsql.errors import ConfigError
from dpsql.mechanisms import _s4s_truncation as T
from dpsql.mechanisms import s4s as core
from dpsql.plan.analyze import analyze
from dpsql.plan.joins import bound_people
from dpsql.testing import seeded_noise, use_noise

TRIANGLE = ("SELECT COUNT(*) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src "
            "JOIN edge e3 ON e2.dst = e3.src AND e3.dst = e1.src")


def _prep(w: Any, ti: Any, ui: Any) -> T.Prepared:
    jt = core.validate_join_tuples(w, ti, ui)
    return T.prepare(jt.weights, jt.tuple_idx, jt.user_idx, jt.n_users)


def _counters(prep: T.Prepared, taus: tuple[float, ...], people: float | None) -> tuple[int, int, int]:
    T.STATS.reset()
    for t in taus:
        T.truncate(prep, t, people)
    return T.STATS.closed_form, T.STATS.max_flow, T.STATS.lp


# ----------------------------------------------------------------------------- the plan's bound
def test_people_per_tuple_comes_from_the_plan() -> None:
    s = make_session()
    try:
        cat = dict(s.tables)
        for sql, want in ((CHAIN, 1.0), ("SELECT COUNT(*) FROM edge", 2.0), (PATH2, 3.0), (TRIANGLE, 3.0),
                          ("SELECT COUNT(*) FROM lineitem", math.inf)):  # lineitem -> orders -> customer: looked up
            plan = analyze(sql, cat)
            assert plan.join is not None
            assert bound_people(plan.join, cat).per_tuple == want, sql
        assert "certified LP" in s.explain(PATH2, epsilon=1.0).parameters["truncation"]
        assert "max-flow" in s.explain("SELECT COUNT(*) FROM edge", epsilon=1.0).parameters["truncation"]
    finally:
        s.close()
    s, _ = _partsupp_session()
    try:
        plan = analyze("SELECT COUNT(*) FROM lineitem", dict(s.tables))  # a composite key looked up: unbounded
        assert plan.join is not None and bound_people(plan.join, dict(s.tables)).per_tuple == math.inf
    finally:
        s.close()


def test_path_class_and_argument_checks() -> None:
    assert [T.path_class(p) for p in (1, 2, 3, 7, math.inf)] == ["closed_form", "max_flow", "lp", "lp", "lp"]
    for bad in (0, 0.5, math.nan):
        with pytest.raises(ValueError):
            T.path_class(bad)
    for bad in (0, 1.5, -1, "3", True):
        with pytest.raises(ConfigError, match="max_people_per_tuple"):
            core.truncated_value([1.0], [0], [0], 1.0, max_people_per_tuple=bad)


# ----------------------------------------------------------------------------- neighbours, numeric core
def _three_owner_neighbours() -> tuple[T.Prepared, T.Prepared]:
    """Tuples (a, b, c) with a ≠ b among 8 users heavy at τ = 2 and c a light user of its own: no tuple
    keeps three heavy users. The neighbour adds one person p with 4 tuples (p, a, b): heavy, with two
    heavy people in each of its tuples."""
    g = np.random.default_rng(5)
    h, n = 8, 120
    a = g.integers(0, h, n)
    b = (a + g.integers(1, h, n)) % h
    c = h + np.arange(n)
    cols = [a, b, c]
    pa_ = np.array([0, 1, 2, 3])
    cols2 = [np.concatenate([a, pa_]), np.concatenate([b, pa_ + 4]), np.concatenate([c, np.full(4, h + n)])]

    def prep(cs: list[np.ndarray]) -> T.Prepared:
        k = cs[0].size
        return _prep(np.ones(k), np.concatenate([np.arange(k)] * 3), np.concatenate(cs))

    return prep(cols), prep(cols2)


def _two_owner_neighbours() -> tuple[T.Prepared, T.Prepared]:
    """Edges among 40 light users (load ≤ 2 at τ = 2); the neighbour adds one person with 6 edges."""
    src, dst = np.arange(40), (np.arange(40) + 1) % 40
    w1 = _prep(np.ones(40), np.concatenate([np.arange(40)] * 2), np.concatenate([src, dst]))
    s2, d2 = np.concatenate([src, np.full(6, 40)]), np.concatenate([dst, np.arange(6) * 5])
    w2 = _prep(np.ones(46), np.concatenate([np.arange(46)] * 2), np.concatenate([s2, d2]))
    return w1, w2


TAUS = (0.0, 2.0, 1000.0)


@pytest.mark.parametrize("people", [3.0, 5.0, math.inf])
def test_three_person_plans_take_the_lp_on_neighbours_alike(people: float) -> None:
    d, d_person = _three_owner_neighbours()
    plan = _counters(d, TAUS, people), _counters(d_person, TAUS, people)
    assert plan[0] == plan[1] == (1, 0, 2)  # τ = 0 (public) in closed form, every τ > 0 by the LP
    # negative control: the sample-chosen dispatch takes the max-flow without the person and the LP with them
    data = _counters(d, TAUS, None), _counters(d_person, TAUS, None)
    assert data[0] == (2, 1, 0) and data[1] == (2, 0, 1)


def test_two_person_plans_take_the_max_flow_on_neighbours_alike() -> None:
    d, d_person = _two_owner_neighbours()
    assert _counters(d, TAUS, 2.0) == _counters(d_person, TAUS, 2.0) == (1, 2, 0)
    # negative control: nobody is heavy without the person (closed form), the person is heavy with them
    assert _counters(d, TAUS, None) == (3, 0, 0) and _counters(d_person, TAUS, None) == (2, 1, 0)


def test_one_person_plans_take_the_closed_form() -> None:
    g = np.random.default_rng(3)
    ui = g.integers(0, 10, 200)
    prep = _prep(np.ones(200), np.arange(200), ui)
    assert _counters(prep, TAUS, 1.0) == (3, 0, 0)


# ----------------------------------------------------------------------------- values are unchanged
@pytest.mark.parametrize("owners", [1, 2, 3])
def test_the_plans_path_gives_the_exact_value(owners: int) -> None:
    """Every path at least as general as the instance gives f̄: exactly (closed form, max-flow), within
    the certified slack G (LP); a bound below the sample's owners falls back to the LP and is counted."""
    g = np.random.default_rng(200 + owners)
    T.STATS.reset()
    for _ in range(10):
        w, ti, ui = instance(g, int(g.integers(2, 6)), int(g.integers(2, 5)), owners)
        prep = _prep(w, ti, ui)
        for tau in (0.5, 1.0, 2.0):
            exact = brute_force(w, ti, ui, tau)
            for people in (owners, 3.0, math.inf):
                r = T.truncate(prep, tau, people)
                assert r.path == T.path_class(people)
                if r.path == "lp":
                    assert float(exact) - T.gap_bound(tau) <= r.value <= float(exact) + 1e-12
                else:
                    assert Fraction(r.value) == exact
    assert T.STATS.plan_exceeded == 0 and T.STATS.uncertified == 0
    if owners == 3:  # a wrong (too small) bound: the value stays right through the LP
        w, ti, ui = np.ones(3), np.array([0, 0, 0, 1, 2]), np.array([0, 1, 2, 0, 1])
        r = T.truncate(_prep(w, ti, ui), 0.5, 1)
        assert r.path == "lp" and T.STATS.plan_exceeded == 1
        assert abs(r.value - float(brute_force(w, ti, ui, 0.5))) <= T.gap_bound(0.5)


# ----------------------------------------------------------------------------- neighbours, through SQL
def _edges(person: bool) -> pa.Table:
    """a = 1 → b = 2 → c_i = 10..15: the 2-paths (a, b, c_i) keep two heavy people at τ = 5.5 (a, b: load 6).
    The person p = 3 (edges p → a, and x_j → p for x_j = 20..25) adds (p, a, b) with three heavy people."""
    pairs = [(1, 2)] + [(2, c) for c in range(10, 16)]
    if person:
        pairs += [(3, 1)] + [(x, 3) for x in range(20, 26)]
    return pa.table({"src": [a for a, _ in pairs], "dst": [b for _, b in pairs]})


def _sql_counters(person: bool, sql: str) -> tuple[int, int, int]:
    s = make_session(edges=_edges(person))
    try:
        use_noise(s, seeded_noise("s4s-paths"))
        T.STATS.reset()
        assert s.query(sql, epsilon=1.0).mechanism == "r2t"
        return T.STATS.closed_form, T.STATS.max_flow, T.STATS.lp
    finally:
        s.close()


def test_sql_join_paths_do_not_depend_on_one_person(monkeypatch: Any) -> None:
    # R2T over 2-paths: Delta = 3·16·16, thresholds 5.5^j (j = 1..4) and τ = 0
    assert _sql_counters(False, PATH2) == _sql_counters(True, PATH2) == (1, 0, 4)
    assert _sql_counters(False, "SELECT COUNT(*) FROM edge") == _sql_counters(True, "SELECT COUNT(*) FROM edge") == (1, 3, 0)
    # negative control: the sample-chosen dispatch (the plan's bound dropped) switches τ = 5.5 with the person
    real = T.truncate
    monkeypatch.setattr(T, "truncate", lambda p, tau, people=None: real(p, tau, None))
    assert _sql_counters(False, PATH2) == (4, 1, 0)
    assert _sql_counters(True, PATH2) == (4, 0, 1)


def test_numeric_api_takes_the_callers_bound() -> None:
    d, d_person = _three_owner_neighbours()
    for prep in (d, d_person):
        w, ti, ui = prep.w, prep.ti, prep.ui
        T.STATS.reset()
        core.r2t_scalar(w, ti, ui, epsilon=1.0, global_sensitivity=64, rng=seeded_noise("r2t-paths"), max_people_per_tuple=3)
        assert T.STATS.lp == 3 and T.STATS.max_flow == 0 and T.STATS.closed_form == 1  # τ = 5.5, 30.25, 166.4; then 0
        T.STATS.reset()
        core.s4s_scalar(w, ti, ui, epsilon=1.0, max_tuples_per_user=64, q=0.5, rng=seeded_noise("s4s-paths"),
                        max_people_per_tuple=3)
        assert T.STATS.closed_form == 0 and T.STATS.max_flow == 0 and T.STATS.lp > 0
    with pytest.raises(ConfigError, match="max_people_per_tuple"):
        core.s4s_scalar([1.0], [0], [0], epsilon=1.0, max_tuples_per_user=4, q=0.5, rng=seeded_noise(1),
                        max_people_per_tuple=0)
