"""Edge cases of the SQL-coverage constructs: degenerate bounds, filters on public key sets, and
messages that name the real problem (one message per problem, no crash, nothing spent)."""

from __future__ import annotations

import math
import re
from typing import Any

import pyarrow as pa
import pytest
from _sessions import fresh_and_refusing
from conftest import make_events, run_cli
from test_bounding import neighbour_outputs, plan_for, sensitivity_violations, spec_for

import dpsql
from dpsql import errors
from dpsql.rewrite.bound import Caps
from dpsql.testing import use_noise, zero_noise


def _session() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(sess, zero_noise())
    sess.register("events", make_events(), privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=1,
                  columns={"amount": {"bounds": (0, 100)}, "age": {"bounds": (0, 100)},
                           "country": {"domain": ["US", "FR", "DE", "XX"]}})
    return sess


s_fixture, s_refusing_fixture = fresh_and_refusing(_session, "s", "s_refusing")


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
def test_point_bounds_are_refused_as_such_not_as_a_noise_scale_error(s_refusing: Any, sql: str, point: str) -> None:
    # a zero-width interval once reached the noise calibration (sensitivity 0) and failed there with
    # "the noise scale ... is not finite (sigma=0.0)" and the false hint "use a larger epsilon or delta"
    msg = free(s_refusing, sql)
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
    # a key off the allow-list was also reported as an output off the post-processing allow-list
    ("SELECT repeat(url, 2) AS host, COUNT(*) FROM events GROUP BY host",
     "GROUP BY: function repeat() is not on the allow-list"),
    ("SELECT translate(url, 'a', 'b') AS u, COUNT(*) FROM events GROUP BY 1", "GROUP BY: function translate()"),
    ("SELECT md5(url) AS d, COUNT(*) FROM events GROUP BY d", "GROUP BY: function md5()"),
    ("SELECT printf('%s/%s', url, country) || '!' AS k, COUNT(*) FROM events GROUP BY k", "GROUP BY: function printf()"),
    # a window over aggregates is answered (tests/test_windows.py); one refused is named once, not also as a nested
    # aggregate or an unsupported aggregate
    ("SELECT country, COUNT(*) * 100.0 / SUM(age) OVER () AS pct FROM events GROUP BY country",
     "column 'age' is neither a GROUP BY key nor inside an aggregate"),
    ("SELECT country, MEDIAN(COUNT(*)) OVER (ORDER BY COUNT(*) DESC) AS rk FROM events GROUP BY country",
     "window function MEDIAN is not supported over the released rows"),
    ("SELECT country, COUNT(*) FROM events GROUP BY country ORDER BY NTILE(0) OVER ()", "NTILE takes a positive integer"),
    # SELECT DISTINCT is answered (as GROUP BY): its refusals said it "releases raw values"
    ("SELECT DISTINCT ON (country) country FROM events", "SELECT DISTINCT ON is not supported"),
    ("SELECT DISTINCT ON (country) country, age FROM events", "write SELECT DISTINCT country"),
    ("SELECT DISTINCT country, COUNT(*) FROM events GROUP BY country", "drop DISTINCT"),
    ("SELECT DISTINCT COUNT(*) FROM events", "SELECT DISTINCT with an aggregate or GROUP BY is not supported"),
    # one construct, one message (a row-value IN gave one per tuple; LIKE ANY one for ANY, one for the list)
    ("SELECT COUNT(*) FROM events WHERE (country, url) IN (('US', 'a'), ('FR', 'b'))", "row values"),
    ("SELECT COUNT(*) FROM events WHERE url LIKE ANY (['a%', 'b%'])", "ANY / ALL over a list"),
    ("SELECT COUNT(*) FROM events WHERE url NOT LIKE ALL (['a%', 'b%'])", "ANY / ALL over a list"),
    # LIMIT 10% (a share of the released rows in DuckDB) was answered as LIMIT 10
    ("SELECT country, COUNT(*) FROM events GROUP BY country LIMIT 10%", "LIMIT must be a non-negative integer literal"),
    ("SELECT country, COUNT(*) FROM events GROUP BY country LIMIT 50 PERCENT", "LIMIT must be a non-negative integer"),
])
def test_one_problem_one_message(s_refusing: Any, sql: str, msg: str) -> None:
    got = free(s_refusing, sql)
    assert msg in got and "problems" not in got, got


