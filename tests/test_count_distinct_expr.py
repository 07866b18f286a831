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
from sqlglot import exp
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
    "SELECT g, COUNT(DISTINCT (h % 2, note)), COUNT(DISTINCT ROW(g, floor(age / 10))) FROM t GROUP BY g",
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
    assert "takes one column or expression, not several" in msg and "COUNT(DISTINCT (email, g))" in msg, msg
    msg = free(sess, "SELECT COUNT(DISTINCT frobnicate(email)) FROM t")
    assert "frobnicate" in msg and "the query has" not in msg  # one problem
    assert "random" in free(sess, "SELECT COUNT(DISTINCT random()) FROM t")
    msg = free(sess, "SELECT COUNT(DISTINCT [x, x]) FROM iv")
    assert "array" in msg or "list" in msg
    # a collation would merge spellings (the values are counted by their text, as keys are)
    assert "COLLATE is not allowed" in free(sess, "SELECT COUNT(DISTINCT upper(email) COLLATE NOCASE) FROM t")


@pytest.mark.parametrize("expr", [
    "(email, g)", "((email, g))", "ROW(lower(email), amount)", "row(email)", "(amount, NULL)", "(NULL, NULL)",
    "((email, d % 2), amount)", "(email, amount * 2, d % 3)", "(g, CASE WHEN amount > 1 THEN 'big' END)",
    "(" + ", ".join(["d % 2", "email"] * 32) + ")",  # (64 values: the most)
])
def test_a_row_counts_its_distinct_combinations_as_duckdb(s: Any, expr: str) -> None:
    """COUNT(DISTINCT (a, b)) / ROW(a, b): DuckDB counts the distinct rows, a row with NULL fields (or only NULLs) too
    (a row is never NULL); 0.0 and -0.0 one value, NaN one value, in each field as alone."""
    sess, con = s
    sql = f"SELECT COUNT(DISTINCT {expr}) AS n FROM t"
    want = con.execute(sql).fetchone()[0]
    assert sess.query(sql, epsilon=5.0, delta=1e-6).to_pylist() == [{"n": want}], expr
    grouped = f"SELECT g, COUNT(DISTINCT {expr}) AS n FROM t GROUP BY g ORDER BY g"
    assert sess.query(grouped, epsilon=5.0, delta=1e-6).to_pylist() == [
        {"g": g, "n": n} for g, n in con.execute(grouped).fetchall()], expr


def test_a_rows_fields_are_told_apart_whatever_their_text() -> None:
    """Fields are listed each as its length and text (``n`` for NULL): ('ab', 'c') and ('a', 'bc'), a field that
    spells another's encoding, 'NULL' and NULL, are distinct rows, as in DuckDB."""
    a = ["ab", "a", "a", "v1:a", None, "NULL", "", None, "x"]
    b = ["c", "bc", "v2:bc", "c", "NULL", None, "", "", "x"]
    t = pa.table({"uid": list(range(len(a))), "a": a, "b": b})
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("p", t, privacy_unit="uid")
    con = duckdb.connect()
    con.register("p", t)
    for sql in ("SELECT COUNT(DISTINCT (a, b)) AS n FROM p", "SELECT COUNT(DISTINCT (a || b, a, b)) AS n FROM p",
                "SELECT COUNT(DISTINCT ((a, b), (b, a))) AS n FROM p"):
        want = con.execute(sql).fetchone()[0]
        assert want == len(a)
        assert sess.query(sql, epsilon=5.0, delta=1e-6).to_pylist() == [{"n": want}], sql
    # negative control: the text alone, concatenated, merges rows
    assert con.execute("SELECT COUNT(DISTINCT coalesce(a, '') || coalesce(b, '')) FROM p").fetchone()[0] < len(a)


@pytest.mark.parametrize(("arg", "needle"), [
    ("{'e': email, 'g': g}", "write COUNT(DISTINCT (a, b))"), ("struct_pack(e := email, g := g)", "write COUNT(DISTINCT (a, b))"),
    ("(email, nosuch)", "unknown column 'nosuch'"), ("(email, INTERVAL 1 DAY)", "INTERVAL"),
    ("(email, [d, d])", "array"), ("(" + ", ".join(["d"] * 65) + ")", "a row of 65 values: at most 64"),
])
def test_what_stays_refused_in_a_row_is_refused_for_free(s: Any, arg: str, needle: str) -> None:
    sess, _ = s
    msg = free(sess, f"SELECT COUNT(DISTINCT {arg}) FROM t")
    assert needle in msg and "the query has" not in msg, msg


