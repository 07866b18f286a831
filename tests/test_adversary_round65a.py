"""Neighbouring datasets, zero noise, one table: what a query whose release has no row whatever the data costs.

* A release that has no row whatever the data was charged (a refusal that depends on the SQL and the catalog only
  costs nothing elsewhere: ``LIMIT 0``, an OFFSET beyond a release over public keys, a WHERE that keeps no declared
  key, no DAWA bin, no listed value):
  - a HAVING with a constant conjunct that is not true (``HAVING 1 = 0``, ``HAVING FALSE``, ``HAVING NULL``, ``AND
    'a' = 'b'``): every released row is dropped, over public keys, over keys released above the threshold, and
    without GROUP BY;
  - an OFFSET of one or more rows without GROUP BY (the release is one row, a quantile's too; refused by the
    analysis meanwhile, ``dpsql.plan.checks.OFFSET_SCALAR``, and tested here);
  - a WHERE with a constant conjunct that is not true over keys released above a noisy threshold (``WHERE 1 = 0
    GROUP BY s``): no group can pass the threshold. (Over public keys such a WHERE releases noisy zeros, and without
    GROUP BY a noisy count: both are answered.)
  Now each is refused before the charge. In a request of several groupings or a UNION ALL it is refused only when
  each of its queries has no row (``GROUP BY ROLLUP (k) HAVING GROUPING(k) = 1`` is ``HAVING 0 = 1`` in the query
  grouping by k, and the total keeps its row: answered as before).
* The same for several groupings and UNION ALL: an OFFSET at or past every row their queries can release when each
  has public keys (``GROUP BY ROLLUP (k) OFFSET 4`` over three declared keys and the total; a UNION ALL of two counts
  ``OFFSET 2``) was charged and released no row; refused before the charge since ``dpsql.groupings`` counts the rows
  such a request can have (these tests check it, each query's and each SELECT's own LIMIT and OFFSET included; keys
  above a threshold leave the count unknown, and are answered).
* A ``/* sqlglot.meta start=abc */`` comment set sqlglot's own record of a node's place in the text to text: a refusal
  naming the node failed with a bare TypeError (free, but the command line's exit 1 and no message). A comment
  holding ``sqlglot.meta`` is now dropped before the parse (sqlglot's other keys, ``nonnull``, ``case_sensitive``,
  change what it makes of a node too; dpsql's own marks were dropped already).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise

TARGET = 7


def _last(s: dpsql.Session) -> tuple[Any, ...] | None:
    h = s.history()
    if h.num_rows == 0:
        return None
    row = h.slice(h.num_rows - 1).to_pylist()[0]
    return row["entry_id"], row["status"], row["failure_reason"]


def observe(s: dpsql.Session, sql: str, delta: float = 1e-6) -> dict[str, Any]:
    """Everything the analyst sees of one query but the released values: outcome, message, charge, row count."""
    before = _last(s)
    try:
        r = s.query(sql, epsilon=1.0, delta=delta)
        out: dict[str, Any] = {"outcome": "ok", "schema": [(f.name, str(f.type)) for f in r.table.schema],
                               "rows": r.table.num_rows}
    except errors.DPSQLError as e:
        out = {"outcome": type(e).__name__, "message": str(e)}
    after = _last(s)
    out["charged"] = after != before
    return out


def _pair(**register: Any) -> list[dpsql.Session]:
    """D (with person 7, who holds the only 'w' text) and D' (without): 600 other people in three texts."""
    con = duckdb.connect()
    con.execute("CREATE TABLE d_full (uid BIGINT, k VARCHAR, s VARCHAR, x DOUBLE, i INTEGER)")
    con.execute(f"INSERT INTO d_full VALUES ({TARGET}, 'a', 'w', 10.0, 49)")
    con.execute("INSERT INTO d_full SELECT 1000 + r, ['a','b','c'][r % 3 + 1], ['x','y','z'][r % 3 + 1], "
                "(r % 10)::DOUBLE, r % 50 FROM range(0, 600) t(r)")
    con.execute(f"CREATE TABLE d_minus AS SELECT * FROM d_full WHERE uid <> {TARGET}")
    out = []
    for name in ("d_full", "d_minus"):
        s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9), connection=con)
        use_noise(s, zero_noise())
        s.register("t", name, privacy_unit="uid", max_groups_per_unit=2, max_rows_per_unit=4,
                   columns={"k": {"domain": ["a", "b", "c"]}, "x": {"bounds": (0, 10)}, "i": {"bounds": (0, 100)}},
                   **register)
        out.append(s)
    return out


