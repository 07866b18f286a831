"""The physical plan Spark runs for a private read never depends on the private rows.

Spark plans with what it learns of the data: Adaptive Query Execution re-plans each query between
its stages from the sizes of the shuffled rows (a stage that produced no row turns its join or
aggregate into an empty relation, a small stage is broadcast, partitions are coalesced by bytes,
skewed ones split), joins are broadcast when a side's estimated size (a Parquet file's size, an Arrow
table's row count) is under ``spark.sql.autoBroadcastJoinThreshold``, runtime Bloom filters and
dynamic partition pruning are injected from the same estimates, and an Arrow table (a
``LocalRelation``) has its filters evaluated, and an empty result folded, while the query is
optimised. So one person's rows (the only ones that pass a filter, or the bytes that take a side
over the threshold) switched the plan and the work of a read, whatever ε.

These tests run join queries, a GROUP BY without declared keys (a sparse histogram) and a range
workload on neighbouring datasets (D, and D plus one person) through dpsql's Spark engine, take the
plan each private read executed (after the read, so AQE's final plan where AQE runs: node names,
and each node's number of output partitions) and require the same plans on both. The engine's
session starts with Spark's defaults where the test leaves them (AQE on), and the broadcast
threshold is set on it, between the sizes Spark estimates for one join side on D and on D plus the
person: dpsql's private reads must plan the same whatever its session says. Negative control: the
same bounded SQL run by Spark directly under those settings plans differently on the two datasets.
Skipped (with the reason) without pyspark/Java."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _spark import require_spark

import dpsql
from dpsql.testing import use_noise, zero_noise

require_spark()

PERSON = 10**12
N = 400

#: what dpsql's Spark session may say before a read (Spark's defaults, set again in case the
#: process's SparkContext was started otherwise)
HOSTILE = {"spark.sql.adaptive.enabled": "true", "spark.sql.autoBroadcastJoinThreshold": "10485760",
           "spark.sql.optimizer.runtime.bloomFilter.enabled": "true",
           "spark.sql.optimizer.excludedRules": ""}

JOINS = [
    "SELECT COUNT(*) AS n FROM o JOIN c ON o.ck = c.ck WHERE o.amt > 5",
    "SELECT c.seg, COUNT(*) AS n FROM o JOIN c ON o.ck = c.ck WHERE o.amt > 5 GROUP BY c.seg",
    "SELECT SUM(o.amt) AS s FROM o JOIN c ON o.ck = c.ck",
]
SPARSE = "SELECT x AS k, COUNT(*) AS n FROM t WHERE note = 'hostile' GROUP BY k"
WORKLOAD = [
    "SELECT COUNT(*) FROM t WHERE note = 'hostile' AND x BETWEEN 0 AND 99",
    "SELECT COUNT(*) FROM t WHERE note = 'hostile' AND x >= 100 AND x < 600",
    "SELECT COUNT(*) FROM t WHERE note = 'hostile' AND x BETWEEN 0 AND 1000",
]


def _tables(side: str) -> dict[str, dict[str, list[Any]]]:
    """customers c <- orders o, and a table t of one row per person; D1 adds a person with a customer,
    three orders over the filter's bound and a row of t with a note no one else has (the only rows to pass
    the queries' filters)."""
    c: dict[str, list[Any]] = {"ck": list(range(N)), "seg": [f"s{i % 3}" for i in range(N)]}
    o: dict[str, list[Any]] = {"ok": list(range(N)), "ck": list(range(N)), "amt": [float(i % 5) for i in range(N)]}
    t: dict[str, list[Any]] = {"uid": list(range(N)), "x": [(i * 37) % 1000 for i in range(N)],
                               "note": [f"n{i % 9}" for i in range(N)]}
    if side == "d1":
        c["ck"].append(PERSON)
        c["seg"].append("s1")
        for j in range(3):
            o["ok"].append(PERSON + j)
            o["ck"].append(PERSON)
            o["amt"].append(9.0)
        t["uid"].append(PERSON)
        t["x"].append(500)
        t["note"].append("hostile")
    return {"c": c, "o": o, "t": t}


