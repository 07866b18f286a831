"""A histogram whose WHERE restricts its own column to a range: DAWA runs over the kept bins only
(the others hold no row that passes the WHERE, known from the query's literals), so kept bins are
not averaged with excluded ones, and only kept bins are released, whatever the key's form."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.mechanisms.ranges import binning
from dpsql.plan import workload
from dpsql.plan.analyze import analyze
from dpsql.testing import seeded_noise, use_noise, zero_noise

QUERY = "SELECT event_date, COUNT(*) AS n FROM events WHERE event_date < DATE '2024-01-08' GROUP BY event_date"
DAYS, PER_DAY = 7, 13


def events_session(noise, version: str | None = None) -> dpsql.Session:
    n = DAYS * PER_DAY
    t = pa.table({"pid": np.arange(n, dtype=np.int64),
                  "event_date": [dt.date(2024, 1, 1) + dt.timedelta(days=i % DAYS) for i in range(n)]})
    s = dpsql.Session(budget=dpsql.Budget(1000.0))
    use_noise(s, noise)
    s.register("events", t, privacy_unit="pid", max_rows_per_unit=1, version=version,
               columns={"event_date": {"bounds": ("2024-01-01", "2025-01-01"), "bin_width": "1 day"}})
    return s


def test_the_where_restricts_dawa_to_the_kept_bins():
    s = events_session(zero_noise())
    wl = workload.histogram_workload(analyze(QUERY, s.tables))
    assert wl is not None and wl.span == ((0, 6),) and wl.size == 7
    r = s.query(QUERY, epsilon=1.0)
    assert r.details["dawa_bins"] == [[0, 6]]
    assert r.table.column("n").to_pylist() == [PER_DAY] * DAYS


def _mean_released_total(seeds: range) -> float:
    """One session (its own ledger, budget 1000) answers every run, each with its own seeded noise: a run
    releases what a fresh session with that noise would (the session keeps no synopsis: no version)."""
    totals = []
    s = events_session(zero_noise())
    for seed in seeds:
        use_noise(s, seeded_noise(f"span-{seed}"))
        totals.append(sum(s.query(QUERY, epsilon=1.0).table.column("n").to_pylist()))
    s.close()
    return float(np.mean(totals))


def test_kept_bins_are_not_diluted_by_excluded_ones(monkeypatch):
    """Over the kept bins only, the released total is the sum of DAWA's bucket estimates, unbiased for the
    true 91; over the whole year, the buckets that straddle the WHERE's edge spread part of their total
    over excluded bins, which the release drops. Measured over 40 seeded runs: sd of one total 2.2 with
    the span (mean 91.5), 7.5 without it (mean 79.8). Over 24 runs the standard errors are 0.45 and 1.53:
    the thresholds are 6.7 and 5.4 standard errors from the expected means (91 unbiased, 79.8), each
    crossed with probability < 1e-7. Fixed seeds: deterministic."""
    truth = DAYS * PER_DAY
    assert abs(_mean_released_total(range(24)) - truth) <= 3.0
    # negative control: the same runs with DAWA over the whole declared domain
    monkeypatch.setattr(workload, "_where_span", lambda *a, **k: None)
    assert _mean_released_total(range(24)) < truth - 3.0


@pytest.mark.parametrize("sql, keys, span", [
    # continuous bins: the bin holding the endpoint is kept whole; the others are not released
    ("SELECT score, COUNT(*) AS n FROM people WHERE score < 2.3 GROUP BY score", [0.0, 0.5, 1.0, 1.5, 2.0], [[0, 4]]),
    ("SELECT score_bin, COUNT(*) AS n FROM people WHERE score >= 8 GROUP BY score_bin", [8.0, 8.5, 9.0, 9.5], [[16, 19]]),
    # coarse bins: DAWA runs over the kept fine bins; a coarse bin holding one of them is released (their sum)
    ("SELECT floor(age / 10) * 10 AS a, COUNT(*) AS n FROM people WHERE age >= 35 AND age < 61 "
     "GROUP BY floor(age / 10) * 10", [30.0, 40.0, 50.0, 60.0], [[35, 60]]),
    ("SELECT age, COUNT(*) AS n FROM people WHERE 33 >= age AND age BETWEEN 30 AND 40 AND region = 'north' "
     "GROUP BY age", [30, 31, 32, 33], [[30, 33]]),
    ("SELECT age, COUNT(*) AS n FROM people WHERE age IN (7, 3, 200) OR age = 5 GROUP BY age", [3, 5, 7],
     [[3, 3], [5, 5], [7, 7]]),
    ("SELECT score, COUNT(*) AS n FROM people WHERE score IN (2.3, 7.1) GROUP BY score", [2.0, 7.0], [[4, 4], [14, 14]]),
    ("SELECT floor(age / 10) * 10 AS a, COUNT(*) AS n FROM people WHERE age < 12 OR age >= 118 "
     "GROUP BY floor(age / 10) * 10", [0.0, 10.0, 110.0, 120.0], [[0, 11], [118, 120]]),
])
def test_only_kept_bins_are_released(sql, keys, span):
    from test_ranges import make_session

    r = make_session().query(sql, epsilon=0.5)
    assert r.table.column(r.table.column_names[0]).to_pylist() == keys
    assert r.details["dawa_bins"] == span


@pytest.fixture(scope="module")
def people_tables():
    """test_ranges' catalog, for the tests that analyse only (they read no row and charge nothing)."""
    from test_ranges import make_session

    s = make_session()
    yield s.tables
    s.close()


