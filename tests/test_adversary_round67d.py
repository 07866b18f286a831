"""Review of the free refusals of recent changes: WHERE conditions on one column that no value of its type meets
(``dpsql.plan.satisfiable``), GROUP BY a one-to-one function of the privacy unit (``analyze._injective_in_unit``), and
the key sets of grouped joins narrowed by the WHERE's conditions on a key's column (``rewrite.join_groups``).

A free refusal must hold for every value of the column's type (else a query the data may answer is refused); each
finding below is a WHERE or GROUP BY that was refused for free although the data releases rows under it, compared with
plain SQL under zero noise, with its negative control (a condition no value meets, a key that is one-to-one) still
refused."""

from __future__ import annotations

import random
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from test_s4s_vector import session as tpch_session
from test_s4s_vector import tpch

import dpsql
from dpsql import errors
from dpsql.plan.typer import type_predicate
from dpsql.postprocess import _some_value_meets
from dpsql.testing import use_noise, zero_noise

_ROWS = """
SELECT r AS uid, r % 2 = 0 AS b, 'y' AS s, CAST(-6 AS INTEGER) AS neg, CAST(50 AS INTEGER) AS fifty,
       CAST(1000000000000000256 AS BIGINT) AS bi, CAST('100000000000000016' AS DECIMAL(38, 10)) AS xd,
       DATE '20000-01-01' AS late, DATE '0010-01-01 (BC)' AS early, TIMESTAMP '20000-01-01 00:00:00' AS ts,
       CAST(r AS INTEGER) AS i
FROM range(0, 300) t(r)
"""


@pytest.fixture(scope="module")
def session() -> Any:
    con = duckdb.connect()
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9))
    use_noise(s, zero_noise())
    s.register("t", con.sql(_ROWS).to_arrow_table(), privacy_unit="uid")
    yield s
    s.close()
    con.close()


def _charged(s: dpsql.Session) -> int:
    return int(s.history().num_rows)


def _truth(where: str) -> dict[Any, int]:
    con = duckdb.connect()
    rows = con.execute(f"SELECT b, COUNT(*) FROM ({_ROWS}) WHERE {where} GROUP BY b").fetchall()
    con.close()
    return dict(rows)


@pytest.mark.parametrize("where", [
    # a long IN list (more than 5 elements) is compared by the elements' salted digests: the decision took the
    # digests for the constants, so 'y' (far from 'b' and from every digest) was never tried
    "s IN ('a', 'b', 'c', 'd', 'e', 'y') AND s > 'b'",
    "fifty IN (10, 20, 30, 40, 45, 50) AND fifty > 11",
    # a negated or cast column meets the conditions far from their constants (i = -6, i = 50)
    "-neg > 5 AND -neg < 7",
    "CAST(fifty AS VARCHAR) > '5' AND CAST(fifty AS VARCHAR) < '6'",
    # a column compared in DOUBLE: 10^18 + 256 is above 1e18 as a DOUBLE, 10^18 + 1 is not
    "bi > 1e18 AND bi IS NOT NULL",
    "xd > 1e17 AND xd IS NOT NULL",
    # dates and instants beyond Python's years 1..9999, which a registered column holds (290000 BC .. 294000)
    "late > DATE '9999-12-31' AND late IS NOT NULL",
    "early < DATE '0001-01-01' AND early IS NOT NULL",
    "ts > TIMESTAMP '9999-12-31 23:59:59.999999' AND ts IS NOT NULL",
])
def test_a_where_some_value_meets_is_answered_not_refused(session: Any, where: str) -> None:
    """Was: refused for free ("holds for no value of column ..."), though every row meets it and the release has
    two groups of 150 people. Now: answered and charged, the counts those of plain SQL (zero noise)."""
    before = _charged(session)
    r = session.query(f"SELECT b, COUNT(*) AS n FROM t WHERE {where} GROUP BY b", epsilon=1.0, delta=1e-6)
    assert _charged(session) == before + 1
    got = dict(zip(r.table.column("b").to_pylist(), r.table.column("n").to_pylist(), strict=True))
    assert got == _truth(where) == {True: 150, False: 150}


