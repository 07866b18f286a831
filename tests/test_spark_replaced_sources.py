"""A Parquet file replaced under a table registered on the Spark engine (an ETL job writing a new export under
the same name): checked before every charge, as on the DuckDB engine.

Spark's relation keeps the file listing it made at registration (each file's size), and the view reads the
columns as decided then from the footers (DECIMALs read as their stored bytes or integers, timestamps in
milliseconds as their integers). A file replaced since was read with the old size (row groups beyond it
skipped: the answer missed rows) or with types its footer no longer has, failing after the charge depending
on the new file's bytes. Now: the same footer schema -> read as it now is; another one, or a file gone ->
refused for free (ConfigError, hint: register again).
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import require_spark

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

require_spark()


@pytest.fixture(scope="module")
def s() -> Iterator[dpsql.Session]:
    sess = dpsql.Session(budget=Budget(1e6, 0.5), engine={"kind": "spark", "statement_timeout": 300})
    use_noise(sess, zero_noise(1))
    yield sess
    sess.close()


def _table(n: int, start: int = 0, x_type: pa.DataType = pa.int32(), drop: bool = False, add: bool = False,
           big: bool = False) -> pa.Table:
    uid = np.arange(start, start + n)
    x = pa.array((uid % 5).astype(np.int64) + (np.where(uid == start, 2**40, 0) if big else 0)).cast(x_type)
    cols = {"uid": pa.array(uid), "x": x}
    if drop:
        del cols["x"]
    if add:
        cols["y"] = pa.array(np.ones(n))
    return pa.table(cols)


def _replace(path: Path, table: pa.Table, **kw: object) -> None:
    tmp = path.with_name(path.name + ".new")
    pq.write_table(table, tmp, **kw)  # type: ignore[arg-type]
    tmp.replace(path)


def _count_sum(s: dpsql.Session, name: str) -> list[dict[str, object]]:
    return s.query(f"SELECT COUNT(*) AS n, SUM(x) AS sx FROM {name}", epsilon=1.0).table.to_pylist()


def _expected(n: int, start: int = 0) -> list[dict[str, object]]:
    return [{"n": n, "sx": float(sum(i % 5 for i in range(start, start + n)))}]


def _register(s: dpsql.Session, name: str, source: str) -> None:
    s.register(name, source, privacy_unit="uid", columns={"x": {"bounds": (0, 10)}})


@pytest.mark.parametrize("rows", [101, 20000, 60])
def test_a_replaced_file_with_the_same_schema_is_read_as_it_now_is(s: dpsql.Session, tmp_path: Path, rows: int) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(_table(100), path)
    _register(s, "same", str(path))
    assert _count_sum(s, "same") == _expected(100)
    # more rows in more row groups (a larger file than the listing Spark made at registration)
    _replace(path, _table(rows, start=7), row_group_size=1000)
    assert _count_sum(s, "same") == _expected(rows, 7)
    _replace(path, _table(rows + 3, start=1))
    assert _count_sum(s, "same") == _expected(rows + 3, 1)


def test_one_file_of_several_replaced_is_read_as_it_now_is(s: dpsql.Session, tmp_path: Path) -> None:
    for i in range(3):
        pq.write_table(_table(50, start=50 * i), tmp_path / f"part{i}.parquet")
    _register(s, "multi", str(tmp_path / "part*.parquet"))
    assert _count_sum(s, "multi") == _expected(150)
    _replace(tmp_path / "part1.parquet", _table(5000, start=1000), row_group_size=500)  # new persons
    got = _count_sum(s, "multi")
    assert got == [{"n": 5100, "sx": float(sum(i % 5 for i in [*range(50), *range(1000, 6000), *range(100, 150)]))}]


REPLACEMENTS = {
    "int_to_bigint": {"x_type": pa.int64()},
    "int_to_bigint_big": {"x_type": pa.int64(), "big": True},
    "column_added": {"add": True},
    "column_dropped": {"drop": True},
    "to_text": {"x_type": pa.string()},
    "to_double": {"x_type": pa.float64()},
}


@pytest.mark.parametrize("case", sorted(REPLACEMENTS))
@pytest.mark.parametrize("multi", [False, True])
def test_a_replaced_file_with_another_schema_is_refused_before_the_charge(s: dpsql.Session, tmp_path: Path, case: str,
                                                                         multi: bool) -> None:
    for i in range(3 if multi else 1):
        pq.write_table(_table(40, start=40 * i), tmp_path / f"p{i}.parquet")
    source = str(tmp_path / ("p*.parquet" if multi else "p0.parquet"))
    _register(s, "other", source)
    _count_sum(s, "other")
    _replace(tmp_path / ("p1.parquet" if multi else "p0.parquet"), _table(40, start=40 if multi else 0,
                                                                           **REPLACEMENTS[case]))  # type: ignore[arg-type]
    left, done = s.remaining(), s.history().num_rows
    for sql in ("SELECT COUNT(*) FROM other", "SELECT SUM(x) FROM other", "SELECT COUNT(*) FROM other WHERE uid > 3"):
        with pytest.raises(ConfigError, match=r"(?s)table 'other'.*changed.*nothing was charged.*register"):
            s.query(sql, epsilon=1.0)
    assert s.remaining() == left and s.history().num_rows == done
    # registered again (all files written alike), the files are read as they now are
    for i in range(3 if multi else 1):
        _replace(tmp_path / f"p{i}.parquet", _table(40, start=40 * i, **REPLACEMENTS[case]))  # type: ignore[arg-type]
    s.register("other", source, privacy_unit="uid")
    assert s.query("SELECT COUNT(*) AS n FROM other", epsilon=0.1).table.to_pylist() == [{"n": 120 if multi else 40}]


def _decimals(n: int, p: int) -> pa.Table:
    return pa.table({"uid": np.arange(n), "d": pa.array([decimal.Decimal(i % 7) / 4 for i in range(n)],
                                                        pa.decimal128(p, 2))})


@pytest.mark.parametrize(("before", "after"), [
    ({}, {"store_decimal_as_integer": True}),   # FIXED_LEN_BYTE_ARRAY -> INT64, the same DECIMAL(18, 2)
    ({"store_decimal_as_integer": True}, {}),  # and back
])
def test_a_decimal_stored_another_way_is_refused_before_the_charge(s: dpsql.Session, tmp_path: Path,
                                                                   before: dict[str, bool], after: dict[str, bool]) -> None:
    """The same Arrow type, another Parquet storage: the view's reading was decided from the footers."""
    path = tmp_path / "d.parquet"
    pq.write_table(_decimals(60, 18), path, **before)  # type: ignore[arg-type]
    s.register("dec", str(path), privacy_unit="uid", columns={"d": {"bounds": (0, 2)}})
    s.query("SELECT SUM(d) FROM dec", epsilon=1.0)
    _replace(path, _decimals(60, 18), **after)
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 'dec'.*changed.*nothing was charged"):
        s.query("SELECT SUM(d) FROM dec", epsilon=1.0)
    assert s.remaining() == left


