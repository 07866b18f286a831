"""Queries as analysts write them: DuckDB spellings of supported aggregates and date parts, GROUP BY ALL
over joins, and the refusals of aggregates that have a supported form (docs/sql.md)."""

from __future__ import annotations

import datetime
import re

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

N = 40


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.1))
    use_noise(s, zero_noise())
    users = pa.table({
        "user_id": list(range(1, N + 1)),
        "amount": [float(i % 17) for i in range(N)],
        "day": [datetime.date(2026, 1, 1) + datetime.timedelta(days=9 * i) for i in range(N)],
        "plan": [["free", "pro"][i % 2] for i in range(N)],
    })
    s.register("users", users, privacy_unit="user_id",
               columns={"amount": {"bounds": (0, 20)}, "plan": {"domain": ["free", "pro"]},
                        "day": {"bounds": ("2026-01-01", "2027-01-01"), "bin_width": "1 day"}})
    purchases = pa.table({
        "purchase_id": list(range(3 * N)),
        "user_id": [1 + i % N for i in range(3 * N)],
        "price": [float(i % 11) for i in range(3 * N)],
    })
    s.register("purchases", purchases, references={"user_id": "users.user_id"}, degree_bounds={"user_id": 3},
               columns={"price": {"bounds": (0, 10)}})
    return s


def _rows(s: dpsql.Session, sql: str, delta: float = 0.0, options: dict | None = None) -> tuple[list[str], list[tuple]]:
    t = s.query(sql, epsilon=1.0, delta=delta, options=options).table
    return t.column_names, [tuple(r.values()) for r in t.to_pylist()]


def test_group_by_all_over_a_join_groups_by_the_outputs_without_an_aggregate() -> None:
    s = _session()
    join = "FROM purchases p JOIN users u ON p.user_id = u.user_id"
    names, rows = _rows(s, f"SELECT u.plan, COUNT(*) AS n, SUM(p.price) AS r {join} GROUP BY ALL ORDER BY ALL", 1e-6)
    assert (names, rows) == _rows(s, f"SELECT u.plan, COUNT(*) AS n, SUM(p.price) AS r {join} GROUP BY 1 ORDER BY 1, 2, 3",
                                  1e-6)
    assert [r[0] for r in rows] == ["free", "pro"]


@pytest.mark.parametrize("spelled, form", [("mean", "AVG"), ("favg", "AVG"), ("fsum", "SUM"), ("sumkahan", "SUM"),
                                           ("kahan_sum", "SUM")])
def test_duckdb_spellings_of_sum_and_avg_are_those_aggregates(spelled: str, form: str) -> None:
    s = _session()
    names, rows = _rows(s, f"SELECT plan, {spelled}(amount) FROM users GROUP BY plan ORDER BY plan")
    assert names == ["plan", f"{spelled}(amount)"]  # named as written, as DuckDB names it
    assert rows == _rows(s, f"SELECT plan, {form}(amount) FROM users GROUP BY plan ORDER BY plan")[1]
    join = "FROM purchases p JOIN users u ON p.user_id = u.user_id"
    unsampled = {"q": 1.0}  # (DP-S4S samples the join tuples by a fresh salt: q = 1 keeps them all)
    assert (_rows(s, f"SELECT {spelled}(p.price) AS v {join}", options=unsampled)[1]
            == _rows(s, f"SELECT {form}(p.price) AS v {join}", options=unsampled)[1])


def test_duckdb_spellings_over_a_join_are_named_as_written() -> None:
    """Over a join as on one table, an output without an alias is named as the query writes it (mean(p.price), not
    AVG(p.price)), as DuckDB names it."""
    s = _session()
    names, _ = _rows(s, "SELECT u.plan, mean(p.price), fsum(p.price), COUNT(*) FROM purchases p JOIN users u ON "
                        "p.user_id = u.user_id GROUP BY u.plan", 1e-6)
    assert names == ["plan", "mean(p.price)", "fsum(p.price)", "COUNT(*)"]
    names, _ = _rows(s, "SELECT kahan_sum(p.price) FROM purchases p, users u WHERE p.user_id = u.user_id", 1e-6)
    assert names == ["kahan_sum(p.price)"]


