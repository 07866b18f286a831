"""Session: a thin linear pipeline over the catalog, the execution backend, the ledger and the noise.

    analyse -> route (mechanism + calibration + reason)      dpsql.plan, dpsql.mechanisms.registry
    -> bind check (bounded SQL and post-processing typed)   [public metadata and public tables only: free; remembered]
    -> reserve (durable charge)                             dpsql.ledger
    -> execute the bounded relation -> Arrow                dpsql.engine
    -> release (noise, thresholds, rounding)                the routed mechanism
    -> post-process (outputs, HAVING, ORDER BY, LIMIT)      dpsql.postprocess
    -> commit (durable) -> Release
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import duckdb
import pyarrow as pa

import dpsql.engine as backends
from dpsql import _public_keys, groupings, postprocess
from dpsql._session_object import SessionObject
from dpsql.budget import Budget, check_delta, check_epsilon
from dpsql.catalog import CatalogLock, TableSpec, check_sources_unchanged, register_table
from dpsql.charge import FAILURE_REASON, charged, keeps_answer, record_release, reserve
from dpsql.config import distinct_tables, load_config, table_kwargs
from dpsql.engine import EngineSettings, ExecutionBackend, make_backend
from dpsql.errors import ConfigError
from dpsql.ledger import Ledger, check_reachable, open_ledger
from dpsql.mechanisms.registry import Route, route, route_profile, route_workload
from dpsql.noise import NoiseSource, default_noise_source
from dpsql.options import OPTIONS, check_options, warn_if_large
from dpsql.release import Plan, Release, WorkloadRelease
from dpsql.rewrite.bound import SALT_PLACEHOLDER

__all__ = ["FAILURE_REASON", "OPTIONS", "Session"]


class Session(SessionObject):
    """A differentially private query session over registered tables.

    ``ledger``: the ledger file, or ``None`` for an in-memory ledger (notebooks and tests only). A
    missing file is a LedgerError unless ``create=True`` (it is then created with ``budget``).
    ``budget``: the total; an existing ledger keeps its own (``dpsql budget --set-total`` changes it).
    ``tables``: name -> ``register`` arguments, registered before the ledger is opened.
    ``connection``: an optional DuckDB connection whose tables can be registered by name.
    ``engine``: the owner's engine settings (``EngineSettings``, a dict), or ``"duckdb"`` / ``"spark"``;
    ``spark``: the caller's SparkSession for the Spark engine (default: one on ``master``; docs/spark.md).
    ``debug``: attach DuckDB's scrubbed messages to errors. UNSAFE, for the data owner only
    (docs/threat_model.md). Neither can be changed by query options.
    """

    def __init__(
        self, ledger: str | os.PathLike[str] | None = None, budget: Budget | None = None, *,
        connection: duckdb.DuckDBPyConnection | None = None, lock_timeout: float = 10.0, debug: bool = False,
        engine: str | EngineSettings | dict[str, Any] | None = None, create: bool = False,
        tables: Mapping[str, Mapping[str, Any]] | None = None, spark: Any = None,
    ) -> None:
        settings = EngineSettings.from_dict({"kind": engine} if isinstance(engine, str) else engine)
        if not isinstance(debug, bool):
            raise ConfigError(f"debug must be True or False, got {debug!r}")
        settings = dataclasses.replace(settings, debug=True) if debug else settings
        check_reachable(ledger, settings.kind, lock_timeout=lock_timeout)  # before a slow engine starts (Spark)
        self._engine: ExecutionBackend = make_backend(settings, connection, spark)
        self._has_connection = connection is not None
        self._catalog: dict[str, TableSpec] = {}
        self._noise: NoiseSource = default_noise_source()
        self._token = secrets.token_hex(4)  # keeps this Session's views apart from others'
        self._catalog_lock = CatalogLock()  # a registration waits for the requests in flight in other threads
        self._closed = False
        self._catalog_version, self._bound_ok, self._keys_ok = 0, dict[tuple[Any, ...], Any](), dict[Any, Any]()  # bind checks and public keys passed
        try:  # ``tables`` are registered before the ledger is opened: a bad table never creates a ledger
            for name, kwargs in distinct_tables(tables).items():
                self.register(name, **kwargs)
            self._ledger = open_ledger(ledger, budget, create=create, lock_timeout=lock_timeout)
        except BaseException:
            self._closed = True
            self._engine.close()
            raise

    @classmethod
    def from_config(cls, path: str | os.PathLike[str] = "dpsql.toml") -> Session:
        """Build a Session from a TOML file (``[ledger]``, ``[engine]``, ``[tables.NAME]``): the CLI's loader."""
        cfg = load_config(path)
        with cfg.naming_tables():  # a refused [tables.NAME] setting names the file
            return cls(ledger=cfg.session_ledger(), budget=cfg.budget, engine=cfg.engine, create=cfg.create_if_missing,
                       tables=cfg.tables, lock_timeout=cfg.lock_timeout)

    def register_from_dict(self, name: str, spec: dict[str, Any], *, base_dir: str = ".") -> None:
        """Register a ``[tables.NAME]``-style dict (relative sources resolved against ``base_dir``)."""
        self.register(name, **table_kwargs(name, spec, os.path.abspath(base_dir)))

    # -- catalog ----------------------------------------------------------------------------
    def register(
        self,
        name: str, source: Any, *,
        privacy_unit: str | None = None, max_groups_per_unit: float = 1, max_rows_per_group: float = 1,
        max_rows_per_unit: float | None = None, columns: Mapping[str, dict[str, Any]] | None = None,
        references: Mapping[str, str] | None = None, tau: int = 1,
        version: str | None = None, max_table_rows: int | None = None,
        public: bool = False, degree_bounds: Mapping[str, int] | None = None, allow_conditional_sampling: bool = False,
    ) -> None:
        """Register a private table; reads only its schema, never its rows (``dpsql.catalog.register_table``:
        the meaning of every argument; ``version`` labels the contents for synopsis reuse)."""
        with self._catalog_lock.writing():  # it replaces the table's view: never under a request planned on it
            self._check_open()  # inside: a close by another thread comes before or after it
            self._catalog_version += 1
            register_table(
                self._catalog, name, source,
                register_source=self._engine.register_source, unregister_source=self._engine.unregister_source,
                view_suffix=self._token, has_connection=self._has_connection,
                read_settings=self._engine.settings.read_settings(),
                privacy_unit=privacy_unit, max_groups_per_unit=max_groups_per_unit, max_rows_per_group=max_rows_per_group,
                max_rows_per_unit=max_rows_per_unit, columns=columns, references=references, tau=tau, version=version,
                max_table_rows=max_table_rows, public=public, degree_bounds=degree_bounds, allow_conditional_sampling=allow_conditional_sampling,
            )

    @property
    def tables(self) -> Mapping[str, TableSpec]:
        """Read-only view of the registered tables' frozen public metadata (policy changes: register again)."""
        return MappingProxyType(self._catalog)

    def remaining(self) -> Budget:
        self._check_open()
        return self._ledger.remaining()

    def total(self) -> Budget:
        self._check_open()
        return self._ledger.total()

    def history(self) -> pa.Table:
        self._check_open()
        return self._ledger.history()

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    def _route(self, sql: Any, epsilon: Any, delta: Any, options: dict[str, Any] | None, *, many: bool = False) -> Route:
        """Analyse and route: public metadata only, so every refusal here is free."""
        self._check_open()
        eps, d, opts = check_epsilon(epsilon), check_delta(delta), check_options(options)
        warn_if_large(eps, d)
        try:
            return (route_workload if many else route)(sql, eps, d, opts, self._catalog, self._ledger.find_synopsis)
        except OverflowError:
            raise ConfigError(f"epsilon={eps:g} and delta={d:g} give noise parameters that cannot be represented",
                              hint="use an epsilon between about 1e-6 and 100") from None

    def _bind_check(self, r: Route, salt: str | None = SALT_PLACEHOLDER, *, alone: bool = True, no_row: list[Any] | None = None) -> Any:
        """Type-check the bounded query and post-processing, reading no private row (a pass is remembered); return the
        bounded query built once under ``salt`` for the check and the caller (None: built only to check, not returned).
        ``no_row``: one of several queries, whose refusal for having no row whatever the data is put there, not raised."""
        check_sources_unchanged(self._catalog, r.request.tables, self._engine)  # never remembered (nor the connection)
        _public_keys.check(r.request.plan, self._catalog, backends.PublicReads(self._engine, self._catalog), self._keys_ok)
        key = (r.bind_key(), self._catalog_version, os.getpid(), self._engine.ops, getattr(self._engine, "read_bound", None))  # a fork, other ops or memory limit: checked anew
        ast = None if salt is None else backends.bounded_under(self._engine, r, salt, key, self._bound_ok)
        if key not in self._bound_ok:
            ast = r.bounded(SALT_PLACEHOLDER, self._engine.ops) if salt is None else ast
            getattr(r.mechanism, "check_public", lambda *_: None)(r.calibration, backends.PublicReads(self._engine, self._catalog))
            key_types = backends.describe_bounded(self._engine, ast)  # every query of a batch is bound
            if r.request.plan is not None:
                postprocess.check(self._engine, r.request.plan, key_types, r.mechanism.released_types(r.calibration),
                                  backends.public_key_domain(r, self._engine, self._catalog), no_row=no_row)
            backends.remember_bind_check(self._bound_ok, key) if not no_row else None  # (alone, it is refused)
        postprocess.refuse_no_row(self._engine, r, backends.PublicReads(self._engine, self._catalog)) if alone else None
        return ast

    def explain(self, sql: str | list[str] | tuple[str, ...], *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None) -> Plan:
        """What ``query`` (``query_many`` for a list of SQL) would do: mechanism, noise, thresholds, bounded SQL; free."""
        if (g := groupings.split(sql, self._catalog)) is not None:  # several groupings: one GROUP BY query per grouping
            return groupings.explain(self, g, epsilon, delta, options)
        with self._catalog_lock.reading():
            r = self._route(sql, epsilon, delta, options, many=isinstance(sql, (list, tuple)))
            ast = self._bind_check(r)  # refuses exactly what query refuses before its charge
        d, left = r.description, self._ledger.remaining()
        over = [] if d.cost.fits_in(left) else [f"this costs more than the remaining budget ({left}): query would refuse it"]
        return Plan(sql=r.request.text, mechanism=d.label, reason=r.reason, cost=d.cost, parameters=dict(d.parameters),
                    bounded_sql=backends.render_bounded(self._engine, ast), notes=[*d.notes, *over])

    @keeps_answer  # (and around ``_run``'s: Ctrl-C as the answer is returned keeps it too)
    def query(self, sql: str, *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None) -> Release:
        """Answer ``sql`` with differential privacy, charging (epsilon, delta) to the ledger; the routing
        rules (which mechanism, when a stored synopsis answers for free) are in ``dpsql.mechanisms.registry``."""
        g = groupings.split(sql, self._catalog)  # ROLLUP, CUBE, GROUPING SETS: one GROUP BY query per grouping, one charge
        with self._catalog_lock.reading():  # from the analysis to the last read of private rows
            return groupings.run(self, g, epsilon, delta, options) if g else self._run(self._route(sql, epsilon, delta, options))

    @keeps_answer
    def query_many(
        self, sqls: list[str] | tuple[str, ...], *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None
    ) -> WorkloadRelease:
        """Answer range counts ``SELECT COUNT(*) FROM t WHERE <same other conditions> AND <range>`` over one or
        two ordered columns with DAWA, one charge (pure epsilon-DP), or free from a stored synopsis."""
        with self._catalog_lock.reading():
            return self._run(self._route(sqls, epsilon, delta, options, many=True))  # type: ignore[return-value]

    @keeps_answer
    def suggest_caps(self, table: str, *, epsilon: Any, group_by: str | None = None, quantile: float = 0.9) -> Release:
        """Charged caps advice (``dpsql.mechanisms.profile``): noisy per-person contribution histograms."""
        with self._catalog_lock.reading():
            self._check_open()  # closed meanwhile (by another thread): said so, not a failed bind check
            return self._run(route_profile(table, check_epsilon(epsilon), {"group_by": group_by, "quantile": quantile},
                                           self._catalog))

    @keeps_answer  # Ctrl-C held back while the release was recorded: raised with the answer (``e.release``)
    def _run(self, r: Route) -> Release:
        req, desc, clip = r.request, r.description, bool(r.request.options.get("clip_negative", False))
        ast = self._bind_check(r, None if desc.reuse_of is not None else self._noise.salt())  # the secret salt: never shown
        table, accuracy, warnings = pa.table({}), dict[str, dict[str, Any]](), list[str]()
        if desc.reuse_of is not None:  # post-processing of a stored release: costs nothing, recorded once answered
            released = r.release(None, self._noise)
            if req.plan is not None and not released.final:
                table, accuracy, warnings = postprocess.apply(self._engine, req.plan, released, nonnegative=clip, estimates=desc.parameters.get("estimates"))
            entry = self._ledger.record_reuse(source_entry_id=desc.reuse_of, query=req.text, tables=req.tables,
                                              params=desc.parameters)
        else:
            entry = reserve(self._ledger, desc.cost, mechanism=desc.label, query=req.text, tables=req.tables,
                            params=desc.parameters)
            with charged(self._ledger, self._engine, entry, "the query" if req.plan is not None else "the range workload" if req.workload is not None else "the caps advice"):
                rows = backends.fetch_bounded(self._engine, ast)  # a list of tables for a batch
                released = r.release(rows, self._noise)
                if req.plan is not None and not released.final:
                    table, accuracy, warnings = postprocess.apply(self._engine, req.plan, released, nonnegative=clip, estimates=desc.parameters.get("estimates"))
        if released.final or req.plan is None:  # a workload: one count per query
            rows = postprocess.clip_negative(released.table, ["count"]) if clip else released.table
            out: Release = WorkloadRelease(rows, desc.cost, desc.label, released.accuracy, entry, desc.reuse_of is not None,
                                           {**desc.details, **released.details}, list(desc.notes))
        else:
            out = Release(table, desc.cost, desc.label, accuracy, entry, desc.reuse_of is not None, {**desc.details, **released.details}, list(desc.notes), warnings)
        if desc.reuse_of is None:  # built first: Ctrl-C once the release is recorded is raised with it (keeps_answer)
            record_release(self._ledger, entry, released.commit, out)
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this Session is closed", hint="open a new dpsql.Session")

    def close(self) -> None:
        with self._catalog_lock.writing():  # requests in flight in other threads finish first (else: charged, failed)
            if not self._closed:
                self._closed = True
                self._engine.close()
                self._ledger.close()
