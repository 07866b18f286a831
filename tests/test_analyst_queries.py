"""Everyday analyst queries over one private table: what is answered matches plain DuckDB at zero noise, and
what is refused names the problem and the answered form, before any charge."""

from __future__ import annotations

import datetime

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import Budget
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


def _events() -> pa.Table:
    base = datetime.datetime(2024, 1, 1)
    n = 400
    ts = [base + datetime.timedelta(hours=7 * i + (i % 5)) for i in range(n)]
    return pa.table({
        "user_id": pa.array(range(n), pa.int64()),
        "url": pa.array(["/home", "/products/a", "/cart", "/help"] * (n // 4)),
        "ts": pa.array(ts, pa.timestamp("us")),
        "day": pa.array([t.date() for t in ts], pa.date32()),
        "device": pa.array(["iPhone 15", "Pixel 8", "Windows PC", "MacBook"] * (n // 4)),
    })


@pytest.fixture()
def session() -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("events", _events(), privacy_unit="user_id", max_groups_per_unit=1, max_rows_per_group=1)
    use_noise(s, zero_noise())
    yield s
    s.close()


def _truth(sql: str) -> list[tuple]:
    con = duckdb.connect()
    con.register("events", _events())
    return con.execute(sql).fetchall()


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM events WHERE epoch(ts) > 1710000000",
    "SELECT COUNT(*) FROM events WHERE epoch(day) < 1710000000",
    "SELECT COUNT(*) FROM events WHERE EPOCH(ts) BETWEEN 1705000000 AND 1707000000.5",
])
def test_epoch_is_date_part_epoch(session: dpsql.Session, sql: str) -> None:
    """DuckDB's epoch(x) is date_part('epoch', x) (a DOUBLE of seconds): answered as that, where it was refused
    with the hint to write date_part('epoch', x)."""
    r = session.query(sql, epsilon=1.0, delta=1e-6)
    assert [tuple(v.values()) for v in r.table.to_pylist()] == _truth(sql)
    assert r.table.to_pylist() == session.query(sql.replace("epoch(", "date_part('epoch', ").replace(
        "EPOCH(", "date_part('epoch', "), epsilon=1.0, delta=1e-6).table.to_pylist()


@pytest.mark.parametrize(("sql", "fix"), [
    ("SELECT COUNT(*) FROM events WHERE strlen(device) > 5", "length("),
    ("SELECT COUNT(*) FROM events WHERE ts >= make_timestamp(2024, 3, 1, 0, 0, 0)", "TIMESTAMP '"),
    ("SELECT time_bucket(INTERVAL '1 week', ts) AS w, COUNT(*) FROM events GROUP BY w", "date_trunc('week'"),
    ("SELECT COUNT(*) FROM events WHERE list_contains(['/home', '/cart'], url)", "IN ("),
    ("SELECT COUNT(*) FROM events WHERE array_contains(['/home', '/cart'], url)", "IN ("),
    ("SELECT COUNT(*) FROM events WHERE epoch_ms(ts) > 0", "date_part('epoch'"),
    ("SELECT COUNT(*) FROM events WHERE (url, device) = ('/home', 'MacBook')", " AND "),
    ("SELECT COUNT(*) FROM events WHERE CAST(ts AS TIME) < TIME '06:00:00'", "hour("),
    ("SELECT COUNT(*) FROM events WHERE regexp_extract(url, '/p') = '/p'", "LIKE"),
    ("SELECT COUNT(*) FROM events WHERE regexp_replace(url, '/', '') = 'home'", "replace(s, "),
    ("SELECT width_bucket(length(url), 0, 20, 4) AS b, COUNT(*) FROM events GROUP BY b", "floor("),
    ("SELECT COUNT(*) FROM events WHERE to_date(url, '%Y') IS NULL", "strptime("),
    ("SELECT COUNT(*) FROM events WHERE string_split(url, '/')[2] = 'home'", "split_part("),
    ("SELECT COUNT(*) FROM events WHERE url[1:2] = '/h'", "substring("),
    ("SELECT COUNT(*) FROM events WHERE ts > TIMESTAMPTZ '2024-06-01 00:00:00+00'", "TIMESTAMP '"),
])
def test_an_off_list_construct_names_the_answered_form(session: dpsql.Session, sql: str, fix: str) -> None:
    """Each was refused naming only the construct (no fix): the message now names the form that is answered,
    and nothing is charged."""
    for run in (session.explain, session.query):
        with pytest.raises(UnsupportedQueryError) as info:
            run(sql, epsilon=1.0, delta=1e-6)
        assert fix in str(info.value), str(info.value)
        assert "hint" in str(info.value) or ";" in str(info.value)
    assert session.remaining() == Budget(100.0, 1e-3) and session.history().num_rows == 0


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM regions",
    "SELECT region, COUNT(*) FROM regions GROUP BY region",
    "SELECT COUNT(*) FROM regions a JOIN regions b ON a.code = b.code",
])
def test_a_query_of_public_tables_only_says_they_are_public(sql: str) -> None:
    """A query of a table registered public=True was refused as a table that 'has no privacy unit column and
    reaches none through a foreign key', with the hint to give it one: the message now says the table is public
    (nothing to protect) and names the fix (read it directly, or join it to a private table). Nothing is charged."""
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("events", _events(), privacy_unit="user_id")
    s.register("regions", pa.table({"code": ["a", "b"], "region": ["x", "y"]}), public=True)
    for run in (s.explain, s.query):
        with pytest.raises(dpsql.errors.QueryError) as info:
            run(sql, epsilon=1.0, delta=1e-6)
        text = str(info.value)
        assert "public" in text and "nothing private to protect" in text and "directly" in text, text
        assert "reaches none through a foreign key" not in text, text
    assert s.remaining() == Budget(10.0, 1e-3) and s.history().num_rows == 0
    s.close()


