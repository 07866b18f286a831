"""Session: construction, registration from every source kind, ledger persistence, releases,
explain, post-processing on noisy values, and zero-noise goldens of the bounded aggregates."""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from conftest import make_events

import dpsql
from dpsql.budget import Budget, exact
from dpsql.errors import BudgetExceededError, ConfigError, LedgerError
from dpsql.rewrite.bound import SALT_PLACEHOLDER
from dpsql.testing import seeded_noise, use_noise, zero_noise

COLUMNS = {"amount": {"bounds": (0, 100), "granularity": 0.01}, "country": {"domain": ["US", "FR", "DE", "XX"]}}


def zero_session(events: pa.Table, *, ledger: Any = None, budget: Budget | None = Budget(100.0, 1e-3),
                 max_groups: float = 2, max_rows: float = 1, **kw: Any) -> dpsql.Session:
    s = dpsql.Session(ledger=ledger, budget=budget, **kw)
    use_noise(s, zero_noise())
    s.register("events", events, privacy_unit="user_id", max_groups_per_unit=max_groups,
               max_rows_per_group=max_rows, columns=COLUMNS)
    return s


# -- lifecycle ---------------------------------------------------------------------------------------------


def test_context_manager_closes(events: pa.Table) -> None:
    with zero_session(events) as s:
        assert s.remaining() == Budget(100.0, 1e-3)
    with pytest.raises(ConfigError, match="closed"):
        s.remaining()
    with pytest.raises(ConfigError, match="closed"):
        s.query("SELECT COUNT(*) FROM events", epsilon=1)
    s.close()  # idempotent


def test_in_memory_session_needs_a_budget() -> None:
    with pytest.raises(ConfigError, match="in-memory ledger needs a total budget"):
        dpsql.Session()
    with pytest.raises(ConfigError):
        dpsql.Session(budget=(1.0, 1e-6))  # type: ignore[arg-type]


def test_public_api_has_no_seed() -> None:
    import inspect

    for fn in (dpsql.Session.__init__, dpsql.Session.query, dpsql.Session.explain, dpsql.Session.register):
        assert "seed" not in inspect.signature(fn).parameters
    assert {"Session", "Budget", "Release", "Plan", "errors"} <= set(dpsql.__all__)


# -- registration from every kind of source ------------------------------------------------------------------


def test_register_parquet_csv_arrow_and_connection_table_agree(tmp_path: Path, events: pa.Table) -> None:
    pq.write_table(events, tmp_path / "e.parquet")
    pacsv.write_csv(events, tmp_path / "e.csv")
    con = duckdb.connect()
    con.register("tmp_events", events)
    con.execute("CREATE TABLE ev AS SELECT * FROM tmp_events")
    con.unregister("tmp_events")
    sources = {
        "parquet": str(tmp_path / "e.parquet"),
        "parquet_pathlike": tmp_path / "e.parquet",
        "parquet_glob": str(tmp_path / "*.parquet"),
        "csv": str(tmp_path / "e.csv"),
        "arrow": events,
        "duckdb": "ev",
    }
    q = "SELECT country, COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM events GROUP BY country"
    results = {}
    for kind, src in sources.items():
        s = dpsql.Session(budget=Budget(10.0, 1e-3), connection=con if kind == "duckdb" else None)
        use_noise(s, zero_noise())  # same salt sequence in every session: the same rows are kept
        cols: dict = COLUMNS
        if kind == "csv":  # CSV columns are text unless the owner declares their types (never inferred)
            cols = {**COLUMNS, "amount": {**COLUMNS["amount"], "type": "DOUBLE"}, "user_id": {"type": "BIGINT"}}
        s.register("events", src, privacy_unit="user_id", max_groups_per_unit=2, columns=cols)
        assert s.tables["events"].schema["amount"] == "DOUBLE"
        results[kind] = s.query(q, epsilon=1, delta=1e-6).table.to_pylist()
        s.close()
    first = results["parquet"]
    assert all(r == first for r in results.values()), results
    assert [r["country"] for r in first] == ["DE", "FR", "US", "XX"]
    # the caller's connection is left open and keeps its tables
    assert con.execute("SELECT COUNT(*) FROM ev").fetchone()[0] == events.num_rows


