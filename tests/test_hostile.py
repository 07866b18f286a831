"""Hostile and malformed inputs: each gets its typed error, spends nothing, leaves the ledger
intact, and no error message quotes a private cell value."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import make_events

import dpsql
from dpsql import errors
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

SENTINEL = "SENTINEL_SECRET_42"
TOTAL = Budget(5.0, 1e-4)
COLUMNS = {"amount": {"bounds": (0, 100)}, "country": {"domain": ["US", "FR", "DE"]}}

U, P, S = errors.UnsupportedQueryError, errors.PolicyError, errors.SQLSyntaxError

HOSTILE_SQL: list[tuple[str, type[errors.DPSQLError]]] = [
    ("SELECT * FROM events", U),
    ("SELECT url FROM events", U),
    ("SELECT user_id, COUNT(*) FROM events", U),
    ("SELECT COUNT(*) OVER (PARTITION BY user_id) FROM events", U),
    ("SELECT COUNT(*) FROM read_parquet('events.parquet')", U),
    ("SELECT COUNT(*) FROM 'events.parquet'", U),
    ("SELECT COUNT(*) FROM read_csv_auto('/etc/passwd')", U),
    ("SELECT COUNT(*) FROM events WHERE url IN (SELECT url FROM events WHERE user_id = 1)", U),
    ("SELECT COUNT(*) FROM (SELECT user_id FROM events GROUP BY user_id)", U),
    ("SELECT COUNT(*) FROM events e1 LEFT JOIN events e2 ON e1.user_id = e2.user_id", U),
    ("SELECT COUNT(*) FROM events; DROP TABLE events", U),
    ("DROP TABLE events", U),
    ("CREATE TABLE stolen AS SELECT * FROM events", U),
    ("INSERT INTO events SELECT * FROM events", U),
    ("UPDATE events SET amount = 0", U),
    ("DELETE FROM events", U),
    ("PRAGMA table_info('events')", U),
    ("ATTACH 'ledger.duckdb' AS l", U),
    ("COPY events TO 'leak.csv'", U),
    ("COPY (SELECT * FROM events) TO 'leak.parquet'", U),
    ("INSTALL httpfs", U),
    ("LOAD httpfs", U),
    ("SET memory_limit = '1GB'", U),
    ("SELECT COUNT(*) FROM events WHERE getenv('USER') = url", U),
    ("SELECT COUNT(*) FROM events WHERE error(url) IS NULL", U),
    ("SELECT COUNT(*) FROM events WHERE random() < 0.5", U),
    ("SELECT COUNT(*) FROM events TABLESAMPLE 50%", U),
    ("SELECT MAX(url) FROM events", U),
    ("SELECT COUNT(DISTINCT url, country) FROM events", U),  # COUNT(DISTINCT col) is answered (k per person)
    ("SELECT COUNT(*) FROM events WHERE nosuch = 1", U),
    ("SELECT COUNT(*) FROM dpsql_ledger", P),
    ("SELECT COUNT(*) FROM ledger_entries", P),
    ("SELECT COUNT(*) FROM _dpsql_src_events", P),
    ("SELECT COUNT(*) FROM nosuch", P),
    ("SELECT SUM(age) FROM events", P),
    ("SELECT url, COUNT(*) FROM events GROUP BY url", P),  # undeclared keys need delta > 0 (delta=0 below)
    ("SELECT COUNT(*) FROM", S),
    ("SELECT 'unterminated", S),
    ("", S),
]

BAD_EPSILON = [float("nan"), float("inf"), float("-inf"), -1.0, 0.0, -0.0, "abc", None, True, [1.0], complex(1, 1)]
BAD_DELTA = [float("nan"), float("inf"), -1e-9, 1.0, 1.5, "abc", None, True]

BAD_OPTIONS: list[tuple[Any, type[errors.DPSQLError]]] = [
    ({"nosuch": 1}, errors.ConfigError),
    ({"seed": 1}, errors.ConfigError),
    ("tau=3", errors.ConfigError),
    ({"mechanism": "exponential"}, errors.PolicyError),  # answers quantiles only
    ({"mechanism": "nosuch"}, errors.ConfigError),
    ({"mechanism": "gaussian"}, errors.ConfigError),  # gaussian needs delta > 0 (delta=0 below)
    ({"mechanism": "dawa"}, errors.PolicyError),
    ({"tau": 3}, errors.ConfigError),  # tau applies to the sparse histogram only
    ({"tau": 0}, errors.ConfigError),
    ({"tau": 1.5}, errors.ConfigError),
    ({"sigma": -1.0}, errors.ConfigError),
    ({"tau_star": float("nan")}, errors.ConfigError),
    ({"epsilon_split": 2.0}, errors.ConfigError),
]


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def secret_events() -> pa.Table:
    t = make_events(sentinel=SENTINEL)
    assert SENTINEL in t["url"].to_pylist()
    return t


def _session(events: pa.Table) -> dpsql.Session:
    s = dpsql.Session(budget=TOTAL)
    use_noise(s, zero_noise())
    s.register("events", events, privacy_unit="user_id", max_groups_per_unit=2, columns=COLUMNS)
    return s


@pytest.fixture(scope="module")
def hsession(secret_events: pa.Table):
    """Shared by the refusal battery: every test checks that it spent nothing, so the state is
    the same for all of them (a test that spends fails on its own check)."""
    s = _session(secret_events)
    yield s
    s.close()


@pytest.fixture
def fresh_session(secret_events: pa.Table):
    """For tests that spend budget on purpose."""
    s = _session(secret_events)
    yield s
    s.close()


def assert_clean(err: BaseException) -> None:
    for text in (str(err), repr(err), getattr(err, "message", ""), getattr(err, "hint", "") or ""):
        assert "SENTINEL" not in text, text


def spends_nothing(s: dpsql.Session, fn: Any, cls: type[BaseException]) -> BaseException:
    n, rem = s.history().num_rows, s.remaining()
    with pytest.raises(cls) as ei:
        fn()
    assert type(ei.value) is cls or issubclass(type(ei.value), cls)
    assert s.history().num_rows == n and s.remaining() == rem
    assert_clean(ei.value)
    return ei.value


# -- SQL ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql,cls", HOSTILE_SQL, ids=[h[0][:50] or "<empty>" for h in HOSTILE_SQL])
def test_hostile_sql_is_refused_for_free(hsession: dpsql.Session, sql: str, cls: type) -> None:
    e = spends_nothing(hsession, lambda: hsession.query(sql, epsilon=1), cls)
    assert type(e) is cls
    spends_nothing(hsession, lambda: hsession.explain(sql, epsilon=1), cls)


@pytest.mark.parametrize("bad", [None, 3, b"SELECT COUNT(*) FROM events", ["SELECT 1"]])
def test_non_string_sql(hsession: dpsql.Session, bad: Any) -> None:
    spends_nothing(hsession, lambda: hsession.query(bad, epsilon=1), S)


def test_tables_of_a_callers_connection_are_not_reachable() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE secrets AS SELECT 'x' AS v, 1 AS user_id")
    with dpsql.Session(budget=TOTAL, connection=con) as s:
        s.register("events", make_events(), privacy_unit="user_id")
        spends_nothing(s, lambda: s.query("SELECT COUNT(*) FROM secrets", epsilon=1), P)
        spends_nothing(s, lambda: s.query("SELECT COUNT(*) FROM main.secrets", epsilon=1), P)  # a qualified name resolves to registered tables only


# -- privacy parameters and options -----------------------------------------------------------------------------


@pytest.mark.parametrize("eps", BAD_EPSILON, ids=repr)
def test_bad_epsilon(hsession: dpsql.Session, eps: Any) -> None:
    e = spends_nothing(hsession, lambda: hsession.query("SELECT COUNT(*) FROM events", epsilon=eps), errors.ConfigError)
    assert isinstance(e, ValueError) and "epsilon" in str(e)
    spends_nothing(hsession, lambda: hsession.explain("SELECT COUNT(*) FROM events", epsilon=eps), errors.ConfigError)


@pytest.mark.parametrize("delta", BAD_DELTA, ids=repr)
def test_bad_delta(hsession: dpsql.Session, delta: Any) -> None:
    e = spends_nothing(
        hsession, lambda: hsession.query("SELECT COUNT(*) FROM events", epsilon=1, delta=delta), errors.ConfigError
    )
    assert "delta" in str(e)


@pytest.mark.parametrize("eps,delta", [(float("nan"), 0.0), (-1.0, 0.0), (1.0, 1.0), (1.0, float("nan"))])
def test_bad_total_budget(tmp_path: Path, eps: float, delta: float) -> None:
    with pytest.raises(errors.ConfigError):
        dpsql.Session(ledger=tmp_path / "l.duckdb", budget=Budget(eps, delta))
    assert not (tmp_path / "l.duckdb").exists()


@pytest.mark.parametrize("opts,cls", BAD_OPTIONS, ids=[repr(o[0]) for o in BAD_OPTIONS])
def test_bad_options(hsession: dpsql.Session, opts: Any, cls: type) -> None:
    spends_nothing(hsession, lambda: hsession.query("SELECT COUNT(*) FROM events", epsilon=1, options=opts), cls)


def test_budget_exceeded_spends_nothing(hsession: dpsql.Session) -> None:
    e = spends_nothing(hsession, lambda: hsession.query("SELECT COUNT(*) FROM events", epsilon=5.5),
                       errors.BudgetExceededError)
    assert not isinstance(e, ValueError)
    spends_nothing(hsession, lambda: hsession.query("SELECT COUNT(*) FROM events", epsilon=1, delta=2e-4),
                   errors.BudgetExceededError)


# -- registration -------------------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path, secret_events: pa.Table) -> Path:
    pq.write_table(secret_events, tmp_path / "events.parquet")
    (tmp_path / "corrupt.parquet").write_bytes(os.urandom(256))
    (tmp_path / "corrupt.csv").write_bytes(b"\x00\xff" * 100)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "dir.parquet").mkdir()
    return tmp_path


REGISTER_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("{d}/missing.parquet", {"privacy_unit": "user_id"}, "no file matches"),
    ("{d}/nothing*.parquet", {"privacy_unit": "user_id"}, "no file matches"),
    ("{d}/corrupt.parquet", {"privacy_unit": "user_id"}, "cannot read"),
    ("{d}/notes.txt", {"privacy_unit": "user_id"}, "format"),
    ("{d}/events.parquet", {}, "privacy unit"),
    ("{d}/events.parquet", {"privacy_unit": "nosuch"}, "does not exist"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "columns": {"nosuch": {"bounds": (0, 1)}}}, "does not exist"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "columns": {"amount": {"bounds": (5, 1)}}}, "lo <= hi"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "columns": {"amount": {"bounds": (0, float("inf"))}}}, "finite"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "columns": {"amount": {"bounds": (float("nan"), 1)}}}, "finite"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "columns": {"amount": {"bound": (0, 1)}}}, "unknown key"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "columns": {"amount": (0, 1)}}, "must be a dict"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "max_groups_per_unit": 0}, "max_groups_per_unit"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "max_groups_per_unit": -3}, "max_groups_per_unit"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "max_groups_per_unit": 1.5}, "max_groups_per_unit"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "max_rows_per_group": float("nan")}, "max_rows_per_group"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "max_rows_per_group": "many"}, "max_rows_per_group"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "tau": 0}, "tau"),
    ("{d}/events.parquet", {"privacy_unit": "user_id", "references": {"x": "nodot"}}, "table.column"),
]


@pytest.mark.parametrize("source,kw,match", REGISTER_CASES, ids=[f"{c[0]}-{sorted(c[1])}" for c in REGISTER_CASES])
def test_bad_registration_is_config_error(hsession: dpsql.Session, files: Path, source: str, kw: dict, match: str) -> None:
    before = dict(hsession.tables)
    e = spends_nothing(hsession, lambda: hsession.register("t2", source.format(d=files), **kw), errors.ConfigError)
    assert match in str(e)
    assert hsession.tables.keys() == before.keys()
    # the refused table is not queryable
    spends_nothing(hsession, lambda: hsession.query("SELECT COUNT(*) FROM t2", epsilon=1), P)


@pytest.mark.parametrize("name", ["ledger", "dpsql_ledger", "_dpsql_src_x", "two words", "1abc", "a;b", "", None, 3])
def test_bad_table_names(hsession: dpsql.Session, files: Path, name: Any) -> None:
    spends_nothing(hsession, lambda: hsession.register(name, str(files / "events.parquet"), privacy_unit="user_id"),
                   errors.ConfigError)


@pytest.mark.parametrize("source", [42, None, b"x.parquet", {"path": "x"}, "nosuch_table", "x.parquet'); DROP TABLE t; --"])
def test_bad_sources(hsession: dpsql.Session, source: Any) -> None:
    spends_nothing(hsession, lambda: hsession.register("t2", source, privacy_unit="user_id"), errors.ConfigError)


def test_unknown_table_in_callers_connection() -> None:
    with dpsql.Session(budget=TOTAL, connection=duckdb.connect()) as s:
        with pytest.raises(errors.ConfigError, match="has no table .nosuch."):
            s.register("t", "nosuch", privacy_unit="user_id")


# -- the ledger ---------------------------------------------------------------------------------------------------------


def test_corrupt_ledgers_are_refused_untouched(tmp_path: Path) -> None:
    cases = {"random.duckdb": os.urandom(4096), "empty.duckdb": b""}
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE t AS SELECT 1 AS x")
    con.close()
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    for p in [tmp_path / n for n in cases] + [other]:
        before = _digest(p)
        for budget in (None, TOTAL):
            with pytest.raises(errors.LedgerError) as ei:
                dpsql.Session(ledger=p, budget=budget)
            assert not isinstance(ei.value, ValueError)
        assert _digest(p) == before, p


def test_ledger_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(errors.LedgerError):
        dpsql.Session(ledger=tmp_path, budget=TOTAL)


def test_ledger_in_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(errors.LedgerError):
        dpsql.Session(ledger=tmp_path / "no" / "such" / "l.duckdb", budget=TOTAL)
    assert not (tmp_path / "no").exists()


HOLD_LOCK = (
    "import duckdb, sys, time\n"
    "con = duckdb.connect(sys.argv[1])\n"
    "print('locked', flush=True)\n"
    "sys.stdin.readline()\n"
)


def test_locked_ledger(tmp_path: Path, secret_events: pa.Table) -> None:
    path = tmp_path / "ledger.duckdb"
    s = dpsql.Session(ledger=path, budget=TOTAL, lock_timeout=0.3, create=True)
    use_noise(s, zero_noise())
    s.register("events", secret_events, privacy_unit="user_id", columns=COLUMNS)
    s.query("SELECT COUNT(*) FROM events", epsilon=1)
    rem, n = s.remaining(), s.history().num_rows
    before = _digest(path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(errors.LedgerError, match="locked") as ei:
            s.query("SELECT COUNT(*) FROM events", epsilon=1)
        assert_clean(ei.value)
        with pytest.raises(errors.LedgerError):
            dpsql.Session(ledger=path, lock_timeout=0.2)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=20)
    assert _digest(path) == before
    assert s.remaining() == rem and s.history().num_rows == n
    s.close()


def test_file_ledger_untouched_by_the_whole_battery(tmp_path: Path, files: Path, secret_events: pa.Table) -> None:
    path = tmp_path / "ledger.duckdb"
    with dpsql.Session(ledger=path, budget=TOTAL, create=True) as s:
        use_noise(s, zero_noise())
        s.register("events", secret_events, privacy_unit="user_id", columns=COLUMNS)
        before = _digest(path)
        for sql, cls in HOSTILE_SQL:
            with pytest.raises(cls):
                s.query(sql, epsilon=1)
        for eps in BAD_EPSILON:
            with pytest.raises(errors.ConfigError):
                s.query("SELECT COUNT(*) FROM events", epsilon=eps)
        for opts, cls in BAD_OPTIONS:
            with pytest.raises(cls):
                s.query("SELECT COUNT(*) FROM events", epsilon=1, options=opts)
        for source, kw, _ in REGISTER_CASES:
            with pytest.raises(errors.ConfigError):
                s.register("t2", source.format(d=files), **kw)
        with pytest.raises(errors.BudgetExceededError):
            s.query("SELECT COUNT(*) FROM events", epsilon=6)
        assert _digest(path) == before
        assert s.history().num_rows == 0 and s.remaining() == TOTAL


# -- errors never quote private values ----------------------------------------------------------------------------------

DATA_ERRORS = [
    "SELECT COUNT(*) FROM events WHERE CAST(url AS INTEGER) > 3",
    "SELECT COUNT(*) FROM events WHERE url::DATE > DATE '2020-01-01'",
    "SELECT CAST(url AS DOUBLE) AS x, COUNT(*) FROM events GROUP BY x",
    "SELECT COUNT(*) FROM events WHERE strptime(url, '%Y-%m-%d') IS NOT NULL",
]


@pytest.mark.parametrize("sql", DATA_ERRORS)
def test_data_errors_become_null_not_failures(fresh_session: dpsql.Session, sql: str) -> None:
    # casts are TRY_CASTs and expressions run under TRY(...): a value that does not convert is
    # NULL, so whether the query fails never depends on anyone's data
    r = fresh_session.query(sql, epsilon=0.5, delta=1e-6)
    assert r.table.num_rows >= 1
    assert fresh_session.history().to_pylist()[-1]["status"] == "released"


def test_execution_error_does_not_quote_cells(fresh_session: dpsql.Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DuckDB failure after the charge (simulated: DuckDB messages can quote cells) is reported
    without the cell and without DuckDB's text (debug mode is off), and the charge stands."""
    import duckdb

    from dpsql.engine import Engine

    real = Engine.fetch_arrow

    def failing(self, ast, *, what="the bounded query"):  # type: ignore[no-untyped-def]
        class Boom:
            def sql(self, _q):  # type: ignore[no-untyped-def]
                raise duckdb.ConversionException(f"Could not convert string '{SENTINEL}' to INT32")

        saved = self._con
        self._con = Boom()
        try:
            return real(self, ast, what=what)
        finally:
            self._con = saved

    monkeypatch.setattr(Engine, "fetch_arrow", failing)
    sql = "SELECT COUNT(*) FROM events WHERE url <> 'x'"
    with pytest.raises(errors.ExecutionError) as ei:
        fresh_session.query(sql, epsilon=0.5, delta=1e-6)
    e = ei.value
    assert_clean(e)
    assert not isinstance(e, ValueError)
    assert e.debug_detail is None  # DuckDB's text only in the owner's debug mode (tests/test_sentinel.py)
    h = fresh_session.history().to_pylist()
    assert h[-1]["status"] == "failed" and h[-1]["query"] == sql
    assert all("SENTINEL" not in str(v) for row in h for v in row.values())
    # the charge stands: the request plus the sampler's floating-point delta (dpsql.noise section 3)
    charged = fresh_session.explain(sql, epsilon=0.5, delta=1e-6).cost
    assert charged.delta > 1e-6 and fresh_session.remaining() == TOTAL.minus(charged)