@pytest.mark.parametrize("spelled, part", [("dayofmonth", "day"), ("weekday", "dayofweek"), ("weekofyear", "week"),
                                           ("isodow", "isodow"), ("yearweek", "yearweek")])
def test_duckdb_date_part_functions_are_their_date_parts(spelled: str, part: str) -> None:
    s = _session()
    days = [datetime.date(2026, 1, 1) + datetime.timedelta(days=9 * i) for i in range(N)]
    want = duckdb.connect().execute(f"SELECT COUNT(*) FROM (SELECT unnest($d) AS day) WHERE {spelled}(day) % 3 = 1",
                                    {"d": days}).fetchone()[0]
    got = _rows(s, f"SELECT COUNT(*) AS n FROM users WHERE {spelled}(day) % 3 = 1")[1]
    assert got == _rows(s, f"SELECT COUNT(*) AS n FROM users WHERE date_part('{part}', day) % 3 = 1")[1] == [(want,)]
    names, rows = _rows(s, f"SELECT {spelled}(day), COUNT(*) AS n FROM users GROUP BY 1 ORDER BY 1", 1e-4)
    assert names[0].lower() == f"{spelled}(day)"
    assert rows == _rows(s, f"SELECT date_part('{part}', day) AS k, COUNT(*) AS n FROM users GROUP BY 1 ORDER BY 1",
                         1e-4)[1]


@pytest.mark.parametrize("sql, fix", [
    ("SELECT approx_count_distinct(plan) FROM users", "COUNT(DISTINCT plan)"),
    ("SELECT count_if(amount > 3) FROM users", "COUNT(*) FILTER (WHERE amount > 3)"),
    ("SELECT COUNT(*) FROM users WHERE day + 1.5 > DATE '2026-06-01'", "d + INTERVAL 1 DAY"),
    ("SELECT COUNT(CASE WHEN p.price > 5 THEN 1 END) FROM purchases p JOIN users u ON p.user_id = u.user_id",
     "move the condition into WHERE"),
])
def test_refusals_name_the_form_that_is_answered(sql: str, fix: str) -> None:
    s = _session()
    with pytest.raises(UnsupportedQueryError) as e:
        s.query(sql, epsilon=1.0)
    assert fix in str(e.value)
    assert len(s.history()) == 0


def test_the_forms_the_refusals_name_are_answered() -> None:
    s = _session()
    for sql in ("SELECT COUNT(*) FROM users WHERE day + INTERVAL 1 DAY > DATE '2026-06-01'",
                "SELECT COUNT(*) FROM users WHERE day > DATE '2026-12-31' - INTERVAL 30 DAY",
                "SELECT COUNT(*) FROM users WHERE plan IN ('free', 'pro')",
                "SELECT COUNT(*) FROM users WHERE plan = ANY(['free', 'pro'])",  # read as the IN above
                "SELECT COUNT(*) FROM purchases p JOIN users u ON p.user_id = u.user_id WHERE p.price > 5"):
        s.explain(sql, epsilon=1.0)


def test_date_add_of_an_interval_is_the_shift() -> None:
    s = _session()
    for cond in ("date_add(day, INTERVAL 1 MONTH) > DATE '2026-06-01'", "date_add(day, INTERVAL '2 days') <= DATE '2026-03-03'"):
        shift = cond.replace("date_add(day, ", "(day + ")
        assert _rows(s, f"SELECT COUNT(*) AS n FROM users WHERE {cond}") == \
            _rows(s, f"SELECT COUNT(*) AS n FROM users WHERE {shift}")
    names, rows = _rows(s, "SELECT date_add(MAX(day), INTERVAL 1 DAY) AS next FROM users")
    assert isinstance(rows[0][0], datetime.datetime)


