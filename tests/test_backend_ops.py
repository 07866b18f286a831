"""Semantic equivalence of the backends' building blocks (``dpsql.engine.base.SqlOps``).

Every backend in ``dpsql.engine.BACKENDS`` runs each building block on the same small inputs,
through its own ``ExecutionBackend`` (sources registered, ASTs rendered strictly for its
dialect), and the outputs are compared with a pure-Python reference -- same inputs, same
outputs, not merely SQL that renders. Every backend in ``BACKENDS`` (DuckDB, Spark)
is tested by the ``backend`` fixture (Spark is skipped, with the reason, without pyspark or Java;
with ``DPSQL_REQUIRE_EXTRAS=1``, as in CI, that is a failure).

* keep_n_per_partition keeps exactly min(n, size) rows per partition, those with the smallest
  key, in both spellings, and a partition's choice depends on its own rows only;
* keyed_hash is uniform (chi-square on buckets), orders a unit's groups uniformly and
  independently across salts (chi-square, p >= 1e-6 with fixed inputs), with negative controls
  that must fail: a key that ignores the salt, and DuckDB's multi-argument HASH(salt, cols);
* clamp keeps NULL, clamps +-inf and NaN; try_cast is NULL where a value does not convert;
  typed_literal round-trips dates, timestamps, decimals, integers, floats and quoted text;
* the composed bounding steps give the results of the golden SQL of ``tests/test_bounding.py``
  (and choice-independent totals where caps bind), and the per-unit row cap L holds;
* strict rendering: the DuckDB building blocks are never rendered for Spark.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import math
import os
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import sqlglot
from scipy.stats import binomtest, chi2_contingency, chisquare
from sqlglot import exp
from test_bounding import GOLDEN_SQL, _golden_spec

from dpsql.catalog import ColumnSpec, TableSpec
from dpsql.engine import (
    BACKENDS,
    DuckDBBackend,
    DuckDBOps,
    EngineSettings,
    ExecutionBackend,
    SqlOps,
    source_name,
)
from dpsql.errors import ConfigError, UnsupportedQueryError
from dpsql.plan.analyze import analyze
from dpsql.rewrite.bound import SALT_PLACEHOLDER, Caps, ContributionModel, bounded_query, released_columns
from dpsql.rewrite.render import render

ALPHA = 1e-6


def _spark_missing() -> str | None:
    """Why the Spark backend cannot run here (None if it can)."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("pyspark") is None:
        return "the Spark backend needs the 'spark' extra: pip install 'dpsql[spark]'"
    if shutil.which("java") is None:
        return "the Spark backend needs Java 17 on the PATH"
    return None


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def module_backend(request: pytest.FixtureRequest) -> Iterator[ExecutionBackend]:
    """One backend per engine for the module: starting one costs a Spark session (its configuration set
    call by call) and a DuckDB connection, the same for every test."""
    if request.param == "spark" and (why := _spark_missing()) is not None:
        if os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    b = BACKENDS[request.param](None, EngineSettings(debug=True, statement_timeout=120))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def backend(module_backend: ExecutionBackend) -> Iterator[ExecutionBackend]:
    """The module's backend of each engine, with its own building blocks: a test may swap ``ops``
    (``SaltedDuckDBOps``), which is undone afterwards; every test unregisters the sources it registers
    (``run``, ``orders_over_salts``), so each starts with none."""
    ops = module_backend.ops
    try:
        yield module_backend
    finally:
        module_backend.ops = ops


def run_arrow(b: ExecutionBackend, ast: exp.Expression, **tables: pa.Table) -> pa.Table:
    """The result of ``ast`` run on backend ``b``, the tables registered as its sources."""
    for name, t in tables.items():
        b.register_source(name, "arrow", t)
    try:
        return b.fetch_arrow(ast, what="a building-block test")
    finally:
        for name in tables:
            b.unregister_source(name, "arrow")


def run(b: ExecutionBackend, ast: exp.Expression, **tables: pa.Table) -> list[dict[str, Any]]:
    """Rows of ``ast`` run on backend ``b``, the tables registered as its sources."""
    return run_arrow(b, ast, **tables).to_pylist()


def src(name: str) -> exp.Expression:
    return exp.select("*").from_(exp.to_table(source_name(name), quoted=True)).subquery("__r")


def test_duckdb_backend_implements_the_protocols() -> None:
    b = DuckDBBackend()
    try:
        assert isinstance(b, ExecutionBackend) and isinstance(b.ops, SqlOps)
        assert b.dialect == b.ops.dialect == "duckdb"
    finally:
        b.close()
    assert BACKENDS["duckdb"] is DuckDBBackend


def test_every_backend_implements_the_protocols(backend: ExecutionBackend) -> None:
    """Each engine of ``BACKENDS`` (a new one too): both protocols, one dialect, and building blocks that
    declare how their hashes read a salted text (``engine.base.check_declarations``)."""
    from dpsql.engine.base import check_declarations

    assert isinstance(backend, ExecutionBackend) and isinstance(backend.ops, SqlOps)
    assert backend.dialect == backend.ops.dialect
    check_declarations(type(backend.ops))


def test_backend_renders_its_own_bounded_query(backend: ExecutionBackend) -> None:
    sql, caps, golden = GOLDEN_SQL["grouped_sum_avg"]
    spec = _golden_spec()
    ast = bounded_query(analyze(sql, {spec.name: spec}), caps, unit_column="user_id", ops=backend.ops)
    text = backend.render(ast, pretty=True)
    if backend.dialect == "duckdb":
        assert text == render(ast, dialect=backend.dialect, pretty=True)
        assert text == golden
    else:  # Spark renders the Spark form of the typer's expressions (dpsql.engine.spark_ops.lower_for_spark)
        from dpsql.engine.spark_ops import lower_for_spark

        assert text == render(lower_for_spark(ast), dialect=backend.dialect, pretty=True)


