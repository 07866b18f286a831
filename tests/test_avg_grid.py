"""The grid a released AVG is rounded to, as README.md states it: the largest power of ten at most a
thousandth of the bounds' width (0.1 for bounds [0, 100]), or the column's declared granularity if
finer. (README said 'a hundredth of the range', which would be 1 for [0, 100]; the code has always
used default_granularity(width / 100), a power of ten at most a tenth of that.) Zero noise, one row
per person: the release is the true mean on that grid."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("bounds,step", [((0, 100), 0.1), ((0, 1000), 1.0), ((-5, 5), 0.01)])
def test_avg_is_the_true_mean_on_a_thousandth_of_the_width(bounds: tuple[float, float], step: float) -> None:
    lo, hi = bounds
    values = [lo + (hi - lo) * ((i * 37) % 101) / 101 for i in range(500)]
    with dpsql.Session(budget=dpsql.Budget(100.0, 1e-3)) as s:
        use_noise(s, zero_noise())
        s.register("t", pa.table({"uid": list(range(500)), "v": values}), privacy_unit="uid",
                   columns={"v": {"bounds": bounds}})
        got = s.query("SELECT AVG(v) AS a FROM t", epsilon=5.0).to_pylist()[0]["a"]
    mean = sum(values) / len(values)
    assert abs(got - mean) <= step / 2 + 1e-9 and abs(got / step - round(got / step)) < 1e-6
    assert abs(got - mean) > 1e-9  # the mean itself is off the grid: the rounding is seen


def test_avg_is_on_its_declared_grid_where_doubles_are_coarse_against_it() -> None:
    """An AVG is post-processing of the released sum and count: rounded to its granularity (1e-6 declared) at every
    magnitude, not to the power-of-two grid the Gaussian releases take from 2^42 granularities on (8.4e6 here),
    which read 12345678.299999237."""
    with dpsql.Session(budget=dpsql.Budget(100.0, 1e-3)) as s:
        use_noise(s, zero_noise())
        s.register("t", pa.table({"uid": list(range(2000)), "v": [12345678.3] * 2000}), privacy_unit="uid",
                   max_rows_per_unit=1, columns={"v": {"bounds": [0.3, 20000000.3], "granularity": 1e-6}})
        r = s.query("SELECT AVG(v) AS a FROM t", epsilon=5.0)
    assert r.accuracy["a"]["granularity"] == 1e-6
    assert r.to_pylist()[0]["a"] == 12345678.3
