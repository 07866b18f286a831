"""Sources are read totally: a stored value that DuckDB cannot convert while scanning (a
timestamp in seconds or milliseconds beyond its range, a duration, a TIME past midnight, a
date64 beyond 32-bit days, a dictionary of such values, float16, decimal256, ...) reads as NULL,
or its column type is refused at registration, before any charge. Otherwise a query would fail
*after the charge* only when the row holding it exists. Each test compares D (without the
person) with D' (with them): the outcomes are identical and nothing fails after the charge."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise

N = 50
SQL = "SELECT COUNT(*) FROM t WHERE x IS NOT NULL"
I64 = 2**63 - 1


def raw_array(typ: pa.DataType, values: list[int]) -> pa.Array:
    """An array of ``typ`` holding exactly these stored integers (no range check on the way)."""
    width = pa.int32() if typ.bit_width == 32 else pa.int64()
    return pa.Array.from_buffers(typ, len(values), [None, pa.array(values, width).buffers()[1]])


def neighbours(typ: pa.DataType, hostile: int) -> tuple[pa.Table, pa.Table]:
    """D: N people with value 0; D': the same plus one person whose stored value is ``hostile``."""
    def table(extra: bool) -> pa.Table:
        vals = [0] * N + ([hostile] if extra else [])
        return pa.table({"uid": pa.array(range(len(vals)), pa.int64()), "x": raw_array(typ, vals)})
    return table(False), table(True)


def outcome(source: Any, sql: str = SQL, columns: dict[str, Any] | None = None, **engine: Any) -> tuple[str, Budget]:
    s = dpsql.Session(budget=Budget(10.0, 1e-3), engine=engine or None)
    use_noise(s, zero_noise())
    try:
        s.register("t", source, privacy_unit="uid", **({"columns": columns} if columns else {}))
        s.query(sql, epsilon=1.0)
        out = "ok"
    except dpsql.errors.DPSQLError as e:
        out = type(e).__name__
    return out, s.remaining()


VIEW_AS_TEXT = 'SELECT x::VARCHAR FROM "{view}" ORDER BY uid'


def outcome_and_view(source: Any, **engine: Any) -> tuple[tuple[str, Budget], list[Any] | None]:
    """:func:`outcome` of the default query and, when it is "ok", what :func:`view_rows` reads (every value
    of ``x`` as text), both from one session over ``source`` (None when the query fails)."""
    s = dpsql.Session(budget=Budget(10.0, 1e-3), engine=engine or None)
    use_noise(s, zero_noise())
    try:
        try:
            s.register("t", source, privacy_unit="uid")
            s.query(SQL, epsilon=1.0)
            out = "ok"
        except dpsql.errors.DPSQLError as e:
            out = type(e).__name__
        remaining = s.remaining()
        rows = (s._engine.connection.execute(VIEW_AS_TEXT.format(view=s.tables["t"].view)).fetchall() if out == "ok"
                else None)
        return (out, remaining), rows
    finally:
        s.close()


def view_rows(source: Any, sql: str = VIEW_AS_TEXT, **engine: Any) -> list[Any]:
    """The registered view read directly, every value converted to text (the conversion that fails)."""
    s = dpsql.Session(budget=Budget(10.0, 1e-3), engine=engine or None)
    s.register("t", source, privacy_unit="uid")
    rows = s._engine.connection.execute(sql.format(view=s.tables["t"].view)).fetchall()
    s.close()
    return rows


def to_parquet(tmp_path: Path, tables: tuple[pa.Table, pa.Table], **kw: Any) -> list[str]:
    paths = []
    for name, t in zip(("d", "d1"), tables):
        p = tmp_path / f"{name}.parquet"
        pq.write_table(t, p, **kw)
        paths.append(str(p))
    return paths


OK = ("ok", Budget(9.0, 1e-3))


@pytest.mark.parametrize(
    "typ",
    [pa.duration("s"), pa.duration("ms"), pa.timestamp("s", tz="UTC")],
    ids=["duration_s", "duration_ms", "timestamp_s_tz"],
)
def test_arrow_temporal_overflow_fails_only_with_the_person(typ: pa.DataType) -> None:
    d, d1 = neighbours(typ, 2**62)
    assert outcome(d) == OK
    # D': DuckDB's Arrow scan multiplies the value to microseconds and overflows
    got, rows = outcome_and_view(d1)
    assert got == OK
    assert rows is not None and rows[-1] == (None,)