@pytest.mark.parametrize("call", ["date_add(day, 3)", "date_add(day, user_id)", "date_sub(day, 3)"])
def test_date_add_of_a_number_is_refused_naming_the_interval_shift(call: str) -> None:
    """DuckDB's date_add(d, n) adds n days (a DATE, where d + INTERVAL n DAY is a TIMESTAMP): refused for free, saying
    to shift by an INTERVAL."""
    s = _session()
    with pytest.raises(UnsupportedQueryError, match=r"shift by an INTERVAL: d \+ INTERVAL 3 DAY") as e:
        s.explain(f"SELECT COUNT(*) FROM users WHERE {call} > DATE '2026-06-01'", epsilon=1.0)
    quoted = re.search(r": ([^:]*) \(line 1, col 34\)", str(e.value))  # whole, not its name spliced into day + INTERVAL ..
    assert quoted is not None and (quoted.group(1) == call or quoted.group(1).startswith("day + INTERVAL"))


@pytest.mark.parametrize("call", ["reservoir_quantile(amount, 0.5)", "product(amount)", "mad(amount)", "entropy(plan)",
                                  "arbitrary(plan)"])
def test_other_duckdb_aggregates_are_refused_as_aggregates(call: str) -> None:
    """One problem, the aggregate's: not a function over released values whose column is outside an aggregate."""
    s = _session()
    with pytest.raises(UnsupportedQueryError) as e:
        s.query(f"SELECT plan, {call} AS v FROM users GROUP BY plan", epsilon=1.0)
    assert f"aggregate {call.split('(')[0].upper()} is not supported;" in str(e.value)
    assert len(e.value.violations) == 1
    for sql in (f"SELECT {call.replace('(', '(u.')} FROM purchases p JOIN users u ON p.user_id = u.user_id",
                f"SELECT COUNT(*) FROM users WHERE {call} IS NULL",
                f"WITH v AS (SELECT {call} AS v FROM users) SELECT COUNT(*) FROM v"):
        with pytest.raises(UnsupportedQueryError):
            s.query(sql, epsilon=1.0)
    assert len(s.history()) == 0


def test_min_and_max_of_distinct_values_are_min_and_max() -> None:
    from dpsql.plan.analyze import analyze
    s = _session()
    for fn in ("MIN", "MAX"):
        got, = analyze(f"SELECT plan, {fn}(DISTINCT amount) AS v FROM users GROUP BY plan", s.tables).aggregates
        want, = analyze(f"SELECT plan, {fn}(amount) AS v FROM users GROUP BY plan", s.tables).aggregates
        assert (got.kind, got.column, got.bounds, got.quantile, got.value) == (want.kind, want.column, want.bounds,
                                                                               want.quantile, want.value)
    with pytest.raises(UnsupportedQueryError, match=r"MEDIAN\(DISTINCT \.\.\.\) is not supported.*drop DISTINCT"):
        s.query("SELECT MEDIAN(DISTINCT amount) FROM users", epsilon=1.0)


def test_tables_listed_in_from_and_equated_in_where_are_an_inner_join() -> None:
    s = _session()
    on = "FROM purchases p JOIN users u ON u.user_id = p.user_id WHERE p.price > 3"
    for comma in ("FROM users u, purchases p WHERE u.user_id = p.user_id AND p.price > 3",
                  "FROM purchases p, users u WHERE p.price > 3 AND (u.user_id = p.user_id)"):
        assert _rows(s, f"SELECT u.plan, COUNT(*) AS n, SUM(p.price) AS r {comma} GROUP BY u.plan ORDER BY 1", 1e-6) == \
            _rows(s, f"SELECT u.plan, COUNT(*) AS n, SUM(p.price) AS r {on} GROUP BY u.plan ORDER BY 1", 1e-6)
    for cross in ("FROM users u, purchases p WHERE p.price > 3", "FROM users u CROSS JOIN purchases p WHERE u.user_id = p.user_id",
                  "FROM users u, purchases p WHERE u.user_id = p.user_id OR p.price > 3"):
        with pytest.raises(UnsupportedQueryError, match="cross joins|CROSS joins"):
            s.query(f"SELECT COUNT(*) {cross}", epsilon=1.0)


