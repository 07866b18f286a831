"""Select-join-aggregate queries on neighbouring datasets: corners the other join tests do not pin.

Each test runs the same query on D (without one person) and D' (with them, their rows hostile) and compares what
an analyst observes: whether explain and query succeed, the exception class and text, the released schema and
keys, the ledger entries, and the warnings emitted while the release is computed. What held:

* a chain looked up through keys (several people per tuple: items -> orders -> customer with orders not in the
  query) whose looked-up rows hold a NULL person, a key duplicated with a NULL owner, a dangling or NULL reference;
* GROUP BY over a join: the released keys come out in the key order whatever the order of the private rows;
* join options at their extremes (q = 2^-30, tau_base near 1 and 1024, huge max_tuples_per_user and degree caps,
  tiny and huge clip_norm) either refuse before the charge or answer: none fails after it;
* no warning (numpy's RuntimeWarning included) is emitted while a join release is computed from one person's
  extreme values (the command line silences RuntimeWarnings; a service wrapping Session does not).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise
from tests._neighbour import captured_warnings, frozen_heap

Register = Callable[[dpsql.Session], None]


@pytest.fixture(autouse=True, scope="module")
def _heap_frozen() -> Iterator[None]:
    """Each observation collects earlier garbage before recording warnings; with the heap frozen once here, that
    collection examines only this module's objects (tests/_neighbour.py frozen_heap)."""
    with frozen_heap():
        yield


def _observe(reg: Register, sql: str, *, epsilon: float = 5.0, delta: float = 1e-6,
             options: dict[str, Any] | None = None) -> dict[str, Any]:
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    reg(s)
    out: dict[str, Any] = {}
    with captured_warnings() as caught:
        for name, call in (("explain", s.explain), ("query", s.query)):
            try:
                r = call(sql, epsilon=epsilon, delta=delta, options=options)
                out[name] = "ok"
                if name == "query":
                    out["schema"] = str(r.table.schema)  # type: ignore[union-attr]
                    out["keys"] = [row.get("seg", row.get("pname")) for row in r.table.to_pylist()]  # type: ignore[union-attr]
            except Exception as e:  # noqa: BLE001 - the class and text are what is observed
                out[name] = f"{type(e).__name__}: {e}"
    out["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught
                              if "unusually large" not in str(w.message)})
    out["entries"] = [(e["status"]) for e in s.history().to_pylist()]
    s.close()
    return out


# -- a chain looked up through keys ----------------------------------------------------------------------

N = 40


def _lookup_tables(hostile: str | None) -> Register:
    def reg(s: dpsql.Session) -> None:
        oid, ocid = list(range(2 * N)), [i % N for i in range(2 * N)]
        iid, ioid, ipk = list(range(4 * N)), [i % (2 * N) for i in range(4 * N)], [i % 5 for i in range(4 * N)]
        if hostile == "null_person":  # looked-up orders whose person is NULL, with items of their own
            oid += [1000, 1001]
            ocid += [None, None]
            iid += [5000, 5001]
            ioid += [1000, 1001]
            ipk += [1, 2]
        elif hostile == "duplicated_key":  # a second row holding order 3, of person 7 and of nobody
            oid += [3, 3]
            ocid += [7, None]
        elif hostile == "dangling":
            iid += [5000]
            ioid += [99999]
            ipk += [1]
        elif hostile == "null_reference":
            iid += [5000]
            ioid += [None]
            ipk += [1]
        s.register("customer", pa.table({"id": pa.array(range(N), pa.int64()), "seg": [f"s{i % 3}" for i in range(N)]}),
                   privacy_unit="id", columns={"seg": {"domain": ["s0", "s1", "s2"]}})
        s.register("orders", pa.table({"oid": pa.array(oid, pa.int64()), "cid": pa.array(ocid, pa.int64())}),
                   references={"cid": "customer.id"}, degree_bounds={"cid": 2})
        s.register("parts", pa.table({"pk": np.arange(5), "pname": [f"p{i}" for i in range(5)]}), public=True)
        s.register("items", pa.table({"iid": pa.array(iid, pa.int64()), "oid": pa.array(ioid, pa.int64()),
                                      "pk": pa.array(ipk, pa.int64()), "v": np.ones(len(iid))}),
                   references={"oid": "orders.oid", "pk": "parts.pk"}, degree_bounds={"oid": 2, "pk": 100},
                   columns={"v": {"bounds": (0, 1)}})
    return reg


