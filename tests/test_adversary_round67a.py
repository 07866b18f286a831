"""Neighbouring datasets (without and with one person's rows), the same query: the same outcome, and a CPU time that
does not tell the person's values.

Finding (fixed): ``a % b`` of DOUBLE (or FLOAT) operands was rendered as DuckDB's own remainder, C's ``fmod``, whose
cost loops over the difference of the operands' binary exponents (about 3 ns a bit, up to 2 100 bits): 6 us a
remainder for a = 1e308 over b near 1e-300 against 30 ns for ordinary values. One person's 2 000 rows holding such a
pair made ``SELECT COUNT(*) FROM t WHERE (x + 1) % y = -1 OR ... (80 such terms)`` take 1.0 s of CPU against 0.07-0.09
s with ordinary values in their place (2 000 other people, one thread, best of 2; 200 terms: 2.6 s against 0.13-0.26
s), 1.2 ms a row, beyond the string work bound of 0.45 ms per expression; with a literal divisor (``% 0.1``) the
person's large a alone cost 0.17 s against 0.06-0.1 s. The remainder is now computed only where |a| < |b| x 2^53 (the
quotient a whole number a DOUBLE counts exactly; a loop of at most 53 bits, about 0.15 us) and is NULL beyond; a NaN
operand, an infinite a and a zero divisor keep DuckDB's NaN, an infinite divisor its dividend (80 terms after:
0.20-0.22 s against 0.10-0.20 s).

What held (checked, no change needed): DuckDB's LIKE with '_' and up to 15 '%' over one person's 1 024 'a's (no
backtracking: 400 random patterns of '%', '_', 'a', 'b' of up to 32 characters, at most 4 ms for four texts); the
conversions of text the typer renders (into integers, DECIMAL, DOUBLE, DATE, TIMESTAMP, BOOLEAN, HUGEINT: a failing
one costs 0.1-1.2 us against 30-400 ns, and each counts 770 units of string work, so they stay under its bound);
DATE into TIMESTAMP, which fails (an error message, 0.18 us) only beyond TIMESTAMP's range, where a source's DATE is
already NULL; every other numeric function of the allow-list (power, ln, sqrt, round with any digits, floor,
conversions to DOUBLE) costs the same on extreme values (within 1.6x).
"""

from __future__ import annotations

import math
import random
import time

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import sqlglot

import dpsql
from dpsql.plan.typer import FLOAT_REMAINDER_SPAN, Typer
from dpsql.testing import use_noise, zero_noise


def _rendered(sql_expr: str, schema: dict[str, str]) -> str:
    e = Typer(schema).t(sqlglot.parse_one(f"SELECT {sql_expr}", read="duckdb").expressions[0]).expr
    return e.sql(dialect="duckdb")


# -- what the remainder of two DOUBLEs computes ------------------------------------------------------------------

_PAIRS = [
    (7.5, 2.0), (-7.5, 2.0), (7.5, -2.0), (0.3, 0.1), (1e15, 3.0), (2.0**53 - 1, 1.0), (2.0**53, 1.0), (2.0**60, 3.0),
    (1e308, 1.5e-300), (1e308, 5e-324), (5e-324, 3.0), (0.0, 0.0), (5.0, 0.0), (5.0, -0.0), (math.inf, 2.0),
    (-math.inf, 2.0), (2.0, math.inf), (math.inf, math.inf), (math.nan, 2.0), (2.0, math.nan), (-0.0, 3.0),
    (1.7976931348623157e308, 1.7976931348623157e308), (1.7976931348623157e308, 19958403095347198.0), (3.0, 1e-300),
]


def _expected(a: float, b: float) -> float | None:
    """DuckDB's fmod where the quotient is below 2^53 (or an operand is NaN, a is infinite, b is 0 or infinite)."""
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or b == 0:
        return math.nan
    if math.isinf(b):
        return a
    if abs(a) >= abs(b) * FLOAT_REMAINDER_SPAN:
        return None
    return math.fmod(a, b)


