"""Bounded SUM / AVG / VARIANCE add fixed-point integers (``dpsql.rewrite.bound.fixed_point_scale``):
each clamped value times 2^k, truncated toward zero, summed as an integer (exact in any order),
converted to DOUBLE once. A floating-point running SUM's error grows with the rows and depends on
their order (DuckDB adds in whatever order its threads see the rows), while the snapping
mechanism's proof (docs/mechanisms.md 5.3) allows the input only 2^-52 of the bound."""

from __future__ import annotations

import math
from fractions import Fraction

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from test_bounding import INF as INF_CAPS
from test_bounding import plan_for, run_bounded, spec_for

from dpsql.rewrite.bound import Caps, fixed_point_scale, released_columns

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
    got = run_bounded(plan, INF_CAPS, t).column(col)[0].as_py()
    m = 50.0 if shift else 100.0
    want = exact_fixed(t.column("amount").to_numpy(), 0.0, 100.0, shift, fixed_point_scale(m), square)
    # one conversion of the exact total: within an ulp or two
    assert abs(Fraction(got) - want) <= abs(want) * Fraction(2) ** -52, (got, float(want))
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
    # 2^k itself is outside a DOUBLE's range for the tiny bound: the scale is applied in two factors
    for lo, hi, x in ((0.0, 1e-300, 3e-301), (0.0, 1e15, 3e14)):
        t = pa.table({"user_id": np.arange(3, dtype=np.int64), "amount": np.array([x, x, x])})
        spec = spec_for("events", t, bounds={"amount": (lo, hi)})
        got = run_bounded(plan_for("SELECT SUM(amount) FROM events", spec), INF_CAPS, t).column("__a0")[0].as_py()
        assert got == pytest.approx(3 * x, rel=1e-15)
