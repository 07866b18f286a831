"""Range workloads through SQL: query_many, ordered-domain histograms, free synopsis reuse."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.engine.duckdb_ops import SaltedDuckDBOps
from dpsql.errors import PolicyError, UnsupportedQueryError
from dpsql.mechanisms import ranges
from dpsql.plan import workload
from dpsql.rewrite.bound import bounded_histogram
from dpsql.rewrite.render import render
from dpsql.testing import seeded_noise, use_noise, zero_noise


def people(n_users: int = 300, seed: int = 3) -> pa.Table:
    gen = np.random.default_rng(seed)
    rows = gen.integers(1, 4, n_users)
    uid = np.repeat(np.arange(n_users), rows)
    age = gen.integers(0, 100, len(uid))
    age[:5] = 150  # outside the declared domain: dropped
    return pa.table(
        {
            "pid": uid.astype(np.int64),
            "age": age.astype(np.int64),
            "score": gen.uniform(0, 10, len(uid)),
            "region": np.where(gen.random(len(uid)) < 0.5, "north", "south"),
        }
    )


def make_session(ledger=None, cap: int = 5, noise=None, version: str | None = "v1") -> dpsql.Session:
    s = dpsql.Session(ledger=ledger, budget=dpsql.Budget(10.0, 1e-5), create=True)
    use_noise(s, noise if noise is not None else zero_noise())
    s.register(
        "people",
        people(),
        privacy_unit="pid",
        max_rows_per_unit=cap,
        columns={"age": {"bounds": (0, 120), "bins": 121}, "score": {"bounds": (0, 10), "bins": 20}},
        version=version,
    )
    return s


WORKLOAD = [
    "SELECT COUNT(*) FROM people WHERE region = 'north' AND age BETWEEN 20 AND 29",
    "SELECT COUNT(*) FROM people WHERE age >= 30 AND age < 40 AND region = 'north'",
    "SELECT COUNT(*) FROM people WHERE region = 'north' AND age BETWEEN 0 AND 120",
]


def truth_people(sql_where: str) -> int:
    import duckdb

    con = duckdb.connect()
    con.register("t", people())
    return int(con.execute(f"SELECT COUNT(DISTINCT pid) FROM t WHERE {sql_where}").fetchall()[0][0])


def truth(sql_where: str) -> int:
    import duckdb

    t = people()  # noqa: F841
    con = duckdb.connect()
    con.register("t", t)
    return int(con.execute(f"SELECT COUNT(*) FROM t WHERE {sql_where}").fetchall()[0][0])


def test_workload_analysis_maps_ranges_to_bins():
    s = make_session()
    wl = workload.analyze_workload(WORKLOAD, s.tables)
    assert [d.column for d in wl.dims] == ["age"]
    assert [list(r) for r in wl.ranges] == [[20, 29], [30, 39], [0, 120]]
    assert wl.snapped == [False, False, False]
    assert "region" in wl.base_key


def test_zero_noise_full_range_is_exact_and_one_charge():
    s = make_session()
    before = s.remaining()
    r = s.query_many(WORKLOAD, epsilon=1.0)
    assert isinstance(r, dpsql.WorkloadRelease)
    assert r.cost == dpsql.Budget(1.0, 0.0)
    assert before.epsilon - s.remaining().epsilon == pytest.approx(1.0)
    # the whole domain: measured exactly with zero noise; only the rounding of each released
    # bucket total to an integer moves it (by at most half a count per bucket)
    n_buckets = len(s.ledger.find_synopsis(next(iter([(w := workload.analyze_workload(WORKLOAD, s.tables)).synopsis_key(5, s.tables, binning=ranges.binning(w))])))[1])
    assert n_buckets > 0
    assert abs(r.counts[2] - truth("region = 'north' AND age BETWEEN 0 AND 120")) <= 3
    assert len(r) == 3 and r[0].table.num_rows == 1
    h = s.history()
    assert h.num_rows == 1 and h.column("mechanism").to_pylist() == ["dawa"]


def test_reuse_is_free_and_survives_a_new_session(tmp_path):
    path = str(tmp_path / "l.duckdb")
    s = make_session(ledger=path)
    first = s.query_many(WORKLOAD, epsilon=1.0)
    rem = s.remaining()
    s.close()
    s2 = make_session(ledger=path)  # another process would see the same file
    again = s2.query("SELECT COUNT(*) FROM people WHERE region = 'north' AND age BETWEEN 20 AND 39", epsilon=1.0,
                     options={"reuse": "synopsis"})
    assert again.reused and again.cost == dpsql.Budget(0.0, 0.0)
    assert s2.remaining() == rem
    # a coarser histogram over the same column and WHERE: free on request (the workload's synopsis
    # kept L rows per person; a histogram on its own keeps k rows per bin in C_u bins)
    hist = s2.query(
        "SELECT floor(age / 10) * 10 AS decade, COUNT(*) AS n FROM people WHERE region = 'north' GROUP BY decade ORDER BY decade",
        epsilon=1.0, options={"reuse": "synopsis"},
    )
    assert hist.reused and hist.table.num_rows == 13
    assert sum(hist.table.column("n").to_pylist()) == pytest.approx(first.counts[2], abs=13)
    statuses = s2.history().column("status").to_pylist()
    assert statuses == ["released", "reused", "reused"]
    assert s2.history().column("source_entry_id").to_pylist()[1:] == [first.ledger_id, first.ledger_id]
    s2.close()


def test_different_where_is_not_reused():
    s = make_session()
    s.query_many(WORKLOAD, epsilon=1.0)
    r = s.query_many(["SELECT COUNT(*) FROM people WHERE region = 'south' AND age < 18"], epsilon=0.5)
    assert not r.reused and r.cost.epsilon == 0.5


def test_histogram_query_releases_every_bin():
    s = make_session()
    r = s.query("SELECT age, COUNT(*) AS n FROM people GROUP BY age", epsilon=1.0)
    assert r.mechanism == "dawa"
    assert r.table.num_rows == 121
    assert r.table.column("age").to_pylist()[:3] == [0, 1, 2]
    # the grouped rule (C_u = 1 bin, k = 1 row per person): the zero-noise total is the number of
    # people with a row in the domain (DAWA spreads bucket totals over bins and rounds: up to one per bin
    # off), well apart from the number of rows (about two per person)
    people_in_domain = truth_people("age BETWEEN 0 AND 120")
    assert sum(r.table.column("n").to_pylist()) == pytest.approx(people_in_domain, abs=121)
    assert truth("age BETWEEN 0 AND 120") > people_in_domain + 2 * 121
    assert r.details["l1_sensitivity"] == 1 and r.details["max_groups_per_unit"] == 1


def test_two_dimensional_workload():
    s = make_session(noise=seeded_noise("2d"))
    r = s.query_many(
        [
            "SELECT COUNT(*) FROM people WHERE age BETWEEN 20 AND 40 AND score < 5",
            "SELECT COUNT(*) FROM people WHERE age >= 60 AND score >= 5",
        ],
        epsilon=1.0,
    )
    assert [d["column"] for d in r.details["dims"]] == ["age", "score"]
    assert len(r.counts) == 2


def test_workload_errors_cost_nothing():
    s = make_session()
    before = s.remaining()
    with pytest.raises(UnsupportedQueryError):
        s.query_many(
            ["SELECT COUNT(*) FROM people WHERE region = 'north' AND age < 5", "SELECT COUNT(*) FROM people WHERE age < 9"],
            epsilon=1.0,
        )
    with pytest.raises(UnsupportedQueryError):
        s.query_many(["SELECT SUM(age) FROM people WHERE age < 5"], epsilon=1.0)
    with pytest.raises(UnsupportedQueryError):
        s.query_many([], epsilon=1.0)
    s2 = dpsql.Session(budget=dpsql.Budget(1.0))
    s2.register("t", people(), privacy_unit="pid")
    with pytest.raises(PolicyError):
        s2.query_many(["SELECT COUNT(*) FROM t WHERE age < 5"], epsilon=1.0)
    assert s.remaining() == before and s.history().num_rows == 0


def test_bounded_histogram_respects_the_per_unit_cap():
    """Removing one unit changes the bounded histogram by at most the cap in L1 (same salt)."""
    import duckdb

    t = people()
    cap = 2
    s = make_session(cap=cap)
    wl = workload.analyze_workload(["SELECT COUNT(*) FROM people WHERE age < 50"], s.tables)
    # coupled by the salt: the reproducible choice (the engine's own per-row draw would choose afresh
    # on each side; test_the_drawn_histogram_keeps_l_rows_per_unit checks that form)
    q = render(bounded_histogram(wl, "pid", cap, "fixed-salt", ops=SaltedDuckDBOps()))
    con = duckdb.connect()
    full = t
    for victim in [0, 1, 7, 42]:
        con.register(s.tables["people"].view, full)
        a = ranges.fill_histogram(wl, con.sql(q).to_arrow_table())
        mask = np.asarray(full.column("pid").to_numpy()) != victim
        con.register(s.tables["people"].view, full.filter(pa.array(mask)))
        b = ranges.fill_histogram(wl, con.sql(q).to_arrow_table())
        assert np.abs(a - b).sum() <= cap
    # and the cap binds: units with 3 rows keep only 2
    con.register(s.tables["people"].view, full)
    assert ranges.fill_histogram(wl, con.sql(q).to_arrow_table()).sum() < len(full) - 5


def test_explain_matches_the_range_paths_and_is_free():
    s = make_session()
    p = s.explain("SELECT age, COUNT(*) AS n FROM people GROUP BY age", epsilon=1.0)
    assert p.mechanism == "dawa" and p.cost == dpsql.Budget(1.0, 0.0)
    assert p.parameters["epsilon1"] == pytest.approx(0.25)
    s.query_many(WORKLOAD, epsilon=1.0)
    spent = s.remaining()
    p2 = s.explain("SELECT COUNT(*) FROM people WHERE region = 'north' AND age < 30", epsilon=1.0,
                   options={"reuse": "synopsis"})
    assert p2.mechanism == "dawa (reused synopsis)" and p2.cost == dpsql.Budget(0.0, 0.0)
    # without the opt-in a range count is answered on its own (its own bounding after the whole WHERE)
    p3 = s.explain("SELECT COUNT(*) FROM people WHERE region = 'north' AND age < 30", epsilon=1.0)
    assert p3.mechanism == "laplace" and p3.cost == dpsql.Budget(1.0, 0.0)
    # a range with other conditions is an ordinary scalar count
    assert s.explain("SELECT COUNT(*) FROM people WHERE age < 30", epsilon=1.0).mechanism == "laplace"
    assert s.remaining() == spent and s.history().num_rows == 1


@pytest.mark.parametrize(
    "where, expected, snapped",
    [
        ("age BETWEEN 20 AND 29", [20, 29], False),
        ("age > 64", [65, 120], False),
        ("age < 18", [0, 17], False),
        ("age = 30", [30, 30], False),
        ("score < 5", [0, 9], False),
        ("score <= 5", [0, 10], True),
        ("score > 2.2 AND score < 2.4", [4, 4], True),
    ],
)
def test_range_endpoints_map_to_bins(where, expected, snapped):
    s = make_session()
    wl = workload.analyze_workload([f"SELECT COUNT(*) FROM people WHERE {where}"], s.tables)
    assert [list(r) for r in wl.ranges] == [expected] and wl.snapped == [snapped]


def test_date_domain_by_day():
    import datetime as dt

    gen = np.random.default_rng(9)
    n = 500
    t = pa.table({
        "pid": gen.integers(0, 200, n).astype(np.int64),
        "day": [dt.date(2026, 1, 1) + dt.timedelta(days=int(d)) for d in gen.integers(0, 365, n)],
    })
    s = dpsql.Session(budget=dpsql.Budget(10.0))
    use_noise(s, zero_noise())
    s.register("visits", t, privacy_unit="pid", max_rows_per_unit=50,
               columns={"day": {"bounds": ("2026-01-01", "2027-01-01"), "bin_width": "1 day"}})
    wl = workload.analyze_workload(["SELECT COUNT(*) FROM visits WHERE day BETWEEN '2026-01-01' AND '2026-01-31'"], s.tables)
    assert [list(r) for r in wl.ranges] == [[0, 30]]
    r = s.query_many(["SELECT COUNT(*) FROM visits WHERE day >= '2026-01-01' AND day < '2027-01-01'"], epsilon=1.0)
    assert abs(r.counts[0] - n) <= 3


def test_reuse_across_processes(tmp_path):
    import subprocess
    import sys
    import textwrap

    import pyarrow.parquet as pq

    data = tmp_path / "people.parquet"
    pq.write_table(people(), data)
    ledger = str(tmp_path / "l.duckdb")
    script = textwrap.dedent(
        """
        import sys, dpsql
        with dpsql.Session(ledger=sys.argv[1], budget=dpsql.Budget(5.0), create=True) as s:
            s.register("people", sys.argv[2], privacy_unit="pid", max_rows_per_unit=3,
                       columns={"age": {"bounds": (0, 120), "bins": 121}})
            if sys.argv[3] == "first":
                r = s.query_many(["SELECT COUNT(*) FROM people WHERE age < 30", "SELECT COUNT(*) FROM people WHERE age >= 30"],
                                 epsilon=1.0)
            else:
                r = s.query("SELECT COUNT(*) FROM people WHERE age BETWEEN 10 AND 50", epsilon=1.0,
                            options={"reuse": "synopsis"})
            print(r.reused, r.cost.epsilon, s.remaining().epsilon)
        """
    )
    outs = []
    for stage in ("first", "second"):
        p = subprocess.run([sys.executable, "-c", script, ledger, str(data), stage], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout.split())
    assert outs[0] == ["False", "1.0", "4.0"]
    assert outs[1] == ["True", "0.0", "4.0"]


def test_bin_pseudo_column_histogram():
    s = make_session()
    r = s.query("SELECT age_bin, COUNT(*) AS n FROM people GROUP BY age_bin ORDER BY age_bin", epsilon=1.0)
    assert r.mechanism == "dawa" and r.table.num_rows == 121
    assert r.table.column("age_bin").to_pylist()[:3] == [0, 1, 2]
    with pytest.raises(PolicyError, match="age_bin"):
        s.query("SELECT age_bin, SUM(score) FROM people GROUP BY age_bin", epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 1


# -- what a stored synopsis is keyed by ---------------------------------------------------------------


def test_string_literal_case_is_part_of_the_synopsis_key():
    """A synopsis paid for under region = 'north' must not answer region = 'NORTH' (another count)."""
    s = make_session()
    s.query_many(WORKLOAD, epsilon=1.0)
    r = s.query("SELECT COUNT(*) FROM people WHERE region = 'NORTH' AND age BETWEEN 20 AND 29", epsilon=0.5)
    assert not r.reused and r.cost.epsilon == 0.5
    assert r.table.column(0)[0].as_py() == 0  # zero noise: nobody is in region 'NORTH'
    with pytest.raises(UnsupportedQueryError, match="same non-range WHERE"):
        s.query_many([WORKLOAD[0], "SELECT COUNT(*) FROM people WHERE region = 'North' AND age < 10"], epsilon=1.0)


def test_arrow_source_without_version_is_never_reused():
    s = make_session(version=None)
    s.query_many(WORKLOAD, epsilon=1.0)
    r = s.query_many(WORKLOAD, epsilon=1.0)
    assert not r.reused and r.cost.epsilon == 1.0
    assert s.history().column("synopsis_key").to_pylist() == [None, None]


def test_another_version_or_privacy_unit_is_not_reused(tmp_path):
    path = str(tmp_path / "l.duckdb")
    s = make_session(ledger=path, version="2026-11-01")
    s.query_many(WORKLOAD, epsilon=1.0)
    s.close()
    s2 = make_session(ledger=path, version="2026-11-02")
    assert not s2.query_many(WORKLOAD, epsilon=1.0).reused
    s2.close()
    s3 = dpsql.Session(ledger=path)
    use_noise(s3, zero_noise())
    s3.register("people", people().append_column("household", pa.array(np.arange(people().num_rows) // 3)),
                privacy_unit="household", max_rows_per_unit=5, version="2026-11-02",
                columns={"age": {"bounds": (0, 120), "bins": 121}})
    assert not s3.query_many(WORKLOAD, epsilon=1.0).reused
    s3.close()


def test_parquet_synopsis_follows_file_identity_and_mtime(tmp_path):
    import os

    import pyarrow.parquet as pq

    f = tmp_path / "people.parquet"
    pq.write_table(people(), f)
    path = str(tmp_path / "l.duckdb")

    def sess() -> dpsql.Session:
        s = dpsql.Session(ledger=path, budget=dpsql.Budget(10.0, 1e-5), create=True)
        use_noise(s, zero_noise())
        s.register("people", str(f), privacy_unit="pid", max_rows_per_unit=5,
                   columns={"age": {"bounds": (0, 120), "bins": 121}})
        return s

    s = sess()
    s.query_many(WORKLOAD, epsilon=1.0)
    s.close()
    s = sess()
    assert s.query_many(WORKLOAD, epsilon=1.0).reused  # same file, untouched
    s.close()
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # rewritten (same bytes)
    s = sess()
    assert not s.query_many(WORKLOAD, epsilon=1.0).reused
    s.close()


def test_row_cap_option_may_lower_never_raise_the_registered_cap():
    s = make_session(cap=5)
    with pytest.raises(PolicyError, match="above the cap 5"):
        s.query_many(WORKLOAD, epsilon=1.0, options={"max_rows_per_unit": 6})
    assert s.history().num_rows == 0
    r = s.query_many(WORKLOAD, epsilon=1.0, options={"max_rows_per_unit": 1})
    assert r.details["max_rows_per_unit"] == 1
    # one row per person: the zero-noise full-domain count is the number of people in 'north'
    # a histogram follows the grouped rule: its caps are C_u and k (lowered, never raised)
    with pytest.raises(PolicyError, match="above the cap 1"):
        s.query("SELECT age, COUNT(*) FROM people GROUP BY age", epsilon=1.0, options={"max_groups_per_unit": 2})
    with pytest.raises(dpsql.errors.ConfigError, match="applies to GROUP BY"):
        s.query_many(WORKLOAD, epsilon=1.0, options={"max_groups_per_unit": 1})


@pytest.mark.parametrize("c_u,k,big_l", [(1, 1, math.inf), (2, 1, math.inf), (2, 2, 3.0), (3, 2, math.inf)])
def test_a_histogram_follows_the_grouped_rule(c_u, k, big_l):
    """A histogram's bins are bounded as any GROUP BY: at most k rows per unit in a bin, at most
    C_u bins per unit (and L rows in all): removing one unit changes it by at most min(C_u k, L)
    in L1, and the caps bind (a negative control without them would count every row)."""
    import duckdb

    from dpsql.rewrite.bound import Caps

    gen = np.random.default_rng(11)
    n_users = 200
    rows = gen.integers(1, 8, n_users)
    uid = np.repeat(np.arange(n_users), rows)
    age = np.minimum(gen.integers(0, 6, len(uid)) * 10 + gen.integers(0, 2, len(uid)), 119)
    t = pa.table({"pid": uid.astype(np.int64), "age": age.astype(np.int64)})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0))
    s.register("people", t, privacy_unit="pid", max_groups_per_unit=c_u, max_rows_per_group=k,
               max_rows_per_unit=None if math.isinf(big_l) else big_l, columns={"age": {"bounds": (0, 120), "bins": 120}})
    plan_wl = workload.histogram_workload(dpsql.plan.analyze.analyze("SELECT age, COUNT(*) FROM people GROUP BY age",
                                                                       s.tables))
    assert plan_wl is not None
    groups = Caps(c_u, k, big_l)
    q = render(bounded_histogram(plan_wl, "pid", groups.rows_bound, "fixed-salt", groups=groups,
                                 ops=SaltedDuckDBOps()))  # coupled by the salt, as above
    con = duckdb.connect()
    con.register(s.tables["people"].view, t)
    full = ranges.fill_histogram(plan_wl, con.sql(q).to_arrow_table())
    # per unit: at most k rows per bin and C_u bins (checked through the removal of each unit)
    for victim in range(0, n_users, 7):
        mask = np.asarray(t.column("pid").to_numpy()) != victim
        con.register(s.tables["people"].view, t.filter(pa.array(mask)))
        b = ranges.fill_histogram(plan_wl, con.sql(q).to_arrow_table())
        diff = full - b
        assert diff.min() >= 0 and diff.sum() <= groups.rows_bound
        assert np.count_nonzero(diff) <= c_u and diff.max() <= k
    assert full.sum() < len(uid)  # the caps bind on this data
    s.close()


@pytest.mark.parametrize("big_l", [1, 2, 3])
def test_the_drawn_histogram_keeps_l_rows_per_unit(big_l):
    """The engine's per-row draw (one read of the kept rows): each unit keeps exactly min(rows, L)
    rows, in a workload and in a histogram whose k and C_u do not bind, and with k = 1 a unit
    counts once per bin (LEAST(rows, k) per (unit, bin))."""
    import duckdb

    from dpsql.rewrite.bound import Caps

    gen = np.random.default_rng(12)
    rows = gen.integers(1, 8, 300)
    uid = np.repeat(np.arange(len(rows)), rows)
    t = pa.table({"pid": uid.astype(np.int64), "age": gen.integers(0, 120, len(uid)).astype(np.int64)})
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0))
    s.register("people", t, privacy_unit="pid", max_rows_per_unit=big_l, columns={"age": {"bounds": (0, 120), "bins": 120}})
    con = duckdb.connect()
    con.register(s.tables["people"].view, t)
    wl = workload.analyze_workload(["SELECT COUNT(*) FROM people WHERE age < 200"], s.tables)
    q = render(bounded_histogram(wl, "pid", big_l, "salt"))
    assert "RANDOM()" in q
    assert ranges.fill_histogram(wl, con.sql(q).to_arrow_table()).sum() == np.minimum(rows, big_l).sum()
    hist_wl = workload.histogram_workload(dpsql.plan.analyze.analyze("SELECT age, COUNT(*) FROM people GROUP BY age",
                                                                      s.tables))
    assert hist_wl is not None
    for k, expected in ((float("inf"), np.minimum(rows, big_l).sum()), (1, None)):
        groups = Caps(float("inf"), k, big_l)
        got = ranges.fill_histogram(hist_wl, con.sql(render(bounded_histogram(hist_wl, "pid", big_l, "salt",
                                                                                groups=groups))).to_arrow_table())
        if expected is not None:
            assert got.sum() == expected
        else:  # at most one per (unit, bin): never more than the units, and L rows of 120 bins rarely share one
            assert got.max() <= len(rows) and got.sum() <= np.minimum(rows, big_l).sum()
    s.close()
