"""Neighbouring datasets, zero noise: joins (DP-S4S, its vector form, lookup joins) and what a query that releases
nothing costs.

* A query without GROUP BY releases one row (or none, after HAVING), on one table and over joins: with ``OFFSET 1``
  (or more) it released no row whatever the data, and was charged (``SELECT COUNT(*) FROM customer c JOIN orders o
  ... OFFSET 1``). The OFFSET that skips a release over public keys was refused for free, as LIMIT 0 is; now this one
  too, and an OFFSET of a UNION ALL at or beyond its SELECTs without GROUP BY (one row each).
* A GROUP BY over a join whose key set is read before the charge from public tables' rows or a DATE range's days
  (``n.n_name``, ``o.o_orderdate``, a CASE's results, a lookup join's ``s.s_name``): an OFFSET at or beyond its number
  of keys, and a HAVING on the keys alone that keeps none of them (``HAVING n.n_name = 'ATLANTIS'``), released no row
  whatever the data and were charged; over declared keys both were refused for free. The key set is counted (and,
  with a HAVING, read: public rows only) before the charge, and both are refused there now.
* The same for a request of several queries (ROLLUP, CUBE, GROUPING SETS, UNION ALL) whose queries' rows are all known
  before the charge: an OFFSET at or beyond their sum (``GROUP BY ROLLUP (k) OFFSET 3`` over two declared keys) was
  charged and released no row; refused for free now.
* Crash (free): ``options={'clip_norm': 1e308}`` on a grouped join's SUM raised a bare ``OverflowError`` (the noise
  scale overflowed to inf before its grid's logarithm was taken); a COUNT said 'invalid Gaussian parameters
  sigma=inf'. Both are a ConfigError naming clip_norm now.
* Open (charged for nothing): a derived key over a DATE column with a declared range (``year(d)``,
  ``date_trunc('month', d)``, ``d + 1``) keeps its whole key set whatever the WHERE says of the column (documented:
  the earlier years are listed with noisy zeros), so a WHERE keeping no day of the range (``d > DATE '1996-01-01'``
  over 1995) releases zeros whatever the data, charged; the plain key ``d`` is refused for free. An exact check would
  evaluate the conditions over every day of the key set's years (months) before the charge.
* The key set of a public table's column was narrowed by the WHERE's conditions on that table alone; a condition on
  the private column the ON equates with the public key (``ON n.n_nationkey = c.c_nationkey ... WHERE c.c_nationkey >
  5``) holds of the public column in every tuple too, yet was not applied, so a WHERE that no public row can meet
  released zeros whatever the data, charged (the same on ``n.n_nationkey`` was refused for free). Such a condition is
  now moved onto the public column for the key set, where the equality is identity of the value (integers, decimals,
  dates, timestamps, text under the binary collation; not floating point, where -0.0 = 0.0, though no join keys on it).
"""

from __future__ import annotations

import datetime

import pytest

import dpsql
from tests.test_tpch_queries import _COL, _data, _session


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM customer OFFSET 1",
    "SELECT SUM(c_acctbal) AS s FROM customer LIMIT 3 OFFSET 2",
    "SELECT COUNT(*) AS n FROM customer HAVING COUNT(*) > 1 OFFSET 1",
    "SELECT MEDIAN(c_acctbal) AS m FROM customer OFFSET 1",
    "WITH v AS (SELECT * FROM customer) SELECT COUNT(*) AS n FROM v OFFSET 1",
    f"SELECT COUNT(*) AS n {_COL}OFFSET 1",
    f"SELECT COUNT(*) AS n, SUM(l.l_quantity) AS q {_COL}OFFSET 5",
    "SELECT COUNT(*) AS n FROM lineitem l JOIN supplier s ON s.s_suppkey = l.l_suppkey OFFSET 1",
    "SELECT COUNT(*) AS n FROM customer UNION ALL SELECT COUNT(*) AS n FROM orders OFFSET 2",
])
def test_an_offset_past_the_one_row_of_a_query_without_group_by_is_refused_for_free(sql: str) -> None:
    for extra in (False, True):
        with _session(_data(extra)) as s:
            before = s.remaining()
            with pytest.raises(dpsql.errors.UnsupportedQueryError, match="charged for nothing"):
                s.query(sql, epsilon=1.0, delta=1e-6)
            assert s.remaining() == before and s.history().num_rows == 0


