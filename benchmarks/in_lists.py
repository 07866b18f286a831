"""Benchmark: what a long IN list costs to plan (``Session.explain``) and to query, beyond the bounded query's run.

One command:  python benchmarks/in_lists.py [--sizes 100,1000,10000] [--repeat 3] [--shapes text_key,...]
Prints JSON (also written to ``benchmarks/out/in_lists.json``).

The table is generated here (2 000 rows, 200 people; a small Parquet file in a temporary directory, no shared
data). For each shape and list length n, each figure is the best of ``--repeat`` runs in a new session (no
plan remembered from an earlier run), in CPU seconds of the process (user + system: what the wall time is on
an idle machine, far less sensitive to other work on a shared one) and in wall seconds:

* ``explain``: ``Session.explain`` of the query (planning, the free bind checks on DuckDB, the bounded SQL's text);
* ``query``: ``Session.query`` (ε = 1, δ = 1e-6) without the bounded query's run: DuckDB's parse and run of the
  bounded query in the engine's private read (``fetch_arrow``) are measured and taken out (``run`` gives them).

Shapes (n values each; the keys listed by a WHERE are the released keys, ``tests/test_listed_keys.py``):

* ``text_key``: ``SELECT k, COUNT(*) FROM t WHERE k IN ('v00001', ...) GROUP BY k``;
* ``int_key``, ``date_key``, ``decimal_key``: the same on an INTEGER, a DATE and a DECIMAL(12, 1) column;
* ``not_in``: ``SELECT g, COUNT(*) FROM t WHERE k NOT IN (...) GROUP BY g`` (g declared: public keys);
* ``filter``: ``SELECT g, COUNT(*) FROM t WHERE f IN (...) GROUP BY g``, the list on a column that is no key.

Each result also gives a digest (SHA-256) of explain's bounded SQL (the source's view, named afresh by each
session, named ``t``) and of the released keys (the listed-key shapes' keys read the query's text only, so they
are the same at every run), to compare two versions of dpsql.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import hashlib
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dpsql  # noqa: E402

ROWS, PEOPLE = 2_000, 200
SHAPES = ("text_key", "int_key", "date_key", "decimal_key", "not_in", "filter")
#: the shapes whose released keys are the listed values (their digest is the same at every run)
LISTED = ("text_key", "int_key", "date_key", "decimal_key")


def write_table(path: str) -> None:
    day0 = datetime.date(2020, 1, 1)
    table = pa.table({
        "uid": pa.array([i % PEOPLE for i in range(ROWS)], pa.int64()),
        "k": pa.array([f"v{i % 500 + 1:05d}" for i in range(ROWS)], pa.string()),
        "i": pa.array([i % 500 + 1 for i in range(ROWS)], pa.int32()),
        "d": pa.array([day0 + datetime.timedelta(days=i % 500) for i in range(ROWS)], pa.date32()),
        "m": pa.array([decimal.Decimal(i % 500 + 10) / 10 for i in range(ROWS)], pa.decimal128(12, 1)),
        "f": pa.array([f"w{i % 300 + 1:05d}" for i in range(ROWS)], pa.string()),
        "g": pa.array([("a", "b", "c")[i % 3] for i in range(ROWS)], pa.string()),
    })
    pq.write_table(table, path)


def query_text(shape: str, n: int) -> str:
    texts = ", ".join(f"'v{j:05d}'" for j in range(1, n + 1))
    if shape == "text_key":
        return f"SELECT k, COUNT(*) AS n FROM t WHERE k IN ({texts}) GROUP BY k"
    if shape == "int_key":
        return f"SELECT i, COUNT(*) AS n FROM t WHERE i IN ({', '.join(str(j) for j in range(1, n + 1))}) GROUP BY i"
    if shape == "date_key":
        day0 = datetime.date(2020, 1, 1)
        days = ", ".join(f"'{day0 + datetime.timedelta(days=j)}'" for j in range(n))
        return f"SELECT d, COUNT(*) AS n FROM t WHERE d IN ({days}) GROUP BY d"
    if shape == "decimal_key":  # 1.0, 1.1, ...: (a DECIMAL key of values all below 1 is another matter)
        return f"SELECT m, COUNT(*) AS n FROM t WHERE m IN ({', '.join(f'{(j + 10) / 10:.1f}' for j in range(n))}) GROUP BY m"
    if shape == "not_in":
        return f"SELECT g, COUNT(*) AS n FROM t WHERE k NOT IN ({texts}) GROUP BY g"
    if shape == "filter":
        others = ", ".join(f"'w{j:05d}'" for j in range(1, n + 1))
        return f"SELECT g, COUNT(*) AS n FROM t WHERE f IN ({others}) GROUP BY g"
    raise ValueError(shape)


def session(path: str) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5))
    s.register("t", path, privacy_unit="uid", max_groups_per_unit=5, columns={"g": {"domain": ["a", "b", "c"]}})
    return s


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Timed:
    """A DuckDB connection whose ``sql(...)`` (parse, bind, plan) and the relation's ``to_arrow_table()`` (the run)
    add their CPU and wall seconds to ``spent``; everything else is the connection's own."""

    def __init__(self, con: Any, spent: list[float]) -> None:
        self._target, self._spent = con, spent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def _timed(self, f: Any, *a: Any, **k: Any) -> Any:
        c, w = cpu(), time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            self._spent[0] += cpu() - c
            self._spent[1] += time.perf_counter() - w

    def sql(self, *a: Any, **k: Any) -> Any:
        rel = self._timed(self._target.sql, *a, **k)
        timed = self

        class Relation:
            def to_arrow_table(self, *b: Any, **kw: Any) -> Any:
                return timed._timed(rel.to_arrow_table, *b, **kw)

            def __getattr__(self, name: str) -> Any:
                return getattr(rel, name)

        return Relation()


