"""An analyst's IN list must not make one person's ordinary text cost more to test than anyone else's.

Finding: ``WHERE note IN ('c1', ..., 'cn')`` with more than five constants is answered by DuckDB as a
hash join against the constants (its IN-clause rewrite), under DuckDB's own string hash, which anyone
can make equal in all 64 bits for many strings (``benchmarks/hash_collisions.py``: ``colliding_strings``).
An analyst who lists up to 10 000 constants sharing the hash of a guessed value g made every row holding
g walk all of them: 10 000 string comparisons (about 200 microseconds) for that row, against one probe
for any other row. The WHERE is evaluated on every row of a person before any cap, so the time of the
query revealed how many of one person's rows hold g. Measured on the reference machine (2 shared cores;
20 000 other people, one row each; one person with 20 000 rows; best of 3): the person holding g
6.7-7.1 s, the same person with random values 2.1-3.5 s. In plain DuckDB with 500 constants and 100 000
rows holding g among 200 000: 1.31 s against 0.031 s for random text.

The same holds for integers: DuckDB's hash of a BIGINT is an invertible function, so constants whose
hashes share the bucket and the salt bits of a guessed value's hash are computed directly
(``colliding_keys``); 10 000 of them made 20 000 rows holding the guess 9.6-12.2 s against 1.6-2.7 s for
random values in plain DuckDB.

Now an IN list of more than five elements compares ``MD5(salt || text)`` of the value and of each
constant, the salt a secret the engine draws for each private read (``dpsql.engine.base.with_read_salt``;
explain shows the marker literal ``'dpsql_read_salt'``): without the salt no one can choose constants whose
digests share a bucket (the text test afterwards: 0.12 s against 0.11 s in plain DuckDB with 500
constants; through dpsql with 10 000 constants and 20 000 rows, 3.2 and 4.1 s against 3.0 and 4.7 s on a
loaded machine). A float is made canonical first (-0.0 is 0.0, every NaN one NaN), so the digests are equal
exactly when the values are (up to an MD5 collision under a secret prefix).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from hash_collisions import colliding_keys, colliding_strings  # noqa: E402


@pytest.fixture(scope="module")
def keys() -> list[str]:
    return colliding_strings(60)


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _session(t: pa.Table, **columns: dict[str, object]) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=1, columns=dict(columns))
    return s


def _table(keys: list[str]) -> pa.Table:
    g = np.random.default_rng(4)
    notes = [keys[0]] * 30 + [keys[i % len(keys)] for i in range(200)] + ["".join(g.choice(list("abcdef"), 12)) for _ in range(300)]
    n = len(notes)
    x = np.array([0.0, -0.0, 1.5, float("nan"), 2.5, float("-nan"), 7.25])[np.arange(n) % 7]
    return pa.table({"uid": np.arange(n), "note": notes, "big": pa.array([10**30 + i % 7 for i in range(n)], pa.decimal128(38, 0)),
                     "h": pa.array(np.arange(n) % 9, pa.int64()), "x": x,
                     "d": pa.array(np.datetime64("2020-01-01") + (np.arange(n) % 13).astype("timedelta64[D]"))})


def test_the_crafted_constants_share_one_duckdb_hash(keys: list[str]) -> None:
    con = duckdb.connect()
    assert con.execute("SELECT COUNT(DISTINCT hash(k)) FROM (SELECT UNNEST(?::VARCHAR[]) AS k)", [keys]).fetchall() == [(1,)]
    # the MD5 digests of the same strings do not share a hash
    got = con.execute("SELECT COUNT(DISTINCT hash(md5('0f1e2d3c' || k))) FROM (SELECT UNNEST(?::VARCHAR[]) AS k)", [keys]).fetchall()
    assert got == [(len(keys),)]


def test_crafted_integers_share_a_bucket_and_its_salt_bits_but_not_their_salted_digests() -> None:
    ints = colliding_keys(50)
    con = duckdb.connect()
    low = con.execute("SELECT COUNT(DISTINCT hash(k) % 16777216), COUNT(DISTINCT hash(k) >> 48) FROM (SELECT UNNEST(?::BIGINT[]) AS k)",
                      [ints]).fetchall()
    assert low == [(1, 1)]
    got = con.execute("SELECT COUNT(DISTINCT hash(md5('0f1e2d3c' || CAST(k AS VARCHAR))) % 16777216) FROM (SELECT UNNEST(?::BIGINT[]) AS k)",
                      [ints]).fetchall()
    assert got[0][0] >= 49


def test_each_private_read_draws_its_own_salt() -> None:
    import sqlglot

    from dpsql.engine.base import with_read_salt
    from dpsql.plan.typer import Typer

    e = Typer({"h": "BIGINT"}).t(sqlglot.parse_one("SELECT h IN (1, 2, 3, 4, 5, 6)", read="duckdb").expressions[0]).expr
    q = sqlglot.exp.select(e)
    a, b = with_read_salt(q).sql("duckdb"), with_read_salt(q).sql("duckdb")
    assert "dpsql_read_salt" in q.sql("duckdb")  # explain and the bind check show the marker
    assert "dpsql_read_salt" not in a and "dpsql_read_salt" not in b
    salts = {m for text in (a, b) for m in re.findall(r"MD5\('([0-9a-f]{32})' \|\|", text)}
    assert len(salts) == 2  # one salt per read, the same for the value and every constant of one read


@pytest.mark.parametrize("n", [6, 59])
def test_a_long_text_in_list_is_tested_by_digest(keys: list[str], n: int) -> None:
    s = _session(_table(keys))
    sql = f"SELECT COUNT(*) AS n FROM t WHERE note IN ({', '.join(_lit(k) for k in keys[1:n + 1])})"
    bounded = s.explain(sql, epsilon=1.0).bounded_sql
    assert re.search(r"MD5\('dpsql_read_salt' \|\| LEFT\(\"note\", \d+\)\) IN \(\s*MD5\('dpsql_read_salt' \|\| '", bounded), bounded
    assert not re.search(r'"note"[^()]*COLLATE "binary"\) IN \(', bounded)


def test_a_short_in_list_is_compared_as_written(keys: list[str]) -> None:
    s = _session(_table(keys))
    bounded = s.explain(f"SELECT COUNT(*) AS n FROM t WHERE note IN ({', '.join(_lit(k) for k in keys[1:6])})", epsilon=1.0).bounded_sql
    assert "MD5" not in bounded


@pytest.mark.parametrize("where", [
    "x IN (0.0, 1.5, 2.5, 3.5, 4.5, 5.5)", "x IN (-0.0, 1.5, 2.5, 3.5, 4.5, CAST('nan' AS DOUBLE))", "d IN (DATE '2020-01-01', DATE '2020-01-03', "
    "DATE '2020-01-05', DATE '2020-01-07', DATE '2020-01-09', DATE '2020-01-11')", "h IN (1, 2, 3, 4, 5, 6, 7, -0, 8)",
    "note IN ({keys})", "note NOT IN ({keys})", "note IN ({keys}, NULL)", "note NOT IN ({keys}, NULL)",
    "(CASE WHEN h > 3 THEN note END) IN ({keys})", "big IN (1000000000000000000000000000000, 1000000000000000000000000000001, "
    "1000000000000000000000000000002, 3, 4, 5, 6)", "h IN (1, 2, 3, 4, 5, 6, 7)", "upper(note) IN ({upper})",
])
def test_answers_are_those_of_plain_in(keys: list[str], where: str) -> None:
    t = _table(keys)
    where = where.format(keys=", ".join(_lit(k) for k in keys[:40]), upper=", ".join(_lit(k.upper()) for k in keys[:40]))
    con = duckdb.connect()
    con.register("t", t)
    truth = con.execute(f"SELECT COUNT(*) FROM t WHERE {where}").fetchall()[0][0]
    s = _session(t)
    r = s.query(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1e3, delta=0)
    assert r.table.column(0)[0].as_py() == truth
    r = s.query(f"SELECT CASE WHEN {where} THEN 'in' ELSE 'out' END AS k, COUNT(*) AS n FROM t GROUP BY 1", epsilon=8, delta=0.1)
    got = {row["k"]: row["n"] for row in r.table.to_pylist()}
    plain = dict(con.execute(f"SELECT CASE WHEN {where} THEN 'in' ELSE 'out' END AS k, COUNT(*) FROM t GROUP BY 1").fetchall())
    assert got == plain


def test_spark_answers_a_digested_in_list_as_duckdb() -> None:
    import sqlglot
    from _spark import both_engines, column_of, require_spark

    from dpsql.plan.typer import Typer

    require_spark()
    texts = ["a", "b", "ß", "", None, "x" * 40, "ü", "7"]
    t = pa.table({"i": pa.array(range(len(texts)), pa.int64()), "s": pa.array(texts, pa.string()),
                  "h": pa.array([10**30 + i for i in range(len(texts))], pa.decimal128(38, 0))})
    engines = both_engines(t)
    duck, spark = next(engines)
    try:
        for sql in ["s IN ('a', 'ß', '', 'q', 'r', 'x', 'y')", "s NOT IN ('a', 'ß', '', 'q', 'r', 'x', 'y', NULL)",
                    "h IN (1000000000000000000000000000000, 1000000000000000000000000000003, 1, 2, 3, 4, 5)"]:
            e = Typer({"i": "BIGINT", "s": "VARCHAR", "h": "DECIMAL(38,0)"}).t(
                sqlglot.parse_one(f"SELECT {sql}", read="duckdb").expressions[0]).expr
            assert "MD5" in e.sql("duckdb")
            e = sqlglot.exp.select(e).expressions[0]
            assert column_of(duck, e) == column_of(spark, e)
    finally:
        for _ in engines:
            pass
