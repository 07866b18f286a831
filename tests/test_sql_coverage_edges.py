"""Edge cases of the SQL-coverage constructs: degenerate bounds, filters on public key sets, and
messages that name the real problem (one message per problem, no crash, nothing spent)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_events

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise


@pytest.fixture
def s() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(sess, zero_noise())
    sess.register("events", make_events(), privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=1,
                  columns={"amount": {"bounds": (0, 100)}, "age": {"bounds": (0, 100)},
                           "country": {"domain": ["US", "FR", "DE", "XX"]}})
    yield sess
    sess.close()


def free(sess: Any, sql: str, cls: type = errors.UnsupportedQueryError) -> str:
    """Refused with ``cls`` by query and explain alike; nothing spent or recorded."""
    before, rows = sess.remaining(), sess.history().num_rows
    for run in (sess.query, sess.explain):
        with pytest.raises(cls) as ei:
            run(sql, epsilon=1.0, delta=1e-6)
    assert sess.remaining() == before and sess.history().num_rows == rows
    return str(ei.value)


@pytest.mark.parametrize("sql,point", [
    ("SELECT SUM(0 * amount) FROM events", "[0, 0]"),
    ("SELECT SUM(0) FROM events", "[0, 0]"),
    ("SELECT country, SUM(-0.0 * age) FROM events GROUP BY country", "[0, 0]"),
    ("SELECT url, SUM(0 * age) FROM events GROUP BY url", "[0, 0]"),
    ("SELECT AVG(3) FROM events", "[3, 3]"),
    ("SELECT AVG(LEAST(GREATEST(amount, 5), 5)) FROM events", "[5, 5]"),
    ("SELECT VARIANCE(LEAST(GREATEST(amount, 5), 5)) FROM events", "[5, 5]"),
    ("SELECT STDDEV(amount * 0 + 2) FROM events", "[2, 2]"),
])
def test_point_bounds_are_refused_as_such_not_as_a_noise_scale_error(s: Any, sql: str, point: str) -> None:
    # a zero-width interval once reached the noise calibration (sensitivity 0) and failed there with
    # "the noise scale ... is not finite (sigma=0.0)" and the false hint "use a larger epsilon or delta"
    msg = free(s, sql)
    assert f"the bounds {point}" in msg and "single point" in msg and "lo < hi" in msg
    assert "epsilon" not in msg and "noise scale" not in msg


def test_sum_of_a_nonzero_constant_is_still_answered(s: Any) -> None:
    # SUM(2) has bounds [2, 2] and sensitivity 2 per row kept: a count in disguise, not degenerate
    r = s.query("SELECT SUM(2) FROM events", epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == 1


# -- GROUP BY with no aggregate over declared domains: the WHERE ------------------------------------


def keys_of(sess: Any, sql: str) -> list[Any]:
    before = sess.remaining()
    r = sess.query(sql, epsilon=1.0, delta=1e-6)
    assert sess.remaining() == before and sess.history().to_pylist()[-1]["mechanism"] == "public_domain"
    return [tuple(row.values()) for row in r.table.to_pylist()]


@pytest.mark.parametrize("sql,want", [
    # a condition on the key itself filters the declared values (it used to list the whole domain,
    # 'FR' included, for WHERE country = 'US')
    ("SELECT country FROM events WHERE country = 'US' GROUP BY country", [("US",)]),
    ("SELECT DISTINCT country FROM events WHERE country IN ('US', 'FR')", [("FR",), ("US",)]),
    ("SELECT e.country FROM PUMS.events e WHERE E.Country <> 'US' AND e.age > 3 GROUP BY e.country",
     [("DE",), ("FR",), ("XX",)]),
    ("SELECT country FROM events WHERE country LIKE 'U%' GROUP BY country", [("US",)]),
    # a cast that does not convert is NULL, as over private rows (never an error)
    ("SELECT country FROM events WHERE CAST(country AS INTEGER) = 1 GROUP BY country", []),
    # a condition reading another column cannot filter without reading rows: the whole domain
    ("SELECT country FROM events WHERE age > 1000 GROUP BY country", [("DE",), ("FR",), ("US",), ("XX",)]),
    ("SELECT country FROM events WHERE country = 'US' OR age > 3 GROUP BY country",
     [("DE",), ("FR",), ("US",), ("XX",)]),
])
def test_where_on_public_keys_filters_the_declared_domain(s: Any, sql: str, want: list[Any]) -> None:
    assert keys_of(s, sql) == want


def test_public_domain_with_a_key_filter_reads_no_row(s: Any) -> None:
    # same answer whatever the data: the filter runs over the declared values only
    other = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6))
    other.register("events", make_events(n_users=3, seed=99), privacy_unit="user_id",
                   columns={"country": {"domain": ["US", "FR", "DE", "XX"]}})
    sql = "SELECT country FROM events WHERE country <> 'DE' GROUP BY country"
    assert keys_of(s, sql) == keys_of(other, sql) == [("FR",), ("US",), ("XX",)]
    notes = str(s.explain(sql, epsilon=1.0, delta=1e-6))
    assert "conditions on the key columns alone filter the declared values" in notes
    other.close()


# -- one true problem, one message, before any charge -----------------------------------------------


@pytest.mark.parametrize("sql,msg", [
    # MIN(x, n) is DuckDB's n smallest values: it was answered as MIN(x), the second argument ignored
    ("SELECT MIN(age, amount) FROM events", "MIN takes one column"),
    ("SELECT MAX(age, 3) FROM events", "MAX takes one column"),
    # unknown columns in HAVING / ORDER BY were charged and released nothing (or a vague type error)
    ("SELECT country FROM events GROUP BY country HAVING nosuch > 0", "unknown column 'nosuch' in table 'events' (HAVING)"),
    ("SELECT url, COUNT(*) FROM events GROUP BY url HAVING nosuch > 0", "unknown column 'nosuch' in table 'events' (HAVING)"),
    ("SELECT country, COUNT(*) FROM events GROUP BY country HAVING COUNT(nosuch) > 1",
     "unknown column 'nosuch' in table 'events' (HAVING)"),
    ("SELECT country, COUNT(*) AS n FROM events GROUP BY country ORDER BY nosuch",
     "unknown column 'nosuch' in table 'events' (ORDER BY)"),
    ("SELECT COUNT(*) FROM events HAVING x.country = 1", "HAVING refers to unknown table or alias 'x'"),
])
def test_one_problem_one_message(s: Any, sql: str, msg: str) -> None:
    got = free(s, sql)
    assert msg in got and "problems" not in got, got


def test_having_and_order_by_over_aliases_still_work(s: Any) -> None:
    r = s.query("SELECT country, COUNT(*) AS n FROM events GROUP BY country HAVING n > -1000 ORDER BY n, country",
                epsilon=1.0, delta=1e-6)
    assert [row["country"] for row in r.table.to_pylist()] != [] and r.table.column_names == ["country", "n"]
