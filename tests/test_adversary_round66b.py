"""The Spark engine against the DuckDB engine: the same refusals (class and message), the same answers, on the same
data; and neighbouring datasets (with and without one person's hostile row) answered alike on both.

* Message (fixed): a TIME column (an Arrow ``time64``) is TIME(6) in Spark's schema, and an Arrow ``null`` column is
  Spark's ``void``; the Spark engine named them ``TIME(6)`` and ``NULL`` in every refusal where the DuckDB engine names
  them ``TIME`` and ``"NULL"`` (``'tm' is TIME(6); MIN needs a numeric, DATE or TIMESTAMP column``, ``hour() takes a
  DATE or TIMESTAMP, got TIME(6)``, ``arithmetic needs numbers, got NULL``). The typer read both alike (TIME(6) as
  TIME), so only the text differed; the Spark engine now gives them DuckDB's names.
* Crash at registration (fixed): an Arrow ``timestamp('ns')`` column with one value in the last microsecond above
  -2^63 ns (1677-09-21 00:12:43.145224) made the table's registration fail on Spark (pyspark's conversion raised
  ArrowInvalid), so a table was registered on Spark or not by one person's row; DuckDB reads it, rounded down. The
  Spark engine now converts nanoseconds to microseconds itself, rounded down as DuckDB.
* Open (parity: other rows kept): the portable keyed hash reads each engine's text of the hashed columns; for a BLOB
  privacy unit DuckDB's text escapes the bytes (``\\xFF``), Spark's is the bytes themselves, so where the caps bind the
  engines keep other rows and release other counts on the same data (docs/spark.md names DOUBLE units and keys, dates
  beyond years 1..9999 and TIMESTAMPTZ as such exceptions, not BLOB).
* Open (parity, free): an Arrow ``duration`` column is DuckDB's INTERVAL and Spark's ``INTERVAL DAY TO SECOND``:
  ``GROUP BY CAST(du AS VARCHAR)`` (the fix DuckDB's own refusal of ``GROUP BY du`` names) is answered on DuckDB and
  refused on Spark, and the refusals name the type apart. Spark's text of such an interval (``INTERVAL '0
  00:00:00.000001' DAY TO SECOND``) is not DuckDB's (``00:00:00.000001``), so the name alone cannot be changed: the
  Spark form of the cast would have to spell DuckDB's text.
* Open (message): nested column types are named in Spark's spelling in refusals (``ARRAY<BIGINT>``,
  ``STRUCT<A:BIGINT>``, ``MAP<BIGINT,BIGINT>``) where DuckDB says ``BIGINT[]``, ``STRUCT(A BIGINT)``; a translation of the
  names would have to keep the typer's reading of them.
* Crash at registration (fixed): an Arrow duration in nanoseconds with a fraction of a microsecond, or in seconds or
  milliseconds beyond the 64-bit microseconds, made pyspark's conversion raise: the table registered on Spark or not
  by one row. A top-level duration is now converted to microseconds by the Spark engine, as DuckDB reads it
  (nanoseconds rounded down, NULL beyond the range).
* Open (crash at registration, decided by one row): the same for one value in the last microsecond above -2^63 ns
  inside a nested timestamp in nanoseconds (a list or struct of them): the table registers on Spark or not by that
  row (DuckDB registers it).
* Open (parity, free): an Arrow table with an unsigned integer column (``uint8`` .. ``uint64``) is refused at
  registration on Spark (every query over the table, also one that reads other columns), registered and answered on
  DuckDB (UTINYINT .. UBIGINT).

Held (zero noise, DuckDB with the portable hash against Spark, D against D' with one person's row of BIGINT -2^63 and
2^63 - 1, text that is no number or date, DECIMAL(38, 2) at +-(10^36 - 0.01), NaN, -inf and 1e300, the DATE and
TIMESTAMP ends 0001-01-01 and 9999-12-31 23:59:59.999999): abs, unary minus, + - *, casts to every integer type,
DECIMAL, DOUBLE, FLOAT, HUGEINT, DATE, TIMESTAMP, BOOLEAN and text, floor/ceil, % by a literal, / by zero, date
arithmetic and truncation, date parts, make_date, text functions: the same answers on both engines and no failure on
D'. Also held: DOUBLE keys NaN, -0.0, +-inf, 5e-324, 1e308 (grouped as they are and as text), SUM/AVG/MEDIAN over them,
integer division by zero, keys of TINYINT, SMALLINT, FLOAT, BLOB, LARGE_STRING, dictionary text, lower/upper of 'İ'
and 'ß', TIMESTAMPTZ and TIME as text; NULL privacy units (text and integer) and units that differ by case or a
trailing blank; privacy units of DECIMAL, DATE, TIMESTAMP, FLOAT, BLOB, TINYINT and text with combining marks where
the caps bind; DP-S4S, R2T and grouped joins (clipped and sampled) with one customer of 300 orders of 20 line items
each (prices 1e308, ship dates 9999-12-31), also with order keys that duplicate other people's: the same releases on
both engines; Parquet timestamps at +-2^63 microseconds and milliseconds and dates beyond year 9999: the same values
(NULL) on both. Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from _spark import comparable_session, require_spark

import dpsql
from dpsql.testing import use_noise, zero_noise

require_spark()

_N = 60  # rows of the base table, two per person


def _outcome(s: dpsql.Session, sql: str, delta: float = 1e-6) -> tuple[Any, ...]:
    use_noise(s, zero_noise(3))  # the same salts for each query on both engines, whatever ran before
    before = s.history().num_rows
    try:
        r = s.query(sql, epsilon=1.0, delta=delta)
        return ("answered", str(r.table.schema), r.table.to_pylist(), s.history().num_rows - before)
    except dpsql.errors.DPSQLError as e:
        return ("refused", type(e).__name__, str(e), s.history().num_rows - before)


def _odd_types() -> pa.Table:
    n = 40
    return pa.table({
        "uid": pa.array([i // 2 for i in range(n)], pa.int64()),
        "tm": pa.array([[0, 1, 3_600_000_000][i % 3] for i in range(n)], pa.time64("us")),
        "du": pa.array([[0, 1, 3_600_000_000][i % 3] for i in range(n)], pa.duration("us")),
        "nc": pa.nulls(n),
        "v": pa.array([i % 7 for i in range(n)], pa.int64()),
    })


def _hostile(extra: bool) -> pa.Table:
    rows = [(i // 2, i, "7", decimal.Decimal("1.50"), 1.5, dt.date(2020, 1, 1), dt.datetime(2020, 1, 1))
            for i in range(_N)]
    if extra:  # one more person, three rows
        big, small = decimal.Decimal("9" * 36 + ".99"), decimal.Decimal("-" + "9" * 36 + ".99")
        rows += [(10**6, -2**63, "abc", big, 1e300, dt.date(9999, 12, 31), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
                 (10**6, 2**63 - 1, "2024-02-30", small, float("nan"), dt.date(1, 1, 1), dt.datetime(1, 1, 1)),
                 (10**6, 0, "9" * 41, decimal.Decimal(0), float("-inf"), dt.date(1, 1, 1), dt.datetime(1, 1, 1))]
    c = list(zip(*rows, strict=True))
    return pa.table({"uid": pa.array(c[0], pa.int64()), "x": pa.array(c[1], pa.int64()),
                     "s": pa.array(c[2], pa.string()), "d": pa.array(c[3], pa.decimal128(38, 2)),
                     "f": pa.array(c[4], pa.float64()), "dd": pa.array(c[5], pa.date32()),
                     "ts": pa.array(c[6], pa.timestamp("us"))})


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, dpsql.Session]]:
    """A DuckDB (portable hash) and a Spark session, zero noise, each with the same tables: ``odd`` (TIME, INTERVAL
    and NULL columns), ``d0`` / ``d1`` (the neighbours without and with the hostile person)."""
    out = {kind: comparable_session(kind) for kind in ("duckdb", "spark")}
    try:
        for s in out.values():
            s.register("odd", _odd_types(), privacy_unit="uid", max_groups_per_unit=3, max_rows_per_group=2,
                       columns={"v": {"bounds": (0, 10)}})
            for k in (0, 1):
                s.register(f"d{k}", _hostile(bool(k)), privacy_unit="uid", max_groups_per_unit=3,
                           max_rows_per_group=2, max_rows_per_unit=4)
        yield out
    finally:
        for s in out.values():
            s.close()


@pytest.mark.parametrize(("sql", "says"), [
    ("SELECT MIN(tm) AS m FROM odd", "'tm' is TIME;"),
    ("SELECT COUNT(*) AS n FROM odd WHERE tm = tm", "of type TIME,"),
    ("SELECT hour(tm) AS h, COUNT(*) AS n FROM odd GROUP BY 1", "got TIME:"),
    ("SELECT tm, COUNT(*) AS n FROM odd GROUP BY tm", "key of type TIME is"),
    ("SELECT COUNT(*) AS n FROM odd WHERE nc = 1", 'of type "NULL",'),
    ("SELECT COUNT(*) AS n FROM odd WHERE nc + 1 > 0", 'got "NULL":'),
    ("SELECT CAST(nc AS VARCHAR) AS k, COUNT(*) AS n FROM odd GROUP BY 1", 'of type "NULL" cannot'),
])
def test_a_time_or_null_column_is_refused_with_the_same_message_on_both_engines(engines: dict[str, dpsql.Session],
                                                                                sql: str, says: str) -> None:
    """Spark named these columns TIME(6) and NULL in the refusals, DuckDB TIME and "NULL": the same query was refused
    with another message on each engine. Now the same refusal, word for word, for free on both."""
    duck, spark = (_outcome(engines[k], sql, 1e-3) for k in ("duckdb", "spark"))
    assert duck[:2] == ("refused", "UnsupportedQueryError") and duck[3] == 0 and says in duck[2]
    assert spark == duck


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM odd WHERE CAST(tm AS VARCHAR) > '00:00:00'",
    "SELECT COUNT(tm) AS a, COUNT(du) AS b, COUNT(nc) AS c, COUNT(*) AS n FROM odd WHERE du IS NOT NULL",
])
def test_negative_control_time_and_null_columns_answer_alike_where_allowed(engines: dict[str, dpsql.Session],
                                                                           sql: str) -> None:
    duck, spark = (_outcome(engines[k], sql, 1e-3) for k in ("duckdb", "spark"))
    assert duck[0] == "answered" and duck[3] == 1 and duck[2]
    assert spark == duck


@pytest.mark.xfail(strict=True, reason="an Arrow duration column is INTERVAL DAY TO SECOND on Spark: GROUP BY "
                   "CAST(du AS VARCHAR) is refused there (answered on DuckDB) and refusals name the type apart")
@pytest.mark.parametrize("sql", [
    "SELECT CAST(du AS VARCHAR) AS k, COUNT(*) AS n FROM odd GROUP BY 1 ORDER BY 1",
    "SELECT MIN(du) AS m FROM odd",
])
def test_a_duration_column_is_answered_and_refused_alike_on_both_engines(engines: dict[str, dpsql.Session],
                                                                          sql: str) -> None:
    duck, spark = (_outcome(engines[k], sql, 1e-3) for k in ("duckdb", "spark"))
    assert spark == duck


def test_negative_control_a_duration_column_counted_alike_on_both_engines(engines: dict[str, dpsql.Session]) -> None:
    sql = "SELECT COUNT(du) AS n FROM odd WHERE du IS NOT NULL"
    duck, spark = (_outcome(engines[k], sql) for k in ("duckdb", "spark"))
    assert duck[0] == "answered" and spark == duck


_UNSIGNED = [pa.uint8(), pa.uint32(), pa.uint64()]


def _with(column_type: pa.DataType) -> pa.Table:
    return pa.table({"uid": pa.array(range(40), pa.int64()), "u": pa.array([i % 3 for i in range(40)], column_type),
                     "k": pa.array(["a", "b"] * 20)})


def _count_on_both(engines: dict[str, dpsql.Session], column_type: pa.DataType) -> list[Any]:
    got = []
    for kind in ("duckdb", "spark"):
        s = engines[kind]
        name = f"u_{column_type}"
        try:
            s.register(name, _with(column_type), privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1)
        except dpsql.errors.ConfigError as e:
            got.append(("refused at registration", str(e)))
            continue
        got.append(_outcome(s, f"SELECT COUNT(*) AS n FROM {name} WHERE k = 'a'"))
    return got


@pytest.mark.xfail(strict=True, reason="an Arrow table with an unsigned integer column is refused at registration on "
                   "Spark (its whole table), registered and answered on DuckDB")
@pytest.mark.parametrize("column_type", _UNSIGNED, ids=str)
def test_a_table_with_an_unsigned_column_is_answered_on_both_engines(engines: dict[str, dpsql.Session],
                                                                      column_type: pa.DataType) -> None:
    duck, spark = _count_on_both(engines, column_type)
    assert spark == duck


@pytest.mark.parametrize("column_type", [pa.int16(), pa.int64()], ids=str)
def test_negative_control_a_table_with_a_signed_column_is_answered_on_both_engines(
        engines: dict[str, dpsql.Session], column_type: pa.DataType) -> None:
    duck, spark = _count_on_both(engines, column_type)
    assert duck[0] == "answered" and duck[2] == [{"n": 20}] and spark == duck


_EXPRESSIONS = [
    "abs(x)", "-x", "x * x", "CAST(x AS INTEGER)", "CAST(x AS DECIMAL(5,0))", "CAST(x AS FLOAT)", "x % 7",
    "CAST(s AS DATE)", "CAST(s AS TIMESTAMP)", "CAST(s AS DECIMAL(5,2))", "CAST(s AS BOOLEAN)", "CAST(s AS HUGEINT)",
    "CAST(d AS DECIMAL(4,2))", "CAST(d AS BIGINT)", "d * d", "d + d", "-d", "d / 0", "floor(d)",
    "CAST(f AS DECIMAL(10,2))", "CAST(f AS BIGINT)", "CAST(f AS HUGEINT)", "floor(f)", "f * f",
    "dd + INTERVAL 1 DAY", "ts + INTERVAL 1 SECOND", "date_trunc('week', ts)", "date_part('isoyear', dd)",
    "make_date(year(dd), 2, 29)", "CAST(ts AS VARCHAR)", "CAST(dd AS VARCHAR)",
]


def test_one_persons_hostile_values_are_answered_alike_on_both_engines(engines: dict[str, dpsql.Session]) -> None:
    """Held: BIGINT -2^63 and 2^63 - 1, text that is no number or date, DECIMAL(38, 2) at +-(10^36 - 0.01), NaN,
    -inf, 1e300, the first and last DATE and TIMESTAMP: each expression counted (one query of many COUNTs) on D and
    on D' (D with that person) is answered on both engines, with the same counts, and D' differs from D only by that
    person's rows."""
    sel = ", ".join(f"COUNT({e}) AS c{i}" for i, e in enumerate(_EXPRESSIONS))
    got = {(kind, k): _outcome(engines[kind], f"SELECT {sel} FROM d{k}") for kind in ("duckdb", "spark") for k in (0, 1)}
    for k in (0, 1):
        assert got[("duckdb", k)][0] == "answered" and got[("duckdb", k)][3] == 1
        assert got[("spark", k)] == got[("duckdb", k)]
    d0, d1 = got[("duckdb", 0)][2][0], got[("duckdb", 1)][2][0]
    assert all(d1[c] - d0[c] in range(4) for c in d0) and max(d0.values()) == _N
    assert any(d1[c] - d0[c] < 3 for c in d0)  # some expression is NULL on a hostile row