def test_having_and_order_by_over_aliases_still_work(s: Any) -> None:
    r = s.query("SELECT country, COUNT(*) AS n FROM events GROUP BY country HAVING n > -1000 ORDER BY n, country",
                epsilon=1.0, delta=1e-6)
    assert [row["country"] for row in r.table.to_pylist()] != [] and r.table.column_names == ["country", "n"]


# -- remove one person, on data built to break the claims ------------------------------------------


def _hostile_rows() -> Any:
    """One heavy person whose values are NaN, +-inf, -0.0 and 0.0, +-1e308, subnormals, NULLs and
    text that differs only by case, trailing blanks, accents or NUL, in every group; light others."""
    rows = []
    specials = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e308, -1e308, 5e-324, None, 3.0,
                3.0000000001, 99.0]
    for i, v in enumerate(specials * 3):
        rows.append((1, "abcde"[i % 5], i % 3, v, i % 60, ["a", "A", "a ", "\u00e4", None, "\x00"][i % 6]))
    for u in range(2, 9):
        for j in range(u):
            rows.append((u, "abcde"[(u + j) % 5], j % 3, float(u * 7 % 50) if j % 4 else None, (u * j) % 60, "b"))
    c = list(zip(*rows))
    return pa.table({"user_id": pa.array(c[0], pa.int64()), "g": pa.array(c[1], pa.string()),
                     "h": pa.array(c[2], pa.int64()), "amount": pa.array(c[3], pa.float64()),
                     "age": pa.array(c[4], pa.int64()), "note": pa.array(c[5], pa.string())})


HOSTILE = [
    "SELECT g, COUNT(DISTINCT amount), COUNT(DISTINCT note), VARIANCE(amount), STDDEV_POP(amount * 2 - age) "
    "FROM t GROUP BY g",
    "SELECT COUNT(DISTINCT amount), COUNT(DISTINCT note), VAR_POP(amount * amount), AVG(ABS(amount)), "
    "SUM(CAST(amount AS INTEGER)) FROM t",
    "SELECT h, COUNT(DISTINCT amount), SUM(CASE WHEN amount > 50 THEN amount END), "
    "VAR_SAMP(LEAST(GREATEST(amount / 3, -1e6), 1e6)) FROM t GROUP BY h",
    "SELECT g, h, COUNT(DISTINCT note), STDDEV(COALESCE(amount, 100)) FROM t GROUP BY g, h",
]


def test_remove_one_person_on_hostile_values_stays_within_the_claims() -> None:
    data = _hostile_rows()
    spec = spec_for("t", data, bounds={"amount": (-20.0, 100.0), "age": (0.0, 60.0)})
    checked = 0
    for caps in [Caps(1, 1), Caps(2, 1), Caps(2, 3), Caps(3, 2, 4), Caps(1, 5, 2), Caps(5, 4)]:
        for sql in HOSTILE:
            plan = plan_for(sql, spec)
            d, minus = neighbour_outputs(plan, caps, data, "salt")
            for r in d.to_pylist():  # clamping leaves nothing non-finite to noise
                assert all(math.isfinite(v) for v in r.values() if isinstance(v, float)), (sql, r)
            for u, dm in minus.items():
                assert not sensitivity_violations(plan, caps, d, dm), (sql, caps, u)
                checked += 1
    assert checked == 6 * len(HOSTILE) * 8


def test_hostile_check_catches_unbounded_contributions() -> None:
    """Negative control: without the caps, the same check sees the heavy person exceed the claims."""
    data = _hostile_rows()
    spec = spec_for("t", data, bounds={"amount": (-20.0, 100.0), "age": (0.0, 60.0)})
    for sql in HOSTILE:
        plan = plan_for(sql, spec)
        d, minus = neighbour_outputs(plan, Caps(math.inf, math.inf), data, "salt")
        assert sensitivity_violations(plan, Caps(1, 1), d, minus[1]), sql


