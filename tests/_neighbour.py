"""Neighbour sensitivity checks for single-table queries (helpers of ``tests/test_neighbour_fuzz.py``).

A case is (registration, dataset D, target person, query). The query runs on D and on D minus every
row of the target, each in a fresh Session with zero noise from the same seed (so the per-query salt,
hence every bounding choice of the other people, is the same on both). What the mechanism receives
(the bounded rows fetched from the engine), what it releases and what it charges are compared:

* the outcome: both succeed, or both raise the same exception class with the same message; the same
  Python warnings on both;
* the charge: explain's cost and parameters are the release's and the ledger's, on both;
* the declared sensitivities (the calibration's released columns) are the ones the documentation
  states for each aggregate (docs/sql.md), recomputed here from the caps and bounds;
* the bounded rows: per group and released column |D - D'| <= its sensitivity, at most
  ``groups_per_unit`` groups differ, and a group present on one side only holds the target;
* the released values (zero noise: the bounded truth, rounded): the same key set for public keys,
  a key set differing only in groups the target is in (at most C of them) otherwise, values within
  sensitivity plus the rounding grid.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import math
import warnings
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import dpsql
from dpsql.plan import ir
from dpsql.rewrite.bound import pair_sources
from dpsql.testing import use_noise, zero_noise


class Violation(AssertionError):
    pass


@contextlib.contextmanager
def captured_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning of the block, and none of earlier garbage's finalisers (an earlier test's unclosed
    pipe warns ResourceWarning when its reference cycle is collected, which can be at any allocation): the garbage
    of the generations the collector examines is collected first, outside the record. Objects frozen by
    ``frozen_heap`` are never examined, so none of them can be collected inside the record either."""
    gc.collect()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        yield w


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, then freeze every surviving object (``gc.freeze``) for the block: ``captured_warnings``'s
    collection then examines only what was allocated since (a few ms instead of a full collection of the test
    process's heap, ~0.1 s), and a frozen object that becomes garbage is not collected before the block ends.
    Used around a module's tests by a module-scoped autouse fixture."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # the block's garbage, and every object frozen before (conftest: after collection) ...
        gc.collect()
        gc.freeze()  # ... frozen again once that garbage is gone, as conftest's pytest_collection_finish left them


def write_decoded_parquet(path: Any, table: pa.Table) -> None:
    """Write ``table`` to ``path`` as ``pq.write_table`` writes it with its dictionary columns decoded (each a column
    of its value type, the dictionary listing the values in the order they first appear, none unused): the same
    bytes (``tests/test_adversary_dictionary_text.py`` checks it), without decoding. One person's 45 000 rows of an
    8 000-character text are 360 MB decoded, about 1.5 s of CPU to build as a text column; the file is a few kB."""
    decoded = pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in table.schema])
    with pq.ParquetWriter(path, table.schema, store_schema=False) as w:
        # the schema pq.write_table stores (store_schema), that of the decoded columns
        w.add_key_value_metadata({"ARROW:schema": base64.b64encode(decoded.serialize().to_pybytes()).decode()})
        w.write_table(table)


def repeated_text(head: list[str], value: str | None, repeats: int) -> pa.Array:
    """``head`` then ``value`` ``repeats`` times, as a dictionary array (for ``write_decoded_parquet``)."""
    assert None not in head
    tail = [value] * repeats if value is not None else []
    values = list(dict.fromkeys(head + tail[:1]))
    at = {v: i for i, v in enumerate(values)}
    indices = [at[v] for v in head] + [at[value] for value in tail[:1]] * len(tail)
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(values, pa.string()))


def _session(table: pa.Table, reg: dict[str, Any], production: bool = False) -> dpsql.Session:
    """``production``: the engine keeps its own per-row draws (RANDOM()), only the noise is zero."""
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
    if production:
        s._noise = zero_noise(12345)
    else:
        use_noise(s, zero_noise(12345))
    s.register("t", table, **reg)
    return s


class Capture:
    """Route and bounded rows of one query (wraps the session's ``_route`` and engine ``fetch_arrow``)."""

    def __init__(self, s: dpsql.Session) -> None:
        self.route: Any = None
        self.bounded: list[pa.Table] = []
        orig_route, engine = s._route, s._engine
        orig_fetch = engine.fetch_arrow

        def route(*a: Any, **kw: Any) -> Any:
            self.route = orig_route(*a, **kw)
            return self.route

        def fetch(ast: Any, **kw: Any) -> pa.Table:
            out = orig_fetch(ast, **kw)
            self.bounded.append(out)
            return out

        s._route = route  # type: ignore[method-assign]
        engine.fetch_arrow = fetch  # type: ignore[method-assign]


