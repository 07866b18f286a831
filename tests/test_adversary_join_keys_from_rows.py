"""GROUP BY over joins whose key set is a DATE column's declared days, or the rows of one public table's columns:
the key set and whether the query is answered depend on the catalog and public rows only, and a query the key
set can answer is not refused on a count of keys it does not release."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

import dpsql
from dpsql import Budget
from tests.test_tpch_queries import _COL, _data, _rows, _session, _truth

_ITEMS = ("FROM lineitem l JOIN supplier s ON l.l_suppkey = s.s_suppkey JOIN orders o ON l.l_orderkey = o.o_orderkey ")


def _suppliers(n: int) -> dict[str, pa.Table]:
    data = _data()
    data["supplier"] = pa.table({"s_suppkey": pa.array(range(n), pa.int64()), "s_name": [f"S{i}" for i in range(n)],
                                 "s_nationkey": pa.array([i % 2 for i in range(n)], pa.int64())})
    return data


def test_the_key_count_of_one_public_tables_columns_is_its_rows_combinations() -> None:
    """GROUP BY o.o_orderdate, s.s_suppkey, s.s_name over 20 suppliers releases 364 x 20 = 7280 groups (the days of the declared range's half-open grid) (a supplier's
    key and name are one key), but was refused before the charge as '146000 combinations ... at most 100000 groups' (365 days then):
    the count before the charge multiplied each column's values, the product the release no longer builds."""
    data = _suppliers(20)
    s = _session(data)
    sql = f"SELECT o.o_orderdate, s.s_suppkey, s.s_name, COUNT(*) AS n {_ITEMS}GROUP BY 1, 2, 3 ORDER BY 1, 2"
    rows = _rows(s.query(sql, epsilon=5.0, delta=1e-5).table)
    assert len(rows) == 364 * 20
    assert [r for r in rows if r[3]] == _truth(data, sql)


def test_the_key_count_still_refuses_more_combinations_than_released_for_free() -> None:
    """Negative control: 400 suppliers' rows by every day of the year (145600 groups) stay refused, nothing spent."""
    s = _session(_suppliers(400))
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="145600 combinations"):
        s.query(f"SELECT o.o_orderdate, s.s_suppkey, s.s_name, COUNT(*) {_ITEMS}GROUP BY 1, 2, 3", epsilon=5.0, delta=1e-5)
    assert s.remaining() == Budget(1000.0, 1e-2) and s.history().num_rows == 0


def test_a_date_range_too_long_to_list_names_its_length() -> None:
    """A DATE column whose declared range holds more days than a grouped join releases was refused as 'neither a
    column of a public table nor declared public ... declare a domain', though it declares its range (the CAST of it
    said the limit): the refusal names the range's days and the limit, and a coarser key; nothing is spent."""
    data = _data()
    s = _session(data)
    s.register("orders", data["orders"], references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 4},
               columns={"o_orderdate": {"bounds": ("0001-01-01", "2700-12-31"), "bin_width": "1 day"}})
    with pytest.raises(dpsql.errors.PolicyError) as info:
        s.explain(f"SELECT o.o_orderdate, COUNT(*) {_COL}GROUP BY 1", epsilon=5.0, delta=1e-5)
    text = str(info.value)
    assert "declared public" not in text and "100000" in text and "year(" in text, text
    assert s.remaining() == Budget(1000.0, 1e-2)


def test_a_where_on_two_date_keys_narrows_what_is_counted() -> None:
    """GROUP BY o.o_orderdate, l.l_shipdate with both dates in January releases 31 x 31 groups; it was refused as
    133225 combinations, though the hint says to filter in the WHERE: the count before the charge was of the whole
    declared ranges (the WHERE filtered the released days after the release). The conjuncts over one key's column
    alone now narrow its key set, before the charge; the counts are the same as with the days filtered after."""
    data = _data()
    s = _session(data)
    sql = (f"SELECT o.o_orderdate, l.l_shipdate, COUNT(*) AS n {_COL}WHERE o.o_orderdate < DATE '1995-02-01' "
           "AND l.l_shipdate <= DATE '1995-01-31' AND c.c_acctbal > -1e9 GROUP BY 1, 2 ORDER BY 1, 2")
    rows = _rows(s.query(sql, epsilon=5.0, delta=1e-5).table)
    assert len(rows) == 31 * 31
    assert {r[0] for r in rows} == {r[1] for r in rows} == {datetime.date(1995, 1, d) for d in range(1, 32)}
    assert [r for r in rows if r[2]] == _truth(data, sql)


