"""A GROUP BY key computed by an expression (``upper(s)``, a CASE) has no public domain, even over a column that
declares one: the refusal without --delta says so, instead of only asking to declare the column's domain (which
the column already declares)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run


@pytest.fixture
def flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"uid": list(range(30)), "s": ["a", "b", "c"] * 10}), "t.parquet")
    assert run(["--ledger", "l.duckdb", "init", "--epsilon", "1"]) == 0
    return ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "--domain", "t.s=a,b,c"]


def test_an_expression_key_is_named_as_having_no_domain(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run([*flags, "explain", "SELECT upper(s) AS k, COUNT(*) AS n FROM t GROUP BY k", "--epsilon", "1"]) == 2
    hint = capsys.readouterr().err.split("hint:", 1)[1]
    assert "--delta" in hint and "UPPER(s)" in hint and "group by the column itself" in hint, hint
    assert run([*flags, "explain", "SELECT s, COUNT(*) AS n FROM t GROUP BY s", "--epsilon", "1"]) == 0  # the column's own


def test_a_mistyped_option_is_told_the_nearest_name_not_every_description(flags: list[str],
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """--option mechansim=laplace listed every option with its description (about 3 000 characters); it now names
    the nearest option, describes that one, and lists the names; nothing is charged."""
    capsys.readouterr()
    assert run([*flags, "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1", "--option", "mechansim=laplace"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'mechanism' for 'mechansim'?" in err and "force a mechanism" in err, err
    assert "tau_star" in err and "fix the noisy release threshold" not in err and len(err) < 1200, err
    assert run([*flags, "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1", "--option", "zzz=1"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "the options are mechanism, tau" in err and len(err) < 800, err
    assert run([*flags, "budget"]) == 0
    assert re.search(r"spent:\s+epsilon=0 delta=0\n", capsys.readouterr().out)