@pytest.mark.parametrize("where", [
    "s IN ('a', 'b', 'c', 'd', 'e', 'y') AND s > 'y'",
    "fifty IN (10, 20, 30, 40, 45, 50) AND fifty > 50",
    "fifty NOT IN (1, 2, 3, 4, 5, 6) AND fifty > 0 AND fifty < 7",
    "bi > 1e18 AND bi < 1e18",
    "late > DATE '9999-12-31' AND late < DATE '9999-12-31'",
    "ts > TIMESTAMP '2024-01-01' AND ts < TIMESTAMP '2024-01-01 00:00:00.000001'",
])
def test_negative_control_a_where_no_value_meets_is_still_refused_for_free(session: Any, where: str) -> None:
    before, left = _charged(session), session.remaining()
    with pytest.raises(errors.UnsupportedQueryError, match="holds for no value of column"):
        session.query(f"SELECT b, COUNT(*) AS n FROM t WHERE {where} GROUP BY b", epsilon=1.0, delta=1e-6)
    assert _charged(session) == before and session.remaining() == left


_LIST_GRIDS: dict[str, tuple[str, list[str], list[str]]] = {
    # type: (SQL of the grid's values, constants of the lists, constants of the comparisons)
    "INTEGER": ("SELECT CAST(v AS INTEGER) AS c FROM range(-30, 61) t(v) UNION ALL SELECT NULL",
                [str(v) for v in range(-20, 60, 3)], ["-25", "0", "7", "33", "58"]),
    "VARCHAR": ("SELECT c FROM (VALUES ('a'), ('b'), ('c'), ('d'), ('e'), ('f'), ('g'), ('h'), ('y'), ('z'), ('zz'), "
                "(''), (NULL)) t(c)", ["'a'", "'c'", "'e'", "'g'", "'h'", "'y'", "'zz'"], ["'b'", "'f'", "'x'"]),
    "DATE": ("SELECT CAST(DATE '2024-01-01' + CAST(v AS INTEGER) AS DATE) AS c FROM range(-10, 40) t(v) "
             "UNION ALL SELECT NULL", [f"DATE '2024-01-{d:02d}'" for d in range(2, 30, 3)],
             ["DATE '2024-01-01'", "DATE '2024-01-15'", "DATE '2024-02-05'"]),
    "DOUBLE": ("SELECT v / 4 AS c FROM range(-40, 120) t(v) UNION ALL SELECT NULL",
               [f"{v / 2}" for v in range(-8, 50, 5)], ["-3.5", "0", "7.25", "22"]),
    "DECIMAL(5,2)": ("SELECT CAST(v / 4 AS DECIMAL(5, 2)) AS c FROM range(-40, 120) t(v) UNION ALL SELECT NULL",
                     [f"{v / 2}" for v in range(-8, 50, 5)], ["-3.5", "0", "7.25", "22"]),
}


@pytest.mark.parametrize("typ", sorted(_LIST_GRIDS))
def test_the_decision_over_long_in_lists_agrees_with_a_search(session: Any, typ: str) -> None:
    """50 random conjunctions per type with IN lists of 6 or 7 elements (compared by digest) beside comparisons: never
    refused where a value of the grid meets them. Negative controls: the lists are rendered by digest (the path the
    finding was on), and some conjunctions are refused (the search tests refusals too)."""
    grid_sql, members, others = _LIST_GRIDS[typ]
    rng = random.Random(67_0000 + len(typ))
    con = duckdb.connect()
    con.execute(f"CREATE TABLE g AS SELECT CAST(c AS {typ}) AS c FROM ({grid_sql})")
    refused = 0
    for _ in range(50):
        parts = [f"c {rng.choice(['IN', 'NOT IN'])} ({', '.join(rng.sample(members, rng.randint(6, 7)))})"]
        for _ in range(rng.randint(1, 2)):
            parts.append(f"c {rng.choice(['<', '<=', '>', '>=', '<>'])} {rng.choice(others + members)}")
        conj = [sqlglot.parse_one(p, read="duckdb") for p in parts]
        typed = type_predicate(sqlglot.exp.and_(*(c.copy() for c in conj)), {"c": typ}, "WHERE")
        assert "MD5(" in typed.sql(dialect="duckdb")
        found = con.execute(f"SELECT count(*) FROM g WHERE TRY(CAST({typed.sql(dialect='duckdb')} AS BOOLEAN))"
                            ).fetchone()
        assert found is not None
        meets = _some_value_meets(session._engine, "c", typ, conj)
        if found[0] > 0:
            assert meets, parts
        elif not meets:
            refused += 1
    con.close()
    assert refused > 0