@pytest.mark.parametrize(("sql", "rows"), [
    ("SELECT COUNT(*) AS n FROM customer OFFSET 0", 1),
    (f"SELECT COUNT(*) AS n {_COL}LIMIT 1 OFFSET 0", 1),
    ("SELECT COUNT(*) AS n FROM customer UNION ALL SELECT COUNT(*) AS n FROM orders OFFSET 1", 1),
    ("SELECT c_mktsegment, COUNT(*) AS n FROM customer GROUP BY 1 ORDER BY 1 OFFSET 1", 1),
])
def test_negative_control_an_offset_that_leaves_a_row_is_answered(sql: str, rows: int) -> None:
    with _session(_data()) as s:
        r = s.query(sql, epsilon=1.0, delta=1e-6)
        assert r.table.num_rows == rows and s.history().num_rows >= 1


_NAT = "JOIN nation n ON n.n_nationkey = c.c_nationkey "
_SUP = "FROM lineitem l JOIN supplier s ON s.s_suppkey = l.l_suppkey "


@pytest.mark.parametrize(("sql", "match"), [
    (f"SELECT n.n_name, COUNT(*) AS n {_COL}{_NAT}GROUP BY 1 OFFSET 2", "skips every row"),
    (f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}GROUP BY 1 OFFSET 365", "skips every row"),
    (f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}WHERE o.o_orderdate < DATE '1995-01-03' GROUP BY 1 OFFSET 2",
     "skips every row"),
    (f"SELECT CASE WHEN l.l_shipmode = 'MAIL' THEN 'a' ELSE 'b' END AS k, COUNT(*) AS n {_COL}GROUP BY 1 OFFSET 2",
     "skips every row"),
    (f"SELECT s.s_name, COUNT(*) AS n {_SUP}GROUP BY 1 OFFSET 3", "skips every row"),
    (f"SELECT n.n_name, COUNT(*) AS n {_COL}{_NAT}GROUP BY 1 HAVING n.n_name = 'ATLANTIS'", "every public key"),
    (f"SELECT s.s_name, COUNT(*) AS n {_SUP}GROUP BY 1 HAVING s.s_name = 'S9' AND COUNT(*) > 0", "every public key"),
    (f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}GROUP BY 1 HAVING o.o_orderdate > DATE '1996-01-01'",
     "every public key"),
    # several aggregates (one run each, their plans without the HAVING and OFFSET)
    (f"SELECT n.n_name, SUM(l.l_quantity) AS q, COUNT(*) AS n {_COL}{_NAT}GROUP BY 1 HAVING n.n_name = 'X'",
     "every public key"),
    (f"SELECT n.n_name, AVG(l.l_quantity) AS q {_COL}{_NAT}GROUP BY 1 OFFSET 2", "skips every row"),
])
def test_an_offset_or_having_that_keeps_no_key_of_a_grouped_join_is_refused_for_free(sql: str, match: str) -> None:
    for extra in (False, True):
        with _session(_data(extra)) as s:
            before = s.remaining()
            with pytest.raises(dpsql.errors.UnsupportedQueryError, match=match):
                s.query(sql, epsilon=1.0, delta=1e-6)
            assert s.remaining() == before and s.history().num_rows == 0


@pytest.mark.parametrize(("sql", "rows"), [
    (f"SELECT n.n_name, COUNT(*) AS n {_COL}{_NAT}GROUP BY 1 ORDER BY 1 OFFSET 1", [("GERMANY", 12)]),
    (f"SELECT o.o_orderdate, COUNT(*) AS n {_COL}WHERE o.o_orderdate < DATE '1995-01-03' GROUP BY 1 ORDER BY 1 OFFSET 1",
     [(datetime.date(1995, 1, 2), 2)]),
    (f"SELECT s.s_name, COUNT(*) AS n {_SUP}GROUP BY 1 HAVING s.s_name = 'S2' OR COUNT(*) > 1000", [("S2", None)]),
    (f"SELECT n.n_name, COUNT(*) AS n {_COL}{_NAT}GROUP BY 1 HAVING n.n_name = 'FRANCE'", [("FRANCE", 12)]),
    (f"SELECT n.n_name, COUNT(*) AS n, SUM(l.l_quantity) AS q {_COL}{_NAT}GROUP BY 1 HAVING n.n_name = 'FRANCE'",
     [("FRANCE", None)]),
])
def test_negative_control_an_offset_or_having_that_keeps_a_key_is_answered(sql: str, rows: list) -> None:
    with _session(_data()) as s:
        r = s.query(sql, epsilon=1.0, delta=1e-6)
        got = [tuple(x.values())[:2] for x in r.table.to_pylist()]
        assert [(k, n if want is not None else None) for (k, n), (_, want) in zip(got, rows, strict=True)] == rows
        assert s.history().num_rows == 1


