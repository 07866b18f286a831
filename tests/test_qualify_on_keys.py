"""A QUALIFY that reads the public keys alone is decided on the key set before the charge.

Over public keys (a declared domain, DAWA's bins, keys the WHERE lists) every key the conditions on the keys alone keep
is released, so a QUALIFY whose windows read the keys alone (``row_number() OVER (ORDER BY k) > 3``, ``COUNT(*) OVER
() > 5``) keeps a public number of rows: the windows are evaluated over exactly those rows, their ties broken by the
keys. A QUALIFY that keeps none of them made a release with no row whatever the data, and it was charged; it is refused
for free now, as a HAVING on the keys that keeps none is. So is one whose only reading of released values is the order
of one ``ROW_NUMBER()`` partitioned by keys (it numbers each partition's rows 1..its size whatever they hold: the
release kept no row of ``ROW_NUMBER() OVER (ORDER BY COUNT(*) DESC) > 3`` over three keys, and was charged). Any other
QUALIFY that reads a released value, or one after a HAVING on released values (whose rows are not public), is not
decided: the query runs as before.
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
    con = duckdb.connect()
    con.execute("CREATE TABLE d AS SELECT r AS uid, ['a', 'b', 'c'][r % 3 + 1] AS k, r % 7 AS age, "
                "['x', 'y'][r % 2 + 1] AS s FROM range(0, 600) t(r)")
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "d", privacy_unit="uid", max_groups_per_unit=2, max_rows_per_unit=4,
               columns={"k": {"domain": ["a", "b", "c"]}, "s": {"domain": ["x", "y"]}, "age": {"bounds": (0, 10), "bins": 10}})
    yield s
    s.close()


def _charges(s: dpsql.Session) -> int:
    return int(s.history().num_rows)


REFUSED = [
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY k) > 3",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY COUNT(*) OVER () > 3",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY rank() OVER (PARTITION BY k ORDER BY k) > 1",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING k <> 'a' QUALIFY row_number() OVER (ORDER BY k DESC) = 3",
    "SELECT k, COUNT(*) AS n FROM t WHERE k IN ('a', 'b') GROUP BY k QUALIFY COUNT(*) OVER () = 3",
    "SELECT age, COUNT(*) AS n FROM t GROUP BY age QUALIFY row_number() OVER (ORDER BY age) > 10",
    "SELECT k, SUM(1) AS n FROM t GROUP BY k QUALIFY lag(k) OVER (ORDER BY k) = 'zz'",
    # a ROW_NUMBER() ordered by released values numbers each partition's rows 1..its size whatever their order
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY COUNT(*) DESC) > 3",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY n) > 3",
    "SELECT k, s, COUNT(*) AS n FROM t GROUP BY k, s QUALIFY row_number() OVER (PARTITION BY k ORDER BY n) > 2",
    "SELECT k, s, COUNT(*) AS n FROM t GROUP BY k, s "
    "QUALIFY row_number() OVER (PARTITION BY k ORDER BY n) > COUNT(*) OVER (PARTITION BY k)",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_a_qualify_on_the_keys_that_keeps_no_key_is_refused_for_free(session: Any, sql: str) -> None:
    before = _charges(session)
    with pytest.raises(errors.UnsupportedQueryError, match="no row whatever the data") as e:
        session.query(sql, epsilon=1.0, delta=1e-6)
    assert "QUALIFY" in str(e.value)
    assert _charges(session) == before


ANSWERED = [
    # the same QUALIFYs one key short of none
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY k) > 2", 1),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY COUNT(*) OVER () > 2", 3),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING k <> 'a' QUALIFY row_number() OVER (ORDER BY k DESC) = 2", 1),
    ("SELECT age, COUNT(*) AS n FROM t GROUP BY age QUALIFY row_number() OVER (ORDER BY age) > 9", 1),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY COUNT(*) DESC) > 2", 1),
    ("SELECT k, s, COUNT(*) AS n FROM t GROUP BY k, s QUALIFY row_number() OVER (PARTITION BY k ORDER BY n) > 1", 3),
    # a QUALIFY whose rows kept depend on released values is not decided (here each keeps no row, and is charged):
    # a RANK over them (ties), a row number beside a key column, two row numbers over two orders
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY rank() OVER (ORDER BY n) > 3", 0),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY n) = 1 AND k = 'zz'", 0),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k "
     "QUALIFY row_number() OVER (ORDER BY n) = 1 AND row_number() OVER (ORDER BY n, k DESC) = 2", 0),
    ("SELECT k, s, COUNT(*) AS n FROM t GROUP BY k, s "
     "QUALIFY row_number() OVER (PARTITION BY k ORDER BY n) > COUNT(*) OVER (PARTITION BY s)", 0),
    # a QUALIFY that reads a released value is not decided (here it keeps every row)
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY n) > 0", 3),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY SUM(n) OVER () >= 0", 3),
    # a HAVING on released values before it: its rows are not public, the QUALIFY is not decided
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING COUNT(*) > 0 QUALIFY row_number() OVER (ORDER BY k) > 2", 1),
]


@pytest.mark.parametrize(("sql", "rows"), ANSWERED)
def test_a_qualify_that_keeps_a_key_or_reads_released_values_is_answered(session: Any, sql: str, rows: int) -> None:
    before = _charges(session)
    r = session.query(sql, epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == rows
    assert _charges(session) == before + 1


def test_a_qualify_after_a_having_on_released_values_is_charged_even_when_it_keeps_no_row(session: Any) -> None:
    """Negative control of the rule: after a HAVING on released values the rows that reach the QUALIFY are not public,
    so it is not decided before the charge, even where (as here) it keeps no row."""
    before = _charges(session)
    r = session.query("SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING COUNT(*) > 0 "
                      "QUALIFY row_number() OVER (ORDER BY k) > 3", epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == 0
    assert _charges(session) == before + 1


def test_the_keys_a_qualify_keeps_are_those_the_release_keeps(session: Any) -> None:
    r = session.query("SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY k DESC) <= 2 "
                      "ORDER BY k", epsilon=1.0, delta=1e-6)
    assert r.table.column("k").to_pylist() == ["b", "c"]
    assert r.table.column("n").to_pylist() == [200, 200]


def test_over_a_grouped_join_too() -> None:
    from tests.test_tpch_queries import _COL, _data, _session

    q = f"SELECT l.l_shipmode, COUNT(*) AS n {_COL}GROUP BY 1 QUALIFY row_number() OVER (ORDER BY l.l_shipmode) > "
    with _session(_data()) as s:
        use_noise(s, zero_noise())
        with pytest.raises(errors.UnsupportedQueryError, match="QUALIFY"):
            s.query(q + "2", epsilon=1.0, delta=1e-6)  # two declared modes
        assert _charges(s) == 0
        with pytest.raises(errors.UnsupportedQueryError, match="QUALIFY"):
            s.query(f"SELECT l.l_shipmode, COUNT(*) AS n {_COL}GROUP BY 1 "
                    "QUALIFY row_number() OVER (ORDER BY COUNT(*) DESC) > 2", epsilon=1.0, delta=1e-6)
        assert _charges(s) == 0
        r = s.query(q + "1", epsilon=1.0, delta=1e-6)
        assert r.table.column(0).to_pylist() == ["SHIP"] and _charges(s) == 1


def test_the_rows_a_row_number_over_released_values_keeps_are_those_the_release_keeps(session: Any) -> None:
    """The decision before the charge counts the rows numbered over placeholders; the release numbers the same rows
    over their values: as many rows, whichever they are (here the counts tie; an OFFSET past them is refused)."""
    q = "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY COUNT(*) DESC) <= 2"
    before = _charges(session)
    assert session.query(q, epsilon=1.0, delta=1e-6).table.num_rows == 2
    with pytest.raises(errors.UnsupportedQueryError, match="OFFSET 2 skips every row"):
        session.query(q + " ORDER BY k OFFSET 2", epsilon=1.0, delta=1e-6)
    assert _charges(session) == before + 1


def test_an_offset_past_the_keys_a_qualify_keeps_is_refused_for_free(session: Any) -> None:
    """The QUALIFY keeps two of the three declared keys: OFFSET 2 leaves no row whatever the data (refused for free),
    OFFSET 1 one row (answered)."""
    q = "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY k) > 1 ORDER BY k OFFSET "
    before = _charges(session)
    with pytest.raises(errors.UnsupportedQueryError, match="OFFSET 2 skips every row"):
        session.query(q + "2", epsilon=1.0, delta=1e-6)
    assert _charges(session) == before
    r = session.query(q + "1", epsilon=1.0, delta=1e-6)
    assert r.table.column("k").to_pylist() == ["c"] and _charges(session) == before + 1