# -- keep_n_per_partition ---------------------------------------------------------------------------


def partitions(seed: int = 5, n_parts: int = 30) -> pa.Table:
    gen = np.random.default_rng(seed)
    sizes = gen.integers(0, 8, n_parts)  # some partitions are empty
    part = np.repeat(np.arange(n_parts), sizes)
    key = gen.permutation(10 * len(part))[: len(part)]  # distinct keys: the reference is exact
    return pa.table({"part": part.astype(np.int64), "id": np.arange(len(part), dtype=np.int64),
                     "key": key.astype(np.int64)})


def reference_keep(t: pa.Table, key: dict[int, int], n: int) -> set[int]:
    by: dict[int, list[tuple[int, int]]] = {}
    for r in t.to_pylist():
        by.setdefault(r["part"], []).append((key[r["id"]], r["id"]))
    return {i for rows in by.values() for _, i in sorted(rows)[:n]}


KEEP_N = [1, 2, 3, 9]
KEEP_OUTPUTS: dict[str, list[str] | None] = {"window": None, "aggregate": ["id", "part"]}

#: per backend (dialect, ops class, object id): rows of every ``KEEP_N`` x ``KEEP_OUTPUTS`` case, or of every
#: ``LITERALS`` case, read by one query each (on Spark a query per case was a job per case, for the same answers)
_BATCHED: dict[tuple[str, str, type, int], Any] = {}


def _batch_key(what: str, backend: ExecutionBackend) -> tuple[str, str, type, int]:
    return what, backend.dialect, type(backend.ops), id(backend)


def kept_per_case(backend: ExecutionBackend) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """The rows ``keep_n_per_partition`` keeps of ``partitions()`` for every (n, output form), each case's
    kept subquery a branch of one UNION ALL tagged with its case (one query on the backend, not eight)."""
    key = _batch_key("keep_n", backend)
    if key not in _BATCHED:
        cases = [(n, form) for n in KEEP_N for form in KEEP_OUTPUTS]
        branches = [exp.select(exp.alias_(exp.Literal.number(i), "__case"), "id", "part").from_(
            backend.ops.keep_n_per_partition(src("t"), ["part"], exp.column("key"), n, alias="__k",
                                             output=KEEP_OUTPUTS[form])) for i, (n, form) in enumerate(cases)]
        union = branches[0]
        for b in branches[1:]:
            union = exp.union(union, b, distinct=False)
        out: dict[tuple[int, str], list[dict[str, Any]]] = {c: [] for c in cases}
        for r in run(backend, union, t=partitions()):
            out[cases[r.pop("__case")]].append(r)
        _BATCHED[key] = out
    return _BATCHED[key]  # type: ignore[no-any-return]


@pytest.mark.parametrize("n", KEEP_N)
@pytest.mark.parametrize("output", list(KEEP_OUTPUTS))
def test_keep_n_per_partition_keeps_the_n_smallest_keys(backend: ExecutionBackend, n: int, output: str) -> None:
    t = partitions()
    rows = kept_per_case(backend)[(n, output)]
    got = [r["id"] for r in rows]
    assert len(got) == len(set(got))
    expected = reference_keep(t, {r["id"]: r["key"] for r in t.to_pylist()}, n)
    assert set(got) == expected
    sizes = np.bincount(t.column("part").to_numpy(), minlength=30)
    per = np.bincount([r["part"] for r in rows], minlength=30)
    assert (per == np.minimum(sizes, n)).all()


def test_keep_n_with_the_keyed_hash_depends_only_on_the_partitions_rows(backend: ExecutionBackend) -> None:
    t = partitions(seed=8)
    ops = backend.ops
    key = ops.keyed_hash(["part", "id"], "a secret salt")
    hashes = {r["id"]: r["h"] for r in run(backend, exp.select("id", exp.alias_(key.copy(), "h")).from_(src("t")), t=t)}
    assert len(set(hashes.values())) == len(hashes)

    def kept(table: pa.Table, output: list[str] | None) -> set[int]:
        q = ops.keep_n_per_partition(src("t"), ["part"], key.copy(), 2, alias="__k", output=output)
        return {r["id"] for r in run(backend, exp.select("id").from_(q), t=table)}

    for output in (None, ["id", "part"]):
        full = kept(t, output)
        assert full == reference_keep(t, hashes, 2)
        # other partitions removed, or added: the kept rows of partitions 0..9 are the same
        mine = pa.compute.less(t["part"], 10)
        fewer = kept(t.filter(mine), output)
        extra = pa.table({"part": pa.array([100, 100, 101], pa.int64()), "id": pa.array([901, 902, 903], pa.int64()),
                          "key": pa.array([0, 0, 0], pa.int64())})
        more = kept(pa.concat_tables([t, extra]), output)
        ids_mine = set(t.filter(mine).column("id").to_pylist())
        assert fewer == full & ids_mine
        assert more & ids_mine == full & ids_mine


# -- keyed_hash ---------------------------------------------------------------------------------------


def pairs_table(n_units: int, n_groups: int) -> pa.Table:
    u = np.repeat(np.arange(n_units), n_groups)
    g = np.tile(np.arange(n_groups), n_units)
    return pa.table({"u": u.astype(np.int64), "g": g.astype(np.int64)})


