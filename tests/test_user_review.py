"""What a first-time analyst meets: names suggested for typos, hints that point the right way at a
large epsilon, a join with a lookup table that says which reference to declare, and DATE/TIMESTAMP
literals shifted by an INTERVAL. Every refusal here is free (no ledger entry)."""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from _sessions import fresh_and_refusing
from conftest import run_cli

import dpsql
from dpsql import errors
from dpsql.plan.typer import type_predicate
from dpsql.testing import use_noise, zero_noise

pytestmark = pytest.mark.filterwarnings("ignore:epsilon=.* is unusually large")


def _orders() -> pa.Table:
    n = 40
    return pa.table({
        "customer_id": pa.array([i % 10 for i in range(n)], pa.int64()),
        "product_id": pa.array([i % 4 for i in range(n)], pa.int64()),
        "amount": pa.array([float(i) for i in range(n)]),
        "status": pa.array(["done" if i % 3 else "open" for i in range(n)]),
        "order_ts": pa.array([dt.datetime(2024, 1, 1) + dt.timedelta(days=3 * i, hours=i) for i in range(n)],
                             pa.timestamp("us")),
        "order_date": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=3 * i) for i in range(n)], pa.date32()),
        "Promo Code": pa.array(["x"] * n),
    })


def _shop() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("orders", _orders(), privacy_unit="customer_id", max_groups_per_unit=50, max_rows_per_group=50,
               columns={"amount": {"bounds": (0, 100)}, "status": {"domain": ["done", "open"]}})
    s.register("customers", pa.table({"customer_id": pa.array(range(10), pa.int64()),
                                      "segment": ["a", "b"] * 5}), privacy_unit="customer_id",
               columns={"segment": {"domain": ["a", "b"]}})
    s.register("products", pa.table({"product_id": pa.array(range(4), pa.int64()), "category": ["p", "q", "p", "q"]}),
               public=True)
    return s


shop_fixture, shop_refusing_fixture = fresh_and_refusing(_shop, "shop", "shop_refusing")


def _refused(s: dpsql.Session, sql: str, exc: type[Exception], match: str, **kw: float) -> str:
    before = s.history().num_rows
    with pytest.raises(exc, match=match) as info:
        s.query(sql, epsilon=kw.get("epsilon", 1.0), delta=kw.get("delta", 1e-6))
    assert s.history().num_rows == before  # nothing charged, nothing recorded
    return str(info.value)


# -- did you mean ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("sql,suggestion", [
    ("SELECT COUNT(*) FROM orders WHERE amont > 1", "did you mean 'amount'?"),
    ("SELECT SUM(ammount) FROM orders", "did you mean 'amount'?"),
    ("SELECT stauts, COUNT(*) FROM orders GROUP BY stauts", "did you mean 'status'?"),
    ("SELECT COUNT(*) FROM orders WHERE promo_code = 'x'", 'did you mean "promo code" (quoted)?'),
    ("SELECT COUNT(*) FROM orderz", "did you mean 'orders'?"),
    ("SELECT COUNT(*) FROM orders o JOIN customerz c ON o.customer_id = c.customer_id", "did you mean 'customers'?"),
    ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id WHERE c.segmnt = 'a'",
     "did you mean 'segment'?"),
    ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id WHERE segmnt = 'a'",
     "did you mean 'segment'?"),
])
def test_a_mistyped_name_is_refused_with_the_registered_name(shop_refusing, sql, suggestion):
    assert suggestion in _refused(shop_refusing, sql, errors.QueryError, "unknown|not registered")


def test_no_suggestion_for_a_name_close_to_nothing(shop_refusing):
    msg = _refused(shop_refusing, "SELECT COUNT(*) FROM orders WHERE xyz > 1", errors.QueryError, "unknown column 'xyz'")
    assert "did you mean" not in msg
    msg = _refused(shop_refusing, "SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id WHERE qq = 1",
                   errors.QueryError, "unknown")
    assert "did you mean" not in msg and "qualify" not in msg  # qualifying cannot help a name no table has


# -- a large epsilon: the hint says to lower it, not to raise it -------------------------------------------

