"""Budget values that are not numbers: a boolean is refused whatever its type.

``epsilon=True`` was refused (a slip for a number must not spend a whole unit of epsilon), but
NumPy's boolean (``np.True_``, e.g. from ``mask.any()`` or an element of a boolean array) is not a
Python ``bool``, and ``float(np.True_)`` is 1.0: ``Session.query(..., epsilon=np.True_)`` charged
epsilon = 1 and ``delta=np.False_`` was read as pure DP. Both are refused for free now, as
``True`` and ``False`` are, in every place a budget enters (query, explain, suggest_caps, a Budget,
a budget mapping).
"""

from __future__ import annotations

import numpy as np
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError


@pytest.fixture
def s(events):  # type: ignore[no-untyped-def]
    sess = dpsql.Session(budget=Budget(10.0, 1e-5))
    sess.register("events", events, privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=1,
                  max_rows_per_unit=3)
    yield sess
    sess.close()


BOOLS = [np.True_, np.False_, np.bool_(True), np.array(True), np.array([True])[0]]


@pytest.mark.parametrize("value", BOOLS, ids=repr)
def test_numpy_boolean_epsilon_is_refused_for_free(s, value) -> None:  # type: ignore[no-untyped-def]
    before = s.remaining()
    for call in (lambda: s.query("SELECT COUNT(*) FROM events", epsilon=value),
                 lambda: s.explain("SELECT COUNT(*) FROM events", epsilon=value),
                 lambda: s.suggest_caps("events", epsilon=value)):
        with pytest.raises(ConfigError, match="epsilon must be a"):
            call()
    assert s.remaining() == before


@pytest.mark.parametrize("value", BOOLS, ids=repr)
def test_numpy_boolean_delta_is_refused_for_free(s, value) -> None:  # type: ignore[no-untyped-def]
    before = s.remaining()
    with pytest.raises(ConfigError, match="delta must be a"):
        s.query("SELECT COUNT(*) FROM events", epsilon=0.5, delta=value)
    assert s.remaining() == before


@pytest.mark.parametrize("value", BOOLS, ids=repr)
def test_numpy_boolean_budget_is_refused(value) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        Budget(value, 0.0)
    with pytest.raises(ConfigError):
        Budget(1.0, value)
    with pytest.raises(ConfigError):
        Budget.from_dict({"epsilon": value})


def test_numbers_of_numpy_types_still_pass(s) -> None:  # type: ignore[no-untyped-def]
    # negative control: NumPy numbers (not booleans) are numbers and are charged as such
    r = s.query("SELECT COUNT(*) FROM events", epsilon=np.float64(0.5), delta=np.float64(0.0))
    assert r.cost == Budget(0.5, 0.0)
    r = s.query("SELECT COUNT(*) FROM events", epsilon=np.int64(1))
    assert r.cost == Budget(1.0, 0.0)