# -- SUM / AVG of an expression over joins: bounds by interval arithmetic, as on one table -------------------


def _tpch_session() -> tuple[dpsql.Session, duckdb.DuckDBPyConnection]:
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from test_s4s_vector import session as tpch_session
    from test_s4s_vector import tpch

    data = tpch()
    s = tpch_session(data)
    use_noise(s, zero_noise())
    con = duckdb.connect()
    for k, v in data.items():
        con.register(k, v)
    return s, con


SHARE = "AVG(CASE WHEN c.c_mktsegment = 'AUTO' THEN 1.0 ELSE 0.0 END)"


@pytest.mark.parametrize("sql", [
    f"SELECT {SHARE} AS auto_share FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey",
    f"SELECT n.n_name, {SHARE} AS auto_share FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "GROUP BY n.n_name ORDER BY n.n_name",
    "SELECT n.n_name, SUM(CASE WHEN c.c_mktsegment = 'AUTO' THEN 2 ELSE 0 END) AS s FROM customer c JOIN nation n "
    "ON c.c_nationkey = n.n_nationkey GROUP BY n.n_name ORDER BY n.n_name",
])
def test_sum_and_avg_of_an_expression_over_a_lookup_join(sql: str) -> None:
    """A share over a join (AVG of a CASE of literals) was refused as 'AVG over an expression needs literal bounds',
    where one table derives them ([0, 1] here): now the same, and the answer is plain SQL's at zero noise."""
    s, con = _tpch_session()
    r = s.query(sql, epsilon=5.0, delta=1e-5)
    got = [tuple(round(v, 6) if isinstance(v, float) else v for v in row.values()) for row in r.table.to_pylist()]
    exp_ = [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in con.execute(sql).fetchall()]
    assert got == exp_


def test_sum_of_an_expression_over_a_join_of_people_takes_its_derived_bounds() -> None:
    s, _ = _tpch_session()
    text = s.explain("SELECT SUM(l.l_price * 2 + 1) AS s FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey",
                     epsilon=1.0, delta=1e-6)
    assert "201" in str(text), str(text)  # bounds [1, 201] from l_price's [0, 100]


