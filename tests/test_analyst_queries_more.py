"""More everyday analyst queries: day counts between dates (answered as DuckDB computes them, at zero noise), and
forms that are refused for free naming the problem and the answered form as the analyst would write it (LIKE ANY,
a quantile beside other aggregates, a list of quantiles, a lookup column without a domain, an unbounded epoch)."""

from __future__ import annotations

import datetime

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import Budget
from dpsql.errors import DPSQLError, PolicyError, UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

N = 40
START = datetime.date(2024, 1, 1)


def _rows(extra: list[dict] | None = None) -> pa.Table:
    rows = [{"uid": i, "d": START + datetime.timedelta(days=3 * i) if i % 7 else None,
             "e": START + datetime.timedelta(days=2 * i + 5),
             "ts": datetime.datetime(2024, 1, 1) + datetime.timedelta(hours=13 * i),
             "x": float(i % 10), "s": ["apple", "banana", "cherry", "date"][i % 4],
             "cc": ["FR", "DE", "US", "XX"][i % 4]} for i in range(N)]
    rows += extra or []
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("uid", pa.int64()), ("d", pa.date32()), ("e", pa.date32()), ("ts", pa.timestamp("us")), ("x", pa.float64()),
        ("s", pa.string()), ("cc", pa.string())]))


LOOKUP = pa.table({"code": ["FR", "DE", "US"], "region": ["EU", "EU", "NA"]})


def _session(table: pa.Table) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10_000.0, 1e-2))
    s.register("lk", LOOKUP, public=True)
    s.register("t", table, privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1,
               columns={"x": {"bounds": [0, 10]}, "d": {"bounds": ["2024-01-01", "2024-12-31"], "bin_width": "1 day"},
                        "e": {"bounds": ["2024-01-01", "2024-06-30"], "bin_width": "1 day"},
                        "ts": {"bounds": ["2024-01-01", "2024-12-31"], "bin_width": "1 day"}},
               references={"cc": "lk.code"})
    use_noise(s, zero_noise())
    return s


@pytest.fixture()
def session() -> dpsql.Session:
    s = _session(_rows())
    yield s
    s.close()


def _truth(sql: str, table: pa.Table | None = None) -> list[tuple]:
    con = duckdb.connect()
    con.register("t", table if table is not None else _rows())
    con.register("lk", LOOKUP)
    return con.execute(sql).fetchall()


def _values(r: dpsql.Release) -> list[tuple]:
    return [tuple(v.values()) for v in r.table.to_pylist()]


def _refused(s: dpsql.Session, sql: str, exc: type[Exception], *parts: str, options: dict | None = None) -> str:
    """The query is refused by ``explain`` and ``query`` alike, with ``parts`` in the message, and nothing spent."""
    before = s.remaining()
    for run in (s.explain, s.query):
        with pytest.raises(exc) as e:
            run(sql, epsilon=1.0, delta=1e-6, options=options)
        text = str(e.value)
        for p in parts:
            assert p in text, text
    assert s.remaining() == before
    return text


# -- DATE - DATE: an integer number of days ----------------------------------------------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE d - DATE '2024-01-01' < 30",
    "SELECT COUNT(*) FROM t WHERE DATE '2024-03-01' - d BETWEEN 0 AND 10",
    "SELECT COUNT(*) FROM t WHERE e - d > 0",
    "SELECT COUNT(*) FROM t WHERE (e - d) % 2 = 0 AND e - d + 1 < 20",
    "SELECT COUNT(*) FROM t WHERE DATE '2024-03-01' - DATE '2024-01-01' = 60",
    "SELECT COUNT(d - e) FROM t",
])
def test_date_minus_date_is_a_day_count(session: dpsql.Session, sql: str) -> None:
    """DuckDB's DATE - DATE is a BIGINT number of days (NULL where either is): it was refused as arithmetic on
    dates; now answered, equal to plain DuckDB at zero noise."""
    assert _values(session.query(sql, epsilon=1.0, delta=1e-6)) == _truth(sql)


@pytest.mark.parametrize("sql", [
    "SELECT SUM(d - DATE '2024-01-01') FROM t",
    "SELECT AVG(e - DATE '2024-01-01') FROM t",
    "SELECT SUM(e - d) FROM t",
    "SELECT SUM(d - e + 1) FROM t WHERE d - e < 100",
    "SELECT SUM(CAST(ts AS DATE) - DATE '2024-01-01') FROM t",
])
def test_a_day_count_of_declared_date_ranges_is_bounded(session: dpsql.Session, sql: str) -> None:
    """SUM / AVG of a day count take their bounds from the dates' declared ranges (d in 2024, so d - DATE
    '2024-01-01' lies in [0, 365]); every row lies inside them, so the zero-noise answer is DuckDB's."""
    got = _values(session.query(sql, epsilon=100.0, delta=0.0))  # (a release is rounded to a tenth of its noise scale)
    want = _truth(sql)
    assert got[0][0] == pytest.approx(float(want[0][0]), abs=1.0)
    plan = str(session.explain(sql, epsilon=1.0, delta=1e-6))
    assert "365" in plan or "181" in plan or "-5" in plan or "366" in plan


