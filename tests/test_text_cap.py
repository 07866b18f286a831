"""``max_text_bytes`` (the bound on per-row text cost, threat model "Timing") applies to every
text and BLOB value of every source kind, at any depth: top-level VARCHAR, text inside lists,
structs and maps, BLOB values and DuckDB JSON columns. A value over the cap reads as NULL.
The registered view is inspected directly (list elements and BLOB lengths are off the
analyst's allow-list); the control without a cap shows the long values are there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql import Budget
from dpsql.testing import use_noise, zero_noise

CAP = 10
BIG = "x" * 1000
N = 20


def table() -> pa.Table:
    return pa.table({
        "uid": pa.array(range(N), pa.int64()),
        "s": pa.array(["a"] * (N - 1) + [BIG]),
        "tags": pa.array([["a"]] * (N - 1) + [[BIG]]),
        "b": pa.array([b"a"] * (N - 1) + [BIG.encode()], pa.binary()),
        "st": pa.array([{"label": "a", "k": 1}] * (N - 1) + [{"label": BIG, "k": 2}]),
        "nested": pa.array([[{"t": ["a"]}]] * (N - 1) + [[{"t": ["a", BIG]}]]),
    })


def over(source: Any, expr: str, connection: Any = None, cap: int | None = CAP, **engine: Any) -> int:
    """How many rows of the registered view have ``expr`` (a length) over CAP."""
    return over_each(source, [expr], connection, cap, **engine)[0]


def over_each(source: Any, exprs: list[str], connection: Any = None, cap: int | None = CAP, **engine: Any) -> list[int]:
    """How many rows of the registered view have each of ``exprs`` (a length) over CAP, in one session."""
    s = dpsql.Session(budget=Budget(10.0, 1e-3), engine={"max_text_bytes": cap, **engine}, connection=connection)
    use_noise(s, zero_noise())
    s.register("t", source, privacy_unit="uid")
    view = s.tables["t"].view
    n = [int(s._engine.connection.execute(f'SELECT COUNT(*) FROM "{view}" WHERE {e} > {CAP}').fetchall()[0][0])
         for e in exprs]
    # an analyst's query over the same source runs and is charged as usual
    s.query("SELECT COUNT(*) FROM t WHERE s IS NOT NULL AND tags IS NOT NULL", epsilon=1.0)
    s.close()
    return n


def sources(tmp_path: Path) -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    p = tmp_path / "t.parquet"
    pq.write_table(table(), p)
    con = duckdb.connect()
    con.register("src", table())
    con.execute("CREATE TABLE dt AS SELECT * FROM src")
    con.unregister("src")
    return {
        "arrow": (table(), None, {}),
        "parquet": (str(p), None, {}),
        "parquet_replace": (str(p), None, {"invalid_text": "replace"}),
        "duckdb": ("dt", con, {}),
    }


KINDS = ["arrow", "parquet", "parquet_replace", "duckdb"]
EXPRS = {
    "top-level text": "strlen(s)",
    "text in a list": "strlen(tags[1])",
    "blob": "octet_length(b)",
    "text in a struct": "strlen(st.label)",
    "text in a list of structs of lists": "strlen(nested[1].t[2])",
}


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One capped session of each source kind for the test below (its sources never change), made when first asked
    for, with an analyst's query over it run and charged as usual."""
    made: dict[str, dpsql.Session] = {}
    srcs = sources(tmp_path_factory.mktemp("capped"))

    def get(kind: str) -> dpsql.Session:
        if kind not in made:
            src, con, eng = srcs[kind]
            s = dpsql.Session(budget=Budget(10.0, 1e-3), engine={"max_text_bytes": CAP, **eng}, connection=con)
            use_noise(s, zero_noise())
            s.register("t", src, privacy_unit="uid")
            s.query("SELECT COUNT(*) FROM t WHERE s IS NOT NULL AND tags IS NOT NULL", epsilon=1.0)
            made[kind] = s
        return made[kind]

    yield get
    for s in made.values():
        s.close()


@pytest.mark.parametrize("what", sorted(EXPRS))
@pytest.mark.parametrize("kind", KINDS)
def test_text_and_blob_over_the_cap_are_null(capped: Any, kind: str, what: str) -> None:
    s = capped(kind)
    n = s._engine.connection.execute(f'SELECT COUNT(*) FROM "{s.tables["t"].view}" WHERE {EXPRS[what]} > {CAP}').fetchall()
    assert n[0][0] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_control_without_a_cap_the_long_value_is_read(tmp_path: Path, kind: str) -> None:
    """Each long value of the test above (every kind of place, one session per source kind) is read without a cap."""
    src, con, eng = sources(tmp_path)[kind]
    assert dict(zip(sorted(EXPRS), over_each(src, [EXPRS[w] for w in sorted(EXPRS)], con, cap=None, **eng),
                    strict=True)) == dict.fromkeys(sorted(EXPRS), 1)


def test_short_values_and_nulls_are_unchanged(tmp_path: Path) -> None:
    src, con, eng = sources(tmp_path)["arrow"]
    s = dpsql.Session(budget=Budget(10.0, 1e-3), engine={"max_text_bytes": CAP})
    s.register("t", src, privacy_unit="uid")
    rows = s._engine.connection.execute(
        f'SELECT s, tags, b, st, nested FROM "{s.tables["t"].view}" ORDER BY uid').fetchall()
    assert rows[0] == ("a", ["a"], b"a", {"label": "a", "k": 1}, [{"t": ["a"]}])
    assert rows[-1] == (None, [None], None, {"label": None, "k": 2}, [{"t": ["a", None]}])


def test_duckdb_json_column_is_capped() -> None:
    """A JSON column of a caller's DuckDB table is text (DESCRIBE says JSON, not VARCHAR)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE dt (uid BIGINT, j JSON, s VARCHAR, tags VARCHAR[])")
    con.execute(f"INSERT INTO dt SELECT i, CASE WHEN i = 0 THEN to_json(repeat('x', 1000)) ELSE to_json('a') END, 'a', ['a'] "
                f"FROM range({N}) r(i)")
    assert over("dt", "strlen(CAST(j AS VARCHAR))", con) == 0
    assert over("dt", "strlen(CAST(j AS VARCHAR))", con, cap=None) == 1  # the control


def test_duckdb_map_values_capped_and_long_keys_null_the_map() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE dt (uid BIGINT, s VARCHAR, tags VARCHAR[], m MAP(VARCHAR, VARCHAR), k MAP(VARCHAR, INTEGER))")
    con.execute(f"INSERT INTO dt VALUES (1, 'a', ['a'], MAP {{'a': '{BIG}', 'b': 'c'}}, MAP {{'{BIG}': 1}}), "
                "(2, 'a', ['a'], MAP {'a': 'b'}, MAP {'a': 1}), (3, 'a', ['a'], MAP {}, MAP {})")
    s = dpsql.Session(budget=Budget(10.0, 1e-3), engine={"max_text_bytes": CAP}, connection=con)
    s.register("t", "dt", privacy_unit="uid")
    rows = s._engine.connection.execute(f'SELECT m, k FROM "{s.tables["t"].view}" ORDER BY uid').fetchall()
    assert rows == [({"a": None, "b": "c"}, None), ({"a": "b"}, {"a": 1}), ({}, {})]
