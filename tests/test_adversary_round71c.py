"""Free refusals of releases with no row whatever the data: a LEFT JOIN's ON filter, a UNION ALL's OFFSET.

Releases were charged that had no row whatever the data:

* A lookup join grouped by keys released above a noisy threshold whose WHERE keeps no row of a LEFT-joined public
  lookup is refused for free (public rows only). A LEFT JOIN's ON conditions on the lookup's columns alone filter the
  lookup's rows before the join (SQL's LEFT JOIN of ``(SELECT * FROM lookup WHERE ...)``), so every joined row holds
  one of the rows they keep, or NULLs; the check read every row of the lookup, so ``LEFT JOIN regions r ON (e.rg =
  r.rg AND r.rname = 'North') WHERE r.rname = 'South'`` was charged for no row. Now it reads the rows the ON keeps.
* An OFFSET of a UNION ALL (or of several groupings) at or beyond the rows its queries can have is refused for free.
  Each query over public keys was counted as every key of its set, though the conditions on the keys alone (a WHERE
  on a declared key, a HAVING on the keys, a QUALIFY decided on the key set) keep fewer: ``SELECT k ... WHERE k = 'a'
  GROUP BY k UNION ALL SELECT s ... WHERE s = 'x' GROUP BY s OFFSET 2`` was charged for no row, where each query
  sent alone with OFFSET 1 is refused. A grouped join's key set read from public tables was not counted at all
  (``GROUP BY ROLLUP (r.rname) OFFSET 5`` over four regions was charged). Now each query counts the keys those
  conditions keep, as a query sent alone does.

What held (checked against the same queries without the new shortcut, at zero noise): a QUALIFY whose one
ROW_NUMBER() orders released values is refused before the charge only where the release has no row (declared keys,
DAWA's bins, listed keys, a LEFT-joined lookup's domain plus NULL, a grouped join's public key set), and an OFFSET after
it is counted as the release has it.
"""

from __future__ import annotations

import warnings
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import postprocess
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise

REGIONS = pa.table({"rg": ["n", "s", "e", "w"], "rname": ["North", "South", None, "West"]})
RGS = ["n", "s", "e", "w", "zz", None]


def _events(people: int) -> pa.Table:
    return pa.table({"uid": [u for u in range(people) for _ in range(2)],
                     "rg": [RGS[(u + j) % 6] for u in range(people) for j in range(2)],
                     "cc": [f"c{(u + j) % 3}" for u in range(people) for j in range(2)],
                     "v": [float((u * 7 + j) % 13) for u in range(people) for j in range(2)]})


def _lookup_session(events: pa.Table) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
    use_noise(s, zero_noise(71))
    s.register("regions", REGIONS, public=True)
    s.register("events", events, privacy_unit="uid", references={"rg": "regions.rg"}, max_rows_per_unit=2)
    return s


@pytest.fixture(scope="module")
def lookup() -> Any:
    s = _lookup_session(_events(90))
    yield s
    s.close()


@pytest.fixture(scope="module")
def keys() -> Any:
    con = duckdb.connect()
    con.execute("CREATE TABLE d AS SELECT r AS uid, ['a', 'b', 'c'][r % 3 + 1] AS k, r % 7 AS age, "
                "['x', 'y'][r % 2 + 1] AS s FROM range(0, 600) t(r)")
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), connection=con)
    use_noise(s, zero_noise(71))
    s.register("t", "d", privacy_unit="uid", max_groups_per_unit=2, max_rows_per_unit=4,
               columns={"k": {"domain": ["a", "b", "c"]}, "s": {"domain": ["x", "y"]},
                        "age": {"bounds": (0, 10), "bins": 5}})
    yield s
    s.close()
    con.close()


