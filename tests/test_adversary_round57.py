"""One-table SQL: options of a request of several queries, and date formats.

* A request of several queries (GROUP BY ROLLUP / CUBE / GROUPING SETS, UNION ALL) passed every option to every one of
  its queries, and each refused the options it does not read. A ROLLUP with a grand total could then lower no cap:
  ``max_groups_per_unit`` was refused by the total ('use the option max_rows_per_unit instead'), and
  ``max_rows_per_unit`` by the grouped query ('use the options max_rows_per_group and max_groups_per_unit'), a loop of
  hints; ``tau`` was refused because the total is no sparse histogram. Each option now goes to the queries that read
  it; one that no query of the request reads is still refused, for free.
* ``strftime(d, '%Q')`` (or a format ending in a lone ``%``) was refused by DuckDB's binder as 'the query does not
  type-check against the table's columns ... check the types': a format specifier DuckDB does not know is now refused
  at analysis, naming it.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError, UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


def _session() -> dpsql.Session:
    # 300 people, each with one row in group 'a' and one in group 'b'
    n = 300
    t = pa.table({"uid": [i // 2 for i in range(2 * n)], "g": ["a", "b"] * n, "h": ["p", "q", "r"] * (2 * n // 3)})
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=2, columns={"g": {"domain": ["a", "b"]}})
    use_noise(s, zero_noise())
    return s


def _counts(r: dpsql.Release) -> dict[object, int]:
    return {d["g"]: d["n"] for d in r.to_pylist()}


def test_rollup_lowers_the_caps_of_each_query_that_reads_them() -> None:
    s = _session()
    sql = "SELECT g, COUNT(*) AS n FROM t GROUP BY ROLLUP (g)"
    assert _counts(s.query(sql, epsilon=1.0, delta=1e-5)) == {"a": 300, "b": 300, None: 600}  # negative control
    # max_groups_per_unit goes to the grouped query, max_rows_per_unit to the grand total
    r = s.query(sql, epsilon=1.0, delta=1e-5, options={"max_groups_per_unit": 1, "max_rows_per_unit": 1})
    c = _counts(r)
    assert c[None] == 300 and c["a"] + c["b"] == 300, c
    r = s.query(sql, epsilon=1.0, delta=1e-5, options={"max_groups_per_unit": 1})
    c = _counts(r)
    assert c[None] == 600 and c["a"] + c["b"] == 300, c


def test_union_all_passes_tau_to_its_sparse_histogram_only() -> None:
    s = _session()
    # each of p, q, r holds 200 people: a tau above suppresses them, the total is released whatever tau
    sql = "SELECT h, COUNT(*) AS n FROM t GROUP BY h UNION ALL SELECT 'all', COUNT(*) FROM t"
    assert s.query(sql, epsilon=1.0, delta=1e-5).table.num_rows == 4  # negative control
    r = s.query(sql, epsilon=1.0, delta=1e-5, options={"tau": 250})
    assert [d["h"] for d in r.to_pylist()] == ["all"]


@pytest.mark.parametrize(("sql", "options", "match"), [
    # no query of the request reads tau (public keys and a total) or max_rows_per_unit (GROUP BY queries only)
    ("SELECT g, COUNT(*) AS n FROM t GROUP BY ROLLUP (g)", {"tau": 40}, r"tau"),
    ("SELECT g, h, COUNT(*) AS n FROM t GROUP BY GROUPING SETS ((g), (h))", {"max_rows_per_unit": 1},
     r"max_rows_per_unit"),
])
def test_an_option_no_query_reads_is_refused_for_free(sql: str, options: dict[str, object], match: str) -> None:
    s = _session()
    before = s.remaining()
    with pytest.raises(ConfigError, match=match):
        s.query(sql, epsilon=1.0, delta=1e-5, options=options)
    assert s.remaining() == before and s.history().num_rows == 0


@pytest.mark.parametrize("fmt", ["%Q", "%", "%Y-%", "%-a", "%E"])
@pytest.mark.parametrize("fn", ["strftime(d, '{}')", "strptime(s, '{}') IS NOT NULL AND TRUE"])
def test_an_unknown_date_format_specifier_is_named_at_analysis(fn: str, fmt: str) -> None:
    t = pa.table({"uid": [1, 2], "d": pa.array([0, 1], pa.date32()), "s": ["2024", "x"]})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", t, privacy_unit="uid")
    expr = fn.format(fmt)
    sql = f"SELECT COUNT(*) FROM t WHERE {expr if 'strptime' in fn else expr + ' = ' + repr('x')}"
    with pytest.raises(UnsupportedQueryError, match="format specifier"):
        s.explain(sql, epsilon=1.0)


@pytest.mark.parametrize("fmt", ["%Y-%m-%d", "%-d/%-m/%y %H:%M:%S.%f", "%%Y %j %U %W %V %G %u %w %a %A %b %B %p %I %c %x %X %T"])
def test_known_date_format_specifiers_are_accepted(fmt: str) -> None:
    t = pa.table({"uid": [1, 2], "d": pa.array([0, 1], pa.date32())})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid")
    s.query(f"SELECT COUNT(*) AS n FROM t WHERE strftime(d, '{fmt}') <> ''", epsilon=1.0)


@pytest.mark.parametrize("sql", [
    "SELECT g, MEDIAN(d) AS m, strftime(m, '%Q') AS f FROM t GROUP BY g",
    "SELECT g, MEDIAN(d) AS m FROM t GROUP BY g HAVING strftime(m, '%Y%') = 'x'",
])
def test_an_unknown_format_specifier_over_released_values_is_named(sql: str) -> None:
    t = pa.table({"uid": [1, 2], "g": ["a", "b"], "d": pa.array([0, 1], pa.date32())})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", t, privacy_unit="uid", columns={"g": {"domain": ["a", "b"]},
                                                    "d": {"bounds": ["1970-01-01", "1971-01-01"], "bin_width": "1 day"}})
    with pytest.raises(UnsupportedQueryError, match="format specifier"):
        s.explain(sql, epsilon=1.0)
    assert s.history().num_rows == 0


@pytest.mark.parametrize(("queries", "named"), [
    # a disjunction of ranges is no range: it was refused as a condition the workload does not 'share', with the hint
    # 'split the workload by its other conditions', which names neither the condition nor what a range is
    (["SELECT COUNT(*) FROM t WHERE age < 10 OR age > 90", "SELECT COUNT(*) FROM t WHERE age >= 95"],
     "age < 10 OR age > 90"),
    (["SELECT COUNT(*) FROM t WHERE age >= 95", "SELECT COUNT(*) FROM t WHERE age IN (1, 2, 50)"],
     "age IN (1, 2, 50)"),
    (["SELECT COUNT(*) FROM t WHERE g = 'x' AND age >= 95", "SELECT COUNT(*) FROM t WHERE age < 3"], "g = 'x'"),
])
def test_a_workload_condition_that_is_not_a_shared_range_is_named(queries: list[str], named: str) -> None:
    n = 200
    t = pa.table({"uid": list(range(n)), "age": [i % 100 for i in range(n)], "g": ["x", "y"] * (n // 2)})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", t, privacy_unit="uid", max_rows_per_unit=1, columns={"age": {"bounds": (0, 100), "bins": 100}})
    with pytest.raises(UnsupportedQueryError, match="same non-range WHERE") as e:
        s.query_many(queries, epsilon=1.0)
    assert named in str(e.value) and "BETWEEN" in str(e.value), str(e.value)
    assert s.history().num_rows == 0


@pytest.mark.parametrize("where", ["c IS NULL", "c NOT IN ('a', NULL)", "c = 'q'", "c = 'a' AND c = 'b'",
                                   "upper(c) = 'a'"])
def test_declared_keys_that_the_where_excludes_all_are_refused_for_free(where: str) -> None:
    """The WHERE's conditions on declared keys filter the released keys; when they exclude every declared key the
    release has no row whatever the data: it was charged (epsilon 1 for an empty table), where DAWA's histogram whose
    WHERE keeps no bin, and LIMIT 0, are refused for free. (Under ROLLUP the total's row is released: the request is
    refused only where each of its queries has no row, tests/test_grouping_parts_without_keys.py.)"""
    n = 300
    t = pa.table({"uid": list(range(n)), "c": ["a", "b", None] * (n // 3), "x": list(range(n))})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", columns={"c": {"domain": ["a", "b", "c"]}})
    before = s.remaining()
    for sql in (f"SELECT c, COUNT(*) AS n FROM t WHERE {where} GROUP BY c",
                f"SELECT c, COUNT(*) AS n FROM t WHERE {where} GROUP BY GROUPING SETS ((c), (c))"):
        with pytest.raises(UnsupportedQueryError, match="excludes? every declared key"):
            s.query(sql, epsilon=1.0, delta=1e-5)
    assert s.remaining() == before and s.history().num_rows == 0
    # negative controls: a condition keeping a declared key, or reading another column, is answered
    assert s.query(f"SELECT c, COUNT(*) AS n FROM t WHERE {where} OR c = 'b' GROUP BY c", epsilon=1.0,
                   delta=1e-5).table.column("c").to_pylist() == ["b"]
    assert s.query(f"SELECT c, COUNT(*) AS n FROM t WHERE {where} OR x > 1000 GROUP BY c", epsilon=1.0,
                   delta=1e-5).table.num_rows == 3


@pytest.mark.parametrize(("expr", "bad"), [
    ("COUNT(*)::DOUBLE", "COUNT(COUNT(*)"),  # was named 'COUNT(COUNT(*) AS DOUBLE)'
    ("COUNT(*) ^ 2", "COUNT(COUNT(*)"),  # was named 'COUNT(COUNT(*), 2)'
    ("COUNT(*) ** 2", "COUNT(COUNT(*)"),
    ("SUM(x)::INTEGER", "SUM(SUM(x)"),
])
def test_an_output_whose_first_operand_is_a_call_is_not_named_after_that_call(expr: str, bad: str) -> None:
    """An unaliased output is named as written: a cast or power of an aggregate took the aggregate's name as its own
    function's, spliced onto its rendering."""
    t = pa.table({"uid": list(range(50)), "x": [1.0] * 50})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", columns={"x": {"bounds": (0, 2)}})
    name = s.query(f"SELECT {expr} FROM t", epsilon=1.0, delta=1e-5).table.column_names[0]
    assert bad not in name, name
    assert s.query("SELECT mean(x) FROM t", epsilon=1.0, delta=1e-5).table.column_names == ["mean(x)"]  # control


