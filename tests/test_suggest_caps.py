"""Caps advice (``Session.suggest_caps``): noisy per-person contribution histograms, charged, and
the caps read from them (post-processing). Calibration pinned; suggestions checked against an
independent computation with zero noise; refusals free."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise


def _table() -> pa.Table:
    gen = np.random.default_rng(5)
    rows = np.concatenate([np.ones(50, int), gen.integers(2, 4, 30), gen.integers(4, 8, 15), np.full(5, 40)])
    uid = np.repeat(np.arange(len(rows)), rows)
    g = gen.integers(0, 3, len(uid))
    return pa.table({"u": uid.astype(np.int64), "g": pa.array([f"k{x}" for x in g])})


@pytest.fixture
def session():
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0, 1e-5))
    use_noise(s, zero_noise())
    s.register("t", _table(), privacy_unit="u")
    yield s
    s.close()


def _suggest(values: np.ndarray, q: float) -> int:
    """Independent: the smallest power-of-two bin [2^b, 2^(b+1)) whose cumulative count reaches q."""
    bins = np.minimum(np.floor(np.log2(values)).astype(int), 20)
    counts = np.bincount(bins, minlength=21)
    b = int(np.searchsorted(np.cumsum(counts), q * counts.sum()))
    return 2 ** (b + 1) - 1


def test_suggestions_read_from_the_released_histograms(session):
    t = _table()
    rows = np.bincount(t.column("u").to_numpy())
    r = session.suggest_caps("t", epsilon=1.0, quantile=0.9)
    assert r.mechanism == "contribution_profile" and r.cost == dpsql.Budget(1.0, 0.0)
    assert r.details["suggested"] == {"max_rows_per_unit": _suggest(rows, 0.9)}
    assert r.table.column("people").to_pylist()[:3] == [50, 30, 15]  # 1 row; 2-3 rows; 4-7 rows (zero noise)
    r2 = session.suggest_caps("t", epsilon=1.0, group_by="g", quantile=0.5)
    pairs = {(int(u), g) for u, g in zip(t.column("u").to_pylist(), t.column("g").to_pylist(), strict=True)}
    groups = np.bincount([u for u, _ in pairs])
    assert r2.details["suggested"]["max_rows_per_unit"] == _suggest(rows, 0.5)
    assert r2.details["suggested"]["max_groups_per_unit"] == _suggest(groups, 0.5)
    row = session.history().to_pylist()[-1]
    assert row["mechanism"] == "contribution_profile" and json.loads(row["params"])["suggested"] == r2.details["suggested"]


def test_calibration_is_pinned(session):
    # one histogram of L1 sensitivity 1 at epsilon 1: the snapped Laplace of a unit-sensitivity
    # count, lambda = 1 / (1 - 2^-10 - 2^-44) = 1.0009775171066064 (grid 2)
    session.suggest_caps("t", epsilon=1.0)
    snap = json.loads(session.history().to_pylist()[-1]["params"])["snapping"]
    assert snap["lambda"] == pytest.approx(1.0009775171066064, rel=1e-12) and snap["grid"] == 2.0
    # three histograms share epsilon: each gets epsilon / 3
    session.suggest_caps("t", epsilon=3.0, group_by="g")
    params = json.loads(session.history().to_pylist()[-1]["params"])
    assert params["epsilon_per_histogram"] == 1.0 and params["snapping"]["lambda"] == pytest.approx(1.0009775171066064)


@pytest.mark.parametrize("kw,match", [
    ({"table": "nope"}, "no table"), ({"quantile": 1.5}, "quantile"), ({"group_by": "zz"}, "group_by"),
    ({"epsilon": -1}, "epsilon"),
])
def test_refusals_are_free(session, kw, match):
    args = {"table": "t", "epsilon": 1.0, **kw}
    with pytest.raises(ConfigError, match=match):
        session.suggest_caps(args.pop("table"), **args)
    assert session.history().num_rows == 0


def test_removing_one_person_moves_each_histogram_by_one_in_one_bin():
    """The sensitivity the calibration uses: one person is in exactly one bin of each histogram
    (zero noise, so the released counts are the true ones)."""
    t = _table()

    def counts(table: pa.Table) -> np.ndarray:
        s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0, 1e-5))
        use_noise(s, zero_noise())
        s.register("t", table, privacy_unit="u")
        r = s.suggest_caps("t", epsilon=3.0, group_by="g")
        s.close()
        return np.asarray(r.table.column("people").to_pylist()).reshape(3, -1)

    full = counts(t)
    for victim in (0, 55, 96, 99):  # one row; 2-3 rows; 4-7 rows; 40 rows
        rest = counts(t.filter(pa.array(t.column("u").to_numpy() != victim)))
        diff = full - rest
        assert (diff >= 0).all() and (diff.sum(axis=1) == 1).all() and (np.count_nonzero(diff, axis=1) == 1).all()


def test_bins_are_exact_at_the_powers_of_two():
    """Bin b holds [2^b, 2^(b+1)) exactly (comparisons, no floating-point log) and bin 20 is open above."""
    per = [1, 2, 3, 4, 2**19 - 1, 2**19, 2**20 - 1, 2**20, 2**21 + 3]
    uid = np.repeat(np.arange(len(per)), per)
    s = dpsql.Session(ledger=None, budget=dpsql.Budget(10.0, 1e-5))
    try:
        use_noise(s, zero_noise())
        s.register("t", pa.table({"u": pa.array(uid, pa.int64())}), privacy_unit="u")
        got = s.suggest_caps("t", epsilon=1.0).table.column("people").to_pylist()
    finally:
        s.close()
    want = [0] * 21
    for v in per:
        want[min(int(v).bit_length() - 1, 20)] += 1
    assert got == want and got[18] == 1 and got[19] == 2 and got[20] == 2
