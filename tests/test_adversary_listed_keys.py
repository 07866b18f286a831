"""GROUP BY a column without a declared domain under a WHERE listing its values (``analyze.listed_domain``): the
listed keys read the query's text only (never a collation's or a row's spelling), every counted row equals its key
(zero-noise counts are DuckDB's own under the same WHERE), and a list no row can match is refused before any charge
with a message naming the problem, not an internal error."""
from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


def _session(rows: str, column_type: str, columns: dict | None = None) -> tuple[dpsql.Session, duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t(uid INTEGER, x {column_type})")
    con.execute(f"INSERT INTO t VALUES {rows}")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5), connection=con)
    s.register("t", "t", privacy_unit="uid", columns=columns)
    use_noise(s, zero_noise())
    return s, con


@pytest.mark.parametrize(("where", "delta"), [
    ("x = 'a' AND x = 'b'", 0.0),  # was: ZeroDivisionError
    ("x = 'a' AND x = 'b'", 1e-6),  # was: ConfigError "sensitivity must be > 0"
    ("x IN (NULL)", 1e-6),
    ("x = 'a' AND x = NULL", 0.0),
])
def test_a_list_no_row_can_match_is_refused_naming_it_before_any_charge(where: str, delta: float) -> None:
    s, _ = _session("(1, 'a'), (2, 'b')", "VARCHAR")
    try:
        with pytest.raises(UnsupportedQueryError, match="lists no value"):
            s.query(f"SELECT x, COUNT(*) AS n FROM t WHERE {where} GROUP BY x", epsilon=1.0, delta=delta)
        assert s.remaining() == dpsql.Budget(100.0, 0.5)
    finally:
        s.close()


@pytest.mark.parametrize(("column_type", "rows", "listed", "keys"), [
    # a NOCASE column: the WHERE and the keys compare byte by byte, so 'A' rows count under 'A' only where 'A' is listed
    ("VARCHAR COLLATE NOCASE", "(1, 'a'), (2, 'A'), (3, 'A'), (4, 'b')", "'a'", {"a": 1}),
    ("VARCHAR COLLATE NOCASE", "(1, 'a'), (2, 'A'), (3, 'A'), (4, 'b')", "'a', 'A', 'zz'", {"a": 1, "A": 2, "zz": 0}),
    # -0.0 equals 0.0: counted under the listed spelling, as DuckDB groups it
    ("DOUBLE", "(1, -0.0), (2, 0.0), (3, 1e-320), (4, 'NaN')", "-0.0, 1e-320, 5", {0.0: 2, 1e-320: 1, 5.0: 0}),
    ("TIMESTAMP", "(1, '2024-01-01 10:00'), (2, '2024-01-01')", "'2024-01-01'", None),  # midnight only
    ("DECIMAL(4, 1)", "(1, 1.5), (2, 1.0)", "1.50, 1, 2", None),
])
def test_every_counted_row_equals_its_listed_key(column_type: str, rows: str, listed: str, keys: dict | None) -> None:
    s, con = _session(rows, column_type)
    sql = f"SELECT x, COUNT(*) AS n FROM t WHERE x IN ({listed}) GROUP BY x"
    try:
        r = s.query(sql, epsilon=1.0, delta=0.0)
    finally:
        s.close()
    assert r.mechanism == "laplace"
    got = {row["x"]: row["n"] for row in r.table.to_pylist()}
    if keys is not None:
        assert got == keys
    b = ' COLLATE "binary"' if "VARCHAR" in column_type else ""  # the text compared and grouped byte by byte
    plain = dict(con.execute(f"SELECT x{b}, COUNT(*) FROM t WHERE x{b} IN ({listed}) GROUP BY 1").fetchall())
    assert {k: v for k, v in got.items() if v} == plain  # DuckDB's own counts under a byte-by-byte WHERE


def test_explain_says_the_keys_are_the_wheres_list() -> None:
    s, _ = _session("(1, 'a', 1), (2, 'b', 2)", "VARCHAR, v INTEGER", columns={"v": {"bounds": [0, 10]}})
    try:
        texts = [str(s.explain(sql, epsilon=1.0, delta=delta)) for sql, delta in [
            ("SELECT x, COUNT(*) AS n FROM t WHERE x IN ('a', 'zz') GROUP BY x", 0.0),
            ("SELECT x, COUNT(*) AS n FROM t WHERE x = 'a' GROUP BY x", 1e-6),
            ("SELECT x, MEDIAN(v) AS m FROM t WHERE x IN ('a', 'zz') GROUP BY x", 0.0)]]
    finally:
        s.close()
    for text, mechanism in zip(texts, ["laplace", "gaussian", "exponential"], strict=True):
        assert "the values the WHERE lists: x" in text and mechanism in text, text


@pytest.mark.parametrize("extra", [
    ", ".join(f"(999, '{v}')" for v in ["a", "a", "zz", "A", "a ", "zz"] * 20),  # one person, many rows, odd spellings
])
def test_one_person_more_moves_each_listed_count_by_at_most_the_cap(extra: str) -> None:
    counts = []
    for rows in ("(1, 'a'), (2, 'b'), (3, 'zz')", "(1, 'a'), (2, 'b'), (3, 'zz'), " + extra):
        s, _ = _session(rows, "VARCHAR")
        try:
            r = s.query("SELECT x, COUNT(*) AS n FROM t WHERE x IN ('a', 'zz', 'A', 'q') GROUP BY x", epsilon=1.0, delta=0.0)
        finally:
            s.close()
        counts.append({row["x"]: row["n"] for row in r.table.to_pylist()})
    assert set(counts[0]) == set(counts[1]) == {"a", "zz", "A", "q"}  # the keys: the query's text
    assert sum(abs(counts[1][k] - counts[0][k]) for k in counts[0]) <= 1  # max_groups_per_unit = max_rows_per_group = 1
