"""A histogram's HAVING on its own key (``GROUP BY age HAVING age > 30``) releases only the bins where it can hold:
DAWA runs over those bins (with the WHERE's), and a HAVING that keeps no bin of the declared domain is refused before
the charge, as a WHERE that keeps none is. Only one-bin groups are restricted so (a coarse group's count is that of
all its bins, whatever the HAVING on its label)."""

from __future__ import annotations

import duckdb
import pytest
from test_dawa_where_span import ages_session

import dpsql
from dpsql.errors import QueryError
from dpsql.plan import workload
from dpsql.plan.analyze import analyze


@pytest.mark.parametrize("tail", ["GROUP BY age HAVING age > 200", "GROUP BY age HAVING age > 1e308 * 10",
                                  "GROUP BY age HAVING age IN (200, -3) AND COUNT(*) > 3",
                                  "GROUP BY age HAVING NOT (age >= 0)", "GROUP BY age HAVING age <> age",
                                  "GROUP BY age HAVING age < age OR age IS NULL"])
def test_a_having_that_keeps_no_bin_is_refused_for_free(tail):
    s, t = ages_session()
    sql = f"SELECT age, COUNT(*) AS n FROM t {tail}"
    con = duckdb.connect()
    con.register("t", t)
    assert con.execute(sql).fetchall() == []  # known in advance
    with pytest.raises(QueryError, match="the HAVING admits no value of the declared domain of 'age'") as e:
        s.query(sql, epsilon=1.0)
    assert "nothing was charged" in str(e.value) and s.remaining() == dpsql.Budget(1000.0)


def test_a_having_and_a_where_that_together_keep_no_bin_are_refused():
    s, _ = ages_session()
    with pytest.raises(QueryError, match="admit no value"):
        s.query("SELECT age, COUNT(*) AS n FROM t WHERE age < 10 GROUP BY age HAVING age > 20", epsilon=1.0)
    assert s.remaining() == dpsql.Budget(1000.0)


@pytest.mark.parametrize("tail, span", [
    ("GROUP BY age HAVING age IN (3, 50)", ((3, 3), (50, 50))),
    ("GROUP BY age HAVING COUNT(*) > 5 AND age < 3", ((0, 2),)),
    ("WHERE age <> 1 GROUP BY age HAVING age < 2 * 2", ((0, 0), (2, 3))),
])
def test_a_having_on_the_key_keeps_its_bins(tail, span):
    s, t = ages_session()
    sql = f"SELECT age, COUNT(*) AS n FROM t {tail} ORDER BY age"
    wl = workload.histogram_workload(analyze(sql, s.tables))
    assert wl is not None and wl.span == span
    con = duckdb.connect()
    con.register("t", t)
    r = s.query(sql, epsilon=1.0)
    assert r.details["dawa_bins"] == [list(x) for x in span]
    assert r.table.to_pylist() == [{"age": a, "n": n} for a, n in con.execute(sql).fetchall()]


@pytest.mark.parametrize("sql", [
    # a coarse group holds several bins: its count is all of them, whatever its label's HAVING
    "SELECT floor(age / 10) * 10 AS a, COUNT(*) AS n FROM t GROUP BY floor(age / 10) * 10 HAVING a < 35",
    # a HAVING on the count only restricts nothing
    "SELECT age, COUNT(*) AS n FROM t GROUP BY age HAVING COUNT(*) > 3",
    "SELECT age, COUNT(*) AS n FROM t GROUP BY age HAVING COUNT(*) > 3 OR age < 3",
])
def test_no_restriction_from_a_having_that_may_hold_in_every_bin(sql):
    s, _ = ages_session()
    wl = workload.histogram_workload(analyze(sql, s.tables))
    assert wl is not None and wl.span is None


@pytest.mark.parametrize("tail", ["GROUP BY age HAVING age IN (500)", "GROUP BY age HAVING age > 200"])
def test_a_having_alone_that_keeps_no_bin_names_only_the_having(tail):
    """The refusal said 'the WHERE and HAVING admit no value' of a query with no WHERE."""
    s, _ = ages_session()
    with pytest.raises(QueryError, match="the HAVING admits no value") as e:
        s.query(f"SELECT age, COUNT(*) AS n FROM t {tail}", epsilon=1.0)
    assert "WHERE" not in str(e.value) and "HAVING" in str(e.value.hint), e.value
    assert s.remaining() == dpsql.Budget(1000.0)
