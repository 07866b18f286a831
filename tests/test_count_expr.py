"""COUNT(expr): the conditional count analysts write as ``COUNT(CASE WHEN cond THEN 1 END)``.

It counts the kept rows where the expression, typed and rendered total by dpsql's typer, is not NULL:
the count of a column (sensitivity k per group), whatever the expression. These tests check the
answer against plain DuckDB where the caps do not bind, the sensitivity on neighbours where they do,
that no value makes it raise (a conversion that fails counts as NULL), and that what stays refused is
refused for free."""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from test_bounding import gen_dataset, neighbour_outputs, plan_for, sensitivity_violations, spec_for

import dpsql
from dpsql import errors
from dpsql.plan import ir
from dpsql.rewrite.bound import Caps
from dpsql.testing import use_noise, zero_noise


def people(n: int = 300) -> pa.Table:
    """One row per person (no cap binds): status, amount (some NULL), a text code (some not numbers)."""
    gen = np.random.default_rng(11)
    status = np.array(["paid", "open", "void"], dtype=object)[gen.integers(0, 3, n)]
    amount = gen.uniform(0, 100, n)
    code = np.where(gen.random(n) < 0.3, "x1", gen.integers(0, 50, n).astype(str)).astype(object)
    return pa.table({
        "uid": np.arange(n, dtype=np.int64),
        "status": pa.array(status.tolist(), type=pa.string()),
        "amount": pa.array(amount, mask=gen.random(n) < 0.2),
        "code": pa.array(code.tolist(), type=pa.string()),
    })


@pytest.fixture
def s() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(1e4, 1e-2))
    use_noise(sess, zero_noise())
    sess.register("t", people(), privacy_unit="uid",
                  columns={"amount": {"bounds": (0, 100)}, "status": {"domain": ["paid", "open", "void"]}})
    yield sess
    sess.close()


def plain(sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.register("t", people())
    try:
        return sorted(con.execute(sql).fetchall(), key=repr)
    finally:
        con.close()


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(CASE WHEN status = 'paid' THEN 1 END) FROM t",
    "SELECT COUNT(CASE WHEN amount > 50 THEN 'big' END), COUNT(*) FROM t",
    "SELECT COUNT(amount * 2), COUNT(amount) FROM t",
    "SELECT COUNT(1), COUNT(NULL) FROM t",
    "SELECT status, COUNT(CASE WHEN amount > 50 THEN 1 END) FROM t GROUP BY status",
    "SELECT status, COUNT(CASE WHEN amount IS NULL THEN 1 END) AS missing FROM t GROUP BY status",
    "SELECT code, COUNT(CASE WHEN status <> 'void' THEN 1 END) FROM t GROUP BY code",  # unknown keys
])
def test_zero_noise_answers_match_plain_sql_where_no_cap_binds(s: Any, sql: str) -> None:
    got = s.query(sql, epsilon=1.0, delta=1e-6)
    rows = sorted((tuple(r.values()) for r in got.to_pylist()), key=repr)
    want = plain(sql)
    if "GROUP BY code" in sql:  # the sparse histogram releases the keys above its threshold only
        assert rows and all(r in want for r in rows), (rows, want)
        assert len(rows) >= 1 and ("x1", next(v for k, v in want if k == "x1")) in rows
    else:
        assert rows == want


def test_a_conversion_that_fails_counts_as_null_and_nothing_raises(s: Any) -> None:
    # 'x1' is no integer: plain DuckDB raises on CAST, dpsql's total rendering gives NULL (not counted)
    with pytest.raises(duckdb.ConversionException):
        plain("SELECT COUNT(CAST(code AS INT)) FROM t")
    got = s.query("SELECT COUNT(CAST(code AS INT)) FROM t", epsilon=1.0).to_pylist()[0]
    assert tuple(got.values()) == plain("SELECT COUNT(TRY_CAST(code AS INT)) FROM t")[0]
    assert 0 < next(iter(got.values())) < 300


def test_the_same_count_twice_is_one_aggregate_and_having_reads_it(s: Any) -> None:
    sql = ("SELECT status, COUNT(CASE WHEN amount > 50 THEN 1 END) AS hi, COUNT(CASE WHEN amount > 50 THEN 1 END) + 0 "
           "FROM t GROUP BY status HAVING COUNT(CASE WHEN amount > 50 THEN 1 END) > 0")
    plan = plan_for(sql, spec_for("t", people(), bounds={"amount": (0, 100)}, unit="uid"))
    assert [a.kind for a in plan.aggregates] == [ir.COUNT_COL]
    assert plan.aggregates[0].column is None and plan.aggregates[0].value is not None
    out = s.query(sql, epsilon=1.0).to_pylist()
    assert out and all(r["hi"] == list(r.values())[2] and r["hi"] > 0 for r in out)


