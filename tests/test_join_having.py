"""HAVING over joins: post-processing of the released rows, as on one table (it was refused with
"filter the released rows yourself"). An aggregate it names must be selected too (over joins only
the selected aggregates are released, as for ORDER BY); an output's alias names its released value,
in HAVING and inside an ORDER BY expression. With zero noise and no clipping the grouped answers
are plain DuckDB's."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise

CUST = pa.table({"cid": list(range(400)), "seg": ["A", "B", "C", "D"] * 100})
# segment A has 1 order per customer, B 2, C 3, D none: counts 100, 200, 300 (D absent)
ORD = pa.table({"oid": list(range(600)),
                "cid": [c for c in range(400) for _ in range(c % 4 + 1) if c % 4 < 3][:600],
                "amt": [float(i % 9) for i in range(600)]})


@pytest.fixture(scope="module")
def s() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(1000.0, 0.5))
    use_noise(sess, zero_noise())
    sess.register("cust", CUST, privacy_unit="cid", columns={"seg": {"domain": ["A", "B", "C", "D"]}})
    sess.register("ord", ORD, references={"cid": "cust.cid"}, degree_bounds={"cid": 3}, max_groups_per_unit=10,
                  max_rows_per_group=10, columns={"amt": {"bounds": (0, 10)}})
    yield sess
    sess.close()


def plain(sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.register("cust", CUST)
    con.register("ord", ORD)
    return con.sql(sql).fetchall()


J = "FROM ord o JOIN cust c ON o.cid = c.cid GROUP BY c.seg"


@pytest.mark.parametrize("sql", [
    f"SELECT c.seg, COUNT(*) AS n {J} HAVING COUNT(*) > 150 ORDER BY c.seg",
    f"SELECT c.seg, COUNT(*) AS n {J} HAVING n > 150 ORDER BY c.seg",
    f"SELECT c.seg, COUNT(*) AS n, SUM(o.amt) AS s {J} HAVING s / n > 3.9 AND c.seg <> 'C' ORDER BY c.seg",
    f"SELECT c.seg, COUNT(*) AS n {J} HAVING c.seg IN ('A', 'C') ORDER BY n DESC",
    f"SELECT c.seg, COUNT(*) AS n {J} ORDER BY n * -1",
])
def test_having_and_order_by_aliases_over_joins_are_post_processing(s: Any, sql: str) -> None:
    out = s.query(sql, epsilon=5.0, delta=1e-5)
    got = [tuple(r.values()) for r in out.to_pylist() if r["seg"] != "D"]  # no order: a (noisy) 0, released too
    assert got == plain(sql)


@pytest.mark.parametrize("sql,needle", [
    (f"SELECT c.seg, COUNT(*) AS n {J} HAVING SUM(o.amt) > 3", "released only when the SELECT list asks for it"),
    (f"SELECT c.seg, COUNT(*) AS n {J} HAVING o.amt > 3", "neither aggregated nor a GROUP BY key"),
    (f"SELECT c.seg, COUNT(*) AS n {J} HAVING random() > 0.5", "random"),
])
def test_what_having_cannot_name_is_refused_for_free(s: Any, sql: str, needle: str) -> None:
    before, rows = s.remaining(), s.history().num_rows
    for run in (s.query, s.explain):
        with pytest.raises(errors.UnsupportedQueryError, match=needle):
            run(sql, epsilon=1.0, delta=1e-6)
    assert s.remaining() == before and s.history().num_rows == rows


def test_an_unbounded_lookup_join_counts_its_paths_in_words() -> None:
    with dpsql.Session(budget=dpsql.Budget(10.0, 1e-3)) as s:
        s.register("cust", pa.table({"cid": [1, 2], "region": ["N", "S"]}), privacy_unit="cid")
        s.register("regions", pa.table({"region": ["N", "S"], "rname": ["North", "South"]}), public=True)
        with pytest.raises(errors.PolicyError) as ei:
            s.query("SELECT COUNT(*) FROM cust c JOIN regions r ON c.region = r.region", epsilon=1.0, delta=1e-6)
    assert "through 1 path (" in str(ei.value) and "1 paths" not in str(ei.value)


@pytest.mark.parametrize("sql", [
    f"SELECT c.seg, n * 2 AS twice, COUNT(*) AS n {J}",
    f"SELECT c.seg, COUNT(*) + n AS m, COUNT(*) AS n {J}",
    f"SELECT c.seg, n AS first, COUNT(*) AS n {J}",
])
def test_an_alias_named_before_its_output_over_a_join_names_the_fix(s: Any, sql: str) -> None:
    """An output names only the aliases of outputs before it, as in DuckDB: over a join one named before its output was
    refused as 'unknown in SELECT (no joined table has it)', without the hint one table's refusal gives."""
    before, rows = s.remaining(), s.history().num_rows
    with pytest.raises(errors.UnsupportedQueryError) as ei:
        s.query(sql, epsilon=1.0, delta=1e-6)
    msg = str(ei.value)
    assert "'n' is the alias of a later output (COUNT(*) AS n)" in msg and "move it before this output" in msg, msg
    assert "write COUNT(*) here" in msg and "the query has" not in msg, msg
    assert s.remaining() == before and s.history().num_rows == rows
    # negative control: the alias's output first, answered
    fixed = sql.replace("c.seg, ", "c.seg, COUNT(*) AS n, ", 1).replace(", COUNT(*) AS n FROM", " FROM")
    s.query(fixed, epsilon=1.0, delta=1e-6)


def test_an_outputs_own_alias_over_a_join_names_the_fix(s: Any) -> None:
    with pytest.raises(errors.UnsupportedQueryError) as ei:
        s.query(f"SELECT c.seg, COUNT(*) + n AS n {J}", epsilon=1.0, delta=1e-6)
    msg = str(ei.value)
    assert "'n' is this output's own alias (COUNT(*) + n AS n)" in msg and "the query has" not in msg, msg
