"""CSV text that is not UTF-8 (a Latin-1 file).

DuckDB's CSV reader (with ``ignore_errors``) dropped a line holding invalid UTF-8 only when the query
read one of its text columns: over a Latin-1 file ``COUNT(*)`` counted every row, ``COUNT(name)`` only
the ASCII ones, ``SUM(amount)`` summed every row and ``WHERE name IS NULL`` matched none of them, so
answers disagreed with each other according to the columns a query read. Refusing such a file at
registration would read data rows there and make an error depend on one person's row (registration
reads the header only), so the engine's copy of each file version (``dpsql.engine._duckdb_csv``)
decides it, line by line, the same for every query: a file in another encoding is declared by the
owner with the engine setting ``csv_encoding = "latin-1"`` (transcoded to UTF-8 in the copy), and
under the default ``"utf-8"`` a line that is not valid UTF-8 is left out of the copy, so every query
skips it alike (as docs/threat_model.md always said it did). A header line that is not UTF-8 is
public metadata: refused at registration, naming the setting."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import dpsql
from dpsql.engine import _duckdb_csv as csvcopy
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

ROWS = b"uid,name,amount\n1,Jos\xe9,10\n2,Ana,20\n3,Ren\xe9e,30\n4,Bob,40\n"
QUERIES = {
    "rows": "SELECT COUNT(*) AS n FROM t",
    "names": "SELECT COUNT(name) AS n FROM t",
    "null_names": "SELECT COUNT(*) AS n FROM t WHERE name IS NULL",
    "amount": "SELECT SUM(amount) AS n FROM t",
}


def answers(path: Path, engine: dict[str, Any] | None = None, extra: dict[str, str] | None = None) -> dict[str, Any]:
    with dpsql.Session(budget=dpsql.Budget(1e4, 1e-3), engine=engine) as s:
        use_noise(s, zero_noise(1))
        s.register("t", str(path), privacy_unit="uid", columns={"amount": {"type": "INTEGER", "bounds": (0, 100)}})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {k: s.query(q, epsilon=50.0).to_pylist()[0]["n"] for k, q in {**QUERIES, **(extra or {})}.items()}


def test_every_query_sees_the_same_rows_of_a_latin1_file(tmp_path: Path) -> None:
    p = tmp_path / "l1.csv"
    p.write_bytes(ROWS)
    assert answers(p) == {"rows": 2, "names": 2, "null_names": 0, "amount": 60.0}  # Ana and Bob, in every query


def test_a_latin1_file_declared_as_such_reads_its_text(tmp_path: Path) -> None:
    p = tmp_path / "l1.csv"
    p.write_bytes(ROWS.replace(b"uid,name", b"uid,pr\xe9nom").replace(b"Ana", b"\xc5sa"))
    with dpsql.Session(budget=dpsql.Budget(1e4, 1e-3), engine={"csv_encoding": "latin-1"}) as s:
        use_noise(s, zero_noise(1))
        s.register("t", str(p), privacy_unit="uid")
        assert "prénom" in s.tables["t"].schema
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            n = s.query("SELECT COUNT(*) AS n FROM t WHERE prénom IN ('José', 'Åsa', 'Renée')", epsilon=50.0)
        assert n.to_pylist() == [{"n": 3}]


def test_a_header_that_is_not_utf8_names_the_setting(tmp_path: Path) -> None:
    p = tmp_path / "h.csv"
    p.write_bytes(b"uid,pr\xe9nom\n1,x\n")
    with dpsql.Session(budget=dpsql.Budget(1.0)) as s:
        with pytest.raises(ConfigError) as e:
            s.register("t", str(p), privacy_unit="uid")
    assert "UTF-8" in str(e.value) and 'csv_encoding = "latin-1"' in (e.value.hint or ""), (str(e.value), e.value.hint)


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_the_copy_decodes_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str) -> None:
    """A character split by a chunk boundary is one character; a line that is not UTF-8 is left out,
    and only that line."""
    monkeypatch.setattr(csvcopy, "_CHUNK", 3)
    src = tmp_path / "s.csv"
    text = "a,\u00e9\u20ac\U0001f600\r\nb,x\r\n" if encoding == "utf-8" else "a,\u00e9\u00c5\r\nb,\u00ff\r\n"
    raw = text.encode(encoding)
    bad = b"c,\xff\xfe\r\nd,\xc3\xa9\n\xc3" if encoding == "utf-8" else b""
    src.write_bytes(raw + bad)
    out = Path(csvcopy.clean_copy(str(src), str(tmp_path), ".csv", encoding=encoding)).read_bytes()
    want = text.replace("\r\n", "\n") + ("d,\u00e9\n" if encoding == "utf-8" else "")
    assert out.decode("utf-8") == want


def test_a_line_longer_than_any_read_is_left_out_without_holding_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(csvcopy, "_CHUNK", 4)
    monkeypatch.setattr(csvcopy, "_LONG_LINE", 10)
    src = tmp_path / "s.csv"
    src.write_bytes(b"a,b\n1," + b"x" * 40 + b"\n2,y\n3," + b"z" * 40)
    assert Path(csvcopy.clean_copy(str(src), str(tmp_path), ".csv")).read_bytes() == b"a,b\n2,y\n"


def test_the_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="csv_encoding"):
        dpsql.Session(budget=dpsql.Budget(1.0), engine={"csv_encoding": "cp1252"})
