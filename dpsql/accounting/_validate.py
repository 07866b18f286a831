"""Input validation shared by the accounting modules.

Every public accounting function validates its arguments with these helpers, so that a bad
value (NaN, an infinity where none is meaningful, a negative scale, a delta outside (0, 1),
a non-integer count ...) raises :class:`dpsql.errors.ConfigError` with a message that names
the parameter and a hint, instead of propagating a NaN or a silent wrong answer.
"""

from __future__ import annotations

import decimal
import math
import numbers
from typing import Any

import numpy as np

from dpsql.errors import ConfigError


def _as_float(value: object, name: str, hint: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real | np.floating | np.integer):
        raise ConfigError(f"{name} must be a real number, got {value!r}", hint=hint)
    return float(value)  # type: ignore[arg-type]


def real(value: object, name: str, *, hint: str | None = None) -> float:
    """Any finite real number."""
    h = hint or f"pass a finite number for {name}"
    x = _as_float(value, name, h)
    if not math.isfinite(x):
        raise ConfigError(f"{name} must be a finite number, got {value!r}", hint=h)
    return x


def nonneg(value: object, name: str, *, hint: str | None = None) -> float:
    """A finite real number >= 0."""
    h = hint or f"pass a finite {name} >= 0"
    x = real(value, name, hint=h)
    if x < 0:
        raise ConfigError(f"{name} must be >= 0, got {value!r}", hint=h)
    return x


def positive(value: object, name: str, *, hint: str | None = None) -> float:
    """A finite real number > 0."""
    h = hint or f"pass a finite {name} > 0"
    x = real(value, name, hint=h)
    if not x > 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}", hint=h)
    return x


def epsilon_target(value: object, name: str = "epsilon") -> float:
    """A target privacy budget epsilon: finite and >= 0."""
    return nonneg(value, name, hint=f"{name} is a privacy budget: use a finite value >= 0, e.g. {name}=1.0")


def delta_target(value: object, name: str = "delta") -> float:
    """A target delta: strictly inside (0, 1)."""
    h = f"{name} must lie strictly between 0 and 1; use a small value such as {name}=1e-6"
    x = _as_float(value, name, h)
    if math.isnan(x) or not 0.0 < x < 1.0:
        raise ConfigError(f"{name} must be in the open interval (0, 1), got {value!r}", hint=h)
    return x


def probability(value: object, name: str, *, open_low: bool = True, closed_high: bool = True) -> float:
    """A probability in (0, 1] (default) -- e.g. a sampling rate q."""
    lo = "(" if open_low else "["
    hi = "]" if closed_high else ")"
    h = f"{name} must lie in {lo}0, 1{hi}, e.g. {name}=0.1"
    x = _as_float(value, name, h)
    ok = (x > 0 if open_low else x >= 0) and (x <= 1 if closed_high else x < 1)
    if math.isnan(x) or not ok:
        raise ConfigError(f"{name} must be in {lo}0, 1{hi}, got {value!r}", hint=h)
    return x


def count(value: object, name: str, *, minimum: int = 1, hint: str | None = None) -> int:
    """An integer >= minimum. Integral floats (e.g. 5.0) are accepted; 5.5, NaN, inf, bool are not."""
    h = hint or f"{name} must be a whole number >= {minimum}"
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}", hint=h)
    if isinstance(value, numbers.Integral | np.integer):
        n = int(value)  # type: ignore[arg-type]
    else:
        x = _as_float(value, name, h)
        if not math.isfinite(x) or x != math.floor(x):
            raise ConfigError(f"{name} must be an integer, got {value!r}", hint=h)
        n = int(x)
    if n < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value!r}", hint=h)
    return n


def alpha_order(value: object, name: str = "alpha") -> float:
    """A Renyi order alpha > 1 (finite)."""
    h = f"{name} is a Renyi order: use a finite value > 1, e.g. {name}=8"
    x = real(value, name, hint=h)
    if not x > 1:
        raise ConfigError(f"{name} must be > 1, got {value!r}", hint=h)
    return x


def choice(value: Any, name: str, options: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ConfigError(
            f"{name} must be one of {', '.join(repr(o) for o in options)}, got {value!r}",
            hint=f"pass {name}={options[0]!r}",
        )
    return value


def real_array(
    value: object, name: str, *, minimum: float | None = None, hint: str | None = None
) -> np.ndarray:
    """A float array (or scalar) of finite values, optionally all >= minimum."""
    h = hint or f"pass finite numbers for {name}"
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be numeric, got {value!r}", hint=h)
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be numeric, got {value!r}", hint=h) from None
    if arr.dtype == object or not np.all(np.isfinite(arr)):
        raise ConfigError(f"{name} must be finite (no NaN or infinity), got {value!r}", hint=h)
    if minimum is not None and np.any(arr < minimum):
        raise ConfigError(f"{name} must be >= {minimum:g}, got {value!r}", hint=h)
    return arr


def shown(x: float, digits: int, *, up: bool) -> str:
    """``x`` to ``digits`` significant digits rounded up (a least value named in a hint) or down (a largest one), so
    that the value a refusal's hint names passes as written."""
    ctx = decimal.Context(prec=digits, rounding=decimal.ROUND_CEILING if up else decimal.ROUND_FLOOR)
    return format(ctx.plus(decimal.Decimal(x)), "g")
