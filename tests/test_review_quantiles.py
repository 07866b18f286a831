"""Adversarial review of quantiles (MIN / MAX / MEDIAN / QUANTILE): regressions for what was found.

Each test states the attack, and fails on the code before its fix.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigError
from dpsql.mechanisms import quantile as qm
from dpsql.testing import seeded_noise, use_noise


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5))
    use_noise(s, seeded_noise("review-quantiles"))
    t = pa.table({"pid": np.arange(40, dtype=np.int64), "x": np.arange(40, dtype=np.float64) % 10,
                  "g": np.arange(40, dtype=np.int64) % 2})
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1, max_groups_per_unit=2,
               columns={"x": {"bounds": (0, 100_000), "granularity": 1}, "g": {"domain": [0, 1]}})
    return s


def test_float_slack_pinned() -> None:
    """xi(N) at N = 100,001 by hand: 4r + N e^r / S + N (1 - gamma) / (gamma S) to first order, r = 2^-42,
    S = 2^45, gamma = 2^-10: 9.1e-13 + 2.842e-09 + 2.9076e-06 = 2.9104e-06 (log1p terms differ below 1e-15)."""
    assert qm.float_slack(100_001) == pytest.approx(2.9104e-06, rel=1e-4)


@pytest.mark.parametrize("sql,eps", [
    ("SELECT MEDIAN(x) FROM t", 2e-6),                 # eps' = 2e-6 < xi = 2.91e-6
    ("SELECT MIN(x) FROM t", 1e-7),                    # eps' far below xi
    ("SELECT g, MEDIAN(x), MAX(x) FROM t GROUP BY g", 4e-6),  # eps' = 4e-6 / (1 group (L = 1) x 2 aggregates) = 2e-6
])
def test_epsilon_below_the_float_slack_is_refused_for_free(sql: str, eps: float) -> None:
    """The attack: a per-release epsilon eps' below the sampler's floating-point allowance xi(N) made
    eps_em = eps' - xi negative. Calibration accepted it (only an infinite rank error was refused): explain
    printed a negative rank_error_95, and the release ran the sampler with a negative scale, whose privacy
    loss is about |eps_em| + xi (up to ~5.8e-6), above the (eps', 0) charged. It must be refused before the
    charge, by explain and query alike, with the ledger unchanged."""
    s = _session()
    before, rows = s.remaining(), s.history().num_rows
    for call in (s.explain, s.query):
        with pytest.raises(ConfigError, match="too small for a quantile"):
            call(sql, epsilon=eps)
    assert s.remaining() == before and s.history().num_rows == rows
    s.close()


def test_epsilon_just_above_the_float_slack_still_runs() -> None:
    """Control: eps' = 1e-5 > xi = 2.91e-6 is answered, with a positive rank error."""
    s = _session()
    p = s.explain("SELECT MEDIAN(x) FROM t", epsilon=1e-5)
    err = p.parameters["aggregates"][0]["rank_error_95"]
    assert math.isfinite(err) and err > 0
    r = s.query("SELECT MEDIAN(x) FROM t", epsilon=1e-5)
    assert r.table.num_rows == 1
    s.close()


@pytest.mark.parametrize("cols", [
    {"bounds": (0, 1e-320)},                        # default step 10**-324 == 0.0: ZeroDivisionError
])
def test_grid_too_fine_for_doubles_is_a_config_error_naming_the_column(cols: dict) -> None:
    """Owner-declared extremes: the quantile grid could not be built, and the failure surfaced as a bare
    ZeroDivisionError, or as 'epsilon ... cannot be represented' (the session maps OverflowError to an epsilon
    message), neither naming the column. Now a ConfigError naming it, before any charge."""
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5))
    use_noise(s, seeded_noise("review-grid"))
    s.register("t", pa.table({"pid": np.arange(10, dtype=np.int64), "x": np.linspace(0.0, 1e-320, 10)}),
               privacy_unit="pid", max_rows_per_unit=1, columns={"x": cols})
    for call in (s.explain, s.query):
        with pytest.raises(ConfigError, match="granularity of 'x' is too fine"):
            call("SELECT MEDIAN(x) FROM t", epsilon=1.0)
    assert s.history().num_rows == 0
    s.close()


@pytest.mark.parametrize("cols", [
    {"bounds": (0, 1e10), "granularity": 1e-310},   # 10.0**k overflowed: OverflowError, reported as an epsilon problem
    {"bounds": (0, 1), "granularity": 5e-324},
])
def test_granularity_too_fine_for_doubles_is_refused_at_registration(cols: dict) -> None:
    """Declared granularities below the floor (1e-300) never reach the quantile grid: registration refuses them."""
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5))
    with pytest.raises(ConfigError, match=r"granularity for 't\.x' is .* too fine"):
        s.register("t", pa.table({"pid": np.arange(10, dtype=np.int64), "x": np.linspace(0.0, 1.0, 10)}),
                   privacy_unit="pid", max_rows_per_unit=1, columns={"x": cols})
    s.close()
