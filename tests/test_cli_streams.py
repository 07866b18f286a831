"""Standard streams in pipelines: a closed stdout or stderr, or a full disk behind stdout, never
puts an error among the rows, never charges for rows that cannot be delivered, and is reported in
plain words (not 'unexpected ...')."""

from __future__ import annotations

import errno
import io
import json
import sys
from pathlib import Path

import pytest
from conftest import run_cli as run

CFG = ["--config", "examples/dpsql.toml"]
Q = ["query", "SELECT COUNT(*) AS n FROM events", "--epsilon", "0.1"]


def _entries(capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    assert run([*CFG, "budget", "--history", "--format", "json"]) == 0
    return len(json.loads(capsys.readouterr().out)["entries"])


class _Full(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("argv", [Q, ["budget", "--history"], ["tables"]])
def test_a_closed_stdout_is_refused_before_anything_is_charged(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """`dpsql query ... >&-` charged the query, then failed with 'unexpected AttributeError'."""
    assert run([*CFG, "budget"]) == 0
    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", None)
        assert run([*CFG, *argv]) == 2
    err = capsys.readouterr().err
    assert "standard output is closed" in err and "unexpected" not in err and "hint:" in err
    assert _entries(capsys) == 0
    with monkeypatch.context() as m:  # with -o the rows have somewhere to go
        m.setattr(sys, "stdout", None)
        assert run([*CFG, *Q, "-o", "n.csv"]) == 0
    assert Path("n.csv").read_text().startswith('"n"') and _entries(capsys) == 1


def test_a_closed_stderr_keeps_messages_out_of_the_rows(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`dpsql query ... > out.csv 2>&-` failed with 'unexpected AttributeError', printed into out.csv."""
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(sys, "stderr", None)
        assert run([*CFG, *Q, "--format", "csv"]) == 0
        out = capsys.readouterr().out
        assert out.startswith('"n"\n') and len(out.splitlines()) == 2  # the rows only
        assert run([*CFG, "query", "SELECT nope FROM events", "--epsilon", "0.1", "--format", "csv"]) == 2
        assert capsys.readouterr().out == ""
    assert _entries(capsys) == 1


@pytest.mark.parametrize("argv", [["budget", "--history"], ["tables", "--format", "json"],
                                  ["explain", "SELECT COUNT(*) FROM events", "--epsilon", "1"]])
def test_a_full_disk_behind_stdout_is_named_for_free_commands(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """`dpsql budget --history > /full/disk/file` said 'error: unexpected OSError'."""
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", _Full())
        assert run([*CFG, *argv]) == 1
    err = capsys.readouterr().err
    assert "writing stdout failed (No space left on device); nothing was charged" in err and "unexpected" not in err


def test_a_numeric_runtime_warning_during_a_release_is_neither_shown_nor_fatal(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A numpy RuntimeWarning while a release was computed (seen: 'invalid value encountered in
    multiply' in the VARIANCE interval, from noisy sums) was printed as a warning line, and under
    PYTHONWARNINGS=error it failed the query after its charge."""
    import warnings

    import dpsql.mechanisms.basic as basic

    real = basic.finish_release

    def noisy_finish(*a: object, **k: object) -> object:
        warnings.warn("invalid value encountered in multiply", RuntimeWarning, stacklevel=1)
        return real(*a, **k)

    monkeypatch.setattr(basic, "finish_release", noisy_finish)
    assert run([*CFG, "budget"]) == 0
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as PYTHONWARNINGS=error
        assert run([*CFG, *Q, "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith('"n"') and "invalid value" not in err and "warning:" not in err
    assert run([*CFG, "explain", "SELECT COUNT(*) FROM events", "--epsilon", "200"]) == 0
    assert "warning: --epsilon 200 is unusually large" in capsys.readouterr().err  # dpsql's own warnings still show
