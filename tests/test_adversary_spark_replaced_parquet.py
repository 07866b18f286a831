"""A Parquet file replaced after registration on the Spark engine (an ETL job's new export under the same name):
Spark's DataFrame keeps the files' listing (their lengths) from registration, so a larger new file was read as its
first bytes: 5000 rows answered as none, with no error, and whether a row group was read at all depended on where
it ended (one more row could move it). Before every charge the files' versions are compared: a file replaced with the
same schema is read as it now is, one of another schema (or gone) is refused for free."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import require_spark

import dpsql
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

require_spark()


@pytest.fixture(scope="module")
def spark() -> Iterator[dpsql.Session]:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), engine={"kind": "spark"})
    use_noise(s, zero_noise(1))
    yield s
    s.close()


def _table(n: int) -> pa.Table:
    return pa.table({"uid": np.arange(n), "x": pa.array(np.arange(n) % 5, pa.int32())})


SQL = "SELECT COUNT(*) AS n FROM {t} WHERE x * x > 5"


@pytest.mark.parametrize("rows", [5000, 101, 0])
def test_a_replaced_parquet_file_is_refused_for_free_or_read_as_it_now_is(spark: dpsql.Session, tmp_path: Path,
                                                                          rows: int) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(_table(100), path)
    name = f"t{rows}"
    spark.register(name, str(path), privacy_unit="uid")
    assert spark.query(SQL.format(t=name), epsilon=0.1).table.to_pylist() == [{"n": 40}]
    new = tmp_path / "new.parquet"
    pq.write_table(_table(rows), new)
    os.replace(new, path)
    left = spark.remaining()
    want = [{"n": 2 * (rows // 5) + max(0, rows % 5 - 3)}]
    try:
        got = spark.query(SQL.format(t=name), epsilon=1.0).table.to_pylist()
    except ConfigError as e:
        assert "nothing was charged" in str(e) and spark.remaining() == left
    else:
        assert got == want
    spark.register(name, str(path), privacy_unit="uid")  # registered again: read as it now is
    assert spark.query(SQL.format(t=name), epsilon=0.1).table.to_pylist() == want


def test_a_removed_parquet_file_is_refused_for_free(spark: dpsql.Session, tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(_table(100), path)
    spark.register("gone", str(path), privacy_unit="uid")
    path.unlink()
    left = spark.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 'gone'.*nothing was charged"):
        spark.query(SQL.format(t="gone"), epsilon=1.0)
    assert spark.remaining() == left


def test_control_an_unchanged_file_is_answered(spark: dpsql.Session, tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(_table(100), path)
    spark.register("same", str(path), privacy_unit="uid")
    for _ in range(2):
        assert spark.query(SQL.format(t="same"), epsilon=0.1).table.to_pylist() == [{"n": 40}]


def test_a_file_replaced_between_the_check_and_the_read_is_read_as_it_now_is(spark: dpsql.Session, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: replaced after the check before the charge, the file would be read from Spark's old listing (the
    answer from its first bytes: none of 5000 rows). The read compares the versions again under the engine's lock
    right before it runs and makes the relation again (the same schema), so the new rows are read."""
    path = tmp_path / "t.parquet"
    pq.write_table(_table(100), path)
    spark.register("race", str(path), privacy_unit="uid")
    assert spark.query(SQL.format(t="race"), epsilon=0.1).table.to_pylist() == [{"n": 40}]
    monkeypatch.setattr(spark._engine, "source_changed", lambda view: None)  # replaced after the check
    new = tmp_path / "new.parquet"
    pq.write_table(_table(5000), new)
    os.replace(new, path)
    assert spark.query(SQL.format(t="race"), epsilon=1.0).table.to_pylist() == [{"n": 2000}]
