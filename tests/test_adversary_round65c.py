"""Neighbouring datasets, zero noise: COUNT(DISTINCT person) over a join whose every tuple belongs to one person
(``dpsql.mechanisms.lookup``, "People counted over a join").

* The count itself holds its sensitivity on adversarial rows: referenced keys held by several people (the unique-key
  filter), NULL and dangling keys, a person's rows repeated, a self-join of an account table, declared domains as
  keys, C_u of 1 and 2: removing one person and every row reaching them moves each group's count by
  at most 1, in at most C_u groups (negative control: removing two people moves one count by 2).
* ``GROUP BY o.o_custkey``, a column the ON equates with the person ``c.c_custkey``, beside the count of people was
  charged and released no row (each group holds one person: none passes the sparse histogram's threshold), while
  ``GROUP BY c.c_custkey`` is refused for free, as on one table. Both are now refused for free.
* explain named the owner by an internal column name (``c__c_custkey``), now as the query does (``c.c_custkey``).
* One table: ``GROUP BY (c_custkey)`` (parentheses) was charged and released no row, and ``GROUP BY (col)`` of a
  column with a declared domain lost the domain; GROUP BY (col) is now GROUP BY col.
* A count of people grouped by a key whose set is computed from public values (a DATE column's declared days,
  ``year(...)``, a CASE) was refused with a message saying that ``COUNT(DISTINCT person)`` alone over such a join is
  answered, which is what the query asked: the message now names the key as the problem.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise
from tests.test_tpch_queries import _COL, _data, _session

_SCHEMA = {
    "person": pa.schema([("pid", pa.string()), ("seg", pa.string())]),
    "acct": pa.schema([("aid", pa.string()), ("owner", pa.string()), ("kind", pa.string())]),
    "txn": pa.schema([("acct_id", pa.string()), ("cat", pa.string())]),
}


def _people_session(d: dict[str, pa.Table], groups: int) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5))
    s.register("person", d["person"], privacy_unit="pid", max_groups_per_unit=groups,
               columns={"seg": {"domain": ["s0", "s1"]}})
    s.register("acct", d["acct"], references={"owner": "person.pid"}, degree_bounds={"owner": 2},
               columns={"kind": {"domain": ["k0", "k1", "k2"]}})
    s.register("txn", d["txn"], references={"acct_id": "acct.aid"}, degree_bounds={"acct_id": 2},
               columns={"cat": {"domain": ["c0", "c1", "c2"]}})
    use_noise(s, zero_noise())
    return s


def _tables(person: list[tuple], acct: list[tuple], txn: list[tuple]) -> dict[str, pa.Table]:
    rows = {"person": person, "acct": acct, "txn": txn}
    return {k: pa.Table.from_pylist([dict(zip(_SCHEMA[k].names, r, strict=True)) for r in v], schema=_SCHEMA[k])
            for k, v in rows.items()}


def _adversarial() -> dict[str, pa.Table]:
    """Account 'x' held by p0 and p1 (a referenced key duplicated across people), p1's transactions on 'x' and 'y',
    p2 twice in person, an account with a NULL id, one whose owner is nobody ('zz'), a transaction on no account."""
    return _tables(
        [("p0", "s0"), ("p1", "s1"), ("p2", "s0"), ("p2", "s1"), ("p3", "s1"), (None, "s0")],
        [("x", "p0", "k0"), ("x", "p1", "k1"), ("y", "p1", "k2"), ("z", "p2", "k0"), ("w", "p2", "k1"),
         (None, "p3", "k0"), ("v", "zz", "k2"), ("u", "p3", "k2")],
        [("x", "c0"), ("y", "c1"), ("y", "c2"), ("z", "c0"), ("w", "c1"), ("w", "c1"), ("v", "c2"), ("q", "c0"),
         ("u", "c1"), (None, "c2")],
    )


def _random(seed: int) -> dict[str, pa.Table]:
    rng = random.Random(seed)
    people = [f"p{i}" for i in range(rng.randint(2, 5))] + [None]
    aids = ["a0", "a1", "a2", "a3", "a4", None]
    return _tables(
        [(p, rng.choice(["s0", "s1"])) for p in people for _ in range(rng.choice([1, 1, 2]))],
        [(rng.choice(aids), rng.choice([*people, "zz"]), rng.choice(["k0", "k1", "k2"])) for _ in range(rng.randint(2, 8))],
        [(rng.choice([*aids, "a9"]), rng.choice(["c0", "c1", "c2"])) for _ in range(rng.randint(2, 12))],
    )


def _without(d: dict[str, pa.Table], people: set[str]) -> dict[str, pa.Table]:
    """``d`` without ``people`` and every row reaching them: their person and account rows, and every transaction on
    an account id one of those accounts holds (held by someone else too or not)."""
    acct = d["acct"].to_pylist()
    ids = {a["aid"] for a in acct if a["owner"] in people and a["aid"] is not None}
    return {"person": pa.Table.from_pylist([r for r in d["person"].to_pylist() if r["pid"] not in people],
                                           schema=_SCHEMA["person"]),
            "acct": pa.Table.from_pylist([r for r in acct if r["owner"] not in people], schema=_SCHEMA["acct"]),
            "txn": pa.Table.from_pylist([r for r in d["txn"].to_pylist() if r["acct_id"] not in ids],
                                        schema=_SCHEMA["txn"])}


_J3 = "FROM person p JOIN acct a ON a.owner = p.pid JOIN txn t ON t.acct_id = a.aid "
_PEOPLE_QUERIES = [
    f"SELECT COUNT(DISTINCT p.pid) AS n {_J3}",
    f"SELECT t.cat AS g, COUNT(DISTINCT a.owner) AS n {_J3}GROUP BY 1",
    f"SELECT p.seg AS g, a.kind AS h, COUNT(DISTINCT p.pid) AS n {_J3}WHERE t.cat <> 'c2' GROUP BY 1, 2",
    "SELECT a.kind AS g, COUNT(DISTINCT a.owner) AS n FROM acct a JOIN txn t ON t.acct_id = a.aid GROUP BY 1",
    "SELECT COUNT(DISTINCT a1.owner) AS n FROM acct a1 JOIN acct a2 ON a1.owner = a2.owner "
    "JOIN txn t ON t.acct_id = a2.aid WHERE a1.kind <> a2.kind",
]


def _counts(d: dict[str, pa.Table], sql: str, groups: int) -> dict[tuple, int]:
    with _people_session(d, groups) as s:
        assert "COUNT(DISTINCT person) over a join" in s.explain(sql, epsilon=1.0, delta=1e-6).reason
        rows = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()
    return {tuple(v for k, v in r.items() if k != "n"): r["n"] for r in rows}


def _moves(d: dict[str, pa.Table], sql: str, groups: int, removed: set[str]) -> dict[tuple, int]:
    full, less = _counts(d, sql, groups), _counts(_without(d, removed), sql, groups)
    return {k: full.get(k, 0) - less.get(k, 0) for k in set(full) | set(less) if full.get(k, 0) != less.get(k, 0)}


def _people(d: dict[str, pa.Table]) -> list[str]:
    return sorted({p for p in d["person"].column("pid").to_pylist() + d["acct"].column("owner").to_pylist() if p})


@pytest.mark.parametrize(("sql", "groups"), [(q, g) for q in _PEOPLE_QUERIES for g in ((1, 2) if "GROUP BY" in q else (1,))])
def test_removing_one_person_moves_each_count_by_at_most_one_in_at_most_c_u_groups(sql: str, groups: int) -> None:
    for d in (_adversarial(), _random(3)):
        for person in _people(d):
            moved = _moves(d, sql, groups, {person})
            assert all(abs(v) <= 1 for v in moved.values()) and len(moved) <= groups, (person, moved)


def test_negative_control_removing_two_people_moves_a_count_by_two() -> None:
    """The check above can fail: p1 and p2 both count (p0's account 'x' is also p1's, so p0 does not)."""
    moved = _moves(_adversarial(), _PEOPLE_QUERIES[0], 1, {"p1", "p2"})
    assert moved == {(): 2}
    assert _moves(_adversarial(), _PEOPLE_QUERIES[0], 1, {"p0"}) == {}


@pytest.mark.parametrize("sql", [
    f"SELECT o.o_custkey, COUNT(DISTINCT c.c_custkey) AS n {_COL}GROUP BY 1",
    f"SELECT o.o_custkey AS k, COUNT(DISTINCT c.c_custkey) AS n {_COL}GROUP BY k",
    f"SELECT COUNT(DISTINCT o.o_custkey) AS n {_COL}GROUP BY o.o_custkey",
    f"SELECT l.l_shipmode, o.o_custkey, COUNT(DISTINCT c.c_custkey) AS n {_COL}GROUP BY 1, 2",
    f"SELECT o.o_custkey, COUNT(DISTINCT c.c_custkey) AS n {_COL}GROUP BY ALL",
    f"SELECT (o.o_custkey) AS k, COUNT(DISTINCT c.c_custkey) AS n {_COL}GROUP BY (o.o_custkey)",
])
def test_a_count_of_people_grouped_by_a_column_equated_with_the_person_is_refused_for_free(sql: str) -> None:
    with _session(_data()) as s:
        before = s.remaining()
        with pytest.raises(UnsupportedQueryError, match="which the join's ON equates with the privacy unit 'c.c_custkey'"):
            s.explain(sql, epsilon=1.0, delta=1e-6)
        with pytest.raises(UnsupportedQueryError, match="no group can pass the release threshold"):
            s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.remaining() == before and s.history().num_rows == 0


def test_negative_control_grouping_the_people_by_another_column_is_answered() -> None:
    with _session(_data()) as s:
        r = s.query(f"SELECT l.l_shipmode AS m, COUNT(DISTINCT c.c_custkey) AS n {_COL}GROUP BY 1 ORDER BY 1",
                    epsilon=1.0, delta=1e-6)
        assert sum(x["n"] for x in r.to_pylist()) == 6 and s.history().num_rows == 1
        # (the unit itself was refused already; GROUP BY ALL of it too now)
        for group in ("1", "ALL"):
            with pytest.raises(UnsupportedQueryError, match="GROUP BY the privacy unit 'c.c_custkey'"):
                s.query(f"SELECT c.c_custkey, COUNT(DISTINCT o.o_custkey) AS n {_COL}GROUP BY {group}", epsilon=1.0,
                        delta=1e-6)
        assert s.history().num_rows == 1


@pytest.mark.parametrize("key", ["o.o_orderdate", "year(o.o_orderdate)",
                                 "CASE WHEN l.l_quantity > 12 THEN 'hi' ELSE 'lo' END"])
def test_a_count_of_people_grouped_by_a_computed_key_set_names_the_key(key: str) -> None:
    with _session(_data()) as s:
        with pytest.raises(UnsupportedQueryError, match="answered grouped by columns only") as e:
            s.query(f"SELECT {key} AS k, COUNT(DISTINCT c.c_custkey) AS n {_COL}GROUP BY 1", epsilon=1.0, delta=1e-6)
        assert key in str(e.value) and "except COUNT(DISTINCT person) alone" not in str(e.value)
        assert s.history().num_rows == 0


def test_negative_control_another_distinct_count_over_a_computed_key_keeps_its_message() -> None:
    with _session(_data()) as s:
        with pytest.raises(UnsupportedQueryError, match="except COUNT\\(DISTINCT person\\) alone"):
            s.query(f"SELECT year(o.o_orderdate) AS y, COUNT(DISTINCT o.o_orderkey) AS n {_COL}GROUP BY 1",
                    epsilon=1.0, delta=1e-6)


def test_explain_names_the_owner_as_the_query_does() -> None:
    """explain's note named the owner by the joined relation's internal column name ('c__c_custkey')."""
    with _session(_data()) as s:
        notes = s.explain(f"SELECT COUNT(DISTINCT o.o_custkey) AS n {_COL}", epsilon=1.0, delta=1e-6).notes
    note = next(n for n in notes if n.startswith("people counted over a join"))
    assert "whose unit is the owner (c.c_custkey)" in note and "__" not in note


def test_negative_control_another_distinct_count_grouped_by_the_persons_column_keeps_its_message() -> None:
    """Only a count of people is told that each group holds one person; another distinct count keeps the refusal of
    distinct counts over such joins."""
    with _session(_data()) as s:
        with pytest.raises(UnsupportedQueryError, match="except COUNT\\(DISTINCT person\\) alone"):
            s.query(f"SELECT o.o_custkey, COUNT(DISTINCT o.o_orderkey) AS n {_COL}GROUP BY 1", epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0


def test_one_table_group_by_a_parenthesized_unit_is_refused_for_free() -> None:
    """``GROUP BY (c_custkey)`` on one table was charged and released no row (the parentheses hid the unit from its
    refusal: a private expression's sparse histogram, one person per group), and ``GROUP BY (c_mktsegment)`` lost the
    column's declared domain (released nothing at zero noise). GROUP BY (col) is GROUP BY col."""
    with _session(_data()) as s:
        for sql in ("SELECT (c_custkey), COUNT(*) AS n FROM customer GROUP BY (c_custkey)",
                    "SELECT ((c_custkey)) AS k, COUNT(*) AS n FROM customer GROUP BY 1"):
            with pytest.raises(UnsupportedQueryError, match="GROUP BY the privacy unit 'c_custkey'"):
                s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
        r = s.query("SELECT c_mktsegment AS m, COUNT(*) AS n FROM customer GROUP BY (c_mktsegment) ORDER BY 1",
                    epsilon=1.0, delta=1e-6)
        assert r.to_pylist() == [{"m": "BUILDING", "n": 3}, {"m": "MACHINERY", "n": 3}]


def test_negative_control_one_table_group_by_the_bare_column_is_unchanged() -> None:
    with _session(_data()) as s:
        r = s.query("SELECT c_mktsegment AS m, COUNT(*) AS n FROM customer GROUP BY c_mktsegment ORDER BY 1",
                    epsilon=1.0, delta=1e-6)
        assert r.to_pylist() == [{"m": "BUILDING", "n": 3}, {"m": "MACHINERY", "n": 3}]


def test_reuse_of_a_synopsis_for_a_count_of_people_over_a_join_is_refused_naming_the_join() -> None:
    """The refusal said 'a lookup join's rows are the table's rows joined with lookup rows' of a join of three private
    tables (negative control: a lookup join keeps its message)."""
    with _session(_data()) as s:
        with pytest.raises(dpsql.errors.PolicyError, match="the join's tuples are several tables' rows joined"):
            s.query(f"SELECT COUNT(DISTINCT c.c_custkey) AS n {_COL}", epsilon=1.0, delta=1e-6,
                    options={"reuse": "synopsis"})
        with pytest.raises(dpsql.errors.PolicyError, match="a lookup join's rows are the table's rows joined"):
            s.query("SELECT COUNT(DISTINCT c.c_custkey) AS n FROM customer c JOIN nation n ON n.n_nationkey = "
                    "c.c_nationkey", epsilon=1.0, delta=1e-6, options={"reuse": "synopsis"})
        assert s.history().num_rows == 0
