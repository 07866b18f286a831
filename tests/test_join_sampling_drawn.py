"""The drawn Poisson sample of join tuples (``dpsql.rewrite.joins._sampled`` with a row clock).

On a connection the engine opened itself, a sample that the bounded query reads once (the
single-owner closed form ``truncated_sums``; ``sampled_tuples`` with no looked-up slot) keeps each
tuple when its own ``RANDOM()`` draw is below floor(q 2^32) / 2^32, with no tuple identity; the
keyed SHA-256 of the identity stays for Spark, the portable hash, a caller's connection and a
sample read twice (a looked-up slot: its start values, then the join back).

The draws come from DuckDB's generator, seeded from OS entropy (not seedable here: that is the
point); the data are seeded. Each statistical check fails with probability <= 1e-6 (exact
binomial tests), and each has a negative control that must fail: a miscalibrated draw, one draw
per person instead of per tuple, the same keyed sample twice, a drawn sample read twice.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import binomtest
from sqlglot import exp

import dpsql
from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps
from dpsql.engine.portable import PortableDuckDBOps
from dpsql.engine.spark_ops import SparkOps
from dpsql.plan.analyze import analyze
from dpsql.plan.joins import bound_people
from dpsql.rewrite import joins
from dpsql.rewrite.joins import reads_sample_once, sampled_tuples, truncated_sums

ALPHA = 1e-6
COUNT = "SELECT COUNT(*) FROM events e JOIN users u ON e.user_id = u.user_id"
SUM = "SELECT SUM(e.amount) FROM events e JOIN users u ON e.user_id = u.user_id"


def make(n_users: int, per_user: int, seed: int, connection: Any = None) -> dpsql.Session:
    """``per_user`` events per user (identical join tuples for COUNT(*)), amounts 0 ... n-1
    (distinct weights for SUM: each tuple recognisable across queries)."""
    g = np.random.default_rng(seed)
    n = n_users * per_user
    uid = g.permutation(np.repeat(np.arange(n_users), per_user))
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), connection=connection)
    s.register("users", pa.table({"user_id": np.arange(n_users)}), privacy_unit="user_id")
    s.register("events", pa.table({"user_id": uid, "amount": np.arange(n, dtype=np.int64)}),
               references={"user_id": "users.user_id"}, degree_bounds={"user_id": per_user},
               columns={"amount": {"bounds": (0, 1 << 20)}})
    return s


def plan(s: dpsql.Session, sql: str) -> tuple[Any, Any]:
    jp = analyze(sql, dict(s.tables)).join
    assert jp is not None
    pb = bound_people(jp, dict(s.tables))
    assert pb.enforced and pb.owner is not None
    return jp, pb


def sums(s: dpsql.Session, taus: tuple[float, ...], q: float, ops: Any = None, salt: str = "salt") -> list[int]:
    jp, pb = plan(s, COUNT)
    ast = truncated_sums(jp, dict(s.tables), pb.owner, taus, salt=salt, q=q, ops=ops or s._engine.ops, caps=pb.caps)
    row = s._engine.fetch_arrow(ast).to_pylist()[0]
    return [int(row[f"__f0_{i}"]) for i in range(len(taus))]


def weights(s: dpsql.Session, q: float, ops: Any = None, salt: str = "salt") -> set[int]:
    jp, pb = plan(s, SUM)
    ast = sampled_tuples(jp, dict(s.tables), salt=salt, q=q, ops=ops or s._engine.ops, caps=pb.caps)
    return {r["__w0"] for r in s._engine.fetch_arrow(ast).to_pylist()}


def sql_of(s: dpsql.Session, q: float, ops: Any, sql: str = COUNT) -> str:
    jp, pb = plan(s, sql)
    return s._engine.render(truncated_sums(jp, dict(s.tables), pb.owner, (1.0,), salt="salt", q=q, ops=ops, caps=pb.caps))


# -- where the draw is used ----------------------------------------------------------------------------------


def test_only_the_engines_own_connection_draws_and_only_a_sample_read_once() -> None:
    s = make(50, 4, 1)
    caller = make(50, 4, 1, connection=duckdb.connect())
    try:
        assert type(s._engine.ops) is DuckDBOps and isinstance(caller._engine.ops, SaltedDuckDBOps)
        drawn = sql_of(s, 0.25, s._engine.ops)
        assert "RANDOM()" in drawn and "SHA256" not in drawn.upper() and "__tid" not in drawn
        assert "RANDOM()" not in sql_of(s, 1.0, s._engine.ops)  # q = 1 keeps all: no draw
        assert "RANDOM()" not in sql_of(s, 2.0**-40, s._engine.ops)  # below the draw's grid: keyed
        for ops in (SaltedDuckDBOps(), PortableDuckDBOps(), caller._engine.ops):
            keyed = sql_of(s, 0.25, ops)
            assert "RANDOM()" not in keyed and "SHA256" in keyed.upper() and "__tid" in keyed
        jp, pb = plan(s, COUNT)
        spark = truncated_sums(jp, dict(s.tables), pb.owner, (1.0,), salt="salt", q=0.25, ops=SparkOps(), caps=pb.caps)
        assert spark.find(exp.Rand) is None and "__tid" in spark.sql()
    finally:
        s.close()
        caller.close()


def lookup_session() -> dpsql.Session:
    """customer <- orders <- lineitem: lineitem reaches its person through a looked-up chain."""
    g = np.random.default_rng(3)
    n_orders = 3000
    o_cust = g.integers(0, 500, n_orders)
    l_ord = np.repeat(np.arange(n_orders), 4)
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("customer", pa.table({"c_custkey": np.arange(500)}), privacy_unit="c_custkey",
               allow_conditional_sampling=True)
    s.register("orders", pa.table({"o_orderkey": np.arange(n_orders), "o_custkey": o_cust}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 64},
               allow_conditional_sampling=True)
    s.register("lineitem", pa.table({"l_orderkey": l_ord}), references={"l_orderkey": "orders.o_orderkey"},
               degree_bounds={"l_orderkey": 4}, allow_conditional_sampling=True)
    return s


def inline_sample(ast: exp.Expression) -> exp.Expression:
    """``ast`` with every read of the CTE ``__s`` replaced by its own copy of the CTE's query: two
    reads that the engine must evaluate separately (whatever it does with CTEs)."""
    ast = ast.copy()
    cte = next(c for c in ast.find_all(exp.CTE) if c.alias == "__s")
    body = cte.this
    ast.set("with_", None)
    for t in list(ast.find_all(exp.Table)):
        if t.name == "__s":
            t.replace(body.copy().subquery(t.alias_or_name))
    return ast


def lookup_users(s: dpsql.Session, *, forced: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The looked-up user lists of the sampled tuples of ``SELECT COUNT(*) FROM lineitem`` at q = 1/2,
    the sample's two reads evaluated separately; ``forced``: draw even though the sample is read twice."""
    jp = analyze("SELECT COUNT(*) FROM lineitem", dict(s.tables)).join
    assert jp is not None and not reads_sample_once(jp, dict(s.tables))
    with monkeypatch.context() as m:
        if forced:
            m.setattr(joins, "reads_sample_once", lambda jp, catalog: True)
        ast = sampled_tuples(jp, dict(s.tables), salt="salt", q=0.5, ops=s._engine.ops)
    assert (ast.find(exp.Rand) is not None) == forced
    two = inline_sample(ast)
    assert not [t for t in two.find_all(exp.Table) if t.name == "__s"]
    return [r["__u0"] for r in s._engine.fetch_arrow(two).to_pylist()]


