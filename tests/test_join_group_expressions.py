"""GROUP BY expressions over joins (``dpsql.plan.join_groups``, keys of kind ``derived``): a CASE of literals, date_trunc
over a declared date range, expressions of a public table's columns or of declared domains. Each key set is computed
from public values only and released in full (noisy zeros included); with zero noise each released count equals plain
SQL's over the join (the clip norm is Delta here, so the clipping never binds). Keys without a public key set are
refused for free, naming the declaration that would answer them."""

from __future__ import annotations

import datetime
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from test_s4s_vector import session, tpch

import dpsql
from dpsql.budget import Budget
from dpsql.errors import PolicyError, UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

LO = "FROM lineitem l JOIN orders o ON o.o_orderkey = l.l_orderkey"
CN = "FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey"
COL = "FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON o.o_orderkey = l.l_orderkey"


@pytest.fixture(scope="module")
def data() -> dict[str, pa.Table]:
    return tpch()


@pytest.fixture(scope="module")
def s(data: dict[str, pa.Table]) -> Any:
    sess = session(data)
    use_noise(sess, zero_noise())
    yield sess
    sess.close()


def truth(data: dict[str, pa.Table], sql: str) -> dict[Any, int]:
    con = duckdb.connect()
    for k, v in data.items():
        con.register(k, v)
    out = dict(con.execute(sql).fetchall())
    con.close()
    return out


def released(r: Any) -> dict[Any, Any]:
    key, value = r.table.column_names[0], r.table.column_names[-1]
    return dict(zip(r.table.column(key).to_pylist(), r.table.column(value).to_pylist(), strict=True))


def test_a_case_of_literals_over_a_private_column_releases_its_results(data: dict[str, pa.Table], s: Any) -> None:
    """The key set is the CASE's results, NULL included (no ELSE); every tuple is in one of them."""
    sql = (f"SELECT CASE WHEN l.l_price > 50 THEN 'hi' WHEN l.l_price > 20 THEN 'mid' END AS b, COUNT(*) AS n {LO} "
           "GROUP BY b ORDER BY b")
    r = s.query(sql, epsilon=4.0, delta=1e-7)
    assert r.mechanism == "clipped_gaussian"
    assert r.table.column("b").to_pylist() == ["hi", "mid", None]
    assert released(r) == truth(data, sql.replace(" ORDER BY b", "")) and len(released(r)) == 3
    ex = s.explain(sql, epsilon=4.0, delta=1e-7)
    assert [(k["kind"], k["values"]) for k in ex.parameters["group_keys"]] == [("derived", 3)]
    ex = s.explain(f"SELECT date_trunc('month', l.l_shipdate) AS m, COUNT(*) {LO} GROUP BY m", epsilon=4.0, delta=1e-7)
    assert ex.parameters["group_keys"][0]["values"].startswith("the expression over its columns' public values")


def test_a_case_with_a_literal_it_never_reaches_still_releases_it(data: dict[str, pa.Table], s: Any) -> None:
    """'never' holds no tuple (no price is above 1000): released as a zero, as every key of a public key set is."""
    sql = (f"SELECT CASE WHEN l.l_price > 1000 THEN 'never' ELSE 'all' END AS b, COUNT(*) AS n {LO} GROUP BY 1")
    got = released(s.query(sql, epsilon=4.0, delta=1e-7))
    assert got == {"all": sum(truth(data, sql).values()), "never": 0}


