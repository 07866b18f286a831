"""Neighbouring datasets (without and with one person's rows), the same query, the same observable outcome.

All three cases below are closed: ``invalid_mask`` validates steps of 256 kB in C++ and reads only a failing
step byte by byte (the Parquet case: 0.45 against 0.39 CPU s; the CSV case: 0.93 against 0.78), and a text unit
is digested under the binary collation. What each case was:

1. One invalid text in a batch of others' non-ASCII text (``_duckdb_native.invalid_mask``). The Parquet text
check now finds a failing batch's invalid values by numpy passes over every non-ASCII byte of the batch, so the
cost of one person's single invalid value is a function of how much non-ASCII text *others* wrote in that batch:
1M rows of others' Cyrillic texts (31 MB) and one person's ``b"\\xff..."`` make the first read 4.3 s of CPU against
0.49 s without that person (threads = 1); halving (the code before) took 0.51 s. Under ``statement_timeout = 2``
the query fails after its charge only with that person. The CSV copy has the same shape: one invalid line in a
4 MB chunk of Cyrillic lines costs ``_clean`` 0.23 s against 0.03 s decoding line by line and 0.009 s valid, so a
person with one invalid line in each chunk adds about 0.2 s per 4 MB of others' text: a 75 MB CSV of others'
Cyrillic lines and one person's 12 invalid lines, first read 3.0 s of CPU against 0.73 s without them (the code
before: 0.81 against 0.61), and under ``statement_timeout = 2`` the query fails after its charge only with them. A fix could validate only
around the bytes Arrow's or Python's decoder reports (the first invalid position, then resume), or halve the
failing step in C++ before the numpy pass.

2. A text privacy unit carried through the caps as the salted digest of its text (``bound.unit_expression``).

Under ``engine={"keyed_hash": "portable"}`` the digest is ``md5(salt || CAST(unit AS VARCHAR))``, a text, and it
keeps the collation of the unit's column. A unit column declared ``VARCHAR COLLATE NOCASE`` in the caller's
DuckDB table then gives a NOCASE digest, which the keyed hash of (unit, group key) concatenates with the group
key under the binary collation: DuckDB refuses to bind ``Cannot combine types with different collation``, and
``SELECT g, COUNT(*) FROM t GROUP BY g`` (or ``SUM``) is refused as "does not type-check" before any charge.
Before the digest the unit was ``uid COLLATE "binary"`` and the same query answered (the engine's own hash,
whose ``MD5_NUMBER`` is a number, and a ``default_collation`` of NOCASE both answer).

The failure depends only on the column's declared collation (public metadata), never on a row: a
refusal of a supported query, not a leak. A fix could put the text digest under the binary collation
(``binary_text``) as the unit was before.

Detection: the query's outcome (1: under the owner's statement time-out, as the Arrow-hash case of
``tests/test_adversary_round40c.py``), no wall clock.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
import dpsql.errors
from dpsql import Budget
from dpsql.engine import _duckdb_native as native
from dpsql.testing import use_noise, zero_noise


def _cyrillic_file(path: Path, invalid: bool, rows: int = 200_000) -> None:
    """Others' ``rows`` distinct Cyrillic texts (plain encoding), one of them, one person's, not UTF-8 if ``invalid``."""
    vals = [f"Привет мир, как дела {i:07d}".encode() for i in range(rows)]
    if invalid:
        vals[rows // 2] = b"\xff" + vals[rows // 2]
    raw = pa.array(vals, pa.binary())
    text = pa.Array.from_buffers(pa.string(), rows, raw.buffers())
    pq.write_table(pa.table({"uid": pa.array(range(rows), pa.int64()), "name": text}), path, use_dictionary=False)


def _bytes_read_one_by_one(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the byte ranges ``invalid_mask`` reads byte by byte (numpy passes), recorded as they are read."""
    sizes: list[int] = []
    real = native._invalid_run

    def recording(data: Any, offsets: Any) -> Any:
        sizes.append(int(offsets[-1] - offsets[0]))
        return real(data, offsets)

    monkeypatch.setattr(native, "_invalid_run", recording)
    return sizes


