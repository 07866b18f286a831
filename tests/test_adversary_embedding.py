"""What one person's rows can change when dpsql is embedded in a Python program (Arrow tables, Parquet
written from Arrow, a caller's DuckDB connection): whether a query fails after its charge, and how a
released key is spelled, must not depend on any one person's values.

Arrow maps may hold a key twice (Arrow does not check), and DuckDB's Arrow scan raises on such a map
("Arrow map contains duplicate key"): a map column read as a map failed the query after its charge
exactly when one person's row held a duplicated key (``COUNT(m)``, ``m IS NOT NULL``), for an Arrow
table and for a Parquet file read through Arrow. Maps are now read as their entries (a list of
structs), which DuckDB does not check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

N = 30


def _outcome(source: Any, sql: str, **engine: Any) -> tuple[str, Any]:
    s = dpsql.Session(budget=Budget(100.0, 1e-3), engine=engine or None)
    use_noise(s, zero_noise())
    try:
        s.register("t", source, privacy_unit="uid")
        try:
            return "ok", s.query(sql, epsilon=1.0, delta=1e-6).table.to_pylist()
        except dpsql.errors.DPSQLError as e:
            return type(e).__name__, s.history().column("status").to_pylist()
    finally:
        s.close()


def _maps(last: list[tuple[int, int]] | None) -> pa.Table:
    """N people with the map {1: 1}; with ``last``, one more person holding ``last``."""
    rows = [[(1, 1)]] * N + ([last] if last is not None else [])
    return pa.table({"uid": list(range(len(rows))), "m": pa.array(rows, pa.map_(pa.int64(), pa.int64()))})


@pytest.mark.parametrize("sql", ["SELECT COUNT(m) AS n FROM t", "SELECT COUNT(*) AS n FROM t WHERE m IS NOT NULL"])
@pytest.mark.parametrize("as_parquet", [False, True], ids=["arrow", "parquet"])
def test_a_map_with_a_duplicated_key_does_not_fail_the_query(tmp_path: Path, sql: str, as_parquet: bool) -> None:
    """(Before: ExecutionError after the charge with the duplicated key, a release without it.)"""
    outcomes = []
    for last in (None, [(1, 1)], [(1, 1), (1, 2)]):
        source: Any = _maps(last)
        if as_parquet:
            pq.write_table(source, tmp_path / "m.parquet")
            source = str(tmp_path / "m.parquet")
        outcomes.append(_outcome(source, sql))
    assert outcomes == [("ok", [{"n": N}]), ("ok", [{"n": N + 1}]), ("ok", [{"n": N + 1}])]


@pytest.mark.parametrize("wrap", ["list", "struct"])
def test_a_map_inside_a_list_or_struct_with_a_duplicated_key_does_not_fail_the_query(wrap: str) -> None:
    m = pa.map_(pa.int64(), pa.int64())
    typ = pa.list_(m) if wrap == "list" else pa.struct([("m", m)])
    outcomes = []
    for last in ([(1, 1)], [(1, 1), (1, 2)]):
        rows: list[Any] = [[(1, 1)]] * N + [last]
        values = [[r] for r in rows] if wrap == "list" else [{"m": r} for r in rows]
        t = pa.table({"uid": list(range(N + 1)), "m": pa.array(values, typ)})
        outcomes.append(_outcome(t, "SELECT COUNT(m) AS n FROM t"))
    assert outcomes == [("ok", [{"n": N + 1}])] * 2


def test_maps_read_as_their_entries_keep_nulls_and_empty_maps() -> None:
    m = pa.array([[(1, 1), (1, 2)], None, [], [(2, 3)]], pa.map_(pa.int64(), pa.int64()))
    s = dpsql.Session(budget=Budget(1.0))
    try:
        s.register("t", pa.table({"uid": [1, 2, 3, 4], "m": m}), privacy_unit="uid")
        view = s.tables["t"].view
        rows = s._engine.connection.sql(f'SELECT uid, m IS NULL, len(m) FROM "{view}" ORDER BY uid').fetchall()
        assert rows == [(1, False, 2), (2, True, None), (3, False, 0), (4, False, 1)]
    finally:
        s.close()


@pytest.mark.parametrize("typ", [pa.list_(pa.string()), pa.large_list(pa.large_string())], ids=["list", "large_list"])
def test_count_of_a_list_of_text_binds(typ: pa.DataType) -> None:
    """COUNT(col) accepts any column; a VARCHAR[] column was taken for text and rendered ``COLLATE "binary"``,
    which DuckDB refuses on a list (a free QueryTypeError on every dataset)."""
    t = pa.table({"uid": [1, 2, 3], "c": pa.array([["a"], None, ["b"]], typ)})
    assert _outcome(t, "SELECT COUNT(c) AS n FROM t") == ("ok", [{"n": 2}])
