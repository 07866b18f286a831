"""Range workloads whose declared sizes could exhaust memory or time: refused before the charge, or
answered in memory linear in the grid.

* A 2-D grid is ordered along the Hilbert curve of the square that contains it; only the real cells
  are listed (memory O(cells), not O(side²): a 2^20 x 1 grid once asked for a 2^20 x 2^20 square
  after its charge). The order is the one of the padded curve with its padding skipped, pinned here.
* A declared ordered domain has at most 4,194,304 bins, whether given by ``bins`` or cut by a
  ``bin_width`` (numbers, dates and timestamps alike); a zero or negative width is refused.
* A 2-D workload's rectangles are turned into runs from their border cells: more than 4,194,304
  border cells in all are refused before the charge, as a grid of more than 1,048,576 cells is.
* A GROUP BY over declared keys releases every combination: more than 4,194,304 are refused before
  the charge.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql import catalog
from dpsql.catalog import OrderedDomain, parse_column_spec
from dpsql.errors import ConfigError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms import _dawa_hilbert
from dpsql.mechanisms._dawa_hilbert import grid_order, hilbert_order, rects_to_workload, side_for
from dpsql.plan import workload
from dpsql.testing import use_noise, zero_noise

# -- 1. the Hilbert order of the real cells only ------------------------------------------------


def _padded_order(shape: tuple[int, int]) -> np.ndarray:
    """The order before the fix: the whole padded d x d curve, then the padding dropped."""
    order = hilbert_order(side_for(shape))
    return order[(order[:, 0] < shape[0]) & (order[:, 1] < shape[1])]


def _xy2d(d: int, x: int, y: int) -> int:
    """Position of cell (row x, col y) on the d x d curve of ``hilbert_order`` (scalar reference)."""
    pos, s = 0, d // 2
    while s > 0:
        rx, ry = int(x & s > 0), int(y & s > 0)
        pos += s * s * ((3 * rx) ^ ry)
        if ry == 0:
            if rx == 1:
                x, y = d - 1 - x, d - 1 - y
            x, y = y, x
        s //= 2
    return pos


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<i8").tobytes()).hexdigest()[:16]


def test_lopsided_grid_order_takes_memory_linear_in_its_cells():
    n = 1 << 20
    tracemalloc.start()
    try:
        cells, index = grid_order((n, 1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 2^20 cells: a few int64 vectors of 8 MiB; the padded square would be 2^40 cells (8 TiB each)
    assert peak < 256 * 2**20, peak
    # column 0 of the curve runs from (0, 0) down to (d - 1, 0) in row order
    assert np.array_equal(cells[:, 0], np.arange(n)) and not cells[:, 1].any()
    assert np.array_equal(index[:, 0], np.arange(n))
    cells_t, index_t = grid_order((1, n))
    assert np.array_equal(cells_t[:, 1], np.arange(n)) and np.array_equal(index_t[0], np.arange(n))


@pytest.mark.parametrize("d", [1, 2, 4, 8, 16, 32, 64, 128])
def test_square_grid_order_is_the_hilbert_curve(d):
    cells, index = grid_order((d, d))
    assert np.array_equal(cells, hilbert_order(d))
    assert np.array_equal(index[cells[:, 0], cells[:, 1]], np.arange(d * d))


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (1, 7), (7, 1), (17, 9), (100, 3), (1024, 1), (1, 1024),
                                   (1000, 3), (37, 100), (129, 2), (2, 129)])
def test_any_grid_order_is_the_padded_curve_without_its_padding(shape):
    cells, index = grid_order(shape)
    assert np.array_equal(cells, _padded_order(shape))
    assert np.array_equal(index[cells[:, 0], cells[:, 1]], np.arange(shape[0] * shape[1]))


def test_grid_order_pinned_numbers():
    cells, index = grid_order((4, 4))
    assert cells.tolist() == [[0, 0], [1, 0], [1, 1], [0, 1], [0, 2], [0, 3], [1, 3], [1, 2], [2, 2], [2, 3],
                              [3, 3], [3, 2], [3, 1], [2, 1], [2, 0], [3, 0]]
    assert index.tolist() == [[0, 3, 4, 5], [1, 2, 7, 6], [14, 13, 8, 9], [15, 12, 11, 10]]
    assert grid_order((8, 8))[1].tolist() == [
        [0, 1, 14, 15, 16, 19, 20, 21], [3, 2, 13, 12, 17, 18, 23, 22], [4, 7, 8, 11, 30, 29, 24, 25],
        [5, 6, 9, 10, 31, 28, 27, 26], [58, 57, 54, 53, 32, 35, 36, 37], [59, 56, 55, 52, 33, 34, 39, 38],
        [60, 61, 50, 51, 46, 45, 40, 41], [63, 62, 49, 48, 47, 44, 43, 42]]
    assert grid_order((5, 3))[1].tolist() == [[0, 1, 11], [3, 2, 10], [4, 7, 8], [5, 6, 9], [14, 13, 12]]
    assert grid_order((3, 5))[1].tolist() == [[0, 1, 10, 11, 12], [3, 2, 9, 8, 13], [4, 5, 6, 7, 14]]
    # digests of the order before the change (the padded curve, padding skipped)
    assert _digest(grid_order((1000, 3))[1]) == "0d8fb5d0418298c8"
    assert _digest(grid_order((37, 100))[1]) == "da6b2a2edbea72bd"
    assert _digest(grid_order((256, 256))[1]) == "d2829935c6e618fd"
    assert _digest(grid_order((1024, 1))[1]) == "2f88e9ce00d238e7"


def test_large_lopsided_grid_follows_the_scalar_curve():
    shape = (1 << 19, 2)  # d = 2^19: the padded square would hold 2^38 cells
    cells, index = grid_order(shape)
    gen = np.random.default_rng(11)
    pick = np.sort(gen.choice(shape[0] * shape[1], 400, replace=False))
    d = side_for(shape)
    assert d == 1 << 19
    scalar = [_xy2d(d, int(r), int(c)) for r, c in cells[pick]]
    assert scalar == sorted(scalar) and len(set(scalar)) == len(scalar)
    # the curve of side 2^19 starts with the whole sub-square of side 2^9, in the same orientation
    # (each level transposes the first quadrant: ten levels, ten transpositions)
    small = _padded_order((1 << 9, 2))
    first = cells[(cells[:, 0] < 1 << 9)]
    assert np.array_equal(first, small)


# -- sessions ----------------------------------------------------------------------------------


def _lopsided_table(rows: int = 400) -> pa.Table:
    gen = np.random.default_rng(5)
    return pa.table({
        "pid": np.arange(rows, dtype=np.int64),
        "x": gen.integers(0, 1 << 20, rows).astype(np.int64),
        "y": gen.uniform(0, 1, rows),
    })


def _lopsided_session() -> dpsql.Session:
    t = _lopsided_table()
    s = dpsql.Session(budget=dpsql.Budget(10.0))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1,
               columns={"x": {"bounds": (0, (1 << 20) - 1), "bins": 1 << 20}, "y": {"bounds": (0, 1), "bins": 1}})
    return s


def _spend_a_little(s: dpsql.Session) -> dpsql.Budget:
    """One answered query first, so that 'nothing spent' is measured against a used ledger."""
    s.query("SELECT COUNT(*) FROM t", epsilon=0.5)
    return s.remaining()


def test_sql_workload_on_a_2_20_by_1_grid_answers_and_charges_once():
    s = _lopsided_session()
    before = s.remaining()
    r = s.query_many(["SELECT COUNT(*) FROM t WHERE x < 1000 AND y >= 0",
                      "SELECT COUNT(*) FROM t WHERE x >= 524288 AND y < 1"], epsilon=1.0)
    assert [d["bins"] for d in r.details["dims"]] == [1 << 20, 1]
    x = _lopsided_table().column("x").to_numpy()
    truth = [int(np.sum(x < 1000)), int(np.sum(x >= 524288))]
    assert truth[1] > 150  # about half of the 400 rows
    # zero noise: only DAWA's bias (a few sparse rows spread over wide buckets), well below the counts
    assert np.all(np.abs(np.asarray(r.counts) - truth) <= 20), (r.counts, truth)
    # the grid's Hilbert order is its rows in order, so the 2-D run is the 1-D one over x
    one_d = _lopsided_session().query_many(["SELECT COUNT(*) FROM t WHERE x < 1000",
                                            "SELECT COUNT(*) FROM t WHERE x >= 524288"], epsilon=1.0)
    assert r.counts == one_d.counts
    assert before.epsilon - s.remaining().epsilon == pytest.approx(1.0)
    assert s.history().num_rows == 1


# -- 2. bins of dates and timestamps: at most 2^22, widths > 0 ------------------------------------

YEAR = ("2020-01-01", "2021-01-01")  # 366 days: 31,622,400 seconds


MAX_BINS = 4_194_304


def test_max_bins_is_two_to_the_22():
    assert getattr(catalog, "MAX_BINS", None) == MAX_BINS == 1 << 22


@pytest.mark.parametrize("width", ["0 seconds", "0 days", "0.0 hours", "0 weeks", "-1 day", "-0.5 seconds"])
def test_zero_or_negative_time_bin_width_is_refused(width):
    with pytest.raises(ConfigError) as e:
        parse_column_spec("visits", "day", {"bounds": YEAR, "bin_width": width})
    msg = str(e.value)
    assert "bin_width" in msg and "visits.day" in msg and "positive" in msg
    assert "1 hour" in msg  # the fix: a positive interval


@pytest.mark.parametrize("width", ["1 second", "0.001 seconds", "7 seconds"])
def test_time_bin_width_cutting_more_than_2_22_bins_is_refused(width):
    with pytest.raises(ConfigError) as e:
        parse_column_spec("visits", "day", {"bounds": YEAR, "bin_width": width})
    msg = str(e.value)
    assert "4,194,304" in msg and "visits.day" in msg and "bin_width" in msg
    # the fix names the least width that fits: 31,622,400 s / 2^22 = 7.54 s
    assert "7.54 seconds" in msg


def test_time_bins_at_the_limit_are_accepted_one_more_is_refused():
    lo = dt.datetime(2020, 1, 1)
    at = (lo + dt.timedelta(seconds=MAX_BINS)).isoformat(sep=" ")
    over = (lo + dt.timedelta(seconds=MAX_BINS + 1)).isoformat(sep=" ")
    c = parse_column_spec("t", "ts", {"bounds": (lo.isoformat(sep=" "), at), "bin_width": "1 second"})
    assert c.ordered is not None and c.ordered.bins == MAX_BINS
    with pytest.raises(ConfigError, match="4,194,305 bins"):
        parse_column_spec("t", "ts", {"bounds": (lo.isoformat(sep=" "), over), "bin_width": "1 second"})
    # numbers follow the same rule, in the same words
    c = parse_column_spec("t", "v", {"bounds": (0, MAX_BINS), "bin_width": 1})
    assert c.ordered is not None and c.ordered.bins == MAX_BINS
    with pytest.raises(ConfigError, match="4,194,305 bins"):
        parse_column_spec("t", "v", {"bounds": (0, MAX_BINS + 1), "bin_width": 1})


@pytest.mark.parametrize("spec", [
    {"bounds": (0, 1), "bins": 2.5},
    {"bounds": (0, 1), "bins": float("nan")},
    {"bounds": (0, 1), "bins": float("inf")},
    {"bounds": (0, 1), "bins": True},
    {"bounds": (0, 1), "bin_width": float("nan")},
    {"bounds": (0, 1), "bin_width": float("inf")},
    {"bounds": (0, 1), "bin_width": 1e-320},
    {"bounds": (0, 1), "bin_width": 1e-9},
    {"bounds": YEAR, "bins": 2.5},
    {"bounds": YEAR, "bins": float("inf")},
    {"bounds": YEAR, "bins": float("nan")},
    {"bounds": YEAR, "bins": 31_622_400},
])
def test_bins_and_widths_that_are_not_a_finite_bounded_grid_are_config_errors(spec):
    with pytest.raises(ConfigError, match="'t.c'"):
        parse_column_spec("t", "c", spec)


def test_an_ordered_domain_built_by_hand_is_checked_too():
    with pytest.raises(ConfigError, match="4,194,304"):
        OrderedDomain("2020-01-01 00:00:00", "2021-01-01 00:00:00", 31_622_400, "date", 1.0)
    with pytest.raises(ConfigError, match="positive"):
        OrderedDomain("2020-01-01 00:00:00", "2021-01-01 00:00:00", 10, "date", 0.0)
    with pytest.raises(ConfigError, match="whole number"):
        OrderedDomain(0.0, 1.0, 2.5, "numeric")  # type: ignore[arg-type]
    assert OrderedDomain(0.0, 1.0, 4, "numeric").width == 0.25


def test_refused_time_grids_spend_no_budget():
    s = _lopsided_session()
    spent = _spend_a_little(s)
    days = pa.table({"pid": np.arange(3, dtype=np.int64),
                     "ts": [dt.datetime(2020, 1, 1), dt.datetime(2020, 6, 1), dt.datetime(2020, 12, 1)]})
    for width in ("0 seconds", "1 second"):
        with pytest.raises(ConfigError):
            s.register("visits", days, privacy_unit="pid", max_rows_per_unit=1,
                       columns={"ts": {"bounds": YEAR, "bin_width": width}})
    assert "visits" not in s.tables
    assert s.remaining() == spent and s.history().num_rows == 1


# -- 3. 2-D rectangles: border cells and grid cells bounded before the charge ------------------


def _full_height(k: int) -> list[str]:
    """k rectangles over the whole 2^20 x 1 grid: 2^20 border cells each."""
    return [f"SELECT COUNT(*) FROM t WHERE x BETWEEN 0 AND {(1 << 20) - 1} AND y >= 0" for _ in range(k)]


def test_border_cells_at_the_limit_pass_analysis():
    s = _lopsided_session()
    wl = workload.analyze_workload(_full_height(4), s.tables)  # 4 x 2^20 border cells = 2^22
    assert [d.n for d in wl.dims] == [1 << 20, 1]


def test_too_many_border_cells_are_refused_before_the_charge():
    s = _lopsided_session()
    spent = _spend_a_little(s)
    sqls = _full_height(5)  # 5 x 2^20 border cells
    with pytest.raises(UnsupportedQueryError) as e:
        s.query_many(sqls, epsilon=1.0)
    msg = str(e.value)
    assert "5,242,880" in msg and "4,194,304" in msg and "border" in msg
    with pytest.raises(UnsupportedQueryError):
        s.explain(sqls, epsilon=1.0)
    assert s.remaining() == spent and s.history().num_rows == 1


def test_rects_to_workload_refuses_too_many_border_cells():
    assert getattr(_dawa_hilbert, "MAX_BORDER_CELLS", None) == 1 << 22
    full = [[0, 1023, 0, 1023]] * 1026  # 1026 x 4092 = 4,198,392 border cells
    with pytest.raises(ConfigError, match="4,198,392"):
        rects_to_workload(full, (1024, 1024))
    wl = rects_to_workload(full[:1025], (1024, 1024))  # 4,194,300: within
    assert wl.n_queries == 1025


def test_a_grid_of_more_than_2_20_cells_is_refused_before_the_charge():
    s = _lopsided_session()
    spent = _spend_a_little(s)
    t = pa.table({"pid": np.arange(10, dtype=np.int64), "a": np.arange(10, dtype=np.int64),
                  "b": np.arange(10, dtype=np.int64)})
    s.register("g", t, privacy_unit="pid", max_rows_per_unit=1,
               columns={"a": {"bounds": (0, 2047), "bins": 2048}, "b": {"bounds": (0, 1023), "bins": 1024}})
    with pytest.raises(PolicyError, match="1,048,576 cells"):
        s.query_many(["SELECT COUNT(*) FROM g WHERE a < 5 AND b < 5"], epsilon=1.0)
    assert s.remaining() == spent and s.history().num_rows == 1


# -- 4. GROUP BY over declared keys: every combination is released, so their number is bounded --------


def _keyed_session(na: int, nb: int) -> dpsql.Session:
    t = pa.table({"pid": np.arange(100, dtype=np.int64), "a": np.arange(100, dtype=np.int64) % na,
                  "b": np.arange(100, dtype=np.int64) % nb})
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="pid", max_groups_per_unit=1, max_rows_per_group=1, max_rows_per_unit=1,
               columns={"a": {"domain": list(range(na))}, "b": {"domain": list(range(nb))}})
    return s


def test_a_cross_product_of_declared_keys_beyond_2_22_groups_is_refused_before_the_charge():
    s = _keyed_session(3000, 2000)  # 6,000,000 combinations, each a released row built after the charge
    s.query("SELECT COUNT(*) FROM t", epsilon=0.5)
    spent = s.remaining()
    for sql in ("SELECT a, b, COUNT(*) FROM t GROUP BY a, b", "SELECT a, b FROM t GROUP BY a, b"):
        with pytest.raises(PolicyError) as e:
            s.query(sql, epsilon=1.0)
        assert "6,000,000" in str(e.value) and "4,194,304" in str(e.value)
        with pytest.raises(PolicyError):
            s.explain(sql, epsilon=1.0)
    assert s.remaining() == spent and s.history().num_rows == 1
    # one key alone, or the limit itself, is answered
    assert s.explain("SELECT a, COUNT(*) FROM t GROUP BY a", epsilon=1.0) is not None
    s2 = _keyed_session(2048, 2048)
    assert s2.explain("SELECT a, b, COUNT(*) FROM t GROUP BY a, b", epsilon=1.0) is not None
