"""The command line's machine I/O is UTF-8 whatever the locale: standard output (rows in every
text format, as `-o FILE` writes them) and `-f -` (the SQL on standard input, as `-f FILE` reads
it). Under a Latin-1 locale or PYTHONIOENCODING, a released key outside Latin-1 failed the write
after the charge ("error: unexpected UnicodeEncodeError", exit 1, no rows), and a UTF-8 query on
standard input was read as Latin-1, charged and answered about another key."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import child_env

KEYS = ["日本", "é", "plain"]


def _dpsql(cwd: Path, *argv: str, stdin: bytes = b"", encoding: str | None = "latin-1") -> subprocess.CompletedProcess[bytes]:
    env = child_env()
    env.pop("PYTHONIOENCODING", None)
    if encoding is not None:
        env["PYTHONIOENCODING"] = encoding  # what a Latin-1 locale (or a job runner's setting) gives Python
    flags = ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=uid", "--domain", "t.k=" + ",".join(KEYS)]
    return subprocess.run([sys.executable, "-m", "dpsql.cli", *flags, *argv], cwd=cwd, env=env, input=stdin,
                          capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def initialised(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The table and a fresh ledger, made once (``init`` is a process of its own); each test works on a copy."""
    d = tmp_path_factory.mktemp("initialised")
    n = 300
    pq.write_table(pa.table({"uid": list(range(n)), "k": [KEYS[i % 3] for i in range(n)]}), d / "t.parquet")
    assert _dpsql(d, "init", "--epsilon", "10", "--delta", "0").returncode == 0
    return d


@pytest.fixture
def data(initialised: Path, tmp_path: Path) -> Path:
    shutil.copytree(initialised, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _history(cwd: Path) -> list[dict[str, object]]:
    r = _dpsql(cwd, "budget", "--history", "--format", "json")
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout.decode("utf-8"))["entries"])


@pytest.mark.parametrize("fmt", ["csv", "table", "json"])
def test_released_keys_outside_the_locale_encoding_are_written_as_utf8(data: Path, fmt: str) -> None:
    r = _dpsql(data, "query", "SELECT k, COUNT(*) AS n FROM t GROUP BY k", "--epsilon", "1", "--format", fmt)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode("utf-8")  # bytes that are not UTF-8 fail here
    for k in KEYS:
        assert (k if fmt != "json" else json.dumps(k)) in out, out
    # control: the same query written as UTF-8 to a file is what stdout now holds
    assert _dpsql(data, "query", "SELECT k, COUNT(*) AS n FROM t GROUP BY k", "--epsilon", "1", "--format", fmt,
                  "-o", "-", encoding="utf-8").stdout.decode("utf-8").count("\n") == out.count("\n")


def test_sql_on_standard_input_is_read_as_utf8(data: Path) -> None:
    sql = "SELECT COUNT(*) AS n FROM t WHERE k = '日本' OR k = 'é'"
    r = _dpsql(data, "query", "-f", "-", "--epsilon", "1", "--format", "json", stdin=sql.encode("utf-8"))
    assert r.returncode == 0, r.stderr
    assert _history(data)[-1]["query"] == sql  # read as Latin-1 it was "k = 'æ\x97¥æ\x9c¬' OR k = 'Ã©'"


def test_standard_input_that_is_not_utf8_is_refused_before_the_charge(data: Path) -> None:
    r = _dpsql(data, "query", "-f", "-", "--epsilon", "1", stdin="SELECT COUNT(*) AS n FROM t WHERE k = 'é'".encode("latin-1"),
               encoding=None)  # the locale's (C.UTF-8 here): Python reads such bytes as lone surrogates
    err = r.stderr.decode("utf-8")
    assert r.returncode == 2 and "standard input (-f -) is not UTF-8" in err and "encoding=" not in err, err
    assert _history(data) == []


def test_any_failure_to_write_a_charged_release_says_the_charge_stands(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A write of the rows that failed with anything but an OSError (the UnicodeEncodeError above, an
    encoder's ValueError, a MemoryError) said only "error: unexpected UnicodeEncodeError": not that the
    query had been charged, nor its ledger entry."""
    from conftest import run_cli

    from dpsql import cli

    def broken(*a: object, **k: object) -> None:
        raise UnicodeEncodeError("latin-1", "日本", 0, 1, "ordinal not in range(256)")

    monkeypatch.setattr(cli, "_render_rows", broken)
    argv = ["--config", "examples/dpsql.toml", "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1"]
    assert run_cli(argv) == 5
    err = capsys.readouterr().err
    assert "its charge stands (ledger entry 1)" in err and "UnicodeEncodeError" in err and "unexpected" not in err, err
    # the rows could not be rendered in the format asked for: the release is kept as JSON
    saved = err.split("the released answer was saved to ", 1)[1].split()[0]
    assert json.loads((Path(saved) / "release.json").read_text())["meta"]["ledger_id"] == 1