def test_control_duckdb_alone_fails_on_the_person() -> None:
    """The negative control: DuckDB's own Arrow scan and Parquet reader fail on D' only."""
    d, d1 = neighbours(pa.duration("s"), 2**62)
    for t, fails in ((d, False), (d1, True)):
        con = duckdb.connect()
        con.register("a", t)
        if fails:
            with pytest.raises(duckdb.Error):
                con.sql("SELECT COUNT(*) FROM a WHERE x IS NOT NULL").fetchall()
        else:
            assert con.sql("SELECT COUNT(*) FROM a WHERE x IS NOT NULL").fetchall() == [(N,)]


def test_control_duckdb_parquet_reader_fails_on_the_person(tmp_path: Path) -> None:
    paths = to_parquet(tmp_path, neighbours(pa.timestamp("ms"), 2**62))
    con = duckdb.connect()
    assert con.sql(f"SELECT COUNT(*) FROM read_parquet('{paths[0]}')").fetchall() == [(N,)]
    with pytest.raises(duckdb.Error):
        con.sql(f"SELECT COUNT(x) FROM read_parquet('{paths[1]}')").fetchall()


# every Arrow type whose scan converts, at its extremes, plus neighbours that read as is
ARROW_CASES: dict[str, tuple[pa.DataType, int]] = {
    "timestamp_s": (pa.timestamp("s"), 2**62),
    "timestamp_s_neg": (pa.timestamp("s"), -(2**62)),
    "timestamp_ms": (pa.timestamp("ms"), 2**62),
    "timestamp_ms_min": (pa.timestamp("ms"), -I64 - 1),
    "timestamp_ms_tz": (pa.timestamp("ms", tz="Europe/Paris"), -(2**62)),
    "timestamp_us_min": (pa.timestamp("us"), -I64 - 1),
    "timestamp_us_max": (pa.timestamp("us"), I64),
    "timestamp_ns_min": (pa.timestamp("ns"), -I64 - 1),
    "timestamp_ns_tz": (pa.timestamp("ns", tz="UTC"), I64),
    "duration_us": (pa.duration("us"), -I64 - 1),
    "duration_ns": (pa.duration("ns"), I64),
    "date64_max": (pa.date64(), I64),
    "date64_neg": (pa.date64(), -(2**62)),
    "time32_s": (pa.time32("s"), 2**31 - 1),
    "time32_ms_neg": (pa.time32("ms"), -1),
    "time64_us": (pa.time64("us"), I64),
    "time64_ns_neg": (pa.time64("ns"), -I64 - 1),
    "date32_min": (pa.date32(), -(2**31)),
}


@pytest.mark.parametrize("case", sorted(ARROW_CASES))
def test_arrow_extreme_values_read_totally(case: str) -> None:
    typ, hostile = ARROW_CASES[case]
    d, d1 = neighbours(typ, hostile)
    assert outcome(d) == OK
    got, rows = outcome_and_view(d1)
    assert got == OK
    # the conversion a query may apply (to text) is total on every row of the view
    assert rows is not None and len(rows) == N + 1 and rows[0] == rows[N - 1] and rows[0][0] is not None


@pytest.mark.parametrize("case", ["timestamp_ms", "timestamp_ms_tz", "timestamp_ms_neg", "int96", "list", "time_ms",
                                  "time_us", "duration_s", "struct"])
@pytest.mark.parametrize("mode", ["null", "replace"])
def test_parquet_extreme_values(tmp_path: Path, case: str, mode: str) -> None:
    """The default reader reads every case totally; DuckDB's reader (invalid_text = "replace")
    refuses the types it converts at registration, for D and D' alike, before any charge."""
    kw: dict[str, Any] = {}
    if case.startswith("timestamp_ms"):
        typ = pa.timestamp("ms", tz="UTC" if case.endswith("tz") else None)
        tables = neighbours(typ, -(2**62) if case.endswith("neg") else 2**62)
    elif case == "int96":
        tables = neighbours(pa.timestamp("ms"), 2**62)
        kw = {"use_deprecated_int96_timestamps": True}
    elif case == "time_ms":
        tables = neighbours(pa.time32("ms"), 2**31 - 1)
    elif case == "time_us":
        tables = neighbours(pa.time64("us"), -5)
    elif case == "duration_s":
        tables = neighbours(pa.duration("s"), 2**62)
    else:
        d, d1 = neighbours(pa.timestamp("ms"), 2**62)
        wrap = ((lambda a: pa.ListArray.from_arrays(pa.array(range(len(a) + 1), pa.int32()), a)) if case == "list"
                else (lambda a: pa.StructArray.from_arrays([a], names=["ts"])))
        tables = (d.set_column(1, "x", wrap(d["x"].combine_chunks())), d1.set_column(1, "x", wrap(d1["x"].combine_chunks())))
    paths = to_parquet(tmp_path, tables, **kw)
    results = [outcome(p, invalid_text=mode) for p in paths]
    assert results[0] == results[1]
    if mode == "null" or case == "duration_s":  # a duration is a plain INT64 to DuckDB's reader
        assert results[0] == OK
    else:
        assert results[0] == ("ConfigError", Budget(10.0, 1e-3))


