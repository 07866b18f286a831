"""DuckDB's own Parquet reader after a check of the text once per file version, on a process's
first private read of the file (dpsql/engine/_duckdb_native.py).

The native view must give, cell by cell, what the Arrow view gives (invalid UTF-8 NULL, text
over max_text_bytes NULL), so one person's invalid cell changes neither whether a query fails
nor what it reads; a file that changes falls back to the Arrow view, and a file that changes
during a read gives the one generic error of a failed private read."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlglot import exp

import dpsql
from dpsql.engine import _duckdb_native as native
from dpsql.engine.base import private_failure
from dpsql.errors import ExecutionError, QueryTypeError

HOSTILE = [b"\xff\xfe", b"ok\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\x00b", b"\xef\xbf\xbf", "é".encode()]


def _cells(bad: Any) -> dict[str, list[tuple[int, int]]]:
    """The checked columns' invalid cells (arrays of (file, row) rows) as lists of tuples."""
    return {c: [(int(f), int(r)) for f, r in v] for c, v in bad.items()}


def _text(values: list[bytes | None]) -> pa.Array:
    raw = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), null_count=raw.null_count)


def _write(path: Path, n: int, bad_at: dict[int, bytes], *, long_at: int | None = None, row_group: int = 7) -> None:
    notes: list[bytes | None] = [f"n{i % 5}".encode() for i in range(n)]
    for i, v in bad_at.items():
        notes[i] = v
    if long_at is not None:
        notes[long_at] = b"x" * 300
    notes[3] = None
    pq.write_table(pa.table({"user_id": list(range(n)), "note": _text(notes), "likes": [i % 4 for i in range(n)],
                             "flag": [i % 2 == 0 for i in range(n)], "blob": [bytes([i % 256]) for i in range(n)]}),
                   path, row_group_size=row_group)


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)


def _session(path: Path | str, cap: int | None = 100) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"max_text_bytes": cap})
    s.register("t", str(path), privacy_unit="user_id", columns={"likes": {"bounds": [0, 3]}})
    return s


def _src(s: dpsql.Session) -> native.NativeSource:
    (src,) = s._engine._native.values()
    return src


def _rows(s: dpsql.Session) -> list[dict[str, Any]]:
    view = _src(s).view
    ast = exp.select("*").from_(exp.to_table(view, quoted=True)).order_by("user_id")
    return s._engine.fetch_arrow(ast).to_pylist()


def _arrow_rows(s: dpsql.Session) -> list[dict[str, Any]]:
    """The same rows through the Arrow view (the reference), read without the native switch."""
    src = _src(s)
    return s._engine.connection.sql(s._engine.render(src.arrow_select.copy().order_by("user_id"))).to_arrow_table().to_pylist()


