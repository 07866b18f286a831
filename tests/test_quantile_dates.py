"""MIN, MAX, MEDIAN and quantiles over DATE and TIMESTAMP columns (docs/mechanisms.md §9.1, docs/sql.md).

The candidates are the points of the column's declared ordered domain (bounds with ``bin_width`` or
``bins``), the calibration is the numeric one (rank utility over the grid points), and the release
is a DATE (TIMESTAMP) of that grid. Checked here:

* the grid and the calibration of date cases, pinned by numbers computed by hand from the spec;
* zero-noise and seeded answers equal the grid point the numeric path gives on the same data as
  days (seconds) since 1970, NULLs and out-of-range values included (clamped to the bounds, NULL
  left out, as for numbers);
* NULLs, dates far outside the bounds, years 1 and 9999, DuckDB's +-infinity and dates beyond the
  TIMESTAMP range, on DATE, TIMESTAMP, TIMESTAMP_S, _MS and _NS, never make a query raise, and
  clamp to the nearer end of the grid;
* one person changes a group's bounded histogram by at most their kept rows (D vs D minus one);
* the forms still refused are refused before any charge, with the fix.

DuckDB and Spark give the same answers: ``tests/test_spark_dates.py``.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms import quantile as qm
from dpsql.mechanisms.registry import route
from dpsql.testing import seeded_noise, use_noise, zero_noise

EPOCH = dt.date(1970, 1, 1)
LO, HI = dt.date(2019, 1, 1), dt.date(2021, 1, 1)
LO_DAYS, HI_DAYS = (LO - EPOCH).days, (HI - EPOCH).days  # 17897, 18628: 731 days apart

QUERIES = [
    "SELECT region, MIN({c}) AS lo, MEDIAN({c}) AS m, MAX({c}) AS hi FROM orders GROUP BY region",
    "SELECT QUANTILE({c}, 0.9) AS q FROM orders",
    "SELECT PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY {c}) AS q FROM orders",
    "SELECT PERCENTILE_DISC(0.25) WITHIN GROUP (ORDER BY {c} DESC) AS q FROM orders",
    "SELECT MIN({c}) AS lo, MAX({c}) AS hi FROM orders WHERE region = 'n'",
]


def orders(n: int = 3000, seed: int = 4) -> pa.Table:
    """Orders over 2019-2020 with a few outside the bounds (before, after, years 1 and 9999) and NULLs;
    ``d`` the DATE, ``days`` the same values as days since 1970 (BIGINT), ``ts`` / ``secs`` a TIMESTAMP
    of whole seconds and the same as seconds since 1970 (DOUBLE)."""
    g = np.random.default_rng(seed)
    days = LO_DAYS + np.minimum(g.gamma(3.0, 60.0, n).astype(np.int64), 760)
    days[:12] = [LO_DAYS - 1, LO_DAYS - 400, HI_DAYS + 1, HI_DAYS + 9000, -719162, 2932896,  # years 1, 9999
                 LO_DAYS, HI_DAYS, LO_DAYS - 1, HI_DAYS, -719162, 2932896]
    null = np.zeros(n, bool)
    null[12:40] = True
    secs = days * 86400 + g.integers(0, 86400, n)
    return pa.table({
        "uid": pa.array(g.integers(0, n // 2, n)),
        "region": pa.array(np.array(["n", "s", "e"])[g.integers(0, 3, n)]),
        "d": pa.array(days.astype(np.int32), pa.int32(), mask=null).cast(pa.date32()),
        "days": pa.array(days, pa.int64(), mask=null),
        "ts": pa.array(secs * 10**6, pa.int64(), mask=null).cast(pa.timestamp("us")),
        "secs": pa.array(secs.astype(np.float64), pa.float64(), mask=null),
    })


def session(table: pa.Table, noise: Any, **kw: Any) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-5))
    use_noise(s, noise)
    s.register("orders", table, privacy_unit="uid", max_groups_per_unit=2, max_rows_per_group=2, max_rows_per_unit=3,
               columns={"region": {"domain": ["n", "s", "e"]},
                        "d": {"bounds": [LO, HI], "bin_width": "1 day"},
                        "days": {"bounds": (LO_DAYS, HI_DAYS)},
                        "ts": {"bounds": [f"{LO} 00:00:00", f"{HI} 00:00:00"], "bin_width": "1 hour"},
                        "secs": {"bounds": (LO_DAYS * 86400, HI_DAYS * 86400), "granularity": 3600}}, **kw)
    return s


def as_days(v: Any) -> Any:
    return (v - EPOCH).days if isinstance(v, dt.date) else v


def as_secs(v: Any) -> Any:
    return (v - dt.datetime(1970, 1, 1)).total_seconds() if isinstance(v, dt.datetime) else v


# -- grid and calibration, by hand -------------------------------------------------------------------


def test_date_grid_and_calibration_are_pinned() -> None:
    s = session(orders(200), zero_noise())
    p = s.explain("SELECT MIN(d), MEDIAN(d) FROM orders", epsilon=1.0)
    lo_agg, med = p.parameters["aggregates"]
    # 2019-01-01 .. 2021-01-01 by 1 day: 731 steps, 732 candidates (both ends are grid points)
    for a in (lo_agg, med):
        assert (a["lo"], a["hi"], a["grid_step"], a["candidates"]) == ("2019-01-01", "2021-01-01", "1 day", 732)
    # ungrouped, L = 3 rows per person, two aggregates: eps' = 1 / 2; Delta = 3 (MIN), 3 / 2 (median)
    assert p.parameters["epsilon_per_release"] == 0.5
    assert (lo_agg["utility_sensitivity"], med["utility_sensitivity"]) == (3.0, 1.5)
    # t = (2 Delta / eps') ln(732 / (0.05 - 2^-10)) = 4 Delta ln(14931.47...) = 4 Delta * 9.611237...
    assert med["rank_error_95"] == pytest.approx(6 * 9.6112375, rel=1e-6)
    assert lo_agg["rank_error_95"] == pytest.approx(12 * 9.6112375, rel=1e-6)
    assert lo_agg["rank_target"] == 116.0  # ceil(115.33)
    # the same on the numeric path over days since 1970: the same grid size, the same numbers
    q = s.explain("SELECT MIN(days), MEDIAN(days) FROM orders", epsilon=1.0).parameters["aggregates"]
    assert [a["candidates"] for a in q] == [732, 732]
    assert [a["rank_error_95"] for a in q] == [lo_agg["rank_error_95"], med["rank_error_95"]]


def test_timestamp_grid_and_tenfold_coarsening() -> None:
    t = pa.table({"uid": pa.array([1, 2]), "d": pa.array([0, 1], pa.int32()).cast(pa.date32()),
                  "ts": pa.array([0, 1], pa.int64()).cast(pa.timestamp("us"))})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    s.register("t", t, privacy_unit="uid", max_rows_per_unit=1,
               columns={"d": {"bounds": ["0001-01-01", "9999-12-31"], "bin_width": "1 day"},
                        "ts": {"bounds": ["2020-01-01 00:00:00", "2020-01-02 00:00:00"], "bin_width": "15 minutes"}})
    [a] = s.explain("SELECT MEDIAN(d) FROM t", epsilon=1.0).parameters["aggregates"]
    # 3,652,058 days: 1 day and 10 days give more than 100,000 cells, 100 days 36,521 (the last capped at hi)
    assert (a["grid_step"], a["candidates"], a["lo"], a["hi"]) == ("100 days", 36522, "0001-01-01", "9999-12-31")
    [b] = s.explain("SELECT MAX(ts) FROM t", epsilon=1.0).parameters["aggregates"]
    assert (b["grid_step"], b["candidates"]) == ("900 seconds", 97)
    assert (b["lo"], b["hi"]) == ("2020-01-01T00:00:00", "2020-01-02T00:00:00")
    # a DATE grid whose step is not whole days is rounded up to whole days
    s.register("t2", t, privacy_unit="uid", max_rows_per_unit=1,
               columns={"d": {"bounds": ["2020-01-01", "2020-01-11"], "bins": 4}})
    [c] = s.explain("SELECT MEDIAN(d) FROM t2", epsilon=1.0).parameters["aggregates"]
    assert (c["grid_step"], c["candidates"]) == ("3 days", 5)  # 2.5 days -> 3: 01, 04, 07, 10, 11


def test_released_points_are_exact_dates_and_timestamps() -> None:
    grid = qm.ValueGrid("d", 0.0, 0.0, 86400.0 * 100, 36521, "DATE",
                        (dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31)), 86_400_000_000 * 100)
    secs, arr = qm.time_values(grid, np.array([0, 1, 36520, 36521]))
    assert arr.type == pa.date32()
    assert arr.to_pylist() == [dt.date(1, 1, 1), dt.date(1, 4, 11), dt.date(9999, 11, 3), dt.date(9999, 12, 31)]  # 3,652,000 days on
    assert secs[0] == -62135596800.0
    tgrid = qm.ValueGrid("ts", 0.0, 0.0, 0.25, 10, "TIMESTAMP_NS",
                         (dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 1, 0, 0, 2, 400000)), 250_000)
    _, tarr = qm.time_values(tgrid, np.array([0, 3, 10]))
    assert tarr.type == pa.timestamp("us")
    assert tarr.to_pylist() == [dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 1, 0, 0, 0, 750000),
                                dt.datetime(2020, 1, 1, 0, 0, 2, 400000)]  # the last point capped at hi


# -- the numeric path's answers ----------------------------------------------------------------------


@pytest.mark.parametrize("noise", ["zero", "seeded"])
def test_answers_are_the_numeric_paths_grid_points(noise: str) -> None:
    t = orders()
    got: dict[str, list[list[dict[str, Any]]]] = {}
    for col in ("d", "days", "ts", "secs"):
        s = session(t, zero_noise(7) if noise == "zero" else seeded_noise("dates-vs-numbers"))
        got[col] = [s.query(q.format(c=col), epsilon=2.0).table.to_pylist() for q in QUERIES]
    dates = [[{k: as_days(v) for k, v in r.items()} for r in rows] for rows in got["d"]]
    stamps = [[{k: as_secs(v) for k, v in r.items()} for r in rows] for rows in got["ts"]]
    assert dates == got["days"]
    assert stamps == got["secs"]
    assert isinstance(got["d"][0][0]["m"], dt.date) and isinstance(got["ts"][0][0]["m"], dt.datetime)
    if noise == "zero":  # the best grid point: the median day of the kept rows, within 2019-2020
        assert all(LO_DAYS < r["m"] < HI_DAYS for r in dates[0])


def test_release_types_and_post_processing() -> None:
    s = session(orders(600), zero_noise())
    r = s.query("SELECT region, MEDIAN(d) AS m, MAX(ts) AS t FROM orders GROUP BY region "
                "HAVING MEDIAN(d) >= DATE '2019-01-01' ORDER BY m", epsilon=1.0)
    assert r.table.schema.field("m").type == pa.date32() and r.table.schema.field("t").type == pa.timestamp("us")
    assert r.accuracy["m"]["grid_step"] == "1 day" and r.accuracy["t"]["grid_step"] == "3600 seconds"
    span = s.query("SELECT MAX(d) - MIN(d) AS span, year(MEDIAN(d)) AS y FROM orders", epsilon=1.0).table.to_pylist()
    assert isinstance(span[0]["span"], int) and span[0]["y"] in (2019, 2020)
    text = s.query("SELECT CAST(MEDIAN(d) AS VARCHAR) AS m FROM orders", epsilon=1.0).table.to_pylist()[0]["m"]
    assert len(text) == 10 and text.startswith("20")


def test_min_above_max_warning_for_dates() -> None:
    # few kept rows per group: MIN (c-th smallest) and MAX (c-th largest) cross, and the release says so
    s = session(orders(90), zero_noise())
    r = s.query("SELECT region, MIN(d), MAX(d) FROM orders GROUP BY region", epsilon=1.0)
    lo, hi = r.table.column(1).to_pylist(), r.table.column(2).to_pylist()
    crossed = sum(a > b for a, b in zip(lo, hi, strict=True))
    assert crossed > 0
    assert any(f"MIN(d) came out above MAX(d) in {crossed} of 3 groups" in w for w in r.warnings), r.warnings
    # negative control: with many rows per group they do not cross, and nothing is said
    r2 = session(orders(6000), zero_noise()).query("SELECT MIN(d), MAX(d) FROM orders", epsilon=5.0)
    assert r2.table.column(0)[0].as_py() < r2.table.column(1)[0].as_py() and not r2.warnings


# -- extremes: NULL, out of range, years 1 and 9999, infinities, every timestamp precision ----------

EXTREMES = """create table t as select * from (values
 (1, 'infinity'::date, 'infinity'::timestamp, '294000-01-01'::timestamp_s, 'infinity'::timestamp_ns,
     '294000-01-01'::timestamp_ms),
 (2, '-infinity'::date, '-infinity'::timestamp, '-infinity'::timestamp_s, '-infinity'::timestamp_ns,
     '-infinity'::timestamp_ms),
 (3, '5000000-01-01'::date, '0001-01-01'::timestamp, '0001-01-01'::timestamp_s, '1677-09-22'::timestamp_ns,
     '9999-12-31 23:59:59.999'::timestamp_ms),
 (4, '0001-01-01'::date, '9999-12-31 23:59:59.999999'::timestamp, '9999-12-31 23:59:59'::timestamp_s,
     '2262-04-11'::timestamp_ns, '0001-01-01'::timestamp_ms),
 (5, '9999-12-31'::date, '2020-06-01 12:00'::timestamp, '2020-06-01 12:00'::timestamp_s,
     '2020-06-01 12:00'::timestamp_ns, '2020-06-01 12:00'::timestamp_ms),
 (6, NULL, NULL, NULL, NULL, NULL),
 (7, '2020-03-01'::date, '2020-03-01'::timestamp, '2020-03-01'::timestamp_s, '2020-03-01'::timestamp_ns,
     '2020-03-01'::timestamp_ms),
 (8, '-5000000-01-01'::date, '-200000-01-01'::timestamp, '-290000-01-01'::timestamp_s,
     '1677-09-21 00:12:44'::timestamp_ns, '200000-01-01'::timestamp_ms),
 (9, '2020-12-31'::date, '2020-12-31 23:59:59'::timestamp, '2019-01-01 00:00:00'::timestamp_s,
     '2019-01-01 00:00:00.000000001'::timestamp_ns, '2019-01-01 00:00:00.001'::timestamp_ms)
) v(uid, d, ts, tss, tns, tms)"""
TIME_COLUMNS = {"d": "DATE", "ts": "TIMESTAMP", "tss": "TIMESTAMP_S", "tns": "TIMESTAMP_NS", "tms": "TIMESTAMP_MS"}
HALF = ["2019-01-01 00:00:00.5", "2021-01-01 00:00:00"]  # lo finer than a TIMESTAMP_S / _MS holds


def expected_points(values: list[Any], lo: dt.datetime) -> dict[int, int]:
    """The grid point of each non-NULL value, computed here (+-infinity as Python's extremes)."""
    out: dict[int, int] = {}
    for v in values:
        if v is None:
            continue
        if isinstance(v, str):  # DuckDB prints a year beyond 9999 as text
            v = dt.datetime.max if not v.startswith("-") and "(BC)" not in v else dt.datetime.min
        if not isinstance(v, dt.datetime):
            v = dt.datetime(v.year, v.month, v.day)
        if v < lo:
            b = 0
        elif v > dt.datetime(2021, 1, 1):
            b = 731
        else:
            b = math.floor((v - lo) / dt.timedelta(days=1) + 0.5)
        out[b] = out.get(b, 0) + 1
    return out


@pytest.mark.parametrize("col", TIME_COLUMNS)
def test_grid_index_clamps_every_value_of_every_precision(col: str) -> None:
    """On the stored values themselves (DuckDB's own table, no source view): +-infinity, dates beyond
    the TIMESTAMP range, TIMESTAMP_S/_MS beyond it, TIMESTAMP_NS at its ends clamp to the nearer end
    of the grid, NULL is in no point, and nothing raises."""
    from dpsql.rewrite.bound import ValueGrid, grid_index

    con = duckdb.connect()
    con.execute(EXTREMES)
    typ = TIME_COLUMNS[col]
    lo = dt.datetime.fromisoformat(HALF[0]) if typ in ("TIMESTAMP_S", "TIMESTAMP_MS") else dt.datetime(2019, 1, 1)
    hi = dt.datetime(2021, 1, 1)
    grid = ValueGrid(col, qm.micros(lo) / 1e6, qm.micros(hi) / 1e6, 86400.0, 731, typ, (lo, hi), qm.DAY_MICROS)
    sql = exp_sql(grid_index(grid))
    assert con.execute(f"SELECT typeof({col}) FROM t LIMIT 1").fetchone()[0] == typ
    got = dict(con.execute(f"SELECT b, COUNT(*) FROM (SELECT {sql} AS b FROM t) WHERE b IS NOT NULL GROUP BY b").fetchall())
    values = [v for (v,) in con.execute(f"SELECT CASE WHEN isinf({col}) THEN NULL ELSE {col} END FROM t").fetchall()]
    infinite = con.execute(f"SELECT COUNT(*) FILTER (WHERE isinf({col}) AND {col} > '2000-01-01'), "
                           f"COUNT(*) FILTER (WHERE isinf({col}) AND {col} < '2000-01-01') FROM t").fetchone()
    want = expected_points([v for v in values if v is not None], lo)
    want[731] = want.get(731, 0) + infinite[0]
    want[0] = want.get(0, 0) + infinite[1]
    assert got == {k: v for k, v in want.items() if v}, (got, want)
    assert sum(got.values()) == 8 and got[0] >= 3 and got[731] >= 2


def exp_sql(e: Any) -> str:
    return e.sql(dialect="duckdb")


@pytest.fixture(scope="module")
def extremes() -> dpsql.Session:
    con = duckdb.connect()
    con.execute(EXTREMES)
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 0.0), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid", max_rows_per_unit=1,
               columns={"d": {"bounds": [LO, HI], "bin_width": "1 day"}, "ts": {"bounds": [LO, HI], "bin_width": "1 day"},
                        "tss": {"bounds": HALF, "bin_width": "1 day"}, "tns": {"bounds": [LO, HI], "bin_width": "1 day"},
                        "tms": {"bounds": HALF, "bin_width": "1 day"}})
    return s


