"""Private sources and range workloads under hostile data (one person's rows, the owner's files)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.errors import ConfigError, PolicyError
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("how", ["null", "replace"])
@pytest.mark.parametrize("misfit", [False, True])
def test_files_naming_a_column_in_another_case_are_refused_at_registration(
        tmp_path: Path, how: str, misfit: bool) -> None:
    """A multi-file Parquet source whose second file stores ``age`` as ``AGE`` (and as int64, the first
    as int32) passed the same-types check, which compared names case-sensitively. With
    ``invalid_text = "replace"`` DuckDB's reader matches names case-insensitively and casts the second
    file's column to the first's type: every query reading ``age`` failed after its charge exactly
    when one person's value was 2^40 (the same file with 40 answered). The Arrow view read the column
    as NULL in that file instead, so the two readers disagreed. Now refused at registration, free."""
    pq.write_table(pa.table({"uid": pa.array([1, 2, 3], pa.int64()), "age": pa.array([10, 20, 30], pa.int32())}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"uid": pa.array([4], pa.int64()), "AGE": pa.array([2**40 if misfit else 40], pa.int64())}),
                   tmp_path / "b.parquet")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"invalid_text": how})
    with pytest.raises(ConfigError, match=r"column 'AGE' .*b\.parquet.* 'age' .*a\.parquet"):
        s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid", max_rows_per_unit=1)
    assert s.history().num_rows == 0
    s.close()


def test_files_naming_columns_alike_still_register(tmp_path: Path) -> None:
    """Control: the same names in every file (another order, a column missing) register and read."""
    pq.write_table(pa.table({"uid": pa.array([1, 2, 3], pa.int64()), "age": pa.array([10, 20, 30], pa.int32())}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"age": pa.array([40], pa.int32()), "uid": pa.array([4], pa.int64())}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"uid": pa.array([5], pa.int64())}), tmp_path / "c.parquet")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"invalid_text": "replace"})
    s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid", max_rows_per_unit=1)
    s.close()


@pytest.fixture
def grid(tmp_path: Path):  # type: ignore[no-untyped-def]
    a, b = [], []
    for i in range(16):
        for j in range(16):
            for k in range(1 + (i * j) % 3):
                a.append(i * 2 - 16 + k % 2)
                b.append(j * 0.5 + k * 0.1)
    pq.write_table(pa.table({"uid": list(range(len(a))), "a": a, "b": b}), tmp_path / "t.parquet")
    s = dpsql.Session(ledger=str(tmp_path / "l.db"), budget=dpsql.Budget(100.0, 1e-3), create=True)
    use_noise(s, zero_noise())
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", max_rows_per_unit=1,
               columns={"a": {"bounds": (-16, 16), "bins": 16}, "b": {"bounds": (0, 8), "bins": 16}})
    yield s
    s.close()


def test_two_column_range_read_from_the_synopsis_in_either_column_order(grid: dpsql.Session) -> None:
    """A 2-D range count whose WHERE names ``b`` before ``a`` was refused ``reuse='synopsis'`` (its columns
    taken in order of appearance, so its key named (b, a)) though the workload's synopsis over (a, b) answers
    the same rectangle; the same query written ``a`` first was read from it. Now both are, to the same
    value, free."""
    wl = ["SELECT COUNT(*) FROM t WHERE a >= -4 AND a < 4 AND b >= 1 AND b < 3",
          "SELECT COUNT(*) FROM t WHERE a < 0 AND b >= 4"]
    made = grid.query_many(wl, epsilon=5.0).counts
    left = grid.remaining()
    for sql, want in zip(wl, made):
        same = grid.query(sql, epsilon=5.0, options={"reuse": "synopsis"})
        flipped = grid.query(sql.replace("a >= -4 AND a < 4 AND b >= 1 AND b < 3", "b < 3 AND a >= -4 AND b >= 1 AND a < 4")
                             .replace("a < 0 AND b >= 4", "b >= 4 AND a < 0"), epsilon=5.0, options={"reuse": "synopsis"})
        assert same.reused and flipped.reused
        assert same.table.column(0)[0].as_py() == flipped.table.column(0)[0].as_py() == want
    flipped_wl = grid.query_many(["SELECT COUNT(*) FROM t WHERE b >= 4 AND a < 0"], epsilon=5.0)
    assert list(flipped_wl.counts) == [made[1]]
    assert grid.remaining() == left


def test_two_column_range_of_other_caps_is_not_read_transposed(grid: dpsql.Session) -> None:
    """Control: transposing finds only a synopsis of the same table, conditions and caps."""
    grid.query_many(["SELECT COUNT(*) FROM t WHERE a < 0 AND b >= 4"], epsilon=5.0)
    with pytest.raises(PolicyError, match="no stored DAWA synopsis covers"):
        grid.query("SELECT COUNT(*) FROM t WHERE b >= 4 AND a < 0 AND uid > 3", epsilon=5.0,
                   options={"reuse": "synopsis"})
    r = grid.query("SELECT COUNT(*) FROM t WHERE b >= 4 AND a < 0", epsilon=5.0, options={"reuse": "never"})
    assert not r.reused


def test_two_column_range_with_kept_rows_and_columns_read_transposed(grid: dpsql.Session) -> None:
    """Shared conditions that keep some rows and columns of the grid (``dawa_bins``) are transposed too."""
    shared = "a IN (-12, -10, 0, 2, 4) AND b <> 2.5"
    made = grid.query_many([f"SELECT COUNT(*) FROM t WHERE {shared} AND a < 3 AND b >= 1"], epsilon=5.0).counts
    left = grid.remaining()
    r = grid.query("SELECT COUNT(*) FROM t WHERE b <> 2.5 AND b >= 1 AND a IN (-12, -10, 0, 2, 4) AND a < 3",
                   epsilon=5.0, options={"reuse": "synopsis"})
    assert r.reused and r.table.column(0)[0].as_py() == made[0]
    assert grid.remaining() == left


# -- keys listed by the WHERE, under ROLLUP, on a caller's NOCASE column ---------------------------------------------

def _listed_rollup(extra: str) -> tuple[list[tuple], str]:
    import re

    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE t(uid INTEGER, cc VARCHAR COLLATE NOCASE)")
    con.execute("INSERT INTO t SELECT i, ['FR', 'DE', 'IT'][i % 3 + 1] FROM range(30) r(i)")
    if extra:
        con.execute(f"INSERT INTO t VALUES {extra}")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), connection=con)
    s.register("t", "t", privacy_unit="uid")
    use_noise(s, zero_noise())
    sql = "SELECT cc, COUNT(*) AS n FROM t WHERE cc IN ('FR', 'DE') GROUP BY ROLLUP(cc) ORDER BY cc"
    try:
        plan = re.sub(r"_dpsql_src_\w+", "SRC", str(s.explain(sql, epsilon=1.0, delta=1e-6)))
        rows = [(r["cc"], r["n"]) for r in s.query(sql, epsilon=1.0, delta=1e-6).table.to_pylist()]
    finally:
        s.close()
    return rows, plan


def test_listed_keys_under_rollup_on_a_nocase_column_ignore_one_persons_other_spellings() -> None:
    """Neighbours: one more person whose many rows spell a listed key in another case ('fr', 'De') or pad it ('FR ').
    The released keys and the plan are the query's text (the ROLLUP's total too), and no count moves: the NOCASE
    collation of the caller's column neither merges those rows into a listed key nor adds a key. The negative
    control: the same person spelling 'FR' exactly moves FR and the total by one (one group per person)."""
    base, plan = _listed_rollup("")
    assert base == [("DE", 10), ("FR", 10), (None, 20)]
    hostile = ", ".join(f"(999, '{v}')" for v in ["fr", "De", "FR ", "fR"] * 25)
    rows, other_plan = _listed_rollup(hostile)
    assert rows == base and other_plan == plan
    control, control_plan = _listed_rollup("(999, 'FR')")
    assert control_plan == plan
    assert control == [("DE", 10), ("FR", 11), (None, 21)]
