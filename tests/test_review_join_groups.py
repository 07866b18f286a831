"""Adversarial review of GROUP BY over joins: regressions for what was found.

Design invariant 8: keys are canonical, with no collation (a collation makes different spellings
equal). The single-table GROUP BY groups text keys under the binary collation; a grouped join
compared each join tuple's key with the key set under whatever collation the owner's connection
had (``SET default_collation = 'nocase'``), so with a declared domain listing 'AUTO' and 'auto'
every 'AUTO' tuple was counted in both groups: each person's tuples doubled (beyond the Delta that
the DP-S4S path's sampling amplification and its tau grid rely on), and the answer differed from
the single-table one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_s4s_vector import tpch  # noqa: E402

SQL = ("SELECT c.c_mktsegment, COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
       "GROUP BY c.c_mktsegment")


def _session(collation: str | None, public_segments: bool = False) -> dpsql.Session:
    data = tpch()
    con = duckdb.connect()
    if collation is not None:
        con.execute(f"SET default_collation = '{collation}'")
    for k, v in data.items():
        con.register(f"v_{k}", v)
        con.execute(f"CREATE TABLE {k} AS SELECT * FROM v_{k}")
    con.execute("CREATE TABLE segments AS SELECT * FROM (VALUES ('AUTO'), ('auto'), ('BUILD')) t(s_name)")
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    s.register("nation", "nation", public=True)
    s.register("segments", "segments", public=True)
    cols = {} if public_segments else {"c_mktsegment": {"domain": ["AUTO", "auto", "BUILD"]}}
    refs = {"c_nationkey": "nation.n_nationkey"}
    if public_segments:
        refs["c_mktsegment"] = "segments.s_name"
    s.register("customer", "customer", privacy_unit="c_custkey", references=refs, columns=cols)
    s.register("orders", "orders", references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 4})
    return s


def _counts(s: dpsql.Session, sql: str, opts: dict | None = None) -> dict[str, int]:
    r = s.query(sql, epsilon=4.0, delta=1e-7, options=opts)
    return {row[r.table.column_names[0]]: row["n"] for row in r.table.to_pylist()}


@pytest.mark.parametrize("opts", [None, {"mechanism": "dp_s4s", "q": 1.0}], ids=["clipped", "dp_s4s"])
def test_declared_text_keys_of_a_join_ignore_the_connection_collation(opts: dict | None) -> None:
    """Zero noise: the answer under a 'nocase' default collation equals the one under none, and no tuple
    is counted under the 'auto' key (no customer has that exact spelling)."""
    plain = _counts(_session(None), SQL, opts)
    nocase = _counts(_session("nocase"), SQL, opts)
    assert plain["auto"] == 0 and plain["AUTO"] > 0  # control: the binary answer
    assert nocase == plain


def test_public_table_text_keys_of_a_join_are_spelled_and_matched_exactly() -> None:
    """A public table's key set keeps 'AUTO' and 'auto' as two keys (a 'nocase' DISTINCT kept one, spelled as
    whichever row came first), and each tuple joins only the key with its exact spelling."""
    sql = ("SELECT sg.s_name, COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
           "JOIN segments sg ON c.c_mktsegment = sg.s_name GROUP BY sg.s_name")
    plain = _counts(_session(None, public_segments=True), sql)
    assert set(plain) == {"AUTO", "auto", "BUILD"} and plain["auto"] == 0
    # the join condition itself follows the owner's collation (a join, not a key): only the key set and the
    # matching of a tuple's key to it are canonical
    nocase = _counts(_session("nocase", public_segments=True), sql)
    assert set(nocase) == {"AUTO", "auto", "BUILD"}


def test_text_people_of_a_join_are_not_merged_by_a_nocase_connection() -> None:
    def answer(collation: str | None) -> dict[str, int]:
        con = duckdb.connect()
        if collation is not None:
            con.execute(f"SET default_collation = '{collation}'")
        ids = [f"p{i}" for i in range(30)] + ["Z", "z"]
        con.execute("CREATE TABLE customer AS SELECT * FROM (SELECT unnest($1) AS c_custkey, 'AUTO' AS c_mktsegment)", [ids])
        con.execute("CREATE TABLE orders AS SELECT row_number() OVER () AS o_orderkey, c_custkey AS o_custkey FROM customer, "
                    "range(3)")
        s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-3), connection=con)
        use_noise(s, zero_noise())
        s.register("customer", "customer", privacy_unit="c_custkey", columns={"c_mktsegment": {"domain": ["AUTO"]}})
        s.register("orders", "orders", references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 3})
        out = _counts(s, SQL)
        s.close()
        return out

    assert answer("nocase") == answer(None)


def _people_session(collation: str | None, column_collation: bool = False) -> tuple[dpsql.Session, duckdb.DuckDBPyConnection]:
    """30 people 'p<i>' plus 'Z' and 'z', three orders each; the collation is the connection's default
    (``collation``) or, with ``column_collation``, declared on the person and reference columns."""
    con = duckdb.connect()
    if collation is not None:
        con.execute(f"SET default_collation = '{collation}'")
    coll = " COLLATE NOCASE" if column_collation else ""
    con.execute(f"CREATE TABLE customer (c_custkey VARCHAR{coll}, c_mktsegment VARCHAR)")
    con.execute(f"CREATE TABLE orders (o_orderkey BIGINT, o_custkey VARCHAR{coll}, o_totalprice DOUBLE)")
    ids = [f"p{i}" for i in range(30)] + ["Z", "z"]
    con.execute("INSERT INTO customer SELECT unnest($1), 'AUTO'", [ids])
    con.execute("INSERT INTO orders SELECT row_number() OVER (), c_custkey, 10.0 FROM customer, range(3)")
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    s.register("customer", "customer", privacy_unit="c_custkey", columns={"c_mktsegment": {"domain": ["AUTO"]}})
    s.register("orders", "orders", references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 3},
               columns={"o_totalprice": {"bounds": [0, 20]}})
    return s, con


def _merged_join_size(con: duckdb.DuckDBPyConnection) -> int:
    """The join's size as the owner's connection computes it (the negative control: 'Z' and 'z' merged)."""
    row = con.execute("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey").fetchall()[0]
    assert row is not None
    return int(row[0])


SCALAR = "SELECT {} AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey"


@pytest.mark.parametrize("opts", [{"mechanism": "dp_s4s", "q": 1.0}, {"mechanism": "r2t"}], ids=["dp_s4s", "r2t"])
@pytest.mark.parametrize("where", ["connection", "column"])
def test_scalar_joins_of_text_people_ignore_the_collation(opts: dict, where: str) -> None:
    """Zero noise: a scalar join over text people answers the same under a 'nocase' connection or a column
    declared COLLATE NOCASE as under no collation, although the owner's own join merges 'Z' and 'z'."""
    def answer(s: dpsql.Session) -> list[list[dict]]:
        out = [s.query(SCALAR.format(agg), epsilon=4.0, delta=1e-7, options=opts).table.to_pylist()
               for agg in ("COUNT(*)", "SUM(o.o_totalprice)")]
        s.close()
        return out

    nocase, ncon = _people_session("nocase") if where == "connection" else _people_session(None, column_collation=True)
    assert _merged_join_size(ncon) == 32 * 3 + 6  # control: the owner's collation merges the two people
    plain, pcon = _people_session(None)
    assert _merged_join_size(pcon) == 32 * 3
    assert answer(nocase) == answer(plain)