def test_date_trunc_releases_every_month_of_the_declared_range(data: dict[str, pa.Table], s: Any) -> None:
    """Months of 1992-1994 (the declared range): 36 keys; a WHERE on the column keeps the months of the days it lets
    through (1992's twelve: the months of 1993 and 1994 were released as zeros whatever the data)."""
    sql = f"SELECT date_trunc('month', l.l_shipdate) AS m, COUNT(*) AS n {LO} GROUP BY m ORDER BY m"
    got = released(s.query(sql, epsilon=4.0, delta=1e-7))
    months = [datetime.datetime(y, mo, 1) for y in (1992, 1993, 1994) for mo in range(1, 13)]
    assert list(got) == months
    sql = sql.replace("GROUP BY", "WHERE l.l_shipdate < DATE '1993-01-01' GROUP BY")
    got = released(s.query(sql, epsilon=4.0, delta=1e-7))
    assert list(got) == months[:12]
    want = {k if isinstance(k, datetime.datetime) else datetime.datetime(k.year, k.month, 1): v
            for k, v in truth(data, sql.replace(" ORDER BY m", "")).items()}
    assert got == {m: want.get(m, 0) for m in months[:12]} and sum(got.values()) > 0
    # month() of the same range: the twelve months
    got = released(s.query(f"SELECT month(l.l_shipdate) AS m, COUNT(*) {LO} GROUP BY m", epsilon=4.0, delta=1e-7))
    assert list(got) == list(range(1, 13))
    assert got == truth(data, f"SELECT month(l.l_shipdate), COUNT(*) {LO} GROUP BY 1")


def test_expressions_of_a_public_tables_columns_take_its_values(data: dict[str, pa.Table], s: Any) -> None:
    """The key set is the expression over the public table's rows (after the WHERE conjuncts on it alone)."""
    sql = (f"SELECT CASE WHEN n.n_regionkey = 2 THEN 'asia' ELSE lower(n.n_name) END AS g, COUNT(*) {CN} "
           "GROUP BY g ORDER BY g")
    got = released(s.query(sql, epsilon=4.0, delta=1e-7))
    assert list(got) == ["algeria", "asia", "brazil"]
    assert got == truth(data, sql.replace(" ORDER BY g", ""))
    sql = f"SELECT coalesce(n.n_name, 'none') AS g, COUNT(*) {CN} WHERE n.n_regionkey <> 1 GROUP BY g ORDER BY g"
    got = released(s.query(sql, epsilon=4.0, delta=1e-7))
    assert list(got) == ["ALGERIA", "CHINA", "DENMARK"]  # 'BRAZIL' is excluded by the WHERE on nation alone
    assert got == truth(data, sql.replace(" ORDER BY g", ""))


def test_an_expression_of_a_declared_domain_takes_its_image(data: dict[str, pa.Table], s: Any) -> None:
    sql = (f"SELECT CASE WHEN c.c_mktsegment = 'AUTO' THEN 'car' ELSE lower(c.c_mktsegment) END AS g, COUNT(*) {COL} "
           "GROUP BY g ORDER BY g")
    got = released(s.query(sql, epsilon=4.0, delta=1e-7))
    assert list(got) == ["build", "car"]
    assert got == truth(data, sql.replace(" ORDER BY g", ""))


def test_the_key_is_named_as_written_in_select_having_and_order_by(data: dict[str, pa.Table], s: Any) -> None:
    """Written again with unqualified columns in the SELECT list, and named in HAVING and ORDER BY."""
    sql = (f"SELECT CASE WHEN l_price > 50 THEN 'hi' ELSE 'lo' END AS b, COUNT(*) AS n {LO} "
           "GROUP BY (CASE WHEN l.l_price > 50 THEN 'hi' ELSE 'lo' END) "
           "HAVING CASE WHEN l.l_price > 50 THEN 'hi' ELSE 'lo' END <> 'hi' "
           "ORDER BY CASE WHEN l.l_price > 50 THEN 'hi' ELSE 'lo' END DESC")
    r = s.query(sql, epsilon=4.0, delta=1e-7)
    lo = truth(data, f"SELECT CASE WHEN l.l_price > 50 THEN 'hi' ELSE 'lo' END, COUNT(*) {LO} GROUP BY 1")["lo"]
    assert r.table.to_pylist() == [{"b": "lo", "n": lo}]


