"""The plan of a private read never depends on the statistics of the private rows.

DuckDB keeps statistics of every column (the min and max of each Parquet row group and of the
file, a DuckDB table's zone maps) and plans with them: a filter such as ``x > 5000`` is pushed
into the scan, which skips every row group whose max is at most 5000, and the optimizer folds it
to an empty result when the whole source's max is. So one person's row with ``x = 10^9`` switched
a query from reading nothing to reading that person's row group (122 880 rows of every column the
query reads): on 500 000 rows with a 2 kB text column, ``SELECT COUNT(*) FROM t WHERE x > 5000 AND
note LIKE '%zz%'`` took 25 ms of CPU without the person and 145 ms with them (the Arrow view;
40 ms against 300 ms wall), whatever ε. Timing such queries at a negligible ε told whether any row
exceeds a threshold: a binary search read the largest value of a column, one person's, exactly.

Every private read therefore runs with DuckDB's statistics-driven optimizers off (filters stay
where the bounded query puts them, evaluated on every row: ``dpsql.engine.duckdb.STATISTICS_OPTIMIZERS``).
These tests compare, on neighbouring datasets (D and D plus one person holding extreme values),
the physical plan of each private read (DuckDB's EXPLAIN under the read's own settings, estimated
cardinalities left out, which count rows and are never shown): it must be the same on both, and no
scan of a private source may carry a filter (which it would check against row-group statistics).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.engine import _duckdb_native as native
from dpsql.engine import duckdb as dd
from dpsql.testing import use_noise, zero_noise

N = 3000
PERSON = 10_000_000

QUERIES = [
    "SELECT COUNT(*) AS n FROM t WHERE x > 5000",
    "SELECT COUNT(*) AS n FROM t WHERE x > 5000 AND note LIKE '%zz%'",
    "SELECT COUNT(*) AS n FROM t WHERE note = 'hostile'",
    "SELECT COUNT(*) AS n FROM t WHERE x BETWEEN 2000000 AND 3000000000",
    "SELECT SUM(v) AS s FROM t WHERE x >= 1000",
    "SELECT x AS k, COUNT(*) AS n FROM t GROUP BY k",
    "SELECT x % 7 AS k, COUNT(*) AS n FROM t WHERE x < 0 GROUP BY k",
]


def _tables() -> tuple[pa.Table, pa.Table]:
    base = {"uid": [i // 3 for i in range(N)], "x": [(i * 37) % 1000 for i in range(N)],
            "note": [f"n{i % 50}" for i in range(N)], "v": [float(i % 10) for i in range(N)]}
    d0 = pa.table(base)
    one = pa.table({"uid": [PERSON], "x": [1_000_000_000], "note": ["hostile"], "v": [9.0]})
    half = N // 2  # the person's row in the middle of the file, inside one row group
    d1 = pa.concat_tables([d0.slice(0, half), one, d0.slice(half)])
    return d0, d1


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)


def _sources(tables: dict[str, dict[str, list[Any]]], con: duckdb.DuckDBPyConnection | None, tmp_path: Path,
             side: str) -> dict[str, str]:
    """Each table as a DuckDB table on ``con`` (a caller's connection) or, without one, a Parquet file."""
    sources = {}
    for name, cols in tables.items():
        if con is not None:
            con.register("arrow_" + name, pa.table(cols))
            con.execute(f"CREATE TABLE {name}_rows AS SELECT * FROM arrow_{name}")
            sources[name] = f"{name}_rows"
        else:
            sources[name] = str(tmp_path / f"{side}_{name}.parquet")
            pq.write_table(pa.table(cols), sources[name])
    return sources


class Plans:
    """The JSON plan of every private read, taken under the read's settings (the engine's own
    ``_native_views`` runs inside them, just before the read, with the read's SQL)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.plans: list[Any] = []
        orig = dd.DuckDBBackend._native_views

        def spy(engine: dd.DuckDBBackend, sql: str, *rest: Any) -> Any:
            used = orig(engine, sql, *rest)
            text = engine._con.sql("EXPLAIN (FORMAT json) " + sql).fetchall()[0][1]
            self.plans.append(_strip(json.loads(text)))
            return used

        monkeypatch.setattr(dd.DuckDBBackend, "_native_views", spy)


def _strip(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip(n) for n in node]
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "Estimated Cardinality"}
    return node


def _scans_with_filters(node: Any) -> list[Any]:
    out = []
    if isinstance(node, list):
        for n in node:
            out += _scans_with_filters(n)
    elif isinstance(node, dict):
        info = node.get("extra_info") or {}
        if any("filter" in str(k).lower() for k in info):
            out.append((node.get("name"), {k: v for k, v in info.items() if "filter" in str(k).lower()}))
        out += _scans_with_filters(node.get("children", []))
    return out


def _run(make_session: Any, sql: str, reads: int) -> None:
    s = make_session()
    try:
        use_noise(s, zero_noise())
        for _ in range(reads):
            s.query(sql, epsilon=1.0, delta=1e-6)
    finally:
        s.close()


def _register(s: dpsql.Session, source: Any) -> None:
    s.register("t", source, privacy_unit="uid", max_rows_per_unit=4,
               columns={"x": {"bounds": (0, 1000)}, "v": {"bounds": (0, 10)}})


def _parquet_sessions(tmp_path: Path) -> list[Any]:
    paths = []
    for i, t in enumerate(_tables()):
        p = tmp_path / f"d{i}.parquet"
        pq.write_table(t, p, row_group_size=500)
        paths.append(str(p))

    def make(path: str) -> Any:
        def f() -> dpsql.Session:
            s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
            _register(s, path)
            return s
        return f

    return [make(p) for p in paths]


@pytest.mark.parametrize("sql", QUERIES)
def test_parquet_read_plans_do_not_depend_on_one_persons_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sql: str) -> None:
    """Three reads per session: the first through the Arrow view, the later ones natively."""
    seen = []
    for make in _parquet_sessions(tmp_path):
        spy = Plans(monkeypatch)
        _run(make, sql, reads=3)
        seen.append(spy.plans)
        monkeypatch.undo()
        monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)
    assert len(seen[0]) == len(seen[1]) == 3
    assert seen[0] == seen[1], sql
    for plan in seen[0] + seen[1]:
        assert _scans_with_filters(plan) == [], (sql, _scans_with_filters(plan))


@pytest.mark.parametrize("sql", QUERIES)
def test_duckdb_table_read_plans_do_not_depend_on_one_persons_values(
        monkeypatch: pytest.MonkeyPatch, sql: str) -> None:
    seen = []
    for table in _tables():
        con = duckdb.connect()
        con.register("arrow_rows", table)
        con.execute("CREATE TABLE src AS SELECT * FROM arrow_rows")  # one name on both sides
        spy = Plans(monkeypatch)

        def make(con: duckdb.DuckDBPyConnection = con) -> dpsql.Session:
            s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), connection=con)
            _register(s, "src")
            return s

        _run(make, sql, reads=1)
        seen.append(spy.plans)
        monkeypatch.undo()
        con.close()
    assert seen[0] == seen[1], sql
    for plan in seen[0] + seen[1]:
        assert _scans_with_filters(plan) == [], (sql, _scans_with_filters(plan))


def test_control_plain_duckdb_plans_depend_on_one_persons_value(tmp_path: Path) -> None:
    """Negative control: DuckDB's own plan of the same filter is an empty result without the
    person and a filtered scan with them."""
    plans = []
    for i, t in enumerate(_tables()):
        p = tmp_path / f"c{i}.parquet"
        pq.write_table(t, p, row_group_size=500)
        text = duckdb.sql(f"EXPLAIN (FORMAT json) SELECT COUNT(*) FROM '{p}' WHERE x > 5000").fetchall()[0][1]
        plans.append(_strip(json.loads(text)))
    assert plans[0] != plans[1]
    assert _scans_with_filters(plans[1]) != []


JOIN_QUERIES = [
    "SELECT COUNT(*) AS n FROM o JOIN c ON o.ck = c.ck WHERE o.amt > 5",
    "SELECT c.seg, COUNT(*) AS n FROM o JOIN c ON o.ck = c.ck GROUP BY c.seg",
    "SELECT SUM(LEAST(GREATEST(o.amt, 0), 10)) AS s FROM o JOIN c ON o.ck = c.ck WHERE o.ok > 5000",
]


def test_join_read_plans_do_not_depend_on_one_persons_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The person adds a customer with an extreme key and three orders (Parquet files, read twice: the
    Arrow view, then natively)."""
    n = 400
    seen = []
    for side in ("d0", "d1"):
        cust: dict[str, list[Any]] = {"ck": list(range(n)), "seg": [f"s{i % 3}" for i in range(n)]}
        orders: dict[str, list[Any]] = {"ok": list(range(n)), "ck": list(range(n)), "amt": [float(i % 10) for i in range(n)]}
        if side == "d1":
            cust["ck"].append(10**12)
            cust["seg"].append("s1")
            for j in range(3):
                orders["ok"].append(10**12 + j)
                orders["ck"].append(10**12)
                orders["amt"].append(9.0)
        paths = {}
        for name, cols in (("c", cust), ("o", orders)):
            paths[name] = str(tmp_path / f"{side}_{name}.parquet")
            pq.write_table(pa.table(cols), paths[name], row_group_size=100)
        spy = Plans(monkeypatch)
        s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
        try:
            use_noise(s, zero_noise())
            s.register("c", paths["c"], privacy_unit="ck", columns={"seg": {"domain": ["s0", "s1", "s2"]}})
            s.register("o", paths["o"], references={"ck": "c.ck"}, degree_bounds={"ck": 4},
                       columns={"amt": {"bounds": (0, 10)}})
            for _ in range(2):
                for sql in JOIN_QUERIES:
                    s.query(sql, epsilon=1.0, delta=1e-6)
        finally:
            s.close()
        seen.append(spy.plans)
        monkeypatch.undo()
        monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)
    assert len(seen[0]) == len(seen[1]) >= 2 * len(JOIN_QUERIES)
    assert seen[0] == seen[1]
    for plan in seen[0] + seen[1]:
        assert _scans_with_filters(plan) == [], _scans_with_filters(plan)


