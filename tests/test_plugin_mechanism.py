"""A mechanism plugged in from outside dpsql, following docs/architecture.md ("Plugging in a mechanism") only.

``RoundedLaplaceCount`` is a toy: a scalar ``COUNT(*)`` with Laplace noise rounded to a whole number. It lives in
this test module, is registered with ``registry.plug_in`` and reached by the option ``mechanism='rounded_laplace'``;
no file of dpsql is edited. The tests check that explain, the ledger entry, the Release's metadata, the refusals and
the CLI's list of mechanisms take it in, and that the core's guards hold for it.

Privacy claim (of the toy): neighbouring relation, one person added or removed with all of their rows. The bounded
relation keeps at most L = ``max_rows_per_unit`` rows per person (``rewrite.bound.bounded_query``), so the count moves
by at most L; Laplace noise of scale L / epsilon gives epsilon-DP (delta = 0) in exact arithmetic, and rounding to a
whole number is post-processing. (Its floating-point sampler is not snapped: a toy, not for production.)
"""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa
import pytest
from conftest import make_events
from sqlglot import exp

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError, ExecutionError, PolicyError
from dpsql.mechanisms import registry
from dpsql.mechanisms.base import Description, Released, Request
from dpsql.noise import NoiseSource
from dpsql.plan import ir
from dpsql.rewrite.bound import Caps, bounded_query, source_column
from dpsql.testing import use_noise, zero_noise

NAME = "rounded_laplace"


class RoundedLaplaceCount:
    """The toy mechanism (privacy claim: the module docstring)."""

    name = NAME
    options = frozenset({"max_rows_per_unit", "half_up"})

    def calibrate(self, request: Request, contribution: Caps) -> dict[str, Any]:
        plan = request.plan
        assert plan is not None
        if request.delta != 0:
            raise ConfigError("the rounded Laplace count is pure DP", hint="pass delta=0")
        half_up = request.options.get("half_up", True)
        if not isinstance(half_up, bool):
            raise ConfigError(f"half_up must be true or false, got {half_up!r}")
        L = contribution.max_rows_per_group
        return {"plan": plan, "caps": contribution, "unit": request.unit, "epsilon": request.epsilon,
                "scale": L / request.epsilon, "half_up": half_up}

    def describe(self, cal: dict[str, Any]) -> Description:
        return Description(label=NAME, cost=Budget(cal["epsilon"], 0.0),
                           parameters={"laplace_scale": cal["scale"], "sensitivity": cal["caps"].max_rows_per_group},
                           notes=("toy: Laplace noise rounded to whole numbers",))

    def bounded(self, cal: dict[str, Any], salt: str, ops: Any) -> exp.Expression:
        return bounded_query(cal["plan"], cal["caps"], salt=salt, unit_column=cal["unit"], ops=ops)

    def released_types(self, cal: dict[str, Any]) -> dict[str, str]:
        return {a.name: "BIGINT" for a in cal["plan"].aggregates}

    def key_domain(self, cal: dict[str, Any]) -> pa.Table | None:
        return None

    def release(self, cal: dict[str, Any], bounded: pa.Table, rng: NoiseSource) -> Released:
        agg = cal["plan"].aggregates[0]
        true = bounded.column(source_column(agg, cal["caps"])).to_numpy(zero_copy_only=False).astype(float)
        noisy = true + rng.laplace(cal["scale"], true.size)
        value = [int(math.floor(v + 0.5)) if cal["half_up"] else int(round(v)) for v in noisy]
        half = cal["scale"] * math.log(20.0) + 0.5
        return Released(table=pa.table({agg.name: pa.array(value, pa.int64())}),
                        accuracy={agg.name: {"noise": "laplace", "ci95_half_width": half, "granularity": 1.0}})


def answers(request: Request) -> str | None:
    """The routing rule: a scalar COUNT(*) over one table, nothing else."""
    plan = request.plan
    if plan is None or plan.keys or [a.kind for a in plan.aggregates] != [ir.COUNT_STAR]:
        return None
    return "scalar COUNT(*): Laplace noise rounded to whole numbers (the toy plug-in)"


