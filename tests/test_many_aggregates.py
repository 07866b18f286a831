"""A query with many aggregates is analysed in work linear in its size, and a query above the limits is
refused before any analysis, for free.

Each new aggregate was compared with every earlier one by rendering the earlier one's value again (a
copy and a rendering of its tree each time): quadratic, 17 s of CPU for 400 aggregates. A position for
a message scanned every token of the query once per aggregate: quadratic too. Work is counted here
(calls of the hot function, and all Python calls of an ``explain`` under ``cProfile``), never timed.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from typing import Any

import pytest
from sqlglot import exp
from test_joins import make_session

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.plan import analyze as analyze_mod
from dpsql.plan.analyze import MAX_AGGREGATES, MAX_OUTPUT_COLUMNS, analyze


@pytest.fixture()
def session(events: Any) -> Any:
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    s.register("events", events, privacy_unit="user_id", max_groups_per_unit=2,
               columns={"amount": {"bounds": (0, 100)}, "age": {"bounds": (0, 120)},
                        "country": {"domain": ["US", "FR", "DE"]}})
    yield s
    s.close()


def case_sums(n: int, tag: str = "") -> str:
    """n distinct aggregates (each its own released value)."""
    return ", ".join(f"SUM(CASE WHEN age > {i} THEN 1 ELSE 0 END) AS w{tag}{i}" for i in range(n))


FLAT = "SELECT {aggs} FROM events"
VIEW = "WITH v AS (SELECT * FROM events) SELECT {aggs} FROM v"
GROUPED = "SELECT country, {aggs} FROM events GROUP BY country"


def calls(run: Callable[[], object]) -> int:
    """All Python function calls made by ``run()`` (a count of work, the same on every machine)."""
    pr = cProfile.Profile()
    pr.enable()
    try:
        run()
    finally:
        pr.disable()
    return int(pstats.Stats(pr).total_calls)  # type: ignore[attr-defined]


def test_each_aggregate_is_rendered_a_bounded_number_of_times(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = [0]
    real = analyze_mod._norm

    def counting(node: Any) -> str:
        seen[0] += 1
        return real(node)

    monkeypatch.setattr(analyze_mod, "_norm", counting)
    counts = {}
    for n in (50, 100):
        seen[0] = 0
        plan = analyze(FLAT.format(aggs=case_sums(n)), dict(session.tables))
        assert len(plan.aggregates) == n
        counts[n] = seen[0]
    assert counts[100] <= 2 * counts[50] + 4, counts  # linear (it was about n * n / 2)
    assert counts[100] <= 4 * 100, counts


@pytest.mark.parametrize("shape", [FLAT, VIEW, GROUPED], ids=["flat", "view", "group_by"])
def test_explain_work_is_linear_in_the_number_of_aggregates(session: Any, shape: str) -> None:
    session.explain(shape.format(aggs=case_sums(3, "x")), epsilon=1.0, delta=1e-6)  # caches warmed
    work = {n: calls(lambda n=n: session.explain(shape.format(aggs=case_sums(n)), epsilon=1.0, delta=1e-6))
            for n in (60, 120)}
    assert work[120] <= 2.1 * work[60], work  # quadratic work gave about 3


def test_join_explain_work_is_linear_in_the_number_of_aggregates() -> None:
    s = make_session()
    try:
        def sql(n: int) -> str:
            aggs = ", ".join(f"SUM(LEAST(GREATEST(l.l_price, 0), {i + 1})) AS w{i}" for i in range(n))
            return f"SELECT {aggs} FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey"

        s.explain(sql(2), epsilon=1.0, delta=1e-6)
        work = {n: calls(lambda n=n: s.explain(sql(n), epsilon=1.0, delta=1e-6)) for n in (4, 8)}
        assert work[8] <= 2.1 * work[4], work
    finally:
        s.close()


def test_positions_of_many_calls_do_not_rescan_the_query(monkeypatch: pytest.MonkeyPatch) -> None:
    """A position (line, column) for each of n calls looks its token up (a search), not through all tokens."""
    from dpsql.plan import parse

    sql = FLAT.format(aggs=", ".join(f"RAND() AS r{i}" for i in range(400)))
    stmt = parse.parse_statements(sql)[0]
    nodes = [it.this for it in stmt.expressions]
    scanned = [0]
    real = parse.tokens

    class Counted(tuple):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            for t in super().__iter__():
                scanned[0] += 1
                yield t

    monkeypatch.setattr(parse, "tokens", lambda s: Counted(real(s)))
    got = [parse.position(n, sql) for n in nodes]
    assert got[0] == (1, 8) and got[-1][1] == sql.rindex("RAND()") + 1
    assert scanned[0] <= 20 * len(nodes), scanned[0]  # a full scan each: 400 x 2 000 tokens


# -- limits ----------------------------------------------------------------------------------------


def refused_free(session: Any, sql: str, match: str, monkeypatch: pytest.MonkeyPatch) -> UnsupportedQueryError:
    """Refused before any aggregate is analysed, and nothing charged."""
    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("analysed an aggregate of a query above the limit")

    monkeypatch.setattr(analyze_mod._Builder, "aggregate_ref", never)
    monkeypatch.setattr(analyze_mod, "merge_views", never)
    before = session.remaining()
    for run in (session.explain, session.query):
        with pytest.raises(UnsupportedQueryError, match=match) as e:
            run(sql, epsilon=1.0, delta=1e-6)
    assert session.remaining() == before and session.history().num_rows == 0
    monkeypatch.undo()
    return e.value


def test_a_query_at_the_aggregate_limit_is_answered(session: Any) -> None:
    sql = FLAT.format(aggs=", ".join(f"SUM(amount) AS s{i}" for i in range(MAX_AGGREGATES)))
    assert session.query(sql, epsilon=1.0, delta=1e-6).table.num_columns == MAX_AGGREGATES


@pytest.mark.parametrize("shape", [FLAT, VIEW, GROUPED], ids=["flat", "view", "group_by"])
def test_one_aggregate_above_the_limit_is_refused_for_free(session: Any, shape: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    aggs = ", ".join(f"SUM(amount) AS s{i}" for i in range(MAX_AGGREGATES + 1))
    e = refused_free(session, shape.format(aggs=aggs), f"at most {MAX_AGGREGATES} aggregate calls", monkeypatch)
    assert f"has {MAX_AGGREGATES + 1} aggregate calls" in str(e)
    assert e.hint is not None and "several queries" in e.hint


def test_aggregates_in_one_output_column_count_too(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sql = "SELECT GREATEST(" + ", ".join(["SUM(amount)"] * (MAX_AGGREGATES + 1)) + ") AS g FROM events"
    refused_free(session, sql, f"at most {MAX_AGGREGATES} aggregate calls", monkeypatch)


def test_output_columns_above_the_limit_are_refused_for_free(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    at = "SELECT " + ", ".join(f"country AS k{i}" for i in range(MAX_OUTPUT_COLUMNS - 1)) + ", COUNT(*) AS n"
    assert session.explain(at + " FROM events GROUP BY country", epsilon=1.0, delta=1e-6).cost is not None
    above = at + ", country AS extra FROM events GROUP BY country"
    e = refused_free(session, above, f"at most {MAX_OUTPUT_COLUMNS} output columns", monkeypatch)
    assert f"has {MAX_OUTPUT_COLUMNS + 1} output columns" in str(e)


def test_a_join_above_the_limit_is_refused_for_free(monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_session()
    try:
        aggs = ", ".join(f"SUM(l.l_price) AS s{i}" for i in range(MAX_AGGREGATES + 1))
        refused_free(s, f"SELECT {aggs} FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey",
                     f"at most {MAX_AGGREGATES} aggregate calls", monkeypatch)
    finally:
        s.close()


def test_join_base_aggregates_above_their_limit_are_refused_for_free(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.plan.joins import MAX_JOIN_AGGREGATES

    s = make_session()
    try:
        def sql(n: int) -> str:
            aggs = ", ".join(f"SUM(LEAST(GREATEST(l.l_price, 0), {i + 1})) AS w{i}" for i in range(n))
            return f"SELECT {aggs}, COUNT(*) AS n FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey"

        p = analyze(sql(MAX_JOIN_AGGREGATES - 1), dict(s.tables))  # at the limit: planned
        assert p.join is not None and len(p.join.aggregates) == MAX_JOIN_AGGREGATES
        from dpsql.mechanisms import join_multi

        def never(*_: Any, **__: Any) -> Any:
            raise AssertionError("calibrated a query above the limit")

        monkeypatch.setattr(join_multi, "shares", never)
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match=f"has {MAX_JOIN_AGGREGATES + 1} distinct base aggregates; "
                                                        f"at most {MAX_JOIN_AGGREGATES}"):
            s.explain(sql(MAX_JOIN_AGGREGATES), epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0
    finally:
        s.close()


def test_join_bases_are_rendered_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new base aggregate over a join is looked up by key: no rendering of every earlier base again."""
    s = make_session()
    try:
        renders = [0]
        real = exp.Expression.sql

        def counting(self: exp.Expression, *a: Any, **k: Any) -> str:
            renders[0] += 1
            return real(self, *a, **k)

        monkeypatch.setattr(exp.Expression, "sql", counting)
        work = {}
        for n in (20, 40):
            renders[0] = 0
            aggs = ", ".join(f"SUM(LEAST(GREATEST(l.l_price, 0), {i + 1})) AS w{i}" for i in range(n))
            analyze(f"SELECT {aggs} FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey", dict(s.tables))
            work[n] = renders[0]
        assert work[40] <= 2.1 * work[20], work
    finally:
        s.close()