def test_registration_leaves_nothing_in_callers_database(tmp_path: Path) -> None:
    db = str(tmp_path / "caller.duckdb")
    con = duckdb.connect(db)
    con.execute("CREATE TABLE ev AS SELECT range AS user_id FROM range(10)")
    with dpsql.Session(budget=Budget(1.0), connection=con) as s:
        s.register("events", "ev", privacy_unit="user_id")
    con.close()
    con = duckdb.connect(db)
    names = [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
    con.close()
    assert names == []


def test_sessions_sharing_a_connection_keep_their_own_sources() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE ev10 AS SELECT range AS user_id FROM range(10)")
    con.execute("CREATE TABLE ev3 AS SELECT range AS user_id FROM range(3)")
    a = dpsql.Session(budget=Budget(10.0), connection=con)
    b = dpsql.Session(budget=Budget(10.0), connection=con)
    for s in (a, b):
        use_noise(s, zero_noise())
    try:
        a.register("events", "ev10", privacy_unit="user_id")
        b.register("events", "ev3", privacy_unit="user_id")
        assert a.query("SELECT COUNT(*) AS n FROM events", epsilon=1).to_pylist() == [{"n": 10}]
        assert b.query("SELECT COUNT(*) AS n FROM events", epsilon=1).to_pylist() == [{"n": 3}]
    finally:
        a.close()
        b.close()


def test_register_replaces_a_table(tmp_path: Path, events: pa.Table) -> None:
    with zero_session(events) as s:
        small = make_events(n_users=5)
        s.register("events", small, privacy_unit="user_id", columns=COLUMNS)
        r = s.query("SELECT COUNT(DISTINCT user_id) AS n FROM events", epsilon=1)
        assert r.table.to_pylist() == [{"n": 5}]


def test_registered_metadata_is_public_only(events: pa.Table) -> None:
    with zero_session(events) as s:
        d = s.tables["events"].public_description()
        assert d["privacy_unit"] == "user_id" and d["source_kind"] == "arrow"
        assert "SENTINEL" not in repr(d)


# -- ledger persistence ----------------------------------------------------------------------------------------


def test_new_session_on_same_ledger_sees_same_remaining(tmp_path: Path, events: pa.Table) -> None:
    path = tmp_path / "ledger.duckdb"
    with zero_session(events, ledger=path, budget=Budget(2.0, 1e-5), create=True) as s:
        r = s.query("SELECT COUNT(*) FROM events", epsilon=0.5)
        assert r.ledger_id is not None
        rem = s.remaining()
    assert rem == Budget(1.5, 1e-5)
    # same total: fine; no total: read from the ledger
    for budget in (Budget(2.0, 1e-5), None):
        with dpsql.Session(ledger=path, budget=budget) as s2:
            assert s2.remaining() == rem
            h = s2.history()
            assert h.num_rows == 1 and h["status"].to_pylist() == ["released"]
            assert h["entry_id"].to_pylist() == [r.ledger_id]
    with pytest.raises(ConfigError, match="records a total budget"):
        dpsql.Session(ledger=path, budget=Budget(3.0, 1e-5))
    with dpsql.Session(ledger=str(path)) as s3:
        assert s3.remaining() == rem  # refused opens changed nothing


def test_missing_ledger_without_budget_is_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="no budget ledger"):
        dpsql.Session(ledger=tmp_path / "missing.duckdb")
    assert not (tmp_path / "missing.duckdb").exists()


def test_missing_ledger_is_created_only_on_request(tmp_path: Path) -> None:
    path = tmp_path / "missing.duckdb"
    # a total alone does not create a ledger (a mistyped or deleted path is not a fresh budget)
    with pytest.raises(LedgerError, match="no budget ledger") as ei:
        dpsql.Session(ledger=path, budget=Budget(1.0, 1e-6))
    assert "dpsql init" in (ei.value.hint or "")
    assert not path.exists()
    with dpsql.Session(ledger=path, budget=Budget(1.0, 1e-6), create=True) as s:
        assert s.remaining() == Budget(1.0, 1e-6)
    assert path.exists()


