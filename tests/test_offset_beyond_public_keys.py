"""An OFFSET at or beyond the number of rows a release over public keys can have (one per declared or listed key the
conditions on the keys keep) leaves no row whatever the data, as LIMIT 0 does: refused before the charge (it was
charged and released no row). An OFFSET below it is answered."""
from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

N = 300


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", pa.table({"uid": list(range(N)), "k": [["a", "b", "c"][i % 3] for i in range(N)],
                              "m": [i % 7 for i in range(N)]}),
               privacy_unit="uid", columns={"k": {"domain": ["a", "b", "c"]}})
    use_noise(s, zero_noise())
    return s


@pytest.mark.parametrize("sql", [
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k OFFSET 3",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k LIMIT 5 OFFSET 9",
    "SELECT k, COUNT(*) AS n FROM t WHERE k IN ('a', 'b') GROUP BY k ORDER BY k OFFSET 2",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING k <> 'c' AND COUNT(*) > 0 ORDER BY k OFFSET 2",
    "SELECT m, COUNT(*) AS n FROM t WHERE m IN (1, 2, 3, 4, 5, 6) GROUP BY m ORDER BY m OFFSET 6",
])
def test_an_offset_beyond_the_public_keys_is_refused_for_free(sql: str) -> None:
    s = _session()
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="skips every row of the release"):
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.remaining() == dpsql.Budget(100.0, 1e-3) and s.history().num_rows == 0


@pytest.mark.parametrize(("sql", "keys"), [
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k OFFSET 2", ["c"]),
    ("SELECT k, COUNT(*) AS n FROM t WHERE k IN ('a', 'b') GROUP BY k ORDER BY k OFFSET 1", ["b"]),
    ("SELECT m, COUNT(*) AS n FROM t WHERE m IN (1, 2, 3, 4, 5, 6) GROUP BY m ORDER BY m LIMIT 2 OFFSET 4", [5, 6]),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY ROLLUP (k) ORDER BY k NULLS LAST OFFSET 3", [None]),
])
def test_negative_control_an_offset_below_them_is_answered(sql: str, keys: list) -> None:
    s = _session()
    r = s.query(sql, epsilon=1.0, delta=1e-6)
    assert [row[r.table.column_names[0]] for row in r.table.to_pylist()] == keys
    assert s.history().num_rows >= 1


@pytest.mark.parametrize(("where", "offset", "aggs"), [
    ("", 365, "COUNT(*) AS n"), ("", 10000, "COUNT(*) AS n"), ("WHERE o.o_orderdate < DATE '1995-01-03' ", 2, "COUNT(*) AS n"),
    ("", 365, "COUNT(*) AS n, SUM(l.l_quantity) AS q"), ("", 400, "AVG(l.l_quantity) AS a"),
])
def test_an_offset_beyond_a_grouped_joins_date_key_set_is_refused_for_free(where: str, offset: int, aggs: str) -> None:
    """A grouped join's key set of a declared DATE range (its days, read from public metadata before the charge,
    after the WHERE's conditions on the key's column): an OFFSET at or beyond its size releases no row (several
    aggregates, one run each, too)."""
    from tests.test_tpch_queries import _COL, _data
    from tests.test_tpch_queries import _session as _tpch_session
    with _tpch_session(_data()) as s:
        before = s.remaining()
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match=f"OFFSET {offset} skips every row"):
            s.query(f"SELECT o.o_orderdate, {aggs} {_COL}{where}GROUP BY 1 OFFSET {offset}", epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0
        # negative control: an OFFSET below the key set's size is answered
        r = s.query(f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}WHERE o.o_orderdate < DATE '1995-01-03' GROUP BY 1 "
                    "ORDER BY 1 OFFSET 1", epsilon=1.0, delta=1e-6)
        assert [row["n"] for row in r.table.to_pylist()] == [2] and s.history().num_rows == 1
