"""More SQL over lookup joins, answered as SQL answers it (zero noise, caps that bind nobody: plain DuckDB's answer).

- A LEFT JOIN's ON holding, beside the declared-key equality, conditions on the lookup's or the private table's
  columns: they decide which private rows match a lookup row, never drop one (the unmatched keep NULL lookup columns),
  as SQL's ``LEFT JOIN (SELECT * FROM countries WHERE ...)``. The released key set stays the declared domain plus NULL.
- Aggregate FILTER clauses and COUNT(expr) over a lookup join: answered on the one-table path over the joined rows.
- ``query_many`` over a join: refused for free, saying DAWA workloads are answered on one table only."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest
from test_lookup_left_join import REGIONS, _duckdb, _events, _session, _with_person

import dpsql
from dpsql.budget import Budget
from dpsql.errors import DPSQLError
from dpsql.testing import use_noise, zero_noise

BUDGET = Budget(100.0, 1e-2)
ONS = ["c.region = 'EU'", "c.region IS NULL", "c.name <> 'Japan' AND c.region IN ('AS', 'AM')", "e.amt > 5",
       "(c.region = 'EU' OR e.amt > 5)", "c.region = 'EU' AND e.amt < 5", "COALESCE(c.region, 'none') = 'none'",
       "(c.region = 'EU' OR c.name = 'Japan')"]


@pytest.fixture(scope="module")
def joined() -> Any:
    """One session of the lookup join's tables for the two tests below (80 queries of epsilon 1 in its budget of 100;
    its tables never change); each test starts its noise afresh, so its query draws the salts a new session's would."""
    with _session() as s:
        yield s


@pytest.mark.parametrize("on", ONS)
@pytest.mark.parametrize("agg", ["COUNT(*)", "COUNT(c.name)", "SUM(e.amt)", "COUNT(DISTINCT c.name)"])
@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_left_join_on_conditions_match_sql(joined: dpsql.Session, on: str, agg: str, delta: float) -> None:
    sql = f"SELECT {agg} AS n FROM events e LEFT JOIN countries c ON e.cc = c.code AND {on}"
    use_noise(joined, zero_noise())
    got = joined.query(sql, epsilon=1.0, delta=delta).to_pylist()
    assert got == _duckdb(sql)
    # negative control: the ON's conditions change the answer (they are applied, not dropped)
    if agg == "COUNT(c.name)":
        assert got != _duckdb(f"SELECT {agg} AS n FROM events e LEFT JOIN countries c ON e.cc = c.code")


@pytest.mark.parametrize("on", ONS)
@pytest.mark.parametrize("where", ["", "WHERE e.amt > 3 OR c.region IS NULL"])
def test_left_join_on_conditions_group_by_a_declared_lookup_column(joined: dpsql.Session, on: str, where: str) -> None:
    sql = (f"SELECT c.region AS k, COUNT(*) AS n, SUM(e.amt) AS s FROM events e LEFT JOIN countries c "
           f"ON e.cc = c.code AND {on} {where} GROUP BY c.region")
    use_noise(joined, zero_noise())
    got = {r["k"]: (r["n"], r["s"]) for r in joined.query(sql, epsilon=1.0, delta=0.0).to_pylist()}
    want = {r["k"]: (r["n"], r["s"]) for r in _duckdb(sql)}
    # the released key set: the declared domain plus NULL, whatever the data and the ON (absent in SQL: zero)
    assert set(got) == {*REGIONS, None}
    assert got == {k: want.get(k, (0, 0.0)) for k in got}


def test_left_join_on_condition_keeps_every_private_row() -> None:
    """Unlike the same condition in WHERE, an ON condition never drops a private row."""
    on = "SELECT COUNT(*) AS n FROM events e LEFT JOIN countries c ON e.cc = c.code AND c.region = 'EU'"
    where = "SELECT COUNT(*) AS n FROM events e LEFT JOIN countries c ON e.cc = c.code WHERE c.region = 'EU'"
    with _session() as s:
        (a,) = s.query(on, epsilon=1.0, delta=0.0).to_pylist()
        (b,) = s.query(where, epsilon=1.0, delta=0.0).to_pylist()
    assert a == {"n": 450} and b["n"] < 450


