"""Date and time functions on Spark: the typer's expressions (DuckDB's meaning) lowered to Spark give
the same values as DuckDB on edge cases -- NULLs, 1969/1970 around the epoch, negative instants
with a fraction of a second, leap days, ISO weeks 52/53 and ISO years around New Year, years 1 and
9999, BC dates (astronomical years), the extremes of the TIMESTAMP range and DuckDB's infinite
values (NULL parts) -- and the same zero-noise answers through whole queries. Parts and units
whose conventions differ (decade, century, millennium, strftime/strptime formats) are refused for
free. Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import sqlglot
from _spark import comparable_session, require_spark
from sqlglot import exp

import dpsql
from dpsql.engine import EngineSettings
from dpsql.errors import UnsupportedQueryError
from dpsql.plan.typer import Typer

require_spark()

DAYS = [0, -1, 19782, 18627, 18630, 18631, 18260, 18992, 20088, -719162, -719163, -719528, -740000, 2932896, 11016,
        -100000000, 2**31 - 1, -(2**31 - 1), -106639487, -106639488, 106661767, 106661768, None]
MICROS = [0, -500000, 1709208599123456, -62135596800000001, -62135596800000000, 253402300799999999,
          -9000000000000000000, 9223372036854775806, -9223371158400000000, -9223371158400000001, 1609459199999999,
          1609459200000000, 951782400000001, -86400000000 * 3 - 1, 2**63 - 1, -(2**63 - 1), 1234567, 1e15,
          -9213651676800000000, -9213651676800000001, 9215576668800000000, 9215576668800000001, None]
PARTS = ["year", "month", "day", "quarter", "week", "dayofweek", "dow", "isodow", "dayofyear", "doy", "isoyear",
         "yearweek", "hour", "minute", "second", "millisecond", "microsecond", "epoch", "weekday", "weekofyear",
         "years", "months", "days", "hours", "minutes", "seconds", "milliseconds", "microseconds"]
TRUNC_UNITS = ["microsecond", "millisecond", "second", "minute", "hour", "day", "week", "month", "quarter", "year"]
FUNCS = ["year", "month", "day", "quarter", "dayofweek", "dayofyear", "week", "hour", "minute", "second"]


def edge_table() -> pa.Table:
    n = len(DAYS)
    assert len(MICROS) == n
    micros = [None if v is None else int(v) for v in MICROS]
    return pa.table({"d": pa.array(DAYS, pa.int32()).cast(pa.date32()),
                     "ts": pa.array(micros, pa.int64()).cast(pa.timestamp("us")),
                     "i": pa.array(range(n), pa.int64())})


def expressions() -> list[str]:
    out = []
    for col in ("d", "ts"):
        out += [f"date_part('{p}', {col})" for p in PARTS]
        out += [f"extract({p} FROM {col})" for p in ("year", "month", "isodow", "epoch", "second")]
        out += [f"{f}({col})" for f in FUNCS]
        out += [f"date_trunc('{u}', {col})" for u in TRUNC_UNITS]
    return out


@pytest.fixture(scope="module")
def engines() -> Any:
    from dpsql.engine.duckdb import DuckDBBackend
    from dpsql.engine.spark import SparkBackend

    t = edge_table()
    duck, spark = DuckDBBackend(None, EngineSettings()), SparkBackend(None, EngineSettings())
    duck.register_source("t", "arrow", t, view="v")
    spark.register_source("t", "arrow", t, view="v")
    yield duck, spark
    duck.close()
    spark.close()


def _plain(t: pa.Table) -> pa.Table:
    """Timestamps as their microseconds since 1970 (Python's datetime holds years 1..9999 only)."""
    cols = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in t.columns]
    return pa.table(cols, names=t.column_names)


def typed(sql: str) -> exp.Expression:
    node = sqlglot.parse_one(f"SELECT {sql}", read="duckdb").expressions[0]
    return Typer({"d": "DATE", "ts": "TIMESTAMP", "i": "BIGINT"}).t(node).expr


