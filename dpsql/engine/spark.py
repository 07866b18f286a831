"""The Apache Spark execution backend: the same bounded plans, run by Spark SQL.

Implements :class:`dpsql.engine.base.ExecutionBackend` over a ``pyspark`` SparkSession (the
caller's, or one this backend starts for ``[engine] master``: ``local[2]``,
``spark://host:7077``, ...). Its building blocks are :class:`dpsql.engine.spark_ops.SparkOps`;
every AST is lowered to its Spark form (:func:`dpsql.engine.spark_ops.lower_for_spark`) and
rendered strictly for Spark. Noise, thresholds, rounding, post-processing and the ledger run on
the driver exactly as with DuckDB: only the bounded aggregates leave the cluster, as Arrow.

Privacy claims of this module (as ``dpsql.engine.duckdb``'s; threat model: docs/threat_model.md):

* **Its own SQL settings.** The backend works in ``spark.newSession()``: its temp views and SQL
  settings are its own (the caller's session is untouched). It sets ANSI mode on (an overflow,
  a failed cast, a division by zero is an error, never a silently different value: the
  lowering guards every operation that could fail on a value), the session time zone to UTC
  (TIMESTAMP_NTZ converts exactly), and Parquet's calendar rebasing and the datetime parser
  policy to CORRECTED (Spark's default EXCEPTION mode raises on some old dates, a failure that
  would depend on a row).
* **Plans from the query alone.** Every private read is planned with :data:`PLAN_CONF` (checked
  and set again before each read): no Adaptive Query Execution (it re-planned from the shuffled
  rows' sizes: an empty stage emptied its join), no broadcast chosen by a side's estimated size,
  no cost-based optimisation, runtime Bloom filter or dynamic partition pruning, no Parquet
  statistics, and an Arrow table's rows never read by the optimizer
  (:data:`LOCAL_RELATION_RULES`). Shuffles keep ``spark.sql.shuffle.partitions`` partitions:
  the cluster's default parallelism unless the owner's Spark configuration sets it.
* **No Spark text reaches the caller.** Any failure while reading private data is the one
  generic :func:`private_failure` (Spark's message, scrubbed, only in the owner's debug mode),
  raised outside the ``except`` block. Spark logs a failing query's message (which can quote a
  value) through log4j on the driver and executors and through PySpark's query-context
  loggers: this backend sets the SparkContext's log level to OFF and disables those loggers.
  Executors of a standalone cluster log to their own work directories, which the data owner
  controls (docs/spark.md).
* **Limits.** The statement time-out cancels the query's Spark job group after a fixed number
  of seconds (the charge stands, the error is the generic one). Memory and threads are the
  cluster's configuration (``spark.executor.memory``, cores), not per query settings; the
  owner's ``memory_limit`` and ``threads`` apply to the driver's DuckDB, which post-processes.
* **Sources are read totally, where Spark allows.** Parquet paths and globs (a local glob is
  expanded once, at registration; ``file://`` and other URI schemes Spark is configured for
  are passed to Spark as given) and Arrow tables; text and binary values over
  ``max_text_bytes`` are NULL, and so are dates and timestamps outside 290000 BC .. 294000
  (as DuckDB's reader: near the ends of the range date functions would leave it); text that
  is not valid UTF-8 is NULL at the top of a column (as DuckDB's default ``invalid_text = "null"``;
  Spark itself keeps the bytes; inside a nested value it is kept). Differences from DuckDB's reader (docs/spark.md): the schema is the first file's
  (files that disagree on a column's type are refused at registration). Nested values are capped as
  DuckDB caps them (:func:`_nested_read`): text and binary inside structs, lists and maps over
  ``max_text_bytes`` are NULL (a map holding such a key is NULL as a whole), and a list or map whose
  size (elements at every depth plus the bytes of the texts inside) is over ``max_list_size`` is NULL,
  tested from stored lengths one depth at a time before the value is read (:func:`_size_guard`).
  A Parquet DECIMAL is read totally at any depth, decided from the footers: read as what stores it and
  converted where Spark's reader would check its precision, refused where no reader reads it totally
  (``decimal_storage_problem``: variable-length BINARY, more than 16 bytes; a map holding one). CSV files and DuckDB tables are DuckDB-only source kinds: a
  ConfigError at registration.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from sqlglot import exp

from dpsql import _inherited as inherited
from dpsql.engine import _duckdb_native as native
from dpsql.engine._duckdb_sources import (
    DATE_MAX_DAY,
    DATE_MIN_DAY,
    TS_MAX_US,
    TS_MIN_US,
    _expand,
    _partial_parquet,
    _zero_bytes,
    decimal_storage_problem,
)
from dpsql.engine.base import (
    DOMAIN_RELATION,
    DomainRelation,
    EngineSettings,
    SqlOps,
    private_failure,
    scrub,
    source_name,
    view_column,
    with_read_salt,
)
from dpsql.engine.duckdb import DuckDBBackend, _Inherited, inherited_refusal
from dpsql.engine.spark_ops import SPARK, SparkOps, lower_for_spark, spark_type
from dpsql.errors import ConfigError, ExecutionError, InputUnavailableError, QueryTypeError
from dpsql.rewrite.render import render

__all__ = ["SparkBackend", "duckdb_type", "spark_session"]

#: Spark SQL settings of dpsql's own session (see the module docstring)
SQL_CONF = {
    "spark.sql.ansi.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.legacy.timeParserPolicy": "CORRECTED",
    "spark.sql.caseSensitive": "false",
    # the parser of dpsql's own SQL: a caller's session started with ANSI's reserved keywords enforced
    # (``spark.sql.ansi.enforceReservedKeywords``, inherited by ``newSession()``) refused dpsql's
    # generated SQL, and double-quoted identifiers would change what a quoted literal means
    "spark.sql.ansi.enforceReservedKeywords": "false",
    "spark.sql.ansi.doubleQuotedIdentifiers": "false",
    # the text of dpsql's SQL is read as written: Spark substituted ``${name}``, ``${system:name}`` and
    # ``${env:name}`` in it (on by default), so a text literal of the analyst's or a declared key became a
    # Spark setting, a system property or an environment variable of the driver; and a caller's session with
    # Spark 1.6's literals (``escapedStringLiterals``) read the backslashes of the rendered literals otherwise
    "spark.sql.variable.substitute": "false",
    "spark.sql.parser.escapedStringLiterals": "false",
    "spark.sql.parquet.inferTimestampNTZ.enabled": "true",
    # Parquet types read as stored, as the DuckDB engine reads them: a BINARY column is BLOB (a caller's
    # ``binaryAsString`` made it text, grouped where DuckDB refuses), an INT96 one a timestamp (else unreadable)
    "spark.sql.parquet.binaryAsString": "false",
    "spark.sql.parquet.int96AsTimestamp": "true",
    # DECIMAL arithmetic keeps its operands' scale (never rounds a value to fit 38 digits): the
    # exact negation of a wide DECIMAL (``spark_ops._decimal_sign_lowered``) relies on it
    "spark.sql.decimalOperations.allowPrecisionLoss": "false",
}

#: the rules of Spark's optimizer that read an Arrow table's rows while planning (an Arrow source is a
#: ``LocalRelation``, its rows held in the plan): filters and projections evaluated over the rows, and a
#: result found empty folded into an empty relation, so one person's row made the plan of a read
#: (and the driver's work) differ
LOCAL_RELATION_RULES = ("org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation",
                        "org.apache.spark.sql.catalyst.optimizer.PropagateEmptyRelation")

#: Spark SQL settings that make the physical plan of a private read a function of the query and the
#: sources' schemas alone (docs/threat_model.md, "Spark"): set on dpsql's session and checked again
#: before every private read (a setting changed on ``SparkBackend.spark`` meanwhile is set back)
PLAN_CONF = {
    # Adaptive Query Execution re-plans between stages from the shuffled rows' sizes: a stage with
    # no row empties its join or aggregate, a small one is broadcast, partitions are coalesced by
    # bytes and skewed ones split. Off: every shuffle has ``spark.sql.shuffle.partitions`` partitions
    "spark.sql.adaptive.enabled": "false",
    # no join is broadcast by its side's estimated size (a Parquet file's bytes, an Arrow table's row
    # count); with sort-merge preferred, every equi-join is a sort-merge join
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.join.preferSortMergeJoin": "true",
    # no plan from statistics: cost-based join order, runtime Bloom filters and dynamic partition
    # pruning are chosen from estimated sizes
    "spark.sql.cbo.enabled": "false",
    "spark.sql.cbo.joinReorder.enabled": "false",
    "spark.sql.cbo.planStats.enabled": "false",
    "spark.sql.cbo.starSchemaDetection": "false",
    "spark.sql.optimizer.runtime.bloomFilter.enabled": "false",
    "spark.sql.optimizer.dynamicPartitionPruning.enabled": "false",
    # no Parquet row group is skipped by its statistics (min and max of the private rows): a filter
    # pushed into the reader made one person's extreme value switch on the read of their row group
    # (the DuckDB engine's ``STATISTICS_OPTIMIZERS``); no aggregate is answered from a footer's
    "spark.sql.parquet.filterPushdown": "false",
    "spark.sql.parquet.recordLevelFilter.enabled": "false",
    "spark.sql.parquet.aggregatePushdown": "false",
    # a file whose read fails (damaged, or gone since the listing) fails the query, as on the DuckDB engine: with
    # these on (a caller's session, spark-defaults.conf) Spark skipped the rest of the file and the query released
    # an answer over the other files' rows
    "spark.sql.files.ignoreCorruptFiles": "false",
    "spark.sql.files.ignoreMissingFiles": "false",
    # the vectorized reader reads a wide DECIMAL of an atomic table as DECIMAL(38, s) (``SparkBackend._widened_from``)
    "spark.sql.parquet.enableVectorizedReader": "true",
    # an unqualified function name is Spark's own: no SQL PATH (a ``SET PATH`` or ``spark.sql.defaultPath`` naming a
    # schema first made its persistent ``least`` stand in for the bounding's LEAST, as a caller's DuckDB macro does),
    # and a session's temporary functions and UDFs after the built-in ones
    "spark.sql.path.enabled": "false",
    "spark.sql.defaultPath": "",
    "spark.sql.functionResolution.sessionOrder": "second",
}

_QUIET_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger", "py4j", "py4j.java_gateway",
                  "py4j.clientserver")


def _require_pyspark() -> Any:
    try:
        import pyspark
        from pyspark.sql import SparkSession
    except ImportError:
        raise ConfigError("the Spark engine needs pyspark, which is not installed",
                          hint="pip install 'dpsql[spark]' (pyspark 4, Java 17)") from None
    major = int(str(pyspark.__version__).split(".")[0])
    if major < 4:
        raise ConfigError(f"the Spark engine needs pyspark 4, found {pyspark.__version__}",
                          hint="pip install 'dpsql[spark]'")
    return SparkSession


#: The compiled-class cache of a session dpsql starts (``spark.sql.codegen.cache.maxEntries``; Spark's default 100).
CODEGEN_CACHE_ENTRIES = 2000


def local_conf(master: str) -> dict[str, str]:
    """Settings of a local SparkContext that dpsql starts itself (:func:`spark_session`), for speed only:
    a fixed number of shuffle partitions (twice the master's threads) instead of Spark's 200, which in
    local mode made every shuffle run 200 tasks over small data. Fixed by the master, never by the data.
    A caller's session, or a cluster's, keeps its own settings."""
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", master.strip())
    if m is None:
        return {}
    n = m.group(1)
    threads = 1 if n is None else (os.cpu_count() or 1) if n == "*" else int(n)
    return {"spark.sql.shuffle.partitions": str(max(2, 2 * threads))}


def spark_session(master: str | None = None, memory: str | None = None) -> Any:
    """A SparkSession for ``master`` (default ``local[2]``): the process's active one if it runs
    on that master, else a new one (Spark allows one SparkContext per process). ``memory``: the
    driver JVM's heap (in local mode it runs the executors too), e.g. the owner's memory_limit."""
    session_cls = _require_pyspark()
    master = master or "local[2]"
    active = session_cls.getActiveSession()
    if active is not None:
        running = active.sparkContext.master
        if running != master:
            raise ConfigError(f"this process already runs a SparkContext on {running!r}, not {master!r}",
                              hint="one SparkContext per process: pass spark=<that session> or use its master")
        return active
    builder = (session_cls.builder.master(master).appName("dpsql")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
               .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
               # Spark keeps the classes it compiled for a query's operators, 100 by default; a bounded query
               # compiles 20-170, so a few shapes evicted each other and a query run again compiled anew
               # (about a tenth of the CPU of a session's repeated shapes). Speed only: no result changes.
               .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES)))
    heap = False
    if memory is not None:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B\s*", memory, re.I)
        if m:
            mib = float(m.group(1)) * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
            builder = builder.config("spark.driver.memory", f"{max(512, int(mib))}m")
            heap = True
    if master.startswith("spark://"):
        builder = builder.config("spark.driver.host", os.environ.get("DPSQL_SPARK_DRIVER_HOST", "127.0.0.1"))
    for k, v in local_conf(master).items():
        builder = builder.config(k, v)
    failure: ConfigError | None = None
    try:
        return builder.getOrCreate()
    except Exception as e:  # noqa: BLE001 - Spark's (Java) text is not the caller's words; the class only
        # e.g. a spark:// master that does not answer: Spark gives up after its registration retries (about 60 s)
        failure = ConfigError(f"cannot start a Spark session on the master {master!r} ({type(e).__name__}); nothing "
                              "was charged",
                              hint="check [engine] master (Session(engine={'kind': 'spark', 'master': ...})): that the "
                                   "master runs and answers at this host and port (spark://host:7077), or use "
                                   "\"local[2]\"; that Java 17 is installed"
                                   + (f"; and that [engine] memory_limit ({memory}, the driver's heap) fits this "
                                      "machine's memory" if heap else ""))
    raise failure


_SIMPLE = {
    "boolean": "BOOLEAN", "tinyint": "TINYINT", "byte": "TINYINT", "smallint": "SMALLINT", "short": "SMALLINT",
    "int": "INTEGER", "integer": "INTEGER", "bigint": "BIGINT", "long": "BIGINT", "float": "FLOAT",
    "double": "DOUBLE", "string": "VARCHAR", "date": "DATE", "timestamp_ntz": "TIMESTAMP",
    "timestamp": "TIMESTAMP WITH TIME ZONE", "binary": "BLOB", "void": '"NULL"',
}


def duckdb_type(spark_simple: str) -> str:
    """DuckDB's name for a Spark type (``DataType.simpleString()``): dpsql's catalog and typer
    speak DuckDB's type names. Types without a total comparison keep their own name (the typer
    treats them as 'other': IS [NOT] NULL only)."""
    t = spark_simple.strip().lower()
    m = re.fullmatch(r"decimal\((\d+),(\d+)\)", t)
    if m:
        return f"DECIMAL({m.group(1)},{m.group(2)})"
    if t.startswith("string collate"):
        return "VARCHAR" if t.endswith("utf8_binary") else t.upper()
    if re.fullmatch(r"time\(\d\)", t):  # Spark's TIME(p) (an Arrow time64 column): DuckDB's TIME, as it is named
        return "TIME"  # in refusals (the typer read both alike; the messages said TIME(6) on Spark only)
    return _SIMPLE.get(t, t.upper())


def _collated(spark_simple: str) -> bool:
    """Whether a Spark type's simple string is text under a collation other than the binary one."""
    t = spark_simple.strip().lower()
    return t.startswith("string collate") and not t.endswith("utf8_binary")