def ask(s: dpsql.Session, sql: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return s.query(sql, epsilon=1.0, delta=1e-5)


def refused_for_free(s: dpsql.Session, sql: str, match: str) -> str:
    before = s.history().num_rows
    with pytest.raises(UnsupportedQueryError, match=match) as e:
        ask(s, sql)
    assert s.history().num_rows == before, sql
    return str(e.value)


def answered(s: dpsql.Session, sql: str) -> list[dict[str, Any]]:
    before = s.history().num_rows
    rows = ask(s, sql).to_pylist()
    assert s.history().num_rows == before + 1, sql
    return rows


LEFT = "SELECT e.cc, COUNT(*) AS n FROM events e LEFT JOIN regions r ON {on} WHERE {where} GROUP BY e.cc"


@pytest.mark.parametrize("on", ["(e.rg = r.rg AND r.rname = 'North')", "e.rg = r.rg AND r.rname = 'North'",
                                "e.rg = r.rg AND (r.rname = 'North' OR r.rname = 'West')", "e.rg = r.rg AND FALSE"])
def test_a_where_keeping_no_row_the_left_joins_on_keeps_is_refused_for_free(lookup: Any, on: str) -> None:
    """Was: charged, and released no row (no joined row holds 'South': the ON keeps only North's or West's row, or
    none, and an unmatched row holds NULL). Now refused before any charge, naming the ON's conditions."""
    text = refused_for_free(lookup, LEFT.format(on=on, where="r.rname = 'South'"), "keep no row of the public table")
    assert text.startswith("ON ") and " and WHERE r.rname = 'South' keep no row of the public table 'regions' (r)" in text
    assert "nor its row of NULLs (LEFT JOIN)" in text


def test_several_groupings_are_refused_so_when_each_has_no_row(lookup: Any) -> None:
    """The same WHERE under GROUPING SETS of two keys released above a threshold is refused for free (each grouping has
    no row); under ROLLUP the total's row (a noisy count) is answered."""
    on, where = "(e.rg = r.rg AND r.rname = 'North')", "r.rname = 'South'"
    refused_for_free(lookup, f"SELECT e.cc, e.rg, COUNT(*) AS n FROM events e LEFT JOIN regions r ON {on} WHERE {where} "
                             "GROUP BY GROUPING SETS ((e.cc), (e.rg))", "ON r.rname = 'North' and WHERE")
    assert answered(lookup, LEFT.format(on=on, where=where).replace("GROUP BY e.cc", "GROUP BY ROLLUP (e.cc)")) \
        == [{"cc": None, "n": 0}]


def test_the_refusal_reads_the_public_rows_only(lookup: Any) -> None:
    """The same refusal, word for word, without one person (or with none of the people whose rows match a region)."""
    sql = LEFT.format(on="(e.rg = r.rg AND r.rname = 'North')", where="r.rname = 'South'")
    text = refused_for_free(lookup, sql, "keep no row")
    events = _events(90)
    for others in (events.filter(pa.compute.not_equal(events["uid"], 3)),
                   events.filter(pa.compute.is_null(events["rg"]))):
        s = _lookup_session(others)
        try:
            assert refused_for_free(s, sql, "keep no row") == text
        finally:
            s.close()


@pytest.mark.parametrize("on, where", [
    ("(e.rg = r.rg AND r.rname = 'North')", "r.rname = 'North'"),   # the row the ON keeps
    ("(e.rg = r.rg AND r.rname = 'North')", "r.rname IS NULL"),     # the row of NULLs of the unmatched rows
    ("(e.rg = r.rg AND e.v > 100)", "r.rname = 'South'"),           # an ON condition on the private table's column
    ("e.rg = r.rg", "r.rname = 'South'"),                           # no ON filter: the South row
])
def test_a_where_some_joined_row_may_meet_is_answered(lookup: Any, on: str, where: str) -> None:
    """Negative control: a WHERE that a row the ON keeps, the row of NULLs, or any lookup row meets (the ON's
    condition on the private table's column filters no lookup row) is answered and charged as before."""
    answered(lookup, LEFT.format(on=on, where=where))


UNIONS_REFUSED = [
    "SELECT k, COUNT(*) AS n FROM t WHERE k = 'a' GROUP BY k UNION ALL SELECT s, COUNT(*) AS n FROM t WHERE s = 'x' "
    "GROUP BY s OFFSET 2",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING k = 'a' UNION ALL SELECT k, COUNT(*) AS n FROM t GROUP BY k "
    "HAVING k = 'b' OFFSET 2",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY n) <= 1 UNION ALL "
    "SELECT s, COUNT(*) AS n FROM t GROUP BY s QUALIFY row_number() OVER (ORDER BY n) <= 1 OFFSET 2",
    "SELECT k, COUNT(*) AS n FROM t WHERE k = 'a' GROUP BY ROLLUP (k) OFFSET 2",
]


@pytest.mark.parametrize("sql", UNIONS_REFUSED)
def test_an_offset_past_the_keys_the_conditions_keep_is_refused_for_free(keys: Any, sql: str) -> None:
    """Was: charged, and released no row (each query has at most one row: the one key its conditions on the keys
    keep, or the one row its QUALIFY numbers 1; a ROLLUP's total one more). Now refused before any charge."""
    text = refused_for_free(keys, sql, "the OFFSET skips every row")
    assert "which has at most 2 (one per query without GROUP BY, one per public key the conditions on the keys keep" in text


