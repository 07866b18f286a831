"""Random cases for the neighbour sensitivity fuzzer (``tests/test_neighbour_fuzz.py``)."""

from __future__ import annotations

import datetime
import decimal
import math
import random
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

TARGET = 1000

SCHEMA = pa.schema([
    ("uid", pa.int64()), ("g", pa.string()), ("h", pa.string()), ("x", pa.float64()), ("y", pa.int64()),
    ("z", pa.float64()), ("n", pa.int32()), ("b", pa.bool_()), ("v", pa.float64()), ("d", pa.date32()),
    ("amt", pa.decimal128(18, 2)), ("ts", pa.timestamp("us")),
])
D_ADV = [datetime.date(1, 1, 1), datetime.date(9999, 12, 31), None, datetime.date(2024, 2, 29), datetime.date(1970, 1, 1)]
AMT_ADV = [decimal.Decimal("9999999999999999.99"), decimal.Decimal("-9999999999999999.99"), None, decimal.Decimal("0.01"),
           decimal.Decimal("500.00"), decimal.Decimal("500.01")]
TS_ADV = [datetime.datetime(1, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999), None,
          datetime.datetime(2024, 1, 31, 23, 59, 59, 999999)]

X_ADV = [1e308, -1e308, math.nan, math.inf, -math.inf, None, -0.0, 5e-324, 20.0, -5.0, 20.000000001, 19.999, 1e15]
Y_ADV = [2**63 - 1, -(2**63), None, 0, 100, 101, -1, 2**53 + 1]
G_ADV = ["a", "b", "zz", None, "", "A", "a ", "c"]
H_ADV = ["p", "q", "target_only", "t2", "t3", None, "", "x" * 3000, "é", "NULL", "p\x00"]
N_ADV = [-1, 0, 10, 11, None, 2**31 - 1, -(2**31), 5, 9]
V_ADV = [1e308, -1e308, math.nan, math.inf, None, 0.0, 1e15 + 1, -1e-300]
BOUNDS_V = [(0.0, 1.0), (-1e15, 1e15), (1e15, 1e15 + 2.0), (-3.0, -1.0), (0.1, 0.30000000000000004), (-1e-300, 1e-300),
            (5.0, 5.0), (-2.5e9, 7.0), (1.0, 2**60)]


@dataclass
class Case:
    seed: int
    table: pa.Table
    reg: dict[str, Any]
    sql: str | list[str]
    eps: float
    delta: float
    options: dict[str, Any] | None
    #: the engine's own per-row draws; every other person has one row, so only the target's rows are drawn from
    production: bool = False

    def without_target(self) -> pa.Table:
        import pyarrow.compute as pc

        return self.table.filter(pc.not_equal(self.table.column("uid"), TARGET))

    def describe(self) -> str:
        return (f"seed={self.seed} sql={self.sql!r} eps={self.eps} delta={self.delta} options={self.options} "
                f"reg={ {k: v for k, v in self.reg.items()} }")


def _base_rows(rnd: random.Random, production: bool) -> list[dict[str, Any]]:
    rows = []
    for u in range(rnd.randint(20, 50) * (3 if production else 1)):
        for _ in range(1 if production else rnd.randint(1, 4)):
            rows.append({
                "uid": u,
                "g": rnd.choice(["a", "b", "c", "a", "b", None, "zz"]),
                "h": rnd.choice(["p", "q", "r", "s", "p", "q", None]),
                "x": rnd.choice([rnd.uniform(-10, 30), rnd.uniform(-5, 20), None]),
                "y": rnd.choice([rnd.randint(0, 150), rnd.randint(0, 100), None]),
                "z": rnd.uniform(-100, 100),
                "n": rnd.choice([rnd.randint(0, 12), rnd.randint(0, 9), None]),
                "b": rnd.choice([True, False, None]),
                "v": rnd.choice([rnd.uniform(-2, 2), rnd.uniform(1e15, 1e15 + 4), None]),
                "d": datetime.date(2024, rnd.randint(1, 12), rnd.randint(1, 28)),
                "amt": decimal.Decimal(rnd.randint(0, 60000)) / 100,
                "ts": datetime.datetime(2024, rnd.randint(1, 3), rnd.randint(1, 28), rnd.randint(0, 23)),
            })
    return rows


