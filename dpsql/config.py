"""The one reader of ``dpsql.toml``: ``Session.from_config`` and the ``dpsql`` CLI both use it.

Every rule and every error message about the file lives here, so a file means the same thing
whichever entry point reads it:

* ``[ledger]``: ``path`` (or ``url = "postgresql://..."``: a ledger in PostgreSQL shared by many
  hosts, ``dpsql.ledger._postgres``), ``epsilon``, ``delta``, ``create_if_missing``, ``lock_timeout`` (seconds
  an operation waits for a ledger busy with other operations; default 10). A ``[ledger]`` section
  must name its ``path``: a file (relative paths are resolved against the config file's
  directory), or ``":memory:"`` for an in-memory ledger that forgets every charge when the
  process exits (notebooks and tests; the CLI refuses it, since each command is a new process).
  A budget without a path is refused rather than guessed: a forgotten budget is the worst
  failure a ledger can have. ``delta`` needs ``epsilon``; an in-memory ledger needs ``epsilon``.
* ``[engine]``: the owner's engine settings (``dpsql.engine.EngineSettings`` fields); a relative
  ``temp_directory`` is resolved against the config file's directory too.
* ``[tables.NAME]``: registration keyword arguments of ``Session.register`` plus ``source``;
  a relative source path (or glob) is resolved against the config file's directory, never the
  working directory. A file that registers tables must name its ledger (``[ledger] path``).

Unknown sections and keys are refused, naming the allowed ones (and the nearest to each). A reference's
target must be a table the file registers. A file with neither
``[ledger]`` nor tables names no ledger: ``Session.from_config`` refuses it, and the CLI takes
the ledger from ``--ledger``, ``$DPSQL_LEDGER`` or its default (command-line behaviour).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dpsql.budget import PLAIN_FORM, Budget
from dpsql.engine import EngineSettings
from dpsql.errors import ConfigError, InputUnavailableError, nearest_names

#: the ``[ledger] path`` of an in-memory ledger
MEMORY = ":memory:"

SECTIONS = ("ledger", "engine", "tables")
LEDGER_KEYS = ("path", "url", "epsilon", "delta", "create_if_missing", "lock_timeout")
TABLE_KEYS = ("source", "privacy_unit", "max_groups_per_unit", "max_rows_per_group", "max_rows_per_unit", "columns",
              "references", "tau", "version", "public", "degree_bounds",
              "allow_conditional_sampling", "max_table_rows")


def engine_keys() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(EngineSettings))


def _empty() -> Mapping[str, Mapping[str, Any]]:
    return MappingProxyType({})


@dataclass(frozen=True)
class DpsqlConfig:
    """A loaded ``dpsql.toml`` (see the module docstring). ``DpsqlConfig()`` is "no file"."""

    path: str | None = None  # absolute path of the file
    base_dir: str = ""  # its directory: relative paths in the file are resolved against it
    ledger_path: str | None = None  # absolute file path, MEMORY, or None (the file names no ledger)
    budget: Budget | None = None
    create_if_missing: bool = False
    lock_timeout: float = 10.0  # seconds an operation waits for a busy ledger before a LedgerError
    engine: EngineSettings = field(default_factory=EngineSettings)
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=_empty)  # name -> register() kwargs
    given_path: str | None = None  # the path as the caller gave it (messages name the file so, as load_config's do)

    @property
    def shown_path(self) -> str | None:
        """The file's path as the caller gave it (its absolute path when built without one)."""
        return self.given_path if self.given_path is not None else self.path

    @property
    def in_memory(self) -> bool:
        return self.ledger_path == MEMORY

    @property
    def registers_tables(self) -> bool:
        """The file registers tables: it is the data owner's (its policy and ledger are theirs)."""
        return bool(self.tables)

    def session_ledger(self) -> str | None:
        """The ``ledger`` argument of ``Session``: a file path, or None for an in-memory ledger."""
        if self.ledger_path is None:
            raise ConfigError(
                f"config file {self.shown_path!r} names no ledger: its budget must live in one place",
                hint='add [ledger] with path = "ledger.duckdb" (or path = ":memory:" for a notebook) and epsilon',
            )
        return None if self.in_memory else self.ledger_path

    @contextlib.contextmanager
    def naming_tables(self) -> Any:
        """Refusals of this file's ``[tables.NAME]`` settings (raised when the tables are registered) name the
        file and the key, e.g. ``tables.events.columns.amount.bounds``, as the refusals of ``load_config`` do."""
        try:
            yield
        except ConfigError as e:
            key = _table_key(e.message, self.tables)
            if type(e) not in (ConfigError, InputUnavailableError) or self.path is None or key is None or repr(
                    self.shown_path) in e.message:
                raise
            raise type(e)(f"config file {self.shown_path!r}, {key}: {e.message}", hint=e.hint) from None


