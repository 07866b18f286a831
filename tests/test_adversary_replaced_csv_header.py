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
