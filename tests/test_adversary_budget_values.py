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
import pyarrow as pa
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


#: the last two: a 0-d array of objects holding a boolean (np.asarray(flag, dtype=object)), which float() reads as
#: 1.0 and whose dtype is no boolean one
BOOLS = [np.True_, np.False_, np.bool_(True), np.array(True), np.array([True])[0], np.array(True, dtype=object),
         np.array(np.False_, dtype=object)]


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
    r = s.query("SELECT COUNT(*) FROM events", epsilon=np.array(0.5, dtype=object))
    assert r.cost == Budget(0.5, 0.0)


def test_groupings_whose_deltas_reach_one_are_refused_in_terms_of_the_request(s) -> None:  # type: ignore[no-untyped-def]
    """A ROLLUP's queries each fit their share of a delta just below 1, but their Gaussian samplers' floating-point
    deltas take the sum to 1 or more: refused for free, saying so (as one query is), not with a Budget's complaint
    about a delta of 1.0000000000067737 that nobody passed."""
    s.register("sales", pa.table({"u": list(range(40)), "c": ["a", "b"] * 20, "v": [1.0] * 40}), privacy_unit="u",
               max_rows_per_unit=1, columns={"c": {"domain": ["a", "b"]}, "v": {"bounds": (0, 10)}})
    before = s.remaining()
    q = "SELECT c, SUM(v) FROM sales GROUP BY ROLLUP(c)"
    for call in (s.query, s.explain):
        with pytest.raises(ConfigError) as info:
            call(q, epsilon=1.0, delta=0.9999999999999999)
        msg = info.value.message
        assert "floating-point" in msg and "reaches 1" in msg and "1.0000000000" not in msg, msg
    assert s.remaining() == before
    # negative control: a delta that leaves room for the floating-point parts is answered
    assert s.explain(q, epsilon=1.0, delta=0.5).cost.delta < 1


def _binned_events(tmp_path):  # type: ignore[no-untyped-def]
    """A Session over the events in a Parquet file (a file source: its synopses are kept), age in 10 bins."""
    import pyarrow.parquet as pq
    from conftest import make_events

    src = tmp_path / "events.parquet"
    pq.write_table(make_events(), src)
    sess = dpsql.Session(budget=Budget(100.0, 1e-3))
    sess.register("events", str(src), privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=1,
                  max_rows_per_unit=3, columns={"age": {"bounds": (0, 100), "bins": 10}})
    return sess


def test_a_rollup_keeps_its_histogram_synopsis_for_free_reuse(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A ROLLUP (CUBE, GROUPING SETS, UNION ALL) whose query over an ordered column's bins is answered by DAWA paid for
    that synopsis, but did not keep it: the same histogram asked alone afterwards was charged again (wasted budget,
    no leak). The grouping's entry now stores the synopsis of its first DAWA query, which later requests read for
    free, as they read one stored by the histogram alone."""
    sess = _binned_events(tmp_path)
    try:
        r = sess.query("SELECT age, COUNT(*) FROM events GROUP BY ROLLUP(age)", epsilon=1.0, delta=1e-6)
        assert [c["mechanism"] for c in r.details["components"]][0] == "dawa"
        again = sess.query("SELECT age, COUNT(*) FROM events GROUP BY age", epsilon=1.0)
        assert again.cost == Budget(0.0, 0.0) and again.reused, again
        assert f"ledger entry {r.ledger_id}" in " ".join(again.notes)
        # negative control: the same bins under another WHERE (no stored synopsis) are charged
        fresh = sess.query("SELECT age, COUNT(*) FROM events WHERE age > 10 GROUP BY age", epsilon=1.0)
        assert fresh.cost == Budget(1.0, 0.0) and not fresh.reused
    finally:
        sess.close()


def test_grouping_deltas_that_round_up_to_one_are_refused_in_terms_of_the_request() -> None:
    """The queries' deltas add up to just below 1 (0.49999999999999994 + 0.5 = 0.99999999999999994), but the charge
    is recorded as the least float whose decimal is at least that sum, which is 1.0: the refusal was a Budget's
    complaint about a delta of 1.0 that nobody passed, not the request's own terms."""
    from types import SimpleNamespace

    from dpsql.groupings import _cost

    def routes(*deltas: float) -> list[object]:
        return [SimpleNamespace(description=SimpleNamespace(cost=Budget(0.5, d))) for d in deltas]

    with pytest.raises(ConfigError) as info:
        _cost(routes(0.49999999999999994, 0.5))
    assert "floating-point" in info.value.message and "1.0" not in info.value.message, info.value.message
    # negative control: a sum that rounds up to a float below 1 is charged as that float
    assert _cost(routes(0.49999999999999994, 0.49999999999999994)).delta == 0.9999999999999999


def test_a_synopsis_made_at_a_smaller_share_says_so_when_reused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A ROLLUP gives each of its queries a share of epsilon (here 1/100 of 0.2 to the histogram); the histogram's
    synopsis, kept, then answers the same histogram asked alone at epsilon=5 for free, with the noise of epsilon=0.002.
    The release said only that it was read from a synopsis: its accuracy figures told, its words did not. It now says
    the epsilon the synopsis was made at, below the one asked, and how to run afresh."""
    sess = _binned_events(tmp_path)
    try:
        sess.query("SELECT age, COUNT(*) FROM events GROUP BY ROLLUP(age)", epsilon=0.2,
                   options={"grouping_weights": [1, 99]})
        q = "SELECT age, COUNT(*) FROM events GROUP BY age"
        for r in (sess.query(q, epsilon=5.0), sess.explain(q, epsilon=5.0)):
            said = " ".join(r.notes)
            assert r.cost == Budget(0.0, 0.0) and "made at epsilon=0.002" in said and "reuse': 'never'" in said, said
        assert sess.query(q, epsilon=5.0).details["synopsis_epsilon"] == pytest.approx(0.002, rel=1e-12)  # as calibrated
        # negative control: asked at no more than the synopsis's epsilon, nothing is said about it
        said = " ".join(sess.query(q, epsilon=0.002).notes)
        assert "ledger entry 1" in said and "made at epsilon" not in said, said
    finally:
        sess.close()


def test_a_synopsis_text_that_is_no_json_leaves_its_epsilon_unsaid() -> None:
    from dpsql.mechanisms.ranges import synopsis_epsilon

    assert synopsis_epsilon("not json") is None and synopsis_epsilon('{"epsilon": true}') is None
    assert synopsis_epsilon('{"flat": {"epsilon": 0.5}}') == 0.5  # negative control: a 2-D synopsis's own
