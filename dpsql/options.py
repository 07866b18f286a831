"""The per-query options an analyst may pass (``Session.query(..., options={...})``), validated.

Which mechanism reads which option is stated by each mechanism (``Mechanism.options``); an
option that does not apply to the routed mechanism is refused by ``dpsql.mechanisms.registry``.
Options can only make a query more conservative where policy is concerned: caps may be lowered,
never raised above the data owner's; tau may be raised, never lowered.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Iterator
from typing import Any

from dpsql.errors import ConfigError
from dpsql.mechanisms.base import MechanismName

#: the values the option ``mechanism`` takes besides 'auto': every mechanism but the two only the router chooses, then
#: those plugged in (``dpsql.mechanisms.registry.plug_in`` adds and removes them)
FORCEABLE_NAMES = [m.value for m in MechanismName
                   if m not in (MechanismName.CONTRIBUTION_PROFILE, MechanismName.PUBLIC_DOMAIN)]


def mechanism_doc() -> str:
    """The documentation of the option ``mechanism``: every name it accepts."""
    return ("force a mechanism: " + ", ".join(repr(n) for n in FORCEABLE_NAMES) + " (each for the queries it "
            "answers, e.g. 'clipped_gaussian' for GROUP BY over joins, 'exponential' for quantiles; default: chosen "
            "automatically)")


#: documented per-query options (``Session.query(..., options={...})``)
OPTIONS: dict[str, str] = {
    "mechanism": mechanism_doc(),
    "tau": "sparse histogram: suppress groups with fewer than tau distinct units (default and floor: the table's registered tau)",
    "tau_star": "sparse histogram: fix the noisy release threshold (accepted only if the exact delta fits)",
    "sigma": "sparse histogram: fix the count noise std (accepted only if the exact delta fits)",
    "epsilon_split": "DAWA: share of epsilon for the private partition (default 0.25)",
    "max_groups_per_unit": "lower the table's cap on groups per privacy unit for this query (never above the registered cap)",
    "max_rows_per_group": "lower the table's cap on rows per unit and group for this query (never above the registered cap)",
    "reuse": "'synopsis': answer a range count from a stored DAWA synopsis for free (it kept at most max_rows_per_unit "
    "rows per person before the range predicate, so it estimates a slightly different quantity than the query itself), "
    "or a quantile (MEDIAN, PERCENTILE_CONT, QUANTILE) of an ordered column from its stored histogram; 'never': run "
    "DAWA afresh (charged) even where a stored synopsis would answer a workload or histogram for free",
    "clip_negative": "post-processing, any mechanism: release max(0, value) for counts and for sums and averages whose "
    "declared lower bound is >= 0 (default false: the unbiased noisy value, which can be negative)",
    "q": "DP-S4S (joins): the Poisson sampling rate of join tuples, in [2^-30, 1] (default 1/16, data independent; 1 = no sampling)",
    "degree_caps": "joins with an enforced Delta: lower the owner's degree bounds for this query, e.g. {'orders.o_custkey': 16} (never above the declared bound; refused where the lowered bounds leave Delta no longer enforced)",
    "max_tuples_per_user": "joins with an attested Delta: raise Delta above what the owner's declarations give (never lower)",
    "tau_base": "joins (DP-S4S, R2T): the base b of the truncation thresholds tau = b^i (default 5.5, the authors' code, "
    "with the ln(L/beta) bias; DP-S4S adds Delta on top: b^i < Delta, then Delta; 2 = the paper's Algorithm 2, "
    "2^i <= Delta with ln(3L/beta)); any b in (1, 1024], privacy unchanged",
    "clip_norm": "GROUP BY over joins with one person per tuple: the L2 bound C on each person's vector of per-group "
    "totals, in the aggregate's units (default Delta x max|value|: nothing clipped)",
    "max_rows_per_unit": "DAWA: lower the table's cap on rows per unit for this query (never above the registered cap)",
    "grouping_weights": "GROUP BY ROLLUP / CUBE / GROUPING SETS, UNION ALL: one positive number per query, in the order "
    "explain lists them; each query gets its weight's share of epsilon and delta (default: equal shares)",
}

_CAP_OPTIONS = ("max_groups_per_unit", "max_rows_per_group", "max_rows_per_unit")

LARGE_EPSILON = 10.0
#: a query's delta above this is unusually large: a release may reveal one person outright with probability delta, so
#: delta should be far below 1 / the number of people (1e-6 to 1e-9 is usual)
LARGE_DELTA = 1e-3


#: set while a request of several queries (ROLLUP, UNION ALL) routes each query at its share: the request's own
#: (epsilon, delta) were weighed already, and a share below the thresholds says nothing of what was asked
_SHARES: contextvars.ContextVar[bool] = contextvars.ContextVar("dpsql_routing_shares", default=False)


@contextlib.contextmanager
def routing_shares() -> Iterator[None]:
    """Route the queries of one request at their shares: :func:`warn_if_large` weighs the request's total instead."""
    token = _SHARES.set(True)
    try:
        yield
    finally:
        _SHARES.reset(token)


def warn_if_large(eps: float, d: float) -> None:
    """A UserWarning for an unusually large epsilon or delta (public parameters only; the query still runs), shown at
    the line that called dpsql (``Session.query`` / ``explain``, through however many of dpsql's own frames). A
    request of several queries is weighed at its total, not at each query's share (``groupings``: a ROLLUP at
    delta=2e-3 charges 2e-3, though each of its two queries has 1e-3)."""
    import warnings

    if _SHARES.get():
        return
    if eps > LARGE_EPSILON:
        warnings.warn(f"epsilon={eps:g} is unusually large: the release gives little privacy", stacklevel=_caller())
    if d > LARGE_DELTA:
        warnings.warn(f"delta={d:g} is unusually large: a release may reveal a person outright with probability delta "
                      "(usual: well below 1 / the number of people, e.g. 1e-6)", stacklevel=_caller())


