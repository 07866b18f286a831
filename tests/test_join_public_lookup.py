"""A scalar aggregate over a join of one private table with a public lookup table on the lookup's declared key
(``persons.region -> regions.region``) has the one-table query's sensitivity: each private row joins at most one
lookup row (the bounded query caps the lookup at one row per key value). It is answered without sampling as the
one-table query over the joined rows (``dpsql.mechanisms.lookup``: the Gaussian mechanism at delta > 0, Laplace at
delta = 0), so at zero noise it is the exact answer (DP-S4S sampled 1 join tuple in 16: 436-708 for a true 755);
``mechanism='clipped_gaussian'`` asks for the per-person clipping path over one constant group
(``dpsql.mechanisms.registry._route_lookup_join``). A public table joined on a column with a fan-out stays on
DP-S4S."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise

REGIONS = ["n", "s", "e", "w", "c"]
WHERE = "WHERE r.zone = 'EW'"
JOIN = "FROM persons p JOIN regions r ON p.region = r.region"


def _data() -> tuple[pa.Table, pa.Table]:
    rng = np.random.default_rng(1)
    n = 2000
    # up to 3 rows per person (the declared cap): the caps keep every row, so the bounded answer is the true one
    pid = np.repeat(np.arange(n), rng.integers(1, 4, n))
    persons = pa.table({"pid": pid, "region": [REGIONS[i] for i in rng.integers(0, 5, pid.size)],
                        "age": rng.integers(18, 90, pid.size)})
    regions = pa.table({"region": REGIONS, "zone": ["NS", "NS", "EW", "EW", "C"]})
    return persons, regions


def _session(regions: pa.Table, **lookup: object) -> dpsql.Session:
    persons, _ = _data()
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    if "degree_bounds" in lookup:
        s.register("regionlist", pa.table({"region": REGIONS}), public=True)
    s.register("regions", regions, public=True, **lookup)  # type: ignore[arg-type]
    refs = {} if "degree_bounds" in lookup else {"references": {"region": "regions.region"}}
    s.register("persons", persons, privacy_unit="pid", max_rows_per_unit=3,
               columns={"region": {"domain": REGIONS}, "age": {"bounds": [0, 100]}}, **refs)  # type: ignore[arg-type]
    use_noise(s, zero_noise())
    return s


def _truth(sql: str, regions: pa.Table) -> float:
    persons, _ = _data()
    con = duckdb.connect()
    con.register("persons", persons)
    con.register("regions", regions)
    return float(con.execute(sql).fetchall()[0][0])


@pytest.mark.parametrize("agg", ["COUNT(*)", "COUNT(age)", "SUM(age)", "AVG(age)"])
@pytest.mark.parametrize("where", [WHERE, "WHERE r.zone <> 'C' AND r.region <> 'n'", ""])
def test_lookup_join_is_exact_at_zero_noise(agg: str, where: str) -> None:
    _, regions = _data()
    sql = f"SELECT {agg} {JOIN} {where}"
    with _session(regions) as s:
        plan = s.explain(sql, epsilon=1.0, delta=1e-6)
        assert plan.mechanism == "gaussian"
        assert "public lookup tables" in plan.reason
        # the sensitivity of the one-table query: L = 3 rows per person, each worth at most 1 (count) or 100
        assert plan.parameters["rows_per_group"] == 3
        got = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()[0][agg]
    want = _truth(sql, regions)
    if agg.startswith("COUNT"):
        assert got == want
    else:
        assert got == pytest.approx(want, rel=1e-3)  # the release is rounded to a public grid


@pytest.mark.parametrize("agg", ["COUNT(*)", "SUM(age)", "AVG(age)"])
def test_explicit_clipped_gaussian_is_exact_at_zero_noise(agg: str) -> None:
    """``mechanism='clipped_gaussian'``: the per-person clipping path over one constant group, no sampling."""
    _, regions = _data()
    sql = f"SELECT {agg} {JOIN} {WHERE}"
    opts = {"mechanism": "clipped_gaussian"}
    with _session(regions) as s:
        plan = s.explain(sql, epsilon=1.0, delta=1e-6, options=opts)
        assert plan.mechanism == "clipped_gaussian"
        # the sensitivity of the one-table query: Delta = 3 rows per person, each worth at most 1 (count) or 100
        params = plan.parameters if "aggregates" not in plan.parameters else plan.parameters["aggregates"][0]["parameters"]
        assert params["Delta"] == 3 and params["d"] == 1
        got = s.query(sql, epsilon=1.0, delta=1e-6, options=opts).to_pylist()[0][agg]
    want = _truth(sql, regions)
    if agg.startswith("COUNT"):
        assert got == want
    elif agg.startswith("SUM"):
        assert abs(got - want) <= params["granularity"] / 2  # the release is rounded to its public grid
    else:
        assert got == pytest.approx(want, rel=1e-3)


def test_lookup_join_output_arithmetic_and_two_lookups() -> None:
    _, regions = _data()
    zones = pa.table({"zone": ["NS", "EW", "C"], "axis": ["v", "h", "o"]})
    sql = f"SELECT COUNT(*) + 1 AS n {JOIN} JOIN zones z ON r.zone = z.zone WHERE z.axis = 'h'"
    with _session(regions) as s:
        s.register("zones", zones, public=True)
        s.register("regions", regions, public=True, references={"zone": "zones.zone"})
        assert s.explain(sql, epsilon=1.0, delta=1e-6).mechanism == "gaussian"
        got = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()[0]["n"]
    persons, _ = _data()
    con = duckdb.connect()
    for name, t in (("persons", persons), ("regions", regions), ("zones", zones)):
        con.register(name, t)
    assert got == con.execute(sql).fetchall()[0][0] == _truth(f"SELECT COUNT(*) + 1 {JOIN} {WHERE}", regions)


def test_duplicated_declared_key_is_refused_or_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup key declared (by the reference) but duplicated in the data: refused before the charge, naming the
    table, the column and the value (tests/test_join_public_keys.py). Past that check (a public file rewritten between
    the check and the read), the cap keeps one row per key value, so each private row is still counted once (the
    sensitivity holds; the duplicate's extra match is dropped)."""
    _, regions = _data()
    dup = pa.concat_tables([regions, pa.table({"region": ["e"], "zone": ["EW"]})])
    sql = f"SELECT COUNT(*) {JOIN} {WHERE}"
    with _session(dup) as s:
        with pytest.raises(dpsql.errors.ConfigError, match="public table 'regions': its column 'region' holds 'e' in 2"):
            s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
        monkeypatch.setattr(dpsql._public_keys, "check", lambda *_: None)
        assert s.explain(sql, epsilon=1.0, delta=1e-6).mechanism == "gaussian"
        got = s.query(sql, epsilon=1.0, delta=1e-6).to_pylist()[0]["COUNT(*)"]
    assert got == _truth(sql, regions) < _truth(sql, dup)


