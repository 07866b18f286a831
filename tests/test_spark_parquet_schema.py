"""The Spark engine reads a Parquet source's schema from the files' footers on the driver, without a
Spark job: the registered types, the view's Spark schema and the rows read are the same as when Spark
infers the schema itself (its own job), for every column type the Spark tests use and more (unsigned
integers, decimals of every physical width, dates, timestamps of every unit with and without a time
zone, INT96, nested types, dictionaries, a file Spark wrote itself); the files' checks (types that
disagree, milliseconds in some files only) refuse the same sources."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import require_spark

from dpsql.engine import EngineSettings
from dpsql.errors import ConfigError

require_spark()

from dpsql.engine.spark import SparkBackend  # noqa: E402


def columns() -> pa.Table:
    ts = [dt.datetime(2024, 1, 2, 3, 4, 5, 6000), None, dt.datetime(1900, 12, 31, 23, 59, 59)]
    return pa.table({
        "i8": pa.array([1, None, -3], pa.int8()), "i16": pa.array([1, 2, None], pa.int16()),
        "i32": pa.array([1, 2, 3], pa.int32()), "i64": pa.array([None, 2, -(2**62)], pa.int64()),
        "u8": pa.array([1, 255, None], pa.uint8()), "u16": pa.array([1, 65535, 0], pa.uint16()),
        "u32": pa.array([1, 2**32 - 1, 0], pa.uint32()), "u64": pa.array([1, 2**64 - 1, None], pa.uint64()),
        "f32": pa.array([1.5, None, -0.0], pa.float32()), "f64": pa.array([1.25, float("nan"), None], pa.float64()),
        "b": pa.array([True, None, False]), "s": pa.array(["a", None, "ü"]), "ls": pa.array(["x", "y", None], pa.large_string()),
        "bin": pa.array([b"\x00", None, b"ab"]), "fbin": pa.array([b"ab", b"cd", None], pa.binary(2)),
        "d9": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-3.50")], pa.decimal128(9, 2)),
        "d18": pa.array([decimal.Decimal("1.125"), None, decimal.Decimal("0")], pa.decimal128(18, 3)),
        "d38": pa.array([decimal.Decimal("12345678901234567890.1234567890"), None, decimal.Decimal("0")],
                        pa.decimal128(38, 10)),
        "day": pa.array([dt.date(2024, 1, 2), None, dt.date(1, 1, 1)], pa.date32()),
        "ts_ms": pa.array(ts, pa.timestamp("ms")), "ts_us": pa.array(ts, pa.timestamp("us")),
        "ts_utc": pa.array(ts, pa.timestamp("us", tz="UTC")), "ts_ms_utc": pa.array(ts, pa.timestamp("ms", tz="UTC")),
        "lst": pa.array([[1, 2], None, []], pa.list_(pa.int64())),
        "st": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": None}]),
        "mp": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int32())),
        "dict": pa.array(["p", "q", None]).dictionary_encode(),
        "nothing": pa.nulls(3),
    })


@pytest.fixture(scope="module")
def backend() -> Iterator[SparkBackend]:
    b = SparkBackend(None, EngineSettings())
    yield b
    b.close()


def _register(b: SparkBackend, source: str, footers: bool, monkeypatch: pytest.MonkeyPatch,
              **kw: Any) -> tuple[dict[str, str] | str, Any, list[Any], int]:
    """(registered types or the ConfigError's text, the view's Spark schema, its rows, Spark jobs run)."""
    with monkeypatch.context() as m:
        if not footers:
            m.setattr(SparkBackend, "_footer_schemas", lambda self, name, paths: None)
        sc = b.spark.sparkContext
        group = f"schema-{footers}-{source}"
        sc.setJobGroup(group, "registration")
        try:
            types: dict[str, str] | str = b.register_source("t", "parquet", source, view="v", **kw)
        except ConfigError as e:
            return str(e), None, [], len(sc.statusTracker().getJobIdsForGroup(group))
        finally:
            sc.setJobGroup("", "")
        jobs = len(sc.statusTracker().getJobIdsForGroup(group))
        df = b.spark.table("v")
        rows = sorted(repr(r) for r in df.collect())
        b.unregister_source("t", "parquet", view="v")
        return types, df.schema, rows, jobs


def _same(b: SparkBackend, source: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, int]:
    new, old = _register(b, source, True, monkeypatch), _register(b, source, False, monkeypatch)
    assert new[0] == old[0]
    assert new[1] == old[1], (new[1], old[1])
    assert new[2] == old[2]
    assert old[3] >= 1  # negative control: Spark's inference runs a job
    return new[0], new[3]


def test_every_type_registers_as_spark_infers_it_without_a_job(backend: SparkBackend, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    t = columns()
    variants = {"plain.parquet": {},
                "legacy.parquet": {"use_deprecated_int96_timestamps": True, "version": "1.0", "use_dictionary": False}}
    for fname, kw in variants.items():
        pq.write_table(t, tmp_path / fname, **kw)
        types, jobs = _same(backend, str(tmp_path / fname), monkeypatch)
        assert isinstance(types, dict) and jobs == 0, (fname, types)
        assert types["day"] == "DATE" and types["d38"] == "DECIMAL(38,10)"
        assert types["u64"] == "DECIMAL(20,0)", fname
        # INT96 (every timestamp of the legacy file) is a TIMESTAMP, as DuckDB reads it
        assert types["ts_utc"] == ("TIMESTAMP WITH TIME ZONE" if fname == "plain.parquet" else "TIMESTAMP"), fname
        assert types["ts_us"] == types["ts_ms"] == "TIMESTAMP", fname
    # nanoseconds: refused on both paths alike, naming the column, the file and the fix
    pq.write_table(pa.table({"ns": pa.array([1], pa.timestamp("ns"))}), tmp_path / "ns.parquet", version="2.6")
    message, _ = _same(backend, str(tmp_path / "ns.parquet"), monkeypatch)
    assert f"the Parquet file '{tmp_path / 'ns.parquet'}' stores 'ns' as TIMESTAMP(NANOS), which Spark" in message
    assert "coerce_timestamps='us'" in message


def test_a_file_spark_wrote_keeps_its_own_schema(backend: SparkBackend, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark stores its schema in the file's metadata (e.g. TIMESTAMP_NTZ, CHAR/VARCHAR): read as Spark reads it."""
    out = str(tmp_path / "by_spark")
    backend.spark.sql("SELECT 1 AS a, CAST('x' AS VARCHAR(3)) AS v, TIMESTAMP_NTZ'2024-01-01 00:00:00' AS n, "
                      "TIMESTAMP'2024-01-01 00:00:00' AS z, DATE'2024-01-01' AS d, 1.5BD AS m").write.parquet(out)
    files = sorted(str(p) for p in Path(out).glob("part-*.parquet"))
    types, jobs = _same(backend, files[0], monkeypatch)
    assert isinstance(types, dict) and jobs == 0 and types["n"] == "TIMESTAMP"
    # the directory itself (Spark lists it, skipping _SUCCESS): Spark infers it, as before
    types, jobs = _same(backend, out, monkeypatch)
    assert isinstance(types, dict) and jobs >= 1


