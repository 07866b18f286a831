"""The Spark engine caps nested values as the DuckDB engine does: a list or map whose size (its elements at every
depth plus the stored length of each text and binary value inside it) is over ``max_list_size`` reads as NULL, and a
text or binary value inside a struct, list or map (at any depth) over ``max_text_bytes`` reads as NULL (a map holding
such a key is NULL as a whole). Before, Spark read both whole: one person's list of millions of elements made
``COUNT(DISTINCT lst)`` slow exactly when that person was there.

The same small table (values at, just under and just over each cap, at several depths, NULLs, empty lists and maps)
is read through each engine's source view and compared value for value; the plans show the size is tested (from
``size`` and ``octet_length``) before the value is read; a map keyed by a type holding text is refused by both.

Skipped (with the reason) without pyspark/Java.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import require_spark

from dpsql.engine import EngineSettings
from dpsql.errors import ConfigError

require_spark()

#: max_text_bytes and max_list_size of the engines under test
T, L = 4, 12

S, I32, B = pa.string(), pa.int32(), pa.binary()
TYPES = {
    "li": pa.list_(I32),
    "ls": pa.list_(S),
    "lb": pa.list_(B),
    "lli": pa.list_(pa.list_(I32)),
    "lls": pa.list_(pa.list_(S)),
    "st": pa.struct([("a", S), ("l", pa.list_(S)), ("s", pa.struct([("b", B), ("ll", pa.list_(pa.list_(I32)))]))]),
    "lst": pa.list_(pa.struct([("t", S), ("l", pa.list_(S))])),
    "mp": pa.map_(S, S),
    "mpl": pa.map_(I32, pa.list_(S)),
    "lmp": pa.list_(pa.map_(S, I32)),
}


def _n(k: int) -> list[int]:
    return list(range(k))


#: per column, its values: the size (and the text lengths) at the caps, just under and just over them
VALUES: dict[str, list[Any]] = {
    "li": [_n(L - 1), _n(L), _n(L + 1), [], None, [None] * L, [None] * (L + 1)],
    # elements + bytes: 3 + 9 = 12 (at), 4 + 9 = 13 (over); 'abcd' at the text cap, 'abcde' over (NULL in a kept list)
    "ls": [["abc"] * 3, ["abc"] * 3 + [""], ["abcd", "ab"], ["abcde", "abcde"], ["abcde"] * 2 + ["a"], [None, "x"],
           ["éé", "€€"], [], None],
    "lb": [[b"abc"] * 3, [b"abc"] * 3 + [b""], [b"abcd"], [b"abcde", None], [b"\xff\x00\xfe"] * 3],
    # outer + inner elements: 1 + 11 = 12, 1 + 12 = 13; NULL inner lists count 0
    "lli": [[_n(L - 1)], [_n(L)], [[], None, [1]], [None] * L, [None] * (L + 1), [[1]] * 6, [[1]] * 6 + [[]], [], None],
    # outer + inner + bytes: 2 + 3 + 5 = 10; 2 + 4 + 6 = 12; 2 + 4 + 7 = 13
    "lls": [[["ab", "cd"], ["e"]], [["ab", "cd"], ["e", "f"]], [["ab", "cd"], ["ef", "g"]], [["abcde"]], [None, []],
            [[None] * 10], [[None] * 11], None],
    "st": [{"a": "abcd", "l": ["abc"] * 3, "s": {"b": b"abcd", "ll": [_n(L - 1)]}},
           {"a": "abcde", "l": ["abc"] * 3 + [""], "s": {"b": b"abcde", "ll": [_n(L)]}},
           {"a": None, "l": None, "s": None}, {"a": "", "l": [], "s": {"b": None, "ll": []}}, None,
           {"a": "x", "l": ["abcde"], "s": {"b": b"", "ll": [[], None]}}],
    # outer + per element (its list's elements + every text's bytes): 1 + 2 + 3 + 6 = 12; one byte more: 13
    "lst": [[{"t": "abc", "l": ["abc", "bcd"]}], [{"t": "abcd", "l": ["abc", "bcd"]}], [{"t": "abcde", "l": ["abcde"]}],
            [None, {"t": None, "l": None}], [{"t": "a", "l": []}] * 6, [{"t": "a", "l": []}] * 6 + [None], [], None],
    # entries + key bytes + value bytes: 2 + 4 + 6 = 12; a key over the text cap: the whole map NULL; a value over: NULL
    "mp": [[("ab", "abc"), ("cd", "abc")], [("ab", "abc"), ("cd", "abcd")], [("abcde", "a")], [("a", "abcde")],
           [("a", None)], [], None, [("abcd", "abcd"), ("", "")]],
    # entries + list elements + bytes: 1 + 3 + 8 = 12; 1 + 3 + 9 = 13
    "mpl": [[(1, ["abc", "abc", "ab"])], [(1, ["abc", "abc", "abc"])], [(1, ["abcde"]), (2, None)], [(1, [])], [], None],
    # outer + entries + key bytes: 2 + 2 + 8 = 12; one more entry: 14; a key over the cap: that map NULL
    "lmp": [[[("abcd", 1)], [("abcd", 2)]], [[("abcd", 1)], [("abcd", 2), ("", 3)]], [[("abcde", 1)], [("a", 2)]],
            [None, []], None],
}
ROWS = max(len(v) for v in VALUES.values())


def table() -> pa.Table:
    cols: dict[str, pa.Array] = {"uid": pa.array(range(ROWS), pa.int64())}
    for c, t in TYPES.items():
        vals = VALUES[c] + [None] * (ROWS - len(VALUES[c]))
        cols[c] = pa.array(vals, t)
    return pa.table(cols)


#: columns the DuckDB engine reads from Arrow (there a map is read as its entries, and one holding text is refused)
ARROW_COLUMNS = [c for c in TYPES if not c.startswith(("mp", "lmp"))]


def _duck(source: Any, kind: str, **settings: Any) -> Any:
    from dpsql.engine.duckdb import DuckDBBackend

    b = DuckDBBackend(None, EngineSettings(**{"max_text_bytes": T, "max_list_size": L, **settings}))
    b.register_source("t", kind, source, view="v")
    return b


def _duck_rows(b: Any, cols: list[str]) -> list[dict[str, Any]]:
    names = ", ".join(f'"{c}"' for c in cols)
    rows = b.connection.sql(f'SELECT {names} FROM "v" ORDER BY uid').to_arrow_table().to_pylist()
    assert isinstance(rows, list)
    return rows


def _spark_rows(b: Any, cols: list[str], view: str = "v") -> list[dict[str, Any]]:
    names = ", ".join(f"`{c}`" for c in cols)
    rows = b.spark.sql(f"SELECT {names} FROM `{view}` ORDER BY uid").toArrow().to_pylist()
    assert isinstance(rows, list)
    return rows


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from dpsql.engine.spark import SparkBackend

    path = tmp_path_factory.mktemp("caps") / "t.parquet"
    pq.write_table(table(), path)
    b = SparkBackend(None, EngineSettings(max_text_bytes=T, max_list_size=L))
    b.register_source("t", "arrow", table(), view="v")
    b.register_source("p", "parquet", str(path), view="p")
    b.path = path
    yield b
    b.close()


def test_nested_values_read_as_on_duckdbs_own_reader(spark: Any) -> None:
    duck = _duck(str(spark.path), "parquet", invalid_text="replace")  # DuckDB's Parquet reader: MAP columns as such
    try:
        want = _duck_rows(duck, [*TYPES])
    finally:
        duck.close()
    assert _spark_rows(spark, [*TYPES], "p") == want
    assert _spark_rows(spark, [*TYPES], "v") == want


def test_nested_values_read_as_on_duckdbs_arrow_view(spark: Any) -> None:
    duck = _duck(table().select(["uid", *ARROW_COLUMNS]), "arrow")
    try:
        want = _duck_rows(duck, ARROW_COLUMNS)
    finally:
        duck.close()
    assert _spark_rows(spark, ARROW_COLUMNS) == want


def test_values_at_the_caps_are_kept_and_over_them_null(spark: Any) -> None:
    rows = _spark_rows(spark, [*TYPES])
    li = [r["li"] for r in rows]
    assert li[:7] == [_n(L - 1), _n(L), None, [], None, [None] * L, None]
    assert [r["ls"] for r in rows][:5] == [["abc"] * 3, None, ["abcd", "ab"], [None, None], None]
    assert [r["lli"] for r in rows][:2] == [[_n(L - 1)], None]
    assert [r["lls"] for r in rows][:4] == [[["ab", "cd"], ["e"]], [["ab", "cd"], ["e", "f"]], None, [[None]]]
    st = [r["st"] for r in rows]
    assert st[0] == VALUES["st"][0]
    assert st[1] == {"a": None, "l": None, "s": {"b": None, "ll": None}}
    assert st[4] is None and st[5] == {"a": "x", "l": [None], "s": {"b": b"", "ll": [[], None]}}
    assert [r["lst"] for r in rows][:3] == [VALUES["lst"][0], None, [{"t": None, "l": [None]}]]
    assert [r["mp"] for r in rows][:5] == [VALUES["mp"][0], None, None, [("a", None)], [("a", None)]]
    assert [r["mpl"] for r in rows][:3] == [VALUES["mpl"][0], None, [(1, [None]), (2, None)]]
    assert [r["lmp"] for r in rows][:3] == [VALUES["lmp"][0], None, [None, [("a", 2)]]]


def test_under_the_default_ratio_of_the_caps_a_kept_list_is_not_rebuilt(spark: Any) -> None:
    # max_list_size <= max_text_bytes (the defaults): no text inside a list within the size cap is over the text
    # cap, so the kept list is read as is; the values are still DuckDB's
    from dpsql.engine.spark import SparkBackend

    duck = _duck(str(spark.path), "parquet", invalid_text="replace", max_text_bytes=L)
    b = SparkBackend(None, EngineSettings(max_text_bytes=L, max_list_size=L))
    try:
        b.register_source("t", "parquet", str(spark.path), view="v")
        assert _spark_rows(b, [*TYPES]) == _duck_rows(duck, [*TYPES])
        plan = _plan(b, "SELECT ls, lls, mp FROM v")
        assert "transform" not in plan and "forall" not in plan and "size(ls" in plan, plan
    finally:
        duck.close()
        b.close()


def test_control_without_caps_every_value_is_read_whole() -> None:
    from dpsql.engine.spark import SparkBackend

    b = SparkBackend(None, EngineSettings(max_text_bytes=None, max_list_size=None))
    try:
        b.register_source("t", "arrow", table(), view="v")
        rows = _spark_rows(b, [*TYPES])
    finally:
        b.close()
    want = table().select([*TYPES]).to_pylist()
    assert rows == want


def _plan(b: Any, sql: str) -> str:
    return str(b.spark.sql(sql)._jdf.queryExecution().optimizedPlan().toString())


def test_the_size_is_tested_before_the_value_is_read(spark: Any) -> None:
    # a list of integers: one test of its stored length, and the value read only where it holds
    plan = _plan(spark, "SELECT COUNT(DISTINCT li) FROM v")
    m = re.search(rf"CASE WHEN \((.*?) <= {L}\) THEN", plan)
    assert m is not None, plan
    assert re.fullmatch(r"coalesce\(cast\(size\(li#\d+, false\) as bigint\), 0\)", m.group(1)), m.group(1)
    # a list of lists of text: the inner lists' lengths are summed only where the outer length is within the cap,
    # and the texts' lengths only where both are
    plan = _plan(spark, "SELECT lls FROM v")
    first = plan.index("CASE WHEN")
    conds = re.findall(r"CASE WHEN \((.*?)\) THEN", plan[first:])
    assert "aggregate" not in conds[0] and "size(lls" in conds[0], conds
    assert "aggregate" in conds[1] and "octet_length" not in conds[1], conds
    assert "octet_length" in conds[2], conds


def test_a_map_keyed_by_a_type_holding_text_is_refused_by_both_engines() -> None:
    from dpsql.engine.spark import SparkBackend

    t = pa.table({"uid": pa.array([1], pa.int64()),
                  "m": pa.array([[({"k": "a"}, 1)]], pa.map_(pa.struct([("k", S)]), I32))})
    import duckdb

    from dpsql.engine.duckdb import DuckDBBackend

    con = duckdb.connect()
    con.execute("CREATE TABLE m AS SELECT 1::BIGINT AS uid, MAP {{'k': 'a'}: 1} AS m")
    duck = DuckDBBackend(con, EngineSettings())
    try:
        with pytest.raises(ConfigError, match="cannot be capped"):
            duck.register_source("m", "duckdb", "m", view="m")
    finally:
        duck.close()
        con.close()
    b = SparkBackend(None, EngineSettings())
    try:
        with pytest.raises(ConfigError, match="cannot be capped"):
            b.register_source("m", "arrow", t, view="m")
        # a map keyed by a struct of integers is read
        ok = pa.table({"uid": pa.array([1], pa.int64()),
                       "m": pa.array([[({"k": 1}, 1)]], pa.map_(pa.struct([("k", I32)]), I32))})
        b.register_source("ok", "arrow", ok, view="ok")
        assert _spark_rows(b, ["m"], "ok") == [{"m": [({"k": 1}, 1)]}]
    finally:
        b.close()