def _target_rows(rnd: random.Random) -> list[dict[str, Any]]:
    shape = rnd.choice(["few", "many", "dup", "one"])
    count = {"few": rnd.randint(2, 5), "many": rnd.randint(10, 40), "dup": rnd.randint(2, 8), "one": 1}[shape]
    first = None
    rows = []
    for _ in range(count):
        if shape == "dup" and first is not None:
            rows.append(dict(first))
            continue
        r = {
            "uid": TARGET,
            "g": rnd.choice(G_ADV),
            "h": rnd.choice(H_ADV),
            "x": rnd.choice(X_ADV),
            "y": rnd.choice(Y_ADV),
            "z": rnd.choice(X_ADV),
            "n": rnd.choice(N_ADV),
            "b": rnd.choice([True, False, None]),
            "v": rnd.choice(V_ADV),
            "d": rnd.choice(D_ADV),
            "amt": rnd.choice(AMT_ADV),
            "ts": rnd.choice(TS_ADV),
        }
        first = first or r
        rows.append(r)
    return rows


def _registration(rnd: random.Random) -> dict[str, Any]:
    cols: dict[str, dict[str, Any]] = {
        "x": {"bounds": (-5.0, 20.0)},
        "y": {"bounds": (0, 100)},
        "n": {"bounds": (0, 10), "bins": 10} if rnd.random() < 0.5 else {"bounds": (0, 10)},
        "v": {"bounds": rnd.choice(BOUNDS_V)},
        "amt": {"bounds": rnd.choice([(0, 500), (-1e6, 1e6), (0.01, 0.02)])},
    }
    if rnd.random() < 0.3:
        cols["d"] = {"bounds": ("2024-01-01", "2025-01-01"), "bin_width": "7 days"} if rnd.random() < 0.5 else \
            {"domain": ["2024-01-01", "2024-02-29", "9999-12-31"]}
    if rnd.random() < 0.5:
        cols["g"] = {"domain": rnd.choice([["a", "b", "c"], ["a", "b"], ["a", "b", "c", "d", ""]])}
    reg: dict[str, Any] = {
        "privacy_unit": "uid",
        "max_groups_per_unit": rnd.choice([1, 2, 3]),
        "max_rows_per_group": rnd.choice([1, 1, 2, 3]),
        "columns": cols,
        "tau": rnd.choice([1, 1, 2, 3]),
    }
    if rnd.random() < 0.4:
        reg["max_rows_per_unit"] = rnd.choice([1, 2, 3, 7])
    return reg


AGGS = [
    "COUNT(*)", "COUNT(x)", "COUNT(h)", "COUNT(DISTINCT h)", "COUNT(DISTINCT uid)", "COUNT(DISTINCT y)", "SUM(x)", "SUM(y)",
    "SUM(v)", "AVG(x)", "AVG(v)", "AVG(y)", "VARIANCE(x)", "STDDEV(v)", "VAR_POP(y)", "STDDEV_POP(x)", "SUM(z)",
    "SUM(LEAST(GREATEST(z, -3), 7))", "SUM(x * 2 - y)", "SUM(CASE WHEN b THEN x ELSE 0 END)", "AVG(y / 4)",
    "SUM(ABS(x))", "SUM(-v)", "AVG(LEAST(GREATEST(z, -1e300), 1e300))", "SUM(x * x)", "SUM(COALESCE(x, 3))",
    "SUM(CAST(y AS INTEGER))", "SUM(v * 1e10)", "AVG(GREATEST(x, y))", "COUNT(DISTINCT CAST(x AS VARCHAR))",
    "SUM(n)", "COUNT(DISTINCT g)", "VAR_SAMP(v)", "STDDEV_SAMP(n)", "SUM(amt)", "AVG(amt)", "VARIANCE(amt)",
    "COUNT(DISTINCT d)", "COUNT(ts)", "SUM(amt * 2)",
]
QUANTILES = ["MEDIAN(x)", "MIN(y)", "MAX(x)", "PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY y)", "QUANTILE(v, 0.25)",
             "MEDIAN(n)", "MAX(v)"]
KEYS = ["g", "h", "CASE WHEN x > 3 THEN 'hi' ELSE 'lo' END", "floor(y / 10) * 10", "COALESCE(h, 'none')", "length(h)",
        "b", "n", "g || h", "x > 0", "x", "z", "TRY_CAST(h AS INTEGER)", "y", "upper(g)", "n % 3", "floor(n / 2) * 2",
        "CASE WHEN h IS NULL THEN 'none' WHEN h = 'p' THEN 'p' ELSE 'other' END", "date_trunc('month', d)", "year(d)",
        "d", "date_trunc('day', ts)", "CAST(amt AS INTEGER)", "amt > 100"]