@pytest.mark.parametrize("where", ["", "WHERE region = 'north'", "WHERE age >= 0", "WHERE age < 200",
                                   "WHERE age >= 30 OR age < 40", "WHERE age < 1e400", "WHERE age <> 35.5",
                                   "WHERE age <> 1e400", "WHERE age > -1e400",
                                   "WHERE age < CAST('nan' AS DOUBLE)", "WHERE age > -(1e400)", "WHERE CAST(age AS INTEGER) < 3",
                                   "WHERE age NOT IN (200, -1)", "WHERE age IS NOT NULL", "WHERE NOT (age > 3 AND age < 3)",
                                   "WHERE age >= 30 OR region = 'north'", "WHERE age < score",
                                   "WHERE age = age", "WHERE age <= age", "WHERE NOT (age <> age)", "WHERE TRUE",
                                   "WHERE age <> age OR TRUE", "WHERE age IS NOT DISTINCT FROM age"])
def test_no_restriction_without_a_proper_sub_range(people_tables, where):
    wl = workload.histogram_workload(analyze(f"SELECT age, COUNT(*) FROM people {where} GROUP BY age", people_tables))
    assert wl is not None and wl.span is None and wl.size == 121


def test_a_synopsis_over_a_span_answers_that_span_only(tmp_path):
    s = events_session(zero_noise(), version="v1")
    first = s.query(QUERY, epsilon=1.0)
    again = s.query(QUERY, epsilon=1.0)
    assert again.reused and again.table.to_pylist() == first.table.to_pylist()
    other = s.query(QUERY.replace("2024-01-08", "2024-01-05"), epsilon=1.0)
    assert not other.reused and other.table.column("n").to_pylist() == [PER_DAY] * 4
    # the span is part of the key: a synopsis kept over the whole domain under the same WHERE (as
    # stored before histograms were restricted) is not found for the span
    wl = workload.histogram_workload(analyze(QUERY, s.tables))
    assert wl is not None
    whole = workload.Workload(**{**wl.__dict__, "span": None})
    assert wl.synopsis_key(1.0, s.tables, binning=binning(wl)) != whole.synopsis_key(1.0, s.tables, binning=binning(wl))
    # a range workload and a quantile over the same column read synopses over the whole domain
    r = s.query_many(["SELECT COUNT(*) FROM events WHERE event_date < DATE '2024-01-08'"], epsilon=1.0)
    assert not r.reused


