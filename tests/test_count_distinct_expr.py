"""COUNT(DISTINCT expr) over a typed, total expression: its value rendered as a GROUP BY key is (binary
collation, one spelling of 0.0 and NaN), NULL not counted, at most k values per (person, group): the
stated sensitivity holds when one person is removed, the zero-noise answers are DuckDB's own, text values
are listed through the salted digest (as a text column's are), and what stays refused is refused for free."""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from test_bounding import (
    assert_unbounded_caught,
    assert_within_sensitivity,
    gen_dataset,
    plan_for,
    spec_for,
)
from test_sql_coverage import free

import dpsql
from dpsql.plan import ir
from dpsql.rewrite.bound import Caps, bounded_query, released_columns
from dpsql.rewrite.render import render
from dpsql.testing import use_noise, zero_noise

SENS = [
    "SELECT g, COUNT(DISTINCT h % 2), COUNT(DISTINCT lower(note) || g) FROM t GROUP BY g",
    "SELECT COUNT(DISTINCT floor(age / 10)), COUNT(DISTINCT CASE WHEN amount > 50 THEN g END) FROM t",
    "SELECT h, COUNT(DISTINCT upper(g)), SUM(amount) FROM t GROUP BY h",
]


def test_removing_one_user_stays_within_the_stated_sensitivity() -> None:
    assert_within_sensitivity(SENS, 2026_12_06, 30)


def test_sensitivity_check_fails_without_bounding() -> None:
    """Negative control: the same check catches the unbounded queries."""
    assert_unbounded_caught(SENS, 2026_12_06)


def test_the_sensitivity_is_k_values() -> None:
    spec = spec_for("t", gen_dataset(np.random.default_rng(1)))
    plan = plan_for("SELECT COUNT(DISTINCT lower(g)) FROM t", spec)
    assert [a.kind for a in plan.aggregates] == [ir.COUNT_DISTINCT] and plan.aggregates[0].value is not None
    assert {c.name: c.sensitivity for c in released_columns(plan, Caps(1, 3))} == {"__users": 1.0, "__a0": 3.0}


def test_text_values_are_listed_through_the_salted_digest_numbers_as_they_are() -> None:
    """A person's text values crafted to share the engine's hash made the distinct lists quadratic: an expression's
    text is listed as the salted text's digest, as a text column's is; an integer value as it is."""
    spec = spec_for("t", gen_dataset(np.random.default_rng(1)))
    text = render(bounded_query(plan_for("SELECT COUNT(DISTINCT lower(g)) FROM t", spec), Caps(1, 3),
                                salt="SALTSALT", unit_column="user_id"))
    assert "'SALTSALT' ||" in text and "MD5_NUMBER" in text.upper()
    num = render(bounded_query(plan_for("SELECT COUNT(DISTINCT h % 2) FROM t", spec), Caps(1, 3),
                               salt="SALTSALT", unit_column="user_id"))
    assert "'SALTSALT' ||" not in num


# -- end to end ---------------------------------------------------------------------------------------------


def _people() -> pa.Table:
    emails = ["A@x.com", "a@X.com", "b@y.com", None, "C@z.com", "c@z.com", "d@x.com", None, "e@y.org", "E@Y.ORG"]
    amounts = [0.0, -0.0, 1.5, float("nan"), 2.0, None, 3.0, -float("nan"), 1.5, 2.0]
    return pa.table({"uid": list(range(10)), "email": emails, "amount": amounts, "d": list(range(10)),
                     "g": ["a", "b"] * 5})


@pytest.fixture
def s() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("t", _people(), privacy_unit="uid", columns={"g": {"domain": ["a", "b"]}})
    con = duckdb.connect()
    con.register("t", _people())
    yield sess, con
    sess.close()
    con.close()


@pytest.mark.parametrize("expr", [
    "lower(email)", "split_part(lower(email), '@', 2)", "amount * 2", "d % 3", "NULL",
    "CASE WHEN amount > 1 THEN 'big' END", "email || ''",
])
def test_zero_noise_is_duckdbs_own(s: Any, expr: str) -> None:
    """One row a person: nothing is dropped, so the count is DuckDB's (NULL not counted; 0.0 and -0.0 one
    value, NaN one value, as DuckDB's DISTINCT tells them apart)."""
    sess, con = s
    sql = f"SELECT COUNT(DISTINCT {expr}) AS n FROM t"
    want = con.execute(sql).fetchone()[0]
    assert sess.query(sql, epsilon=5.0, delta=1e-6).to_pylist() == [{"n": want}], expr


def test_public_keys_and_nulls(s: Any) -> None:
    sess, con = s
    sql = "SELECT g, COUNT(DISTINCT lower(email)) AS n, COUNT(DISTINCT amount * 2) AS m FROM t GROUP BY g ORDER BY g"
    got = sess.query(sql, epsilon=5.0, delta=1e-6).to_pylist()
    want = [dict(zip(("g", "n", "m"), row)) for row in con.execute(sql).fetchall()]
    assert got == want
    # the same expression as COUNT(DISTINCT ...) and as COUNT(...): two aggregates, each answered
    got = sess.query("SELECT COUNT(DISTINCT d % 3) AS a, COUNT(d % 3) AS b FROM t", epsilon=5.0, delta=1e-6).to_pylist()
    assert got == [{"a": 3, "b": 10}]


def test_what_stays_refused_is_refused_for_free(s: Any) -> None:
    sess, _ = s
    sess.register("iv", pa.table({"uid": [1, 2], "x": [1, 2]}), privacy_unit="uid")
    msg = free(sess, "SELECT COUNT(DISTINCT email, g) FROM t")
    assert "takes one column or expression, not several" in msg
    msg = free(sess, "SELECT COUNT(DISTINCT frobnicate(email)) FROM t")
    assert "frobnicate" in msg and "the query has" not in msg  # one problem
    assert "random" in free(sess, "SELECT COUNT(DISTINCT random()) FROM t")
    msg = free(sess, "SELECT COUNT(DISTINCT [x, x]) FROM iv")
    assert "array" in msg or "list" in msg
    # a collation would merge spellings (the values are counted by their text, as keys are)
    assert "COLLATE is not allowed" in free(sess, "SELECT COUNT(DISTINCT upper(email) COLLATE NOCASE) FROM t")


@pytest.mark.parametrize("arg", ["(email, g)", "((email, g))", "ROW(email, g)", "row(email, amount)",
                                 "{'e': email, 'g': g}", "struct_pack(e := email, g := g)"])
def test_a_row_of_values_is_refused_naming_the_combinations_and_the_fix(s: Any, arg: str) -> None:
    """DuckDB counts the distinct combinations of a row's values (a tuple with NULL fields too); dpsql refused it as a
    TUPLE or row() off the allow-list (a struct with three problems), naming neither what it counts nor the fix."""
    sess, _ = s
    msg = free(sess, f"SELECT COUNT(DISTINCT {arg}) FROM t")
    assert "the query has" not in msg and "allow-list" not in msg, msg  # one problem
    assert "counts the distinct combinations of several values" in msg and "GROUP BY" in msg, msg
    assert f"COUNT(DISTINCT {arg})" in msg or "struct_pack" in arg, msg  # (a struct is quoted as DuckDB spells it)
