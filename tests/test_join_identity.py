"""Join tuple identities (``dpsql.rewrite.joins``): a function of the join's content, distinct per
tuple, so the Poisson sample is independent of row order (what a re-executed Spark task or
another engine would see) and still an independent Bernoulli(q) draw per tuple, duplicates too.

Negative controls: a global ``ROW_NUMBER() OVER ()`` identity (the earlier design) samples other
tuples when the rows come in another order; an identity without the duplicate number keeps all
or none of a group of identical tuples.

These identities key the sample where it must be reproducible from the salt (Spark, the portable
hash, a caller's connection): the samples below are drawn with ``SaltedDuckDBOps``. On a
connection the engine opened itself, a sample read once is a per-tuple ``RANDOM()`` draw instead
(``tests/test_join_sampling_drawn.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from sqlglot import exp

import dpsql
from dpsql.engine.duckdb_ops import SaltedDuckDBOps
from dpsql.plan.analyze import analyze
from dpsql.plan.joins import bound_people
from dpsql.rewrite import joins
from dpsql.rewrite.joins import sampled_tuples

PATH2 = "SELECT COUNT(*) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src"


def session(edges: pa.Table) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("node", pa.table({"id": np.arange(100)}), privacy_unit="id", allow_conditional_sampling=True)
    s.register("edge", edges, references={"src": "node.id", "dst": "node.id"}, degree_bounds={"src": 16, "dst": 16},
               allow_conditional_sampling=True)
    return s


def sample(s: dpsql.Session, salt: str, q: float) -> list[Any]:
    jp = analyze(PATH2, dict(s.tables)).join
    assert jp is not None and not bound_people(jp, dict(s.tables)).enforced
    rows = s._engine.fetch_arrow(sampled_tuples(jp, dict(s.tables), salt=salt, q=q, ops=SaltedDuckDBOps())).to_pylist()
    return sorted(tuple(sorted(r.items())) for r in rows)


def edges(seed: int, order: np.ndarray | None = None) -> pa.Table:
    g = np.random.default_rng(seed)
    src, dst = g.integers(0, 100, 3000), g.integers(0, 100, 3000)
    if order is not None:
        src, dst = src[order], dst[order]
    return pa.table({"src": src, "dst": dst})


def _global_row_number(q: exp.Select, **_: Any) -> exp.Select:
    return q.select(exp.alias_(exp.cast(exp.Window(this=exp.RowNumber()), "VARCHAR"), "__tid"))


def test_the_sample_does_not_depend_on_row_order(monkeypatch: pytest.MonkeyPatch) -> None:
    perm = np.random.default_rng(5).permutation(3000)
    results = []
    for order in (None, perm):
        s = session(edges(1, order))
        try:
            results.append(sample(s, "a salt", 0.5))
        finally:
            s.close()
    assert results[0] == results[1]
    assert 0 < len(results[0]) < len(_all(edges(1)))
    # negative control: numbering the join's rows in whatever order they come
    monkeypatch.setattr(joins, "_with_tid", _global_row_number)
    other = []
    for order in (None, perm):
        s = session(edges(1, order))
        try:
            other.append(sample(s, "a salt", 0.5))
        finally:
            s.close()
    assert other[0] != other[1]


def _all(t: pa.Table) -> list[Any]:
    s = session(t)
    try:
        return sample(s, "x", 1.0)
    finally:
        s.close()


def _dup_pairs(with_number: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    # 2000 copies of the edge (1, 2) and one (2, 3): 2000 identical path tuples (1, 2, 2, 3)
    t = pa.table({"src": [1] * 2000 + [2], "dst": [2] * 2000 + [3]})
    if not with_number:
        def no_number(q: exp.Select, **kw: Any) -> exp.Select:
            out = joins.__dict__["_with_tid_orig"](q, **kw)
            tid = out.expressions[-1]
            tid.set("this", tid.this.this.this)  # drop "|| '#' || number"
            return out
        monkeypatch.setitem(joins.__dict__, "_with_tid_orig", joins._with_tid)
        monkeypatch.setattr(joins, "_with_tid", no_number)
    s = session(t)
    try:
        return len(sample(s, "dup salt", 0.5))
    finally:
        s.close()


def test_identical_tuples_are_sampled_independently(monkeypatch: pytest.MonkeyPatch) -> None:
    # Binomial(2000, 1/2): mean 1000, sd 22.36; |kept - 1000| > 110 (4.92 sd) has probability < 1e-6
    kept = _dup_pairs(True, monkeypatch)
    assert 890 <= kept <= 1110
    # negative control: without the number among equal content, the copies share one draw
    assert _dup_pairs(False, monkeypatch) in (0, 2000)


def test_identities_are_distinct_and_injective_text() -> None:
    # text user columns whose naive ':'-joined text would coincide: 'a:b' + 'c' vs 'a' + 'b:c'
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    try:
        s.register("person", pa.table({"pid": ["a:b", "a", "c", "b:c"]}), privacy_unit="pid")
        s.register("pair", pa.table({"x": ["a:b", "a", "a", "a"], "y": ["c", "b:c", "b:c", "c"]}),
                   references={"x": "person.pid", "y": "person.pid"}, degree_bounds={"x": 4, "y": 4})
        jp = analyze("SELECT COUNT(*) FROM pair", dict(s.tables)).join
        assert jp is not None
        rel = joins.join_relation(jp, dict(s.tables), salt="s", ops=s._engine.ops, caps=(), parts=joins.parts_of(jp),
                                  extra=[exp.column(f"{jp.slots[0].alias}__x"), exp.column(f"{jp.slots[0].alias}__y")])
        tids = s._engine.fetch_arrow(exp.select("__tid").from_(rel.subquery("r"))).column("__tid").to_pylist()
        assert len(set(tids)) == 4
        assert sorted(t.rsplit("#", 1)[1] for t in tids) == ["1", "1", "1", "2"]  # one pair of equal content
    finally:
        s.close()
