"""A stored DAWA synopsis answers only the binning it was made under: its key names how values fall into bins
(exactly at the column's decimal scale, or in doubles with the edge tolerance), so a synopsis binned otherwise
(e.g. stored before DECIMAL and integer columns were binned exactly) is never read for the new bins."""

from __future__ import annotations

import decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

import dpsql
from dpsql import Budget
from dpsql.rewrite import bound
from dpsql.testing import use_noise, zero_noise

# 0.29999999995 is 5e-10 bins below the edge 0.3 (bins 0.1 wide): in doubles, within the 1e-9 edge tolerance, it is
# counted in [0.3, 0.4); exactly, in [0.2, 0.3)
VALS = [decimal.Decimal("0.29999999995")] * 10 + [decimal.Decimal("0.3")] * 10
HIST = "SELECT v, COUNT(*) AS n FROM x GROUP BY v"
RANGE = ["SELECT COUNT(*) FROM x WHERE v >= 0.3 AND v < 0.4"]


def _session(tmp_path: Path) -> tuple[dpsql.Session, str]:
    path = str(tmp_path / "x.parquet")
    if not Path(path).exists():
        pq.write_table(pa.table({"uid": list(range(len(VALS))), "v": pa.array(VALS, pa.decimal128(20, 11))}), path)
    s = dpsql.Session(ledger=str(tmp_path / "l.db"), budget=Budget(100.0), create=not (tmp_path / "l.db").exists())
    use_noise(s, zero_noise())
    s.register("x", path, privacy_unit="uid", max_rows_per_unit=1, columns={"v": {"bounds": (0, 1), "bins": 10}})
    return s, path


def _duckdb(path: str, where: str) -> int:
    return int(duckdb.connect().execute(f"SELECT COUNT(*) FROM read_parquet('{path}') WHERE {where}").fetchall()[0][0])


def test_a_synopsis_binned_in_doubles_is_not_read_for_exact_bins(tmp_path, monkeypatch):
    s, path = _session(tmp_path)
    # the bins computed in doubles, as before exact bins: 0.29999999995 lands in [0.3, 0.4)
    monkeypatch.setattr(bound, "exact_scale", lambda dim, dialect: None)
    old = s.query(HIST, epsilon=10.0)
    assert old.table.column("n").to_pylist()[2:4] == [0, 20]
    old_range = s.query_many(RANGE, epsilon=10.0)
    assert list(old_range.counts) == [20]
    monkeypatch.undo()
    s.close()
    s, _ = _session(tmp_path)  # the same ledger and file, binned exactly
    new = s.query(HIST, epsilon=10.0)
    truth = [_duckdb(path, "v >= 0.2 AND v < 0.3"), _duckdb(path, "v >= 0.3 AND v < 0.4")]
    assert not new.reused and new.table.column("n").to_pylist()[2:4] == truth == [10, 10]
    new_range = s.query_many(RANGE, epsilon=10.0)
    assert not new_range.reused and list(new_range.counts) == [truth[1]]
    # negative control: under the same binning the stored synopses are read, for free
    before = s.remaining()
    assert s.query(HIST, epsilon=10.0).reused and s.query_many(RANGE, epsilon=10.0).reused
    assert s.remaining() == before
    s.close()


def test_a_quantile_reads_the_histogram_of_its_own_binning(tmp_path, monkeypatch):
    """A quantile's lookup of the histogram synopsis names the binning too (the key is built the same way)."""
    s, _ = _session(tmp_path)
    s.query(HIST, epsilon=10.0)
    r = s.query("SELECT MEDIAN(v) AS m FROM x", epsilon=1.0, options={"reuse": "synopsis"})
    assert r.reused
    monkeypatch.setattr(bound, "exact_scale", lambda dim, dialect: None)
    import pytest

    with pytest.raises(dpsql.errors.DPSQLError):
        s.query("SELECT MEDIAN(v) AS m FROM x", epsilon=1.0, options={"reuse": "synopsis"})
    s.close()
