"""An output alias that is also a table column's name: in a window, in an ORDER BY expression and in QUALIFY
the column wins (as in DuckDB), so reading a raw column there is refused for free; a bare ORDER BY name and
HAVING read the alias, as DuckDB does."""

from __future__ import annotations

from typing import Any

import pytest

from dpsql import errors
from tests.test_select_aliases import s  # noqa: F401  (fixture: table t with columns uid, g, amt, n)

BASE = "SELECT g, COUNT(*) AS n FROM t GROUP BY g "


@pytest.mark.parametrize("tail", [
    ", RANK() OVER (ORDER BY n) AS r FROM t GROUP BY g",
    " FROM t GROUP BY g ORDER BY RANK() OVER (ORDER BY n)",
    " FROM t GROUP BY g QUALIFY RANK() OVER (ORDER BY n) < 3",
    " FROM t GROUP BY g ORDER BY n + 1",
    " FROM t GROUP BY g QUALIFY n > 3 AND RANK() OVER (ORDER BY g) < 3",
])
def test_a_column_named_like_an_alias_is_the_column_everywhere_duckdb_says_so(s: Any, tail: str) -> None:  # noqa: F811 (the fixture imported above)
    before = s.remaining()
    with pytest.raises(errors.UnsupportedQueryError, match=r"column .n.*rename the alias"):
        s.query("SELECT g, COUNT(*) AS n" + tail, epsilon=1.0, delta=1e-5)
    assert s.remaining() == before


@pytest.mark.parametrize("tail", ["ORDER BY n", "HAVING n > 10"])
def test_a_bare_order_by_name_and_having_read_the_alias(s: Any, tail: str) -> None:  # noqa: F811 (the fixture imported above)
    assert len(s.query(BASE + tail, epsilon=1.0, delta=1e-5).to_pylist()) == 3
