"""``degree_caps`` lowers the per-column bounds of a join whose Delta is enforced. The lowered bounds also
change the order in which the bounded query caps the inputs (each input entered through its least-bounded
joined column), and in that order a capped partition may no longer fix every column through which its input
reaches people: then no cap is stable and the plan is not enforced. The Delta derived from the analyst's
lowered bounds was used anyway, uncapped, in DP-S4S's sampling amplification (Lemma 3.1): below, one person
is in 6 x 6 x 6 = 216 join tuples, the owner's declarations bound them at 4 (enforced), and
``degree_caps={'c2.h0': 1}`` made DP-S4S sample at q = 1/16 with Delta = 1 and no cap, so its noise was that
of a person with at most one tuple. Such a lowering is refused, for free; one that keeps the caps stable is
answered with Delta enforced."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import PolicyError

SQL = ("SELECT COUNT(*) FROM pa t0 JOIN c0 t1 ON t1.f0 = t0.id JOIN c1 t2 ON t2.f0 = t1.k AND t2.f1 = t0.id "
       "JOIN c2 t3 ON t3.h1 = t2.k AND t3.h0 = t0.id")
LOWERABLE = ["c0.f0", "c1.f0", "c1.f1", "c2.h0", "c2.h1"]


def _session() -> dpsql.Session:
    """Three people; person 0 has 6 rows in c0, 6 in c1 per c0 row, 6 in c2 per c1 row (216 join tuples)."""
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    c0 = [(k, p) for k, p in enumerate(p for p in range(3) for _ in range(6 if p == 0 else 1))]
    c1 = [(100 + i, k, p) for i, (k, p) in enumerate((k, p) for k, p in c0 for _ in range(6 if p == 0 else 1))]
    c2 = [(1000 + i, p, k) for i, (k, p) in enumerate((k, p) for k, _, p in c1 for _ in range(6 if p == 0 else 1))]
    s.register("pa", pa.table({"id": [0, 1, 2]}), privacy_unit="id", max_rows_per_unit=1,
               allow_conditional_sampling=True)
    s.register("c0", pa.table({"k": [r[0] for r in c0], "f0": [r[1] for r in c0]}), references={"f0": "pa.id"},
               degree_bounds={"f0": 2}, allow_conditional_sampling=True)
    s.register("c1", pa.table({"k": [r[0] for r in c1], "f0": [r[1] for r in c1], "f1": [r[2] for r in c1]}),
               references={"f0": "c0.k", "f1": "pa.id"}, degree_bounds={"f0": 2, "f1": 3},
               allow_conditional_sampling=True)
    s.register("c2", pa.table({"k": [r[0] for r in c2], "h0": [r[1] for r in c2], "h1": [r[2] for r in c2]}),
               references={"h0": "pa.id", "h1": "c1.k"}, degree_bounds={"h0": 5, "h1": 1},
               allow_conditional_sampling=True)
    return s


@pytest.mark.parametrize("opts", [{}, {"mechanism": "dp_s4s", "q": 0.5}, {"mechanism": "r2t"}])
def test_a_lowering_that_leaves_no_stable_cap_is_refused_for_free(opts: dict[str, object]) -> None:
    with _session() as s:
        assert s._route(SQL, 1.0, 0.0, dict(opts)).calibration.people.enforced  # the owner's declarations: enforced
        lowered = {**opts, "degree_caps": {"c2.h0": 1}}
        for call in (s.explain, s.query):
            with pytest.raises(PolicyError, match="degree_caps") as e:
                call(SQL, epsilon=1.0, delta=0.0, options=dict(lowered))
            assert "c2.h0" in str(e.value)
        assert s.remaining() == Budget(100.0, 1e-3)


def test_every_accepted_lowering_is_enforced() -> None:
    """Every subset of the lowerable columns, lowered to 1: refused, or answered with caps that enforce Delta."""
    accepted = refused = 0
    with _session() as s:
        for n in range(1, len(LOWERABLE) + 1):
            for cols in itertools.combinations(LOWERABLE, n):
                try:
                    cal = s._route(SQL, 1.0, 0.0, {"degree_caps": {c: 1 for c in cols}}).calibration
                except PolicyError:
                    refused += 1
                    continue
                accepted += 1
                assert cal.people.enforced and cal.caps and cal.fast, cols
                assert cal.max_tuples <= 4, cols
    assert accepted and refused
