"""The pipeline's structure: one registry, one routing step, one description per mechanism.

* every MechanismName is registered, and each registered mechanism reads only documented options;
* ``explain`` and ``query`` route every request to the same mechanism, at the same cost;
* the parameters recorded in the ledger are exactly the ones ``explain`` shows (one source);
* an option that does not apply to the routed mechanism is refused for free;
* the Session and post-processing know mechanisms only through the interface.
"""

from __future__ import annotations

import ast
import json
import pathlib

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_events

import dpsql
from dpsql.errors import ConfigError
from dpsql.mechanisms.base import MechanismName
from dpsql.mechanisms.registry import REGISTRY
from dpsql.options import OPTIONS
from dpsql.testing import use_noise, zero_noise

PKG = pathlib.Path(dpsql.__file__).parent


def test_every_mechanism_name_is_registered_under_its_own_name():
    assert set(REGISTRY) == set(MechanismName)
    for name, mech in REGISTRY.items():
        assert mech.name == name
        assert mech.options <= set(OPTIONS), f"{name} reads undocumented options {mech.options - set(OPTIONS)}"


def _people(n: int = 200) -> pa.Table:
    gen = np.random.default_rng(3)
    return pa.table({"pid": np.arange(n, dtype=np.int64), "age": gen.integers(0, 100, n).astype(np.int64),
                     "region": np.array(["north", "south"])[gen.integers(0, 2, n)]})


