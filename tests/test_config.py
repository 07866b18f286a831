"""One config loader: the same dpsql.toml means the same thing through the API and the CLI.

Each case is a config file, loaded by ``Session.from_config`` and by the ``dpsql`` command line
(``explain``, from another working directory); both must give the same outcome: the same error
class and message, or the same ledger file (resolved against the config's directory)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.cli import main
from dpsql.config import MEMORY, DpsqlConfig, load_config
from dpsql.errors import ConfigError, DPSQLError, InputUnavailableError, LedgerError

TABLE = '[tables.events]\nsource = "data/events.parquet"\nprivacy_unit = "uid"\n'
LEDGER = '[ledger]\npath = "led/l.duckdb"\nepsilon = 3.0\ndelta = 1e-6\ncreate_if_missing = true\n'

# (id, config text or None for "no such file", expected error class or None, words of the message)
ERRORS = [
    ("missing-file", None, InputUnavailableError, "not found"),
    ("bad-toml", "[ledger\npath = 'x'\n", ConfigError, "not valid TOML"),
    ("budget-without-path", "[ledger]\nepsilon = 1.0\ndelta = 1e-6\n" + TABLE, ConfigError, "names no path"),
    ("budget-without-path-no-tables", "[ledger]\nepsilon = 1.0\n", ConfigError, "names no path"),
    ("unknown-ledger-key", LEDGER + "colour = 1\n" + TABLE, ConfigError, "unknown keys ['colour'] in [ledger]"),
    ("unknown-engine-key", LEDGER + "[engine]\ntimeout = 3\n" + TABLE, ConfigError,
     "unknown settings ['timeout'] in [engine]"),
    ("unknown-table-key", LEDGER + TABLE + "colour = 1\n", ConfigError, "unknown keys ['colour'] in [tables.events]"),
    ("unknown-section", LEDGER + "[ledgr]\npath = 'x'\n", ConfigError, "unknown sections ['ledgr']"),
    ("create-not-bool", LEDGER.replace("create_if_missing = true", 'create_if_missing = "yes"'), ConfigError,
     "create_if_missing must be true or false"),
    ("delta-without-epsilon", '[ledger]\npath = "l.duckdb"\ndelta = 1e-6\n', ConfigError, "delta but no epsilon"),
    ("bad-epsilon", LEDGER.replace("epsilon = 3.0", "epsilon = -1.0"), ConfigError, "epsilon must be"),
    ("bad-engine-value", LEDGER + "[engine]\nthreads = 0\n", ConfigError, "threads must be"),
    ("tables-without-ledger", TABLE, ConfigError, "registers tables but names no ledger"),
    ("memory-without-budget", '[ledger]\npath = ":memory:"\n', ConfigError, "needs a total budget"),
    ("ledger-not-a-table", 'ledger = "l.duckdb"\n', ConfigError, "[ledger] in the config must be a table"),
    ("table-without-source", LEDGER + '[tables.events]\nprivacy_unit = "uid"\n', ConfigError, "needs a source"),
    ("table-source-missing", LEDGER + TABLE.replace("events.parquet", "nope.parquet"), InputUnavailableError,
     "table 'events': no file matches"),
    ("tables-differ-by-case", LEDGER + TABLE + TABLE.replace("[tables.events]", "[tables.EVENTS]"), ConfigError,
     "registers tables 'events' and 'EVENTS'"),
    ("columns-differ-by-case", LEDGER + TABLE + '[tables.events.columns.g]\ndomain = ["a"]\n'
     '[tables.events.columns.G]\ndomain = ["b"]\n', ConfigError, "declares columns 'g' and 'G' of table 'events'"),
    ("source-not-a-path", LEDGER + TABLE.replace('"data/events.parquet"', "5"), ConfigError,
     "[tables.events] source must be a file path (a string), got 5"),
    ("public-not-a-boolean", LEDGER + TABLE + 'public = "yes"\n', ConfigError,
     "[tables.events] public must be true or false, got 'yes'"),
    ("column-spec-not-a-table", LEDGER + TABLE + "[tables.events.columns]\ng = [0, 10]\n", ConfigError,
     "[tables.events.columns] g must be a table of column settings"),
    ("columns-not-a-table", LEDGER + TABLE + "columns = 5\n", ConfigError, "[tables.events] columns must be a table"),
    ("missing-ledger-not-created", LEDGER.replace("create_if_missing = true", "") + TABLE, LedgerError,
     "no budget ledger"),
]


@pytest.fixture
def confdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config directory with data/events.parquet; the working directory is elsewhere."""
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    d = tmp_path / "conf"
    (d / "data").mkdir(parents=True)
    (d / "led").mkdir()
    pq.write_table(pa.table({"uid": list(range(20)), "g": ["a", "b"] * 10}), d / "data" / "events.parquet")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return d


