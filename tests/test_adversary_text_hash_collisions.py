"""One person's text keys crafted to have one DuckDB hash in all 64 bits must not make a query slow.

``tests/test_adversary_hash_collisions.py`` and ``test_adversary_join_collisions.py`` keep BIGINT keys whose
hashes share their low bits from making the bounded query quadratic: every (person, key) grouping and every
join on chosen keys also goes by a keyed hash, ``HASH(XOR(HASH(unit, key), HASH(salt)))``. That keyed hash
starts from the engine's own hash of the key, which for a string has no secret and is easy to make equal
in all 64 bits for many strings (``benchmarks/hash_collisions.py``: ``colliding_strings``): the keyed hash
of such strings is then equal too, whatever the salt, and the spread spread nothing. Measured (20 000 other
people, one person holding 20 000 such 24-character keys against 20 000 random ones, best of 3, Arrow
sources): a sparse histogram over a text key 1.56 s against 0.066 s, SUM with k = 1 4.26 s against 0.072 s,
SUM with k = 3 2.81 s against 0.119 s, ``suggest_caps(group_by=...)`` 3.10 s against 0.109 s; a DP-S4S SUM
over orders JOIN lineitem on a text order key 13.5 s against 0.64 s, R2T over lineitem with its people
looked up through orders 29.6 s against 0.32 s. Wide integers and decimals (HUGEINT, DECIMAL beyond 18
digits) have the same weakness: DuckDB XORs the hashes of their two 64-bit halves.

Such keys are now hashed as the secret salt followed by their text (``dpsql.rewrite.bound.spread_input``):
after the change the colliding neighbour took 0.069, 0.067, 0.131, 0.070, 0.39 and 0.38 s. Timings live
in the benchmark; here the spread of crafted keys is computed, and the plans and releases are checked.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from sqlglot import exp

import dpsql
from dpsql.budget import Budget
from dpsql.engine.duckdb_ops import DuckDBOps
from dpsql.rewrite.bound import SALT_PLACEHOLDER, spread_keys, weakly_hashed
from dpsql.rewrite.joins import Spread, spread_of
from dpsql.rewrite.render import render
from dpsql.testing import use_noise, zero_noise

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from hash_collisions import colliding_strings  # noqa: E402

SALT = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


@pytest.fixture(scope="module")
def keys() -> list[str]:
    return colliding_strings(400)


def _distinct(expr: exp.Expression, values: list[Any], sql_type: str) -> int:
    """How many distinct values ``expr`` (over columns __unit and __k0) takes on one unit's ``values``."""
    q = exp.select(exp.func("count", exp.Distinct(expressions=[expr]))).from_(
        exp.select(exp.alias_(exp.Literal.number(7), "__unit"), exp.alias_(exp.column("k"), "__k0"))
        .from_("vals").subquery("__rows"))
    con = duckdb.connect()
    try:
        con.execute(f"CREATE TABLE vals AS SELECT UNNEST(?::{sql_type}[]) AS k", [values])
        return int(con.execute(render(q, dialect="duckdb")).fetchall()[0][0])
    finally:
        con.close()


def _spread_expression(types: dict[str, str] | None) -> exp.Expression:
    sel = spread_keys(exp.to_table("__rows"), ["__k0"], SALT, DuckDBOps(), types).this
    return next(e.this for e in sel.selects if e.alias == "__spread")


def test_the_crafted_strings_have_one_duckdb_hash(keys: list[str]) -> None:
    """The attack's premise: distinct printable strings, one 64-bit hash; and the keyed hash as it was (the
    key's engine hash XORed with the salt's, hashed again) is one value for all of them."""
    assert len(set(keys)) == len(keys) == 400 and all(k.isprintable() and k.isascii() for k in keys)
    assert _distinct(exp.func("hash", exp.column("__k0")), keys, "VARCHAR") == 1
    assert _distinct(DuckDBOps().keyed_hash(["__unit", "__k0"], SALT), keys, "VARCHAR") == 1


