"""An owner-declared granularity too fine for doubles is refused at registration, naming the column."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigError
from dpsql.noise import round_to_granularity


def _session() -> dpsql.Session:
    return dpsql.Session(budget=dpsql.Budget(10.0, 1e-5))


@pytest.mark.parametrize("g", [1e-301, 5e-324, 1e-310])
def test_granularity_too_fine_for_doubles_is_refused_naming_the_column(g: float) -> None:
    s = _session()
    t = pa.table({"pid": np.arange(10, dtype=np.int64), "x": np.linspace(0.0, 1.0, 10)})
    with pytest.raises(ConfigError, match=r"granularity for 't\.x' is .* too fine") as e:
        s.register("t", t, privacy_unit="pid", max_rows_per_unit=1, columns={"x": {"bounds": [0, 1], "granularity": g}})
    assert "at least 1e-300" in str(e.value)
    assert "t" not in s.tables  # nothing was registered
    s.close()


def test_granularity_at_the_floor_is_accepted_and_releases_finite_values() -> None:
    """Control: 1e-300 is accepted; AVG and VARIANCE release finite numbers (rounding to such a grid leaves a
    double unchanged: it is already a whole number of grid units)."""
    s = _session()
    t = pa.table({"pid": np.arange(200, dtype=np.int64), "x": np.linspace(0.0, 1e9, 200)})
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1,
               columns={"x": {"bounds": [0, 1e9], "granularity": 1e-300}})
    for agg in ("AVG(x)", "VARIANCE(x)", "SUM(x)"):
        r = s.query(f"SELECT {agg} AS v FROM t", epsilon=3.0, options={"mechanism": "laplace"}).table.to_pylist()[0]
        assert r["v"] is not None and np.isfinite(r["v"]), (agg, r)
    s.close()


def test_rounding_keeps_values_beyond_the_grid_resolution() -> None:
    # by hand: 1e9 / 1e-300 = 1e309 overflows; the value is kept as it is
    out = round_to_granularity(np.array([1e9, -2.5, 0.0]), 1e-300)
    assert out.tolist() == [1e9, -2.5, 0.0]
    # ordinary grids are unchanged: 12.34 on 0.1 -> 12.3, 0.30000000000000004 -> 0.3, 2.5 on 1 -> 2.0 (half-even)
    assert round_to_granularity(np.array([12.34, 0.30000000000000004]), 0.1).tolist() == [12.3, 0.3]
    assert round_to_granularity(np.array([2.5]), 1.0).tolist() == [2.0]
