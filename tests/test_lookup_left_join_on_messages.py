"""A LEFT JOIN's ON without an equality of two columns (an expression of a column, an OR) is refused for free,
naming what the ON needs; it was reported as a cross join ("not connected by ON equalities")."""

from __future__ import annotations

import pytest
from test_lookup_left_join import _session

from dpsql.budget import Budget
from dpsql.errors import DPSQLError


@pytest.mark.parametrize("on", ["upper(e.cc) = c.code", "e.cc = c.code OR e.cc IS NULL", "c.code = e.cc || ''"])
def test_a_left_join_on_without_a_column_equality_names_the_fix(on: str) -> None:
    with _session() as s:
        with pytest.raises(DPSQLError, match="LEFT JOIN's ON needs an equality of a column of 'c'") as e:
            s.query(f"SELECT COUNT(*) FROM events e LEFT JOIN countries c ON {on}", epsilon=1.0)
        assert "cross join" not in str(e.value)
        assert s.remaining() == Budget(100.0, 1e-2)
        # negative control: the column equality, with the same condition beside it by AND, is answered
        assert s.query("SELECT COUNT(*) AS n FROM events e LEFT JOIN countries c ON e.cc = c.code AND upper(e.cc) = "
                       "c.code", epsilon=1.0).to_pylist()[0]["n"] > 0
