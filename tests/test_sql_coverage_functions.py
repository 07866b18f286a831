"""SQL that analysts write and dpsql used to refuse: ``LIMIT ALL``, ``LIKE / ILIKE ... ESCAPE``, ``replace``,
``split_part``, ``concat_ws``, ``dayname`` / ``monthname``, ``make_date`` and ``power``.

Each is compared with plain DuckDB on the answer's shape (zero noise: WHERE counts and GROUP BY keys with
their counts), each refusal is free, and hostile values (a huge text, NULL, empty text, NUL and replacement
characters, NaN and infinities, integer extremes, invalid dates, DuckDB's infinite dates) neither make a
query fail nor change the spelling of any other key (design invariant 8)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from test_joins import make_session

import dpsql
from dpsql import errors
from dpsql.plan.typer import Typer, TypeRefusal, type_key, type_predicate
from dpsql.testing import use_noise, zero_noise

N = 600
WORDS = ["a%b", "a_b", "axb", "a!b", "A%B", "x,y,z", "x,,z", ",lead", "trail,", "", "plain", "na%me"]


def normal_rows(n: int = N) -> dict[str, list[Any]]:
    """Ordinary values: every group of the key queries below holds at least 40 people."""
    rows: dict[str, list[Any]] = {"uid": [], "s": [], "x": [], "y": [], "m": [], "dd": [], "d": [], "ts": []}
    for i in range(n):
        rows["uid"].append(i)
        rows["s"].append(WORDS[i % len(WORDS)])
        rows["x"].append(float(i % 5) - 1.5)
        rows["y"].append(2023 + i % 2)
        rows["m"].append(1 + i % 3 if i % 7 else 2)
        rows["dd"].append(28 + i % 3 if i % 5 == 0 else 1 + i % 4)
        rows["d"].append(dt.date(2024, 1, 1) + dt.timedelta(days=i % 40))
        rows["ts"].append(dt.datetime(2023, 12, 30, 6) + dt.timedelta(days=i % 9))
    return rows


#: one person each: values that break an untyped evaluation or might change a spelling
HOSTILE = [
    {"s": "x" * 5000, "x": math.nan, "y": 2**63 - 1, "m": -(2**63), "dd": 2**63 - 1, "d": dt.date(9999, 12, 31),
     "ts": dt.datetime(9999, 12, 31, 23, 59, 59)},
    {"s": None, "x": math.inf, "y": None, "m": None, "dd": None, "d": None, "ts": None},
    {"s": "", "x": -math.inf, "y": 0, "m": 0, "dd": 0, "d": dt.date(1, 1, 1), "ts": dt.datetime(1, 1, 1)},
    {"s": "\x00!\x00%", "x": 1e308, "y": 2023, "m": 2, "dd": 29, "d": dt.date(2024, 2, 29), "ts": dt.datetime(2024, 2, 29)},
    {"s": "\ufffd\u202e,\u0301ß!", "x": -0.0, "y": -5, "m": 13, "dd": 32, "d": dt.date(1582, 10, 10),
     "ts": dt.datetime(1900, 2, 28, 23)},
    {"s": ",,,,,,,,,," * 300, "x": -1e308, "y": 10000, "m": 12, "dd": 31, "d": dt.date(2000, 2, 29),
     "ts": dt.datetime(2000, 2, 29)},
]
TYPES = {"uid": pa.int64(), "s": pa.string(), "x": pa.float64(), "y": pa.int64(), "m": pa.int64(), "dd": pa.int64(),
         "d": pa.date32(), "ts": pa.timestamp("us")}
SCHEMA = {"uid": "BIGINT", "s": "VARCHAR", "x": "DOUBLE", "y": "BIGINT", "m": "BIGINT", "dd": "BIGINT", "d": "DATE",
          "ts": "TIMESTAMP"}


def table(hostile: bool = False) -> pa.Table:
    rows = normal_rows()
    if hostile:
        for k, h in enumerate(HOSTILE):
            rows["uid"].append(N + k)
            for c in TYPES:
                if c != "uid":
                    rows[c].append(h[c])
    return pa.table({c: pa.array(v, TYPES[c]) for c, v in rows.items()})


def session(t: pa.Table) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1)
    return s


@pytest.fixture(scope="module")
def plain() -> Any:
    s = session(table())
    yield s
    s.close()


@pytest.fixture(scope="module")
def hostile() -> Any:
    s = session(table(hostile=True))
    yield s
    s.close()


def duck(sql: str, t: pa.Table | None = None) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.register("t", t if t is not None else table())
    out = con.execute(sql).fetchall()
    con.close()
    return out


def count(s: dpsql.Session, where: str) -> int:
    r = s.query(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1.0, delta=1e-6)
    return int(round(r.table.column("n")[0].as_py()))


def keys(s: dpsql.Session, key: str) -> dict[Any, int]:
    r = s.query(f"SELECT {key} AS k, COUNT(*) AS n FROM t GROUP BY k", epsilon=5.0, delta=1e-3)
    return {row["k"]: int(round(row["n"])) for row in r.table.to_pylist()}


def free(s: dpsql.Session, sql: str) -> str:
    before, rows = s.remaining(), s.history().num_rows
    for run in (s.query, s.explain):
        with pytest.raises(errors.UnsupportedQueryError) as ei:
            run(sql, epsilon=1.0, delta=1e-6)
    assert s.remaining() == before and s.history().num_rows == rows
    return str(ei.value)


# -- LIMIT ALL -----------------------------------------------------------------------------------------


def test_limit_all_is_no_limit(plain: dpsql.Session) -> None:
    base = "SELECT m, COUNT(*) AS n FROM t GROUP BY m ORDER BY m"
    got = plain.query(base + " LIMIT ALL", epsilon=1.0, delta=1e-6).table.to_pylist()
    assert got == plain.query(base, epsilon=1.0, delta=1e-6).table.to_pylist()
    assert [(r["m"], round(r["n"])) for r in got] == duck("SELECT m, COUNT(*) FROM t GROUP BY m ORDER BY m LIMIT ALL")
    two = plain.query(base + " LIMIT ALL OFFSET 1", epsilon=1.0, delta=1e-6).table.to_pylist()
    assert two == got[1:]


def test_limit_all_over_a_join_is_no_limit() -> None:
    s = make_session()
    use_noise(s, zero_noise())
    sql = "SELECT COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey"
    try:
        a, b = s.explain(sql + " LIMIT ALL", epsilon=1.0, delta=1e-6), s.explain(sql, epsilon=1.0, delta=1e-6)
        assert (a.bounded_sql, a.cost, a.mechanism) == (b.bounded_sql, b.cost, b.mechanism)
        assert s.query(sql + " LIMIT ALL", epsilon=1.0, delta=1e-6).table.num_rows == 1
    finally:
        s.close()


@pytest.mark.parametrize("tail", ["LIMIT ALL PERCENT", "LIMIT 10 PERCENT", "LIMIT -1"])
def test_other_limits_stay_refused_for_free(plain: dpsql.Session, tail: str) -> None:
    assert "LIMIT must be a non-negative integer literal" in free(plain, f"SELECT m, COUNT(*) FROM t GROUP BY m {tail}")


# -- LIKE / ILIKE ... ESCAPE ----------------------------------------------------------------------------

LIKES = ["s LIKE 'a!%b' ESCAPE '!'", "s LIKE 'a!_b' ESCAPE '!'", "s NOT LIKE 'a!%%' ESCAPE '!'",
         "s ILIKE 'a#%b' ESCAPE '#'", "s NOT ILIKE '%#%%' ESCAPE '#'", "s LIKE 'a!!b' ESCAPE '!'",
         "s LIKE 'a\\_b' ESCAPE '\\'", "s LIKE '%!%%' ESCAPE '!' OR s LIKE 'x%'", "s LIKE 'na!%me' ESCAPE '!'"]


@pytest.mark.parametrize("where", LIKES)
def test_like_escape_counts_as_duckdb(plain: dpsql.Session, where: str) -> None:
    assert count(plain, where) == duck(f"SELECT COUNT(*) FROM t WHERE {where}")[0][0]


@pytest.mark.parametrize("where,words", [
    ("s LIKE 'a!' ESCAPE '!'", "ends with its escape character"),
    ("s LIKE 'a!b' ESCAPE '!'", "may precede only '%', '_' or itself"),
    ("s LIKE 'ab' ESCAPE 'xy'", "one ASCII character"),
    ("s LIKE 'ab' ESCAPE ''", "one ASCII character"),
    ("s ILIKE 'ab' ESCAPE 'a'", "other than a letter"),
    ("s LIKE 'a%' ESCAPE '%'", "other than a letter, '%' and '_'"),
    ("s LIKE 'a€%' ESCAPE '€'", "one ASCII character"),  # DuckDB takes one byte: it failed at bind
    ("s LIKE s ESCAPE '!'", "must be a string literal"),
])
def test_other_escapes_are_refused_for_free(plain: dpsql.Session, where: str, words: str) -> None:
    assert words in free(plain, f"SELECT COUNT(*) FROM t WHERE {where}")


def test_a_pattern_ending_in_its_escape_fails_in_plain_duckdb() -> None:
    """Control: DuckDB itself fails on such a pattern (Spark too): dpsql refuses it before any charge."""
    with pytest.raises(duckdb.Error, match="escape"):
        duck("SELECT COUNT(*) FROM t WHERE s LIKE 'a!' ESCAPE '!'")


# -- functions ------------------------------------------------------------------------------------------

WHERES = [
    "replace(s, '%', 'pct') = 'apctb'", "replace(s, ',', '') = 'xyz'", "length(replace(s, 'a', '')) = 2",
    "split_part(s, ',', 1) = 'x'", "split_part(s, ',', -1) = ''", "split_part(s, ',', 3) = 'z'",
    "split_part(s, ',,', 2) = 'z'", "concat_ws('-', s, 'k') = 'plain-k'", "concat_ws(',', s, NULL, s) = 'axb,axb'",
    "dayname(d) = 'Monday'", "monthname(d) = 'February'", "dayname(ts) IN ('Saturday', 'Sunday')",
    "monthname(ts) = 'December'", "make_date(y, m, 1) >= DATE '2024-01-01'",
    "make_date(2024, 2, 1) <= d", "power(x, 2) > 1", "pow(x, 0.5) > 0.2", "x ** 3 < -1", "x ^ 2 = 2.25",
    "power(2, y - 2013) > 1000",
]


@pytest.mark.parametrize("where", WHERES)
def test_function_counts_as_duckdb(plain: dpsql.Session, where: str) -> None:
    assert count(plain, where) == duck(f"SELECT COUNT(*) FROM t WHERE {where}")[0][0]


def test_make_date_of_an_invalid_date_is_null_where_duckdb_fails(plain: dpsql.Session) -> None:
    raw = "SELECT COUNT(*) FROM t WHERE make_date(y, m, dd) IS NULL"
    with pytest.raises(duckdb.Error, match="out of range"):  # control: DuckDB's make_date raises on 2023-02-29
        duck(raw)
    valid = ("dd <= CASE WHEN m = 2 THEN CASE WHEN y % 4 = 0 THEN 29 ELSE 28 END WHEN m IN (4, 6, 9, 11) THEN 30 "
             "ELSE 31 END")
    assert count(plain, "make_date(y, m, dd) IS NULL") == duck(f"SELECT COUNT(*) FROM t WHERE NOT ({valid})")[0][0] > 0
    assert count(plain, "make_date(y, m, dd) = DATE '2024-02-29'") == duck(
        "SELECT COUNT(*) FROM t WHERE y = 2024 AND m = 2 AND dd = 29")[0][0] > 0


KEYS = ["replace(s, ',', ';')", "replace(s, '%', '%%')", "split_part(s, ',', 2)", "split_part(s, '_', -1)",
        "concat_ws('|', s, CAST(m AS VARCHAR))", "dayname(d)", "monthname(ts)", "make_date(y, m, 1)",
        "power(x, 2)", "pow(2, m)"]


@pytest.mark.parametrize("key", KEYS)
def test_function_keys_as_duckdb(plain: dpsql.Session, key: str) -> None:
    want = {k: n for k, n in duck(f"SELECT {key} AS k, COUNT(*) FROM t GROUP BY k")}
    assert keys(plain, key) == want


def test_replace_that_grows_text_is_cut_at_the_string_cap(plain: dpsql.Session) -> None:
    got = Typer(SCHEMA).t(sqlglot.parse_one("replace(s, ',', ',,')", read="duckdb")).expr.sql(dialect="duckdb")
    assert got.startswith("LEFT(REPLACE(") and got.endswith(", 1024)")
    n = duck(f"SELECT max(length({got})), max(length(replace(s, ',', ',,'))) FROM t", table(hostile=True))[0]
    assert n == (1024, 6000)  # control: DuckDB's own replace doubles the 3000 commas of one value
    shrink = Typer(SCHEMA).t(sqlglot.parse_one("replace(s, ',,', ',')", read="duckdb")).expr.sql(dialect="duckdb")
    assert not shrink.startswith("LEFT(REPLACE(")  # a replacement no longer than its text cannot grow a value


@pytest.mark.parametrize("sql,words", [
    ("SELECT COUNT(*) FROM t WHERE replace(s, s, 'x') = 'x'", "must be a string literal"),
    ("SELECT COUNT(*) FROM t WHERE replace(s, 'a', s) = 'x'", "must be a string literal"),
    ("SELECT COUNT(*) FROM t WHERE split_part(s, s, 1) = 'x'", "must be a string literal"),
    ("SELECT COUNT(*) FROM t WHERE split_part(s, ',', m) = 'x'", "must be an integer literal"),
    ("SELECT COUNT(*) FROM t WHERE split_part(s, ',', 0) = 'x'", "part 0 is none"),
    ("SELECT COUNT(*) FROM t WHERE split_part(s, '', 1) = 'x'", "must have 1 to 32 characters"),
    ("SELECT COUNT(*) FROM t WHERE split_part(s, '" + "," * 33 + "', 1) = 'x'", "at most 32 characters"),
    ("SELECT COUNT(*) FROM t WHERE replace(s, '" + "a" * 33 + "', '') = 'x'", "at most 32 characters"),
    ("SELECT COUNT(*) FROM t WHERE replace(s, lower(s), 'x') = 'x'", "not a column or an expression"),
    ("SELECT COUNT(*) FROM t WHERE contains(s, s)", "must be a string literal"),
    ("SELECT COUNT(*) FROM t WHERE strpos(s, upper(s)) > 0", "must be a string literal"),
    ("SELECT COUNT(*) FROM t WHERE split_part(s, ',', 5000) = 'x'", "between -1024 and 1024"),
    ("SELECT COUNT(*) FROM t WHERE concat_ws(s, s, s) = 'x'", "must be a string literal"),
    ("SELECT COUNT(*) FROM t WHERE concat_ws('-', s, m) = 'x'", "takes text"),
    ("SELECT COUNT(*) FROM t WHERE dayname(s) = 'x'", "takes a DATE or TIMESTAMP"),
    ("SELECT COUNT(*) FROM t WHERE make_date(x, 1, 1) IS NULL", "takes integers"),
    ("SELECT COUNT(*) FROM t WHERE power(s, 2) > 1", "arithmetic needs numbers"),
])
def test_function_misuse_is_refused_for_free(plain: dpsql.Session, sql: str, words: str) -> None:
    assert words in free(plain, sql)


# -- hostile values -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_hostile_rows_neither_fail_nor_respell_keys(plain: dpsql.Session, hostile: dpsql.Session, key: str) -> None:
    """Six people with hostile values: nothing fails, and every key released without them is released with them,
    spelled alike (the hostile people add at most their own rows, and keys of their own, such as NULL or inf)."""
    without, with_ = keys(plain, key), keys(hostile, key)
    assert sorted(map(repr, without)) == sorted(repr(k) for k in with_ if k in without)
    assert all(0 <= with_[k] - n <= len(HOSTILE) for k, n in without.items())


@pytest.mark.parametrize("where", WHERES + LIKES)
def test_hostile_rows_never_fail_a_condition(hostile: dpsql.Session, where: str) -> None:
    assert count(hostile, where) >= 0


@pytest.mark.parametrize("expr", [
    "replace(s, ',', ',,')", "split_part(s, ',', -1024)", "split_part(s, ',', 1024)", "concat_ws('', s, s, s)",
    "dayname(d)", "monthname(ts)", "make_date(y, m, dd)", "make_date(dd, y, m)", "make_date(m, dd, y)",
    "power(x, x)", "power(y, m)", "power(-x, 0.5)", "s LIKE '!%!_!!' ESCAPE '!'", "s ILIKE '%\\%' ESCAPE '\\'",
])
def test_renderings_are_total_on_extremes(expr: str) -> None:
    """The typer's rendering runs on every hostile row (and DuckDB's infinite dates) without an error."""
    con = duckdb.connect()
    con.register("h", table(hostile=True))
    con.execute("CREATE TABLE t AS SELECT * FROM h UNION ALL SELECT 999, NULL, 'nan'::DOUBLE, -9223372036854775808, "
                "2, 29, 'infinity'::DATE, '-infinity'::TIMESTAMP UNION ALL SELECT 998, '', 0, 2024, 2, 30, "
                "'-infinity'::DATE, 'infinity'::TIMESTAMP")
    node = sqlglot.parse_one(expr, read="duckdb")
    if "LIKE" in expr:
        rendered = type_predicate(node, SCHEMA).sql(dialect="duckdb")
    else:
        rendered = type_key(node, SCHEMA)[0].sql(dialect="duckdb")
    assert "TRY(" not in rendered.upper()
    assert len(con.execute(f"SELECT {rendered} FROM t").fetchall()) == N + len(HOSTILE) + 2
    con.close()


def test_day_and_month_names_are_duckdbs_on_every_date() -> None:
    """dayname/monthname are rendered from date_part: the same names as DuckDB's own functions, NULL for
    +-infinity, over years 1..9999, DuckDB's far dates and the TIMESTAMP extremes."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT DATE '0001-01-01' + INTERVAL (i * 3119) DAY AS ts, "
                "CAST(DATE '0001-01-01' + INTERVAL (i * 3119) DAY AS DATE) AS d FROM range(1200) r(i) "
                "UNION ALL SELECT v::TIMESTAMP, v::DATE FROM (VALUES ('infinity'), ('-infinity')) x(v) "
                "UNION ALL SELECT NULL, DATE '5877642-06-25' UNION ALL SELECT NULL, DATE '5877642-06-25 (BC)' "
                "UNION ALL SELECT TIMESTAMP '294247-01-10 04:00:54.775806', NULL "
                "UNION ALL SELECT TIMESTAMP '290309-12-22 (BC) 00:00:00', NULL")
    schema = {"ts": "TIMESTAMP", "d": "DATE"}
    for f in ("dayname", "monthname"):
        for c in ("d", "ts"):
            ours = type_key(sqlglot.parse_one(f"{f}({c})", read="duckdb"), schema)[0].sql(dialect="duckdb")
            diff = con.execute(f"SELECT COUNT(*) FROM t WHERE ({ours}) IS DISTINCT FROM {f}({c})").fetchall()
            assert diff == [(0,)], (f, c)
    con.close()


