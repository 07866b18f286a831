"""The Python API as notebooks and ETL scripts use it: the types of a Release's fields, malformed
registration arguments, and a directory given as a source."""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigError


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100, 1e-3))
    t = pa.table({"uid": np.arange(200) % 50, "amount": np.linspace(0, 100, 200), "k": ["a", "b"] * 100})
    s.register("t", t, privacy_unit="uid", max_groups_per_unit=2,
               columns={"amount": {"bounds": (0, 100)}, "k": {"domain": ["a", "b"]}})
    return s


@pytest.mark.parametrize("sql,delta", [
    ("SELECT k, COUNT(*) AS n FROM t GROUP BY k", 1e-6),   # gaussian
    ("SELECT COUNT(*) AS n FROM t", 0.0),                  # laplace
    ("SELECT MEDIAN(amount) AS m FROM t", 0.0),            # exponential
])
def test_release_mechanism_is_a_plain_str(sql: str, delta: float) -> None:
    with _session() as s:
        r = s.query(sql, epsilon=1, delta=delta)
        plan = s.explain(sql, epsilon=1, delta=delta)
    assert type(r.mechanism) is str and type(plan.mechanism) is str
    assert f"mechanism={r.mechanism!r}" in repr(r)
    assert json.loads(json.dumps(r.meta()))["mechanism"] == r.mechanism
    assert pickle.loads(pickle.dumps(r)).table.equals(r.table)


@pytest.mark.parametrize("bounds", [(0, 1, 2), [0, 50, 100], ("0", "1", "2")])
def test_bounds_of_more_than_two_values_are_refused(bounds: object) -> None:
    with _session() as s:
        with pytest.raises(ConfigError, match="must be a pair"):
            s.register("b", pa.table({"uid": [1], "amount": [1.0]}), privacy_unit="uid",
                       columns={"amount": {"bounds": bounds}})


def test_a_directory_source_says_to_pass_a_glob(tmp_path: object) -> None:
    with _session() as s:
        with pytest.raises(ConfigError, match="is a directory") as ei:
            s.register("d", str(tmp_path), privacy_unit="uid")
    assert "*.parquet" in (ei.value.hint or "")


def test_a_parquet_named_directory_hint_names_the_python_call(tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    (tmp_path / "out.parquet").mkdir()
    pq.write_table(pa.table({"uid": [1]}), tmp_path / "out.parquet" / "part-0.parquet")
    with _session() as s:
        with pytest.raises(ConfigError, match="is a directory") as ei:
            s.register("d", str(tmp_path / "out.parquet"), privacy_unit="uid")
    assert "register('d', " in (ei.value.hint or "")


USER_SCRIPT = '''
from __future__ import annotations
from typing import Any
import dpsql

def etl(s: dpsql.Session) -> list[int]:
    cols = {"amount": {"bounds": (0, 200)}}
    s.register("events", "events.parquet", privacy_unit="uid", columns=cols,
               references={"shop_id": "shops.id"}, degree_bounds={"shop_id": 64})
    many = s.query_many(("SELECT COUNT(*) FROM events WHERE amount < 10",
                         "SELECT COUNT(*) FROM events WHERE amount < 20"), epsilon=1)
    plan: dpsql.Plan = s.explain(("SELECT COUNT(*) FROM events WHERE amount < 10",), epsilon=1)
    r: dpsql.Release = s.query("SELECT COUNT(*) AS n FROM events", epsilon=plan.cost.epsilon)
    meta: dict[str, Any] = r.meta(s.remaining())
    mechanisms: list[str] = [one.mechanism for one in many] + [r.mechanism, str(meta["mechanism"])]
    return [len(m) for m in mechanisms]
'''


def test_documented_api_type_checks_under_mypy_strict(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    pytest.importorskip("mypy")
    script = tmp_path / "etl.py"
    script.write_text(USER_SCRIPT)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--ignore-missing-imports",
         "--cache-dir", str(tmp_path / "cache"), script.name],
        capture_output=True, text=True, env={**os.environ, "MYPYPATH": repo}, cwd=tmp_path, timeout=300,
    )
    errors = [ln for ln in out.stdout.splitlines() if ln.startswith(script.name) and ": error:" in ln]
    assert not errors, out.stdout