def test_two_keys_one_derived_one_public(data: dict[str, pa.Table], s: Any) -> None:
    sql = ("SELECT n.n_name, year(l.l_shipdate) AS y, CASE WHEN l.l_price > 50 THEN 'hi' ELSE 'lo' END AS b, "
           "COUNT(*) AS n FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey JOIN orders o "
           "ON c.c_custkey = o.o_custkey JOIN lineitem l ON o.o_orderkey = l.l_orderkey GROUP BY 1, 2, 3")
    r = s.query(sql, epsilon=4.0, delta=1e-7)
    assert r.table.num_rows == 4 * 3 * 2  # every combination of the key sets
    con = duckdb.connect()
    for k, v in data.items():
        con.register(k, v)
    want = {(a, b, c): n for a, b, c, n in con.execute(sql).fetchall()}
    got = {(x["n_name"], x["y"], x["b"]): x["n"] for x in r.table.to_pylist()}
    assert {k: v for k, v in got.items() if v} == want


def test_the_sampled_algorithm_answers_a_derived_key(data: dict[str, pa.Table]) -> None:
    """DP-S4S's vector form over a public table's expression (several people per tuple)."""
    s = session(data, suppliers=True, sizes=True)
    use_noise(s, zero_noise())
    sql = ("SELECT CASE WHEN n.n_name = 'CHINA' THEN 'cn' ELSE 'other' END AS g, SUM(l.l_price) AS rev FROM lineitem l "
           "JOIN orders o ON o.o_orderkey = l.l_orderkey JOIN customer c ON c.c_custkey = o.o_custkey "
           "JOIN supplier su ON su.s_suppkey = l.l_suppkey JOIN nation n ON su.s_nationkey = n.n_nationkey "
           "WHERE n.n_regionkey = 2 GROUP BY g ORDER BY g")
    r = s.query(sql, epsilon=4.0, delta=1e-7, options={"q": 0.5})
    assert r.mechanism == "dp_s4s_vector"
    assert r.table.column("g").to_pylist() == ["cn", "other"]
    s.close()


def test_a_lookup_join_answers_an_undeclared_private_expression_by_the_sparse_histogram(s: Any) -> None:
    """No public key set (an integer reference without bounds): the one-table path of a lookup join, keys released
    above a noisy threshold; over a general join the same key is refused."""
    ex = s.explain(f"SELECT c.c_nationkey + 1 AS k, COUNT(*) {CN} GROUP BY k", epsilon=1.0, delta=1e-6)
    assert ex.mechanism == "sparse_histogram"
    with pytest.raises(PolicyError, match=r"'orders.o_custkey' has no finite set of public values"):
        s.explain(f"SELECT o.o_custkey % 2 AS k, COUNT(*) {LO} GROUP BY k", epsilon=1.0, delta=1e-6)


REFUSED = [
    # a DOUBLE column with bounds only: no finite set of values
    (f"SELECT floor(l.l_price / 10) * 10 AS b, COUNT(*) {LO} GROUP BY b", PolicyError,
     r"'lineitem.l_price' has no finite set of public values .* \(hint: declare columns=\{'l_price'"),
    # a CASE whose result is a column
    (f"SELECT CASE WHEN l.l_price > 5 THEN o.o_custkey END AS b, COUNT(*) {LO} GROUP BY b", PolicyError,
     "needs a public key set"),
    # not on the allow-list
    (f"SELECT CASE WHEN random() > 0.5 THEN 'a' ELSE 'b' END AS b, COUNT(*) {LO} GROUP BY b", UnsupportedQueryError,
     "(?i)random"),
    # a collation in a key
    (f"SELECT CASE WHEN n.n_name COLLATE NOCASE = 'x' THEN 'a' ELSE 'b' END AS b, COUNT(*) {CN} GROUP BY b",
     UnsupportedQueryError, "COLLATE"),
]


@pytest.mark.parametrize("sql,cls,msg", REFUSED, ids=[m for _, _, m in REFUSED])
def test_refusals_are_free(s: Any, sql: str, cls: type, msg: str) -> None:
    before, rows = s.remaining(), s.history().num_rows
    for call in (s.explain, s.query):
        with pytest.raises(cls, match=msg):
            call(sql, epsilon=1.0, delta=1e-7)
    assert s.remaining() == before and s.history().num_rows == rows


