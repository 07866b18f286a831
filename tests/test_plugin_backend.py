"""An execution backend plugged in from outside dpsql, following docs/architecture.md ("Adding an execution backend").

``Recording`` wraps the DuckDB backend and records every statement it is sent, with the state of the ledger at that
moment. It is registered in ``dpsql.engine.BACKENDS`` and selected by the engine ``kind``; no file of dpsql is edited.
Every query shape of the library runs through it and gives the DuckDB backend's answer, and every read of a private
row comes after its charge is reserved in the ledger and before it is released (invariant 3).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from sqlglot import exp

import dpsql
from dpsql import engine
from dpsql.budget import Budget
from dpsql.engine import DuckDBBackend, EngineSettings
from dpsql.testing import use_noise, zero_noise


class Recording:
    """A backend that hands every call to a DuckDB backend and records the statements it runs (``log``: (call,
    rendered SQL, the statuses of the ledger's entries then)); ``ledger`` is set by the test once the Session has
    one."""

    dialect = "duckdb"

    def __init__(self, connection: Any = None, settings: EngineSettings | None = None) -> None:
        self._inner = DuckDBBackend(connection, settings)
        self.settings, self.ops = self._inner.settings, self._inner.ops
        self.log: list[tuple[str, str, list[str]]] = []
        self.ledger: Any = None

    def _note(self, call: str, ast: Any) -> None:
        statuses = [] if self.ledger is None else self.ledger.history().column("status").to_pylist()
        self.log.append((call, self._inner.render(ast) if isinstance(ast, exp.Expression) else str(ast), statuses))

    def render(self, ast: Any, *, pretty: bool = False) -> str:
        return self._inner.render(ast, pretty=pretty)

    def register_source(self, *a: Any, **k: Any) -> dict[str, str]:
        return self._inner.register_source(*a, **k)

    def unregister_source(self, *a: Any, **k: Any) -> None:
        self._inner.unregister_source(*a, **k)

    def describe(self, ast: Any) -> list[tuple[str, str]]:
        self._note("describe", ast)
        return self._inner.describe(ast)

    def bind_check(self, ast: Any, *, run: bool = False) -> None:
        self._note("run" if run else "bind", ast)
        self._inner.bind_check(ast, run=run)

    def fetch_arrow(self, ast: Any, *, what: str = "the bounded query", deadline: float | None = None) -> Any:
        self._note("fetch", ast)
        return self._inner.fetch_arrow(ast, what=what, deadline=deadline)

    def post_process(self, table: Any, ast_builder: Any) -> Any:
        self._note("post", ast_builder("__released"))
        return self._inner.post_process(table, ast_builder)

    def close(self) -> None:
        self._inner.close()


REGIONS = ["n", "s", "e", "w", "c"]


def _tables() -> dict[str, pa.Table]:
    rng = np.random.default_rng(3)
    pid = np.repeat(np.arange(400), rng.integers(1, 4, 400))
    persons = pa.table({"pid": pid, "region": [REGIONS[i] for i in rng.integers(0, 5, pid.size)],
                        "age": rng.integers(18, 90, pid.size), "score": rng.integers(0, 100, pid.size)})
    visits = pa.table({"v_pid": rng.integers(0, 400, 900), "minutes": rng.integers(1, 60, 900)})
    regions = pa.table({"region": REGIONS, "zone": ["NS", "NS", "EW", "EW", "C"]})
    return {"persons": persons, "visits": visits, "regions": regions}


def _session(kind: str) -> dpsql.Session:
    data = _tables()
    s = dpsql.Session(budget=Budget(100.0, 1e-3), engine=kind)
    s.register("regions", data["regions"], public=True)
    s.register("persons", data["persons"], privacy_unit="pid", max_rows_per_unit=3, max_groups_per_unit=3,
               references={"region": "regions.region"},
               columns={"region": {"domain": REGIONS}, "age": {"bounds": [0, 100]},
                        "score": {"bounds": [0, 100], "bins": 10}})
    s.register("visits", data["visits"], references={"v_pid": "persons.pid"}, degree_bounds={"v_pid": 8},
               columns={"minutes": {"bounds": [0, 60]}})
    use_noise(s, zero_noise())
    return s


SHAPES: list[tuple[str, float, dict[str, Any]]] = [
    ("SELECT COUNT(*) AS n FROM persons WHERE age > 40", 0.0, {}),
    ("SELECT SUM(age) AS s, AVG(age) AS a, STDDEV(age) AS sd FROM persons", 1e-6, {}),
    ("SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY n DESC LIMIT 3", 0.0, {}),
    ("SELECT age, COUNT(*) AS n FROM persons GROUP BY age HAVING COUNT(*) > 2", 1e-6, {}),
    ("SELECT MEDIAN(age) AS m, MAX(age) AS hi FROM persons", 0.0, {}),
    ("SELECT score_bin, COUNT(*) AS n FROM persons GROUP BY score_bin", 0.0, {}),
    ("SELECT DISTINCT region FROM persons", 0.0, {}),
    ("SELECT COUNT(*) AS n FROM persons p JOIN regions r ON p.region = r.region WHERE r.zone = 'EW'", 1e-6, {}),
    ("SELECT COUNT(*) AS n, SUM(minutes) AS m FROM visits v JOIN persons p ON v.v_pid = p.pid", 1e-6, {}),
    ("SELECT p.region, COUNT(*) AS n FROM visits v JOIN persons p ON v.v_pid = p.pid GROUP BY p.region", 1e-6, {}),
]
WORKLOAD = [f"SELECT COUNT(*) FROM persons WHERE score >= {lo} AND score < {lo + 20}" for lo in range(0, 100, 20)]


@pytest.fixture
def plugged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engine.BACKENDS, "recording", Recording)


def _answers(s: dpsql.Session) -> list[Any]:
    out: list[Any] = [s.query(sql, epsilon=1.0, delta=delta, options=opts).to_pylist() for sql, delta, opts in SHAPES]
    out.append(s.query_many(WORKLOAD, epsilon=1.0).table.to_pylist())
    out.append(s.suggest_caps("persons", epsilon=1.0).details["suggested"])
    return out


def test_every_query_shape_runs_on_a_plugged_backend_with_the_duckdb_answers(plugged: None) -> None:
    with _session("recording") as s, _session("duckdb") as d:
        assert isinstance(s._engine, Recording)
        s._engine.ledger = s.ledger
        got, want = _answers(s), _answers(d)
        assert got == want
        assert [r["mechanism"] for r in s.history().to_pylist()] == [r["mechanism"] for r in d.history().to_pylist()]
        views = [s.tables[t].view for t in ("persons", "visits")]
    public = [sql for call, sql, _ in s._engine.log if call == "fetch" and not any(v in sql for v in views)]
    # the declared key of the public table a join relies on, checked on its rows before the charge (dpsql._public_keys)
    assert public and all(s.tables["regions"].view in sql for sql in public)
    fetches = [(sql, statuses) for call, sql, statuses in s._engine.log if call == "fetch" and sql not in public]
    assert len(fetches) >= len(SHAPES) + 1
    for sql, statuses in fetches:  # every read of private rows: after its charge is reserved, before it is released
        assert any(v in sql for v in views) and statuses.count("reserved") == 1 and statuses[-1] == "reserved", sql[:200]
    for call, sql, _ in s._engine.log:  # other statements that run (checks, post-processing) read no private row
        assert call in ("fetch", "describe") or not any(v in sql for v in views), (call, sql[:200])


def test_the_recording_sees_a_read_outside_a_charge(plugged: None) -> None:
    """The negative control of the check above: a read of private rows with no reserved entry is seen as one."""
    with _session("recording") as s:
        s._engine.ledger = s.ledger
        s.query(SHAPES[0][0], epsilon=1.0)
        view = s.tables["persons"].view
        s._engine.fetch_arrow(exp.select("COUNT(*)").from_(exp.to_table(view, quoted=True)))
        call, sql, statuses = s._engine.log[-1]
        assert call == "fetch" and view in sql and statuses == ["released"]
