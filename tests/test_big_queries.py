"""Very large query texts are refused (or answered) without rendering huge expressions for messages.

A refusal quoted its fragment by rendering the offending expression with sqlglot, which copies the whole
tree: a 10 000-term AND chain spent seconds per message. Expressions of more than ``BIG_NODE`` nodes are
quoted from the query's own text instead. The typer parsed the type name of every typed literal (27 000
parses for a 9 000-element IN list); each type name is parsed once now.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from sqlglot import exp

import dpsql
from dpsql.plan.parse import BIG_NODE, is_big
from dpsql.plan.typer import _type_node


@pytest.fixture()
def session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5))
    s.register("t", pa.table({"uid": np.arange(50), "x": np.arange(50.0)}), privacy_unit="uid", max_rows_per_unit=1,
               columns={"x": {"bounds": [0, 100]}})
    yield s
    s.close()


def test_a_huge_expression_is_quoted_from_the_query_text(session: dpsql.Session) -> None:
    sql = "SELECT COUNT(*) FROM t WHERE " + " AND ".join(["x > 1"] * 3000)
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="nested more than 64 levels") as e:
        session.explain(sql, epsilon=1.0, delta=1e-6)
    v = e.value.violations[0]
    assert (v.line, v.col) == (1, 30)
    assert v.fragment.endswith("...") and len(v.fragment) == 80
    assert ("x > 1 AND " * 10).startswith(v.fragment[:-3])
    assert session.history().num_rows == 0


def test_small_expressions_are_still_rendered(session: dpsql.Session) -> None:
    with pytest.raises(dpsql.errors.UnsupportedQueryError) as e:
        session.explain("SELECT COUNT(*) FROM t WHERE RAND() > 0.5", epsilon=1.0, delta=1e-6)
    assert e.value.violations[0].fragment.startswith("RAND(")


def test_is_big_stops_at_the_bound() -> None:
    small = exp.and_(*[exp.column("x")] * (BIG_NODE // 4))
    big = exp.and_(*[exp.column("x")] * (BIG_NODE + 1))
    assert not is_big(small) and is_big(big)


def test_a_9000_element_in_list_is_answered(session: dpsql.Session) -> None:
    sql = "SELECT COUNT(*) AS c FROM t WHERE x IN (" + ", ".join(str(i) for i in range(9000)) + ")"
    assert session.query(sql, epsilon=1.0, delta=1e-6).table.num_rows == 1


def test_type_nodes_are_fresh_and_equal_to_a_parse() -> None:
    for name in ("DOUBLE", "DECIMAL(18,3)", "TIMESTAMP", "VARCHAR", "HUGEINT", "INTEGER[]", "DATE"):
        a, b = _type_node(name), _type_node(name)
        assert a == exp.DataType.build(name, dialect="duckdb") and a is not b
        exp.Cast(this=exp.column("x"), to=a)
        assert b.parent is None  # a node handed out once is never shared


def test_a_refused_call_is_rendered_once_for_its_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendering a node copies its tree (the main cost of an analysis that refuses): a refused call's
    position, fragment and spelling as written share one rendering (it was rendered six times)."""
    from dpsql.plan.checks import check_expression_functions
    from dpsql.plan.parse import parse_statements

    sql = "SELECT COUNT(*) FROM t WHERE stats(x) IS NULL AND\n  rand() > 0.5"
    where = parse_statements(sql)[0].args["where"].this
    refused = [where.find(exp.Anonymous), where.find(exp.Rand)]
    renders: dict[int, int] = {}
    real = exp.Expression.sql

    def counting(self: exp.Expression, *a: object, **k: object) -> str:
        renders[id(self)] = renders.get(id(self), 0) + 1
        return real(self, *a, **k)

    monkeypatch.setattr(exp.Expression, "sql", counting)
    got = check_expression_functions(where, sql, "WHERE")
    assert [renders.get(id(n)) for n in refused] == [1, 1]
    assert [(v.line, v.col, v.fragment) for v in got] == [(1, 30, "stats(x)"), (2, 3, "rand()")]
    assert "function stats()" in got[0].message and "function rand()" in got[1].message


def test_a_long_in_list_of_float_constants_types_few_nodes_per_element() -> None:
    """Work, counted: each element of a digested IN list (``MD5(salt || text)``) was made canonical by a
    CASE (NaN, -0.0) even when it was a plain constant: 25 nodes per element, typed, rendered and parsed by
    the engine (a 9 000-element list took 47 s). A constant that is neither NaN nor zero is its own
    canonical form: 9 nodes. Zero and NaN constants keep the CASE (negative control), and so does the column."""
    import sqlglot

    from dpsql.plan.typer import type_predicate

    def nodes(values: list[str]) -> tuple[int, int]:
        cond = sqlglot.parse_one(f"x IN ({', '.join(values)})", read="duckdb")
        typed = type_predicate(cond, {"x": "DOUBLE"})
        return sum(1 for _ in typed.walk()), sum(1 for _ in typed.find_all(exp.Case))

    plain = [str(i + 0.5) for i in range(1, 201)] + ["1e-30", "-3e300"]
    total, cases = nodes(plain)
    assert cases == 1  # the column's only
    assert total <= 10 * len(plain) + 40
    for special in ("0", "-0.0", "'nan'::DOUBLE", "1e-31", "'inf'::DOUBLE"):
        assert nodes([*plain, special])[1] == 2, special
