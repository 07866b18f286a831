"""The ``dpsql`` command line: init / query / explain / budget / tables.

Exit codes: 0 ok, 2 usage/query/config error, 66 an input file missing or unreadable (a table's source, the
config, -f's SQL file), 3 budget exceeded, 4 ledger error, 75 ledger busy (past the lock time-out), 5 a failure
after the charge (the charge stands), 130 interrupted
(Ctrl-C), 143 terminated (SIGTERM), 129 hung up (SIGHUP, unless ignored), 1 other. Rows go to stdout (or -o FILE, format from its extension); cost, remaining budget and
accuracy to stderr, or as JSON meta (``--format json``, ``--meta FILE``, Parquet schema metadata).
Output files are opened before the charge and replaced atomically; a release whose write fails after
the charge is saved beside the ledger (``dpsql._output``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import errno
import io
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

DEFAULT_LEDGER = "dpsql_ledger.duckdb"

EXAMPLES = {
    "init": "example:\n  dpsql init --epsilon 10 --delta 1e-5 --ledger my_ledger.duckdb",
    "query": (
        "example:\n  dpsql --config examples/dpsql.toml query "
        "\"SELECT country, COUNT(*) AS n FROM events GROUP BY country\" --epsilon 0.5 --delta 1e-6\n"
        "  dpsql --config examples/dpsql.toml query -f sql/examples/age_ranges.sql --workload --epsilon 0.5"
    ),
    "explain": (
        "example:\n  dpsql --config examples/dpsql.toml explain "
        "\"SELECT url, COUNT(*) FROM events GROUP BY url\" --epsilon 1 --delta 1e-6"
    ),
    "budget": "example:\n  dpsql --config examples/dpsql.toml budget --history --format json",
    "tables": "example:\n  dpsql --config examples/dpsql.toml tables",
    "describe": "example:\n  dpsql --config examples/dpsql.toml describe events",
    "suggest-caps": "example:\n  dpsql --config examples/dpsql.toml suggest-caps events --group-by country --epsilon 0.3",
    "main": (
        "example:\n  dpsql --config examples/dpsql.toml query "
        "\"SELECT COUNT(*) FROM events\" --epsilon 0.1"
    ),
}

#: the longest SQL text -f reads (characters)
MAX_SQL_CHARS = 16 * 2**20

#: -o FILE extensions and the format each implies
EXTENSIONS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".txt": "table"}


def _common(p: argparse.ArgumentParser, *, sub: bool = False) -> None:
    """Options accepted before or after the subcommand (a subcommand never resets them)."""
    g = p.add_argument_group("tables and ledger")

    def d(v: Any) -> Any:
        return argparse.SUPPRESS if sub else v

    g.add_argument("--config", metavar="FILE", default=d(None), help="dpsql.toml with [ledger] and [tables.NAME] (default: ./dpsql.toml if present)")
    g.add_argument("--ledger", metavar="PATH", default=d(None), help=f"budget ledger file (default: from config, $DPSQL_LEDGER, or ./{DEFAULT_LEDGER})")
    g.add_argument("--lock-timeout", metavar="SECONDS", type=_number("--lock-timeout"), default=d(None),
                   help="how long to wait for a ledger that other dpsql commands are using (default: [ledger] lock_timeout "
                   "of the config, else 10; recording an answered query's release waits 10 s, or twice it, longer)")
    g.add_argument("--table", action="append", default=d([]), metavar="NAME=PATH", help="register a Parquet/CSV file as a table (repeatable)")
    g.add_argument("--privacy-unit", action="append", default=d([]), metavar="NAME=COLUMN", help="privacy unit column of a --table")
    g.add_argument("--max-groups", action="append", default=d([]), metavar="NAME=N", help="max groups per unit for a --table (default 1)")
    g.add_argument("--max-rows", action="append", default=d([]), metavar="NAME=K", help="max rows per (unit, group) for a --table (default 1)")
    g.add_argument("--bounds", action="append", default=d([]), metavar="NAME.COL=LO:HI", help="value bounds of a column (repeatable)")
    g.add_argument("--domain", action="append", default=d([]), metavar="NAME.COL=A,B,C",
                   help="public key values of a column: GROUP BY it releases every one (repeatable)")
    g.add_argument("--bins", action="append", default=d([]), metavar="NAME.COL=LO:HI:N",
                   help="ordered domain of a column for range counts and histograms (DAWA), N bins (repeatable)")
    g.add_argument("--type", action="append", default=d([]), metavar="NAME.COL=TYPE",
                   help="the type of a CSV column (read as VARCHAR otherwise), e.g. events.amount=DOUBLE: BOOLEAN, INTEGER, "
                   "BIGINT, DOUBLE, DECIMAL(p,s), DATE, TIMESTAMP, ... (repeatable)")
    g.add_argument("--public", action="append", default=d([]), metavar="NAME", help="a --table that holds no person (joined freely)")
    g.add_argument("--reference", action="append", default=d([]), metavar="NAME.COL=TABLE.COL",
                   help="a foreign key of a --table (its target is a key; repeatable)")
    g.add_argument("--degree-bound", action="append", default=d([]), metavar="NAME.COL=N",
                   help="at most N rows of a --table per value of its foreign key COL (repeatable)")
    g.add_argument("--max-table-rows", action="append", default=d([]), metavar="NAME=N",
                   help="a public upper bound on a --table's row count (explain then evaluates join error bounds)")
    g.add_argument("--allow-conditional-sampling", action="append", default=d([]), metavar="NAME",
                   help="a --table whose joins with an attested Delta may be sampled (q < 1; privacy conditional on the "
                        "declared bounds)")
    g.add_argument(
        "--debug", action="store_true", default=d(False),
        help="data owner only, UNSAFE: show DuckDB's scrubbed error messages; honoured when every table comes from "
        "--table, or when the config sets [engine] debug = true (see docs/threat_model.md)",
    )


def _query_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", nargs="?", help="one SELECT statement")
    p.add_argument("-f", "--file", metavar="FILE", help="read the SQL from a file ('-': standard input)")
    p.add_argument("--epsilon", required=True, type=_number("--epsilon"), help="privacy budget epsilon to spend")
    p.add_argument("--delta", type=_number("--delta"), default=0.0, help="privacy budget delta to spend (default 0)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="mechanism option, e.g. tau=10 (repeatable)")
    p.add_argument("--reuse-synopsis", action="store_true",
                   help="answer a range count from a stored DAWA synopsis for free (it kept at most max_rows_per_unit rows per "
                   "person before the range predicate: a slightly different quantity)")
    p.add_argument(
        "--workload",
        action="store_true",
        help="the SQL holds several range counts (separated by ';'): answer them together with DAWA, one charge",
    )


class _Number(float):
    """A number flag's value that remembers the text typed, so that a refusal can quote it."""

    text: str


_EXAMPLE = {"--epsilon": "--epsilon 1.0", "--delta": "--delta 1e-6", "--quantile": "--quantile 0.9",
            "--lock-timeout": "--lock-timeout 60"}


def _number(flag: str) -> Any:
    def parse(text: str) -> _Number:
        try:
            v = _Number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number in plain decimal or scientific notation "
                                             f"(e.g. {_EXAMPLE[flag]})") from None
        v.text = text
        return v

    return parse


#: a decimal number as float() reads it (underscores removed): its mantissa, and an exponent never expanded
_DECIMAL = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:[eE][+-]?\d+)?"


def _unrepresentable(text: str, v: float) -> str:
    """Why the decimal ``text`` does not survive as the double ``v`` ('' when it does). Judged from the
    text's form and its mantissa alone: the exact value of ``1e999999999999`` is an integer of a
    trillion digits, which took the command minutes and all the machine's memory to build."""
    import re
    from decimal import Decimal

    m = re.fullmatch(_DECIMAL, text.strip().replace("_", ""))
    if m is None:  # nan, inf, or a spelling only float() reads
        return ""
    if math.isinf(v):
        return "it overflows to infinity (beyond the largest double-precision number, about 1.8e308); "
    if v == 0 and Decimal(m.group(1)) != 0:
        return "it underflows to 0 (below the smallest positive double-precision number, about 4.9e-324); "
    return ""


def _spelling(text: str, v: float) -> str:
    """Why ``text``, which float() read as ``v``, is refused for its spelling ('' when plain, and for
    nan and inf words, refused for their value): '1_0' is 10 to float(), ' 1' and full-width digits
    are numbers to it too, but a number flag takes plain notation only."""
    from dpsql.budget import is_plain_number

    if is_plain_number(text) or not math.isfinite(v):
        return ""
    return f"{text!r} is not a plain number (Python would read it as {v:g}); "


def _form(text: str) -> str:
    """The accepted notation, named in a refusal of a value not written in it."""
    from dpsql.budget import PLAIN_FORM, is_plain_number

    return "" if is_plain_number(text) else f", written in {PLAIN_FORM}"


def _check_numbers(args: argparse.Namespace) -> None:
    """Refuse, in the flag's own terms and quoting what was typed, a number flag outside its range,
    including a decimal that a double cannot hold (1e-400 underflows to 0, 1e400 overflows to inf)."""
    import shlex

    from dpsql.errors import ConfigError

    positive = args.command != "init"  # a ledger's total may be 0; a charge may not
    rules = {"--epsilon": ("a finite number > 0" if positive else "a finite number >= 0",
                           lambda v: v > 0 if positive else v >= 0),
             "--delta": ("a number in [0, 1)", lambda v: 0 <= v < 1),
             "--quantile": ("a number strictly between 0 and 1", lambda v: 0 < v < 1),
             "--lock-timeout": ("a finite number of seconds >= 0", lambda v: v >= 0)}
    for flag, (want, ok) in rules.items():
        v = getattr(args, flag[2:].replace("-", "_"), None)
        if not isinstance(v, _Number):
            continue
        why = _unrepresentable(v.text, v) + _spelling(v.text, v)
        if not why and math.isfinite(v) and ok(v):
            setattr(args, flag[2:].replace("-", "_"), float(v))  # the library sees a plain float
            continue
        hint = f"give {want}, e.g. {_EXAMPLE[flag]}"
        if flag == "--delta":
            hint += " (well below 1/number_of_people), or --delta 0 for pure DP"
        raise ConfigError(f"{flag} {shlex.quote(v.text)} is refused: {why}{flag} must be {want}{_form(v.text)}", hint=hint)


class _Parser(argparse.ArgumentParser):
    """argparse's parser with every flag spelled in full and a mistyped flag named beside the flag meant. Prefix
    matching (``--eps`` read as --epsilon, documented nowhere) made a job's line break, or change meaning, the day a
    flag with the same prefix was added (``--o`` was already ambiguous between --option and --output); and
    ``--epsilom 0.1`` was refused as 'the following arguments are required: --epsilon', which hid what was typed."""

    #: the command line being parsed (set by main), where a refusal looks for the flags it does not know
    argv: Sequence[str] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    #: how writing --help or --version to standard output went: None (not written, or written whole), "closed" (no
    #: standard output), "gone" (a pipe whose reader has left: `dpsql --help | head -1`) or the OSError of the write
    help_failed: Any = None

    def _print_message(self, message: str, file: Any = None) -> None:
        """argparse's, which drops every failure of the write (`dpsql --help > /dev/full` exited 0, the help lost) and
        prints the help on standard error when standard output is closed; the failure is kept for main() to say."""
        if not message or (file is not None and file is not sys.stdout):
            super()._print_message(message, file)
            return
        out = sys.stdout
        if out is None or 1 in _CLOSED_AT_START:
            _Parser.help_failed = "closed"
            return
        try:
            out.write(message)
            out.flush()
        except BrokenPipeError:
            _Parser.help_failed = "gone"
            _silence_stdout()
        except OSError as e:
            _Parser.help_failed = e
            _silence_stdout()

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}{self._unknown_flags()}\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, but leftover arguments are refused by the parser of the command they were given to (its
        usage lists the flags they were meant as), not by dpsql's, whose usage lists none of the command's."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            choices = next((a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)), None) or {}
            command = choices.get(getattr(parsed, "command", None) or "")
            (command if isinstance(command, _Parser) else self).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _unknown_flags(self) -> str:
        import difflib

        known = [o for o in self._option_string_actions if o.startswith("--")]
        seen: set[str] = set()
        said = ""
        for token in self.argv:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if not name.startswith("--") or len(name) < 3 or any(c.isspace() for c in name) or name in known or name in seen:
                continue  # (a text with a space is a value: the SQL "-- comment\nSELECT ...")
            seen.add(name)
            longer = [o for o in known if o.startswith(name)]
            close = longer or difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            said += (f"; {name} is not a flag of {self.prog}" + (" (flags are spelled in full)" if longer else "")
                     + (f": did you mean {' or '.join(close)}?" if close else f" ({self.prog} --help lists its flags)"))
        return said


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="dpsql",
        description="Differentially private SQL over Parquet files, with a durable budget ledger.\n\n"
        "exit codes: 0 ok, 2 usage/query/config error (nothing charged), 66 an input file (a table's\n"
        "  source, the config, the -f SQL file) is missing or unreadable (nothing charged: a retry may\n"
        "  succeed once it is there), 3 budget exceeded,\n"
        "  4 ledger error (nothing charged), 75 the ledger is busy: other commands held it past --lock-timeout\n"
        "  (nothing charged: a retry later may succeed), 5 a failure after the charge (the charge stands; the\n"
        "  message says what became of the answer), 130 interrupted by Ctrl-C, 143 by SIGTERM or 129 by\n"
        "  SIGHUP (a charge already made stands), 1 any other failure (nothing charged, unless the\n"
        "  message is 'unexpected ...': a bug inside the query's run; see dpsql budget --history);\n"
        "  standard output that fails as a free command prints (a reader gone, a full disk) is 1; --help\n"
        "  and --version whose reader left early (dpsql --help | head -1) exit 0",
        epilog=EXAMPLES["main"],
        formatter_class=fmt,
    )
    _common(parser)
    from dpsql import __version__

    parser.add_argument("--version", action="version", version=f"dpsql {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="{init,query,explain,budget,tables,describe,suggest-caps}")
    p = sub.add_parser("init", help="create a budget ledger with a total budget", epilog=EXAMPLES["init"], formatter_class=fmt)
    _common(p, sub=True)
    p.add_argument("--epsilon", required=True, type=_number("--epsilon"), help="total epsilon")
    p.add_argument("--delta", type=_number("--delta"), default=0.0, help="total delta (default 0)")
    p = sub.add_parser("query", help="run a differentially private query", epilog=EXAMPLES["query"], formatter_class=fmt)
    _common(p, sub=True)
    _query_args(p)
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default=None,
                   help="output format (default: from -o's extension .parquet/.csv/.json/.txt, else table); json prints "
                   '{"rows": [...], "meta": {...}}')
    p.add_argument("--meta", metavar="FILE", help="also write the release's meta (cost, remaining budget, ledger id, accuracy) as JSON")
    p.add_argument("-o", "--output", metavar="FILE", help="write rows to FILE instead of stdout ('-': stdout)")
    p = sub.add_parser("explain", help="show mechanism, noise and bounded SQL (free)", epilog=EXAMPLES["explain"], formatter_class=fmt)
    _common(p, sub=True)
    _query_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--format", choices=["table", "json"], default=None, help="output format (default table; json: as --json)")
    p = sub.add_parser("budget", help="show the total, spent and remaining budget", epilog=EXAMPLES["budget"], formatter_class=fmt)
    _common(p, sub=True)
    p.add_argument("--history", action="store_true", help="list every ledger entry and every change of the total")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output format")
    p.add_argument("--set-total", nargs=2, metavar=("EPSILON", "DELTA"), help="change the total budget (recorded in the ledger; needs --reason)")
    p.add_argument("--reason", default="", help="why the total changes (required with --set-total)")
    p = sub.add_parser("tables", help="list the registered tables and their public policy (free)", epilog=EXAMPLES["tables"],
                       formatter_class=fmt)
    _common(p, sub=True)
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    p = sub.add_parser("suggest-caps", help="charged advice on caps: noisy histograms of per-person contributions",
                       epilog=EXAMPLES["suggest-caps"], formatter_class=fmt)
    _common(p, sub=True)
    p.add_argument("name", help="the table")
    p.add_argument("--epsilon", required=True, type=_number("--epsilon"), help="privacy budget epsilon to spend")
    p.add_argument("--group-by", metavar="COL", help="also suggest max_groups_per_unit and max_rows_per_group for GROUP BY COL")
    p.add_argument("--quantile", type=_number("--quantile"), default=0.9, help="share of people the caps keep whole (default 0.9)")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    p = sub.add_parser("describe", help="one registered table's columns and types and its public policy: unit, caps, bounds, domains (free)",
                       epilog=EXAMPLES["describe"], formatter_class=fmt)
    _common(p, sub=True)
    p.add_argument("name", help="the table")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    _once(parser, {})
    for each in (parser, *sub.choices.values()):
        # a negative number in any notation is a value, never an option (no flag looks like one): argparse's own
        # pattern knows only -1 and -0.5, so `--set-total 1 -1e-9` was 'expected 2 arguments' instead of its refusal
        each._negative_number_matcher = _NEGATIVE_NUMBER
    return parser