@pytest.mark.parametrize("typ", ["DOUBLE", "FLOAT"])
def test_a_floating_remainder_is_duckdbs_below_2_53_quotients_and_null_beyond(typ: str) -> None:
    """Now: the remainder DuckDB computes wherever |a| < |b| x 2^53, NaN where DuckDB's is NaN, the dividend for an
    infinite divisor, and NULL where the quotient reaches 2^53 (where fmod's loop would run up to 2 100 bits)."""
    con = duckdb.connect()
    pairs = _PAIRS if typ == "DOUBLE" else [(a, b) for a, b in _PAIRS if abs(a) < 3e38 and abs(b) < 3e38 and (b == 0 or abs(b) > 1e-37 or math.isnan(b))]
    con.register("p", pa.table({"i": list(range(len(pairs))), "a": [a for a, _ in pairs], "b": [b for _, b in pairs]}))
    rendered = _rendered("a % b", {"a": typ, "b": typ})
    assert "9007199254740992.0" in rendered, rendered
    rows = con.execute(f"SELECT i, {rendered}, CAST(a AS {typ}) % CAST(b AS {typ}) FROM (SELECT i, CAST(a AS {typ}) AS a, "
                       f"CAST(b AS {typ}) AS b FROM p) ORDER BY i").fetchall()
    for (i, got, duck), (a, b) in zip(rows, pairs, strict=True):
        if typ == "FLOAT":
            a, b = float(np.float32(a)), float(np.float32(b))
        want = _expected(a, b)
        if want is None:
            assert got is None, (i, a, b, got)
        elif math.isnan(want):
            assert got is not None and math.isnan(got) and math.isnan(duck), (i, a, b, got, duck)
        else:
            assert got == duck and math.copysign(1.0, got) == math.copysign(1.0, duck), (i, a, b, got, duck)


def test_control_integer_and_decimal_remainders_are_unchanged() -> None:
    """Negative control: integer and DECIMAL remainders are exact (their own guards only: a zero divisor is NULL)."""
    assert "9007199254740992" not in _rendered("i % j", {"i": "BIGINT", "j": "BIGINT"})
    assert "9007199254740992" not in _rendered("d % e", {"d": "DECIMAL(18,2)", "e": "DECIMAL(18,2)"})


# -- neighbouring datasets -----------------------------------------------------------------------------------------

_OTHERS, _ROWS = 2000, 1500


def _table(hostile: bool) -> pa.Table:
    rng = random.Random(67)
    uid = list(range(_OTHERS)) + [10**6] * _ROWS
    x = [i + 0.5 for i in range(_OTHERS)] + [1e308 - i * 1e292 if hostile else i + 0.5 for i in range(_ROWS)]
    y = [3.0] * _OTHERS + [rng.uniform(1e-300, 2e-300) if hostile else 3.0 for _ in range(_ROWS)]
    return pa.table({"uid": pa.array(uid, pa.int64()), "x": pa.array(x), "y": pa.array(y)})


def _balanced_or(terms: list[str]) -> str:
    if len(terms) == 1:
        return terms[0]
    m = len(terms) // 2
    return f"({_balanced_or(terms[:m])} OR {_balanced_or(terms[m:])})"


_QUERY = "SELECT COUNT(*) AS n FROM t WHERE " + _balanced_or([f"(x + {k}) % y = -1" for k in range(1, 61)])


def _cpu(hostile: bool) -> tuple[float, list[dict[str, object]]]:
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5), engine={"threads": 1})
    try:
        use_noise(s, zero_noise(5))
        s.register("t", _table(hostile), privacy_unit="uid", max_rows_per_unit=1)
        best, rows = math.inf, []
        for _ in range(3):
            t0 = time.process_time()
            rows = s.query(_QUERY, epsilon=1, delta=1e-6).table.to_pylist()
            best = min(best, time.process_time() - t0)
        return best, rows
    finally:
        s.close()


def test_one_persons_extreme_remainders_do_not_slow_the_query() -> None:
    """Was: one person's 1 500 rows of 1e308 % (near 1e-300) under 60 remainders took about 10x the CPU time of the
    same rows with ordinary values (0.55 s against 0.05 s). Now: the same answer, and about the same time (the bound
    here is loose: 3x, where the unguarded remainders are 10x)."""
    (ordinary, r0), (hostile, r1) = _cpu(False), _cpu(True)
    assert r0 == r1 == [{"n": 0}]
    assert hostile < 3 * ordinary + 0.05, (hostile, ordinary)


