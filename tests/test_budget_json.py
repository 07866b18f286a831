"""A Budget in JSON: ``to_dict`` / ``from_dict`` round-trip exactly, and a Release's metadata dumps as is."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.release import Release


@pytest.mark.parametrize("b", [Budget(1.0), Budget(0.1, 1e-6), Budget(0.30000000000000004, 5e-324),
                               Budget(1e308, 0.9999999999999999), Budget(0.0, 0.0)])
def test_budget_round_trips_through_json_exactly(b: Budget) -> None:
    d = b.to_dict()
    assert d == {"epsilon": b.epsilon, "delta": b.delta}
    back = Budget.from_dict(json.loads(json.dumps(d)))
    assert back == b and back.epsilon == b.epsilon and back.delta == b.delta


def test_budget_from_dict_accepts_a_missing_delta_and_plain_text() -> None:
    assert Budget.from_dict({"epsilon": 2}) == Budget(2.0, 0.0)
    assert Budget.from_dict({"epsilon": "0.5", "delta": "1e-6"}) == Budget(0.5, 1e-6)


@pytest.mark.parametrize("bad, words", [
    ({"eps": 1.0}, "epsilon"),
    ({"epsilon": 1.0, "delta": 1e-6, "sigma": 3}, "sigma"),
    ({"epsilon": -1.0}, "epsilon"),
    ({"epsilon": 1.0, "delta": 1.5}, "delta"),
    ({"epsilon": None}, "epsilon"),
    ([1.0, 1e-6], "mapping"),
])
def test_budget_from_dict_refuses_what_is_not_a_budget(bad: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as e:
        Budget.from_dict(bad)  # type: ignore[arg-type]
    assert e.value.hint


def test_release_metadata_with_its_cost_dumps_to_json() -> None:
    r = Release(pa.table({"n": [3]}), Budget(0.1, 1e-6), "gaussian", {}, 7,
                details={"epsilon": 0.1, "composed_of": Budget(0.05, 5e-7)})
    meta = json.loads(json.dumps(r.meta(Budget(0.9, 9e-6))))
    assert Budget.from_dict(meta["cost"]) == r.cost and Budget.from_dict(meta["remaining"]) == Budget(0.9, 9e-6)
    # a Budget among the parameters keeps its exact values (not its 6-digit str)
    assert Budget.from_dict(meta["parameters"]["composed_of"]) == Budget(0.05, 5e-7)
    # the ETL spelling for a cost alone
    assert json.loads(json.dumps({"cost": r.cost.to_dict()}))["cost"] == {"epsilon": 0.1, "delta": 1e-6}


def test_a_composed_cost_is_never_shown_below_what_was_spent() -> None:
    """Spent totals (``Ledger.spent()``, ``compose``, ``+``) are read by people deciding what is left: their
    float is the least one whose decimal is at least the exact sum (rounding to nearest showed up to half an
    ulp less, e.g. 1 + 1e-17 as 1.0)."""
    from fractions import Fraction

    from dpsql.budget import compose, compose_counted, exact

    costs = [Budget(1.0, 0.5), Budget(1e-17, 1e-20)]
    for total in (compose(costs), compose_counted([(c, 1) for c in costs]), costs[0] + costs[1]):
        assert exact(total.epsilon) >= Fraction(1) + Fraction("1e-17"), total
        assert exact(total.delta) >= Fraction(1, 2) + Fraction("1e-20"), total
    assert compose([Budget(0.1)] * 10) == Budget(1.0)  # exact sums stay exact


def test_the_spent_budget_a_refused_total_names_is_a_total_that_fits(tmp_path) -> None:
    """set_total refuses a total below what was spent and names the spent budget: that value, entered as
    the new total, is accepted (shown rounded to nearest it was 0.9000000000000001, which was refused again)."""
    from dpsql.ledger import Ledger

    led = Ledger.create(str(tmp_path / "l.duckdb"), Budget(1.0))
    try:
        for _ in range(3):
            led.reserve(Budget(0.1 + 0.2), mechanism="m", query="q", tables=["t"], params={})
        with pytest.raises(ConfigError, match="already spent") as e:
            led.set_total(Budget(0.5), reason="shrink")
        shown = led.spent()
        assert repr(shown.epsilon) in str(e.value)
        led.set_total(shown, reason="exactly what was spent")
        assert 0.0 <= led.remaining().epsilon < 1e-16  # the exact 0.90000000000000012 spent, of a total of 0.9000000000000002
    finally:
        led.close()
