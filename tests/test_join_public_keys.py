"""A public table's declared keys (the targets of references into it) and degree bounds are checked on its rows
before a join relies on them, for free.

Joins assume that a private row joined to a public table on a declared key matches at most one public row (and at
most ``degree_bounds`` rows on a bounded column): the lookup route's one-table caps, DP-S4S's Delta. Only the
enforced plans capped the public rows; a join whose Delta is attested (tuples of several people) read every
duplicate, so a duplicated key multiplied the tuples: R2T's zero-noise COUNT went from 7819 to 10486 with one
region key held twice, a GROUP BY's group from 2560 to 5120, and a sampled DP-S4S run (Delta attested 20) let one
person reach 40 tuples. The table being public, reading it reveals nothing about a person: a duplicated key is now
a ConfigError naming the table, the column, a duplicated value and the fix, before the charge; a private table is
never read by the check."""

from __future__ import annotations

import os
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

N = 3000
REGIONS = ["a", "b", "c"]
SCALAR = "SELECT COUNT(*) FROM orders o JOIN regions r ON o.region = r.region"
GROUPED = "SELECT r.zone, COUNT(*) FROM orders o JOIN regions r ON o.region = r.region GROUP BY r.zone"
LOOKUP = "SELECT COUNT(*) FROM persons p JOIN regions r ON p.region = r.region WHERE r.zone <> 'z'"


def _regions(dup: bool) -> pa.Table:
    keys = REGIONS + (["a"] if dup else []) + [None, None]  # NULL keys join nothing: allowed, several of them
    return pa.table({"region": keys, "zone": ["x", "y", "z"] + (["x"] if dup else []) + ["w", "w"]})


def _session(regions: Any, *, seller: bool = True) -> dpsql.Session:
    """orders reach a customer and a seller (an attested Delta, R2T) and a public region; persons (one owner) too."""
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("regions", regions, public=True)
    s.register("customer", pa.table({"c": list(range(750))}), privacy_unit="c")
    refs = {"oc": "customer.c", "region": "regions.region"}
    if seller:
        s.register("seller", pa.table({"sid": list(range(150))}), privacy_unit="sid")
        refs["os"] = "seller.sid"
    s.register("orders", pa.table({"oc": [i % 750 for i in range(N)], "os": [i % 150 for i in range(N)],
                                   "region": [REGIONS[i % 3] for i in range(N)]}),
               references=refs, degree_bounds={"oc": 4, "os": 20} if seller else {"oc": 4})
    s.register("persons", pa.table({"pid": list(range(600)), "region": [REGIONS[i % 3] for i in range(600)]}),
               privacy_unit="pid", references={"region": "regions.region"})
    use_noise(s, zero_noise())
    return s


@pytest.mark.parametrize("sql,opts", [(SCALAR, {}), (GROUPED, {}), (LOOKUP, {}), (LOOKUP, {"mechanism": "dp_s4s"})],
                         ids=["r2t", "r2t-grouped", "lookup", "lookup-dp_s4s"])
def test_a_duplicated_public_key_is_refused_for_free(sql: str, opts: dict[str, Any]) -> None:
    with _session(_regions(True)) as s:
        before = s.remaining()
        for run in (s.explain, s.query):
            with pytest.raises(ConfigError) as e:
                run(sql, epsilon=1.0, delta=1e-6, options=opts)
            msg = str(e.value)
            assert "public table 'regions'" in msg and "'region'" in msg and "'a'" in msg and "2 rows" in msg, msg
            assert "nothing was charged" in msg and "deduplicate" in msg, msg
            assert "the reference orders.region -> regions.region, the reference persons.region" in msg, msg  # who declared it
        assert s.history().num_rows == 0 and s.remaining() == before


@pytest.mark.parametrize("sql", [SCALAR, GROUPED, LOOKUP])
def test_a_unique_public_key_with_null_values_is_answered(sql: str) -> None:
    """Negative control: the same queries over a key held once per value (NULL twice: it matches nothing)."""
    with _session(_regions(False)) as s:
        rows = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()
        assert rows and s.history().num_rows == 1


