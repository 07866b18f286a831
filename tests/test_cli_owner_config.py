"""Owner policy cannot be bypassed through CLI flags (regression of a review finding).

The threat model treats ``--debug`` as something the analyst may pass while the configuration
is the owner's ("--debug is refused unless the configuration itself sets [engine] debug"), i.e.
it assumes an analyst who can add command-line flags to a run with the owner's config. The same
analyst can then add ``--table`` over the owner's file (their own tau, caps, bounds) and
``--ledger`` (a fresh budget), so the owner's tau floor and total budget do not hold."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dpsql.cli import main

OWNER_TOML = """
[ledger]
path = "owner_ledger.db"
epsilon = 10.0
delta = 1e-4
create_if_missing = true

[tables.events]
source = "data.parquet"
privacy_unit = "uid"
max_groups_per_unit = 1
tau = 50
"""


def setup(tmp_path: Path) -> Path:
    # 45 units in group 'rare': below the owner's tau = 50, never to be released
    pq.write_table(pa.table({"uid": list(range(45)), "g": ["rare"] * 45}), tmp_path / "data.parquet")
    (tmp_path / "owner.toml").write_text(OWNER_TOML)
    return tmp_path


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``dpsql --config owner.toml ARGS`` run in ``cwd`` (in this process: what it prints and its exit code)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--config", "owner.toml", *args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_control_owner_tau_suppresses_small_group(tmp_path: Path) -> None:
    d = setup(tmp_path)
    r = cli(d, "query", "SELECT g, COUNT(*) FROM events GROUP BY g", "--epsilon", "3", "--delta", "1e-5",
            "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert "rare" not in r.stdout


def test_table_flag_over_owner_file_cannot_lower_tau(tmp_path: Path) -> None:
    d = setup(tmp_path)
    r = cli(d, "--table", "mine=data.parquet", "--privacy-unit", "mine=uid", "query",
            "SELECT g, COUNT(*) FROM mine GROUP BY g", "--epsilon", "3", "--delta", "1e-5", "--format", "csv")
    # either refused, or the owner's tau still applies to the owner's data
    assert r.returncode != 0 or "rare" not in r.stdout


def test_ledger_flag_cannot_replace_owner_budget(tmp_path: Path) -> None:
    d = setup(tmp_path)
    assert cli(d, "query", "SELECT COUNT(*) FROM events", "--epsilon", "10").returncode == 0
    assert cli(d, "query", "SELECT COUNT(*) FROM events", "--epsilon", "10").returncode != 0  # owner's budget spent
    # a fresh ledger with the same total, chosen by a flag, answers again over the owner's tables
    cli(d, "--ledger", "fresh.db", "init", "--epsilon", "10", "--delta", "1e-4")
    r = cli(d, "--ledger", "fresh.db", "query", "SELECT COUNT(*) FROM events", "--epsilon", "10")
    assert r.returncode != 0