@pytest.mark.parametrize("sql,head,fix", [
    # the fix used to be "use LIMIT 2" for TOP (2+3), "use LIMIT 5" for TOP 5 PERCENT, and TOP -1 was
    # reported as an unknown column 'TOP'
    ("SELECT TOP (2+3) country FROM events GROUP BY country", "SELECT TOP (2 ...)", "a non-negative integer literal"),
    ("SELECT TOP -1 country FROM events GROUP BY country", "SELECT TOP -1", "a non-negative integer literal"),
    ("SELECT TOP 1e3 country FROM events GROUP BY country", "SELECT TOP 1e3", "a non-negative integer literal"),
    ("SELECT TOP 5 PERCENT country FROM events GROUP BY country", "SELECT TOP 5 PERCENT", "a number of rows"),
    ("SELECT TOP (7) PERCENT country FROM events GROUP BY country", "SELECT TOP 7 PERCENT", "a number of rows"),
    ("SELECT TOP 5 WITH TIES country, COUNT(*) FROM events GROUP BY country ORDER BY 2", "SELECT TOP 5",
     "LIMIT 5 (ties are not kept)"),
    ("SELECT TOP (7) country FROM events GROUP BY country", "SELECT TOP 7", "use LIMIT 7 at the end"),
])
def test_top_variants_name_the_right_fix(s_refusing: Any, sql: str, head: str, fix: str) -> None:
    msg = free(s_refusing, sql)
    assert msg.startswith(head + " (T-SQL) is not supported") and fix in msg and "unknown column" not in msg, msg


@pytest.mark.parametrize("fn", ["VARIANCE", "STDDEV", "VAR_POP", "AVG", "SUM"])
def test_text_argument_names_the_aggregate_written(s_refusing: Any, fn: str) -> None:
    msg = free(s_refusing, f"SELECT {fn}(country) FROM events")
    assert f"'country' is VARCHAR; {fn} needs a numeric column" in msg, msg


