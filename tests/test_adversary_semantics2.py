"""What an accepted query's answer means, continued: expressions, keys, joins and outputs against
plain DuckDB on known data.

As in ``tests/test_adversary_semantics.py``: small tables with known truth, caps that drop nothing,
releases at zero noise (``dpsql.testing.zero_noise``), compared with DuckDB's answer to the same
SQL. A failure is a silent wrong answer.

Findings covered:

1. ``sqrt`` and ``ln`` of an INTEGER or DECIMAL argument were typed by the rules of ``floor`` /
   ``round`` (an integer is its own floor): ``sqrt(j)`` was rendered ``j`` and ``ln(dec)`` was
   ``dec``, so ``WHERE sqrt(j) > 1`` counted 796 rows for DuckDB's 1732 and ``GROUP BY sqrt(abs(j))``
   released the keys 0, 1, ..., 7 (as DECIMAL) instead of 0, 1, 1.414..., 2.645....
2. DP-S4S's thresholds stop at the largest 5.5^i <= Δ, so it truncates at any ε (documented in
   docs/sql.md; R2T's reach Δ).
3. DECIMAL ``+ - *`` was computed in DOUBLE: ``WHERE j * 0.1 = 0.3`` counted 0 rows for 300,
   ``dec = 0.1 + 0.2`` 0 for 73, and ``GROUP BY j * 0.1`` released the key 0.30000000000000004.
   It is now exact in DECIMAL whenever DuckDB's result type holds every result (38 digits).
4. DECIMAL ``%`` was computed in DOUBLE (fmod): ``WHERE dec % 0.1 = 0`` counted 233 rows for 293.
5. ``SELECT -j AS k ... GROUP BY k`` (a key under a prefix operator or a predicate such as
   BETWEEN) was refused as a non-aggregated column.
6. Key types: a DAWA histogram over a DATE column released TIMESTAMP keys, ``floor(age / 10) * 10``
   int64 (a DOUBLE in SQL); declared domains without an aggregate were typed from the Python
   values (DECIMAL(4,1) as DECIMAL(1,1), SMALLINT as int64); ``year()`` over joins as INTEGER.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise

EPS, DELTA = 10.0, 1e-3


def _table(n: int = 2000, seed: int = 1) -> pa.Table:
    gen = np.random.default_rng(seed)
    return pa.table({
        "uid": np.arange(n),
        "j": gen.integers(-7, 8, n),
        "x": gen.uniform(-10, 10, n),
        "dec": pa.array([Decimal(int(v)).scaleb(-2) for v in gen.integers(-1000, 1000, n)], pa.decimal128(10, 2)),
        "g": pa.array(gen.choice(["a", "b", "c"], n)),
    })


def _session(t: pa.Table, columns: dict[str, Any] | None = None, **kw: Any) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e12, 0.9))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=kw.pop("max_groups_per_unit", 10),
               max_rows_per_group=1, columns=columns or {}, **kw)
    return s


def _duck(tables: dict[str, pa.Table], sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    for name, t in tables.items():
        con.register(name, t)
    return con.execute(sql).fetchall()


def _rows(s: dpsql.Session, sql: str, **kw: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in s.query(sql, epsilon=EPS, delta=DELTA, **kw).table.to_pylist()]


# -- 1. sqrt and ln of integers and DECIMALs ----------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE sqrt(j) > 1",
    "SELECT COUNT(*) FROM t WHERE ln(j) > 1",
    "SELECT COUNT(*) FROM t WHERE sqrt(dec) > 1.5",
    "SELECT COUNT(*) FROM t WHERE ln(dec) > 1.5",
    "SELECT COUNT(*) FROM t WHERE isnan(sqrt(j))",
    "SELECT COUNT(*) FROM t WHERE sqrt(4) = 2 AND j = 1",
    "SELECT COUNT(*) FROM t WHERE sqrt(x) > 1.5",  # control: a DOUBLE argument was right
])
def test_sqrt_and_ln_of_integers_and_decimals(sql: str) -> None:
    t = _table()
    assert _rows(_session(t), sql) == _duck({"t": t}, sql)


def test_group_by_sqrt_of_an_integer_releases_doubles() -> None:
    t = _table()
    sql = "SELECT sqrt(abs(j)) AS k, COUNT(*) AS n FROM t GROUP BY k"
    got = sorted(_rows(_session(t), sql))
    assert got == sorted(_duck({"t": t}, sql))
    assert all(isinstance(k, float) for k, _ in got)


# -- 2. DP-S4S's largest threshold is Δ (documented) ----------------------------------------------------


def test_dp_s4s_largest_threshold_is_delta_as_documented() -> None:
    """docs/sql.md (Joins): DP-S4S's thresholds are 5.5^i below Δ, then Δ, so with Δ = 3 they are 3 and 1
    and at q = 1 COUNT(*) over the join counts every tuple, less the bias of the τ = 3 run, at zero noise
    (the Gaussian variant here, δ > 0); R2T's reach Δ too. Control: the truth is about three times the
    number of customers, which a grid topping out at 1 released."""
    gen = np.random.default_rng(7)
    n_cust, n_ord = 300, 900
    cust = pa.table({"cid": np.arange(n_cust)})
    orders = pa.table({"oid": np.arange(n_ord), "ocid": pa.array(np.arange(n_ord) % n_cust, mask=gen.random(n_ord) < 0.05)})
    s = dpsql.Session(budget=dpsql.Budget(1e12, 0.9))
    use_noise(s, zero_noise())
    s.register("customer", cust, privacy_unit="cid")
    s.register("orders", orders, references={"ocid": "customer.cid"}, degree_bounds={"ocid": 3})
    sql = "SELECT COUNT(*) FROM orders o JOIN customer c ON o.ocid = c.cid"
    truth = _duck({"customer": cust, "orders": orders}, sql)[0][0]
    customers = _duck({"orders": orders}, "SELECT COUNT(DISTINCT ocid) FROM orders")[0][0]
    bias = s.explain(sql, epsilon=EPS, delta=DELTA, options={"q": 1.0}).parameters["schedule"][0]["bias"]
    r = s.query(sql, epsilon=EPS, delta=DELTA, options={"q": 1.0})
    assert r.mechanism == "dp_s4s" and r.details["tau_grid"] == [3.0, 1.0]
    assert 0 < bias < 10
    assert r.table.column(0)[0].as_py() == round(truth - bias)
    assert truth > 2.5 * customers
    r2t = s.query(sql, epsilon=EPS, delta=DELTA, options={"mechanism": "r2t"}).table.column(0)[0].as_py()
    assert r2t == pytest.approx(truth, rel=0.01)


# -- 3. DECIMAL arithmetic is exact -------------------------------------------------------------------


def _decimals(n: int = 3000, seed: int = 5) -> pa.Table:
    gen = np.random.default_rng(seed)
    return pa.table({
        "uid": np.arange(n),
        "dec": pa.array([Decimal(int(v)).scaleb(-2) for v in gen.integers(0, 40, n)], pa.decimal128(10, 2)),
        "d2": pa.array([Decimal(int(v)).scaleb(-1) for v in gen.integers(0, 10, n)], pa.decimal128(5, 1)),
        "j": gen.integers(0, 10, n),
        "big": pa.array([Decimal(int(v)) for v in gen.integers(0, 10, n)], pa.decimal128(38, 0)),
    })


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE j * 0.1 = 0.3",
    "SELECT COUNT(*) FROM t WHERE dec * 3 = 0.3",
    "SELECT COUNT(*) FROM t WHERE dec * 3 <= 0.3",
    "SELECT COUNT(*) FROM t WHERE d2 * 3 = 0.9",
    "SELECT COUNT(*) FROM t WHERE dec + d2 = 0.3",
    "SELECT COUNT(*) FROM t WHERE dec - d2 = 0.01",
    "SELECT COUNT(*) FROM t WHERE dec + 0.1 = 0.3",
    "SELECT COUNT(*) FROM t WHERE dec = 0.1 + 0.2",
    "SELECT COUNT(*) FROM t WHERE -dec * -2 = 0.6",
    "SELECT COUNT(*) FROM t WHERE big * 0.5 = 2.5",  # 39 digits: DOUBLE (exact on these values)
    "SELECT COUNT(*) FROM t WHERE dec / 2 = 0.05",  # control: / is DOUBLE in DuckDB too
])
def test_decimal_arithmetic_is_exact(sql: str) -> None:
    t = _decimals()
    assert _rows(_session(t), sql) == _duck({"t": t}, sql)


@pytest.mark.parametrize("sql", [
    "SELECT j * 0.1 AS k, COUNT(*) AS n FROM t GROUP BY k",
    "SELECT dec * 3 AS k, COUNT(*) AS n FROM t GROUP BY k",
])
def test_decimal_arithmetic_keys_are_spelled_as_in_duckdb(sql: str) -> None:
    t = _decimals()
    got = sorted(_rows(_session(t), sql))
    assert got == sorted(_duck({"t": t}, sql))
    assert all(isinstance(k, Decimal) for k, _ in got)


def test_decimal_sum_of_an_exact_expression() -> None:
    t = _decimals()
    s = _session(t, {"dec": {"bounds": (0, 1)}, "d2": {"bounds": (0, 1)}})
    sql = "SELECT SUM(dec * 3 + d2) FROM t"
    assert float(_rows(s, sql)[0][0]) == pytest.approx(float(_duck({"t": t}, sql)[0][0]), abs=0.5)


# -- 4. DECIMAL modulo is exact -----------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE dec % 0.1 = 0",
    "SELECT COUNT(*) FROM t WHERE dec % 0.07 = 0.03",
    "SELECT COUNT(*) FROM t WHERE d2 % 0.3 = 0",
    "SELECT COUNT(*) FROM t WHERE dec % d2 IS NULL",  # a zero divisor is NULL (DuckDB: an error), d2 has zeros
    "SELECT COUNT(*) FROM t WHERE j % 3 = 1",  # control: integers were exact
])
def test_decimal_modulo_is_exact(sql: str) -> None:
    t = _decimals()
    want = _duck({"t": t}, sql.replace("dec % d2 IS NULL", "d2 = 0"))
    assert _rows(_session(t), sql) == want


# -- 5. keys written with a prefix operator -----------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT NOT (j > 0) AS k, COUNT(*) AS n FROM t GROUP BY k",
    "SELECT -j AS k, COUNT(*) AS n FROM t GROUP BY k",
    "SELECT -j AS k, COUNT(*) AS n FROM t GROUP BY -j",
    "SELECT j BETWEEN 1 AND 3 AS k, COUNT(*) AS n FROM t GROUP BY k",
    "SELECT j + 1 AS k, COUNT(*) AS n FROM t GROUP BY k",  # control: a binary operator always matched
])
def test_group_by_a_key_under_a_prefix_operator(sql: str) -> None:
    """``SELECT -j AS k ... GROUP BY k`` was refused ("uses column 'j' outside an aggregate"): the
    select list was matched to the keys for columns, functions and binary operators only."""
    t = _table()
    assert sorted(_rows(_session(t), sql)) == sorted(_duck({"t": t}, sql))


# -- 6. DAWA histogram keys typed as the SQL types them -----------------------------------------------


def test_histogram_keys_have_the_types_duckdb_gives_them() -> None:
    """GROUP BY a DATE column with one-day bins released TIMESTAMP keys (2024-01-01 00:00:00), a
    DOUBLE column's integer edges int64 keys, and floor(age / 10) * 10 (a DOUBLE in SQL) int64 keys.
    Control: an integer column's keys stay integers."""
    gen = np.random.default_rng(2)
    n = 3000
    d = (np.datetime64("2024-01-01") + gen.integers(0, 90, n).astype("timedelta64[D]")).astype("datetime64[D]")
    t = pa.table({"uid": np.arange(n), "d": pa.array(d), "age": gen.integers(0, 100, n), "w": gen.uniform(0, 100, n)})
    s = _session(t, {"d": {"bounds": ("2024-01-01", "2024-03-31"), "bin_width": "1 day"},
                     "age": {"bounds": (0, 99), "bins": 100}, "w": {"bounds": (0, 100), "bins": 10}}, max_groups_per_unit=1)
    con = duckdb.connect()
    con.register("t", t)
    for sql in ["SELECT d, COUNT(*) AS n FROM t GROUP BY d",
                "SELECT floor(age / 10) * 10 AS k, COUNT(*) AS n FROM t GROUP BY k",
                "SELECT floor(w / 10) * 10 AS k, COUNT(*) AS n FROM t GROUP BY k",
                "SELECT age, COUNT(*) AS n FROM t GROUP BY age"]:
        r = s.query(sql, epsilon=EPS, delta=DELTA)
        assert r.mechanism == "dawa"
        want = con.sql(sql).to_arrow_table()
        assert r.table.schema.field(0).type == want.schema.field(0).type, sql
        assert sorted(r.table.column(0).to_pylist()) == sorted(want.column(0).to_pylist()), sql
    r = s.query("SELECT w, COUNT(*) AS n FROM t GROUP BY w", epsilon=EPS, delta=DELTA)
    assert r.table.schema.field(0).type == pa.float64()