def test_a_sample_read_twice_stays_keyed_and_its_two_reads_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The looked-up chain reads the sample for its start values, then joins the tuples back: with
    the keyed sample both reads see the same tuples, so every sampled tuple finds its person (each
    line item's order has a customer), even when the engine evaluates the two reads separately."""
    s = lookup_session()
    try:
        users = lookup_users(s, forced=False, monkeypatch=monkeypatch)
        assert 5000 < len(users) < 7000 and all(u for u in users)
        # negative control: a per-row draw evaluated by each read samples twice; a tuple whose order
        # the other read did not sample reaches nobody (it would then count in full, untruncated).
        # Each of the 3000 orders does that with probability 1/16 * 15/16: P(none) < e^-170
        users = lookup_users(s, forced=True, monkeypatch=monkeypatch)
        assert sum(1 for u in users if not u) > 0
    finally:
        s.close()


def test_the_drawn_forms_read_the_sample_once() -> None:
    """One RANDOM() per drawn form, in a relation read once: the closed form aggregates its sample
    subquery once; ``sampled_tuples`` without a looked-up slot reads its CTE ``__s`` once."""
    s = make(50, 4, 1)
    try:
        jp, pb = plan(s, COUNT)
        assert reads_sample_once(jp, dict(s.tables))
        closed = truncated_sums(jp, dict(s.tables), pb.owner, (1.0,), salt="salt", q=0.25, ops=s._engine.ops, caps=pb.caps)
        tuples = sampled_tuples(jp, dict(s.tables), salt="salt", q=0.25, ops=s._engine.ops, caps=pb.caps)
        for ast in (closed, tuples):
            assert len(list(ast.find_all(exp.Rand))) == 1
            assert s._engine.render(ast).count("RANDOM()") == 1
        assert not list(closed.find_all(exp.CTE))
        assert len([t for t in tuples.find_all(exp.Table) if t.name == "__s"]) == 1
    finally:
        s.close()


# -- the draws --------------------------------------------------------------------------------------------------


def test_inclusion_frequency_is_q(monkeypatch: pytest.MonkeyPatch) -> None:
    """60 000 tuples (6 000 users x 10 identical tuples), q = 0.3 (not on a binary grid): the total
    sampled weight f(tau >= 10) is Binomial(60 000, q') with q - 2^-32 <= q' <= q; exact binomial test.
    Negative control: a draw 5% too small (rate q / 0.95) fails."""
    s = make(6000, 10, 11)
    try:
        n, q = 60_000, 0.3
        (k,) = sums(s, (10.0,), q)
        assert binomtest(k, n, q).pvalue >= ALPHA
        ks = [sums(s, (10.0,), q)[0] for _ in range(3)]  # fresh draws each query
        assert binomtest(sum(ks), 3 * n, q).pvalue >= ALPHA
        monkeypatch.setattr(joins, "_sample_clock", lambda ops, q: exp.Mul(this=exp.Rand(), expression=exp.Literal.number(0.95)))
        (bad,) = sums(s, (10.0,), q)
        assert binomtest(bad, n, q).pvalue < ALPHA
    finally:
        s.close()


def test_tuples_of_one_person_are_sampled_independently(monkeypatch: pytest.MonkeyPatch) -> None:
    """20 000 users with 8 identical tuples each, q = 1/4: f(tau = 1) counts the users with at least
    one sampled tuple, so the users with none are Binomial(20 000, (3/4)^8) when every tuple draws on
    its own. Negative control: one draw per person (all or none of a person's tuples) fails."""
    s = make(20_000, 8, 12)
    try:
        n_users, q = 20_000, 0.25
        at_least_one, total = sums(s, (1.0, 8.0), q)
        assert binomtest(n_users - at_least_one, n_users, (1 - q) ** 8).pvalue >= ALPHA
        assert binomtest(total, 8 * n_users, q).pvalue >= ALPHA
        monkeypatch.setattr(joins, "_sample_clock", lambda ops, q: DuckDBOps().keyed_uniform(["__owner"], "per person"))
        at_least_one, _ = sums(s, (1.0, 8.0), q)
        assert binomtest(n_users - at_least_one, n_users, (1 - q) ** 8).pvalue < ALPHA
    finally:
        s.close()


def test_samples_are_independent_across_queries() -> None:
    """50 000 tuples with distinct weights (each recognisable), q = 1/2, sampled by two queries: the
    tuples both keep are Binomial(50 000, 1/4) when the queries draw independently. Negative control:
    the keyed sample with one salt twice keeps the same tuples both times."""
    s = make(5000, 10, 13)
    try:
        n = 50_000
        a, b = weights(s, 0.5), weights(s, 0.5)
        assert binomtest(len(a), n, 0.5).pvalue >= ALPHA and binomtest(len(b), n, 0.5).pvalue >= ALPHA
        assert binomtest(len(a & b), n, 0.25).pvalue >= ALPHA
        ka, kb = weights(s, 0.5, SaltedDuckDBOps()), weights(s, 0.5, SaltedDuckDBOps())
        assert ka == kb and binomtest(len(ka & kb), n, 0.25).pvalue < ALPHA
    finally:
        s.close()


def test_session_query_runs_the_drawn_sample_end_to_end() -> None:
    s = make(200, 8, 14)
    try:
        plan_ = s.explain(COUNT, epsilon=1.0, options={"q": 0.25})
        assert "RANDOM()" in plan_.bounded_sql and "__tid" not in plan_.bounded_sql
        r = s.query(COUNT, epsilon=1.0, options={"q": 0.25})
        assert r.mechanism == "dp_s4s" and r.table.num_rows == 1
    finally:
        s.close()
