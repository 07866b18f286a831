"""Lookup joins (one private table, public tables joined on their declared keys) on the one-table path
(``dpsql.mechanisms.lookup``): at delta = 0 a scalar aggregate takes the Laplace (snapping) mechanism, and a GROUP
BY takes the one-table GROUP BY path (declared keys: Gaussian / Laplace, every key released; other keys, of the
lookup or of the private table: the Gaussian sparse histogram), with the private table's per-person caps applied to
the joined rows. At zero noise the release is DuckDB's own answer (the inner join drops orders whose key is NULL or
missing from the lookup); one person added with many rows over many lookup keys moves it by at most the claimed
sensitivity; explain says why; the ledger records the charge."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

REGIONS = ["n", "s", "e", "w", "x"]  # 'x': declared, held by no customer (released with a count of 0)
JOIN = "FROM orders o JOIN customers_public c ON o.ck = c.ck"
BIG = 10**6  # the added person's id


def _orders(extra: int = 0, seed: int = 3) -> pa.Table:
    """Orders of 1500 people (1-3 each), keys 0..11: 10, 11 and NULL join no customer."""
    rng = np.random.default_rng(seed)
    uid = np.repeat(np.arange(1500), rng.integers(1, 4, 1500))
    ck: list[int | None] = [int(v) for v in rng.integers(0, 12, uid.size)]
    ck[:40] = [None] * 40
    t = pa.table({"uid": uid, "ck": pa.array(ck, pa.int64()), "amt": rng.integers(0, 100, uid.size),
                  "status": [["a", "b"][i] for i in rng.integers(0, 2, uid.size)]})
    if extra:  # one more person: `extra` rows over every key (so over every region and status)
        more = pa.table({"uid": np.full(extra, BIG), "ck": pa.array([i % 12 for i in range(extra)], pa.int64()),
                         "amt": np.full(extra, 99), "status": [["a", "b"][i % 2] for i in range(extra)]})
        t = pa.concat_tables([t, more])
    return t


def _customers(dup: bool = False) -> pa.Table:
    t = pa.table({"ck": list(range(10)), "region": [REGIONS[i % 4] for i in range(10)]})
    if dup:  # a declared key held twice (identical rows): refused before the charge; past the check, capped at one row
        t = pa.concat_tables([t, t.slice(3, 1)])
    return t


def _session(orders: pa.Table, *, declared: bool = True, dup: bool = False,
             caps: tuple[int | None, int, int] = (3, 3, 3)) -> dpsql.Session:
    """``caps``: max_rows_per_unit, max_groups_per_unit, max_rows_per_group (by default none binds on ``_orders()``:
    at most 3 rows per person)."""
    s = dpsql.Session(budget=Budget(1000.0, 1e-2))
    cols = {"region": {"domain": REGIONS}} if declared else {}
    s.register("customers_public", _customers(dup), public=True, columns=cols)  # type: ignore[arg-type]
    s.register("orders", orders, privacy_unit="uid", max_rows_per_unit=caps[0], max_groups_per_unit=caps[1],
               max_rows_per_group=caps[2],
               references={"ck": "customers_public.ck"},
               columns={"amt": {"bounds": [0, 100]}, "status": {"domain": ["a", "b"]}})
    use_noise(s, zero_noise())
    return s


def _duckdb(sql: str, orders: pa.Table) -> list[tuple[object, ...]]:
    con = duckdb.connect()
    con.register("orders", orders)
    con.register("customers_public", _customers())
    return [tuple(r) for r in con.execute(sql).fetchall()]


@pytest.mark.parametrize("agg", ["COUNT(*)", "COUNT(o.amt)", "SUM(amt)", "AVG(o.amt)"])
@pytest.mark.parametrize("where", ["", "WHERE c.region <> 'n' AND o.amt > 10"])
def test_scalar_lookup_join_at_delta_zero_is_laplace_and_exact(agg: str, where: str) -> None:
    sql = f"SELECT {agg} AS v {JOIN} {where}"
    orders = _orders()
    with _session(orders) as s:
        e = s.explain(sql, epsilon=1.0, delta=0.0)
        assert e.mechanism == "laplace"
        assert "public lookup tables" in e.reason and "delta = 0 (pure DP)" in e.reason
        assert any("lookup join" in n and "c.ck <= 1" in n for n in e.notes)  # the lookup capped at one row per key
        assert e.parameters["rows_per_group"] == 3  # the one-table sensitivity: L = 3 rows per person
        got = s.query(sql, epsilon=1.0, delta=0.0).to_pylist()[0]["v"]
        row = s.history().to_pylist()[-1]
        assert (row["mechanism"], row["epsilon"], row["delta"]) == ("laplace", 1.0, 0.0)
        assert sorted(row["tables"]) == ["customers_public", "orders"]
    (want,) = _duckdb(sql, orders)[0]
    if agg.startswith("COUNT"):
        assert got == want
    else:
        assert got == pytest.approx(float(want), rel=1e-3)  # the release is rounded to a public grid


@pytest.mark.parametrize("delta", [0.0, 1e-6])
@pytest.mark.parametrize("key", ["c.region", "o.status"])
def test_grouped_lookup_join_over_declared_keys_releases_every_key_exactly(delta: float, key: str) -> None:
    sql = f"SELECT {key} AS k, COUNT(*) AS n, SUM(o.amt) AS t {JOIN} GROUP BY {key} ORDER BY k"
    orders = _orders()
    with _session(orders) as s:
        e = s.explain(sql, epsilon=1.0, delta=delta)
        assert e.mechanism == ("laplace" if delta == 0 else "gaussian")
        assert "GROUP BY over public (declared) keys" in e.reason and "public lookup tables" in e.reason
        got = s.query(sql, epsilon=1.0, delta=delta).to_pylist()
        assert s.history().to_pylist()[-1]["epsilon"] == 1.0
    want = {k: (n, t) for k, n, t in _duckdb(sql, orders)}
    keys = REGIONS if key == "c.region" else ["a", "b"]
    assert [r["k"] for r in got] == sorted(keys)
    for r in got:
        n, t = want.get(r["k"], (0, 0))
        assert r["n"] == n and r["t"] == pytest.approx(float(t), abs=1e-9 + 0.01 * abs(float(t)))
    assert any(r["k"] == "x" and r["n"] == 0 for r in got) or key == "o.status"


def test_grouped_lookup_join_over_an_undeclared_lookup_column_releases_every_key_of_the_lookup() -> None:
    """The values of a public table's column are a public key set: the join's per-person clipping releases every
    one of them (none thresholded away), unless the sparse histogram is asked for."""
    sql = f"SELECT c.region AS k, COUNT(*) AS n {JOIN} GROUP BY c.region ORDER BY k"
    orders = _orders()
    with _session(orders, declared=False) as s:
        e = s.explain(sql, epsilon=5.0, delta=1e-6)
        assert e.mechanism == "clipped_gaussian"
        got = s.query(sql, epsilon=5.0, delta=1e-6).to_pylist()
        forced = s.explain(sql, epsilon=5.0, delta=1e-6, options={"mechanism": "sparse_histogram"})
        assert forced.mechanism == "sparse_histogram"
    assert [r["k"] for r in got] == sorted(set(REGIONS[:4]))


def test_an_undeclared_lookup_column_at_delta_zero_is_told_to_declare_its_domain() -> None:
    """GROUP BY an undeclared column of a lookup table at delta = 0 was refused with the joins' 'needs delta > 0'
    alone: declaring the column's domain answers it at delta = 0 (Laplace, every key released)."""
    sql = f"SELECT c.region AS k, COUNT(*) AS n {JOIN} GROUP BY c.region"
    with _session(_orders(), declared=False) as s:
        with pytest.raises(dpsql.errors.DPSQLError, match="needs delta > 0") as e:
            s.query(sql, epsilon=5.0, delta=0.0)
        assert "customers_public.region" in e.value.hint and "domain" in e.value.hint, e.value.hint
        assert s.history().num_rows == 0
    with _session(_orders()) as s:  # the hint's fix
        assert s.explain(sql, epsilon=5.0, delta=0.0).mechanism == "laplace"