def _units(unit: pa.Array) -> pa.Table:
    n = len(unit)
    return pa.table({"uid": unit, "k": pa.array(["abc"[(i * 7 + i // 3) % 3] for i in range(n)])})


_UNIT_N = 240  # rows, six per person; each person keeps max_rows_per_unit = 2 of them, chosen by the keyed hash


def _units_on_both(engines: dict[str, dpsql.Session], unit: pa.Array, name: str) -> list[Any]:
    got = []
    for kind in ("duckdb", "spark"):
        s = engines[kind]
        s.register(name, _units(unit), privacy_unit="uid", max_groups_per_unit=3, max_rows_per_group=2,
                   max_rows_per_unit=2, columns={"k": {"domain": ["a", "b", "c"]}})
        got.append(_outcome(s, f"SELECT k, COUNT(*) AS n FROM {name} GROUP BY k ORDER BY k"))
    return got


@pytest.mark.xfail(strict=True, reason="the portable keyed hash reads each engine's text of a BLOB privacy unit "
                   "(DuckDB '\\xFF', Spark the raw bytes), so where the caps bind the engines keep other rows")
def test_a_blob_privacy_unit_keeps_the_same_rows_on_both_engines(engines: dict[str, dpsql.Session]) -> None:
    """docs/spark.md promises the same bounded aggregates on both engines with zero noise and DuckDB's portable hash,
    except for DOUBLE units and keys and dates beyond years 1..9999 (and TIMESTAMPTZ, portable.py). A BLOB unit
    (bytes that are not UTF-8) is hashed from DuckDB's escaped text on DuckDB and Spark's bytes on Spark: other rows are
    kept under max_rows_per_unit, and the released counts differ on the same data."""
    unit = pa.array([bytes([i // 6, 0xFF]) for i in range(_UNIT_N)], pa.binary())
    duck, spark = _units_on_both(engines, unit, "blob_units")
    assert duck[0] == "answered" and spark == duck


def test_negative_control_a_decimal_privacy_unit_keeps_the_same_rows_on_both_engines(
        engines: dict[str, dpsql.Session]) -> None:
    unit = pa.array([decimal.Decimal(i // 6) / 4 for i in range(_UNIT_N)], pa.decimal128(10, 2))
    duck, spark = _units_on_both(engines, unit, "decimal_units")
    assert duck[0] == "answered" and sum(r["n"] for r in duck[2]) == 2 * _UNIT_N // 6 and spark == duck


@pytest.mark.parametrize("extreme", [-2**63 + 1, -2**63], ids=["min_plus_1", "min"])
def test_one_nanosecond_timestamp_near_the_minimum_is_read_alike_on_both_engines(engines: dict[str, dpsql.Session],
                                                                                extreme: int) -> None:
    """An Arrow ``timestamp('ns')`` column holding one person's value in the last microsecond above -2^63 ns
    (1677-09-21 00:12:43.145224): pyspark's conversion to microseconds raised ArrowInvalid, so the table's registration
    failed on Spark (a ConfigError) only when such a row existed, while DuckDB read it (rounded down to the
    microsecond). Now the Spark engine converts nanoseconds itself, rounded down as DuckDB: both register the table and
    count the row alike; the neighbour without that row (the control) too."""
    for with_row in (False, True):
        values = [1_600_000_000_000_000_001 + i for i in range(30)] + ([extreme] if with_row else [])
        t = pa.table({"uid": pa.array(range(len(values)), pa.int64()),
                      "ts": pa.array(values, pa.timestamp("ns")), "tz": pa.array(values, pa.timestamp("ns", tz="UTC"))})
        name = f"ns_{'x' if with_row else 'o'}_{extreme < -2**63 + 1}"
        got = []
        for kind in ("duckdb", "spark"):
            engines[kind].register(name, t, privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1)
            got.append(_outcome(engines[kind], f"SELECT COUNT(*) AS n FROM {name} WHERE ts < TIMESTAMP '1677-09-22' "
                                               "OR CAST(tz AS VARCHAR) LIKE '1677-09-21 00:12:43.145224%'"))
        assert got[0] == got[1] and got[0][:1] == ("answered",)
        assert got[0][2] == [{"n": int(with_row)}]


def _nested() -> pa.Table:
    n = 40
    return pa.table({"uid": pa.array(range(n), pa.int64()), "lst": pa.array([[i % 3] for i in range(n)]),
                     "st": pa.array([{"a": i % 3} for i in range(n)], pa.struct([("a", pa.int64())]))})


@pytest.mark.xfail(strict=True, reason="Spark names nested column types in its own spelling in refusals "
                   "(ARRAY<BIGINT>, STRUCT<A:BIGINT>) where DuckDB says BIGINT[] and STRUCT(A BIGINT)")
@pytest.mark.parametrize("sql", ["SELECT MIN(lst) AS m FROM nested", "SELECT MIN(st) AS m FROM nested",
                                 "SELECT COUNT(*) AS n FROM nested WHERE lst = lst"])
def test_a_nested_column_is_refused_with_the_same_message_on_both_engines(engines: dict[str, dpsql.Session],
                                                                          sql: str) -> None:
    got = []
    for kind in ("duckdb", "spark"):
        if "nested" not in engines[kind].tables:
            engines[kind].register("nested", _nested(), privacy_unit="uid")
        got.append(_outcome(engines[kind], sql))
    assert got[0][0] == "refused" and got[1] == got[0]


def test_negative_control_a_nested_column_counted_alike_on_both_engines(engines: dict[str, dpsql.Session]) -> None:
    got = []
    for kind in ("duckdb", "spark"):
        if "nested" not in engines[kind].tables:
            engines[kind].register("nested", _nested(), privacy_unit="uid")
        got.append(_outcome(engines[kind], "SELECT COUNT(lst) AS a, COUNT(st) AS b FROM nested WHERE lst IS NOT NULL"))
    assert got[0][0] == "answered" and got[1] == got[0]


_EXTREME_NESTED = {
    "list_of_ns": (pa.list_(pa.timestamp("ns")), [[1]], [[-2**63 + 1]]),
    "struct_of_ns": (pa.struct([("a", pa.timestamp("ns"))]), [{"a": 1}], [{"a": -2**63 + 1}]),
}


def _register_both(engines: dict[str, dpsql.Session], name: str, t: pa.Table) -> list[str]:
    got = []
    for kind in ("duckdb", "spark"):
        try:
            engines[kind].register(name, t, privacy_unit="uid")
            got.append("registered")
        except dpsql.errors.ConfigError as e:
            got.append(f"refused: {e}")
    return got


@pytest.mark.xfail(strict=True, reason="one extreme value inside a nested timestamp in nanoseconds makes pyspark's "
                   "conversion raise: the table's registration fails on Spark only when such a row exists (DuckDB "
                   "registers it)")
@pytest.mark.parametrize("case", sorted(_EXTREME_NESTED))
def test_one_extreme_nested_nanosecond_value_does_not_decide_the_registration_on_spark(
        engines: dict[str, dpsql.Session], case: str) -> None:
    typ, ordinary, extreme = _EXTREME_NESTED[case]
    t = pa.table({"uid": pa.array([0, 1], pa.int64()), "x": pa.array(ordinary + extreme, typ)})
    assert _register_both(engines, f"x_{case}", t) == ["registered", "registered"]


@pytest.mark.parametrize("case", sorted(_EXTREME_NESTED))
def test_negative_control_the_same_types_with_ordinary_values_register_on_both(engines: dict[str, dpsql.Session],
                                                                              case: str) -> None:
    typ, ordinary, _ = _EXTREME_NESTED[case]
    t = pa.table({"uid": pa.array([0, 1], pa.int64()), "x": pa.array(ordinary * 2, typ)})
    assert _register_both(engines, f"o_{case}", t) == ["registered", "registered"]


@pytest.mark.parametrize(("unit", "extreme"), [("ns", -2**63 + 1), ("ns", 1), ("s", 2**62), ("ms", -2**62)])
def test_one_duration_value_does_not_decide_the_registration_on_spark(engines: dict[str, dpsql.Session], unit: str,
                                                                      extreme: int) -> None:
    """An Arrow duration in nanoseconds with a fraction of a microsecond (any, or one near -2^63), or in seconds or
    milliseconds beyond the 64-bit microseconds: pyspark's conversion raised (ArrowInvalid), so the table registered
    on Spark or not by one person's row, while DuckDB registers it (such a value beyond the range as NULL). Now the
    Spark engine converts a top-level duration to microseconds itself, as DuckDB reads it: both register the table
    and count the non-NULL values alike (what a query can read of a duration: IS NULL, COUNT); the neighbour without
    the row too."""
    for with_row in (False, True):
        values = [1000 * i for i in range(20)] + ([extreme] if with_row else [])
        t = pa.table({"uid": pa.array(range(len(values)), pa.int64()), "x": pa.array(values, pa.duration(unit))})
        name = f"dur_{unit}_{extreme > 0}_{extreme % 7}_{int(with_row)}"
        assert _register_both(engines, name, t) == ["registered", "registered"]
        duck, spark = (_outcome(engines[k], f"SELECT COUNT(x) AS a, COUNT(*) AS n FROM {name} WHERE x IS NOT NULL "
                                            "OR uid >= 0") for k in ("duckdb", "spark"))
        assert duck[0] == "answered" and spark == duck
        assert duck[2] == [{"a": 20 + int(with_row and unit == "ns"), "n": len(values)}]
