"""Review of recent changes on the Spark engine against DuckDB: the free refusals of a QUALIFY over public keys and of
WHERE conditions on one column that no value meets, a DOUBLE remainder, grouped-join keys derived from a column with
NULLs, and a caller's SparkSession holding functions named like Spark's own.

Each comparison runs the same query on a session of each engine whose releases compare under zero noise
(``comparable_session``): the same release, or the same refusal (class and message), and no charge for a refusal.

Findings: a QUALIFY on a grouped join's keys read at run time (a DATE range's days) that keeps none was charged on both
engines; dpsql's own Spark session could be given a SQL PATH or a session function order under which a function named
like Spark's LEAST stood in for the bounding's. What held: a caller's SparkSession lends dpsql none of its UDFs,
temporary functions or PATH; the one-column WHERE decision and the QUALIFY decision over declared keys refuse and
release alike on both engines; a grouped join's NULL group of a derived key, and the charges and parameters of DAWA,
R2T and DP-S4S (sampled or not), are the same on both; a DOUBLE or FLOAT remainder is refused for free on Spark.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _spark import comparable_session, require_spark

import dpsql
from dpsql import errors

require_spark()

KINDS = ("duckdb", "spark")


def _people() -> pa.Table:
    n = 600
    return pa.table({
        "uid": pa.array(range(n), pa.int64()),
        "k": pa.array([["a", "b", "c"][j % 3] for j in range(n)]),
        "x": pa.array([float(j % 5) + 0.5 for j in range(n)]),
        "i": pa.array([j % 3 for j in range(n)], pa.int64()),
        "huge": pa.array([1e300 if j % 2 else 1.25 for j in range(n)]),
        "s": pa.array([f"s{j % 4}" for j in range(n)]),
        "big": pa.array([1e6 if j == 0 else 1.0 for j in range(n)]),
    })


def _tpch(seed: int = 1, nc: int = 60) -> dict[str, pa.Table]:
    g = np.random.default_rng(seed)
    n_orders = g.integers(0, 4, nc)
    o_cust = np.repeat(np.arange(nc), n_orders)
    o_key = np.arange(o_cust.size) + 1000
    n_items = g.integers(1, 3, o_key.size)
    l_ord = np.repeat(o_key, n_items)
    base = datetime.date(1992, 1, 1)
    days = [base + datetime.timedelta(days=int(x)) for x in g.integers(0, 3 * 365, l_ord.size)]
    return {
        "customer": pa.table({"c_custkey": np.arange(nc)}),
        "orders": pa.table({"o_orderkey": o_key, "o_custkey": o_cust}),
        "lineitem": pa.table({"l_orderkey": l_ord, "l_price": np.round(g.uniform(0, 100, l_ord.size), 2),
                              "l_shipdate": pa.array([None if j % 7 == 0 else d for j, d in enumerate(days)],
                                                     pa.date32())}),
    }


def _register(s: dpsql.Session) -> None:
    s.register("t", _people(), privacy_unit="uid", max_groups_per_unit=2, max_rows_per_unit=1,
               columns={"k": {"domain": ["a", "b", "c"]}, "x": {"bounds": (0, 10)}, "big": {"bounds": (0, 2)},
                        "i": {"bounds": (0, 10)}})
    s.register("f", pa.table({"uid": pa.array(range(400), pa.int64()), "s": pa.array(["a"] * 400),
                              "x": pa.array([math.nan if j % 2 else -0.0 for j in range(400)]),
                              "r": pa.array([math.nan if j % 2 else -0.0 for j in range(400)], pa.float32())}),
               privacy_unit="uid", max_groups_per_unit=1, max_rows_per_unit=1)
    data = _tpch()
    s.register("customer", data["customer"], privacy_unit="c_custkey", allow_conditional_sampling=True)
    s.register("orders", data["orders"], references={"o_custkey": "customer.c_custkey"},
               degree_bounds={"o_custkey": 4}, allow_conditional_sampling=True)
    s.register("lineitem", data["lineitem"], references={"l_orderkey": "orders.o_orderkey"},
               degree_bounds={"l_orderkey": 3}, allow_conditional_sampling=True,
               columns={"l_price": {"bounds": (0, 100)},
                        "l_shipdate": {"bounds": ("1992-01-01", "1995-01-01"), "bin_width": "1 day"}})


@pytest.fixture(scope="module")
def sessions() -> Any:
    out = {}
    for kind in KINDS:
        s = comparable_session(kind)
        _register(s)
        out[kind] = s
    yield out
    for s in out.values():
        s.close()


def _charges(s: dpsql.Session) -> int:
    return int(s.history().num_rows)


def _outcome(s: dpsql.Session, sql: str, **kw: Any) -> tuple[str, Any]:
    before = _charges(s)
    try:
        r = s.query(sql, epsilon=kw.get("epsilon", 1.0), delta=kw.get("delta", 1e-6))
    except errors.DPSQLError as e:
        assert _charges(s) == before, f"refused after its charge: {e}"
        return type(e).__name__, str(e)
    rows = sorted(r.table.to_pylist(), key=lambda row: tuple((v is None, str(v)) for v in row.values()))
    return "released", rows


def _same_on_both(sessions: Any, sql: str, **kw: Any) -> tuple[str, Any]:
    duck, spark = (_outcome(sessions[k], sql, **kw) for k in KINDS)
    assert duck == spark
    return duck


_DAYS = "SELECT l_shipdate AS d, COUNT(*) AS n FROM lineitem GROUP BY l_shipdate"
QUALIFY_REFUSED = [
    _DAYS + " QUALIFY row_number() OVER (ORDER BY d) > 1096",
    "SELECT k, COUNT(*) AS n FROM t WHERE k IN ('a', 'b') GROUP BY k QUALIFY COUNT(*) OVER () = 3",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY k) > 3",
    "SELECT k, SUM(x) AS n FROM t GROUP BY k HAVING k <> 'a' QUALIFY COUNT(*) OVER () = 3",
]
WHERE_REFUSED = [
    "SELECT s, COUNT(*) AS n FROM t WHERE i > 5 AND i < 3 GROUP BY s",
    "SELECT s, COUNT(*) AS n FROM t WHERE x > 1e308 AND x < 1e307 GROUP BY s",
    "SELECT s, COUNT(*) AS n FROM t WHERE s > 'b' AND s < 'a' GROUP BY s",
]


@pytest.mark.parametrize("sql", QUALIFY_REFUSED + WHERE_REFUSED)
def test_free_refusals_are_the_same_on_both_engines(sessions: Any, sql: str) -> None:
    kind, _ = _same_on_both(sessions, sql)
    assert kind == "UnsupportedQueryError"


ANSWERED = [
    _DAYS + " QUALIFY row_number() OVER (ORDER BY d) > 1095",
    _DAYS + " QUALIFY d = max(d) OVER ()",
    "SELECT k, COUNT(*) AS n FROM t GROUP BY k QUALIFY row_number() OVER (ORDER BY k) > 1",
    "SELECT s, COUNT(*) AS n FROM t WHERE i > 0 AND i < 2 GROUP BY s",
    "SELECT s, COUNT(*) AS n FROM t WHERE s > 's0' AND s < 's3' GROUP BY s",
    "SELECT k, SUM(big) AS r FROM t GROUP BY k",
]


@pytest.mark.parametrize("sql", ANSWERED)
def test_answers_are_the_same_on_both_engines(sessions: Any, sql: str) -> None:
    kind, rows = _same_on_both(sessions, sql)
    assert kind == "released" and rows, rows


_LO = "FROM lineitem l JOIN orders o ON o.o_orderkey = l.l_orderkey"
_LATE = "CASE WHEN l.l_shipdate > DATE '1993-06-01' THEN 'late' END"


@pytest.mark.parametrize(("key", "where"), [
    (_LATE, "l.l_shipdate IS NULL OR l.l_shipdate > DATE '1994-06-01'"),
    ("NULLIF(year(l.l_shipdate), 1992)", "l.l_shipdate IS NULL OR l.l_shipdate > DATE '1994-06-01'"),
    (_LATE, "l.l_shipdate IS NULL"),
])
def test_a_derived_join_key_and_its_null_group_are_the_same_on_both_engines(sessions: Any, key: str,
                                                                           where: str) -> None:
    kind, rows = _same_on_both(sessions, f"SELECT {key} AS k, COUNT(*) AS n {_LO} WHERE {where} GROUP BY k",
                               epsilon=4.0, delta=1e-7)
    assert kind == "released" and any(r["k"] is None for r in rows)


EXPLAINED = [
    # DAWA over the declared bins of a date (a histogram), R2T (no sampling), DP-S4S sampled and unsampled
    ("SELECT l_shipdate, COUNT(*) AS n FROM lineitem GROUP BY l_shipdate", None),
    ("SELECT SUM(l.l_price) AS r " + _LO, None),
    ("SELECT COUNT(*) AS n " + _LO, {"q": 0.5}),
    ("SELECT COUNT(*) AS n " + _LO, {"q": 1.0}),
]


@pytest.mark.parametrize(("sql", "options"), EXPLAINED)
def test_the_calibration_and_the_charge_are_the_same_on_both_engines(sessions: Any, sql: str, options: Any) -> None:
    plans = [sessions[k].explain(sql, epsilon=0.7, delta=1e-7, options=options) for k in KINDS]
    assert plans[0].mechanism == plans[1].mechanism
    assert plans[0].cost == plans[1].cost
    assert plans[0].parameters == plans[1].parameters
    spent = []
    for k in KINDS:
        s = sessions[k]
        before = s.history().num_rows
        r = s.query(sql, epsilon=0.7, delta=1e-7, options=options)
        assert s.history().num_rows == before + 1
        spent.append((r.cost if hasattr(r, "cost") else None, s.history().to_pylist()[-1]["epsilon"]))
    assert spent[0] == spent[1]


def _caller(shadow: str, schema: str) -> Any:
    """A new session of the process's SparkSession with a function named like Spark's LEAST/GREATEST that returns
    its first argument: a Python UDF, a SQL temporary function, or a persistent one with the session's SQL PATH
    putting its schema first."""
    from dpsql.engine.spark import spark_session

    caller = spark_session().newSession()
    if shadow == "udf":  # (resolved before Spark's own in the caller's session)
        caller.conf.set("spark.sql.functionResolution.sessionOrder", "first")
        caller.udf.register("least", lambda a, b: a, "double")
        caller.udf.register("greatest", lambda a, b: a, "double")
    elif shadow == "temporary":
        for f in ("least", "greatest"):
            caller.sql(f"CREATE TEMPORARY FUNCTION {f}(a DOUBLE, b DOUBLE) RETURNS DOUBLE RETURN a")
    else:
        caller.conf.set("spark.sql.path.enabled", "true")
        caller.sql(f"SET PATH = {schema}, system.builtin, system.session")
    return caller


@pytest.mark.parametrize("shadow", ["udf", "temporary", "path"])
def test_a_callers_spark_functions_named_like_sparks_own_do_not_reach_the_bounding(shadow_schema: str,
                                                                                    shadow: str) -> None:
    """The DuckDB engine refuses a caller's connection with a macro or Python function named like one of DuckDB's
    own (DuckDB called it in dpsql's bounding). The Spark engine works in ``newSession()`` of the caller's session,
    which has none of its temporary functions, UDFs or SQL PATH, and Spark 4 resolves an unqualified name to its
    built-in function before a session's: one person's 1e6 is clamped to the declared bound 2 on Spark as on
    DuckDB."""
    caller = _caller(shadow, shadow_schema)
    if shadow != "temporary":  # (the caller's own session does call its function in place of Spark's)
        assert caller.sql("SELECT least(5D, 1D) AS y").collect()[0]["y"] == 5.0
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9), engine={"kind": "spark"}, spark=caller)
    try:
        from dpsql.testing import use_noise, zero_noise

        use_noise(s, zero_noise(3))
        s.register("t", _people(), privacy_unit="uid", max_rows_per_unit=1, columns={"big": {"bounds": (0, 2)}})
        r = s.query("SELECT SUM(big) AS r FROM t", epsilon=1.0)
        assert r.table.column("r").to_pylist() == [pytest.approx(2.0 + 599.0)]
    finally:
        s.close()


REMAINDERS = [
    "SELECT s, COUNT(*) AS n FROM t WHERE x % 2.5 > 1 GROUP BY s",
    "SELECT x % -2.5 AS r, COUNT(*) AS n FROM t GROUP BY r",
    "SELECT CAST(x AS REAL) % CAST(0.3 AS REAL) AS r, COUNT(*) AS n FROM t GROUP BY r",
    "SELECT s, COUNT(*) AS n FROM t WHERE huge % 1e-10 IS NULL GROUP BY s",
    "SELECT x % 0.0 AS r, COUNT(*) AS n FROM t GROUP BY r",
]


@pytest.mark.parametrize("sql", REMAINDERS)
def test_a_float_remainder_runs_on_duckdb_and_is_refused_for_free_on_spark(sessions: Any, sql: str) -> None:
    """DuckDB computes a DOUBLE or FLOAT remainder under its guard (NULL where the quotient reaches 2^53); Spark's
    remainder of DOUBLEs is refused before any job and any charge, as docs/spark.md lists (the guard's CASE does not
    reach Spark)."""
    kind, rows = _outcome(sessions["duckdb"], sql)
    assert kind == "released" and rows
    kind, message = _outcome(sessions["spark"], sql)
    assert kind == "UnsupportedQueryError"
    assert message.startswith("% on DOUBLE or FLOAT is not supported on the Spark engine") and "nothing was run" in message


@pytest.mark.parametrize("qualify", ["row_number() OVER (ORDER BY l_shipdate) > 1096", "COUNT(*) OVER () > 1096"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_qualify_over_a_grouped_joins_date_range_that_keeps_no_day_is_refused_for_free(sessions: Any, kind: str,
                                                                                          qualify: str) -> None:
    """A grouped join by a DATE column's declared range releases every one of its 1 096 days (a key set read at run
    time, from the range alone). A QUALIFY on the keys alone that keeps none of them (a 1 097th row, more than 1 096
    rows) made a release with no row whatever the data, and it was charged on both engines: the key set was read
    before the charge for a HAVING or an OFFSET only, so the QUALIFY was never evaluated on it. Now a QUALIFY reads
    it too, and the query is refused for free, naming the QUALIFY; one that keeps a day still runs (below)."""
    s = sessions[kind]
    before = _charges(s)
    with pytest.raises(errors.UnsupportedQueryError, match="QUALIFY, which read the keys alone") as e:
        s.query(f"{_DAYS} QUALIFY {qualify}", epsilon=1.0, delta=1e-6)
    assert "public key" in str(e.value) and _charges(s) == before


def test_a_qualify_over_a_grouped_joins_date_range_that_keeps_a_day_releases_it(sessions: Any) -> None:
    """Negative control: one more day kept (row 1 096) is released, the same on both engines, and charged."""
    kind, rows = _same_on_both(sessions, _DAYS + " QUALIFY row_number() OVER (ORDER BY l_shipdate) > 1095")
    assert kind == "released" and [r["d"] for r in rows] == [datetime.date(1994, 12, 31)]


@pytest.fixture(scope="module")
def shadow_schema(tmp_path_factory: Any) -> Any:
    """A persistent schema of the process's Spark catalog with SQL functions ``least`` and ``greatest`` that return
    their first argument (dropped afterwards)."""
    from dpsql.engine.spark import spark_session

    base = spark_session()
    where = tmp_path_factory.mktemp("shadow")
    base.sql(f"CREATE DATABASE IF NOT EXISTS dpsql_shadow LOCATION '{where}'")
    for f in ("least", "greatest"):
        base.sql(f"CREATE OR REPLACE FUNCTION dpsql_shadow.{f}(a DOUBLE, b DOUBLE) RETURNS DOUBLE RETURN a")
    yield "spark_catalog.dpsql_shadow"
    for f in ("least", "greatest"):
        base.sql(f"DROP FUNCTION IF EXISTS dpsql_shadow.{f}")
    base.sql("DROP DATABASE IF EXISTS dpsql_shadow")


def _shadowed(own: Any, how: str, schema: str) -> None:
    if how == "set path":
        own.conf.set("spark.sql.path.enabled", "true")
        own.sql(f"SET PATH = {schema}, system.builtin, system.session")
    elif how == "default path":
        own.conf.set("spark.sql.path.enabled", "true")
        own.conf.set("spark.sql.defaultPath", f"{schema}, system.builtin, system.session")
    else:  # a temporary function resolved before the built-in ones
        own.conf.set("spark.sql.functionResolution.sessionOrder", "first")
        own.udf.register("least", lambda a, b: a, "double")


@pytest.mark.parametrize("how", ["set path", "default path", "session first"])
def test_dpsqls_own_spark_session_resolves_functions_to_sparks_own(shadow_schema: str, how: str) -> None:
    """dpsql's own Spark session (``SparkBackend.spark``, whose planning settings are set back before every read) took
    a SQL PATH naming a schema first (``SET PATH``, or ``spark.sql.defaultPath``), or a temporary function resolved
    before the built-in ones (``spark.sql.functionResolution.sessionOrder = first``, a Python UDF ``least``): Spark then called that schema's
    ``least`` in place of its own inside the bounding, as a caller's DuckDB macro did before that connection was
    refused (a ``least`` returning its first argument failed the bounded query after its charge here, one person's 1e6
    unclamped). Now the PATH is off, the default path empty and the session's functions after the built-in ones, set
    back before every read: the value is clamped to the declared bound 2."""
    from dpsql.testing import use_noise, zero_noise

    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.9), engine={"kind": "spark"})
    try:
        use_noise(s, zero_noise(3))
        s.register("t", _people(), privacy_unit="uid", max_rows_per_unit=1, columns={"big": {"bounds": (0, 2)}})
        own = s._engine.spark  # type: ignore[attr-defined]
        _shadowed(own, how, shadow_schema)
        assert own.sql("SELECT least(5D, 1D) AS y").collect()[0]["y"] == 5.0  # (the shadow is in force)
        r = s.query("SELECT SUM(big) AS r FROM t", epsilon=1.0)
        assert r.table.column("r").to_pylist() == [pytest.approx(2.0 + 599.0)]
    finally:
        s.close()


@pytest.mark.parametrize(("where", "released"), [
    ("x > 1e308 AND x IS NOT NULL", True),  # NaN is above every number on both engines
    ("x = -0.0 AND x >= 0.0", True),
    ("r > 1e39 AND r IS NOT NULL", True),
    ("x <> x", False),  # NaN equals itself on both engines
    ("x = 0 AND x < 0", False),
])
def test_the_one_column_decision_over_nan_and_signed_zeros_is_the_same_on_both_engines(sessions: Any, where: str,
                                                                                       released: bool) -> None:
    """The decision is made in DuckDB (the Spark engine post-processes in a private DuckDB, and its cache is keyed by
    the typed SQL alone) while Spark reads the rows: over NaN and -0.0 both engines agree with it."""
    kind, rows = _same_on_both(sessions, f"SELECT s, COUNT(*) AS n FROM f WHERE {where} GROUP BY s")
    assert (kind, bool(rows)) == (("released", True) if released else ("UnsupportedQueryError", True))