def _node(plan: Any) -> Any:
    """The node that ran: AQE's final plan inside an adaptive plan, a query stage's plan."""
    name = str(plan.getClass().getSimpleName())
    if name == "AdaptiveSparkPlanExec":
        return _node(plan.executedPlan())
    if name.endswith("QueryStageExec"):
        return _node(plan.plan())
    return plan


def _shape(plan: Any) -> tuple[Any, ...]:
    """(node name, output partitions, children) of an executed physical plan."""
    plan = _node(plan)
    kids = plan.children()
    return (str(plan.nodeName()), int(plan.outputPartitioning().numPartitions()),
            tuple(_shape(kids.apply(i)) for i in range(kids.size())))


def _join_side_sizes(df: Any) -> list[int]:
    """The estimated sizes (bytes) of both sides of each join of a DataFrame's optimised plan."""
    out: list[int] = []

    def walk(p: Any) -> None:
        kids = p.children()
        if str(p.nodeName()) == "Join":
            out.extend(int(str(kids.apply(i).stats().sizeInBytes())) for i in range(kids.size()))
        for i in range(kids.size()):
            walk(kids.apply(i))

    walk(df._jdf.queryExecution().optimizedPlan())
    return out


class Reads:
    """Every DataFrame a private read executed (``dpsql.engine.spark._arrow_by_partition``) and its SQL, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, spark: Any) -> None:
        import dpsql.engine.spark as spark_engine
        from dpsql.engine.spark import SparkBackend

        self.frames: list[Any] = []
        self.sqls: list[str] = []
        rendered: list[str] = []
        render, read = SparkBackend.render, spark_engine._arrow_by_partition

        def spy_render(engine: Any, ast: Any, **kw: Any) -> str:
            rendered.append(render(engine, ast, **kw))
            return rendered[-1]

        def spy(df: Any) -> Any:
            out = read(df)
            self.frames.append(df)
            self.sqls.append(rendered[-1])
            return out

        monkeypatch.setattr(SparkBackend, "render", spy_render)
        monkeypatch.setattr(spark_engine, "_arrow_by_partition", spy)
        self.to_arrow = type(spark.sql("SELECT 1")).toArrow


def _session(paths: dict[str, str], kind: str, settings: dict[str, str]) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), engine="spark")
    use_noise(s, zero_noise())
    engine_spark = s._engine.spark  # type: ignore[attr-defined]
    for k, v in settings.items():
        engine_spark.conf.set(k, v)
    if kind == "join":
        s.register("c", paths["c"], privacy_unit="ck", columns={"seg": {"domain": ["s0", "s1", "s2"]}})
        s.register("o", paths["o"], references={"ck": "c.ck"}, degree_bounds={"ck": 4},
                   columns={"amt": {"bounds": (0, 10)}})
    else:
        s.register("t", paths["t"], privacy_unit="uid", columns={"x": {"bounds": (0, 1000), "bins": 10}})
    return s


def _sources(tmp_path: Path, side: str, source: str) -> dict[str, Any]:
    """Each table of ``side`` as a Parquet file (one name under the side's directory) or an Arrow table."""
    out: dict[str, Any] = {}
    for name, cols in _tables(side).items():
        if source == "arrow":
            out[name] = pa.table(cols)
            continue
        (tmp_path / side).mkdir(exist_ok=True)
        out[name] = str(tmp_path / side / f"{name}.parquet")
        pq.write_table(pa.table(cols), out[name])
    return out


class Seen:
    """What the private reads of one dataset executed, and what Spark itself ran for the same SQL."""

    def __init__(self, dpsql_plans: list[Any], sizes: list[list[int]], spark_plans: list[Any]) -> None:
        self.dpsql_plans, self.sizes, self.spark_plans = dpsql_plans, sizes, spark_plans


def _run(monkeypatch: pytest.MonkeyPatch, paths: dict[str, Any], kind: str, settings: dict[str, str]) -> Seen:
    """Run ``kind``'s queries through dpsql on a session set to ``settings``;
    then (negative control) run each private read's SQL directly on that session under the same settings."""
    s = _session(paths, kind, settings)
    try:
        spark = s._engine.spark  # type: ignore[attr-defined]
        reads = Reads(monkeypatch, spark)
        if kind == "join":
            for sql in JOINS:
                s.query(sql, epsilon=1.0, delta=1e-6)
        elif kind == "sparse":
            s.query(SPARSE, epsilon=1.0, delta=1e-6)
        else:
            s.query_many(WORKLOAD, epsilon=1.0)
        shapes = [_shape(df._jdf.queryExecution().executedPlan()) for df in reads.frames]
        sizes = [_join_side_sizes(df) for df in reads.frames]
        direct = []
        for sql in reads.sqls[:1]:  # the first read of each dataset
            for k, v in settings.items():
                spark.conf.set(k, v)
            df = spark.sql(sql)
            reads.to_arrow(df)
            direct.append(_shape(df._jdf.queryExecution().executedPlan()))
        return Seen(shapes, sizes, direct)
    finally:
        monkeypatch.undo()
        s.close()


def _crossing(sizes: list[list[list[int]]]) -> int:
    """A broadcast threshold under which a join of the first read has a side small enough to broadcast
    on D only (each join's smaller side)."""
    a, b = sizes[0][0], sizes[1][0]
    for j in range(0, min(len(a), len(b)), 2):
        s0, s1 = min(a[j:j + 2]), min(b[j:j + 2])
        if s0 < s1:
            return s0
    raise AssertionError(f"no join side grows with the person: {sizes}")


#: (source, side) -> what the join queries' reads under ``HOSTILE`` executed: the same sources and settings in
#: both tests below (the broadcast test takes its threshold from the first read's join sizes)
_HOSTILE_JOINS: dict[tuple[str, str], Seen] = {}


def _hostile_joins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str, side: str) -> Seen:
    if (source, side) not in _HOSTILE_JOINS:
        _HOSTILE_JOINS[(source, side)] = _run(monkeypatch, _sources(tmp_path, side, source), "join", HOSTILE)
    return _HOSTILE_JOINS[(source, side)]


