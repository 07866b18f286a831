"""Counts of text keys: the group cap C_u over the rows themselves (``dpsql.rewrite.bound.rows_group_cap``).

A text key of unknown domain is grouped with a person's other keys before the group cap, in the pairs'
``DISTINCT``, so that grouping also goes by the spread, the keyed hash of the key's salted text, which DuckDB's
hash reads through ``MD5_NUMBER`` (``tests/test_adversary_text_hash_differentials.py``): one digest per row, the
largest cost of ``SELECT url, country, COUNT(*) ... GROUP BY url, country`` (``benchmarks/peers.py`` Q2). For
counts of units only (one row per (person, group)), with C_u at most ``KEY_SPREAD_ABOVE``, the group cap's
window now ranks each person's distinct groups over the rows (``DENSE_RANK``: a sort within the person, no hash
table of keys), and the ``DISTINCT`` after it sees at most C_u keys per person.

That window sorted each person's rows with their keys' text, so one person's 6 000 rows of one 60 000-character
key (``tests/test_adversary_dictionary_text.py``) exhausted a 100 MB memory limit only when present. The cap
over rows is now one hash aggregate per (person, keyed hash), an integer pair no one can steer without the salt,
holding the smallest and largest value of each key (``bound._groups_by_hash``), then a window over those groups:
no row is carried with its text. A (person, hash) holding two or more groups (keys crafted to share DuckDB's
64-bit hash; by chance about 2^-64 per pair) is dropped. These tests pin the plan, and that it keeps exactly the
groups the pairs plan keeps under the same salt (so it inherits that plan's uniform choice), on text, NULL and
empty keys and keys outside a coded domain, but for the crafted person's keys of one DuckDB hash and keys
aligned to 8 hashes under any salt, which are dropped (that person keeps at most C_u of their other groups).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from test_bounding import bounded_sql, keyed, plan_for, spec_for

from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps
from dpsql.engine.portable import PortableDuckDBOps
from dpsql.plan import ir
from dpsql.rewrite import bound
from dpsql.rewrite.bound import Caps, source_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from hash_collisions import aligned_strings, colliding_strings  # noqa: E402

DOMAIN = tuple(f"c{i}" for i in range(6))


def _events(seed: int, n: int = 6000) -> pa.Table:
    """300 people, most with more than C_u URLs; some URLs NULL or empty, some countries outside the domain
    or NULL; one person holding 40 keys of one DuckDB hash and 40 keys aligned to 8 hashes under any salt."""
    gen = np.random.default_rng(seed)
    users = gen.integers(0, 300, n)
    url = gen.choice([f"u{i}" for i in range(60)] + [""], n).astype(object)
    url[gen.random(n) < 0.03] = None
    country = gen.choice([*DOMAIN, "C1", "x"], n, p=[0.15] * 6 + [0.05, 0.05]).astype(object)
    country[gen.random(n) < 0.03] = None
    crafted = colliding_strings(40) + aligned_strings(40, blocks=4)
    users = np.concatenate([users, np.full(len(crafted), 10**6)])
    url = np.concatenate([url, np.array(crafted, dtype=object)])
    country = np.concatenate([country, np.array(["c0"] * len(crafted), dtype=object)])
    return pa.table({"user_id": users, "url": pa.array(url.tolist(), pa.string()),
                     "country": pa.array(country.tolist(), pa.string()), "amount": np.ones(len(users))})


def _plan(sql: str, data: pa.Table) -> ir.QueryPlan:
    return plan_for(sql, spec_for("events", data, domains={"country": DOMAIN}, bounds={"amount": (0, 1)}))


def _run(plan: ir.QueryPlan, caps: Caps, data: pa.Table, ops: Any, salt: str,
         collation: str | None = None) -> tuple[str, dict[Any, Any]]:
    sql = bounded_sql(plan, caps, salt, ops=ops)
    con = duckdb.connect()
    try:
        if collation is not None:
            con.execute(f"SET default_collation = '{collation}'")
        con.register(source_name(plan.table.name), data)
        return sql, keyed(plan, con.sql(sql).to_arrow_table())
    finally:
        con.close()


QUERIES = [
    ("SELECT url, COUNT(*) FROM events GROUP BY url", Caps(1, 1)),
    ("SELECT url, COUNT(*) FROM events GROUP BY url", Caps(3, 1)),
    ("SELECT url, country, COUNT(*) FROM events GROUP BY url, country", Caps(2, 1)),  # country coded
    ("SELECT country, url, COUNT(*) AS n FROM events GROUP BY country, url", Caps(5, 1)),
]


@pytest.mark.parametrize("ops", [DuckDBOps(), SaltedDuckDBOps()], ids=type)
@pytest.mark.parametrize(("sql", "caps"), QUERIES)
def test_the_group_cap_over_rows_keeps_what_the_pairs_plan_keeps(sql: str, caps: Caps, ops: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    data = _events(1)
    plan = _plan(sql, data)
    crafted = set(colliding_strings(40) + aligned_strings(40, blocks=4))

    def honest(out: dict[Any, Any]) -> dict[Any, Any]:
        return {k: r for k, r in out.items() if not set(k) & crafted}

    kept: dict[str, Any] = {}
    for salt in ("s1", "s2", "0f1e2d3c4b5a69788796a5b4c3d2e1f0"):
        rows_sql, over_rows = _run(plan, caps, data, ops, salt)
        kept[salt] = over_rows
        with monkeypatch.context() as m:
            m.setattr(bound, "rows_group_cap", lambda *a: False)
            pairs_sql, pairs = _run(plan, caps, data, ops, salt)
        assert "DENSE_RANK()" in rows_sql and "MD5_NUMBER" not in rows_sql and "__spread" not in rows_sql, rows_sql
        assert "GROUP BY __unit, __ghash" in rows_sql and "SELECT DISTINCT" not in rows_sql, rows_sql  # a group per hash
        assert "MD5_NUMBER" in pairs_sql and "DENSE_RANK()" not in pairs_sql  # the control: the pairs plan ran
        assert honest(over_rows) == honest(pairs) and honest(pairs) != pairs  # (the crafted person's, dropped)
        assert sum(r["__users"] for k, r in over_rows.items() if set(k) & crafted) <= caps.max_groups_per_unit
        users = sum(r["__users"] for r in over_rows.values())
        assert 0 < users <= caps.max_groups_per_unit * 301
    # negative control: another salt keeps other groups (the groups each salt kept above, not run again)
    assert kept["s1"] != kept["s2"]


def test_the_crafted_persons_keys_are_capped_and_outside_keys_take_no_place() -> None:
    """The crafted person's 40 keys of one DuckDB hash share one keyed hash under every salt: that (person, hash)
    holds 40 groups and is dropped; their 40 keys aligned to at most 8 hashes likewise, but for a hash that holds
    one of them. The person keeps at most C_u groups; keys outside the coded domain take no place."""
    data = _events(2)
    plan = _plan("SELECT url, country, COUNT(*) FROM events GROUP BY url, country", data)
    for salt in ("s1", "s2", "s3"):
        _, out = _run(plan, Caps(2, 1), data, DuckDBOps(), salt)
        kept = {url for url, _ in out} & set(colliding_strings(40) + aligned_strings(40, blocks=4))
        assert len(kept) <= 2 and not kept & set(colliding_strings(40)), kept
        assert all(c in DOMAIN for _, c in out)


@pytest.mark.parametrize(("sql", "caps"), QUERIES)
def test_no_row_is_carried_through_a_window(sql: str, caps: Caps) -> None:
    """The rows reach hash aggregates per (person, keyed hash) only, keys outside a coded domain filtered before
    them, and the one window ranks (person, hash) groups by the hash. With C_u = 1 the first hashes are ranked over
    integers alone, then the rows of those hashes (a second read, joined on them) reach the aggregate of texts."""
    data = _events(4)
    flat = " ".join(bounded_sql(_plan(sql, data), caps, "s1").split())
    n = f"{caps.max_groups_per_unit:g}"
    assert flat.count(" OVER (") == 1, flat
    first = caps.max_groups_per_unit <= bound.INTEGERS_FIRST_MAX
    if first:
        assert ("AS __all_hashes GROUP BY __unit, __ghash) AS __hashes QUALIFY DENSE_RANK() OVER (PARTITION BY __unit "
                f"ORDER BY __ghash) <= {n} UNION ALL SELECT NULL AS __unit, NULL AS __ghash) AS __first_hashes") in flat, flat
        assert re.search(r"\) AS __kept_hashes GROUP BY __unit, __ghash HAVING ", flat), flat
    else:
        assert re.search(r"\) AS __r GROUP BY __unit, __ghash HAVING ", flat), flat
        assert f"AS __one_group QUALIFY DENSE_RANK() OVER (PARTITION BY __unit ORDER BY __ghash) <= {n})" in flat, flat
    if "country" in sql:  # the coded key's NULL (outside the domain) is filtered before the aggregates
        assert len(re.findall(r"WHERE NOT __k\d IS NULL\) AS (?:__all_hashes|__r)\b", flat)) == 1 + first, flat


@pytest.mark.parametrize(("sql", "caps", "ops"), [
    ("SELECT url, SUM(amount) FROM events GROUP BY url", Caps(2, 1), DuckDBOps()),  # values: a row per pair
    ("SELECT url, COUNT(*) FROM events GROUP BY url", Caps(2, 3), DuckDBOps()),  # k = 3: counts per pair
    ("SELECT url, COUNT(*) FROM events GROUP BY url", Caps(65, 1), DuckDBOps()),  # C_u above KEY_SPREAD_ABOVE
    ("SELECT url, COUNT(*) FROM events GROUP BY url", Caps(2, 1, 4), DuckDBOps()),  # a row cap L
    ("SELECT country, COUNT(*) FROM events GROUP BY country", Caps(2, 1), DuckDBOps()),  # coded only
    ("SELECT user_id % 7 AS g, COUNT(*) FROM events GROUP BY user_id % 7", Caps(2, 1), DuckDBOps()),  # an integer
    ("SELECT url, COUNT(*) FROM events GROUP BY url", Caps(2, 1), PortableDuckDBOps()),  # SHA-256 keyed hash
])
def test_other_shapes_keep_the_pairs_plan(sql: str, caps: Caps, ops: Any) -> None:
    data = _events(3, n=300)
    rendered = bounded_sql(_plan(sql, data), caps, "s1", ops=ops)
    assert "DENSE_RANK()" not in rendered, rendered


def test_a_text_key_with_an_uncoded_domain_keeps_the_pairs_plan() -> None:
    class TextKeys(DuckDBOps):
        coded_domain_max = 0

    data = _events(3, n=300)
    rendered = bounded_sql(_plan("SELECT url, country, COUNT(*) FROM events GROUP BY url, country", data),
                           Caps(2, 1), "s1", ops=TextKeys())
    assert "DENSE_RANK()" not in rendered and "MD5_NUMBER" in rendered, rendered


@pytest.mark.parametrize("cap", [3, 1])  # (C_u = 1: the hashes ranked over integers first, the rows read twice)
def test_the_group_cap_over_rows_spills_under_a_small_memory_limit(tmp_path: Any, cap: int) -> None:
    """2M rows, 200k people of 5 URLs each twice, C_u = 3 and 1, one thread under 60 MB: the aggregates and the
    window spill and the count completes (every person keeps C_u groups); the same query without a memory limit is
    the reference."""
    schema = pa.table({"user_id": pa.array([1], pa.int64()), "url": pa.array(["u"], pa.string())})
    plan = plan_for("SELECT url, COUNT(*) FROM events GROUP BY url", spec_for("events", schema))
    sql = bounded_sql(plan, Caps(cap, 1), "s1")
    assert "DENSE_RANK()" in sql and "MD5_NUMBER" not in sql

    def run(limit: str | None) -> list[tuple[Any, ...]]:
        con = duckdb.connect()
        try:
            con.execute("SET threads = 1")
            con.execute(f"SET temp_directory = '{tmp_path / str(limit)}'")
            con.execute(f"CREATE TABLE {source_name(plan.table.name)} AS SELECT i // 10 AS user_id, "
                        "'https://example.org/a-long-enough-path/' || (i % 5) AS url FROM range(2000000) t(i)")
            if limit is not None:
                con.execute(f"SET memory_limit = '{limit}'")
                con.execute("SET preserve_insertion_order = false")
            return sorted(con.sql(f"SELECT SUM(__users), COUNT(*) FROM ({sql})").fetchall())
        finally:
            con.close()

    assert run("60MB") == run(None) == [(200000 * cap, 5)]


@pytest.mark.parametrize("collation", ["nocase", "noaccent.nocase", "nfc"])
def test_spellings_equal_under_a_connections_collation_stay_distinct_groups(collation: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """On a caller's connection whose default collation makes 'US' and 'us' (or NFC and NFD) equal, they stay
    two groups of a person, peers of no other group in the window, and the rows plan keeps what the pairs
    plan keeps."""
    n = 400
    data = pa.table({"user_id": np.repeat(np.arange(n), 4), "url": ["US", "us", "\u00e9", "e\u0301"] * n,
                     "country": ["c0"] * (4 * n), "amount": np.ones(4 * n)})
    plan = _plan("SELECT url, COUNT(*) FROM events GROUP BY url", data)
    for caps in (Caps(1, 1), Caps(3, 1)):
        _, over_rows = _run(plan, caps, data, SaltedDuckDBOps(), "s1", collation)
        with monkeypatch.context() as m:
            m.setattr(bound, "rows_group_cap", lambda *a: False)
            _, pairs = _run(plan, caps, data, SaltedDuckDBOps(), "s1", collation)
        assert over_rows == pairs
        assert len(over_rows) == 4 and sum(r["__users"] for r in over_rows.values()) == n * caps.max_groups_per_unit


def _kept_per_key(sql: str, data: pa.Table, table: str) -> dict[Any, int]:
    con = duckdb.connect()
    try:
        con.register(table, data)
        return {r[0]: int(r[1]) for r in con.sql(sql).fetchall()}
    finally:
        con.close()


def _uniform_halves(kept: dict[Any, int], people: int) -> bool:
    """Whether each of the four groups is kept by a count of people within Binomial(people, 1/2)'s central
    interval of probability 1 - 2.5e-7 (so all four pass together with probability at least 1 - 1e-6)."""
    from scipy.stats import binom

    lo, hi = binom.ppf(1.25e-7, people, 0.5), binom.isf(1.25e-7, people, 0.5)
    return len(kept) == 4 and all(lo <= kept[g] <= hi for g in kept)


def test_the_group_cap_over_rows_keeps_each_group_with_equal_probability_whatever_its_rows() -> None:
    """4000 people, each with the same four groups of 1, 2, 5 and 20 rows, C_u = 2: each person keeps a uniform
    2-subset, so each group is kept by Binomial(4000, 1/2) people, however many rows it has (one fixed salt: the
    keyed hash of (person, group) differs per person). The negative control ranks each person's groups by the
    smallest keyed hash of their rows (more rows, more draws, smaller minimum) and must fail the same check."""
    people = 4000
    mult = {"a": 1, "b": 2, "c": 5, "d": 20}
    urls = [g for g, m in mult.items() for _ in range(m)]
    data = pa.table({"user_id": np.repeat(np.arange(people, dtype=np.int64), len(urls)),
                     "url": pa.array(urls * people, pa.string()), "country": pa.array(["c0"] * (people * len(urls))),
                     "amount": np.ones(people * len(urls))})
    plan = _plan("SELECT url, COUNT(*) FROM events GROUP BY url", data)
    sql = bounded_sql(plan, Caps(2, 1), "uniform-salt-1")
    assert "DENSE_RANK()" in sql and "GROUP BY __unit, __ghash" in sql and "SELECT DISTINCT" not in sql
    kept = {k: v for k, v in _kept_per_key(sql, data, source_name(plan.table.name)).items()}
    assert sum(kept.values()) == 2 * people
    assert _uniform_halves(kept, people), kept
    control = ("SELECT url, COUNT(*) FROM (SELECT user_id, url, MIN(h) AS m FROM (SELECT user_id, url, "
               "HASH(XOR(HASH(user_id, url, ROW_NUMBER() OVER ()), HASH('uniform-salt-1'))) AS h FROM t) "
               "GROUP BY user_id, url QUALIFY ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY m, url) <= 2) GROUP BY url")
    biased = _kept_per_key(control, data, "t")
    assert sum(biased.values()) == 2 * people
    assert not _uniform_halves(biased, people), biased