@pytest.mark.parametrize("col", TIME_COLUMNS)
def test_session_reads_extremes_as_the_source_view_gives_them(extremes: dpsql.Session, col: str) -> None:
    """Through a session the source view reads every precision as TIMESTAMP and a value beyond
    290000 BC .. 294000 AD (+-infinity too) as NULL (docs/threat_model.md): such a row is left out as
    NULL is; every other value (years 1, 9999, 200000 BC) clamps to the nearer end."""
    r = route(f"SELECT MEDIAN({col}) FROM t", 1.0, 0.0, {}, extremes.tables, lambda k: None)
    sql = extremes._engine.render(r.mechanism.bounded(r.calibration, "salt", extremes._engine.ops))
    con = extremes._engine._con
    got = {b: n for _, b, n in con.execute(sql).fetchall()}
    view = extremes.tables["t"].view
    values = [v for (v,) in con.execute(f"SELECT {col} FROM {view}").fetchall()]
    lo = dt.datetime.fromisoformat(HALF[0]) if col in ("tss", "tms") else dt.datetime(2019, 1, 1)
    assert got == expected_points(values, lo)
    assert got[0] >= 1 and got[731] >= 1


@pytest.mark.parametrize("col", TIME_COLUMNS)
@pytest.mark.parametrize("fn", ["MIN({c})", "MAX({c})", "MEDIAN({c})", "QUANTILE({c}, 0.999)"])
def test_extremes_never_raise(extremes: dpsql.Session, col: str, fn: str) -> None:
    v = extremes.query(f"SELECT {fn.format(c=col)} AS v FROM t", epsilon=1.0).table.column("v")[0].as_py()
    got = v if isinstance(v, dt.datetime) else dt.datetime(v.year, v.month, v.day)
    assert dt.datetime(2019, 1, 1) <= got <= dt.datetime(2021, 1, 1)


