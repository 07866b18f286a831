"""Session: the one orchestrator (catalog, DuckDB connection, ledger, noise source).

Data flow (one way):  SQL -> analyze -> route -> calibrate   [public metadata only: free]
                      -> ledger.reserve (durable) -> bounded SQL -> DuckDB -> Arrow
                      -> mechanism.release (noise, thresholds, rounding) -> post-processing
                      -> ledger.commit (durable) -> Release
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import secrets
import time
import warnings
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import duckdb
import pyarrow as pa
from sqlglot import exp

from dpsql.budget import Budget, check_delta, check_epsilon
from dpsql.catalog import TableSpec, register_table
from dpsql.config import load_config, table_kwargs
from dpsql.engine import Engine, EngineSettings, private_failure, scrub
from dpsql.errors import ConfigError, DPSQLError, ExecutionError, LedgerError, PolicyError, QueryTypeError
from dpsql.ledger import Ledger
from dpsql.mechanisms.common import Calibration
from dpsql.noise import NoiseSource, default_noise_source
from dpsql.plan import ir, workload
from dpsql.plan.analyze import analyze, resolve_unit_column
from dpsql.release import Plan, Release, WorkloadRelease
from dpsql.rewrite.bound import SALT_PLACEHOLDER, Caps, bounded_query
from dpsql.rewrite.render import render

#: documented per-query options (``Session.query(..., options={...})``)
OPTIONS: dict[str, str] = {
    "mechanism": "force a mechanism: 'gaussian', 'laplace', 'sparse_histogram' (default: chosen automatically)",
    "tau": "sparse histogram: suppress groups with fewer than tau distinct units (default and floor: the table's registered tau)",
    "tau_star": "sparse histogram: fix the noisy release threshold (accepted only if the exact delta fits)",
    "sigma": "sparse histogram: fix the count noise std (accepted only if the exact delta fits)",
    "epsilon_split": "DAWA: share of epsilon for the private partition (default 0.25)",
    "max_groups_per_unit": "lower the table's cap on groups per privacy unit for this query (never above the registered cap)",
    "max_rows_per_group": "lower the table's cap on rows per unit and group for this query (never above the registered cap)",
    "max_rows_per_unit": "DAWA: lower the table's cap on rows per unit for this query (never above the registered cap)",
}

_CAP_OPTIONS = ("max_groups_per_unit", "max_rows_per_group", "max_rows_per_unit")

LARGE_EPSILON = 10.0

#: the ledger's failure reason for every run that failed after its charge (never data-dependent)
FAILURE_REASON = "failed after the charge (reason withheld: it could depend on private data)"


def _check_options(options: dict[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ConfigError("options must be a dict", hint="e.g. options={'tau': 10}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown}",
            hint="documented options: " + "; ".join(f"{k}: {v}" for k, v in OPTIONS.items()),
        )
    out = dict(options)
    if "mechanism" in out and out["mechanism"] not in ("auto", "gaussian", "laplace", "sparse_histogram", "dawa"):
        raise ConfigError(
            f"unknown mechanism {out['mechanism']!r}",
            hint="use 'gaussian', 'laplace', 'sparse_histogram' or 'dawa'",
        )
    if "tau" in out:
        t = out["tau"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 1 or int(t) != t:
            raise ConfigError(f"tau must be a whole number >= 1, got {t!r}")
        out["tau"] = int(t)
    for key in ("tau_star", "sigma"):
        if key in out and out[key] is not None:
            v = out[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (key == "sigma" and v <= 0):
                raise ConfigError(f"{key} must be a finite number{' > 0' if key == 'sigma' else ''}, got {v!r}")
            out[key] = float(v)
    for key in _CAP_OPTIONS:
        if key in out:
            v = out[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 1 or int(v) != v:
                raise ConfigError(f"{key} must be a whole number >= 1, got {v!r}", hint=f"e.g. options={{'{key}': 1}}")
            out[key] = int(v)
    if "epsilon_split" in out:
        v = out["epsilon_split"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < 1):
            raise ConfigError(f"epsilon_split must be in (0, 1), got {v!r}")
    return out


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
        """Build a Session from a TOML file: ``[ledger]``, ``[engine]`` and ``[tables.NAME]``
        (read and checked by ``dpsql.config.load_config``, the same loader as the CLI's)."""
        cfg = load_config(path)
        s = cls(ledger=cfg.session_ledger(), budget=cfg.budget, engine=cfg.engine, create=cfg.create_if_missing)
        try:
            for name, kwargs in cfg.tables.items():
                s.register(name, **kwargs)
        except BaseException:
            s.close()
            raise
        return s

    def register_from_dict(self, name: str, spec: dict[str, Any], *, base_dir: str = ".") -> None:
        """Register a table from a ``[tables.NAME]``-style dict (relative sources resolved against ``base_dir``)."""
        self.register(name, **table_kwargs(name, spec, os.path.abspath(base_dir)))

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
        settings = self._engine.settings
        register_table(
            self._catalog, name, source,
            register_source=self._engine.register_source, unregister_source=self._engine.unregister_source,
            view_suffix=self._token, has_connection=self._has_connection,
            read_settings={"max_text_bytes": settings.max_text_bytes, "invalid_text": settings.invalid_text},
            privacy_unit=privacy_unit, max_groups_per_unit=max_groups_per_unit, max_rows_per_group=max_rows_per_group,
            max_rows_per_unit=max_rows_per_unit, columns=columns, references=references, tau=tau, version=version,
        )

    @property
    def tables(self) -> Mapping[str, TableSpec]:
        """The registered tables' public metadata: a read-only view of frozen specs (changing a
        table's policy, e.g. its caps, is possible only by registering it again)."""
        return MappingProxyType(self._catalog)

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

    # -- planning ----------------------------------------------------------------------------------
    def _prepare(
        self, sql: str, epsilon: Any, delta: Any, options: dict[str, Any] | None
    ) -> tuple[ir.QueryPlan, Any, Calibration, str, str]:
        self._check_open()
        eps = check_epsilon(epsilon)
        d = check_delta(delta)
        opts = _check_options(options)
        if eps > LARGE_EPSILON:
            warnings.warn(f"epsilon={eps:g} is unusually large: the release gives little privacy", stacklevel=3)
        plan = analyze(sql, self._catalog)
        unit = resolve_unit_column(plan.table, self._catalog)
        assert unit is not None
        module, cal, reason = self._route(plan, eps, d, opts)
        return plan, module, cal, reason, unit

    def _route(self, plan: ir.QueryPlan, eps: float, d: float, opts: dict[str, Any]) -> tuple[Any, Calibration, str]:
        from dpsql.mechanisms import basic

        table = plan.table
        for k in plan.keys:
            for c in k.expr.find_all(exp.Column):
                if c.name.lower() not in table.schema:
                    raise PolicyError(
                        f"'{c.name}' (the bins of an ordered domain) can only be used in a histogram "
                        f"SELECT {c.name}, COUNT(*) FROM {table.name} GROUP BY {c.name}, which DAWA answers",
                        hint="for other aggregates group by the column itself or an expression such as floor(col / 10) * 10",
                    )
        caps = Caps(_capped(table, opts, "max_groups_per_unit"), _capped(table, opts, "max_rows_per_group"))
        if "max_rows_per_unit" in opts:
            raise ConfigError("option 'max_rows_per_unit' applies only to range workloads and ordered-domain histograms (DAWA)")
        forced = opts.get("mechanism", "auto")
        sparse = plan.is_grouped and not plan.public_keys
        if forced == "dawa":
            raise PolicyError(
                "mechanism 'dawa' answers range workloads: use Session.query_many([...]) or a histogram over a column with a declared ordered domain"
            )
        if sparse or forced == "sparse_histogram":
            if not plan.is_grouped:
                raise PolicyError("the sparse histogram mechanism needs a GROUP BY")
            from dpsql.mechanisms import sparse_histogram

            if d == 0:
                undeclared = [k.sql for k in plan.keys if k.domain is None]
                raise PolicyError(
                    "GROUP BY over keys that are not declared public ("
                    + ", ".join(undeclared)
                    + ") needs delta > 0: the keys themselves are released only above a noisy threshold",
                    hint="pass delta (e.g. delta=1e-6), or declare the key column's public domain with columns={'col': {'domain': [...]}}",
                )
            if forced in ("gaussian", "laplace"):
                raise PolicyError(
                    f"mechanism '{forced}' needs public keys, but the GROUP BY keys are not declared public",
                    hint="declare the key column's domain, or let dpsql choose the sparse histogram mechanism",
                )
            if "tau" in opts and opts["tau"] < table.tau:
                # owner policy wins: the registered tau is a floor the analyst may raise, never lower
                raise PolicyError(
                    f"option tau={opts['tau']} is below the threshold tau={table.tau} that the data owner registered for table '{table.name}'",
                    hint=f"omit tau, or pass tau >= {table.tau}",
                )
            cal = sparse_histogram.calibrate(plan, eps, d, caps, opts)
            return sparse_histogram, cal, (
                "GROUP BY over keys not declared public: Gaussian sparse histogram (groups released only above a noisy threshold, exact accounting)"
            )
        for opt in ("tau", "tau_star", "sigma"):
            if opt in opts:
                raise ConfigError(f"option '{opt}' applies only to the sparse histogram mechanism")
        noise = "gaussian" if d > 0 else "laplace"
        if forced in ("gaussian", "laplace"):
            noise = forced
            if noise == "gaussian" and d == 0:
                raise ConfigError("the Gaussian mechanism needs delta > 0", hint="pass delta=1e-6 or use mechanism='laplace'")
        cal = basic.calibrate(plan, eps, d, caps, noise)
        what = "scalar aggregate" if not plan.keys else "GROUP BY over public (declared) keys, every key released"
        why = "delta > 0" if noise == "gaussian" else "delta = 0 (pure DP)"
        return basic, cal, f"{what}: {noise} mechanism ({why})"

    def _bounded_ast(self, plan: ir.QueryPlan, cal: Calibration, unit: str, salt: str) -> exp.Expression:
        return bounded_query(plan, cal.caps, salt=salt, tau=cal.tau, unit_column=unit)

    def explain(self, sql: str, *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None) -> Plan:
        """What ``query`` would do: mechanism, noise, thresholds, bounded SQL. Free; reads no rows."""
        self._check_open()
        ranged = self._explain_ranges(sql, epsilon, delta, options)
        if ranged is not None:
            return ranged
        plan, _module, cal, reason, unit = self._prepare(sql, epsilon, delta, options)
        self._bind_check(plan, cal, unit)  # refuses exactly what query refuses before its charge
        params = dict(cal.params)
        params["max_groups_per_unit"] = cal.caps.max_groups_per_unit
        params["max_rows_per_group"] = cal.caps.max_rows_per_group
        if cal.tau is not None:
            params["tau"] = cal.tau
        if cal.tau_star is not None:
            params["tau_star"] = cal.tau_star
        notes = list(cal.notes)
        notes.append(
            f"bounding: each privacy unit keeps at most {_fmt_cap(cal.caps.max_rows_per_group)} row(s) per group and "
            f"{_fmt_cap(cal.caps.max_groups_per_unit)} group(s), chosen at random; rows beyond these caps are dropped "
            "(a public, data-independent rule; how many rows it drops is not reported because that would depend on the data)"
        )
        bsql = render(self._bounded_ast(plan, cal, unit, SALT_PLACEHOLDER), pretty=True)
        return Plan(sql=sql, mechanism=cal.mechanism, reason=reason, cost=cal.cost, parameters=params, bounded_sql=bsql, notes=notes)

    def _explain_ranges(self, sql: str, epsilon: Any, delta: Any, options: dict[str, Any] | None) -> Plan | None:
        """explain for the paths ``query`` answers with DAWA or from a stored synopsis."""
        from dpsql.mechanisms import ranges

        eps = check_epsilon(epsilon)
        check_delta(delta)
        opts = _check_options(options)
        try:
            plan = analyze(sql, self._catalog)
        except DPSQLError:
            return None
        if not any(c.ordered is not None for c in plan.table.columns.values()):
            return None
        wl = workload.histogram_workload(plan)
        single = False
        if wl is None and not plan.keys and [a.kind for a in plan.aggregates] == [ir.COUNT_STAR] and plan.where is not None:
            try:
                wl = workload.analyze_workload([sql], self._catalog)
                single = True
            except DPSQLError:
                return None
        if wl is None or opts.get("mechanism", "dawa") not in ("dawa", "auto"):
            return None
        cap = _row_cap(wl.table, opts)
        skey = wl.synopsis_key(cap, self._catalog)
        found = self._ledger.find_synopsis(skey) if skey is not None else None
        unit = ranges.unit_column(wl, self._catalog)
        bsql = render(ranges.histogram_sql(wl, unit, cap, SALT_PLACEHOLDER), pretty=True) if not math.isinf(cap) else ""
        dims = [{"column": d.column, "lo": str(d.domain.lo), "hi": str(d.domain.hi), "bins": d.n} for d in wl.dims]
        if found is not None:
            return Plan(
                sql=sql, mechanism="dawa (reused synopsis)",
                reason=f"answered from the DAWA synopsis of ledger entry {found[0]} (same table, column(s), WHERE and cap): post-processing",
                cost=Budget(0.0, 0.0), parameters={"source_entry_id": found[0], "dims": dims}, bounded_sql="",
            )
        if single:
            return None  # an ordinary scalar count
        split = float(opts.get("epsilon_split", 0.25))
        return Plan(
            sql=sql, mechanism="dawa",
            reason="histogram over a column with a declared ordered domain: DAWA (private partition, then workload-aware measurement)",
            cost=Budget(eps, 0.0),
            parameters={"epsilon1": split * eps, "epsilon2": (1 - split) * eps, "max_rows_per_unit": cap, "dims": dims,
                        "bins_released": int(len(wl.ranges))},
            bounded_sql=bsql,
            notes=["DAWA is pure epsilon-DP: no delta is spent",
                   f"each unit keeps at most {_fmt_cap(cap)} row(s), chosen at random; rows outside the declared domain are dropped"],
        )

    # -- querying -----------------------------------------------------------------------------------
    def query(self, sql: str, *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None) -> Release:
        """Answer ``sql`` with differential privacy, charging (epsilon, delta) to the ledger.

        A range count or a histogram over a column with a declared ordered domain is answered
        for free when a stored DAWA synopsis covers it (same table, column(s), WHERE, cap);
        a histogram over such a column is otherwise answered by DAWA.
        """
        self._check_open()
        ranged = self._range_route(sql, epsilon, delta, options)
        if ranged is not None:
            return ranged
        plan, module, cal, _reason, unit = self._prepare(sql, epsilon, delta, options)
        self._bind_check(plan, cal, unit)
        entry = self._ledger.reserve(
            cal.cost, mechanism=cal.mechanism, query=sql, tables=[plan.table.name], params=_ledger_params(cal)
        )
        with self._charged(entry, "the query"):
            salt = self._noise.salt()
            bounded = self._engine.fetch_arrow(self._bounded_ast(plan, cal, unit, salt))
            released, accuracy = module.release(plan, bounded, cal, self._noise)
            table = self._post_process(plan, released, accuracy)
        self._ledger.commit(entry, params_update={"released_rows": table.num_rows} if cal.mechanism == "sparse_histogram" else None)
        out_acc = {}
        for o in plan.outputs:
            if o.source is not None and o.source in accuracy:
                out_acc[o.name] = accuracy[o.source]
            elif o.source is None:
                out_acc[o.name] = {"note": "derived from released values (post-processing)"}
        return Release(table=table, cost=cal.cost, mechanism=cal.mechanism, accuracy=out_acc, ledger_id=entry,
                       details={k: v for k, v in cal.params.items() if k != "scales"})

    # -- range workloads (DAWA) --------------------------------------------------------------------
    def query_many(
        self, sqls: list[str], *, epsilon: Any, delta: Any = 0.0, options: dict[str, Any] | None = None
    ) -> WorkloadRelease:
        """Answer a workload of range counts over one table with DAWA, with one charge.

        Each SQL is ``SELECT COUNT(*) FROM t WHERE <same other conditions> AND <range>`` over a
        column (or two) with a declared ordered domain. DAWA is pure epsilon-DP: delta is not
        spent. If a stored synopsis already covers the workload, it is answered for free.
        """

        self._check_open()
        eps = check_epsilon(epsilon)
        check_delta(delta)
        opts = _check_options(options)
        for k in opts:
            if k not in ("epsilon_split", "mechanism", "max_rows_per_unit"):
                raise ConfigError(f"option '{k}' does not apply to range workloads", hint="use epsilon_split or max_rows_per_unit")
        wl = workload.analyze_workload(list(sqls) if isinstance(sqls, (list, tuple)) else sqls, self._catalog)
        return self._run_workload(wl, eps, opts, reuse_only=False)  # type: ignore[return-value]

    def _range_route(self, sql: str, epsilon: Any, delta: Any, options: dict[str, Any] | None) -> Release | None:

        check_epsilon(epsilon)
        check_delta(delta)
        opts = _check_options(options)
        try:
            plan = analyze(sql, self._catalog)
        except DPSQLError:
            return None  # the normal path reports the error
        if plan.table.columns and any(c.ordered is not None for c in plan.table.columns.values()):
            wl = workload.histogram_workload(plan)
            if wl is None and not plan.keys and [a.kind for a in plan.aggregates] == [ir.COUNT_STAR] and plan.where is not None:
                try:
                    wl = workload.analyze_workload([sql], self._catalog)
                except DPSQLError:
                    wl = None
                if wl is not None:
                    # a single range count: free from a synopsis, else the ordinary scalar path
                    return self._run_workload(wl, 0.0, opts, reuse_only=True, plan=plan)
            if wl is not None and opts.get("mechanism", "dawa") in ("dawa", "auto"):
                reused = self._run_workload(wl, 0.0, opts, reuse_only=True, plan=plan)
                if reused is not None:
                    return reused
                return self._run_workload(wl, check_epsilon(epsilon), opts, reuse_only=False, plan=plan)
        return None

    def _run_workload(
        self, wl: Any, eps: float, opts: dict[str, Any], *, reuse_only: bool, plan: ir.QueryPlan | None = None
    ) -> Release | None:
        from dpsql.mechanisms import ranges

        table = wl.table
        bad = sorted(set(opts) - {"epsilon_split", "mechanism", "max_rows_per_unit"})
        if bad:
            raise ConfigError(
                f"option(s) {bad} do not apply to range workloads and ordered-domain histograms (DAWA)",
                hint="use epsilon_split or max_rows_per_unit",
            )
        cap = _row_cap(table, opts)
        key = wl.synopsis_key(cap, self._catalog)
        found = self._ledger.find_synopsis(key) if key is not None else None
        text = "\n;\n".join(wl.sqls)
        if found is not None:
            src_id, syn_text = found
            syn = ranges.load_synopsis(syn_text)
            answers = ranges.answer(wl, syn)
            entry = self._ledger.record_reuse(source_entry_id=src_id, query=text, tables=[table.name])
            return self._workload_release(wl, answers, Budget(0.0, 0.0), entry, reused=True, plan=plan,
                                          details={"source_entry_id": src_id})
        if reuse_only:
            return None
        if math.isinf(cap):
            raise PolicyError(
                f"table '{table.name}' needs a finite max_rows_per_unit (or max_groups_per_unit and max_rows_per_group) for range workloads",
                hint=f"register('{table.name}', ..., max_rows_per_unit=1)",
            )
        split = float(opts.get("epsilon_split", 0.25))
        unit = ranges.unit_column(wl, self._catalog)
        cost = Budget(eps, 0.0)
        params = {
            "epsilon1": split * eps,
            "epsilon2": (1 - split) * eps,
            "max_rows_per_unit": cap,
            "dims": [{"column": d.column, "lo": str(d.domain.lo), "hi": str(d.domain.hi), "bins": d.n} for d in wl.dims],
            "queries": len(wl.sqls) if not wl.histogram else int(len(wl.ranges)),
            "stage1_calibration": "safe (spec 2.4): Laplace (Delta_b + Delta_max) * k / epsilon1 on every bucket, no clamping",
        }
        self._engine.bind_check(ranges.histogram_sql(wl, unit, cap, SALT_PLACEHOLDER))
        ranges.precheck_dawa(wl, eps, split=split, cap=cap)  # unrepresentable noise: refused for free
        entry = self._ledger.reserve(cost, mechanism="dawa", query=text, tables=[table.name], params=params)
        with self._charged(entry, "the range workload"):
            salt = self._noise.salt()
            rows = self._engine.fetch_arrow(ranges.histogram_sql(wl, unit, cap, salt), what="the bounded histogram")
            x = ranges.fill_histogram(wl, rows)
            syn = ranges.run_dawa(wl, x, eps, self._noise, split=split, cap=cap)
            answers = ranges.answer(wl, syn)
            rel = self._workload_release(wl, answers, cost, entry, reused=False, plan=plan, details=params)
        if key is not None:
            self._ledger.commit(entry, synopsis_key=key, synopsis=syn.to_json())
        else:  # a source without an identity (Arrow / DuckDB table, no declared version): no reuse
            self._ledger.commit(entry)
        return rel

    def _workload_release(
        self, wl: Any, answers: Any, cost: Budget, entry: int, *, reused: bool, plan: ir.QueryPlan | None,
        details: dict[str, Any],
    ) -> Release:
        acc = {
            "noise": "laplace",
            "noise_std": None,
            "ci95_half_width": None,
            "note": "DAWA: error is data dependent (partition bias plus stage-2 Laplace noise)"
            + ("; answered from a stored synopsis at zero cost" if reused else ""),
        }
        snapped = [i for i, s in enumerate(wl.snapped) if s]
        det = dict(details)
        if snapped:
            det["snapped_to_bins"] = snapped
        mech = "dawa (reused synopsis)" if reused else "dawa"
        if wl.histogram and plan is not None:
            dim = wl.dims[0]
            labels = dim.bin_label([r[0] for r in wl.ranges])
            released = pa.table({plan.keys[0].name: pa.array(labels), plan.aggregates[0].name: pa.array(answers.astype("int64"))})
            table = self._post_process(plan, released)
            out_acc = {o.name: acc for o in plan.outputs if o.source == plan.aggregates[0].name}
            return Release(table=table, cost=cost, mechanism=mech, accuracy=out_acc, ledger_id=entry, reused=reused, details=det)
        if plan is not None and len(wl.sqls) == 1:
            released = pa.table({plan.aggregates[0].name: pa.array(answers.astype("int64"))})
            table = self._post_process(plan, released)
            out_acc = {o.name: acc for o in plan.outputs}
            return Release(table=table, cost=cost, mechanism=mech, accuracy=out_acc, ledger_id=entry, reused=reused, details=det)
        table = pa.table({"query": pa.array(wl.sqls), "count": pa.array(answers.astype("int64"))})
        return WorkloadRelease(table=table, cost=cost, mechanism=mech, accuracy={"count": acc}, ledger_id=entry,
                               reused=reused, details=det)

    @contextlib.contextmanager
    def _charged(self, entry: int, what: str) -> Iterator[None]:
        """Run the part after the charge (it reads private data).

        On any failure the entry is marked failed (it still counts: the charge stands) and one
        generic ExecutionError is raised whose text depends only on ``what`` and the owner's
        settings: never on which failure happened (time-out, out of memory, a full temp
        directory, a solver failure, ...), since that could depend on the data. The ledger's
        failure reason is a constant. The original exception is not chained. In the owner's
        debug mode only, ``debug_detail`` carries its class and scrubbed message.
        Every run is padded by sleeping to the owner's ``min_response_time``, failures included.
        """
        start = time.monotonic()
        settings = self._engine.settings
        failure: BaseException | None = None
        try:
            yield
        except BaseException as e:
            if not isinstance(e, Exception):  # KeyboardInterrupt / SystemExit: keep them
                failure = e
            else:
                detail = None
                if settings.debug:
                    detail = (scrub(e.debug_detail) if isinstance(e, ExecutionError) and e.debug_detail
                              else self._engine._detail(e))
                err = private_failure(what, detail, settings)
                failure = ExecutionError(
                    f"{what} failed after its budget was charged; the charge stands. "
                    "The reason is withheld: it could depend on private data",
                    hint=err.hint,
                    debug_detail=err.debug_detail,
                )
            _withhold(e)
        finally:
            pad = settings.min_response_time - (time.monotonic() - start)
            if pad > 0:
                time.sleep(pad)
        if failure is not None:
            try:
                self._ledger.fail(entry, FAILURE_REASON)
            except LedgerError:
                pass
            raise failure from None

    def _bind_check(self, plan: ir.QueryPlan, cal: Calibration, unit: str) -> None:
        """Type-check the bounded query and the post-processing query, reading no row.

        The post-processing query (outputs, HAVING, ORDER BY) is bound over a typed empty
        relation shaped like the released table, so type errors there are refused for free too.
        """
        bounded = self._bounded_ast(plan, cal, unit, SALT_PLACEHOLDER)
        types = dict(self._engine.describe(bounded))
        cols: list[exp.Expression] = []
        for k in plan.keys:
            cols.append(exp.alias_(exp.cast(exp.Null(), exp.DataType.build(types.get(k.name, "VARCHAR"), dialect="duckdb")), k.name))
        for a in plan.aggregates:
            typ = "BIGINT" if a.kind in (ir.COUNT_STAR, ir.COUNT_COL, ir.COUNT_UNITS) else "DOUBLE"
            # a non-NULL placeholder: conversions in HAVING / ORDER BY are only tried on values
            cols.append(exp.alias_(exp.cast(exp.Literal.number(0), typ), a.name))
            if a.kind == ir.AVG:
                cols.append(exp.alias_(exp.cast(exp.Literal.number(0), "DOUBLE"), a.name + "__ci"))
        shape = exp.select(*cols).subquery("__released")
        self._engine.bind_check(self._post_ast(plan, shape, []), run=True)
        self._check_post_on_public_keys(plan)

    def _check_post_on_public_keys(self, plan: ir.QueryPlan) -> None:
        """With declared (public) keys the released keys are exactly the domain product, so run
        the post-processing (outputs, HAVING, ORDER BY) over those keys before the charge: an
        expression that cannot be evaluated on them is refused for free (it would fail whatever
        the data and the noise)."""
        if not plan.public_keys:
            return
        from dpsql.mechanisms import basic

        n = basic.domain_size(plan)
        if n > 100_000:
            return  # large domains: the typed placeholder check above only
        keys = basic._domain_table(plan, pa.table({}))
        cols: dict[str, Any] = {name: keys.column(name) for name in keys.column_names}
        for a in plan.aggregates:
            counts = a.kind in (ir.COUNT_STAR, ir.COUNT_COL, ir.COUNT_UNITS)
            cols[a.name] = pa.array([0] * n, pa.int64() if counts else pa.float64())
            if a.kind == ir.AVG:
                cols[a.name + "__ci"] = pa.array([0.0] * n, pa.float64())
        try:
            self._engine.post_process(pa.table(cols), lambda rel: self._post_ast(plan, exp.to_table(rel), []))
        except ExecutionError:
            raise QueryTypeError(
                "the query's outputs, HAVING or ORDER BY cannot be evaluated on the declared key values; nothing was charged",
                hint="check casts and arithmetic over the GROUP BY keys (e.g. CAST(key AS INTEGER) on text keys)",
            ) from None

    def _post_ast(
        self, plan: ir.QueryPlan, rel: exp.Expression, hidden: list[tuple[str, str]], *, total: bool = False
    ) -> exp.Expression:
        """The post-processing query over released values. ``total=True`` (the run after the
        charge) evaluates every computed output, HAVING and ORDER BY expression under TRY, so a
        value that does not convert or overflows gives NULL instead of losing a paid release;
        the free checks before the charge run it without TRY, refusing what fails there."""

        def t(e: exp.Expression) -> exp.Expression:
            e = e.copy()
            if not total or isinstance(e, (exp.Column, exp.Literal)):
                return e
            return exp.Try(this=e)

        items = [exp.alias_(t(o.expr), o.name, quoted=True) for o in plan.outputs]
        items += [exp.alias_(exp.column(f"{src}__ci"), alias, quoted=True) for src, alias in hidden]
        q = exp.select(*items).from_(rel)
        if plan.having is not None:
            q = q.where(t(plan.having))
        order = []
        for o in plan.order:
            o2 = o.copy()
            o2.set("this", t(o.this))
            order.append(o2)
        order += [exp.Ordered(this=exp.column(k.name)) for k in plan.keys]
        if order:
            q = q.order_by(*order)
        if plan.limit is not None:
            q = q.limit(plan.limit)
        if plan.offset is not None:
            q = q.offset(plan.offset)
        return q

    def _post_process(
        self, plan: ir.QueryPlan, released: pa.Table, accuracy: dict[str, dict[str, Any]] | None = None
    ) -> pa.Table:
        """Select outputs, then HAVING / ORDER BY / LIMIT on the released (noisy) values only.

        Per-row interval columns (``<agg>__ci``) ride along hidden and are moved into
        ``accuracy[agg]["per_row_ci95_half_width"]`` in the final row order.
        """
        hidden = [
            (o.source, f"__ci_{i}")
            for i, o in enumerate(plan.outputs)
            if o.source is not None and f"{o.source}__ci" in released.column_names
        ]

        def build(rel: str) -> exp.Expression:
            return self._post_ast(plan, exp.to_table(rel), hidden, total=True)

        out = self._engine.post_process(released, build)
        for src, alias in hidden:
            if accuracy is not None and src in accuracy:
                accuracy[src] = {**accuracy[src], "per_row_ci95_half_width": out.column(alias).to_pylist()}
            out = out.drop_columns([alias])
        return out

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


def _capped(table: TableSpec, opts: dict[str, Any], key: str) -> float:
    """A contribution cap for this query: the registered one, or a lower one from the options.

    Owner policy wins: lowering an enforced cap only adds bias (less noise, never less privacy);
    raising it above what the data owner registered is refused before any charge.
    """
    registered = float(getattr(table, key))
    if key not in opts:
        return getattr(table, key)  # type: ignore[no-any-return]
    v = opts[key]
    if v > registered:
        raise PolicyError(
            f"option {key}={v} is above the cap {_fmt_cap(registered)} that the data owner registered for table '{table.name}'",
            hint=f"pass {key} <= {_fmt_cap(registered)}, or omit it",
        )
    return v  # type: ignore[no-any-return]


def _row_cap(table: TableSpec, opts: dict[str, Any]) -> float:
    registered = table.rows_per_unit_cap
    if "max_rows_per_unit" not in opts:
        return registered
    v = opts["max_rows_per_unit"]
    if v > registered:
        raise PolicyError(
            f"option max_rows_per_unit={v} is above the cap {_fmt_cap(registered)} that the data owner registered for table '{table.name}'",
            hint=f"pass max_rows_per_unit <= {_fmt_cap(registered)}, or omit it",
        )
    return float(v)


def _fmt_cap(v: float) -> str:
    return "unlimited" if math.isinf(v) else str(int(v))


def _ledger_params(cal: Calibration) -> dict[str, Any]:
    p: dict[str, Any] = {k: v for k, v in cal.params.items()}
    p["noise"] = cal.noise
    p["max_groups_per_unit"] = cal.caps.max_groups_per_unit
    p["max_rows_per_group"] = cal.caps.max_rows_per_group
    if cal.tau is not None:
        p["tau"] = cal.tau
    if cal.tau_star is not None:
        p["tau_star"] = cal.tau_star
    return p


def _withhold(e: BaseException) -> None:
    """Drop the text, attributes and frames of a failure that may quote private data (and of
    the exceptions chained to it), so no reference to it can reveal a value later."""
    seen: set[int] = set()
    cur: BaseException | None = e
    stack = [e]
    while stack:
        cur = stack.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        stack += [cur.__context__, cur.__cause__]  # type: ignore[list-item]
        try:
            cur.args = ("<withheld>",)
            cur.__dict__.clear()
            cur.__traceback__ = None
        except (AttributeError, TypeError):  # pragma: no cover - exotic exception types
            pass
