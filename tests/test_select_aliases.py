"""An output named by an earlier select-list alias (``COUNT(*) AS n, n / 3000.0 AS share``), as DuckDB
allows: post-processing of the released value that alias names. A table column of that name wins
(as in DuckDB), and an alias defined later in the list is not visible. With zero noise and caps
that do not bind, the answers are plain DuckDB's."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise


def people() -> pa.Table:
    n = 900
    return pa.table({"uid": list(range(n)), "g": [["a", "b", "c"][i % 3] for i in range(n)],
                     "amt": [float(i % 50) for i in range(n)], "n": [i % 4 for i in range(n)]})


@pytest.fixture
def s() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("t", people(), privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=1,
                  columns={"amt": {"bounds": (0, 50)}})
    yield sess
    sess.close()


def plain(sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.register("t", people())
    return sorted(con.sql(sql).fetchall())


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS k, k * 2 AS k2 FROM t",
    "SELECT g, COUNT(*) AS k, k / 900.0 AS share FROM t GROUP BY g",
    "SELECT g, SUM(amt) AS s, COUNT(*) AS k, s / k AS mean FROM t GROUP BY g",
    "SELECT g AS grp, COUNT(*) AS k, grp || '!' AS label FROM t GROUP BY grp",
    "SELECT g, COUNT(*) AS k, k * 2 AS k2 FROM t GROUP BY g HAVING k2 > 10 ORDER BY k2, g",
    "SELECT g, COUNT(*) AS k, k * 2 AS k2 FROM t GROUP BY ALL",  # k2 is an aggregate's: no key
    "SELECT g AS grp, grp || '!' AS label, COUNT(*) AS k FROM t GROUP BY ALL",
])
def test_an_earlier_alias_names_its_released_value(s: Any, sql: str) -> None:
    got = sorted(tuple(r.values()) for r in s.query(sql, epsilon=5.0, delta=1e-5).to_pylist())
    assert got == plain(sql)


@pytest.mark.parametrize("sql,needle", [
    ("SELECT COUNT(*) AS n, n * 2 AS n2 FROM t", "'n' outside an aggregate"),  # the column n, as in DuckDB
    ("SELECT k * 2 AS k2, COUNT(*) AS k FROM t", "unknown column 'k'"),  # defined later
])
def test_a_column_wins_and_a_later_alias_is_not_visible(s: Any, sql: str, needle: str) -> None:
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(errors.UnsupportedQueryError, match=needle):
        s.query(sql, epsilon=1.0)
    assert s.remaining() == before and s.history().num_rows == rows


@pytest.mark.parametrize("sql", [
    "SELECT g AS grp, COUNT(*) AS k FROM t WHERE grp <> 'a' GROUP BY grp",
    "SELECT lower(g) || '-' AS lg, SUM(amt) AS s FROM t WHERE lg IN ('b-', 'c-') GROUP BY lg",
    "SELECT amt * 2 > 70 AS big, COUNT(*) AS k FROM t WHERE big AND g = 'a' GROUP BY big",
    "SELECT g AS n, COUNT(*) AS k FROM t WHERE n > 1 GROUP BY g",  # the column n wins, as in DuckDB
])
def test_where_may_name_a_select_alias_as_in_duckdb(s: Any, sql: str) -> None:
    got = sorted(tuple(r.values()) for r in s.query(sql, epsilon=5.0, delta=1e-5).to_pylist())
    assert got == plain(sql)


@pytest.mark.parametrize("sql,needle", [
    ("SELECT g, COUNT(*) AS k FROM t WHERE k > 1 GROUP BY g", "aggregates are not allowed in WHERE; use HAVING"),
])
def test_where_alias_refusals_are_free(s: Any, sql: str, needle: str) -> None:
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(errors.UnsupportedQueryError, match=needle):
        s.query(sql, epsilon=1.0)
    assert s.remaining() == before and s.history().num_rows == rows


@pytest.mark.parametrize("sql", [
    "SELECT SUM(amt) AS s, SUM(s) FROM t",  # an aggregate of an aggregate
    "SELECT g, COUNT(*) AS k, COUNT(k) FROM t GROUP BY g",
    "SELECT g, COUNT(*) AS k, COUNT(DISTINCT k) FROM t GROUP BY g",
    "SELECT g, COUNT(*) AS k, QUANTILE(k, 0.5) FROM t GROUP BY g",
    "SELECT g AS a, MIN(a) FROM t GROUP BY g",  # a key's alias: DuckDB reads MIN(g)
    "SELECT g AS a, COUNT(a) FROM t GROUP BY g",
    "SELECT g, COUNT(*) AS k FROM t GROUP BY g HAVING SUM(k) > 3",
    "SELECT g AS a, COUNT(*) AS k FROM t GROUP BY g HAVING COUNT(a) > 3",
])
def test_an_alias_inside_an_aggregate_is_refused_for_free(s: Any, sql: str) -> None:
    """An aggregate's argument is read from the table's rows: an alias there (of an aggregate, or of a
    key) is no column of the table. It was skipped by the column check as a visible alias and the
    aggregate released as NULL after the charge (HAVING SUM(k) > 3 dropped every group)."""
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(errors.UnsupportedQueryError, match="alias .* inside an aggregate"):
        s.query(sql, epsilon=1.0, delta=1e-5)
    assert s.remaining() == before and s.history().num_rows == rows


@pytest.mark.parametrize("sql,written_out", [
    ("SELECT g AS a, a || 'x' AS b, COUNT(*) AS k FROM t WHERE b = 'ax' GROUP BY a",
     "SELECT g AS a, g || 'x' AS b, COUNT(*) AS k FROM t WHERE (g || 'x') = 'ax' GROUP BY g"),
    ("SELECT g AS a, a || 'x' AS b, COUNT(*) AS k FROM t GROUP BY a, b",
     "SELECT g AS a, g || 'x' AS b, COUNT(*) AS k FROM t GROUP BY g, g || 'x'"),
    ("SELECT g AS a, a || 'x' AS b, COUNT(*) AS k FROM t GROUP BY 1, 2",
     "SELECT g AS a, g || 'x' AS b, COUNT(*) AS k FROM t GROUP BY g, g || 'x'"),
    ("SELECT g AS a, a || 'x' AS b, SUM(amt) AS s FROM t WHERE b <> 'ax' GROUP BY a, b",
     "SELECT g AS a, g || 'x' AS b, SUM(amt) AS s FROM t WHERE (g || 'x') <> 'ax' GROUP BY g, g || 'x'"),
    ("SELECT upper(g) AS a, a || '-' || a AS b, COUNT(*) AS k FROM t GROUP BY b, a",
     "SELECT upper(g) AS a, upper(g) || '-' || upper(g) AS b, COUNT(*) AS k FROM t GROUP BY 2, 1"),
    ("SELECT n + 1 AS m, m * 2 AS m2, COUNT(*) AS k FROM t GROUP BY m2, m",
     "SELECT n + 1 AS m, (n + 1) * 2 AS m2, COUNT(*) AS k FROM t GROUP BY 2, 1"),
])
def test_an_alias_of_an_earlier_alias_is_read_through_it(s: Any, sql: str, written_out: str) -> None:
    """An alias whose expression names an earlier alias (a chain) in WHERE, GROUP BY and the outputs is
    the expression written out: the same keys, WHERE, bounded query and sensitivity as the written-out
    query (DuckDB refuses a chain in GROUP BY; it reads it in WHERE and the outputs)."""
    got = sorted(tuple(r.values()) for r in s.query(sql, epsilon=5.0, delta=1e-5).to_pylist())
    assert got == plain(written_out)
    a, b = s.explain(sql, epsilon=5.0, delta=1e-5), s.explain(written_out, epsilon=5.0, delta=1e-5)
    assert a.bounded_sql == b.bounded_sql and a.cost == b.cost


@pytest.mark.parametrize("sql,needle", [
    ("SELECT g AS a, a || 'x' AS b, COUNT(*) AS k FROM t GROUP BY b", "column 'g' outside an aggregate and not in GROUP BY"),
    ("SELECT g AS a, a || 'x' AS b, COUNT(*) AS k FROM t WHERE b = 'ax' GROUP BY b", "column 'g' outside an aggregate"),
    ("SELECT COUNT(*) AS k, k + 1 AS k1, g FROM t WHERE k1 > 3 GROUP BY g", "aggregates are not allowed in WHERE"),
    ("SELECT COUNT(*) AS k, k + 1 AS k1 FROM t GROUP BY k1", "aggregates are not allowed in GROUP BY"),
])
def test_alias_chain_refusals_name_the_real_problem(s: Any, sql: str, needle: str) -> None:
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(errors.UnsupportedQueryError) as ei:
        s.query(sql, epsilon=1.0, delta=1e-5)
    msg = str(ei.value)
    assert needle in msg and "unknown column" not in msg and "problems" not in msg
    assert s.remaining() == before and s.history().num_rows == rows


@pytest.mark.parametrize("sql", ['SELECT COUNT(*) AS "" FROM t',
                                 'SELECT g AS "", COUNT(*) AS n FROM t GROUP BY g',
                                 'SELECT a.g, COUNT(*) AS "" FROM t AS a JOIN t AS b ON a.uid = b.uid GROUP BY a.g'])
def test_an_empty_output_name_is_refused_naming_it(s: Any, sql: str) -> None:
    """``AS ""`` names no column (no format can carry it): refused for free, saying so, where it once failed
    in the typer as a "does not type-check" error quoting DuckDB's ParserException."""
    before = s.remaining()
    for run in (s.explain, s.query):
        with pytest.raises(errors.UnsupportedQueryError, match="an output column needs a non-empty name"):
            run(sql, epsilon=1.0, delta=1e-6)
    assert s.remaining() == before


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) AS a, COUNT(*) AS a, SUM(amt) AS a_1 FROM t",
                                 "SELECT COUNT(*) AS a, COUNT(*) AS a, SUM(x.amt) AS a_1 FROM t AS x JOIN t AS y "
                                 "ON x.uid = y.uid"])