def test_control_duckdbs_own_remainder_of_such_values_is_slow() -> None:
    """Negative control: the same remainders unguarded, in DuckDB alone, cost the person's rows many times more."""
    con = duckdb.connect()
    con.execute("SET threads = 1")
    where = " OR ".join(f"(x + {k}) % y = -1" for k in range(1, 21))

    def cpu(hostile: bool) -> float:
        con.register("t", _table(hostile))
        best = math.inf
        for _ in range(3):
            t0 = time.process_time()
            con.execute(f"SELECT COUNT(*) FROM t WHERE {where}").fetchall()
            best = min(best, time.process_time() - t0)
        return best

    ordinary, hostile = cpu(False), cpu(True)
    assert hostile > 5 * ordinary, (hostile, ordinary)


# -- the text of a UHUGEINT -----------------------------------------------------------------------------------------

_U_EDGES = [0, 1, 9, 10, 2**64 - 1, 2**64, 10**19 - 1, 10**19, 10**38 - 1, 10**38, 2**127 - 1, 2**127, 2**127 + 1,
            2**127 + 8312696284115894271, 2**127 + 8312696284115894272, 2**127 + 10**19, 3 * 10**38, 2**128 - 2, 2**128 - 1]


def test_a_uhugeints_text_is_duckdbs_text() -> None:
    """Now: ``CAST(u AS VARCHAR)`` of a UHUGEINT is rendered without DuckDB's own conversion (below 2^127 through
    HUGEINT, above split by 10^19) and spells every value as DuckDB does, NULL as NULL."""
    rng = random.Random(671)
    values = _U_EDGES + [rng.randrange(2**128) for _ in range(3000)] + [rng.randrange(2**127, 2**128) for _ in range(3000)]
    rendered = _rendered("CAST(u AS VARCHAR)", {"u": "UHUGEINT"})
    assert "LPAD" in rendered and 'TRY_CAST("u" AS TEXT)' not in rendered, rendered
    con = duckdb.connect()
    con.execute("CREATE TABLE e AS SELECT CAST(unnest(?::VARCHAR[]) AS UHUGEINT) AS u", [[str(v) for v in values]])
    con.execute("INSERT INTO e VALUES (NULL)")
    rows = con.execute(f"SELECT u, CAST(u AS VARCHAR), {rendered} FROM e").fetchall()
    assert len(rows) == len(values) + 1
    assert [r for r in rows if r[1] != r[2]] == []


def _unsigned_session(hostile: bool) -> dpsql.Session:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid BIGINT, u UHUGEINT)")
    con.execute("INSERT INTO t SELECT i, i::UHUGEINT FROM range(2000) r(i)")
    value = "340282366920938463463374607431768211455::UHUGEINT - i::UHUGEINT" if hostile else "i::UHUGEINT"
    con.execute(f"INSERT INTO t SELECT 1000000, {value} FROM range(1500) r(i)")
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5), connection=con, engine={"threads": 1})
    use_noise(s, zero_noise(5))
    s.register("t", "t", privacy_unit="uid", max_rows_per_unit=1)
    return s


_TEXT_QUERY = "SELECT COUNT(*) AS n FROM t WHERE " + _balanced_or([f"CAST(u AS VARCHAR) = 'x{k}'" for k in range(12)])


def test_one_persons_large_unsigned_values_do_not_slow_their_conversion_to_text() -> None:
    """Was: DuckDB converts a UHUGEINT to text digit by digit, each digit a division in a loop over the value's bits:
    0.7 us for a small value, 44 us near 2^128. One person's 2 000 rows near 2^128 under 40 conversions in a WHERE
    took 3.2 s of CPU against 0.17 s for small values in their place (2 000 other people); ``COUNT(DISTINCT u)``,
    which lists each value as salted text, 0.14 against 0.05 s, ``GROUP BY CAST(u AS VARCHAR)`` 0.32 against 0.08 s.
    Now: the same answers and about the same time (here 12 conversions, 1 500 rows: 10x before)."""
    times, answers = {}, {}
    for hostile in (False, True):
        s = _unsigned_session(hostile)
        try:
            best = math.inf
            for _ in range(3):
                t0 = time.process_time()
                answers[hostile] = s.query(_TEXT_QUERY, epsilon=1, delta=1e-6).table.to_pylist()
                best = min(best, time.process_time() - t0)
            times[hostile] = best
        finally:
            s.close()
    assert answers[False] == answers[True] == [{"n": 0}]
    assert times[True] < 3 * times[False] + 0.05, times