def test_every_date_function_gives_duckdbs_values_on_spark(engines: Any) -> None:
    duck, spark = engines
    exprs = expressions()
    q = exp.select(exp.column("i"), *[exp.alias_(typed(e), f"c{k}") for k, e in enumerate(exprs)]).from_("v")
    d = sorted(_plain(duck.fetch_arrow(q)).to_pylist(), key=lambda r: r["i"])
    s = sorted(_plain(spark.fetch_arrow(q)).to_pylist(), key=lambda r: r["i"])
    assert len(d) == len(s) == len(DAYS)
    bad = []
    for k, e in enumerate(exprs):
        col = f"c{k}"
        dv, sv = [r[col] for r in d], [r[col] for r in s]
        if e.startswith("date_trunc"):  # DuckDB keeps +-infinity (not a value Spark has): NULL there
            dv = [None if v is not None and abs(v) == 2**63 - 1 else v for v in dv]
        if dv != sv:
            bad.append((e, [(i, a, b) for i, (a, b) in enumerate(zip(dv, sv, strict=True)) if a != b][:3]))
    assert not bad, bad
    # negative control: Spark's own dayofweek numbers the days otherwise (Sunday = 1), so the
    # comparison can fail; the lowering's spelling is what makes them equal
    raw = exp.Anonymous(this="dayofweek", expressions=[exp.column("d")])
    raw.meta["dpsql_dialect"] = "spark"
    native = sorted(spark.fetch_arrow(exp.select("i", exp.alias_(raw, "w")).from_("v")).to_pylist(), key=lambda r: r["i"])
    k = exprs.index("dayofweek(d)")
    assert [r["w"] for r in native] != [r[f"c{k}"] for r in d]
    # not vacuous: the values vary, NULL in, NULL out, and infinities give NULL parts
    assert len({r["c0"] for r in d}) > 10 and d[-1]["c0"] is None and d[DAYS.index(2**31 - 1)]["c0"] is None
    assert d[DAYS.index(106661767)]["c0"] is not None and d[DAYS.index(106661768)]["c0"] is None


SHIFTS = ["d + INTERVAL 30 DAY", "d - INTERVAL 1 MONTH", "ts + INTERVAL 1 MONTH", "ts - INTERVAL 13 MONTH",
          "INTERVAL 2 WEEK + ts", "ts + INTERVAL '2 hours'", "ts - INTERVAL '-45' SECOND", "d + INTERVAL 1 YEAR",
          "ts - INTERVAL 3 QUARTER", "ts + INTERVAL 1 MONTH - INTERVAL 2 DAY", "d + INTERVAL 9000 YEAR",
          "ts + INTERVAL 4000000 DAY", "d - INTERVAL 90 MINUTE"]


def test_interval_shifts_of_a_column_give_duckdbs_values_on_spark(engines: Any) -> None:
    """``col +/- INTERVAL n unit`` (``Typer._shift_value``): the same instant on both engines for every
    edge value (years 1 and 9999, month ends, around 1970), and NULL on both where the instant or its
    shift leaves years 1..9999 (beyond both, DuckDB's infinities) -- never an error."""
    duck, spark = engines
    q = exp.select(exp.column("i"), *[exp.alias_(typed(e), f"c{k}") for k, e in enumerate(SHIFTS)]).from_("v")
    d = sorted(_plain(duck.fetch_arrow(q)).to_pylist(), key=lambda r: r["i"])
    s = sorted(_plain(spark.fetch_arrow(q)).to_pylist(), key=lambda r: r["i"])
    assert d == s
    values = [[r[f"c{k}"] for r in d] for k in range(len(SHIFTS))]
    assert all(any(v is None for v in col) and any(v is not None for v in col) for col in values[:-3]), values
    assert all(v is None for v in values[-2])  # 4,000,000 days leave years 1..9999 from every instant
    # 2024-02-29 (day 19782) + 30 days; 2020-12-31 (18627) - 1 month = 2020-11-30 (a month end clamps)
    day_us = 86_400_000_000
    assert values[0][DAYS.index(19782)] == (19782 + 30) * day_us
    assert values[1][DAYS.index(18627)] == (18627 - 31) * day_us


