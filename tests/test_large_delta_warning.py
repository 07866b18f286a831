"""A query's delta above 1e-3 draws a warning, as an epsilon above 10 does: a release may reveal one person outright
with probability delta, so delta is usually far below 1 / the number of people. Public parameters only: the query
still runs and is charged as asked."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pytest

import dpsql
from dpsql.cli import main as run
from dpsql.testing import use_noise, zero_noise

_EVENTS = pa.table({"uid": list(range(40)), "k": ["a", "b"] * 20})


@pytest.fixture(scope="module")
def session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5))
    s.register("events", _EVENTS, privacy_unit="uid", columns={"k": {"domain": ["a", "b"]}})
    use_noise(s, zero_noise())
    return s


@pytest.mark.parametrize("delta", [0.01, 0.2])
def test_a_large_delta_is_warned_of(session: dpsql.Session, delta: float) -> None:
    with pytest.warns(UserWarning, match=rf"delta={delta:g} is unusually large"):
        r = session.query("SELECT k, COUNT(*) AS n FROM events GROUP BY k", epsilon=1.0, delta=delta)
    assert r.table.num_rows == 2 and r.cost.delta == pytest.approx(delta, rel=1e-9)  # (with its float allowance)


@pytest.mark.parametrize("delta", [0.0, 1e-6, 1e-3])
def test_negative_control_a_usual_delta_is_not(session: dpsql.Session, delta: float) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session.query("SELECT k, COUNT(*) AS n FROM events GROUP BY k", epsilon=1.0, delta=delta)


def test_the_warning_points_at_the_callers_line(session: dpsql.Session) -> None:
    with pytest.warns(UserWarning) as got:
        session.explain("SELECT k, COUNT(*) AS n FROM events GROUP BY k", epsilon=1.0, delta=0.1)
    assert [Path(w.filename).name for w in got] == [Path(__file__).name]


def test_the_cli_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow.parquet as pq

    pq.write_table(_EVENTS, tmp_path / "e.parquet")
    args = ["--ledger", str(tmp_path / "l.duckdb"), "--table", f"events={tmp_path / 'e.parquet'}",
            "--privacy-unit", "events=uid", "--domain", "events.k=a,b"]
    assert run([*args, "init", "--epsilon", "10", "--delta", "0.5"]) == 0
    capsys.readouterr()
    assert run([*args, "explain", "SELECT k, COUNT(*) AS n FROM events GROUP BY k", "--epsilon", "1",
                "--delta", "0.05"]) == 0
    err = capsys.readouterr().err
    assert "warning: --delta 0.05 is unusually large" in err, err
    assert run([*args, "explain", "SELECT k, COUNT(*) AS n FROM events GROUP BY k", "--epsilon", "1",
                "--delta", "1e-6"]) == 0
    assert "unusually large" not in capsys.readouterr().err
