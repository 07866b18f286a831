"""Session: a thin linear pipeline over the catalog, the execution backend, the ledger and the noise.

    analyse -> route (mechanism + calibration + reason)      dpsql.plan, dpsql.mechanisms.registry
    -> bind check (bounded SQL and post-processing typed)   [public metadata only: free]
    -> reserve (durable charge)                             dpsql.ledger
    -> execute the bounded relation -> Arrow                dpsql.engine
    -> release (noise, thresholds, rounding)                the routed mechanism
    -> post-process (outputs, HAVING, ORDER BY, LIMIT)      dpsql.postprocess
    -> commit (durable) -> Release
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import secrets
import tomllib
import warnings
from typing import Any

import duckdb
import pyarrow as pa

from dpsql import postprocess
from dpsql.budget import Budget, check_delta, check_epsilon
from dpsql.catalog import (
    TableSpec,
    _check_cap,
    check_table_name,
    classify_source,
    parse_column_spec,
    source_files,
)
from dpsql.catalog import type_domains as _type_domains
from dpsql.charge import FAILURE_REASON, charged
from dpsql.engine import Engine, EngineSettings
from dpsql.errors import ConfigError
from dpsql.ledger import Ledger
from dpsql.mechanisms.base import Description
from dpsql.mechanisms.registry import Route, route, route_workload
from dpsql.noise import NoiseSource, default_noise_source
from dpsql.options import LARGE_EPSILON, OPTIONS, check_options
from dpsql.release import Plan, Release, WorkloadRelease
from dpsql.rewrite.bound import SALT_PLACEHOLDER
from dpsql.rewrite.render import render

__all__ = ["FAILURE_REASON", "OPTIONS", "Session"]


class Session:
    """A differentially private query session over registered tables.

    ``ledger``: path of the budget ledger file, or ``None`` for an in-memory ledger (notebooks
    and tests only: it forgets everything on exit). A missing ledger file is a LedgerError unless
    ``create=True`` (then it is created with ``budget``); ``dpsql init`` also creates one.
    ``budget``: the total budget. An existing ledger keeps its recorded total; passing a
    different one is a ConfigError (change it with ``dpsql budget --set-total``).
    ``connection``: an optional DuckDB connection whose tables can be registered by name.
    ``engine``: the data owner's engine settings (``EngineSettings`` or a dict: memory_limit,
    threads, statement_timeout, min_response_time, max_temp_directory_size, debug).
    ``debug``: attach DuckDB's scrubbed messages to errors. UNSAFE, for the data owner only
    (docs/threat_model.md). Neither can be changed by query options.
    """

    def __init__(
        self,
        ledger: str | os.PathLike[str] | None = None,
        budget: Budget | None = None,
        *,
        connection: duckdb.DuckDBPyConnection | None = None,
        lock_timeout: float = 10.0,
        debug: bool = False,
        engine: EngineSettings | dict[str, Any] | None = None,
        create: bool = False,
    ) -> None:
        settings = EngineSettings.from_dict(engine)
        if not isinstance(debug, bool):
            raise ConfigError(f"debug must be True or False, got {debug!r}")
        if debug:
            settings = dataclasses.replace(settings, debug=True)
        if budget is not None and not isinstance(budget, Budget):
            raise ConfigError("budget must be a dpsql.Budget(epsilon, delta)", hint="budget=dpsql.Budget(1.0, 1e-6)")
        path = os.fspath(ledger) if ledger is not None else None
        if path is None:
            if budget is None:
                raise ConfigError(
                    "an in-memory ledger needs a total budget",
                    hint="Session(ledger=None, budget=dpsql.Budget(1.0, 1e-6)), or pass a ledger file path",
                )
            self._ledger = Ledger.create(None, budget)
        else:
            self._ledger = Ledger.open(path, budget, create=create, lock_timeout=lock_timeout)
        self._engine = Engine(connection, settings)
        self._has_connection = connection is not None
        self._catalog: dict[str, TableSpec] = {}
        self._noise: NoiseSource = default_noise_source()
        self._token = secrets.token_hex(4)  # keeps this Session's views apart from others'
        self._closed = False

    # -- construction from a config file ------------------------------------------------------
    @classmethod
    def from_config(cls, path: str | os.PathLike[str] = "dpsql.toml") -> Session:
        """Build a Session from a TOML file: ``[ledger]`` (path, epsilon, delta, create_if_missing)
        and ``[tables.NAME]``."""
        p = os.fspath(path)
        if not os.path.exists(p):
            raise ConfigError(f"config file {p!r} not found", hint="create dpsql.toml (see README) or pass its path")
        try:
            with open(p, "rb") as f:
                cfg = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p!r} is not valid TOML: {e}") from None
        base = os.path.dirname(os.path.abspath(p))
        led = cfg.get("ledger", {})
        if not isinstance(led, dict):
            raise ConfigError("[ledger] in the config must be a table")
        lpath = led.get("path")
        if lpath is not None and not os.path.isabs(lpath):
            lpath = os.path.join(base, lpath)
        budget = None
        if "epsilon" in led:
            budget = Budget(led["epsilon"], led.get("delta", 0.0))
        create = led.get("create_if_missing", False)
        if not isinstance(create, bool):
            raise ConfigError(f"[ledger] create_if_missing must be true or false, got {create!r}")
        s = cls(ledger=lpath, budget=budget, engine=cfg.get("engine"), create=create)
        tables = cfg.get("tables", {})
        if not isinstance(tables, dict):
            raise ConfigError("[tables] in the config must be a table of tables")
        try:
            for name, spec in tables.items():
                s.register_from_dict(name, spec, base_dir=base)
        except Exception:
            s.close()
            raise
        return s

    def register_from_dict(self, name: str, spec: dict[str, Any], *, base_dir: str = ".") -> None:
        if not isinstance(spec, dict) or "source" not in spec:
            raise ConfigError(f"table '{name}' in the config needs a source", hint=f"[tables.{name}] source = 'data.parquet'")
        spec = dict(spec)
        src = spec.pop("source")
        if isinstance(src, str) and not os.path.isabs(src) and not os.path.exists(src):
            cand = os.path.join(base_dir, src)
            if os.path.exists(cand) or any(ch in src for ch in "*?["):
                src = cand
        allowed = {"privacy_unit", "max_groups_per_unit", "max_rows_per_group", "max_rows_per_unit", "columns", "references", "tau",
                   "version"}
        unknown = set(spec) - allowed
        if unknown:
            raise ConfigError(f"unknown key(s) {sorted(unknown)} for table '{name}'", hint=f"allowed: {sorted(allowed)}")
        self.register(name, src, **spec)

    # -- catalog ----------------------------------------------------------------------------
    def register(
        self,
        name: str,
        source: Any,
        *,
        privacy_unit: str | None = None,
        max_groups_per_unit: float = 1,
        max_rows_per_group: float = 1,
        max_rows_per_unit: float | None = None,
        columns: dict[str, dict[str, Any]] | None = None,
        references: dict[str, str] | None = None,
        tau: int = 1,
        version: str | None = None,
    ) -> None:
        """Register a private table. Reads only its schema (public), never its rows.

        ``version``: an owner-declared label of the source's contents (e.g. a snapshot date). A
        stored DAWA synopsis is reused only for the same version; without one, file sources are
        identified by each file's identity and modification time, and Arrow or DuckDB-table
        sources are never answered from a stored synopsis.
        """
        self._check_open()
        tname = check_table_name(name)
        kind, src = classify_source(source, has_connection=self._has_connection)
        caps_g = _check_cap(max_groups_per_unit, "max_groups_per_unit", tname)
        caps_r = _check_cap(max_rows_per_group, "max_rows_per_group", tname)
        caps_u = _check_cap(max_rows_per_unit, "max_rows_per_unit", tname) if max_rows_per_unit is not None else None
        if version is not None and (not isinstance(version, str) or not version):
            raise ConfigError(f"version for table '{tname}' must be a non-empty string, got {version!r}",
                              hint="e.g. register(..., version='2026-11-30')")
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ConfigError(f"tau for table '{tname}' must be a whole number >= 1, got {tau!r}")
        col_specs = {}
        types: dict[str, str] = {}
        for cname, cspec in (columns or {}).items():
            if isinstance(cspec, dict) and "type" in cspec:  # a CSV column's declared type
                cspec = dict(cspec)
                types[cname.lower()] = cspec.pop("type")
            col_specs[cname.lower()] = parse_column_spec(tname, cname, cspec)
        refs = {}
        for fk, target in (references or {}).items():
            if not isinstance(target, str) or target.count(".") != 1:
                raise ConfigError(
                    f"reference for '{tname}.{fk}' must be 'table.column', got {target!r}",
                    hint="references={'customer_id': 'customers.id'}",
                )
            refs[fk.lower()] = target.lower()
        if privacy_unit is None and not refs:
            raise ConfigError(
                f"table '{tname}' needs a privacy unit: the column that identifies a person, or a foreign key path to one",
                hint=f"register('{tname}', ..., privacy_unit='user_id') or references={{'user_id': 'users.id'}}",
            )
        if tname in self._catalog:
            old = self._catalog.pop(tname)
            self._engine.unregister_source(tname, old.source_kind, old.view)
        view = f"_dpsql_src_{tname}_{self._token}"
        files = source_files(kind, src)
        schema = self._engine.register_source(tname, kind, src, view, types=types)
        problems = []
        if privacy_unit is not None and privacy_unit.lower() not in schema:
            problems.append(f"privacy unit column '{privacy_unit}' does not exist")
        for c in col_specs:
            if c not in schema:
                problems.append(f"declared column '{c}' does not exist")
        for fk in refs:
            if fk not in schema:
                problems.append(f"foreign key column '{fk}' does not exist")
        if problems:
            self._engine.unregister_source(tname, kind, view)
            raise ConfigError(
                f"table '{tname}': " + "; ".join(problems),
                hint=f"its columns are: {', '.join(sorted(schema))}",
            )
        try:
            col_specs = _type_domains(tname, col_specs, schema)
        except ConfigError:
            self._engine.unregister_source(tname, kind, view)
            raise
        self._catalog[tname] = TableSpec(
            name=tname,
            source=src if kind != "arrow" else "<arrow table>",
            source_kind=kind,
            privacy_unit=privacy_unit.lower() if privacy_unit else None,
            max_groups_per_unit=caps_g,
            max_rows_per_group=caps_r,
            max_rows_per_unit=caps_u,
            columns=col_specs,
            references=refs,
            tau=tau,
            schema=schema,
            view=view,
            version=version,
            files=files,
            read_key=json.dumps({"schema": schema, "max_text_bytes": self._engine.settings.max_text_bytes,
                                 "invalid_text": self._engine.settings.invalid_text}, sort_keys=True),
        )

    @property
    def tables(self) -> dict[str, TableSpec]:
        """Copies of the registered tables' public metadata: changing one (e.g. its caps) changes
        nothing in the Session; policy changes only through ``register``."""
        return {name: copy.deepcopy(spec) for name, spec in self._catalog.items()}

    # -- budget ---------------------------------------------------------------------------------
    def remaining(self) -> Budget:
        self._check_open()
        return self._ledger.remaining()

    def total(self) -> Budget:
        return self._ledger.total()

    def history(self) -> pa.Table:
        self._check_open()
        return self._ledger.history()

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    # -- the pipeline: analyse -> route -> bind check -> reserve -> execute -> release -> post-process -> commit
    def _route(self, sql: Any, epsilon: Any, delta: Any, options: dict[str, Any] | None, *, many: bool = False) -> Route:
        """Analyse and route: public metadata only, so every refusal here is free."""
        self._check_open()
        eps, d, opts = check_epsilon(epsilon), check_delta(delta), check_options(options)
        if eps > LARGE_EPSILON:
            warnings.warn(f"epsilon={eps:g} is unusually large: the release gives little privacy", stacklevel=3)
        find = self._ledger.find_synopsis
        try:
            if many:
                return route_workload(sql, eps, d, opts, self._catalog, find)
            return route(sql, eps, d, opts, self._catalog, find)
        except OverflowError:
            raise ConfigError(
                f"epsilon={eps:g} and delta={d:g} give noise parameters that cannot be represented",
                hint="use an epsilon between about 1e-6 and 100",
            ) from None

    def _bind_check(self, r: Route) -> None:
        """Type-check the bounded query and the post-processing, reading no row."""
        ast = r.mechanism.bounded(r.calibration, SALT_PLACEHOLDER)
        key_types = dict(self._engine.describe(ast)) if ast is not None else {}
        if r.request.plan is not None:
            postprocess.check(self._engine, r.request.plan, key_types, r.mechanism.released_types(r.calibration),
                              r.mechanism.key_domain(r.calibration))

    def explain(self, sql: str | list[str], *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None) -> Plan:
        """What ``query`` (or, given a list of SQL, ``query_many``) would do: mechanism, noise,
        thresholds, bounded SQL. Free; reads no rows."""
        r = self._route(sql, epsilon, delta, options, many=isinstance(sql, (list, tuple)))
        self._bind_check(r)  # refuses exactly what query refuses before its charge
        d = r.description
        ast = r.mechanism.bounded(r.calibration, SALT_PLACEHOLDER)
        return Plan(sql=r.request.text, mechanism=d.label, reason=r.reason, cost=d.cost, parameters=dict(d.parameters),
                    bounded_sql=render(ast, pretty=True) if ast is not None else "", notes=list(d.notes))

    def query(self, sql: str, *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None) -> Release:
        """Answer ``sql`` with differential privacy, charging (epsilon, delta) to the ledger.

        A range count or a histogram over a column with a declared ordered domain is answered
        for free when a stored DAWA synopsis covers it (same table, column(s), WHERE, cap);
        a histogram over such a column is otherwise answered by DAWA.
        """
        return self._run(self._route(sql, epsilon, delta, options))

    def query_many(
        self, sqls: list[str], *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None
    ) -> WorkloadRelease:
        """Answer a workload of range counts over one table with DAWA, with one charge.

        Each SQL is ``SELECT COUNT(*) FROM t WHERE <same other conditions> AND <range>`` over a
        column (or two) with a declared ordered domain. DAWA is pure epsilon-DP: delta is not
        spent. If a stored synopsis already covers the workload, it is answered for free.
        """
        return self._run(self._route(sqls, epsilon, delta, options, many=True))  # type: ignore[return-value]

    def _run(self, r: Route) -> Release:
        self._bind_check(r)
        req, desc, mech = r.request, r.description, r.mechanism
        table: pa.Table = pa.table({})
        accuracy: dict[str, dict[str, Any]] = {}
        if desc.reuse_of is not None:  # post-processing of a stored release: costs nothing, recorded once answered
            released = mech.release(r.calibration, None, self._noise)
            if req.plan is not None and not released.final:
                table, accuracy = postprocess.apply(self._engine, req.plan, released)
            entry = self._ledger.record_reuse(source_entry_id=desc.reuse_of, query=req.text, tables=req.tables,
                                              params=desc.parameters)
        else:
            entry = self._ledger.reserve(desc.cost, mechanism=desc.label, query=req.text, tables=req.tables,
                                         params=desc.parameters)
            with charged(self._ledger, self._engine, entry, "the query" if req.plan is not None else "the range workload"):
                ast = mech.bounded(r.calibration, self._noise.salt())
                rows = self._engine.fetch_arrow(ast) if ast is not None else None
                released = mech.release(r.calibration, rows, self._noise)
                if req.plan is not None and not released.final:
                    table, accuracy = postprocess.apply(self._engine, req.plan, released)
            self._ledger.commit(entry, **released.commit)
        if released.final or req.plan is None:
            return WorkloadRelease(table=released.table, cost=desc.cost, mechanism=desc.label, accuracy=released.accuracy,
                                   ledger_id=entry, reused=desc.reuse_of is not None, details=_details(desc))
        return Release(table=table, cost=desc.cost, mechanism=desc.label, accuracy=accuracy, ledger_id=entry,
                       reused=desc.reuse_of is not None, details=_details(desc))

    # -- lifecycle ----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this Session is closed", hint="open a new dpsql.Session")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._engine.close()
            self._ledger.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _details(desc: Description) -> dict[str, Any]:
    return {k: v for k, v in desc.parameters.items() if k != "scales"}
