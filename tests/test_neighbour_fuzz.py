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


@pytest.fixture(autouse=True, scope="module")
def _heap_frozen() -> Any:
    """Each neighbour observation collects earlier garbage before recording warnings; with the heap frozen once here,
    that collection examines only this module's objects (tests/_neighbour.py frozen_heap)."""
    from tests._neighbour import frozen_heap

    with frozen_heap():
        yield


#: fixed seeds: between them they reach every single-table mechanism (``test_seeds_cover_every_mechanism``)
SALTED_SEEDS = [
    20261254, 20261261, 20261280,  # gaussian
    20261218, 20261225, 20261236, 20261276,  # laplace
    20261205, 20261206, 20261215, 20261221,  # sparse histogram
    20261201, 20261208, 20261267,  # exponential (quantiles)
    20261209, 20261210, 20261211,  # dawa
    20261219,  # public domain
    20261202,  # refused on both
]
PRODUCTION_SEEDS = [7000, 7004, 7020, 7026, 7006, 7010, 7018, 7001, 7002]  # dawa, exponential, gaussian, laplace, sparse


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
    assert _caught(monkeypatch, [20261225, 20261236, 20261276])


def test_negative_control_understated_sensitivity_is_caught(monkeypatch: Any) -> None:
    import dataclasses

    import dpsql.mechanisms.common as common
    import dpsql.rewrite.bound as bound

    orig = bound.released_columns

    def halved(plan: Any, caps: Any) -> Any:
        return [dataclasses.replace(c, sensitivity=c.sensitivity / 2) if c.kind == "sum" else c for c in orig(plan, caps)]

    monkeypatch.setattr(common, "released_columns", halved)
    assert _caught(monkeypatch, [20261225, 20261236, 20261276])


# -- findings ----------------------------------------------------------------------------------------------


def _tiny_session(bounds: tuple[float, float], values: list[float | None]) -> Any:
    import pyarrow as pa

    import dpsql
    from dpsql.testing import use_noise, zero_noise

    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise(1))
    t = pa.table({"uid": pa.array(range(len(values)), pa.int64()), "v": pa.array(values, pa.float64())})
    s.register("t", t, privacy_unit="uid", max_rows_per_unit=1, columns={"v": {"bounds": bounds}})
    return s


@pytest.mark.parametrize("values", [[0.0, -1e-99], [], [None]])
def test_avg_over_bounds_narrower_than_its_rounding_grid_is_answered_or_refused_for_free(values: list[float | None]) -> None:
    """AVG(v) over bounds (-1e-320, 0): the mean's rounding grid, a power of ten near a hundredth of the
    width, underflowed to 0, and every such query failed after its charge (whatever the data), while
    explain accepted it. Bounds below 1e-100 in magnitude or width are now refused before any charge
    (``tests/test_tiny_bounds.py``); bounds (-1e-99, 0) are answered."""
    import dpsql

    s = _tiny_session((-1e-320, 0.0), values)
    try:
        for run in (s.explain, s.query):
            with pytest.raises(dpsql.errors.UnsupportedQueryError, match="too small"):
                run("SELECT AVG(v) AS m FROM t", epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
    finally:
        s.close()
    s = _tiny_session((-1e-99, 0.0), values)
    try:
        plan = s.explain("SELECT AVG(v) AS m FROM t", epsilon=1.0, delta=1e-6)
        rel = s.query("SELECT AVG(v) AS m FROM t", epsilon=1.0, delta=1e-6)
    finally:
        s.close()
    assert rel.cost == plan.cost
    m = rel.to_pylist()[0]["m"]
    assert m is None if not [v for v in values if v is not None] else -1e-99 <= m <= 0.0


def test_quantile_over_bounds_narrower_than_any_grid_is_refused_before_the_charge() -> None:
    """MEDIAN(v) over bounds (0, 5e-324): the grid's power of ten took log10 of an underflowed 0 and raised
    a bare ValueError from explain and query; it is now the ConfigError of a grid too fine for doubles."""
    import dpsql

    s = _tiny_session((0.0, 5e-324), [0.0])
    try:
        with pytest.raises(dpsql.errors.ConfigError, match="too fine"):
            s.explain("SELECT MEDIAN(v) FROM t", epsilon=1.0)
        with pytest.raises(dpsql.errors.ConfigError, match="too fine"):
            s.query("SELECT MEDIAN(v) FROM t", epsilon=1.0)
        assert s.history().num_rows == 0
    finally:
        s.close()
