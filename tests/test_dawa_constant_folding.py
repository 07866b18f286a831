"""DAWA's kept bins under constant expressions: a comparison of the binned column with constant arithmetic
(``age > 1e308 * 10``, ``age < 2 * 10``, ``CAST('inf' AS REAL)``) is read at the value the engine compares
with, so the kept bins are exact: an empty set is refused before the charge, and a non-empty one holds
exactly DuckDB's rows. A constant that dpsql cannot fold is refused for free, naming the fix."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from test_dawa_where_span import ages_session

import dpsql
from dpsql.errors import QueryError, UnsupportedQueryError
from dpsql.plan import workload
from dpsql.plan.analyze import analyze
from dpsql.testing import use_noise, zero_noise

EMPTY = ["age > 1e308*10", "age > 10*1e308", "age IN (1e308*10)", "age < -1e308*10", "age > 1e308::DOUBLE * 10",
         "age > CAST(1e400 AS DOUBLE)", "age > CAST('Infinity' AS FLOAT)", "age > CAST('inf' AS REAL)",
         "age > CAST('inf' AS DOUBLE)", "age BETWEEN 1e400 AND 1e401", "age > 2*100", "age > 100+100", "age = 7/2",
         "age = 1/0", "age > 1e400 - 1", "age > 3 AND age < 3+0", "age > CAST(300 AS INTEGER)", "age > -(-(1e308*10))",
         "age = 0.1 + 0.2", "age > CAST('3' AS DOUBLE) - NULL",
         "NOT (age <= 1e308 * 10)", "age < 0.5 - 1"]


@pytest.fixture(scope="module")
def con():
    """One plain DuckDB connection for the module's reference answers (a connection costs ~20 ms of CPU)."""
    c = duckdb.connect()
    yield c
    c.close()


def _duckdb_rows(con, t, sql: str) -> list[tuple]:
    con.register("t", t)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.unregister("t")


@pytest.fixture(scope="module")
def ages_refusals():
    """One session for the refusals: each must leave its budget whole and its history empty."""
    s, t = ages_session()
    yield s, t
    s.close()


@pytest.mark.parametrize("where", EMPTY)
def test_a_constant_that_keeps_no_bin_is_refused_for_free(ages_refusals, con, where):
    s, t = ages_refusals
    assert _duckdb_rows(con, t, f"SELECT COUNT(*) FROM t WHERE {where}") == [(0,)]  # the answer known in advance
    with pytest.raises(QueryError, match="admits no value of the declared domain of 'age'") as e:
        s.query(f"SELECT age, COUNT(*) FROM t WHERE {where} GROUP BY age", epsilon=1.0)
    assert "nothing was charged" in str(e.value) and s.remaining() == dpsql.Budget(1000.0)
    assert s.history().num_rows == 0