def test_quantile_fraction_minus_zero_is_zero(s: Any) -> None:
    # -0.0 lies between 0 and 1: it was refused as if negative
    r = s.query("SELECT QUANTILE(amount, -0.0) AS q FROM events", epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == 1 and s.history().to_pylist()[-1]["status"] == "released"
    assert "got -0.5" in free(s, "SELECT QUANTILE(amount, -0.5) FROM events")
    assert "numeric literal" in free(s, "SELECT QUANTILE(amount, -'a') FROM events")


def test_cli_key_filter_and_new_refusals(workdir: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ["--config", "examples/dpsql.toml"]
    sql = "SELECT country FROM PUMS.events WHERE country IN ('FR', 'DE') GROUP BY country"
    assert run_cli([*cfg, "query", sql, "--epsilon", "1", "--format", "csv"]) == 0
    out, _ = capsys.readouterr()
    assert [line.strip('"') for line in out.splitlines()] == ["country", "DE", "FR"]
    assert run_cli([*cfg, "explain", sql, "--epsilon", "1"]) == 0
    out, _ = capsys.readouterr()
    assert "public_domain" in out and "conditions on the key columns alone filter the declared values" in out
    for bad, words in [("SELECT TOP 5 PERCENT country FROM events", "TOP 5 PERCENT"),
                       ("SELECT country FROM events GROUP BY country HAVING nosuch > 1", "unknown column 'nosuch'")]:
        assert run_cli([*cfg, "query", bad, "--epsilon", "1"]) == 2
        _, err = capsys.readouterr()
        assert words in err and "Traceback" not in err


@pytest.mark.parametrize("sql", [
    "SELECT country, getenv('HOME') || CAST(COUNT(*) AS VARCHAR) AS x FROM events GROUP BY ALL",
    "SELECT country AS c, getenv('HOME') || CAST(COUNT(*) AS VARCHAR) AS x FROM events GROUP BY c",
    "SELECT country AS c, version() || c AS x, COUNT(*) FROM events GROUP BY c",
])
def test_outputs_beside_keys_are_still_checked(s_refusing: Any, sql: str) -> None:
    """An output that is no key (it holds an aggregate, or GROUP BY does not name it) is checked against
    the allow-list over released values, whatever GROUP BY names."""
    assert "is not on the allow-list" in free(s_refusing, sql)


@pytest.mark.parametrize("sql,positions", [
    ("SELECT country, COUNT(*) AS n FROM events GROUP BY country ORDER BY ALL", "ORDER BY 1, 2"),
    ("SELECT country, COUNT(*) AS n FROM events GROUP BY ALL ORDER BY ALL DESC", "ORDER BY 1 DESC, 2 DESC"),
    ("SELECT country, url, COUNT(*) AS n FROM events GROUP BY 1, 2 ORDER BY ALL DESC LIMIT 3", "ORDER BY 1 DESC, 2 DESC, 3 DESC"),
])
def test_order_by_all_is_every_output_left_to_right(s: Any, sql: str, positions: str) -> None:
    """DuckDB's ORDER BY ALL sorts by every output, left to right; it was refused after a parser error inside
    the engine as a query that 'does not type-check'."""
    head, _, tail = sql.partition("ORDER BY ALL DESC") if "ALL DESC" in sql else sql.partition("ORDER BY ALL")
    written = head + positions + tail
    a, b = s.query(sql, epsilon=1.0, delta=1e-6), s.query(written, epsilon=1.0, delta=1e-6)
    assert a.table.column_names == b.table.column_names and a.table.num_rows == b.table.num_rows
    assert s.explain(sql, epsilon=1.0, delta=1e-6).bounded_sql == s.explain(written, epsilon=1.0, delta=1e-6).bounded_sql
    got = [tuple(r.values()) for r in a.to_pylist()]
    assert got == sorted(got, reverse="DESC" in positions)  # every output, left to right (the keys are unique)


@pytest.mark.parametrize("sql,named", [
    ("SELECT url, MEDIAN(amount) FROM events GROUP BY url", "columns={'url': {'domain': [...]}}"),
    ("SELECT country, url, MAX(age) FROM events GROUP BY country, url", "columns={'url': {'domain': [...]}}"),
    ("SELECT floor(age / 10) AS d, MEDIAN(amount) FROM events GROUP BY d", "the key FLOOR(age / 10) is an expression"),
])
def test_quantile_key_without_a_domain_is_named(s_refusing: Any, sql: str, named: str) -> None:
    """The refusal's hint said columns={'<col>': ...} whatever the key: it names the key now."""
    before, rows = s_refusing.remaining(), s_refusing.history().num_rows
    with pytest.raises(errors.PolicyError) as ei:
        s_refusing.query(sql, epsilon=1.0, delta=1e-6)
    assert s_refusing.remaining() == before and s_refusing.history().num_rows == rows
    text = str(ei.value) + " " + (ei.value.hint or "")
    assert named in text and "<col>" not in text, text


@pytest.mark.parametrize("sql", [
    "SELECT country, COUNT(*) FROM events GROUP BY country LIMIT 10%",
    "SELECT country, COUNT(*) FROM events GROUP BY country LIMIT 50 PERCENT",
    "SELECT country, COUNT(*) FROM events GROUP BY country ORDER BY 2 LIMIT 1 WITH TIES",
])
def test_limit_percent_or_with_ties_is_refused(s_refusing: Any, sql: str) -> None:
    """LIMIT 10% (DuckDB: a tenth of the rows) was answered as if the percent sign were absent: every row of
    the four released ones came back, where DuckDB returns none; LIMIT 50 PERCENT the same."""
    msg = free(s_refusing, sql)
    assert "LIMIT must be a non-negative integer literal" in msg and "a number of rows" in msg, msg


@pytest.mark.parametrize("by", ['"all"', "[all]", '"ALL" DESC'])
def test_a_quoted_all_in_order_by_is_a_column_name(s: Any, by: str) -> None:
    """ORDER BY "all" was answered as ORDER BY ALL (the parser reads the quoted name as the keyword); DuckDB reads it
    as a column named all."""
    for sets in ("country", "GROUPING SETS ((country), ())"):
        msg = free(s, f"SELECT country, COUNT(*) AS n FROM events GROUP BY {sets} ORDER BY {by}")
        assert "unknown column 'all'" in msg.lower() or re.search(r'order by \[?"all"\]? names no output column', msg.lower()), msg
    named = s.explain(f'SELECT country, COUNT(*) AS "all" FROM events GROUP BY country ORDER BY {by}', epsilon=1.0,
                      delta=1e-6).bounded_sql
    desc = " DESC" if "DESC" in by else ""
    assert named == s.explain(f'SELECT country, COUNT(*) AS "all" FROM events GROUP BY country ORDER BY 2{desc}',
                              epsilon=1.0, delta=1e-6).bounded_sql


@pytest.mark.parametrize("by", ["n, ALL", "ALL, n", "ALL DESC, 1", "ALL, ALL"])
def test_order_by_all_beside_other_items_is_refused(s_refusing: Any, by: str) -> None:
    """ORDER BY n, ALL was answered as ORDER BY n, 1, 2; DuckDB refuses it (a syntax error)."""
    for sets in ("country", "GROUPING SETS ((country), ())"):
        msg = free(s_refusing, f"SELECT country, COUNT(*) AS n FROM events GROUP BY {sets} ORDER BY {by}", errors.SQLSyntaxError)
        assert "ORDER BY ALL" in msg and "alone" in msg, msg
