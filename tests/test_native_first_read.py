"""The text check on a process's first private read of a Parquet file (dpsql/engine/_duckdb_native.py).

The check finds the cells that are not UTF-8 with Arrow's validation of each batch's dictionary
(or values), then reads the file with DuckDB's own reader, those cells NULL. It must flag
exactly the cells DuckDB's ``TRY(DECODE(...))`` (the Arrow view's reading) makes NULL, in every
layout of the file, so that a person's invalid cell changes neither whether a query fails nor
any value but that cell's; and no failure around it may carry a cell."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlglot import exp, parse_one

import dpsql
from dpsql.engine import _duckdb_native as native
from dpsql.errors import ExecutionError

SPECIAL = [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xef\xbf\xbf", b"\xef\xbf\xbe", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80",
           b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xf5\x80\x80\x80", b"\x00", b"\xe2\x82\xac",
           b"\xf0\x9f\x98\x80", b"\xc3\xa9", b"\xc3", b"\xe2\x82", b"\xff", b"\x80"]


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)


def _cells(bad: Any) -> dict[str, list[tuple[int, int]]]:
    """The checked columns' invalid cells (arrays of (file, row) rows) as lists of tuples."""
    return {c: [(int(f), int(r)) for f, r in v] for c, v in bad.items()}


def _fuzz(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 6)):
            r = rng.random()
            parts.append(rng.choice(SPECIAL) if r < 0.3 else bytes([rng.randrange(256)]) if r < 0.6 else b"ab")
        out.append(b"".join(parts))
    return out


def _duck_invalid(values: list[bytes | None]) -> set[int]:
    con = duckdb.connect()
    con.register("r", pa.table({"i": list(range(len(values))), "s": pa.array(values, pa.binary())}))
    return {i for (i,) in con.sql("SELECT i FROM r WHERE s IS NOT NULL AND TRY(DECODE(s)) IS NULL").fetchall()}


def _text(values: list[bytes | None], large: bool = False) -> pa.Array:
    raw = pa.array(values, pa.large_binary() if large else pa.binary())
    return pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(raw), raw.buffers(),
                                 null_count=raw.null_count)