@pytest.mark.parametrize("key", ["o.ck"])
def test_grouped_lookup_join_over_undeclared_keys_is_the_sparse_histogram(key: str) -> None:
    sql = f"SELECT {key} AS k, COUNT(*) AS n {JOIN} GROUP BY {key} ORDER BY k"
    orders = _orders()
    with _session(orders, declared=False) as s:
        e = s.explain(sql, epsilon=5.0, delta=1e-6)
        assert e.mechanism == "sparse_histogram"
        assert "not declared public" in e.reason and "public lookup tables" in e.reason
        got = s.query(sql, epsilon=5.0, delta=1e-6).to_pylist()
        with pytest.raises(dpsql.errors.PolicyError, match="needs delta > 0"):
            s.query(sql, epsilon=5.0, delta=0.0)
        assert s.history().num_rows == 1
    # every group holds > 200 orders (far above the threshold): all released, each DuckDB's count; no NULL key,
    # no key missing from the lookup (10, 11: the inner join drops them)
    assert [(r["k"], r["n"]) for r in got] == _duckdb(sql, orders)
    assert all(r["k"] not in (None, 10, 11) for r in got)


def _release(orders: pa.Table, sql: str, delta: float, declared: bool = True) -> tuple[dict[object, float], dict]:
    with _session(orders, declared=declared, caps=(None, 2, 2)) as s:
        e = s.explain(sql, epsilon=5.0, delta=delta)
        rows = s.query(sql, epsilon=5.0, delta=delta).to_pylist()
    return {r["k"]: r["n"] for r in rows}, e.parameters