def test_native_view_equals_the_arrow_view_cell_by_cell(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    _write(path, 40, {i * 5 + 1: v for i, v in enumerate(HOSTILE)}, long_at=2)
    s = _session(path)
    first = _rows(s)
    src = _src(s)
    assert src.checked is not None and not src.disabled  # checked by the first read, which is native
    second = _rows(s)
    assert "read_parquet" in s._engine.connection.sql(
        f"SELECT sql FROM duckdb_views() WHERE view_name = '{src.view}'").fetchall()[0][0]
    assert first == second == _rows(s) == _arrow_rows(s)
    notes = {r["user_id"]: r["note"] for r in second}
    # invalid UTF-8 (overlong, surrogate, beyond U+10FFFF, bare bytes) is NULL; valid text is kept
    assert [notes[i * 5 + 1] for i in range(len(HOSTILE))] == [None, None, None, None, "a\x00b", "\uffff", "é"]
    assert notes[2] is None and notes[3] is None  # over max_text_bytes; stored NULL
    assert _cells(src.bad)["note"] == [(0, 1), (0, 6), (0, 11), (0, 16)]


def test_a_persons_invalid_cell_changes_no_outcome(tmp_path: Path) -> None:
    """Neighbouring files D and D + one person whose text is invalid: every query succeeds on the
    native path of both, and the bounded relations differ by that person's row only."""
    d, d2 = tmp_path / "d.parquet", tmp_path / "d2.parquet"
    _write(d, 30, {})
    _write(d2, 31, {30: b"\xff\xfe\xfd"})
    queries = ["SELECT note, COUNT(*) AS n FROM t GROUP BY note",
               "SELECT COUNT(*) AS n FROM t WHERE lower(note) = 'n1'",
               "SELECT SUM(likes) AS s FROM t WHERE length(note) > 1"]
    outcomes, relations, plans = [], [], []
    for p in (d, d2):
        s = _session(p)
        _rows(s)
        relations.append(_rows(s))
        assert _src(s).checked is not None
        view = _src(s).view
        sql = s._engine.connection.sql(f"SELECT sql FROM duckdb_views() WHERE view_name = '{view}'").fetchall()[0][0]
        plans.append(sql.replace(view, "V").replace(str(p), "P"))
        outcomes.append([(rel.mechanism, rel.table.column_names)
                         for rel in (s.query(q, epsilon=1.0, delta=1e-6) for q in queries)])
        s.close()
    assert outcomes[0] == outcomes[1]
    assert relations[1][:-1] == relations[0] and relations[1][-1]["note"] is None
    assert plans[0] == plans[1] and "LEFT JOIN" in plans[0].upper()  # one plan, with or without invalid cells


def test_a_changed_file_goes_back_to_the_arrow_view_then_is_checked_again(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    _write(path, 20, {4: b"\xff"})
    s = _session(path)
    _rows(s), _rows(s)
    assert _src(s).checked is not None
    tmp = tmp_path / "new.parquet"
    _write(tmp, 25, {9: b"\xc3"}, row_group=4)  # a truncated 2-byte sequence
    os.replace(tmp, path)
    rows = _rows(s)  # the new version is checked on this read (the Arrow dataset still holds the old footer)
    assert {r["user_id"]: r["note"] for r in rows}[9] is None
    assert {r["user_id"]: r["note"] for r in rows}[4] == "n4"
    fresh = _session(path)
    assert rows == _rows(fresh) == _arrow_rows(fresh) and _src(fresh).checked is not None  # natively from its first read
    assert _cells(_src(s).bad)["note"] == [(0, 9)] and _src(s).checked == native.versions([str(path)])


def test_a_file_changing_during_the_read_is_the_generic_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.parquet"
    _write(path, 20, {})
    s = _session(path)
    _rows(s), _rows(s)
    real = native.versions
    calls = {"n": 0}

    def moving(paths: list[str]) -> native.Version:
        calls["n"] += 1
        v = real(paths)
        return v if calls["n"] == 1 else ((v[0][0], v[0][1], v[0][2] + 1, v[0][3], v[0][4]),)

    monkeypatch.setattr(native, "versions", moving)
    with pytest.raises(ExecutionError) as ei:
        _rows(s)
    expected = private_failure("the bounded query", None, s._engine.settings)
    assert str(ei.value) == str(expected) and ei.value.hint == expected.hint
    assert ei.value.__cause__ is None and ei.value.__context__ is None


def test_a_recently_written_file_keeps_the_arrow_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "SETTLE_SECONDS", 3600.0)
    path = tmp_path / "t.parquet"
    _write(path, 10, {1: b"\xff"})
    s = _session(path)
    for _ in range(3):
        assert {r["user_id"]: r["note"] for r in _rows(s)}[1] is None
    assert _src(s).checked is None
    assert native.settled(native.versions([str(path)]), now=time.time() + 3601)


def test_several_files_each_get_their_invalid_cells(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", 10, {})
    b = tmp_path / "b.parquet"
    pq.write_table(pa.table({"user_id": list(range(10, 20)), "note": _text([b"\xff" if i == 2 else b"ok" for i in range(10)]),
                             "likes": [1] * 10, "flag": [True] * 10, "blob": [b"z"] * 10}), b)
    s = _session(tmp_path / "*.parquet")
    _rows(s)
    rows = _rows(s)
    assert _src(s).checked is not None and _cells(_src(s).bad)["note"] == [(1, 2)]
    assert [r["note"] for r in rows if r["user_id"] >= 10] == ["ok", "ok", None] + ["ok"] * 7
    assert rows == _arrow_rows(s)


def test_files_with_different_schemas_or_other_types_stay_on_arrow(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", 10, {})
    pq.write_table(pa.table({"user_id": [50], "note": ["x"], "likes": [1], "flag": [True], "blob": [b"z"],
                             "extra": [1]}), tmp_path / "b.parquet")
    s = _session(tmp_path / "*.parquet")
    _rows(s), _rows(s)
    assert _src(s).disabled and _src(s).checked is None
    ts = tmp_path / "ts.parquet"
    pq.write_table(pa.table({"user_id": [1], "at": pa.array([0], pa.timestamp("ms"))}), ts)
    s2 = dpsql.Session(budget=dpsql.Budget(1.0))
    s2.register("t", str(ts), privacy_unit="user_id")
    assert s2._engine._native == {}  # a timestamp column: only the Arrow view reads it totally


def test_bind_check_is_remembered_per_request_and_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = pa.table({"user_id": list(range(30)), "note": [f"n{i % 3}" for i in range(30)], "likes": [i % 4 for i in range(30)]})
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    cols = {"likes": {"bounds": [0, 3]}, "note": {"domain": ["n0", "n1", "n2"]}}
    s.register("t", table, privacy_unit="user_id", columns=cols)
    calls = {"n": 0}
    real = s._engine.describe

    def counting(ast: Any) -> list[tuple[str, str]]:
        calls["n"] += 1
        return real(ast)

    monkeypatch.setattr(s._engine, "describe", counting)
    q = "SELECT COUNT(*) AS n FROM t WHERE likes > 1"
    s.query(q, epsilon=0.5)
    s.query(q, epsilon=0.5)
    assert calls["n"] == 1
    s.query(q, epsilon=0.25)  # another calibration: checked again
    assert calls["n"] == 2
    s.register("t", table, privacy_unit="user_id", columns=cols)
    s.query(q, epsilon=0.5)  # a new catalog version: checked again
    assert calls["n"] == 3
    # a refusal is never remembered: refused again, nothing charged either time
    bad = "SELECT note, COUNT(*) AS n FROM t GROUP BY note HAVING note > 3"  # refused by the bind check
    before, known = s.remaining(), dict(s._bound_ok)
    for _ in range(2):
        with pytest.raises(QueryTypeError, match="nothing was charged"):
            s.query(bad, epsilon=0.5)
    assert s.remaining() == before and s._bound_ok == known


def test_many_invalid_cells_are_joined_not_listed(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    _write(path, 3000, {i: b"\xfe" + bytes([i % 200]) for i in range(0, 3000, 3)}, row_group=500)
    s = _session(path)
    _rows(s)
    rows = _rows(s)
    src = _src(s)
    assert src.checked is not None and len(src.bad["note"]) == 999  # row 3 is stored NULL
    view_sql = s._engine.connection.sql(f"SELECT sql FROM duckdb_views() WHERE view_name = '{src.view}'").fetchall()[0][0]
    assert " IN (" not in view_sql.upper() and len(view_sql) < 3000  # the cells are in the joined table
    assert rows == _arrow_rows(s)
    assert sum(r["note"] is None for r in rows) == 999 + 1  # the invalid cells and the stored NULL