# -- 7. declared key domains released in the column's type --------------------------------------------


def test_declared_domain_keys_have_the_column_type() -> None:
    """SELECT DISTINCT over declared domains (free, read from the catalog) typed the keys from the
    Python values: a SMALLINT column's as int64, a DECIMAL(4,1)'s as DECIMAL(1,1), a FLOAT's as
    DOUBLE, unlike the same query in SQL (and unlike the same keys with an aggregate)."""
    gen = np.random.default_rng(7)
    n = 300
    t = pa.table({"uid": np.arange(n), "seg": pa.array(gen.choice(["A", "B"], n)),
                  "lvl": pa.array(gen.integers(1, 4, n).astype(np.int16)),
                  "dd": pa.array([Decimal(int(v)).scaleb(-1) for v in gen.integers(0, 3, n)], pa.decimal128(4, 1)),
                  "f": pa.array(gen.integers(0, 2, n).astype(np.float32) / np.float32(2))})
    s = _session(t, {"seg": {"domain": ["A", "B"]}, "lvl": {"domain": [1, 2, 3]}, "dd": {"domain": ["0.0", "0.1", "0.2"]},
                     "f": {"domain": [0.0, 0.5]}})
    con = duckdb.connect()
    con.register("t", t)
    for sql in ["SELECT DISTINCT seg, lvl, dd FROM t", "SELECT DISTINCT f FROM t", "SELECT lvl FROM t WHERE lvl > 1 GROUP BY lvl"]:
        r = s.query(sql, epsilon=EPS, delta=DELTA)
        want = con.sql(sql).to_arrow_table()
        assert r.mechanism == "public_domain"
        assert r.table.schema.types == want.schema.types, sql
        assert sorted(map(str, r.table.to_pylist())) == sorted(map(str, want.to_pylist())), sql


