"""Gaussian (delta > 0) and Laplace (delta = 0) mechanisms for scalar aggregates and for
GROUP BY over keys declared public in the catalog.

Privacy claim
-------------
Neighbouring relation: add or remove one privacy unit with all of its rows (user level).
The bounding SQL (``rewrite.bound``) guarantees that one unit touches at most
C = min(C_u, number of public key combinations) groups (C = 1 for a scalar query), and changes
each released column j of a touched group by at most Delta_j (1 for the distinct-unit count,
k for COUNT(*)/COUNT(col)/COUNT(DISTINCT col), k*max|bound| for SUM, k*(hi-lo)/2 for the centred
AVG sum; a VARIANCE/STDDEV is three columns: count k, centred sum k*r, centred sum of squares
k*r^2 with r = (hi-lo)/2, ``dpsql.mechanisms.variance``). Bounds are declared, written as a clamp,
or derived by interval arithmetic (``dpsql.plan.intervals``); the bounded SQL clamps to them.
Every released column is noised on its own scale, proportional to Delta_j: with the m columns
normalised by Delta_j the whole release is a vector whose L2 sensitivity is sqrt(C*m) and
L1 sensitivity is C*m. Hence

* Gaussian: sigma_j = sigma * Delta_j with sigma = gaussian_sigma(eps, delta, sqrt(C*m)), the
  least sigma meeting the exact Gaussian profile (Balle & Wang 2018; docs/mechanisms.md section 1.2). The
  floating-point sampler adds delta_fp = (1 + e^eps) * C * sum_j delta_coord_j
  (``dpsql.noise`` section 3); the charge is (eps, delta + delta_fp), shown as ``fp_delta``.
* Laplace (pure DP): Mironov's snapping mechanism per coordinate (``dpsql.noise`` section 2).
  Each of the <= C*m changed coordinates gets the budget eps_c = eps / (C*m); column j is
  calibrated with lambda_j = Delta_j / (eps_c - 2^-45 (2^(K+1) + 2)), grid Lambda_j = the least
  power of two >= lambda_j and public bound B_j = 2^K Lambda_j (K <= 40; B_j <= 2^62 for counts),
  so the proven loss Delta_j/lambda_j + 2^-45 (B_j/lambda_j + 2) is at most eps_c and the total
  at most eps, which is what is charged. True values beyond +-B_j are clamped (B_j depends only
  on eps and Delta_j). Parameters that cannot be represented are refused before any charge.

Public keys are released in full (zero-count keys included), so the set of released keys
is data independent and no threshold is needed. Released values are rounded to a declared
granularity (integers for counts), which is post-processing.
"""

from __future__ import annotations

import decimal
import itertools
import math
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from dpsql.budget import Budget, share_of
from dpsql.errors import ConfigError, PolicyError
from dpsql.mechanisms.base import MechanismName, Released, Request
from dpsql.mechanisms.common import (
    BoundedAggregates,
    Calibration,
    add_noise,
    charged_delta,
    columns_words,
    finish_release,
    fp_delta_refusal,
    gaussian_fp_charge,
    is_integer_column,
    needed_columns,
)
from dpsql.noise import NoiseSource, snapping_calibration, snapping_epsilon
from dpsql.plan import ir
from dpsql.rewrite.bound import Caps


def domain_size(plan: ir.QueryPlan) -> int:
    n = 1
    for k in plan.keys:
        assert k.domain is not None
        n *= len(k.domain)
    return n