@pytest.mark.parametrize("sql, want", [
    (UNIONS_REFUSED[0].replace("OFFSET 2", "OFFSET 1"), [{"k": "x", "n": 300}]),
    (UNIONS_REFUSED[1].replace("OFFSET 2", "OFFSET 1"), [{"k": "b", "n": 200}]),
    (UNIONS_REFUSED[3].replace("OFFSET 2", "OFFSET 1"), [{"k": None, "n": 200}]),
    # a HAVING on released values keeps a number of keys that depends on them: every key counted
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING n > 3 UNION ALL SELECT s, COUNT(*) AS n FROM t GROUP BY s "
     "OFFSET 4", [{"k": "y", "n": 300}]),
])
def test_an_offset_below_those_rows_is_answered(keys: Any, sql: str, want: list[dict[str, Any]]) -> None:
    """Negative control: one row fewer skipped is answered, with SQL's rows (zero noise)."""
    assert answered(keys, sql) == want


JOINED = "SELECT r.rname, COUNT(*) AS n FROM events e JOIN regions r ON e.rg = r.rg"


@pytest.mark.parametrize("sql, most", [
    (f"{JOINED} GROUP BY ROLLUP (r.rname) OFFSET 5", 5),
    (f"{JOINED} WHERE r.rname <> 'North' GROUP BY r.rname UNION ALL SELECT 'all', COUNT(*) FROM events OFFSET 3", 3),
])
def test_an_offset_past_a_grouped_joins_public_key_set_is_refused_for_free(lookup: Any, sql: str, most: int) -> None:
    """A grouped join's key set read from a public table (four regions' names, NULL included) was not counted in a
    query of several groupings or a UNION ALL (it is read at run time, not declared), so an OFFSET past its rows was
    charged for no row, where the query sent alone with that OFFSET is refused. Now it is read before the charge
    (public rows only) and counted, after the WHERE's conditions on the key."""
    refused_for_free(lookup, sql, f"which has at most {most} ")
    assert answered(lookup, sql.replace(f"OFFSET {most}", f"OFFSET {most - 1}")) in (
        [{"rname": None, "n": 120}], [{"rname": "all", "n": 180}])


NUMBERED = [
    # DAWA's bins 4, 6 and 8 (width 2) that age >= 5 keeps
    ("SELECT age, COUNT(*) AS n FROM t WHERE age >= 5 GROUP BY age QUALIFY row_number() OVER (ORDER BY COUNT(*)) > {m}",
     3),
    # the one declared key the list names ('q' is no key of k's domain)
    ("SELECT k, COUNT(*) AS n FROM t WHERE k IN ('a', 'q') GROUP BY k QUALIFY row_number() OVER (ORDER BY n) > {m}", 1),
]


@pytest.mark.parametrize("sql, rows", NUMBERED)
def test_a_row_number_over_released_values_is_decided_as_the_release_numbers_rows(
        keys: Any, sql: str, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held: the QUALIFY's row number over released values is refused for free exactly at the first bound past the
    rows the release has, which the release without the decision (charged) confirms: one row one bound lower, none
    there."""
    refused_for_free(keys, sql.format(m=rows), "keep no declared key")
    assert len(answered(keys, sql.format(m=rows - 1))) == 1
    original = postprocess._on_keys
    monkeypatch.setattr(postprocess, "_on_keys", lambda e, plan, numbered=True: original(e, plan, numbered=False))
    assert answered(keys, sql.format(m=rows)) == []


def test_a_long_in_list_in_the_on_leaves_the_where_decided_over_every_row(lookup: Any) -> None:
    """The check decides at most 256 constants: beyond them in the ON's conditions, the WHERE is decided over every row
    of the lookup (as before the ON was read), so `r.rname = 'ATLANTIS'` is still refused for free and `r.rname =
    'South'` is answered (charged: a South row may be kept by an ON of 300 names)."""
    listed = ", ".join(f"'x{i}'" for i in range(299))
    on = f"(e.rg = r.rg AND r.rname IN ('North', {listed}))"
    refused_for_free(lookup, LEFT.format(on=on, where="r.rname = 'ATLANTIS'"), "keeps no row of the public table "
                     "'regions' \\(r\\) nor its row of NULLs")
    answered(lookup, LEFT.format(on=on, where="r.rname = 'South'"))