_NEGATIVE_NUMBER = re.compile(r"^-(?:(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d[\d_]*)?|inf(?:inity)?|nan)$",
                              re.IGNORECASE)


class _Once(argparse.Action):
    """A flag that takes one value: given twice (anywhere on the line, e.g. --epsilon 0.1 ...
    --epsilon 5, or --ledger before and after the command) it is a usage error, where argparse
    would silently keep the last."""

    seen: dict[str, str]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        shown = " ".join(values) if isinstance(values, list) else getattr(values, "text", values)
        if self.dest in self.seen:
            parser.error(f"{option_string} is given twice ({self.seen[self.dest]} and {shown}): give it once")
        self.seen[self.dest] = str(shown)
        setattr(namespace, self.dest, values)


def _once(parser: argparse.ArgumentParser, seen: dict[str, str]) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                _once(sub, seen)
        elif type(action) is argparse._StoreAction and action.option_strings:
            action.__class__ = _Once  # type: ignore[assignment]
            action.seen = seen  # type: ignore[attr-defined]


#: the per-table flags whose NAME is TABLE.COLUMN, and an example of each flag (a refusal of an empty NAME shows it)
_COLUMN_FLAGS = ("--bounds", "--domain", "--bins", "--type", "--reference", "--degree-bound")
_KV_EXAMPLE = {"--table": "events=events.parquet", "--privacy-unit": "events=user_id", "--max-groups": "events=5",
               "--max-rows": "events=1", "--bounds": "events.amount=0:100", "--domain": "events.country=US,FR,DE",
               "--bins": "events.age=0:120:120", "--type": "events.amount=DOUBLE", "--reference": "orders.o_custkey=customer.c_custkey",
               "--degree-bound": "orders.o_custkey=16", "--max-table-rows": "orders=1500000", "--option": "tau=10"}


def _kv(items: list[str], what: str, *, fold: bool = True) -> dict[str, str]:
    """NAME=VALUE items by NAME. Table and column names are case-insensitive (SQL registers and
    resolves them in lower case), so with ``fold`` the names are lower-cased, and two spellings of
    one name (``t=a.parquet`` and ``T=b.parquet``) are the same name given twice."""
    from dpsql.errors import ConfigError

    out: dict[str, str] = {}
    typed: dict[str, str] = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"{what} expects NAME=VALUE, got {it!r}", hint=f"e.g. {what} {_KV_EXAMPLE.get(what, 'NAME=VALUE')}")
        k, v = it.split("=", 1)
        k = k.strip()
        if not k:  # e.g. --table "$NAME=..." with NAME unset
            names = "option" if what == "--option" else "column" if what in _COLUMN_FLAGS else "table"
            raise ConfigError(f"{what} {it} names no {names}: the text before '=' is empty",
                              hint=f"e.g. {what} {_KV_EXAMPLE.get(what, 'NAME=VALUE')}")
        key = k.lower() if fold else k
        if key in out:  # a silent "last one wins" would query with a declaration the caller did not mean
            raise ConfigError(
                f"{what} is given twice for {key!r} ({typed[key]}={out[key]} and {k}={v.strip()})"
                + (" (names are case-insensitive)" if typed[key] != k else ""),
                hint=f"give {what} once per name",
            )
        out[key] = v.strip()
        typed[key] = k
    return out


def _option_value(v: str) -> Any:
    """An --option value: true/false (any case) are booleans (clip_negative=true), else as below."""
    if v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    return _parse_option_value(v)


def _parse_option_value(v: str) -> Any:
    """A number when ``v`` is one in plain notation (whole: an int), else as below; other spellings
    that float() would read ('1_0', 'inf') stay text, refused where a number is needed."""
    from dpsql.budget import is_plain_number

    if is_plain_number(v):
        return int(v) if v.lstrip("+-").isdigit() else float(v)
    if v.startswith(("{", "[")):  # a mapping or list option, e.g. degree_caps={"orders.o_custkey": 16}, grouping_weights=[1, 3]
        import json

        try:
            return json.loads(v)
        except ValueError:
            pass
    return v


def _ledger_path(args: argparse.Namespace, cfg: Any) -> str:
    """The ledger file of this command: the config's (``[ledger] path``), else --ledger,
    $DPSQL_LEDGER or ./dpsql_ledger.duckdb (command-line behaviour, for files registered with
    --table). A config that registers tables keeps its own ledger (see _check_owner_config)."""
    from dpsql.errors import ConfigError

    if cfg.registers_tables:
        _check_owner_config(args)
    if args.ledger is not None and not str(args.ledger).strip():  # e.g. --ledger "$UNSET_VARIABLE"
        raise ConfigError("--ledger is empty: no ledger file was named",
                          hint="give the ledger file, e.g. --ledger ledger.duckdb, or drop --ledger to use the config's "
                          "[ledger] path")
    if args.ledger and str(args.ledger) == ":memory:":
        raise ConfigError("--ledger :memory: would forget every charge when the command ends",
                          hint="give a ledger file, e.g. --ledger ledger.duckdb (create it with dpsql init)")
    if args.ledger:
        args.ledger_where = "--ledger"  # a URL's connection failure names it (_where_the_url_is)
        return _utf8_ledger(os.path.expanduser(str(args.ledger)), "--ledger")  # --ledger=~/x: no shell expands it
    if cfg.in_memory:
        raise ConfigError(
            f'config file {cfg.shown_path!r} keeps its ledger in memory ([ledger] path = ":memory:"): the command line '
            "needs a ledger file, or every command would start from a fresh budget",
            hint='set [ledger] path = "ledger.duckdb" in the config',
        )
    if cfg.ledger_path is not None:
        args.ledger_config = cfg  # a missing ledger's hint then names the config (_config_ledger_text)
        shared = os.environ.get("DPSQL_LEDGER", "").strip()
        if shared and str(cfg.ledger_path) not in (shared, os.path.abspath(os.path.expanduser(shared))):  # never quoted: a URL's password
            print(f"warning: $DPSQL_LEDGER is set but not used: the config {args.config_path!r} names its ledger under [ledger], "
                  "which comes first (unset DPSQL_LEDGER, or point it at the same ledger, to silence this)", file=sys.stderr)
        args.ledger_where = f"[ledger] url in {args.config_path!r}"
        return _utf8_ledger(str(cfg.ledger_path), f"[ledger] path of the config {args.config_path!r}")
    env = os.environ.get("DPSQL_LEDGER")
    if env is not None and not env.strip():
        raise ConfigError("$DPSQL_LEDGER is set but empty: no ledger file was named",
                          hint="set DPSQL_LEDGER to the ledger file, unset it, or pass --ledger PATH")
    if env is not None:
        args.ledger_where = "$DPSQL_LEDGER"
        return _utf8_ledger(os.path.expanduser(env), "$DPSQL_LEDGER")
    args.ledger_default = True  # a missing ledger's message says so: a cron job's working directory is / or $HOME
    return DEFAULT_LEDGER


def _utf8_ledger(path: str, where: str) -> str:
    """``path``, refused in the terms of ``where`` it came from when it is not UTF-8 text: DuckDB
    opens only files whose names are UTF-8 (a byte that is not reaches Python as a lone surrogate)."""
    from dpsql.errors import ConfigError

    bad = next((c for c in os.path.abspath(path) if "\udc80" <= c <= "\udcff"), None)
    if bad is not None:
        raise ConfigError(f"the ledger path {path!r} given by {where} is not UTF-8 text (byte 0x{ord(bad) - 0xDC00:02X} is "
                          "not UTF-8): DuckDB opens only files whose names are UTF-8; nothing was created or charged",
                          hint=f"give {where.split(' of ')[0]} a path that is UTF-8 text (rename the ledger file, together "
                          "with its hidden .NAME.generation marker, if it exists)")
    return path


def _config_ledger_text(e: Any, config: str, cfg: Any) -> str:
    """The text of ``e``, a refusal of the ledger that the config names, with a hint that works with that config: the
    ledger's own (`dpsql init ... --ledger PATH`, e.g. --ledger ledger.duckdb) is refused with a config that registers
    tables, and 'pass the total together with create=True' is the Python API's fix."""
    import re
    import shlex

    from dpsql.errors import LedgerError

    message = getattr(e, "message", "")
    init = f"dpsql --config {shlex.quote(config)} init"
    if not isinstance(e, LedgerError):
        return str(e)
    if not message.startswith("no budget ledger ") or "but a ledger existed" in message or "search_path" in message:
        # another refusal of the config's ledger (a directory, a damaged file): its hint's flags as config keys
        total = ("EPSILON", "DELTA") if cfg.budget is None else (repr(cfg.budget.epsilon), repr(cfg.budget.delta))
        text = str(e).replace("e.g. --ledger ledger.duckdb", f'e.g. path = "ledger.duckdb" under [ledger] in {config!r}')
        text = re.sub(r"`dpsql init --epsilon \S+ --delta \S+ --ledger NEW_PATH`( \(choose your total\))?",
                      f"a new path under [ledger] in {config!r}, then `{init} --epsilon {total[0]} --delta {total[1]}`", text)
        return re.sub(r"`dpsql init --epsilon \S+ --delta \S+ --ledger [^`]+`( \(choose your total\))?",
                      f"`{init} --epsilon {total[0]} --delta {total[1]}`", text)
    if cfg.budget is not None:
        hint = f"create it with `{init} --epsilon {cfg.budget.epsilon!r} --delta {cfg.budget.delta!r}` (the total under [ledger])"
    else:
        write = f"write the total, epsilon = ... and delta = ..., under [ledger] in {config!r}"
        hint = ((f"the data owner may {write}, then create the ledger with `{init} --epsilon EPSILON --delta DELTA` (the "
                 "same values)" if cfg.registers_tables else f"create it with `{init} --epsilon EPSILON --delta DELTA` "
                 f"(choose your total), or {write}")
                + (" (create_if_missing = true then creates it with that total)" if cfg.create_if_missing else ""))
    return (f"{message}\nhint: {hint}; if the ledger was moved or lost, restore it from a backup (dpsql never starts a "
            "fresh budget by itself)")


def _check_owner_config(args: argparse.Namespace) -> None:
    """A config that registers tables is the data owner's: its tables, their policy (tau, caps,
    bounds) and its ledger cannot be replaced from the command line, or an analyst could register
    the owner's file again under a policy of their own, or charge a fresh ledger of their own.
    (Such a config always names its ledger: ``dpsql.config.load_config`` refuses it otherwise.)
    """
    from dpsql.errors import ConfigError

    flags = [f for f, v in (("--table", args.table), ("--privacy-unit", args.privacy_unit), ("--max-groups", args.max_groups),
                            ("--max-rows", args.max_rows), ("--bounds", getattr(args, "bounds", None)),
                            ("--domain", getattr(args, "domain", None)), ("--bins", getattr(args, "bins", None)),
                            ("--type", getattr(args, "type", None)), ("--ledger", args.ledger),
                            ("--public", getattr(args, "public", None)), ("--reference", getattr(args, "reference", None)),
                            ("--degree-bound", getattr(args, "degree_bound", None)),
                            ("--max-table-rows", getattr(args, "max_table_rows", None)),
                            ("--allow-conditional-sampling", getattr(args, "allow_conditional_sampling", None)))
             if v]
    if flags:
        which = f"{args.config_path!r}" + (", read from the working directory as no --config was given" if args.config is None else "")
        raise ConfigError(
            f"{', '.join(flags)} cannot be combined with a config that registers tables ({which}): the config's tables, their policy "
            "and its ledger belong to the data owner",
            hint="drop these flags to query the config's tables, or use --table without --config for files of your own"
            + (" (from a directory without a dpsql.toml, which is read whenever --config is not given)" if args.config is None
               else ""),
        )


def _load_config(args: argparse.Namespace) -> Any:
    """The config of --config (or ./dpsql.toml when present), read by the same loader as
    ``Session.from_config``; an empty config when there is none."""
    from dpsql.config import DpsqlConfig, load_config

    path = args.config
    if path is None and os.path.exists("dpsql.toml"):
        path = "dpsql.toml"
    args.config_path = path
    return DpsqlConfig() if path is None else load_config(path)


def _lock_timeout(args: argparse.Namespace, cfg: Any) -> float:
    """How long this command waits for a busy ledger: --lock-timeout, else the config's [ledger]
    lock_timeout (10 s by default). Any user may set it: it changes no policy, only this command's wait."""
    v = getattr(args, "lock_timeout", None)
    return float(cfg.lock_timeout if v is None else v)


def _create_if_missing(args: argparse.Namespace, cfg: Any) -> bool:
    """A missing ledger is created only by `dpsql init` or `[ledger] create_if_missing = true`; the
    latter applies to the ledger the config names, not to a --ledger given on the command line."""
    return bool(cfg.create_if_missing and not args.ledger and cfg.ledger_path is not None)


