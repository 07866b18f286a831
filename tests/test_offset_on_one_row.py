"""An OFFSET of 1 or more on an aggregate query without GROUP BY (one table, a join, a quantile, a range count of a
workload) skips the one row its release has, whatever the data, as LIMIT 0 does: refused before the charge (it was
charged and released no row). So is an OFFSET at or beyond the number of SELECTs of a UNION ALL of such queries.
OFFSET 0, an OFFSET on grouped queries and an OFFSET below the UNION ALL's row count are answered."""
from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise
from tests.test_tpch_queries import _COL, _data
from tests.test_tpch_queries import _session as _tpch_session

N = 300
BUDGET = dpsql.Budget(100.0, 1e-3)


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=BUDGET)
    s.register("t", pa.table({"uid": list(range(N)), "k": [["a", "b", "c"][i % 3] for i in range(N)],
                              "x": [i % 7 for i in range(N)]}),
               privacy_unit="uid", columns={"k": {"domain": ["a", "b", "c"]},
                                             "x": {"bounds": (0, 10), "bins": 10}}, max_rows_per_unit=1)
    use_noise(s, zero_noise())
    return s


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM t OFFSET 1",
    "SELECT COUNT(*) AS n, SUM(x) AS s FROM t LIMIT 5 OFFSET 2",
    "SELECT AVG(x) AS a FROM t WHERE k = 'a' OFFSET 1",
    "SELECT MEDIAN(x) AS m FROM t OFFSET 1",
    "SELECT COUNT(*) AS n FROM t GROUP BY () OFFSET 1",
    "SELECT COUNT(*) AS n FROM t HAVING COUNT(*) > 0 OFFSET 3",
    "SELECT COUNT(*) AS n FROM t WHERE x < 3 UNION ALL SELECT COUNT(*) AS n FROM t WHERE x >= 3 OFFSET 2",
    "SELECT COUNT(*) AS n FROM t UNION ALL SELECT SUM(x) AS n FROM t UNION ALL SELECT COUNT(*) FROM t ORDER BY 1 "
    "LIMIT 1 OFFSET 7",
])
def test_an_offset_past_the_one_row_of_a_query_without_group_by_is_refused_for_free(sql: str) -> None:
    s = _session()
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match=r"OFFSET \d+ skips (the one row|every row)"):
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.remaining() == BUDGET and s.history().num_rows == 0


def test_a_range_count_of_a_workload_with_an_offset_is_refused_for_free() -> None:
    s = _session()
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="skips the one row"):
        s.query_many(["SELECT COUNT(*) FROM t WHERE x BETWEEN 1 AND 3",
                      "SELECT COUNT(*) FROM t WHERE x BETWEEN 2 AND 5 OFFSET 1"], epsilon=1.0)
    assert s.remaining() == BUDGET and s.history().num_rows == 0


def test_an_offset_past_the_one_row_of_a_join_without_group_by_is_refused_for_free() -> None:
    with _tpch_session(_data()) as s:
        before = s.remaining()
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="skips the one row"):
            s.query(f"SELECT COUNT(*) AS n {_COL} OFFSET 1", epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0
        # negative control: OFFSET 0 keeps the row
        r = s.query(f"SELECT COUNT(*) AS n {_COL} OFFSET 0", epsilon=1.0, delta=1e-6)
        assert r.table.num_rows == 1 and s.history().num_rows == 1


@pytest.mark.parametrize(("sql", "rows"), [
    ("SELECT COUNT(*) AS n FROM t OFFSET 0", 1),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k OFFSET 1", 2),
    ("SELECT COUNT(*) AS n FROM t WHERE x < 3 UNION ALL SELECT COUNT(*) AS n FROM t WHERE x >= 3 ORDER BY n OFFSET 1",
     1),
    ("SELECT COUNT(*) AS n FROM t UNION ALL SELECT COUNT(*) AS n FROM t GROUP BY k OFFSET 2", 2),
])
def test_negative_control_offsets_that_can_keep_a_row_are_answered(sql: str, rows: int) -> None:
    s = _session()
    r = s.query(sql, epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == rows and s.history().num_rows == 1
