"""A table that references its own privacy unit (users.referrer_id -> users.id)
has two paths to a person (its own unit, and the referenced one), exactly like a messages table
with its own unit plus a reference to another person table, which is refused. unit_paths drops
the self-reference because its cycle guard starts with the table itself in ``seen``, so the
table is accepted and bounded on ``id`` only: adding person 1000 together with the rows that
reference them (1000 referrals) moves ``COUNT(*) WHERE referrer_id = 1000`` by 1000 under a
claimed sensitivity of 1."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import PolicyError
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
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("users", users(True), privacy_unit="id", references={"referrer_id": "users.id"})
    with pytest.raises(PolicyError, match="2 paths"):
        r = s.query("SELECT COUNT(*) AS n FROM users WHERE referrer_id = 1000", epsilon=1.0)
        pytest.fail(f"accepted with sensitivity 1; released {r.table.column('n')[0].as_py()}")