def test_left_join_on_conditions_one_person_moves_the_release_by_the_sensitivity() -> None:
    """One person added with 40 events over every code: the key set (domain plus NULL) and explain are the same, at
    most C_u = 2 groups move, each by at most k = 2 (the caps read the joined rows' keys, the ON's NULLs included)."""
    sql = ("SELECT c.region AS k, COUNT(*) AS n FROM events e LEFT JOIN countries c ON e.cc = c.code "
           "AND (c.region = 'EU' OR e.amt > 5) GROUP BY c.region")

    def release(events: pa.Table) -> tuple[dict[Any, float], tuple[Any, ...]]:
        with _session(events) as s:
            e = s.explain(sql, epsilon=5.0)
            rows = {r["k"]: r["n"] for r in s.query(sql, epsilon=5.0).to_pylist()}
        bounded = re.sub(r"_dpsql_src_(\w+)_[0-9a-f]{8}", r"\1", e.bounded_sql)  # the session's own source names
        return rows, (e.mechanism, e.reason, bounded, repr(sorted(e.parameters.items())))

    (before, e0), (after, e1) = release(_events()), release(_with_person(40))
    assert e0 == e1 and set(before) == set(after) == {*REGIONS, None}
    diffs = [after[k] - before[k] for k in before]
    assert all(0 <= d <= 2 for d in diffs) and sum(d > 0 for d in diffs) <= 2 and sum(diffs) >= 1


@pytest.mark.parametrize(("on", "match"), [
    ("c.nope = 'EU'", "unknown column 'nope'"),
    ("COUNT(*) > 1", "aggregates are not allowed"),
    ("c.region + 1 > 2", "ON: arithmetic needs numbers"),
    ("c.code", "ON must be a boolean condition"),
    ("d.region = 'EU' LEFT JOIN countries d ON e.cc = d.code", "joined after it"),
])
def test_left_join_on_conditions_refused_for_free(on: str, match: str) -> None:
    sql = f"SELECT COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.code AND {on}"
    with _session() as s:
        for call in (s.explain, s.query):
            with pytest.raises(DPSQLError) as e:
                call(sql, epsilon=1.0, delta=1e-6)
            assert match in str(e.value), str(e.value)
            assert "__" not in str(e.value), str(e.value)
        assert s.remaining() == BUDGET


@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN"])
@pytest.mark.parametrize("agg", [
    "COUNT(*) FILTER (WHERE c.region = 'EU')", "SUM(e.amt) FILTER (WHERE c.region IS NULL OR e.amt > 5)",
    "COUNT(c.name) FILTER (WHERE e.amt < 5)", "COUNT(e.amt + 1)", "COUNT(COALESCE(c.region, e.cc))",
    "COUNT(c.region)"])
def test_filter_and_count_expr_match_sql(join: str, agg: str) -> None:
    scalar = f"SELECT {agg} AS v FROM events e {join} countries c ON e.cc = c.code"
    grouped = f"SELECT c.region AS k, {agg} AS v FROM events e {join} countries c ON e.cc = c.code GROUP BY c.region"
    with _session() as s:
        got = s.query(scalar, epsilon=1.0, delta=0.0).to_pylist()
        by_key = {r["k"]: r["v"] for r in s.query(grouped, epsilon=1.0, delta=1e-6).to_pylist()}
    assert got == _duckdb(scalar)
    want = {r["k"]: r["v"] for r in _duckdb(grouped)}
    if join == "JOIN":  # the declared domain: the lookup's own NULL region is no key of it
        want.pop(None, None)
    assert by_key == {k: want.get(k, 0) for k in by_key}


def test_filter_over_a_join_that_is_not_a_lookup_is_refused_for_free() -> None:
    with _session() as s:
        s.register("visits", pa.table({"uid": [1, 2, 2], "cc": ["FR", "DE", "JP"]}), privacy_unit="uid",
                   max_rows_per_unit=2)
        for agg in ("COUNT(*) FILTER (WHERE v.cc = 'FR')", "COUNT(e.amt + 1)"):
            with pytest.raises(DPSQLError, match="not supported over joins other than lookup joins"):
                s.query(f"SELECT {agg} FROM events e JOIN visits v ON e.uid = v.uid", epsilon=1.0, delta=1e-6)
        assert s.remaining() == BUDGET


def test_query_many_over_a_join_says_it_is_answered_on_one_table_only() -> None:
    with dpsql.Session(budget=BUDGET) as s:
        s.register("countries", pa.table({"code": ["FR"], "region": ["EU"]}), public=True)
        s.register("events", pa.table({"uid": [1, 2], "cc": ["FR", "DE"], "day": [1, 20]}), privacy_unit="uid",
                   max_rows_per_unit=1, references={"cc": "countries.code"},
                   columns={"day": {"bounds": (0, 30), "bins": 30}})
        sqls = [f"SELECT COUNT(*) FROM events e JOIN countries c ON e.cc = c.code WHERE e.day BETWEEN 0 AND {d}"
                for d in (5, 10)]
        with pytest.raises(DPSQLError) as e:
            s.query_many(sqls, epsilon=1.0)
        assert s.remaining() == BUDGET
    said = f"{e.value} {e.value.hint or ''}"
    assert "one table only" in said and "no query of the workload" not in said, said
    assert "SELECT COUNT(*) FROM events WHERE" in said, said