def _open_session(args: argparse.Namespace, *, ledger: bool = True) -> Any:
    """The command's Session; ``ledger=False`` (tables, describe: the catalog alone) reads and creates no ledger."""
    import dpsql
    from dpsql.catalog import MAX_BINS
    from dpsql.errors import ConfigError

    cfg = _load_config(args)
    path = _ledger_path(args, cfg)  # (its checks hold either way: an owner's config refuses --ledger)
    _check_flag_tables(args, _kv(args.table, "--table"))  # a mistyped table name, before the ledger is opened
    with cfg.naming_tables():  # a refused [tables.NAME] setting names the file
        s = dpsql.Session(ledger=path if ledger else None, budget=cfg.budget if ledger else dpsql.Budget(1.0),
                          create=ledger and _create_if_missing(args, cfg), engine=_engine_settings(args, cfg),
                          tables=cfg.tables, lock_timeout=_lock_timeout(args, cfg))
    args.opened_ledger = s.ledger if ledger else None  # a signal's message says what it recorded of this command
    try:
        tables = _kv(args.table, "--table")
        for name, path in tables.items():
            if not path:  # --table "events=$SRC" with SRC unset
                raise ConfigError(f"--table {name}= names no file: the PATH after '=' is empty",
                                  hint=f"give the table's Parquet or CSV file, e.g. --table {name}={name}.parquet (or a "
                                  f"glob: --table '{name}=data/*.parquet')")
            if path.startswith("~"):  # --table e=~/data.parquet quoted, or --table=e=~/...: no shell expands it (as --ledger)
                tables[name] = os.path.expanduser(path)
        units = _kv(args.privacy_unit, "--privacy-unit")
        groups = _kv(args.max_groups, "--max-groups")
        rows = _kv(args.max_rows, "--max-rows")
        bounds: dict[str, dict[str, Any]] = {}
        said: dict[tuple[str, str], list[str]] = {}  # (table, column): the per-column flags that name it, as given

        def note(flag: str, k: str, v: str) -> None:
            said.setdefault(tuple(k.partition(".")[::2]), []).append(f"{flag} {k}={v}")  # type: ignore[arg-type]

        for k, v in _kv(args.bounds, "--bounds").items():
            note("--bounds", k, v)
            t, _, c = k.partition(".")
            parts = v.split(":")
            if len(parts) != 2 or not c:
                raise ConfigError(f"--bounds expects NAME.COL=LO:HI, got {k}={v}", hint="e.g. --bounds events.amount=0:100")
            if any(re.fullmatch(r"\s*\d{4}-\d{2}-\d{2}\s*", x) for x in parts):  # a date range: declared with its grid
                raise ConfigError(f"--bounds {k}={v} is refused: --bounds takes numbers; a DATE or TIMESTAMP column's range is "
                                  "declared with its bins (--bins), which MIN, MAX, quantiles and histograms of it need",
                                  hint=f"e.g. --bins {k}={parts[0].strip()}:{parts[1].strip()}:{_days(*parts) or 'N'} (one bin "
                                  "per day from LO to HI, HI excluded)")
            lo, hi = (_flag_value("--bounds", f"{k}={v}", x, "e.g. --bounds events.amount=0:100") for x in parts)
            if lo > hi:
                raise ConfigError(f"--bounds {k}={v} is refused: LO must be at most HI", hint=f"e.g. --bounds {k}={parts[1]}:{parts[0]}")
            bounds.setdefault(t, {}).setdefault(c, {})["bounds"] = (lo, hi)
        for k, v in _kv(args.domain, "--domain").items():
            note("--domain", k, v)
            t, _, c = k.partition(".")
            values = [x.strip() for x in v.split(",") if x.strip()]
            if not c or not values:
                raise ConfigError(f"--domain expects NAME.COL=A,B,C, got {k}={v}", hint="e.g. --domain events.country=US,FR,DE")
            bounds.setdefault(t, {}).setdefault(c, {})["domain"] = values  # as typed: read by the column's type
        for k, v in _kv(args.bins, "--bins").items():
            note("--bins", k, v)
            t, _, c = k.partition(".")
            parts = v.split(":")
            if len(parts) != 3 or not c:
                raise ConfigError(f"--bins expects NAME.COL=LO:HI:N, got {k}={v}", hint="e.g. --bins events.age=0:120:120")
            example = "e.g. --bins events.age=0:120:120 (a DATE or TIMESTAMP column: --bins events.day=2024-01-01:2025-01-01:366)"
            digits = [x[:4] + x[5:7] + x[8:] for x in parts[:2]]
            blo: str | float
            bhi: str | float
            if all(len(x) == 10 and x[4] == x[7] == "-" and d.isascii() and d.isdigit() for x, d in zip(parts, digits)):
                # a date grid (YYYY-MM-DD): the column's type reads it, as the config's bounds = ["2024-01-01", ...]
                blo, bhi = parts[0], parts[1]
                for x in parts[:2]:
                    try:
                        datetime.date.fromisoformat(x)
                    except ValueError:
                        raise ConfigError(f"--bins {k}={v} is refused: '{x}' is not a date", hint=example) from None
                ascending = parts[0] < parts[1]  # YYYY-MM-DD texts sort as their dates
            else:
                nlo, nhi = (_flag_value("--bins", f"{k}={v}", x, example) for x in parts[:2])
                blo, bhi, ascending = nlo, nhi, nlo < nhi
            n = int(_flag_value("--bins", f"{k}={v}", parts[2], example, whole=True, least=1))
            if n > MAX_BINS:  # (the catalog's refusal named neither the flag nor a date grid's form)
                raise ConfigError(f"--bins {k}={v} is refused: N must be at most {MAX_BINS:,} bins",
                                  hint=f"give fewer bins, e.g. --bins {k}={parts[0]}:{parts[1]}:{_days(*parts[:2]) or 1000}")
            if not ascending:
                raise ConfigError(f"--bins {k}={v} is refused: LO must be below HI", hint=example)
            declared = bounds.get(t, {}).get(c, {}).get("bounds")
            if declared is not None and declared != (blo, bhi):  # (the grid's bounds replaced them without a word)
                given = next(x for x in said[(t, c)] if x.startswith("--bounds "))
                raise ConfigError(f"{given} and --bins {k}={v} declare two different bounds for column '{c}' of table {t}: "
                                  "the grid of --bins is over its bounds LO:HI, which SUM, AVG and the other aggregates "
                                  "clamp to as well; nothing was charged",
                                  hint=f"give the column one range: drop {given} (--bins declares the bounds too), or give "
                                  f"--bins the same LO:HI, e.g. --bins {k}={given.split('=', 1)[1]}:{parts[2]}")
            bounds.setdefault(t, {}).setdefault(c, {}).update({"bounds": (blo, bhi), "bins": n})
        for k, v in _kv(getattr(args, "type", []), "--type").items():
            t, _, c = k.partition(".")
            _check_type_flag(t, c, v)
            note("--type", k, v)
            bounds.setdefault(t, {}).setdefault(c, {})["type"] = v
        refs: dict[str, dict[str, str]] = {}
        for k, v in _kv(getattr(args, "reference", []), "--reference").items():
            t, _, c = k.partition(".")
            note("--reference", k, v)
            refs.setdefault(t, {})[c] = v
        degrees: dict[str, dict[str, int]] = {}
        for k, v in _kv(getattr(args, "degree_bound", []), "--degree-bound").items():
            t, _, c = k.partition(".")
            degrees.setdefault(t, {})[c] = int(_flag_value("--degree-bound", f"{k}={v}", v, "e.g. --degree-bound orders.o_custkey=16",
                                                            whole=True, least=1))
        sizes: dict[str, int] = {}
        for k, v in _kv(getattr(args, "max_table_rows", []), "--max-table-rows").items():
            sizes[k] = int(_flag_value("--max-table-rows", f"{k}={v}", v, "e.g. --max-table-rows orders=1500000", whole=True, least=1))
        for flag, dest in (("--public", "public"), ("--allow-conditional-sampling", "allow_conditional_sampling")):
            if any(not n.strip() for n in getattr(args, dest, []) or []):  # e.g. --public "$LOOKUP" with LOOKUP unset
                raise ConfigError(f"{flag} is empty: it names no table; nothing was charged",
                                  hint=f"give {flag} the name of a --table, e.g. {flag} {next(iter(tables), 'NAME')}")
        public = {n.strip().lower() for n in getattr(args, "public", []) or []}
        sampling = {n.strip().lower() for n in getattr(args, "allow_conditional_sampling", []) or []}
        # public tables first, then people, then tables that reference them
        order = sorted(tables, key=lambda n: (n not in public, n not in units, n))
        for name in order:
            path = tables[name]
            if name not in units and name not in public and name not in refs:
                raise ConfigError(
                    f"--table {name} needs a privacy unit", hint=f"add --privacy-unit {name}=user_id (or --public {name})"
                )
            caps = [f"{flag} {name}={given[name]}" for flag, given in (("--max-groups", groups), ("--max-rows", rows))
                    if name in public and name in given]
            if caps:  # (a public table has no person to cap: the flag was dropped without a word, often meant for another table)
                raise ConfigError(f"{' and '.join(caps)} {'are' if len(caps) > 1 else 'is'} refused: --public {name} declares a "
                                  "table that holds no person, so it has no caps per person; nothing was charged",
                                  hint=f"drop {' and '.join(caps)}, or give the caps to a table of people (one with "
                                  "--privacy-unit NAME=COLUMN)")
            try:
                s.register(
                    name,
                    path,
                    privacy_unit=units.get(name),
                    max_groups_per_unit=_cap("--max-groups", name, groups.get(name, "1")),
                    max_rows_per_group=_cap("--max-rows", name, rows.get(name, "1")),
                    columns=bounds.get(name),
                    references=refs.get(name),
                    public=name in public,
                    degree_bounds=degrees.get(name),
                    allow_conditional_sampling=name in sampling,
                    max_table_rows=sizes.get(name),
                )
            except ConfigError as e:  # a column the source does not have: the flag that names it
                _name_column_flags(e, name, path, units.get(name), said)
                raise
    except BaseException:
        s.close()
        raise
    return s


#: the flags whose values name a --table (before '=', or before '.' for a column), and each one's destination
_TABLE_FLAGS = (("--privacy-unit", "privacy_unit"), ("--max-groups", "max_groups"), ("--max-rows", "max_rows"),
                ("--bounds", "bounds"), ("--domain", "domain"), ("--bins", "bins"), ("--type", "type"),
                ("--reference", "reference"), ("--degree-bound", "degree_bound"), ("--max-table-rows", "max_table_rows"),
                ("--public", "public"), ("--allow-conditional-sampling", "allow_conditional_sampling"))


def _registered(tables: Any) -> str:
    return f"registered with --table: {', '.join(sorted(tables))}" if tables else "no --table was given"


def _check_flag_tables(args: argparse.Namespace, tables: dict[str, str]) -> None:
    """Refuse, naming the flag as given and the tables that are there, a per-table flag whose table has no --table, and a
    --reference whose target table has none: its refusal came only as the query was planned (a PolicyError), and
    `dpsql tables` listed the reference as if it held."""
    import difflib

    from dpsql.errors import ConfigError

    for flag, dest in _TABLE_FLAGS:
        for item in getattr(args, dest, None) or []:
            head = item if flag in ("--public", "--allow-conditional-sampling") else item.partition("=")[0]
            name = (head.partition(".")[0] if flag in _COLUMN_FLAGS else head).strip().lower()
            if name and name not in tables:  # (an empty name is refused as such by _kv)
                close = difflib.get_close_matches(name, list(tables), n=1, cutoff=0.6)
                raise ConfigError(f"{flag} {item} names table '{name}', but no --table {name}=PATH was given "
                                  f"({_registered(tables)}); nothing was charged",
                                  hint=(f"did you mean '{close[0]}'? " if close else "")
                                  + f"add --table {name}=PATH, or correct the table name in {flag}")
    for item in getattr(args, "reference", None) or []:
        k, _, target = item.partition("=")
        table, dot, column = target.strip().partition(".")
        table = table.strip().lower()
        if not dot or not table or table in tables:
            continue  # (a target that is not TABLE.COL is refused with the form it needs)
        close = difflib.get_close_matches(table, list(tables), n=1, cutoff=0.6)
        raise ConfigError(
            f"--reference {item} names table '{table}' as its target, but no --table {table}=PATH was given "
            f"({_registered(tables)}): a reference's target is a registered table; nothing was charged",
            hint=(f"correct it to --reference {k.strip()}={close[0]}.{column.strip()}, or " if close else "")
            + f"add --table {table}=PATH with --privacy-unit {table}=COLUMN (or --public {table} for a table that holds "
            "no person)")


#: the column types a CSV column may be declared as (dpsql.engine._duckdb_sources._CSV_TYPES), as --type's refusal lists them
_CSV_TYPE_NAMES = ("BOOLEAN, TINYINT, SMALLINT, INTEGER, BIGINT, HUGEINT, UTINYINT, USMALLINT, UINTEGER, UBIGINT, FLOAT, "
                   "DOUBLE, DECIMAL(p,s), DATE, TIME, TIMESTAMP, TIMESTAMPTZ or VARCHAR")


def _check_type_flag(table: str, column: str, v: str) -> None:
    """One --type NAME.COL=TYPE, refused in the flag's terms before anything is read."""
    from dpsql.engine._duckdb_sources import _CSV_TYPES
    from dpsql.errors import ConfigError

    item = f"{table}.{column}={v}" if column else f"{table}={v}"
    if not table or not column:
        raise ConfigError(f"--type expects NAME.COL=TYPE, got {item}", hint=f"e.g. --type {table or 'events'}.COLUMN={v or 'DOUBLE'}")
    if not v:
        raise ConfigError(f"--type {table}.{column}= names no type: the TYPE after '=' is empty",
                          hint=f"e.g. --type {table}.{column}=DOUBLE (one of {_CSV_TYPE_NAMES})")
    if not _CSV_TYPES.match(v.strip().upper()):
        raise ConfigError(f"--type {item} is refused: {v!r} is not a column type a CSV column can be read as",
                          hint=f"give one of {_CSV_TYPE_NAMES}, e.g. --type {table}.{column}=DOUBLE")


