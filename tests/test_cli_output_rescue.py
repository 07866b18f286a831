"""A charged release is never lost to its output: every -o/--meta target is opened (its temporary
sibling created) before the charge, and a bad one is refused naming its flag with nothing charged; a
write that still fails after the charge (/dev/full, the directory removed or made read-only
meanwhile) saves the released answer beside the ledger and says where and how to copy it back."""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

CFG = ["--config", "examples/dpsql.toml"]
Q = ["query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1"]
REPO = Path(__file__).resolve().parents[1]


def _spent(capsys: pytest.CaptureFixture[str]) -> tuple[float, list[str]]:
    capsys.readouterr()
    assert run([*CFG, "budget", "--history", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return doc["spent"]["epsilon"], [e["status"] for e in doc["entries"]]


def _saved(workdir: Path) -> Path:
    (d,) = (workdir / "examples" / ".example_ledger.duckdb.releases").iterdir()
    assert d.name.startswith("entry-1-")
    return d


def _get_back(err: str) -> None:
    """Run the command the error prints to get the release back."""
    cmd = err.split("get it back with: ", 1)[1].split(" (release.json", 1)[0]
    subprocess.run(cmd, shell=True, check=True, timeout=30)


def _after_the_charge(monkeypatch: pytest.MonkeyPatch, action: object) -> None:
    """Run ``action`` once the query was answered and charged, before its outputs are written."""
    from dpsql import cli

    real = cli._remaining_after

    def then(s: object) -> object:
        rem = real(s)
        action()  # type: ignore[operator]
        return rem

    monkeypatch.setattr(cli, "_remaining_after", then)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("flag", ["-o", "--meta"])
def test_dev_full_keeps_the_release(workdir: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    argv = [*CFG, *Q, "-o", "/dev/full", "--format", "csv"] if flag == "-o" else [*CFG, *Q, "-o", "r.csv", "--meta", "/dev/full"]
    assert run([*CFG, "budget"]) == 0
    assert run(argv) == 5
    err = capsys.readouterr().err
    assert f"writing {flag} '/dev/full' failed (No space left on device)" in err and "charge stands (ledger entry 1)" in err
    d = _saved(workdir)
    assert str(d) in err and "Traceback" not in err
    release = json.loads((d / "release.json").read_text())
    assert release["meta"]["ledger_id"] == 1 and len(release["rows"]) == 1
    if flag == "-o":
        rows = list(csv.DictReader(io.StringIO((d / "full").read_text())))
        assert rows == [{"n": str(release["rows"][0]["n"])}]
    else:
        assert "-o 'r.csv' was written" in err and Path("r.csv").exists()
        assert json.loads((d / "full").read_text())["ledger_id"] == 1
    assert _spent(capsys) == (0.1, ["released"])


@pytest.mark.parametrize("out", ["r.csv", "r.parquet", "r.json"])
def test_directory_removed_after_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch, out: str) -> None:
    import shutil

    Path("outdir").mkdir()
    assert run([*CFG, "budget"]) == 0
    _after_the_charge(monkeypatch, lambda: shutil.rmtree("outdir"))
    assert run([*CFG, *Q, "-o", f"outdir/{out}", "--meta", "outdir/m.json"]) == 5
    err = capsys.readouterr().err
    assert f"writing -o 'outdir/{out}' failed" in err and "writing --meta 'outdir/m.json' failed" in err
    assert "charge stands (ledger entry 1)" in err
    d = _saved(workdir)
    release = json.loads((d / "release.json").read_text())
    if out.endswith(".parquet"):
        assert pq.read_table(d / out).to_pylist() == release["rows"]
    elif out.endswith(".json"):
        assert json.loads((d / out).read_text())["rows"] == release["rows"]
    assert json.loads((d / "m.json").read_text())["ledger_id"] == 1
    # the printed command puts both files where they were meant to go
    Path("outdir").mkdir()
    _get_back(err)
    assert Path(f"outdir/{out}").read_bytes() == (d / out).read_bytes()
    assert json.loads(Path("outdir/m.json").read_text()) == json.loads((d / "m.json").read_text())
    assert _spent(capsys) == (0.1, ["released"])


def test_directory_made_read_only_after_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    Path("outdir").mkdir()
    assert run([*CFG, "budget"]) == 0
    _after_the_charge(monkeypatch, lambda: os.chmod("outdir", 0o555))
    if os.geteuid() == 0:  # root writes into a read-only directory: its rename is refused as a user's would be
        from dpsql import _output

        real_replace = os.replace

        def refused(src: str, dst: str) -> None:
            if "outdir" in str(dst):
                raise PermissionError(13, "Permission denied")
            real_replace(src, dst)

        monkeypatch.setattr(_output.os, "replace", refused)
    try:
        assert run([*CFG, *Q, "-o", "outdir/r.csv"]) == 5
    finally:
        os.chmod("outdir", 0o755)
    err = capsys.readouterr().err
    assert "writing -o 'outdir/r.csv' failed (Permission denied)" in err
    assert (_saved(workdir) / "r.csv").read_text().startswith('"n"')
    assert not list(Path("outdir").iterdir())  # neither the target nor a temporary file
    assert _spent(capsys) == (0.1, ["released"])


@pytest.mark.parametrize("flag", ["-o", "--meta"])
@pytest.mark.parametrize("case", ["parent_is_a_file", "no_directory", "is_a_directory", "read_only"])
def test_a_bad_target_is_refused_before_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                                    case: str) -> None:
    if case == "read_only" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    Path("afile").write_text("x")
    Path("ro").mkdir()
    os.chmod("ro", 0o555)
    target = {"parent_is_a_file": "afile/r.json", "no_directory": "missing/r.json", "is_a_directory": "ro",
              "read_only": "ro/r.json"}[case]
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    try:
        assert run([*CFG, *Q, flag, target, *(["--format", "json"] if flag == "-o" else [])]) == 2
    finally:
        os.chmod("ro", 0o755)
    err = capsys.readouterr().err
    assert f"{flag} '{target}'" in err and "nothing was charged" in err and "hint:" in err and flag in err.split("hint:")[1]
    assert _spent(capsys) == (0.0, [])
    assert not list(Path("ro").iterdir())


def test_the_temporary_sibling_is_made_before_the_charge(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory that refuses new files (os.access cannot tell: an ACL, a full inode table, a
    read-only mount) is found by creating the temporary sibling, before the charge."""
    from dpsql import _output

    real_open = os.open

    def refusing(path: str, flags: int, mode: int = 0o777, **k: object) -> int:
        if ".dpsql-" in str(path):
            raise OSError(30, "Read-only file system")
        return real_open(path, flags, mode, **k)

    assert run([*CFG, "budget"]) == 0
    with monkeypatch.context() as m:
        m.setattr(_output.os, "open", refusing)
        assert run([*CFG, *Q, "-o", "r.csv"]) == 2
    err = capsys.readouterr().err
    assert "-o 'r.csv' cannot be written" in err and "Read-only file system" in err and "nothing was charged" in err
    assert _spent(capsys) == (0.0, [])


def test_a_query_refused_after_the_targets_are_opened_leaves_no_temporary_file(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CFG, "budget"]) == 0
    assert run([*CFG, "query", "SELECT COUNT(*) FROM events", "--epsilon", "100", "-o", "r.csv"]) == 3  # over budget
    assert not [p.name for p in Path().iterdir() if ".dpsql-" in p.name]
    assert not Path("r.csv").exists()


def test_a_fifo_without_a_reader_is_refused_before_the_charge_and_one_with_a_reader_is_written(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo("pipe")
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    assert run([*CFG, *Q, "-o", "pipe", "--format", "csv"]) == 2  # would block for ever after the charge
    err = capsys.readouterr().err
    assert "-o 'pipe' is a named pipe that no process is reading" in err and "nothing was charged" in err
    assert _spent(capsys) == (0.0, [])
    got: list[bytes] = []
    fd = os.open("pipe", os.O_RDONLY | os.O_NONBLOCK)
    reader = threading.Thread(target=lambda: got.append(_read_until_eof(fd)))
    reader.start()
    try:
        assert run([*CFG, *Q, "-o", "pipe", "--format", "csv"]) == 0
    finally:
        reader.join(60)
        os.close(fd)
    assert got and got[0].startswith(b'"n"\n')


def _read_until_eof(fd: int) -> bytes:
    import select

    out = b""
    seen_writer = False
    while True:
        select.select([fd], [], [], 30)
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if chunk:
            out += chunk
            seen_writer = True
        elif seen_writer:
            return out


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [Q, ["suggest-caps", "events", "--epsilon", "0.1", "--format", "json"]])
def test_stdout_on_dev_full_keeps_the_release(workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert run([*CFG, "budget"]) == 0
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "dpsql.cli", *CFG, *argv], stdout=full, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert p.returncode == 5, p.stderr
    assert "writing stdout failed (No space left on device)" in p.stderr and "charge stands (ledger entry 1)" in p.stderr
    d = _saved(workdir)
    name = "stdout.txt" if argv is Q else "stdout.json"
    assert f"cat {shlex.quote(str(d / name))}" in p.stderr
    assert (d / name).read_bytes() and json.loads((d / "release.json").read_text())["meta"]["ledger_id"] == 1
    assert _spent(capsys) == (0.1, ["released"])


def test_no_writable_place_says_the_release_is_lost(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from dpsql import _output

    Path("outdir").mkdir()
    assert run([*CFG, "budget"]) == 0
    monkeypatch.setattr(_output, "_rescue_dirs", lambda ledger: [str(workdir / "afile" / "x")])
    Path("afile").write_text("")
    _after_the_charge(monkeypatch, lambda: shutil.rmtree("outdir"))
    assert run([*CFG, *Q, "-o", "outdir/r.csv"]) == 5
    err = capsys.readouterr().err
    assert "charge stands (ledger entry 1)" in err and "so it is lost" in err


PREPARED = """
import sys, time
from dpsql._output import Target
t = Target.prepare("-o", sys.argv[1])
print(t.tmp, flush=True)
time.sleep(120)
"""


def test_temporary_files_of_a_killed_command_are_removed_and_a_live_ones_kept(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A command SIGKILLed while its query ran (its output opened, not yet written) left its
    temporary file beside the output for good; the next command writing that name removes it, but
    never the temporary file of a command still running (negative control)."""
    import signal

    from conftest import spawn_python

    procs = [spawn_python(PREPARED, "r.csv") for _ in range(2)]
    try:
        tmps = [Path(p.stdout.readline().strip()) for p in procs if p.stdout is not None]
        assert all(t.exists() for t in tmps)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(30)
        assert run([*CFG, *Q, "-o", "r.csv"]) == 0
        assert not tmps[0].exists() and tmps[1].exists()
        assert Path("r.csv").read_text().startswith('"n"')
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