def load_config(path: str | os.PathLike[str]) -> DpsqlConfig:
    """Read and check a ``dpsql.toml``; every problem is a ConfigError naming the file and the fix."""
    p = os.fspath(path)
    try:
        return dataclasses.replace(_load_config(p), given_path=p)
    except ConfigError as e:  # (a job that reads one of several configs is told which)
        if type(e) not in (ConfigError, InputUnavailableError) or repr(p) in e.message:
            raise
        raise type(e)(f"config file {p!r}: {e.message}", hint=e.hint) from None


def _relative_to_cwd(p: str) -> str:
    """' (relative to the working directory D)' for a relative path (a job's working directory is often / or $HOME)."""
    try:
        return "" if os.path.isabs(p) else f" (relative to the working directory {os.getcwd()})"
    except OSError:
        return ""


def _load_config(p: str) -> DpsqlConfig:
    if os.path.isdir(p):
        raise ConfigError(f"config file {p!r} is a directory",
                          hint=f"pass the path of the TOML file, e.g. {os.path.join(p, 'dpsql.toml')!r}")
    if not os.path.exists(p):  # not there (yet): a retry may find it
        raise InputUnavailableError(f"config file {p!r} not found{_relative_to_cwd(p)}",
                                    hint="create dpsql.toml (see examples/dpsql.toml) or pass the path of an existing one")
    if not os.path.isfile(p):
        raise ConfigError(f"config file {p!r} is not a regular file (a device, a pipe or a socket)",
                          hint="pass the path of the TOML file itself (see examples/dpsql.toml)")
    try:
        with open(p, "rb") as f:
            data = f.read()
        # a byte order mark (Windows editors) is not TOML: read past it, as -f does for SQL files
        raw = tomllib.loads(data.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p!r} is not valid TOML: {e}",
                          hint="fix the line named (a text value is quoted: privacy_unit = \"user_id\"; see "
                               "examples/dpsql.toml)") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {p!r} is not UTF-8 text (an invalid byte at offset {e.start})",
                          hint="save the config as UTF-8 (TOML files are UTF-8)") from None
    except OSError as e:
        raise InputUnavailableError(f"config file {p!r} cannot be read: {e.strerror or type(e).__name__}",
                                    hint="check the file's permissions") from None
    except (ValueError, RecursionError) as e:  # what the TOML reader lets through: not TOML errors to it
        raise ConfigError(f"config file {p!r} cannot be read: {_beyond_limits(data, e)}",
                          hint="a dpsql config holds short numbers and shallow values (see examples/dpsql.toml)") from None
    _plain_numbers(data.removeprefix(b"\xef\xbb\xbf").decode("utf-8"), p)
    absp = os.path.abspath(p)
    base = os.path.dirname(absp)
    _unknown(raw, SECTIONS, "top level of the config", "sections")
    led = _section(raw, "ledger")
    eng = _section(raw, "engine")
    tabs = _section(raw, "tables")

    # [ledger]
    _unknown(led, LEDGER_KEYS, "[ledger]", "keys")
    lpath = led.get("path")
    url = led.get("url")
    if url is not None:
        if lpath is not None:
            raise ConfigError("[ledger] names both a path and a url: the budget must live in one place",
                              hint="keep path (a DuckDB file) or url (a PostgreSQL ledger), not both")
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise ConfigError("[ledger] url must be a PostgreSQL URL", hint='url = "postgresql://dpsql@db-host/dpsql"')
    if "ledger" in raw and lpath is None and url is None:
        raise ConfigError(
            "[ledger] in the config names no path: the budget would not be recorded in one place",
            hint='add path = "ledger.duckdb" under [ledger] (relative to the config file), '
            'or path = ":memory:" for an in-memory ledger that forgets every charge (notebooks)',
        )
    if lpath is not None and url is None:
        if not isinstance(lpath, str) or not lpath.strip():
            raise ConfigError(f"[ledger] path must be a non-empty string, got {lpath!r}",
                              hint='path = "ledger.duckdb"')
        if re.match(r"\s*postgres(?:ql)?(?:\+[\w.-]*)?:", lpath, re.I):  # never quoted: it may hold a password
            raise ConfigError("[ledger] path holds a PostgreSQL URL, which dpsql would read as a file path; it is not "
                              "shown, as it may hold a password",
                              hint='write it under [ledger] as url = "postgresql://USER@HOST:PORT/DATABASE" instead of '
                              "path (postgresql:// or postgres://, lower case)")
        if lpath != MEMORY:
            lpath = os.path.normpath(os.path.join(base, os.path.expanduser(lpath)))
    for key in ("epsilon", "delta"):  # a TOML string ("10.0") is text, not the number the total must be
        if key in led and (isinstance(led[key], bool) or not isinstance(led[key], int | float)):
            raise ConfigError(f"[ledger] in config file {p!r}: {key} must be a number, got {led[key]!r}",
                              hint=f"write the number without quotes, e.g. {key} = {'10.0' if key == 'epsilon' else '1e-5'}")
    if "delta" in led and "epsilon" not in led:
        raise ConfigError("[ledger] sets delta but no epsilon", hint="add epsilon = 1.0 under [ledger], or drop delta")
    try:
        budget = Budget(led["epsilon"], led.get("delta", 0.0)) if "epsilon" in led else None
    except ConfigError as e:  # said in the config's terms: the total is [ledger] epsilon/delta
        raise ConfigError(f"[ledger] in config file {p!r}: the total budget's {e.message}",
                          hint="set epsilon = 1.0 (a finite number > 0) and delta = 1e-6 (in [0, 1)) under [ledger]; "
                          "they must match the total the ledger records") from None
    if lpath == MEMORY and budget is None:
        raise ConfigError("an in-memory ledger ([ledger] path = \":memory:\") needs a total budget",
                          hint="add epsilon (and delta) under [ledger]")
    create = led.get("create_if_missing", False)
    if not isinstance(create, bool):
        raise ConfigError(f"[ledger] create_if_missing must be true or false, got {create!r}",
                          hint="create_if_missing = true")

    wait = led.get("lock_timeout", 10.0)
    try:
        ok = not isinstance(wait, bool) and isinstance(wait, int | float) and math.isfinite(wait) and wait >= 0
    except OverflowError:  # an int beyond the float range (TOML reads any number of digits)
        ok = False
    if not ok:
        raise ConfigError(f"[ledger] lock_timeout must be a finite number of seconds >= 0, got {wait!r}",
                          hint="lock_timeout = 60 (how long a command waits for a ledger that other dpsql commands use)")

    # [engine]
    _unknown(eng, engine_keys(), "[engine]", "settings")
    if isinstance(eng.get("temp_directory"), str) and eng["temp_directory"].strip():  # relative: to the file, as sources
        eng = {**eng, "temp_directory": os.path.normpath(os.path.join(base, os.path.expanduser(eng["temp_directory"])))}
    settings = EngineSettings(**eng)

    # [tables.NAME]
    _distinct_folded(tabs, lambda a, b: ConfigError(
        f"the config registers tables '{a}' and '{b}', which are one name to SQL (names are case-insensitive): "
        "one would silently replace the other", hint=f"give each [tables.NAME] section its own name, or merge "
        f"[tables.{b}] into [tables.{a}]"))
    tables = {name: _freeze(table_kwargs(name, spec, base)) for name, spec in tabs.items()}
    _references_registered(tables)
    if url is not None:
        lpath = url  # session_ledger() passes it to open_ledger, which opens the PostgreSQL ledger
    if tables and lpath is None:
        raise ConfigError(
            "the config registers tables but names no ledger file: its budget must live in one place",
            hint='the data owner sets [ledger] path = "ledger.duckdb" in the config',
        )
    return DpsqlConfig(path=absp, base_dir=base, ledger_path=lpath, budget=budget,
                       create_if_missing=create, lock_timeout=float(wait), engine=settings, tables=MappingProxyType(tables))