# -- one person's effect -----------------------------------------------------------------------------


def test_one_person_moves_a_group_histogram_by_their_kept_rows() -> None:
    t = orders(800, seed=11)
    removed = int(t.column("uid")[50].as_py())
    without = t.filter(np.asarray(t.column("uid").to_numpy()) != removed)
    hists = []
    for table in (t, without):
        s = session(table, zero_noise(3))
        r = route("SELECT region, MEDIAN(d) FROM orders GROUP BY region", 1.0, 0.0, {}, s.tables, lambda k: None)
        sql = s._engine.render(r.mechanism.bounded(r.calibration, "fixed-salt", s._engine.ops))
        rows = s._engine._con.execute(sql).fetchall()
        hists.append({(k, b): n for k, _, b, n in rows})
    keys = set(hists[0]) | set(hists[1])
    diff: dict[str, int] = {}
    for k, b in keys:
        diff[k] = diff.get(k, 0) + abs(hists[0].get((k, b), 0) - hists[1].get((k, b), 0))
    # k = 2 rows per group, C = 2 groups, L = 3 rows: at most 2 rows in a group, 3 in all
    assert max(diff.values()) <= 2 and sum(diff.values()) <= 3
    assert sum(diff.values()) >= 1  # negative control: the removed person had a kept row