def test_too_many_combinations_are_refused_free() -> None:
    """The product of the columns' public values is bounded before any read (here 200 001 integers)."""
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("p", pa.table({"pid": [1, 2]}), privacy_unit="pid")
    s.register("e", pa.table({"pid": [1, 2], "v": [3, 4]}), references={"pid": "p.pid"}, degree_bounds={"pid": 3},
               columns={"v": {"bounds": (0, 200_000)}})
    with pytest.raises(PolicyError, match=r"'e.v' has no finite set of public values \(a declared domain, a DATE or "
                                          r"integer range of at most 100000 values, or a TIMESTAMP range"):
        s.query("SELECT e.v % 7 AS r, COUNT(*) FROM p JOIN e ON p.pid = e.pid GROUP BY r", epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 0
    s.close()


def test_a_tuple_whose_key_is_outside_the_key_set_is_not_counted(data: dict[str, pa.Table]) -> None:
    """Dates after the declared range: their months are not in the key set, so they count nowhere."""
    late = data["lineitem"].set_column(3, "l_shipdate", pa.array([datetime.date(1999, 5, 1)] * data["lineitem"].num_rows))
    s = session({**data, "lineitem": late})
    use_noise(s, zero_noise())
    got = released(s.query(f"SELECT date_trunc('month', l.l_shipdate) AS m, COUNT(*) {LO} GROUP BY m",
                           epsilon=4.0, delta=1e-7))
    assert len(got) == 36 and all(v == 0 for v in got.values())
    s.close()


def test_a_timestamp_read_through_its_date_takes_the_days_of_its_range() -> None:
    """date_trunc to a day or coarser, a date part, a cast to DATE: the key set over the range's days (their
    midnights); an hour of the same column has no public key set and is refused for free."""
    import numpy as np

    g = np.random.default_rng(1)
    base = datetime.datetime(2024, 1, 1)
    p = pa.table({"pid": np.arange(50)})
    e = pa.table({"pid": g.integers(0, 50, 300),
                  "ts": pa.array([base + datetime.timedelta(seconds=int(x)) for x in g.integers(0, 90 * 86400, 300)],
                                 pa.timestamp("us"))})
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("p", p, privacy_unit="pid")
    s.register("e", e, references={"pid": "p.pid"}, degree_bounds={"pid": 20},
               columns={"ts": {"bounds": ("2024-01-01 00:00:00", "2024-03-31 23:59:59"), "bin_width": "1 hour"}})
    con = duckdb.connect()
    con.register("p", p)
    con.register("e", e)
    for key, n in (("date_trunc('month', e.ts)", 3), ("CAST(e.ts AS DATE)", 91), ("dayofweek(e.ts)", 7),
                   ("extract(quarter FROM e.ts)", 1)):
        sql = f"SELECT {key} AS k, COUNT(*) AS n FROM p JOIN e ON p.pid = e.pid GROUP BY 1"
        got = released(s.query(sql, epsilon=1.0, delta=1e-6))
        assert len(got) == n, key
        assert {k: v for k, v in got.items() if v} == dict(con.execute(sql).fetchall()), key
    for key in ("hour(e.ts)", "date_trunc('hour', e.ts)", "strftime(e.ts, '%Y-%m')"):
        with pytest.raises(PolicyError, match="'e.ts' has no finite set of public values"):
            s.query(f"SELECT {key} AS k, COUNT(*) FROM p JOIN e ON p.pid = e.pid GROUP BY 1", epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 4
    s.close()


def test_under_a_left_join_an_expression_key_is_a_one_table_key() -> None:
    """A LEFT JOIN is answered by the one-table path only (the join mechanisms join inner): an expression of the
    lookup's columns is a key as on one table, released above the sparse histogram's threshold; at zero noise every
    group equals plain SQL's, the unmatched rows' group ('none', from NULL) included. The same key over the inner join
    releases the public key set by the join mechanisms."""
    from test_lookup_left_join import JOIN, _duckdb, _session

    s = _session(region_domain=False)
    for key in ("coalesce(c.region, 'none')", "CASE WHEN c.region = 'EU' THEN 'eu' ELSE 'other' END"):
        sql = f"SELECT {key} AS r, COUNT(*) AS n {JOIN} GROUP BY r ORDER BY r"
        r = s.query(sql, epsilon=1.0, delta=1e-5)
        assert r.mechanism == "sparse_histogram"
        assert r.to_pylist() == _duckdb(sql) and len(r.to_pylist()) >= 2
    inner = "SELECT coalesce(c.region, 'none') AS r, COUNT(*) AS n FROM events e JOIN countries c ON e.cc = c.code GROUP BY r"
    r = s.query(inner + " ORDER BY r", epsilon=1.0, delta=1e-5)
    assert r.mechanism == "clipped_gaussian" and r.to_pylist() == _duckdb(inner + " ORDER BY r")
    s.close()


def _clipped(s: Any, sql: str) -> dict[Any, float]:
    """Per key of the public key set, the exact clipped total of the bounded rows (before noise and rounding)."""
    from fractions import Fraction

    from dpsql.mechanisms.s4s_vector import clipped_totals
    from dpsql.rewrite.joins import parts_of

    r = s._route(sql, 4.0, 1e-7, {"clip_norm": 2.0})
    rows = s._engine.fetch_arrow(r.mechanism.bounded(r.calibration, "salt", s._engine.ops)).sort_by("__gid")
    totals = clipped_totals(rows, r.calibration.clip, parts_of(r.calibration.jp))
    return {k: float(Fraction(n) * Fraction(2) ** -e) for k, (n, e) in zip(rows.column("__k0").to_pylist(), totals)}


def test_removing_one_person_moves_a_derived_keys_vector_by_at_most_the_clip_norm(data: dict[str, pa.Table]) -> None:
    """A CASE key over a private column, clip norm 2 (below most people's totals, so it binds): for each of 8
    customers, the L2 distance between the clipped vectors with and without that customer is at most 2, and the key
    set is the same. Negative control: the unclipped vectors (clip norm Delta = 12) move by more than 2 for some."""
    import math

    sql = (f"SELECT CASE WHEN l.l_price > 50 THEN 'hi' WHEN l.l_price > 20 THEN 'mid' END AS b, COUNT(*) {COL} "
           "GROUP BY b")
    full = session(data)
    base = _clipped(full, sql)
    full.close()
    moved_unclipped = 0.0
    for cust in range(8):
        keep = [o for o, c in zip(data["orders"].column("o_orderkey").to_pylist(),
                                  data["orders"].column("o_custkey").to_pylist(), strict=True) if c != cust]
        orders = data["orders"].filter(pa.compute.is_in(data["orders"].column("o_orderkey"), pa.array(keep)))
        lines = data["lineitem"].filter(pa.compute.is_in(data["lineitem"].column("l_orderkey"), pa.array(keep)))
        customers = data["customer"].filter(pa.compute.not_equal(data["customer"].column("c_custkey"), cust))
        s = session({**data, "orders": orders, "lineitem": lines, "customer": customers})
        near = _clipped(s, sql)
        assert set(near) == set(base) == {"hi", "mid", None}
        assert math.sqrt(sum((base[k] - near[k]) ** 2 for k in base)) <= 2.0 * (1 + 2**-30)
        con = duckdb.connect()
        for k, v in {**data, "orders": orders, "lineitem": lines, "customer": customers}.items():
            con.register(k, v)
        a, b = truth(data, sql), dict(con.execute(sql).fetchall())
        moved_unclipped = max(moved_unclipped, math.sqrt(sum((a.get(k, 0) - b.get(k, 0)) ** 2 for k in set(a) | set(b))))
        s.close()
    assert moved_unclipped > 2.0  # the control: without the clipping one person moves the counts by more