@pytest.fixture
def session(tmp_path):
    s = dpsql.Session(ledger=tmp_path / "l.duckdb", budget=dpsql.Budget(50.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    s.register("events", make_events(), privacy_unit="user_id", max_groups_per_unit=2,
               columns={"amount": {"bounds": (0, 100)}, "country": {"domain": ["US", "FR", "DE"]}})
    f = tmp_path / "people.parquet"
    import pyarrow.parquet as pq

    pq.write_table(_people(), f)
    s.register("people", str(f), privacy_unit="pid", max_rows_per_unit=1,
               columns={"age": {"bounds": (0, 100), "bins": 100}})
    yield s
    s.close()


CASES = [
    ("SELECT COUNT(*), SUM(amount) FROM events", 1e-6, "gaussian"),
    ("SELECT COUNT(*) FROM events", 0.0, "laplace"),
    ("SELECT country, COUNT(*) FROM events GROUP BY country", 0.0, "laplace"),
    ("SELECT url, COUNT(*) FROM events GROUP BY url", 1e-6, "sparse_histogram"),
    ("SELECT age, COUNT(*) FROM people GROUP BY age", 0.0, "dawa"),
]


@pytest.mark.parametrize("sql,delta,mechanism", CASES, ids=[c[2] for c in CASES])
def test_explain_and_query_agree_and_the_ledger_keeps_what_explain_shows(session, sql, delta, mechanism):
    plan = session.explain(sql, epsilon=1.0, delta=delta)
    rel = session.query(sql, epsilon=1.0, delta=delta)
    assert plan.mechanism == rel.mechanism == mechanism
    assert plan.cost == rel.cost
    row = session.history().to_pylist()[-1]
    assert row["mechanism"] == mechanism
    recorded = json.loads(row["params"])
    shown = json.loads(json.dumps(plan.parameters))  # the same JSON round trip as the ledger's
    assert {k: v for k, v in recorded.items() if k != "released_rows"} == shown
    # Release.details: the same parameters, without the per-column scales
    assert rel.details == {k: v for k, v in plan.parameters.items() if k != "scales"}


def test_a_stored_synopsis_is_explained_and_answered_the_same_way(session):
    sql = "SELECT age, COUNT(*) FROM people GROUP BY age"
    session.query(sql, epsilon=1.0)
    plan = session.explain("SELECT COUNT(*) FROM people WHERE age BETWEEN 10 AND 19", epsilon=1.0,
                           options={"reuse": "synopsis"})
    rel = session.query("SELECT COUNT(*) FROM people WHERE age BETWEEN 10 AND 19", epsilon=1.0, options={"reuse": "synopsis"})
    assert plan.mechanism == rel.mechanism == "dawa (reused synopsis)"
    assert plan.cost == rel.cost == dpsql.Budget(0.0, 0.0)
    assert rel.reused and plan.parameters["source_entry_id"] == rel.details["source_entry_id"]


@pytest.mark.parametrize("sql,delta,options", [
    ("SELECT COUNT(*) FROM events", 0.0, {"tau": 5}),
    ("SELECT COUNT(*) FROM events", 0.0, {"epsilon_split": 0.5}),
    ("SELECT url, COUNT(*) FROM events GROUP BY url", 1e-6, {"max_rows_per_unit": 1}),
    ("SELECT age, COUNT(*) FROM people GROUP BY age", 0.0, {"sigma": 3.0}),
])
def test_an_option_that_does_not_apply_is_refused_for_free(session, sql, delta, options):
    before = session.history().num_rows
    for call in (session.explain, session.query):
        with pytest.raises(ConfigError, match="do not apply to the|applies to ungrouped"):
            call(sql, epsilon=1.0, delta=delta, options=options)
    assert session.history().num_rows == before


def _imports(path: pathlib.Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_session_and_postprocessing_know_mechanisms_only_through_the_interface():
    allowed = {"dpsql.mechanisms.base", "dpsql.mechanisms.registry"}
    for mod in ("session.py", "postprocess.py", "options.py"):
        mech = {i for i in _imports(PKG / mod) if i.startswith("dpsql.mechanisms")}
        assert mech <= allowed, f"{mod} imports {mech - allowed}"
    # post-processing knows no mechanism internals (interval columns, count types)
    text = (PKG / "postprocess.py").read_text()
    assert "__ci\"" not in text and "sparse" not in text and "dawa" not in text.lower()


def test_session_is_a_thin_pipeline():
    lines = (PKG / "session.py").read_text().splitlines()
    assert len(lines) < 250


# -- regressions found by review of the restructured pipeline ---------------------------------------------


def test_post_processing_of_a_dawa_histogram_is_checked_on_the_released_bin_labels(session):
    before = session.remaining()
    rel = session.query("SELECT age, COUNT(*) AS n FROM people GROUP BY age HAVING age >= 50 ORDER BY age", epsilon=1.0)
    assert rel.mechanism == "dawa" and rel.table.column("age").to_pylist() == list(range(50, 100))
    spent = session.remaining()
    for bad in ("SELECT upper(age) AS u, COUNT(*) FROM people GROUP BY age",
                "SELECT age, COUNT(*) FROM people GROUP BY age HAVING age LIKE '1%'"):
        for call in (session.explain, session.query):
            with pytest.raises(dpsql.errors.DPSQLError):
                call(bad, epsilon=1.0)
    assert session.remaining() == spent and spent != before


def test_between_symmetric_is_refused_not_rewritten(session):
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="SYMMETRIC"):
        session.query("SELECT COUNT(*) FROM people WHERE age BETWEEN SYMMETRIC 50 AND 10", epsilon=1.0)


def test_unlimited_caps_are_recorded_as_null_and_explain_matches_the_ledger(tmp_path):
    s = dpsql.Session(ledger=tmp_path / "l.duckdb", budget=dpsql.Budget(5.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    s.register("ev", make_events(), privacy_unit="user_id", max_groups_per_unit=float("inf"),
               columns={"country": {"domain": ["US", "FR", "DE"]}})
    sql = "SELECT country, COUNT(*) FROM ev GROUP BY country"
    plan = s.explain(sql, epsilon=1.0)
    s.query(sql, epsilon=1.0)
    recorded = json.loads(s.history().to_pylist()[-1]["params"])
    assert recorded == json.loads(json.dumps(plan.parameters)) and recorded["max_groups_per_unit"] is None
    s.close()


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) * 1000 AS c FROM people WHERE age < 50",
                                 "SELECT COUNT(*) FROM people WHERE age < 50 LIMIT 0"])
def test_workload_queries_must_be_plain_counts(session, sql):
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="range workload query must be|LIMIT 0 releases no row"):
        session.query_many([sql], epsilon=1.0)


def test_an_output_named_like_a_hidden_column_does_not_collide(session):
    rel = session.query('SELECT AVG(amount) AS a, COUNT(*) AS "__ci_0" FROM events', epsilon=1.0, delta=1e-6)
    assert rel.table.column_names == ["a", "__ci_0"]
    assert len(rel.accuracy["a"]["per_row_ci95_half_width"]) == 1


def test_a_lowered_cap_equal_to_the_registered_one_reuses_the_synopsis(session):
    session.query("SELECT age, COUNT(*) FROM people GROUP BY age", epsilon=1.0)
    rel = session.query("SELECT age, COUNT(*) FROM people GROUP BY age", epsilon=1.0, options={"max_rows_per_unit": 1})
    assert rel.reused
    row = session.history().to_pylist()[-1]
    assert row["status"] == "reused"
    assert json.loads(row["params"])["source_entry_id"] == rel.details["source_entry_id"]


