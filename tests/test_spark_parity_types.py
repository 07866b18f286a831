"""The same plans on Spark give the same releases: with zero noise (the same salts on both engines) and DuckDB's
portable keyed hash, each query shape below releases on DuckDB and on Spark ``local[2]`` a table with the same column
names, the same Arrow types, the same rows in the same order and the same values (keys spelled alike: text with
NULL, dates, timestamps, decimals, booleans), bit for bit. Unlike ``tests/test_spark.py`` (bounded aggregates, rows
compared as sets, floats within 1e-9) this compares what the analyst receives.

And a release whose bounded result is larger than Spark's ``spark.driver.maxResultSize`` (many groups) is read
all the same: past the limit the rows reach the driver one partition at a time, or in slices (a subprocess with its own SparkContext, whose
limit is 1 MiB). Skipped (with the reason) without pyspark/Java."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _spark import comparable_session, require_spark

import dpsql
from dpsql.testing import use_noise, zero_noise

require_spark()


def _data(seed: int = 5, n_users: int = 150) -> pa.Table:
    g = np.random.default_rng(seed)
    user = np.repeat(np.arange(1, n_users + 1), g.integers(1, 8, n_users))
    n = len(user)
    txt = np.array(["a", "b", "ü", "o'x", "", "Z"], dtype=object)[g.integers(0, 6, n)]
    txt[g.random(n) < 0.2] = None
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=int(d)) for d in g.integers(0, 4, n)]
    stamps = [dt.datetime(2024, 3, 1, 12, 30) + dt.timedelta(hours=int(h), microseconds=7) for h in g.integers(0, 3, n)]
    dec = [decimal.Decimal(v) for v in np.array(["1.50", "-2.25", "10.00"])[g.integers(0, 3, n)]]
    flag = [None if r < 0.15 else bool(r < 0.6) for r in g.random(n)]
    return pa.table({
        "uid": pa.array(user, pa.int64()),
        "txt": pa.array(txt.tolist(), pa.string()),
        "cat": pa.array(np.array(["x", "y", "z"])[g.integers(0, 3, n)], pa.string()),
        "day": pa.array(days, pa.date32()),
        "ts": pa.array(stamps, pa.timestamp("us")),
        "dec": pa.array(dec, pa.decimal128(9, 2)),
        "flag": pa.array(flag, pa.bool_()),
        "amount": pa.array(np.round(g.uniform(-5, 120, n), 2), pa.float64()),
        "age": pa.array(g.integers(0, 100, n), pa.int64()),
        "small": pa.array(g.integers(0, 5, n), pa.int32()),
    })


def _register(s: dpsql.Session, t: pa.Table) -> None:
    s.register("ev", t, privacy_unit="uid", max_groups_per_unit=3, max_rows_per_group=2, max_rows_per_unit=6,
               columns={"amount": {"bounds": (0, 100)}, "age": {"bounds": (0, 100), "bins": 20},
                        "small": {"bounds": (0, 4)},
                        "cat": {"domain": ["x", "y", "z", "w"]},
                        "day": {"domain": ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05"]},
                        "flag": {"domain": [False, True]},
                        "dec": {"domain": ["1.50", "-2.25", "10.00", "3.00"]}})
    # the same rows, no declared key domain: the keys come from the data (sparse histograms)
    s.register("raw", t, privacy_unit="uid", max_groups_per_unit=3, max_rows_per_group=2,
               columns={"amount": {"bounds": (0, 100)}, "small": {"bounds": (0, 4)}, "dec": {"bounds": (-5, 15)},
                        "day": {"bounds": ("2024-01-01", "2024-01-10"), "bin_width": "1 day"},
                        "ts": {"bounds": ("2024-03-01", "2024-03-02"), "bin_width": "1 hour"}})


def _session(kind: str, t: pa.Table) -> dpsql.Session:
    s = comparable_session(kind)  # each release sets its own zero noise (_release)
    _register(s, t)
    return s


@pytest.fixture(scope="module")
def both() -> Any:
    t = _data()
    sessions = [_session("duckdb", t), _session("spark", t)]
    yield sessions
    for s in sessions:
        s.close()


#: name -> (sql or a list of SQL (one workload), delta, options)
QUERIES: dict[str, tuple[Any, float, dict[str, Any] | None]] = {
    "scalar": ("SELECT COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM ev", 1e-5, None),
    "scalar_int_sum": ("SELECT SUM(small) AS s, AVG(small) AS a, COUNT(small) AS c FROM ev", 1e-5, None),
    "quantiles": ("SELECT MEDIAN(amount) AS m FROM ev", 0.0, None),
    "quantile_grouped": ("SELECT cat, QUANTILE(amount, 0.75) AS q, MIN(amount) AS lo, MAX(amount) AS hi "
                         "FROM ev GROUP BY cat ORDER BY cat", 0.0, None),
    "quantile_date": ("SELECT MIN(day) AS lo, MAX(ts) AS hi FROM raw", 0.0, None),
    "variance": ("SELECT VARIANCE(amount) AS v, STDDEV(amount) AS sd, VAR_POP(amount) AS vp FROM ev", 1e-5, None),
    "count_distinct": ("SELECT COUNT(DISTINCT txt) AS n FROM ev", 1e-5, None),
    "count_distinct_grouped": ("SELECT cat, COUNT(DISTINCT txt) AS n FROM ev GROUP BY cat ORDER BY cat", 1e-5, None),
    "public_text": ("SELECT cat, COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM ev GROUP BY cat", 1e-5, None),
    "public_date": ("SELECT day, COUNT(*) AS n FROM ev GROUP BY day ORDER BY day", 1e-5, None),
    "public_bool": ("SELECT flag, COUNT(*) AS n FROM ev GROUP BY flag", 1e-5, None),
    "public_decimal": ("SELECT dec, SUM(amount) AS s FROM ev GROUP BY dec ORDER BY dec DESC", 1e-5, None),
    "public_two": ("SELECT cat, flag, COUNT(*) AS n FROM ev GROUP BY cat, flag", 1e-5, None),
    "sparse_text_null": ("SELECT txt, COUNT(*) AS n FROM raw GROUP BY txt ORDER BY txt", 1e-3, None),
    "sparse_date": ("SELECT day, COUNT(*) AS n, SUM(amount) AS s FROM raw GROUP BY day", 1e-3, None),
    "sparse_timestamp": ("SELECT ts, COUNT(*) AS n FROM raw GROUP BY ts ORDER BY n DESC, ts", 1e-3, None),
    "sparse_decimal": ("SELECT dec, COUNT(*) AS n FROM raw GROUP BY dec", 1e-3, None),
    "sparse_bool_null": ("SELECT flag, COUNT(*) AS n FROM raw GROUP BY flag", 1e-3, None),
    "sparse_expression": ("SELECT year(day) AS y, upper(txt) AS u, small * 2 AS s2, COUNT(*) AS n FROM raw "
                          "GROUP BY y, u, s2", 1e-3, None),
    "sparse_no_aggregate": ("SELECT txt FROM raw GROUP BY txt", 1e-3, None),
    "rollup": ("SELECT cat, flag, GROUPING(cat, flag) AS g, COUNT(*) AS n, SUM(amount) AS s FROM ev "
               "GROUP BY ROLLUP (cat, flag) ORDER BY g, cat, flag", 1e-5, None),
    "grouping_sets": ("SELECT cat, day, COUNT(*) AS n FROM ev GROUP BY GROUPING SETS ((cat), (day), ())", 1e-5, None),
    "covariance": ("SELECT COVAR_POP(amount, LEAST(GREATEST(age, 0), 99)) AS c, CORR(amount, "
                   "LEAST(GREATEST(age, 0), 99)) AS r FROM ev", 1e-5, None),
    "covariance_grouped": ("SELECT cat, COVAR_SAMP(amount, amount * 2 - 10) AS c FROM ev GROUP BY cat", 1e-5, None),
    "dawa": (["SELECT COUNT(*) FROM ev WHERE age BETWEEN 10 AND 39", "SELECT COUNT(*) FROM ev WHERE age < 60",
              "SELECT COUNT(*) FROM ev WHERE age >= 50"], 0.0, None),
    # keys computed by expressions: each engine's own result type, cast to the typer's
    "sparse_typed_keys": ("SELECT dec * 2 AS d2, dec + dec AS dd, length(txt) AS l, CAST(small AS SMALLINT) AS sm, "
                          "COUNT(*) AS n FROM raw GROUP BY d2, dd, l, sm", 1e-3, None),
    "sparse_typed_keys2": ("SELECT dec / 2 AS h, CAST(amount > 50 AS INT) AS big, date_trunc('month', day) AS m, "
                           "CAST(ts AS DATE) AS td, COUNT(*) AS n FROM raw GROUP BY h, big, m, td", 1e-3, None),
    "sparse_typed_keys3": ("SELECT day + INTERVAL 1 DAY AS nd, date_trunc('hour', ts) AS th, CAST(day AS VARCHAR) AS dt, "
                           "CAST(dec AS VARCHAR) AS dv, CAST(flag AS VARCHAR) AS fv, COUNT(*) AS n FROM raw "
                           "GROUP BY nd, th, dt, dv, fv", 1e-3, None),
    "sparse_typed_keys4": ("SELECT CAST(small AS TINYINT) AS t8, CAST(small AS DOUBLE) / 2 AS hd, abs(dec) AS ad, "
                           "floor(dec) AS fd, COALESCE(txt, 'none') AS ct, COUNT(*) AS n FROM raw "
                           "GROUP BY t8, hd, ad, fd, ct", 1e-3, None),
    "having_limit": ("SELECT txt, COUNT(*) AS n, SUM(amount) AS s FROM raw GROUP BY txt HAVING COUNT(*) > 3 "
                     "ORDER BY s DESC LIMIT 3", 1e-3, None),
    "decimal_and_integer_values": ("SELECT SUM(dec) AS s, AVG(dec) AS a, COUNT(DISTINCT upper(txt)) AS u FROM raw",
                                   1e-5, None),
    "decimal_and_integer_quantiles": ("SELECT MEDIAN(dec) AS md, QUANTILE(small, 0.5) AS qs FROM raw", 0.0, None),
    "public_no_aggregate": ("SELECT cat, dec FROM ev GROUP BY cat, dec", 0.0, None),
    "union_all": ("SELECT cat, COUNT(*) AS n FROM ev GROUP BY cat UNION ALL SELECT 'all', COUNT(*) FROM ev", 1e-5, None),
    "dawa_histogram": ("SELECT age, COUNT(*) AS n FROM ev GROUP BY age", 0.0, {"mechanism": "dawa"}),
}


def _release(s: dpsql.Session, q: Any, delta: float, options: dict[str, Any] | None) -> Any:
    use_noise(s, zero_noise(13))  # the same salts, in the same order, on both engines
    if isinstance(q, list):
        return s.query_many(q, epsilon=8.0, delta=delta)
    return s.query(q, epsilon=8.0, delta=delta, options=options)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _differences(d: Any, s: Any) -> list[str]:
    out = []
    if d.mechanism != s.mechanism:
        out.append(f"mechanism {d.mechanism} != {s.mechanism}")
    ds, ss = d.table.schema, s.table.schema
    if ds.names != ss.names:
        out.append(f"names {ds.names} != {ss.names}")
    if [f.type for f in ds] != [f.type for f in ss]:
        out.append(f"types {[str(f.type) for f in ds]} != {[str(f.type) for f in ss]}")
    dr, sr = d.table.to_pylist(), s.table.to_pylist()
    if len(dr) != len(sr):
        out.append(f"{len(dr)} rows != {len(sr)}")
    for i, (a, b) in enumerate(zip(dr, sr)):
        bad = [k for k in a if not _same_value(a[k], b.get(k))]
        if bad:
            out.append(f"row {i}: " + ", ".join(f"{k}={a[k]!r} != {b.get(k)!r}" for k in bad))
            break
    return out


def test_releases_are_the_same_on_duckdb_and_spark(both: list[dpsql.Session]) -> None:
    """Every shape in one test (one pair of sessions): the differences of all of them are reported together."""
    duck, spark = both
    problems: dict[str, list[str]] = {}
    trivial: list[str] = []
    for name, (q, delta, options) in QUERIES.items():
        try:
            d, s = (_release(x, q, delta, options) for x in (duck, spark))
        except Exception as e:  # noqa: BLE001
            problems[name] = [repr(e)[:300]]
            continue
        diff = _differences(d, s)
        if diff:
            problems[name] = diff
        if not (d.table.num_rows > 0 and any(v not in (0, None) for r in d.table.to_pylist() for v in r.values())):
            trivial.append(name)
    assert not problems, problems
    assert not trivial  # no shape is trivially empty or zero


_MANY_GROUPS = textwrap.dedent('''
    import json
    import numpy as np, pyarrow as pa
    from pyspark.sql import SparkSession
    import dpsql, dpsql.engine.spark as spark_engine
    from dpsql.errors import ExecutionError
    from dpsql.testing import use_noise, zero_noise

    spark = (SparkSession.builder.master("local[2]").config("spark.driver.maxResultSize", "1m")
             .config("spark.sql.shuffle.partitions", "8").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    # 25 000 groups of one person, and one group of 300: over 1 MiB of bounded rows, 8 partitions (keys of 31
    # bytes, below the length whose key is carried as its digest: fewer rows than shorter keys would need)
    n = 25000
    keys = [f"key-{i:07d}-" + "k" * 19 for i in range(n)] + ["popular"] * 300
    t = pa.table({"u": pa.array(np.arange(len(keys)), pa.int64()), "k": pa.array(keys)})
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5), engine="spark", spark=spark)
    s.register("t", t, privacy_unit="u", max_groups_per_unit=1)
    out = {}
    sliced = spark_engine._arrow_in_slices
    for how in ("by partition", "one partition", "toArrow"):
        if how == "one partition":  # all of it (over 1 MiB) in one partition: read in slices that each fit
            s._engine.spark.conf.set("spark.sql.shuffle.partitions", "1")
            spark_engine._arrow_in_slices = lambda df: out.setdefault("sliced", []).append(1) or sliced(df)
        if how == "toArrow":  # the control: one job collecting every partition exceeds the limit
            spark_engine._arrow_by_partition = lambda df: df.toArrow()
        use_noise(s, zero_noise(3))
        before = s.remaining().epsilon
        try:
            r = s.query("SELECT k, COUNT(*) AS n FROM t GROUP BY k", epsilon=1.0, delta=1e-5)
            out[how] = {"rows": r.to_pylist()}
        except ExecutionError as e:
            out[how] = {"error": str(e)}
        out[how]["charged"] = before - s.remaining().epsilon
    print("RESULT " + json.dumps(out))
''')


def test_a_release_of_many_groups_is_read_past_max_result_size() -> None:
    """A sparse histogram of 25 000 groups under a 1 MiB ``spark.driver.maxResultSize``: released, charged once,
    also when its bounded rows (over 1 MiB: keys of 31 bytes) are one partition. Control: ``toArrow`` (every
    partition in one job) fails it after the charge, with the generic error."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dpsql.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", _MANY_GROUPS], capture_output=True, text=True, timeout=900, env=env)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stderr[-3000:]
    out = json.loads(line[0].removeprefix("RESULT "))
    assert out["by partition"] == {"rows": [{"k": "popular", "n": 300}], "charged": 1.0}
    # one partition larger than the limit: read in slices, released, charged once (was the generic error after the
    # charge); the slices are read only there
    assert out["one partition"] == {"rows": [{"k": "popular", "n": 300}], "charged": 1.0} and out["sliced"] == [1]
    control = out["toArrow"]
    assert control["charged"] == 1.0 and "the charge stands" in control["error"]


