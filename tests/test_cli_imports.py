"""What one ``dpsql query`` process imports: a count over public keys on the bundled example loads
only the modules that answer it (the start-up of the command is most of its time; see
benchmarks/cli_startup.py). Each module named here was once imported by that command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SQL = "SELECT country, COUNT(*) AS n FROM events GROUP BY country"

#: never imported by the query above
ABSENT = (
    # other mechanisms and their accounting
    "dpsql.mechanisms.quantile", "dpsql.mechanisms.ranges", "dpsql.mechanisms.dawa",
    "dpsql.mechanisms.sparse_histogram", "dpsql.mechanisms.profile", "dpsql.mechanisms.s4s",
    "dpsql.mechanisms.s4s_sql", "dpsql.mechanisms.s4s_vector",
    "dpsql.accounting.s4s", "dpsql.accounting.sparse_histogram", "dpsql.accounting.calibration",
    "dpsql.accounting.conversions", "dpsql.accounting.discrete_gaussian",
    # joins, other engines and ledgers
    "dpsql.plan.joins", "dpsql.rewrite.joins", "dpsql.engine.spark", "dpsql.engine.portable",
    "dpsql.ledger._postgres",
    # output files (the rows go to standard output as a table); pyarrow.parquet is imported by registration,
    # which reads each file's footer for its DECIMAL storage and its schema (2.6-5 ms once pyarrow.dataset is in)
    "dpsql._output", "pyarrow.csv",
    # heavy parts of SciPy
    "scipy.stats", "scipy.sparse", "scipy.optimize",
)

#: what the query needs (so that the probe is seen to run the query)
PRESENT = ("dpsql.session", "dpsql.mechanisms.basic", "dpsql.accounting.gaussian", "pyarrow.dataset")

PROBE = """
import json, runpy, sys
sys.argv = ["dpsql"] + json.loads(sys.argv[1])
try:
    runpy.run_module("dpsql.cli", run_name="__main__")
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _query_modules(tmp_path: Path, args: list[str]) -> set[str]:
    ex = tmp_path / "examples"
    shutil.copytree(REPO / "examples", ex, ignore=shutil.ignore_patterns("*.duckdb*", ".*"))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(["--config", "dpsql.toml", *args])], cwd=ex,
                       env=env, capture_output=True, text=True, timeout=120)
    out = json.loads(r.stderr.strip().splitlines()[-1])
    assert out["code"] == 0, r.stderr
    return set(out["modules"])


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_count_over_public_keys_imports_only_what_answers_it(tmp_path: Path, fmt: str) -> None:
    mods = _query_modules(tmp_path, ["query", SQL, "--epsilon", "0.01", "--delta", "1e-8", "--format", fmt])
    assert set(PRESENT) <= mods
    assert sorted(set(ABSENT) & mods) == []


def test_the_check_sees_a_module_the_command_imports(tmp_path: Path) -> None:
    # negative control: a Parquet output loads its writer, and a quantile its mechanism
    mods = _query_modules(tmp_path, ["query", "SELECT MEDIAN(amount) AS m FROM events", "--epsilon", "0.5",
                                     "-o", str(tmp_path / "m.parquet")])
    assert {"pyarrow.parquet", "dpsql.mechanisms.quantile", "dpsql._output"} <= mods


def test_a_count_at_delta_zero_does_not_load_scipy_special(tmp_path: Path) -> None:
    """Laplace (pure ε) draws its noise without SciPy: scipy.special (about 0.3 s of CPU to import) is loaded only by
    the Gaussian's sampling and calibration, so an ε-only command (most of an ETL job's) does not pay for it. The
    same count at δ > 0 loads it (negative control)."""
    pure = _query_modules(tmp_path / "pure", ["query", SQL, "--epsilon", "0.5"])
    assert "dpsql.mechanisms.basic" in pure and "scipy.special" not in pure
    gaussian = _query_modules(tmp_path / "gaussian", ["query", SQL, "--epsilon", "0.5", "--delta", "1e-6"])
    assert "scipy.special" in gaussian