def test_comma_joins_find_their_equalities_inside_parenthesised_conjunctions() -> None:
    """An AND inside parentheses (as written, or as a CTE's WHERE merged into the query's puts it) is the same
    conjunction: its equalities join the tables listed with commas."""
    s = _session()
    on = "SELECT u.plan, COUNT(*) AS n FROM purchases p JOIN users u ON u.user_id = p.user_id WHERE p.price > 3 GROUP BY u.plan"
    want = _rows(s, on + " ORDER BY 1", 1e-6)
    for comma in ("SELECT u.plan, COUNT(*) AS n FROM users u, purchases p WHERE (u.user_id = p.user_id AND p.price > 3) "
                  "GROUP BY u.plan",
                  "WITH v AS (SELECT * FROM purchases WHERE price > 3) SELECT u.plan, COUNT(*) AS n FROM users u, v "
                  "WHERE v.user_id = u.user_id GROUP BY u.plan"):
        assert _rows(s, comma + " ORDER BY 1", 1e-6) == want


def test_a_table_listed_with_a_comma_and_no_equality_to_earlier_tables_is_told_how_to_join_it() -> None:
    s = _session()
    for sql in ("SELECT COUNT(*) FROM users u, purchases p WHERE user_id = p.user_id",
                "SELECT COUNT(*) FROM purchases p, users v, users u WHERE u.user_id = p.user_id"):
        with pytest.raises(UnsupportedQueryError, match=r"(?s)cross joins.*in WHERE, equate a qualified column of it with one "
                                                        r"of another listed table"):
            s.query(sql, epsilon=1.0)


def _with_items() -> dpsql.Session:
    """``_session`` with a public ``items`` table, and ``purchases`` referencing both users and items."""
    s = _session()
    s.register("items", pa.table({"purchase_id": list(range(3 * N)), "cat": [["a", "b"][i % 2] for i in range(3 * N)]}),
               privacy_unit=None, public=True)
    purchases = pa.table({"purchase_id": list(range(3 * N)), "user_id": [1 + i % N for i in range(3 * N)],
                          "price": [float(i % 11) for i in range(3 * N)]})
    s.register("purchases", purchases, references={"user_id": "users.user_id", "purchase_id": "items.purchase_id"},
               degree_bounds={"user_id": 3}, columns={"price": {"bounds": (0, 10)}})
    return s