def calibrate(plan: ir.QueryPlan, epsilon: float, delta: float, caps: Caps, noise: str) -> Calibration:
    if math.isinf(caps.rows_per_group_bound):
        if not plan.keys:
            raise PolicyError(
                f"table '{plan.table.name}' has no finite max_rows_per_unit (nor finite max_groups_per_unit and "
                "max_rows_per_group), so one person's effect on an ungrouped aggregate is unbounded",
                hint=f"register('{plan.table.name}', ..., max_rows_per_unit=5)",
            )
        raise PolicyError(
            f"table '{plan.table.name}' has no finite max_rows_per_group, so one person's effect on a count is unbounded",
            hint="register the table with max_rows_per_group=1 (or another finite cap)",
        )
    groups = domain_size(plan) if plan.keys else 1
    if plan.keys and math.isinf(caps.max_groups_per_unit):
        c_eff = float(groups)
    else:
        c_eff = float(min(caps.max_groups_per_unit, groups))
    cols = needed_columns(plan, caps)
    m = len(cols)
    scales: dict[str, float] = {}
    snap: dict[str, tuple[float, float]] = {}
    params: dict[str, Any] = {"groups_per_unit": c_eff, "rows_per_group": caps.max_rows_per_group, "columns": m}
    cost_delta = 0.0
    if noise == "gaussian":
        # imported when used: it loads scipy.special (~0.3 s of CPU), which a pure-ε query never needs
        from dpsql.accounting import gaussian_sigma

        base = gaussian_sigma(epsilon, delta, sensitivity=math.sqrt(c_eff * m))
        for c in cols:
            scales[c.name] = base * c.sensitivity
        params["sigma"] = base
        params["l2_sensitivity"] = math.sqrt(c_eff * m)
        fp = gaussian_fp_charge(plan, cols, scales, epsilon=epsilon, groups_per_unit=c_eff)
        if fp > delta:
            raise fp_delta_refusal(fp, epsilon=epsilon, delta=delta, laplace=True)
        params["fp_delta"] = fp
        cost_delta = charged_delta(delta, fp)
    else:
        eps_c = share_of(epsilon, c_eff * m)
        proven = 0.0
        words = columns_words(plan, [c.name for c in cols])
        for c in cols:
            lam, grid, bound = snapping_calibration(
                c.sensitivity, eps_c, integer=is_integer_column(c), what=words[c.name]
            )
            scales[c.name] = lam
            snap[c.name] = (grid, bound)
            proven += snapping_epsilon(c.sensitivity, lam, bound)
        params["l1_sensitivity"] = c_eff * m
        params["snapping"] = {k: {"lambda": scales[k], "grid": g, "bound": b} for k, (g, b) in snap.items()}
        params["epsilon_proven"] = c_eff * proven
    params["scales"] = dict(scales)
    notes: list[str] = []
    if noise == "laplace":
        notes.append(
            "Laplace noise is snapped (floating-point safe): each released value lies on a power-of-two grid "
            "at least its noise scale and true values beyond a public bound are clamped (parameters: snapping)"
        )
    else:
        notes.append(f"the charge includes the sampler's floating-point delta {cost_delta - delta:.3g} (fp_delta)")
    return Calibration(
        mechanism=MechanismName(noise),
        notes=notes,
        cost=Budget(epsilon, cost_delta),
        noise=noise,
        caps=caps,
        columns=cols,
        scales=scales,
        params=params,
        snap=snap,
    )