def test_a_result_read_in_slices_holds_each_row_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slices (``_arrow_in_slices``) under a limit of 40 KB: every row of three partitions read exactly once
    (text with NULL and long text, DECIMAL, DATE, TIMESTAMP, DOUBLE NaN, lists, structs and maps, whose hash reads
    their text), the same table as ``toArrow``'s up to the order, the schema kept; and more than one slice read."""
    import dpsql.engine.spark as spark_engine
    from dpsql.engine import EngineSettings

    backend = spark_engine.SparkBackend(None, EngineSettings())
    try:
        n = 300
        t = pa.table({"i": pa.array(range(n), pa.int64()),
                      "txt": pa.array([None if i % 7 == 0 else "x" * (i % 50) + str(i) for i in range(n)]),
                      "dec": pa.array([decimal.Decimal(i).scaleb(-2) for i in range(n)], pa.decimal128(9, 2)),
                      "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)]),
                      "ts": pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, i) for i in range(n)], pa.timestamp("us")),
                      "x": pa.array([math.nan if i % 11 == 0 else i / 3 for i in range(n)]),
                      "lst": pa.array([[i, None] for i in range(n)], pa.list_(pa.int64())),
                      "st": pa.array([{"a": i, "b": None} for i in range(n)],
                                     pa.struct([("a", pa.int64()), ("b", pa.string())])),
                      "m": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64()))})
        df = backend.spark.createDataFrame(t).repartition(3, "i")
        whole = df.toArrow()
        reads = []
        partitions = spark_engine._arrow_partitions
        monkeypatch.setattr(spark_engine, "_max_result_size", lambda df: 40_000)  # about 25 KB a partition
        monkeypatch.setattr(spark_engine, "_arrow_partitions", lambda df: reads.append(1) or partitions(df))
        sliced = spark_engine._arrow_in_slices(df)
        assert sliced.schema == whole.schema
        assert repr(sliced.sort_by("i").to_pylist()) == repr(whole.sort_by("i").to_pylist())  # (NaN spelled alike)
        assert len(reads) > 3  # not vacuous: more than one slice of the 3 partitions
    finally:
        backend.close()