@pytest.fixture
def plugged():
    registry.plug_in(NAME, RoundedLaplaceCount, answers,
                     options={"half_up": "rounded_laplace: round halves up (default true)"})
    yield
    registry.unplug(NAME)


@pytest.fixture
def session(plugged):
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0, 1e-5))
    use_noise(s, zero_noise())
    s.register("events", make_events(), privacy_unit="user_id", max_rows_per_unit=3,
               columns={"country": {"domain": ["US", "FR", "DE"]}, "age": {"bounds": [0, 100], "bins": 10}})
    yield s
    s.close()


SQL = "SELECT COUNT(*) AS n FROM events WHERE country = 'FR'"
FORCE = {"mechanism": NAME}


def test_a_plugged_mechanism_answers_a_query_forced_to_it_and_explain_ledger_and_release_agree(session):
    plan = session.explain(SQL, epsilon=0.5, options=FORCE)
    assert plan.mechanism == NAME and plan.cost == Budget(0.5, 0.0)
    assert "toy plug-in" in plan.reason and plan.parameters == {"laplace_scale": 6.0, "sensitivity": 3}
    rel = session.query(SQL, epsilon=0.5, options=FORCE)
    truth = session.query(SQL, epsilon=0.5, options={"mechanism": "laplace"}).table.column("n")[0].as_py()
    assert rel.table.column_names == ["n"] and rel.table.column("n")[0].as_py() == truth  # zero noise
    assert rel.mechanism == NAME and rel.cost == plan.cost and rel.details == plan.parameters
    assert rel.accuracy["n"]["granularity"] == 1.0 and rel.accuracy["n"]["ci95_half_width"] > 6 * math.log(20)
    row = session.history().to_pylist()[0]
    assert row["entry_id"] == rel.ledger_id and row["status"] == "released" and row["mechanism"] == NAME
    assert (row["epsilon"], row["delta"]) == (0.5, 0.0)
    assert json.loads(row["params"]) == plan.parameters
    assert rel.meta()["mechanism"] == NAME and rel.meta()["cost"] == {"epsilon": 0.5, "delta": 0.0}


def test_a_plugged_mechanism_is_never_chosen_unless_forced(session):
    assert session.explain(SQL, epsilon=0.5).mechanism == "laplace"


def test_refusals_of_a_plugged_mechanism_are_free(session):
    for sql, opts, delta, match in [
        ("SELECT country, COUNT(*) FROM events GROUP BY country", FORCE, 0.0, "does not answer this query"),
        (SQL, FORCE, 1e-6, "pure DP"),  # its own calibrate
        (SQL, {**FORCE, "tau": 3}, 0.0, r"\['tau'\] do not apply to the rounded_laplace mechanism"),
        (SQL, {**FORCE, "half_up": "yes"}, 0.0, "half_up must be true or false"),
        (SQL, {"mechanism": "laplace", "half_up": True}, 0.0, r"\['half_up'\] do not apply to the laplace"),
        (SQL, {"mechanism": "rounded_laplase"}, 0.0, "unknown mechanism"),
        ("SELECT COUNT(*) FROM events e JOIN events f ON e.user_id = f.user_id", FORCE, 0.0, "joins are answered"),
        ("SELECT age_bin, COUNT(*) FROM events GROUP BY age_bin", FORCE, 0.0, "can only be used in a histogram"),
    ]:
        for ask in (session.explain, session.query):
            with pytest.raises((ConfigError, PolicyError), match=match):
                ask(sql, epsilon=0.5, delta=delta, options=opts)
    with pytest.raises(ConfigError, match="DAWA only"):
        session.query_many([SQL], epsilon=0.5, options=FORCE)
    assert session.history().num_rows == 0 and session.remaining() == Budget(10.0, 1e-5)


def test_an_unknown_mechanism_lists_the_plugged_one(session):
    with pytest.raises(ConfigError) as caught:
        session.query(SQL, epsilon=0.5, options={"mechanism": "nope"})
    assert f"'{NAME}'" in caught.value.hint
    from dpsql.options import OPTIONS

    assert f"'{NAME}'" in OPTIONS["mechanism"] and "half_up" in OPTIONS


