"""LEFT JOIN from the private table to public lookup tables on their declared keys: every private row kept once,
the lookup's columns NULL where no lookup row matches, as SQL answers it. Each private row still reaches at most
one row of each lookup, so the one-table mechanisms answer it with the private table's caps (``dpsql.mechanisms.lookup``).

At zero noise, with caps that bind nobody, every answer equals plain DuckDB's on the same data; a GROUP BY over a
lookup column with a declared domain releases that domain plus NULL (the unmatched rows' group), whatever the data.
Everything else (a private right side, RIGHT / FULL joins, a key the catalog does not declare, the join mechanisms)
is refused for free."""

from __future__ import annotations

import re
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import DPSQLError
from dpsql.testing import use_noise, zero_noise

REGIONS = ["EU", "AS", "AM"]
JOIN = "FROM events e LEFT JOIN countries c ON e.cc = c.code"


def _events(unmatched: bool = True) -> pa.Table:
    """300 people with one or two events each (no cap binds); country codes matched, NULL, or absent from the
    lookup ('ZZ') unless ``unmatched`` is False."""
    codes = ["FR", "DE", "JP", "US", "BR", "XX"] + (["ZZ", None] if unmatched else [])
    uid, cc, amt = [], [], []
    for u in range(300):
        for j in range(1 + u % 2):
            uid.append(u)
            cc.append(codes[(u * 7 + j * 3) % len(codes)])
            amt.append(10.0 * ((u + j * 2) % 3 == 0))  # 0 or the bound: every sum on the release grid
    return pa.table({"uid": pa.array(uid, pa.int64()), "cc": pa.array(cc, pa.string()), "amt": amt})


def _countries() -> pa.Table:
    """The lookup: 'XX' has no region (a NULL in the public table itself)."""
    return pa.table({"code": ["FR", "DE", "JP", "US", "BR", "XX"], "region": ["EU", "EU", "AS", "AM", "AM", None],
                     "name": ["France", "Germany", "Japan", "USA", "Brazil", "Nowhere"]})


def _session(events: pa.Table | None = None, *, region_domain: bool = True, rows: int | None = 2) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 1e-2))
    cols: dict[str, Any] = {"region": {"domain": REGIONS}} if region_domain else {}
    s.register("countries", _countries(), public=True, columns=cols)
    s.register("events", _events() if events is None else events, privacy_unit="uid", max_rows_per_unit=rows,
               max_groups_per_unit=2, max_rows_per_group=2, references={"cc": "countries.code"},
               columns={"amt": {"bounds": [0, 10]}})
    use_noise(s, zero_noise())
    return s


def _duckdb(sql: str, events: pa.Table | None = None) -> list[dict[str, Any]]:
    con = duckdb.connect()
    con.register("events", _events() if events is None else events)
    con.register("countries", _countries())
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


@pytest.mark.parametrize("where", [
    "", "WHERE c.region = 'EU'", "WHERE c.code IS NULL", "WHERE c.region IS NULL", "WHERE e.amt > 3 AND c.region <> 'EU'",
    "WHERE COALESCE(c.region, 'none') = 'none'", "WHERE c.region IS NULL OR e.amt < 2"])
@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_scalar_matches_sql_at_zero_noise(where: str, delta: float) -> None:
    sql = f"SELECT COUNT(*) AS n, SUM(e.amt) AS s, COUNT(c.region) AS r {JOIN} {where}"
    with _session() as s:
        got = s.query(sql, epsilon=1.0, delta=delta)
        assert got.mechanism == ("laplace" if delta == 0 else "gaussian")
        (row,) = got.to_pylist()
    (want,) = _duckdb(sql)
    assert row["n"] == pytest.approx(want["n"], abs=0.5)
    assert row["s"] == pytest.approx(float(want["s"] or 0), abs=0.5)
    assert row["r"] == pytest.approx(want["r"], abs=0.5)