_ARROW_TYPES = {"TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INTEGER": pa.int32(), "BIGINT": pa.int64(),
                "UTINYINT": pa.uint8(), "USMALLINT": pa.uint16(), "UINTEGER": pa.uint32(), "UBIGINT": pa.uint64(),
                "HUGEINT": pa.decimal128(38, 0),
                "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "DATE": pa.date32(), "BOOLEAN": pa.bool_()}
_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


def _column_arrow_type(plan: ir.QueryPlan, key: ir.GroupKey) -> pa.DataType | None:
    """The Arrow type DuckDB gives the key column (a plain column's declared type), if simple."""
    if not isinstance(key.expr, exp.Column):
        return None
    return sql_arrow_type(plan.table.schema.get(key.expr.name.lower()) or "")


def sql_arrow_type(sql_type: str) -> pa.DataType | None:
    """The Arrow type DuckDB gives a column of ``sql_type``, if simple (else None)."""
    t = sql_type.upper()
    m = _DECIMAL.fullmatch(t)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    return _ARROW_TYPES.get(t)


def _domain_table(plan: ir.QueryPlan, like: pa.Table) -> pa.Table:
    combos = list(itertools.product(*[k.domain or () for k in plan.keys]))
    cols = {}
    for i, k in enumerate(plan.keys):
        vals = [c[i] for c in combos]
        # typed as the key column (a DECIMAL(12,1) key's 0.1 is DECIMAL(12,1), spelled '0.1' as its released values
        # are, not DECIMAL(1,1) '.1', which post-processing comparing the spellings found in no listed key)
        typ = like.schema.field(k.name).type if k.name in like.column_names else _column_arrow_type(plan, k)
        if typ is not None and pa.types.is_decimal(typ):  # HUGEINT / DECIMAL keys: exact, whatever their size
            vals = _exact_integers(vals)
        try:
            cols[k.name] = pa.array(vals, type=typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            try:
                cols[k.name] = pa.array(vals)
            except OverflowError:  # integers beyond int64 (a HUGEINT domain): exact decimals
                cols[k.name] = pa.array(_exact_integers(vals))
    return pa.table(cols)


def typed_array(vals: list[Any], typ: pa.DataType | None) -> pa.Array:
    """``vals`` as an Arrow array of ``typ`` where they convert to it, else of the type Arrow infers."""
    if typ is not None:
        try:
            return pa.array(_exact_integers(vals) if pa.types.is_decimal(typ) else vals, type=typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            pass
    try:
        return pa.array(vals)
    except OverflowError:  # integers beyond int64 (a HUGEINT domain): exact decimals
        return pa.array(_exact_integers(vals))


def _exact_integers(vals: list[Any]) -> list[Any]:
    """Integer domain values as exact decimals (Arrow converts Python ints only up to 64 bits)."""
    return [decimal.Decimal(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in vals]


def _join_keys(dom: pa.Table, bounded: pa.Table, keys: list[str]) -> pa.Table:
    """``dom`` LEFT OUTER JOIN ``bounded`` on ``keys``, a NULL key matching a NULL key: a domain holds None for the
    NULL group of a lookup column under a LEFT JOIN (``dpsql.mechanisms.lookup``), which Arrow's join never matches.
    Such a key is joined as (is NULL, value with NULL replaced by one of the domain's values)."""
    nullable = [k for k in keys if dom.column(k).null_count and dom.column(k).null_count < dom.num_rows]
    if not nullable:
        return dom.join(bounded, keys=keys, join_type="left outer")

    def marked(t: pa.Table) -> pa.Table:
        for k in nullable:
            col = t.column(k)
            fill = dom.column(k).drop_null()[0].cast(col.type)
            t = t.set_column(t.column_names.index(k), k, pc.fill_null(col, fill)).append_column(f"__null{k}", pc.is_null(col))
        return t

    joined = marked(dom).join(marked(bounded), keys=keys + [f"__null{k}" for k in nullable], join_type="left outer")
    for k in nullable:
        col = joined.column(k)
        joined = joined.set_column(joined.column_names.index(k), k,
                                   pc.if_else(joined.column(f"__null{k}"), pa.scalar(None, col.type), col))
    return joined.drop_columns([f"__null{k}" for k in nullable])


def release(plan: ir.QueryPlan, bounded: pa.Table, cal: Calibration, rng: NoiseSource) -> Released:
    """Noise every needed column of the bounded aggregates; fill zero rows for public keys."""
    if plan.keys:
        dom = _domain_table(plan, bounded)
        dom = dom.append_column("__pos", pa.array(np.arange(dom.num_rows, dtype=np.int64)))
        keys = [k.name for k in plan.keys]
        # right side: bounded rows (only keys inside the domain survive the SQL filter); rows
        # come back in the order of the domain product, a data-independent order
        joined = _join_keys(dom, bounded, keys)
        table = joined.sort_by("__pos").drop_columns(["__pos"])
    else:
        table = bounded
    noisy: dict[str, np.ndarray] = {}
    for c in cal.columns:
        noisy[c.name] = add_noise(table.column(c.name), c, cal, rng)
    keys_out = {k.name: table.column(k.name) for k in plan.keys}
    return finish_release(plan, cal, keys_out, noisy)


#: public key domains up to this many combinations are checked in full before the charge
KEY_DOMAIN_CHECK_LIMIT = 100_000


class BasicMechanism(BoundedAggregates):
    """Gaussian or Laplace noise on scalar aggregates and on GROUP BY over public keys."""

    name: MechanismName
    options = frozenset({"max_groups_per_unit", "max_rows_per_group", "max_rows_per_unit"})

    def __init__(self, name: MechanismName) -> None:
        assert name in (MechanismName.GAUSSIAN, MechanismName.LAPLACE)
        self.name = name

    def calibrate(self, request: Request, contribution: Caps) -> Calibration:
        assert request.plan is not None
        if self.name == MechanismName.GAUSSIAN and request.delta == 0:
            raise ConfigError("the Gaussian mechanism needs delta > 0", hint="pass delta=1e-6 or use mechanism='laplace'")
        cal = calibrate(request.plan, request.epsilon, request.delta, contribution, self.name.value)
        cal.plan, cal.unit = request.plan, request.unit
        return cal

    def key_domain(self, cal: Calibration) -> pa.Table | None:
        assert cal.plan is not None
        if not cal.plan.public_keys or domain_size(cal.plan) > KEY_DOMAIN_CHECK_LIMIT:
            return None
        return _domain_table(cal.plan, pa.table({}))

    def release(self, cal: Calibration, bounded: pa.Table | None, rng: NoiseSource) -> Released:
        assert cal.plan is not None and bounded is not None
        return release(cal.plan, bounded, cal, rng)