def test_a_day_count_key_matches_duckdb(session: dpsql.Session) -> None:
    """GROUP BY a day count (sparse histogram: released keys are a subset of DuckDB's, with DuckDB's counts)."""
    sql = "SELECT (e - DATE '2024-01-01') // 40 AS k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k"
    got = _values(session.query(sql, epsilon=20.0, delta=1e-3))
    truth = dict(_truth(sql))
    assert got and all(truth[k] == n for k, n in got)


def test_a_day_count_without_declared_ranges_names_the_clamp() -> None:
    t = _rows()
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        s.register("t", t, privacy_unit="uid")
        _refused(s, "SELECT SUM(d - DATE '2024-01-01') FROM t", UnsupportedQueryError, "needs bounds",
                 "LEAST(GREATEST(")
        _refused(s, "SELECT SUM(CAST(ts AS DATE) - DATE '2024-01-01') FROM t", UnsupportedQueryError,
                 "declared date range; column 'ts' declares none", "LEAST(GREATEST(")


def test_timestamp_minus_timestamp_names_the_day_count() -> None:
    with _session(_rows()) as s:
        _refused(s, "SELECT COUNT(*) FROM t WHERE ts - TIMESTAMP '2024-01-01 00:00:00' < 30", UnsupportedQueryError,
                 "CAST(ts AS DATE) - ")


def _extreme(day: datetime.date | None, days: int | None = None, other: datetime.date | None = None) -> pa.Table:
    base = _rows()
    extra = pa.Table.from_pylist([{"uid": 10_000, "d": day, "e": other or day, "ts": None, "x": 1.0, "s": "z",
                                   "cc": "FR"}],
                                 schema=base.schema)
    if days is not None:  # a date beyond Python's: built from its day number
        col = pa.array([days], pa.int32()).cast(pa.date32())
        extra = extra.set_column(1, "d", col).set_column(2, "e", col)
    return pa.concat_tables([base, extra])


EXTREME_QUERIES = [
    "SELECT COUNT(*) FROM t WHERE d - DATE '2024-01-01' < 30",
    "SELECT COUNT(*) FROM t WHERE DATE '0001-01-01' - e < 0 AND e - d = 0",
    "SELECT SUM(e - d) FROM t",
    "SELECT (e - DATE '2024-01-01') // 40 AS k, COUNT(*) AS n FROM t GROUP BY k",
]


def test_one_extreme_person_never_makes_a_day_count_fail() -> None:
    """Neighbouring tables: one more person whose dates are the extreme ones (years 1 and 9999, dates far beyond
    them, NULL): each query is answered on each, as on the table without them."""
    for t in (_rows(), _extreme(None), _extreme(datetime.date(1, 1, 1), other=datetime.date(9999, 12, 31)),
              _extreme(datetime.date(9999, 12, 31), other=datetime.date(1, 1, 1)),
              _extreme(None, days=2**31 - 2), _extreme(None, days=-(2**31) + 2)):
        with _session(t) as s:
            outcomes = []
            for sql in EXTREME_QUERIES:
                try:
                    s.query(sql, epsilon=1.0, delta=1e-6)
                    outcomes.append("ok")
                except DPSQLError as e:  # pragma: no cover - what the test rules out
                    outcomes.append(f"{type(e).__name__}: {e}")
            assert outcomes == ["ok"] * len(EXTREME_QUERIES)


# -- LIKE ANY / ILIKE ANY / NOT LIKE ALL: DuckDB has no such syntax ------------------------------------------------

@pytest.mark.parametrize(("sql", "fix"), [
    ("SELECT COUNT(*) FROM t WHERE s LIKE ANY ('a%', 'b%')", "s LIKE 'a%' OR s LIKE 'b%'"),
    ("SELECT COUNT(*) FROM t WHERE s ILIKE ANY ('A%', 'b%')", "s ILIKE 'A%' OR s ILIKE 'b%'"),
    ("SELECT COUNT(*) FROM t WHERE s LIKE ALL ('a%', '%e')", "s LIKE 'a%' AND s LIKE '%e'"),
    ("SELECT COUNT(*) FROM t WHERE s NOT LIKE ALL ('a%', 'b%')", "s NOT LIKE 'a%' AND s NOT LIKE 'b%'"),
    ("SELECT COUNT(*) FROM t WHERE s NOT ILIKE ANY ('a%', 'b%')", "s NOT ILIKE 'a%' OR s NOT ILIKE 'b%'"),
])
def test_like_any_names_its_or_form(session: dpsql.Session, sql: str, fix: str) -> None:
    """DuckDB does not parse LIKE ANY (...): refused for free, the message spelling the OR (AND for ALL) of the
    query's own column, operator and patterns, which is answered."""
    _refused(session, sql, UnsupportedQueryError, fix)
    answered = sql.split("WHERE ")[0] + "WHERE " + fix
    assert _values(session.query(answered, epsilon=1.0, delta=1e-6)) == _truth(answered)


