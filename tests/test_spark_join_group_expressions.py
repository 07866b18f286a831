"""GROUP BY expressions over joins (``dpsql.plan.join_groups``, kind ``derived``) on Spark: the same key set, spelled
the same, and bit for bit the same zero-noise release as DuckDB's, for a CASE of literals over a private column
(per-person clipping) and an expression of a public table's column (DP-S4S's sample, q = 0.5). The bounded rows of
these and two more derived shapes are compared in tests/test_spark_joins.py (run with --extended). Skipped (with the
reason) without pyspark/Java."""

from __future__ import annotations

from typing import Any

import pytest
from _spark import require_spark
from test_spark_joins import COL, NCO, fk_data, make

require_spark()

QUERIES = {
    "clip_case_literals": ("SELECT CASE WHEN l.l_price > 50 THEN 'hi' WHEN l.l_price > 0 THEN 'mid' END AS b, "
                           f"COUNT(*) AS k {COL} GROUP BY b ORDER BY b", None),
    "sampled_public_expression": ("SELECT CASE WHEN n.n_name IN ('A', 'B') THEN 'ab' ELSE lower(n.n_name) END AS g, "
                                  f"COUNT(*) AS k {NCO} GROUP BY g ORDER BY g", {"q": 0.5}),
}


@pytest.fixture(scope="module")
def sessions() -> Any:
    data = fk_data()
    duck, spark = make("duckdb", data), make("spark", data)
    yield duck, spark
    duck.close()
    spark.close()


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_zero_noise_releases_of_derived_keys_are_the_same(sessions: Any, name: str) -> None:
    sql, opts = QUERIES[name]
    duck, spark = sessions
    d, s_ = (x.query(sql, epsilon=4.0, delta=1e-5, options=opts) for x in (duck, spark))
    assert d.mechanism == s_.mechanism == ("clipped_gaussian" if opts is None else "dp_s4s_vector")
    assert [(f.name, f.type) for f in d.table.schema] == [(f.name, f.type) for f in s_.table.schema]
    assert d.table.to_pylist() == s_.table.to_pylist()
    key = d.table.column_names[0]
    want = ["hi", "mid", None] if opts is None else ["ab", "c", "d", "e"]
    assert d.table.column(key).to_pylist() == want
    assert any(v for v in d.table.column("k").to_pylist())


def test_a_counted_out_day_range_is_the_same_on_both_engines(sessions: Any) -> None:
    """date_trunc('month', d) over a declared range of 1 096 days: the days are counted out in the query from crossed
    decimal digits (``dpsql.rewrite.join_groups._values``), not listed: the same 36 months and counts on both."""
    duck, spark = sessions
    sql = f"SELECT date_trunc('month', l.l_shipdate) AS m, COUNT(*) AS k {COL} GROUP BY m ORDER BY m"
    d, s_ = (x.query(sql, epsilon=4.0, delta=1e-5) for x in (duck, spark))
    assert d.table.to_pylist() == s_.table.to_pylist()
    assert d.table.num_rows == 36 and any(d.table.column("k").to_pylist())
