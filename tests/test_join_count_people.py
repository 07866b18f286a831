"""COUNT(DISTINCT person) over a join whose every tuple belongs to one person (one owner, Delta enforced by the
per-input row caps): the number of people with a joined tuple that meets the WHERE (per group), answered on the
one-table path over the joined relation with the owner as its unit (``dpsql.mechanisms.lookup``, "People counted over
a join"). Each person counts once per group, in at most C_u groups: sensitivity 1 per group, the one-table count of
units' calibration. Other COUNT(DISTINCT ...) over such joins, or the count beside other aggregates, stay refused for
free."""
from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import UnsupportedQueryError
from tests.test_tpch_queries import _COL, _data, _session, _truth

SCALARS = [
    f"SELECT COUNT(DISTINCT c.c_custkey) AS n {_COL}",
    f"SELECT COUNT(DISTINCT o.o_custkey) AS n {_COL}WHERE l.l_quantity > 14",
    f"SELECT COUNT(DISTINCT c.c_custkey) AS n {_COL}WHERE o.o_orderpriority = '1-URGENT' AND l.l_shipmode = 'MAIL'",
]


@pytest.mark.parametrize("sql", SCALARS)
def test_people_with_a_joined_tuple_are_counted_exactly_at_zero_noise(sql: str) -> None:
    data = _data()
    with _session(data) as s:
        r = s.query(sql, epsilon=1.0, delta=1e-6)
        assert r.to_pylist() == [{"n": _truth(data, sql)[0][0]}]
        assert "COUNT(DISTINCT person) over a join" in s.explain(sql, epsilon=1.0, delta=1e-6).reason


def _without(data: dict[str, pa.Table], cust: int) -> dict[str, pa.Table]:
    """``data`` without one customer and every row reaching them (their orders and those orders' line items)."""
    orders = data["orders"].to_pylist()
    theirs = {o["o_orderkey"] for o in orders if o["o_custkey"] == cust}
    out = dict(data)
    out["customer"] = pa.Table.from_pylist([c for c in data["customer"].to_pylist() if c["c_custkey"] != cust],
                                           schema=data["customer"].schema)
    out["orders"] = pa.Table.from_pylist([o for o in orders if o["o_custkey"] != cust], schema=data["orders"].schema)
    out["lineitem"] = pa.Table.from_pylist([x for x in data["lineitem"].to_pylist() if x["l_orderkey"] not in theirs],
                                           schema=data["lineitem"].schema)
    return out


@pytest.mark.parametrize("sql", SCALARS[:2])
def test_removing_one_person_moves_the_count_by_at_most_one(sql: str) -> None:
    """Neighbours: the data and the data without each customer in turn, zero noise: the count moves by 0 or 1, and
    by exactly 1 for a customer with a joined tuple (negative control: the person is counted)."""
    data = _data()
    with _session(data) as s:
        full = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()[0]["n"]
    moved = []
    for cust in sorted({c["c_custkey"] for c in data["customer"].to_pylist()}):
        smaller = _without(data, cust)
        with _session(smaller) as s:
            moved.append(full - s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()[0]["n"])
        assert moved[-1] == full - _truth(smaller, sql)[0][0]
    assert set(moved) <= {0, 1} and 1 in moved


def test_the_calibration_is_one_tables_count_of_units() -> None:
    """The noise of the count equals that of COUNT(DISTINCT unit) on customer alone (sensitivity 1), pinned here:
    the Gaussian mechanism's sigma at epsilon 1, delta 1e-6 and sensitivity 1 (as one table's count of units)."""
    with _session(_data()) as s:
        joined = s.explain(SCALARS[0], epsilon=1.0, delta=1e-6).parameters
        alone = s.explain("SELECT COUNT(DISTINCT c_custkey) AS n FROM customer", epsilon=1.0, delta=1e-6).parameters
    assert joined["sigma"] == alone["sigma"]
    assert joined["sigma"] == pytest.approx(4.224679, rel=1e-6)


def test_a_grouped_count_of_people_counts_each_person_in_at_most_c_u_groups() -> None:
    """GROUP BY a declared key: each person counts once in at most C_u groups (customer's default C_u = 1), so the
    counts sum to at most the number of people, each at most the group's true count."""
    data = _data()
    sql = f"SELECT l.l_shipmode AS m, COUNT(DISTINCT c.c_custkey) AS n {_COL}GROUP BY 1 ORDER BY 1"
    with _session(data) as s:
        got = {r["m"]: r["n"] for r in s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()}
    truth = dict(_truth(data, sql))
    people = _truth(data, SCALARS[0])[0][0]
    assert set(got) == {"MAIL", "SHIP"} and all(0 <= got[k] <= truth[k] for k in got)
    assert sum(got.values()) == people  # every person with a tuple is in one group


@pytest.mark.parametrize("sql", [
    f"SELECT COUNT(DISTINCT o.o_orderkey) AS n {_COL}",
    f"SELECT COUNT(DISTINCT l.l_suppkey) AS n {_COL}",
    f"SELECT COUNT(DISTINCT c.c_custkey) AS n, COUNT(*) AS m {_COL}",
    f"SELECT COUNT(DISTINCT c.c_custkey) AS n, SUM(l.l_quantity) AS q {_COL}",
])
def test_other_distinct_counts_over_such_a_join_are_refused_for_free(sql: str) -> None:
    with _session(_data()) as s:
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match="except COUNT\\(DISTINCT person\\) alone"):
            s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0


def test_a_join_with_several_people_per_tuple_is_refused_for_free() -> None:
    """A graph's edges joined to themselves: a tuple reaches two people (the owner of each edge), so removing one
    person removes tuples other people are counted through: refused, nothing charged."""
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5))
    s.register("node", pa.table({"id": list(range(6))}), privacy_unit="id")
    s.register("edge", pa.table({"src": [0, 1, 2, 3, 4], "dst": [1, 2, 3, 4, 5]}),
               references={"src": "node.id", "dst": "node.id"}, degree_bounds={"src": 4, "dst": 4})
    for sql in ("SELECT COUNT(DISTINCT e1.src) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src",
                "SELECT COUNT(DISTINCT e.src) FROM edge e JOIN node n ON e.dst = n.id"):
        with pytest.raises(UnsupportedQueryError, match="COUNT\\(DISTINCT"):
            s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 0
    # negative control: the people table's own count of people is answered
    assert s.query("SELECT COUNT(DISTINCT id) AS n FROM node", epsilon=1.0, delta=1e-6).table.num_rows == 1
