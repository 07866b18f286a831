"""Aggregates the join mechanisms do not answer (COUNT(DISTINCT ...), VARIANCE / STDDEV, COVAR_* / CORR / REGR_*, MIN,
MAX, MEDIAN and the quantiles) over a lookup join: one private table INNER or LEFT JOINed to public lookups on their
declared keys. Each private row yields at most one joined row, holding the same person, so the one-table mechanisms
answer them over the joined rows with the private table's caps (``dpsql.mechanisms.lookup``).

At zero noise every answer equals the one-table path's over a table holding the same joined rows (and, for the
distinct counts, plain DuckDB's). A person added moves a distinct count of people by the one-table sensitivity.
Everything these aggregates cannot be answered for (a join that is not a lookup, the join mechanisms, a stored
synopsis, quantiles mixed with other aggregates) is refused for free, naming the fix."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import DPSQLError
from dpsql.testing import use_noise, zero_noise

REGIONS = ["EU", "AS", "AM"]
BUDGET = Budget(100.0, 1e-2)


def _events(extra: int = 0) -> pa.Table:
    """300 people with one or two events (no cap binds); country codes matched, NULL, or absent from the lookup
    ('ZZ'). ``extra``: one more person (uid 999) with that many events over every code."""
    codes = ["FR", "DE", "JP", "US", "BR", "XX", "ZZ", None]
    uid, cc, amt, day = [], [], [], []
    for u in range(300):
        for j in range(1 + u % 2):
            uid.append(u)
            cc.append(codes[(u * 7 + j * 3) % len(codes)])
            amt.append(10.0 * ((u + j * 2) % 3 == 0))
            day.append(float((u * 11 + j * 5) % 30))
    for i in range(extra):
        uid.append(999)
        cc.append(codes[i % len(codes)])
        amt.append(10.0)
        day.append(29.0)
    return pa.table({"uid": pa.array(uid, pa.int64()), "cc": pa.array(cc, pa.string()), "amt": amt, "day": day})


def _countries() -> pa.Table:
    return pa.table({"code": ["FR", "DE", "JP", "US", "BR", "XX"], "region": ["EU", "EU", "AS", "AM", "AM", None],
                     "name": ["France", "Germany", "Japan", "USA", "Brazil", "Nowhere"]})


CAPS = {"privacy_unit": "uid", "max_rows_per_unit": 2, "max_groups_per_unit": 2, "max_rows_per_group": 2}
BOUNDS = {"amt": {"bounds": [0, 10]}, "day": {"bounds": [0, 30]}}


def _session(events: pa.Table | None = None, join: str = "JOIN") -> dpsql.Session:
    """The lookup join's tables, and ``flat``: the same joined rows as one private table, with the same caps."""
    events = _events() if events is None else events
    s = dpsql.Session(budget=BUDGET)
    s.register("countries", _countries(), public=True, columns={"region": {"domain": REGIONS}})
    s.register("events", events, references={"cc": "countries.code"}, columns=BOUNDS, **CAPS)  # type: ignore[arg-type]
    con = duckdb.connect()
    con.register("events", events)
    con.register("countries", _countries())
    flat = con.sql(f"SELECT e.uid, e.cc, e.amt, e.day, c.region, c.name FROM events e {join} countries c "
                   "ON e.cc = c.code").to_arrow_table()
    s.register("flat", flat, columns={**BOUNDS, "region": {"domain": REGIONS}}, **CAPS)  # type: ignore[arg-type]
    use_noise(s, zero_noise())
    return s


def _duckdb(sql: str) -> list[dict[str, Any]]:
    con = duckdb.connect()
    con.register("events", _events())
    con.register("countries", _countries())
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


AGGS = ["COUNT(DISTINCT e.cc)", "COUNT(DISTINCT c.name)", "COUNT(DISTINCT e.uid)", "VARIANCE(e.amt)",
        "STDDEV_POP(e.day)", "COVAR_SAMP(e.amt, e.day)", "CORR(e.amt, e.day)", "REGR_SLOPE(e.day, e.amt)",
        "REGR_INTERCEPT(e.day, e.amt)", "MEDIAN(e.day)", "QUANTILE_CONT(e.day, 0.25)", "MIN(e.day)", "MAX(e.day)"]


def _plain(agg: str) -> str:
    return agg.replace("e.", "").replace("c.", "")


@pytest.fixture(scope="module")
def joined() -> Any:
    """One session of each join's tables for the test below (its tables never change); each test starts its noise
    afresh, so its two queries draw the salts a new session's would."""
    sessions = {join: _session(join=join) for join in ("JOIN", "LEFT JOIN")}
    yield sessions
    for x in sessions.values():
        x.close()