def test_budget_is_spent_exactly_and_then_refused(events: pa.Table) -> None:
    with zero_session(events, budget=Budget(1.0, 0.0)) as s:
        for _ in range(10):
            s.query("SELECT COUNT(*) FROM events", epsilon=0.1)
        assert s.remaining() == Budget(0.0, 0.0)
        n = s.history().num_rows
        with pytest.raises(BudgetExceededError) as ei:
            s.query("SELECT COUNT(*) FROM events", epsilon=0.1)
        assert ei.value.requested is not None and ei.value.remaining is not None
        assert s.history().num_rows == n


# -- releases ------------------------------------------------------------------------------------------------------


def test_release_fields(events: pa.Table) -> None:
    with zero_session(events) as s:
        r = s.query("SELECT country, COUNT(*) AS n, SUM(amount) AS total FROM events GROUP BY country",
                    epsilon=0.5, delta=1e-6)
        assert isinstance(r, dpsql.Release) and isinstance(r.table, pa.Table)
        assert r.table.column_names == ["country", "n", "total"]
        # the charge is the request plus the sampler's floating-point delta (dpsql.noise section 3)
        fp = r.details["fp_delta"]
        # (added exactly and rounded up: the least float whose decimal is at least the sum)
        assert 0 < fp < 1e-7 and r.cost.epsilon == 0.5
        assert exact(r.cost.delta) >= exact(1e-6) + exact(fp) > exact(math.nextafter(r.cost.delta, 0))
        assert r.mechanism == "gaussian"
        assert set(r.accuracy) == {"n", "total"}
        for col in ("n", "total"):
            acc = r.accuracy[col]
            assert acc["noise_std"] > 0 and acc["ci95_half_width"] > 1.9 * acc["noise_std"]
        assert r.table.schema.field("n").type == pa.int64()
        h = s.history()
        assert h["entry_id"].to_pylist()[-1] == r.ledger_id
        assert h["status"].to_pylist()[-1] == "released"
        assert s.remaining() == Budget(100.0, 1e-3).minus(r.cost)


@pytest.mark.parametrize(
    "sql,delta,mechanism",
    [
        ("SELECT COUNT(*) FROM events", 0.0, "laplace"),
        ("SELECT COUNT(*) FROM events", 1e-6, "gaussian"),
        ("SELECT country, COUNT(*) FROM events GROUP BY country", 1e-6, "gaussian"),
        ("SELECT url, COUNT(*) FROM events GROUP BY url", 1e-6, "sparse_histogram"),
    ],
)
def test_routing(events: pa.Table, sql: str, delta: float, mechanism: str) -> None:
    with zero_session(events) as s:
        assert s.query(sql, epsilon=1, delta=delta).mechanism == mechanism
        assert s.explain(sql, epsilon=1, delta=delta).mechanism == mechanism


def test_keys_not_declared_public_need_delta(events: pa.Table) -> None:
    with zero_session(events) as s:
        with pytest.raises(dpsql.errors.PolicyError, match="delta > 0"):
            s.query("SELECT url, COUNT(*) FROM events GROUP BY url", epsilon=1)
        assert s.history().num_rows == 0


def test_large_epsilon_warns(events: pa.Table) -> None:
    with zero_session(events) as s, pytest.warns(UserWarning, match="unusually large"):
        s.explain("SELECT COUNT(*) FROM events", epsilon=50)
    with zero_session(events) as s, warnings.catch_warnings():
        warnings.simplefilter("error")
        s.explain("SELECT COUNT(*) FROM events", epsilon=1)


# -- explain is free ---------------------------------------------------------------------------------------------