# -- refusals, before any charge ---------------------------------------------------------------------


def free(s: dpsql.Session, sql: str, cls: type, **kw: Any) -> str:
    before, rows = s.remaining(), s.history().num_rows
    for run in (s.query, s.explain):
        with pytest.raises(cls) as ei:
            run(sql, epsilon=1.0, **kw)
    assert s.remaining() == before and s.history().num_rows == rows
    return str(ei.value) + " " + str(getattr(ei.value, "hint", "") or "")


def test_forms_still_refused_are_free() -> None:
    con = duckdb.connect()
    con.execute("create table r as select 1 as uid, date '2020-01-01' as d, date '2020-01-01' as e, "
                "date '2020-01-01' as f, timestamptz '2020-01-01 00:00:00+00' as z")
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0), connection=con)
    s.register("r", "r", privacy_unit="uid", max_rows_per_unit=1,
               columns={"e": {"bounds": (0, 100)},  # numeric bounds on a DATE column: no date grid
                        "f": {"bounds": ["2020-01-01 12:00:00", "2021-01-01 00:00:00"], "bin_width": "1 day"}})
    m = free(s, "SELECT MIN(d) FROM r", PolicyError)
    assert "needs its date bounds and grid declared" in m and "'bin_width': '1 day'" in m
    assert "declares numeric bounds only for 'e'" in free(s, "SELECT MEDIAN(e) FROM r", PolicyError)
    assert "not whole days" in free(s, "SELECT MAX(f) FROM r", PolicyError)
    assert "MIN needs a numeric, DATE or TIMESTAMP column" in free(s, "SELECT MIN(z) FROM r", UnsupportedQueryError)
    assert "plain column" in free(s, "SELECT MIN(d + 1) FROM r", UnsupportedQueryError)
    s.register("o", orders(50), privacy_unit="uid", max_rows_per_unit=1,
               columns={"d": {"bounds": [LO, HI], "bin_width": "1 day"}})
    assert "answered by the exponential mechanism" in free(s, "SELECT MEDIAN(d) FROM o", PolicyError, options={"reuse": "synopsis"})
    # date bounds without a grid are refused at registration, naming the fix
    with pytest.raises(ConfigError) as ei:
        s.register("o2", orders(50), privacy_unit="uid", max_rows_per_unit=1, columns={"d": {"bounds": [LO, HI]}})
    assert "'bin_width': '1 day'" in str(ei.value.hint)
    assert math.isclose(s.remaining().epsilon, 10.0)