def _without_views(t: pa.DataType) -> pa.DataType:
    """``t`` with Arrow's view layouts of text and binary (``string_view``, ``binary_view``: pyarrow's reading of
    Parquet files that arrow-rs writers made, e.g. tpchgen-cli's, Polars', DataFusion's), at any depth, as their large
    forms, which pyspark reads: the same values (DuckDB's reader reads both alike)."""
    T = pa.types
    if T.is_string_view(t):
        return pa.large_string()
    if T.is_binary_view(t):
        return pa.large_binary()
    if T.is_list(t) or T.is_large_list(t) or T.is_fixed_size_list(t):
        inner = _without_views(t.value_type)
        if inner == t.value_type:
            return t
        field = t.value_field.with_type(inner)
        return (pa.list_(field) if T.is_list(t) else pa.large_list(field) if T.is_large_list(t)
                else pa.list_(field, t.list_size))
    if T.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        new = [f.with_type(_without_views(f.type)) for f in fields]
        return t if new == fields else pa.struct(new)
    if T.is_map(t):
        k, v = _without_views(t.key_type), _without_views(t.item_type)
        return t if (k, v) == (t.key_type, t.item_type) else pa.map_(t.key_field.with_type(k), t.item_field.with_type(v))
    return t


def _micros_or_null(column: Any, t: pa.TimestampType) -> Any:
    """A timestamp column in seconds or milliseconds as microseconds (time zone kept): exact inside
    DuckDB reader's range (``TS_MIN_US`` .. ``TS_MAX_US``), NULL outside it, as DuckDB reads it."""
    import pyarrow.compute as pc

    f = 1_000_000 if t.unit == "s" else 1_000
    lo, hi = -((-TS_MIN_US) // f), TS_MAX_US // f
    v = column.cast(pa.int64())
    inside = pc.and_(pc.greater_equal(v, lo), pc.less_equal(v, hi))
    us = pc.multiply(pc.min_element_wise(pc.max_element_wise(v, lo), hi), f)  # clamped: cannot overflow
    return pc.if_else(inside, us, pa.scalar(None, pa.int64())).cast(pa.timestamp("us", tz=t.tz))


def _micros_from_nanos(column: Any, t: Any) -> Any:
    """A timestamp column in nanoseconds as microseconds (time zone kept), rounded down as DuckDB's reader
    rounds them: every nanosecond instant has one. pyspark's own conversion failed (ArrowInvalid) on a value in
    the last microsecond above -2^63 ns (1677-09-21 00:12:43.145224), so one such row made the table's
    registration fail on Spark only."""
    import pyarrow.compute as pc

    v = column.cast(pa.int64())
    q = pc.divide(v, 1_000)  # toward zero; |q * 1000| <= |v|: no overflow
    below = pc.greater(pc.multiply(q, 1_000), v)  # a negative value with a fraction: one microsecond lower
    out = pc.if_else(below, pc.subtract(q, 1), q)
    return out.cast(pa.duration("us") if pa.types.is_duration(t) else pa.timestamp("us", tz=t.tz))


def _duration_micros(column: Any, t: pa.DurationType) -> Any:
    """A duration column in seconds, milliseconds or nanoseconds as microseconds, as DuckDB reads it into an INTERVAL
    of microseconds: nanoseconds rounded down (:func:`_micros_from_nanos`), seconds and milliseconds NULL beyond the
    64-bit microseconds. pyspark's own conversion raised (ArrowInvalid) on a nanosecond value with a fraction of a
    microsecond and on seconds beyond that range, so one row decided whether the table registered on Spark."""
    import pyarrow.compute as pc

    if t.unit == "ns":
        return _micros_from_nanos(column, t)
    f = 1_000_000 if t.unit == "s" else 1_000
    lo, hi = -(2**63 // f), (2**63 - 1) // f
    v = column.cast(pa.int64())
    inside = pc.and_(pc.greater_equal(v, lo), pc.less_equal(v, hi))
    us = pc.multiply(pc.min_element_wise(pc.max_element_wise(v, lo), hi), f)  # clamped: cannot overflow
    return pc.if_else(inside, us, pa.scalar(None, pa.int64())).cast(pa.duration("us"))


def _days_or_null(column: Any) -> Any:
    """An Arrow ``date64`` column (milliseconds) as ``date32`` days, rounded down, NULL outside
    ``DATE_MIN_DAY`` .. ``DATE_MAX_DAY`` (as DuckDB's reader: ``_duckdb_sources._arrow_plan``)."""
    import pyarrow.compute as pc

    day = 86_400_000
    lo, hi = DATE_MIN_DAY * day, DATE_MAX_DAY * day + day - 1
    v = column.cast(pa.int64())
    inside = pc.and_(pc.greater_equal(v, lo), pc.less_equal(v, hi))
    days = pc.add(pc.divide(pc.subtract(pc.min_element_wise(pc.max_element_wise(v, lo), hi), lo), day), DATE_MIN_DAY)
    return pc.if_else(inside, days, pa.scalar(None, pa.int64())).cast(pa.int32()).cast(pa.date32())


def _decimal_from_bytes(ref: exp.Expression, p: int, s: int, length: int) -> exp.Expression:
    """A Parquet DECIMAL(p, s) read as its stored bytes (a FIXED_LEN_BYTE_ARRAY of ``length`` >= 9 bytes: a
    big-endian two's complement integer) as DECIMAL(p, s): the exact value where that integer has at most p
    digits, else NULL, as DuckDB's reader makes it.

    Whether it has is decided first, from the bytes alone: they compare unsigned, so the integers from 0 to
    10^p - 1 are the byte strings up to that one's bytes, and those from -(10^p - 1) to -1 the strings from that
    one's bytes on. Inside, the integer is built from its last ``min(length, 16)`` bytes, which then hold it: an
    unsigned high part (at most 8 bytes) and the unsigned last 8 bytes, each read through ``hex`` and ``conv`` as
    at most 20 digits; a negative integer from its magnitude's parts, so that no step's value exceeds the
    result's magnitude, below 10^38. Every operation is also its ``try_`` form: nothing here can raise, in
    whichever order Spark evaluates the branches, with ANSI mode on or off."""
    call = exp.Anonymous
    d20 = exp.DataType.build("DECIMAL(20,0)", dialect=SPARK)

    def number(v: int) -> exp.Expression:
        return exp.Cast(this=exp.Literal.string(str(v)), to=d20.copy())

    def stored(v: int) -> exp.Expression:
        return call(this="unhex", expressions=[exp.Literal.string(v.to_bytes(length, "big", signed=True).hex())])

    def unsigned(start: int, n: int) -> exp.Expression:  # bytes start .. start + n - 1 (1-based)
        part = call(this="substring", expressions=[ref.copy(), exp.Literal.number(start), exp.Literal.number(n)])
        digits = call(this="conv", expressions=[call(this="hex", expressions=[part]), exp.Literal.number(16),
                                                 exp.Literal.number(10)])
        return exp.TryCast(this=digits, to=d20.copy(), safe=True)

    def op(name: str, a: exp.Expression, b: exp.Expression) -> exp.Expression:
        return call(this=f"try_{name}", expressions=[a, b])

    k = min(length, 16) - 8  # bytes of the high part
    hi, lo, two64 = unsigned(length - 7 - k, k), unsigned(length - 7, 8), 2**64
    positive = op("add", op("multiply", hi, number(two64)), lo)
    magnitude = op("add", op("multiply", op("subtract", number(2 ** (8 * k) - 1), hi.copy()), number(two64)),
                   op("subtract", number(two64), lo.copy()))
    negative = op("subtract", number(0), magnitude)
    most = 2 ** (8 * length - 1) - 1  # the bytes' own range: a DECIMAL(p) whose p digits it does not reach
    top = min(10**p - 1, most)
    unscaled = exp.Case(ifs=[exp.If(this=exp.LTE(this=ref.copy(), expression=stored(top)), true=positive),
                             exp.If(this=exp.GTE(this=ref.copy(), expression=stored(-top - (top == most))),
                                    true=negative)])
    value: exp.Expression = unscaled
    if s:  # the integer times 10^-s: exact in DECIMAL(38, s), where a value of at most p <= 38 digits fits
        unit = exp.Cast(this=exp.Literal.string("0." + "0" * (s - 1) + "1"),
                        to=exp.DataType.build(f"DECIMAL({s},{s})", dialect=SPARK))
        value = op("multiply", unscaled, unit)
    return exp.TryCast(this=value, to=exp.DataType.build(f"DECIMAL({p},{s})", dialect=SPARK), safe=True)


def _sign_extended(ref: exp.Expression, length: int = 16) -> exp.Expression:
    """A big-endian two's complement integer of at most ``length`` bytes as exactly ``length`` bytes (the same
    integer): padded on the left with its sign's bytes. Total (``lpad`` of bytes; an empty value is 0)."""
    unhex = exp.Anonymous(this="unhex", expressions=[exp.Literal.string("80")])
    sign = exp.Case(ifs=[exp.If(this=exp.LT(this=ref.copy(), expression=unhex),
                                true=exp.Anonymous(this="unhex", expressions=[exp.Literal.string("00")]))],
                    default=exp.Anonymous(this="unhex", expressions=[exp.Literal.string("FF")]))
    return exp.Anonymous(this="lpad", expressions=[ref.copy(), exp.Literal.number(length), sign])


#: how a nested DECIMAL(p, s) is stored in every file: (p, s) -> Parquet physical type (``SparkBackend._nested_stored``)
Stored = Mapping[tuple[int, int], str]

_READ_AS = {"FIXED_LEN_BYTE_ARRAY": "binary", "INT32": "int", "INT64": "bigint"}


def _stored_type(t: Any, stored: Stored) -> Any:
    """A Spark type with every DECIMAL inside it read as what stores it: its bytes (BINARY) or its integer."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        DecimalType,
        IntegerType,
        LongType,
        StructField,
        StructType,
    )

    if isinstance(t, DecimalType):
        kind = stored.get((t.precision, t.scale))
        return {"binary": BinaryType(), "int": IntegerType(), "bigint": LongType()}[_READ_AS[kind]] if kind else t
    if isinstance(t, StructType):
        return StructType([StructField(f.name, _stored_type(f.dataType, stored), True) for f in t.fields])
    if isinstance(t, ArrayType):
        return ArrayType(_stored_type(t.elementType, stored), True)
    return t  # (a map holding a DECIMAL is refused: SparkBackend._nested_stored)


def _decimal_from_integer(ref: exp.Expression, p: int, s: int) -> exp.Expression:
    """A DECIMAL(p, s) read as its stored INT32 / INT64 as DECIMAL(p, s): exact within p digits, else NULL. Total."""
    top = exp.Literal.number(10 ** min(p, 19) - 1) if p < 19 else None
    wide = exp.Cast(this=ref.copy(), to=exp.DataType.build("DECIMAL(20,0)", dialect=SPARK))
    value: exp.Expression = wide
    if s:
        unit = exp.Cast(this=exp.Literal.string("0." + "0" * (s - 1) + "1"),
                        to=exp.DataType.build(f"DECIMAL({s},{s})", dialect=SPARK))
        value = exp.Anonymous(this="try_multiply", expressions=[wide, unit])
    cast = exp.TryCast(this=value, to=exp.DataType.build(f"DECIMAL({p},{s})", dialect=SPARK), safe=True)
    if top is None:  # 19 digits or more hold every INT64
        return cast
    inside = exp.Between(this=ref.copy(), low=exp.Neg(this=top.copy()), high=top)
    return exp.Case(ifs=[exp.If(this=inside, true=cast)])


def _f(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


def _lambda(body: exp.Expression, *names: str) -> exp.Expression:
    return exp.Lambda(this=body, expressions=[exp.to_identifier(n) for n in names])


def _is_text(t: Any) -> bool:
    """Whether the Spark type ``t`` is text or binary: its values' cost is their stored length (``octet_length``)."""
    from pyspark.sql.types import BinaryType, CharType, StringType, VarcharType

    return isinstance(t, (StringType, CharType, VarcharType, BinaryType))


def _zero(e: exp.Expression) -> exp.Expression:
    """``e``, 0 where NULL, as a BIGINT (sums of sizes never overflow an INT under ANSI mode)."""
    return _f("coalesce", e, exp.Cast(this=exp.Literal.number(0), to=exp.DataType.build("BIGINT", dialect=SPARK)))


def _size_levels(e: exp.Expression, t: Any, depth: int) -> list[exp.Expression]:
    """The size of the value ``e`` of Spark type ``t`` by depth, as ``_duckdb_sources._levels`` counts it: the first
    term the elements of its outermost arrays and maps (with the bytes of the texts beside them), each next term the
    elements and bytes one level deeper; each term reads only the elements the terms before it counted (``size`` of
    an array or map, ``octet_length`` of a text, summed by ``aggregate``), never a value as text. NULL counts 0."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if _is_text(t):
        return [_f("octet_length", e)]
    if isinstance(t, StructType):
        per = [_size_levels(exp.Bracket(this=e.copy(), expressions=[exp.Literal.string(f.name)]), f.dataType, depth)
               for f in t.fields]
        return [_sum([_zero(p[j]) for p in per if len(p) > j]) for j in range(max((len(p) for p in per), default=0))]
    var, acc = f"_dpsql_s{depth}", f"_dpsql_a{depth}"

    def over(items: exp.Expression, child: Any) -> list[exp.Expression]:
        zero = exp.Cast(this=exp.Literal.number(0), to=exp.DataType.build("BIGINT", dialect=SPARK))
        return [_f("aggregate", items, zero, _lambda(
            exp.Add(this=exp.column(acc), expression=_zero(term)), acc, var))
            for term in _size_levels(exp.column(var), child, depth + 1)]

    if isinstance(t, ArrayType):
        return [_f("size", e.copy()), *over(e, t.elementType)]
    if isinstance(t, MapType):
        keys, values = over(_f("map_keys", e.copy()), t.keyType), over(_f("map_values", e.copy()), t.valueType)
        return [_f("size", e.copy()), *(_sum([*keys[j:j + 1], *values[j:j + 1]])
                                        for j in range(max(len(keys), len(values))))]
    return []


def _sum(terms: list[exp.Expression]) -> exp.Expression:
    total = terms[0]
    for term in terms[1:]:
        total = exp.Add(this=total, expression=term)
    return total


def _size_guard(e: exp.Expression, t: Any, cap: int, value: exp.Expression, depth: int) -> exp.Expression:
    """``value``, or NULL when the array or map ``e`` is over ``cap`` in size (:func:`_size_levels`), as
    ``_duckdb_sources._size_guard``: nested ``CASE``s, one per depth, so a value is read one depth further only
    while the depths before are within the cap (Spark evaluates a ``THEN`` only on the rows whose condition
    holds, and its subexpression elimination hoists nothing out of a branch that may not run)."""
    terms = [_zero(term) for term in _size_levels(e, t, depth)]
    out = value
    for j in reversed(range(len(terms))):
        out = exp.Case(ifs=[exp.If(this=exp.LTE(this=_sum([x.copy() for x in terms[:j + 1]]),
                                                expression=exp.Literal.number(cap)), true=out)])
    return out


def _nested_read(ref: exp.Expression, t: Any, stored: Stored, cap: int | None, list_cap: int | None, where: str,
                 depth: int = 0, inside: bool = False) -> exp.Expression | None:
    """A value of Spark type ``t`` read as the DuckDB engine reads it, or None where it is read as is:

    * a DECIMAL(p, s) read as what stores it (``stored``: :func:`_stored_type`) is the exact value within p
      digits, else NULL, as DuckDB's reader makes it (bytes: by :func:`_decimal_from_bytes` after sign-extending
      them to 16, so any stored length up to 16 converts; an integer: :func:`_decimal_from_integer`);
    * a text or binary value inside a struct, array or map (at any depth) over ``cap`` bytes is NULL, and a map
      holding such a key is NULL as a whole (a key cannot be NULL); a map keyed by another type holding text is
      refused (``ConfigError``, as the DuckDB engine refuses it);
    * an array or map (not ``inside`` another) whose size is over ``list_cap`` is NULL (:func:`_size_guard`);
    * structs are rebuilt field by field (a NULL struct stays NULL), arrays element by element (``transform``),
      maps value by value (``transform_values``).

    Total: no step can raise on any stored value. (Top-level text is capped by ``SparkBackend._capped_select``.)"""
    from pyspark.sql.types import ArrayType, DecimalType, MapType, StructType

    if isinstance(t, DecimalType):
        kind = stored.get((t.precision, t.scale))
        if kind is None:
            return None
        if kind == "FIXED_LEN_BYTE_ARRAY":
            return _decimal_from_bytes(_sign_extended(ref), t.precision, t.scale, 16)
        return _decimal_from_integer(ref, t.precision, t.scale)
    if _is_text(t):
        if cap is None:
            return None
        return exp.Case(ifs=[exp.If(this=exp.LTE(this=_f("octet_length", ref.copy()), expression=exp.Literal.number(cap)),
                                    true=ref.copy())])
    if isinstance(t, StructType):
        parts = [(f.name, exp.Bracket(this=ref.copy(), expressions=[exp.Literal.string(f.name)]), f.dataType)
                 for f in t.fields]
        built = [(n, sub, _nested_read(sub, ft, stored, cap, list_cap, where, depth + 1, inside)) for n, sub, ft in parts]
        if all(b is None for _, _, b in built):
            return None
        args: list[exp.Expression] = []
        for n, sub, b in built:
            args += [exp.Literal.string(n), b if b is not None else sub]
        return exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Is(this=ref.copy(), expression=exp.Null())),
                                    true=_f("named_struct", *args))])
    out: exp.Expression | None = None
    if isinstance(t, MapType) and not _is_text(t.keyType) and _nested_read(
            exp.column("k"), t.keyType, stored, cap, None, where, depth + 1, True) is not None:
        raise ConfigError(f"column {where} has type {t.simpleString()}: values inside its keys cannot be capped at "
                          "max_text_bytes",
                          hint="store it as a list of structs, or leave the column out of the source")
    if not inside and list_cap is not None and cap is not None and list_cap <= cap:
        cap = None  # every text inside a value within list_cap is within cap: its size counts the text's bytes
    if isinstance(t, ArrayType):
        var = f"_dpsql_e{depth}"
        body = _nested_read(exp.column(var), t.elementType, stored, cap, list_cap, where, depth + 1, True)
        if body is not None:
            out = _f("transform", ref.copy(), _lambda(body, var))
    elif isinstance(t, MapType):
        key, var = f"_dpsql_k{depth}", f"_dpsql_v{depth}"
        keys = _nested_read(exp.column(key), t.keyType, stored, cap, list_cap, where, depth + 1, True)
        body = _nested_read(exp.column(var), t.valueType, stored, cap, list_cap, where, depth + 1, True)
        if body is not None:
            out = _f("transform_values", ref.copy(), _lambda(body, key, var))
        if keys is not None:  # a key over the cap: the map is NULL
            short = exp.LTE(this=_f("octet_length", exp.column(key)), expression=exp.Literal.number(cap or 0))
            out = exp.Case(ifs=[exp.If(this=_f("forall", _f("map_keys", ref.copy()), _lambda(short, key)),
                                       true=out if out is not None else ref.copy())])
    else:
        return None
    if inside or list_cap is None:
        return out
    return _size_guard(ref, t, list_cap, out if out is not None else ref.copy(), depth)


def _holds_decimal(t: Any) -> bool:
    return "decimal(" in t.simpleString()


def _map_holds_decimal(t: Any) -> bool:
    """Whether a map inside (or at) the Spark type ``t`` holds a DECIMAL (key or value, at any depth)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(t, MapType):
        return _holds_decimal(t)
    if isinstance(t, ArrayType):
        return _map_holds_decimal(t.elementType)
    if isinstance(t, StructType):
        return any(_map_holds_decimal(f.dataType) for f in t.fields)
    return False


def _holds_unconverted(t: pa.DataType) -> bool:
    """Whether a nested Arrow type holds a timestamp in seconds or milliseconds, or a date64."""
    if pa.types.is_timestamp(t):
        return t.unit in ("s", "ms")
    if pa.types.is_date64(t):
        return True
    if pa.types.is_dictionary(t):
        return _holds_unconverted(t.value_type)
    return any(_holds_unconverted(t.field(i).type) for i in range(t.num_fields))


def _stopped(spark: Any) -> bool:
    """Whether ``spark`` (a classic SparkSession) can run no job: its SparkContext was stopped (``spark.stop()``,
    a master that gave up the application) or the driver JVM cannot be reached."""
    try:
        return spark.sparkContext._jsc is None or bool(spark._jsparkSession.sparkContext().isStopped())
    except Exception:  # noqa: BLE001 - the driver JVM cannot be reached (its gateway is closed)
        return True


def _quiet(spark: Any) -> None:
    """Spark's log output carries query text and values: off (see the module docstring)."""
    try:
        spark.sparkContext.setLogLevel("OFF")
    except Exception:  # pragma: no cover - a session without a classic SparkContext
        pass
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).disabled = True
    try:
        from pyspark.logger import PySparkLogger

        for name in _QUIET_LOGGERS[:2]:
            PySparkLogger.getLogger(name).disabled = True
    except Exception:  # pragma: no cover - older layout
        pass