@pytest.fixture(scope="module")
def hashed_ids() -> Any:
    """300 people whose ids are 64-bit values from 2^60 (as hashed ids are): a DOUBLE holds them to 256."""
    con = duckdb.connect()
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9))
    use_noise(s, zero_noise())
    s.register("h", con.sql("SELECT CAST(1152921504606846976 + r AS BIGINT) AS uid FROM range(0, 300) t(r)")
               .to_arrow_table(), privacy_unit="uid")
    yield s
    s.close()
    con.close()


@pytest.mark.parametrize(("key", "counts"), [
    ("uid + 100000000000000000000000000000000000000000", [300]),  # 10^41: computed in DOUBLE, every id one value
    ("uid * 100000000000000000000", [129, 171]),  # 10^20: computed in DOUBLE, 256 ids a value
])
def test_group_by_arithmetic_of_the_unit_in_double_is_not_called_one_to_one(hashed_ids: Any, key: str,
                                                                            counts: list[int]) -> None:
    """Was: refused for free as a one-to-one function of the unit ("takes one value per person"): an integer literal of
    any length was taken for exact arithmetic, but beyond 18 digits the product or sum is computed in DOUBLE and many
    people share a value. Now: answered, one group per DOUBLE value (as plain SQL groups them, zero noise)."""
    r = hashed_ids.query(f"SELECT {key} AS g, COUNT(*) AS n FROM h GROUP BY g ORDER BY g", epsilon=1.0, delta=1e-6)
    assert r.table.column("n").to_pylist() == counts


@pytest.mark.parametrize("key", ["uid + 1", "uid * 999999999999999999", "uid * -000999999999999999999",
                                 "(uid - 999999999999999999)"])
def test_negative_control_exact_arithmetic_of_the_unit_is_still_refused_for_free(hashed_ids: Any, key: str) -> None:
    before, left = _charged(hashed_ids), hashed_ids.remaining()
    with pytest.raises(errors.UnsupportedQueryError, match="one-to-one function of the privacy unit"):
        hashed_ids.query(f"SELECT {key} AS g, COUNT(*) AS n FROM h GROUP BY g", epsilon=1.0, delta=1e-6)
    assert _charged(hashed_ids) == before and hashed_ids.remaining() == left


def test_the_decision_over_integers_compared_in_double_agrees_with_a_search(session: Any) -> None:
    """A BIGINT compared with DOUBLE constants is compared in DOUBLE, where 10^18 + 1 rounds to 10^18: 80 random
    conjunctions of such comparisons, never refused where an integer of the grid (steps of 64 around 10^18, the
    ends of BIGINT) meets them. Negative control: some are refused (the search tests refusals too)."""
    rng = random.Random(67_0001)
    doubles = ["1e18", "1.000000000000000128e18", "1.000000000000000256e18", "9.99999999999999872e17",
               "9.223372036854775e18", "-9.223372036854775e18"]
    con = duckdb.connect()
    con.execute("CREATE TABLE g AS SELECT CAST(1000000000000000000 + 64 * v AS BIGINT) AS c FROM range(-12, 13) t(v) "
                "UNION ALL SELECT 9223372036854775807 UNION ALL SELECT -9223372036854775808 UNION ALL SELECT NULL")
    refused = 0
    for _ in range(80):
        parts = [f"c {rng.choice(['<', '<=', '>', '>=', '=', '<>'])} {rng.choice(doubles)}" for _ in range(2)]
        if rng.random() < 0.3:
            parts.append(rng.choice(["c IS NOT NULL", "c IS NULL"]))
        conj = [sqlglot.parse_one(p, read="duckdb") for p in parts]
        typed = type_predicate(sqlglot.exp.and_(*(c.copy() for c in conj)), {"c": "BIGINT"}, "WHERE")
        found = con.execute(f"SELECT count(*) FROM g WHERE TRY(CAST({typed.sql(dialect='duckdb')} AS BOOLEAN))"
                            ).fetchone()
        assert found is not None
        meets = _some_value_meets(session._engine, "c", "BIGINT", conj)
        if found[0] > 0:
            assert meets, parts
        elif not meets:
            refused += 1
    con.close()
    assert refused > 0