@pytest.mark.parametrize(("key", "delta", "declared"), [
    ("c.region", 0.0, True), ("c.region", 1e-6, True), ("o.status", 0.0, True), ("o.ck", 1e-6, False)])
def test_one_person_with_many_rows_over_many_keys_moves_the_release_by_the_sensitivity(
        key: str, delta: float, declared: bool) -> None:
    """A person added with 60 orders over every key (so, through the lookup, every region) changes at most C_u = 2
    groups by at most k = 2 each: the sensitivities the noise is calibrated to (the group cap applies to the joined
    rows' keys)."""
    sql = f"SELECT {key} AS k, COUNT(*) AS n {JOIN} GROUP BY {key}"
    before, params = _release(_orders(), sql, delta, declared)
    after, _ = _release(_orders(extra=60), sql, delta, declared)
    diffs = [after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)]
    assert all(0 <= d <= 2 for d in diffs) and sum(d > 0 for d in diffs) <= 2
    assert sum(diffs) >= 2  # the person is counted (negative control: the caps do not drop them all)
    if delta == 0:
        assert params["l1_sensitivity"] == 2 * 1 and params["rows_per_group"] == 2  # C_u x 1 column, k = 2
    elif declared:
        assert params["l2_sensitivity"] == pytest.approx(2**0.5)
    else:
        assert params["max_groups_per_unit"] == 2 and params["rows_per_group"] == 2


@pytest.mark.parametrize("agg", ["COUNT(*)", "SUM(o.amt)"])
def test_one_person_moves_a_scalar_by_l_rows_kept_after_the_where(agg: str) -> None:
    """The added person's 60 orders, 10 of them in region 'e' (keys 2 and 6): L = 3 rows are kept after the whole
    WHERE, the lookup's condition included (as on one table), so the count moves by exactly 3, the sum by 3 x 99."""
    sql = f"SELECT {agg} AS n {JOIN} WHERE c.region = 'e'"
    out = []
    for orders in (_orders(), _orders(extra=60)):
        with _session(orders) as s:
            out.append(s.query(sql, epsilon=1.0, delta=0.0).to_pylist()[0]["n"])
    assert out[1] - out[0] == pytest.approx(3 if agg == "COUNT(*)" else 3 * 99, abs=10)  # SUM: rounded to its grid
    assert out[1] - out[0] <= 3 * (1 if agg == "COUNT(*)" else 100)  # the sensitivity: L rows of at most 1 / 100