def _after_first_read(path: Path, inspect: Callable[[Any], Any]) -> Any:
    """``inspect(engine)`` after a first private read of ``path`` in a new session (before it closes)."""
    with dpsql.Session(budget=Budget(100.0, 1e-3)) as s:
        use_noise(s, zero_noise(42))
        s.register("t", str(path), privacy_unit="uid")
        s.query("SELECT COUNT(name) AS n FROM t", epsilon=1.0, delta=1e-6)
        return inspect(s._engine)


def test_one_invalid_value_among_others_non_ascii_text_is_answered_alike_on_neighbours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both neighbours answered and the invalid cell found, and only the step holding it is read byte by byte (one
    step of at most ``_MASK_BYTES`` bytes, not the batch's 6 MB of others' text): no timing involved."""
    monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)
    sizes = _bytes_read_one_by_one(monkeypatch)
    found = []
    for invalid in (False, True):
        path = tmp_path / f"t{int(invalid)}.parquet"
        _cyrillic_file(path, invalid)
        found.append(_after_first_read(path, lambda e: [(int(f), int(r)) for f, r in
                                                        next(iter(e._native.values())).bad["name"]]))
    assert found == [[], [(0, 100_000)]]
    assert path.stat().st_size > 4 * native._MASK_BYTES  # the batch is many steps long (the control)
    assert len(sizes) == 1 and sizes[0] <= native._MASK_BYTES, sizes


def _session(collation: str) -> dpsql.Session:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t (uid VARCHAR {collation}, g VARCHAR, x BIGINT)")
    con.execute("INSERT INTO t VALUES ('a', 'G0', 1), ('a', 'G1', 2), ('b', 'G1', 3), ('c', 'G2', 4)")
    s = dpsql.Session(budget=Budget(100.0, 0.5), engine={"keyed_hash": "portable"}, connection=con)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid", max_groups_per_unit=1, max_rows_per_group=2,
               columns={"g": {"domain": ["G0", "G1", "G2"]}, "x": {"bounds": [0, 10]}})
    return s


def test_control_a_unit_without_a_collation_answers() -> None:
    r = _session("").query("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1.0, delta=1e-6)
    assert sum(row["n"] for row in r.table.to_pylist()) == 3  # three people, one group each


@pytest.mark.parametrize("sql", ["SELECT g, COUNT(*) AS n FROM t GROUP BY g", "SELECT g, SUM(x) AS s FROM t GROUP BY g"])
def test_a_nocase_text_unit_under_the_portable_hash_answers_a_grouped_query(sql: str) -> None:
    r = _session("COLLATE NOCASE").query(sql, epsilon=1.0, delta=1e-6)
    assert len(r.table) == 3


def _cyrillic_csv(path: Path, invalid: bool, lines: int = 300_000) -> None:
    """Others' ``lines`` rows of Cyrillic text (19 MB); with ``invalid``, one person's row in every 100 000th line
    (3 rows, in different 4 MB chunks of the copy) holds one byte that is not UTF-8."""
    rows = [f"{i},Привет мир как дела сегодня {i:07d}\n".encode() for i in range(lines)]
    if invalid:
        for i in range(50_000, lines, 100_000):
            rows[i] = f"{lines},".encode() + b"\xff" + rows[i].split(b",", 1)[1]
    path.write_bytes(b"uid,name\n" + b"".join(rows))


def test_one_persons_invalid_lines_among_others_non_ascii_csv_are_answered_alike_on_neighbours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both neighbours answered, the invalid lines left out, and only the steps holding them read byte by byte (one
    step of at most ``_MASK_BYTES`` bytes per invalid line, not its 4 MB chunk of others' lines): no timing."""
    monkeypatch.setattr(native, "SETTLE_SECONDS", 0.0)
    sizes = _bytes_read_one_by_one(monkeypatch)
    lines = []
    for invalid in (False, True):
        path = tmp_path / f"t{int(invalid)}.csv"
        _cyrillic_csv(path, invalid)
        lines.append(_after_first_read(path, lambda e: [Path(c).read_bytes().count(b"\n")
                                                        for c in next(iter(e._csv.values())).copies]))
    assert lines == [[300_001], [299_998]]  # the header and every line; the three invalid lines left out
    assert len(sizes) == 3 and all(n <= native._MASK_BYTES + 100 for n in sizes), sizes
