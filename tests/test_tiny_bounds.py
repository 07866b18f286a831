"""Small and large value bounds of SUM / AVG / VARIANCE / STDDEV: answered, or refused before any charge
with a message that names the fix.

* Snapping (delta = 0) computed its clamp bound B as floor(cap / Λ)·Λ: for a grid Λ below about 2^-24 the
  quotient overflowed, and the OverflowError became "epsilon=1 and delta=0 give noise parameters that cannot
  be represented (hint: use an epsilon between about 1e-6 and 100)": VARIANCE over bounds (0, 1e-4), SUM
  over (0, 1e-8). They are now answered (B = 2^K·Λ, below the cap).
* Bounds so small that the noise scale leaves the normal doubles (a variance squares them) failed with
  "sigma=0.0 ... use a larger epsilon", a bare ValueError ("math domain error"), or after the charge (AVG
  under delta = 0 over (0, 5e-324) once the overflow above was mended). Bounds below 1e-100 in magnitude
  or width are refused while planning, and noise scales below 2^-900 by the samplers' calibration.
* The Gaussian floating-point delta grows as e^epsilon, so its refusal at a large epsilon asks for a
  smaller epsilon, not "a larger delta or epsilon".
"""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigError, QueryError
from dpsql.noise import MIN_SCALE, check_gaussian_representable, snapping_calibration, snapping_grid
from dpsql.testing import use_noise, zero_noise


def _session(bounds: tuple[float, float], value: float, n: int = 400, *, zero: bool = False) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e4, 0.5))
    if zero:
        use_noise(s, zero_noise(3))
    t = pa.table({"uid": pa.array(range(n), pa.int64()), "v": pa.array([value] * n, pa.float64())})
    s.register("t", t, privacy_unit="uid", max_rows_per_unit=1, columns={"v": {"bounds": bounds}})
    return s


@pytest.mark.parametrize(("agg", "bounds", "value", "expect"), [
    ("VARIANCE(v)", (0.0, 1e-4), 5e-5, 0.0),
    ("STDDEV(v)", (0.0, 1e-4), 5e-5, 0.0),
    ("SUM(v)", (0.0, 1e-8), 1e-8, 400 * 1e-8),
    ("SUM(v)", (0.0, 1e-60), 1e-60, 400 * 1e-60),
    ("AVG(v)", (-1e-90, 1e-90), 5e-91, 5e-91),
])
def test_small_bounds_are_answered_under_pure_dp(agg: str, bounds: tuple[float, float], value: float, expect: float) -> None:
    s = _session(bounds, value, zero=True)
    try:
        plan = s.explain(f"SELECT {agg} AS r FROM t", epsilon=1.0)
        rel = s.query(f"SELECT {agg} AS r FROM t", epsilon=1.0)
    finally:
        s.close()
    assert rel.cost == plan.cost
    got = rel.to_pylist()[0]["r"]
    assert math.isclose(got, expect, rel_tol=1e-6, abs_tol=abs(expect) * 1e-6 + 1e-300), (agg, got, expect)


def test_snapping_grid_no_longer_overflows_on_a_fine_grid() -> None:
    for lam in (2.0**-30, 1e-20, 1e-200, 2.0**-899):
        grid, bound = snapping_grid(lam, 40, integer=False)
        assert grid >= lam and bound == math.ldexp(grid, 40) and math.isfinite(bound)
    lam, grid, bound = snapping_calibration(1e-10, 1.0, integer=False)
    assert bound / grid == 2.0 ** round(math.log2(bound / grid)) and bound > 1e-10
    with pytest.raises(ConfigError, match="too small"):
        snapping_grid(2.0**-901, 40, integer=False)
    with pytest.raises(ConfigError, match="too small"):
        snapping_calibration(0.0, 1.0, integer=False)


def test_gaussian_scales_below_the_normal_range_are_refused() -> None:
    check_gaussian_representable(MIN_SCALE, 1e-300, integer=False, what="x")
    for sigma in (0.0, 1e-300, 5e-324):
        with pytest.raises(ConfigError, match="too small") as e:
            check_gaussian_representable(sigma, 1e-300, integer=False, what="x")
        assert "wider bounds" in (e.value.hint or "")


