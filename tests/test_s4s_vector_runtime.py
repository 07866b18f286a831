"""GROUP BY over joins with a key set read from a public table at run time: the charge is the joint ε*.

ε* = ln(1 + q′(e^ε − 1)), q′ = 1 − (1 − q)^Δ, depends on (ε, q, Δ) only, never on the key count d, so
the amount reserved before the run is the amount charged; δ's floating-point part, which does depend on d,
is checked for the public key count before the charge (and again, on the same public rows, at run time)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_s4s_vector import session, tpch  # noqa: E402

from dpsql.errors import ConfigError  # noqa: E402
from dpsql.testing import use_noise, zero_noise  # noqa: E402

# customer -> orders: at most 4 orders per customer (declared degree bound), one person per tuple: Delta = 4;
# the keys n_name are read from the public table nation (4 rows) at run time
BY_NATION_ORDERS = ("SELECT n.n_name, COUNT(*) AS cnt FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                    "JOIN nation n ON c.c_nationkey = n.n_nationkey GROUP BY n.n_name ORDER BY n.n_name")
SAMPLED = {"mechanism": "dp_s4s", "q": 0.25}
# by hand: q' = 1 - (3/4)^4 = 175/256 = 0.68359375; e^4 - 1 = 53.598150033...;
# eps* = ln(1 + 0.68359375 * 53.598150033) = ln(37.639524...) = 3.6280503...
EPS_STAR = 3.6280503


def test_joint_epsilon_by_hand() -> None:
    from dpsql.accounting.s4s import s4s_vector_joint_epsilon

    assert s4s_vector_joint_epsilon(4.0, 0.25, 4) == pytest.approx(EPS_STAR, abs=1e-7)
    assert s4s_vector_joint_epsilon(4.0, 1.0, 4) == 4.0  # unsampled: no amplification


def test_explain_shows_the_joint_epsilon_for_a_run_time_key_set() -> None:
    s = session(tpch())
    plan = s.explain(BY_NATION_ORDERS, epsilon=4.0, delta=1e-7, options=SAMPLED)
    p = plan.parameters
    assert p["d"] == "number of public keys (known at run time)" and p["Delta"] == 4 and p["q"] == 0.25
    assert plan.cost.epsilon == pytest.approx(EPS_STAR, abs=1e-7) and plan.cost.delta == 1e-7
    assert p["epsilon_prime"] == pytest.approx(EPS_STAR, abs=1e-7) and p["q_prime"] == pytest.approx(0.68359375, rel=1e-9)
    assert any("(epsilon_prime, delta)" in n and "run time" in n for n in plan.notes)
    assert "sigma" not in p and "granularity" not in p  # d-dependent parameters are computed at run time
    s.close()


def test_ledger_charges_the_joint_epsilon_for_a_run_time_key_set() -> None:
    s = session(tpch())
    use_noise(s, zero_noise())
    before = s.remaining()
    plan = s.explain(BY_NATION_ORDERS, epsilon=4.0, delta=1e-7, options=SAMPLED)
    r = s.query(BY_NATION_ORDERS, epsilon=4.0, delta=1e-7, options=SAMPLED)
    assert r.table.column("n_name").to_pylist() == ["ALGERIA", "BRAZIL", "CHINA", "DENMARK"]
    assert r.cost == plan.cost
    spent = before.epsilon - s.remaining().epsilon
    assert spent == pytest.approx(EPS_STAR, abs=1e-7) and spent < 4.0 - 0.3  # negative control: not the full eps
    assert before.delta - s.remaining().delta == pytest.approx(1e-7, rel=1e-9)
    row = s.history().to_pylist()[-1]
    assert row["epsilon"] == pytest.approx(EPS_STAR, abs=1e-7) and row["status"] == "released"
    assert json.loads(row["params"]) == json.loads(json.dumps(plan.parameters))
    s.close()


def test_run_time_and_declared_key_sets_are_charged_alike() -> None:
    """Same (eps, q, Delta): a declared domain (c_mktsegment, d = 2) and a public table's keys cost the same eps*."""
    s = session(tpch())
    declared = s.explain("SELECT c.c_mktsegment, COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                         "GROUP BY c.c_mktsegment", epsilon=4.0, delta=1e-7, options=SAMPLED)
    run_time = s.explain(BY_NATION_ORDERS, epsilon=4.0, delta=1e-7, options=SAMPLED)
    assert declared.parameters["d"] == 2 and declared.cost == run_time.cost
    s.close()


def test_clipping_with_a_run_time_key_set_is_charged_in_full() -> None:
    """Per-user clipping does not sample: nothing to amplify, the charge is (eps, delta)."""
    s = session(tpch())
    plan = s.explain(BY_NATION_ORDERS, epsilon=4.0, delta=1e-7)
    assert plan.mechanism == "clipped_gaussian" and plan.cost.epsilon == 4.0
    assert "epsilon_prime" not in plan.parameters
    s.close()


def test_unsampled_run_time_key_set_is_charged_eps() -> None:
    s = session(tpch())
    plan = s.explain(BY_NATION_ORDERS, epsilon=4.0, delta=1e-7, options={"mechanism": "r2t"})
    assert plan.cost.epsilon == 4.0 and plan.parameters["q_prime"] == 1.0
    s.close()


def test_a_delta_too_small_for_the_counted_keys_is_refused_free_and_names_the_limits() -> None:
    """At delta = 1e-12 the four public keys cannot be answered: the refusal is free and computes the least
    delta. By hand: Delta = 4 gives L = 3 SVT steps (tau = 1, 2, 4), each with a 2^-40 float-comparison share;
    at the largest fp share (delta_A = delta/4) the check q'(delta/4 + fp) <= delta needs
    fp = (1 + e^4)(4 P_coord + 3 * 2^-40) <= delta (256/175 - 1/4), so delta >= 55.598 * 3 * 9.095e-13 / 1.2129
    = 1.2508e-10, a lower bound; with the grid capped at 4 sigma_lo the 4 coordinates' slope term is no longer
    negligible and the least two-digit delta is 1.4e-10 (pinned; 1.3e-10 was the figure with uncapped grids)."""
    s = session(tpch())
    before, rows = s.remaining(), s.history().num_rows
    for call in (s.explain, s.query):
        with pytest.raises(ConfigError, match="too small") as e:
            call(BY_NATION_ORDERS, epsilon=4.0, delta=1e-12, options=SAMPLED)
        assert "no key count is answerable at delta=1e-12" in str(e.value) and "delta=1.4e-10 would answer 4 groups" in str(e.value)
    assert s.remaining() == before and s.history().num_rows == rows
    assert math.isfinite(before.epsilon)
    s.close()