def _api(cfg: Path) -> tuple[str, str] | None:
    try:
        with dpsql.Session.from_config(cfg):
            return None
    except DPSQLError as e:
        return type(e).__name__, str(e).splitlines()[0]


def _cli(cfg: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["--config", str(cfg), *flags, "explain", "SELECT COUNT(*) FROM events", "--epsilon", "1"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case,text,cls,words", ERRORS, ids=[c[0] for c in ERRORS])
def test_same_error_through_api_and_cli(confdir: Path, capsys: pytest.CaptureFixture[str], case: str,
                                        text: str | None, cls: type, words: str) -> None:
    cfg = confdir / "dpsql.toml"
    if text is not None:
        cfg.write_text(text)
    api = _api(cfg)
    assert api is not None, f"{case}: the API accepted the config"
    assert api[0] == cls.__name__ and words in api[1], api
    code, err = _cli(cfg, capsys)
    assert code == cls.exit_code, err
    assert f"error: {api[0]}: {api[1]}" in err  # the same class and the same message
    if case == "missing-ledger-not-created":
        assert not (confdir / "led" / "l.duckdb").exists()  # a missing ledger is never created silently
    assert not list(Path.cwd().iterdir())  # nothing created in the working directory


def test_same_ledger_through_api_and_cli(confdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Relative ledger and source paths are resolved against the config's directory by both."""
    cfg = confdir / "dpsql.toml"
    cfg.write_text(LEDGER + TABLE)
    with dpsql.Session.from_config(cfg) as s:
        s.query("SELECT COUNT(*) FROM events", epsilon=1.0)
        assert s.remaining() == Budget(2.0, 1e-6)
    assert (confdir / "led" / "l.duckdb").exists()
    capsys.readouterr()
    assert main(["--config", str(cfg), "query", "SELECT COUNT(*) FROM events", "--epsilon", "0.5"]) == 0
    assert "remaining: epsilon=1.5 delta=1e-06" in capsys.readouterr().err
    with dpsql.Session.from_config(cfg) as s:
        assert s.remaining() == Budget(1.5, 1e-6)  # the CLI charged the same ledger
    assert not list(Path.cwd().iterdir())


def test_in_memory_ledger_only_through_the_api(confdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """path = ":memory:" is the one explicit way to a ledger that forgets: the API (notebooks)
    honours it; the command line refuses it (each command would start from a fresh budget)."""
    cfg = confdir / "dpsql.toml"
    cfg.write_text('[ledger]\npath = ":memory:"\nepsilon = 1.0\n' + TABLE)
    assert load_config(cfg).in_memory
    with dpsql.Session.from_config(cfg) as s:
        s.query("SELECT COUNT(*) FROM events", epsilon=0.5)
        assert s.remaining() == Budget(0.5)
    code, err = _cli(cfg, capsys)
    assert code == 2 and "ConfigError" in err and ":memory:" in err and "needs a ledger file" in err
    assert not list(Path.cwd().iterdir())


def test_config_without_ledger_or_tables(confdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config that names no ledger (engine settings only): the API has nowhere to keep the
    budget and refuses; the CLI takes the ledger from its flags (--ledger, $DPSQL_LEDGER)."""
    cfg = confdir / "dpsql.toml"
    cfg.write_text("[engine]\nthreads = 1\n")
    assert _api(cfg) == ("ConfigError", f"config file {str(cfg)!r} names no ledger: its budget must live in one place")
    led = confdir / "mine.duckdb"
    assert main(["--ledger", str(led), "init", "--epsilon", "1"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "--ledger", str(led), "--table", f"t={confdir / 'data' / 'events.parquet'}",
                 "--privacy-unit", "t=uid", "query", "SELECT COUNT(*) FROM t", "--epsilon", "0.25"]) == 0
    assert "remaining: epsilon=0.75" in capsys.readouterr().err


def test_owner_config_flags_refused_by_the_cli(confdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = confdir / "dpsql.toml"
    cfg.write_text(LEDGER + TABLE)
    for flags in (["--ledger", "x.duckdb"], ["--table", "t=x.parquet"], ["--debug"]):
        code, err = _cli(cfg, capsys, *flags)
        assert code == 2 and "ConfigError" in err, (flags, err)
    cfg.write_text(LEDGER + "[engine]\ndebug = true\n" + TABLE)
    code, err = _cli(cfg, capsys, "--debug")
    assert code == 0, err


def test_loaded_config_is_frozen_and_resolved(confdir: Path) -> None:
    cfg = confdir / "dpsql.toml"
    cfg.write_text(LEDGER + "[engine]\nthreads = 2\n" + TABLE + "[tables.events.columns.g]\ndomain = ['a', 'b']\n")
    c = load_config(cfg)
    assert c.ledger_path == str(confdir / "led" / "l.duckdb")
    assert c.budget == Budget(3.0, 1e-6) and c.create_if_missing and c.engine.threads == 2
    assert c.tables["events"]["source"] == str(confdir / "data" / "events.parquet")
    assert c.registers_tables and not c.in_memory and c.session_ledger() == c.ledger_path
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.ledger_path = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        c.tables["events"]["source"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        c.tables["other"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        c.tables["events"]["columns"]["g"]["domain"] = ["x"]  # nested tables are read-only too
    assert c.tables["events"]["columns"]["g"]["domain"] == ("a", "b")
    assert DpsqlConfig().ledger_path is None and MEMORY == ":memory:"


def test_unreadable_configs_are_named_in_the_callers_terms(tmp_path: Path) -> None:
    """A config that is not UTF-8 names the byte and the fix (it said only 'UnicodeDecodeError');
    a path that exists but is no regular file is not called missing."""
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'[ledger]\npath = "l\xff.duckdb"\n')
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(an invalid byte at offset 18\)") as e:
        load_config(bad)
    assert "UTF-8" in (e.value.hint or "")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config("/dev/null")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_the_owner_sets_how_long_a_busy_ledger_is_waited_for(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command waited for a busy ledger exactly 10 s (the Session's default lock_timeout): an ETL
    deployment that runs many jobs on one ledger could not wait longer (exit 4 'locked by another dpsql
    operation', the hint naming a lock_timeout no command could set), nor fail faster. `[ledger]
    lock_timeout` (seconds) now reaches every command and Session.from_config."""
    from dpsql.ledger import Ledger

    (tmp_path / "dpsql.toml").write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1.0\ncreate_if_missing = true\n'
                                         "lock_timeout = 42.5\n")
    assert load_config(tmp_path / "dpsql.toml").lock_timeout == 42.5
    with dpsql.Session.from_config(tmp_path / "dpsql.toml") as s:
        assert s.ledger.lock_timeout == 42.5
    seen: list[float] = []
    real = Ledger._txn

    def spy(self: Ledger, **kw: object) -> object:
        seen.append(self.lock_timeout)
        return real(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Ledger, "_txn", spy)
    monkeypatch.chdir(tmp_path)
    assert main(["--config", "dpsql.toml", "budget"]) == 0
    assert seen and set(seen) == {42.5}, seen
    for bad in ("-1", "\"10\"", "true", "inf"):
        (tmp_path / "bad.toml").write_text(f'[ledger]\npath = "l.duckdb"\nlock_timeout = {bad}\n')
        with pytest.raises(ConfigError, match=r"\[ledger\] lock_timeout"):
            load_config(tmp_path / "bad.toml")


@pytest.mark.parametrize("spec,path", [
    ('[tables.events.columns.amount]\nbounds = [5, 1]\n', "tables.events.columns.amount.bounds"),
    ('[tables.events.columns.amount]\nbonds = [0, 1]\n', "tables.events.columns.amount"),
    ('max_groups_per_unit = "x"\n', "tables.events.max_groups_per_unit"),
    ('[tables.events.columns.g]\ndomain = 5\n', "tables.events.columns.g.domain"),
    ('[tables.events.columns.g]\ndomain = []\n', "tables.events.columns.g.domain"),
    ('[tables.events.degree_bounds]\nx = 1\n', "tables.events"),
    ("SOURCE", "tables.events.source"),
])
def test_a_refused_table_section_names_the_file_and_the_key(confdir: Path, capsys: pytest.CaptureFixture[str],
                                                            spec: str, path: str) -> None:
    """A bad [tables.NAME] setting named the table but not the config file ([ledger] and [engine] errors name it)."""
    cfg = confdir / "jobs" / "nightly.toml"
    cfg.parent.mkdir()
    table = TABLE.replace("data/events", "../data/events")
    text = LEDGER.replace("led/", "../led/") + (table.replace("events.parquet", "nope.parquet") if spec == "SOURCE"
                                                 else table + spec)
    cfg.write_text(text)
    api = _api(cfg)
    assert api is not None and str(cfg) in api[1] and path in api[1], api
    code, err = _cli(cfg, capsys)
    assert code == (66 if spec == "SOURCE" else 2) and str(cfg) in err and path in err, err  # (a file not there: 66)