def test_three_table_join_plans_on_duckdb_tables_do_not_depend_on_one_person(monkeypatch: pytest.MonkeyPatch) -> None:
    """customer <- orders <- lineitem as tables of a caller's connection (zone maps and distinct-count
    statistics): the person adds a customer, their orders and line items with extreme keys and prices."""
    import numpy as np
    from test_joins import ITEMS_PER_ORDER, ORDERS_PER_CUSTOMER, fk_data

    base = fk_data(n_customers=2000)
    queries = [
        "SELECT COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
        "JOIN lineitem l ON l.l_orderkey = o.o_orderkey",
        "SELECT n.n_name, COUNT(*) AS k FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
        "JOIN nation n ON c.c_nationkey = n.n_nationkey GROUP BY n.n_name",
        "SELECT SUM(l.l_price) AS s FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
        "JOIN lineitem l ON l.l_orderkey = o.o_orderkey WHERE l.l_price > 90",
    ]
    seen = []
    for side in (0, 1):
        d = dict(base)
        if side:
            d["customer"] = pa.concat_tables([d["customer"], pa.table({"c_custkey": np.array([10**12]),
                                                                       "c_nationkey": np.array([4])})])
            ok = np.array([10**13 + i for i in range(ORDERS_PER_CUSTOMER)])
            d["orders"] = pa.concat_tables([d["orders"], pa.table({"o_orderkey": ok, "o_custkey": np.full(ok.size, 10**12)})])
            lk = np.repeat(ok, ITEMS_PER_ORDER)
            d["lineitem"] = pa.concat_tables([d["lineitem"], pa.table({"l_orderkey": lk, "l_price": np.full(lk.size, 1e6)})])
        con = duckdb.connect()
        for name, table in d.items():
            con.register("arrow_" + name, table)
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM arrow_{name}")
        spy = Plans(monkeypatch)
        s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), connection=con)
        try:
            use_noise(s, zero_noise())
            s.register("nation", "nation", public=True)
            s.register("customer", "customer", privacy_unit="c_custkey", references={"c_nationkey": "nation.n_nationkey"})
            s.register("orders", "orders", references={"o_custkey": "customer.c_custkey"},
                       degree_bounds={"o_custkey": ORDERS_PER_CUSTOMER})
            s.register("lineitem", "lineitem", references={"l_orderkey": "orders.o_orderkey"},
                       degree_bounds={"l_orderkey": ITEMS_PER_ORDER}, columns={"l_price": {"bounds": (-20, 100)}})
            for sql in queries:
                for options in (None, {"q": 0.25}):
                    s.query(sql, epsilon=1.0, delta=1e-6, options=options)
        finally:
            s.close()
            con.close()
        seen.append(spy.plans)
        monkeypatch.undo()
    assert len(seen[0]) == len(seen[1]) >= 2 * len(queries)
    assert seen[0] == seen[1]