@pytest.mark.parametrize("step", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("large", [False, True])
def test_the_vectorised_mask_flags_exactly_duckdbs_decode_failures(step: int, large: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``invalid_mask`` (numpy passes over the non-ASCII bytes, in steps of ``_MASK_BYTES``; a longer value
    validated alone) flags exactly the values DuckDB's TRY(DECODE(...)) rejects, over a slice of an array (its
    offsets not starting at 0), NULLs included, as text and as bytes."""
    monkeypatch.setattr(native, "_MASK_BYTES", step)
    rng = random.Random(21)
    values: list[bytes | None] = [None if rng.random() < 0.05 else v * rng.randint(1, 3) for v in _fuzz(6000, seed=22)]
    duck = _duck_invalid(values[37:])
    assert 0 < len(duck) < len(values) - 37  # both kinds (the control)
    for arr in (_text(values, large), pa.array(values, pa.large_binary() if large else pa.binary())):
        mask = native.invalid_mask(arr.slice(37))
        assert set(np.flatnonzero(mask).tolist()) == duck


def test_arrows_validation_flags_exactly_duckdbs_decode_failures() -> None:
    """The check's test (Arrow's UTF-8 validation, value by value and by halving a whole array)
    is DuckDB's TRY(DECODE(...)): a value Arrow accepts and DuckDB rejects would be read by the
    native view as replaced text where the Arrow view reads NULL."""
    values = _fuzz(20_000, seed=11)
    duck = _duck_invalid(list(values))
    one = {i for i, v in enumerate(values) if not native._valid(_text([v]))}
    assert one == duck and 0 < len(duck) < len(values)  # both kinds present (the control)
    rng = random.Random(12)
    mostly_valid: list[bytes | None] = [v if rng.random() < 0.02 else b"ok" + bytes([65 + i % 26]) for i, v in
                                        enumerate(values)]
    mostly_valid[5] = None
    assert np.flatnonzero(native.invalid_mask(_text(mostly_valid))).tolist() == sorted(_duck_invalid(mostly_valid))


def _write(path: Path, notes: list[bytes | None], **kw: Any) -> None:
    large = kw.pop("large", False)
    pq.write_table(pa.table({"user_id": list(range(len(notes))), "note": _text(notes, large),
                             "likes": [i % 4 for i in range(len(notes))]}), path, **kw)


def _session(path: Path) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", str(path), privacy_unit="user_id", columns={"likes": {"bounds": [0, 3]}})
    return s


def _src(s: dpsql.Session) -> native.NativeSource:
    (src,) = s._engine._native.values()
    return src


def _rows(s: dpsql.Session) -> list[dict[str, Any]]:
    ast = exp.select("*").from_(exp.to_table(_src(s).view, quoted=True)).order_by("user_id")
    return s._engine.fetch_arrow(ast).to_pylist()


def _arrow_rows(s: dpsql.Session) -> list[dict[str, Any]]:
    sel = _src(s).arrow_select.copy().order_by("user_id")
    return s._engine.connection.sql(s._engine.render(sel)).to_arrow_table().to_pylist()


@pytest.mark.parametrize("layout", [
    {"row_group_size": 3000},  # dictionary pages, several row groups and batches
    {"row_group_size": 20_000, "use_dictionary": False},  # plain pages
    {"row_group_size": 2500, "large": True},  # 64-bit offsets
    {"row_group_size": 20_000, "dictionary_pagesize_limit": 256},  # dictionary falling back to plain pages
])
def test_the_first_read_finds_every_invalid_cell_in_every_layout(tmp_path: Path, layout: dict[str, Any]) -> None:
    values = _fuzz(10_000, seed=3)
    rng = random.Random(4)
    notes: list[bytes | None] = [v if rng.random() < 0.01 else f"n{i % 40}".encode() for i, v in enumerate(values)]
    notes[7] = None
    path = tmp_path / "t.parquet"
    _write(path, notes, **layout)
    s = _session(path)
    rows = _rows(s)  # the first private read
    src = _src(s)
    assert src.checked is not None and not src.disabled  # read natively from the first read on
    assert _cells(src.bad)["note"] == [(0, i) for i in sorted(_duck_invalid(notes))] and len(src.bad["note"])
    assert rows == _arrow_rows(s)


def test_small_batches_repeat_the_dictionary_and_find_the_same_cells(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    notes: list[bytes | None] = [f"n{i % 30}".encode() for i in range(20_000)]
    for i in (0, 4095, 4096, 12_345, 19_999):
        notes[i] = b"x\xff" + bytes([i % 7])
    path = tmp_path / "t.parquet"
    _write(path, notes, row_group_size=20_000)
    monkeypatch.setattr(native, "_BATCH", 4096)  # five batches over one row group and its dictionary
    s = _session(path)
    _rows(s)
    assert _cells(_src(s).bad)["note"] == [(0, 0), (0, 4095), (0, 4096), (0, 12_345), (0, 19_999)]


def test_one_invalid_cell_costs_one_validation_and_one_mask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's extra work for a person's invalid cell is one validation of each step of that batch's values
    and numpy passes over the step that holds it (:func:`invalid_mask`, after the one validation of the whole
    batch that every batch has), and one pass over that batch's indices, not a second read of the file nor a
    search per value."""
    n = 5000
    counts = []
    for bad in (False, True):
        notes: list[bytes | None] = [f"v{i}".encode() for i in range(n)]
        if bad:
            notes[1234] = b"\xfe"
        path = tmp_path / f"{bad}.parquet"
        _write(path, notes)
        calls = {"valid": 0, "mask": 0}
        real, real_mask = native._valid, native.invalid_mask

        def counting(values: pa.Array, real: Any = real, calls: dict[str, int] = calls) -> bool:
            calls["valid"] += 1
            return bool(real(values))

        def masking(values: pa.Array, real: Any = real_mask, calls: dict[str, int] = calls) -> Any:
            calls["mask"] += 1
            return real(values)

        monkeypatch.setattr(native, "_valid", counting)
        monkeypatch.setattr(native, "invalid_mask", masking)
        s = _session(path)
        _rows(s)
        monkeypatch.setattr(native, "_valid", real)
        monkeypatch.setattr(native, "invalid_mask", real_mask)
        counts.append(calls)
        assert _cells(_src(s).bad)["note"] == ([(0, 1234)] if bad else [])
    assert counts == [{"valid": 1, "mask": 0}, {"valid": 2, "mask": 1}]  # the batch, then its one step of values