@pytest.mark.parametrize("opts", [None, {"mechanism": "dp_s4s", "q": 1.0}], ids=["clipped", "dp_s4s"])
def test_grouped_joins_of_text_people_ignore_a_column_collation(opts: dict | None) -> None:
    """The same for a grouped join, the people and references declared COLLATE NOCASE."""
    nocase, ncon = _people_session(None, column_collation=True)
    assert _merged_join_size(ncon) == 32 * 3 + 6
    got = _counts(nocase, SQL, opts)
    want = _counts(_people_session(None)[0], SQL, opts)
    assert got == want and set(got) == {"AUTO"}


@pytest.mark.parametrize("opts", [{"mechanism": "dp_s4s", "q": 1.0}, {"mechanism": "r2t"}], ids=["dp_s4s", "r2t"])
def test_text_keys_of_a_reference_chain_ignore_a_nocase_connection(opts: dict) -> None:
    """items -> orders -> customer with text keys ('Z-0' and 'z-0' are two orders of two people): the join
    on the order key, its Delta caps and the owner reached through the chain are binary. Without it the
    'nocase' answers were 124 (DP-S4S) and 142 (R2T), 10 below the binary 134 and 152."""
    def answer(collation: str | None) -> list[dict]:
        con = duckdb.connect()
        if collation is not None:
            con.execute(f"SET default_collation = '{collation}'")
        ids = [f"p{i}" for i in range(30)] + ["Z", "z"]
        con.execute("CREATE TABLE customer AS SELECT unnest($1) AS c_custkey", [ids])
        con.execute("CREATE TABLE orders AS SELECT c_custkey || '-' || r AS o_orderkey, c_custkey AS o_custkey "
                    "FROM customer, range(3) t(r)")
        con.execute("CREATE TABLE items AS SELECT o_orderkey AS i_orderkey, r AS i_n FROM orders, range(2) t(r)")
        s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-3), connection=con)
        use_noise(s, zero_noise())
        s.register("customer", "customer", privacy_unit="c_custkey")
        s.register("orders", "orders", references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 3})
        s.register("items", "items", references={"i_orderkey": "orders.o_orderkey"}, degree_bounds={"i_orderkey": 2})
        out = s.query("SELECT COUNT(*) AS n FROM items i JOIN orders o ON i.i_orderkey = o.o_orderkey", epsilon=4.0,
                      delta=1e-7, options=opts).table.to_pylist()
        s.close()
        return out

    assert answer("nocase") == answer(None)
