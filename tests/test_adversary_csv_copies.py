"""Adversarial review of the CSV copies (``dpsql/engine/_duckdb_csv.py``): DuckDB reads the engine's
copy of each file version, where ``\\r\\n`` is ``\\n`` and any other ``\\r`` a space.

What held (tests below): no byte sequence in one person's line splits or merges other people's
records in the copy (a seeded fuzz over ``\\r``, NUL, ``\\x1e``, U+2028, U+0085, a BOM, invalid
UTF-8, quotes, lines of several MB, a last line without ``\\n``); every private read path
(COUNT, GROUP BY over a public domain, quantiles, ``query_many``, ``suggest_caps``, joins of two
CSV sources, a public CSV key set, a second Session, unregister and register again) reads the copy,
never the owner's file.

Findings (fixed here): the copies -- a plaintext copy of each private file -- stayed on disk after
a process ended without closing its Session, and for good after a process was killed (SIGKILL:
now each copies' directory is locked by its process and removed by the next engine that makes
one in the same temp directory, never while its process lives or while it is being made);
they ignored the owner's ``temp_directory``; a failed
copy of a multi-file source left the copies already made behind (one more full copy per failed
query); copies removed by a temporary-files cleaner made every later read fail until the file
changed; a lone ``\\r`` in the header line raised Python's raw ``csv.Error`` at registration (now
a ConfigError naming the fix); the copy, Python code that DuckDB's interrupt does not reach, ran
past the owner's ``statement_timeout`` (so past a ``min_response_time`` set above it: a timing
channel on the file's size, i.e. on one person's field).
"""

from __future__ import annotations

import collections
import errno
import fcntl
import gzip
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

import dpsql
from dpsql.engine import _duckdb_csv as csvcopy
from dpsql.errors import ConfigError, ExecutionError
from dpsql.testing import use_noise, zero_noise

_RAW_OPTS = ("columns={'uid': 'VARCHAR', 'note': 'VARCHAR', 'amount': 'VARCHAR'}, header=true, auto_detect=false, "
             "delim=',', quote='', escape='', new_line='\\n', strict_mode=false, ignore_errors=true, parallel=true")


def _read(con: duckdb.DuckDBPyConnection, path: str) -> collections.Counter[tuple[Any, ...]]:
    return collections.Counter(con.execute(f"SELECT uid, note, amount FROM read_csv('{path}', {_RAW_OPTS})").fetchall())


# -- no byte sequence in one line splits or merges the records of others ------------------------------


def test_fuzz_one_persons_line_never_moves_other_records_in_the_copy(tmp_path: Path) -> None:
    """D' = D plus one line of random bytes drawn from the separators and encodings DuckDB's reader
    might treat specially. Read from the copy, the rows of D' are those of D plus at most one row.
    Negative control: the same reader on the raw files moves other records for the \\r payloads."""
    rnd = random.Random(20261201)
    n = 2000
    base = [b"uid,note,amount"] + [b"%d,abc,%d" % (i, i % 10) for i in range(n)]
    con = duckdb.connect()
    con.execute("SET threads = 2")
    raw = tmp_path / "d.csv"
    raw.write_bytes(b"\n".join(base) + b"\n")
    ref = _read(con, str(raw))
    assert sum(ref.values()) == n
    alphabet = [b"\r", b"\r\r", b"\x00", b",", b'"', b"\\", b"\x1e", b"\x0b", b"\x0c", "\u2028".encode(),
                "\u0085".encode(), b"\xef\xbb\xbf", b"\xff", b"\xc3", b"\t", b"900", b"901,x,1", b" ", b"'", b"#"]
    raw_moved = 0
    for trial in range(120):
        payload = b"".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 30)))
        lines = list(base)
        last = trial % 5 == 0
        if last:
            lines.append(b"7777," + payload)
        else:
            lines.insert(rnd.randint(1, n), b"7777," + payload)
        raw.write_bytes(b"\n".join(lines) + (b"" if last and trial % 2 else b"\n"))
        copy = csvcopy.clean_copy(str(raw), str(tmp_path), ".csv")
        got = _read(con, copy)
        os.unlink(copy)
        assert not ref - got and sum((got - ref).values()) <= 1, (payload, ref - got, got - ref)
        direct = _read(con, str(raw))
        raw_moved += bool(ref - direct) or sum((direct - ref).values()) > 1
    assert raw_moved >= 3, raw_moved  # negative control: the owner's file itself, read by DuckDB