SENS = [
    "SELECT g, COUNT(CASE WHEN amount > 50 THEN 1 END), COUNT(*) FROM t GROUP BY g",
    "SELECT g, h, COUNT(note || 'x'), SUM(amount) FROM t GROUP BY g, h",
    "SELECT COUNT(CASE WHEN age < 30 AND note IS NOT NULL THEN age END) FROM t",
]


def test_removing_one_person_moves_each_count_by_at_most_k() -> None:
    gen = np.random.default_rng(20261202)
    checked = 0
    for trial in range(3):
        data = gen_dataset(gen)
        spec = spec_for("t", data, bounds={"amount": (-20.0, 100.0)})
        for caps in (Caps(int(gen.integers(1, 4)), int(gen.integers(1, 4))), Caps(2, 2, 3)):
            for sql in SENS:
                plan = plan_for(sql, spec)
                d, minus = neighbour_outputs(plan, caps, data, f"salt-{trial}")
                for u, dm in minus.items():
                    problems = sensitivity_violations(plan, caps, d, dm)
                    assert not problems, (sql, caps, u, problems)
                    checked += 1
    assert checked > 40
    # negative control: without the caps, the same check fails for the conditional count
    data = gen_dataset(np.random.default_rng(20261202))
    plan = plan_for(SENS[0], spec_for("t", data, bounds={"amount": (-20.0, 100.0)}))
    d, minus = neighbour_outputs(plan, Caps(math.inf, math.inf), data, "x")
    assert any(sensitivity_violations(plan, Caps(1, 1), d, dm) for dm in minus.values())


def test_a_heavy_person_counts_at_most_k_rows_per_group() -> None:
    # one person with 40 paid rows: COUNT(CASE ...) counts at most k = 2 of them, as COUNT(*) does
    t = pa.table({"uid": pa.array([1] * 40 + list(range(2, 12)), type=pa.int64()),
                  "status": ["paid"] * 50, "amount": [60.0] * 50})
    with dpsql.Session(budget=dpsql.Budget(100, 1e-3)) as sess:
        use_noise(sess, zero_noise())
        sess.register("t", t, privacy_unit="uid", max_rows_per_group=2,
                      columns={"amount": {"bounds": (0, 100)}, "status": {"domain": ["paid"]}})
        out = sess.query("SELECT status, COUNT(CASE WHEN amount > 50 THEN 1 END) AS n, COUNT(*) AS m FROM t "
                         "GROUP BY status", epsilon=1.0).to_pylist()
    assert out == [{"status": "paid", "n": 12, "m": 12}]


@pytest.mark.parametrize("sql,needle", [
    ("SELECT COUNT(CASE WHEN frobnicate(amount) THEN 1 END) FROM t", "frobnicate"),
    ("SELECT COUNT(CASE WHEN nope = 1 THEN 1 END) FROM t", "nope"),
    ("SELECT COUNT(DISTINCT amount, status) FROM t", "COUNT(DISTINCT ...) takes one column or expression"),
    ("SELECT COUNT(RANDOM()) FROM t", "random"),
])
def test_what_stays_refused_is_refused_for_free(s: Any, sql: str, needle: str) -> None:
    before, rows = s.remaining(), s.history().num_rows
    for run in (s.query, s.explain):
        with pytest.raises(errors.UnsupportedQueryError) as ei:
            run(sql, epsilon=1.0)
        assert needle.lower() in str(ei.value).lower()
    assert s.remaining() == before and s.history().num_rows == rows


def test_explain_shows_the_count_and_the_charge_is_the_count_s(s: Any) -> None:
    text = str(s.explain("SELECT status, COUNT(CASE WHEN amount > 50 THEN 1 END) FROM t GROUP BY status", epsilon=1.0))
    assert "COUNT(CASE WHEN amount > 50 THEN 1 END)" in text and "l1_sensitivity: 1.0" in text
    before = s.remaining()
    s.query("SELECT status, COUNT(CASE WHEN amount > 50 THEN 1 END) FROM t GROUP BY status", epsilon=1.0)
    assert math.isclose(before.epsilon - s.remaining().epsilon, 1.0)


@pytest.mark.parametrize("sql", ["SELECT COUNT(amount, status) FROM t", "SELECT COUNT(amount + 1, status) FROM t",
                                 "SELECT status, COUNT(status, amount) FROM t GROUP BY status"])
