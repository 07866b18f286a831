"""The joined relation of a lookup join read at each read, and every text operand compared under the binary collation.

Finding (fixed): a typed text literal compared with a text column (``s = CAST('a' AS VARCHAR)``, ``s = VARCHAR
'a'``, ``s = 'a'::TEXT``, ``s IN (CAST('a' AS VARCHAR), t)``, ``COALESCE(t, CAST('b' AS VARCHAR))``) was refused
(free) as "a literal of type VARCHAR cannot be used as VARCHAR", which contradicts itself and names no fix, while
``s = 'a'`` answered. A text literal of type VARCHAR is now the text literal it holds (``Typer._literal_as``).

Open (strict xfail below): a public lookup that is a view of the caller's DuckDB connection whose rows are not a
function of its tables (``CASE WHEN random() < 0.5 ...``) is computed again at each read of the joined relation
(``lookup.LookupJoin.bounded`` reads it more than once for ``GROUP BY e.cc, c.w``): the reads disagree, and the
people whose lookup row changed between the group cap's reads are dropped (about half of them). The caps still hold
(each released count at most the group's people, each person in at most C_u = 1 group: tested below), no key is
respelled, and the loss depends on the view's draws, not on anyone's rows. A private view over ``random()`` loses
rows on the one-table path alike (its source view is read at each read). Register deterministic views, or
materialise them (``CREATE TABLE ... AS``).

What held (no change needed):

* The lookup's kept row per key (``bound.cap_rows``: numbered by content, kept by the keyed hash) cannot differ
  between reads of deterministic rows: a key held by two rows is refused before the charge
  (``dpsql._public_keys``, under the binary collation and DuckDB's grouping, which makes -0.0 and 0.0, NaN payloads,
  INTERVAL '1 month' and '30 days' one value); floating-point keys are refused at registration. So no two rows of
  one key tie in the ORDER BY. Keys equal under a caller's NOCASE column ('a', 'A', 'a ') are three keys, each
  matched by its own spelling: ``GROUP BY e.cc, c.region, g.zone`` over a LEFT or INNER lookup chain (the joined
  relation read more than once, a 40-character key read back as text) releases the exact counts computed from the
  rows, at 1 and 2 threads. Without reproducible noise the row caps draw ``RANDOM()``: in every bounded query seen
  (COUNT, SUM, AVG, VARIANCE, COUNT(DISTINCT), C_u = 1 or 2, k and L set) the draws are inside one read (the
  released groups), the other reads only choose groups by the keyed hash or read back long keys' texts.
* Every text operand under the binary collation (``_other_binary``): over a caller's table with a NOCASE column, an
  ENUM column, NULL operands, typed and parenthesised literals, casts and lists, the counts are DuckDB's byte-for-
  byte counts over the same rows without a collation; nothing newly fails (the same shapes answered or were refused
  alike before the change, non-text operands are never wrapped). On Spark the same shapes release what DuckDB
  releases (checked by hand: starts_with / ends_with / IS DISTINCT FROM are refused on Spark as before), and a COUNT
  filtered by ``'alpha' = s``, ``s = t``, ``'alpha' IN (s, t)``, ``s BETWEEN t AND 'z'`` over 1M Parquet rows took
  the same CPU time before and after (0.03-0.05 s, threads = 1).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

# -- typed text literals ---------------------------------------------------------------------------------------

#: (condition, count over 200 people: s = 'a' for even ids, else 'b'; t = 'a' for multiples of 3, else NULL)
TYPED = [("s = CAST('a' AS VARCHAR)", 100), ("CAST('a' AS VARCHAR) = s", 100), ("s = VARCHAR 'a'", 100),
         ("s = 'a'::TEXT", 100), ("s = (('a'))::VARCHAR", 100), ("s IN (CAST('a' AS VARCHAR), t)", 100),
         ("COALESCE(t, CAST('b' AS VARCHAR)) = 'b'", 133), ("s BETWEEN CAST('a' AS VARCHAR) AND 'a'", 100),
         ("NULLIF(s, CAST('a' AS VARCHAR)) IS NULL", 100), ("starts_with(s, CAST('a' AS VARCHAR))", 100),
         ("s = CAST('a' AS VARCHAR(1))", 100), ("CASE WHEN s = 'a' THEN CAST('x' AS VARCHAR) ELSE s END = 'x'", 100)]


@pytest.fixture(scope="module")
def typed_session() -> Any:
    s = dpsql.Session(budget=Budget(1e6, 0.5))
    use_noise(s, zero_noise())
    s.register("t", pa.table({"uid": list(range(200)), "s": ["a" if i % 2 == 0 else "b" for i in range(200)],
                              "t": ["a" if i % 3 == 0 else None for i in range(200)]}), privacy_unit="uid")
    yield s
    s.close()


@pytest.mark.parametrize(("cond", "count"), TYPED)
def test_a_typed_text_literal_compares_as_the_text_it_holds(typed_session: dpsql.Session, cond: str, count: int) -> None:
    r = typed_session.query(f"SELECT COUNT(*) AS n FROM t WHERE {cond}", epsilon=5.0, delta=1e-6)
    assert r.table.column("n").to_pylist() == [count]


def test_control_a_typed_literal_of_another_type_is_still_refused(typed_session: dpsql.Session) -> None:
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="incompatible types"):
        typed_session.query("SELECT COUNT(*) AS n FROM t WHERE s = CAST(1 AS INTEGER)", epsilon=5.0, delta=1e-6)


# -- every text operand under the binary collation -------------------------------------------------------------

#: conditions over a caller's table: s, t plain text (t NULL for two thirds), n COLLATE NOCASE ('A'), e an ENUM
BINARY = ["s = n", "n = s", "'a' = n", "s IN (n, t, NULL)", "'a' IN (s, NULL)", "s IN ((('a')), ((t)))",
          "s BETWEEN n AND 'z'", "'a' BETWEEN s AND NULL", "s BETWEEN NULL AND 'z'", "COALESCE(t, n) = 'A'",
          "COALESCE(t, NULL) = 'a'", "GREATEST(s, NULL, n) = 'a'", "LEAST(s, e, n) = 'A'", "NULLIF(s, n) IS NULL",
          "NULLIF(s, NULL) = 'a'", "starts_with(s, n)", "prefix(s, t)", "s = e", "e = s", "'a' = e", "s IN (e, 'x')",
          "s BETWEEN e AND 'z'", "s = CAST(NULL AS VARCHAR)", "s = CAST(i AS VARCHAR)", "s = lower(n)",
          "s IS NOT DISTINCT FROM n", "s > n", "CASE s WHEN n THEN true ELSE false END", "s = NULL",
          "s = CASE WHEN i > 5 THEN NULL END", "s = CAST('a' AS VARCHAR)"]


@pytest.fixture(scope="module")
def binary_sessions() -> Any:
    """The dpsql session over a caller's table with a NOCASE column and an ENUM, and a connection holding the same
    rows without any collation (DuckDB's byte-for-byte answers)."""
    con = duckdb.connect()
    raw = duckdb.connect()
    for c, coll in ((con, " COLLATE NOCASE"), (raw, "")):
        c.execute("CREATE TYPE mood AS ENUM ('a', 'b', 'A')")
        c.execute(f"CREATE TABLE t (uid BIGINT, s VARCHAR, t VARCHAR, n VARCHAR{coll}, e mood, i INTEGER)")
        c.execute("INSERT INTO t SELECT i, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, CASE WHEN i % 3 = 0 THEN 'a' END, "
                  "CASE WHEN i % 5 = 0 THEN 'a' ELSE 'A' END, CASE WHEN i % 4 = 0 THEN 'a' ELSE 'b' END, i "
                  "FROM range(200) r(i)")
    s = dpsql.Session(budget=Budget(1e6, 0.5), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid")
    yield s, raw
    s.close()
    raw.close()


@pytest.mark.parametrize("cond", BINARY)
def test_every_text_operand_compares_byte_for_byte(binary_sessions: Any, cond: str) -> None:
    s, raw = binary_sessions
    want = raw.execute(f"SELECT COUNT(*) FROM t WHERE {cond}").fetchone()
    got = s.query(f"SELECT COUNT(*) AS n FROM t WHERE {cond}", epsilon=5.0, delta=1e-6).table.column("n").to_pylist()
    assert want is not None and got == [want[0]]


# -- the joined relation of a lookup join read at each read ----------------------------------------------------

LONG = "L" * 40
#: lookup keys equal under NOCASE, or but for a blank, spelled differently (each its own key), and a long one
CODES = ["a", "A", "a ", LONG, "x"]


def _chain_session(threads: int) -> dpsql.Session:
    """events (one row per person: no cap binds) -> codes (a NOCASE key column of the caller's connection, region)
    -> regions, both LEFT; code 'x' and the unmatched code 'zz' leave their regions NULL."""
    con = duckdb.connect()
    con.execute("CREATE TABLE codes (code VARCHAR COLLATE NOCASE, region VARCHAR)")
    con.executemany("INSERT INTO codes VALUES (?, ?)", [(c, f"r{i % 3}" if c != "x" else None) for i, c in enumerate(CODES)])
    con.execute("CREATE TABLE regions (name VARCHAR, zone VARCHAR)")
    con.execute("INSERT INTO regions VALUES ('r0', 'Z0'), ('r1', 'Z1'), ('r2', 'z1')")
    con.execute("CREATE TABLE events (uid BIGINT, cc VARCHAR)")
    con.executemany("INSERT INTO events VALUES (?, ?)", [(u, _cc(u)) for u in range(480)])
    s = dpsql.Session(budget=Budget(1e6, 0.9), connection=con, engine={"threads": threads})
    use_noise(s, zero_noise(6))
    s.register("regions", "regions", public=True)
    s.register("codes", "codes", public=True, references={"region": "regions.name"})
    s.register("events", "events", privacy_unit="uid", references={"cc": "codes.code"})
    return s


def _cc(u: int) -> str:
    return [*CODES, "zz"][u % 6]


@pytest.mark.parametrize("join", ["LEFT", "INNER"])
def test_a_lookup_chain_read_at_each_read_releases_the_exact_counts(join: str) -> None:
    region = {c: (f"r{i % 3}" if c != "x" else None) for i, c in enumerate(CODES)}
    zone = {"r0": "Z0", "r1": "Z1", "r2": "z1"}
    rows = [(_cc(u), region.get(_cc(u)), zone.get(region.get(_cc(u)) or "")) for u in range(480)]
    want = Counter(r for r in rows if join == "LEFT" or r[2] is not None)
    sql = (f"SELECT e.cc AS k, c.region AS r, g.zone AS z, COUNT(*) AS n FROM events e {join} JOIN codes c ON e.cc = "
           f"c.code {join} JOIN regions g ON c.region = g.name GROUP BY e.cc, c.region, g.zone")
    for threads in (1, 2):
        s = _chain_session(threads)
        try:
            assert s.explain(sql, epsilon=8.0, delta=1e-6).bounded_sql.count("AS __dpsql_lookup") >= 2
            got = s.query(sql, epsilon=8.0, delta=1e-6).table.to_pylist()
        finally:
            s.close()
        assert Counter({(r["k"], r["r"], r["z"]): r["n"] for r in got}) == want, threads


def _random_lookup_release() -> tuple[list[dict[str, Any]], Counter[str]]:
    """``GROUP BY e.cc, c.w`` over a LEFT lookup join whose lookup is a view drawing ``w`` by ``random()`` per read:
    50 codes (one of 40 characters), 40 people each, one row per person."""
    con = duckdb.connect()
    con.execute("CREATE TABLE codes_base AS SELECT CASE WHEN i = 0 THEN repeat('L', 40) ELSE 'k' || i END AS code "
                "FROM range(50) r(i)")
    con.execute("CREATE VIEW codes AS SELECT code, CASE WHEN random() < 0.5 THEN 1 ELSE 2 END AS w FROM codes_base")
    con.execute("CREATE TABLE events AS SELECT i AS uid, CASE WHEN i % 50 = 0 THEN repeat('L', 40) ELSE 'k' || (i % 50) "
                "END AS cc FROM range(2000) r(i)")
    held = Counter(r[0] for r in con.execute("SELECT cc FROM events").fetchall())
    s = dpsql.Session(budget=Budget(1e6, 0.9), connection=con)
    use_noise(s, zero_noise(6))
    s.register("codes", "codes", public=True)
    s.register("events", "events", privacy_unit="uid", references={"cc": "codes.code"})
    try:
        sql = "SELECT e.cc AS k, c.w AS w, COUNT(*) AS n FROM events e LEFT JOIN codes c ON e.cc = c.code GROUP BY e.cc, c.w"
        return s.query(sql, epsilon=8.0, delta=1e-6).table.to_pylist(), held
    finally:
        s.close()


def test_the_caps_hold_when_a_nondeterministic_lookup_view_makes_the_reads_disagree() -> None:
    got, held = _random_lookup_release()
    assert all(r["k"] in held and r["n"] <= held[r["k"]] for r in got)  # released keys spelled as held
    per_code = Counter(r["k"] for r in got)
    assert sum(r["n"] for r in got) <= sum(held.values()) and all(n <= 2 for n in per_code.values())


@pytest.mark.xfail(strict=True, reason="open: a lookup view of the caller's connection over random() is computed "
                   "again at each read of the joined relation, and the people whose lookup row differs between the "
                   "group cap's reads are dropped (about half; probability all 50 codes agree about 2^-50)")
def test_a_nondeterministic_lookup_view_counts_every_person() -> None:
    got, held = _random_lookup_release()
    assert sum(r["n"] for r in got) == sum(held.values())