def test_a_date_plus_whole_days_gives_duckdbs_values_on_spark(engines: Any) -> None:
    """``d +/- n`` of an integer literal (``Typer._date_days``): the DATE n days later on both engines, NULL on both
    where the date or its shift leaves years 1..9999."""
    duck, spark = engines
    shifts = ["d + 30", "d - 1", "7 + d", "d + 3660000"]
    q = exp.select(exp.column("i"), *[exp.alias_(typed(e), f"c{k}") for k, e in enumerate(shifts)]).from_("v")
    d = sorted(_plain(duck.fetch_arrow(q)).to_pylist(), key=lambda r: r["i"])
    assert d == sorted(_plain(spark.fetch_arrow(q)).to_pylist(), key=lambda r: r["i"])
    assert any(r["c0"] is not None for r in d) and all(r["c3"] is None for r in d)


def test_refused_parts_and_formats_are_free_errors() -> None:
    from dpsql.engine.spark_ops import lower_for_spark

    for sql in ("date_part('decade', d)", "date_part('century', ts)", "extract(millennium FROM d)",
                "date_trunc('decade', ts)", "date_trunc('isoyear', d)", "strftime(d, '%Y')",
                "strptime('2024', '%Y') > ts"):
        with pytest.raises(UnsupportedQueryError, match="Spark"):
            lower_for_spark(exp.select(typed(sql)).from_("v"))
    # negative control: the same lowering accepts a supported part
    lower_for_spark(exp.select(typed("date_part('year', d)")).from_("v"))


def _session(kind: str, t: pa.Table) -> dpsql.Session:
    s = comparable_session(kind, (1000.0, 0.5), 31)
    s.register("events", t, privacy_unit="user_id", max_groups_per_unit=3, max_rows_per_group=2, max_rows_per_unit=8,
               columns={"amount": {"bounds": (0, 100)}})
    return s


DATE_QUERIES = [
    "SELECT year(day) AS y, COUNT(*) AS n FROM events GROUP BY y",
    "SELECT date_trunc('week', ts) AS w, COUNT(*) AS n, SUM(amount) AS s FROM events GROUP BY w",
    "SELECT extract(isodow FROM day) AS dow, COUNT(*) AS n FROM events GROUP BY dow",
    "SELECT COUNT(*) AS n FROM events WHERE date_part('hour', ts) BETWEEN 9 AND 17 AND month(day) IN (1, 12)",
    "SELECT date_trunc('month', day) AS m, COUNT(*) AS n FROM events WHERE week(ts) >= 2 GROUP BY m",
]


def test_zero_noise_date_queries_are_the_same_on_duckdb_and_spark() -> None:
    g = np.random.default_rng(9)
    n = 3000
    users = g.integers(0, 300, n)
    base = np.datetime64("2023-12-20T00:00:00", "us")
    ts = base + g.integers(0, 40 * 86400 * 10**6, n).astype("timedelta64[us]")
    t = pa.table({"user_id": users, "ts": pa.array(ts, pa.timestamp("us")),
                  "day": pa.array(ts.astype("datetime64[D]"), pa.date32()), "amount": g.uniform(0, 120, n).round(2)})
    got = []
    for kind in ("duckdb", "spark"):
        s = _session(kind, t)
        try:
            got.append([sorted(map(repr, s.query(q, epsilon=1.0, delta=1e-5).table.to_pylist())) for q in DATE_QUERIES])
        finally:
            s.close()
    assert got[0] == got[1]
    assert all(len(r) > 0 for r in got[0])


