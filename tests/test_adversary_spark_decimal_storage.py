"""Parquet DECIMALs stored in ways the plain readers do not read totally, on both engines: neighbouring datasets
(with and without one person whose stored integer has more digits than the declared precision), the same query, the
same observable outcome; and the storage no reader reads totally refused at registration by both engines alike.

* A DECIMAL inside a struct, list or map stored as a FIXED_LEN_BYTE_ARRAY: Spark's row-based reader (the owner's
  ``spark.sql.parquet.enableNestedColumnVectorizedReader`` off) raised on such a value whatever read the column,
  and with the vectorized reader ``COUNT(DISTINCT col)`` did: one person's value failed the query after its charge.
* One column stored in FIXED_LEN_BYTE_ARRAYs of different lengths in a source's files: Spark read it as its
  reader does, raising on a 16-byte value beyond 38 digits.
* A DECIMAL stored as variable-length BINARY: pyarrow's reader (the DuckDB engine's) raised on a value of more than
  16 bytes, Spark's on one beyond the precision (and on every DECIMAL(p <= 18) so stored): refused by both.
* A FIXED_LEN_BYTE_ARRAY of more than 16 bytes: pyarrow cannot read it at all: refused by both.

The files are written through parquet-mr (``tests/_parquet_forge.py``): pyarrow writes none of these layouts.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _parquet_forge import forge, stored
from _spark import require_spark

import dpsql
from dpsql.errors import ConfigError, DPSQLError
from dpsql.testing import use_noise, zero_noise

require_spark()

N = 6  # people besides the hostile one


@pytest.fixture(scope="module")
def spark() -> Iterator[dpsql.Session]:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), engine={"kind": "spark", "statement_timeout": 300})
    use_noise(s, zero_noise(40))
    yield s
    s.close()


@pytest.fixture(scope="module")
def duck() -> Iterator[dpsql.Session]:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5))
    use_noise(s, zero_noise(40))
    yield s
    s.close()


@pytest.fixture(scope="module")
def registered(spark: dpsql.Session, duck: dpsql.Session,
               tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Files], dict[bool, str]]:
    """``registered(key, files)``: the neighbours' files (``files(directory)``: hostile -> path, written on first use)
    registered once on both sessions, hostile -> table name. A registration reads the files' footers only,
    never the reader settings the tests below vary: those take effect when Spark plans each query, so the
    parametrisations of one dataset share its files and tables."""
    done: dict[str, dict[bool, str]] = {}
    lake = tmp_path_factory.mktemp("decimal_storage")

    def get(key: str, files: Files) -> dict[bool, str]:
        if key not in done:
            names = {}
            for hostile, path in files(lake).items():
                names[hostile] = f"{key}_{int(hostile)}"
                for sess in (spark, duck):
                    sess.register(names[hostile], path, privacy_unit="uid")
            done[key] = names
        return done[key]

    return get


def _outcome(s: dpsql.Session, sql: str) -> tuple[str, Any]:
    try:
        return "ok", s.query(sql, epsilon=1.0, delta=1e-5).table.to_pylist()
    except DPSQLError as e:
        return "error", type(e).__name__


Rows = Callable[[int, bool], dict[str, Any]]  # (person, hostile) -> the person's row
Files = Callable[[Path], dict[bool, str]]  # a directory -> the neighbours' files written there, hostile -> path

#: name -> (Parquet schema, the row of person i (the hostile value where asked), the column, precision, scale)
NESTED: dict[str, tuple[str, Rows, str, int, int]] = {
    "struct16": ("message m { required int32 uid; optional group st { optional fixed_len_byte_array(16) d "
                 "(DECIMAL(38,0)); optional int32 k; } }",
                 lambda i, bad: {"uid": i, "st": {"d": stored(2**127 - 1 if bad else i, 16), "k": i}}, "st", 38, 0),
    "struct9": ("message m { required int32 uid; optional group st { optional fixed_len_byte_array(9) d "
                "(DECIMAL(20,2)); } }",
                lambda i, bad: {"uid": i, "st": {"d": stored(-(2**71) if bad else 100 * i + 5, 9)}}, "st", 20, 2),
    "struct5": ("message m { required int32 uid; optional group st { optional fixed_len_byte_array(5) d "
                "(DECIMAL(10,2)); } }",
                lambda i, bad: {"uid": i, "st": {"d": stored(2**39 - 1 if bad else i, 5)}}, "st", 10, 2),
    "list16": ("message m { required int32 uid; optional group l (LIST) { repeated group list { optional "
               "fixed_len_byte_array(16) element (DECIMAL(38,0)); } } }",
               lambda i, bad: {"uid": i, "l": {"list": [{"element": stored(i, 16)}, {"element": stored(
                   -(2**127) if bad else -i, 16)}]}}, "l", 38, 0),
}


def _files(tmp: Path, spark: dpsql.Session, schema: str, row: Rows, name: str) -> dict[bool, str]:
    out = {}
    for hostile in (False, True):
        rows = [row(i, False) for i in range(N)] + ([row(N, True)] if hostile else [])
        path = str(tmp / f"{name}_{int(hostile)}.parquet")
        forge(spark._engine.spark, path, schema, rows)
        out[hostile] = path
    return out


@pytest.mark.parametrize("vectorized_nested", ["true", "false"])
@pytest.mark.parametrize("case", sorted(NESTED))
def test_a_nested_decimal_beyond_its_precision_answers_alike_on_neighbours(
        spark: dpsql.Session, duck: dpsql.Session, registered: Any, case: str, vectorized_nested: str) -> None:
    schema, row, col, p, s = NESTED[case]
    names = registered(case, lambda lake: _files(lake, spark, schema, row, case))
    conf = spark._engine.spark.conf
    was = conf.get("spark.sql.parquet.enableNestedColumnVectorizedReader")
    conf.set("spark.sql.parquet.enableNestedColumnVectorizedReader", vectorized_nested)
    try:
        for sql in (f"SELECT COUNT(*) AS c FROM {{t}} WHERE {col} IS NOT NULL", f"SELECT COUNT({col}) AS c FROM {{t}}",
                    f"SELECT COUNT(DISTINCT {col}) AS c FROM {{t}}"):
            base = _outcome(spark, sql.format(t=names[False]))
            assert base == ("ok", [{"c": N}]), (sql, base)
            # the hostile person's nested value is there (not NULL), its DECIMAL NULL inside it, as on DuckDB
            hostile = _outcome(spark, sql.format(t=names[True]))
            assert hostile == ("ok", [{"c": N + 1}]), (sql, hostile)
            assert _outcome(duck, sql.format(t=names[True])) == hostile, sql
        # the legitimate values read exactly
        got = spark._engine.spark.table(duck_view(spark, names[True])).orderBy("uid").collect()
        first = got[1][col]
        leaf = first["d"] if case.startswith("struct") else first[1]
        want = decimal.Decimal(f"{100 + 5 if case == 'struct9' else -1 if case == 'list16' else 1}E-{s}")
        assert leaf == want, (case, first)
        last = got[N][col]
        assert (last["d"] if case.startswith("struct") else last[1]) is None, (case, last)
    finally:
        conf.set("spark.sql.parquet.enableNestedColumnVectorizedReader", was)


def duck_view(s: dpsql.Session, name: str) -> str:
    spec = s._catalog.get(name)
    assert spec is not None and spec.view is not None
    return spec.view


def test_control_spark_itself_raises_on_a_nested_decimal_beyond_its_precision(spark: dpsql.Session,
                                                                              tmp_path: Path) -> None:
    schema, row, *_ = NESTED["struct16"]
    path = _files(tmp_path, spark, schema, row, "control")[True]
    sp = spark._engine.spark
    was = sp.conf.get("spark.sql.parquet.enableNestedColumnVectorizedReader")
    sp.conf.set("spark.sql.parquet.enableNestedColumnVectorizedReader", "false")
    try:
        with pytest.raises(Exception):  # noqa: B017 - Spark's own error, whatever its class
            sp.read.parquet(path).selectExpr("st IS NULL AS n").collect()
    finally:
        sp.conf.set("spark.sql.parquet.enableNestedColumnVectorizedReader", was)


@pytest.mark.parametrize(("p", "s", "lengths", "bad"), [
    (30, 0, (13, 16), 2**127 - 1),
    (35, 4, (15, 16), -(10**36)),
    (20, 2, (9, 10, 16), 10**20),
])
def test_a_decimal_stored_in_different_lengths_across_files_answers_alike_on_neighbours(
        spark: dpsql.Session, duck: dpsql.Session, tmp_path: Path, p: int, s: int, lengths: tuple[int, ...],
        bad: int) -> None:
    """File j holds people 10 j + i storing the integer 10 j + i in ``lengths[j]`` bytes; the hostile person's value
    is in the file of 16 bytes."""
    names = {}
    for hostile in (False, True):
        d = tmp_path / f"mix{p}_{s}_{int(hostile)}"
        d.mkdir()
        for j, length in enumerate(lengths):
            rows = [{"uid": 10 * j + i, "a": stored(10 * j + i, length)} for i in range(N)]
            if hostile and length == 16:
                rows.append({"uid": 999, "a": stored(bad, 16)})
            forge(spark._engine.spark, str(d / f"part{j}.parquet"),
                  f"message m {{ required int32 uid; optional fixed_len_byte_array({length}) a (DECIMAL({p},{s})); }}",
                  rows)
        names[hostile] = f"mix{p}_{s}_{int(hostile)}"
        for sess in (spark, duck):
            sess.register(names[hostile], str(d / "part*.parquet"), privacy_unit="uid")
    for sql in ("SELECT COUNT(*) AS c FROM {t} WHERE a IS NULL OR a >= 0", "SELECT COUNT(*) AS c FROM {t} WHERE -a < 1",
                "SELECT COUNT(DISTINCT a) AS c FROM {t}", "SELECT COUNT(a) AS c FROM {t}"):
        base = _outcome(spark, sql.format(t=names[False]))
        assert base[0] == "ok", (sql, base)
        assert _outcome(duck, sql.format(t=names[False])) == base, sql
        hostile = _outcome(spark, sql.format(t=names[True]))
        assert hostile[0] == "ok", (sql, hostile)
        assert _outcome(duck, sql.format(t=names[True])) == hostile, sql
    assert _outcome(spark, f"SELECT COUNT(*) AS c FROM {names[True]} WHERE a IS NULL") == ("ok", [{"c": 1}])
    got = sorted(r["a"] for r in spark._engine.spark.table(duck_view(spark, names[True])).collect()
                 if r["a"] is not None)
    assert got == [decimal.Decimal(f"{10 * j + i}E-{s}") for j in range(len(lengths)) for i in range(N)]


REFUSED = {
    "map_value": ("message m { required int32 uid; optional group mp (MAP) { repeated group key_value { required int32 "
                  "key; optional fixed_len_byte_array(16) value (DECIMAL(38,10)); } } }", "mp",
                  lambda i: {"uid": i, "mp": {"key_value": [{"key": 1, "value": stored(i, 16)}]}}),
    "binary10": ("message m { required int32 uid; optional binary a (DECIMAL(10,2)); }", "a",
                 lambda i: {"uid": i, "a": stored(i, 2)}),
    "binary38": ("message m { required int32 uid; optional binary a (DECIMAL(38,0)); }", "a",
                 lambda i: {"uid": i, "a": stored(i, 3)}),
    "nested_binary": ("message m { required int32 uid; optional group st { optional binary d (DECIMAL(20,0)); } }",
                      "st.d", lambda i: {"uid": i, "st": {"d": stored(i, 4)}}),
    "flba20": ("message m { required int32 uid; optional fixed_len_byte_array(20) a (DECIMAL(38,2)); }", "a",
               lambda i: {"uid": i, "a": stored(i, 20)}),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_decimal_no_reader_reads_totally_is_refused_by_both_engines_for_free(
        spark: dpsql.Session, duck: dpsql.Session, tmp_path: Path, case: str) -> None:
    schema, column, row = REFUSED[case]
    path = str(tmp_path / f"{case}.parquet")
    forge(spark._engine.spark, path, schema, [row(i) for i in range(N)])
    for sess in (spark, duck):
        left = sess.remaining()
        with pytest.raises(ConfigError, match=f"'{column}'|{column}'") as e:
            sess.register(f"r_{case}", path, privacy_unit="uid")
        if case != "map_value":
            assert f"DECIMAL column '{column}'" in str(e.value) and "fixed DECIMAL encoding" in (e.value.hint or "")
        assert f"r_{case}" not in sess.tables and sess.remaining() == left


def _int_stored(hostile: bool) -> Any:
    """pyarrow's integer DECIMAL encoding (as Spark writes DECIMAL(p <= 18)): a struct of a DECIMAL(4,2) (INT32) and a
    DECIMAL(12,0) (INT64), a list of DECIMAL(4,2), and a top-level DECIMAL(4,2) beside them; the hostile person stores
    32767 (327.67, five digits) and 10^15 (sixteen digits) in each."""
    import pyarrow as pa
    from test_adversary_round38 import _over_precision

    xs, ys = list(range(N)) + ([32767] if hostile else []), list(range(N)) + ([10**15] if hostile else [])
    n = len(xs)
    st = pa.StructArray.from_arrays([_over_precision(xs, 4, 2), _over_precision(ys, 12, 0)], names=["x", "y"])
    lst = pa.ListArray.from_arrays(pa.array(range(n + 1), pa.int32()), _over_precision(xs, 4, 2))
    return pa.table({"uid": pa.array(range(n), pa.int64()), "st": st, "l": lst, "a": _over_precision(xs, 4, 2)})


@pytest.mark.parametrize("vectorized_nested", ["true", "false"])
def test_a_decimal_stored_as_an_integer_beside_nested_columns_answers_alike_on_neighbours(
        spark: dpsql.Session, duck: dpsql.Session, registered: Any, vectorized_nested: str) -> None:
    import pyarrow.parquet as pq

    def files(lake: Path) -> dict[bool, str]:
        out = {}
        for hostile in (False, True):
            out[hostile] = str(lake / f"ints_{int(hostile)}.parquet")
            pq.write_table(_int_stored(hostile), out[hostile], store_decimal_as_integer=True)
            assert {c.physical_type for c in pq.ParquetFile(out[hostile]).schema} == {"INT32", "INT64"}
        return out

    names = registered("ints", files)
    conf = spark._engine.spark.conf
    was = conf.get("spark.sql.parquet.enableNestedColumnVectorizedReader")
    conf.set("spark.sql.parquet.enableNestedColumnVectorizedReader", vectorized_nested)
    try:
        for sql in ("SELECT COUNT(*) AS c FROM {t} WHERE st IS NOT NULL AND l IS NOT NULL",
                    "SELECT COUNT(DISTINCT st) AS c FROM {t}", "SELECT COUNT(DISTINCT l) AS c FROM {t}",
                    "SELECT COUNT(*) AS c FROM {t} WHERE a IS NULL OR a * a >= 0"):
            base = _outcome(spark, sql.format(t=names[False]))
            assert base == ("ok", [{"c": N}]), (sql, base)
            hostile = _outcome(spark, sql.format(t=names[True]))
            assert hostile == ("ok", [{"c": N + 1}]), (sql, hostile)
            assert _outcome(duck, sql.format(t=names[True])) == hostile, sql
        rows = {r["uid"]: r for r in spark._engine.spark.table(duck_view(spark, names[True])).collect()}
        assert (rows[3]["st"]["x"], rows[3]["st"]["y"], rows[3]["l"], rows[3]["a"]) == (
            decimal.Decimal("0.03"), decimal.Decimal(3), [decimal.Decimal("0.03")], decimal.Decimal("0.03"))
        assert (rows[N]["st"]["x"], rows[N]["st"]["y"], rows[N]["l"], rows[N]["a"]) == (None, None, [None], None)
    finally:
        conf.set("spark.sql.parquet.enableNestedColumnVectorizedReader", was)
