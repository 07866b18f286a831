"""Text and BLOB join keys carried as their salted digest (``dpsql.rewrite.joins.key_digests``): what still carries
one person's long text, and whether every slot spells one person alike.

Neighbouring datasets (without and with one customer whose id is a 60 000-character text repeated over 6 000
orders: a few kB of Parquet, 360 MB decoded), the same query, the same observable outcome under the owner's
``memory_limit = 100MB`` (``tests/test_adversary_round41.py`` has the one-table and direct-join cases):

* a chain looked up through a key (``SELECT COUNT(*) FROM items``, items -> orders by an integer key, orders ->
  customer by the text id): the lookup's hop read the orders' DISTINCT (key, next value) pairs with the next value,
  the customer's text, as it is, and spelled the person's id from its digest only at the end. One customer's 6 000
  orders made 6 000 pairs of 60 000 characters each, and the query failed after its charge only with that
  customer. Each hop now carries a text or BLOB next value as its digest (the next hop reads its key as a digest).
* ``COUNT(o.cid)`` of a key: the key was carried as it is (``key_digests`` took COUNT's argument for a value read),
  and the query failed after its charge only with that customer. COUNT of a bare column reads only whether it is
  NULL, and so does its digest: such a key is now carried as its digest.
* a key also read by a condition across inputs (``WHERE (c.id <> 'zz' OR o.amt > 0)``): the key was carried as it
  is with every joined row, and the query failed after its charge only with that customer. Each part of such a
  condition that reads one input only, a key among its columns, is now computed as a BOOLEAN column by that
  input's projection (``joins.hoisted``), before the key becomes its digest, and the condition reads that column.
* a GROUP BY key that is the join key, with a public key set (``GROUP BY o.cid``, a declared domain): carried as
  its text, the query failed after its charge only with that customer. It is now carried as its digest and matched
  to the digest of its key set's text (``joins.matched_keys``), and the key set spells the released key.
* a key inside a part of such a condition that is not boolean (``WHERE length(c.id) > o.amt``): carried as it is,
  the query failed after its charge only with that customer. The largest part over one input that reads the key and
  has a type of fixed width (``length(c.id)``, BIGINT) is now such a column of that type.
* a key inside SUM's argument (``SUM(LEAST(GREATEST(length(o.cid), 0), 10))``): the same, and the same columns.
* a key compared with another input's key (``c.id <> o.cid OR o.amt > 0``): the same; the comparison now reads
  both keys' digests (``joins.key_comparisons``).
  Still carried as text (``docs/threat_model.md``): a key ordered against another input's column (``c.id < o.cid``).
* a LEFT lookup join's one-table statement reading one person's long private key as a value (``GROUP BY e.cc``, with
  a lookup column, with ``COUNT(DISTINCT e.day)`` or a SUM) failed after the charge only with that person, while
  ``COUNT(*)`` and a condition over the lookup's key answered: the bounded query read the joined relation, one CTE,
  two or three times, and DuckDB computed and held it, every joined row with its key's text. A bounded query that
  reads it more than once now reads the relation itself at each read (``dpsql.mechanisms.lookup.LookupJoin``), as
  a table's view: the rows stream, the key compact from the rows on. ``COUNT(DISTINCT e.cc)`` failed alike; a key
  the statement only counts is carried as the text of its digest (``dpsql.mechanisms.lookup.counted_only``).

Detection: the outcome (answered, or the class of the failure), no wall clock. Each case has a control that answers
without the customer and with the same customer under a one-character id.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
from sqlglot import exp

import dpsql
import dpsql.rewrite.joins as rj
from dpsql.engine import _duckdb_native as native
from dpsql.engine.base import text_read_memory
from dpsql.rewrite.bound import SALT_PLACEHOLDER
from dpsql.rewrite.joins import key_digests
from dpsql.testing import use_noise, zero_noise
from tests._neighbour import repeated_text, write_decoded_parquet

#: one person's 360 MB of decoded id, in texts within the longest cap a 100 MB limit holds at one thread for two text
#: columns of a source read at once (4 069 bytes, dpsql.engine.base.text_read_memory; the findings below were made
#: with 6 000 rows of 60 000 characters)
PEOPLE, PERSON_ROWS, ID = 2_000, 90_000, 4_000
LIMITS = {"memory_limit": "100MB", "max_temp_directory_size": "100MB", "threads": 1,
          "max_text_bytes": 100 * 10**6 // text_read_memory(1, 2)}
PERSONS = {"without": None, "short": "P", "long": "P" * ID}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("round43")
    for name, person in PERSONS.items():
        ids = [f"u{i}" for i in range(PEOPLE)] + ([person] if person is not None else [])
        # the person's orders' text not decoded first (360 MB): the same file (tests/_neighbour.py)
        cid = repeated_text([f"u{i % PEOPLE}" for i in range(2 * PEOPLE)], person, PERSON_ROWS)
        oid = pa.array(range(len(cid)), pa.int64())
        pq.write_table(pa.table({"id": ids, "seg": [f"s{i % 3}" for i in range(len(ids))]}), d / f"c_{name}.parquet")
        write_decoded_parquet(d / f"o_{name}.parquet", pa.table({"oid": oid, "cid": cid, "amt": [1.0] * len(cid)}))
        pq.write_table(pa.table({"oid": oid, "tag": [str(i) for i in range(len(cid))]}), d / f"i_{name}.parquet")
    return d


def _outcome(d: Path, name: str, sql: str, options: dict[str, Any] | None = None) -> str:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine=LIMITS)
    patch = pytest.MonkeyPatch()
    # the files were written just now: read them with DuckDB's own reader, as an owner's settled files are
    patch.setattr(native, "SETTLE_SECONDS", 0.0)
    try:
        s.register("customer", str(d / f"c_{name}.parquet"), privacy_unit="id",
                   columns={"seg": {"domain": ["s0", "s1", "s2"]}}, allow_conditional_sampling=True)
        s.register("orders", str(d / f"o_{name}.parquet"), references={"cid": "customer.id"},
                   degree_bounds={"cid": 2}, columns={"amt": {"bounds": (0, 1)}, "cid": {"domain": ["u1", "u2"]}},
                   allow_conditional_sampling=True)
        s.register("items", str(d / f"i_{name}.parquet"), references={"oid": "orders.oid"},
                   degree_bounds={"oid": 2}, allow_conditional_sampling=True)
        try:
            s.query(sql, epsilon=1.0, delta=1e-6, options=options)
            return "answered"
        except dpsql.errors.DPSQLError as e:
            return type(e).__name__
    finally:
        s.close()
        patch.undo()


J = "FROM customer c JOIN orders o ON c.id = o.cid"
LOOKED_UP = [("SELECT COUNT(*) FROM items", None), ("SELECT COUNT(*) FROM items", {"mechanism": "dp_s4s", "q": 0.5})]
COUNTED = [
    (f"SELECT COUNT(o.cid) {J}", None),
    (f"SELECT COUNT(o.cid) {J}", {"mechanism": "r2t"}),
    (f"SELECT c.seg, COUNT(o.cid) {J} GROUP BY c.seg", None),
    (f"SELECT COUNT(c.id), SUM(o.amt) {J}", None),
]
READ_AS_VALUE = [
    (f"SELECT COUNT(*) {J} WHERE (c.id <> 'zz' OR o.amt > 0)", None),
    (f"SELECT COUNT(*) {J} WHERE (c.id <> 'zz' OR o.amt > 0)", {"mechanism": "r2t"}),
    (f"SELECT c.seg, COUNT(*) {J} WHERE (c.id <> 'zz' OR o.amt > 0) GROUP BY c.seg", None),
    (f"SELECT COUNT(*) {J} WHERE NOT (o.cid LIKE '%zz%' AND c.seg = 's1')", {"mechanism": "r2t"}),
    (f"SELECT SUM(o.amt) {J} WHERE CASE WHEN c.id IN ('u1', 'u2') THEN o.amt > 0.5 ELSE o.cid IS NOT NULL END", None),
    # a GROUP BY key that is the join key, with a declared domain
    (f"SELECT o.cid, COUNT(*) {J} GROUP BY o.cid", None),
    (f"SELECT o.cid, COUNT(*) {J} GROUP BY o.cid", {"q": 0.5}),
]
#: a key read inside a part of a condition across inputs that is not boolean: the largest part over one input that
#: reads the key and has a fixed-width type (``length(c.id)``) is computed by that input's projection
NOT_BOOLEAN = [
    (f"SELECT COUNT(*) {J} WHERE length(c.id) > o.amt", None),
    (f"SELECT COUNT(*) {J} WHERE length(c.id) > o.amt", {"mechanism": "r2t"}),
    (f"SELECT c.seg, COUNT(*) {J} WHERE strpos(c.id, 'u') + o.oid > 0 GROUP BY c.seg", None),
]


#: a key inside a value aggregate's argument: the largest part over one input that reads the key and has a type of
#: fixed width (``length(o.cid)``) is computed by that input's projection
SUMMED = [
    (f"SELECT SUM(LEAST(GREATEST(length(o.cid), 0), 10)) {J}", None),
    (f"SELECT SUM(LEAST(GREATEST(length(o.cid), 0), 10)) {J}", {"mechanism": "r2t"}),
    (f"SELECT c.seg, SUM(LEAST(GREATEST(length(c.id) - o.amt, 0), 5)) {J} GROUP BY c.seg", None),
    (f"SELECT COUNT(*), SUM(LEAST(GREATEST(length(o.cid), 0), 10)) {J}", None),
]

#: a key compared with another input's key (equal or not, distinct or not): the comparison reads both digests
COMPARED = [
    (f"SELECT COUNT(*) {J} WHERE (c.id <> o.cid OR o.amt > 0)", None),
    (f"SELECT COUNT(*) {J} WHERE (c.id <> o.cid OR o.amt > 0)", {"mechanism": "r2t"}),
    (f"SELECT c.seg, COUNT(*) {J} WHERE (c.id IS NOT DISTINCT FROM o.cid OR c.seg = 's1') GROUP BY c.seg", None),
]


@pytest.mark.parametrize(("sql", "options"), LOOKED_UP + COUNTED + READ_AS_VALUE + NOT_BOOLEAN + SUMMED + COMPARED)
def test_control_answers_without_the_customer_and_with_a_short_id(files: Path, sql: str,
                                                                  options: dict[str, Any] | None) -> None:
    assert _outcome(files, "without", sql, options) == "answered"
    assert _outcome(files, "short", sql, options) == "answered"


@pytest.mark.parametrize(("sql", "options"), LOOKED_UP)
def test_a_looked_up_chain_answers_with_one_customers_repeated_long_id(files: Path, sql: str,
                                                                       options: dict[str, Any] | None) -> None:
    assert _outcome(files, "long", sql, options) == "answered"


@pytest.mark.parametrize(("sql", "options"), COUNTED)
def test_a_counted_key_answers_with_one_customers_repeated_long_id(files: Path, sql: str,
                                                                   options: dict[str, Any] | None) -> None:
    """COUNT(key) reads only whether the key is NULL: the key is carried as its digest, NULL exactly where it is."""
    assert _outcome(files, "long", sql, options) == "answered"


@pytest.mark.parametrize(("sql", "options"), READ_AS_VALUE)
def test_a_key_read_as_a_value_answers_with_one_customers_repeated_long_id(files: Path, sql: str,
                                                                           options: dict[str, Any] | None) -> None:
    """The condition's part over the customer alone (``c.id <> 'zz'``) is a BOOLEAN column of the customer's
    projection, so the condition reads the key only through it and the key is carried as its digest."""
    assert _outcome(files, "long", sql, options) == "answered"


# -- the text of a digest on DuckDB ------------------------------------------------------------------------------

SALT = "a fixed salt"


def _text_join_session() -> dpsql.Session:
    """customer (text ids) <- orders (text keys) <- items; edges between customers: looked-up and direct slots."""
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9))
    use_noise(s, zero_noise(0))
    ids = [f"c{i}" for i in range(20)] + ["C0", "c0 ", "e\u0301", "\u00e9"]
    oid = [f"o{i}" for i in range(60)]
    s.register("customer", pa.table({"id": ids}), privacy_unit="id", allow_conditional_sampling=True)
    s.register("orders", pa.table({"oid": oid, "cid": [ids[i % len(ids)] for i in range(60)]}),
               references={"cid": "customer.id"}, degree_bounds={"cid": 8}, allow_conditional_sampling=True)
    s.register("items", pa.table({"oid": [oid[i % 60] for i in range(150)] + ["gone", None]}),
               references={"oid": "orders.oid"}, degree_bounds={"oid": 4}, allow_conditional_sampling=True)
    s.register("edges", pa.table({"src": [ids[i % len(ids)] for i in range(50)], "dst": [ids[(3 * i) % len(ids)] for i in range(50)],
                                  "w": [i % 3 for i in range(50)]}),
               references={"src": "customer.id", "dst": "customer.id"}, degree_bounds={"src": 8, "dst": 8},
               allow_conditional_sampling=True)
    return s


def _hex_id(table: str, value: str) -> str:
    return f"{table}:" + duckdb.sql(f"SELECT HEX(MD5_NUMBER('{SALT}' || ?))", params=[value]).fetchall()[0][0]


@pytest.mark.parametrize(("sql", "options"), [
    ("SELECT COUNT(*) FROM items", None),
    ("SELECT COUNT(*) FROM edges e JOIN customer a ON e.src = a.id JOIN customer b ON e.dst = b.id", {"q": 0.5}),
    ("SELECT COUNT(*) FROM edges e JOIN customer a ON e.src = a.id JOIN customer b ON e.dst = b.id "
     "WHERE (a.id <> 'x' OR e.w > 1)", {"q": 0.5}),
])
def test_digests_are_spelled_in_hexadecimal_on_duckdb(sql: str, options: dict[str, Any] | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB's digest of a text key is ``MD5_NUMBER``, a 128-bit unsigned integer, which DuckDB converts to decimal
    text by 128-bit long divisions (about 85 microseconds a value): spelling every person id, synthetic user and
    keyed tuple identity by ``CAST(digest AS VARCHAR)`` made a lookup join of 1M line items over text keys take
    60 s instead of 5 s. They are spelled by ``HEX``: every id below is ``<table>:HEX(MD5_NUMBER(salt || text))``,
    the same person alike in every slot (digested or not), and no digest is cast to text."""
    digested: set[str] = set()

    def spy(*a: Any, **k: Any) -> frozenset[str]:
        out = key_digests(*a, **k)
        digested.update(out)
        return out

    monkeypatch.setattr(rj, "key_digests", spy)
    s = _text_join_session()
    try:
        bounded = s.explain(sql, epsilon=1.0, delta=1e-6, options=options).bounded_sql.replace(SALT_PLACEHOLDER, SALT)
        rows = s._engine.connection.sql(bounded).fetchall()
    finally:
        s.close()
    people = {_hex_id("customer", c) for c in [f"c{i}" for i in range(20)] + ["C0", "c0 ", "e\u0301", "\u00e9"]}
    seen: set[str] = set()
    for r in rows:
        for u in r[1:]:
            seen.update(u if isinstance(u, list) else [] if u is None else [u])  # (a NULL reference reaches nobody)
    dangling = {_hex_id("~orders.oid", "gone")}
    assert seen and seen <= people | dangling, sorted(seen - people - dangling)[:3]
    assert len(seen & people) > 10
    assert digested
    tree = sqlglot.parse_one(bounded, read="duckdb")
    for cast in tree.find_all(exp.Cast):  # no digest computed here, nor a digested column, converted to text
        assert not (isinstance(cast.this, exp.Anonymous) and cast.this.name.upper() == "MD5_NUMBER"), cast.sql("duckdb")
        assert not (isinstance(cast.this, exp.Column) and cast.this.name in digested), cast.sql("duckdb")
    if options is not None:  # the keyed sample's identity spells the digested columns it carries
        (tid,) = [a for a in tree.find_all(exp.Alias) if a.alias == "__tid"]
        assert {h.this.name for h in tid.find_all(exp.Hex)} & digested