def test_bounds_with_a_utc_offset_are_refused_at_registration() -> None:
    """A DATE / TIMESTAMP column holds no UTC offset: date bounds written with one are refused when
    the column is registered, saying so (they were accepted, and then MEDIAN over a TIMESTAMP column
    raised a TypeError, over a DATE column said 'not whole days'; one aware and one naive bound
    raised a TypeError at registration)."""
    t = pa.table({"uid": pa.array([1, 2]), "d": pa.array([0, 1], pa.int32()).cast(pa.date32()),
                  "ts": pa.array([0, 1], pa.int64()).cast(pa.timestamp("us"))})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    for col, bounds in (("ts", ["2019-01-01T00:00:00+05:00", "2021-01-01T00:00:00+05:00"]),
                        ("d", ["2019-01-01T00:00:00+00:00", "2021-01-01T00:00:00+00:00"]),
                        ("ts", [dt.datetime(2019, 1, 1, tzinfo=dt.UTC), "2021-01-01"])):
        with pytest.raises(ConfigError) as ei:
            s.register("t", t, privacy_unit="uid", max_rows_per_unit=1,
                       columns={col: {"bounds": bounds, "bin_width": "1 day"}})
        assert "UTC offset" in str(ei.value) and "2019-01-01" in str(ei.value.hint), (str(ei.value), ei.value.hint)
    # negative control: the same bounds without an offset are a grid
    s.register("t", t, privacy_unit="uid", max_rows_per_unit=1,
               columns={"ts": {"bounds": ["2019-01-01", "2021-01-01"], "bin_width": "1 day"}})
    assert s.explain("SELECT MEDIAN(ts) FROM t", epsilon=1.0).parameters["aggregates"][0]["candidates"] == 732


