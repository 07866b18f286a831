"""Catalog objects are immutable outside registration: nothing reachable from Session.tables
can be changed, and the caps that calibration uses stay the registered ones."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pytest
from conftest import make_events

import dpsql
from dpsql.budget import Budget
from dpsql.catalog import ColumnSpec, OrderedDomain, ReadOnlyDict, TableSpec, register_table
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

REFUSED = (TypeError, AttributeError, dataclasses.FrozenInstanceError)
COLUMNS = {"amount": {"bounds": (0, 100)}, "country": {"domain": ["US", "FR", "DE", "XX"]},
           "age": {"bounds": (0, 120), "bins": 121}}


@pytest.fixture
def session() -> Any:
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    ev = make_events(300, seed=3)
    ev = ev.set_column(ev.schema.get_field_index("age"), "age", pa.array([i % 90 for i in range(ev.num_rows)])) \
        if "age" in ev.column_names else ev.append_column("age", pa.array([i % 90 for i in range(ev.num_rows)]))
    s.register("events", ev, privacy_unit="user_id", max_groups_per_unit=2, max_rows_per_group=3, columns=COLUMNS)
    yield s
    s.close()


def _mutations(obj: Any) -> list[tuple[str, Any]]:
    """Every way to change ``obj`` in place (each a zero-argument callable)."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, Mapping):
        k = next(iter(obj), "x")
        v = obj.get(k)
        out += [
            ("setitem", lambda: obj.__setitem__(k, v)), ("setnew", lambda: obj.__setitem__("__new", v)),
            ("delitem", lambda: obj.__delitem__(k)), ("clear", lambda: obj.clear()),  # type: ignore[attr-defined]
            ("pop", lambda: obj.pop(k)), ("popitem", lambda: obj.popitem()),  # type: ignore[attr-defined]
            ("setdefault", lambda: obj.setdefault("__new", v)),  # type: ignore[attr-defined]
            ("update", lambda: obj.update({"__new": v})),  # type: ignore[attr-defined]
        ]
        if isinstance(obj, dict):
            out += [("init again", lambda: obj.__init__({"__new": v})),  # type: ignore[misc]
                    ("set attribute", lambda: setattr(obj, "_sealed", False))]
            def ior() -> None:
                o = obj
                o |= {"__new": v}
            out.append(("ior", ior))
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            out.append((f"set {f.name}", lambda f=f: setattr(obj, f.name, getattr(obj, f.name))))
            out.append((f"del {f.name}", lambda f=f: delattr(obj, f.name)))
        out.append(("new attribute", lambda: setattr(obj, "extra", 1)))
    return out


def _reachable(root: Any) -> list[tuple[str, Any]]:
    seen: set[int] = set()
    out: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any]] = [("tables", root)]
    while stack:
        path, o = stack.pop()
        if id(o) in seen or isinstance(o, (str, int, float, bool, type(None))):
            continue
        seen.add(id(o))
        out.append((path, o))
        if isinstance(o, Mapping):
            stack += [(f"{path}[{k!r}]", v) for k, v in o.items()]
        elif dataclasses.is_dataclass(o):
            stack += [(f"{path}.{f.name}", getattr(o, f.name)) for f in dataclasses.fields(o)]
        elif isinstance(o, (tuple, frozenset)):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(o)]
        else:
            raise AssertionError(f"{path} is a {type(o).__name__}: not known to be immutable")
    return out


def test_nothing_reachable_from_tables_can_change(session: Any) -> None:
    before = session.explain("SELECT country, COUNT(*) FROM events GROUP BY country", epsilon=1.0).parameters
    objs = _reachable(session.tables)
    kinds = {type(o) for _, o in objs}
    assert {TableSpec, ColumnSpec, OrderedDomain, ReadOnlyDict} <= kinds  # the walk reached every kind
    tried = 0
    for path, o in objs:
        for what, fn in _mutations(o):
            tried += 1
            with pytest.raises(REFUSED):
                fn()
                pytest.fail(f"{what} on {path} succeeded")
    assert tried > 50
    t = session.tables["events"]
    assert (t.max_groups_per_unit, t.max_rows_per_group, t.rows_per_unit_cap) == (2, 3, 6)
    assert set(t.columns) == {"amount", "country", "age"} and t.columns["country"].domain == ("US", "FR", "DE", "XX")
    assert session.explain("SELECT country, COUNT(*) FROM events GROUP BY country", epsilon=1.0).parameters == before
    session.query("SELECT country, COUNT(*) AS n FROM events GROUP BY country", epsilon=1.0)
    params = json.loads(session.history().to_pylist()[-1]["params"])
    assert (params["max_groups_per_unit"], params["max_rows_per_group"]) == (2, 3)
    # Laplace scale C_u * k / epsilon = 2 * 3 / 1 = 6 (snapping widens it by under 0.1 %)
    assert 6.0 <= params["scales"]["__a0"] < 6.006


