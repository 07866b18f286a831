"""What the core enforces whatever a registered mechanism states (docs/architecture.md, "Adding a mechanism").

A mechanism plugs into the registry and the Session drives it through its protocol; these tests stand in for
a plugged mechanism that gets a statement wrong, by patching one method of a registered mechanism, and check
that the core refuses it (before the charge where it can) instead of trusting it.
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_events

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.mechanisms.basic import BasicMechanism
from dpsql.testing import use_noise, zero_noise


@pytest.fixture
def session():
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0, 1e-5))
    use_noise(s, zero_noise())
    s.register("events", make_events(), privacy_unit="user_id", max_rows_per_unit=3)
    yield s
    s.close()


def test_a_mechanism_that_reads_private_rows_for_free_is_refused_before_the_charge(session, monkeypatch):
    describe = BasicMechanism.describe
    monkeypatch.setattr(BasicMechanism, "describe",
                        lambda self, cal: dataclasses.replace(describe(self, cal), cost=Budget(0.0, 0.0)))
    for ask in (session.explain, session.query):
        with pytest.raises(ConfigError, match="reads private rows.*charges nothing"):
            ask("SELECT COUNT(*) FROM events", epsilon=1.0)
    assert session.history().num_rows == 0


def test_an_option_the_routed_mechanism_does_not_list_is_refused_whatever_rule_routed_it(session):
    """A routing rule hands its request to ``_finish``, which refuses the options the mechanism does not read even
    where the rule itself did not check them (a new rule's)."""
    from dpsql.mechanisms import registry
    from dpsql.mechanisms.base import MechanismName, Request, contribution
    from dpsql.plan.analyze import analyze

    catalog = dict(session.tables)
    plan = analyze("SELECT COUNT(*) FROM events", catalog)
    mech = registry.REGISTRY[MechanismName.LAPLACE]
    req = Request.asking(1.0, 0.0, text="SELECT COUNT(*) FROM events", options={"tau": 5}, table=plan.table,
                         unit="user_id", catalog=catalog, plan=plan)
    cal = mech.calibrate(req, contribution(plan.table, {}, grouped=False))
    with pytest.raises(ConfigError, match=r"option\(s\) \['tau'\] do not apply to the laplace mechanism"):
        registry._finish(req, mech, cal, "a new rule")


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM events", "SELECT url, COUNT(*) FROM events GROUP BY url"])
def test_a_forced_mechanism_that_no_rule_sends_the_query_to_is_refused_not_replaced(session, sql):
    """A registered name that no routing rule answers this query with (here the two that cannot be forced, as a
    plugged mechanism whose rule does not apply) is refused, never answered by the Gaussian / Laplace rule under
    its name nor replaced by the sparse histogram."""
    from dpsql.errors import PolicyError
    from dpsql.mechanisms.registry import route

    for name in ("contribution_profile", "public_domain"):
        with pytest.raises(PolicyError, match=f"mechanism '{name}' does not answer this query"):
            route(sql, 1.0, 1e-6, {"mechanism": name}, dict(session.tables), lambda key: None)


def test_a_count_released_as_a_raw_float_is_not_shown(session, monkeypatch):
    """A mechanism states each aggregate's SQL type (``released_types``); a BIGINT one released as non-integers (say,
    the noise sampler's float bits) fails after the charge, generically, and nothing is shown."""
    import pyarrow as pa

    from dpsql.errors import ExecutionError
    from dpsql.mechanisms.base import Released

    def raw(self, cal, bounded, rng):
        return Released(table=pa.table({"__a0": pa.array([41.73])}), accuracy={})

    monkeypatch.setattr(BasicMechanism, "release", raw)
    with pytest.raises(ExecutionError, match="failed after its budget was charged"):
        session.query("SELECT COUNT(*) FROM events", epsilon=1.0)
    assert session.history().to_pylist()[-1]["status"] == "failed"


def test_the_mechanism_option_documents_every_name_it_accepts():
    from dpsql.mechanisms.registry import FORCEABLE
    from dpsql.options import OPTIONS

    for name in FORCEABLE[1:]:
        assert f"'{name}'" in OPTIONS["mechanism"], name


def test_a_mechanisms_check_before_the_charge_reads_public_tables_only(session, monkeypatch):
    """``check_public(calibration, engine)`` runs before the charge: the engine it is handed reads tables
    declared public only, so a mechanism's check cannot read a private row for free."""
    from sqlglot import exp

    view = session.tables["events"].view
    seen = []

    def check_public(self, cal, engine):
        seen.append(engine.fetch_arrow(exp.select("COUNT(*) AS n").from_(exp.to_table(view, quoted=True)),
                                       what="the public key set"))

    monkeypatch.setattr(BasicMechanism, "check_public", check_public, raising=False)
    with pytest.raises(ConfigError, match="reads a table not declared public"):
        session.explain("SELECT COUNT(*) FROM events", epsilon=1.0)
    assert seen == []


def test_a_bounded_relation_that_is_not_an_ast_is_refused_by_name_before_the_charge(session, monkeypatch):
    monkeypatch.setattr(BasicMechanism, "bounded", lambda self, cal, salt, ops: "SELECT 1 AS __users")
    with pytest.raises(TypeError, match="bounded returned a str: a sqlglot expression, a BoundedBatch or None"):
        session.query("SELECT COUNT(*) FROM events", epsilon=1.0)
    assert session.history().num_rows == 0