def test_explain_costs_nothing_and_hides_the_salt(tmp_path: Path, events: pa.Table) -> None:
    path = tmp_path / "l.duckdb"
    with zero_session(events, ledger=path, budget=Budget(1.0, 1e-6), create=True) as s:
        before = path.read_bytes()
        p = s.explain("SELECT url, COUNT(*) FROM events GROUP BY url", epsilon=1, delta=1e-6)
        assert isinstance(p, dpsql.Plan)
        fp = p.parameters["fp_delta"]
        assert 0 < fp < 1e-10 and p.cost.epsilon == 1 and p.mechanism == "sparse_histogram"
        # the delta asked for plus the floating-point part, rounded up (at most a float above the least: dpsql/budget.py)
        assert exact(1e-6) + exact(fp) <= exact(p.cost.delta)
        assert exact(math.nextafter(math.nextafter(p.cost.delta, 0.0), 0.0)) < exact(1e-6) + exact(fp)
        assert SALT_PLACEHOLDER in p.bounded_sql
        assert "tau_star" in p.parameters and p.parameters["max_groups_per_unit"] == 2
        d = p.to_dict()
        assert d["cost"] == {"epsilon": 1.0, "delta": p.cost.delta}
        assert "bounded SQL:" in str(p)
        # explaining more than the remaining budget is fine too: nothing is charged
        s.explain("SELECT COUNT(*) FROM events", epsilon=5)
        assert s.remaining() == Budget(1.0, 1e-6) and s.history().num_rows == 0
        assert path.read_bytes() == before


# -- HAVING / ORDER BY / LIMIT on released values --------------------------------------------------------------


def _seeded(events: pa.Table, seed: str) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    use_noise(s, seeded_noise(seed))
    s.register("events", events, privacy_unit="user_id", max_groups_per_unit=3, columns=COLUMNS)
    return s


def test_having_order_limit_apply_to_noisy_values(events: pa.Table) -> None:
    base = "SELECT country, COUNT(*) AS n, SUM(amount) AS total FROM events GROUP BY country"
    with _seeded(events, "post") as s:
        full = s.query(base, epsilon=0.3, delta=1e-6).to_pylist()
    # same seed, same draws: the post-processed release is a function of the full release
    threshold = sorted(r["n"] for r in full)[1]
    with _seeded(events, "post") as s:
        got = s.query(base + f" HAVING n >= {threshold} ORDER BY total DESC, country LIMIT 2",
                      epsilon=0.3, delta=1e-6).to_pylist()
    want = sorted((r for r in full if r["n"] >= threshold), key=lambda r: (-r["total"], r["country"]))[:2]
    assert got == want
    # and the noisy values really are noisy (not the bounded truth)
    with zero_session(events, max_groups=3) as z:
        truth = z.query(base, epsilon=0.3, delta=1e-6).to_pylist()
    assert [r["n"] for r in full] != [r["n"] for r in truth]


def test_having_on_aggregate_not_in_select_and_offset(events: pa.Table) -> None:
    with zero_session(events) as s:
        all_rows = s.query("SELECT country, COUNT(*) AS n FROM events GROUP BY country ORDER BY country",
                           epsilon=1, delta=1e-6).to_pylist()
        got = s.query("SELECT country FROM events GROUP BY country HAVING COUNT(*) > 0 ORDER BY country "
                      "LIMIT 2 OFFSET 1", epsilon=1, delta=1e-6).to_pylist()
    assert got == [{"country": r["country"]} for r in all_rows if r["n"] > 0][1:3]


def test_every_output_column_has_an_accuracy_entry(events: pa.Table) -> None:
    with zero_session(events) as s:
        r = s.query("SELECT country, COUNT(*) AS n, AVG(amount) AS a, COUNT(*) / 2 AS half FROM events "
                    "GROUP BY country", epsilon=1, delta=1e-6)
    assert set(r.accuracy) == {"n", "a", "half"}
    assert "post-processing" in r.accuracy["half"]["note"]
    assert len(r.accuracy["a"]["per_row_ci95_half_width"]) == r.table.num_rows


def test_avg_per_row_interval_follows_post_processing(events: pa.Table) -> None:
    sql = "SELECT country, COUNT(*) AS n, AVG(amount) AS a FROM events GROUP BY country"
    with zero_session(events) as s:
        full = s.query(sql, epsilon=1, delta=1e-6)
    with zero_session(events) as s:
        cut = s.query(sql + " HAVING n > 0 ORDER BY n DESC LIMIT 2", epsilon=1, delta=1e-6)
    by_country = dict(zip(full.table["country"].to_pylist(), full.accuracy["a"]["per_row_ci95_half_width"], strict=True))
    got = cut.accuracy["a"]["per_row_ci95_half_width"]
    assert len(got) == cut.table.num_rows == 2
    assert got == [by_country[c] for c in cut.table["country"].to_pylist()]