LOOKUP_QUERIES = [
    "SELECT COUNT(*) FROM items i JOIN parts p ON i.pk = p.pk",
    "SELECT p.pname, COUNT(*) FROM items i JOIN parts p ON i.pk = p.pk GROUP BY p.pname",
    "SELECT SUM(i.v) FROM items i JOIN orders o ON i.oid = o.oid",
    "SELECT c.seg, COUNT(*) FROM items i JOIN orders o ON i.oid = o.oid JOIN customer c ON c.id = o.cid GROUP BY c.seg",
]


#: what D (no hostile row) gives for (sql, options): the same for every hostile D' it is compared with, observed once
_LOOKUP_D: dict[tuple[str, str], dict[str, Any]] = {}


@pytest.mark.parametrize("hostile", ["null_person", "duplicated_key", "dangling", "null_reference"])
@pytest.mark.parametrize("sql", LOOKUP_QUERIES)
@pytest.mark.parametrize("options", [None, {"mechanism": "r2t"}])
def test_looked_up_chains_with_null_duplicated_or_dangling_keys_answer_alike(hostile: str, sql: str,
                                                                            options: dict[str, Any] | None) -> None:
    key = (sql, repr(options))
    if key not in _LOOKUP_D:
        _LOOKUP_D[key] = _observe(_lookup_tables(None), sql, options=options)
    a = _LOOKUP_D[key]
    b = _observe(_lookup_tables(hostile), sql, options=options)
    assert a == b
    assert a["query"] == "ok" and a["entries"] == ["released"] and not a["warnings"]


# -- the order of released keys ---------------------------------------------------------------------------


def _ordered_tables(order: list[int]) -> Register:
    n = 120

    def reg(s: dpsql.Session) -> None:
        s.register("customer", pa.table({"id": np.arange(n), "seg": [f"k{order[i % len(order)]}" for i in range(n)]}),
                   privacy_unit="id", columns={"seg": {"domain": [f"k{j}" for j in range(8)]}})
        s.register("orders", pa.table({"oid": np.arange(2 * n), "cid": np.arange(2 * n) % n}),
                   references={"cid": "customer.id"}, degree_bounds={"cid": 2})
    return reg


def test_grouped_join_keys_come_out_in_key_order_whatever_the_rows() -> None:
    sql = "SELECT c.seg, COUNT(*) AS n FROM customer c JOIN orders o ON c.id = o.cid GROUP BY c.seg"
    seen = set()
    for order in ([0, 1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1, 0], [5, 3, 6], [2, 7, 0, 4]):
        out = _observe(_ordered_tables(order), sql)
        assert out["query"] == "ok"
        seen.add(tuple(out["keys"]))
    assert seen == {tuple(f"k{j}" for j in range(8))}


# -- options at their extremes ----------------------------------------------------------------------------


def _option_tables(hostile: bool) -> Register:
    n = 60

    def reg(s: dpsql.Session) -> None:
        cid, amt = list(np.arange(2 * n) % n), [1.0] * (2 * n)
        if hostile:  # one person at the degree bound with extreme values
            amt[7], amt[7 + n] = 1e300, -1e300
        s.register("customer", pa.table({"id": np.arange(n), "seg": [f"s{i % 3}" for i in range(n)]}), privacy_unit="id",
                   columns={"seg": {"domain": ["s0", "s1", "s2"]}})
        s.register("orders", pa.table({"oid": np.arange(2 * n), "cid": cid, "amt": amt}),
                   references={"cid": "customer.id"}, degree_bounds={"cid": 2}, columns={"amt": {"bounds": (-1e15, 1e15)}})
    return reg


