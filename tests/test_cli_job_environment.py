"""The command line as a scheduler runs it: a standard output whose reader has gone before anything was written,
and a locale whose encoding cannot name the files (PYTHONUTF8=0 under LC_ALL=C).

* ``dpsql query ... | loader`` whose loader died at start: the query was charged, then the write failed (exit 5,
  the answer saved aside). A pipe without a reader is found before the charge, as a closed standard output is
  (exit 2, nothing charged).
* Under an ASCII locale without Python's UTF-8 mode, a config's source named in UTF-8 ('données.parquet') was
  'no file matches' (now exit 66, a retry that never mends), and a --table path of UTF-8 bytes was 'not UTF-8
  text (byte 0xC3 is not UTF-8)'. Both now say that the locale's encoding cannot name the file, and how to run
  under a UTF-8 one (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import child_env


@pytest.fixture
def data(tmp_path: Path) -> Path:
    pq.write_table(pa.table({"uid": list(range(100))}), tmp_path / "t.parquet")
    pq.write_table(pa.table({"uid": list(range(100))}), tmp_path / "données.parquet")
    assert _dpsql(tmp_path, "--ledger", "l.duckdb", "init", "--epsilon", "10").returncode == 0
    return tmp_path


def _dpsql(cwd: Path, *argv: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpsql.cli", *argv], cwd=cwd, env={**child_env(), **(env or {})},
                          capture_output="stdout" not in kw, text=True, timeout=120, **kw)  # type: ignore[call-overload]


def _entries(cwd: Path) -> int:
    p = _dpsql(cwd, "--ledger", "l.duckdb", "budget", "--history", "--format", "json")
    assert p.returncode == 0, p.stderr
    return len(json.loads(p.stdout)["entries"])


QUERY = ("--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) AS n FROM t",
         "--epsilon", "0.1")


@pytest.mark.parametrize("reader", [False, True])
def test_a_pipe_whose_reader_has_gone_is_refused_before_the_charge(data: Path, reader: bool) -> None:
    r, w = os.pipe()
    if not reader:
        os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "dpsql.cli", *QUERY], cwd=data, env=child_env(), stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
        if reader:
            out = os.read(r, 65536).decode()
            os.close(r)
    if reader:  # negative control: a live reader gets the rows
        assert p.returncode == 0 and out.startswith("n"), p.stderr
        assert _entries(data) == 1
        return
    assert p.returncode == 2, p.stderr
    assert "standard output is a pipe whose reader has closed it" in p.stderr and "nothing was charged" in p.stderr, p.stderr
    assert _entries(data) == 0


ASCII = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def test_a_config_source_the_locale_cannot_name_says_so(data: Path) -> None:
    (data / "c.toml").write_text('[ledger]\npath = "l.duckdb"\n[tables.t]\nsource = "données.parquet"\nprivacy_unit = "uid"\n',
                                 encoding="utf-8")
    p = _dpsql(data, "--config", "c.toml", "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1", env=ASCII)
    assert p.returncode == 2, p.stderr
    assert "cannot be named in this process's file-system encoding" in p.stderr and "no file matches" not in p.stderr
    assert "PYTHONUTF8=1" in p.stderr.split("hint:")[1], p.stderr
    assert _dpsql(data, "--config", "c.toml", "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1").returncode == 0


def test_a_utf8_table_path_under_an_ascii_locale_is_not_called_not_utf8(data: Path) -> None:
    argv = [a.replace("t=t.parquet", "t=données.parquet") for a in QUERY]
    p = _dpsql(data, *argv, env=ASCII)
    assert p.returncode == 2, p.stderr
    assert "is UTF-8, but this process decodes file names as" in p.stderr and "PYTHONUTF8=1" in p.stderr, p.stderr
    assert _dpsql(data, *argv).returncode == 0  # negative control: under a UTF-8 locale it is read