def test_a_wide_decimal_replaced_with_the_same_storage_is_read_as_it_now_is(s: dpsql.Session, tmp_path: Path) -> None:
    """Negative control of the storage check: a DECIMAL(38, 2) (read as its stored bytes) with new rows."""
    path = tmp_path / "w.parquet"
    pq.write_table(_decimals(60, 38), path)
    s.register("wide", str(path), privacy_unit="uid", columns={"d": {"bounds": (0, 2)}})
    assert s.query("SELECT COUNT(*) AS n FROM wide", epsilon=1.0).table.to_pylist() == [{"n": 60}]
    _replace(path, _decimals(3000, 38))
    assert s.query("SELECT COUNT(*) AS n FROM wide", epsilon=1.0).table.to_pylist() == [{"n": 3000}]


@pytest.mark.parametrize("multi", [False, True])
def test_a_deleted_file_is_refused_before_the_charge(s: dpsql.Session, tmp_path: Path, multi: bool) -> None:
    for i in range(2 if multi else 1):
        pq.write_table(_table(30, start=30 * i), tmp_path / f"g{i}.parquet")
    _register(s, "gone", str(tmp_path / ("g*.parquet" if multi else "g0.parquet")))
    _count_sum(s, "gone")
    (tmp_path / "g0.parquet").unlink()
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 'gone'.*nothing was charged.*register"):
        s.query("SELECT COUNT(*) FROM gone", epsilon=1.0)
    assert s.remaining() == left


def test_an_unchanged_file_is_read_without_a_new_relation(s: dpsql.Session, tmp_path: Path) -> None:
    """Negative control: the same version is read as registered, its views not made again."""
    path = tmp_path / "u.parquet"
    pq.write_table(_table(100), path)
    _register(s, "kept", str(path))
    engine = s._engine
    spec = s._catalog.get("kept")
    assert spec is not None and spec.view is not None
    before = engine.spark.table(spec.view)._jdf.queryExecution().analyzed().toString()
    for _ in range(2):
        assert _count_sum(s, "kept") == _expected(100)
    assert engine.source_changed(spec.view) is None
    assert engine.spark.table(spec.view)._jdf.queryExecution().analyzed().toString() == before


def test_a_directory_source_with_a_file_replaced_is_read_as_it_now_is(s: dpsql.Session, tmp_path: Path) -> None:
    d = tmp_path / "dir.parquet"  # a directory, as Spark writes its output
    d.mkdir()
    for i in range(2):
        pq.write_table(_table(40, start=40 * i), d / f"part{i}.parquet")
    _register(s, "dir", str(d))
    assert _count_sum(s, "dir") == _expected(80)
    _replace(d / "part0.parquet", _table(3000, start=1000), row_group_size=300)  # new persons
    assert _count_sum(s, "dir") == [{"n": 3040, "sx": float(sum(i % 5 for i in [*range(1000, 4000), *range(40, 80)]))}]
    (d / "part2.parquet").write_bytes((d / "part1.parquet").read_bytes())
    _replace(d / "part0.parquet", _table(30, start=5000))
    with pytest.raises(ConfigError, match=r"(?s)table 'dir'.*directory lists other.*nothing was charged"):
        _count_sum(s, "dir")
    (d / "part2.parquet").unlink()
    assert _count_sum(s, "dir") == [{"n": 70, "sx": float(sum(i % 5 for i in [*range(5000, 5030), *range(40, 80)]))}]
    _replace(d / "part1.parquet", _table(40, start=40, x_type=pa.int64()))
    with pytest.raises(ConfigError, match=r"(?s)table 'dir'.*changed.*nothing was charged"):
        _count_sum(s, "dir")
