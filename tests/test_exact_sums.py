"""Bounded SUM / AVG / VARIANCE add fixed-point integers (``dpsql.rewrite.bound.fixed_point_scale``):
each clamped value times 2^k, truncated toward zero, summed as an integer (exact in any order),
returned as the exact integer (text; the scale k is public, from the bounds). A floating-point
running SUM's error grows with the rows and depends on their order (DuckDB adds in whatever order
its threads see the rows), while the snapping mechanism's proof (docs/mechanisms.md 5.3) allows the
input only 2^-52 of the bound. The Gaussian release adds its noise to the exact total with one
rounding (``dpsql.mechanisms.common.add_noise``): converting the total to DOUBLE first rounded it at
its last place, an error the calibration cannot cover (the ulp of a large total is not public)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from sqlglot import exp
from test_bounding import INF as INF_CAPS
from test_bounding import plan_for, run_bounded, spec_for

from dpsql.budget import Budget
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.mechanisms.common import Calibration, add_noise, exact_totals
from dpsql.rewrite.bound import Caps, ReleasedColumn, fixed_point_scale, released_columns
from dpsql.testing import ZeroNoise

N = 400_000


def data(seed: int = 11) -> pa.Table:
    gen = np.random.default_rng(seed)
    x = gen.uniform(0.0, 100.0, N)
    return pa.table({"user_id": np.arange(N, dtype=np.int64), "amount": x})


def exact_fixed(x: np.ndarray, lo: float, hi: float, shift: float, k: int, square: bool = False) -> Fraction:
    """The exact sum of the values as the engine defines them (clamp, shift, truncate on 2^-k)."""
    v = np.clip(x, lo, hi) - shift
    if not square:
        return sum((Fraction(int(math.trunc(float(t) * 2.0**k)), 2**k) for t in v), Fraction(0))
    m = max(abs(lo - shift), abs(hi - shift))
    kq = fixed_point_scale(m * m)
    grid = [float(Fraction(int(math.trunc(float(t) * 2.0**k)), 2**k)) for t in v]
    return sum((Fraction(int(math.trunc(g * g * 2.0**kq)), 2**kq) for g in grid), Fraction(0))


def test_scale_keeps_magnitudes_below_2_52() -> None:
    for m in (1e-300, 1e-5, 0.75, 1.0, 100.0, 2.0**52, 1e300, 5e-324):
        k = fixed_point_scale(m)
        assert 2.0**51 <= Fraction(m) * Fraction(2) ** k < 2.0**52, m
    assert fixed_point_scale(0.0) == 0


@pytest.mark.parametrize("sql,col,shift,square", [
    ("SELECT SUM(amount) FROM events", "__a0", 0.0, False),
    ("SELECT AVG(amount) FROM events", "__a0_sum", 50.0, False),
    ("SELECT VARIANCE(amount) FROM events", "__a0_sq", 50.0, True),
])
def test_sums_are_exact_where_a_double_running_sum_is_not(sql: str, col: str, shift: float, square: bool) -> None:
    t = data()
    spec = spec_for("events", t, bounds={"amount": (0.0, 100.0)})
    plan = plan_for(sql, spec)
    text = run_bounded(plan, INF_CAPS, t, exact=True).column(col)[0].as_py()
    m = 50.0 if shift else 100.0
    want = exact_fixed(t.column("amount").to_numpy(), 0.0, 100.0, shift, fixed_point_scale(m), square)
    (scale,) = [c.scale for c in released_columns(plan, INF_CAPS) if c.name == col]
    assert scale == fixed_point_scale(m * m if square else m)
    # the exact total itself, no rounding
    assert Fraction(int(text)) * Fraction(2) ** -scale == want
    got = run_bounded(plan, INF_CAPS, t).column(col)[0].as_py()  # its correctly rounded double
    assert got == float(want)
    # negative control: DuckDB's own SUM over the same doubles is a running sum, off by far more
    con = duckdb.connect(config={"threads": 1})  # one order of the rows, so the control is reproducible
    con.register("t", t)
    expr = f"(LEAST(GREATEST(amount, 0), 100) - {shift})" if shift else "LEAST(GREATEST(amount, 0), 100)"
    plain = con.execute(f"SELECT SUM({expr} * {expr}) FROM t" if square else f"SELECT SUM({expr}) FROM t").fetchone()[0]
    con.close()
    assert abs(Fraction(plain) - want) > 8 * abs(want) * Fraction(2) ** -52, (plain, float(want))


def test_truncation_never_grows_a_value_beyond_its_sensitivity() -> None:
    # values at the bounds keep their magnitude; the released columns' sensitivities are unchanged
    t = pa.table({"user_id": np.arange(4, dtype=np.int64),
                  "amount": np.array([-np.inf, np.nan, 1e300, -1e300])})
    spec = spec_for("events", t, bounds={"amount": (-0.1, 0.3)})
    plan = plan_for("SELECT SUM(amount), AVG(amount) FROM events", spec)
    out = run_bounded(plan, INF_CAPS, t).to_pylist()[0]
    assert abs(out["__a0"]) <= 0.1 + 0.3 + 0.3 + 0.1  # each value within max(|lo|, |hi|)
    assert out["__a0"] == pytest.approx(-0.1 + 0.3 + 0.3 - 0.1, abs=1e-15)
    for c in released_columns(plan, Caps(1, 1)):
        if c.name == "__a0":
            assert c.sensitivity == 0.3


def test_tiny_and_huge_bounds() -> None:
    # the smallest and largest bounds a query may declare (1e-100 and 1e15 in magnitude; below 1e-100 it is
    # refused, tests/test_tiny_bounds.py)
    for lo, hi, x in ((0.0, 1e-100, 3e-101), (0.0, 1e15, 3e14)):
        t = pa.table({"user_id": np.arange(3, dtype=np.int64), "amount": np.array([x, x, x])})
        spec = spec_for("events", t, bounds={"amount": (lo, hi)})
        got = run_bounded(plan_for("SELECT SUM(amount) FROM events", spec), INF_CAPS, t).column("__a0")[0].as_py()
        assert got == pytest.approx(3 * x, rel=1e-15)


# -- the release adds its noise to the exact total -------------------------------------------------------


class FixedNoise(ZeroNoise):
    """Every Gaussian draw equal to ``value``: checks the release's arithmetic, not its distribution."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def normal(self, scale, size):  # type: ignore[no-untyped-def]
        return np.full(size, self.value)