def test_type_error_in_where_does_not_quote_cells(fresh_session: dpsql.Session) -> None:
    # dpsql's typer refuses text used as a number before DuckDB sees it (an UnsupportedQueryError)
    with pytest.raises(errors.UnsupportedQueryError) as ei:
        fresh_session.query("SELECT COUNT(*) FROM events WHERE url + 1 > 0", epsilon=1)
    assert_clean(ei.value)
    assert "arithmetic needs numbers" in str(ei.value) and "CAST" in str(ei.value)


def test_type_error_spends_nothing(fresh_session: dpsql.Session) -> None:
    spends_nothing(fresh_session, lambda: fresh_session.query("SELECT COUNT(*) FROM events WHERE url + 1 > 0", epsilon=1),
                   errors.UnsupportedQueryError)


def test_whether_a_query_fails_does_not_depend_on_one_user(secret_events: pa.Table) -> None:
    sql = "SELECT COUNT(*) FROM events WHERE CASE WHEN user_id = 1 THEN CAST(url AS INTEGER) ELSE 0 END >= 0"
    outcomes = []
    for data in (secret_events, secret_events.filter(pc.not_equal(secret_events["user_id"], 1))):
        with dpsql.Session(budget=TOTAL) as s:
            use_noise(s, zero_noise())
            s.register("events", data, privacy_unit="user_id", columns=COLUMNS)
            try:
                s.query(sql, epsilon=1)
                outcomes.append("ok")
            except errors.ExecutionError:
                outcomes.append("error")
    assert outcomes[0] == outcomes[1], outcomes


def test_analysis_and_config_errors_do_not_quote_cells(hsession: dpsql.Session) -> None:
    # the sentinel is in the data, not in any SQL: none of these may mention it
    for sql in ("SELECT url FROM events", "SELECT COUNT(*) FROM events WHERE nosuch = 1",
                "SELECT SUM(url) FROM events", "SELECT url, COUNT(*) FROM events GROUP BY url"):
        with pytest.raises(errors.QueryError) as ei:
            hsession.query(sql, epsilon=1)
        assert_clean(ei.value)
    with pytest.raises(errors.ConfigError) as ei2:
        hsession.register("t3", make_events(sentinel=SENTINEL), privacy_unit="nosuch")
    assert_clean(ei2.value)


def test_released_keys_are_only_those_past_the_threshold(fresh_session: dpsql.Session) -> None:
    # the sentinel url belongs to one user: a sparse histogram must not release it
    r = fresh_session.query("SELECT url, COUNT(*) AS n FROM events GROUP BY url", epsilon=1, delta=1e-6)
    assert SENTINEL not in r.table["url"].to_pylist()