@pytest.mark.parametrize("line", [
    b"7," + b"a\r" * 1_500_000 + b",1",  # a 3 MB line (over DuckDB's 2 MB line limit) of carriage returns
    b"7,hello\r\r\n900,x,100",  # \r\r\n: a space, then the end of the line (900 is a line of its own)
])
def test_long_lines_and_double_carriage_returns_stay_one_line(tmp_path: Path, line: bytes) -> None:
    base = [b"uid,note,amount"] + [b"%d,abc,%d" % (i, i % 10) for i in range(300)]
    con = duckdb.connect()
    f = tmp_path / "d.csv"
    f.write_bytes(b"\n".join(base) + b"\n")
    ref = _read(con, str(f))
    f.write_bytes(b"\n".join([*base[:5], line, *base[5:]]) + b"\n")
    with_line = _read(con, csvcopy.clean_copy(str(f), str(tmp_path), ".csv"))
    extra = sum((with_line - ref).values())
    assert not ref - with_line and extra <= line.count(b"\n") + 1


# -- every private read path reads the copy ------------------------------------------------------------


def _orders(with_person: bool) -> bytes:
    """Orders of people 0..49 (one each); person 7's note injects 40 orders of people 50..89 (users
    without orders)."""
    lines = ["oid,uid,note,amount"] + [f"{1000 + i},{i},ok,{i % 10}" for i in range(50) if i != 7]
    if with_person:
        lines.insert(8, "1007,7,hi" + "".join(f"\r{2000 + j},{50 + j},x,9" for j in range(40)))
    return ("\n".join(lines) + "\n").encode()


def _csv_session(tmp_path: Path, with_person: bool, *, join: bool = False) -> dpsql.Session:
    d = tmp_path / f"p{with_person}"
    d.mkdir(exist_ok=True)
    (d / "orders.csv").write_bytes(_orders(with_person))
    (d / "users.csv").write_bytes(("uid,country\n" + "".join(f"{i},{'AB'[i % 2]}\n" for i in range(100))).encode())
    (d / "countries.csv").write_bytes(b"country\nA\nB\n")
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 1e-3))
    use_noise(s, zero_noise())
    cols = {"amount": {"type": "DOUBLE", "bounds": (0, 10)}, "note": {"domain": ["ok", "hi", "x"]}}
    if join:
        s.register("countries", str(d / "countries.csv"), public=True)
        s.register("users", str(d / "users.csv"), privacy_unit="uid", max_rows_per_unit=1,
                   references={"country": "countries.country"})
        s.register("orders", str(d / "orders.csv"), references={"uid": "users.uid"}, degree_bounds={"uid": 1},
                   columns=cols)
    else:
        s.register("orders", str(d / "orders.csv"), privacy_unit="uid", max_rows_per_unit=1, columns=cols)
    return s


def _pair(tmp_path: Path, run: Any, *, join: bool = False) -> list[Any]:
    out = []
    for with_person in (False, True):
        s = _csv_session(tmp_path, with_person, join=join)
        try:
            out.append(run(s))
        finally:
            s.close()
    return out


def _total(rows: list[dict[str, Any]], key: str) -> float:
    return sum(float(r[key] or 0) for r in rows)


def test_counts_group_by_and_quantiles_read_the_copy(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, lambda s: (
        s.query("SELECT COUNT(*) AS n, COUNT(DISTINCT uid) AS p FROM orders", epsilon=1.0, delta=1e-6).table.to_pylist(),
        s.query("SELECT note, COUNT(*) AS n FROM orders GROUP BY note", epsilon=1.0).table.to_pylist(),
        s.query("SELECT MAX(amount) AS m FROM orders WHERE uid >= '50' AND uid < '90'", epsilon=5.0).table.to_pylist(),
    ))
    assert a[0] == [{"n": 49, "p": 49}]
    assert b[0][0]["n"] - 49 <= 1 and b[0][0]["p"] - 49 <= 1, b[0]
    assert _total(b[1], "n") - _total(a[1], "n") <= 1, (a[1], b[1])  # the 40 'x' orders are not there
    assert {r["note"]: r["n"] for r in b[1]}.get("x", 0) == 0