def test_power_is_on_the_allow_list_everywhere_but_bounds_need_a_clamp(plain: dpsql.Session) -> None:
    # over released values as before
    r = plain.query("SELECT m, power(COUNT(*), 2) AS n2 FROM t GROUP BY m", epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == 3
    # a SUM of a power needs bounds: the clamp, as for any other unbounded expression
    msg = free(plain, "SELECT SUM(power(x, 2)) FROM t")
    assert "LEAST(GREATEST" in msg
    got = plain.query("SELECT SUM(LEAST(GREATEST(power(x, 2), 0), 4)) AS v FROM t", epsilon=1.0, delta=1e-6)
    assert got.table.column("v")[0].as_py() == pytest.approx(duck(
        "SELECT SUM(LEAST(GREATEST(power(x, 2), 0), 4)) FROM t")[0][0])


def test_refusals_name_the_problem_before_any_typing() -> None:
    with pytest.raises(TypeRefusal, match="part 0 is none"):
        type_key(sqlglot.parse_one("split_part(s, ',', 0)", read="duckdb"), SCHEMA)


def test_power_by_a_whole_constant_has_bounds_from_its_base() -> None:
    """SUM / AVG of power(x, k) (k a literal whole number) takes its bounds from x's: [0, 4] for x^2 with x in
    [-2, 2], as plain DuckDB's clamped sum; a power whose bounds exceed 1e15, or by another exponent, is refused."""
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5))
    use_noise(s, zero_noise())
    s.register("t", table(), privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1,
               columns={"x": {"bounds": (-2, 2)}, "y": {"bounds": (0, 3000)}})
    try:
        got = s.query("SELECT SUM(power(x, 2)) AS v, SUM(x ** 3) AS w FROM t", epsilon=1.0, delta=1e-6).table.to_pylist()[0]
        want = duck("SELECT SUM(LEAST(GREATEST(power(LEAST(GREATEST(x, -2), 2), 2), 0), 4)), "
                    "SUM(LEAST(GREATEST(power(LEAST(GREATEST(x, -2), 2), 3), -8), 8)) FROM t")[0]
        assert (got["v"], got["w"]) == pytest.approx(want)
        assert "too large" in free(s, "SELECT SUM(power(y, 5)) FROM t")
        assert "literal whole k" in free(s, "SELECT SUM(power(x, 0.5)) FROM t")
    finally:
        s.close()


