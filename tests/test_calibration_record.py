"""The epsilon and delta a mechanism calibrates its noise with are never above what the ledger records.

The ledger records a float budget as its shortest decimal (``dpsql/budget.py``'s rounding rule), while
noise is calibrated with the binary float, which can be up to half an ulp above that decimal (the float
0.1 is 0.1000000000000000055...). A request's budget therefore enters the mechanisms as its calibration
values, the largest floats whose binary values are at most the recorded decimals, and a cost leaves them
recorded as a decimal at least its binary value (``Request.asking``, ``Request.record``)."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget, binary_at_least, binary_at_most, calibration_value, exact, recorded
from dpsql.mechanisms.base import Request
from dpsql.mechanisms.common import charged_delta
from dpsql.mechanisms.join_multi import charged_sum, shares
from dpsql.testing import use_noise, zero_noise

TABLE = pa.table({"uid": np.arange(400), "country": np.array(["a", "b"] * 200), "amount": np.ones(400)})
EPSILONS = (0.1, 0.3, 1 / 3, 0.2, 0.7, 2 / 3, 1.1, 0.05, 3.3, 0.007, 1e-5 / 3)
DELTAS = (1e-6, 3e-7, 1e-5 / 3, 0.1, 2e-6 / 3)
QUERIES = (
    ("SELECT COUNT(*) AS n FROM ev", False),                       # Laplace / Gaussian
    ("SELECT COUNT(*) AS n, SUM(amount) AS s FROM ev", False),     # the budget split between columns
    ("SELECT country, COUNT(*) AS n FROM ev GROUP BY country", True),  # sparse histogram (delta > 0 only)
    ("SELECT MEDIAN(amount) AS m FROM ev", False),                 # exponential mechanism (pure DP)
)


def _session(path: Path) -> dpsql.Session:
    s = dpsql.Session(ledger=path, budget=Budget(100.0, 0.5), create=True)
    use_noise(s, zero_noise())
    s.register("ev", TABLE, privacy_unit="uid", max_groups_per_unit=1, columns={"amount": {"bounds": (0, 10)}})
    return s


def test_calibration_values_by_hand() -> None:
    assert calibration_value(0.1) == 0.09999999999999999  # the binary 0.1 is above the decimal 0.1
    assert Fraction(0.1) > Fraction("0.1") and Fraction(0.09999999999999999) < Fraction("0.1")
    assert calibration_value(0.3) == 0.3  # the binary 0.3 is 0.29999999999999998889...
    assert calibration_value(1 / 3) == math.nextafter(1 / 3, 0.0)
    assert calibration_value(0.5) == 0.5 and calibration_value(0.0) == 0.0 and calibration_value(5e-324) == 5e-324
    for x in (*EPSILONS, *DELTAS):
        c = calibration_value(x)
        assert Fraction(c) <= exact(x) < Fraction(math.nextafter(c, math.inf))  # the largest such float
        assert x - c in (0.0, x - math.nextafter(x, 0.0))  # at most one ulp below what was asked


def test_recorded_is_the_request_or_rounds_the_binary_cost_up() -> None:
    asked = Budget(0.1, 1e-5 / 3)
    cal = Budget(calibration_value(0.1), calibration_value(1e-5 / 3))
    assert recorded(cal, asked) == asked  # the charge is what was asked for
    for x in (0.1, 1 / 3, 2 / 3, 1e-5 / 3, 0.30000000000000004):  # a derived cost: its binary value rounded up
        r = recorded(Budget(x, x), asked).epsilon
        assert exact(r) >= Fraction(x) and exact(math.nextafter(r, 0.0)) < Fraction(x)
    assert recorded(Budget(0.1, 0.0), None).epsilon == 0.10000000000000002  # no request: the binary rounded up


def test_composed_parts_stay_within_the_calibration_value() -> None:
    for x in EPSILONS:
        c = calibration_value(x)
        for m in (2, 3, 7):
            parts = shares(c, m)
            assert sum(map(Fraction, parts), Fraction(0)) <= Fraction(c) <= exact(x)
            total = charged_sum([Budget(p, 0.0) for p in parts])
            assert Fraction(total.epsilon) >= sum(map(Fraction, parts), Fraction(0))
            assert exact(recorded(total, Budget(x, 0.0)).epsilon) <= exact(x)  # never more than asked
    d = charged_delta(calibration_value(1e-6), 1.1e-17)
    assert Fraction(d) >= Fraction(calibration_value(1e-6)) + Fraction(1.1e-17) and d == binary_at_least(Fraction(d))
    assert binary_at_most(Fraction(1, 10)) == 0.09999999999999999


def _above_record(s: dpsql.Session) -> list[tuple[str, float, float]]:
    """The (query, epsilon, delta) whose calibration values exceed the recorded cost."""
    out = []
    for sql, needs_delta in QUERIES:
        for eps in EPSILONS:
            for delta in (0.0, *DELTAS):
                if (needs_delta and delta == 0) or ("MEDIAN" in sql and delta > 0):
                    continue
                r = s._route(sql, eps, delta, None)
                cost = r.description.cost
                if Fraction(r.request.epsilon) > exact(cost.epsilon) or Fraction(r.request.delta) > exact(cost.delta):
                    out.append((sql, eps, delta))
                else:
                    assert cost.epsilon == eps and cost.delta >= delta  # what was asked (plus the fp part)
    return out


def test_routes_calibrate_at_most_what_is_recorded(tmp_path: Path) -> None:
    with _session(tmp_path / "l.duckdb") as s:
        assert _above_record(s) == []


def test_negative_control_the_old_path_calibrated_above_the_record(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibrating with the float asked for, and recording the cost as it is, as before: fails for the
    epsilons whose binary value is above their decimal (0.1, 1/3, ...), never for 0.3."""
    import dpsql.mechanisms.base as base

    monkeypatch.setattr(base, "calibration_value", lambda x: x)
    monkeypatch.setattr(Request, "record", lambda self, cost: cost)
    with _session(tmp_path / "l.duckdb") as s:
        above = _above_record(s)
    eps_above = {e for _, e, _ in above}
    assert {0.1, 1 / 3, 0.2, 2 / 3} <= eps_above and 0.3 not in eps_above and 0.7 not in eps_above
    assert {sql for sql, _, _ in above} == {sql for sql, _ in QUERIES}


def test_the_ledger_records_the_decimal_asked_for(tmp_path: Path) -> None:
    """Ten charges of 0.1 fit a budget of exactly 1.0: recording stays the analyst's decimal."""
    with dpsql.Session(ledger=tmp_path / "l.duckdb", budget=Budget(1.0, 0.0), create=True) as s:
        use_noise(s, zero_noise())
        s.register("ev", TABLE, privacy_unit="uid", max_groups_per_unit=1)
        for _ in range(10):
            r: Any = s.query("SELECT COUNT(*) AS n FROM ev", epsilon=0.1)
            assert r.cost == Budget(0.1, 0.0)
        assert s.remaining() == Budget(0.0, 0.0)
        assert set(s.history().column("epsilon").to_pylist()) == {0.1}
