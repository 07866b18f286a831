"""A CSV file replaced after registration by one whose first line cannot be read as a header (an empty file, a
header in another encoding, a lone carriage return, or a file without a header whose first line is one person's
row) is refused before the charge, as a header that reads but differs is: the refusal must not depend on whether
that first line decodes (one person's non-UTF-8 byte once made the difference between a free refusal and a charged
failure)."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

ROWS = "".join(f"{i},{i % 5}\n" for i in range(1, 100)).encode()


@pytest.mark.parametrize("content", [
    b"",  # emptied
    b"uid,x\rjunk\n" + ROWS,  # a lone carriage return in the header line
    b"uid,\xe9x\n" + ROWS,  # a header in ISO-8859-1
    b"0,\xff\n" + ROWS,  # no header: the first line is one person's row, holding a byte that is not UTF-8
    b"0,3\n" + ROWS,  # negative control: no header, the first line decodes (refused as a changed header)
], ids=["empty", "cr", "latin1", "headerless_bad_byte", "headerless"])
def test_a_csv_file_whose_first_line_is_no_longer_a_header_is_refused_for_free(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"uid,x\n0,0\n" + ROWS)
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", str(path), privacy_unit="uid", columns={"x": {"type": "INTEGER", "bounds": (0, 10)}})
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1).table.to_pylist() == [{"n": 100}]
    new = tmp_path / "new.csv"
    new.write_bytes(content)
    new.replace(path)
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 't'.*header.*nothing was charged.*register"):
        s.query("SELECT SUM(x) FROM t", epsilon=1.0)
    assert s.remaining() == left and s.history().num_rows == 1
    s.close()


def _two_files(tmp_path: Path, second_header: str) -> str:
    (tmp_path / "a.csv").write_text("uid,x\n" + "".join(f"{i},1\n" for i in range(20)))
    # one person (uid 7) with 50 rows; under the header 'x,uid' the columns read positionally made each row a unit
    cols = second_header.split(",")
    (tmp_path / "b.csv").write_text(second_header + "\n" + "".join(
        ",".join("7" if c == "uid" else str(1000 + i) if c == "x" else "0" for c in cols) + "\n" for i in range(50)))
    return str(tmp_path / "*.csv")


def test_a_csv_source_whose_files_have_different_headers_is_refused_at_registration(tmp_path: Path) -> None:
    """The files of a source are read by position under the first file's header: a file whose header orders the
    columns otherwise read its person's 50 rows as 50 people, past max_rows_per_unit = 1."""
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    with pytest.raises(ConfigError, match=r"(?s)b\.csv.*header"):
        s.register("t", _two_files(tmp_path, "x,uid"), privacy_unit="uid", max_rows_per_unit=1,
                   columns={"x": {"type": "INTEGER", "bounds": (0, 10)}})
    s.close()


def test_a_second_csv_file_whose_header_changed_is_refused_before_the_charge(tmp_path: Path) -> None:
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    # negative control: the same header in both files is registered and read
    s.register("t", _two_files(tmp_path, "uid,x"), privacy_unit="uid", max_rows_per_unit=1,
               columns={"x": {"type": "INTEGER", "bounds": (0, 10)}})
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 20}]  # uid 7 is one of the 20
    _two_files(tmp_path, "x,uid")
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 't'.*header.*nothing was charged"):
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    assert s.remaining() == left
    s.close()


def test_a_csv_file_whose_header_changes_after_the_check_is_never_read_by_position(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The headers are checked before the charge, the files copied and read after it: a file replaced in between
    (an export rewritten while the query is charged) was copied and read by position under the registered header,
    so one person's 50 rows read as 50 people past max_rows_per_unit = 1 (COUNT(*) 70 instead of 20). The copy's
    header is checked against the registered one: such a read is the generic failure after the charge."""
    import dpsql.engine._duckdb_csv as csvcopy

    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", _two_files(tmp_path, "uid,x"), privacy_unit="uid", max_rows_per_unit=1,
               columns={"x": {"type": "INTEGER", "bounds": (0, 10)}})
    sql = "SELECT COUNT(*) AS n FROM t"
    assert s.query(sql, epsilon=1.0).table.to_pylist() == [{"n": 20}]
    copy = csvcopy.refresh

    def replaced_after_the_check(*args, **kwargs):  # type: ignore[no-untyped-def]
        _two_files(tmp_path, "x,uid")
        return copy(*args, **kwargs)

    monkeypatch.setattr(csvcopy, "refresh", replaced_after_the_check)
    with pytest.raises(dpsql.errors.ExecutionError, match="failed after its budget was charged"):
        s.query(sql, epsilon=1.0)
    monkeypatch.setattr(csvcopy, "refresh", copy)
    # the next request finds the change before its charge
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 't'.*header.*nothing was charged"):
        s.query(sql, epsilon=1.0)
    assert s.remaining() == left
    s.close()
