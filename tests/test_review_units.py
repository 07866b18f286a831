"""Adversarial review: a text privacy unit under a collation that merges spellings.

The owner's DuckDB connection may set ``default_collation = 'nocase'`` (or a column may be declared
with a collation). The caps partition rows by the privacy unit; under 'nocase' the people 'Z' and 'z'
were one partition, so removing 'Z' replaced the kept rows of 'Z' and 'z' by those of 'z' alone: a
SUM over values in [-100, 100] with one row per person moved by 200, twice its claimed sensitivity
(100). Units are now partitioned, grouped and counted under the binary collation, whatever the
connection or column declares (design invariants 8 and 9).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

QUERIES = ["SELECT SUM(x) AS v FROM t", "SELECT g, SUM(x) AS v FROM t GROUP BY g", "SELECT COUNT(DISTINCT uid) AS v FROM t",
           "SELECT MAX(x) AS v FROM t", "SELECT VARIANCE(x) AS v FROM t"]


def _answers(rows: list[tuple[str, float, str]], collation: str | None) -> list[Any]:
    con = duckdb.connect()
    if collation is not None:
        con.execute(f"SET default_collation = '{collation}'")
    con.register("v", pa.table({"uid": [r[0] for r in rows], "x": [r[1] for r in rows], "g": [r[2] for r in rows]}))
    con.execute("CREATE TABLE t AS SELECT * FROM v")
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-3), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid", max_rows_per_unit=1, max_groups_per_unit=1,
               columns={"x": {"bounds": (-100, 100)}, "g": {"domain": ["a", "b"]}})
    out = [s.query(q, epsilon=5.0).table.to_pylist() for q in QUERIES]
    s.close()
    return out


BASE = [(f"p{i}", 0.0, "a") for i in range(20)]
WITH_Z = [*BASE, ("Z", -100.0, "a"), ("z", 100.0, "a")]
WITHOUT_Z = [*BASE, ("z", 100.0, "a")]


@pytest.mark.parametrize("rows", [WITH_Z, WITHOUT_Z], ids=["with_Z", "without_Z"])
def test_a_nocase_connection_does_not_merge_two_people(rows: list[tuple[str, float, str]]) -> None:
    """Zero noise: the answers under 'nocase' equal those under no collation."""
    assert _answers(rows, "nocase") == _answers(rows, None)


def test_removing_one_person_under_nocase_stays_within_the_sensitivity() -> None:
    with_z, without_z = _answers(WITH_Z, "nocase"), _answers(WITHOUT_Z, "nocase")
    assert abs(with_z[0][0]["v"] - without_z[0][0]["v"]) <= 100.0  # SUM: L x max(|lo|, |hi|) = 100
    assert with_z[2][0]["v"] - without_z[2][0]["v"] <= 1  # COUNT(DISTINCT uid): one person
    assert with_z[2][0]["v"] == 22  # 'Z' and 'z' are two people


def test_suggest_caps_counts_z_and_Z_as_two_people_under_nocase() -> None:
    """The contribution profile groups rows per person: under 'nocase' 'Z' and 'z' were one person with two
    rows (a person moved between bins when the other was removed: L1 change 2, claimed 1)."""
    def profile(collation: str | None) -> Any:
        con = duckdb.connect()
        if collation is not None:
            con.execute(f"SET default_collation = '{collation}'")
        con.register("v", pa.table({"uid": [r[0] for r in WITH_Z], "x": [r[1] for r in WITH_Z], "g": [r[2] for r in WITH_Z]}))
        con.execute("CREATE TABLE t AS SELECT * FROM v")
        s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-3), connection=con)
        use_noise(s, zero_noise())
        s.register("t", "t", privacy_unit="uid")
        out = s.suggest_caps("t", epsilon=1.0).table.to_pylist()
        s.close()
        return out

    assert profile("nocase") == profile(None)