def test_type_error_in_having_is_free(events: pa.Table) -> None:
    with zero_session(events) as s:
        with pytest.raises(dpsql.errors.QueryError):
            s.query("SELECT country, COUNT(*) AS n FROM events GROUP BY country HAVING COUNT(*) > 'abc'",
                    epsilon=1, delta=1e-6)
        assert s.history().num_rows == 0


def test_public_keys_are_all_released_in_key_order(events: pa.Table) -> None:
    with zero_session(events) as s:
        r = s.query("SELECT country, COUNT(*) AS n FROM events GROUP BY country", epsilon=1, delta=1e-6)
    # XX has no rows but is declared public: released (as noise around zero); without ORDER BY
    # rows come sorted by key, a data-independent order
    assert [x["country"] for x in r.to_pylist()] == ["DE", "FR", "US", "XX"]
    assert r.to_pylist()[-1]["n"] == 0


# -- goldens: bounded true aggregates (zero noise) ------------------------------------------------------------------


def oracle(events: pa.Table) -> dict[str, Any]:
    """Aggregates with every row kept and amounts clamped to (0, 100), computed in numpy."""
    country = np.array(events["country"].to_pylist())
    amount = np.clip(events["amount"].to_numpy(), 0, 100)
    user = events["user_id"].to_numpy()
    out: dict[str, Any] = {}
    for c in ("US", "FR", "DE", "XX"):
        m = country == c
        out[c] = {
            "n": int(m.sum()),
            "users": len(set(user[m].tolist())),
            "total": round(float(amount[m].sum()), 2),
            "mean": round(float(amount[m].mean()), 2) if m.any() else None,
        }
    return out


GOLDEN_Q = (
    "SELECT country, COUNT(*) AS n, COUNT(DISTINCT user_id) AS users, SUM(amount) AS total, "
    "AVG(amount) AS mean FROM events GROUP BY country"
)


def test_zero_noise_without_dropping_equals_clamped_truth(events: pa.Table) -> None:
    # caps large enough that nothing is dropped: the release is the clamped exact aggregate
    per_user_rows = max(np.unique(events["user_id"].to_numpy(), return_counts=True)[1])
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("events", events, privacy_unit="user_id", max_groups_per_unit=3,
               max_rows_per_group=int(per_user_rows), columns=COLUMNS)
    with s:
        rows = s.query(GOLDEN_Q, epsilon=1, delta=1e-6).to_pylist()
    want = oracle(events)
    for r in rows:
        w = want[r["country"]]
        assert r["n"] == w["n"] and r["users"] == w["users"]
        assert r["total"] == pytest.approx(w["total"], abs=0.006)
        if w["mean"] is None:
            assert r["mean"] is None
        else:
            assert r["mean"] == pytest.approx(w["mean"], abs=0.051)  # AVG released on a 0.1 grid


# values with caps (C_u = 2 groups, k = 1 row), zero noise, zero_noise() salts
GOLDEN_VALUES: dict[str, list[dict[str, Any]]] = {
    GOLDEN_Q: [
        {"country": "DE", "n": 40, "users": 40, "total": 2196.68, "mean": 54.92},
        {"country": "FR", "n": 38, "users": 38, "total": 2074.48, "mean": 54.59},
        {"country": "US", "n": 34, "users": 34, "total": 1678.75, "mean": 49.38},
        {"country": "XX", "n": 0, "users": 0, "total": 0.0, "mean": None},
    ],
    # ungrouped: at most max_rows_per_unit = C_u * k = 2 rows per user (112 = sum of min(2, rows per user))
    "SELECT COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM events": [{"n": 112, "s": 5699.46, "a": 50.89}],
    # sparse histogram: zero noise, so exactly the groups whose bounded count reaches tau*
    "SELECT url, COUNT(*) AS n FROM events GROUP BY url": [{"url": "a", "n": 39}, {"url": "f", "n": 34}],
    "SELECT CASE WHEN age < 50 THEN 'young' ELSE 'old' END AS b, COUNT(DISTINCT user_id) AS u, SUM(amount) AS s "
    "FROM events WHERE action = 'view' GROUP BY b": [
        {"b": "old", "u": 49, "s": 2754.63},
        {"b": "young", "u": 47, "s": 2091.31},
    ],
}


