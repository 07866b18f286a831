"""A quantile read from a stored histogram synopsis (``reuse='synopsis'``) is the quantile of the histogram that
synopsis released: the first bin where the released bins' running total reaches p times their total
(docs/mechanisms.md §9.4). The bins were read rounded one by one (1.8 rows per bin of a bucket read as 2),
so the CDF drifted above the released one (122 rows where the histogram released 117) and the median
came out a bin lower than the released histogram's."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.testing import use_noise, zero_noise


@pytest.mark.filterwarnings("ignore:epsilon=")
def test_quantile_from_synopsis_matches_the_released_histogram(tmp_path: Path) -> None:
    uid = [u for u in range(1, 40) for _ in range(3)]
    age = [(u * 3 + j) % 90 for u in range(1, 40) for j in range(3)]
    pq.write_table(pa.table({"uid": pa.array(uid, pa.int64()), "age": pa.array(age, pa.int64())}), tmp_path / "t.parquet")
    s = dpsql.Session(budget=dpsql.Budget(1e4, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", max_groups_per_unit=4, max_rows_per_group=3, max_rows_per_unit=3,
               columns={"age": {"bounds": (0, 90), "bins": 90}})
    hist = sorted(s.query("SELECT age, COUNT(*) AS n FROM t GROUP BY age", epsilon=50.0).to_pylist(),
                  key=lambda r: r["age"])
    cdf = list(itertools.accumulate(max(r["n"], 0) for r in hist))
    assert cdf[-1] == len(uid)  # zero noise: the released histogram keeps every row
    for p in (0.25, 0.5, 0.9):
        expected = next(hist[i]["age"] for i, c in enumerate(cdf) if c >= p * cdf[-1])
        r = s.query(f"SELECT QUANTILE(age, {p}) AS q FROM t", epsilon=50.0, options={"reuse": "synopsis"})
        assert r.reused
        assert r.to_pylist() == [{"q": float(expected)}], p
    s.close()
