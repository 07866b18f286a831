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
* a key also read as a value (a condition across inputs over ``c.id``): the key is carried as it is with every
  joined row, so these still fail after their charge only with that customer (strict xfail, open: the condition
  needs the text).

Detection: the outcome (answered, or the class of the failure), no wall clock. Each case has a control that answers
without the customer and with the same customer under a one-character id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.engine import _duckdb_native as native

PEOPLE, PERSON_ROWS, ID = 2_000, 6_000, 60_000
LIMITS = {"memory_limit": "100MB", "max_temp_directory_size": "100MB", "threads": 1}
PERSONS = {"without": None, "short": "P", "long": "P" * ID}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("round43")
    for name, person in PERSONS.items():
        ids, cid = [f"u{i}" for i in range(PEOPLE)], [f"u{i % PEOPLE}" for i in range(2 * PEOPLE)]
        if person is not None:
            ids.append(person)
            cid += [person] * PERSON_ROWS
        oid = pa.array(range(len(cid)), pa.int64())
        pq.write_table(pa.table({"id": ids, "seg": [f"s{i % 3}" for i in range(len(ids))]}), d / f"c_{name}.parquet")
        pq.write_table(pa.table({"oid": oid, "cid": cid, "amt": [1.0] * len(cid)}), d / f"o_{name}.parquet")
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
                   degree_bounds={"cid": 2}, columns={"amt": {"bounds": (0, 1)}}, allow_conditional_sampling=True)
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
]


@pytest.mark.parametrize(("sql", "options"), LOOKED_UP + COUNTED + READ_AS_VALUE)
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


@pytest.mark.xfail(strict=True, reason="open: a text key also read as a value (a condition across inputs) "
                                       "is carried as its text with every joined row, so one customer's repeated long "
                                       "id fails the query after its charge under the owner's memory limit")
@pytest.mark.parametrize(("sql", "options"), READ_AS_VALUE)
def test_a_key_read_as_a_value_answers_with_one_customers_repeated_long_id(files: Path, sql: str,
                                                                           options: dict[str, Any] | None) -> None:
    assert _outcome(files, "long", sql, options) == "answered"
