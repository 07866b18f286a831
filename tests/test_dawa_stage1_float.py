"""Regression (found by review) of the DAWA stage-1 floating-point argument (``dpsql.mechanisms.dawa``
docstring, item (b); ``_dawa_partition.stage1_float_calibration``).

The report-noisy-min argument conditions on every noise but that of the winning partition's
bucket e through *the* changed bin: it needs a neighbour that changes ONE bin by one record.
With k rows per unit, one unit can change k different bins, a partition can then hold several
changed buckets, and the argument does not apply directly (the threshold can move by up to
2 k Delta_max, not k (Delta_e + Delta_max)). The docstring's own route is group privacy
("epsilon1/k-DP per unit change and epsilon1-DP for k of them"): each single-record step must
then be epsilon1/k-DP, and each step's threshold moves by (Delta_e + Delta_max) + 4g with the
float noise adding 2^-47 (B1 + g)/b_e + 2^-47, so the floating-point slack must be paid k times.
The calibration once paid it only once: b_e = (k (Delta_e + Delta_max) + slack) / (epsilon1 - 2^-47);
it now takes ``records=k`` and pays it k times.

This test recomputes the group-privacy bound k * max_e [(Delta_e + Delta_max + slack)/b_e + 2^-47]
for a 1024 x 1024 grid (the largest 2-D workload the SQL layer accepts) and k = 20.
By hand: about 3.1e6 candidates, g/b_min ~ 5.7e-3, so paying the slack once gave ~0.68 for a
claimed 0.25 (the negative control below recomputes that).
"""

from __future__ import annotations

import numpy as np

from dpsql.mechanisms._dawa_partition import (
    DEFAULT_ALIGNMENT,
    bucket_costs,
    stage1_float_calibration,
    stage1_noise_scales,
)


def group_privacy_epsilon1(n: int, k: int, eps1: float) -> float:
    _starts, lengths, costs = bucket_costs(
        np.zeros(n, dtype=np.int64), 0.75, dyadic=True, alignment=DEFAULT_ALIGNMENT, sensitivity=k
    )
    base = np.asarray(stage1_noise_scales(lengths, eps1, int(lengths.max()), sensitivity=k))
    scales, b1, g = stage1_float_calibration(base, costs.size, eps1, records=k)
    d_max = 2.0 * (1.0 - 1.0 / float(lengths.max()))
    d_e = 2.0 * (1.0 - 1.0 / lengths.astype(np.float64))
    slack = 4.0 * g + 2.0**-47 * (b1 + g)
    per_record = (d_e + d_max + slack) / scales + 2.0**-47
    return float(k * per_record.max())


def test_control_one_row_per_unit_is_exact() -> None:
    assert group_privacy_epsilon1(1 << 20, 1, 0.25) <= 0.25 * (1 + 1e-12)


def test_stage1_float_slack_paid_per_record_under_group_privacy() -> None:
    assert group_privacy_epsilon1(1 << 20, 20, 0.25) <= 0.25 * (1 + 1e-9)


def test_stage1_float_slack_small_grid_k5() -> None:
    # 65 536 cells (a 256 x 256 grid), k = 5: ~0.2562 > 0.25
    assert group_privacy_epsilon1(1 << 16, 5, 0.25) <= 0.25 * (1 + 1e-9)


def test_negative_control_slack_paid_once_exceeds_the_claim() -> None:
    n, k, eps1 = 1 << 20, 20, 0.25
    _starts, lengths, costs = bucket_costs(
        np.zeros(n, dtype=np.int64), 0.75, dyadic=True, alignment=DEFAULT_ALIGNMENT, sensitivity=k
    )
    base = np.asarray(stage1_noise_scales(lengths, eps1, int(lengths.max()), sensitivity=k))
    scales, b1, g = stage1_float_calibration(base, costs.size, eps1)  # records=1: the old calibration
    d_max = 2.0 * (1.0 - 1.0 / float(lengths.max()))
    d_e = 2.0 * (1.0 - 1.0 / lengths.astype(np.float64))
    per_record = (d_e + d_max + 4.0 * g + 2.0**-47 * (b1 + g)) / scales + 2.0**-47
    assert k * per_record.max() > 0.6