def test_workloads_and_caps_advice_read_the_copy(tmp_path: Path) -> None:
    wl = ["SELECT COUNT(*) FROM orders WHERE amount BETWEEN 0 AND 4.5", "SELECT COUNT(*) FROM orders WHERE amount >= 5"]

    def run(s: dpsql.Session) -> Any:
        s.register("orders", s._catalog["orders"].source, privacy_unit="uid", max_rows_per_unit=1,
                   columns={"amount": {"type": "DOUBLE", "bounds": (0, 10), "bins": 10}})  # registered again
        many = s.query_many(wl, epsilon=1.0).table.to_pylist()
        caps = s.suggest_caps("orders", epsilon=1.0).table.to_pylist()
        return many, caps

    a, b = _pair(tmp_path, run)
    assert abs(_total(b[0], "count") - _total(a[0], "count")) <= 1, (a[0], b[0])
    assert abs(_total(b[1], "people") - _total(a[1], "people")) <= 1, (a[1], b[1])  # 49 people, then 50


def test_joins_of_csv_sources_and_a_public_csv_key_set_read_the_copies(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, lambda s: (
        s.query("SELECT COUNT(*) AS n FROM orders o JOIN users u ON o.uid = u.uid", epsilon=1.0).table.to_pylist(),
        s.query("SELECT c.country, COUNT(*) AS n FROM users u JOIN countries c ON u.country = c.country "
                "JOIN orders o ON o.uid = u.uid GROUP BY c.country", epsilon=1.0, delta=1e-6).table.to_pylist(),
    ), join=True)
    assert abs(b[0][0]["n"] - a[0][0]["n"]) <= 1, (a[0], b[0])  # a join mechanism: zero noise, its own bias
    assert _total(b[1], "n") - _total(a[1], "n") <= 1, (a[1], b[1])


def test_a_second_session_and_explain_on_the_same_file(tmp_path: Path) -> None:
    s1 = _csv_session(tmp_path, True)
    s2 = _csv_session(tmp_path, True)
    try:
        q = "SELECT COUNT(DISTINCT uid) AS p FROM orders"
        s1.explain(q, epsilon=1.0)
        assert s1._engine._csv_dir is None  # nothing copied by explain
        assert s1.query(q, epsilon=1.0).table.to_pylist() == [{"p": 50}]
        s1.close()
        assert s2.query(q, epsilon=1.0).table.to_pylist() == [{"p": 50}]
    finally:
        s1.close()
        s2.close()


def test_negative_control_a_plain_copy_fails_the_read_path_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the owner's bytes copied as they are, each read-path test above fails."""
    def plain(path: str, out_dir: str, suffix: str, until: float | None = None, encoding: str = "utf-8") -> str:
        fd, out = tempfile.mkstemp(dir=out_dir, suffix=suffix)
        os.close(fd)
        shutil.copyfile(path, out)
        return out

    monkeypatch.setattr(csvcopy, "clean_copy", plain)
    for i, check in enumerate((test_counts_group_by_and_quantiles_read_the_copy, test_workloads_and_caps_advice_read_the_copy,
                               test_joins_of_csv_sources_and_a_public_csv_key_set_read_the_copies,
                               test_a_second_session_and_explain_on_the_same_file)):
        (tmp_path / str(i)).mkdir()
        with pytest.raises(AssertionError):
            check(tmp_path / str(i))


# -- findings: where the copies live and when they go ------------------------------------------------


def test_copies_are_removed_when_the_process_ends_without_closing_the_session(tmp_path: Path) -> None:
    """FINDING (fixed): a Session never closed left the plaintext copy of every CSV it read in
    the system's temporary directory after the process ended."""
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n2,6\n")
    code = textwrap.dedent(f"""
        import os, dpsql
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
        s.register("t", {str(f)!r}, privacy_unit="uid", max_rows_per_unit=1)
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        d = s._engine._csv_dir
        print(d, len(os.listdir(d)))
        if os.fork() == 0:  # a child that exits normally must not remove its parent's copies
            os._exit(0 if os.path.isdir(d) else 1)
        pid, status = os.wait()
        print(status, len(os.listdir(d)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    first, second = out.stdout.split("\n")[:2]
    d, n = first.split()
    assert n == "1" and second == "0 1"  # the copy existed while the process ran; the child left it
    assert not os.path.exists(d), os.listdir(d)


def test_a_forked_child_ending_normally_keeps_its_parents_copies(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n2,6\n")
    code = textwrap.dedent(f"""
        import os, sys, dpsql
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3))
        s.register("t", {str(f)!r}, privacy_unit="uid", max_rows_per_unit=1)
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        d = s._engine._csv_dir
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # runs the interpreter's exit handlers in the child
        os.waitpid(pid, 0)
        print(os.path.isdir(d) and len(os.listdir(d)))
        s.close()
        print(os.path.exists(d))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["1", "False"], out.stdout + out.stderr