def test_keyed_hash_is_uniform_over_buckets(backend: ExecutionBackend) -> None:
    t = pairs_table(5000, 4)
    h = backend.ops.keyed_hash(["u", "g"], "fixed salt")
    values = [r["h"] for r in run(backend, exp.select(exp.alias_(h, "h")).from_(src("t")), t=t)]
    assert len(set(values)) == len(values) == 20000
    for buckets in (np.array([v % 64 for v in values]), np.array([(v >> 58) % 64 for v in values])):
        assert chisquare(np.bincount(buckets, minlength=64)).pvalue >= ALPHA


Key = Callable[[list[str], str], exp.Expression]


class _SaltIgnored:
    """Negative control: a key that ignores the salt (every salt orders the groups alike)."""

    def __init__(self, ops: SqlOps) -> None:
        self.ops = ops

    def __call__(self, cols: list[str], salt: str) -> exp.Expression:
        return self.ops.keyed_hash(cols, "one salt for all")


def duckdb_multi_argument_hash(cols: list[str], salt: str) -> exp.Expression:
    """Negative control: DuckDB's HASH(salt, cols...), which combines the arguments' hashes
    almost linearly (see DuckDBOps.keyed_hash)."""
    return exp.func("hash", exp.Literal.string(salt), *[exp.column(c) for c in cols])


def _salt_literals(key: Key, salts: list[str]) -> tuple[exp.Expression, list[list[str]]]:
    """``key``'s expression with its salt-dependent constants (the string literals that spell the salt)
    replaced by columns ``__p0, __p1, ...``, and per salt those constants' values (``salts`` all of
    one length, as the marker salt: a length prefix in a constant is then the same for all)."""
    marker = "salt-" + "z" * (len(salts[0]) - 5)
    assert all(len(x) == len(marker) for x in salts)
    template = key(["u", "g"], marker)
    slots = [n for n in template.walk() if isinstance(n, exp.Literal) and n.is_string and marker in n.this]
    values = [[str(n.this).replace(marker, x) for x in salts] for n in slots]
    for p, n in enumerate(slots):
        n.replace(exp.column(f"__p{p}"))
    return template, values


def orders_over_salts(b: ExecutionBackend, key: Key, n_salts: int) -> tuple[np.ndarray, np.ndarray]:
    """One unit with 4 groups, ``n_salts`` salts: counts of the group first in the key order,
    and of the pair of groups first and second (6 pairs).

    A key whose salt enters as string constants (the portable hash's salt text, HASH(salt, ..)) runs as
    one query over the unit's rows times a table of the salts' constants, a row per salt (a column per
    salt costs Spark about 20 ms of analysis each, and building 2000 keys as long in Python); for the
    first 20 salts its values are checked equal to the key's with the salt written in. A key whose salt
    enters otherwise: a column per salt, 250 salts per scan."""
    t = pairs_table(1, 4)
    pairs = list(itertools.combinations(range(4), 2))
    first, both = np.zeros(4), np.zeros(6)
    names = [f"salt-{i:04d}" for i in range(n_salts)]

    def count(orders: list[list[tuple[int, int]]]) -> None:
        for order in orders:
            v = sorted(order)
            first[v[0][1]] += 1
            both[pairs.index(tuple(sorted((v[0][1], v[1][1]))))] += 1

    def wide(salts: range) -> list[list[tuple[int, int]]]:
        q = exp.select("g", *[exp.alias_(key(["u", "g"], names[i]), f"h{i}") for i in salts]).from_(
            exp.to_table(source_name("t"), quoted=True))
        rows = b.fetch_arrow(q).to_pylist()
        return [[(r[f"h{i}"], r["g"]) for r in rows] for i in salts]

    b.register_source("t", "arrow", t)
    try:
        template, values = _salt_literals(key, names)
        if not values and key(["u", "g"], names[0]) != key(["u", "g"], names[1]):
            for start in range(0, n_salts, 250):  # the salt enters otherwise: one column per salt, one scan
                count(wide(range(start, min(n_salts, start + 250))))
            return first, both
        cols: dict[str, Any] = {"__i": np.arange(n_salts, dtype=np.int64)}
        cols.update({f"__p{p}": v for p, v in enumerate(values)})
        b.register_source("s", "arrow", pa.table(cols))
        try:
            q = exp.select("__i", "g", exp.alias_(template, "h")).from_(
                exp.to_table(source_name("t"), quoted=True)).join(exp.to_table(source_name("s"), quoted=True),
                                                                   join_type="cross")
            got: list[list[tuple[int, int]]] = [[] for _ in range(n_salts)]
            for r in b.fetch_arrow(q).to_pylist():
                got[r["__i"]].append((r["h"], r["g"]))
        finally:
            b.unregister_source("s", "arrow")
        assert all(len(o) == 4 for o in got)
        check = range(min(n_salts, 20))
        assert [sorted(o) for o in wide(check)] == [sorted(got[i]) for i in check]  # the same keys as written in
        count(got)
    finally:
        b.unregister_source("t", "arrow")
    return first, both


def test_keyed_hash_orders_a_units_groups_uniformly_across_salts(backend: ExecutionBackend) -> None:
    first, both = orders_over_salts(backend, backend.ops.keyed_hash, 2000)
    assert chisquare(first).pvalue >= ALPHA, first
    assert chisquare(both).pvalue >= ALPHA, both


def test_keyed_hash_negative_controls_fail(backend: ExecutionBackend) -> None:
    controls: list[Key] = [_SaltIgnored(backend.ops)]
    if backend.dialect == "duckdb":
        controls.append(duckdb_multi_argument_hash)
    for key in controls:
        first, both = orders_over_salts(backend, key, 2000)
        assert chisquare(both).pvalue < ALPHA, (key, both)


