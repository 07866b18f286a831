"""Neighbouring datasets, zero noise: keys of DECIMAL, HUGEINT and UBIGINT types, listed keys, declared domains,
grouped joins over declared DATE ranges, DATE keys and CASE buckets.

* A grouped join whose WHERE excludes every day of a DATE key's declared range (``o.o_orderdate > DATE
  '1996-01-01'`` over a 1995 range, ``o.o_orderdate IS NULL``) was charged and released no row: the conditions on
  the key's column alone narrow its public key set before the charge, to no key, and the release of no key set was
  run anyway. Over a declared domain (``l.l_shipmode = 'AIR'``) and on one table the same query is refused for free
  (the release would have no row whatever the data); now alike over a DATE range.
* One declared DATE range, two key sets: ``GROUP BY o_orderdate`` on the table alone releases the days of the
  half-open bins [lo, hi) (1995-12-31 of a range ending on it is in no bin, its rows in no group), while over a join
  the same column's key set held every day from lo to hi, both included; now the grid's days there too.
* The same through HAVING: ``HAVING o.o_orderdate > DATE '1996-01-01'`` over a grouped join was charged for its
  release of no row (the check of the conditions on the keys alone read a key set the catalog lists, and a DATE
  range's days are counted at run time); the key set read from public values before the charge is now checked too.
"""

from __future__ import annotations

import pytest

import dpsql
from tests.test_tpch_queries import _COL, _data, _session


@pytest.mark.parametrize("where", ["o.o_orderdate > DATE '1996-01-01'", "o.o_orderdate IS NULL",
                                   "o.o_orderdate BETWEEN DATE '1995-03-01' AND DATE '1995-02-01'"])
def test_a_grouped_join_whose_where_keeps_no_day_of_its_date_key_is_refused_for_free(where: str) -> None:
    for extra in (False, True):
        with _session(_data(extra)) as s:
            before = s.remaining()
            with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
                s.query(f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}WHERE {where} GROUP BY 1", epsilon=1.0, delta=1e-6)
            assert s.remaining() == before and s.history().num_rows == 0


def test_negative_control_a_where_that_keeps_some_days_is_answered() -> None:
    with _session(_data()) as s:
        r = s.query(f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}WHERE o.o_orderdate < DATE '1995-01-03' GROUP BY 1 "
                    "ORDER BY 1", epsilon=1.0, delta=1e-6)
        assert [row["n"] for row in r.table.to_pylist()] == [2, 2]
        assert s.history().num_rows == 1


def test_negative_control_a_declared_domain_excluded_is_refused_for_free() -> None:
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(f"SELECT l.l_shipmode, COUNT(*) AS n {_COL}WHERE l.l_shipmode = 'AIR' GROUP BY 1", epsilon=1.0,
                    delta=1e-6)
        assert s.history().num_rows == 0


def test_one_table_and_a_grouped_join_release_the_same_days_of_one_declared_range() -> None:
    """orders' o_orderdate declares the range ('1995-01-01', '1995-12-31') in one-day bins. ``GROUP BY o_orderdate``
    on orders alone is DAWA's histogram over half-open bins: 364 days, 1995-12-31 in none (a row of that day is in no
    group, though ``WHERE o_orderdate = DATE '1995-12-31'`` counts it); over a join the same column's key set was its
    days with both bounds: 365 days, 1995-12-31 released with its count. One declaration gave two key sets. Now a
    grouped join's days are the grid's too, [lo, hi)."""
    with _session(_data(True)) as s:
        one = s.query("SELECT o_orderdate, COUNT(*) AS n FROM orders GROUP BY 1 ORDER BY 1", epsilon=1.0, delta=1e-6)
        joined = s.query(f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}GROUP BY 1 ORDER BY 1", epsilon=1.0, delta=1e-6)
        assert one.table.column(0).to_pylist() == joined.table.column(0).to_pylist()
        assert one.table.num_rows == 364


def test_negative_control_a_range_ending_the_day_after_releases_the_last_day_on_both() -> None:
    """Declared to 1996-01-01 (exclusive), both release 1995-12-31 as their 365th day."""
    data = _data(True)
    with _session(data) as s:
        s.register("orders", data["orders"], references={"o_custkey": "customer.c_custkey"},
                   degree_bounds={"o_custkey": 4},
                   columns={"o_orderdate": {"bounds": ("1995-01-01", "1996-01-01"), "bin_width": "1 day"}})
        one = s.query("SELECT o_orderdate, COUNT(*) AS n FROM orders GROUP BY 1 ORDER BY 1", epsilon=1.0, delta=1e-6)
        joined = s.query(f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}GROUP BY 1 ORDER BY 1", epsilon=1.0, delta=1e-6)
        days = one.table.column(0).to_pylist()
        assert days == joined.table.column(0).to_pylist() and len(days) == 365 and str(days[-1]) == "1995-12-31"


def test_a_having_on_a_grouped_joins_date_key_that_keeps_no_day_is_refused_for_free() -> None:
    """``HAVING o.o_orderdate > DATE '1996-01-01'`` over a 1995 range keeps no key whatever the data: the release (no
    row) was charged. The same HAVING over a declared domain (``HAVING l.l_shipmode = 'AIR'``) and on one table over
    the day histogram are refused for free."""
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError):
            s.query(f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}GROUP BY 1 HAVING o.o_orderdate > DATE '1996-01-01'",
                    epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0


def test_negative_control_a_having_over_a_declared_domain_is_refused_for_free() -> None:
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(f"SELECT l.l_shipmode, COUNT(*) AS n {_COL}GROUP BY 1 HAVING l.l_shipmode = 'AIR'", epsilon=1.0,
                    delta=1e-6)
        assert s.history().num_rows == 0


def test_a_grouped_join_over_a_public_tables_rows_the_where_keeps_none_of_is_refused_for_free() -> None:
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(f"SELECT n.n_name, COUNT(*) AS n {_COL}JOIN nation n ON n.n_nationkey = c.c_nationkey "
                    "WHERE n.n_name = 'ATLANTIS' GROUP BY 1", epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
        r = s.query(f"SELECT n.n_name, COUNT(*) AS n {_COL}JOIN nation n ON n.n_nationkey = c.c_nationkey "
                    "WHERE n.n_name = 'FRANCE' GROUP BY 1", epsilon=1.0, delta=1e-6)
        assert r.table.to_pylist() == [{"n_name": "FRANCE", "n": 12}]


@pytest.mark.parametrize("sql", [
    f"SELECT o.o_orderdate, COUNT(*) AS n, SUM(l.l_quantity) AS q {_COL}GROUP BY 1 HAVING o.o_orderdate > DATE '1996-01-01'",
    f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}JOIN nation n ON n.n_nationkey = c.c_nationkey GROUP BY 1 "
    "HAVING o.o_orderdate > DATE '1996-01-01'",
    f"SELECT n.n_name, COUNT(*) AS n {_COL}JOIN nation n ON n.n_nationkey = c.c_nationkey GROUP BY 1 "
    "HAVING n.n_name = 'ATLANTIS'",
])
def test_a_having_on_a_grouped_joins_public_keys_that_keeps_none_is_refused_for_free(sql: str) -> None:
    """Several aggregates (one run each), a DATE key beside a lookup of a public table, a public table's column."""
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
        # negative control: a HAVING that keeps some keys is answered (and charged)
        kept = sql.replace("> DATE '1996-01-01'", "< DATE '1995-01-03'").replace("= 'ATLANTIS'", "= 'FRANCE'")
        assert s.query(kept, epsilon=1.0, delta=1e-6).table.num_rows >= 1 and s.history().num_rows == 1