@pytest.mark.parametrize("key", ["year(o.o_orderdate)", "date_trunc('month', o.o_orderdate)", "o.o_orderdate + 1"])
def test_a_derived_date_key_whose_where_keeps_no_day_is_refused_for_free(key: str) -> None:
    """Over the declared range 1995-01-01 .. 1995-12-31, ``WHERE o.o_orderdate > DATE '1996-01-01'`` keeps no day: a
    tuple passing it has a year, month or day + 1 outside the key set (1995, its months, its days shifted by one), so
    every released count is a noisy zero whatever the data. ``GROUP BY o.o_orderdate`` itself is refused for free
    (``tests/test_adversary_round64.py``); these keys were charged. (A CASE of literal results is not the same: a row
    outside the declared range passing the WHERE is counted under its ELSE.)"""
    with _session(_data(True)) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(f"SELECT {key} AS k, COUNT(*) AS n {_COL}WHERE o.o_orderdate > DATE '1996-01-01' GROUP BY 1",
                    epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0


def test_negative_control_the_plain_date_key_is_refused_for_free() -> None:
    with _session(_data(True)) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(f"SELECT o.o_orderdate AS k, COUNT(*) AS n {_COL}WHERE o.o_orderdate > DATE '1996-01-01' GROUP BY 1",
                    epsilon=1.0, delta=1e-6)
        r = s.query(f"SELECT year(o.o_orderdate) AS k, COUNT(*) AS n {_COL}WHERE o.o_orderdate > DATE '1995-11-30' "
                    "GROUP BY 1", epsilon=1.0, delta=1e-6)
        assert r.table.column("k").to_pylist() == [1995] and s.history().num_rows == 1


def test_a_derived_date_keys_set_holds_the_keys_of_the_days_the_where_keeps() -> None:
    """``date_trunc('month', d)`` under ``WHERE d > DATE '1995-11-30'`` releases December alone (it released the
    twelve months, eleven of them noisy zeros whatever the data); its count is the truth's."""
    with _session(_data(True)) as s:
        r = s.query(f"SELECT month(o.o_orderdate) AS k, COUNT(*) AS n {_COL}WHERE o.o_orderdate > DATE '1995-11-30' "
                    "GROUP BY 1", epsilon=1.0, delta=1e-6)
        assert r.table.column("k").to_pylist() == [12]


def test_on_spark_a_having_that_keeps_no_public_key_of_a_grouped_join_is_refused_for_free() -> None:
    """The same check on the Spark engine (its key set read through the engine's public reads): refused for free; the
    control (a HAVING keeping a key) is answered with that key alone. Skipped without pyspark/Java."""
    from _spark import require_spark

    require_spark()
    from test_spark_joins import NCO, fk_data, make

    s = make("spark", fk_data(), nation_domain=False)
    try:
        before = s.remaining()
        for sql in (f"SELECT n.n_name, COUNT(*) AS k {NCO} GROUP BY n.n_name HAVING n.n_name = 'ATLANTIS'",
                    f"SELECT n.n_name, COUNT(*) AS k {NCO} GROUP BY n.n_name OFFSET 5"):
            with pytest.raises(dpsql.errors.UnsupportedQueryError, match="every public key|skips every row"):
                s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0
        r = s.query(f"SELECT n.n_name, COUNT(*) AS k {NCO} GROUP BY n.n_name HAVING n.n_name = 'A'", epsilon=1.0,
                    delta=1e-6)
        assert r.table.column("n_name").to_pylist() == ["A"] and s.history().num_rows == 1
    finally:
        s.close()


@pytest.mark.parametrize("sql", [
    "SELECT c_mktsegment, COUNT(*) AS n FROM customer GROUP BY ROLLUP (c_mktsegment) OFFSET 3",
    f"SELECT l.l_shipmode, COUNT(*) AS n {_COL}GROUP BY ROLLUP (1) OFFSET 3",
    "SELECT c.c_mktsegment, o.o_orderpriority, COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
    "GROUP BY CUBE (1, 2) OFFSET 9",
    "SELECT c_mktsegment, COUNT(*) AS n FROM customer GROUP BY c_mktsegment UNION ALL SELECT 'all', COUNT(*) FROM orders "
    "OFFSET 3",
])
def test_an_offset_past_every_row_of_a_request_of_several_queries_is_refused_for_free(sql: str) -> None:
    """A ROLLUP, CUBE or UNION ALL whose queries' rows are all known before the charge (one per query without GROUP BY,
    one per declared key): an OFFSET at or beyond their sum released no row and was charged."""
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="charged for nothing"):
            s.query(sql, epsilon=1.0, delta=1e-6)
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="charged for nothing"):
            s.explain(sql, epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0


@pytest.mark.parametrize("sql", [
    "SELECT c_mktsegment, COUNT(*) AS n FROM customer GROUP BY ROLLUP (c_mktsegment) ORDER BY 1 NULLS LAST OFFSET 2",
    f"SELECT l.l_shipmode, COUNT(*) AS n {_COL}GROUP BY ROLLUP (1) ORDER BY 1 NULLS LAST OFFSET 2",
    "SELECT c_mktsegment, COUNT(*) AS n FROM customer GROUP BY c_mktsegment UNION ALL SELECT 'all', COUNT(*) FROM orders "
    "OFFSET 2",
    "SELECT c_phone, COUNT(*) AS n FROM customer GROUP BY ROLLUP (c_phone) OFFSET 1",  # (a sparse histogram: unknown)
])
def test_negative_control_an_offset_that_may_leave_a_row_is_answered(sql: str) -> None:
    with _session(_data()) as s:
        s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 1


@pytest.mark.parametrize("agg", ["SUM(l.l_quantity)", "COUNT(*)"])
def test_a_clip_norm_near_the_double_range_is_a_config_error_for_free(agg: str) -> None:
    """``options={'clip_norm': 1e308}`` on a grouped join: the noise scale it needs overflows to inf; a SUM raised a bare
    OverflowError ('cannot convert float infinity to integer') and a COUNT said 'invalid Gaussian parameters sigma=inf',
    both before the charge. Now a ConfigError naming clip_norm; a large but finite one (the control) is answered."""
    sql = f"SELECT n.n_name, {agg} AS v {_COL}{_NAT}GROUP BY 1"
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.ConfigError, match=r"clip_norm=1e\+308 is too large"):
            s.query(sql, epsilon=1.0, delta=1e-6, options={"clip_norm": 1e308})
        assert s.history().num_rows == 0
        if agg.startswith("SUM"):
            s.query(sql, epsilon=1.0, delta=1e-6, options={"clip_norm": 1e300})
            assert s.history().num_rows == 1


