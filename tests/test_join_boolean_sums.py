"""SUM / AVG over a BOOLEAN column in a join take [0, 1] from its type, as on one table
(``tests/test_boolean_sums.py``): ``SUM(o.paid)``, ``SUM(o.paid::INTEGER)`` and ``AVG(u.flag)`` were refused
over joins ("needs value bounds ... declares none for 'paid'"), though the same aggregates of one table
were answered. The bounded relation clamps the value to [0, 1] as for any declared bounds.

Sensitivity is checked on neighbours as in ``tests/test_join_multi_neighbour_fuzz.py``: the truncated
sums (every threshold tau) and per-owner totals on D and on D less one person (and every order that
reaches them) differ by at most what the calibration's bounds allow (tau x the weight of a value 1);
a negative control that claims half that weight must be flagged."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _join_fuzz as fz  # noqa: E402

import dpsql  # noqa: E402
from dpsql import errors  # noqa: E402
from dpsql.mechanisms.join_multi import MultiCalibration  # noqa: E402
from dpsql.plan.analyze import analyze  # noqa: E402
from dpsql.testing import use_noise, zero_noise  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _heap_frozen() -> Any:
    """Each neighbour observation collects earlier garbage before recording warnings; with the heap frozen once here,
    that collection examines only this module's objects (tests/_neighbour.py frozen_heap)."""
    from tests._neighbour import frozen_heap

    with frozen_heap():
        yield


JOIN = " FROM orders o JOIN users u ON o.uid = u.uid"
N_USERS = 40


def data(drop: int | None = None) -> dict[str, pa.Table]:
    """Person 0 holds the most trues (two paid orders, flag true); ``drop``: without that person."""
    uids = [u for u in range(N_USERS) if u != drop]
    orders = [(i, i % N_USERS, None if i % 13 == 5 else (i % N_USERS == 0 or i % 3 == 0)) for i in range(2 * N_USERS)]
    orders = [o for o in orders if o[1] != drop]
    return {"users": pa.table({"uid": uids, "flag": pa.array([u % 4 == 0 for u in uids], pa.bool_()),
                               "note": ["x"] * len(uids)}),
            "orders": pa.table({"oid": [o[0] for o in orders], "uid": [o[1] for o in orders],
                                "paid": pa.array([o[2] for o in orders], pa.bool_()),
                                "v": [float(o[0] % 7) for o in orders]})}


def session(drop: int | None = None) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5))
    use_noise(s, zero_noise(3))
    t = data(drop)
    s.register("users", t["users"], privacy_unit="uid", columns={"flag": {"domain": [False, True]}})
    s.register("orders", t["orders"], references={"uid": "users.uid"}, degree_bounds={"uid": 2})
    return s


@pytest.fixture(scope="module")
def s() -> Any:
    sess = session()
    yield sess
    sess.close()


@pytest.mark.parametrize("agg,value", [
    ("SUM(o.paid)", "o__paid"), ("AVG(o.paid)", "o__paid"), ("SUM(o.paid::INTEGER)", "CAST(o__paid AS INT)"),
    ("SUM(TRY_CAST(u.flag AS DOUBLE))", "TRY_CAST(u__flag AS DOUBLE)"), ("AVG(u.flag)", "u__flag"),
])
def test_a_boolean_in_a_join_is_bounded_by_its_type(s: Any, agg: str, value: str) -> None:
    p = analyze(f"SELECT {agg} AS n" + JOIN, dict(s.tables))
    assert p.join is not None
    plans = [p.join] if not p.join.aggregates else [a for a in p.join.aggregates if a.kind == "sum"]
    assert [(a.bounds, a.value.sql() if a.value is not None else None) for a in plans] == [((0.0, 1.0), value)]


@pytest.mark.parametrize("agg,words", [
    ("SUM(o.v)", "declares none for 'v'"),
    ("SUM(CAST(o.v AS INTEGER))", "over an expression needs literal bounds"),
    ("SUM(CAST(o.paid AS VARCHAR))", "over an expression needs literal bounds"),
    ("SUM(CAST(u.note AS INTEGER))", "over an expression needs literal bounds"),
])
def test_other_columns_still_need_bounds(s: Any, agg: str, words: str) -> None:
    before = s.remaining()
    with pytest.raises(errors.QueryError, match=words):
        s.query(f"SELECT {agg} AS n" + JOIN, epsilon=1.0)
    assert s.remaining() == before


