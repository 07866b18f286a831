"""Long public key domains: their literals enter the bounded query as one node rendered once
(``dpsql.rewrite.bound.domain_literals``), which must mean exactly what one literal per value means."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from sqlglot import exp

import dpsql
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.errors import UnsupportedQueryError
from dpsql.rewrite import bound
from dpsql.rewrite.render import render
from dpsql.testing import use_noise, zero_noise

KEYS = [f"k{i}" for i in range(300)] + ["o'brien", "ü", ""]
DAYS = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(200)]


def _table() -> pa.Table:
    gen = np.random.default_rng(7)
    n = 3000
    keys = np.array([*KEYS, "not-declared"])[gen.integers(0, len(KEYS) + 1, n)]
    days = [dt.date(2023, 12, 20) + dt.timedelta(days=int(d)) for d in gen.integers(0, 230, n)]
    return pa.table({"u": gen.integers(0, 400, n), "k": keys, "d": pa.array(days, pa.date32()),
                     "v": gen.integers(0, 10, n)})


QUERIES = [
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k",            # the domain on the (unit, group) pairs
    "SELECT d, COUNT(*) AS n FROM t GROUP BY d",            # DATE literals
    "SELECT k, d, COUNT(*) AS n FROM t GROUP BY k, d",      # two declared keys
    "SELECT k, MEDIAN(v) AS m FROM t GROUP BY k",           # the domain on the rows (quantiles)
]


def _answers(monkeypatch: pytest.MonkeyPatch, inline_max: int) -> list[list[dict[str, object]]]:
    monkeypatch.setattr(bound, "LISTED_INLINE_MAX", inline_max)
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(1e6, 0.5))
    use_noise(s, zero_noise())
    s.register("t", _table(), privacy_unit="u", max_groups_per_unit=float("inf"), max_rows_per_group=50,
               columns={"k": {"domain": KEYS}, "d": {"domain": [d.isoformat() for d in DAYS]}, "v": {"bounds": (0, 10)}})
    out = []
    for q in QUERIES:
        out.append(sorted(s.query(q, epsilon=1.0, delta=1e-3).table.to_pylist(), key=repr))
    s.close()
    return out


def test_a_long_domain_as_one_node_answers_what_one_literal_per_value_answers(monkeypatch):
    listed = _answers(monkeypatch, 10**9)
    one_node = _answers(monkeypatch, 8)
    assert one_node == listed
    counts = {r["k"]: r["n"] for r in listed[0]}
    assert set(counts) == set(KEYS) and counts["o'brien"] > 0 and counts[""] > 0  # every declared key, no other
    assert {r["d"] for r in listed[1]} == set(DAYS)


def test_the_node_holds_the_rendered_literals_and_is_refused_for_another_dialect():
    vals = tuple(KEYS)
    node = bound.domain_literals(vals, "VARCHAR", DuckDBOps())
    assert len(node) == 1
    cond = exp.In(this=exp.column("k"), expressions=node)
    one_each = exp.In(this=exp.column("k"), expressions=[bound.domain_literal(v, "VARCHAR") for v in vals])
    assert render(cond) == render(one_each)
    with pytest.raises(UnsupportedQueryError):
        render(cond, dialect="spark")
    assert len(bound.domain_literals(vals[:3], "VARCHAR", DuckDBOps())) == 3  # a short domain: a literal per value