# -- quantiles: beside other aggregates, and as a list -------------------------------------------------------------

def test_a_quantile_beside_other_aggregates_is_answered_side_by_side(session: dpsql.Session) -> None:
    """A scalar SELECT of quantiles and other aggregates (refused before) is two queries in one request: each
    released as if sent alone at half the budget, the columns in the order written, one charge of what was asked."""
    sql = "SELECT COUNT(*) AS n, median(x), AVG(x) AS m, MAX(x) - MIN(x) AS span FROM t WHERE s <> 'apple'"
    plan = session.explain(sql, epsilon=1.0, delta=1e-6)
    assert [c["sql"] for c in plan.parameters["components"]] == [
        "SELECT COUNT(*) AS n, AVG(x) AS m FROM t WHERE s <> 'apple'",
        "SELECT MEDIAN(x), MAX(x) - MIN(x) AS span FROM t WHERE s <> 'apple'"]
    before = session.remaining()
    r = session.query(sql, epsilon=1.0, delta=1e-6)
    spent = session.remaining()
    assert before.epsilon - spent.epsilon == pytest.approx(1.0) and len(session.history()) == 1
    assert r.table.column_names == ["n", "MEDIAN(x)", "m", "span"]
    alone = {**session.query("SELECT COUNT(*) AS n, AVG(x) AS m FROM t WHERE s <> 'apple'", epsilon=0.5,
                             delta=5e-7).table.to_pylist()[0],
             **session.query("SELECT MEDIAN(x), MAX(x) - MIN(x) AS span FROM t WHERE s <> 'apple'",
                             epsilon=0.5).table.to_pylist()[0]}
    assert r.table.to_pylist() == [alone]
    assert r.table.to_pylist()[0]["n"] == _truth("SELECT COUNT(*) FROM t WHERE s <> 'apple'")[0][0]
    assert set(r.accuracy) == {"n", "MEDIAN(x)", "m", "span"}
    # an aggregate's FILTER goes with its own query
    r = session.query("SELECT COUNT(*) FILTER (WHERE x > 3) AS big, quantile_cont(x, 0.5) AS p50 FROM t", epsilon=1.0,
                      delta=1e-6)
    assert r.table.column_names == ["big", "p50"]
    assert r.table.to_pylist()[0]["big"] == _truth("SELECT COUNT(*) FILTER (WHERE x > 3) FROM t")[0][0]


def test_quantiles_beside_counts_over_a_lookup_join_and_on_neighbours() -> None:
    """Over a lookup join too; and one more person with extreme or missing values changes no outcome."""
    sql = "SELECT COUNT(*), MIN(t.x), SUM(t.x) FROM t JOIN lk ON t.cc = lk.code WHERE lk.region = 'EU'"
    base = _rows()
    for extra in (None, {"x": None}, {"x": float("nan")}, {"x": -1e308}):
        t = base if extra is None else pa.concat_tables([base, pa.Table.from_pylist(
            [{"uid": 10_000, "d": None, "e": None, "ts": None, "s": "z", "cc": "FR", **extra}], schema=base.schema)])
        with _session(t) as s:
            r = s.query(sql, epsilon=1.0, delta=1e-6)
            assert r.table.num_rows == 1 and r.table.num_columns == 3


@pytest.mark.parametrize(("sql", "parts"), [
    ("SELECT s, AVG(x), quantile_cont(x, 0.9) FROM t GROUP BY s",
     ("SELECT QUANTILE_CONT(x, 0.9) FROM", "SELECT AVG(x) FROM", "UNION ALL")),
    ("SELECT median(x) - AVG(x) FROM t", ("SELECT MEDIAN(x) FROM", "SELECT AVG(x) FROM", "UNION ALL")),
    ("SELECT COUNT(*) AS n, n + median(x) FROM t", ("SELECT MEDIAN(x) FROM", "UNION ALL")),
    ("SELECT COUNT(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM t", ("SELECT COUNT(*) FROM", "UNION ALL")),
])
def test_a_quantile_mixed_within_one_output_or_grouped_is_refused(session: dpsql.Session, sql: str,
                                                                   parts: tuple[str, ...]) -> None:
    """Grouped (the two mechanisms release different key sets), or one output reading both: refused for free,
    naming both queries and the UNION ALL that answers them as one request (one charge, the budget split)."""
    _refused(session, sql, PolicyError, *parts)


