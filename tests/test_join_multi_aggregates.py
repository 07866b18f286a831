"""Several aggregates over one join (``dpsql.mechanisms.join_multi``): COUNT(*), COUNT(col), SUM(expr) and
AVG (= SUM / COUNT of the same values), each base aggregate answered by its own run of the routed join
mechanism with 1/m of (epsilon, delta), one charge for their summed cost.

Calibration is pinned by numbers (the shares, each run's cost, the total; the vector form's amplified
epsilon by the formula ln(1 + q'(e^eps - 1)) written here); answers under zero noise equal the
single-aggregate queries run at the same share; refusals are free; the ledger records one charge."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

import pytest
from test_joins import make_session

from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, ConfigError, UnsupportedQueryError
from dpsql.mechanisms.join_multi import shares, sub_salt
from dpsql.plan.analyze import analyze
from dpsql.testing import use_noise, zero_noise

OL = " FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey"
SCALAR = "SELECT COUNT(*) AS n, SUM(l.l_price) AS s, AVG(l.l_price) AS a, SUM(l.l_price) / COUNT(*) AS r" + OL
#: customers' nations are public: GROUP BY a public table's column (per-person clipping by default)
NCOL = (" FROM nation n JOIN customer c ON c.c_nationkey = n.n_nationkey JOIN orders o ON o.o_custkey = c.c_custkey"
        " JOIN lineitem l ON o.o_orderkey = l.l_orderkey")
GROUPED = "SELECT n.n_name, COUNT(*) AS k, AVG(l.l_price) AS a" + NCOL + " GROUP BY n.n_name"
PATH2 = " FROM edge e1 JOIN edge e2 ON e1.dst = e2.src"


@pytest.fixture()
def session() -> Any:
    s = make_session()
    use_noise(s, zero_noise(5))
    yield s
    s.close()


def runs(plan: Any) -> list[dict[str, Any]]:
    return plan.parameters["aggregates"]  # type: ignore[no-any-return]


# -- plan ------------------------------------------------------------------------------------------


def test_aggregates_reduce_to_distinct_base_aggregates(session: Any) -> None:
    p = analyze(SCALAR + " LIMIT 1", dict(session.tables))
    assert [(a.name, a.kind, a.sql) for a in p.aggregates] == [
        ("__a0", "count_star", "COUNT(*)"), ("__a1", "sum", "SUM(l.l_price)"), ("__a2", "count", "COUNT(l.l_price)")]
    assert [o.expr.sql() for o in p.outputs] == ["__a0", "__a1", "CASE WHEN __a2 > 0 THEN __a1 / __a2 END", "__a1 / __a0"]
    assert p.join is not None and [a.sql for a in p.join.aggregates] == ["COUNT(*)", "SUM(l.l_price)", "COUNT(l.l_price)"]
    # a clamp is never NULL: its AVG divides by COUNT(*), shared with an explicit COUNT(*)
    p = analyze("SELECT COUNT(*), AVG(LEAST(GREATEST(l.l_price, 0), 50))" + OL, dict(session.tables))
    assert [a.sql for a in p.aggregates] == ["COUNT(*)", "SUM(LEAST(GREATEST(l.l_price, 0), 50))"]
    assert p.aggregates[1].bounds == (0.0, 50.0)
    # one aggregate (repeated) stays the single-aggregate plan
    p = analyze("SELECT COUNT(*), COUNT(*) * 2" + OL, dict(session.tables))
    assert p.join is not None and p.join.aggregates == () and len(p.aggregates) == 1


#: 3e-6 split three ways: shares of its calibration value 2.9999999999999997e-06 (the float 3e-6 is above the
#: decimal 3e-6 the ledger records: ``dpsql.budget.calibration_value``), the last the exact binary remainder
DELTA_THIRDS = [9.999999999999997e-07, 9.999999999999997e-07, 1.0000000000000002e-06]


def test_shares_add_up_exactly() -> None:
    """Shares of a calibration value, as exact binary numbers (what the runs calibrate with)."""
    assert shares(3.0, 3) == [1.0, 1.0, 1.0]
    assert shares(1.0, 3) == [0.3333333333333333, 0.3333333333333333, 0.33333333333333337]  # binary sum exactly 1
    assert shares(2.9999999999999997e-06, 3) == DELTA_THIRDS
    assert shares(1.0, 2) == [0.5, 0.5]
    for total in (1.0, 2.9999999999999997e-06, 0.3, 0.09999999999999999):
        for m in (2, 3, 7):
            assert sum((Fraction(x) for x in shares(total, m)), Fraction(0)) <= Fraction(total)


# -- calibration, pinned ---------------------------------------------------------------------------


def test_scalar_split_and_charge_are_pinned(session: Any) -> None:
    before = session.remaining()
    p = session.explain(SCALAR, epsilon=3.0)  # DP-S4S, q = 1/16, pure DP
    assert p.mechanism == "dp_s4s" and p.cost == Budget(3.0, 0.0)
    assert [(r["aggregate"], r["mechanism"], r["budget"], r["cost"]) for r in runs(p)] == [
        (a, "dp_s4s", {"epsilon": 1.0, "delta": 0.0}, {"epsilon": 1.0, "delta": 0.0})
        for a in ("COUNT(*)", "SUM(l.l_price)", "COUNT(l.l_price)")]
    # each run is calibrated as the single-aggregate query at its share (the same schedule)
    for r, one in zip(runs(p), ("COUNT(*)", "SUM(l.l_price)", "COUNT(l.l_price)"), strict=True):
        single = session.explain(f"SELECT {one}" + OL, epsilon=1.0)
        assert r["parameters"]["schedule"] == single.parameters["schedule"]
        assert r["parameters"]["parts"] == single.parameters["parts"]
    # the SUM over (-20, 100) is two parts, each with half of its run's share
    assert [x["epsilon"] for x in runs(p)[1]["parameters"]["parts"]] == [0.5, 0.5]
    # with delta > 0 (Gaussian runs under RDP) delta is split too
    p = session.explain(SCALAR, epsilon=3.0, delta=3e-6)
    assert p.cost == Budget(3.0, 3e-6)
    assert [r["cost"] for r in runs(p)] == [{"epsilon": 1.0, "delta": d} for d in DELTA_THIRDS]
    # a share that is not a whole third: the last run takes the exact remainder
    p = session.explain(SCALAR, epsilon=1.0)
    assert [r["budget"]["epsilon"] for r in runs(p)] == [0.3333333333333333, 0.3333333333333333, 0.33333333333333337]
    assert p.cost == Budget(1.0, 0.0)
    assert session.remaining() == before


def test_r2t_split_is_pinned(session: Any) -> None:
    p = session.explain("SELECT COUNT(*), COUNT(e2.dst)" + PATH2, epsilon=2.0)  # attested Delta: R2T
    assert p.mechanism == "r2t" and p.cost == Budget(2.0, 0.0)
    assert [(r["aggregate"], r["cost"]) for r in runs(p)] == [("COUNT(*)", {"epsilon": 1.0, "delta": 0.0}),
                                                              ("COUNT(e2.dst)", {"epsilon": 1.0, "delta": 0.0})]
    assert p.parameters["samples"].startswith("none (q = 1)")


def test_grouped_clipping_runs_are_one_gaussian_vector(session: Any) -> None:
    p = session.explain(GROUPED, epsilon=3.0, delta=3e-6)  # one person per tuple: per-person clipping
    assert p.mechanism == "clipped_gaussian" and p.cost == Budget(3.0, 3e-6)
    assert [(r["aggregate"], r["budget"], r["cost"]) for r in runs(p)] == [
        (a, {"epsilon": 3.0, "delta": d}, None)
        for a, d in zip(("COUNT(*)", "SUM(l.l_price)", "COUNT(l.l_price)"), DELTA_THIRDS, strict=True)]
    assert p.parameters["composition"].startswith("one Gaussian vector of 3 runs")
    # each run clips at its default Delta x max|value| (Delta = 8 orders x 4 items) and is calibrated to sqrt(3) x it
    assert [r["parameters"]["clip_norm"] for r in runs(p)] == [32.0, 3200.0, 32.0]
    assert [r["parameters"]["path"].startswith("per-user L2 clipping") for r in runs(p)] == [True] * 3


def test_clipping_runs_composed_as_one_gaussian_meet_the_exact_profile() -> None:
    """The runs' noise scales, read from explain over a declared key set (d = 5), checked against the exact
    Gaussian profile written here: the m runs are one Gaussian mechanism with mu = sqrt(sum_j (C_j / sigma_j)^2),
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) <= the largest run's Gaussian delta, and that plus
    the runs' floating-point deltas is within the charged delta. Negative control: runs calibrated to their own
    sensitivity only (sigma / sqrt(3)) exceed it."""
    from scipy.stats import norm
    from test_joins import fk_data

    s = make_session()
    s.register("customer", fk_data()["customer"], privacy_unit="c_custkey",
               references={"c_nationkey": "nation.n_nationkey"}, columns={"c_nationkey": {"domain": [0, 1, 2, 3, 4]}})
    col = " FROM customer c JOIN orders o ON o.o_custkey = c.c_custkey JOIN lineitem l ON o.o_orderkey = l.l_orderkey"
    p = s.explain("SELECT c.c_nationkey, COUNT(*), AVG(l.l_price)" + col + " GROUP BY c.c_nationkey", epsilon=3.0,
                  delta=3e-6)
    s.close()
    params = [r["parameters"] for r in runs(p)]
    assert [x["d"] for x in params] == [5, 5, 5] and p.cost == Budget(3.0, 3e-6)

    def delta_of(scale: float) -> float:
        mu = math.sqrt(sum((x["clip_norm"] * (1 + 2**-30) / (x["sigma"] * scale)) ** 2 for x in params))
        return float(norm.cdf(-3.0 / mu + mu / 2) - math.exp(3.0) * norm.cdf(-3.0 / mu - mu / 2))

    gaussian = max(x["delta_gaussian"] for x in params)
    assert gaussian == pytest.approx(9e-7)  # (1 - 0.1) x 1e-6: the first floating-point share fits
    assert delta_of(1.0) <= gaussian * (1 + 1e-9)
    assert delta_of(1.0) + sum(x["fp_delta"] for x in params) <= 3e-6
    assert delta_of(1.0 / math.sqrt(3.0)) > 100 * gaussian  # negative control
    # and the noise is below basic composition's (each run at epsilon / 3): sigma 85.94 against 135.88 for a count
    assert params[0]["sigma"] == pytest.approx(85.9422, rel=1e-5)


def test_grouped_vector_form_split_is_pinned(session: Any) -> None:
    # DP-S4S's vector form at q = 1/4: each run costs its amplified epsilon ln(1 + q'(e^1 - 1)), q' = 1 - (3/4)^32
    p = session.explain(GROUPED, epsilon=3.0, delta=3e-6, options={"q": 0.25})
    q_prime = 1.0 - 0.75 ** 32
    eps_star = math.log1p(q_prime * math.expm1(1.0))
    assert p.mechanism == "dp_s4s_vector"
    for r, d in zip(runs(p), DELTA_THIRDS, strict=True):
        assert r["budget"] == {"epsilon": 1.0, "delta": d}
        assert r["cost"]["epsilon"] == pytest.approx(eps_star, rel=1e-12) and r["cost"]["delta"] == d
    assert p.cost.epsilon == pytest.approx(3 * eps_star, rel=1e-12) and p.cost.delta == 3e-6
    # the runs' costs are the exact binary numbers they calibrated with; the charge's decimal is at least their sum
    assert p.cost.exact_epsilon >= sum((Fraction(r["cost"]["epsilon"]) for r in runs(p)), Fraction(0))
    assert p.parameters["samples"].startswith("independent")


# -- answers under zero noise ----------------------------------------------------------------------


def test_scalar_answers_equal_the_single_aggregate_runs(session: Any) -> None:
    opts = {"q": 1.0}  # DP-S4S without sampling: the zero-noise answer is deterministic
    (row,) = session.query(SCALAR, epsilon=3.0, options=opts).to_pylist()
    one = {a: session.query(f"SELECT {a}" + OL, epsilon=1.0, options=opts).table.column(0)[0].as_py()
           for a in ("COUNT(*)", "SUM(l.l_price)", "COUNT(l.l_price)")}
    assert row["n"] == one["COUNT(*)"] > 0 and row["s"] == one["SUM(l.l_price)"] > 0
    assert row["a"] == pytest.approx(one["SUM(l.l_price)"] / one["COUNT(l.l_price)"], rel=1e-12)
    assert row["r"] == pytest.approx(one["SUM(l.l_price)"] / one["COUNT(*)"], rel=1e-12)
    # R2T on a self-join (several people per tuple)
    (row,) = session.query("SELECT COUNT(*) AS n, COUNT(e2.dst) AS m" + PATH2, epsilon=2.0).to_pylist()
    assert row["n"] == session.query("SELECT COUNT(*)" + PATH2, epsilon=1.0).table.column(0)[0].as_py()
    assert row["m"] == session.query("SELECT COUNT(e2.dst)" + PATH2, epsilon=1.0).table.column(0)[0].as_py()


def test_grouped_answers_equal_the_single_aggregate_runs_with_order_and_limit(session: Any) -> None:
    r = session.query(GROUPED + " ORDER BY k DESC, n.n_name LIMIT 3", epsilon=3.0, delta=3e-6)
    rows = r.to_pylist()
    assert len(rows) == 3 and [x["k"] for x in rows] == sorted((x["k"] for x in rows), reverse=True)
    def single(agg: str) -> dict[Any, Any]:
        out = session.query(f"SELECT n.n_name, {agg}" + NCOL + " GROUP BY n.n_name", epsilon=1.0, delta=1e-6)
        return {x["n_name"]: v for x in out.to_pylist() for k, v in x.items() if k != "n_name"}

    counts, sums, nonnull = single("COUNT(*)"), single("SUM(l.l_price)"), single("COUNT(l.l_price)")
    for x in rows:
        assert x["k"] == counts[x["n_name"]]
        assert x["a"] == pytest.approx(sums[x["n_name"]] / nonnull[x["n_name"]], rel=1e-12)
    assert set(r.accuracy) == {"k", "a"} and "sigma" in r.accuracy["k"] and "note" in r.accuracy["a"]


def test_avg_is_null_where_the_released_count_is_not_positive(session: Any) -> None:
    # no tuple passes the WHERE: zero noise releases count 0, so AVG is NULL (never a division by zero)
    (row,) = session.query("SELECT AVG(l.l_price) AS a, COUNT(*) AS n" + OL + " WHERE l.l_price > 1000",
                           epsilon=2.0, options={"q": 1.0}).to_pylist()
    assert row == {"a": None, "n": 0}


# -- accounting and explain ------------------------------------------------------------------------


def test_one_ledger_charge_with_the_summed_cost(session: Any) -> None:
    n0 = session.history().num_rows
    before = session.remaining()
    r = session.query(SCALAR, epsilon=1.5, delta=3e-6)
    h = session.history().to_pylist()
    assert len(h) == n0 + 1
    assert (h[-1]["mechanism"], h[-1]["epsilon"], h[-1]["delta"], h[-1]["status"]) == ("dp_s4s", 1.5, 3e-6, "released")
    assert r.cost == Budget(1.5, 3e-6) and before.minus(session.remaining()) == Budget(1.5, 3e-6)
    assert [x["cost"] for x in r.details["aggregates"]] == [{"epsilon": 0.5, "delta": d} for d in DELTA_THIRDS]
    # the ledger row keeps what explain states (each run's mechanism, budget, cost and parameters)
    plan = session.explain(SCALAR, epsilon=1.5, delta=3e-6)
    assert json.loads(h[-1]["params"]) == json.loads(json.dumps(plan.parameters))


def test_explain_lists_each_aggregate_and_its_query(session: Any) -> None:
    p = session.explain(SCALAR, epsilon=3.0, options={"q": 0.25})
    assert "-- query 1 of 3" in p.bounded_sql and "-- query 3 of 3" in p.bounded_sql
    for j in range(3):  # each run samples under a salt of its own
        assert f"<per-query secret salt of aggregate {j + 1}>" in p.bounded_sql
    assert "3 base aggregates" in p.notes[0] and "not an underestimate" in p.notes[0]
    text = str(p)
    assert "aggregates:" in text and "COUNT(l.l_price)" in text
    # without sampling the runs share the query's salt (the row caps keep the same rows for all)
    p = session.explain(SCALAR, epsilon=3.0, options={"q": 1.0})
    assert "<per-query secret salt>" in p.bounded_sql and "aggregate 1>" not in p.bounded_sql


def test_sub_salts_are_distinct_and_secret_derived() -> None:
    salts = {sub_salt("0123456789abcdef0123456789abcdef", j) for j in range(4)}
    assert len(salts) == 4 and all(len(x) == 32 and int(x, 16) >= 0 for x in salts)
    assert sub_salt("0123456789abcdef0123456789abcdef", 0) != sub_salt("0123456789abcdef0123456789abcdee", 0)


# -- refusals: free, with the fix -----------------------------------------------------------------


REFUSED = [
    (GROUPED + " HAVING MAX(l.l_price) > 3", {}, UnsupportedQueryError, "HAVING MAX"),
    ("SELECT n.n_name, COUNT(*) AS k" + NCOL + " GROUP BY n.n_name ORDER BY SUM(l.l_price)", {}, UnsupportedQueryError,
     "released only when the SELECT list asks for it"),
    ("SELECT COUNT(*), AVG(o.o_custkey)" + OL, {}, UnsupportedQueryError, r"AVG\(o.o_custkey\) needs value bounds"),
    ("SELECT COUNT(*), MEDIAN(l.l_price)" + OL, {}, UnsupportedQueryError, "use COUNT, SUM or AVG"),
    # the share is too small for a sampled run: the refusal names the aggregate and its share
    (SCALAR, {"q": 2.0 ** -18}, ConfigError, r"COUNT\(\*\), one of the query's 3 base aggregates, answered with "
                                             r"epsilon=0.0333333"),
    (GROUPED, {"clip_norm": 10.0}, ConfigError, "clip_norm is a norm in one aggregate's units"),
]


@pytest.mark.parametrize("sql,opts,cls,msg", REFUSED, ids=[m[:30] for *_, m in REFUSED])
def test_refusals_are_free(session: Any, sql: str, opts: dict[str, Any], cls: type, msg: str) -> None:
    before = session.remaining()
    eps = 0.1 if "q" in opts else 3.0
    for call in (session.explain, session.query):
        with pytest.raises(cls, match=msg):
            call(sql, epsilon=eps, delta=3e-6 if "GROUP BY" in sql else 0.0, options=opts)
    assert session.remaining() == before and session.history().num_rows == 0


def test_a_single_query_at_the_same_budget_is_answered_where_the_split_is_refused(session: Any) -> None:
    # negative control of the last refusal: it is the split, not the query, that is too small
    session.explain("SELECT COUNT(*)" + OL, epsilon=0.1, options={"q": 2.0 ** -18})


def test_over_budget_is_refused_before_any_read(session: Any) -> None:
    with pytest.raises(BudgetExceededError):  # the session's delta budget is 1e-2
        session.query(SCALAR, epsilon=3.0, delta=0.03)
    assert session.history().num_rows == 0 and session.remaining() == Budget(1000.0, 1e-2)


def test_each_clipping_run_adds_noise_of_its_published_scale() -> None:
    """Statistical (fixed seed, failure probability <= 1e-6): the noise each run actually adds, over 400 releases
    of the same bounded rows, divided by that run's published sigma, is chi-square distributed (per run
    n = 400 x 5 keys). Negative controls: the same draws divided by sigma x 0.7 and x 1.3 must fail."""
    from scipy.stats import chi2
    from test_joins import fk_data

    import dpsql.engine as backends
    from dpsql.testing import seeded_noise

    s = make_session()
    s.register("customer", fk_data()["customer"], privacy_unit="c_custkey",
               references={"c_nationkey": "nation.n_nationkey"}, columns={"c_nationkey": {"domain": [0, 1, 2, 3, 4]}})
    col = " FROM customer c JOIN orders o ON o.o_custkey = c.c_custkey JOIN lineitem l ON o.o_orderkey = l.l_orderkey"
    r = s._route("SELECT c.c_nationkey, COUNT(*), AVG(l.l_price)" + col + " GROUP BY c.c_nationkey", 3.0, 3e-6, {})
    rows = backends.fetch_bounded(s._engine, r.mechanism.bounded(r.calibration, "a fixed test salt", s._engine.ops))
    s.close()
    sigmas = [x["parameters"]["sigma"] for x in r.description.parameters["aggregates"]]
    truth = r.mechanism.release(r.calibration, rows, zero_noise()).table
    rng = seeded_noise("test_each_clipping_run_adds_noise_of_its_published_scale")
    z: list[list[float]] = [[], [], []]
    for _ in range(400):
        out = r.mechanism.release(r.calibration, rows, rng).table
        for j in range(3):
            got, exact_ = out.column(f"__a{j}").to_pylist(), truth.column(f"__a{j}").to_pylist()
            z[j] += [(g - t) / sigmas[j] for g, t in zip(got, exact_, strict=True)]
    n = len(z[0])  # per run: three two-sided checks at 1e-6 / 3 each
    lo, hi = chi2.ppf(1e-6 / 6, n), chi2.isf(1e-6 / 6, n)
    for x in z:
        stat = sum(v * v for v in x)
        assert lo <= stat <= hi
        assert not lo <= stat / 0.7**2 <= hi and not lo <= stat / 1.3**2 <= hi  # negative controls


def test_count_of_a_literal_over_a_join_is_count_star_and_count_of_two_columns_is_refused(session: Any) -> None:
    # COUNT(1) / COUNT('x') never see a NULL: the base aggregate COUNT(*), shared with an explicit COUNT(*)
    p = analyze("SELECT COUNT(1) AS a, COUNT('x') AS b, COUNT(*) AS c, SUM(l.l_price) AS s" + OL, dict(session.tables))
    assert [a.kind for a in p.aggregates] == ["count_star", "sum"]
    one, star = (session.explain(f"SELECT {c} AS n" + OL, epsilon=1.0) for c in ("COUNT(1)", "COUNT(*)"))
    assert (one.mechanism, one.cost, one.parameters, one.bounded_sql) == (
        star.mechanism, star.cost, star.parameters, star.bounded_sql)
    assert session.query("SELECT COUNT(1) AS n" + OL, epsilon=1.0).table.column_names == ["n"]
    # COUNT(a, b) is no DuckDB COUNT: refused for free, never answered as COUNT(a)
    left = session.remaining()
    with pytest.raises(UnsupportedQueryError, match="COUNT takes one argument"):
        session.query("SELECT COUNT(o.o_orderkey, l.l_price)" + OL, epsilon=1.0)
    assert session.remaining() == left


def test_grouped_aggregates_over_a_public_nan_key_are_answered() -> None:
    """A public floating-point key holding NaN (released as one NaN group): the runs' results were aligned by
    looking each key up in a dict, NaN is unequal to itself, so every such query failed after its charge."""
    import pyarrow as pa
    from test_joins import fk_data

    data = fk_data()
    data["nation"] = data["nation"].append_column("v", pa.array([float("nan"), 0.0, -0.0, 1.5, None]))
    s = make_session(data)
    use_noise(s, zero_noise(5))
    by_v = NCOL + " GROUP BY n.v"
    r = s.query("SELECT n.v, COUNT(*) AS k, AVG(l.l_price) AS a" + by_v, epsilon=3.0, delta=3e-6)
    rows = {("nan" if x["v"] != x["v"] else x["v"]): x for x in r.to_pylist()}
    # -0.0 and 0.0 are one group; the nation whose v is NULL forms SQL's NULL group
    assert set(rows) == {"nan", 0.0, 1.5, None}
    counts = {("nan" if x["v"] != x["v"] else x["v"]): x["k"]
              for x in s.query("SELECT n.v, COUNT(*) AS k" + by_v, epsilon=1.0, delta=1e-6).to_pylist()}
    assert {k: x["k"] for k, x in rows.items()} == counts and all(x["a"] is not None for x in rows.values())
    assert s.history().column("status").to_pylist() == ["released", "released"]
    s.close()


# -- work: each run's bounded query is built once per explain / query -----------------------------------


@pytest.mark.parametrize("sql, m", [("SELECT SUM(l.l_price)" + OL, 1), (SCALAR, 3), (GROUPED, 3),
                                    ("SELECT COUNT(*), COUNT(e2.dst)" + PATH2, 2)],
                         ids=["one", "s4s", "grouped", "r2t"])
def test_each_runs_bounded_query_is_built_once(session: Any, monkeypatch: pytest.MonkeyPatch, sql: str, m: int) -> None:
    """Building a run's bounded query (joins, caps, sample) is the dearest step of an ``explain`` over a join
    (about 0.1 s each, up to 64 runs): the bind check and the SQL shown (or run) share one build. Counted,
    never timed; a remembered bind check builds nothing more."""
    from dpsql.mechanisms import s4s_sql, s4s_vector

    built = [0]
    for cls in (s4s_sql.JoinMechanism, s4s_vector.VectorJoinMechanism):
        def counting(self: Any, *a: Any, _real: Any = cls.bounded, **k: Any) -> Any:
            built[0] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(cls, "bounded", counting)
    delta = 3e-6 if sql is GROUPED else 0.0
    one = m == 1  # one query, not a batch: prepared with its second run (its own build and one under a stand-in
    # salt, DuckDBBackend.prepare_bounded), then run from its text; a batch is built for every run
    for step, n in (("query (bind check)", m), ("query (remembered)", 2 if one else m), ("query (prepared)", 0 if one else m),
                    ("explain (remembered)", m), ("explain (bind check)", m)):
        built[0] = 0
        if "bind check" in step:
            session._bound_ok.clear()  # the check is not remembered
        if step.startswith("query"):
            session.query(sql, epsilon=3.0, delta=delta)
        else:
            session.explain(sql, epsilon=3.0, delta=delta)
        assert built[0] == n, (step, built[0])