def salt_xored_without_mixing(cols: list[str], salt: str) -> exp.Expression:
    """Negative control: the columns' hash XORed with the salt's, not hashed again (XOR with a
    constant keeps most of the order's structure)."""
    return exp.BitwiseXor(this=exp.func("hash", *[exp.column(c) for c in cols]),
                          expression=exp.func("hash", exp.Literal.string(salt)))


def test_keyed_hash_salt_xored_without_mixing_fails() -> None:
    b = DuckDBBackend(None, EngineSettings(statement_timeout=120))
    try:
        first, both = orders_over_salts(b, salt_xored_without_mixing, 2000)
    finally:
        b.close()
    assert chisquare(both).pvalue < ALPHA, both


def test_keyed_uniform_is_uniform_inside_the_unit_interval(backend: ExecutionBackend) -> None:
    t = pairs_table(5000, 4)
    u = backend.ops.keyed_uniform(["u", "g"], "fixed salt")
    values = np.array([r["x"] for r in run(backend, exp.select(exp.alias_(u, "x")).from_(src("t")), t=t)])
    assert len(values) == 20000 and values.min() > 0.0 and values.max() < 1.0
    assert chisquare(np.bincount((values * 64).astype(int), minlength=64)).pvalue >= ALPHA
    # negative control: its square is far from uniform
    assert chisquare(np.bincount((values**2 * 64).astype(int), minlength=64)).pvalue < ALPHA
    # exponential race: -ln(u) / m is the minimum of m Exp(1) clocks, so with weights 1 and 3
    # the weight-3 row wins 3/4 of the time (pairs of units' rows, 10000 races)
    e = -np.log(values.reshape(-1, 2)) / np.array([1.0, 3.0])
    wins = int((e[:, 1] < e[:, 0]).sum())
    assert binomtest(wins, 10000, 0.75).pvalue >= ALPHA, wins
    assert binomtest(int((values.reshape(-1, 2)[:, 1] < values.reshape(-1, 2)[:, 0]).sum()), 10000, 0.75).pvalue < ALPHA


def argmin_per_unit(b: ExecutionBackend, keys: list[tuple[Key, str]], t: pa.Table) -> list[np.ndarray]:
    """For each (key, salt): the group each unit keeps (its smallest key). Every key is a column of one query over
    ``t`` (each a function of its row and salt alone, as in a query of its own; on Spark one job, not one per key)."""
    q = exp.select("u", "g", *[exp.alias_(key(["u", "g"], salt), f"h{j}") for j, (key, salt) in enumerate(keys)]).from_(
        src("t"))
    best: list[dict[int, tuple[int, int]]] = [{} for _ in keys]
    for r in run(b, q, t=t):
        for j, bj in enumerate(best):
            if r["u"] not in bj or r[f"h{j}"] < bj[r["u"]][0]:
                bj[r["u"]] = (r[f"h{j}"], r["g"])
    return [np.array([bj[u][1] for u in sorted(bj)]) for bj in best]


def test_keyed_hash_choices_are_independent_across_salts(backend: ExecutionBackend) -> None:
    # over 5000 units of 4 groups: the group each unit keeps under one salt says nothing about
    # the one it keeps under another (4 x 4 contingency table)
    t = pairs_table(5000, 4)
    ignored = _SaltIgnored(backend.ops)  # negative control (below): the same choice under every salt
    a, b, a2, b2 = argmin_per_unit(backend, [(backend.ops.keyed_hash, "salt one"), (backend.ops.keyed_hash, "salt two"),
                                             (ignored, "salt one"), (ignored, "salt two")], t)
    table = np.zeros((4, 4))
    np.add.at(table, (a, b), 1)
    assert chisquare(np.bincount(a, minlength=4)).pvalue >= ALPHA
    assert chi2_contingency(table).pvalue >= ALPHA, table
    # negative control: the same choice under every salt
    control = np.zeros((4, 4))
    np.add.at(control, (a2, b2), 1)
    assert chi2_contingency(control).pvalue < ALPHA


# -- clamp, try_cast, typed_literal, epoch_seconds, least ---------------------------------------------


def reference_clamp(v: float | None, lo: float, hi: float, shift: float) -> float | None:
    if v is None:
        return None
    if math.isnan(v):
        return hi - shift  # NaN sorts above every number
    return min(max(v, lo), hi) - shift


@pytest.mark.parametrize("shift", [0.0, 5.0])
def test_clamp_keeps_null_and_clamps_infinities(backend: ExecutionBackend, shift: float) -> None:
    xs = [None, -math.inf, math.inf, math.nan, -5.0, 0.0, 0.5, 7.25, 10.0, 1e300]
    t = pa.table({"id": pa.array(range(len(xs)), pa.int64()), "x": pa.array(xs, pa.float64())})
    c = backend.ops.clamp(exp.column("x"), 0, 10, shift=shift)
    rows = run(backend, exp.select("id", exp.alias_(c, "y")).from_(src("t")), t=t)
    got = {r["id"]: r["y"] for r in rows}
    assert got == {i: reference_clamp(x, 0, 10, shift) for i, x in enumerate(xs)}


TRY_CASES: list[tuple[str, str | None, Any]] = [
    ("BIGINT", "12", 12), ("BIGINT", "-3", -3), ("BIGINT", "x", None), ("BIGINT", "9223372036854775808", None),
    ("BIGINT", "", None), ("BIGINT", None, None),
    ("DOUBLE", "2.5", 2.5), ("DOUBLE", "1e3", 1000.0), ("DOUBLE", "abc", None),
    ("DATE", "2024-02-29", dt.date(2024, 2, 29)), ("DATE", "2024-02-30", None), ("DATE", "hello", None),
]