def test_the_spread_of_crafted_text_keys_is_one_value_per_key(keys: list[str]) -> None:
    assert _distinct(_spread_expression({"__k0": "VARCHAR"}), keys, "VARCHAR") == len(keys)
    # negative control: without the key's type (as before) the spread is one value for all of them
    assert _distinct(_spread_expression(None), keys, "VARCHAR") == 1


def test_the_spread_of_crafted_wide_integers_is_one_value_per_key() -> None:
    """HUGEINT and DECIMAL(38): DuckDB XORs the hashes of the two halves, so (lo, hi) and (hi, lo) collide."""
    pairs = [(i * 7919 + 3, i * 104729 + 11) for i in range(1, 201)]
    values = [lo + (hi << 64) for lo, hi in pairs] + [hi + (lo << 64) for lo, hi in pairs]
    for sql_type in ("HUGEINT", "DECIMAL(38,0)"):
        plain = _distinct(exp.func("hash", exp.column("__k0")), values, sql_type)
        assert plain == len(pairs)  # the premise: every value collides with its swapped twin
        assert _distinct(_spread_expression({"__k0": sql_type}), values, sql_type) == len(values)
        assert _distinct(_spread_expression(None), values, sql_type) == len(pairs)  # the control


def test_join_spreads_of_crafted_text_keys_are_one_value_per_key(keys: list[str]) -> None:
    spread = spread_of([(exp.column("__k0"), "VARCHAR")], Spread(SALT, DuckDBOps()))
    assert spread is not None
    assert _distinct(spread, keys, "VARCHAR") == len(keys)
    assert _distinct(DuckDBOps().spread_hash([exp.column("__k0")], SALT), keys, "VARCHAR") == 1  # the control


@pytest.mark.parametrize("sql_type,weak", [
    ("VARCHAR", True), ("VARCHAR COLLATE NOCASE", True), ("BLOB", True), ("UUID", True), ("HUGEINT", True),
    ("UHUGEINT", True), ("DECIMAL(38,2)", True), ("DECIMAL(19, 0)", True), ("DECIMAL(18,3)", False),
    ("DECIMAL", False), ("BIGINT", False), ("INTEGER", False), ("DOUBLE", False), ("DATE", False),
    ("TIMESTAMP", False), ("BOOLEAN", False),
])
def test_which_types_are_hashed_as_salted_text(sql_type: str, weak: bool) -> None:
    assert weakly_hashed(sql_type) is weak


def _flat(sql: str) -> str:
    """A pretty-printed query on one line, without the spaces its layout puts inside parentheses."""
    return " ".join(sql.split()).replace("( ", "(").replace(" )", ")")


def _session(uid: Any, x: Any, caps: dict[str, Any]) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1e6, 0.5))
    use_noise(s, zero_noise())
    t = pa.table({"uid": np.asarray(uid, np.int64), "x": pa.array(x, pa.string()), "v": np.ones(len(x))})
    s.register("t", t, privacy_unit="uid", columns={"v": {"bounds": (0, 1)}}, **caps)
    return s


SHAPES = [
    ("SELECT x, COUNT(*) FROM t GROUP BY x", {"max_groups_per_unit": 1}),
    ("SELECT x, SUM(v) FROM t GROUP BY x", {"max_groups_per_unit": 1}),
    ("SELECT x, SUM(v) FROM t GROUP BY x", {"max_groups_per_unit": 2, "max_rows_per_group": 3}),
    ("SELECT x, SUM(v) FROM t GROUP BY x", {"max_groups_per_unit": 2, "max_rows_per_unit": 4}),
]


#: counts of units with C_u at most 64 group no pairs before the cap: one aggregate per (person, keyed hash), then
#: a window ranks those (tests/test_text_keys_over_rows.py); a wider cap keeps the pairs and their spread
SPREAD_SHAPES = [("SELECT x, COUNT(*) FROM t GROUP BY x", {"max_groups_per_unit": 65}), *SHAPES[1:]]