def test_fan_out_lookup_keeps_dp_s4s() -> None:
    """Negative control: a public table joined on a column it does not key (declared with a fan-out of 2 rows per
    value, duplicated in the data): one private row may join two lookup rows, so the lookup route does not apply."""
    _, regions = _data()
    dup = pa.concat_tables([regions, pa.table({"region": ["e"], "zone": ["EW"]})])
    sql = f"SELECT COUNT(*) {JOIN} {WHERE}"
    with _session(dup, references={"region": "regionlist.region"}, degree_bounds={"region": 2}) as s:
        plan = s.explain(sql, epsilon=1.0, delta=1e-6)
        assert plan.mechanism == "dp_s4s"
        assert plan.parameters["Delta"] == 6


def test_lookup_join_other_routes_unchanged() -> None:
    """delta = 0 takes the one-table Laplace mechanism (tests/test_join_lookup_one_table.py); an explicit q or join
    mechanism, or an option only they read, keeps the scalar join mechanisms."""
    _, regions = _data()
    sql = f"SELECT COUNT(*) {JOIN} {WHERE}"
    with _session(regions) as s:
        assert s.explain(sql, epsilon=1.0, delta=0.0).mechanism == "laplace"
        assert s.explain(sql, epsilon=1.0, delta=0.0, options={"mechanism": "dp_s4s"}).mechanism == "dp_s4s"
        assert s.explain(sql, epsilon=1.0, delta=1e-6, options={"q": 1}).mechanism == "dp_s4s"
        assert s.explain(sql, epsilon=1.0, delta=1e-6, options={"mechanism": "r2t"}).mechanism == "r2t"
        assert s.explain(sql, epsilon=1.0, delta=1e-6, options={"clip_norm": 2.0}).mechanism == "clipped_gaussian"


@pytest.mark.parametrize("opts", [{}, {"mechanism": "clipped_gaussian"}])
def test_one_person_moves_the_release_by_at_most_delta(opts: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensitivity the noise is calibrated to (Delta = 3 rows per person, each joining one lookup row): a person
    holding 50 rows in region 'e', each also matching a duplicated lookup key (past the check that refuses it before
    the charge: a public file rewritten after it), moves the zero-noise count by 3."""
    monkeypatch.setattr(dpsql._public_keys, "check", lambda *_: None)
    persons, regions = _data()
    dup = pa.concat_tables([regions, pa.table({"region": ["e"], "zone": ["EW"]})])
    extra = pa.table({"pid": np.full(50, 10**6), "region": ["e"] * 50, "age": np.full(50, 40)})
    sql = f"SELECT COUNT(*) {JOIN} {WHERE}"
    out = []
    for rows in (persons, pa.concat_tables([persons, extra])):
        with dpsql.Session(budget=Budget(100.0, 1e-3)) as s:
            s.register("regions", dup, public=True)
            s.register("persons", rows, privacy_unit="pid", max_rows_per_unit=3, references={"region": "regions.region"},
                       columns={"region": {"domain": REGIONS}, "age": {"bounds": [0, 100]}})
            use_noise(s, zero_noise())
            p = s.explain(sql, epsilon=1.0, delta=1e-6, options=opts).parameters
            # the Gaussian's sensitivity is per unit of its scale: L = 3 rows per person; clipping: C = Delta = 3
            assert p["l2_sensitivity"] * p.get("rows_per_group", 1) == pytest.approx(3.0, rel=1e-6)
            out.append(s.query(sql, epsilon=1.0, delta=1e-6, options=opts).to_pylist()[0]["COUNT(*)"])
    assert out[1] - out[0] == 3


@pytest.mark.parametrize("on", ["p.region = r.region AND r2.zone = 'EW'", "p.region = r2.region"])
def test_an_on_naming_a_table_joined_after_it_is_refused(on: str) -> None:
    """An ON sees the tables joined before it and its own, as in DuckDB, which refuses the query (Referenced table
    "r2" not found): it was answered, and charged, as if the condition stood in WHERE."""
    _, regions = _data()
    sql = f"SELECT COUNT(*) FROM persons p JOIN regions r ON {on} JOIN regions r2 ON p.home = r2.region"
    persons, _ = _data()
    with _session(regions) as s:
        s.register("persons", persons.append_column("home", persons.column("region")), privacy_unit="pid",
                   max_rows_per_unit=3, references={"region": "regions.region", "home": "regions.region"},
                   columns={"region": {"domain": REGIONS}, "age": {"bounds": [0, 100]}})
        with pytest.raises(dpsql.errors.UnsupportedQueryError, match="r2.*joined after"):
            s.explain(sql, epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