@pytest.mark.parametrize("sql", sorted(GOLDEN_VALUES) or ["<none>"])
def test_zero_noise_goldens(events: pa.Table, sql: str) -> None:
    if sql == "<none>":
        pytest.skip("no goldens")
    with zero_session(events) as s:
        assert s.query(sql, epsilon=1, delta=1e-6).to_pylist() == GOLDEN_VALUES[sql]


def test_bounded_values_never_exceed_the_unbounded_truth(events: pa.Table) -> None:
    want = oracle(events)
    with zero_session(events) as s:
        rows = s.query(GOLDEN_Q, epsilon=1, delta=1e-6).to_pylist()
    for r in rows:
        w = want[r["country"]]
        # k = 1: one row per (user, group), so COUNT(*) is the distinct-user count of kept pairs
        assert r["n"] == r["users"] <= w["users"]
        assert 0 <= r["total"] <= w["total"] + 0.01
    # C_u = 2: at most 2 groups per user in total
    assert sum(r["users"] for r in rows) <= 2 * len(set(events["user_id"].to_pylist()))


def test_from_config_paths_are_relative_to_the_config_file(tmp_path: Path, events: pa.Table) -> None:
    pq.write_table(events, tmp_path / "events.parquet")
    cfg = tmp_path / "dpsql.toml"
    cfg.write_text(
        '[ledger]\npath = "l.duckdb"\nepsilon = 3.0\ndelta = 1e-6\ncreate_if_missing = true\n\n'
        '[tables.events]\nsource = "events.parquet"\nprivacy_unit = "user_id"\nmax_groups_per_unit = 2\n\n'
        "[tables.events.columns.amount]\nbounds = [0, 100]\n"
    )
    cwd = os.getcwd()
    os.chdir("/")
    try:  # paths in the config are relative to the config file, not the working directory
        with dpsql.Session.from_config(cfg) as s:
            r = s.query("SELECT SUM(amount) AS s FROM events", epsilon=1)
            assert r.table.num_rows == 1
            assert s.remaining() == Budget(2.0, 1e-6)
    finally:
        os.chdir(cwd)
    assert (tmp_path / "l.duckdb").exists()
    with dpsql.Session.from_config(str(cfg)) as s:
        assert s.remaining() == Budget(2.0, 1e-6)
    # without create_if_missing a missing ledger is an error, and nothing is created
    cfg.write_text(cfg.read_text().replace("create_if_missing = true", "").replace("l.duckdb", "m.duckdb"))
    with pytest.raises(LedgerError, match="no budget ledger"):
        dpsql.Session.from_config(cfg)
    assert not (tmp_path / "m.duckdb").exists()
    cfg.write_text(cfg.read_text().replace("delta = 1e-6", 'delta = 1e-6\ncreate_if_missing = "yes"'))
    with pytest.raises(ConfigError, match="create_if_missing"):
        dpsql.Session.from_config(cfg)


@pytest.mark.parametrize(
    "text,match",
    [
        ("[ledger\n", "not valid TOML"),
        ('[ledger]\npath = ":memory:"\nepsilon = 1.0\n[tables.events]\nprivacy_unit = "user_id"\n', "needs a source"),
        ('[ledger]\npath = ":memory:"\nepsilon = 1.0\n[tables.events]\nsource = "events.parquet"\nprivacy_unit = "user_id"\ncolour = 1\n',
         "unknown key"),
        ('[ledger]\npath = ":memory:"\nepsilon = -1.0\n', "epsilon"),
        ('[ledger]\npath = ":memory:"\nepsilon = 1.0\ndelta = 2.0\n', "delta"),
        ('[ledger]\npath = ":memory:"\nepsilon = 1.0\n[tables.events]\nsource = "missing.parquet"\nprivacy_unit = "user_id"\n',
         "no file matches"),
    ],
)
def test_bad_config_is_config_error(tmp_path: Path, events: pa.Table, text: str, match: str) -> None:
    pq.write_table(events, tmp_path / "events.parquet")
    cfg = tmp_path / "dpsql.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=match):
        dpsql.Session.from_config(cfg)
    with pytest.raises(ConfigError, match="not found"):
        dpsql.Session.from_config(tmp_path / "nope.toml")