def _timed_read(engine: Any, fetch: Any, spent: list[float]) -> Any:
    """``engine.fetch_arrow`` (the private read) with DuckDB's parse and run of the bounded query timed apart: what
    the read prepares in Python (the read salt put in, the text rendered) stays in the query's own time."""

    def read(*a: Any, **k: Any) -> Any:
        con = engine._con
        engine._con = _Timed(con, spent)
        try:
            return fetch(*a, **k)
        finally:
            engine._con = con

    return read


def measure(path: str, shape: str, n: int, repeat: int) -> dict[str, Any]:
    sql = query_text(shape, n)
    out: dict[str, Any] = {"shape": shape, "n": n}
    explain_cpu, explain_wall, query_cpu, query_wall, run_cpu, run_wall = [], [], [], [], [], []
    for _ in range(repeat):
        s = session(path)
        try:
            c, w = cpu(), time.perf_counter()
            plan = s.explain(sql, epsilon=1.0, delta=1e-6)
            explain_cpu.append(cpu() - c)
            explain_wall.append(time.perf_counter() - w)
            # (the source's view is named afresh for each session: named alike here)
            out["mechanism"] = plan.mechanism
            out["bounded_sql_sha256"] = digest(plan.bounded_sql.replace(s.tables["t"].view, "t"))
        finally:
            s.close()
        s = session(path)
        try:
            engine, spent = s._engine, [0.0, 0.0]
            engine.fetch_arrow = _timed_read(engine, engine.fetch_arrow, spent)
            c, w = cpu(), time.perf_counter()
            r = s.query(sql, epsilon=1.0, delta=1e-6)
            query_cpu.append(cpu() - c - spent[0])
            query_wall.append(time.perf_counter() - w - spent[1])
            run_cpu.append(spent[0])
            run_wall.append(spent[1])
            keys = sorted(str(row[r.table.column_names[0]]) for row in r.table.to_pylist())
            out["released_rows"] = len(keys)
            if shape in LISTED:
                out["released_keys_sha256"] = digest("\n".join(keys))
        finally:
            s.close()
    out.update({
        "explain_cpu_seconds": round(min(explain_cpu), 3), "explain_wall_seconds": round(min(explain_wall), 3),
        "query_cpu_seconds": round(min(query_cpu), 3), "query_wall_seconds": round(min(query_wall), 3),
        "run_cpu_seconds": round(min(run_cpu), 3), "run_wall_seconds": round(min(run_wall), 3),
    })
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "in_lists.json"))
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    shapes = [x for x in args.shapes.split(",") if x]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.parquet")
        write_table(path)
        s = session(path)  # the first query of a process imports and compiles what later ones reuse
        try:
            s.explain(query_text("text_key", 10), epsilon=1.0, delta=1e-6)
        finally:
            s.close()
        for shape in shapes:
            for n in sizes:
                results.append(measure(path, shape, n, args.repeat))
                print(json.dumps(results[-1]), file=sys.stderr)
    out = {"benchmark": "in_lists", "rows": ROWS, "people": PEOPLE, "repeat": args.repeat, "results": results,
           "target_seconds": {"explain and query of 10 000 values": 1.0}, "load_average": os.getloadavg(),
           "dpsql": dpsql.__file__}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
