"""Neighbouring datasets (without and with one person's rows), the same query, the same observable outcome.

A BIT column of the caller's DuckDB connection had no size cap: ``max_text_bytes`` capped text, JSON and BLOB
values at every depth, but a BIT value of any length reached the query. Analysts can only test a BIT for NULL,
count it, or count its distinct values, and both counts read each value as its salted text (one character per
bit: ``COUNT(DISTINCT col)`` lists the salted texts, the row race of ``COUNT(col)`` on a caller's connection
hashes them). One person's BIT of 80 million bits (10 MB stored) made ``COUNT(DISTINCT bits)`` take 1.0-1.6 s
of CPU against 0.055 s without that person, and ``COUNT(bits)`` 0.75-0.86 s, while ``bits IS NOT NULL`` read
the same value in 0.04 s: whatever epsilon, the time (or the statement time-out it passes) told whether that
person's value was long. A BIT whose text is longer than ``max_text_bytes`` characters (more bits than that)
is now NULL in the source view, as an over-long text or BLOB is, inside lists and structs too.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
from _hostile_value import HOSTILE, neighbour_outcomes

import dpsql
from dpsql.errors import ConfigError, DPSQLError
from dpsql.testing import use_noise, zero_noise

#: bits of the hostile person's value: its text (200 MB) takes more than a second to build and hash on any
#: machine, past the time-out below, while the same query without that person reads 200 short values
HUGE_BITS = 200_000_000


def _bit_outcomes(sql: str, bits: int = HUGE_BITS) -> list[tuple[str, Any]]:
    return neighbour_outcomes("bits BIT", "'0101'::BIT", f"INSERT INTO t SELECT {HOSTILE}, bitstring('1', {bits})", sql)


@pytest.mark.parametrize("sql", ["SELECT COUNT(DISTINCT bits) AS n FROM t", "SELECT COUNT(bits) AS n FROM t"])
def test_counting_one_persons_huge_bit_value_is_answered_alike_on_neighbours(sql: str) -> None:
    assert _bit_outcomes(sql) == [("ok", None)] * 2


def test_control_a_huge_bit_value_tested_for_null_is_answered_on_neighbours() -> None:
    assert _bit_outcomes("SELECT COUNT(*) AS n FROM t WHERE bits IS NOT NULL") == [("ok", None)] * 2


def _counts(cap: int) -> dict[str, int]:
    """Zero-noise counts over 40 people: 10 hold a BIT of ``cap`` bits, 10 one of ``cap + 1`` bits, 10 a list
    holding one of each, 10 a NULL."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid BIGINT, bits BIT, lst BIT[])")
    con.execute(f"INSERT INTO t SELECT i, CASE i // 10 WHEN 0 THEN bitstring('1', {cap}) WHEN 1 THEN bitstring('1', {cap + 1}) "
                f"END, CASE WHEN i // 10 = 2 THEN [bitstring('1', {cap}), bitstring('1', {cap + 1})] END FROM range(40) r(i)")
    with dpsql.Session(budget=dpsql.Budget(1e6, 0.5), connection=con, engine={"max_text_bytes": cap}) as s:
        use_noise(s, zero_noise(40))
        s.register("t", "t", privacy_unit="uid")
        out = {}
        for name, sql in [("bits", "SELECT COUNT(bits) AS n FROM t"), ("distinct", "SELECT COUNT(DISTINCT bits) AS n FROM t"),
                          ("lists", "SELECT COUNT(lst) AS n FROM t")]:
            out[name] = int(s.query(sql, epsilon=1.0).table.column("n")[0].as_py())
    con.close()
    return out


def test_a_bit_value_longer_than_max_text_bytes_bits_is_null() -> None:
    # 10 values at the cap are kept, 10 one bit over it are NULL; the list keeps its value at the cap
    assert _counts(64) == {"bits": 10, "distinct": 1, "lists": 10}
    # the cap counts bits, not the bytes they are stored in: 65 bits are 9 bytes, 64 are 8
    assert _counts(65)["bits"] == 10