@pytest.mark.parametrize(("sql", "options"), NOT_BOOLEAN)
def test_a_key_inside_a_part_that_is_not_boolean_answers_with_one_customers_repeated_long_id(
        files: Path, sql: str, options: dict[str, Any] | None) -> None:
    """``length(c.id)`` (BIGINT) is a column of the customer's projection, computed before the key becomes its
    digest, so the condition reads the key only through it."""
    assert _outcome(files, "long", sql, options) == "answered"


@pytest.mark.parametrize(("sql", "options"), SUMMED)
def test_a_key_inside_a_sums_argument_answers_with_one_customers_repeated_long_id(
        files: Path, sql: str, options: dict[str, Any] | None) -> None:
    """``length(o.cid)`` (BIGINT) is a column of the orders' projection, computed before the key becomes its digest,
    so the aggregate reads the key only through it."""
    assert _outcome(files, "long", sql, options) == "answered"


@pytest.mark.parametrize(("sql", "options"), COMPARED)
def test_a_key_compared_with_another_inputs_key_answers_with_one_customers_repeated_long_id(
        files: Path, sql: str, options: dict[str, Any] | None) -> None:
    """``c.id <> o.cid`` compares the two keys' digests (one salt, equal exactly where the texts are), so neither key
    is carried as its text."""
    assert _outcome(files, "long", sql, options) == "answered"


