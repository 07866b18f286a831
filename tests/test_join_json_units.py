"""A JSON privacy unit is compared under the connection's collation (under ``nocase`` '"A"' and
'"a"' are one JSON value, and no binary collation applies to JSON) but spelled apart: one join
tuple of the people '"A"' and '"a"' then had two users on a plan with one person per tuple, and
the grouped join failed after its charge exactly when such a pair of people existed (with '"A"',
'"B"' it answered; adding the person '"a"' made it fail). A JSON unit is refused at registration
(and by the join planner for a catalog built another way), for free."""

from __future__ import annotations

import dataclasses

import duckdb
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError, PolicyError, UnsupportedQueryError
from dpsql.plan.analyze import analyze


def _connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.sql("create table person(id JSON, n INTEGER)")
    con.sql("create table ev(uid JSON, k INTEGER)")
    con.sql("""insert into person values ('"A"', 1), ('"B"', 2), ('"a"', 3)""")
    con.sql("""insert into ev values ('"A"', 0), ('"a"', 1)""")
    con.sql("set default_collation='nocase'")
    return con


def test_a_json_privacy_unit_is_refused_at_registration() -> None:
    with dpsql.Session(budget=Budget(10.0, 1e-3), connection=_connection()) as s:
        with pytest.raises(ConfigError, match="JSON"):
            s.register("person", "person", privacy_unit="id")
        s.register("person_n", "person", privacy_unit="n")  # control: an integer unit of the same table


def test_the_join_planner_refuses_a_json_unit_of_a_catalog_built_by_hand() -> None:
    with dpsql.Session(budget=Budget(10.0, 1e-3), connection=_connection()) as s:
        s.register("person", "person", privacy_unit="n")
        s.register("ev", "ev", privacy_unit="k")
        cat = dict(s.tables)
        cat["person"] = dataclasses.replace(cat["person"], privacy_unit="id")
        cat["ev"] = dataclasses.replace(cat["ev"], privacy_unit=None, references={"uid": "person.id"},
                                        degree_bounds={"uid": 2})
        # the ON equality of two JSON columns is refused first (no join keys on JSON: its hash is easy to
        # make collide, tests/test_adversary_join_key_types.py), the JSON unit with it
        with pytest.raises((PolicyError, UnsupportedQueryError), match="JSON"):
            analyze("SELECT COUNT(*) FROM person p JOIN ev e ON p.id = e.uid", cat)
