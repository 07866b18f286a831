"""A repeated query's bounded SQL is built and rendered once (``DuckDBBackend.prepare_bounded``) and run with
each query's own fresh salt put into the text. These tests hold that this changes nothing a query runs: the text
run is exactly the text its tree built under that salt renders to, for every kind of bounded query, and every
query gets its own salt."""

from __future__ import annotations

import secrets
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from sqlglot import exp

import dpsql
from dpsql import Budget
from dpsql.engine.duckdb import DuckDBBackend, PreparedRead, SaltedRead
from dpsql.plan.typer import READ_SALT
from dpsql.rewrite.render import render

COUNTRIES = [f"C{i}" for i in range(12)]


def _events(n: int = 400) -> pa.Table:
    g = np.random.default_rng(3)
    user = g.integers(0, 80, n)
    return pa.table({"user_id": user, "country": np.array(COUNTRIES)[g.integers(0, 12, n)],
                     "url": np.array([f"u{i}" for i in range(30)])[g.integers(0, 30, n)],
                     "likes": g.integers(0, 10, n).astype(np.float64)})


def _session(engine: dict[str, Any] | None = None, connection: Any = None) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1e6, 0.9), engine=engine, connection=connection)
    s.register("events", _events(), privacy_unit="user_id", max_groups_per_unit=3, max_rows_per_group=2,
               columns={"country": {"domain": COUNTRIES}, "likes": {"bounds": [0, 10]}})
    s.register("customer", pa.table({"c_custkey": np.arange(60)}), privacy_unit="c_custkey")
    g = np.random.default_rng(0)
    s.register("orders", pa.table({"o_orderkey": np.arange(100), "o_custkey": g.integers(0, 60, 100)}),
               references={"o_custkey": "customer.c_custkey"}, degree_bounds={"o_custkey": 8},
               allow_conditional_sampling=True)
    return s


QUERIES = [
    "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
    "SELECT url, country, COUNT(*) AS n FROM events GROUP BY url, country",
    "SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events GROUP BY country",
    "SELECT COUNT(*) AS n FROM events WHERE url LIKE 'u1%'",
    "SELECT url, COUNT(DISTINCT country) AS n FROM events GROUP BY url",
    "SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey",
]
ENGINES = [("own", None), ("portable", {"keyed_hash": "portable"}), ("caller", "connection")]


def _spy(s: dpsql.Session, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[Any]]:
    """Every salt the session draws and every bounded query its backend is asked to run."""
    salts: list[str] = []
    ran: list[Any] = []
    draw = s._noise.salt

    def salt() -> str:
        salts.append(draw())
        return salts[-1]

    fetch = s._engine.fetch_arrow

    def fetch_arrow(ast: Any, **kw: Any) -> Any:
        ran.append(ast if isinstance(ast, SaltedRead) else render(ast))
        return fetch(ast, **kw)

    monkeypatch.setattr(s._noise, "salt", salt)
    monkeypatch.setattr(s._engine, "fetch_arrow", fetch_arrow)
    return salts, ran


