"""Regression (review finding): post-processing that fails on the *public* key values is refused for free.

With a declared domain, the released keys are exactly the domain (public metadata), so a HAVING,
ORDER BY or output expression that cannot be evaluated on them fails whatever the data and the
noise are: it is refused for free (standards: "bad input ... spends no budget"). The bind check
once ran the post-processing over a placeholder row whose keys are NULL only, so it passed, and
the failure came after the charge; it now also runs it over the domain's keys."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql import Budget
from dpsql.errors import ExecutionError


def session() -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10.0, 1e-3))
    s.register("t", pa.table({"uid": pa.array(range(20), pa.int64()), "c": pa.array(["a", "b"] * 10)}),
               privacy_unit="uid", columns={"c": {"domain": ["a", "b"]}})
    return s


@pytest.mark.parametrize("sql", [
    "SELECT c, COUNT(*) AS n FROM t GROUP BY c HAVING CAST(c AS INTEGER) > 0",
    "SELECT c, COUNT(*) AS n FROM t GROUP BY c ORDER BY CAST(c AS INTEGER)",
    "SELECT CAST(c AS INTEGER) AS k, COUNT(*) AS n FROM t GROUP BY c",
])
def test_post_processing_failure_on_public_keys_is_free(sql: str) -> None:
    s = session()
    before = s.remaining()
    with pytest.raises(dpsql.errors.DPSQLError) as ei:
        s.query(sql, epsilon=1.0)
    assert not (isinstance(ei.value, ExecutionError) and "charge stands" in str(ei.value)), str(ei.value)
    assert s.remaining() == before
