"""What the core needs of an execution backend besides the building blocks (docs/architecture.md, "Adding an
execution backend"): a backend registered in ``dpsql.engine.BACKENDS`` and implementing ``ExecutionBackend``
is selected by ``[engine] kind``, and a hook it does not have is never taken to hold."""

from __future__ import annotations

from typing import Any

import pytest

import dpsql
from dpsql.charge import charged, reserve
from dpsql.engine import DuckDBBackend, EngineSettings
from dpsql.errors import ExecutionError
from dpsql.ledger import open_ledger


class Minimal:
    """A backend with the methods ``ExecutionBackend`` lists and nothing else (it runs on DuckDB)."""

    dialect = "duckdb"

    def __init__(self, connection: Any = None, settings: EngineSettings | None = None) -> None:
        self._inner = DuckDBBackend(connection, settings)
        self.settings, self.ops = self._inner.settings, self._inner.ops

    def render(self, ast: Any, *, pretty: bool = False) -> str:
        return self._inner.render(ast, pretty=pretty)

    def register_source(self, *a: Any, **k: Any) -> dict[str, str]:
        return self._inner.register_source(*a, **k)

    def unregister_source(self, *a: Any, **k: Any) -> None:
        self._inner.unregister_source(*a, **k)

    def describe(self, ast: Any) -> list[tuple[str, str]]:
        return self._inner.describe(ast)

    def bind_check(self, ast: Any, *, run: bool = False) -> None:
        self._inner.bind_check(ast, run=run)

    def fetch_arrow(self, ast: Any, *, what: str = "the bounded query", deadline: float | None = None) -> Any:
        return self._inner.fetch_arrow(ast, what=what, deadline=deadline)

    def post_process(self, table: Any, ast_builder: Any) -> Any:
        return self._inner.post_process(table, ast_builder)

    def close(self) -> None:
        self._inner.close()


def test_a_failure_after_the_charge_on_a_backend_without_debug_detail_is_the_generic_error() -> None:
    backend = Minimal(settings=EngineSettings(debug=True))
    ledger = open_ledger(None, dpsql.Budget(1.0, 0.0))
    entry = reserve(ledger, dpsql.Budget(0.5, 0.0), mechanism="m", query="q", tables=["t"], params={})
    with pytest.raises(ExecutionError, match="failed after its budget was charged") as caught:
        with charged(ledger, backend, entry, "the query"):
            raise ValueError("a private value 42")
    assert "42" not in str(caught.value) + str(caught.value.__context__) + str(caught.value.__cause__)
    assert ledger.history().to_pylist()[-1]["status"] == "failed"
    backend.close()


def test_a_backend_registered_in_backends_is_chosen_by_the_engine_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    from dpsql import engine
    from dpsql.errors import ConfigError

    monkeypatch.setitem(engine.BACKENDS, "minimal", Minimal)
    with dpsql.Session(ledger=None, budget=dpsql.Budget(1.0, 0.0), engine="minimal") as s:
        assert isinstance(s._engine, Minimal)
        s.register("t", pa.table({"pid": list(range(40))}), privacy_unit="pid")
        assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5).table.column_names == ["n"]
    with pytest.raises(ConfigError, match="'duckdb', 'minimal' or 'spark'"):
        EngineSettings(kind="nope")


def test_file_and_connection_tables_on_a_backend_that_cannot_check_them_are_refused_for_free(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Before every charge the core asks the engine whether a table's files were replaced (``source_changed``) and
    whether a DuckDB table now reads something else (``reading_scans``): an engine without the hook is refused, never
    taken to have nothing to report."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dpsql import engine
    from dpsql.errors import ConfigError

    monkeypatch.setitem(engine.BACKENDS, "minimal", Minimal)
    pq.write_table(pa.table({"pid": list(range(40))}), tmp_path / "t.parquet")
    con = duckdb.connect()
    con.execute("CREATE TABLE u AS SELECT range AS pid FROM range(40)")
    with dpsql.Session(ledger=None, budget=dpsql.Budget(1.0, 0.0), engine="minimal", connection=con) as s:
        s.register("t", str(tmp_path / "t.parquet"), privacy_unit="pid")
        s.register("u", "u", privacy_unit="pid")
        with pytest.raises(ConfigError, match="source_changed"):
            s.query("SELECT COUNT(*) FROM t", epsilon=0.5)
        with pytest.raises(ConfigError, match="reading_scans"):
            s.query("SELECT COUNT(*) FROM u", epsilon=0.5)
        assert s.history().num_rows == 0