@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN"])
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize(("grouped", "delta"), [(False, 0.0), (True, 0.0), (True, 1e-6)])
def test_matches_the_one_table_path_over_the_joined_rows(joined: Any, join: str, agg: str, grouped: bool,
                                                         delta: float) -> None:
    where = "WHERE e.amt > 0 OR c.region IS NULL"  # a condition on the lookup's columns, and on the unmatched rows
    if grouped:
        sql = f"SELECT c.region AS k, {agg} AS v FROM events e {join} countries c ON e.cc = c.code {where} GROUP BY c.region"
        plain = f"SELECT region AS k, {_plain(agg)} AS v FROM flat {_plain(where)} GROUP BY region"
    else:
        sql = f"SELECT {agg} AS v FROM events e {join} countries c ON e.cc = c.code {where}"
        plain = f"SELECT {_plain(agg)} AS v FROM flat {_plain(where)}"
    s = joined[join]
    use_noise(s, zero_noise())
    got = s.query(sql, epsilon=1.0, delta=delta)
    want = s.query(plain, epsilon=1.0, delta=delta)
    assert got.mechanism == want.mechanism
    rows = {r.get("k", 0): r["v"] for r in got.to_pylist()}
    expected = {r.get("k", 0): r["v"] for r in want.to_pylist()}
    if grouped and join == "LEFT JOIN":  # the unmatched rows' group: released too (the flat table has no such key)
        assert None in rows
        rows.pop(None)
    assert rows.keys() == expected.keys()
    for k, v in rows.items():  # (NULL where the value is undefined: a constant value's correlation, in both)
        assert (v is None and expected[k] is None) or v == pytest.approx(expected[k], rel=1e-9), (k, v, expected[k])
    assert set(rows) == ({0} if not grouped else set(REGIONS))


@pytest.mark.parametrize("agg", ["MEDIAN(e.day)", "QUANTILE_CONT(e.day, 0.75)"])
def test_a_quantile_of_the_left_joins_null_group_reads_that_groups_rows(agg: str) -> None:
    grouped = f"SELECT c.region AS k, {agg} AS v FROM events e LEFT JOIN countries c ON e.cc = c.code GROUP BY c.region"
    alone = f"SELECT {agg} AS v FROM events e LEFT JOIN countries c ON e.cc = c.code WHERE c.region IS NULL"
    with _session(join="LEFT JOIN") as s:
        got = {r["k"]: r["v"] for r in s.query(grouped, epsilon=1.0).to_pylist()}
        (want,) = s.query(alone, epsilon=1.0).to_pylist()
    assert got[None] == want["v"] == _duckdb(alone)[0]["v"], (got, want)  # was the grid's lower end: an empty group


@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN"])
@pytest.mark.parametrize("agg", ["COUNT(DISTINCT e.cc)", "COUNT(DISTINCT c.name)", "COUNT(DISTINCT e.uid)",
                                 "COUNT(DISTINCT (e.cc, c.name))", "COUNT(DISTINCT ROW(c.name, e.day % 3))"])
def test_distinct_counts_equal_sql_at_zero_noise(join: str, agg: str) -> None:
    scalar = f"SELECT {agg} AS v FROM events e {join} countries c ON e.cc = c.code WHERE e.day < 20"
    grouped = f"SELECT c.region AS k, {agg} AS v FROM events e {join} countries c ON e.cc = c.code GROUP BY c.region"
    with _session() as s:
        (row,) = s.query(scalar, epsilon=1.0, delta=0.0).to_pylist()
        got = {r["k"]: r["v"] for r in s.query(grouped, epsilon=1.0, delta=0.0).to_pylist()}
    assert row == _duckdb(scalar)[0]
    want = {r["k"]: r["v"] for r in _duckdb(grouped)}
    if join == "JOIN":  # the declared domain: the lookup's own NULL region ('XX') is no key of it
        want.pop(None)
    assert got == want


@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN"])
def test_one_person_moves_a_distinct_count_of_people_by_the_sensitivity(join: str) -> None:
    """A person added with 40 events over every code (so every region, and unmatched under LEFT JOIN) is counted in
    at most C_u = 2 groups, by 1 each: the one-table sensitivity the noise is calibrated to (the caps read the joined
    rows' keys)."""
    sql = f"SELECT c.region AS k, COUNT(DISTINCT e.uid) AS n FROM events e {join} countries c ON e.cc = c.code GROUP BY c.region"
    out = []
    for events in (_events(), _events(extra=40)):
        with _session(events) as s:
            params = s.explain(sql, epsilon=1.0, delta=0.0).parameters
            out.append({r["k"]: r["n"] for r in s.query(sql, epsilon=1.0, delta=0.0).to_pylist()})
    diffs = [out[1][k] - out[0][k] for k in out[0]]
    assert set(out[0]) == set(out[1]) and all(d in (0, 1) for d in diffs)
    assert 1 <= sum(diffs) <= 2  # negative control: the person is counted (their L = 2 kept rows: 1 or 2 groups)
    assert params["l1_sensitivity"] == 2


def _private_pair() -> dpsql.Session:
    s = _session()
    s.register("visits", pa.table({"uid": [1, 2, 2], "cc": ["FR", "DE", "JP"]}), privacy_unit="uid",
               max_rows_per_unit=2)
    return s


