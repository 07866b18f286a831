"""Regression (review finding): the DAWA synopsis key names the WHERE text, the file identity, the unit, the
dims and the cap, but not what gives the WHERE its meaning: the column types the owner declares
for a CSV source. Re-declaring a column's type leaves the file (and its mtime) untouched, so a
synopsis computed under the old types answers the same SQL under the new ones.

``amount IS NULL`` holds for every row while amount is declared INTEGER (``'99999999999'`` does
not fit, so it reads as NULL) and for none once amount is BIGINT. With zero noise the truth
under BIGINT is 0 in every bin; a reused synopsis would say 40."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise

SQL = "SELECT age, COUNT(*) FROM t WHERE amount IS NULL GROUP BY age"


def write_csv(path: Path) -> None:
    with open(path, "w") as f:
        f.write("uid,amount,age\n")
        for i in range(400):
            f.write(f"{i},9999999999{i % 5},{i % 10}\n")


def run(csv: Path, ledger: Path, types: dict[str, Any]) -> tuple[bool, list[int]]:
    s = dpsql.Session(ledger=str(ledger), budget=Budget(100.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    try:
        s.register("t", str(csv), privacy_unit="uid", max_rows_per_unit=1,
                   columns={"age": {"bounds": (0, 9), "bins": 10, "type": "BIGINT"}, **types})
        r = s.query(SQL, epsilon=10.0)
        return r.reused, r.table.column(1).to_pylist()
    finally:
        s.close()


def test_control_fresh_ledger_under_declared_double(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    reused, counts = run(tmp_path / "t.csv", tmp_path / "fresh.db", {"amount": {"type": "BIGINT"}})
    assert not reused and counts == [0] * 10


def test_synopsis_not_reused_after_column_type_declared(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    ledger = tmp_path / "ledger.db"
    reused, counts = run(tmp_path / "t.csv", ledger, {"amount": {"type": "INTEGER"}})
    assert not reused and counts == [40] * 10
    reused, counts = run(tmp_path / "t.csv", ledger, {"amount": {"type": "BIGINT"}})
    assert counts == [0] * 10, f"reused={reused}: a synopsis computed with amount as text answered {counts}"


def test_glob_source_identity_matches_the_files_read(tmp_path: Path) -> None:
    """The glob is expanded once at registration, but the synopsis key re-expands it at query
    time: a file added after registration is in the stored key but not in the synopsis, and a
    later session that does read it reuses the synopsis (100 people instead of 400)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def part(name: str, start: int, n: int) -> None:
        pq.write_table(pa.table({"uid": pa.array(range(start, start + n), pa.int64()),
                                 "age": pa.array([5] * n, pa.int64())}), tmp_path / name)

    def session() -> dpsql.Session:
        s = dpsql.Session(ledger=str(tmp_path / "ledger.db"), budget=Budget(100.0, 1e-3), create=True)
        use_noise(s, zero_noise())
        s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid", max_rows_per_unit=1,
                   columns={"age": {"bounds": (0, 9), "bins": 10}})
        return s

    hist = "SELECT age, COUNT(*) FROM t GROUP BY age"
    part("a.parquet", 0, 100)
    s1 = session()
    part("b.parquet", 100, 300)  # arrives after s1 registered the glob
    assert s1.query(hist, epsilon=10.0).table.column(1).to_pylist()[5] == 100
    s1.close()
    s2 = session()  # reads a and b
    r = s2.query(hist, epsilon=10.0)
    s2.close()
    assert r.table.column(1).to_pylist()[5] == 400, f"reused={r.reused}"


def test_synopsis_not_reused_after_max_text_bytes_changes(tmp_path: Path) -> None:
    """The owner's max_text_bytes decides which notes read as NULL, so it is part of what
    ``note IS NULL`` means; the key does not name it."""
    csv = tmp_path / "n.csv"
    with open(csv, "w") as f:
        f.write("uid,note,age\n")
        for i in range(400):
            f.write(f"{i},{'x' * 50},{i % 10}\n")
    sql = "SELECT age, COUNT(*) FROM t WHERE note IS NULL GROUP BY age"

    def run(engine: dict[str, Any]) -> list[int]:
        s = dpsql.Session(ledger=str(tmp_path / "l.db"), budget=Budget(100.0, 1e-3), engine=engine, create=True)
        use_noise(s, zero_noise())
        s.register("t", str(csv), privacy_unit="uid", max_rows_per_unit=1,
                   columns={"age": {"bounds": (0, 9), "bins": 10, "type": "BIGINT"}})
        out = s.query(sql, epsilon=10.0).table.column(1).to_pylist()
        s.close()
        return out

    assert run({}) == [0] * 10  # notes of 50 bytes are kept
    assert run({"max_text_bytes": 10}) == [40] * 10  # now every note reads as NULL