def test_gaussian_float_part_at_a_large_epsilon_says_lower_epsilon(shop):
    msg = _refused(shop, "SELECT COUNT(*) FROM orders", errors.ConfigError, "grows like e\\^epsilon", epsilon=30)
    assert "use a smaller epsilon" in msg and "delta=0" in msg and "larger delta or epsilon" not in msg
    msg = _refused(shop, "SELECT product_id, COUNT(*) FROM orders GROUP BY product_id", errors.ConfigError,
                   "grows like e\\^epsilon", epsilon=30)
    assert "use a smaller epsilon" in msg and "delta=0" not in msg  # the sparse histogram needs delta > 0
    # control: at an ordinary epsilon the query is answered
    assert shop.query("SELECT COUNT(*) FROM orders", epsilon=1.0, delta=1e-6).table.num_rows == 1


def test_gaussian_float_part_hint_in_cli_terms(workdir, capsys):
    code = run_cli(["--config", "examples/dpsql.toml", "query", "SELECT COUNT(*) FROM events", "--epsilon", "9.9",
                    "--delta", "1e-6"])
    assert code == 0  # control: 9.9 fits the example ledger's total and the float part
    capsys.readouterr()
    code = run_cli(["--config", "examples/dpsql.toml", "explain", "SELECT COUNT(*) FROM events", "--epsilon", "30",
                    "--delta", "1e-6"])
    err = capsys.readouterr().err
    assert code == 2 and "use a smaller --epsilon" in err and "--delta 0 (Laplace" in err, err


@pytest.mark.parametrize("eps", [20, 50, 100])
def test_join_group_by_at_a_large_epsilon_is_a_clear_refusal(shop, eps):
    sql = "SELECT c.segment, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id GROUP BY c.segment"
    with pytest.raises(errors.ConfigError, match="epsilon") as info:
        shop.explain(sql, epsilon=eps, delta=1e-6)
    assert "smaller epsilon" in str(info.value)
    _refused(shop, sql, errors.ConfigError, "epsilon", epsilon=eps)
    shop.explain(sql, epsilon=1, delta=1e-6)  # control


# -- a join with a public lookup table ---------------------------------------------------------------------

def test_lookup_join_names_the_reference_to_declare(shop):
    sql = "SELECT p.category, COUNT(*) FROM orders o JOIN products p ON o.product_id = p.product_id GROUP BY p.category"
    msg = _refused(shop, sql, errors.PolicyError, "cannot be bounded")
    assert "references={'product_id': 'products.product_id'}" in msg
    shop.register("orders", _orders(), privacy_unit="customer_id", max_groups_per_unit=50, max_rows_per_group=50,
                  references={"product_id": "products.product_id"})
    r = shop.query(sql, epsilon=1.0, delta=1e-6)  # the hint's fix works: a lookup join, one-table sparse histogram
    assert set(r.table.column("category").to_pylist()) <= {"p", "q"}
    # every key of the lookup's column, each with a noisy count: the join's per-person clipping, when asked for
    r = shop.query(sql, epsilon=1.0, delta=1e-6, options={"mechanism": "clipped_gaussian"})
    assert sorted(r.table.column("category").to_pylist()) == ["p", "q"]


# -- DATE/TIMESTAMP literal +/- INTERVAL --------------------------------------------------------------------

SHIFTS = [
    "TIMESTAMP '2024-06-01' - INTERVAL 30 DAY", "TIMESTAMP '2024-06-01 12:30:00' + INTERVAL '2 hours'",
    "DATE '2024-03-31' - INTERVAL 1 MONTH", "DATE '2023-03-31' - INTERVAL '1' MONTH", "DATE '2024-01-31' + INTERVAL 1 MONTH",
    "DATE '2024-02-29' + INTERVAL 1 YEAR", "DATE '2024-12-31' - INTERVAL 1 YEAR", "DATE '2024-05-31' + INTERVAL 1 QUARTER",
    "INTERVAL 2 WEEK + DATE '2024-12-25'", "TIMESTAMP '2024-01-01' - INTERVAL (90) MINUTE",
    "TIMESTAMP '2024-01-01' - INTERVAL '-45' SECOND", "DATE '2024-01-01' - INTERVAL 1 MONTH - INTERVAL 2 DAY",
    "DATE '9999-11-30' + INTERVAL 1 MONTH", "DATE '2024-10-31' - INTERVAL 13 MONTH", "DATE '2020-01-01' + INTERVAL 25 MONTHS",
]


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_shifted_literal_is_folded_as_duckdb_computes_it(shift):
    typed = type_predicate(sqlglot.parse_one(f"ts = {shift}", read="duckdb"), {"ts": "TIMESTAMP"}).sql(dialect="duckdb")
    assert "INTERVAL" not in typed.upper()  # folded: nothing is computed on a row
    con = duckdb.connect()
    want = con.execute(f"SELECT {shift}").fetchone()[0]
    assert con.execute(f"SELECT COUNT(*) FROM (SELECT CAST(? AS TIMESTAMP) AS ts) WHERE {typed}", [want]).fetchone()[0] == 1
    con.close()


