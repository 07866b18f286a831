"""Code examples of README.md and docs/ run exactly as written, on the bundled example data.

tests/test_documented_claims.py runs every `dpsql` command line of the README; these tests run the Python
blocks, the SQL blocks and the config snippets the docs show, and check that the files they name exist.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import dpsql
from dpsql.config import load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


@pytest.fixture
def example_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(ROOT / "examples" / "events.parquet", tmp_path / "events.parquet")
    shutil.copy(ROOT / "examples" / "dpsql.toml", tmp_path / "dpsql.toml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    return tmp_path


# -- README, "Python API": the first Python block runs as written (its file names are the example's)


def test_readme_python_api_block_runs_as_written(example_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    block = _blocks(README, "python")[0]
    assert block.startswith("import ") and 'ledger="ledger.duckdb"' in block and '"events.parquet"' in block
    exec(compile(block, "README.md (Python API)", "exec"), {"__name__": "readme"})
    assert "url" in capsys.readouterr().out  # the explain printed
    with dpsql.Session(ledger="ledger.duckdb") as s:
        [entry] = s.history().to_pylist()  # one charge: the query
        assert entry["status"] == "released" and entry["epsilon"] == 1.0


# -- README, "Range workloads (DAWA)": the query_many block, on the example's age column as `people`


def test_readme_range_workload_block_runs_as_written(example_dir: Path) -> None:
    block = next(b for b in _blocks(README, "python") if "query_many" in b)
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10, 1e-5))
    s.register("people", "events.parquet", privacy_unit="user_id", max_groups_per_unit=5, max_rows_per_group=1,
               max_rows_per_unit=5, columns={"age": {"bounds": (0, 120), "bins": 120}})
    ns: dict[str, object] = {"s": s}
    exec(compile(block, "README.md (Range workloads)", "exec"), ns)
    r = ns["r"]
    assert len(r.counts) == 2 and r.table.num_rows == 2  # type: ignore[attr-defined]
    # the three queries after the workload: the synopsis answers for free, the histogram is charged, the decades free
    kinds = [(e["mechanism"], e["epsilon"]) for e in s.history().to_pylist()]
    assert kinds[0] == ("dawa", 0.5) and kinds[1][1] == 0 and kinds[2] == ("dawa", 0.5) and kinds[3][1] == 0, kinds
    s.close()


# -- docs/sql.md, "Window functions over the released rows": each query of the block is accepted on the example


def test_sql_md_window_block_is_accepted(example_dir: Path) -> None:
    queries = [q for q in _blocks(_doc("sql.md"), "sql")[0].splitlines() if q.strip()]
    assert len(queries) == 4
    with dpsql.Session.from_config("dpsql.toml") as s:
        for q in queries:
            s.explain(q, epsilon=0.5, delta=1e-6)
    # README's list of refusals says which window functions are refused, not all of them
    flat = " ".join(README.split())
    assert "window functions over private rows" in flat and ", window functions, table" not in flat


# -- docs/spark.md: the config snippet is one the loader reads (it names a Spark master and a PostgreSQL ledger)


def test_spark_md_config_snippet_loads(tmp_path: Path) -> None:
    [toml] = _blocks(_doc("spark.md"), "toml")
    (tmp_path / "dpsql.toml").write_text(toml, encoding="utf-8")
    c = load_config(tmp_path / "dpsql.toml")
    assert c.engine.kind == "spark" and c.ledger_path.startswith("postgresql://") and "events" in c.tables


# -- every repository path the docs cite in backticks exists (outputs a command writes are named as such)

_WRITTEN = {"examples/example_ledger.duckdb", "benchmarks/out/spark_joins_10m.json"}  # created by a command; not kept


def test_cited_repository_paths_exist() -> None:
    texts = {"README.md": README, **{f"docs/{p.name}": p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md")}}
    missing = []
    for name, text in texts.items():
        for m in re.finditer(r"`((?:dpsql|benchmarks|sql|docs|examples|tests|docker)/[A-Za-z0-9_./-]+)`", text):
            path = m.group(1)
            if path not in _WRITTEN and not (ROOT / path).exists():
                missing.append(f"{name}:{text[:m.start()].count(chr(10)) + 1}: {path}")
    assert not missing, missing


# -- README, "Semantics worth knowing": AVG is released "with a per-row delta-method interval", and the summary
#    (noise_std, ci95_half_width, printed on stderr) is "median over rows": the rows shown, not the declared keys
#    the WHERE excluded (whose noisy counts near 0 made the summary of an average of [0, 100] read +/- 2000) nor
#    those cut by LIMIT


@pytest.mark.parametrize("tail", ["WHERE country IN ('US', 'FR') GROUP BY country",
                                  "GROUP BY country ORDER BY a DESC LIMIT 3"])
def test_avg_summary_accuracy_is_the_median_over_the_rows_shown(example_dir: Path, tail: str) -> None:
    import statistics

    with dpsql.Session.from_config("dpsql.toml") as s:
        r = s.query(f"SELECT country, AVG(amount) AS a FROM events {tail}", epsilon=1, delta=1e-7)
        acc = r.accuracy["a"]
        rows = acc["per_row_ci95_half_width"]
        assert len(rows) == r.table.num_rows in (2, 3)
        assert acc["ci95_half_width"] == statistics.median(rows), acc
        assert acc["noise_std"] < acc["ci95_half_width"] < 100, acc  # an average of values in [0, 100]
        assert len(acc["per_row_noise_std"]) == len(rows) and acc["noise_std"] == statistics.median(acc["per_row_noise_std"])


# -- docs/threat_model.md, "One person in both roles": with a config that registers tables, every flag that would
#    replace the owner's policy or budget is refused for free (exit 2)

_OWNER_FLAG_VALUES = {"--table": "x=events.parquet", "--privacy-unit": "events=url", "--max-groups": "events=9",
                      "--max-rows": "events=9", "--bounds": "events.amount=0:1000", "--domain": "events.url=a,b",
                      "--bins": "events.day=2024-01-01:2024-12-31:365", "--public": "events",
                      "--reference": "events.url=events.url", "--degree-bound": "events.url=3",
                      "--max-table-rows": "events=10", "--allow-conditional-sampling": "events", "--ledger": "z.duckdb"}


def test_threat_model_owner_flags_are_refused_with_a_config(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import run_cli

    flat = " ".join(_doc("threat_model.md").split())
    start = flat.index("the flags that would replace the owner's policy or budget (")
    listed = re.findall(r"`(--[a-z-]+)`", flat[start:flat.index(")", start)])
    assert set(listed) == set(_OWNER_FLAG_VALUES), listed
    for flag in listed:
        argv = ["--config", "examples/dpsql.toml", "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1",
                flag, _OWNER_FLAG_VALUES[flag]]
        assert run_cli(argv) == 2, flag
        assert f"{flag} cannot be combined with a config that registers tables" in capsys.readouterr().err, flag
    assert not (workdir / "examples" / "example_ledger.duckdb").exists()  # nothing charged, no ledger created


# -- README, "More to try": after the age_ranges.sql workload, the --reuse-synopsis count is "free: from the DAWA
#    synopsis"


def test_readme_reuse_synopsis_command_is_free_after_the_workload(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import shlex

    from conftest import run_cli

    more = next(b for b in _blocks(README, "bash") if "--reuse-synopsis" in b)
    workload, reuse = (line for line in more.splitlines() if "--workload" in line or "--reuse-synopsis" in line)
    assert "# free: from the DAWA synopsis" in reuse
    assert run_cli(shlex.split(workload)[1:]) == 0
    capsys.readouterr()
    assert run_cli([*shlex.split(reuse.split(" # ")[0])[1:], "--format", "json"]) == 0
    meta = json.loads(capsys.readouterr().out)["meta"]
    assert meta["mechanism"] == "dawa (reused synopsis)" and meta["cost"] == {"epsilon": 0.0, "delta": 0.0}, meta


# -- README, "The command line in ETL jobs": an unknown -o extension is refused without --format (nothing charged)
#    and written in the --format given; a --format that contradicts a known extension is refused


def test_readme_unknown_output_extension_needs_format(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import run_cli

    flat = " ".join(README.split())
    assert "an unknown extension without `--format` (`-o x.bin --format csv` writes CSV)" in flat
    base = ["--config", "examples/dpsql.toml", "query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1"]
    assert run_cli([*base, "-o", "x.bin"]) == 2 and "unknown extension .bin" in capsys.readouterr().err
    assert not (workdir / "examples" / "example_ledger.duckdb").exists()
    assert run_cli([*base, "-o", "x.csv", "--format", "json"]) == 2 and "does not match" in capsys.readouterr().err
    assert run_cli([*base, "-o", "x.bin", "--format", "csv"]) == 0
    assert (workdir / "x.bin").read_text().splitlines()[0] == '"n"'