def test_example_config_loads() -> None:
    ex = Path(__file__).resolve().parents[1] / "examples" / "dpsql.toml"
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(ex, d)
        shutil.copy(ex.parent / "events.parquet", d)
        with dpsql.Session.from_config(Path(d) / "dpsql.toml") as s:
            p = s.explain("SELECT country, COUNT(*) FROM events GROUP BY country", epsilon=1, delta=1e-6)
            assert p.mechanism == "gaussian"
            assert math.isclose(s.remaining().epsilon, 10.0)


def test_cap_options_may_lower_never_raise_the_registered_caps(events: pa.Table) -> None:
    """Owner policy wins: a lower cap adds bias only; a higher one is refused for free."""
    s = zero_session(events, max_groups=2, max_rows=3)
    with pytest.raises(dpsql.errors.PolicyError, match="above the cap 2"):
        s.query("SELECT url, COUNT(*) FROM events GROUP BY url", epsilon=1.0, delta=1e-4,
                options={"max_groups_per_unit": 3})
    # an ungrouped aggregate keeps at most max_rows_per_unit (default C_u * k = 6) rows per person
    with pytest.raises(dpsql.errors.PolicyError, match="above the cap 6"):
        s.explain("SELECT COUNT(*) FROM events", epsilon=1.0, options={"max_rows_per_unit": 7})
    with pytest.raises(dpsql.errors.ConfigError, match="applies to GROUP BY"):
        s.explain("SELECT COUNT(*) FROM events", epsilon=1.0, options={"max_rows_per_group": 1})
    assert s.history().num_rows == 0
    full = s.query("SELECT COUNT(*) AS n FROM events", epsilon=1.0).table.column("n")[0].as_py()
    one = s.query("SELECT COUNT(*) AS n FROM events", epsilon=1.0, options={"max_rows_per_unit": 1})
    assert one.table.column("n")[0].as_py() == len(set(events.column("user_id").to_pylist())) < full
    assert one.details["max_rows_per_group"] == 1
    s.close()


def test_tables_are_frozen_policy_changes_only_through_register(events: pa.Table) -> None:
    import dataclasses

    s = zero_session(events, max_groups=2)
    t = s.tables["events"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.max_groups_per_unit = 1000  # type: ignore[misc]
    with pytest.raises(TypeError):
        t.columns.clear()
    assert s.tables["events"].max_groups_per_unit == 2 and "amount" in s.tables["events"].columns
    p = s.explain("SELECT country, COUNT(*) FROM events GROUP BY country", epsilon=1.0)
    assert p.parameters["max_groups_per_unit"] == 2
    s.close()


def test_a_closed_session_refuses_every_budget_read_alike(events: pa.Table) -> None:
    """``total()`` of a closed Session raised the ledger's LedgerError ("open it again with
    Ledger.open(path)") where ``remaining()`` and ``history()`` raise "this Session is closed"."""
    s = dpsql.Session(budget=Budget(1.0))
    s.close()
    for read in (s.total, s.remaining, s.history):
        with pytest.raises(ConfigError, match="this Session is closed"):
            read()


@pytest.mark.parametrize("ledger", [None, "file"])
def test_pickling_a_session_says_what_to_do(events: pa.Table, tmp_path: Path, ledger: str | None) -> None:
    """Sending a Session to a worker process (multiprocessing, concurrent.futures) failed with
    "cannot pickle 'DuckDBPyConnection' object"; it now says why and what to do instead."""
    import pickle

    path = None if ledger is None else tmp_path / "l.duckdb"
    with dpsql.Session(path, Budget(1.0), create=True) as s:
        s.register("e", events, privacy_unit="user_id")
        with pytest.raises(TypeError, match="a dpsql Session cannot be pickled") as e:
            pickle.dumps(s)
        assert "from_config" in str(e.value) and ("ledger file" in str(e.value)), str(e.value)