_NANOS_HINT = ("rewrite the column in microseconds (pyarrow: pq.write_table(t, path, coerce_timestamps='us'); DuckDB "
               "writes TIMESTAMP columns in microseconds), or use the DuckDB engine, which reads nanosecond timestamps")


_FLOAT16_HINT = ("rewrite the column as FLOAT or DOUBLE (pyarrow: cast it to pa.float32() before pq.write_table), or use "
                 "the DuckDB engine, which reads FLOAT16 as FLOAT")


def _refuse_nanos(name: str, path: str, schema: Any) -> None:
    """A ConfigError naming the columns of a Parquet file's schema (its footer) stored as TIMESTAMP(NANOS) or FLOAT16,
    which Spark's reader does not read (its schema conversion fails, for every file and row alike)."""
    found: list[str] = []
    halves: list[str] = []
    stack = [(t, "") for t in schema.getFields()]
    while stack:
        t, under = stack.pop()
        at = f"{under}{t.getName()}"
        if not t.isPrimitive():
            stack.extend((c, at + ".") for c in t.asGroupType().getFields())
            continue
        ann = t.getLogicalTypeAnnotation()
        if (ann is not None and str(ann.getClass().getSimpleName()) == "TimestampLogicalTypeAnnotation"
                and str(ann.getUnit().toString()) == "NANOS"):
            found.append(at)
        elif ann is not None and str(ann.getClass().getSimpleName()) == "Float16LogicalTypeAnnotation":
            halves.append(at)
    if halves:
        cols = ", ".join(f"'{c}'" for c in sorted(halves))
        raise ConfigError(f"table '{name}': the Parquet file {path!r} stores {cols} as FLOAT16, which Spark does not "
                          "read", hint=_FLOAT16_HINT)
    if found:
        cols = ", ".join(f"'{c}'" for c in sorted(found))
        raise ConfigError(f"table '{name}': the Parquet file {path!r} stores {cols} as TIMESTAMP(NANOS), which Spark "
                          "does not read", hint=_NANOS_HINT)