def test_counts_of_text_keys_rank_each_persons_rows_before_any_grouping() -> None:
    s = _session(range(10), [f"k{i}" for i in range(10)], SHAPES[0][1])
    try:
        bounded = _flat(s.explain(SHAPES[0][0], epsilon=1.0, delta=1e-6).bounded_sql)
    finally:
        s.close()
    # each person's first C_u keyed hashes by an aggregate of integers and a window, then one group per kept (person,
    # hash) by an aggregate over its rows (keys of one engine hash share a group: no probing); no DISTINCT, no digest
    assert "AS __all_hashes GROUP BY __unit, __ghash) AS __hashes QUALIFY DENSE_RANK() OVER (PARTITION BY __unit" in bounded
    assert "AS __kept_hashes GROUP BY __unit, __ghash HAVING" in bounded, bounded
    assert "SELECT DISTINCT" not in bounded and "MD5_NUMBER" not in bounded, bounded


@pytest.mark.parametrize("sql,caps", SPREAD_SHAPES)
def test_text_keys_are_spread_as_salted_text_and_integers_are_not(sql: str, caps: dict[str, Any]) -> None:
    s = _session(range(10), [f"k{i}" for i in range(10)], caps)
    try:
        bounded = _flat(s.explain(sql, epsilon=1.0, delta=1e-6).bounded_sql)
        plain = _flat(s.explain(sql.replace("x,", "uid % 3 AS x,").replace("BY x", "BY uid % 3"), epsilon=1.0,
                                delta=1e-6).bounded_sql)
    finally:
        s.close()
    salted = f"'{SALT_PLACEHOLDER}' || CAST(__k0 AS TEXT)"
    spread = f"HASH(XOR(HASH(__unit, MD5_NUMBER({salted})), HASH('{SALT_PLACEHOLDER}'))) AS __spread"
    # (the key is carried compact, bound.compact_key: a short key is itself, so it is spread as its salted text)
    assert spread in bounded, bounded
    assert "HASH(XOR(HASH(__unit, __k0), HASH(" in plain and salted not in plain  # integer keys: no text per row


@pytest.mark.parametrize("sql,caps", SHAPES)
def test_releases_over_colliding_text_keys_are_the_bounded_truth(keys: list[str], sql: str, caps: dict[str, Any]) -> None:
    """200 people with key 'k7' and one person holding 400 colliding keys: at zero noise 'k7' has its 200."""
    x = ["k7"] * 200 + keys
    uid = np.concatenate([np.arange(200), np.full(len(keys), 10**6)])
    s = _session(uid, x, caps)
    try:
        rows = s.query(sql, epsilon=1.0, delta=1e-6).table.to_pylist()
    finally:
        s.close()
    by_key = {r["x"]: r for r in rows}
    assert list(by_key["k7"].values())[1] == 200
    assert set(by_key) <= {"k7", *keys}


def test_caps_advice_over_colliding_text_keys_counts_every_pair(keys: list[str]) -> None:
    uid = np.concatenate([np.arange(200), np.full(len(keys), 10**6)])
    s = _session(uid, ["k7"] * 200 + keys, {})
    try:
        rel = s.suggest_caps("t", epsilon=1.0, group_by="x")
    finally:
        s.close()
    got = {(r["contribution"], r["from"]): r["people"] for r in rel.table.to_pylist() if r["people"]}
    assert got == {("rows per person", 1): 200, ("rows per person", 256): 1,
                   ("groups per person", 1): 200, ("groups per person", 256): 1,
                   ("most rows per person in one group", 1): 201}