def test_a_map_keyed_by_bit_values_is_capped_like_a_map_keyed_by_text() -> None:
    """A map key cannot be NULL: a map holding a BIT key over the cap is NULL as a whole (as with text keys);
    a map whose BIT values are over it keeps its keys with NULL values. A union holding a BIT is refused at
    registration, by name, as one holding text is (its members cannot be rebuilt)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid BIGINT, mk MAP(BIT, INTEGER), mv MAP(INTEGER, BIT), u UNION(i INTEGER, b BIT))")
    con.execute("INSERT INTO t SELECT i, MAP([bitstring('1', CASE WHEN i < 10 THEN 64 ELSE 65 END)], [1]), "
                "MAP([1], [bitstring('1', CASE WHEN i < 10 THEN 64 ELSE 65 END)]), NULL FROM range(20) r(i)")
    with dpsql.Session(budget=dpsql.Budget(1e6, 0.5), connection=con, engine={"max_text_bytes": 64}) as s:
        use_noise(s, zero_noise(40))
        with pytest.raises(ConfigError, match="column 't.u' has type UNION"):
            s.register("t", "t", privacy_unit="uid")
        con.execute("ALTER TABLE t DROP COLUMN u")
        s.register("t", "t", privacy_unit="uid")
        n = {c: int(s.query(f"SELECT COUNT({c}) AS n FROM t", epsilon=1.0).table.column("n")[0].as_py()) for c in ("mk", "mv")}
    assert n == {"mk": 10, "mv": 20}
    con.close()


#: points of the hostile person's line: its text (about 40 MB of WKT) takes more than a second to build and hash
HUGE_POINTS = 2_500_000


def _geometry_outcomes(sql: str) -> list[tuple[str, Any]]:
    line = "('LINESTRING(' || string_agg(i || ' ' || i, ',') || ')')::GEOMETRY"
    return neighbour_outcomes("g GEOMETRY", "'POINT(1 2)'::GEOMETRY",
                              f"INSERT INTO t SELECT {HOSTILE}, {line} FROM range({HUGE_POINTS}) r(i)", sql)


@pytest.mark.parametrize("sql", ["SELECT COUNT(DISTINCT g) AS n FROM t", "SELECT COUNT(g) AS n FROM t"])
def test_counting_one_persons_huge_geometry_is_answered_alike_on_neighbours(sql: str) -> None:
    """DuckDB's GEOMETRY (WKB) had no size cap either, and counting reads each value as its salted WKT text: one
    person's line of 1M points (16 MB) made COUNT(DISTINCT g) take 0.71-0.75 s of CPU against 0.06 s, COUNT(g)
    0.47 s, `g IS NOT NULL` 0.05 s. A GEOMETRY whose WKB is longer than max_text_bytes bytes is now NULL."""
    assert _geometry_outcomes(sql) == [("ok", None)] * 2


def test_a_geometry_longer_than_max_text_bytes_is_null() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid BIGINT, g GEOMETRY, gs GEOMETRY[])")
    # a POINT's WKB is 21 bytes; a LINESTRING of 2 points 41
    con.execute("INSERT INTO t SELECT i, CASE WHEN i < 10 THEN 'POINT(1 2)' ELSE 'LINESTRING(0 0, 1 1)' END::GEOMETRY, "
                "['POINT(1 2)'::GEOMETRY, 'LINESTRING(0 0, 1 1)'::GEOMETRY] FROM range(30) r(i)")
    with dpsql.Session(budget=dpsql.Budget(1e6, 0.5), connection=con, engine={"max_text_bytes": 21}) as s:
        use_noise(s, zero_noise(40))
        s.register("t", "t", privacy_unit="uid")
        n = int(s.query("SELECT COUNT(g) AS n FROM t", epsilon=1.0).table.column("n")[0].as_py())
        kept = s._engine._con.execute(f"SELECT gs FROM {s.tables['t'].view} LIMIT 1").fetchall()[0][0]
    assert n == 10
    assert kept[1] is None and kept[0] is not None
    con.close()


def _variant_outcomes(sql: str, chars: int) -> list[tuple[str, Any]]:
    return neighbour_outcomes("v VARIANT", "'ab'::VARIANT", f"INSERT INTO t SELECT {HOSTILE}, repeat('x', {chars})::VARIANT", sql)


def test_control_a_huge_variant_tested_for_null_is_answered_on_neighbours() -> None:
    assert _variant_outcomes("SELECT COUNT(*) AS n FROM t WHERE v IS NOT NULL", 60_000_000) == [("ok", None)] * 2


def test_count_of_a_huge_variant_is_answered_alike_on_neighbours() -> None:
    """A VARIANT has no size cap (it can hold a text of any length, a list, a BIGNUM); COUNT(v) reads only whether
    each value is NULL, as ``v IS NOT NULL`` does. Its race over a person's distinct values on a caller's connection
    read each value as its salted text: one person's VARIANT holding a 60 MB text passed the statement time-out."""
    assert _variant_outcomes("SELECT COUNT(v) AS n FROM t", 60_000_000) == [("ok", None)] * 2


@pytest.mark.parametrize(("typ", "castable"), [("VARIANT", False), ("GEOMETRY", False), ("BIT", False), ("INTEGER[]", False),
                                               ("INTERVAL", True), ("UUID", True)])


def test_a_comparison_refused_on_a_type_names_only_the_fixes_that_exist(typ: str, castable: bool) -> None:
    """The refusal of `col = ...` on a type without a total comparison named CAST(... AS VARCHAR) as the way out
    for every such type, and the cast was then refused for most of them."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t (uid BIGINT, c {typ})")
    with dpsql.Session(budget=dpsql.Budget(1.0, 0.5), connection=con) as s:
        s.register("t", "t", privacy_unit="uid")
        with pytest.raises(DPSQLError) as e:
            s.query("SELECT COUNT(*) AS n FROM t WHERE COALESCE(c, NULL) IS NULL AND c = c", epsilon=1.0)
        assert ("CAST(... AS VARCHAR)" in str(e.value)) == castable, str(e.value)
        assert s.remaining().epsilon == 1.0
        if castable:  # the fix it names is answered
            s.query("SELECT COUNT(*) AS n FROM t WHERE CAST(c AS VARCHAR) = 'x'", epsilon=0.5)
    con.close()
