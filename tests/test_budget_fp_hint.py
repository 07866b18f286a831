"""A Gaussian release charges the delta asked for plus its sampler's floating-point delta
(``fp_delta``, docs/mechanisms.md §5.4). Asking for exactly the remaining delta therefore does not
fit; the refusal says why and names a delta that does (and, at the command line, the flag)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

import dpsql
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError
from dpsql.testing import use_noise, zero_noise

TABLE = pa.table({"uid": np.arange(400), "country": np.array(["a", "b"] * 200), "amount": np.ones(400)})


def _session(path: Path, total: Budget) -> dpsql.Session:
    s = dpsql.Session(ledger=path, budget=total, create=True)
    use_noise(s, zero_noise())
    s.register("ev", TABLE, privacy_unit="uid", max_groups_per_unit=1, columns={"amount": {"bounds": (0, 10)}})
    return s


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) AS n FROM ev", "SELECT SUM(amount) AS s FROM ev",
                                 "SELECT country, COUNT(*) AS n FROM ev GROUP BY country"])
def test_exactly_the_remaining_delta_is_refused_with_a_delta_that_fits(tmp_path: Path, sql: str) -> None:
    with _session(tmp_path / "l.duckdb", Budget(1.0, 1e-6)) as s:
        with pytest.raises(BudgetExceededError) as ei:
            s.query(sql, epsilon=1.0, delta=1e-6)
        assert s.remaining() == Budget(1.0, 1e-6) and s.history().num_rows == 0  # nothing charged
        hint = ei.value.hint or ""
        assert "floating-point delta" in hint and "fp_delta" in hint
        m = re.search(r"ask for delta=([0-9.e+-]+) or less", hint)
        assert m, hint
        fits = float(m.group(1))
        assert 0.99999e-6 < fits < 1e-6
        r = s.query(sql, epsilon=1.0, delta=fits)  # the named delta fits, with its own fp part
        assert r.cost.delta <= 1e-6 and s.remaining().delta >= 0


def test_no_fp_hint_when_the_request_itself_does_not_fit(tmp_path: Path) -> None:
    """Negative controls: a delta above what remains, or epsilon over, get the plain refusal."""
    with _session(tmp_path / "l.duckdb", Budget(1.0, 1e-6)) as s:
        for eps, delta in ((1.0, 2e-6), (2.0, 1e-6)):
            with pytest.raises(BudgetExceededError) as ei:
                s.query("SELECT COUNT(*) FROM ev", epsilon=eps, delta=delta)
            assert "floating-point" not in (ei.value.hint or "")
        with pytest.raises(BudgetExceededError) as ei:  # pure DP has no fp part
            s.query("SELECT COUNT(*) FROM ev", epsilon=2.0)
        assert "floating-point" not in (ei.value.hint or "")


def test_cli_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "ev.parquet"
    pq.write_table(TABLE, data)
    led = str(tmp_path / "l.duckdb")
    assert run(["init", "--epsilon", "1", "--delta", "1e-6", "--ledger", led]) == 0
    flags = ["--ledger", led, "--table", f"ev={data}", "--privacy-unit", "ev=uid"]
    capsys.readouterr()
    assert run([*flags, "query", "SELECT COUNT(*) FROM ev", "--epsilon", "1", "--delta", "1e-6"]) == 3
    err = capsys.readouterr().err
    m = re.search(r"ask for --delta ([0-9.e+-]+) or less", err)
    assert m, err
    assert run([*flags, "query", "SELECT COUNT(*) FROM ev", "--epsilon", "1", "--delta", m.group(1)]) == 0


# (epsilon, total delta, granularity of amount, query): the first two ask for exactly a remaining delta whose
# sum with fp_delta rounds up by one ulp (no hint was given); the last two have an fp_delta above a
# third of what remains, where the named delta (remaining - 2 fp) was refused (its own part exceeds it)
ROUNDED_OR_LARGE = [
    (0.01, 9.955863631704034e-07, None, "SELECT COUNT(*) AS n FROM ev"),
    (1.0, 2.9182530384772054e-06, None, "SELECT SUM(amount) AS s, COUNT(*) AS n FROM ev"),
    (1.0, 4.963463199420766e-12, 2.0, "SELECT AVG(amount) AS a FROM ev"),
    (8.0, 3.5477584566058454e-09, None, "SELECT SUM(amount) AS s FROM ev"),
]


@pytest.mark.parametrize(("eps", "total", "gran", "sql"), ROUNDED_OR_LARGE)
def test_the_hint_is_given_and_any_named_delta_fits(tmp_path: Path, eps: float, total: float, gran: float | None,
                                                    sql: str) -> None:
    with dpsql.Session(budget=Budget(100.0, total)) as s:
        use_noise(s, zero_noise())
        cols: dict = {"amount": {"bounds": (-5, 5) if gran else (0, 1e-3)}}
        if gran:
            cols["amount"]["granularity"] = gran
        s.register("ev", TABLE, privacy_unit="uid", max_groups_per_unit=1, columns=cols)
        with pytest.raises(BudgetExceededError) as ei:
            s.query(sql, epsilon=eps, delta=total)
        hint = ei.value.hint or ""
        assert "floating-point delta" in hint, hint
        m = re.search(r"ask for delta=([0-9.e+-]+) or less", hint)
        if m is None:
            assert "too large a share" in hint
            return
        r = s.query(sql, epsilon=eps, delta=float(m.group(1)))
        assert r.cost.delta <= total


def test_fp_delta_refusal_at_epsilon_10_does_not_offer_10_and_names_the_group_cap(tmp_path: Path) -> None:
    """At epsilon = 10 the refusal said epsilon=10 'is too large' and then 'use a smaller epsilon (10 or less
    usually fits)'; the part also grows with max_groups_per_unit, which was the cause here."""
    s = dpsql.Session(ledger=tmp_path / "l.duckdb", budget=Budget(100.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    s.register("ev", TABLE, privacy_unit="uid", max_groups_per_unit=10000)
    with pytest.raises(dpsql.errors.ConfigError) as ei:
        s.query("SELECT country, COUNT(*) AS n FROM ev GROUP BY country", epsilon=10.0, delta=1e-5)
    assert s.remaining() == Budget(100.0, 1e-3) and s.history().num_rows == 0  # nothing charged
    hint = ei.value.hint or ""
    assert "10 or less" not in hint and "below 10" in hint and "max_groups_per_unit" in hint
    s.close()
