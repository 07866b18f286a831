"""A released value is its grid point only: never ``-0.0``. ``rint`` of a noisy value in (-1/2, 0) of a grid
cell is ``-0.0``, so the sign bit of a released zero told whether the value plus noise, before rounding, was
below zero: a bit the snapping and rounding analyses (noise.py) do not release, printed as ``-0`` in the CSV."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import dpsql
from dpsql.noise import gaussian_release, round_to_granularity
from dpsql.testing import seeded_noise, use_noise


def test_rounding_and_snapping_release_no_negative_zero() -> None:
    v = np.array([-0.3, -0.0, -0.5, 0.3, -1e-300, -0.004])
    for g in (1.0, 0.01, 2.0**-3):
        r = round_to_granularity(v, g)
        assert (r == 0).sum() >= 2 and not np.signbit(r[r == 0]).any(), r
    rng = seeded_noise("signed-zero")
    out = rng.snap_laplace(np.zeros(4000), 1.0, 8.0, 2.0**40)
    assert (out == 0).sum() > 1000 and not np.signbit(out[out == 0]).any()
    assert not np.signbit(gaussian_release(np.array([-0.0]), np.array([-0.2]), integer=True)).any()


def test_a_sum_over_no_rows_is_never_minus_zero() -> None:
    with dpsql.Session(budget=dpsql.Budget(1e6)) as s:
        use_noise(s, seeded_noise("signed-zero-sum"))
        s.register("t", pa.table({"uid": pa.array([], pa.int64()), "x": pa.array([], pa.float64())}),
                   privacy_unit="uid", columns={"x": {"bounds": (0, 1)}})
        vals = [s.query("SELECT SUM(x) AS s FROM t", epsilon=1000.0).table["s"][0].as_py() for _ in range(40)]
    assert 0.0 in vals and not any(np.signbit(v) for v in vals if v == 0), vals