@pytest.mark.parametrize("sql", [
    "SELECT SUM(o.paid::INTEGER) AS n, COUNT(o.paid) AS c" + JOIN,
    "SELECT SUM(u.flag::INTEGER) AS n" + JOIN,
])
def test_answers_are_duckdbs_with_zero_noise_and_no_truncation(s: Any, sql: str) -> None:
    """With q = 1, zero noise and every person within Delta, DP-S4S's answer is the join's sum less the
    threshold's known downward shift, the same for a cast and the bare column."""
    con = duckdb.connect()
    for name, t in data().items():
        con.register(name, t)
    want = con.sql(sql).fetchall()[0]
    got = s.query(sql, epsilon=8.0, options={"q": 1.0}).to_pylist()[0]
    bare = s.query(sql.replace("::INTEGER", ""), epsilon=8.0, options={"q": 1.0}).to_pylist()[0]
    assert got == bare
    assert 0 <= want[0] - got["n"] < 2.0  # the zero-noise release is shifted down by O(log(1/beta) / epsilon)
    if "c" in got:
        assert 0 <= want[1] - got["c"] < 2.0


def _internals(sess: Any, sql: str, opts: dict[str, Any]) -> list[dict[str, Any]]:
    """``_join_fuzz.internals`` of every run of the routed query (several aggregates: one run each)."""
    cal = sess._route(sql, 1.0, 1e-6 if "GROUP BY" in sql else 0.0, opts).calibration
    out = []
    try:
        for c in (cal.runs if isinstance(cal, MultiCalibration) else [cal]):
            sess._route = lambda *a, _c=c, **k: types.SimpleNamespace(calibration=_c)
            got = fz.internals(sess, sql, opts, 1.0, 1e-6 if "GROUP BY" in sql else 0.0)
            assert got is not None
            out.append(got)
    finally:
        del sess._route
    return out


QUERIES = [("SELECT SUM(o.paid) AS n" + JOIN, {"q": 1.0}),
           ("SELECT AVG(u.flag) AS a" + JOIN, {"q": 1.0}),
           ("SELECT SUM(o.paid::INTEGER) AS n, SUM(u.flag) AS m" + JOIN, {"q": 0.5}),
           ("SELECT u.flag, SUM(o.paid) AS n" + JOIN + " GROUP BY u.flag", {}),
           ("SELECT u.flag, SUM(o.paid) AS n" + JOIN + " GROUP BY u.flag", {"q": 1.0, "mechanism": "dp_s4s"})]


@pytest.mark.parametrize("sql,opts", QUERIES)
def test_neighbours_move_the_truncated_sums_within_the_bounds(s: Any, sql: str, opts: dict[str, Any]) -> None:
    ours = _internals(s, sql, opts)
    kinds = set()
    for victim in (0, 3, 8):
        sP = session(drop=victim)
        try:
            theirs = _internals(sP, sql, opts)
        finally:
            sP.close()
        for a, b in zip(ours, theirs, strict=True):
            kinds.add(a["kind"])
            assert fz.compare(a, b, f"users:{victim}") == [], (victim, a["kind"])
    assert kinds


def test_the_neighbour_check_can_fail(s: Any) -> None:
    """Negative control: a calibration claiming half the weight of a true value is caught (person 0's
    two paid orders move the truncated sum at tau = 2 by the whole weight of two values 1)."""
    sql, opts = QUERIES[0]
    (a,) = _internals(s, sql, opts)
    assert a["kind"] == "scalar-fast"
    sP = session(drop=0)
    try:
        (b,) = _internals(sP, sql, opts)
    finally:
        sP.close()
    assert fz.compare(a, b, "users:0") == []
    halved = {**a, "parts": [(units / 2, vals) for units, vals in a["parts"]]}
    assert fz.compare(halved, b, "users:0") != []