def test_rebuilt_values_are_the_stored_ones() -> None:
    """In range, the rebuilt value is the value DuckDB itself would read (seconds, milliseconds,
    nanoseconds floored to microseconds, a time zone, a duration, date64, time)."""
    t = pa.table({
        "uid": pa.array([1, 2], pa.int64()),
        "ts_s": raw_array(pa.timestamp("s"), [1_700_000_000, -1]),
        "ts_ms_tz": raw_array(pa.timestamp("ms", tz="America/New_York"), [1_700_000_000_123, -1]),
        "ts_ns": raw_array(pa.timestamp("ns"), [1_700_000_000_123_456_789, -1]),
        "dur_ms": raw_array(pa.duration("ms"), [90_061_001, -1]),
        "d64": raw_array(pa.date64(), [19_675 * 86_400_000, -1]),
        "t32": raw_array(pa.time32("ms"), [45_296_789, 86_399_999]),
        "t64": raw_array(pa.time64("ns"), [1_999, 86_399_999_999_999]),
    })
    rows = view_rows(t, 'SELECT ts_s, ts_ms_tz, ts_ns, dur_ms, d64, t32, t64 FROM "{view}" ORDER BY uid')
    utc = dt.UTC
    first = rows[0]
    assert first[0] == dt.datetime(2023, 11, 14, 22, 13, 20)
    assert first[1] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=utc)
    assert first[2] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert first[3] == dt.timedelta(days=1, hours=1, minutes=1, seconds=1, milliseconds=1)
    assert first[4] == dt.date(2023, 11, 14)
    assert first[5] == dt.time(12, 34, 56, 789000)
    assert first[6] == dt.time(0, 0, 0, 1)
    second = rows[1]
    assert second[0] == dt.datetime(1969, 12, 31, 23, 59, 59)
    assert second[2] == dt.datetime(1969, 12, 31, 23, 59, 59, 999999)  # floored
    assert second[3] == dt.timedelta(milliseconds=-1)
    assert second[4] == dt.date(1969, 12, 31)
    assert second[5] == dt.time(23, 59, 59, 999000)
    assert second[6] == dt.time(23, 59, 59, 999999)


def test_other_arrow_types_are_read_or_refused() -> None:
    """float16 and decimal256 are widened (DuckDB reads neither), a dictionary of a converted
    type is decoded first, uint64 above int64 and extreme intervals read as they are."""
    hostile = pa.table({
        "uid": pa.array([1, 2], pa.int64()),
        "h": pa.array(np.array([1.5, np.inf], np.float16()), pa.float16()),
        "big": pa.array([decimal.Decimal("1" * 40), decimal.Decimal("-" + "9" * 76)], pa.decimal256(76, 0)),
        "dts": pa.DictionaryArray.from_arrays(pa.array([0, 1]), raw_array(pa.timestamp("s"), [0, 2**62])),
        "u": pa.array([2**64 - 1, 0], pa.uint64()),
        "iv": pa.array([pa.MonthDayNano([2**31 - 1, -(2**31), I64])] * 2, pa.month_day_nano_interval()),
        "fsb": pa.array([b"\xff\xfe", b"ab"], pa.binary(2)),
        "js": pa.array(['{"a": 1}', "{bad"], pa.json_()),
    })
    rows = view_rows(hostile, 'SELECT h, big, dts, u, iv::VARCHAR, fsb, js FROM "{view}" ORDER BY uid')
    assert rows[0][0] == 1.5 and rows[1][0] == float("inf")
    assert rows[0][1] == pytest.approx(1.111111111111111e39) and rows[1][1] == pytest.approx(-1e76)
    assert rows[0][2] == dt.datetime(1970, 1, 1) and rows[1][2] is None
    assert rows[0][3] == 2**64 - 1
    assert rows[0][5] == b"\xff\xfe"
    assert rows[1][6] == "{bad"
    t = hostile.drop_columns(["iv"])
    assert outcome(t, "SELECT COUNT(*) FROM t WHERE h > 0 AND big > 0") == OK