def test_comma_joins_are_joined_in_the_order_of_their_equalities() -> None:
    """FROM users u, items i, purchases p WHERE p.user_id = u.user_id AND p.item = i.item: items is equated only with
    purchases, listed after it; it was refused as a cross join (list it after a table it is equated with). With
    commas only every join is inner, so the order is free: p joins first, then i."""
    s = _with_items()
    want = _rows(s, "SELECT u.plan, COUNT(*) AS n FROM users u JOIN purchases p ON p.user_id = u.user_id JOIN items i "
                    "ON p.purchase_id = i.purchase_id WHERE i.cat = 'a' GROUP BY u.plan ORDER BY 1", 1e-6)
    got = _rows(s, "SELECT u.plan, COUNT(*) AS n FROM users u, items i, purchases p WHERE p.user_id = u.user_id AND "
                   "p.purchase_id = i.purchase_id AND i.cat = 'a' GROUP BY u.plan ORDER BY 1", 1e-6)
    assert got == want and sum(r[1] for r in got[1]) > 0
    # commas mixed with inner JOIN ... ON: every join is inner, an ON is one more condition, the same order is found
    for mixed in ("FROM users u, items i JOIN purchases p ON p.purchase_id = i.purchase_id WHERE p.user_id = u.user_id",
                  "FROM users u, items i INNER JOIN purchases p ON p.purchase_id = i.purchase_id AND i.cat = 'a' "
                  "WHERE p.user_id = u.user_id",
                  "FROM items i JOIN purchases p ON p.purchase_id = i.purchase_id, users u WHERE u.user_id = p.user_id"):
        where = "" if "i.cat = 'a' WHERE" in mixed else " AND i.cat = 'a'"
        assert _rows(s, f"SELECT u.plan, COUNT(*) AS n {mixed}{where} GROUP BY u.plan ORDER BY 1", 1e-6) == want, mixed
    # ... also when every condition is in an ON (no WHERE)
    assert _rows(s, "SELECT u.plan, COUNT(*) AS n FROM users u, items i JOIN purchases p ON p.purchase_id = i.purchase_id "
                    "AND p.user_id = u.user_id AND i.cat = 'a' GROUP BY u.plan ORDER BY 1", 1e-6) == want
    # an unqualified column of an ON names the one table holding it among those joined since the last comma, as DuckDB
    # binds it (user_id: p's, not u's, listed before the comma)
    bound = ("SELECT u.plan, COUNT(*) AS n FROM users u, items i JOIN purchases p ON p.purchase_id = i.purchase_id AND "
             "{} < 10 WHERE p.user_id = u.user_id AND i.cat = 'a' GROUP BY u.plan ORDER BY 1")
    assert _rows(s, bound.format("user_id"), 1e-6) == _rows(s, bound.format("p.user_id"), 1e-6) != want
    # an outer join keeps its place: the comma table before it is still a cross join (refused, naming JOIN ... ON)
    with pytest.raises(UnsupportedQueryError, match="cross joins"):
        s.query("SELECT COUNT(*) FROM users u, items i LEFT JOIN purchases p ON p.purchase_id = i.purchase_id "
                "WHERE p.user_id = u.user_id", epsilon=1.0)


def test_conditions_in_the_on_of_inner_joins_filter_as_in_where() -> None:
    """JOIN c ON o.ck = c.ck AND c.seg = 'a' is the inner join filtered as in WHERE (it was refused, with "move
    other conditions into WHERE", when no table was listed with a comma, and answered when one was)."""
    s = _with_items()
    head = "SELECT u.plan, COUNT(*) AS n, SUM(p.price) AS r FROM users u JOIN purchases p ON p.user_id = u.user_id"
    for where, on in ((" JOIN items i ON p.purchase_id = i.purchase_id WHERE i.cat = 'a' AND p.price > 3",
                       " AND p.price > 3 JOIN items i ON p.purchase_id = i.purchase_id AND i.cat = 'a'"),
                      (" WHERE price > 3", " AND price > 3"),  # unqualified: the one joined table holding it
                      (" WHERE p.price < u.user_id", " AND p.price < u.user_id"),
                      (" WHERE (p.price > 3 OR u.plan = 'pro')", " AND (p.price > 3 OR u.plan = 'pro')"),
                      (" WHERE p.price = p.purchase_id", " AND p.price = p.purchase_id")):  # one table's columns
        want = _rows(s, f"{head}{where} GROUP BY u.plan ORDER BY 1", 1e-6)
        assert sum(r[1] for r in want[1]) > 0
        assert _rows(s, f"{head}{on} GROUP BY u.plan ORDER BY 1", 1e-6) == want, on
    # a subquery in an ON is refused as in WHERE, with that refusal's hint (not as a non-equi join)
    with pytest.raises(UnsupportedQueryError, match="subqueries are not supported in ON; list the values"):
        s.query("SELECT COUNT(*) FROM users u JOIN purchases p ON p.user_id = u.user_id AND u.plan IN "
                "(SELECT plan FROM users)", epsilon=1.0)
    # an equality of an expression with a column of another table is not a join condition: refused, free
    spent = s.remaining()
    with pytest.raises(UnsupportedQueryError, match="only equalities between columns"):
        s.query("SELECT COUNT(*) FROM users u JOIN purchases p ON p.user_id + 0 = u.user_id", epsilon=1.0)
    assert s.remaining() == spent