@pytest.mark.parametrize("source", ["parquet", "arrow"])
@pytest.mark.parametrize("kind", ["join", "sparse", "workload"])
def test_private_read_plans_do_not_depend_on_one_person(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        kind: str, source: str) -> None:
    """AQE on (Spark's default): the filters pass no row on D and the person's rows on D plus them."""
    d0, d1 = (_hostile_joins(monkeypatch, tmp_path, source, side) if kind == "join" else
              _run(monkeypatch, _sources(tmp_path, side, source), kind, HOSTILE) for side in ("d0", "d1"))
    assert len(d0.dpsql_plans) == len(d1.dpsql_plans) >= (len(JOINS) if kind == "join" else 1)
    assert d0.dpsql_plans == d1.dpsql_plans, kind
    assert d0.spark_plans != d1.spark_plans  # negative control: Spark's own plans differ


@pytest.mark.parametrize("source", ["parquet", "arrow"])
def test_join_plans_alike_when_a_side_crosses_the_broadcast_threshold(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      source: str) -> None:
    """The session's broadcast threshold lies between the sizes Spark estimates for a join side on D
    and on D plus the person (the sizes of the first read of a run under ``HOSTILE``: the test above's)."""
    data = [_sources(tmp_path, side, source) for side in ("d0", "d1")]
    sizes = [_hostile_joins(monkeypatch, tmp_path, source, side).sizes for side in ("d0", "d1")]
    # AQE off: the negative control's plans differ by the broadcast alone, not by an emptied stage
    lowered = {**HOSTILE, "spark.sql.autoBroadcastJoinThreshold": str(_crossing(sizes)),
               "spark.sql.adaptive.enabled": "false"}
    d0, d1 = (_run(monkeypatch, d, "join", lowered) for d in data)
    assert d0.dpsql_plans == d1.dpsql_plans
    assert d0.spark_plans != d1.spark_plans
