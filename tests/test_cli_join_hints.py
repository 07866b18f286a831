"""A join's refusals on the command line name the flags that fix them (as one table's do).

SUM over a joined column without declared bounds said "register the column's bounds", which names no
flag, where one table's refusal of the same SUM names ``--bounds TABLE.col=lo:hi``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run


@pytest.fixture
def flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": list(range(50))}), "ev.parquet")
    pq.write_table(pa.table({"oid": list(range(100)), "cid": [i % 50 for i in range(100)], "amt": [1.0] * 100}), "ord.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "10", "--delta", "1e-3"]) == 0
    return ["--ledger", "l.duckdb", "--table", "ev=ev.parquet", "--privacy-unit", "ev=uid", "--table", "ord=ord.parquet",
            "--reference", "ord.cid=ev.uid", "--degree-bound", "ord.cid=2"]


@pytest.mark.parametrize("sql", ["SELECT SUM(o.amt) FROM ev e JOIN ord o ON e.uid = o.cid",
                                 "SELECT AVG(o.amt) FROM ev e JOIN ord o ON e.uid = o.cid", "SELECT SUM(amt) FROM ord"])
def test_a_sum_without_bounds_names_the_bounds_flag(flags: list[str], capsys: pytest.CaptureFixture[str], sql: str) -> None:
    capsys.readouterr()
    assert run([*flags, "query", sql, "--epsilon", "1", "--delta", "1e-6"]) == 2
    err = capsys.readouterr().err
    assert "--bounds TABLE.amt=lo:hi" in err and "columns={" not in err, err


def test_the_same_sum_with_the_flag_is_answered(flags: list[str]) -> None:
    """Negative control: with the flag the hint names, the join is answered."""
    assert run([*flags, "--bounds", "ord.amt=0:1", "query", "SELECT SUM(o.amt) FROM ev e JOIN ord o ON e.uid = o.cid",
                "--epsilon", "1", "--delta", "1e-6"]) == 0