@pytest.mark.parametrize("col, where, span", [
    # one-value bins: exactly the values the WHERE admits
    ("age", "age <> 35", ((0, 34), (36, 120))),
    ("age", "age >= 30 AND age < 40 AND age <> 35", ((30, 34), (36, 39))),
    ("age", "age NOT IN (1, 2, 200)", ((0, 0), (3, 120))),
    ("age", "age IN (20, NULL, 40, 2.5)", ((20, 20), (40, 40))),
    ("age", "age > 30 OR 3 > age", ((0, 2), (31, 120))),
    ("age", "NOT (age < 30)", ((30, 120),)),
    ("age", "NOT age BETWEEN 10 AND 110 AND region = 'north'", ((0, 9), (111, 120))),
    ("age", "(age < 10 OR age > 100) AND (age > 5 OR region = 'north')", ((0, 9), (101, 120))),
    ("age", "age >= 30 AND (age < 40 OR region = 'north')", ((30, 120),)),
    ("age", "NOT (age <> 7)", ((7, 7),)),
    ("age", "age > 30.5 AND age < 33", ((31, 32),)),
    # an integer column cast to DOUBLE is exact: compared with the literal's double (2.99999999999999999999
    # is the double 3.0, so 3 passes)
    ("age", "CAST(age AS DOUBLE) < 3", ((0, 2),)),
    ("age", "CAST(age AS DOUBLE) <= 2.99999999999999999999", ((0, 3),)),
    ("age", "age::DOUBLE IN (4, 6.0) OR TRY_CAST(age AS DOUBLE) > 118", ((4, 4), (6, 6), (119, 120))),
    # continuous bins (0.5 wide): a bin holding an endpoint is kept whole, so <> excludes no bin
    ("score", "score <> 2.5 AND score < 1", ((0, 1),)),
    ("score", "score NOT IN (2.5, 3) AND score >= 9.5", ((19, 19),)),
    ("score", "NOT (score >= 1 AND score < 9)", ((0, 1), (18, 19))),
    ("score", "NOT (score > 1 AND score <= 9)", ((0, 2), (18, 19))),
])
def test_kept_bins_follow_every_where_shape(people_tables, col, where, span):
    wl = workload.histogram_workload(analyze(f"SELECT {col}, COUNT(*) FROM people WHERE {where} GROUP BY {col}",
                                             people_tables))
    assert wl is not None and wl.span == span


def ages_session(monkeypatch=None) -> tuple[dpsql.Session, pa.Table]:
    """Ten people at each age 0..120, one row each: at zero noise DAWA over uniform kept bins is exact."""
    t = pa.table({"pid": np.arange(1210, dtype=np.int64), "age": np.repeat(np.arange(121, dtype=np.int64), 10)})
    s = dpsql.Session(budget=dpsql.Budget(1000.0))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 120), "bins": 121}})
    return s, t


@pytest.mark.parametrize("where", ["age IN (20, 30, 40)", "age <> 35", "age NOT IN (3, 60) AND age < 70",
                                   "age < 10 OR age > 110", "NOT age BETWEEN 5 AND 115",
                                   "CAST(age AS DOUBLE) < 3 OR age::DOUBLE = 100.0",
                                   "CAST(age AS DOUBLE) <= 2.99999999999999999999"])
def test_excluded_values_do_not_dilute_kept_bins(monkeypatch, where):
    """Zero noise against DuckDB: every kept age holds 10 people, every excluded one none; over the kept bins
    only DAWA's buckets are uniform, so each released bin is exact, and only kept ages are released."""
    import duckdb

    sql = f"SELECT age, COUNT(*) AS n FROM t WHERE {where} GROUP BY age ORDER BY age"
    s, t = ages_session()
    con = duckdb.connect()
    con.register("t", t)
    truth = con.execute(sql).fetchall()
    assert s.query(sql, epsilon=1.0).table.to_pylist() == [{"age": a, "n": n} for a, n in truth]
    # negative control: DAWA over the whole domain averages kept bins with the excluded zeros
    monkeypatch.setattr(workload, "_where_span", lambda *a, **k: None)
    s, _ = ages_session()
    assert s.query(sql, epsilon=1.0).table.to_pylist() != [{"age": a, "n": n} for a, n in truth]


def test_an_excluded_day_is_neither_estimated_nor_released():
    s = events_session(zero_noise())
    r = s.query(QUERY.replace("WHERE", "WHERE event_date <> DATE '2024-01-03' AND"), epsilon=1.0)
    assert r.details["dawa_bins"] == [[0, 1], [3, 6]]
    assert r.table.column("event_date").to_pylist() == [dt.date(2024, 1, d) for d in (1, 2, 4, 5, 6, 7)]
    assert r.table.column("n").to_pylist() == [PER_DAY] * 6


@pytest.fixture(scope="module")
def ages_refusals():
    s, _ = ages_session()
    yield s
    s.close()


@pytest.mark.parametrize("where", ["age > 5 AND age < 3", "age BETWEEN 40 AND 30", "age IN (2.5, 200, NULL)",
                                   "age NOT IN (3, NULL)", "age = NULL", "age IS NULL", "NOT (age >= 0)",
                                   "age = 1e400", "age IN (1e400, -1e400)", "age > 1e400", "age <= -1e400",
                                   "age = -(1e400)", "age = CAST('NaN' AS DOUBLE)", "age >= 'inf'::DOUBLE",
                                   "age < CAST('-Infinity' AS DOUBLE)",
                                   # the column compared with itself: false (<>, <, >) or NULL for every row
                                   "age <> age", "age < age", "age > age", "NOT (age = age)", "NOT age >= age",
                                   "age <> age OR age IS NULL", "CAST(age AS DOUBLE) <> age", "age > age AND age >= 0",
                                   "FALSE", "age > 3 AND FALSE", "NULL", "age IS DISTINCT FROM age",
                                   "NOT (age IS NOT DISTINCT FROM age)"])
