"""Day counts (DATE - DATE) and a scalar SELECT of quantiles beside other aggregates (answered as two queries in one
request): neighbouring tables whose one extra person holds extreme dates move a zero-noise SUM of a day count by at
most its stated sensitivity; the two-query request answers what the one-query path names and refuses, charges the
sum of what its queries spend, names its columns as one query would, and releases nothing when its second query
fails after the first ran."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
import sqlglot

import dpsql
from dpsql import Budget
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

N = 40
START = datetime.date(2024, 1, 1)
SCHEMA = pa.schema([("uid", pa.int64()), ("d", pa.date32()), ("e", pa.date32()), ("x", pa.float64()),
                    ("s", pa.string())])


def _rows(extra: list[dict] | None = None) -> pa.Table:
    rows = [{"uid": i, "d": START + datetime.timedelta(days=3 * i), "e": START + datetime.timedelta(days=2 * i + 5),
             "x": float(i % 10), "s": ["apple", "banana", "union"][i % 3]} for i in range(N)]
    return pa.Table.from_pylist(rows + (extra or []), schema=SCHEMA)


def _session(table: pa.Table) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10_000.0, 1e-2))
    s.register("t", table, privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1,
               columns={"x": {"bounds": [0, 10]}, "d": {"bounds": ["2024-01-01", "2024-12-31"], "bin_width": "1 day"},
                        "e": {"bounds": ["2024-01-01", "2024-06-30"], "bin_width": "1 day"}})
    use_noise(s, zero_noise())
    return s


@pytest.fixture()
def session() -> dpsql.Session:
    s = _session(_rows())
    yield s
    s.close()


# -- day counts: one person's extreme dates move a SUM by at most the stated sensitivity ---------------------------

@pytest.mark.parametrize(("sql", "sensitivity"), [
    ("SELECT SUM(d - DATE '2024-01-01') FROM t", 365.0),   # d in 2024: [0, 365]
    ("SELECT SUM(e - d) FROM t", 365.0),                    # [-365, 181]: the wider side
])
def test_removing_one_extreme_person_moves_a_day_count_sum_by_at_most_its_sensitivity(sql: str,
                                                                                        sensitivity: float) -> None:
    """Neighbours: the table and the table with one more person whose dates lie far outside the declared ranges
    (years 1 and 9999): the zero-noise SUM moves by at most the sensitivity the bounds state (values are clamped in
    SQL, not only bounded on paper); the negative control: that person's unclamped day count is far larger."""
    base = None
    for d, e in ((None, None), (datetime.date(9999, 12, 31), datetime.date(1, 1, 1)),
                 (datetime.date(1, 1, 1), datetime.date(9999, 12, 31))):
        t = _rows() if d is None else _rows([{"uid": 10_000, "d": d, "e": e, "x": 1.0, "s": "z"}])
        with _session(t) as s:
            got = s.query(sql, epsilon=100.0, delta=0.0).table.column(0)[0].as_py()
        if base is None:
            base = got
            continue
        assert abs(got - base) <= sensitivity + 1e-9, (d, got, base)
        assert abs((e - d).days) > 100 * sensitivity  # what an unclamped row would have added


# -- quantiles beside other aggregates ---------------------------------------------------------------------------

def test_a_mixed_query_mentioning_union_or_grouping_is_answered(session: dpsql.Session) -> None:
    """The split was tried only where the text held none of the words union, rollup, cube, grouping: a literal
    ('union') or an alias ("cube") made the same query a free refusal (a quantile mixed with other aggregates)."""
    want = sum(1 for r in _rows().to_pylist() if r["s"] != "union")
    for sql in ("SELECT COUNT(*) AS n, MEDIAN(x) FROM t WHERE s <> 'union'",
                "SELECT COUNT(*) AS \"cube\", MEDIAN(x) FROM t WHERE s <> 'union'"):
        r = session.query(sql, epsilon=1.0, delta=1e-6)
        assert r.table.num_rows == 1 and r.table.column(0)[0].as_py() == want


def test_a_mixed_query_with_bracketed_names_is_answered(session: dpsql.Session) -> None:
    """T-SQL's [col] is "col" on the one-query path; the split's first reading failed on it (a free refusal)."""
    r = session.query("SELECT COUNT([x]) AS n, MEDIAN([x]) FROM [t]", epsilon=1.0, delta=1e-6)
    assert r.table.column_names == ["n", 'MEDIAN("x")'] and r.table.column(0)[0].as_py() == N


def test_duckdb_spellings_of_sum_and_avg_beside_a_quantile(session: dpsql.Session) -> None:
    """mean, fsum, favg, sumkahan, kahan_sum are AVG and SUM on the one-query path; beside a quantile they made the
    query a refusal (the split did not see them as aggregates)."""
    r = session.query("SELECT mean(x), fsum(x), median(x) FROM t", epsilon=1.0, delta=1e-6)
    assert r.table.column_names == ["mean(x)", "fsum(x)", "MEDIAN(x)"]