def test_globs_and_the_files_checks_are_the_same(backend: SparkBackend, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    same = tmp_path / "same"
    same.mkdir()
    for k in range(3):
        pq.write_table(pa.table({"a": pa.array([k, k + 1], pa.int64()), "s": [f"x{k}", None]}), same / f"f{k}.parquet")
    types, jobs = _same(backend, str(same / "*.parquet"), monkeypatch)
    assert types == {"a": "BIGINT", "s": "VARCHAR"} and jobs == 0
    # a column widened by Spark's reader, or one that disagrees: Spark infers and the check decides, as before
    for k, (first, second) in enumerate([(pa.int32(), pa.int64()), (pa.int64(), pa.string())]):
        d = tmp_path / f"mixed{k}"
        d.mkdir()
        pq.write_table(pa.table({"a": pa.array([1], first)}), d / "f0.parquet")
        pq.write_table(pa.table({"a": pa.array(["2"] if second == pa.string() else [2], second)}), d / "f1.parquet")
        _same(backend, str(d / "*.parquet"), monkeypatch)
    # timestamps in milliseconds in one file, microseconds in the other: refused alike, and where every file
    # stores milliseconds the column is read through the stored integers alike
    for k, units in enumerate([("ms", "us"), ("ms", "ms")]):
        d = tmp_path / f"units{k}"
        d.mkdir()
        for i, u in enumerate(units):
            pq.write_table(pa.table({"t": pa.array([dt.datetime(2024, 1, 1 + i)], pa.timestamp(u))}), d / f"f{i}.parquet")
        types, _ = _same(backend, str(d / "*.parquet"), monkeypatch)
        assert isinstance(types, str) == (k == 0), types
    # not Parquet: the same ConfigError
    (tmp_path / "bad.parquet").write_bytes(b"not a parquet file")
    types, _ = _register(backend, str(tmp_path / "bad.parquet"), True, monkeypatch)[:2]
    old = _register(backend, str(tmp_path / "bad.parquet"), False, monkeypatch)[0]
    assert isinstance(types, str) and types == old


def test_a_local_session_dpsql_starts_has_a_fixed_small_number_of_shuffle_partitions(backend: SparkBackend) -> None:
    """Twice the local master's threads (Spark's 200 made every shuffle of small data run 200 tasks); fixed
    by the master, never by the data; nothing for a cluster's master."""
    from dpsql.engine.spark import local_conf

    assert local_conf("local[2]") == {"spark.sql.shuffle.partitions": "4"}
    assert local_conf("local") == {"spark.sql.shuffle.partitions": "2"}
    assert local_conf("local[3, 2]") == {"spark.sql.shuffle.partitions": "6"}
    assert local_conf("spark://127.0.0.1:7077") == {} and local_conf("yarn") == {}
    sc = backend.spark.sparkContext
    if sc.appName == "dpsql" and sc.master == "local[2]":  # this process's context was started by dpsql
        assert backend.spark.conf.get("spark.sql.shuffle.partitions") == "4"


def test_a_session_dpsql_starts_keeps_more_compiled_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session dpsql starts itself keeps 2000 compiled operator classes instead of Spark's 100 (a bounded query
    compiles 20-170, so a few query shapes evicted each other), on a local master and on a cluster's; a caller's
    running session keeps its own."""
    import dpsql.engine.spark as spark_engine

    seen: dict[str, str] = {}

    class Builder:
        def master(self, m: str) -> Builder:
            seen["master"] = m
            return self

        def appName(self, n: str) -> Builder:  # noqa: N802 - Spark's name
            return self

        def config(self, k: str, v: str) -> Builder:
            seen[k] = v
            return self

        def getOrCreate(self) -> str:  # noqa: N802 - Spark's name
            return "session"

    class FakeSession:
        builder = Builder()

        @staticmethod
        def getActiveSession() -> None:  # noqa: N802 - Spark's name
            return None

    monkeypatch.setattr(spark_engine, "_require_pyspark", lambda: FakeSession)
    for master in ("local[2]", "spark://127.0.0.1:7077"):
        seen.clear()
        assert spark_engine.spark_session(master) == "session"
        assert seen["master"] == master and seen["spark.sql.codegen.cache.maxEntries"] == "2000"