@pytest.mark.parametrize("kw", [{"epsilon": 10**400}, {"epsilon": 1.0, "delta": 10**400},
                                {"epsilon": 1.0, "options": {"tau_star": 10**400}}])
def test_numbers_beyond_the_float_range_are_config_errors(session, kw):
    with pytest.raises(ConfigError):
        session.query("SELECT url, COUNT(*) FROM events GROUP BY url", **{"delta": 1e-6, **kw})


def test_bin_labels_are_exact_decimals_and_a_workload_can_be_explained(tmp_path):
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(5.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", pa.table({"u": np.arange(50), "x": np.linspace(0, 0.99, 50)}), privacy_unit="u",
               max_rows_per_unit=1, columns={"x": {"bounds": (0, 1), "bins": 10}})
    rel = s.query("SELECT x, COUNT(*) AS n FROM t GROUP BY x HAVING x = 0.3", epsilon=1.0)
    assert rel.table.column("x").to_pylist() == [0.3]
    plan = s.explain(["SELECT COUNT(*) FROM t WHERE x < 0.5", "SELECT COUNT(*) FROM t WHERE x >= 0.5"], epsilon=1.0)
    assert plan.mechanism == "dawa" and plan.cost == dpsql.Budget(1.0, 0.0)
    s.close()


def test_clip_negative_is_post_processing_of_counts_and_nonnegative_sums(tmp_path):
    # a table with no rows at all: every noisy count is centred on 0, so about half come out negative
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(100.0, 1e-3))
    from dpsql.testing import seeded_noise

    use_noise(s, seeded_noise("clip-negative"))
    empty = pa.table({"u": pa.array([], pa.int64()), "k": pa.array([], pa.string()), "v": pa.array([], pa.float64())})
    keys = [f"k{i}" for i in range(200)]
    s.register("t", empty, privacy_unit="u", columns={"k": {"domain": keys}, "v": {"bounds": (0, 10)}})
    raw = s.query("SELECT k, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY k", epsilon=1.0)
    assert min(raw.table.column("n").to_pylist()) < 0 and min(raw.table.column("s").to_pylist()) < 0
    clipped = s.query("SELECT k, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY k HAVING n >= 0", epsilon=1.0,
                      options={"clip_negative": True})
    assert clipped.table.num_rows == 200  # HAVING sees the clipped values
    assert min(clipped.table.column("n").to_pylist()) == 0 and min(clipped.table.column("s").to_pylist()) == 0
    with pytest.raises(ConfigError, match="clip_negative"):
        s.query("SELECT COUNT(*) FROM t", epsilon=1.0, options={"clip_negative": "yes"})
    s.close()


def test_explain_states_the_expected_accuracy_per_output_and_warns_when_over_budget(session):
    plan = session.explain("SELECT COUNT(*) AS n, SUM(amount) AS total FROM events", epsilon=1.0)
    acc = plan.parameters["expected_accuracy"]
    assert set(acc) == {"n", "total"} and acc["n"]["noise_std"] > 0 and acc["total"]["ci95_half_width"] > 0
    rel = session.query("SELECT COUNT(*) AS n, SUM(amount) AS total FROM events", epsilon=1.0)
    assert rel.accuracy["n"]["noise_std"] == pytest.approx(acc["n"]["noise_std"])
    with pytest.warns(UserWarning, match="unusually large"):
        over = session.explain("SELECT COUNT(*) FROM events", epsilon=49.5)
    assert any("more than the remaining budget" in n for n in over.notes)


# -- second review: allow-list of cast targets, divisors, config before ledger, :memory: -----------------


@pytest.mark.parametrize("sql", [
    "SELECT CAST(COUNT(*) AS INET) AS v FROM events",
    "SELECT CAST(COUNT(*) AS JSON) AS v FROM events",
    "SELECT country, COUNT(*) AS n FROM events GROUP BY country HAVING CAST(COUNT(*) AS BIT) IS NOT NULL",
    "SELECT country, COUNT(*) AS n FROM events GROUP BY country ORDER BY CAST(COUNT(*) AS VARINT)",
])
def test_post_processing_casts_are_on_the_allow_list(session, sql):
    before = session.history().num_rows
    with pytest.raises(dpsql.errors.UnsupportedQueryError, match="CAST to"):
        session.query(sql, epsilon=1.0, delta=1e-6)
    assert session.history().num_rows == before