@pytest.mark.parametrize("sql", [
    "SELECT AVG(CASE WHEN l.l_price > 50 THEN l.l_price END) FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey",
    "SELECT AVG(l.l_price * 2) FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey",
    "SELECT SUM(o.o_orderkey * 2) FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey",
])
def test_an_expression_over_a_join_without_a_never_null_value_or_bounds_is_refused_for_free(sql: str) -> None:
    """An AVG of an expression that may be NULL (AVG skips it: the count is of its non-NULL values, which the join
    mechanisms do not count) and a SUM of a column without bounds stay refused, naming the fix, before any charge."""
    s, _ = _tpch_session()
    before = s.remaining()
    with pytest.raises(dpsql.errors.QueryError) as info:
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert "LEAST(GREATEST(" in str(info.value), str(info.value)
    assert s.remaining() == before


@pytest.mark.parametrize("sql", [
    "SELECT time_bucket(INTERVAL '1 week', ts) AS w, COUNT(*) FROM events GROUP BY w",
    "SELECT COUNT(*) FROM events WHERE url[1:2] = '/h'",
    "SELECT COUNT(*) FROM events WHERE json_extract(url, '$.a') IS NULL",
    "SELECT COUNT(*) FROM events WHERE list_contains(['/home', '/cart'], url)",
])
def test_an_off_list_call_is_one_problem_not_its_parts(session: dpsql.Session, sql: str) -> None:
    """The refusal of time_bucket(INTERVAL '1 week', ts) also listed 'the expression INTERVAL is not on the
    allow-list' (without a position), and a JSON path its three parts: parts of a refused call are no problem
    of their own."""
    with pytest.raises(UnsupportedQueryError) as info:
        session.explain(sql, epsilon=1.0, delta=1e-6)
    text = str(info.value)
    assert "problems" not in text and "INTERVAL is not" not in text and "JSONPATH" not in text, text


# -- windows over a join's released rows ---------------------------------------------------------------------

_CN = "FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "


@pytest.mark.parametrize("sql", [
    f"SELECT n.n_name, COUNT(*) AS k, RANK() OVER (ORDER BY COUNT(*) DESC, n.n_name) AS r {_CN}GROUP BY n.n_name ORDER BY r",
    f"SELECT n.n_name AS nm, COUNT(*) AS k, k - LAG(k) OVER (ORDER BY nm) AS d {_CN}GROUP BY nm ORDER BY nm",
    f"SELECT n.n_name, COUNT(*) AS k, SUM(COUNT(*)) OVER () AS total {_CN}GROUP BY n.n_name ORDER BY 1",
    f"SELECT n.n_name, COUNT(*) AS k {_CN}GROUP BY n.n_name QUALIFY ROW_NUMBER() OVER (ORDER BY COUNT(*), n.n_name) <= 2 "
    "ORDER BY 1",
    f"SELECT n.n_name, RANK() OVER (ORDER BY COUNT(*) DESC, n.n_name) AS r {_CN}GROUP BY n.n_name ORDER BY 1",
    f"SELECT c.c_mktsegment, COUNT(DISTINCT c.c_custkey) AS u, RANK() OVER (ORDER BY COUNT(DISTINCT c.c_custkey) DESC) "
    f"AS r {_CN}GROUP BY c.c_mktsegment ORDER BY 1",
])
def test_a_window_over_a_lookup_join_is_duckdbs_over_the_released_rows(sql: str) -> None:
    """Windows over a join were refused as answered 'for a query of one table, not over a join's': they run over
    the released rows, as on one table (an aggregate only a window names is released and charged as an output)."""
    s, con = _tpch_session()
    r = s.query(sql, epsilon=5.0, delta=1e-5)
    got = [tuple(int(v) if hasattr(v, "as_integer_ratio") and not isinstance(v, (bool, float)) else v
                 for v in row.values()) for row in r.table.to_pylist()]
    assert got == [tuple(int(v) if isinstance(v, int) else v for v in row) for row in con.execute(sql).fetchall()]


