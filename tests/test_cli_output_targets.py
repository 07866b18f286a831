"""-o and --meta never overwrite what the command reads or records: the ledger and its side files,
the config, a table's source, or each other. Each is refused before the charge (exit 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli as run

CFG = ["--config", "examples/dpsql.toml"]
Q = ["query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1"]
LEDGER = "examples/example_ledger.duckdb"


def _entries(capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    assert run([*CFG, "budget", "--history", "--format", "json"]) == 0
    return len(json.loads(capsys.readouterr().out)["entries"])


def _ledger_files(workdir: Path) -> dict[str, bytes]:
    d = workdir / "examples"
    return {p.name: p.read_bytes() for p in d.iterdir()
            if p.name.startswith((".example_ledger", "example_ledger")) and not p.name.endswith(".queue")}  # the queue's tail moves


@pytest.mark.parametrize("flag", ["-o", "--meta"])
@pytest.mark.parametrize("target", [LEDGER, "examples/.example_ledger.duckdb.generation", "examples/.example_ledger.duckdb.queue",
                                    "examples/./../examples/example_ledger.duckdb",
                                    "link.duckdb", "examples/dpsql.toml", "examples/events.parquet"])
def test_output_onto_the_ledger_config_or_a_source_is_refused_before_the_charge(
        workdir: Path, capsys: pytest.CaptureFixture[str], flag: str, target: str) -> None:
    assert run([*CFG, *Q]) == 0  # the ledger exists and holds one entry
    os.symlink(LEDGER, "link.duckdb")
    before, files = _entries(capsys), _ledger_files(workdir)
    kept = {t: Path(t).read_bytes() for t in ("examples/dpsql.toml", "examples/events.parquet")}
    extra = ["--format", "csv"] if flag == "-o" else []
    assert run([*CFG, *Q, flag, target, *extra]) == 2
    err = capsys.readouterr().err
    assert flag in err and "hint:" in err and "Traceback" not in err
    assert _entries(capsys) == before == 1
    assert _ledger_files(workdir) == files
    assert {t: Path(t).read_bytes() for t in kept} == kept


def test_rows_and_meta_into_one_file_is_refused_before_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CFG, "budget"]) == 0
    assert run([*CFG, *Q, "-o", "out.json", "--meta", "./out.json"]) == 2
    err = capsys.readouterr().err
    assert "-o" in err and "--meta" in err and "hint:" in err
    assert _entries(capsys) == 0 and not Path("out.json").exists()
    # distinct files still work
    assert run([*CFG, *Q, "-o", "out.json", "--meta", "meta.json"]) == 0
    assert json.loads(Path("out.json").read_text())["rows"] and json.loads(Path("meta.json").read_text())["ledger_id"] == 1


@pytest.mark.parametrize(("flag", "name"), [("-o", "q.txt"), ("--meta", "q.sql"), ("--meta", "./q.sql")])
def test_output_onto_the_sql_file_is_refused_before_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                               flag: str, name: str) -> None:
    """`-f q.sql --meta q.sql` replaced the query file with the meta after the charge: the job's SQL was lost."""
    sql = "SELECT COUNT(*) AS n FROM events\n"
    Path(name).write_text(sql)
    assert run([*CFG, "query", "-f", name, "--epsilon", "0.1", flag, name]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {name!r} would overwrite the SQL file given with -f" in err and "hint:" in err, err
    assert Path(name).read_text() == sql
    assert _entries(capsys) == 0


@pytest.mark.parametrize("out", ["r.csv", "r.json", "r.parquet"])
def test_a_ledger_read_failing_after_the_release_still_delivers_it(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, out: str) -> None:
    """The remaining budget is read after the charge was committed: if that read fails (the ledger
    busy past the lock timeout), the answered and charged release is still written."""
    from dpsql.errors import LedgerError
    from dpsql.ledger import Ledger

    assert run([*CFG, "budget"]) == 0

    def busy(self: Ledger) -> None:
        raise LedgerError("ledger is locked by another dpsql operation; gave up after 10 s of waiting for it; nothing was changed")

    with monkeypatch.context() as m:
        m.setattr(Ledger, "remaining", busy)
        assert run([*CFG, *Q, "-o", out, "--meta", "m.json"]) == 0
    err = capsys.readouterr().err
    assert "ledger entry 1" in err and "remaining budget could not be read" in err
    assert Path(out).stat().st_size > 0
    meta = json.loads(Path("m.json").read_text())
    assert meta["ledger_id"] == 1 and "remaining" not in meta
    assert _entries(capsys) == 1


def test_suggest_caps_with_the_ledger_busy_afterwards_still_prints_its_advice(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.errors import LedgerError
    from dpsql.ledger import Ledger

    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()

    def busy(self: Ledger) -> None:
        raise LedgerError("ledger is locked by another dpsql operation; nothing was changed")

    with monkeypatch.context() as m:
        m.setattr(Ledger, "remaining", busy)
        assert run([*CFG, "suggest-caps", "events", "--epsilon", "0.1", "--format", "json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["meta"]["ledger_id"] == 1 and "remaining: unknown" in got.err


@pytest.mark.parametrize("out", ["r.csv", "r.json", "r.txt", "r.parquet"])
@pytest.mark.parametrize("existing", [False, True])
def test_a_write_that_fails_midway_leaves_no_partial_output(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, out: str, existing: bool) -> None:
    """A full disk halfway through -o: the file is never left half written (an ETL step that looks
    for the file would read a truncated release); an earlier file of that name is kept whole, and the
    release is saved beside the ledger."""
    from dpsql import _output

    if existing:
        Path(out).write_bytes(b"earlier")
    real_write_all, wrote = _output._write_all, []

    def full(fd: int, data: bytes) -> None:
        if not wrote:  # the first write (the target's): half of it, then the disk is full
            wrote.append(data)
            real_write_all(fd, data[: len(data) // 2])
            raise OSError(28, "No space left on device")
        real_write_all(fd, data)

    with monkeypatch.context() as m:
        m.setattr(_output, "_write_all", full)
        assert run([*CFG, *Q, "-o", out]) == 5
    err = capsys.readouterr().err
    assert f"writing -o '{out}' failed (No space left on device)" in err and "charge stands (ledger entry 1)" in err
    assert (Path(out).read_bytes() == b"earlier") if existing else not Path(out).exists()
    assert not [p.name for p in Path().iterdir() if ".dpsql-" in p.name]  # no temporary file left behind
    saved = next((workdir / "examples" / ".example_ledger.duckdb.releases").iterdir())
    assert (saved / out).read_bytes() == wrote[0] and str(saved) in err and "cp " in err


def test_output_to_dev_stdout_of_a_pipe_is_written_in_place(workdir: Path) -> None:
    import subprocess
    import sys

    if not os.path.exists("/dev/stdout"):
        pytest.skip("needs /dev/stdout")
    repo = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "dpsql.cli", *CFG, *Q, "-o", "/dev/stdout", "--format", "csv"],
                       env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == '"n"'


@pytest.mark.parametrize("step,nth", [("marker", 1), ("marker", 2), ("commit", 2)])
def test_a_ledger_failure_once_the_charge_is_recorded_exits_as_charged_then_failed(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, step: str, nth: int) -> None:
    """Exit 4 (a ledger error) is what an ETL script sees when the ledger is missing or locked and
    nothing was charged. A ledger failure once the charge is durable (the generation marker of the
    reserve or of the release's record, or the release's record itself) leaves the charge standing
    and delivers nothing: that is exit 1, as any failure after the charge, so the script does not
    take it for 'nothing charged'. (A failure once the release's record is in the write-ahead log, its
    marker's, delivers the answer paid for and recorded, with a warning: exit 0.)"""
    import duckdb

    from dpsql.ledger import _store

    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    calls = []
    raise_markers = _store._raise_markers

    def markers(p: str, generation: int, *rest: object) -> None:
        calls.append(p)
        if len(calls) == nth:
            raise OSError(28, "No space left on device")
        raise_markers(p, generation, *rest)  # type: ignore[arg-type]

    reserve = _store.Ledger.reserve

    def reserved(self: _store.Ledger, *a: object, **k: object) -> int:
        entry = reserve(self, *a, **k)  # type: ignore[arg-type]
        calls.append("reserved")
        return entry

    def before_commit(p: str) -> None:  # the next transaction after the reserve: the release's record
        if calls:
            raise duckdb.IOException("could not write: No space left on device")

    with monkeypatch.context() as m:
        if step == "marker":
            m.setattr(_store, "_raise_markers", markers)
        else:
            m.setattr(_store.Ledger, "reserve", reserved)
            m.setitem(_store._HOOKS, "before_commit", before_commit)
        code = run([*CFG, *Q, "-o", "r.csv"])
    err = capsys.readouterr().err
    if (step, nth) == ("marker", 2):
        assert code == 0 and "warning:" in err and "the answer is returned" in err and Path("r.csv").exists(), err
    else:
        assert code == 5, err
        assert "LedgerError" in err and "stands" in err and not Path("r.csv").exists()
    capsys.readouterr()
    assert run([*CFG, "budget", "--history", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # the release's record may have reached the write-ahead log before its marker failed
    assert doc["spent"]["epsilon"] == 0.1 and [e["status"] for e in doc["entries"]] == [
        "released" if (step, nth) == ("marker", 2) else "reserved"]


def test_a_missing_ledger_still_exits_4_with_nothing_charged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"u": [1, 2]}), "t.parquet")
    assert run(["--table", "t=t.parquet", "--privacy-unit", "t=u", "--ledger", "none.duckdb", "query",
                "SELECT COUNT(*) FROM t", "--epsilon", "1"]) == 4
    assert not Path("none.duckdb").exists()


@pytest.mark.parametrize("argv,charged", [(["budget", "--history", "--format", "json"], False), (["tables"], False),
                                          (["suggest-caps", "events", "--epsilon", "0.1"], True)])
def test_a_closed_stdout_is_named_and_says_whether_a_charge_stands(workdir: Path, argv: list[str], charged: bool) -> None:
    """`dpsql budget --format json | jq ...` where the reader has gone: not 'unexpected BrokenPipeError'."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    assert run([*CFG, "budget"]) == 0  # creates the ledger (here: only the command with the closed stdout needs a process)
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    try:
        p = subprocess.run([sys.executable, "-m", "dpsql.cli", *CFG, *argv], env=env, stdout=w, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    finally:
        os.close(w)
    # a charged command finds the reader gone before its charge (exit 2), a free one when it writes (exit 1)
    assert p.returncode == (2 if charged else 1)
    assert "unexpected" not in p.stderr and "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    assert ("pipe whose reader has closed it" if charged else "stdout") in p.stderr and "nothing was charged" in p.stderr, p.stderr


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_budget_history_agrees_with_its_summary_while_others_charge(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    """Another process charging between the command's reads: the spent budget printed must be the
    sum of the entries printed (an ETL job reconciles one against the other)."""
    from dpsql.budget import Budget
    from dpsql.ledger import Ledger, _store

    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    other = Ledger.open(LEDGER)
    busy, charges = [], []

    def charge_elsewhere(path: str) -> None:  # before each of the command's ledger transactions
        if busy or len(charges) >= 6:
            return
        busy.append(1)
        try:
            charges.append(other.reserve(Budget(0.1), mechanism="laplace", query="SELECT 1", tables=["events"], params={}))
        finally:
            busy.clear()

    with monkeypatch.context() as m:
        m.setitem(_store._HOOKS, "before_queue", charge_elsewhere)
        assert run([*CFG, "budget", "--history", "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        doc = json.loads(out)
        assert doc["spent"]["epsilon"] == pytest.approx(sum(e["epsilon"] for e in doc["entries"]))
        assert doc["remaining"]["epsilon"] == pytest.approx(doc["total"]["epsilon"] - doc["spent"]["epsilon"])
    else:
        spent = float(next(ln for ln in out.splitlines() if ln.startswith("spent:")).split("epsilon=")[1].split()[0])
        rows = [ln for ln in out.splitlines() if "| reserved" in ln or "| released" in ln]
        assert spent == pytest.approx(0.1 * len(rows))


@pytest.mark.parametrize("flag,target,ok", [("-o", "data/out.parquet", False), ("-o", "data/../data/o.parquet", False),
                                            ("--meta", "data/m.parquet", False), ("-o", "data/sub/o.parquet", True),
                                            ("-o", "data/.o.parquet", True), ("-o", "data/o.csv", True)])
def test_output_matching_a_tables_glob_is_refused_before_the_charge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str], flag: str,
                                                                    target: str, ok: bool) -> None:
    """-o data/out.parquet with --table t=data/*.parquet was written, and the next run read the
    released rows as rows of the table (a missing privacy-unit column reads as NULL)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    Path("data/sub").mkdir(parents=True)
    pq.write_table(pa.table({"user_id": [1, 2, 3]}), "data/a.parquet")
    assert run(["init", "--epsilon", "1", "--ledger", "l.duckdb"]) == 0
    argv = ["--ledger", "l.duckdb", "--table", "t=data/*.parquet", "--privacy-unit", "t=user_id",
            "query", "SELECT COUNT(*) AS n FROM t", "--epsilon", "0.1", flag, target]
    capsys.readouterr()
    if ok:
        assert run(argv) == 0
        return
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert "matches the source pattern data/*.parquet (table 't')" in err and "nothing was charged" in err
    assert not Path(target).exists()
    assert run(["--ledger", "l.duckdb", "budget", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent"]["epsilon"] == 0
