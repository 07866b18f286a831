"""Joins: self-joins, three-way joins, looked-up chains, comma joins, casts and NULL-safe equalities in ON,
aggregates with FILTER / DISTINCT / CASE, and GROUP BY keys from the public or the private side.

Finding (fixed, wording): over a join, ``SUM(DISTINCT ...)`` and ``AVG(DISTINCT ...)`` were refused with "SUM over
an expression needs literal bounds: write SUM(LEAST(GREATEST(expr, lo), hi))", whose fix is no fix: the same call
with that clamp (``SUM(DISTINCT LEAST(GREATEST(o.amt, 0), 3))``) got the same message. The refusal now names
DISTINCT, as on one table ("distinct values are not bounded per person; drop DISTINCT"), over every join, lookup
joins included; nothing is spent.

Finding (fixed, wording): a LEFT JOIN from a private table to a public lookup on exactly the declared reference
(``orders o LEFT JOIN countries k ON o.cc = k.code``, orders referencing ``countries.code``) was refused as "this join
is not one" when the private table's rows reach their people through another table (``orders.cid ->
customer.id``, whose customer references a sales representative; or a key that is not the person table's unit),
with the hint "LEFT JOIN each public lookup on the column the private table references (as 'orders' declares
references={'cid': 'customer.id'})": the reference it named was to a person table, and the join it advised was the
one written. The refusal now says which condition fails (several private tables; rows that do not each belong to one
person named by a column of their own, with the paths they reach people through; a public table joined on a column
that is not its key), the hint advises an inner JOIN where no LEFT JOIN could be answered, and an example reference
is one into a public table.

Finding (fixed, bad input): ``degree_caps`` naming a column the join does not cap (``{'orders.amt': 2}`` over
``customer c JOIN orders o ON c.id = o.cid``, or a column the table does not have, ``{'orders.zzz': 2}``) was
accepted, charged and ignored: the analyst believed a cap applied that did not. Such a key is now refused for free,
naming the columns the join caps.

Finding (fixed, wording): ``tau_base=1.0000001`` was refused as "tau_base=1 makes about 10986124 truncation
thresholds", a value the analyst did not pass (and one refused for another reason); the refusal now spells the base
given (DP-S4S and R2T alike).

Finding (fixed): over a join, ``GROUP BY extract(year FROM o.od)`` (or ``date_part('year', o.od)``, which the
planner reads as the key ``year(o.od)``) was refused when the SELECT list or HAVING named the key in that spelling:
"'o.od' in SELECT is neither aggregated nor a GROUP BY key; add it to GROUP BY", a fix already made. The key's
outputs now match every spelling of the year the key itself accepts, and release what ``year(o.od)`` releases.
A WHERE condition on the key in such a spelling (``WHERE extract(year FROM o.od) > 2020``) did not filter the
released key set as ``WHERE year(o.od) > 2020`` does (2020 was released with a noisy 0); it now does.

Finding (fixed, wrong answer): over a join, ``AVG(e.paid::INTEGER)`` of a BOOLEAN column holding NULLs divided the
sum by every tuple (``COUNT(*)``, as for a clamp, which SQL never makes NULL) instead of the tuples where ``paid``
is not NULL: with zero noise 0.25 where SQL, and the same query on one table, answer 0.5 (lookup joins and the
join mechanisms alike). A numeric cast of a column is NULL exactly where the column is, so its AVG now counts
``COUNT(col)``.
"""

from __future__ import annotations

import datetime
from typing import Any

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


def _tables() -> dict[str, pa.Table]:
    """customer (unit ``id``, segment with a domain) <- orders (``cid``, ``amt`` in [0, 4]) <- item; a public
    ``segs`` and ``countries`` (orders reference ``countries.code``)."""
    oid, cid, amt, cc = [], [], [], []
    for i in range(10):
        for j in range(1 + i % 3):
            oid.append(len(oid))
            cid.append(i)
            amt.append(float((i + j) % 5))
            cc.append(["FR", "DE"][(i + j) % 2])
    return {"customer": pa.table({"id": list(range(10)), "seg": [f"s{i % 3}" for i in range(10)]}),
            "orders": pa.table({"oid": oid, "cid": pa.array(cid, pa.int64()), "amt": amt, "cc": cc}),
            "item": pa.table({"oid": [o for k, o in enumerate(oid) for _ in range(1 + k % 2)]}),
            "countries": pa.table({"code": ["FR", "DE"], "region": ["EU", "EU"]})}


def _session(t: dict[str, pa.Table] | None = None) -> dpsql.Session:
    t = _tables() if t is None else t
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(5))
    s.register("countries", t["countries"], public=True)
    s.register("customer", t["customer"], privacy_unit="id", columns={"seg": {"domain": ["s0", "s1", "s2"]}})
    s.register("orders", t["orders"], references={"cid": "customer.id", "cc": "countries.code"},
               degree_bounds={"cid": 3}, columns={"amt": {"bounds": (0, 4)}})
    s.register("item", t["item"], references={"oid": "orders.oid"}, degree_bounds={"oid": 2})
    return s