WHERES = [None, "x > 0", "h <> 'zz'", "g IN ('a', 'b')", "y BETWEEN 10 AND 50", "z IS NOT NULL", "NOT b", "x < y",
          "length(h) < 5", "v > 0.5", "d >= DATE '2024-03-01'", "amt < 300", "ts < TIMESTAMP '2024-02-01'"]


def random_case(seed: int, production: bool = False) -> Case:
    rnd = random.Random(seed)
    rows = _base_rows(rnd, production) + _target_rows(rnd)
    rnd.shuffle(rows)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    reg = _registration(rnd)
    eps = rnd.choice([0.5, 1.0, 3.0])
    delta = rnd.choice([0.0, 1e-6, 1e-5, 1e-6])
    options: dict[str, Any] | None = None
    shape = rnd.random()
    where = rnd.choice(WHERES)
    w = f" WHERE {where}" if where else ""
    if shape < 0.08:  # range workload
        qs = []
        for _ in range(rnd.randint(1, 4)):
            lo = rnd.randint(-1, 9)
            hi = rnd.randint(lo, 11)
            qs.append(f"SELECT COUNT(*) FROM t WHERE {(where + ' AND ') if where else ''}n BETWEEN {lo} AND {hi}")
        sql: str | list[str] = qs
        delta = 0.0
        reg["columns"]["n"] = {"bounds": (0, 10), "bins": 10}
        reg.setdefault("max_rows_per_unit", rnd.choice([1, 3]))
    elif shape < 0.2:  # quantiles
        aggs = rnd.sample(QUANTILES, rnd.randint(1, 2))
        key = rnd.choice([None, None, "g"])
        if key:
            reg["columns"]["g"] = {"domain": ["a", "b", "c"]}
            sql = f"SELECT g, {', '.join(aggs)} FROM t{w} GROUP BY g"
        else:
            sql = f"SELECT {', '.join(aggs)} FROM t{w}"
    elif shape < 0.28:  # histogram over an ordered column (DAWA)
        reg["columns"]["n"] = {"bounds": (0, 10), "bins": 10}
        key = rnd.choice(["n", "n", "floor(n / 2) * 2"])
        sql = f"SELECT {key}, COUNT(*) FROM t{w} GROUP BY {key}"
        delta = 0.0 if rnd.random() < 0.5 else delta
    elif shape < 0.34:  # keys only (public domain or sparse keys), DISTINCT
        keys = rnd.sample(["g", "h", "b", "g", "n"], rnd.randint(1, 2))
        if "b" in keys and rnd.random() < 0.5:
            reg["columns"]["b"] = {"domain": [True, False]}
        if "n" in keys and rnd.random() < 0.5:
            reg["columns"]["n"] = {"domain": list(range(0, 11))}
        sql = (f"SELECT DISTINCT {', '.join(keys)} FROM t{w}" if rnd.random() < 0.5
               else f"SELECT {', '.join(keys)} FROM t{w} GROUP BY {', '.join(keys)}")
        delta = rnd.choice([1e-6, 1e-5])
    elif shape < 0.42:  # public multi-key domains
        reg["columns"]["g"] = {"domain": ["a", "b", "c", ""]}
        reg["columns"]["b"] = {"domain": [True, False]}
        keys = rnd.choice([["g", "b"], ["b"], ["g"]])
        aggs = rnd.sample(AGGS, rnd.randint(1, 3))
        sql = f"SELECT {', '.join([*keys, *aggs])} FROM t{w} GROUP BY {', '.join(keys)}"
        if rnd.random() < 0.2:
            sql += " ORDER BY 1 LIMIT 3"
    else:
        aggs = rnd.sample(AGGS, rnd.randint(1, 3))
        nkeys = rnd.choice([0, 1, 1, 1, 2])
        keys = rnd.sample(KEYS, nkeys)
        sel = [*keys, *aggs]
        sql = f"SELECT {', '.join(sel)} FROM t{w}"
        if keys:
            sql += f" GROUP BY {', '.join(keys)}"
            if rnd.random() < 0.15:
                sql += " HAVING COUNT(*) > 2"
    if rnd.random() < 0.3 and isinstance(sql, str):
        if "GROUP BY" in sql or "DISTINCT" in sql:
            options = rnd.choice([{"max_groups_per_unit": 1}, {"max_rows_per_group": 1}, {"tau": 4}, {"tau_star": 3.5},
                                  {"sigma": 3.0, "tau_star": 40}, {"max_groups_per_unit": 2, "max_rows_per_group": 2}])
        else:
            options = rnd.choice([{"max_rows_per_unit": 1}, {"max_rows_per_unit": 2}])
    return Case(seed, table, reg, sql, eps, delta, options, production)
