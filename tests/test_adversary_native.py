"""Adversarial checks of DuckDB's own Parquet reader (dpsql/engine/_duckdb_native.py) against
the Arrow view: a path's directory names must not change a cell the rows store."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlglot import parse_one

import dpsql
from dpsql.engine import _duckdb_native as native


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)


def _hive_file(tmp_path: Path) -> Path:
    """A file under a directory spelled like a hive partition of the privacy unit and of a text column."""
    d = tmp_path / "user_id=7" / "region=eu"
    d.mkdir(parents=True)
    p = d / "part.parquet"
    pq.write_table(pa.table({"user_id": [1, 2, 3, 4], "region": ["us", "fr", "de", "us"], "likes": [1, 2, 3, 0]}), p)
    return p


def _read(s: dpsql.Session) -> list[dict[str, object]]:
    (src,) = s._engine._native.values()
    return s._engine.fetch_arrow(parse_one(f'SELECT * FROM "{src.view}" ORDER BY user_id', read="duckdb")).to_pylist()


def test_hive_style_directory_does_not_override_stored_columns(tmp_path: Path) -> None:
    """Before the fix the native view (second read of a process) read ``user_id`` = 7 and
    ``region`` = 'eu' for every row: four people merged into one, text values replaced."""
    p = _hive_file(tmp_path)
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", str(p), privacy_unit="user_id", columns={"likes": {"bounds": [0, 3]}})
    first = _read(s)
    second = _read(s)
    (src,) = s._engine._native.values()
    assert src.checked is not None  # the second read is the native one
    expected = [{"user_id": 1, "region": "us", "likes": 1}, {"user_id": 2, "region": "fr", "likes": 2},
                {"user_id": 3, "region": "de", "likes": 3}, {"user_id": 4, "region": "us", "likes": 0}]
    assert first == expected
    assert second == expected
    s.close()


def test_hive_style_directory_with_invalid_text_replace(tmp_path: Path) -> None:
    """``invalid_text = "replace"`` reads through DuckDB's reader from the start: the columns as
    stored, no partition column added from the path."""
    p = _hive_file(tmp_path)
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"invalid_text": "replace"})
    s.register("t", str(p), privacy_unit="user_id", columns={"likes": {"bounds": [0, 3]}})
    con = s._engine.connection
    (view,) = [r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE sql LIKE '%read_parquet%'").fetchall()]
    rows = con.sql(f'SELECT * FROM "{view}" ORDER BY user_id').to_arrow_table().to_pylist()
    assert rows == [{"user_id": 1, "region": "us", "likes": 1}, {"user_id": 2, "region": "fr", "likes": 2},
                    {"user_id": 3, "region": "de", "likes": 3}, {"user_id": 4, "region": "us", "likes": 0}]
    s.close()


def _glob_named_files(tmp_path: Path, ext: str) -> None:
    """'[ab]' is a file of its own; DuckDB's readers would read it as the pattern matching 'a' and 'b'."""
    rows = {"[ab]": ([1, 2], ["lit1", "lit2"]), "a": ([3], ["a"]), "b": ([4], ["b"])}
    for stem, (uids, notes) in rows.items():
        t = pa.table({"user_id": uids, "note": notes, "likes": [1] * len(uids)})
        if ext == "parquet":
            pq.write_table(t, tmp_path / f"{stem}.parquet")
        else:
            (tmp_path / f"{stem}.csv").write_text("user_id,note,likes\n" + "".join(
                f"{u},{n},1\n" for u, n in zip(uids, notes)))


EXPECTED_GLOB = [{"user_id": 1, "note": "lit1", "likes": 1}, {"user_id": 2, "note": "lit2", "likes": 1},
                 {"user_id": 3, "note": "a", "likes": 1}, {"user_id": 4, "note": "b", "likes": 1}]