def test_integer_division_by_a_released_zero_is_null_not_an_error(session):
    rel = session.query("SELECT COUNT(*) // 0 AS a, COUNT(*) % 0 AS b, COUNT(*) // (COUNT(*) - COUNT(*)) AS c FROM events",
                        epsilon=1.0, delta=1e-6)
    assert rel.table.to_pylist() == [{"a": None, "b": None, "c": None}]


def test_a_config_with_a_bad_table_creates_no_ledger(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(make_events(), tmp_path / "t.parquet")
    (tmp_path / "dpsql.toml").write_text(
        '[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n'
        '[tables.t]\nsource = "t.parquet"\nprivacy_unit = "user_id"\ncolumns = { amount = { bound = [0, 1] } }\n')
    with pytest.raises(ConfigError):
        dpsql.Session.from_config(tmp_path / "dpsql.toml")
    assert not (tmp_path / "l.duckdb").exists()


def test_memory_ledger_spelling_and_empty_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with dpsql.Session(ledger=":memory:", budget=dpsql.Budget(1.0, 0.0), create=True) as s:
        assert s.remaining() == dpsql.Budget(1.0, 0.0)
    assert not (tmp_path / ":memory:").exists()
    with pytest.raises(ConfigError, match="empty"):
        dpsql.Session(ledger="", budget=dpsql.Budget(1.0, 0.0))


# -- final review: NULLs in the k = 1 and C_u = 1 choices, reuse that cannot happen, joins on Spark ------


def test_the_one_row_and_one_group_choices_keep_nulls_with_their_share():
    """600 people, each with values 5, 5, 5, 50, NULL (L = 1): each keeps its NULL row w.p. 1/5, from
    its own rows and the query's salt (the keyed race is per person), so the people who kept a NULL
    are Binomial(600, 1/5), and the zero-noise COUNT(v) counts the others: one query, not 600.
    (Uniformity of keyed choices across salts: tests/test_bounding.py's salted-race and
    tests/test_backend_ops.py's across-salts tests.)"""
    import dpsql.testing

    s = dpsql.Session(ledger=None, budget=dpsql.Budget(1e9, 0.5))
    n = 600
    t = pa.table({"u": np.repeat(np.arange(n, dtype=np.int64), 5), "v": [5.0, 5.0, 5.0, 50.0, None] * n,
                  "g": ["a", "a", "b", None, None] * n})
    s.register("t", t, privacy_unit="u", max_rows_per_unit=1, columns={"v": {"bounds": (0, 100)}})
    use_noise(s, dpsql.testing.zero_noise("null-choice"))
    kept_null = n - s.query("SELECT COUNT(v) AS n FROM t", epsilon=1.0).table.column("n")[0].as_py()
    # Binomial(600, 1/5): mean 120, sd 9.8; |X - 120| <= 5.0 sd (failure < 1e-6)
    assert 71 <= kept_null <= 169
    s.close()


def test_reuse_that_no_synopsis_can_serve_is_refused_for_free(session):
    before = session.history().num_rows
    with pytest.raises(dpsql.errors.PolicyError, match="no stored DAWA synopsis"):
        session.query("SELECT COUNT(*) FROM people WHERE age < 30", epsilon=1.0, options={"reuse": "synopsis"})
    # a table registered without a version: its synopses are never stored, and the refusal says so
    with pytest.raises(dpsql.errors.PolicyError, match="registered without a version: .*never stored for reuse"):
        session.query("SELECT COUNT(*) FROM events", epsilon=1.0, options={"reuse": "synopsis"})
    assert session.history().num_rows == before


def test_the_k1_race_lowers_for_spark():
    from dpsql.engine.spark_ops import SparkOps, lower_for_spark
    from dpsql.plan.analyze import analyze
    from dpsql.rewrite.bound import Caps, bounded_query

    s = dpsql.Session(ledger=None, budget=dpsql.Budget(1.0, 1e-6))
    s.register("t", make_events(), privacy_unit="user_id", columns={"amount": {"bounds": (0, 100)}})
    plan = analyze("SELECT SUM(amount) AS s FROM t", s.tables)
    ast = bounded_query(plan, Caps(1, 1), salt="x", unit_column="user_id", ops=SparkOps())
    lower_for_spark(ast)  # raised "LN is not supported" before the clock came from the backend's ops
    s.close()
