"""A released NaN key has the same bits whichever person's NaN the engine met first.

DuckDB groups every NaN as one value but keeps the bits of the first row it met: over D plus one person
whose DOUBLE holds a NaN with its sign bit set and a payload (0xFFF8000000000001), ``SELECT x FROM t GROUP BY
x`` returns that person's bits as the group's key when their row comes first, and ``CAST(x AS VARCHAR)`` spells
it ``-nan`` (the negative control below). A released key of those bits (in a Parquet output, or through
``struct``) would tell that the person is present. dpsql normalises every NaN to one NaN before grouping
(docs/expressions.md, the key types table): on D and on D plus that person, the released NaN key is the
canonical quiet NaN and its text ``nan``, for a DOUBLE and a REAL column, a plain key, DISTINCT and keys
computed from the column.
"""

from __future__ import annotations

import struct

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

NEG_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000001))[0]
CANONICAL = "7ff8000000000000"  # the bits of a quiet NaN, as a big-endian hex word
N = 240


def _table(person: bool) -> pa.Table:
    x = np.array([float(i % 3) for i in range(N)])
    x[::3] = np.nan  # a third of the people hold the canonical NaN
    uid = np.arange(N) % 120
    if person:  # first in the table: the row DuckDB meets first
        x, uid = np.concatenate([[NEG_NAN] * 3, x]), np.concatenate([[9999] * 3, uid])
    return pa.table({"uid": uid, "x": x, "f": pa.array(x.astype(np.float32))})


def _bits(v: float) -> str:
    return struct.pack(">d", v).hex()


def _released_keys(person: bool, sql: str) -> list[object]:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    try:
        use_noise(s, zero_noise())
        s.register("t", _table(person), privacy_unit="uid")
        col = s.query(sql, epsilon=3.0, delta=1e-5).table.column(0)
        return [_bits(v) if isinstance(v, float) else v for v in col.to_pylist()]
    finally:
        s.close()


def test_the_data_holds_the_persons_nan_bits_and_duckdb_would_release_them() -> None:
    """Negative control: without dpsql's normalisation the group's key is that person's NaN."""
    con = duckdb.connect()
    t = _table(True)
    con.register("t", t)
    keys = [_bits(v) for v in con.sql("SELECT x FROM t GROUP BY x").to_arrow_table().column(0).to_pylist()
            if v != v]
    assert keys == [_bits(NEG_NAN)] != [CANONICAL]
    assert "-nan" in [r[0] for r in con.sql("SELECT CAST(x AS VARCHAR) FROM t GROUP BY 1").fetchall()]
    con.close()


@pytest.mark.parametrize("sql", [
    "SELECT x, COUNT(*) FROM t GROUP BY x",
    "SELECT DISTINCT x FROM t",
    "SELECT f, COUNT(*) FROM t GROUP BY f",
    "SELECT -x AS y, COUNT(*) FROM t GROUP BY y",
    "SELECT CAST(f AS DOUBLE) AS y, COUNT(*) FROM t GROUP BY y",
    "SELECT coalesce(x, 1) AS y, COUNT(*) FROM t GROUP BY y",
])
def test_a_released_nan_key_has_the_canonical_bits_on_both_neighbours(sql: str) -> None:
    with_person, without = _released_keys(True, sql), _released_keys(False, sql)
    assert with_person == without
    nans = [k for k in with_person if isinstance(k, str) and k.startswith(("7ff", "fff")) and k not in ("7ff0000000000000", "fff0000000000000")]
    assert nans == [CANONICAL], with_person


@pytest.mark.parametrize("column", ["x", "f"])
def test_a_nan_key_cast_to_text_is_spelled_nan_on_both_neighbours(column: str) -> None:
    sql = f"SELECT CAST({column} AS VARCHAR) AS y, COUNT(*) FROM t GROUP BY y"
    with_person, without = _released_keys(True, sql), _released_keys(False, sql)
    assert with_person == without
    assert "nan" in with_person and "-nan" not in with_person
