"""A Parquet source read by DuckDB's own reader (``invalid_text = "replace"``) whose file is replaced after
registration by one storing a column another way under the same Arrow schema: a ``timestamp[us]`` column now
stored as INT96 (Spark's, Hive's and Impala's legacy timestamps; pyarrow reads it in microseconds as the engine
asks, so the Arrow schema is unchanged). Registration refuses INT96 for that reader, which raises on a stored
value out of range; the check before every charge must refuse it too, whatever the rows: one person's
out-of-range INT96 value failed the query after its charge, the same file without that person was answered."""

from __future__ import annotations

import datetime
import os
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

N = 5
SQL = "SELECT COUNT(*) AS n FROM t WHERE t IS NOT NULL"
_ODD = datetime.datetime(2001, 2, 3, 4, 5, 6, 789012)  # the hostile person's value before its day is forged


def _int96(path: Path, hostile: bool) -> None:
    """N people with an ordinary timestamp stored as INT96, and the hostile person, whose stored Julian day is
    2^31 - 1 (out of DuckDB's range; pyarrow reads it as a wrapped instant): the value's bytes are patched in
    an uncompressed, plain-encoded file without statistics."""
    vals = [datetime.datetime(2020, 1, 1)] * N + ([_ODD] if hostile else [])
    table = pa.table({"uid": pa.array(range(len(vals)), pa.int64()), "t": pa.array(vals, pa.timestamp("us"))})
    pq.write_table(table, path, use_deprecated_int96_timestamps=True, compression="NONE", use_dictionary=False,
                   write_statistics=False)
    if hostile:
        data = bytearray(path.read_bytes())
        nanos = ((_ODD.hour * 60 + _ODD.minute) * 60 + _ODD.second) * 10**9 + _ODD.microsecond * 1000
        day = (_ODD.date() - datetime.date(1970, 1, 1)).days + 2440588
        at = data.find(struct.pack("<qi", nanos, day))
        assert at >= 0
        data[at + 8:at + 12] = struct.pack("<i", 2**31 - 1)
        path.write_bytes(bytes(data))


def _session(tmp_path: Path) -> tuple[dpsql.Session, Path]:
    path = tmp_path / "t.parquet"
    table = pa.table({"uid": pa.array(range(N), pa.int64()),
                      "t": pa.array([datetime.datetime(2020, 1, 1)] * N, pa.timestamp("us"))})
    pq.write_table(table, path)
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5), engine={"invalid_text": "replace"})
    use_noise(s, zero_noise(1))
    s.register("t", str(path), privacy_unit="uid")
    assert s.query(SQL, epsilon=0.1).table.to_pylist() == [{"n": N}]
    return s, path


@pytest.mark.parametrize("hostile", [False, True])
def test_a_file_replaced_by_one_storing_int96_timestamps_is_refused_before_the_charge(tmp_path: Path,
                                                                                      hostile: bool) -> None:
    s, path = _session(tmp_path)
    new = tmp_path / "new.parquet"
    _int96(new, hostile)
    assert pq.ParquetFile(new, coerce_int96_timestamp_unit="us").schema_arrow.equals(pq.ParquetFile(path).schema_arrow)
    os.replace(new, path)
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 't'.*INT96.*nothing was charged"):
        s.query(SQL, epsilon=1.0)
    assert s.remaining() == left
    # registration refuses such a file too
    with pytest.raises(ConfigError, match="INT96"):
        s.register("t2", str(path), privacy_unit="uid")
    s.close()


def test_control_duckdbs_reader_fails_on_the_hostile_int96_value_only(tmp_path: Path) -> None:
    import duckdb

    for hostile in (False, True):
        path = tmp_path / f"h{hostile}.parquet"
        _int96(path, hostile)
        con = duckdb.connect()
        read = f"SELECT COUNT(t) FROM read_parquet('{path}')"
        if hostile:
            with pytest.raises(duckdb.InvalidInputException):
                con.sql(read).fetchall()
        else:
            assert con.sql(read).fetchall() == [(N,)]
        con.close()


def test_control_a_file_replaced_by_one_storing_the_same_way_is_read_as_it_now_is(tmp_path: Path) -> None:
    s, path = _session(tmp_path)
    table = pa.table({"uid": pa.array(range(N + 1), pa.int64()),
                      "t": pa.array([datetime.datetime(2021, 1, 1)] * (N + 1), pa.timestamp("us"))})
    new = tmp_path / "new.parquet"
    pq.write_table(table, new)
    os.replace(new, path)
    assert s.query(SQL, epsilon=1.0).table.to_pylist() == [{"n": N + 1}]
    s.close()