def test_unmatched_rows_are_counted_unlike_the_inner_join() -> None:
    """Negative control: the inner join drops exactly the rows the LEFT JOIN keeps."""
    sql = f"SELECT COUNT(*) AS n {JOIN} WHERE c.code IS NULL"
    with _session() as s:
        left = s.query(sql, epsilon=1.0).to_pylist()[0]["n"]
        inner = s.query(sql.replace("LEFT JOIN", "JOIN"), epsilon=1.0).to_pylist()[0]["n"]
    assert inner == pytest.approx(0, abs=0.5)
    assert left == pytest.approx(_duckdb(sql)[0]["n"], abs=0.5) and left > 50


def test_chained_lookups_match_sql() -> None:
    sql = ("SELECT COUNT(*) AS n, COUNT(r.zone) AS z FROM events e LEFT JOIN countries c ON e.cc = c.code "
           "LEFT JOIN regions r ON c.region = r.region WHERE r.zone IS NULL OR r.zone <> 'north'")
    regions = pa.table({"region": ["EU", "AS"], "zone": ["north", "east"]})
    with _session() as s:
        s.register("regions", regions, public=True)
        s.register("countries", _countries(), public=True, references={"region": "regions.region"},
                   columns={"region": {"domain": REGIONS}})
        (row,) = s.query(sql, epsilon=1.0).to_pylist()
    con = duckdb.connect()
    con.register("events", _events())
    con.register("countries", _countries())
    con.register("regions", regions)
    ((n, z),) = con.execute(sql).fetchall()
    assert row["n"] == pytest.approx(n, abs=0.5) and row["z"] == pytest.approx(z, abs=0.5)


def _grouped(sql: str, delta: float, events: pa.Table | None = None, rows: int | None = 2) -> tuple[str, dict[Any, float]]:
    with _session(events, rows=rows) as s:
        r = s.query(sql, epsilon=1.0, delta=delta)
        return r.mechanism, {row["k"]: row["n"] for row in r.to_pylist()}


@pytest.mark.parametrize("rows", [2, None])  # the domain filtered on the rows, or on the (person, group) pairs
@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_group_by_a_declared_lookup_column_releases_the_domain_and_null(delta: float, rows: int | None) -> None:
    sql = f"SELECT c.region AS k, COUNT(*) AS n {JOIN} GROUP BY c.region"
    mech, got = _grouped(sql, delta, rows=rows)
    assert mech == ("laplace" if delta == 0 else "gaussian")
    want = {r["k"]: r["n"] for r in _duckdb(sql)}
    assert set(got) == {*REGIONS, None}
    assert got == {k: pytest.approx(want.get(k, 0), abs=0.5) for k in got}
    assert got[None] > 50  # the unmatched rows, and those of the lookup's NULL region
    # the key set is the same when no row is unmatched: decided from the catalog alone
    _, full = _grouped(sql, delta, _events(unmatched=False), rows=rows)
    want = {r["k"]: r["n"] for r in _duckdb(sql, _events(unmatched=False))}
    assert set(full) == {*REGIONS, None}
    assert full == {k: pytest.approx(want.get(k, 0), abs=0.5) for k in full}


@pytest.mark.parametrize(("where", "keys"), [
    ("WHERE c.region = 'EU'", {"EU"}), ("WHERE c.region IS NULL", {None}),
    ("WHERE c.region <> 'EU'", {"AS", "AM"}), ("WHERE c.code IS NULL", {*REGIONS, None}),
    # the inner join's rows, with the NULL group of the lookup's own NULLs (docs/sql.md)
    ("WHERE c.code IS NOT NULL", {*REGIONS, None})])
def test_group_by_with_where_on_the_lookup_matches_sql(where: str, keys: set[Any]) -> None:
    sql = f"SELECT c.region AS k, COUNT(*) AS n {JOIN} {where} GROUP BY c.region"
    _, got = _grouped(sql, 0.0)
    want = {r["k"]: r["n"] for r in _duckdb(sql)}
    assert set(got) == keys
    assert got == {k: pytest.approx(want.get(k, 0), abs=0.5) for k in got}