def test_file_named_like_a_glob_is_read_as_itself(tmp_path: Path) -> None:
    """Before the fix the native view (second read) read a.parquet and b.parquet twice each and
    '[ab].parquet' not at all: other rows than the Arrow view's."""
    _glob_named_files(tmp_path, "parquet")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", str(tmp_path / "*.parquet"), privacy_unit="user_id", columns={"likes": {"bounds": [0, 3]}})
    view = next(v for v, _ in s._engine._views)
    reads = [s._engine.fetch_arrow(parse_one(f'SELECT * FROM "{view}" ORDER BY user_id', read="duckdb")).to_pylist()
             for _ in range(3)]
    assert reads == [EXPECTED_GLOB] * 3
    s.close()


@pytest.mark.parametrize("how", ["csv", "parquet_replace"])
def test_duckdb_reader_refuses_file_names_with_glob_characters(tmp_path: Path, how: str) -> None:
    from dpsql.errors import ConfigError

    _glob_named_files(tmp_path, "csv" if how == "csv" else "parquet")
    engine = {"invalid_text": "replace"} if how == "parquet_replace" else None
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine=engine)
    src = str(tmp_path / ("*.csv" if how == "csv" else "*.parquet"))
    with pytest.raises(ConfigError, match="glob character"):
        s.register("t", src, privacy_unit="user_id")
    s.close()


def test_csv_under_a_hive_style_directory_reads_its_own_columns(tmp_path: Path) -> None:
    d = tmp_path / "user_id=7"
    d.mkdir()
    (d / "t.csv").write_text("user_id,likes\n1,1\n2,2\n3,3\n")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", str(d / "t.csv"), privacy_unit="user_id",
               columns={"user_id": {"type": "BIGINT"}, "likes": {"type": "BIGINT"}})
    view = next(v for v, _ in s._engine._views)
    rows = s._engine.connection.sql(f'SELECT user_id, likes FROM "{view}" ORDER BY user_id').fetchall()
    assert rows == [(1, 1), (2, 2), (3, 3)]
    s.close()


@pytest.mark.parametrize("how", ["arrow", "replace"])
@pytest.mark.parametrize(("first", "second", "misfit"), [(pa.int32(), pa.int64(), 2**40), (pa.int64(), pa.float64(), 1.5)])
@pytest.mark.parametrize("with_misfit", [False, True])
def test_files_storing_a_column_under_different_types_are_refused_at_registration(
        tmp_path: Path, how: str, first: pa.DataType, second: pa.DataType, misfit: float, with_misfit: bool) -> None:
    """Before the fix the Arrow view cast every file to the first file's types with a checked cast:
    each query reading the column failed after its charge exactly when some row of the second file
    held a value that does not fit (one person's cell decided whether the query failed)."""
    from dpsql.errors import ConfigError

    pq.write_table(pa.table({"user_id": list(range(10)), "x": pa.array([1] * 10, first)}), tmp_path / "a.parquet")
    xs: list[float] = [1] * 10
    if with_misfit:
        xs[3] = misfit
    pq.write_table(pa.table({"user_id": list(range(10, 20)), "x": pa.array(xs, second)}), tmp_path / "b.parquet")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"invalid_text": "replace"} if how == "replace" else None)
    with pytest.raises(ConfigError, match="column 'x' is"):
        s.register("t", str(tmp_path / "*.parquet"), privacy_unit="user_id")
    assert s.history().num_rows == 0
    s.close()


def test_files_differing_only_in_text_encoding_still_register(tmp_path: Path) -> None:
    pq.write_table(pa.table({"user_id": [1, 2], "note": pa.array(["a", "b"]).dictionary_encode()}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"user_id": [3], "note": pa.array(["c"], pa.large_string())}), tmp_path / "b.parquet")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", str(tmp_path / "*.parquet"), privacy_unit="user_id")
    view = next(v for v, _ in s._engine._views)
    rows = s._engine.fetch_arrow(parse_one(f'SELECT * FROM "{view}" ORDER BY user_id', read="duckdb")).to_pylist()
    assert [r["note"] for r in rows] == ["a", "b", "c"]
    s.close()