def test_copies_go_to_the_owners_temp_directory(tmp_path: Path) -> None:
    """FINDING (fixed): the owner's ``temp_directory`` (where the engine may write temporary data)
    was ignored: the copies went to the system's temporary directory."""
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n")
    spill = tmp_path / "owner-temp" / "dpsql"
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine={"temp_directory": str(spill)})
    s.register("t", str(f), privacy_unit="uid", max_rows_per_unit=1)
    s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    d = s._engine._csv_dir
    assert d is not None and Path(d).parent == spill and len(os.listdir(d)) == 1
    assert os.stat(d).st_mode & 0o077 == 0 and os.stat(os.path.join(d, os.listdir(d)[0])).st_mode & 0o077 == 0
    s.close()
    assert not os.path.exists(d)


def test_a_failed_copy_of_a_multi_file_source_leaves_no_copy_behind(tmp_path: Path) -> None:
    """FINDING (fixed): when the second file of a glob failed to copy (a corrupt .gz), the copy of
    the first stayed in the engine's directory: one more full copy per failed query until close."""
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(b"uid,amount\n" + b"1,5\n" * 1000))
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(b"uid,amount\n2,6\n"))
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    s.register("t", str(tmp_path / "*.csv.gz"), privacy_unit="uid", max_rows_per_unit=1)
    s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    d = s._engine._csv_dir
    assert d is not None and len(os.listdir(d)) == 2
    # truncated past its header line (which the check before the charge reads): the copy fails after the charge
    b = gzip.compress(b"uid,amount\n" + b"".join(b"%d,%d\n" % (i, i * 7919 % 10007) for i in range(20000)))
    (tmp_path / "b.csv.gz").write_bytes(b[: len(b) // 2])
    for _ in range(3):
        with pytest.raises(ExecutionError):
            s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
    assert len(os.listdir(d)) == 2  # the last good copies only
    s.close()


def test_copies_removed_by_a_temp_cleaner_are_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FINDING (fixed): a cleaner of temporary files (e.g. systemd-tmpfiles on a long-running
    service) removing the copies, or their directory, made every later read of a settled file the
    generic failure (charged) until the file changed."""
    monkeypatch.setattr(csvcopy, "settled", lambda version: True)  # as if written long ago: copies kept
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n2,6\n")
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", str(f), privacy_unit="uid", max_rows_per_unit=1)
    q = "SELECT COUNT(*) AS n FROM t"
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 2}]
    d = s._engine._csv_dir
    assert d is not None
    for c in os.listdir(d):
        os.unlink(os.path.join(d, c))
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 2}]
    d = s._engine._csv_dir
    assert d is not None
    for c in os.listdir(d):
        os.unlink(os.path.join(d, c))
    os.rmdir(d)
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"n": 2}]
    new = s._engine._csv_dir
    assert d not in csvcopy._OWN and new in csvcopy._OWN  # the vanished directory's lock was given up
    s.close()
    assert new is not None and new not in csvcopy._OWN and not os.path.exists(new)


def test_a_carriage_return_in_the_header_line_is_refused_clearly(tmp_path: Path) -> None:
    """FINDING (fixed): the header line is read from the owner's file (the rows from the copy): a
    lone \\r in it raised Python's raw ``csv.Error`` out of ``register``. It is now a ConfigError
    naming the fix: a file whose lines end in \\r alone would otherwise read as one line (no row)."""
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,note,amount\r\n1,a,5\r\n2,b,6\n")  # \r\n and \n line ends read as before
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", str(f), privacy_unit="uid", max_rows_per_unit=1, columns={"amount": {"type": "DOUBLE", "bounds": (0, 10)}})
    assert s.query("SELECT SUM(amount) AS a FROM t", epsilon=1.0).table.to_pylist() == [{"a": 11.0}]
    for raw in (b"uid,no\rte,amount\n1,a,5\n", b"uid,amount\r1,5\r2,6\r", b"uid,amount\r\r\n1,5\n"):
        f.write_bytes(raw)
        with pytest.raises(ConfigError, match="carriage return"):
            s.register("u", str(f), privacy_unit="uid", max_rows_per_unit=1)
    s.close()


@pytest.mark.parametrize("name", ["t.tsv", "t.csv.gz"])  # (.tsv.gz is not a registered format)
def test_tab_separated_and_gzip_sources_read_the_copy(tmp_path: Path, name: str) -> None:
    delim = "\t" if ".tsv" in name else ","
    counts = []
    for with_person in (False, True):
        lines = [delim.join(["uid", "note"])] + [delim.join([str(i), "ok"]) for i in range(60) if i != 7]
        if with_person:
            lines.insert(8, delim.join(["7", "hi" + "".join(f"\r{900 + j}{delim}x" for j in range(20))]))
        raw = ("\n".join(lines) + "\n").encode()
        f = tmp_path / f"{with_person}{name}"
        f.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
        s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
        use_noise(s, zero_noise())
        s.register("t", str(f), privacy_unit="uid", max_rows_per_unit=1)
        counts.append(s.query("SELECT COUNT(DISTINCT uid) AS p FROM t", epsilon=1.0).table.to_pylist()[0]["p"])
        s.close()
    assert counts == [59, 60], counts


def test_a_same_size_rewrite_with_its_old_mtime_or_a_rename_is_copied_again(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The settle rule with the file's times restored: ctime (and the inode, for a rename) still
    tells the new version, so the copy of the old one is never read again."""
    monkeypatch.setattr(csvcopy, "settled", lambda version: True)  # every version trusted at once
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n2,5\n")
    st = f.stat()
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register("t", str(f), privacy_unit="uid", max_rows_per_unit=1, columns={"amount": {"type": "DOUBLE", "bounds": (0, 10)}})
    q = "SELECT SUM(amount) AS a FROM t"
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"a": 10.0}]
    f.write_bytes(b"uid,amount\n1,9\n2,9\n")  # same size, in place
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # its old mtime back
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"a": 18.0}]
    g = tmp_path / "new.csv"
    g.write_bytes(b"uid,amount\n1,7\n2,7\n")
    os.utime(g, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(g, f)  # replaced by a rename
    assert s.query(q, epsilon=1.0).table.to_pylist() == [{"a": 14.0}]
    s.close()


def test_the_copy_runs_under_the_statement_time_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FINDING (fixed): the copy is Python code, which DuckDB's interrupt does not reach, so it ran
    past the owner's ``statement_timeout``: one person's 300 MB field made the first read answer
    in 0.81 s under a 0.3 s time-out (measured), beyond a ``min_response_time`` set above the
    time-out to hide run times. The copy now checks the deadline at every chunk: the read is the
    generic failure at the time-out (0.33 s measured), its charge stands, no copy is left."""
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n2,6\n")
    clock = iter([0.0])  # the deadline is set at 0 + time-out; every later reading of the clock is past it

    def late() -> float:
        return next(clock, 1e9)

    def run(timeout: float | None) -> Any:
        s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine={"statement_timeout": timeout})
        use_noise(s, zero_noise())
        s.register("t", str(f), privacy_unit="uid", max_rows_per_unit=1)
        try:
            return s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist()
        except ExecutionError:
            d = s._engine._csv_dir
            assert d is not None and os.listdir(d) == []  # the partial copy is gone
            assert s.remaining().epsilon == 99.0  # the charge stands
            return "failed"
        finally:
            s.close()

    monkeypatch.setattr(csvcopy, "now", late)
    assert run(30.0) == "failed"
    assert run(None) == [{"n": 2}]  # negative control: no time-out, no deadline
    monkeypatch.undo()
    assert run(30.0) == [{"n": 2}]
    with pytest.raises(TimeoutError):  # the unit: a deadline already past
        csvcopy.clean_copy(str(f), str(tmp_path), ".csv", until=csvcopy.now() - 1)


# -- copies left by a killed process: each directory is locked by its process, swept once it is gone -----


def _open_and_read(f: Path, spill: Path, before_read: str = "") -> str:
    """A script: a Session whose copies go under ``spill`` registers the CSV file ``f``, runs
    ``before_read``, reads the file once and prints its copies' directory and how many copies it
    holds."""
    return textwrap.dedent(f"""
        import os, signal, sys, dpsql
        from dpsql.engine import _duckdb_csv as csvcopy
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine={{"temp_directory": {str(spill)!r}}})
        s.register("t", {str(f)!r}, privacy_unit="uid", max_rows_per_unit=1)
        {before_read}
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        d = s._engine._csv_dir
        print(d, len(os.listdir(d)), flush=True)
    """)


def _csv_file(tmp_path: Path) -> Path:
    f = tmp_path / "t.csv"
    f.write_bytes(b"uid,amount\n1,5\n2,6\n")
    return f


def _killed_copies(tmp_path: Path, spill: Path) -> str:
    """The copies' directory of a process SIGKILLed after a CSV query: still on disk, with its copy."""
    code = _open_and_read(_csv_file(tmp_path), spill) + "os.kill(os.getpid(), signal.SIGKILL)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out.stdout + out.stderr
    d, n = out.stdout.split()
    assert n == "1" and os.listdir(d) and Path(d).parent == spill  # no exit handler ran: the copy stayed
    return d