@pytest.fixture(scope="module")
def sessions() -> Any:
    ss = _pair()
    yield ss
    for s in ss:
        s.close()


NOTHING = [
    # a constant HAVING that is not true: over public keys, keys above a threshold, no GROUP BY, a quantile
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING 1 = 0",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING k = 'a' AND FALSE",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING NULL",
    "SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING FALSE",
    "SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING COUNT(*) > 3 AND 'a' = 'b'",
    "SELECT COUNT(*) AS n FROM t HAVING 1 = 0",
    "SELECT k, median(x) AS q FROM t GROUP BY k HAVING 1 > 2",
    # an OFFSET past the one row of a release without GROUP BY
    "SELECT COUNT(*) AS n FROM t OFFSET 1",
    "SELECT SUM(x) AS n, COUNT(*) AS m FROM t LIMIT 3 OFFSET 2",
    "SELECT quantile_cont(x, 0.5) AS q FROM t OFFSET 1",
    # a constant WHERE that is not true, over keys released above a noisy threshold
    "SELECT s, COUNT(*) AS n FROM t WHERE 1 = 0 GROUP BY s",
    "SELECT s, COUNT(*) AS n FROM t WHERE FALSE GROUP BY s",
    "SELECT s, COUNT(*) AS n FROM t WHERE x > 1 AND NULL GROUP BY s",
    "SELECT s, k, SUM(x) AS n FROM t WHERE 'a' > 'b' GROUP BY s, k",
]


@pytest.mark.parametrize("sql", NOTHING)
def test_a_release_with_no_row_whatever_the_data_is_refused_for_free(sessions: Any, sql: str) -> None:
    a, b = (observe(s, sql) for s in sessions)
    assert a == b
    assert a["outcome"] == "UnsupportedQueryError" and not a["charged"], a
    assert "nothing was charged" in a["message"]


ANSWERED = [
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING 1 = 1", 3),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k HAVING k = 'a' OR FALSE", 1),
    ("SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING TRUE AND COUNT(*) > 3", 3),
    ("SELECT COUNT(*) AS n FROM t OFFSET 0", 1),
    ("SELECT COUNT(*) AS n FROM t LIMIT 1", 1),
    ("SELECT COUNT(*) AS n FROM t WHERE FALSE", 1),  # a noisy count of no row: a release
    ("SELECT k, COUNT(*) AS n FROM t WHERE 1 = 0 GROUP BY k", 3),  # public keys: noisy zeros
    ("SELECT s, COUNT(*) AS n FROM t WHERE 1 = 1 GROUP BY s", 3),
    ("SELECT s, COUNT(*) AS n FROM t WHERE x > 100 GROUP BY s", 0),  # depends on the rows: answered
]


