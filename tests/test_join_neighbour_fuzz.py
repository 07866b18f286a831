"""Randomised neighbour sensitivity of join queries (generator and checks: ``tests/_join_fuzz.py``).

For generated schemas, data and queries (scalar COUNT / SUM over joins: DP-S4S and R2T, closed form in
the engine or truncation of the sampled tuples; GROUP BY over joins: per-user clipping and DP-S4S's
vector form), each dataset D is compared with D less one person together with every row that reaches
them through any declared reference (built from the declarations alone, independently of dpsql):

* scalar, one person per tuple (closed form): at every fixed τ (1, 2, 3, Δ, 10⁹) the exact truncated
  sum moves by at most τ; the weight reaching nobody does not move; no owner exceeds an enforced Δ; and
  every other owner's exact total is unchanged (the caps are stable);
* scalar, several people per tuple: the truncated value at every fixed τ moves by at most τ + G(τ), and
  the tuples of D less the victim's are exactly the tuples of D less the victim (weights and people);
* GROUP BY, per-user clipping: the clipped totals move by at most C in L2 (C the option's and Δ·max|v|),
  the key set is the same, and every other owner's per-key totals are unchanged;
* GROUP BY, DP-S4S vector form: at every τ of the grid E moves by at most 1 (+ gaps) and F̄ by at most
  2τκ(E + 1) in L2, the key set is the same, and E = 0 at τ = Δ where Δ is enforced;
* observables: explain and query (zero noise) on D and on each neighbour give the same exception class
  and message, or the same mechanism, charge (explain's = the release's = the ledger's), key set and
  details; no warning and no output on stdout / stderr differs.

Below the SQL, random sampled-tuple instances with up to three people per tuple check the scalar
truncation (certified LP at 3 and unbounded people per tuple: |Δ| ≤ τ + G(τ), and removal never raises
it by more than G) and the vector cone program (|ΔE| ≤ 1 + gaps, ‖ΔF̄‖ ≤ 2τκ(min E + 1 + gap)).

The sample (q < 1) is the keyed one with a fixed salt, so both neighbours draw the same tuples.
Negative controls: without the filter that keeps only unique key values (``_unique_filter``) and
without widening the row caps to every column that reaches people (``_uniform_caps``), the same checks
fail."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _join_fuzz as fz  # noqa: E402
from _neighbour import frozen_heap  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _heap_frozen() -> Iterator[None]:
    """Each outcome collects earlier garbage before recording warnings (``_join_fuzz.outcome``); with the heap
    frozen once here, that collection examines only this module's objects (tests/_neighbour.py frozen_heap)."""
    with frozen_heap():
        yield

#: fixed seeds (odd seeds spell every key and unit as hostile text)
SEEDS = [3, 14, 15, 16, 19]


@pytest.mark.parametrize("seed", SEEDS)
def test_removing_one_person_keeps_every_truncated_quantity_within_its_bound(seed: int) -> None:
    rep = fz.run_seed(seed, 4, outcomes=False)
    assert not rep.problems, "\n".join(rep.problems[:10])
    assert sum(rep.checked.values()) > 0


@pytest.mark.parametrize("seed", [7])
def test_neighbours_observe_the_same_outcome_and_the_charge_is_explains(seed: int) -> None:
    rep = fz.run_seed(seed, 4, outcomes=True)
    assert not rep.problems, "\n".join(rep.problems[:10])
    assert rep.outcomes > 0


def test_negative_control_without_the_unique_key_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsql.rewrite.joins as rj

    monkeypatch.setattr(rj, "_unique_filter", lambda rel, alias, key, table, **_: rel)
    rep = fz.run_seed(15, 4, outcomes=False, text=False)
    assert any("moved" in p or "!=" in p for p in rep.problems), rep.problems


def test_negative_control_without_widened_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    """lineitem-like rows referencing their order and their person, joined on both: capped per order key
    only, the hostile person's rows on other people's orders push those people's rows out of the cap."""
    import dpsql.plan.joins as pj

    t = {"pub": fz.Table("pub", public=True, keycol="id", cols=["id", "name"]),
         "pa": fz.Table("pa", unit="id", keycol="id", cols=["id", "v", "g"], max_rows_per_unit=1),
         "c0": fz.Table("c0", keycol="k", cols=["k", "v", "g", "f0"], refs={"f0": "pa.id"}, degree={"f0": 2}),
         "c1": fz.Table("c1", keycol="k", cols=["k", "v", "g", "f0", "f1"], refs={"f0": "c0.k", "f1": "pa.id"},
                        degree={"f0": 1, "f1": 3})}
    sql = "SELECT COUNT(*) FROM pa AS t0 JOIN c0 AS t1 ON t0.id = t1.f0 JOIN c1 AS t2 ON t2.f0 = t1.k AND t2.f1 = t0.id"

    def problems() -> list[str]:
        g = np.random.default_rng(4)
        d = fz.gen_data(t, g)
        r = fz.reach_all(t, d)
        s_d = fz.session(t, d)
        out = []
        try:
            a = fz.internals(s_d, sql, {}, 1.0, 0.0)
            assert a is not None and a["kind"] == "scalar-fast" and a["enforced"]
            for v in fz.victims(t, d, g):
                s_p = fz.session(t, fz.without(t, d, v, r))
                try:
                    b = fz.internals(s_p, sql, {}, 1.0, 0.0)
                    assert b is not None
                    out += fz.compare(a, b, f"{v[0]}:{v[1]}")
                finally:
                    s_p.close()
        finally:
            s_d.close()
        return out

    assert problems() == []
    monkeypatch.setattr(pj, "_uniform_caps", lambda jp, cat, owner, caps: tuple(caps))
    assert any("per-owner totals" in p for p in problems())