def test_date_quantiles_are_the_same_on_duckdb_and_spark() -> None:
    """MIN / MEDIAN / MAX / QUANTILE over a DATE and a TIMESTAMP column (the grid of their declared
    ordered domains): the same zero-noise points on both engines, with the edge values of DAYS and
    MICROS (years 1 and 9999, beyond both, NULL) among ordinary rows: clamped to the grid's ends (or
    NULL where the source reads them so) alike."""
    g = np.random.default_rng(12)
    n = 400
    day = 18262 + g.integers(0, 400, n)  # 2020-01-01 onwards
    micros = day * 86_400_000_000 + g.integers(0, 86_400, n) * 1_000_000
    k = len(DAYS)
    day_list: list[Any] = [int(v) for v in day]
    micro_list: list[Any] = [int(v) for v in micros]
    day_list[:k], micro_list[:k] = DAYS, MICROS
    t = pa.table({"user_id": g.integers(0, 150, n), "g": np.array(["a", "b"])[g.integers(0, 2, n)],
                  "day": pa.array(day_list, pa.int32()).cast(pa.date32()),
                  "ts": pa.array(micro_list, pa.int64()).cast(pa.timestamp("us"))})
    # grids reaching years 1 and 9999 (their literals and conversions at the ends of the range), one of
    # a step that is no whole second (7 bins of sub-second bounds), over values spread across the years
    wide = g.integers(-719162, 2932897, n)
    wide_list: list[Any] = [int(v) for v in wide]
    wide_micros: list[Any] = [int(v) * 86_400_000_000 + int(w) for v, w in zip(wide, g.integers(0, 86_400_000_000, n),
                                                                             strict=True)]
    wide_list[:k], wide_micros[:k] = DAYS, MICROS
    t = t.append_column("wide", pa.array(wide_list, pa.int32()).cast(pa.date32()))
    t = t.append_column("wts", pa.array(wide_micros, pa.int64()).cast(pa.timestamp("us")))
    queries = ["SELECT g, MIN(day) AS lo, MEDIAN(day) AS m, MAX(day) AS hi FROM events GROUP BY g",
               "SELECT QUANTILE(ts, 0.9) AS q, MIN(ts) AS lo, MEDIAN(wide) AS w, QUANTILE(wts, 0.3) AS wt FROM events"]
    got = []
    for kind in ("duckdb", "spark"):
        s = comparable_session(kind, (1000.0, 0.5), 31)
        s.register("events", t, privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=2,
                   max_rows_per_unit=3,
                   columns={"day": {"bounds": ["2020-01-01", "2021-01-01"], "bin_width": "1 day"},
                            "ts": {"bounds": ["2020-01-01 00:00:00", "2021-01-01 00:00:00"], "bin_width": "1 hour"},
                            "wide": {"bounds": ["0001-01-01", "9999-12-31"], "bin_width": "1 day"},
                            "wts": {"bounds": ["0001-01-01 00:00:00.000001", "9999-12-31 23:59:59.999999"], "bins": 7},
                            "g": {"domain": ["a", "b"]}})
        try:
            got.append([s.query(q, epsilon=4.0).table.to_pylist() for q in queries])
        finally:
            s.close()
    assert got[0] == got[1]
    medians = [r["m"] for r in got[0][0]]
    assert all(dt.date(2020, 1, 1) < m < dt.date(2021, 1, 1) for m in medians), medians
    assert isinstance(got[0][1][0]["q"], dt.datetime)
    assert dt.date(1000, 1, 1) < got[0][1][0]["w"] < dt.date(9000, 1, 1) and got[0][1][0]["wt"].microsecond != 0