# -- a lookup join's one-table statement ---------------------------------------------------------------------------

LOOKUP = "FROM events e LEFT JOIN codes c ON e.cc = c.code"
#: a private key read as a value by the one-table statement of a LEFT lookup join (one person's 6 000 events under one
#: 60 000-character code that matches no lookup row, so the LEFT JOIN keeps them)
LOOKUP_VALUES = [
    (f"SELECT e.cc, COUNT(*) {LOOKUP} GROUP BY e.cc", None),
    (f"SELECT e.cc, c.region, COUNT(*) {LOOKUP} GROUP BY e.cc, c.region", None),
    (f"SELECT e.cc, COUNT(DISTINCT e.day) {LOOKUP} WHERE e.day > 3 GROUP BY e.cc", None),
    (f"SELECT e.cc, SUM(LEAST(GREATEST(e.day, 0), 40)) {LOOKUP} GROUP BY e.cc", None),
    (f"SELECT e.cc, COUNT(*) {LOOKUP} WHERE (c.code IS NULL OR e.day > 30) GROUP BY e.cc", None),
]
#: the same person, the key read only as a key, or only counted (carried as the text of its digest:
#: ``lookup.counted_only``), or on one table: these answer
LOOKUP_ANSWERED = [
    (f"SELECT COUNT(*) {LOOKUP}", None),
    (f"SELECT c.region, COUNT(DISTINCT e.cc) {LOOKUP} GROUP BY c.region", None),
    (f"SELECT COUNT(DISTINCT e.cc), COUNT(e.cc) {LOOKUP}", None),
    (f"SELECT c.region, COUNT(*) {LOOKUP} WHERE (c.code IS NULL OR e.day > 30) GROUP BY c.region", None),
    ("SELECT cc, COUNT(*) FROM events GROUP BY cc", None),
    ("SELECT COUNT(DISTINCT cc) FROM events", None),
]