def test_shifted_literals_in_queries(shop):
    sql = "SELECT COUNT(*) AS n FROM orders WHERE order_ts >= TIMESTAMP '2024-03-01' - INTERVAL 1 MONTH"
    want = sum(1 for t in _orders().column("order_ts").to_pylist() if t >= dt.datetime(2024, 2, 1))
    assert shop.query(sql, epsilon=1.0, delta=1e-6).table.column("n").to_pylist() == [want]
    sql = "SELECT COUNT(*) AS n FROM orders WHERE order_date BETWEEN DATE '2024-03-31' - INTERVAL 1 MONTH AND DATE '2024-03-31'"
    want = sum(1 for d in _orders().column("order_date").to_pylist() if dt.date(2024, 2, 29) <= d <= dt.date(2024, 3, 31))
    assert shop.query(sql, epsilon=1.0, delta=1e-6).table.column("n").to_pylist() == [want]


def _shifted(v: dt.datetime, months: int, delta: dt.timedelta) -> dt.datetime | None:
    """DuckDB's shift (a month clamps the day), NULL outside years 1..9999 (the value or its shift)."""
    try:
        y, m = divmod(v.year * 12 + v.month - 1 + months, 12)
        if not 1 <= y <= 9999:
            return None
        last = (dt.date(y + (m == 11), (m + 1) % 12 + 1, 1) - dt.timedelta(days=1)).day if (y, m) != (9999, 11) else 31
        return v.replace(year=y, month=m + 1, day=min(v.day, last)) + delta
    except OverflowError:
        return None


COLUMN_SHIFTS = [("order_ts + INTERVAL 1 DAY", 0, dt.timedelta(days=1)), ("order_date - INTERVAL 1 MONTH", -1, dt.timedelta(0)),
                 ("INTERVAL 2 WEEK + order_ts", 0, dt.timedelta(weeks=2)), ("order_ts - INTERVAL '90' MINUTE", 0,
                 dt.timedelta(minutes=-90)), ("order_date + INTERVAL 1 QUARTER", 3, dt.timedelta(0)),
                 ("order_ts + INTERVAL 1 YEAR", 12, dt.timedelta(0)), ("order_date + INTERVAL '-45' SECOND", 0,
                 dt.timedelta(seconds=-45))]