_LO = "FROM lineitem l JOIN orders o ON o.o_orderkey = l.l_orderkey"


@pytest.fixture(scope="module")
def nulls() -> Any:
    """The grouped-join tables, every seventh ship date NULL (75 line items)."""
    data = tpch()
    li = data["lineitem"]
    days = li.column("l_shipdate").to_pylist()
    data["lineitem"] = li.set_column(li.schema.get_field_index("l_shipdate"), "l_shipdate", pa.array(
        [None if j % 7 == 0 else d for j, d in enumerate(days)], pa.date32()))
    s = tpch_session(data)
    use_noise(s, zero_noise())
    con = duckdb.connect()
    for name, table in data.items():
        con.register(name, table)
    yield s, con
    s.close()
    con.close()


def _joined(nulls: Any, key: str, where: str) -> tuple[dict[Any, Any], dict[Any, int]]:
    s, con = nulls
    sql = f"SELECT {key} AS k, COUNT(*) AS n {_LO} WHERE {where} GROUP BY k"
    r = s.query(sql, epsilon=4.0, delta=1e-7)
    got = dict(zip(r.table.column("k").to_pylist(), r.table.column("n").to_pylist(), strict=True))
    return got, dict(con.execute(sql).fetchall())


_LATE = "CASE WHEN l.l_shipdate > DATE '1993-06-01' THEN 'late' END"


@pytest.mark.parametrize(("key", "where"), [
    (_LATE, "l.l_shipdate IS NULL OR l.l_shipdate > DATE '1994-06-01'"),
    ("NULLIF(year(l.l_shipdate), 1992)", "l.l_shipdate IS NULL OR l.l_shipdate > DATE '1994-06-01'"),
    (_LATE, "l.l_shipdate IS NULL"),
])
def test_a_derived_join_key_keeps_the_key_of_a_null_column_the_where_lets_through(nulls: Any, key: str,
                                                                                  where: str) -> None:
    """A key computed from a DATE column is NULL at a NULL date, as at every day up to 1993-06-01 (or in 1992). The
    key set narrowed by the WHERE's conditions on the date kept only the keys of the days they let through, so the
    NULL key of the 75 line items without a date (which meet ``l_shipdate IS NULL``) was dropped: its group was
    missing from the release (and ``WHERE l_shipdate IS NULL`` alone was refused for free, "the key sets hold no
    key"). Now: where the conditions hold at NULL the set is not narrowed, and the NULL group is released with the
    count of plain SQL (zero noise)."""
    got, truth = _joined(nulls, key, where)
    assert truth[None] == 75
    assert {k: got[k] for k in truth} == truth


def test_negative_control_conditions_false_at_null_still_narrow_the_key_set(nulls: Any) -> None:
    """``l_shipdate > DATE '1994-06-01'`` is not true at NULL: the set keeps 'late' alone (the NULL key of the days
    before 1993-06-01 is left out, as no tuple meeting the WHERE has it); a plain column's key is narrowed as before."""
    got, truth = _joined(nulls, _LATE, "l.l_shipdate > DATE '1994-06-01'")
    assert got == truth and list(got) == ["late"]
    got, truth = _joined(nulls, "year(l.l_shipdate)", "l.l_shipdate > DATE '1994-06-01'")
    assert got == truth and list(got) == [1994]
    got, truth = _joined(nulls, "l.l_shipdate", "l.l_shipdate IS NULL OR l.l_shipdate > DATE '1994-12-01'")
    assert len(got) == 29 and None not in got  # 1994-12-02 ... 1994-12-30, the grid ends before 1994-12-31
