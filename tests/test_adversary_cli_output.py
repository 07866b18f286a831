"""Every released value the analyst is charged for can be written in every CLI output format.

Finding: a post-processed output of type INTERVAL (the difference of two released TIMESTAMPs, e.g.
``(MAX(d) + INTERVAL 1 DAY) - (MIN(d) + INTERVAL 1 DAY)``, or of two quantiles of a TIMESTAMP column)
was charged, then lost: Arrow's CSV and Parquet writers have no form for a month-day-nano interval,
so ``--format csv`` and ``-o out.parquet`` failed after the charge ("writing stdout failed
(ArrowNotImplementedError); its charge stands"), ``--format table`` printed Python's
``MonthDayNano(months=0, days=440, nanoseconds=0)`` and ``--format json`` a bare triple ``[0, 440, 0]``.
Every format now prints DuckDB's own text of the interval (``440 days``), the spelling
``CAST(x AS VARCHAR)`` gives.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

SQL = "SELECT (MAX(day) + INTERVAL 1 DAY) - (MAX(day) + INTERVAL 1 DAY) AS x, (MAX(day) + INTERVAL 26 HOUR) - (MAX(day) + INTERVAL 1 DAY) AS y FROM events"


def _config(workdir: Path) -> list[str]:
    cfg = workdir / "examples" / "dpsql.toml"
    cfg.write_text(cfg.read_text() + '\n[tables.events.columns.day]\nbounds = ["2020-01-01", "2025-01-01"]\nbin_width = "1 day"\n')
    return ["--config", str(cfg)]


def _entries(cfg: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    capsys.readouterr()
    assert run([*cfg, "budget", "--history", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)["entries"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("fmt", ["csv", "parquet", "table", "json"])
def test_an_interval_output_is_written_in_every_format(workdir: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    cfg = _config(workdir)
    extra = ["-o", "out.parquet"] if fmt == "parquet" else []
    rc = run([*cfg, "query", SQL, "--epsilon", "0.5", "--format", fmt, *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "failed" not in err
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out)))
        assert rows == [{"x": "00:00:00", "y": "02:00:00"}]
    elif fmt == "parquet":
        t = pq.read_table("out.parquet")
        assert t.to_pylist() == [{"x": "00:00:00", "y": "02:00:00"}]
    elif fmt == "json":
        assert json.loads(out)["rows"] == [{"x": "00:00:00", "y": "02:00:00"}]
    else:
        assert "MonthDayNano" not in out
        assert out.splitlines()[2].split(" | ") == ["00:00:00", "02:00:00"]
    assert [e["status"] for e in _entries(cfg, capsys)] == ["released"]


def test_interval_text_is_duckdbs_spelling() -> None:
    import pyarrow as pa

    from dpsql.cli import _writable

    vals = [pa.scalar((14, 3, 3_723_000_000_000), pa.month_day_nano_interval()), None,
            pa.scalar((-1, -2, -1_500_000), pa.month_day_nano_interval())]
    t = _writable(pa.table({"v": pa.array([v.as_py() if v is not None else None for v in vals], pa.month_day_nano_interval()),
                            "n": [1, 2, 3]}))
    assert t.column("v").to_pylist() == ["1 year 2 months 3 days 01:02:03", None, "-1 month -2 days -00:00:00.0015"]
    assert t.column("n").to_pylist() == [1, 2, 3]


def test_interval_text_matches_duckdb_on_random_intervals() -> None:
    import duckdb
    import numpy as np

    from dpsql.release import interval_text as _interval_text

    g = np.random.default_rng(7)
    con = duckdb.connect()
    cases = [(0, 0, 0), (12, 0, 0), (-12, 0, 0), (13, 1, 1_000), (-13, -1, -1_000), (0, 0, 360_000_000_000_000_000)]
    cases += [(int(g.integers(-300, 300)), int(g.integers(-40, 40)), int(g.integers(-10**14, 10**14)) * 1000) for _ in range(300)]
    for mo, d, ns in cases:
        want = con.execute(f"SELECT CAST(to_months({mo}) + to_days({d}) + to_microseconds({ns // 1000}) AS VARCHAR)").fetchall()[0][0]
        assert _interval_text(mo, d, ns) == want, (mo, d, ns)


def test_release_to_dict_spells_an_interval_as_duckdb_does() -> None:
    import pyarrow as pa

    from dpsql.budget import Budget
    from dpsql.release import Release

    t = pa.table({"x": pa.array([(0, 440, 7_200_000_000_000), None], pa.month_day_nano_interval())})
    rel = Release(t, Budget(1.0, 0.0), "exponential", {}, 1)
    assert rel.to_dict()["rows"] == [{"x": "440 days 02:00:00"}, {"x": None}]
