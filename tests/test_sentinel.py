"""Nothing private in any error: sentinel values in the private data must not appear in str(e),
repr(e), e.debug_detail, e.hint, chained exceptions, formatted tracebacks, log records, warnings,
the ledger history (every column) or the CLI's output, on every error path we can provoke,
with the owner's debug mode off and on (where DuckDB's text is scrubbed of values).

Each provoked failure has a control showing that the raw DuckDB message does carry the sentinel,
so the checks can fail."""

from __future__ import annotations

import logging
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlglot import parse_one

import dpsql
from dpsql import Budget, errors
from dpsql.engine import Engine, scrub
from dpsql.testing import use_noise, zero_noise

SECRET = "SENTINEL_SECRET_42"
NUMBER = 73619284  # a numeric sentinel: no digit run of it may appear either
MARKS = (SECRET, "SENTINEL", str(NUMBER), "7361928", "3619284")


def private_table(n: int = 30) -> pa.Table:
    notes = ["1"] * n  # every other note converts (to INTEGER, BOOLEAN, a year): the sentinel is what fails
    notes[4] = SECRET
    amounts = [float(i) for i in range(n)]
    amounts[5] = float(NUMBER)
    return pa.table({"user_id": pa.array(range(1, n + 1), pa.int64()), "note": notes, "amount": amounts})


def clean(*texts: Any) -> None:
    for t in texts:
        s = str(t)
        for m in MARKS:
            assert m not in s, f"{m!r} leaked in {s[:300]!r}"


def clean_exception(e: BaseException) -> None:
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for x in chain:
        clean(str(x), repr(x), getattr(x, "debug_detail", None), getattr(x, "hint", None), x.args,
              getattr(x, "__dict__", {}))
    clean("".join(traceback.format_exception(e)))


@pytest.fixture
def capture(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], None]]:
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")

        def check() -> None:
            clean(caplog.text, [r.getMessage() for r in caplog.records], [str(w.message) for w in ws])

        yield check


def session(debug: bool, **kw: Any) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 1e-3), debug=debug, **kw)
    use_noise(s, zero_noise())
    return s


def failing_fetch(sql: str) -> Callable[..., Any]:
    """fetch_arrow running ``sql`` instead of the bounded query: a real DuckDB failure on a real row."""
    real = Engine.fetch_arrow

    def run(self: Engine, ast: Any, *, what: str = "the bounded query") -> Any:
        view = next(v for v, _ in self._views)
        return real(self, parse_one(sql.format(view=f'"{view}"'), read="duckdb"), what=what)

    return run


RUNTIME_FAILURES = {
    "text to boolean": "SELECT COUNT(*) FROM {view} WHERE note::BOOLEAN",
    "text to integer": "SELECT SUM(note::INTEGER) FROM {view}",
    "number out of range": "SELECT SUM(amount::TINYINT) FROM {view}",
    "strptime": "SELECT COUNT(*) FROM {view} WHERE strptime(note, '%Y') IS NULL",
    "integer overflow": "SELECT SUM(amount::INTEGER * 100000) FROM {view}",
}