def test_try_cast_is_null_where_the_value_does_not_convert(backend: ExecutionBackend) -> None:
    t = pa.table({"id": pa.array(range(len(TRY_CASES)), pa.int64()), "s": pa.array([c[1] for c in TRY_CASES], pa.string())})
    cols = [exp.column("id")] + [
        exp.alias_(backend.ops.try_cast(exp.column("s"), to), f"as_{to.lower()}") for to in ("BIGINT", "DOUBLE", "DATE")
    ]
    rows = {r["id"]: r for r in run(backend, exp.select(*cols).from_(src("t")), t=t)}
    for i, (to, _, want) in enumerate(TRY_CASES):
        assert rows[i][f"as_{to.lower()}"] == want, TRY_CASES[i]


LITERALS: list[tuple[Any, str]] = [
    (0, "BIGINT"), (-5, "INTEGER"), (2**62 + 1, "BIGINT"), (2**100 + 7, "HUGEINT"),
    (0.1, "DOUBLE"), (-1e300, "DOUBLE"), (math.inf, "DOUBLE"), (-math.inf, "DOUBLE"),
    (decimal.Decimal("12345.678"), "DECIMAL(10,3)"), (decimal.Decimal("-0.001"), "DECIMAL(18,3)"),
    (decimal.Decimal("1E+3"), "DECIMAL(10,2)"),
    (dt.date(2024, 1, 31), "DATE"), (dt.date(1, 1, 1), "DATE"), (dt.date(9999, 12, 31), "DATE"),
    (dt.datetime(2024, 5, 6, 7, 8, 9, 123456), "TIMESTAMP"), (dt.datetime(1969, 12, 31, 23, 59, 59), "TIMESTAMP"),
    ("it's", "VARCHAR"), ('say "hi"', "VARCHAR"), ("back\\slash\\n", "VARCHAR"), ("", "VARCHAR"),
    ("ünïcödé ✓", "VARCHAR"), ("'; DROP TABLE x; --", "VARCHAR"), ("''", "VARCHAR"),
    (True, "BOOLEAN"), (False, "BOOLEAN"), (None, "VARCHAR"), (None, "DATE"),
]


def literal_row(backend: ExecutionBackend) -> dict[str, Any]:
    """Every ``LITERALS`` case's typed literal on ``backend``: the columns ``v0``, ``v1``, ... of one
    one-row query (one query on the backend, not one per case)."""
    key = _batch_key("typed_literal", backend)
    if key not in _BATCHED:
        lits = [exp.alias_(backend.ops.typed_literal(v, to), f"v{i}") for i, (v, to) in enumerate(LITERALS)]
        (_BATCHED[key],) = run(backend, exp.select(*lits))
    return _BATCHED[key]  # type: ignore[no-any-return]


@pytest.mark.parametrize("i", range(len(LITERALS)), ids=[f"{type(v).__name__}-{t}-{i}" for i, (v, t) in enumerate(LITERALS)])
def test_typed_literal_round_trips(backend: ExecutionBackend, i: int) -> None:
    value, to = LITERALS[i]
    got = literal_row(backend)[f"v{i}"]
    if to == "HUGEINT" and isinstance(got, decimal.Decimal):  # Arrow carries HUGEINT as decimal128(38, 0)
        got = int(got)
    assert got == value and type(got) is type(value), (value, got)


def test_typed_literal_nan_and_bad_values() -> None:
    ops = DuckDBOps()
    with pytest.raises(TypeError):
        ops.typed_literal(object(), "VARCHAR")
    with pytest.raises(ValueError):
        ops.typed_literal(decimal.Decimal("NaN"), "DECIMAL(10,2)")


def test_typed_literal_nan(backend: ExecutionBackend) -> None:
    (row,) = run(backend, exp.select(exp.alias_(backend.ops.typed_literal(math.nan, "DOUBLE"), "v")))
    assert isinstance(row["v"], float) and math.isnan(row["v"])


def test_epoch_seconds_keeps_the_fraction(backend: ExecutionBackend) -> None:
    ts = [dt.datetime(1970, 1, 1), dt.datetime(2024, 5, 6, 7, 8, 9, 123456), dt.datetime(1969, 12, 31, 23, 59, 59, 500000)]
    t = pa.table({"id": pa.array(range(3), pa.int64()), "ts": pa.array(ts, pa.timestamp("us"))})
    rows = run(backend, exp.select("id", exp.alias_(backend.ops.epoch_seconds(exp.column("ts")), "s")).from_(src("t")), t=t)
    epoch = dt.datetime(1970, 1, 1)
    for r in rows:
        assert r["s"] == pytest.approx((ts[r["id"]] - epoch).total_seconds(), abs=1e-6)
    assert {r["id"]: r["s"] for r in rows}[2] == pytest.approx(-0.5)


