"""Neighbouring datasets (one person's rows valid or not), the same query, the same observable outcome.

The first private read of a flat Parquet file checks each text column it may read for cells that are not
UTF-8 (``dpsql/engine/_duckdb_native.py``): a batch whose dictionary fails Arrow's validation is searched by
halving down to single values (``_invalid_positions``), each invalid value costing about 2 log2(n) Python-level
validations of slices. So the check's cost grows with the number of distinct invalid values, about 7 us each,
where a valid value costs nothing in Python: 200 000 rows of others and one person's 400 000 rows, the query
``SELECT COUNT(url) AS n FROM t`` as a process's first (every ``dpsql query`` is one): 0.12 CPU s with the
person's texts valid, 2.9 CPU s with them invalid (``b"\\xff%07d"``), and under ``statement_timeout = 1.0`` the
query fails after its charge exactly when that person's text is not UTF-8. docs/threat_model.md says the check's
time depends on the invalid cells "by a few milliseconds for each batch holding one". (An Arrow table's text is
halved down to slices of 4096 values at registration, ``dpsql.engine.duckdb._valid_utf8``, for the same
reason: "400 000 invalid: 13 s".)

One invalid value repeated over one person's rows is found by one halving, but each of its cells then costs
Python work (its row number read back into a Python list, a tuple, a list append, a sorted set, the flags
table built element by element): one person's 400 000 rows of ``b"\\xff"`` made that first query 0.86 CPU s
against 0.06 s for 400 000 rows of ``b"x"`` (and each later read about 0.08 against 0.03 s: the flags join,
documented).

The test counts the Python-level calls the check makes (a profile of function calls, no timing): with the
person's texts invalid it must not make many more than with them valid.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.engine import _duckdb_native as native


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)


def _text(values: list[bytes]) -> pa.Array:
    raw = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), null_count=raw.null_count)


def _file(path: Path, invalid: bool, distinct: bool, rows: int = 20_000) -> None:
    """Others' 20 000 rows of ordinary text, then one person's ``rows`` texts (UTF-8 or not), distinct or one."""
    urls = [f"u{i % 1000}".encode() for i in range(20_000)]
    uid = [i % 2000 for i in range(20_000)]
    for j in range(rows):
        uid.append(99_999)
        one = (b"\xff%07d" if invalid else b"x%07d") % (j if distinct else 0)
        urls.append(one)
    pq.write_table(pa.table({"user_id": uid, "url": _text(urls), "likes": [i % 4 for i in range(len(uid))]}), path)


def _calls_of_first_read(path: Path) -> tuple[int, Any]:
    """Python-level calls (and C calls made from Python) during a process's first private read of ``path``."""
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", str(path), privacy_unit="user_id", columns={"likes": {"bounds": [0, 3]}})
    count = {"n": 0}
    real = native.invalid_cells

    def profiled(*args: Any, **kwargs: Any) -> Any:
        def prof(frame: Any, event: str, arg: Any) -> None:
            if event in ("call", "c_call"):
                count["n"] += 1

        sys.setprofile(prof)
        try:
            return real(*args, **kwargs)
        finally:
            sys.setprofile(None)

    native.invalid_cells = profiled  # type: ignore[assignment]
    try:
        s.query("SELECT COUNT(url) AS n FROM t", epsilon=1.0, delta=1e-6)
    finally:
        native.invalid_cells = real  # type: ignore[assignment]
    (src,) = s._engine._native.values()
    return count["n"], src.bad


@pytest.mark.xfail(strict=True, reason="the native text check halves down to single values: Python work per "
                                       "invalid value, so one person's invalid text makes the first read slow")
@pytest.mark.parametrize("distinct", [True, False])
def test_the_text_check_does_no_python_work_per_invalid_value_or_cell(tmp_path: Path, distinct: bool) -> None:
    valid, invalid = tmp_path / "valid.parquet", tmp_path / "invalid.parquet"
    _file(valid, invalid=False, distinct=distinct)
    _file(invalid, invalid=True, distinct=distinct)
    n_valid, bad_valid = _calls_of_first_read(valid)
    n_invalid, bad_invalid = _calls_of_first_read(invalid)
    assert bad_valid == {"url": []} and len(bad_invalid["url"]) == 20_000  # the control: the cells are found
    # current code: about 2 log2(n) validations of a slice per distinct invalid value, and for each invalid
    # cell a Python tuple and list append (its row number read back with to_pylist), then a flag row in Python

    assert n_invalid <= 2 * n_valid + 2_000, (n_valid, n_invalid)