@pytest.mark.parametrize("engine", [e for e, _ in ENGINES])
@pytest.mark.parametrize("sql", QUERIES)
def test_a_repeated_query_runs_the_text_its_tree_renders_to_under_its_own_salt(
        sql: str, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = dict(ENGINES)[engine]
    s = _session(None if settings == "connection" else settings,
                 duckdb.connect() if settings == "connection" else None)
    salts, ran = _spy(s, monkeypatch)
    r = s._route(sql, 1.0, 1e-5, None)
    for _ in range(3):  # the first built, then two prepared reads under two salts
        s.query(sql, epsilon=1.0, delta=1e-5)
    assert len(salts) == 3 and len(set(salts)) == 3
    assert not isinstance(ran[0], SaltedRead)  # the first query is built as before
    prepared = [x for x in ran[1:] if isinstance(x, SaltedRead)]
    assert len(prepared) == 2, "a repeated query is prepared"
    for salt, read in zip(salts[1:], ran[1:], strict=True):
        assert not any(other in read.sql for other in salts if other != salt)
        assert salt in read.sql or sql not in QUERIES[:3]  # the group cap and the key choice are keyed by it
        built = r.mechanism.bounded(r.calibration, salt, s._engine.ops)
        assert read.sql == render(built)  # exactly what building it under this query's salt gives
        assert read.off == tuple(DuckDBBackend._marked_off(built))


def test_re_registering_a_table_prepares_its_queries_again(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _session()
    _, ran = _spy(s, monkeypatch)
    sql = "SELECT country, SUM(likes) AS s FROM events GROUP BY country"
    for _ in range(2):
        s.query(sql, epsilon=1.0, delta=1e-5)
    assert isinstance(ran[-1], SaltedRead) and "<= 3" in ran[-1].sql
    s.register("events", _events(), privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=1,
               columns={"country": {"domain": COUNTRIES}, "likes": {"bounds": [0, 10]}})
    for _ in range(2):
        s.query(sql, epsilon=1.0, delta=1e-5)
    assert not isinstance(ran[2], SaltedRead) and isinstance(ran[3], SaltedRead)
    assert "<= 2" in ran[3].sql and "<= 3" not in ran[3].sql


def test_a_query_with_a_read_salt_is_built_for_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long IN list compares digests under a read salt drawn for each read (``with_read_salt``): never prepared."""
    s = _session()
    _, ran = _spy(s, monkeypatch)
    sql = "SELECT COUNT(*) AS n FROM events WHERE url IN ('u1', 'u2', 'u3', 'u4', 'u5', 'u6', 'u7')"
    for _ in range(3):
        s.query(sql, epsilon=1.0, delta=1e-5)
    assert not any(isinstance(x, SaltedRead) for x in ran)
    assert all(READ_SALT in x for x in ran)  # the tree, its read salt put in by the read itself


def _build(salt: str, extra: str = "") -> exp.Expression:
    return exp.select(exp.func("hash", exp.Literal.string(salt + extra)).as_("h")).from_("t")


def _prepare(b: DuckDBBackend, build: Any) -> PreparedRead | None:
    """The preparation made with a query of a fresh salt; what that query runs is its own build's text."""
    salt = secrets.token_hex(16)
    made, own = b.prepare_bounded(build, salt)
    assert own is None or isinstance(own, (SaltedRead, exp.Expression))
    return made


def test_prepare_keeps_only_a_text_the_salt_enters_verbatim() -> None:
    """The negative controls: a build that varies otherwise than by its salt, or that transforms the salt, or
    that has none, is not prepared; the plain one is."""
    b = DuckDBBackend()
    ok = _prepare(b, _build)
    assert isinstance(ok, PreparedRead)
    fresh = secrets.token_hex(16)
    assert ok.salted(fresh).sql == render(_build(fresh))
    assert _prepare(b, lambda salt: _build(salt, secrets.token_hex(4))) is None  # varies by more
    assert _prepare(b, lambda salt: _build(salt[::-1])) is None  # the salt transformed
    assert _prepare(b, lambda salt: _build(salt[:8])) is None  # part of the salt only
    assert _prepare(b, lambda salt: _build(salt, salt)) is not None  # the salt twice, verbatim
    fixed = _prepare(b, lambda salt: _build("fixed"))  # no salt at all: the same text for every salt
    assert fixed is not None and fixed.salted(fresh).sql == render(_build("fixed"))
    assert _prepare(b, lambda salt: None) is None  # no private read
    marked = exp.Literal.string("x")
    marked.meta[READ_SALT] = True
    assert _prepare(b, lambda salt: _build(salt).where(exp.EQ(this=exp.column("c"), expression=marked))) is None
    b.close()


def _built(s: dpsql.Session, sql: str, salt: str) -> str:
    r = s._route(sql, 1.0, 1e-5, None)
    return render(r.mechanism.bounded(r.calibration, salt, s._engine.ops))


def test_a_preparation_is_not_run_under_other_building_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dpsql.testing.use_noise`` gives the engine other building blocks (every choice from the salt, no
    ``RANDOM()``): a query prepared before is built again under them, so a seed fixes the release."""
    from dpsql.testing import use_noise, zero_noise

    sql = "SELECT country, SUM(likes) AS s FROM events GROUP BY country"
    s = _session()
    for _ in range(2):
        s.query(sql, epsilon=1.0, delta=1e-5)
    use_noise(s, zero_noise(1))
    salts, ran = _spy(s, monkeypatch)
    got = [s.query(sql, epsilon=1.0, delta=1e-5).table for _ in range(2)]
    for salt, read in zip(salts, ran, strict=True):
        assert (read.sql if isinstance(read, SaltedRead) else read) == _built(s, sql, salt)
    fresh = _session()  # the negative control: seeded from its start
    use_noise(fresh, zero_noise(1))
    assert got[0].sort_by("country").equals(fresh.query(sql, epsilon=1.0, delta=1e-5).table.sort_by("country"))


def test_a_salt_unlike_the_stand_in_gets_the_query_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The portable keyed hash reads the salt's length: a salt of another length (or alphabet) than the stand-in
    the text was prepared under is not put into it; the query is built under it."""
    from dpsql.noise import NoiseSource
    from dpsql.testing import use_noise

    class LongSalts(NoiseSource):
        def salt(self) -> str:
            return secrets.token_hex(32)

    sql = "SELECT country, COUNT(*) AS n FROM events GROUP BY country"
    s = _session({"keyed_hash": "portable"})
    use_noise(s, LongSalts())
    salts, ran = _spy(s, monkeypatch)
    for _ in range(3):
        s.query(sql, epsilon=1.0, delta=1e-5)
    for salt, read in zip(salts, ran, strict=True):
        assert (read.sql if isinstance(read, SaltedRead) else read) == _built(s, sql, salt)
    assert f"{len(salts[-1])}:{salts[-1]}" in ran[-1]  # the control: the salt's length is in the text


def test_a_preparation_read_once_while_another_first_check_ends() -> None:
    """Another thread's first bind check of the same query may end between two reads of the entry: the
    preparation is read once (no failure before the charge), and a first check never drops a preparation."""
    from dpsql.engine import bounded_under

    class Racing(dict[Any, Any]):
        def __getitem__(self, k: Any) -> Any:
            v = super().__getitem__(k)
            if isinstance(v, PreparedRead):
                super().__setitem__(k, None)  # the other thread's first check ends: its pass is remembered
            return v

    s = _session()
    sql = "SELECT country, COUNT(*) AS n FROM events GROUP BY country"
    r = s._route(sql, 1.0, 1e-5, None)
    checked = Racing({"k": None})
    salt = secrets.token_hex(16)
    read = bounded_under(s._engine, r, salt, "k", checked)
    assert isinstance(read, SaltedRead) and read.sql == _built(s, sql, salt)

    s.query(sql, epsilon=1.0, delta=1e-5)  # a first check: remembered
    key = next(iter(s._bound_ok))
    s.query(sql, epsilon=1.0, delta=1e-5)  # prepared
    prepared = s._bound_ok[key]
    assert isinstance(prepared, PreparedRead)
    del s._bound_ok[key]
    describe = dpsql.engine.describe_bounded

    def late_first_check(*a: Any) -> Any:  # the preparation is made while this first check runs
        s._bound_ok[key] = prepared
        return describe(*a)

    import dpsql.session as session_module

    orig = session_module.backends.describe_bounded
    session_module.backends.describe_bounded = late_first_check  # type: ignore[attr-defined]
    try:
        s.query(sql, epsilon=1.0, delta=1e-5)
    finally:
        session_module.backends.describe_bounded = orig  # type: ignore[attr-defined]
    assert s._bound_ok[key] is prepared