@pytest.mark.parametrize("kind", ["parquet", "table"])
def test_a_join_whose_sides_one_person_makes_cross_plans_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               kind: str) -> None:
    """DuckDB builds each hash join's table on the side it estimates smaller, from the sources' row counts
    (a Parquet footer's, a table's): with 400 customers and 399 orders, one person adding a customer and
    an order swapped the build and probe sides of the orders-customers join (the sides' estimates
    crossed), so that person's presence changed the plan and the work of the read."""
    seen = []
    for side in ("d0", "d1"):
        cust: dict[str, list[Any]] = {"ck": list(range(400)), "seg": [f"s{i % 3}" for i in range(400)]}
        orders: dict[str, list[Any]] = {"ok": list(range(399)), "ck": list(range(399)),
                                        "amt": [float(i % 10) for i in range(399)]}
        if side == "d1":
            cust["ck"].append(10**6)
            cust["seg"].append("s1")
            orders["ok"].append(10**6)
            orders["ck"].append(10**6)
            orders["amt"].append(9.0)
        con = duckdb.connect() if kind == "table" else None
        sources = _sources({"c": cust, "o": orders}, con, tmp_path, side)
        spy = Plans(monkeypatch)
        s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), connection=con)
        try:
            use_noise(s, zero_noise())
            s.register("c", sources["c"], privacy_unit="ck", columns={"seg": {"domain": ["s0", "s1", "s2"]}})
            s.register("o", sources["o"], references={"ck": "c.ck"}, degree_bounds={"ck": 4},
                       columns={"amt": {"bounds": (0, 10)}})
            for _ in range(2):  # a first and a later read of each source
                s.query(JOIN_QUERIES[0], epsilon=1.0, delta=1e-6)
        finally:
            s.close()
            if con is not None:
                con.close()
        seen.append(spy.plans)
        monkeypatch.undo()
        monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)
    assert len(seen[0]) == len(seen[1]) == 2
    assert seen[0] == seen[1]