def run_one(table: pa.Table, reg: dict[str, Any], sql: str | list[str], eps: float, delta: float,
            options: dict[str, Any] | None, production: bool = False) -> dict[str, Any]:
    """Explain then query on a fresh session; everything observable, plus the captured internals."""
    out: dict[str, Any] = {}
    with captured_warnings() as w:
        s = _session(table, reg, production)
        try:
            try:
                plan = s.explain(sql, epsilon=eps, delta=delta, options=options)
                out["explain"] = plan
            except dpsql.errors.DPSQLError as e:
                out["explain_error"] = (type(e).__name__, str(e))
            cap = Capture(s)
            try:
                if isinstance(sql, list):
                    rel = s.query_many(sql, epsilon=eps, delta=delta, options=options)
                else:
                    rel = s.query(sql, epsilon=eps, delta=delta, options=options)
                out["release"] = rel
                out["history"] = s.history().to_pylist()
            except dpsql.errors.DPSQLError as e:
                out["error"] = (type(e).__name__, str(e))
                out["history"] = s.history().to_pylist()
            out["capture"] = cap
        finally:
            s.close()
    out["warnings"] = sorted(f"{x.category.__name__}: {x.message}" for x in w)
    return out


# -- independent sensitivities (docs/sql.md's table) --------------------------------------------------


def expected_sensitivities(plan: ir.QueryPlan, caps: Any) -> dict[str, float]:
    """Per released column of the bounded rows, the per-group sensitivity docs/sql.md states."""
    k = min(caps.max_rows_per_group, caps.max_rows_per_unit)
    out: dict[str, float] = {"__users": 1.0}
    for a in plan.aggregates:
        if a.kind == ir.COUNT_UNITS or (a.kind == ir.COUNT_STAR and caps.max_rows_per_group == 1):
            continue
        if a.kind in (ir.COUNT_STAR, ir.COUNT_COL, ir.COUNT_DISTINCT):
            out[a.name] = k
            continue
        assert a.bounds is not None
        lo, hi = a.bounds
        if a.kind == ir.SUM:
            out[a.name] = k * max(abs(lo), abs(hi))
            continue
        mid = (lo + hi) / 2.0
        r = max(abs(lo - mid), abs(hi - mid))
        if a.kind in ir.PAIR_KINDS:
            # the pair's columns, released once under the name of its first aggregate (docs/sql.md)
            assert a.second is not None and a.second.bounds is not None
            rb = (a.second.bounds[1] - a.second.bounds[0]) / 2.0
            lead, reads = pair_sources(plan)[a.name]
            doc = {"_cnt": k, "_sum": k * r, "_sumb": k * rb, "_ab": k * r * rb, "_sq": k * r * r, "_sqb": k * rb * rb}
            out.update({lead + c: doc[c] for c in reads})
            continue
        out[a.name + "_sum"] = k * r
        out[a.name + "_cnt"] = k
        if a.kind in ir.VARIANCE_KINDS:
            out[a.name + "_sq"] = k * r * r
    return out


def _value(v: Any, scale: int | None) -> Fraction:
    if v is None:
        return Fraction(0)
    if scale is not None:
        return Fraction(int(v)) / Fraction(2) ** scale
    if isinstance(v, float) and not math.isfinite(v):
        raise Violation(f"bounded value not finite: {v}")
    return Fraction(v)


