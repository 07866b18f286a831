"""A refusal naming a SUM's bounds spells them so that two different bounds never print as one (``%g`` wrote the
bounds 1000000000000001 and 1000000000000002 as "[1e+15, 1e+15]", a point, while it names them too large)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import dpsql
from dpsql.plan.analyze import exact_num


def test_close_bounds_print_apart_and_plain_bounds_stay_short() -> None:
    s = dpsql.Session(budget=dpsql.Budget(10, 1e-3))
    s.register("t", pa.table({"u": [1, 2], "x": [1.0, 2.0]}), privacy_unit="u")
    with pytest.raises(dpsql.errors.DPSQLError) as e:
        s.explain("SELECT SUM(LEAST(GREATEST(x, 1000000000000001), 1000000000000002)) FROM t", epsilon=1, delta=1e-6)
    assert "[1000000000000001.0, 1000000000000002.0]" in str(e.value)
    with pytest.raises(dpsql.errors.DPSQLError) as e:
        s.explain("SELECT SUM(LEAST(GREATEST(x, 2e15), 3e15)) FROM t", epsilon=1, delta=1e-6)
    assert "[2e+15, 3e+15]" in str(e.value)
    assert s.history().num_rows == 0
    assert (exact_num(0.0), exact_num(100.0), exact_num(0.1), exact_num(1 / 3)) == ("0", "100", "0.1", repr(1 / 3))
