"""Text join keys carried as their salted digest (``dpsql.rewrite.joins.key_digests``) on Spark: the same digests
(``md5``'s hex on both), so the same capped rows, tuple identities, sample and people as DuckDB under the portable
keyed hash. Negative control: another salt samples other tuples. Skipped (with the reason) without pyspark/Java."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from _spark import comparable_session, require_spark
from test_join_key_digests import IDS, _tables
from test_spark_joins import canonical

import dpsql

require_spark()

#: the general case (two people per tuple, a keyed sample over tuple identities built from digests), a looked-up
#: chain (each hop's text key digested), a condition across inputs over a digested key and a grouped join key; the
#: other shapes' text keys take the same digests
QUERIES = {
    "chain_sampled": ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid JOIN item i ON o.oid = i.oid",
                      {"q": 0.5}),
    "lookup_sampled": ("SELECT COUNT(*) FROM item", {"q": 0.5}),
    # a condition across inputs read through the customer's BOOLEAN part (``joins.hoisted``), NULL for 'a'
    "condition_sampled": ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid "
                          "WHERE NOT (NULLIF(c.id, 'a') <> 'x' AND o.amt < 2)", {"q": 0.5}),
    # a condition across inputs read through the customer's BIGINT part ``length(c.id)`` (``joins.hoisted``)
    "length_sampled": ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid WHERE length(c.id) > o.amt",
                       {"q": 0.5}),
    # SUM's argument read through the orders' BIGINT part ``length(o.cid)`` (``joins.hoisted``)
    "sum_length_sampled": ("SELECT SUM(LEAST(GREATEST(length(o.cid), 0), 10)) FROM customer c JOIN orders o "
                           "ON c.id = o.cid", {"q": 0.5}),
    # two inputs' keys compared by their digests (``joins.key_comparisons``)
    "compared_sampled": ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid JOIN visit v ON c.id = v.cid "
                         "WHERE (o.cid <> v.cid OR o.amt > 1)", {"q": 0.5}),
    # a grouped join key matched to its declared domain by digest (``joins.matched_keys``)
    "grouped_key_sampled": ("SELECT o.cid, COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid GROUP BY o.cid",
                            {"mechanism": "dp_s4s_vector", "q": 0.5}),
}


def _session(kind: str, tables: dict[str, pa.Table]) -> dpsql.Session:
    s = comparable_session(kind, (1000.0, 0.5), 3)
    s.register("customer", tables["customer"], privacy_unit="id", allow_conditional_sampling=True)
    s.register("orders", tables["orders"], references={"cid": "customer.id"}, degree_bounds={"cid": 5},
               columns={"cid": {"domain": IDS[:6]}}, allow_conditional_sampling=True)
    s.register("item", tables["item"], references={"oid": "orders.oid"}, degree_bounds={"oid": 2},
               allow_conditional_sampling=True)
    s.register("visit", tables["visit"], references={"cid": "customer.id"}, degree_bounds={"cid": 2},
               allow_conditional_sampling=True)
    return s


@pytest.fixture(scope="module")
def bounded() -> dict[tuple[str, str, str], Any]:
    """Spark under one salt (its jobs are the slow part), DuckDB under both."""
    tables = _tables(IDS)
    out = {}
    for kind, salts in (("duckdb", ("salt one", "another salt")), ("spark", ("salt one",))):
        s = _session(kind, tables)
        try:
            for name, (sql, opts) in QUERIES.items():
                r = s._route(sql, 1.0, 1e-5, opts)
                for salt in salts:
                    out[(kind, name, salt)] = canonical(s._engine.fetch_arrow(
                        r.mechanism.bounded(r.calibration, salt, s._engine.ops)))
        finally:
            s.close()
    return out


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_text_key_joins_bound_alike_on_duckdb_and_spark(bounded: dict[tuple[str, str, str], Any], name: str) -> None:
    assert bounded[("duckdb", name, "salt one")], name
    assert bounded[("duckdb", name, "salt one")] == bounded[("spark", name, "salt one")], name


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_control_another_salt_samples_other_tuples(bounded: dict[tuple[str, str, str], Any], name: str) -> None:
    assert bounded[("duckdb", name, "another salt")] != bounded[("spark", name, "salt one")]