def _groups(t: pa.Table, keys: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in t.to_pylist():
        key = tuple(_norm(r[k]) for k in keys)
        if key in rows:
            raise Violation(f"two bounded rows for one group {key!r}")
        rows[key] = r
    return rows


def _norm(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return v


def check_pair(a: dict[str, Any], b: dict[str, Any], *, what: str) -> list[str]:
    """All checks on the outcomes ``a`` (D) and ``b`` (D minus the target). Returns problems."""
    probs: list[str] = []
    if a["warnings"] != b["warnings"]:
        probs.append(f"warnings differ: {a['warnings']} vs {b['warnings']}")
    if ("explain_error" in a) != ("explain_error" in b) or a.get("explain_error") != b.get("explain_error"):
        probs.append(f"explain outcome differs: {a.get('explain_error')} vs {b.get('explain_error')}")
    if ("error" in a) != ("error" in b) or a.get("error") != b.get("error"):
        probs.append(f"query outcome differs: {a.get('error')} vs {b.get('error')}")
        return probs
    if "error" in a:
        if "explain_error" not in a:
            probs.append(f"explain accepted what query refused: {a['error']}")
        return probs
    if "explain_error" in a:
        probs.append(f"explain refused what query answered: {a['explain_error']}")
        return probs
    for side, o in (("D", a), ("D'", b)):
        probs += [f"{side}: {p}" for p in _check_accounting(o)]
    ra, rb = a["release"], b["release"]
    if ra.mechanism != rb.mechanism or ra.cost != rb.cost:
        probs.append(f"mechanism/cost differ: {ra.mechanism} {ra.cost} vs {rb.mechanism} {rb.cost}")
    if ra.table.schema != rb.table.schema:
        probs.append(f"schemas differ: {ra.table.schema} vs {rb.table.schema}")
    route = a["capture"].route
    mech = route.mechanism.name.value if hasattr(route.mechanism, "name") else ""
    cal = route.calibration
    if mech in ("gaussian", "laplace", "sparse_histogram"):
        probs += _check_bounded_aggregates(a, b, cal)
    elif mech == "exponential":
        probs += _check_quantile(a, b, cal)
    elif mech == "dawa":
        probs += _check_dawa(a, b, cal)
    return probs


def _check_accounting(o: dict[str, Any]) -> list[str]:
    probs = []
    plan, rel = o["explain"], o["release"]
    if plan.cost != rel.cost:
        probs.append(f"explain cost {plan.cost} != release cost {rel.cost}")
    if plan.mechanism != rel.mechanism:
        probs.append(f"explain mechanism {plan.mechanism} != {rel.mechanism}")
    hist = o["history"]
    charged = [h for h in hist if h.get("epsilon", 0) or h.get("delta", 0)]
    if rel.cost.epsilon > 0 or rel.cost.delta > 0:
        if len(charged) != 1:
            probs.append(f"{len(charged)} charged ledger entries")
        else:
            h = charged[0]
            if h["epsilon"] != rel.cost.epsilon or h["delta"] != rel.cost.delta:
                probs.append(f"ledger charged ({h['epsilon']}, {h['delta']}) != release {rel.cost}")
    elif charged:
        probs.append(f"a free release left charged entries {charged}")
    pp = {k: v for k, v in plan.parameters.items() if k not in ("released_rows",)}
    dd = {k: v for k, v in rel.details.items() if k not in ("released_rows",)}
    pp.pop("scales", None)
    for k, v in pp.items():
        if k in dd and dd[k] != v and not (isinstance(v, float) and math.isnan(v)):
            probs.append(f"explain parameter {k}={v!r} but release detail {dd[k]!r}")
    return probs


def _check_bounded_aggregates(a: dict[str, Any], b: dict[str, Any], cal: Any) -> list[str]:
    probs: list[str] = []
    plan = cal.plan
    keys = [k.name for k in plan.keys]
    declared = {c.name: c for c in cal.columns}
    expected = expected_sensitivities(plan, cal.caps)
    for name, s in expected.items():
        if name not in declared:
            if name != "__users":
                probs.append(f"column {name} has no declared sensitivity")
            continue
        if declared[name].sensitivity < s * (1 - 1e-12):
            probs.append(f"column {name}: declared sensitivity {declared[name].sensitivity} < documented {s}")
    # calibration: the noise of each column is proportional to its sensitivity, L2 over C groups x m columns
    groups_per_unit = cal.params.get("groups_per_unit", cal.params.get("max_groups_per_unit"))
    if cal.mechanism == "gaussian":
        m = len(cal.columns)
        if abs(cal.params["l2_sensitivity"] - math.sqrt(groups_per_unit * m)) > 1e-9:
            probs.append(f"l2_sensitivity {cal.params['l2_sensitivity']} != sqrt({groups_per_unit} * {m})")
        for c in cal.columns:
            if abs(cal.scales[c.name] - cal.params["sigma"] * c.sensitivity) > 1e-9 * cal.scales[c.name]:
                probs.append(f"scale of {c.name} is not sigma * sensitivity")
    if cal.mechanism == "laplace":
        m = len(cal.columns)
        if cal.params["l1_sensitivity"] < groups_per_unit * m:
            probs.append(f"l1_sensitivity {cal.params['l1_sensitivity']} < {groups_per_unit} * {m}")
        for c in cal.columns:
            if cal.scales[c.name] < c.sensitivity * groups_per_unit * m / cal.cost.epsilon:
                probs.append(f"Laplace scale of {c.name} {cal.scales[c.name]} < sensitivity * C * m / epsilon")
        if cal.params["epsilon_proven"] > cal.cost.epsilon:
            probs.append(f"epsilon_proven {cal.params['epsilon_proven']} > charged {cal.cost.epsilon}")
    if cal.mechanism == "sparse_histogram":
        sigma = cal.scales["__users"]
        mu2 = sum((c.sensitivity / cal.scales[c.name]) ** 2 for c in cal.columns if c.name != "__users")
        if cal.params["mu_other"] < math.sqrt(mu2) * (1 - 1e-9):
            probs.append(f"mu_other {cal.params['mu_other']} < {math.sqrt(mu2)} from the scales")
        if sigma != cal.params["sigma"]:
            probs.append("sigma of the threshold column is not the calibrated sigma")
    exp_c = min(cal.caps.max_groups_per_unit, cal.caps.max_rows_per_unit)
    if plan.keys and plan.public_keys:
        n = 1
        for k in plan.keys:
            n *= len(k.domain)
        exp_c = min(exp_c, n)
    if not plan.keys:
        exp_c = 1
    if groups_per_unit < exp_c:
        probs.append(f"groups_per_unit {groups_per_unit} < {exp_c}")
    ta, tb = a["capture"].bounded, b["capture"].bounded
    if len(ta) != 1 or len(tb) != 1:
        return probs + [f"{len(ta)}/{len(tb)} bounded fetches"]
    ga, gb = _groups(ta[0], keys), _groups(tb[0], keys)
    changed = 0
    for key in set(ga) | set(gb):
        ra, rb = ga.get(key), gb.get(key)
        diff = False
        if (ra is None) != (rb is None) and cal.tau is not None:
            # the sparse histogram's SQL drops groups below tau: one only on D must sit at tau (docs 1.4, a=)
            if ra is not None and ra["__users"] != cal.tau:
                probs.append(f"group {key!r} only with the target has {ra['__users']} people, not tau={cal.tau}")
            changed += 1
            if ra is None:
                probs.append(f"group {key!r} only without the target")
            continue
        for c in cal.columns:
            va = _value(ra[c.name], c.scale) if ra is not None else Fraction(0)
            vb = _value(rb[c.name], c.scale) if rb is not None else Fraction(0)
            if va != vb:
                diff = True
            if abs(va - vb) > Fraction(c.sensitivity):
                probs.append(f"group {key!r} column {c.name}: |{float(va)} - {float(vb)}| > sensitivity {c.sensitivity}")
        if (ra is None) != (rb is None):
            diff = True
            if ra is None:
                probs.append(f"group {key!r} only without the target")
        changed += diff
    if changed > groups_per_unit:
        probs.append(f"{changed} groups changed > groups_per_unit {groups_per_unit}")
    probs += _check_released(a, b, cal, groups_per_unit)
    return probs


def _check_released(a: dict[str, Any], b: dict[str, Any], cal: Any, c: float) -> list[str]:
    """Zero noise: released values are the bounded truth, rounded (and clamped to a public bound)."""
    from dpsql.rewrite.bound import source_column

    probs: list[str] = []
    plan = cal.plan
    if plan.having is not None or plan.limit is not None or plan.offset is not None:
        return probs
    rel_a, rel_b = a["release"], b["release"]
    key_out = {o.source: o.name for o in plan.outputs if o.source and o.source.startswith("__k")}
    if len(key_out) != len(plan.keys):
        return probs
    names = [key_out[k.name] for k in plan.keys]
    ka = {tuple(_norm(r[k]) for k in names): r for r in rel_a.table.to_pylist()}
    kb = {tuple(_norm(r[k]) for k in names): r for r in rel_b.table.to_pylist()}
    if len(ka) != rel_a.table.num_rows or len(kb) != rel_b.table.num_rows:
        probs.append("a released key twice")
    if plan.public_keys and set(ka) != set(kb):
        probs.append(f"public key sets differ: {set(ka) ^ set(kb)}")
    only = set(ka) ^ set(kb)
    if len(only) > c:
        probs.append(f"{len(only)} released keys differ > {c}")
    if set(kb) - set(ka):
        probs.append(f"keys released only without the target: {set(kb) - set(ka)}")
    sens = {col.name: col.sensitivity for col in cal.columns}
    for o in plan.outputs:
        if not o.source or not o.source.startswith("__a"):
            continue
        agg = plan.aggregate_by_name(o.source)
        if agg.kind not in (ir.COUNT_STAR, ir.COUNT_COL, ir.COUNT_UNITS, ir.COUNT_DISTINCT, ir.SUM):
            continue
        s = sens[source_column(agg, cal.caps)]
        gran = (rel_a.accuracy.get(o.name) or {}).get("granularity", 1.0) or 1.0
        for key in set(ka) & set(kb):
            va, vb = ka[key][o.name], kb[key][o.name]
            if va is None or vb is None:
                if (va is None) != (vb is None):
                    probs.append(f"released {o.name} at {key!r}: {va} vs {vb}")
                continue
            if abs(va - vb) > s + 2 * gran:
                probs.append(f"released {o.name} at {key!r}: |{va} - {vb}| > {s} + rounding {gran}")
    return probs


def _check_quantile(a: dict[str, Any], b: dict[str, Any], cal: Any) -> list[str]:
    probs: list[str] = []
    plan = cal.plan
    keys = [k.name for k in plan.keys]
    r = min(cal.caps.max_rows_per_group, cal.caps.max_rows_per_unit)
    ta, tb = a["capture"].bounded, b["capture"].bounded
    if len(ta) != 1 or len(tb) != 1:
        return [f"{len(ta)}/{len(tb)} bounded fetches"]

    def hist(t: pa.Table) -> dict[tuple[Any, ...], dict[tuple[int, int], int]]:
        out: dict[tuple[Any, ...], dict[tuple[int, int], int]] = {}
        for row in t.to_pylist():
            key = tuple(_norm(row[k]) for k in keys)
            out.setdefault(key, {})[(row["__q"], row["__b"])] = row["__n"]
        return out

    exp_c = min(cal.caps.max_groups_per_unit, cal.caps.max_rows_per_unit)
    if plan.keys:
        n = 1
        for k in plan.keys:
            n *= len(k.domain)
        exp_c = min(exp_c, n)
    else:
        exp_c = 1
    if cal.groups_per_unit < exp_c:
        probs.append(f"quantile groups_per_unit {cal.groups_per_unit} < {exp_c}")
    if abs(cal.eps_run - cal.epsilon / (cal.groups_per_unit * len(plan.aggregates))) > 1e-12 * cal.eps_run:
        probs.append(f"quantile eps_run {cal.eps_run} is not epsilon / (C m)")
    for j, a in enumerate(plan.aggregates):
        # p is taken on the dyadic grid m / 2^20 (dpsql/mechanisms/quantile.py, step 1): the quantile released
        p = round(a.quantile * 2**20) / 2**20 if a.kind == ir.QUANTILE else 1.0
        if cal.sensitivity[j] < r * max(p, 1 - p):
            probs.append(f"quantile sensitivity {cal.sensitivity[j]} < {r} * max(p, 1 - p)")
    ha, hb = hist(ta[0]), hist(tb[0])
    changed = 0
    for key in set(ha) | set(hb):
        xa, xb = ha.get(key, {}), hb.get(key, {})
        for q in range(len(cal.grids)):
            l1 = sum(abs(xa.get((q, i), 0) - xb.get((q, i), 0)) for i in {i for (qq, i) in [*xa, *xb] if qq == q})
            if l1 > r:
                probs.append(f"quantile histogram {key!r}/{q}: L1 change {l1} > {r}")
        changed += xa != xb
    if changed > cal.groups_per_unit:
        probs.append(f"{changed} quantile groups changed > {cal.groups_per_unit}")
    return probs


def _check_dawa(a: dict[str, Any], b: dict[str, Any], cal: Any) -> list[str]:
    ta, tb = a["capture"].bounded, b["capture"].bounded
    if len(ta) != 1 or len(tb) != 1:
        return [f"{len(ta)}/{len(tb)} bounded fetches"]
    bins = [c for c in ta[0].column_names if c.startswith("__b")]

    def hist(t: pa.Table) -> dict[tuple[Any, ...], int]:
        return {tuple(r[c] for c in bins): r["__n"] for r in t.to_pylist()}

    g = cal.groups
    want = min(g.max_groups_per_unit * g.max_rows_per_group, g.max_rows_per_unit) if g is not None else None
    if want is not None and cal.cap < want:
        return [f"DAWA cap {cal.cap} < min(C_u k, L) = {want}"]
    ha, hb = hist(ta[0]), hist(tb[0])
    l1 = sum(abs(ha.get(k, 0) - hb.get(k, 0)) for k in set(ha) | set(hb))
    if l1 > cal.cap:
        return [f"DAWA histogram L1 change {l1} > cap {cal.cap}"]
    return []
