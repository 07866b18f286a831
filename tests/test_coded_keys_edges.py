"""Text keys of small public domains carried as ``ENUM`` codes (``dpsql.rewrite.bound.coded_keys``)
and the per-unit mask for counts of units (``DuckDBOps.count_units_by_mask``), on hostile keys and
connections: the coded plan must keep exactly the groups the text plan keeps under the same salt.

* FINDING (fixed: ``DuckDBOps.domain_text`` and the mask's texts are ``COLLATE "binary"``): on a
  caller's connection with ``default_collation = 'nocase'`` (or ``nfc``, ``noaccent``) DuckDB's
  ``HASH`` of a text hashes its collation key, so a coded key's text 'US' hashed as 'us' for every
  unit and salt. A unit with both groups and C_u = 1 then always kept 'US' (the smaller code): 2000
  of 2000 units where the text plan keeps each spelling about half the time. The choice was no
  longer uniform (in the mask, the window over codes, the salted race of k = 1 and the salted
  numbering of k = 2).
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import binomtest
from test_bounding import _TextKeys, _WindowOverCodes, bounded_sql, keyed, plan_for, spec_for

from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps
from dpsql.plan import ir
from dpsql.rewrite.bound import Caps, source_name

NFC, NFD = "\u00e9", "e\u0301"


def _run(plan: ir.QueryPlan, caps: Caps, data: pa.Table, ops: Any, collation: str | None, salt: str = "s1") -> dict[Any, Any]:
    con = duckdb.connect()
    try:
        if collation is not None:
            con.execute(f"SET default_collation = '{collation}'")
        con.register(source_name(plan.table.name), data)
        return keyed(plan, con.sql(bounded_sql(plan, caps, salt, ops=ops)).to_arrow_table())
    finally:
        con.close()


@pytest.mark.parametrize("collation", [None, "nocase", "noaccent.nocase", "nfc"])
@pytest.mark.parametrize(("sql", "caps"), [
    ("SELECT country, COUNT(*) FROM events GROUP BY country", Caps(1, 1)),  # the mask
    ("SELECT country, COUNT(*) FROM events GROUP BY country", Caps(1, 2)),  # the window over codes
    ("SELECT country, SUM(amount) FROM events GROUP BY country", Caps(1, 1)),  # the salted race, the window
    ("SELECT country, SUM(amount) FROM events GROUP BY country", Caps(1, 2)),  # the salted numbering
])
def test_coded_keys_choose_as_text_keys_whatever_the_connection_collation(collation: str | None, sql: str,
                                                                          caps: Caps) -> None:
    # 2000 units, each with the four groups 'US', 'us', NFC and NFD e-acute (equal under the
    # collations, distinct as bytes) and C_u = 1: the coded plans keep what the text plan keeps
    # under the same salt, and each spelling about a quarter of the time (binomial; failure
    # probability 1e-6 over the four checks)
    n, groups = 2000, ["US", "us", NFC, NFD]
    data = pa.table({"user_id": np.repeat(np.arange(n), 4), "country": groups * n,
                     "amount": np.ones(4 * n)})
    plan = plan_for(sql, spec_for("events", data, domains={"country": tuple(groups)}, bounds={"amount": (0, 1)}))
    text = _run(plan, caps, data, _TextKeys(), collation)
    for ops in (SaltedDuckDBOps(), _WindowOverCodes()):
        assert _run(plan, caps, data, ops, collation) == text
    assert sum(r["__users"] for r in text.values()) == n
    assert all(binomtest(text[(g,)]["__users"], n, 0.25).pvalue > 1e-6 / len(groups) for g in groups)


class _CollatedText(_WindowOverCodes):
    """Negative control: a code's text hashed under the connection's collation (no COLLATE "binary")."""

    def domain_text(self, code: Any) -> Any:
        from sqlglot import exp

        from dpsql.rewrite.render import DIALECT_MARK

        e = exp.cast(code, "VARCHAR")
        e.meta[DIALECT_MARK] = "duckdb"
        return e


def test_spellings_equal_under_the_collation_are_kept_uniformly() -> None:
    # 2000 units with the groups 'US' and 'us', C_u = 1, under a nocase connection: each spelling is
    # kept by about half of the units (binomial; 1e-6 over the three salts) under each salt; the control that
    # hashes the collated text keeps 'US' for every unit
    n = 2000
    data = pa.table({"user_id": np.repeat(np.arange(n), 2), "country": ["US", "us"] * n})
    plan = plan_for("SELECT country, COUNT(*) FROM events GROUP BY country",
                    spec_for("events", data, domains={"country": ("US", "us")}))

    def uniform(ops: Any) -> bool:
        outs = [_run(plan, Caps(1, 1), data, ops, "nocase", salt) for salt in ("a", "b", "c")]
        return all(binomtest(out.get(("US",), {"__users": 0})["__users"], n, 0.5).pvalue > 1e-6 / len(outs) for out in outs)

    assert uniform(SaltedDuckDBOps()) and uniform(_WindowOverCodes())
    assert not uniform(_CollatedText())


# -- keys outside the domain: dropped after the aggregates, never taking a place of the group cap ------------


def _outside_heavy(n: int = 500) -> pa.Table:
    # n units, each with one group inside the domain and five outside it (two rows each, and NULL keys)
    keys = ["in", "o1", "o2", "o3", "o4", None]
    return pa.table({"user_id": np.repeat(np.arange(n), 12), "country": pa.array(keys * 2 * n, pa.string()),
                     "amount": np.ones(12 * n)})


@pytest.mark.parametrize("sql", ["SELECT country, COUNT(*) FROM events GROUP BY country",
                                 "SELECT country, SUM(amount) FROM events GROUP BY country"])
@pytest.mark.parametrize("ops", [DuckDBOps(), SaltedDuckDBOps(), _WindowOverCodes()])
def test_a_coded_key_is_computed_once_per_row_and_outside_groups_take_no_place(sql: str, ops: Any) -> None:
    # The domain filter on the codes used to stand between the aggregate and the group cap, and DuckDB
    # pushed it below the aggregate onto every row, which then computed the ENUM code twice (a filter and
    # a projection: about 7% of the bounded SQL of the peer Q1 and Q3 at 10M rows). Now no filter over the
    # rows casts to the ENUM, and with C_u = 1 every unit still keeps its one group inside the domain
    # whatever its outside keys (one NULL code) hash to. Control: the window without its NULL-last order
    # loses about half of the units to that code (binomial(500, 1/2) below 320: failure probability < 1e-9).
    data = _outside_heavy()
    plan = plan_for(sql, spec_for("events", data, domains={"country": ("in", "x")}, bounds={"amount": (0, 1)}))
    con = duckdb.connect()
    try:
        con.register(source_name("events"), data)
        text = bounded_sql(plan, Caps(1, 1), "s1", ops=ops)
        assert "AS ENUM(" not in con.execute("EXPLAIN " + text).fetchall()[0][1]
        assert keyed(plan, con.sql(text).to_arrow_table())[("in",)]["__users"] == 500
        if "ORDER BY __k0 IS NULL, " in text:
            control = text.replace("ORDER BY __k0 IS NULL, ", "ORDER BY ")
            assert keyed(plan, con.sql(control).to_arrow_table())[("in",)]["__users"] < 320
    finally:
        con.close()


# -- end to end: every source kind, hostile spellings, the caller's collations ----------------------------

# (the longest value 31 bytes: a domain holding a value of bound.COMPACT_BELOW bytes or more stays text, below)
DOMAIN = ["US", "us", "US ", " US", "", "a\0b", NFC, NFD, "x" * 31, "O'Brien", 'a"b', "\\", "%", "NULL"]
OUTSIDE = ["Us", "US  ", "a", "a\0", "E", "x" * 30, "o'brien", "null", "\t", "US\n"]


def _events(seed: int = 1, n: int = 4000) -> pa.Table:
    gen = np.random.default_rng(seed)
    spellings = DOMAIN + OUTSIDE
    keys: list[str | None] = [spellings[i] for i in gen.integers(0, len(spellings), n)]
    keys = [None if gen.random() < 0.03 else k for k in keys]
    return pa.table({"uid": gen.integers(0, 300, n), "g": pa.array(keys, pa.string()),
                     "v": gen.integers(0, 10, n).astype(np.float64)})


def _release(kind: str, data: pa.Table, tmp_path: Any, sql: str, ops: Any, collation: str | None) -> list[tuple[Any, ...]]:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    import dpsql
    from dpsql.testing import use_noise, zero_noise

    con = duckdb.connect()
    if collation is not None:
        con.execute(f"SET default_collation = '{collation}'")
    source: Any = data
    cols: dict[str, dict[str, Any]] = {"g": {"domain": DOMAIN}, "v": {"bounds": (0, 10)}}
    if kind == "parquet":
        source = str(tmp_path / "t.parquet")
        pq.write_table(data, source)
    elif kind == "csv":
        source = str(tmp_path / "t.csv")
        pcsv.write_csv(data, source)
        cols["v"]["type"] = "DOUBLE"
    elif kind == "duckdb":
        con.register("v0", data)
        con.execute("CREATE TABLE dt (uid BIGINT, g VARCHAR COLLATE NOCASE, v DOUBLE)")
        con.execute("INSERT INTO dt SELECT * FROM v0")
        con.unregister("v0")
        source = "dt"
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), connection=con)
    try:
        use_noise(s, zero_noise())
        s._engine.ops = ops  # type: ignore[attr-defined]
        s.register("t", source, privacy_unit="uid", max_groups_per_unit=2, columns=cols)
        rows = s.query(sql, epsilon=5.0, delta=1e-5).table.to_pylist()
    finally:
        s.close()
        con.close()
    return sorted((tuple(sorted(r.items())) for r in rows), key=repr)


@pytest.mark.parametrize(("kind", "collation"), [("arrow", None), ("parquet", None), ("csv", None), ("duckdb", None),
                                                 ("duckdb", "nocase"), ("arrow", "nocase")])
@pytest.mark.parametrize("sql", ["SELECT g, COUNT(*) AS n FROM t GROUP BY g",
                                 "SELECT g, COUNT(*) AS n, SUM(v) AS s FROM t WHERE g <> 'us' GROUP BY g ORDER BY g LIMIT 6"])
def test_sessions_release_what_the_text_plan_releases(kind: str, collation: str | None, sql: str, tmp_path: Any) -> None:
    # case and space variants, empty text, NUL, NFC and NFD, quotes, a 31-byte key, NULL keys and keys
    # outside the domain, users over C_u = 2: the released keys and zero-noise counts equal the text plan's
    data = _events()
    coded = _release(kind, data, tmp_path, sql, SaltedDuckDBOps(), collation)
    assert coded == _release(kind, data, tmp_path, sql, _TextKeys(), collation)
    assert {dict(r)["g"] for r in coded} <= set(DOMAIN) and len(coded) >= 6


def test_a_domain_value_that_is_not_valid_text_is_refused_at_registration() -> None:
    """A lone surrogate has no UTF-8 form: registered, every query on the column was refused at its
    bind check (free, but the owner learned it only from the analysts)."""
    import dpsql
    from dpsql.errors import ConfigError

    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6))
    t = pa.table({"u": [1, 2], "k": ["a", "b"]})
    with pytest.raises(ConfigError, match="lone surrogate"):
        s.register("t", t, privacy_unit="u", columns={"k": {"domain": ["a", "\ud800"]}})
    assert "t" not in s.tables
    s.register("t", t, privacy_unit="u", columns={"k": {"domain": ["a", "\u00e9"]}})
    s.close()


def test_a_domain_holding_a_long_value_stays_text() -> None:
    """A code is hashed by the group cap as its text, a text key of ``bound.COMPACT_BELOW`` bytes or more as its
    salted digest (``bound.compact_key``): a domain holding such a value is not coded, so the groups kept do not
    depend on whether a key is coded. The control: the same domain without it is coded."""
    data = _events()
    long = [*DOMAIN, "y" * 32]
    for domain, coded in ((long, False), (DOMAIN, True)):
        plan = plan_for("SELECT g, COUNT(*) FROM t GROUP BY g", spec_for("t", data, domains={"g": tuple(domain)}))
        assert ("ENUM(" in bounded_sql(plan, Caps(2, 1), "s", ops=SaltedDuckDBOps())) is coded
