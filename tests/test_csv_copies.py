"""CSV sources are read from the engine's copies, where a lone carriage return is a space
(``dpsql/engine/_duckdb_csv.py``): one record per physical line, whatever a field holds."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.engine import _duckdb_csv as csvcopy
from dpsql.errors import ConfigError, ExecutionError
from dpsql.testing import use_noise, zero_noise


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 22])
def test_copy_turns_lone_carriage_returns_into_spaces_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                             chunk: int) -> None:
    monkeypatch.setattr(csvcopy, "_CHUNK", chunk)
    raw = b"a,b\r\n1,x\ry\r\n2,\r\r\n3,z\n4,\r"
    src = tmp_path / "in.csv"
    src.write_bytes(raw)
    out = csvcopy.clean_copy(str(src), str(tmp_path), ".csv")
    assert Path(out).read_bytes() == b"a,b\n1,x y\n2, \n3,z\n4, "
    gz = tmp_path / "in.csv.gz"
    gz.write_bytes(gzip.compress(raw))
    assert Path(csvcopy.clean_copy(str(gz), str(tmp_path), ".csv")).read_bytes() == b"a,b\n1,x y\n2, \n3,z\n4, "


def _session(path: Path) -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", str(path), privacy_unit="uid", max_rows_per_unit=1,
               columns={"amount": {"type": "DOUBLE", "bounds": (0, 100)}})
    return s


def _lines(with_person: bool) -> bytes:
    lines = ["uid,note,amount"] + [f"{i},abc,{i % 10}" for i in range(300) if i != 7]
    if with_person:
        lines.insert(8, "7,hello" + "".join(f"\r{900 + j},x,100" for j in range(40)))
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("gz", [False, True], ids=["csv", "csv.gz"])
def test_one_person_with_carriage_returns_moves_the_counts_by_one(tmp_path: Path, gz: bool) -> None:
    got = []
    for with_person in (False, True):
        f = tmp_path / (f"d{with_person}.csv" + (".gz" if gz else ""))
        f.write_bytes(gzip.compress(_lines(with_person)) if gz else _lines(with_person))
        s = _session(f)
        got.append(s.query("SELECT COUNT(*) AS n, COUNT(DISTINCT uid) AS p, SUM(amount) AS a FROM t",
                           epsilon=1.0, delta=1e-6).table.to_pylist()[0])
        s.close()
    assert got[0]["n"] == got[0]["p"] == 299
    assert abs(got[0]["a"] - sum(i % 10 for i in range(300) if i != 7)) <= 10  # rounded to the release grid
    assert got[1] == {"n": 300, "p": 300, "a": got[0]["a"]}  # person 7 once; its amount ("x 900") does not convert
    # negative control: DuckDB's reader on the file itself, with the engine's options, makes 40 more people
    con = duckdb.connect()
    n = con.execute(f"SELECT COUNT(DISTINCT uid) FROM read_csv('{tmp_path / ('dTrue.csv' + ('.gz' if gz else ''))}', "
                    "columns={'uid': 'VARCHAR', 'note': 'VARCHAR', 'amount': 'VARCHAR'}, header=true, auto_detect=false, "
                    "delim=',', quote='', escape='', new_line='\\n', strict_mode=false, ignore_errors=true)").fetchall()[0][0]
    assert n == 299 + 40


def test_a_rewritten_file_is_copied_again_and_copies_go_with_the_engine(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(csvcopy, "settled", lambda version: True)  # as if written long ago: the copy is kept
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,10\n2,10\n")
    s = _session(f)
    q = "SELECT COUNT(*) AS n, SUM(amount) AS a FROM t"
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 2, "a": 20.0}]
    engine = s._engine
    copies = list(engine._csv.values())[0].copies
    assert len(copies) == 1 and os.path.exists(copies[0]) and Path(copies[0]).read_bytes() == f.read_bytes()
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 2, "a": 20.0}]
    assert list(engine._csv.values())[0].copies == copies  # same version: the same copy
    f.write_bytes(b"uid,amount\n1,10\n2,10\n3,30\n")  # a new version (size and times differ)
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 3, "a": 50.0}]
    new = list(engine._csv.values())[0].copies
    assert new != copies and not os.path.exists(copies[0])
    d = engine._csv_dir
    assert d is not None and os.path.isdir(d)
    s.close()
    assert not os.path.exists(d)


def test_a_deleted_file_is_refused_before_the_charge(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n")
    s = _session(f)
    s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)  # the file copied, the query's bind check remembered
    f.unlink()  # the copy is still there: the engine must not read it
    with pytest.raises(ConfigError) as e:  # the files' metadata (it is gone), checked before every charge
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    assert "t.csv" not in str(e.value) and "gone" in str(e.value) and "nothing was charged" in str(e.value)
    assert s.remaining().epsilon == 99.0
    s.close()


def test_a_file_deleted_during_the_read_is_the_generic_failure_after_the_charge(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n")
    s = _session(f)
    s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    check = s._engine.source_changed
    s._engine.source_changed = lambda view: (check(view), f.unlink())[0]  # gone after the check, before the read
    with pytest.raises(ExecutionError) as e:
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    assert "t.csv" not in str(e.value) and "failed" in str(e.value)
    assert s.remaining().epsilon == 98.0  # the charge stands
    s.close()


def test_a_file_modified_just_now_is_copied_at_every_read(tmp_path: Path) -> None:
    # file times are coarse: a rewrite in the same tick could keep (size, times), so a fresh file's
    # copy is never reused
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n")
    s = _session(f)
    s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    first = list(s._engine._csv.values())[0].copies
    s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    assert list(s._engine._csv.values())[0].copies != first and not os.path.exists(first[0])
    s.close()


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_gz_file_is_the_generic_failure_after_the_charge(tmp_path: Path, damage: str) -> None:
    """A .gz file cut short past its header line (a writer still at work) passes the checks before the charge and
    fails its copy after it: the generic failure, charged. Reading the whole stream before the charge would refuse
    it for free, but that read's time is the decompression's, which one person's rows decide (a 400 MB field
    compresses to a few kB): unpadded and outside the statement time-out, it told the analyst their size."""
    f = tmp_path / "t.csv.gz"
    data = gzip.compress(b"uid,amount\n" + b"".join(b"%d,5\n" % i for i in range(20000)))
    f.write_bytes(data)
    s = _session(f)
    s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    # the raw reader errors are EOFError (truncated) and zlib.error (corrupt): the charge still gives the one error
    f.write_bytes(data[: len(data) // 2] if damage == "truncated" else data[:40] + bytes(64) + data[104:])
    if damage == "corrupt":  # the header line no longer decompresses: refused before the charge, for free
        with pytest.raises(ConfigError, match="no longer a readable header") as c:
            s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        assert "gz" not in str(c.value) and s.remaining().epsilon == 99.0
        s.close()
        return
    with pytest.raises(ExecutionError) as e:
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    assert "failed" in str(e.value) and "gz" not in str(e.value)
    assert s.remaining().epsilon == 98.0  # the charge stands
    s.close()