EXTREME_OPTIONS = [
    {"q": 2.0 ** -30}, {"q": 2.0 ** -30, "mechanism": "dp_s4s"}, {"tau_base": 1.0000001}, {"tau_base": 1024},
    {"max_tuples_per_user": 10 ** 30}, {"degree_caps": {"orders.cid": 10 ** 30}}, {"degree_caps": {"orders.cid": 0}},
    {"clip_norm": 1e-300}, {"clip_norm": 1e300}, {"mechanism": "r2t"}, {"mechanism": "dp_s4s", "q": 1},
]


@pytest.mark.parametrize("options", EXTREME_OPTIONS)
@pytest.mark.parametrize("sql", [
    "SELECT SUM(o.amt), AVG(o.amt) FROM customer c JOIN orders o ON c.id = o.cid",
    "SELECT c.seg, SUM(o.amt) AS s FROM customer c JOIN orders o ON c.id = o.cid GROUP BY c.seg",
])
def test_extreme_join_options_refuse_before_the_charge_or_answer(options: dict[str, Any], sql: str) -> None:
    a = _observe(_option_tables(False), sql, epsilon=1.0, options=options)
    b = _observe(_option_tables(True), sql, epsilon=1.0, options=options)
    assert a == b
    assert not a["warnings"]
    if a["explain"] == "ok":
        assert a["query"] == "ok" and a["entries"] == ["released"]
    else:
        assert a["query"] == a["explain"] and a["entries"] == []


# -- post-processing refused at its placeholder --------------------------------------------------------------


def _one_table(s: dpsql.Session) -> None:
    s.register("t", pa.table({"uid": np.arange(50), "x": np.ones(50)}), privacy_unit="uid", columns={"x": {"bounds": (0, 10)}})


@pytest.mark.parametrize("sql", [
    "SELECT make_date(2020, 1, CAST(COUNT(*) AS INTEGER)) AS d FROM t",
    "SELECT COUNT(*) AS n FROM t ORDER BY make_date(2020, 1, CAST(n AS INTEGER))",
])
def test_an_output_failing_only_at_a_zero_release_is_refused_as_such_for_free(sql: str) -> None:
    """The free check of post-processing runs the outputs on placeholder zeros (a noisy release can be 0). An
    output that binds but fails there (no 0th day of a month) was refused as a query that 'does not type-check
    against the table's columns', with a hint about WHERE and GROUP BY: the table's columns had nothing to do
    with it. The refusal now says which value it failed on and how to keep the expression valid there."""
    out = _observe(_one_table, sql, epsilon=1.0)
    assert out["explain"] == out["query"] and out["entries"] == []
    assert "against the table's columns" not in out["explain"]
    assert "released value of 0" in out["explain"] and "GREATEST" in out["explain"]


def test_control_a_type_error_in_the_outputs_is_still_a_type_error() -> None:
    out = _observe(_one_table, "SELECT COUNT(*) + DATE '2020-01-01' FROM t", epsilon=1.0)
    assert out["explain"].startswith("QueryTypeError") and "released value of 0" not in out["explain"]
    assert out["entries"] == []


def test_control_the_same_output_valid_at_zero_is_answered() -> None:
    out = _observe(_one_table, "SELECT make_date(2020, 1, GREATEST(CAST(COUNT(*) AS INTEGER), 1)) AS d FROM t", epsilon=1.0)
    assert out["query"] == "ok" and out["entries"] == ["released"]


# -- refusals of a join query's budget name the fix that exists -------------------------------------------


def _single_owner_join(s: dpsql.Session) -> None:
    n = 60
    s.register("customer", pa.table({"id": np.arange(n)}), privacy_unit="id")
    s.register("orders", pa.table({"oid": np.arange(2 * n), "cid": np.arange(2 * n) % n}),
               references={"cid": "customer.id"}, degree_bounds={"cid": 2})