#: 4096 people at 2^48 (the bound) and one at 2^-3: k = fixed_point_scale(2^48) = 3, the fixed-point integers
#: 2^51 (4096 times) and 1, the total 2^63 + 1 units of 2^-3 = 2^60 + 1/8, whose DOUBLE is 2^60
HUGE = 2.0**48
SMALL = 0.125
MANY = 4096
CASES = [
    ("SELECT SUM(amount) FROM events", "__a0", (0.0, HUGE), [HUGE] * MANY + [SMALL]),
    # centred on 2^48: the values 2^49 and 2^48 + 1/8 are 2^48 and 1/8 from the midpoint
    ("SELECT AVG(amount) FROM events", "__a0_sum", (0.0, 2 * HUGE), [2 * HUGE] * MANY + [HUGE + SMALL]),
    ("SELECT STDDEV(amount) FROM events", "__a0_sum", (0.0, 2 * HUGE), [2 * HUGE] * MANY + [HUGE + SMALL]),
]


def _huge(values: list[float], bounds: tuple[float, float], sql: str) -> tuple[Any, pa.Table, ReleasedColumn]:
    t = pa.table({"user_id": np.arange(len(values), dtype=np.int64), "amount": np.array(values)})
    plan = plan_for(sql, spec_for("events", t, bounds={"amount": bounds}))
    return plan, t, {c.name: c for c in released_columns(plan, Caps(1, 1))}


def _calibration(col: ReleasedColumn, noise: str) -> Calibration:
    return Calibration(mechanism=noise, cost=Budget(1.0, 1e-6 if noise == "gaussian" else 0.0), noise=noise,
                       caps=Caps(1, 1), columns=[col], scales={col.name: 1.0},
                       snap={col.name: (1.0, 2.0**62)} if noise == "laplace" else {})


@pytest.mark.parametrize("sql,col,bounds,values", CASES, ids=["sum", "avg", "stddev"])
def test_the_release_adds_the_noise_to_the_exact_total(sql: str, col: str, bounds: tuple[float, float],
                                                      values: list[float]) -> None:
    plan, t, cols = _huge(values, bounds, sql)
    c = cols[col]
    assert c.scale == fixed_point_scale(HUGE) == 3
    exact = Fraction(2) ** 60 + Fraction(SMALL)
    out = run_bounded(plan, INF_CAPS, t, exact=True)
    # the bounded query's total is the exact rational sum of the grid values
    assert exact_totals(out.column(col), c.scale) == [(2**63 + 1, 3)]
    assert Fraction(int(out.column(col)[0].as_py()), 2**3) == exact
    assert float(exact) == 2.0**60  # its DOUBLE has lost the odd part
    # zero noise: the correctly rounded exact total
    assert add_noise(out.column(col), c, _calibration(c, "gaussian"), ZeroNoise()).tolist() == [float(exact)]
    # noise cancelling the large part: v + x = 1/8 exactly, with one rounding
    got = add_noise(out.column(col), c, _calibration(c, "gaussian"), FixedNoise(-(2.0**60)))
    assert got.tolist() == [SMALL]
    # negative control: the old conversion to DOUBLE in SQL before the noise lost the 1/8
    con = duckdb.connect()
    old = con.execute("SELECT " + DuckDBOps().from_fixed_point(exp.cast(exp.Literal.string(out.column(col)[0].as_py()),
                                                                                 "HUGEINT"), c.scale).sql("duckdb")).fetchone()[0]
    con.close()
    assert old == 2.0**60 and old + -(2.0**60) == 0.0 != got[0]
    # the snapping mechanism's input: the correctly rounded double of the exact total
    assert add_noise(out.column(col), c, _calibration(c, "laplace"), ZeroNoise()).tolist() == [float(exact)]


def test_exact_totals_read_null_as_zero_and_round_correctly() -> None:
    # a public key with no row comes back NULL from the domain's outer join: a total of 0
    col = ReleasedColumn("__a0", 1.0, "sum", 3)
    cal = _calibration(col, "gaussian")
    vals = pa.chunked_array([pa.array([None, "-9", str(2**200 + 1), str(-(2**1100))])])
    assert exact_totals(vals, 3) == [(0, 3), (-9, 3), (2**200 + 1, 3), (-(2**1100), 3)]
    got = add_noise(vals, col, cal, FixedNoise(0.25))
    assert got.tolist() == [0.25, -1.125 + 0.25, float(Fraction(2**200 + 1, 8) + Fraction(1, 4)), -math.inf]
    assert add_noise(pa.chunked_array([pa.array([], pa.string())]), col, cal, FixedNoise(1.0)).size == 0
