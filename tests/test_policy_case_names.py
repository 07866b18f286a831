"""Names in a table's policy are case-insensitive, as in SQL: two entries that name one column (``u8`` and
``U8``) are refused, naming both, instead of the second silently replacing the first's bounds or reference."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.errors import ConfigError


@pytest.fixture
def session(tmp_path: Path) -> dpsql.Session:
    pq.write_table(pa.table({"uid": [1, 2], "cid": [1, 2], "v": [1, 2]}), tmp_path / "t.parquet")
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "c.parquet")
    with dpsql.Session(ledger=":memory:", budget=dpsql.Budget(1.0)) as s:
        s.register("c", str(tmp_path / "c.parquet"), privacy_unit="id")
        s.register("d", str(tmp_path / "c.parquet"), privacy_unit="id")
        yield s


def test_two_specs_of_one_column_are_refused(session: dpsql.Session, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="declares columns 'v' and 'V' of table 't'"):
        session.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid",
                         columns={"v": {"bounds": (0, 1)}, "V": {"bounds": (0, 1000)}})
    session.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", columns={"V": {"bounds": (0, 1)}})
    assert session.tables["t"].columns["v"].bounds == (0, 1)  # one spelling alone is that column


def test_two_references_of_one_key_are_refused(session: dpsql.Session, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="declares the reference of 'cid' twice"):
        session.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid",
                         references={"cid": "c.id", "CID": "d.id"})