@pytest.mark.parametrize("shift,months,delta", COLUMN_SHIFTS)
def test_a_shifted_column_is_computed_per_row(shift, months, delta):
    """``col +/- INTERVAL``: a TIMESTAMP per row as DuckDB computes it, compared with another column;
    NULL (the row fails) where the value or its shift leaves years 1..9999; no value raises."""
    con = duckdb.connect()
    edge = [dt.datetime(2024, 1, 31, 10), dt.datetime(2024, 2, 29), dt.datetime(1, 1, 1), dt.datetime(1, 1, 1, 0, 30),
            dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(9999, 11, 30), dt.datetime(1970, 1, 1), None]
    ts = pa.array(edge, pa.timestamp("us"))
    con.register("raw", pa.table({"order_ts": ts, "order_date": ts.cast(pa.date32()),
                                  "other": pa.array([dt.datetime(2024, 1, 1)] * len(edge), pa.timestamp("us"))}))
    # DuckDB's own extremes (which a source view reads as NULL): +-infinity, far beyond the years
    con.execute("create table t as select * from raw union all select * from (values ('infinity'::timestamp, "
                "'infinity'::date, timestamp '2024-01-01'), ('-infinity'::timestamp, '-infinity'::date, timestamp "
                "'2024-01-01'), ('290000-01-01'::timestamp, '5000000-01-01'::date, timestamp '2024-01-01'))")
    schema = {"order_ts": "TIMESTAMP", "order_date": "DATE", "other": "TIMESTAMP"}
    value = type_predicate(sqlglot.parse_one(f"({shift}) IS NULL", read="duckdb"), schema).this.this.sql(dialect="duckdb")
    got = [r[0] for r in con.execute(f"SELECT {value} FROM t").fetchall()]
    col = "order_date" if "order_date" in shift else "order_ts"
    inputs = [v if col == "order_ts" or v is None else dt.datetime(v.year, v.month, v.day) for v in edge]
    want = [None if v is None else _shifted(v, months, delta) for v in inputs] + [None, None, None]
    assert got == want
    cond = type_predicate(sqlglot.parse_one(f"{shift} > other", read="duckdb"), schema).sql(dialect="duckdb")
    assert con.execute(f"SELECT COUNT(*) FROM t WHERE {cond}").fetchone()[0] == sum(
        1 for w in want if w is not None and w > dt.datetime(2024, 1, 1))


def test_shifted_columns_in_queries(shop):
    sql = "SELECT COUNT(*) AS n FROM orders WHERE order_date + INTERVAL 1 MONTH > order_ts + INTERVAL 29 DAY"
    rows = _orders().to_pylist()
    want = sum(1 for r in rows if _shifted(dt.datetime.combine(r["order_date"], dt.time()), 1, dt.timedelta(0))
               > r["order_ts"] + dt.timedelta(days=29))
    assert 0 < want < len(rows)
    assert shop.query(sql, epsilon=1.0, delta=1e-6).table.column("n").to_pylist() == [want]


@pytest.mark.parametrize("sql,match", [
    ("SELECT COUNT(*) FROM orders WHERE order_ts > TIMESTAMP '2024-01-01' - INTERVAL '1 month 2 days'", "one unit"),
    ("SELECT COUNT(*) FROM orders WHERE order_ts > TIMESTAMP '2024-01-01' - INTERVAL '1.5' DAY", "whole number"),
    ("SELECT COUNT(*) FROM orders WHERE order_ts > DATE '0001-01-01' - INTERVAL 1 DAY", "outside years 1..9999"),
    ("SELECT COUNT(*) FROM orders WHERE order_ts > '2024-01-01' - INTERVAL 1 DAY", "only supported on a DATE or TIMESTAMP"),
    ("SELECT COUNT(*) FROM orders WHERE amount + INTERVAL 1 DAY > order_ts", "only supported on a DATE or TIMESTAMP"),
    ("SELECT COUNT(*) FROM orders WHERE order_ts + INTERVAL '1 month 2 days' > order_date", "one unit"),
    ("SELECT COUNT(*) FROM orders WHERE order_ts > INTERVAL 1 DAY", "INTERVAL is not on the allow-list"),
])
def test_other_interval_uses_stay_refused_for_free(shop_refusing, sql, match):
    _refused(shop_refusing, sql, errors.UnsupportedQueryError, match)


def test_shifted_literals_are_range_endpoints_of_a_workload():
    """query_many reads a shifted literal as the range endpoint it folds to: the same answers as the literal
    written out (zero noise), where it was refused as a non-range condition."""
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("orders", _orders(), privacy_unit="customer_id", max_groups_per_unit=50, max_rows_per_group=50,
               max_rows_per_unit=50, columns={"order_date": {"bounds": ("2024-01-01", "2024-12-31"), "bin_width": "1 day"}})
    shifted = s.query_many(["SELECT COUNT(*) FROM orders WHERE order_date >= DATE '2024-04-30' - INTERVAL 30 DAY",
                            "SELECT COUNT(*) FROM orders WHERE order_date BETWEEN DATE '2024-03-31' - INTERVAL 1 MONTH "
                            "AND DATE '2024-03-31'"], epsilon=1.0)
    written = s.query_many(["SELECT COUNT(*) FROM orders WHERE order_date >= DATE '2024-03-31'",
                            "SELECT COUNT(*) FROM orders WHERE order_date BETWEEN DATE '2024-02-29' AND DATE '2024-03-31'"],
                           epsilon=1.0)
    assert shifted.table.column("count").to_pylist() == written.table.column("count").to_pylist()
    s.close()


