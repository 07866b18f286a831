"""Regression (review finding): the bounded histogram put a value on a bin edge into the bin
below it when the edge is not exact in floating point: over [0, 1) in 10 bins, 0.3 / 0.1 is
2.9999999999999996, so DECIMAL or DOUBLE values 0.3 and 0.7 were counted in the bins labelled
0.2 and 0.6, and ``v >= 0.3 AND v < 0.4`` (which selects the bin [0.3, 0.4) exactly) answered 0
instead of 50 under zero noise. A value on an edge now belongs to the bin it starts, as an
endpoint on that edge selects it."""

from __future__ import annotations

import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise


@pytest.fixture
def session(tmp_path: Path):  # type: ignore[no-untyped-def]
    vals = [decimal.Decimal("0.30")] * 50 + [decimal.Decimal("0.70")] * 50
    pq.write_table(pa.table({"uid": list(range(100)), "v": pa.array(vals, pa.decimal128(4, 2)),
                             "f": [float(x) for x in vals], "i": [3] * 50 + [7] * 50}), tmp_path / "t.parquet")
    s = dpsql.Session(ledger=str(tmp_path / "l.db"), budget=Budget(100.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", max_rows_per_unit=1,
               columns={"v": {"bounds": (0, 1), "bins": 10}, "f": {"bounds": (0, 1), "bins": 10},
                        "i": {"bounds": (0, 10), "bins": 10}})
    yield s
    s.close()


@pytest.mark.parametrize("col", ["v", "f"])
def test_value_on_an_edge_is_in_the_bin_it_starts(session: dpsql.Session, col: str) -> None:
    r = session.query(f"SELECT {col}, COUNT(*) FROM t GROUP BY {col}", epsilon=10.0)
    assert dict(zip(r.table.column(0).to_pylist(), r.table.column(1).to_pylist()))[0.3] == 50
    w = session.query_many([f"SELECT COUNT(*) FROM t WHERE {col} >= 0.3 AND {col} < 0.4",
                            f"SELECT COUNT(*) FROM t WHERE {col} >= 0.7 AND {col} < 0.8"], epsilon=10.0)
    assert list(w.counts) == [50, 50]


def test_control_exact_edges(session: dpsql.Session) -> None:
    w = session.query_many(["SELECT COUNT(*) FROM t WHERE i >= 3 AND i < 4", "SELECT COUNT(*) FROM t WHERE i >= 7 AND i < 8"],
                           epsilon=10.0)
    assert list(w.counts) == [50, 50]


def test_stage1_wavelet_depth_is_public() -> None:
    """Regression (review finding): the wavelet matrix of stage 1 had bit_length(#distinct counts)
    levels, so its running time (about 0.15 s per level at n = 2^20) stepped up when one person's
    rows took the number of distinct bin counts across a power of two (4 -> 5 distinct values:
    2.15 s -> 2.32 s for the candidate costs). The depth now depends on n only."""
    import numpy as np

    from dpsql.mechanisms._dawa_partition import _WaveletMatrix

    x = np.zeros(64, dtype=np.int64)
    x[:4] = np.arange(4)  # 4 distinct counts
    y = x.copy()
    y[10] = 7  # one person's rows in bin 10: 5 distinct counts
    assert _WaveletMatrix(x).nbits == _WaveletMatrix(y).nbits == (64).bit_length()


def test_timestamp_just_before_midnight_stays_in_its_day(tmp_path: Path) -> None:
    """The edge tolerance is for numeric domains only: 1e-9 of a one-day bin is 86 microseconds, so
    23:59:59.999990 would otherwise be counted in the next day."""
    import datetime as dt

    ts = [dt.datetime(2026, 1, 1, 23, 59, 59, 999990)] * 50 + [dt.datetime(2026, 1, 3)] * 50
    pq.write_table(pa.table({"uid": list(range(100)), "t": ts}), tmp_path / "ts.parquet")
    s = dpsql.Session(ledger=str(tmp_path / "lt.db"), budget=Budget(100.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    try:
        s.register("t", str(tmp_path / "ts.parquet"), privacy_unit="uid", max_rows_per_unit=1,
                   columns={"t": {"bounds": ("2026-01-01", "2026-01-05"), "bin_width": "1 day"}})
        assert s.query("SELECT t, COUNT(*) FROM t GROUP BY t", epsilon=10.0).table.column(1).to_pylist() == [50, 0, 50, 0]
        assert list(s.query_many(["SELECT COUNT(*) FROM t WHERE t < TIMESTAMP '2026-01-02 00:00:00'"], epsilon=10.0).counts) == [50]
    finally:
        s.close()


def _exact_session(tmp_path: Path, vals: list, typ: pa.DataType, columns: dict) -> dpsql.Session:
    pq.write_table(pa.table({"uid": list(range(len(vals))), "v": pa.array(vals, typ)}), tmp_path / "x.parquet")
    s = dpsql.Session(budget=Budget(100.0))
    use_noise(s, zero_noise())
    s.register("x", str(tmp_path / "x.parquet"), privacy_unit="uid", max_rows_per_unit=1, columns={"v": columns})
    return s


def test_a_decimal_far_from_zero_on_an_edge_is_in_the_bin_it_starts(tmp_path: Path) -> None:
    """DECIMAL values are binned exactly: as a DOUBLE, 1000000000000.002 is 1000000000000.00195..., which put it
    0.05 bins below its edge (bins 0.001 wide), in the bin before; zero noise against the exact truth."""
    d = decimal.Decimal
    vals = [d("1000000000000.002")] * 10 + [d("1000000000000.007")] * 10 + [d("1000000000000.0069999999")] * 10
    s = _exact_session(tmp_path, vals, pa.decimal128(38, 10), {"bounds": (1e12, 1e12 + 1), "bins": 1000})
    r = s.query("SELECT v, COUNT(*) AS n FROM x WHERE v < 1000000000000.01 GROUP BY v", epsilon=10.0)
    got = {k: n for k, n in zip(r.table.column("v").to_pylist(), r.table.column("n").to_pylist()) if n}
    assert got == {1000000000000.002: 10, 1000000000000.006: 10, 1000000000000.007: 10}
    # a range starting on that edge counts it (its bins are read from the exact and the double endpoint, the wider)
    w = s.query_many(["SELECT COUNT(*) FROM x WHERE v >= 1000000000000.002 AND v < 1000000000000.003"], epsilon=10.0)
    assert list(w.counts) == [10]


def test_a_bigint_beyond_2_53_is_binned_exactly(tmp_path: Path) -> None:
    """2^53 + 3 is 2^53 + 4 as a DOUBLE: with bins 2 wide from 2^53 it was counted in bin 2, not 1."""
    vals = [2**53 + 1] * 10 + [2**53 + 3] * 10 + [2**53 + 5] * 10
    s = _exact_session(tmp_path, vals, pa.int64(), {"bounds": (2**53, 2**53 + 64), "bins": 32})
    r = s.query("SELECT v, COUNT(*) AS n FROM x GROUP BY v", epsilon=10.0)
    got = {k: n for k, n in zip(r.table.column("v").to_pylist(), r.table.column("n").to_pylist()) if n}
    assert got == {2**53: 10, 2**53 + 2: 10, 2**53 + 4: 10}
    w = s.query_many(["SELECT COUNT(*) FROM x WHERE v >= 9007199254740994 AND v < 9007199254740996"], epsilon=10.0)
    assert list(w.counts) == [10]


def test_a_decimal_just_below_an_edge_stays_below_it(tmp_path: Path) -> None:
    """Exact bins: 0.29999999995 is in [0.2, 0.3), and a range starting at it still counts it."""
    d = decimal.Decimal
    s = _exact_session(tmp_path, [d("0.29999999995")] * 10 + [d("0.3")] * 10, pa.decimal128(20, 11),
                       {"bounds": (0, 1), "bins": 10})
    r = s.query("SELECT v, COUNT(*) AS n FROM x GROUP BY v", epsilon=10.0)
    assert r.table.column("n").to_pylist()[2:4] == [10, 10]
    w = s.query_many(["SELECT COUNT(*) FROM x WHERE v >= 0.29999999995", "SELECT COUNT(*) FROM x WHERE v >= 0.3"],
                     epsilon=10.0)
    assert list(w.counts) == [20, 10]


def test_exact_bins_never_overflow_whatever_the_values(tmp_path: Path) -> None:
    """The widest values of a DECIMAL(38,19) and of a BIGINT, far outside the domain, are dropped without an
    overflow (an error would depend on the data): the value is clamped before the HUGEINT arithmetic."""
    d = decimal.Decimal
    extreme = "9999999999999999999.9999999999999999999"
    s = _exact_session(tmp_path, [d(extreme), d("-" + extreme)] + [d("0.25")] * 20, pa.decimal128(38, 19), {"bounds": (0, 1), "bins": 4})
    assert s.query("SELECT v, COUNT(*) AS n FROM x GROUP BY v", epsilon=10.0).table.column("n").to_pylist() == [0, 20, 0, 0]
    s = _exact_session(tmp_path, [2**63 - 1, -(2**63)] + [2] * 20, pa.int64(), {"bounds": (0, 3), "bins": 4})
    assert s.query("SELECT v, COUNT(*) AS n FROM x GROUP BY v", epsilon=10.0).table.column("n").to_pylist() == [0, 0, 20, 0]


@pytest.mark.parametrize("typ, vals, bounds", [(pa.int64(), [-(2**63), 0, 2**63 - 1], (-(2**63), 2**63)),
                                                (pa.uint64(), [0, 2**63 + 5, 2**64 - 1], (0, 2**64))])
def test_labels_of_a_domain_as_wide_as_the_integer_type_are_released(tmp_path: Path, typ, vals, bounds) -> None:
    """A lower edge outside the 64-bit range (the declared -2^63 read back as -9223372036854776000, or 2^63 over
    UBIGINT) is released as a DOUBLE key, not a raw overflow; the edges inside that range stay integers."""
    s = _exact_session(tmp_path, vals, typ, {"bounds": bounds, "bins": 4})
    r = s.query("SELECT v, COUNT(*) AS n FROM x GROUP BY v", epsilon=10.0)
    assert r.table.num_rows == 4 and sum(r.table.column("n").to_pylist()) in range(2, 5)
    assert all(isinstance(v, float) for v in r.table.column("v").to_pylist())
    s = _exact_session(tmp_path, [0, 5], pa.int64(), {"bounds": (0, 2**40), "bins": 4})
    assert s.query("SELECT v, COUNT(*) AS n FROM x GROUP BY v", epsilon=10.0).table.column("v").to_pylist() == [
        0, 2**38, 2**39, 3 * 2**38]
