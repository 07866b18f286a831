"""Declared key domains used by GROUP BY (over joins and single tables): two declared values that
are one value of the column's type would make one key group two released rows, so every row of
that key counts in both (one person moves two released values: twice the sensitivity the noise
is calibrated for). A FLOAT column compares in single precision, so its domain values are taken
in single precision: values equal there are refused at registration, and a value beyond the
FLOAT range (which DuckDB reads as infinity, a key no declared value names) is refused too."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise


def _events(n_people: int) -> pa.Table:
    return pa.table({"uid": pa.array(np.arange(n_people), pa.int64()),
                     "f": pa.array(np.full(n_people, 0.1), pa.float32())})


@pytest.mark.parametrize("domain", [[0.1, 0.10000000149011612], [1.0, 1.00000001], [16777216, 16777217]])
def test_float_domain_values_equal_in_single_precision_are_refused(domain: list[float]) -> None:
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        with pytest.raises(ConfigError, match="equal as FLOAT"):
            s.register("ev", _events(4), privacy_unit="uid", columns={"f": {"domain": domain}})
        # control: the same values on a DOUBLE column are distinct keys
        s.register("evd", _events(4).set_column(1, "f", pa.array(np.full(4, 0.1))), privacy_unit="uid",
                   columns={"f": {"domain": domain}})


@pytest.mark.parametrize("value", [1e39, -3.5e38, 3.4028236e38])
def test_float_domain_values_beyond_single_precision_are_refused(value: float) -> None:
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        with pytest.raises(ConfigError, match="not a FLOAT value"):
            s.register("ev", _events(4), privacy_unit="uid", columns={"f": {"domain": [1.0, value]}})
        s.register("ev2", _events(4), privacy_unit="uid", columns={"f": {"domain": [1.0, 3.4028234663852886e38]}})


def _released(n_people: int, sql: str, domain: list[float]) -> list[float]:
    with dpsql.Session(budget=Budget(10.0, 1e-3)) as s:
        use_noise(s, zero_noise())
        s.register("person", pa.table({"id": pa.array(np.arange(n_people), pa.int64())}), privacy_unit="id")
        s.register("ev", _events(n_people), references={"uid": "person.id"}, degree_bounds={"uid": 1},
                   columns={"f": {"domain": domain}})
        return [float(r["n"]) for r in s.query(sql, epsilon=1.0, delta=1e-6).table.to_pylist()]


def test_one_person_moves_one_released_float_key() -> None:
    """Neighbours (one person added): the single-table release moves in one key only. With both
    spellings of 0.1 declared (refused now) the person moved two released values."""
    sql = "SELECT e.f, COUNT(*) AS n FROM ev e GROUP BY e.f"
    a, b = _released(20, sql, [0.1, 0.5]), _released(21, sql, [0.1, 0.5])
    assert sum(abs(x - y) for x, y in zip(a, b, strict=True)) == 1.0
    joined = "SELECT e.f, COUNT(*) AS n FROM person p JOIN ev e ON p.id = e.uid GROUP BY e.f"
    a, b = _released(20, joined, [0.1, 0.5]), _released(21, joined, [0.1, 0.5])
    assert sum(abs(x - y) for x, y in zip(a, b, strict=True)) == 1.0
