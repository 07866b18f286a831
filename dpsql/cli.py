"""The ``dpsql`` command line: init / query / explain / budget.

Exit codes: 0 ok, 2 usage/query/config error, 3 budget exceeded, 4 ledger error, 1 other.
Rows go to stdout; cost and remaining budget to stderr.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

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
    "budget": "example:\n  dpsql --config examples/dpsql.toml budget --history",
    "main": (
        "example:\n  dpsql --config examples/dpsql.toml query "
        "\"SELECT COUNT(*) FROM events\" --epsilon 0.1"
    ),
}


def _common(p: argparse.ArgumentParser, *, sub: bool = False) -> None:
    """Options accepted before or after the subcommand (a subcommand never resets them)."""
    g = p.add_argument_group("tables and ledger")

    def d(v: Any) -> Any:
        return argparse.SUPPRESS if sub else v

    g.add_argument("--config", metavar="FILE", default=d(None), help="dpsql.toml with [ledger] and [tables.NAME] (default: ./dpsql.toml if present)")
    g.add_argument("--ledger", metavar="PATH", default=d(None), help=f"budget ledger file (default: from config, $DPSQL_LEDGER, or ./{DEFAULT_LEDGER})")
    g.add_argument("--table", action="append", default=d([]), metavar="NAME=PATH", help="register a Parquet/CSV file as a table (repeatable)")
    g.add_argument("--privacy-unit", action="append", default=d([]), metavar="NAME=COLUMN", help="privacy unit column of a --table")
    g.add_argument("--max-groups", action="append", default=d([]), metavar="NAME=N", help="max groups per unit for a --table (default 1)")
    g.add_argument("--max-rows", action="append", default=d([]), metavar="NAME=K", help="max rows per (unit, group) for a --table (default 1)")
    g.add_argument("--bounds", action="append", default=d([]), metavar="NAME.COL=LO:HI", help="value bounds of a column (repeatable)")
    g.add_argument(
        "--debug", action="store_true", default=d(False),
        help="data owner only, UNSAFE: show DuckDB's scrubbed error messages; honoured when every table comes from "
        "--table, or when the config sets [engine] debug = true (see docs/threat_model.md)",
    )


def _query_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", nargs="?", help="one SELECT statement")
    p.add_argument("-f", "--file", metavar="FILE", help="read the SQL from a file")
    p.add_argument("--epsilon", required=True, type=float, help="privacy budget epsilon to spend")
    p.add_argument("--delta", type=float, default=0.0, help="privacy budget delta to spend (default 0)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="mechanism option, e.g. tau=10 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="dpsql",
        description="Differentially private SQL over Parquet files, with a durable budget ledger.",
        epilog=EXAMPLES["main"],
        formatter_class=fmt,
    )
    _common(parser)
    sub = parser.add_subparsers(dest="command", metavar="{init,query,explain,budget}")
    p = sub.add_parser("init", help="create a budget ledger with a total budget", epilog=EXAMPLES["init"], formatter_class=fmt)
    _common(p, sub=True)
    p.add_argument("--epsilon", required=True, type=float, help="total epsilon")
    p.add_argument("--delta", type=float, default=0.0, help="total delta (default 0)")
    p = sub.add_parser("query", help="run a differentially private query", epilog=EXAMPLES["query"], formatter_class=fmt)
    _common(p, sub=True)
    _query_args(p)
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table", help="output format")
    p.add_argument(
        "--workload",
        action="store_true",
        help="the SQL holds several range counts (separated by ';'): answer them together with DAWA, one charge",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write rows to FILE instead of stdout")
    p = sub.add_parser("explain", help="show mechanism, noise and bounded SQL (free)", epilog=EXAMPLES["explain"], formatter_class=fmt)
    _common(p, sub=True)
    _query_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p = sub.add_parser("budget", help="show the total, spent and remaining budget", epilog=EXAMPLES["budget"], formatter_class=fmt)
    _common(p, sub=True)
    p.add_argument("--history", action="store_true", help="list every ledger entry")
    p.add_argument("--set-total", nargs=2, metavar=("EPSILON", "DELTA"), help="change the total budget (recorded in the ledger)")
    p.add_argument("--reason", default="", help="reason recorded with --set-total")
    return parser


def _kv(items: list[str], what: str) -> dict[str, str]:
    from dpsql.errors import ConfigError

    out = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"{what} expects NAME=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _parse_option_value(v: str) -> Any:
    for conv in (int, float):
        try:
            return conv(v)
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
    if args.ledger:
        return str(args.ledger)
    if cfg.in_memory:
        raise ConfigError(
            f'config file {cfg.path!r} keeps its ledger in memory ([ledger] path = ":memory:"): the command line '
            "needs a ledger file, or every command would start from a fresh budget",
            hint='set [ledger] path = "ledger.duckdb" in the config',
        )
    if cfg.ledger_path is not None:
        return str(cfg.ledger_path)
    return os.environ.get("DPSQL_LEDGER", DEFAULT_LEDGER)


def _check_owner_config(args: argparse.Namespace) -> None:
    """A config that registers tables is the data owner's: its tables, their policy (tau, caps,
    bounds) and its ledger cannot be replaced from the command line, or an analyst could register
    the owner's file again under a policy of their own, or charge a fresh ledger of their own.
    (Such a config always names its ledger: ``dpsql.config.load_config`` refuses it otherwise.)
    """
    from dpsql.errors import ConfigError

    flags = [f for f, v in (("--table", args.table), ("--privacy-unit", args.privacy_unit), ("--max-groups", args.max_groups),
                            ("--max-rows", args.max_rows), ("--bounds", getattr(args, "bounds", None)), ("--ledger", args.ledger))
             if v]
    if flags:
        raise ConfigError(
            f"{', '.join(flags)} cannot be combined with a config that registers tables: the config's tables, their policy "
            "and its ledger belong to the data owner",
            hint="drop these flags to query the config's tables, or use --table without --config for files of your own",
        )


def _load_config(args: argparse.Namespace) -> Any:
    """The config of --config (or ./dpsql.toml when present), read by the same loader as
    ``Session.from_config``; an empty config when there is none."""
    from dpsql.config import DpsqlConfig, load_config

    path = args.config
    if path is None and os.path.exists("dpsql.toml"):
        path = "dpsql.toml"
    return DpsqlConfig() if path is None else load_config(path)


def _create_if_missing(args: argparse.Namespace, cfg: Any) -> bool:
    """A missing ledger is created only by `dpsql init` or `[ledger] create_if_missing = true`; the
    latter applies to the ledger the config names, not to a --ledger given on the command line."""
    return bool(cfg.create_if_missing and not args.ledger and cfg.ledger_path is not None)


def _open_session(args: argparse.Namespace) -> Any:
    import dpsql
    from dpsql.errors import ConfigError

    cfg = _load_config(args)
    s = dpsql.Session(ledger=_ledger_path(args, cfg), budget=cfg.budget, create=_create_if_missing(args, cfg),
                      engine=_engine_settings(args, cfg))
    try:
        for name, kwargs in cfg.tables.items():
            s.register(name, **kwargs)
        tables = _kv(args.table, "--table")
        units = _kv(args.privacy_unit, "--privacy-unit")
        groups = _kv(args.max_groups, "--max-groups")
        rows = _kv(args.max_rows, "--max-rows")
        bounds: dict[str, dict[str, Any]] = {}
        for k, v in _kv(args.bounds, "--bounds").items():
            t, _, c = k.partition(".")
            lo, _, hi = v.partition(":")
            try:
                bounds.setdefault(t, {})[c] = {"bounds": (float(lo), float(hi))}
            except ValueError:
                raise ConfigError(f"--bounds expects NAME.COL=LO:HI, got {k}={v}") from None
        for name in list(units) + list(groups) + list(rows) + list(bounds):
            if name not in tables:
                raise ConfigError(f"options name table '{name}' but no --table {name}=PATH was given")
        for name, path in tables.items():
            if name not in units:
                raise ConfigError(
                    f"--table {name} needs a privacy unit", hint=f"add --privacy-unit {name}=user_id"
                )
            s.register(
                name,
                path,
                privacy_unit=units[name],
                max_groups_per_unit=_cap(groups.get(name, "1")),
                max_rows_per_group=_cap(rows.get(name, "1")),
                columns=bounds.get(name),
            )
    except BaseException:
        s.close()
        raise
    return s


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


def _cap(v: str) -> float:
    from dpsql.errors import ConfigError

    if v.lower() in ("inf", "infinity", "unlimited"):
        return math.inf
    try:
        return float(v)
    except ValueError:
        raise ConfigError(
            f"--max-groups / --max-rows expect a whole number >= 1 or 'inf', got {v!r}",
            hint="e.g. --max-groups events=5",
        ) from None


def _read_sql(args: argparse.Namespace) -> str:
    from dpsql.errors import ConfigError

    if args.file and args.sql:
        raise ConfigError("give the SQL either as an argument or with -f, not both")
    if args.file:
        if not os.path.exists(args.file):
            raise ConfigError(f"SQL file {args.file!r} not found")
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    if not args.sql:
        raise ConfigError("no SQL given", hint='dpsql query "SELECT COUNT(*) FROM t" --epsilon 1')
    return str(args.sql)


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


def _format_table(tbl: Any) -> str:
    cols = tbl.column_names
    rows = [[("NULL" if v is None else str(v)) for v in r.values()] for r in tbl.to_pylist()]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    out = [" | ".join(c.ljust(w) for c, w in zip(cols, widths)), "-+-".join("-" * w for w in widths)]
    out += [" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(out) + "\n"


def _write_rows(tbl: Any, fmt: str, output: str | None) -> None:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt == "parquet":
        if not output:
            from dpsql.errors import ConfigError

            raise ConfigError("--format parquet needs -o FILE")
        pq.write_table(tbl, output)
        return
    if fmt == "csv":
        buf = io.BytesIO()
        pacsv.write_csv(tbl, buf)
        text = buf.getvalue().decode()
    elif fmt == "json":
        text = json.dumps(tbl.to_pylist(), default=str, indent=1) + "\n"
    else:
        text = _format_table(tbl)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def _cmd_init(args: argparse.Namespace) -> int:
    import dpsql
    from dpsql.ledger import Ledger

    path = _ledger_path(args, _load_config(args))
    if path.startswith(("postgresql://", "postgres://")):
        from dpsql.ledger._postgres import PostgresLedger, redact

        led: Ledger = PostgresLedger.create(path, dpsql.Budget(args.epsilon, args.delta))
        path = redact(path)
    else:
        led = Ledger.create(path, dpsql.Budget(args.epsilon, args.delta))
    led.close()
    print(f"created ledger {path} with total budget epsilon={args.epsilon:g} delta={args.delta:g}", file=sys.stderr)
    return 0


def _check_output(args: argparse.Namespace) -> None:
    """Refuse a bad --format/-o before the query spends any budget."""
    from dpsql.errors import ConfigError

    if args.format == "parquet" and not args.output:
        raise ConfigError("--format parquet needs -o FILE", hint="add -o result.parquet")
    if args.output:
        out = os.path.abspath(args.output)
        parent = os.path.dirname(out)
        if os.path.isdir(out):
            raise ConfigError(f"-o {args.output!r} is a directory", hint="give a file name, e.g. -o result.csv")
        if not os.path.isdir(parent):
            raise ConfigError(f"cannot write {args.output!r}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK) or (os.path.exists(out) and not os.access(out, os.W_OK)):
            raise ConfigError(f"cannot write {args.output!r}: permission denied")


def _split_statements(sql: str) -> list[str]:
    """The statements of a ';'-separated workload, each as its own SQL text."""
    from dpsql.plan.parse import parse_statements

    return [st.sql(dialect="duckdb", comments=False) for st in parse_statements(sql)]


def _cmd_query(args: argparse.Namespace) -> int:
    sql = _read_sql(args)
    if args.command == "query":
        _check_output(args)
    opts = {k: _parse_option_value(v) for k, v in _kv(args.option, "--option").items()} or None
    with _open_session(args) as s:
        if args.command == "explain":
            plan = s.explain(sql, epsilon=args.epsilon, delta=args.delta, options=opts)
            if args.json:
                print(json.dumps(plan.to_dict(), indent=1, default=str))
            else:
                print(plan)
            return 0
        with _Progress():
            if getattr(args, "workload", False):
                rel = s.query_many(_split_statements(sql), epsilon=args.epsilon, delta=args.delta, options=opts)
            else:
                rel = s.query(sql, epsilon=args.epsilon, delta=args.delta, options=opts)
        _write_rows(rel.table, args.format, args.output)
        rem = s.remaining()
        print(
            f"mechanism: {rel.mechanism}; cost: epsilon={rel.cost.epsilon:g} delta={rel.cost.delta:g}; "
            f"remaining: epsilon={rem.epsilon:g} delta={rem.delta:g}; ledger entry {rel.ledger_id}",
            file=sys.stderr,
        )
        for col, acc in rel.accuracy.items():
            if acc.get("noise_std") is not None:
                print(f"  {col}: noise std {acc['noise_std']:.4g}, 95% interval +/- {acc['ci95_half_width']:.4g}", file=sys.stderr)
    return 0


def _cmd_budget(args: argparse.Namespace) -> int:
    import dpsql
    from dpsql.errors import ConfigError
    from dpsql.ledger import Ledger

    cfg = _load_config(args)
    path = _ledger_path(args, cfg)
    # --set-total changes the recorded total: open by the ledger's own total, not the config's
    opener = Ledger.open
    if path.startswith(("postgresql://", "postgres://")):
        from dpsql.ledger._postgres import PostgresLedger

        opener = PostgresLedger.open
    with opener(path, None if args.set_total else cfg.budget,
                     create=not args.set_total and _create_if_missing(args, cfg)) as led:
        if args.set_total:
            try:
                eps, delta = float(args.set_total[0]), float(args.set_total[1])
            except ValueError:
                raise ConfigError(
                    f"--set-total expects two numbers EPSILON DELTA, got {' '.join(args.set_total)!r}",
                    hint="e.g. --set-total 10 1e-5",
                ) from None
            led.set_total(dpsql.Budget(eps, delta), reason=args.reason or "set via CLI")
        t, sp, r = led.total(), led.spent(), led.remaining()
        print(f"ledger:    {path}")
        print(f"total:     epsilon={t.epsilon:g} delta={t.delta:g}")
        print(f"spent:     epsilon={sp.epsilon:g} delta={sp.delta:g}")
        print(f"remaining: epsilon={r.epsilon:g} delta={r.delta:g}")
        if args.history:
            h = led.history()
            keep = [
                c
                for c in h.column_names
                if c in ("entry_id", "created_at", "status", "mechanism", "epsilon", "delta", "query")
            ]
            sys.stdout.write(_format_table(h.select(keep)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from dpsql.errors import DPSQLError, ExecutionError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        if args.command == "init":
            return _cmd_init(args)
        if args.command in ("query", "explain"):
            return _cmd_query(args)
        return _cmd_budget(args)
    except DPSQLError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        if getattr(args, "debug_on", False) and isinstance(e, ExecutionError) and e.debug_detail:
            print(f"debug: {e.debug_detail}", file=sys.stderr)
        return int(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 1
    except Exception as e:  # pragma: no cover - unexpected
        print(f"error: unexpected {type(e).__name__}", file=sys.stderr)
        if getattr(args, "debug_on", False):
            raise
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