def _name_column_flags(e: Any, name: str, path: str, unit: str | None, said: dict[tuple[str, str], list[str]]) -> None:
    """``e``, a refusal of registering --table ``name``, rewritten in place to name the flags that name the columns it
    is about: 'table 'e': privacy unit column 'usr_id' does not exist' said nothing of --privacy-unit e=usr_id."""
    import ast

    def flags(column: str, fk: bool = False) -> str:
        items = [x for (t, c), xs in said.items() if t == name and (c == column or fk and column in c.split(","))
                 for x in xs if x.startswith("--reference") == fk]
        return " and ".join(items) or f"column '{column}'"

    # bounds or bins on a column of the wrong type: the catalog's hint is the config's (type = "DOUBLE", or a Python
    # columns={...} mapping for a BOOLEAN column), where the command line declares a CSV column's type with --type
    grid = re.fullmatch(rf"(?:bounds and bins|bounds|bins) for '{re.escape(name)}\.(.+)' need a numeric \(or "
                        r"date/timestamp\) column, but it is (.+)", e.message)
    if grid is not None:
        col, typ = grid.groups()
        by, where = flags(col), f"{name}.{col}"
        e.message = f"{by} {'are' if ' and --' in by else 'is'} refused: {e.message} (table {name}: {path}); nothing was charged"
        csv = path.lower().endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz"))
        e.hint = (f"drop it: GROUP BY {col} releases false and true as keys (--domain {where}=false,true releases both "
                  "whatever the data)" if typ == "BOOLEAN" else
                  f"a CSV column is read as text: if '{col}' holds numbers or dates, declare its type too, e.g. --type "
                  f"{where}=DOUBLE (or BIGINT, or DATE with --bins {where}=2024-01-01:2025-01-01:366); otherwise drop it "
                  f"(to release its values as keys, declare them with --domain {where}=A,B,C)" if csv else
                  f"drop it (to release its values as keys, declare them with --domain {where}=A,B,C; dpsql describe "
                  f"{name} shows the columns' types)")
        e.args = (e._render(),)
        return
    zoned = re.fullmatch(rf"bounds for '{re.escape(name)}\.(.+)' need a numeric, DATE or TIMESTAMP column, but it is (.+), "
                         "which no range, histogram or comparison may read", e.message)
    if zoned is not None:  # (its hint was the Python API's and the config's: pa.timestamp('us'), type = "TIMESTAMP")
        col, where = zoned.group(1), f"{name}.{zoned.group(1)}"
        by = flags(col)
        e.message = f"{by} {'are' if ' and --' in by else 'is'} refused: {e.message} (table {name}: {path}); nothing was charged"
        e.hint = (f"declare the CSV column as a TIMESTAMP (its UTC time without a zone): --type {where}=TIMESTAMP"
                  if path.lower().endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")) else
                  f"write the column '{col}' of the file as TIMESTAMP (its UTC time without a zone)") + ", or drop " + (
                  " and ".join(x for x in by.split(" and ") if not x.startswith("--type ")) or "the bounds")
        e.args = (e._render(),)
        return
    dates = re.fullmatch(rf"a date grid for '{re.escape(name)}\.(.+)' needs a DATE or TIMESTAMP column, but it is (.+)", e.message)
    if dates is not None:
        col, typ = dates.groups()
        by, where = flags(col), f"{name}.{col}"
        e.message = (f"{by} {'are' if ' and --' in by else 'is'} refused: the bounds of --bins are dates, but column '{col}' of table "
                     f"{name} ({path}) is {typ}; nothing was charged")
        e.hint = (f"give it numeric bounds, e.g. --bins {where}=0:100:100"
                  + (f", or declare the CSV column's type as a date: --type {where}=DATE"
                     if path.lower().endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")) else ""))
        e.args = (e._render(),)
        return
    prefix = f"table '{name}': "
    if not e.message.startswith(prefix):
        return

    def names(column: str, fk: bool = False) -> str:
        by = flags(column, fk)
        return f"{by} {'name' if ' and --' in by else 'names'}"

    rest = e.message[len(prefix):]
    if rest == f"cannot tell the format of {path!r}":  # (a part file without its extension, a .jsonl export)
        import shlex

        e.hint = (f"dpsql tells a source's format by its name: give --table {name} a Parquet or CSV file named .parquet, .csv, "
                  f".csv.gz or .tsv (e.g. ln -s {shlex.quote(os.path.abspath(path))} {shlex.quote(path + '.parquet')}), or a "
                  "glob of such files")
        e.args = (e._render(),)
        return
    if rest == f"{path!r} is a directory":  # (Spark's and Hive's output): its files, as a glob the shell leaves alone
        e.hint = (f"give --table {name}='{os.path.join(path, '*.parquet')}' (quoted, so that dpsql reads the glob), or "
                  f"--table {name}='{os.path.join(path, '*.csv')}' for CSV files")
        e.args = (e._render(),)
        return
    m = re.fullmatch(r"declared column\(s\) (\[.*\]) are not in the CSV header", rest)
    n = re.fullmatch(r"column types can be declared for CSV sources only \((\[.*\])\)", rest)
    if m:
        cols = ast.literal_eval(m.group(1))
        text = "; ".join(f"{names(c)} column '{c}', which the CSV header of table {name} does not have" for c in cols)
    elif n:
        cols = ast.literal_eval(n.group(1))
        text = (f"{' and '.join(flags(c) for c in cols)} is refused: the source of table {name} ({path}) is not CSV, and "
                "Parquet files carry their own column types")
        e.hint = f"drop --type for table {name} (dpsql describe {name} shows its columns' types)"
    else:
        parts = []
        for problem in rest.split("; "):
            pm = re.fullmatch(r"(privacy unit|declared|foreign key) column '(.*)' does not exist", problem)
            if pm is None:
                return
            kind, c = pm.groups()
            by = (f"--privacy-unit {name}={unit} names" if kind == "privacy unit" and unit is not None else
                  names(c, fk=kind == "foreign key"))
            parts.append(f"{by} column '{c}', which table {name} ({path}) does not have")
        text = "; ".join(parts)
    e.message = text + "; nothing was charged"
    e.args = (e._render(),)


def _engine_settings(args: argparse.Namespace, cfg: Any) -> Any:
    """The owner's [engine] settings; --debug only where the CLI user owns every table.

    Tables of a config file belong to whoever controls that file (the data owner): debug mode
    is theirs to enable, with ``[engine] debug = true``. A user who registers every table with
    --table is the owner of those tables, so --debug is honoured for them.
    """
    import dataclasses

    from dpsql.errors import ConfigError

    settings = cfg.engine
    if args.debug and not settings.debug:
        if cfg.registers_tables:
            raise ConfigError(
                "--debug is a data-owner setting and this config's [engine] does not enable it",
                hint="the data owner can set [engine] debug = true in the config (unsafe: error details may "
                "reveal private values; see docs/threat_model.md)",
            )
        settings = dataclasses.replace(settings, debug=True)
    args.debug_on = settings.debug
    return settings


def _cap(flag: str, name: str, v: str) -> float:
    if v.strip().lower() in ("inf", "infinity", "unlimited"):
        return math.inf
    return _flag_value(flag, f"{name}={v}", v, f"e.g. {flag} {name}=5 (or {name}=inf)", whole=True, least=1, inf_word=True)


def _days(lo: str, hi: str) -> int | None:
    """The days from the ISO date ``lo`` to ``hi`` (one bin per day), or None when they are not such dates in order."""
    try:
        n = (datetime.date.fromisoformat(hi.strip()) - datetime.date.fromisoformat(lo.strip())).days
    except ValueError:
        return None
    return n if n >= 1 else None


def _flag_value(flag: str, item: str, text: str, example: str, *, whole: bool = False, least: float | None = None,
                inf_word: bool = False) -> float:
    """One number of a per-table flag (``item`` as typed, e.g. ``t.x=0:nan``): finite, held exactly
    enough by a double (no overflow to inf or underflow to 0), whole and at least ``least`` when
    asked; refused in the flag's terms otherwise."""
    from dpsql.errors import ConfigError

    want = ("a whole number" if whole else "a finite number") + (f" >= {least:g}" if least is not None else "")
    want += " or 'inf'" if inf_word else ""
    try:
        v = float(int(text)) if whole and text.strip().lstrip("+-").isdigit() else float(text)
    except (ValueError, OverflowError):
        raise ConfigError(f"{flag} {item} is refused: {text.strip()!r} is not a number; {flag} needs {want}{_form(text)}",
                          hint=example) from None
    why = _unrepresentable(text, v) + _spelling(text, v)
    if why or not math.isfinite(v) or (whole and not v.is_integer()) or (least is not None and v < least):
        raise ConfigError(f"{flag} {item} is refused: {why}{flag} needs {want}{_form(text)}", hint=example)
    return v


def _read_sql(args: argparse.Namespace) -> str:
    from dpsql.errors import ConfigError, InputUnavailableError

    if args.file == "":  # an unset shell variable (-f "$SQL"): never read as "no -f"
        raise ConfigError("-f is empty: no SQL file was named",
                          hint="give the SQL file, e.g. -f query.sql (or -f - to read standard input)")
    if args.file and args.sql:
        raise ConfigError("give the SQL either as an argument or with -f, not both")
    if args.file:
        if args.file != "-" and not os.path.exists(args.file):  # not there (yet): a retry may find it
            raise InputUnavailableError(f"SQL file {args.file!r} not found",
                                        hint="check the path given to -f (or -f - to read standard input)")
        where = "standard input (-f -)" if args.file == "-" else f"SQL file {args.file!r} (-f)"
        try:
            # read at most MAX_SQL_CHARS + 1 characters: -f /dev/zero or a data file given by mistake
            # would otherwise be read whole into memory (the machine's memory, then the OOM killer)
            if args.file == "-" and sys.stdin is None:  # started with <&-
                raise ConfigError("standard input is closed: -f - has no SQL to read",
                                  hint="pipe the SQL in (e.g. dpsql query -f - < query.sql) or give -f FILE")
            if args.file == "-":
                text = _read_stdin_utf8(MAX_SQL_CHARS + 1).removeprefix("\ufeff")  # a byte order mark is not SQL
            else:
                with open(args.file, encoding="utf-8-sig") as f:
                    text = f.read(MAX_SQL_CHARS + 1)
        except UnicodeDecodeError as e:
            if e.start == 0 and bytes(e.object[:2]) in (b"\xff\xfe", b"\xfe\xff"):  # a UTF-16 byte order mark
                raise ConfigError(f"{where} is UTF-16 text (it starts with a UTF-16 byte order mark), not UTF-8",
                                  hint=_UTF16_HINT.format(_sql_source(args))) from None
            raise ConfigError(f"{where} is not UTF-8 text ({_where_not_utf8(args, e)}a file saved in another encoding, e.g. "
                              "Latin-1 or Windows-1252); nothing was charged",
                              hint=f"save the SQL as UTF-8 text, e.g. iconv -f LATIN1 -t UTF-8 {_sql_source(args)} > query.sql, "
                              "and give -f query.sql") from None
        except OSError as e:  # a file not readable (a retry may read it); standard input and a directory are the caller's
            unavailable = args.file != "-" and not isinstance(e, IsADirectoryError)
            raise (InputUnavailableError if unavailable else ConfigError)(f"{where} cannot be read ({e.strerror or type(e).__name__})",
                              hint="give -f the path of a readable SQL text file (or -f - to read standard input)") from None
        if args.file == "-" and not text.strip():
            raise ConfigError("standard input (-f -) is empty: there is no SQL to run; nothing was charged",
                              hint="pipe the SQL in (e.g. dpsql query -f - < query.sql; a scheduler may start a job with "
                              "standard input at /dev/null), or give -f FILE")
        if len(text) > MAX_SQL_CHARS:
            raise ConfigError(f"{where} holds more than {MAX_SQL_CHARS // 2**20} Mi characters: no query is that long",
                              hint="check that -f names the SQL file (not a data file or a device)")
        if "\x00" in text:  # UTF-16 without a byte order mark: a NUL beside every ASCII character
            at = text.index("\x00")
            line = text.count("\n", 0, at) + 1
            col = at - (text.rfind("\n", 0, at) + 1) + 1
            if 3 * text.count("\x00") >= len(text):
                raise ConfigError(f"{where} holds a NUL character (line {line}, column {col}) beside its characters: it looks "
                                  "like UTF-16 text (as some Windows editors and PowerShell's > save it), not UTF-8; nothing "
                                  "was charged", hint=_UTF16_HINT.format(_sql_source(args)))
            raise ConfigError(f"{where} holds a NUL character (line {line}, column {col}), which no SQL text holds; nothing was "
                              "charged", hint=f"remove it, e.g. tr -d '\\000' < {_sql_source(args)} > query.sql, and give "
                              "-f query.sql")
        return text
    if not args.sql:
        raise ConfigError("no SQL given", hint=f'give it as an argument, e.g. dpsql {args.command} "SELECT COUNT(*) FROM t" '
                          "--epsilon 1, or with -f FILE (-f - reads it from standard input: echo \"SELECT ...\" | dpsql "
                          f"{args.command} -f - --epsilon 1)")
    sql = str(args.sql)
    bad = next((i for i, c in enumerate(sql) if "\udc80" <= c <= "\udcff"), None)
    if bad is not None:  # bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
        raise ConfigError(f"the SQL argument is not UTF-8 text: byte 0x{ord(sql[bad]) - 0xDC00:02X} at character {bad + 1} "
                          "is not UTF-8 (a terminal or file in another encoding, e.g. Latin-1)",
                          hint="pass the query as UTF-8 text: save it as a UTF-8 file and give it with -f FILE")
    return sql


def _where_not_utf8(args: argparse.Namespace, e: UnicodeDecodeError) -> str:
    """'byte 0xE9 at line 40, column 34; ' of the first byte of the -f text that is not UTF-8 ('' when it cannot be
    told). A file's decoding error holds only the chunk read last, so the file's bytes are read again."""
    raw, start = bytes(e.object), e.start
    if args.file != "-":
        try:
            with open(args.file, "rb") as f:
                raw = f.read(4 * (MAX_SQL_CHARS + 1))
            raw.decode("utf-8")
            return ""
        except UnicodeDecodeError as whole:
            start = whole.start
        except OSError:
            return ""
    if not 0 <= start < len(raw):
        return ""
    line_start = raw.rfind(b"\n", 0, start) + 1
    column = len(raw[line_start:start].removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace")) + 1
    line = raw.count(b"\n", 0, start) + 1
    return f"byte 0x{raw[start]:02X} at line {line}, column {column}; "


_UTF16_HINT = "save the SQL as UTF-8 text, e.g. iconv -f UTF-16 -t UTF-8 {} > query.sql, and give -f query.sql"


def _sql_source(args: argparse.Namespace) -> str:
    import shlex

    return "FILE" if args.file == "-" else shlex.quote(str(args.file))


def _read_stdin_utf8(limit: int) -> str:
    """At most ``limit`` characters of standard input, decoded as UTF-8 (as ``-f FILE`` is read),
    whatever the locale's encoding: under a Latin-1 locale a UTF-8 query was read as Latin-1, and
    bytes that are not UTF-8 became lone surrogates. Raises UnicodeDecodeError on such bytes."""
    import codecs

    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream without bytes underneath (an embedding caller's StringIO)
        return str(sys.stdin.read(limit))
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    parts: list[str] = []
    seen: list[bytes] = []  # (a refusal names where the first byte that is not UTF-8 is)
    n = 0
    while n < limit:
        chunk = raw.read1(65536) if hasattr(raw, "read1") else raw.read(65536)
        seen.append(chunk)
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError:
            b"".join(seen).decode("utf-8")  # the same error, placed in the whole text read
            raise
        parts.append(text)
        n += len(text)
        if not chunk:
            break
    return "".join(parts)[:limit]


class _Progress:
    """A spinner on stderr for long queries, only when stderr is a terminal."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def __enter__(self) -> _Progress:
        if sys.stderr.isatty():
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()
        return self

    def _run(self) -> None:
        start = time.monotonic()
        if self._stop.wait(1.0):
            return
        frames = "|/-\\"
        i = 0
        while not self._stop.wait(0.2):
            sys.stderr.write(f"\r{frames[i % 4]} running ({time.monotonic() - start:.0f}s)")
            sys.stderr.flush()
            i += 1
        sys.stderr.write("\r" + " " * 30 + "\r")
        sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._t is not None:
            self._t.join()


def _table_cell(v: Any) -> str:
    """One value as a ``table`` cell: SQL NULL is the bare word NULL; text is shown as it is unless a
    reader could misread it (the word NULL in any case, empty, edge spaces, a leading '"', a '|', a
    line break or another unprintable character), then it is a JSON string literal: "NULL", "",
    " a", "x\\ny". So a cell that starts with '"' is always quoted text, and NULL is always NULL."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        from dpsql.release import float_text

        return float_text(v)
    if not isinstance(v, str):
        from decimal import Decimal

        if isinstance(v, Decimal):  # fixed point, as DuckDB spells it (str() writes 0E-10)
            from dpsql.release import decimal_text

            return decimal_text(v)
        return str(v)
    if (v.upper() == "NULL" or not v or v != v.strip(" ") or v.startswith('"') or "|" in v
            or not all(c.isprintable() or c == " " for c in v)):
        text = json.dumps(v, ensure_ascii=False)
        return "".join(c if c.isprintable() or c == " " else _json_escape(c) for c in text)
    return v


def _json_escape(c: str) -> str:
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _format_table(tbl: Any) -> str:
    cols = [_table_cell(c) if c != "NULL" else c for c in tbl.column_names]
    from dpsql.release import python_rows, temporal_columns_as_text

    rows = [[_table_cell(v) for v in r.values()] for r in python_rows(temporal_columns_as_text(tbl))]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    out = [" | ".join(c.ljust(w) for c, w in zip(cols, widths)), "-+-".join("-" * w for w in widths)]
    out += [" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(out) + "\n"


def _writable(tbl: Any) -> Any:
    """``tbl`` with every INTERVAL column (a difference of released TIMESTAMPs in the outputs) as
    DuckDB's text of it (what ``CAST(x AS VARCHAR)`` gives: ``1 year 2 months 3 days 01:02:03``). Arrow's
    CSV and Parquet writers have no form for an interval, so writing it failed after the charge, and the
    table and JSON forms showed Python's ``MonthDayNano(...)`` or a bare triple."""
    import pyarrow as pa

    for i, f in enumerate(tbl.schema):
        if pa.types.is_interval(f.type):
            from dpsql.release import interval_text

            text = [None if v is None else interval_text(*v) for v in tbl.column(i).to_pylist()]
            tbl = tbl.set_column(i, f.with_type(pa.string()), pa.array(text, pa.string()))
    return tbl


def _csv_text(tbl: Any) -> str:
    """The rows as CSV (RFC 4180, ``\\n`` line ends), each value in its canonical text (as JSON and the table
    print it): the header's names and text values quoted (a ``"`` doubled), numbers, booleans, dates and
    timestamps bare, NULL an empty unquoted field (an empty text is ``""``; a lone number column's NULL ``""``). Arrow's CSV writer spelled a
    timestamp ``2024-01-02 00:00:00.000000`` (JSON: ``2024-01-02T00:00:00``), a non-finite double ``nan``/``inf``
    (which Java and Spark read as no number), a small DECIMAL ``0E-10``, and put ``<value out of range: N>`` for
    a date beyond year 32767."""
    from decimal import Decimal

    import pyarrow as pa

    from dpsql.release import _json_safe, decimal_text, float_text, python_rows, temporal_columns_as_text

    def bare_type(t: Any) -> bool:
        return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t)
                    or pa.types.is_temporal(t))

    def quote(text: str) -> str:
        return '"' + text.replace('"', '""') + '"'

    bare = [bare_type(f.type) for f in tbl.schema]
    # a one-column CSV would write a NULL as an empty line, which Arrow's and pandas' readers skip (the row is lost):
    # a column that holds no text writes it "" instead (read as NULL); in a text column "" is the empty text
    null = '""' if bare == [True] else ""

    def cell(v: Any, bare: bool) -> str:
        if v is None:
            return null
        if isinstance(v, bool):
            return "true" if v else "false"
        text = (float_text(v) if isinstance(v, float) else decimal_text(v) if isinstance(v, Decimal) else
                v if isinstance(v, str) else str(v) if isinstance(v, int) else
                json.dumps(_json_safe(v, nonfinite_as_text=True), ensure_ascii=False))
        return text if bare and not any(c in text for c in ',"\r\n') else quote(text)

    lines = [",".join(quote(n) for n in tbl.column_names)]
    lines += [",".join(cell(v, b) for v, b in zip(r.values(), bare)) for r in python_rows(temporal_columns_as_text(tbl))]
    return "\n".join(lines) + "\n"


def _render_rows(rel: Any, fmt: str, remaining: Any) -> bytes:
    """The rows as the bytes of their output format (Parquet: the meta rides in the schema metadata).
    Each writer is imported only for its format: the default table form needs neither."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(rel.to_arrow(remaining), buf)
        return buf.getvalue()
    if fmt == "csv":
        return _csv_text(rel.table).encode("utf-8")
    if fmt == "json":
        return (json.dumps(rel.to_dict(remaining), indent=1) + "\n").encode("utf-8")
    return _format_table(rel.table).encode("utf-8")


def _cmd_init(args: argparse.Namespace) -> int:
    import dpsql
    from dpsql.ledger import Ledger

    cfg = _load_config(args)
    path = _ledger_path(args, cfg)
    total = dpsql.Budget(args.epsilon, args.delta)
    pg = path.startswith(("postgresql://", "postgres://"))
    if cfg.registers_tables and cfg.budget is None:  # the owner's config: the owner's word on the total
        from dpsql.errors import ConfigError

        raise ConfigError(
            f"the config {args.config_path!r} registers tables but declares no total under [ledger]: with the data "
            "owner's config, init creates the ledger only with the total the config declares; nothing was created",
            hint="the data owner writes epsilon = ... and delta = ... under [ledger] in the config, then runs init with "
            "the same values",
        )
    # (an existing file is refused by Ledger.create first: dpsql never overwrites a ledger)
    if cfg.budget is not None and total != cfg.budget and (pg or not os.path.lexists(path)):
        from dpsql.errors import ConfigError

        raise ConfigError(
            f"--epsilon {args.epsilon:g} --delta {args.delta:g} differ from the total the config's [ledger] declares "
            f"(epsilon = {cfg.budget.epsilon!r}, delta = {cfg.budget.delta!r}): every later command would refuse the new ledger",
            hint=f"pass --epsilon {cfg.budget.epsilon!r} --delta {cfg.budget.delta!r}, or change epsilon and delta under "
            "[ledger] in the config first",
        )
    if pg:
        from dpsql.ledger._postgres import PostgresLedger, redact

        led: Ledger = PostgresLedger.create(path, total, lock_timeout=_lock_timeout(args, cfg))
        path = redact(path)
    else:
        led = Ledger.create(path, total, lock_timeout=_lock_timeout(args, cfg))
    led.close()
    print(f"created ledger {path} with total budget epsilon={args.epsilon:g} delta={args.delta:g}", file=sys.stderr)
    return 0


def _check_output(args: argparse.Namespace) -> None:
    """Refuse a bad --format/-o/--meta before the query spends any budget; settle the format
    (from -o's extension when --format is not given)."""
    from dpsql.errors import ConfigError

    for flag, path in (("-o", args.output), ("--meta", getattr(args, "meta", None))):
        if path == "":  # an unset shell variable (-o "$OUT"): the rows went to stdout, the meta nowhere
            raise ConfigError(f"{flag} is empty: no file was named; nothing was charged",
                              hint=f"give {flag} a file, e.g. {flag} {'result.csv' if flag == '-o' else 'meta.json'}"
                              + (" (or -o - for standard output)" if flag == "-o" else ""))
    if args.output == "-":  # as with -f -: standard output (a file named '-' is -o ./-)
        args.output = None
    if getattr(args, "meta", None) == "-":
        raise ConfigError("--meta - would write the meta to a file named '-', not to standard output",
                          hint="use --format json to print the rows and the meta together on standard output, or give "
                          "--meta a file, e.g. --meta meta.json (--meta ./- for a file named '-')")
    if args.output:
        ext = os.path.splitext(args.output)[1].lower()
        if ext in (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4", ".br", ".tgz", ".tbz2", ".txz", ".z", ".zstd", ".lzma",
                   ".lz", ".7z", ".tar", ".rar"):  # never written: --format would not compress (nor archive)
            raise ConfigError(f"-o {args.output!r}: dpsql writes no compressed files or archives ({ext}), and a plain file under that "
                              "name fails every reader that decompresses it; nothing was charged",
                              hint="write to standard output and compress it, e.g. dpsql query ... --format csv | gzip > "
                              "out.csv.gz (under set -o pipefail, so that dpsql's exit code counts; Parquet compresses "
                              "inside the file: -o out.parquet)")
        implied = EXTENSIONS.get(ext)
        if implied is None and args.format is None:
            raise ConfigError(
                f"-o {args.output!r}: unknown extension {ext or '(none)'}: the output format cannot be inferred",
                hint="use .parquet, .csv, .json or .txt, or give --format",
            )
        if implied is not None and args.format is not None and implied != args.format:
            raise ConfigError(
                f"--format {args.format} does not match -o {args.output!r} (a {implied} file name)",
                hint=f"drop --format, or name the file with the .{args.format if args.format != 'table' else 'txt'} extension",
            )
        args.format = args.format or implied
    args.format = args.format or "table"
    if args.format == "parquet" and not args.output:
        raise ConfigError("--format parquet needs -o FILE", hint="add -o result.parquet")
    for flag, path in (("-o", args.output), ("--meta", getattr(args, "meta", None))):
        if path:
            _check_writable(flag, path)
    if args.output and getattr(args, "meta", None) and _same_file(args.output, args.meta):
        raise ConfigError(f"-o {args.output!r} and --meta {args.meta!r} name the same file: the meta would replace the rows",
                          hint="give --meta a file of its own, e.g. --meta meta.json")


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (the same resolved path, or one inode through a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


def _check_output_targets(args: argparse.Namespace, s: Any) -> None:
    """Refuse, before the charge, an -o/--meta that would overwrite what this command reads or
    records: the ledger or one of its side files (the generation marker, the queue, the WAL),
    the config, or a registered table's source file."""
    from dpsql.errors import ConfigError

    led = getattr(s.ledger, "path", None)
    led = led if isinstance(led, str) and not led.startswith(("postgresql://", "postgres://")) else None
    inputs = [(f, f"the source of table '{name}'") for name, spec in s.tables.items() for f in spec.files]
    if getattr(args, "config_path", None):
        inputs.append((args.config_path, "the config file"))
    if getattr(args, "file", None) and args.file != "-":
        inputs.append((args.file, "the SQL file given with -f"))
    # rows printed without -o go to standard output, which the job may have pointed at one of these files too
    # (dpsql query ... >> data/part-2.csv): checked as -o /dev/stdout is
    output = getattr(args, "output", None)  # (suggest-caps prints to standard output only)
    stdout = None if output or 1 in _CLOSED_AT_START or not _regular_fd(1) else "/dev/stdout"
    meta = getattr(args, "meta", None)
    if stdout and meta and not _written_in_place(meta) and _same_file(meta, stdout):  # --meta m.json > m.json
        raise ConfigError(f"--meta {meta!r} names the file standard output is redirected to: the meta would replace the rows "
                          "printed there; nothing was charged",
                          hint="give --meta a file of its own, e.g. --meta meta.json, or write the rows with -o FILE")
    for flag, path in (("-o", output), ("--meta", getattr(args, "meta", None)), ("standard output", stdout)):
        if not path:
            continue
        if flag == "standard output":
            flag, path = "standard output, redirected to", os.path.realpath(path)
        what = next((w for f, w in inputs if _same_file(path, f)), None)
        if led is not None and what is None:
            real, out = os.path.realpath(led), os.path.realpath(path)
            d, name = os.path.split(real)
            base = os.path.basename(out)
            if (_same_file(path, led) or out in (real + ".wal", real + ".generation")
                    or (os.path.dirname(out) == d and base.startswith(f".{name}."))):
                what = f"the budget ledger {led} or one of its files"
        elsewhere = (f"write the output elsewhere, e.g. {flag} {'result.csv' if flag == '-o' else 'meta.json'}"
                     if flag in ("-o", "--meta") else "redirect standard output to another file (> result.csv), or give -o FILE")
        if what is not None:
            raise ConfigError(f"{flag} {path!r} would overwrite {what}; nothing was charged", hint=elsewhere)
        pattern = next((f"{spec.source} (table '{name}')" for name, spec in s.tables.items()
                        if isinstance(spec.source, str) and spec.files and _glob_matches(spec.source, path)), None)
        if pattern is not None:
            raise ConfigError(f"{flag} {path!r} matches the source pattern {pattern}: the next run would read this output "
                              "as rows of the table; nothing was charged",
                              hint="write the output to a name or directory outside the table's pattern")


def _regular_fd(fd: int) -> bool:
    """Whether ``fd`` is open on a regular file (a redirection to a file, not a terminal, pipe or device), on a
    system that names it as /dev/stdout does (Linux, macOS)."""
    import stat

    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.path.exists("/dev/stdout")
    except OSError:
        return False


def _glob_matches(pattern: str, path: str) -> bool:
    """Whether ``glob.glob(pattern)`` would list ``path`` once it exists (component by component,
    as glob does: '*' stays within one directory and does not match a leading '.')."""
    import fnmatch

    if not any(ch in pattern for ch in "*?["):
        return False

    def match(pat: list[str], out: list[str]) -> bool:
        return len(pat) == len(out) and all(
            fnmatch.fnmatchcase(o, p) and not (o.startswith(".") and not p.startswith(".")) for o, p in zip(out, pat))

    pat = os.path.abspath(pattern).split(os.sep)
    if match(pat, os.path.abspath(path).split(os.sep)):
        return True
    # the same directories reached through a symbolic link (-o link/out.parquet, link -> data, with data/*.parquet):
    # the output is written where its real path is (dpsql/_output.py), and the glob lists it there
    fixed = next(i for i, part in enumerate(pat) if any(ch in part for ch in "*?["))
    real = os.path.realpath(os.sep.join(pat[:fixed]) or os.sep).rstrip(os.sep).split(os.sep) + pat[fixed:]
    return match(real, os.path.realpath(path).split(os.sep))


def _written_in_place(path: str) -> bool:
    """Whether ``path`` is written through itself, not replaced by a temporary sibling (dpsql/_output.py): a named
    pipe or a device, or one of this process's file descriptors (``/dev/stdout`` redirected to a file)."""
    import stat

    from dpsql._output import caller_fd

    try:
        st = os.stat(path)
    except OSError:
        return False
    return not stat.S_ISREG(st.st_mode) or caller_fd(path) is not None


def _check_writable(flag: str, path: str) -> None:
    from dpsql.errors import ConfigError

    out = os.path.abspath(path)
    parent = os.path.dirname(out)
    if os.path.isdir(out):
        raise ConfigError(f"{flag} {path!r} is a directory; nothing was charged", hint=f"give a file name, e.g. {flag} result.json")
    if _written_in_place(path):  # a pipe, a device or the caller's own stream: no file is made in its directory
        return
    if not os.path.isdir(parent):
        why = f"{parent} is not a directory" if os.path.lexists(parent) else f"directory {parent} does not exist"
        raise ConfigError(f"{flag} {path!r} cannot be written: {why}; nothing was charged",
                          hint=f"create the directory, or change {flag}")
    if not os.access(parent, os.W_OK) or (os.path.exists(out) and not os.access(out, os.W_OK)):
        raise ConfigError(f"{flag} {path!r} cannot be written: permission denied; nothing was charged",
                          hint=f"change {flag} to a file in a directory you can write to")


def _split_statements(sql: str) -> list[tuple[str, int]]:
    """The statements of a ';'-separated workload, each as the text written (from its first token to its last), with
    the offset of its first character in ``sql``: a refusal of one is then placed in the file (:func:`_placed`). They
    were rewritten by the parser (one line each, comments dropped), and a refusal's line and column were in that text."""
    from sqlglot.tokens import TokenType

    from dpsql.plan.parse import parse_statements, tokens

    groups: list[list[Any]] = [[]]
    for t in tokens(sql):
        if t.token_type == TokenType.SEMICOLON:
            groups.append([])
        else:
            groups[-1].append(t)
    spans = [(sql[g[0].start:g[-1].end + 1], g[0].start) for g in groups if g]
    if not spans:  # no statement, or no tokens (an unclosed quote): the parser's refusal says which
        parse_statements(sql)
    return spans


@contextlib.contextmanager
def _placed(sql: str, spans: list[tuple[str, int]] | None) -> Iterator[None]:
    """A refusal of one query of a workload ('query 3 of 4 of the workload: ... (line 1, col 30)'), its line and
    column placed in the whole SQL text (the -f file) instead of that query's own."""
    from dpsql.errors import QueryError
    from dpsql.plan.parse import line_col

    try:
        yield
    except QueryError as e:
        m = re.match(r"query (\d+) of (\d+) of the workload: ", e.message)
        if spans is None or m is None or int(m.group(2)) != len(spans):
            raise
        line0, col0 = line_col(sql, spans[int(m.group(1)) - 1][1])

        def place(p: re.Match[str]) -> str:
            line, col = int(p.group(1)), int(p.group(2))
            return f"line {line0 + line - 1}, col {col0 + col - 1 if line == 1 else col}"

        e.message = e.message[:m.end()] + re.sub(r"line (\d+), col (\d+)", place, e.message[m.end():])
        e.args = (e._render(),)
        raise


def _cmd_query(args: argparse.Namespace) -> int:
    sql = _read_sql(args)
    if args.command == "query":
        _check_output(args)
    elif args.json and args.format == "table":  # (--json printed JSON whatever --format said)
        from dpsql.errors import ConfigError

        raise ConfigError("explain's --json and --format table contradict each other: --json prints the plan as JSON",
                          hint="give --format json (or --json) for JSON, or --format table alone for the table")
    typed = _kv(args.option, "--option", fold=False)
    opts = {k: _option_value(v) for k, v in typed.items()}
    for k, v in typed.items():
        why = _unrepresentable(v, opts[k]) if isinstance(opts[k], float) else ""
        if why:
            from dpsql.errors import ConfigError

            raise ConfigError(f"--option {k}={v} is refused: {why.rstrip('; ')}", hint=f"give {k} a number a double can hold")
        if isinstance(opts[k], str) and _is_number(v):  # '1_0', 'inf', full-width digits: float() reads them
            from dpsql.budget import PLAIN_FORM
            from dpsql.errors import ConfigError

            raise ConfigError(f"--option {k}={v} is refused: {v!r} is not a plain number; write option numbers in {PLAIN_FORM}",
                              hint=f"e.g. --option {k}=10")
    if args.reuse_synopsis:
        if "reuse" in opts and opts["reuse"] != "synopsis":  # (the flag silently replaced the option's value)
            from dpsql.errors import ConfigError

            raise ConfigError(f"--reuse-synopsis and --option reuse={typed['reuse']} contradict each other: the flag is "
                              "--option reuse=synopsis; nothing was charged", hint="give one of them")
        opts["reuse"] = "synopsis"
    with _open_session(args) as s, _options_named(typed), _Targets() as targets:
        _check_output_targets(args, s)  # (explain's plan goes to standard output too)
        if args.command == "query":
            targets.prepare(args)  # each output file opened before the charge (its temporary sibling)
        spans = _split_statements(sql) if args.workload else None
        if args.command == "explain":
            with _placed(sql, spans):
                plan = s.explain([text for text, _ in spans] if spans is not None else sql, epsilon=args.epsilon,
                                 delta=args.delta, options=opts or None)
            if args.json or args.format == "json":
                print(json.dumps(plan.to_dict(), indent=1, default=str))
            else:
                print(plan)
            return 0
        rel = None
        try:
            with _Progress():
                if spans is not None:
                    with _placed(sql, spans):
                        rel = s.query_many([text for text, _ in spans], epsilon=args.epsilon, delta=args.delta,
                                           options=opts or None)
                else:
                    rel = s.query(sql, epsilon=args.epsilon, delta=args.delta, options=opts or None)
        except KeyboardInterrupt as e:  # Ctrl-C held back until the release was recorded: its answer is kept
            if rel is not None and getattr(e, "release", None) is None:  # (or once it was returned: as the spinner stopped)
                e.release = rel  # type: ignore[attr-defined]
            _keep_held_back(e, args, s, targets, to_stdout=not args.output)
            raise
        rem = None
        try:
            _charged(args, rel)
            rem = _remaining_after(s)
            _write_release(rel, args, rem, targets, _ledger_file(s))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM after the charge: the paid answer is kept
            _charged(args, rel)
            _keep_interrupted(rel, rem, targets, _ledger_file(s), to_stdout=not args.output)
            raise
        print(
            f"mechanism: {rel.mechanism}; cost: epsilon={rel.cost.epsilon:g} delta={rel.cost.delta:g}; "
            f"remaining: {_fmt_remaining(rem)}; ledger entry {rel.ledger_id}",
            file=sys.stderr,
        )
        from dpsql.groupings import DIFFERS_BY_QUERY
        from dpsql.release import name_text

        for name, acc in rel.accuracy.items():
            col = name_text(name)  # "a\nb", not a line break
            if acc.get("noise_std") is not None and len(acc.get("per_row_noise_std") or []) > 1:
                # the first row that has an interval (a row released NULL has none)
                i = _first_finite(acc["per_row_noise_std"])
                sd, hw = acc["per_row_noise_std"][i], (acc.get("per_row_ci95_half_width") or [None] * (i + 1))[i]
                print(f"  {col}: noise std {sd:.4g}, 95% interval +/- {hw:.4g} (row {i + 1}; per row in --meta)", file=sys.stderr)
            elif acc.get("noise_std") is not None:
                print(f"  {col}: noise std {acc['noise_std']:.4g}, 95% interval +/- {acc['ci95_half_width']:.4g}", file=sys.stderr)
            elif acc.get("ci95_half_width") is not None:
                rows = acc.get("per_row_ci95_half_width") or []
                i = _first_finite(rows)
                each = f" (row {i + 1}; per row in --meta)" if len(rows) > 1 else ""
                hw = rows[i] if rows else acc["ci95_half_width"]
                print(f"  {col}: 95% interval +/- {hw:.4g}{each}", file=sys.stderr)
            elif acc.get("note") == DIFFERS_BY_QUERY:  # the Python API's details are the meta's parameters
                print(f"  {col}: differs by query: per query in the meta's parameters.components (--meta, --format json)",
                      file=sys.stderr)
            elif acc.get("note"):
                print(f"  {col}: {_one_line(acc['note'])}", file=sys.stderr)
        if rel.details.get("estimates"):
            print(f"  estimates: {_one_line(rel.details['estimates'])}", file=sys.stderr)
        for w in rel.warnings:
            print(f"warning: {_one_line(w)}", file=sys.stderr)
        if "tau_star" in rel.details:
            print(f"  groups are released only above a noisy threshold (tau* = {rel.details['tau_star']:g} units): "
                  "a group missing from the output is not a zero", file=sys.stderr)
        parts = rel.details.get("components") or []  # several queries in one request (ROLLUP, UNION ALL): each says so
        for i, c in enumerate(parts):
            if "tau_star" in (c.get("parameters") or {}):
                print(f"  query {i + 1} of {len(parts)} ({c['sql']}): groups are released only above a noisy threshold "
                      f"(tau* = {c['parameters']['tau_star']:g} units): a group missing from the output is not a zero",
                      file=sys.stderr)
    return 0


def _first_finite(values: Sequence[Any]) -> int:
    """The index of the first finite number of a per-row list (a row released NULL has no interval: NaN or None),
    else 0."""
    return next((i for i, v in enumerate(values) if isinstance(v, (int, float)) and math.isfinite(v)), 0)


def _one_line(text: str) -> str:
    """``text`` on one line of stderr: a character that is not printable (a line break in a quoted column name, an
    escape sequence) as its JSON escape (``\\n``, ``\\u001b``)."""
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in str(text))


@contextlib.contextmanager
def _options_named(typed: dict[str, str]) -> Iterator[None]:
    """A refusal of an --option value, which the library words by the option's name ('tau must be a
    whole number >= 1, got 'abc''), names the flag as typed: '--option tau=abc is refused: ...'."""
    from dpsql.errors import ConfigError, PolicyError

    try:
        yield
    except (ConfigError, PolicyError) as e:  # ('option max_groups_per_unit=10 is above the cap ...': a PolicyError)
        k = next((k for k in typed if e.message.startswith((f"{k} ", f"{k}=", f"unknown {k} ", f"option {k} ",
                                                            f"option {k}="))), None)
        many = re.match(r"(?:unknown )?option\(s\) \[([^\]]*)\]", e.message)  # "option(s) ['tau'] do not apply to ..."
        named = [k for k in typed if many is not None and repr(k) in many.group(1).split(", ")]
        if k is not None or named:
            flags = " and ".join(f"--option {x}={typed[x]}" for x in ([k] if k is not None else named))
            e.message = f"{flags} {'are' if len(named) > 1 else 'is'} refused: {e.message}"
            e.args = (e._render(),)
        raise


def _charged(args: argparse.Namespace, rel: Any) -> None:
    """Note that this command's answer was charged (not reused for free): whatever fails from here on exits
    ``CHARGED_EXIT_CODE`` (5), so that a script can tell that budget was spent."""
    if not rel.reused:
        args.charged_entry = rel.ledger_id


def _remaining_after(s: Any) -> Any:
    """The remaining budget after a charged release, or None when the ledger cannot be read now
    (e.g. busy past the lock timeout): the release was answered and its charge committed, so it is
    still delivered, with a warning instead of an error that would lose it."""
    from dpsql.errors import LedgerError

    try:
        return s.remaining()
    except LedgerError as e:
        first = str(e).split("\n", 1)[0]
        print(f"warning: the release was charged and is delivered, but the remaining budget could not be read "
              f"({first}); see dpsql budget", file=sys.stderr)
        return None


def _fmt_remaining(rem: Any) -> str:
    return "unknown" if rem is None else f"epsilon={_down(rem.epsilon)} delta={_down(rem.delta)}"


def _down(x: float) -> str:
    """``x`` as ``:g`` shows it (six significant digits), rounded down where that would show more than ``x``: a remaining
    budget of 9.9999996e-06 read 1e-05, and a request of that much was refused."""
    import decimal

    text = f"{x:g}"
    if not math.isfinite(x) or float(text) <= x:
        return text
    floor = decimal.Context(prec=6, rounding=decimal.ROUND_FLOOR).plus(decimal.Decimal(x))
    return f"{float(floor):g}"


class _Targets:
    """The output files of a query (-o, --meta), opened before the charge and closed at the end (an
    unused temporary sibling is removed, e.g. when the query was refused)."""

    def __init__(self) -> None:
        self.by_flag: dict[str, Any] = {}

    def prepare(self, args: argparse.Namespace) -> None:
        for flag, path in (("-o", args.output), ("--meta", getattr(args, "meta", None))):
            if path:
                from dpsql._output import Target  # only for output files: standard output needs none

                self.by_flag[flag] = Target.prepare(flag, path)

    def __enter__(self) -> _Targets:
        return self

    def __exit__(self, *exc: object) -> None:
        for t in self.by_flag.values():
            t.discard()


def _ledger_file(s: Any) -> str | None:
    led = getattr(s.ledger, "path", None)
    return led if isinstance(led, str) else None


def _write_release(rel: Any, args: argparse.Namespace, remaining: Any, targets: _Targets, ledger: str | None) -> None:
    """Write the rows (-o or stdout) and --meta. A write that fails (a full disk, a directory removed
    or made read-only meanwhile) never loses the charged release: it is saved elsewhere, and the error
    says which output failed, that the charge stands, and how to get the release back."""
    import dataclasses

    rel = dataclasses.replace(rel, table=_writable(rel.table))
    out_name = os.path.basename(args.output) if args.output else f"stdout.{'txt' if args.format == 'table' else args.format}"
    outputs = [("-o", args.output, out_name, lambda: _render_rows(rel, args.format, remaining))]
    if getattr(args, "meta", None):
        meta_name = os.path.basename(args.meta)
        if meta_name in (out_name, "release.json"):
            meta_name = "meta-" + meta_name
        outputs.append(("--meta", args.meta, meta_name,
                        lambda: (json.dumps(rel.meta(remaining), indent=1) + "\n").encode("utf-8")))
    if out_name == "release.json":
        outputs[0] = ("-o", args.output, "rows-" + out_name, outputs[0][3])
    failed: list[tuple[str, str | None, str, bytes | None, Exception]] = []
    for flag, path, name, render in outputs:
        data: bytes | None = None
        try:
            data = render()
            if path:
                targets.by_flag[flag].write(data)
            else:
                sys.stdout.write(data.decode("utf-8"))
                sys.stdout.flush()
        except Exception as e:  # an OSError (a full disk), or any other failure of the writer: the charge stands
            if path is None and isinstance(e, OSError):
                _silence_stdout()
            failed.append((flag if path else "stdout", path, name, data, e))
    if failed:
        raise _written_failed(rel, failed, remaining, ledger,
                              written=[f"{f} {p!r}" for f, p, *_ in outputs if p and targets.by_flag[f].done]) from None


def _written_failed(rel: Any, failed: list[tuple[str, str | None, str, bytes | None, Exception]], remaining: Any,
                    ledger: str | None, written: Sequence[str] = ()) -> Any:
    """The error of a charged release that could not be written, once the release is saved elsewhere."""
    from dpsql._output import first_line, rescue, saved_text
    from dpsql.errors import CHARGED_EXIT_CODE, ExecutionError

    files = {name: data for _f, _p, name, data, _e in failed if data is not None}
    try:
        files["release.json"] = (json.dumps(rel.to_dict(remaining), indent=1, default=str) + "\n").encode("utf-8")
    except Exception:  # pragma: no cover - the JSON form of released values
        pass
    saved = rescue(files, rel.ledger_id, ledger) if files else None
    sentence, hint = saved_text(saved, {name: (p or "") for _f, p, name, data, _e in failed if data is not None})
    what = " and ".join(f"writing {f + ' ' + repr(p) if p else f} failed ({first_line(e)})" for f, p, _n, _d, e in failed)
    also = f" ({', '.join(written)} {'was' if len(written) == 1 else 'were'} written)" if written else ""
    if rel.reused:  # read for free from a stored synopsis: nothing was charged, and asking again is free too
        return ExecutionError(f"the query was answered for free from a stored synopsis (ledger entry {rel.ledger_id}, which "
                              f"cost nothing), but {what}{also}{sentence}",
                              hint=hint.replace("running the query again would charge again", "running the query again is free "
                                                "too").replace("cannot be written again without a new charge", "is free to ask again"))
    err = ExecutionError(
        f"the query was answered, but {what}{also}; its charge stands (ledger entry {rel.ledger_id}){sentence}",
        hint=hint,
    )
    err.exit_code = CHARGED_EXIT_CODE
    return err


def _keep_held_back(e: KeyboardInterrupt, args: argparse.Namespace, s: Any, targets: _Targets, *, to_stdout: bool) -> None:
    """Ctrl-C that the ledger held back while it recorded the release, raised once the release was committed: the
    exception carries the charged answer (``e.release``), saved as after a failed write (:func:`_keep_interrupted`)."""
    rel = getattr(e, "release", None)
    if rel is None:  # Ctrl-C before the release was recorded: nothing was released
        return
    _charged(args, rel)
    try:
        rem = _remaining_after(s)
    except KeyboardInterrupt:  # pressed again meanwhile: the answer is saved without the remaining budget
        rem = None
    _keep_interrupted(rel, rem, targets, _ledger_file(s), to_stdout=to_stdout)


def _keep_interrupted(rel: Any, remaining: Any, targets: _Targets, ledger: str | None, *, to_stdout: bool) -> None:
    """Save a charged release whose writing a signal cut short, as a failed write saves it: its charge
    stands, so losing the answer would mean paying for it again. Signals wait meanwhile."""
    if not to_stdout and all(t.done for t in targets.by_flag.values()):
        return  # every output was written whole
    import signal

    from dpsql._output import rescue

    # a further signal waits for the save: masking it in this thread is not enough, since another thread (DuckDB's
    # workers) takes it and Python's handler then runs here anyway; the command already exits as the first signal says
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
        if getattr(signal, "SIGHUP", None) is not None and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda *_: None)
    try:
        data = (json.dumps(rel.to_dict(remaining), indent=1, default=str) + "\n").encode("utf-8")
        saved = rescue({"release.json": data}, rel.ledger_id, ledger)
        if saved is not None:
            print(f"the released answer of ledger entry {rel.ledger_id} was saved to {saved}{os.sep}release.json (its rows "
                  "and meta); running the query again would charge again", file=sys.stderr)
    except Exception:  # pragma: no cover - the JSON form of released values; the signal's exit follows
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _silence_stdout() -> None:
    """After a failed write to standard output (its reader has gone): point it at /dev/null, so
    that the interpreter's final flush does not print a second, raw error."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _cmd_budget(args: argparse.Namespace) -> int:
    import dpsql
    from dpsql.errors import ConfigError
    from dpsql.ledger import Ledger

    cfg = _load_config(args)
    path = _ledger_path(args, cfg)
    # --set-total changes the recorded total: open by the ledger's own total, not the config's
    opener = Ledger.open
    shown = path
    if path.startswith(("postgresql://", "postgres://")):
        from dpsql.ledger._postgres import PostgresLedger, redact

        opener = PostgresLedger.open
        shown = redact(path)  # the URL's password never reaches stdout (CI logs, terminals)
    from types import SimpleNamespace

    # its summary printed into the ledger's own files (or the config) would damage them
    _check_output_targets(args, SimpleNamespace(ledger=SimpleNamespace(path=path), tables={}))
    new_total: Any = None  # the numbers and the owner's word are judged before the ledger is opened
    if args.set_total:
        try:
            eps, delta = float(args.set_total[0]), float(args.set_total[1])
        except ValueError:
            raise ConfigError(
                f"--set-total expects two numbers EPSILON DELTA, got {' '.join(args.set_total)!r}",
                hint="e.g. --set-total 10 1e-5",
            ) from None
        why = "".join(f"{t}: {w}" for t, w in ((t, _unrepresentable(t, v) + _spelling(t, v))
                                               for t, v in zip(args.set_total, (eps, delta))) if w)
        try:
            if why:
                raise ConfigError(why)
            new_total = dpsql.Budget(eps, delta)
        except ConfigError:
            raise ConfigError(
                f"--set-total {' '.join(args.set_total)} is refused: {why}--set-total needs a finite EPSILON >= 0 and a "
                f"DELTA in [0, 1){''.join(dict.fromkeys(_form(t) for t in args.set_total))}",
                hint="e.g. --set-total 10 1e-5",
            ) from None
        if cfg.registers_tables and new_total != cfg.budget:
            # the owner's config: its [ledger] total is the owner's word (a file the analyst cannot
            # write); the command line may only record that total, never choose one
            said = ("declares no total" if cfg.budget is None else
                    f"declares epsilon = {cfg.budget.epsilon!r}, delta = {cfg.budget.delta!r}")
            raise ConfigError(
                f"--set-total {' '.join(args.set_total)} differs from the total of the config {args.config_path!r}, "
                f"which registers tables and {said} under [ledger]: with the data owner's config the total can "
                "only be set to the one the config declares; nothing was changed",
                hint="the data owner first writes the new total under [ledger] in the config (epsilon = ..., delta = "
                "...), then runs this command with the same values",
            )
    with opener(path, None if args.set_total else cfg.budget,
                     create=not args.set_total and _create_if_missing(args, cfg), lock_timeout=_lock_timeout(args, cfg)) as led:
        if new_total is not None:
            led.set_total(new_total, reason=args.reason)
            if cfg.budget is not None and new_total != cfg.budget:  # (a config that registers tables refused it above)
                print(f"warning: the config {args.config_path!r} declares epsilon = {cfg.budget.epsilon!r}, delta = "
                      f"{cfg.budget.delta!r} under [ledger]: every later command with it is refused until it says epsilon = "
                      f"{new_total.epsilon!r}, delta = {new_total.delta!r}, the total now recorded", file=sys.stderr)
        snap = led.snapshot(history=args.history)  # one transaction: the summary agrees with the entries
        t, sp, r = snap["total"], snap["spent"], snap["remaining"]
        summary: dict[str, Any] = {"ledger": shown, "total": {"epsilon": t.epsilon, "delta": t.delta},
                   "spent": {"epsilon": sp.epsilon, "delta": sp.delta}, "remaining": {"epsilon": r.epsilon, "delta": r.delta}}
        if args.format == "json":
            if args.history:
                summary["entries"] = _json_rows(snap["entries"])
                summary["total_changes"] = _json_rows(snap["total_changes"])
            print(json.dumps(summary, indent=1))
            return 0
        if args.format == "csv":  # each value spelled as in JSON and the table (_csv_text)
            sys.stdout.write(_csv_text(_flat(snap["entries"]) if args.history else _summary_table(summary)))
            return 0
        print(f"ledger:    {shown}")
        print(f"total:     epsilon={t.epsilon:g} delta={t.delta:g}")
        print(f"spent:     epsilon={sp.epsilon:g} delta={sp.delta:g}")
        print(f"remaining: {_fmt_remaining(r)}")
        if args.history:
            h = snap["entries"]
            keep = [
                c
                for c in h.column_names
                if c in ("entry_id", "created_at", "status", "mechanism", "epsilon", "delta", "query")
            ]
            entries, cut = _cut_cells(h.select(keep), "query", "entry_id")
            sys.stdout.write(_format_table(entries))
            changes, cut_reasons = _cut_cells(snap["total_changes"], "reason", "change_id")
            print("total changes:")
            sys.stdout.write(_format_table(changes))
            for what, ids in (("the query of entry", cut), ("the reason of change", cut_reasons)):
                if ids:
                    print(f"({what}{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))} is cut at {CELL_CHARS} characters, "
                          "ending '...': --format json or csv prints it whole)")
    return 0


#: the longest text a cell of the history's table shows: every row of a column is padded to its longest cell, so one
#: query of megabytes (the SQL may hold 16 Mi characters) made every row of the table that wide
CELL_CHARS = 160


def _cut_cells(tbl: Any, column: str, key: str) -> tuple[Any, list[Any]]:
    """``tbl`` with each text of ``column`` longer than CELL_CHARS cut to that many characters and '...', and the
    ``key`` of each row cut."""
    import pyarrow as pa

    texts = tbl.column(column).to_pylist()
    cut = [k for k, t in zip(tbl.column(key).to_pylist(), texts) if t is not None and len(t) > CELL_CHARS]
    if cut:
        short = [t if t is None or len(t) <= CELL_CHARS else t[:CELL_CHARS] + "..." for t in texts]
        tbl = tbl.set_column(tbl.column_names.index(column), column, pa.array(short, pa.string()))
    return tbl, cut


def _json_rows(tbl: Any) -> list[dict[str, Any]]:
    from dpsql.release import _json_safe, python_rows, temporal_columns_as_text

    return _json_safe(python_rows(temporal_columns_as_text(tbl)))  # type: ignore[no-any-return]


def _flat(tbl: Any) -> Any:
    """Nested columns (lists, structs) as JSON text, so the table can be written as CSV."""
    import pyarrow as pa

    for i, f in enumerate(tbl.schema):
        if pa.types.is_nested(f.type):
            tbl = tbl.set_column(i, f.name, pa.array([None if v is None else json.dumps(v, default=str)
                                                      for v in tbl.column(i).to_pylist()], pa.string()))
    return tbl


def _summary_table(summary: dict[str, Any]) -> Any:
    import pyarrow as pa

    names = ["total", "spent", "remaining"]
    return pa.table({"budget": names, "epsilon": [summary[n]["epsilon"] for n in names],
                     "delta": [summary[n]["delta"] for n in names]})


def _cmd_suggest(args: argparse.Namespace) -> int:
    rel: Any = None
    rem: Any = None
    ledger: str | None = None
    try:
        with _open_session(args) as s:
            ledger = _ledger_file(s)
            _check_output_targets(args, s)
            try:
                rel = s.suggest_caps(args.name, epsilon=args.epsilon, group_by=args.group_by, quantile=args.quantile)
            except KeyboardInterrupt as e:  # Ctrl-C held back until the advice's release was recorded: it is kept
                _keep_held_back(e, args, s, _Targets(), to_stdout=True)
                raise
            _charged(args, rel)
            rem = _remaining_after(s)
    except KeyboardInterrupt:  # once answered, before it is printed (the remaining budget read, the Session closed): kept
        if rel is not None:
            _charged(args, rel)
            _keep_interrupted(rel, rem, _Targets(), ledger, to_stdout=True)
        raise
    text = ""
    try:
        if args.format == "json":
            text = json.dumps(rel.to_dict(rem), indent=1) + "\n"
        else:
            text = _format_table(rel.table) + "suggested: " + ", ".join(
                f"{k} = {v}" for k, v in rel.details["suggested"].items()) + "\n"
        sys.stdout.write(text)
        sys.stdout.flush()
    except Exception as e:  # as _write_release: whatever failed, the charge stands
        if isinstance(e, OSError):
            _silence_stdout()
        name = f"stdout.{'json' if args.format == 'json' else 'txt'}"
        raise _written_failed(rel, [("stdout", None, name, text.encode("utf-8") if text else None, e)], rem, ledger) from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM after the charge: the paid advice is kept, as a query's answer
        _keep_interrupted(rel, rem, _Targets(), ledger, to_stdout=True)
        raise
    print(f"cost: epsilon={rel.cost.epsilon:g}; remaining: {_fmt_remaining(rem)}; "
          f"ledger entry {rel.ledger_id}", file=sys.stderr)
    return 0


def _cmd_tables(args: argparse.Namespace) -> int:
    from dpsql.errors import ConfigError
    from dpsql.release import _json_safe, name_text

    with _open_session(args, ledger=False) as s:
        tables = {name: spec.public_description() for name, spec in s.tables.items()}
    if getattr(args, "name", None) is not None:
        if args.name.lower() not in tables:
            from dpsql.plan.names import did_you_mean

            raise ConfigError(f"no table '{args.name}' is registered{did_you_mean(args.name, tables)}",
                              hint="dpsql tables lists them" + (f": {', '.join(sorted(tables))}" if tables else ""))
        tables = {args.name.lower(): tables[args.name.lower()]}
    if args.format == "json":
        print(json.dumps(_json_safe(tables), indent=1))
        return 0
    if not tables:
        print("no tables registered (use --config FILE, or --table NAME=PATH --privacy-unit NAME=COLUMN)", file=sys.stderr)
    for name, d in tables.items():
        if d.get("public"):  # no person: no unit, no caps
            print(f"{name}: public (holds no person; joined freely, not protected)"
                  + (f", at most {d['max_table_rows']} rows" if d.get("max_table_rows") is not None else ""))
        else:
            print(f"{name}: privacy unit {d['privacy_unit'] or '(through references)'}; max_groups_per_unit "
                  f"{d['max_groups_per_unit']:g}, max_rows_per_group {d['max_rows_per_group']:g}"
                  + (f", max_rows_per_unit {d['max_rows_per_unit']:g}" if d["max_rows_per_unit"] is not None else "")
                  + f", tau {d['tau']}"
                  + (f", at most {d['max_table_rows']} rows" if d.get("max_table_rows") is not None else ""))
        for ref, tgt in d["references"].items():
            deg = d.get("degree_bounds", {}).get(ref)
            print(f"  reference {name_text(ref, ' ')} -> {tgt}" + (f" (at most {deg} rows per value)" if deg is not None else ""))
        policy = {col: "; ".join(f"{k} {json.dumps(_json_safe(v))}" for k, v in c.items()) for col, c in d["columns"].items()}
        if getattr(args, "name", None) is not None:  # describe: every column, its type and its declared policy
            for col, typ in d["schema"].items():  # a name that could be misread (a line break, a space) quoted
                print(f"  {name_text(col, ' ')} {typ}" + (f": {policy[col]}" if policy.get(col) else ""))
            continue
        for col, text in policy.items():
            print(f"  {name_text(col)}: {text}")
    return 0


#: flags whose value is one number: a negative one (-1e-5, -inf) is attached as --flag=VALUE, since
#: argparse takes anything but a plain -1 or -0.5 for an option and says only "expected one argument"
_NUMBER_FLAGS = ("--epsilon", "--delta", "--quantile", "--lock-timeout")


def _attach_negative_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return out + argv[i:]
        if a in _NUMBER_FLAGS and i + 1 < len(argv) and argv[i + 1].startswith("-") and _is_number(argv[i + 1]):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


#: flags whose values are text (SQL, names, domain values, a reason), never a file path
_TEXT_FLAGS = ("sql", "option", "privacy_unit", "max_groups", "max_rows", "bounds", "domain", "bins", "type", "public",
               "reference", "degree_bound", "max_table_rows", "allow_conditional_sampling", "reason", "group_by", "name")


def _texts_as_utf8(args: argparse.Namespace) -> None:
    """Text flags typed in UTF-8 under an ASCII locale (LC_ALL=C with PYTHONUTF8=0), where Python reads every
    byte above 0x7F of the command line as a lone surrogate: read as the UTF-8 they are ('été' was refused as
    'not UTF-8 text'). Bytes that are not UTF-8 stay as they are, refused where used; paths are left alone,
    since the file system reads them back through the same locale (and --table's NAME=PATH keeps its PATH)."""
    def utf8(v: Any) -> Any:
        if not isinstance(v, str) or not any("\udc80" <= c <= "\udcff" for c in v):
            return v
        try:
            return os.fsencode(v).decode("utf-8")
        except UnicodeError:
            return v

    for dest in _TEXT_FLAGS:
        v = getattr(args, dest, None)
        if v is not None:
            setattr(args, dest, [utf8(x) for x in v] if isinstance(v, list) else utf8(v))
    if getattr(args, "table", None):
        args.table = [utf8(name) + eq + path for name, eq, path in (it.partition("=") for it in args.table)]


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _closed_streams() -> frozenset[int]:
    """Standard output and error as this command found them closed (>&-, 2>&-): their numbers may come to name
    another file this process opens, so that -o /dev/stdout would write there."""
    closed = set()
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    return frozenset(closed)


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    global _CLOSED_AT_START
    _CLOSED_AT_START = _closed_streams() | {fd for fd, stream in ((1, sys.stdout), (2, sys.stderr)) if stream is None}
    err = sys.stderr
    if err is not None:  # a message that cannot be written never changes what the command does or its exit code
        sys.stderr = _QuietStderr(err)
    try:
        with warnings.catch_warnings():  # the caller's filters and showwarning are given back
            # A RuntimeWarning of a numeric library (overflow, invalid value) can arise while a release is
            # computed from noisy or true aggregates: never printed (its text could reflect them), and never
            # turned into an error after the charge (PYTHONWARNINGS=error lost the paid release)
            warnings.simplefilter("ignore", RuntimeWarning)
            # dpsql's own warnings (about public parameters) as one clean stderr line (no file:line)
            warnings.showwarning = lambda message, *a, **k: print(f"warning: {_cli_text(str(message))}", file=sys.stderr)
            return _main(argv)
    finally:
        if err is not None and isinstance(sys.stderr, _QuietStderr):
            sys.stderr = err


class _QuietStderr:
    """Standard error, whose writes never fail the command (a full disk behind ``2>>log``, a reader gone from
    ``2>&1 | head``): a refusal exited 1 instead of 2, 3 or 4, and an answer written to -o exited 1 too. What
    cannot be written is dropped, and the descriptor then points at /dev/null, so that the interpreter's final
    flush does not fail the exit status either."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, text: str) -> int:
        try:
            return int(self.real.write(text))
        except OSError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self.real.flush()
        except OSError:
            self._silence()

    def _silence(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
            fd = self.real.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _main(argv: Sequence[str] | None) -> int:
    from dpsql.errors import CHARGED_EXIT_CODE, DPSQLError, ExecutionError, LedgerError

    if sys.stderr is None:  # started with 2>&-: print(file=None) would put messages among the rows on stdout
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the rest of the process
    parser = build_parser()
    line = _attach_negative_values(sys.argv[1:] if argv is None else list(argv))
    _Parser.argv = line
    _Parser.help_failed = None
    try:
        args = parser.parse_args(line)
    except SystemExit as e:  # a usage error (2), --help or --version (0): returned, as every other exit code is, to a
        code = e.code if isinstance(e.code, int) else 2 if e.code else 0  # program that calls main(argv) itself
        return code if code or _Parser.help_failed in (None, "gone") else _help_not_written(line, _Parser.help_failed)
    _texts_as_utf8(args)
    if not args.command:  # a usage error: its help goes to stderr, never into the caller's output file
        parser.print_help(sys.stderr)
        return 2
    import signal

    interrupted = threading.Event()
    caught: list[int] = []
    # Ctrl-C and a job runner's SIGTERM (docker stop, kill, timeout): both unwind the command, so a
    # charged run's ledger entry is marked failed and the caller is told; exit 128 + the signal
    # (and a hang-up, SIGHUP: an ssh session or terminal closed, unless the job ignores it, as under nohup)
    hup = getattr(signal, "SIGHUP", None)
    handled = (signal.SIGINT, signal.SIGTERM) + ((hup,) if hup is not None and signal.getsignal(hup) == signal.SIG_DFL
                                                  else ())
    previous = {sig: signal.getsignal(sig) for sig in handled}

    def on_signal(signum: int, frame: Any) -> None:
        caught.append(signum)
        interrupted.set()
        raise _Stopped

    def stopped(e: BaseException | None = None) -> int:
        sig = caught[0] if caught else signal.SIGINT
        what = ("terminated (SIGTERM)" if sig == signal.SIGTERM else "hung up (SIGHUP)" if sig == getattr(signal, "SIGHUP", None)
                else "interrupted")
        entry = getattr(e, "ledger_entry", None)  # cut short once charged: its charge is that entry, as the ledger has it
        led = getattr(args, "opened_ledger", None)
        if entry is None:  # what this command's ledger recorded of it (a charge is noted at its COMMIT, Ctrl-C held back)
            charging = args.command in ("query", "suggest-caps")  # (the other commands never charge)
            last = getattr(led, "last_entry", None) if charging else None
            entry = last() if callable(last) else None
            if entry is None and (not charging or e is not None):  # (an error after the signal, e.g. a COMMIT not
                # acknowledged, may have charged: said as before)
                print(f"{what}: nothing was charged by this command", file=sys.stderr)
                return 128 + int(sig)
        fate = ("" if not entry or (entry[1] == "released" and getattr(args, "charged_entry", None) == entry[0])  # kept
                else "; its answer was lost: running the query again would charge again" if entry[1] == "released"
                else "; nothing was released")
        print(f"{what}: a charge already made stands (" + (f"this query's: ledger entry {entry[0]}, {entry[1]}, counted{fate})"
                                                             if entry else "see dpsql budget --history)"), file=sys.stderr)
        return 128 + int(sig)

    if threading.current_thread() is threading.main_thread():
        for sig in handled:
            signal.signal(sig, on_signal)
    guard = sys.stdout = _StdoutGuard(sys.stdout)
    restore_encoding = _utf8_stdout(guard)
    try:
        _check_numbers(args)
        _check_stdout_open(args, guard)
        if args.command == "budget" and args.set_total and not args.reason.strip():
            from dpsql.errors import ConfigError

            raise ConfigError("--set-total needs --reason: every change of the total is recorded with why",
                              hint='e.g. --set-total 10 1e-5 --reason "new quarter"')
        if args.command == "budget" and args.reason and not args.set_total:  # (it was dropped: exit 0, the total as it was)
            from dpsql.errors import ConfigError

            raise ConfigError("--reason is the reason of a change of the total, and no --set-total was given: nothing was "
                              "changed", hint='give the new total too, e.g. --set-total 10 1e-5 --reason "new quarter", or '
                              "drop --reason to show the budget")
        if args.command == "init":
            return _cmd_init(args)
        if args.command in ("query", "explain"):
            code = _cmd_query(args)
        elif args.command == "suggest-caps":
            code = _cmd_suggest(args)
        elif args.command in ("tables", "describe"):
            code = _cmd_tables(args)
        else:
            code = _cmd_budget(args)
        sys.stdout.flush()
        return code
    except OSError as e:
        if interrupted.is_set():
            return stopped()
        if isinstance(e, FileNotFoundError) and e.filename is None and _cwd_gone():  # os.getcwd() of a relative path
            print("error: ConfigError: the working directory was removed, so a relative path given to this command (a file "
                  "named without a leading /) cannot be found; nothing was charged\nhint: run it from a directory that "
                  "exists (in a cron job or script: cd DIR && dpsql ...), or give absolute paths", file=sys.stderr)
            return 2
        if not (isinstance(e, BrokenPipeError) or e is guard.failed):
            return _unexpected(e, args)
        # a free command's output (a charged one's says so through _written_failed)
        _silence_stdout()
        why = "its reader closed it" if isinstance(e, BrokenPipeError) else e.strerror or type(e).__name__
        entry = getattr(args, "charged_entry", None)
        print(f"error: writing stdout failed ({why}); " + (f"the query was answered and its charge stands (ledger entry "
              f"{entry})" if entry is not None else f"nothing was charged by dpsql {args.command}"), file=sys.stderr)
        return 1 if entry is None else CHARGED_EXIT_CODE
    except DPSQLError as e:
        if interrupted.is_set():
            return stopped()
        name = next(c.__name__ for c in type(e).__mro__ if not c.__name__.startswith("_"))  # a public class
        cfg = getattr(args, "ledger_config", None)
        text = str(e) if cfg is None else _config_ledger_text(e, args.config_path, cfg)
        if isinstance(e, LedgerError) and getattr(args, "ledger_where", None):
            # a PostgreSQL ledger that cannot be reached: the URL is the flag's, the variable's or the config's
            text = text.replace("\nhint: check the URL, ", f"\nhint: check the URL ({args.ledger_where}), ")
        if getattr(args, "ledger_default", False) and text.startswith("no budget ledger at "):
            first, _, rest = text.partition("\n")
            text = (f"{first} (the default ledger, {DEFAULT_LEDGER} in the working directory: no --ledger, $DPSQL_LEDGER "
                    f"or config names one)\n{rest}")
        elif getattr(args, "ledger_where", None) == "$DPSQL_LEDGER" and text.startswith("no budget ledger at "):
            first, _, rest = text.partition("\n")  # a stale variable in a job's environment: say where the path came from
            text = f"{first} (named by $DPSQL_LEDGER; --ledger PATH or a config's [ledger] path comes first)\n{rest}"
        elif getattr(args, "ledger_where", None) and text.startswith("the ledger is a PostgreSQL connection string "):
            text = text.replace("the ledger is", f"the ledger named by {args.ledger_where} is", 1)
        elif (isinstance(e, LedgerError) and getattr(args, "ledger_where", None) in ("--ledger", "$DPSQL_LEDGER")
              and " is not a dpsql budget ledger: " in text.partition("\n")[0]):
            first, _, rest = text.partition("\n")  # (a data file given by mistake: say which setting named it)
            text = (f"{first} (named by {args.ledger_where})\n"
                    + rest.replace("pass the path of your ledger file", f"give {args.ledger_where} the path of your ledger file"
                                   if args.ledger_where == "--ledger" else "point $DPSQL_LEDGER at your ledger file"))
        print(f"error: {name}: {_cli_text(text)}", file=sys.stderr)
        if getattr(args, "debug_on", False) and isinstance(e, ExecutionError) and e.debug_detail:
            print(f"debug: {e.debug_detail}", file=sys.stderr)
        return CHARGED_EXIT_CODE if getattr(args, "charged_entry", None) is not None else int(e.exit_code)
    except KeyboardInterrupt as e:
        return stopped(e)
    except Exception as e:
        # after a signal, whatever failed failed because of it: DuckDB turns the interrupt of a running
        # statement into RuntimeError('Query interrupted'), and an import cut short becomes an ImportError
        if interrupted.is_set():
            return stopped()
        return _unexpected(e, args)  # pragma: no cover - unexpected
    finally:
        if restore_encoding is not None:
            with contextlib.suppress(Exception):
                guard.real.reconfigure(encoding=restore_encoding)
        if sys.stdout is guard:
            sys.stdout = guard.real
        if threading.current_thread() is threading.main_thread():
            for sig, handler in previous.items():
                # the command's own process (its argv read from the command line): a signal once the command is done
                # is ignored, so that its exit code stands (a SIGTERM as the interpreter exited killed it, status -15
                # with no line on stderr, after the answer was written and its release recorded)
                done = argv is None and handler in (signal.SIG_DFL, signal.default_int_handler)
                signal.signal(sig, signal.SIG_IGN if done else handler)



class _Stopped(KeyboardInterrupt):
    """What the SIGINT/SIGTERM handler raises: a KeyboardInterrupt to every ``except`` clause, but not
    the exact class. CPython marks the interpreter as ended by Ctrl-C when a plain KeyboardInterrupt
    escapes code run from a string (``exec(text)``, as dataclasses do while a module is imported),
    and ``python -m dpsql.cli`` then kills itself with SIGINT on exit, whatever ``main`` returned."""


def _help_not_written(line: Sequence[str], failed: Any) -> int:
    """The exit code of --help or --version that could not be written: a closed standard output is a usage error (2),
    as for every command that prints; a failed write (a full disk) is 1. A pipe whose reader has left (`dpsql --help |
    head -1`, `| grep -q`) is no failure: the help is for whoever still reads it (exit 0, said nowhere)."""
    what = "--version" if "--version" in line else "--help"
    if failed == "closed":
        print(f"error: ConfigError: standard output is closed: dpsql {what} would have nowhere to print\n"
              "hint: run it with standard output open (e.g. dpsql --help | less)", file=sys.stderr)
        return 2
    print(f"error: writing stdout failed ({getattr(failed, 'strerror', None) or type(failed).__name__}): the {what} text "
          "was not written; nothing was charged", file=sys.stderr)
    return 1


def _cwd_gone() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def _unexpected(e: BaseException, args: argparse.Namespace) -> int:
    """An unexpected failure (a bug): exit 1, or, once this command's answer was charged, 5 (the charge stands)."""
    from dpsql.errors import CHARGED_EXIT_CODE

    entry = getattr(args, "charged_entry", None)
    print(f"error: unexpected {type(e).__name__}" + ("" if entry is None else f" after the query was answered; its charge "
          f"stands (ledger entry {entry})"), file=sys.stderr)
    if getattr(args, "debug_on", False):
        raise e
    return 1 if entry is None else CHARGED_EXIT_CODE


class _StdoutGuard:
    """Standard output, remembering a write that failed (a full disk, a closed pipe), so that the
    command can say so instead of 'unexpected OSError'; ``real`` is None when it was closed (>&-)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.failed: OSError | None = None

    def write(self, text: str) -> int:
        try:
            raw = getattr(self.real, "buffer", None)
            if not isinstance(raw, io.RawIOBase):
                return int(self.real.write(text))
            # unbuffered (PYTHONUNBUFFERED=1, python -u): the text layer writes straight to the file and drops a short
            # count, which a pipe whose reader leaves mid-write returns (then EPIPE on the next write): written whole
            self.real.flush()
            view = memoryview(text.encode(self.real.encoding, self.real.errors))
            while view:
                n = raw.write(view)
                if n is None:  # a non-blocking descriptor that is full
                    raise BlockingIOError(errno.EAGAIN, "standard output would block")
                view = view[n:]
            return len(text)
        except OSError as e:
            self.failed = e
            raise

    def flush(self) -> None:
        try:
            self.real.flush()
        except OSError as e:
            self.failed = e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _utf8_stdout(guard: _StdoutGuard) -> str | None:
    """Standard output carries machine-readable rows: UTF-8, as ``-o FILE`` writes them, whatever the
    locale's encoding (under Latin-1 a released key such as '日本' failed the write after the charge).
    Returns the encoding to give back when the command is done (None when nothing was changed)."""
    import codecs

    real = guard.real
    enc = getattr(real, "encoding", None)
    if real is None or not isinstance(enc, str) or not callable(getattr(real, "reconfigure", None)):
        return None
    try:
        if codecs.lookup(enc).name == "utf-8":
            return None
        real.flush()
        real.reconfigure(encoding="utf-8")
    except (LookupError, OSError, ValueError):
        return None
    return enc


def _reader_gone(stream: Any) -> bool:
    """Whether ``stream`` is a pipe that no process reads any more (a write would fail with EPIPE): poll() reports
    POLLERR on the write end of such a pipe, without writing to it."""
    import stat

    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    from dpsql._pipes import reader_gone

    return reader_gone(fd)


#: the standard streams (1, 2) that were closed when main() was called
_CLOSED_AT_START: frozenset[int] = frozenset()


def _check_stdout_open(args: argparse.Namespace, guard: _StdoutGuard) -> None:
    """Standard output closed (>&-), or a pipe whose reader has gone: refuse, before any charge, a command that prints to it."""
    from dpsql.errors import ConfigError

    named = [(f, p) for f, p in (("-o", getattr(args, "output", None)), ("--meta", getattr(args, "meta", None)))
             if args.command == "query" and p and p != "-"]
    if named and _CLOSED_AT_START:
        from dpsql._output import caller_fd  # (only for output files)

        for flag, path in named:
            fd = caller_fd(path)
            if fd in _CLOSED_AT_START:
                name = "standard output" if fd == 1 else "standard error"
                raise ConfigError(f"{flag} {path!r} names {name}, which is closed: the output would go nowhere; nothing "
                                  "was charged", hint=f"run it with {name} open (e.g. {'' if fd == 1 else '2'}> FILE), or give "
                                  f"{flag} a file")

    charged_to_stdout = args.command == "suggest-caps" or (args.command == "query" and (not args.output or args.output == "-"))
    if guard.real is not None and charged_to_stdout and _reader_gone(guard.real):
        # (`dpsql query ... | loader` whose loader ended at start: the answer would be charged, then fail to be written)
        raise ConfigError(f"standard output is a pipe whose reader has closed it (the program reading dpsql's output has "
                          f"ended): dpsql {args.command} would have nowhere to print; nothing was charged",
                          hint="check the program that reads dpsql's output (under set -o pipefail its failure shows)"
                          + (", or give -o FILE" if args.command == "query" else ""))
    if guard.real is not None:
        return
    guard.real = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - what nothing reads
    if args.command == "init" or (args.command == "query" and args.output and args.output != "-"):
        return
    raise ConfigError(f"standard output is closed: dpsql {args.command} would have nowhere to print"
                      + ("; nothing was charged" if args.command in ("query", "suggest-caps") else ""),
                      hint="run it with standard output open (e.g. > result.txt)"
                      + (", or give -o FILE" if args.command == "query" else ""))


_FLAG_OF = {"max_groups_per_unit": "--max-groups", "max_rows_per_group": "--max-rows", "privacy_unit": "--privacy-unit"}


def _option_example(m: re.Match[str]) -> str:
    """``options={'KEY': VALUE}`` of a Python-API hint as the --option flag that gives it."""
    key, value = m.group(1), m.group(2).strip()
    if key == "reuse" and value == "'synopsis'":
        return "--reuse-synopsis"
    value = {"True": "true", "False": "false"}.get(value, value.strip("'"))
    return f"--option {key}={value}"


def _cli_text(text: str) -> str:
    """An error's text in the command line's terms: the Python-API hints become flags and config keys."""
    import re

    def register(m: re.Match[str]) -> str:
        table, args = m.group(1), m.group(2)
        pairs = re.findall(r"(\w+)=([^,)]+)", args)
        keys = ", ".join(f"{k} = {json.dumps(v.strip(chr(39))) if v.startswith(chr(39)) else v}" for k, v in pairs)
        flags = " ".join(f"{_FLAG_OF[k]} {table}={v.strip(chr(39))}" for k, v in pairs if k in _FLAG_OF)
        out = (f"set {keys} under [tables.{table}] in the config" if pairs
               else f"--table {table}=PATH (or [tables.{table}] in the config)")
        per_query = " ".join(f"--option {k}={v}" for k, v in pairs if k == "max_rows_per_unit")  # a query option too
        return (out + (f" (or {flags} with --table)" if flags else "")
                + (f", or cap this query with {per_query}" if per_query else ""))

    text = text.replace("e.g. register(..., version='2026-11-30')", 'e.g. version = "2026-11-30" under [tables.T] in the config')
    text = re.sub(r"register\('\w+', '[^']*', \.\.\.\), (--table )", r"\1", text)  # (the same advice as the flag's, beside it)
    text = re.sub(r"register\('(\w+)', \.\.\.,? ?([^)]*)\)", register, text)
    # an option's example as the flag types it: --reuse-synopsis for reuse='synopsis', a text unquoted, a boolean as
    # true/false, a mapping as JSON (options={'reuse': 'synopsis'} read '--option --reuse-synopsis', and a mapping's
    # Python literal, which --option cannot read, was cut at its first '}')
    text = text.replace("options={'degree_caps': {'orders.o_custkey': 16}}", """--option 'degree_caps={"orders.o_custkey": 16}'""")
    text = re.sub(r"options=\{'(\w+)': ([^}]+)\}", _option_example, text)
    # the ledger's path as the command line gives it
    text = text.replace("hint: create the directory first or choose another path",
                        "hint: create the directory first, or choose another path with --ledger (or [ledger] path in "
                        "the config)")
    text = re.sub(r"e\.g\. (epsilon|delta)=([0-9][0-9.e-]*)", r"e.g. --\1 \2", text)  # Budget's hints
    text = re.sub(r"pass delta=([0-9][0-9.e-]*)", r"pass --delta \1", text)  # a mechanism's need of a delta
    text = re.sub(r"mechanism='(\w+)'", r"--option mechanism=\1", text)  # a mechanism named as an option
    text = re.sub(r"ask for delta=([0-9][0-9.e+-]*) or less", r"ask for --delta \1 or less", text)  # the ledger's fp hint
    text = text.replace("use a smaller epsilon (below 10 usually fits), or delta=0 (Laplace",
                        "use a smaller --epsilon (below 10 usually fits), or --delta 0 (Laplace")  # the Gaussian fp hint
    text = text.replace("use a smaller epsilon (below 10 usually fits)", "use a smaller --epsilon (below 10 usually fits)")
    text = text.replace("only requests with delta 0 (pure DP) fit", "only queries with --delta 0 (pure DP) fit")
    text = text.replace("the ledger cannot store reason ", "the ledger cannot store the --reason ")
    text = text.replace("ask for a smaller epsilon/delta, reuse an earlier release,",  # the ledger's refusal of a charge
                        "ask for a smaller --epsilon or --delta (dpsql explain shows a query's cost, free), keep and reuse an "
                        "earlier answer,")
    # the budget's words in a mechanism's refusal (a noise scale, a sampler's allowance): the flags
    text = re.sub(r"\buse (a smaller|a larger|an) epsilon\b", lambda m: f"use {m.group(1)} --epsilon", text)
    text = text.replace("use a small delta such as", "use a small --delta such as").replace(
        ", or 0 for pure DP", ", or --delta 0 for pure DP").replace("pass delta (", "pass --delta (")
    text = re.sub(r"^(epsilon|delta)=([0-9][0-9.e+-]*) ", r"--\1 \2 ", text)  # a refused value, quoted first
    text = re.sub(r"^epsilon is too small for ", "--epsilon is too small for ", text)
    text = text.replace("use Session.explain(sql, epsilon=...) or `dpsql explain SQL --epsilon ...`", "use `dpsql explain SQL --epsilon ...`")
    text = text.replace("shows in Session.history() or `dpsql budget --history`", "shows in `dpsql budget --history`")
    text = text.replace("at one charge, by Session.query_many([...])", "at one charge, by --workload")
    text = text.replace("use Session.query_many([...])", "use --workload with a file of range counts (-f FILE)")
    # the CLI passes a total only from the config's [ledger] epsilon/delta: say so, and how to match it
    m = re.search(r"records a total budget of \(epsilon=([^,]+), delta=([^)]+)\), but (\(epsilon=[^)]*\)) was passed", text)
    if m:
        text = text.replace(f"{m.group(3)} was passed", f"the config's [ledger] says {m.group(3)}")
        text = re.sub(r"hint: omit the total to use the recorded one, or change it[^\n]*",
                      f"hint: set epsilon = {m.group(1)} and delta = {m.group(2)} under [ledger] in the config to match "
                      'the ledger (or change the ledger\'s total on purpose: dpsql budget --set-total EPSILON DELTA --reason "...", '
                      "then update the config)", text)
    text = re.sub(r"(?:\s*or\s*)?`?Ledger\.set_total\((?:[^()]|\([^()]*\))*\)`?",
                  "" if "--set-total" in text else 'dpsql budget --set-total EPSILON DELTA --reason "..."', text)
    text = re.sub(r"Ledger\.open\((?:path|url)[^)]*\)", "--ledger PATH (or the config's [ledger] path)", text)
    # a PostgreSQL ledger's hints name the API's way of creating one next to `dpsql init`
    text = text.replace(" or Session(ledger=URL, budget=..., create=True)", "")
    text = text.replace("hint: give the ledger a name of at most", "hint: give --ledger (or [ledger] path in the config) a file "
                        "name of at most")
    text = text.replace("hint: check the ledger URL:", "hint: check the URL given to --ledger (or [ledger] url in the config):")
    text = text.replace("create it with create=True or `dpsql init --ledger URL`",
                        "create it with `dpsql init --epsilon EPSILON --delta DELTA --ledger URL`")
    # a program that is not dpsql holds the ledger
    text = text.replace("or retry with a larger lock_timeout", "or retry once they have closed it (--lock-timeout SECONDS "
                        "waits longer)")
    text = re.sub(r"columns=\{'([^']+)': \{'domain': \[\.\.\.\]\}\}",
                  lambda m: f"--domain TABLE.{m.group(1)}=A,B,C (or domain = [...] under [tables.T.columns.{m.group(1)}] in the "
                  "config)", text)
    text = re.sub(r"columns=\{'([^']+)': \{'domain': \[(False, True)\]\}\}",  # (a BOOLEAN column's two keys)
                  lambda m: f"--domain TABLE.{m.group(1)}=false,true (or domain = [false, true] under "
                  f"[tables.T.columns.{m.group(1)}] in the config)", text)
    text = re.sub(r"columns=\{'([^']+)': \{'bounds': \(([^,]+), ([^)]+)\), 'bins': (\w+)\}\}",
                  lambda m: f"--bins TABLE.{m.group(1)}={m.group(2)}:{m.group(3)}:{m.group(4)} (or bounds and bins under "
                  f"[tables.T.columns.{m.group(1)}] in the config)", text)
    text = re.sub(r"columns=\{'([^']+)': \{'bounds': \['([\d-]+)', '([\d-]+)'\], 'bin_width': '1 day'\}\}",
                  lambda m: f"--bins TABLE.{m.group(1)}={m.group(2)}:{m.group(3)}:N (N bins; or bounds with bins or bin_width "
                  f"under [tables.T.columns.{m.group(1)}] in the config)", text)
    text = re.sub(r"columns=\{'(\w+)': \{'bounds': \(([^,]+), ([^)]+)\)[^}]*\}\}",
                  lambda m: f"--bounds TABLE.{m.group(1)}={m.group(2)}:{m.group(3)} (or [tables.T.columns] in the config)", text)
    # a table's references, size bound and the suggest-caps quantile, as flags and config keys
    text = re.sub(r"references=\{'([^']+)': '([^']+)'\}(?:; a composite key: \{'a,b': 'table\.x,y'\})?",
                  lambda m: f"--reference TABLE.{m.group(1)}={m.group(2)} (or references = {{ {m.group(1)} = \"{m.group(2)}\" }} "
                  "under [tables.T] in the config)", text)
    text = re.sub(r"references=\{'a,b': 'table\.x,y'\}", "--reference 'TABLE.a,b=table.x,y'", text)
    text = re.sub(r"degree_bounds=\{'(\w+)': (\d+)\}",
                  lambda m: f"--degree-bound TABLE.{m.group(1)}={m.group(2)} (or degree_bounds = {{ {m.group(1)} = {m.group(2)} }} "
                  "under [tables.T] in the config)", text)
    text = text.replace("e.g. max_table_rows=1_500_000", "e.g. --max-table-rows TABLE=1500000 (or max_table_rows = 1_500_000 "
                        "under [tables.T] in the config)")
    text = text.replace("or declare the columns' bounds", "or declare the columns' bounds (--bounds TABLE.COL=LO:HI, or "
                        "bounds under [tables.T.columns.COL] in the config)")
    text = text.replace("e.g. quantile=0.9", "e.g. --quantile 0.9")
    text = text.replace(" >= 1 or math.inf, got ", " >= 1 or inf (no cap), got ")  # a cap, as a flag or TOML writes it
    text = text.replace("group_by '", "--group-by '").replace("give group_by a column", "give --group-by a column")
    text = text.replace("reuse='synopsis'", "--reuse-synopsis").replace("omit the reuse option", "drop --reuse-synopsis")
    text = text.replace("lower the table's max_groups_per_unit", "lower the table's --max-groups (max_groups_per_unit under "
                        "[tables.T] in the config)")
    text = text.replace("drop public=True, or drop privacy_unit", "drop --public NAME or --privacy-unit NAME=COLUMN (public = true "
                        "or privacy_unit under [tables.T] in the config)")
    text = text.replace("public=True", "--public (public = true in the config)")
    text = re.sub(r"table '([^']+)' is not registered(.*?); register it (?:with a privacy unit )?first",
                  lambda m: f"table '{m.group(1)}' is not registered{m.group(2)}; register it with --table {m.group(1)}=PATH "
                  f"--privacy-unit {m.group(1)}=COLUMN (or [tables.{m.group(1)}] in the config)", text)
    text = text.replace("register it first (Session.tables lists them)",
                        "dpsql tables lists the registered tables; register one with --table NAME=PATH (or [tables.NAME] "
                        "in the config)")
    text = text.replace(", or a pyarrow.Table", "").replace(" (a DuckDB database's table: by its name in "
                                                             "Session(connection=duckdb.connect(PATH)))", "")
    text = text.replace("is not a .parquet/.csv path and the Session has no DuckDB connection", "is not a .parquet or .csv file")
    text = re.sub(r"open it and register its table by name: Session\(\.\.\., connection=duckdb\.connect\((.*), read_only=True\)\)"
                  r"\.register\(NAME, 'TABLE', \.\.\.\)",
                  lambda m: f"the command line reads Parquet and CSV files: export the table first, e.g. duckdb {m.group(1)} -c "
                  "\"COPY TABLE TO 'TABLE.parquet'\", then --table NAME=TABLE.parquet (or source = \"TABLE.parquet\" under "
                  "[tables.NAME] in the config)", text)
    text = text.replace("pass a Parquet or CSV path, a pyarrow.Table, or Session(connection=duckdb_connection) to use its tables",
                        "give --table NAME=PATH (or source under [tables.NAME] in the config) a Parquet or CSV file "
                        "named .parquet or .csv")
    text = text.replace("hint: retry, or pass a larger lock_timeout", "hint: pass a larger lock_timeout")  # (said once)
    text = text.replace("hint: retry later or pass a larger lock_timeout", "hint: pass a larger lock_timeout")
    text = text.replace("with a larger lock_timeout (it waits lock_timeout plus 10 s, or twice lock_timeout if longer)",
                        "with a larger --lock-timeout SECONDS (or lock_timeout under [ledger] in the config; a release waits "
                        "that plus 10 s, or twice that if longer)")
    return text.replace("pass a larger lock_timeout", "try again when the other dpsql command has finished, or wait longer "
                        "with --lock-timeout SECONDS (for every command: lock_timeout under [ledger] in the config)")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