def _caller() -> int:
    """The ``stacklevel`` of the first frame outside the dpsql package above :func:`warn_if_large`'s caller (a fixed
    level named a decorator's frame, ``dpsql/charge.py``, for ``Session.query``)."""
    import sys
    import types

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame: types.FrameType | None = sys._getframe(2)  # (level 1 is warn_if_large's own line)
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


#: the least sampling rate q accepted (see the check of option q)
MIN_Q = 2.0 ** -30


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond the float range
        return False


def check_options(options: dict[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ConfigError("options must be a dict", hint="e.g. options={'tau': 10}")
    unknown = sorted(set(options) - set(OPTIONS), key=str)
    if unknown:
        import difflib

        near = {u: difflib.get_close_matches(str(u).lower(), list(OPTIONS), n=1, cutoff=0.6) for u in unknown}
        guesses = [f"'{m[0]}' for '{u}'" for u, m in near.items() if m]
        raise ConfigError(
            f"unknown option(s) {unknown}" + (f"; did you mean {', '.join(guesses)}?" if guesses else ""),
            # the names, and the description of each option guessed (all of them run to some 3 000 characters)
            hint="".join(f"{m[0]}: {OPTIONS[m[0]]}; " for m in near.values() if m)
            + "the options are " + ", ".join(OPTIONS) + " (README's Python API section and dpsql.options.OPTIONS describe each)",
        )
    out = dict(options)
    if "mechanism" in out:
        if out["mechanism"] != "auto" and out["mechanism"] not in FORCEABLE_NAMES:
            raise ConfigError(f"unknown mechanism {out['mechanism']!r}",
                              hint="use one of " + ", ".join(repr(n) for n in FORCEABLE_NAMES))
        out["mechanism"] = str(out["mechanism"])
    if "tau" in out:
        t = out["tau"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not _finite(t) or t < 1 or int(t) != t:
            raise ConfigError(f"tau must be a whole number >= 1, got {t!r}", hint="e.g. options={'tau': 10}")
        out["tau"] = int(t)
    for key in ("tau_star", "sigma"):
        if key in out and out[key] is not None:
            v = out[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or (key == "sigma" and v <= 0):
                raise ConfigError(f"{key} must be a finite number{' > 0' if key == 'sigma' else ''}, got {v!r}",
                                  hint=f"e.g. options={{'{key}': {2.0 if key == 'sigma' else 10.0}}}")
            out[key] = float(v)
    for key in _CAP_OPTIONS:
        if key in out:
            v = out[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or v < 1 or int(v) != v:
                raise ConfigError(f"{key} must be a whole number >= 1, got {v!r}", hint=f"e.g. options={{'{key}': 1}}")
            out[key] = int(v)
    if "q" in out:
        v = out["q"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 1):
            raise ConfigError(f"q must be a number in (0, 1], got {v!r}", hint="e.g. options={'q': 0.0625}")
        if v < MIN_Q:
            # the estimate is scaled by 1/q and its noise with it: below 2^-30 a release overflows
            # the integers a count is returned in, and the sample (drawn on a 2^-52 grid) holds nothing
            raise ConfigError(f"q={v!r} is too small: the sampling rate must be at least 2^-30 (about 9.3e-10)",
                              hint="e.g. options={'q': 0.0625}; a smaller q only adds noise")
        out["q"] = float(v)
    if "clip_norm" in out:
        v = out["clip_norm"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or v <= 0:
            raise ConfigError(f"clip_norm must be a positive number, got {v!r}", hint="e.g. options={'clip_norm': 64}")
        out["clip_norm"] = float(v)
    if "max_tuples_per_user" in out:
        v = out["max_tuples_per_user"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"max_tuples_per_user must be a whole number >= 1, got {v!r}",
                              hint="e.g. options={'max_tuples_per_user': 4}")
    if "tau_base" in out:
        v = out["tau_base"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or not (1 < v <= 1024):
            raise ConfigError(f"tau_base must be a number in (1, 1024], got {v!r}",
                              hint="e.g. options={'tau_base': 2} for the paper's grid (default 5.5)")
        out["tau_base"] = float(v)
    if "degree_caps" in out and not isinstance(out["degree_caps"], dict):
        raise ConfigError("degree_caps must be a dict such as {'orders.o_custkey': 16}",
                          hint="e.g. options={'degree_caps': {'orders.o_custkey': 16}}")
    if "epsilon_split" in out:
        v = out["epsilon_split"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < 1):
            raise ConfigError(f"epsilon_split must be in (0, 1), got {v!r}", hint="e.g. options={'epsilon_split': 0.5}")
    if "reuse" in out and out["reuse"] not in ("synopsis", "never"):
        raise ConfigError(f"reuse must be 'synopsis' or 'never', got {out['reuse']!r}", hint="e.g. options={'reuse': 'synopsis'}")
    if "clip_negative" in out and not isinstance(out["clip_negative"], bool):
        raise ConfigError(f"clip_negative must be true or false, got {out['clip_negative']!r}",
                          hint="e.g. options={'clip_negative': True}")
    return out


#: options every mechanism accepts (routing and post-processing, not calibration)
UNIVERSAL = frozenset({"mechanism", "clip_negative", "reuse"})
