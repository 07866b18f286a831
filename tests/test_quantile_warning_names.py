"""The warning that a MIN came out above its MAX names the column as written, whatever its name holds: a column
named with braces (``x{y}``, a name a Parquet file may carry) made the warning's text formatting raise, so the
query failed after its charge whenever the released MIN and MAX crossed."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("name", ["x", "x{y}", "x{}", "{where}", "x{0}"])
def test_min_above_max_is_released_with_its_warning(name: str) -> None:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.0))
    use_noise(s, zero_noise(1))
    s.register("t", pa.table({"uid": [1, 2, 3], name: [1.0, 2.0, 9.0]}), privacy_unit="uid", max_rows_per_unit=1,
               columns={name: {"bounds": (0, 10), "bins": 10}})
    quoted = '"' + name + '"'
    r = s.query(f"SELECT MIN({quoted}) AS lo, MAX({quoted}) AS hi FROM t", epsilon=0.1)  # c = 397 of 3 rows: they cross
    [row] = r.table.to_pylist()
    assert row["lo"] > row["hi"]
    [w] = r.warnings
    assert w.startswith(f"MIN({name if name == 'x' else quoted}) came out above MAX(") and ": they estimate" in w, w
    assert s.history().column("status").to_pylist() == ["released"]