@pytest.mark.parametrize("where, span", [
    ("age < 2*10 OR age = 100 - 1", ((0, 19), (99, 99))),
    ("age BETWEEN 1+1 AND 2*5", ((2, 10),)),
    ("age > 0.1 + 0.2 AND age < 100.5 * 0.1", ((1, 10),)),
    ("age IN (1+1, 2*3, 7/2, 1e308*10)", ((2, 2), (6, 6))),
    ("CAST(age AS DOUBLE) < 30 - 0.5 AND age > 1e308 * -10", ((0, 29),)),
    ("age <> 7*5 AND age < 40", ((0, 34), (36, 39))),
    ("age >= CAST('12' AS INTEGER) AND age < CAST('2e1' AS DOUBLE) AND age <> 15", ((12, 14), (16, 19))),
    ("age < -(-(30)) AND age >= 14 / 2", ((7, 29),)),
    ("age > 1e308 * 10 OR age < 3 * 1", ((0, 2),)),
    ("age IN (abs(-4), -7 // 2 + 10, 17 % 5) OR age >= 240 // 2", ((2, 2), (4, 4), (7, 7), (120, 120))),
    # text just below the midpoint of 2 - 2^-23 and 2 as a REAL: DuckDB parses it to 2 - 2^-23 (one rounding), not to
    # 2.0 (rounded to a DOUBLE, the midpoint, then to even), so age 2 passes
    ("age > CAST('1.9999999403953552237420' AS REAL) AND age < 5", ((2, 4),)),
    # REAL arithmetic is 32-bit in DuckDB: 2^24 + 1 is 2^24, so the end is 116 (117 in doubles dropped age 116)
    ("age >= CAST(16777216 AS REAL) + CAST(1 AS REAL) - CAST(16777100 AS REAL) AND age < 119", ((116, 118),)),
    # an integer in text beyond Python's 4300-digit int() limit: out of range (a raw ValueError before)
    ("age < 3 OR age > TRY_CAST('" + "9" * 5000 + "' AS INTEGER)", ((0, 2),)),
    # a DECIMAL in text of more digits than the folding's precision: out of the type's range (a raw InvalidOperation)
    ("age < 3 OR age > TRY_CAST('" + "9" * 300 + ".5' AS DECIMAL(10, 1))", ((0, 2),)),
    # a DECIMAL zero has no sign (DuckDB's DECIMAL has no -0): 1 / -0.0 is +inf, not -inf, written or converted from text
    ("age < 1 / CAST('-0.0' AS DECIMAL(3,1)) AND age < 5", ((0, 4),)),
    ("age > 1 / -0.0 OR age < 3", ((0, 2),)),
])
def test_folded_constants_keep_exactly_duckdbs_bins(monkeypatch, con, where, span):
    """Zero noise against DuckDB: ten people at each age; over exactly the kept bins DAWA is exact."""
    sql = f"SELECT age, COUNT(*) AS n FROM t WHERE {where} GROUP BY age ORDER BY age"
    s, t = ages_session()
    wl = workload.histogram_workload(analyze(sql, s.tables))
    assert wl is not None and wl.span == span
    truth = [{"age": a, "n": n} for a, n in _duckdb_rows(con, t, sql)]
    assert s.query(sql, epsilon=1.0).table.to_pylist() == truth
    # negative control: without the kept bins, DAWA over the whole domain averages them with the excluded zeros
    monkeypatch.setattr(workload, "_where_span", lambda *a, **k: None)
    s, _ = ages_session()
    assert s.query(sql, epsilon=1.0).table.to_pylist() != truth


def test_a_range_workloads_folded_endpoints_are_ranges(con):
    """In query_many a folded endpoint is a range endpoint, as a literal one (not a shared condition)."""
    s, t = ages_session()
    queries = ["SELECT COUNT(*) FROM t WHERE age >= 2*10 AND age < 3*10", "SELECT COUNT(*) FROM t WHERE age < 1+4"]
    wl = workload.analyze_workload(queries, s.tables)
    assert wl.ranges == ((20, 29), (0, 4)) and wl.span is None
    r = s.query_many(queries, epsilon=1.0)
    assert list(r.counts) == [_duckdb_rows(con, t, q)[0][0] for q in queries] == [100, 50]
    with pytest.raises(QueryError, match="no range of this workload admits a value|is not a finite number"):
        s.query_many(["SELECT COUNT(*) FROM t WHERE age > 1e308*10", "SELECT COUNT(*) FROM t WHERE age < -(2*1)"],
                     epsilon=1.0)
    assert s.remaining() == dpsql.Budget(999.0)


@pytest.mark.parametrize("where", ["age > round(300.4)", "age IN (3, ceil(4.5))", "age > length('abc')"])
def test_a_constant_that_cannot_be_folded_is_refused_for_free(where):
    s, _ = ages_session()
    with pytest.raises(UnsupportedQueryError, match="write its value as a literal") as e:
        s.query(f"SELECT age, COUNT(*) FROM t WHERE {where} GROUP BY age", epsilon=1.0)
    assert "nothing was charged" in str(e.value) and s.remaining() == dpsql.Budget(1000.0)
    with pytest.raises(UnsupportedQueryError, match="write its value as a literal"):
        s.query_many([f"SELECT COUNT(*) FROM t WHERE {where} AND age >= 0"], epsilon=1.0)
    assert s.remaining() == dpsql.Budget(1000.0)
    # a quantile under the same WHERE reads no kept bins, and is answered as before
    r = s.query(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1.0)
    assert r.table.num_rows == 1


#: constants the folding refuses on purpose (read alike by Python but as NULL by DuckDB or Spark, or NaN on one engine
#: and NULL on the other)
_NOT_FOLDED = {"CAST('\uff13' AS INTEGER)", "CAST('\u00a03' AS DOUBLE)", "CAST(' \u00a0inf' AS DOUBLE)",
               "CAST('-nan' AS DOUBLE)"}


