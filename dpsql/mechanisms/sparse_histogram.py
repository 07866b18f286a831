"""Gaussian sparse histogram mechanism: GROUP BY over keys nobody can list in advance.

Source: Wilkins, Kifer, Zhang, Karrer, "Exact Privacy Analysis of the Gaussian Sparse
Histogram Mechanism" (JPC 2024), Algorithm 1 and Theorem 5.4; ``docs/mechanisms.md`` section 1.

Privacy claim
-------------
Neighbouring relation: add or remove one privacy unit with all of its rows (user level).
Bounding (``rewrite.bound``, inside DuckDB): each unit keeps at most C_u groups (random,
by a salted hash of (unit, group)) and at most k rows per group, values clamped to their
declared bounds. So one unit appears in at most C_u groups, where it changes the distinct-unit
count by exactly 1 and every other released column j by at most Delta_j.

Mechanism, per group G with distinct-unit count c(G) (groups with no rows never exist):
    if c(G) >= tau (true count, in SQL) and c(G) + N(0, sigma^2) >= tau* (noisy, here):
        release the noisy count and every other column j plus N(0, (sigma * Delta_j * w)^2)
The extra columns enter the exact accounting through mu_other (``dpsql.accounting``); the
threshold decision is taken on the unrounded noisy count, then released values are rounded
(post-processing). sigma and tau* come from ``calibrate_sparse_histogram`` (exact Theorem 5.4
accounting, never add-the-deltas); a user may fix sigma and/or tau*, and the query is then
accepted only if the exact delta at the requested epsilon is within the requested delta.
tau* is rounded *up* to an integer (any larger tau* is still private: delta is non-increasing
in tau*), and the accounting is re-evaluated at the rounded value.

Floating point (``dpsql.noise`` section 3): the threshold test is X >= tau* - c, decided
exactly (integer tau* -- a given tau_star is rounded up -- and integer c <= 2^52), released
counts are c + rint(X) (exact).
The sampler's floating-point delta over the C_u groups one unit touches,
(1 + e^eps) * C_u * (delta_users + delta_thr + sum_j delta_j), is added to the charged delta
(``fp_delta`` in explain and the ledger).

Counts: with k = 1 the released COUNT(*) is the noisy distinct-unit count itself. With k > 1
the threshold still uses the distinct-unit count (sensitivity 1 per group), and COUNT(*) is
released as a per-unit clipped sum (sensitivity k), an extra column: far less biased than
one row per unit, at the price of one more noisy column.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql import accounting
from dpsql.budget import Budget
from dpsql.errors import ConfigError, PolicyError
from dpsql.mechanisms.base import MechanismName, Released, Request
from dpsql.mechanisms.common import (
    BoundedAggregates,
    Calibration,
    add_noise,
    charged_delta,
    finish_release,
    fp_delta_refusal,
    gaussian_fp_charge,
    needed_columns,
)
from dpsql.noise import INT_VALUE_BOUND, NoiseSource, gaussian_release
from dpsql.plan import ir
from dpsql.rewrite.bound import Caps, ReleasedColumn, source_column

#: the largest per-person group cap the exact accounting is run for (0.2 s at 1e9; memory grows past it)
MAX_GROUPS_PER_UNIT = 10**9


def calibrate(plan: ir.QueryPlan, epsilon: float, delta: float, caps: Caps, opts: dict[str, Any]) -> Calibration:
    table = plan.table
    if math.isinf(caps.max_groups_per_unit) or math.isinf(caps.max_rows_per_group):
        raise PolicyError(
            f"table '{table.name}' needs finite contribution caps for a GROUP BY over undeclared keys",
            hint=f"register('{table.name}', ..., max_groups_per_unit=5, max_rows_per_group=1)",
        )
    tau = int(opts.get("tau", table.tau))
    c_u = int(caps.max_groups_per_unit)
    if c_u > MAX_GROUPS_PER_UNIT:  # the exact accounting's work grows with C_u (a 16 GiB array at 2^62)
        raise PolicyError(
            f"table '{table.name}': max_groups_per_unit={c_u} is above the {MAX_GROUPS_PER_UNIT:.0e} groups per person "
            "that the sparse histogram's exact accounting supports (its noise would swamp every count long before)",
            hint=f"register('{table.name}', ..., max_groups_per_unit=5) or another realistic cap",
        )
    cols = needed_columns(plan, caps)
    users = ReleasedColumn("__users", 1.0, "users")
    extra = [c for c in cols if c.name != "__users"]
    extra_sens = tuple(c.sensitivity for c in extra)
    sigma_opt = opts.get("sigma")
    tau_star_opt = opts.get("tau_star")
    if sigma_opt is None and tau_star_opt is None:
        cal = accounting.calibrate_sparse_histogram(
            epsilon, delta, tau=tau, max_groups=c_u, extra_sensitivities=extra_sens, method="exact"
        )
    else:
        cal = accounting.calibrate_sparse_histogram_fixed(
            epsilon,
            delta,
            tau=tau,
            max_groups=c_u,
            extra_sensitivities=extra_sens,
            sigma=sigma_opt,
            tau_star=tau_star_opt,
        )
    sigma = float(cal.sigma)
    # a given tau* is rounded up to an integer too (any larger tau* is still private), so the
    # threshold test is exact in floating point
    tau_star = float(accounting.round_tau_star_up(cal.tau_star)) if tau_star_opt is None else float(math.ceil(tau_star_opt))
    exact_delta = accounting.sparse_histogram_delta(
        epsilon, sigma=sigma, tau=tau, tau_star=tau_star, max_groups=c_u, mu_other=cal.mu_other
    )
    if exact_delta > delta * (1.0 - accounting.DELTA_EVAL_MARGIN):  # evaluation error: docs/mechanisms.md §1.2
        raise ConfigError(
            f"sigma={sigma:g}, tau*={tau_star:g} imply delta={exact_delta:.3g} at epsilon={epsilon:g}, more than the requested delta={delta:g}",
            hint="raise tau_star or sigma, or omit them and let dpsql calibrate",
        )
    add_ts = accounting.sparse_histogram_min_tau_star(
        epsilon, delta, sigma=sigma, tau=tau, max_groups=c_u, mu_other=cal.mu_other, method="add_the_deltas"
    )
    scales = {"__users": sigma}
    for c, s in zip(extra, cal.extra_sigmas):
        scales[c.name] = float(s)
    columns = [users] + extra
    fp = gaussian_fp_charge(plan, columns, scales, epsilon=epsilon, groups_per_unit=c_u, threshold_column="__users")
    if fp > delta:
        raise fp_delta_refusal(fp, epsilon=epsilon, delta=delta, laplace=False)
    params: dict[str, Any] = {
        "sigma": sigma,
        "tau": tau,
        "tau_star": tau_star,
        "max_groups_per_unit": c_u,
        "rows_per_group": caps.max_rows_per_group,
        "mu_other": cal.mu_other,
        "exact_delta": exact_delta,
        "add_the_deltas_tau_star": add_ts if math.isfinite(add_ts) else None,
        "add_the_deltas_delta_at_tau_star": accounting.add_the_deltas_delta(
            epsilon, sigma=sigma, tau=tau, tau_star=tau_star, max_groups=c_u, mu_other=cal.mu_other
        ),
        "extra_columns": {c.name: {"sensitivity": c.sensitivity, "sigma": scales[c.name]} for c in extra},
        "release_probability": release_probabilities(sigma, tau, tau_star),
        "scales": dict(scales),
        "fp_delta": fp,
    }
    notes = [
        f"groups with fewer than tau={tau} distinct units are suppressed; a group is released only if its noisy "
        f"distinct-unit count is >= tau*={tau_star:g} (release probability 50% at a true count of tau*)",
        f"exact delta at epsilon={epsilon:g}: {exact_delta:.4g}; add-the-deltas accounting would need tau*="
        + (f"{math.ceil(add_ts):g}" if math.isfinite(add_ts) else "infinity (infeasible)")
        + " at the same sigma",
        f"the charge includes the sampler's floating-point delta {fp:.3g} (fp_delta)",
    ]
    return Calibration(
        mechanism=MechanismName.SPARSE_HISTOGRAM,
        cost=Budget(epsilon, charged_delta(delta, fp)),
        noise="gaussian",
        caps=caps,
        columns=columns,
        scales=scales,
        tau=tau,
        tau_star=tau_star,
        params=params,
        notes=notes,
    )


def release(plan: ir.QueryPlan, bounded: pa.Table, cal: Calibration, rng: NoiseSource) -> Released:
    """Noise the distinct-unit counts, keep groups at or above tau*, noise their other columns."""
    assert cal.tau is not None and cal.tau_star is not None
    users = np.asarray(bounded.column("__users").to_numpy(zero_copy_only=False), dtype=np.float64)
    users = np.clip(np.rint(users), 0.0, INT_VALUE_BOUND)
    # defence in depth: the SQL already suppressed groups below tau
    true_ok = users >= cal.tau
    sigma = cal.scales["__users"]
    x = rng.gaussian_noise(sigma, users.size) if users.size else np.zeros(0)
    # exact threshold test: tau* and the counts are integers below 2^53, so tau* - c is exact
    keep = true_ok & (x >= cal.tau_star - users)
    kept = bounded.filter(pa.array(keep))
    noisy: dict[str, np.ndarray] = {"__users": gaussian_release(users[keep], x[keep], integer=True)}
    for c in cal.columns:
        if c.name == "__users":
            continue
        noisy[c.name] = add_noise(kept.column(c.name), c, cal, rng)
    keys = {k.name: kept.column(k.name) for k in plan.keys}
    # the ledger records how many groups crossed the noisy threshold (before the query's own HAVING
    # or LIMIT): a function of released values only
    out = finish_release(plan, cal, keys, noisy, commit={"params_update": {"released_rows": int(keep.sum())}})
    for a in plan.aggregates:
        if source_column(a, cal.caps) == "__users" and a.name in out.accuracy:
            # the threshold reads this column's own noise: a group is kept when it came out high
            out.accuracy[a.name]["note"] = (
                f"the interval holds before the threshold; a released group passed it (noisy value >= tau*={cal.tau_star:g}), "
                f"so values within a few noise_std of tau* are biased high and can exceed their truth by more than "
                "ci95_half_width (well above tau* the interval holds)")
    return out


def release_probabilities(sigma: float, tau: int, tau_star: float) -> dict[str, float]:
    """P(a group of n people is released) = P(n + N(0, sigma^2) >= tau*) for a few n (public:
    from sigma, tau and tau* only); groups below tau are never released."""
    out: dict[str, float] = {}
    for z in (-2.0, -1.0, 0.0, 1.0, 2.0, 3.0):
        n = max(int(tau), int(math.ceil(tau_star + z * sigma)))
        out[str(n)] = 0.5 * math.erfc(-(n - tau_star) / (sigma * math.sqrt(2.0)))
    return out


class SparseHistogram(BoundedAggregates):
    """GROUP BY over keys not declared public: groups released only above a noisy threshold."""

    name = MechanismName.SPARSE_HISTOGRAM
    options = frozenset({"tau", "tau_star", "sigma", "max_groups_per_unit", "max_rows_per_group", "max_rows_per_unit"})

    def calibrate(self, request: Request, contribution: Caps) -> Calibration:
        plan, table, opts = request.plan, request.table, request.options
        assert plan is not None
        if not plan.is_grouped:
            raise PolicyError("the sparse histogram mechanism needs a GROUP BY",
                              hint="omit the mechanism option (dpsql then chooses one), or add a GROUP BY")
        if request.delta == 0:
            undeclared = [k.sql for k in plan.keys if k.domain is None]
            # a key computed by an expression has no domain, whatever its column declares (only a plain column's is read)
            computed = [k.sql for k in plan.keys if k.domain is None and not isinstance(k.expr, exp.Column)]
            if not undeclared:
                raise PolicyError("the sparse histogram mechanism needs delta > 0",
                                  hint="pass delta (e.g. delta=1e-6), or omit the mechanism option")
            raise PolicyError(
                "GROUP BY over keys that are not declared public ("
                + ", ".join(undeclared)
                + ") needs delta > 0: the keys themselves are released only above a noisy threshold",
                hint="pass delta (e.g. delta=1e-6), or declare the key column's public domain with columns={'col': {'domain': [...]}}"
                + (f"; a key computed by an expression ({', '.join(computed)}) has no public domain, even over a column that "
                   "declares one: group by the column itself" if computed else ""),
            )
        if "tau" in opts and opts["tau"] < table.tau:
            # owner policy wins: the registered tau is a floor the analyst may raise, never lower
            raise PolicyError(
                f"option tau={opts['tau']} is below the threshold tau={table.tau} that the data owner registered for table '{table.name}'",
                hint=f"omit tau, or pass tau >= {table.tau}",
            )
        cal = calibrate(plan, request.epsilon, request.delta, contribution, dict(opts))
        cal.plan, cal.unit = plan, request.unit
        return cal

    def key_domain(self, cal: Calibration) -> pa.Table | None:
        return None  # the released keys are data dependent (above the noisy threshold)

    def release(self, cal: Calibration, bounded: pa.Table | None, rng: NoiseSource) -> Released:
        assert cal.plan is not None and bounded is not None
        return release(cal.plan, bounded, cal, rng)