def test_a_where_on_the_private_side_of_an_on_equality_that_keeps_no_public_row_is_refused_for_free() -> None:
    """``JOIN nation n ON n.n_nationkey = c.c_nationkey ... WHERE c.c_nationkey > 5``: every tuple has n_nationkey =
    c_nationkey, so the WHERE keeps only tuples of nations 6 and up, and the public nation table has none: the release
    (FRANCE and GERMANY, noisy zeros) is the same whatever the data, charged. ``WHERE n.n_nationkey > 5`` is refused for
    free (the control)."""
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(f"SELECT n.n_name, COUNT(*) AS n {_COL}{_NAT}WHERE c.c_nationkey > 5 GROUP BY 1", epsilon=1.0,
                    delta=1e-6)
        assert s.history().num_rows == 0


def test_negative_control_the_same_condition_on_the_public_column_is_refused_for_free() -> None:
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="no row whatever the data"):
            s.query(f"SELECT n.n_name, COUNT(*) AS n {_COL}{_NAT}WHERE n.n_nationkey > 5 GROUP BY 1", epsilon=1.0,
                    delta=1e-6)
        # a condition on the private side that keeps a public row narrows the key set to it, and counts its tuples
        r = s.query(f"SELECT n.n_name, COUNT(*) AS n {_COL}{_NAT}WHERE c.c_nationkey = 1 GROUP BY 1", epsilon=1.0,
                    delta=1e-6)
        assert r.table.to_pylist() == [{"n_name": "GERMANY", "n": 12}]
        r = s.query(f"SELECT n.n_name, COUNT(*) AS n {_COL}{_NAT}WHERE c.c_nationkey + 0 >= 0 GROUP BY 1 ORDER BY 1",
                    epsilon=1.0, delta=1e-6)
        assert r.table.to_pylist() == [{"n_name": "FRANCE", "n": 12}, {"n_name": "GERMANY", "n": 12}]

