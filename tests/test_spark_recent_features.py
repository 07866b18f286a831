"""Comma joins, DuckDB's aggregate names (mean, favg, fsum, sumkahan, kahan_sum), its date-part functions (dayofmonth,
weekday, weekofyear, isodow, yearweek), date_add(d, INTERVAL ...), MIN/MAX(DISTINCT), tied quantiles and the refusal
of UHUGEINT outputs give the same answers on Spark as on DuckDB: with zero noise the same released names, types and
values, and the same free refusals, also with a hostile neighbour in the data (one more person with years 1 and 9999,
BC dates, NaN and +-inf, a huge text and integers at their type's limits), whose rows make neither engine fail.

Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import both_engines, comparable_session, require_spark
from sqlglot import exp

import dpsql
from dpsql.errors import DPSQLError
from dpsql.plan.parse import parse_statements
from dpsql.plan.typer import Typer

require_spark()

N_USERS = 150


def people() -> tuple[pa.Table, pa.Table]:
    """Three rows per person, many of them tied at x = 7, and one hostile person (uid 999)."""
    g = np.random.default_rng(5)
    n = 3 * N_USERS
    uid = [int(u) for u in np.repeat(np.arange(N_USERS), 3)] + [999] * 6
    x = [7 if i < n // 3 else int(v) for i, v in enumerate(g.integers(0, 50, n))] + [
        2**63 - 1, -(2**63), 0, 1, 2**62, -1]
    f = [float(v) for v in np.round(g.uniform(0, 100, n), 2)] + [
        float("nan"), float("inf"), float("-inf"), 1.7976931348623157e308, -0.0, 5e-324]
    d = pa.concat_arrays([
        pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=int(k)) for k in g.integers(0, 400, n)], pa.date32()),
        pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31), None], pa.date32()),
        pa.array([-800_000, 3_000_000, -719_163], pa.int32()).cast(pa.date32())])  # 221 BC, year 10183, 31 Dec 1 BC
    ts = [dt.datetime(2024, 1, 1, 3) + dt.timedelta(hours=int(k)) for k in g.integers(0, 5000, n)] + [
        dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None, dt.datetime(1970, 1, 1),
        dt.datetime(1, 1, 1, 0, 0, 1), dt.datetime(9999, 12, 31)]
    s = [f"s{k}" for k in g.integers(0, 5, n)] + ["x" * 100_000, "\x00", "ß", "", None, "\ufffd"]
    rows = pa.table({"uid": pa.array(uid, pa.int64()), "x": pa.array(x, pa.int64()), "f": pa.array(f, pa.float64()),
                     "d": d, "ts": pa.array(ts, pa.timestamp("us")), "s": pa.array(s, pa.string())})
    ids = sorted(set(uid))
    users = pa.table({"id": pa.array(ids, pa.int64()), "region": pa.array([f"r{i % 3}" for i in range(len(ids))])})
    return rows, users


def make(kind: str, parquet: str) -> dpsql.Session:
    s = comparable_session(kind)
    rows, users = people()
    cols: dict[str, dict[str, Any]] = {"x": {"bounds": (0, 50)}, "f": {"bounds": (0, 100)},
            "d": {"bounds": ("2024-01-01", "2025-02-01"), "bin_width": "1 day"},
            "ts": {"bounds": ("2024-01-01", "2024-08-01"), "bin_width": "1 hour"}}
    s.register("users", users, privacy_unit="id", columns={"region": {"domain": ["r0", "r1", "r2"]}})
    s.register("ev", rows, references={"uid": "users.id"}, degree_bounds={"uid": 4}, columns=cols)
    s.register("p", rows, privacy_unit="uid", max_rows_per_unit=3,
               columns={**cols, "s": {"domain": ["s0", "s1", "s2", "s3", "s4"]}})
    # the same rows read by each engine's own Parquet reader (Spark's, not the driver's conversion of Arrow)
    s.register("pq", parquet, privacy_unit="uid", max_rows_per_unit=3,
               columns={**cols, "s": {"domain": ["s0", "s1", "s2", "s3", "s4"]}})
    return s


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = str(tmp_path_factory.mktemp("recent") / "people.parquet")
    pq.write_table(people()[0], path)
    duck, spark = make("duckdb", path), make("spark", path)
    yield duck, spark
    duck.close()
    spark.close()


QUERIES = {
    "comma_join_qualified": "SELECT COUNT(*) AS n FROM ev, users WHERE ev.uid = users.id",
    "comma_join_unqualified_grouped": ("SELECT region, COUNT(*), mean(x) FROM ev, users WHERE uid = id AND (x > 3 OR "
                                       "yearweek(d) > 202401) GROUP BY region"),
    "comma_self_join": "SELECT COUNT(*) AS n, AVG(b.x) AS a FROM p a, p b WHERE a.uid = b.uid AND b.f > 3",
    "comma_join_cross_refused": "SELECT COUNT(*) FROM ev, users WHERE x > 3",
    "aggregate_names": "SELECT mean(x), fsum(f), favg(f), sumkahan(x), kahan_sum(f) FROM p",
    "date_parts_grouped": "SELECT isodow(d) AS k, weekday(ts) AS w, COUNT(*) AS n FROM p GROUP BY k, w",
    "date_parts_where": ("SELECT s, COUNT(*) AS n FROM p WHERE yearweek(d) > 99990000 OR yearweek(ts) < 1000 OR "
                         "weekofyear(d) = 52 OR dayofmonth(ts) = 31 GROUP BY s"),
    "date_add": ("SELECT s, COUNT(*) AS n FROM p WHERE date_add(d, INTERVAL 9000 YEAR) > DATE '2024-06-01' OR "
                 "date_add(ts, INTERVAL -3 HOUR) < TIMESTAMP '2024-01-02 00:00:00' GROUP BY s"),
    "parquet_date_parts_and_shifts": ("SELECT s, COUNT(*) AS n FROM pq WHERE yearweek(d) > 99990000 OR isodow(ts) = 7 "
                                      "OR date_add(d, INTERVAL 9000 YEAR) > DATE '2024-06-01' GROUP BY s"),
    "parquet_min_max_distinct": "SELECT MIN(DISTINCT d) AS lo, MAX(DISTINCT ts) AS hi, MAX(DISTINCT f) AS f FROM pq",
    "min_max_distinct": "SELECT s, MIN(DISTINCT x) AS lo, MAX(DISTINCT f) AS hi FROM p GROUP BY s",
    "tied_median": "SELECT MEDIAN(x) AS m, MIN(DISTINCT d) AS lo FROM p",
    "quantile_distinct_refused": "SELECT QUANTILE(DISTINCT x, 0.5) FROM p",
    "uhugeint_output_refused": "SELECT CAST(COUNT(*) AS UHUGEINT) AS n FROM p",
    "uhugeint_literal_refused": "SELECT COUNT(*) + 200000000000000000000000000000000000000 AS n FROM p",
}


def outcome(s: dpsql.Session, sql: str) -> tuple[Any, ...]:
    spent = s.remaining()
    try:
        t = s.query(sql, epsilon=8.0, delta=1e-5).table
    except DPSQLError as e:
        assert s.remaining() == spent, f"charged, then {type(e).__name__}: {e}"
        return "refused", type(e).__name__, str(e)
    return "answered", [(f.name, str(f.type)) for f in t.schema], sorted(map(repr, t.to_pylist()))


@pytest.mark.parametrize("name", list(QUERIES))
def test_same_answer_or_refusal_on_both_engines(sessions: Any, name: str) -> None:
    duck, spark = sessions
    got, want = outcome(spark, QUERIES[name]), outcome(duck, QUERIES[name])
    assert got == want
    assert got[0] == ("refused" if name.endswith("_refused") else "answered")


DAYS = [-719_162, -719_163, -719_162 - 366 * 5, -800_000, 2_932_896, 2_932_897, 3_000_000, 0, -1, 19_722, None,
        -141_427, -141_428, 10_957, 2_932_531, -719_156, -719_155]
EXPRS = ["yearweek(d)", "yearweek(ts)", "weekofyear(d)", "weekofyear(ts)", "isodow(d)", "isodow(ts)", "weekday(d)",
         "weekday(ts)", "dayofmonth(d)", "dayofmonth(ts)", "date_add(d, INTERVAL 1 MONTH)",
         "date_add(ts, INTERVAL -1 YEAR)", "date_add(d, INTERVAL 3 DAY)", "date_add(ts, INTERVAL 1 SECOND)",
         "date_add(ts, INTERVAL 2 QUARTER)", "yearweek(date_add(d, INTERVAL 1 DAY))"]


def test_date_parts_and_date_add_agree_over_extreme_and_bc_dates() -> None:
    """Years 1 and 9999, BC dates, years beyond 9999 and NULL: every value the same on both engines, in one query."""
    us = [None if v is None else v * 86_400_000_000 + 5 * 3_600_000_000 + 123 for v in DAYS]
    t = pa.table({"i": pa.array(range(len(DAYS)), pa.int64()), "d": pa.array(DAYS, pa.int32()).cast(pa.date32()),
                  "ts": pa.array(us, pa.timestamp("us"))})
    typer = Typer({"i": "BIGINT", "d": "DATE", "ts": "TIMESTAMP"})
    typed = [typer.t(parse_statements(f"SELECT {e}")[0].expressions[0]).expr for e in EXPRS]
    q = exp.select(exp.column("i"), *(exp.alias_(e, f"e{k}") for k, e in enumerate(typed))).from_("v")
    for duck, spark in both_engines(t):
        want = sorted(duck.fetch_arrow(q).to_pylist(), key=lambda r: r["i"])
        assert sorted(spark.fetch_arrow(q).to_pylist(), key=lambda r: r["i"]) == want
        assert sum(r["e0"] is not None for r in want) >= len(DAYS) - 4