@pytest.mark.parametrize("options", [None, {"q": 0.25}, {"q": 1}])
@pytest.mark.parametrize(("epsilon", "delta"), [(30.0, 1e-3), (20.0, 1e-6)])
def test_a_join_epsilon_too_large_for_the_floating_point_delta_is_refused_with_the_fix_that_exists(
        options: dict[str, Any] | None, epsilon: float, delta: float) -> None:
    """DP-S4S under delta > 0: the floating-point part of its Gaussian noise grows with e^epsilon, so a large epsilon
    leaves no delta for the RDP conversion. The refusal said that the default q = 1/16 was "too small" and to "use a
    larger epsilon" (the opposite of the fix: q = 1 fails alike), with a second hint inside the message asking for
    "delta > 4.77", which no delta can be. Now it names the floating-point part and a smaller epsilon (and a larger
    delta only when one below 1 would do), and charges nothing."""
    out = _observe(_single_owner_join, "SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid",
                   epsilon=epsilon, delta=delta, options=options)
    assert out["explain"] == out["query"] and out["entries"] == []
    text = out["query"]
    assert text.startswith("ConfigError: ") and "floating-point" in text
    assert "is too small for this query" not in text and "larger epsilon" not in text
    assert text.count("hint:") == 1
    hint = text.split("hint:")[1]
    below = __import__("re").search(r"epsilon below ([0-9.e+-]+)", hint)  # the largest epsilon the delta allows
    assert "a smaller epsilon" in hint or (below is not None and float(below.group(1)) < epsilon), hint
    needed = [float(m) for m in __import__("re").findall(r"use delta > ([0-9.e+-]+)", text)]
    assert all(d < 1 for d in needed)


def test_control_the_same_join_at_a_moderate_epsilon_is_answered() -> None:
    out = _observe(_single_owner_join, "SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid", epsilon=5.0)
    assert out["query"] == "ok" and out["entries"] == ["released"]


# -- the warnings recorded are the observation's own --------------------------------------------------------


class _Pipe:
    """Stands for an unclosed pipe: warns ResourceWarning when finalised while ``state["armed"]``."""

    def __init__(self, state: dict[str, bool]) -> None:
        self.state, self.me = state, self  # a reference cycle: only the collector finalises it

    def __del__(self) -> None:
        self.state["finalised"] = True
        if self.state["armed"]:
            warnings.warn("unclosed pipe", ResourceWarning, stacklevel=1)


_FROZEN_STATE = {"armed": True, "finalised": False}
_FROZEN_PIPE: list[_Pipe] = [_Pipe(_FROZEN_STATE)]  # alive when the module's heap is frozen (import precedes fixtures)


def test_garbage_left_before_an_observation_never_warns_inside_its_record() -> None:
    """The module freezes the heap once (the collection before each record then examines only newer objects).
    Garbage of an earlier test is either frozen (never collected while the module runs: no finaliser inside a
    record, even under a full collection there) or newer (collected before the record starts). The control: the same
    newer garbage does warn inside a record that does not collect first."""
    import gc
    import weakref

    try:
        _FROZEN_PIPE.clear()  # frozen, now garbage
        new_state = {"armed": True, "finalised": False}
        _Pipe(new_state)  # newer garbage
        with captured_warnings() as caught:
            assert new_state["finalised"]  # collected before the record
            assert gc.collect() >= 0 and not _FROZEN_STATE["finalised"]  # a full collection here leaves the frozen one
        assert not caught
        ctrl_state = {"armed": True, "finalised": False}
        ctrl = _Pipe(ctrl_state)
        ref = weakref.ref(ctrl)
        del ctrl
        with warnings.catch_warnings(record=True) as ctrl_caught:
            warnings.simplefilter("always")
            gc.collect()
        assert ref() is None and [str(w.message) for w in ctrl_caught] == ["unclosed pipe"]
    finally:
        _FROZEN_STATE["armed"] = False  # collected silently after the module unfreezes the heap