@pytest.mark.parametrize(("sql", "options", "match"), [
    ("SELECT VARIANCE(e.amt) FROM events e JOIN visits v ON e.uid = v.uid", {}, "not supported over joins other than lookup joins"),
    ("SELECT COUNT(DISTINCT e.cc) FROM events e JOIN visits v ON e.uid = v.uid", {}, "not supported over joins other than lookup joins"),
    ("SELECT CORR(e.amt, e.day) FROM events e JOIN countries c ON e.cc = c.code", {"clip_norm": 5.0},
     "clip_norm ask for the join mechanisms"),
    ("SELECT VARIANCE(e.amt) FROM events e JOIN countries c ON e.cc = c.code", {"q": 0.5}, "the option(s) q ask"),
    ("SELECT MEDIAN(e.day) FROM events e JOIN countries c ON e.cc = c.code", {"mechanism": "dp_s4s"},
     "mechanism 'dp_s4s' asks for the join mechanisms"),
    ("SELECT MEDIAN(e.day) FROM events e LEFT JOIN countries c ON e.cc = c.code", {"reuse": "synopsis"},
     "no stored synopsis holds"),
    ("SELECT c.region, MEDIAN(e.day), COUNT(*) FROM events e JOIN countries c ON e.cc = c.code GROUP BY c.region", {},
     "mixes quantiles"),
    ("SELECT MAX(e.day) FROM events e JOIN countries c ON e.cc = c.code", {"mechanism": "laplace"},
     "not by mechanism 'laplace'"),
    ("SELECT VARIANCE(e.amt) FROM events e JOIN countries c ON e.cc = c.code", {"mechanism": "exponential"},
     "'exponential' answers quantiles"),
    ("SELECT c.name, VARIANCE(e.amt) FROM events e JOIN countries c ON e.cc = c.code GROUP BY c.name", {},
     "declare the domain of countries.name"),
    ("SELECT VARIANCE(e.cc) FROM events e JOIN countries c ON e.cc = c.code", {}, "VARIANCE"),
    ("SELECT VARIANCE(e.uid) FROM events e LEFT JOIN countries c ON e.cc = c.code", {}, "needs value bounds"),
    ("SELECT VARIANCE(e.nope) FROM events e JOIN countries c ON e.cc = c.code", {}, "unknown column 'nope'"),
    ("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY e.nope) FROM events e JOIN countries c ON e.cc = c.code", {},
     "unknown column 'nope'"),
    ("SELECT COUNT(DISTINCT e.uid) FROM events e JOIN countries c ON e.cc = c.code GROUP BY e.uid", {},
     "GROUP BY the privacy unit 'e.uid'"),
])
def test_refused_for_free(sql: str, options: dict[str, Any], match: str) -> None:
    with _private_pair() as s:
        with pytest.raises(DPSQLError) as err:
            s.query(sql, epsilon=1.0, delta=1e-6, options=options)
        assert s.remaining() == BUDGET
    assert match in str(err.value), str(err.value)
    assert "__" not in str(err.value), str(err.value)  # no internal (flat) column name shown


def test_an_undeclared_lookup_column_is_answered_by_the_sparse_histogram_when_asked() -> None:
    sql = "SELECT c.name AS k, COUNT(DISTINCT e.uid) AS n FROM events e JOIN countries c ON e.cc = c.code GROUP BY c.name"
    with _session() as s:
        got = s.query(sql, epsilon=5.0, delta=1e-6, options={"mechanism": "sparse_histogram"})
        assert got.mechanism == "sparse_histogram"
    want = {r["k"]: r["n"] for r in _duckdb(sql)}
    assert {r["k"]: r["n"] for r in got.to_pylist()} == {k: v for k, v in want.items() if v > 20}  # above threshold


def test_outputs_and_explain_name_the_columns_as_written() -> None:
    """Released columns and explain name the aggregates as the query wrote them (``e.amt``), as for COUNT, SUM and AVG
    over joins, never by the joined relation's internal column names."""
    sql = ("SELECT c.region, VARIANCE(e.amt), COUNT(DISTINCT e.uid) AS people, STDDEV(e.amt) * 2 FROM events e "
           "LEFT JOIN countries c ON e.cc = c.code GROUP BY c.region")
    with _session(join="LEFT JOIN") as s:
        shown = s.explain(sql, epsilon=1.0, delta=0.0).parameters
        got = s.query(sql, epsilon=1.0, delta=0.0)
        median = s.explain("SELECT MEDIAN(e.day) FROM events e JOIN countries c ON e.cc = c.code", epsilon=1.0, delta=0.0)
    assert got.table.column_names == ["region", "VARIANCE(e.amt)", "people", "STDDEV(e.amt) * 2"]
    assert set(shown["expected_accuracy"]) == {"VARIANCE(e.amt)", "people"}
    assert median.parameters["aggregates"][0]["aggregate"] == "MEDIAN(e.day)"
