"""A Parquet or CSV glob is expanded once, at registration: files an ETL job adds later are not read by the
registration. A long-lived Session is told so (a warning naming the table and the fix, no row read, nothing
else changed), instead of answering silently from the files it had."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise


def _part(d: Path, i: int, kind: str) -> None:
    t = pa.table({"u": list(range(i * 100, i * 100 + 100)), "x": [1] * 100})
    if kind == "parquet":
        pq.write_table(t, d / f"part-{i}.parquet")
    else:
        pacsv.write_csv(t, d / f"part-{i}.csv")


def _count(s: dpsql.Session) -> tuple[float, list[str]]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    return r.table.column("n")[0].as_py(), [str(w.message) for w in got if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_files_added_to_a_glob_after_registration_are_named_not_read_silently(tmp_path: Path, kind: str) -> None:
    for i in range(2):
        _part(tmp_path, i, kind)
    s = dpsql.Session(budget=Budget(100.0, 0.0))
    use_noise(s, zero_noise(1))
    s.register("t", os.path.join(str(tmp_path), f"part-*.{kind}"), privacy_unit="u", max_rows_per_unit=1)
    n, said = _count(s)
    assert n == 200 and said == []  # the control: nothing added, nothing said
    _part(tmp_path, 2, kind)
    n, said = _count(s)
    assert n == 200  # the registration's files only
    assert len(said) == 1 and "table 't': 1 file(s)" in said[0] and "register 't' again" in said[0]
    s.register("t", os.path.join(str(tmp_path), f"part-*.{kind}"), privacy_unit="u", max_rows_per_unit=1)
    n, said = _count(s)
    assert n == 300 and said == []