def test_mechanism_options_on_lookup_joins() -> None:
    scalar = f"SELECT COUNT(*) {JOIN}"
    grouped = f"SELECT c.region, COUNT(*) {JOIN} GROUP BY c.region"
    private = f"SELECT o.ck, COUNT(*) {JOIN} GROUP BY o.ck"
    with _session(_orders()) as s:
        ex = s.explain
        assert ex(scalar, epsilon=1.0, delta=0.0, options={"mechanism": "dp_s4s"}).mechanism == "dp_s4s"
        assert ex(scalar, epsilon=1.0, delta=0.0, options={"q": 0.5}).mechanism == "dp_s4s"
        assert ex(scalar, epsilon=1.0, delta=1e-6).mechanism == "gaussian"  # the same meaning at delta > 0
        assert ex(scalar, epsilon=1.0, delta=1e-6, options={"mechanism": "clipped_gaussian"}).mechanism == "clipped_gaussian"
        assert ex(scalar, epsilon=1.0, delta=1e-6, options={"clip_norm": 2.0}).mechanism == "clipped_gaussian"
        assert ex(scalar, epsilon=1.0, delta=1e-6, options={"mechanism": "laplace"}).mechanism == "laplace"
        assert ex(scalar, epsilon=1.0, delta=1e-6, options={"mechanism": "gaussian"}).mechanism == "gaussian"
        assert ex(scalar, epsilon=1.0, delta=0.0, options={"max_rows_per_unit": 1}).parameters["rows_per_group"] == 1
        assert ex(grouped, epsilon=1.0, delta=1e-6, options={"mechanism": "dp_s4s"}).mechanism == "dp_s4s_vector"
        assert ex(grouped, epsilon=1.0, delta=1e-6, options={"mechanism": "clipped_gaussian"}).mechanism == "clipped_gaussian"
        assert ex(grouped, epsilon=1.0, delta=1e-6, options={"mechanism": "sparse_histogram"}).mechanism == "sparse_histogram"
        assert ex(grouped, epsilon=1.0, delta=1e-6, options={"clip_norm": 2.0}).mechanism == "clipped_gaussian"
        assert ex(grouped, epsilon=1.0, delta=1e-6, options={"q": 0.5}).mechanism == "dp_s4s_vector"
        assert ex(grouped, epsilon=1.0, delta=1e-6, options={"max_groups_per_unit": 1}).parameters["groups_per_unit"] == 1
        with pytest.raises(dpsql.errors.ConfigError, match="Gaussian mechanism needs delta > 0"):
            ex(scalar, epsilon=1.0, delta=0.0, options={"mechanism": "gaussian"})
        with pytest.raises(dpsql.errors.PolicyError, match="answers GROUP BY queries"):
            ex(scalar, epsilon=1.0, delta=1e-6, options={"mechanism": "sparse_histogram"})
        with pytest.raises(dpsql.errors.PolicyError, match="neither a column of a public table nor declared public"):
            ex(private, epsilon=1.0, delta=1e-6, options={"mechanism": "dp_s4s"})  # would read the keys from the rows
        with pytest.raises(dpsql.errors.PolicyError, match="needs public keys"):
            ex(private, epsilon=1.0, delta=1e-6, options={"mechanism": "laplace"})
        with pytest.raises(dpsql.errors.ConfigError, match=r"option\(s\) \['tau'\] do not apply"):
            ex(scalar, epsilon=1.0, delta=0.0, options={"tau": 5})
        assert s.history().num_rows == 0