def test_empty_kept_bins_on_one_value_bins(ages_refusals, where):
    """An empty set of kept bins follows from the literals and the declared domain: refused, for free
    (one session for every WHERE: each refusal must leave its budget whole)."""
    from dpsql.errors import QueryError

    s = ages_refusals
    with pytest.raises(QueryError, match="admits no value of the declared domain of 'age'") as e:
        s.query(f"SELECT age, COUNT(*) FROM t WHERE {where} GROUP BY age", epsilon=1.0)
    assert "nothing was charged" in str(e.value) and s.remaining() == dpsql.Budget(1000.0)


@pytest.mark.parametrize("sql", [
    "SELECT age, COUNT(*) FROM people WHERE age > 200 GROUP BY age",
    "SELECT score, COUNT(*) FROM people WHERE score > 20 GROUP BY score",
    "SELECT score, COUNT(*) FROM people WHERE score > 5 AND score < 3 GROUP BY score",
    "SELECT floor(age / 10) * 10, COUNT(*) FROM people WHERE age < 0 GROUP BY floor(age / 10) * 10",
])
def test_empty_kept_bins_are_refused_for_free_on_every_key_form(sql):
    from test_ranges import make_session

    from dpsql.errors import QueryError

    s = make_session()
    before = s.remaining()
    with pytest.raises(QueryError, match="admits no value of the declared domain"):
        s.query(sql, epsilon=0.5)
    assert s.remaining() == before and s.history().num_rows == 0


def test_empty_kept_days_are_refused():
    from dpsql.errors import QueryError

    s = events_session(zero_noise())
    with pytest.raises(QueryError, match="admits no value of the declared domain of 'event_date'"):
        s.query(QUERY.replace("WHERE", "WHERE event_date >= DATE '2026-01-01' AND"), epsilon=1.0)
    assert s.remaining() == dpsql.Budget(1000.0)


def test_a_reuse_answers_the_same_kept_bins_only():
    """The key names the kept runs: one run keeps its former key; several runs, or other runs, differ."""
    s = events_session(zero_noise(), version="v1")
    sql = QUERY.replace("WHERE", "WHERE event_date <> DATE '2024-01-03' AND")
    first = s.query(sql, epsilon=1.0)
    again = s.query(sql, epsilon=1.0)
    assert again.reused and again.table.to_pylist() == first.table.to_pylist()
    wl = workload.histogram_workload(analyze(sql, s.tables))
    assert wl is not None and wl.span == ((0, 1), (3, 6))
    keys = {workload.Workload(**{**wl.__dict__, "span": sp}).synopsis_key(1.0, s.tables, binning=binning(wl))
            for sp in (wl.span, ((0, 6),), ((0, 1),), ((0, 1), (3, 5)), None)}
    assert len(keys) == 5


@pytest.mark.parametrize("queries", [
    ["SELECT COUNT(*) FROM people WHERE age > 200"],
    ["SELECT COUNT(*) FROM people WHERE age > 5 AND age < 3", "SELECT COUNT(*) FROM people WHERE age BETWEEN 9 AND 8"],
    ["SELECT COUNT(*) FROM people WHERE age > 5 AND age < 3 AND score >= 2 AND score < 3",
     "SELECT COUNT(*) FROM people WHERE score >= 20 AND age = 3"],
])
def test_a_workload_of_empty_ranges_only_is_refused_for_free(queries):
    """As a histogram that keeps no bin: every count is known to be 0 from the literals and the domain."""
    from test_ranges import make_session

    from dpsql.errors import QueryError

    s = make_session()
    before = s.remaining()
    with pytest.raises(QueryError, match="no range of this workload admits a value of the declared domain"):
        s.query_many(queries, epsilon=0.5)
    assert s.remaining() == before
    # negative control: one range that selects a bin, and the workload is answered (its empty ranges exactly 0)
    r = s.query_many([*queries, "SELECT COUNT(*) FROM people WHERE age >= 0" + (" AND score >= 0" if "score" in queries[0]
                                                                                 else "")], epsilon=0.5)
    assert list(r.counts)[:-1] == [0] * len(queries)


