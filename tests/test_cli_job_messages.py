"""What a scheduled job (cron, Airflow, a script) is told: a config's ledger that is missing or no ledger is hinted with the
command that works with that config (`dpsql init ... --ledger PATH`, the ledger's own hint, is refused with a config that
registers tables; 'pass the total together with create=True' is the Python API's fix), which config and which ledger
were used, and which ledger entry a signal cut short."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

from dpsql.cli import _config_ledger_text
from dpsql.config import load_config
from dpsql.errors import LedgerError

TABLES = '\n[tables.events]\nsource = "data.parquet"\nprivacy_unit = "uid"\n'


@pytest.fixture
def owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pq.write_table(pa.table({"uid": list(range(30)), "g": ["a", "b"] * 15}), tmp_path / "data.parquet")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    return tmp_path


def _hint(err: str) -> str:
    return err.split("\nhint: ", 1)[1]


def test_the_hinted_init_creates_the_config_ledger(owner: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 2.5\ndelta = 1e-05\n' + TABLES)
    assert run(["--config", "owner.toml", "budget"]) == 4
    err = capsys.readouterr().err
    assert "no budget ledger at" in err and "--ledger" not in _hint(err)
    cmd = shlex.split(re.search(r"`(dpsql [^`]*)`", _hint(err)).group(1))[1:]
    assert run(cmd) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert run(["--config", "owner.toml", "budget", "--format", "json"]) == 0
    assert '"epsilon": 2.5' in capsys.readouterr().out


def test_a_config_without_a_total_says_where_to_declare_it(owner: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (owner / "dpsql.toml").write_text('[ledger]\npath = "l.duckdb"\n' + TABLES)
    assert run(["budget"]) == 4
    hint = _hint(capsys.readouterr().err)
    assert "epsilon = " in hint and "[ledger]" in hint and "'dpsql.toml'" in hint and "--ledger" not in hint
    (owner / "dpsql.toml").write_text('[ledger]\npath = "l.duckdb"\ncreate_if_missing = true\n' + TABLES)
    assert run(["query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1"]) == 4
    err = capsys.readouterr().err
    assert "create=True" not in err and "epsilon = " in _hint(err) and "create_if_missing" in _hint(err)


def test_a_postgresql_ledger_named_by_a_config(owner: Path) -> None:
    (owner / "pg.toml").write_text('[ledger]\nurl = "postgresql://u@h/db"\nepsilon = 1.0\ndelta = 1e-06\n' + TABLES)
    e = LedgerError("no budget ledger in the database postgresql://u@h/db",
                    hint="create it with `dpsql init --epsilon 1.0 --delta 1e-6 --ledger 'postgresql://u@h/db'` or "
                    "Session(ledger=URL, budget=..., create=True)")
    text = _config_ledger_text(e, "pg.toml", load_config("pg.toml"))
    assert "dpsql --config pg.toml init --epsilon 1.0 --delta 1e-06" in text and "Session(" not in text
    other = LedgerError("ledger x is busy", hint="retry")
    assert _config_ledger_text(other, "pg.toml", load_config("pg.toml")) == str(other)


def test_the_owner_config_read_by_default_is_named(owner: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dpsql.toml in the working directory is read without --config: a refusal of --ledger because of it names it."""
    (owner / "dpsql.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\n' + TABLES)
    assert run(["--ledger", "mine.duckdb", "init", "--epsilon", "1"]) == 2
    err = capsys.readouterr().err
    assert "'dpsql.toml'" in err and "working directory" in err and "directory without a dpsql.toml" in err, err
    assert not (owner / "mine.duckdb").exists()


def test_a_dpsql_ledger_that_the_config_overrides_is_said(owner: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """$DPSQL_LEDGER (set for every job of a scheduler) was silently ignored when the config names a ledger: the job
    read and charged the config's ledger while its operator thought it used the environment's."""
    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n' + TABLES)
    monkeypatch.setenv("DPSQL_LEDGER", str(owner / "other.duckdb"))
    assert run(["--config", "owner.toml", "budget"]) == 0
    err = capsys.readouterr().err
    assert "warning: $DPSQL_LEDGER" in err and "[ledger]" in err and "other.duckdb" not in err, err
    monkeypatch.setenv("DPSQL_LEDGER", "l.duckdb")  # the same ledger: nothing to say
    assert run(["--config", "owner.toml", "budget"]) == 0
    assert "DPSQL_LEDGER" not in capsys.readouterr().err


@pytest.mark.parametrize("bounds,want", [("[5]", "--bounds TABLE.g=0:100"), ("[1, 2, 3]", "--bounds TABLE.g=0:100"),
                                         ('["2024-01-01"]', "DATE or TIMESTAMP")])
def test_a_bad_pair_of_numeric_bounds_is_hinted_with_numbers(owner: Path, capsys: pytest.CaptureFixture[str],
                                                             bounds: str, want: str) -> None:
    """bounds = [5] was hinted with a DATE grid (--bins TABLE.g=2019-01-01:2021-01-01:N) whatever the bounds were."""
    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n' + TABLES
                                      + f"[tables.events.columns.g]\nbounds = {bounds}\n")
    assert run(["--config", "owner.toml", "tables"]) == 2
    err = capsys.readouterr().err
    assert "must be a pair" in err and want in _hint(err), err


def test_explain_takes_format_json_as_every_other_command(owner: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`explain --format json` (the spelling of query, budget, tables, describe and suggest-caps) was a usage error."""
    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n' + TABLES)
    import json

    assert run(["--config", "owner.toml", "explain", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["mechanism"]
    assert run(["--config", "owner.toml", "explain", "SELECT COUNT(*) FROM events", "--epsilon", "1", "--format", "csv"]) == 2


@pytest.mark.parametrize("make", ["dir", "junk"])
def test_a_config_ledger_that_is_no_ledger_is_hinted_in_config_terms(owner: Path, capsys: pytest.CaptureFixture[str],
                                                                     make: str) -> None:
    """[ledger] path naming a directory or a file that is no ledger was hinted 'e.g. --ledger ledger.duckdb' and
    `dpsql init ... --ledger NEW_PATH`, which a config that registers tables refuses."""
    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\n' + TABLES)
    if make == "dir":
        (owner / "l.duckdb").mkdir()
    else:
        (owner / "l.duckdb").write_bytes(b"not a ledger" * 1000)
    assert run(["--config", "owner.toml", "budget"]) == 4
    hint = _hint(capsys.readouterr().err)
    assert "--ledger" not in hint and "[ledger]" in hint and "dpsql --config owner.toml init" in hint, hint


def test_a_failure_after_the_charge_names_a_damaged_source_among_its_causes(owner: Path) -> None:
    """A Parquet file whose data pages were damaged fails after the charge (its pages are private rows); the hint
    listed only the owner's limits, a full temp directory and a bug."""
    from dpsql.engine.base import EngineSettings, private_failure

    hint = private_failure("the query", None, EngineSettings()).hint
    assert "source file" in str(hint) and "damaged" in str(hint)


@pytest.mark.parametrize("body", ['[ledger]\npath = "l.duckdb"\nfoo = 1\n', '[ledger]\npath = "l.duckdb"\nlock_timeout = -1\n',
                                  '[ledger]\npath = "l.duckdb"\ncreate_if_missing = "yes"\n',
                                  '[ledger]\npath = "l.duckdb"\n[engine]\nmemory = "1GB"\n',
                                  '[ledger]\npath = "l.duckdb"\n[tables.events]\nsource = "data.parquet"\nmax_group = 1\n'])
def test_every_config_refusal_names_the_file(owner: Path, body: str) -> None:
    """A job reading one of several configs was told 'unknown keys ['foo'] in [ledger]' without which file."""
    from dpsql.errors import ConfigError

    (owner / "jobs").mkdir()
    (owner / "jobs" / "nightly.toml").write_text(body)
    with pytest.raises(ConfigError, match="jobs/nightly.toml"):
        load_config(str(owner / "jobs" / "nightly.toml"))



def test_a_busy_postgresql_ledger_hint_reads_once() -> None:
    from dpsql.cli import _cli_text

    text = _cli_text("ledger postgresql://h/db is busy: ...; nothing was charged\nhint: retry, or pass a larger lock_timeout")
    assert "retry, or try again" not in text and "--lock-timeout SECONDS" in text, text


def test_an_interrupt_after_the_charge_names_its_ledger_entry(owner: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C or SIGTERM (a job runner's timeout) during the private read said 'a charge already made stands (see
    dpsql budget --history)' whether or not this command had charged: its log could not tell."""
    import dpsql.session

    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n' + TABLES)

    def read(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dpsql.session.backends, "fetch_bounded", read)
    assert run(["--config", "owner.toml", "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.25"]) == 130
    err = capsys.readouterr().err
    assert "ledger entry 1" in err and "failed" in err, err


def test_a_free_answer_that_cannot_be_written_is_not_told_as_charged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer read for free from a stored synopsis (--reuse-synopsis) that could not be written said 'its charge
    stands' and 'running the query again would charge again' (exit 1: nothing was charged; again is free too)."""
    from types import SimpleNamespace

    from dpsql.cli import _written_failed

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # where a release without a ledger file is saved
    rel = SimpleNamespace(reused=True, ledger_id=9, to_dict=lambda remaining: {"rows": []})
    err = _written_failed(rel, [("-o", "out.csv", "out.csv", b"n\n1\n", OSError(28, "No space left on device"))], None, None)
    assert err.exit_code == 1 and "charge" not in str(err) and "free" in str(err), str(err)
    rel.reused = False
    err = _written_failed(rel, [("-o", "out.csv", "out.csv", b"n\n1\n", OSError(28, "No space left on device"))], None, None)
    assert err.exit_code == 5 and "its charge stands" in str(err) and "would charge again" in str(err), str(err)


@pytest.mark.parametrize("name", ["out.csv.gz", "OUT.JSON.ZST", "out.parquet.bz2", "x.xz", "x.zip", "out.tgz", "out.csv.Z",
                                  "out.csv.zstd", "out.csv.lzma", "out.csv.lz", "out.csv.7z", "out.csv.tar"])
def test_a_compressed_file_name_is_refused_even_with_format(owner: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """-o out.csv.gz --format csv (as the unknown-extension hint suggested) wrote plain CSV under a .gz name, which
    zcat and every loader that trusts the extension then failed to read, after the charge."""
    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n' + TABLES)
    assert run(["--config", "owner.toml", "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.1", "-o", name,
                "--format", "csv"]) == 2
    err = capsys.readouterr().err
    assert "compress" in err and "| gzip" in _hint(err) and not (owner / name).exists(), err
    assert not (owner / "l.duckdb").exists() or "nothing was charged" in err


def test_tables_and_describe_read_no_ledger(owner: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dpsql tables` (free: the config's public policy) failed with exit 4 while the ledger did not exist yet, e.g. a
    CI step that checks a new config before the owner creates its ledger; with create_if_missing it created it."""
    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\n' + TABLES)
    assert run(["--config", "owner.toml", "tables", "--format", "json"]) == 0, capsys.readouterr().err
    assert "events" in capsys.readouterr().out
    assert run(["--config", "owner.toml", "describe", "events"]) == 0
    (owner / "owner.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n' + TABLES)
    assert run(["--config", "owner.toml", "tables"]) == 0
    assert not (owner / "l.duckdb").exists()
    assert run(["--config", "owner.toml", "--ledger", "x.duckdb", "tables"]) == 2  # the owner's config still holds


@pytest.mark.parametrize("hint", ["retry, or pass a larger lock_timeout", "retry later or pass a larger lock_timeout"])
def test_a_release_that_a_busy_ledger_kept_out_is_not_hinted_to_try_again(hint: str) -> None:
    """A release the busy ledger could not record within its wait (exit 5) said 'the answer was charged but is not
    returned (asking again charges again)' and then hinted 'try again when the other dpsql command has finished'."""
    from dpsql.charge import record_release
    from dpsql.cli import _cli_text

    class Busy:
        def commit(self, entry: int, **kw: object) -> None:
            raise LedgerError("ledger l is busy: another dpsql operation held it for more than 11 s; entry 3 stays "
                              "'reserved': the charge stands", hint=hint)

    with pytest.raises(LedgerError) as e:
        record_release(Busy(), 3, {})  # type: ignore[arg-type]
    assert e.value.exit_code == 5
    text = _cli_text(str(e.value))
    assert "try again" not in text and "retry" not in text and "--lock-timeout SECONDS" in text, text
