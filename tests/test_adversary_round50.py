"""Joins: self-joins, three-way joins, looked-up chains, comma joins, casts and NULL-safe equalities in ON,
aggregates with FILTER / DISTINCT / CASE, and GROUP BY keys from the public or the private side.

Finding (fixed, wording): over a join, ``SUM(DISTINCT ...)`` and ``AVG(DISTINCT ...)`` were refused with "SUM over
an expression needs literal bounds: write SUM(LEAST(GREATEST(expr, lo), hi))", whose fix is no fix: the same call
with that clamp (``SUM(DISTINCT LEAST(GREATEST(o.amt, 0), 3))``) got the same message. The refusal now names
DISTINCT, as on one table ("distinct values are not bounded per person; drop DISTINCT"), over every join, lookup
joins included; nothing is spent.
"""

from __future__ import annotations

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
