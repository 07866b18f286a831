"""GROUP BY a column without a declared domain, under a WHERE that lists its values (``col IN (...)``, ``col = v``):
the list is the public key set (analyze.listed_domain). The WHERE drops every row outside it, so releasing every
listed key, a noisy 0 for one no row holds, reads nothing but the query's text: answered by Gaussian or Laplace noise
(also at δ = 0), never by the sparse histogram's threshold."""
from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest

import dpsql
from dpsql.plan.analyze import listed_domain
from dpsql.plan.parse import parse_statements
from dpsql.testing import use_noise, zero_noise

N = 400


def _table(extra: bool = False) -> pa.Table:
    rows = {"uid": list(range(N)), "cc": [["FR", "DE", "IT", "ES"][i % 4] for i in range(N)], "k": [i % 7 for i in range(N)],
            "d": [datetime.date(2024, 1, 1 + i % 5) for i in range(N)]}
    if extra:  # 60 more people, holding keys the query lists and no one else holds (enough to pass a threshold)
        for i in range(60):
            for c, v in (("uid", N + i), ("cc", "XX"), ("k", 99), ("d", datetime.date(2024, 2, 1))):
                rows[c].append(v)
    return pa.table(rows)


def _session(extra: bool = False) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 0.5))
    s.register("t", _table(extra), privacy_unit="uid")
    use_noise(s, zero_noise())
    return s


@pytest.mark.parametrize(("sql", "keys"), [
    ("SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ('FR', 'DE', 'XX') GROUP BY cc", ["DE", "FR", "XX"]),
    ("SELECT k, COUNT(*) AS n FROM t WHERE k IN (1, -2, 99) AND k IN (1, 99, 5) GROUP BY k", [1, 99]),
    ("SELECT d, COUNT(*) AS n FROM t WHERE d = '2024-02-01' GROUP BY d", [datetime.date(2024, 2, 1)]),
    ("SELECT cc, k, COUNT(*) AS n FROM t WHERE (cc IN ('FR', 'XX')) AND k = 99 GROUP BY cc, k", [("FR", 99), ("XX", 99)]),
])
def test_the_listed_values_are_the_released_keys_on_neighbours_at_delta_zero(sql: str, keys: list) -> None:
    released = []
    for extra in (False, True):
        s = _session(extra)
        try:
            r = s.query(sql, epsilon=1.0, delta=0.0)
        finally:
            s.close()
        assert r.mechanism == "laplace", r.mechanism
        got = [tuple(v for c, v in row.items() if c != "n") for row in r.table.to_pylist()]
        released.append(sorted(g[0] if len(g) == 1 else g for g in got))
    assert released[0] == released[1] == sorted(keys)  # the keys read the query's text only


def test_the_counts_are_duckdbs_at_zero_noise() -> None:
    s = _session()
    try:
        r = s.query("SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ('FR', 'XX') AND cc <> 'ES' GROUP BY cc",
                    epsilon=1.0, delta=1e-6)
    finally:
        s.close()
    assert r.mechanism == "gaussian"
    assert {row["cc"]: row["n"] for row in r.table.to_pylist()} == {"FR": 100, "XX": 0}


@pytest.mark.parametrize("sql", [
    "SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ('FR', 'XX') OR k = 99 GROUP BY cc",  # not AND-ed
    "SELECT cc, COUNT(*) AS n FROM t WHERE NOT cc IN ('FR', 'DE') GROUP BY cc",
    "SELECT cc, COUNT(*) AS n FROM t WHERE k IN (1, 2, 99) GROUP BY cc",  # another column's list
    "SELECT cc, COUNT(*) AS n FROM t GROUP BY cc",
])
def test_without_an_and_ed_list_of_the_key_the_keys_stay_the_sparse_histograms(sql: str) -> None:
    """The negative control: the sparse histogram's keys are the data's (the people holding 'XX' add it)."""
    out = []
    for extra in (False, True):
        s = _session(extra)
        try:
            r = s.query(sql, epsilon=1.0, delta=1e-3)
        finally:
            s.close()
        assert r.mechanism == "sparse_histogram", r.mechanism
        out.append(sorted(row["cc"] for row in r.table.to_pylist()))
    assert "XX" not in out[0] and "XX" in out[1]


@pytest.mark.parametrize(("where", "column_type", "expected"), [
    ("c IN ('a', NULL, 'a', 'b')", "VARCHAR", ("a", "b")),  # NULL matches no row; repeats once
    ("c IN (1, 01)", "INTEGER", (1,)),  # equal as the column's type
    ("c = 2.5", "DOUBLE", (2.5,)),
    ("c IN (1, 2)", "VARCHAR", None),  # a number listed for text: DuckDB's cast, not the key's spelling
    ("c IN ('1')", "INTEGER", None),
    ("c IN (1, 300)", "TINYINT", None),  # a value the column cannot hold
    ("c IN (SELECT 1)", "INTEGER", None),
    ("c IN (1, x)", "INTEGER", None),
    ("c > 1", "INTEGER", None),
    ("c IN (true)", "BOOLEAN", (True,)),
    ("c = 9007199254740992e0", "BIGINT", None),  # a double: DuckDB compares the BIGINT as a double
    ("c IN (1.0)", "INTEGER", None),
    ("c IN (1.5, 2)", "DECIMAL(4,1)", (decimal.Decimal("1.5"), decimal.Decimal("2.0"))),
    ("c IN (1.55)", "DECIMAL(4,1)", None),  # more digits than the scale: DuckDB compares it wider, no row holds it
    ("c IN (0.1)", "FLOAT", None),  # single precision
])
def test_listed_domain(where: str, column_type: str, expected: tuple | None) -> None:
    stmt = parse_statements(f"SELECT 1 FROM t WHERE {where}")[0]
    assert listed_domain("c", stmt.args["where"].this, column_type) == expected


def test_conditions_that_leave_no_listed_key_are_refused_for_free_naming_the_keys_as_listed() -> None:
    """The refusal of a release with no row whatever the data names the keys as the query gave them: listed by its
    WHERE, not declared (a declared domain's refusal says declared: tests/test_large_domains.py)."""
    s = _session()
    try:
        before = s.remaining()
        with pytest.raises(dpsql.errors.UnsupportedQueryError) as e:
            s.query("SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ('FR', 'DE') AND cc IS NULL GROUP BY cc",
                    epsilon=1.0, delta=0.0)
        assert "exclude every listed key (cc: 'FR', 'DE')" in str(e.value), str(e.value)
        assert "declared" not in str(e.value) + (e.value.hint or ""), (str(e.value), e.value.hint)
        assert s.remaining() == before and s.history().num_rows == 0
    finally:
        s.close()