@pytest.mark.parametrize("kind", ["parquet", "table"])
def test_three_joins_whose_sizes_one_person_makes_cross_keep_their_order(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        kind: str) -> None:
    """DuckDB ordered a chain of joins by the estimated row counts of its inputs: with 400 customers, 399
    orders and 399 line items, one person adding one of each turned (items JOIN orders) JOIN customers
    into items JOIN (orders JOIN customers), so that person's presence changed the plan of the read.
    Every private read now joins in the order its SQL writes (``join_order`` off)."""
    seen = []
    for side in ("d0", "d1"):
        tables: dict[str, dict[str, list[Any]]] = {
            "c": {"ck": list(range(400)), "seg": [f"s{i % 3}" for i in range(400)]},
            "o": {"ok": list(range(399)), "ck": list(range(399))},
            "l": {"ok": list(range(399)), "p": [1.0] * 399}}
        if side == "d1":
            for name, row in (("c", (10**6, "s1")), ("o", (10**6, 10**6)), ("l", (10**6, 2.0))):
                for col, v in zip(tables[name], row, strict=True):
                    tables[name][col].append(v)
        con = duckdb.connect() if kind == "table" else None
        sources = _sources(tables, con, tmp_path, side)
        spy = Plans(monkeypatch)
        s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), connection=con)
        try:
            use_noise(s, zero_noise())
            s.register("c", sources["c"], privacy_unit="ck", columns={"seg": {"domain": ["s0", "s1", "s2"]}})
            s.register("o", sources["o"], references={"ck": "c.ck"}, degree_bounds={"ck": 4})
            s.register("l", sources["l"], references={"ok": "o.ok"}, degree_bounds={"ok": 4},
                       columns={"p": {"bounds": (0, 10)}})
            for _ in range(2):  # a first and a later read of each source
                s.query("SELECT c.seg, COUNT(*) AS n FROM l JOIN o ON l.ok = o.ok JOIN c ON c.ck = o.ck GROUP BY c.seg",
                        epsilon=1.0, delta=1e-6)
        finally:
            s.close()
            if con is not None:
                con.close()
        seen.append(spy.plans)
        monkeypatch.undo()
        monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)
    assert len(seen[0]) == len(seen[1]) == 2
    assert seen[0] == seen[1]