def test_unplugged_it_is_gone(session):
    registry.unplug(NAME)
    try:
        from dpsql.options import OPTIONS

        assert NAME not in registry.REGISTRY and f"'{NAME}'" not in OPTIONS["mechanism"] and "half_up" not in OPTIONS
        with pytest.raises(ConfigError, match="unknown mechanism"):
            session.explain(SQL, epsilon=0.5, options=FORCE)
    finally:
        registry.plug_in(NAME, RoundedLaplaceCount, answers, options={"half_up": "rounded_laplace: round halves up"})


@pytest.mark.parametrize("name", ["never_plugged", "gaussian", "auto"])
def test_unplugging_a_name_that_was_not_plugged_in_says_so(name):
    with pytest.raises(ValueError, match=f"no mechanism {name!r} was plugged in"):
        registry.unplug(name)
    assert (name in registry.FORCEABLE) == (name != "never_plugged")  # a built-in one stays


@pytest.mark.parametrize("name", ["laplace", "auto", "Bad Name", ""])
def test_a_plug_in_cannot_take_a_name_already_used_or_malformed(plugged, name):
    with pytest.raises(ValueError):
        registry.plug_in(name, RoundedLaplaceCount, answers)


def test_a_plug_in_cannot_redefine_an_option(plugged):
    with pytest.raises(ValueError, match="tau"):
        registry.plug_in("other", RoundedLaplaceCount, answers, options={"tau": "mine"})
    assert "other" not in registry.REGISTRY