def _history(s: dpsql.Session) -> list[Any]:
    return list(s.history().to_pylist())


J = "FROM customer c JOIN orders o ON c.id = o.cid"
LOOKUP = "FROM orders o JOIN countries k ON o.cc = k.code"


@pytest.mark.parametrize("sql", [
    f"SELECT SUM(DISTINCT LEAST(GREATEST(o.amt, 0), 3)) {J}",
    f"SELECT SUM(DISTINCT o.amt) {J}",
    f"SELECT AVG(DISTINCT LEAST(GREATEST(o.amt, 0), 3)) {J}",
    f"SELECT c.seg, SUM(DISTINCT o.amt) {J} GROUP BY c.seg",
    f"SELECT SUM(DISTINCT o.amt) {LOOKUP}",
    f"SELECT AVG(DISTINCT o.amt) {LOOKUP}",
])
def test_sum_or_avg_distinct_over_a_join_is_refused_naming_distinct(sql: str) -> None:
    with _session() as s:
        before, recorded = s.remaining(), len(_history(s))
        with pytest.raises(UnsupportedQueryError) as e:
            s.query(sql, epsilon=1.0, delta=1e-6)
        assert "DISTINCT ...) is not supported: distinct values are not bounded per person; drop DISTINCT" in str(e.value)
        assert "needs literal bounds" not in str(e.value)
        assert s.remaining() == before and len(_history(s)) == recorded
        # the fix it names answers: the same call without DISTINCT
        s.query(sql.replace("DISTINCT ", ""), epsilon=1.0, delta=1e-6)


def _reps_session() -> dpsql.Session:
    """orders -> customer -> salesrep (two people per order) and orders -> countries (a public lookup)."""
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    s.register("countries", pa.table({"code": ["FR", "DE"], "region": ["EU", "EU"]}), public=True)
    s.register("salesrep", pa.table({"id": [1, 2]}), privacy_unit="id")
    s.register("customer", pa.table({"id": list(range(10)), "rep": [1 + i % 2 for i in range(10)]}), privacy_unit="id",
               references={"rep": "salesrep.id"}, degree_bounds={"rep": 5})
    s.register("orders", pa.table({"oid": list(range(30)), "cid": [i % 10 for i in range(30)],
                                   "cc": [["FR", "DE"][i % 2] for i in range(30)]}),
               references={"cid": "customer.id", "cc": "countries.code"}, degree_bounds={"cid": 3})
    return s


def test_a_left_join_refused_for_its_private_tables_people_says_why_and_advises_an_inner_join() -> None:
    with _reps_session() as s:
        before, recorded = s.remaining(), len(_history(s))
        with pytest.raises(dpsql.errors.PolicyError) as e:
            s.query("SELECT COUNT(*) FROM orders o LEFT JOIN countries k ON o.cc = k.code", epsilon=1.0, delta=1e-6)
        text = str(e.value)
        assert "do not each belong to one person named by a column of their own" in text
        assert "o.cid -> customer.id -> salesrep.id (salesrep)" in text
        assert "use an inner JOIN" in text and "customer.id'}" not in text  # no reference to a person table as the fix
        assert s.remaining() == before and len(_history(s)) == recorded
        s.query("SELECT COUNT(*) FROM orders o JOIN countries k ON o.cc = k.code", epsilon=1.0, delta=1e-6)  # the fix


def test_a_left_join_refused_for_a_fanned_out_public_table_names_it_and_a_public_reference() -> None:
    with _session() as s:
        s.register("cities", pa.table({"code": ["FR", "FR", "DE"], "city": ["p", "l", "b"]}), public=True,
                   references={"code": "countries.code"}, degree_bounds={"code": 2})
        with pytest.raises(dpsql.errors.PolicyError) as e:
            s.query("SELECT COUNT(*) FROM orders o JOIN cities t ON o.cc = t.code LEFT JOIN countries k ON o.cc = k.code",
                    epsilon=1.0, delta=1e-6)
        text = str(e.value)
        assert "a public table is joined on a column that is not its declared key (t.code)" in text
        assert "references={'cc': 'countries.code'}" in text


@pytest.mark.parametrize("caps", [{"orders.amt": 2}, {"orders.zzz": 2}, {"orders.oid": 1}])
def test_degree_caps_on_a_column_the_join_does_not_cap_is_refused_for_free(caps: dict[str, int]) -> None:
    with _session() as s:
        before, recorded = s.remaining(), len(_history(s))
        with pytest.raises(dpsql.errors.ConfigError) as e:
            s.query(f"SELECT COUNT(*) {J}", epsilon=1.0, delta=1e-6, options={"degree_caps": caps})
        assert "the join caps no rows of 'orders' by" in str(e.value) and "orders.cid" in str(e.value)
        assert s.remaining() == before and len(_history(s)) == recorded


@pytest.mark.parametrize("caps", [{"orders.cid": 2}, {"ORDERS.CID": 2}, {"customer.id": 1}])
def test_degree_caps_on_a_capped_join_column_still_lowers_delta(caps: dict[str, int]) -> None:
    with _session() as s:
        r = s.query(f"SELECT COUNT(*) {J}", epsilon=1.0, delta=1e-6, options={"degree_caps": caps, "q": 1.0})
        assert r.details["Delta"] == (2 if "cid" in str(caps).lower() else 3)