def test_neighbouring_files_first_query_same_outcome_and_plan(tmp_path: Path) -> None:
    """D and D + one person whose text is invalid, each the first query of a new Session: both
    succeed with the same mechanism and columns, read by the same plan (the marks joined, empty
    or not)."""
    base: list[bytes | None] = [f"n{i % 5}".encode() for i in range(40)]
    d, d2 = tmp_path / "d.parquet", tmp_path / "d2.parquet"
    _write(d, base)
    _write(d2, [*base, b"\xc3("])
    queries = ["SELECT note, COUNT(*) AS n FROM t GROUP BY note",
               "SELECT COUNT(*) AS n FROM t WHERE upper(note) LIKE 'N%'",
               "SELECT SUM(likes) AS s FROM t WHERE length(note) >= 2"]
    for q in queries:
        outcomes, plans = [], []
        for p in (d, d2):
            s = _session(p)
            rel = s.query(q, epsilon=1.0, delta=1e-6)  # the process's first private read of the file
            src = _src(s)
            assert src.checked is not None
            sql = s._engine.connection.sql(
                f"SELECT sql FROM duckdb_views() WHERE view_name = '{src.view}'").fetchall()[0][0]
            plans.append(sql.replace(src.view, "V").replace(str(p), "P"))
            outcomes.append((rel.mechanism, rel.table.column_names))
            s.close()
        assert outcomes[0] == outcomes[1] and plans[0] == plans[1] and "LEFT JOIN" in plans[0].upper()


def test_a_check_that_cannot_read_keeps_the_arrow_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notes: list[bytes | None] = [b"ok", b"\xff", b"fine"]
    path = tmp_path / "t.parquet"
    _write(path, notes)

    def failing(src: native.NativeSource, threads: int = 1, columns: Any = None) -> None:
        raise pa.ArrowInvalid("cannot read value 'secret-cell-\\xff'")

    monkeypatch.setattr(native, "invalid_cells", failing)
    s = _session(path)
    rows = _rows(s)
    assert _src(s).disabled and _src(s).checked is None  # the Arrow view, the same values
    assert [r["note"] for r in rows] == ["ok", None, "fine"]


def test_a_failure_inside_the_check_is_the_generic_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.parquet"
    _write(path, [b"ok", b"secret-\xff"])

    def failing(src: native.NativeSource, threads: int = 1, columns: Any = None) -> None:
        raise MemoryError("secret-cell")

    monkeypatch.setattr(native, "invalid_cells", failing)
    s = _session(path)
    with pytest.raises(ExecutionError) as ei:
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    text = f"{ei.value} {ei.value.hint}"
    assert "secret" not in text and "MemoryError" not in text
    seen: BaseException | None = ei.value
    while seen is not None:  # nothing in the chain carries the cell or the original exception
        assert "secret" not in repr(seen) and not isinstance(seen, MemoryError)
        seen = seen.__cause__ or seen.__context__


def test_the_threads_share_row_groups_and_find_the_same_cells(tmp_path: Path) -> None:
    values = _fuzz(6000, seed=5)
    rng = random.Random(6)
    for k in range(2):
        notes: list[bytes | None] = [v if rng.random() < 0.02 else b"ok" for v in values]
        _write(tmp_path / f"{k}.parquet", notes, row_group_size=700)
    paths = sorted(str(p) for p in tmp_path.glob("*.parquet"))
    src = native.NativeSource("t", "v", paths, pq.ParquetFile(paths[0]).schema_arrow, exp.select("*"))
    one = native.invalid_cells(src, 1)
    assert one is not None and len(one["note"]) > 50
    assert _cells(native.invalid_cells(src, 2)) == _cells(native.invalid_cells(src, 3)) == _cells(one)
    expected = [(i, r) for i, p in enumerate(paths)
                for r in sorted(_duck_invalid(pq.read_table(p).column("note").cast(pa.binary()).to_pylist()))]
    assert _cells(one)["note"] == expected