def test_a_window_over_a_join_of_people_reads_its_released_sums() -> None:
    s, _ = _tpch_session()
    sql = ("SELECT year(l.l_shipdate) AS y, SUM(l.l_price) AS s, SUM(SUM(l.l_price)) OVER (ORDER BY year(l.l_shipdate)) "
           "AS run FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey GROUP BY y ORDER BY y")
    rows = s.query(sql, epsilon=5.0, delta=1e-5).table.to_pylist()
    assert [r["y"] for r in rows] == [1992, 1993, 1994]
    running = 0.0
    for r in rows:
        running += r["s"]
        assert r["run"] == pytest.approx(running)


@pytest.mark.parametrize(("sql", "words"), [
    (f"SELECT n.n_name, COUNT(*) {_CN}WHERE RANK() OVER () > 1 GROUP BY n.n_name", "a window function in WHERE"),
    (f"SELECT n.n_name, SUM(COUNT(*)) OVER () {_CN}GROUP BY n.n_name HAVING RANK() OVER () > 0", "filter on a window with QUALIFY"),
    (f"SELECT n.n_name, COUNT(*) {_CN}GROUP BY n.n_name ORDER BY RANK() OVER (ORDER BY SUM(c.c_custkey))", "select it too"),
])
def test_a_window_over_a_join_where_sql_has_none_is_refused_for_free(sql: str, words: str) -> None:
    s, _ = _tpch_session()
    before = s.remaining()
    with pytest.raises(dpsql.errors.QueryError) as info:
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert words in str(info.value), str(info.value)
    assert s.remaining() == before


@pytest.mark.parametrize("sql", [
    f"SELECT 'x' AS t, COUNT(*) AS k {_CN}",
    f"SELECT 'x' AS t, COUNT(*) AS k {_CN}UNION ALL SELECT 'y', COUNT(*) FROM customer ORDER BY 1",
    f"SELECT 2024 AS y, n.n_name, COUNT(*) AS k {_CN}GROUP BY n.n_name ORDER BY 2",
])
def test_a_constant_output_over_a_join_is_answered(sql: str) -> None:
    """A labelled total over a join (SELECT 'x' AS t, COUNT(*) ...) was refused as 'over joins every output must be an
    aggregate', where one table answers it: a constant is no private value."""
    s, con = _tpch_session()
    r = s.query(sql, epsilon=5.0, delta=1e-5)
    assert [tuple(row.values()) for row in r.table.to_pylist()] == con.execute(sql).fetchall()


def test_a_column_output_over_a_join_without_group_by_stays_refused() -> None:
    s, _ = _tpch_session()
    with pytest.raises(UnsupportedQueryError, match="every output must be an aggregate"):
        s.explain(f"SELECT n.n_name, COUNT(*) {_CN}", epsilon=1.0, delta=1e-6)


