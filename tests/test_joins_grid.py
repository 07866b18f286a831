"""Joins: the threshold grid and bias of DP-S4S / R2T (option ``tau_base``; default base 5.5 with the
ln(L/beta) bias, ``tau_base=2`` the paper's Algorithm 2) and R2T's single-owner closed form in the
engine. Numbers pinned by hand in the docstrings."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_joins import (
    CHAIN,
    ITEMS_PER_ORDER,
    ORDERS_PER_CUSTOMER,
    _true_per_customer,
    fk_data,
    graph,
    make_session,
)

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

LN30 = 3.4011973817  # ln(L/beta) with L = 3, beta = 0.1


def test_default_grid_is_base_5_5_with_the_ln_L_over_beta_bias() -> None:
    """CHAIN: Delta = 8 orders x 4 items = 32. Base 5.5 below Delta/sqrt(5.5) = 13.645 and Delta on top: tau = 32,
    5.5, 1 (30.25 is within sqrt(5.5) of 32: left out), L = 3; q = 1 and epsilon = 1: eps_i = 1/3 each;
    bias_i = 3 tau_i ln(3/0.1) = 3 tau_i x 3.4011973817: 326.5149486, 56.1197568, 10.2035921.
    tau_base=2: tau = 32 ... 1, L = 6, first step eps = 1/6, bias 6*32*ln(3*6/0.1) = 192*5.1929568509 = 997.0477154."""
    s = make_session()
    try:
        p = s.explain(CHAIN, epsilon=1.0, options={"q": 1.0}).parameters
        assert p["tau_grid"] == [32.0, 5.5, 1.0] and p["tau_base"] == 5.5 and "ln(L/beta)" in p["bias"]
        assert [st["bias"] for st in p["schedule"]] == pytest.approx([326.5149486, 56.1197568, 10.2035921], rel=1e-8)
        assert [st["epsilon"] for st in p["schedule"]] == pytest.approx([1 / 3] * 3, rel=1e-9)
        paper = s.explain(CHAIN, epsilon=1.0, options={"q": 1.0, "tau_base": 2}).parameters
        assert paper["tau_grid"] == [32.0, 16.0, 8.0, 4.0, 2.0, 1.0] and "3L" in paper["bias"]
        assert paper["schedule"][0]["bias"] == pytest.approx(997.0477154, rel=1e-8)
        r2t = s.explain(CHAIN, epsilon=1.0, options={"mechanism": "r2t"}).parameters
        assert r2t["tau_grid"] == [5.5, 30.25, 166.375]  # least j with 5.5^j >= GS = 32: L = 3
        assert s.explain(CHAIN, epsilon=1.0, options={"mechanism": "r2t", "tau_base": 2}).parameters["tau_grid"] == [
            2.0, 4.0, 8.0, 16.0, 32.0]
    finally:
        s.close()


@pytest.mark.parametrize("bad", [1, 0.5, 2000, "x", True, float("nan")])
def test_tau_base_is_validated_for_free(bad: Any) -> None:
    s = make_session()
    try:
        with pytest.raises(ConfigError, match="tau_base"):
            s.query(CHAIN, epsilon=1.0, options={"tau_base": bad})
        assert s.history().num_rows == 0
    finally:
        s.close()


def test_tau_base_is_refused_where_no_join_mechanism_reads_it() -> None:
    s = make_session()
    try:
        with pytest.raises(ConfigError, match="tau_base"):
            s.query("SELECT COUNT(*) FROM customer", epsilon=1.0, options={"tau_base": 2})
        assert s.history().num_rows == 0
    finally:
        s.close()


def test_r2t_on_one_owner_per_tuple_truncates_in_the_engine() -> None:
    """R2T over a foreign-key chain (one person per tuple) takes the closed form in the engine, like
    DP-S4S: with zero noise the release is max_j (sum_u min(floor(tau_j), y_u) - bias_j), floored by
    f(I, 0) = 0. Grid 5.5, 30.25, 166.375 (GS = 32); epsilon = 1, L = 3: bias_j = 3 tau_j ln(30) =
    56.1197568, 308.6586621, 1697.6226431."""
    data = fk_data(seed=11)
    s = make_session(data)
    use_noise(s, zero_noise())
    try:
        p = s.explain(CHAIN, epsilon=1.0, options={"mechanism": "r2t"})
        assert p.parameters["truncation"].startswith("closed form in the engine")
        assert "__f0_3" in p.bounded_sql  # the fourth column: tau = 0, the floor f(I, 0)
        per = _true_per_customer(data)
        biases = (56.1197568, 308.6586621, 1697.6226431)
        assert [st["bias"] for st in p.parameters["schedule"]] == pytest.approx(list(biases), rel=1e-8)
        cands = [sum(min(math.floor(t), v) for v in per.values()) - b for t, b in zip((5.5, 30.25, 166.375), biases)]
        rel = s.query(CHAIN, epsilon=1.0, options={"mechanism": "r2t"})
        assert rel.mechanism == "r2t"
        assert rel.table.column(0)[0].as_py() == round(max(0.0, max(cands)))
        assert max(cands) > 0  # not the floor: the candidates decide
    finally:
        s.close()


def _sized_session(sizes: dict[str, int]) -> Any:
    """make_session's schema, with the owner's declared table sizes ``sizes`` (max_table_rows)."""
    data = fk_data()
    s = dpsql.Session(budget=Budget(1000.0, 1e-2))
    s.register("nation", data["nation"], public=True)
    s.register("customer", data["customer"], privacy_unit="c_custkey", references={"c_nationkey": "nation.n_nationkey"},
               max_table_rows=sizes.get("customer"))
    s.register("orders", data["orders"], references={"o_custkey": "customer.c_custkey"},
               degree_bounds={"o_custkey": ORDERS_PER_CUSTOMER}, max_table_rows=sizes.get("orders"))
    s.register("lineitem", data["lineitem"], references={"l_orderkey": "orders.o_orderkey"},
               degree_bounds={"l_orderkey": ITEMS_PER_ORDER}, columns={"l_price": {"bounds": (-20, 100)}},
               max_table_rows=sizes.get("lineitem"))
    s.register("node", pa.table({"id": np.arange(60)}), privacy_unit="id", allow_conditional_sampling=True)
    s.register("edge", graph(), references={"src": "node.id", "dst": "node.id"}, degree_bounds={"src": 16, "dst": 16},
               allow_conditional_sampling=True, max_table_rows=sizes.get("edge"))
    return s


def test_lemma_3_3_is_evaluated_only_where_every_table_declares_its_size() -> None:
    """n <= 300 customers x 8 orders each x 4 items each = 9600 (the least start: from orders
    5000 x 1 (key) x 4 = 20000, from lineitem 100000 x 1 x 1). q = 1, epsilon = 1, grid 32, 5.5, 1:
    eps_i = 1/3, so at tau = 32 the bound is sqrt(9600) + 1 + (32 + sqrt(32)) x 3 = 97.9795897 + 1 + 112.9705627 =
    211.9501524, at tau = 5.5: 97.9795897 + 1 + (5.5 + 2.3452079) x 3 = 122.5152134, and at tau = 1:
    97.9795897 + 1 + 2 x 3 = 104.9795897."""
    s = _sized_session({"customer": 300, "orders": 5000, "lineitem": 100_000, "edge": 200})
    try:
        eb = s.explain(CHAIN, epsilon=1.0, options={"q": 1.0}).parameters["error_bound"]
        assert eb["n_bound"] == 9600 and "8 rows of orders AS o per o_custkey" in eb["n_derivation"]
        assert "sqrt(n/q)" in eb["formula"]
        assert [e["tau"] for e in eb["evaluated"]] == [32.0, 5.5, 1.0]
        assert eb["evaluated"][0]["bound"] == pytest.approx(211.9501524, rel=1e-8)
        assert eb["evaluated"][1]["bound"] == pytest.approx(122.5152134, rel=1e-8)
        assert eb["evaluated"][2]["bound"] == pytest.approx(104.9795897, rel=1e-8)
        # a self-join along one degree bound: 200 edges x 16 edges per src = 3200
        path = "SELECT COUNT(*) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src"
        eb2 = s.explain(path, epsilon=1.0, options={"mechanism": "dp_s4s", "q": 0.5}).parameters["error_bound"]
        assert eb2["n_bound"] == 3200 and "16 rows of edge" in eb2["n_derivation"]
    finally:
        s.close()
    s = _sized_session({"customer": 300, "orders": 5000})  # lineitem declares no size
    try:
        eb = s.explain(CHAIN, epsilon=1.0).parameters["error_bound"]
        assert eb["n_bound"] is None and "not evaluated" in eb["evaluated"] and "'lineitem'" in eb["evaluated"]
        assert "sqrt(n/q)" in eb["formula"]  # the formula is always shown
        # R2T: the formula and each threshold's bias, public without sizes
        r2t = s.explain(CHAIN, epsilon=1.0, options={"mechanism": "r2t"}).parameters["error_bound"]
        assert [b["bias"] for b in r2t["per_tau"]] == pytest.approx([56.1197568, 308.6586621, 1697.6226431], rel=1e-8)
    finally:
        s.close()


def test_explain_shows_the_joint_cost_of_the_runs() -> None:
    """CHAIN (Delta = 32), q = 1/4, epsilon = 1, base 2 (L = 6): the runs share one sample, so explain reports
    their joint cost (dpsql.mechanisms.s4s, "Joint accounting"), at most the part's epsilon; with q = 1 too."""
    s = make_session()
    try:
        for q in (0.25, 1.0):
            p = s.explain(CHAIN, epsilon=1.0, options={"q": q, "tau_base": 2}).parameters
            jc = p["joint_cost"]["epsilon_joint"]
            assert 0.99 < jc <= 1.0
    finally:
        s.close()