def test_group_by_a_private_column_takes_the_sparse_histogram() -> None:
    sql = f"SELECT e.cc AS k, COUNT(*) AS n, COUNT(c.name) AS m {JOIN} GROUP BY e.cc"
    with _session() as s:
        r = s.query(sql, epsilon=8.0, delta=1e-3)
        got = {row["k"]: (row["n"], row["m"]) for row in r.to_pylist()}
    assert r.mechanism == "sparse_histogram"
    want = {w["k"]: (w["n"], w["m"]) for w in _duckdb(sql)}
    assert got and all(k in want and got[k] == pytest.approx(want[k], abs=0.5) for k in got)
    assert "ZZ" in got and got["ZZ"][1] == pytest.approx(0, abs=0.5)  # kept, its lookup columns NULL


def test_explain_shows_the_route_and_the_left_join() -> None:
    sql = f"SELECT COUNT(*) AS n {JOIN} WHERE c.region = 'EU'"
    with _session() as s:
        p = s.explain(sql, epsilon=1.0)
        assert s.remaining() == Budget(100.0, 1e-2)
    assert p.mechanism == "laplace" and "LEFT JOIN" in p.reason
    assert "LEFT JOIN" in p.bounded_sql.upper()
    assert any("LEFT JOIN of c" in n for n in p.notes)


@pytest.mark.parametrize(("sql", "options", "match"), [
    ("SELECT COUNT(*) FROM events e RIGHT JOIN countries c ON e.cc = c.code", {}, "RIGHT joins"),
    ("SELECT COUNT(*) FROM events e FULL JOIN countries c ON e.cc = c.code", {}, "FULL joins"),
    ("SELECT COUNT(*) FROM countries c LEFT JOIN events e ON e.cc = c.code", {}, "private"),
    ("SELECT COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.name", {}, "not on a declared key"),
    ("SELECT COUNT(*) FROM events e LEFT JOIN countries c ON c.region = 'EU'", {}, "ON a column equality"),
    ("SELECT COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.code", {"mechanism": "clipped_gaussian"},
     "LEFT JOIN"),
    ("SELECT COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.code", {"mechanism": "dp_s4s"}, "LEFT JOIN"),
    ("SELECT COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.code", {"q": 0.5}, "LEFT JOIN"),
    ("SELECT COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.code JOIN countries d ON c.code = d.code", {},
     "names columns of 'c', which a LEFT JOIN entered"),
    ("SELECT COUNT(*) FROM events e LEFT JOIN countries c USING (cc)", {}, "USING"),
    ("WITH v AS (SELECT * FROM events) SELECT COUNT(*) FROM v LEFT JOIN countries c ON v.cc = c.code", {}, "LEFT JOIN"),
])
def test_refused_for_free(sql: str, options: dict[str, Any], match: str) -> None:
    with _session() as s:
        for call in (s.explain, s.query):
            with pytest.raises(DPSQLError, match=match) as e:
                call(sql, epsilon=1.0, delta=1e-6, options=options)
            said = f"{e.value} {e.value.hint or ''}"  # the problem and the fix
            assert any(fix in said for fix in ("LEFT JOIN", "inner JOIN", "omit it", "declare")), said
        assert s.remaining() == Budget(100.0, 1e-2)


def test_group_by_an_undeclared_lookup_column() -> None:
    """Without a declared domain the lookup's values are no key set the one-table path can release in full with
    NULL: refused for free by default, naming the fixes; the sparse histogram answers when asked."""
    sql = f"SELECT c.region AS k, COUNT(*) AS n {JOIN} GROUP BY c.region"
    with _session(region_domain=False) as s:
        with pytest.raises(DPSQLError, match="domain") as e:
            s.query(sql, epsilon=1.0, delta=1e-6)
        assert "sparse_histogram" in (e.value.hint or "")
        assert s.remaining() == Budget(100.0, 1e-2)
        r = s.query(sql, epsilon=8.0, delta=1e-3, options={"mechanism": "sparse_histogram"})
        got = {row["k"]: row["n"] for row in r.to_pylist()}
    want = {w["k"]: w["n"] for w in _duckdb(sql)}
    assert None in got and got == {k: pytest.approx(want[k], abs=0.5) for k in got}