#: join shapes whose inputs have close row counts, so that one person's rows cross the estimates: a chain
#: of four (with a public nation), a star (line items referencing orders and parts), a self-join path, a
#: GROUP BY over a join; each read plain and sampled (the DP-S4S path, q < 1)
SHAPES = {
    "chain4": "SELECT COUNT(*) AS k FROM n JOIN c ON c.nk = n.nk JOIN o ON o.ck = c.ck JOIN l ON l.ok = o.ok",
    "star": "SELECT COUNT(*) AS k FROM o JOIN l ON l.ok = o.ok JOIN p ON l.pk = p.pk",
    "path": "SELECT COUNT(*) AS k FROM e AS e1 JOIN e AS e2 ON e1.dst = e2.src JOIN u ON u.id = e1.src",
    "group": "SELECT n.name, SUM(l.x) AS s FROM l JOIN o ON l.ok = o.ok JOIN c ON c.ck = o.ck JOIN n ON c.nk = n.nk "
             "GROUP BY n.name",
}


def _shape_tables(side: str) -> dict[str, dict[str, list[Any]]]:
    """400 customers, parts and graph nodes, 399 orders, line items and edges; the person (``d1``) adds a
    customer with one order and one line item, and a node with one edge."""
    m = 399
    tables: dict[str, dict[str, list[Any]]] = {
        "n": {"nk": list(range(5)), "name": ["A", "B", "C", "D", "E"]},
        "c": {"ck": list(range(400)), "nk": [i % 5 for i in range(400)]},
        "o": {"ok": list(range(m)), "ck": list(range(m))},
        "l": {"ok": list(range(m)), "pk": list(range(m)), "x": [1.0] * m},
        "p": {"pk": list(range(400))},
        "u": {"id": list(range(400))},
        "e": {"src": list(range(m)), "dst": [(i + 1) % m for i in range(m)]},
    }
    if side == "d1":
        for name, row in (("c", (10**6, 1)), ("o", (10**6, 10**6)), ("l", (10**6, 3, 2.0)), ("u", (10**6,)),
                          ("e", (10**6, 0))):
            for col, v in zip(tables[name], row, strict=True):
                tables[name][col].append(v)
    return tables


def _shape_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, sql: str) -> list[list[Any]]:
    seen = []
    for side in ("d0", "d1"):
        con = duckdb.connect() if kind == "table" else None
        sources = _sources(_shape_tables(side), con, tmp_path, side)
        spy = Plans(monkeypatch)
        s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9), connection=con)
        try:
            use_noise(s, zero_noise())
            s.register("n", sources["n"], public=True)
            s.register("p", sources["p"], public=True)
            s.register("c", sources["c"], privacy_unit="ck", references={"nk": "n.nk"})
            s.register("o", sources["o"], references={"ck": "c.ck"}, degree_bounds={"ck": 4})
            s.register("l", sources["l"], references={"ok": "o.ok", "pk": "p.pk"}, degree_bounds={"ok": 4},
                       columns={"x": {"bounds": (0, 10)}})
            s.register("u", sources["u"], privacy_unit="id", allow_conditional_sampling=True)
            s.register("e", sources["e"], references={"src": "u.id", "dst": "u.id"}, degree_bounds={"src": 4, "dst": 4},
                       allow_conditional_sampling=True)
            for options in (None, {"q": 0.5}):
                s.query(sql, epsilon=1.0, delta=1e-6, options=options)
        finally:
            s.close()
            if con is not None:
                con.close()
        seen.append(spy.plans)
        monkeypatch.undo()
        monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)
    return seen


@pytest.mark.parametrize("kind", ["parquet", "table"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_join_shapes_whose_sizes_one_person_makes_cross_keep_their_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        kind: str, shape: str) -> None:
    seen = _shape_plans(tmp_path, monkeypatch, kind, SHAPES[shape])
    assert len(seen[0]) == len(seen[1]) >= 2
    assert seen[0] == seen[1]


@pytest.mark.parametrize("kind", ["parquet", "table"])
def test_control_join_order_regroups_a_join_by_one_persons_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                kind: str) -> None:
    """Negative control: with DuckDB's ``join_order`` (and ``filter_pullup``) on, the same GROUP BY over four
    inputs is planned differently with and without the person."""
    kept = dd.STATISTICS_OPTIMIZERS
    dd.STATISTICS_OPTIMIZERS = tuple(o for o in kept if o not in ("join_order", "filter_pullup"))
    try:
        seen = _shape_plans(tmp_path, monkeypatch, kind, SHAPES["group"])
    finally:
        dd.STATISTICS_OPTIMIZERS = kept
    assert len(seen[0]) == len(seen[1]) >= 2
    assert seen[0] != seen[1]
