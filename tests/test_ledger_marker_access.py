"""Regression: a ledger shared by several users (a group-writable ledger file and directory)
whose generation marker only its creator may write: every other user's charge was committed, then
the marker update failed, so the query failed with "the charge stands" and each retry spent more
budget without ever answering. The marker's writability is now checked before the COMMIT (the
charge is refused and nothing is spent), and a new marker gets the ledger file's permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dpsql.budget import Budget
from dpsql.errors import LedgerError
from dpsql.ledger import GENERATION_SUFFIX, Ledger


def _reserve(led: Ledger) -> int:
    return led.reserve(Budget(0.1), mechanism="m", query="q", tables=["t"], params={})


def test_unwritable_marker_refuses_the_charge_and_spends_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    _reserve(led)
    marker = str(tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX))
    real_open = os.open

    def denied(p: object, flags: int, *a: object, **k: object) -> int:  # the marker belongs to another user
        if os.fspath(p) == marker and flags & (os.O_WRONLY | os.O_RDWR):  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", marker)
        return real_open(p, flags, *a, **k)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(os, "open", denied)
        for _ in range(3):  # a user retrying
            with pytest.raises(LedgerError, match="nothing was charged") as info:
                _reserve(led)
            assert not info.value.recorded and "marker" in str(info.value)
        assert led.remaining() == Budget(0.9)
    _reserve(led)  # control: writable again, charged as before
    assert Ledger.open(path).remaining() == Budget(0.8)


def test_new_marker_takes_the_ledger_files_permissions(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    led = Ledger.create(path, Budget(1.0))
    marker = tmp_path / (".ledger.duckdb" + GENERATION_SUFFIX)
    os.chmod(path, 0o664)  # the owner shares the ledger with a group
    marker.unlink()
    _reserve(led)
    assert stat.S_IMODE(marker.stat().st_mode) == 0o664


@pytest.mark.skipif(os.geteuid() != 0 or not __import__("shutil").which("setpriv"),
                    reason="needs root and setpriv to run a process that file permissions apply to")
def test_a_read_only_directory_names_the_directory_and_charges_nothing(tmp_path: Path) -> None:
    """A ledger in a directory its user cannot write: DuckDB cannot create the write-ahead log, and
    the refusal said 'nothing was charged, unless the write reached the disk before the error (then
    it counts)' with a hint about disk space. Now it names the directory, and that nothing was
    charged, for sure (no byte was written)."""
    import subprocess
    import sys

    from conftest import child_env

    d = tmp_path / "ro"
    d.mkdir()
    (tmp_path / "t.csv").write_text("u\n1\n")
    Ledger.create(d / "ledger.duckdb", Budget(1.0)).close()
    d.chmod(0o555)
    try:
        # root without the capabilities that bypass file permissions: a user who cannot write d
        p = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--inh-caps=-all",
                            sys.executable, "-c", "import sys; from dpsql.cli import main; sys.exit(main(sys.argv[1:]))",
                            "--ledger", str(d / "ledger.duckdb"), "--table", "t=t.csv", "--privacy-unit", "t=u",
                            "query", "SELECT COUNT(*) FROM t", "--epsilon", "0.5"],
                           cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    finally:
        d.chmod(0o755)
    assert p.returncode == 4, p.stderr
    assert f"its directory {d} is not writable" in p.stderr and "nothing was charged" in p.stderr, p.stderr
    assert "unless the write reached the disk" not in p.stderr and "hint:" in p.stderr
    assert Ledger.open(d / "ledger.duckdb").remaining() == Budget(1.0)