def test_epoch_micros_is_exact(backend: ExecutionBackend) -> None:
    ts = [dt.datetime(1970, 1, 1), dt.datetime(2026, 1, 1, 0, 0, 0, 100000), dt.datetime(1969, 12, 31, 23, 59, 59, 999999)]
    t = pa.table({"id": pa.array(range(3), pa.int64()), "ts": pa.array(ts, pa.timestamp("us"))})
    rows = run(backend, exp.select("id", exp.alias_(backend.ops.epoch_micros(exp.column("ts")), "u")).from_(src("t")), t=t)
    epoch = dt.datetime(1970, 1, 1)
    assert {r["id"]: r["u"] for r in rows} == {i: (v - epoch) // dt.timedelta(microseconds=1) for i, v in enumerate(ts)}


def test_least_is_the_smaller_value(backend: ExecutionBackend) -> None:
    a, b = [3, -2, 7, 0], [5, -9, 7, 1]
    t = pa.table({"id": pa.array(range(4), pa.int64()), "a": pa.array(a, pa.int64()), "b": pa.array(b, pa.int64())})
    rows = run(backend, exp.select("id", exp.alias_(backend.ops.least(exp.column("a"), exp.column("b")), "m")).from_(src("t")), t=t)
    assert {r["id"]: r["m"] for r in rows} == {i: min(x, y) for i, (x, y) in enumerate(zip(a, b))}


# -- the composed steps: the golden bounded queries -------------------------------------------------------


def golden_events(seed: int, within_caps: bool) -> pa.Table:
    """Events for the golden spec (C_u = 2, k = 3; domain US/FR). ``within_caps``: no unit has
    more than 2 groups of any key nor more than 1 row per group, so no cap binds and the result
    does not depend on any random choice (whatever the backend's hash)."""
    gen = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for u in range(1, 61):
        n = 2 if within_caps else int(gen.integers(1, 12))
        for j in range(n):
            rows.append({
                "user_id": u,
                "url": (["a", "b"][j] if within_caps else str(gen.choice(["a", "b", "c", "d"]))),
                "country": (["US", "FR"][j] if within_caps else str(gen.choice(["US", "FR", "DE"]))),
                "amount": float(np.round(gen.uniform(-20, 120), 2)),
                "age": int(j * 10 + 15 if within_caps else gen.integers(0, 90)),
            })
    rows.append({"user_id": None, "url": "a", "country": "US", "amount": 5.0, "age": 30})
    return pa.table({
        "user_id": pa.array([r["user_id"] for r in rows], pa.int64()),
        "url": pa.array([r["url"] for r in rows], pa.string()),
        "country": pa.array([r["country"] for r in rows], pa.string()),
        "amount": pa.array([r["amount"] for r in rows], pa.float64()),
        "age": pa.array([r["age"] for r in rows], pa.int64()),
    })


def _rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = []
    for r in rows:
        out.append(tuple((k, round(v, 6) if isinstance(v, float) else v) for k, v in sorted(r.items())))
    return sorted(out, key=repr)


@pytest.mark.parametrize("name", sorted(GOLDEN_SQL))
@pytest.mark.parametrize("within_caps", [True, False], ids=["caps-idle", "caps-bind"])
def test_composed_steps_give_the_golden_results(backend: ExecutionBackend, name: str, within_caps: bool) -> None:
    sql, caps, golden = GOLDEN_SQL[name]
    spec = _golden_spec()
    plan = analyze(sql, {spec.name: spec})
    data = golden_events(11, within_caps)
    got = run(backend, bounded_query(plan, caps, salt=SALT_PLACEHOLDER, unit_column="user_id", ops=backend.ops),
              events=data)
    con = duckdb.connect()
    con.register(source_name("events"), data)
    expected = con.sql(golden).to_arrow_table().to_pylist()
    con.close()
    # no random choice, or the same hash (a golden that draws per row, RANDOM(), chooses afresh)
    if within_caps or (backend.dialect == "duckdb" and "RANDOM()" not in golden):
        assert _rows(got) == _rows(expected)
    else:  # another hash chooses other rows: totals that do not depend on the choice
        assert sum(r["__users"] for r in got) == sum(r["__users"] for r in expected)


def _num(plan: Any, row: dict[str, Any], col: str) -> Any:
    """A bounded column's value as a number: an exact sum (integer text) exactly, as a Fraction."""
    scale = {c.name: c.scale for c in released_columns(plan, Caps(1, 1))}.get(col)
    return Fraction(int(row[col]), 1) * Fraction(2) ** -scale if scale is not None else row[col]


def test_per_unit_row_cap_bounds_every_units_rows(backend: ExecutionBackend) -> None:
    # L = 3, no other cap: a scalar COUNT(*) is sum over units of min(rows, L), whatever rows
    # are chosen; removing a unit changes a grouped COUNT(*) by <= L in L1 and SUM by <= L * 100
    data = golden_events(4, within_caps=False)
    spec = _golden_spec()
    caps = ContributionModel(math.inf, math.inf, 3)
    if backend.dialect == "duckdb":  # neighbours compared under one salt: every choice from the salt
        from dpsql.engine.duckdb_ops import SaltedDuckDBOps

        backend.ops = SaltedDuckDBOps()
    per_unit = np.bincount([u for u in data.column("user_id").to_pylist() if u is not None])
    scalar = analyze("SELECT COUNT(*) FROM events", {"events": spec})
    (row,) = run(backend, bounded_query(scalar, caps, salt="s", unit_column="user_id", ops=backend.ops), events=data)
    assert row["__a0"] == int(np.minimum(per_unit, 3).sum()) and row["__users"] == int((per_unit > 0).sum())
    grouped = analyze("SELECT url, COUNT(*), SUM(amount) FROM events GROUP BY url", {"events": spec})
    q = bounded_query(grouped, caps, salt="s", unit_column="user_id", ops=backend.ops)
    full = {r["__k0"]: r for r in run(backend, q, events=data)}
    for victim in (1, 2, 5, 17):
        keep = pa.compute.or_(pa.compute.is_null(data["user_id"]), pa.compute.not_equal(data["user_id"], victim))
        less = {r["__k0"]: r for r in run(backend, q, events=data.filter(keep))}
        for col, bound in (("__a0", 3), ("__a1", 3 * 100)):
            change = sum(abs(_num(grouped, full[k], col) - _num(grouped, less.get(k, {col: 0}), col)) for k in full)
            assert change <= bound + 1e-9, (victim, col, change)
    # negative control: without L the same removal changes COUNT(*) by more than 3
    q_inf = bounded_query(grouped, Caps(math.inf, math.inf), salt="s", unit_column="user_id", ops=backend.ops)
    worst = int(max(per_unit))
    assert worst > 3
    victim = int(np.argmax(per_unit))
    full = {r["__k0"]: r for r in run(backend, q_inf, events=data)}
    keep = pa.compute.or_(pa.compute.is_null(data["user_id"]), pa.compute.not_equal(data["user_id"], victim))
    less = {r["__k0"]: r for r in run(backend, q_inf, events=data.filter(keep))}
    assert sum(abs(full[k]["__a0"] - less.get(k, {"__a0": 0})["__a0"]) for k in full) == worst


# -- the contribution model -------------------------------------------------------------------------------


def test_contribution_model_is_caps_and_states_its_bounds() -> None:
    assert Caps is ContributionModel
    c = Caps(2, 3)
    assert (c.max_groups_per_unit, c.max_rows_per_group, c.max_rows_per_unit) == (2, 3, math.inf)
    assert c.groups_finite and c.rows_finite and not c.unit_rows_finite
    assert (c.rows_per_group_bound, c.groups_bound, c.rows_bound) == (3, 2, 6)
    d = ContributionModel(4, 5, 7)  # L = 7 binds over C_u * k = 20; k = 5 per group stays
    assert (d.rows_per_group_bound, d.groups_bound, d.rows_bound) == (5, 4, 7)
    e = ContributionModel(math.inf, math.inf, 2)
    assert (e.rows_per_group_bound, e.groups_bound, e.rows_bound) == (2, 2, 2)
    with pytest.raises(AttributeError):
        c.max_rows_per_group = 10  # type: ignore[misc]
    for bad in (0, -1, math.nan, "3", True):
        with pytest.raises(ValueError):
            ContributionModel(bad, 1)  # type: ignore[arg-type]


def test_released_sensitivities_follow_the_per_unit_row_cap() -> None:
    spec = TableSpec(name="events", source="<arrow>", source_kind="arrow", privacy_unit="user_id",
                     columns={"amount": ColumnSpec("amount", bounds=(-10.0, 100.0))},
                     schema={"user_id": "BIGINT", "url": "VARCHAR", "amount": "DOUBLE"})
    plan = analyze("SELECT url, COUNT(*), SUM(amount), AVG(amount) FROM events GROUP BY url", {"events": spec})
    sens = {c.name: c.sensitivity for c in released_columns(plan, ContributionModel(2, 5, 3))}
    # per group min(k, L) = 3 rows: COUNT 3, SUM 3 * 100, AVG sum 3 * 110 / 2, AVG count 3
    assert sens == {"__users": 1.0, "__a0": 3, "__a1": 300.0, "__a2_sum": 165.0, "__a2_cnt": 3}
    assert {c.name: c.sensitivity for c in released_columns(plan, Caps(2, 5))}["__a1"] == 500.0


# -- strict rendering --------------------------------------------------------------------------------------


def test_three_argument_arg_min_is_not_rendered_as_min_by_for_spark() -> None:
    ast = sqlglot.parse_one("SELECT ARG_MIN(x, h, 5) FROM t", read="duckdb")
    assert "MIN_BY" in ast.sql(dialect="spark")  # lenient rendering: one row instead of five
    with pytest.raises(UnsupportedQueryError, match="spark"):
        render(ast, dialect="spark")
    assert render(ast) == "SELECT ARG_MIN(x, h, 5) FROM t"


@pytest.mark.parametrize("dialect", ["spark", "postgres", "mysql"])
def test_try_is_refused_where_the_dialect_has_none(dialect: str) -> None:
    ast = sqlglot.parse_one("SELECT TRY(a / b) FROM t", read="duckdb")
    assert "TRY" not in ast.sql(dialect=dialect).upper().replace("TRY_", "")  # lenient: silently dropped
    with pytest.raises(UnsupportedQueryError):
        render(ast, dialect=dialect)


def test_duckdb_building_blocks_are_never_rendered_for_another_dialect() -> None:
    ops = DuckDBOps()
    # HASH renders for Spark without any complaint -- as a different function; the mark refuses it
    bare = exp.func("hash", exp.column("a"))
    assert bare.sql(dialect="spark", unsupported_level=sqlglot.ErrorLevel.RAISE) == "HASH(a)"
    made: list[exp.Expression] = [
        ops.keyed_hash(["a"], "s"), ops.clamp(exp.column("a"), 0, 1), ops.try_cast(exp.column("a"), "DOUBLE"),
        ops.typed_literal(dt.date(2024, 1, 1), "DATE"), ops.epoch_seconds(exp.column("t")),
        ops.least(exp.column("a"), exp.column("b")),
        ops.keep_n_per_partition(src("t"), ["u"], exp.column("h"), 2, alias="k"),
        ops.keep_n_per_partition(src("t"), ["u"], exp.column("h"), 2, alias="k", output=["a"]),
    ]
    for e in made:
        render(exp.select(e.copy()) if not isinstance(e, exp.Subquery) else exp.select("*").from_(e.copy()))
        wrapped = exp.select("*").from_(e) if isinstance(e, exp.Subquery) else exp.select(exp.alias_(e, "x"))
        with pytest.raises(UnsupportedQueryError, match="spark"):
            render(wrapped, dialect="spark")


@pytest.mark.parametrize("name", sorted(GOLDEN_SQL))
def test_bounded_query_with_duckdb_ops_is_never_rendered_for_spark(name: str) -> None:
    sql, caps, golden = GOLDEN_SQL[name]
    spec = _golden_spec()
    ast = bounded_query(analyze(sql, {spec.name: spec}), caps, salt=SALT_PLACEHOLDER, unit_column="user_id")
    with pytest.raises(UnsupportedQueryError):
        render(ast, dialect="spark")
    assert render(ast, pretty=True) == golden


@pytest.mark.parametrize("dialect", ["spark", "postgres", "mysql", "snowflake"])
def test_try_cast_is_never_rendered_as_a_plain_cast(dialect: str) -> None:
    # a TRY_CAST as the typer builds it: sqlglot would silently write CAST, which fails on a bad row
    ast = exp.select(exp.TryCast(this=exp.column("a"), to=exp.DataType.build("DOUBLE"))).from_("t")
    assert ast.sql(dialect=dialect, unsupported_level=sqlglot.ErrorLevel.RAISE).upper().startswith("SELECT CAST(")
    with pytest.raises(UnsupportedQueryError, match="TRY_CAST"):
        render(ast, dialect=dialect)
    assert render(ast) == "SELECT TRY_CAST(a AS DOUBLE) FROM t"
    for keeps in ("trino", "tsql", "bigquery"):
        assert "_CAST(A AS" in render(ast, dialect=keeps).upper()


def test_try_cast_marked_safe_renders_for_spark() -> None:
    # with sqlglot's safe flag (as the parser sets it), Spark keeps TRY_CAST: NULL on failure
    ast = sqlglot.parse_one("SELECT TRY_CAST(a AS DOUBLE) FROM t", read="duckdb")
    assert render(ast, dialect="spark") == "SELECT TRY_CAST(a AS DOUBLE) FROM t"


# -- bernoulli_keep (Poisson sampling of join tuples) ----------------------------------------------------


def keeps(b: ExecutionBackend, n: int, salts: list[str], q: float | list[float]) -> np.ndarray:
    """Each row's keep under each salt (at the rate ``q``, or the rate of each salt), in the order of ``i``: one query
    computes every column (each column is a function of its row, its salt and its rate alone, as in a query of its
    own); the rows are put in order here, not by the engine (on Spark an ORDER BY is a sampling job and a shuffle)."""
    t = pa.table({"i": np.arange(n, dtype=np.int64)})
    rates = q if isinstance(q, list) else [q] * len(salts)
    cols = [exp.alias_(b.ops.bernoulli_keep(["i"], s, r), f"k{j}") for j, (s, r) in enumerate(zip(salts, rates,
                                                                                                  strict=True))]
    out = run_arrow(b, exp.select("i", *cols).from_(src("t")), t=t)
    assert out.num_rows == n
    out = out.take(pa.compute.sort_indices(out, [("i", "ascending")]))
    assert out.column("i").to_pylist() == list(range(n))
    return np.column_stack([out.column(f"k{j}").to_numpy(zero_copy_only=False) for j in range(len(salts))]).astype(bool)


def test_bernoulli_keep_has_rate_q(backend: ExecutionBackend) -> None:
    """n = 200000, q = 1/16: mean 12500, sd sqrt(200000/16 * 15/16) = 108.25; |K - 12500| <= 4.9 sd = 530
    (two-sided failure probability < 1e-6)."""
    # (q = 1 beside it, in the same query: each column is computed from its own row, salt and rate)
    k = keeps(backend, 200_000, ["a salt", "a salt"], [1 / 16, 1.0])
    assert 11_970 <= int(k[:, 0].sum()) <= 13_030
    assert k[:, 1].all()  # q = 1 keeps every row


def test_bernoulli_keep_is_independent_across_rows_and_salts(backend: ExecutionBackend) -> None:
    # the negative control's second column in the same query (each column is a function of its row and salt alone)
    k = keeps(backend, 100_000, ["salt one", "salt two", "salt one"], 0.25)
    across_salts = np.histogram2d(k[:, 0], k[:, 1], bins=2)[0]
    neighbours = np.histogram2d(k[:-1, 0], k[1:, 0], bins=2)[0]
    assert chi2_contingency(across_salts).pvalue >= ALPHA
    assert chi2_contingency(neighbours).pvalue >= ALPHA
    # negative control: the same salt twice is perfectly dependent
    same = k[:, [0, 2]]
    assert chi2_contingency(np.histogram2d(same[:, 0], same[:, 1], bins=2)[0]).pvalue < ALPHA


def test_engine_spills_to_a_directory_of_its_own(tmp_path: Any) -> None:
    a = DuckDBBackend(None, EngineSettings())
    b = DuckDBBackend(None, EngineSettings())
    own = DuckDBBackend(None, EngineSettings(temp_directory=str(tmp_path / "spill")))
    try:
        dirs = [str(x.connection.execute("SELECT current_setting('temp_directory')").fetchall()[0][0])
                for x in (a, b, own)]
        assert dirs[0] != dirs[1] and all("dpsql-spill-" in d for d in dirs[:2])
        assert dirs[2] == str(tmp_path / "spill")
        assert not a.connection.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
    finally:
        for x in (a, b, own):
            x.close()
    with pytest.raises(ConfigError, match="temp_directory"):
        EngineSettings(temp_directory="  ")