def _instance(seed: int, max_people: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Random sampled tuples with up to ``max_people`` people each (weights on the 2^-20 grid), a group each."""
    g = np.random.default_rng(seed)
    nu, nt, d = int(g.integers(2, 9)), int(g.integers(3, 30)), int(g.integers(1, 4))
    w = g.choice([1.0, 0.5, 0.25, 3 * 2.0**-20, 1 - 2.0**-20], nt)
    pairs = [(t, int(u)) for t in range(nt) for u in g.choice(nu, min(int(g.integers(0, max_people + 1)), nu), replace=False)]
    ti = np.array([t for t, _ in pairs], dtype=np.int64)
    ui = np.array([u for _, u in pairs], dtype=np.int64)
    return w, g.integers(0, d, nt), ti, ui, nu, d


def _drop(w: np.ndarray, gid: np.ndarray, ti: np.ndarray, ui: np.ndarray, v: int) -> tuple[np.ndarray, ...]:
    """The instance less user ``v`` and every tuple they are in (users renumbered)."""
    keep = np.ones(w.size, dtype=bool)
    keep[ti[ui == v]] = False
    idx = np.cumsum(keep) - 1
    sel = keep[ti]
    return w[keep], gid[keep], idx[ti[sel]], np.where(ui[sel] > v, ui[sel] - 1, ui[sel])


#: the random instances' seeds, in two halves (the second in the extended tier)
INSTANCE_SEEDS = [range(0, 30), range(30, 60)]


@pytest.mark.parametrize("seeds", INSTANCE_SEEDS, ids=["0-29", "30-59"])
def test_the_general_truncation_paths_move_by_at_most_tau_plus_the_certified_slack(seeds: range) -> None:
    from dpsql.mechanisms import _s4s_truncation as trunc

    # 3 and unbounded people per tuple take the same path (the certified LP): ``truncate`` reads ``people`` only
    # through its path class, so both give the same value on the same instance (checked on every full instance
    # below); each neighbour is solved once, under 3 on even seeds and unbounded on odd ones
    assert trunc.path_class(3.0) == trunc.path_class(float("inf")) == trunc.LP
    for seed in seeds:
        w, _, ti, ui, nu, _ = _instance(seed, 3)
        people = float("inf") if seed % 2 else 3.0
        for tau in (0.5, 1.0, 3.0):
            full = [trunc.truncate(trunc.prepare(w, ti, ui, nu), tau, pp) for pp in (3.0, float("inf"))]
            assert full[0] == full[1] and full[0].path == trunc.LP, (seed, tau, full)
            base = full[0].value
            for v in range(nu):
                w2, _, ti2, ui2 = _drop(w, np.zeros(w.size, dtype=np.int64), ti, ui, v)
                val = trunc.truncate(trunc.prepare(w2, ti2, ui2, nu - 1), tau, people).value
                assert abs(base - val) <= tau + trunc.gap_bound(tau) + 1e-12, (seed, people, tau, v, base, val)
                assert val <= base + trunc.gap_bound(tau) + 1e-12


@pytest.mark.parametrize("seeds", INSTANCE_SEEDS, ids=["0-29", "30-59"])
def test_the_cone_program_moves_E_by_one_and_F_by_two_tau_E_plus_one(seeds: range) -> None:
    from dpsql.mechanisms import _s4s_socp as socp
    from dpsql.mechanisms.s4s_vector import KAPPA

    for seed in seeds:
        w, gid, ti, ui, nu, d = _instance(seed, 3)
        for tau in (0.5, 1.0, 2.0):
            a = socp.truncate(socp.Instance(w, gid, ti, ui, nu, d), tau)
            for v in range(nu):
                w2, gid2, ti2, ui2 = _drop(w, gid, ti, ui, v)
                b = socp.truncate(socp.Instance(w2, gid2, ti2, ui2, nu - 1, d), tau)
                assert abs(a.excess - b.excess) <= 1 + a.gap + b.gap + 1e-9, (seed, tau, v)
                lim = 2 * tau * KAPPA * (min(a.excess, b.excess) + 1 + max(a.gap, b.gap))
                assert float(np.linalg.norm(a.values - b.values)) <= lim * (1 + 1e-9), (seed, tau, v)