def test_a_join_on_colliding_text_order_keys_releases_the_truth(keys: list[str]) -> None:
    """Customers with one order each and one customer holding 400 orders with colliding text keys (each with
    one line item): the join's plan spreads the text order keys as salted text, and the query is answered."""
    ok = [f"o{i}" for i in range(300)] + keys
    oc = np.concatenate([np.arange(300), np.full(len(keys), 300)])
    with dpsql.Session(budget=Budget(1e6, 0.5)) as s:
        use_noise(s, zero_noise())
        s.register("customer", pa.table({"c_custkey": np.arange(301)}), privacy_unit="c_custkey")
        s.register("orders", pa.table({"o_orderkey": ok, "o_custkey": oc}),
                   references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 512})
        s.register("lineitem", pa.table({"l_orderkey": ok}), references={"l_orderkey": "orders.o_orderkey"},
                   degree_bounds={"l_orderkey": 1})
        sql = "SELECT COUNT(*) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey"
        bounded = _flat(s.explain(sql, epsilon=1.0, delta=1e-6).bounded_sql)
        assert f"'{SALT_PLACEHOLDER}' || CAST(" in bounded, bounded
        rel = s.query(sql, epsilon=1.0, delta=1e-6)
    assert rel.table.num_rows == 1


def _connection_session(con: duckdb.DuckDBPyConnection, name: str) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1e6, 0.5), connection=con)
    use_noise(s, zero_noise())
    s.register("t", name, privacy_unit="uid", columns={"v": {"bounds": (0, 1)}, "g": {"domain": ["a"]}})
    return s


def _connection_table(con: duckdb.DuckDBPyConnection, name: str, notes: list[str], person: list[str]) -> None:
    uid = np.concatenate([np.arange(len(notes)), np.full(len(person), 10**6)]).astype(np.int64)
    t = pa.table({"uid": uid, "note": notes + person, "g": ["a"] * len(uid), "v": np.ones(len(uid))})
    con.register("__arrow", t)
    con.execute(f"CREATE TABLE {name} AS SELECT * FROM __arrow")
    con.unregister("__arrow")


def test_the_row_race_groups_a_persons_text_values_by_their_salted_spread(keys: list[str]) -> None:
    """On a caller's connection k = 1 is an exponential race over each (person, group)'s distinct values: a
    GROUP BY over the raw values of COUNT(col) / COUNT(DISTINCT col). One person's 20 000 notes of one DuckDB
    hash made ``SELECT COUNT(note) FROM t`` take 3.95 s against 0.10 s for 20 000 random notes (COUNT(DISTINCT
    note) 2.76 s, grouped 3.39 s); with the values' salted spread 0.12, 0.11 and 0.15 s. COUNT(note) now reads only
    whether each note is NULL (no text, nothing to collide); COUNT(DISTINCT note) races over the digest of each
    note's salted text, computed per row before the race (``bound._one_row_per_group``), which no one can make
    collide without the salt."""
    con = duckdb.connect()
    try:
        _connection_table(con, "d", [f"n{i % 7}" for i in range(200)], keys)
        s = _connection_session(con, "d")
        try:
            for sql in ("SELECT COUNT(DISTINCT note) FROM t", "SELECT g, COUNT(DISTINCT note) FROM t GROUP BY g"):
                bounded = _flat(s.explain(sql, epsilon=1.0, delta=1e-6).bounded_sql)
                digest = f"MD5_NUMBER('{SALT_PLACEHOLDER}' || CAST(\"note\" COLLATE \"binary\" AS TEXT)) AS __r0"
                assert digest in bounded and "GROUP BY __unit" in bounded and "__vspread" not in bounded, bounded
            for sql in ("SELECT COUNT(note) FROM t", "SELECT g, COUNT(note) FROM t GROUP BY g"):
                bounded = _flat(s.explain(sql, epsilon=1.0, delta=1e-6).bounded_sql)
                assert 'NOT "note" IS NULL' in bounded and "__vspread" not in bounded, bounded
            # negative control: a DOUBLE value (its engine hash is a bijection) is grouped as it is
            plain = _flat(s.explain("SELECT SUM(v) FROM t", epsilon=1.0, delta=1e-6).bounded_sql)
            assert "GROUP BY __unit, __r0" in plain and "__vspread" not in plain, plain
            got = s.query("SELECT COUNT(note) AS n, COUNT(DISTINCT note) AS d FROM t", epsilon=1.0,
                          delta=1e-6).table.to_pylist()
        finally:
            s.close()
    finally:
        con.close()
    # one row per person: 201 notes, the 7 spellings of the others and the person's one
    assert got == [{"n": 201, "d": 8}]


