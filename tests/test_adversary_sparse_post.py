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