# -- aggregate FILTER: answered as the aggregate of a CASE (the same plan, sensitivity and cost) -----------------

@pytest.mark.parametrize("sql,case_form", [
    ("SELECT COUNT(*) FILTER (WHERE status = 'open') AS n, COUNT(*) AS total FROM orders",
     "SELECT COUNT(CASE WHEN status = 'open' THEN 1 END) AS n, COUNT(*) AS total FROM orders"),
    ("SELECT COUNT(amount) FILTER (WHERE status = 'open') AS n FROM orders",
     "SELECT COUNT(CASE WHEN status = 'open' THEN amount END) AS n FROM orders"),
    ("SELECT COUNT(amount * 2) FILTER (WHERE status = 'open') AS n FROM orders",
     "SELECT COUNT(CASE WHEN status = 'open' THEN amount * 2 END) AS n FROM orders"),
    ("SELECT SUM(amount) FILTER (WHERE status = 'open') AS s FROM orders",
     "SELECT SUM(CASE WHEN status = 'open' THEN amount END) AS s FROM orders"),
    ("SELECT status, AVG(amount) FILTER (WHERE amount > 10) AS a FROM orders GROUP BY status",
     "SELECT status, AVG(CASE WHEN amount > 10 THEN amount END) AS a FROM orders GROUP BY status"),
    ("SELECT STDDEV(amount) FILTER (WHERE amount > 10) AS sd FROM orders",
     "SELECT STDDEV(CASE WHEN amount > 10 THEN amount END) AS sd FROM orders"),
    ("SELECT SUM(LEAST(GREATEST(amount, 0), 20)) FILTER (WHERE o.status = 'open') AS s FROM orders o",
     "SELECT SUM(CASE WHEN o.status = 'open' THEN LEAST(GREATEST(amount, 0), 20) END) AS s FROM orders o"),
    ("SELECT status, COUNT(*) FILTER (WHERE amount > 10) AS n FROM orders GROUP BY status HAVING n > 1 ORDER BY n",
     "SELECT status, COUNT(CASE WHEN amount > 10 THEN 1 END) AS n FROM orders GROUP BY status HAVING n > 1 ORDER BY n"),
])
def test_filter_clause_is_the_aggregate_of_a_case(shop, sql, case_form):
    """AGG(x) FILTER (WHERE c) is AGG(CASE WHEN c THEN x END) (COUNT(*): THEN 1): the rows where c fails are
    NULL, skipped as FILTER skips them. The bounded query, the cost and so the sensitivity are the CASE
    form's, and with caps that keep every row and zero noise the answer is plain DuckDB's."""
    a, b = shop.explain(sql, epsilon=1.0, delta=1e-6), shop.explain(case_form, epsilon=1.0, delta=1e-6)
    assert a.bounded_sql == b.bounded_sql and a.cost == b.cost and a.mechanism == b.mechanism
    got, want = shop.query(sql, epsilon=1.0, delta=1e-6), shop.query(case_form, epsilon=1.0, delta=1e-6)
    assert got.to_pylist() == want.to_pylist()
    con = duckdb.connect()
    con.register("orders", _orders())
    plain = sorted(con.sql(sql).fetchall())
    released = sorted(tuple(r.values()) for r in got.to_pylist())
    assert len(plain) == len(released)
    acc = [got.accuracy.get(c, {}) for c in got.table.column_names]
    for p_row, r_row in zip(plain, released):
        for p, r, a in zip(p_row, r_row, acc):  # counts and keys exact; values within their stated interval
            assert p == r if isinstance(p, (int, str)) else abs(r - p) <= a["ci95_half_width"]


def test_filter_clause_names_the_query_as_written(shop):
    r = shop.query("SELECT COUNT(*) FILTER (WHERE status = 'open') FROM orders", epsilon=1.0, delta=1e-6)
    assert r.table.column_names == ["COUNT(*) FILTER(WHERE status = 'open')"]