@pytest.mark.parametrize("bins", [0, -3])
def test_a_date_grid_needs_at_least_one_bin(bins: int) -> None:
    """``bins`` of a date / timestamp domain is refused at registration as a numeric one is (0 was
    a ZeroDivisionError; -3 made a grid of 1 microsecond, coarsened, unlike anything declared)."""
    t = pa.table({"uid": pa.array([1]), "ts": pa.array([0], pa.int64()).cast(pa.timestamp("us"))})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    with pytest.raises(ConfigError, match="bins for 't.ts' must be between 1 and"):
        s.register("t", t, privacy_unit="uid", max_rows_per_unit=1,
                   columns={"ts": {"bounds": ["2019-01-01", "2021-01-01"], "bins": bins}})
    s.register("t", t, privacy_unit="uid", max_rows_per_unit=1,  # negative control
               columns={"ts": {"bounds": ["2019-01-01", "2021-01-01"], "bins": 2}})


def test_grid_coarsens_past_100000_cells_as_the_numeric_grid_does() -> None:
    """Exactly 100,000 one-day cells stay (100,001 candidates); one day more coarsens tenfold (10 days,
    10,001 cells: the last one capped at hi), as an integer column with bounds (0, 100000) and
    (0, 100001) does."""
    t = pa.table({"uid": pa.array([1]), "d": pa.array([0], pa.int32()).cast(pa.date32()), "x": pa.array([0])})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 0.0))
    lo = dt.date(1800, 1, 1)
    for days, step, candidates in ((100_000, "1 day", 100_001), (100_001, "10 days", 10_002)):
        s.register("t", t, privacy_unit="uid", max_rows_per_unit=1,
                   columns={"d": {"bounds": [lo, lo + dt.timedelta(days=days)], "bin_width": "1 day"},
                            "x": {"bounds": (0, days)}})
        [a] = s.explain("SELECT MEDIAN(d) FROM t", epsilon=1.0).parameters["aggregates"]
        [b] = s.explain("SELECT MEDIAN(x) FROM t", epsilon=1.0).parameters["aggregates"]
        assert (a["grid_step"], a["candidates"]) == (step, candidates)
        assert b["candidates"] == candidates and b["rank_error_95"] == a["rank_error_95"]


