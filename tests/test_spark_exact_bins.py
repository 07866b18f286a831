"""The Spark engine bins integer and DECIMAL columns exactly, as DuckDB does (``rewrite.bound._exact_bin``):
in doubles, the DECIMAL(38,10) 1000000000000.002 is 1000000000000.00195... (bins 0.001 wide: the bin
before) and the BIGINT 2^53 + 3 is 2^53 + 4 (bins 2 wide from 2^53: the bin after). Zero noise, against the
exact truth, on both engines; the extreme values of the types (clamped to the domain first) raise nothing
in ANSI mode. Negative control: the double position of these values is in the other bin."""

from __future__ import annotations

import decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import require_spark

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise

require_spark()

D = decimal.Decimal
#: (type, values, domain, expected nonzero bins by label)
CASES: dict[str, tuple[pa.DataType, list[Any], dict[str, Any], dict[Any, int]]] = {
    "decimal": (pa.decimal128(38, 10),
                [D("1000000000000.002")] * 10 + [D("1000000000000.007")] * 10 + [D("1000000000000.0069999999")] * 10
                + [D("-9999999999999999999999999999.9999999999"), D("9999999999999999999999999999.9999999999")],
                {"bounds": (1e12, 1e12 + 1), "bins": 1000},
                {1000000000000.002: 10, 1000000000000.006: 10, 1000000000000.007: 10}),
    "negative_decimal": (pa.decimal128(20, 11), [D("-0.29999999995")] * 10 + [D("-0.3")] * 10 + [D("-0.30000000001")] * 10,
                         {"bounds": (-1, 0), "bins": 10}, {-0.4: 10, -0.3: 20}),
    # the widest scale binned exactly, with the type's extremes (Spark's DECIMAL arithmetic keeps every digit)
    "decimal_38_19": (pa.decimal128(38, 19), [D("0.2999999999999999999")] * 10 + [D("0.3")] * 10
                      + [D("-9999999999999999999.9999999999999999999"), D("9999999999999999999.9999999999999999999")],
                      {"bounds": (0, 1), "bins": 10}, {0.2: 10, 0.3: 10}),
    "bigint": (pa.int64(), [2**53 + 1] * 10 + [2**53 + 3] * 10 + [2**53 + 5] * 10 + [-(2**63), 2**63 - 1],
               {"bounds": (2**53, 2**53 + 64), "bins": 32}, {2**53: 10, 2**53 + 2: 10, 2**53 + 4: 10}),
}


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("exact")
    out = []
    for kind in ("duckdb", "spark"):
        s = dpsql.Session(budget=Budget(1000.0), engine={"kind": kind, "statement_timeout": 300})
        for name, (typ, vals, cols, _) in CASES.items():
            pq.write_table(pa.table({"uid": list(range(len(vals))), "v": pa.array(vals, typ)}), root / f"{name}.parquet")
            s.register(name, str(root / f"{name}.parquet"), privacy_unit="uid", max_rows_per_unit=1, columns={"v": cols})
        out.append(s)
    yield out
    for s in out:
        s.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_integer_and_decimal_bins_are_exact_on_both_engines(sessions: list[dpsql.Session], name: str) -> None:
    expected = CASES[name][3]
    for s in sessions:
        use_noise(s, zero_noise())
        r = s.query(f"SELECT v, COUNT(*) AS n FROM {name} GROUP BY v", epsilon=10.0)
        got = {k: n for k, n in zip(r.table.column("v").to_pylist(), r.table.column("n").to_pylist()) if n}
        assert got == expected, (s._engine.ops.dialect, got)


def test_the_double_position_is_in_the_other_bin() -> None:
    # negative control: what binning in doubles gave (the failure the exact bins remove)
    assert int((float(D("1000000000000.002")) - 1e12) / 0.001 + 1e-9) == 1
    assert int((float(2**53 + 3) - 2**53) / 2) == 2


@pytest.mark.parametrize(("name", "sql", "count"), [
    ("bigint", "SELECT COUNT(*) FROM bigint WHERE v >= 9007199254740994 AND v < 9007199254740996", 10),
    ("decimal", "SELECT COUNT(*) FROM decimal WHERE v >= 1000000000000.002 AND v < 1000000000000.003", 10),
])
def test_range_workloads_read_the_exact_bins_on_both_engines(sessions: list[dpsql.Session], name: str, sql: str,
                                                            count: int) -> None:
    for s in sessions:
        use_noise(s, zero_noise())
        assert list(s.query_many([sql], epsilon=10.0).counts) == [count], s._engine.ops.dialect