@pytest.mark.parametrize("cond,said", [
    ("u.plan IN (SELECT plan FROM users)", "subqueries are not supported in {}"),
    ("md5(u.plan) = 'x'", "{}: function md5() is not on the allow-list"),
    ("p.nope > 3", "unknown column 'nope' in 'p' (table 'purchases') ({})"),
    ("p.price > 'abc'", "{}: the comparison mixes incompatible types"),
    ("COUNT(*) > 1", "aggregates are not allowed in {}"),
    ("p.price", "{0}: {0} must be a boolean condition"),
])
def test_a_refused_condition_of_an_on_is_named_as_in_the_on(cond: str, said: str) -> None:
    """A condition of an inner join's ON (read as WHERE's) is refused naming the ON, where the query has it: the
    refusal said 'WHERE' of a condition the query never wrote in WHERE."""
    s = _with_items()
    head = "SELECT u.plan, COUNT(*) AS n FROM users u JOIN purchases p ON p.user_id = u.user_id"
    for sql, clause in ((f"{head} AND {cond} GROUP BY u.plan", "ON"), (f"{head} WHERE {cond} GROUP BY u.plan", "WHERE")):
        with pytest.raises(UnsupportedQueryError) as ei:
            s.explain(sql, epsilon=1.0)
        assert said.format(clause) in str(ei.value), (sql, str(ei.value))
        assert (clause == "WHERE") == ("WHERE" in str(ei.value)), str(ei.value)
    # a second join's ON, and an ON beside a WHERE: each condition named where it stands
    with pytest.raises(UnsupportedQueryError) as ei:
        s.explain(f"{head} JOIN items i ON p.purchase_id = i.purchase_id AND md5(i.cat) = 'a' WHERE md5(u.plan) = 'b' "
                  "GROUP BY u.plan", epsilon=1.0)
    assert "ON: function md5() is not on the allow-list of functions with a total, bounded-cost evaluation (see " \
           "docs/expressions.md): md5(i.cat)" in str(ei.value)
    assert "WHERE: function md5() is not on the allow-list of functions with a total, bounded-cost evaluation (see " \
           "docs/expressions.md): md5(u.plan)" in str(ei.value)


def test_comma_joins_equate_unqualified_columns_each_of_one_listed_table() -> None:
    """TPC-H's spelling: FROM customer, orders WHERE c_custkey = o_custkey, each column of exactly one listed
    table (as SQL binds it) is the inner join ON c.c_custkey = o.o_custkey; a column that several listed tables
    hold joins nothing (still a cross join, refused for free)."""
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.1))
    use_noise(s, zero_noise())
    s.register("customer", pa.table({"c_custkey": list(range(N)), "c_seg": [["a", "b"][i % 2] for i in range(N)],
                                     "id": list(range(N))}),
               privacy_unit="c_custkey", columns={"c_seg": {"domain": ["a", "b"]}})
    s.register("orders", pa.table({"o_orderkey": list(range(3 * N)), "o_custkey": [i % N for i in range(3 * N)],
                                   "id": list(range(3 * N))}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 3})
    want = _rows(s, "SELECT c.c_seg, COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                    "GROUP BY c.c_seg ORDER BY 1", 1e-6)
    for comma in ("SELECT c_seg, COUNT(*) AS n FROM customer, orders WHERE c_custkey = o_custkey GROUP BY c_seg",
                  "SELECT c_seg, COUNT(*) AS n FROM customer C, orders WHERE o_custkey = C.c_custkey GROUP BY c_seg"):
        assert _rows(s, comma + " ORDER BY 1", 1e-6) == want
    with pytest.raises(UnsupportedQueryError, match="cross joins"):
        s.query("SELECT COUNT(*) FROM customer, orders WHERE id = o_custkey", epsilon=1.0)
