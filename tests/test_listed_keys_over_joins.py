"""GROUP BY a private column without a declared domain over a join, with the WHERE listing its values (AND-ed
``col IN (literals)`` / ``col = literal``): the listed values are the key set, released in full (a noisy 0 for a key no
tuple holds), as on one table: every tuple outside them is filtered out by the WHERE itself, so the key set is the
query's text. It was refused ("neither a column of a public table nor declared public")."""
from __future__ import annotations

import pyarrow as pa
import pytest

from dpsql.errors import PolicyError, UnsupportedQueryError
from tests.test_tpch_queries import _COL, _data, _session, _truth

LISTED = f"SELECT l.l_suppkey AS k, COUNT(*) AS n {_COL}WHERE l.l_suppkey IN (1, 2, 3) GROUP BY 1 ORDER BY 1"


@pytest.mark.parametrize(("sql", "keys"), [
    (LISTED, [1, 2, 3]),
    (f"SELECT l.l_suppkey AS k, COUNT(*) AS n {_COL}WHERE l.l_suppkey = 2 AND l.l_quantity > 11 GROUP BY 1", [2]),
    (f"SELECT l.l_suppkey AS k, l.l_shipmode AS m, COUNT(*) AS n {_COL}WHERE l.l_suppkey IN (1, 2) GROUP BY 1, 2 "
     "ORDER BY 1, 2", [1, 1, 2, 2]),
    ("SELECT l.l_suppkey AS k, COUNT(*) AS n FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey "
     "WHERE l.l_suppkey IN (2, 98) GROUP BY 1 ORDER BY 1", [2, 98]),
    ("SELECT c.c_phone AS k, COUNT(*) AS n FROM customer c JOIN nation n ON n.n_nationkey = c.c_nationkey "
     "WHERE c.c_phone IN ('none-1', 'none-2') GROUP BY 1 ORDER BY 1", ["none-1", "none-2"]),
])
def test_every_listed_key_is_released_with_its_count_at_zero_noise(sql: str, keys: list) -> None:
    data = _data()
    with _session(data) as s:
        rows = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()
    assert [r["k"] for r in rows] == keys
    truth = {tuple(t[:-1]): t[-1] for t in _truth(data, sql)}
    assert all(r["n"] == truth.get(tuple(v for c, v in r.items() if c != "n"), 0) for r in rows)


def test_the_key_set_is_the_lists_whatever_the_data() -> None:
    """Neighbours: without every order line of supplier 2 (its key then held by no tuple), the same keys are
    released (key 2 with a count of 0): the key set is read from the query, not the rows."""
    data = _data()
    fewer = dict(data)
    fewer["lineitem"] = pa.Table.from_pylist([x for x in data["lineitem"].to_pylist() if x["l_suppkey"] != 2],
                                             schema=data["lineitem"].schema)
    out = []
    for d in (data, fewer):
        with _session(d) as s:
            out.append(s.query(LISTED, epsilon=1.0, delta=1e-6).to_pylist())
    assert [r["k"] for r in out[0]] == [r["k"] for r in out[1]] == [1, 2, 3]
    assert out[0][1]["n"] > 0 and out[1][1]["n"] == 0  # negative control: the data did change


@pytest.mark.parametrize("where", ["l.l_suppkey IN (1, 2) AND l.l_suppkey = 3", "l.l_suppkey IN (NULL)"])
def test_lists_that_share_no_value_are_refused_for_free(where: str) -> None:
    with _session(_data()) as s:
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match="list no value that they all keep"):
            s.query(f"SELECT l.l_suppkey AS k, COUNT(*) AS n {_COL}WHERE {where} GROUP BY 1", epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0


@pytest.mark.parametrize("where", ["l.l_suppkey IN (1, 2, 3) OR l.l_quantity > 3", "l.l_suppkey > 1",
                                   "l.l_suppkey IN (1, 2.5)"])
def test_without_a_list_of_the_columns_own_values_the_key_stays_refused(where: str) -> None:
    """An OR, a range, or a literal not of the column's kind list no key set: refused for free, as before."""
    with _session(_data()) as s:
        with pytest.raises((PolicyError, UnsupportedQueryError), match="neither a column of a public table nor declared"):
            s.query(f"SELECT l.l_suppkey AS k, COUNT(*) AS n {_COL}WHERE {where} GROUP BY 1", epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0


def test_the_listed_keys_are_counted_before_the_charge() -> None:
    """HAVING on the listed keys alone that keeps none, or an OFFSET past them, is refused for free."""
    with _session(_data()) as s:
        for tail in ("HAVING l.l_suppkey > 5", "OFFSET 3"):
            with pytest.raises(UnsupportedQueryError, match="whatever the data|skips every row"):
                s.query(LISTED.replace(" ORDER BY 1", " " + tail), epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