def test_negative_control_a_large_declared_domain_with_a_false_where_is_answered(sessions: Any,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared keys beyond the size whose key set is checked before the charge (no key set is handed to the check):
    still public keys, released with noisy zeros."""
    import dpsql.mechanisms.basic as basic

    monkeypatch.setattr(basic, "KEY_DOMAIN_CHECK_LIMIT", 2)
    a = observe(sessions[0], "SELECT k, COUNT(*) AS n FROM t WHERE 1 = 0 GROUP BY k")
    assert a["outcome"] == "ok" and a["rows"] == 3, a


@pytest.mark.parametrize(("sql", "rows"), ANSWERED)
def test_negative_control_a_release_that_can_have_rows_is_answered(sessions: Any, sql: str, rows: int) -> None:
    a, b = (observe(s, sql) for s in sessions)
    assert a == b
    assert a["outcome"] == "ok" and a["charged"] and a["rows"] == rows, a


# -- several groupings, UNION ALL: an OFFSET past every row the public keys allow ------------------------------------

GROUPED_NOTHING = [
    "SELECT k, COUNT(*) AS n FROM t GROUP BY ROLLUP (k) ORDER BY k OFFSET 4",  # three keys and the total
    "SELECT k, i, COUNT(*) AS n FROM t WHERE i IN (1, 2) GROUP BY CUBE (k, i) ORDER BY k OFFSET 12",  # 6 + 3 + 2 + 1
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k UNION ALL SELECT k, COUNT(*) AS n FROM t GROUP BY k OFFSET 6",
    "SELECT COUNT(*) AS n FROM t UNION ALL SELECT COUNT(*) AS n FROM t LIMIT 1 OFFSET 2",
    "(SELECT k, COUNT(*) AS n FROM t GROUP BY k LIMIT 1) UNION ALL (SELECT k, COUNT(*) AS n FROM t GROUP BY k OFFSET 2) "
    "OFFSET 2",
]


@pytest.mark.parametrize("sql", GROUPED_NOTHING)
def test_an_offset_past_the_rows_of_several_releases_over_public_keys_is_refused_for_free(sessions: Any, sql: str) -> None:
    """Each query of the request has at most one row per public key (one without GROUP BY): an OFFSET at or past their
    sum leaves no row whatever the data (it was charged and released no row). One query alone is refused so."""
    a, b = (observe(s, sql) for s in sessions)
    assert a == b
    assert a["outcome"] == "UnsupportedQueryError" and not a["charged"], a
    assert "nothing was charged" in a["message"]
    with pytest.raises(errors.UnsupportedQueryError, match="OFFSET"):
        sessions[0].explain(sql, epsilon=1.0, delta=1e-6)


GROUPED_ANSWERED = [
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY ROLLUP (k) ORDER BY k NULLS LAST OFFSET 3", 1),
    ("SELECT k, i, COUNT(*) AS n FROM t WHERE i IN (1, 2) GROUP BY CUBE (k, i) ORDER BY k NULLS LAST OFFSET 11", 1),
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k UNION ALL SELECT k, COUNT(*) AS n FROM t GROUP BY k OFFSET 5", 1),
    ("SELECT COUNT(*) AS n FROM t UNION ALL SELECT COUNT(*) AS n FROM t OFFSET 1", 1),
    ("(SELECT k, COUNT(*) AS n FROM t GROUP BY k LIMIT 1) UNION ALL (SELECT k, COUNT(*) AS n FROM t GROUP BY k OFFSET 2) "
     "OFFSET 1", 1),
    # keys released above a threshold: how many is not known before the run
    ("SELECT s, COUNT(*) AS n FROM t GROUP BY ROLLUP (s) ORDER BY s OFFSET 3", 1),
]


@pytest.mark.parametrize(("sql", "rows"), GROUPED_ANSWERED)
def test_negative_control_an_offset_below_them_is_answered(sessions: Any, sql: str, rows: int) -> None:
    a, b = (observe(s, sql) for s in sessions)
    assert a == b
    assert a["outcome"] == "ok" and a["charged"] and a["rows"] == rows, a


# -- a comment's sqlglot.meta marks -----------------------------------------------------------------------------------

MARKED = [
    # sqlglot keeps a node's place in the text in its meta (start, end): a comment set them to text, and the refusal
    # naming the node failed on them with a bare TypeError (the command line's exit 1)
    "SELECT COUNT(*) AS n FROM t WHERE nosuch /* sqlglot.meta start=abc */ = 1",
    "SELECT COUNT(*) AS n, foo(x) /* sqlglot.meta start=-1, end=100000 */ FROM t",
    "SELECT COUNT(*) AS n FROM t WHERE s /* sqlglot.meta end=x */ = 5",
]


@pytest.mark.parametrize("sql", MARKED)
def test_a_comments_marks_of_sqlglot_set_nothing(sessions: Any, sql: str) -> None:
    """A comment means nothing to the query, whatever it holds: the query is refused as without it."""
    plain = sql.replace(sql[sql.index("/*"):sql.index("*/") + 3], "")
    for s in sessions:
        with pytest.raises(errors.QueryError) as marked:
            s.explain(sql, epsilon=1.0, delta=1e-6)
        with pytest.raises(errors.QueryError) as alone:
            s.explain(plain, epsilon=1.0, delta=1e-6)
        assert type(marked.value) is type(alone.value)
        assert str(marked.value).split(" (line")[0] == str(alone.value).split(" (line")[0]


def test_negative_control_a_plain_comment_is_dropped(sessions: Any) -> None:
    r = sessions[0].query("SELECT k /* a note, start=abc */, COUNT(*) AS n FROM t GROUP BY k -- sqlglot", epsilon=1.0,
                          delta=1e-6)
    assert r.table.column("k").to_pylist() == ["a", "b", "c"]


def test_a_qualify_over_public_keys_that_keeps_none_is_refused_for_free(sessions: Any) -> None:
    """``QUALIFY row_number() OVER (ORDER BY k) > 3`` over three declared keys keeps no row whatever the data (the
    windows read the keys alone, whose set is public): it was charged, no row. A QUALIFY that reads the keys alone
    (over a HAVING on the keys alone) is now evaluated on the key set before the charge, as those conditions are."""
    a = observe(sessions[0], "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY k) > 3")
    assert a["outcome"] == "UnsupportedQueryError" and not a["charged"], a


def test_negative_control_a_qualify_that_keeps_a_key_is_answered(sessions: Any) -> None:
    a = observe(sessions[0], "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY k) > 2")
    assert a["outcome"] == "ok" and a["rows"] == 1, a


@pytest.mark.parametrize("where", ["i > 5 AND i < 3", "i <> i", "s IS NULL AND s IS NOT NULL", "s > 'z' AND s < 'a'"])
def test_a_contradiction_over_keys_above_a_threshold_is_refused_for_free(sessions: Any, where: str) -> None:
    """No row meets the WHERE whatever the data, so no group can pass the threshold: it was charged and released no
    row (over listed keys, ``i IN (1, 2) AND i > 5``, it was refused for free). Conditions on one column alone are now
    decided before the charge (``dpsql.plan.satisfiable``; tests/test_where_contradictions.py)."""
    a = observe(sessions[0], f"SELECT s, COUNT(*) AS n FROM t WHERE {where} GROUP BY s")
    assert a["outcome"] == "UnsupportedQueryError" and not a["charged"], a


def test_negative_control_a_contradiction_over_listed_keys_is_refused_for_free(sessions: Any) -> None:
    a = observe(sessions[0], "SELECT i, COUNT(*) AS n FROM t WHERE i IN (1, 2) AND i > 5 GROUP BY i")
    assert a["outcome"] == "UnsupportedQueryError" and not a["charged"], a


@pytest.mark.parametrize(("sql", "rows"), [
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY ROLLUP (k) HAVING GROUPING(k) = 1", 1),  # the total's row
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY ROLLUP (k) HAVING GROUPING(k) = 0", 3),
    ("SELECT k, s, COUNT(*) AS n FROM t GROUP BY GROUPING SETS ((k), (s)) HAVING GROUPING(k) = 0", 3),
    ("SELECT COUNT(*) AS n FROM t UNION ALL SELECT COUNT(*) AS n FROM t HAVING 1 = 0", 1),
])
def test_negative_control_one_query_of_several_without_a_row_leaves_the_others_answered(sessions: Any, sql: str,
                                                                                     rows: int) -> None:
    """``GROUPING(k) = 1`` is ``0 = 1`` in the query grouping by k (no row whatever the data) and ``1 = 1`` in the
    total's: the request is answered, as before (only a request each of whose queries has no row is refused)."""
    a, b = (observe(s, sql) for s in sessions)
    assert a == b
    assert a["outcome"] == "ok" and a["charged"] and a["rows"] == rows, a


def test_a_request_each_of_whose_queries_has_no_row_is_refused_for_free(sessions: Any) -> None:
    for sql in ("SELECT k, COUNT(*) AS n FROM t GROUP BY ROLLUP (k) HAVING 1 = 0",
                "SELECT COUNT(*) AS n FROM t HAVING FALSE UNION ALL SELECT COUNT(*) AS n FROM t HAVING NULL"):
        a = observe(sessions[0], sql)
        assert a["outcome"] == "UnsupportedQueryError" and not a["charged"], a
        with pytest.raises(errors.UnsupportedQueryError, match="not true whatever the data"):
            sessions[0].explain(sql, epsilon=1.0, delta=1e-6)