def test_a_scalar_mix_with_order_by_or_limit_is_told_to_drop_them(session: dpsql.Session) -> None:
    """Its one row needs no ORDER BY or LIMIT, and without them the same SELECT is answered: the hint says so (a
    grouped query's does not: the fix there is the UNION ALL)."""
    for sql in ("SELECT COUNT(*), MEDIAN(x) FROM t ORDER BY 1", "SELECT COUNT(*), MEDIAN(x) FROM t LIMIT 5"):
        _refused(session, sql, PolicyError, "without ORDER BY, LIMIT")
    with pytest.raises(PolicyError) as e:
        session.explain("SELECT s, AVG(x), MEDIAN(x) FROM t GROUP BY s", epsilon=1.0, delta=1e-6)
    assert "without ORDER BY" not in str(e.value)
    assert session.explain("SELECT COUNT(*), MEDIAN(x) FROM t", epsilon=1.0, delta=1e-6) is not None


def test_the_union_all_named_answers_a_quantile_and_a_count(session: dpsql.Session) -> None:
    before = session.remaining().epsilon
    r = session.query("SELECT COUNT(*) AS v FROM t UNION ALL SELECT median(x) FROM t", epsilon=1.0)
    assert r.table.num_rows == 2 and r.table.to_pylist()[0]["v"] == N
    assert before - session.remaining().epsilon == pytest.approx(1.0)


@pytest.mark.parametrize(("sql", "fix"), [
    ("SELECT quantile_cont(x, [0.25, 0.5, 0.75]) FROM t",
     "quantile_cont(x, 0.25), quantile_cont(x, 0.5), quantile_cont(x, 0.75)"),
    ("SELECT quantile_disc(x, [0.1, 0.9]) FROM t", "quantile_disc(x, 0.1), quantile_disc(x, 0.9)"),
    ("SELECT quantile(x, [0.1, 0.9]) FROM t", "quantile(x, 0.1), quantile(x, 0.9)"),
    ("SELECT percentile_cont([0.25, 0.5]) WITHIN GROUP (ORDER BY x) FROM t",
     "percentile_cont(0.25) WITHIN GROUP (ORDER BY x), percentile_cont(0.5) WITHIN GROUP (ORDER BY x)"),
])
def test_a_list_of_quantiles_names_the_separate_calls(session: dpsql.Session, sql: str, fix: str) -> None:
    """A list of fractions is refused for free naming the same quantiles as separate calls, which one query
    answers (each a released value)."""
    _refused(session, sql, UnsupportedQueryError, fix)
    r = session.query(f"SELECT {fix} FROM t", epsilon=1.0)
    assert r.table.num_columns == fix.count("(x") + fix.count("BY x)")


# -- a lookup column without a declared domain ---------------------------------------------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT lk.region, COUNT(DISTINCT t.s) FROM t JOIN lk ON t.cc = lk.code GROUP BY lk.region",
    "SELECT lk.region, COUNT(*) FILTER (WHERE t.x > 3) FROM t JOIN lk ON t.cc = lk.code GROUP BY lk.region",
    "SELECT lk.region, COUNT(*) FROM t LEFT JOIN lk ON t.cc = lk.code GROUP BY lk.region",
])
def test_lookup_column_without_domain_names_the_declaration(session: dpsql.Session, sql: str) -> None:
    _refused(session, sql, PolicyError, "columns={'region': {'domain': [...]}}", "table 'lk'", "sparse_histogram")
    # the declaration named answers it
    with dpsql.Session(budget=Budget(100.0, 1e-3)) as s:
        s.register("lk", LOOKUP, public=True, columns={"region": {"domain": ["EU", "NA"]}})
        s.register("t", _rows(), privacy_unit="uid", columns={"x": {"bounds": [0, 10]}}, references={"cc": "lk.code"})
        use_noise(s, zero_noise())
        assert s.query(sql, epsilon=1.0, delta=1e-6).table.num_rows >= 2


# -- bounds messages name the function as written --------------------------------------------------------------------

@pytest.mark.parametrize(("sql", "name"), [
    ("SELECT SUM(epoch(ts)) FROM t", "epoch"),
    ("SELECT AVG(EPOCH(ts)) FROM t", "EPOCH"),
    ("SELECT SUM(length(s)) FROM t", "length"),
])
def test_bounds_message_names_the_function_as_written(session: dpsql.Session, sql: str, name: str) -> None:
    text = _refused(session, sql, UnsupportedQueryError, f"{name} has no interval rule")
    assert "TIME_TO_UNIX" not in text and "LEAST(GREATEST(" in text
