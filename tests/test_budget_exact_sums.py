"""The budget check's exact sums (``dpsql.budget``) against a plain ``Fraction`` reference written
here: every distinct cost read as its shortest round-trip decimal, times its count, added exactly.
The sums are computed as decimals (an analyst who never repeats an epsilon made the ``Fraction``
sum cost ~75 us per distinct value inside the ledger's exclusive lock: 4 s at 50 000 values;
``benchmarks/ledger_overhead.py --history 50000 --distinct``); they must stay exact at every
magnitude a double can take, subnormals and the largest double included."""

from __future__ import annotations

import math
import random
from fractions import Fraction

from dpsql.budget import Budget, _exact_counted_sums, counted_remaining, exact_counted_sum_fits


def _reference(counted: list[tuple[Budget, int]]) -> tuple[Fraction, Fraction]:
    e = sum((n * Fraction(repr(c.epsilon)) for c, n in counted), Fraction(0))
    d = sum((n * Fraction(repr(c.delta)) for c, n in counted), Fraction(0))
    return e, d


def _random_costs(rng: random.Random, k: int) -> list[tuple[Budget, int]]:
    out = []
    for _ in range(k):
        eps = rng.choice([
            rng.uniform(0.001, 1.0),
            rng.uniform(1, 10) * 10.0 ** -rng.randint(1, 320),
            math.ulp(0.0) * rng.randint(1, 10**6),  # subnormals
            rng.uniform(0.5, 1.0) * 1.7e308,
            round(rng.uniform(0, 1), rng.randint(1, 6)),
        ])
        delta = rng.choice([0.0, rng.uniform(0, 1e-6), math.ulp(0.0), 0.999999999999, rng.uniform(0, 1) * 1e-300])
        out.append((Budget(eps, delta), rng.choice([1, 2, 7, 10**9, 2**62])))
    return out


def test_sums_equal_the_fraction_reference_at_every_magnitude() -> None:
    rng = random.Random(20261201)
    for _ in range(200):
        counted = _random_costs(rng, rng.randint(0, 40))
        assert _exact_counted_sums(counted) == _reference(counted)


def test_decisions_at_the_edge_are_exact() -> None:
    # ten charges of 0.1 fill 1.0 exactly; one more subnormal epsilon does not fit
    tenths = [(Budget(0.1, 1e-7), 10)]
    assert exact_counted_sum_fits(tenths, Budget(0.0, 0.0), Budget(1.0, 1e-6))
    assert not exact_counted_sum_fits(tenths, Budget(5e-324, 0.0), Budget(1.0, 1e-6))
    assert not exact_counted_sum_fits(tenths, Budget(0.0, 9.000000000000001e-07), Budget(1.0, 1e-6))
    # a history of tiny distinct charges whose float sum rounds to less than their exact sum
    tiny = [(Budget(1e-17 * (1 + i / 1000)), 1) for i in range(1000)]
    exact_tiny = _reference(tiny)[0]
    total = Budget(1.0)
    rem = counted_remaining(tiny, total)
    assert Fraction(repr(rem.epsilon)) <= 1 - exact_tiny  # reported remaining always fits
    assert exact_counted_sum_fits(tiny, rem, total)
    assert not exact_counted_sum_fits(tiny, Budget(1.0), total)  # negative control: 1.0 no longer fits
    # the largest doubles, many times: far beyond any double, still exact
    huge = [(Budget(1.7976931348623157e308), 2**62), (Budget(5e-324), 3)]
    assert _exact_counted_sums(huge)[0] == 2**62 * Fraction("1.7976931348623157e308") + 3 * Fraction("5e-324")


def test_the_ledgers_fast_path_builds_the_same_budgets_and_leaves_invalid_values_to_validation() -> None:
    from dpsql.ledger._store import _plain_budget

    for e, d in [(0.1, 0.0), (-0.0, -0.0), (5e-324, 5e-324), (1.7976931348623157e308, 0.9999999999999999)]:
        b = _plain_budget(e, d)
        assert b is not None and b == Budget(e, d) and repr(b) == repr(Budget(e, d))
    for e, d in [(math.nan, 0.0), (math.inf, 0.0), (0.1, 1.0), (0.1, math.nan), (-1e-300, 0.0), (0.1, -5e-324),
                 (1, 0.0), ("0.1", 0.0), (None, 0.0)]:
        assert _plain_budget(e, d) is None


def test_equal_shares_never_add_up_to_more_than_the_whole() -> None:
    """share_of(total, n): n equal shares of an epsilon or delta (basic composition over runs, coordinates
    or aggregates) add up to at most total as exact numbers, and lose at most one ulp each. The negative
    control: total / n rounded to nearest overspends for some splits (1.0 / 10 is one)."""
    from fractions import Fraction

    import numpy as np

    from dpsql.budget import share_of

    assert 10 * Fraction(1.0 / 10) > 1  # the naive share overspends (the float 0.1 is above 1/10)
    over = 0
    rng = np.random.default_rng(20261202)
    for total in [1.0, 0.1, 1e-5, 3.0, *rng.uniform(1e-3, 10.0, 500), *(10.0 ** rng.uniform(-12, -4, 200))]:
        for n in (1, 2, 3, 5, 7, 10, 12, 49, 1000, 2.0, 6.0):
            x = share_of(float(total), n)
            over += Fraction(n) * Fraction(float(total) / n) > Fraction(float(total))
            assert 0 < x and Fraction(n) * Fraction(x) <= Fraction(float(total))
            assert Fraction(n) * Fraction(np.nextafter(x, np.inf)) > Fraction(float(total)) or n == 1
    assert over > 100  # the control: rounding to nearest overspent in many of these splits
