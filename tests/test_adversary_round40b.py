"""Select-join-aggregate queries and the command line: refusals that must be free, clear and total.

Join plans name each input's column ``<alias>__<column>`` in the flattened join relation and read the
alias back by splitting at the first ``__`` (``dpsql.plan.joins.flat``). An alias ending in ``_`` made
that split ambiguous: ``o_.cid`` became ``o___cid``, read back as the column ``_cid`` of an input ``o``.
A valid join written with such an alias was refused as a cross join, and with a GROUP BY or a SUM it
raised ``KeyError`` or ``StopIteration`` out of ``explain`` and ``query`` (the CLI: "unexpected
StopIteration", exit 1, the code of a failure after a charge, for a query that charged nothing). Such an
alias is now refused by name with the fix, before anything is charged.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    n = 60
    s.register("customer", pa.table({"id": np.arange(n), "seg": [f"s{i % 3}" for i in range(n)]}), privacy_unit="id",
               columns={"seg": {"domain": ["s0", "s1", "s2"]}})
    s.register("orders", pa.table({"oid": np.arange(2 * n), "cid": np.arange(2 * n) % n, "amt": np.ones(2 * n)}),
               references={"cid": "customer.id"}, degree_bounds={"cid": 2}, columns={"amt": {"bounds": (0, 1)}})
    return s


QUERIES = [
    "SELECT COUNT(*) FROM customer {c} JOIN orders {o} ON {c}.id = {o}.cid",
    "SELECT {c}.seg, COUNT(*) AS n FROM customer {c} JOIN orders {o} ON {c}.id = {o}.cid GROUP BY {c}.seg",
    "SELECT SUM({o}.amt) FROM customer {c} JOIN orders {o} ON {c}.id = {o}.cid",
    "SELECT COUNT(*) FROM orders {o} JOIN customer {c} ON {c}.id = {o}.cid WHERE {o}.amt > 0",
]


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize(("c", "o"), [("c_", "o"), ("c", "o_"), ("c__", "o")])
def test_an_alias_ending_in_underscore_is_refused_by_name_for_free(sql: str, c: str, o: str) -> None:
    s = _session()
    q = sql.format(c=c, o=o)
    bad = c if c.endswith("_") else o
    for call in (s.explain, s.query):
        with pytest.raises(UnsupportedQueryError, match=rf"alias '{bad}'") as e:
            call(q, epsilon=1.0, delta=1e-6)
        assert "cross join" not in str(e.value)
    assert s.history().num_rows == 0 and s.remaining() == Budget(100.0, 0.5)
    s.close()


@pytest.mark.parametrize("sql", QUERIES)
def test_the_same_joins_with_plain_aliases_are_answered(sql: str) -> None:
    """Negative control: the aliases without the trailing underscore."""
    s = _session()
    s.query(sql.format(c="c_x", o="o1"), epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 1
    s.close()


def test_the_command_line_refuses_such_an_alias_as_a_query_error(tmp_path: Path) -> None:
    pq.write_table(pa.table({"uid": np.arange(40)}), tmp_path / "ev.parquet")
    pq.write_table(pa.table({"oid": np.arange(80), "ouid": np.arange(80) % 40, "y": np.ones(80)}), tmp_path / "ord.parquet")
    base = [sys.executable, "-m", "dpsql.cli", "--ledger", str(tmp_path / "l.duckdb")]
    subprocess.run([*base, "init", "--epsilon", "10"], check=True, capture_output=True)
    tables = ["--table", f"ev={tmp_path / 'ev.parquet'}", "--privacy-unit", "ev=uid", "--table", f"ord={tmp_path / 'ord.parquet'}",
              "--reference", "ord.ouid=ev.uid", "--degree-bound", "ord.ouid=4", "--bounds", "ord.y=0:1"]
    for sub in ("explain", "query"):
        r = subprocess.run([*base, *tables, sub, "SELECT SUM(o_.y) FROM ev e JOIN ord o_ ON e.uid = o_.ouid",
                            "--epsilon", "1", "--delta", "1e-6"], capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        assert "alias 'o_'" in r.stderr and "StopIteration" not in r.stderr
    r = subprocess.run([*base, "budget"], capture_output=True, text=True, check=True)
    assert "epsilon=10 " in r.stdout.replace("\n", " ") + " "