class SparkBackend:
    """The Spark execution backend (:class:`dpsql.engine.base.ExecutionBackend`).

    ``spark``: the caller's SparkSession (dpsql works in ``spark.newSession()`` of it), or None
    to use ``settings.master`` (default ``local[2]``). Post-processing of released values runs in
    a private DuckDB on the driver.
    """

    dialect = SPARK
    ops: SqlOps = SparkOps()

    def __init__(self, spark: Any = None, settings: EngineSettings | None = None) -> None:
        self.settings = settings or EngineSettings()
        _require_pyspark()
        base = spark if spark is not None else spark_session(self.settings.master, self.settings.memory_limit)
        if not hasattr(base, "newSession") or not hasattr(base, "sql"):
            raise ConfigError(f"spark must be a pyspark SparkSession, got {type(base).__name__}",
                              hint="Session(engine='spark', spark=SparkSession.builder.getOrCreate())")
        if _stopped(base):  # Spark's newSession() raised its own (Java) error
            raise ConfigError("the SparkSession given to this Session was stopped (spark.stop() stops its "
                              "SparkContext), so it can run no query",
                              hint="pass a running SparkSession (SparkSession.builder.getOrCreate() after the stop "
                                   "starts a new one), and stop it only after the Session is closed")
        self._spark = base.newSession()
        for k, v in SQL_CONF.items():
            self._spark.conf.set(k, v)
        sc = self._spark.sparkContext
        if not sc.getConf().contains("spark.sql.shuffle.partitions"):
            # without AQE no shuffle is coalesced: Spark's 200 partitions per shuffle made each small
            # query schedule hundreds of tasks; one per core (a property of the cluster, never of the
            # data) unless the owner set the number (a local context dpsql starts sets twice its
            # threads, :func:`local_conf`)
            self._spark.conf.set("spark.sql.shuffle.partitions", str(max(1, int(sc.defaultParallelism))))
        self._plan_conf: dict[str, str] = {}
        #: SQL text -> (the session's settings then, its analysed DataFrame) of the bind checks not yet read
        #: (:meth:`_analyzed`, :meth:`fetch_arrow`); emptied whenever a source's views are made or dropped
        self._analysed: dict[str, tuple[dict[str, str], Any]] = {}
        self._pin_plan()
        _quiet(self._spark)
        self._lock: Any = threading.RLock()
        self._pid = os.getpid()  # the process that opened the engine: a forked child refuses its use (_engines_after_fork)
        _ENGINES.add(self)
        self._views: dict[str, str] = {}  # view -> kind
        self._files: dict[str, _Files] = {}  # view -> its local Parquet files as registered (source_changed)
        self._local = DuckDBBackend(None, self.settings)  # post-processing of released values only

    def _pin_plan(self) -> dict[str, str] | None:
        """Set :data:`SQL_CONF` and :data:`PLAN_CONF` (and exclude :data:`LOCAL_RELATION_RULES`, besides the
        rules the session already excludes) wherever dpsql's session says otherwise: one look-up per read. (The
        exact conversions of wide DECIMALs rely on ``allowPrecisionLoss`` off, the totality of expressions on
        ANSI's settings: a change made on ``SparkBackend.spark`` after its start is set back too.) The session's
        settings if none had to be set, else None."""
        conf = self._spark.conf
        now = conf.getAll
        changed = False
        excluded = [r for r in (now.get("spark.sql.optimizer.excludedRules") or "").split(",") if r.strip()]
        want = {**SQL_CONF, **PLAN_CONF}
        if not set(LOCAL_RELATION_RULES) <= {r.strip() for r in excluded}:
            want["spark.sql.optimizer.excludedRules"] = ",".join([*excluded, *LOCAL_RELATION_RULES])
        for k, v in want.items():
            if now.get(k) != self._plan_conf.get(k, v):
                conf.set(k, v)
                changed = True
                if k != "spark.sql.optimizer.excludedRules":
                    self._plan_conf[k] = conf.get(k)  # Spark's spelling of the value (sizes gain a unit)
        return None if changed else dict(now)

    @property
    def spark(self) -> Any:
        """dpsql's own Spark session (a ``newSession()`` of the caller's)."""
        return self._spark

    def render(self, ast: exp.Expression, *, pretty: bool = False) -> str:
        """SQL text of ``ast`` for Spark: lowered (:func:`lower_for_spark`), rendered strictly."""
        return render(lower_for_spark(ast), dialect=self.dialect, pretty=pretty)

    def _detail(self, e: BaseException) -> str | None:
        if not self.settings.debug:
            return None
        return f"{type(e).__name__}: {scrub(str(e))}"

    # -- sources --------------------------------------------------------------------------------
    def register_source(self, name: str, kind: str, source: Any, view: str | None = None,
                        types: dict[str, str] | None = None) -> dict[str, str]:
        """Expose a Parquet path/glob or an Arrow table as a temp view (``view``, default
        ``_dpsql_src_<name>``) of dpsql's Spark session; reads schemas (Parquet footers) only."""
        view = view or source_name(name)
        self.check_connection()  # a stopped session: said as it is, not as a source Spark cannot read
        if kind in ("csv", "duckdb"):
            raise ConfigError(
                f"table '{name}': a {'CSV file' if kind == 'csv' else 'DuckDB table'} is a DuckDB-only source; the "
                "Spark engine reads Parquet files (paths, globs, file:// and the URI schemes Spark is configured for) "
                "and Arrow tables",
                hint="convert the data to Parquet (e.g. COPY (SELECT * FROM t) TO 't.parquet' in DuckDB), or use "
                     "the DuckDB engine",
            )
        if kind not in ("parquet", "arrow"):  # pragma: no cover
            raise ConfigError(f"unknown source kind {kind!r}")
        if types:
            raise ConfigError(f"table '{name}': column types can be declared for CSV sources only ({sorted(types)})",
                              hint="Parquet and Arrow sources carry their own column types")
        failure: ConfigError | None = None
        fields: list[tuple[str, str]] = []
        millis: set[str] = set()
        int96: set[str] = set()
        widened: set[str] = set()
        as_bytes: dict[str, int] = {}
        nested: dict[str, tuple[Any, Stored]] = {}
        with self._lock:
            self._analysed.clear()
            self._views[view] = kind
            try:
                if kind == "parquet":
                    paths = [source] if re.match(r"^[a-z][a-z0-9+.-]*://", str(source)) and not str(source).startswith(
                        "file://") else _expand(str(source).removeprefix("file://"))
                    # the files' version before their footers are read: one replaced meanwhile is refused below
                    first = native.versions(paths) if all(os.path.isfile(p) for p in paths) else None
                    footers = self._footer_schemas(name, paths)
                    if footers is not None:  # every file's schema from its footer, on the driver: no Spark job
                        table_schema = footers[0][1]
                        file_schemas = [m for m, _ in footers]
                    else:  # Spark infers the schema (a job) and the files are checked against it
                        raw = self._spark.read.parquet(*paths)
                        self._check_file_schemas(name, raw)
                        table_schema = raw.schema
                        file_schemas = self._file_schemas(raw) if self._needs_file_schemas(table_schema) else []
                    for m in file_schemas:
                        decimal_storage_problem(name, [d[:4] for d in self._decimal_storage(m)])
                    millis = self._millis_from(name, table_schema, file_schemas)
                    int96 = self._int96_from(table_schema, file_schemas)
                    widened, as_bytes = self._widened_from(table_schema, file_schemas)
                    stored = {**self._nested_stored(name, table_schema, file_schemas),
                              **self._narrow_beside_nested(table_schema, file_schemas)}
                    nested = {f.name: (f.dataType, stored[f.name]) for f in table_schema.fields if f.name in stored}
                    read_as: Any = None
                    if millis or widened or as_bytes or nested or footers is not None:
                        # millis / widened / as_bytes: read as the stored INT64 milliseconds / as DECIMAL(38, s) /
                        # as the stored bytes, see _capped_select
                        from pyspark.sql.types import (
                            BinaryType,
                            DecimalType,
                            LongType,
                            StructField,
                            StructType,
                        )

                        read_as = StructType([
                            StructField(f.name, LongType(), True) if f.name in millis else
                            StructField(f.name, DecimalType(38, f.dataType.scale), True) if f.name in widened else
                            StructField(f.name, BinaryType(), True) if f.name in as_bytes else
                            StructField(f.name, _stored_type(f.dataType, stored[f.name]), True)
                            if f.name in nested else f
                            for f in table_schema.fields])
                        fields = [(f.name, f.dataType.simpleString()) for f in table_schema.fields]
                        raw = self._spark.read.schema(read_as).parquet(*paths)
                else:
                    if not isinstance(source, pa.Table):
                        raise ConfigError(f"table '{name}': an Arrow source must be a pyarrow.Table")
                    raw = self._arrow_frame(name, source)
                raw.createOrReplaceTempView(view + "_raw")
                declared = (table_schema if kind == "parquet" else raw.schema).fields
                if not fields:
                    fields = [(f.name, f.dataType.simpleString()) for f in raw.schema.fields]
                fields = [(n, "timestamp_ntz" if n in int96 else t) for n, t in fields]
                sel = render(self._capped_select(name, view + "_raw", fields, {f.name: f.dataType for f in declared},
                                                 millis, widened, as_bytes, nested, int96), dialect=SPARK)
                self._spark.sql(sel).createOrReplaceTempView(view)
                if kind == "parquet":
                    files = self._files_of(name, paths, raw, first)
                    if files is not None:
                        files.read_as, files.sel = read_as, sel
                        self._files[view] = files
            except ConfigError:
                self.unregister_source(name, kind, view)
                raise
            except Exception as e:  # noqa: BLE001 - Spark's errors come in many classes; the text is withheld
                # an OSError: a file gone or not readable meanwhile (a retry may read it)
                nanos = kind == "parquet" and "TIMESTAMP(NANOS" in str(e)  # a schema's type (read only to say so)
                half = kind == "parquet" and "(FLOAT16)" in str(e)
                if nanos or half:
                    try:  # the columns, named as the footers' path names them (local files)
                        self._nanos_of(name, _expand(str(source).removeprefix("file://")))
                    except ConfigError as named:
                        failure = named
                    except Exception:  # noqa: BLE001 - not local files: the message below, without the columns
                        pass
                # a local file named .parquet of 0 bytes, or whose footer is not there yet: still being written, a
                # retry may read it (an input not there yet, as on DuckDB: exit 66)
                unready = kind == "parquet" and not nanos and not half and _unready(str(source))
                failure = failure or (InputUnavailableError if isinstance(e, OSError) or unready else ConfigError)(
                    f"cannot read table source for '{name}' ({kind}): {type(e).__name__}"
                    + (": a column is stored as Parquet TIMESTAMP(NANOS), which Spark does not read" if nanos else
                       ": a column is stored as Parquet FLOAT16, which Spark does not read" if half else
                       f": {unready} (still being written?)" if unready else ""),
                    hint=_NANOS_HINT if nanos else _FLOAT16_HINT if half else
                    "if a job is writing the file, retry once it is written" if unready else
                    "check that the path exists, is readable by Spark and is valid Parquet"
                    if kind == "parquet" else "check the Arrow table's column types "
                    "(docs/spark.md, Sources), or use the DuckDB engine")
        if failure is not None:
            self.unregister_source(name, kind, view)
            raise failure
        schema = {n.lower(): duckdb_type("string" if _collated(t) else t) for n, t in fields}  # as _capped_select
        if len(schema) != len(fields):
            self.unregister_source(name, kind, view)
            raise ConfigError(f"table '{name}' has column names that differ only by case; dpsql needs them distinct")
        return schema

    def _files_of(self, name: str, paths: list[str], raw: Any, first: native.Version | None) -> _Files | None:
        """A Parquet source's local files with their version and footers' schemas (:meth:`source_changed`):
        ``paths`` themselves where they are files (``first``: their version before their footers were read),
        else the files Spark listed (a directory, ``file://``); None for another URI scheme (not checked)."""
        if first is not None:
            files = [os.path.abspath(p) for p in paths]
        else:
            uris = [str(u) for u in raw.inputFiles()]
            if not uris or not all(u.startswith("file:") for u in uris):
                return None
            files = sorted(_local_path(u) for u in uris)
        version = native.versions(files) if first is None else first
        prints = [_footprint(f) for f in files]
        if native.versions(files) != version:
            raise InputUnavailableError(f"table '{name}': one of its Parquet files changed while it was registered",
                                        hint=f"register '{name}' again once the files are written")
        return _Files(paths, files, version, prints, listed=first is None)

    def source_changed(self, view: str) -> str | None:
        """Why the Parquet files of ``view`` can no longer be read as registered, or None: checked before every
        charge (``catalog.check_sources_unchanged``), from the files' metadata only (a stat of each file; its
        footer only when the stat changed; no row).

        Spark's relation keeps the file listing made at registration (each file's size: a file replaced by a
        longer one was read only up to the old size, its later row groups skipped), and the view reads the
        columns as decided then from the footers (a DECIMAL read as its stored bytes or integer, timestamps in
        milliseconds as their integer: ``register_source``). A file replaced since with the same Parquet schema
        (physical types included) and Spark metadata is read as it now is, through a new relation; another
        schema, a file gone (or a directory now listing other files) is refused, for free."""
        with self._lock:
            return self._refresh(view)

    def _refresh(self, view: str) -> str | None:
        f = self._files.get(view)
        if f is None:
            return None
        try:
            now = native.versions(f.files)
            if now == f.version:
                return None
            prints = [_footprint(p) for p in f.files]
        except native.SpecialFile as e:  # (its footer is never read: a reader would wait on a FIFO for ever)
            return str(e)
        except (OSError, pa.ArrowException):
            return "one of its Parquet files can no longer be read"
        if prints != f.prints:
            return "its Parquet files changed their columns or types"
        try:
            raw = (self._spark.read if f.read_as is None else self._spark.read.schema(f.read_as)).parquet(*f.paths)
            if f.listed and sorted(_local_path(str(u)) for u in raw.inputFiles()) != f.files:
                return "its directory lists other Parquet files"
            self._analysed.clear()
            raw.createOrReplaceTempView(view + "_raw")
            self._spark.sql(f.sel).createOrReplaceTempView(view)
        except Exception:  # noqa: BLE001 - a file Spark can no longer list or read the footer of
            return "one of its Parquet files can no longer be read"
        f.version = now  # a file replaced again meanwhile is found by the read's check after it
        return None

    def _read_files(self, sql: str) -> list[tuple[list[str], native.Version]]:
        """The local Parquet files the query ``sql`` reads, each source's relation made again if they changed,
        with the versions to find again after the read (a file replaced during the read fails it)."""
        out = []
        for view, f in self._files.items():
            if view not in sql:
                continue
            if self._refresh(view) is not None:
                raise OSError("a source file changed its schema")  # the generic failure of the read
            out.append((f.files, f.version))
        return out

    def _arrow_frame(self, name: str, table: pa.Table) -> Any:
        """An Arrow table as a Spark DataFrame (timestamps without a time zone as TIMESTAMP_NTZ).

        Spark converts timestamps in seconds or milliseconds to microseconds while building the
        frame and raises on one value beyond +-2^63 microseconds, and has no Arrow ``date64``: such
        top-level columns are converted here first, as DuckDB's reader converts them (NULL outside
        290000 BC .. 294000, :func:`_micros_or_null`, :func:`_days_or_null`); so are nanoseconds
        (rounded down, :func:`_micros_from_nanos`: pyspark's conversion raised on values near -2^63 ns). Inside a nested
        column, and for a type Spark cannot read, a ConfigError names the column and the fix (a
        property of the schema, never of a value)."""
        from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

        columns = []
        for field, column in zip(table.schema, table.columns, strict=True):
            t = _without_views(field.type)
            if t != field.type:  # the same values, in the layout pyspark reads
                column = column.cast(t)
            if pa.types.is_timestamp(t) and t.unit in ("s", "ms"):
                column = _micros_or_null(column, t)
            elif pa.types.is_timestamp(t) and t.unit == "ns":
                column = _micros_from_nanos(column, t)
            elif pa.types.is_duration(t) and t.unit != "us":
                column = _duration_micros(column, t)
            elif pa.types.is_date64(t):
                column = _days_or_null(column)
            elif _holds_unconverted(t):
                raise ConfigError(f"table '{name}': column '{field.name}' holds timestamps in seconds or milliseconds "
                                  f"or date64 values inside a nested type ({t}), which the Spark engine cannot read "
                                  "totally",
                                  hint="cast them to pa.timestamp('us') and pa.date32() before registering, "
                                       "or use the DuckDB engine")
            else:
                try:
                    from_arrow_type(t, prefer_timestamp_ntz=True)
                except Exception:  # noqa: BLE001 - pyspark raises several classes for an unknown type
                    raise ConfigError(f"table '{name}': column '{field.name}' has the Arrow type {t}, which the "
                                      "Spark engine cannot read",
                                      hint="convert it to a supported type (numbers, text, binary, date32, "
                                           "timestamps, lists, structs) or leave it out, or use the DuckDB engine") \
                        from None
            columns.append(column)
        table = pa.Table.from_arrays(columns, names=table.schema.names)
        schema = from_arrow_schema(table.schema, prefer_timestamp_ntz=True)
        if table.num_rows == 0:
            return self._spark.createDataFrame([], schema)
        return self._spark.createDataFrame(table, schema=schema)

    #: a column stored with the first type in one file and read as the second: Spark's reader widens it
    _WIDENS = {("tinyint", "smallint"), ("tinyint", "int"), ("tinyint", "bigint"), ("smallint", "int"),
               ("smallint", "bigint"), ("int", "bigint"), ("void", "*")}

    def _check_file_schemas(self, name: str, raw: Any) -> None:
        """Every file of a multi-file source stores each column in the table's type (or one Spark
        widens, or not at all): Spark takes the table's schema from one file and raises while
        reading a file whose column has another type (text where the table has a number, say), a
        failure after the charge decided by which files hold rows. A file that disagrees is a
        ConfigError at registration (each file's footer is read, no row)."""
        files = raw.inputFiles()
        if len(files) <= 1:
            return
        want = {f.name.lower(): f.dataType.simpleString() for f in raw.schema.fields}
        bad: set[str] = set()
        for uri in files:
            for f in self._spark.read.parquet(uri).schema.fields:
                have, need = f.dataType.simpleString(), want.get(f.name.lower())
                if need is None or have == need or (have, need) in self._WIDENS or (have, "*") in self._WIDENS:
                    continue
                bad.add(f.name)
        if bad:
            raise ConfigError(f"table '{name}': the files disagree on the type of column(s) {sorted(bad)}; Spark "
                              "would fail while reading some of them",
                              hint="rewrite the files with one type per column, or register them as separate tables")

    def _nanos_of(self, name: str, paths: list[str]) -> None:
        """:func:`_refuse_nanos` over each local file's footer (no row)."""
        sc = self._spark.sparkContext
        jvm, conf = sc._jvm, sc._jsc.hadoopConfiguration()
        for p in paths:
            if not os.path.isfile(p):
                continue
            reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(
                jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(jvm.org.apache.hadoop.fs.Path(
                    os.path.abspath(p)), conf))
            try:
                _refuse_nanos(name, p, reader.getFooter().getFileMetaData().getSchema())
            finally:
                reader.close()

    def _footer_schemas(self, name: str, paths: list[str]) -> list[tuple[Any, Any]] | None:
        """Each file's Parquet schema and Spark schema, read from its footer on the driver (no Spark job,
        no row), as Spark's own schema inference converts a footer (``ParquetFileFormat.readSchemaFromFooter``
        with the session's settings); None where Spark's inference would choose among files or
        filter them, which it then does itself: a path that is not a local file (a directory, a URI
        scheme), a name Spark skips (``_...``, ``.``..., ``..._COPYING_``), schema merging on, or files
        whose schemas differ at all."""
        if str(self._spark.conf.get("spark.sql.parquet.mergeSchema", "false")).lower() != "false":
            return None
        for p in paths:
            base = os.path.basename(p)
            if not os.path.isfile(p) or base.startswith(("_", ".")) or base.endswith("._COPYING_"):
                return None
        from pyspark.sql.types import StructType, _parse_datatype_json_string

        sc = self._spark.sparkContext
        jvm, conf = sc._jvm, sc._jsc.hadoopConfiguration()
        pq = jvm.org.apache.spark.sql.execution.datasources.parquet
        converter = pq.ParquetToSparkSchemaConverter(self._spark._jsparkSession.sessionState().conf())
        out: list[tuple[Any, Any]] = []
        for p in paths:
            path = jvm.org.apache.hadoop.fs.Path(os.path.abspath(p))
            reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(
                jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(path, conf))
            try:
                meta = reader.getFooter()
            finally:
                reader.close()
            _refuse_nanos(name, p, meta.getFileMetaData().getSchema())
            spark_schema = pq.ParquetFileFormat.readSchemaFromFooter(jvm.org.apache.parquet.hadoop.Footer(path, meta),
                                                                      converter)
            # a file source's columns are all nullable, as Spark's reader makes an inferred schema
            out.append((meta.getFileMetaData().getSchema(), spark_schema.asNullable().json()))
        if any(j != out[0][1] for _, j in out):
            return None
        first = _parse_datatype_json_string(out[0][1])
        assert isinstance(first, StructType)
        return [(m, first) for m, _ in out]

    def _file_schemas(self, raw: Any) -> list[Any]:
        """Each input file's Parquet schema, read from its footer (no row)."""
        sc = self._spark.sparkContext
        jvm, conf = sc._jvm, sc._jsc.hadoopConfiguration()
        schemas = []
        for uri in raw.inputFiles():
            hin = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(jvm.org.apache.hadoop.fs.Path(uri), conf)
            reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(hin)
            try:
                schemas.append(reader.getFooter().getFileMetaData().getSchema())
            finally:
                reader.close()
        return schemas

    def _needs_file_schemas(self, table_schema: Any) -> bool:
        """Whether :meth:`_millis_from` or :meth:`_widened_from` look at the files' schemas at all."""
        return self._stamps_or_nested(table_schema) or any(_holds_decimal(f.dataType) for f in table_schema.fields)

    @staticmethod
    def _stamps_or_nested(table_schema: Any) -> bool:
        return any(f.dataType.simpleString() in ("timestamp", "timestamp_ntz")
                   or f.dataType.simpleString().startswith(("struct", "array", "map")) for f in table_schema.fields)

    def _millis_from(self, name: str, table_schema: Any, schemas: list[Any]) -> set[str]:
        """The top-level timestamp columns stored as Parquet TIMESTAMP(MILLIS) in every file.

        Spark's reader converts milliseconds to microseconds with an exact multiplication: one
        stored value beyond +-2^63 microseconds (a millisecond count above ~9.2e15) makes every
        query that reads the column raise, a failure decided by one row. Such columns are read as
        the stored INT64 and converted by :meth:`_capped_select` (NULL outside DuckDB's range, as
        DuckDB's reader). Read from the table's Spark schema and each file's Parquet schema
        (footers only, no row). A column stored in milliseconds in some files and not in others,
        or a millisecond timestamp inside a nested column, is a ConfigError (a property of the files' schemas, never of a value)."""
        top = {f.name for f in table_schema.fields}
        stamps = {f.name for f in table_schema.fields if f.dataType.simpleString() in ("timestamp", "timestamp_ntz")}
        if not self._stamps_or_nested(table_schema):
            return set()
        units: dict[str, set[str]] = {}
        for schema in schemas:
            stack = [(t, None) for t in schema.getFields()]
            while stack:
                t, under = stack.pop()
                if not t.isPrimitive():
                    stack.extend((c, under or t.getName()) for c in t.asGroupType().getFields())
                    continue
                ann = t.getLogicalTypeAnnotation()
                unit = (str(ann.getUnit().toString()) if ann is not None
                        and str(ann.getClass().getSimpleName()) == "TimestampLogicalTypeAnnotation" else "")
                if under is not None:
                    if unit == "MILLIS":
                        raise ConfigError(f"table '{name}': the nested column '{under}' holds timestamps stored in "
                                          "milliseconds, which Spark cannot read totally",
                                          hint="store nested timestamps in microseconds, or use the DuckDB engine")
                    continue
                col = str(t.getName())
                match = next((c for c in top if c.lower() == col.lower()), None)
                if match is not None and match in stamps:
                    units.setdefault(match, set()).add(unit)
        mixed = sorted(c for c, u in units.items() if "MILLIS" in u and len(u) > 1)
        if mixed:
            raise ConfigError(f"table '{name}': column(s) {mixed} are timestamps stored in milliseconds in some files "
                              "and not in others",
                              hint="rewrite the files with one timestamp unit per column (microseconds)")
        return {c for c, u in units.items() if u == {"MILLIS"}}

    def _int96_from(self, table_schema: Any, schemas: list[Any]) -> set[str]:
        """The top-level timestamp columns stored as Parquet INT96 (the legacy type of Spark, Hive and Impala) in
        every file: DuckDB reads them as TIMESTAMP (no time zone), Spark as TIMESTAMP_LTZ (a TIMESTAMPTZ, so
        queries DuckDB answers were refused); :meth:`_capped_select` converts them to TIMESTAMP_NTZ, exactly in the
        session's UTC, so both engines register and answer them alike. Footers only, no row."""
        stamps = {f.name.lower(): f.name for f in table_schema.fields if f.dataType.simpleString() == "timestamp"}
        if not stamps or not schemas:
            return set()
        kinds: dict[str, set[bool]] = {}
        for schema in schemas:
            for t in schema.getFields():
                col = stamps.get(str(t.getName()).lower())
                if col is not None:
                    kinds.setdefault(col, set()).add(
                        bool(t.isPrimitive()) and str(t.asPrimitiveType().getPrimitiveTypeName().toString()) == "INT96")
        return {c for c, k in kinds.items() if k == {True} and all(any(
            str(t.getName()).lower() == c.lower() for t in schema.getFields()) for schema in schemas)}

    @staticmethod
    def _wide_decimals(table_schema: Any) -> dict[str, Any]:
        """The table's top-level DECIMAL columns of more than 18 digits."""
        from pyspark.sql.types import DecimalType

        return {f.name: f.dataType for f in table_schema.fields
                if isinstance(f.dataType, DecimalType) and f.dataType.precision > 18}

    def _widened_from(self, table_schema: Any, schemas: list[Any]) -> tuple[set[str], dict[str, int]]:
        """How the top-level DECIMAL columns of more than 18 digits stored as a FIXED_LEN_BYTE_ARRAY in every file
        are read: (those read as DECIMAL(38, s), those read as their bytes: column -> the bytes per value).

        Spark's reader raises on a stored value with more digits than the declared precision, whatever reads
        the column (``x IS NULL`` too): one row's value failed every query reading it, after the charge. Its
        vectorized reader widens such a column to DECIMAL(38, s) without that check, and 15 bytes hold at most
        36 digits, so read that way every value of at most 15 bytes is read (in a table of atomic columns, which
        :data:`PLAN_CONF` makes that reader read; the row-based reader, which reads nested columns where the owner
        turns their vectorized reading off, checks the declared precision). 16 bytes (DECIMAL(36) to DECIMAL(38)
        as pyarrow and Spark write them) hold 39 digits, more than any Spark DECIMAL: such a column, and any in a
        table with nested columns, is read as its bytes, which both readers read whatever they hold, and converted
        by :func:`_decimal_from_bytes` (the same number of bytes in every file). :meth:`_capped_select` makes a
        value beyond the declared precision NULL either way, as DuckDB's reader. Read from the files' footers
        only (no row); a column stored otherwise is read as Spark reads it (docs/spark.md, Sources)."""
        wide = self._wide_decimals(table_schema)
        nested = any(f.dataType.simpleString().startswith(("struct", "array", "map")) for f in table_schema.fields)
        lengths: dict[str, set[int]] = {c: set() for c in wide}
        for schema in schemas:
            for t in schema.getFields():
                match = next((c for c in wide if c.lower() == str(t.getName()).lower()), None)
                if match is None:
                    continue
                flba = t.isPrimitive() and str(t.asPrimitiveType().getPrimitiveTypeName().toString()) \
                    == "FIXED_LEN_BYTE_ARRAY"
                lengths[match].add(int(t.asPrimitiveType().getTypeLength()) if flba else 0)
        widened, as_bytes = set(), {}
        for c, ls in lengths.items():
            if not ls or 0 in ls:  # stored otherwise in some file (0)
                continue
            if not nested and min(ls) >= 9 and max(ls) <= 15:
                widened.add(c)
            elif len(ls) == 1 and min(ls) >= 9:
                as_bytes[c] = ls.pop()
            else:  # lengths that differ between files (at most 16, decimal_storage_problem): sign-extended to 16
                as_bytes[c] = 0
        return widened, as_bytes

    def _narrow_beside_nested(self, table_schema: Any, schemas: list[Any]) -> dict[str, Stored]:
        """The top-level DECIMAL columns of at most 18 digits of a table with nested columns, each stored one way
        (INT32, INT64 or FIXED_LEN_BYTE_ARRAY) in every file: read as what stores them and converted as nested ones
        are (:func:`_nested_read`). Spark's row-based reader, which reads such a table where the owner turns
        ``spark.sql.parquet.enableNestedColumnVectorizedReader`` off, raised on a value beyond the declared
        precision (the vectorized reader, which reads a table of atomic columns, keeps it: ``_capped_select``)."""
        from pyspark.sql.types import DecimalType

        if not any(f.dataType.simpleString().startswith(("struct", "array", "map")) for f in table_schema.fields):
            return {}
        narrow = {f.name.lower(): f for f in table_schema.fields
                  if isinstance(f.dataType, DecimalType) and f.dataType.precision <= 18}
        kinds: dict[str, set[str]] = {f.name: set() for f in narrow.values()}
        for schema in schemas:
            for path, physical, *_ in self._decimal_storage(schema):
                if path.lower() in narrow:
                    kinds[narrow[path.lower()].name].add(physical)
        out: dict[str, Stored] = {}
        for c, k in kinds.items():
            t = narrow[c.lower()].dataType
            if len(k) == 1 and k <= set(_READ_AS):
                out[c] = {(t.precision, t.scale): next(iter(k))}
        return out

    @staticmethod
    def _decimal_storage(schema: Any) -> list[tuple[str, str, int, int, int]]:
        """A file's DECIMAL leaves at any depth, (dotted path, physical type, length, precision, scale), from its
        Parquet schema."""
        out = []
        for c in schema.getColumns():
            t = c.getPrimitiveType()
            ann = t.getLogicalTypeAnnotation()
            if ann is not None and str(ann.getClass().getSimpleName()) == "DecimalLogicalTypeAnnotation":
                out.append((".".join(str(x) for x in c.getPath()), str(t.getPrimitiveTypeName().toString()),
                            int(t.getTypeLength()), int(ann.getPrecision()), int(ann.getScale())))
        return out

    def _nested_stored(self, name: str, table_schema: Any, schemas: list[Any]) -> dict[str, Stored]:
        """The top-level nested columns holding a DECIMAL, each with how its DECIMAL(p, s) are stored: read as what
        stores them and rebuilt (:func:`_nested_read`).

        Spark's row-based reader (which reads nested columns where the owner turns
        ``spark.sql.parquet.enableNestedColumnVectorizedReader`` off) raised on a nested DECIMAL beyond its declared
        precision, stored as an integer or as bytes, and with the vectorized reader ``COUNT(DISTINCT col)`` did on one
        stored as bytes (the value's text): one person's value failed the query after its charge. Bytes and integers
        read whatever they hold, with either reader. Decided from the files' footers (no row): a map holding a DECIMAL
        (as the DuckDB engine refuses it), or a column in which one DECIMAL(p, s) is stored in two ways (by two files,
        or by two of its fields), is a ConfigError."""
        nested = {f.name.lower(): f for f in table_schema.fields
                  if f.dataType.simpleString().startswith(("struct", "array", "map")) and _holds_decimal(f.dataType)}
        kinds: dict[str, dict[tuple[int, int], set[str]]] = {}
        for schema in schemas:
            for path, physical, _, p, s in self._decimal_storage(schema):
                top = path.split(".", 1)[0].lower()
                if top in nested:
                    kinds.setdefault(nested[top].name, {}).setdefault((p, s), set()).add(physical)
        out: dict[str, Stored] = {}
        for col, by_type in kinds.items():
            if _map_holds_decimal(nested[col.lower()].dataType):
                raise ConfigError(f"table '{name}': the nested column '{col}' has a map holding a DECIMAL, which "
                                  "neither engine reads totally (a value beyond its precision)",
                                  hint="store the map as a list of structs, or leave the column out of the source")
            mixed = sorted(f"DECIMAL({p},{s})" for (p, s), k in by_type.items() if len(k) > 1 or not k <= set(_READ_AS))
            if mixed:
                raise ConfigError(f"table '{name}': the nested column '{col}' stores {', '.join(mixed)} in more than "
                                  "one Parquet encoding (in different files or fields), which the Spark engine "
                                  "cannot read totally",
                                  hint="rewrite the files with one DECIMAL encoding per precision inside the column, "
                                       "or use the DuckDB engine")
            out[col] = {t: next(iter(k)) for t, k in by_type.items()}
        return out

    def _capped_select(self, name: str, raw: str, fields: list[tuple[str, str]], types: Mapping[str, Any],
                       millis: Collection[str] = (), widened: Collection[str] = (),
                       as_bytes: Mapping[str, int] | None = None,
                       nested: Mapping[str, tuple[Any, Stored]] | None = None,
                       int96: Collection[str] = ()) -> exp.Select:
        """The view of a source over its ``raw`` view: each column (``fields``: name and Spark type's simple
        string; ``types``: name and Spark type as declared) read as the DuckDB engine reads it (``int96``:
        TIMESTAMP_LTZ columns stored as INT96, read as TIMESTAMP_NTZ)."""
        from pyspark.sql.types import AtomicType

        as_bytes, nested = as_bytes or {}, nested or {}
        cap = self.settings.max_text_bytes
        items: list[exp.Expression] = []
        for n, t in fields:
            ref = exp.column(n, quoted=True)
            e: exp.Expression = ref
            if n in millis:
                # the stored INT64 milliseconds: inside DuckDB's range converted exactly, else NULL
                lo_ms, hi_ms = -((-TS_MIN_US) // 1000), TS_MAX_US // 1000
                inside = exp.Between(this=ref.copy(), low=exp.Neg(this=exp.Literal.number(-lo_ms)) if lo_ms < 0
                                     else exp.Literal.number(lo_ms), high=exp.Literal.number(hi_ms))
                as_ts = exp.Cast(this=exp.Anonymous(this="timestamp_millis", expressions=[ref.copy()]),
                                 to=exp.DataType.build("TIMESTAMP_NTZ" if t == "timestamp_ntz" else "TIMESTAMP_LTZ",
                                                       dialect=SPARK))
                items.append(exp.alias_(exp.Case(ifs=[exp.If(this=inside, true=as_ts)]), view_column(n), quoted=True))
                continue
            if n in nested or (n in types and not isinstance(types[n], AtomicType)):
                # its DECIMALs read as what stores them (_nested_stored), its text and lists capped: rebuilt
                t_n, stored = nested.get(n, (types.get(n), {}))
                built = _nested_read(ref, t_n, stored, cap, self.settings.max_list_size, f"'{name}.{n}'")
                items.append(exp.alias_(built if built is not None else ref, view_column(n), quoted=True))
                continue
            text = t == "string" or t.startswith("string collate")
            if text or (cap is not None and t == "binary"):
                # text that is not valid UTF-8 is NULL, as DuckDB's default reader (invalid_text =
                # "null") reads it: Spark keeps the bytes, which then compare, hash and print
                # differently (the driver's Arrow and DuckDB mangle or reject them)
                null_if: list[exp.Expression] = []
                if cap is not None:
                    null_if.append(exp.GT(this=exp.func("octet_length", ref.copy()), expression=exp.Literal.number(cap)))
                if text:
                    null_if.append(exp.Not(this=exp.Anonymous(this="is_valid_utf8", expressions=[ref.copy()])))
                # a collation stored in the file's Spark metadata (Spark 4 writes ``__COLLATIONS``: a column
                # ``STRING COLLATE UTF8_LCASE``) is dropped: the text compares, groups and sorts byte by byte, as
                # DuckDB reads the file (it was a type nothing compares, so every query over it was refused)
                value = exp.Anonymous(this="collate", expressions=[ref.copy(), exp.Literal.string("UTF8_BINARY")]) \
                    if _collated(t) else ref.copy()
                e = exp.Case(ifs=[exp.If(this=c, true=exp.Null()) for c in null_if], default=value)
            elif t in ("date", "timestamp", "timestamp_ntz"):
                # the range DuckDB's reader keeps (``_duckdb_sources.TS_MIN_US`` ...): outside it NULL, as there
                stored = (exp.Anonymous(this="unix_date", expressions=[ref.copy()]) if t == "date" else
                          exp.Anonymous(this="unix_micros", expressions=[exp.Cast(
                              this=ref.copy(), to=exp.DataType.build("TIMESTAMP_LTZ", dialect=SPARK))]))
                lo, hi = (DATE_MIN_DAY, DATE_MAX_DAY) if t == "date" else (TS_MIN_US, TS_MAX_US)
                inside = exp.Between(this=stored, low=exp.Literal.number(lo) if lo >= 0 else exp.Neg(
                    this=exp.Literal.number(-lo)), high=exp.Literal.number(hi))
                value = exp.Cast(this=ref.copy(), to=exp.DataType.build("TIMESTAMP_NTZ", dialect=SPARK)) if n in int96 \
                    else ref.copy()  # INT96: its UTC instant's wall clock, as DuckDB reads it (session time zone UTC)
                e = exp.Case(ifs=[exp.If(this=inside, true=value)])
            elif (dec := re.fullmatch(r"decimal\((\d+),(\d+)\)", t)) is not None and n in as_bytes:
                # the stored bytes: the exact value inside the declared precision, else NULL (_widened_from); bytes
                # of lengths that differ between files (0) sign-extended to 16 first
                e = (_decimal_from_bytes(ref, int(dec.group(1)), int(dec.group(2)), as_bytes[n]) if as_bytes[n] else
                     _decimal_from_bytes(_sign_extended(ref), int(dec.group(1)), int(dec.group(2)), 16))
            elif (dec := re.fullmatch(r"decimal\((\d+),(\d+)\)", t)) is not None and (
                    int(dec.group(1)) <= 18 or n in widened):
                # a DECIMAL(p, s) whose stored integer has more than p digits (a Parquet INT32/INT64 or Arrow
                # decimal holds more) is NULL, as DuckDB's reader makes it: Spark keeps it, and its arithmetic on
                # it (x * x, -x, floor, COUNT(DISTINCT x)) raised after the charge only when such a row existed.
                # Comparing it with extremes of its own type cannot fail (no cast, no overflow check). Up to 18
                # digits (an INT32 or INT64), and for a wider one read as DECIMAL(38, s) (_widened_from; the
                # value inside the range is then cast back to the declared type); one stored in more bytes, or in
                # a table with nested columns, is read as its bytes (above); Spark reads any other wider one beyond
                # its precision with an error whatever reads it, x IS NULL too (docs/spark.md, Sources)
                p, s = int(dec.group(1)), int(dec.group(2))
                top = "9" * (p - s) + ("." + "9" * s if s else "") if p > s else "0." + "9" * s
                declared = exp.DataType.build(f"DECIMAL({p},{s})", dialect=SPARK)
                typ = exp.DataType.build(f"DECIMAL(38,{s})", dialect=SPARK) if n in widened else declared
                inside = exp.Between(this=ref.copy(), low=exp.Cast(this=exp.Literal.string("-" + top), to=typ),
                                     high=exp.Cast(this=exp.Literal.string(top), to=typ.copy()))
                e = exp.Case(ifs=[exp.If(this=inside, true=exp.Cast(this=ref.copy(), to=declared)
                                         if n in widened else ref.copy())])
            # the catalog's name (as DuckDB's views): Spark matches identifiers ignoring case char by char,
            # so 'İd' (whose lower case 'i̇d' is longer) was reached by no spelling
            items.append(exp.alias_(e, view_column(n), quoted=True))
        return exp.select(*items).from_(exp.to_table(raw, quoted=True))

    def unregister_source(self, name: str, kind: str, view: str | None = None) -> None:
        view = view or source_name(name)
        with self._lock:
            self._analysed.clear()
            self._views.pop(view, None)
            self._files.pop(view, None)
            for v in (view, view + "_raw"):
                try:
                    self._spark.catalog.dropTempView(v)
                except Exception:  # noqa: BLE001 - already gone
                    pass

    # -- binding --------------------------------------------------------------------------------
    @staticmethod
    def _domain_named(ast: exp.Expression) -> tuple[exp.Expression, dict[str, DomainRelation]]:
        """``ast`` with each long public key domain's placeholder (``dpsql.rewrite.bound.domain_rows``) named as a
        temporary view of its own (a fresh name per run: runs in one Spark session never share one; no analyst SQL
        reaches it, user SQL names only registered tables), and those views' domains; ``ast`` itself is kept."""
        if not any(DOMAIN_RELATION in n.meta for n in ast.find_all(exp.Table)):
            return ast, {}
        ast = ast.copy()
        views: dict[str, DomainRelation] = {}
        for node in list(ast.find_all(exp.Table)):
            rel = node.meta.get(DOMAIN_RELATION)
            if rel is not None:
                name = "_dpsql_domain_" + uuid.uuid4().hex
                views[name] = rel
                node.replace(exp.to_table(name))
        return ast, views

    @contextmanager
    def _domain_views(self, views: Mapping[str, DomainRelation]) -> Iterator[None]:
        """The domains as temporary views while the query is analysed or run, dropped afterwards: one column
        ``__d`` of the public values (catalog metadata, never rows), typed to the key column, broadcast (a hint of
        the view's plan, from the query alone, as Spark's size-based choice is off: the rows are not shuffled
        to meet the domain)."""
        try:
            for name, rel in views.items():
                arrow = pa.table({"__v": _domain_values(rel)})
                to = render(spark_type(rel.column_type), dialect=SPARK)
                self._spark.createDataFrame(arrow).selectExpr(f"CAST(__v AS {to}) AS __d").hint("broadcast") \
                    .createOrReplaceTempView(name)
            yield
        finally:
            for name in views:
                try:
                    self._spark.catalog.dropTempView(name)
                except Exception:  # noqa: BLE001  # pragma: no cover - never registered
                    pass

    def _analyzed(self, ast: exp.Expression) -> Any:
        """Spark's analysed DataFrame of ``ast`` (lazy: no row is read); QueryTypeError if it does
        not bind. The lowering's refusal (UnsupportedQueryError) passes through: it is free.

        The DataFrame is kept for the read of the same SQL (:meth:`fetch_arrow`: a bind check's query is read next)
        if nothing Spark's analysis depends on changed meanwhile (the session's settings, the sources' views):
        Spark's analysis, which costs about 0.6 ms of CPU per node of the query, is then made once per query, not
        twice. (A query naming a public domain's view is analysed again: the view's name is new for each run.)"""
        ast, views = self._domain_named(ast)
        sql = self.render(ast)
        failure: QueryTypeError | None = None
        with self._lock:
            try:
                conf = dict(self._spark.conf.getAll)
                with self._domain_views(views):
                    df = self._spark.sql(sql)
                    _ = df.schema
                if not views:
                    if len(self._analysed) >= 16:
                        self._analysed.pop(next(iter(self._analysed)))
                    self._analysed[sql] = (conf, df)
                return df
            except Exception as e:  # noqa: BLE001
                failure = QueryTypeError(
                    f"the query does not type-check against the table's columns on Spark ({type(e).__name__}); "
                    "nothing was charged",
                    hint="check the types in WHERE / GROUP BY / HAVING / ORDER BY (e.g. text compared with numbers)",
                    debug_detail=self._detail(e),
                )
        assert failure is not None
        raise failure

    def describe(self, ast: exp.Expression) -> list[tuple[str, str]]:
        """(column, DuckDB type name) of a query's result, by Spark's analysis only."""
        return [(f.name, duckdb_type(f.dataType.simpleString())) for f in self._analyzed(ast).schema.fields]

    def bind_check(self, ast: exp.Expression, *, run: bool = False) -> None:
        """Bind a query on Spark without reading a row. ``run=True`` (queries over public
        placeholder relations only: post-processing) runs it on the driver's DuckDB, where the
        released values are post-processed."""
        if run:
            self._local.bind_check(ast, run=True)
            return
        self._analyzed(ast)

    # -- execution ------------------------------------------------------------------------------
    @contextmanager
    def _deadline(self, group: str, until: float | None = None) -> Iterator[None]:
        """Cancel the job group after the owner's statement time-out, or at ``until`` (a
        ``time.monotonic()`` instant: what is left of a batch's time-out) if that is sooner."""
        limit = self.settings.statement_timeout
        if limit is None:
            yield
            return
        if until is not None:
            limit = min(limit, until - time.monotonic())
            if limit <= 0:  # nothing left of a batch's time-out: the read does not start (the generic failure)
                raise TimeoutError("the statement time-out passed")
        done = threading.Event()
        sc = self._spark.sparkContext

        def fire() -> None:
            # a cancel reaches only the group's running jobs: cancel until the read ends, so that a job
            # started after the time-out fired is cancelled too
            while not done.is_set():
                sc.cancelJobGroup(group)
                if done.wait(0.05):
                    return

        timer = threading.Timer(limit, fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            done.set()
            timer.cancel()

    def fetch_arrow(self, ast: exp.Expression, *, what: str = "the bounded query",
                    deadline: float | None = None) -> pa.Table:
        """Run a query over private data on Spark and bring its (bounded) result to the driver as
        Arrow. Any failure is the one generic ExecutionError (:func:`private_failure`)."""
        ast, views = self._domain_named(with_read_salt(ast))
        sql = self.render(ast)
        failure: ExecutionError | None = None
        group = "dpsql-" + uuid.uuid4().hex
        with self._lock:
            sc = self._spark.sparkContext
            try:
                conf = self._pin_plan()
                sc.setJobGroup(group, "dpsql bounded query", interruptOnCancel=True)
                with self._deadline(group, deadline):
                    read = self._read_files(sql)  # a source's views made again: the analyses kept are forgotten
                    analysed = self._analysed.pop(sql, None)
                    with self._domain_views(views):
                        df = analysed[1] if analysed is not None and not views and analysed[0] == conf else None
                        table = _arrow_by_partition(self._spark.sql(sql) if df is None else df)
                if any(native.versions(files) != v for files, v in read):
                    raise OSError("a source file changed during the read")  # the generic failure below
                return table
            except Exception as e:  # noqa: BLE001 - whatever failed, the same error
                failure = private_failure(what, self._detail(e), self.settings)
            finally:
                try:
                    sc.setJobGroup("", "")
                except Exception:  # noqa: BLE001  # pragma: no cover
                    pass
        assert failure is not None
        raise failure

    def check_connection(self) -> None:
        """Refuse (free) a Spark session that can run no job: the caller stopped it (``spark.stop()``, which stops the
        process's SparkContext) or its driver is gone. Spark still analyses a query on a stopped context, and the bind
        check is remembered, so such a query was charged and then failed with the generic error. Checked before every
        charge (``catalog.check_sources_unchanged``); a stop during the read is the generic failure (the charge
        stands)."""
        if self._pid != os.getpid():  # a forked child, also one whose fork ran no at-fork hook: no call to the JVM
            raise inherited_refusal(self._pid, "Spark")
        with self._lock:  # (in a forked child: refused before any call to the JVM)
            stopped = _stopped(self._spark)
        if stopped:
            raise ConfigError("the Spark session of this Session was stopped (spark.stop() stops its SparkContext), so "
                              "it can run no query; nothing was charged",
                              hint="close this Session and open a new one on a running SparkSession (Session(engine="
                                   "'spark', spark=...)), and stop the SparkSession only after the Session is closed")

    def post_process(self, table: pa.Table, ast_builder: Callable[[str], exp.Expression]) -> pa.Table:
        """Post-processing of released values on the driver, in DuckDB (no private row is read)."""
        return self._local.post_process(table, ast_builder)

    def close(self) -> None:
        """Drop dpsql's views; the SparkContext is the process's (``spark.stop()`` is its owner's)."""
        if self._pid != os.getpid():  # a forked child's copy: the views (and the JVM) are the parent's
            return
        for view, kind in list(self._views.items()):
            self.unregister_source("", kind, view)
        self._analysed.clear()
        self._local.close()


_ENGINES: weakref.WeakSet[SparkBackend] = weakref.WeakSet()


def _engines_after_fork() -> None:
    # a forked child shares the parent's py4j sockets to the JVM: a call there would interleave with the
    # parent's (or wait for a reply the parent reads); every inherited engine refuses use, before any charge
    for engine in list(_ENGINES):
        engine._lock = _Inherited(engine._pid, "Spark")
        # nothing of the parent's is freed here: its post-processing DuckDB, and its py4j proxies (collected, each tells
        # the parent's JVM to forget its object, through the parent's socket where py4j does not pin threads)
        inherited.keep(engine)


os.register_at_fork(after_in_child=_engines_after_fork)


def _domain_values(rel: DomainRelation) -> pa.Array:
    """A domain's values as the view's Arrow column, before Spark's cast to the key column's type: integers as
    BIGINT, text as itself, and dates, timestamps and DECIMALs as the text of their typed literal
    (``dpsql.plan.typer.typed_literal``: ``2024-01-08``, ``2024-03-01 12:30:00.000007``, ``-2.25``), which Spark
    converts exactly (a TIMESTAMP is TIMESTAMP_NTZ, no time zone applied; a DECIMAL's text has its scale's digits)."""
    if rel.column_type in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT"):
        return pa.array(rel.values, pa.int64())
    if rel.column_type == "VARCHAR":
        return pa.array(rel.values, pa.string())
    return pa.array([v.isoformat(sep=" ") if isinstance(v, dt.datetime) else v.isoformat() if isinstance(v, dt.date)
                     else format(v, "f") for v in rel.values], pa.string())


def _arrow_by_partition(df: Any) -> pa.Table:
    """``df.toArrow()``, and past ``spark.driver.maxResultSize`` one partition at a time: ``toArrow`` collects every
    partition's Arrow batches in one job (the common case: one job, not one per partition, which cost about 0.2 s
    a query at four partitions and grows with a cluster's partitions), whose results together count against the
    driver's limit (1 GiB by default), so a bounded result of many groups (a sparse histogram, a GROUP BY over a
    large declared domain) failed after the charge. When that job fails on the limit, each partition is read by a
    job of its own (Spark's ``toLocalIterator``, over the same Arrow batches), so only one partition's batches must
    fit under the limit. A partition that does not fit either (its job fails on the limit) is not a failure: the
    result is then read in slices that each fit (:func:`_arrow_in_slices`). The same rows (as ``toArrow`` converts
    them), in partition order (in slices: slice by slice). Each fallback runs the bounded query again (its rows are
    the same: the read's salt is fixed), which costs time only for results past the limit (the read's time grows
    with the result's size in any case: docs/threat_model.md, "Timing")."""
    for read in (lambda d: d.toArrow(), _arrow_partitions):
        try:
            return read(df)
        except Exception as e:  # noqa: BLE001 - only the limit's failure is read again, anything else raises
            if _LIMIT not in str(e) or _max_result_size(df) <= 0:
                raise
    return _arrow_in_slices(df)


_LIMIT = "spark.driver.maxResultSize"  # named in Spark's message of a job whose results exceed it
_SLICE_ROUNDS = 8


def _max_result_size(df: Any) -> int:
    """The driver's ``spark.driver.maxResultSize`` in bytes (0: no limit)."""
    conf = df.sparkSession.sparkContext._jsc.sc().conf()
    return int(conf.getSizeAsBytes(_LIMIT, "1g"))


def _arrow_partitions(df: Any) -> pa.Table:
    """Each partition of ``df`` read by a job of its own, as Arrow (:func:`_arrow_by_partition`)."""
    from pyspark.serializers import NoOpSerializer
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.util import _local_iterator_from_socket

    large = df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    schema = to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                             prefers_large_types=large)
    sc = df.sparkSession.sparkContext
    served = sc._jvm.PythonRDD.toLocalIteratorAndServe(df._jdf.toArrowBatchRdd(), False)
    batches = [pa.ipc.read_record_batch(pa.py_buffer(b), schema)
               for b in _local_iterator_from_socket(served, NoOpSerializer())]
    return pa.Table.from_batches(batches, schema)


def _size_bound(field: Any) -> Any:
    """A bound on the bytes one value of ``field`` takes in an Arrow batch: a fixed-width value 8 bytes (a DECIMAL
    16) and its validity bit, a text or binary value its bytes and 8 (its offset, 4 or 8 bytes, and validity), a
    nested value 8 bytes per character of its text and 16 (each element, field or entry spells at least one
    character and its separator, and takes at most 16 bytes)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, DecimalType, MapType, StringType, StructType

    col = F.col("`" + field.name.replace("`", "``") + "`")
    if isinstance(field.dataType, (StringType, BinaryType)):
        return F.coalesce(F.octet_length(col), F.lit(0)) + F.lit(8)
    if isinstance(field.dataType, (ArrayType, MapType, StructType)):
        return F.coalesce(F.octet_length(col.cast("string")), F.lit(0)) * F.lit(8) + F.lit(16)
    return F.lit(17 if isinstance(field.dataType, DecimalType) else 9)


def _arrow_in_slices(df: Any) -> pa.Table:
    """``df`` read as Arrow in slices that each fit under ``spark.driver.maxResultSize``: the result is cached on
    the executors (computed once), a job sums a bound on each row's Arrow bytes (:func:`_size_bound`) per partition
    and slice, and each slice is read partition by partition. A row's slice is a hash of its values modulo the
    number of slices (a function of the row alone: were a cached partition computed again, in another order, each
    row would still be read once), chosen for slices of about a quarter of the limit and grown until every slice
    of every partition is within half of it (room for the batches' and the tasks' own bytes). Only a row larger
    than that cannot be read (a text of hundreds of megabytes under the default limit of 1 GiB): its slice is
    read as it is, and fails on the limit."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    budget = max(1, _max_result_size(df) // 2)
    size = sum((_size_bound(f) for f in df.schema.fields), F.lit(0))
    cols = [F.col("`" + f.name.replace("`", "``") + "`") for f in df.schema.fields]
    keys = [c.cast("string") if isinstance(f.dataType, (ArrayType, MapType, StructType)) else c  # (a map has no hash)
            for c, f in zip(cols, df.schema.fields)]
    cached = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        slices, most = 1, None
        for _ in range(_SLICE_ROUNDS):
            which = F.pmod(F.xxhash64(*keys), F.lit(slices)) if slices > 1 else F.lit(0)
            per = cached.select(F.spark_partition_id().alias("p"), which.alias("s"), size.alias("n")) \
                .groupBy("p", "s").agg(F.sum("n").alias("n"), F.count(F.lit(1)).alias("r"))
            top = per.agg(F.max("n"), F.max("r")).collect()[0]
            biggest, rows = int(top[0] or 0), int(top[1] or 0)
            most = rows if most is None else most  # the most rows of a partition: more slices split nothing further
            if biggest <= budget or rows <= 1 or slices >= most:
                break
            slices = min(most, slices * max(2, -(-2 * biggest // budget)))
        if slices == 1:
            return _arrow_partitions(cached)
        which = F.pmod(F.xxhash64(*keys), F.lit(slices))
        return pa.concat_tables([_arrow_partitions(cached.where(which == F.lit(k))) for k in range(slices)])
    finally:
        cached.unpersist()


class _Files:
    """A Parquet source's local files as registered: ``paths`` (as given to Spark), ``files`` (each local file),
    their version and footprints (:func:`_footprint`), the schema they are read as (None: Spark's inference)
    and the view's SELECT over the ``_raw`` view (:meth:`SparkBackend.source_changed`)."""

    def __init__(self, paths: list[str], files: list[str], version: native.Version, prints: list[Any],
                 listed: bool) -> None:
        self.paths, self.files, self.version, self.prints, self.listed = paths, files, version, prints, listed
        self.read_as: Any = None
        self.sel = ""


#: the key of the Spark schema Spark writes into a Parquet footer (its reader prefers it to the Parquet schema)
_SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"


def _footprint(path: str) -> tuple[Any, bytes | None]:
    """What the reading of a Parquet file was decided from: its Parquet schema (physical types, lengths and
    annotations: how each DECIMAL and timestamp is stored) and the Spark schema a Spark writer kept in it.
    The footer only (no row)."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    return _Schema(f.schema), (f.metadata.metadata or {}).get(_SPARK_ROW_METADATA)


class _Schema:
    """A Parquet schema compared by ``ParquetSchema.equals`` (field ids and types, physical storage included)."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Schema) and bool(self.schema.equals(other.schema))

    __hash__ = None  # type: ignore[assignment]


def _unready(source: str) -> str:
    """Why a local Parquet source (a path or a glob) is not there whole yet, or '': one of its files named as a data
    file has no bytes, or has a Parquet header and no footer (another job is still writing it in place)."""
    if re.match(r"^[a-z][a-z0-9+.-]*://", source) and not source.startswith("file://"):
        return ""
    try:
        paths = _expand(source.removeprefix("file://"))
    except Exception:  # noqa: BLE001 - no file matches (any more): said as Spark's failure
        return ""
    for p in paths:
        if _zero_bytes(p):
            return f"{p} is empty (0 bytes)"
        if _partial_parquet(p):
            return f"{p} is an incomplete Parquet file (its header is there, no footer yet)"
    return ""


def _local_path(uri: str) -> str:
    """The local path of a ``file:`` URI Spark lists."""
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path)