@pytest.mark.parametrize("column_type", ["BIGINT", "DOUBLE", "INTEGER", "DECIMAL(10,2)"])
@pytest.mark.parametrize("const", ["1e308*10", "-1e308*10", "2*100", "7/2", "1/0", "-1/0", "0/0", "0.1 + 0.2",
                                   "100.5 * 0.1", "CAST('inf' AS REAL)", "CAST('-Infinity' AS DOUBLE)",
                                   "CAST('nan' AS DOUBLE)", "CAST('1e400' AS DOUBLE)", "CAST(1e400 AS DOUBLE)",
                                   "CAST('12' AS INTEGER)", "9223372036854775807 + 1", "9223372036854775807 * 10",
                                   "CAST(0.1 AS REAL) * 3", "CAST('0.1' AS REAL)", "1e308 * 10 - 1e308 * 10",
                                   "3 - NULL", "-(2.5 * 2)", "1.5e300 * 1e10 / 1e300", "0.3 - 0.1 * 3",
                                   "-7 // 2", "7 % -2", "-7 % 2", "10 // 0", "abs(-300)", "abs(-2.5)", "abs(-1e308*10)",
                                   "NULLIF(3, 3)", "NULLIF(3, 4) * 2", "CAST(20.5 AS INTEGER)", "CAST(-20.5 AS INTEGER)",
                                   "CAST(20.5e0 AS INTEGER)", "CAST(21.5e0 AS INTEGER)", "CAST(-0.5e0 AS INTEGER)",
                                   "CAST(1e300 AS BIGINT)", "CAST(2.45 AS INTEGER)", "CAST(1e308 * 10 AS BIGINT)",
                                   # texts within 2^-60 of the midpoint of two REALs (one rounding, as DuckDB parses)
                                   "CAST('1.9999999403953552237420' AS REAL)", "CAST('1.9999999403953552254' AS REAL)",
                                   "CAST('-182.72579193115234374913263826' AS REAL)", "CAST(' 2.38418579101562499e-7' AS REAL)",
                                   "CAST('59.086858749389648436632638262' AS FLOAT)", "CAST('1.40129846432481707e-45' AS REAL)",
                                   "CAST('0.700649232162408535e-45' AS REAL)", "CAST('3.40282356779733661637e38' AS REAL)",
                                   "CAST('3.5e38' AS REAL)", "CAST('-3.4028235677973366163753939546e38' AS REAL)",
                                   # REAL arithmetic in 32 bits (overflow is inf, inf - inf NaN)
                                   "CAST(16777216 AS REAL) + CAST(1 AS REAL)", "CAST(0.1 AS REAL) * CAST(3 AS REAL)",
                                   "CAST(1 AS REAL) / CAST(3 AS REAL) - CAST(0.1 AS REAL)", "-CAST(0.1 AS REAL) * CAST(3 AS REAL)",
                                   "abs(CAST(0.7 AS REAL) - CAST(0.1 AS REAL)) * CAST(10 AS REAL)",
                                   "CAST(3.4e38 AS REAL) * CAST(10 AS REAL) - CAST(3.4e38 AS REAL) * CAST(10 AS REAL)",
                                   "CAST(CAST(0.1 AS REAL) * CAST(3 AS REAL) AS DOUBLE) * 3",
                                   # text Python reads as a number and DuckDB as NULL (or Spark as NULL): not folded
                                   "CAST('３' AS INTEGER)", "CAST('\u00a03' AS DOUBLE)", "CAST(' \u00a0inf' AS DOUBLE)",
                                   "CAST('-nan' AS DOUBLE)"])
def test_a_folded_constant_is_the_value_duckdb_compares_with(con, column_type, const):
    """The typed constant side of ``col = const`` evaluated by DuckDB itself equals the folded value."""
    import math

    from sqlglot import exp, parse_one

    from dpsql.plan.folding import Unfoldable, folded_comparison
    from dpsql.plan.typer import type_predicate

    subject, other = exp.column("c"), parse_one(const, dialect="duckdb")
    typed = type_predicate(exp.EQ(this=subject.copy(), expression=other.copy()), {"c": column_type})
    side = typed.expression if typed.this.find(exp.Column) else typed.this
    engine = con.execute(f"SELECT {side.sql(dialect='duckdb')}").fetchall()[0][0]
    try:
        ours = folded_comparison(subject, other, column_type)
    except Unfoldable:
        # only these are not folded (a DAWA query over them is refused for free): text the engines read unlike
        # Python or unlike each other, and a BIGINT overflow compared in DOUBLE / DECIMAL
        assert const in _NOT_FOLDED or (const.startswith("9223372036854775807")
                                        and column_type in ("DOUBLE", "DECIMAL(10,2)")), (const, column_type)
        return
    if isinstance(engine, float) and math.isnan(engine):
        assert isinstance(ours, float) and math.isnan(ours)
    else:
        assert ours == engine and (ours is None) == (engine is None)


