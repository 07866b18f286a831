"""A table that references its own privacy unit (users.referrer_id -> users.id)
has two paths to a person (its own unit, and the referenced one), exactly like a messages table
with its own unit plus a reference to another person table, which is refused. unit_paths drops
the self-reference because its cycle guard starts with the table itself in ``seen``, so the
table is accepted and bounded on ``id`` only: adding person 1000 together with the rows that
reference them (1000 referrals) moves ``COUNT(*) WHERE referrer_id = 1000`` by 1000 under a
claimed sensitivity of 1. The self-reference is a cycle of references, so it is now refused at
registration (``dpsql.catalog.reference_cycle``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigError, PolicyError
from dpsql.testing import use_noise, zero_noise


def users(with_person: bool) -> pa.Table:
    ids = np.arange(1, 1001, dtype=np.int64)
    ref = (ids % 50 + 1).astype(np.int64)
    if with_person:  # person 1000 is referenced by 1000 other rows (the referral edges they receive)
        ids = np.concatenate([ids, np.arange(2001, 3001, dtype=np.int64)])
        ref = np.concatenate([ref, np.full(1000, 1000, dtype=np.int64)])
    return pa.table({"id": ids, "referrer_id": ref})


def test_control_own_unit_plus_reference_to_another_table_is_refused() -> None:
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    s.register("people", pa.table({"id": np.arange(1, 10, dtype=np.int64)}), privacy_unit="id")
    s.register("users", users(True), privacy_unit="id", references={"referrer_id": "people.id"})
    with pytest.raises(PolicyError, match="2 paths"):
        s.query("SELECT COUNT(*) FROM users WHERE referrer_id = 1000", epsilon=1.0)


def test_self_reference_to_own_unit_is_refused() -> None:
    # refused at registration: the reference is a cycle (each referrer's row reaches the next
    # referrer), so a row would belong to a chain of people of unbounded length
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    with pytest.raises(ConfigError, match="cycle back to 'users'"):
        s.register("users", users(True), privacy_unit="id", references={"referrer_id": "users.id"})
    assert "users" not in s.tables