def test_count_distinct_lists_a_uhugeint_as_its_cheap_text() -> None:
    """Was: COUNT(DISTINCT u) listed each UHUGEINT as its salted text through DuckDB's own conversion (44 us near
    2^128). Now: through the same rendering as CAST(u AS VARCHAR); the counts are those of the values."""
    counts = {}
    for hostile in (False, True):
        s = _unsigned_session(hostile)
        try:
            sql = "SELECT COUNT(DISTINCT u) AS n FROM t"
            assert "LPAD" in s.explain(sql, epsilon=1, delta=1e-6).bounded_sql
            counts[hostile] = s.query(sql, epsilon=1, delta=1e-6).table.to_pylist()
        finally:
            s.close()
    assert counts == {False: [{"n": 2000}], True: [{"n": 2001}]}  # the person adds one value (one row kept)


def _unsigned_join_session(hostile: bool) -> dpsql.Session:
    """customer <- orders <- lineitem over UHUGEINT order keys; one customer holds 300 orders (keys near 2^128 or
    small ones), each with one line item."""
    con = duckdb.connect()
    con.execute("CREATE TABLE customer AS SELECT i::BIGINT AS c_custkey FROM range(201) r(i)")
    key = "(340282366920938463463374607431768211455::UHUGEINT - i::UHUGEINT)" if hostile else "(1000000 + i)::UHUGEINT"
    con.execute("CREATE TABLE orders AS SELECT i::UHUGEINT AS o_orderkey, i::BIGINT AS o_custkey FROM range(200) r(i) "
                f"UNION ALL SELECT {key}, 200::BIGINT FROM range(300) r(i)")
    con.execute("CREATE TABLE lineitem AS SELECT o_orderkey AS l_orderkey, 1.0::DOUBLE AS l_price FROM orders")
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5), connection=con)
    use_noise(s, zero_noise(5))
    s.register("customer", "customer", privacy_unit="c_custkey")
    s.register("orders", "orders", references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8})
    s.register("lineitem", "lineitem", references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 4},
               columns={"l_price": {"bounds": (0, 10)}})
    return s


def test_a_join_on_uhugeint_keys_hashes_their_cheap_text() -> None:
    """Was: a join's keyed hash of UHUGEINT keys (hashed as salted text) used DuckDB's own conversion: one customer's
    3 000 orders with keys near 2^128 made a DP-S4S count over customer, orders and lineitem 0.42-0.55 s of CPU
    against 0.29 s with small keys. Now: the join spells them through ``uhugeint_text`` (after: 0.35-0.46 against
    0.43-0.58 s, the machine loaded), with the same answers."""
    sql = ("SELECT COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
           "JOIN lineitem l ON l.l_orderkey = o.o_orderkey")
    answers = {}
    for hostile in (False, True):
        s = _unsigned_join_session(hostile)
        try:
            bounded = s.explain(sql, epsilon=1, delta=1e-6).bounded_sql
            assert "LPAD" in bounded and "UINT128" in bounded, bounded
            answers[hostile] = s.query(sql, epsilon=1, delta=1e-6).table.to_pylist()
        finally:
            s.close()
    assert answers[False] == answers[True], answers


def test_control_duckdbs_own_text_of_large_unsigned_values_is_slow() -> None:
    """Negative control: DuckDB's own conversion of the person's values costs many times that of small ones."""
    con = duckdb.connect()
    con.execute("SET threads = 1")

    def cpu(value: str) -> float:
        con.execute(f"CREATE OR REPLACE TABLE g AS SELECT {value} AS u FROM range(1500) r(i)")
        best = math.inf
        for _ in range(3):
            t0 = time.process_time()
            con.execute("SELECT max(length(CAST(u AS VARCHAR))) FROM g").fetchall()
            best = min(best, time.process_time() - t0)
        return best

    assert cpu("340282366920938463463374607431768211455::UHUGEINT - i::UHUGEINT") > 10 * cpu("i::UHUGEINT")


# -- a residual: UHUGEINT division ----------------------------------------------------------------------------------