def test_a_lookup_with_a_fan_out_or_year_keys_is_refused_for_free() -> None:
    events = _events().append_column("d", pa.array(["2024-05-01"] * 450).cast(pa.date32()))
    with dpsql.Session(budget=Budget(100.0, 1e-2)) as s:
        s.register("countries", _countries(), public=True)
        s.register("codes", pa.table({"code": ["FR", "DE"]}), public=True)
        # two rows per code: one event may match both
        s.register("langs", pa.table({"code": ["FR", "FR", "DE"], "lang": ["fr", "br", "de"]}), public=True,
                   references={"code": "codes.code"}, degree_bounds={"code": 2})
        s.register("events", events, privacy_unit="uid", max_rows_per_unit=2, references={"cc": "countries.code"},
                   columns={"d": {"bounds": ("2020-01-01", "2024-12-31"), "bin_width": "1 day"}})
        with pytest.raises(DPSQLError, match="declared keys") as e:
            s.query("SELECT COUNT(*) FROM events e LEFT JOIN langs l ON e.cc = l.code", epsilon=1.0, delta=1e-6)
        assert "references={'cc': 'countries.code'}" in (e.value.hint or "")
        assert s.query("SELECT COUNT(*) AS n FROM events e JOIN langs l ON e.cc = l.code", epsilon=1.0,
                       delta=1e-6).mechanism == "dp_s4s"  # negative control: the inner join is answered
        spent = s.remaining()
        with pytest.raises(DPSQLError, match="year"):
            s.query(f"SELECT year(e.d) AS y, COUNT(*) AS n {JOIN} GROUP BY y", epsilon=1.0, delta=1e-6)
        assert s.remaining() == spent


def _with_person(extra: int) -> pa.Table:
    """``_events()`` plus one person with ``extra`` events over every code: matched, absent from the lookup, NULL."""
    codes = ["FR", "DE", "JP", "US", "BR", "XX", "ZZ", None]
    more = pa.table({"uid": pa.array([10_000] * extra, pa.int64()),
                     "cc": pa.array([codes[i % len(codes)] for i in range(extra)], pa.string()),
                     "amt": [10.0] * extra})
    return pa.concat_tables([_events(), more])