def test_a_where_on_a_date_key_with_an_or_or_another_column_is_not_narrowed() -> None:
    """Negative control: a conjunct that reads another column too (an OR with a private column, a comparison of the
    two dates, a date against another table's column) does not narrow the key sets, so the query stays refused on the
    whole ranges' count, for free."""
    s = _session(_data())
    for where in ("(o.o_orderdate < DATE '1995-02-01' OR c.c_acctbal > 5) AND "
                  "(l.l_shipdate < DATE '1995-02-01' OR c.c_acctbal > 5)",
                  "o.o_orderdate < l.l_shipdate AND o.o_orderdate - DATE '1995-01-01' < c.c_nationkey + 31"):
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="combinations"):
            s.query(f"SELECT o.o_orderdate, l.l_shipdate, COUNT(*) {_COL}WHERE {where} GROUP BY 1, 2",
                    epsilon=5.0, delta=1e-5)
    assert s.remaining() == Budget(1000.0, 1e-2) and s.history().num_rows == 0


_EXTREME = [None, datetime.date(1, 1, 1), datetime.date(9999, 12, 31), datetime.date(1995, 1, 1)]


def _with_extreme_person(data: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """One more customer whose orders are dated NULL, before and after the declared range, and on its first day."""
    out = dict(data)
    out["customer"] = pa.concat_tables([data["customer"], pa.Table.from_pylist([dict(
        c_custkey=99, c_nationkey=1, c_mktsegment="BUILDING", c_phone="x", c_acctbal=1e9)], schema=data["customer"].schema)])
    orders = [dict(o_orderkey=9900 + j, o_custkey=99, o_orderdate=d, o_orderpriority="1-URGENT", o_shippriority=0)
              for j, d in enumerate(_EXTREME)]
    items = [dict(l_orderkey=9900 + j, l_suppkey=2, l_quantity=50.0, l_extendedprice=1e9, l_discount=0.1,
                  l_returnflag="R", l_shipmode="MAIL", l_shipdate=d, l_comment="x" * 300)
             for j, d in enumerate(_EXTREME) for _ in range(7)]
    out["orders"] = pa.concat_tables([data["orders"], pa.Table.from_pylist(orders, schema=data["orders"].schema)])
    out["lineitem"] = pa.concat_tables([data["lineitem"], pa.Table.from_pylist(items, schema=data["lineitem"].schema)])
    return out


@pytest.mark.parametrize("where", [
    "WHERE o.o_orderdate < DATE '1995-01-25' OR c.c_acctbal > 5 ",  # an OR with a private column: every day
    "WHERE NOT (o.o_orderdate >= DATE '1995-01-25') AND c.c_acctbal > 5 ",
    "WHERE o.o_orderdate BETWEEN DATE '1995-01-01' AND DATE '1995-01-24' AND o.o_orderdate = l.l_shipdate ",
])
def test_a_date_key_and_its_filters_are_the_catalogs_whoever_is_added(where: str) -> None:
    """Neighbours: a customer with orders dated NULL, out of the range on both sides and on its first day changes
    neither the released days (nor their order) nor whether the query is answered; each count moves by at most 28."""
    sql = f"SELECT o.o_orderdate, s.s_name, COUNT(*) AS n {_COL}JOIN supplier s ON l.l_suppkey = s.s_suppkey {where}" \
          "GROUP BY o.o_orderdate, s.s_name ORDER BY 1, 2"
    a, b = _data(), _with_extreme_person(_data())
    ra, rb = (_rows(_session(x).query(sql, epsilon=5.0, delta=1e-5).table) for x in (a, b))
    assert [r[:2] for r in ra] == [r[:2] for r in rb]
    assert len({r[0] for r in ra}) == (364 if " OR " in where else 24)
    assert sum(abs(x[2] - y[2]) for x, y in zip(ra, rb, strict=True)) <= 28
    assert [r for r in ra if r[2]] == _truth(a, sql)


def test_a_column_named_as_the_bounded_sqls_subquery_is_not_counted_as_read() -> None:
    """A private table with a text column named ``__where`` (the name of the bounded SQL's filtered input): every
    grouped join with a condition on one input was refused for free as reading it (3 text columns, more than a 2GB
    memory_limit holds), though it reads two; it is answered. Negative control: naming the column reads it."""
    data = _data()
    items = data["lineitem"].append_column("__where", pa.array(["w"] * data["lineitem"].num_rows))
    data["lineitem"] = items.append_column("tag", pa.array(["t"] * items.num_rows))
    s = _session(data, memory_limit="2GB")
    s.register("lineitem", data["lineitem"], references={"l_orderkey": "orders.o_orderkey"},
               degree_bounds={"l_orderkey": 7}, columns={"l_shipmode": {"domain": ["MAIL", "SHIP"]}})
    sql = ("SELECT l.l_shipmode, COUNT(*) AS n FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey "
           "WHERE l.tag = 't' GROUP BY 1 ORDER BY 1")
    assert _rows(s.query(sql, epsilon=5.0, delta=1e-5).table) == _truth(data, sql)
    with pytest.raises(dpsql.errors.ConfigError, match="text columns at once"):
        s.query(sql.replace("l.tag = 't'", "l.tag = l.\"__where\""), epsilon=5.0, delta=1e-5)


_OWN_CONDITIONS = [
    "o.o_orderdate < TIMESTAMP '1995-01-05 00:00:01'",  # a DATE against a TIMESTAMP: its midnight counts
    "o.o_orderdate <= '1995-01-04'",  # against text
    "o.o_orderdate IS NOT NULL AND o.o_orderdate NOT IN (DATE '1995-01-02', NULL)",  # NULL: never true, no key
    "COALESCE(o.o_orderdate, DATE '1995-01-01') < DATE '1995-01-08'",
    "lower(strftime(o.o_orderdate, '%B')) = 'january' AND day(o.o_orderdate) % 2 = 0",
    "o.o_orderdate - DATE '1995-01-01' < 5.5",  # an integer against a DECIMAL
    "date_trunc('month', o.o_orderdate) = DATE '1995-01-01' AND CAST(o.o_orderdate AS VARCHAR) LIKE '%1_'",
    "o.o_orderdate + INTERVAL 1 DAY BETWEEN DATE '1995-01-03' AND DATE '1995-01-12'",
    "epoch(o.o_orderdate) < 789000000.5",
]


@pytest.mark.parametrize("cond", _OWN_CONDITIONS)
def test_conditions_on_a_date_key_alone_count_the_tuples_sql_counts(cond: str) -> None:
    """The conditions on a DATE key's column alone narrow its key set before the charge (with a second date key in
    January and February the whole ranges, 365 x 365 combinations, are refused): the released days, zero counts
    included, are exactly the declared days that meet them (DuckDB's answer over the days), and no tuple SQL counts
    is dropped: under zero noise the non-zero counts are SQL's, whatever the comparison's other type (TIMESTAMP,
    text, DECIMAL), NULL handling or function of the column."""
    import duckdb

    data = _data()
    sql = (f"SELECT o.o_orderdate, l.l_shipdate, COUNT(*) AS n {_COL}WHERE {cond} AND l.l_shipdate < DATE '1995-03-01' "
           "GROUP BY 1, 2 ORDER BY 1, 2")
    days = duckdb.sql(f"SELECT o_orderdate FROM (SELECT CAST(d AS DATE) AS o_orderdate FROM range(DATE '1995-01-01', "
                      f"DATE '1996-01-01', INTERVAL 1 DAY) t(d)) AS o WHERE {cond} ORDER BY 1").fetchall()
    if not days:  # no key: the release would have no row whatever the data, refused for free
        with _session(data) as s, pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(sql, epsilon=5.0, delta=1e-5)
        return
    rows = _rows(_session(data).query(sql, epsilon=5.0, delta=1e-5).table)
    assert sorted({r[0] for r in rows}) == [d[0] for d in days] and len(rows) == len(days) * 59
    assert [r for r in rows if r[2]] == _truth(data, sql)


def test_a_condition_on_the_other_alias_of_a_self_join_leaves_the_key_set_whole() -> None:
    """A self-join of orders: the condition on o2's date does not narrow the key set of o1's date (every day of the
    range is released), and the counts are SQL's."""
    data = _data()
    sql = ("SELECT o1.o_orderdate, COUNT(*) AS n FROM customer c JOIN orders o1 ON c.c_custkey = o1.o_custkey "
           "JOIN orders o2 ON o2.o_custkey = c.c_custkey WHERE o2.o_orderdate < DATE '1995-01-05' "
           "AND o1.o_orderdate > DATE '1995-01-10' GROUP BY 1 ORDER BY 1")
    rows = _rows(_session(data).query(sql, epsilon=5.0, delta=1e-5).table)
    assert len(rows) == 364 - 10
    assert [r for r in rows if r[1]] == _truth(data, sql)