def test_refused_types_name_the_column() -> None:
    """A type with converted values where dpsql cannot rebuild them is refused, for free."""
    m = pa.array([[("k", 1)]], pa.map_(pa.string(), pa.timestamp("s")))
    with pytest.raises(dpsql.errors.ConfigError, match="'t.m' has type map"):
        dpsql.Session(budget=Budget(1.0)).register("t", pa.table({"uid": [1], "m": m}), privacy_unit="uid")
    u = pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([1]), raw_array(pa.timestamp("s"), [0])])
    with pytest.raises(dpsql.errors.ConfigError, match="'t.u' has type"):
        dpsql.Session(budget=Budget(1.0)).register("t", pa.table({"uid": [1], "u": u}), privacy_unit="uid")


def test_duckdb_table_timestamp_seconds_beyond_range_is_null() -> None:
    """A caller's DuckDB table can hold TIMESTAMP_S values that any later conversion rejects."""
    con = duckdb.connect()
    d, d1 = neighbours(pa.timestamp("s"), 2**62)
    con.register("src", d1)
    con.execute("CREATE TABLE dt AS SELECT * FROM src")
    con.unregister("src")
    s = dpsql.Session(budget=Budget(10.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "dt", privacy_unit="uid")
    assert s.tables["t"].schema["x"] == "TIMESTAMP"
    got = s.query("SELECT COUNT(*) FROM t WHERE x >= TIMESTAMP '1970-01-01'", epsilon=1.0).table.column(0)[0].as_py()
    assert int(got) == N  # the person's value is NULL; no failure after the charge


PARQUET_OTHER: dict[str, Any] = {
    # (column of D', whether DuckDB's own reader (invalid_text = "replace") is refused)
    "date32_extremes": (lambda: raw_array(pa.date32(), [0] * N + [-(2**31)]), False),
    "decimal_beyond_precision": (lambda: pa.Array.from_buffers(
        pa.decimal128(4, 2), N + 1, [None, pa.py_buffer(b"\0" * 16 * N + (10**37).to_bytes(16, "little", signed=True))]),
        False),
    "decimal256": (lambda: pa.array([decimal.Decimal(0)] * N + [decimal.Decimal("9" * 40)], pa.decimal256(40, 0)), False),
    "float16": (lambda: pa.array(np.array([0] * N + [np.inf], np.float16()), pa.float16()), False),
    "uuid": (lambda: pa.array([b"\0" * 16] * N + [b"\xff" * 16], pa.uuid()), False),
    "uint64": (lambda: pa.array([0] * N + [2**64 - 1], pa.uint64()), False),
    "timestamp_ns": (lambda: raw_array(pa.timestamp("ns"), [0] * N + [-I64 - 1]), False),
    "json_invalid": (lambda: pa.array(["{}"] * N + ["{bad"], pa.json_()), True),
    "time_ns": (lambda: raw_array(pa.time64("ns"), [0] * N + [I64]), True),
}


@pytest.mark.parametrize("case", sorted(PARQUET_OTHER))
@pytest.mark.parametrize("mode", ["null", "replace"])
def test_parquet_other_types_read_totally_or_are_refused(tmp_path: Path, case: str, mode: str) -> None:
    make, refused_by_duckdb_reader = PARQUET_OTHER[case]
    x = make()
    d1 = pa.table({"uid": pa.array(range(N + 1), pa.int64()), "x": x})
    paths = to_parquet(tmp_path, (d1.slice(0, N), d1))
    results = [outcome(paths[0], invalid_text=mode)]
    got, rows = outcome_and_view(paths[1], invalid_text=mode)
    results.append(got)
    assert results[0] == results[1]
    assert results[0] == (("ConfigError", Budget(10.0, 1e-3)) if mode == "replace" and refused_by_duckdb_reader else OK)
    if results[0] == OK:
        assert rows is not None and len(rows) == N + 1  # every value converts to text


def _wide_decimals(values: list[int], p: int = 38, s: int = 0) -> pa.Array:
    """decimal128(p, s) holding these stored integers, beyond the declared precision if asked."""
    raw = b"".join(v.to_bytes(16, "little", signed=True) for v in values)
    return pa.Array.from_buffers(pa.decimal128(p, s), len(values), [None, pa.py_buffer(raw)])


def _hostile_duckdb_rows(extra: bool) -> pa.Table:
    """Values a DuckDB table can hold (created from Arrow, not validated) that later raise."""
    n = N + (1 if extra else 0)
    def col(normal: int, hostile: int) -> list[int]:
        return [normal] * N + ([hostile] if extra else [])
    return pa.table({
        "uid": pa.array(range(n), pa.int64()),
        "x": _wide_decimals(col(5, -(2**127))),  # negating it raises inside DuckDB
        "ts": raw_array(pa.timestamp("us"), col(0, -I64 - 1)),  # date_trunc raises
        "tm": raw_array(pa.time64("us"), col(0, 2**62)),  # printing raises
    })


CHECKS = "SELECT -x, x::VARCHAR, date_trunc('year', ts), tm::VARCHAR FROM {src}"


def test_control_duckdb_table_values_raise_on_use() -> None:
    con = duckdb.connect()
    con.register("src", _hostile_duckdb_rows(True))
    con.execute("CREATE TABLE dt AS SELECT * FROM src")
    with pytest.raises(duckdb.Error):
        con.sql("SELECT date_trunc('year', ts) FROM dt").fetchall()
    assert con.sql("SELECT date_trunc('year', ts) FROM dt WHERE uid < 3").fetchall() == [(dt.datetime(1970, 1, 1),)] * 3


@pytest.mark.parametrize("kind", ["duckdb", "arrow", "parquet", "parquet_replace"])
def test_values_beyond_the_declared_type_are_null(tmp_path: Path, kind: str) -> None:
    """A DECIMAL beyond its precision, a timestamp at the int64 extremes, a TIME past midnight:
    NULL in the view of every source kind, and D vs D' give the same outcome."""
    results = []
    for extra in (False, True):
        t = _hostile_duckdb_rows(extra)
        con = None
        engine: dict[str, Any] = {}
        src: Any = t
        if kind == "duckdb":
            con = duckdb.connect()
            con.register("src", t)
            con.execute("CREATE TABLE dt AS SELECT * FROM src")
            con.unregister("src")
            src = "dt"
        elif kind.startswith("parquet"):
            pq.write_table(t.drop_columns(["tm"]) if kind == "parquet_replace" else t, tmp_path / f"{extra}.parquet")
            src = str(tmp_path / f"{extra}.parquet")
            engine = {"invalid_text": "replace"} if kind == "parquet_replace" else {}
        s = dpsql.Session(budget=Budget(10.0, 1e-3), connection=con, engine=engine or None)
        use_noise(s, zero_noise())
        s.register("t", src, privacy_unit="uid")
        checks = CHECKS if kind != "parquet_replace" else CHECKS.replace(", tm::VARCHAR", "")
        rows = s._engine.connection.execute(checks.format(src=f'"{s.tables["t"].view}"') + " ORDER BY uid").fetchall()
        assert len(rows) == N + extra
        if extra:
            assert all(v is None for v in rows[-1])
        assert rows[0][0] == -5
        s.query("SELECT COUNT(*) FROM t WHERE x IS NOT NULL AND ts IS NOT NULL", epsilon=1.0)
        results.append(s.remaining())
    assert results == [Budget(9.0, 1e-3)] * 2


@pytest.mark.parametrize("declared", ["TIMESTAMP", "TIMESTAMPTZ"])
def test_csv_declared_timestamp_at_the_edge_of_the_range(tmp_path: Path, declared: str) -> None:
    """A CSV value that TRY_CAST accepts but date_trunc cannot truncate (DuckDB's first year)."""
    body = "uid,ts\n" + "".join(f"{i},2024-01-0{1 + i % 9} 10:00:00\n" for i in range(N))
    results = []
    for extra in ("", f"{N},290309-12-22 (BC) 00:00:00\n"):
        p = tmp_path / f"c{len(extra)}.csv"
        p.write_text(body + extra)
        sql = ("SELECT COUNT(*) FROM t WHERE date_trunc('year', ts) IS NOT NULL" if declared == "TIMESTAMP"
               else "SELECT COUNT(*) FROM t WHERE CAST(ts AS VARCHAR) IS NOT NULL")
        results.append(outcome(str(p), sql, columns={"ts": {"type": declared}, "uid": {"type": "BIGINT"}}))
    assert results == [OK, OK]


def test_csv_declared_timestamp_control(tmp_path: Path) -> None:
    """The control: the same value through TRY_CAST alone makes date_trunc raise."""
    con = duckdb.connect()
    with pytest.raises(duckdb.Error):
        con.sql("SELECT date_trunc('year', TRY_CAST('290309-12-22 (BC) 00:00:00' AS TIMESTAMP))").fetchall()


@pytest.mark.parametrize("case", ["date32", "timestamp_us", "date64", "timestamp_s"])
def test_values_where_date_trunc_raises_are_null(case: str) -> None:
    """DuckDB accepts a date or timestamp in its first year (290309 BC), where date_trunc to the
    year raises; the analyst may truncate any DATE/TIMESTAMP. Stored days/microseconds/...:
    -106751988 days is 290309-12-25 (BC); -9223371990000000000 us is in 290309 BC too."""
    typ, hostile = {
        "date32": (pa.date32(), -106_751_988),
        "timestamp_us": (pa.timestamp("us"), -9_223_371_990_000_000_000),
        "date64": (pa.date64(), -106_751_988 * 86_400_000),
        "timestamp_s": (pa.timestamp("s"), -9_223_371_990_000),
    }[case]
    d, d1 = neighbours(typ, hostile)
    sql = "SELECT COUNT(*) FROM t WHERE date_trunc('year', x) IS NOT NULL"
    assert outcome(d, sql) == OK
    assert outcome(d1, sql) == OK


def test_control_date_trunc_raises_in_duckdbs_first_year() -> None:
    con = duckdb.connect()
    with pytest.raises(duckdb.Error):
        con.sql("SELECT date_trunc('year', DATE '1970-01-01' - 106751988)").fetchall()
    assert con.sql("SELECT date_trunc('year', DATE '1970-01-01' - 106639487)").fetchall()  # our first day


def test_extension_types_read_through_their_storage(tmp_path: Path) -> None:
    """bool8 and UUID columns of a Parquet dataset: a filter DuckDB pushes into the dataset must
    not meet an extension type (Arrow has no kernel for it: every such query used to fail)."""
    t = pa.table({
        "uid": pa.array(range(4), pa.int64()),
        "flag": pa.ExtensionArray.from_storage(pa.bool8(), pa.array([0, 1, 2, None], pa.int8())),
        "u": pa.array([b"\0" * 16, b"\xff" * 16, b"\x01" * 16, None], pa.uuid()),
    })
    pq.write_table(t, tmp_path / "e.parquet")
    for src in (t, str(tmp_path / "e.parquet")):
        assert view_rows(src, 'SELECT flag, u::VARCHAR FROM "{view}" ORDER BY uid') == [
            (False, "00000000-0000-0000-0000-000000000000"), (True, "ffffffff-ffff-ffff-ffff-ffffffffffff"),
            (True, "01010101-0101-0101-0101-010101010101"), (None, None)]
        assert outcome(src, "SELECT COUNT(*) FROM t WHERE flag AND u IS NOT NULL") == OK


def test_extension_column_filter_neighbours(tmp_path: Path) -> None:
    """D: the person's bool8 is absent and every other flag NULL (a row group without
    statistics); D': the person has a flag. A filter pushed into the scan used to fail only on
    D' (Arrow has no kernel for the extension type stored in the file)."""
    results = []
    for extra in (False, True):
        flags = [None] * N + ([1] if extra else [])
        t = pa.table({"uid": pa.array(range(len(flags)), pa.int64()),
                      "flag": pa.ExtensionArray.from_storage(pa.bool8(), pa.array(flags, pa.int8()))})
        pq.write_table(t, tmp_path / f"f{extra}.parquet")
        results.append(outcome(str(tmp_path / f"f{extra}.parquet"), "SELECT COUNT(*) FROM t WHERE flag"))
    assert results == [OK, OK]


def test_unknown_extension_types_are_refused() -> None:
    class Opaque(pa.ExtensionType):
        def __init__(self) -> None:
            super().__init__(pa.int64(), "example.opaque")

        def __arrow_ext_serialize__(self) -> bytes:
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> Opaque:
            return Opaque()

    col = pa.ExtensionArray.from_storage(Opaque(), pa.array([1], pa.int64()))
    with pytest.raises(dpsql.errors.ConfigError, match="'t.o' has extension type example.opaque"):
        dpsql.Session(budget=Budget(1.0)).register("t", pa.table({"uid": [1], "o": col}), privacy_unit="uid")