@pytest.mark.parametrize("expr,refused", [
    ("s LIKE 'a\\%'", True),  # Spark's default escape is a backslash, DuckDB has none
    ("s LIKE 'a\\!%' ESCAPE '!'", False),  # with an ESCAPE, the backslash is a letter on both
    ("s LIKE 'a\\%' ESCAPE '\\'", False),
    ("power(x, 2) > 1", True),  # C's and Java's pow may differ in the last bit
    ("replace(s, 'a', 'bb') = 'x'", False), ("split_part(s, ',', -1) = ''", False),
    ("concat_ws('-', s, s) = 'x'", False), ("dayname(d) = 'Monday'", False), ("make_date(y, m, dd) > d", False),
])
def test_spark_lowering_of_the_new_forms(expr: str, refused: bool) -> None:
    """Pure (no Spark needed): what the Spark engine accepts or refuses before any charge
    (tests/test_spark_functions.py runs the accepted ones on both engines)."""
    from dpsql.engine.spark_ops import lower_for_spark
    from dpsql.rewrite.render import render

    typed = type_predicate(sqlglot.parse_one(expr, read="duckdb"), SCHEMA)
    if refused:
        with pytest.raises(errors.UnsupportedQueryError, match="not supported on the Spark engine"):
            lower_for_spark(typed)
    else:
        assert render(lower_for_spark(typed), dialect="spark")