def test_count_of_several_arguments_is_refused_for_free_not_answered_as_the_first(s: Any, sql: str) -> None:
    # DuckDB has no COUNT(a, b); answering COUNT(a) for it would silently drop b
    before, rows = s.remaining(), s.history().num_rows
    for run in (s.query, s.explain):
        with pytest.raises(errors.UnsupportedQueryError, match="COUNT takes one argument"):
            run(sql, epsilon=1.0)
    assert s.remaining() == before and s.history().num_rows == rows


def test_cli_query_and_laplace(workdir: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import run_cli

    cfg = ["--config", "examples/dpsql.toml"]
    sql = "SELECT country, COUNT(CASE WHEN amount > 50 THEN 1 END) AS big FROM events GROUP BY country ORDER BY big DESC"
    assert run_cli([*cfg, "query", sql, "--epsilon", "0.5", "--format", "json", "-o", "out.json"]) == 0
    import json
    doc = json.loads((workdir / "out.json").read_text())
    assert doc["meta"]["cost"] == {"epsilon": 0.5, "delta": 0.0} and doc["meta"]["warnings"] == []
    assert len(doc["rows"]) == 20 and all(isinstance(r["big"], int) for r in doc["rows"])
    assert "warning:" not in capsys.readouterr().err
    # refused for free on the CLI too (exit 2, nothing charged)
    assert run_cli([*cfg, "query", "SELECT COUNT(amount, age) FROM events", "--epsilon", "0.5"]) == 2
    assert "COUNT takes one argument" in capsys.readouterr().err


@pytest.mark.parametrize("arg", ["1", "'x'", "TRUE", "-1", "1.5"])
def test_count_of_a_literal_is_count_star_with_its_accuracy(s: Any, arg: str) -> None:
    # COUNT(1) counts every kept row, as COUNT(*): the same aggregate, so the same noise and threshold
    # (as a value it was a second released column next to the distinct-unit count, with more noise)
    plan = plan_for(f"SELECT COUNT({arg}), COUNT(*) FROM t", spec_for("t", people(), unit="uid"))
    assert [a.kind for a in plan.aggregates] == [ir.COUNT_STAR]
    star = s.explain("SELECT code, COUNT(*) FROM t GROUP BY code", epsilon=1.0, delta=1e-6)
    lit = s.explain(f"SELECT code, COUNT({arg}) FROM t GROUP BY code", epsilon=1.0, delta=1e-6)
    assert lit.parameters["sigma"] == star.parameters["sigma"] and lit.parameters["tau_star"] == star.parameters["tau_star"]
    assert s.query(f"SELECT COUNT({arg}) AS n FROM t", epsilon=1.0).to_pylist() == [{"n": 300}]


@pytest.mark.parametrize("sql,needle", [
    ("SELECT COUNT(DISTINCT frobnicate(code)) FROM t", "frobnicate"),
    ("SELECT COUNT(DISTINCT random()) FROM t", "random"),
    ("SELECT status, COUNT(DISTINCT nope || 'x') FROM t GROUP BY status", "nope"),
])
def test_count_distinct_of_a_refused_expression_is_one_problem(s: Any, sql: str, needle: str) -> None:
    # the function and column checks and the typing of the value name the same place once
    before, rows = s.remaining(), s.history().num_rows
    for run in (s.query, s.explain):
        with pytest.raises(errors.UnsupportedQueryError) as ei:
            run(sql, epsilon=1.0)
        assert len(ei.value.violations) == 1, str(ei.value)
        assert needle in str(ei.value)
    assert s.remaining() == before and s.history().num_rows == rows


def test_count_distinct_of_several_columns_quotes_the_call_as_written(s: Any) -> None:
    with pytest.raises(errors.UnsupportedQueryError) as ei:
        s.query("SELECT COUNT(DISTINCT code, status) FROM t", epsilon=1.0)
    assert len(ei.value.violations) == 1 and ei.value.violations[0].fragment == "COUNT(DISTINCT code, status)"
    assert "CASE" not in str(ei.value)


@pytest.mark.parametrize("sql,plain", [
    ("SELECT COUNT(DISTINCT (code)) AS v FROM t", "SELECT COUNT(DISTINCT code) AS v FROM t"),
    ("SELECT status, COUNT(DISTINCT ((uid))) AS v FROM t GROUP BY status ORDER BY status",
     "SELECT status, COUNT(DISTINCT uid) AS v FROM t GROUP BY status ORDER BY status"),
])
def test_a_parenthesised_column_is_the_column(s: Any, sql: str, plain: str) -> None:
    got = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()
    con = duckdb.connect()
    con.register("t", people())
    assert got == [dict(zip(r.keys(), r.values(), strict=True)) for r in con.sql(plain).to_arrow_table().to_pylist()]