def _remainder_session(hostile: bool) -> dpsql.Session:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid BIGINT, u UHUGEINT)")
    con.execute("INSERT INTO t SELECT i, i::UHUGEINT FROM range(300) r(i)")
    value = "340282366920938463463374607431768211455::UHUGEINT - i::UHUGEINT" if hostile else "i::UHUGEINT"
    con.execute(f"INSERT INTO t SELECT 1000000, {value} FROM range(3000) r(i)")
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5), connection=con, engine={"threads": 1})
    use_noise(s, zero_noise(5))
    s.register("t", "t", privacy_unit="uid", max_rows_per_unit=1)
    return s


def _remainder_cpu(hostile: bool, sql: str) -> float:
    s = _remainder_session(hostile)
    try:
        best = math.inf
        for _ in range(2):
            t0 = time.process_time()
            s.query(sql, epsilon=1, delta=1e-6)
            best = min(best, time.process_time() - t0)
        return best
    finally:
        s.close()


@pytest.mark.xfail(strict=True, reason="UHUGEINT // and % divide in DuckDB's 128-bit loop, 2.2 us near 2^128 against "
                                       "0.03 us for small values: a residual (docs/threat_model.md, Timing)")
def test_one_persons_large_unsigned_values_do_not_slow_their_remainders() -> None:
    """Open: one person's 3 000 rows near 2^128 under 100 remainders ``u % 17``, ``u % 27``, ... take several times
    the CPU time of small values in their place (about 0.5 ms a row more; HUGEINT's, the documented residual, about
    0.07 ms). Routing them through HUGEINT would save at most 3.5x (its own loop costs 0.6 us at 2^126)."""
    sql = "SELECT COUNT(*) AS n FROM t WHERE " + _balanced_or([f"u % {k}7 = 1000" for k in range(1, 101)])
    ordinary, hostile = _remainder_cpu(False, sql), _remainder_cpu(True, sql)
    assert hostile < 2 * ordinary + 0.05, (hostile, ordinary)


def test_control_small_unsigned_remainders_cost_alike() -> None:
    """Negative control: the same remainders over a person whose values are small as everyone's cost alike."""
    sql = "SELECT COUNT(*) AS n FROM t WHERE " + _balanced_or([f"u % {k}7 = 1000" for k in range(1, 101)])
    first, second = _remainder_cpu(False, sql), _remainder_cpu(False, sql)
    assert second < 2 * first + 0.05, (first, second)


# -- a residual: the portable keyed hash of a UHUGEINT privacy unit -------------------------------------------------

def _portable_cpu(unit: str) -> float:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i::UHUGEINT AS uid, (i % 5)::VARCHAR AS g FROM range(1000) r(i)")
    con.execute(f"INSERT INTO t SELECT {unit}, (i % 5)::VARCHAR FROM range(5000) r(i)")
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5), connection=con, engine={"threads": 1, "keyed_hash": "portable"})
    try:
        use_noise(s, zero_noise(5))
        s.register("t", "t", privacy_unit="uid", max_rows_per_unit=3, max_groups_per_unit=2)
        best = math.inf
        for _ in range(2):
            t0 = time.process_time()
            s.query("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1, delta=1e-6)
            best = min(best, time.process_time() - t0)
        return best
    finally:
        s.close()


@pytest.mark.xfail(strict=True, reason="the portable keyed hash spells each hashed column with CAST(x AS VARCHAR), "
                                       "which for a UHUGEINT near 2^128 costs 44 us a row (it knows no column type)")
def test_the_portable_hash_of_one_persons_large_unsigned_unit_costs_as_a_small_one() -> None:
    """Open: with ``keyed_hash = "portable"`` and a UHUGEINT privacy unit, one person's 20 000 rows whose unit is
    2^128 - 1 made ``SELECT g, COUNT(*) ... GROUP BY g`` take 1.65-1.68 s of CPU against 0.15 s with unit 10^6
    (DuckDB's own hash: 0.07 s either way). Here 5 000 rows."""
    small, large = _portable_cpu("1000000::UHUGEINT"), _portable_cpu("340282366920938463463374607431768211455::UHUGEINT")
    assert large < 2 * small + 0.05, (large, small)


def test_control_the_portable_hash_of_a_small_unsigned_unit_costs_alike_twice() -> None:
    """Negative control: the same person with a unit of 10^6 twice costs alike."""
    first, second = _portable_cpu("1000000::UHUGEINT"), _portable_cpu("1000001::UHUGEINT")
    assert second < 2 * first + 0.05, (first, second)