def test_private_keys_stay_refused_on_joins_that_are_not_lookups() -> None:
    """Negative control: a GROUP BY over an undeclared private column of a join of two private tables is refused
    (no public key set, no one-table path), free."""
    with _session(_orders()) as s:
        s.register("visits", pa.table({"uid": [1, 2], "page": ["p", "q"]}), privacy_unit="uid", max_rows_per_unit=3)
        with pytest.raises(dpsql.errors.PolicyError, match="neither a column of a public table nor declared public"):
            s.explain("SELECT o.ck, COUNT(*) FROM orders o JOIN visits v ON o.uid = v.uid GROUP BY o.ck",
                      epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0


def test_the_route_reads_no_row() -> None:
    """What explain states (mechanism, reason, parameters, notes) is the same over different rows (the added person
    included), and explain charges nothing."""
    sql = f"SELECT c.region, COUNT(*), AVG(o.amt) {JOIN} WHERE o.amt > 5 GROUP BY c.region"
    seen = []
    for orders in (_orders(), _orders(extra=60, seed=9)):
        for delta in (0.0, 1e-6):
            with _session(orders) as s:
                e = s.explain(sql, epsilon=1.0, delta=delta)
                seen.append((delta, e.mechanism, e.reason, repr(sorted(e.parameters.items())), e.notes))
                assert s.history().num_rows == 0
    assert seen[:2] == seen[2:]


def test_a_null_lookup_value_is_its_own_group_as_in_sql() -> None:
    """A lookup row whose region is NULL: its orders form the NULL group, as DuckDB's GROUP BY has it (released by
    the sparse histogram, when asked for, like any other group above the threshold)."""
    orders = _orders()
    cust = pa.table({"ck": list(range(10)), "region": [None if i >= 8 else REGIONS[i % 4] for i in range(10)]})
    sql = f"SELECT c.region AS k, COUNT(*) AS n {JOIN} GROUP BY c.region ORDER BY k NULLS LAST"
    with _session(orders, declared=False) as s:
        s.register("customers_public", cust, public=True)
        got = [(r["k"], r["n"]) for r in s.query(sql, epsilon=5.0, delta=1e-6,
                                                 options={"mechanism": "sparse_histogram"}).to_pylist()]
    con = duckdb.connect()
    con.register("orders", orders)
    con.register("customers_public", cust)
    assert got == [tuple(r) for r in con.execute(sql).fetchall()] and got[-1][0] is None


def test_year_keys_keep_the_join_route() -> None:
    """GROUP BY year(col) over a lookup join: a public key set of years, released in full by the join's per-person
    clipping (the one-table path declares domains of plain columns only)."""
    orders = _orders()
    orders = orders.append_column("od", pa.array([f"202{i % 3}-05-01" for i in range(orders.num_rows)]).cast(pa.date32()))
    with _session(orders) as s:
        s.register("orders", orders, privacy_unit="uid", max_rows_per_unit=3, references={"ck": "customers_public.ck"},
                   columns={"od": {"bounds": ("2020-01-01", "2022-12-31"), "bin_width": "1 day"}})
        sql = f"SELECT year(o.od) AS y, COUNT(*) AS n {JOIN} GROUP BY y ORDER BY y"
        assert s.explain(sql, epsilon=1.0, delta=1e-6).mechanism == "clipped_gaussian"
        assert [r["y"] for r in s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()] == [2020, 2021, 2022]


def test_left_join_to_a_private_table_is_refused_free() -> None:
    """A LEFT JOIN from the lookup to the private table (its rows kept whatever the people do); a LEFT JOIN from the
    private table to the lookup is answered (tests/test_lookup_left_join.py)."""
    with _session(_orders()) as s:
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="LEFT joins are not supported to a table that is "
                                                                     "not public"):
            s.explain("SELECT c.region, COUNT(*) FROM customers_public c LEFT JOIN orders o ON o.ck = c.ck "
                      "GROUP BY c.region", epsilon=1.0, delta=0.0)
        assert s.history().num_rows == 0
        s.explain("SELECT c.region, COUNT(*) FROM orders o LEFT JOIN customers_public c ON o.ck = c.ck "
                  "GROUP BY c.region", epsilon=1.0, delta=0.0)