def _two_text(path: Path, bad_country: int, bad_url: int, n: int = 200) -> None:
    countries: list[bytes | None] = [f"c{i % 3}".encode() for i in range(n)]
    urls: list[bytes | None] = [f"u{i % 17}".encode() for i in range(n)]
    countries[bad_country] = b"c\xff"
    urls[bad_url] = b"\xc3("
    pq.write_table(pa.table({"user_id": [i % 50 for i in range(n)], "country": _text(countries),
                             "url": _text(urls), "likes": [i % 4 for i in range(n)]}), path, row_group_size=64)


def _columns(s: dpsql.Session, cols: str) -> list[dict[str, Any]]:
    ast = parse_one(f'SELECT {cols} FROM "{_src(s).view}" ORDER BY user_id, likes, {cols}', read="duckdb")
    return s._engine.fetch_arrow(ast).to_pylist()


def _arrow_columns(s: dpsql.Session, cols: str) -> list[dict[str, Any]]:
    sel = _src(s).arrow_select.copy().subquery("a")
    ast = parse_one(f"SELECT {cols} FROM a ORDER BY user_id, likes, {cols}", read="duckdb")
    return s._engine.connection.sql(s._engine.render(ast.from_(sel, copy=False))).to_arrow_table().to_pylist()


def test_a_query_checks_only_the_text_columns_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query that reads ``country`` checks (and reads for the check) ``country`` only; a later
    query that reads ``url`` checks ``url`` only, once; the values read are the Arrow view's."""
    path = tmp_path / "t.parquet"
    _two_text(path, bad_country=5, bad_url=77)
    calls: list[list[str] | None] = []
    scanned: list[list[str]] = []
    real_cells, real_in = native.invalid_cells, native._invalid_in

    def cells(src: native.NativeSource, threads: int = 1, columns: list[str] | None = None) -> Any:
        calls.append(columns)
        return real_cells(src, threads, columns)

    def scan(part: Any, cols: list[str]) -> Any:
        scanned.append(list(cols))
        return real_in(part, cols)

    monkeypatch.setattr(native, "invalid_cells", cells)
    monkeypatch.setattr(native, "_invalid_in", scan)
    s = _session(path)
    s.query("SELECT country, COUNT(*) AS n FROM t GROUP BY country", epsilon=1.0, delta=1e-6)
    src = _src(s)
    assert calls == [["country"]] and scanned and all(c == ["country"] for c in scanned)
    assert src.checked is not None and src.columns == {"country"} and _cells(src.bad) == {"country": [(0, 5)]}
    assert _columns(s, "user_id, likes, country") == _arrow_columns(s, "user_id, likes, country")
    assert calls == [["country"]]  # already checked: no second check
    scanned.clear()
    s.query("SELECT url, COUNT(*) AS n FROM t GROUP BY url", epsilon=1.0, delta=1e-6)
    assert calls == [["country"], ["url"]] and scanned and all(c == ["url"] for c in scanned)
    assert src.columns == {"country", "url"} and _cells(src.bad) == {"country": [(0, 5)], "url": [(0, 77)]}
    s.query("SELECT country, COUNT(*) AS n FROM t GROUP BY country", epsilon=1.0, delta=1e-6)
    assert _columns(s, "user_id, likes, url, country") == _arrow_columns(s, "user_id, likes, url, country")
    assert len(calls) == 2
    s.query("SELECT SUM(likes) AS s FROM t", epsilon=1.0, delta=1e-6)  # no text column
    assert len(calls) == 2
    # a new version of the file: checked again, the columns a query names only
    tmp = tmp_path / "new.parquet"
    _two_text(tmp, bad_country=9, bad_url=11, n=150)
    os.replace(tmp, path)
    s.query("SELECT url, COUNT(*) AS n FROM t GROUP BY url", epsilon=1.0, delta=1e-6)
    assert calls[2:] == [["url"]] and src.columns == {"url"} and _cells(src.bad) == {"url": [(0, 11)]}
    fresh = _session(path)  # (the Arrow dataset of ``s`` still holds the old footer)
    assert _columns(s, "user_id, likes, url") == _arrow_columns(fresh, "user_id, likes, url")