@pytest.mark.parametrize("sql", [
    "SELECT MEDIAN(amount) FILTER (WHERE amount > 10) FROM orders",
    "SELECT COUNT(DISTINCT status) FILTER (WHERE amount > 10) FROM orders",
    "SELECT SUM(DISTINCT amount) FILTER (WHERE amount > 10) FROM orders",
])
def test_filter_clause_without_a_case_form_says_where(shop_refusing, sql):
    msg = _refused(shop_refusing, sql, errors.UnsupportedQueryError, "FILTER")
    assert "move the condition into WHERE" in msg and "write it as" not in msg


def test_filter_condition_is_checked_like_a_where(shop_refusing):
    assert "did you mean 'amount'" in _refused(shop_refusing, "SELECT COUNT(*) FILTER (WHERE amont > 1) FROM orders",
                                               errors.UnsupportedQueryError, "unknown column")
    _refused(shop_refusing, "SELECT COUNT(*) FILTER (WHERE status) FROM orders", errors.UnsupportedQueryError, "BOOLEAN")
    _refused(shop_refusing, "SELECT SUM(amount) FILTER (WHERE random() < 0.5) FROM orders", errors.UnsupportedQueryError, "random")


# -- a subquery is reported once, not also through its own columns and aggregates -------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM orders WHERE customer_id IN (SELECT customer_id FROM customers WHERE segment = 'a')",
    "SELECT COUNT(*) FROM orders WHERE amount > (SELECT AVG(amount) FROM orders)",
])
def test_a_subquery_in_where_is_one_problem(shop_refusing, sql):
    msg = _refused(shop_refusing, sql, errors.UnsupportedQueryError, "subqueries are not supported in WHERE")
    assert "problems" not in msg and "unknown column" not in msg and "use HAVING" not in msg, msg


# -- functions and aggregates are named as the query spells them ------------------------------------------------

@pytest.mark.parametrize("sql,named", [
    ("SELECT string_agg(status, ',') FROM orders", "aggregate STRING_AGG is not supported"),
    ("SELECT list(status) FROM orders", "aggregate LIST is not supported"),
    ("SELECT APPROX_COUNT_DISTINCT(customer_id) FROM orders", "aggregate APPROX_COUNT_DISTINCT is not supported"),
    ("SELECT status, ANY_VALUE(amount) FROM orders GROUP BY status", "aggregate ANY_VALUE is not supported"),
    ("SELECT COUNT(*) FROM orders WHERE date_diff('day', order_date, DATE '2024-12-31') < 30", "function date_diff() is not"),
    ("SELECT COUNT(*) FROM orders WHERE regexp_matches(status, '^o')", "function regexp_matches() is not"),
])
def test_refused_functions_are_named_as_written(shop_refusing, sql, named):
    msg = _refused(shop_refusing, sql, errors.UnsupportedQueryError, "not")
    assert named in msg and "problems" not in msg, msg  # one problem, named as written (no IGNORENULLS, GROUPCONCAT)


