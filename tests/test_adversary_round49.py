"""Bad input that must be refused clearly, for free, naming the fix; and what held.

Finding (fixed): ``suggest_caps(group_by=...)`` accepted a column name in any case (``'Grp'``, ``'GRP'`` for a
column registered as ``Grp``; ``'UID'``) when checking it, then looked the name up as given in the lower-case
schema while building the bounded query: a raw ``KeyError`` (the CLI's ``suggest-caps --group-by Grp``: ``error:
unexpected KeyError``, exit 1), even for a column's own spelling. The name is now read as the schema's column.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


def _caps_session() -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10, 1e-5))
    use_noise(s, zero_noise())
    s.register("t", pa.table({"uid": list(range(100)), "Grp": ["a", "b"] * 50}), privacy_unit="uid")
    return s


@pytest.mark.parametrize("name", ["Grp", "GRP", "grp"])
def test_caps_advice_takes_a_column_name_in_any_case(name: str) -> None:
    with _caps_session() as s:
        r = s.suggest_caps("t", epsilon=1.0, group_by=name)
        assert r.details["suggested"]["max_groups_per_unit"] == 1  # each person holds one key
        params = json.loads(s.history().to_pylist()[-1]["params"])
        assert params["group_by"] == "grp"


def test_control_caps_advice_by_an_unknown_column_is_refused_free() -> None:
    with _caps_session() as s, pytest.raises(dpsql.errors.ConfigError, match="is not a column"):
        s.suggest_caps("t", epsilon=1.0, group_by="nosuch")
    with _caps_session() as s:
        assert s.remaining() == s.total()
