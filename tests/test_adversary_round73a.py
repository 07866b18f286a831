"""What the analyst reads of a release (its columns' types, the meta, the command line's outputs) as a function of public
metadata and released values: one key column, one type, whichever mechanism answers. Each test says what was wrong
and what is right now.

* A histogram over an integer column's declared bins (``GROUP BY age``, answered by DAWA) released its keys as BIGINT
  (Arrow int64), where every other route releases the key column's own type (INTEGER: int32 for a sparse histogram's
  keys, ``SELECT age, COUNT(*), SUM(x) ... GROUP BY age``, or a declared domain's). So an output file's schema followed
  the route, and post-processing read the keys differently: ``age * 2000000000`` was 4000000000 over DAWA's BIGINT
  keys, and NULL (INTEGER overflow, made total) over the sparse histogram's. Now DAWA's integer keys have the column's
  type, and ``age * 2000000000`` over the declared bins is refused for free, as over a declared domain.
"""

from __future__ import annotations

import warnings

import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import QueryTypeError
from dpsql.testing import use_noise, zero_noise


def _people() -> pa.Table:
    n = 120
    return pa.table({"pid": list(range(n)), "age": pa.array([i % 50 for i in range(n)], pa.int32()),
                     "small": pa.array([i % 20 for i in range(n)], pa.int16()),
                     "x": [float(i % 10) for i in range(n)]})


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
    use_noise(s, zero_noise(73))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s.register("t", _people(), privacy_unit="pid", max_rows_per_unit=1,
                   columns={"age": {"bounds": (0, 50), "bins": 50}, "small": {"bounds": (0, 20), "bins": 20},
                            "x": {"bounds": (0, 10)}})
    return s


@pytest.mark.parametrize("col,typ", [("age", pa.int32()), ("small", pa.int16())])
def test_a_histograms_integer_keys_have_the_columns_type(col: str, typ: pa.DataType) -> None:
    s = _session()
    dawa = s.query(f"SELECT {col}, COUNT(*) AS n FROM t GROUP BY {col}", epsilon=1.0)
    assert dawa.mechanism == "dawa"
    sparse = s.query(f"SELECT {col}, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY {col}", epsilon=1.0, delta=1e-6)
    assert sparse.mechanism == "sparse_histogram"
    assert dawa.table.schema.field(col).type == typ == sparse.table.schema.field(col).type
    assert dawa.meta()["column_types"][0] == str(typ)
    listed = s.query(f"SELECT {col}, COUNT(*) AS n FROM t WHERE {col} IN (1, 2) GROUP BY {col}", epsilon=1.0)
    assert listed.table.schema.field(col).type == typ and listed.table.column(col).to_pylist() == [1, 2]
    rolled = s.query(f"SELECT {col}, COUNT(*) AS n FROM t GROUP BY ROLLUP ({col})", epsilon=1.0)
    assert rolled.table.schema.field(col).type == typ


def test_post_processing_reads_a_histograms_keys_as_the_column_does() -> None:
    s = _session()
    with pytest.raises(QueryTypeError, match="cannot be evaluated on the declared key values; nothing was charged"):
        s.query("SELECT age * 2000000000 AS big, COUNT(*) AS n FROM t GROUP BY age", epsilon=1.0)
    assert s.history().num_rows == 0


def test_keys_a_type_cannot_hold_or_that_are_no_integers_stay_as_before() -> None:
    """Negative control: a histogram over ``floor(age / 10) * 10`` releases doubles (DuckDB's type of that key), and a
    key that fits keeps its value."""
    s = _session()
    r = s.query("SELECT floor(age / 10) * 10 AS decade, COUNT(*) AS n FROM t GROUP BY decade", epsilon=1.0)
    assert r.table.schema.field("decade").type == pa.float64()
    assert r.table.column("decade").to_pylist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    r = s.query("SELECT age, COUNT(*) AS n FROM t GROUP BY age", epsilon=1.0)
    assert r.table.column("age").to_pylist() == list(range(50))