@pytest.mark.parametrize("name", sorted(RUNTIME_FAILURES))
def test_control_duckdb_quotes_the_cell(name: str) -> None:
    con = duckdb.connect()
    con.register("v", private_table())
    with pytest.raises(duckdb.Error) as ei:
        con.sql(RUNTIME_FAILURES[name].format(view="v")).fetchall()
    assert any(m in str(ei.value) for m in MARKS)  # the raw text leaks: what dpsql must hide
    assert not any(m in scrub(str(ei.value)) for m in MARKS)


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("name", sorted(RUNTIME_FAILURES))
def test_runtime_failures_after_the_charge(name: str, debug: bool, capture: Callable[[], None],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with session(debug) as s:
        s.register("t", private_table(), privacy_unit="user_id", columns={"amount": {"bounds": (0, 100)}})
        monkeypatch.setattr(Engine, "fetch_arrow", failing_fetch(RUNTIME_FAILURES[name]))
        with pytest.raises(errors.ExecutionError) as ei:
            s.query("SELECT COUNT(*) FROM t", epsilon=1)
        e = ei.value
        clean_exception(e)
        assert (e.debug_detail is not None) == debug  # debug mode on: DuckDB's class and scrubbed text
        if debug:
            assert "Exception" in e.debug_detail
        clean(s.history().to_pylist())
        assert s.history().to_pylist()[-1]["status"] == "failed"
    capture()


def test_the_wrapped_failure_is_withheld(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a chained reference to the original failure holds no text, attribute or frame."""
    with session(False) as s:
        s.register("t", private_table(), privacy_unit="user_id")
        monkeypatch.setattr(Engine, "fetch_arrow", failing_fetch(RUNTIME_FAILURES["text to boolean"]))
        with pytest.raises(errors.ExecutionError) as ei:
            s.query("SELECT COUNT(*) FROM t", epsilon=1)
        ctx = ei.value.__context__
        if ctx is not None:
            assert ctx.args == ("<withheld>",) and ctx.__traceback__ is None and not ctx.__dict__


@pytest.mark.parametrize("debug", [False, True])
def test_non_duckdb_failures_after_the_charge(debug: bool, capture: Callable[[], None],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A mechanism or solver failing with a message that quotes data (MemoryError, ValueError,
    a dpsql error): the same generic error."""
    from dpsql.mechanisms import basic

    messages = []
    for exc in (ValueError(f"bad value {SECRET} {NUMBER}"), MemoryError(SECRET),
                errors.ConfigError(f"DAWA histogram contains {NUMBER}", hint=SECRET)):
        def boom(*a: Any, _exc: BaseException = exc, **k: Any) -> Any:
            raise _exc

        monkeypatch.setattr(basic, "release", boom)
        with session(debug) as s:
            s.register("t", private_table(), privacy_unit="user_id", columns={"amount": {"bounds": (0, 100)}})
            with pytest.raises(errors.ExecutionError) as ei:
                s.query("SELECT SUM(amount) AS x FROM t", epsilon=1)
            clean_exception(ei.value)
            clean(s.history().to_pylist())
            messages.append(ei.value.message)
    assert len(set(messages)) == 1
    capture()


@pytest.mark.parametrize("debug", [False, True])
def test_post_processing_failures(debug: bool, capture: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: Engine, table: Any, builder: Any) -> Any:
        raise duckdb.ConversionException(f"Could not convert string '{SECRET}' to INT32 ({NUMBER})")

    monkeypatch.setattr(Engine, "post_process", boom)
    with session(debug) as s:
        s.register("t", private_table(), privacy_unit="user_id")
        with pytest.raises(errors.ExecutionError) as ei:
            s.query("SELECT COUNT(*) AS n FROM t HAVING n > 0", epsilon=1)
        clean_exception(ei.value)
        clean(s.history().to_pylist())
    capture()


@pytest.mark.parametrize("debug", [False, True])
def test_bind_errors_are_free_and_clean(debug: bool, capture: Callable[[], None]) -> None:
    with session(debug) as s:
        s.register("t", private_table(), privacy_unit="user_id")
        for sql in ("SELECT COUNT(*) FROM t WHERE note + 1 > 0", "SELECT COUNT(*) FROM t WHERE lower(amount) = 'x'"):
            with pytest.raises(errors.QueryError) as ei:
                s.query(sql, epsilon=1)
            clean_exception(ei.value)
            if isinstance(ei.value, errors.QueryTypeError):
                assert (ei.value.debug_detail is not None) == debug
        assert s.history().num_rows == 0
    capture()


@pytest.mark.parametrize("debug", [False, True])
def test_timeouts_are_clean(debug: bool, capture: Callable[[], None]) -> None:
    con = duckdb.connect()
    con.execute(f"CREATE VIEW huge AS SELECT i AS user_id, CASE WHEN i = 5 THEN '{SECRET}' ELSE 'n' END AS note "
                "FROM range(20000000000) r(i)")
    with session(debug, connection=con, engine={"statement_timeout": 0.3}) as s:
        s.register("t", "huge", privacy_unit="user_id")
        with pytest.raises(errors.ExecutionError) as ei:
            s.query("SELECT COUNT(*) FROM t WHERE note = 'n'", epsilon=1)
        clean_exception(ei.value)
        clean(s.history().to_pylist())
    capture()


def test_source_failures_are_clean(tmp_path: Path, capture: Callable[[], None]) -> None:
    """Invalid UTF-8 next to the sentinel, a corrupt Parquet file, a CSV whose header is broken."""
    raw = pa.array([f"{SECRET}".encode() + b"\xff", b"ok"], pa.binary())
    bad = pa.Array.from_buffers(pa.string(), 2, raw.buffers())
    pq.write_table(pa.table({"user_id": [1, 2], "note": bad}), tmp_path / "b.parquet")
    with session(True) as s:
        s.register("t", str(tmp_path / "b.parquet"), privacy_unit="user_id")
        s.query("SELECT COUNT(*) FROM t WHERE note = 'ok'", epsilon=1)
        clean(s.history().to_pylist())
    (tmp_path / "c.parquet").write_bytes(b"PAR1" + SECRET.encode() * 10)
    (tmp_path / "h.csv").write_bytes(b"user_id,\xff" + SECRET.encode() + b"\n1,2\n")
    for src in (tmp_path / "c.parquet", tmp_path / "h.csv"):
        with session(True) as s, pytest.raises(errors.ConfigError) as ei:
            s.register("t", str(src), privacy_unit="user_id")
        clean_exception(ei.value)
    capture()


def test_cli_with_debug_off_and_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str], capture: Callable[[], None]) -> None:
    from dpsql.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(private_table(), tmp_path / "p.parquet")
    assert main(["init", "--epsilon", "5", "--ledger", "l.duckdb"]) == 0
    flags = ["--ledger", "l.duckdb", "--table", "t=p.parquet", "--privacy-unit", "t=user_id"]
    monkeypatch.setattr(Engine, "fetch_arrow", failing_fetch(RUNTIME_FAILURES["text to integer"]))
    for extra in ([], ["--debug"]):
        assert main([*flags, *extra, "query", "SELECT COUNT(*) FROM t", "--epsilon", "0.1"]) == 5
        out, err = capsys.readouterr()
        clean(out, err)
        assert "ExecutionError" in err and ("debug: ConversionException" in err) == bool(extra)
    for extra in ([], ["--debug"]):  # a bind error (free)
        assert main([*flags, *extra, "query", "SELECT COUNT(*) FROM t WHERE note + 1 > 0", "--epsilon", "0.1"]) == 2
        out, err = capsys.readouterr()
        clean(out, err)
    assert main(["--ledger", "l.duckdb", "budget", "--history"]) == 0
    out, err = capsys.readouterr()
    clean(out, err)
    assert out.count("failed") == 2
    with dpsql.ledger.Ledger.open(str(tmp_path / "l.duckdb")) as led:
        clean(led.history().to_pylist())
    capture()