#: a TOML string (basic, literal, multi-line) or comment, skipped when number literals are judged
_TOML_TEXT = re.compile(r'''"""(?:\\.|[^\\])*?"""|\'\'\'.*?\'\'\'|"(?:\\.|[^"\\\n])*"|'[^'\n]*'|\#[^\n]*''', re.S)
#: a value in key = value or in an array: a number literal starts with a sign or a digit
_TOML_VALUE = re.compile(r"(?:=|\[|,)\s*([+-]?[0-9][0-9A-Za-z_.:+-]*)")


def _plain_numbers(text: str, path: str) -> None:
    """Refuse number literals in a spelling other than plain decimal or scientific notation. TOML
    reads ``1_0`` as 10 and ``0x10`` as 16: a slip for 1.0 in a budget or a cap must not be taken
    at ten times its meaning, as on the command line (``--epsilon 1_0`` is refused there too).
    Dates and times (``2019-01-01``) are not numbers and pass."""
    bare = _TOML_TEXT.sub(lambda m: ('""' if m.group(0)[0] != "#" else "") + "\n" * m.group(0).count("\n"), text)
    for m in _TOML_VALUE.finditer(bare):
        tok = m.group(1)
        if "_" in tok or re.match(r"[+-]?0[xob]", tok):
            line = bare.count("\n", 0, m.start(1)) + 1
            plain = tok.replace("_", "")
            shown = tok if len(tok) <= 40 else f"{tok[:20]}... ({len(tok)} characters)"
            try:
                read = str(int(plain, 0))
            except ValueError:  # a float, or an integer of more digits than Python writes out (4300)
                try:
                    read = repr(float(plain))
                except ValueError:
                    read = ""
            if not read or len(read) > 40:  # no config value is that long: no number to suggest
                raise ConfigError(f"config file {path!r}, line {line}: the number {shown} is not in {PLAIN_FORM}, "
                                  "and far longer than any value of a dpsql config",
                                  hint="write the number in plain decimal, e.g. 10 or 1e-6")
            raise ConfigError(f"config file {path!r}, line {line}: the number {shown} is not in {PLAIN_FORM}",
                              hint=f"TOML reads {tok} as {read}: write {read} if that is meant")