@pytest.mark.parametrize("shift", ["d + INTERVAL '١' DAY", "d - INTERVAL '１٢' MONTH", "d + INTERVAL '٣ days'",
                                   "d + INTERVAL '\u00a01' DAY", "DATE '2020-01-01' + INTERVAL '١' DAY"])
def test_interval_counts_are_ascii_digits(shift: str) -> None:
    """DuckDB reads an INTERVAL's count as ASCII digits and spaces only ('١', an Arabic-Indic one, and
    a no-break space are conversion errors there): dpsql, which computes the shift itself, refuses
    other digits and spaces for free rather than give them a meaning DuckDB does not."""
    con = duckdb.connect()
    with pytest.raises(duckdb.ConversionException):
        con.execute("SELECT TIMESTAMP '2020-01-01' + INTERVAL '١' DAY").fetchall()
    s = session(orders(50), zero_noise())
    m = free(s, f"SELECT COUNT(*) FROM orders WHERE {shift} > ts", UnsupportedQueryError, delta=1e-6)
    assert "whole number of one unit" in m
    # negative control: ASCII digits are a shift
    ascii_shift = shift.translate(str.maketrans({"١": "1", "１": "1", "٢": "2", "٣": "3", "\u00a0": " "}))
    s.query(f"SELECT COUNT(*) FROM orders WHERE {ascii_shift} > ts", epsilon=1.0, delta=1e-6)