@pytest.mark.parametrize("sql", [
    # a chain of lookups: orders -> customers_public -> zones
    "SELECT z.zone AS k, COUNT(*) AS n FROM orders o JOIN customers_public c ON o.ck = c.ck JOIN zones z ON c.zid = z.zid "
    "GROUP BY z.zone",
    # one lookup joined twice, under two aliases
    "SELECT c.region AS k, COUNT(*) AS n FROM orders o JOIN customers_public c ON o.ck = c.ck "
    "JOIN customers_public c2 ON o.ck2 = c2.ck WHERE c2.region <> 'w' OR o.amt > 50 GROUP BY c.region",
    # a lookup entered through a composite key
    "SELECT p.lab AS k, COUNT(*) AS n FROM orders o JOIN pairs p ON o.pa = p.a AND o.pb = p.b GROUP BY p.lab"])
@pytest.mark.parametrize("dup", [False, True])
def test_chains_aliases_and_composite_keys_move_the_release_by_the_sensitivity(
        sql: str, dup: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One person added with 60 orders over every key: at most C_u = 2 groups move, each by at most k = 2, with lookups
    chained, joined twice or entered through a composite key, their keys duplicated or not; explain is the same.
    Duplicated keys are refused before the charge (``dpsql._public_keys``); past that check (a public file rewritten
    between the check and the read), the bounded query's caps keep the sensitivity."""
    def release(orders: pa.Table) -> tuple[dict[object, int], tuple[object, ...]]:
        ck = orders.column("ck").to_pylist()
        orders = orders.append_column("ck2", pa.array([None if v is None else (v * 7) % 12 for v in ck], pa.int64()))
        orders = orders.append_column("pa", pa.array([(v or 0) // 4 for v in ck], pa.int64()))
        orders = orders.append_column("pb", pa.array([(v or 0) % 4 for v in ck], pa.int64()))
        cust = _customers(dup).append_column("zid", pa.array([i % 3 for i in range(_customers(dup).num_rows)], pa.int64()))
        zones = pa.table({"zid": [0, 1, 2] + ([1] if dup else []), "zone": ["p", "q", "r"] + (["r"] if dup else [])})
        pairs = pa.table({"a": [i // 4 for i in range(12)] + ([0] if dup else []),
                          "b": [i % 4 for i in range(12)] + ([1] if dup else []),
                          "lab": [["x", "y", "z"][i % 3] for i in range(12)] + (["z"] if dup else [])})
        s = dpsql.Session(budget=Budget(1000.0, 1e-2))
        s.register("zones", zones, public=True, columns={"zone": {"domain": ["p", "q", "r"]}})
        s.register("customers_public", cust, public=True, columns={"region": {"domain": REGIONS}},
                   references={"zid": "zones.zid"})
        s.register("pairs", pairs, public=True, columns={"lab": {"domain": ["x", "y", "z"]}})
        s.register("orders", orders, privacy_unit="uid", max_rows_per_unit=None, max_groups_per_unit=2,
                   max_rows_per_group=2, references={"ck": "customers_public.ck", "ck2": "customers_public.ck",
                                                     "pa,pb": "pairs.a,b"},
                   columns={"amt": {"bounds": [0, 100]}})
        use_noise(s, zero_noise())
        with s, monkeypatch.context() as m:
            if dup:
                with pytest.raises(dpsql.errors.ConfigError, match="public table '(zones|customers_public|pairs)'"):
                    s.explain(sql, epsilon=5.0, delta=0.0)
                m.setattr(dpsql._public_keys, "check", lambda *_: None)
            e = s.explain(sql, epsilon=5.0, delta=0.0)
            rows = s.query(sql, epsilon=5.0, delta=0.0).to_pylist()
        return {r["k"]: r["n"] for r in rows}, (e.mechanism, e.reason, repr(sorted(e.parameters.items())), e.notes)

    (before, e0), (after, e1) = release(_orders()), release(_orders(extra=60))
    assert e0 == e1 and e0[0] == "laplace"
    diffs = [after[k] - before[k] for k in before]
    assert set(before) == set(after) and all(0 <= d <= 2 for d in diffs) and sum(d > 0 for d in diffs) <= 2
    assert sum(diffs) >= 2  # the person is counted (negative control: the caps do not drop them all)