def test_bounds_below_1e_100_are_refused_before_the_charge_with_the_fix() -> None:
    s = _session((0.0, 1e-101), 0.0)
    try:
        for run in (s.explain, s.query):
            with pytest.raises(dpsql.errors.UnsupportedQueryError, match="too small") as e:
                run("SELECT SUM(v) FROM t", epsilon=1.0, delta=1e-6)
            assert "rescale" in (e.value.hint or "")
        assert s.history().num_rows == 0
    finally:
        s.close()


def test_bounds_above_1e15_name_the_fix() -> None:
    s = _session((0.0, 1e16), 0.0)
    try:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="too large") as e:
            s.query("SELECT AVG(v) FROM t", epsilon=1.0, delta=1e-6)
        assert "AVG(x / 1e6)" in (e.value.hint or "")
        assert s.history().num_rows == 0
    finally:
        s.close()


def test_every_bound_scale_is_answered_or_refused_for_free() -> None:
    """A sweep of bound magnitudes over every bounded aggregate, pure and approximate DP, with real
    noise: each query is either released (finite, within reach of the bounds) or refused with a
    dpsql error before its charge, never a bare exception nor a failure after the charge."""
    outcomes: dict[str, int] = {"released": 0, "refused": 0}
    for k in (0, 15, 100, 101, 250, 315, 323):
        for shape in ("pos", "sym"):
            top = 10.0**-k if k < 323 else 5e-324
            bounds = (0.0, top) if shape == "pos" else (-top, top)
            s = _session(bounds, top / 2, n=50)
            try:
                for agg in ("SUM(v)", "AVG(v)", "VARIANCE(v)", "STDDEV(v)"):
                    for delta in (0.0, 1e-6):
                        before = s.history().num_rows
                        try:
                            rel = s.query(f"SELECT {agg} AS r FROM t", epsilon=1.0, delta=delta)
                        except QueryError:
                            assert s.history().num_rows == before, (k, shape, agg, delta)
                            assert k > 100, (k, shape, agg, delta, "refused above 1e-100")
                            outcomes["refused"] += 1
                            continue
                        r = rel.to_pylist()[0]["r"]
                        assert r is None or math.isfinite(r), (k, shape, agg, delta, r)
                        outcomes["released"] += 1
                        assert k <= 100, (k, shape, agg, delta, "released below 1e-100")
            finally:
                s.close()
    assert outcomes["released"] == 4 * 2 * 2 * 3 and outcomes["refused"] == 4 * 2 * 2 * 4, outcomes


@pytest.mark.filterwarnings("ignore:epsilon=40 is unusually large")
def test_fp_delta_refusal_at_a_large_epsilon_asks_for_a_smaller_one() -> None:
    s = dpsql.Session(budget=dpsql.Budget(1e4, 0.5))
    s.register("t", pa.table({"uid": pa.array(range(10), pa.int64())}), privacy_unit="uid", max_rows_per_unit=1)
    try:
        with pytest.raises(ConfigError, match="floating-point delta") as e:
            s.explain("SELECT COUNT(*) FROM t", epsilon=40.0, delta=0.1)
        assert "smaller epsilon" in (e.value.hint or "") and "larger epsilon" not in (e.value.hint or "")
    finally:
        s.close()


@pytest.mark.filterwarnings("ignore:epsilon=1e")
def test_a_tiny_scale_from_a_huge_epsilon_asks_for_a_smaller_epsilon() -> None:
    s = dpsql.Session(budget=dpsql.Budget(1e301, 0.5))
    s.register("t", pa.table({"uid": pa.array(range(10), pa.int64())}), privacy_unit="uid", max_rows_per_unit=1)
    try:
        with pytest.raises(ConfigError, match="too small") as e:
            s.query("SELECT COUNT(*) FROM t", epsilon=1e300)
        assert (e.value.hint or "").startswith("use a smaller epsilon")
        assert s.history().num_rows == 0
    finally:
        s.close()
