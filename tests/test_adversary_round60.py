"""GROUP BY over declared keys: the free check of the conditions on the keys alone.

* ``HAVING COUNT(*) > 0 AND CAST(c AS INTEGER) = 1`` over a text key declared ``['1', 'x']`` released the row of
  key '1' (the release evaluates HAVING under TRY: 'x' does not convert, so its row is dropped). The check that
  refuses, for free, conditions on the keys that keep no declared key evaluated the key-only conjunct without TRY,
  over every declared key: 'x' failed the cast and the query was refused as an ExecutionError ('post-processing of
  the released values failed'). The check now evaluates the conjuncts as the release does.
* Over DAWA's histogram (declared bins, no declared domain) the same refusal listed the keys as 'x: ': it now lists
  the released keys' values (the bin labels).
* Privacy: a LEFT JOIN's ON equalities (``LEFT JOIN lk ON o.cc = lk.v AND o.cid = lk.v AND o.cid2 = lk.v``) made the
  two people of an order (cid, cid2) one person class, so the order was bounded per cid alone and one person named by
  the cid2 of many orders moved a count by far more than the sensitivity. A LEFT JOIN keeps its rows matched or not:
  its ON no longer makes columns one class, and such a join is refused (two owners per row).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


def _session() -> dpsql.Session:
    n = 40
    t = pa.table({"uid": list(range(n)), "c": ["1", "x"] * (n // 2)})
    s = dpsql.Session(budget=Budget(10.0, 0.9))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=1, columns={"c": {"domain": ["1", "x"]}})
    return s


@pytest.mark.parametrize("having", ["COUNT(*) > 0 AND CAST(c AS INTEGER) = 1", "n > 0 AND CAST(c AS INTEGER) = 1"])
def test_a_key_condition_that_fails_on_some_declared_keys_keeps_the_others(having: str) -> None:
    with _session() as s:
        r = s.query(f"SELECT c, COUNT(*) AS n FROM t GROUP BY c HAVING {having}", epsilon=1.0, delta=1e-6)
        assert r.to_pylist() == [{"c": "1", "n": 20}]


def test_negative_control_a_key_condition_that_fails_on_every_declared_key_is_refused_for_free() -> None:
    with _session() as s:
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match="exclude every declared key"):
            s.query("SELECT c, COUNT(*) AS n FROM t GROUP BY c HAVING n > 0 AND CAST(c AS INTEGER) = 7",
                    epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0


def test_a_histogram_over_declared_bins_names_its_bins_when_the_conditions_keep_none() -> None:
    """DAWA's histogram releases the declared bins a condition on the key can hold (labelled with their lower edges):
    a HAVING on the key that keeps no label is refused for free, naming the labels (no declared domain lists them:
    the refusal said 'x: ')."""
    n = 100
    t = pa.table({"uid": list(range(n)), "x": pa.array([(i % 100) / 10 for i in range(n)])})
    with dpsql.Session(budget=Budget(10.0, 0.9)) as s:
        use_noise(s, zero_noise())
        s.register("t", t, privacy_unit="uid", columns={"x": {"bounds": (0, 10), "bin_width": 1}})
        assert len(s.query("SELECT x, COUNT(*) AS n FROM t GROUP BY x HAVING x > 8.5", epsilon=1.0).to_pylist()) == 1
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match=r"exclude every declared key \(x: 9\.0\)"):
            s.query("SELECT x, COUNT(*) AS n FROM t GROUP BY x HAVING x > 9.5", epsilon=1.0)
        assert s.remaining() == before and s.history().num_rows == 1


# -- a LEFT JOIN's ON proves no two columns equal ------------------------------------------------------------------


def _orders_session(with_person_7: bool) -> dpsql.Session:
    """orders reach customers through cid and cid2 (cid2 mostly NULL). With person 7: customer 7, its order (cid 7)
    and 30 orders of customers 20..49 whose cid2 is 7 (rows of both of their customers); without: none of these."""
    cid = [i for i in range(20) if with_person_7 or i != 7] + (list(range(20, 50)) if with_person_7 else [])
    cid2 = [None] * (20 if with_person_7 else 19) + ([7] * 30 if with_person_7 else [])
    s = dpsql.Session(budget=Budget(1e9, 0.9))
    use_noise(s, zero_noise(3))
    s.register("customer", pa.table({"id": [i for i in range(50) if with_person_7 or i != 7]}), privacy_unit="id")
    s.register("lk", pa.table({"v": list(range(100)), "name": [f"n{i % 2}" for i in range(100)]}), public=True,
               columns={"name": {"domain": ["n0", "n1"]}})
    s.register("orders", pa.table({"oid": list(range(len(cid))), "cid": pa.array(cid, pa.int64()),
                                   "cid2": pa.array(cid2, pa.int64()), "cc": pa.array(cid, pa.int64())}),
               references={"cid": "customer.id", "cid2": "customer.id", "cc": "lk.v"},
               degree_bounds={"cid": 2, "cid2": 2})
    return s


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM orders o LEFT JOIN lk ON o.cc = lk.v AND o.cid = lk.v AND o.cid2 = lk.v",
    "SELECT lk.name, COUNT(*) AS n FROM orders o LEFT JOIN lk ON o.cc = lk.v AND o.cid = lk.v AND o.cid2 = lk.v "
    "GROUP BY lk.name",
])
def test_a_left_joins_on_does_not_make_two_owners_one(sql: str) -> None:
    """``LEFT JOIN lk ON o.cc = lk.v AND o.cid = lk.v AND o.cid2 = lk.v`` keeps every order, matched or not, but its
    equalities made o.cid and o.cid2 one person class: the orders were bounded per cid only, and person 7, named by
    the cid2 of 30 orders of other customers, moved the zero-noise count by 31 (19 -> 50), where the Laplace
    mechanism was calibrated to an L1 sensitivity of 1. Only an inner join's equalities hold in every tuple."""
    for with_7 in (True, False):
        with _orders_session(with_7) as s:
            before = s.remaining()
            with pytest.raises(dpsql.errors.PolicyError, match="do not each belong to one person"):
                s.query(sql, epsilon=1.0, delta=0.0, options={"mechanism": "laplace"})
            assert s.remaining() == before and s.history().num_rows == 0


def test_negative_control_an_inner_joins_equalities_make_the_owners_one() -> None:
    sql = "SELECT COUNT(*) AS n FROM orders o JOIN lk ON o.cc = lk.v AND o.cid = lk.v AND o.cid2 = lk.v"
    got = []
    for with_7 in (True, False):
        with _orders_session(with_7) as s:
            got.append(s.query(sql, epsilon=1.0, delta=1e-3).to_pylist()[0]["n"])
    assert got == [0, 0]  # no order has cid = cid2