def test_a_repeated_name_never_takes_a_name_the_query_wrote(s: Any, sql: str) -> None:
    """The second ``a`` is renamed, but not to ``a_1``, which the query gives its SUM: the column an ETL job
    reads as ``a_1`` is the one the query named so (it was the repeated COUNT, and the SUM became ``a_1_1``)."""
    r = s.query(sql, epsilon=1.0, delta=1e-6)
    assert r.table.column_names == ["a", "a_2", "a_1"]
    assert r.table["a_1"][0].as_py() > r.table["a"][0].as_py()  # the sum of amounts, not the row count


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) AS n FROM t LIMIT 0", "SELECT g, COUNT(*) AS n FROM t GROUP BY g LIMIT 0",
                                 "SELECT COUNT(*) AS n FROM t FETCH FIRST 0 ROWS ONLY",
                                 "SELECT COUNT(*) AS n FROM t AS a JOIN t AS b ON a.uid = b.uid LIMIT 0"])
def test_limit_0_is_refused_for_free(s: Any, sql: str) -> None:
    """LIMIT 0 releases no row by construction (an ETL tool's schema probe): refused before the charge, pointing
    to explain, instead of spending the budget on nothing."""
    before = s.remaining()
    with pytest.raises(errors.UnsupportedQueryError, match="LIMIT 0 releases no row"):
        s.query(sql, epsilon=1.0, delta=1e-6)
    assert s.remaining() == before


def test_an_alias_hides_the_table_name(s: Any) -> None:
    """``FROM t AS a WHERE t.amt > 1`` is refused, as DuckDB refuses it and as over a join or a view: the alias is
    the table's one name in the query (it was read as ``a.amt``)."""
    with pytest.raises(errors.UnsupportedQueryError, match="unknown table or alias 't'"):
        s.explain("SELECT COUNT(*) FROM t AS a WHERE t.amt > 1", epsilon=1.0)
    for sql in ("SELECT COUNT(*) FROM t AS a WHERE a.amt > 1", "SELECT COUNT(*) FROM t WHERE t.amt > 1"):
        assert s.explain(sql, epsilon=1.0) is not None