DISTINCT_SHAPES = [
    ("SELECT COUNT(DISTINCT x) AS d FROM t", {"max_rows_per_unit": 512}),
    ("SELECT g, COUNT(DISTINCT x) AS d FROM t GROUP BY g", {"max_rows_per_group": 512}),
]


def _distinct_session(uid: Any, x: Any, caps: dict[str, Any]) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1e6, 0.5))
    use_noise(s, zero_noise())
    t = pa.table({"uid": np.asarray(uid, np.int64), "x": pa.array(x, pa.string()), "g": ["a"] * len(x),
                  "v": np.ones(len(x))})
    s.register("t", t, privacy_unit="uid", columns={"v": {"bounds": (0, 1)}, "g": {"domain": ["a"]}}, **caps)
    return s


@pytest.mark.parametrize("sql,caps", DISTINCT_SHAPES)
def test_count_distinct_lists_the_salted_text_of_text_values(sql: str, caps: dict[str, Any]) -> None:
    """COUNT(DISTINCT x) over a person's kept rows (k or L above 1) lists the distinct values of each (person,
    group) and then of each group with ``list_distinct``, a hash table under DuckDB's public hash: one person's
    20 000 text values of one hash (within an owner's cap of 20 000 rows) made ``SELECT COUNT(DISTINCT note)``
    6.75 s against 0.29 s for 20 000 random values (grouped: 6.52 s against 0.29 s). The values are listed as
    the salted text (injective: the same count), read through MD5_NUMBER on DuckDB (its string hash keeps
    block-aligned crafted texts to 8 values under any salt: tests/test_adversary_text_hash_differentials.py),
    computed per row before the caps (``bound.base_relation``) and listed as it is."""
    s = _distinct_session(range(10), [f"k{i}" for i in range(10)], caps)
    try:
        bounded = _flat(s.explain(sql, epsilon=1.0, delta=1e-6).bounded_sql)
        plain = _flat(s.explain(sql.replace("DISTINCT x", "DISTINCT v"), epsilon=1.0, delta=1e-6).bounded_sql)
    finally:
        s.close()
    assert f"MD5_NUMBER('{SALT_PLACEHOLDER}' || CAST(\"x\" COLLATE \"binary\" AS TEXT)) AS __a0_v" in bounded, bounded
    assert "LIST_DISTINCT(LIST(__a0_v))" in bounded, bounded
    assert f"'{SALT_PLACEHOLDER}' ||" not in plain and "LIST(" in plain, plain  # a DOUBLE is listed as it is


@pytest.mark.parametrize("sql,caps", DISTINCT_SHAPES)
def test_count_distinct_over_colliding_text_values_is_the_bounded_truth(keys: list[str], sql: str,
                                                                        caps: dict[str, Any]) -> None:
    """200 people with the values 'k0'..'k6' and one person holding 400 colliding values: 407 distinct values."""
    x = [f"k{i % 7}" for i in range(200)] + keys
    uid = np.concatenate([np.arange(200), np.full(len(keys), 10**6)])
    s = _distinct_session(uid, x, caps)
    try:
        rows = s.query(sql, epsilon=1.0, delta=1e-6).table.to_pylist()
    finally:
        s.close()
    assert [r["d"] for r in rows] == [407]