def test_grouped_join_year_keys_are_bigint() -> None:
    """year(o.od) over a join released INTEGER keys (int32); year() is BIGINT in SQL."""
    gen = np.random.default_rng(7)
    n_cust, n_ord = 200, 600
    cust = pa.table({"cid": np.arange(n_cust)})
    od = (np.datetime64("2020-01-01") + gen.integers(0, 3 * 365, n_ord).astype("timedelta64[D]")).astype("datetime64[D]")
    orders = pa.table({"oid": np.arange(n_ord), "ocid": np.arange(n_ord) % n_cust, "od": pa.array(od)})
    s = dpsql.Session(budget=dpsql.Budget(1e12, 0.9))
    use_noise(s, zero_noise())
    s.register("customer", cust, privacy_unit="cid")
    s.register("orders", orders, references={"ocid": "customer.cid"}, degree_bounds={"ocid": 3},
               columns={"od": {"bounds": ("2020-01-01", "2022-12-31"), "bin_width": "1 day"}})
    sql = "SELECT year(o.od) AS y, COUNT(*) AS n FROM orders o JOIN customer c ON o.ocid = c.cid GROUP BY y"
    con = duckdb.connect()
    con.register("customer", cust)
    con.register("orders", orders)
    r = s.query(sql, epsilon=EPS, delta=DELTA)
    want = con.sql(sql).to_arrow_table()
    assert r.table.schema.field(0).type == want.schema.field(0).type == pa.int64()
    assert sorted(tuple(x.values()) for x in r.table.to_pylist()) == sorted(tuple(x.values()) for x in want.to_pylist())