def test_a_changed_public_file_is_checked_again(tmp_path: Any) -> None:
    """Parquet sources: a file rewritten with a duplicate (the same schema) is refused at the next query, and
    answered again once fixed, without registering it again."""
    path = os.path.join(tmp_path, "regions.parquet")
    pq.write_table(_regions(False), path)
    with _session(path) as s:
        s.query(SCALAR, epsilon=1.0, delta=1e-6)
        pq.write_table(_regions(True), path)
        with pytest.raises(ConfigError, match="public table 'regions'"):
            s.query(SCALAR, epsilon=1.0, delta=1e-6)
        pq.write_table(_regions(False), path)
        s.query(SCALAR, epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 2


def test_a_public_degree_bound_is_checked() -> None:
    """A public table's own degree bound (at most n rows per value of a column referencing another public table) is
    checked as a key is: regions declares at most one row per zone, which 'x' breaks; the zone key is unique."""
    with _session(_regions(False)) as s:
        s.register("zones", pa.table({"zone": ["x", "y", "z", "w"], "axis": ["h", "v", "h", "o"]}), public=True)
        s.register("regions", pa.table({"region": ["a", "b", "c", "d"], "zone": ["x", "y", "z", "x"]}), public=True,
                   references={"zone": "zones.zone"}, degree_bounds={"zone": 1})
        sql = f"{SCALAR} JOIN zones z ON r.zone = z.zone"
        with pytest.raises(ConfigError, match=r"(?s)public table 'regions'.*'zone'.*'x'.*2 rows.*degree_bounds"):
            s.explain(sql, epsilon=1.0, delta=1e-6)
        s.register("regions", pa.table({"region": ["a", "b", "c", "d"], "zone": ["x", "y", "z", "x"]}), public=True,
                   references={"zone": "zones.zone"}, degree_bounds={"zone": 2})
        s.explain(sql, epsilon=1.0, delta=1e-6)


def test_a_private_table_is_never_read_by_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only public tables are read before the charge: a private table's key (customer.c, duplicated here) is never
    checked (the join's caps and unique-key filter handle it), and the check reads the public view only."""
    import dpsql.engine as backends

    read: list[str] = []
    real = backends.PublicReads.fetch_arrow

    def spy(self: Any, ast: Any, **kw: Any) -> Any:
        from sqlglot import exp

        read.extend(t.name for t in ast.find_all(exp.Table))
        return real(self, ast, **kw)

    monkeypatch.setattr(backends.PublicReads, "fetch_arrow", spy)
    with _session(_regions(False)) as s:
        s.register("customer", pa.table({"c": [0, 0] + list(range(1, 750))}), privacy_unit="c")
        s.query(SCALAR, epsilon=1.0, delta=1e-6)
        views = {spec.view for spec in s.tables.values()}
        assert read and set(read) & views == {s.tables["regions"].view}


def test_keys_are_compared_as_the_join_compares_them() -> None:
    """Text keys under the binary collation, as the join matches them: 'a' and 'A' are two keys even on a connection
    whose default collation is NOCASE (grouping under it reported a duplicate the join never makes); a composite key
    is duplicated only when every part is."""
    con = duckdb.connect()
    con.execute("SET default_collation = 'nocase'")
    with dpsql.Session(budget=Budget(100.0, 1e-3), connection=con) as s:
        s.register("regions", pa.table({"region": ["a", "A", "b"], "zone": ["x", "y", "z"]}), public=True)
        s.register("pairs", pa.table({"p": [1, 1, 2, 2], "q": [1, 2, 1, 1]}), public=True)
        s.register("persons", pa.table({"pid": [1, 2, 3], "region": ["a", "A", "b"], "p": [1, 1, 2], "q": [1, 2, 1]}),
                   privacy_unit="pid", references={"region": "regions.region", "p,q": "pairs.p,q"})
        s.explain("SELECT COUNT(*) FROM persons x JOIN regions r ON x.region = r.region", epsilon=1.0, delta=1e-6)
        with pytest.raises(ConfigError, match=r"public table 'pairs': its columns 'p, q' hold 2, 1 in 2 rows: declared"):
            s.explain("SELECT COUNT(*) FROM persons x JOIN pairs y ON x.p = y.p AND x.q = y.q", epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0


def test_a_pass_is_remembered_while_the_source_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Arrow table is read once per registration; a table of the caller's DuckDB connection, which may change at
    any time, at every request: a duplicate inserted after a pass is refused at the next one."""
    import dpsql.engine as backends

    reads: list[int] = []
    real = backends.PublicReads.fetch_arrow
    monkeypatch.setattr(backends.PublicReads, "fetch_arrow", lambda self, ast, **kw: reads.append(1) or real(self, ast, **kw))
    with _session(_regions(False)) as s:
        for _ in range(2):
            s.explain(SCALAR, epsilon=1.0, delta=1e-6)
        assert len(reads) == 1
        s.register("regions", _regions(False), public=True)
        s.explain(SCALAR, epsilon=1.0, delta=1e-6)
        assert len(reads) == 2
    con = duckdb.connect()
    con.execute("CREATE TABLE regions AS SELECT * FROM (VALUES ('a', 'x'), ('b', 'y'), ('c', 'z')) t(region, zone)")
    with dpsql.Session(budget=Budget(100.0, 1e-3), connection=con) as s:
        s.register("regions", "regions", public=True)
        s.register("persons", pa.table({"pid": [1, 2, 3], "region": ["a", "b", "c"]}), privacy_unit="pid",
                   references={"region": "regions.region"})
        sql = "SELECT COUNT(*) FROM persons p JOIN regions r ON p.region = r.region"
        s.explain(sql, epsilon=1.0, delta=1e-6)
        con.execute("INSERT INTO regions VALUES ('b', 'w')")
        with pytest.raises(ConfigError, match="public table 'regions': its column 'region' holds 'b' in 2 rows"):
            s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0 and len(reads) == 4
