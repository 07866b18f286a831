"""Post-processing clauses over the rows the sparse histogram releases: a clause written by the analyst is
judged at analysis, before any charge, by what it says, never blamed on a released value."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import QueryTypeError
from dpsql.testing import use_noise, zero_noise


def _session() -> dpsql.Session:
    t = pa.table({"user_id": pa.array(range(300), pa.int64()), "k": ["a"] * 150 + ["b"] * 150})
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5))
    use_noise(s, zero_noise())
    s.register("events", t, privacy_unit="user_id", max_groups_per_unit=1, max_rows_per_group=1, tau=1)
    return s


@pytest.mark.parametrize("tail, keys", [
    ("LIMIT 99999999999999999999", ["a", "b"]),
    ("LIMIT 9223372036854775808", ["a", "b"]),
    ("LIMIT 1 OFFSET 99999999999999999999", []),
    ("FETCH FIRST 18446744073709551616 ROWS ONLY", ["a", "b"]),
])
def test_a_row_count_beyond_64_bits_keeps_or_skips_every_row(tail: str, keys: list[str]) -> None:
    s = _session()
    r = s.query(f"SELECT k, COUNT(*) AS c FROM events GROUP BY k ORDER BY k {tail}", epsilon=1.0, delta=1e-6)
    assert r.table.column("k").to_pylist() == keys
    s.close()


@pytest.mark.parametrize("having", ["d > 'garbage'", "d > DATE 'garbage'", "d = '2020-13-45'", "ts < 'noon'",
                                    "ts < TIMESTAMP '2020-01-01 25:00:00'"])
def test_a_malformed_date_literal_over_a_released_key_is_refused_before_the_charge(having: str) -> None:
    t = pa.table({"user_id": pa.array(range(300), pa.int64()),
                  "d": pa.array([datetime.date(2020, 1, 1)] * 300), "ts": pa.array([datetime.datetime(2020, 1, 1)] * 300)})
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5))
    use_noise(s, zero_noise())
    s.register("events", t, privacy_unit="user_id", max_groups_per_unit=1, max_rows_per_group=1, tau=1)
    with pytest.raises(QueryTypeError):
        s.query(f"SELECT d, ts, COUNT(*) AS c FROM events GROUP BY d, ts HAVING {having}", epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 0
    s.close()


@pytest.mark.parametrize("having, rows", [("d > '2019-12-31'", 1), ("ts < '2020-01-01 00:00:01'", 1), ("d < DATE '1970-01-02'", 0),
                                          ("d - INTERVAL 1 DAY > '2019-12-30'", 1)])
def test_valid_date_conditions_over_released_keys_still_run(having: str, rows: int) -> None:
    t = pa.table({"user_id": pa.array(range(300), pa.int64()),
                  "d": pa.array([datetime.date(2020, 1, 1)] * 300), "ts": pa.array([datetime.datetime(2020, 1, 1)] * 300)})
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5))
    use_noise(s, zero_noise())
    s.register("events", t, privacy_unit="user_id", max_groups_per_unit=1, max_rows_per_group=1, tau=1)
    r = s.query(f"SELECT d, ts, COUNT(*) AS c FROM events GROUP BY d, ts HAVING {having}", epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == rows
    s.close()


def _typed_keys() -> dpsql.Session:
    import decimal

    n = 600
    t = pa.table({"user_id": pa.array(range(n), pa.int64()), "i": [x % 5 for x in range(n)], "b": [x % 2 == 0 for x in range(n)],
                  "dec": pa.array([decimal.Decimal(x % 3) for x in range(n)], pa.decimal128(10, 2))})
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="user_id", max_groups_per_unit=1, max_rows_per_group=1, tau=1)
    return s


@pytest.mark.parametrize("key, having", [("i", "i = 'abc'"), ("i", "i > '5x'"), ("i", "i IN ('a', 'b')"),
                                         ("b", "b = 'maybe'"), ("dec", "dec = 'abc'")])
def test_a_literal_no_value_of_a_number_or_boolean_key_converts_to_is_refused_before_the_charge(key: str, having: str) -> None:
    """HAVING i = 'abc' over a number key: the free check ran HAVING on a NULL key, where DuckDB never converts the
    literal, so the query was charged and released nothing (WHERE refuses it for free)."""
    s = _typed_keys()
    with pytest.raises(QueryTypeError, match="HAVING fails whatever the value of a key"):
        s.query(f"SELECT {key}, COUNT(*) AS c FROM t GROUP BY {key} HAVING {having}", epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 0
    s.close()


@pytest.mark.parametrize("having, rows", [("i = '3'", 1), ("log(i) > 0.1", 3), ("CAST(i AS TINYINT) < 3", 3),
                                          ("c > 10 AND i < 3", 3)])
def test_having_that_holds_for_some_key_values_still_runs(having: str, rows: int) -> None:
    s = _typed_keys()
    r = s.query(f"SELECT i, COUNT(*) AS c FROM t GROUP BY i HAVING {having}", epsilon=1.0, delta=1e-6)
    assert r.table.num_rows == rows
    s.close()