@pytest.mark.parametrize("dup", [False, True])
def test_one_person_moves_the_release_by_the_sensitivity(dup: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One person added with 40 events over every code (the NULL group's included): the key set and explain are the
    same, at most C_u = 2 groups move, each by at most k = 2; the scalar count by at most L = 2. With the lookup's
    codes duplicated in its data too (one row kept per key: a duplicated public key is refused before the charge,
    tests/test_join_public_keys.py; the check is switched off here to test the cap behind it)."""
    if dup:
        monkeypatch.setattr(dpsql._public_keys, "check", lambda *_: None)
    countries = pa.concat_tables([_countries(), pa.table({"code": ["FR", "ZZ"], "region": ["AS", None],
                                                          "name": ["again", "z"]})]) if dup else _countries()

    def release(events: pa.Table) -> tuple[dict[Any, float], float, tuple[Any, ...]]:
        with _session(events) as s:
            s.register("countries", countries, public=True, columns={"region": {"domain": REGIONS}})
            grouped = f"SELECT c.region AS k, COUNT(*) AS n {JOIN} GROUP BY c.region"
            e = s.explain(grouped, epsilon=5.0)
            rows = {r["k"]: r["n"] for r in s.query(grouped, epsilon=5.0).to_pylist()}
            n = s.query(f"SELECT COUNT(*) AS n {JOIN}", epsilon=5.0).to_pylist()[0]["n"]
        bounded = re.sub(r"_dpsql_src_(\w+)_[0-9a-f]{8}", r"\1", e.bounded_sql)  # the session's own source names
        return rows, n, (e.mechanism, e.reason, bounded, repr(sorted(e.parameters.items())))

    (before, n0, e0), (after, n1, e1) = release(_events()), release(_with_person(40))
    assert e0 == e1 and set(before) == set(after) == {*REGIONS, None}
    diffs = [after[k] - before[k] for k in before]
    assert all(0 <= d <= 2 for d in diffs) and sum(d > 0 for d in diffs) <= 2 and sum(diffs) >= 1
    assert 1 <= n1 - n0 <= 2
    # negative control: SQL without the caps moves the NULL group by the person's 10 unmatched events
    con = duckdb.connect()
    con.register("events", _with_person(40))
    con.register("countries", countries)
    assert con.execute(f"SELECT COUNT(*) {JOIN} WHERE e.uid = 10000 AND c.region IS NULL").fetchall()[0][0] >= 10


def test_inner_join_group_by_an_undeclared_lookup_column_has_the_lookups_null_group() -> None:
    """The inner join's GROUP BY over a lookup column without a declared domain releases every value of the public
    table's column, NULL included when the public table holds one (as SQL shows it: here 'XX' has no region); its
    key set is read from the public table alone. Negative control: a lookup without NULLs releases no NULL group."""
    sql = "SELECT c.region AS k, COUNT(*) AS n FROM events e JOIN countries c ON e.cc = c.code GROUP BY c.region"
    want = {r["k"]: r["n"] for r in _duckdb(sql)}
    with _session(region_domain=False) as s:
        r = s.query(sql, epsilon=8.0, delta=1e-3)
        got = {row["k"]: row["n"] for row in r.to_pylist()}
        no_nulls = pa.table({"code": ["FR", "DE", "JP", "US", "BR", "XX"], "region": ["EU", "EU", "AS", "AM", "AM", "AM"]})
        s.register("countries", no_nulls, public=True)
        plain = {row["k"] for row in s.query(sql, epsilon=8.0, delta=1e-3).to_pylist()}
    assert r.mechanism == "clipped_gaussian" and None in want
    assert set(got) == set(want) and got == {k: pytest.approx(want[k], abs=1.5) for k in got}
    assert plain == set(REGIONS)


def test_left_join_using_names_the_private_tables_column() -> None:
    """``LEFT JOIN c USING (code)``: an unqualified ``code`` is the private row's own (NULL only where it is), as SQL
    reads it; ``c.code`` is NULL where no lookup row matches."""
    events = _events().rename_columns(["uid", "code", "amt"])
    sql = ("SELECT COUNT(*) AS n, COUNT(code) AS m, COUNT(c.code) AS k FROM events e LEFT JOIN countries c USING (code) "
           "WHERE region IS NULL")
    with _session() as s:
        s.register("events", events, privacy_unit="uid", max_rows_per_unit=2, references={"code": "countries.code"})
        (got,) = s.query(sql, epsilon=4.0).to_pylist()
    con = duckdb.connect()
    con.register("events", events)
    con.register("countries", _countries())
    ((n, m, k),) = con.execute(sql).fetchall()
    assert got == {"n": n, "m": m, "k": k} and n > m > k > 0


def test_an_on_naming_a_later_table_names_the_fix_of_a_left_join() -> None:
    """A LEFT JOIN's ON naming a table joined after it: the fix is the order of the joins, not WHERE (there the
    condition would drop the rows the LEFT JOIN keeps); an inner join's may move into WHERE."""
    regions = pa.table({"region": ["EU", "AS"], "zone": ["north", "east"]})
    with _session() as s:
        s.register("regions", regions, public=True)
        s.register("countries", _countries(), public=True, references={"region": "regions.region"},
                   columns={"region": {"domain": REGIONS}})
        for join, fix in (("LEFT JOIN", "order"), ("JOIN", "WHERE")):
            with pytest.raises(DPSQLError, match="joined after it") as e:
                s.query(f"SELECT COUNT(*) FROM events e {join} regions r ON c.region = r.region "
                        "JOIN countries c ON e.cc = c.code", epsilon=1.0)
            assert fix in (e.value.hint or ""), e.value.hint
            assert join != "LEFT JOIN" or "WHERE" not in (e.value.hint or "").split("(")[0]
        assert s.remaining() == Budget(100.0, 1e-2)
