"""The decision before the charge of a QUALIFY whose only reading of released values is the order of one ROW_NUMBER()
partitioned by keys, over public keys: the number of rows it keeps must not depend on the released values, or a query
that would release rows is refused for free (or an OFFSET is refused by a wrong bound).

Finding: beside the row number, a window with no ORDER BY over the keys alone was taken as constant on each partition.
NTILE, LAG and LEAD (and another ROW_NUMBER) are not: without an ORDER BY they still number or shift the rows, in the
keys' order (the ties are broken by the keys), so a row number over released values meets them on a set of rows that
depends on those values. ``ROW_NUMBER() OVER (ORDER BY n DESC) <> NTILE(3) OVER ()`` kept no row over the placeholders
(all 0: numbered in the keys' order, as NTILE is) and was refused for free, though the release keeps two rows. Now such a
QUALIFY is not decided before the charge: the query runs. Windows constant on the partition (aggregates, RANK,
FIRST_VALUE with no ORDER BY) are still decided.

Finding: a Parquet source of 0 bytes (or without its footer yet: still being written) is an input not there yet on
DuckDB (exit 66, retried by a scheduler), but was a ConfigError on Spark (exit 2). Now it is an InputUnavailableError
on Spark too.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def session() -> Any:
    # counts by key differ (a: 20, b: 60, c: 100) and grow in the keys' order
    con = duckdb.connect()
    con.execute("CREATE TABLE d AS SELECT r AS uid, CASE WHEN r < 100 THEN 'c' WHEN r < 160 THEN 'b' ELSE 'a' END AS k, "
                "CASE WHEN r < 100 THEN 2 WHEN r < 160 THEN 1 ELSE 0 END AS i FROM range(0, 180) t(r)")
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "d", privacy_unit="uid", max_groups_per_unit=1, max_rows_per_unit=1,
               columns={"k": {"domain": ["a", "b", "c"]}, "i": {"domain": [0, 1, 2]}})
    yield s
    s.close()


def _charges(s: dpsql.Session) -> int:
    return int(s.history().num_rows)


ORDER_READING = [
    # (the QUALIFY, the keys the release keeps under zero noise: row numbers by count descending are c 1, b 2, a 3)
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY n DESC) <> ntile(3) OVER ()",
     ["a", "c"]),
    ("SELECT i, COUNT(*) AS n FROM t GROUP BY i QUALIFY row_number() OVER (ORDER BY n DESC) <> lead(i, 1, 3) OVER ()",
     [0, 2]),
    ("SELECT i, COUNT(*) AS n FROM t GROUP BY i QUALIFY row_number() OVER (ORDER BY n DESC) <> lag(i, 1, -1) OVER () + 2",
     [0, 2]),
]


@pytest.mark.parametrize(("sql", "kept"), ORDER_READING)
def test_a_row_number_beside_a_window_that_reads_the_rows_order_is_not_decided_before_the_charge(
        session: Any, sql: str, kept: list[Any]) -> None:
    """Was: refused for free ('keep no declared key'), the placeholders numbered in the keys' order as NTILE / LAG /
    LEAD are. Now: answered and charged, with the rows the release keeps."""
    before = _charges(session)
    r = session.query(sql, epsilon=1.0, delta=1e-6)
    assert sorted(r.table.column(0).to_pylist()) == kept
    assert _charges(session) == before + 1


@pytest.mark.parametrize("sql", [
    # negative controls: windows constant on the row number's partition still let it be decided (it keeps no row)
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY n DESC) > COUNT(*) OVER ()",
    "SELECT i, COUNT(*) AS n FROM t GROUP BY i QUALIFY row_number() OVER (ORDER BY n DESC) > first_value(i) OVER () + 3",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY n DESC) > rank() OVER () + 2",
])
def test_a_row_number_beside_windows_constant_on_its_partition_is_still_refused_for_free(session: Any, sql: str) -> None:
    before = _charges(session)
    with pytest.raises(errors.UnsupportedQueryError, match="or the rows' numbers"):
        session.query(sql, epsilon=1.0, delta=1e-6)
    assert _charges(session) == before


def _spark_missing() -> str | None:
    import importlib.util
    import shutil

    return ("the Spark engine needs the 'spark' extra" if importlib.util.find_spec("pyspark") is None else
            "the Spark engine needs Java on the PATH" if shutil.which("java") is None else None)


@pytest.mark.skipif(_spark_missing() is not None, reason=str(_spark_missing()))
def test_a_parquet_source_still_being_written_is_an_input_not_there_yet_on_spark_too(tmp_path: Any) -> None:
    """A table source named .parquet of 0 bytes (created, not yet written) is an input not there yet on DuckDB (exit 66:
    a scheduler retries), as one whose footer is not written yet. On Spark both were a ConfigError (exit 2: 'cannot
    read table source ... check that the path exists'), which a scheduler does not retry. Now both are an
    InputUnavailableError naming the file, as on DuckDB; a file that is no Parquet at all stays a ConfigError."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from _spark import comparable_session

    pq.write_table(pa.table({"uid": pa.array([1, 2, 3], pa.int64())}), tmp_path / "whole.parquet")
    data = (tmp_path / "whole.parquet").read_bytes()
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "half.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.parquet").write_bytes(b"uid\n1\n2\n")
    s = comparable_session("spark")
    try:
        for f, said in (("empty", r"is empty \(0 bytes\)"), ("half", "no footer yet")):
            with pytest.raises(errors.InputUnavailableError, match=said):
                s.register(f, str(tmp_path / f"{f}.parquet"), privacy_unit="uid")
        with pytest.raises(errors.ConfigError) as e:
            s.register("text", str(tmp_path / "text.parquet"), privacy_unit="uid")
        assert not isinstance(e.value, errors.InputUnavailableError)
        s.register("whole", str(tmp_path / "whole.parquet"), privacy_unit="uid")
    finally:
        s.close()