def test_explain_statement_points_to_explain(shop_refusing, workdir, capsys):
    msg = _refused(shop_refusing, "EXPLAIN SELECT COUNT(*) FROM orders", errors.UnsupportedQueryError, "EXPLAIN statements")
    assert "Session.explain" in msg
    code = run_cli(["--config", "examples/dpsql.toml", "query", "EXPLAIN SELECT COUNT(*) FROM events", "--epsilon", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "use `dpsql explain SQL --epsilon ...`" in err and "Session.explain" not in err, err
    assert "Falling back" not in err  # sqlglot's own warning is not printed above the refusal


def test_cli_tables_and_describe_for_a_first_user(tmp_path, capsys, monkeypatch):
    """``tables`` says a public table is public (no unit, no caps) and ``describe`` suggests a mistyped name."""
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(_orders().drop(["Promo Code"]), "orders.parquet")
    pq.write_table(pa.table({"product_id": pa.array(range(4), pa.int64()), "category": ["p", "q", "p", "q"]}), "products.parquet")
    flags = ["--ledger", "l.duckdb", "--table", "orders=orders.parquet", "--privacy-unit", "orders=customer_id",
             "--table", "products=products.parquet", "--public", "products"]
    assert run_cli(["init", "--ledger", "l.duckdb", "--epsilon", "1", "--delta", "1e-6"]) == 0
    capsys.readouterr()
    assert run_cli([*flags, "tables"]) == 0
    out = capsys.readouterr().out
    assert "products: public (holds no person" in out and "through references" not in out, out
    assert "orders: privacy unit customer_id" in out
    assert run_cli([*flags, "describe", "ordrs"]) == 2
    assert "did you mean 'orders'?" in capsys.readouterr().err


# -- comments are not part of the query ----------------------------------------------------------------------------

def test_comments_next_to_columns_do_not_change_the_query(shop):
    plain = shop.query("SELECT status, COUNT(*) AS n FROM orders WHERE amount > 3 GROUP BY status ORDER BY n DESC",
                       epsilon=1.0, delta=1e-6)
    commented = shop.query("-- report\nSELECT status,   -- the status\n       COUNT(*) AS n /* rows */\nFROM orders -- t\n"
                           "WHERE amount > 3 /* filter */\nGROUP BY status -- key\nORDER BY n DESC;", epsilon=1.0, delta=1e-6)
    assert commented.table.to_pylist() == plain.table.to_pylist()  # zero noise: the same release
    assert commented.table.column_names == ["status", "n"]
    # text that looks like a comment inside a string literal is kept
    r = shop.query("SELECT COUNT(*) AS n FROM orders WHERE status = '-- x /* y */'", epsilon=1.0, delta=1e-6)
    assert r.table.column("n").to_pylist() == [0]


def test_several_statements_point_to_workloads(workdir, capsys):
    code = run_cli(["--config", "examples/dpsql.toml", "query", "SELECT COUNT(*) FROM events; SELECT COUNT(*) FROM events",
                    "--epsilon", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--workload" in err and "query_many" not in err, err


def test_column_spec_hint_lists_type(shop):
    with pytest.raises(errors.ConfigError, match="allowed keys") as info:
        shop.register("o2", _orders(), privacy_unit="customer_id", columns={"amount": {"bound": (0, 1)}})
    assert "'type'" in str(info.value)


@pytest.mark.parametrize("sql,fix", [
    ("WITH big AS (SELECT status, COUNT(*) AS n FROM orders GROUP BY status) SELECT SUM(n) FROM big",
     "write the query flat"),
    ("SELECT COUNT(*) FROM (SELECT * FROM orders WHERE amount > 10 LIMIT 5) t", "write the query flat"),
])
def test_cte_and_from_subquery_are_one_problem_with_the_fix(shop_refusing, sql, fix):
    msg = _refused(shop_refusing, sql, errors.UnsupportedQueryError, "not supported")
    assert fix in msg and "not registered" not in msg and "problems" not in msg, msg


# -- GROUP BY a position over joins ----------------------------------------------------------------------------

def test_group_by_position_over_a_join(shop):
    by_name = shop.query("SELECT c.segment, COUNT(*) AS n FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
                         "GROUP BY c.segment ORDER BY c.segment", epsilon=1.0, delta=1e-6)
    by_pos = shop.query("SELECT c.segment, COUNT(*) AS n FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
                        "GROUP BY 1 ORDER BY 1", epsilon=1.0, delta=1e-6)
    assert by_pos.table.to_pylist() == by_name.table.to_pylist()
    assert by_pos.table.column("segment").to_pylist() == ["a", "b"]
    _refused(shop, "SELECT c.segment, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id GROUP BY 3",
             errors.UnsupportedQueryError, "GROUP BY 3: the select list has 2 item")
    _refused(shop, "SELECT COUNT(*), c.segment FROM orders o JOIN customers c ON o.customer_id = c.customer_id GROUP BY 1",
             errors.UnsupportedQueryError, "aggregates are not allowed in GROUP BY")


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FILTER (WHERE o.status = 'open') FROM orders o JOIN customers c ON o.customer_id = c.customer_id",
    "SELECT COUNT(*) FILTER (WHERE 1 = 0) AS n FROM orders o JOIN customers c ON o.customer_id = c.customer_id",
    "SELECT c.segment, COUNT(*) AS n FROM orders o JOIN customers c ON o.customer_id = c.customer_id GROUP BY c.segment "
    "HAVING COUNT(*) FILTER (WHERE TRUE) > 3",
    "SELECT c.segment, SUM(o.amount) FILTER (WHERE c.segment = 'a') AS s FROM orders o JOIN customers c "
    "ON o.customer_id = c.customer_id GROUP BY c.segment",
])
def test_filter_clause_over_a_join_is_one_clear_refusal(shop_refusing, sql):
    """Over joins a FILTER clause was read as its bare aggregate: refused as a column 'neither aggregated nor a
    GROUP BY key', or, with no column in its condition, as a query that 'does not type-check'."""
    msg = _refused(shop_refusing, sql, errors.UnsupportedQueryError, "FILTER clauses are not supported over joins")
    assert "problems" not in msg and "move the condition into WHERE" in msg


def test_an_aggregate_in_a_filter_condition_is_a_nested_aggregate(shop_refusing):
    msg = _refused(shop_refusing, "SELECT COUNT(*) FILTER (WHERE COUNT(*) > 3) FROM orders", errors.UnsupportedQueryError,
                   "aggregates cannot be nested")
    assert "problems" not in msg


# -- select-list aliases over joins, as on one table --------------------------------------------------------

_J = " FROM orders o JOIN customers c ON o.customer_id = c.customer_id"


@pytest.mark.parametrize("sql,written_out", [
    ("SELECT c.segment AS seg, COUNT(*) AS n, n * 2 AS n2" + _J + " GROUP BY seg",
     "SELECT c.segment AS seg, COUNT(*) AS n, COUNT(*) * 2 AS n2" + _J + " GROUP BY c.segment"),
    ("SELECT c.segment AS seg, COUNT(*) AS n" + _J + " WHERE seg <> 'a' GROUP BY seg",
     "SELECT c.segment AS seg, COUNT(*) AS n" + _J + " WHERE c.segment <> 'a' GROUP BY c.segment"),
    ("SELECT SUM(LEAST(GREATEST(o.amount, 0), 50)) AS s, COUNT(*) AS n, s / n AS mean" + _J,
     "SELECT SUM(LEAST(GREATEST(o.amount, 0), 50)) AS s, COUNT(*) AS n, SUM(LEAST(GREATEST(o.amount, 0), 50)) / "
     "COUNT(*) AS mean" + _J),
])
def test_select_aliases_over_joins_are_read_as_on_one_table(shop, sql, written_out):
    """An output naming an earlier output's alias, and a WHERE naming a select-list alias, were refused over
    joins as an 'unknown' column: they are the expression written out (the same plan and cost)."""
    a, b = shop.explain(sql, epsilon=1.0, delta=1e-6), shop.explain(written_out, epsilon=1.0, delta=1e-6)
    assert a.bounded_sql == b.bounded_sql and a.cost == b.cost
    r = shop.query(sql, epsilon=1.0, delta=1e-6)
    assert r.table.column_names == shop.query(written_out, epsilon=1.0, delta=1e-6).table.column_names


def test_an_alias_inside_an_aggregate_over_a_join_is_still_refused(shop_refusing):
    _refused(shop_refusing, "SELECT c.segment AS seg, COUNT(seg)" + _J + " GROUP BY c.segment", errors.UnsupportedQueryError, "seg")


@pytest.mark.parametrize("sql", [
    "SELECT c.segment, COUNT(*) AS n" + _J + " GROUP BY c.segment LIMIT 10%",
    "SELECT c.segment, COUNT(*) AS n" + _J + " GROUP BY c.segment ORDER BY n FETCH FIRST 50 PERCENT ROWS ONLY",
])
def test_a_percent_limit_over_a_join_is_refused(shop, sql):
    """LIMIT 10% over a join was answered as LIMIT 10 (the percent dropped)."""
    assert "problems" not in _refused(shop, sql, errors.UnsupportedQueryError, "must be a non-negative integer literal")


def test_fetch_first_over_a_join_is_a_limit(shop):
    sql = "SELECT c.segment, COUNT(*) AS n" + _J + " GROUP BY c.segment ORDER BY c.segment FETCH FIRST 1 ROWS ONLY"
    assert shop.query(sql, epsilon=1.0, delta=1e-6).table.num_rows == 1
