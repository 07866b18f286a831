"""Private sources and range workloads under hostile data (one person's rows, the owner's files)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.errors import ConfigError


@pytest.mark.parametrize("how", ["null", "replace"])
@pytest.mark.parametrize("misfit", [False, True])
def test_files_naming_a_column_in_another_case_are_refused_at_registration(
        tmp_path: Path, how: str, misfit: bool) -> None:
    """A multi-file Parquet source whose second file stores ``age`` as ``AGE`` (and as int64, the first
    as int32) passed the same-types check, which compared names case-sensitively. With
    ``invalid_text = "replace"`` DuckDB's reader matches names case-insensitively and casts the second
    file's column to the first's type: every query reading ``age`` failed after its charge exactly
    when one person's value was 2^40 (the same file with 40 answered). The Arrow view read the column
    as NULL in that file instead, so the two readers disagreed. Now refused at registration, free."""
    pq.write_table(pa.table({"uid": pa.array([1, 2, 3], pa.int64()), "age": pa.array([10, 20, 30], pa.int32())}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"uid": pa.array([4], pa.int64()), "AGE": pa.array([2**40 if misfit else 40], pa.int64())}),
                   tmp_path / "b.parquet")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"invalid_text": how})
    with pytest.raises(ConfigError, match=r"column 'AGE' .*b\.parquet.* 'age' .*a\.parquet"):
        s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid", max_rows_per_unit=1)
    assert s.history().num_rows == 0
    s.close()


def test_files_naming_columns_alike_still_register(tmp_path: Path) -> None:
    """Control: the same names in every file (another order, a column missing) register and read."""
    pq.write_table(pa.table({"uid": pa.array([1, 2, 3], pa.int64()), "age": pa.array([10, 20, 30], pa.int32())}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"age": pa.array([40], pa.int32()), "uid": pa.array([4], pa.int64())}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"uid": pa.array([5], pa.int64())}), tmp_path / "c.parquet")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"invalid_text": "replace"})
    s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid", max_rows_per_unit=1)
    s.close()