@pytest.fixture(scope="module")
def lookup_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("round43_lookup")
    for name, person in PERSONS.items():
        uid = list(range(2 * PEOPLE)) + ([10**6] * PERSON_ROWS if person is not None else [])
        cc = repeated_text([f"c{i % 50}" for i in range(2 * PEOPLE)], person, PERSON_ROWS)  # (as the orders' cid)
        # (a DATE column the queries never read: without it DuckDB reads these files in a way that answered)
        days = [dt.date(2020 + i % 3, 1, 1) for i in range(len(uid))]
        write_decoded_parquet(d / f"e_{name}.parquet",
                              pa.table({"uid": uid, "cc": cc, "day": [i % 40 for i in range(len(uid))], "d": days}))
    pq.write_table(pa.table({"code": [f"c{i}" for i in range(50)], "region": [f"r{i % 3}" for i in range(50)]}),
                   d / "codes.parquet")
    return d


def _lookup_outcome(d: Path, name: str, sql: str) -> str:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine=LIMITS)
    patch = pytest.MonkeyPatch()
    patch.setattr(native, "SETTLE_SECONDS", 0.0)
    try:
        s.register("codes", str(d / "codes.parquet"), public=True, columns={"region": {"domain": ["r0", "r1", "r2"]}})
        s.register("events", str(d / f"e_{name}.parquet"), privacy_unit="uid", references={"cc": "codes.code"})
        try:
            s.query(sql, epsilon=1.0, delta=1e-6)
            return "answered"
        except dpsql.errors.DPSQLError as e:
            return type(e).__name__
    finally:
        s.close()
        patch.undo()


@pytest.mark.parametrize(("sql", "options"), LOOKUP_VALUES + LOOKUP_ANSWERED)
def test_control_lookup_joins_answer_without_the_person_and_with_a_short_code(lookup_files: Path, sql: str,
                                                                              options: None) -> None:
    assert _lookup_outcome(lookup_files, "without", sql) == "answered"
    assert _lookup_outcome(lookup_files, "short", sql) == "answered"


@pytest.mark.parametrize(("sql", "options"), LOOKUP_ANSWERED)
def test_a_lookup_join_reading_the_key_as_a_key_answers_with_one_persons_long_code(lookup_files: Path, sql: str,
                                                                                    options: None) -> None:
    assert _lookup_outcome(lookup_files, "long", sql) == "answered"


@pytest.mark.parametrize(("sql", "options"), LOOKUP_VALUES)
def test_a_lookup_join_reading_the_key_as_a_value_answers_with_one_persons_long_code(lookup_files: Path, sql: str,
                                                                                      options: None) -> None:
    assert _lookup_outcome(lookup_files, "long", sql) == "answered"
