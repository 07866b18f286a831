"""Adversarial checks of how a privacy unit's values are told apart, and of what refusals show.

A join with several people per tuple spells each person as text (``<person table>:<value>``) for the
truncation; values equal in SQL (one person: the engine groups them together) must have one
spelling, else one person is several users, each kept up to tau. Top-level floats and intervals
were handled; a nested unit (a STRUCT holding a DOUBLE) was not: {'x': -0.0} and {'x': 0.0} are
one person to the engine but were two users. With one person holding 4 messages as {'x': -0.0} and
4 as {'x': 0.0} (each to a fresh receiver), the truncation at tau = 4 moved by 8 = 2 tau when that
person was removed (claimed: tau).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget

STRUCT_F = pa.struct([("x", pa.float64())])
STRUCT_S = pa.struct([("s", STRUCT_F)])


def _msg_session(typ: pa.DataType, mk: Any) -> dpsql.Session:
    """people (unit ``pid`` of type ``typ``) and msg (sender, receiver -> people.pid); person 0 sends
    4 messages as mk(-0.0) and 4 as mk(0.0)."""
    pids = [mk(float(i + 1)) for i in range(10)] + [mk(100.0 + j) for j in range(8)] + [mk(0.0)]
    snd = [mk(float(i + 1)) for i in range(10)]
    rcv = [mk(float((i + 1) % 10 + 1)) for i in range(10)]
    for j, v in enumerate([-0.0] * 4 + [0.0] * 4):
        snd.append(mk(v))
        rcv.append(mk(100.0 + j))
    s = dpsql.Session(budget=Budget(100.0, 1e-3))
    s.register("people", pa.table({"pid": pa.array(pids, typ)}), privacy_unit="pid")
    s.register("msg", pa.table({"sender": pa.array(snd, typ), "receiver": pa.array(rcv, typ)}),
               references={"sender": "people.pid", "receiver": "people.pid"}, degree_bounds={"sender": 8, "receiver": 8})
    return s


@pytest.mark.parametrize("typ,mk", [(STRUCT_F, lambda v: {"x": v}), (STRUCT_S, lambda v: {"s": {"x": v}})],
                         ids=["struct_double", "struct_struct_double"])
def test_a_nested_unit_is_refused_in_joins_for_free(typ: pa.DataType, mk: Any) -> None:
    s = _msg_session(typ, mk)
    try:
        for call in (s.explain, s.query):
            with pytest.raises(dpsql.errors.PolicyError, match="nested type"):
                call("SELECT COUNT(*) AS n FROM msg", epsilon=1.0, delta=1e-6)
        assert s.history().num_rows == 0
        assert s.remaining() == Budget(100.0, 1e-3)
        # a single table with one path to a person is bounded by SQL grouping (one person): still answered
        assert s.query("SELECT COUNT(*) AS n FROM people", epsilon=1.0, delta=1e-6).table.num_rows == 1
    finally:
        s.close()


def test_control_a_flat_unit_of_the_same_data_is_answered() -> None:
    """The same people as DECIMAL(10, 2) ids (one spelling per value; a type whose name has parentheses):
    answered, so the refusal is about the nested type, not the plan."""
    s = _msg_session(pa.decimal128(10, 2), lambda v: Decimal(str(v)))
    try:
        assert s.query("SELECT COUNT(*) AS n FROM msg", epsilon=1.0, delta=1e-6).table.num_rows == 1
    finally:
        s.close()