def test_the_cli_lists_and_runs_a_plugged_mechanism(plugged, tmp_path, capsys):
    """The CLI, run by a program that has imported the plug-in (``dpsql.cli.main``), lists it among the mechanisms
    and answers with it."""
    import pyarrow.parquet as pq

    from dpsql.cli import main

    pq.write_table(make_events(), tmp_path / "events.parquet")
    base = ["--ledger", str(tmp_path / "l.duckdb")]
    assert main([*base, "init", "--epsilon", "5"]) == 0
    table = ["--table", f"events={tmp_path / 'events.parquet'}", "--privacy-unit", "events=user_id"]
    capsys.readouterr()
    assert main([*base, "query", *table, "--epsilon", "0.5", "--option", "mechanism=nope", SQL]) != 0
    assert NAME in capsys.readouterr().err
    assert main([*base, "query", *table, "--epsilon", "0.5", "--option", f"mechanism={NAME}",
                 "--option", "half_up=false", "--format", "json", SQL]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["mechanism"] == NAME
    assert main([*base, "explain", *table, "--epsilon", "0.5", "--option", f"mechanism={NAME}", SQL]) == 0
    assert NAME in capsys.readouterr().out


# -- the core's guards against a plugged mechanism that gets its release wrong -----------------------------------

BAD = "misbehaving"


class Misbehaving(RoundedLaplaceCount):
    """The toy, answering scalar counts and counts per country, whose release is replaced by ``Misbehaving.make``
    (a function of the bounded rows): each case below gets one thing wrong."""

    name = BAD
    make: Any = None
    types = "BIGINT"

    def calibrate(self, request: Request, contribution: Caps) -> dict[str, Any]:
        return {**super().calibrate(request, contribution), "grouped": bool(request.plan and request.plan.keys)}

    def released_types(self, cal: dict[str, Any]) -> dict[str, str]:
        return {a.name: self.types for a in cal["plan"].aggregates}

    def release(self, cal: dict[str, Any], bounded: pa.Table, rng: NoiseSource) -> Released:
        return Released(table=Misbehaving.make(bounded), accuracy={"__a0": {"noise": "laplace"}})


def _answers_counts(request: Request) -> str | None:
    plan = request.plan
    return "counts (a plugged mechanism that gets its release wrong)" if plan and plan.aggregates else None


@pytest.fixture
def misbehaving(session):
    registry.plug_in(BAD, Misbehaving, _answers_counts)
    yield session
    registry.unplug(BAD)
    Misbehaving.types = "BIGINT"


def _secret(bounded: pa.Table) -> pa.Table:
    raise ValueError(f"the row of user 4242: {bounded.to_pylist()}")


SCALAR = "SELECT COUNT(*) AS n FROM events"
GROUPED = "SELECT country, COUNT(*) AS n FROM events GROUP BY country"
KEYS = pa.array(["US", "FR", "DE"])


@pytest.mark.parametrize("sql, types, make", [
    (SCALAR, "BIGINT", _secret),
    (SCALAR, "DOUBLE", lambda b: pa.table({"__a0": pa.array([math.nan])})),
    (SCALAR, "DOUBLE", lambda b: pa.table({"__a0": pa.array([-math.inf])})),
    (SCALAR, "BIGINT", lambda b: pa.table({"__a0": pa.array([3, 4], pa.int64())})),
    (SCALAR, "BIGINT", lambda b: pa.table({"__a0": pa.array([], pa.int64())})),
    (SCALAR, "BIGINT", lambda b: pa.table({"__a9": pa.array([3], pa.int64())})),
    (GROUPED, "BIGINT", lambda b: pa.table({"__k0": pa.array(["US", "FR", "XX"]), "__a0": pa.array([1, 2, 3])})),
    (GROUPED, "BIGINT", lambda b: pa.table({"__k0": pa.array(["US", "FR", None]), "__a0": pa.array([1, 2, 3])})),
    (GROUPED, "BIGINT", lambda b: pa.table({"__k0": pa.array(["US", "US", "FR", "DE"]),
                                            "__a0": pa.array([1, 2, 3, 4])})),
    (GROUPED, "DOUBLE", lambda b: pa.table({"__k0": KEYS, "__a0": pa.array([1.0, math.nan, 3.0])})),
], ids=["raises", "nan", "inf", "two_rows", "no_row", "other_column", "key_not_declared", "null_key",
        "key_twice", "nan_in_a_group"])
def test_a_wrong_release_is_a_failed_run_that_counts_never_shown(misbehaving, sql, types, make):
    Misbehaving.make, Misbehaving.types = staticmethod(make), types
    with pytest.raises(ExecutionError, match="failed after its budget was charged; the charge stands") as caught:
        misbehaving.query(sql, epsilon=0.5, options={"mechanism": BAD})
    text = str(caught.value) + repr(caught.value.__dict__)
    assert "4242" not in text and "XX" not in text and "nan" not in text.lower()
    assert misbehaving.history().to_pylist()[-1]["status"] == "failed"
    assert misbehaving.remaining().epsilon == pytest.approx(9.5)


def test_the_guards_pass_a_right_release(misbehaving):
    """The negative control: the same plugged mechanism releasing every declared key once, in any order."""
    Misbehaving.make = staticmethod(lambda b: pa.table({"__k0": pa.array(["DE", "US", "FR"]),
                                                        "__a0": pa.array([1, 2, 3])}))
    rel = misbehaving.query(GROUPED, epsilon=0.5, options={"mechanism": BAD})
    assert sorted(rel.to_pylist(), key=str) == sorted([{"country": "DE", "n": 1}, {"country": "US", "n": 2},
                                                       {"country": "FR", "n": 3}], key=str)
    Misbehaving.make = staticmethod(lambda b: pa.table({"__a0": pa.array([7])}))
    assert misbehaving.query(SCALAR, epsilon=0.5, options={"mechanism": BAD}).to_pylist() == [{"n": 7}]


def test_a_reuse_that_states_a_cost_is_refused_before_anything_runs(session, monkeypatch):
    """A description that answers from an earlier release (``reuse_of``) is recorded as a free reuse: one that also
    states a cost would be shown as charged (explain, Release.cost) while nothing is charged."""
    import dataclasses

    session.query(SQL, epsilon=0.5, options=FORCE)
    describe = RoundedLaplaceCount.describe
    monkeypatch.setattr(RoundedLaplaceCount, "describe", lambda self, cal: dataclasses.replace(describe(self, cal), reuse_of=1))
    monkeypatch.setattr(RoundedLaplaceCount, "bounded", lambda self, cal, salt, ops: None)
    for ask in (session.explain, session.query):
        with pytest.raises(ConfigError, match="answers from ledger entry 1 for free but states a cost"):
            ask(SQL, epsilon=0.5, options=FORCE)
    assert session.history().num_rows == 1 and session.remaining().epsilon == 9.5


def test_the_details_a_release_computes_reach_the_release(session, monkeypatch):
    """``Released.details`` (post-processing of released values) is carried by the Release's details, as its
    docstring says, for a query as for a workload."""
    release = RoundedLaplaceCount.release

    def with_details(self, cal, bounded, rng):
        out = release(self, cal, bounded, rng)
        out.details = {"released_is_even": out.table.column(0)[0].as_py() % 2 == 0}
        return out

    monkeypatch.setattr(RoundedLaplaceCount, "release", with_details)
    rel = session.query(SQL, epsilon=0.5, options=FORCE)
    assert rel.details == {"laplace_scale": 6.0, "sensitivity": 3, "released_is_even": rel.to_pylist()[0]["n"] % 2 == 0}


@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
def test_an_exit_or_interrupt_raised_by_a_release_keeps_no_data(misbehaving, exc):
    """``sys.exit(text)`` inside a release: Python prints a SystemExit's ``code`` when it is text, so the code of one
    raised after the charge holds no text (it exits as any failure after the charge)."""
    from dpsql.errors import CHARGED_EXIT_CODE

    def leave(bounded: pa.Table) -> pa.Table:
        raise exc(f"the row of user 4242: {bounded.to_pylist()}")

    Misbehaving.make = staticmethod(leave)
    with pytest.raises(exc) as caught:
        misbehaving.query(SCALAR, epsilon=0.5, options={"mechanism": BAD})
    assert "4242" not in repr(caught.value.args) + repr(getattr(caught.value, "code", ""))
    if exc is SystemExit:
        assert caught.value.code == CHARGED_EXIT_CODE
    assert misbehaving.history().to_pylist()[-1]["status"] == "failed"


def test_a_cost_above_the_epsilon_asked_is_refused_for_free(session, monkeypatch):
    """The analyst's epsilon is the most a query may be charged (delta may exceed it by a Gaussian sampler's stated
    floating-point part): a description charging more is refused before the charge, never recorded."""
    import dataclasses

    describe = RoundedLaplaceCount.describe
    monkeypatch.setattr(RoundedLaplaceCount, "describe", lambda self, cal: dataclasses.replace(
        describe(self, cal), cost=Budget(2 * cal["epsilon"], 0.0)))
    for ask in (session.explain, session.query):
        with pytest.raises(ConfigError, match=r"charges epsilon=1, above the epsilon=0.5 asked"):
            ask(SQL, epsilon=0.5, options=FORCE)
    assert session.history().num_rows == 0
    monkeypatch.setattr(RoundedLaplaceCount, "describe", lambda self, cal: dataclasses.replace(
        describe(self, cal), cost=Budget(cal["epsilon"] / 2, 0.0)))  # less than asked: what it states is charged
    rel = session.query(SQL, epsilon=0.5, options=FORCE)
    assert rel.cost == Budget(0.25, 0.0) and session.history().to_pylist()[-1]["epsilon"] == 0.25


def test_a_plugged_mechanism_missing_part_of_the_interface_is_named_before_the_charge(session):
    class Partial:
        name, options = "partial", frozenset()

        def calibrate(self, request: Request, contribution: Caps) -> None:
            return None

    class Misnamed(RoundedLaplaceCount):
        name = "something_else"

    class Undocumented(RoundedLaplaceCount):
        name, options = "partial", frozenset({"max_rows_per_unit", "flip"})

    for cls, match in ((Partial, r"lacks describe, bounded, released_types, key_domain, release"),
                       (Misnamed, "its name attribute is 'something_else'"),
                       (Undocumented, r"reads options no one documented: \['flip'\]")):
        registry.plug_in("partial", cls, lambda request: "any query")
        try:
            with pytest.raises(TypeError, match=match):
                session.query(SQL, epsilon=0.5, options={"mechanism": "partial"})
        finally:
            registry.unplug("partial")
    assert session.history().num_rows == 0