def test_a_query_of_no_text_column_checks_the_schemas_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.parquet"
    _two_text(path, bad_country=5, bad_url=77)
    scanned: list[Any] = []
    monkeypatch.setattr(native, "_invalid_in", lambda part, cols: scanned.append(cols) or [])
    s = _session(path)
    s.query("SELECT SUM(likes) AS s FROM t", epsilon=1.0, delta=1e-6)
    src = _src(s)
    assert scanned == [] and src.checked is not None and src.columns == frozenset() and _cells(src.bad) == {}
    sql = s._engine.connection.sql(f"SELECT sql FROM duckdb_views() WHERE view_name = '{src.view}'").fetchall()[0][0]
    assert "JOIN" not in sql.upper()  # nothing to mark: no join


@pytest.mark.parametrize(("query", "read"), [
    ('SELECT url, COUNT(*) FROM "v" GROUP BY url', ["url"]),
    ('SELECT COUNT(*) FROM "v" WHERE likes > 1', []),
    ('SELECT COUNT(*) FROM "v" AS t JOIN o ON t.user_id = o.country', ["country"]),
    ('SELECT COUNT(DISTINCT "URL") FROM "v"', ["url"]),
    ('SELECT * FROM "v"', None),
    ('SELECT t.* FROM "v" AS t', None),
    ('SELECT COUNT(*) FROM (SELECT * EXCLUDE (url) FROM "v")', None),
    ('SELECT hash(*) FROM "v"', None),
    ('SELECT t FROM "v" AS t', None),
    ('SELECT COUNT(v) FROM "v"', None),
    ("SELECT max(COLUMNS('u.*')) FROM \"v\"", None),
    ('SELECT COUNT(*) FROM "v" NATURAL JOIN o', None),
    ('SELECT COUNT(*) FROM (PIVOT "v" ON likes USING COUNT(user_id))', None),
    ('SELECT COUNT(*) FROM "v", query(\'SELECT url FROM "v"\')', None),
    ('SELECT COUNT(*) FROM query(\'SELECT url FROM "v"\')', None),
    ('SELECT * FROM (SELECT url FROM "v") AS s', ["url"]),
    ('SELECT *, HASH(a) FROM (SELECT url AS a FROM "v") AS s JOIN (SELECT likes FROM "v") AS w ON TRUE', ["url"]),
    ('SELECT * FROM (SELECT * FROM "v") AS s', None),
    ('SELECT * FROM (SELECT url FROM "v") AS s JOIN "v" ON TRUE', None),
    ('SELECT * FROM (SELECT url FROM "v") AS s, "v"', None),
    ('WITH c AS (SELECT url FROM "v") SELECT * FROM c', None),
    # a qualified star reads the columns of its own source only: a subquery's, or every column of a table
    ('SELECT s.* FROM (SELECT url FROM "v") AS s JOIN "v" AS t ON TRUE', ["url"]),
    ('SELECT t.* FROM (SELECT url FROM "v") AS s JOIN "v" AS t ON TRUE', None),
    ('SELECT s.*, t.likes FROM (SELECT url FROM "v") AS s JOIN (SELECT likes FROM "v") AS t ON TRUE', ["url"]),
    ('SELECT hash(s.*) FROM (SELECT url FROM "v") AS s', None),
])
def test_the_columns_a_query_may_read(query: str, read: list[str] | None) -> None:
    """Which text columns a query may read, from its text: every column unless it can only read
    columns by their names (the negative controls name some of them)."""
    src = native.NativeSource("t", "v", [], pa.schema([("user_id", pa.int64()), ("country", pa.string()),
                                                      ("url", pa.string()), ("likes", pa.int64())]), exp.select("*"))
    got = native.reads_of(parse_one(query, read="duckdb")).text_columns(src)
    assert got == (["country", "url"] if read is None else read)


