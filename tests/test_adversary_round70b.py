"""A release that has no row whatever the data is refused before any charge, over a lookup join as over one table.

Over keys released above a noisy threshold (the sparse histogram: a private key with no declared domain), a WHERE
that keeps no row leaves no group to pass the threshold: the release has no row whatever the data, and would be
charged for nothing. Two forms over a lookup join (a private table joined with public lookups) were still charged:

* a query of several groupings (GROUPING SETS, a UNION ALL of aggregates) read the one-table plan's WHERE (None over a
  lookup join, whose WHERE lives in its join plan), so `... JOIN regions r ... WHERE 1 = 0 GROUP BY GROUPING SETS
  ((e.cc), (e.cc, e.kind))` was charged, where its single grouping is refused for free;
* a WHERE whose conditions on a public lookup's columns alone keep none of its rows (`r.rname = 'ATLANTIS'` where no
  region is so named) was charged and released nothing. The lookup's rows are public: that no row of it (nor, LEFT
  joined, its row of NULLs) meets those conditions is decided from them alone (one count of them).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import _join_oracle_fuzz as fz  # noqa: E402

from dpsql.errors import UnsupportedQueryError  # noqa: E402

J = "FROM events e JOIN regions r ON e.rg = r.rg"
L = "FROM events e LEFT JOIN regions r ON e.rg = r.rg"


@pytest.fixture(scope="module")
def env() -> Any:
    t = fz.data(5)
    s = fz.session(t)
    yield s, t
    s.close()


def ask(s: Any, sql: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return s.query(sql, epsilon=2.0, delta=1e-5)


def refused_for_free(s: Any, sql: str, match: str) -> str:
    before = s.history().num_rows
    with pytest.raises(UnsupportedQueryError, match=match) as e:
        ask(s, sql)
    assert s.history().num_rows == before, sql
    assert "__" not in str(e.value)  # (the columns as the query names them, not the joined relation's names)
    return str(e.value)


def answered(s: Any, sql: str) -> Any:
    before = s.history().num_rows
    rows = ask(s, sql).to_pylist()
    assert s.history().num_rows == before + 1, sql
    return rows


def _grouping_sets(where: str) -> str:
    return f"SELECT e.cc, e.kind, COUNT(*) AS n {J} WHERE {where} GROUP BY GROUPING SETS ((e.cc), (e.cc, e.kind))"


def _union_all(where: str) -> str:
    return (f"SELECT e.cc, COUNT(*) AS n {J} WHERE {where} GROUP BY e.cc UNION ALL "
            f"SELECT e.cc, COUNT(*) AS n {J} WHERE {where} GROUP BY e.cc")


# ------------------------------------------------------------------------------------------- several groupings


@pytest.mark.parametrize("where", ["1 = 0", "e.v > 5 AND e.v < 3"])
@pytest.mark.parametrize("form", [_grouping_sets, _union_all])
def test_a_never_true_where_over_a_lookup_join_of_several_groupings_is_refused_for_free(env: Any, form: Any,
                                                                                         where: str) -> None:
    """Was: charged, releasing no row (the multi-grouping check read the one-table plan's WHERE, None over a lookup
    join), where `SELECT e.cc, COUNT(*) ... JOIN regions r ... WHERE 1 = 0 GROUP BY e.cc` is refused for free. Now
    refused before the charge, the query named."""
    s, _ = env
    text = refused_for_free(s, form(where), "not true whatever the data|holds for no value")
    assert text.startswith("query 1 of 2 of the ")


def test_several_groupings_one_of_which_has_a_row_are_still_answered(env: Any) -> None:
    """Negative control: ROLLUP (e.cc) holds the total, a noisy count that has its row whatever the data; a UNION ALL
    whose other query keeps rows; a WHERE that is true."""
    s, _ = env
    assert answered(s, f"SELECT e.cc, COUNT(*) AS n {J} WHERE 1 = 0 GROUP BY ROLLUP (e.cc)") == [{"cc": None, "n": 0}]
    answered(s, f"SELECT e.cc, COUNT(*) AS n {J} WHERE 1 = 0 GROUP BY e.cc UNION ALL "
                f"SELECT e.cc, COUNT(*) AS n {J} GROUP BY e.cc")
    answered(s, _grouping_sets("1 = 1"))
    answered(s, _union_all("e.v > 0"))


# ------------------------------------------------------------------------------------------- a public lookup's rows


@pytest.mark.parametrize("sql", [
    f"SELECT e.cc, COUNT(*) AS n {J} WHERE r.rname = 'ATLANTIS' GROUP BY e.cc",
    f"SELECT e.cc, COUNT(*) AS n {J} WHERE r.rname LIKE '_' GROUP BY e.cc",
    f"SELECT e.cc, COUNT(*) AS n {J} WHERE r.rname = 'North' AND r.rg = 's' AND e.v > 0 GROUP BY e.cc",
    f"SELECT e.cc, COUNT(*) AS n, SUM(e.v) AS v {J} WHERE r.rg IN ('x', 'y') GROUP BY e.cc",
    "SELECT e.cc, COUNT(*) AS n FROM events e JOIN countries c ON e.cc = c.code WHERE c.pop > 1000 GROUP BY e.cc",
    "SELECT e.cc, COUNT(*) AS n FROM events e JOIN regions r ON e.rg = r.rg AND r.rname = 'ATLANTIS' GROUP BY e.cc",
    f"SELECT e.cc, COUNT(*) AS n {L} WHERE r.rname = 'ATLANTIS' GROUP BY e.cc",
    _grouping_sets("r.rname = 'ATLANTIS'"),
    _union_all("r.rname = 'ATLANTIS'"),
])
def test_a_where_keeping_no_row_of_a_public_lookup_is_refused_for_free(env: Any, sql: str) -> None:
    """Was: charged and released no row (each joined tuple holds a row of the lookup, or, LEFT joined, its NULLs;
    none of which meets the conditions on its columns). Now refused before the charge, from the public rows alone."""
    s, _ = env
    text = refused_for_free(s, sql, "keeps no row of the public table")
    assert "'regions' (r)" in text or "'countries' (c)" in text
    assert ("nor its row of NULLs" in text) == ("LEFT JOIN" in sql)


@pytest.mark.parametrize("sql", [
    f"SELECT e.cc, COUNT(*) AS n {J} WHERE r.rname = 'North' GROUP BY e.cc",  # one public row kept
    f"SELECT e.cc, COUNT(*) AS n {J} WHERE r.rname LIKE 'N%' AND r.rg = 'n' GROUP BY e.cc",
    f"SELECT e.cc, COUNT(*) AS n {J} WHERE r.rname = 'ATLANTIS' OR e.v > 0 GROUP BY e.cc",  # not over r alone
    f"SELECT e.cc, COUNT(*) AS n {L} WHERE r.rname IS NULL GROUP BY e.cc",  # the LEFT join's row of NULLs
    f"SELECT e.cc, COUNT(*) AS n {L} WHERE COALESCE(r.rname, 'ATLANTIS') = 'ATLANTIS' GROUP BY e.cc",
    "SELECT e.cc, COUNT(*) AS n FROM events e LEFT JOIN regions r ON e.rg = r.rg AND r.rname = 'ATLANTIS' "
    "GROUP BY e.cc",  # a LEFT join's ON filter keeps every private row
    _union_all("r.rname = 'South'"),
])
def test_a_where_keeping_some_public_row_is_answered(env: Any, sql: str) -> None:
    """Negative control: a condition that keeps one public row (or the LEFT join's row of NULLs), or that reads a
    private column too, may release a row: answered and charged as before."""
    s, _ = env
    answered(s, sql)


def test_a_where_keeping_no_public_row_over_public_keys_still_releases_noisy_zeros(env: Any) -> None:
    """Negative control: over a public key set (a declared domain) or without GROUP BY, the release has its rows
    whatever the data (noisy zeros, a noisy count): answered."""
    s, _ = env
    assert answered(s, f"SELECT e.kind, COUNT(*) AS n {J} WHERE r.rname = 'ATLANTIS' GROUP BY e.kind")
    assert answered(s, f"SELECT COUNT(*) AS n {J} WHERE r.rname = 'ATLANTIS'") == [{"n": 0}]


def test_the_decision_reads_the_public_rows_only(env: Any) -> None:
    """A region named ATLANTIS that no private row joins: the same query is answered (the public table has the row;
    whether any private row reaches it is the release's to say)."""
    _, t = env
    regions = t["regions"]
    more = pa.table({"rg": [*regions.column("rg").to_pylist(), "z"],
                     "rname": [*regions.column("rname").to_pylist(), "ATLANTIS"]})
    s = fz.session({**t, "regions": more})
    try:
        answered(s, f"SELECT e.cc, COUNT(*) AS n {J} WHERE r.rname = 'ATLANTIS' GROUP BY e.cc")
    finally:
        s.close()


def test_text_conditions_are_decided_as_the_release_compares_text() -> None:
    """Under a connection whose default collation is NOCASE the release still compares text under the binary collation
    (`c.region = 'north'` keeps no 'North' row; `c.region < 'a'` keeps 'North'): the check decides the same, refusing
    the first for free and answering the second, inner or LEFT joined."""
    import duckdb

    import dpsql
    from dpsql.testing import use_noise, zero_noise

    con = duckdb.connect()
    con.execute("SET default_collation = 'nocase'")
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), connection=con)
    try:
        use_noise(s, zero_noise(23))
        s.register("codes_t", pa.table({"code": ["k0", "k1"], "region": ["North", "South"]}), public=True)
        s.register("events_t", pa.table({"uid": [u for u in range(60) for _ in range(2)],
                                         "cc": [f"k{(u + j) % 4}" for u in range(60) for j in range(2)]}),
                   privacy_unit="uid", references={"cc": "codes_t.code"})
        for j in ("JOIN", "LEFT JOIN"):
            sql = f"SELECT e.cc AS k, COUNT(*) AS n FROM events_t e {j} codes_t c ON e.cc = c.code WHERE {{}} GROUP BY e.cc"
            refused_for_free(s, sql.format("c.region = 'north'"), "keeps no row of the public table 'codes_t'")
            assert {r["k"] for r in answered(s, sql.format("c.region < 'a'"))} == {"k0", "k1"}
    finally:
        s.close()
        con.close()