class _Lines:
    """The lines a subprocess prints, read by a thread so that waiting for one never blocks the
    test for good (a guard against a hung subprocess, not a timed assert)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.proc = proc
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def next(self) -> str | None:
        try:
            return self.queue.get(timeout=120)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError("the subprocess printed nothing in 120 s") from None


def test_copies_of_a_killed_process_are_removed_by_the_next_processs_first_csv_read(tmp_path: Path) -> None:
    """FINDING (fixed): a process killed by SIGKILL (no exit handler runs) left the plaintext copy of
    every CSV file it read on disk for good. Its directory's lock died with it: the next engine to
    make a copies' directory in the same temp directory removes it, at its first CSV read.
    Negative control: an engine whose copies go elsewhere leaves it (the sweep is of its own temp
    directory), and registering (no copy made) does not sweep."""
    spill, other = tmp_path / "spill", tmp_path / "elsewhere"
    d = _killed_copies(tmp_path, spill)
    for where, after in ((other, "True"), (spill, "False")):
        show = "print(os.path.isdir(sys.argv[1]), flush=True)"
        code = _open_and_read(tmp_path / "t.csv", where, show) + show + "\n"
        out = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True, timeout=120, check=True)
        before, line, now = out.stdout.split("\n")[:3]
        assert (before, now) == ("True", after), (where, out.stdout, out.stderr)
        assert line.split()[1] == "1" and line.split()[0] != d
    assert not os.path.exists(d) and os.listdir(spill) == []  # the follower's own copies went at its normal exit


def test_a_live_processs_copies_are_never_swept(tmp_path: Path) -> None:
    """Another process that is alive (here waiting on its standard input) holds its directory's
    lock: sweeps of other processes (a Session's first CSV read, the sweep itself) leave its copies.
    Negative control: once that process is SIGKILLed, the same sweep removes them."""
    spill = tmp_path / "spill"
    code = _open_and_read(_csv_file(tmp_path), spill) + "sys.stdin.read()\nos._exit(0)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = _Lines(proc)
        line = lines.next()
        assert line is not None, proc.returncode
        d = line.split()[0]
        before = sorted(os.listdir(d))
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine={"temp_directory": str(spill)})
        use_noise(s, zero_noise())
        s.register("t", str(tmp_path / "t.csv"), privacy_unit="uid", max_rows_per_unit=1)
        assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 2}]
        assert csvcopy.sweep(str(spill)) == 0
        assert sorted(os.listdir(d)) == before and len(before) == 1  # the live process's copy is whole
        assert proc.poll() is None  # (it was alive all along: it waits for its standard input)
        proc.kill()
        proc.wait(timeout=120)
        assert csvcopy.sweep(str(spill)) == 1 and not os.path.exists(d)  # negative control
        own = s._engine._csv_dir
        assert own is not None and os.listdir(own)  # this process's own directory is never its own sweep's
        assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 2}]
        s.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=120)


def test_a_second_engine_of_the_process_never_sweeps_the_firsts_copies(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    f = _csv_file(tmp_path)
    sessions = []
    for _ in range(2):
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine={"temp_directory": str(spill)})
        use_noise(s, zero_noise())
        s.register("t", str(f), privacy_unit="uid", max_rows_per_unit=1)
        assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 2}]
        sessions.append(s)
    dirs = [s._engine._csv_dir for s in sessions]
    assert len(set(dirs)) == 2 and all(d is not None and len(os.listdir(d)) == 1 for d in dirs)
    assert csvcopy.sweep(str(spill)) == 0
    for s in sessions:
        s.close()
    assert os.listdir(spill) == []


def test_a_directory_locked_by_another_descriptor_of_this_process_is_kept(tmp_path: Path) -> None:
    """flock locks conflict between two open descriptions even in one process: a directory locked
    outside the engine's own bookkeeping is left. Negative control: unlocked, it is removed."""
    d = tmp_path / f"dpsql-csv-{os.getpid()}-{'ab' * 8}"
    d.mkdir()
    (d / "x.csv").write_bytes(b"private\n")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert csvcopy.sweep(str(tmp_path)) == 0 and (d / "x.csv").exists()
    finally:
        os.close(fd)
    assert csvcopy.sweep(str(tmp_path)) == 1 and not d.exists()


def test_a_directory_being_made_and_anything_not_named_exactly_are_never_swept(tmp_path: Path) -> None:
    """A copies' directory is made under a first name (``mkdtemp``'s: the pid and 8 characters),
    locked, then renamed to its final name (the pid and 16 hex digits): so a directory another
    process has just made and not yet locked is under its first name, which no sweep removes.
    Nor does a sweep remove a name that is not exactly a final one, a symlink (nor what it points
    to), or a file. Negative control: in the same sweep, an unlocked directory under a final name
    (its process gone) is removed."""
    pid, hex16 = os.getpid(), "0123456789abcdef"
    being_made = Path(tempfile.mkdtemp(prefix=f"dpsql-csv-{pid}-", dir=tmp_path))  # not locked yet
    outside = tmp_path / "outside"
    outside.mkdir()
    kept = [being_made, outside]
    for name in (f"dpsql-csv-{pid}-{hex16[:15]}", f"dpsql-csv-{pid}-{hex16.upper()}", f"dpsql-csv-{pid}-{hex16}0",
                 f"dpsql-csv-x{pid}-{hex16}", f"dpsql-csv--{hex16}", f"dpsql-csv-{pid}-{hex16}.old", f"xdpsql-csv-{pid}-{hex16}",
                 f"dpsql-csv-{pid}-{hex16}\n"):
        (tmp_path / name).mkdir()
        kept.append(tmp_path / name)
    link = tmp_path / f"dpsql-csv-{pid}-{'1' * 16}"
    link.symlink_to(outside, target_is_directory=True)
    a_file = tmp_path / f"dpsql-csv-{pid}-{'2' * 16}"
    a_file.write_bytes(b"x")
    kept += [link, a_file]
    for k in kept:
        if k.is_dir() and not k.is_symlink():
            (k / "x.csv").write_bytes(b"private\n")
    gone = tmp_path / f"dpsql-csv-{pid}-{hex16}"
    gone.mkdir()
    (gone / "x.csv").write_bytes(b"private\n")
    assert csvcopy.sweep(str(tmp_path)) == 1
    assert not gone.exists()  # negative control
    assert all(os.path.lexists(k) for k in kept) and (outside / "x.csv").exists() and (being_made / "x.csv").exists()
    assert link.is_symlink() and a_file.read_bytes() == b"x"


def test_a_directory_is_locked_before_it_has_its_final_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The moment a sweep could see the directory under its final name, it is locked already."""
    seen = []
    rename = os.rename

    def watch(src: str, dst: str) -> None:
        fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        seen.append((Path(src).name, Path(dst).name))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", watch)
    d = csvcopy.make_dir(str(tmp_path))
    monkeypatch.undo()
    assert len(seen) == 1 and Path(d).name == seen[0][1] and os.listdir(tmp_path) == [Path(d).name]
    first = seen[0][0]
    assert first.startswith(f"dpsql-csv-{os.getpid()}-") and len(first) == len(f"dpsql-csv-{os.getpid()}-") + 8
    assert csvcopy.sweep(str(tmp_path)) == 0  # (the process's own directory, and locked)
    csvcopy.remove_dir(d)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("child_keeps_a_descriptor", [False, True])
def test_a_forked_child_does_not_keep_its_killed_parents_copies(tmp_path: Path, child_keeps_a_descriptor: bool) -> None:
    """flock locks belong to the open file description, which fork shares: the at-fork hook closes
    the child's inherited descriptor of the directory, so a parent SIGKILLed while its child lives
    on leaves copies that a sweep removes. Negative control: a child holding another descriptor of
    the directory (a dup made before the fork, which the hook does not know) keeps it locked, and
    the sweep leaves it until that child ends."""
    spill = tmp_path / "spill"
    code = _open_and_read(_csv_file(tmp_path), spill) + textwrap.dedent(f"""
        if {child_keeps_a_descriptor}:
            extra = os.dup(csvcopy._OWN[d][0])
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(ready_w, b"1")  # fork has returned here: the at-fork hooks have run
            sys.stdin.read()  # alive until the test closes its standard input
            print("child done", flush=True)
            os._exit(0)
        os.read(ready_r, 1)  # killed only once the child's hooks have run (else the sweep races them)
        print(pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = _Lines(proc)
        first, child = lines.next(), lines.next()
        assert first is not None and child is not None
        d = first.split()[0]
        assert proc.wait(timeout=120) == -9 and os.listdir(d)
        assert csvcopy.sweep(str(spill)) == (0 if child_keeps_a_descriptor else 1)
        assert os.path.exists(d) == child_keeps_a_descriptor
        assert proc.stdin is not None
        proc.stdin.close()  # the child, alive during the sweep, now ends
        assert lines.next() == "child done" and lines.next() is None
        if child_keeps_a_descriptor:
            assert csvcopy.sweep(str(spill)) == 1 and not os.path.exists(d)  # its lock ended with the child
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=120)


def test_a_failed_sweep_never_fails_the_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep is best-effort: whatever it raises, the query answers (and it is charged once)."""
    def broken(*args: Any) -> int:
        raise RuntimeError("sweep failed")

    stale = tmp_path / "spill" / f"dpsql-csv-{os.getpid()}-{'c' * 16}"
    stale.mkdir(parents=True)
    monkeypatch.setattr(csvcopy, "_sweep_one", broken)
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-3), engine={"temp_directory": str(tmp_path / "spill")})
    use_noise(s, zero_noise())
    s.register("t", str(_csv_file(tmp_path)), privacy_unit="uid", max_rows_per_unit=1)
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0).table.to_pylist() == [{"n": 2}]
    assert s.remaining().epsilon == 9.0 and stale.exists()
    s.close()
    monkeypatch.undo()
    assert csvcopy.sweep(str(tmp_path / "spill")) == 1 and not stale.exists()  # negative control


def test_without_directory_locks_the_copies_keep_their_first_name_and_nothing_is_swept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where flock fails (a file system without it) the directory keeps its first name, which no
    sweep removes (as before: copies of a killed process stay); without fcntl (Windows) there is no
    lock and no sweep."""
    class NoLocks:
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd: int, op: int) -> None:
            raise OSError(errno.ENOLCK, "no locks")

    stale = tmp_path / f"dpsql-csv-{os.getpid()}-{'d' * 16}"
    stale.mkdir()
    monkeypatch.setattr(csvcopy, "fcntl", NoLocks)
    d = csvcopy.make_dir(str(tmp_path))
    assert len(Path(d).name) == len(f"dpsql-csv-{os.getpid()}-") + 8 and d not in csvcopy._OWN
    assert stale.exists()  # (the sweep ran, but took no lock)
    monkeypatch.setattr(csvcopy, "fcntl", None)
    e = csvcopy.make_dir(str(tmp_path))
    assert len(Path(e).name) == len(f"dpsql-csv-{os.getpid()}-") + 8 and csvcopy.sweep(str(tmp_path)) == 0
    monkeypatch.undo()
    assert csvcopy.sweep(str(tmp_path)) == 1 and not stale.exists() and os.path.isdir(d) and os.path.isdir(e)
    csvcopy.remove_dir(d)
    csvcopy.remove_dir(e)
