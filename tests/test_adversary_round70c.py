"""The free refusal of a WHERE keeping no row of a public lookup table names the conditions as they combine.

A lookup join (a private table joined with public lookups on their keys) grouped by keys released above a noisy
threshold is refused before any charge when the WHERE's conditions on one public lookup's columns alone keep none of
its rows (nor, LEFT joined, its row of NULLs): the release would have no row whatever the data. The refusal names
those conditions; an OR among several was shown without its parentheses, so
`(r.rname = 'North' OR r.rname = 'South') AND r.rg = 'q'` was named as `r.rname = 'North' OR r.rname = 'South' AND
r.rg = 'q'`, a condition the 'North' row meets (SQL's AND binds first): the message contradicted itself. Now each OR
among several conditions keeps its parentheses (as the refusal of a column's conditions already did).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import _join_oracle_fuzz as fz  # noqa: E402

from dpsql.errors import UnsupportedQueryError  # noqa: E402


@pytest.fixture(scope="module")
def env() -> Any:
    s = fz.session(fz.data(5))  # regions: n North, s South, e East (or NULL), w West
    yield s
    s.close()


def ask(s: Any, sql: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return s.query(sql, epsilon=2.0, delta=1e-5)


def refused_for_free(s: Any, sql: str) -> str:
    before = s.history().num_rows
    with pytest.raises(UnsupportedQueryError, match="keeps no row of the public table 'regions'") as e:
        ask(s, sql)
    assert s.history().num_rows == before, sql
    return str(e.value)


@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN"])
def test_an_or_among_the_lookup_conditions_is_named_in_its_parentheses(env: Any, join: str) -> None:
    """Was: `WHERE r.rname = 'North' OR r.rname = 'South' AND r.rg = 'q' keeps no row` (a condition the North row
    meets). Now `WHERE (r.rname = 'North' OR r.rname = 'South') AND r.rg = 'q' keeps no row`; refused for free as
    before (no region has the key 'q')."""
    text = refused_for_free(env, f"SELECT e.cc, COUNT(*) AS n FROM events e {join} regions r ON e.rg = r.rg "
                                 "WHERE (r.rname = 'North' OR r.rname = 'South') AND r.rg = 'q' GROUP BY e.cc")
    assert "WHERE (r.rname = 'North' OR r.rname = 'South') AND r.rg = 'q' keeps no row" in text


def test_a_lone_or_is_named_as_written(env: Any) -> None:
    """Negative control: one condition, an OR, is named without added parentheses; two plain conditions as written."""
    text = refused_for_free(env, "SELECT e.cc, COUNT(*) AS n FROM events e JOIN regions r ON e.rg = r.rg "
                                 "WHERE r.rname = 'ATLANTIS' OR r.rg = 'q' GROUP BY e.cc")
    assert "WHERE r.rname = 'ATLANTIS' OR r.rg = 'q' keeps no row" in text
    text = refused_for_free(env, "SELECT e.cc, COUNT(*) AS n FROM events e JOIN regions r ON e.rg = r.rg "
                                 "WHERE r.rname = 'North' AND r.rg = 's' GROUP BY e.cc")
    assert "WHERE r.rname = 'North' AND r.rg = 's' keeps no row" in text


def test_the_lookup_rows_are_read_at_each_request() -> None:
    """Control: a public lookup registered from the caller's DuckDB table is read at each request, so a row added to
    it between two requests is seen (refused for free before, answered after; no decision is kept between them)."""
    import duckdb
    import pyarrow as pa

    import dpsql
    from dpsql.testing import use_noise, zero_noise

    con = duckdb.connect()
    con.execute("CREATE TABLE codes (code VARCHAR, region VARCHAR)")
    con.execute("INSERT INTO codes VALUES ('k0', 'North'), ('k1', 'South')")
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), connection=con)
    try:
        use_noise(s, zero_noise(23))
        s.register("codes", "codes", public=True)
        s.register("ev", pa.table({"uid": [u for u in range(60) for _ in range(2)],
                                   "cc": [f"k{(u + j) % 4}" for u in range(60) for j in range(2)]}),
                   privacy_unit="uid", references={"cc": "codes.code"})
        sql = ("SELECT e.cc, COUNT(*) AS n FROM ev e JOIN codes c ON e.cc = c.code WHERE c.region = 'East' "
               "GROUP BY e.cc")
        before = s.history().num_rows
        with pytest.raises(UnsupportedQueryError, match="keeps no row of the public table 'codes'"):
            ask(s, sql)
        assert s.history().num_rows == before
        con.execute("INSERT INTO codes VALUES ('k2', 'East')")
        assert [r["cc"] for r in ask(s, sql).to_pylist()] == ["k2"]
        assert s.history().num_rows == before + 1
    finally:
        s.close()
        con.close()


def test_the_check_of_the_public_rows_decides_at_most_256_constants(env: Any) -> None:
    """The check types and counts the conditions anew at every request (about 0.2 ms a constant): conditions on the
    public lookup with more than 256 constants are left undecided, and the query runs and is charged as before, as the
    one-column check of a WHERE does beyond ``postprocess.MEETS_MOST_CONSTANTS``. Up to 256 they are decided."""
    def q(n: int) -> str:
        listed = ", ".join(f"'x{i}'" for i in range(n))
        return (f"SELECT e.cc, COUNT(*) AS n FROM events e JOIN regions r ON e.rg = r.rg WHERE r.rname IN ({listed}) "
                "GROUP BY e.cc")

    refused_for_free(env, q(256))
    before = env.history().num_rows
    assert ask(env, q(257)).table.num_rows == 0
    assert env.history().num_rows == before + 1