def test_reuse_on_an_unversioned_arrow_table_says_why_no_synopsis_covers_it() -> None:
    """reuse='synopsis' over an Arrow table registered without version= was refused as 'no stored DAWA synopsis covers
    this query', right after a workload over the same ranges, which sends the analyst looking for the difference:
    such a table's synopses are never reused (an Arrow table has no identity but its label). The message says so
    and names version=; nothing is charged."""
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    t = pa.table({"uid": pa.array(range(200), pa.int64()), "age": pa.array([i % 90 for i in range(200)], pa.int32())})
    s.register("p", t, privacy_unit="uid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 100), "bins": 100}})
    s.query_many(["SELECT COUNT(*) FROM p WHERE age < 30", "SELECT COUNT(*) FROM p WHERE age >= 30"], epsilon=1.0)
    before = s.remaining()
    with pytest.raises(dpsql.errors.PolicyError) as info:
        s.query("SELECT COUNT(*) FROM p WHERE age < 50", epsilon=1.0, options={"reuse": "synopsis"})
    assert "version" in str(info.value) and "'p'" in str(info.value), str(info.value)
    assert s.remaining() == before
    s.register("p", t, privacy_unit="uid", max_rows_per_unit=1, version="v1",
               columns={"age": {"bounds": (0, 100), "bins": 100}})
    s.query_many(["SELECT COUNT(*) FROM p WHERE age < 30", "SELECT COUNT(*) FROM p WHERE age >= 30"], epsilon=1.0)
    assert s.query("SELECT COUNT(*) FROM p WHERE age < 50", epsilon=1.0, options={"reuse": "synopsis"}).reused
    s.close()


@pytest.mark.parametrize("sql", [
    "SELECT devise, COUNT(*) FROM events GROUP BY 1",
    "SELECT devise AS d, COUNT(*) FROM events GROUP BY d",
])
def test_an_unknown_column_grouped_by_position_or_alias_is_one_problem(session: dpsql.Session, sql: str) -> None:
    """It was reported twice, in SELECT and in GROUP BY, at the same place ('the query has 2 problems')."""
    with pytest.raises(UnsupportedQueryError) as info:
        session.explain(sql, epsilon=1.0, delta=1e-6)
    text = str(info.value)
    assert text.count("unknown column 'devise'") == 1 and "did you mean 'device'" in text, text


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM events WHERE url = ANY(['/home', '/cart'])",
    "SELECT COUNT(*) FROM events WHERE url = ANY (['/home'])",
    "SELECT COUNT(*) FROM events WHERE url <> ALL(['/home', '/cart'])",
    "SELECT url, COUNT(*) FROM events WHERE url = ANY(['/home', '/cart', NULL]) GROUP BY url ORDER BY url",
])
def test_a_comparison_with_any_or_all_of_a_literal_list_is_in(session: dpsql.Session, sql: str) -> None:
    """DuckDB's x = ANY([...]) is x IN (...) (and x <> ALL([...]) x NOT IN (...)): it was refused naming that form."""
    r = session.query(sql, epsilon=1.0, delta=1e-6)
    assert [tuple(v.values()) for v in r.table.to_pylist()] == _truth(sql)


def test_any_over_a_pattern_list_stays_refused_naming_the_or_form(session: dpsql.Session) -> None:
    with pytest.raises(UnsupportedQueryError, match="OR"):
        session.explain("SELECT COUNT(*) FROM events WHERE url LIKE ANY(['/h%', '/c%'])", epsilon=1.0, delta=1e-6)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM events WHERE day >= DATE '2024-03-01' - 7",
    "SELECT COUNT(*) FROM events WHERE day - 7 >= DATE '2024-03-01'",
    "SELECT COUNT(*) FROM events WHERE day + 1 > DATE '2024-04-01'",
    "SELECT COUNT(*) FROM events WHERE 30 + day < DATE '2024-04-01'",
    "SELECT year(day + 400) AS y, COUNT(*) AS n FROM events GROUP BY y ORDER BY y",
])
def test_a_date_plus_or_minus_whole_days_is_duckdbs_date(session: dpsql.Session, sql: str) -> None:
    """DATE +/- an integer literal is a DATE in DuckDB (d - 7 is a week earlier): it was refused as 'arithmetic needs
    numbers, got DATE'. Now the shift by that many days, a DATE (NULL outside years 1..9999, as any shift)."""
    r = session.query(sql, epsilon=1.0, delta=1e-6)
    assert r.table.schema.field(0).type in (pa.int64(), pa.date32())
    assert [tuple(v.values()) for v in r.table.to_pylist()] == _truth(sql)


def test_a_date_plus_days_key_is_a_date(session: dpsql.Session) -> None:
    r = session.query("SELECT day + 1 AS next_day, COUNT(*) AS n FROM events GROUP BY next_day", epsilon=1.0, delta=1e-6)
    assert r.table.schema.field("next_day").type == pa.date32()


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM events WHERE day + 1.5 > DATE '2024-04-01'",
    "SELECT COUNT(*) FROM events WHERE 7 - day < DATE '2024-04-01'",
])
def test_other_date_arithmetic_stays_refused_naming_the_interval(session: dpsql.Session, sql: str) -> None:
    with pytest.raises(UnsupportedQueryError, match="INTERVAL"):
        session.explain(sql, epsilon=1.0, delta=1e-6)