@pytest.mark.parametrize("mechanism", ["dp_s4s", "r2t"])
def test_a_tau_base_near_one_is_refused_spelling_the_base_given(mechanism: str) -> None:
    with _session() as s:
        with pytest.raises(dpsql.errors.ConfigError) as e:
            s.query(f"SELECT COUNT(*) {J}", epsilon=1.0, delta=1e-6, options={"tau_base": 1.0000001, "mechanism": mechanism})
        assert "tau_base=1.0000001 makes about" in str(e.value)


def _dated_session() -> dpsql.Session:
    t = _tables()
    n = t["orders"].num_rows
    orders = t["orders"].append_column("od", pa.array([datetime.date(2020 + i % 3, 1 + i % 12, 1) for i in range(n)]))
    s = dpsql.Session(budget=Budget(1000.0, 0.5))
    use_noise(s, zero_noise(5))
    s.register("customer", t["customer"], privacy_unit="id")
    s.register("orders", orders, references={"cid": "customer.id"}, degree_bounds={"cid": 3},
               columns={"od": {"bounds": ["2020-01-01", "2022-12-31"], "bin_width": "1 day"}})
    return s


@pytest.mark.parametrize("key", ["extract(year FROM o.od)", "date_part('year', o.od)", "datepart('year', o.od)"])
def test_a_year_key_spelled_as_extract_or_date_part_is_released_as_year(key: str) -> None:
    with _dated_session() as s:
        want = s.query(f"SELECT year(o.od) AS y, COUNT(*) AS n {J} GROUP BY year(o.od) HAVING year(o.od) > 2020",
                       epsilon=1.0, delta=1e-6).to_pylist()
        assert [r["y"] for r in want] == [2021, 2022]
        for sql in (f"SELECT {key} AS y, COUNT(*) AS n {J} GROUP BY {key} HAVING {key} > 2020",
                    f"SELECT {key} AS y, COUNT(*) AS n {J} GROUP BY 1 HAVING year(o.od) > 2020",
                    f"SELECT year(o.od) AS y, COUNT(*) AS n {J} GROUP BY {key} HAVING {key} > 2020",
                    f"SELECT year(o.od) AS y, COUNT(*) AS n {J} WHERE {key} > 2020 GROUP BY year(o.od)",
                    f"SELECT {key} AS y, COUNT(*) AS n {J} WHERE {key} > 2020 GROUP BY 1"):
            assert s.query(sql, epsilon=1.0, delta=1e-6).to_pylist() == want, sql


def _paid_session() -> tuple[dpsql.Session, pa.Table]:
    """20 people, one event each: paid true, false, NULL, NULL, ... (SQL's AVG of its 0 / 1 is 0.5)."""
    ev = pa.table({"uid": list(range(20)), "cc": ["FR"] * 20,
                   "paid": pa.array([True, False, None, None] * 5, pa.bool_())})
    s = dpsql.Session(budget=Budget(1000.0, 0.5))
    use_noise(s, zero_noise(5))
    s.register("countries", pa.table({"code": ["FR"], "region": ["EU"]}), public=True,
               columns={"region": {"domain": ["EU"]}})
    s.register("events", ev, privacy_unit="uid", references={"cc": "countries.code"})
    return s, ev


@pytest.mark.parametrize("sql,options", [
    ("SELECT AVG(e.paid::INTEGER) AS a FROM events e JOIN countries k ON e.cc = k.code", None),
    ("SELECT AVG(CAST(e.paid AS DOUBLE)) AS a FROM events e JOIN countries k ON e.cc = k.code", None),
    ("SELECT AVG(e.paid::INTEGER) AS a FROM events e JOIN countries k ON e.cc = k.code", {"mechanism": "clipped_gaussian"}),
    ("SELECT k.region, AVG(e.paid::INTEGER) AS a FROM events e JOIN countries k ON e.cc = k.code GROUP BY k.region",
     {"mechanism": "clipped_gaussian"}),
    ("SELECT AVG(paid::INTEGER) AS a FROM events", None),  # one table: the reference
])
def test_avg_of_a_boolean_columns_cast_over_a_join_skips_its_nulls_as_sql_does(sql: str, options: Any) -> None:
    s, _ = _paid_session()
    with s:
        assert [r["a"] for r in s.query(sql, epsilon=1.0, delta=1e-6, options=options).to_pylist()] == [0.5]


def test_avg_of_a_cast_shares_its_count_with_count_of_the_column() -> None:
    s, _ = _paid_session()
    with s:
        r = s.query("SELECT AVG(e.paid::INTEGER) AS a, COUNT(e.paid) AS n FROM events e JOIN countries k "
                    "ON e.cc = k.code", epsilon=1.0, delta=1e-6, options={"mechanism": "clipped_gaussian"})
        assert r.to_pylist() == [{"a": 0.5, "n": 10}]
        assert len(r.details["aggregates"]) == 2  # SUM(CAST(paid)) and COUNT(paid), once each