@pytest.mark.parametrize(("sql", "names"), [
    ("SELECT var_samp(x), median(x) FROM t", ["var_samp(x)", "MEDIAN(x)"]),
    ("SELECT COUNT(*) AS a, MEDIAN(x) AS a FROM t", ["a", "a_1"]),
    ("SELECT COUNT(*) AS \"MEDIAN(x)\", MEDIAN(x) FROM t", ["MEDIAN(x)", "MEDIAN(x)_1"]),
])
def test_columns_are_named_as_one_query_names_them(session: dpsql.Session, sql: str, names: list[str]) -> None:
    """Each output is named as the one-query path names it (as written, a repeated name numbered): the halves were
    named from sqlglot's re-rendering (VARIANCE(x) for var_samp(x)), and a name in both halves came out twice, one
    column's accuracy lost."""
    r = session.query(sql, epsilon=1.0, delta=1e-6)
    assert r.table.column_names == names
    assert set(r.accuracy) == set(names)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*), MEDIAN(x) FROM t; DROP TABLE t",
    "SELECT COUNT(*) FROM t UNION ALL SELECT MEDIAN(x) FROM t; SELECT 1",
])
def test_a_second_statement_is_refused_not_ignored(session: dpsql.Session, sql: str) -> None:
    """One query allows exactly one statement; the split read the first and silently dropped the rest."""
    before = session.remaining()
    with pytest.raises(UnsupportedQueryError, match="exactly one SQL statement"):
        session.query(sql, epsilon=1.0, delta=1e-6)
    assert session.remaining() == before


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*), MEDIAN(x) FROM t; -- a note",
    "SELECT COUNT(*) FROM t UNION ALL SELECT MEDIAN(x) FROM t; /* a note */ ;",
])
def test_a_comment_after_the_last_semicolon_is_no_statement(session: dpsql.Session, sql: str) -> None:
    assert session.query(sql, epsilon=1.0, delta=1e-6).table.num_rows >= 1


def test_the_charge_is_the_sum_of_what_the_two_queries_spend(session: dpsql.Session) -> None:
    sql = "SELECT COUNT(*), MEDIAN(x), AVG(x) FROM t WHERE d - e > 0"
    plan = session.explain(sql, epsilon=0.7, delta=1e-6)
    parts = plan.parameters["components"]
    assert len(parts) == 2
    before = session.remaining()
    session.query(sql, epsilon=0.7, delta=1e-6)
    after = session.remaining()
    spent_eps, spent_delta = before.epsilon - after.epsilon, before.delta - after.delta
    assert spent_eps >= sum(p["cost"]["epsilon"] for p in parts) - 1e-12
    assert spent_delta >= sum(p["cost"]["delta"] for p in parts) - 1e-18
    assert spent_eps <= 0.7 + 1e-12 and spent_delta <= 1e-6


def test_a_failure_of_the_second_query_releases_nothing_and_keeps_the_charge(session: dpsql.Session,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsql.groupings as groupings

    calls = []
    real = groupings.backends.fetch_bounded

    def failing(*a, **k):  # the second query's read fails (e.g. a time-out) after the first query ran
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real(*a, **k)

    monkeypatch.setattr(groupings.backends, "fetch_bounded", failing)
    before, entries = session.remaining(), len(session.history())
    with pytest.raises(Exception) as e:
        session.query("SELECT COUNT(*), MEDIAN(x) FROM t", epsilon=1.0, delta=1e-6)
    assert not hasattr(e.value, "release") or e.value.release is None
    assert len(calls) == 2
    after = session.remaining()
    assert before.epsilon - after.epsilon == pytest.approx(1.0)  # a failed run still counts, in full
    assert len(session.history()) == entries + 1


def test_the_spark_refusal_of_a_day_count_names_what_the_query_wrote() -> None:
    """On Spark a day count is refused for free; the message named date_diff(), which the query never wrote (and
    which is off the allow-list), not the DATE - DATE it did write."""
    from dpsql.engine.spark_ops import lower_for_spark
    from dpsql.plan.typer import Typer

    typer = Typer({"d": "DATE", "e": "DATE"})
    typed = typer.t(sqlglot.parse_one("d - e", read="duckdb"))
    with pytest.raises(UnsupportedQueryError, match=r"DATE - DATE \(a number of days\) is not supported on the Spark"):
        lower_for_spark(sqlglot.exp.select(typed.expr))


@pytest.mark.parametrize(("sql", "named"), [
    ("SELECT SUM(d - e) FROM t", "column 'e' declares none"),
    ("SELECT SUM(e - DATE '2024-01-01') FROM t", "column 'e' declares none"),
    ("SELECT SUM(COALESCE(d, e) - DATE '2024-01-01') FROM t", "COALESCE(d, e) is none of these"),
])
def test_a_day_count_without_a_range_names_the_date_that_has_none(sql: str, named: str) -> None:
    """d declares a date range, e none: the refusal (free) named d ("column 'd' has no declared bounds")."""
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        s.register("t", _rows(), privacy_unit="uid",
                   columns={"d": {"bounds": ["2024-01-01", "2024-12-31"], "bin_width": "1 day"}})
        with pytest.raises(UnsupportedQueryError) as e:
            s.explain(sql, epsilon=1.0, delta=1e-6)
        assert named in str(e.value) and "'d'" not in str(e.value).split("(hint")[0].split("\nhint")[0]
