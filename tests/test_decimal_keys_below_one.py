"""GROUP BY a DECIMAL key whose listed or declared values all lie in (-1, 1) (0.1, ..., 0.6 of a DECIMAL(12,1)): the
keys checked before the charge were built as the narrowest decimal of their values, DECIMAL(1,1), spelled '.1' by
DuckDB, while the condition on them compares the key's spelling as its column's type gives it ('0.1'), so a list of
more than five values was refused for free as excluding every key. The key set is now typed as the key column; the
released counts are DuckDB's at zero noise."""
from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise
from tests.test_tpch_queries import _COL, _data, _rows, _session, _truth

D = decimal.Decimal
N = 600


def _people(scale: int = 1) -> pa.Table:
    vals = [D(i % 6 + 1).scaleb(-scale) for i in range(N)]
    return pa.table({"uid": list(range(N)), "m": pa.array(vals, pa.decimal128(12, scale))})


def _one(scale: int = 1, declared: list[D] | None = None) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 0.5))
    cols = {"m": {"domain": declared}} if declared is not None else None
    s.register("t", _people(scale), privacy_unit="uid", columns=cols)
    use_noise(s, zero_noise())
    return s


@pytest.mark.parametrize("delta", [1e-6, 0.0])
@pytest.mark.parametrize("listed", ["0.1, 0.2, 0.3, 0.4, 0.5, 0.6", "0.1, 0.2, 0.3", "-0.5, 0.10, 0.2, 0.3, 0.4, 0.5, 0.6"])
def test_listed_decimal_keys_below_one_are_released(listed: str, delta: float) -> None:
    s = _one()
    r = s.query(f"SELECT m, COUNT(*) AS n FROM t WHERE m IN ({listed}) GROUP BY m ORDER BY m", epsilon=1.0, delta=delta)
    keys = sorted({D(v.strip()) for v in listed.split(",")})
    assert [row["m"] for row in r.table.to_pylist()] == keys
    assert [row["n"] for row in r.table.to_pylist()] == [100 if D("0.1") <= k <= D("0.6") else 0 for k in keys]


def test_listed_decimal_keys_of_two_places_below_one_are_released() -> None:
    s = _one(scale=2)
    r = s.query("SELECT m, COUNT(*) AS n FROM t WHERE m IN (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07) GROUP BY m",
                epsilon=1.0, delta=1e-6)
    assert sorted((row["m"], row["n"]) for row in r.table.to_pylist()) == \
        [(D(f"0.0{i}"), 100 if i <= 6 else 0) for i in range(1, 8)]


def test_declared_decimal_domain_below_one_with_a_having_on_the_key() -> None:
    """A declared domain and a condition on the key in HAVING (post-processing over the declared keys)."""
    s = _one(declared=[D(f"0.{i}") for i in range(1, 10)])
    r = s.query("SELECT m, COUNT(*) AS n FROM t GROUP BY m HAVING m IN (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)",
                epsilon=1.0, delta=1e-6)
    assert sorted((row["m"], row["n"]) for row in r.table.to_pylist()) == \
        [(D(f"0.{i}"), 100 if i <= 6 else 0) for i in range(2, 9)]


def test_keys_excluded_by_the_list_still_refuse_for_free() -> None:
    """Negative control: a HAVING that keeps none of the declared keys is still refused before the charge."""
    s = _one(declared=[D(f"0.{i}") for i in range(1, 10)])
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="exclude every declared key"):
        s.query("SELECT m, COUNT(*) FROM t GROUP BY m HAVING m IN (1.1, 1.2, 1.3, 1.4, 1.5, 1.6)", epsilon=1.0, delta=1e-6)
    assert s.remaining() == dpsql.Budget(1000.0, 0.5) and s.history().num_rows == 0


def test_a_declared_decimal_key_below_one_over_a_join() -> None:
    """The grouped join's key set (a declared DECIMAL(12,2) domain of lineitem) typed alike."""
    data = _data()
    li = data["lineitem"]
    li = li.set_column(li.column_names.index("l_discount"), "l_discount", li.column("l_discount").cast(pa.decimal128(12, 2)))
    data["lineitem"] = li
    s = _session(data)
    s.register("lineitem", li, references={"l_orderkey": "orders.o_orderkey", "l_suppkey": "supplier.s_suppkey"},
               degree_bounds={"l_orderkey": 7}, columns={"l_discount": {"domain": [D(f"0.0{i}") for i in range(1, 10)]}})
    sql = (f"SELECT l.l_discount, COUNT(*) AS n {_COL}WHERE l.l_discount IN (0.01, 0.02, 0.03, 0.04, 0.05, 0.06) "
           "GROUP BY 1 ORDER BY 1")
    rows = _rows(s.query(sql, epsilon=5.0, delta=1e-5).table)
    assert [r[0] for r in rows] == [D(f"0.0{i}") for i in range(1, 7)]
    assert [r for r in rows if r[1]] == _truth(data, sql)
