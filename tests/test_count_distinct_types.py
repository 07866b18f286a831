"""COUNT(DISTINCT col) counts what DuckDB's DISTINCT counts, or is refused for free.

DuckDB compares INTERVAL values after normalising them (INTERVAL '1 day' = INTERVAL '24 hours' =
INTERVAL '86400 seconds', INTERVAL '1 month' = INTERVAL '30 days'), so COUNT(DISTINCT iv) counts 2 of
those five rows, and a list or struct holding intervals compares its members so. The bounded query's
list functions counted distinct representations instead (4 of the five, 3 of three lists where DuckDB
counts 2): an answer that depends on how each row spelled its interval. The equality is coarser than
the value's representation (as for a GROUP BY key, which is refused for INTERVAL), so COUNT(DISTINCT)
over such a column is refused before any charge, with COUNT(col) as the alternative; the types that
were right stay answered, and agree with DuckDB."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import duckdb
import pytest

import dpsql
from dpsql import errors
from dpsql.testing import use_noise, zero_noise

REFUSED = {
    "iv": "INTERVAL '1 day', INTERVAL '24 hours', INTERVAL '1 month', INTERVAL '30 days', INTERVAL '86400 seconds'",
    "lst": "[INTERVAL '1 day'], [INTERVAL '24 hours'], [INTERVAL '2 days'], NULL, NULL",
    "st": "{'a': INTERVAL '1 day'}, {'a': INTERVAL '24 hours'}, {'a': INTERVAL '2 days'}, NULL, NULL",
    "mp": "MAP {'k': INTERVAL '1 day'}, MAP {'k': INTERVAL '24 hours'}, NULL, NULL, NULL",
}
ANSWERED = {
    "dbl": "0.0::DOUBLE, -0.0::DOUBLE, 'nan'::DOUBLE, -('nan'::DOUBLE), 1.0::DOUBLE",
    "tstz": "'2024-01-01 00:00:00+00'::TIMESTAMPTZ, '2024-01-01 01:00:00+01'::TIMESTAMPTZ, "
            "'2024-01-02 00:00:00+00'::TIMESTAMPTZ, NULL, NULL",
    "dec": "1.50::DECIMAL(4,2), 1.5::DECIMAL(4,2), 2.0::DECIMAL(4,2), NULL, NULL",
    "tm": "'12:00:00'::TIME, '12:00:00.000'::TIME, '13:00'::TIME, NULL, NULL",
    "dl": "[0.0::DOUBLE], [-0.0::DOUBLE], [1.0::DOUBLE], NULL, NULL",
    # a struct field named interval is no INTERVAL
    "sn": "{'interval': 1}, {'interval': 1}, {'interval': 2}, NULL, NULL",
}


@pytest.fixture(scope="module")
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    cols = {**REFUSED, **ANSWERED}
    sel = ", ".join(f"unnest([{v}]) AS {k}" for k, v in cols.items())
    c.sql(f"CREATE TABLE t AS SELECT row_number() OVER () AS u, * FROM (SELECT {sel})")
    yield c
    c.close()


@pytest.fixture(scope="module")
def s(con: duckdb.DuckDBPyConnection) -> Iterator[dpsql.Session]:
    sess = dpsql.Session(budget=dpsql.Budget(1e3, 1e-3), connection=con)
    use_noise(sess, zero_noise(1))
    sess.register("t", "t", privacy_unit="u")
    yield sess
    sess.close()


def test_duckdb_counts_intervals_by_their_normalised_value(con: duckdb.DuckDBPyConnection) -> None:
    """What dpsql would have to reproduce: not the representation (months, days, micros)."""
    assert con.sql("SELECT COUNT(DISTINCT iv), COUNT(DISTINCT lst), COUNT(DISTINCT st) FROM t").fetchall() == [(2, 2, 2)]


@pytest.mark.parametrize("col", sorted(REFUSED))
@pytest.mark.parametrize("group", ["", " GROUP BY u % 2"])
def test_count_distinct_over_an_interval_is_refused_for_free(s: dpsql.Session, col: str, group: str) -> None:
    sql = f"SELECT COUNT(DISTINCT {col}) AS n FROM t" + group
    before = s.remaining()
    for run in (lambda: s.explain(sql, epsilon=1.0, delta=1e-6), lambda: s.query(sql, epsilon=1.0, delta=1e-6)):
        with pytest.raises(errors.UnsupportedQueryError) as e:
            run()
        msg = str(e.value)
        assert f"COUNT(DISTINCT {col})" in msg and "INTERVAL '1 day'" in msg and "24 hours" in msg, msg
        assert f"COUNT({col})" in msg  # the alternative
    assert s.remaining() == before


@pytest.mark.parametrize("col", sorted(REFUSED))
def test_count_of_an_interval_column_stays_answered(s: dpsql.Session, col: str, con: duckdb.DuckDBPyConnection) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = s.query(f"SELECT COUNT({col}) AS n FROM t", epsilon=8.0, delta=1e-6).to_pylist()[0]["n"]
    assert got == con.sql(f"SELECT COUNT({col}) FROM t").fetchall()[0][0]


@pytest.mark.parametrize("col", sorted(ANSWERED))
def test_other_types_agree_with_duckdb(s: dpsql.Session, col: str, con: duckdb.DuckDBPyConnection) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = s.query(f"SELECT COUNT(DISTINCT {col}) AS n FROM t", epsilon=8.0, delta=1e-6).to_pylist()[0]["n"]
    assert got == con.sql(f"SELECT COUNT(DISTINCT {col}) FROM t").fetchall()[0][0]