def test_folding_follows_the_typed_comparison_not_python():
    """Negative control: 0.1 + 0.2 in Python doubles is not what DuckDB compares a DOUBLE column with."""
    from sqlglot import exp, parse_one

    from dpsql.plan.folding import folded_comparison

    engine = duckdb.connect().execute("SELECT 0.1 + 0.2").fetchall()[0][0]
    assert folded_comparison(exp.column("c"), parse_one("0.1 + 0.2"), "DOUBLE") == float(engine) == 0.3 != 0.1 + 0.2


@pytest.mark.parametrize("where", ["event_date < make_date(2024, 1, 8)", "event_date < CAST(TIMESTAMP '2024-01-08 10:00' AS DATE)",
                                   "event_date <= make_date(2024, 1, 6) + INTERVAL 1 DAY"])
def test_a_folded_date_keeps_its_days(where):
    from test_dawa_where_span import DAYS, PER_DAY, events_session

    from dpsql.testing import zero_noise

    s = events_session(zero_noise())
    r = s.query(f"SELECT event_date, COUNT(*) AS n FROM events WHERE {where} GROUP BY event_date", epsilon=1.0)
    assert r.details["dawa_bins"] == [[0, 6]] and r.table.column("n").to_pylist() == [PER_DAY] * DAYS


@pytest.mark.parametrize("where", ["event_date < date_trunc('month', DATE '2024-03-05')",
                                   "event_date < CAST('2024-03-01' AS TIMESTAMP_NS)"])
def test_a_date_constant_not_folded_restricts_nothing(where):
    """Not refused (as a number would be): a date/time constant dpsql does not fold keeps every bin, as before."""
    from test_dawa_where_span import DAYS, PER_DAY, events_session

    from dpsql.testing import zero_noise

    s = events_session(zero_noise())
    sql = f"SELECT event_date, COUNT(*) AS n FROM events WHERE {where} GROUP BY event_date"
    wl = workload.histogram_workload(analyze(sql, s.tables))
    assert wl is not None and wl.span is None
    assert sum(s.query(sql, epsilon=1.0).table.column("n").to_pylist()) == DAYS * PER_DAY


@pytest.mark.parametrize("lo, where", [
    (16777200, "big = CAST(16777216 AS REAL)"), (16777200, "big <= CAST(16777216 AS REAL) AND big > 16777210"),
    (16777200, "big < CAST(16777218 AS REAL) AND big > 16777210"), (16777200, "big IN (CAST(0.5 AS REAL) * 33554440)"),
    (16777200, "NOT big <> NULLIF(CAST(16777220 AS REAL), 1)"), (16777200, "big >= CAST(16777218 AS REAL)"),
    (16777200, "big IN (16777217, CAST(1 AS REAL))"),
    # a DOUBLE constant beyond 2^53 alike (9007199254740993 is the DOUBLE 2^53)
    (2**53 - 20, "big = 9007199254740992e0"), (2**53 - 20, "big IN (9007199254740993, 1e0)"),
    (2**53 - 20, "big <= CAST(9007199254740992 AS DOUBLE) AND big > 9007199254740980")])
def test_an_integer_compared_with_a_real_keeps_every_bin_duckdb_reads(con, lo, where):
    """A REAL (DOUBLE) constant with an integer is compared in REAL (DOUBLE), as DuckDB: beyond 2^24 (2^53) the
    column's value is rounded first (16777217 is the REAL 16777216), so the kept bins hold every value that rounds to
    a passing one. Zero noise against DuckDB, ten people per value over bins of one value each."""
    vals = np.arange(lo, lo + 40, dtype=np.int64)
    t = pa.table({"pid": np.arange(400, dtype=np.int64), "big": np.repeat(vals, 10)})
    s = dpsql.Session(budget=dpsql.Budget(1000.0))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1, columns={"big": {"bounds": (lo, lo + 39), "bins": 40}})
    sql = f"SELECT big, COUNT(*) AS n FROM t WHERE {where} GROUP BY big ORDER BY big"
    truth = [{"big": a, "n": n} for a, n in _duckdb_rows(con, t, sql)]
    # not vacuous: an odd value, rounded to the even REAL (DOUBLE) next to it, passes where the integer would not
    odd = {16777217, 16777219, 16777221, 2**53 + 1}
    assert {r["big"] for r in truth} & odd or where.startswith(("big <", "big >="))
    assert s.query(sql, epsilon=1.0).table.to_pylist() == truth