@pytest.mark.parametrize("expr", ["log2(COUNT(*))", "log10(COUNT(*))"])
def test_log2_and_log10_outputs_are_not_named_with_the_base_spliced_in(expr: str) -> None:
    t = pa.table({"uid": list(range(50))})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid")
    name = s.query(f"SELECT {expr} FROM t", epsilon=1.0, delta=1e-5).table.column_names[0]
    assert name.lower() not in ("log2(2, count(*))", "log10(10, count(*))"), name  # were so named


@pytest.mark.parametrize("v", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_domain_value_is_refused_as_such(v: object) -> None:
    """A NaN or infinite domain value of a DOUBLE column was refused as 'not a DOUBLE value' (it is one)."""
    t = pa.table({"uid": [1, 2], "f": [0.5, float("nan")]})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    with pytest.raises(ConfigError, match="not a finite number") as e:
        s.register("t", t, privacy_unit="uid", columns={"f": {"domain": [0.5, v]}})
    assert "not a DOUBLE value" not in str(e.value)


def test_a_having_on_declared_keys_alone_that_keeps_none_is_refused_for_free() -> None:
    n = 300
    t = pa.table({"uid": list(range(n)), "c": ["a", "b", None] * (n // 3)})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", columns={"c": {"domain": ["a", "b", "c"]}})
    before = s.remaining()
    for sql in ("SELECT c, COUNT(*) AS n FROM t WHERE c = 'a' GROUP BY c HAVING c = 'b'",
                "SELECT c, upper(c) AS u, COUNT(*) AS n FROM t GROUP BY c HAVING u = 'Q' AND n > 0"):
        with pytest.raises(UnsupportedQueryError, match="exclude every declared key"):
            s.query(sql, epsilon=1.0, delta=1e-5)
    assert s.remaining() == before and s.history().num_rows == 0
    # negative controls: a HAVING keeping a key, and one on the (noisy) counts, empty or not, are answered
    r = s.query("SELECT c, COUNT(*) AS n FROM t GROUP BY c HAVING c = 'b'", epsilon=1.0, delta=1e-5)
    assert r.table.column("c").to_pylist() == ["b"]
    r = s.query("SELECT c, COUNT(*) AS n FROM t GROUP BY c HAVING n > 1000000 OR c = 'q'", epsilon=1.0, delta=1e-5)
    assert r.table.num_rows == 0


def test_a_where_and_a_having_on_declared_keys_that_together_keep_none_are_refused() -> None:
    n = 300
    t = pa.table({"uid": list(range(n)), "c": ["a", "b", None] * (n // 3), "x": list(range(n))})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", columns={"c": {"domain": ["a", "b", "c"]}})
    with pytest.raises(UnsupportedQueryError, match="exclude every declared key"):
        s.query("SELECT c, COUNT(*) AS n FROM t WHERE c <> 'a' AND x >= 0 GROUP BY c HAVING (c = 'a' AND n >= 0)",
                epsilon=1.0, delta=1e-5)
    assert s.history().num_rows == 0


def test_integer_division_of_a_uhugeint_and_a_signed_integer_names_the_cast() -> None:
    """Both are integers: the refusal said '// takes integers; use floor(a / b)'."""
    t = pa.table({"uid": [1, 2], "x": [1, 2]})
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", t, privacy_unit="uid")
    with pytest.raises(UnsupportedQueryError, match="no integer type holds both") as e:
        s.explain("SELECT COUNT(*) FROM t WHERE CAST(x AS UHUGEINT) // CAST(x AS HUGEINT) > 0", epsilon=1.0)
    assert "takes integers" not in str(e.value)
    with pytest.raises(UnsupportedQueryError, match="takes integers"):  # control: a DOUBLE operand
        s.explain("SELECT COUNT(*) FROM t WHERE CAST(x AS DOUBLE) // 2 > 0", epsilon=1.0)


def test_an_option_value_refused_by_one_query_of_a_rollup_says_which_query_and_share() -> None:
    """sigma=3 on a ROLLUP was refused as 'too small for (epsilon=0.5, delta=4.9999999999999996e-06)', values the
    analyst never asked for (the query's share), without naming the query."""
    s = _session()
    with pytest.raises(ConfigError) as e:
        s.explain("SELECT h, COUNT(*) AS n FROM t GROUP BY ROLLUP (h)", epsilon=1.0, delta=1e-5, options={"sigma": 3.0})
    msg = str(e.value)
    assert msg.startswith("sigma=3.0 is too small"), msg  # an option's refusal keeps its form
    assert "query 1 of 2 of the GROUP BY ROLLUP" in msg and "share epsilon=0.5, delta=5e-06" in msg, msg
