"""Every path from a row to a person is bounded, or the table is refused (design invariant 9).

A messages table whose rows reference two people (sender and receiver) was once bounded on the
first reference only: adding one receiver with 1000 messages moved a count by 1000 under a
claimed sensitivity of 1. Such tables are now refused before any charge, for free.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import dpsql
from dpsql.catalog import TableSpec, unit_paths
from dpsql.errors import PolicyError
from dpsql.plan.analyze import analyze, resolve_unit_column
from dpsql.testing import use_noise, zero_noise


def _messages(extra_receiver: bool) -> pa.Table:
    sender = np.arange(1, 501, dtype=np.int64)
    receiver = (sender % 50 + 1).astype(np.int64)
    if extra_receiver:  # person 1000 receives 1000 messages
        sender = np.concatenate([sender, np.arange(1, 1001, dtype=np.int64) % 500 + 1])
        receiver = np.concatenate([receiver, np.full(1000, 1000, dtype=np.int64)])
    return pa.table({"sender_id": sender, "receiver_id": receiver})


def _users() -> pa.Table:
    return pa.table({"id": np.arange(1, 1001, dtype=np.int64)})


def _session(messages: pa.Table, **refs: str) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("users", _users(), privacy_unit="id")
    s.register("messages", messages, **refs)  # type: ignore[arg-type]
    return s


@pytest.mark.parametrize("with_person", [False, True])
def test_two_references_to_people_are_refused_for_free(with_person: bool) -> None:
    """The attack of the audit: the refusal is identical with and without the receiver, and free."""
    s = _session(_messages(with_person), references={"sender_id": "users.id", "receiver_id": "users.id"})
    before = s.remaining()
    with pytest.raises(PolicyError, match="2 paths") as ei:
        s.query("SELECT COUNT(*) FROM messages WHERE receiver_id = 1000", epsilon=1.0)
    assert "sender_id" in str(ei.value) and "receiver_id" in str(ei.value)
    with pytest.raises(PolicyError, match="2 paths"):
        s.explain("SELECT COUNT(*) FROM messages", epsilon=1.0)
    assert s.remaining() == before
    assert s.history().num_rows == 0
    s.close()


def test_own_unit_plus_reference_to_another_person_is_refused() -> None:
    s = _session(_messages(True), privacy_unit="sender_id", references={"receiver_id": "users.id"})
    with pytest.raises(PolicyError, match="2 paths"):
        s.query("SELECT COUNT(*) FROM messages", epsilon=1.0)
    s.close()


def test_unit_declared_twice_is_one_path_and_bounded() -> None:
    """privacy_unit='sender_id' and sender_id -> users.id are the same path: the query runs, and
    removing one sender changes the zero-noise count by at most its sensitivity (1)."""
    counts = []
    for msgs in (_messages(False), _messages(False).filter(pc.not_equal(_messages(False)["sender_id"], 7))):
        s = _session(msgs, privacy_unit="sender_id", references={"sender_id": "users.id"})
        r = s.query("SELECT COUNT(*) AS n FROM messages", epsilon=1.0)
        counts.append(r.table.column("n")[0].as_py())
        s.close()
    assert counts[0] == 500 and abs(counts[0] - counts[1]) <= 1


def test_single_foreign_key_path_still_works() -> None:
    s = _session(_messages(True), references={"receiver_id": "users.id"})
    r = s.query("SELECT COUNT(*) AS n FROM messages", epsilon=1.0)
    assert r.table.column("n")[0].as_py() == 51  # 50 receivers + person 1000, one row each (k = 1, C_u = 1)
    s.close()


def _spec(name: str, unit: str | None = None, refs: dict[str, str] | None = None) -> TableSpec:
    return TableSpec(name, f"/{name}.parquet", "parquet", privacy_unit=unit, references=refs or {})


def test_multi_hop_path_is_refused() -> None:
    """orders -> products -> sellers (a person): not bounded by per-unit caps on orders."""
    cat = {
        "sellers": _spec("sellers", "id"),
        "products": _spec("products", None, {"seller_id": "sellers.id"}),
        "orders": _spec("orders", "customer_id", {"product_id": "products.id"}),
    }
    cat["orders"] = dataclasses.replace(cat["orders"], schema={"customer_id": "BIGINT", "product_id": "BIGINT"})
    paths = unit_paths(cat["orders"], cat)
    assert [(p.column, p.direct) for p in paths] == [("customer_id", True), ("product_id", False)]
    assert resolve_unit_column(cat["orders"], cat) is None
    with pytest.raises(PolicyError, match="2 paths"):
        analyze("SELECT COUNT(*) FROM orders", cat)


def test_references_to_non_person_tables_are_not_paths() -> None:
    cat = {
        "countries": _spec("countries"),
        "events": _spec("events", "user_id", {"country": "countries.code"}),
    }
    assert resolve_unit_column(cat["events"], cat) == "user_id"


def test_reference_to_an_unregistered_table_is_refused() -> None:
    """A typo in a reference target ('user.id' for 'users.id') must not silently drop a path."""
    cat = {
        "users": _spec("users", "id"),
        "messages": _spec("messages", "sender_id", {"receiver_id": "user.id"}),
    }
    cat["messages"] = dataclasses.replace(cat["messages"], schema={"sender_id": "BIGINT", "receiver_id": "BIGINT"})
    assert resolve_unit_column(cat["messages"], cat) is None
    with pytest.raises(PolicyError, match="not registered.*'receiver_id' -> user.id"):
        analyze("SELECT COUNT(*) FROM messages", cat)