def test_dates_and_timestamps_as_text_and_their_keyed_hash_are_duckdbs_on_spark(engines: Any) -> None:
    """Spark spells a year before 1 astronomically ('-0095-08-15', '0000-01-01') and a year after 9999
    with a '+' ('+10000-01-01'); DuckDB writes '0096-08-15 (BC)', '0001-01-01 (BC)' and '10000-01-01'
    (a timestamp's ' (BC)' before its time). A released key ``CAST(d AS VARCHAR)`` was spelled otherwise
    on Spark. (The portable keyed hash hashes Spark's own text: such years hash apart across engines, as
    documented in dpsql.engine.portable; years 1 .. 9999 hash alike.) Infinite values (DuckDB only: Spark's reader makes them NULL) are left out."""
    from dpsql.engine.portable import PortableDuckDBOps
    from dpsql.engine.spark_ops import SparkOps

    duck, spark = engines
    exprs = ["CAST(d AS VARCHAR)", "CAST(ts AS VARCHAR)", "TRY_CAST(d AS VARCHAR)", "TRY_CAST(ts AS VARCHAR)",
             "CAST(i AS VARCHAR)"]
    cols = [exp.alias_(typed(e), f"c{k}") for k, e in enumerate(exprs)]

    def rows(backend: Any, ops: Any) -> list[dict[str, Any]]:
        hashes = [exp.alias_(ops.keyed_hash([c], "s4lt"), f"h_{c}") for c in ("d", "ts")]
        q = exp.select(exp.column("i"), *cols, *hashes).from_("v")
        return sorted(backend.fetch_arrow(q).to_pylist(), key=lambda r: r["i"])

    d, s = rows(duck, PortableDuckDBOps()), rows(spark, SparkOps())
    assert len(d) == len(s) == len(DAYS)
    kept = [k for k, r in enumerate(d) if "infinity" not in str(r["c0"]) + str(r["c1"])]
    assert len(kept) >= len(DAYS) - 6
    for k in kept:
        text_d = {c: v for c, v in d[k].items() if not c.startswith("h_")}
        text_s = {c: v for c, v in s[k].items() if not c.startswith("h_")}
        assert text_d == text_s, (DAYS[k], MICROS[k], d[k], s[k])
        if d[k]["c0"] is not None and d[k]["c0"][:4].isdigit() and d[k]["c0"][4] == "-" and "(BC)" not in d[k]["c0"]:
            # years 1 .. 9999: the same text, so the same portable hash (other years hash apart across
            # engines: dpsql.engine.portable)
            assert d[k]["h_d"] == s[k]["h_d"], (DAYS[k], d[k], s[k])
    texts = {d[k]["c0"] for k in kept} | {d[k]["c1"] for k in kept}
    # not vacuous: BC years, years after 9999 and the year 0 of Spark's astronomical count are among them
    assert {"0001-01-01 (BC)", "0001-12-31 (BC)"} <= texts
    assert any(t and t[:6].isdigit() and "(BC)" not in t for t in texts)  # a year after 99999
    assert any(t and "(BC) " in t for t in texts)
    # negative control: Spark's own text of those values differs
    raw = exp.Cast(this=exp.column("d"), to=exp.DataType.build("STRING"))
    raw.meta["dpsql_dialect"] = "spark"
    native = {r["t"] for r in spark.fetch_arrow(exp.select(exp.alias_(raw, "t")).from_("v")).to_pylist()}
    assert "0000-01-01" in native and any(t and t.startswith("+") for t in native)


def test_timestamps_with_a_time_zone_as_text_are_duckdbs_on_spark(engines: Any) -> None:
    """DuckDB writes a TIMESTAMP WITH TIME ZONE's offset ('2024-01-01 12:00:00+00' in UTC, Spark's
    session time zone); Spark wrote none: a released key CAST(ts AS VARCHAR) differed on every row (the
    portable hash still hashes Spark's own text: dpsql.engine.portable). NULL stays NULL; BC years and fractions as DuckDB writes them."""
    from dpsql.engine.portable import PortableDuckDBOps
    from dpsql.engine.spark_ops import SparkOps

    duck, spark = engines
    duck._con.execute("SET TimeZone = 'UTC'")
    micros = [0, 1704110400500000, -62135596800000001, -9000000000000000000, 253402300800000000, None]
    t = pa.table({"ts": pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                  "i": pa.array(range(len(micros)), pa.int64())})
    duck.register_source("tz", "arrow", t, view="vtz")
    spark.register_source("tz", "arrow", t, view="vtz")
    node = sqlglot.parse_one("SELECT CAST(ts AS VARCHAR)", read="duckdb").expressions[0]
    text = Typer({"ts": "TIMESTAMP WITH TIME ZONE"}).t(node).expr

    def rows(backend: Any, ops: Any) -> list[dict[str, Any]]:
        q = exp.select("i", exp.alias_(text.copy(), "t")).from_("vtz")
        return sorted(backend.fetch_arrow(q).to_pylist(), key=lambda r: r["i"])

    d, s = rows(duck, PortableDuckDBOps()), rows(spark, SparkOps())
    assert d == s
    assert d[1]["t"] == "2024-01-01 12:00:00.5+00" and d[2]["t"].endswith("(BC) 23:59:59.999999+00") and d[-1]["t"] is None