class _Interrupting:
    """The engine's connection, whose statements raise DuckDB's interrupt from the first one that
    ``hit`` matches until :meth:`stop` (the statement time-out interrupts every 10 ms until the read
    ends); ``once`` interrupts that one statement only."""

    def __init__(self, con: duckdb.DuckDBPyConnection, hit: Any, once: bool = False) -> None:
        self._con, self._hit, self._once, self.fired, self.on = con, hit, once, 0, True

    def stop(self) -> None:
        self.on = False

    def _maybe(self, kind: str, text: str) -> None:
        if self.on and (self.fired and not self._once or not self.fired and self._hit(kind, text)):
            self.fired += 1
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    def execute(self, sql: str, *args: Any) -> Any:
        self._maybe("execute", sql)
        return self._con.execute(sql, *args)

    def sql(self, sql: str, *args: Any) -> Any:
        self._maybe("sql", sql)
        return self._con.sql(sql, *args)

    def register(self, name: str, obj: Any) -> Any:
        self._maybe("register", name)
        return self._con.register(name, obj)

    def unregister(self, name: str) -> Any:
        self._maybe("unregister", name)
        return self._con.unregister(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


_POINTS = {
    # the native view's rebuild (CREATE OR REPLACE VIEW ... JOIN the flags)
    "rebuild": lambda kind, text: kind == "execute" and "VIEW" in text.upper() and "_dpsql_bad" in text,
    # the binding of the new view's columns (DESCRIBE)
    "schema": lambda kind, text: kind == "sql" and text.upper().startswith("DESCRIBE"),
    # the flags table's registration
    "register": lambda kind, text: kind == "register",
}


@pytest.mark.parametrize("once", [False, True])
@pytest.mark.parametrize("point", sorted(_POINTS))
def test_an_interrupt_between_the_check_and_the_view_leaves_consistent_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, once: bool) -> None:
    """``url`` checked, then a read that names ``country`` is interrupted (its statement time-out)
    after the check, while the view is rebuilt: the next reads give the Arrow view's values. The
    old view must never join flags built for other columns (``url`` NULL where ``country`` is
    invalid and ``url``'s invalid cell read as replaced text), and an interrupt is not a reason to
    give up the native reader for good."""
    path = tmp_path / "t.parquet"
    _two_text(path, bad_country=5, bad_url=77)
    s = _session(path)
    src = _src(s)
    url, both = "user_id, likes, url", "user_id, likes, url, country"
    assert _columns(s, url) == _arrow_columns(s, url) and src.columns == {"url"}
    con = s._engine._con
    proxy = _Interrupting(con, _POINTS[point], once)
    monkeypatch.setattr(s._engine, "_con", proxy)
    try:
        rows = _columns(s, "user_id, likes, country")
    except ExecutionError:
        rows = None
    proxy.stop()
    assert proxy.fired
    if rows is not None:  # a statement of the rebuild only was interrupted, the read went on
        assert rows == _arrow_columns(s, "user_id, likes, country")
    monkeypatch.setattr(s._engine, "_con", con)
    assert _columns(s, url) == _arrow_columns(s, url)
    assert _columns(s, both) == _arrow_columns(s, both)
    assert not src.disabled and src.checked is not None and src.columns == {"url", "country"}
    assert _columns(s, url) == _arrow_columns(s, url)
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert len(views - {src.view, src.view + "_raw"}) == 1  # the view's flags only: none left behind


def test_a_check_that_outlasts_the_time_out_leaves_the_arrow_views_values(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The statement time-out's own timer, past while the check of ``country`` runs: whichever
    statement after the check it interrupts, the reads that follow give the Arrow view's values."""
    path = tmp_path / "t.parquet"
    _two_text(path, bad_country=5, bad_url=77)
    s = _session(path)
    engine = s._engine
    url, both = "user_id, likes, url", "user_id, likes, url, country"
    assert _columns(s, url) == _arrow_columns(s, url)
    real = native.invalid_cells

    def slow(src: native.NativeSource, threads: int = 1, columns: list[str] | None = None) -> Any:
        out = real(src, threads, columns)
        time.sleep(0.2)  # the timer interrupts every 10 ms from 0.05 s on
        return out

    for _ in range(5):
        monkeypatch.setattr(native, "invalid_cells", slow)
        monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, statement_timeout=0.05))
        try:
            _columns(s, "user_id, likes, country")
        except ExecutionError:
            pass
        monkeypatch.setattr(native, "invalid_cells", real)  # no time-out for the reads that follow
        monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, statement_timeout=None))
        assert _columns(s, url) == _arrow_columns(s, url)
        assert _src(s).columns in ({"url"}, {"url", "country"}) and not _src(s).disabled
        _src(s).columns = frozenset({"url"})  # (country checked again by the next round)
    assert _columns(s, both) == _arrow_columns(s, both)