def test_a_person_beyond_the_grid_ends_moves_only_the_end_points_by_their_kept_rows() -> None:
    """The privacy claim at the clamps: each person holding a value beyond the bounds (a day before lo,
    400 days before, years 1 and 9999, after hi) changes a group's histogram by at most their kept rows
    (k = 2 in a group, L = 3 in all) when removed, and only at the ends of the grid (0, 731) and at the
    points of their own in-range values -- the clamp gives their extreme value no other weight."""
    t = orders(800, seed=11)
    uids = np.asarray(t.column("uid").to_numpy())
    days = np.asarray(t.column("days").to_numpy(zero_copy_only=False))
    extreme = sorted({int(u) for u in uids[:12]})

    def hist(table: pa.Table) -> dict[tuple[str, int], int]:
        s = session(table, zero_noise(3))
        r = route("SELECT region, MEDIAN(d) FROM orders GROUP BY region", 1.0, 0.0, {}, s.tables, lambda k: None)
        sql = s._engine.render(r.mechanism.bounded(r.calibration, "fixed-salt", s._engine.ops))
        return {(k, b): n for k, _, b, n in s._engine._con.execute(sql).fetchall()}

    full = hist(t)
    moved_ends = 0
    for u in extreme:
        mine = uids == u
        own = {int(d) - LO_DAYS for d in days[mine] if LO_DAYS <= d <= HI_DAYS}
        other = hist(t.filter(~mine))
        diff: dict[str, int] = {}
        for k, b in set(full) | set(other):
            change = abs(full.get((k, b), 0) - other.get((k, b), 0))
            if change:
                assert b in (0, 731) or b in own, (u, k, b)
                moved_ends += b in (0, 731)
                diff[k] = diff.get(k, 0) + change
        assert max(diff.values(), default=0) <= 2 and sum(diff.values()) <= 3, (u, diff)
    assert moved_ends > 0  # negative control: some of them had a kept row clamped to an end


def test_reuse_of_a_synopsis_is_refused_for_a_date_column_saying_why() -> None:
    """A date grid's quantile is never read from a stored histogram: ``reuse='synopsis'`` is refused
    for free saying so, also after the column's DAWA histogram was released (the refusal said no
    synopsis covered the quantile and hinted to release that histogram first: following the hint
    spent budget and changed nothing)."""
    s = session(orders(600), zero_noise())
    s.query("SELECT d, COUNT(*) FROM orders GROUP BY d", epsilon=1.0)  # the DAWA histogram of the date grid
    m = free(s, "SELECT MEDIAN(d) FROM orders", PolicyError, options={"reuse": "synopsis"})
    assert "DATE" in m and "release the histogram first" not in m, m
    # negative control: a numeric column with an ordered domain is still read from its synopsis
    s.register("n", pa.table({"uid": pa.array(range(300)), "x": pa.array([i % 50 for i in range(300)])}),
               privacy_unit="uid", max_rows_per_unit=1, columns={"x": {"bounds": (0, 49), "bins": 50}}, version="v1")
    s.query("SELECT x, COUNT(*) FROM n GROUP BY x", epsilon=1.0)
    assert s.query("SELECT MEDIAN(x) FROM n", epsilon=1.0, options={"reuse": "synopsis"}).cost.epsilon == 0.0