def test_negative_control_a_plain_dict_would_be_caught() -> None:
    """The walk above fails on a mutable mapping (the test can fail)."""
    with pytest.raises(pytest.fail.Exception):
        for _, fn in _mutations({"a": 1}):
            with pytest.raises(REFUSED):
                fn()
                pytest.fail("mutated")
    with pytest.raises(AssertionError, match="not known to be immutable"):
        _reachable({"a": [1, 2]})


def test_tables_view_is_read_only_and_follows_registration(session: Any) -> None:
    view = session.tables
    with pytest.raises(TypeError):
        view["events"] = view["events"]  # type: ignore[index]
    with pytest.raises(TypeError):
        del view["events"]  # type: ignore[attr-defined]
    session.register("events", make_events(50, seed=1), privacy_unit="user_id", max_groups_per_unit=4)
    assert view["events"].max_groups_per_unit == 4  # policy changes only through register


def test_specs_built_by_hand_are_frozen_too() -> None:
    t = TableSpec("t", "x.parquet", "parquet", privacy_unit="u", columns={"a": ColumnSpec("a", bounds=[0, 1], domain=[1, 2])},
                  schema={"u": "BIGINT", "a": "BIGINT"}, files=["x.parquet"])
    assert isinstance(t.columns, ReadOnlyDict) and isinstance(t.schema, ReadOnlyDict) and t.files == ("x.parquet",)
    assert t.columns["a"].bounds == (0, 1) and t.columns["a"].domain == (1, 2)
    with pytest.raises(TypeError):
        t.schema["u"] = "VARCHAR"
    # copies and pickles keep working (and stay frozen)
    for c in (copy.copy(t), copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        assert c == t
        with pytest.raises(TypeError):
            c.columns.clear()
    assert dataclasses.replace(t, tau=5).tau == 5 and t.tau == 1


def test_register_table_is_usable_without_a_session() -> None:
    """Registration lives in the catalog module: it needs only the engine's two source steps."""
    calls: list[tuple[str, ...]] = []

    def reg(name: str, kind: str, src: Any, view: str, *, types: dict[str, str]) -> dict[str, str]:
        calls.append(("register", name, view))
        return {"uid": "BIGINT", "amount": "DOUBLE"}

    def unreg(name: str, kind: str, view: str | None) -> None:
        calls.append(("unregister", name, str(view)))

    cat: dict[str, TableSpec] = {}
    tbl = pa.table({"uid": [1], "amount": [2.0]})
    spec = register_table(cat, "T", tbl, register_source=reg, unregister_source=unreg, view_suffix="abc",
                          privacy_unit="uid", columns={"amount": {"bounds": (0, 10)}}, read_settings={"k": 1})
    assert cat == {"t": spec} and spec.view == "_dpsql_src_t_abc" and spec.source == "<arrow table>"
    assert spec.read_key == '{"k": 1, "schema": {"amount": "DOUBLE", "uid": "BIGINT"}}'
    with pytest.raises(ConfigError, match="declared column 'nope' does not exist"):
        register_table(cat, "t", tbl, register_source=reg, unregister_source=unreg, view_suffix="abc",
                       privacy_unit="uid", columns={"nope": {"bounds": (0, 1)}})
    # the refused registration made its view under the other name and dropped it; the old one stands
    assert calls[-2:] == [("register", "t", "_dpsql_src_t_abc_2"), ("unregister", "t", "_dpsql_src_t_abc_2")]
    assert cat == {"t": spec}
    with pytest.raises(ConfigError, match="max_groups_per_unit"):
        register_table(cat, "u", tbl, register_source=reg, unregister_source=unreg, view_suffix="abc",
                       privacy_unit="uid", max_groups_per_unit=0)