def test_kept_bins_of_a_long_in_list_over_many_bins_are_found_quickly():
    """The kept bins of an IN list of 2 000 values over 2^20 bins: found from the runs (a union in one sort), the
    released bins from the runs (not every bin against every run: 2^20 x 2 000 tests took many minutes)."""
    import time

    t = pa.table({"pid": np.arange(3, dtype=np.int64), "age": np.arange(3, dtype=np.int64)})
    s = dpsql.Session(budget=dpsql.Budget(1.0))
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1, columns={"age": {"bounds": (0, (1 << 20) - 1), "bins": 1 << 20}})
    values = [i * 500 for i in range(2000)]
    plan = analyze(f"SELECT age, COUNT(*) FROM t WHERE age IN ({', '.join(map(str, values))}) GROUP BY age", s.tables)
    start = time.perf_counter()
    wl = workload.histogram_workload(plan)
    assert time.perf_counter() - start < 20.0
    assert wl is not None and wl.span == tuple((v, v) for v in values) and [r[0] for r in wl.ranges] == values


@pytest.mark.parametrize("shared, span", [("age <> 35", ((0, 34), (36, 120))),
                                          ("age NOT IN (35, 36) AND region = 'north'", ((0, 34), (37, 120))),
                                          ("(age IN (3, 40) OR age > 100)", ((3, 3), (40, 40), (101, 120)))])
def test_a_workloads_shared_condition_restricts_its_bins(shared, span):
    """A range workload's shared condition on its own column keeps bins as a histogram's WHERE does."""
    from test_ranges import make_session

    s = make_session()
    queries = [f"SELECT COUNT(*) FROM people WHERE {shared} AND age BETWEEN 30 AND 39",
               f"SELECT COUNT(*) FROM people WHERE {shared} AND age >= 0"]
    assert workload.analyze_workload(queries, s.tables).span == span
    r = s.query_many(queries, epsilon=0.5)
    assert r.details["dawa_bins"] == [list(x) for x in span]


def test_a_workload_whose_shared_condition_keeps_no_bin_is_refused_for_free():
    from test_ranges import make_session

    from dpsql.errors import QueryError

    s = make_session()
    before = s.remaining()
    for queries in (["SELECT COUNT(*) FROM people WHERE age IN (200, 3.5) AND age >= 0"],
                    ["SELECT COUNT(*) FROM people WHERE age <> age AND age >= 0"],
                    ["SELECT COUNT(*) FROM people WHERE score < score AND age >= 0 AND score >= 1"],
                    ["SELECT COUNT(*) FROM people WHERE age IN (3, 4) AND age >= 10",
                     "SELECT COUNT(*) FROM people WHERE age IN (3, 4) AND age BETWEEN 5 AND 9"]):
        with pytest.raises(QueryError, match="admits a value of the declared domain|admits no value"):
            s.query_many(queries, epsilon=0.5)
    assert s.remaining() == before
    # negative control: a range holding a kept bin
    r = s.query_many(["SELECT COUNT(*) FROM people WHERE age IN (3, 4) AND age >= 4"], epsilon=0.5)
    assert r.details["dawa_bins"] == [[3, 4]]


@pytest.mark.parametrize("where", ["age <> 35", "age < 40", "age IN (3, 50, 51) OR age > 110"])
def test_a_quantile_reads_the_histogram_over_its_kept_bins(where):
    """The histogram's synopsis covers the kept bins only: a quantile under the same WHERE reads it there (the
    other bins are empty), for free, as its refusal's hint says it would."""
    import duckdb

    _, t = ages_session()
    s = dpsql.Session(budget=dpsql.Budget(1000.0))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 120), "bins": 121}},
               version="v1")
    s.query(f"SELECT age, COUNT(*) AS n FROM t WHERE {where} GROUP BY age", epsilon=1.0)
    before = s.remaining()
    r = s.query(f"SELECT MEDIAN(age) AS m FROM t WHERE {where}", epsilon=1.0, options={"reuse": "synopsis"})
    assert r.reused and s.remaining() == before
    con = duckdb.connect()
    con.register("t", t)
    truth = con.execute(f"SELECT quantile_disc(age, 0.5) FROM t WHERE {where}").fetchall()[0][0]
    assert abs(r.table.column("m")[0].as_py() - truth) <= 1