def _beyond_limits(data: bytes, e: BaseException) -> str:
    """Why the TOML reader failed with ``e`` outside its own errors: arrays or tables nested
    thousands deep (RecursionError), or an integer of more than 4300 digits, which Python refuses to
    convert (ValueError), named by its line."""
    if isinstance(e, RecursionError):
        return "its values are nested too deeply (arrays or inline tables inside each other thousands of times)"
    text = _TOML_TEXT.sub(lambda m: "\n" * m.group(0).count("\n"), data.decode("utf-8", "replace"))
    m = re.search(r"[0-9][0-9_]{4000,}", text)
    line = f" (line {text.count(chr(10), 0, m.start()) + 1})" if m else ""
    return f"a number literal{line} has more digits than Python reads (4300)"


def distinct_tables(tables: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``Session(tables=...)``: refused when two names are one to SQL ('E' and 'e': the second replaced the first)."""
    _distinct_folded(tables or {}, lambda a, b: ConfigError(
        f"tables '{a}' and '{b}' are one name to SQL (names are case-insensitive): one would silently replace the other",
        hint="give each table its own name"))
    return tables or {}


def _references_registered(tables: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a reference to a table the file does not register: a config's tables are the whole catalog of
    its commands (the command line adds none to an owner's config), so every query of the referencing table
    would be refused, one by one."""
    names = {str(n).lower(): str(n) for n in tables}
    for name, kw in tables.items():
        for fk, target in (kw.get("references") or {}).items():
            tn = str(target).partition(".")[0].strip().lower()
            if isinstance(target, str) and tn not in names:
                raise ConfigError(f"[tables.{name}] references '{target}' (from '{fk}'), but the config registers no "
                                  f"table '{tn}'{nearest_names([tn], list(names))}",
                                  hint=f"correct the reference, or register '{tn}' in the config ([tables.{tn}]); "
                                  f"the config registers: {', '.join(names.values())}")


def _distinct_folded(names: Any, error: Any) -> None:
    """Raise ``error(first, second)`` for two names that differ only by case (SQL names are case-insensitive)."""
    seen: dict[str, str] = {}
    for n in names:
        first = seen.setdefault(str(n).lower(), str(n))
        if first != n:
            raise error(first, n)


def table_kwargs(name: Any, spec: Any, base_dir: str) -> dict[str, Any]:
    """``Session.register`` keyword arguments (``source`` included) of one ``[tables.NAME]``."""
    if not isinstance(spec, dict):
        raise ConfigError(f"[tables.{name}] in the config must be a table", hint=f"[tables.{name}] source = 'data.parquet'")
    _unknown(spec, TABLE_KEYS, f"[tables.{name}]", "keys")
    if "source" not in spec:
        raise ConfigError(f"table '{name}' in the config needs a source", hint=f"[tables.{name}] source = 'data.parquet'")
    src = spec["source"]
    if not isinstance(src, str) or not src.strip():  # said in TOML terms (the API's other source kinds have no TOML form)
        raise ConfigError(f"[tables.{name}] source must be a file path (a string), got {src!r}",
                          hint=f'[tables.{name}] source = "data/{name}.parquet" (or a glob: "data/{name}/*.parquet")')
    for key in ("public", "allow_conditional_sampling"):
        if key in spec and not isinstance(spec[key], bool):
            raise ConfigError(f"[tables.{name}] {key} must be true or false, got {spec[key]!r}", hint=f"{key} = true")
    for key in ("columns", "references", "degree_bounds"):
        if key in spec and not isinstance(spec[key], dict):
            raise ConfigError(f"[tables.{name}] {key} must be a table, got {spec[key]!r}",
                              hint=f"write it as a [tables.{name}.{key}] section")
    for col, cspec in spec.get("columns", {}).items():
        if not isinstance(cspec, dict):
            raise ConfigError(f"[tables.{name}.columns] {col} must be a table of column settings, got {cspec!r}",
                              hint=f"[tables.{name}.columns.{col}] with bounds = [0, 100] (or domain = [...], bins = N)")
    out = dict(spec)
    if not os.path.isabs(src) and not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", src):  # a URI (s3a://, file://) as given
        out["source"] = os.path.normpath(os.path.join(base_dir, os.path.expanduser(src)))
    return out


#: the column settings a refusal names first ("bounds for 'events.amount' must be ..."): "ordered domain" is ``ordered``
_COLUMN_KEY = re.compile(r"(ordered|bounds|domain|granularity|bins|bin_width|type)\b")


def _table_key(message: str, tables: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The key path (``tables.T``, ``tables.T.KEY``, ``tables.T.columns.C[.KEY]``) of the setting that ``message``,
    a refusal of registering ``tables``, is about; None when it names none of them."""
    low = message.lower()
    for t, spec in tables.items():
        cols = spec.get("columns")
        for c in cols if isinstance(cols, Mapping) else ():
            if f"'{t}.{c}'".lower() in low:
                m = _COLUMN_KEY.match(message)
                return f"tables.{t}.columns.{c}" + (f".{m.group(1)}" if m else "")
        if f"'{t}'".lower() in low or f"'{t}.".lower() in low:
            first = re.match(r"\w+", message)
            if first is not None and first.group() in spec and first.group() != "source":
                return f"tables.{t}.{first.group()}"
            src = spec.get("source")
            return f"tables.{t}" + (".source" if isinstance(src, str) and src in message else "")
    return None


def _freeze(v: Any) -> Any:
    """A read-only copy: tables become MappingProxyTypes, lists tuples (all the way down)."""
    if isinstance(v, dict):
        return MappingProxyType({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    v = raw.get(name, {})
    if not isinstance(v, dict):
        raise ConfigError(f"[{name}] in the config must be a table (a [{name}] section), got {type(v).__name__}",
                          hint=f"write it as a [{name}] section" + (" of [tables.NAME] sections" if name == "tables" else ""))
    return v


def _unknown(d: dict[str, Any], allowed: tuple[str, ...], where: str, what: str) -> None:
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown {what} {unknown} in {where}{nearest_names(unknown, allowed)}",
                          hint=f"allowed {what}: {', '.join(allowed)}")