def test_a_list_column_in_a_counted_row_is_refused_naming_what_to_count_instead() -> None:
    """COUNT(DISTINCT (ls, 1)) with ``ls`` a LIST column was refused for free as 'of a value of type BIGINT[] ... count a
    value of a scalar type instead', which read as if the list could not be counted at all (COUNT(DISTINCT ls) alone
    is answered): the refusal now says a list column cannot be a field of a counted row, and what to count instead."""
    t = pa.table({"uid": [1, 2, 3], "ls": [[1], [2], [2]], "g": ["a", "b", "a"],
                  "s": pa.array([{"a": 1}, {"a": 2}, {"a": 2}])})
    sess = dpsql.Session(budget=dpsql.Budget(100.0, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("p", t, privacy_unit="uid")
    for arg, col, kind in (("(ls, 1)", "ls", "list"), ("ROW(g, ls)", "ls", "list"), ("((g, ls), g)", "ls", "list"),
                           ("(g, s)", "s", "struct")):
        msg = free(sess, f"SELECT COUNT(DISTINCT {arg}) FROM p")
        assert f"the {kind} column '{col}' cannot be a field of a counted row" in msg, msg
        assert f"COUNT(DISTINCT {col})" in msg and "leave it out of the row" in msg, msg
        assert "scalar type instead" not in msg and "the query has" not in msg, msg
    # what the message points to is answered
    for col in ("ls", "s"):
        assert sess.query(f"SELECT COUNT(DISTINCT {col}) AS n FROM p", epsilon=5.0, delta=1e-6).to_pylist() == [{"n": 2}]


def test_a_nested_rows_rendering_reads_each_field_a_bounded_number_of_times() -> None:
    """A row inside a row is its fields (a row is never NULL): each field is read a fixed number of times, so a row
    nested d deep renders in size linear in d (each level read its inner row three times: 3^d, 93 s to plan at d = 8),
    and more than MAX_ROW_FIELDS fields in all are refused."""
    import sqlglot

    from dpsql.plan.typer import MAX_ROW_FIELDS, TypeRefusal, type_distinct

    e = "a"
    for _ in range(7):
        e = f"(b, {e})"
    rendered, _ = type_distinct(sqlglot.parse_one(e, read="duckdb"), {"a": "VARCHAR", "b": "BIGINT"})
    reads = [c.name for c in rendered.find_all(exp.Column)]
    assert reads.count("a") <= 2 and reads.count("b") <= 2 * 7, len(reads)
    wide = "((" + ", ".join(["b"] * MAX_ROW_FIELDS) + "), b)"
    with pytest.raises(TypeRefusal, match=f"a row of {MAX_ROW_FIELDS + 1} values"):
        type_distinct(sqlglot.parse_one(wide, read="duckdb"), {"b": "BIGINT"})


def test_a_rows_text_is_built_of_fixed_size_pieces() -> None:
    """A field's text is read through its digest, never copied into the row's text: one person's rows of 64 texts of
    60 kB each, concatenated, built megabytes per row (the process was killed for its memory at 200 such rows), where
    a text cell may build at most MAX_TEXT_BUILT bytes."""
    import sqlglot

    from dpsql.plan.typer import MAX_TEXT_BUILT, type_distinct

    row = "(" + ", ".join(["note", "g", "d"] * 21) + ")"
    rendered, _ = type_distinct(sqlglot.parse_one(row, read="duckdb"), {"note": "VARCHAR", "g": "VARCHAR", "d": "DOUBLE"})

    def most(e: exp.Expression) -> int:
        """The most bytes ``e``'s text holds: a literal its own, a digest 64, a concatenation the sum of its parts."""
        while isinstance(e, exp.Paren):
            e = e.this
        if isinstance(e, exp.Literal):
            return len(e.this.encode())
        if isinstance(e, exp.SHA2):
            return 64
        if isinstance(e, (exp.DPipe, exp.Concat)):
            return sum(most(p) for p in ([e.this, e.expression] if isinstance(e, exp.DPipe) else e.expressions))
        if isinstance(e, exp.Coalesce):
            return max(most(p) for p in [e.this, *e.expressions])
        return MAX_TEXT_BUILT  # (a text read from the row: up to a cell's)

    assert most(rendered) <= 64 * 66, rendered.sql(dialect="duckdb")[:300]
