"""``nest.x`` over a STRUCT column ``nest`` (DuckDB's field access) is refused saying so, not as an unknown table
or alias ``nest`` (which sent the analyst looking for a table): structs allow only IS [NOT] NULL."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import dpsql
from dpsql import errors


@pytest.fixture
def s() -> Any:
    sess = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
    t = pa.table({"uid": [1, 2, 3], "nest": [{"x": 1}, {"x": 2}, None]})
    sess.register("t", t, privacy_unit="uid")
    sess.register("p", t, public=True)
    yield sess
    sess.close()


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM t WHERE nest.x > 1", "SELECT COUNT(*) FROM t WHERE t.nest.x > 1",
                                 "SELECT COUNT(*) FROM t AS a WHERE a.nest.x > 1",
                                 "SELECT COUNT(*) FROM t AS a JOIN p AS b ON a.uid = b.uid WHERE a.nest.x > 1"])
def test_a_struct_field_is_refused_as_one(s: Any, sql: str) -> None:
    with pytest.raises(errors.UnsupportedQueryError) as e:
        s.explain(sql, epsilon=1.0)
    assert "field 'x' of the STRUCT(x BIGINT) column 'nest'" in str(e.value) and "unknown table" not in str(e.value), str(e.value)


def test_an_unknown_qualifier_is_still_one(s: Any) -> None:
    with pytest.raises(errors.UnsupportedQueryError, match="unknown table or alias 'q'"):
        s.explain("SELECT COUNT(*) FROM t WHERE q.x > 1", epsilon=1.0)
    assert s.explain("SELECT COUNT(*) FROM t WHERE nest IS NOT NULL", epsilon=1.0) is not None
