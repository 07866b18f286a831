"""Neighbour sensitivity fuzzer: random single-table queries on D and on D minus one person.

Claim checked (user-level DP, docs/mechanisms.md §0): adding or removing all rows of one person
changes what each mechanism receives by at most the sensitivity it was calibrated for, in at most
the groups it was calibrated for, changes the released key set only as the mechanism allows, and
changes nothing else the analyst sees (outcome, error text, warnings, charge). The checks are in
``tests/_neighbour.py``, the random cases (registrations, data with one adversarial person: NaN,
+-inf, +-1e308, integer extremes, NULLs, long and odd text, many or duplicate rows, groups nobody
else has, values at and beyond the bounds; query shapes over every single-table mechanism) in
``tests/_neighbour_gen.py``.

Two couplings of D and D':

* salted (``use_noise``): every bounding choice comes from the per-query salt, the same on both
  sides, so the other people's kept rows and groups are identical;
* production: the engine's own per-row draws (``RANDOM()``), zero noise only. Every other person
  has one row, so the draws choose among the target's rows alone, and any choice must respect the
  caps.

The negative controls widen the clamp (bounding broken) and lower a declared sensitivity: both must
be caught.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _neighbour import check_pair, run_one  # noqa: E402
from _neighbour_gen import Case, random_case  # noqa: E402

#: fixed seeds: between them they reach every single-table mechanism (``test_seeds_cover_every_mechanism``)
SALTED_SEEDS = [
    20261216, 20261220, 20261222,  # gaussian
    20261302, 20261319, 20261334, 20261394,  # laplace
    20261203, 20261204, 20261207, 20261212,  # sparse histogram
    20261221, 20261225, 20261232,  # exponential (quantiles)
    20261201, 20261208, 20261219,  # dawa
    20261217,  # public domain
    20261205,  # refused on both
]
PRODUCTION_SEEDS = list(range(7020, 7020 + 6))


def _check(case: Case) -> list[str]:
    a = run_one(case.table, case.reg, case.sql, case.eps, case.delta, case.options, case.production)
    b = run_one(case.without_target(), case.reg, case.sql, case.eps, case.delta, case.options, case.production)
    return check_pair(a, b, what=case.describe())


@pytest.mark.parametrize("seed", SALTED_SEEDS)
def test_neighbours_salted(seed: int) -> None:
    case = random_case(seed)
    problems = _check(case)
    assert not problems, case.describe() + "\n" + "\n".join(problems)


@pytest.mark.parametrize("seed", PRODUCTION_SEEDS)
def test_neighbours_engine_draws(seed: int) -> None:
    case = random_case(seed, production=True)
    problems = _check(case)
    assert not problems, case.describe() + "\n" + "\n".join(problems)


def test_seeds_cover_every_mechanism() -> None:
    from _neighbour import _session

    import dpsql

    seen: set[str] = set()
    for seed in SALTED_SEEDS:
        case = random_case(seed)
        s = _session(case.table, case.reg)
        try:
            seen.add(s.explain(case.sql, epsilon=case.eps, delta=case.delta, options=case.options).mechanism)
        except dpsql.errors.DPSQLError:
            seen.add("refused")
        finally:
            s.close()
    want = {"gaussian", "laplace", "sparse_histogram", "exponential", "dawa", "refused"}
    assert want <= seen, f"the seeds reach only {sorted(seen)}"


# -- negative controls -------------------------------------------------------------------------------------


def _caught(monkeypatch: Any, seeds: list[int]) -> bool:
    for seed in seeds:
        if _check(random_case(seed)):
            return True
    return False


def test_negative_control_widened_clamp_is_caught(monkeypatch: Any) -> None:
    from dpsql.engine.duckdb_ops import DuckDBOps

    orig = DuckDBOps.clamp

    def wide(self: Any, v: Any, lo: float, hi: float, *, shift: float = 0.0) -> Any:
        return orig(self, v, lo - (hi - lo) / 2, hi + (hi - lo) / 2, shift=shift)

    monkeypatch.setattr(DuckDBOps, "clamp", wide)
    assert _caught(monkeypatch, [20261216, 20261220, 20261222])


def test_negative_control_understated_sensitivity_is_caught(monkeypatch: Any) -> None:
    import dataclasses

    import dpsql.mechanisms.common as common
    import dpsql.rewrite.bound as bound

    orig = bound.released_columns

    def halved(plan: Any, caps: Any) -> Any:
        return [dataclasses.replace(c, sensitivity=c.sensitivity / 2) if c.kind == "sum" else c for c in orig(plan, caps)]

    monkeypatch.setattr(common, "released_columns", halved)
    assert _caught(monkeypatch, [20261216, 20261220, 20261222])
