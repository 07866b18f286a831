"""Regression: text a ledger cannot store (a lone surrogate, as Python decodes a command-line
argument holding invalid UTF-8; a NUL character, which PostgreSQL refuses) reached the ledger's
transaction and failed there as a LedgerError (exit code 4) whose hint blamed the disk or the
server. It charges nothing either way; now it is a free ConfigError naming the text, before the
ledger is touched, with the same answer on every ledger."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.ledger import Ledger


@pytest.mark.parametrize("bad", ["x\udcff", "a\x00b"])
def test_unstorable_text_is_a_free_config_error(tmp_path: Path, bad: str) -> None:
    led = Ledger.create(tmp_path / "l.duckdb", Budget(1.0))
    calls = [
        dict(query=bad, tables=["t"], params={}, mechanism="m"),
        dict(query="q", tables=[bad], params={}, mechanism="m"),
    ]
    if bad != "a\x00b":  # inside JSON a NUL is the escape \u0000, which both ledgers store
        calls.append(dict(query="q", tables=["t"], params={"k": bad}, mechanism="m"))
    for kw in calls:
        with pytest.raises(ConfigError, match="cannot store"):
            led.reserve(Budget(0.1), **kw)  # type: ignore[arg-type]
    assert led.spent() == Budget(0.0)


def test_cli_style_query_with_invalid_utf8_costs_nothing_and_says_why(tmp_path: Path) -> None:
    with dpsql.Session(tmp_path / "l.duckdb", Budget(1.0), create=True) as s:
        s.register("t", pa.table({"u": [1, 2, 3]}), privacy_unit="u")
        with pytest.raises(dpsql.errors.SQLSyntaxError, match="lone surrogate") as e:  # refused while parsing
            s.query("SELECT COUNT(*) FROM t -- caf\udce9", epsilon=0.5)
        assert (e.value.line, e.value.col) == (1, 30) and "UTF-8" in (e.value.hint or "")
        assert s.remaining() == Budget(1.0)
        s.query("SELECT COUNT(*) FROM t -- café", epsilon=0.5)  # control: valid text is charged and answered
        assert s.remaining() == Budget(0.5)
